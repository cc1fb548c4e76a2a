//! Which keys of unit paths the upstream declares unique: looked up in the upstream's catalog on
//! first need, remembered for the life of the process.
//!
//! Invariant: a query over a table with a unit path is refused until every key of its path is
//! known to be unique upstream (a row then belongs to exactly one unit); the lookup reads the
//! catalog only, never a row of any table.

use std::collections::BTreeMap;
use std::sync::Mutex;

use crate::error::{Error, Result};

use super::Upstream;

/// Whether the upstream has a unique index (a PRIMARY KEY, a UNIQUE constraint or a unique
/// index) on exactly one column, `$2`, of the table `$1` (a quoted qualified name): not partial,
/// not on an expression, valid. Run on the upstream database, whose catalog it reads; it reads
/// no rows of any table.
pub const UNIQUE_KEY_SQL: &str = "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_index i \
     JOIN pg_catalog.pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0] \
     WHERE i.indrelid = pg_catalog.to_regclass($1) AND i.indisunique AND i.indisvalid \
     AND i.indnkeyatts = 1 AND i.indpred IS NULL AND i.indexprs IS NULL AND a.attname = $2)";

/// What pgdp knows about the uniqueness of the keys of unit paths on the upstream
/// ([`crate::dp::plan::Plan::unique_keys`]). A key is looked up on the upstream the first time a
/// query needs it ([`crate::upstream::Upstream::verify_unique_keys`]); both answers are kept for
/// the life of the process, so a key found not unique stays refused until pgdp restarts.
/// Until a key is verified (e.g. while the upstream is down), queries that need it are refused.
#[derive(Debug, Default)]
pub struct UniqueKeys {
    known: Mutex<BTreeMap<(String, String), bool>>,
}

impl UniqueKeys {
    /// The keys among `keys` whose uniqueness is not known yet.
    pub fn unverified(&self, keys: &[(String, String)]) -> Vec<(String, String)> {
        let Ok(known) = self.known.lock() else {
            return keys.to_vec();
        };
        keys.iter()
            .filter(|k| !known.contains_key(*k))
            .cloned()
            .collect()
    }

    /// Whether `key` is known to be unique upstream (false while unknown).
    pub fn is_unique(&self, key: &(String, String)) -> bool {
        self.known
            .lock()
            .is_ok_and(|known| known.get(key) == Some(&true))
    }

    /// Records what the upstream catalog says about one key.
    pub fn record(&self, key: (String, String), unique: bool) {
        if let Ok(mut known) = self.known.lock() {
            known.insert(key, unique);
        }
    }

    /// Accepts a plan's keys only if every one is known to be unique.
    pub fn check(&self, keys: &[(String, String)]) -> Result<()> {
        for (table, column) in keys {
            let known = self
                .known
                .lock()
                .ok()
                .and_then(|k| k.get(&(table.clone(), column.clone())).copied());
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
    /// refuses the plan unless all are ([`UniqueKeys::check`]). 57P03 while the
    /// upstream cannot be reached; nothing is charged either way.
    pub async fn verify_unique_keys(
        &self,
        known: &UniqueKeys,
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
        known: &UniqueKeys,
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
                .query_one(UNIQUE_KEY_SQL, &[&qualified, &column])
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
}
