//! Starting a pgdp server: the one place that assembles policy, upstream, ledger and listener.
//! Used by the `serve` and `demo` commands and by the integration tests.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::task::JoinHandle;

use crate::backend::Backend;
use crate::budget::Ledger;
use crate::error::Error;
use crate::policy::Policy;
use crate::session::Shared;

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
}

/// A running server; stops when dropped.
#[derive(Debug)]
pub struct Running {
    /// The address it listens on.
    pub addr: SocketAddr,
    /// Its shared state.
    pub shared: Arc<Shared>,
    handle: JoinHandle<()>,
}

impl Running {
    /// Waits until the server stops (it does not, unless the listener fails).
    pub async fn wait(mut self) {
        let _ = (&mut self.handle).await;
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.handle.abort();
    }
}

/// Binds the listener and serves in a background task. Neither the upstream nor the ledger needs
/// to be reachable: while the upstream is down, DP and catalog queries are refused with 57P03;
/// while the ledger is down, DP queries are (nothing runs uncharged); both are retried on every
/// query, so pgdp serves as soon as they are back. Only invalid DSNs and the listen address
/// stop it from starting.
pub async fn start(config: Config) -> Result<Running, StartError> {
    let backend = Backend::new(&config.upstream).map_err(|_| StartError::Upstream)?;
    let ledger_dsn = config.ledger.as_deref().unwrap_or(&config.upstream);
    let ledger = Ledger::new(ledger_dsn).map_err(StartError::Ledger)?;
    let shadow = crate::backend::Shadow::new(&config.upstream, &config.policy)
        .map_err(|_| StartError::Upstream)?;
    match backend.server_version().await {
        Ok(_) => {
            if let Err(e) = shadow.ensure().await {
                tracing::warn!(error = %e, "no shadow catalog yet: catalog queries will retry it");
            }
        }
        Err(_) => tracing::warn!(
            "upstream unreachable at start: DP and catalog queries are refused (57P03) until it is back"
        ),
    }
    let mut shared = Shared::new(config.policy, backend, ledger, Some(shadow))
        .await
        .map_err(StartError::Ledger)?;
    if shared.secret().await.is_err() {
        tracing::warn!(
            "privacy ledger unreachable at start: DP queries are refused (57P03) until it is back"
        );
    }
    shared.noise_seed = config.noise_seed;
    let shared = Arc::new(shared);
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
    let serving = shared.clone();
    let handle = tokio::spawn(async move {
        if let Err(e) = crate::wire::serve(listener, serving).await {
            tracing::error!(error = %e, "listener failed");
        }
    });
    tracing::info!(%addr, "pgdp listening");
    Ok(Running {
        addr,
        shared,
        handle,
    })
}
