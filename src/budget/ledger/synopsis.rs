//! The ledger's part of a synopsis (private multiplicative weights, `dp::mechanism::pmw`): its
//! released state, shared by every pgdp process on the ledger, and who has paid for it.
//!
//! Invariants:
//! - A round is counted (`rounds_started + 1`, never past the declared T) in a committed
//!   statement before anything of it is released ([`Ledger::synopsis_begin_round`]); two
//!   processes never start the same round, and a process that dies mid-round leaves it counted.
//! - An update's noisy count is stored ([`Ledger::synopsis_measure`]) before it is answered; a
//!   measurement is a released value, so storing it reveals nothing more.
//! - A [`SynopsisPass`] exists only for a payment the ledger has recorded: from a durable charge
//!   of the synopsis's whole cost ([`Ledger::synopsis_paid_with`]), or found recorded
//!   ([`Ledger::synopsis_pass`]). Every failure between the charge and the record costs the
//!   analyst (a second charge later), never the data.
//! - The dataset's totals take one synopsis's cost once, from the first payment: a payment made
//!   when another analyst's payment for the same synopsis is already recorded is charged to the
//!   analyst alone ([`Ledger::charge_synopsis_payment`]). Two first payments racing both charge
//!   the dataset (more than it owes, never less): a payment is recorded only after its durable
//!   charge.
//! - State is keyed by the synopsis's name and the fingerprint of its declaration, so a changed
//!   declaration starts afresh and is paid for afresh.

use tokio_postgres::types::ToSql;

use super::group_commit::{ChargeRequest, DatasetShare};
use super::receipt::{Charged, Priced};
use super::{at_most_one, Fault, Ledger};
use crate::budget::accountant::Limit;
use crate::{Error, Result};

/// A synopsis's released state as stored: its noisy total, the rounds started and each update's
/// cells and noisy count, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredSynopsis {
    /// The noisy total.
    pub total: i128,
    /// Rounds started.
    pub rounds_started: usize,
    /// Each update's cells and released count.
    pub measurements: Vec<(Vec<u32>, i128)>,
}

/// Proof that an analyst has paid for a synopsis (the whole synopsis's cost, once): what
/// reading the synopsis's private histogram on the upstream requires. Only the ledger makes one
/// (its fields are private), from a recorded payment.
///
/// ```compile_fail,E0451
/// let _ = pgdp::budget::SynopsisPass { synopsis: "cube".into(), analyst: "mallory".into() };
/// ```
#[derive(Debug, PartialEq, Eq)]
pub struct SynopsisPass {
    synopsis: String,
    analyst: String,
}

impl SynopsisPass {
    /// The synopsis paid for.
    pub fn synopsis(&self) -> &str {
        &self.synopsis
    }

    /// The analyst who paid.
    pub fn analyst(&self) -> &str {
        &self.analyst
    }
}

/// `noisy:cell,cell,…`, one measurement as stored.
fn measurement_text(cells: &[u32], noisy: i128) -> String {
    let cells: Vec<String> = cells.iter().map(u32::to_string).collect();
    format!("{noisy}:{}", cells.join(","))
}

fn parse_measurement(text: &str) -> Option<(Vec<u32>, i128)> {
    let (noisy, cells) = text.split_once(':')?;
    let cells = if cells.is_empty() {
        Vec::new()
    } else {
        cells
            .split(',')
            .map(|c| c.parse().ok())
            .collect::<Option<Vec<u32>>>()?
    };
    Some((cells, noisy.parse().ok()?))
}

fn stored_of(row: &tokio_postgres::Row) -> Result<StoredSynopsis, Fault> {
    let total: String = row.try_get(0)?;
    let rounds: i32 = row.try_get(1)?;
    let measurements: Vec<String> = row.try_get(2)?;
    let corrupt = Fault::Corrupt("pgdp.synopsis holds a state pgdp cannot read");
    let measurements = measurements
        .iter()
        .map(|m| parse_measurement(m))
        .collect::<Option<Vec<_>>>();
    match (total.parse::<i128>(), usize::try_from(rounds), measurements) {
        (Ok(total), Ok(rounds_started), Some(measurements)) => Ok(StoredSynopsis {
            total,
            rounds_started,
            measurements,
        }),
        _ => Err(corrupt),
    }
}

const STATE: &str = "SELECT total::text, rounds_started, measurements FROM pgdp.synopsis
     WHERE name = $1 AND fingerprint = $2";
const CREATE: &str =
    "INSERT INTO pgdp.synopsis (name, fingerprint, total) VALUES ($1, $2, $3::text::numeric)
     ON CONFLICT (name, fingerprint) DO NOTHING";
const BEGIN_ROUND: &str = "UPDATE pgdp.synopsis
     SET rounds_started = rounds_started + 1, updated_at = now()
     WHERE name = $1 AND fingerprint = $2 AND rounds_started < $3
     RETURNING total::text, rounds_started, measurements";
const MEASURE: &str = "UPDATE pgdp.synopsis
     SET measurements = array_append(measurements, $3), updated_at = now()
     WHERE name = $1 AND fingerprint = $2 AND cardinality(measurements) < rounds_started";
const PAID: &str = "SELECT 1 FROM pgdp.synopsis_payment
     WHERE name = $1 AND fingerprint = $2 AND analyst = $3";
const PAID_BY_ANYONE: &str = "SELECT 1 FROM pgdp.synopsis_payment
     WHERE name = $1 AND fingerprint = $2 LIMIT 1";
const PAY: &str = "INSERT INTO pgdp.synopsis_payment (name, fingerprint, analyst, charge)
     VALUES ($1, $2, $3, $4) ON CONFLICT (name, fingerprint, analyst) DO NOTHING";

impl Ledger {
    /// Runs `sql` (prepared once per connection) and reads the synopsis state it returns, if
    /// any: the one loop of the reads and round counts below.
    async fn synopsis_row(
        &self,
        sql: &'static str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<StoredSynopsis>> {
        self.query_prepared(sql, params, |rows| {
            at_most_one(rows)?.map(stored_of).transpose()
        })
        .await
    }

    /// Runs `sql` (one autocommitted, durable statement) and returns the rows it changed or
    /// returned.
    async fn synopsis_write(
        &self,
        sql: &'static str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64> {
        let mut attempts = self.attempts().await;
        loop {
            let conn = attempts.client().await?;
            let result = match conn.statement(sql).await {
                Ok(statement) => conn.client.execute(&statement, params).await,
                Err(e) => Err(e),
            };
            if let Some(done) = attempts.settle(result.map_err(Fault::from)) {
                return done;
            }
        }
    }

    /// The stored state of synopsis `name` under declaration `fingerprint`, if it has started.
    pub async fn synopsis_state(
        &self,
        name: &str,
        fingerprint: &str,
    ) -> Result<Option<StoredSynopsis>> {
        self.synopsis_row(STATE, &[&name, &fingerprint]).await
    }

    /// Starts synopsis `name` with the noisy total `total` unless another process started it
    /// first, and returns the stored state (the first start wins: its total is the released one).
    pub async fn synopsis_create(
        &self,
        name: &str,
        fingerprint: &str,
        total: i128,
    ) -> Result<StoredSynopsis> {
        let total = total.to_string();
        self.synopsis_write(CREATE, &[&name, &fingerprint, &total])
            .await?;
        self.synopsis_state(name, fingerprint)
            .await?
            .ok_or_else(|| Error::internal("a synopsis started and not found"))
    }

    /// Counts one more round of synopsis `name`, if fewer than `rounds` have started, and
    /// returns the state after it (other processes' updates included); `None` when every round
    /// has started. Committed before it returns.
    pub async fn synopsis_begin_round(
        &self,
        name: &str,
        fingerprint: &str,
        rounds: usize,
    ) -> Result<Option<StoredSynopsis>> {
        let rounds = i32::try_from(rounds).map_err(|_| Error::internal("synopsis rounds"))?;
        self.synopsis_row(BEGIN_ROUND, &[&name, &fingerprint, &rounds])
            .await
    }

    /// Stores an update's cells and released count (within a started round). Committed before
    /// it returns; refused when every started round already has its update.
    pub async fn synopsis_measure(
        &self,
        name: &str,
        fingerprint: &str,
        cells: &[u32],
        noisy: i128,
    ) -> Result<()> {
        let text = measurement_text(cells, noisy);
        match self
            .synopsis_write(MEASURE, &[&name, &fingerprint, &text])
            .await?
        {
            1 => Ok(()),
            _ => Err(Error::internal("a synopsis update outside a started round")),
        }
    }

    /// The pass of `analyst` for synopsis `name` if the analyst has paid for it.
    pub async fn synopsis_pass(
        &self,
        name: &str,
        fingerprint: &str,
        analyst: &str,
    ) -> Result<Option<SynopsisPass>> {
        let paid = self
            .synopsis_write(PAID, &[&name, &fingerprint, &analyst])
            .await?;
        Ok((paid > 0).then(|| SynopsisPass {
            synopsis: name.to_string(),
            analyst: analyst.to_string(),
        }))
    }

    /// Charges `item` (synopsis `name`'s whole cost, under declaration `fingerprint`) to
    /// `analyst` against `limit`, durably, in the group commit (no lease: a payment is made once),
    /// with `audit` and `tables` in the audit log, and returns the item bound to its receipt, as
    /// [`Ledger::charge_for`] does. The dataset's totals (and `dataset_limit`) take it only when no
    /// payment for this synopsis is recorded yet: the synopsis's whole transcript, every
    /// analyst's answers from it included, costs the dataset its ε once (docs/privacy.md §13).
    #[allow(clippy::too_many_arguments)] // as charge_reading
    pub async fn charge_synopsis_payment<T: Priced>(
        &self,
        name: &str,
        fingerprint: &str,
        analyst: &str,
        limit: &Limit,
        dataset_limit: Option<&Limit>,
        item: T,
        audit: &str,
        tables: &[String],
    ) -> Result<Charged<T>> {
        let paid_before = self
            .synopsis_write(PAID_BY_ANYONE, &[&name, &fingerprint])
            .await?
            > 0;
        let receipt = self
            .enqueue_charge(ChargeRequest {
                analyst: analyst.to_string(),
                limit: *limit,
                dataset_limit: dataset_limit.copied(),
                dataset: if paid_before {
                    DatasetShare::PaidBefore
                } else {
                    DatasetShare::Charged
                },
                cost: item.cost(),
                fingerprint: audit.to_string(),
                mechanism: "pmw".to_string(),
                tables: tables.to_vec(),
            })
            .await?;
        Ok(Charged { item, receipt })
    }

    /// Records that `analyst` paid for synopsis `name` with `charged` (a durable charge of the
    /// synopsis's cost) and returns the pass. The charge is consumed: it pays for this synopsis
    /// and nothing else.
    pub async fn synopsis_paid_with<T: Priced>(
        &self,
        name: &str,
        fingerprint: &str,
        analyst: &str,
        charged: Charged<T>,
    ) -> Result<SynopsisPass> {
        let (_, receipt) = charged.into_parts();
        let charge = receipt.id().to_string();
        self.synopsis_write(PAY, &[&name, &fingerprint, &analyst, &charge])
            .await?;
        Ok(SynopsisPass {
            synopsis: name.to_string(),
            analyst: analyst.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measurements_read_back_as_written() {
        for (cells, noisy) in [(vec![0, 5, 17], -3), (vec![], 12), (vec![16_383], 0)] {
            let text = measurement_text(&cells, noisy);
            assert_eq!(parse_measurement(&text), Some((cells, noisy)));
        }
        assert_eq!(parse_measurement("x:1"), None);
        assert_eq!(parse_measurement("3:1,,2"), None);
        assert_eq!(parse_measurement("3"), None);
    }
}
