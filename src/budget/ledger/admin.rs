//! Budget administration on the ledger: grants, resets, and reading accounts and the audit
//! trail (`pgdp budget …`, `pgdp audit`, in [`crate::tools::admin`]).
//!
//! Invariants:
//! - A grant or a reset is one READ COMMITTED transaction that takes the same row locks, in the
//!   same order, as a group commit ([`LOCK_ANALYSTS`] for the one analyst, then
//!   [`LOCK_DATASET`]), changes the analyst's row and appends one row to `pgdp.admin_log`, and
//!   commits with `synchronous_commit = on`. It therefore serialises with the charges of every
//!   pgdp process on the ledger: a charge admitted after it commits reads the new grants or
//!   totals under the same lock, and none can interleave with it. Nothing else is changed; a
//!   refused change (a grant that would take δ to 1 or beyond) rolls back and changes nothing.
//! - A grant only ever raises the analyst's limit (ε > 0, δ ≥ 0, checked here again, whatever
//!   the caller checked). A reset zeroes the analyst's totals (ε, δ, ρ, the per-order Rényi
//!   totals and the charge count) except for the reservations of the analyst's open budget
//!   slices, which stay counted until their holders close them and never touches the charge log, the grants, the replay
//!   cache or the dataset's totals; the admin log row keeps the totals it zeroed, so the whole
//!   history stays auditable. For a renewing budget it also zeroes the analyst's current
//!   windows (those holding the ledger's clock), again except for the open slices reserved in
//!   them, and leaves past windows as they were: a renewal is the same reset, made by the clock
//!   at a window's start.
//! - Reading (accounts, events) takes no lock and changes nothing.
//! - Times are read as UTC ISO 8601 text from PostgreSQL (`…T…Z`, microseconds), so no clock or
//!   time zone of the machine running the command enters the output.

use super::*;

/// `to_char` format of the times this module reads: UTC ISO 8601 with microseconds.
const UTC_ISO_8601: &str = r#"'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'"#;

/// A change an administrator made to an analyst's budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AdminAction {
    /// ε (and δ) added to the analyst's limit.
    Grant,
    /// The analyst's spent totals set to zero.
    Reset,
}

impl AdminAction {
    /// The name stored in `pgdp.admin_log.action`.
    pub fn as_str(self) -> &'static str {
        match self {
            AdminAction::Grant => "grant",
            AdminAction::Reset => "reset",
        }
    }
}

/// A grant: what to add to `analyst`'s limit, why, and who asks.
#[derive(Clone, Copy, Debug)]
pub struct GrantRequest<'a> {
    /// The analyst (the caller checked that the policy names them).
    pub analyst: &'a str,
    /// ε added; must be positive.
    pub epsilon: Fixed,
    /// δ added; may be zero.
    pub delta: Fixed,
    /// Free text for the audit log.
    pub reason: &'a str,
    /// The OS user running the command.
    pub made_by: &'a str,
}

/// One row of `pgdp.admin_log`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdminRecord {
    /// Its id in the admin log.
    pub id: i64,
    /// When it committed (UTC ISO 8601).
    pub at: String,
    /// Grant or reset.
    pub action: AdminAction,
    /// Whose budget.
    pub analyst: String,
    /// A grant: ε added. A reset: the ε total it zeroed.
    pub epsilon: Fixed,
    /// A grant: δ added. A reset: the δ total it zeroed.
    pub delta: Fixed,
    /// A reset: the ρ total it zeroed (0 for a grant).
    pub rho: Fixed,
    /// The reason given.
    pub reason: String,
    /// The OS user who ran the command.
    pub made_by: String,
    /// The ledger role (`current_user`) the command connected as.
    pub ledger_role: String,
}

/// An analyst's (or the dataset's) row of the ledger, for `pgdp budget show`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Account {
    /// The analyst; empty for the dataset.
    pub analyst: String,
    /// The totals since the last reset (all time for the dataset).
    pub spent: Spent,
    /// What grants added to the policy's limit (zero for the dataset).
    pub granted: Limit,
    /// Charges since the last reset.
    pub charges: i64,
    /// The time of the latest charge in the log, if any (UTC ISO 8601).
    pub last_charge: Option<String>,
}

impl Account {
    /// An account with nothing spent or granted (an analyst never charged).
    pub fn empty(analyst: &str) -> Account {
        Account {
            analyst: analyst.to_string(),
            spent: Spent::ZERO,
            granted: Limit::default(),
            charges: 0,
            last_charge: None,
        }
    }
}

/// Which events [`Ledger::events`] reads.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AuditFilter {
    /// From this time on (microseconds since 2000-01-01 00:00:00 UTC, as
    /// [`crate::datetime::timestamp_micros`] reads it); `None`: from the start.
    pub since_micros: Option<i64>,
    /// Before this time; `None`: up to now.
    pub until_micros: Option<i64>,
    /// Only this analyst's events; `None`: everyone's.
    pub analyst: Option<String>,
    /// The most recent this many events at most.
    pub rows_max: u64,
}

/// One event of the audit trail: a charge from `pgdp.charge_log`, or a grant or reset from
/// `pgdp.admin_log`. Fields that do not apply to the kind are empty.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuditEvent {
    /// `charge`, `grant` or `reset`.
    pub kind: String,
    /// Its id in its log (charge ids and admin ids are separate sequences).
    pub id: i64,
    /// When (UTC ISO 8601).
    pub at: String,
    /// Whose budget.
    pub analyst: String,
    /// ε of the charge, added by the grant, or zeroed by the reset.
    pub epsilon: Fixed,
    /// δ, likewise.
    pub delta: Fixed,
    /// ρ (zCDP) of the charge, or zeroed by the reset.
    pub rho: Fixed,
    /// A charge: the mechanism.
    pub mechanism: String,
    /// A charge: what became of it (`charged`, `released`, `upstream failed`, …).
    pub outcome: String,
    /// A charge: the policy tables the query read (empty for charges from before schema
    /// version 3).
    pub tables: Vec<String>,
    /// A charge: the query fingerprint (hex SHA-256).
    pub fingerprint: String,
    /// A grant or reset: the OS user who ran the command.
    pub made_by: String,
    /// A grant or reset: the ledger role it connected as.
    pub ledger_role: String,
    /// A grant or reset: the reason given.
    pub reason: String,
}

/// Every analyst's account in `analysts` that has a row, and the dataset's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Accounts {
    /// The analysts' accounts, in the order of the query (by name); analysts never charged or
    /// granted have none.
    pub analysts: Vec<Account>,
    /// The dataset's totals across all analysts.
    pub dataset: Account,
}

/// Writes the analyst's new grants (the row is locked).
const SET_GRANTS: &str = "UPDATE pgdp.analyst_spent
    SET granted_epsilon = $2::text::numeric, granted_delta = $3::text::numeric, updated_at = now()
    WHERE analyst = $1";

/// Zeroes the analyst's totals (the row is locked); `$2` is the zero per-order array.
const ZERO_TOTALS: &str = "UPDATE pgdp.analyst_spent
    SET epsilon = $2::text::numeric, delta = $3::text::numeric, rho = $4::text::numeric,
        renyi = $5::text::numeric[], charges = 0, updated_at = now()
    WHERE analyst = $1";

/// The reservations of the analyst's open budget slices (read under the analyst's row lock),
/// with the window each was reserved in (NULL: the budget did not renew).
const OPEN_SLICES: &str =
    "SELECT epsilon::text, delta::text, rho::text, renyi::text, window_period,
        (extract(epoch FROM window_start) * 1000000)::int8
    FROM pgdp.lease WHERE analyst = $1 AND closed_at IS NULL";

/// Zeroes the analyst's windows that hold the instant `$2` (microseconds since the Unix epoch);
/// `$3` is the zero per-order array.
const ZERO_CURRENT_WINDOWS: &str = "UPDATE pgdp.analyst_window_spent
    SET epsilon = 0, delta = 0, rho = 0, renyi = $3::text::numeric[], charges = 0, updated_at = now()
    WHERE analyst = $1
      AND window_start <= timestamptz 'epoch' + $2::int8 * interval '1 microsecond'
      AND window_end > timestamptz 'epoch' + $2::int8 * interval '1 microsecond'
    RETURNING period";

/// Appends one row to the admin log and returns it as read back.
fn insert_admin_sql() -> String {
    format!(
        "INSERT INTO pgdp.admin_log (action, analyst, epsilon, delta, rho, reason, made_by)
         VALUES ($1, $2, $3::text::numeric, $4::text::numeric, $5::text::numeric, $6, $7)
         RETURNING id, to_char(at AT TIME ZONE 'UTC', {UTC_ISO_8601}), ledger_role"
    )
}

/// Microseconds since 2000-01-01 UTC as a `timestamptz` expression over parameter `$n`.
fn timestamp_param(n: usize) -> String {
    format!("(timestamptz '2000-01-01 00:00:00+00' + ${n}::int8 * interval '1 microsecond')")
}

impl Ledger {
    /// Adds `request`'s ε and δ to the analyst's grants, in one transaction that serialises
    /// with charges (module docs), and records it in the admin log. `policy_limit` is the
    /// analyst's limit in the policy: a grant that would take the total δ to 1 or beyond is
    /// refused ([`Error::InvalidParameter`], 22023) and changes nothing, as is ε = 0.
    pub async fn grant(
        &self,
        policy_limit: &Limit,
        request: &GrantRequest<'_>,
    ) -> Result<AdminRecord> {
        if request.epsilon.is_zero() {
            return Err(Error::InvalidParameter {
                name: "--epsilon".into(),
                reason: "a grant must add a positive epsilon".into(),
                hint: String::new(),
            });
        }
        let mut attempts = self.attempts().await;
        loop {
            let conn = attempts.client().await?;
            let result = grant_once(conn, policy_limit, request).await;
            if let Some(done) = attempts.settle(result) {
                return done.and_then(|outcome| outcome);
            }
        }
    }

    /// Zeroes `analyst`'s spent totals, in one transaction that serialises with charges
    /// (module docs), and records the totals it zeroed in the admin log.
    pub async fn reset(&self, analyst: &str, reason: &str, made_by: &str) -> Result<AdminRecord> {
        let mut attempts = self.attempts().await;
        loop {
            let conn = attempts.client().await?;
            let result = reset_once(conn, analyst, reason, made_by, self.clock.offset_us()).await;
            if let Some(done) = attempts.settle(result) {
                return done;
            }
        }
    }

    /// The accounts of `analysts` (those with a row) and the dataset's.
    pub async fn accounts(&self, analysts: &[String]) -> Result<Accounts> {
        let analysts_sql = format!(
            "SELECT s.analyst, s.epsilon::text, s.delta::text, s.rho::text, s.renyi::text,
                    s.granted_epsilon::text, s.granted_delta::text, s.charges,
                    (SELECT to_char(max(c.charged_at) AT TIME ZONE 'UTC', {UTC_ISO_8601})
                     FROM pgdp.charge_log c WHERE c.analyst = s.analyst)
             FROM pgdp.analyst_spent s WHERE s.analyst = ANY($1::text[]) ORDER BY s.analyst"
        );
        let dataset_sql = format!(
            "SELECT epsilon::text, delta::text, rho::text, renyi::text, charges,
                    (SELECT to_char(max(charged_at) AT TIME ZONE 'UTC', {UTC_ISO_8601})
                     FROM pgdp.charge_log)
             FROM pgdp.dataset_spent WHERE id"
        );
        let mut attempts = self.attempts().await;
        loop {
            let conn = attempts.client().await?;
            let result = async {
                let mut accounts = Vec::new();
                for row in conn.client.query(&analysts_sql, &[&analysts]).await? {
                    accounts.push(Account {
                        analyst: row.try_get(0)?,
                        spent: spent_from_row(&row, 1)?,
                        granted: grants_from_row(&row, 5)?,
                        charges: row.try_get(7)?,
                        last_charge: row.try_get(8)?,
                    });
                }
                let row = conn.client.query_one(&dataset_sql, &[]).await?;
                let dataset = Account {
                    analyst: String::new(),
                    spent: spent_from_row(&row, 0)?,
                    granted: Limit::default(),
                    charges: row.try_get(4)?,
                    last_charge: row.try_get(5)?,
                };
                Ok::<_, Fault>(Accounts {
                    analysts: accounts,
                    dataset,
                })
            }
            .await;
            if let Some(done) = attempts.settle(result) {
                return done;
            }
        }
    }

    /// The charges and admin actions that `filter` selects, oldest first: the most recent
    /// `filter.rows_max` of them.
    pub async fn events(&self, filter: &AuditFilter) -> Result<Vec<AuditEvent>> {
        let (since, until) = (timestamp_param(1), timestamp_param(2));
        let sql = format!(
            "SELECT kind, id, to_char(at AT TIME ZONE 'UTC', {UTC_ISO_8601}), analyst, epsilon, delta,
                    rho, mechanism, outcome, tables, fingerprint, made_by, ledger_role, reason
             FROM (
                SELECT 'charge' AS kind, id, charged_at AS at, analyst, epsilon::text AS epsilon,
                       delta::text AS delta, rho::text AS rho, mechanism, outcome, tables,
                       fingerprint, '' AS made_by, '' AS ledger_role, '' AS reason
                FROM pgdp.charge_log
                WHERE ($1::int8 IS NULL OR charged_at >= {since})
                  AND ($2::int8 IS NULL OR charged_at < {until})
                  AND ($3::text IS NULL OR analyst = $3)
                UNION ALL
                SELECT action, id, at, analyst, epsilon::text, delta::text, rho::text, '', '',
                       '{{}}'::text[], '', made_by, ledger_role, reason
                FROM pgdp.admin_log
                WHERE ($1::int8 IS NULL OR at >= {since})
                  AND ($2::int8 IS NULL OR at < {until})
                  AND ($3::text IS NULL OR analyst = $3)
             ) AS e
             ORDER BY at DESC, kind DESC, id DESC
             LIMIT $4::int8"
        );
        let rows_max = i64::try_from(filter.rows_max).unwrap_or(i64::MAX);
        let mut attempts = self.attempts().await;
        loop {
            let conn = attempts.client().await?;
            let result = async {
                let rows = conn
                    .client
                    .query(
                        &sql,
                        &[
                            &filter.since_micros,
                            &filter.until_micros,
                            &filter.analyst,
                            &rows_max,
                        ],
                    )
                    .await?;
                let amount = |text: String| {
                    Fixed::from_numeric_text(&text)
                        .map_err(|_| Fault::Corrupt("an audit amount is not a valid amount"))
                };
                let mut events = Vec::with_capacity(rows.len());
                for row in rows.iter().rev() {
                    events.push(AuditEvent {
                        kind: row.try_get(0)?,
                        id: row.try_get(1)?,
                        at: row.try_get(2)?,
                        analyst: row.try_get(3)?,
                        epsilon: amount(row.try_get(4)?)?,
                        delta: amount(row.try_get(5)?)?,
                        rho: amount(row.try_get(6)?)?,
                        mechanism: row.try_get(7)?,
                        outcome: row.try_get(8)?,
                        tables: row.try_get(9)?,
                        fingerprint: row.try_get(10)?,
                        made_by: row.try_get(11)?,
                        ledger_role: row.try_get(12)?,
                        reason: row.try_get(13)?,
                    });
                }
                Ok::<_, Fault>(events)
            }
            .await;
            if let Some(done) = attempts.settle(result) {
                return done;
            }
        }
    }
}

/// Locks `analyst`'s row and then the dataset row, as a group commit does, and returns the
/// analyst's totals and grants.
async fn lock_for_admin(
    tx: &tokio_postgres::Transaction<'_>,
    analyst: &str,
) -> Result<(Spent, Limit), Fault> {
    let row = tx.query_one(LOCK_ANALYSTS, &[&vec![analyst]]).await?;
    tx.query_one(LOCK_DATASET, &[]).await?;
    Ok((spent_from_row(&row, 1)?, grants_from_row(&row, 5)?))
}

/// Appends `record`'s action to the admin log and returns it as stored.
#[allow(clippy::too_many_arguments)] // one value per column of the row
async fn log_action(
    tx: &tokio_postgres::Transaction<'_>,
    action: AdminAction,
    analyst: &str,
    epsilon: Fixed,
    delta: Fixed,
    rho: Fixed,
    reason: &str,
    made_by: &str,
) -> Result<AdminRecord, Fault> {
    let row = tx
        .query_one(
            &insert_admin_sql(),
            &[
                &action.as_str(),
                &analyst,
                &epsilon.to_numeric_text(),
                &delta.to_numeric_text(),
                &rho.to_numeric_text(),
                &reason,
                &made_by,
            ],
        )
        .await?;
    Ok(AdminRecord {
        id: row.try_get(0)?,
        at: row.try_get(1)?,
        action,
        analyst: analyst.to_string(),
        epsilon,
        delta,
        rho,
        reason: reason.to_string(),
        made_by: made_by.to_string(),
        ledger_role: row.try_get(2)?,
    })
}

/// One attempt at a grant: the record, or the refusal (after rolling back).
async fn grant_once(
    conn: &mut Conn,
    policy_limit: &Limit,
    request: &GrantRequest<'_>,
) -> Result<Result<AdminRecord>, Fault> {
    let tx = conn.client.transaction().await?;
    let (_, granted) = lock_for_admin(&tx, request.analyst).await?;
    let added = Limit::new(request.epsilon, request.delta);
    let (Some(epsilon), Some(delta)) = (
        granted.epsilon.checked_add(added.epsilon),
        granted.delta.checked_add(added.delta),
    ) else {
        tx.rollback().await?;
        return Ok(Err(Error::InvalidParameter {
            name: "--epsilon".into(),
            reason: "the analyst's grants would exceed the largest amount the ledger holds".into(),
            hint: String::new(),
        }));
    };
    let total = policy_limit.granted(&Limit::new(epsilon, delta));
    if total.delta >= Fixed::ONE {
        tx.rollback().await?;
        return Ok(Err(Error::InvalidParameter {
            name: "--delta".into(),
            reason: format!(
                "the analyst's delta would become {} (policy {} + grants {}), and delta must stay below 1",
                total.delta, policy_limit.delta, delta
            ),
            hint: String::new(),
        }));
    }
    tx.execute(
        SET_GRANTS,
        &[
            &request.analyst,
            &epsilon.to_numeric_text(),
            &delta.to_numeric_text(),
        ],
    )
    .await?;
    let record = log_action(
        &tx,
        AdminAction::Grant,
        request.analyst,
        request.epsilon,
        request.delta,
        Fixed::ZERO,
        request.reason,
        request.made_by,
    )
    .await?;
    tx.commit().await?;
    Ok(Ok(record))
}

/// One attempt at a reset.
async fn reset_once(
    conn: &mut Conn,
    analyst: &str,
    reason: &str,
    made_by: &str,
    clock_offset_us: i64,
) -> Result<AdminRecord, Fault> {
    let tx = conn.client.transaction().await?;
    let (spent, _) = lock_for_admin(&tx, analyst).await?;
    let now = super::window::ledger_now(&tx, clock_offset_us).await?;
    // Open slices stay counted: a process may still charge under them, and closing one takes
    // its unused part off these totals (and off its window's, for a renewing budget).
    let mut reserved = Spent::ZERO;
    let mut in_windows: Vec<(Window, Spent)> = Vec::new();
    for row in tx.query(OPEN_SLICES, &[&analyst]).await? {
        let slice = spent_from_row(&row, 0)?;
        reserved = reserved
            .checked_add_spent(&slice)
            .ok_or(Fault::Corrupt("open slices overflow"))?;
        let period: Option<String> = row.try_get(4)?;
        let start: Option<i64> = row.try_get(5)?;
        let (Some(period), Some(start)) = (period, start) else {
            continue;
        };
        let period = crate::policy::Period::parse(&period)
            .ok_or(Fault::Corrupt("a slice's window has an unknown period"))?;
        let current = Window::containing(period, now);
        if current.start_us != start {
            continue; // reserved in a past window, which the reset leaves alone
        }
        match in_windows.iter_mut().find(|(w, _)| *w == current) {
            Some((_, sum)) => {
                *sum = sum
                    .checked_add_spent(&slice)
                    .ok_or(Fault::Corrupt("open slices overflow"))?
            }
            None => in_windows.push((current, slice)),
        }
    }
    tx.query(
        ZERO_CURRENT_WINDOWS,
        &[&analyst, &now, &divergences_literal(&Spent::ZERO)],
    )
    .await?;
    let mut windows = super::window::WindowTotals::default();
    for (window, sum) in &in_windows {
        let key = super::window::WindowKey::analyst(analyst, *window);
        windows.get(&tx, &key).await?;
        windows.set(&key, *sum, 0)?;
    }
    windows.store(&tx).await?;
    let text = |x: Fixed| x.to_numeric_text();
    tx.execute(
        ZERO_TOTALS,
        &[
            &analyst,
            &text(reserved.epsilon),
            &text(reserved.delta),
            &text(reserved.rho),
            &divergences_literal(&reserved),
        ],
    )
    .await?;
    let record = log_action(
        &tx,
        AdminAction::Reset,
        analyst,
        spent.epsilon,
        spent.delta,
        spent.rho,
        reason,
        made_by,
    )
    .await?;
    tx.commit().await?;
    Ok(record)
}
