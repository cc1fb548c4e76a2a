//! Budget administration from the command line: `pgdp budget show | grant | reset | history`
//! and `pgdp audit`. Parses its own arguments (after the command word), checks them against the
//! policy, and reads or changes the ledger through [`crate::budget::ledger`]'s admin calls.
//!
//! Invariants:
//! - Everything is checked before the ledger is touched: the arguments, the policy, and that
//!   every analyst named is in the policy. Bad input ([`AdminError::Usage`],
//!   [`AdminError::UnknownAnalyst`]) changes nothing and exits with status 2; a ledger that
//!   refuses a change (δ would reach 1) changes nothing and exits with status 1.
//! - Amounts are parsed exactly ([`Fixed::from_decimal_str`]): a grant's ε must be a positive
//!   finite decimal, its δ a non-negative one; negative numbers, zero ε, NaN, infinities and
//!   non-numbers are refused.
//! - Output is a plain, aligned table (show, history) or CSV with RFC 4180 quoting / a JSON
//!   array (audit); amounts are the ledger's exact decimals, times UTC ISO 8601.
//! - Who made a change is recorded twice: the OS user running the command (`$USER`, else
//!   `$LOGNAME`: what the environment says, not authenticated) and the ledger role the command
//!   connected as (`current_user`, authenticated by the ledger's PostgreSQL).
//!
//! Errors are [`AdminError`], local to this tool-side module like [`super::cluster`]'s: nothing
//! here is seen by a client of the proxy.

use std::ffi::OsString;
use std::fmt::Write as _;
use std::path::PathBuf;

use crate::budget::ledger::{Account, AuditEvent, AuditFilter, GrantRequest};
use crate::budget::{guarantee, remaining, Fixed, Ledger, Limit};
use crate::limits::{ADMIN_REASON_BYTES_MAX, AUDIT_ROWS_MAX, HISTORY_ROWS_DEFAULT};
use crate::policy::Policy;

/// Usage of the admin commands (also part of `pgdp --help`).
pub const USAGE: &str = "\
    pgdp budget show    [ANALYST] --policy FILE [--ledger DSN]
    pgdp budget grant   ANALYST --epsilon E [--delta D] [--reason TEXT] --policy FILE [--ledger DSN]
    pgdp budget reset   ANALYST [--reason TEXT] --policy FILE [--ledger DSN]
    pgdp budget history ANALYST [--since T] [--limit N] --policy FILE [--ledger DSN]
    pgdp audit --since T [--until T] [--analyst A] --format csv|json --policy FILE [--ledger DSN]
";

/// Why an admin command did not run.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// Bad arguments; nothing was read or changed.
    #[error("{0}")]
    Usage(String),
    /// The policy file is missing or invalid.
    #[error("invalid policy:\n{0}")]
    Policy(String),
    /// An analyst the policy does not name.
    #[error("unknown analyst {name:?}: the policy names {known}; nothing was changed")]
    UnknownAnalyst {
        /// The name given.
        name: String,
        /// The policy's analysts, for the message.
        known: String,
    },
    /// The ledger refused or failed (the details are logged on standard error).
    #[error("{0}")]
    Ledger(#[from] crate::Error),
}

impl AdminError {
    /// The exit status: 2 for bad input, 1 for anything else.
    pub fn exit_status(&self) -> u8 {
        match self {
            AdminError::Usage(_) | AdminError::UnknownAnalyst { .. } => 2,
            AdminError::Policy(_) | AdminError::Ledger(_) => 1,
        }
    }
}

fn usage(message: impl Into<String>) -> AdminError {
    AdminError::Usage(message.into())
}

/// The export format of `pgdp audit`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// RFC 4180 CSV with a header row.
    Csv,
    /// One JSON array of objects.
    Json,
}

/// What to do.
#[derive(Clone, Debug, PartialEq)]
pub enum Command {
    /// Every analyst's account (or one's) and the dataset's.
    Show { analyst: Option<String> },
    /// Raise an analyst's limit.
    Grant {
        analyst: String,
        epsilon: Fixed,
        delta: Fixed,
        reason: String,
    },
    /// Zero an analyst's spent totals.
    Reset { analyst: String, reason: String },
    /// An analyst's charges and admin actions.
    History {
        analyst: String,
        since_micros: Option<i64>,
        rows_max: u64,
    },
    /// Export the audit trail.
    Audit {
        since_micros: i64,
        until_micros: Option<i64>,
        analyst: Option<String>,
        format: Format,
    },
}

/// A parsed command line: the command, the policy and where the ledger is.
#[derive(Clone, Debug, PartialEq)]
pub struct Invocation {
    /// What to do.
    pub command: Command,
    /// `--policy FILE`.
    pub policy: PathBuf,
    /// `--ledger`, `PGDP_LEDGER`, `--upstream` or `PGDP_UPSTREAM`, the first given.
    pub ledger: String,
}

/// The raw options, before they are checked against the command.
#[derive(Default)]
struct Raw {
    words: Vec<String>,
    policy: Option<String>,
    ledger: Option<String>,
    upstream: Option<String>,
    epsilon: Option<String>,
    delta: Option<String>,
    reason: Option<String>,
    since: Option<String>,
    until: Option<String>,
    limit: Option<String>,
    analyst: Option<String>,
    format: Option<String>,
}

/// Parses `args` (starting with `budget` or `audit`); `env` reads an environment variable
/// (`PGDP_LEDGER`, `PGDP_UPSTREAM`).
pub fn parse(
    args: Vec<OsString>,
    env: impl Fn(&str) -> Option<String>,
) -> Result<Invocation, AdminError> {
    use lexopt::prelude::*;
    let mut raw = Raw::default();
    let mut parser = lexopt::Parser::from_args(args);
    let text = |v: OsString| {
        v.into_string()
            .map_err(|_| usage("arguments must be UTF-8"))
    };
    let bad = |e: lexopt::Error| usage(e.to_string());
    while let Some(arg) = parser.next().map_err(bad)? {
        let name = match arg {
            Long(name) => name.to_string(),
            Value(v) => {
                raw.words.push(text(v)?);
                continue;
            }
            other => return Err(usage(other.unexpected().to_string())),
        };
        let slot = match name.as_str() {
            "policy" => &mut raw.policy,
            "ledger" => &mut raw.ledger,
            "upstream" => &mut raw.upstream,
            "epsilon" => &mut raw.epsilon,
            "delta" => &mut raw.delta,
            "reason" => &mut raw.reason,
            "since" => &mut raw.since,
            "until" => &mut raw.until,
            "limit" => &mut raw.limit,
            "analyst" => &mut raw.analyst,
            "format" => &mut raw.format,
            _ => return Err(usage(format!("invalid option '--{name}'\nusage:\n{USAGE}"))),
        };
        *slot = Some(parser.value().map_err(bad).and_then(text)?);
    }
    let command = command(&mut raw)?;
    let policy = raw.policy.map(PathBuf::from).ok_or_else(|| {
        usage("--policy FILE is required (it names the analysts and their limits)")
    })?;
    let ledger = raw
        .ledger
        .or_else(|| env("PGDP_LEDGER"))
        .or(raw.upstream)
        .or_else(|| env("PGDP_UPSTREAM"))
        .ok_or_else(|| usage("--ledger DSN (or PGDP_LEDGER, or --upstream/PGDP_UPSTREAM as for serve) is required"))?;
    Ok(Invocation {
        command,
        policy,
        ledger,
    })
}

/// The command the words and options of `raw` make, each option checked for it.
fn command(raw: &mut Raw) -> Result<Command, AdminError> {
    let words: Vec<&str> = raw.words.iter().map(String::as_str).collect();
    let reason = raw.reason.take().unwrap_or_default();
    if reason.len() > ADMIN_REASON_BYTES_MAX {
        return Err(usage(format!(
            "--reason is longer than {ADMIN_REASON_BYTES_MAX} bytes"
        )));
    }
    let (allowed, command): (&[&str], Command) = match words.as_slice() {
        ["budget", "show"] => (&[], Command::Show { analyst: None }),
        ["budget", "show", analyst] => (
            &[],
            Command::Show {
                analyst: Some(analyst.to_string()),
            },
        ),
        ["budget", "grant", analyst] => {
            let epsilon = raw
                .epsilon
                .take()
                .ok_or_else(|| usage("budget grant needs --epsilon E (a positive number)"))?;
            let epsilon = amount("--epsilon", &epsilon)?;
            if epsilon.is_zero() {
                return Err(usage("--epsilon must be positive, got 0"));
            }
            let delta = match raw.delta.take() {
                Some(d) => amount("--delta", &d)?,
                None => Fixed::ZERO,
            };
            (
                &["reason"],
                Command::Grant {
                    analyst: analyst.to_string(),
                    epsilon,
                    delta,
                    reason: reason.clone(),
                },
            )
        }
        ["budget", "reset", analyst] => (
            &["reason"],
            Command::Reset {
                analyst: analyst.to_string(),
                reason: reason.clone(),
            },
        ),
        ["budget", "history", analyst] => {
            let since_micros = raw.since.take().map(|t| time("--since", &t)).transpose()?;
            let rows_max = match raw.limit.take() {
                None => HISTORY_ROWS_DEFAULT,
                Some(n) => match n.parse::<u64>() {
                    Ok(n) if (1..=AUDIT_ROWS_MAX).contains(&n) => n,
                    _ => {
                        return Err(usage(format!(
                            "--limit must be a whole number from 1 to {AUDIT_ROWS_MAX}, got {n:?}"
                        )))
                    }
                },
            };
            (
                &[],
                Command::History {
                    analyst: analyst.to_string(),
                    since_micros,
                    rows_max,
                },
            )
        }
        ["audit"] => {
            let since = raw.since.take().ok_or_else(|| {
                usage("audit needs --since T (e.g. 2026-01-01 or 2026-01-01T00:00:00Z)")
            })?;
            let since_micros = time("--since", &since)?;
            let until_micros = raw.until.take().map(|t| time("--until", &t)).transpose()?;
            if until_micros.is_some_and(|until| until <= since_micros) {
                return Err(usage("--until must be later than --since"));
            }
            let format = match raw.format.take().as_deref() {
                Some("csv") => Format::Csv,
                Some("json") => Format::Json,
                Some(other) => {
                    return Err(usage(format!(
                        "--format must be csv or json, got {other:?}"
                    )))
                }
                None => return Err(usage("audit needs --format csv or --format json")),
            };
            (
                &[],
                Command::Audit {
                    since_micros,
                    until_micros,
                    analyst: raw.analyst.take(),
                    format,
                },
            )
        }
        ["budget"] | ["budget", "show" | "grant" | "reset" | "history", ..] => {
            return Err(usage(format!("usage:\n{USAGE}")))
        }
        ["budget", other, ..] => {
            return Err(usage(format!(
                "unknown budget command {other:?}: show, grant, reset or history"
            )))
        }
        _ => return Err(usage(format!("usage:\n{USAGE}"))),
    };
    // Options given but meaningless for the command are refused, not ignored.
    let given = [
        ("epsilon", raw.epsilon.is_some()),
        ("delta", raw.delta.is_some()),
        ("reason", !reason.is_empty()),
        ("since", raw.since.is_some()),
        ("until", raw.until.is_some()),
        ("limit", raw.limit.is_some()),
        ("analyst", raw.analyst.is_some()),
        ("format", raw.format.is_some()),
    ];
    for (name, present) in given {
        if present && !allowed.contains(&name) && !matches!(name, "reason") {
            return Err(usage(format!("--{name} does not apply to this command")));
        }
        if present && name == "reason" && !allowed.contains(&"reason") {
            return Err(usage("--reason applies to grant and reset only"));
        }
    }
    Ok(command)
}

/// An exact, non-negative, finite decimal amount.
fn amount(flag: &str, text: &str) -> Result<Fixed, AdminError> {
    Fixed::from_decimal_str(text).map_err(|_| {
        usage(format!(
            "{flag} must be a non-negative decimal number with at most {} decimal places, got {text:?}",
            Fixed::SCALE_DIGITS
        ))
    })
}

/// A time: `YYYY-MM-DD` (midnight UTC), or `YYYY-MM-DD[T ]HH:MM:SS[.ffffff]` followed by `Z`, an
/// offset `±HH[:MM]`, or nothing (UTC). Microseconds since 2000-01-01 UTC.
fn time(flag: &str, text: &str) -> Result<i64, AdminError> {
    let text = text.trim();
    let micros = if text.len() == 10 {
        crate::datetime::Date::parse(text).map(|d| d.days_since_2000() * 86_400_000_000)
    } else if let Some(utc) = text.strip_suffix(['Z', 'z']) {
        crate::datetime::timestamp_micros(utc, false)
    } else {
        let zoned = text.get(10..).is_some_and(|rest| rest.contains(['+', '-']));
        crate::datetime::timestamp_micros(text, zoned)
    };
    micros.ok_or_else(|| {
        usage(format!(
            "{flag} must be a date or time in ISO 8601 (2026-01-31, 2026-01-31T12:00:00Z, 2026-01-31 12:00:00+02), got {text:?}"
        ))
    })
}

/// The OS user running the command, as the environment names it.
pub fn os_user(env: impl Fn(&str) -> Option<String>) -> String {
    env("USER")
        .or_else(|| env("LOGNAME"))
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

/// Runs `invocation` and returns what to print on standard output. `made_by` is the OS user.
pub async fn run(invocation: &Invocation, made_by: &str) -> Result<String, AdminError> {
    let policy = crate::policy::load(&invocation.policy)
        .map_err(|errors| AdminError::Policy(errors.to_string()))?;
    // Every analyst named must be in the policy, before the ledger is touched.
    let named = match &invocation.command {
        Command::Show { analyst } => analyst.clone(),
        Command::Grant { analyst, .. }
        | Command::Reset { analyst, .. }
        | Command::History { analyst, .. } => Some(analyst.clone()),
        Command::Audit { analyst, .. } => analyst.clone(),
    };
    if let Some(name) = &named {
        policy_limit(&policy, name)?;
    }
    let ledger = Ledger::connect(&invocation.ledger).await?;
    match &invocation.command {
        Command::Show { analyst } => {
            let names: Vec<String> = match analyst {
                Some(a) => vec![a.clone()],
                None => policy.analysts.keys().cloned().collect(),
            };
            let mut accounts = ledger.accounts(&names).await?;
            // A renewing budget is shown with its current window's totals.
            let mut windows = Vec::new();
            for name in &names {
                let limit = policy_limit(&policy, name)?;
                if limit.period.is_some() {
                    let (balance, window) = ledger.balance_with_window(name, &limit).await?;
                    if let Some(account) = accounts.analysts.iter_mut().find(|a| &a.analyst == name)
                    {
                        account.spent = balance.spent;
                    }
                    windows.push((name.clone(), window));
                }
            }
            if let Some(spec) = &policy.dataset_budget {
                let limit = crate::session::limit_of(spec)?;
                if limit.period.is_some() {
                    let (balance, window) = ledger.dataset_balance_with_window(&limit).await?;
                    accounts.dataset.spent = balance.spent;
                    windows.push(("(dataset)".to_string(), window));
                }
            }
            show(
                &policy,
                &names,
                &accounts.analysts,
                &accounts.dataset,
                &windows,
            )
        }
        Command::Grant {
            analyst,
            epsilon,
            delta,
            reason,
        } => {
            let limit = policy_limit(&policy, analyst)?;
            let record = ledger
                .grant(
                    &limit,
                    &GrantRequest {
                        analyst,
                        epsilon: *epsilon,
                        delta: *delta,
                        reason,
                        made_by,
                    },
                )
                .await?;
            let balance = ledger.balance(analyst, &limit).await?;
            Ok(format!(
                "granted {analyst} epsilon={} delta={} (admin log id {} at {}); limit now epsilon={} delta={} (policy {} + grants {}), remaining epsilon={}\n",
                record.epsilon,
                record.delta,
                record.id,
                record.at,
                balance.limit.epsilon,
                balance.limit.delta,
                limit.epsilon,
                balance.limit.epsilon.saturating_sub(limit.epsilon),
                balance.remaining.epsilon,
            ))
        }
        Command::Reset { analyst, reason } => {
            let record = ledger.reset(analyst, reason, made_by).await?;
            Ok(format!(
                "reset {analyst}: zeroed epsilon={} delta={} rho={} (admin log id {} at {}); the charge log keeps every charge\n",
                record.epsilon, record.delta, record.rho, record.id, record.at
            ))
        }
        Command::History {
            analyst,
            since_micros,
            rows_max,
        } => {
            let events = ledger
                .events(&AuditFilter {
                    since_micros: *since_micros,
                    until_micros: None,
                    analyst: Some(analyst.clone()),
                    rows_max: *rows_max,
                })
                .await?;
            Ok(history(&events))
        }
        Command::Audit {
            since_micros,
            until_micros,
            analyst,
            format,
        } => {
            let events = ledger
                .events(&AuditFilter {
                    since_micros: Some(*since_micros),
                    until_micros: *until_micros,
                    analyst: analyst.clone(),
                    rows_max: AUDIT_ROWS_MAX + 1,
                })
                .await?;
            if events.len() as u64 > AUDIT_ROWS_MAX {
                return Err(usage(format!(
                    "more than {AUDIT_ROWS_MAX} events in that window; narrow it with --since and --until"
                )));
            }
            match format {
                Format::Csv => Ok(csv(&events)),
                Format::Json => json(&events),
            }
        }
    }
}

/// The analyst's limit in the policy, or [`AdminError::UnknownAnalyst`].
fn policy_limit(policy: &Policy, analyst: &str) -> Result<Limit, AdminError> {
    let Some(spec) = policy.analysts.get(analyst) else {
        let known: Vec<String> = policy.analysts.keys().map(|k| format!("{k:?}")).collect();
        return Err(AdminError::UnknownAnalyst {
            name: analyst.to_string(),
            known: if known.is_empty() {
                "no analysts".into()
            } else {
                known.join(", ")
            },
        });
    };
    Ok(crate::session::limit_of(&spec.budget)?)
}

/// `pgdp budget show`: one row per analyst in `names`, then the dataset's.
fn show(
    policy: &Policy,
    names: &[String],
    accounts: &[Account],
    dataset: &Account,
    windows: &[(String, Option<crate::budget::Window>)],
) -> Result<String, AdminError> {
    let header = [
        "analyst",
        "epsilon_policy",
        "epsilon_granted",
        "epsilon_limit",
        "epsilon_spent",
        "epsilon_proven",
        "rho_spent",
        "delta_limit",
        "delta_spent",
        "charges",
        "epsilon_remaining",
        "delta_remaining",
        "last_charge",
        "renews_at",
        "accounting",
    ];
    // When the current window of a renewing budget ends (its spent columns are the window's),
    // else `-`.
    let window_of = |name: &str| {
        windows
            .iter()
            .find(|(n, _)| n == name)
            .and_then(|(_, w)| w.as_ref())
            .map_or_else(|| "-".to_string(), |w| w.end_iso8601())
    };
    let mut rows = Vec::new();
    for name in names {
        let policy_limit = policy_limit(policy, name)?;
        let account = accounts
            .iter()
            .find(|a| &a.analyst == name)
            .cloned()
            .unwrap_or_else(|| Account::empty(name));
        let limit = policy_limit.granted(&account.granted);
        let mut row = account_row(name, Some(policy_limit), &account, Some(&limit));
        row.push(window_of(name));
        row.push(accounting_of(&account.spent, Some(&limit)));
        rows.push(row);
    }
    let dataset_limit = match &policy.dataset_budget {
        Some(spec) => Some(crate::session::limit_of(spec)?),
        None => None,
    };
    let mut row = account_row("(dataset)", dataset_limit, dataset, dataset_limit.as_ref());
    row.push(window_of("(dataset)"));
    row.push(accounting_of(&dataset.spent, dataset_limit.as_ref()));
    rows.push(row);
    let mut out = table(&header, &rows);
    if dataset_limit.is_none() {
        out.push_str("(the policy sets no dataset budget: the dataset row only counts)\n");
    }
    Ok(out)
}

/// The `accounting` column of `show`: the rule the history is composed under (fixed at its
/// first charge), and the policy's when it differs (it applies to the next history); the
/// policy's alone before any charge; `-` for totals no limit governs.
fn accounting_of(spent: &crate::budget::Spent, limit: Option<&Limit>) -> String {
    match (spent.accounting, limit) {
        (Some(fixed), Some(l)) if fixed != l.accounting => {
            format!("{} (policy: {})", fixed.name(), l.accounting.name())
        }
        (Some(fixed), _) => fixed.name().to_string(),
        (None, Some(l)) => l.accounting.name().to_string(),
        (None, None) => "-".to_string(),
    }
}

/// One row of `show`.
fn account_row(
    name: &str,
    policy_limit: Option<Limit>,
    account: &Account,
    limit: Option<&Limit>,
) -> Vec<String> {
    let dash = || "-".to_string();
    let spent = &account.spent;
    let proven = limit
        .and_then(|l| guarantee(l, spent))
        .map_or_else(|| spent.epsilon.to_string(), |g| g.epsilon.to_string());
    let left = limit.map(|l| remaining(l, spent));
    vec![
        name.to_string(),
        policy_limit.map_or_else(dash, |l| l.epsilon.to_string()),
        account.granted.epsilon.to_string(),
        limit.map_or_else(dash, |l| l.epsilon.to_string()),
        spent.epsilon.to_string(),
        proven,
        spent.rho.to_string(),
        limit.map_or_else(dash, |l| l.delta.to_string()),
        spent.delta.to_string(),
        account.charges.to_string(),
        left.map_or_else(dash, |r| r.epsilon.to_string()),
        left.map_or_else(dash, |r| r.delta.to_string()),
        account.last_charge.clone().unwrap_or_else(dash),
    ]
}

/// `pgdp budget history`: the events, oldest first.
fn history(events: &[AuditEvent]) -> String {
    let header = [
        "at",
        "event",
        "epsilon",
        "delta",
        "rho",
        "mechanism",
        "outcome",
        "tables",
        "fingerprint",
        "made_by",
        "reason",
    ];
    let rows: Vec<Vec<String>> = events
        .iter()
        .map(|e| {
            let made_by = if e.made_by.is_empty() {
                String::new()
            } else {
                format!("{} (role {})", e.made_by, e.ledger_role)
            };
            vec![
                e.at.clone(),
                e.kind.clone(),
                e.epsilon.to_string(),
                e.delta.to_string(),
                e.rho.to_string(),
                e.mechanism.clone(),
                e.outcome.clone(),
                e.tables.join(","),
                e.fingerprint.chars().take(16).collect(),
                made_by,
                e.reason.clone(),
            ]
        })
        .collect();
    if rows.is_empty() {
        return "no charges or admin actions\n".into();
    }
    table(&header, &rows)
}

/// An aligned plain-text table: columns padded to their widest cell (in characters), two
/// spaces apart, a dashed line under the header. Control characters in cells are shown as
/// spaces so a reason cannot break the layout.
fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let clean = |s: &str| -> String {
        s.chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect()
    };
    let header: Vec<String> = header.iter().map(|h| h.to_string()).collect();
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|r| r.iter().map(|c| clean(c)).collect())
        .collect();
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let line = |out: &mut String, cells: &[String]| {
        let mut text = String::new();
        for (i, (cell, w)) in cells.iter().zip(&widths).enumerate() {
            if i > 0 {
                text.push_str("  ");
            }
            let _ = write!(text, "{cell:<w$}");
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    line(&mut out, &header);
    let dashes: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
    line(&mut out, &dashes);
    for row in &rows {
        line(&mut out, row);
    }
    out
}

/// The columns of the audit export, in order.
const AUDIT_COLUMNS: [&str; 14] = [
    "kind",
    "id",
    "at",
    "analyst",
    "epsilon",
    "delta",
    "rho",
    "mechanism",
    "outcome",
    "tables",
    "fingerprint",
    "made_by",
    "ledger_role",
    "reason",
];

/// One event's fields in [`AUDIT_COLUMNS`] order, tables joined with `;`.
fn audit_fields(e: &AuditEvent) -> [String; 14] {
    [
        e.kind.clone(),
        e.id.to_string(),
        e.at.clone(),
        e.analyst.clone(),
        e.epsilon.to_string(),
        e.delta.to_string(),
        e.rho.to_string(),
        e.mechanism.clone(),
        e.outcome.clone(),
        e.tables.join(";"),
        e.fingerprint.clone(),
        e.made_by.clone(),
        e.ledger_role.clone(),
        e.reason.clone(),
    ]
}

/// RFC 4180 CSV: a header, one line per event (CRLF), a field quoted when it holds a comma, a
/// quote, CR or LF, or starts or ends with a space, with its quotes doubled.
fn csv(events: &[AuditEvent]) -> String {
    let field = |s: &str| -> String {
        if s.contains([',', '"', '\r', '\n']) || s.starts_with(' ') || s.ends_with(' ') {
            format!("\"{}\"", s.replace('"', "\"\""))
        } else {
            s.to_string()
        }
    };
    let mut out = AUDIT_COLUMNS.join(",");
    out.push_str("\r\n");
    for e in events {
        let fields: Vec<String> = audit_fields(e).iter().map(|f| field(f)).collect();
        out.push_str(&fields.join(","));
        out.push_str("\r\n");
    }
    out
}

/// A JSON array of objects with the [`AUDIT_COLUMNS`] as keys: `id` a number, `tables` an array
/// of strings, amounts exact decimal strings (a JSON number would be read as a float).
fn json(events: &[AuditEvent]) -> Result<String, AdminError> {
    let array: Vec<serde_json::Value> = events
        .iter()
        .map(|e| {
            let mut object = serde_json::Map::new();
            for (key, value) in AUDIT_COLUMNS.iter().zip(audit_fields(e)) {
                let value = match *key {
                    "id" => serde_json::Value::from(e.id),
                    "tables" => serde_json::Value::from(e.tables.clone()),
                    _ => serde_json::Value::from(value),
                };
                object.insert((*key).to_string(), value);
            }
            serde_json::Value::Object(object)
        })
        .collect();
    let mut text = serde_json::to_string_pretty(&array)
        .map_err(|e| usage(format!("cannot write JSON: {e}")))?;
    text.push('\n');
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_words(words: &[&str]) -> Result<Invocation, AdminError> {
        parse(words.iter().map(OsString::from).collect(), |_| None)
    }

    fn with_files(words: &[&str]) -> Vec<String> {
        let mut v: Vec<String> = words.iter().map(|w| w.to_string()).collect();
        v.extend(["--policy", "p.yaml", "--ledger", "dbname=x"].map(String::from));
        v
    }

    fn parsed(words: &[&str]) -> Result<Command, AdminError> {
        let words = with_files(words);
        let refs: Vec<&str> = words.iter().map(String::as_str).collect();
        parse_words(&refs).map(|i| i.command)
    }

    #[test]
    fn grant_amounts_are_exact_and_positive() {
        let command = parsed(&[
            "budget",
            "grant",
            "ann",
            "--epsilon",
            "0.5",
            "--delta",
            "1e-6",
        ])
        .unwrap();
        assert_eq!(
            command,
            Command::Grant {
                analyst: "ann".into(),
                epsilon: Fixed::from_decimal_str("0.5").unwrap(),
                delta: Fixed::from_decimal_str("0.000001").unwrap(),
                reason: String::new(),
            }
        );
        for bad in ["-1", "0", "NaN", "inf", "abc", "", "1e400", "-0.5"] {
            let result = parsed(&["budget", "grant", "ann", "--epsilon", bad]);
            assert!(
                matches!(result, Err(AdminError::Usage(_))),
                "epsilon {bad:?}: {result:?}"
            );
        }
        for bad in ["-1e-6", "NaN", "x"] {
            let result = parsed(&["budget", "grant", "ann", "--epsilon", "1", "--delta", bad]);
            assert!(matches!(result, Err(AdminError::Usage(_))), "delta {bad:?}");
        }
        assert!(matches!(
            parsed(&["budget", "grant", "ann"]),
            Err(AdminError::Usage(_))
        ));
    }

    #[test]
    fn options_that_do_not_apply_are_refused() {
        assert!(parsed(&["budget", "show", "--epsilon", "1"]).is_err());
        assert!(parsed(&["budget", "reset", "ann", "--since", "2026-01-01"]).is_err());
        assert!(parsed(&["budget", "history", "ann", "--reason", "x"]).is_err());
        assert!(parsed(&["budget", "frobnicate", "ann"]).is_err());
        assert!(parsed(&["budget", "grant", "a", "b", "--epsilon", "1"]).is_err());
        assert!(parsed(&["budget", "reset", "ann", "--reason", "new quarter"]).is_ok());
    }

    #[test]
    fn ledger_falls_back_to_the_environment_and_the_upstream() {
        let words = ["budget", "show", "--policy", "p.yaml"].map(OsString::from);
        let env = |name: &str| (name == "PGDP_UPSTREAM").then(|| "dbname=up".to_string());
        assert_eq!(parse(words.to_vec(), env).unwrap().ledger, "dbname=up");
        let env = |name: &str| match name {
            "PGDP_LEDGER" => Some("dbname=led".to_string()),
            _ => Some("dbname=up".to_string()),
        };
        assert_eq!(parse(words.to_vec(), env).unwrap().ledger, "dbname=led");
        assert!(matches!(
            parse(words.to_vec(), |_| None),
            Err(AdminError::Usage(_))
        ));
    }

    #[test]
    fn times_are_iso_8601_in_utc_unless_an_offset_says_otherwise() {
        let day = time("--since", "2000-01-02").unwrap();
        assert_eq!(day, 86_400_000_000);
        assert_eq!(time("--since", "2000-01-02T00:00:00Z").unwrap(), day);
        assert_eq!(time("--since", "2000-01-02 00:00:00").unwrap(), day);
        assert_eq!(
            time("--since", "2000-01-02T02:00:00+02").unwrap(),
            day,
            "an offset is subtracted"
        );
        assert_eq!(time("--since", "2000-01-01T22:00:00-02:00").unwrap(), day);
        for bad in ["yesterday", "2000-13-01", "2000-01-02T25:00:00Z", ""] {
            assert!(time("--since", bad).is_err(), "{bad:?}");
        }
        assert!(parsed(&[
            "audit",
            "--since",
            "2026-02-01",
            "--until",
            "2026-01-01",
            "--format",
            "csv"
        ])
        .is_err());
        assert!(parsed(&["audit", "--since", "2026-01-01", "--format", "xml"]).is_err());
        assert!(parsed(&["audit", "--since", "2026-01-01"]).is_err());
    }

    fn event(reason: &str, tables: &[&str]) -> AuditEvent {
        AuditEvent {
            kind: "charge".into(),
            id: 7,
            at: "2026-01-01T00:00:00.000000Z".into(),
            analyst: "ann".into(),
            epsilon: Fixed::from_decimal_str("0.5").unwrap(),
            delta: Fixed::ZERO,
            rho: Fixed::ZERO,
            mechanism: "laplace".into(),
            outcome: "released".into(),
            tables: tables.iter().map(|t| t.to_string()).collect(),
            fingerprint: "ab".into(),
            made_by: String::new(),
            ledger_role: String::new(),
            reason: reason.into(),
        }
    }

    #[test]
    fn csv_quotes_what_needs_it() {
        let text = csv(&[event("a, \"b\"\nc", &["demo.people", "demo.visits"])]);
        let lines: Vec<&str> = text.split("\r\n").collect();
        assert_eq!(lines[0], AUDIT_COLUMNS.join(","));
        assert_eq!(
            lines[1],
            "charge,7,2026-01-01T00:00:00.000000Z,ann,0.5,0,0,laplace,released,demo.people;demo.visits,ab,,,\"a, \"\"b\"\"\nc\""
        );
    }

    #[test]
    fn json_keeps_amounts_exact_and_tables_as_an_array() {
        let text = json(&[event("x\"y", &["demo.people"])]).unwrap();
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(value[0]["epsilon"], "0.5");
        assert_eq!(value[0]["id"], 7);
        assert_eq!(value[0]["tables"][0], "demo.people");
        assert_eq!(value[0]["reason"], "x\"y");
    }

    #[test]
    fn table_aligns_columns() {
        let text = table(
            &["a", "bb"],
            &[
                vec!["xyz".into(), "1".into()],
                vec!["q".into(), "22\n".into()],
            ],
        );
        // The line break in the last cell is shown as a space (and still counts for the width).
        assert_eq!(text, "a    bb\n---  ---\nxyz  1\nq    22\n");
    }
}
