//! Facts about columns that pgdp relies on (a column is unique, a column is never NULL): what
//! the upstream's catalog states, looked up on first need and remembered for the life of the
//! process, and the unique keys the policy declares where the catalog cannot hold them
//! (`unique_keys`: a partitioned table of foreign partitions), verified by reading the table.
//!
//! Invariants:
//! - A query over a table with a unit path is refused until every key of its path is known to
//!   be unique upstream (a row then belongs to exactly one unit).
//! - A fact is only ever used to pick between two rewrites that are both sound, or to refuse;
//!   a fact not known yet (the upstream is down, the lookup failed) leaves the general form.
//! - Only this module records a fact ([`CatalogFacts`] and [`ColumnFacts`] have no public
//!   writer): a catalog lookup's answer, or a declared key's verification. No other caller can
//!   mark a column unique or `NOT NULL`, which would lower a privacy cap.
//! - A catalog lookup reads the catalog only, never a row of any table. A declared key is
//!   trusted only after a read of its whole table found no value twice ([`DUPLICATES_SQL`]),
//!   at start, on every reload and on first need; that one bit goes to the operator (a start
//!   error, a refused reload, the log), and reaches an analyst only when the upstream could not
//!   be reached at start or reload (docs/privacy.md, "Facts pgdp reads from the upstream
//!   catalog").

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

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

/// Whether some non-NULL value of the column `{column}` of the table `{table}` (quoted
/// identifiers) appears in more than one row: the check of a key the policy declares unique
/// where the upstream's catalog cannot say so. Reads every row of the table (through a
/// coordinator, of every shard), in a read-only transaction under pgdp's statement timeout.
/// NULLs do not count, as for a UNIQUE constraint: a row whose key is NULL joins no other.
pub const DUPLICATES_SQL: &str = "SELECT EXISTS (SELECT 1 FROM {table} WHERE {column} IS NOT NULL \
     GROUP BY {column} HAVING pg_catalog.count(*) > 1)";

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
///
/// Only this module records a fact, from a lookup on the upstream; no caller can state one:
///
/// ```compile_fail,E0624
/// use pgdp::upstream::{CatalogFacts, ColumnFact};
/// let facts = CatalogFacts::default();
/// facts.record(ColumnFact::Unique, ("demo.visits".into(), "clinic".into()), true);
/// ```
///
/// while anyone may read what was learnt:
///
/// ```
/// use pgdp::upstream::{CatalogFacts, ColumnFact};
/// let facts = CatalogFacts::default();
/// assert!(!facts.holds(ColumnFact::Unique, &("demo.visits".into(), "clinic".into())));
/// ```
#[derive(Debug, Default)]
pub struct CatalogFacts {
    known: Mutex<BTreeMap<(ColumnFact, String, String), bool>>,
}

impl CatalogFacts {
    /// Whether `fact` is known to hold for `column` (false while unknown).
    pub fn holds(&self, fact: ColumnFact, (table, column): &(String, String)) -> bool {
        self.known
            .lock()
            .is_ok_and(|known| known.get(&(fact, table.clone(), column.clone())) == Some(&true))
    }

    /// Records what the upstream catalog says about one column (this module only: a fact can
    /// lower a privacy cap).
    fn record(&self, fact: ColumnFact, (table, column): (String, String), holds: bool) {
        if let Ok(mut known) = self.known.lock() {
            known.insert((fact, table, column), holds);
        }
    }

    /// What the catalog said about `fact` for one column, if it was looked up.
    fn known(&self, fact: ColumnFact, (table, column): &(String, String)) -> Option<bool> {
        self.known
            .lock()
            .ok()
            .and_then(|k| k.get(&(fact, table.clone(), column.clone())).copied())
    }
}

/// What pgdp knows about columns under one policy: the upstream catalog's facts
/// ([`CatalogFacts`], shared across reloads) and the unique keys the policy declares
/// (`unique_keys`) with what reading their tables found. Made afresh for each policy, so a
/// reload verifies its declarations again and a declaration it drops is no longer trusted.
#[derive(Debug, Default)]
pub struct ColumnFacts {
    catalog: Arc<CatalogFacts>,
    /// `(table, column)` the policy declares unique.
    declared: BTreeSet<(String, String)>,
    /// Declared keys the catalog does not state unique, and whether a read of the table found
    /// every non-NULL value once ([`DUPLICATES_SQL`]).
    verified: Mutex<BTreeMap<(String, String), bool>>,
}

impl ColumnFacts {
    /// The facts of a policy that declares `declared` unique, over the catalog facts learnt so
    /// far (none are verified yet).
    pub fn new(catalog: Arc<CatalogFacts>, declared: BTreeSet<(String, String)>) -> ColumnFacts {
        ColumnFacts {
            catalog,
            declared,
            verified: Mutex::default(),
        }
    }

    /// The catalog facts, to carry over to the next policy's [`ColumnFacts`].
    pub fn catalog(&self) -> Arc<CatalogFacts> {
        self.catalog.clone()
    }

    /// The keys the policy declares unique.
    pub fn declared(&self) -> &BTreeSet<(String, String)> {
        &self.declared
    }

    /// The columns among `columns` for which whether `fact` holds is not known yet: not looked
    /// up in the catalog, or (a unique key) declared by the policy, not stated by the catalog
    /// and not verified yet.
    pub fn unverified(
        &self,
        fact: ColumnFact,
        columns: &[(String, String)],
    ) -> Vec<(String, String)> {
        columns
            .iter()
            .filter(|key| match self.catalog.known(fact, key) {
                None => true,
                Some(true) => false,
                Some(false) => {
                    fact == ColumnFact::Unique
                        && self.declared.contains(key)
                        && self.verification(key).is_none()
                }
            })
            .cloned()
            .collect()
    }

    /// Whether `fact` is known to hold for `column` (false while unknown): stated by the
    /// catalog, or a declared unique key whose table was read and found to hold it.
    pub fn holds(&self, fact: ColumnFact, column: &(String, String)) -> bool {
        self.catalog.holds(fact, column)
            || (fact == ColumnFact::Unique
                && self.declared.contains(column)
                && self.verification(column) == Some(true))
    }

    /// What reading the table found for a declared key, if it was read.
    fn verification(&self, (table, column): &(String, String)) -> Option<bool> {
        self.verified
            .lock()
            .ok()
            .and_then(|v| v.get(&(table.clone(), column.clone())).copied())
    }

    /// Records what reading the table found for a declared key (this module only).
    fn record_verification(&self, key: (String, String), unique: bool) {
        if let Ok(mut verified) = self.verified.lock() {
            verified.insert(key, unique);
        }
    }

    /// Accepts a plan's unit-path keys only if every one is known to be unique.
    pub fn check_unique(&self, keys: &[(String, String)]) -> Result<()> {
        for key in keys {
            let (table, column) = key;
            if self.holds(ColumnFact::Unique, key) {
                continue;
            }
            let declared = self.declared.contains(key);
            match (self.catalog.known(ColumnFact::Unique, key), declared) {
                (Some(false), true) if self.verification(key) == Some(false) => {
                    return Err(Error::forbidden(
                        format!(
                            "the unit path through {table}.{column} is unsound: the policy declares {column} unique in {table}, but the upstream holds a value of it twice"
                        ),
                        format!(
                            "A row must belong to at most one privacy unit. The data team must remove the duplicate values of {table}.{column} and reload pgdp, or drop it from the table's unique_keys; until then tables whose unit path uses it cannot be queried."
                        ),
                    ))
                }
                (Some(false), false) => {
                    return Err(Error::forbidden(
                        format!(
                            "the unit path through {table}.{column} is unsound: {column} is not unique in {table} on the upstream"
                        ),
                        format!(
                            "A row must belong to at most one privacy unit. The data owner must declare a PRIMARY KEY or UNIQUE constraint on {table} ({column}) and restart pgdp, or, where PostgreSQL cannot hold one (a partitioned table of foreign partitions), list {column} in the policy's unique_keys of {table}, which pgdp verifies; until then tables whose unit path uses it cannot be queried."
                        ),
                    ))
                }
                _ => {
                    return Err(Error::unsupported(
                        format!(
                            "a table whose unit path uses {table}.{column} before pgdp has verified that {column} is unique"
                        ),
                        "pgdp checks the upstream catalog for a PRIMARY KEY or UNIQUE constraint (or reads the table, for a key the policy declares unique) when it can reach the upstream; retry when the upstream is available.",
                    ))
                }
            }
        }
        Ok(())
    }
}

impl crate::dp::plan::seal::Sealed for ColumnFacts {}

/// The facts a plan may rely on are those this module verified.
impl crate::dp::plan::UpstreamFacts for ColumnFacts {
    fn unique(&self, column: &(String, String)) -> bool {
        self.holds(ColumnFact::Unique, column)
    }
    fn not_null(&self, column: &(String, String)) -> bool {
        self.holds(ColumnFact::NotNull, column)
    }
}

impl Upstream {
    /// Verifies on the upstream that every key a plan's unit paths rely on is unique (the
    /// catalog, [`UNIQUE_KEY_SQL`], or for a key the policy declares, a read of its table),
    /// looking up only keys `facts` has no answer for, and refuses the plan unless all are
    /// ([`ColumnFacts::check_unique`]). 57P03 while the upstream cannot be reached; nothing is
    /// charged either way.
    pub async fn verify_unique_keys(
        &self,
        facts: &ColumnFacts,
        keys: &[(String, String)],
    ) -> Result<()> {
        for (table, column) in self
            .learn_column_facts(facts, ColumnFact::Unique, keys)
            .await?
        {
            tracing::error!(%table, %column, "unit path key is not unique upstream: queries of tables whose path uses it are refused");
        }
        facts.check_unique(keys)
    }

    /// Verifies every key the policy declares unique that the catalog does not state unique,
    /// by reading its table ([`DUPLICATES_SQL`]), and returns those that hold a value twice. Run
    /// at start and before a reload's policy is put in force; 57P03 while the upstream cannot
    /// be reached (the keys are then verified on first need).
    pub async fn verify_declared_keys(&self, facts: &ColumnFacts) -> Result<Vec<(String, String)>> {
        let declared: Vec<(String, String)> = facts.declared().iter().cloned().collect();
        let started = std::time::Instant::now();
        let fails = self
            .learn_column_facts(facts, ColumnFact::Unique, &declared)
            .await?;
        if !declared.is_empty() {
            tracing::info!(
                keys = declared.len(),
                duplicated = fails.len(),
                elapsed_ms = started.elapsed().as_millis() as u64,
                "verified the policy's declared unique keys"
            );
        }
        Ok(fails)
    }

    /// Looks up whether `fact` holds for each of `columns` that `facts` has no answer for: in
    /// the upstream catalog, and for a unique key the catalog does not state and the policy
    /// declares, by reading its table. Records the answers in `facts` and returns the columns
    /// for which it does not hold. 57P03 while the upstream cannot be reached.
    pub async fn learn_column_facts(
        &self,
        facts: &ColumnFacts,
        fact: ColumnFact,
        columns: &[(String, String)],
    ) -> Result<Vec<(String, String)>> {
        let unverified = facts.unverified(fact, columns);
        let mut fails = Vec::new();
        if unverified.is_empty() {
            return Ok(fails);
        }
        let mut conn = self.get().await?;
        let mut to_read = Vec::new();
        for (table, column) in unverified {
            let key = (table, column);
            let holds = match facts.catalog.known(fact, &key) {
                Some(holds) => holds,
                None => {
                    let qualified = super::quoted_table(&key.0)?;
                    let row = conn
                        .client()
                        .query_one(fact.sql(), &[&qualified, &key.1])
                        .await;
                    match row.and_then(|r| r.try_get::<_, bool>(0)) {
                        Ok(holds) => {
                            facts.catalog.record(fact, key.clone(), holds);
                            holds
                        }
                        Err(e) => {
                            conn.discard();
                            tracing::warn!(error = %e, ?fact, "catalog fact lookup");
                            return Err(Error::UpstreamUnavailable);
                        }
                    }
                }
            };
            if holds {
                continue;
            }
            if fact == ColumnFact::Unique && facts.declared.contains(&key) {
                to_read.push(key);
            } else {
                fails.push(key);
            }
        }
        drop(conn);
        for key in to_read {
            if facts.verification(&key).is_none() {
                let unique = self.read_for_duplicates(&key).await?;
                facts.record_verification(key.clone(), unique);
                if !unique {
                    tracing::error!(table = %key.0, column = %key.1, "the policy declares this key unique, but the upstream holds a value of it twice");
                }
            }
            if facts.verification(&key) != Some(true) {
                fails.push(key);
            }
        }
        Ok(fails)
    }

    /// Whether every non-NULL value of a declared key appears once ([`DUPLICATES_SQL`]).
    async fn read_for_duplicates(&self, (table, column): &(String, String)) -> Result<bool> {
        let sql = DUPLICATES_SQL
            .replace("{table}", &super::quoted_table(table)?)
            .replace("{column}", &format!("\"{}\"", column.replace('"', "\"\"")));
        let rows = self
            .get()
            .await?
            .run_read_only(&sql, "", &super::Cancel::default())
            .await?;
        match rows.first().and_then(|row| row.first()) {
            Some(Some(duplicated)) => Ok(duplicated == "f"),
            _ => Err(Error::internal("the duplicate check returned no row")),
        }
    }
}
