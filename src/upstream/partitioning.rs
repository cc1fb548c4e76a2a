//! How the upstream partitions the private tables: looked up in the upstream's catalog on first
//! need, remembered for the life of the process, and turned into the [`Placement`] of a query.
//!
//! A private table hash-partitioned by its privacy unit, its partitions `postgres_fdw` foreign
//! tables on several servers, is PostgreSQL's own sharding by unit (docs/scale-out.md). The
//! rewrite's per-unit stage groups by the unit, so with partitionwise aggregation PostgreSQL runs
//! it on every shard; [`Placement::ByUnit`] asks for that shape
//! ([`crate::dp::rewrite::partitionwise`]).
//!
//! Invariants:
//! - Partitioning never changes the result of a statement, only where its work runs: both
//!   shapes are correct on every partitioning, so what is learnt here chooses between two
//!   equivalent statements and never weakens a privacy argument. A table partitioned by anything
//!   other than its unit (another column, an expression, several columns) gets the single-server
//!   shape, in which no stage relies on where rows are ([`Placement::NotByUnit`]).
//! - The lookup reads the catalog only ([`PARTITION_KEY_SQL`], and on a Citus coordinator
//!   [`CITUS_SQL`] and [`DISTRIBUTION_SQL`]), never a row of any table; a failed lookup leaves
//!   the single-server shape and is tried again on the next query.
//!
//! On Citus (docs/scale-out.md) private tables distributed by their unit and co-located keep
//! the single-server shape, which Citus plans inside each worker's tasks where it can;
//! [`Placement::Distributed`] only lets EXPLAIN say where the per-unit stage runs.

use std::collections::BTreeMap;
use std::sync::Mutex;

use crate::dp::plan::Plan;
use crate::dp::rewrite::{lookup_on_shards, PerUnitStage, UpstreamShape};
use crate::error::{Error, Result};
use crate::policy::Policy;

use super::Upstream;

/// For table `$1` (a quoted qualified name): one row if it is a partitioned table, with the name
/// of its partition key column when the key is exactly one column (NULL for an expression or
/// several columns), and the key's definition (`HASH (person_id)`); no row if it is not
/// partitioned or does not exist. Reads the catalog only.
pub const PARTITION_KEY_SQL: &str = "SELECT CASE WHEN p.partnatts = 1 AND p.partattrs[0] <> 0 \
     THEN a.attname::text END, pg_catalog.pg_get_partkeydef(p.partrelid) \
     FROM pg_catalog.pg_partitioned_table p LEFT JOIN pg_catalog.pg_attribute a \
     ON a.attrelid = p.partrelid AND a.attnum = p.partattrs[0] \
     WHERE p.partrelid = pg_catalog.to_regclass($1)";

/// Whether the upstream is a Citus coordinator (its distribution catalog exists). Reads the
/// catalog only.
pub const CITUS_SQL: &str =
    "SELECT pg_catalog.to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL";

/// On a Citus coordinator, for table `$1` (a quoted qualified name): one row if Citus manages
/// it, with its distribution method (`h` hash, `n` a reference table, others) and for a hash
/// distributed table the name of its distribution column; no row for a local table. Reads the
/// catalog only.
pub const DISTRIBUTION_SQL: &str = "SELECT p.partmethod::text, CASE WHEN p.partmethod = 'h' \
     THEN pg_catalog.column_to_column_name(p.logicalrelid, p.partkey) END \
     FROM pg_catalog.pg_dist_partition p WHERE p.logicalrelid = pg_catalog.to_regclass($1)";

/// How the upstream partitions one table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PartitionKey {
    /// Not a partitioned table (on Citus: a local table of the coordinator).
    None,
    /// Partitioned by exactly this column.
    Column(String),
    /// Partitioned by an expression or by several columns (the key's definition, for the log).
    Other(String),
    /// On Citus: hash-distributed by exactly this column.
    Distributed(String),
    /// On Citus: a reference table, a copy on every node.
    Reference,
}

/// Where the per-unit work of a query can run, from the partitioning of the private tables it
/// reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    /// No private table of the query is partitioned (or its partitioning is not known yet): the
    /// single-server shape.
    Unpartitioned,
    /// Every partitioned private table of the query is partitioned by its privacy unit: the
    /// partitionwise shape, which lets PostgreSQL group each partition (each shard) by the unit.
    ByUnit {
        /// The tables partitioned by their unit.
        tables: Vec<String>,
    },
    /// A private table of the query is partitioned by something other than its unit (or it has
    /// no unit column): the single-server shape, which is correct on any partitioning.
    NotByUnit {
        /// The first such table.
        table: String,
    },
    /// On a Citus coordinator, every distributed private table of the query is distributed by
    /// its privacy unit: the distributed shape, which Citus runs in the workers' tasks as far
    /// as its planner can ([`crate::dp::rewrite::per_unit_stage_on_citus`] says how far).
    Distributed {
        /// The tables distributed by their unit.
        tables: Vec<String>,
        /// The first table the query reads that is neither distributed nor a reference table
        /// (a local table of the coordinator, which Citus sends to the workers), if any: the
        /// statement is then sent in the single-server shape. Citus 13.2 plans a local table
        /// read through a `NOT MATERIALIZED` CTE with some of its columns as NULL: `COUNT(DISTINCT
        /// drug)` of demo.prescriptions counted 0 values
        /// (`citus::the_distributed_shape_gives_the_rows_of_one_server`).
        local: Option<String>,
    },
}

impl Placement {
    /// The shape of the upstream statement for this placement.
    /// `plan` is the query's and `policy` names its tables' units (whether its lookup join, if
    /// any, can run on the shards: [`crate::dp::rewrite::lookup_on_shards`]).
    pub fn shape(&self, plan: &Plan, policy: &Policy) -> UpstreamShape {
        match self {
            Placement::ByUnit { tables } => UpstreamShape::Partitionwise {
                lookup_on_shards: lookup_on_shards(plan, tables, policy),
            },
            Placement::Distributed { local: None, .. } => UpstreamShape::Distributed,
            Placement::Distributed { local: Some(_), .. } => UpstreamShape::OneServer,
            Placement::Unpartitioned | Placement::NotByUnit { .. } => UpstreamShape::OneServer,
        }
    }

    /// One line for EXPLAIN, if the placement is worth a line, with where the per-unit stage of
    /// the statement can run (read from its text, [`crate::dp::rewrite::per_unit_stage`]). Names
    /// tables and SQL constructs only: the partition key of a table partitioned otherwise may be
    /// a column the policy does not declare.
    pub fn explain(&self, per_unit: Option<&PerUnitStage>) -> Option<String> {
        match self {
            Placement::Unpartitioned => None,
            Placement::ByUnit { tables } => {
                let tables = tables.join(", ");
                let settings = "enable_partitionwise_aggregate and enable_partitionwise_join set for this statement";
                Some(match per_unit {
                    Some(PerUnitStage::Coordinator { reason }) => format!(
                        "upstream: {tables} partitioned by the privacy unit ({settings}), but the per-unit stage runs on the coordinator: every row of stage 1 (those that pass the WHERE) crosses from the shards, because {reason}"
                    ),
                    None => format!(
                        "upstream: {tables} partitioned by the privacy unit ({settings}); pgdp cannot tell from the statement's text where its per-unit stage runs"
                    ),
                    Some(PerUnitStage::Shippable | PerUnitStage::ShippableWithValueStages) => format!(
                        "upstream: {tables} partitioned by the privacy unit ({settings}): the per-unit stage can run on each shard, since every expression in it ships; PostgreSQL's planner sends it where its estimates favour it, and then one row per unit and group crosses to the coordinator"
                    ),
                })
            }
            Placement::NotByUnit { table } => Some(format!(
                "upstream: {table} is partitioned, but not by its privacy unit: the single-server shape"
            )),
            Placement::Distributed { tables, .. } => {
                let tables = tables.join(", ");
                Some(match per_unit {
                    Some(PerUnitStage::Coordinator { reason }) => format!(
                        "upstream: Citus: {tables} distributed by the privacy unit, but {reason}"
                    ),
                    None => format!(
                        "upstream: Citus: {tables} distributed by the privacy unit; pgdp cannot tell from the statement's text where its per-unit stage runs"
                    ),
                    Some(PerUnitStage::Shippable) => format!(
                        "upstream: Citus: {tables} distributed by the privacy unit: the per-unit stage runs in the workers' tasks, each shard's rows grouped by the unit where they are, and partial aggregates per group cross to the coordinator"
                    ),
                    Some(PerUnitStage::ShippableWithValueStages) => format!(
                        "upstream: Citus: {tables} distributed by the privacy unit: the per-unit stage runs in the workers' tasks, each shard's rows grouped by the unit where they are, and partial aggregates per group cross to the coordinator; a distinct count's values or a quantile's bucket counts per group and task cross as distributed subplans"
                    ),
                })
            }
        }
    }
}

/// What pgdp knows about the partitioning of the policy's private tables on the upstream.
#[derive(Debug, Default)]
pub struct Partitioning {
    known: Mutex<BTreeMap<String, PartitionKey>>,
    /// Whether the upstream is a Citus coordinator ([`CITUS_SQL`]), once looked up.
    citus: Mutex<Option<bool>>,
}

impl Partitioning {
    /// The placement of a query reading `tables`: each a policy table with its unit column (None
    /// for a table whose unit is reached through a unit path). Tables not looked up yet count as
    /// unpartitioned.
    pub fn placement(&self, tables: &[(String, Option<String>)]) -> Placement {
        let Ok(known) = self.known.lock() else {
            return Placement::Unpartitioned;
        };
        let mut by_unit = Vec::new();
        let mut distributed = Vec::new();
        for (table, unit) in tables {
            match (known.get(table), unit) {
                (None | Some(PartitionKey::None | PartitionKey::Reference), _) => {}
                (Some(PartitionKey::Column(column)), Some(unit)) if column == unit => {
                    by_unit.push(table.clone());
                }
                (Some(PartitionKey::Distributed(column)), Some(unit)) if column == unit => {
                    distributed.push(table.clone());
                }
                (Some(_), _) => {
                    return Placement::NotByUnit {
                        table: table.clone(),
                    }
                }
            }
        }
        if !by_unit.is_empty() {
            Placement::ByUnit { tables: by_unit }
        } else if !distributed.is_empty() {
            Placement::Distributed {
                tables: distributed,
                local: None,
            }
        } else {
            Placement::Unpartitioned
        }
    }

    /// The first of `tables` that is neither distributed nor a Citus reference table (a local
    /// table of the coordinator, or one not looked up yet).
    pub fn first_local(&self, tables: &[String]) -> Option<String> {
        let Ok(known) = self.known.lock() else {
            return tables.first().cloned();
        };
        tables
            .iter()
            .find(|t| {
                !matches!(
                    known.get(*t),
                    Some(PartitionKey::Distributed(_) | PartitionKey::Reference)
                )
            })
            .cloned()
    }

    /// The tables among `tables` that are Citus reference tables.
    pub fn reference_tables(&self, tables: &[String]) -> Vec<String> {
        let Ok(known) = self.known.lock() else {
            return Vec::new();
        };
        tables
            .iter()
            .filter(|t| known.get(*t) == Some(&PartitionKey::Reference))
            .cloned()
            .collect()
    }

    /// The tables among `tables` not looked up yet.
    pub fn unknown(&self, tables: &[(String, Option<String>)]) -> Vec<String> {
        let Ok(known) = self.known.lock() else {
            return Vec::new();
        };
        tables
            .iter()
            .filter(|(t, _)| !known.contains_key(t))
            .map(|(t, _)| t.clone())
            .collect()
    }

    /// Records what the upstream catalog says about one table: only `upstream` learns it, from
    /// the catalog ([`Upstream::learn_partitioning`]).
    pub(super) fn record(&self, table: String, key: PartitionKey) {
        if let Ok(mut known) = self.known.lock() {
            known.insert(table, key);
        }
    }
}

impl Upstream {
    /// Looks up on the upstream catalog how each of `tables` (qualified policy names) is
    /// partitioned ([`PARTITION_KEY_SQL`]) and records it in `known`. Reads no rows of any table.
    /// A table partitioned by something other than one column is logged, once per process.
    /// 57P03 while the upstream cannot be reached.
    pub async fn learn_partitioning(&self, known: &Partitioning, tables: &[String]) -> Result<()> {
        if tables.is_empty() {
            return Ok(());
        }
        let mut conn = self.get().await?;
        let citus = match known.citus.lock().ok().and_then(|c| *c) {
            Some(citus) => citus,
            None => match conn.client().query_one(CITUS_SQL, &[]).await {
                Ok(row) => {
                    let citus: bool = row.try_get(0).unwrap_or(false);
                    if let Ok(mut known) = known.citus.lock() {
                        *known = Some(citus);
                    }
                    if citus {
                        tracing::info!("the upstream is a Citus coordinator");
                    }
                    citus
                }
                Err(e) => {
                    conn.discard();
                    tracing::warn!(error = %e, "Citus catalog lookup");
                    return Err(Error::UpstreamUnavailable);
                }
            },
        };
        for table in tables {
            let qualified = super::quoted_table(table)?;
            let rows = conn.client().query(PARTITION_KEY_SQL, &[&qualified]).await;
            let mut key = match rows {
                Ok(rows) => match rows.first() {
                    None => PartitionKey::None,
                    Some(row) => {
                        let column: Option<String> = row.try_get(0).unwrap_or(None);
                        let definition: String = row.try_get(1).unwrap_or_default();
                        match column {
                            Some(column) => PartitionKey::Column(column),
                            None => PartitionKey::Other(definition),
                        }
                    }
                },
                Err(e) => {
                    conn.discard();
                    tracing::warn!(error = %e, "partition key lookup");
                    return Err(Error::UpstreamUnavailable);
                }
            };
            if citus && key == PartitionKey::None {
                key = match conn.client().query(DISTRIBUTION_SQL, &[&qualified]).await {
                    Ok(rows) => match rows.first() {
                        None => PartitionKey::None,
                        Some(row) => {
                            let method: String = row.try_get(0).unwrap_or_default();
                            let column: Option<String> = row.try_get(1).unwrap_or(None);
                            match (method.as_str(), column) {
                                ("n", _) => PartitionKey::Reference,
                                ("h", Some(column)) => PartitionKey::Distributed(column),
                                (other, _) => PartitionKey::Other(format!(
                                    "Citus distribution method {other}"
                                )),
                            }
                        }
                    },
                    Err(e) => {
                        conn.discard();
                        tracing::warn!(error = %e, "Citus distribution lookup");
                        return Err(Error::UpstreamUnavailable);
                    }
                };
            }
            match &key {
                PartitionKey::None | PartitionKey::Reference => {}
                PartitionKey::Distributed(column) => {
                    tracing::info!(%table, %column, "upstream table is distributed by Citus")
                }
                PartitionKey::Column(column) => {
                    tracing::info!(%table, %column, "upstream table is partitioned")
                }
                PartitionKey::Other(definition) => {
                    tracing::warn!(%table, %definition, "upstream table is partitioned by an expression or several columns: queries of it keep the single-server shape")
                }
            }
            known.record(table.clone(), key);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tables(list: &[(&str, Option<&str>)]) -> Vec<(String, Option<String>)> {
        list.iter()
            .map(|(t, u)| (t.to_string(), u.map(str::to_string)))
            .collect()
    }

    #[test]
    fn a_table_partitioned_by_its_unit_is_placed_by_unit() {
        let known = Partitioning::default();
        known.record(
            "demo.visits".into(),
            PartitionKey::Column("person_id".into()),
        );
        known.record("demo.regions".into(), PartitionKey::None);
        let query = tables(&[("demo.visits", Some("person_id")), ("demo.regions", None)]);
        assert_eq!(
            known.placement(&query),
            Placement::ByUnit {
                tables: vec!["demo.visits".into()]
            }
        );
        assert!(known.unknown(&query).is_empty());
    }

    #[test]
    fn any_other_partitioning_keeps_the_single_server_shape() {
        let known = Partitioning::default();
        known.record(
            "demo.people".into(),
            PartitionKey::Column("person_id".into()),
        );
        known.record(
            "demo.visits".into(),
            PartitionKey::Column("visit_id".into()),
        );
        known.record(
            "demo.other".into(),
            PartitionKey::Other("HASH (a, b)".into()),
        );
        known.record(
            "demo.prescriptions".into(),
            PartitionKey::Column("visit_id".into()),
        );
        for query in [
            tables(&[
                ("demo.people", Some("person_id")),
                ("demo.visits", Some("person_id")),
            ]),
            tables(&[("demo.other", Some("a"))]),
            // A table with a unit path has no unit column to be partitioned by.
            tables(&[("demo.prescriptions", None)]),
        ] {
            assert!(
                matches!(known.placement(&query), Placement::NotByUnit { .. }),
                "{query:?}"
            );
        }
    }

    #[test]
    fn on_citus_tables_distributed_by_their_unit_are_placed_distributed() {
        let known = Partitioning::default();
        known.record(
            "demo.people".into(),
            PartitionKey::Distributed("person_id".into()),
        );
        known.record(
            "demo.visits".into(),
            PartitionKey::Distributed("person_id".into()),
        );
        known.record("demo.regions".into(), PartitionKey::Reference);
        known.record(
            "demo.other".into(),
            PartitionKey::Distributed("visit_id".into()),
        );
        let query = tables(&[
            ("demo.visits", Some("person_id")),
            ("demo.people", Some("person_id")),
            ("demo.regions", None),
        ]);
        assert_eq!(
            known.placement(&query),
            Placement::Distributed {
                tables: vec!["demo.visits".into(), "demo.people".into()],
                local: None,
            }
        );
        assert_eq!(
            known.reference_tables(&["demo.regions".into(), "demo.visits".into()]),
            vec!["demo.regions".to_string()]
        );
        // A local table of the coordinator (or one not looked up) is named.
        known.record("demo.prescriptions".into(), PartitionKey::None);
        let read = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
        assert_eq!(
            known.first_local(&read(&["demo.regions", "demo.visits"])),
            None
        );
        assert_eq!(
            known.first_local(&read(&["demo.visits", "demo.prescriptions"])),
            Some("demo.prescriptions".to_string())
        );
        assert_eq!(
            known.first_local(&read(&["demo.unknown"])),
            Some("demo.unknown".to_string())
        );
        assert!(matches!(
            known.placement(&tables(&[("demo.other", Some("person_id"))])),
            Placement::NotByUnit { .. }
        ));
        let line = Placement::Distributed {
            tables: vec!["demo.visits".into()],
            local: None,
        }
        .explain(Some(&PerUnitStage::Shippable))
        .expect("a line");
        assert!(line.starts_with("upstream: Citus: demo.visits"), "{line}");
    }

    #[test]
    fn unknown_and_unpartitioned_tables_keep_the_single_server_shape() {
        let known = Partitioning::default();
        known.record("demo.people".into(), PartitionKey::None);
        let query = tables(&[
            ("demo.people", Some("person_id")),
            ("demo.visits", Some("person_id")),
        ]);
        assert_eq!(known.placement(&query), Placement::Unpartitioned);
        assert_eq!(known.unknown(&query), vec!["demo.visits".to_string()]);
        assert_eq!(Placement::Unpartitioned.explain(None), None);
    }
}
