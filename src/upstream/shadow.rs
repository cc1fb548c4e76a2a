//! The shadow catalog: a schema-only database that pgdp builds from the policy and the upstream's
//! column types, holding no rows, where checked catalog queries run.
//!
//! Invariants:
//! - The shadow database holds no rows, so what a catalog query reads there reveals nothing
//!   about the private data; it runs only SQL that [`super::catalog::check`] admitted
//!   ([`super::catalog::CatalogSql`]), read-only, with a short timeout.
//! - An unreachable upstream is never fatal: the catalog is built on first use if it could not be
//!   built at start ([`Shadow::ensure`]).
//! - The build (CREATE DATABASE, DDL) runs on the primary; with read replicas, its reads
//!   (catalog queries, descriptions, post-processing) go to a replica in turn, with the primary
//!   as the fallback. A replica serves them only while it serves DP queries ([`super::standby`])
//!   and had replayed, at its last check, past the primary's WAL position read after the build
//!   committed, so it holds this build's DDL and never an older one. A read whose replica
//!   connection fails (or that a recovery conflict cancels) runs once more on the primary; the
//!   shadow holds no rows, so running it twice reveals nothing.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::dp::release::Evaluated;
use crate::dp::sql::ShadowSql;
use crate::error::{Error, Result};
use crate::limits;

use crate::output::{Cell, CellType, OutColumn};

use super::catalog::CatalogSql;
use super::standby::{self, View};
use super::Pooled;
use super::{collect_rows, is_connection_error, Dsn, Role, TextRows, Upstream};

/// The answer of a catalog query on the shadow catalog: columns with their type OIDs, and text
/// rows. Only [`Shadow::run`] makes one, so rows sent as catalog rows come from the shadow
/// database, which holds no rows of any table.
#[derive(Debug)]
pub struct CatalogRows {
    columns: Vec<OutColumn>,
    rows: TextRows,
}

impl CatalogRows {
    /// Columns and cells, to send (each value as text, typed by its catalog type OID).
    pub fn into_cells(self) -> (Vec<OutColumn>, Vec<Vec<Cell>>) {
        let rows = self
            .rows
            .into_iter()
            .map(|r| {
                r.into_iter()
                    .map(|c| c.map_or(Cell::Null, Cell::Text))
                    .collect()
            })
            .collect();
        (self.columns, rows)
    }
}

/// The shadow catalog: a database with the policy's schemas and tables (declared columns only,
/// with the upstream's column types) and no rows. Built by [`Shadow::ensure`], at start if the
/// upstream answers, else on the first catalog query after it is back.
#[derive(Debug)]
pub struct Shadow {
    upstream: Source,
    policy: crate::policy::Policy,
    built: tokio::sync::OnceCell<Built>,
    /// When the last build failed, and how: builds are retried at most once per
    /// [`limits::SHADOW_RETRY_MS`], so a permanent failure (no CREATEDB) costs little.
    failed: Mutex<Option<(Instant, Error)>>,
    /// Per analyst, the permits of [`limits::CATALOG_QUERIES_PER_ANALYST_MAX`] catalog queries
    /// at once. Keyed by authenticated analysts of the policy only, so its size is bounded.
    running: Mutex<std::collections::HashMap<String, Arc<tokio::sync::Semaphore>>>,
    /// PostgreSQL's result type OIDs of DP statements, by search path and text
    /// ([`Shadow::result_types`]); `None` where the shadow could not describe the statement.
    result_types: Mutex<ResultTypes>,
}

/// Described result types, keyed by the session's search path and the statement's text.
type ResultTypes = std::collections::HashMap<(Vec<String>, String), Option<Described>>;

/// A statement's parameter and result column types (OIDs), as PostgreSQL prepares it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Described {
    parameters: Vec<u32>,
    columns: Vec<u32>,
}

/// Where the shadow catalog lives: the primary's DSN (where it is built), and the read
/// replicas with the watcher's findings about them.
#[derive(Debug, Clone)]
struct Source {
    primary: Dsn,
    standbys: Option<(Arc<View>, Vec<Dsn>)>,
}

/// A built shadow catalog.
#[derive(Debug)]
struct Built {
    /// The shadow database on the primary.
    backend: Upstream,
    /// Its copies on the read replicas, if any.
    replicas: Option<Replicas>,
}

/// The shadow database on the read replicas, and how far each must have replayed to hold the
/// build.
#[derive(Debug)]
struct Replicas {
    view: Arc<View>,
    /// In the order of the standbys ([`View`]'s indexes).
    servers: Vec<Upstream>,
    /// The primary's `pg_current_wal_lsn()` read after the build committed.
    built_lsn: u64,
    /// Where the next read starts looking (round robin).
    next: AtomicUsize,
}

/// Why a read of the shadow on one server did not answer.
enum Failure {
    /// The server was lost (the connection failed or could not be had; `down`), or a recovery
    /// conflict on a replica cancelled the statement: worth one more try on the primary. The
    /// error is the one to return if this was the primary.
    Lost { error: Error, down: bool },
    /// The statement failed on a working server: the same on any server.
    Failed(Error),
}

impl Failure {
    /// `error` as a failure: `otherwise` unless it means the server was lost.
    fn of(error: &tokio_postgres::Error, otherwise: Error) -> Failure {
        if is_connection_error(error) {
            Failure::Lost {
                error: otherwise,
                down: true,
            }
        } else if error.code() == Some(&tokio_postgres::error::SqlState::T_R_SERIALIZATION_FAILURE)
        {
            // A hot standby cancels a query in the way of replaying WAL with 40001.
            Failure::Lost {
                error: otherwise,
                down: false,
            }
        } else {
            Failure::Failed(otherwise)
        }
    }

    /// A pooled connection could not be had.
    fn unreachable(error: Error) -> Failure {
        Failure::Lost { error, down: true }
    }

    fn into_error(self) -> Error {
        match self {
            Failure::Lost { error, .. } | Failure::Failed(error) => error,
        }
    }
}

fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

impl Shadow {
    /// The shadow catalog of `policy` next to the `upstream` database (built on the primary,
    /// read on its standbys while they have replayed the build), not built yet.
    pub fn new(upstream: &Upstream, policy: &crate::policy::Policy) -> Shadow {
        Shadow {
            upstream: Source {
                primary: upstream.dsn.clone(),
                standbys: upstream.standby_servers(),
            },
            policy: policy.clone(),
            result_types: Mutex::default(),
            built: tokio::sync::OnceCell::new(),
            failed: Mutex::new(None),
            running: Mutex::new(std::collections::HashMap::new()),
        }
    }

    /// The shadow catalog of another policy (after a reload) next to the same upstream database,
    /// not built yet. [`Shadow::ensure`] rebuilds the database only if the tables' DDL differs
    /// from the build it holds.
    pub fn for_policy(&self, policy: &crate::policy::Policy) -> Shadow {
        Shadow {
            upstream: self.upstream.clone(),
            policy: policy.clone(),
            result_types: Mutex::default(),
            built: tokio::sync::OnceCell::new(),
            failed: Mutex::new(None),
            running: Mutex::new(std::collections::HashMap::new()),
        }
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
            if at.elapsed() < Duration::from_millis(limits::SHADOW_RETRY_MS) {
                return Err(error);
            }
        }
        let result = self
            .built
            .get_or_try_init(|| build(&self.upstream, &self.policy))
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
async fn build(upstream: &Source, policy: &crate::policy::Policy) -> Result<Built> {
    let built = build_once(upstream, policy).await;
    match built {
        Err(Error::UpstreamUnavailable) => {
            // Tell "down" from "up but refusing": only the former is worth waiting for.
            let probe = Upstream::with_dsn(upstream.primary.clone(), 1, Role::Upstream);
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
    pub async fn describe(&self, sql: &CatalogSql) -> Result<Vec<OutColumn>> {
        self.built().await?.describe(sql.as_str()).await
    }

    /// PostgreSQL's result column types (OIDs) of a DP statement `sql` that pgdp's analysis
    /// admitted, as the shadow catalog describes it: prepared, never run, on tables with the
    /// upstream's column types and no rows, so the answer depends on the SQL and the schema
    /// only. `None` when the shadow cannot describe it (a pgdp-only function such as MEDIAN,
    /// the shadow unavailable); the caller then uses pgdp's own types. Remembered per search
    /// path and text, up to [`limits::RESULT_TYPES_CACHED_MAX`] statements.
    pub async fn result_types(&self, sql: &str, search_path: &[String]) -> Option<Vec<u32>> {
        Some(self.prepared_types(sql, search_path).await?.columns)
    }

    /// PostgreSQL's parameter types (OIDs, `$1` first) of a DP statement `sql`, as the shadow
    /// catalog prepares it (never run): for describing a statement that analysis can admit only
    /// with its parameters' values ([`crate::session::bind`]). `None` when the shadow cannot
    /// prepare it.
    pub async fn parameter_types(&self, sql: &str, search_path: &[String]) -> Option<Vec<u32>> {
        Some(self.prepared_types(sql, search_path).await?.parameters)
    }

    /// [`Shadow::result_types`] and [`Shadow::parameter_types`], remembered together.
    async fn prepared_types(&self, sql: &str, search_path: &[String]) -> Option<Described> {
        let key = (search_path.to_vec(), sql.to_string());
        if let Some(known) = self.result_types.lock().ok()?.get(&key) {
            return known.clone();
        }
        let described = match self.built().await {
            Ok(built) => built.prepared_types(sql, search_path).await,
            // Not built (yet): not remembered, so a later statement tries again.
            Err(_) => return None,
        };
        let mut cache = self.result_types.lock().ok()?;
        if cache.len() >= limits::RESULT_TYPES_CACHED_MAX {
            cache.clear();
        }
        cache.insert(key, described.clone());
        described
    }

    /// The answer's columns (names and types) of post-processing SQL
    /// ([`crate::dp::release::post::post_sql`]), prepared and never run; PostgreSQL's error if
    /// it does not prepare (an unknown function, a type mismatch …). Nothing is charged yet when
    /// this is called.
    pub async fn post_columns(&self, sql: &ShadowSql) -> Result<Vec<(String, u32, String)>> {
        self.built().await?.post_columns(sql.as_str()).await
    }

    /// Evaluates post-processing SQL over released values for `analyst` (sharing the
    /// analyst's permits of catalog queries) and returns its text rows, or PostgreSQL's error.
    /// SQL of pgdp's own ([`ShadowSql`]) is all it runs, and its answer is an [`Evaluated`],
    /// which nothing else makes.
    pub async fn evaluate(&self, analyst: &str, sql: &ShadowSql) -> Result<Evaluated> {
        let _permit = self.permit(analyst).await?;
        Ok(Evaluated::new(
            self.built().await?.evaluate(sql.as_str()).await?,
        ))
    }

    async fn permit(&self, analyst: &str) -> Result<tokio::sync::OwnedSemaphorePermit> {
        let permits = {
            let mut running = self
                .running
                .lock()
                .map_err(|_| Error::internal("catalog permits poisoned"))?;
            running
                .entry(analyst.to_string())
                .or_insert_with(|| {
                    Arc::new(tokio::sync::Semaphore::new(
                        limits::CATALOG_QUERIES_PER_ANALYST_MAX,
                    ))
                })
                .clone()
        };
        permits
            .acquire_owned()
            .await
            .map_err(|_| Error::internal("catalog permits closed"))
    }

    /// Runs a checked catalog query of `analyst` on the shadow database, at most
    /// [`limits::CATALOG_QUERIES_PER_ANALYST_MAX`] of the analyst's at once (others wait).
    /// `search_path` is the session's, already validated against the policy's schemas.
    pub async fn run(
        &self,
        analyst: &str,
        sql: &CatalogSql,
        search_path: &[String],
    ) -> Result<CatalogRows> {
        let _permit = self.permit(analyst).await?;
        let (columns, rows) = self.built().await?.run(sql.as_str(), search_path).await?;
        Ok(CatalogRows { columns, rows })
    }
}

async fn build_once(source: &Source, policy: &crate::policy::Policy) -> Result<Built> {
    let upstream = Upstream::with_dsn(
        source.primary.clone(),
        limits::UPSTREAM_POOL_SIZE,
        Role::Upstream,
    );
    let dbname = format!("{}_pgdp_catalog", upstream.dbname().unwrap_or("postgres"));
    let conn = upstream.get().await?;
    ensure_database(&conn, &dbname).await?;
    let ddl = shadow_ddl(&conn, policy).await?;
    drop(conn);
    let mut dsn = upstream.dsn.clone();
    dsn.config_mut().dbname(&dbname);
    let backend = Upstream::with_dsn(dsn, limits::SHADOW_POOL_SIZE, Role::ShadowCatalog);
    let built_lsn = run_build(&backend, &ddl, &dbname).await?;
    let replicas = match (&source.standbys, built_lsn) {
        (Some((view, dsns)), Some(built_lsn)) => Some(Replicas {
            view: view.clone(),
            servers: dsns
                .iter()
                .map(|dsn| {
                    let mut dsn = dsn.clone();
                    dsn.config_mut().dbname(&dbname);
                    Upstream::with_dsn(dsn, limits::SHADOW_POOL_SIZE, Role::ShadowCatalog)
                })
                .collect(),
            built_lsn,
            next: AtomicUsize::new(0),
        }),
        _ => None,
    };
    tracing::info!(database = %dbname, tables = policy.tables.len(), "shadow catalog ready");
    Ok(Built { backend, replicas })
}

/// The error of a failed step of the build, logged with `what` (the upstream's text stays in
/// the log).
fn shadow_fault(what: &'static str) -> impl FnOnce(tokio_postgres::Error) -> Error {
    move |e: tokio_postgres::Error| {
        tracing::warn!(error = %e, what, "shadow catalog");
        Error::UpstreamUnavailable
    }
}

/// Creates the shadow database `dbname` on the upstream unless it exists.
async fn ensure_database(conn: &Pooled<'_>, dbname: &str) -> Result<()> {
    let exists = conn
        .client()
        .query_opt(
            "SELECT 1 FROM pg_catalog.pg_database WHERE datname = $1",
            &[&dbname],
        )
        .await
        .map_err(shadow_fault("look up"))?
        .is_some();
    if !exists {
        let create = format!("CREATE DATABASE {}", quote_ident(dbname));
        if let Err(e) = conn.client().batch_execute(&create).await {
            // Another pgdp may have created it at the same moment: PostgreSQL says 42P04 when
            // the other creation had committed, and 23505 (a unique violation on
            // pg_database's name index) when both ran at once, as the processes of a fresh
            // deployment or test run do.
            let raced = [
                tokio_postgres::error::SqlState::DUPLICATE_DATABASE,
                tokio_postgres::error::SqlState::UNIQUE_VIOLATION,
            ];
            if !e.code().is_some_and(|code| raced.contains(code)) {
                return Err(shadow_fault("create database")(e));
            }
        }
    }
    Ok(())
}

/// The shadow catalog's DDL: the policy's schemas and tables with the upstream's column types,
/// NOT NULL and primary keys, pgdp's notes as comments, and the `pg_database` view.
async fn shadow_ddl(conn: &Pooled<'_>, policy: &crate::policy::Policy) -> Result<String> {
    // Column types as the upstream declares them.
    // Dropping the previous build's schemas cascades, with a NOTICE per schema that would only
    // clutter pgdp's log.
    // Schemas of an earlier build that the policy no longer lists (a reload or a restart with
    // a changed policy) go first, so the catalog shows only the policy's tables.
    let mut ddl = String::from(
        "DO $drop$ DECLARE s text; BEGIN \
         FOR s IN SELECT nspname FROM pg_catalog.pg_namespace \
         WHERE nspname NOT IN ('public', 'information_schema') AND nspname NOT LIKE 'pg\\_%' \
         LOOP EXECUTE pg_catalog.format('DROP SCHEMA %I CASCADE', s); END LOOP; END $drop$;",
    );
    for schema in policy.schemas() {
        ddl.push_str(&format!(
            "DROP SCHEMA IF EXISTS {0} CASCADE; CREATE SCHEMA {0};",
            quote_ident(&schema)
        ));
    }
    for table in policy.tables.values() {
        ddl.push_str(&table_ddl(conn, table).await?);
    }
    // pg_database as the analyst sees it: the database pgdp serves, under the policy's name
    // (catalog::check reads pg_database through this view), with the columns of the server's
    // version.
    let views = super::catalog::SHADOW_VIEWS_SCHEMA;
    ddl.push_str(&format!(
        "DROP SCHEMA IF EXISTS {views} CASCADE; CREATE SCHEMA {views}; \
         DO $view$ DECLARE columns text; BEGIN \
         SELECT pg_catalog.string_agg(CASE WHEN a.attname = 'datname' \
         THEN pg_catalog.format('%L::pg_catalog.name AS datname', {database}) \
         ELSE pg_catalog.format('d.%I', a.attname) END, ', ' ORDER BY a.attnum) INTO columns \
         FROM pg_catalog.pg_attribute a \
         WHERE a.attrelid = 'pg_catalog.pg_database'::pg_catalog.regclass AND a.attnum > 0 AND NOT a.attisdropped; \
         EXECUTE pg_catalog.format('CREATE VIEW {views}.pg_database AS SELECT %s FROM pg_catalog.pg_database d \
         WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database()', columns); END $view$;",
        database = crate::literal::dollar_quoted(&policy.database)
    ));
    Ok(ddl)
}

/// One table of the shadow catalog: `CREATE TABLE` with its comments.
async fn table_ddl(conn: &Pooled<'_>, table: &crate::policy::Table) -> Result<String> {
    let qualified = format!(
        "{}.{}",
        quote_ident(&table.schema),
        quote_ident(&table.name)
    );
    let rows = conn
            .client()
            .query(
                "SELECT a.attname, pg_catalog.format_type(a.atttypid, a.atttypmod), a.attnotnull \
                 FROM pg_catalog.pg_attribute a \
                 WHERE a.attrelid = pg_catalog.to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped",
                &[&qualified],
            )
            .await
            .map_err(shadow_fault("read column types"))?;
    // Upstream order first (attnum), then declared columns the upstream lacks.
    let upstream_types: Vec<(String, String)> = rows
        .iter()
        .map(|r| (r.get::<_, String>(0), r.get::<_, String>(1)))
        .collect();
    // NOT NULL as the upstream declares it (information_schema.columns.is_nullable, an
    // ORM's introspection): schema, like the types.
    let not_null: Vec<String> = rows
        .iter()
        .filter(|r| r.get::<_, bool>(2))
        .map(|r| r.get::<_, String>(0))
        .collect();
    // The primary key too (an ORM's describeTable, BI tools' joins), when every column of
    // it is declared: a fact of the schema, as NOT NULL is.
    let primary_key: Vec<String> = conn
        .client()
        .query(
            "SELECT a.attname FROM pg_catalog.pg_constraint c \
             CROSS JOIN LATERAL pg_catalog.unnest(c.conkey) WITH ORDINALITY AS k(attnum, n) \
             JOIN pg_catalog.pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.attnum \
             WHERE c.conrelid = pg_catalog.to_regclass($1) AND c.contype = 'p' ORDER BY k.n",
            &[&qualified],
        )
        .await
        .map_err(shadow_fault("read the primary key"))?
        .iter()
        .map(|r| r.get::<_, String>(0))
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
            let constraint = if not_null.contains(&c.name) {
                " NOT NULL"
            } else {
                ""
            };
            format!("{} {ty}{constraint}", quote_ident(&c.name))
        })
        .collect();
    let mut columns = columns;
    if !primary_key.is_empty() && primary_key.iter().all(|k| table.column(k).is_some()) {
        let key: Vec<String> = primary_key.iter().map(|k| quote_ident(k)).collect();
        columns.push(format!("PRIMARY KEY ({})", key.join(", ")));
    }
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
    Ok(format!(
        "CREATE TABLE {qualified} ({}); COMMENT ON TABLE {qualified} IS '{}';{column_notes}",
        columns.join(", "),
        note.replace('\'', "''")
    ))
}

/// Runs `ddl` on the shadow database unless another process's identical build is there, marks
/// the build, and returns the primary's WAL position after it (`None` when it cannot be read).
async fn run_build(backend: &Upstream, ddl: &str, dbname: &str) -> Result<Option<u64>> {
    // The database's comment names the build it holds: a process whose build is the same
    // (another pgdp with the same policy and upstream) leaves it alone instead of dropping and
    // recreating the schemas under the other processes' catalog queries.
    let mark = format!(
        "pgdp shadow catalog {}",
        crate::budget::fingerprint(&[SHADOW_BUILD_VERSION, ddl])
    );
    let mut shadow = backend.get().await?;
    let rebuilt = rebuild_unless_marked(shadow.client(), ddl, &mark).await;
    match rebuilt {
        Ok(false) => {}
        Ok(true) => {
            let comment = format!(
                "COMMENT ON DATABASE {} IS {}",
                quote_ident(dbname),
                crate::literal::dollar_quoted(&mark)
            );
            if let Err(e) = shadow.client().batch_execute(&comment).await {
                // Only costs the next process a rebuild.
                tracing::warn!(error = %e, "shadow catalog: cannot mark the build");
            }
        }
        Err(e) => {
            shadow.discard();
            return Err(shadow_fault("build")(e));
        }
    }
    // Read after the build committed (or after finding another process's build committed):
    // a replica that has replayed this far holds the build.
    match shadow
        .client()
        .query_one("SELECT pg_catalog.pg_current_wal_lsn()::text", &[])
        .await
    {
        Ok(row) => Ok(standby::parse_lsn(row.get::<_, &str>(0))),
        Err(e) => {
            tracing::warn!(error = %e, "shadow catalog: cannot read the primary's WAL position; its reads stay on the primary");
            Ok(None)
        }
    }
}

/// Bumped when the shape of the shadow catalog's DDL changes meaning without changing its text.
const SHADOW_BUILD_VERSION: &str = "2";

/// Under the build lock: runs `ddl` unless the database's comment already says `mark`; returns
/// whether it ran.
async fn rebuild_unless_marked(
    client: &tokio_postgres::Client,
    ddl: &str,
    mark: &str,
) -> std::result::Result<bool, tokio_postgres::Error> {
    client
        .batch_execute(
            // The commit is flushed before it returns (whatever the role's setting), so the WAL
            // position read after it covers the build ([`build_once`]).
            "BEGIN; SET LOCAL client_min_messages = warning; SET LOCAL synchronous_commit = on; \
             SELECT pg_advisory_xact_lock(7367626470);",
        )
        .await?;
    let current: Option<String> = client
        .query_one(
            "SELECT pg_catalog.shobj_description(oid, 'pg_database') FROM pg_catalog.pg_database \
             WHERE datname = pg_catalog.current_database()",
            &[],
        )
        .await?
        .get(0);
    if current.as_deref() == Some(mark) {
        client.batch_execute("COMMIT").await?;
        return Ok(false);
    }
    client.batch_execute(&format!("{ddl} COMMIT;")).await?;
    Ok(true)
}

impl Built {
    /// A replica to read on, in turn among those that serve and hold this build: its index and
    /// its shadow database's pool.
    fn replica(&self) -> Option<(usize, &Upstream)> {
        let replicas = self.replicas.as_ref()?;
        let holding = replicas.view.serving_past(replicas.built_lsn);
        if holding.is_empty() {
            return None;
        }
        let index = holding[replicas.next.fetch_add(1, Ordering::Relaxed) % holding.len()];
        Some((index, replicas.servers.get(index)?))
    }

    /// The outcome of a read on replica `index`: `Some` to return, `None` when the replica was
    /// lost and the read should run once more on the primary (the replica then serves nothing,
    /// DP queries included, until the watcher finds it back if its connection failed).
    fn settled<T>(
        &self,
        index: usize,
        replica: &Upstream,
        attempt: Attempt<T>,
    ) -> Option<Result<T>> {
        match attempt {
            Ok(answer) => Some(Ok(answer)),
            Err(Failure::Failed(error)) => Some(Err(error)),
            Err(Failure::Lost { down, .. }) => {
                tracing::info!(
                    standby = %replica.dsn.endpoints(),
                    down,
                    "shadow catalog read lost its replica: once more on the primary"
                );
                if let (true, Some(replicas)) = (down, &self.replicas) {
                    replicas.view.mark_down(index);
                }
                None
            }
        }
    }
}

/// Runs `$read(server, …)` on a replica that holds the build (in turn), else on the primary; a
/// read that loses its replica runs once more on the primary ([`Built::settled`]).
macro_rules! read {
    ($built:expr, $read:ident($($arg:expr),*)) => {{
        let built: &Built = $built;
        let mut done = None;
        if let Some((index, replica)) = built.replica() {
            done = built.settled(index, replica, $read(replica, $($arg),*).await);
        }
        match done {
            Some(done) => done,
            None => $read(&built.backend, $($arg),*)
                .await
                .map_err(Failure::into_error),
        }
    }};
}

impl Built {
    /// The result columns of a catalog query, without running it.
    async fn describe(&self, sql: &str) -> Result<Vec<OutColumn>> {
        read!(self, describe_on(sql))
    }

    /// [`Shadow::prepared_types`] on this shadow catalog.
    async fn prepared_types(&self, sql: &str, search_path: &[String]) -> Option<Described> {
        read!(self, prepared_types_on(sql, search_path)).ok()
    }

    /// Runs a checked catalog query on the shadow database: its columns and text rows.
    /// `search_path` is the session's, already validated against the policy's schemas.
    async fn run(&self, sql: &str, search_path: &[String]) -> Result<(Vec<OutColumn>, TextRows)> {
        read!(self, run_on(sql, search_path))
    }

    /// [`Shadow::post_columns`] on this shadow catalog.
    async fn post_columns(&self, sql: &str) -> Result<Vec<(String, u32, String)>> {
        read!(self, post_columns_on(sql))
    }

    /// [`Shadow::evaluate`] on this shadow catalog.
    async fn evaluate(&self, sql: &str) -> Result<TextRows> {
        read!(self, evaluate_on(sql))
    }
}

/// The answer of a read of the shadow database on one server.
type Attempt<T> = std::result::Result<T, Failure>;

/// The refusal of a catalog query the shadow cannot answer.
fn unanswerable() -> Error {
    Error::unsupported(
        "this catalog query",
        "pgdp's shadow catalog could not answer it.",
    )
}

/// [`Built::describe`] on `server`'s shadow database.
async fn describe_on(server: &Upstream, sql: &str) -> Attempt<Vec<OutColumn>> {
    let conn = server.get().await.map_err(Failure::unreachable)?;
    let statement = conn.client().prepare(sql).await.map_err(|e| {
        tracing::info!(error = %e, "catalog query does not prepare");
        Failure::of(&e, unanswerable())
    })?;
    Ok(statement
        .columns()
        .iter()
        .map(|c| OutColumn::new(c.name(), CellType::Raw(c.type_().oid())))
        .collect())
}

/// [`Shadow::result_types`] on `server`'s shadow database, in one round trip: the transaction's
/// setup, the Parse/Describe and the ROLLBACK are pipelined (tokio-postgres sends requests in
/// the order their futures are first polled, and `join!` polls them in order). A failed setup
/// makes the Parse fail in the aborted transaction, and the ROLLBACK ends it either way.
async fn prepared_types_on(
    server: &Upstream,
    sql: &str,
    search_path: &[String],
) -> Attempt<Described> {
    let mut conn = server.get().await.map_err(Failure::unreachable)?;
    let setup = format!(
        "BEGIN READ ONLY; SET LOCAL statement_timeout = {}; SET LOCAL search_path = {}",
        limits::CATALOG_STATEMENT_TIMEOUT_MS,
        path_list(search_path)
    );
    let client = conn.client();
    let (set, prepared, rolled_back) = tokio::join!(
        client.batch_execute(&setup),
        client.prepare(sql),
        client.simple_query("ROLLBACK"),
    );
    if rolled_back.is_err() {
        conn.discard();
    }
    match set.and(prepared) {
        Ok(statement) => Ok(Described {
            parameters: statement.params().iter().map(|t| t.oid()).collect(),
            columns: statement
                .columns()
                .iter()
                .map(|c| c.type_().oid())
                .collect(),
        }),
        Err(e) => {
            tracing::debug!(error = %e, "the shadow catalog does not describe a DP statement");
            Err(Failure::of(&e, unanswerable()))
        }
    }
}

/// [`Built::run`] on `server`'s shadow database.
async fn run_on(
    server: &Upstream,
    sql: &str,
    search_path: &[String],
) -> Attempt<(Vec<OutColumn>, TextRows)> {
    let columns = describe_on(server, sql).await?;
    let mut conn = server.get().await.map_err(Failure::unreachable)?;
    let batch = format!(
        "BEGIN READ ONLY; SET LOCAL statement_timeout = {}; SET LOCAL search_path = {}; {sql}; COMMIT",
        limits::CATALOG_STATEMENT_TIMEOUT_MS,
        path_list(search_path)
    );
    match conn.client().simple_query(&batch).await {
        Ok(messages) => Ok((columns, collect_rows(&messages).map_err(Failure::Failed)?)),
        Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::QUERY_CANCELED) => {
            settle(&mut conn).await;
            tracing::info!(error = %e, "catalog query timed out");
            Err(Failure::Failed(Error::Canceled {
                reason: format!(
                    "the {} ms timeout of catalog queries",
                    limits::CATALOG_STATEMENT_TIMEOUT_MS
                ),
            }))
        }
        Err(e) => {
            settle(&mut conn).await;
            tracing::info!(error = %e, "catalog query failed");
            // The shadow holds no data, so its error text is safe to summarise by code.
            Err(Failure::of(&e, unanswerable()))
        }
    }
}

/// PostgreSQL's error for post-processing SQL: its SQLSTATE and message (the shadow holds no
/// rows, and the SQL reads only released values and literals).
fn post_error(e: &tokio_postgres::Error) -> Error {
    match e.as_db_error() {
        // Function names are qualified with pg_catalog in that SQL; the analyst wrote them bare.
        Some(db) => Error::PostProcessing {
            state: db.code().clone(),
            message: db.message().replace("pg_catalog.", ""),
            hint: db.hint().map(str::to_string),
        },
        None => {
            tracing::warn!(error = %e, "post-processing on the shadow catalog");
            Error::UpstreamUnavailable
        }
    }
}

/// The transaction post-processing runs in: read-only, with the short timeout of catalog
/// queries, and only `pg_catalog` on the search path.
fn post_setup() -> String {
    format!(
        "BEGIN READ ONLY; SET LOCAL statement_timeout = {}; SET LOCAL search_path = pg_catalog",
        limits::POST_PROCESSING_TIMEOUT_MS
    )
}

/// [`Built::post_columns`] on `server`'s shadow database.
async fn post_columns_on(server: &Upstream, sql: &str) -> Attempt<Vec<(String, u32, String)>> {
    let mut conn = server.get().await.map_err(Failure::unreachable)?;
    let prepared = match conn.client().batch_execute(&post_setup()).await {
        Ok(()) => conn.client().prepare(sql).await,
        Err(e) => Err(e),
    };
    settle(&mut conn).await;
    let statement = prepared.map_err(|e| Failure::of(&e, post_error(&e)))?;
    Ok(statement
        .columns()
        .iter()
        .map(|c| {
            (
                c.name().to_string(),
                c.type_().oid(),
                c.type_().name().to_string(),
            )
        })
        .collect())
}

/// [`Built::evaluate`] on `server`'s shadow database.
async fn evaluate_on(server: &Upstream, sql: &str) -> Attempt<TextRows> {
    let mut conn = server.get().await.map_err(Failure::unreachable)?;
    let batch = format!("{}; {sql}; COMMIT", post_setup());
    match conn.client().simple_query(&batch).await {
        Ok(messages) => collect_rows(&messages).map_err(Failure::Failed),
        Err(e) => {
            settle(&mut conn).await;
            Err(Failure::of(&e, post_error(&e)))
        }
    }
}

/// A search path as the value of `SET search_path` (`public` when empty).
fn path_list(search_path: &[String]) -> String {
    if search_path.is_empty() {
        "public".to_string()
    } else {
        let quoted: Vec<String> = search_path.iter().map(|s| quote_ident(s)).collect();
        quoted.join(", ")
    }
}

/// After a catalog query or a description (and always after a failed one): waits until the shadow backend has finished with it (a
/// `ROLLBACK` is answered only after the failed batch's ReadyForQuery), so that the caller's
/// per-analyst permit is released only when the upstream no longer works for this query. The
/// error reaches tokio-postgres before the backend has aborted and gone idle; releasing the
/// permit then would let a third query start beside a second that is still running. A backend
/// that does not answer is closed instead of reused.
async fn settle(conn: &mut super::Pooled<'_>) {
    if conn.client().simple_query("ROLLBACK").await.is_err() {
        conn.discard();
    }
}
