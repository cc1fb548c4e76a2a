//! The PostgreSQL wire protocol front end (pgwire): startup and SCRAM-SHA-256 authentication of
//! analysts, the simple and extended query protocols, Describe, and encoding of results, notices
//! and errors.
//!
//! Invariants:
//! - Nothing here decides what is allowed: every statement goes through [`crate::session::classify`] and
//!   [`crate::session::Session::run`]; this module only translates between messages and
//!   plain data.
//! - Errors reach the client as `ErrorResponse` with the SQLSTATE of [`Error::sqlstate`], our
//!   message and hint; a refused statement never ends the connection.
//! - pgwire decodes only messages that passed [`Framing`]'s checks of size and layout; a message
//!   that fails them ends its connection with FATAL 54000 or 08P01, never the process.
//! - Authentication failures look the same for unknown analysts and wrong passwords (28P01):
//!   unknown names get a decoy verifier, so the SCRAM exchange runs the same way.
//! - A CancelRequest reaches only the connection whose BackendKeyData (process id and secret
//!   key, sent by pgwire at startup) it carries, and stops only that connection's running
//!   upstream statement ([`Cancels`]); a wrong key does nothing. A client that goes away
//!   mid-statement has its upstream statement cancelled too ([`watch_client`]). Either way the
//!   charge stands.

use std::collections::{HashMap, HashSet};
use std::fmt::Debug;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::BytesMut;
use futures::{stream, Sink, SinkExt, StreamExt};
use pgwire::api::auth::mechanism::AuthMechanismFactory;
use pgwire::api::auth::sasl::scram::{gen_salted_password, ScramAuth, ScramSecret};
use pgwire::api::auth::sasl::SaslMechanisms;
use pgwire::api::auth::{
    protocol_negotiation, save_startup_parameters_to_metadata, AuthDriver, AuthOutcome, AuthSource,
    LoginInfo, Password, ServerParameterProvider, StartupHandler,
};
use pgwire::api::cancel::CancelHandler;
use pgwire::api::portal::{Format, Portal};
use pgwire::api::query::{ExtendedQueryHandler, SimpleQueryHandler};
use pgwire::api::results::{DataRowEncoder, FieldFormat, FieldInfo, QueryResponse, Response, Tag};
use pgwire::api::stmt::{QueryParser, StoredStatement};
use pgwire::api::store::PortalStore;
use pgwire::api::{
    ClientInfo, ClientPortalStore, ErrorHandler, PgWireConnectionState, PgWireServerHandlers, Type,
    DEFAULT_NAME,
};
use pgwire::error::{ErrorInfo, PgWireError, PgWireResult};
use pgwire::messages::cancel::CancelRequest;
use pgwire::messages::extendedquery::{
    Close, CloseComplete, Execute, Parse, ParseComplete, TARGET_TYPE_BYTE_PORTAL,
    TARGET_TYPE_BYTE_STATEMENT,
};
use pgwire::messages::response::NoticeResponse;
use pgwire::messages::startup::ParameterStatus;
use pgwire::messages::startup::SecretKey;
use pgwire::messages::{PgWireBackendMessage, PgWireFrontendMessage};
use pgwire::tokio::server::{
    negotiate_tls, process_error, process_message, MaybeTls, PgWireMessageServerCodec,
};
use pgwire::tokio::TlsAcceptor;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Mutex, Semaphore};
use tokio_util::codec::{Framed, FramedParts};

use crate::upstream::{Cancel, CancelReason};

use crate::error::Error;
use crate::limits;
use crate::output::{Cell, CellType, OutColumn};
use crate::policy::{Credential, Policy};
use crate::session::classify::{self, Statement};
use crate::session::{self, Outcome, Session, Shared};

// ---------------------------------------------------------------------------------------------
// Connections: TLS negotiation, admission, the startup timeout and the message guards
// ---------------------------------------------------------------------------------------------

/// The bounds the front end enforces on connections. The defaults are those of
/// [`crate::limits`]; tests lower them to reach them quickly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Most client connections at once; the next one is refused with 53300.
    pub connections_max: usize,
    /// Most authenticated connections of one analyst at once; the next one is refused with 53300.
    pub connections_per_analyst_max: usize,
    /// Time a client has to negotiate TLS, start up and authenticate before it is dropped.
    pub startup_timeout_ms: u64,
    /// Largest protocol message accepted; a larger one ends the connection with FATAL 54000.
    pub message_bytes_max: usize,
    /// Named prepared statements one connection may hold; Parse of one more is refused (54000).
    pub prepared_statements_max: usize,
}

impl Default for ConnectionLimits {
    fn default() -> ConnectionLimits {
        ConnectionLimits {
            connections_max: limits::CONNECTIONS_MAX,
            connections_per_analyst_max: limits::CONNECTIONS_PER_ANALYST_MAX,
            startup_timeout_ms: limits::STARTUP_TIMEOUT_MS,
            message_bytes_max: limits::MESSAGE_BYTES_MAX,
            prepared_statements_max: limits::PREPARED_STATEMENTS_PER_CONNECTION_MAX,
        }
    }
}

/// TLS for client connections: the acceptor and the server certificate chain (PEM), which also
/// enables SCRAM channel binding (`SCRAM-SHA-256-PLUS`) on TLS connections.
#[derive(Clone)]
pub struct Tls {
    /// The rustls acceptor (ring provider).
    pub acceptor: TlsAcceptor,
    /// The server certificate chain as PEM, for `tls-server-end-point` channel binding.
    pub certificate_pem: Vec<u8>,
}

impl Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls").finish_non_exhaustive()
    }
}

/// How the front end runs: with or without TLS, and its connection limits.
#[derive(Debug, Clone, Default)]
pub struct Front {
    /// TLS, if a certificate is configured; without it an `SSLRequest` is answered `N`.
    pub tls: Option<Tls>,
    /// Connection limits.
    pub limits: ConnectionLimits,
}

/// Accepts connections forever, one task per connection, without TLS and with the default limits.
pub async fn serve(listener: TcpListener, shared: Arc<Shared>) -> std::io::Result<()> {
    serve_with(listener, shared, Front::default()).await
}

/// Accepts connections forever, one task per connection.
///
/// A connection past `connections_max` still gets a task, so that it can be told why it is
/// refused (53300, after TLS negotiation and its startup message, as PostgreSQL does); at most
/// [`limits::CONNECTIONS_REFUSING_MAX`] such refusals run at once, beyond which sockets are
/// closed without a word.
pub async fn serve_with(
    listener: TcpListener,
    shared: Arc<Shared>,
    front: Front,
) -> std::io::Result<()> {
    let handlers = Arc::new(Handlers::with_front(shared, &front));
    let front = Arc::new(front);
    let connections = Arc::new(Semaphore::new(front.limits.connections_max));
    let refusing = Arc::new(Semaphore::new(limits::CONNECTIONS_REFUSING_MAX));
    loop {
        let (socket, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of file descriptors and similar: keep serving the connections there are.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(ACCEPT_RETRY_MS)).await;
                continue;
            }
        };
        let (admitted, permit) = match connections.clone().try_acquire_owned() {
            Ok(permit) => (true, permit),
            Err(_) => match refusing.clone().try_acquire_owned() {
                Ok(permit) => (false, permit),
                Err(_) => {
                    tracing::warn!(%peer, "too many connections; closing without a message");
                    drop(socket);
                    continue;
                }
            },
        };
        let handlers = handlers.clone();
        let front = front.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let (socket, watcher) = match watch_client(socket, handlers.cancels.open(peer)) {
                Ok(pair) => pair,
                Err(e) => {
                    tracing::warn!(%peer, error = %e, "cannot watch the client connection");
                    handlers.cancels.close(peer);
                    return;
                }
            };
            let cancels = handlers.cancels.clone();
            run_connection(socket, peer, &front, handlers, admitted).await;
            watcher.abort();
            cancels.close(peer);
        });
    }
}

/// Pause after a failed `accept` before trying again.
const ACCEPT_RETRY_MS: u64 = 50;

/// How long a connection ended for an oversized message keeps reading (and discarding) the
/// client's bytes, so that its error reaches the client before the socket closes.
const LINGER_MS: u64 = 2_000;

type ClientSocket = Framed<Framing<MaybeTls>, PgWireMessageServerCodec<Prepared>>;

/// Runs one connection: TLS negotiation and startup under the startup timeout, then messages
/// until the client leaves. The message loop is pgwire's (`process_socket`), with pgdp's
/// startup timeout, admission, and the message-size and message-structure guards of
/// [`Framing`]: a message that fails them ends the connection with FATAL 54000 or 08P01 once
/// the messages before it were answered, as PostgreSQL ends a connection whose framing it can no
/// longer trust.
async fn run_connection(
    socket: TcpStream,
    peer: SocketAddr,
    front: &Front,
    handlers: Arc<Handlers>,
    admitted: bool,
) {
    let startup_deadline =
        tokio::time::sleep(Duration::from_millis(front.limits.startup_timeout_ms));
    tokio::pin!(startup_deadline);
    let acceptor = front.tls.as_ref().map(|t| t.acceptor.clone());
    let negotiated = tokio::select! {
        _ = &mut startup_deadline => {
            tracing::info!(%peer, "startup timeout: connection dropped");
            return;
        }
        negotiated = negotiate_tls::<Prepared>(socket, acceptor) => negotiated,
    };
    let socket = match negotiated {
        Ok(Some(socket)) => socket,
        // A direct TLS handshake without a certificate configured.
        Ok(None) => return,
        Err(e) => {
            tracing::debug!(%peer, error = %e, "TLS negotiation failed");
            return;
        }
    };
    // From here on every byte the client sends passes the message guards, including those
    // pgwire already read while looking for an SSLRequest.
    let old = socket.into_parts();
    let io = Framing::new(old.io, old.read_buf, front.limits.message_bytes_max);
    let mut parts = FramedParts::new(io, old.codec);
    parts.write_buf = old.write_buf;
    let mut socket: ClientSocket = Framed::from_parts(parts);

    // The concrete handlers (the trait's `impl` types would hide the statement type).
    let startup_handler = handlers.startup.clone();
    let simple_query_handler = handlers.query.clone();
    let extended_query_handler = handlers.query.clone();
    let copy_handler = handlers.copy_handler();
    let cancel_handler = handlers.cancel_handler();
    let error_handler = handlers.error_handler();
    loop {
        let starting = matches!(
            socket.state(),
            PgWireConnectionState::AwaitingStartup
                | PgWireConnectionState::AuthenticationInProgress
        );
        let message = if starting {
            tokio::select! {
                _ = &mut startup_deadline => {
                    tracing::info!(%peer, "startup timeout: connection dropped");
                    return;
                }
                message = socket.next() => message,
            }
        } else {
            socket.next().await
        };
        let message = match message {
            None => return,
            Some(Ok(message)) => message,
            Some(Err(e)) => {
                if let Some(what) = socket.get_ref().violation() {
                    tracing::warn!(%peer, what, "malformed protocol message: connection closed");
                    let refusal = Error::Protocol {
                        what: what.to_owned(),
                    };
                    let _ = socket.send(fatal(&refusal)).await;
                    linger(socket).await;
                    return;
                }
                let declared = socket.get_ref().refused_length().or(match e {
                    PgWireError::MessageTooLarge(_, length) => Some(length),
                    _ => None,
                });
                match declared {
                    Some(length) => {
                        tracing::warn!(%peer, length, "protocol message too large: connection closed");
                        let refusal = Error::LimitExceeded {
                            what: "the length of a protocol message in bytes".into(),
                            limit: front.limits.message_bytes_max as u64,
                        };
                        let _ = socket.send(fatal(&refusal)).await;
                        linger(socket).await;
                    }
                    None => {
                        tracing::debug!(%peer, error = %e, "unreadable message: connection closed")
                    }
                }
                return;
            }
        };
        if matches!(message, PgWireFrontendMessage::Terminate(_)) {
            return;
        }
        if !admitted && matches!(message, PgWireFrontendMessage::Startup(_)) {
            tracing::warn!(%peer, "too many connections: refused");
            let refusal = Error::TooManyConnections {
                scope: String::new(),
            };
            let _ = socket.send(fatal(&refusal)).await;
            let _ = socket.close().await;
            return;
        }
        let extended = match socket.state() {
            PgWireConnectionState::CopyInProgress(extended) => extended,
            _ => message.is_extended_query(),
        };
        let cancel = matches!(message, PgWireFrontendMessage::CancelRequest(_));
        let result = process_message(
            message,
            &mut socket,
            startup_handler.clone(),
            simple_query_handler.clone(),
            extended_query_handler.clone(),
            copy_handler.clone(),
            cancel_handler.clone(),
        )
        .await;
        if let Err(mut e) = result {
            error_handler.on_error(&socket, &mut e);
            if e.is_fatal() {
                // A FATAL error ends the session, as in PostgreSQL: no ReadyForQuery after it.
                let info: ErrorInfo = e.into();
                let _ = socket
                    .send(PgWireBackendMessage::ErrorResponse(info.into()))
                    .await;
                let _ = socket.close().await;
                return;
            }
            if process_error(&mut socket, e, extended).await.is_err() {
                return;
            }
        }
        if cancel {
            return;
        }
    }
}

/// An `Error` as a FATAL ErrorResponse, which ends the connection.
fn fatal(e: &Error) -> PgWireBackendMessage {
    let mut info = error_info(e);
    info.severity = "FATAL".to_owned();
    PgWireBackendMessage::ErrorResponse(info.into())
}

/// Closes our side, then reads and discards what the client still sends, for a bounded time
/// and amount: closing a socket with unread input resets it, and the client could lose the error
/// it was just sent.
async fn linger(socket: ClientSocket) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut io = socket.into_parts().io.inner;
    let _ = io.shutdown().await;
    let mut scratch = vec![0u8; 64 * 1024];
    let drain = async {
        let mut total = 0usize;
        while total < limits::MESSAGE_BYTES_MAX * 4 {
            match io.read(&mut scratch).await {
                Ok(0) | Err(_) => break,
                Ok(n) => total += n,
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_millis(LINGER_MS), drain).await;
}

/// The client's byte stream, framed and checked as it flows past, before pgwire decodes it.
///
/// Two guards, each ending the connection with a FATAL error in [`run_connection`]:
/// - **Size**: every message's declared length is compared with the limit as soon as its header
///   arrives, before its body is buffered (54000).
/// - **Structure**: each message is held back until it is complete, then its body is checked
///   against the layout of its type ([`check_message`]); a message whose fields do not exactly
///   fill its declared length, an unknown message type, or a length below 4 is a protocol
///   violation (08P01). pgwire 0.42 decodes each body from the shared read buffer without
///   bounding it by the declared length, so bytes after a message's fields were read as the next
///   message (a Query hidden inside a Parse ran), and fields missing from a SASLInitialResponse
///   panicked the connection task; no such message reaches pgwire now.
///
/// Invariant: bytes are passed on in order and unchanged, whole messages at a time, and only
/// messages that passed both guards; after the first one that fails, nothing more is passed on
/// and every later read fails.
struct Framing<S> {
    inner: S,
    /// Bytes pgwire read before the guard was installed, checked (and passed on) first.
    replay: BytesMut,
    /// Checked bytes not yet handed to pgwire.
    checked: BytesMut,
    /// The message being received: its header and as much of its body as has arrived.
    current: Vec<u8>,
    /// Length of the current header once complete (5 with a type byte, 4 for the startup packet).
    header_len: usize,
    body_left: usize,
    /// False until the startup packet (the only message without a type byte) has been framed.
    typed: bool,
    /// `p` messages framed so far: the first one is the SASLInitialResponse.
    password_messages: usize,
    message_bytes_max: usize,
    refused: Option<usize>,
    violation: Option<String>,
}

/// Bytes read from the client at a time.
const READ_CHUNK_BYTES: usize = 16 * 1024;

impl<S> Framing<S> {
    fn new(inner: S, replay: BytesMut, message_bytes_max: usize) -> Framing<S> {
        Framing {
            inner,
            replay,
            checked: BytesMut::new(),
            current: Vec::new(),
            header_len: 0,
            body_left: 0,
            typed: false,
            password_messages: 0,
            message_bytes_max,
            refused: None,
            violation: None,
        }
    }

    /// The declared length of the message refused, if one was.
    fn refused_length(&self) -> Option<usize> {
        self.refused
    }

    /// What was wrong with the malformed message that ended the stream, if one did.
    fn violation(&self) -> Option<&str> {
        self.violation.as_deref()
    }

    fn failed(&self) -> bool {
        self.refused.is_some() || self.violation.is_some()
    }

    /// Frames `bytes`, moving every complete message that passes both guards to `checked`.
    fn scan(&mut self, bytes: &[u8]) {
        let mut i = 0;
        while i < bytes.len() && !self.failed() {
            let header_len = if self.typed { 5 } else { 4 };
            if self.current.len() < header_len {
                let n = (header_len - self.current.len()).min(bytes.len() - i);
                self.current.extend_from_slice(&bytes[i..i + n]);
                i += n;
                if self.current.len() < header_len {
                    break;
                }
                let l = &self.current[header_len - 4..header_len];
                let length = u32::from_be_bytes([l[0], l[1], l[2], l[3]]) as usize;
                self.header_len = header_len;
                if length > self.message_bytes_max {
                    self.refused = Some(length);
                    break;
                }
                if length < 4 {
                    self.violation = Some("invalid message length".to_owned());
                    break;
                }
                self.body_left = length - 4;
            } else {
                let n = self.body_left.min(bytes.len() - i);
                self.current.extend_from_slice(&bytes[i..i + n]);
                self.body_left -= n;
                i += n;
            }
            if self.body_left == 0 {
                self.finish_message();
            }
        }
    }

    /// Checks the complete message in `current` and passes it on, or records the violation.
    fn finish_message(&mut self) {
        let message = std::mem::take(&mut self.current);
        let (tag, body) = if self.typed {
            (Some(message[0]), &message[self.header_len..])
        } else {
            (None, &message[self.header_len..])
        };
        let sasl_initial = tag == Some(b'p') && self.password_messages == 0;
        match check_message(tag, body, sasl_initial) {
            Ok(()) => {
                self.typed = true;
                if tag == Some(b'p') {
                    self.password_messages += 1;
                }
                self.checked.extend_from_slice(&message);
            }
            Err(what) => self.violation = Some(what),
        }
    }
}

/// `Ok` if `body` is laid out as a frontend message of type `tag` must be (`None`: the startup
/// packet), the way PostgreSQL reads it (`pq_getmsg*` and `pq_getmsgend` in
/// `src/backend/tcop/postgres.c`): every field present, nothing after the last one. `sasl_initial`
/// says that a `p` message is the SASLInitialResponse (pgdp only offers SCRAM, so that is the
/// first `p` after the startup packet; later ones are SASLResponses, opaque bytes). Otherwise the
/// message as PostgreSQL words it.
fn check_message(tag: Option<u8>, body: &[u8], sasl_initial: bool) -> Result<(), String> {
    const FORMAT: &str = "invalid message format";
    let mut r = Fields { rest: body };
    let ok = match tag {
        None => return check_startup_packet(body),
        Some(b'p') if sasl_initial => {
            let ok = r.cstring() && {
                match r.int32() {
                    Some(-1) => true,
                    Some(n) => usize::try_from(n).is_ok_and(|n| r.take(n)),
                    None => false,
                }
            };
            if !(ok && r.rest.is_empty()) {
                return Err("malformed SASL message".to_owned());
            }
            return Ok(());
        }
        // SASLResponse, CopyData: opaque bytes.
        Some(b'p' | b'd') => return Ok(()),
        Some(b'Q' | b'f') => r.cstring(),
        Some(b'P') => r.cstring() && r.cstring() && r.counted(4),
        Some(b'B') => {
            r.cstring() && r.cstring() && r.counted(2) && r.parameter_values() && r.counted(2)
        }
        Some(b'E') => r.cstring() && r.int32().is_some(),
        Some(kind @ (b'D' | b'C')) => {
            let what = if kind == b'D' { "DESCRIBE" } else { "CLOSE" };
            match r.byte() {
                Some(b'S' | b'P') => {}
                Some(_) => return Err(format!("invalid {what} message subtype")),
                None => return Err(FORMAT.to_owned()),
            }
            r.cstring()
        }
        Some(b'S' | b'H' | b'X' | b'c') => true,
        Some(other) => return Err(format!("invalid frontend message type {other}")),
    };
    if ok && r.rest.is_empty() {
        Ok(())
    } else {
        Err(FORMAT.to_owned())
    }
}

/// The startup packet: a CancelRequest (left to pgwire) or a StartupMessage of protocol 3.x,
/// whose parameters are name/value strings ended by one empty name that is its last byte.
/// pgwire reads the parameters until an empty name without a bound, so a packet without the
/// terminator was read on into the next message. Other codes are left to pgwire, which refuses
/// them.
fn check_startup_packet(body: &[u8]) -> Result<(), String> {
    let Some(code) = body.get(..4) else {
        return Ok(());
    };
    if u16::from_be_bytes([code[0], code[1]]) != 3 {
        return Ok(());
    }
    let mut r = Fields { rest: &body[4..] };
    loop {
        match r.rest {
            [0] => return Ok(()),
            // An empty name is the terminator, and only the last byte may be one.
            [] | [0, ..] => break,
            _ => {
                if !(r.cstring() && r.cstring()) {
                    break;
                }
            }
        }
    }
    Err("invalid startup packet layout: expected terminator as last byte".to_owned())
}

/// A cursor over a message body, for [`check_message`].
struct Fields<'a> {
    rest: &'a [u8],
}

impl Fields<'_> {
    fn take(&mut self, n: usize) -> bool {
        match self.rest.get(n..) {
            Some(rest) => {
                self.rest = rest;
                true
            }
            None => false,
        }
    }

    fn byte(&mut self) -> Option<u8> {
        let b = *self.rest.first()?;
        self.take(1).then_some(b)
    }

    fn cstring(&mut self) -> bool {
        match self.rest.iter().position(|b| *b == 0) {
            Some(i) => self.take(i + 1),
            None => false,
        }
    }

    fn uint16(&mut self) -> Option<usize> {
        let b = self.rest.get(..2)?;
        let v = usize::from(u16::from_be_bytes([b[0], b[1]]));
        self.take(2).then_some(v)
    }

    fn int32(&mut self) -> Option<i32> {
        let b = self.rest.get(..4)?;
        let v = i32::from_be_bytes([b[0], b[1], b[2], b[3]]);
        self.take(4).then_some(v)
    }

    /// A 16-bit count, then that many items of `size` bytes.
    fn counted(&mut self, size: usize) -> bool {
        self.uint16().is_some_and(|n| self.take(n * size))
    }

    /// Bind's parameter values: a 16-bit count, then each a 32-bit length (-1 for NULL) and
    /// that many bytes.
    fn parameter_values(&mut self) -> bool {
        let Some(n) = self.uint16() else {
            return false;
        };
        (0..n).all(|_| match self.int32() {
            Some(-1) => true,
            Some(len) => usize::try_from(len).is_ok_and(|len| self.take(len)),
            None => false,
        })
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Framing<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        loop {
            if !this.checked.is_empty() {
                let n = this.checked.len().min(buf.remaining());
                buf.put_slice(&this.checked.split_to(n));
                return Poll::Ready(Ok(()));
            }
            if this.failed() {
                return Poll::Ready(Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    "protocol message refused",
                )));
            }
            if !this.replay.is_empty() {
                let replay = this.replay.split();
                this.scan(&replay);
                continue;
            }
            let mut chunk = [0u8; READ_CHUNK_BYTES];
            let mut read = ReadBuf::new(&mut chunk);
            ready!(Pin::new(&mut this.inner).poll_read(cx, &mut read))?;
            if read.filled().is_empty() {
                // The end of the stream: a message cut short is dropped, pgwire sees the end.
                return Poll::Ready(Ok(()));
            }
            let filled = read.filled().len();
            this.scan(&chunk[..filled]);
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Framing<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// Counts the authenticated connections of each analyst.
#[derive(Debug)]
struct Admission {
    per_analyst_max: usize,
    open: std::sync::Mutex<HashMap<String, usize>>,
}

/// One analyst's place among their connections; given back when the connection ends (the slot
/// lives in the connection's session extensions).
struct AnalystSlot {
    admission: Arc<Admission>,
    analyst: String,
}

impl Admission {
    fn new(per_analyst_max: usize) -> Admission {
        Admission {
            per_analyst_max,
            open: std::sync::Mutex::new(HashMap::new()),
        }
    }

    /// A slot for `analyst`, or `None` if they already hold `per_analyst_max` connections.
    fn admit(self: &Arc<Self>, analyst: &str) -> Option<AnalystSlot> {
        // A poisoned map is still a consistent map: every update is a single statement.
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let count = open.entry(analyst.to_string()).or_insert(0);
        if *count >= self.per_analyst_max {
            return None;
        }
        *count += 1;
        Some(AnalystSlot {
            admission: self.clone(),
            analyst: analyst.to_string(),
        })
    }
}

impl Drop for AnalystSlot {
    fn drop(&mut self) {
        let mut open = self
            .admission
            .open
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(count) = open.get_mut(&self.analyst) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                open.remove(&self.analyst);
            }
        }
    }
}

/// Startup and SCRAM-SHA-256 authentication, with the per-analyst connection limit checked once
/// the password is verified and before `AuthenticationOk` is sent.
struct Startup {
    driver: AuthDriver<Arc<Parameters>>,
    /// SCRAM-SHA-256, for plain connections.
    plain: SaslMechanisms,
    /// SCRAM-SHA-256 and, with a certificate, SCRAM-SHA-256-PLUS, for TLS connections.
    secure: SaslMechanisms,
    admission: Arc<Admission>,
}

#[async_trait]
impl StartupHandler for Startup {
    async fn on_startup<C>(
        &self,
        client: &mut C,
        message: PgWireFrontendMessage,
    ) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let outcome = match message {
            PgWireFrontendMessage::Startup(ref startup) => {
                protocol_negotiation(client, startup).await?;
                save_startup_parameters_to_metadata(client, startup);
                let mechanism = if client.is_secure() {
                    self.secure.create()
                } else {
                    self.plain.create()
                };
                self.driver.begin_authentication(client, mechanism).await?
            }
            PgWireFrontendMessage::PasswordMessageFamily(message) => {
                self.driver.advance_authentication(client, message).await?
            }
            _ => return Ok(()),
        };
        match outcome {
            AuthOutcome::InProgress => Ok(()),
            AuthOutcome::Authenticated { final_message, .. } => {
                let analyst = client.metadata().get("user").cloned().unwrap_or_default();
                let Some(slot) = self.admission.admit(&analyst) else {
                    tracing::warn!(analyst, "too many connections for this analyst: refused");
                    let refusal = Error::TooManyConnections {
                        scope: format!(
                            " for analyst \"{analyst}\" (at most {})",
                            self.admission.per_analyst_max
                        ),
                    };
                    let mut info = error_info(&refusal);
                    info.severity = "FATAL".to_owned();
                    return Err(PgWireError::UserError(Box::new(info)));
                };
                client.session_extensions().insert(slot);
                self.driver
                    .complete_authentication(client, final_message)
                    .await
            }
        }
    }
}

/// The handlers of all connections. Per-connection state lives in pgwire's session extensions.
pub struct Handlers {
    query: Arc<QueryHandler>,
    startup: Arc<Startup>,
    cancels: Arc<Cancels>,
}

impl Handlers {
    /// Handlers for a server without TLS and with the default limits.
    pub fn new(shared: Arc<Shared>) -> Handlers {
        Handlers::with_front(shared, &Front::default())
    }

    /// Handlers for a server with the given TLS and limits.
    pub fn with_front(shared: Arc<Shared>, front: &Front) -> Handlers {
        let credentials: Arc<dyn AuthSource> = Arc::new(Credentials::new(&shared.policy));
        let scram = ScramAuth::new(credentials);
        let mut secure_scram = scram.clone();
        if let Some(tls) = &front.tls {
            if let Err(e) = secure_scram.configure_certificate(&tls.certificate_pem) {
                tracing::warn!(error = %e, "no SCRAM channel binding with this certificate");
            }
        }
        let startup = Startup {
            driver: AuthDriver::new(Arc::new(Parameters {
                shared: shared.clone(),
            })),
            plain: SaslMechanisms::new(vec![Arc::new(scram)]),
            secure: SaslMechanisms::new(vec![Arc::new(secure_scram)]),
            admission: Arc::new(Admission::new(front.limits.connections_per_analyst_max)),
        };
        let cancels = Arc::new(Cancels::default());
        Handlers {
            query: Arc::new(QueryHandler {
                shared: shared.clone(),
                parser: Arc::new(Parser {
                    shared: shared.clone(),
                    cancels: cancels.clone(),
                }),
                cancels: cancels.clone(),
                prepared_statements_max: front.limits.prepared_statements_max,
            }),
            startup: Arc::new(startup),
            cancels,
        }
    }
}

impl PgWireServerHandlers for Handlers {
    fn simple_query_handler(&self) -> Arc<impl SimpleQueryHandler> {
        self.query.clone()
    }

    fn extended_query_handler(&self) -> Arc<impl ExtendedQueryHandler> {
        self.query.clone()
    }

    fn startup_handler(&self) -> Arc<impl StartupHandler> {
        self.startup.clone()
    }

    fn cancel_handler(&self) -> Arc<impl CancelHandler> {
        self.cancels.clone()
    }
}

// ---------------------------------------------------------------------------------------------
// Cancellation: CancelRequest, and clients that go away mid-statement
// ---------------------------------------------------------------------------------------------

/// The [`Cancel`] of every open client connection, by peer address, with the key pgwire sent
/// it in BackendKeyData once its session exists.
#[derive(Default)]
pub struct Cancels {
    by_peer: std::sync::Mutex<HashMap<SocketAddr, CancelEntry>>,
}

struct CancelEntry {
    cancel: Arc<Cancel>,
    key: Option<(i32, SecretKey)>,
}

impl Cancels {
    /// Registers a new connection.
    fn open(&self, peer: SocketAddr) -> Arc<Cancel> {
        let cancel = Arc::new(Cancel::default());
        if let Ok(mut by_peer) = self.by_peer.lock() {
            by_peer.insert(
                peer,
                CancelEntry {
                    cancel: cancel.clone(),
                    key: None,
                },
            );
        }
        cancel
    }

    /// Forgets a connection that ended.
    fn close(&self, peer: SocketAddr) {
        if let Ok(mut by_peer) = self.by_peer.lock() {
            by_peer.remove(&peer);
        }
    }

    /// The connection's [`Cancel`], now reachable with its BackendKeyData.
    fn attach(&self, peer: SocketAddr, pid: i32, key: SecretKey) -> Arc<Cancel> {
        let Ok(mut by_peer) = self.by_peer.lock() else {
            return Arc::new(Cancel::default());
        };
        match by_peer.get_mut(&peer) {
            Some(entry) => {
                entry.key = Some((pid, key));
                entry.cancel.clone()
            }
            None => Arc::new(Cancel::default()),
        }
    }

    /// The connection a CancelRequest names, if its process id and secret key both match.
    fn find(&self, pid: i32, key: &SecretKey) -> Option<Arc<Cancel>> {
        let by_peer = self.by_peer.lock().ok()?;
        by_peer.values().find_map(|entry| match &entry.key {
            Some((p, k)) if *p == pid && same_key(k, key) => Some(entry.cancel.clone()),
            _ => None,
        })
    }
}

/// Compares secret keys in time independent of where they differ.
fn same_key(a: &SecretKey, b: &SecretKey) -> bool {
    let (a, b) = (a.to_bytes(), b.to_bytes());
    a.len() == b.len() && a.iter().zip(b.iter()).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

#[async_trait]
impl CancelHandler for Cancels {
    async fn on_cancel_request(&self, request: CancelRequest) {
        match self.find(request.pid, &request.secret_key) {
            Some(cancel) => {
                let running = cancel.request(CancelReason::UserRequest).await;
                tracing::info!(pid = request.pid, running, "cancel request");
            }
            None => tracing::info!(
                pid = request.pid,
                "cancel request with an unknown key ignored"
            ),
        }
    }
}

/// How often a client's socket is looked at again while it holds bytes pgdp has not read yet.
const CLIENT_WATCH_INTERVAL_MS: u64 = 200;

/// Watches `socket` for the client going away, through a duplicate of its descriptor (pgwire
/// owns the original): when the client closes or resets the connection, `cancel` stops the
/// upstream statement it was waiting for. Returns the socket for pgwire and the watcher task.
/// While the client has sent bytes pgdp has not read yet (pipelined messages), the end of the
/// stream cannot be seen behind them; the watcher then looks again every
/// [`CLIENT_WATCH_INTERVAL_MS`].
fn watch_client(
    socket: TcpStream,
    cancel: Arc<Cancel>,
) -> std::io::Result<(TcpStream, tokio::task::JoinHandle<()>)> {
    let original = socket.into_std()?;
    let duplicate = original.try_clone()?;
    let socket = TcpStream::from_std(original)?;
    let watched = TcpStream::from_std(duplicate)?;
    let watcher = tokio::spawn(async move {
        let mut byte = [0u8; 1];
        loop {
            match watched.peek(&mut byte).await {
                Ok(0) | Err(_) => {
                    cancel.request(CancelReason::ClientGone).await;
                    return;
                }
                Ok(_) => {
                    tokio::time::sleep(std::time::Duration::from_millis(CLIENT_WATCH_INTERVAL_MS))
                        .await
                }
            }
        }
    });
    Ok((socket, watcher))
}

// ---------------------------------------------------------------------------------------------
// Authentication
// ---------------------------------------------------------------------------------------------

/// Analyst credentials from the policy, in the form SCRAM needs.
struct Credentials {
    database: String,
    secrets: HashMap<String, StoredSecret>,
    decoy_key: [u8; 32],
}

enum StoredSecret {
    Verifier {
        salt: Vec<u8>,
        iterations: usize,
        stored_key: Vec<u8>,
        server_key: Vec<u8>,
    },
    Salted {
        salt: Vec<u8>,
        salted_password: Vec<u8>,
    },
}

impl Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("analysts", &self.secrets.len())
            .finish()
    }
}

impl Credentials {
    fn new(policy: &Policy) -> Credentials {
        let mut decoy_key = [0u8; 32];
        rand::fill(&mut decoy_key);
        let secrets = policy
            .analysts
            .values()
            .map(|a| {
                let secret = match &a.credential {
                    Credential::Verifier {
                        salt,
                        iterations,
                        stored_key,
                        server_key,
                    } => StoredSecret::Verifier {
                        salt: salt.clone(),
                        iterations: *iterations,
                        stored_key: stored_key.clone(),
                        server_key: server_key.clone(),
                    },
                    Credential::Password(pw) => {
                        let mut salt = vec![0u8; 16];
                        rand::fill(salt.as_mut_slice());
                        let salted_password = gen_salted_password(pw, &salt, 4096);
                        StoredSecret::Salted {
                            salt,
                            salted_password,
                        }
                    }
                };
                (a.name.clone(), secret)
            })
            .collect();
        Credentials {
            database: policy.database.clone(),
            secrets,
            decoy_key,
        }
    }

    /// A verifier for an unknown user: deterministic per user (so retries look alike) and never
    /// matching any password.
    fn decoy(&self, user: &str) -> ScramSecret {
        let digest = |label: &[u8]| {
            let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
            ctx.update(&self.decoy_key);
            ctx.update(label);
            ctx.update(user.as_bytes());
            ctx.finish().as_ref().to_vec()
        };
        ScramSecret::Verifier {
            salt: digest(b"salt")[..16].to_vec(),
            iterations: 4096,
            stored_key: digest(b"stored"),
            server_key: digest(b"server"),
        }
    }
}

#[async_trait]
impl AuthSource for Credentials {
    async fn get_password(&self, login: &LoginInfo) -> PgWireResult<Password> {
        Err(PgWireError::InvalidPassword(
            login.user().unwrap_or_default().to_owned(),
        ))
    }

    async fn get_scram_secret(&self, login: &LoginInfo) -> PgWireResult<(ScramSecret, Option<()>)> {
        let user = login.user().unwrap_or_default();
        let database = login.database().unwrap_or(user);
        if database != self.database {
            return Err(user_error(&Error::UnknownDatabase {
                name: database.to_string(),
            }));
        }
        let secret = match self.secrets.get(user) {
            Some(StoredSecret::Verifier {
                salt,
                iterations,
                stored_key,
                server_key,
            }) => ScramSecret::Verifier {
                salt: salt.clone(),
                iterations: *iterations,
                stored_key: stored_key.clone(),
                server_key: server_key.clone(),
            },
            Some(StoredSecret::Salted {
                salt,
                salted_password,
            }) => ScramSecret::SaltedPassword {
                salt: salt.clone(),
                salted_password: salted_password.clone(),
            },
            None => self.decoy(user),
        };
        Ok((secret, None))
    }
}

/// ParameterStatus values sent at startup.
struct Parameters {
    shared: Arc<Shared>,
}

impl ServerParameterProvider for Parameters {
    fn server_parameters<C>(&self, client: &C) -> Option<HashMap<String, String>>
    where
        C: ClientInfo,
    {
        let version = self
            .shared
            .upstream
            .cached_server_version()
            .unwrap_or_else(|| "15.0".into());
        let user = client.metadata().get("user").cloned().unwrap_or_default();
        let application = client
            .metadata()
            .get("application_name")
            .cloned()
            .unwrap_or_default();
        let mut p = HashMap::new();
        for (k, v) in [
            ("server_version", version.as_str()),
            ("server_encoding", "UTF8"),
            ("client_encoding", "UTF8"),
            ("DateStyle", "ISO, MDY"),
            ("IntervalStyle", "postgres"),
            ("TimeZone", "UTC"),
            ("integer_datetimes", "on"),
            ("standard_conforming_strings", "on"),
            ("is_superuser", "off"),
            ("default_transaction_read_only", "on"),
            ("in_hot_standby", "off"),
            ("session_authorization", user.as_str()),
            ("application_name", application.as_str()),
        ] {
            p.insert(k.to_string(), v.to_string());
        }
        Some(p)
    }
}

// ---------------------------------------------------------------------------------------------
// Queries
// ---------------------------------------------------------------------------------------------

/// Per-connection state, kept in pgwire's session extensions.
#[derive(Default)]
struct Connection {
    session: Mutex<Option<Session>>,
    /// Names of the named prepared statements this connection holds (pgwire's store cannot be
    /// counted), bounded by `prepared_statements_max`.
    prepared_names: std::sync::Mutex<HashSet<String>>,
}

impl Connection {
    fn prepared_names(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        // Every update is a single insert or remove: a poisoned set is still consistent.
        self.prepared_names
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }
}

/// Removes prepared statements from pgwire's store and from the connection's count: one by name,
/// or all of them (`DEALLOCATE ALL`).
fn forget_statements<C>(client: &C, name: Option<&str>)
where
    C: ClientInfo + ClientPortalStore,
    C::PortalStore: PortalStore,
{
    let conn = connection(client);
    let mut names = conn.prepared_names();
    match name {
        Some(n) => {
            client.portal_store().rm_statement(n);
            names.remove(n);
        }
        None => {
            for n in names.drain() {
                client.portal_store().rm_statement(&n);
            }
        }
    }
}

/// A statement prepared with Parse: classified once, its result schema known for Describe.
#[derive(Debug, Clone)]
pub struct Prepared {
    statement: Option<Statement>,
    columns: Option<Vec<OutColumn>>,
    parameter_types: Vec<Type>,
}

/// Handles simple and extended queries.
pub struct QueryHandler {
    shared: Arc<Shared>,
    parser: Arc<Parser>,
    cancels: Arc<Cancels>,
    prepared_statements_max: usize,
}

/// Parses and classifies statements of the extended protocol.
pub struct Parser {
    shared: Arc<Shared>,
    cancels: Arc<Cancels>,
}

fn connection<C: ClientInfo>(client: &C) -> Arc<Connection> {
    client
        .session_extensions()
        .get_or_insert_with(Connection::default)
}

/// Creates the session on first use (after authentication, the user is a known analyst).
fn ensure_session<'a, C: ClientInfo>(
    slot: &'a mut Option<Session>,
    client: &C,
    shared: &Shared,
    cancels: &Cancels,
) -> Result<&'a mut Session, Error> {
    if slot.is_none() {
        let user = client.metadata().get("user").cloned().unwrap_or_default();
        let analyst = shared
            .policy
            .analysts
            .get(&user)
            .cloned()
            .ok_or(Error::Authentication { user })?;
        let version = shared
            .upstream
            .cached_server_version()
            .unwrap_or_else(|| "15.0".into());
        let (pid, key) = client.pid_and_secret_key();
        let cancel = cancels.attach(client.socket_addr(), pid, key);
        *slot = Some(Session::new(shared, analyst, version, pid, cancel)?);
    }
    slot.as_mut()
        .ok_or_else(|| Error::internal("session missing after creation"))
}

fn error_info(e: &Error) -> ErrorInfo {
    let mut info = ErrorInfo::new(
        "ERROR".to_owned(),
        e.sqlstate().code().to_owned(),
        e.to_string(),
    );
    info.hint = e.hint().map(str::to_owned);
    info
}

fn user_error(e: &Error) -> PgWireError {
    PgWireError::UserError(Box::new(error_info(e)))
}

fn pg_type(ty: CellType) -> Type {
    match ty {
        CellType::Int8 => Type::INT8,
        CellType::Int4 => Type::INT4,
        CellType::Float8 => Type::FLOAT8,
        CellType::Text => Type::TEXT,
        CellType::Bool => Type::BOOL,
        CellType::Raw(oid) => Type::from_oid(oid).unwrap_or(Type::TEXT),
    }
}

fn parameter_pg_type(ty: crate::policy::ColumnType, declared: Option<&str>) -> Type {
    use crate::policy::ColumnType as C;
    match declared {
        Some("integer" | "int" | "int4") => return Type::INT4,
        Some("smallint" | "int2") => return Type::INT2,
        _ => {}
    }
    match ty {
        C::Integer => Type::INT8,
        // Drivers bind floats more easily than numerics; pgdp casts to numeric itself.
        C::Numeric | C::Float => Type::FLOAT8,
        C::Text => Type::TEXT,
        C::Date => Type::DATE,
        C::Timestamp => Type::TIMESTAMP,
        C::Boolean => Type::BOOL,
    }
}

/// Encodes a catalog value (PostgreSQL text output) in the requested format.
fn encode_raw(
    encoder: &mut DataRowEncoder,
    oid: u32,
    value: Option<String>,
    format: FieldFormat,
) -> PgWireResult<()> {
    let ty = Type::from_oid(oid).unwrap_or(Type::TEXT);
    let options = pgwire::types::format::FormatOptions::default();
    if format == FieldFormat::Text {
        // The text is already PostgreSQL's output; write it as is (no array re-quoting).
        return encoder.encode_field_with_type_and_format(&value, &Type::TEXT, format, &options);
    }
    let type_name = ty.name().to_string();
    let bad = || {
        PgWireError::UserError(Box::new(ErrorInfo::new(
            "ERROR".into(),
            "0A000".into(),
            format!(
                "binary format for catalog columns of type {type_name} is not supported by pgdp"
            ),
        )))
    };
    let parse_err = |_| bad();
    match ty.clone() {
        t if t == Type::INT2 => {
            let v = value
                .map(|x| x.parse::<i16>())
                .transpose()
                .map_err(parse_err)?;
            encoder.encode_field_with_type_and_format(&v, &t, format, &options)
        }
        t if t == Type::INT4 => {
            let v = value
                .map(|x| x.parse::<i32>())
                .transpose()
                .map_err(parse_err)?;
            encoder.encode_field_with_type_and_format(&v, &t, format, &options)
        }
        t if t == Type::INT8 => {
            let v = value
                .map(|x| x.parse::<i64>())
                .transpose()
                .map_err(parse_err)?;
            encoder.encode_field_with_type_and_format(&v, &t, format, &options)
        }
        t if t == Type::OID => {
            let v = value
                .map(|x| x.parse::<u32>())
                .transpose()
                .map_err(parse_err)?;
            encoder.encode_field_with_type_and_format(&v, &t, format, &options)
        }
        t if t == Type::BOOL => {
            let v = value.map(|x| x == "t");
            encoder.encode_field_with_type_and_format(&v, &t, format, &options)
        }
        t if t == Type::CHAR => {
            // The single-byte "char" (pg_class.relkind and friends): its binary form is the byte.
            let v = value
                .map(|x| match x.as_bytes() {
                    [] => Ok(0i8),
                    [b] => Ok(i8::from_ne_bytes([*b])),
                    _ => Err(()),
                })
                .transpose()
                .map_err(|()| bad())?;
            encoder.encode_field_with_type_and_format(&v, &t, format, &options)
        }
        t if t == Type::FLOAT4 => {
            let v = value
                .map(|x| x.parse::<f32>())
                .transpose()
                .map_err(|_| bad())?;
            encoder.encode_field_with_type_and_format(&v, &t, format, &options)
        }
        t if t == Type::FLOAT8 => {
            let v = value
                .map(|x| x.parse::<f64>())
                .transpose()
                .map_err(|_| bad())?;
            encoder.encode_field_with_type_and_format(&v, &t, format, &options)
        }
        t if t == Type::TEXT || t == Type::VARCHAR || t == Type::NAME || t == Type::BPCHAR => {
            encoder.encode_field_with_type_and_format(&value, &Type::TEXT, format, &options)
        }
        _ => Err(bad()),
    }
}

fn fields(columns: &[OutColumn], format: &Format) -> Vec<FieldInfo> {
    columns
        .iter()
        .enumerate()
        .map(|(i, c)| {
            FieldInfo::new(
                c.name.clone(),
                None,
                None,
                pg_type(c.ty),
                format.format_for(i),
            )
        })
        .collect()
}

fn encode_rows(
    columns: &[OutColumn],
    rows: Vec<Vec<Cell>>,
    format: &Format,
) -> PgWireResult<QueryResponse> {
    let schema = Arc::new(fields(columns, format));
    let mut encoder = DataRowEncoder::new(schema.clone());
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        for (i, (cell, column)) in row.into_iter().zip(columns).enumerate() {
            match (column.ty, cell) {
                (CellType::Raw(oid), cell) => {
                    let value = match cell {
                        Cell::Null => None,
                        Cell::Text(t) => Some(t),
                        Cell::Int(x) => Some(x.to_string()),
                        Cell::Float(x) => Some(x.to_string()),
                        Cell::Bool(b) => Some(if b { "t" } else { "f" }.to_string()),
                    };
                    encode_raw(&mut encoder, oid, value, format.format_for(i))?
                }
                (CellType::Int8, Cell::Int(i)) => encoder.encode_field(&Some(i))?,
                (CellType::Int4, Cell::Int(i)) => {
                    encoder.encode_field(&Some(i32::try_from(i).unwrap_or(i32::MAX)))?
                }
                (CellType::Float8, Cell::Float(f)) => encoder.encode_field(&Some(f))?,
                (CellType::Float8, Cell::Int(i)) => encoder.encode_field(&Some(i as f64))?,
                (CellType::Bool, Cell::Bool(b)) => encoder.encode_field(&Some(b))?,
                (CellType::Text, Cell::Text(t)) => encoder.encode_field(&Some(t))?,
                (CellType::Int8, _) => encoder.encode_field(&None::<i64>)?,
                (CellType::Int4, _) => encoder.encode_field(&None::<i32>)?,
                (CellType::Float8, _) => encoder.encode_field(&None::<f64>)?,
                (CellType::Bool, _) => encoder.encode_field(&None::<bool>)?,
                (CellType::Text, other) => match other {
                    Cell::Null => encoder.encode_field(&None::<String>)?,
                    Cell::Int(i) => encoder.encode_field(&Some(i.to_string()))?,
                    Cell::Float(f) => encoder.encode_field(&Some(f.to_string()))?,
                    Cell::Bool(b) => {
                        encoder.encode_field(&Some(if b { "t" } else { "f" }.to_string()))?
                    }
                    Cell::Text(t) => encoder.encode_field(&Some(t))?,
                },
            }
        }
        out.push(Ok(encoder.take_row()));
    }
    Ok(QueryResponse::new(schema, stream::iter(out)))
}

/// Sends notices and parameter changes, and turns an outcome into a pgwire response. Rows of a
/// FETCH are tagged `FETCH n`, as PostgreSQL does.
async fn respond<C>(
    client: &mut C,
    outcome: Outcome,
    format: &Format,
    fetch: bool,
) -> PgWireResult<Response>
where
    C: Sink<PgWireBackendMessage> + Unpin + Send,
    C::Error: Debug,
    PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
{
    Ok(match outcome {
        Outcome::Command { tag, reported } => {
            if let Some((name, value)) = reported {
                client
                    .feed(PgWireBackendMessage::ParameterStatus(ParameterStatus::new(
                        name, value,
                    )))
                    .await?;
            }
            Response::Execution(Tag::new(&tag))
        }
        Outcome::TransactionStart => Response::TransactionStart(Tag::new("BEGIN")),
        Outcome::TransactionEnd { tag } => Response::TransactionEnd(Tag::new(&tag)),
        Outcome::Rows(answer) => {
            let (columns, rows, notices) = answer.into_parts();
            for n in notices {
                let info = ErrorInfo::new("NOTICE".to_owned(), "00000".to_owned(), n.message);
                client
                    .feed(PgWireBackendMessage::NoticeResponse(NoticeResponse::from(
                        info,
                    )))
                    .await?;
            }
            let mut response = encode_rows(&columns, rows, format)?;
            if fetch {
                response.set_command_tag("FETCH");
            }
            Response::Query(response)
        }
    })
}

/// A refusal as an ErrorResponse: its SQLSTATE, message and hint.
fn refusal_info(r: &Error) -> ErrorInfo {
    error_info(r)
}

/// Runs one statement: in a failed transaction block only COMMIT and ROLLBACK run, and COMMIT
/// rolls back (as in PostgreSQL).
async fn run_statement(
    session: &mut Session,
    shared: &Shared,
    statement: &Statement,
    params: &[Option<String>],
    failed: bool,
) -> Result<Outcome, Error> {
    match (failed, statement) {
        (false, _) | (true, Statement::Rollback) => session.run(shared, statement, params).await,
        (true, Statement::Commit) => session.run(shared, &Statement::Rollback, params).await,
        (true, _) => Err(aborted_transaction()),
    }
}

fn log_statement(analyst: &str, kind: &str, result: &Result<Outcome, Error>, started: Instant) {
    let duration_ms = started.elapsed().as_secs_f64() * 1000.0;
    match result {
        Ok(_) => tracing::info!(analyst, kind, outcome = "ok", duration_ms, "statement"),
        Err(e) => tracing::info!(
            analyst,
            kind,
            outcome = "refused",
            sqlstate = e.sqlstate().code(),
            duration_ms,
            "statement"
        ),
    }
}

/// Whether the transaction is in the failed state, where only COMMIT/ROLLBACK are accepted.
fn in_failed_transaction<C: ClientInfo>(client: &C) -> bool {
    matches!(
        client.transaction_status(),
        pgwire::messages::response::TransactionStatus::Error
    )
}

fn aborted_transaction() -> Error {
    Error::Transaction {
        what: "current transaction is aborted, commands ignored until end of transaction block"
            .into(),
    }
}

#[async_trait]
impl SimpleQueryHandler for QueryHandler {
    async fn do_query<C>(&self, client: &mut C, query: &str) -> PgWireResult<Vec<Response>>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let conn = connection(client);
        let mut slot = conn.session.lock().await;
        let session = ensure_session(&mut slot, client, &self.shared, &self.cancels)
            .map_err(|e| user_error(&e))?;
        let started = Instant::now();
        let statements = match classify::classify(query) {
            Ok(s) => s,
            Err(e) => {
                let info = refusal_info(&e);
                log_statement(&session.analyst.name, "message", &Err(e), started);
                return Ok(vec![Response::Error(Box::new(info))]);
            }
        };
        let mut failed = in_failed_transaction(client);
        let mut responses = Vec::with_capacity(statements.len());
        for statement in statements {
            let started = Instant::now();
            let result = run_statement(session, &self.shared, &statement, &[], failed).await;
            log_statement(&session.analyst.name, statement.kind(), &result, started);
            match result {
                Ok(outcome) => {
                    if let Statement::Deallocate { name } = &statement {
                        forget_statements(client, name.as_deref());
                    }
                    if matches!(outcome, Outcome::TransactionEnd { .. }) {
                        failed = false;
                    }
                    let fetch = matches!(statement, Statement::Fetch { .. });
                    responses.push(respond(client, outcome, &Format::UnifiedText, fetch).await?);
                }
                Err(e) => {
                    responses.push(Response::Error(Box::new(refusal_info(&e))));
                    break;
                }
            }
        }
        Ok(responses)
    }
}

#[async_trait]
impl QueryParser for Parser {
    type Statement = Prepared;

    async fn parse_sql<C>(
        &self,
        client: &C,
        sql: &str,
        types: &[Option<Type>],
    ) -> PgWireResult<Option<Prepared>>
    where
        C: ClientInfo + Unpin + Send + Sync,
    {
        let mut statements = classify::classify(sql).map_err(|e| user_error(&e))?;
        if statements.len() > 1 {
            return Err(user_error(&Error::Syntax {
                message: "cannot insert multiple commands into a prepared statement".into(),
            }));
        }
        let Some(statement) = statements.pop() else {
            return Ok(None);
        };
        let conn = connection(client);
        let mut slot = conn.session.lock().await;
        let session = ensure_session(&mut slot, client, &self.shared, &self.cancels)
            .map_err(|e| user_error(&e))?;
        let columns = session::describe(&self.shared, session, &statement)
            .await
            .map_err(|e| user_error(&e))?;
        // Client-declared types win; otherwise the type analysis inferred from the context.
        let inferred = session::parameter_types(&self.shared, session, &statement);
        let count = inferred
            .iter()
            .map(|(i, _, _)| *i)
            .max()
            .unwrap_or(0)
            .max(types.len());
        let parameter_types = (1..=count)
            .map(|i| {
                types.get(i - 1).cloned().flatten().unwrap_or_else(|| {
                    inferred
                        .iter()
                        .find(|(j, _, _)| *j == i)
                        .map(|(_, t, declared)| parameter_pg_type(*t, declared.as_deref()))
                        .unwrap_or(Type::TEXT)
                })
            })
            .collect();
        Ok(Some(Prepared {
            statement: Some(statement),
            columns,
            parameter_types,
        }))
    }

    fn get_parameter_types(&self, stmt: &Prepared) -> PgWireResult<Vec<Type>> {
        Ok(stmt.parameter_types.clone())
    }

    fn get_result_schema(
        &self,
        stmt: &Prepared,
        format: Option<&Format>,
    ) -> PgWireResult<Vec<FieldInfo>> {
        let format = format.cloned().unwrap_or_default();
        Ok(stmt
            .columns
            .as_deref()
            .map(|c| fields(c, &format))
            .unwrap_or_default())
    }
}

/// Bound parameters as text, decoding binary formats of the common scalar types.
fn parameters_as_text(portal: &Portal<Prepared>) -> Result<Vec<Option<String>>, Error> {
    let types = &portal.statement.statement.parameter_types;
    portal
        .parameters
        .iter()
        .enumerate()
        .map(|(i, raw)| {
            let Some(bytes) = raw else { return Ok(None) };
            if portal.parameter_format.is_text(i) {
                return String::from_utf8(bytes.to_vec())
                    .map(Some)
                    .map_err(|_| Error::Protocol {
                        what: "parameter is not valid UTF-8".into(),
                    });
            }
            let ty = types.get(i).cloned().unwrap_or(Type::TEXT);
            let b = bytes.as_ref();
            let text = match ty {
                t if t == Type::INT2 && b.len() == 2 => {
                    i16::from_be_bytes([b[0], b[1]]).to_string()
                }
                t if t == Type::INT4 && b.len() == 4 => {
                    i32::from_be_bytes([b[0], b[1], b[2], b[3]]).to_string()
                }
                t if t == Type::INT8 && b.len() == 8 => {
                    i64::from_be_bytes(b.try_into().map_err(|_| Error::Protocol {
                        what: "bad int8".into(),
                    })?)
                    .to_string()
                }
                t if t == Type::FLOAT8 && b.len() == 8 => {
                    f64::from_be_bytes(b.try_into().map_err(|_| Error::Protocol {
                        what: "bad float8".into(),
                    })?)
                    .to_string()
                }
                t if t == Type::FLOAT4 && b.len() == 4 => {
                    f32::from_be_bytes([b[0], b[1], b[2], b[3]]).to_string()
                }
                t if t == Type::DATE && b.len() == 4 => {
                    crate::datetime::Date::from_days_since_2000(i32::from_be_bytes([
                        b[0], b[1], b[2], b[3],
                    ]))
                    .to_string()
                }
                t if t == Type::BOOL && b.len() == 1 => {
                    if b[0] != 0 { "true" } else { "false" }.to_string()
                }
                t if t == Type::TEXT
                    || t == Type::VARCHAR
                    || t == Type::UNKNOWN
                    || t == Type::NAME =>
                {
                    String::from_utf8(b.to_vec()).map_err(|_| Error::Protocol {
                        what: "parameter is not valid UTF-8".into(),
                    })?
                }
                other => {
                    return Err(Error::unsupported(
                        format!("binary parameters of type {}", other.name()),
                        "Send this parameter in text format.",
                    ))
                }
            };
            Ok(Some(text))
        })
        .collect()
}

/// The row limit pgdp applies to one Execute asking for `requested` rows (0: all).
fn rows_per_execute(requested: i32) -> i32 {
    let cap = i32::try_from(crate::limits::ROWS_PER_EXECUTE_MAX).unwrap_or(i32::MAX);
    if requested <= 0 {
        0
    } else {
        requested.min(cap)
    }
}

#[async_trait]
impl ExtendedQueryHandler for QueryHandler {
    type Statement = Prepared;
    type QueryParser = Parser;

    fn query_parser(&self) -> Arc<Parser> {
        self.parser.clone()
    }

    /// Execute with the client's row limit made safe before pgwire sees it: pgwire casts the
    /// `i32` to `usize` and preallocates that many rows, so a negative limit panicked and a huge
    /// one aborted the whole process on a failed allocation (found by the wire fuzzer). As in
    /// PostgreSQL, a limit of zero or less means all rows; a positive one is capped at
    /// [`crate::limits::ROWS_PER_EXECUTE_MAX`] (the portal is then suspended, and the client fetches on).
    async fn on_execute<C>(&self, client: &mut C, mut message: Execute) -> PgWireResult<()>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Prepared>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        message.max_rows = rows_per_execute(message.max_rows);
        self._on_execute(client, message).await
    }

    /// pgwire's Parse, with the number of named prepared statements bounded (54000).
    async fn on_parse<C>(&self, client: &mut C, message: Parse) -> PgWireResult<()>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Prepared>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let named = message
            .name
            .clone()
            .filter(|n| !n.is_empty() && n != DEFAULT_NAME);
        if let Some(name) = &named {
            let conn = connection(client);
            let names = conn.prepared_names();
            if !names.contains(name) && names.len() >= self.prepared_statements_max {
                return Err(user_error(&Error::LimitExceeded {
                    what: "the number of prepared statements of this connection".into(),
                    limit: self.prepared_statements_max as u64,
                }));
            }
        }
        let name = named.clone().unwrap_or_else(|| DEFAULT_NAME.to_owned());
        match StoredStatement::parse(client, &message, self.query_parser()).await? {
            Some(statement) => client.portal_store().put_statement(Arc::new(statement)),
            None => client.portal_store().put_empty_statement(&name),
        }
        if let Some(name) = named {
            connection(client).prepared_names().insert(name);
        }
        client
            .send(PgWireBackendMessage::ParseComplete(ParseComplete::new()))
            .await?;
        Ok(())
    }

    /// pgwire's Close, keeping the count of prepared statements.
    async fn on_close<C>(&self, client: &mut C, message: Close) -> PgWireResult<()>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Prepared>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let name = message.name.as_deref().unwrap_or(DEFAULT_NAME);
        match message.target_type {
            TARGET_TYPE_BYTE_STATEMENT => forget_statements(client, Some(name)),
            TARGET_TYPE_BYTE_PORTAL => client.portal_store().rm_portal(name),
            _ => {}
        }
        client
            .send(PgWireBackendMessage::CloseComplete(CloseComplete::new()))
            .await?;
        Ok(())
    }

    async fn do_query<C>(
        &self,
        client: &mut C,
        portal: &Portal<Prepared>,
        _max_rows: usize,
    ) -> PgWireResult<Response>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Prepared>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let Some(statement) = portal.statement.statement.statement.clone() else {
            return Ok(Response::EmptyQuery);
        };
        let conn = connection(client);
        let mut slot = conn.session.lock().await;
        let session = ensure_session(&mut slot, client, &self.shared, &self.cancels)
            .map_err(|e| user_error(&e))?;
        let started = Instant::now();
        let failed = in_failed_transaction(client);
        let result = if failed && !matches!(statement, Statement::Commit | Statement::Rollback) {
            Err(aborted_transaction())
        } else {
            // Rows must match what Describe announced at Parse (a SET in between, e.g. of
            // pgdp.accuracy, can change them), as PostgreSQL insists for cached plans; checked
            // before running, so the refusal costs nothing.
            let described = &portal.statement.statement.columns;
            let shape = match (&statement, described) {
                (Statement::Query(_), Some(before)) => {
                    match session::describe(&self.shared, session, &statement).await {
                        Ok(Some(now)) if now != *before => Err(Error::unsupported(
                            "a prepared statement whose result columns changed since it was prepared",
                            "Prepare the statement again after changing pgdp.accuracy.",
                        )),
                        Ok(_) => Ok(()),
                        Err(e) => Err(e),
                    }
                }
                _ => Ok(()),
            };
            match (shape, parameters_as_text(portal)) {
                (Err(e), _) | (Ok(()), Err(e)) => Err(e),
                (Ok(()), Ok(params)) => {
                    run_statement(session, &self.shared, &statement, &params, failed).await
                }
            }
        };
        log_statement(&session.analyst.name, statement.kind(), &result, started);
        drop(slot);
        match result {
            Ok(outcome) => {
                if let Statement::Deallocate { name } = &statement {
                    forget_statements(client, name.as_deref());
                }
                let fetch = matches!(statement, Statement::Fetch { .. });
                respond(client, outcome, &portal.result_column_format, fetch).await
            }
            Err(e) => Err(PgWireError::UserError(Box::new(refusal_info(&e)))),
        }
    }
}

#[cfg(test)]
mod tests {
    /// A framed message: type byte, length, body.
    fn message(tag: u8, body: &[u8]) -> Vec<u8> {
        let mut out = vec![tag];
        out.extend_from_slice(&(body.len() as u32 + 4).to_be_bytes());
        out.extend_from_slice(body);
        out
    }

    fn startup() -> Vec<u8> {
        let body = b"\x00\x03\x00\x00user\x00analyst\x00\x00";
        let mut out = (body.len() as u32 + 4).to_be_bytes().to_vec();
        out.extend_from_slice(body);
        out
    }

    /// Feeds `stream` to a [`super::Framing`] in pieces of `piece` bytes; returns the bytes it
    /// passes on and the violation it found.
    fn frame(stream: &[u8], piece: usize) -> (Vec<u8>, Option<String>) {
        let mut framing = super::Framing::new((), bytes::BytesMut::new(), 1 << 20);
        for chunk in stream.chunks(piece) {
            framing.scan(chunk);
        }
        (
            framing.checked.to_vec(),
            framing.violation().map(str::to_owned),
        )
    }

    #[test]
    fn well_formed_messages_pass_unchanged_in_any_pieces() {
        let mut stream = startup();
        stream.extend(message(b'p', b"SCRAM-SHA-256\x00\x00\x00\x00\x03abc"));
        stream.extend(message(b'p', b"c=biws,r=x,p=y"));
        stream.extend(message(b'Q', b"SELECT 1\x00"));
        stream.extend(message(
            b'P',
            b"s1\x00SELECT $1\x00\x00\x01\x00\x00\x00\x17",
        ));
        stream.extend(message(
            b'B',
            b"\x00s1\x00\x00\x01\x00\x00\x00\x02\x00\x00\x00\x0242\xff\xff\xff\xff\x00\x01\x00\x01",
        ));
        stream.extend(message(b'D', b"P\x00"));
        stream.extend(message(b'E', b"\x00\x00\x00\x00\x00"));
        stream.extend(message(b'C', b"S\x00"));
        stream.extend(message(b'H', b""));
        stream.extend(message(b'S', b""));
        stream.extend(message(b'd', b"\x00\x01anything"));
        stream.extend(message(b'f', b"oops\x00"));
        stream.extend(message(b'X', b""));
        for piece in [1, 3, 7, stream.len()] {
            assert_eq!(
                frame(&stream, piece),
                (stream.clone(), None),
                "pieces of {piece}"
            );
        }
    }

    #[test]
    fn malformed_messages_stop_the_stream_where_they_start() {
        let login = [
            startup(),
            message(b'p', b"SCRAM-SHA-256\x00\xff\xff\xff\xff"),
        ]
        .concat();
        let cases: Vec<(Vec<u8>, &str)> = vec![
            // The two pgwire 0.42 bugs the wire fuzzer found.
            (message(b'p', b"junk"), "malformed SASL message"),
            (
                message(b'P', b"\x00SELECT 1\x00\x00\x00B\x08\x00\x00\x00\x00\x00"),
                "invalid message format",
            ),
            // Trailing bytes and short fields in the other extended-query messages.
            (
                message(b'B', b"\x00\x00\x00\x00\x00\x00\x00\x00Q"),
                "invalid message format",
            ),
            (
                message(b'B', b"\x00\x00\x00\x00\x00\x01\x00\x00\x00\x09ab"),
                "invalid message format",
            ),
            (
                message(b'B', b"\x00\x00\x00\x00\x00\x01\xff\xff\xff\xfe\x00\x00"),
                "invalid message format",
            ),
            (message(b'E', b"\x00\x00\x00"), "invalid message format"),
            (
                message(b'E', b"\x00\x00\x00\x00\x00\x00"),
                "invalid message format",
            ),
            (message(b'D', b"P\x00X"), "invalid message format"),
            (message(b'D', b"Z\x00"), "invalid DESCRIBE message subtype"),
            (message(b'C', b""), "invalid message format"),
            (message(b'C', b"S"), "invalid message format"),
            (
                message(b'Q', b"SELECT 1\x00SELECT 2\x00"),
                "invalid message format",
            ),
            (message(b'Q', b"SELECT 1"), "invalid message format"),
            (message(b'S', b"\x00"), "invalid message format"),
            (message(b'F', b""), "invalid frontend message type 70"),
            (b"Q\x00\x00\x00\x02".to_vec(), "invalid message length"),
        ];
        for (bad, expected) in cases {
            // The SASL case is judged as the first `p` after startup; the others after a login.
            let before = if bad[0] == b'p' {
                startup()
            } else {
                login.clone()
            };
            let after = message(b'Q', b"SELECT 2\x00");
            let stream = [before.clone(), bad.clone(), after].concat();
            for piece in [1, 5, stream.len()] {
                assert_eq!(
                    frame(&stream, piece),
                    (before.clone(), Some(expected.to_owned())),
                    "{bad:?} in pieces of {piece}"
                );
            }
        }
    }

    #[test]
    fn startup_packets_must_end_with_their_terminator() {
        for body in [
            &b"\x00\x03\x00\x00user\x00analyst\x00"[..],
            b"\x00\x03\x00\x00user\x00analyst",
            b"\x00\x03\x00\x00\x00user\x00analyst\x00\x00",
            b"\x00\x03\x00\x00user\x00analyst\x00\x00\x00",
        ] {
            assert_eq!(
                super::check_startup_packet(body),
                Err("invalid startup packet layout: expected terminator as last byte".to_owned()),
                "{body:?}"
            );
        }
        assert_eq!(super::check_startup_packet(b"\x00\x03\x00\x00\x00"), Ok(()));
        // A CancelRequest and other codes are pgwire's to judge.
        assert_eq!(
            super::check_startup_packet(b"\x04\xd2\x16\x2e\x00\x00\x00\x01"),
            Ok(())
        );
    }

    #[test]
    fn execute_row_limits_are_made_safe_for_pgwire() {
        use super::rows_per_execute;
        assert_eq!(rows_per_execute(0), 0, "zero: all rows");
        assert_eq!(
            rows_per_execute(-1),
            0,
            "negative: all rows, as in PostgreSQL"
        );
        assert_eq!(rows_per_execute(i32::MIN), 0);
        assert_eq!(rows_per_execute(3), 3);
        let cap = i32::try_from(crate::limits::ROWS_PER_EXECUTE_MAX).expect("fits");
        assert_eq!(rows_per_execute(i32::MAX), cap, "no huge preallocation");
    }
}
