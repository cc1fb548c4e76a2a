//! Session parameters pgdp answers itself: a whitelist of harmless client settings and the
//! `pgdp.*` privacy settings.
//!
//! Invariants:
//! - No SET ever reaches the upstream. Values live only in pgdp's session state; the upstream's
//!   behaviour (planner, timeouts, roles, search path) is fixed by pgdp.
//! - A parameter outside the whitelist is refused: unknown names with 42704 like PostgreSQL,
//!   known but dangerous ones (planner, timeouts, roles) with 42501.
//! - `pgdp.epsilon` and `pgdp.delta` are validated against the policy and [`crate::limits`] when
//!   set, so a query never starts with an invalid privacy parameter.

use crate::error::{Error, Result};
use crate::limits;
use crate::policy::{Analyst, Mechanism, Policy};

/// Parameters whose changes are reported to the client with ParameterStatus.
pub const REPORTED: &[&str] = &[
    "application_name",
    "client_encoding",
    "DateStyle",
    "IntervalStyle",
    "TimeZone",
    "standard_conforming_strings",
    "integer_datetimes",
    "is_superuser",
    "server_encoding",
    "server_version",
    "session_authorization",
];

/// One session's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// `application_name`.
    pub application_name: String,
    /// `DateStyle` (always ISO first).
    pub date_style: String,
    /// `TimeZone`.
    pub time_zone: String,
    /// `IntervalStyle`.
    pub interval_style: String,
    /// `extra_float_digits`.
    pub extra_float_digits: i32,
    /// `search_path`.
    pub search_path: String,
    /// `client_min_messages`.
    pub client_min_messages: String,
    /// `bytea_output`.
    pub bytea_output: String,
    /// `transaction_isolation` as reported by SHOW.
    pub transaction_isolation: String,
    /// ε spent by the next DP query.
    pub epsilon: f64,
    /// δ spent by the next DP query that needs δ.
    pub delta: f64,
    /// The noise mechanism of the next DP query.
    pub mechanism: Mechanism,
    /// Whether each noisy column is followed by its 95% error bound.
    pub accuracy: bool,
    /// `pgdp.clamp_means`: whether released means are clamped into their bounds
    /// ([`crate::dp::release::Mechanisms::clamp_means`]).
    pub clamp_means: bool,
    /// `pgdp.choose_bounds`: whether the next DP query chooses its cap on rows per unit from a
    /// DP histogram of its data, within the policy's cap ([`crate::dp::release::bounds`]).
    pub choose_bounds: bool,
    /// `pgdp.synopsis`: whether counts a policy synopsis can answer are answered from it (on by
    /// default where the policy declares one); off sends them by the per-query path.
    pub synopsis: bool,
    /// `pgdp.max_error`: when set, the next DP query spends the smallest ε at which every
    /// measure's 95 % error bound is at most this (`release::budget_for_error`), instead of
    /// `epsilon`.
    pub max_error: Option<f64>,
    /// `pgdp.max_relative_error`: when set, a DP answer with a cell whose stated error exceeds
    /// this share of its value is refused after its release
    /// ([`crate::dp::release::Mechanisms::max_relative_error`]).
    pub max_relative_error: Option<f64>,
    /// `pgdp.max_bias`: when set, a DP answer whose caps, chosen for the query, are estimated
    /// to remove more than this share of the rows a COUNT or SUM reads is refused after its
    /// release ([`crate::dp::release::Mechanisms::max_bias`]); the policy's
    /// `defaults.max_bias` unless SET.
    pub max_bias: Option<f64>,
}

/// The outcome of a SET: the canonical name and value to report with ParameterStatus, if the
/// parameter is one clients track.
#[derive(Debug, Clone, PartialEq)]
pub struct Changed {
    /// Name as PostgreSQL spells it in ParameterStatus (e.g. `TimeZone`).
    pub name: String,
    /// The new value.
    pub value: String,
    /// Whether clients expect a ParameterStatus message for it.
    pub reported: bool,
}

impl Settings {
    /// Defaults for a new session of `analyst` under `policy`.
    pub fn new(policy: &Policy, analyst: &Analyst, time_zone: &str) -> Settings {
        let cap = analyst
            .budget
            .epsilon_per_query_max
            .unwrap_or(f64::INFINITY);
        Settings {
            application_name: String::new(),
            date_style: "ISO, MDY".into(),
            time_zone: time_zone.to_string(),
            interval_style: "postgres".into(),
            extra_float_digits: 1,
            search_path: "\"$user\", public".into(),
            client_min_messages: "notice".into(),
            bytea_output: "hex".into(),
            transaction_isolation: "read committed".into(),
            epsilon: policy.defaults.epsilon.min(cap),
            delta: policy.defaults.delta.min(analyst.budget.delta),
            mechanism: policy.defaults.mechanism,
            accuracy: false,
            clamp_means: true,
            choose_bounds: policy.defaults.choose_bounds,
            synopsis: true,
            max_error: None,
            max_relative_error: None,
            max_bias: policy.defaults.max_bias,
        }
    }

    /// After a policy reload: each of the per-query settings the policy gives a default for
    /// (ε, δ, mechanism) takes the new default `fresh` where it still holds the old default
    /// `old`, that is where the session did not SET it.
    pub fn follow_defaults(&mut self, old: &Settings, fresh: &Settings) {
        if self.epsilon == old.epsilon {
            self.epsilon = fresh.epsilon;
        }
        if self.delta == old.delta {
            self.delta = fresh.delta;
        }
        if self.mechanism == old.mechanism {
            self.mechanism = fresh.mechanism;
        }
        if self.choose_bounds == old.choose_bounds {
            self.choose_bounds = fresh.choose_bounds;
        }
        if self.max_bias == old.max_bias {
            self.max_bias = fresh.max_bias;
        }
    }

    /// Applies `SET name = value`. `defaults` gives the value for `DEFAULT` / `RESET`.
    pub fn set(
        &mut self,
        name: &str,
        value: &str,
        policy: &Policy,
        analyst: &Analyst,
        defaults: &Settings,
    ) -> Result<Changed> {
        let name = name.to_ascii_lowercase();
        let is_default = value.eq_ignore_ascii_case("default") || value.is_empty();
        match name.as_str() {
            "application_name" | "client_encoding" | "names" | "datestyle" | "timezone"
            | "time zone" | "intervalstyle" | "extra_float_digits" => {
                self.set_format(&name, value, is_default, defaults)
            }
            "pgdp.max_error" | "pgdp.max_relative_error" | "pgdp.max_bias" => {
                self.set_error_target(&name, value, is_default, defaults)
            }
            n if n.starts_with("pgdp.") => {
                self.set_release(&name, value, is_default, analyst, defaults)
            }
            _ => self.set_session(&name, value, is_default, policy, defaults),
        }
    }

    /// The settings of how values are written: name, encoding, dates, time zone, intervals, floats.
    fn set_format(
        &mut self,
        name: &str,
        value: &str,
        is_default: bool,
        defaults: &Settings,
    ) -> Result<Changed> {
        match name {
            "application_name" => {
                self.application_name = if is_default {
                    defaults.application_name.clone()
                } else {
                    value.chars().take(63).collect()
                };
                Ok(changed(
                    "application_name",
                    self.application_name.clone(),
                    true,
                ))
            }
            "client_encoding" | "names" => {
                let v = value.to_ascii_uppercase().replace(['-', '_'], "");
                if is_default || v == "UTF8" || v == "UNICODE" {
                    Ok(changed("client_encoding", "UTF8".into(), true))
                } else {
                    Err(invalid(
                        name,
                        "pgdp speaks only UTF8",
                        "Use SET client_encoding = 'UTF8'.",
                    ))
                }
            }
            "datestyle" => {
                if is_default {
                    self.date_style = defaults.date_style.clone();
                } else {
                    let parts: Vec<String> = value
                        .split(',')
                        .map(|p| p.trim().to_ascii_uppercase())
                        .collect();
                    let order = parts
                        .iter()
                        .find(|p| matches!(p.as_str(), "MDY" | "DMY" | "YMD"))
                        .cloned()
                        .unwrap_or_else(|| "MDY".into());
                    if parts
                        .iter()
                        .any(|p| !matches!(p.as_str(), "ISO" | "MDY" | "DMY" | "YMD"))
                    {
                        return Err(invalid(
                            "DateStyle",
                            "pgdp answers dates in ISO style only",
                            "Use SET DateStyle = 'ISO, MDY'.",
                        ));
                    }
                    self.date_style = format!("ISO, {order}");
                }
                Ok(changed("DateStyle", self.date_style.clone(), true))
            }
            "timezone" | "time zone" => {
                self.time_zone = if is_default {
                    defaults.time_zone.clone()
                } else if value.len() <= 64
                    && value
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || "/_+-:<>".contains(c))
                {
                    value.to_string()
                } else {
                    return Err(invalid(
                        "TimeZone",
                        "not a time zone name",
                        "Use e.g. SET TimeZone = 'UTC'.",
                    ));
                };
                Ok(changed("TimeZone", self.time_zone.clone(), true))
            }
            "intervalstyle" => {
                let v = value.to_ascii_lowercase();
                if is_default
                    || matches!(
                        v.as_str(),
                        "postgres" | "postgres_verbose" | "sql_standard" | "iso_8601"
                    )
                {
                    self.interval_style = if is_default {
                        defaults.interval_style.clone()
                    } else {
                        v
                    };
                    Ok(changed("IntervalStyle", self.interval_style.clone(), true))
                } else {
                    Err(invalid("IntervalStyle", "unknown interval style", ""))
                }
            }
            "extra_float_digits" => {
                self.extra_float_digits = if is_default {
                    defaults.extra_float_digits
                } else {
                    value
                        .trim()
                        .parse::<i32>()
                        .ok()
                        .filter(|v| (-15..=3).contains(v))
                        .ok_or_else(|| invalid(name, "must be an integer from -15 to 3", ""))?
                };
                Ok(changed(
                    "extra_float_digits",
                    self.extra_float_digits.to_string(),
                    false,
                ))
            }
            _ => Err(Error::UnknownParameter {
                name: name.to_string(),
            }),
        }
    }

    /// The session's other client settings; the upstream's planner, timeouts and roles are refused.
    fn set_session(
        &mut self,
        name: &str,
        value: &str,
        is_default: bool,
        policy: &Policy,
        defaults: &Settings,
    ) -> Result<Changed> {
        match name {
            "search_path" => {
                if is_default {
                    self.search_path = defaults.search_path.clone();
                } else {
                    let allowed = policy.schemas();
                    for schema in value.split(',').map(|s| s.trim().trim_matches('"')) {
                        let ok = schema.is_empty()
                            || schema == "$user"
                            || schema == "public"
                            || schema == "pg_catalog"
                            || allowed.iter().any(|a| a == &schema.to_ascii_lowercase());
                        if !ok {
                            return Err(Error::forbidden(
                                format!("search_path may not include schema \"{schema}\""),
                                format!("Allowed schemas: {}.", allowed.join(", ")),
                            ));
                        }
                    }
                    self.search_path = value.to_string();
                }
                Ok(changed("search_path", self.search_path.clone(), false))
            }
            "client_min_messages" => {
                let v = value.to_ascii_lowercase();
                let known = [
                    "debug5", "debug4", "debug3", "debug2", "debug1", "debug", "log", "notice",
                    "warning", "error",
                ];
                if is_default || known.contains(&v.as_str()) {
                    self.client_min_messages = if is_default {
                        defaults.client_min_messages.clone()
                    } else {
                        v
                    };
                    Ok(changed(
                        "client_min_messages",
                        self.client_min_messages.clone(),
                        false,
                    ))
                } else {
                    Err(invalid(name, "unknown message level", ""))
                }
            }
            "bytea_output" => {
                let v = value.to_ascii_lowercase();
                if is_default || v == "hex" || v == "escape" {
                    self.bytea_output = if is_default {
                        defaults.bytea_output.clone()
                    } else {
                        v
                    };
                    Ok(changed("bytea_output", self.bytea_output.clone(), false))
                } else {
                    Err(invalid(name, "must be hex or escape", ""))
                }
            }
            "standard_conforming_strings" => {
                if is_default || matches!(value.to_ascii_lowercase().as_str(), "on" | "true" | "1")
                {
                    Ok(changed("standard_conforming_strings", "on".into(), true))
                } else {
                    Err(invalid(
                        name,
                        "pgdp requires standard_conforming_strings = on",
                        "",
                    ))
                }
            }
            // Transaction characteristics have no effect: every upstream statement runs in its
            // own read-only transaction chosen by pgdp. Accepted so that drivers can set them.
            "transaction"
            | "transaction_isolation"
            | "default_transaction_isolation"
            | "default_transaction_read_only"
            | "transaction_read_only"
            | "session characteristics" => Ok(changed(name, value.to_string(), false)),
            "statement_timeout"
            | "lock_timeout"
            | "idle_in_transaction_session_timeout"
            | "work_mem"
            | "role"
            | "session_authorization"
            | "default_transaction_deferrable"
            | "jit"
            | "geqo"
            | "random_page_cost"
            | "seq_page_cost"
            | "cpu_tuple_cost" => Err(forbidden_setting(name)),
            n if n.starts_with("enable_")
                || n.starts_with("pg_")
                || n.starts_with("plan")
                || n.starts_with("geqo") =>
            {
                Err(forbidden_setting(name))
            }
            _ => Err(Error::UnknownParameter {
                name: name.to_string(),
            }),
        }
    }

    /// The per-query privacy settings (`pgdp.*`) other than the error targets.
    fn set_release(
        &mut self,
        name: &str,
        value: &str,
        is_default: bool,
        analyst: &Analyst,
        defaults: &Settings,
    ) -> Result<Changed> {
        match name {
            "pgdp.epsilon" => {
                let eps = if is_default {
                    defaults.epsilon
                } else {
                    parse_positive(name, value)?
                };
                check_epsilon(eps, analyst)?;
                self.epsilon = eps;
                Ok(changed("pgdp.epsilon", eps.to_string(), false))
            }
            "pgdp.delta" => {
                let delta = if is_default {
                    defaults.delta
                } else {
                    value.trim().parse::<f64>().map_err(|_| {
                        invalid(name, "not a number", "Use e.g. SET pgdp.delta = 1e-7.")
                    })?
                };
                if !delta.is_finite() || !(0.0..1.0).contains(&delta) {
                    return Err(invalid(
                        name,
                        "must be in [0, 1)",
                        "Use e.g. SET pgdp.delta = 1e-7.",
                    ));
                }
                if delta > analyst.budget.delta {
                    return Err(invalid(
                        name,
                        &format!("exceeds your total delta of {}", analyst.budget.delta),
                        "Choose a smaller delta.",
                    ));
                }
                self.delta = delta;
                Ok(changed("pgdp.delta", delta.to_string(), false))
            }
            "pgdp.mechanism" => {
                self.mechanism = if is_default {
                    defaults.mechanism
                } else {
                    Mechanism::parse(value).ok_or_else(|| {
                        invalid(
                            name,
                            "must be laplace, gaussian or auto",
                            "Use SET pgdp.mechanism = 'laplace'.",
                        )
                    })?
                };
                Ok(changed(
                    "pgdp.mechanism",
                    self.mechanism.name().into(),
                    false,
                ))
            }
            "pgdp.accuracy" => {
                self.accuracy = switch(name, value, is_default.then_some(defaults.accuracy), "")?;
                Ok(changed(name, on_off(self.accuracy).into(), false))
            }
            "pgdp.clamp_means" => {
                self.clamp_means = switch(
                    name,
                    value,
                    is_default.then_some(defaults.clamp_means),
                    "on (the default) keeps each AVG within its column's bounds; off releases the ratio of its noisy sum and count, unbiased but possibly outside the bounds for a small group.",
                )?;
                Ok(changed(name, on_off(self.clamp_means).into(), false))
            }
            "pgdp.choose_bounds" => {
                self.choose_bounds = switch(
                    name,
                    value,
                    is_default.then_some(defaults.choose_bounds),
                    "on chooses each query's cap on rows per unit from a DP histogram of its data (10% of its epsilon), within the policy's cap; off uses the policy's caps.",
                )?;
                Ok(changed(name, on_off(self.choose_bounds).into(), false))
            }
            "pgdp.synopsis" => {
                self.synopsis = switch(
                    name,
                    value,
                    is_default.then_some(defaults.synopsis),
                    "on (the default) answers the counts a policy synopsis covers from it, paid once; off answers them by the per-query path, each charged.",
                )?;
                Ok(changed(name, on_off(self.synopsis).into(), false))
            }
            _ => Err(Error::UnknownParameter {
                name: name.to_string(),
            }),
        }
    }

    /// The error targets (`pgdp.max_error`, `pgdp.max_relative_error`) accuracy-first queries meet.
    fn set_error_target(
        &mut self,
        name: &str,
        value: &str,
        is_default: bool,
        defaults: &Settings,
    ) -> Result<Changed> {
        match name {
            "pgdp.max_error" => {
                let hint = "Use e.g. SET pgdp.max_error = 50 (a 95 % bound, in the units of each COUNT or SUM), or SET pgdp.max_error = off.";
                self.max_error = if is_default || value.trim().eq_ignore_ascii_case("off") {
                    defaults.max_error
                } else if value.trim().ends_with('%') {
                    // A bound relative to the answer would make the ε chosen depend on the
                    // private answer itself (docs/privacy.md §8, "Accuracy first").
                    return Err(invalid(
                        name,
                        "a relative bound is not supported: it is relative to the private answer, so the cost chosen from it would reveal that answer",
                        "Give an absolute 95 % bound in the units of each COUNT or SUM, e.g. SET pgdp.max_error = 50; EXPLAIN shows each measure's bound at the current pgdp.epsilon.",
                    ));
                } else {
                    let bound = value
                        .trim()
                        .parse::<f64>()
                        .map_err(|_| invalid(name, "not a number", hint))?;
                    if !(bound.is_finite() && bound > 0.0 && bound <= limits::COLUMN_BOUND_ABS_MAX)
                    {
                        return Err(invalid(
                            name,
                            &format!(
                                "must be a positive number of at most {}",
                                limits::COLUMN_BOUND_ABS_MAX
                            ),
                            hint,
                        ));
                    }
                    Some(bound)
                };
                Ok(changed(
                    "pgdp.max_error",
                    max_error_text(self.max_error),
                    false,
                ))
            }
            "pgdp.max_relative_error" => {
                let hint = "Use a share of the answer, e.g. SET pgdp.max_relative_error = 0.05 (or 5%), or off.";
                self.max_relative_error = if is_default || value.trim().eq_ignore_ascii_case("off")
                {
                    defaults.max_relative_error
                } else {
                    let text = value.trim();
                    let (number, scale) = match text.strip_suffix('%') {
                        Some(p) => (p.trim(), 0.01),
                        None => (text, 1.0),
                    };
                    let share = number
                        .parse::<f64>()
                        .map_err(|_| invalid(name, "not a number", hint))?
                        * scale;
                    if !(share.is_finite() && share > 0.0 && share <= 10.0) {
                        return Err(invalid(
                            name,
                            "must be a share above 0 and at most 10 (1000%)",
                            hint,
                        ));
                    }
                    Some(share)
                };
                Ok(changed(
                    "pgdp.max_relative_error",
                    max_error_text(self.max_relative_error),
                    false,
                ))
            }
            "pgdp.max_bias" => {
                let hint = "Use a share of the answer, e.g. SET pgdp.max_bias = 0.1 (or 10%), or off to return answers however far the chosen caps leave them low (the NOTICE states the estimate).";
                self.max_bias = if is_default {
                    defaults.max_bias
                } else {
                    let share = crate::policy::parse_share(value)
                        .ok_or_else(|| invalid(name, "not a share", hint))?;
                    if share.is_some_and(|x| !(x.is_finite() && x > 0.0 && x <= 1.0)) {
                        return Err(invalid(
                            name,
                            "must be a share above 0 and at most 1 (100%), or off",
                            hint,
                        ));
                    }
                    share
                };
                Ok(changed(
                    "pgdp.max_bias",
                    max_error_text(self.max_bias),
                    false,
                ))
            }
            _ => Err(Error::UnknownParameter {
                name: name.to_string(),
            }),
        }
    }

    /// The value `SHOW name` returns, with the column name PostgreSQL uses.
    pub fn show(&self, name: &str, server_version: &str) -> Result<(String, String)> {
        let name = name.to_ascii_lowercase();
        let v = match name.as_str() {
            "application_name" => self.application_name.clone(),
            "client_encoding" | "server_encoding" => "UTF8".into(),
            "datestyle" => self.date_style.clone(),
            "timezone" | "time zone" => self.time_zone.clone(),
            "intervalstyle" => self.interval_style.clone(),
            "extra_float_digits" => self.extra_float_digits.to_string(),
            "search_path" => self.search_path.clone(),
            "client_min_messages" => self.client_min_messages.clone(),
            "bytea_output" => self.bytea_output.clone(),
            "standard_conforming_strings" | "integer_datetimes" => "on".into(),
            "is_superuser" => "off".into(),
            "transaction isolation level"
            | "transaction_isolation"
            | "default_transaction_isolation" => self.transaction_isolation.clone(),
            "transaction_read_only" | "default_transaction_read_only" => "on".into(),
            "server_version" => server_version.to_string(),
            "server_version_num" => server_version_num(server_version),
            "max_identifier_length" => "63".into(),
            "lc_collate" | "lc_ctype" | "lc_messages" | "lc_monetary" | "lc_numeric"
            | "lc_time" => "C.UTF-8".into(),
            // Harmless server parameters that client libraries read (SQLAlchemy 2's reflection
            // reads default_table_access_method): fixed answers, PostgreSQL 15's defaults, never
            // the upstream's configuration.
            "default_table_access_method" => "heap".into(),
            "default_tablespace" => String::new(),
            "block_size" => "8192".into(),
            "max_index_keys" => "32".into(),
            "max_function_args" => "100".into(),
            "array_nulls" | "escape_string_warning" => "on".into(),
            "backslash_quote" => "safe_encoding".into(),
            "pgdp.epsilon" => self.epsilon.to_string(),
            "pgdp.delta" => self.delta.to_string(),
            "pgdp.mechanism" => self.mechanism.name().into(),
            "pgdp.accuracy" => on_off(self.accuracy).into(),
            "pgdp.clamp_means" => on_off(self.clamp_means).into(),
            "pgdp.choose_bounds" => on_off(self.choose_bounds).into(),
            "pgdp.synopsis" => on_off(self.synopsis).into(),
            "pgdp.max_error" => max_error_text(self.max_error),
            "pgdp.max_relative_error" => max_error_text(self.max_relative_error),
            "pgdp.max_bias" => max_error_text(self.max_bias),
            "all" => {
                return Err(Error::unsupported(
                    "SHOW ALL",
                    "SHOW one parameter at a time, e.g. SHOW pgdp.epsilon.",
                ))
            }
            _ => return Err(Error::UnknownParameter { name }),
        };
        let column = match name.as_str() {
            "transaction isolation level" => "transaction_isolation".to_string(),
            "datestyle" => "DateStyle".into(),
            "timezone" | "time zone" => "TimeZone".into(),
            "intervalstyle" => "IntervalStyle".into(),
            _ => name,
        };
        Ok((column, v))
    }
}

/// `"15.4"` → `"150004"`, `"16.1 (Debian …)"` → `"160001"`.
pub fn server_version_num(version: &str) -> String {
    let mut parts = version
        .split(|c: char| !c.is_ascii_digit())
        .filter(|p| !p.is_empty())
        .map(|p| p.parse::<u32>().unwrap_or(0));
    let major = parts.next().unwrap_or(0);
    let minor = parts.next().unwrap_or(0);
    (major * 10_000 + minor).to_string()
}

/// `pgdp.max_error` as SET reports and SHOW answers it: the bound, or `off`.
fn max_error_text(max_error: Option<f64>) -> String {
    max_error.map_or_else(|| "off".into(), |b| b.to_string())
}

fn on_off(b: bool) -> &'static str {
    if b {
        "on"
    } else {
        "off"
    }
}

/// An on/off setting's new value: `default` for DEFAULT / RESET, else `value` read as a
/// boolean; refused naming `name`, with `hint`, when it is none.
fn switch(name: &str, value: &str, default: Option<bool>, hint: &str) -> Result<bool> {
    match default {
        Some(default) => Ok(default),
        None => parse_bool(value).ok_or_else(|| invalid(name, "must be on or off", hint)),
    }
}

fn parse_bool(value: &str) -> Option<bool> {
    match value.trim().to_ascii_lowercase().as_str() {
        "on" | "true" | "yes" | "1" | "t" => Some(true),
        "off" | "false" | "no" | "0" | "f" => Some(false),
        _ => None,
    }
}

fn parse_positive(name: &str, value: &str) -> Result<f64> {
    value
        .trim()
        .parse::<f64>()
        .map_err(|_| invalid(name, "not a number", "Use e.g. SET pgdp.epsilon = 0.5."))
}

/// The largest ε one query of `analyst` may spend: the policy's per-query cap, the global
/// limit and the analyst's total, whichever is smallest.
pub fn epsilon_cap(analyst: &Analyst) -> f64 {
    analyst
        .budget
        .epsilon_per_query_max
        .unwrap_or(f64::INFINITY)
        .min(limits::EPSILON_PER_QUERY_MAX)
        .min(analyst.budget.epsilon)
}

/// Checks an ε for one query against the global limits and the analyst's cap.
pub fn check_epsilon(eps: f64, analyst: &Analyst) -> Result<()> {
    let hint = "Use e.g. SET pgdp.epsilon = 0.5.";
    if !eps.is_finite() || eps <= 0.0 {
        return Err(invalid(
            "pgdp.epsilon",
            "must be a positive finite number",
            hint,
        ));
    }
    if eps < limits::EPSILON_PER_QUERY_MIN {
        return Err(invalid(
            "pgdp.epsilon",
            &format!("must be at least {}", limits::EPSILON_PER_QUERY_MIN),
            hint,
        ));
    }
    let cap = epsilon_cap(analyst);
    if eps > cap {
        return Err(invalid(
            "pgdp.epsilon",
            &format!("exceeds the per-query cap of {cap}"),
            &format!("Choose an epsilon of at most {cap}."),
        ));
    }
    Ok(())
}

/// The setting's new value as PostgreSQL names it, reported in ParameterStatus or not.
fn changed(name: &str, value: String, reported: bool) -> Changed {
    Changed {
        name: name.into(),
        value,
        reported,
    }
}

fn invalid(name: &str, reason: &str, hint: &str) -> Error {
    Error::InvalidParameter {
        name: name.into(),
        reason: reason.into(),
        hint: hint.into(),
    }
}

fn forbidden_setting(name: &str) -> Error {
    Error::forbidden(
        format!("setting \"{name}\" is not allowed through pgdp"),
        "pgdp fixes the upstream's planner, timeouts and roles; only client-side and pgdp.* settings can be changed.",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture() -> (Policy, Analyst) {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("policies/demo.yaml");
        let policy = crate::policy::load(&path).expect("demo policy");
        let analyst = policy.analysts.get("analyst").expect("analyst").clone();
        (policy, analyst)
    }

    fn set(s: &mut Settings, name: &str, value: &str) -> Result<Changed> {
        let (p, a) = fixture();
        let d = Settings::new(&p, &a, "UTC");
        s.set(name, value, &p, &a, &d)
    }

    #[test]
    fn whitelisted_settings_change_locally() {
        let (p, a) = fixture();
        let mut s = Settings::new(&p, &a, "UTC");
        assert_eq!(
            set(&mut s, "extra_float_digits", "3").map(|c| c.value),
            Ok("3".into())
        );
        let tz = set(&mut s, "timezone", "Europe/Paris").expect("tz");
        assert!(tz.reported);
        assert_eq!(tz.name, "TimeZone");
        assert_eq!(
            s.show("TimeZone", "15.4").map(|r| r.1),
            Ok("Europe/Paris".into())
        );
        assert_eq!(
            set(&mut s, "DateStyle", "ISO, DMY").map(|c| c.value),
            Ok("ISO, DMY".into())
        );
    }

    #[test]
    fn epsilon_is_checked_against_policy() {
        let (p, a) = fixture();
        let mut s = Settings::new(&p, &a, "UTC");
        assert!(set(&mut s, "pgdp.epsilon", "0.5").is_ok());
        assert_eq!(s.epsilon, 0.5);
        for bad in ["0", "-1", "NaN", "inf", "1e-9", "2.5", "abc"] {
            let e = set(&mut s, "pgdp.epsilon", bad).expect_err(bad);
            assert_eq!(e.sqlstate().code(), "22023", "{bad}");
        }
        assert_eq!(s.epsilon, 0.5, "a refused SET changes nothing");
        assert!(set(&mut s, "pgdp.delta", "1e-3").is_err());
        assert!(set(&mut s, "pgdp.mechanism", "gaussian").is_ok());
    }

    #[test]
    fn max_error_is_a_positive_bound_or_off() {
        let (p, a) = fixture();
        let mut s = Settings::new(&p, &a, "UTC");
        assert_eq!(
            s.show("pgdp.max_error", "15.4").map(|r| r.1),
            Ok("off".into())
        );
        assert_eq!(
            set(&mut s, "pgdp.max_error", "50").map(|c| c.value),
            Ok("50".into())
        );
        assert_eq!(s.max_error, Some(50.0));
        for bad in ["0", "-5", "NaN", "inf", "1e16", "ten", "5%"] {
            let e = set(&mut s, "pgdp.max_error", bad).expect_err(bad);
            assert_eq!(e.sqlstate().code(), "22023", "{bad}");
            assert!(e.to_string().contains("pgdp.max_error"), "{bad}: {e}");
        }
        assert_eq!(s.max_error, Some(50.0), "a refused SET changes nothing");
        let relative = set(&mut s, "pgdp.max_error", " 5 % ").expect_err("relative");
        assert!(
            relative.to_string().contains("relative bound"),
            "{relative}"
        );
        assert_eq!(
            set(&mut s, "pgdp.max_error", "off").map(|c| c.value),
            Ok("off".into())
        );
        assert_eq!(s.max_error, None);
        assert!(set(&mut s, "pgdp.max_error", "12.5").is_ok());
        assert!(set(&mut s, "pgdp.max_error", "DEFAULT").is_ok());
        assert_eq!(s.max_error, None);
        let e = set(&mut s, "pgdp.mechanism", "exponential").expect_err("unknown mechanism");
        assert_eq!(e.sqlstate().code(), "22023");
    }

    #[test]
    fn max_bias_is_a_share_or_off() {
        let (p, a) = fixture();
        let mut s = Settings::new(&p, &a, "UTC");
        assert_eq!(
            s.max_bias,
            Some(crate::limits::MAX_BIAS_DEFAULT),
            "on unless the policy sets it off"
        );
        assert_eq!(
            set(&mut s, "pgdp.max_bias", "0.25").map(|c| c.value),
            Ok("0.25".to_string())
        );
        assert!(set(&mut s, "pgdp.max_bias", "5%").is_ok());
        assert_eq!(s.max_bias, Some(0.05));
        assert!(set(&mut s, "pgdp.max_bias", "off").is_ok());
        assert_eq!(s.max_bias, None);
        for bad in ["0", "-0.1", "1.5", "NaN", "lots"] {
            let e = set(&mut s, "pgdp.max_bias", bad).expect_err(bad);
            assert_eq!(e.sqlstate().code(), "22023", "{bad}");
        }
        assert!(set(&mut s, "pgdp.max_bias", "0.25").is_ok());
        assert!(set(&mut s, "pgdp.max_bias", "DEFAULT").is_ok());
        assert_eq!(s.max_bias, Some(crate::limits::MAX_BIAS_DEFAULT));
    }

    #[test]
    fn max_relative_error_is_a_share_or_off() {
        let (p, a) = fixture();
        let mut s = Settings::new(&p, &a, "UTC");
        assert_eq!(s.max_relative_error, None);
        assert_eq!(
            set(&mut s, "pgdp.max_relative_error", "0.05").map(|c| c.value),
            Ok("0.05".to_string())
        );
        assert_eq!(
            set(&mut s, "pgdp.max_relative_error", "10%").map(|c| c.value),
            Ok("0.1".to_string())
        );
        for bad in ["0", "-1", "lots", "11"] {
            let e = set(&mut s, "pgdp.max_relative_error", bad).expect_err(bad);
            assert_eq!(e.sqlstate().code(), "22023", "{bad}");
        }
        assert_eq!(
            s.max_relative_error,
            Some(0.1),
            "a refused SET changes nothing"
        );
        assert!(set(&mut s, "pgdp.max_relative_error", "off").is_ok());
        assert_eq!(s.max_relative_error, None);
    }

    #[test]
    fn clamp_means_is_on_or_off() {
        let (p, a) = fixture();
        let mut s = Settings::new(&p, &a, "UTC");
        assert!(s.clamp_means);
        assert_eq!(
            set(&mut s, "pgdp.clamp_means", "off").map(|c| c.value),
            Ok("off".into())
        );
        assert_eq!(
            s.show("pgdp.clamp_means", "15.4").map(|r| r.1),
            Ok("off".into())
        );
        let e = set(&mut s, "pgdp.clamp_means", "sometimes").expect_err("bad value");
        assert_eq!(e.sqlstate().code(), "22023");
        assert!(!s.clamp_means, "a refused SET changes nothing");
        assert!(set(&mut s, "pgdp.clamp_means", "DEFAULT").is_ok());
        assert!(s.clamp_means);
    }

    #[test]
    fn dangerous_and_unknown_settings_are_refused() {
        let (p, a) = fixture();
        let mut s = Settings::new(&p, &a, "UTC");
        assert_eq!(
            set(&mut s, "statement_timeout", "0").map_err(|e| e.sqlstate().code().to_string()),
            Err("42501".into())
        );
        assert_eq!(
            set(&mut s, "enable_seqscan", "off").map_err(|e| e.sqlstate().code().to_string()),
            Err("42501".into())
        );
        assert_eq!(
            set(&mut s, "search_path", "secret").map_err(|e| e.sqlstate().code().to_string()),
            Err("42501".into())
        );
        assert!(set(&mut s, "search_path", "demo, public").is_ok());
        assert_eq!(
            set(&mut s, "no_such_thing", "1").map_err(|e| e.sqlstate().code().to_string()),
            Err("42704".into())
        );
    }

    #[test]
    fn version_num() {
        assert_eq!(server_version_num("15.4"), "150004");
        assert_eq!(server_version_num("16.1 (Debian 16.1-1)"), "160001");
    }
}
