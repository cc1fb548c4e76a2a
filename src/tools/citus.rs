//! The demo dataset on Citus, for the Citus suite (`tests/integration/citus.rs`) and
//! docs/scale-out.md's recipe: a coordinator and N workers, each a throwaway [`Cluster`] started
//! from the installed binaries with `shared_preload_libraries = 'citus'`.
//!
//! Citus is not a Debian package: `.ci/setup-citus <source-dir>` builds and installs it from its
//! public source. Where it is not installed, [`Citus::start_demo`] returns
//! [`CitusError::NotInstalled`] (the suite then reports itself skipped), having started nothing
//! but one plain cluster to ask.
//!
//! [`Citus::start_demo`] copies the demo dataset from a database that holds it (see
//! [`crate::tools::demo::load`]) into database [`DATABASE`] on the coordinator, laid out as an
//! operator following docs/scale-out.md would:
//!
//! - `demo.people` and `demo.visits` **distributed by the privacy unit** `person_id` and
//!   co-located (`create_distributed_table(…, 'person_id', colocate_with => 'demo.people')`,
//!   [`SHARD_COUNT`] shards spread over the workers), so that a join on the unit and a grouping
//!   by it run inside each worker's tasks;
//! - `demo.regions` a **reference table** (a copy on every node);
//! - `demo.prescriptions` a **local table** of the coordinator: its unit is reached through
//!   `visits.visit_id`, and it has no `person_id` to be distributed by; Citus joins it with the
//!   distributed visits by sending its rows to the workers.
//!
//! Keys as Citus allows them: every unique constraint of a distributed table must include its
//! distribution column, so `demo.visits`' primary key is `(visit_id, person_id)` and the catalog
//! cannot say that `visit_id` alone is unique; a policy declares it (`unique_keys`), and pgdp
//! verifies it by reading the table. Rows are loaded with `COPY` through the coordinator, which
//! routes them to the shards, and then every table's row count is checked against the source.
//!
//! Errors are [`CitusError`], local to this tool-side module like [`ClusterError`].

use tokio_postgres::Client;

use super::cluster::{Cluster, ClusterError};

/// The database created on every node.
pub const DATABASE: &str = super::demo::DATABASE;

/// Shards per distributed table (Citus's default, `citus.shard_count`).
pub const SHARD_COUNT: u32 = 32;

/// Most workers [`Citus::start_demo`] starts.
pub const WORKERS_MAX: usize = 8;

/// The private tables distributed by their privacy unit, with its column, the first the one
/// the others are co-located with.
pub const DISTRIBUTED: [(&str, &str); 2] = [("people", "person_id"), ("visits", "person_id")];

/// Reference tables: a copy on every node.
pub const REFERENCE: [&str; 1] = ["regions"];

/// Tables local to the coordinator.
pub const COORDINATOR_ONLY: [&str; 1] = ["prescriptions"];

/// Every table of the demo, each once.
fn tables() -> impl Iterator<Item = &'static str> {
    DISTRIBUTED
        .iter()
        .map(|(t, _)| *t)
        .chain(REFERENCE)
        .chain(COORDINATOR_ONLY)
}

/// What every node's `postgresql.conf` gets.
const SETTINGS: &str = "shared_preload_libraries = 'citus'";

/// Why a Citus deployment could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum CitusError {
    /// The installed PostgreSQL has no `citus` extension.
    #[error("Citus is not installed for the PostgreSQL the tests start ({0}); build it with `bash .ci/setup-citus <citus-source-dir>`")]
    NotInstalled(String),
    /// A server could not be started.
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    /// A statement failed.
    #[error("setting up Citus failed while {step}: {detail}")]
    Sql {
        /// What was being done.
        step: String,
        /// The server's message, if it sent one.
        detail: String,
        /// The error.
        #[source]
        source: tokio_postgres::Error,
    },
    /// The copied data does not match the source.
    #[error("the Citus copy of the demo does not match its source: {0}")]
    Mismatch(String),
    /// An invalid number of workers.
    #[error("a Citus deployment has 1 to {WORKERS_MAX} workers, not {0}")]
    InvalidCount(usize),
}

impl From<super::FailedStep> for CitusError {
    fn from(failed: super::FailedStep) -> CitusError {
        sql_error(failed.step)(failed.source)
    }
}

fn sql_error(step: impl Into<String>) -> impl FnOnce(tokio_postgres::Error) -> CitusError {
    let step = step.into();
    move |source| CitusError::Sql {
        step,
        detail: source
            .as_db_error()
            .map_or_else(|| source.to_string(), |e| e.message().to_string()),
        source,
    }
}

/// A running Citus deployment; dropping it stops every node.
#[derive(Debug)]
pub struct Citus {
    coordinator: Cluster,
    workers: Vec<Cluster>,
}

impl Citus {
    /// Starts a coordinator and `workers` workers and copies the demo dataset from `source` into
    /// them (see the module documentation). [`CitusError::NotInstalled`] if the installed
    /// PostgreSQL has no `citus` extension.
    pub async fn start_demo(source: &Client, workers: usize) -> Result<Citus, CitusError> {
        if workers == 0 || workers > WORKERS_MAX {
            return Err(CitusError::InvalidCount(workers));
        }
        let coordinator = Cluster::start().await?;
        let available: bool = connect(&coordinator.dsn("postgres"))
            .await?
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_available_extensions WHERE name = 'citus')",
                &[],
            )
            .await
            .and_then(|r| r.try_get(0))
            .map_err(sql_error("looking for the citus extension"))?;
        if !available {
            return Err(CitusError::NotInstalled(
                "no citus extension in pg_available_extensions".into(),
            ));
        }
        coordinator.configure(SETTINGS).await?;
        let mut nodes = Vec::with_capacity(workers);
        for _ in 0..workers {
            let worker = Cluster::start().await?;
            worker.configure(SETTINGS).await?;
            nodes.push(worker);
        }
        let deployment = Citus {
            coordinator,
            workers: nodes,
        };
        deployment.create_databases().await?;
        deployment.create_tables().await?;
        deployment.copy_rows(source).await?;
        deployment.check_against(source).await?;
        Ok(deployment)
    }

    /// The coordinator.
    pub fn coordinator(&self) -> &Cluster {
        &self.coordinator
    }

    /// The workers.
    pub fn workers(&self) -> &[Cluster] {
        &self.workers
    }

    /// The DSN of [`DATABASE`] on the coordinator: what pgdp's `--upstream` names.
    pub fn dsn(&self) -> String {
        self.coordinator.dsn(DATABASE)
    }

    /// Hands every node to a watcher that stops it when this process exits
    /// ([`Cluster::stop_when_process_exits`]), for a deployment kept in a `static`.
    pub fn stop_when_process_exits(&self) -> Result<(), ClusterError> {
        self.coordinator.stop_when_process_exits()?;
        for worker in &self.workers {
            worker.stop_when_process_exits()?;
        }
        Ok(())
    }

    /// [`DATABASE`] with the extension on every node, and the workers added to the coordinator.
    async fn create_databases(&self) -> Result<(), CitusError> {
        for node in std::iter::once(&self.coordinator).chain(&self.workers) {
            connect(&node.dsn("postgres"))
                .await?
                .batch_execute(&format!("CREATE DATABASE {DATABASE}"))
                .await
                .map_err(sql_error("creating the database"))?;
            connect(&node.dsn(DATABASE))
                .await?
                .batch_execute("SET client_min_messages = warning; CREATE EXTENSION citus")
                .await
                .map_err(sql_error("creating the citus extension"))?;
        }
        let client = connect(&self.dsn()).await?;
        let mut nodes = format!(
            "SET client_min_messages = warning; SELECT pg_catalog.citus_set_coordinator_host('127.0.0.1', {});",
            self.coordinator.port()
        );
        for worker in &self.workers {
            nodes.push_str(&format!(
                "SELECT pg_catalog.citus_add_node('127.0.0.1', {});",
                worker.port()
            ));
        }
        client
            .batch_execute(&nodes)
            .await
            .map_err(sql_error("adding the workers"))
    }

    /// The demo's tables on the coordinator, distributed and referenced as the module says.
    async fn create_tables(&self) -> Result<(), CitusError> {
        let client = connect(&self.dsn()).await?;
        let mut ddl = format!(
            "SET client_min_messages = warning; SET citus.shard_count = {SHARD_COUNT}; {}",
            super::demo::schema_sql()
        );
        for table in REFERENCE {
            ddl.push_str(&format!(
                "SELECT pg_catalog.create_reference_table('demo.{table}');"
            ));
        }
        let (first, _) = DISTRIBUTED[0];
        for (table, unit) in DISTRIBUTED {
            let colocate = if table == first {
                String::new()
            } else {
                format!(", colocate_with => 'demo.{first}'")
            };
            ddl.push_str(&format!(
                "SELECT pg_catalog.create_distributed_table('demo.{table}', '{unit}'{colocate});"
            ));
        }
        client
            .batch_execute(&ddl)
            .await
            .map_err(sql_error("creating and distributing the tables"))
    }

    /// Every table's rows from `source`, through the coordinator; then the keys Citus allows.
    async fn copy_rows(&self, source: &Client) -> Result<(), CitusError> {
        let client = connect(&self.dsn()).await?;
        for table in tables() {
            copy(source, &client, table).await?;
        }
        // One statement at a time: Citus propagates each to the shards in a transaction of its
        // own.
        for statement in [
            "ALTER TABLE demo.regions ADD PRIMARY KEY (region)",
            "ALTER TABLE demo.people ADD PRIMARY KEY (person_id)",
            "ALTER TABLE demo.visits ADD PRIMARY KEY (visit_id, person_id)",
            "CREATE INDEX visits_person_id_idx ON demo.visits (person_id)",
            "ALTER TABLE demo.prescriptions ADD PRIMARY KEY (prescription_id)",
            "CREATE INDEX prescriptions_visit_id_idx ON demo.prescriptions (visit_id)",
            "ANALYZE demo.regions",
            "ANALYZE demo.people",
            "ANALYZE demo.visits",
            "ANALYZE demo.prescriptions",
        ] {
            client
                .batch_execute(statement)
                .await
                .map_err(sql_error(format!("adding the keys: {statement}")))?;
        }
        Ok(())
    }

    /// Checks every table's row count on the coordinator against the source, and that a
    /// lookup by the unit (routed to one shard) finds the person.
    async fn check_against(&self, source: &Client) -> Result<(), CitusError> {
        let client = connect(&self.dsn()).await?;
        for table in tables() {
            let count = format!("SELECT count(*) FROM demo.{table}");
            let here: i64 = client
                .query_one(count.as_str(), &[])
                .await
                .and_then(|r| r.try_get(0))
                .map_err(sql_error("counting on the coordinator"))?;
            let there: i64 = source
                .query_one(count.as_str(), &[])
                .await
                .and_then(|r| r.try_get(0))
                .map_err(sql_error("counting on the source"))?;
            if here != there {
                return Err(CitusError::Mismatch(format!(
                    "demo.{table} has {here} rows on the coordinator and {there} on the source"
                )));
            }
        }
        let found: i64 = client
            .query_one("SELECT count(*) FROM demo.people WHERE person_id = 7", &[])
            .await
            .and_then(|r| r.try_get(0))
            .map_err(sql_error("looking a person up by person_id"))?;
        if found != 1 {
            return Err(CitusError::Mismatch(format!(
                "a lookup of person 7 found {found} rows"
            )));
        }
        Ok(())
    }
}

/// Streams `demo.<table>` from `from` into the same table on `to` in COPY's text format (which
/// Citus routes row by row to the shards).
async fn copy(from: &Client, to: &Client, table: &str) -> Result<(), CitusError> {
    let select = format!("SELECT * FROM demo.{table}");
    Ok(super::copy_rows(from, &select, to, table, "").await?)
}

/// Connects to `dsn` and drives the connection on the current runtime.
async fn connect(dsn: &str) -> Result<Client, CitusError> {
    Ok(super::connect(dsn).await?)
}
