//! The upstream PostgreSQL: a small pool of tokio-postgres connections, and the one way pgdp
//! runs SQL there.
//!
//! Invariants:
//! - Every statement pgdp runs for an analyst goes through [`Backend::run_release_query`]: one
//!   `READ ONLY` transaction with a `statement_timeout` of [`limits::STATEMENT_TIMEOUT_MS`], and
//!   at most [`limits::UPSTREAM_ROWS_MAX`] rows read.
//! - Upstream error text is never returned: it can contain row values. It is logged here (at
//!   `warn`) and the caller receives [`Error::Upstream`], [`Error::Canceled`] or
//!   [`Error::UpstreamUnavailable`], whose messages are fixed.
//! - A connection that saw an error is discarded, never returned to the pool mid-transaction.

use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_postgres::{Client, Config, NoTls, SimpleQueryMessage};

use crate::error::{Error, Result};
use crate::limits;

/// Rows as PostgreSQL's text format: one `Option<String>` per column (None = NULL).
pub type TextRows = Vec<Vec<Option<String>>>;

/// The upstream database.
pub struct Backend {
    config: Config,
    idle: Mutex<Vec<Client>>,
    permits: Arc<Semaphore>,
    server_version: Mutex<Option<String>>,
}

/// A pooled connection; returned to the pool when dropped unless marked broken.
pub struct Pooled<'a> {
    backend: &'a Backend,
    client: Option<Client>,
    broken: bool,
    _permit: OwnedSemaphorePermit,
}

impl Pooled<'_> {
    /// The connection.
    pub fn client(&self) -> &Client {
        // Invariant: `client` is Some from construction until drop.
        self.client
            .as_ref()
            .expect("pooled client present until drop")
    }

    /// Marks the connection as unusable (it will be closed instead of reused).
    pub fn discard(&mut self) {
        self.broken = true;
    }
}

impl Drop for Pooled<'_> {
    fn drop(&mut self) {
        if let Some(client) = self.client.take() {
            if !self.broken && !client.is_closed() {
                if let Ok(mut idle) = self.backend.idle.lock() {
                    idle.push(client);
                }
            }
        }
    }
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backend")
            .field("host", &self.config.get_hosts())
            .field("dbname", &self.config.get_dbname())
            .finish()
    }
}

impl Backend {
    /// A backend for the DSN (libpq URL or key=value). Does not connect yet.
    pub fn new(dsn: &str) -> Result<Backend> {
        let mut config = Config::from_str(dsn).map_err(|e| {
            tracing::error!(error = %e, "invalid upstream DSN");
            Error::UpstreamUnavailable
        })?;
        config.connect_timeout(Duration::from_millis(limits::UPSTREAM_CONNECT_TIMEOUT_MS));
        config.application_name("pgdp");
        Ok(Backend {
            config,
            idle: Mutex::new(Vec::new()),
            permits: Arc::new(Semaphore::new(limits::UPSTREAM_POOL_SIZE)),
            server_version: Mutex::new(None),
        })
    }

    /// The database name of the upstream DSN.
    pub fn dbname(&self) -> Option<&str> {
        self.config.get_dbname()
    }

    async fn connect(&self) -> Result<Client> {
        let (client, connection) = self.config.connect(NoTls).await.map_err(|e| {
            tracing::warn!(error = %e, "cannot connect to the upstream");
            Error::UpstreamUnavailable
        })?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "upstream connection ended");
            }
        });
        Ok(client)
    }

    /// A connection from the pool, opening one if none is idle.
    pub async fn get(&self) -> Result<Pooled<'_>> {
        let permit = self
            .permits
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| Error::UpstreamUnavailable)?;
        let reused = {
            let mut idle = self
                .idle
                .lock()
                .map_err(|_| Error::internal("pool lock poisoned"))?;
            let mut found = None;
            while let Some(c) = idle.pop() {
                if !c.is_closed() {
                    found = Some(c);
                    break;
                }
            }
            found
        };
        let client = match reused {
            Some(c) => c,
            None => self.connect().await?,
        };
        Ok(Pooled {
            backend: self,
            client: Some(client),
            broken: false,
            _permit: permit,
        })
    }

    /// The upstream's `server_version`, fetched once and cached.
    pub async fn server_version(&self) -> Result<String> {
        if let Some(v) = self.server_version.lock().ok().and_then(|v| v.clone()) {
            return Ok(v);
        }
        let conn = self.get().await?;
        let rows = conn
            .client()
            .simple_query("SHOW server_version")
            .await
            .map_err(|e| {
                tracing::warn!(error = %e, "cannot read the upstream's server_version");
                Error::UpstreamUnavailable
            })?;
        let version = first_value(&rows).unwrap_or_else(|| "15.0".into());
        if let Ok(mut v) = self.server_version.lock() {
            *v = Some(version.clone());
        }
        Ok(version)
    }

    /// The cached server version, if known (for ParameterStatus at startup, which cannot wait).
    pub fn cached_server_version(&self) -> Option<String> {
        self.server_version.lock().ok().and_then(|v| v.clone())
    }

    /// Runs one pgdp-generated SELECT in a read-only transaction with pgdp's statement timeout,
    /// and returns its rows in text format.
    pub async fn run_release_query(&self, sql: &str) -> Result<TextRows> {
        let mut conn = self.get().await?;
        let batch = format!(
            "BEGIN READ ONLY; SET LOCAL statement_timeout = {}; {sql}; COMMIT",
            limits::STATEMENT_TIMEOUT_MS
        );
        let result = conn.client().simple_query(&batch).await;
        match result {
            Ok(messages) => collect_rows(&messages),
            Err(e) => {
                conn.discard();
                let canceled = e.code() == Some(&tokio_postgres::error::SqlState::QUERY_CANCELED);
                tracing::warn!(error = %e, "upstream DP statement failed");
                if canceled {
                    Err(Error::Canceled {
                        reason: "statement timeout".into(),
                    })
                } else if e.is_closed() || e.code().is_none() {
                    Err(Error::UpstreamUnavailable)
                } else {
                    Err(Error::Upstream)
                }
            }
        }
    }

    /// Runs SQL that reads no private data (public tables), returning text rows. Same
    /// transaction discipline as [`Backend::run_release_query`].
    pub async fn run_public_query(&self, sql: &str) -> Result<TextRows> {
        self.run_release_query(sql).await
    }
}

fn first_value(messages: &[SimpleQueryMessage]) -> Option<String> {
    messages.iter().find_map(|m| match m {
        SimpleQueryMessage::Row(r) => r.get(0).map(str::to_string),
        _ => None,
    })
}

fn collect_rows(messages: &[SimpleQueryMessage]) -> Result<TextRows> {
    let mut rows = Vec::new();
    for m in messages {
        if let SimpleQueryMessage::Row(r) = m {
            if rows.len() >= limits::UPSTREAM_ROWS_MAX {
                return Err(Error::LimitExceeded {
                    what: "the number of candidate groups read from the upstream".into(),
                    limit: limits::UPSTREAM_ROWS_MAX as u64,
                });
            }
            rows.push((0..r.len()).map(|i| r.get(i).map(str::to_string)).collect());
        }
    }
    Ok(rows)
}
