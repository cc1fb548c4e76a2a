//! The policy: which analysts may connect, with what budget, and which tables and columns they
//! may query under differential privacy.
//!
//! Reading happens in two steps (ripgrep's LowArgs → HiArgs): YAML is deserialised into raw
//! serde structs that reject unknown keys, then [`validate`] turns them into the domain types
//! below, collecting every problem with the path of the key that causes it
//! (`tables.demo.visits.columns.cost: lower (10) must be below upper (5)`).
//!
//! Invariants of a validated [`Policy`]:
//! - every private table has `max_groups_per_unit ≥ 1` and `max_rows_per_unit ≥ 1`, within
//!   [`crate::limits`]; a private table without a privacy unit column is row-level and has both
//!   caps equal to 1;
//! - the privacy unit column of a private table is one of its declared columns;
//! - a private table has a privacy unit column, or a unit path (a chain of foreign keys to a
//!   table that has one), or neither (row-level), never both; a unit path is resolved here into
//!   its full chain ([`UnitPath`]): every step names declared columns of private tables, the chain
//!   has no cycle, ends at a table with a privacy unit column and has at most
//!   [`limits::UNIT_PATH_STEPS_MAX`] steps;
//! - every declared bound is finite, `lower < upper`, `|bound| ≤ COLUMN_BOUND_ABS_MAX`, and only
//!   numeric columns carry bounds;
//! - every budget has ε > 0 finite and δ in [0, 1); per-query caps are positive and no larger than
//!   the analyst's total; a budget's `period`, when given, is `day`, `week` or `month`;
//! - analyst names, table names and column names are unique (case-sensitive, as PostgreSQL
//!   stores unquoted names folded to lower case, names are lower-cased at load).
//!
//! Nothing downstream sees a raw struct.

mod schedule;
#[cfg(test)]
mod tests;
mod validate;

pub use schedule::ReleaseSchedule;
pub use validate::parse_scram_verifier;
use validate::*;

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::time::Duration;

use base64::Engine as _;
use serde::Deserialize;

use crate::limits;

// ---------------------------------------------------------------------------------------------
// Domain types
// ---------------------------------------------------------------------------------------------

/// A validated policy.
#[derive(Debug, Clone)]
pub struct Policy {
    /// The database name clients connect to (`dbname` in their connection string).
    pub database: String,
    /// Secret mixed into the choice of which groups a unit keeps, so the choice cannot be
    /// predicted by an analyst. `None`: pgdp keeps one in the ledger database.
    pub secret: Option<String>,
    /// Defaults for queries that do not `SET pgdp.*`.
    pub defaults: Defaults,
    /// Optional cap across all analysts together.
    pub dataset_budget: Option<BudgetSpec>,
    /// How long an identical query from the same analyst is answered from the replay cache.
    pub replay_lifetime: Duration,
    /// The `statement_timeout` of every upstream DP statement (`statement_timeout_s`, 60 s by
    /// default): past it the statement is cancelled (57014) and its charge stands.
    pub statement_timeout: Duration,
    /// When DP answers may leave (`release_schedule`); `None`: as soon as they are ready.
    pub release_schedule: Option<ReleaseSchedule>,
    /// The failed-login throttle (`login_throttle`; the defaults of `limits.rs` when absent).
    pub login_throttle: LoginThrottle,
    /// Analysts by name.
    pub analysts: BTreeMap<String, Analyst>,
    /// Tables by qualified name `schema.table`.
    pub tables: BTreeMap<String, Table>,
    /// Synopses by name (`synopses`): shared private multiplicative weights over the public
    /// domain of a few columns of one table ([`Synopsis`]).
    pub synopses: BTreeMap<String, Synopsis>,
}

/// A synopsis the data team declares (`synopses.<name>`): private multiplicative weights
/// ([`crate::dp::mechanism::pmw`]) over the public domain of a few columns of one private table,
/// which answers the counting queries over those columns of every analyst from one shared
/// state, for a one-time charge of `epsilon` per analyst and to the dataset.
///
/// Invariants of a validated one: the table is private with a privacy unit column or row-level
/// (not a unit path); every column is declared with `public_values` and `exhaustive: true` (so
/// every row is in exactly one cell of the domain), none is the privacy unit, none named twice;
/// the domain has at most [`limits::SYNOPSIS_CELLS_MAX`] cells; `rounds` is within
/// 1..=[`limits::SYNOPSIS_ROUNDS_MAX`]; `epsilon` is positive and within every analyst's
/// `epsilon_per_query_max`; `accuracy` is a positive number of rows.
#[derive(Debug, Clone, PartialEq)]
pub struct Synopsis {
    /// The name (`synopses.<name>`), a plain lower-case identifier: the ledger keys its state by it.
    pub name: String,
    /// The private table, qualified.
    pub table: String,
    /// The columns, in declaration order, each with its public values in the policy's order:
    /// the domain is their product, cell `((i₀·n₁ + i₁)·n₂ + i₂)…` for value indices `iₖ`.
    pub columns: Vec<(String, Vec<String>)>,
    /// ε: the whole synopsis's budget, charged once to each analyst who is answered from it and
    /// once to the dataset.
    pub epsilon: f64,
    /// T: the most update rounds.
    pub rounds: usize,
    /// τ: the error, in rows, under which the synopsis's estimate is answered as is.
    pub accuracy: f64,
    /// Δ: the most rows of one privacy unit the synopsis counts (the table's
    /// `max_groups_per_unit × max_rows_per_unit`; 1 for a row-level table).
    pub rows_per_unit: u64,
}

impl Synopsis {
    /// The number of cells of the domain.
    pub fn cells(&self) -> usize {
        self.columns
            .iter()
            .map(|(_, values)| values.len())
            .fold(1usize, usize::saturating_mul)
    }

    /// The synopsis's column of that name and its position, if it is one.
    pub fn column(&self, name: &str) -> Option<(usize, &[String])> {
        self.columns
            .iter()
            .position(|(c, _)| c == name)
            .map(|i| (i, self.columns[i].1.as_slice()))
    }

    /// A fingerprint of what the synopsis's released state depends on (table, columns and their
    /// values, ε, T, τ, Δ): the ledger discards a stored state whose fingerprint differs, since
    /// it was released under another declaration.
    pub fn fingerprint(&self) -> String {
        let columns: Vec<String> = self
            .columns
            .iter()
            .map(|(c, v)| format!("{c}[{}]", v.join("\u{1f}")))
            .collect();
        format!(
            "{}|{}|{}|{}|{}|{}",
            self.table,
            columns.join(","),
            self.epsilon,
            self.rounds,
            self.accuracy,
            self.rows_per_unit
        )
    }
}

/// When failed logins lock a login out (`login_throttle`): after `failures_per_user` failures
/// of one user name from one client address within `window`, that user's logins from there
/// are refused (FATAL 53300) until the window ends, other users behind the address served;
/// after `failures_per_address` from one address (many user names), every login from it.
/// Read at each login, so a reload applies to the next one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoginThrottle {
    /// Failures of one user from one address that lock that login out.
    pub failures_per_user: u32,
    /// Failures from one address, all user names together, that lock the address out.
    pub failures_per_address: u32,
    /// The window failures are counted in, from the first.
    pub window: Duration,
}

impl Default for LoginThrottle {
    fn default() -> LoginThrottle {
        LoginThrottle {
            failures_per_user: limits::AUTH_FAILURES_PER_USER_MAX,
            failures_per_address: limits::AUTH_FAILURES_PER_ADDRESS_MAX,
            window: Duration::from_millis(limits::AUTH_FAILURE_WINDOW_MS),
        }
    }
}

/// Per-query defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct Defaults {
    /// ε spent by one query unless the session sets `pgdp.epsilon`.
    pub epsilon: f64,
    /// δ spent by one query that needs it (partition selection, Gaussian conversion).
    pub delta: f64,
    /// The noise mechanism unless the session sets `pgdp.mechanism`.
    pub mechanism: Mechanism,
    /// Whether a query chooses its cap on rows per unit (at most the table's
    /// `max_rows_per_unit`) from a DP histogram of its data, unless the session sets
    /// `pgdp.choose_bounds` (docs/privacy.md, "Contribution bounds chosen per query").
    pub choose_bounds: bool,
    /// The most of an answer the caps chosen for a query may be estimated to remove before it
    /// is refused, unless the session sets `pgdp.max_bias` (`None`: never refused for it;
    /// `limits::MAX_BIAS_DEFAULT` when the policy omits it).
    pub max_bias: Option<f64>,
}

/// A share as a policy or `SET` writes it: `0.1`, `10%`, or `off` (`Some(None)`); `None` when
/// it is none of these. The range is the caller's to check.
pub fn parse_share(text: &str) -> Option<Option<f64>> {
    let text = text.trim();
    if text.eq_ignore_ascii_case("off") {
        return Some(None);
    }
    let (number, scale) = match text.strip_suffix('%') {
        Some(p) => (p.trim(), 0.01),
        None => (text, 1.0),
    };
    number.parse::<f64>().ok().map(|x| Some(x * scale))
}

/// Which family of noise a query uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mechanism {
    /// Discrete Laplace noise, pure ε-DP, L1 sensitivity.
    Laplace,
    /// Rounded Gaussian noise, ρ-zCDP (and exactly GDP), L2 sensitivity.
    Gaussian,
    /// Not chosen by the analyst: pgdp takes, per query, whichever of Laplace and Gaussian gives
    /// the smaller stated 95 % error bounds for the query's measures at the session's (ε, δ)
    /// (`dp::release::mechanisms`); a function of the policy and the query only.
    Auto,
}

impl Mechanism {
    /// The name used in YAML, `SET pgdp.mechanism` and EXPLAIN.
    pub fn name(self) -> &'static str {
        match self {
            Mechanism::Laplace => "laplace",
            Mechanism::Gaussian => "gaussian",
            Mechanism::Auto => "auto",
        }
    }

    /// Parses the YAML / SET spelling.
    pub fn parse(text: &str) -> Option<Mechanism> {
        match text.trim().to_ascii_lowercase().as_str() {
            "laplace" => Some(Mechanism::Laplace),
            "gaussian" => Some(Mechanism::Gaussian),
            "auto" => Some(Mechanism::Auto),
            _ => None,
        }
    }
}

/// A total budget (ε, δ) with an optional cap on ε per query.
#[derive(Debug, Clone, PartialEq)]
pub struct BudgetSpec {
    /// Total ε.
    pub epsilon: f64,
    /// Total δ.
    pub delta: f64,
    /// Largest ε one query may spend.
    pub epsilon_per_query_max: Option<f64>,
    /// When the budget renews (`period`); `None`: never, the limit covers the whole history.
    pub period: Option<Period>,
    /// How the accountant composes charges under this budget (`accounting`).
    pub accounting: Accounting,
}

/// The admission rule a budget's histories are composed under (`budget::accountant`, module
/// docs): which members share the conversions' δ. Fixed for a history at its first charge (the
/// ledger records it with the totals), so a policy that changes it takes effect for histories
/// that start afterwards: new analysts, a reset, the next window of a renewing budget.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Accounting {
    /// Gaussian DP, zCDP and the Rényi orders share the conversions' δ: good for every mix of
    /// Laplace and Gaussian queries.
    #[default]
    Mixed,
    /// Gaussian DP takes all of the conversions' δ (basic composition still serves histories of
    /// pure ε alone): the most Gaussian queries, fewer when large pure-ε charges are mixed in.
    Gaussian,
}

impl Accounting {
    /// The name used in YAML and messages.
    pub fn name(self) -> &'static str {
        match self {
            Accounting::Mixed => "mixed",
            Accounting::Gaussian => "gaussian",
        }
    }

    /// Parses the YAML spelling (`mixed`, `gaussian`; case and surrounding blanks ignored).
    pub fn parse(text: &str) -> Option<Accounting> {
        match text.trim().to_ascii_lowercase().as_str() {
            "mixed" => Some(Accounting::Mixed),
            "gaussian" => Some(Accounting::Gaussian),
            _ => None,
        }
    }
}

/// How often a budget renews: the calendar window (in UTC) that one (ε, δ) limit covers.
///
/// Windows are fixed in advance and do not depend on data: a day starts at 00:00 UTC, a week
/// on Monday at 00:00 UTC (ISO 8601 weeks), a month on its 1st at 00:00 UTC. The arithmetic is
/// `budget::window`; the guarantee per window is in docs/privacy.md.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Period {
    /// A calendar day in UTC.
    Day,
    /// An ISO 8601 week (Monday to Sunday) in UTC.
    Week,
    /// A calendar month in UTC.
    Month,
}

impl Period {
    /// The name used in YAML, the ledger (`pgdp.*_window_spent.period`) and messages.
    pub fn name(self) -> &'static str {
        match self {
            Period::Day => "day",
            Period::Week => "week",
            Period::Month => "month",
        }
    }

    /// Parses the YAML spelling (`day`, `week`, `month`; case and surrounding blanks ignored).
    pub fn parse(text: &str) -> Option<Period> {
        match text.trim().to_ascii_lowercase().as_str() {
            "day" => Some(Period::Day),
            "week" => Some(Period::Week),
            "month" => Some(Period::Month),
            _ => None,
        }
    }
}

/// An analyst who may connect.
#[derive(Debug, Clone)]
pub struct Analyst {
    /// The user name clients log in with.
    pub name: String,
    /// How the analyst authenticates.
    pub credential: Credential,
    /// The analyst's budget.
    pub budget: BudgetSpec,
}

/// An analyst's SCRAM-SHA-256 credential.
#[derive(Clone)]
pub enum Credential {
    /// A PostgreSQL-style verifier: the password itself is never known to pgdp.
    Verifier {
        /// SCRAM salt.
        salt: Vec<u8>,
        /// PBKDF2 iterations.
        iterations: usize,
        /// `SHA256(ClientKey)`.
        stored_key: Vec<u8>,
        /// `HMAC(SaltedPassword, "Server Key")`.
        server_key: Vec<u8>,
    },
    /// A clear-text password read from an environment variable at start.
    Password(String),
}

impl fmt::Debug for Credential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Credential::Verifier { iterations, .. } => {
                write!(f, "Verifier {{ iterations: {iterations}, .. }}")
            }
            Credential::Password(_) => write!(f, "Password(<redacted>)"),
        }
    }
}

/// A table analysts may query.
#[derive(Debug, Clone)]
pub struct Table {
    /// Schema name.
    pub schema: String,
    /// Table name.
    pub name: String,
    /// Public or private.
    pub kind: TableKind,
    /// Declared columns, in declaration order. Undeclared columns do not exist for analysts.
    pub columns: Vec<Column>,
}

impl Table {
    /// `schema.name`.
    pub fn qualified_name(&self) -> String {
        format!("{}.{}", self.schema, self.name)
    }

    /// The declared column of that (already lower-cased) name.
    pub fn column(&self, name: &str) -> Option<&Column> {
        self.columns.iter().find(|c| c.name == name)
    }

    /// The private part, if the table is private.
    pub fn private(&self) -> Option<&PrivateTable> {
        match &self.kind {
            TableKind::Private(p) => Some(p),
            TableKind::Public => None,
        }
    }
}

/// Whether rows of a table are about people.
#[derive(Debug, Clone, PartialEq)]
pub enum TableKind {
    /// Dimension data: no noise needed, but still never returned row by row through pgdp.
    Public,
    /// Rows about privacy units: only released through DP aggregates.
    Private(PrivateTable),
}

/// The contribution bounds of a private table.
#[derive(Debug, Clone, PartialEq)]
pub struct PrivateTable {
    /// The column naming the privacy unit; `None` for a row-level table (each row is a unit) and
    /// for a table whose unit is found through [`PrivateTable::unit_path`].
    pub privacy_unit: Option<String>,
    /// For a table whose rows belong to a unit through foreign keys: the resolved chain.
    pub unit_path: Option<UnitPath>,
    /// Most groups one unit contributes to in one query.
    pub max_groups_per_unit: u64,
    /// Most rows one unit contributes to one group.
    pub max_rows_per_unit: u64,
    /// Most groups per unit a query that chooses its caps may choose (`ceilings`; at least
    /// `max_groups_per_unit`, which it is when the policy sets none).
    pub groups_ceiling: u64,
    /// Most rows per unit and group a query that chooses its caps may choose (`ceilings`; at
    /// least `max_rows_per_unit`).
    pub rows_ceiling: u64,
    /// Columns the policy declares unique (`unique_keys`) where the upstream's catalog cannot
    /// state it (a partitioned table of foreign partitions): pgdp reads the table to verify
    /// each at start, on reload and on first need, and then treats it as a unique key.
    pub unique_keys: Vec<String>,
}

impl PrivateTable {
    /// How a row's privacy unit is found, for summaries and catalog comments.
    pub fn unit_description(&self) -> String {
        match (&self.privacy_unit, &self.unit_path) {
            (Some(u), _) => u.clone(),
            (None, Some(path)) => {
                let chain: Vec<String> = path
                    .steps
                    .iter()
                    .map(|s| format!("{} -> {}.{}", s.column, s.references, s.key))
                    .collect();
                format!("{} via {}", path.unit, chain.join(", "))
            }
            (None, None) => "<row>".to_string(),
        }
    }
}

/// The foreign-key chain from a table's rows to their privacy unit (`unit_path` in YAML),
/// resolved through every table it passes.
///
/// A row belongs to the unit of the row its first step's column references, and so on until a
/// table with a privacy unit column. Each step's `key` must be unique in the referenced table
/// (verified on the upstream before any query reads the table), so a row has at most one unit;
/// a row whose chain is broken (a NULL or dangling reference) has none and is never read.
#[derive(Debug, Clone, PartialEq)]
pub struct UnitPath {
    /// The steps, from the table itself to the table holding the unit.
    pub steps: Vec<PathStep>,
    /// The privacy unit column of the last referenced table; the table's rows carry it under
    /// this name in queries.
    pub unit: String,
    /// Declared type of that column (as written in the policy).
    pub unit_type: String,
}

/// One step of a [`UnitPath`]: `column` of the current table equals `key` of `references`.
#[derive(Debug, Clone, PartialEq)]
pub struct PathStep {
    /// Column of the current table (the table itself for the first step, else the table the
    /// previous step references).
    pub column: String,
    /// The referenced table, qualified.
    pub references: String,
    /// The column of the referenced table, unique there.
    pub key: String,
}

/// A declared column.
#[derive(Debug, Clone, PartialEq)]
pub struct Column {
    /// Lower-cased column name.
    pub name: String,
    /// Declared SQL type.
    pub ty: ColumnType,
    /// The declared type as written in the policy, lower-cased (e.g. `integer`, `bigint`).
    pub declared_type: String,
    /// Bounds for aggregating the column (SUM, AVG, …).
    pub bounds: Option<Bounds>,
    /// How far a query that chooses its bounds may raise `bounds.upper` (the policy's
    /// `upper_ceiling`; `lower` is then at least 0): the answer clamps at an upper bound chosen
    /// from a DP histogram of the values, at most this ([`crate::dp::release::bounds`]).
    pub upper_ceiling: Option<f64>,
    /// Whether the column may be used as a GROUP BY key.
    pub groupable: bool,
    /// Values of the column that are public knowledge; every one is released, present or not.
    pub public_values: Option<Vec<String>>,
    /// The policy's assertion (`exhaustive: true`) that every row holds one of `public_values`
    /// and none is NULL (enforce it upstream with NOT NULL and a CHECK constraint). Only then
    /// are totals over this key added up from the released cells (grouping sets, coarser
    /// groupings): a row outside the values would be in no cell, and missing from such a total.
    pub exhaustive: bool,
}

/// The declared range of a numeric column. Values outside are clamped before aggregation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bounds {
    /// Smallest value counted as is.
    pub lower: f64,
    /// Largest value counted as is.
    pub upper: f64,
}

impl Bounds {
    /// `max(|lower|, |upper|)`: the most one value can move a sum.
    pub fn magnitude(&self) -> f64 {
        self.lower.abs().max(self.upper.abs())
    }
}

/// SQL types pgdp knows how to handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColumnType {
    /// `smallint`, `integer`, `bigint`.
    Integer,
    /// `numeric` / `decimal`.
    Numeric,
    /// `real`, `double precision`.
    Float,
    /// `text`, `varchar`, `char`.
    Text,
    /// `date`.
    Date,
    /// `timestamp` / `timestamptz`.
    Timestamp,
    /// `boolean`.
    Boolean,
}

impl ColumnType {
    /// The type of a declared SQL type name, if pgdp handles it.
    pub fn parse(text: &str) -> Option<ColumnType> {
        let t = text.trim().to_ascii_lowercase();
        let base = t.split('(').next().unwrap_or("").trim();
        Some(match base {
            "smallint" | "int2" | "integer" | "int" | "int4" | "bigint" | "int8" => {
                ColumnType::Integer
            }
            "numeric" | "decimal" => ColumnType::Numeric,
            "real" | "float4" | "double precision" | "float8" | "double" => ColumnType::Float,
            "text" | "varchar" | "character varying" | "char" | "character" => ColumnType::Text,
            "date" => ColumnType::Date,
            "timestamp"
            | "timestamptz"
            | "timestamp with time zone"
            | "timestamp without time zone" => ColumnType::Timestamp,
            "boolean" | "bool" => ColumnType::Boolean,
            _ => return None,
        })
    }

    /// Whether values of this type can be summed (and so need bounds).
    pub fn is_numeric(self) -> bool {
        matches!(
            self,
            ColumnType::Integer | ColumnType::Numeric | ColumnType::Float
        )
    }

    /// The name used in docs and summaries.
    pub fn name(self) -> &'static str {
        match self {
            ColumnType::Integer => "integer",
            ColumnType::Numeric => "numeric",
            ColumnType::Float => "float",
            ColumnType::Text => "text",
            ColumnType::Date => "date",
            ColumnType::Timestamp => "timestamp",
            ColumnType::Boolean => "boolean",
        }
    }
}

/// Whether a declared timestamp type carries a time zone (`timestamptz`,
/// `timestamp(3) with time zone`).
pub fn with_time_zone(declared: &str) -> bool {
    let d = declared.trim().to_ascii_lowercase();
    d.starts_with("timestamptz") || d.ends_with("with time zone")
}

impl Policy {
    /// The `(table, column)` pairs the policy declares unique (the private tables'
    /// `unique_keys`), to be verified on the upstream before pgdp relies on them.
    pub fn declared_unique_keys(&self) -> std::collections::BTreeSet<(String, String)> {
        self.tables
            .values()
            .filter_map(|t| t.private().map(|p| (t.qualified_name(), p)))
            .flat_map(|(table, p)| {
                p.unique_keys
                    .iter()
                    .map(move |column| (table.clone(), column.clone()))
            })
            .collect()
    }

    /// The table of that qualified, lower-cased name.
    pub fn table(&self, qualified: &str) -> Option<&Table> {
        self.tables.get(qualified)
    }

    /// Schemas that hold at least one declared table.
    pub fn schemas(&self) -> Vec<String> {
        let mut s: Vec<String> = self.tables.values().map(|t| t.schema.clone()).collect();
        s.sort();
        s.dedup();
        s
    }

    /// A short human summary, printed by `pgdp check`.
    pub fn summary(&self) -> String {
        let mut out = format!("database {}\n", self.database);
        out.push_str(&format!(
            "defaults: epsilon {} per query, delta {}, mechanism {}{}\n",
            self.defaults.epsilon,
            self.defaults.delta,
            self.defaults.mechanism.name(),
            if self.defaults.choose_bounds {
                ", contribution bounds chosen per query"
            } else {
                ""
            }
        ));
        if let Some(b) = &self.dataset_budget {
            out.push_str(&format!(
                "dataset budget: epsilon {}, delta {}{}\n",
                b.epsilon,
                b.delta,
                renewal(b.period, b.accounting)
            ));
        }
        if let Some(schedule) = &self.release_schedule {
            out.push_str(&format!("release schedule: {}\n", schedule.describe()));
        }
        out.push_str(&format!("{} analyst(s):\n", self.analysts.len()));
        for a in self.analysts.values() {
            let cap = a
                .budget
                .epsilon_per_query_max
                .map(|c| format!(", at most {c} per query"))
                .unwrap_or_default();
            out.push_str(&format!(
                "  {}: epsilon {}, delta {}{}{}\n",
                a.name,
                a.budget.epsilon,
                a.budget.delta,
                cap,
                renewal(a.budget.period, a.budget.accounting)
            ));
        }
        for s in self.synopses.values() {
            out.push_str(&format!(
                "synopsis {}: {} over {} ({} cells), epsilon {} once per analyst, {} round(s), accuracy {} rows\n",
                s.name,
                s.table,
                s.columns
                    .iter()
                    .map(|(c, _)| c.as_str())
                    .collect::<Vec<_>>()
                    .join(" x "),
                s.cells(),
                s.epsilon,
                s.rounds,
                s.accuracy
            ));
        }
        out.push_str(&format!("{} table(s):\n", self.tables.len()));
        for t in self.tables.values() {
            let kind = match &t.kind {
                TableKind::Public => "public".to_string(),
                TableKind::Private(p) => {
                    let ceilings = if (p.groups_ceiling, p.rows_ceiling)
                        != (p.max_groups_per_unit, p.max_rows_per_unit)
                    {
                        format!(
                            " (up to {} and {} when a query chooses its caps)",
                            p.groups_ceiling, p.rows_ceiling
                        )
                    } else {
                        String::new()
                    };
                    format!(
                        "private, unit {}, at most {} group(s) and {} row(s) per unit{ceilings}",
                        p.unit_description(),
                        p.max_groups_per_unit,
                        p.max_rows_per_unit
                    )
                }
            };
            out.push_str(&format!(
                "  {} ({kind}; {} column(s))\n",
                t.qualified_name(),
                t.columns.len()
            ));
        }
        out
    }
}

/// `, per day (renews 00:00 UTC)` for a renewing budget, empty otherwise, and the accounting
/// rule when it is not the default (for summaries).
fn renewal(period: Option<Period>, accounting: Accounting) -> String {
    let mut out = period.map_or(String::new(), |p| {
        format!(", per {} (renews {})", p.name(), p.renewal_moment())
    });
    if accounting != Accounting::Mixed {
        out.push_str(&format!(", {} accounting", accounting.name()));
    }
    out
}

impl Period {
    /// When windows of this period start, in words.
    pub fn renewal_moment(self) -> &'static str {
        match self {
            Period::Day => "daily at 00:00 UTC",
            Period::Week => "Mondays at 00:00 UTC",
            Period::Month => "on the 1st at 00:00 UTC",
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Loading and validation
// ---------------------------------------------------------------------------------------------

/// Everything wrong with a policy file, each problem named by its path.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyErrors(pub Vec<String>);

impl fmt::Display for PolicyErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for PolicyErrors {}

/// Reads and validates a policy file.
pub fn load(path: &Path) -> Result<Policy, PolicyErrors> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| PolicyErrors(vec![format!("{}: {e}", path.display())]))?;
    parse(&text).map_err(|PolicyErrors(errs)| {
        PolicyErrors(
            errs.into_iter()
                .map(|e| format!("{}: {e}", path.display()))
                .collect(),
        )
    })
}

/// Parses and validates policy YAML text.
pub fn parse(text: &str) -> Result<Policy, PolicyErrors> {
    let raw: RawPolicy = serde_norway::from_str(text).map_err(|e| {
        let msg = match e.location() {
            Some(loc) => {
                let s = e.to_string();
                if s.contains("line ") {
                    s
                } else {
                    format!("{s} (line {}, column {})", loc.line(), loc.column())
                }
            }
            None => e.to_string(),
        };
        PolicyErrors(vec![msg])
    })?;
    validate(raw, &|name| std::env::var(name).ok())
}
