//! The partitionwise shape: the same statement as the single-server rewrite, written so that
//! PostgreSQL can run the per-unit work on each partition of a table partitioned by its privacy
//! unit, and so on each `postgres_fdw` shard (docs/scale-out.md).
//!
//! With `enable_partitionwise_aggregate` on, a `GROUP BY` that contains the partition key is
//! planned per partition, and `postgres_fdw` sends it to the shard holding the partition. The
//! rewrite's stage 2 (`__dp_per_unit`) groups by the unit, and `postgres_fdw` pushes such an
//! aggregate down when it can ship every expression in it. Three things in the single-server
//! text stop per-unit work from being pushed down, and [`partitionwise`] changes only those:
//!
//! 1. `__dp_rows` read by several stages (stage 2 and the stages of a distinct count or a
//!    quantile) is materialised by PostgreSQL: every row of the private table is then fetched
//!    to the coordinator and grouped there. Marked `NOT MATERIALIZED`, each reference is planned
//!    on its own, and the grouped ones are pushed down.
//! 2. The distinct values of a unit, `SELECT DISTINCT unit, keys, value FROM __dp_rows …`:
//!    `postgres_fdw` pushes `GROUP BY` but not `DISTINCT`, so it becomes the `GROUP BY` of the
//!    same columns (the same rows: a `DISTINCT` over plain columns is a `GROUP BY` of all of them,
//!    NULLs compared as equal in both).
//! 3. The clamp of stage 1, `CASE WHEN (x) IS NULL THEN NULL ELSE LEAST(GREATEST(v, lo), hi)
//!    END` with `v = CAST(x AS NUMERIC)`: `postgres_fdw` ships no `LEAST` or `GREATEST`, and an
//!    aggregate over an expression it cannot ship is computed on the coordinator, over every row.
//!    It becomes `CASE WHEN (x) IS NULL THEN NULL WHEN v < lo THEN lo WHEN v > hi THEN hi ELSE v
//!    END`: for a non-NULL `v` the same value (numeric order is total, NaN above every number in
//!    both), and NULL for NULL as before. Only this guarded form is changed: a bare `LEAST` or
//!    `GREATEST` ignores NULLs where the `CASE` would not.
//! 4. A group key `date_trunc(unit, x)` of a date or timestamp by day, week, month, quarter or
//!    year: `postgres_fdw` 15 ships no `date_trunc`, so stage 1 computes the bucket's first day
//!    in date arithmetic instead, and each stage that reads stage 1 turns it back into
//!    `date_trunc`'s value ([`super::bucket`]). A group key `EXTRACT(YEAR FROM x)` or
//!    `date_part('year', x)` of a date or timestamp likewise becomes the first day of `x`'s
//!    year, which the readers pass to the same function. Done only when every reader of stage 1
//!    is a `SELECT` that names its columns (no `*`).
//! 5. The lookup form of a join on the unit ([`super::lookup`]) groups the rows table per unit
//!    (`__dp_below`) and joins the lookup table to that (`__dp_per_unit`): `postgres_fdw` 15
//!    pushes no join of an aggregated foreign relation, so every row of the lookup table would
//!    cross to the coordinator. When the join equates the partition columns of two tables
//!    partitioned by their unit ([`lookup_on_shards`]), the two CTEs become one aggregate over
//!    the join, `SELECT <stage 2's columns>, <the lookup's keys> FROM __dp_rows JOIN lookup ON
//!    __dp_rows.__dp_unit = key WHERE <the lookup's conditions> GROUP BY <stage 2's grouping>,
//!    <the lookup's keys>`, which each shard runs over its own partitions. The same rows: the
//!    lookup has at most one row per unit, so its keys are one value per unit and grouping by
//!    them splits no group of stage 2; a unit without a lookup row passing the conditions has no
//!    row in either; each group's aggregates read the same rows of `__dp_rows`. Stage 2's names
//!    are qualified with `__dp_rows`, since the lookup table may have columns of the same names.
//!
//! Invariants:
//! - The statement computes the same rows as the one it was made from: the changes above
//!   are equivalences of SQL, and nothing else in the text changes (tests compare the rows of
//!   both on PostgreSQL, on one server and on shards). PostgreSQL inlines a `NOT MATERIALIZED`
//!   CTE only if it has no volatile function, so every reference still reads the same rows.
//! - The ranking window (stage 3) and stage 4 stay on the coordinator: `postgres_fdw` pushes no
//!   window function, so the rows that cross from the shards are one per unit and group.

use std::ops::ControlFlow;

use sqlparser::ast::{
    self, CteAsMaterialized, Distinct, GroupByExpr, SelectItem, SetExpr, Statement, TableFactor,
    VisitMut, VisitorMut,
};
use sqlparser::dialect::PostgreSqlDialect;
use sqlparser::parser::Parser;

use super::ship::StageOneKinds;
use super::{bucket, check_one_statement, Rewrite, UpstreamSql};
use crate::dp::plan::Plan;
use crate::error::{Error, Result};
use crate::policy::Policy;

/// The CTE holding stage 1.
const ROWS: &str = "__dp_rows";
/// The lookup form's stage 2 below the join ([`super::lookup`]).
const BELOW: &str = "__dp_below";
/// The per-unit stage.
const PER_UNIT: &str = "__dp_per_unit";

/// `rewrite` in the partitionwise shape (see the module documentation), marked to run with
/// partitionwise aggregation and joins on. The measures and arguments are unchanged. `policy`
/// gives the types of the columns (a time bucket is rewritten for dates and timestamps only);
/// `lookup_on_shards` says the lookup form may group over its join (item 5).
pub fn partitionwise(rewrite: Rewrite, policy: &Policy, lookup_on_shards: bool) -> Result<Rewrite> {
    Ok(Rewrite {
        sql: partitionwise_sql(&rewrite.sql, policy, lookup_on_shards)?,
        ..rewrite
    })
}

/// Whether the lookup join of `plan` ([`Plan::unit_lookup`]) equates the partition columns of
/// two tables partitioned by their unit: `by_unit` are the tables the upstream's catalog shows
/// partitioned by the unit column `policy` declares for them (`upstream::Placement::ByUnit`).
/// Then PostgreSQL can join them partition by partition, on each shard (docs/scale-out.md has
/// the shards co-partitioned); otherwise the lookup form keeps its join above the grouping.
pub fn lookup_on_shards(plan: &Plan, by_unit: &[String], policy: &Policy) -> bool {
    let Some(lookup) = plan.unit_lookup() else {
        return false;
    };
    let partitioned_by = |alias: &str, column: &str| {
        plan.tables().iter().any(|t| {
            t.alias == alias
                && t.source.is_none()
                && by_unit.contains(&t.table)
                && policy
                    .tables
                    .get(&t.table)
                    .and_then(|p| p.private())
                    .and_then(|p| p.privacy_unit.as_deref())
                    == Some(column)
        })
    };
    partitioned_by(&lookup.rows_unit.alias, &lookup.rows_unit.column)
        && partitioned_by(&lookup.key.alias, &lookup.key.column)
}

/// `sql` (a statement of the rewrite: an answer's or a contribution histogram's) in the
/// partitionwise shape, marked to run with partitionwise aggregation and joins on.
pub(super) fn partitionwise_sql(
    sql: &UpstreamSql,
    policy: &Policy,
    lookup_on_shards: bool,
) -> Result<UpstreamSql> {
    let text = reshape(sql.as_str(), policy, lookup_on_shards)?;
    check_one_statement(&text)?;
    Ok(UpstreamSql {
        text,
        partitionwise: true,
    })
}

/// The text of the partitionwise shape of the rewrite `sql`.
fn reshape(sql: &str, policy: &Policy, lookup_on_shards: bool) -> Result<String> {
    let mut statements = Parser::parse_sql(&PostgreSqlDialect {}, sql)
        .map_err(|e| Error::internal(format!("a rewrite does not parse again: {e}")))?;
    let [Statement::Query(query)] = statements.as_mut_slice() else {
        return Err(Error::internal("a rewrite is not one query"));
    };
    let mut readers = 0;
    let _ = ast::visit_relations(&**query, |name| {
        if is_rows(name) {
            readers += 1;
        }
        ControlFlow::<()>::Continue(())
    });
    if readers > 1 {
        if let Some(with) = &mut query.with {
            for cte in &mut with.cte_tables {
                if cte.alias.name.value == ROWS {
                    cte.materialized = Some(CteAsMaterialized::NotMaterialized);
                }
            }
        }
    }
    let _ = query.visit(&mut DistinctAsGroupBy);
    let mut clamps = ClampAsCase { error: None };
    let _ = query.visit(&mut clamps);
    if let Some(e) = clamps.error {
        return Err(e);
    }
    time_buckets(query, policy);
    if lookup_on_shards {
        lookup_as_one_aggregate(query);
    }
    Ok(query.to_string())
}

/// The lookup form's `__dp_below` and `__dp_per_unit` as one aggregate over the join (item 5
/// of the module documentation). `query` is left as it is unless both have the form the
/// rewrite writes (`super::ending`) and nothing else reads `__dp_below`.
fn lookup_as_one_aggregate(query: &mut ast::Query) {
    let mut below_reads = 0;
    let _ = ast::visit_relations(&*query, |name| {
        if named(name, BELOW) {
            below_reads += 1;
        }
        ControlFlow::<()>::Continue(())
    });
    let Some(with) = &mut query.with else {
        return;
    };
    let position = |name: &str| {
        with.cte_tables
            .iter()
            .position(|c| c.alias.name.value == name)
    };
    let (Some(b), Some(p)) = (position(BELOW), position(PER_UNIT)) else {
        return;
    };
    if below_reads != 1 {
        return;
    }
    let (SetExpr::Select(below), SetExpr::Select(per_unit)) = (
        with.cte_tables[b].query.body.as_ref(),
        with.cte_tables[p].query.body.as_ref(),
    ) else {
        return;
    };
    let Some(merged) = merged_per_unit(below, per_unit) else {
        return;
    };
    *with.cte_tables[p].query.body = SetExpr::Select(Box::new(merged));
    with.cte_tables.remove(b);
}

/// `per_unit` (`SELECT __dp_below.*, <keys> FROM __dp_below JOIN lookup ON … [WHERE …]`) over
/// the rows `below` (`SELECT <columns> FROM __dp_rows GROUP BY <grouping>`) groups, as one
/// aggregate over the join; `None` if either has another form.
fn merged_per_unit(below: &ast::Select, per_unit: &ast::Select) -> Option<ast::Select> {
    let one_table = |select: &ast::Select, name: &str, joins: usize| {
        matches!(
            select.from.as_slice(),
            [ast::TableWithJoins { relation: TableFactor::Table { name: n, alias: None, .. }, joins: j }]
                if j.len() == joins && named(n, name)
        ) && select.having.is_none()
            && select.distinct.is_none()
    };
    if !one_table(below, ROWS, 0) || below.selection.is_some() || !one_table(per_unit, BELOW, 1) {
        return None;
    }
    let GroupByExpr::Expressions(grouping, modifiers) = &below.group_by else {
        return None;
    };
    let ungrouped = matches!(&per_unit.group_by, GroupByExpr::Expressions(e, m) if e.is_empty() && m.is_empty());
    let [SelectItem::QualifiedWildcard(..), above @ ..] = per_unit.projection.as_slice() else {
        return None;
    };
    let above_keys: Option<Vec<ast::Expr>> = above
        .iter()
        .map(|item| match item {
            SelectItem::ExprWithAlias { expr, .. } => Some(expr.clone()),
            _ => None,
        })
        .collect();
    let above_keys = above_keys?;
    if !modifiers.is_empty() || !ungrouped {
        return None;
    }
    let join = per_unit.from.first()?.joins.first()?;
    if !matches!(
        &join.join_operator,
        ast::JoinOperator::Join(ast::JoinConstraint::On(_))
            | ast::JoinOperator::Inner(ast::JoinConstraint::On(_))
    ) {
        return None;
    }
    let mut merged = per_unit.clone();
    let mut qualify = QualifyRows;
    let mut projection = below.projection.clone();
    let _ = projection.visit(&mut qualify);
    projection.extend(above.iter().cloned());
    merged.projection = projection;
    let mut group = grouping.clone();
    let _ = group.visit(&mut qualify);
    group.extend(above_keys);
    merged.group_by = GroupByExpr::Expressions(group, Vec::new());
    let from = merged.from.first_mut()?;
    from.relation = below.from.first()?.relation.clone();
    let _ = from.joins.visit(&mut BelowAsRows);
    let _ = merged.selection.visit(&mut BelowAsRows);
    Some(merged)
}

/// Qualifies every bare column name with `__dp_rows` (stage 2's expressions, which read stage 1
/// alone, once they sit beside the lookup table).
struct QualifyRows;

impl VisitorMut for QualifyRows {
    type Break = ();

    fn post_visit_expr(&mut self, expr: &mut ast::Expr) -> ControlFlow<()> {
        if let ast::Expr::Identifier(i) = expr {
            *expr = ast::Expr::CompoundIdentifier(vec![ast::Ident::new(ROWS), i.clone()]);
        }
        ControlFlow::Continue(())
    }
}

/// Renames `__dp_below.column` to `__dp_rows.column` (the unit in the join's condition).
struct BelowAsRows;

impl VisitorMut for BelowAsRows {
    type Break = ();

    fn post_visit_expr(&mut self, expr: &mut ast::Expr) -> ControlFlow<()> {
        if let ast::Expr::CompoundIdentifier(parts) = expr {
            if let [table, _] = parts.as_mut_slice() {
                if table.value == BELOW {
                    *table = ast::Ident::new(ROWS);
                }
            }
        }
        ControlFlow::Continue(())
    }
}

/// Stage 1's `date_trunc` keys as their buckets' first days, turned back into `date_trunc`'s
/// value wherever a stage reads them (item 4 of the module documentation). `query` is left as it
/// is unless every reference to stage 1 is in the FROM of a `SELECT` without `*`.
fn time_buckets(query: &mut ast::Query, policy: &Policy) {
    let Some(with) = &mut query.with else {
        return;
    };
    let Some(rows) = with
        .cte_tables
        .iter_mut()
        .find(|c| c.alias.name.value == ROWS)
    else {
        return;
    };
    let kinds = StageOneKinds::new(&rows.query, policy);
    let SetExpr::Select(select) = rows.query.body.as_mut() else {
        return;
    };
    let mut keys = Vec::new();
    let mut stage_one = select.projection.clone();
    for item in &mut stage_one {
        let SelectItem::ExprWithAlias { expr, alias } = item else {
            continue;
        };
        if !alias.value.starts_with("__dp_k") {
            continue;
        }
        if let Some((first_day, value)) = bucket::as_first_day(expr, |e| kinds.kind(e), alias) {
            keys.push((alias.value.clone(), value));
            *expr = first_day;
        }
    }
    if keys.is_empty() {
        return;
    }
    select.projection = stage_one;
    let mut candidate = query.clone();
    let mut references = 0;
    let _ = ast::visit_relations(&candidate, |name| {
        if is_rows(name) {
            references += 1;
        }
        ControlFlow::<()>::Continue(())
    });
    let mut readers = BucketReaders {
        keys: &keys,
        reads: 0,
        named: true,
    };
    let _ = candidate.visit(&mut readers);
    if readers.named && readers.reads == references {
        *query = candidate;
    }
}

/// Turns stage 1's time-bucket keys back into `date_trunc`'s value in every `SELECT` that reads
/// stage 1 (a bare key in the select list keeps its name; a bare key in `GROUP BY` stays, so the
/// grouping is by stage 1's date). Counts the references to stage 1 it handled, and notes a
/// reader with `*`, which would pass the date on.
struct BucketReaders<'a> {
    /// Each key's name and the expression of its value (`CAST(key AS …)`).
    keys: &'a [(String, ast::Expr)],
    reads: usize,
    named: bool,
}

impl VisitorMut for BucketReaders<'_> {
    type Break = ();

    fn pre_visit_query(&mut self, query: &mut ast::Query) -> ControlFlow<()> {
        let SetExpr::Select(select) = query.body.as_mut() else {
            return ControlFlow::Continue(());
        };
        let factors = select
            .from
            .iter()
            .flat_map(|f| std::iter::once(&f.relation).chain(f.joins.iter().map(|j| &j.relation)));
        let reads = factors
            .filter(|f| matches!(f, TableFactor::Table { name, .. } if is_rows(name)))
            .count();
        if reads == 0 {
            return ControlFlow::Continue(());
        }
        self.reads += reads;
        let value = |name: &str| {
            self.keys
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        };
        for item in &mut select.projection {
            match item {
                SelectItem::UnnamedExpr(ast::Expr::Identifier(i)) => {
                    if let Some(v) = value(&i.value) {
                        *item = SelectItem::ExprWithAlias {
                            expr: v,
                            alias: i.clone(),
                        };
                    }
                }
                SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. } => {
                    let mut values = KeyValues::new(self.keys);
                    let _ = e.visit(&mut values);
                    self.named &= !values.qualified;
                }
                _ => self.named = false,
            }
        }
        let mut values = KeyValues::new(self.keys);
        if let GroupByExpr::Expressions(exprs, _) = &mut select.group_by {
            for e in exprs.iter_mut() {
                if !matches!(e, ast::Expr::Identifier(_)) {
                    let _ = e.visit(&mut values);
                }
            }
        }
        let _ = select.selection.visit(&mut values);
        let _ = select.having.visit(&mut values);
        for from in &mut select.from {
            for join in &mut from.joins {
                let _ = join.join_operator.visit(&mut values);
            }
        }
        self.named &= !values.qualified;
        ControlFlow::Continue(())
    }
}

/// Replaces each key named in `keys` by its value, outside subqueries (a subquery that reads
/// stage 1 is a reader of its own), and notes a key named with a table's alias, which it does
/// not replace.
struct KeyValues<'a> {
    keys: &'a [(String, ast::Expr)],
    depth: usize,
    qualified: bool,
}

impl<'a> KeyValues<'a> {
    fn new(keys: &'a [(String, ast::Expr)]) -> KeyValues<'a> {
        KeyValues {
            keys,
            depth: 0,
            qualified: false,
        }
    }
}

impl VisitorMut for KeyValues<'_> {
    type Break = ();

    fn pre_visit_query(&mut self, _: &mut ast::Query) -> ControlFlow<()> {
        self.depth += 1;
        ControlFlow::Continue(())
    }

    fn post_visit_query(&mut self, _: &mut ast::Query) -> ControlFlow<()> {
        self.depth -= 1;
        ControlFlow::Continue(())
    }

    fn post_visit_expr(&mut self, expr: &mut ast::Expr) -> ControlFlow<()> {
        if self.depth > 0 {
            return ControlFlow::Continue(());
        }
        match expr {
            ast::Expr::Identifier(i) => {
                if let Some((_, v)) = self.keys.iter().find(|(k, _)| *k == i.value) {
                    *expr = v.clone();
                }
            }
            ast::Expr::CompoundIdentifier(parts) => {
                let last = parts.last().map(|i| i.value.as_str());
                self.qualified |= self.keys.iter().any(|(k, _)| Some(k.as_str()) == last);
            }
            _ => {}
        }
        ControlFlow::Continue(())
    }
}

fn is_rows(name: &ast::ObjectName) -> bool {
    named(name, ROWS)
}

/// Whether `name` is the unqualified name `cte`.
fn named(name: &ast::ObjectName, cte: &str) -> bool {
    matches!(
        name.0.as_slice(),
        [part] if part.as_ident().is_some_and(|i| i.value == cte)
    )
}

/// Turns `SELECT DISTINCT <columns> FROM __dp_rows …` (plain columns, no GROUP BY) into
/// `SELECT <columns> FROM __dp_rows … GROUP BY <columns>`.
struct DistinctAsGroupBy;

impl VisitorMut for DistinctAsGroupBy {
    type Break = ();

    fn pre_visit_query(&mut self, query: &mut ast::Query) -> ControlFlow<()> {
        let SetExpr::Select(select) = query.body.as_mut() else {
            return ControlFlow::Continue(());
        };
        let reads_rows = matches!(
            select.from.as_slice(),
            [ast::TableWithJoins { relation: TableFactor::Table { name, .. }, joins }]
                if joins.is_empty() && is_rows(name)
        );
        let no_grouping = matches!(&select.group_by, GroupByExpr::Expressions(e, m) if e.is_empty() && m.is_empty());
        if !reads_rows || !no_grouping || select.distinct != Some(Distinct::Distinct) {
            return ControlFlow::Continue(());
        }
        let columns: Option<Vec<ast::Expr>> = select
            .projection
            .iter()
            .map(|item| match item {
                SelectItem::UnnamedExpr(e @ ast::Expr::Identifier(_)) => Some(e.clone()),
                _ => None,
            })
            .collect();
        if let Some(columns) = columns {
            select.distinct = None;
            select.group_by = GroupByExpr::Expressions(columns, Vec::new());
        }
        ControlFlow::Continue(())
    }
}

/// Turns the guarded clamp `CASE WHEN (x) IS NULL THEN NULL ELSE LEAST(GREATEST(v, lo), hi)
/// END` (`v` a cast to numeric) into `CASE WHEN (x) IS NULL THEN NULL WHEN v < lo THEN lo WHEN
/// v > hi THEN hi ELSE v END`.
struct ClampAsCase {
    error: Option<Error>,
}

/// The arguments of a plain call of function `name` (no DISTINCT, ORDER BY, FILTER or OVER).
fn call<'a>(expr: &'a ast::Expr, name: &str) -> Option<Vec<&'a ast::Expr>> {
    let ast::Expr::Function(f) = expr else {
        return None;
    };
    let plain = f.over.is_none() && f.filter.is_none() && f.within_group.is_empty();
    if !plain || !f.name.to_string().eq_ignore_ascii_case(name) {
        return None;
    }
    let ast::FunctionArguments::List(list) = &f.args else {
        return None;
    };
    if list.duplicate_treatment.is_some() || !list.clauses.is_empty() {
        return None;
    }
    list.args
        .iter()
        .map(|a| match a {
            ast::FunctionArg::Unnamed(ast::FunctionArgExpr::Expr(e)) => Some(e),
            _ => None,
        })
        .collect()
}

/// The parts `(guard, v, lo, hi)` of a guarded clamp.
fn clamp_parts(expr: &ast::Expr) -> Option<(&ast::Expr, &ast::Expr, &ast::Expr, &ast::Expr)> {
    let ast::Expr::Case {
        operand: None,
        conditions,
        else_result: Some(otherwise),
        ..
    } = expr
    else {
        return None;
    };
    let [when] = conditions.as_slice() else {
        return None;
    };
    let null_result = matches!(&when.result, ast::Expr::Value(v) if v.value == ast::Value::Null);
    if !matches!(when.condition, ast::Expr::IsNull(_)) || !null_result {
        return None;
    }
    let [greatest, hi] = call(otherwise, "LEAST")?.try_into().ok()?;
    let [v, lo] = call(greatest, "GREATEST")?.try_into().ok()?;
    let numeric = matches!(
        v,
        ast::Expr::Cast {
            data_type: ast::DataType::Numeric(_),
            ..
        }
    );
    numeric.then_some((&when.condition, v, lo, hi))
}

impl VisitorMut for ClampAsCase {
    type Break = ();

    fn post_visit_expr(&mut self, expr: &mut ast::Expr) -> ControlFlow<()> {
        let Some((guard, v, lo, hi)) = clamp_parts(expr) else {
            return ControlFlow::Continue(());
        };
        let text = format!(
            "CASE WHEN {guard} THEN NULL WHEN {v} < {lo} THEN {lo} WHEN {v} > {hi} THEN {hi} ELSE {v} END"
        );
        let parsed = Parser::new(&PostgreSqlDialect {})
            .try_with_sql(&text)
            .and_then(|mut p| p.parse_expr());
        match parsed {
            Ok(case) => {
                *expr = case;
                ControlFlow::Continue(())
            }
            Err(e) => {
                self.error = Some(Error::internal(format!(
                    "a clamp does not parse as CASE: {e}"
                )));
                ControlFlow::Break(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reshape(sql: &str) -> Result<String> {
        let policy =
            crate::policy::parse(include_str!("../../../policies/demo.yaml")).expect("demo policy");
        super::reshape(sql, &policy, false)
    }

    #[test]
    fn a_distinct_count_reads_its_rows_unmaterialised_and_groups_instead_of_distinct() {
        let sql = "WITH __dp_rows AS (SELECT \"__dp_t0\".\"person_id\" AS __dp_unit, \"__dp_t0\".\"diagnosis\" AS __dp_a0 FROM \"demo\".\"visits\" AS \"__dp_t0\"), __dp_per_unit AS (SELECT __dp_unit, COUNT(__dp_a0) AS __dp_n0 FROM __dp_rows GROUP BY __dp_unit), __dp_v0 AS (SELECT __dp_unit AS __dp_vu, __dp_a0 AS __dp_v, ROW_NUMBER() OVER (PARTITION BY __dp_unit ORDER BY hashtextextended(CAST(__dp_unit AS TEXT) || '|' || CAST(__dp_a0 AS TEXT), 1)) AS __dp_vrank FROM (SELECT DISTINCT __dp_unit, __dp_a0 FROM __dp_rows WHERE __dp_a0 IS NOT NULL) AS __dp_distinct0), __dp_d0 AS (SELECT COUNT(DISTINCT __dp_v) AS __dp_c FROM __dp_v0 WHERE __dp_vrank <= 10) SELECT COALESCE((SELECT __dp_c FROM __dp_d0), 0), COUNT(*) FROM __dp_per_unit";
        let expected = sql
            .replace(
                "WITH __dp_rows AS (",
                "WITH __dp_rows AS NOT MATERIALIZED (",
            )
            .replace(
                "(SELECT DISTINCT __dp_unit, __dp_a0 FROM __dp_rows WHERE __dp_a0 IS NOT NULL)",
                "(SELECT __dp_unit, __dp_a0 FROM __dp_rows WHERE __dp_a0 IS NOT NULL GROUP BY __dp_unit, __dp_a0)",
            );
        assert_eq!(reshape(sql).expect("reshaped"), expected);
    }

    #[test]
    fn a_guarded_clamp_becomes_a_case_and_other_least_calls_stay() {
        let sql = "WITH __dp_rows AS (SELECT \"__dp_t0\".\"person_id\" AS __dp_unit, CASE WHEN (\"__dp_t0\".\"cost\") IS NULL THEN NULL ELSE LEAST(GREATEST(CAST(\"__dp_t0\".\"cost\" AS NUMERIC), 0), 2000) END AS __dp_a0 FROM \"demo\".\"visits\" AS \"__dp_t0\"), __dp_per_unit AS (SELECT __dp_unit, COUNT(__dp_a0) AS __dp_n0, SUM(__dp_a0) AS __dp_s0 FROM __dp_rows GROUP BY __dp_unit) SELECT SUM(CASE WHEN __dp_n0 <= 10 THEN __dp_s0 ELSE LEAST(GREATEST(__dp_s0 * (CAST(10 AS NUMERIC) / __dp_n0), 0), 20000) END), COUNT(*) FROM __dp_per_unit";
        let expected = sql.replace(
            "CASE WHEN (\"__dp_t0\".\"cost\") IS NULL THEN NULL ELSE LEAST(GREATEST(CAST(\"__dp_t0\".\"cost\" AS NUMERIC), 0), 2000) END",
            "CASE WHEN (\"__dp_t0\".\"cost\") IS NULL THEN NULL WHEN CAST(\"__dp_t0\".\"cost\" AS NUMERIC) < 0 THEN 0 WHEN CAST(\"__dp_t0\".\"cost\" AS NUMERIC) > 2000 THEN 2000 ELSE CAST(\"__dp_t0\".\"cost\" AS NUMERIC) END",
        );
        assert_ne!(expected, sql);
        assert_eq!(reshape(sql).expect("reshaped"), expected);
    }

    #[test]
    fn a_rewrite_reading_its_rows_once_is_unchanged() {
        let sql = "WITH __dp_rows AS (SELECT \"__dp_t0\".\"person_id\" AS __dp_unit, \"__dp_t0\".\"region\" AS __dp_k0 FROM \"demo\".\"people\" AS \"__dp_t0\"), __dp_per_unit AS (SELECT __dp_unit, __dp_k0, COUNT(*) AS __dp_r0 FROM __dp_rows GROUP BY __dp_unit, __dp_k0), __dp_ranked AS (SELECT *, ROW_NUMBER() OVER (PARTITION BY __dp_unit ORDER BY hashtextextended(CAST(__dp_unit AS TEXT) || '|' || COALESCE(CAST(__dp_k0 AS TEXT), '<null>'), 1)) AS __dp_rank FROM __dp_per_unit) SELECT CAST(__dp_k0 AS TEXT), SUM(LEAST(__dp_r0, 1)), COUNT(*) FROM __dp_ranked WHERE __dp_rank <= 1 GROUP BY __dp_k0";
        assert_eq!(reshape(sql).expect("reshaped"), sql);
    }

    #[test]
    fn a_lookup_join_becomes_one_aggregate_over_the_join_where_it_can_run_on_the_shards() {
        let policy =
            crate::policy::parse(include_str!("../../../policies/demo.yaml")).expect("demo policy");
        let sql = "WITH __dp_rows AS (SELECT \"__dp_t0\".\"person_id\" AS __dp_unit, \"__dp_t0\".\"clinic\" AS __dp_k1, CASE WHEN (\"__dp_t0\".\"cost\") IS NULL THEN NULL ELSE LEAST(GREATEST(CAST(\"__dp_t0\".\"cost\" AS NUMERIC), 0), 2000) END AS __dp_a0 FROM \"demo\".\"visits\" AS \"__dp_t0\" WHERE \"__dp_t0\".\"cost\" > 20), __dp_below AS (SELECT __dp_unit, __dp_k1, COUNT(*) AS __dp_r0, COUNT(*) AS __dp_w, SUM(__dp_a0) AS __dp_s0 FROM __dp_rows GROUP BY __dp_unit, __dp_k1), __dp_per_unit AS (SELECT __dp_below.*, \"__dp_t1\".\"education\" AS __dp_k0 FROM __dp_below JOIN \"demo\".\"people\" AS \"__dp_t1\" ON __dp_below.__dp_unit = \"__dp_t1\".\"person_id\" WHERE \"__dp_t1\".\"sex\" = 'F'), __dp_ranked AS (SELECT *, ROW_NUMBER() OVER (PARTITION BY __dp_unit ORDER BY __dp_w DESC, hashtextextended(CAST(__dp_unit AS TEXT) || '|' || COALESCE(CAST(__dp_k0 AS TEXT), '<null>') || '|' || COALESCE(CAST(__dp_k1 AS TEXT), '<null>'), 1)) AS __dp_rank FROM __dp_per_unit) SELECT CAST(__dp_k0 AS TEXT), CAST(__dp_k1 AS TEXT), SUM(LEAST(__dp_r0, 10)), COUNT(*) FROM __dp_ranked WHERE __dp_rank <= 5 GROUP BY __dp_k0, __dp_k1";
        let clamped = super::reshape(sql, &policy, false).expect("reshaped");
        assert!(clamped.contains("__dp_below AS ("), "{clamped}");
        let merged = super::reshape(sql, &policy, true).expect("reshaped");
        let two_stages = "__dp_below AS (SELECT __dp_unit, __dp_k1, COUNT(*) AS __dp_r0, COUNT(*) AS __dp_w, SUM(__dp_a0) AS __dp_s0 FROM __dp_rows GROUP BY __dp_unit, __dp_k1), __dp_per_unit AS (SELECT __dp_below.*, \"__dp_t1\".\"education\" AS __dp_k0 FROM __dp_below JOIN \"demo\".\"people\" AS \"__dp_t1\" ON __dp_below.__dp_unit = \"__dp_t1\".\"person_id\" WHERE \"__dp_t1\".\"sex\" = 'F')";
        let one_stage = "__dp_per_unit AS (SELECT __dp_rows.__dp_unit, __dp_rows.__dp_k1, COUNT(*) AS __dp_r0, COUNT(*) AS __dp_w, SUM(__dp_rows.__dp_a0) AS __dp_s0, \"__dp_t1\".\"education\" AS __dp_k0 FROM __dp_rows JOIN \"demo\".\"people\" AS \"__dp_t1\" ON __dp_rows.__dp_unit = \"__dp_t1\".\"person_id\" WHERE \"__dp_t1\".\"sex\" = 'F' GROUP BY __dp_rows.__dp_unit, __dp_rows.__dp_k1, \"__dp_t1\".\"education\")";
        assert_eq!(merged, clamped.replace(two_stages, one_stage));
        assert_ne!(merged, clamped);
        // Another reader of __dp_below, or another form, keeps the two stages.
        let read_twice = sql.replace(
            "FROM __dp_ranked WHERE",
            "FROM __dp_ranked, (SELECT COUNT(*) FROM __dp_below) AS __dp_x WHERE",
        );
        let kept = super::reshape(&read_twice, &policy, true).expect("reshaped");
        assert!(kept.contains("__dp_below AS ("), "{kept}");
        let left = sql.replace("FROM __dp_below JOIN", "FROM __dp_below LEFT JOIN");
        let kept = super::reshape(&left, &policy, true).expect("reshaped");
        assert!(kept.contains("__dp_below AS ("), "{kept}");
    }

    #[test]
    fn a_distinct_over_other_tables_or_expressions_is_left_alone() {
        for sql in [
            "SELECT DISTINCT a FROM t",
            "WITH __dp_rows AS (SELECT 1 AS a) SELECT DISTINCT a + 1 FROM __dp_rows",
            "WITH __dp_rows AS (SELECT 1 AS a) SELECT DISTINCT ON (a) a FROM __dp_rows",
        ] {
            assert_eq!(reshape(sql).expect("reshaped"), sql);
        }
    }
}
