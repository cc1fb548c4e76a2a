//! From YAML to a [`Policy`]: raw serde structs that reject unknown keys, then validation into the
//! domain types, collecting every problem with the path of the key that causes it.

use super::*;

mod synopses;
mod tables;

pub(super) use synopses::RawSynopsis;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPolicy {
    database: String,
    #[serde(default)]
    secret_env: Option<String>,
    #[serde(default)]
    defaults: RawDefaults,
    #[serde(default)]
    budget: Option<RawBudget>,
    #[serde(default)]
    replay_lifetime_s: Option<u64>,
    #[serde(default)]
    statement_timeout_s: Option<u64>,
    #[serde(default)]
    release_schedule: Option<RawReleaseSchedule>,
    #[serde(default)]
    login_throttle: Option<RawLoginThrottle>,
    analysts: BTreeMap<String, RawAnalyst>,
    tables: BTreeMap<String, RawTable>,
    #[serde(default)]
    synopses: BTreeMap<String, RawSynopsis>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDefaults {
    epsilon: Option<f64>,
    delta: Option<f64>,
    mechanism: Option<String>,
    choose_bounds: Option<bool>,
    max_bias: Option<RawShare>,
}

/// A share as written: a number (`0.1`), a percentage (`'10%'`) or `off`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum RawShare {
    Number(f64),
    Text(String),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLoginThrottle {
    #[serde(default)]
    failures_per_user: Option<u32>,
    #[serde(default)]
    failures_per_address: Option<u32>,
    #[serde(default)]
    window_s: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawReleaseSchedule {
    floor_ms: u64,
    ratio: f64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawBudget {
    epsilon: f64,
    #[serde(default)]
    delta: f64,
    #[serde(default)]
    epsilon_per_query_max: Option<f64>,
    /// Read as any YAML value so that a malformed one gets a path-named error, not serde's.
    #[serde(default)]
    period: Option<serde_norway::Value>,
    /// Read as any YAML value, as `period`.
    #[serde(default)]
    accounting: Option<serde_norway::Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAnalyst {
    #[serde(default)]
    scram_verifier: Option<String>,
    #[serde(default)]
    password_env: Option<String>,
    budget: RawBudget,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTable {
    kind: String,
    #[serde(default)]
    privacy_unit: Option<String>,
    #[serde(default)]
    unit_path: Option<Vec<RawPathStep>>,
    #[serde(default)]
    max_groups_per_unit: Option<u64>,
    #[serde(default)]
    max_rows_per_unit: Option<u64>,
    #[serde(default)]
    ceilings: Option<RawCeilings>,
    #[serde(default)]
    unique_keys: Option<Vec<String>>,
    columns: BTreeMap<String, RawColumn>,
}

/// A private table's `unique_keys`, lower-cased: each a declared column, named once.
fn unique_keys(
    p: &mut Problems,
    path: &str,
    raw: Option<&[String]>,
    columns: &[Column],
) -> Vec<String> {
    let mut keys: Vec<String> = Vec::new();
    for (i, key) in raw.unwrap_or_default().iter().enumerate() {
        let key = key.to_ascii_lowercase();
        if !columns.iter().any(|c| c.name == key) {
            p.add(
                &format!("{path}.unique_keys[{i}]"),
                format!("column {key} is not declared in columns"),
            );
        } else if keys.contains(&key) {
            p.add(&format!("{path}.unique_keys[{i}]"), "named twice");
        } else {
            keys.push(key);
        }
    }
    keys
}

/// A private table's `ceilings`: how far a query that chooses its caps (`pgdp.choose_bounds`)
/// may raise them.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCeilings {
    #[serde(default)]
    max_groups_per_unit: Option<u64>,
    #[serde(default)]
    max_rows_per_unit: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPathStep {
    column: String,
    references: String,
    key: String,
}

/// A bound as written: a number, or for a `date` column a date `'YYYY-MM-DD'`, or for a
/// `timestamp` / `timestamptz` column a date or a timestamp `'YYYY-MM-DD HH:MM:SS[±HH[:MM]]'`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum RawBound {
    Number(f64),
    Text(String),
}

impl RawBound {
    /// The bound in the column's terms: the number itself, for a date column the date's day
    /// number since 2000-01-01 (PostgreSQL's date epoch), which `date - DATE '2000-01-01'` gives
    /// upstream, and for a timestamp column its seconds since 1970-01-01 00:00:00, which
    /// `EXTRACT(EPOCH FROM ts)` gives upstream (of a `timestamptz` bound without an offset, UTC).
    fn value(&self, ty: ColumnType, declared: &str) -> std::result::Result<f64, String> {
        match (self, ty) {
            (RawBound::Number(x), t) if t.is_numeric() => Ok(*x),
            (RawBound::Text(text), ColumnType::Date) => crate::datetime::Date::parse(text.trim())
                .map(|d| d.days_since_2000() as f64)
                .ok_or_else(|| format!("{text:?} is not a date YYYY-MM-DD")),
            (_, ColumnType::Date) => {
                Err("a date column's bounds are dates, e.g. '2015-01-01'".into())
            }
            (RawBound::Text(text), ColumnType::Timestamp) => {
                crate::datetime::epoch_seconds(text, super::with_time_zone(declared)).ok_or_else(
                    || {
                        format!(
                            "{text:?} is not a date YYYY-MM-DD or a timestamp YYYY-MM-DD HH:MM:SS{}",
                            if super::with_time_zone(declared) {
                                " (an offset such as +02 may follow; UTC without one)"
                            } else {
                                " (no offset: the column has no time zone)"
                            }
                        )
                    },
                )
            }
            (_, ColumnType::Timestamp) => Err(
                "a timestamp column's bounds are dates or timestamps, e.g. '2015-01-01' or '2015-01-01 06:00:00'"
                    .into(),
            ),
            (_, t) if t.is_numeric() => Err("a numeric column's bounds are numbers".into()),
            (_, t) => Err(format!(
                "bounds need a numeric, date or timestamp column, not {}",
                t.name()
            )),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawColumn {
    #[serde(rename = "type")]
    ty: String,
    #[serde(default)]
    lower: Option<RawBound>,
    #[serde(default)]
    upper: Option<RawBound>,
    #[serde(default)]
    upper_ceiling: Option<f64>,
    #[serde(default)]
    groupable: Option<bool>,
    #[serde(default)]
    public_values: Option<Vec<serde_norway::Value>>,
    #[serde(default)]
    exhaustive: Option<bool>,
}

/// Collects problems with their paths.
pub(super) struct Problems(Vec<String>);

impl Problems {
    fn add(&mut self, path: &str, msg: impl fmt::Display) {
        self.0.push(format!("{path}: {msg}"));
    }
}

pub(super) fn check_epsilon(p: &mut Problems, path: &str, eps: f64) {
    if !eps.is_finite() || eps <= 0.0 {
        p.add(
            path,
            format!("epsilon must be positive and finite, got {eps}"),
        );
    }
}

pub(super) fn check_delta(p: &mut Problems, path: &str, delta: f64) {
    if !delta.is_finite() || !(0.0..1.0).contains(&delta) {
        p.add(path, format!("delta must be in [0, 1), got {delta}"));
    }
}

/// `login_throttle`: each key defaults to `limits.rs`; a user must be able to mistype twice
/// (`failures_per_user >= 3`), the address-wide limit is at least the per-user one, and the
/// window lies within [`limits::AUTH_FAILURE_WINDOW_S_RANGE`].
fn validate_login_throttle(p: &mut Problems, t: &RawLoginThrottle) -> LoginThrottle {
    let d = LoginThrottle::default();
    let mut out = LoginThrottle {
        failures_per_user: t.failures_per_user.unwrap_or(d.failures_per_user),
        failures_per_address: t.failures_per_address.unwrap_or(d.failures_per_address),
        window: t.window_s.map_or(d.window, std::time::Duration::from_secs),
    };
    if out.failures_per_user < 3 {
        p.add(
            "login_throttle.failures_per_user",
            "must be at least 3 (a user who mistypes a password twice must not be locked out)",
        );
        out.failures_per_user = d.failures_per_user;
    }
    if out.failures_per_address < out.failures_per_user {
        p.add(
            "login_throttle.failures_per_address",
            format!(
                "must be at least failures_per_user ({}): it counts every user name from the address",
                out.failures_per_user
            ),
        );
        out.failures_per_address = d.failures_per_address.max(out.failures_per_user);
    }
    let (low, high) = limits::AUTH_FAILURE_WINDOW_S_RANGE;
    if let Some(w) = t.window_s.filter(|w| !(low..=high).contains(w)) {
        p.add(
            "login_throttle.window_s",
            format!("must be between {low} and {high} seconds, not {w}"),
        );
        out.window = d.window;
    }
    out
}

pub(super) fn validate_budget(p: &mut Problems, path: &str, raw: &RawBudget) -> BudgetSpec {
    check_epsilon(p, &format!("{path}.epsilon"), raw.epsilon);
    check_delta(p, &format!("{path}.delta"), raw.delta);
    if let Some(cap) = raw.epsilon_per_query_max {
        check_epsilon(p, &format!("{path}.epsilon_per_query_max"), cap);
        if cap > raw.epsilon {
            p.add(
                &format!("{path}.epsilon_per_query_max"),
                format!(
                    "per-query cap ({cap}) must not exceed the total epsilon ({})",
                    raw.epsilon
                ),
            );
        }
    }
    let period = raw.period.as_ref().and_then(|value| {
        let text = value_text(value);
        let period = text.as_deref().and_then(Period::parse);
        if period.is_none() {
            p.add(
                &format!("{path}.period"),
                format!(
                    "must be day, week or month (or left out: the budget never renews), got {}",
                    text.map_or("a value that is not text".to_string(), |t| format!("'{t}'"))
                ),
            );
        }
        period
    });
    let accounting = raw.accounting.as_ref().map_or(Accounting::Mixed, |value| {
        let text = value_text(value);
        text.as_deref()
            .and_then(Accounting::parse)
            .unwrap_or_else(|| {
                p.add(
                    &format!("{path}.accounting"),
                    format!(
                        "must be mixed or gaussian (or left out: mixed), got {}",
                        text.map_or("a value that is not text".to_string(), |t| format!("'{t}'"))
                    ),
                );
                Accounting::Mixed
            })
    });
    BudgetSpec {
        epsilon: raw.epsilon,
        delta: raw.delta,
        epsilon_per_query_max: raw.epsilon_per_query_max,
        period,
        accounting,
    }
}

/// Parses a PostgreSQL SCRAM-SHA-256 verifier:
/// `SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>` (base64 parts).
pub fn parse_scram_verifier(text: &str) -> Result<Credential, String> {
    let rest = text
        .strip_prefix("SCRAM-SHA-256$")
        .ok_or("a SCRAM verifier starts with SCRAM-SHA-256$")?;
    let (iter_salt, keys) = rest
        .split_once('$')
        .ok_or("expected <iterations>:<salt>$<keys>")?;
    let (iterations, salt) = iter_salt
        .split_once(':')
        .ok_or("expected <iterations>:<salt>")?;
    let (stored, server) = keys
        .split_once(':')
        .ok_or("expected <StoredKey>:<ServerKey>")?;
    let iterations: usize = iterations
        .parse()
        .map_err(|_| "iterations must be a number")?;
    if iterations < 4096 {
        return Err("SCRAM iterations must be at least 4096".into());
    }
    let b64 = base64::engine::general_purpose::STANDARD;
    let salt = b64.decode(salt).map_err(|_| "salt is not base64")?;
    let stored_key = b64.decode(stored).map_err(|_| "StoredKey is not base64")?;
    let server_key = b64.decode(server).map_err(|_| "ServerKey is not base64")?;
    if stored_key.len() != 32 || server_key.len() != 32 {
        return Err("StoredKey and ServerKey must be 32 bytes".into());
    }
    Ok(Credential::Verifier {
        salt,
        iterations,
        stored_key,
        server_key,
    })
}

pub(super) fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_lowercase() || c == '_')
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

pub(super) fn value_text(v: &serde_norway::Value) -> Option<String> {
    match v {
        serde_norway::Value::String(s) => Some(s.clone()),
        serde_norway::Value::Number(n) => Some(n.to_string()),
        serde_norway::Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// The steps of a `unit_path` as written, lower-cased, with shape errors reported.
pub(super) fn raw_path_steps(p: &mut Problems, path: &str, raw: &[RawPathStep]) -> Vec<PathStep> {
    if raw.is_empty() {
        p.add(&format!("{path}.unit_path"), "needs at least one step");
    }
    let mut steps = Vec::new();
    for (i, s) in raw.iter().enumerate() {
        let spath = format!("{path}.unit_path[{i}]");
        let column = s.column.to_ascii_lowercase();
        let key = s.key.to_ascii_lowercase();
        let references = s.references.to_ascii_lowercase();
        for (what, name) in [("column", &column), ("key", &key)] {
            if !is_identifier(name) {
                p.add(
                    &format!("{spath}.{what}"),
                    "must be a plain lower-case identifier",
                );
            }
        }
        if !references
            .split_once('.')
            .is_some_and(|(s, t)| is_identifier(s) && is_identifier(t))
        {
            p.add(
                &format!("{spath}.references"),
                "must be a table of the policy, qualified as schema.table",
            );
        }
        steps.push(PathStep {
            column,
            references,
            key,
        });
    }
    steps
}

/// Resolves every table's unit path through the tables it references (a referenced table with a
/// path of its own continues the chain), checking each step against the declared columns, and
/// stores the result in the table.
pub(super) fn resolve_unit_paths(
    p: &mut Problems,
    raw_paths: &BTreeMap<String, Vec<PathStep>>,
    tables: &mut BTreeMap<String, Table>,
) {
    for (name, own) in raw_paths {
        let path = format!("tables.{name}.unit_path");
        let mut steps: Vec<PathStep> = Vec::new();
        let mut visited = vec![name.clone()];
        let mut pending: Vec<(String, PathStep)> = own
            .iter()
            .enumerate()
            .map(|(i, s)| (format!("{path}[{i}]"), s.clone()))
            .collect();
        pending.reverse();
        let mut resolved: Option<(String, String)> = None;
        let mut failed = false;
        while let Some((spath, step)) = pending.pop() {
            if steps.len() >= limits::UNIT_PATH_STEPS_MAX {
                p.add(
                    &path,
                    format!(
                        "the chain to the privacy unit has more than {} steps",
                        limits::UNIT_PATH_STEPS_MAX
                    ),
                );
                failed = true;
                break;
            }
            // The column this step starts from belongs to the previous table of the chain.
            let from = visited.last().cloned().unwrap_or_default();
            if let Some(t) = tables.get(&from) {
                if t.column(&step.column).is_none() {
                    p.add(
                        &format!("{spath}.column"),
                        format!("column {} is not declared in {from}", step.column),
                    );
                    failed = true;
                    break;
                }
            }
            let Some(target) = tables.get(&step.references) else {
                p.add(
                    &format!("{spath}.references"),
                    format!("{} is not a table of the policy", step.references),
                );
                failed = true;
                break;
            };
            let Some(private) = target.private() else {
                p.add(
                    &format!("{spath}.references"),
                    format!(
                        "{} is public: a unit path leads to a private table",
                        step.references
                    ),
                );
                failed = true;
                break;
            };
            if target.column(&step.key).is_none() {
                p.add(
                    &format!("{spath}.key"),
                    format!("column {} is not declared in {}", step.key, step.references),
                );
                failed = true;
                break;
            }
            if visited.contains(&step.references) {
                p.add(
                    &format!("{spath}.references"),
                    format!("the unit path returns to {} (a cycle)", step.references),
                );
                failed = true;
                break;
            }
            visited.push(step.references.clone());
            steps.push(step.clone());
            if pending.is_empty() {
                match (&private.privacy_unit, raw_paths.get(&step.references)) {
                    (Some(unit), _) => {
                        let ty = target
                            .column(unit)
                            .map(|c| c.declared_type.clone())
                            .unwrap_or_else(|| "bigint".into());
                        resolved = Some((unit.clone(), ty));
                    }
                    (None, Some(next)) => {
                        // The referenced table's own path continues the chain.
                        let next_path = format!("tables.{}.unit_path", step.references);
                        pending = next
                            .iter()
                            .enumerate()
                            .map(|(i, s)| (format!("{next_path}[{i}]"), s.clone()))
                            .collect();
                        pending.reverse();
                    }
                    (None, None) => {
                        p.add(
                            &format!("{spath}.references"),
                            format!(
                                "{} is row-level: a unit path must end at a table with a privacy_unit",
                                step.references
                            ),
                        );
                        failed = true;
                    }
                }
            }
        }
        if failed {
            continue;
        }
        let Some((unit, unit_type)) = resolved else {
            continue;
        };
        let Some(table) = tables.get_mut(name) else {
            continue;
        };
        if table.column(&unit).is_some() {
            p.add(
                &format!("tables.{name}.columns.{unit}"),
                format!(
                    "the unit path gives this table's rows the privacy unit column {unit}; do not declare a column of that name"
                ),
            );
            continue;
        }
        if let TableKind::Private(pt) = &mut table.kind {
            pt.unit_path = Some(UnitPath {
                steps,
                unit,
                unit_type,
            });
        }
    }
}

pub(super) fn validate(
    raw: RawPolicy,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Policy, PolicyErrors> {
    let mut p = Problems(Vec::new());

    if raw.database.trim().is_empty() {
        p.add("database", "must not be empty");
    }
    let secret = validate_secret(&mut p, raw.secret_env.as_deref(), env);
    let epsilon = raw.defaults.epsilon.unwrap_or(1.0);
    check_epsilon(&mut p, "defaults.epsilon", epsilon);
    if epsilon.is_finite()
        && !(limits::EPSILON_PER_QUERY_MIN..=limits::EPSILON_PER_QUERY_MAX).contains(&epsilon)
    {
        p.add(
            "defaults.epsilon",
            format!(
                "must be between {} and {}",
                limits::EPSILON_PER_QUERY_MIN,
                limits::EPSILON_PER_QUERY_MAX
            ),
        );
    }
    let delta = raw.defaults.delta.unwrap_or(1e-7);
    check_delta(&mut p, "defaults.delta", delta);
    // Omitted: pgdp chooses per query (docs/privacy.md §5, "Choosing the mechanism").
    let mechanism = match raw.defaults.mechanism.as_deref() {
        None => Mechanism::Auto,
        Some(m) => Mechanism::parse(m).unwrap_or_else(|| {
            p.add(
                "defaults.mechanism",
                format!("unknown mechanism {m:?}; use laplace, gaussian or auto"),
            );
            Mechanism::Laplace
        }),
    };
    // Omitted: the default share (docs/privacy.md, "Refusing answers the caps bias").
    let max_bias = match &raw.defaults.max_bias {
        None => Some(limits::MAX_BIAS_DEFAULT),
        Some(RawShare::Number(x)) => Some(*x),
        Some(RawShare::Text(t)) => parse_share(t).unwrap_or_else(|| {
            p.add(
                "defaults.max_bias",
                format!("{t:?} is not a share; use e.g. 0.1, '10%' or off"),
            );
            None
        }),
    };
    if let Some(share) = max_bias {
        if !(share.is_finite() && share > 0.0 && share <= 1.0) {
            p.add(
                "defaults.max_bias",
                "must be a share above 0 and at most 1 (100%), or off",
            );
        }
    }
    let dataset_budget = raw
        .budget
        .as_ref()
        .map(|b| validate_budget(&mut p, "budget", b));
    let release_schedule = raw.release_schedule.as_ref().and_then(|r| {
        ReleaseSchedule::new(r.floor_ms, r.ratio)
            .map_err(|e| p.add("release_schedule", e))
            .ok()
    });

    let login_throttle = match &raw.login_throttle {
        None => LoginThrottle::default(),
        Some(t) => validate_login_throttle(&mut p, t),
    };

    let analysts = validate_analysts(&mut p, &raw.analysts, env);
    let tables = tables::validate_tables(&mut p, &raw.tables);
    let synopses = synopses::validate_synopses(&mut p, &raw.synopses, &tables, &analysts);

    let statement_timeout_s = raw
        .statement_timeout_s
        .unwrap_or(limits::STATEMENT_TIMEOUT_MS / 1000);
    if !(1..=limits::STATEMENT_TIMEOUT_MAX_S).contains(&statement_timeout_s) {
        p.add(
            "statement_timeout_s",
            format!(
                "must be between 1 and {} seconds, not {statement_timeout_s}",
                limits::STATEMENT_TIMEOUT_MAX_S
            ),
        );
    }

    if p.0.is_empty() {
        Ok(Policy {
            database: raw.database,
            secret,
            defaults: Defaults {
                epsilon,
                delta,
                mechanism,
                choose_bounds: raw.defaults.choose_bounds.unwrap_or(false),
                max_bias,
            },
            dataset_budget,
            replay_lifetime: Duration::from_secs(
                raw.replay_lifetime_s
                    .unwrap_or(limits::REPLAY_LIFETIME_DEFAULT_S),
            ),
            statement_timeout: Duration::from_secs(statement_timeout_s),
            release_schedule,
            login_throttle,
            analysts,
            tables,
            synopses,
        })
    } else {
        Err(PolicyErrors(p.0))
    }
}

/// The analysts, each with one credential and a budget.
fn validate_analysts(
    p: &mut Problems,
    raw: &BTreeMap<String, RawAnalyst>,
    env: &dyn Fn(&str) -> Option<String>,
) -> BTreeMap<String, Analyst> {
    let mut analysts = BTreeMap::new();
    if raw.is_empty() {
        p.add("analysts", "at least one analyst is required");
    }
    for (name, a) in raw {
        let path = format!("analysts.{name}");
        if name.is_empty() || name.len() > 63 {
            p.add(&path, "analyst names must have 1 to 63 characters");
        }
        let credential = match (&a.scram_verifier, &a.password_env) {
            (Some(v), None) => match parse_scram_verifier(v) {
                Ok(c) => Some(c),
                Err(e) => {
                    p.add(&format!("{path}.scram_verifier"), e);
                    None
                }
            },
            (None, Some(var)) => match env(var) {
                Some(pw) if !pw.is_empty() => Some(Credential::Password(pw)),
                _ => {
                    p.add(
                        &format!("{path}.password_env"),
                        format!("environment variable {var} is not set or empty"),
                    );
                    None
                }
            },
            _ => {
                p.add(
                    &path,
                    "exactly one of scram_verifier and password_env is required",
                );
                None
            }
        };
        let budget = validate_budget(p, &format!("{path}.budget"), &a.budget);
        // An analyst's budget above the dataset's is allowed: the dataset's binds first.
        if let Some(credential) = credential {
            analysts.insert(
                name.clone(),
                Analyst {
                    name: name.clone(),
                    credential,
                    budget,
                },
            );
        }
    }
    analysts
}

/// The secret the policy names, from the environment (at least 16 characters).
fn validate_secret(
    p: &mut Problems,
    secret_env: Option<&str>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Option<String> {
    match secret_env {
        Some(var) => match env(var) {
            Some(s) if s.len() >= 16 => Some(s),
            Some(_) => {
                p.add(
                    "secret_env",
                    format!("the secret in ${var} must be at least 16 characters"),
                );
                None
            }
            None => {
                p.add(
                    "secret_env",
                    format!("environment variable {var} is not set"),
                );
                None
            }
        },
        None => None,
    }
}
