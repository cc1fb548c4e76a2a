//! The replay cache of the [`Ledger`]: released answers and noisy measures stored per analyst
//! (`pgdp.replay_cache`), read before a charge and written by the journal after a release
//! (docs/privacy.md §9).
//!
//! Invariants:
//! - An entry is younger than the lifetime by the ledger server's clock, or it is not read; an
//!   expired entry is deleted by the statement that finds it, so a fresh one can be stored.
//! - The first writer of a key wins, and every write notifies the replay indexes ([`index`]).

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::{at_most_one, index, Fault, Ledger, Stored};
use crate::Result;

/// What [`Ledger::replay_lookup`] found.
#[derive(Debug, Default)]
pub struct Looked {
    /// The entry stored under each key asked for, in the same order.
    pub entries: Vec<Option<Stored>>,
    /// The replay index answered (none of the keys stored) without asking the ledger.
    pub skipped: bool,
}

/// Longest lifetime the replay cache honours (100 years), so the interval arithmetic in SQL
/// cannot overflow.
const REPLAY_LIFETIME_MAX_S: f64 = 100.0 * 365.25 * 24.0 * 3600.0;

impl Ledger {
    /// The replay entries stored for (`analyst`, each of `keys`), as [`Ledger::replay_get`]
    /// for each key but in one round trip, and seeing this process's entries that the journal
    /// has not written yet. No round trip at all when the replay index ([`index`]) knows none
    /// of the keys is stored (an entry another process committed moments ago may then be
    /// missed: the query is charged as a new one).
    pub async fn replay_lookup(
        &self,
        analyst: &str,
        keys: &[&str],
        lifetime: Duration,
    ) -> Result<Looked> {
        let entries = |entries| Looked {
            entries,
            skipped: false,
        };
        if lifetime.is_zero() {
            return Ok(entries(vec![None; keys.len()]));
        }
        let mut found: Vec<Option<Stored>> = keys
            .iter()
            .map(|key| {
                self.journal
                    .pending_replay(analyst, key)
                    .map(|p| Stored::read(p.as_ref().clone()))
            })
            .collect();
        let missing: Vec<&str> = keys
            .iter()
            .zip(&found)
            .filter(|(_, f)| f.is_none())
            .map(|(k, _)| *k)
            .collect();
        if missing.is_empty() {
            return Ok(entries(found));
        }
        self.index.listen(&self.config);
        let skip = match self.index.verdict(analyst, &missing) {
            index::Verdict::Absent => true,
            index::Verdict::Ask => false,
            index::Verdict::Load(token) => {
                match self.replay_keys(token.analyst(), lifetime).await {
                    Ok(stored) => {
                        token.complete(&stored);
                        matches!(
                            self.index.verdict(analyst, &missing),
                            index::Verdict::Absent
                        )
                    }
                    Err(_) => false,
                }
            }
        };
        if skip {
            self.replay_lookups_skipped.fetch_add(1, Ordering::Relaxed);
            return Ok(Looked {
                entries: found,
                skipped: true,
            });
        }
        let lifetime_s = lifetime.as_secs_f64().min(REPLAY_LIFETIME_MAX_S);
        // Both parts see the same snapshot; the DELETE clears the way for fresh entries.
        const SQL: &str = "WITH expired AS (
                DELETE FROM pgdp.replay_cache
                WHERE analyst = $1 AND key = ANY($2::text[])
                  AND created_at <= now() - $3::float8 * interval '1 second')
            SELECT key, payload FROM pgdp.replay_cache
            WHERE analyst = $1 AND key = ANY($2::text[])
              AND created_at > now() - $3::float8 * interval '1 second'";
        let rows = self
            .query_prepared(SQL, &[&analyst, &missing, &lifetime_s], |rows| {
                rows.iter()
                    .map(|row| Ok((row.try_get::<_, String>(0)?, row.try_get::<_, Vec<u8>>(1)?)))
                    .collect::<Result<Vec<_>, Fault>>()
            })
            .await?;
        for (key, payload) in rows {
            for (slot, wanted) in found.iter_mut().zip(keys) {
                if slot.is_none() && *wanted == key {
                    *slot = Some(Stored::read(payload.clone()));
                }
            }
        }
        Ok(entries(found))
    }

    /// How many replay lookups the replay index answered without asking the ledger (none of
    /// their keys stored), since this ledger was opened.
    pub fn replay_lookups_skipped(&self) -> u64 {
        self.replay_lookups_skipped.load(Ordering::Relaxed)
    }

    /// The keys of `analyst`'s live replay entries (at most [`index::ReplayIndex::LOAD_LIMIT`]),
    /// for the replay index, deleting the expired ones in the same statement (so that whatever
    /// the index does not hold, a fresh entry can be stored under).
    async fn replay_keys(&self, analyst: &str, lifetime: Duration) -> Result<Vec<String>> {
        let lifetime_s = lifetime.as_secs_f64().min(REPLAY_LIFETIME_MAX_S);
        let most = i64::try_from(index::ReplayIndex::LOAD_LIMIT).unwrap_or(i64::MAX);
        // Both parts see the same snapshot.
        const SQL: &str = "WITH expired AS (
                DELETE FROM pgdp.replay_cache
                WHERE analyst = $1 AND created_at <= now() - $2::float8 * interval '1 second')
            SELECT key FROM pgdp.replay_cache
            WHERE analyst = $1 AND created_at > now() - $2::float8 * interval '1 second'
            LIMIT $3";
        self.query_prepared(SQL, &[&analyst, &lifetime_s, &most], |rows| {
            rows.iter()
                .map(|row| Ok(row.try_get::<_, String>(0)?))
                .collect()
        })
        .await
    }

    /// The released answer stored for (`analyst`, `key`) if it is younger than `lifetime`
    /// (measured by the ledger server's clock). An older entry is deleted, so that the next
    /// [`Ledger::replay_put`] can store a fresh one. A zero `lifetime` turns the cache off: nothing
    /// is read, not even an entry a concurrent transaction stored within the same microsecond.
    pub async fn replay_get(
        &self,
        analyst: &str,
        key: &str,
        lifetime: Duration,
    ) -> Result<Option<Stored>> {
        if lifetime.is_zero() {
            return Ok(None);
        }
        let lifetime_s = lifetime.as_secs_f64().min(REPLAY_LIFETIME_MAX_S);
        // Both parts see the same snapshot; the DELETE clears the way for a fresh entry.
        const SQL: &str = "WITH expired AS (
                DELETE FROM pgdp.replay_cache
                WHERE analyst = $1 AND key = $2 AND created_at <= now() - $3::float8 * interval '1 second')
            SELECT payload FROM pgdp.replay_cache
            WHERE analyst = $1 AND key = $2 AND created_at > now() - $3::float8 * interval '1 second'";
        self.query_prepared(SQL, &[&analyst, &key, &lifetime_s], |rows| {
            at_most_one(rows)?
                .map(|row| Ok(Stored::read(row.try_get::<_, Vec<u8>>(0)?)))
                .transpose()
        })
        .await
    }

    /// Stores a released answer for (`analyst`, `key`) unless one is already there: the first
    /// writer wins, so after two identical queries race, [`Ledger::replay_get`] gives both the
    /// same answer.
    /// Committed lazily (see [`Ledger::record_release`]).
    pub async fn replay_put(&self, analyst: &str, key: &str, payload: &[u8]) -> Result<()> {
        self.index.insert(analyst, key);
        let mut attempts = self.attempts().await;
        loop {
            let result = attempts
                .client()
                .await?
                .write_lazily(&[(REPLAY_PUT, &[&analyst, &key, &payload])])
                .await;
            if let Some(done) = attempts.settle(result.map_err(Fault::from)) {
                return done;
            }
        }
    }

    /// Deletes every replay entry older than `lifetime` and returns how many went.
    pub async fn replay_purge(&self, lifetime: Duration) -> Result<u64> {
        let lifetime_s = lifetime.as_secs_f64().min(REPLAY_LIFETIME_MAX_S);
        const SQL: &str = "DELETE FROM pgdp.replay_cache WHERE created_at <= now() - $1::float8 * interval '1 second'";
        let mut attempts = self.attempts().await;
        loop {
            let result = attempts
                .client()
                .await?
                .client
                .execute(SQL, &[&lifetime_s])
                .await;
            if let Some(done) = attempts.settle(result.map_err(Fault::from)) {
                return done;
            }
        }
    }
}

/// Stores a released answer unless one is there (first writer wins), and tells the other
/// processes' replay indexes.
const REPLAY_PUT: &str = concat!(
    "WITH stored AS (
        INSERT INTO pgdp.replay_cache (analyst, key, payload) VALUES ($1, $2, $3)
        ON CONFLICT (analyst, key) DO NOTHING
        RETURNING analyst, key)",
    index::notify_stored!()
);
