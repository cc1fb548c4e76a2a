//! Analysis: resolve an analyst's query against the policy and decide whether pgdp can answer it
//! with differential privacy. The result is a [`Plan`], the narrow description of the query that
//! the rewriter and the release step work from.
//!
//! Invariants:
//! - Every column reference in the plan is resolved to a declared column of a policy table and
//!   rewritten to the canonical form `"__dp_tN"."column"`; nothing else from the analyst's SQL
//!   names a relation.
//! - Every expression in the plan uses only constructs on the whitelist below, all of which are
//!   total (never raise an error that depends on the data): comparisons, boolean logic, `+ - *`
//!   on numeric operands, division rewritten to be NULL on zero, `IN`, `BETWEEN`, `LIKE` with a
//!   literal pattern, `IS [NOT] NULL`, `CASE`, and the functions in [`total_function`].
//! - Every aggregated expression has bounds derived from the policy; a query whose bounds cannot
//!   be derived is refused, never answered with data-dependent sensitivity.
//! - Only the group keys may leave as values; every aggregate leaves through a mechanism.
//! - A subquery in FROM (derived table or CTE) becomes a [`TableRef`] with its own SQL
//!   ([`TableRef::source`]) and a table pgdp built with a privacy unit and contribution bounds:
//!   row-level subqueries keep those of the private tables they read; subqueries grouped by the
//!   privacy unit have one row per unit (1 group, 1 row). Their values' bounds and public
//!   domains come from the query's literals and the policy, never from the data.
//! - Group keys with a public domain: `public_values` columns, public tables' columns, CASE
//!   expressions whose results are all literals, and bounded integer per-unit values.
//! - Analysis does no I/O.

use std::borrow::Cow;
use std::collections::BTreeMap;

use sqlparser::ast::{
    self, BinaryOperator, Expr, FunctionArg, FunctionArgExpr, FunctionArguments, GroupByExpr,
    Ident, JoinConstraint, JoinOperator, ObjectName, SelectItem, SetExpr, TableFactor,
    UnaryOperator, Value,
};

use crate::error::{Error, Result};
use crate::limits;
use crate::policy::{Bounds, Column, ColumnType, Policy, PrivateTable, Table, TableKind, UnitPath};

/// Prefix of every identifier pgdp generates; analyst SQL may not use it.
pub const RESERVED_PREFIX: &str = "__dp_";

pub use crate::limits::{INTEGER_DOMAIN_VALUES_MAX, JOINED_TABLES_MAX, VIEW_TABLES_MAX};

/// Context of the analysis: the session's view of the policy.
#[derive(Debug, Clone)]
pub struct Context<'a> {
    /// The policy.
    pub policy: &'a Policy,
    /// Schemas searched for unqualified table names, in order.
    pub search_path: Vec<String>,
}

/// A table in the FROM clause.
#[derive(Debug, Clone, PartialEq)]
pub struct TableRef {
    /// The policy table (qualified name).
    pub table: String,
    /// The generated alias `__dp_tN`.
    pub alias: String,
    /// Whether the table is private.
    pub private: bool,
    /// For a subquery in FROM (a derived table or a CTE): the contribution-preserving SQL pgdp
    /// built for it, with `$n` placeholders until the rewrite binds them. `None` for a policy
    /// table.
    pub source: Option<Box<ast::Query>>,
}

/// How the privacy unit of a row is found.
#[derive(Debug, Clone, PartialEq)]
pub enum Unit {
    /// A column (canonical expression text `"__dp_tN"."col"`).
    Column(String),
    /// Row-level table: each row is a unit (its `ctid`).
    Row(String),
}

/// What one aggregate computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AggregateKind {
    /// `COUNT(*)`.
    CountRows,
    /// `COUNT(expr)`: rows where the expression is not NULL.
    CountValues,
    /// `COUNT(DISTINCT <privacy unit>)`.
    CountUnits,
    /// `SUM(expr)`.
    Sum,
    /// `AVG(expr)`.
    Avg,
    /// `VAR_SAMP` / `VARIANCE`.
    VarSamp,
    /// `VAR_POP`.
    VarPop,
    /// `STDDEV_SAMP` / `STDDEV`.
    StddevSamp,
    /// `STDDEV_POP`.
    StddevPop,
    /// `COUNT(DISTINCT expr)` for an expression other than the privacy unit.
    CountDistinct,
    /// A quantile (`PERCENTILE_CONT`, `PERCENTILE_DISC`, `MEDIAN`, `MIN` = 0, `MAX` = 1) of a
    /// bounded argument, in thousandths.
    Quantile {
        /// The quantile × 1000, in 0..=1000.
        permille: u16,
    },
}

impl AggregateKind {
    /// The SQL name, also the default output column name.
    pub fn sql_name(self) -> &'static str {
        match self {
            AggregateKind::CountRows | AggregateKind::CountValues | AggregateKind::CountUnits => {
                "count"
            }
            AggregateKind::Sum => "sum",
            AggregateKind::Avg => "avg",
            AggregateKind::VarSamp => "var_samp",
            AggregateKind::VarPop => "var_pop",
            AggregateKind::StddevSamp => "stddev_samp",
            AggregateKind::StddevPop => "stddev_pop",
            AggregateKind::CountDistinct => "count_distinct",
            AggregateKind::Quantile { .. } => "quantile",
        }
    }
}

/// One aggregate of the query.
#[derive(Debug, Clone, PartialEq)]
pub struct Aggregate {
    /// What it computes.
    pub kind: AggregateKind,
    /// The argument (canonical SQL text), for all but `COUNT(*)` and `COUNT(DISTINCT unit)`.
    pub argument: Option<String>,
    /// Bounds of the argument, for sums, averages and variances.
    pub bounds: Option<Bounds>,
    /// Canonical text of the whole aggregate (to match HAVING / ORDER BY references).
    pub text: String,
}

/// A GROUP BY key.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupKey {
    /// Canonical SQL text of the key expression.
    pub expr: String,
    /// Output type.
    pub ty: ColumnType,
    /// Where the set of possible values is public knowledge.
    pub public: PublicKeys,
}

/// Whether a key's domain is public.
#[derive(Debug, Clone, PartialEq)]
pub enum PublicKeys {
    /// Not public: groups released only through partition selection.
    No,
    /// The policy lists the values.
    Listed(Vec<String>),
    /// A column of a public table: the values are read from that table.
    Table { table: String, column: String },
}

/// One output column of the query.
#[derive(Debug, Clone, PartialEq)]
pub struct Output {
    /// Output column name.
    pub name: String,
    /// What the column is.
    pub source: OutputSource,
}

/// Where an output column comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum OutputSource {
    /// The value of group key `i`.
    Key(usize),
    /// The released value of aggregate `i`.
    Aggregate(usize),
}

/// A post-processing predicate or sort expression over released values.
#[derive(Debug, Clone, PartialEq)]
pub enum Post {
    /// Output or aggregate value by index into `Plan::aggregates`.
    Aggregate(usize),
    /// Group key value.
    Key(usize),
    /// A literal number.
    Number(f64),
    /// A literal string.
    Text(String),
    /// NULL.
    Null,
    /// A comparison or arithmetic / boolean operator.
    Binary(Box<Post>, PostOp, Box<Post>),
    /// NOT.
    Not(Box<Post>),
    /// Unary minus.
    Negate(Box<Post>),
    /// IS NULL / IS NOT NULL.
    IsNull(Box<Post>, bool),
}

/// Operators allowed in HAVING.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PostOp {
    /// `=`
    Eq,
    /// `<>`
    NotEq,
    /// `<`
    Lt,
    /// `<=`
    LtEq,
    /// `>`
    Gt,
    /// `>=`
    GtEq,
    /// `AND`
    And,
    /// `OR`
    Or,
    /// `+`
    Plus,
    /// `-`
    Minus,
    /// `*`
    Multiply,
    /// `/`
    Divide,
}

/// An ORDER BY item applied by pgdp to released rows.
#[derive(Debug, Clone, PartialEq)]
pub struct SortKey {
    /// The value to sort by.
    pub value: Post,
    /// Ascending?
    pub ascending: bool,
    /// NULLs first?
    pub nulls_first: bool,
}

/// A parameter `$n` of the extended protocol.
#[derive(Debug, Clone, PartialEq)]
pub struct Parameter {
    /// 1-based index.
    pub index: usize,
    /// Type inferred from the context (the column compared with).
    pub ty: ColumnType,
    /// The declared SQL type of that column, when the parameter is compared with a column.
    pub declared: Option<String>,
}

/// The analysed query.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// Tables in FROM, in order; the first is the driving table.
    pub tables: Vec<TableRef>,
    /// Join conditions (canonical SQL), one per joined table (index i+1).
    pub joins: Vec<String>,
    /// The privacy unit.
    pub unit: Unit,
    /// Most groups a unit contributes to.
    pub max_groups_per_unit: u64,
    /// Most rows a unit contributes to a group.
    pub max_rows_per_unit: u64,
    /// WHERE (canonical, with parameters as `$n` placeholders until the rewrite binds them).
    pub filter: Option<Expr>,
    /// GROUP BY keys.
    pub keys: Vec<GroupKey>,
    /// Aggregates, each released through a mechanism.
    pub aggregates: Vec<Aggregate>,
    /// Output columns in order.
    pub outputs: Vec<Output>,
    /// HAVING, applied to released rows.
    pub having: Option<Post>,
    /// ORDER BY, applied to released rows.
    pub order_by: Vec<SortKey>,
    /// LIMIT, applied to released rows.
    pub limit: Option<u64>,
    /// OFFSET, applied to released rows.
    pub offset: u64,
    /// Parameters used in WHERE.
    pub parameters: Vec<Parameter>,
    /// Every row of `__dp_rows` has a unit of its own: one policy table, no join, and a unit that
    /// is the row itself or a column the upstream declares unique. Analysis leaves it `false`;
    /// the session sets it from upstream catalog facts ([`Plan::unit_key`]). It only lets the
    /// rewrite skip work that is then the identity (docs/privacy.md, "Unique units").
    pub unit_unique: bool,
    /// `(table, column)` pairs the plan relies on being unique upstream: the keys of the unit
    /// paths it reads through (docs/privacy.md, "Tables with a unit path"). The caller verifies
    /// them on the upstream catalog before running the plan and refuses it otherwise.
    pub unique_keys: Vec<(String, String)>,
}

impl Plan {
    /// For a plan over one policy table without joins: the (table, column) whose uniqueness
    /// upstream makes every row its own unit, or `None` when the unit is the row itself (always
    /// unique) or the plan has joins or subqueries (never considered unique).
    pub fn unit_key(&self) -> Option<(String, String)> {
        let [table] = self.tables.as_slice() else {
            return None;
        };
        if !table.private || table.source.is_some() || !self.joins.is_empty() {
            return None;
        }
        let Unit::Column(c) = &self.unit else {
            return None;
        };
        let column = c.strip_prefix(&format!("\"{}\".", table.alias))?;
        let column = column.strip_prefix('"')?.strip_suffix('"')?;
        Some((table.table.clone(), column.replace("\"\"", "\"")))
    }

    /// Whether every row is its own unit without a catalog fact: one policy table, no join,
    /// and row-level (each row is a unit).
    pub fn rows_are_units(&self) -> bool {
        matches!(self.unit, Unit::Row(_))
            && matches!(self.tables.as_slice(), [t] if t.private && t.source.is_none())
            && self.joins.is_empty()
    }

    /// Whether every key's domain is public, so no partition selection is needed.
    pub fn keys_public(&self) -> bool {
        self.keys.iter().all(|k| k.public != PublicKeys::No)
    }
}

// ---------------------------------------------------------------------------------------------
// Entry point
// ---------------------------------------------------------------------------------------------

/// Analyses a query. Refusals carry a SQLSTATE and a hint.
pub fn analyze(query: &ast::Query, ctx: &Context) -> Result<Plan> {
    reject_reserved(query)?;
    let ctes = common_table_expressions(query)?;
    if !query.locks.is_empty() {
        return Err(Error::forbidden(
            "FOR UPDATE / FOR SHARE is not allowed through pgdp",
            "",
        ));
    }
    if query.fetch.is_some() {
        return Err(Error::unsupported("FETCH FIRST", "Use LIMIT instead."));
    }
    let select = match query.body.as_ref() {
        SetExpr::Select(s) => s,
        SetExpr::SetOperation { .. } => {
            return Err(Error::unsupported(
                "set operations (UNION, INTERSECT, EXCEPT)",
                "Run each aggregate query separately; each is charged on its own.",
            ))
        }
        _ => {
            return Err(Error::unsupported(
                "this kind of query",
                "Use SELECT … FROM … GROUP BY …",
            ))
        }
    };
    if select.distinct.is_some() {
        return Err(Error::unsupported(
            "SELECT DISTINCT",
            "Use GROUP BY with COUNT(*): distinct values are released only through DP partition selection.",
        ));
    }
    if select.into.is_some() {
        return Err(Error::forbidden(
            "SELECT INTO is not allowed through pgdp",
            "",
        ));
    }
    if select.qualify.is_some() || !select.named_window.is_empty() {
        return Err(window_refusal());
    }
    if select.top.is_some() || select.prewhere.is_some() || !select.lateral_views.is_empty() {
        return Err(Error::unsupported("this SELECT clause", ""));
    }

    let mut a = Analyzer {
        ctx,
        tables: Vec::new(),
        parameters: BTreeMap::new(),
        ctes,
        expanding: Vec::new(),
        next_alias: 0,
        view_hints: BTreeMap::new(),
        unique_keys: Vec::new(),
    };
    let joins = a.resolve_from(&select.from)?;

    let private: Vec<&TableRef> = a
        .tables
        .iter()
        .map(|t| &t.0)
        .filter(|t| t.private)
        .collect();
    if private.is_empty() {
        return Err(Error::unsupported(
            "queries over public tables only",
            "pgdp answers DP aggregates over private tables; join the public table to a private one.",
        ));
    }

    let filter = match &select.selection {
        Some(e) => {
            let mut e = e.clone();
            let info = a.expr(&mut e, Role::Filter)?;
            if info.ty.is_some_and(|t| t != ColumnType::Boolean) {
                return Err(Error::Syntax {
                    message: "argument of WHERE must be type boolean".into(),
                });
            }
            Some(e)
        }
        None => None,
    };

    // GROUP BY keys.
    let group_exprs = match &select.group_by {
        GroupByExpr::Expressions(exprs, modifiers) => {
            if !modifiers.is_empty() {
                return Err(Error::unsupported(
                    "ROLLUP / CUBE / GROUPING SETS",
                    "Run one query per grouping.",
                ));
            }
            exprs.clone()
        }
        GroupByExpr::All(_) => return Err(Error::unsupported("GROUP BY ALL", "List the keys.")),
    };
    if group_exprs.len() > limits::GROUP_KEYS_PER_QUERY_MAX {
        return Err(Error::LimitExceeded {
            what: "the number of GROUP BY keys".into(),
            limit: limits::GROUP_KEYS_PER_QUERY_MAX as u64,
        });
    }
    let mut keys: Vec<GroupKey> = Vec::new();
    for g in &group_exprs {
        let mut e = resolve_group_reference(g, &select.projection)?;
        let info = a.expr(&mut e, Role::Key)?;
        if !info.groupable {
            return Err(Error::forbidden(
                format!("grouping by {} is not allowed", g),
                "Group only by columns declared groupable in the policy (and simple functions of them); never by the privacy unit.",
            ));
        }
        let text = e.to_string();
        if keys.iter().any(|k| k.expr == text) {
            continue;
        }
        keys.push(GroupKey {
            expr: text,
            ty: info.ty.unwrap_or(ColumnType::Text),
            public: info.public,
        });
    }

    // Select list.
    let mut aggregates: Vec<Aggregate> = Vec::new();
    let mut outputs = Vec::new();
    for item in &select.projection {
        let (expr, alias) = match item {
            SelectItem::UnnamedExpr(e) => (e, None),
            SelectItem::ExprWithAlias { expr, alias } => (expr, Some(alias.value.clone())),
            SelectItem::ExprWithAliases { .. } => {
                return Err(Error::unsupported(
                    "multiple aliases for one select item",
                    "",
                ))
            }
            SelectItem::Wildcard(_) | SelectItem::QualifiedWildcard(..) => {
                return Err(Error::forbidden(
                    "SELECT * is not allowed on private tables",
                    "Ask for aggregates, e.g. SELECT COUNT(*), AVG(age) FROM demo.people.",
                ))
            }
        };
        let source = match a.aggregate(expr)? {
            Some(agg) => {
                let idx = push_aggregate(&mut aggregates, agg);
                OutputSource::Aggregate(idx)
            }
            None => {
                let mut e = expr.clone();
                a.expr(&mut e, Role::Key)?;
                let text = e.to_string();
                match keys.iter().position(|k| k.expr == text) {
                    Some(i) => OutputSource::Key(i),
                    None => {
                        return Err(Error::forbidden(
                            format!("{expr} must appear in GROUP BY or be used in an aggregate"),
                            "pgdp releases only aggregates (COUNT, SUM, AVG, VARIANCE, STDDEV) and GROUP BY keys.",
                        ))
                    }
                }
            }
        };
        let name = alias.unwrap_or_else(|| default_name(expr));
        if name.starts_with(RESERVED_PREFIX) {
            return Err(reserved_refusal());
        }
        outputs.push(Output { name, source });
    }
    if aggregates.is_empty() {
        return Err(Error::forbidden(
            "a query on private tables must compute at least one aggregate",
            "Add COUNT(*) (or another aggregate) to the select list; group keys alone are released only with a noisy count.",
        ));
    }

    // HAVING and ORDER BY are post-processing on released values.
    let having = match &select.having {
        Some(h) => Some(a.post(h, &keys, &mut aggregates, &outputs, false)?),
        None => None,
    };
    let mut order_by = Vec::new();
    if let Some(ob) = &query.order_by {
        let exprs = match &ob.kind {
            ast::OrderByKind::Expressions(e) => e,
            ast::OrderByKind::All(_) => return Err(Error::unsupported("ORDER BY ALL", "")),
        };
        for o in exprs {
            if o.with_fill.is_some() {
                return Err(Error::unsupported("WITH FILL", ""));
            }
            let value = a.post(&o.expr, &keys, &mut aggregates, &outputs, true)?;
            let ascending = match &o.options.sort {
                None | Some(ast::OrderBySort::Asc) => true,
                Some(ast::OrderBySort::Desc) => false,
                Some(ast::OrderBySort::Using(_)) => {
                    return Err(Error::unsupported("ORDER BY … USING", "Use ASC or DESC."))
                }
            };
            let nulls_first = o.options.nulls_first.unwrap_or(!ascending);
            order_by.push(SortKey {
                value,
                ascending,
                nulls_first,
            });
        }
    }
    if aggregates.len() > limits::AGGREGATES_PER_QUERY_MAX {
        return Err(Error::LimitExceeded {
            what: "the number of aggregates".into(),
            limit: limits::AGGREGATES_PER_QUERY_MAX as u64,
        });
    }
    let (limit, offset) = limit_offset(query)?;

    // Contribution bounds: the loosest of the private tables joined (all share the unit).
    let policy_tables: Vec<&Table> = a
        .tables
        .iter()
        .filter(|t| t.0.private)
        .map(|t| &*t.1)
        .collect();
    let max_groups_per_unit = policy_tables
        .iter()
        .filter_map(|t| t.private().map(|p| p.max_groups_per_unit))
        .max()
        .unwrap_or(1);
    let max_rows_per_unit = policy_tables
        .iter()
        .filter_map(|t| t.private().map(|p| p.max_rows_per_unit))
        .max()
        .unwrap_or(1);

    let unit = a.unit()?;
    let parameters = a
        .parameters
        .into_iter()
        .map(|(index, (ty, declared))| Parameter {
            index,
            ty,
            declared,
        })
        .collect();
    Ok(Plan {
        tables: a.tables.into_iter().map(|t| t.0).collect(),
        joins,
        unit,
        max_groups_per_unit: if keys.is_empty() {
            1
        } else {
            max_groups_per_unit
        },
        max_rows_per_unit,
        filter,
        keys,
        aggregates,
        outputs,
        having,
        order_by,
        limit,
        offset,
        parameters,
        unit_unique: false,
        unique_keys: a.unique_keys,
    })
}

/// The `WITH` list of a query: name → body. Recursive CTEs and column lists are refused.
fn common_table_expressions(query: &ast::Query) -> Result<Vec<(String, ast::Query)>> {
    let Some(with) = &query.with else {
        return Ok(Vec::new());
    };
    if with.recursive {
        return Err(Error::unsupported(
            "WITH RECURSIVE",
            "Use non-recursive CTEs that filter, project or join rows, or aggregate per privacy unit (GROUP BY person_id).",
        ));
    }
    let mut out: Vec<(String, ast::Query)> = Vec::new();
    for cte in &with.cte_tables {
        if !cte.alias.columns.is_empty() {
            return Err(Error::unsupported(
                "column lists on CTE names",
                "Name the columns inside the CTE with AS.",
            ));
        }
        if cte.materialized.is_some() || cte.from.is_some() {
            return Err(Error::unsupported(
                "MATERIALIZED / FROM on a CTE",
                "Write WITH name AS (SELECT …).",
            ));
        }
        let name = ident_lower(&cte.alias.name);
        if name.starts_with(RESERVED_PREFIX) {
            return Err(reserved_refusal());
        }
        if out.iter().any(|(n, _)| *n == name) {
            return Err(Error::Syntax {
                message: format!("WITH query name \"{name}\" specified more than once"),
            });
        }
        out.push((name, cte.query.as_ref().clone()));
    }
    Ok(out)
}

/// The public domain of an integer per-unit value with finite bounds: every integer between
/// them. The bounds come from the query's literals and the policy, never from the data, so the
/// domain is data-independent; values outside it (data beyond declared bounds) are not released.
fn integer_domain(ty: ColumnType, bounds: Option<Bounds>) -> Option<Vec<String>> {
    let b = bounds?;
    let integral = b.lower.fract() == 0.0 && b.upper.fract() == 0.0;
    if ty != ColumnType::Integer || !integral || b.upper - b.lower >= INTEGER_DOMAIN_VALUES_MAX {
        return None;
    }
    let (lo, hi) = (b.lower as i64, b.upper as i64);
    Some((lo..=hi).map(|v| v.to_string()).collect())
}

/// The FROM clause of tables and their join conditions (one per table after the first); a
/// subquery's SQL is rendered by `source` (the rewrite binds its parameters there).
pub fn from_clause(
    tables: &[TableRef],
    joins: &[String],
    source: impl Fn(&ast::Query) -> Result<String>,
) -> Result<String> {
    let mut from = String::new();
    for (i, t) in tables.iter().enumerate() {
        let relation = match &t.source {
            Some(q) => format!("({}) AS \"{}\"", source(q)?, t.alias),
            None => {
                let (schema, name) = t
                    .table
                    .split_once('.')
                    .ok_or_else(|| Error::internal("unqualified table"))?;
                format!("\"{schema}\".\"{name}\" AS \"{}\"", t.alias)
            }
        };
        if i == 0 {
            from.push_str(&relation);
        } else {
            let on = joins
                .get(i - 1)
                .ok_or_else(|| Error::internal("missing join condition"))?;
            from.push_str(&format!(" JOIN {relation} ON {on}"));
        }
    }
    Ok(from)
}

fn push_aggregate(aggregates: &mut Vec<Aggregate>, agg: Aggregate) -> usize {
    match aggregates.iter().position(|a| a.text == agg.text) {
        Some(i) => i,
        None => {
            aggregates.push(agg);
            aggregates.len() - 1
        }
    }
}

fn window_refusal() -> Error {
    Error::unsupported(
        "window functions",
        "Use GROUP BY with aggregates; window functions would release per-row values.",
    )
}

fn reserved_refusal() -> Error {
    Error::forbidden(
        format!("identifiers starting with {RESERVED_PREFIX} are reserved for pgdp"),
        "Rename the alias.",
    )
}

/// Refuses any identifier with the reserved prefix, anywhere in the query.
fn reject_reserved(query: &ast::Query) -> Result<()> {
    let mut found = false;
    let _ = ast::visit_expressions(query, |e| {
        let hit = match e {
            Expr::Identifier(i) => i.value.to_ascii_lowercase().starts_with(RESERVED_PREFIX),
            Expr::CompoundIdentifier(parts) => parts
                .iter()
                .any(|i| i.value.to_ascii_lowercase().starts_with(RESERVED_PREFIX)),
            _ => false,
        };
        found |= hit;
        std::ops::ControlFlow::<()>::Continue(())
    });
    if found {
        return Err(reserved_refusal());
    }
    Ok(())
}

fn default_name(expr: &Expr) -> String {
    match expr {
        Expr::Identifier(i) => i.value.to_ascii_lowercase(),
        Expr::CompoundIdentifier(p) => p
            .last()
            .map(|i| i.value.to_ascii_lowercase())
            .unwrap_or_default(),
        Expr::Function(f) => f
            .name
            .0
            .last()
            .map(|p| p.to_string().to_ascii_lowercase())
            .unwrap_or_default(),
        Expr::Nested(e) => default_name(e),
        Expr::Cast { expr, .. } => default_name(expr),
        Expr::Extract { .. } => "extract".into(),
        Expr::Floor { .. } => "floor".into(),
        Expr::Ceil { .. } => "ceil".into(),
        Expr::Case { .. } => "case".into(),
        _ => "?column?".into(),
    }
}

/// `GROUP BY 1` and `GROUP BY alias` refer to select items.
fn resolve_group_reference(g: &Expr, projection: &[SelectItem]) -> Result<Expr> {
    if let Expr::Value(v) = g {
        if let Value::Number(n, _) = &v.value {
            let i: usize = n.parse().map_err(|_| Error::Syntax {
                message: format!("invalid GROUP BY position {n}"),
            })?;
            return match projection.get(i.wrapping_sub(1)) {
                Some(SelectItem::UnnamedExpr(e))
                | Some(SelectItem::ExprWithAlias { expr: e, .. }) => Ok(e.clone()),
                _ => Err(Error::Syntax {
                    message: format!("GROUP BY position {i} is not in select list"),
                }),
            };
        }
    }
    if let Expr::Identifier(id) = g {
        for item in projection {
            if let SelectItem::ExprWithAlias { expr, alias } = item {
                if alias.value.eq_ignore_ascii_case(&id.value) {
                    return Ok(expr.clone());
                }
            }
        }
    }
    Ok(g.clone())
}

fn limit_offset(query: &ast::Query) -> Result<(Option<u64>, u64)> {
    let number = |e: &Expr| -> Result<u64> {
        match e {
            Expr::Value(v) => match &v.value {
                Value::Number(n, _) => n.parse::<u64>().map_err(|_| Error::Syntax {
                    message: "LIMIT and OFFSET take a non-negative integer".into(),
                }),
                Value::Null => Ok(u64::MAX),
                _ => Err(Error::unsupported(
                    "non-literal LIMIT / OFFSET",
                    "Use an integer literal.",
                )),
            },
            _ => Err(Error::unsupported(
                "non-literal LIMIT / OFFSET",
                "Use an integer literal.",
            )),
        }
    };
    match &query.limit_clause {
        None => Ok((None, 0)),
        Some(ast::LimitClause::LimitOffset {
            limit,
            offset,
            limit_by,
        }) => {
            if !limit_by.is_empty() {
                return Err(Error::unsupported("LIMIT BY", ""));
            }
            let l = match limit {
                Some(e) => {
                    let n = number(e)?;
                    (n != u64::MAX).then_some(n)
                }
                None => None,
            };
            let o = match offset {
                Some(o) => number(&o.value)?,
                None => 0,
            };
            Ok((l, if o == u64::MAX { 0 } else { o }))
        }
        Some(ast::LimitClause::OffsetCommaLimit { .. }) => Err(Error::unsupported(
            "LIMIT offset, count",
            "Use LIMIT … OFFSET …",
        )),
    }
}

// ---------------------------------------------------------------------------------------------
// Expressions
// ---------------------------------------------------------------------------------------------

/// Where an expression appears; decides what is allowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// WHERE or a join condition.
    Filter,
    /// A GROUP BY key or a select item matching one.
    Key,
    /// The argument of an aggregate.
    Argument,
    /// A select item or HAVING of a subquery grouped by the privacy unit: aggregates of the
    /// unit's rows are allowed, bare columns other than the unit are not.
    UnitAggregate,
}

/// What analysis learned about an expression.
#[derive(Debug, Clone)]
struct Info {
    /// Its type, when known.
    ty: Option<ColumnType>,
    /// Bounds of its value, when derivable (for aggregate arguments).
    bounds: Option<(f64, f64)>,
    /// Whether it may be a group key (uses only groupable columns).
    groupable: bool,
    /// Whether it is a constant (a literal or a parameter).
    constant: bool,
    /// Public domain, for a bare column.
    public: PublicKeys,
    /// The name of a bare column reference (for hints).
    column: Option<String>,
    /// The declared SQL type of a bare column reference.
    declared: Option<String>,
    /// Whether it reads the privacy unit (never a group key, even with a public domain).
    uses_unit: bool,
}

impl Info {
    fn constant(ty: Option<ColumnType>, value: Option<f64>) -> Info {
        Info {
            ty,
            bounds: value.map(|v| (v, v)),
            groupable: true,
            constant: true,
            public: PublicKeys::No,
            column: None,
            declared: None,
            uses_unit: false,
        }
    }

    fn derived(ty: Option<ColumnType>, parts: &[&Info], bounds: Option<(f64, f64)>) -> Info {
        Info {
            ty,
            bounds,
            groupable: parts.iter().all(|p| p.groupable),
            constant: parts.iter().all(|p| p.constant),
            public: PublicKeys::No,
            column: None,
            declared: None,
            uses_unit: parts.iter().any(|p| p.uses_unit),
        }
    }
}

struct Analyzer<'a> {
    ctx: &'a Context<'a>,
    /// FROM tables with the analyst's alias (or table name) used for qualified references. A
    /// subquery in FROM appears as a table pgdp built (`Cow::Owned`) with its own contribution
    /// bounds.
    tables: Vec<(TableRef, Cow<'a, Table>, String)>,
    /// Parameter index → inferred type and declared column type.
    parameters: BTreeMap<usize, (ColumnType, Option<String>)>,
    /// The query's `WITH` list.
    ctes: Vec<(String, ast::Query)>,
    /// Names of the CTEs being expanded (to refuse self-reference).
    expanding: Vec<String>,
    /// The next generated table alias `__dp_tN`.
    next_alias: usize,
    /// Hints for columns of subqueries whose values have no finite bounds (`view.column`).
    view_hints: BTreeMap<String, String>,
    /// Keys of unit paths read so far, which must be unique upstream ([`Plan::unique_keys`]).
    unique_keys: Vec<(String, String)>,
}

fn ident_lower(i: &Ident) -> String {
    if i.quote_style.is_some() {
        i.value.clone()
    } else {
        i.value.to_ascii_lowercase()
    }
}

fn canonical(alias: &str, column: &str) -> Expr {
    Expr::CompoundIdentifier(vec![
        Ident::with_quote('"', alias),
        Ident::with_quote('"', column),
    ])
}

impl<'a> Analyzer<'a> {
    fn find_table(&self, name: &ObjectName) -> Result<&'a Table> {
        let parts: Vec<String> = name
            .0
            .iter()
            .map(|p| {
                p.as_ident()
                    .map(ident_lower)
                    .unwrap_or_else(|| p.to_string().to_ascii_lowercase())
            })
            .collect();
        let policy = self.ctx.policy;
        let found = match parts.as_slice() {
            [schema, table] => policy.table(&format!("{schema}.{table}")),
            [table] => self
                .ctx
                .search_path
                .iter()
                .find_map(|s| policy.table(&format!("{s}.{table}"))),
            [_db, schema, table] => policy.table(&format!("{schema}.{table}")),
            _ => None,
        };
        if let Some(first) = parts.first() {
            if parts.len() >= 2 && (first == "pg_catalog" || first == "information_schema") {
                return Err(Error::unsupported(
                    "catalog queries",
                    "Catalog introspection through pgdp is not available yet; the policy (pgdp check) lists the tables.",
                ));
            }
        }
        found.ok_or_else(|| Error::UnknownTable {
            name: name.to_string(),
        })
    }

    fn fresh_alias(&mut self) -> String {
        let a = format!("{RESERVED_PREFIX}t{}", self.next_alias);
        self.next_alias += 1;
        a
    }

    /// A subquery in FROM (a derived table or a reference to a CTE) becomes a table pgdp builds,
    /// with its own SQL and contribution bounds (docs/privacy.md, "Subqueries in FROM"):
    /// - row-level (WHERE, projection of row expressions, joins under the join rules): each of
    ///   its rows is a row of one privacy unit, so it keeps the unit and the bounds of the
    ///   private tables it reads;
    /// - per unit (`GROUP BY <privacy unit>` with aggregates): one row per unit, so each unit
    ///   contributes one row to one group of the outer query; its values are aggregates of the
    ///   unit's own rows, with bounds derived from the query (LEAST / GREATEST / CASE) or the
    ///   policy, and are clamped again by the outer aggregate like any argument.
    fn view(&mut self, q: &ast::Query, visible: String) -> Result<usize> {
        if visible.starts_with(RESERVED_PREFIX) {
            return Err(reserved_refusal());
        }
        if self.tables.iter().any(|t| t.2 == visible) {
            return Err(Error::Syntax {
                message: format!("table name \"{visible}\" specified more than once"),
            });
        }
        if self.tables.len() >= JOINED_TABLES_MAX || self.next_alias >= VIEW_TABLES_MAX {
            return Err(Error::LimitExceeded {
                what: "the number of joined tables".into(),
                limit: JOINED_TABLES_MAX as u64,
            });
        }
        if q.with.is_some() {
            return Err(Error::unsupported(
                "WITH inside a subquery",
                "Move the CTEs to the top of the query.",
            ));
        }
        if q.order_by.is_some() || q.limit_clause.is_some() || q.fetch.is_some() {
            return Err(Error::unsupported(
                "ORDER BY / LIMIT inside a subquery in FROM",
                "They would pick rows by their values; filter with WHERE instead, and put ORDER BY / LIMIT on the outer query.",
            ));
        }
        if !q.locks.is_empty() {
            return Err(Error::forbidden(
                "FOR UPDATE / FOR SHARE is not allowed through pgdp",
                "",
            ));
        }
        let SetExpr::Select(select) = q.body.as_ref() else {
            return Err(Error::unsupported(
                "set operations or nested parentheses in a subquery",
                "Use one SELECT … FROM … [WHERE …] [GROUP BY <privacy unit>] per subquery.",
            ));
        };
        if select.distinct.is_some() {
            return Err(Error::unsupported(
                "SELECT DISTINCT in a subquery",
                "Aggregate per privacy unit (GROUP BY person_id) in the subquery, or use COUNT(DISTINCT col) in the outer query.",
            ));
        }
        if select.into.is_some()
            || select.qualify.is_some()
            || !select.named_window.is_empty()
            || select.top.is_some()
            || select.prewhere.is_some()
            || !select.lateral_views.is_empty()
        {
            return Err(Error::unsupported("this clause in a subquery", ""));
        }
        let saved = std::mem::take(&mut self.tables);
        let built = self.view_body(select, &visible);
        self.tables = saved;
        let (query, table) = built?;
        let r = TableRef {
            table: visible.clone(),
            alias: self.fresh_alias(),
            private: true,
            source: Some(Box::new(query)),
        };
        self.tables.push((r, Cow::Owned(table), visible));
        Ok(self.tables.len() - 1)
    }

    /// The SQL and the table of a subquery, analysed with `self.tables` holding its own FROM.
    fn view_body(&mut self, select: &ast::Select, visible: &str) -> Result<(ast::Query, Table)> {
        let joins = self.resolve_from(&select.from)?;
        if !self.tables.iter().any(|t| t.0.private) {
            return Err(Error::unsupported(
                "subqueries over public tables only",
                "Join the public table directly in the outer query.",
            ));
        }
        let unit = match self.unit()? {
            Unit::Column(c) => c,
            Unit::Row(_) => {
                return Err(Error::unsupported(
                    "subqueries over row-level private tables",
                    "Query the row-level table directly.",
                ))
            }
        };
        let filter = match &select.selection {
            Some(e) => {
                let mut e = e.clone();
                let info = self.expr(&mut e, Role::Filter)?;
                if info.ty.is_some_and(|t| t != ColumnType::Boolean) {
                    return Err(Error::Syntax {
                        message: "argument of WHERE must be type boolean".into(),
                    });
                }
                Some(e.to_string())
            }
            None => None,
        };
        let group_exprs = match &select.group_by {
            GroupByExpr::Expressions(exprs, modifiers) if modifiers.is_empty() => exprs.clone(),
            _ => {
                return Err(Error::unsupported(
                    "ROLLUP / CUBE / GROUPING SETS / GROUP BY ALL in a subquery",
                    "GROUP BY the privacy unit alone.",
                ))
            }
        };
        let per_unit = !group_exprs.is_empty()
            || select.having.is_some()
            || select.projection.iter().any(|item| match item {
                SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. } => {
                    contains_aggregate(e)
                }
                _ => false,
            });
        let per_unit_hint = "Aggregate per privacy unit, e.g. (SELECT person_id, LEAST(COUNT(*), 20) AS n FROM demo.visits GROUP BY person_id), and aggregate n in the outer query.";
        if per_unit {
            let ok = match group_exprs.as_slice() {
                [g] => {
                    let mut g = resolve_group_reference(g, &select.projection)?;
                    self.expr(&mut g, Role::Filter)?;
                    let text = g.to_string();
                    text == unit || self.is_unit_of_any_table(&text)
                }
                _ => false,
            };
            if !ok {
                return Err(Error::forbidden(
                    "a subquery in FROM that aggregates must GROUP BY the privacy unit alone",
                    per_unit_hint,
                ));
            }
        }
        let role = if per_unit {
            Role::UnitAggregate
        } else {
            Role::Argument
        };

        let mut items: Vec<(String, String)> = Vec::new();
        let mut columns: Vec<Column> = Vec::new();
        let mut unit_name: Option<String> = None;
        for item in &select.projection {
            let (expr, alias) = match item {
                SelectItem::UnnamedExpr(e) => (e, None),
                SelectItem::ExprWithAlias { expr, alias } => (expr, Some(ident_lower(alias))),
                SelectItem::Wildcard(_) | SelectItem::QualifiedWildcard(..) if per_unit => {
                    return Err(Error::unsupported(
                        "* in a subquery grouped by the privacy unit",
                        per_unit_hint,
                    ))
                }
                SelectItem::Wildcard(_) => {
                    if self.tables.len() != 1 {
                        return Err(Error::unsupported(
                            "SELECT * over a join in a subquery",
                            "List the columns, or select t.* of one table.",
                        ));
                    }
                    self.table_columns(0, &mut items, &mut columns, &mut unit_name);
                    continue;
                }
                SelectItem::QualifiedWildcard(kind, _) => {
                    let ast::SelectItemQualifiedWildcardKind::ObjectName(name) = kind else {
                        return Err(Error::unsupported("this wildcard", "List the columns."));
                    };
                    let qualifier = name
                        .0
                        .iter()
                        .map(|p| {
                            p.as_ident()
                                .map(ident_lower)
                                .unwrap_or_else(|| p.to_string().to_ascii_lowercase())
                        })
                        .collect::<Vec<_>>()
                        .join(".");
                    let idx = self
                        .tables
                        .iter()
                        .position(|(r, _, v)| *v == qualifier || r.table == qualifier)
                        .ok_or_else(|| Error::UnknownTable {
                            name: qualifier.clone(),
                        })?;
                    self.table_columns(idx, &mut items, &mut columns, &mut unit_name);
                    continue;
                }
                SelectItem::ExprWithAliases { .. } => {
                    return Err(Error::unsupported(
                        "multiple aliases for one select item",
                        "",
                    ))
                }
            };
            let name = alias.unwrap_or_else(|| default_name(expr));
            if name.starts_with(RESERVED_PREFIX) {
                return Err(reserved_refusal());
            }
            let mut e = expr.clone();
            // The unit itself (bare, possibly qualified) names the view's privacy unit.
            if let Some((idx, col)) = self.column_ref(&e)? {
                let alias_of = self.tables[idx].0.alias.clone();
                let text = canonical(&alias_of, &col).to_string();
                if text == unit || self.is_unit_of_any_table(&text) {
                    let ty = self.tables[idx]
                        .1
                        .column(&col)
                        .map(|c| (c.ty, c.declared_type.clone()))
                        .unwrap_or((ColumnType::Integer, "bigint".into()));
                    unit_name.get_or_insert(name.clone());
                    columns.push(Column {
                        name: name.clone(),
                        ty: ty.0,
                        declared_type: ty.1,
                        bounds: None,
                        groupable: false,
                        public_values: None,
                    });
                    items.push((text, name));
                    continue;
                }
            }
            let info = self.expr(&mut e, role)?;
            let bounds = info
                .bounds
                .filter(|(l, u)| l.is_finite() && u.is_finite())
                .map(|(lower, upper)| Bounds { lower, upper });
            let ty = info.ty.unwrap_or(ColumnType::Text);
            if bounds.is_none() && ty.is_numeric() && per_unit {
                self.view_hints.insert(
                    format!("{visible}.{name}"),
                    "Clamp the per-unit value with stated bounds in the subquery, e.g. LEAST(COUNT(*), 20) or LEAST(GREATEST(SUM(cost), 0), 5000).".into(),
                );
            }
            let public_values = match &info.public {
                PublicKeys::Listed(v) => Some(v.clone()),
                _ if per_unit => integer_domain(ty, bounds),
                _ => None,
            };
            columns.push(Column {
                name: name.clone(),
                ty,
                declared_type: info
                    .declared
                    .clone()
                    .unwrap_or_else(|| ty.name().to_string()),
                bounds,
                groupable: info.groupable || per_unit,
                public_values,
            });
            items.push((e.to_string(), name));
        }
        let unit_name = match unit_name {
            Some(u) => u,
            None => {
                let hidden = format!("{RESERVED_PREFIX}unit");
                items.push((unit.clone(), hidden.clone()));
                columns.push(Column {
                    name: hidden.clone(),
                    ty: ColumnType::Integer,
                    declared_type: "bigint".into(),
                    bounds: None,
                    groupable: false,
                    public_values: None,
                });
                hidden
            }
        };
        let mut names: Vec<&str> = items.iter().map(|i| i.1.as_str()).collect();
        names.sort_unstable();
        if names.windows(2).any(|w| w[0] == w[1]) {
            return Err(Error::unsupported(
                "two columns of the same name in a subquery",
                "Give the columns distinct aliases with AS.",
            ));
        }

        let having = match &select.having {
            Some(h) => {
                let mut h = h.clone();
                self.expr(&mut h, Role::UnitAggregate)?;
                Some(h.to_string())
            }
            None => None,
        };
        let (max_groups_per_unit, max_rows_per_unit) = if per_unit {
            (1, 1)
        } else {
            let caps: Vec<&PrivateTable> =
                self.tables.iter().filter_map(|t| t.1.private()).collect();
            (
                caps.iter()
                    .map(|p| p.max_groups_per_unit)
                    .max()
                    .unwrap_or(1),
                caps.iter().map(|p| p.max_rows_per_unit).max().unwrap_or(1),
            )
        };
        let refs: Vec<TableRef> = self.tables.iter().map(|t| t.0.clone()).collect();
        let from = from_clause(&refs, &joins, |q| Ok(q.to_string()))?;
        let select_list: Vec<String> = items
            .iter()
            .map(|(e, n)| format!("{e} AS \"{n}\""))
            .collect();
        let mut sql = format!("SELECT {} FROM {from}", select_list.join(", "));
        if let Some(f) = filter {
            sql.push_str(&format!(" WHERE {f}"));
        }
        if per_unit {
            sql.push_str(&format!(" GROUP BY {unit}"));
        }
        if let Some(h) = having {
            sql.push_str(&format!(" HAVING {h}"));
        }
        let dialect = sqlparser::dialect::PostgreSqlDialect {};
        let statements = sqlparser::parser::Parser::parse_sql(&dialect, &sql)
            .map_err(|e| Error::internal(format!("subquery SQL does not parse: {e}")))?;
        let query = match statements.into_iter().next() {
            Some(ast::Statement::Query(q)) => *q,
            _ => return Err(Error::internal("subquery SQL is not a query")),
        };
        let table = Table {
            schema: String::new(),
            name: visible.to_string(),
            kind: TableKind::Private(PrivateTable {
                privacy_unit: Some(unit_name),
                unit_path: None,
                max_groups_per_unit,
                max_rows_per_unit,
            }),
            columns,
        };
        Ok((query, table))
    }

    /// The declared columns of FROM table `idx`, as columns of a row-level subquery.
    fn table_columns(
        &self,
        idx: usize,
        items: &mut Vec<(String, String)>,
        columns: &mut Vec<Column>,
        unit_name: &mut Option<String>,
    ) {
        let (r, table, _) = &self.tables[idx];
        let unit = table.private().and_then(|p| p.privacy_unit.clone());
        for c in &table.columns {
            let mut c = c.clone();
            if unit.as_deref() == Some(c.name.as_str()) {
                unit_name.get_or_insert(c.name.clone());
                c.groupable = false;
            }
            items.push((canonical(&r.alias, &c.name).to_string(), c.name.clone()));
            columns.push(c);
        }
    }

    fn add_table(&mut self, factor: &TableFactor) -> Result<usize> {
        match factor {
            TableFactor::Table {
                name,
                alias,
                args,
                with_hints,
                version,
                partitions,
                sample,
                index_hints,
                ..
            } => {
                if args.is_some() {
                    return Err(Error::unsupported("table functions", ""));
                }
                if let [part] = name.0.as_slice() {
                    let cte_name = part
                        .as_ident()
                        .map(ident_lower)
                        .unwrap_or_else(|| part.to_string().to_ascii_lowercase());
                    let cte = self
                        .ctes
                        .iter()
                        .find(|(n, _)| *n == cte_name)
                        .map(|(_, q)| q.clone());
                    // Inside its own body a CTE's name means the table of that name (PostgreSQL
                    // without RECURSIVE), so only CTEs not being expanded are looked up.
                    let cte = cte.filter(|_| !self.expanding.contains(&cte_name));
                    if let Some(q) = cte {
                        let visible = match alias {
                            Some(a) if !a.columns.is_empty() => {
                                return Err(Error::unsupported("column aliases on tables", ""))
                            }
                            Some(a) => ident_lower(&a.name),
                            None => cte_name.clone(),
                        };
                        self.expanding.push(cte_name);
                        let r = self.view(&q, visible);
                        self.expanding.pop();
                        return r;
                    }
                }
                if !with_hints.is_empty()
                    || version.is_some()
                    || !partitions.is_empty()
                    || sample.is_some()
                    || !index_hints.is_empty()
                {
                    return Err(Error::unsupported("table hints, samples and versions", ""));
                }
                let table = self.find_table(name)?;
                if self.tables.len() >= JOINED_TABLES_MAX {
                    return Err(Error::LimitExceeded {
                        what: "the number of joined tables".into(),
                        limit: JOINED_TABLES_MAX as u64,
                    });
                }
                let visible = match alias {
                    Some(a) => {
                        if !a.columns.is_empty() {
                            return Err(Error::unsupported("column aliases on tables", ""));
                        }
                        ident_lower(&a.name)
                    }
                    None => table.name.clone(),
                };
                if visible.starts_with(RESERVED_PREFIX) {
                    return Err(reserved_refusal());
                }
                if self.tables.iter().any(|t| t.2 == visible) {
                    return Err(Error::Syntax {
                        message: format!("table name \"{visible}\" specified more than once"),
                    });
                }
                if let Some(path) = table.private().and_then(|p| p.unit_path.as_ref()) {
                    let (query, owned) = self.key_path_view(table, path)?;
                    let r = TableRef {
                        table: table.qualified_name(),
                        alias: self.fresh_alias(),
                        private: true,
                        source: Some(Box::new(query)),
                    };
                    self.tables.push((r, Cow::Owned(owned), visible));
                    return Ok(self.tables.len() - 1);
                }
                let r = TableRef {
                    table: table.qualified_name(),
                    alias: self.fresh_alias(),
                    private: matches!(table.kind, TableKind::Private(_)),
                    source: None,
                };
                self.tables.push((r, Cow::Borrowed(table), visible));
                Ok(self.tables.len() - 1)
            }
            TableFactor::Derived {
                lateral,
                subquery,
                alias,
                sample,
            } => {
                if *lateral || sample.is_some() {
                    return Err(Error::unsupported(
                        "LATERAL or sampled subqueries",
                        "Use a plain subquery in FROM that filters, projects or joins rows, or aggregates per privacy unit.",
                    ));
                }
                let visible = match alias {
                    Some(a) if !a.columns.is_empty() => {
                        return Err(Error::unsupported(
                            "column aliases on subqueries",
                            "Name the columns inside the subquery with AS.",
                        ))
                    }
                    Some(a) => ident_lower(&a.name),
                    None => {
                        return Err(Error::Syntax {
                            message: "subquery in FROM must have an alias".into(),
                        })
                    }
                };
                self.view(subquery, visible)
            }
            _ => Err(Error::unsupported(
                "this FROM item",
                "Use plain table names joined with JOIN … USING / ON.",
            )),
        }
    }

    /// A table whose rows reach their privacy unit through a unit path is read as a subquery
    /// that follows the path with inner joins and carries the unit under its own name
    /// (docs/privacy.md, "Tables with a unit path"):
    /// `SELECT t0.*, tN.unit FROM t t0 JOIN r1 t1 ON t0.c1 = t1.k1 … JOIN rN tN ON …`.
    /// Each key is unique upstream (recorded in [`Plan::unique_keys`] and verified before the
    /// plan runs), so each row meets at most one row of each referenced table and has at most
    /// one unit; a row whose chain is broken meets none and is not read. The subquery is then a
    /// private table with a privacy unit column like any other, with the table's own caps.
    fn key_path_view(&mut self, table: &Table, path: &UnitPath) -> Result<(ast::Query, Table)> {
        // Fresh aliases, distinct from every other table of the query.
        let aliases: Vec<String> = (0..=path.steps.len()).map(|_| self.fresh_alias()).collect();
        let alias = |i: usize| aliases[i].clone();
        let mut items: Vec<String> = table
            .columns
            .iter()
            .map(|c| format!("{} AS \"{}\"", canonical(&alias(0), &c.name), c.name))
            .collect();
        items.push(format!(
            "{} AS \"{}\"",
            canonical(&alias(path.steps.len()), &path.unit),
            path.unit
        ));
        let mut from = format!(
            "\"{}\".\"{}\" AS \"{}\"",
            table.schema,
            table.name,
            alias(0)
        );
        for (i, step) in path.steps.iter().enumerate() {
            let (schema, name) = step
                .references
                .split_once('.')
                .ok_or_else(|| Error::internal("unqualified table in a unit path"))?;
            from.push_str(&format!(
                " JOIN \"{schema}\".\"{name}\" AS \"{}\" ON {} = {}",
                alias(i + 1),
                canonical(&alias(i), &step.column),
                canonical(&alias(i + 1), &step.key)
            ));
            let key = (step.references.clone(), step.key.clone());
            if !self.unique_keys.contains(&key) {
                self.unique_keys.push(key);
            }
        }
        let sql = format!("SELECT {} FROM {from}", items.join(", "));
        let dialect = sqlparser::dialect::PostgreSqlDialect {};
        let statements = sqlparser::parser::Parser::parse_sql(&dialect, &sql)
            .map_err(|e| Error::internal(format!("unit path SQL does not parse: {e}")))?;
        let query = match statements.into_iter().next() {
            Some(ast::Statement::Query(q)) => *q,
            _ => return Err(Error::internal("unit path SQL is not a query")),
        };
        let caps = table
            .private()
            .ok_or_else(|| Error::internal("unit path on a public table"))?;
        let mut owned = table.clone();
        owned.columns.push(Column {
            name: path.unit.clone(),
            ty: ColumnType::parse(&path.unit_type).unwrap_or(ColumnType::Integer),
            declared_type: path.unit_type.clone(),
            bounds: None,
            groupable: false,
            public_values: None,
        });
        owned.kind = TableKind::Private(PrivateTable {
            privacy_unit: Some(path.unit.clone()),
            unit_path: Some(path.clone()),
            max_groups_per_unit: caps.max_groups_per_unit,
            max_rows_per_unit: caps.max_rows_per_unit,
        });
        Ok((query, owned))
    }

    /// Whether `a.ac = b.bc` is the first step of table `a`'s unit path, with `b` the policy
    /// table it references: then each row of `a` meets exactly its own parent row, which has the
    /// same privacy unit.
    fn is_path_step(&self, a: usize, ac: &str, b: usize, bc: &str) -> bool {
        let Some(step) = self.tables[a]
            .1
            .private()
            .and_then(|p| p.unit_path.as_ref())
            .and_then(|path| path.steps.first())
        else {
            return false;
        };
        let (bref, btable, _) = &self.tables[b];
        // A subquery is never the referenced table, whatever its alias: only the policy table
        // (or its own unit-path reading) has the unique key.
        let policy_table = bref.source.is_none()
            || btable
                .private()
                .is_some_and(|p| p.unit_path.is_some() && p.privacy_unit.is_some());
        step.column == ac
            && step.key == bc
            && bref.private
            && bref.table == step.references
            && policy_table
    }

    /// Resolves FROM and returns one canonical join condition per joined table.
    fn resolve_from(&mut self, from: &[ast::TableWithJoins]) -> Result<Vec<String>> {
        let [twj] = from else {
            return Err(if from.is_empty() {
                Error::unsupported("queries without FROM over data", "")
            } else {
                Error::unsupported(
                    "comma-separated FROM lists",
                    "Write the join explicitly: FROM a JOIN b USING (person_id).",
                )
            });
        };
        self.add_table(&twj.relation)?;
        let mut conditions = Vec::new();
        for join in &twj.joins {
            let constraint = match &join.join_operator {
                JoinOperator::Join(c) | JoinOperator::Inner(c) => c,
                _ => {
                    return Err(Error::unsupported(
                        "outer, cross, semi and anti joins",
                        "Use an inner JOIN on the privacy unit, or with a public table.",
                    ))
                }
            };
            let right = self.add_table(&join.relation)?;
            let condition = match constraint {
                JoinConstraint::Using(names) => {
                    let mut parts = Vec::new();
                    for n in names {
                        let col =
                            n.0.last()
                                .and_then(|p| p.as_ident())
                                .map(ident_lower)
                                .unwrap_or_default();
                        let left = (0..right)
                            .find(|&i| self.tables[i].1.column(&col).is_some())
                            .ok_or_else(|| Error::UnknownColumn { name: col.clone() })?;
                        if self.tables[right].1.column(&col).is_none() {
                            return Err(Error::UnknownColumn { name: col.clone() });
                        }
                        parts.push((left, col.clone(), right, col));
                    }
                    parts
                }
                JoinConstraint::On(e) => self.equi_join(e, right)?,
                JoinConstraint::Natural => {
                    return Err(Error::unsupported(
                        "NATURAL JOIN",
                        "Use JOIN … USING (column).",
                    ))
                }
                JoinConstraint::None => {
                    return Err(Error::unsupported(
                        "joins without a condition",
                        "Use JOIN … USING (column).",
                    ))
                }
            };
            let mut condition = condition;
            self.check_join(&mut condition, right)?;
            let text = condition
                .iter()
                .map(|(l, lc, r, rc)| {
                    format!(
                        "{} = {}",
                        canonical(&self.tables[*l].0.alias, lc),
                        canonical(&self.tables[*r].0.alias, rc)
                    )
                })
                .collect::<Vec<_>>()
                .join(" AND ");
            conditions.push(text);
        }
        Ok(conditions)
    }

    /// `a.x = b.y [AND …]` between the new table and earlier ones.
    fn equi_join(&self, e: &Expr, right: usize) -> Result<Vec<(usize, String, usize, String)>> {
        let bad = || {
            Error::unsupported(
                "join conditions other than column equalities",
                "Join with ON a.col = b.col (AND …) or USING (col).",
            )
        };
        match e {
            Expr::Nested(inner) => self.equi_join(inner, right),
            Expr::BinaryOp {
                left,
                op: BinaryOperator::And,
                right: r,
            } => {
                let mut v = self.equi_join(left, right)?;
                v.extend(self.equi_join(r, right)?);
                Ok(v)
            }
            Expr::BinaryOp {
                left,
                op: BinaryOperator::Eq,
                right: r,
            } => {
                let (lt, lc) = self.column_ref(left)?.ok_or_else(bad)?;
                let (rt, rc) = self.column_ref(r)?.ok_or_else(bad)?;
                match (lt == right, rt == right) {
                    (false, true) => Ok(vec![(lt, lc, rt, rc)]),
                    (true, false) => Ok(vec![(rt, rc, lt, lc)]),
                    _ => Err(bad()),
                }
            }
            _ => Err(bad()),
        }
    }

    /// Private tables join only on their privacy units; public tables join on anything. A table
    /// with a unit path also joins the table its path starts with on that first step (e.g.
    /// `prescriptions JOIN visits USING (visit_id)`): the rows joined have the same unit, and the
    /// equality of the units is added to the condition so the plan has the usual shape.
    fn check_join(
        &self,
        condition: &mut Vec<(usize, String, usize, String)>,
        right: usize,
    ) -> Result<()> {
        let (rref, rtable, _) = &self.tables[right];
        if !rref.private {
            return Ok(());
        }
        let unit_of = |t: &Table| t.private().and_then(|p| p.privacy_unit.clone());
        let Some(runit) = unit_of(rtable) else {
            return Err(Error::unsupported(
                "joins with a row-level private table",
                "Query a row-level table on its own, or join it only with public tables.",
            ));
        };
        let earlier_private = (0..right).filter(|&i| self.tables[i].0.private).count();
        if earlier_private == 0 {
            return Ok(());
        }
        let path_join = condition.iter().find_map(|(l, lc, r, rc)| {
            (self.is_path_step(*l, lc, *r, rc) || self.is_path_step(*r, rc, *l, lc)).then_some(*l)
        });
        if let Some(l) = path_join {
            if let Some(lunit) = unit_of(&self.tables[l].1) {
                condition.push((l, lunit, right, runit.clone()));
            }
        }
        let path_step = (0..=right).find_map(|i| {
            self.tables[i]
                .1
                .private()
                .and_then(|p| p.unit_path.as_ref())
                .and_then(|p| p.steps.first())
                .map(|s| (self.tables[i].0.table.clone(), s.clone()))
        });
        let ok = condition.iter().any(|(l, lc, _, rc)| {
            let lt: &Table = &self.tables[*l].1;
            self.tables[*l].0.private && unit_of(lt).as_deref() == Some(lc.as_str()) && rc == &runit
        });
        if ok {
            Ok(())
        } else {
            Err(Error::forbidden(
                "two private tables may be joined only on their privacy unit",
                match path_step {
                    Some((t, step)) => format!(
                        "Join on the privacy unit, e.g. JOIN {} USING ({runit}), or join {t} with {} ON {t}.{} = {}.{} (the first step of its unit path).",
                        rref.table, step.references, step.column, step.references, step.key
                    ),
                    None => format!(
                        "Join on the privacy unit, e.g. JOIN {} USING ({runit}).",
                        rref.table
                    ),
                },
            ))
        }
    }

    /// A bare or qualified column reference: (table index, column name).
    fn column_ref(&self, e: &Expr) -> Result<Option<(usize, String)>> {
        match e {
            Expr::Identifier(id) => {
                let col = ident_lower(id);
                let hits: Vec<usize> = (0..self.tables.len())
                    .filter(|&i| self.tables[i].1.column(&col).is_some())
                    .collect();
                match hits.as_slice() {
                    [] => Err(Error::UnknownColumn {
                        name: id.value.clone(),
                    }),
                    [i] => Ok(Some((*i, col))),
                    [i, ..] => {
                        // Columns equated by a join (e.g. USING (person_id)) are the same value:
                        // the first table's is taken. Others are ambiguous.
                        let is_unit = hits.iter().all(|&h| {
                            self.tables[h]
                                .1
                                .private()
                                .and_then(|p| p.privacy_unit.as_deref())
                                == Some(col.as_str())
                        });
                        if is_unit {
                            Ok(Some((*i, col)))
                        } else {
                            Err(Error::Syntax {
                                message: format!("column reference \"{col}\" is ambiguous"),
                            })
                        }
                    }
                }
            }
            Expr::CompoundIdentifier(parts) => {
                let names: Vec<String> = parts.iter().map(ident_lower).collect();
                let (qualifier, col) = match names.as_slice() {
                    [t, c] => (t.clone(), c.clone()),
                    [s, t, c] => (format!("{s}.{t}"), c.clone()),
                    _ => {
                        return Err(Error::UnknownColumn {
                            name: e.to_string(),
                        })
                    }
                };
                let idx = self
                    .tables
                    .iter()
                    .position(|(r, t, visible)| {
                        visible == &qualifier
                            || r.table == qualifier
                            || (qualifier == t.name && visible == &t.name)
                    })
                    .ok_or_else(|| Error::UnknownTable {
                        name: qualifier.clone(),
                    })?;
                if col.starts_with(RESERVED_PREFIX) {
                    return Err(reserved_refusal());
                }
                if matches!(
                    col.as_str(),
                    "ctid" | "xmin" | "xmax" | "cmin" | "cmax" | "tableoid"
                ) {
                    return Err(Error::forbidden(
                        "system columns are not available through pgdp",
                        "",
                    ));
                }
                if self.tables[idx].1.column(&col).is_none() {
                    return Err(Error::UnknownColumn { name: col });
                }
                Ok(Some((idx, col)))
            }
            _ => Ok(None),
        }
    }

    fn unit(&self) -> Result<Unit> {
        let private: Vec<&(TableRef, Cow<Table>, String)> =
            self.tables.iter().filter(|t| t.0.private).collect();
        let first = private
            .first()
            .ok_or_else(|| Error::internal("no private table"))?;
        match first.1.private().and_then(|p| p.privacy_unit.clone()) {
            Some(u) => Ok(Unit::Column(canonical(&first.0.alias, &u).to_string())),
            None => {
                if private.len() > 1 {
                    return Err(Error::unsupported("joins of row-level private tables", ""));
                }
                Ok(Unit::Row(format!("\"{}\".ctid", first.0.alias)))
            }
        }
    }

    /// Validates an expression in place (canonicalising column references) and describes it.
    fn expr(&mut self, e: &mut Expr, role: Role) -> Result<Info> {
        if let Some((idx, col)) = self.column_ref(e)? {
            let (r, table, _) = &self.tables[idx];
            let column = table
                .column(&col)
                .ok_or_else(|| Error::UnknownColumn { name: col.clone() })?;
            let unit =
                table.private().and_then(|p| p.privacy_unit.as_deref()) == Some(col.as_str());
            if role == Role::UnitAggregate && !unit {
                return Err(Error::unsupported(
                    format!("the column {col} outside an aggregate in a subquery grouped by the privacy unit"),
                    "Aggregate it per unit (e.g. MAX(age), LEAST(COUNT(*), 20)), or join the table in the outer query on the privacy unit.",
                ));
            }
            let public = if let Some(values) = &column.public_values {
                PublicKeys::Listed(values.clone())
            } else if !r.private {
                PublicKeys::Table {
                    table: r.table.clone(),
                    column: col.clone(),
                }
            } else {
                PublicKeys::No
            };
            let info = Info {
                ty: Some(column.ty),
                bounds: column.bounds.map(|b| (b.lower, b.upper)),
                groupable: (column.groupable || !r.private) && !unit,
                constant: false,
                public,
                column: Some(format!("{}.{}", r.table, col)),
                declared: Some(column.declared_type.clone()),
                uses_unit: unit,
            };
            *e = canonical(&r.alias, &col);
            return Ok(info);
        }
        let unsupported_here = |what: &str| {
            Error::unsupported(
                what.to_string(),
                "pgdp allows comparisons, AND/OR/NOT, + - * /, IN lists, BETWEEN, LIKE with a literal pattern, IS NULL, CASE and a few total functions.",
            )
        };
        match e {
            Expr::Value(v) => {
                let (ty, value) = match &v.value {
                    Value::Number(n, _) => {
                        let f: f64 = n.parse().map_err(|_| Error::Syntax { message: format!("invalid number {n}") })?;
                        // Huge literals make numeric arithmetic overflow on some rows and not
                        // others (an error that depends on the data).
                        if !f.is_finite() || f.abs() > limits::COLUMN_BOUND_ABS_MAX {
                            return Err(Error::forbidden(
                                format!("the literal {n} is too large"),
                                format!("Numeric literals must lie within ±{}.", limits::COLUMN_BOUND_ABS_MAX),
                            ));
                        }
                        let ty = if n.contains(['.', 'e', 'E']) { ColumnType::Numeric } else { ColumnType::Integer };
                        (Some(ty), Some(f))
                    }
                    Value::SingleQuotedString(_) | Value::EscapedStringLiteral(_) | Value::NationalStringLiteral(_) | Value::DollarQuotedString(_) => (None, None),
                    Value::Boolean(_) => (Some(ColumnType::Boolean), None),
                    Value::Null => (None, None),
                    Value::Placeholder(p) => {
                        if role != Role::Filter {
                            return Err(Error::unsupported(
                                "parameters outside WHERE",
                                "Parameters ($1, …) may stand for literals in WHERE only.",
                            ));
                        }
                        let index: usize = p
                            .strip_prefix('$')
                            .and_then(|n| n.parse().ok())
                            .filter(|n| *n >= 1 && *n <= 256)
                            .ok_or_else(|| Error::unsupported("this parameter syntax", "Use $1, $2, …"))?;
                        self.parameters.entry(index).or_insert((ColumnType::Text, None));
                        return Ok(Info::constant(None, None));
                    }
                    _ => return Err(unsupported_here(&format!("the literal {v}"))),
                };
                Ok(Info::constant(ty, value))
            }
            Expr::TypedString(ts) => {
                let ty = type_of_data_type(&ts.data_type).ok_or_else(|| unsupported_here("this typed literal"))?;
                // A malformed date fails upstream after the charge: check it here.
                let text = crate::literal::string_value(&ts.value.value).unwrap_or_default();
                check_temporal_text(text, ty)?;
                Ok(Info::constant(Some(ty), None))
            }
            Expr::Nested(inner) => self.expr(inner, role),
            Expr::UnaryOp { op, expr } => {
                let info = self.expr(expr, role)?;
                match op {
                    UnaryOperator::Not => Ok(Info::derived(Some(ColumnType::Boolean), &[&info], None)),
                    UnaryOperator::Minus => {
                        if !info.ty.is_none_or(|t| t.is_numeric()) {
                            return Err(unsupported_here("unary minus on non-numeric values"));
                        }
                        // -(-2147483648) overflows an integer: negate columns in numeric
                        // (literals stay as written, e.g. round(x, -1)).
                        if !info.constant {
                            **expr = as_numeric(expr.as_ref().clone(), &info);
                        }
                        let b = info.bounds.map(|(l, u)| (-u, -l));
                        let ty = info.ty.map(|t| if t == ColumnType::Integer { ColumnType::Numeric } else { t });
                        Ok(Info::derived(ty, &[&info], b))
                    }
                    UnaryOperator::Plus => Ok(info),
                    _ => Err(unsupported_here(&format!("the operator {op}"))),
                }
            }
            Expr::BinaryOp { left, op, right } => {
                let op = op.clone();
                let l = self.expr(left, role)?;
                let r = self.expr(right, role)?;
                self.infer_parameter(left, &r);
                self.infer_parameter(right, &l);
                use BinaryOperator as B;
                match op {
                    B::And | B::Or => Ok(Info::derived(Some(ColumnType::Boolean), &[&l, &r], None)),
                    B::Eq | B::NotEq | B::Lt | B::LtEq | B::Gt | B::GtEq => {
                        check_comparable(&l, &r)?;
                        // 'YYYY-MM-DD' compared with a date is read as a date by the upstream:
                        // a malformed one would fail there, after the charge.
                        check_temporal_literal(left, r.ty)?;
                        check_temporal_literal(right, l.ty)?;
                        Ok(Info::derived(Some(ColumnType::Boolean), &[&l, &r], None))
                    }
                    B::Plus | B::Minus | B::Multiply => {
                        let numeric = |i: &Info| i.ty.is_none_or(|t| t.is_numeric());
                        if !(numeric(&l) && numeric(&r)) {
                            if matches!(op, B::Plus | B::Minus) && (l.ty == Some(ColumnType::Date) || r.ty == Some(ColumnType::Date)) {
                                return Err(unsupported_here("date arithmetic"));
                            }
                            return Err(unsupported_here(&format!("the operator {op} on non-numeric values")));
                        }
                        let finite = |b: Option<(f64, f64)>| b.filter(|(x, y)| x.is_finite() && y.is_finite());
                        let bounds = match (finite(l.bounds), finite(r.bounds)) {
                            (Some((a, b)), Some((c, d))) => Some(match op {
                                B::Plus => (a + c, b + d),
                                B::Minus => (a - d, b - c),
                                _ => {
                                    let p = [a * c, a * d, b * c, b * d];
                                    (p.iter().cloned().fold(f64::INFINITY, f64::min), p.iter().cloned().fold(f64::NEG_INFINITY, f64::max))
                                }
                            }),
                            _ => None,
                        };
                        // Integer arithmetic can overflow (a data-dependent error): compute in numeric.
                        **left = as_numeric(left.as_ref().clone(), &l);
                        **right = as_numeric(right.as_ref().clone(), &r);
                        Ok(Info::derived(Some(ColumnType::Numeric), &[&l, &r], bounds))
                    }
                    B::Divide => {
                        let divisor_literal = r.constant && r.bounds.is_some_and(|(v, _)| v != 0.0);
                        let bounds = match (l.bounds.filter(|(x, y)| x.is_finite() && y.is_finite()), r.bounds) {
                            (Some((a, b)), Some((c, d))) if divisor_literal && c == d => {
                                let (x, y) = (a / c, b / c);
                                Some((x.min(y), x.max(y)))
                            }
                            _ => None,
                        };
                        // Division by zero would raise an error that depends on the data: divide
                        // by NULLIF(divisor, 0) instead, which yields NULL.
                        let divisor = as_numeric(right.as_ref().clone(), &r);
                        **left = as_numeric(left.as_ref().clone(), &l);
                        **right = nullif_zero(divisor);
                        Ok(Info::derived(Some(ColumnType::Numeric), &[&l, &r], bounds))
                    }
                    B::StringConcat => Ok(Info::derived(Some(ColumnType::Text), &[&l, &r], None)),
                    other => Err(unsupported_here(&format!("the operator {other}"))),
                }
            }
            Expr::IsNull(inner) | Expr::IsNotNull(inner) | Expr::IsTrue(inner) | Expr::IsFalse(inner) | Expr::IsNotTrue(inner) | Expr::IsNotFalse(inner) => {
                let i = self.expr(inner, role)?;
                Ok(Info::derived(Some(ColumnType::Boolean), &[&i], None))
            }
            Expr::InList { expr, list, .. } => {
                let i = self.expr(expr, role)?;
                if list.len() > limits::IN_LIST_VALUES_MAX {
                    return Err(Error::LimitExceeded { what: "the length of an IN list".into(), limit: limits::IN_LIST_VALUES_MAX as u64 });
                }
                let mut parts = vec![i.clone()];
                for item in list.iter_mut() {
                    let li = self.expr(item, role)?;
                    if !li.constant {
                        return Err(unsupported_here("IN lists of non-literals"));
                    }
                    self.infer_parameter(item, &i);
                    parts.push(li);
                }
                let refs: Vec<&Info> = parts.iter().collect();
                Ok(Info::derived(Some(ColumnType::Boolean), &refs, None))
            }
            Expr::Between { expr, low, high, .. } => {
                let i = self.expr(expr, role)?;
                let lo = self.expr(low, role)?;
                let hi = self.expr(high, role)?;
                self.infer_parameter(low, &i);
                self.infer_parameter(high, &i);
                Ok(Info::derived(Some(ColumnType::Boolean), &[&i, &lo, &hi], None))
            }
            Expr::Like { expr, pattern, escape_char, any, .. } | Expr::ILike { expr, pattern, escape_char, any, .. } => {
                if *any || escape_char.is_some() {
                    return Err(unsupported_here("LIKE ANY / ESCAPE"));
                }
                let i = self.expr(expr, role)?;
                let p = self.expr(pattern, role)?;
                if !p.constant {
                    // A pattern read from the data can be malformed (an error that depends on it).
                    return Err(unsupported_here("LIKE with a non-literal pattern"));
                }
                // The pattern must be one string literal; an odd number of trailing backslashes
                // is an error in PostgreSQL, so it is refused here, before any charge.
                let text = match pattern.as_ref() {
                    Expr::Value(v) => crate::literal::string_value(&v.value).map(str::to_string),
                    _ => None,
                };
                let Some(text) = text else {
                    return Err(unsupported_here("LIKE with a pattern that is not a single string literal"));
                };
                let trailing = text.chars().rev().take_while(|c| *c == '\\').count();
                if trailing % 2 == 1 {
                    return Err(Error::Syntax { message: "LIKE pattern must not end with escape character".into() });
                }
                Ok(Info::derived(Some(ColumnType::Boolean), &[&i, &p], None))
            }
            Expr::Case { operand, conditions, else_result, .. } => {
                let mut parts = Vec::new();
                if let Some(op) = operand {
                    parts.push(self.expr(op, role)?);
                }
                let mut bounds: Option<(f64, f64)> = None;
                let mut all_bounded = true;
                let mut ty = None;
                let merge = |b: Option<(f64, f64)>, bounds: &mut Option<(f64, f64)>, all: &mut bool| match b {
                    Some((l, u)) => *bounds = Some(bounds.map_or((l, u), |(a, c)| (a.min(l), c.max(u)))),
                    None => *all = false,
                };
                for cw in conditions.iter_mut() {
                    parts.push(self.expr(&mut cw.condition, role)?);
                    let r = self.expr(&mut cw.result, role)?;
                    merge(r.bounds, &mut bounds, &mut all_bounded);
                    ty = ty.or(r.ty);
                    parts.push(r);
                }
                if let Some(er) = else_result {
                    {
                        let r = self.expr(er, role)?;
                        if matches!(er.as_ref(), Expr::Value(v) if v.value == Value::Null) {
                            // ELSE NULL contributes nothing to sums.
                        } else {
                            merge(r.bounds, &mut bounds, &mut all_bounded);
                        }
                        ty = ty.or(r.ty);
                        parts.push(r);
                    }
                }
                let refs: Vec<&Info> = parts.iter().collect();
                let mut info = Info::derived(ty, &refs, if all_bounded { bounds } else { None });
                // Results that are all literals form a public domain: the group keys are the
                // THEN / ELSE values whatever the data (a NULL group, from a missing ELSE, is
                // not released).
                let mut results: Vec<&Expr> = conditions.iter().map(|cw| &cw.result).collect();
                if let Some(er) = else_result.as_deref() {
                    results.push(er);
                }
                if let Some(domain) = literal_domain(&results)? {
                    info.public = PublicKeys::Listed(domain);
                    // Public domain: as safe as one filtered query per literal, except that a
                    // CASE on the privacy unit stays refused as a key (policy intent).
                    info.groupable = !info.uses_unit;
                }
                Ok(info)
            }
            Expr::Cast { expr, data_type, kind, format, .. } => {
                if format.is_some() {
                    return Err(unsupported_here("CAST … FORMAT"));
                }
                let _ = kind;
                let i = self.expr(expr, role)?;
                let target = type_of_data_type(data_type).ok_or_else(|| unsupported_here(&format!("casts to {data_type}")))?;
                check_temporal_literal(expr, Some(target))?;
                // Casts of literals are constant (they fail or not regardless of the data);
                // casts of columns must be total.
                // Only casts that cannot fail: to text, and to the widest type of a family
                // (bigint, unconstrained numeric, double precision); never narrowing.
                use ast::DataType as D;
                let widest = match data_type {
                    D::BigInt(_) | D::Int8(_) => Some(ColumnType::Integer),
                    D::Numeric(ast::ExactNumberInfo::None) | D::Decimal(ast::ExactNumberInfo::None) => {
                        Some(ColumnType::Numeric)
                    }
                    D::Float8 | D::DoublePrecision | D::Double(_) => Some(ColumnType::Float),
                    D::Date => Some(ColumnType::Date),
                    D::Boolean | D::Bool => Some(ColumnType::Boolean),
                    _ => None,
                };
                let total = i.constant
                    || target == ColumnType::Text
                    || (i.ty == Some(target) && widest == Some(target))
                    || (i.ty == Some(ColumnType::Integer)
                        && matches!(widest, Some(ColumnType::Numeric | ColumnType::Float)));
                if !total {
                    return Err(Error::forbidden(
                        format!("the cast of {} to {data_type} can fail on some values", i.column.as_deref().unwrap_or("this expression")),
                        "Casts that can fail would reveal data through errors; compare with a literal of the column's own type instead.",
                    ));
                }
                let bounds = if target.is_numeric() { i.bounds } else { None };
                Ok(Info { ty: Some(target), bounds, groupable: i.groupable, constant: i.constant, public: PublicKeys::No, column: None, declared: None, uses_unit: i.uses_unit })
            }
            Expr::Extract { field, expr, .. } => {
                let i = self.expr(expr, role)?;
                if !matches!(i.ty, Some(ColumnType::Date | ColumnType::Timestamp) | None) {
                    return Err(unsupported_here("EXTRACT from a non-date value"));
                }
                let field_name = field.to_string().to_ascii_lowercase();
                let bounds = match field_name.as_str() {
                    "month" => Some((1.0, 12.0)),
                    "day" => Some((1.0, 31.0)),
                    "dow" => Some((0.0, 6.0)),
                    "isodow" => Some((1.0, 7.0)),
                    "quarter" => Some((1.0, 4.0)),
                    "hour" => Some((0.0, 23.0)),
                    "doy" => Some((1.0, 366.0)),
                    "week" => Some((1.0, 53.0)),
                    "year" | "isoyear" | "minute" | "second" | "epoch" | "decade" | "century" => None,
                    _ => return Err(unsupported_here(&format!("EXTRACT({field_name} …)"))),
                };
                Ok(Info::derived(Some(ColumnType::Numeric), &[&i], bounds))
            }
            Expr::Function(f) => self.function(f, role),
            // sqlparser reads FLOOR(x) and CEIL(x) as special syntax (for `CEIL(x TO DAY)`);
            // the plain one-argument forms are the total functions and go through the same
            // checks as any other function call. `FLOOR(x, n)` and `… TO field` are not
            // PostgreSQL and stay refused.
            Expr::Floor { expr, field } | Expr::Ceil { expr, field }
                if *field
                    == ast::CeilFloorKind::DateTimeField(ast::DateTimeField::NoDateTime) =>
            {
                let argument = expr.as_ref().clone();
                let name = if matches!(e, Expr::Floor { .. }) {
                    "floor"
                } else {
                    "ceil"
                };
                let mut call = function_call(name, vec![argument]);
                let info = self.function(&mut call, role)?;
                *e = Expr::Function(call);
                Ok(info)
            }
            Expr::Floor { .. } | Expr::Ceil { .. } => Err(Error::unsupported(
                "FLOOR / CEIL with a scale or a TO field",
                "Use floor(x) or ceil(x) with one argument, round(x, n) for decimal places, or date_trunc for dates.",
            )),
            Expr::Subquery(_) | Expr::Exists { .. } | Expr::InSubquery { .. } => Err(Error::unsupported(
                "subqueries",
                "Subqueries over private data are not supported; use a join on the privacy unit or a public table.",
            )),
            other => Err(unsupported_here(&format!("the expression {other}"))),
        }
    }

    /// A parameter compared with a typed expression takes that type.
    fn infer_parameter(&mut self, e: &Expr, other: &Info) {
        if let (Expr::Value(v), Some(ty)) = (e, other.ty) {
            if let Value::Placeholder(p) = &v.value {
                if let Some(i) = p.strip_prefix('$').and_then(|n| n.parse::<usize>().ok()) {
                    self.parameters.insert(i, (ty, other.declared.clone()));
                }
            }
        }
    }

    fn function(&mut self, f: &mut ast::Function, role: Role) -> Result<Info> {
        if f.over.is_some() {
            return Err(window_refusal());
        }
        if f.filter.is_some() || !f.within_group.is_empty() || f.null_treatment.is_some() {
            return Err(Error::unsupported(
                "FILTER / WITHIN GROUP",
                "Move the condition into WHERE.",
            ));
        }
        let name = function_name(&f.name)?;
        if aggregate_kind(&name).is_some() && role == Role::UnitAggregate {
            return self.unit_aggregate(f, &name);
        }
        if aggregate_kind(&name).is_some() {
            return Err(Error::unsupported(
                "aggregates inside expressions",
                "Aggregates may appear only at the top of a select item, in HAVING or in ORDER BY.",
            ));
        }
        let Some(spec) = total_function(&name) else {
            return Err(Error::UnknownFunction {
                name: f.name.to_string(),
                hint: "pgdp allows only functions that never fail and do not depend on time or randomness: lower, upper, length, abs, round, floor, ceil, coalesce, nullif, greatest, least, date_trunc, date_part, trim.".into(),
            });
        };
        let args = match &mut f.args {
            FunctionArguments::List(list) => {
                if list.duplicate_treatment.is_some() || !list.clauses.is_empty() {
                    return Err(Error::unsupported(
                        "DISTINCT or clauses in function arguments",
                        "",
                    ));
                }
                &mut list.args
            }
            FunctionArguments::None => {
                return Err(Error::UnknownFunction {
                    name: name.clone(),
                    hint: String::new(),
                })
            }
            FunctionArguments::Subquery(_) => return Err(Error::unsupported("subqueries", "")),
        };
        if args.len() < spec.min_args || args.len() > spec.max_args {
            return Err(Error::UnknownFunction {
                name: format!("{name} with {} argument(s)", args.len()),
                hint: String::new(),
            });
        }
        let mut infos = Vec::new();
        for (i, a) in args.iter_mut().enumerate() {
            let FunctionArg::Unnamed(FunctionArgExpr::Expr(e)) = a else {
                return Err(Error::unsupported(
                    "named or wildcard function arguments",
                    "",
                ));
            };
            let info = self.expr(e, role)?;
            if spec.literal_args.contains(&i) && !info.constant {
                return Err(Error::unsupported(
                    format!("a non-literal argument {} to {name}", i + 1),
                    "This argument must be a literal (a value from the data could make it fail).",
                ));
            }
            if i == 0 && matches!(name.as_str(), "date_trunc" | "date_part") {
                check_date_unit(&name, e)?;
            }
            if name == "round" && i == 1 {
                // round(x, n) with a huge n is slow and can fail; keep it to sane digits.
                if info.bounds.is_none_or(|(l, u)| l < -20.0 || u > 20.0) {
                    return Err(Error::unsupported(
                        "round() to more than 20 digits",
                        "Use round(x, n) with -20 ≤ n ≤ 20.",
                    ));
                }
            }
            infos.push(info);
        }
        if name == "abs" {
            // abs(-2147483648) overflows an integer: compute in numeric.
            if let (Some(FunctionArg::Unnamed(FunctionArgExpr::Expr(e))), Some(info)) =
                (args.first_mut(), infos.first())
            {
                *e = as_numeric(e.clone(), info);
            }
        }
        let refs: Vec<&Info> = infos.iter().collect();
        let ty = match spec.result {
            Result_::Same(i) => infos.get(i).and_then(|x| x.ty),
            Result_::Fixed(t) => Some(t),
        };
        let bounds = match name.as_str() {
            "abs" => infos[0].bounds.map(|(l, u)| {
                if l >= 0.0 {
                    (l, u)
                } else if u <= 0.0 {
                    (-u, -l)
                } else {
                    (0.0, u.max(-l))
                }
            }),
            "round" | "floor" | "ceil" | "ceiling" | "trunc" => {
                infos[0].bounds.map(|(l, u)| (l.floor(), u.ceil()))
            }
            "greatest" | "least" | "coalesce" => {
                // An argument without bounds ranges over everything; GREATEST / LEAST ignore
                // NULLs, so the result lies between the extreme bounds of the arguments, and
                // LEAST(x, k) ≤ k, GREATEST(x, k) ≥ k whatever x is.
                let v: Vec<(f64, f64)> = infos
                    .iter()
                    .map(|i| i.bounds.unwrap_or((f64::NEG_INFINITY, f64::INFINITY)))
                    .collect();
                let min_lo = v.iter().map(|b| b.0).fold(f64::INFINITY, f64::min);
                let max_lo = v.iter().map(|b| b.0).fold(f64::NEG_INFINITY, f64::max);
                let min_hi = v.iter().map(|b| b.1).fold(f64::INFINITY, f64::min);
                let max_hi = v.iter().map(|b| b.1).fold(f64::NEG_INFINITY, f64::max);
                let b = match name.as_str() {
                    "least" => (min_lo, min_hi),
                    "greatest" => (max_lo, max_hi),
                    _ => (min_lo, max_hi),
                };
                (!b.0.is_nan() && !b.1.is_nan()).then_some(b)
            }
            "nullif" => infos[0].bounds,
            "date_part" => Some((f64::MIN / 4.0, f64::MAX / 4.0)).filter(|_| false),
            _ => None,
        };
        // Qualify as pg_catalog so a search_path can never substitute another function; the SQL
        // constructs that look like functions (COALESCE, NULLIF, GREATEST, LEAST) cannot be
        // qualified and cannot be shadowed. Names that sqlparser reads as special syntax even
        // after `pg_catalog.` (FLOOR, CEIL) are quoted, so the rewrite re-parses.
        f.name = if matches!(name.as_str(), "coalesce" | "nullif" | "greatest" | "least") {
            ObjectName::from(vec![Ident::new(name.to_ascii_uppercase())])
        } else if matches!(name.as_str(), "floor" | "ceil" | "ceiling") {
            ObjectName::from(vec![
                Ident::new("pg_catalog"),
                Ident::with_quote('"', name.clone()),
            ])
        } else {
            ObjectName::from(vec![Ident::new("pg_catalog"), Ident::new(name.clone())])
        };
        Ok(Info::derived(ty, &refs, bounds))
    }

    /// An aggregate select item, or None if the expression is not an aggregate.
    fn aggregate(&mut self, expr: &Expr) -> Result<Option<Aggregate>> {
        let e = match expr {
            Expr::Nested(inner) => inner.as_ref(),
            other => other,
        };
        let Expr::Function(f) = e else {
            if contains_aggregate(e) {
                return Err(Error::unsupported(
                    "expressions over aggregates in the select list",
                    "Select the aggregates themselves (e.g. SUM(x), COUNT(*)) and combine them in your client.",
                ));
            }
            return Ok(None);
        };
        let name = function_name(&f.name)?;
        let Some(kind) = aggregate_kind(&name) else {
            if contains_aggregate(e) {
                return Err(Error::unsupported(
                    "functions of aggregates in the select list",
                    "Select the aggregate itself and round or transform it in your client.",
                ));
            }
            return Ok(None);
        };
        if f.over.is_some() {
            return Err(window_refusal());
        }
        if let AggregateKind::Quantile { .. } = kind {
            return self.quantile_aggregate(f, &name).map(Some);
        }
        if f.filter.is_some() || !f.within_group.is_empty() {
            return Err(Error::unsupported(
                "FILTER / WITHIN GROUP",
                "Move the condition into WHERE, or use CASE inside the aggregate.",
            ));
        }
        let FunctionArguments::List(list) = &f.args else {
            return Err(Error::Syntax {
                message: format!("{name} needs an argument"),
            });
        };
        if !list.clauses.is_empty() {
            return Err(Error::unsupported("ORDER BY / LIMIT inside aggregates", ""));
        }
        let distinct = matches!(
            list.duplicate_treatment,
            Some(ast::DuplicateTreatment::Distinct)
        );
        let [arg] = list.args.as_slice() else {
            return Err(Error::Syntax {
                message: format!("{name} takes exactly one argument"),
            });
        };
        let arg_expr = match arg {
            FunctionArg::Unnamed(FunctionArgExpr::Wildcard) => {
                if kind != AggregateKind::CountRows || distinct {
                    return Err(Error::Syntax {
                        message: format!("{name}(*) is not valid"),
                    });
                }
                return Ok(Some(Aggregate {
                    kind: AggregateKind::CountRows,
                    argument: None,
                    bounds: None,
                    text: "count(*)".into(),
                }));
            }
            FunctionArg::Unnamed(FunctionArgExpr::Expr(e)) => e.clone(),
            _ => return Err(Error::unsupported("named aggregate arguments", "")),
        };
        let mut arg_expr = arg_expr;
        let info = self.expr(&mut arg_expr, Role::Argument)?;
        let text = arg_expr.to_string();
        if distinct {
            let unit = self.unit()?;
            let is_unit =
                matches!(&unit, Unit::Column(u) if *u == text) || self.is_unit_of_any_table(&text);
            if kind == AggregateKind::CountRows && is_unit {
                return Ok(Some(Aggregate {
                    kind: AggregateKind::CountUnits,
                    argument: None,
                    bounds: None,
                    text: "count(distinct unit)".into(),
                }));
            }
            if kind == AggregateKind::CountRows {
                // Each unit's distinct values per group are capped at max_rows_per_unit.
                return Ok(Some(Aggregate {
                    kind: AggregateKind::CountDistinct,
                    argument: Some(text.clone()),
                    bounds: None,
                    text: format!("count(distinct {text})"),
                }));
            }
            return Err(Error::unsupported(
                format!("{name}(DISTINCT …)"),
                "Use COUNT(DISTINCT col), or aggregate per privacy unit in a subquery first.",
            ));
        }
        if kind == AggregateKind::CountRows {
            return Ok(Some(Aggregate {
                kind: AggregateKind::CountValues,
                argument: Some(text.clone()),
                bounds: None,
                text: format!("count({text})"),
            }));
        }
        if !info.ty.is_none_or(|t| t.is_numeric()) {
            return Err(Error::Syntax {
                message: format!("function {name} needs a numeric argument"),
            });
        }
        let bounds = self.checked_bounds(&info, &text, &name)?;
        Ok(Some(Aggregate {
            kind,
            argument: Some(text.clone()),
            bounds: Some(bounds),
            text: format!("{}({text})", kind.sql_name()),
        }))
    }

    /// An aggregate of one unit's rows inside a subquery grouped by the privacy unit. Its bounds
    /// follow from the argument's (`±∞` where the data could make it grow without limit, e.g.
    /// `COUNT(*)`); the analyst states finite ones with LEAST / GREATEST / CASE.
    fn unit_aggregate(&mut self, f: &mut ast::Function, name: &str) -> Result<Info> {
        let hint = "Use COUNT, SUM, AVG, MIN or MAX of the unit's rows inside a subquery grouped by the privacy unit.";
        if !matches!(name, "count" | "sum" | "avg" | "min" | "max") {
            return Err(Error::unsupported(format!("{name} per privacy unit"), hint));
        }
        let FunctionArguments::List(list) = &mut f.args else {
            return Err(Error::Syntax {
                message: format!("{name} needs an argument"),
            });
        };
        if !list.clauses.is_empty() {
            return Err(Error::unsupported("ORDER BY / LIMIT inside aggregates", ""));
        }
        let distinct = match list.duplicate_treatment {
            None | Some(ast::DuplicateTreatment::All) => false,
            Some(ast::DuplicateTreatment::Distinct) if name == "count" => true,
            Some(ast::DuplicateTreatment::Distinct) => {
                return Err(Error::unsupported(
                    format!("{name}(DISTINCT …) per unit"),
                    hint,
                ))
            }
        };
        let _ = distinct;
        let [arg] = list.args.as_mut_slice() else {
            return Err(Error::Syntax {
                message: format!("{name} takes exactly one argument"),
            });
        };
        let arg_info = match arg {
            FunctionArg::Unnamed(FunctionArgExpr::Wildcard) if name == "count" => None,
            FunctionArg::Unnamed(FunctionArgExpr::Expr(e)) => Some(self.expr(e, Role::Argument)?),
            _ => return Err(Error::unsupported("this aggregate argument", hint)),
        };
        let inf = f64::INFINITY;
        let (ty, bounds) = match (name, &arg_info) {
            ("count", _) => (ColumnType::Integer, (0.0, inf)),
            (_, None) => {
                return Err(Error::Syntax {
                    message: format!("{name}(*) is not valid"),
                })
            }
            (_, Some(i)) => {
                if !i.ty.is_none_or(|t| t.is_numeric()) && name != "min" && name != "max" {
                    return Err(Error::Syntax {
                        message: format!("function {name} needs a numeric argument"),
                    });
                }
                let (lo, hi) = i.bounds.unwrap_or((-inf, inf));
                match name {
                    "sum" => {
                        let b = (
                            if lo >= 0.0 { 0.0 } else { -inf },
                            if hi <= 0.0 { 0.0 } else { inf },
                        );
                        let ty = if i.ty == Some(ColumnType::Integer) {
                            ColumnType::Integer
                        } else {
                            ColumnType::Numeric
                        };
                        (ty, b)
                    }
                    "avg" => (ColumnType::Numeric, (lo, hi)),
                    _ => (i.ty.unwrap_or(ColumnType::Numeric), (lo, hi)),
                }
            }
        };
        f.name = ObjectName::from(vec![Ident::new("pg_catalog"), Ident::new(name)]);
        Ok(Info {
            ty: Some(ty),
            bounds: Some(bounds),
            groupable: true,
            constant: false,
            public: PublicKeys::No,
            column: None,
            declared: None,
            uses_unit: false,
        })
    }

    /// A quantile aggregate: `MIN`, `MAX`, `MEDIAN(x)`, `PERCENTILE_CONT(p) / PERCENTILE_DISC(p)
    /// WITHIN GROUP (ORDER BY x)` of a bounded argument.
    fn quantile_aggregate(&mut self, f: &ast::Function, name: &str) -> Result<Aggregate> {
        if f.filter.is_some() {
            return Err(Error::unsupported(
                "FILTER",
                "Move the condition into WHERE, or use CASE inside the aggregate.",
            ));
        }
        let FunctionArguments::List(list) = &f.args else {
            return Err(Error::Syntax {
                message: format!("{name} needs an argument"),
            });
        };
        if list.duplicate_treatment.is_some() || !list.clauses.is_empty() {
            return Err(Error::unsupported(
                format!("DISTINCT or ORDER BY inside {name}"),
                "",
            ));
        }
        let one_arg = || match list.args.as_slice() {
            [FunctionArg::Unnamed(FunctionArgExpr::Expr(e))] => Ok(e.clone()),
            _ => Err(Error::Syntax {
                message: format!("{name} takes exactly one argument"),
            }),
        };
        let (arg, permille) = match name {
            "min" | "max" | "median" => {
                if !f.within_group.is_empty() {
                    return Err(Error::Syntax {
                        message: format!("{name} does not take WITHIN GROUP"),
                    });
                }
                let permille = match name {
                    "min" => crate::dp::mechanism::MIN_PERMILLE,
                    "max" => crate::dp::mechanism::MAX_PERMILLE,
                    _ => 500,
                };
                (one_arg()?, permille)
            }
            _ => {
                let p = one_arg()?;
                let fraction = match &p {
                    Expr::Value(v) => match &v.value {
                        Value::Number(n, _) => n.parse::<f64>().ok(),
                        _ => None,
                    },
                    _ => None,
                }
                .filter(|x| (0.0..=1.0).contains(x))
                .ok_or_else(|| Error::InvalidParameter {
                    name: format!("the fraction of {name}"),
                    reason: "is not a literal between 0 and 1".into(),
                    hint: "Write e.g. PERCENTILE_CONT(0.9) WITHIN GROUP (ORDER BY cost).".into(),
                })?;
                let [ob] = f.within_group.as_slice() else {
                    return Err(Error::Syntax {
                        message: format!("{name} needs WITHIN GROUP (ORDER BY x)"),
                    });
                };
                let permille = (fraction * 1000.0).round() as u16;
                let permille = match &ob.options.sort {
                    Some(ast::OrderBySort::Desc) => 1000 - permille,
                    None | Some(ast::OrderBySort::Asc) => permille,
                    Some(ast::OrderBySort::Using(_)) => {
                        return Err(Error::unsupported("ORDER BY … USING", "Use ASC or DESC."))
                    }
                };
                (ob.expr.clone(), permille)
            }
        };
        let mut arg = arg;
        let info = self.expr(&mut arg, Role::Argument)?;
        let text = arg.to_string();
        if !info.ty.is_none_or(|t| t.is_numeric()) {
            return Err(Error::unsupported(
                format!("{name} of a non-numeric value"),
                "DP quantiles are computed over numeric columns with declared bounds; for dates, aggregate EXTRACT(year FROM d) or similar.",
            ));
        }
        let bounds = self.checked_bounds(&info, &text, name)?;
        Ok(Aggregate {
            kind: AggregateKind::Quantile { permille },
            argument: Some(text.clone()),
            bounds: Some(bounds),
            text: format!("quantile_{permille}({text})"),
        })
    }

    /// The finite bounds of an aggregate argument, or a refusal that says how to get them.
    fn checked_bounds(&self, info: &Info, text: &str, name: &str) -> Result<Bounds> {
        let finite = info.bounds.filter(|(l, u)| l.is_finite() && u.is_finite());
        let Some((lower, upper)) = finite else {
            let hint = match &info.column {
                Some(c) => match self.view_hints.get(c) {
                    Some(h) => h.clone(),
                    None => format!("Declare bounds for column {c} in the policy (lower and upper)."),
                },
                None if info.bounds.is_some() => "Clamp the expression with stated bounds, e.g. LEAST(GREATEST(x, 0), 100), or use columns with declared bounds.".into(),
                None => "Use a column with declared bounds (lower/upper in the policy), or arithmetic of such columns with literals.".into(),
            };
            return Err(Error::forbidden(
                format!("the bounds of {text} are not known, so {name} cannot be released"),
                hint,
            ));
        };
        if lower.abs().max(upper.abs()) > limits::COLUMN_BOUND_ABS_MAX {
            return Err(Error::forbidden(
                format!("the derived bounds of {text} are too large"),
                format!(
                    "Derived bounds must lie within ±{}.",
                    limits::COLUMN_BOUND_ABS_MAX
                ),
            ));
        }
        Ok(if lower == upper {
            Bounds {
                lower: lower - 0.5,
                upper: upper + 0.5,
            }
        } else {
            Bounds { lower, upper }
        })
    }

    fn is_unit_of_any_table(&self, text: &str) -> bool {
        self.tables.iter().any(|(r, t, _)| {
            t.private()
                .and_then(|p| p.privacy_unit.as_deref())
                .is_some_and(|u| canonical(&r.alias, u).to_string() == text)
        })
    }

    /// A HAVING / ORDER BY expression over released values.
    fn post(
        &mut self,
        e: &Expr,
        keys: &[GroupKey],
        aggregates: &mut Vec<Aggregate>,
        outputs: &[Output],
        allow_position: bool,
    ) -> Result<Post> {
        let by_output = |name: &str| {
            outputs
                .iter()
                .find(|o| o.name.eq_ignore_ascii_case(name))
                .map(|o| match o.source {
                    OutputSource::Key(i) => Post::Key(i),
                    OutputSource::Aggregate(i) => Post::Aggregate(i),
                })
        };
        match e {
            Expr::Nested(inner) => self.post(inner, keys, aggregates, outputs, allow_position),
            Expr::Value(v) => match &v.value {
                Value::Number(n, _) => {
                    if allow_position {
                        let i: usize = n.parse().map_err(|_| Error::Syntax {
                            message: format!("invalid ORDER BY position {n}"),
                        })?;
                        let o = outputs
                            .get(i.wrapping_sub(1))
                            .ok_or_else(|| Error::Syntax {
                                message: format!("ORDER BY position {i} is not in select list"),
                            })?;
                        return Ok(match o.source {
                            OutputSource::Key(k) => Post::Key(k),
                            OutputSource::Aggregate(a) => Post::Aggregate(a),
                        });
                    }
                    Ok(Post::Number(n.parse().map_err(|_| Error::Syntax {
                        message: format!("invalid number {n}"),
                    })?))
                }
                Value::SingleQuotedString(s) => Ok(Post::Text(s.clone())),
                Value::DollarQuotedString(d) => Ok(Post::Text(d.value.clone())),
                Value::Null => Ok(Post::Null),
                _ => Err(Error::unsupported(
                    format!("the literal {v} in HAVING / ORDER BY"),
                    "",
                )),
            },
            Expr::Identifier(id) if by_output(&id.value).is_some() => {
                by_output(&id.value).ok_or_else(|| Error::internal("output vanished"))
            }
            Expr::UnaryOp {
                op: UnaryOperator::Not,
                expr,
            } => Ok(Post::Not(Box::new(
                self.post(expr, keys, aggregates, outputs, false)?,
            ))),
            Expr::UnaryOp {
                op: UnaryOperator::Minus,
                expr,
            } => Ok(Post::Negate(Box::new(
                self.post(expr, keys, aggregates, outputs, false)?,
            ))),
            Expr::IsNull(inner) => Ok(Post::IsNull(
                Box::new(self.post(inner, keys, aggregates, outputs, false)?),
                true,
            )),
            Expr::IsNotNull(inner) => Ok(Post::IsNull(
                Box::new(self.post(inner, keys, aggregates, outputs, false)?),
                false,
            )),
            Expr::BinaryOp { left, op, right } => {
                use BinaryOperator as B;
                let op = match op {
                    B::Eq => PostOp::Eq,
                    B::NotEq => PostOp::NotEq,
                    B::Lt => PostOp::Lt,
                    B::LtEq => PostOp::LtEq,
                    B::Gt => PostOp::Gt,
                    B::GtEq => PostOp::GtEq,
                    B::And => PostOp::And,
                    B::Or => PostOp::Or,
                    B::Plus => PostOp::Plus,
                    B::Minus => PostOp::Minus,
                    B::Multiply => PostOp::Multiply,
                    B::Divide => PostOp::Divide,
                    other => {
                        return Err(Error::unsupported(
                            format!("the operator {other} in HAVING / ORDER BY"),
                            "",
                        ))
                    }
                };
                let l = self.post(left, keys, aggregates, outputs, false)?;
                let r = self.post(right, keys, aggregates, outputs, false)?;
                Ok(Post::Binary(Box::new(l), op, Box::new(r)))
            }
            _ => {
                if let Some(agg) = self.aggregate(e)? {
                    // An aggregate not in the select list is released (and paid for) too.
                    let i = push_aggregate(aggregates, agg);
                    return Ok(Post::Aggregate(i));
                }
                let mut c = e.clone();
                self.expr(&mut c, Role::Key)?;
                let text = c.to_string();
                keys.iter().position(|k| k.expr == text).map(Post::Key).ok_or_else(|| {
                    Error::forbidden(
                        format!("{e} in HAVING / ORDER BY must be a group key, an output column or an aggregate"),
                        "HAVING and ORDER BY are applied by pgdp to the released (noisy) rows.",
                    )
                })
            }
        }
    }
}

/// The domain of a CASE whose results are all literals of one kind (strings, or integers), as
/// the text PostgreSQL prints for them; `None` if some result is not such a literal.
fn literal_domain(results: &[&Expr]) -> Result<Option<Vec<String>>> {
    let mut strings = Vec::new();
    let mut integers = Vec::new();
    for r in results {
        let Expr::Value(v) = r else { return Ok(None) };
        match &v.value {
            Value::Number(n, _) => match n.parse::<i64>() {
                Ok(i) => integers.push(i.to_string()),
                Err(_) => return Ok(None),
            },
            Value::Null => {}
            other => match crate::literal::string_value(other) {
                Some(t) => strings.push(t.to_string()),
                None => return Ok(None),
            },
        }
    }
    if !strings.is_empty() && !integers.is_empty() {
        // PostgreSQL would fail on this CASE (after the charge): refuse it before.
        return Err(Error::Syntax {
            message: "CASE types text and integer cannot be matched".into(),
        });
    }
    let mut domain = if strings.is_empty() {
        integers
    } else {
        strings
    };
    domain.sort();
    domain.dedup();
    Ok((!domain.is_empty()).then_some(domain))
}

/// The unit of date_trunc / field of date_part must be one PostgreSQL knows, or the upstream
/// would fail (after the charge).
fn check_date_unit(name: &str, e: &Expr) -> Result<()> {
    let text = match e {
        Expr::Value(v) => crate::literal::string_value(&v.value)
            .unwrap_or_default()
            .to_ascii_lowercase(),
        _ => String::new(),
    };
    let units: &[&str] = &[
        "microseconds",
        "milliseconds",
        "second",
        "minute",
        "hour",
        "day",
        "week",
        "month",
        "quarter",
        "year",
        "decade",
        "century",
        "millennium",
    ];
    let fields: &[&str] = &["dow", "doy", "isodow", "isoyear", "epoch", "julian"];
    let ok =
        units.contains(&text.as_str()) || (name == "date_part" && fields.contains(&text.as_str()));
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidParameter {
            name: format!("the first argument of {name}"),
            reason: "is not a unit PostgreSQL knows".into(),
            hint: "Use a quoted unit such as 'day', 'week', 'month', 'quarter' or 'year'.".into(),
        })
    }
}

/// Refuses comparisons PostgreSQL would reject for their types (text with numbers, …): they
/// would fail upstream only after the charge.
fn check_comparable(l: &Info, r: &Info) -> Result<()> {
    use ColumnType as T;
    let family = |t: T| match t {
        T::Integer | T::Numeric | T::Float => 0,
        T::Text => 1,
        T::Date | T::Timestamp => 2,
        T::Boolean => 3,
    };
    match (l.ty, r.ty) {
        (Some(a), Some(b)) if family(a) != family(b) => Err(Error::UnknownFunction {
            name: format!("operator for {} and {}", a.name(), b.name()),
            hint: "Compare values of the same kind, e.g. a text column with a quoted string."
                .into(),
        }),
        _ => Ok(()),
    }
}

/// Wraps an integer-typed operand in a numeric cast so arithmetic cannot overflow.
fn as_numeric(e: Expr, info: &Info) -> Expr {
    // Integer and float arithmetic overflow raise errors; numeric does not in practice.
    if matches!(info.ty, Some(ColumnType::Integer | ColumnType::Float)) {
        Expr::Cast {
            kind: ast::CastKind::Cast,
            expr: Box::new(Expr::Nested(Box::new(e))),
            data_type: ast::DataType::Numeric(ast::ExactNumberInfo::None),
            format: None,
        }
    } else {
        e
    }
}

fn nullif_zero(e: Expr) -> Expr {
    Expr::Function(function_call(
        "NULLIF",
        vec![e, Expr::value(Value::Number("0".into(), false))],
    ))
}

/// A plain call `name(args…)`.
fn function_call(name: &str, args: Vec<Expr>) -> ast::Function {
    ast::Function {
        name: ObjectName::from(vec![Ident::new(name)]),
        uses_odbc_syntax: false,
        parameters: FunctionArguments::None,
        args: FunctionArguments::List(ast::FunctionArgumentList {
            duplicate_treatment: None,
            args: args
                .into_iter()
                .map(|a| FunctionArg::Unnamed(FunctionArgExpr::Expr(a)))
                .collect(),
            clauses: vec![],
        }),
        filter: None,
        null_treatment: None,
        over: None,
        within_group: vec![],
    }
}

fn function_name(name: &ObjectName) -> Result<String> {
    let parts: Vec<String> = name
        .0
        .iter()
        .map(|p| p.to_string().to_ascii_lowercase())
        .collect();
    match parts.as_slice() {
        [n] => Ok(n.clone()),
        [schema, n] if schema == "pg_catalog" => Ok(n.clone()),
        _ => Err(Error::UnknownFunction {
            name: name.to_string(),
            hint: "User-defined functions are not available through pgdp.".into(),
        }),
    }
}

fn aggregate_kind(name: &str) -> Option<AggregateKind> {
    Some(match name {
        "count" => AggregateKind::CountRows,
        "sum" => AggregateKind::Sum,
        "avg" => AggregateKind::Avg,
        "variance" | "var_samp" => AggregateKind::VarSamp,
        "var_pop" => AggregateKind::VarPop,
        "stddev" | "stddev_samp" => AggregateKind::StddevSamp,
        "stddev_pop" => AggregateKind::StddevPop,
        "min" | "max" | "median" | "percentile_cont" | "percentile_disc" => {
            AggregateKind::Quantile { permille: 0 }
        }
        _ => return None,
    })
}

fn contains_aggregate(e: &Expr) -> bool {
    let mut found = false;
    let _ = ast::visit_expressions(e, |x| {
        if let Expr::Function(f) = x {
            if function_name(&f.name)
                .ok()
                .and_then(|n| aggregate_kind(&n))
                .is_some()
            {
                found = true;
            }
        }
        std::ops::ControlFlow::<()>::Continue(())
    });
    found
}

enum Result_ {
    Same(usize),
    Fixed(ColumnType),
}

struct FunctionSpec {
    min_args: usize,
    max_args: usize,
    literal_args: &'static [usize],
    result: Result_,
}

/// The whitelist of total functions: none raises an error for some data values and not others,
/// none depends on time, randomness or session state, and none can run long on its input.
pub fn is_total_function(name: &str) -> bool {
    total_function(name).is_some()
}

fn total_function(name: &str) -> Option<FunctionSpec> {
    use ColumnType as T;
    let spec = |min_args, max_args, literal_args, result| FunctionSpec {
        min_args,
        max_args,
        literal_args,
        result,
    };
    Some(match name {
        "lower" | "upper" | "btrim" | "ltrim" | "rtrim" | "trim" => {
            spec(1, 1, &[], Result_::Fixed(T::Text))
        }
        "length" | "char_length" | "character_length" => {
            spec(1, 1, &[], Result_::Fixed(T::Integer))
        }
        "abs" => spec(1, 1, &[], Result_::Same(0)),
        "round" | "trunc" => spec(1, 2, &[1], Result_::Fixed(T::Numeric)),
        "floor" | "ceil" | "ceiling" => spec(1, 1, &[], Result_::Fixed(T::Numeric)),
        "coalesce" | "greatest" | "least" => spec(1, 8, &[], Result_::Same(0)),
        "nullif" => spec(2, 2, &[], Result_::Same(0)),
        "date_trunc" => spec(2, 2, &[0], Result_::Fixed(T::Timestamp)),
        "date_part" => spec(2, 2, &[0], Result_::Fixed(T::Numeric)),
        _ => return None,
    })
}

fn type_of_data_type(dt: &ast::DataType) -> Option<ColumnType> {
    use ast::DataType as D;
    Some(match dt {
        D::Text
        | D::Varchar(_)
        | D::CharacterVarying(_)
        | D::Char(_)
        | D::Character(_)
        | D::String(_) => ColumnType::Text,
        D::Int(_)
        | D::Integer(_)
        | D::BigInt(_)
        | D::SmallInt(_)
        | D::Int2(_)
        | D::Int4(_)
        | D::Int8(_) => ColumnType::Integer,
        D::Numeric(_) | D::Decimal(_) | D::Dec(_) => ColumnType::Numeric,
        D::Real | D::Float4 | D::Float8 | D::Double(_) | D::DoublePrecision | D::Float(_) => {
            ColumnType::Float
        }
        D::Date => ColumnType::Date,
        D::Timestamp(_, _) => ColumnType::Timestamp,
        D::Boolean | D::Bool => ColumnType::Boolean,
        _ => return None,
    })
}

/// Refuses (22023, before any charge) a string literal that the upstream would read as a date or
/// timestamp of type `ty` and reject: the error would come after the charge.
fn check_temporal_literal(expr: &Expr, ty: Option<ColumnType>) -> Result<()> {
    let Some(ty @ (ColumnType::Date | ColumnType::Timestamp)) = ty else {
        return Ok(());
    };
    match expr {
        Expr::Nested(inner) => check_temporal_literal(inner, Some(ty)),
        Expr::Value(v) => match crate::literal::string_value(&v.value) {
            Some(text) => check_temporal_text(text, ty),
            None => Ok(()),
        },
        _ => Ok(()),
    }
}

/// Whether `text` is a date (`YYYY-MM-DD`) or timestamp (a date, then digits, spaces, `:.T+-`)
/// the upstream accepts; 22023 otherwise.
fn check_temporal_text(text: &str, ty: ColumnType) -> Result<()> {
    let valid = match ty {
        ColumnType::Date => crate::datetime::Date::parse(text).is_some(),
        ColumnType::Timestamp => crate::datetime::is_timestamp_text(text),
        _ => true,
    };
    if valid {
        Ok(())
    } else {
        Err(Error::InvalidParameter {
            name: format!("the {} literal '{text}'", if ty == ColumnType::Date { "date" } else { "timestamp" }),
            reason: "is not a valid value".into(),
            hint: "Write dates as 'YYYY-MM-DD' (e.g. DATE '2024-06-01') and timestamps as 'YYYY-MM-DD HH:MM:SS'.".into(),
        })
    }
}
