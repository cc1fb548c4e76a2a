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
//! - A semijoin on the privacy unit (`person_id IN (SELECT person_id FROM …)`, `[NOT] EXISTS
//!   (… v.person_id = p.person_id …)`) is a condition of WHERE on its own, becomes a typed
//!   [`Semijoin`] and reads other private tables only through the same unit (`semijoin.rs`);
//!   every other subquery in an expression is refused.
//! - Analysis does no I/O.

mod aggregate;
mod buckets;
mod constant_text;
mod dates;
mod denominator;
mod existence;
mod expr;
mod fields;
mod from;
mod functions;
mod grouping;
mod join_filters;
mod moments;
mod outer;
mod post;
mod row_count;
pub(crate) use row_count::limit_offset;
use row_count::selects_every_row;
mod scope;
mod select;
mod selection;
mod semijoin;
pub(in crate::dp) use semijoin::conjuncts;
mod window;

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use sqlparser::ast::{
    self, BinaryOperator, Expr, FunctionArg, FunctionArgExpr, FunctionArguments, GroupByExpr,
    Ident, JoinConstraint, JoinOperator, ObjectName, SelectItem, SetExpr, TableFactor,
    UnaryOperator, Value,
};

use crate::dp::sql::{from_clause, sql};
use crate::error::{Error, Result};
use crate::limits;
use crate::policy::{Bounds, Column, ColumnType, PrivateTable, Table, TableKind, UnitPath};

pub use crate::dp::plan::*;

use functions::*;

pub use functions::{is_total_function, GUARD_FUNCTIONS};
pub use window::is_window_function;

// ---------------------------------------------------------------------------------------------
// Entry point
// ---------------------------------------------------------------------------------------------

/// Analyses a query. Refusals carry a SQLSTATE and a hint.
pub fn analyze(query: &ast::Query, ctx: &Context) -> Result<Plan> {
    reject_reserved(query)?;
    // `LIKE $1::VARCHAR`, `date_trunc('month'::text, …)`, `LIKE ('%' || 'a' || '%')`.
    let folded = constant_text::fold(query);
    let query = folded.as_ref().unwrap_or(query);
    // `JOIN t ON a.x = t.x AND t.y = 'NO'` (Sequelize's include with a where).
    let lifted = join_filters::lift(query);
    let query = lifted.as_ref().unwrap_or(query);
    // An ORM's count of a filtered selection: the count of the rows the selection finds.
    // An ORM's count of groups: the count of distinct key tuples, NULL included.
    let flattened =
        selection::count_over_selection(query, ctx).or_else(|| selection::count_of_groups(query));
    let query = flattened.as_ref().unwrap_or(query);
    if let Some(plan) = outer::outer_query(query, ctx) {
        return plan;
    }
    let grouped = distinct_as_grouping(query);
    let query = grouped.as_ref().unwrap_or(query);
    // A count of the same rows as a denominator: the sum of the released groups' counts.
    if let Some(rewritten) = denominator::as_window(query) {
        let plan = analyze_with(&rewritten, ctx, false)?;
        denominator::check(&plan, &rewritten)?;
        return Ok(plan);
    }
    analyze_with(query, ctx, false)
}

/// [`analyze`] of a query that is no outer query over an aggregate subquery; with
/// `post_processed`, its select list, HAVING, ORDER BY and LIMIT always become
/// [`PostProcessing`] (the outer query then wraps that SQL).
fn analyze_with(query: &ast::Query, ctx: &Context, post_processed: bool) -> Result<Plan> {
    // bool_or / bool_and / every in the select list, HAVING or ORDER BY, and SELECT EXISTS (…):
    // tests on noisy counts of the same rows (existence.rs).
    if let Some(rewritten) = existence::as_counts(query)? {
        return analyze_with(&rewritten, ctx, post_processed);
    }
    // Elsewhere over data (an outer query over released rows may use them: post-processing).
    if let Some(refusal) = boolean_aggregate_refusal(query) {
        return Err(refusal);
    }
    let ctes = common_table_expressions(query)?;
    let select = select::single_select(query)?;

    let mut a = Analyzer::new(ctx, ctes);
    if let Some(refusal) = from::exists_without_from(select) {
        return Err(refusal);
    }
    let joins = a.resolve_from(&select.from)?;

    if !a.tables.iter().any(|t| t.0.private) {
        return Err(Error::unsupported(
            "queries over public tables only",
            "pgdp answers DP aggregates over private tables; join the public table to a private one.",
        ));
    }

    // WHERE: its semijoins on the privacy unit apart, the rest checked like any filter.
    let (filter, semijoins) = match &select.selection {
        Some(e) => a.where_clause(e)?,
        None => (None, Vec::new()),
    };

    // corr, covar_*, regr_*: expressions over bounded sums of the same rows, analysed as the
    // statement (moments.rs).
    if moments::calls_bivariate(query) {
        let rewritten = a.bivariate_as_sums(query)?;
        return analyze_with(&rewritten, ctx, post_processed);
    }
    // MIN, MAX, MEDIAN, PERCENTILE_DISC of a date: the quantile of its day number (dates.rs).
    if let Some(rewritten) = a.date_quantiles_as_days(query)? {
        return analyze_with(&rewritten, ctx, post_processed);
    }

    // GROUP BY keys, and with ROLLUP / CUBE / GROUPING SETS the grouping sets over them.
    let group_by = grouping::group_by(&select.group_by)?;
    let group_exprs = group_by.elements;
    if group_exprs.len() > limits::GROUP_KEYS_PER_QUERY_MAX {
        return Err(Error::LimitExceeded {
            what: "the number of GROUP BY keys".into(),
            limit: limits::GROUP_KEYS_PER_QUERY_MAX as u64,
        });
    }
    let (keys, key_originals, element_key) = a.group_keys(select, &group_exprs)?;
    let grouping_sets = group_by
        .sets
        .map(|sets| grouping::key_sets(&sets, &element_key));
    let sets = grouping_sets.as_deref();

    // Select list, HAVING, ORDER BY: evaluated by pgdp when they are bare aggregates and keys,
    // by PostgreSQL over the released values (post::PostProcessing) otherwise.
    let (aggregates, outputs, having, order_by, limit, offset, post) =
        a.outputs(query, select, &keys, &key_originals, sets, post_processed)?;
    if aggregates.len() > limits::AGGREGATES_PER_QUERY_MAX {
        return Err(Error::LimitExceeded {
            what: "the number of aggregates".into(),
            limit: limits::AGGREGATES_PER_QUERY_MAX as u64,
        });
    }

    a.check_public_rows_kept(&keys, &aggregates)?;

    let (max_groups_per_unit, max_rows_per_unit, groups_ceiling, rows_ceiling) =
        a.contribution_caps();
    let unit = a.unit()?;
    let parameters = select::parameters(&a.parameters);
    let policy = ctx.policy;
    let mut plan = Plan {
        tables: a.tables.into_iter().map(|t| t.0).collect(),
        joins,
        unit,
        max_groups_per_unit: if keys.is_empty() {
            1
        } else {
            max_groups_per_unit
        },
        max_rows_per_unit,
        groups_ceiling: if keys.is_empty() { 1 } else { groups_ceiling },
        rows_ceiling,
        max_rows_total: None,
        filter,
        semijoins,
        keys,
        grouping_sets,
        aggregates,
        outputs,
        having,
        order_by,
        limit,
        offset,
        post,
        parameters,
        unit_unique: false,
        unit_lookup: None,
        not_null: Vec::new(),
        never_null: Vec::new(),
        unique_keys: a.unique_keys,
        unit_caps: a.unit_caps,
    };
    plan.declare_never_null(|table, column| {
        policy
            .table(table)
            .and_then(|t| t.column(column))
            .is_some_and(|c| c.exhaustive)
    });
    Ok(plan)
}

/// `SELECT DISTINCT k1, k2 FROM …` (a BI tool's filter list) as `SELECT k1, k2 FROM … GROUP BY
/// k1, k2`: the same rows, so its keys are released as group keys are (a public list whole and
/// free of charge, other keys by partition selection); `SELECT ALL` as plain `SELECT`. `None`
/// when neither applies (DISTINCT with aggregates or GROUP BY stays refused).
fn distinct_as_grouping(query: &ast::Query) -> Option<ast::Query> {
    let SetExpr::Select(select) = query.body.as_ref() else {
        return None;
    };
    let mut rewritten = query.clone();
    let SetExpr::Select(target) = rewritten.body.as_mut() else {
        return None;
    };
    match &select.distinct {
        Some(ast::Distinct::All) => {
            target.distinct = None;
            return Some(rewritten);
        }
        Some(ast::Distinct::Distinct) => {}
        _ => return None,
    }
    let ungrouped =
        matches!(&select.group_by, GroupByExpr::Expressions(e, m) if e.is_empty() && m.is_empty());
    let keys: Option<Vec<Expr>> = select
        .projection
        .iter()
        .map(|item| match item {
            SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. }
                if !contains_aggregate(e) =>
            {
                Some(e.clone())
            }
            _ => None,
        })
        .collect();
    let keys = keys.filter(|k| !k.is_empty() && ungrouped && select.having.is_none())?;
    target.distinct = None;
    target.group_by = GroupByExpr::Expressions(keys, Vec::new());
    Some(rewritten)
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

fn push_aggregate(aggregates: &mut Vec<Aggregate>, agg: Aggregate) -> usize {
    match aggregates.iter().position(|a| a.text == agg.text) {
        Some(i) => i,
        None => {
            aggregates.push(agg);
            aggregates.len() - 1
        }
    }
}

/// Hint of ClickHouse's `WITH FILL`, which sqlparser accepts in ORDER BY.
const WITH_FILL_HINT: &str =
    "WITH FILL is not PostgreSQL SQL: sort with ASC or DESC and NULLS FIRST or NULLS LAST; keys with a public list already include every value.";

/// Hint of `ORDER BY ALL`.
const ORDER_BY_ALL_HINT: &str = "List the columns to sort by, e.g. ORDER BY 1, 2.";

/// Hint of `AS t (a, b)` on a table in FROM.
const COLUMN_ALIASES_HINT: &str =
    "Name the columns in the select list instead: FROM demo.visits AS v, then v.cost AS amount.";

/// Hint of ORDER BY or LIMIT inside an aggregate's parentheses.
const AGGREGATE_ORDER_HINT: &str =
    "Drop the ORDER BY inside the aggregate: the aggregates pgdp releases (COUNT, SUM, AVG, VARIANCE, STDDEV, quantiles) do not depend on the order of their rows; sort the released rows with ORDER BY at the end of the query.";

fn window_refusal() -> Error {
    Error::unsupported("window functions here", window::WINDOW_HINT)
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
            // The functions pgdp's own rewrites write (existence.rs).
            Expr::Function(f) => f
                .name
                .0
                .iter()
                .any(|p| p.to_string().to_ascii_lowercase().contains(RESERVED_PREFIX)),
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
    /// For a bare column whose policy has one, how far a query that chooses its bounds may
    /// raise the upper bound ([`crate::policy::Column::upper_ceiling`]).
    upper_ceiling: Option<f64>,
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
    /// Whether PostgreSQL types it as an integer (smallint, integer, bigint), which `ty` does not
    /// always say: pgdp computes `+ - *` of integers in numeric (no overflow error that depends
    /// on the data) and types the result numeric, but `/` of two integers must stay integer
    /// division, truncated toward zero, as the analyst's SQL means.
    integer: bool,
}

impl Info {
    fn constant(ty: Option<ColumnType>, value: Option<f64>) -> Info {
        Info {
            ty,
            bounds: value.map(|v| (v, v)),
            upper_ceiling: None,
            groupable: true,
            constant: true,
            public: PublicKeys::No,
            column: None,
            declared: None,
            uses_unit: false,
            integer: ty == Some(ColumnType::Integer),
        }
    }

    fn derived(ty: Option<ColumnType>, parts: &[&Info], bounds: Option<(f64, f64)>) -> Info {
        Info {
            ty,
            bounds,
            upper_ceiling: None,
            groupable: parts.iter().all(|p| p.groupable),
            constant: parts.iter().all(|p| p.constant),
            public: PublicKeys::No,
            column: None,
            declared: None,
            uses_unit: parts.iter().any(|p| p.uses_unit),
            integer: ty == Some(ColumnType::Integer),
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
    /// Per-unit values bounded by the policy's row cap ([`Plan::unit_caps`]).
    unit_caps: Vec<String>,
    /// Whether a window partitioned by the privacy unit may appear here: only while a select
    /// item of a row-level view is analysed (`window` module docs).
    windows_allowed: bool,
    /// The private table a LEFT JOIN joins to public tables first
    /// (`regions r LEFT JOIN people p …`), analysed as the inner join
    /// ([`check_public_rows_kept`]).
    public_rows_kept: Option<String>,
}

/// A private table LEFT JOINed to public tables (`regions r LEFT JOIN people p ON p.region =
/// r.region GROUP BY r.name`) keeps every public row, with NULLs where no private row matches.
/// pgdp answers it as the inner join with keys of the public tables only: their public domain
/// releases every public row's group, with a noisy zero where no private row matches, as the
/// analyst asked. The rows an aggregate reads are then the same in both joins, except that the
/// NULL-extended row counts in `COUNT(*)` and in aggregates of the public tables' columns, so
/// those are refused (with the form that counts the private rows), and so is a key of the
/// private table (its NULL group is not in any public domain).
fn check_public_rows_kept(
    table: &str,
    private: &BTreeSet<String>,
    keys: &[GroupKey],
    aggregates: &[Aggregate],
) -> Result<()> {
    let reads_private = |c: &Canonical| {
        c.aliases()
            .is_none_or(|aliases| aliases.iter().any(|a| private.contains(a)))
    };
    for key in keys {
        if reads_private(&key.expr) || key.public == PublicKeys::No {
            return Err(Error::unsupported(
                format!("a group key of {table} in a LEFT JOIN that keeps public rows"),
                format!("Group by columns of the public tables only (each of their rows is then a group, with a noisy zero where {table} has no row), or put {table} first: FROM {table} LEFT JOIN …"),
            ));
        }
    }
    for aggregate in aggregates {
        let private_argument = match (&aggregate.kind, &aggregate.argument) {
            (AggregateKind::CountUnits, _) => true,
            (_, Some(argument)) => argument.aliases().is_some_and(|aliases| {
                !aliases.is_empty() && aliases.iter().all(|a| private.contains(a))
            }),
            (_, None) => false,
        };
        if !private_argument {
            return Err(Error::unsupported(
                format!("{} over a LEFT JOIN that keeps public rows", aggregate.text),
                format!("A public row without a match in {table} is one row of NULLs, which COUNT(*) counts; count or aggregate a column of {table} instead, e.g. COUNT({table}.<column>), which is 0 (with noise) for such a row."),
            ));
        }
    }
    Ok(())
}

fn ident_lower(i: &Ident) -> String {
    if i.quote_style.is_some() {
        i.value.clone()
    } else {
        i.value.to_ascii_lowercase()
    }
}

impl Analyzer<'_> {
    /// Canonical SQL text as the analyst wrote it, for messages: each generated alias
    /// `"__dp_tN"` becomes the analyst's name for that table (its alias, or the table's name).
    fn shown(&self, canonical_text: &str) -> String {
        let mut text = canonical_text.to_string();
        // The longest aliases first, so `__dp_t1` does not match inside `__dp_t10`.
        let mut tables: Vec<&(TableRef, Cow<'_, Table>, String)> = self.tables.iter().collect();
        tables.sort_by_key(|(r, _, _)| std::cmp::Reverse(r.alias.len()));
        for (r, _, visible) in tables {
            text = text.replace(&format!("\"{}\"", r.alias), visible);
        }
        text
    }
}

/// The canonical expression `"alias"."column"` ([`ColumnRef`]).
fn canonical(alias: &str, column: &str) -> Expr {
    ColumnRef::new(alias, column).expr()
}

impl Analyzer<'_> {
    /// The select list, HAVING and ORDER BY when every select item is a bare aggregate or a
    /// group key and pgdp's own evaluator applies HAVING and ORDER BY to the released rows.
    fn plain_outputs(
        &mut self,
        query: &ast::Query,
        select: &ast::Select,
        keys: &[GroupKey],
        grouped: bool,
    ) -> Result<PlainOutputs> {
        let mut aggregates: Vec<Aggregate> = Vec::new();
        let mut outputs = Vec::new();
        for item in &select.projection {
            let (expr, alias) = select_item(item)?;
            if grouping::is_grouping_call(expr) {
                if !grouped {
                    return Err(grouping::grouping_without_sets());
                }
                let args = self.grouping_arguments(expr, keys)?;
                outputs.push(Output {
                    name: alias.unwrap_or_else(|| default_name(expr)),
                    source: OutputSource::Grouping(args),
                });
                continue;
            }
            let source = match self.aggregate(expr)? {
                Some(agg) => {
                    let idx = push_aggregate(&mut aggregates, agg);
                    OutputSource::Aggregate(idx)
                }
                None => {
                    let mut e = expr.clone();
                    self.expr(&mut e, Role::Key)?;
                    let text = e.to_string();
                    match keys.iter().position(|k| k.expr == text) {
                        Some(i) => OutputSource::Key(i),
                        None if keys.is_empty() && !any_aggregate(&select.projection) => {
                            // No aggregate anywhere: rows (`SELECT 1 AS a FROM t LIMIT 1`, an
                            // ORM's exists(); `SELECT name FROM t`).
                            return Err(Error::forbidden(
                                "pgdp does not return rows of private tables, only aggregates",
                                RAW_ROWS_HINT,
                            ));
                        }
                        None => {
                            return Err(Error::forbidden(
                                format!(
                                    "{expr} must appear in GROUP BY or be used in an aggregate"
                                ),
                                RAW_ROWS_HINT,
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
        // Keys alone (`SELECT DISTINCT k`, `GROUP BY k` without aggregates) are released as
        // keys are: a public list whole, others by partition selection.
        if aggregates.is_empty() && keys.is_empty() {
            return Err(Error::forbidden(
                "a query on private tables must compute at least one aggregate",
                "Add COUNT(*) (or another aggregate) to the select list; group keys alone are released only with a noisy count.",
            ));
        }

        // HAVING and ORDER BY are post-processing on released values.
        let having = match &select.having {
            Some(h) => Some(self.post(h, keys, &mut aggregates, &outputs, false)?),
            None => None,
        };
        let mut order_by = Vec::new();
        if let Some(ob) = &query.order_by {
            let exprs = match &ob.kind {
                ast::OrderByKind::Expressions(e) => e,
                ast::OrderByKind::All(_) => {
                    return Err(Error::unsupported("ORDER BY ALL", ORDER_BY_ALL_HINT))
                }
            };
            for o in exprs {
                if o.with_fill.is_some() {
                    return Err(Error::unsupported("WITH FILL", WITH_FILL_HINT));
                }
                let value = self.post(&o.expr, keys, &mut aggregates, &outputs, true)?;
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
        Ok((aggregates, outputs, having, order_by))
    }
}

/// A select item of a query on private tables: its expression and alias. `*` is refused.
fn select_item(item: &SelectItem) -> Result<(&Expr, Option<String>)> {
    match item {
        SelectItem::UnnamedExpr(e) => Ok((e, None)),
        // PostgreSQL folds an unquoted alias to lower case (`AS N` names the column "n").
        SelectItem::ExprWithAlias { expr, alias } => Ok((expr, Some(ident_lower(alias)))),
        SelectItem::ExprWithAliases { .. } => Err(Error::unsupported(
            "multiple aliases for one select item",
            "Give the item one alias: expr AS name.",
        )),
        SelectItem::Wildcard(_) | SelectItem::QualifiedWildcard(..) => Err(Error::forbidden(
            "SELECT * is not allowed on private tables",
            RAW_ROWS_HINT,
        )),
    }
}

/// The names PostgreSQL gives the output columns of `query`'s select list, the way analysis
/// names a plan's outputs (an alias folded as PostgreSQL folds it, else the expression's default
/// name); `None` when the body is not a plain SELECT, an item has no single name, or a name is
/// reserved for pgdp (analysis refuses those). The plan cache renames a kept plan's outputs
/// with it ([`crate::session`]'s plans, keyed without output aliases).
pub fn output_names(query: &ast::Query) -> Option<Vec<String>> {
    let ast::SetExpr::Select(select) = query.body.as_ref() else {
        return None;
    };
    select
        .projection
        .iter()
        .map(|item| {
            let (expr, alias) = select_item(item).ok()?;
            let name = alias.unwrap_or_else(|| default_name(expr));
            (!name.starts_with(RESERVED_PREFIX)).then_some(name)
        })
        .collect()
}

/// What to ask for instead of rows of a private table.
const RAW_ROWS_HINT: &str = "Ask for aggregates and GROUP BY keys: COUNT, SUM, AVG, VARIANCE, STDDEV, MIN, MAX, MEDIAN and PERCENTILE_CONT, e.g. SELECT region, COUNT(*), AVG(age) FROM demo.people GROUP BY region; to test whether rows exist, count them (SELECT COUNT(*) FROM … WHERE …) and compare the noisy count.";

/// Whether any select item calls an aggregate.
fn any_aggregate(projection: &[SelectItem]) -> bool {
    projection.iter().any(|item| match item {
        SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. } => {
            contains_aggregate(e)
        }
        _ => false,
    })
}

/// Aggregates, outputs, HAVING and ORDER BY of a plan without [`PostProcessing`].
type PlainOutputs = (Vec<Aggregate>, Vec<Output>, Option<Post>, Vec<SortKey>);

/// The select list, HAVING and ORDER BY as pgdp evaluates them, or as PostgreSQL does.
enum Shaped {
    Plain(PlainOutputs),
    Staged(post::Staged),
}

/// A plan's aggregates, outputs, HAVING, ORDER BY, LIMIT, OFFSET and post-processing.
type Outputs = (
    Vec<Aggregate>,
    Vec<Output>,
    Option<Post>,
    Vec<SortKey>,
    Option<u64>,
    u64,
    Option<PostProcessing>,
);

#[cfg(test)]
mod tests;

/// The hint of a set operation refused inside a subquery or CTE (at the top of a statement the
/// session answers it, [`crate::session`]'s set operations): the same set operation at the top,
/// or, for a total row above the groups (`… GROUP BY k UNION ALL SELECT 'all', …`), one
/// grouping-sets query, shown with the first branch's keys.
fn set_operation_hint(left: &SetExpr) -> String {
    let keys = match left {
        SetExpr::Select(s) => match &s.group_by {
            GroupByExpr::Expressions(e, m) if !e.is_empty() && m.is_empty() => Some(
                e.iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", "),
            ),
            _ => None,
        },
        _ => None,
    };
    match keys {
        Some(k) => format!(
            "Write the set operation at the top of the statement, where each branch is a DP query charged on its own. For the groups and a total row above them, one query is one release: GROUP BY ROLLUP ({k}) (or GROUP BY GROUPING SETS (({k}), ())), whose total row has NULL keys (label it with CASE WHEN GROUPING({k}) = 1 THEN 'all' ELSE … END)."
        ),
        None => "Write the set operation at the top of the statement, where each branch is a DP query charged on its own (for groups and their total, one query with GROUP BY ROLLUP (…) is one release).".to_string(),
    }
}
