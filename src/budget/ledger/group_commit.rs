//! Group commit of charges: every charge waiting when the committer task runs is admitted in one
//! transaction, each in arrival order against the totals the ones before it left, with one
//! durable commit ([`crate::limits::CHARGES_PER_COMMIT_MAX`] at most).

use super::window::{ledger_now, WindowKey, WindowTotals};
use super::*;
use crate::policy::Accounting;

/// One [`Ledger::charge`] request, owned so that the committer task can hold it.
pub(super) struct ChargeRequest {
    pub(super) analyst: String,
    pub(super) limit: Limit,
    pub(super) dataset_limit: Option<Limit>,
    /// Whether the dataset's totals take this charge.
    pub(super) dataset: DatasetShare,
    pub(super) cost: Cost,
    pub(super) fingerprint: String,
    pub(super) mechanism: String,
    /// The policy tables the query reads, for the audit log.
    pub(super) tables: Vec<String>,
}

/// Whether a charge counts in the dataset's totals (all analysts together) as well as in the
/// analyst's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum DatasetShare {
    /// It does, admitted against the dataset's limit: every charge but the one below.
    Charged,
    /// It does not: the dataset has already paid for what it buys, an analyst's payment for a
    /// synopsis whose whole transcript another analyst's recorded payment already charged to
    /// the dataset (docs/privacy.md §13, "Sharing between analysts").
    PaidBefore,
}

/// A queued charge and where its answer goes.
pub(super) struct PendingCharge {
    pub(super) request: ChargeRequest,
    pub(super) reply: oneshot::Sender<Result<Receipt>>,
}

/// The group-commit queue: requests wait here while a committer task runs; at most one
/// committer runs at a time, and it runs until the queue is empty.
pub(super) struct ChargeQueue {
    pub(super) config: crate::dsn::Dsn,
    pub(super) schema_ready: Arc<AtomicBool>,
    pub(super) state: std::sync::Mutex<QueueState>,
    /// The committer's connection (one committer at a time, so never contended).
    pub(super) conn: Mutex<Option<Conn>>,
    /// The ledger's clock (its offset, for tests).
    pub(super) clock: Arc<super::window::Clock>,
}

#[derive(Default)]
pub(super) struct QueueState {
    pub(super) pending: Vec<PendingCharge>,
    /// A committer task is running and will take what is pending.
    pub(super) committing: bool,
}

impl ChargeQueue {
    fn state(&self) -> std::sync::MutexGuard<'_, QueueState> {
        // The lock guards plain data and no code panics while holding it; a poisoned lock still
        // holds a consistent queue.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Queues `pending`; true if the caller must start a committer.
    pub(super) fn enqueue(&self, pending: PendingCharge) -> bool {
        let mut state = self.state();
        state.pending.push(pending);
        !std::mem::replace(&mut state.committing, true)
    }

    /// The committer: commits what is queued, batch after batch, until the queue is empty.
    pub(super) async fn commit_all(self: Arc<Self>) {
        loop {
            let batch: Vec<PendingCharge> = {
                let mut state = self.state();
                if state.pending.is_empty() {
                    state.committing = false;
                    return;
                }
                let n = state.pending.len().min(CHARGES_PER_COMMIT_MAX);
                state.pending.drain(..n).collect()
            };
            let (requests, replies): (Vec<ChargeRequest>, Vec<_>) =
                batch.into_iter().map(|p| (p.request, p.reply)).unzip();
            let results = self.commit(&requests).await;
            for (reply, result) in replies.into_iter().zip(results) {
                // The charging session may have gone; its charge stands.
                let _ = reply.send(result);
            }
        }
    }

    /// One group commit (retried once on a fresh connection if the connection broke): one
    /// answer per request, in order.
    async fn commit(&self, requests: &[ChargeRequest]) -> Vec<Result<Receipt>> {
        let mut attempts = Attempts {
            config: &self.config,
            schema_ready: &self.schema_ready,
            slot: self.conn.lock().await,
            retried: false,
        };
        let outcomes = loop {
            let result = match attempts.client().await {
                Ok(conn) => charge_batch(conn, requests, self.clock.offset_us()).await,
                Err(_) => break Err(()),
            };
            if let Some(done) = attempts.settle(result) {
                break done.map_err(|_| ());
            }
        };
        match outcomes {
            Ok(outcomes) => outcomes
                .into_iter()
                .map(|outcome| outcome.map_err(|refusal| Error::from(*refusal)))
                .collect(),
            Err(()) => requests
                .iter()
                .map(|_| Err(Error::LedgerUnavailable))
                .collect(),
        }
    }
}

/// Locks the rows of the analysts `$1` (created at zero on first use), in the order given (sorted
/// by the caller), and returns their totals and grants: one statement, since `ON CONFLICT DO
/// UPDATE` locks the row it finds and returns its newest committed version. The grants are read
/// here, under the lock, so a grant committed by `pgdp budget grant` counts from the next charge
/// on, whichever process makes it.
pub(super) const LOCK_ANALYSTS: &str =
    "INSERT INTO pgdp.analyst_spent AS s (analyst) SELECT unnest($1::text[])
     ON CONFLICT (analyst) DO UPDATE SET analyst = s.analyst
     RETURNING s.analyst, s.epsilon::text, s.delta::text, s.rho::text, s.renyi::text,
               s.granted_epsilon::text, s.granted_delta::text";

/// Locks the dataset row and returns its totals.
pub(super) const LOCK_DATASET: &str =
    "SELECT epsilon::text, delta::text, rho::text, renyi::text FROM pgdp.dataset_spent WHERE id FOR UPDATE";

/// Writes the new totals of the analysts and of the dataset (both locked before), and appends
/// one audit row per admitted charge, in one statement. Audit rows are inserted, and their ids
/// drawn, in the order of the arrays. Per-order totals travel as array literals of exact
/// decimals (`{0.5,1.25,…}`).
pub(super) const RECORD_CHARGES: &str = "WITH analyst AS (
        UPDATE pgdp.analyst_spent AS s
        SET epsilon = t.epsilon::numeric, delta = t.delta::numeric, rho = t.rho::numeric,
            renyi = t.renyi::numeric[], charges = s.charges + t.charges, updated_at = now()
        FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::int8[])
            AS t(analyst, epsilon, delta, rho, renyi, charges)
        WHERE s.analyst = t.analyst),
     dataset AS (
        UPDATE pgdp.dataset_spent
        SET epsilon = $7::text::numeric, delta = $8::text::numeric, rho = $9::text::numeric,
            renyi = $10::text::numeric[], charges = charges + $11::int8, updated_at = now()
        WHERE id)
     INSERT INTO pgdp.charge_log (analyst, fingerprint, mechanism, epsilon, delta, rho, pure_rho, tables)
     SELECT l.analyst, l.fingerprint, l.mechanism, l.epsilon::numeric, l.delta::numeric,
            l.rho::numeric, l.pure_rho::numeric, l.tables::text[]
     FROM unnest($12::text[], $13::text[], $14::text[], $15::text[], $16::text[], $17::text[], $18::text[],
                 $19::text[])
         WITH ORDINALITY AS l(analyst, fingerprint, mechanism, epsilon, delta, rho, pure_rho, tables, n)
     ORDER BY l.n
     RETURNING id";

/// One group commit, one attempt: BEGIN, lock the analysts' rows, lock the dataset row, read the
/// ledger's clock (only when a request's limit renews), admit each request in order (against
/// the current window's totals for a renewing limit, read under the parent row's lock), one
/// statement writing totals and audit rows and one per window total, COMMIT (the one durable
/// flush of the batch). Returns each request's charge or
/// refusal, in order; a database failure fails the whole batch, which then charged nothing
/// (except in the ambiguous case of the module docs).
pub(super) async fn charge_batch(
    conn: &mut Conn,
    requests: &[ChargeRequest],
    clock_offset_us: i64,
) -> Result<Vec<Result<Receipt, Box<Refusal>>>, Fault> {
    let lock_analysts = conn.statement(LOCK_ANALYSTS).await?;
    let lock_dataset = conn.statement(LOCK_DATASET).await?;
    let record = conn.statement(RECORD_CHARGES).await?;
    let mut analysts: Vec<&str> = requests.iter().map(|r| r.analyst.as_str()).collect();
    analysts.sort_unstable();
    analysts.dedup();

    let tx = conn.client.transaction().await?;
    let mut spent: HashMap<String, Spent> = HashMap::with_capacity(analysts.len());
    let mut granted: HashMap<String, Limit> = HashMap::with_capacity(analysts.len());
    for row in tx.query(&lock_analysts, &[&analysts]).await? {
        let analyst: String = row.try_get(0)?;
        granted.insert(analyst.clone(), grants_from_row(&row, 5)?);
        spent.insert(analyst, spent_from_row(&row, 1)?);
    }
    // Locked second, by every transaction, so lock order is the same everywhere. Always read:
    // the per-order totals cannot be added in place by SQL.
    let mut dataset = spent_from_row(&tx.query_one(&lock_dataset, &[]).await?, 0)?;
    // The one instant that places every charge of the batch in its windows.
    let renews = requests
        .iter()
        .any(|r| r.limit.period.is_some() || r.dataset_limit.is_some_and(|l| l.period.is_some()));
    let now = if renews {
        ledger_now(&tx, clock_offset_us).await?
    } else {
        0
    };
    let mut windows = WindowTotals::default();

    // Admit in arrival order, each against the totals the ones before it left.
    let mut outcomes = Vec::with_capacity(requests.len());
    for request in requests {
        let current = *spent.get(&request.analyst).ok_or(Fault::Corrupt(
            "an analyst's row was not returned by its lock",
        ))?;
        // The policy's limit plus the grants read under the lock.
        let limit = granted
            .get(&request.analyst)
            .map_or(request.limit, |g| request.limit.granted(g));
        // A renewing limit is checked against its current window, else the whole history.
        let window = limit
            .period
            .map(|p| WindowKey::analyst(&request.analyst, Window::containing(p, now)));
        let admitted_on = match &window {
            Some(key) => windows.get(&tx, key).await?,
            None => current,
        };
        let after = match admit(&limit, &admitted_on, &request.cost) {
            Ok(after) => after,
            Err(refusal) => {
                outcomes.push(Err(Box::new(Refusal {
                    window: window.map(|k| k.window),
                    ..refusal
                })));
                continue;
            }
        };
        if request.dataset == DatasetShare::Charged {
            let dataset_window = request
                .dataset_limit
                .and_then(|l| l.period)
                .map(|p| WindowKey::dataset(Window::containing(p, now)));
            let dataset_admitted_on = match &dataset_window {
                Some(key) => windows.get(&tx, key).await?,
                None => dataset,
            };
            let dataset_after = match &request.dataset_limit {
                Some(dataset_limit) => admit(dataset_limit, &dataset_admitted_on, &request.cost),
                None => Ok(dataset_admitted_on + request.cost),
            };
            match (dataset_after, &dataset_window) {
                (Ok(dataset_after), None) => dataset = dataset_after,
                (Ok(window_after), Some(key)) => {
                    windows.set(key, window_after, 1)?;
                    dataset = dataset + request.cost;
                }
                (Err(refusal), _) => {
                    outcomes.push(Err(Box::new(Refusal {
                        scope: Scope::Dataset,
                        window: dataset_window.map(|k| k.window),
                        ..refusal
                    })));
                    continue;
                }
            }
        }
        match &window {
            Some(key) => {
                windows.set(key, after, 1)?;
                spent.insert(request.analyst.clone(), current + request.cost);
            }
            None => {
                spent.insert(request.analyst.clone(), after);
            }
        }
        outcomes.push(Ok((limit, after, window.map(|k| k.window))));
    }
    let admitted: Vec<&ChargeRequest> = requests
        .iter()
        .zip(&outcomes)
        .filter(|(_, outcome)| outcome.is_ok())
        .map(|(request, _)| request)
        .collect();
    let ids = if admitted.is_empty() {
        tx.rollback().await?;
        Vec::new()
    } else {
        let ids = record_charges(&tx, &record, &admitted, &spent, &dataset).await?;
        windows.store(&tx).await?;
        tx.commit().await?;
        ids
    };
    Ok(receipts(outcomes, ids))
}

/// An admitted charge: its limit (grants included), the totals after it, and its window.
type Admitted = (Limit, Spent, Option<Window>);

/// Each admitted request's receipt, with the audit-log ids of the admitted ones in order
/// (one id per admitted request, checked by [`record_charges`]); each refusal as it is.
fn receipts(
    outcomes: Vec<Result<Admitted, Box<Refusal>>>,
    ids: Vec<i64>,
) -> Vec<Result<Receipt, Box<Refusal>>> {
    let mut ids = ids.into_iter();
    outcomes
        .into_iter()
        .map(|outcome| {
            outcome.map(|(limit, after, window)| Receipt {
                id: ChargeId::Logged(ids.next().unwrap_or_default()),
                balance: Balance::new(&limit, after),
                window,
            })
        })
        .collect()
}

/// Runs [`RECORD_CHARGES`] for the `admitted` requests of a batch, given the analysts' and the
/// dataset's totals after them. Returns the audit-log ids in the order of `admitted`.
pub(super) async fn record_charges(
    tx: &tokio_postgres::Transaction<'_>,
    record: &Statement,
    admitted: &[&ChargeRequest],
    spent: &HashMap<String, Spent>,
    dataset: &Spent,
) -> Result<Vec<i64>, Fault> {
    // The analysts' final totals and how many charges each gained.
    let text = |x: Fixed| x.to_numeric_text();
    let mut charged: Vec<(&str, i64)> = Vec::new();
    for request in admitted {
        match charged
            .iter_mut()
            .find(|(name, _)| *name == request.analyst)
        {
            Some((_, n)) => *n += 1,
            None => charged.push((&request.analyst, 1)),
        }
    }
    let mut names = Vec::with_capacity(charged.len());
    let (mut epsilons, mut deltas, mut rhos, mut renyis, mut counts) =
        (vec![], vec![], vec![], vec![], vec![]);
    for (name, n) in &charged {
        let total = spent
            .get(*name)
            .ok_or(Fault::Corrupt("an admitted analyst has no total"))?;
        names.push(*name);
        epsilons.push(text(total.epsilon));
        deltas.push(text(total.delta));
        rhos.push(text(total.rho));
        renyis.push(divergences_literal(total));
        counts.push(*n);
    }
    let log = |f: fn(&ChargeRequest) -> String| admitted.iter().map(|r| f(r)).collect::<Vec<_>>();
    let mut ids: Vec<i64> = tx
        .query(
            record,
            &[
                &names,
                &epsilons,
                &deltas,
                &rhos,
                &renyis,
                &counts,
                &text(dataset.epsilon),
                &text(dataset.delta),
                &text(dataset.rho),
                &divergences_literal(dataset),
                &(admitted
                    .iter()
                    .filter(|r| r.dataset == DatasetShare::Charged)
                    .count() as i64),
                &log(|r| r.analyst.clone()),
                &log(|r| r.fingerprint.clone()),
                &log(|r| r.mechanism.clone()),
                &log(|r| r.cost.epsilon.to_numeric_text()),
                &log(|r| r.cost.delta.to_numeric_text()),
                &log(|r| r.cost.rho.to_numeric_text()),
                &log(|r| r.cost.pure_rho.to_numeric_text()),
                &log(|r| text_array_literal(&r.tables)),
            ],
        )
        .await?
        .iter()
        .map(|row| row.try_get(0))
        .collect::<Result<_, _>>()?;
    if ids.len() != admitted.len() {
        return Err(Fault::Corrupt(
            "the audit log did not take one row per charge",
        ));
    }
    // Identity values are drawn in insertion order, which is the order of the arrays.
    ids.sort_unstable();
    Ok(ids)
}

/// Reads `(epsilon::text, delta::text, rho::text, renyi::text)` from column `first` on. The
/// `renyi` array holds the per-order totals, then the zCDP total, then the GDP total, then
/// the code of the history's rule ([`divergences_literal`]). An array without the code
/// (written before rules could differ) holds a history of the mixed rule when anything was
/// spent. A NULL `renyi` (a row written by schema version 1) is bounded by
/// the sums, and an array of the per-order totals alone (written before the zCDP member) has
/// its zCDP total bounded by them ([`Spent::from_sums`]). An array without the GDP total
/// (written before the GDP member, when Gaussian noise was the discrete Gaussian) has none
/// if it holds a Gaussian charge (ρ > 0: [`Spent::gdp`] is MAX), and π times its zCDP total
/// (the pure components' Σ ε_c²/2, [`Cost::gaussian_dp`]) otherwise.
pub(super) fn spent_from_row(row: &Row, first: usize) -> Result<Spent, Fault> {
    let amount = |text: &str| -> Result<Fixed, Fault> {
        Fixed::from_numeric_text(text)
            .map_err(|_| Fault::Corrupt("a spent total is not a valid amount"))
    };
    let column =
        |index: usize| -> Result<Fixed, Fault> { amount(&row.try_get::<_, String>(index)?) };
    let sums = Spent::from_sums(column(first)?, column(first + 1)?, column(first + 2)?);
    let Some(literal) = row.try_get::<_, Option<String>>(first + 3)? else {
        return Ok(sums);
    };
    let inner = literal
        .strip_prefix('{')
        .and_then(|l| l.strip_suffix('}'))
        .ok_or(Fault::Corrupt("per-order totals are not an array"))?;
    let mut values = inner
        .split(',')
        .map(amount)
        .collect::<Result<Vec<Fixed>, Fault>>()?;
    let values_code = (values.len() == ORDER_COUNT + 3)
        .then(|| values.pop())
        .flatten();
    let before_gdp = |zcdp: Fixed| {
        if sums.rho.is_zero() {
            Cost {
                pure_rho: zcdp,
                ..Cost::ZERO
            }
            .gaussian_dp()
        } else {
            Fixed::MAX
        }
    };
    let (values, zcdp, gdp) = match values.len() {
        n if n == ORDER_COUNT => (values, sums.zcdp, sums.gdp),
        n if n == ORDER_COUNT + 1 => {
            let zcdp = values[ORDER_COUNT];
            (values[..ORDER_COUNT].to_vec(), zcdp, before_gdp(zcdp))
        }
        n if n == ORDER_COUNT + 2 => {
            let (zcdp, gdp) = (values[ORDER_COUNT], values[ORDER_COUNT + 1]);
            (values[..ORDER_COUNT].to_vec(), zcdp, gdp)
        }
        _ => {
            return Err(Fault::Corrupt(
                "per-order totals do not match this pgdp's orders",
            ))
        }
    };
    let renyi: Renyi = values
        .try_into()
        .map_err(|_| Fault::Corrupt("per-order totals do not match this pgdp's orders"))?;
    let mut spent = Spent {
        renyi,
        zcdp,
        gdp,
        accounting: None,
        ..sums
    };
    spent.accounting = match values_code {
        Some(code) => accounting_of_code(code)?,
        // Written before rules could differ: a history of the mixed rule, if any.
        None => (!spent.is_zero()).then_some(Accounting::Mixed),
    };
    Ok(spent)
}

/// Reads `(granted_epsilon::text, granted_delta::text)` from column `first` on: what grants
/// added to the analyst's policy limit.
pub(super) fn grants_from_row(row: &Row, first: usize) -> Result<Limit, Fault> {
    let amount = |index: usize| -> Result<Fixed, Fault> {
        Fixed::from_numeric_text(&row.try_get::<_, String>(index)?)
            .map_err(|_| Fault::Corrupt("a granted amount is not a valid amount"))
    };
    Ok(Limit::new(amount(first)?, amount(first + 1)?))
}

/// `items` as a PostgreSQL `text[]` literal, each element double-quoted with `\` and `"`
/// escaped, so any text survives.
pub(super) fn text_array_literal(items: &[String]) -> String {
    let quoted: Vec<String> = items
        .iter()
        .map(|item| format!("\"{}\"", item.replace('\\', "\\\\").replace('"', "\\\"")))
        .collect();
    format!("{{{}}}", quoted.join(","))
}

/// The per-order totals of `spent`, then its zCDP total, then its GDP total, then the code of
/// its rule ([`accounting_code`]), as a PostgreSQL array literal of exact decimals (the `renyi`
/// column).
pub(super) fn divergences_literal(spent: &Spent) -> String {
    let code = accounting_code(spent.accounting);
    let values: Vec<String> = spent
        .renyi
        .iter()
        .chain([&spent.zcdp, &spent.gdp, &code])
        .map(|x| x.to_numeric_text())
        .collect();
    format!("{{{}}}", values.join(","))
}

/// The rule of a history as the last element of its `renyi` array: 0 none yet, 1 mixed,
/// 2 gaussian (a whole number of the array's decimals).
fn accounting_code(accounting: Option<Accounting>) -> Fixed {
    let code = match accounting {
        None => 0,
        Some(Accounting::Mixed) => 1,
        Some(Accounting::Gaussian) => 2,
    };
    Fixed::from_units(code * Fixed::ONE.units())
}

/// The inverse of [`accounting_code`]; any other value is a corrupt ledger.
fn accounting_of_code(code: Fixed) -> Result<Option<Accounting>, Fault> {
    match code {
        c if c.is_zero() => Ok(None),
        c if c == accounting_code(Some(Accounting::Mixed)) => Ok(Some(Accounting::Mixed)),
        c if c == accounting_code(Some(Accounting::Gaussian)) => Ok(Some(Accounting::Gaussian)),
        _ => Err(Fault::Corrupt("a history's accounting rule is not known")),
    }
}
