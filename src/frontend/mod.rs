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
//!   unknown names get a decoy verifier, so the SCRAM exchange runs the same way. The message
//!   is PostgreSQL's, naming the user of the startup packet. Every failure is logged (never the
//!   password) and counted per client address and user name and per address (`throttle.rs`); a
//!   user past its limit at an address, or an address past its own, is refused (53300) before
//!   the password is checked.
//! - A CancelRequest reaches only the connection whose BackendKeyData (process id and secret
//!   key, sent by pgwire at startup) it carries, and stops only that connection's running
//!   upstream statement ([`Cancels`]); a wrong key does nothing. A client that goes away
//!   mid-statement has its upstream statement cancelled too ([`watch_client`]). Either way the
//!   charge stands.

mod admission;
mod auth;
mod binary;
mod cancel;
mod encode;
mod extended;
mod framing;
#[cfg(test)]
mod tests;
mod throttle;

use admission::*;
use auth::*;
pub use cancel::Cancels;
use cancel::*;
use encode::*;
use framing::*;
use throttle::{Lockout, Throttle};

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
use pgwire::api::query::{send_describe_response, ExtendedQueryHandler, SimpleQueryHandler};
use pgwire::api::results::{
    DataRowEncoder, DescribePortalResponse, FieldFormat, FieldInfo, QueryResponse, Response, Tag,
};
use pgwire::api::stmt::{QueryParser, StoredStatement};
use pgwire::api::store::PortalStore;
use pgwire::api::{
    ClientInfo, ClientPortalStore, ErrorHandler, PgWireConnectionState, PgWireServerHandlers, Type,
    DEFAULT_NAME,
};
use pgwire::error::{ErrorInfo, PgWireError, PgWireResult};
use pgwire::messages::cancel::CancelRequest;
use pgwire::messages::extendedquery::{
    Close, CloseComplete, Describe, Execute, Parse, ParseComplete, TARGET_TYPE_BYTE_PORTAL,
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
use crate::session::{self, Live, Outcome, Session, Shared};

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
    /// Refuse clear-text clients with FATAL 28000 before authentication (`--require-tls`).
    pub require_tls: bool,
    /// Connection limits.
    pub limits: ConnectionLimits,
}

/// Accepts connections forever, one task per connection, without TLS and with the default limits.
pub async fn serve(listener: TcpListener, live: Arc<Live>) -> std::io::Result<()> {
    serve_with(listener, live, Front::default()).await
}

/// Accepts connections forever, one task per connection.
///
/// A connection past `connections_max` still gets a task, so that it can be told why it is
/// refused (53300, after TLS negotiation and its startup message, as PostgreSQL does); at most
/// [`limits::CONNECTIONS_REFUSING_MAX`] such refusals run at once, beyond which sockets are
/// closed without a word.
pub async fn serve_with(
    listener: TcpListener,
    live: Arc<Live>,
    front: Front,
) -> std::io::Result<()> {
    let metrics = live.current().metrics.clone();
    let handlers = Arc::new(Handlers::with_front(live, &front));
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
        let open = metrics.connection_accepted();
        tokio::spawn(async move {
            let _permit = permit;
            let _open = open;
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
    let live = handlers.query.live.clone();
    let mut reloads = live.subscribe();
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
            tokio::select! {
                message = socket.next() => message,
                Ok(()) = reloads.changed() => {
                    // Between statements: a reload that removed the analyst ends the session
                    // now, as pg_terminate_backend does, rather than at its next statement.
                    let user = socket.metadata().get("user").cloned().unwrap_or_default();
                    if !live.current().policy.analysts.contains_key(&user) {
                        tracing::info!(%peer, user, "analyst removed by a policy reload: session ended");
                        let _ = socket.send(fatal(&Error::AdminShutdown)).await;
                        let _ = socket.close().await;
                        return;
                    }
                    continue;
                }
            }
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

/// An `Error` as a FATAL pgwire error, for handlers whose error pgwire sends and then closes.
fn fatal_user_error(e: &Error) -> PgWireError {
    let mut info = error_info(e);
    info.severity = "FATAL".to_owned();
    PgWireError::UserError(Box::new(info))
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

/// Startup and SCRAM-SHA-256 authentication, with the per-analyst connection limit checked once
/// the password is verified and before `AuthenticationOk` is sent.
struct Startup {
    driver: AuthDriver<Arc<Parameters>>,
    /// SCRAM-SHA-256, for plain connections.
    plain: SaslMechanisms,
    /// SCRAM-SHA-256 and, with a certificate, SCRAM-SHA-256-PLUS, for TLS connections.
    secure: SaslMechanisms,
    admission: Arc<Admission>,
    /// Failed logins per client address.
    throttle: Throttle,
    /// The policy, to tell an unknown user from a wrong password in the log.
    live: Arc<Live>,
    /// Refuse clients that did not negotiate TLS.
    require_tls: bool,
    /// Counts failed logins.
    metrics: Arc<crate::metrics::Metrics>,
}

impl Startup {
    /// Logs a failed login (never the password or the SCRAM proof) and counts it against the
    /// client's address. The reason stays in the log: a client whose password does not verify
    /// learns only [`Error::Authentication`], whether the analyst exists or not.
    fn login_failed<C: ClientInfo>(&self, client: &C, error: &PgWireError) {
        let user = client.metadata().get("user").cloned().unwrap_or_default();
        let reason = match error {
            PgWireError::InvalidPassword(_)
                if self.live.current().policy.analysts.contains_key(&user) =>
            {
                "wrong password"
            }
            PgWireError::InvalidPassword(_) => "unknown user",
            PgWireError::InvalidScramMessage(_) => "malformed SCRAM message",
            PgWireError::UserError(info) => info.message.as_str(),
            _ => "authentication protocol error",
        };
        let peer = client.socket_addr();
        let counted = self.throttle.record_failure(
            peer.ip(),
            &user,
            Instant::now(),
            &self.live.current().policy.login_throttle,
        );
        self.metrics.login_failed();
        tracing::warn!(
            user,
            %peer,
            reason,
            failures = counted.user,
            address_failures = counted.address,
            "authentication failed"
        );
        match counted.locked {
            Some(Lockout::User) => tracing::warn!(
                user,
                %peer,
                "login lockout: too many failed logins of this user from this address; its logins from there are refused until the window ends, other users are served"
            ),
            Some(Lockout::Address) => tracing::warn!(
                %peer,
                "login lockout: too many failed logins from this address (many user names); every login from it is refused until the window ends"
            ),
            None => {}
        }
    }
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
                let peer = client.socket_addr();
                if self.require_tls && !client.is_secure() {
                    // PostgreSQL's answer from a `hostssl`-only pg_hba.conf, before any
                    // authentication.
                    let user = client.metadata().get("user").cloned().unwrap_or_default();
                    let database = client
                        .metadata()
                        .get("database")
                        .cloned()
                        .unwrap_or_else(|| user.clone());
                    tracing::warn!(user, %peer, "clear-text connection refused: TLS is required");
                    return Err(fatal_user_error(&Error::EncryptionRequired {
                        host: peer.ip().to_string(),
                        user,
                        database,
                    }));
                }
                let user = client.metadata().get("user").cloned().unwrap_or_default();
                let throttle = self.live.current().policy.login_throttle;
                if let Some(lockout) =
                    self.throttle
                        .refuses(peer.ip(), &user, Instant::now(), &throttle)
                {
                    let scope = match lockout {
                        Lockout::User => "for this user from this address",
                        Lockout::Address => "from this address",
                    };
                    tracing::warn!(user, %peer, "login refused: too many failed logins {scope}");
                    return Err(fatal_user_error(&Error::AuthenticationThrottled { scope }));
                }
                let mechanism = if client.is_secure() {
                    self.secure.create()
                } else {
                    self.plain.create()
                };
                match self.driver.begin_authentication(client, mechanism).await {
                    Ok(outcome) => outcome,
                    Err(e) => {
                        self.login_failed(client, &e);
                        return Err(e);
                    }
                }
            }
            PgWireFrontendMessage::PasswordMessageFamily(message) => {
                match self.driver.advance_authentication(client, message).await {
                    Ok(outcome) => outcome,
                    Err(e) => {
                        self.login_failed(client, &e);
                        return Err(match e {
                            // pgwire names the user of the SCRAM message, which libpq leaves
                            // empty; PostgreSQL names the user of the startup packet.
                            PgWireError::InvalidPassword(_) => {
                                let user =
                                    client.metadata().get("user").cloned().unwrap_or_default();
                                fatal_user_error(&Error::Authentication { user })
                            }
                            other => other,
                        });
                    }
                }
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
                    return Err(fatal_user_error(&refusal));
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
    pub fn new(live: Arc<Live>) -> Handlers {
        Handlers::with_front(live, &Front::default())
    }

    /// Handlers for a server with the given TLS and limits.
    pub fn with_front(live: Arc<Live>, front: &Front) -> Handlers {
        let credentials: Arc<dyn AuthSource> = Arc::new(LiveCredentials::new(live.clone()));
        let scram = ScramAuth::new(credentials);
        let mut secure_scram = scram.clone();
        if let Some(tls) = &front.tls {
            if let Err(e) = secure_scram.configure_certificate(&tls.certificate_pem) {
                tracing::warn!(error = %e, "no SCRAM channel binding with this certificate");
            }
        }
        let startup = Startup {
            driver: AuthDriver::new(Arc::new(Parameters { live: live.clone() })),
            plain: SaslMechanisms::new(vec![Arc::new(scram)]),
            secure: SaslMechanisms::new(vec![Arc::new(secure_scram)]),
            admission: Arc::new(Admission::new(front.limits.connections_per_analyst_max)),
            throttle: Throttle::new(limits::AUTH_FAILURE_PEERS_MAX),
            live: live.clone(),
            require_tls: front.require_tls,
            metrics: live.current().metrics.clone(),
        };
        let cancels = Arc::new(Cancels::default());
        Handlers {
            query: Arc::new(QueryHandler {
                live: live.clone(),
                parser: Arc::new(Parser {
                    live: live.clone(),
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

// ---------------------------------------------------------------------------------------------
// Authentication
// ---------------------------------------------------------------------------------------------

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
    live: Arc<Live>,
    parser: Arc<Parser>,
    cancels: Arc<Cancels>,
    prepared_statements_max: usize,
}

/// Parses and classifies statements of the extended protocol.
pub struct Parser {
    live: Arc<Live>,
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
    let session = slot
        .as_mut()
        .ok_or_else(|| Error::internal("session missing after creation"))?;
    session.follow_policy(shared)?;
    Ok(session)
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
                let info =
                    ErrorInfo::new("NOTICE".to_owned(), "00000".to_owned(), n.into_message());
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
    let result = match (failed, statement) {
        (false, _) | (true, Statement::Rollback) => session.run(shared, statement, params).await,
        (true, Statement::Commit) => session.run(shared, &Statement::Rollback, params).await,
        (true, _) => Err(aborted_transaction()),
    };
    session.observe(shared, statement, &result);
    result
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
        // One policy for the whole message, whatever reload happens meanwhile.
        let shared = self.live.current();
        let session = ensure_session(&mut slot, client, &shared, &self.cancels)
            .map_err(|e| user_error(&e))?;
        let started = Instant::now();
        let classified = classify::classify(query);
        let metrics = &shared.metrics;
        metrics.stage(crate::metrics::Stage::Parse, started.elapsed());
        let statements = match classified {
            Ok(s) => s,
            Err(e) => {
                metrics.failed(&e);
                let info = refusal_info(&e);
                log_statement(&session.analyst.name, "message", &Err(e), started);
                return Ok(vec![Response::Error(Box::new(info))]);
            }
        };
        // All or nothing for refusals: a message one of whose statements would be refused runs
        // none of them (session::message).
        if let Err(e) = session.check_message(&shared, &statements).await {
            metrics.failed(&e);
            let info = refusal_info(&e);
            log_statement(&session.analyst.name, "message", &Err(e), started);
            return Ok(vec![Response::Error(Box::new(info))]);
        }
        let mut failed = in_failed_transaction(client);
        let mut responses = Vec::with_capacity(statements.len());
        for statement in statements {
            let started = Instant::now();
            let result = run_statement(session, &shared, &statement, &[], failed).await;
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
