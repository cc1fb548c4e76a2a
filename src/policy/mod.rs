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
//!   the analyst's total;
//! - analyst names, table names and column names are unique (case-sensitive, as PostgreSQL
//!   stores unquoted names folded to lower case, names are lower-cased at load).
//!
//! Nothing downstream sees a raw struct.

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
    /// Analysts by name.
    pub analysts: BTreeMap<String, Analyst>,
    /// Tables by qualified name `schema.table`.
    pub tables: BTreeMap<String, Table>,
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
}

/// Which family of noise a query uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mechanism {
    /// Discrete Laplace noise, pure ε-DP, L1 sensitivity.
    Laplace,
    /// Discrete Gaussian noise, ρ-zCDP, L2 sensitivity.
    Gaussian,
}

impl Mechanism {
    /// The name used in YAML, `SET pgdp.mechanism` and EXPLAIN.
    pub fn name(self) -> &'static str {
        match self {
            Mechanism::Laplace => "laplace",
            Mechanism::Gaussian => "gaussian",
        }
    }

    /// Parses the YAML / SET spelling.
    pub fn parse(text: &str) -> Option<Mechanism> {
        match text.trim().to_ascii_lowercase().as_str() {
            "laplace" => Some(Mechanism::Laplace),
            "gaussian" => Some(Mechanism::Gaussian),
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
    /// Whether the column may be used as a GROUP BY key.
    pub groupable: bool,
    /// Values of the column that are public knowledge; every one is released, present or not.
    pub public_values: Option<Vec<String>>,
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

impl Policy {
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
            "defaults: epsilon {} per query, delta {}, mechanism {}\n",
            self.defaults.epsilon,
            self.defaults.delta,
            self.defaults.mechanism.name()
        ));
        if let Some(b) = &self.dataset_budget {
            out.push_str(&format!(
                "dataset budget: epsilon {}, delta {}\n",
                b.epsilon, b.delta
            ));
        }
        out.push_str(&format!("{} analyst(s):\n", self.analysts.len()));
        for a in self.analysts.values() {
            let cap = a
                .budget
                .epsilon_per_query_max
                .map(|c| format!(", at most {c} per query"))
                .unwrap_or_default();
            out.push_str(&format!(
                "  {}: epsilon {}, delta {}{}\n",
                a.name, a.budget.epsilon, a.budget.delta, cap
            ));
        }
        out.push_str(&format!("{} table(s):\n", self.tables.len()));
        for t in self.tables.values() {
            let kind = match &t.kind {
                TableKind::Public => "public".to_string(),
                TableKind::Private(p) => format!(
                    "private, unit {}, at most {} group(s) and {} row(s) per unit",
                    p.unit_description(),
                    p.max_groups_per_unit,
                    p.max_rows_per_unit
                ),
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

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPolicy {
    database: String,
    #[serde(default)]
    secret_env: Option<String>,
    #[serde(default)]
    defaults: RawDefaults,
    #[serde(default)]
    budget: Option<RawBudget>,
    #[serde(default)]
    replay_lifetime_s: Option<u64>,
    analysts: BTreeMap<String, RawAnalyst>,
    tables: BTreeMap<String, RawTable>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawDefaults {
    epsilon: Option<f64>,
    delta: Option<f64>,
    mechanism: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBudget {
    epsilon: f64,
    #[serde(default)]
    delta: f64,
    #[serde(default)]
    epsilon_per_query_max: Option<f64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAnalyst {
    #[serde(default)]
    scram_verifier: Option<String>,
    #[serde(default)]
    password_env: Option<String>,
    budget: RawBudget,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTable {
    kind: String,
    #[serde(default)]
    privacy_unit: Option<String>,
    #[serde(default)]
    unit_path: Option<Vec<RawPathStep>>,
    #[serde(default)]
    max_groups_per_unit: Option<u64>,
    #[serde(default)]
    max_rows_per_unit: Option<u64>,
    columns: BTreeMap<String, RawColumn>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPathStep {
    column: String,
    references: String,
    key: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawColumn {
    #[serde(rename = "type")]
    ty: String,
    #[serde(default)]
    lower: Option<f64>,
    #[serde(default)]
    upper: Option<f64>,
    #[serde(default)]
    groupable: Option<bool>,
    #[serde(default)]
    public_values: Option<Vec<serde_norway::Value>>,
}

/// Collects problems with their paths.
struct Problems(Vec<String>);

impl Problems {
    fn add(&mut self, path: &str, msg: impl fmt::Display) {
        self.0.push(format!("{path}: {msg}"));
    }
}

fn check_epsilon(p: &mut Problems, path: &str, eps: f64) {
    if !eps.is_finite() || eps <= 0.0 {
        p.add(
            path,
            format!("epsilon must be positive and finite, got {eps}"),
        );
    }
}

fn check_delta(p: &mut Problems, path: &str, delta: f64) {
    if !delta.is_finite() || !(0.0..1.0).contains(&delta) {
        p.add(path, format!("delta must be in [0, 1), got {delta}"));
    }
}

fn validate_budget(p: &mut Problems, path: &str, raw: &RawBudget) -> BudgetSpec {
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
    BudgetSpec {
        epsilon: raw.epsilon,
        delta: raw.delta,
        epsilon_per_query_max: raw.epsilon_per_query_max,
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

fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_lowercase() || c == '_')
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

fn value_text(v: &serde_norway::Value) -> Option<String> {
    match v {
        serde_norway::Value::String(s) => Some(s.clone()),
        serde_norway::Value::Number(n) => Some(n.to_string()),
        serde_norway::Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// The steps of a `unit_path` as written, lower-cased, with shape errors reported.
fn raw_path_steps(p: &mut Problems, path: &str, raw: &[RawPathStep]) -> Vec<PathStep> {
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
fn resolve_unit_paths(
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

fn validate(raw: RawPolicy, env: &dyn Fn(&str) -> Option<String>) -> Result<Policy, PolicyErrors> {
    let mut p = Problems(Vec::new());

    if raw.database.trim().is_empty() {
        p.add("database", "must not be empty");
    }
    let secret = match &raw.secret_env {
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
    };

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
    let mechanism = match raw.defaults.mechanism.as_deref() {
        None => Mechanism::Laplace,
        Some(m) => Mechanism::parse(m).unwrap_or_else(|| {
            p.add(
                "defaults.mechanism",
                format!("unknown mechanism {m:?}; use laplace or gaussian"),
            );
            Mechanism::Laplace
        }),
    };
    let dataset_budget = raw
        .budget
        .as_ref()
        .map(|b| validate_budget(&mut p, "budget", b));

    let mut analysts = BTreeMap::new();
    if raw.analysts.is_empty() {
        p.add("analysts", "at least one analyst is required");
    }
    for (name, a) in &raw.analysts {
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
        let budget = validate_budget(&mut p, &format!("{path}.budget"), &a.budget);
        if let Some(ds) = &dataset_budget {
            if budget.epsilon > ds.epsilon {
                // Allowed, but the dataset cap binds first; not an error.
            }
        }
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

    let mut tables = BTreeMap::new();
    // Unit paths as written (table → steps), resolved once every table is known.
    let mut raw_paths: BTreeMap<String, Vec<PathStep>> = BTreeMap::new();
    if raw.tables.is_empty() {
        p.add("tables", "at least one table is required");
    }
    for (qualified, t) in &raw.tables {
        let path = format!("tables.{qualified}");
        let lowered = qualified.to_ascii_lowercase();
        let Some((schema, name)) = lowered.split_once('.') else {
            p.add(&path, "table names must be qualified as schema.table");
            continue;
        };
        if !is_identifier(schema) || !is_identifier(name) {
            p.add(
                &path,
                "schema and table names must be plain lower-case identifiers",
            );
            continue;
        }
        if matches!(schema, "pg_catalog" | "information_schema" | "pgdp")
            || schema.starts_with("pg_")
        {
            p.add(&path, format!("schema {schema} is reserved"));
            continue;
        }

        let mut columns = Vec::new();
        if t.columns.is_empty() {
            p.add(
                &format!("{path}.columns"),
                "at least one column is required",
            );
        }
        for (cname, c) in &t.columns {
            let cpath = format!("{path}.columns.{cname}");
            let cname = cname.to_ascii_lowercase();
            if !is_identifier(&cname) || cname.starts_with("__dp_") {
                p.add(
                    &cpath,
                    "column names must be plain identifiers not starting with __dp_",
                );
                continue;
            }
            let Some(ty) = ColumnType::parse(&c.ty) else {
                p.add(&format!("{cpath}.type"), format!("unknown type {:?}", c.ty));
                continue;
            };
            let bounds = match (c.lower, c.upper) {
                (None, None) => None,
                (Some(lower), Some(upper)) => {
                    let mut ok = true;
                    if !ty.is_numeric() {
                        p.add(
                            &cpath,
                            format!("bounds need a numeric column, not {}", ty.name()),
                        );
                        ok = false;
                    }
                    if !lower.is_finite() || !upper.is_finite() {
                        p.add(&cpath, "bounds must be finite");
                        ok = false;
                    } else if lower >= upper {
                        p.add(
                            &cpath,
                            format!("lower ({lower}) must be below upper ({upper})"),
                        );
                        ok = false;
                    } else if lower.abs().max(upper.abs()) > limits::COLUMN_BOUND_ABS_MAX {
                        p.add(
                            &cpath,
                            format!("bounds must lie within ±{}", limits::COLUMN_BOUND_ABS_MAX),
                        );
                        ok = false;
                    }
                    ok.then_some(Bounds { lower, upper })
                }
                _ => {
                    p.add(&cpath, "lower and upper must be given together");
                    None
                }
            };
            let public_values = match &c.public_values {
                None => None,
                Some(values) => {
                    let mut out = Vec::new();
                    for (i, v) in values.iter().enumerate() {
                        match value_text(v) {
                            Some(s) => out.push(s),
                            None => p.add(
                                &format!("{cpath}.public_values[{i}]"),
                                "must be a string, number or boolean",
                            ),
                        }
                    }
                    out.sort();
                    out.dedup();
                    if out.len() > limits::PUBLIC_KEY_COMBINATIONS_MAX {
                        p.add(&format!("{cpath}.public_values"), "too many values");
                    }
                    Some(out)
                }
            };
            let groupable = c.groupable.unwrap_or(public_values.is_some());
            if public_values.is_some() && !groupable {
                p.add(&cpath, "public_values need groupable: true");
            }
            columns.push(Column {
                name: cname,
                ty,
                declared_type: c.ty.trim().to_ascii_lowercase(),
                bounds,
                groupable,
                public_values,
            });
        }

        let kind = match t.kind.as_str() {
            "public" => {
                for (key, present) in [
                    ("privacy_unit", t.privacy_unit.is_some()),
                    ("unit_path", t.unit_path.is_some()),
                    ("max_groups_per_unit", t.max_groups_per_unit.is_some()),
                    ("max_rows_per_unit", t.max_rows_per_unit.is_some()),
                ] {
                    if present {
                        p.add(
                            &format!("{path}.{key}"),
                            "only private tables have contribution bounds",
                        );
                    }
                }
                TableKind::Public
            }
            "private" => {
                let unit = t.privacy_unit.as_ref().map(|u| u.to_ascii_lowercase());
                if let Some(u) = &unit {
                    if !columns.iter().any(|c| &c.name == u) {
                        p.add(
                            &format!("{path}.privacy_unit"),
                            format!("column {u} is not declared in columns"),
                        );
                    }
                }
                let own_path = match (&unit, &t.unit_path) {
                    (Some(_), Some(_)) => {
                        p.add(
                            &path,
                            "privacy_unit and unit_path exclude each other: name the unit column, or the path to it",
                        );
                        None
                    }
                    (None, Some(steps)) => {
                        // Steps are checked against the tables they name once all are read.
                        Some(raw_path_steps(&mut p, &path, steps))
                    }
                    _ => None,
                };
                if let Some(steps) = &own_path {
                    raw_paths.insert(lowered.clone(), steps.clone());
                }
                let groups = t.max_groups_per_unit.unwrap_or(1);
                let rows = t.max_rows_per_unit.unwrap_or(1);
                if !(1..=limits::GROUPS_PER_UNIT_MAX).contains(&groups) {
                    p.add(
                        &format!("{path}.max_groups_per_unit"),
                        format!("must be between 1 and {}", limits::GROUPS_PER_UNIT_MAX),
                    );
                }
                if !(1..=limits::ROWS_PER_UNIT_MAX).contains(&rows) {
                    p.add(
                        &format!("{path}.max_rows_per_unit"),
                        format!("must be between 1 and {}", limits::ROWS_PER_UNIT_MAX),
                    );
                }
                if unit.is_none() && own_path.is_none() && (groups != 1 || rows != 1) {
                    p.add(
                        &path,
                        "a row-level table (no privacy_unit) has one group and one row per unit",
                    );
                }
                TableKind::Private(PrivateTable {
                    privacy_unit: unit,
                    unit_path: None,
                    max_groups_per_unit: groups,
                    max_rows_per_unit: rows,
                })
            }
            other => {
                p.add(
                    &format!("{path}.kind"),
                    format!("must be public or private, got {other:?}"),
                );
                continue;
            }
        };
        if let TableKind::Private(pt) = &kind {
            if let Some(u) = &pt.privacy_unit {
                if let Some(c) = columns.iter().find(|c| &c.name == u) {
                    if c.groupable {
                        p.add(
                            &format!("{path}.columns.{u}"),
                            "the privacy unit column cannot be groupable",
                        );
                    }
                }
            }
        }
        if tables.contains_key(&lowered) {
            p.add(&path, "declared twice (names are case-insensitive)");
        }
        let table = Table {
            schema: schema.to_string(),
            name: name.to_string(),
            kind,
            columns,
        };
        tables.insert(lowered.clone(), table);
    }

    resolve_unit_paths(&mut p, &raw_paths, &mut tables);

    if p.0.is_empty() {
        Ok(Policy {
            database: raw.database,
            secret,
            defaults: Defaults {
                epsilon,
                delta,
                mechanism,
            },
            dataset_budget,
            replay_lifetime: Duration::from_secs(
                raw.replay_lifetime_s
                    .unwrap_or(limits::REPLAY_LIFETIME_DEFAULT_S),
            ),
            analysts,
            tables,
        })
    } else {
        Err(PolicyErrors(p.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const VERIFIER: &str = "SCRAM-SHA-256$4096:cGdkcC10ZXN0LXNhbHQtMQ==$r6rs3eSqXnnzDaEwb3G617CNh9NDVFxQd+xPmWnxk4M=:mYmZ1VMmQU332cWdfJ/Ftq/OUxAAVBM4FRMHVqONj4s=";

    fn minimal(extra_table: &str) -> String {
        format!(
            r#"
database: db
analysts:
  alice:
    scram_verifier: "{VERIFIER}"
    budget: {{ epsilon: 1, delta: 1.0e-6 }}
tables:
  s.t:
    kind: private
    privacy_unit: uid
    max_groups_per_unit: 2
    max_rows_per_unit: 3
    columns:
      uid: {{ type: bigint }}
      x: {{ type: numeric, lower: 0, upper: 10 }}
      k: {{ type: text, public_values: [a, b] }}
{extra_table}
"#
        )
    }

    fn errors(text: &str) -> Vec<String> {
        match parse(text) {
            Ok(_) => Vec::new(),
            Err(PolicyErrors(e)) => e,
        }
    }

    #[test]
    fn minimal_policy_validates() {
        let p = parse(&minimal("")).expect("valid");
        let t = p.table("s.t").expect("table");
        let pt = t.private().expect("private");
        assert_eq!(pt.max_groups_per_unit, 2);
        assert_eq!(pt.privacy_unit.as_deref(), Some("uid"));
        let k = t.column("k").expect("k");
        assert!(k.groupable);
        assert_eq!(
            k.public_values.as_deref(),
            Some(&["a".to_string(), "b".to_string()][..])
        );
        assert_eq!(
            t.column("x").and_then(|c| c.bounds).map(|b| b.magnitude()),
            Some(10.0)
        );
        assert_eq!(p.defaults.mechanism, Mechanism::Laplace);
    }

    #[test]
    fn unknown_keys_are_rejected_with_location() {
        let e = errors(&minimal("  s.u:\n    kind: public\n    colums: {}\n"));
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(e[0].contains("colums"), "{e:?}");
        assert!(e[0].contains("line"), "{e:?}");
    }

    #[test]
    fn bounds_errors_name_their_path() {
        let text = minimal("").replace("lower: 0, upper: 10", "lower: 10, upper: 5");
        let e = errors(&text);
        assert_eq!(
            e,
            vec!["tables.s.t.columns.x: lower (10) must be below upper (5)".to_string()]
        );
    }

    #[test]
    fn every_problem_is_reported() {
        let text = minimal("")
            .replace("privacy_unit: uid", "privacy_unit: nobody")
            .replace("epsilon: 1, delta: 1.0e-6", "epsilon: -1, delta: 2");
        let e = errors(&text);
        assert!(
            e.iter().any(|m| m.starts_with("tables.s.t.privacy_unit:")),
            "{e:?}"
        );
        assert!(
            e.iter()
                .any(|m| m.starts_with("analysts.alice.budget.epsilon:")),
            "{e:?}"
        );
        assert!(
            e.iter()
                .any(|m| m.starts_with("analysts.alice.budget.delta:")),
            "{e:?}"
        );
    }

    #[test]
    fn public_tables_take_no_contribution_bounds() {
        let e = errors(&minimal(
            "  s.d:\n    kind: public\n    max_rows_per_unit: 2\n    columns:\n      a: { type: text }\n",
        ));
        assert_eq!(
            e,
            vec!["tables.s.d.max_rows_per_unit: only private tables have contribution bounds"]
        );
    }

    #[test]
    fn bounds_only_on_numeric_columns() {
        let text = minimal("").replace("k: { type: text,", "k: { type: text, lower: 0, upper: 1,");
        let e = errors(&text);
        assert!(e[0].contains("bounds need a numeric column"), "{e:?}");
    }

    #[test]
    fn verifier_parses_and_rejects_garbage() {
        assert!(matches!(
            parse_scram_verifier(VERIFIER),
            Ok(Credential::Verifier {
                iterations: 4096,
                ..
            })
        ));
        assert!(parse_scram_verifier("md5abc").is_err());
        assert!(parse_scram_verifier("SCRAM-SHA-256$10:c2FsdA==$AA==:AA==").is_err());
    }

    fn with_path(path: &str, extra_columns: &str) -> String {
        minimal(&format!(
            "  s.c:\n    kind: private\n    unit_path: {path}\n    max_groups_per_unit: 2\n    columns:\n      t_id: {{ type: bigint }}\n{extra_columns}"
        ))
        .replace(
            "      uid: { type: bigint }\n",
            "      uid: { type: bigint }\n      t_key: { type: bigint }\n",
        )
    }

    #[test]
    fn unit_path_resolves_to_the_unit_of_the_table_it_reaches() {
        let p = parse(&with_path(
            "[ { column: t_id, references: s.t, key: t_key } ]",
            "",
        ))
        .expect("valid");
        let pt = p.table("s.c").and_then(|t| t.private()).expect("private");
        assert_eq!(pt.privacy_unit, None);
        let path = pt.unit_path.as_ref().expect("resolved path");
        assert_eq!(path.unit, "uid");
        assert_eq!(path.steps.len(), 1);
        assert_eq!(pt.max_groups_per_unit, 2);
        assert!(p.summary().contains("uid via t_id -> s.t.t_key"));
    }

    #[test]
    fn unit_path_errors_name_the_step() {
        let e = errors(&with_path(
            "[ { column: t_id, references: s.t, key: nothing } ]",
            "",
        ));
        assert_eq!(
            e,
            vec!["tables.s.c.unit_path[0].key: column nothing is not declared in s.t"]
        );
        let e = errors(&with_path(
            "[ { column: t_id, references: s.missing, key: t_key } ]",
            "",
        ));
        assert_eq!(
            e,
            vec!["tables.s.c.unit_path[0].references: s.missing is not a table of the policy"]
        );
        let e = errors(&with_path(
            "[ { column: nope, references: s.t, key: t_key } ]",
            "",
        ));
        assert_eq!(
            e,
            vec!["tables.s.c.unit_path[0].column: column nope is not declared in s.c"]
        );
        // The derived unit cannot also be a declared column.
        let e = errors(&with_path(
            "[ { column: t_id, references: s.t, key: t_key } ]",
            "      uid: { type: bigint }\n",
        ));
        assert!(e[0].starts_with("tables.s.c.columns.uid:"), "{e:?}");
        // Both ways of naming the unit at once.
        let e = errors(
            &with_path("[ { column: t_id, references: s.t, key: t_key } ]", "")
                .replace("    unit_path:", "    privacy_unit: t_id\n    unit_path:"),
        );
        assert!(e.iter().any(|m| m.contains("exclude each other")), "{e:?}");
    }

    #[test]
    fn unit_path_cycles_and_row_level_ends_are_refused() {
        let cyclic = minimal(
            "  s.a:\n    kind: private\n    unit_path: [ { column: b_id, references: s.b, key: id } ]\n    columns:\n      id: { type: bigint }\n      b_id: { type: bigint }\n  s.b:\n    kind: private\n    unit_path: [ { column: a_id, references: s.a, key: id } ]\n    columns:\n      id: { type: bigint }\n      a_id: { type: bigint }\n",
        );
        let e = errors(&cyclic);
        assert!(e.iter().any(|m| m.contains("(a cycle)")), "{e:?}");
        let row_level = minimal(
            "  s.a:\n    kind: private\n    unit_path: [ { column: r_id, references: s.r, key: id } ]\n    columns:\n      r_id: { type: bigint }\n  s.r:\n    kind: private\n    columns:\n      id: { type: bigint }\n",
        );
        let e = errors(&row_level);
        assert_eq!(
            e,
            vec!["tables.s.a.unit_path[0].references: s.r is row-level: a unit path must end at a table with a privacy_unit"]
        );
    }

    #[test]
    fn unit_path_chains_through_tables_with_paths_up_to_the_limit() {
        let mut extra = String::new();
        // s.c0 -> s.t directly, s.cN -> s.c(N-1): N + 1 steps in all.
        for i in 0..=limits::UNIT_PATH_STEPS_MAX {
            let target = if i == 0 {
                "s.t".to_string()
            } else {
                format!("s.c{}", i - 1)
            };
            let key = if i == 0 { "t_key" } else { "id" };
            extra.push_str(&format!(
                "  s.c{i}:\n    kind: private\n    unit_path: [ {{ column: up, references: {target}, key: {key} }} ]\n    columns:\n      id: {{ type: bigint }}\n      up: {{ type: bigint }}\n"
            ));
        }
        let text = minimal(&extra).replace(
            "      uid: { type: bigint }\n",
            "      uid: { type: bigint }\n      t_key: { type: bigint }\n",
        );
        let e = errors(&text);
        let last = limits::UNIT_PATH_STEPS_MAX;
        assert_eq!(
            e,
            vec![format!(
                "tables.s.c{last}.unit_path: the chain to the privacy unit has more than {last} steps"
            )]
        );
        let ok = parse(&minimal(
            "  s.a:\n    kind: private\n    unit_path: [ { column: b_id, references: s.b, key: id } ]\n    columns:\n      b_id: { type: bigint }\n  s.b:\n    kind: private\n    unit_path: [ { column: uid_ref, references: s.t, key: uid } ]\n    columns:\n      id: { type: bigint }\n      uid_ref: { type: bigint }\n",
        ))
        .expect("a chain through a table with its own path");
        let path = ok
            .table("s.a")
            .and_then(|t| t.private())
            .and_then(|p| p.unit_path.clone())
            .expect("resolved");
        assert_eq!(path.steps.len(), 2);
        assert_eq!(path.steps[1].references, "s.t");
        assert_eq!(path.unit, "uid");
    }

    #[test]
    fn demo_policy_is_valid() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("policies/demo.yaml");
        let p = load(&path).expect("demo policy validates");
        assert_eq!(p.database, "pgdp_demo");
        let a = p.analysts.get("analyst").expect("demo analyst");
        assert_eq!(a.budget.epsilon, 10.0);
        assert_eq!(a.budget.delta, 1e-5);
        assert!(p.table("demo.people").and_then(|t| t.private()).is_some());
        assert!(p.table("demo.visits").and_then(|t| t.private()).is_some());
        assert_eq!(
            p.table("demo.prescriptions")
                .and_then(|t| t.private())
                .and_then(|p| p.unit_path.as_ref())
                .map(|path| path.unit.as_str()),
            Some("person_id")
        );
        assert_eq!(
            p.table("demo.regions").map(|t| &t.kind),
            Some(&TableKind::Public)
        );
    }
}
