//! Budget leases in the ledger: reserving a slice (`budget::lease`) in one durable commit,
//! charging queries against it in memory, and returning its unused part.
//!
//! Invariants:
//! - A slice's reservation is part of the analyst's and the dataset's durable totals from the
//!   commit that reserves it until the commit that closes it, which replaces it by what was
//!   used. Both commits take the analyst's row lock and then the dataset's, like a group commit,
//!   and are durable (`synchronous_commit = on`) before anything is charged under the slice.
//! - A charge under a slice is made in memory ([`crate::budget::Slice::take`]) while this
//!   process holds the analyst's slot lock, so the queries of one process never charge one
//!   reservation twice; the audit row follows through the journal.
//! - A slice is closed at most once: the close updates its `pgdp.lease` row only while it is
//!   open (`closed_at IS NULL`) and subtracts only then, so a retried close after a broken
//!   connection cannot return the same part twice. After any failure of a transaction that
//!   closes a slice, this process forgets the slice (it may or may not be closed): nothing is
//!   charged under it again, and if its close did not commit, its reservation stays counted in
//!   full, as after a crash.
//! - A process that dies holding a slice leaves its row open: its whole reservation stays
//!   spent. No other process closes it (it cannot know what was released under it).
//! - Renewing budgets: a slice is reserved in the current windows of the analyst's and the
//!   dataset's limits (admitted against, and added to, those windows' totals as well as the
//!   whole-history totals) and is charged under only while [`Held::in_windows`] holds: this
//!   process's estimate of the ledger's clock, which is never behind the ledger's (it starts
//!   from the ledger's `now()` read in the reserving transaction and adds the time elapsed since
//!   before that transaction began), is still inside them. The first charge after that closes
//!   the slice, returning its unused part to the windows it was reserved in, and reserves a new
//!   slice in the new windows, in one transaction. So a charge under a slice always falls in
//!   the slice's windows, and no window's totals exceed its limit.
//! - Reserving ahead: once half of a slice of at least [`SLICE_AHEAD_QUERIES_MIN`] queries is
//!   used, the next slice is reserved by a background task (the same transaction, closing
//!   nothing) and kept beside it; when the current slice no longer covers a cost, the one ahead
//!   takes over and the old one is closed in the background. Both are open, hence counted in
//!   full, until closed, so the theorem of docs/privacy.md §8 covers them as any two slices.

use std::time::Instant;

use super::journal::{epoch_seconds, LeasedCharge};
use super::window::{ledger_now, Clock, WindowKey, WindowTotals};
use super::*;
use crate::budget::lease::{slice_size, Slice};
use crate::limits::{SLICE_AHEAD_QUERIES_MIN, SLICE_IDLE_RETURN_MS};

/// A slice this process holds for one analyst.
pub(super) struct Held {
    /// What was reserved and not used yet.
    pub(super) slice: Slice,
    id: i64,
    /// The policy limits the slice was reserved under: a reload that changes them closes it.
    limit: Limit,
    dataset_limit: Option<Limit>,
    /// The analyst's limit with the grants read at reservation, for the balance shown.
    granted: Limit,
    /// The analyst's totals at reservation without this slice's reservation.
    others: Spent,
    next_seq: i64,
    last_charge: Instant,
    /// The windows the slice was reserved in (`None`: that limit does not renew).
    pub(super) windows: SliceWindows,
    /// The ledger's clock (offset included) read in the reserving transaction, the offset then,
    /// and an instant taken before that transaction began.
    reserved_at_us: i64,
    reserved_offset_us: i64,
    reserved_before: Instant,
    /// How many charges of the opening cost the slice reserved.
    queries: u64,
    /// The next slice, reserved ahead (module docs).
    ahead: Option<Box<Held>>,
    /// Whether a reservation ahead is under way for this analyst.
    fetching: bool,
}

/// The windows of renewing limits a slice belongs to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct SliceWindows {
    pub(super) analyst: Option<Window>,
    pub(super) dataset: Option<Window>,
}

impl SliceWindows {
    /// The windows holding `now` for `limit` and `dataset_limit` (`None` where they do not
    /// renew).
    fn at(now: i64, limit: &Limit, dataset_limit: Option<&Limit>) -> SliceWindows {
        SliceWindows {
            analyst: limit.period.map(|p| Window::containing(p, now)),
            dataset: dataset_limit
                .and_then(|l| l.period)
                .map(|p| Window::containing(p, now)),
        }
    }
}

impl Held {
    /// Whether this process's estimate of the ledger's clock is still inside every window of
    /// the slice. The estimate is the ledger's `now()` read while reserving plus the time
    /// elapsed since an instant taken before that transaction began (so it is never behind the
    /// ledger's clock), plus any change of the test clock offset since.
    pub(super) fn in_windows(&self, offset_us: i64) -> bool {
        let windows = [self.windows.analyst, self.windows.dataset];
        if windows.iter().all(Option::is_none) {
            return true;
        }
        let elapsed = i64::try_from(self.reserved_before.elapsed().as_micros()).unwrap_or(i64::MAX);
        let estimate = self
            .reserved_at_us
            .saturating_add(elapsed)
            .saturating_add(offset_us.saturating_sub(self.reserved_offset_us));
        windows.iter().flatten().all(|w| w.contains(estimate))
    }

    /// This slice and the one reserved ahead of it, if any.
    fn parts(&self) -> Vec<&Held> {
        let mut parts = vec![self];
        parts.extend(self.ahead.as_deref());
        parts
    }

    /// What this process holds reserved and unused for the analyst (this slice and the one
    /// ahead) in the analyst's window `current` (`None`: the limit does not renew).
    pub(super) fn unused_in(&self, current: Option<Window>) -> Spent {
        self.parts()
            .iter()
            .filter(|h| h.windows.analyst == current)
            .try_fold(Spent::ZERO, |total, h| {
                total.checked_add_spent(&h.slice.unused())
            })
            .unwrap_or(Spent::ZERO)
    }
}

/// The slices of this process, one slot per analyst, and the connection their commits use.
pub(super) struct LeaseBook {
    config: Dsn,
    schema_ready: Arc<AtomicBool>,
    slots: std::sync::Mutex<HashMap<String, Arc<Mutex<Option<Held>>>>>,
    conn: Mutex<Option<Conn>>,
    /// Who holds the slices (recorded with each).
    holder: String,
    /// Most charges per slice; 1 turns leases off.
    pub(super) slice_max: std::sync::atomic::AtomicU64,
    watching: AtomicBool,
    /// The ledger's clock (its offset, for tests).
    clock: Arc<Clock>,
    /// Reservations ahead under way (a clean shutdown waits for them, then closes their slices).
    pub(super) fetching: std::sync::atomic::AtomicUsize,
    /// Woken when a reservation ahead has ended (a query that needs it waits for it rather
    /// than reserving a second slice in its own path).
    fetched: tokio::sync::Notify,
}

/// What a reservation transaction did.
enum Reserved {
    Held(Box<Held>),
    Refused(Box<Refusal>),
}

/// Reserves a slice: a row in `pgdp.lease`.
const INSERT_LEASE: &str = "INSERT INTO pgdp.lease (analyst, holder, queries, epsilon, delta, rho, renyi,
        window_period, window_start, dataset_window_period, dataset_window_start)
     VALUES ($1, $2, $3, $4::text::numeric, $5::text::numeric, $6::text::numeric, $7::text::numeric[],
        $8, $9::text::timestamptz, $10, $11::text::timestamptz)
     RETURNING id";

/// Closes a slice with what was used, only if it is still open; returns its id if it was.
const CLOSE_LEASE: &str = "UPDATE pgdp.lease SET closed_at = now(), charges = $2,
        used_epsilon = $3::text::numeric, used_delta = $4::text::numeric,
        used_rho = $5::text::numeric, used_renyi = $6::text::numeric[]
     WHERE id = $1 AND closed_at IS NULL RETURNING id";

/// Writes an analyst's totals and the dataset's (both locked before); `$6` charges are added
/// to both counts.
const SET_TOTALS: &str = "WITH analyst AS (
        UPDATE pgdp.analyst_spent SET epsilon = $2::text::numeric, delta = $3::text::numeric,
            rho = $4::text::numeric, renyi = $5::text::numeric[], charges = charges + $6,
            updated_at = now()
        WHERE analyst = $1)
     UPDATE pgdp.dataset_spent SET epsilon = $7::text::numeric, delta = $8::text::numeric,
         rho = $9::text::numeric, renyi = $10::text::numeric[], charges = charges + $6,
         updated_at = now()
     WHERE id";

impl LeaseBook {
    pub(super) fn new(config: Dsn, schema_ready: Arc<AtomicBool>, clock: Arc<Clock>) -> LeaseBook {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_default();
        LeaseBook {
            config,
            schema_ready,
            slots: std::sync::Mutex::new(HashMap::new()),
            conn: Mutex::new(None),
            holder: format!("pid {} on {}", std::process::id(), host),
            slice_max: std::sync::atomic::AtomicU64::new(crate::limits::SLICE_QUERIES_DEFAULT),
            watching: AtomicBool::new(false),
            clock,
            fetching: std::sync::atomic::AtomicUsize::new(0),
            fetched: tokio::sync::Notify::new(),
        }
    }

    fn slot(&self, analyst: &str) -> Arc<Mutex<Option<Held>>> {
        let mut slots = self
            .slots
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        Arc::clone(slots.entry(analyst.to_string()).or_default())
    }

    fn attempts<'a>(&'a self, slot: MutexGuard<'a, Option<Conn>>) -> Attempts<'a> {
        Attempts {
            config: &self.config,
            schema_ready: &self.schema_ready,
            slot,
            retried: false,
        }
    }

    /// The analyst's slot, if this process ever held a slice for them: lock it to read the
    /// ledger's totals and this process's unused reservation consistently.
    pub(super) fn existing_slot(&self, analyst: &str) -> Option<Arc<Mutex<Option<Held>>>> {
        let slots = self
            .slots
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        slots.get(analyst).cloned()
    }

    /// Charges `cost` under the analyst's slice, reserving a new one (and closing the old) when
    /// it does not cover the cost or the limits changed. See [`Ledger::charge_leased`].
    #[allow(clippy::too_many_arguments)] // the charge's plain parts, as Ledger::charge_reading
    pub(super) async fn charge(
        self: &Arc<Self>,
        journal: &Arc<journal::Journal>,
        analyst: &str,
        limit: &Limit,
        dataset_limit: Option<&Limit>,
        cost: &Cost,
        fingerprint: &str,
        mechanism: &str,
        tables: &[String],
    ) -> Result<Receipt> {
        let slot = self.slot(analyst);
        let mut held = slot.lock().await;
        // A slice being reserved ahead is waited for when the current one is used up, so that
        // slices arrive in order and the balances shown stay exact.
        while held
            .as_ref()
            .is_some_and(|h| h.fetching && h.ahead.is_none() && !h.slice.covers(cost))
        {
            let fetched = self.fetched.notified();
            tokio::pin!(fetched);
            // Registered before the slot is unlocked: the end of the reservation, which needs
            // the slot, cannot be missed.
            fetched.as_mut().enable();
            drop(held);
            fetched.await;
            held = slot.lock().await;
        }
        let same_limits = |h: &Held| h.limit == *limit && h.dataset_limit == dataset_limit.copied();
        let offset = self.clock.offset_us();
        let mut covered = match held.as_mut() {
            Some(h) if same_limits(h) && h.in_windows(offset) => h.slice.take(cost),
            _ => false,
        };
        // The slice reserved ahead takes over; the old one is closed in the background.
        if let Some(h) = held.as_mut().filter(|h| !covered && same_limits(h)) {
            if let Some(mut next) = h.ahead.take() {
                if same_limits(&next) && next.in_windows(offset) && next.slice.take(cost) {
                    // Once the old slice is closed, what it did not use is not spent.
                    next.others = next
                        .others
                        .checked_sub_spent(&h.slice.unused())
                        .unwrap_or(next.others);
                    next.fetching = h.fetching;
                    let old = std::mem::replace(h, *next);
                    self.close_later(analyst, old);
                    covered = true;
                } else {
                    h.ahead = Some(next);
                }
            }
        }
        if !covered {
            let old = held.take();
            let olds = old.as_ref().map(Held::parts).unwrap_or_default();
            match self
                .reserve(analyst, &olds, limit, dataset_limit, cost)
                .await
            {
                Ok(Reserved::Held(mut new)) => {
                    if !new.slice.take(cost) {
                        // A slice is reserved for at least one charge of this very cost.
                        return Err(Error::LedgerUnavailable);
                    }
                    *held = Some(*new);
                    self.watch();
                }
                Ok(Reserved::Refused(refusal)) => return Err(Error::from(*refusal)),
                // The old slice may have been closed: never charge under it again.
                Err(e) => return Err(e),
            }
        }
        let h = held.as_mut().ok_or(Error::LedgerUnavailable)?;
        h.last_charge = Instant::now();
        if !h.fetching
            && h.ahead.is_none()
            && h.queries >= SLICE_AHEAD_QUERIES_MIN
            && h.slice.charges.saturating_mul(2) >= h.queries
        {
            h.fetching = true;
            self.reserve_ahead(
                Arc::clone(&slot),
                analyst,
                *limit,
                dataset_limit.copied(),
                *cost,
            );
        }
        let seq = h.next_seq;
        h.next_seq += 1;
        let spent = h
            .others
            .checked_add_spent(&h.slice.used)
            .ok_or(Error::LedgerUnavailable)?;
        let receipt = Receipt {
            id: ChargeId::Leased { lease: h.id, seq },
            balance: Balance::new(&h.granted, spent),
            window: h.windows.analyst,
        };
        journal.charge(LeasedCharge {
            lease: h.id,
            seq,
            analyst: analyst.to_string(),
            at: epoch_seconds(),
            fingerprint: fingerprint.to_string(),
            mechanism: mechanism.to_string(),
            cost: *cost,
            tables: tables.to_vec(),
            outcome: "charged".to_string(),
        });
        Ok(receipt)
    }

    /// One transaction (retried once on a broken connection): lock the analyst's row and the
    /// dataset's, close `old` if given, and reserve a slice for `cost` if one fits.
    async fn reserve(
        &self,
        analyst: &str,
        old: &[&Held],
        limit: &Limit,
        dataset_limit: Option<&Limit>,
        cost: &Cost,
    ) -> Result<Reserved> {
        let slice_max = self.slice_max.load(Ordering::Relaxed);
        let mut attempts = self.attempts(self.conn.lock().await);
        loop {
            let conn = attempts.client().await?;
            let result = reserve_once(
                conn,
                &self.holder,
                analyst,
                old,
                Request {
                    limit,
                    dataset_limit,
                    cost,
                },
                slice_max,
                self.clock.offset_us(),
            )
            .await;
            if let Some(done) = attempts.settle(result) {
                return done;
            }
        }
    }

    /// Closes `held` and the slice reserved ahead of it (one transaction, retried once on a
    /// broken connection).
    async fn close(&self, analyst: &str, held: &Held) -> Result<()> {
        let parts = held.parts();
        let mut attempts = self.attempts(self.conn.lock().await);
        loop {
            let conn = attempts.client().await?;
            let result = close_once(conn, analyst, &parts).await;
            if let Some(done) = attempts.settle(result) {
                return done;
            }
        }
    }

    /// Closes `old` in the background (it is forgotten already: nothing is charged under it).
    fn close_later(self: &Arc<Self>, analyst: &str, old: Held) {
        let book = Arc::clone(self);
        let analyst = analyst.to_string();
        tokio::spawn(async move {
            if book.close(&analyst, &old).await.is_err() {
                warn!(
                    lease = old.id,
                    "could not return a budget slice; its whole reservation stays spent"
                );
            }
        });
    }

    /// Reserves the analyst's next slice in the background (module docs) and keeps it beside
    /// the current one; when the current one is gone by then, the new one becomes current, and
    /// when one is already kept ahead (or the limits changed), the new one is closed at once.
    /// Refused or failed: nothing is kept, and the query that needs it reserves in its own path.
    fn reserve_ahead(
        self: &Arc<Self>,
        slot: Arc<Mutex<Option<Held>>>,
        analyst: &str,
        limit: Limit,
        dataset_limit: Option<Limit>,
        cost: Cost,
    ) {
        let book = Arc::clone(self);
        let analyst = analyst.to_string();
        book.fetching.fetch_add(1, Ordering::AcqRel);
        tokio::spawn(async move {
            book.install_ahead(slot, &analyst, &limit, dataset_limit.as_ref(), &cost)
                .await;
            book.fetching.fetch_sub(1, Ordering::AcqRel);
            book.fetched.notify_waiters();
        });
    }

    /// The work of [`LeaseBook::reserve_ahead`].
    async fn install_ahead(
        &self,
        slot: Arc<Mutex<Option<Held>>>,
        analyst: &str,
        limit: &Limit,
        dataset_limit: Option<&Limit>,
        cost: &Cost,
    ) {
        let reserved = self.reserve(analyst, &[], limit, dataset_limit, cost).await;
        let mut held = slot.lock().await;
        if let Some(h) = held.as_mut() {
            h.fetching = false;
        }
        let new = match reserved {
            Ok(Reserved::Held(new)) => new,
            Ok(Reserved::Refused(_)) => return,
            Err(e) => {
                tracing::debug!(error = %e, "could not reserve a budget slice ahead");
                return;
            }
        };
        let same_limits = |h: &Held| h.limit == new.limit && h.dataset_limit == new.dataset_limit;
        match held.as_mut() {
            Some(h) if h.ahead.is_none() && same_limits(h) => h.ahead = Some(new),
            None => *held = Some(*new),
            Some(_) => {
                drop(held);
                if self.close(analyst, &new).await.is_err() {
                    warn!(
                        lease = new.id,
                        "could not return a budget slice; its whole reservation stays spent"
                    );
                }
            }
        }
    }

    /// Closes every slice idle for `idle` or more (all of them for a zero `idle`) and returns
    /// how many were closed. A slice being charged is left alone.
    pub(super) async fn close_idle(&self, idle: Duration) -> usize {
        let slots: Vec<(String, Arc<Mutex<Option<Held>>>)> = {
            let slots = self
                .slots
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            slots
                .iter()
                .map(|(analyst, slot)| (analyst.clone(), Arc::clone(slot)))
                .collect()
        };
        let mut closed = 0;
        for (analyst, slot) in slots {
            let Ok(mut held) = slot.try_lock() else {
                continue;
            };
            if held.as_ref().is_none_or(|h| h.last_charge.elapsed() < idle) {
                continue;
            }
            // Forgotten whatever the outcome (module docs).
            if let Some(h) = held.take() {
                match self.close(&analyst, &h).await {
                    Ok(()) => closed += 1,
                    Err(_) => warn!(
                        lease = h.id,
                        "could not return a budget slice; its whole reservation stays spent"
                    ),
                }
            }
        }
        closed
    }

    /// Starts the task that returns idle slices, once.
    fn watch(self: &Arc<Self>) {
        if self.watching.swap(true, Ordering::AcqRel) {
            return;
        }
        let book = Arc::downgrade(self);
        tokio::spawn(async move {
            let idle = Duration::from_millis(SLICE_IDLE_RETURN_MS);
            loop {
                tokio::time::sleep(idle / 2).await;
                let Some(book) = book.upgrade() else {
                    return;
                };
                book.close_idle(idle).await;
            }
        });
    }
}

/// Writes the analyst's and the dataset's totals, adding `charges` to both counts.
async fn set_totals(
    tx: &tokio_postgres::Transaction<'_>,
    analyst: &str,
    spent: &Spent,
    dataset: &Spent,
    charges: i64,
) -> Result<(), Fault> {
    let text = |x: Fixed| x.to_numeric_text();
    tx.execute(
        SET_TOTALS,
        &[
            &analyst,
            &text(spent.epsilon),
            &text(spent.delta),
            &text(spent.rho),
            &divergences_literal(spent),
            &charges,
            &text(dataset.epsilon),
            &text(dataset.delta),
            &text(dataset.rho),
            &divergences_literal(dataset),
        ],
    )
    .await?;
    Ok(())
}

/// Within `tx` (which holds both locks): closes `held` if its row is still open, returning its
/// unused part to `spent` and `dataset` and to the windows it was reserved in (in `windows`);
/// returns the charges it made (0 if it was closed already).
async fn close_in(
    tx: &tokio_postgres::Transaction<'_>,
    analyst: &str,
    held: &Held,
    spent: &mut Spent,
    dataset: &mut Spent,
    windows: &mut WindowTotals,
) -> Result<i64, Fault> {
    let used = &held.slice.used;
    let charges = i64::try_from(held.slice.charges).unwrap_or(i64::MAX);
    let text = |x: Fixed| x.to_numeric_text();
    let was_open = tx
        .query_opt(
            CLOSE_LEASE,
            &[
                &held.id,
                &charges,
                &text(used.epsilon),
                &text(used.delta),
                &text(used.rho),
                &divergences_literal(used),
            ],
        )
        .await?
        .is_some();
    if !was_open {
        return Ok(0);
    }
    let unused = held.slice.unused();
    *spent = spent.checked_sub_spent(&unused).ok_or(Fault::Corrupt(
        "an open slice is not part of the analyst's totals",
    ))?;
    *dataset = dataset.checked_sub_spent(&unused).ok_or(Fault::Corrupt(
        "an open slice is not part of the dataset's totals",
    ))?;
    let keys = [
        held.windows.analyst.map(|w| WindowKey::analyst(analyst, w)),
        held.windows.dataset.map(WindowKey::dataset),
    ];
    for key in keys.iter().flatten() {
        let total = windows.get(tx, key).await?;
        let total = total.checked_sub_spent(&unused).ok_or(Fault::Corrupt(
            "an open slice is not part of its window's totals",
        ))?;
        windows.set(key, total, charges)?;
    }
    Ok(charges)
}

/// One attempt at closing the slices `held` of one analyst.
async fn close_once(conn: &mut Conn, analyst: &str, held: &[&Held]) -> Result<(), Fault> {
    let tx = conn.client.transaction().await?;
    let row = tx.query_one(LOCK_ANALYSTS, &[&vec![analyst]]).await?;
    let mut spent = spent_from_row(&row, 1)?;
    let mut dataset = spent_from_row(&tx.query_one(LOCK_DATASET, &[]).await?, 0)?;
    let mut windows = WindowTotals::default();
    let mut charges = 0i64;
    for h in held {
        let closed = close_in(&tx, analyst, h, &mut spent, &mut dataset, &mut windows).await?;
        charges = charges.saturating_add(closed);
    }
    set_totals(&tx, analyst, &spent, &dataset, charges).await?;
    windows.store(&tx).await?;
    tx.commit().await?;
    Ok(())
}

/// What a reservation is for: the limits and the cost of the charge that asks for it.
struct Request<'a> {
    limit: &'a Limit,
    dataset_limit: Option<&'a Limit>,
    cost: &'a Cost,
}

/// One attempt at a reservation (see [`LeaseBook::reserve`]).
async fn reserve_once(
    conn: &mut Conn,
    holder: &str,
    analyst: &str,
    old: &[&Held],
    request: Request<'_>,
    slice_max: u64,
    clock_offset_us: i64,
) -> Result<Reserved, Fault> {
    let Request {
        limit,
        dataset_limit,
        cost,
    } = request;
    // Taken before the transaction begins, so the clock estimate of [`Held::in_windows`] is
    // never behind the ledger's.
    let reserved_before = Instant::now();
    let tx = conn.client.transaction().await?;
    let row = tx.query_one(LOCK_ANALYSTS, &[&vec![analyst]]).await?;
    let mut spent = spent_from_row(&row, 1)?;
    let granted = limit.granted(&grants_from_row(&row, 5)?);
    let mut dataset = spent_from_row(&tx.query_one(LOCK_DATASET, &[]).await?, 0)?;
    let renews = limit.period.is_some()
        || dataset_limit.is_some_and(|l| l.period.is_some())
        || old.iter().any(|h| h.windows != SliceWindows::default());
    let now = if renews {
        ledger_now(&tx, clock_offset_us).await?
    } else {
        0
    };
    let mut windows = WindowTotals::default();
    let mut charges = 0i64;
    for h in old {
        let closed = close_in(&tx, analyst, h, &mut spent, &mut dataset, &mut windows).await?;
        charges = charges.saturating_add(closed);
    }
    // The totals the rule applies to: the current windows' for renewing limits.
    let slice_windows = SliceWindows::at(now, limit, dataset_limit);
    let analyst_key = slice_windows
        .analyst
        .map(|w| WindowKey::analyst(analyst, w));
    let dataset_key = slice_windows.dataset.map(WindowKey::dataset);
    let admitted_on = match &analyst_key {
        Some(key) => windows.get(&tx, key).await?,
        None => spent,
    };
    let dataset_admitted_on = match &dataset_key {
        Some(key) => windows.get(&tx, key).await?,
        None => dataset,
    };
    let k = slice_size(
        &granted,
        &admitted_on,
        dataset_limit.map(|l| (l, &dataset_admitted_on)),
        cost,
        slice_max,
    );
    let slice = if k == 0 { None } else { Slice::of(cost, k) };
    let Some(slice) = slice else {
        let refusal = refusal_of(
            &granted,
            &admitted_on,
            dataset_limit.map(|l| (l, &dataset_admitted_on)),
            cost,
            slice_windows,
        )?;
        if !old.is_empty() {
            set_totals(&tx, analyst, &spent, &dataset, charges).await?;
            windows.store(&tx).await?;
            tx.commit().await?;
        } else {
            tx.rollback().await?;
        }
        return Ok(Reserved::Refused(Box::new(refusal)));
    };
    let reserved = slice.reserved;
    let others = admitted_on;
    // The totals a limit governs get its rule fixed, as `admit` fixes it for a charge.
    let spent = plus_reserved(&spent, &reserved, analyst_key.is_none().then_some(&granted))?;
    let dataset_whole = dataset_limit.filter(|_| dataset_key.is_none());
    let dataset = plus_reserved(&dataset, &reserved, dataset_whole)?;
    if let Some(key) = &analyst_key {
        let total = plus_reserved(&admitted_on, &reserved, Some(&granted))?;
        windows.set(key, total, 0)?;
    }
    if let Some(key) = &dataset_key {
        windows.set(
            key,
            plus_reserved(&dataset_admitted_on, &reserved, dataset_limit)?,
            0,
        )?;
    }
    let id = insert_lease(&tx, analyst, holder, k, &reserved, slice_windows).await?;
    set_totals(&tx, analyst, &spent, &dataset, charges).await?;
    windows.store(&tx).await?;
    tx.commit().await?;
    Ok(Reserved::Held(Box::new(Held {
        id,
        slice,
        limit: *limit,
        dataset_limit: dataset_limit.copied(),
        granted,
        others,
        next_seq: 0,
        last_charge: Instant::now(),
        windows: slice_windows,
        reserved_at_us: now,
        reserved_offset_us: clock_offset_us,
        reserved_before,
        queries: k,
        ahead: None,
        fetching: false,
    })))
}

/// `total` plus a reservation, with the rule of `governing` fixed when that limit governs it
/// ([`Spent::fixed_under`]).
fn plus_reserved(
    total: &Spent,
    reserved: &Spent,
    governing: Option<&Limit>,
) -> Result<Spent, Fault> {
    let sum = total
        .checked_add_spent(reserved)
        .ok_or(Fault::Corrupt("a total overflows"))?;
    Ok(governing.map_or(sum, |limit| sum.fixed_under(limit)))
}

/// Why no slice of a reservation fits: the analyst's limit (`granted`, over `admitted_on`) or
/// the dataset's refuses `cost`, in the windows of renewing limits.
fn refusal_of(
    granted: &Limit,
    admitted_on: &Spent,
    dataset: Option<(&Limit, &Spent)>,
    cost: &Cost,
    slice_windows: SliceWindows,
) -> Result<Refusal, Fault> {
    let dataset_refusal = || {
        let (limit, dataset_admitted_on) = dataset?;
        admit(limit, dataset_admitted_on, cost)
            .err()
            .map(|refusal| Refusal {
                scope: Scope::Dataset,
                window: slice_windows.dataset,
                ..refusal
            })
    };
    Ok(match admit(granted, admitted_on, cost) {
        Err(refusal) => Refusal {
            window: slice_windows.analyst,
            ..refusal
        },
        Ok(_) => match dataset_refusal() {
            Some(refusal) => refusal,
            // Admitted one by one but no slice fits: only on overflow.
            None => return Err(Fault::Corrupt("no slice fits a cost the rule admits")),
        },
    })
}

/// Records a lease of `k` queries reserving `reserved` in its windows; its id.
async fn insert_lease(
    tx: &tokio_postgres::Transaction<'_>,
    analyst: &str,
    holder: &str,
    k: u64,
    reserved: &Spent,
    slice_windows: SliceWindows,
) -> Result<i64, Fault> {
    let text = |x: Fixed| x.to_numeric_text();
    let period = |w: Option<Window>| w.map(|w| w.period.name());
    let start = |w: Option<Window>| w.map(|w| w.start_literal());
    Ok(tx
        .query_one(
            INSERT_LEASE,
            &[
                &analyst,
                &holder,
                &i64::try_from(k).unwrap_or(i64::MAX),
                &text(reserved.epsilon),
                &text(reserved.delta),
                &text(reserved.rho),
                &divergences_literal(reserved),
                &period(slice_windows.analyst),
                &start(slice_windows.analyst),
                &period(slice_windows.dataset),
                &start(slice_windows.dataset),
            ],
        )
        .await?
        .try_get(0)?)
}
