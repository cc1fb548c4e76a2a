//! The durable privacy ledger: spent totals, the audit log and the replay cache (released answers
//! and the noisy measures of releases, for reuse), in PostgreSQL.
//!
//! Invariants:
//! - Charges are committed in groups (group commit): [`Ledger::charge`] queues its request and
//!   one committer task per [`Ledger`] takes everything queued (at most
//!   [`CHARGES_PER_COMMIT_MAX`]) into one READ COMMITTED transaction. That transaction locks the
//!   rows of the batch's analysts (`INSERT … ON CONFLICT DO UPDATE … RETURNING`, in sorted name
//!   order), then the dataset row, always in that order (so no two transactions, of this process
//!   or another, can deadlock), runs [`admit`] on each request in arrival order against the
//!   locked totals plus the requests admitted before it, and commits the new totals with one
//!   audit row per admitted request. A refused request changes nothing and does not affect the
//!   others. Every charge is answered only after the commit, with `synchronous_commit = on`
//!   forced for the session, so a charge that was reported is durable. Any number of pgdp
//!   processes may share one ledger: the row locks serialise their transactions and none can
//!   overspend. A lone charge is committed at once (the committer never waits for company);
//!   concurrent ones share one lock acquisition and one WAL flush instead of queueing for the
//!   analyst's row one by one.
//! - Totals are written as the exact decimal text of [`Fixed`] and read back as `numeric::text`,
//!   so nothing is rounded on the way through PostgreSQL.
//! - Nothing charged is ever refunded; [`Ledger::set_outcome`] only annotates the log. The one
//!   decrement is the close of a budget slice ([`lease`]), which replaces the slice's
//!   reservation in the totals by what was charged under it: nothing released under it is
//!   returned, only what was reserved and never used.
//! - Budget leases (`--lease-queries`, [`Ledger::charge_leased`]): a slice of an analyst's
//!   budget is reserved durably in one commit, under the same locks as a group commit, and the
//!   charges it covers are made in memory; a process that dies holding one leaves its whole
//!   reservation spent. The arithmetic is `budget::lease`, the proof docs/privacy.md §8.
//! - Audit rows of leased charges, outcomes and replay entries are written by the [`journal`],
//!   in batches, after the answer has left.
//! - Every write of a replay entry notifies `pgdp_replay`, and the [`index`] built from those
//!   notifications lets [`Ledger::replay_lookup`] skip the round trip when none of a query's
//!   keys is stored; it can turn a hit into a miss (a second charge), never a miss into a hit.
//! - PostgreSQL's error text is logged with `tracing::warn!` and never returned: every ledger
//!   failure is [`Error::LedgerUnavailable`]. A failed call charged nothing, except in the one
//!   ambiguous case where the connection breaks after COMMIT was sent; the charge may then be
//!   retried on a fresh connection and counted twice, which only ever overcharges.
//!
//! # Tables (schema `pgdp`)
//! ```sql
//! CREATE TABLE pgdp.meta (key text PRIMARY KEY, value text NOT NULL);  -- schema_version = 6
//! CREATE TABLE pgdp.analyst_spent (        -- one row per analyst, created on first charge
//!     analyst    text PRIMARY KEY,
//!     epsilon    numeric NOT NULL DEFAULT 0 CHECK (epsilon >= 0),  -- Σ pure ε
//!     delta      numeric NOT NULL DEFAULT 0 CHECK (delta >= 0),    -- Σ δ
//!     rho        numeric NOT NULL DEFAULT 0 CHECK (rho >= 0),      -- Σ zCDP ρ
//!     renyi      numeric[],  -- Σ Rényi divergence bound per order of accountant::ORDERS,
//!                            -- then Σ zCDP ρ (ρ_pure + ρ), then Σ GDP μ² (π·ρ_pure + 2ρ);
//!                            -- NULL: a version-1 row, bounded by the sums; without Σ ρ_z:
//!                            -- bounded by ε²/2 + ρ; without Σ μ²: none if ρ > 0 (discrete
//!                            -- Gaussian charges), else π·Σ ρ_z
//!     charges    bigint NOT NULL DEFAULT 0,   -- since the last reset
//!     updated_at timestamptz NOT NULL DEFAULT now(),
//!     granted_epsilon, granted_delta numeric NOT NULL DEFAULT 0);  -- added to the policy limit
//! CREATE TABLE pgdp.dataset_spent (        -- exactly one row: totals across all analysts
//!     id boolean PRIMARY KEY DEFAULT true CHECK (id),
//!     epsilon, delta, rho, renyi, charges, updated_at  -- as in analyst_spent, never reset
//! );
//! CREATE TABLE pgdp.charge_log (           -- the audit log, one row per admitted charge
//!     id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
//!     analyst     text NOT NULL,
//!     charged_at  timestamptz NOT NULL DEFAULT now(),
//!     fingerprint text NOT NULL,           -- hex SHA-256 from `budget::fingerprint`
//!     mechanism   text NOT NULL,
//!     epsilon numeric NOT NULL, delta numeric NOT NULL, rho numeric NOT NULL,
//!     pure_rho numeric NOT NULL DEFAULT 0,   -- Σ ε_c²/2 of the charge's pure parts
//!     outcome     text NOT NULL DEFAULT 'charged',  -- set later by `set_outcome`
//!     outcome_at  timestamptz,
//!     tables      text[] NOT NULL DEFAULT '{}',  -- policy tables read ('{}' before version 3)
//!     lease_id bigint, lease_seq bigint);  -- the slice that covered it (NULL: charged alone)
//! CREATE TABLE pgdp.lease (                -- budget slices (`lease`), one row per reservation
//!     id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, analyst text NOT NULL,
//!     holder text NOT NULL,                -- 'pid N on HOST' of the pgdp process
//!     granted_at timestamptz NOT NULL DEFAULT now(), queries bigint NOT NULL,  -- k reserved
//!     epsilon, delta, rho numeric NOT NULL, renyi numeric[] NOT NULL,  -- the reservation
//!     closed_at timestamptz,               -- NULL: open (after a crash: forever, all spent)
//!     charges bigint, used_epsilon, used_delta, used_rho numeric, used_renyi numeric[],
//!     window_period text, window_start timestamptz,  -- the analyst's window (NULL: no period)
//!     dataset_window_period text, dataset_window_start timestamptz);  -- the dataset's
//! CREATE TABLE pgdp.analyst_window_spent (  -- renewing budgets (`period`): one row per window
//!     analyst text, period text,           -- 'day' | 'week' | 'month'
//!     window_start, window_end timestamptz,  -- [start, end) in UTC (`budget::window`)
//!     epsilon, delta, rho, renyi, charges, updated_at,  -- as in analyst_spent, for the window
//!     PRIMARY KEY (analyst, period, window_start));
//! CREATE TABLE pgdp.dataset_window_spent (  -- the dataset's windows, as above
//!     period, window_start, window_end, epsilon, delta, rho, renyi, charges, updated_at,
//!     PRIMARY KEY (period, window_start));
//! CREATE TABLE pgdp.admin_log (            -- one row per grant or reset (`admin`)
//!     id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, at timestamptz NOT NULL DEFAULT now(),
//!     action text NOT NULL,                -- 'grant' | 'reset'
//!     analyst text NOT NULL,
//!     epsilon, delta, rho numeric NOT NULL,  -- granted, or the totals a reset zeroed
//!     reason text NOT NULL, made_by text NOT NULL,  -- the OS user
//!     ledger_role text NOT NULL DEFAULT current_user);
//! CREATE TABLE pgdp.replay_cache (         -- released answers, replayed within a lifetime,
//!                                          -- and noisy measures (key `measures:<hex>`), reused
//!     analyst text NOT NULL, key text NOT NULL, payload bytea NOT NULL,
//!     created_at timestamptz NOT NULL DEFAULT now(),
//!     PRIMARY KEY (analyst, key));
//! CREATE TABLE pgdp.synopsis (             -- a synopsis's released state ([`synopsis`])
//!     name text, fingerprint text,         -- the policy's name and declaration
//!     total numeric NOT NULL,              -- the noisy total
//!     rounds_started integer NOT NULL,     -- recorded before a round's first answer
//!     measurements text[] NOT NULL,        -- 'noisy:cell,cell,…' per update, in order
//!     created_at, updated_at timestamptz, PRIMARY KEY (name, fingerprint));
//! CREATE TABLE pgdp.synopsis_payment (     -- who paid for a synopsis, once each
//!     name text, fingerprint text, analyst text, charge text NOT NULL,  -- the charge's id
//!     paid_at timestamptz, PRIMARY KEY (name, fingerprint, analyst));
//! ```
//! The exact DDL is [`SCHEMA_DDL`]; the first connection a [`Ledger`] opens runs it under a
//! transaction-scoped advisory lock when any table is missing, so processes starting together do
//! not race. A role without CREATE rights can use a ledger whose tables a DBA created beforehand.
//! A ledger of schema version 1, 2, 3, 4 or 5 is migrated in place under the same lock, one version
//! at a time ([`schema`]).
//!
//! # Renewing budgets
//! A [`Limit`] with a `period` covers each calendar window of it ([`crate::budget::window`]):
//! a charge is admitted against the totals of the window that holds the ledger's clock in its
//! transaction (`now()`, the same for every process), read and written under the analyst's and
//! the dataset's row locks like every total ([`window`]). The whole-history totals are updated
//! as always. A budget slice belongs to the windows it was reserved in: this process charges
//! under it only while its estimate of the ledger's clock (never behind the ledger's) is still
//! inside them, and the first charge after closes it, returning its unused part to those
//! windows, and reserves a new slice in the new ones. A slice left open by a crash stays
//! spent in its windows.
//!
//! Grants and resets ([`admin`]) change an analyst's row in transactions that take the same
//! locks in the same order as a group commit; a charge reads the analyst's grants with its
//! totals under the row lock, so the limit it is admitted against is the policy's plus the grants
//! committed before it.
//!
//! # Connections
//! [`Ledger::new`] connects to nothing: every call takes a connection slot and (re)connects when
//! the slot has none or its connection died, so a ledger that is down at start or restarts later
//! serves again as soon as it is back. While it cannot be reached every call fails with
//! [`Error::LedgerUnavailable`] (57P03), and since [`Ledger::charge`] comes before the upstream,
//! no DP query runs uncharged. [`Ledger::connect`] is `new` followed by one connection, for
//! callers that want to fail early.

mod admin;
mod group_commit;
mod index;
mod journal;
mod lease;
mod receipt;
mod replay;
mod schema;
mod stored;
mod synopsis;
mod window;
pub use admin::{
    Account, Accounts, AdminAction, AdminRecord, AuditEvent, AuditFilter, GrantRequest,
};
use group_commit::*;
pub use receipt::{Balance, ChargeId, Charged, Priced, Receipt};
pub use replay::Looked;
use schema::ensure_schema;
pub use schema::SCHEMA_DDL;
pub use stored::Stored;
pub use synopsis::{StoredSynopsis, SynopsisPass};

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use std::sync::Arc;

use tokio::sync::{oneshot, Mutex, MutexGuard};
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Row, Statement};
use tracing::warn;

use super::accountant::{admit, Cost, Limit, Refusal, Renyi, Scope, Spent, ORDER_COUNT};
use super::fixed::Fixed;
use super::window::Window;
use crate::dsn::Dsn;
use crate::limits::{CHARGES_PER_COMMIT_MAX, STATEMENT_TIMEOUT_MS, UPSTREAM_CONNECT_TIMEOUT_MS};
use crate::{Error, Result};

/// The shared, durable privacy ledger. Cheap to share behind an `Arc`; each call takes one of a
/// few connections.
pub struct Ledger {
    config: Dsn,
    slots: Vec<Mutex<Option<Conn>>>,
    next_slot: AtomicUsize,
    /// The tables exist and have this version (checked on the first connection).
    schema_ready: Arc<AtomicBool>,
    /// Charges waiting for their group commit, and the committer's own connection.
    charges: Arc<ChargeQueue>,
    /// Audit rows, outcomes and replay entries waiting for their lazy commit.
    journal: Arc<journal::Journal>,
    /// This process's budget slices.
    leases: Arc<lease::LeaseBook>,
    /// Which replay-cache keys each analyst has, so that a lookup of none skips the ledger.
    index: Arc<index::ReplayIndex>,
    /// Replay lookups answered "none stored" by the index without a round trip.
    replay_lookups_skipped: AtomicU64,
    /// The ledger's clock offset (tests only; see [`Ledger::set_test_clock_offset`]).
    clock: Arc<window::Clock>,
}

impl fmt::Debug for Ledger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Config's own Debug redacts the password.
        f.debug_struct("Ledger")
            .field("config", &self.config)
            .field("connections", &self.slots.len())
            .finish()
    }
}

/// One ledger connection and the statements prepared on it (each SQL text is parsed once per
/// connection, so a charge costs one round trip per statement).
struct Conn {
    client: Client,
    statements: HashMap<&'static str, Statement>,
}

impl Conn {
    /// `sql` prepared on this connection (prepared now on first use).
    async fn statement(&mut self, sql: &'static str) -> Result<Statement, tokio_postgres::Error> {
        if let Some(statement) = self.statements.get(sql) {
            return Ok(statement.clone());
        }
        let statement = self.client.prepare(sql).await?;
        self.statements.insert(sql, statement.clone());
        Ok(statement)
    }

    /// Runs `writes` in one transaction committed with `synchronous_commit = off`: for records
    /// whose loss in a crash only ever costs the analyst (a replay entry, an outcome note),
    /// never for a charge. The setting is `LOCAL`, so it ends with the transaction whatever
    /// happens.
    async fn write_lazily(
        &mut self,
        writes: &[(&'static str, &[&(dyn ToSql + Sync)])],
    ) -> Result<(), tokio_postgres::Error> {
        let mut prepared = Vec::with_capacity(writes.len());
        for (sql, _) in writes {
            prepared.push(self.statement(sql).await?);
        }
        let tx = self.client.transaction().await?;
        // Pipelined: the setting and the writes go out together, in this order, and take one
        // round trip between BEGIN and COMMIT.
        let setting = tx.batch_execute("SET LOCAL synchronous_commit = off");
        let executes = futures::future::try_join_all(
            prepared
                .iter()
                .zip(writes)
                .map(|(statement, (_, params))| tx.execute(statement, params)),
        );
        futures::future::try_join(setting, executes).await?;
        tx.commit().await
    }
}

/// Why one attempt at a ledger operation failed.
enum Fault {
    /// PostgreSQL or the connection failed.
    Db(tokio_postgres::Error),
    /// The ledger holds something pgdp cannot read (e.g. edited by hand).
    Corrupt(&'static str),
}

impl From<tokio_postgres::Error> for Fault {
    fn from(error: tokio_postgres::Error) -> Fault {
        Fault::Db(error)
    }
}

/// Session settings of every ledger connection: durable commits, the isolation the locking
/// protocol assumes whatever the server default, bounded waits, and no user schema in the way.
const SESSION_SETUP: &str = "SET synchronous_commit = on; \
     SET default_transaction_isolation = 'read committed'; \
     SET default_transaction_read_only = off; \
     SET search_path = pg_catalog";

impl Ledger {
    /// Connects to the ledger database (a libpq key=value string or a `postgres://` URL) and
    /// creates the `pgdp` schema and its tables if any is missing. Fails with
    /// [`Error::LedgerUnavailable`] if the DSN is invalid, the server cannot be reached, or the
    /// tables belong to a newer schema version.
    pub async fn connect(dsn: &str) -> Result<Ledger> {
        let ledger = Ledger::new(dsn)?;
        let mut attempts = ledger.attempts().await;
        attempts.client().await?;
        drop(attempts);
        Ok(ledger)
    }

    /// A ledger for `dsn` (a libpq key=value string or a `postgres://` URL) that connects on
    /// first use (see the module docs). Fails with [`Error::LedgerUnavailable`] only if the DSN
    /// is invalid.
    pub fn new(dsn: &str) -> Result<Ledger> {
        let mut config = Dsn::parse(dsn).map_err(|e| {
            warn!(error = %e, "invalid privacy ledger connection string");
            Error::LedgerUnavailable
        })?;
        let settings = config.config_mut();
        if settings.get_application_name().is_none() {
            settings.application_name("pgdp-ledger");
        }
        if settings.get_connect_timeout().is_none() {
            settings.connect_timeout(Duration::from_millis(UPSTREAM_CONNECT_TIMEOUT_MS));
        }
        let schema_ready = Arc::new(AtomicBool::new(false));
        let clock = Arc::new(window::Clock::default());
        let index = Arc::new(index::ReplayIndex::new());
        Ok(Ledger {
            charges: Arc::new(ChargeQueue {
                config: config.clone(),
                schema_ready: Arc::clone(&schema_ready),
                state: std::sync::Mutex::new(QueueState::default()),
                conn: Mutex::new(None),
                clock: Arc::clone(&clock),
            }),
            journal: Arc::new(journal::Journal::new(
                config.clone(),
                Arc::clone(&schema_ready),
                Arc::clone(&index),
            )),
            leases: Arc::new(lease::LeaseBook::new(
                config.clone(),
                Arc::clone(&schema_ready),
                Arc::clone(&clock),
            )),
            clock,
            index,
            replay_lookups_skipped: AtomicU64::new(0),
            config,
            slots: (0..crate::limits::LEDGER_CONNECTIONS)
                .map(|_| Mutex::new(None))
                .collect(),
            next_slot: AtomicUsize::new(0),
            schema_ready,
        })
    }

    /// Charges `cost` to `analyst` if it fits within `limit` (and `dataset_limit`, the cap across
    /// all analysts, when given), in a group commit; see the module docs. Returns the audit-log id
    /// and the analyst's balance right after this charge, once committed. A charge that does not
    /// fit changes nothing and fails with [`Error::BudgetExhausted`] (SQLSTATE 53400), naming the
    /// request and what is left. The dataset totals are kept up to date even without a
    /// `dataset_limit`, so a cap added later counts earlier spending.
    pub async fn charge(
        &self,
        analyst: &str,
        limit: &Limit,
        dataset_limit: Option<&Limit>,
        cost: &Cost,
        fingerprint: &str,
        mechanism: &str,
    ) -> Result<Receipt> {
        self.charge_reading(
            analyst,
            limit,
            dataset_limit,
            cost,
            fingerprint,
            mechanism,
            &[],
        )
        .await
    }

    /// [`Ledger::charge`] for a query that reads `tables` (policy names), which the audit log
    /// records with the charge so that `pgdp audit` can say who spent what on which table.
    /// `limit` is the policy's; the analyst's grants are added to it under the row lock.
    // The charge's parts are independent plain values; a struct for them would be built once,
    // at the one call site in the session.
    #[allow(clippy::too_many_arguments)]
    pub async fn charge_reading(
        &self,
        analyst: &str,
        limit: &Limit,
        dataset_limit: Option<&Limit>,
        cost: &Cost,
        fingerprint: &str,
        mechanism: &str,
        tables: &[String],
    ) -> Result<Receipt> {
        self.enqueue_charge(ChargeRequest {
            analyst: analyst.to_string(),
            limit: *limit,
            dataset_limit: dataset_limit.copied(),
            dataset: DatasetShare::Charged,
            cost: *cost,
            fingerprint: fingerprint.to_string(),
            mechanism: mechanism.to_string(),
            tables: tables.to_vec(),
        })
        .await
    }

    /// Queues `request` for the group commit and waits for its receipt or refusal.
    async fn enqueue_charge(&self, request: ChargeRequest) -> Result<Receipt> {
        let (reply, answer) = oneshot::channel();
        let pending = PendingCharge { request, reply };
        if self.charges.enqueue(pending) {
            // A task of its own, so that a session dropped mid-commit cannot strand the queue.
            tokio::spawn(Arc::clone(&self.charges).commit_all());
        }
        // A committer that vanished without answering (its runtime shut down) charged nothing
        // that was reported; the query does not run.
        answer.await.unwrap_or(Err(Error::LedgerUnavailable))
    }

    /// Whether the ledger answers: `SELECT 1` on one of its connections (opened, and the schema
    /// checked, if it has none), for the health endpoint.
    pub async fn ping(&self) -> Result<()> {
        let mut attempts = self.attempts().await;
        loop {
            let client = attempts.client().await?;
            let result = client
                .client
                .simple_query("SELECT 1")
                .await
                .map(|_| ())
                .map_err(Fault::from);
            if let Some(done) = attempts.settle(result) {
                return done;
            }
        }
    }

    /// Records what became of a charge (e.g. `released`, `upstream failed`). Best effort and
    /// never a refund: the charge stands whatever the outcome.
    /// The secret that keys the choice of groups each privacy unit keeps, created once (randomly)
    /// and kept in `pgdp.meta`, so every pgdp process sharing this ledger and every restart makes
    /// the same choice. The first process to store one wins.
    pub async fn group_choice_secret(&self) -> Result<String> {
        const INSERT: &str = "INSERT INTO pgdp.meta (key, value) VALUES ('group_choice_secret', $1) ON CONFLICT DO NOTHING";
        const SELECT: &str = "SELECT value FROM pgdp.meta WHERE key = 'group_choice_secret'";
        let mut bytes = [0u8; 32];
        rand::fill(&mut bytes);
        let candidate: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        let mut attempts = self.attempts().await;
        loop {
            let client = attempts.client().await?;
            let result = async {
                client.client.execute(INSERT, &[&candidate]).await?;
                let row = client.client.query_one(SELECT, &[]).await?;
                Ok::<String, tokio_postgres::Error>(row.get::<_, String>(0))
            }
            .await
            .map_err(Fault::from);
            if let Some(done) = attempts.settle(result) {
                return done;
            }
        }
    }

    /// Queued for the journal's next lazy commit (see [`Ledger::record_release`]); returns at
    /// once. Best effort and never a refund: the charge stands whatever the outcome.
    pub fn set_outcome(&self, charge: ChargeId, outcome: &str) {
        self.journal.outcome(charge, outcome);
    }

    /// After a release: stores each (`key`, `payload`) of `entries` for `analyst` in the replay
    /// cache (the released answer under its replay key, the noisy measures under their
    /// measures key; first writer wins, as [`Ledger::replay_put`], in the order given) and
    /// marks `charge` `released`. Queued for the journal, which commits it with
    /// `synchronous_commit = off` after the answer has left: only the charge (or the lease
    /// covering it) must survive a crash; losing these records costs the analyst at most a
    /// second charge for a repeated query. Until then [`Ledger::replay_lookup`] of this process
    /// sees the entries. Returns at once.
    pub fn record_release(&self, charge: ChargeId, analyst: &str, entries: &[(&str, &[u8])]) {
        for (key, _) in entries {
            self.index.insert(analyst, key);
        }
        self.journal.replays(analyst, entries);
        self.journal.outcome(charge, "released");
    }

    /// Charges `cost` like [`Ledger::charge_reading`], but under a budget lease: the first
    /// charge (and every charge the analyst's slice no longer covers, or made under other
    /// limits) reserves a slice of up to `--lease-queries` charges of this cost in one durable
    /// commit, and the charges it covers are made in memory, their audit rows following through
    /// the journal. With leases off (`--lease-queries 1`) this is [`Ledger::charge_reading`].
    /// The receipt's balance is the analyst's as of the slice's reservation, with this
    /// process's own use since.
    #[allow(clippy::too_many_arguments)] // as charge_reading
    pub async fn charge_leased(
        &self,
        analyst: &str,
        limit: &Limit,
        dataset_limit: Option<&Limit>,
        cost: &Cost,
        fingerprint: &str,
        mechanism: &str,
        tables: &[String],
    ) -> Result<Receipt> {
        if self.leases.slice_max.load(Ordering::Relaxed) <= 1 {
            return self
                .charge_reading(
                    analyst,
                    limit,
                    dataset_limit,
                    cost,
                    fingerprint,
                    mechanism,
                    tables,
                )
                .await;
        }
        self.leases
            .charge(
                &self.journal,
                analyst,
                limit,
                dataset_limit,
                cost,
                fingerprint,
                mechanism,
                tables,
            )
            .await
    }

    /// Charges `item`'s own cost ([`Priced::cost`]) as [`Ledger::charge_leased`] does, and
    /// returns the item bound to the receipt: what running it upstream requires.
    #[allow(clippy::too_many_arguments)] // as charge_reading
    pub async fn charge_for<T: Priced>(
        &self,
        analyst: &str,
        limit: &Limit,
        dataset_limit: Option<&Limit>,
        item: T,
        fingerprint: &str,
        mechanism: &str,
        tables: &[String],
    ) -> Result<Charged<T>> {
        let cost = item.cost();
        let receipt = self
            .charge_leased(
                analyst,
                limit,
                dataset_limit,
                &cost,
                fingerprint,
                mechanism,
                tables,
            )
            .await?;
        Ok(Charged { item, receipt })
    }

    /// Tests only: moves this process's view of the ledger's clock by `offset_us` microseconds
    /// (0, the default, is the ledger's own `now()`), so that tests can cross the window
    /// boundaries of renewing budgets without waiting a day. No command-line option or policy
    /// key reaches it; production never calls it.
    #[doc(hidden)]
    pub fn set_test_clock_offset(&self, offset_us: i64) {
        self.clock.offset_us.store(offset_us, Ordering::Relaxed);
    }

    /// Sets the most charges one slice reserves (`--lease-queries`); 1 turns leases off.
    pub fn set_lease_queries(&self, queries: u64) {
        self.leases
            .slice_max
            .store(queries.max(1), Ordering::Relaxed);
    }

    /// Closes every slice this process holds, returning their unused parts to the budgets, and
    /// waits (at most `wait`) for the journal to write what it holds. For a clean shutdown;
    /// returns how many slices were closed.
    pub async fn return_slices(&self, wait: Duration) -> usize {
        let deadline = tokio::time::Instant::now() + wait;
        // A slice being reserved ahead is closed with the others once it has arrived.
        while self.leases.fetching.load(Ordering::Acquire) > 0
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let closed = self.leases.close_idle(Duration::ZERO).await;
        while !self.journal.is_idle() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        closed
    }

    /// The analyst's balance against `limit`, the policy's, raised by the analyst's grants (zero
    /// spent and nothing granted for an analyst never charged). What this process holds reserved
    /// in a budget slice and has not used is not counted; what other processes hold is, until
    /// they return it.
    pub async fn balance(&self, analyst: &str, limit: &Limit) -> Result<Balance> {
        Ok(self.balance_with_window(analyst, limit).await?.0)
    }

    /// [`Ledger::balance`], and for a renewing `limit` the current window, which the balance
    /// is of (the ledger's clock decides which window is current).
    pub async fn balance_with_window(
        &self,
        analyst: &str,
        limit: &Limit,
    ) -> Result<(Balance, Option<Window>)> {
        const SQL: &str = "SELECT epsilon::text, delta::text, rho::text, renyi::text,
                granted_epsilon::text, granted_delta::text
            FROM pgdp.analyst_spent WHERE analyst = $1";
        let slot = self.leases.existing_slot(analyst);
        let held = match &slot {
            Some(slot) => Some(slot.lock().await),
            None => None,
        };
        let mut attempts = self.attempts().await;
        loop {
            let conn = attempts.client().await?;
            let result = match conn.statement(SQL).await {
                Ok(statement) => conn.client.query_opt(&statement, &[&analyst]).await,
                Err(e) => Err(e),
            };
            let read = result.map_err(Fault::from).and_then(|row| match row {
                Some(row) => Ok((spent_from_row(&row, 0)?, grants_from_row(&row, 4)?)),
                None => Ok((Spent::ZERO, Limit::default())),
            });
            // A renewing limit: the totals of the current window instead.
            let offset = self.clock.offset_us();
            let read = match (read, limit.period) {
                (Ok((_, grants)), Some(period)) => {
                    async {
                        let now = window::ledger_now(&conn.client, offset).await?;
                        let current = Window::containing(period, now);
                        let key = window::WindowKey::analyst(analyst, current);
                        let spent = window::read_window(&conn.client, &key).await?;
                        Ok::<_, Fault>((spent, grants, Some(current)))
                    }
                    .await
                }
                (read, _) => read.map(|(spent, grants)| (spent, grants, None)),
            };
            if let Some(done) = attempts.settle(read) {
                let (spent, grants, current) = done?;
                // This process's own unused reservation is not spent. The slot was locked
                // before the read, so the totals include the slice iff it is held (and, for a
                // renewing limit, the slice's window is this one).
                let unused = held
                    .as_ref()
                    .and_then(|h| h.as_ref())
                    .map_or(Spent::ZERO, |h| h.unused_in(current));
                let spent = spent.checked_sub_spent(&unused).unwrap_or(spent);
                return Ok((Balance::new(&limit.granted(&grants), spent), current));
            }
        }
    }

    /// The dataset-wide balance (all analysts together) against `limit`.
    pub async fn dataset_balance(&self, limit: &Limit) -> Result<Balance> {
        Ok(self.dataset_balance_with_window(limit).await?.0)
    }

    /// [`Ledger::dataset_balance`], and for a renewing `limit` the current window.
    pub async fn dataset_balance_with_window(
        &self,
        limit: &Limit,
    ) -> Result<(Balance, Option<Window>)> {
        const SQL: &str =
            "SELECT epsilon::text, delta::text, rho::text, renyi::text FROM pgdp.dataset_spent WHERE id";
        let mut attempts = self.attempts().await;
        loop {
            let conn = attempts.client().await?;
            let result = match conn.statement(SQL).await {
                Ok(statement) => conn.client.query_opt(&statement, &[]).await,
                Err(e) => Err(e),
            };
            let spent = result.map_err(Fault::from).and_then(|row| {
                row.as_ref()
                    .map_or(Ok(Spent::ZERO), |row| spent_from_row(row, 0))
            });
            // A renewing limit: the totals of the current window instead.
            let offset = self.clock.offset_us();
            let spent = match (spent, limit.period) {
                (Ok(_), Some(period)) => {
                    async {
                        let now = window::ledger_now(&conn.client, offset).await?;
                        let current = Window::containing(period, now);
                        let key = window::WindowKey::dataset(current);
                        Ok::<_, Fault>((
                            window::read_window(&conn.client, &key).await?,
                            Some(current),
                        ))
                    }
                    .await
                }
                (spent, _) => spent.map(|spent| (spent, None)),
            };
            if let Some(done) = attempts.settle(spent) {
                return done.map(|(spent, current)| (Balance::new(limit, spent), current));
            }
        }
    }

    /// Runs `sql` (prepared once per connection) with `params` and reads the rows with `read`,
    /// retrying once on a fresh connection: the one loop of the ledger's single-statement reads.
    async fn query_prepared<T>(
        &self,
        sql: &'static str,
        params: &[&(dyn ToSql + Sync)],
        read: impl Fn(&[Row]) -> Result<T, Fault> + Send,
    ) -> Result<T> {
        let mut attempts = self.attempts().await;
        loop {
            let conn = attempts.client().await?;
            let result = match conn.statement(sql).await {
                Ok(statement) => conn.client.query(&statement, params).await,
                Err(e) => Err(e),
            };
            let read = result.map_err(Fault::from).and_then(|rows| read(&rows));
            if let Some(done) = attempts.settle(read) {
                return done;
            }
        }
    }

    /// A free connection slot, or the next one in turn if all are busy, ready for attempts.
    async fn attempts(&self) -> Attempts<'_> {
        for slot in &self.slots {
            if let Ok(slot) = slot.try_lock() {
                return Attempts {
                    config: &self.config,
                    schema_ready: &self.schema_ready,
                    slot,
                    retried: false,
                };
            }
        }
        let index = self.next_slot.fetch_add(1, Ordering::Relaxed) % self.slots.len();
        Attempts {
            config: &self.config,
            schema_ready: &self.schema_ready,
            slot: self.slots[index].lock().await,
            retried: false,
        }
    }
}

/// One call's use of a connection slot: (re)connects when the slot has no live connection, and
/// allows one more attempt on a fresh connection if the first breaks. Every ledger method is a
/// loop `client()` → operation → `settle()`: [`Ledger::query_prepared`] for a single read,
/// written out in place otherwise (a generic helper taking an async closure would make the
/// methods' futures lose `Send`).
struct Attempts<'l> {
    config: &'l Dsn,
    schema_ready: &'l AtomicBool,
    slot: MutexGuard<'l, Option<Conn>>,
    retried: bool,
}

impl Attempts<'_> {
    /// The slot's connection, opened now if it has none or it was closed. The first connection
    /// of the ledger also creates or checks the tables.
    async fn client(&mut self) -> Result<&mut Conn> {
        if self
            .slot
            .as_ref()
            .is_none_or(|conn| conn.client.is_closed())
        {
            *self.slot = None;
            let mut client = open(self.config).await?;
            if !self.schema_ready.load(Ordering::Acquire) {
                match ensure_schema(&mut client).await {
                    Ok(()) => self.schema_ready.store(true, Ordering::Release),
                    Err(Fault::Db(error)) => {
                        warn!(error = %error, "cannot create or check the privacy ledger's tables");
                        return Err(Error::LedgerUnavailable);
                    }
                    Err(Fault::Corrupt(what)) => {
                        warn!(what, "the privacy ledger's tables cannot be used");
                        return Err(Error::LedgerUnavailable);
                    }
                }
            }
            *self.slot = Some(Conn {
                client,
                statements: HashMap::new(),
            });
        }
        Ok(self.slot.as_mut().expect("the slot was filled just above"))
    }

    /// The final result of the call, or `None` to try once more on a fresh connection. Logs
    /// PostgreSQL's text and maps every failure to the client-facing error.
    fn settle<T>(&mut self, result: Result<T, Fault>) -> Option<Result<T>> {
        match result {
            Ok(value) => Some(Ok(value)),
            Err(Fault::Corrupt(what)) => {
                warn!(what, "the privacy ledger holds a value pgdp cannot read");
                Some(Err(Error::LedgerUnavailable))
            }
            Err(Fault::Db(error)) => {
                warn!(error = %error, "privacy ledger statement failed");
                if is_connection_error(&error) {
                    *self.slot = None;
                    if !self.retried {
                        self.retried = true;
                        return None;
                    }
                }
                Some(Err(Error::LedgerUnavailable))
            }
        }
    }
}

/// The one row a statement returned, if any (`query_opt`'s contract over a prepared read).
fn at_most_one(rows: &[Row]) -> Result<Option<&Row>, Fault> {
    match rows {
        [] => Ok(None),
        [row] => Ok(Some(row)),
        _ => Err(Fault::Corrupt("a ledger read returned more than one row")),
    }
}

/// Whether `error` means the connection is unusable (as opposed to a statement failing on a
/// healthy connection).
fn is_connection_error(error: &tokio_postgres::Error) -> bool {
    match error.code() {
        None => error.as_db_error().is_none(),
        Some(code) => {
            let code = code.code();
            code.starts_with("08") || code.starts_with("57P")
        }
    }
}

/// Opens one connection and applies [`SESSION_SETUP`].
async fn open(config: &Dsn) -> Result<Client> {
    let timeout = Duration::from_millis(UPSTREAM_CONNECT_TIMEOUT_MS);
    let client = match tokio::time::timeout(timeout, config.connect("privacy ledger")).await {
        Ok(Ok(client)) => client,
        Ok(Err(error)) => {
            warn!(error = %error, endpoint = %config.endpoints(), "cannot connect to the privacy ledger");
            return Err(Error::LedgerUnavailable);
        }
        Err(_) => {
            warn!(endpoint = %config.endpoints(), "connecting to the privacy ledger timed out");
            return Err(Error::LedgerUnavailable);
        }
    };
    let setup = format!("{SESSION_SETUP}; SET statement_timeout = {STATEMENT_TIMEOUT_MS}");
    if let Err(error) = client.batch_execute(&setup).await {
        warn!(error = %error, "cannot configure the privacy ledger session");
        return Err(Error::LedgerUnavailable);
    }
    Ok(client)
}
