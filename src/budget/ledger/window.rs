//! Per-window totals of renewing budgets (`period: day | week | month`) in the ledger.
//!
//! Invariants:
//! - A window row (`pgdp.analyst_window_spent`, `pgdp.dataset_window_spent`) is read and written
//!   only by a transaction that holds its parent's row lock: the analyst's `analyst_spent` row
//!   for the analyst's windows, the `dataset_spent` row for the dataset's. Every such
//!   transaction (group commit, slice reservation and close, reset) takes those locks first and
//!   in the usual order (analysts, then the dataset), so window rows need no lock order of their
//!   own and reads under the parent lock see the latest committed totals.
//! - The window of a charge is the one holding the ledger's clock in the charge's transaction:
//!   PostgreSQL's `now()` (the transaction's start) plus [`Clock::offset_us`], which only tests
//!   set. Every pgdp process sharing a ledger therefore uses one clock.
//! - A window row holds the totals of the charges (and slice reservations) admitted in that
//!   window since its last reset. The whole-history totals (`analyst_spent`, `dataset_spent`)
//!   are kept as well, so `pgdp budget history` and `pgdp audit` keep everything.

use std::sync::atomic::AtomicI64;

use super::*;
use crate::budget::window::Window;

/// The ledger's clock as a pgdp process sees it: PostgreSQL's `now()` plus an offset that is 0
/// in production and set only by tests ([`Ledger::set_test_clock_offset`]) to cross window
/// boundaries without waiting.
#[derive(Debug, Default)]
pub(super) struct Clock {
    pub(super) offset_us: AtomicI64,
}

impl Clock {
    pub(super) fn offset_us(&self) -> i64 {
        self.offset_us.load(Ordering::Relaxed)
    }
}

/// The ledger's clock in the current transaction, in microseconds since the Unix epoch.
const LEDGER_NOW: &str = "SELECT (extract(epoch FROM now()) * 1000000)::int8";

/// Reads the ledger's clock (`now()` of `client`'s current transaction) plus `offset_us`.
pub(super) async fn ledger_now<C: tokio_postgres::GenericClient>(
    client: &C,
    offset_us: i64,
) -> Result<i64, Fault> {
    let now: i64 = client.query_one(LEDGER_NOW, &[]).await?.try_get(0)?;
    Ok(now.saturating_add(offset_us))
}

/// Whose window: an analyst's, or the dataset's (`None`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) struct WindowKey {
    pub(super) analyst: Option<String>,
    pub(super) window: Window,
}

impl WindowKey {
    pub(super) fn analyst(analyst: &str, window: Window) -> WindowKey {
        WindowKey {
            analyst: Some(analyst.to_string()),
            window,
        }
    }

    pub(super) fn dataset(window: Window) -> WindowKey {
        WindowKey {
            analyst: None,
            window,
        }
    }
}

const SELECT_ANALYST_WINDOW: &str =
    "SELECT epsilon::text, delta::text, rho::text, renyi::text FROM pgdp.analyst_window_spent
     WHERE analyst = $1 AND period = $2 AND window_start = $3::text::timestamptz";

const SELECT_DATASET_WINDOW: &str =
    "SELECT epsilon::text, delta::text, rho::text, renyi::text FROM pgdp.dataset_window_spent
     WHERE period = $1 AND window_start = $2::text::timestamptz";

/// Writes an analyst's window totals, adding `$9` to its charge count.
const UPSERT_ANALYST_WINDOW: &str = "INSERT INTO pgdp.analyst_window_spent AS s
        (analyst, period, window_start, window_end, epsilon, delta, rho, renyi, charges)
     VALUES ($1, $2, $3::text::timestamptz, $4::text::timestamptz, $5::text::numeric,
             $6::text::numeric, $7::text::numeric, $8::text::numeric[], $9)
     ON CONFLICT (analyst, period, window_start) DO UPDATE
     SET epsilon = EXCLUDED.epsilon, delta = EXCLUDED.delta, rho = EXCLUDED.rho,
         renyi = EXCLUDED.renyi, charges = s.charges + EXCLUDED.charges, updated_at = now()";

/// Writes the dataset's window totals, adding `$8` to its charge count.
const UPSERT_DATASET_WINDOW: &str = "INSERT INTO pgdp.dataset_window_spent AS s
        (period, window_start, window_end, epsilon, delta, rho, renyi, charges)
     VALUES ($1, $2::text::timestamptz, $3::text::timestamptz, $4::text::numeric,
             $5::text::numeric, $6::text::numeric, $7::text::numeric[], $8)
     ON CONFLICT (period, window_start) DO UPDATE
     SET epsilon = EXCLUDED.epsilon, delta = EXCLUDED.delta, rho = EXCLUDED.rho,
         renyi = EXCLUDED.renyi, charges = s.charges + EXCLUDED.charges, updated_at = now()";

/// Reads one window's totals (zero when it has no row yet).
pub(super) async fn read_window<C: tokio_postgres::GenericClient>(
    client: &C,
    key: &WindowKey,
) -> Result<Spent, Fault> {
    let start = key.window.start_literal();
    let period = key.window.period.name();
    let row = match &key.analyst {
        Some(analyst) => {
            client
                .query_opt(SELECT_ANALYST_WINDOW, &[analyst, &period, &start])
                .await?
        }
        None => {
            client
                .query_opt(SELECT_DATASET_WINDOW, &[&period, &start])
                .await?
        }
    };
    row.as_ref()
        .map_or(Ok(Spent::ZERO), |row| spent_from_row(row, 0))
}

/// The window totals one transaction reads and changes, written back by [`WindowTotals::store`].
#[derive(Default)]
pub(super) struct WindowTotals {
    /// Each window's totals and the charges the transaction added to it.
    entries: Vec<(WindowKey, Spent, i64)>,
}

impl WindowTotals {
    /// The window's totals as this transaction has them (read on first use; the caller holds the
    /// parent row's lock).
    pub(super) async fn get(
        &mut self,
        tx: &tokio_postgres::Transaction<'_>,
        key: &WindowKey,
    ) -> Result<Spent, Fault> {
        if let Some((_, spent, _)) = self.entries.iter().find(|(k, _, _)| k == key) {
            return Ok(*spent);
        }
        let spent = read_window(tx, key).await?;
        self.entries.push((key.clone(), spent, 0));
        Ok(spent)
    }

    /// Sets the window's totals (read before with [`WindowTotals::get`]) and adds `charges` to
    /// its count.
    pub(super) fn set(&mut self, key: &WindowKey, spent: Spent, charges: i64) -> Result<(), Fault> {
        let entry = self
            .entries
            .iter_mut()
            .find(|(k, _, _)| k == key)
            .ok_or(Fault::Corrupt(
                "a window total was written before it was read",
            ))?;
        entry.1 = spent;
        entry.2 += charges;
        Ok(())
    }

    /// Writes every window read by this transaction back (unchanged ones too: a write is cheap
    /// and keeps the code free of a dirty flag).
    pub(super) async fn store(&self, tx: &tokio_postgres::Transaction<'_>) -> Result<(), Fault> {
        let text = |x: Fixed| x.to_numeric_text();
        for (key, spent, charges) in &self.entries {
            let (start, end) = (key.window.start_literal(), key.window.end_literal());
            let period = key.window.period.name();
            let (epsilon, delta, rho, renyi) = (
                text(spent.epsilon),
                text(spent.delta),
                text(spent.rho),
                divergences_literal(spent),
            );
            match &key.analyst {
                Some(analyst) => {
                    tx.execute(
                        UPSERT_ANALYST_WINDOW,
                        &[
                            analyst, &period, &start, &end, &epsilon, &delta, &rho, &renyi, charges,
                        ],
                    )
                    .await?
                }
                None => {
                    tx.execute(
                        UPSERT_DATASET_WINDOW,
                        &[
                            &period, &start, &end, &epsilon, &delta, &rho, &renyi, charges,
                        ],
                    )
                    .await?
                }
            };
        }
        Ok(())
    }
}
