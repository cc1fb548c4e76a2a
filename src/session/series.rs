//! Top-k joins of two aggregates, as Superset writes a chart's series limit: the main query
//! joined to `(SELECT clinic AS clinic__, AVG(cost) AS mme_inner__ FROM … GROUP BY clinic ORDER BY
//! mme_inner__ DESC LIMIT 5) AS series_limit ON clinic = clinic__`.
//!
//! The inner aggregate is released as the DP query it is (charged); its released keys then
//! restrict the main query, which is released as a DP query of its own (charged):
//! `… WHERE … AND clinic IN ('north', 'south', …)`. An inner join on keys that are unique in
//! the inner result keeps exactly the main query's rows whose keys are among them, so this is
//! the analyst's query; the list is post-processing of a release, so the main query's
//! sensitivity and charge are those of any DP query with a literal IN list.
//!
//! Invariants:
//! - [`split`] recognises only an inner join of one derived table that aggregates with GROUP BY,
//!   on equalities of its output columns (each named once in its select list) with expressions
//!   of the main query; everything else is left to analysis, which refuses it.
//! - [`restrict`] writes only values the inner release returned, as literals.
//! - Pure: the session runs both queries.

use sqlparser::ast::{self, BinaryOperator, Expr, GroupByExpr, JoinConstraint, JoinOperator};

use crate::error::{Error, Result};
use crate::output::Cell;

/// A main query joined to an aggregate subquery on its keys.
#[derive(Debug, Clone, PartialEq)]
pub struct SeriesLimit {
    /// The aggregate subquery, to release first.
    pub inner: ast::Query,
    /// The main query without the join.
    pub outer: ast::Query,
    /// Per join equality: the main query's expression and the inner output column it equals.
    pub keys: Vec<(Expr, String)>,
}

/// The series-limit form of `query`, if it has one.
pub fn split(query: &ast::Query) -> Option<SeriesLimit> {
    let ast::SetExpr::Select(select) = query.body.as_ref() else {
        return None;
    };
    let [from] = select.from.as_slice() else {
        return None;
    };
    let [join] = from.joins.as_slice() else {
        return None;
    };
    let constraint = match &join.join_operator {
        JoinOperator::Join(c) | JoinOperator::Inner(c) => c,
        _ => return None,
    };
    let ast::TableFactor::Derived {
        lateral: false,
        subquery,
        alias: Some(alias),
        ..
    } = &join.relation
    else {
        return None;
    };
    let ast::SetExpr::Select(inner) = subquery.body.as_ref() else {
        return None;
    };
    let grouped =
        !matches!(&inner.group_by, GroupByExpr::Expressions(e, m) if e.is_empty() && m.is_empty());
    if !grouped || subquery.with.is_some() {
        return None;
    }
    let outputs: Vec<String> = inner
        .projection
        .iter()
        .filter_map(|item| match item {
            ast::SelectItem::ExprWithAlias { alias, .. } => Some(alias.value.to_ascii_lowercase()),
            ast::SelectItem::UnnamedExpr(Expr::Identifier(i)) => Some(i.value.to_ascii_lowercase()),
            _ => None,
        })
        .collect();
    let JoinConstraint::On(on) = constraint else {
        return None;
    };
    let alias_name = alias.name.value.to_ascii_lowercase();
    let mut keys = Vec::new();
    for equality in conjuncts(on) {
        let Expr::BinaryOp {
            left,
            op: BinaryOperator::Eq,
            right,
        } = equality
        else {
            return None;
        };
        let inner_column = |e: &Expr| -> Option<String> {
            let name = match e {
                Expr::Identifier(i) => i.value.to_ascii_lowercase(),
                Expr::CompoundIdentifier(parts) => match parts.as_slice() {
                    [table, column] if table.value.to_ascii_lowercase() == alias_name => {
                        column.value.to_ascii_lowercase()
                    }
                    _ => return None,
                },
                _ => return None,
            };
            (outputs.iter().filter(|o| **o == name).count() == 1).then_some(name)
        };
        let mentions_inner = |e: &Expr| {
            ast::visit_expressions(e, |x| match x {
                Expr::CompoundIdentifier(parts)
                    if parts
                        .first()
                        .is_some_and(|p| p.value.to_ascii_lowercase() == alias_name) =>
                {
                    std::ops::ControlFlow::Break(())
                }
                Expr::Identifier(i) if inner_column(&Expr::Identifier(i.clone())).is_some() => {
                    std::ops::ControlFlow::Break(())
                }
                _ => std::ops::ControlFlow::Continue(()),
            })
            .is_break()
        };
        match (inner_column(left), inner_column(right)) {
            (None, Some(c)) if !mentions_inner(left) => keys.push((left.as_ref().clone(), c)),
            (Some(c), None) if !mentions_inner(right) => keys.push((right.as_ref().clone(), c)),
            _ => return None,
        }
    }
    if keys.is_empty() {
        return None;
    }
    let mut outer = query.clone();
    if let ast::SetExpr::Select(s) = outer.body.as_mut() {
        if let Some(first) = s.from.first_mut() {
            first.joins.clear();
        }
    }
    Some(SeriesLimit {
        inner: subquery.as_ref().clone(),
        outer,
        keys,
    })
}

fn conjuncts(e: &Expr) -> Vec<&Expr> {
    match e {
        Expr::Nested(inner) => conjuncts(inner),
        Expr::BinaryOp {
            left,
            op: BinaryOperator::And,
            right,
        } => {
            let mut all = conjuncts(left);
            all.extend(conjuncts(right));
            all
        }
        other => vec![other],
    }
}

/// The main query restricted to the rows whose keys are among the released `rows` of the inner
/// query (`columns` are its output names): one `expr IN (…)` per key, or a row comparison per
/// released row when there are several keys. Rows with a NULL key match nothing, as in the
/// join.
pub fn restrict(
    series: &SeriesLimit,
    columns: &[String],
    rows: &[Vec<Cell>],
) -> Result<ast::Query> {
    let positions = series
        .keys
        .iter()
        .map(|(_, column)| {
            columns
                .iter()
                .position(|c| c.eq_ignore_ascii_case(column))
                .ok_or_else(|| Error::internal("a series-limit key missing from its release"))
        })
        .collect::<Result<Vec<usize>>>()?;
    let literal = |cell: &Cell| -> Option<Expr> {
        let text = match cell {
            Cell::Null => return None,
            Cell::Int(i) => i.to_string(),
            Cell::Float(f) => f.to_string(),
            Cell::Text(t) => t.clone(),
            Cell::Bool(b) => b.to_string(),
        };
        Some(Expr::value(crate::literal::dollar_quoted(&text)))
    };
    let mut alternatives: Vec<Expr> = Vec::new();
    for row in rows {
        let mut equalities = Vec::new();
        for ((expr, _), &at) in series.keys.iter().zip(&positions) {
            let Some(value) = row.get(at).and_then(literal) else {
                equalities.clear();
                break;
            };
            equalities.push(Expr::BinaryOp {
                left: Box::new(Expr::Nested(Box::new(expr.clone()))),
                op: BinaryOperator::Eq,
                right: Box::new(value),
            });
        }
        if let Some(all) = equalities.into_iter().reduce(|a, b| Expr::BinaryOp {
            left: Box::new(a),
            op: BinaryOperator::And,
            right: Box::new(b),
        }) {
            alternatives.push(Expr::Nested(Box::new(all)));
        }
    }
    // No released key: the join keeps no row.
    let condition = alternatives
        .into_iter()
        .reduce(|a, b| Expr::BinaryOp {
            left: Box::new(a),
            op: BinaryOperator::Or,
            right: Box::new(b),
        })
        .unwrap_or_else(|| Expr::value(ast::Value::Boolean(false)));
    let mut outer = series.outer.clone();
    if let ast::SetExpr::Select(s) = outer.body.as_mut() {
        let condition = Expr::Nested(Box::new(condition));
        s.selection = Some(match s.selection.take() {
            Some(existing) => Expr::BinaryOp {
                left: Box::new(Expr::Nested(Box::new(existing))),
                op: BinaryOperator::And,
                right: Box::new(condition),
            },
            None => condition,
        });
    }
    Ok(outer)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sqlparser::dialect::PostgreSqlDialect;
    use sqlparser::parser::Parser;

    fn query(sql: &str) -> ast::Query {
        match Parser::parse_sql(&PostgreSqlDialect {}, sql)
            .expect("parses")
            .pop()
        {
            Some(ast::Statement::Query(q)) => *q,
            other => panic!("not a query: {other:?}"),
        }
    }

    const SUPERSET: &str = "SELECT DATE_TRUNC('month', visit_date) AS visit_date, clinic AS clinic, AVG(cost) AS \"AVG(cost)\" FROM demo.visits JOIN (SELECT clinic AS clinic__, AVG(cost) AS mme_inner__ FROM demo.visits WHERE visit_date >= DATE '2024-01-01' GROUP BY clinic ORDER BY mme_inner__ DESC LIMIT 5) AS series_limit ON clinic = clinic__ WHERE visit_date >= DATE '2024-01-01' GROUP BY DATE_TRUNC('month', visit_date), clinic LIMIT 10000";

    #[test]
    fn superset_series_limit_splits_into_two_aggregates() {
        let s = split(&query(SUPERSET)).expect("the series-limit form");
        assert_eq!(
            s.inner.to_string(),
            "SELECT clinic AS clinic__, AVG(cost) AS mme_inner__ FROM demo.visits WHERE visit_date >= DATE '2024-01-01' GROUP BY clinic ORDER BY mme_inner__ DESC LIMIT 5"
        );
        assert_eq!(s.keys.len(), 1);
        assert_eq!(s.keys[0].0.to_string(), "clinic");
        assert_eq!(s.keys[0].1, "clinic__");
        let restricted = restrict(
            &s,
            &["clinic__".into(), "mme_inner__".into()],
            &[
                vec![Cell::Text("north".into()), Cell::Null],
                vec![Cell::Null, Cell::Null],
                vec![Cell::Text("o'neil".into()), Cell::Null],
            ],
        )
        .expect("restricts");
        assert_eq!(
            crate::literal::for_display(&restricted.to_string()),
            "SELECT DATE_TRUNC('month', visit_date) AS visit_date, clinic AS clinic, AVG(cost) AS \"AVG(cost)\" FROM demo.visits WHERE (visit_date >= DATE '2024-01-01') AND (((clinic) = 'north') OR ((clinic) = 'o''neil')) GROUP BY DATE_TRUNC('month', visit_date), clinic LIMIT 10000"
        );
        let none = restrict(&s, &["clinic__".into()], &[]).expect("restricts");
        assert!(none.to_string().contains("AND (false)"), "{none}");
    }

    #[test]
    fn other_joins_are_not_the_form() {
        for sql in [
            "SELECT COUNT(*) FROM demo.visits v JOIN demo.people p ON p.person_id = v.person_id",
            "SELECT COUNT(*) FROM demo.visits v JOIN (SELECT person_id FROM demo.people) p ON p.person_id = v.person_id",
            "SELECT COUNT(*) FROM demo.visits JOIN (SELECT clinic AS c, COUNT(*) AS n FROM demo.visits GROUP BY clinic) s ON c < clinic",
            "SELECT COUNT(*) FROM demo.visits LEFT JOIN (SELECT clinic AS c, COUNT(*) AS n FROM demo.visits GROUP BY clinic) s ON c = clinic",
            "SELECT COUNT(*) FROM demo.visits JOIN (SELECT clinic AS c, COUNT(*) AS n FROM demo.visits GROUP BY clinic) s ON s.c = s.n",
        ] {
            assert_eq!(split(&query(sql)), None, "{sql}");
        }
    }
}
