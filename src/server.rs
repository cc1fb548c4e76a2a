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
    /// The ledger could not be opened.
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

/// Opens the ledger, binds the listener and serves in a background task.
pub async fn start(config: Config) -> Result<Running, StartError> {
    let backend = Backend::new(&config.upstream).map_err(|_| StartError::Upstream)?;
    match backend.server_version().await {
        Ok(v) => tracing::info!(server_version = %v, "upstream reachable"),
        Err(_) => tracing::warn!("upstream unreachable at start; pgdp will serve once it is back"),
    }
    let ledger_dsn = config.ledger.as_deref().unwrap_or(&config.upstream);
    let ledger = Ledger::connect(ledger_dsn)
        .await
        .map_err(StartError::Ledger)?;
    let shadow = match crate::backend::Shadow::build(&config.upstream, &config.policy).await {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!(error = %e, "no shadow catalog: catalog queries will be refused");
            None
        }
    };
    let mut shared = Shared::new(config.policy, backend, ledger, shadow)
        .await
        .map_err(StartError::Ledger)?;
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
