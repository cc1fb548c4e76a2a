//! The demo dataset on a PostgreSQL sharded by privacy unit, for the tests and the shard bench:
//! a coordinator and N shards, each a throwaway [`Cluster`] started from the installed binaries.
//!
//! [`Shards::start_demo`] copies the demo dataset from a database that holds it (see
//! [`crate::tools::demo::load`]) into this layout, in database [`DATABASE`] on every server:
//!
//! - **On each shard** plain tables `demo.people` and `demo.visits` holding the rows whose
//!   `person_id` (the privacy unit of both) hashes to that shard, with their primary keys and an
//!   index on `visits.person_id`, and a copy of the public table `demo.regions`.
//! - **On the coordinator** `demo.people` and `demo.visits` hash-partitioned by `person_id`
//!   (`PARTITION BY HASH (person_id)`, modulus N), partition i a `postgres_fdw` foreign table on
//!   shard i (server `shard_<i>`, options `async_capable 'true'`, `fetch_size '10000'`,
//!   `use_remote_estimate 'true'` and `fdw_tuple_cost '0.1'`: without remote estimates the
//!   planner costs a join on a shard as a nested loop, and at the default cost of 0.01 per row
//!   fetched it finds a join of two shards' rows on the coordinator cheaper than their join and
//!   grouping on the shard; both then join on the coordinator); the
//!   public table `demo.regions` as a local copy; and `demo.prescriptions` as a local table only
//!   (it has no unit column: its unit is reached through `visits.visit_id`, which cannot be
//!   declared unique on a partitioned table with foreign partitions, so pgdp refuses it there
//!   unless the policy declares the key, `unique_keys`, and a read of the table confirms it).
//!
//! Rows are routed with PostgreSQL's own hash partitioning: the source computes
//! `satisfies_hash_partition` against a temporary table partitioned like the coordinator's, and
//! each shard's rows are streamed with `COPY … (FORMAT binary)`. [`Shards::start_demo`] then checks
//! every table's row count on the coordinator against the source, and that a lookup by
//! `person_id` (which the coordinator prunes to one partition) finds the person's row.
//!
//! The coordinator does not set `enable_partitionwise_aggregate` or `enable_partitionwise_join`
//! (both off by default): pgdp sets them for its own statements (`SET LOCAL`) when the tables a
//! query reads are partitioned by their unit.
//!
//! Errors are [`ShardsError`], local to this tool-side module like [`ClusterError`].

use tokio_postgres::Client;

use super::cluster::{Cluster, ClusterError, SUPERUSER};

/// The database created on the coordinator and on every shard.
pub const DATABASE: &str = super::demo::DATABASE;

/// The private tables partitioned by their privacy unit, with its column.
pub const SHARDED: [(&str, &str); 2] = [("people", "person_id"), ("visits", "person_id")];

/// Public tables: a copy on every shard and on the coordinator.
pub const PUBLIC: [&str; 1] = ["regions"];

/// Tables kept on the coordinator alone.
pub const COORDINATOR_ONLY: [&str; 1] = ["prescriptions"];

/// Most shards [`Shards::start_demo`] starts.
pub const SHARDS_MAX: usize = 16;

/// Why a sharded deployment could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ShardsError {
    /// A server could not be started.
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    /// A statement failed.
    #[error("setting up the shards failed while {step}: {source}")]
    Sql {
        /// What was being done.
        step: String,
        /// The database error.
        #[source]
        source: tokio_postgres::Error,
    },
    /// The copy does not hold what the source holds.
    #[error("the sharded copy is wrong: {0}")]
    Mismatch(String),
    /// The number of shards is 0 or above [`SHARDS_MAX`].
    #[error("the number of shards must be between 1 and {SHARDS_MAX}, got {0}")]
    InvalidCount(usize),
}

impl From<super::FailedStep> for ShardsError {
    fn from(failed: super::FailedStep) -> ShardsError {
        sql_error(failed.step)(failed.source)
    }
}

fn sql_error(step: impl Into<String>) -> impl FnOnce(tokio_postgres::Error) -> ShardsError {
    let step = step.into();
    move |source| ShardsError::Sql { step, source }
}

/// A coordinator and its shards, stopped and deleted when dropped (see [`Cluster`]).
#[derive(Debug)]
pub struct Shards {
    coordinator: Cluster,
    shards: Vec<Cluster>,
}

impl Shards {
    /// Starts a coordinator and `count` shards and copies the demo dataset from the database
    /// `source` is connected to into them (see the module documentation).
    pub async fn start_demo(source: &Client, count: usize) -> Result<Shards, ShardsError> {
        if count == 0 || count > SHARDS_MAX {
            return Err(ShardsError::InvalidCount(count));
        }
        let coordinator = Cluster::start().await?;
        let mut shards = Vec::with_capacity(count);
        for _ in 0..count {
            shards.push(Cluster::start().await?);
        }
        let deployment = Shards {
            coordinator,
            shards,
        };
        deployment.create_databases().await?;
        deployment.create_shard_tables().await?;
        deployment.copy_rows(source).await?;
        deployment.create_coordinator_tables().await?;
        deployment.check_against(source).await?;
        Ok(deployment)
    }

    /// The coordinator.
    pub fn coordinator(&self) -> &Cluster {
        &self.coordinator
    }

    /// The shards, shard i holding partition i (remainder i of modulus `shards().len()`).
    pub fn shards(&self) -> &[Cluster] {
        &self.shards
    }

    /// The DSN of [`DATABASE`] on the coordinator: what pgdp's `--upstream` names.
    pub fn dsn(&self) -> String {
        self.coordinator.dsn(DATABASE)
    }

    /// Hands every server to a watcher that stops it when this process exits
    /// ([`Cluster::stop_when_process_exits`]), for a deployment kept in a `static`.
    pub fn stop_when_process_exits(&self) -> Result<(), ClusterError> {
        self.coordinator.stop_when_process_exits()?;
        for shard in &self.shards {
            shard.stop_when_process_exits()?;
        }
        Ok(())
    }

    async fn create_databases(&self) -> Result<(), ShardsError> {
        for server in std::iter::once(&self.coordinator).chain(&self.shards) {
            let client = connect(&server.dsn("postgres")).await?;
            client
                .batch_execute(&format!("CREATE DATABASE {DATABASE}"))
                .await
                .map_err(sql_error("creating the database"))?;
        }
        Ok(())
    }

    /// On every shard: the demo's tables (its own DDL), without those kept on the coordinator.
    async fn create_shard_tables(&self) -> Result<(), ShardsError> {
        let drop_others: String = COORDINATOR_ONLY
            .iter()
            .map(|t| format!("DROP TABLE demo.{t};"))
            .collect();
        for shard in &self.shards {
            let client = connect(&shard.dsn(DATABASE)).await?;
            client
                .batch_execute(&format!(
                    "SET client_min_messages = warning; {} {drop_others}",
                    super::demo::schema_sql()
                ))
                .await
                .map_err(sql_error("creating the shard tables"))?;
        }
        Ok(())
    }

    /// Streams each shard's rows of the sharded tables, and the public tables, from `source`.
    async fn copy_rows(&self, source: &Client) -> Result<(), ShardsError> {
        let modulus = self.shards.len();
        source
            .batch_execute(
                "CREATE TEMPORARY TABLE IF NOT EXISTS __pgdp_shard_key (unit bigint) \
                 PARTITION BY HASH (unit)",
            )
            .await
            .map_err(sql_error("creating the routing table on the source"))?;
        for (remainder, shard) in self.shards.iter().enumerate() {
            let client = connect(&shard.dsn(DATABASE)).await?;
            for (table, unit) in SHARDED {
                let rows = format!(
                    "SELECT * FROM demo.{table} WHERE pg_catalog.satisfies_hash_partition(\
                     'pg_temp.__pgdp_shard_key'::regclass, {modulus}, {remainder}, {unit})"
                );
                copy(source, &rows, &client, table).await?;
            }
            for table in PUBLIC {
                copy(
                    source,
                    &format!("SELECT * FROM demo.{table}"),
                    &client,
                    table,
                )
                .await?;
            }
            client
                .batch_execute(
                    "ALTER TABLE demo.regions ADD PRIMARY KEY (region);
                     ALTER TABLE demo.people ADD PRIMARY KEY (person_id);
                     ALTER TABLE demo.visits ADD PRIMARY KEY (visit_id);
                     CREATE INDEX visits_person_id_idx ON demo.visits (person_id);
                     ANALYZE demo.regions; ANALYZE demo.people; ANALYZE demo.visits;",
                )
                .await
                .map_err(sql_error("indexing a shard"))?;
        }
        Ok(())
    }

    /// On the coordinator: the demo's tables, the sharded ones re-created as partitioned tables
    /// whose partitions are foreign tables on the shards; the others filled from the source.
    async fn create_coordinator_tables(&self) -> Result<(), ShardsError> {
        let client = connect(&self.dsn()).await?;
        let modulus = self.shards.len();
        let mut ddl = format!(
            "SET client_min_messages = warning; CREATE EXTENSION postgres_fdw; {}",
            super::demo::schema_sql()
        );
        for (i, shard) in self.shards.iter().enumerate() {
            ddl.push_str(&format!(
                "CREATE SERVER shard_{i} FOREIGN DATA WRAPPER postgres_fdw OPTIONS \
                 (host '127.0.0.1', port '{}', dbname '{DATABASE}', async_capable 'true', \
                 fetch_size '10000', use_remote_estimate 'true', fdw_tuple_cost '0.1');
                 CREATE USER MAPPING FOR PUBLIC SERVER shard_{i} OPTIONS (user '{SUPERUSER}');",
                shard.port()
            ));
        }
        for (table, unit) in SHARDED {
            ddl.push_str(&format!(
                "ALTER TABLE demo.{table} RENAME TO {table}_template;
                 CREATE TABLE demo.{table} (LIKE demo.{table}_template INCLUDING ALL)
                     PARTITION BY HASH ({unit});
                 DROP TABLE demo.{table}_template;"
            ));
            for i in 0..modulus {
                ddl.push_str(&format!(
                    "CREATE FOREIGN TABLE demo.{table}_shard_{i} PARTITION OF demo.{table} \
                     FOR VALUES WITH (MODULUS {modulus}, REMAINDER {i}) SERVER shard_{i} \
                     OPTIONS (schema_name 'demo', table_name '{table}');"
                ));
            }
        }
        client
            .batch_execute(&ddl)
            .await
            .map_err(sql_error("creating the coordinator's tables"))?;
        Ok(())
    }

    /// Fills the coordinator's local tables from `source`, then checks row counts and routing.
    async fn check_against(&self, source: &Client) -> Result<(), ShardsError> {
        let client = connect(&self.dsn()).await?;
        for table in PUBLIC.iter().chain(&COORDINATOR_ONLY) {
            copy(
                source,
                &format!("SELECT * FROM demo.{table}"),
                &client,
                table,
            )
            .await?;
        }
        client
            .batch_execute(
                "ALTER TABLE demo.regions ADD PRIMARY KEY (region);
                 ALTER TABLE demo.prescriptions ADD PRIMARY KEY (prescription_id);
                 CREATE INDEX prescriptions_visit_id_idx ON demo.prescriptions (visit_id);
                 ANALYZE demo.regions; ANALYZE demo.prescriptions;
                 ANALYZE demo.people; ANALYZE demo.visits;",
            )
            .await
            .map_err(sql_error("indexing the coordinator"))?;
        for table in SHARDED
            .iter()
            .map(|(t, _)| *t)
            .chain(PUBLIC)
            .chain(COORDINATOR_ONLY)
        {
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
                return Err(ShardsError::Mismatch(format!(
                    "demo.{table} has {here} rows on the coordinator and {there} on the source"
                )));
            }
        }
        // A lookup by the unit is pruned to one partition: it finds the row only if the row was
        // routed to the shard PostgreSQL's partitioning expects.
        let routed: i64 = client
            .query_one(
                "SELECT count(*) FROM generate_series(1, 50) AS g(id) \
                 WHERE EXISTS (SELECT 1 FROM demo.people p WHERE p.person_id = g.id)",
                &[],
            )
            .await
            .and_then(|r| r.try_get(0))
            .map_err(sql_error("looking people up by person_id"))?;
        let expected: i64 = source
            .query_one(
                "SELECT count(*) FROM demo.people WHERE person_id BETWEEN 1 AND 50",
                &[],
            )
            .await
            .and_then(|r| r.try_get(0))
            .map_err(sql_error("counting people on the source"))?;
        if routed != expected {
            return Err(ShardsError::Mismatch(format!(
                "{routed} of the first {expected} people are found by a pruned lookup"
            )));
        }
        Ok(())
    }
}

/// Streams the rows of `select` on `from` into `demo.<table>` on `to`, in COPY's binary format.
async fn copy(from: &Client, select: &str, to: &Client, table: &str) -> Result<(), ShardsError> {
    Ok(super::copy_rows(from, select, to, table, "(FORMAT binary)").await?)
}

/// Connects to `dsn` and drives the connection on the current runtime.
async fn connect(dsn: &str) -> Result<Client, ShardsError> {
    Ok(super::connect(dsn).await?)
}
