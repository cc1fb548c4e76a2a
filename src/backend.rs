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
//! - A connection is returned to the pool only after a statement completed on it and no cancel
//!   was sent for it: a late `CancelRequest` can therefore only reach a connection nobody uses.
//! - An unreachable upstream is never fatal: every call connects anew when the pool has no live
//!   connection, so pgdp serves again as soon as the upstream is back. The shadow catalog is
//!   built on first use if it could not be built at start ([`Shadow::ensure`]).

use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_postgres::{CancelToken, Client, Config, NoTls, SimpleQueryMessage};

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
    /// The `statement_timeout` of DP statements: [`limits::STATEMENT_TIMEOUT_MS`] unless lowered
    /// by [`Backend::lower_statement_timeout`].
    statement_timeout_ms: AtomicU64,
}

/// A pooled connection; returned to the pool when dropped unless marked broken.
pub struct Pooled<'a> {
    backend: &'a Backend,
    client: Option<Client>,
    broken: bool,
    _permit: OwnedSemaphorePermit,
}

impl Pooled<'_> {
    /// Runs one pgdp-generated SELECT in a read-only transaction with pgdp's statement timeout,
    /// and returns its rows in text format. `cancel` can stop it from another task (a
    /// CancelRequest, the client going away).
    pub async fn run_release_query(mut self, sql: &str, cancel: &Cancel) -> Result<TextRows> {
        let batch = format!(
            "BEGIN READ ONLY; SET LOCAL statement_timeout = {}; {sql}; COMMIT",
            self.backend.statement_timeout_ms.load(Ordering::Relaxed)
        );
        // Until the statement has completed, the connection is not returned to the pool: if this
        // future is dropped midway, the upstream may still be running the statement.
        self.broken = true;
        let mut reconnected = false;
        loop {
            let run = cancel.begin(self.client().cancel_token())?;
            let result = stream_rows(self.client(), &batch).await;
            let requested = run.end();
            let e = match result {
                Ok(rows) => {
                    // A cancel sent for this run may still be on its way: never reuse the
                    // connection then.
                    self.broken = requested.is_some();
                    return Ok(rows);
                }
                // The upstream is still sending: the connection stays marked broken and is
                // closed when dropped, which ends the statement.
                Err(RowsFault::TooMany(limit)) => return Err(limit),
                Err(RowsFault::Db(e)) => e,
            };
            tracing::warn!(error = %e, "upstream DP statement failed");
            if e.code() == Some(&tokio_postgres::error::SqlState::QUERY_CANCELED) {
                return Err(Error::Canceled {
                    reason: requested
                        .map_or("statement timeout", CancelReason::message)
                        .into(),
                });
            }
            if !is_connection_error(&e) {
                return Err(Error::Upstream);
            }
            // The connection died (the upstream restarted): one more try on a fresh one. Running
            // the statement twice reveals nothing, since only the released answer leaves pgdp.
            if reconnected || requested.is_some() {
                return Err(Error::UpstreamUnavailable);
            }
            reconnected = true;
            self.client = Some(self.backend.connect().await?);
        }
    }

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
            statement_timeout_ms: AtomicU64::new(limits::STATEMENT_TIMEOUT_MS),
        })
    }

    /// Lowers the statement timeout of DP statements to `ms` (never above
    /// [`limits::STATEMENT_TIMEOUT_MS`], never below 1 ms). For tests of slow upstreams and for
    /// operators who want a tighter bound.
    pub fn lower_statement_timeout(&self, ms: u64) {
        let ms = ms.clamp(1, limits::STATEMENT_TIMEOUT_MS);
        self.statement_timeout_ms.store(ms, Ordering::Relaxed);
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
        if self.cached_server_version().is_none() {
            match client.simple_query("SHOW server_version").await {
                Ok(rows) => {
                    let version = first_value(&rows).unwrap_or_else(|| "15.0".into());
                    tracing::info!(server_version = %version, "upstream reachable");
                    if let Ok(mut v) = self.server_version.lock() {
                        *v = Some(version);
                    }
                }
                Err(e) => tracing::warn!(error = %e, "cannot read the upstream's server_version"),
            }
        }
        Ok(client)
    }

    /// A live connection from the pool, opening one if none is idle. Connections that died
    /// (the upstream restarted) are dropped on the way; [`Error::UpstreamUnavailable`] (57P03) if
    /// the upstream cannot be reached.
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

    /// The upstream's `server_version`, read on the first connection and cached.
    pub async fn server_version(&self) -> Result<String> {
        if let Some(v) = self.cached_server_version() {
            return Ok(v);
        }
        drop(self.get().await?);
        self.cached_server_version()
            .ok_or(Error::UpstreamUnavailable)
    }

    /// The cached server version, if known (for ParameterStatus at startup, which cannot wait).
    pub fn cached_server_version(&self) -> Option<String> {
        self.server_version.lock().ok().and_then(|v| v.clone())
    }

    /// Verifies on the upstream catalog that every key a plan's unit paths rely on is unique
    /// ([`crate::catalog::UNIQUE_KEY_SQL`]), looking up only keys `known` has no answer for, and
    /// refuses the plan unless all are ([`crate::catalog::UniqueKeys::check`]). 57P03 while the
    /// upstream cannot be reached; nothing is charged either way.
    pub async fn verify_unique_keys(
        &self,
        known: &crate::catalog::UniqueKeys,
        keys: &[(String, String)],
    ) -> Result<()> {
        for (table, column) in self.learn_unique_keys(known, keys).await? {
            tracing::error!(%table, %column, "unit path key is not unique upstream: queries of tables whose path uses it are refused");
        }
        known.check(keys)
    }

    /// Looks up on the upstream catalog whether each of `keys` that `known` has no answer for is
    /// unique, records the answers in `known`, and returns the keys found not unique. Reads no
    /// rows of any table. 57P03 while the upstream cannot be reached.
    pub async fn learn_unique_keys(
        &self,
        known: &crate::catalog::UniqueKeys,
        keys: &[(String, String)],
    ) -> Result<Vec<(String, String)>> {
        let unverified = known.unverified(keys);
        let mut not_unique = Vec::new();
        if unverified.is_empty() {
            return Ok(not_unique);
        }
        let mut conn = self.get().await?;
        for (table, column) in unverified {
            let (schema, name) = table
                .split_once('.')
                .ok_or_else(|| Error::internal("unqualified table name"))?;
            let qualified = format!(
                "\"{}\".\"{}\"",
                schema.replace('"', "\"\""),
                name.replace('"', "\"\"")
            );
            let row = conn
                .client()
                .query_one(crate::catalog::UNIQUE_KEY_SQL, &[&qualified, &column])
                .await;
            match row.and_then(|r| r.try_get::<_, bool>(0)) {
                Ok(unique) => {
                    if !unique {
                        not_unique.push((table.clone(), column.clone()));
                    }
                    known.record((table, column), unique);
                }
                Err(e) => {
                    conn.discard();
                    tracing::warn!(error = %e, "unique key lookup");
                    return Err(Error::UpstreamUnavailable);
                }
            }
        }
        Ok(not_unique)
    }

    /// Runs SQL that reads no private data (public tables), returning text rows, with the
    /// transaction discipline of [`Pooled::run_release_query`].
    pub async fn run_public_query(&self, sql: &str, cancel: &Cancel) -> Result<TextRows> {
        self.get().await?.run_release_query(sql, cancel).await
    }
}

/// Why a running upstream statement is stopped on request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelReason {
    /// A CancelRequest with the session's key (psql's Ctrl-C).
    UserRequest,
    /// The client closed its connection; nobody waits for the answer.
    ClientGone,
}

impl CancelReason {
    /// The end of PostgreSQL's "canceling statement due to …" message.
    fn message(self) -> &'static str {
        match self {
            CancelReason::UserRequest => "user request",
            CancelReason::ClientGone => "client disconnect",
        }
    }
}

impl std::fmt::Debug for CancelState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CancelState")
            .field("running", &self.running.is_some())
            .field("requested", &self.requested)
            .field("client_gone", &self.client_gone)
            .finish()
    }
}

/// Stops the upstream statement of one client connection from another task: a CancelRequest
/// naming the connection's key, or the watcher that notices the client went away.
///
/// Like PostgreSQL, a cancel reaches only a statement that is running: one that arrives between
/// statements does nothing. A client that went away is remembered, so the session starts no
/// statement after it (its charge, if any, was made and stays).
#[derive(Debug, Default)]
pub struct Cancel {
    state: Mutex<CancelState>,
}

#[derive(Default)]
struct CancelState {
    /// The cancel token of the upstream connection running this connection's statement.
    running: Option<CancelToken>,
    /// Why the running statement was cancelled, if it was.
    requested: Option<CancelReason>,
    /// The client went away.
    client_gone: bool,
}

impl Cancel {
    /// Cancels the running upstream statement, if any; returns whether one was running. The
    /// cancel is sent to the upstream before this returns (best effort: it is logged if the
    /// upstream cannot be reached).
    pub async fn request(&self, reason: CancelReason) -> bool {
        let token = {
            let Ok(mut state) = self.state.lock() else {
                return false;
            };
            if reason == CancelReason::ClientGone {
                state.client_gone = true;
            }
            match state.running.take() {
                Some(token) => {
                    state.requested = Some(reason);
                    token
                }
                None => return false,
            }
        };
        tracing::info!(
            reason = reason.message(),
            "cancelling the upstream statement"
        );
        if let Err(e) = token.cancel_query(NoTls).await {
            tracing::warn!(error = %e, "cannot send the cancel request to the upstream");
        }
        true
    }

    /// Marks a statement as running on the connection of `token`.
    fn begin(&self, token: CancelToken) -> Result<Running<'_>> {
        let mut state = self
            .state
            .lock()
            .map_err(|_| Error::internal("cancel state poisoned"))?;
        if state.client_gone {
            return Err(Error::Canceled {
                reason: CancelReason::ClientGone.message().into(),
            });
        }
        state.running = Some(token);
        state.requested = None;
        Ok(Running {
            cancel: self,
            ended: false,
        })
    }
}

/// A statement running under a [`Cancel`]; [`Running::end`] says whether it was cancelled. If it
/// is dropped instead (the future running the statement was dropped), the statement is
/// cancelled on the upstream.
struct Running<'c> {
    cancel: &'c Cancel,
    ended: bool,
}

impl Running<'_> {
    /// The statement completed (or failed); returns why it was cancelled, if it was.
    fn end(mut self) -> Option<CancelReason> {
        self.ended = true;
        self.cancel.state.lock().ok().and_then(|mut state| {
            state.running = None;
            state.requested.take()
        })
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        let token = self
            .cancel
            .state
            .lock()
            .ok()
            .and_then(|mut state| state.running.take());
        if let (Some(token), Ok(runtime)) = (token, tokio::runtime::Handle::try_current()) {
            runtime.spawn(async move {
                let _ = token.cancel_query(NoTls).await;
            });
        }
    }
}

/// Whether `error` means the upstream connection is gone (closed, or the server shutting down or
/// restarting: SQLSTATE classes 08 and 57P), as opposed to a statement failing on a healthy one.
fn is_connection_error(error: &tokio_postgres::Error) -> bool {
    if error.is_closed() {
        return true;
    }
    match error.code() {
        None => error.as_db_error().is_none(),
        Some(code) => code.code().starts_with("08") || code.code().starts_with("57P"),
    }
}

fn first_value(messages: &[SimpleQueryMessage]) -> Option<String> {
    messages.iter().find_map(|m| match m {
        SimpleQueryMessage::Row(r) => r.get(0).map(str::to_string),
        _ => None,
    })
}

/// Why reading a DP statement's rows stopped early.
enum RowsFault {
    Db(tokio_postgres::Error),
    /// More than [`limits::UPSTREAM_ROWS_MAX`] rows.
    TooMany(Error),
}

impl From<tokio_postgres::Error> for RowsFault {
    fn from(e: tokio_postgres::Error) -> RowsFault {
        RowsFault::Db(e)
    }
}

/// Runs `batch` and converts each row to text as it arrives, so at most one copy of the rows
/// is held and reading stops at [`limits::UPSTREAM_ROWS_MAX`] rows instead of after buffering
/// whatever the upstream sends.
async fn stream_rows(client: &Client, batch: &str) -> std::result::Result<TextRows, RowsFault> {
    use futures_util::StreamExt;
    let stream = client.simple_query_raw(batch).await?;
    let mut stream = std::pin::pin!(stream);
    let mut rows = Vec::new();
    while let Some(message) = stream.next().await {
        if let SimpleQueryMessage::Row(r) = message? {
            if rows.len() >= limits::UPSTREAM_ROWS_MAX {
                return Err(RowsFault::TooMany(too_many_rows()));
            }
            rows.push((0..r.len()).map(|i| r.get(i).map(str::to_string)).collect());
        }
    }
    Ok(rows)
}

fn too_many_rows() -> Error {
    Error::LimitExceeded {
        what: "the number of candidate groups read from the upstream".into(),
        limit: limits::UPSTREAM_ROWS_MAX as u64,
    }
}

fn collect_rows(messages: &[SimpleQueryMessage]) -> Result<TextRows> {
    let mut rows = Vec::new();
    for m in messages {
        if let SimpleQueryMessage::Row(r) = m {
            if rows.len() >= limits::UPSTREAM_ROWS_MAX {
                return Err(too_many_rows());
            }
            rows.push((0..r.len()).map(|i| r.get(i).map(str::to_string)).collect());
        }
    }
    Ok(rows)
}

/// How long after a failed build of the shadow catalog the next catalog query tries again.
/// (A limit; it belongs in `limits.rs`, which this module's author does not own yet.)
const SHADOW_RETRY_MS: u64 = 2_000;

/// A catalog column: its name and the upstream type OID.
pub type CatalogColumns = Vec<(String, u32)>;

/// The shadow catalog: a database with the policy's schemas and tables (declared columns only,
/// with the upstream's column types) and no rows. Built by [`Shadow::ensure`], at start if the
/// upstream answers, else on the first catalog query after it is back.
#[derive(Debug)]
pub struct Shadow {
    upstream_dsn: String,
    policy: crate::policy::Policy,
    built: tokio::sync::OnceCell<Built>,
    /// When the last build failed, and how: builds are retried at most once per
    /// [`SHADOW_RETRY_MS`], so a permanent failure (no CREATEDB) costs little.
    failed: Mutex<Option<(Instant, Error)>>,
}

/// A built shadow catalog.
#[derive(Debug)]
struct Built {
    backend: Backend,
}

fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

impl Shadow {
    /// The shadow catalog of `policy` next to the upstream database, not built yet. Fails only if
    /// the DSN is invalid.
    pub fn new(upstream_dsn: &str, policy: &crate::policy::Policy) -> Result<Shadow> {
        Backend::new(upstream_dsn)?;
        Ok(Shadow {
            upstream_dsn: upstream_dsn.to_string(),
            policy: policy.clone(),
            built: tokio::sync::OnceCell::new(),
            failed: Mutex::new(None),
        })
    }

    /// Builds the shadow catalog unless it is built: [`Error::UpstreamUnavailable`] (57P03) while
    /// the upstream cannot be reached, [`Error::Unsupported`] (0A000) if it answers but the build
    /// fails (the role lacks CREATEDB).
    pub async fn ensure(&self) -> Result<()> {
        self.built().await.map(|_| ())
    }

    async fn built(&self) -> Result<&Built> {
        if let Some(built) = self.built.get() {
            return Ok(built);
        }
        if let Some((at, error)) = self.failed.lock().ok().and_then(|f| f.clone()) {
            if at.elapsed() < Duration::from_millis(SHADOW_RETRY_MS) {
                return Err(error);
            }
        }
        let result = self
            .built
            .get_or_try_init(|| build(&self.upstream_dsn, &self.policy))
            .await;
        // Only a build that failed on a reachable upstream is worth not retrying at once; while
        // the upstream is down, an attempt costs one refused connection.
        if let (Err(error), Ok(mut failed)) = (&result, self.failed.lock()) {
            if *error != Error::UpstreamUnavailable {
                *failed = Some((Instant::now(), error.clone()));
            }
        }
        result
    }
}

/// Creates (if needed) and rebuilds the shadow catalog of `policy` next to the upstream database.
/// Needs CREATEDB on the upstream role the first time.
async fn build(upstream_dsn: &str, policy: &crate::policy::Policy) -> Result<Built> {
    let built = build_once(upstream_dsn, policy).await;
    match built {
        Err(Error::UpstreamUnavailable) => {
            // Tell "down" from "up but refusing": only the former is worth waiting for.
            let probe = Backend::new(upstream_dsn)?;
            let reachable = probe.get().await.is_ok();
            Err(if reachable {
                no_shadow()
            } else {
                Error::UpstreamUnavailable
            })
        }
        other => other,
    }
}

/// The refusal of catalog queries when the shadow catalog cannot be built on a reachable upstream.
fn no_shadow() -> Error {
    Error::unsupported(
        "catalog queries on this server",
        "pgdp could not build its shadow catalog (the upstream role needs CREATEDB once); see the server log.",
    )
}

impl Shadow {
    /// The result columns of a catalog query, without running it.
    pub async fn describe(&self, sql: &str) -> Result<CatalogColumns> {
        self.built().await?.describe(sql).await
    }

    /// Runs a checked catalog query on the shadow database: its columns and text rows.
    /// `search_path` is the session's, already validated against the policy's schemas.
    pub async fn run(
        &self,
        sql: &str,
        search_path: &[String],
    ) -> Result<(CatalogColumns, TextRows)> {
        self.built().await?.run(sql, search_path).await
    }
}

async fn build_once(upstream_dsn: &str, policy: &crate::policy::Policy) -> Result<Built> {
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
                    p.unit_description(),
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
        statement_timeout_ms: AtomicU64::new(limits::STATEMENT_TIMEOUT_MS),
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
    Ok(Built { backend })
}

impl Built {
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
