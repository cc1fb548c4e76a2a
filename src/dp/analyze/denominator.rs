//! A scalar subquery used as a denominator, `COUNT(*) * 1.0 / (SELECT COUNT(*) FROM t)`, read
//! as the same question asked of the released groups: `SUM(COUNT(*)) OVER ()`, cast to the
//! subquery's type.
//!
//! # Invariants
//! - Only a subquery whose FROM and WHERE are the outer query's own, with one `COUNT(*)` or
//!   `COUNT(x)` (no DISTINCT, FILTER, GROUP BY, HAVING, ORDER BY or LIMIT), in the outer
//!   query's select list or ORDER BY, is rewritten: its rows are exactly the outer query's rows
//!   before grouping, so its count is the sum of the outer groups' counts.
//! - That sum equals PostgreSQL's answer only when every row is in a released group: the
//!   caller ([`super::analyze`]) refuses the rewritten plan unless every key's domain is
//!   exhaustive (or there are no keys), and the outer query has no HAVING and no grouping
//!   sets ([`check`]). A key released by partition selection would drop groups from the sum:
//!   a wrong answer, so it is refused with the hint to ask for the total in a query of its own.
//! - The rewrite adds no release: the window sum is post-processing of the released counts,
//!   charged once with the outer query.

use sqlparser::ast::{self, Expr, SelectItem, SetExpr};
use sqlparser::dialect::PostgreSqlDialect;
use sqlparser::parser::Parser;

use crate::dp::plan::Plan;
use crate::error::{Error, Result};

/// The query with each such subquery replaced by `CAST(SUM(count) OVER () AS BIGINT)`, or
/// `None` when it has none.
pub(super) fn as_window(query: &ast::Query) -> Option<ast::Query> {
    let SetExpr::Select(outer) = query.body.as_ref() else {
        return None;
    };
    let mut rewritten = query.clone();
    let SetExpr::Select(select) = rewritten.body.as_mut() else {
        return None;
    };
    let mut changed = false;
    for item in &mut select.projection {
        // A bare subquery keeps PostgreSQL's column name for it: the count's.
        if let SelectItem::UnnamedExpr(Expr::Subquery(q)) = item {
            if let Some((window, name)) = window_of(q, outer) {
                *item = SelectItem::ExprWithAlias {
                    expr: window,
                    alias: ast::Ident::new(name),
                };
                changed = true;
                continue;
            }
        }
        let expr = match item {
            SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. } => e,
            _ => continue,
        };
        changed |= replace_in(expr, outer);
    }
    if let Some(order_by) = rewritten.order_by.as_mut() {
        if let ast::OrderByKind::Expressions(items) = &mut order_by.kind {
            for o in items {
                changed |= replace_in(&mut o.expr, outer);
            }
        }
    }
    changed.then_some(rewritten)
}

/// Replaces the denominators within `expr`; whether it replaced one.
fn replace_in(expr: &mut Expr, outer: &ast::Select) -> bool {
    let mut changed = false;
    let _ = ast::visit_expressions_mut(expr, |e| {
        if let Expr::Subquery(q) = e {
            if let Some((window, _)) = window_of(q, outer) {
                *e = Expr::Nested(Box::new(window));
                changed = true;
            }
        }
        std::ops::ControlFlow::<()>::Continue(())
    });
    changed
}

/// The window sum standing for subquery `q` and its column name, when `q` counts the rows of
/// `outer`'s FROM and WHERE.
fn window_of(q: &ast::Query, outer: &ast::Select) -> Option<(Expr, String)> {
    if q.with.is_some()
        || q.order_by.is_some()
        || q.limit_clause.is_some()
        || q.fetch.is_some()
        || !q.locks.is_empty()
    {
        return None;
    }
    let SetExpr::Select(s) = q.body.as_ref() else {
        return None;
    };
    let no_grouping = match &s.group_by {
        ast::GroupByExpr::Expressions(e, m) => e.is_empty() && m.is_empty(),
        ast::GroupByExpr::All(_) => false,
    };
    if s.from != outer.from
        || s.selection != outer.selection
        || !no_grouping
        || s.having.is_some()
        || s.distinct.is_some()
        || s.projection.len() != 1
    {
        return None;
    }
    let (count, alias) = match &s.projection[0] {
        SelectItem::UnnamedExpr(e) => (e, None),
        SelectItem::ExprWithAlias { expr, alias } => (expr, Some(alias.value.clone())),
        _ => return None,
    };
    let Expr::Function(f) = count else {
        return None;
    };
    let plain_count = f.name.to_string().eq_ignore_ascii_case("count")
        && f.filter.is_none()
        && f.over.is_none()
        && f.within_group.is_empty()
        && match &f.args {
            ast::FunctionArguments::List(list) => {
                list.duplicate_treatment.is_none() && list.args.len() == 1
            }
            _ => false,
        };
    if !plain_count {
        return None;
    }
    let text = format!("CAST(SUM({count}) OVER () AS BIGINT)");
    let window = Parser::new(&PostgreSqlDialect {})
        .try_with_sql(&text)
        .ok()?
        .parse_expr()
        .ok()?;
    Some((window, alias.unwrap_or_else(|| "count".into())))
}

/// Refuses a plan made from [`as_window`]'s query whose released groups may not hold every
/// row: a key without an exhaustive public domain, HAVING, or grouping sets.
pub(super) fn check(plan: &Plan, query: &ast::Query) -> Result<()> {
    let having = matches!(query.body.as_ref(), SetExpr::Select(s) if s.having.is_some());
    let every_row_released =
        (0..plan.keys.len()).all(|k| plan.key_exhaustive(k)) && plan.grouping_sets.is_none();
    if every_row_released && !having {
        return Ok(());
    }
    Err(Error::unsupported(
        "a subquery as a denominator here",
        "The total of all rows is the sum of the released groups only when every row is in one: with keys released by partition selection, keys not declared exhaustive, HAVING or grouping sets, some rows are in no released group. Ask for the total in a query of its own (SELECT COUNT(*) FROM <table> WHERE <same condition>), or, for each released group's share of the released groups, divide by SUM(COUNT(*)) OVER ().",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(sql: &str) -> ast::Query {
        match Parser::parse_sql(&PostgreSqlDialect {}, sql)
            .expect("parses")
            .remove(0)
        {
            ast::Statement::Query(q) => *q,
            other => panic!("{other}"),
        }
    }

    fn rewritten(sql: &str) -> Option<String> {
        as_window(&query(sql)).map(|q| q.to_string())
    }

    #[test]
    fn a_count_of_the_same_rows_becomes_the_sum_of_the_groups() {
        assert_eq!(
            rewritten("SELECT region, COUNT(*) * 1.0 / (SELECT COUNT(*) FROM demo.people) AS share FROM demo.people GROUP BY region ORDER BY COUNT(*) / (SELECT COUNT(*) FROM demo.people)").as_deref(),
            Some("SELECT region, COUNT(*) * 1.0 / (CAST(SUM(COUNT(*)) OVER () AS BIGINT)) AS share FROM demo.people GROUP BY region ORDER BY COUNT(*) / (CAST(SUM(COUNT(*)) OVER () AS BIGINT))")
        );
        // A bare subquery keeps PostgreSQL's name for its column.
        assert_eq!(
            rewritten("SELECT COUNT(*) FILTER (WHERE age > 60), (SELECT COUNT(age) FROM demo.people p WHERE p.sex = 'F') FROM demo.people p WHERE p.sex = 'F'").as_deref(),
            Some("SELECT COUNT(*) FILTER (WHERE age > 60), CAST(SUM(COUNT(age)) OVER () AS BIGINT) AS count FROM demo.people p WHERE p.sex = 'F'")
        );
    }

    #[test]
    fn other_subqueries_are_left_to_the_refusal() {
        for sql in [
            // Another WHERE, another FROM, another alias: other rows.
            "SELECT COUNT(*) * 1.0 / (SELECT COUNT(*) FROM demo.people) FROM demo.people WHERE age > 60",
            "SELECT COUNT(*) * 1.0 / (SELECT COUNT(*) FROM demo.visits) FROM demo.people",
            "SELECT COUNT(*) * 1.0 / (SELECT COUNT(*) FROM demo.people q) FROM demo.people p",
            // Not a plain count of them.
            "SELECT COUNT(*) * 1.0 / (SELECT COUNT(DISTINCT region) FROM demo.people) FROM demo.people",
            "SELECT COUNT(*) * 1.0 / (SELECT COUNT(*) FILTER (WHERE age > 3) FROM demo.people) FROM demo.people",
            "SELECT COUNT(*) * 1.0 / (SELECT SUM(age) FROM demo.people) FROM demo.people",
            "SELECT COUNT(*) * 1.0 / (SELECT COUNT(*) FROM demo.people GROUP BY region LIMIT 1) FROM demo.people",
            "SELECT COUNT(*) * 1.0 / (SELECT COUNT(*) + 1 FROM demo.people) FROM demo.people",
            // Not in the select list or ORDER BY.
            "SELECT COUNT(*) FROM demo.people WHERE age < (SELECT COUNT(*) FROM demo.people)",
        ] {
            assert_eq!(rewritten(sql), None, "{sql}");
        }
    }
}
