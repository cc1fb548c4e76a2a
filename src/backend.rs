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

/// A catalog column: its name and the upstream type OID.
pub type CatalogColumns = Vec<(String, u32)>;

/// The shadow catalog: a database with the policy's schemas and tables (declared columns only,
/// with the upstream's column types) and no rows.
#[derive(Debug)]
pub struct Shadow {
    backend: Backend,
    /// The shadow database's name.
    pub dbname: String,
}

fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

impl Shadow {
    /// Creates (if needed) and rebuilds the shadow catalog of `policy` next to the upstream
    /// database. Needs CREATEDB on the upstream role the first time.
    pub async fn build(upstream_dsn: &str, policy: &crate::policy::Policy) -> Result<Shadow> {
        let upstream = Backend::new(upstream_dsn)?;
        let dbname = format!("{}_pgdp_catalog", upstream.dbname().unwrap_or("postgres"));
        let conn = upstream.get().await?;
        let fail = |what: &'static str| {
            move |e: tokio_postgres::Error| {
                tracing::warn!(error = %e, what, "shadow catalog");
                Error::UpstreamUnavailable
            }
        };
        let exists = conn
            .client()
            .query_opt(
                "SELECT 1 FROM pg_catalog.pg_database WHERE datname = $1",
                &[&dbname],
            )
            .await
            .map_err(fail("look up"))?
            .is_some();
        if !exists {
            let create = format!("CREATE DATABASE {}", quote_ident(&dbname));
            if let Err(e) = conn.client().batch_execute(&create).await {
                // Another pgdp may have created it at the same moment.
                if e.code() != Some(&tokio_postgres::error::SqlState::DUPLICATE_DATABASE) {
                    return Err(fail("create database")(e));
                }
            }
        }
        // Column types as the upstream declares them.
        let mut ddl = String::from("SELECT pg_advisory_xact_lock(7367626470);");
        for schema in policy.schemas() {
            ddl.push_str(&format!(
                "DROP SCHEMA IF EXISTS {0} CASCADE; CREATE SCHEMA {0};",
                quote_ident(&schema)
            ));
        }
        for table in policy.tables.values() {
            let qualified = format!(
                "{}.{}",
                quote_ident(&table.schema),
                quote_ident(&table.name)
            );
            let rows = conn
                .client()
                .query(
                    "SELECT a.attname, pg_catalog.format_type(a.atttypid, a.atttypmod) \
                     FROM pg_catalog.pg_attribute a \
                     WHERE a.attrelid = pg_catalog.to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped",
                    &[&qualified],
                )
                .await
                .map_err(fail("read column types"))?;
            // Upstream order first (attnum), then declared columns the upstream lacks.
            let upstream_types: Vec<(String, String)> = rows
                .iter()
                .map(|r| (r.get::<_, String>(0), r.get::<_, String>(1)))
                .collect();
            if upstream_types.is_empty() {
                tracing::error!(table = %table.qualified_name(), "policy table does not exist on the upstream");
            }
            let mut ordered: Vec<&crate::policy::Column> = upstream_types
                .iter()
                .filter_map(|(name, _)| table.column(name))
                .collect();
            for c in &table.columns {
                if !ordered.iter().any(|o| o.name == c.name) {
                    tracing::error!(table = %table.qualified_name(), column = %c.name, "policy column does not exist on the upstream");
                    ordered.push(c);
                }
            }
            let columns: Vec<String> = ordered
                .iter()
                .map(|c| {
                    let ty = upstream_types
                        .iter()
                        .find(|(n, _)| *n == c.name)
                        .map(|(_, t)| t.clone())
                        .unwrap_or_else(|| match c.ty {
                            crate::policy::ColumnType::Integer => "bigint".into(),
                            crate::policy::ColumnType::Float => "double precision".into(),
                            other => other.name().into(),
                        });
                    format!("{} {ty}", quote_ident(&c.name))
                })
                .collect();
            let mut column_notes = String::new();
            for c in &ordered {
                let mut parts = Vec::new();
                if let Some(b) = c.bounds {
                    parts.push(format!("bounds [{}, {}]", b.lower, b.upper));
                }
                if c.groupable {
                    parts.push("groupable".to_string());
                }
                if let Some(v) = &c.public_values {
                    parts.push(format!("{} public values", v.len()));
                }
                if !parts.is_empty() {
                    column_notes.push_str(&format!(
                        "COMMENT ON COLUMN {qualified}.{} IS '{}';",
                        quote_ident(&c.name),
                        parts.join("; ").replace('\'', "''")
                    ));
                }
            }
            let note = match &table.kind {
                crate::policy::TableKind::Public => "public table (pgdp)".to_string(),
                crate::policy::TableKind::Private(p) => format!(
                    "private table: DP aggregates only; privacy unit {}, at most {} group(s) and {} row(s) per unit (pgdp)",
                    p.privacy_unit.as_deref().unwrap_or("<row>"),
                    p.max_groups_per_unit,
                    p.max_rows_per_unit
                ),
            };
            ddl.push_str(&format!(
                "CREATE TABLE {qualified} ({}); COMMENT ON TABLE {qualified} IS '{}';{column_notes}",
                columns.join(", "),
                note.replace('\'', "''")
            ));
        }
        drop(conn);
        let mut config = upstream.config.clone();
        config.dbname(&dbname);
        let backend = Backend {
            config,
            idle: Mutex::new(Vec::new()),
            permits: Arc::new(Semaphore::new(4)),
            server_version: Mutex::new(None),
        };
        {
            let mut shadow = backend.get().await?;
            let client = shadow.client();
            let result = client.batch_execute(&format!("BEGIN; {ddl} COMMIT;")).await;
            if let Err(e) = result {
                shadow.discard();
                return Err(fail("build")(e));
            }
        }
        tracing::info!(database = %dbname, tables = policy.tables.len(), "shadow catalog ready");
        Ok(Shadow { backend, dbname })
    }

    /// The result columns of a catalog query, without running it.
    pub async fn describe(&self, sql: &str) -> Result<CatalogColumns> {
        let conn = self.backend.get().await?;
        let statement = conn.client().prepare(sql).await.map_err(|e| {
            tracing::info!(error = %e, "catalog query does not prepare");
            Error::unsupported(
                "this catalog query",
                "pgdp's shadow catalog could not answer it.",
            )
        })?;
        Ok(statement
            .columns()
            .iter()
            .map(|c| (c.name().to_string(), c.type_().oid()))
            .collect())
    }

    /// Runs a checked catalog query on the shadow database: its columns and text rows.
    /// `search_path` is the session's, already validated against the policy's schemas.
    pub async fn run(
        &self,
        sql: &str,
        search_path: &[String],
    ) -> Result<(CatalogColumns, TextRows)> {
        let columns = self.describe(sql).await?;
        let mut conn = self.backend.get().await?;
        let path: Vec<String> = search_path.iter().map(|s| quote_ident(s)).collect();
        let path = if path.is_empty() {
            "public".to_string()
        } else {
            path.join(", ")
        };
        let batch = format!(
            "BEGIN READ ONLY; SET LOCAL statement_timeout = 5000; SET LOCAL search_path = {path}; {sql}; COMMIT"
        );
        match conn.client().simple_query(&batch).await {
            Ok(messages) => Ok((columns, collect_rows(&messages)?)),
            Err(e) => {
                conn.discard();
                tracing::info!(error = %e, "catalog query failed");
                // The shadow holds no data, so its error text is safe to summarise by code.
                Err(Error::unsupported(
                    "this catalog query",
                    "pgdp's shadow catalog could not answer it.",
                ))
            }
        }
    }
}
