//! The journal: what the ledger records after the answer has left, in batches. Audit rows of
//! charges made under a lease (`lease`), outcomes ("released", "upstream failed"), and replay
//! entries (released answers and noisy measures).
//!
//! Invariants:
//! - Nothing here is what makes a release safe: a charge made under a lease is covered by the
//!   lease's durable reservation before its answer leaves, and a charge made on its own by its
//!   group commit. Losing the journal in a crash loses audit detail (the lease row still shows
//!   what was reserved, all of it counted as spent) and replay entries (a repeated query then
//!   costs again), never budget.
//! - One flusher task at a time takes everything pending into one transaction committed with
//!   `synchronous_commit = off`, sent as one pipelined round trip (BEGIN, the writes, COMMIT).
//!   A woken flusher first waits [`JOURNAL_COALESCE_MS`], so that a query's charge and its
//!   outcome become one row and the entries of the queries around it share the flush, and the
//!   ledger's round trips stay off the answers' path; entries that arrive during a flush share
//!   the next one. A failed flush puts its entries back and tries again after
//!   [`JOURNAL_RETRY_MS`]; while the ledger is down the journal keeps at most
//!   [`JOURNAL_PENDING_MAX`] entries, dropping the oldest replay entries first, never an audit
//!   row or an outcome.
//! - A replay entry stays visible to [`Journal::pending_replay`] from the moment it is queued
//!   until its flush has committed (when the ledger's own lookup sees it), so an identical query
//!   on this process never misses it in between.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::index::ReplayIndex;
use super::*;
use crate::limits::{JOURNAL_COALESCE_MS, JOURNAL_PENDING_MAX, JOURNAL_RETRY_MS};

/// The audit row of a charge made under a lease, written by the journal.
pub(super) struct LeasedCharge {
    pub(super) lease: i64,
    pub(super) seq: i64,
    pub(super) analyst: String,
    /// Seconds since the Unix epoch when it was charged.
    pub(super) at: f64,
    pub(super) fingerprint: String,
    pub(super) mechanism: String,
    pub(super) cost: Cost,
    pub(super) tables: Vec<String>,
    pub(super) outcome: String,
}

/// A replay entry waiting for its flush.
struct PendingReplay {
    analyst: String,
    key: String,
    payload: Arc<Vec<u8>>,
    /// Taken by the flush running now.
    taken: bool,
}

#[derive(Default)]
struct JournalState {
    charges: Vec<LeasedCharge>,
    outcomes: Vec<(ChargeId, String)>,
    replays: Vec<PendingReplay>,
    flushing: bool,
}

/// The queue of lazy writes and the flusher's connection.
pub(super) struct Journal {
    config: Dsn,
    schema_ready: Arc<AtomicBool>,
    /// The process's replay index, which written replay entries enter ([`Journal::settle`]).
    index: Arc<ReplayIndex>,
    state: std::sync::Mutex<JournalState>,
    conn: Mutex<Option<Conn>>,
}

/// Inserts the audit rows of leased charges.
const INSERT_LEASED_CHARGES: &str = "INSERT INTO pgdp.charge_log
        (analyst, charged_at, fingerprint, mechanism, epsilon, delta, rho, pure_rho, tables,
         outcome, outcome_at, lease_id, lease_seq)
     SELECT l.analyst, to_timestamp(l.at), l.fingerprint, l.mechanism, l.epsilon::numeric,
            l.delta::numeric, l.rho::numeric, l.pure_rho::numeric, l.tables::text[], l.outcome,
            CASE WHEN l.outcome <> 'charged' THEN now() END, l.lease, l.seq
     FROM unnest($1::text[], $2::float8[], $3::text[], $4::text[], $5::text[], $6::text[],
                 $7::text[], $8::text[], $9::text[], $10::text[], $11::int8[], $12::int8[])
         WITH ORDINALITY AS l(analyst, at, fingerprint, mechanism, epsilon, delta, rho, pure_rho,
                              tables, outcome, lease, seq, n)
     ORDER BY l.n";

/// Records the outcomes of charges logged on their own (by audit-log id).
const SET_OUTCOMES_BY_ID: &str =
    "UPDATE pgdp.charge_log AS c SET outcome = u.outcome, outcome_at = now()
     FROM unnest($1::int8[], $2::text[]) AS u(id, outcome) WHERE c.id = u.id";

/// Records the outcomes of leased charges written by an earlier flush.
const SET_OUTCOMES_BY_LEASE: &str =
    "UPDATE pgdp.charge_log AS c SET outcome = u.outcome, outcome_at = now()
     FROM unnest($1::int8[], $2::int8[], $3::text[]) AS u(lease, seq, outcome)
     WHERE c.lease_id = u.lease AND c.lease_seq = u.seq";

/// Stores replay entries (the first writer of a key wins) and tells the other processes'
/// replay indexes.
const PUT_REPLAYS: &str = concat!(
    "WITH stored AS (
        INSERT INTO pgdp.replay_cache (analyst, key, payload)
        SELECT * FROM unnest($1::text[], $2::text[], $3::bytea[])
        ON CONFLICT (analyst, key) DO NOTHING
        RETURNING analyst, key)",
    super::index::notify_stored!()
);

/// What one flush writes.
#[derive(Default)]
struct Batch {
    charges: Vec<LeasedCharge>,
    outcomes: Vec<(ChargeId, String)>,
    replays: Vec<(String, String, Arc<Vec<u8>>)>,
}

impl Batch {
    fn is_empty(&self) -> bool {
        self.charges.is_empty() && self.outcomes.is_empty() && self.replays.is_empty()
    }
}

/// Now, as seconds since the Unix epoch (for `to_timestamp`).
pub(super) fn epoch_seconds() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

impl Journal {
    pub(super) fn new(
        config: Dsn,
        schema_ready: Arc<AtomicBool>,
        index: Arc<ReplayIndex>,
    ) -> Journal {
        Journal {
            config,
            schema_ready,
            index,
            state: std::sync::Mutex::new(JournalState::default()),
            conn: Mutex::new(None),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, JournalState> {
        // Plain data, and nothing panics while holding the lock.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Queues the audit row of a leased charge.
    pub(super) fn charge(self: &Arc<Self>, charge: LeasedCharge) {
        self.state().charges.push(charge);
        self.wake();
    }

    /// Queues what became of a charge; merged into its audit row when that is still queued.
    pub(super) fn outcome(self: &Arc<Self>, id: ChargeId, outcome: &str) {
        {
            let mut state = self.state();
            let queued = match id {
                ChargeId::Leased { lease, seq } => state
                    .charges
                    .iter_mut()
                    .find(|c| c.lease == lease && c.seq == seq),
                ChargeId::Logged(_) => None,
            };
            match queued {
                Some(charge) => charge.outcome = outcome.to_string(),
                None => state.outcomes.push((id, outcome.to_string())),
            }
        }
        self.wake();
    }

    /// Queues replay entries (first writer wins, in the order given).
    pub(super) fn replays(self: &Arc<Self>, analyst: &str, entries: &[(&str, &[u8])]) {
        {
            let mut state = self.state();
            for (key, payload) in entries {
                state.replays.push(PendingReplay {
                    analyst: analyst.to_string(),
                    key: (*key).to_string(),
                    payload: Arc::new(payload.to_vec()),
                    taken: false,
                });
            }
            // Bounded while the ledger is down: the oldest replay entries not being written go.
            let over = (state.charges.len() + state.outcomes.len() + state.replays.len())
                .saturating_sub(JOURNAL_PENDING_MAX);
            if over > 0 {
                let mut dropped = 0;
                state.replays.retain(|r| {
                    if dropped < over && !r.taken {
                        dropped += 1;
                        false
                    } else {
                        true
                    }
                });
                warn!(
                    dropped,
                    "the privacy ledger is behind; dropped replay entries (an identical query will be charged again)"
                );
            }
        }
        self.wake();
    }

    /// The payload queued for (`analyst`, `key`) and not yet known to be committed, if any.
    /// The first queued wins, as in the ledger.
    pub(super) fn pending_replay(&self, analyst: &str, key: &str) -> Option<Arc<Vec<u8>>> {
        self.state()
            .replays
            .iter()
            .find(|r| r.analyst == analyst && r.key == key)
            .map(|r| Arc::clone(&r.payload))
    }

    /// Starts the flusher unless one runs.
    fn wake(self: &Arc<Self>) {
        let start = !std::mem::replace(&mut self.state().flushing, true);
        if start {
            tokio::spawn(Arc::clone(self).flush_all());
        }
    }

    /// Whether nothing is queued or being written.
    pub(super) fn is_idle(&self) -> bool {
        let state = self.state();
        !state.flushing
            && state.charges.is_empty()
            && state.outcomes.is_empty()
            && state.replays.is_empty()
    }

    /// The flusher: writes what is queued, batch after batch, until nothing is.
    async fn flush_all(self: Arc<Self>) {
        loop {
            tokio::time::sleep(Duration::from_millis(JOURNAL_COALESCE_MS)).await;
            let batch = {
                let mut state = self.state();
                let mut batch = Batch {
                    charges: std::mem::take(&mut state.charges),
                    outcomes: std::mem::take(&mut state.outcomes),
                    replays: Vec::new(),
                };
                for replay in state.replays.iter_mut().filter(|r| !r.taken) {
                    replay.taken = true;
                    batch.replays.push((
                        replay.analyst.clone(),
                        replay.key.clone(),
                        Arc::clone(&replay.payload),
                    ));
                }
                if batch.is_empty() {
                    state.flushing = false;
                    return;
                }
                batch
            };
            let written = self.write(&batch).await;
            if self.settle(batch, written) {
                continue;
            }
            tokio::time::sleep(Duration::from_millis(JOURNAL_RETRY_MS)).await;
        }
    }

    /// After a flush: forgets the written replay entries, or puts everything back (ahead of
    /// what arrived meanwhile) after a failure. Returns `written`.
    ///
    /// Written entries enter the replay index before they leave the queue: their NOTIFY may
    /// reach the listener later, and an index loaded from a read before their commit (or that
    /// forgot the analyst since [`super::Ledger::record_release`] inserted them) would say they
    /// are absent meanwhile. So an entry of this process is always found by
    /// [`Journal::pending_replay`], by the index, or (the analyst not indexed) by the read
    /// that loads it, which comes after the commit.
    fn settle(&self, batch: Batch, written: bool) -> bool {
        let mut state = self.state();
        if written {
            for replay in state.replays.iter().filter(|r| r.taken) {
                self.index.insert(&replay.analyst, &replay.key);
            }
            state.replays.retain(|r| !r.taken);
            return true;
        }
        let Batch {
            mut charges,
            mut outcomes,
            ..
        } = batch;
        charges.append(&mut state.charges);
        state.charges = charges;
        outcomes.append(&mut state.outcomes);
        state.outcomes = outcomes;
        for replay in state.replays.iter_mut() {
            replay.taken = false;
        }
        false
    }

    /// Writes `batch` in one lazily committed transaction; false if the ledger failed.
    async fn write(&self, batch: &Batch) -> bool {
        let mut attempts = Attempts {
            config: &self.config,
            schema_ready: &self.schema_ready,
            slot: self.conn.lock().await,
            retried: false,
        };
        loop {
            let result = match attempts.client().await {
                Ok(conn) => write_batch(conn, batch).await,
                Err(_) => return false,
            };
            if let Some(done) = attempts.settle(result) {
                return done.is_ok();
            }
        }
    }
}

/// One attempt at writing `batch`: the statements pipelined between BEGIN and COMMIT in one
/// round trip, audit rows before the outcomes that may update them. A failed write aborts the
/// transaction, which the COMMIT sent behind it then ends (PostgreSQL rolls back).
async fn write_batch(conn: &mut Conn, batch: &Batch) -> Result<(), Fault> {
    let insert = conn.statement(INSERT_LEASED_CHARGES).await?;
    let by_id = conn.statement(SET_OUTCOMES_BY_ID).await?;
    let by_lease = conn.statement(SET_OUTCOMES_BY_LEASE).await?;
    let put = conn.statement(PUT_REPLAYS).await?;

    let charges = &batch.charges;
    let column = |f: &dyn Fn(&LeasedCharge) -> String| charges.iter().map(f).collect::<Vec<_>>();
    let analysts = column(&|c| c.analyst.clone());
    let ats: Vec<f64> = charges.iter().map(|c| c.at).collect();
    let fingerprints = column(&|c| c.fingerprint.clone());
    let mechanisms = column(&|c| c.mechanism.clone());
    let epsilons = column(&|c| c.cost.epsilon.to_numeric_text());
    let deltas = column(&|c| c.cost.delta.to_numeric_text());
    let rhos = column(&|c| c.cost.rho.to_numeric_text());
    let pure_rhos = column(&|c| c.cost.pure_rho.to_numeric_text());
    let tables = column(&|c| text_array_literal(&c.tables));
    let outcomes = column(&|c| c.outcome.clone());
    let leases: Vec<i64> = charges.iter().map(|c| c.lease).collect();
    let seqs: Vec<i64> = charges.iter().map(|c| c.seq).collect();

    let (mut ids, mut id_outcomes) = (Vec::new(), Vec::new());
    let (mut outcome_leases, mut outcome_seqs, mut lease_outcomes) =
        (Vec::new(), Vec::new(), Vec::new());
    for (id, outcome) in &batch.outcomes {
        match *id {
            ChargeId::Logged(id) => {
                ids.push(id);
                id_outcomes.push(outcome.clone());
            }
            ChargeId::Leased { lease, seq } => {
                outcome_leases.push(lease);
                outcome_seqs.push(seq);
                lease_outcomes.push(outcome.clone());
            }
        }
    }
    let replay_analysts: Vec<&str> = batch.replays.iter().map(|r| r.0.as_str()).collect();
    let replay_keys: Vec<&str> = batch.replays.iter().map(|r| r.1.as_str()).collect();
    let replay_payloads: Vec<&[u8]> = batch.replays.iter().map(|r| r.2.as_slice()).collect();

    let tx = &conn.client;
    // Pipelined: the transaction's start, every write and its end go out together, in this order.
    let begin = tx.batch_execute("BEGIN; SET LOCAL synchronous_commit = off");
    let inserted = async {
        if !charges.is_empty() {
            tx.execute(
                &insert,
                &[
                    &analysts,
                    &ats,
                    &fingerprints,
                    &mechanisms,
                    &epsilons,
                    &deltas,
                    &rhos,
                    &pure_rhos,
                    &tables,
                    &outcomes,
                    &leases,
                    &seqs,
                ],
            )
            .await?;
        }
        Ok::<_, tokio_postgres::Error>(())
    };
    let updated_by_id = async {
        if !ids.is_empty() {
            tx.execute(&by_id, &[&ids, &id_outcomes]).await?;
        }
        Ok::<_, tokio_postgres::Error>(())
    };
    let updated_by_lease = async {
        if !outcome_leases.is_empty() {
            tx.execute(
                &by_lease,
                &[&outcome_leases, &outcome_seqs, &lease_outcomes],
            )
            .await?;
        }
        Ok::<_, tokio_postgres::Error>(())
    };
    let put_replays = async {
        if !replay_keys.is_empty() {
            tx.execute(&put, &[&replay_analysts, &replay_keys, &replay_payloads])
                .await?;
        }
        Ok::<_, tokio_postgres::Error>(())
    };
    let commit = tx.batch_execute("COMMIT");
    futures::future::try_join(
        futures::future::try_join5(
            begin,
            inserted,
            updated_by_id,
            updated_by_lease,
            put_replays,
        ),
        commit,
    )
    .await?;
    Ok(())
}
