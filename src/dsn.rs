//! The connection strings of the PostgreSQL servers pgdp connects to (the upstream, its shadow
//! catalog and the ledger), with libpq's `sslmode=verify-full` and `sslrootcert=FILE`, which
//! tokio-postgres does not know: [`Dsn::parse`] takes them out of the string and turns them into
//! a rustls connector (ring provider, the rustls pgwire already brings) that checks the server's
//! chain against that CA file and its certificate against the DSN's host name.
//!
//! Invariants:
//! - A DSN asking for TLS gets verified TLS or no connection: `verify-full` sets tokio-postgres's
//!   `sslmode=require`, so a server that refuses TLS is an error, never a clear-text fallback.
//!   `require` and `verify-ca` (encryption without the full check) are refused at parse time.
//! - Nothing here prints a password: errors name the host and the CA file only.

use std::fmt;
use std::future::Future;
use std::io;
use std::path::Path;
use std::pin::Pin;
use std::str::FromStr;
use std::sync::Arc;
use std::task::{Context, Poll};

use pgwire::tokio::tokio_rustls::{self, rustls};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::config::{Host, SslMode};
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect};
use tokio_postgres::{Client, Config, NoTls};

/// Why a DSN cannot be used. Seen by the operator at start-up, never by a client.
#[derive(Debug, thiserror::Error)]
pub enum DsnError {
    /// tokio-postgres cannot parse the rest of the string (its message names no password).
    #[error("invalid connection string: {0}")]
    Invalid(String),
    /// An `sslmode` pgdp does not offer.
    #[error(
        "sslmode={0} is not supported: use sslmode=verify-full with sslrootcert=FILE (or disable)"
    )]
    UnsupportedSslMode(String),
    /// `verify-full` without a CA file, or a CA file without `verify-full`.
    #[error("sslmode=verify-full and sslrootcert=FILE go together")]
    RootCertMismatch,
    /// The CA file cannot be read or holds no certificate.
    #[error("sslrootcert {path}: {reason}")]
    RootCert { path: String, reason: String },
}

/// A parsed DSN: tokio-postgres's [`Config`] and, with `sslmode=verify-full`, the verifying
/// TLS connector.
#[derive(Clone)]
pub struct Dsn {
    config: Config,
    tls: Option<VerifiedTls>,
}

impl fmt::Debug for Dsn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Config's own Debug redacts the password.
        f.debug_struct("Dsn")
            .field("config", &self.config)
            .field("verify_full", &self.tls.is_some())
            .finish()
    }
}

impl Dsn {
    /// Parses a libpq key=value string or a `postgres://` URL, reading the CA file now.
    pub fn parse(text: &str) -> Result<Dsn, DsnError> {
        let (rest, tls_keys) = take_tls_keys(text);
        let mut config = Config::from_str(&rest).map_err(|e| DsnError::Invalid(e.to_string()))?;
        let tls = match (tls_keys.sslmode.as_deref(), tls_keys.sslrootcert) {
            (None | Some("disable" | "prefer" | "allow"), None) => {
                // Without a TLS connector tokio-postgres's `prefer` is clear text; say so.
                config.ssl_mode(SslMode::Disable);
                None
            }
            (Some("verify-full"), Some(path)) => {
                config.ssl_mode(SslMode::Require);
                Some(VerifiedTls::from_ca_file(Path::new(&path))?)
            }
            (Some("verify-full"), None)
            | (None | Some("disable" | "prefer" | "allow"), Some(_)) => {
                return Err(DsnError::RootCertMismatch)
            }
            (Some(other), _) => return Err(DsnError::UnsupportedSslMode(other.to_string())),
        };
        Ok(Dsn { config, tls })
    }

    /// tokio-postgres's configuration (without the TLS keys).
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The configuration, to change the database, timeouts or application name.
    pub fn config_mut(&mut self) -> &mut Config {
        &mut self.config
    }

    /// Whether connections use verified TLS.
    pub fn verifies_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// The hosts of the DSN, for messages (never the password).
    pub fn hosts(&self) -> String {
        let hosts: Vec<String> = self
            .config
            .get_hosts()
            .iter()
            .map(|h| match h {
                Host::Tcp(name) => name.clone(),
                Host::Unix(path) => path.display().to_string(),
            })
            .collect();
        if hosts.is_empty() {
            "localhost".into()
        } else {
            hosts.join(",")
        }
    }

    /// The servers of the DSN as `host:port` (a Unix socket directory with its port), for logs
    /// (never the password): libpq's reading, one port for every host when one is given, 5432
    /// when none.
    pub fn endpoints(&self) -> String {
        let ports = self.config.get_ports();
        let port = |i: usize| {
            ports
                .get(i)
                .or(ports.first().filter(|_| ports.len() == 1))
                .copied()
                .unwrap_or(5432)
        };
        let hosts = self.config.get_hosts();
        if hosts.is_empty() {
            return format!("localhost:{}", port(0));
        }
        hosts
            .iter()
            .enumerate()
            .map(|(i, h)| match h {
                Host::Tcp(name) => format!("{name}:{}", port(i)),
                Host::Unix(path) => format!("{}:{}", path.display(), port(i)),
            })
            .collect::<Vec<String>>()
            .join(",")
    }

    /// Opens one connection, whose connection task runs in the background until the client is
    /// dropped or the server goes away (`what` names it in the debug log then).
    pub async fn connect(&self, what: &'static str) -> Result<Client, tokio_postgres::Error> {
        let (client, _driver) = self.connect_listening(what, None).await?;
        Ok(client)
    }

    /// [`Dsn::connect`] for a connection that LISTENs: each NOTIFY it receives is passed to
    /// `on_notification` (on the connection's task: it must not block), and the returned
    /// handle completes when the connection ends (the client dropped, or the server gone).
    pub async fn connect_listening(
        &self,
        what: &'static str,
        on_notification: Option<OnNotification>,
    ) -> Result<(Client, tokio::task::JoinHandle<()>), tokio_postgres::Error> {
        match &self.tls {
            None => {
                let (client, connection) = self.config.connect(NoTls).await?;
                Ok((
                    client,
                    tokio::spawn(drive(connection, what, on_notification)),
                ))
            }
            Some(tls) => {
                let (client, connection) = self.config.connect(tls.clone()).await?;
                Ok((
                    client,
                    tokio::spawn(drive(connection, what, on_notification)),
                ))
            }
        }
    }
}

/// What a listening connection does with each notification it receives.
pub type OnNotification = Box<dyn FnMut(tokio_postgres::Notification) + Send>;

/// Runs a connection until it ends, dropping the upstream's asynchronous messages unread.
/// Awaited as a future, tokio-postgres logs each NOTICE and WARNING (with its text) at info
/// through the `log` bridge, and a notice may carry data values (a view's or a function's
/// `RAISE NOTICE`, a constraint's message): pgdp's log must hold nothing from the upstream's
/// messages (docs/security.md), so only how many were dropped is logged, at debug.
/// Notifications go to `on_notification` when there is one (pgdp's own NOTIFYs: the ledger's
/// replay index).
async fn drive<S, T>(
    mut connection: tokio_postgres::Connection<S, T>,
    what: &'static str,
    mut on_notification: Option<OnNotification>,
) where
    S: AsyncRead + AsyncWrite + Unpin,
    T: AsyncRead + AsyncWrite + Unpin,
{
    let mut dropped: u64 = 0;
    let ended = std::future::poll_fn(|cx| loop {
        match connection.poll_message(cx) {
            Poll::Ready(Some(Ok(tokio_postgres::AsyncMessage::Notification(notification)))) => {
                match on_notification.as_mut() {
                    Some(deliver) => deliver(notification),
                    None => dropped += 1,
                }
            }
            Poll::Ready(Some(Ok(_message))) => dropped += 1,
            Poll::Ready(Some(Err(e))) => return Poll::Ready(Err(e)),
            Poll::Ready(None) => return Poll::Ready(Ok(())),
            Poll::Pending => return Poll::Pending,
        }
    })
    .await;
    if let Err(e) = ended {
        tracing::debug!(error = %e, what, dropped, "connection ended");
    }
}

/// The cancel key of a connection, with the TLS its server needs for a CancelRequest.
pub struct Canceller {
    token: tokio_postgres::CancelToken,
    tls: Option<VerifiedTls>,
}

impl Canceller {
    /// Sends the CancelRequest (over verified TLS when the DSN asks for it).
    pub async fn cancel(self) -> Result<(), tokio_postgres::Error> {
        match self.tls {
            None => self.token.cancel_query(NoTls).await,
            Some(tls) => self.token.cancel_query(tls).await,
        }
    }
}

impl Dsn {
    /// The cancel key of `client`, a connection opened with [`Dsn::connect`].
    pub fn canceller(&self, client: &Client) -> Canceller {
        Canceller {
            token: client.cancel_token(),
            tls: self.tls.clone(),
        }
    }
}

/// If `error` means verified TLS cannot work with this server as configured (its certificate
/// was rejected: wrong CA, wrong host name, expired…; the host is no valid TLS name; the server
/// does not offer TLS), why. An unreachable server is not such an error: that is retried.
pub fn tls_failure(error: &tokio_postgres::Error) -> Option<String> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = source {
        match e.downcast_ref::<TlsError>() {
            Some(TlsError::Handshake(_)) | None => {}
            Some(failure) => return Some(failure.to_string()),
        }
        // tokio-postgres's own refusal, when the server answers the SSLRequest with `N`.
        if e.source().is_none() && e.to_string() == "server does not support TLS" {
            return Some("the server does not support TLS (ssl = off?)".into());
        }
        source = e.source();
    }
    None
}

/// The two TLS keys taken out of a DSN.
#[derive(Debug, Default, PartialEq)]
struct TlsKeys {
    sslmode: Option<String>,
    sslrootcert: Option<String>,
}

/// Splits `sslmode` and `sslrootcert` off a DSN (key=value or URL form); the last occurrence
/// wins, as in libpq.
fn take_tls_keys(text: &str) -> (String, TlsKeys) {
    let trimmed = text.trim();
    let mut keys = TlsKeys::default();
    let mut keep = |key: &str, value: String| -> bool {
        match key {
            "sslmode" => keys.sslmode = Some(value),
            "sslrootcert" => keys.sslrootcert = Some(value),
            _ => return true,
        }
        false
    };
    if trimmed.starts_with("postgres://") || trimmed.starts_with("postgresql://") {
        let Some((base, query)) = trimmed.split_once('?') else {
            return (trimmed.to_string(), keys);
        };
        let kept: Vec<&str> = query
            .split('&')
            .filter(|pair| {
                let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
                keep(&percent_decode(k), percent_decode(v))
            })
            .collect();
        let rest = if kept.is_empty() {
            base.to_string()
        } else {
            format!("{base}?{}", kept.join("&"))
        };
        return (rest, keys);
    }
    let mut kept = Vec::new();
    for (key, value) in key_values(trimmed) {
        if keep(&key, value.clone()) {
            kept.push(format!("{key}={}", quote(&value)));
        }
    }
    (kept.join(" "), keys)
}

/// The pairs of a libpq key=value string: values unquoted (`'…'` with `\'` and `\\`), as
/// tokio-postgres reads them. Malformed text is passed on for tokio-postgres to refuse.
fn key_values(text: &str) -> Vec<(String, String)> {
    let mut pairs = Vec::new();
    let mut chars = text.chars().peekable();
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.peek().is_none() {
            return pairs;
        }
        let mut key = String::new();
        while let Some(c) = chars.next_if(|c| *c != '=' && !c.is_whitespace()) {
            key.push(c);
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.next_if_eq(&'=').is_none() {
            // No `=`: keep the word so tokio-postgres reports it.
            pairs.push((key, String::new()));
            continue;
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let mut value = String::new();
        if chars.next_if_eq(&'\'').is_some() {
            while let Some(c) = chars.next() {
                match c {
                    '\'' => break,
                    '\\' => value.extend(chars.next()),
                    c => value.push(c),
                }
            }
        } else {
            while let Some(c) = chars.next_if(|c| !c.is_whitespace()) {
                if c == '\\' {
                    value.extend(chars.next());
                } else {
                    value.push(c);
                }
            }
        }
        pairs.push((key, value));
    }
}

/// A value for a key=value string, quoted when it needs to be.
fn quote(value: &str) -> String {
    let plain = !value.is_empty()
        && !value
            .chars()
            .any(|c| c.is_whitespace() || c == '\'' || c == '\\' || c == '=');
    if plain {
        value.to_string()
    } else {
        format!("'{}'", value.replace('\\', "\\\\").replace('\'', "\\'"))
    }
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| char::from(b).to_digit(16);
        match (bytes[i], bytes.get(i + 1), bytes.get(i + 2)) {
            (b'%', Some(&h), Some(&l)) if hex(h).is_some() && hex(l).is_some() => {
                let value = hex(h).unwrap_or(0) * 16 + hex(l).unwrap_or(0);
                out.push(u8::try_from(value).unwrap_or(b'?'));
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

// ---------------------------------------------------------------------------------------------
// The connector: tokio-postgres's TLS traits over tokio-rustls
// ---------------------------------------------------------------------------------------------

/// A rustls client configuration trusting only the CA file's certificates.
#[derive(Clone)]
struct VerifiedTls {
    config: Arc<rustls::ClientConfig>,
}

impl VerifiedTls {
    fn from_ca_file(path: &Path) -> Result<VerifiedTls, DsnError> {
        let fail = |reason: String| DsnError::RootCert {
            path: path.display().to_string(),
            reason,
        };
        let pem = std::fs::read(path).map_err(|e| fail(e.to_string()))?;
        let mut roots = rustls::RootCertStore::empty();
        for certificate in CertificateDer::pem_slice_iter(&pem) {
            let certificate = certificate.map_err(|e| fail(format!("not a PEM file: {e}")))?;
            roots
                .add(certificate)
                .map_err(|e| fail(format!("unusable CA certificate: {e}")))?;
        }
        if roots.is_empty() {
            return Err(fail("no certificate in the file".into()));
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| fail(e.to_string()))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(VerifiedTls {
            config: Arc::new(config),
        })
    }
}

/// Why a TLS connection failed.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The DSN's host is neither a DNS name nor an IP address.
    #[error("{0:?} is not a valid TLS server name")]
    ServerName(String),
    /// The server's certificate does not chain to the CA file or does not name the host.
    #[error("the server's certificate was rejected: {0}")]
    Certificate(String),
    /// Anything else that broke the handshake (the connection dropped, a protocol error).
    #[error("TLS handshake failed: {0}")]
    Handshake(io::Error),
}

impl From<io::Error> for TlsError {
    fn from(error: io::Error) -> TlsError {
        let rejected = error
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
            .filter(|e| {
                matches!(
                    e,
                    rustls::Error::InvalidCertificate(_)
                        | rustls::Error::NoCertificatesPresented
                        | rustls::Error::AlertReceived(rustls::AlertDescription::UnknownCA)
                )
            })
            .map(|e| e.to_string());
        match rejected {
            Some(reason) => TlsError::Certificate(reason),
            None => TlsError::Handshake(error),
        }
    }
}

impl<S> MakeTlsConnect<S> for VerifiedTls
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = TlsStream<S>;
    type TlsConnect = VerifiedConnect;
    type Error = TlsError;

    fn make_tls_connect(&mut self, domain: &str) -> Result<VerifiedConnect, TlsError> {
        let name = ServerName::try_from(domain.to_string())
            .map_err(|_| TlsError::ServerName(domain.to_string()))?;
        Ok(VerifiedConnect {
            config: self.config.clone(),
            name,
        })
    }
}

/// One TLS handshake to a named server.
pub struct VerifiedConnect {
    config: Arc<rustls::ClientConfig>,
    name: ServerName<'static>,
}

impl<S> TlsConnect<S> for VerifiedConnect
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = TlsStream<S>;
    type Error = TlsError;
    type Future = Pin<Box<dyn Future<Output = Result<TlsStream<S>, TlsError>> + Send>>;

    fn connect(self, stream: S) -> Self::Future {
        Box::pin(async move {
            let connector = tokio_rustls::TlsConnector::from(self.config);
            let stream = connector.connect(self.name, stream).await?;
            Ok(TlsStream(stream))
        })
    }
}

/// A TLS stream to a PostgreSQL server. No SCRAM channel binding is offered (tokio-postgres
/// then uses plain SCRAM-SHA-256, which `channel_binding=prefer`, its default, accepts): the
/// certificate is verified against the CA and the host name already.
pub struct TlsStream<S>(tokio_rustls::client::TlsStream<S>);

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for TlsStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for TlsStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> tokio_postgres::tls::TlsStream for TlsStream<S> {
    fn channel_binding(&self) -> ChannelBinding {
        ChannelBinding::none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Logs name each server with its port, as libpq reads the DSN, and never the password.
    #[test]
    fn endpoints_name_every_host_with_its_port() {
        let endpoints = |dsn: &str| Dsn::parse(dsn).expect("parses").endpoints();
        assert_eq!(
            endpoints("host=10.0.0.7 port=5433 user=u password=hunter2"),
            "10.0.0.7:5433"
        );
        assert_eq!(endpoints("postgres://u@replica/x"), "replica:5432");
        assert_eq!(endpoints("host=a,b port=5433 user=u"), "a:5433,b:5433");
        assert_eq!(endpoints("host=a,b port=5433,5434 user=u"), "a:5433,b:5434");
        assert_eq!(endpoints("user=u"), "localhost:5432");
        assert!(!endpoints("postgres://u:hunter2@h:6000/x").contains("hunter2"));
    }

    #[test]
    fn tls_keys_are_taken_out_of_key_value_strings() {
        let (rest, keys) = take_tls_keys(
            "host=db.internal port=5432 password='a b\\'c' sslmode=verify-full sslrootcert='/etc/ca dir/ca.pem' dbname=x",
        );
        assert_eq!(
            rest,
            "host=db.internal port=5432 password='a b\\'c' dbname=x"
        );
        assert_eq!(keys.sslmode.as_deref(), Some("verify-full"));
        assert_eq!(keys.sslrootcert.as_deref(), Some("/etc/ca dir/ca.pem"));
    }

    #[test]
    fn tls_keys_are_taken_out_of_urls() {
        let (rest, keys) = take_tls_keys(
            "postgres://u:p@db.internal:5432/x?application_name=a&sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem",
        );
        assert_eq!(rest, "postgres://u:p@db.internal:5432/x?application_name=a");
        assert_eq!(keys.sslmode.as_deref(), Some("verify-full"));
        assert_eq!(keys.sslrootcert.as_deref(), Some("/etc/ca.pem"));
        let (rest, _) = take_tls_keys("postgresql://h/x?sslmode=disable");
        assert_eq!(rest, "postgresql://h/x");
    }

    #[test]
    fn modes_without_verification_are_refused() {
        for mode in ["require", "verify-ca"] {
            assert!(matches!(
                Dsn::parse(&format!("host=h sslmode={mode}")),
                Err(DsnError::UnsupportedSslMode(_))
            ));
        }
        assert!(matches!(
            Dsn::parse("host=h sslmode=verify-full"),
            Err(DsnError::RootCertMismatch)
        ));
        assert!(matches!(
            Dsn::parse("host=h sslrootcert=/x.pem"),
            Err(DsnError::RootCertMismatch)
        ));
        assert!(matches!(
            Dsn::parse("host=h sslmode=verify-full sslrootcert=/nonexistent/ca.pem"),
            Err(DsnError::RootCert { .. })
        ));
        let plain = Dsn::parse("host=h user=u password=secret").expect("plain DSN");
        assert!(!plain.verifies_tls());
        assert_eq!(plain.hosts(), "h");
        assert!(!format!("{plain:?}").contains("secret"));
    }
}
