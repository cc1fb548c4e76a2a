//! Where the per-unit stage of a statement in the partitionwise shape can run, read from its
//! text: on each shard, or only on the coordinator, with the construct that keeps it there.
//!
//! `postgres_fdw` sends a shard an aggregate (stage 2, `GROUP BY` the unit) only when every
//! expression in it and below it ships: built-in functions and operators that PostgreSQL marks
//! immutable, no window function, and only foreign tables of that shard (so no join with a
//! table the coordinator holds). Whether a shippable stage is then sent is the planner's choice,
//! made from its estimates; pgdp does not ask for the plan, since a plan depends on the
//! upstream's statistics, which are data. EXPLAIN states what the text allows and why.
//!
//! The constructs PostgreSQL 15 marks stable among those pgdp writes: `date_trunc` of a `date`
//! or `timestamptz` (a `date` resolves to the `timestamptz` overload), `date_part` / `EXTRACT`
//! of a `timestamptz`, `to_char` of anything, casts between `timestamptz` and `date` /
//! `timestamp` / text, casts of any date or time to text, comparisons and arithmetic mixing a
//! `timestamptz` with a `date` or `timestamp`, and a `timestamptz` plus or minus an interval.
//! Immutable but not shipped either: a function whose text input is not a column of the
//! foreign table (postgres_fdw 15 requires a function's input collation to come from a foreign
//! column): `date_trunc` and `date_part` (the unit), `EXTRACT` (the field), and the hash of text
//! that chooses a unit's groups when it may keep only one (`hashtextextended`). Plain columns,
//! comparisons with literals, arithmetic, `CASE` and `width_bucket` ship.
//!
//! Invariants:
//! - Pure and conservative: [`PerUnitStage::Coordinator`] whenever the text holds a construct
//!   known not to ship; a type pgdp cannot infer counts as not temporal, so a claim of
//!   [`PerUnitStage::Shippable`] may be wrong only for constructs outside the list above
//!   (`tests/integration/shard.rs` checks both claims against the coordinator's plan).
//! - The answer never depends on data: the text and the policy only.

use std::collections::BTreeMap;
use std::ops::ControlFlow;

use sqlparser::ast::{
    self, BinaryOperator, DataType, Expr, FunctionArg, FunctionArgExpr, FunctionArguments, SetExpr,
    Statement, TableFactor,
};
use sqlparser::dialect::PostgreSqlDialect;
use sqlparser::parser::Parser;

use crate::error::{Error, Result};
use crate::policy::{self, ColumnType, Policy};

/// The CTE holding stage 1.
pub(super) const ROWS: &str = "__dp_rows";

/// Where the per-unit stage of a partitionwise statement can run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PerUnitStage {
    /// Every expression of stages 1 and 2 ships and every table of stage 1 is partitioned by
    /// the unit: PostgreSQL may run the per-unit stage on each shard.
    Shippable,
    /// On Citus: as [`PerUnitStage::Shippable`], and the statement's distinct counts or
    /// quantiles (their CTEs `__dp_dJ`, joined to stage 4) are computed in the tasks too, their
    /// values or buckets per group and task crossing to the coordinator as distributed subplans.
    ShippableWithValueStages,
    /// The per-unit stage runs on the coordinator, over every row of stage 1: `reason` names
    /// the construct.
    Coordinator {
        /// Why, for EXPLAIN (names SQL constructs and tables, never a value).
        reason: String,
    },
}

/// The date and time types whose functions differ in volatility.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Date,
    Timestamp,
    TimestampTz,
    Interval,
}

/// Where the per-unit stage of `sql` (a rewrite in the partitionwise shape) can run, when the
/// tables in `sharded` are partitioned by their unit. `None` if the text has no stage 1.
pub fn per_unit_stage(
    sql: &str,
    sharded: &[String],
    policy: &Policy,
) -> Result<Option<PerUnitStage>> {
    let statements = Parser::parse_sql(&PostgreSqlDialect {}, sql)
        .map_err(|e| Error::internal(format!("a rewrite does not parse again: {e}")))?;
    let [Statement::Query(query)] = statements.as_slice() else {
        return Err(Error::internal("a rewrite is not one query"));
    };
    let Some(with) = &query.with else {
        return Ok(None);
    };
    let Some(rows) = with.cte_tables.iter().find(|c| c.alias.name.value == ROWS) else {
        return Ok(None);
    };
    let types = Types { policy };
    // Stage 1: its tables, then every expression in it.
    for name in base_tables(&rows.query) {
        if !sharded.contains(&name) {
            return Ok(Some(PerUnitStage::Coordinator {
                reason: format!(
                    "{name} is not partitioned by the privacy unit on the shards, so the rows are joined on the coordinator"
                ),
            }));
        }
    }
    let mut scope = Scope::default();
    types.scope_of_query(&rows.query, &mut scope);
    if let Some(reason) = types.first_unshippable(&rows.query, &scope) {
        return Ok(Some(PerUnitStage::Coordinator { reason }));
    }
    // The columns of stage 1, for the stages that read it.
    let mut stage_one = BTreeMap::new();
    if let SetExpr::Select(select) = rows.query.body.as_ref() {
        for item in &select.projection {
            if let ast::SelectItem::ExprWithAlias { expr, alias } = item {
                stage_one.insert(alias.value.clone(), types.kind(expr, &scope));
            }
        }
    }
    let readers = with
        .cte_tables
        .iter()
        .map(|c| (c.alias.name.value.as_str(), c.query.as_ref()))
        .chain(std::iter::once(("the final stage", query.as_ref())));
    for (name, reader) in readers {
        let SetExpr::Select(select) = reader.body.as_ref() else {
            continue;
        };
        let reads_rows = select.from.iter().any(|f| is_rows(&f.relation));
        if !reads_rows || name == ROWS {
            continue;
        }
        if let Some(reason) = unsharded_join(name, select, sharded) {
            return Ok(Some(PerUnitStage::Coordinator { reason }));
        }
        if let Some(reason) = window_in(name, select) {
            return Ok(Some(PerUnitStage::Coordinator { reason }));
        }
        let mut reader_scope = Scope::default();
        types.scope_of_query(reader, &mut reader_scope);
        for (column, kind) in &stage_one {
            reader_scope.columns.insert(column.clone(), *kind);
            reader_scope
                .qualified
                .insert((ROWS.to_string(), column.clone()), *kind);
        }
        // A cast, `EXTRACT` or `date_part` of a grouping column in the select list is computed
        // by the coordinator over the grouped rows (postgres_fdw ships the grouping and computes
        // such an expression locally: how the partitionwise shape reads a time bucket back,
        // super::bucket): only the rest must ship.
        let grouped: Vec<&Expr> = match &select.group_by {
            ast::GroupByExpr::Expressions(exprs, _) => exprs.iter().collect(),
            ast::GroupByExpr::All(_) => Vec::new(),
        };
        let is_grouped = |x: &Expr| {
            matches!(x, Expr::Identifier(_) | Expr::CompoundIdentifier(_)) && grouped.contains(&x)
        };
        let computed_after = |e: &Expr| match e {
            Expr::Cast { expr, .. } | Expr::Extract { expr, .. } => is_grouped(expr),
            Expr::Function(f) if f.over.is_none() && f.filter.is_none() => {
                let name = f.name.0.last().and_then(|p| p.as_ident());
                matches!(
                    (name, function_args(f).as_slice()),
                    (Some(n), [Expr::Value(_), x])
                        if n.value.eq_ignore_ascii_case("date_part") && is_grouped(x)
                )
            }
            _ => false,
        };
        for item in &select.projection {
            let expr = match item {
                ast::SelectItem::UnnamedExpr(e)
                | ast::SelectItem::ExprWithAlias { expr: e, .. } => e,
                _ => continue,
            };
            if computed_after(expr) {
                continue;
            }
            if let Some(reason) = types.first_unshippable(expr, &reader_scope) {
                return Ok(Some(PerUnitStage::Coordinator { reason }));
            }
        }
        let rest = grouped
            .iter()
            .copied()
            .chain(select.selection.as_ref())
            .chain(select.having.as_ref());
        for expr in rest {
            if let Some(reason) = types.first_unshippable(expr, &reader_scope) {
                return Ok(Some(PerUnitStage::Coordinator { reason }));
            }
        }
    }
    Ok(Some(PerUnitStage::Shippable))
}

/// Why the stage `name` (`select`, a reader of stage 1) runs on the coordinator if it calls a
/// window function.
fn window_in(name: &str, select: &ast::Select) -> Option<String> {
    let mut window = false;
    let _ = ast::visit_expressions(select, |e| {
        if let Expr::Function(f) = e {
            window |= f.over.is_some();
        }
        ControlFlow::<()>::Continue(())
    });
    window.then(|| {
        format!(
            "{name} ranks each unit's rows with a window function (distinct values and quantiles kept per unit), which postgres_fdw does not ship"
        )
    })
}

/// Why the stage `name` (`select`, a reader of stage 1) is joined on the coordinator, if it is:
/// a table joined to stage 1 (the lookup form's one aggregate over its join,
/// super::partitionwise) lets the join run on the shards only if it is partitioned by the unit.
fn unsharded_join(name: &str, select: &ast::Select, sharded: &[String]) -> Option<String> {
    let joined = select
        .from
        .iter()
        .flat_map(|f| f.joins.iter().map(|j| &j.relation));
    for factor in joined {
        let TableFactor::Table { name: table, .. } = factor else {
            return Some(format!("{name} joins stage 1 to a derived table"));
        };
        let table = table_key(table);
        if !sharded.contains(&table) {
            return Some(format!(
                "{table} is not partitioned by the privacy unit on the shards, so the rows are joined on the coordinator"
            ));
        }
    }
    None
}

/// Where the per-unit stage of `sql` (a rewrite in the single-server shape) runs on a Citus
/// coordinator whose tables `distributed` are distributed by their privacy unit (co-located)
/// and `reference` are reference tables. Citus runs a query over co-located tables grouped by
/// their distribution column inside each worker's tasks; it plans as a distributed subplan,
/// whose rows go through the coordinator, a table that is neither (a local table of the
/// coordinator: its rows are sent to the workers) and a CTE over distributed tables that the
/// statement reads more than once (its rows are pulled to the coordinator). `None` if the text
/// has no stage 1.
pub fn per_unit_stage_on_citus(
    sql: &str,
    distributed: &[String],
    reference: &[String],
) -> Result<Option<PerUnitStage>> {
    let statements = Parser::parse_sql(&PostgreSqlDialect {}, sql)
        .map_err(|e| Error::internal(format!("a rewrite does not parse again: {e}")))?;
    let [Statement::Query(query)] = statements.as_slice() else {
        return Err(Error::internal("a rewrite is not one query"));
    };
    let Some(with) = &query.with else {
        return Ok(None);
    };
    let Some(rows) = with.cte_tables.iter().find(|c| c.alias.name.value == ROWS) else {
        return Ok(None);
    };
    let ctes: Vec<&str> = with
        .cte_tables
        .iter()
        .map(|c| c.alias.name.value.as_str())
        .collect();
    for name in base_tables(&rows.query) {
        if !distributed.contains(&name)
            && !reference.contains(&name)
            && !ctes.contains(&name.as_str())
        {
            return Ok(Some(PerUnitStage::Coordinator {
                reason: format!(
                    "{name} is a local table of the coordinator, so Citus first sends its rows (those stage 1 reads) to the workers as a distributed subplan"
                ),
            }));
        }
    }
    // The CTEs over distributed rows: stage 1, and every CTE that reads one of them.
    let over_rows = super::distributed::ctes_over_rows(query);
    let over_rows: Vec<&str> = over_rows.iter().map(String::as_str).collect();
    let reads = super::distributed::reads(query);
    // A subquery in stage 4's select list over per-unit rows: Citus then inlines none of the
    // statement's CTEs, and the one every stage reads, stage 1, is pulled.
    if let Some(read) = select_list_subquery_reads(query, &over_rows) {
        return Ok(Some(PerUnitStage::Coordinator {
            reason: format!(
                "the statement reads {read} in a subquery of its select list, so Citus runs its CTEs as distributed subplans and pulls every row of {ROWS} to the coordinator"
            ),
        }));
    }
    let materialized = |name: &str| {
        with.cte_tables.iter().any(|c| {
            c.alias.name.value == name
                && c.materialized != Some(ast::CteAsMaterialized::NotMaterialized)
        })
    };
    if let Some(twice) = over_rows
        .iter()
        .find(|c| reads.get(**c).copied().unwrap_or(0) > 1 && materialized(c))
    {
        return Ok(Some(PerUnitStage::Coordinator {
            reason: format!(
                "the statement reads {twice} (per-unit rows) more than once, so Citus runs it as a distributed subplan and pulls every row of {twice} to the coordinator"
            ),
        }));
    }
    let value_stages = over_rows
        .iter()
        .any(|c| super::distributed::is_value_cte(c));
    Ok(Some(if value_stages {
        PerUnitStage::ShippableWithValueStages
    } else {
        PerUnitStage::Shippable
    }))
}

/// The first CTE of `over_rows` that a subquery in the select list of `query`'s outermost
/// SELECT reads.
fn select_list_subquery_reads(query: &ast::Query, over_rows: &[&str]) -> Option<String> {
    let SetExpr::Select(select) = query.body.as_ref() else {
        return None;
    };
    let mut found = None;
    for item in &select.projection {
        let _ = ast::visit_expressions(item, |e| {
            if let ast::Expr::Subquery(sub) = e {
                let _ = ast::visit_relations(sub.as_ref(), |name| {
                    let key = table_key(name);
                    if found.is_none() && over_rows.contains(&key.as_str()) {
                        found = Some(key);
                    }
                    ControlFlow::<()>::Continue(())
                });
            }
            ControlFlow::<()>::Continue(())
        });
    }
    found
}

fn is_rows(factor: &TableFactor) -> bool {
    matches!(factor, TableFactor::Table { name, .. }
        if matches!(name.0.as_slice(), [p] if p.as_ident().is_some_and(|i| i.value == ROWS)))
}

/// `schema.name` of a table reference, unquoted and lower-cased as the policy keys it.
pub(super) fn table_key(name: &ast::ObjectName) -> String {
    name.0
        .iter()
        .map(|p| {
            p.as_ident()
                .map_or_else(|| p.to_string(), |i| i.value.clone())
                .to_ascii_lowercase()
        })
        .collect::<Vec<_>>()
        .join(".")
}

/// The tables (not CTEs, which stage 1 never reads) named anywhere in `query`.
pub(super) fn base_tables(query: &ast::Query) -> Vec<String> {
    let mut found = Vec::new();
    let _ = ast::visit_relations(query, |name| {
        let key = table_key(name);
        if !found.contains(&key) {
            found.push(key);
        }
        ControlFlow::<()>::Continue(())
    });
    found
}

/// The temporal kinds of the columns an expression may name: `alias.column` for tables and
/// derived tables in FROM, and bare names (the columns of stage 1 in later stages).
#[derive(Debug, Default)]
struct Scope {
    qualified: BTreeMap<(String, String), Option<Kind>>,
    columns: BTreeMap<String, Option<Kind>>,
}

struct Types<'a> {
    policy: &'a Policy,
}

/// The temporal kinds of the expressions of one stage 1 (a query over policy tables).
pub(super) struct StageOneKinds<'a> {
    types: Types<'a>,
    scope: Scope,
}

impl<'a> StageOneKinds<'a> {
    /// The kinds of the columns `rows` (stage 1) reads, as `policy` declares them.
    pub(super) fn new(rows: &ast::Query, policy: &'a Policy) -> StageOneKinds<'a> {
        let types = Types { policy };
        let mut scope = Scope::default();
        types.scope_of_query(rows, &mut scope);
        StageOneKinds { types, scope }
    }

    /// The temporal kind of `e`'s value, if pgdp can tell it.
    pub(super) fn kind(&self, e: &Expr) -> Option<Kind> {
        self.types.kind(e, &self.scope)
    }
}

impl Types<'_> {
    /// The kind of a policy table's column.
    fn column_kind(&self, table: &str, column: &str) -> Option<Kind> {
        let c = self.policy.tables.get(table)?.column(column)?;
        match c.ty {
            ColumnType::Date => Some(Kind::Date),
            ColumnType::Timestamp if policy::with_time_zone(&c.declared_type) => {
                Some(Kind::TimestampTz)
            }
            ColumnType::Timestamp => Some(Kind::Timestamp),
            _ => None,
        }
    }

    /// Adds the aliases of every table and derived table in `query` (at any depth) to `scope`.
    fn scope_of_query(&self, query: &ast::Query, scope: &mut Scope) {
        let SetExpr::Select(select) = query.body.as_ref() else {
            return;
        };
        let factors = select
            .from
            .iter()
            .flat_map(|f| std::iter::once(&f.relation).chain(f.joins.iter().map(|j| &j.relation)));
        for factor in factors {
            match factor {
                TableFactor::Table { name, alias, .. } => {
                    let table = table_key(name);
                    let alias = alias
                        .as_ref()
                        .map_or_else(|| table.clone(), |a| a.name.value.clone());
                    if let Some(t) = self.policy.tables.get(&table) {
                        for c in &t.columns {
                            scope.qualified.insert(
                                (alias.clone(), c.name.clone()),
                                self.column_kind(&table, &c.name),
                            );
                        }
                    }
                }
                TableFactor::Derived {
                    subquery, alias, ..
                } => {
                    let mut inner = Scope::default();
                    self.scope_of_query(subquery, &mut inner);
                    let Some(alias) = alias else { continue };
                    if let SetExpr::Select(s) = subquery.body.as_ref() {
                        for item in &s.projection {
                            let (name, expr) = match item {
                                ast::SelectItem::ExprWithAlias { expr, alias } => {
                                    (alias.value.clone(), expr)
                                }
                                ast::SelectItem::UnnamedExpr(
                                    e @ (Expr::Identifier(_) | Expr::CompoundIdentifier(_)),
                                ) => (last_name(e).unwrap_or_default(), e),
                                _ => continue,
                            };
                            scope.qualified.insert(
                                (alias.name.value.clone(), name.to_ascii_lowercase()),
                                self.kind(expr, &inner),
                            );
                        }
                    }
                    // The derived table's own scope, for expressions checked inside it.
                    scope.qualified.extend(inner.qualified);
                }
                _ => {}
            }
        }
    }

    /// The first construct in `node` (every expression, at any depth) that does not ship.
    fn first_unshippable<V: ast::Visit>(&self, node: &V, scope: &Scope) -> Option<String> {
        let mut found = None;
        let _ = ast::visit_expressions(node, |e| {
            if let Some(reason) = self.unshippable(e, scope) {
                found = Some(reason);
                return ControlFlow::Break(());
            }
            ControlFlow::Continue(())
        });
        found
    }

    /// Why `e` itself (not its parts) does not ship, if it does not.
    fn unshippable(&self, e: &Expr, scope: &Scope) -> Option<String> {
        let tz = Some(Kind::TimestampTz);
        match e {
            Expr::Function(f) => {
                let name = f.name.0.last()?.as_ident()?.value.to_ascii_lowercase();
                let args = function_args(f);
                if f.over.is_some() {
                    return Some(format!(
                        "{name}(…) OVER (…) in stage 1 is a window function, which postgres_fdw does not ship"
                    ));
                }
                match name.as_str() {
                    "to_char" => Some(stable("to_char formats by the session's settings")),
                    "date_trunc" if args.len() == 3 => {
                        Some(stable("date_trunc with a time zone"))
                    }
                    "date_trunc"
                        if matches!(
                            args.get(1).and_then(|a| self.kind(a, scope)),
                            Some(Kind::Date | Kind::TimestampTz)
                        ) =>
                    {
                        Some(stable(
                            "date_trunc of a date or timestamptz is PostgreSQL's timestamptz overload, which reads the session's time zone",
                        ))
                    }
                    "date_part" if args.get(1).and_then(|a| self.kind(a, scope)) == tz => Some(
                        stable("date_part of a timestamptz reads the session's time zone"),
                    ),
                    "date_trunc" | "date_part" => Some(text_input(&format!(
                        "{name} takes its unit as text"
                    ))),
                    "hashtextextended" => {
                        Some(text_input("the choice of a unit's groups hashes text"))
                    }
                    _ => None,
                }
            }
            Expr::Extract { expr, .. } if self.kind(expr, scope) == tz => Some(stable(
                "EXTRACT from a timestamptz reads the session's time zone",
            )),
            Expr::Extract { .. } => Some(text_input("EXTRACT takes its field as text")),
            Expr::Cast {
                expr, data_type, ..
            } => {
                let from = self.kind(expr, scope);
                let to = kind_of_type(data_type);
                let literal = matches!(**expr, Expr::Value(_));
                let text = matches!(
                    data_type,
                    DataType::Text | DataType::Varchar(_) | DataType::CharacterVarying(_)
                );
                let unshippable = match (from, to) {
                    (Some(Kind::Date | Kind::Timestamp), Some(Kind::TimestampTz))
                    | (Some(Kind::TimestampTz), Some(Kind::Date | Kind::Timestamp)) => true,
                    (None, Some(Kind::TimestampTz)) => !literal,
                    (Some(_), None) => text,
                    _ => false,
                };
                unshippable.then(|| {
                    stable(&format!(
                        "the cast to {data_type} of a date or time reads the session's time zone or date style"
                    ))
                })
            }
            Expr::BinaryOp { left, op, right } => {
                let (l, r) = (self.kind(left, scope), self.kind(right, scope));
                let mixed = matches!(
                    (l, r),
                    (Some(Kind::TimestampTz), Some(Kind::Date | Kind::Timestamp))
                        | (Some(Kind::Date | Kind::Timestamp), Some(Kind::TimestampTz))
                );
                let shifted = matches!(op, BinaryOperator::Plus | BinaryOperator::Minus)
                    && matches!(
                        (l, r),
                        (Some(Kind::TimestampTz), Some(Kind::Interval))
                            | (Some(Kind::Interval), Some(Kind::TimestampTz))
                    );
                if mixed {
                    Some(stable(&format!(
                        "{op} between a timestamptz and a date or timestamp reads the session's time zone"
                    )))
                } else if shifted {
                    Some(stable(
                        "a timestamptz plus or minus an interval reads the session's time zone",
                    ))
                } else {
                    None
                }
            }
            _ => None,
        }
    }

    /// The temporal kind of `e`'s value, if pgdp can tell it.
    fn kind(&self, e: &Expr, scope: &Scope) -> Option<Kind> {
        match e {
            Expr::Nested(inner) => self.kind(inner, scope),
            Expr::Identifier(i) => scope.columns.get(&i.value).copied().flatten(),
            Expr::CompoundIdentifier(parts) => match parts.as_slice() {
                [alias, column] => scope
                    .qualified
                    .get(&(alias.value.clone(), column.value.to_ascii_lowercase()))
                    .copied()
                    .flatten(),
                _ => None,
            },
            Expr::Cast { data_type, .. } => kind_of_type(data_type),
            Expr::TypedString(t) => kind_of_type(&t.data_type),
            Expr::Interval(_) => Some(Kind::Interval),
            Expr::Case {
                conditions,
                else_result,
                ..
            } => conditions
                .iter()
                .map(|c| &c.result)
                .chain(else_result.as_deref())
                .find_map(|r| self.kind(r, scope)),
            Expr::BinaryOp { left, op, right } => {
                let (l, r) = (self.kind(left, scope), self.kind(right, scope));
                match (op, l, r) {
                    (
                        BinaryOperator::Plus | BinaryOperator::Minus,
                        Some(Kind::Date),
                        Some(Kind::Interval),
                    )
                    | (BinaryOperator::Plus, Some(Kind::Interval), Some(Kind::Date)) => {
                        Some(Kind::Timestamp)
                    }
                    (BinaryOperator::Minus, Some(Kind::Date), Some(Kind::Date)) => None,
                    (BinaryOperator::Minus, Some(a), Some(b)) if a == b => Some(Kind::Interval),
                    (BinaryOperator::Plus | BinaryOperator::Minus, Some(k), _)
                    | (BinaryOperator::Plus, _, Some(k)) => Some(k),
                    _ => None,
                }
            }
            Expr::Function(f) => {
                let name = f.name.0.last()?.as_ident()?.value.to_ascii_lowercase();
                let args = function_args(f);
                match name.as_str() {
                    "date_trunc" => match args.get(1).and_then(|a| self.kind(a, scope)) {
                        Some(Kind::Timestamp) => Some(Kind::Timestamp),
                        Some(Kind::Interval) => Some(Kind::Interval),
                        _ => Some(Kind::TimestampTz),
                    },
                    "date_bin" => match args.get(1).and_then(|a| self.kind(a, scope)) {
                        Some(Kind::Timestamp) => Some(Kind::Timestamp),
                        _ => Some(Kind::TimestampTz),
                    },
                    "min" | "max" | "least" | "greatest" | "coalesce" | "nullif" => {
                        args.iter().find_map(|a| self.kind(a, scope))
                    }
                    _ => None,
                }
            }
            _ => None,
        }
    }
}

/// The reason a function with a text input that is not a column does not ship: postgres_fdw
/// (PostgreSQL 15) sends a function whose input collation comes from a foreign table's column
/// only, and a text literal or a cast to text has none.
fn text_input(what: &str) -> String {
    format!("{what} that is not a column of the table, and postgres_fdw (PostgreSQL 15) ships no function whose text input does not come from a column")
}

/// The reason a stable construct does not ship.
fn stable(what: &str) -> String {
    format!("{what} (stable in PostgreSQL), and postgres_fdw ships only immutable functions")
}

fn kind_of_type(t: &DataType) -> Option<Kind> {
    match t {
        DataType::Date => Some(Kind::Date),
        DataType::Timestamp(_, tz) => Some(match tz {
            ast::TimezoneInfo::WithTimeZone | ast::TimezoneInfo::Tz => Kind::TimestampTz,
            _ => Kind::Timestamp,
        }),
        DataType::Interval { .. } => Some(Kind::Interval),
        DataType::Custom(name, _) if table_key(name) == "timestamptz" => Some(Kind::TimestampTz),
        _ => None,
    }
}

fn last_name(e: &Expr) -> Option<String> {
    match e {
        Expr::Identifier(i) => Some(i.value.to_ascii_lowercase()),
        Expr::CompoundIdentifier(parts) => parts.last().map(|i| i.value.to_ascii_lowercase()),
        _ => None,
    }
}

/// The plain arguments of a call, in order.
fn function_args(f: &ast::Function) -> Vec<&Expr> {
    match &f.args {
        FunctionArguments::List(list) => list
            .args
            .iter()
            .filter_map(|a| match a {
                FunctionArg::Unnamed(FunctionArgExpr::Expr(e)) => Some(e),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dp::analyze::{self, Context};
    use crate::session::classify::{self, Statement as Classified};

    const DEMO_YAML: &str = include_str!("../../../policies/demo.yaml");

    /// The per-unit stage of `sql`'s partitionwise rewrite on the demo policy, with
    /// demo.people and demo.visits sharded by the unit.
    fn stage(sql: &str) -> PerUnitStage {
        stage_of(sql).expect("a stage 1")
    }

    /// [`per_unit_stage`] of `sql`'s partitionwise rewrite on the demo policy.
    fn stage_of(sql: &str) -> Option<PerUnitStage> {
        let policy = crate::policy::parse(DEMO_YAML).expect("demo policy");
        let statements = classify::classify(sql).expect("classified");
        let [Classified::Query(query)] = statements.as_slice() else {
            panic!("{sql}: not one query");
        };
        let ctx = Context {
            policy: &policy,
            search_path: vec!["demo".into()],
        };
        let plan = analyze::analyze(query, &ctx).expect("analysed");
        let rewrite = super::super::rewrite(&plan, &[], "s").expect("rewritten");
        let rewrite = super::super::partitionwise(rewrite, &policy, true).expect("reshaped");
        let sharded = ["demo.people".to_string(), "demo.visits".to_string()];
        per_unit_stage(rewrite.sql.as_str(), &sharded, &policy).expect("read")
    }

    /// Grouping sets are branches under `UNION ALL`, each with its own stage 1: no claim
    /// (EXPLAIN says pgdp cannot tell), never a claim about the first branch alone.
    /// [`per_unit_stage_on_citus`] of `sql`'s rewrite on the demo policy, with people and
    /// visits distributed by the unit and regions a reference table: of the single-server
    /// text, or with `shaped` of its distributed shape (what pgdp sends to Citus).
    fn citus_stage_of(sql: &str, shaped: bool) -> Option<PerUnitStage> {
        let policy = crate::policy::parse(DEMO_YAML).expect("demo policy");
        let statements = classify::classify(sql).expect("classified");
        let [Classified::Query(query)] = statements.as_slice() else {
            panic!("{sql}: not one query");
        };
        let ctx = Context {
            policy: &policy,
            search_path: vec!["demo".into()],
        };
        let plan = analyze::analyze(query, &ctx).expect("analysed");
        let mut rewrite = super::super::rewrite(&plan, &[], "s").expect("rewritten");
        if shaped {
            rewrite = super::super::distributed(rewrite).expect("reshaped");
        }
        let distributed = ["demo.people".to_string(), "demo.visits".to_string()];
        let reference = ["demo.regions".to_string()];
        per_unit_stage_on_citus(rewrite.sql.as_str(), &distributed, &reference).expect("read")
    }

    #[test]
    fn on_citus_value_stages_stay_in_the_tasks_in_the_distributed_shape() {
        for sql in [
            "SELECT diagnosis, COUNT(*) FROM demo.visits GROUP BY diagnosis",
            "SELECT region, SUM(cost) FROM demo.visits v JOIN demo.people p USING (person_id) GROUP BY region",
            "SELECT r.name, COUNT(*) FROM demo.visits v JOIN demo.people p USING (person_id) JOIN demo.regions r ON r.region = p.region GROUP BY r.name",
            "SELECT clinic, COUNT(DISTINCT person_id) FROM demo.visits GROUP BY clinic",
        ] {
            for shaped in [false, true] {
                assert_eq!(
                    citus_stage_of(sql, shaped),
                    Some(PerUnitStage::Shippable),
                    "{sql}"
                );
            }
        }
        // The value stages of a distinct count of another column and a quantile: pulled in the
        // single-server text, in the tasks in the distributed shape.
        for sql in [
            "SELECT COUNT(DISTINCT clinic) FROM demo.visits",
            "SELECT MEDIAN(cost) FROM demo.visits",
            "SELECT clinic, COUNT(DISTINCT diagnosis), PERCENTILE_CONT(0.9) WITHIN GROUP (ORDER BY cost) FROM demo.visits GROUP BY clinic",
        ] {
            assert_eq!(
                citus_stage_of(sql, true),
                Some(PerUnitStage::ShippableWithValueStages),
                "{sql}"
            );
        }
        for (sql, shaped, reason) in [
            (
                "SELECT COUNT(DISTINCT clinic) FROM demo.visits",
                false,
                "reads __dp_rows (per-unit rows) more than once",
            ),
            (
                "SELECT MEDIAN(cost) FROM demo.visits",
                false,
                "pulls every row of __dp_rows",
            ),
            (
                "SELECT drug, COUNT(*) FROM demo.prescriptions GROUP BY drug",
                true,
                "demo.prescriptions is a local table",
            ),
        ] {
            match citus_stage_of(sql, shaped) {
                Some(PerUnitStage::Coordinator { reason: why }) => {
                    assert!(why.contains(reason), "{sql}: {why}")
                }
                other => panic!("{sql}: {other:?}"),
            }
        }
    }

    #[test]
    fn on_citus_a_subquery_in_the_select_list_pulls_the_rows() {
        // The form stage 4 had before it joined the value stages (rewrite::ending::last_stage):
        // Citus then inlines none of the CTEs, even those marked NOT MATERIALIZED.
        let sql = "WITH __dp_rows AS NOT MATERIALIZED (SELECT \"__dp_t0\".\"person_id\" AS __dp_unit, \"__dp_t0\".\"clinic\" AS __dp_a0 FROM \"demo\".\"visits\" AS \"__dp_t0\"), __dp_per_unit AS (SELECT __dp_unit, COUNT(__dp_a0) AS __dp_n0 FROM __dp_rows GROUP BY __dp_unit), __dp_d0 AS (SELECT COUNT(DISTINCT __dp_a0) AS __dp_c FROM __dp_rows) SELECT COALESCE((SELECT __dp_c FROM __dp_d0), 0), COUNT(*) FROM __dp_per_unit";
        let distributed = ["demo.visits".to_string()];
        match per_unit_stage_on_citus(sql, &distributed, &[]).expect("read") {
            Some(PerUnitStage::Coordinator { reason }) => assert!(
                reason.contains("reads __dp_d0 in a subquery of its select list"),
                "{reason}"
            ),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_statement_without_one_stage_one_gets_no_claim() {
        let sql = "SELECT sex, region, COUNT(*) FROM demo.people GROUP BY GROUPING SETS ((sex), (region))";
        assert_eq!(stage_of(sql), None);
    }

    fn reason(sql: &str) -> String {
        match stage(sql) {
            PerUnitStage::Coordinator { reason } => reason,
            PerUnitStage::Shippable | PerUnitStage::ShippableWithValueStages => {
                panic!("{sql}: claimed shippable")
            }
        }
    }

    #[test]
    fn plain_columns_comparisons_and_buckets_ship() {
        for sql in [
            "SELECT diagnosis, COUNT(*), SUM(cost) FROM demo.visits GROUP BY diagnosis",
            "SELECT COUNT(DISTINCT diagnosis) FROM demo.visits",
            "SELECT p.education, COUNT(*) FROM demo.visits v JOIN demo.people p ON p.person_id = v.person_id GROUP BY p.education",
            "SELECT visit_date, COUNT(*) FROM demo.visits WHERE diagnosis = 'J06' GROUP BY 1",
            "SELECT width_bucket(cost, 0, 2000, 4) AS b, COUNT(*) FROM demo.visits GROUP BY 1",
            "SELECT COUNT(*) FROM demo.visits WHERE checked_in >= TIMESTAMPTZ '2024-01-01 00:00:00+00'",
            // Time buckets of whole days, as date arithmetic (super::bucket).
            "SELECT date_trunc('month', visit_date) AS m, COUNT(*) FROM demo.visits GROUP BY 1",
            "SELECT date_trunc('week', CAST(visit_date AS timestamp)) AS w, COUNT(*) FROM demo.visits GROUP BY 1",
            "SELECT date_trunc('quarter', visit_date) AS q, date_trunc('year', visit_date) AS y, SUM(cost) FROM demo.visits GROUP BY 1, 2",
            // A year of a date or timestamp, as its first day (super::bucket).
            "SELECT EXTRACT(year FROM visit_date) AS y, COUNT(*) FROM demo.visits GROUP BY 1",
            "SELECT date_part('year', CAST(visit_date AS timestamp)) AS y, AVG(cost) FROM demo.visits GROUP BY 1",
        ] {
            assert_eq!(stage(sql), PerUnitStage::Shippable, "{sql}");
        }
    }

    #[test]
    fn date_functions_text_inputs_windows_and_local_tables_keep_the_stage_on_the_coordinator() {
        let cases = [
            (
                "SELECT date_trunc('month', checked_in) AS m, COUNT(*) FROM demo.visits GROUP BY 1",
                "date_trunc of a date or timestamptz",
            ),
            (
                "SELECT date_trunc('hour', CAST(visit_date AS timestamp)) AS h, COUNT(*) FROM demo.visits GROUP BY 1",
                "date_trunc takes its unit as text",
            ),
            (
                "SELECT date_trunc('decade', visit_date) AS d, COUNT(*) FROM demo.visits GROUP BY 1",
                "date_trunc of a date or timestamptz",
            ),
            (
                "SELECT EXTRACT(month FROM visit_date) AS m, COUNT(*) FROM demo.visits GROUP BY 1",
                "EXTRACT takes its field as text",
            ),
            (
                "SELECT date_part('dow', visit_date) AS d, COUNT(*) FROM demo.visits GROUP BY 1",
                "date_part takes its unit as text",
            ),
            (
                "SELECT n, COUNT(*) FROM (SELECT person_id, COUNT(*) AS n FROM demo.visits GROUP BY person_id) t GROUP BY n",
                "hashes text",
            ),
            (
                "SELECT EXTRACT(hour FROM checked_in) AS h, COUNT(*) FROM demo.visits GROUP BY 1",
                "EXTRACT from a timestamptz",
            ),
            (
                "SELECT to_char(visit_date, 'YYYY-MM') AS m, COUNT(*) FROM demo.visits GROUP BY 1",
                "to_char",
            ),
            (
                "SELECT MEDIAN(cost) FROM demo.visits",
                "window function",
            ),
            (
                "SELECT r.name, COUNT(*) FROM demo.people p JOIN demo.regions r ON r.region = p.region GROUP BY r.name",
                "demo.regions is not partitioned by the privacy unit",
            ),
            (
                // The month is date arithmetic here too; the cohort's choice of group is not.
                "SELECT date_trunc('month', first_visit) AS cohort, COUNT(*) FROM (SELECT person_id, MIN(visit_date) AS first_visit FROM demo.visits GROUP BY person_id) t GROUP BY 1",
                "hashes text",
            ),
            (
                "SELECT CAST(date_trunc('month', first_visit) AS date) AS cohort, COUNT(*) FROM (SELECT person_id, MIN(visit_date) AS first_visit FROM demo.visits GROUP BY person_id) t GROUP BY 1",
                "stable in PostgreSQL",
            ),
        ];
        for (sql, expected) in cases {
            let reason = reason(sql);
            assert!(reason.contains(expected), "{sql}: {reason}");
        }
    }
}
