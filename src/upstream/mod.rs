//! The upstream PostgreSQL: a small pool of tokio-postgres connections, and the one way pgdp
//! runs SQL there.
//!
//! Invariants:
//! - The only ways to run SQL on the upstream database from outside this module are
//!   [`Pooled::run_release_query`], which takes a rewrite's [`Statement`] bound to the receipt of
//!   the durable charge of its own cost ([`Charged`], by value: one charge, one run) and returns
//!   [`PrivateRows`] that only the release can read; [`Upstream::run_public_query`], which takes
//!   [`PublicSql`] over a public table; and the fixed lookups of [`catalog_facts`]. The
//!   pooled client itself is private to this module.
//! - Each runs as one `READ ONLY` transaction with a `statement_timeout` of
//!   [`limits::STATEMENT_TIMEOUT_MS`], reading at most [`limits::UPSTREAM_ROWS_MAX`] rows; a
//!   rewrite in the partitionwise shape ([`crate::dp::rewrite::UpstreamSql::partitionwise`]) also turns on
//!   partitionwise aggregation and joins for its transaction ([`partitioning`]).
//! - Upstream error text is never returned: it can contain row values. It is logged here (at
//!   `warn`) and the caller receives [`Error::Upstream`], [`Error::Canceled`] or
//!   [`Error::UpstreamUnavailable`], whose messages are fixed.
//! - A connection that saw an error is discarded, never returned to the pool mid-transaction.
//! - A connection is returned to the pool only after a statement completed on it and no cancel
//!   was sent for it: a late `CancelRequest` can therefore only reach a connection nobody uses.
//! - Read replicas ([`standby`]), when configured, run DP and public-table queries in turn while
//!   healthy, and the shadow catalog's reads once they have replayed its build ([`shadow`]);
//!   the primary runs everything else and is the fallback. A DP statement whose standby
//!   connection dies is run once more on the primary (only the released answer leaves pgdp, so
//!   running it twice reveals nothing).
//! - An unreachable upstream is never fatal: every call connects anew when the pool has no live
//!   connection, so pgdp serves again as soon as the upstream is back. The shadow catalog is
//!   built on first use if it could not be built at start ([`Shadow::ensure`]).
//!
//! The order "charge, then run, then release" is therefore the only one that compiles, and the
//! charge is the statement's own:
//!
//! ```no_run
//! # use pgdp::budget::{Ledger, Limit};
//! # use pgdp::dp::release::{self, Mechanisms, Statement};
//! # use pgdp::dp::rewrite::Rewrite;
//! # use pgdp::upstream::{Cancel, Upstream};
//! # async fn run(upstream: &Upstream, ledger: &Ledger, rewrite: &Rewrite, mechanisms: &Mechanisms,
//! #               limit: &Limit, cancel: &Cancel) -> pgdp::Result<release::PrivateRows> {
//! let connection = upstream.get().await?;
//! let statement = Statement::of(rewrite, mechanisms);
//! let charged = ledger.charge_for("alice", limit, None, statement, "fingerprint", "laplace", &[]).await?;
//! let rows = connection.run_release_query(charged, "UTC", cancel).await?;
//! # Ok(rows) }
//! ```
//!
//! ```compile_fail,E0308
//! // Running a statement without its charge does not compile: a statement is not a charged one.
//! # use pgdp::dp::release::{self, Mechanisms, Statement};
//! # use pgdp::dp::rewrite::Rewrite;
//! # use pgdp::upstream::{Cancel, Upstream};
//! # async fn run(upstream: &Upstream, rewrite: &Rewrite, mechanisms: &Mechanisms,
//! #               cancel: &Cancel) -> pgdp::Result<release::PrivateRows> {
//! let connection = upstream.get().await?;
//! let statement = Statement::of(rewrite, mechanisms);
//! let rows = connection.run_release_query(statement, "UTC", cancel).await?;
//! # Ok(rows) }
//! ```
//!
//! ```compile_fail,E0382
//! // Nor does running one charge twice: the charged statement moves into the first run.
//! # use pgdp::budget::{Ledger, Limit};
//! # use pgdp::dp::release::{self, Mechanisms, Statement};
//! # use pgdp::dp::rewrite::Rewrite;
//! # use pgdp::upstream::{Cancel, Upstream};
//! # async fn run(upstream: &Upstream, ledger: &Ledger, rewrite: &Rewrite, mechanisms: &Mechanisms,
//! #               limit: &Limit, cancel: &Cancel) -> pgdp::Result<release::PrivateRows> {
//! let statement = Statement::of(rewrite, mechanisms);
//! let charged = ledger.charge_for("alice", limit, None, statement, "fingerprint", "laplace", &[]).await?;
//! let _ = upstream.get().await?.run_release_query(charged, "UTC", cancel).await?;
//! let rows = upstream.get().await?.run_release_query(charged, "UTC", cancel).await?;
//! # Ok(rows) }
//! ```
//!
//! ```compile_fail,E0624
//! // Nor does reaching the pooled client to run SQL of one's own.
//! # use pgdp::upstream::Upstream;
//! # async fn run(upstream: &Upstream) -> pgdp::Result<()> {
//! let connection = upstream.get().await?;
//! let _ = connection.client().simple_query("SELECT * FROM demo.people").await;
//! # Ok(()) }
//! ```

use std::sync::{Arc, Mutex};
use std::time::Duration;

use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_postgres::{Client, SimpleQueryMessage};

use crate::budget::{Charged, SynopsisPass};
use crate::dp::release::{ChoiceStatement, PrivateRows, Statement, TextRows};
use crate::dp::rewrite::PublicSql;
use crate::dsn::Dsn;
use crate::error::{Error, Result};
use crate::limits;

pub mod cancel;
pub mod catalog;
pub mod catalog_facts;
pub mod partitioning;
pub mod shadow;
pub mod standby;

pub use cancel::{Cancel, CancelReason};
pub use catalog_facts::{CatalogFacts, ColumnFact, ColumnFacts};
pub use partitioning::{Partitioning, Placement};
pub use shadow::Shadow;

/// The upstream database.
pub struct Upstream {
    dsn: Dsn,
    /// What this server is to pgdp, for logs.
    role: Role,
    idle: Mutex<Vec<Client>>,
    permits: Arc<Semaphore>,
    server_version: Mutex<Option<String>>,
    /// The `statement_timeout` of DP statements: [`limits::STATEMENT_TIMEOUT_MS`] until the
    /// policy's is set ([`Upstream::set_statement_timeout`]).
    statement_timeout_ms: AtomicU64,
    /// Streaming replicas serving reads ([`Upstream::get_for_read`]); none for a standby itself.
    standbys: Option<standby::Standbys>,
    /// The health endpoint's own connection ([`Upstream::ping`]), outside the pool, so a check
    /// never waits for a pooled connection while every one is busy.
    probe: tokio::sync::Mutex<Option<Client>>,
}

/// What a server is to pgdp, named in its log lines with its `host:port`
/// ([`crate::dsn::Dsn::endpoints`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// The upstream PostgreSQL (the primary).
    Upstream,
    /// A streaming replica of the upstream.
    Replica,
    /// The shadow catalog's database, on the upstream or a replica.
    ShadowCatalog,
}

impl Role {
    /// The name in log lines.
    fn name(self) -> &'static str {
        match self {
            Role::Upstream => "upstream",
            Role::Replica => "replica",
            Role::ShadowCatalog => "shadow catalog",
        }
    }
}

/// A pooled connection; returned to the pool when dropped unless marked broken.
pub struct Pooled<'a> {
    backend: &'a Upstream,
    client: Option<Client>,
    broken: bool,
    _permit: OwnedSemaphorePermit,
    /// For a connection to a standby: the primary and the standby's index, to fail over to.
    standby_of: Option<(&'a Upstream, usize)>,
}

impl Pooled<'_> {
    /// Runs a charged DP query's statement in a read-only transaction with pgdp's statement
    /// timeout, and returns its rows for the release alone to read. The charge is consumed with
    /// the statement it paid for (`Charged` binds them: a charge for one statement cannot run
    /// another), so a failure after this point keeps the charge and no charge runs twice.
    /// `cancel` can stop it from another task (a CancelRequest, the client going away).
    /// `time_zone` is the analyst's session `TimeZone`, under which PostgreSQL computes the
    /// same SQL (`date_trunc` of a date or a `timestamptz`, the text of a `timestamptz` key);
    /// [`time_zone_setting`] checks it.
    pub async fn run_release_query(
        self,
        charged: Charged<Statement>,
        time_zone: &str,
        cancel: &Cancel,
    ) -> Result<PrivateRows> {
        let (statement, receipt) = charged.into_parts();
        tracing::debug!(charge = %receipt.id(), "running a charged DP query upstream");
        let sql = statement.sql();
        // A rewrite in the partitionwise shape reads tables partitioned by their unit: the
        // planner may then aggregate (and join) per partition, on the shards that hold them.
        let mut settings = time_zone_setting(time_zone)?;
        if sql.partitionwise() {
            settings.push_str(PARTITIONWISE_SETTINGS);
        }
        self.run_read_only(sql.as_str(), &settings, cancel)
            .await
            .map(PrivateRows::new)
    }

    /// Runs the contribution histogram of a query that chooses its cap
    /// ([`crate::dp::rewrite::contributions`]), charged with the answer it chooses the cap for
    /// ([`ChoiceStatement`]): the charge is only borrowed here, and passes to the answer's
    /// statement through `Charged::narrowed`. Its rows are private like a release's.
    pub async fn run_choice_query(
        self,
        charged: &Charged<ChoiceStatement>,
        time_zone: &str,
        cancel: &Cancel,
    ) -> Result<PrivateRows> {
        tracing::debug!(charge = %charged.receipt().id(), "choosing a charged DP query's bounds upstream");
        let sql = charged.item().histogram();
        let mut settings = time_zone_setting(time_zone)?;
        if sql.partitionwise() {
            settings.push_str(PARTITIONWISE_SETTINGS);
        }
        self.run_read_only(sql.as_str(), &settings, cancel)
            .await
            .map(PrivateRows::new)
    }

    /// Runs a synopsis's private histogram ([`crate::dp::rewrite::synopsis::histogram`]) for
    /// an analyst who has paid for that synopsis: the [`SynopsisPass`], which only the ledger
    /// makes from a recorded payment, must name the route's synopsis. Its rows are private like
    /// a release's.
    pub async fn run_synopsis_query(
        self,
        pass: &SynopsisPass,
        route: &crate::dp::rewrite::synopsis::Route,
        time_zone: &str,
        cancel: &Cancel,
    ) -> Result<PrivateRows> {
        if pass.synopsis() != route.synopsis {
            return Err(Error::internal(
                "a synopsis read under another synopsis's pass",
            ));
        }
        tracing::debug!(synopsis = %route.synopsis, analyst = %pass.analyst(), "reading a synopsis's histogram upstream");
        let settings = time_zone_setting(time_zone)?;
        self.run_read_only(route.histogram.as_str(), &settings, cancel)
            .await
            .map(PrivateRows::new)
    }

    /// Runs one pgdp-generated SELECT in a read-only transaction with pgdp's statement timeout
    /// and the `SET LOCAL` statements in `settings` (pgdp's own text), and returns its rows in
    /// text format.
    async fn run_read_only(
        mut self,
        sql: &str,
        settings: &str,
        cancel: &Cancel,
    ) -> Result<TextRows> {
        let batch = format!(
            "BEGIN READ ONLY; SET LOCAL statement_timeout = {}; {settings}{sql}; COMMIT",
            self.backend.statement_timeout_ms.load(Ordering::Relaxed)
        );
        // Until the statement has completed, the connection is not returned to the pool: if this
        // future is dropped midway, the upstream may still be running the statement.
        self.broken = true;
        let mut reconnected = false;
        loop {
            let run = cancel.begin(self.backend.dsn.canceller(self.client()))?;
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
            tracing::warn!(
                error = %e,
                server = self.backend.role.name(),
                endpoint = %self.backend.dsn.endpoints(),
                "DP statement failed"
            );
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
            // The connection died (the upstream restarted, a standby went away): one more try
            // on a fresh one, on the primary if this was a standby. Running the statement twice
            // reveals nothing, since only the released answer leaves pgdp.
            if reconnected || requested.is_some() {
                return Err(Error::UpstreamUnavailable);
            }
            reconnected = true;
            if let Some((primary, index)) = self.standby_of.take() {
                if let Some(standbys) = &primary.standbys {
                    standbys.mark_down(index);
                }
                if let Some(dead) = self.client.take() {
                    drop(dead);
                }
                self.backend = primary;
            }
            self.client = Some(self.backend.connect().await?);
        }
    }

    /// The connection: private to this module, so no other module can run SQL of its own on the
    /// upstream.
    fn client(&self) -> &Client {
        // Invariant: `client` is Some from construction until drop.
        self.client
            .as_ref()
            .expect("pooled client present until drop")
    }

    /// Marks the connection as unusable (it will be closed instead of reused).
    fn discard(&mut self) {
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

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstream")
            .field("role", &self.role)
            .field("endpoint", &self.dsn.endpoints())
            .field("dbname", &self.dsn.config().get_dbname())
            .finish()
    }
}

/// A policy table's qualified name (`schema.table`) as a quoted identifier for the catalog
/// lookups (`"schema"."table"`, inner quotes doubled), to pass to `to_regclass`.
fn quoted_table(table: &str) -> Result<String> {
    let (schema, name) = table
        .split_once('.')
        .ok_or_else(|| Error::internal("unqualified table name"))?;
    Ok(format!(
        "\"{}\".\"{}\"",
        schema.replace('"', "\"\""),
        name.replace('"', "\"\"")
    ))
}

impl Upstream {
    /// A backend for the DSN (libpq URL or key=value, with `sslmode=verify-full` and
    /// `sslrootcert=` for verified TLS, see [`crate::dsn`]). Does not connect yet.
    pub fn new(dsn: &str) -> Result<Upstream> {
        let mut dsn = Dsn::parse(dsn).map_err(|e| {
            tracing::error!(error = %e, "invalid upstream DSN");
            Error::UpstreamUnavailable
        })?;
        dsn.config_mut()
            .connect_timeout(Duration::from_millis(limits::UPSTREAM_CONNECT_TIMEOUT_MS))
            .application_name("pgdp");
        Ok(Upstream::with_dsn(
            dsn,
            limits::UPSTREAM_POOL_SIZE,
            Role::Upstream,
        ))
    }

    /// A pool of at most `pool_size` connections for `dsn`, a server of that `role` (the shadow
    /// catalog uses this for its own database).
    fn with_dsn(dsn: Dsn, pool_size: usize, role: Role) -> Upstream {
        Upstream {
            dsn,
            role,
            idle: Mutex::new(Vec::new()),
            permits: Arc::new(Semaphore::new(pool_size)),
            server_version: Mutex::new(None),
            statement_timeout_ms: AtomicU64::new(limits::STATEMENT_TIMEOUT_MS),
            standbys: None,
            probe: tokio::sync::Mutex::new(None),
        }
    }

    /// The primary at `dsn` with streaming replicas at `standby_dsns` that serve DP and
    /// public-table queries while their replay lag is at most `lag_max_ms` (clamped to
    /// [`limits::STANDBY_LAG_MAX_RANGE_MS`]). Start [`Upstream::watch_standbys`] for them to be
    /// used. Does not connect yet.
    pub fn with_standbys(dsn: &str, standby_dsns: &[String], lag_max_ms: u64) -> Result<Upstream> {
        if standby_dsns.len() > limits::STANDBYS_MAX {
            return Err(Error::LimitExceeded {
                what: "the number of read replicas".into(),
                limit: limits::STANDBYS_MAX as u64,
            });
        }
        let mut primary = Upstream::new(dsn)?;
        if !standby_dsns.is_empty() {
            let servers = standby_dsns
                .iter()
                .map(|d| {
                    Upstream::new(d).map(|mut server| {
                        server.role = Role::Replica;
                        server
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            let (low, high) = limits::STANDBY_LAG_MAX_RANGE_MS;
            primary.standbys = Some(standby::Standbys::new(servers, lag_max_ms.clamp(low, high)));
        }
        Ok(primary)
    }

    /// Checks the standbys (health and replay lag) in the background until `upstream` is
    /// dropped; without standbys, does nothing.
    pub fn watch_standbys(upstream: &Arc<Upstream>) {
        if upstream.standbys.is_some() {
            tokio::spawn(standby::watch(Arc::downgrade(upstream)));
        }
    }

    /// Each standby's health as of the last check, by `host:port` (for logs and tests).
    pub fn standby_health(&self) -> Vec<(String, standby::Health)> {
        self.standbys.as_ref().map_or_else(Vec::new, |set| {
            (0..set.servers.len())
                .map(|i| (set.servers[i].dsn.endpoints(), set.health(i)))
                .collect()
        })
    }

    /// The standbys' DSNs and what the watcher finds out about them, for the shadow catalog,
    /// which reads its own database on the same servers; `None` without standbys.
    fn standby_servers(&self) -> Option<(Arc<standby::View>, Vec<Dsn>)> {
        self.standbys.as_ref().map(|set| {
            (
                set.view(),
                set.servers.iter().map(|s| s.dsn.clone()).collect(),
            )
        })
    }

    /// A connection for a DP or public-table query: a healthy standby in turn, else the
    /// primary. A standby whose connection fails is marked down and the next one is tried.
    pub async fn get_for_read(&self) -> Result<Pooled<'_>> {
        if let Some(set) = &self.standbys {
            for index in set.in_turn() {
                match set.servers[index].get().await {
                    Ok(mut pooled) => {
                        pooled.standby_of = Some((self, index));
                        return Ok(pooled);
                    }
                    Err(_) => set.mark_down(index),
                }
            }
        }
        self.get().await
    }

    /// Sets the statement timeout of DP statements to `ms` (the policy's
    /// `statement_timeout_s`, at start and at each reload; never above
    /// [`limits::STATEMENT_TIMEOUT_MAX_S`], never below 1 ms), on the primary and every standby.
    pub fn set_statement_timeout(&self, ms: u64) {
        let ms = ms.clamp(1, limits::STATEMENT_TIMEOUT_MAX_S * 1000);
        self.statement_timeout_ms.store(ms, Ordering::Relaxed);
        for standby in self.standbys.iter().flat_map(|s| &s.servers) {
            standby.set_statement_timeout(ms);
        }
    }

    /// The database name of the upstream DSN.
    pub fn dbname(&self) -> Option<&str> {
        self.dsn.config().get_dbname()
    }

    async fn connect(&self) -> Result<Client> {
        let client = self.dsn.connect(self.role.name()).await.map_err(|e| {
            tracing::warn!(
                error = %e,
                server = self.role.name(),
                endpoint = %self.dsn.endpoints(),
                "cannot connect"
            );
            Error::UpstreamUnavailable
        })?;
        if self.cached_server_version().is_none() {
            match client.simple_query("SHOW server_version").await {
                Ok(rows) => {
                    let version = first_value(&rows).unwrap_or_else(|| "15.0".into());
                    // Connections opened at once at start all get here; the first one to
                    // record the version logs it.
                    if let Ok(mut v) = self.server_version.lock() {
                        if v.is_none() {
                            tracing::info!(
                                server = self.role.name(),
                                endpoint = %self.dsn.endpoints(),
                                server_version = %version,
                                "reachable"
                            );
                            *v = Some(version);
                        }
                    }
                }
                Err(e) => tracing::warn!(
                    error = %e,
                    server = self.role.name(),
                    endpoint = %self.dsn.endpoints(),
                    "cannot read server_version"
                ),
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
            standby_of: None,
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

    /// Whether the upstream answers: `SELECT 1` on the health check's own connection (opened
    /// when it has none), for the health endpoint. Not a pooled connection: a check must not
    /// wait behind the queries holding the pool's permits, nor take one from them. A fixed
    /// statement that reads no table; checks run one at a time, and the connection is kept
    /// only if it answered.
    pub async fn ping(&self) -> Result<()> {
        let mut probe = self.probe.lock().await;
        // Taken out until it has answered: a dropped ping (its timeout) closes it.
        let client = match probe.take() {
            Some(client) if !client.is_closed() => client,
            _ => self.connect().await?,
        };
        match client.simple_query("SELECT 1").await {
            Ok(_) => {
                *probe = Some(client);
                Ok(())
            }
            Err(e) => {
                tracing::warn!(
                    error = %e,
                    server = self.role.name(),
                    endpoint = %self.dsn.endpoints(),
                    "health check failed"
                );
                Err(Error::UpstreamUnavailable)
            }
        }
    }

    /// The cached server version, if known (for ParameterStatus at startup, which cannot wait).
    pub fn cached_server_version(&self) -> Option<String> {
        self.server_version.lock().ok().and_then(|v| v.clone())
    }

    /// Runs SQL over a public table (no private data, so no charge), returning its text rows,
    /// with the transaction discipline of [`Pooled::run_release_query`], under the same
    /// `time_zone` as the DP query it completes (its keys' text must match that query's).
    pub async fn run_public_query(
        &self,
        sql: &PublicSql,
        time_zone: &str,
        cancel: &Cancel,
    ) -> Result<PublicRows> {
        let settings = time_zone_setting(time_zone)?;
        self.get_for_read()
            .await?
            .run_read_only(sql.as_str(), &settings, cancel)
            .await
            .map(PublicRows)
    }
}

/// The text rows of a [`PublicSql`]: values of public tables and literals only. Made only by
/// [`Upstream::run_public_query`], so rows sent as public rows come from public tables.
#[derive(Debug)]
pub struct PublicRows(TextRows);

impl PublicRows {
    /// The rows, as PostgreSQL's text output.
    pub fn into_text(self) -> TextRows {
        self.0
    }
}

/// `SET LOCAL TimeZone = '…'; ` for a session's time zone. The name is checked again here (the
/// session accepts only letters, digits and `/_+-:`, at most 64 of them), so nothing but a
/// zone name can reach the SQL text.
pub fn time_zone_setting(time_zone: &str) -> Result<String> {
    let plain = !time_zone.is_empty()
        && time_zone.len() <= 64
        && time_zone
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "/_+-:<>".contains(c));
    if !plain {
        return Err(Error::internal(
            "a session time zone that is not a plain name",
        ));
    }
    Ok(format!("SET LOCAL TimeZone = '{time_zone}'; "))
}

/// The settings of a DP statement in the partitionwise shape (each `SET LOCAL …; `): PostgreSQL
/// plans aggregates and joins per partition only when they are on (both are off by default).
const PARTITIONWISE_SETTINGS: &str =
    "SET LOCAL enable_partitionwise_aggregate = on; SET LOCAL enable_partitionwise_join = on; ";

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
