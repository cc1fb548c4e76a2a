//! Facts about columns that the upstream's catalog states (a column is unique, a column is
//! never NULL): looked up on first need, remembered for the life of the process.
//!
//! Invariants:
//! - A query over a table with a unit path is refused until every key of its path is known to
//!   be unique upstream (a row then belongs to exactly one unit).
//! - A fact is only ever used to pick between two rewrites that are both sound, or to refuse;
//!   a fact not known yet (the upstream is down, the lookup failed) leaves the general form.
//! - A lookup reads the catalog only, never a row of any table.

use std::collections::BTreeMap;
use std::sync::Mutex;

use crate::error::{Error, Result};

use super::Upstream;

/// Whether the upstream has a unique index (a PRIMARY KEY, a UNIQUE constraint or a unique
/// index) on exactly one column, `$2`, of the table `$1` (a quoted qualified name): not partial,
/// not on an expression, valid, and holding for every row a query of the table reads: a plain
/// table without inheritance children (a child of plain inheritance has no part in its
/// parent's index, and a query of the parent reads the child's rows too), or a partitioned
/// table (its unique index holds across its partitions). Run on the upstream database, whose
/// catalog it reads; it reads no rows of any table.
pub const UNIQUE_KEY_SQL: &str = "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_index i \
     JOIN pg_catalog.pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0] \
     JOIN pg_catalog.pg_class c ON c.oid = i.indrelid \
     WHERE i.indrelid = pg_catalog.to_regclass($1) AND i.indisunique AND i.indisvalid \
     AND (c.relkind = 'p' OR (c.relkind = 'r' AND NOT c.relhassubclass)) \
     AND i.indnkeyatts = 1 AND i.indpred IS NULL AND i.indexprs IS NULL AND a.attname = $2)";

/// Whether the column `$2` of the table `$1` (a quoted qualified name) is declared `NOT NULL`
/// (a `NOT NULL` constraint, or part of a PRIMARY KEY) so that no row a query of the table reads
/// can hold NULL there: a plain table without inheritance children (a child of plain
/// inheritance may drop the constraint, and a query of the parent reads its rows), or a
/// partitioned table (its partitions cannot drop it). A `CHECK (x IS NOT NULL)` does not count,
/// nor does any column of a view or a foreign table. Reads the catalog only.
pub const NOT_NULL_SQL: &str = "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_attribute a \
     JOIN pg_catalog.pg_class c ON c.oid = a.attrelid \
     WHERE a.attrelid = pg_catalog.to_regclass($1) \
     AND (c.relkind = 'p' OR (c.relkind = 'r' AND NOT c.relhassubclass)) \
     AND a.attname = $2 AND a.attnum > 0 AND NOT a.attisdropped AND a.attnotnull)";

/// A fact about one column of one table, as the upstream catalog states it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ColumnFact {
    /// The column is a single-column unique key ([`UNIQUE_KEY_SQL`]).
    Unique,
    /// The column is declared `NOT NULL` ([`NOT_NULL_SQL`]).
    NotNull,
}

impl ColumnFact {
    /// The catalog query that answers it for `($1 table, $2 column)`.
    fn sql(self) -> &'static str {
        match self {
            ColumnFact::Unique => UNIQUE_KEY_SQL,
            ColumnFact::NotNull => NOT_NULL_SQL,
        }
    }
}

/// What pgdp knows about columns of the upstream: for each fact, table and column, whether it
/// holds. A fact is looked up on the upstream the first time a query needs it
/// ([`Upstream::learn_column_facts`]); both answers are kept for the life of the process
/// (across policy reloads: they are facts about the upstream, not the policy), so a key found
/// not unique stays refused, and a column found NOT NULL is counted as such, until pgdp
/// restarts. docs/privacy.md ("Facts pgdp reads from the upstream catalog") says what a
/// change of the upstream's schema then needs.
#[derive(Debug, Default)]
pub struct CatalogFacts {
    known: Mutex<BTreeMap<(ColumnFact, String, String), bool>>,
}

impl CatalogFacts {
    /// The columns among `columns` for which `fact` is not known yet.
    pub fn unverified(
        &self,
        fact: ColumnFact,
        columns: &[(String, String)],
    ) -> Vec<(String, String)> {
        let Ok(known) = self.known.lock() else {
            return columns.to_vec();
        };
        columns
            .iter()
            .filter(|(t, c)| !known.contains_key(&(fact, t.clone(), c.clone())))
            .cloned()
            .collect()
    }

    /// Whether `fact` is known to hold for `column` (false while unknown).
    pub fn holds(&self, fact: ColumnFact, (table, column): &(String, String)) -> bool {
        self.known
            .lock()
            .is_ok_and(|known| known.get(&(fact, table.clone(), column.clone())) == Some(&true))
    }

    /// Records what the upstream catalog says about one column.
    pub fn record(&self, fact: ColumnFact, (table, column): (String, String), holds: bool) {
        if let Ok(mut known) = self.known.lock() {
            known.insert((fact, table, column), holds);
        }
    }

    /// Accepts a plan's unit-path keys only if every one is known to be unique.
    pub fn check_unique(&self, keys: &[(String, String)]) -> Result<()> {
        for (table, column) in keys {
            let known = self.known.lock().ok().and_then(|k| {
                k.get(&(ColumnFact::Unique, table.clone(), column.clone()))
                    .copied()
            });
            match known {
                Some(true) => {}
                Some(false) => {
                    return Err(Error::forbidden(
                        format!(
                            "the unit path through {table}.{column} is unsound: {column} is not unique in {table} on the upstream"
                        ),
                        format!(
                            "A row must belong to at most one privacy unit. The data owner must declare a PRIMARY KEY or UNIQUE constraint on {table} ({column}) and restart pgdp; until then tables whose unit path uses it cannot be queried."
                        ),
                    ))
                }
                None => {
                    return Err(Error::unsupported(
                        format!(
                            "a table whose unit path uses {table}.{column} before pgdp has verified that {column} is unique"
                        ),
                        "pgdp checks the upstream catalog for a PRIMARY KEY or UNIQUE constraint when it can reach the upstream; retry when the upstream is available.",
                    ))
                }
            }
        }
        Ok(())
    }
}

impl Upstream {
    /// Verifies on the upstream catalog that every key a plan's unit paths rely on is unique
    /// ([`UNIQUE_KEY_SQL`]), looking up only keys `known` has no answer for, and
    /// refuses the plan unless all are ([`CatalogFacts::check_unique`]). 57P03 while the
    /// upstream cannot be reached; nothing is charged either way.
    pub async fn verify_unique_keys(
        &self,
        known: &CatalogFacts,
        keys: &[(String, String)],
    ) -> Result<()> {
        for (table, column) in self
            .learn_column_facts(known, ColumnFact::Unique, keys)
            .await?
        {
            tracing::error!(%table, %column, "unit path key is not unique upstream: queries of tables whose path uses it are refused");
        }
        known.check_unique(keys)
    }

    /// Looks up on the upstream catalog whether `fact` holds for each of `columns` that `known`
    /// has no answer for, records the answers in `known`, and returns the columns for which it
    /// does not. Reads no rows of any table. 57P03 while the upstream cannot be reached.
    pub async fn learn_column_facts(
        &self,
        known: &CatalogFacts,
        fact: ColumnFact,
        columns: &[(String, String)],
    ) -> Result<Vec<(String, String)>> {
        let unverified = known.unverified(fact, columns);
        let mut fails = Vec::new();
        if unverified.is_empty() {
            return Ok(fails);
        }
        let mut conn = self.get().await?;
        for (table, column) in unverified {
            let qualified = super::quoted_table(&table)?;
            let row = conn
                .client()
                .query_one(fact.sql(), &[&qualified, &column])
                .await;
            match row.and_then(|r| r.try_get::<_, bool>(0)) {
                Ok(holds) => {
                    if !holds {
                        fails.push((table.clone(), column.clone()));
                    }
                    known.record(fact, (table, column), holds);
                }
                Err(e) => {
                    conn.discard();
                    tracing::warn!(error = %e, ?fact, "catalog fact lookup");
                    return Err(Error::UpstreamUnavailable);
                }
            }
        }
        Ok(fails)
    }
}
