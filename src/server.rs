//! Starting a pgdp server: the one place that assembles policy, upstream, ledger, TLS and
//! listener. Used by the `serve` and `demo` commands and by the integration tests.
//!
//! Invariant: a server either starts with everything it was asked for (a TLS certificate that
//! cannot be read or does not match its key is an error, never a silent fallback to clear text)
//! or does not start.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::task::JoinHandle;

use crate::budget::Ledger;
use crate::error::Error;
use crate::policy::Policy;
use crate::session::{Live, Reloaded, Shared};
use crate::upstream::Upstream;

/// What a server needs.
#[derive(Debug, Clone)]
pub struct Config {
    /// The validated policy.
    pub policy: Policy,
    /// DSN of the upstream (a role that can read the private tables).
    pub upstream: String,
    /// DSN of the ledger database; the upstream when `None`.
    pub ledger: Option<String>,
    /// Address to listen on (`127.0.0.1:0` picks a free port).
    pub listen: String,
    /// Tests only: seed of the noise generator.
    pub noise_seed: Option<[u8; 32]>,
}

/// A TLS certificate chain and its private key, both PEM files.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    /// The certificate chain, server certificate first.
    pub certificate: PathBuf,
    /// The private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
}

/// What a server may be given besides its [`Config`]: TLS and connection limits.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// TLS for client connections; `None` answers every SSLRequest with `N`.
    pub tls: Option<TlsFiles>,
    /// Refuse clients that do not negotiate TLS (FATAL 28000, PostgreSQL's `hostssl` message),
    /// before any authentication. Needs `tls`: a server asked for it without a certificate does
    /// not start.
    pub require_tls: bool,
    /// Connection limits (the defaults of `limits.rs` unless a test lowers them).
    pub limits: crate::frontend::ConnectionLimits,
    /// DSNs of streaming replicas of the upstream that serve DP and public-table queries in
    /// turn while healthy ([`crate::upstream::standby`]), and the shadow catalog's reads once
    /// they have replayed its build ([`crate::upstream::shadow`]); the upstream is the fallback.
    pub replicas: Vec<String>,
    /// The largest replay lag at which a replica still serves, in ms;
    /// [`crate::limits::STANDBY_LAG_MAX_MS`] when `None`.
    pub replica_lag_max_ms: Option<u64>,
    /// Address of the metrics endpoint (`GET /metrics`, `GET /health`); none without it
    /// (`127.0.0.1:0` picks a free port).
    pub metrics: Option<String>,
    /// Most charges one budget slice reserves (`budget::lease`);
    /// [`crate::limits::SLICE_QUERIES_DEFAULT`] when `None`, and 1 turns leases off.
    pub lease_queries: Option<u64>,
}

/// Why a server could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The listen address is invalid or taken.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: String,
        source: std::io::Error,
    },
    /// The ledger DSN is invalid.
    #[error("cannot open the privacy ledger: {0}")]
    Ledger(Error),
    /// The upstream DSN is invalid.
    #[error("invalid upstream DSN")]
    Upstream,
    /// Keys the policy declares unique (`unique_keys`) that hold a value twice upstream.
    #[error("the policy declares {} unique, but the upstream holds a value of each twice: remove the duplicates, or drop the column from its table's unique_keys", .0.iter().map(|(t, c)| format!("{t}.{c}")).collect::<Vec<_>>().join(", "))]
    DeclaredKeys(Vec<(String, String)>),
    /// `require_tls` without a certificate: no client could ever connect.
    #[error("--require-tls needs a certificate (--tls-cert and --tls-key)")]
    RequireTlsWithoutCertificate,
    /// A DSN cannot be parsed or its CA file read.
    #[error("invalid {which} DSN: {reason}")]
    Dsn { which: &'static str, reason: String },
    /// A DSN with `sslmode=verify-full` whose server cannot be verified (wrong CA, wrong host
    /// name, no TLS). Never retried: it is a configuration error, not an outage.
    #[error("{which} at host {host}: TLS verification failed: {reason}")]
    UpstreamTls {
        which: &'static str,
        host: String,
        reason: String,
    },
    /// The TLS certificate or key cannot be used.
    #[error("TLS: {path}: {reason}")]
    Tls { path: String, reason: String },
}

/// Reads a certificate chain and key into a TLS acceptor (rustls with the ring provider; TLS 1.2
/// and 1.3; ALPN `postgresql`, which direct TLS negotiation requires).
pub fn load_tls(files: &TlsFiles) -> Result<crate::frontend::Tls, StartError> {
    use pgwire::tokio::tokio_rustls::rustls;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let fail = |path: &PathBuf, reason: String| StartError::Tls {
        path: path.display().to_string(),
        reason,
    };
    let certificate_pem =
        std::fs::read(&files.certificate).map_err(|e| fail(&files.certificate, e.to_string()))?;
    let chain = CertificateDer::pem_slice_iter(&certificate_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| {
            fail(
                &files.certificate,
                format!("not a PEM certificate chain: {e}"),
            )
        })?;
    if chain.is_empty() {
        return Err(fail(
            &files.certificate,
            "no certificate in the file".into(),
        ));
    }
    let key_pem = std::fs::read(&files.key).map_err(|e| fail(&files.key, e.to_string()))?;
    // The error of a key that does not parse never quotes the file.
    let key = PrivateKeyDer::from_pem_slice(&key_pem)
        .map_err(|_| fail(&files.key, "not a PEM private key".into()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| fail(&files.certificate, e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| fail(&files.key, format!("does not match the certificate: {e}")))?;
    config.alpn_protocols = vec![b"postgresql".to_vec()];
    Ok(crate::frontend::Tls {
        acceptor: pgwire::tokio::TlsAcceptor::from(Arc::new(config)),
        certificate_pem,
    })
}

/// Checks a DSN at start: it must parse (with its CA file), and with `sslmode=verify-full` one
/// connection is tried now, so that a wrong CA, a wrong host name or a server without TLS stops
/// pgdp with a message naming the host, rather than showing later as an upstream outage. An
/// unreachable server is only logged: pgdp serves once it is back (see [`start_with`]).
async fn verify_tls(which: &'static str, text: &str) -> Result<(), StartError> {
    let mut dsn = crate::dsn::Dsn::parse(text).map_err(|e| StartError::Dsn {
        which,
        reason: e.to_string(),
    })?;
    if !dsn.verifies_tls() {
        return Ok(());
    }
    dsn.config_mut()
        .connect_timeout(std::time::Duration::from_millis(
            crate::limits::UPSTREAM_CONNECT_TIMEOUT_MS,
        ))
        .application_name("pgdp");
    match dsn.connect(which).await {
        Ok(_) => {
            tracing::info!(which, endpoint = %dsn.endpoints(), "verified TLS to the server");
            Ok(())
        }
        Err(e) => match crate::dsn::tls_failure(&e) {
            Some(reason) => Err(StartError::UpstreamTls {
                which,
                host: dsn.hosts(),
                reason,
            }),
            None => {
                tracing::warn!(which, endpoint = %dsn.endpoints(), error = %e, "cannot check TLS at start: server unreachable");
                Ok(())
            }
        },
    }
}

/// A running server; stops when dropped.
#[derive(Debug)]
pub struct Running {
    /// The address it listens on.
    pub addr: SocketAddr,
    /// Its shared state, replaced whole by [`Running::reload`].
    pub live: Arc<Live>,
    /// The address of its metrics endpoint, if it serves one.
    pub metrics_addr: Option<SocketAddr>,
    handle: JoinHandle<()>,
}

impl Running {
    /// The shared state in force now.
    pub fn shared(&self) -> Arc<Shared> {
        self.live.current()
    }

    /// Puts a validated policy in force for the statements that start from now on (see
    /// [`crate::session::Live`]); the old one stays in force if this fails.
    pub async fn reload(&self, policy: Policy) -> crate::Result<Reloaded> {
        self.live.reload(policy).await
    }

    /// Waits until the server stops (it does not, unless the listener fails).
    pub async fn wait(mut self) {
        self.stopped().await;
    }

    /// Waits until the server stops, keeping it (to reload it meanwhile).
    pub async fn stopped(&mut self) {
        let _ = (&mut self.handle).await;
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.handle.abort();
    }
}

/// [`start_with`] without TLS and with the default limits.
pub async fn start(config: Config) -> Result<Running, StartError> {
    start_with(config, Options::default()).await
}

/// Loads TLS, binds the listener and serves in a background task. Neither the upstream nor the
/// ledger needs to be reachable: while the upstream is down, DP and catalog queries are refused
/// with 57P03; while the ledger is down, DP queries are (nothing runs uncharged); both are
/// retried on every query, so pgdp serves as soon as they are back. Only invalid DSNs, TLS files
/// and the listen address stop it from starting.
pub async fn start_with(config: Config, options: Options) -> Result<Running, StartError> {
    if options.require_tls && options.tls.is_none() {
        return Err(StartError::RequireTlsWithoutCertificate);
    }
    let tls = options.tls.as_ref().map(load_tls).transpose()?;
    let tls_enabled = tls.is_some();
    let require_tls = options.require_tls;
    let limits = options.limits;
    let ledger_dsn = config.ledger.as_deref().unwrap_or(&config.upstream);
    verify_tls("upstream", &config.upstream).await?;
    for replica in &options.replicas {
        verify_tls("replica", replica).await?;
    }
    if config.ledger.is_some() {
        verify_tls("ledger", ledger_dsn).await?;
    }
    let lag_max_ms = options
        .replica_lag_max_ms
        .unwrap_or(crate::limits::STANDBY_LAG_MAX_MS);
    let backend = Upstream::with_standbys(&config.upstream, &options.replicas, lag_max_ms)
        .map_err(|_| StartError::Upstream)?;
    let ledger = Ledger::new(ledger_dsn).map_err(StartError::Ledger)?;
    ledger.set_lease_queries(
        options
            .lease_queries
            .unwrap_or(crate::limits::SLICE_QUERIES_DEFAULT)
            .min(crate::limits::SLICE_QUERIES_MAX),
    );
    let shadow = crate::upstream::Shadow::new(&backend, &config.policy);
    let reachable = match backend.server_version().await {
        Ok(_) => {
            if let Err(e) = shadow.ensure().await {
                tracing::warn!(error = %e, "no shadow catalog yet: catalog queries will retry it");
            }
            true
        }
        Err(_) => {
            tracing::warn!(
                "upstream unreachable at start: DP and catalog queries are refused (57P03) until it is back"
            );
            false
        }
    };
    let mut shared = Shared::new(config.policy, backend, ledger, Some(shadow))
        .await
        .map_err(StartError::Ledger)?;
    if shared.secret().await.is_err() {
        tracing::warn!(
            "privacy ledger unreachable at start: DP queries are refused (57P03) until it is back"
        );
    }
    if reachable {
        match shared
            .upstream
            .verify_declared_keys(&shared.column_facts)
            .await
        {
            Ok(duplicated) if !duplicated.is_empty() => {
                return Err(StartError::DeclaredKeys(duplicated))
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = %e, "cannot verify the policy's declared unique keys at start: they are verified on first need")
            }
        }
    }
    shared.noise_seed = config.noise_seed;
    Upstream::watch_standbys(&shared.upstream);
    let live = Arc::new(Live::new(shared));
    let listener = tokio::net::TcpListener::bind(&config.listen)
        .await
        .map_err(|source| StartError::Listen {
            addr: config.listen.clone(),
            source,
        })?;
    let addr = listener.local_addr().map_err(|source| StartError::Listen {
        addr: config.listen.clone(),
        source,
    })?;
    let serving = live.clone();
    let metrics = match &options.metrics {
        Some(addr) => Some(metrics_listener(addr).await?),
        None => None,
    };
    let metrics_addr = metrics.as_ref().map(|(_, addr)| *addr);
    let handle = tokio::spawn(async move {
        let front = crate::frontend::Front {
            tls,
            require_tls,
            limits,
        };
        let probes = Arc::new(Reachability(serving.clone()));
        let counters = serving.current().metrics.clone();
        let metrics = async move {
            match metrics {
                Some((listener, _)) => {
                    crate::metrics::http::serve(listener, counters, probes).await
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            served = crate::frontend::serve_with(listener, serving, front) => {
                if let Err(e) = served {
                    tracing::error!(error = %e, "listener failed");
                }
            }
            () = metrics => {}
        }
    });
    tracing::info!(%addr, tls = tls_enabled, require_tls, "pgdp listening");
    if let Some(metrics_addr) = metrics_addr {
        tracing::info!(%metrics_addr, "metrics endpoint listening");
    }
    Ok(Running {
        addr,
        live,
        metrics_addr,
        handle,
    })
}

/// Binds the metrics endpoint's listener.
async fn metrics_listener(addr: &str) -> Result<(tokio::net::TcpListener, SocketAddr), StartError> {
    let fail = |source| StartError::Listen {
        addr: addr.to_string(),
        source,
    };
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(fail)?;
    let bound = listener.local_addr().map_err(fail)?;
    if !bound.ip().is_loopback() {
        // Latency histograms depend on the data and are not narrowed by a release schedule:
        // analysts must not reach them.
        tracing::warn!(%bound, "the metrics endpoint listens beyond loopback: keep it on a network analysts cannot reach (docs/operations.md)");
    }
    Ok((listener, bound))
}

/// The health endpoint's checks: `SELECT 1` on the upstream pool and on the ledger.
struct Reachability(Arc<Live>);

#[async_trait::async_trait]
impl crate::metrics::http::Probes for Reachability {
    async fn upstream(&self) -> bool {
        self.0.current().upstream.ping().await.is_ok()
    }

    async fn ledger(&self) -> bool {
        self.0.current().ledger.ping().await.is_ok()
    }
}
