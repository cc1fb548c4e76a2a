//! Scalar subqueries released on their own: `SELECT region, COUNT(*) * 1.0 / (SELECT COUNT(*)
//! FROM demo.visits) FROM demo.visits WHERE cost > 100 GROUP BY region`, `WHERE cost > (SELECT
//! AVG(cost) FROM demo.visits)`, `SELECT (SELECT COUNT(*) FROM demo.people) AS people, (SELECT
//! COUNT(*) FROM demo.visits) AS visits` (a dashboard's row of numbers).
//!
//! Each subquery is released first as the DP query it is, and charged as its own release
//! (sequential composition, adaptively: the query after it may depend on its answer); its
//! released value then stands in the statement as a typed literal, `CAST('…' AS <type>)` of
//! the type PostgreSQL gives the subquery, and the statement is answered as what it has become
//! (a DP query, or constants). A released value is public, so using it in a later query is
//! post-processing of that release: the later query's sensitivity and charge are those of the
//! same query with the literal typed in.
//!
//! Invariants:
//! - [`split`] takes only the subqueries in the top SELECT's select list, WHERE, HAVING and the
//!   statement's ORDER BY, each a SELECT of one item without GROUP BY (one row, or none under
//!   HAVING), and never one inside another subquery or a derived table; the session uses the
//!   split only when the statement as written is refused, so a form answered in one release
//!   (the denominator of the same rows, [`crate::dp::analyze`]) keeps its single charge.
//! - A subquery that reads the outer query's columns (correlated) is refused on its own (its
//!   columns are unknown there), before anything is charged; so is any subquery DP refuses.
//! - [`ScalarSplit::substitute`] writes only values the subqueries' releases returned (or, for
//!   describing and planning before the first charge, a stand-in of the same type); a value is
//!   never data the releases did not return.
//! - Pure: the session releases the subqueries and answers the statement ([`super::Session`]).

use std::ops::ControlFlow;

use sqlparser::ast::{self, Expr, SelectItem, SetExpr, VisitMut, VisitorMut};
use sqlparser::dialect::PostgreSqlDialect;
use sqlparser::parser::Parser;

use crate::error::{Error, Result};
use crate::limits::SCALAR_SUBQUERIES_MAX;
use crate::output::{Cell, CellType};

/// A statement with scalar subqueries to release before it.
#[derive(Debug, Clone, PartialEq)]
pub struct ScalarSplit {
    /// The distinct subqueries, in the order a pre-order walk meets them, each with the
    /// statement's CTEs when it has none of its own.
    pub subqueries: Vec<ast::Query>,
    /// The statement as the analyst wrote it.
    statement: ast::Query,
}

/// The released value of one subquery: its cell (NULL for no row) and its type.
#[derive(Debug, Clone, PartialEq)]
pub struct ScalarValue {
    pub cell: Cell,
    pub ty: CellType,
    /// The subquery's column name (a bare subquery in the select list keeps it).
    pub name: String,
}

/// The scalar subqueries of `query` that can be released on their own; `Ok(None)` when it has
/// none, a refusal when it has more than [`SCALAR_SUBQUERIES_MAX`].
pub fn split(query: &ast::Query) -> Result<Option<ScalarSplit>> {
    let SetExpr::Select(select) = query.body.as_ref() else {
        return Ok(None);
    };
    // Most statements have none: found without copying the statement.
    let order_by = match query.order_by.as_ref().map(|o| &o.kind) {
        Some(ast::OrderByKind::Expressions(items)) => items.as_slice(),
        _ => &[],
    };
    let mut places = select
        .projection
        .iter()
        .filter_map(|item| match item {
            SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. } => Some(e),
            _ => None,
        })
        .chain(&select.selection)
        .chain(&select.having)
        .chain(order_by.iter().map(|o| &o.expr));
    let scalar = |e: &Expr| matches!(e, Expr::Subquery(q) if is_scalar(q));
    if !places.any(|e| super::fold::any_outside_subqueries(e, scalar)) {
        return Ok(None);
    }
    let mut found: Vec<ast::Query> = Vec::new();
    let mut copy = query.clone();
    visit_scalars(&mut copy, &mut |q: &ast::Query| {
        let mut q = q.clone();
        if q.with.is_none() {
            q.with.clone_from(&query.with);
        }
        if !found.contains(&q) {
            found.push(q);
        }
        Some(Expr::value(ast::Value::Null))
    });
    if found.is_empty() {
        return Ok(None);
    }
    if found.len() > SCALAR_SUBQUERIES_MAX {
        return Err(Error::unsupported(
            format!("a statement with more than {SCALAR_SUBQUERIES_MAX} scalar subqueries"),
            "Each scalar subquery is a release charged on its own: ask for fewer in one statement, or for several aggregates of the same rows in one subquery's place (one release).",
        ));
    }
    Ok(Some(ScalarSplit {
        subqueries: found,
        statement: query.clone(),
    }))
}

impl ScalarSplit {
    /// The statement with each subquery replaced by its value (`values` in the order of
    /// [`ScalarSplit::subqueries`]): `CAST('…' AS <type>)`, or `CAST(NULL AS <type>)` when its
    /// release had no row. A bare subquery in the select list keeps its column's name.
    pub fn substitute(&self, values: &[ScalarValue]) -> Result<ast::Query> {
        if values.len() != self.subqueries.len() {
            return Err(Error::internal(
                "scalar subqueries and their values do not match",
            ));
        }
        let literals = values
            .iter()
            .map(typed_literal)
            .collect::<Result<Vec<Expr>>>()?;
        let at = |q: &ast::Query| -> Option<usize> {
            let mut q = q.clone();
            if q.with.is_none() {
                q.with.clone_from(&self.statement.with);
            }
            self.subqueries.iter().position(|s| *s == q)
        };
        let mut statement = self.statement.clone();
        // A bare subquery item is named as PostgreSQL names it: by its one column.
        if let SetExpr::Select(select) = statement.body.as_mut() {
            for item in &mut select.projection {
                if let SelectItem::UnnamedExpr(Expr::Subquery(q)) = item {
                    if let Some(i) = at(q) {
                        *item = SelectItem::ExprWithAlias {
                            expr: literals[i].clone(),
                            alias: ast::Ident::with_quote('"', &values[i].name),
                        };
                    }
                }
            }
        }
        let mut missing = false;
        visit_scalars(&mut statement, &mut |q: &ast::Query| {
            let literal = at(q).map(|i| literals[i].clone());
            missing |= literal.is_none();
            literal
        });
        if missing {
            return Err(Error::internal("a scalar subquery without its value"));
        }
        Ok(statement)
    }

    /// The statement with a stand-in value of each subquery's type, for describing and planning
    /// it before the first charge: one, the empty string, false, 2000-01-01.
    pub fn with_stand_ins(&self, described: &[(String, CellType)]) -> Result<ast::Query> {
        let values: Vec<ScalarValue> = described
            .iter()
            .map(|(name, ty)| ScalarValue {
                cell: stand_in(*ty),
                ty: *ty,
                name: name.clone(),
            })
            .collect();
        self.substitute(&values)
    }
}

/// A value of type `ty` that plans as any other value of it would.
pub(super) fn stand_in(ty: CellType) -> Cell {
    match ty {
        // One, not zero: a divisor's stand-in must not fail where the value would not.
        CellType::Int8 | CellType::Int4 | CellType::Int2 => Cell::Int(1),
        CellType::Numeric | CellType::Float8 | CellType::Float4 => Cell::Float(1.0),
        CellType::Bool => Cell::Bool(false),
        CellType::Date => Cell::Text("2000-01-01".into()),
        CellType::Timestamp => Cell::Text("2000-01-01 00:00:00".into()),
        CellType::Timestamptz => Cell::Text("2000-01-01 00:00:00+00".into()),
        CellType::Text | CellType::Raw(_) => Cell::Text(String::new()),
    }
}

/// `CAST('<value>' AS <type>)` of a released value.
fn typed_literal(value: &ScalarValue) -> Result<Expr> {
    let text = match &value.cell {
        Cell::Null => "NULL".to_string(),
        Cell::Int(i) => format!("'{i}'"),
        Cell::Float(f) => format!("'{f}'"),
        Cell::Bool(b) => format!("'{b}'"),
        Cell::Text(t) => format!("'{}'", t.replace('\'', "''")),
    };
    let sql = format!("CAST({text} AS {})", type_in_sql(value.ty));
    Parser::new(&PostgreSqlDialect {})
        .try_with_sql(&sql)
        .and_then(|mut p| p.parse_expr())
        .map_err(|e| Error::internal(format!("a released value as a literal: {e}")))
}

/// The SQL spelling of a released type, as a cast names it.
fn type_in_sql(ty: CellType) -> &'static str {
    match ty {
        CellType::Int8 => "BIGINT",
        CellType::Int4 => "INTEGER",
        CellType::Int2 => "SMALLINT",
        CellType::Numeric => "NUMERIC",
        CellType::Float8 => "DOUBLE PRECISION",
        CellType::Float4 => "REAL",
        CellType::Bool => "BOOLEAN",
        CellType::Date => "DATE",
        CellType::Timestamp => "TIMESTAMP",
        CellType::Timestamptz => "TIMESTAMP WITH TIME ZONE",
        CellType::Text | CellType::Raw(_) => ty.sql_name(),
    }
}

/// Calls `replace` on each scalar subquery of the top SELECT's select list, WHERE and HAVING
/// and of the statement's ORDER BY, pre-order, never inside another subquery; a returned
/// expression replaces it.
fn visit_scalars(query: &mut ast::Query, replace: &mut dyn FnMut(&ast::Query) -> Option<Expr>) {
    let mut visitor = Scalars { replace, depth: 0 };
    if let SetExpr::Select(select) = query.body.as_mut() {
        for item in &mut select.projection {
            if let SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. } = item {
                let _ = e.visit(&mut visitor);
            }
        }
        if let Some(e) = select.selection.as_mut() {
            let _ = e.visit(&mut visitor);
        }
        if let Some(e) = select.having.as_mut() {
            let _ = e.visit(&mut visitor);
        }
    }
    if let Some(order_by) = query.order_by.as_mut() {
        if let ast::OrderByKind::Expressions(items) = &mut order_by.kind {
            for o in items {
                let _ = VisitMut::visit(&mut o.expr, &mut visitor);
            }
        }
    }
}

struct Scalars<'f> {
    replace: &'f mut dyn FnMut(&ast::Query) -> Option<Expr>,
    /// How many queries the walk is inside: only the statement's own level is replaced.
    depth: usize,
}

impl VisitorMut for Scalars<'_> {
    type Break = ();

    fn pre_visit_expr(&mut self, expr: &mut Expr) -> ControlFlow<()> {
        if self.depth > 0 {
            return ControlFlow::Continue(());
        }
        if let Expr::Subquery(q) = expr {
            if is_scalar(q) {
                if let Some(replacement) = (self.replace)(q) {
                    // The walk goes on into the replacement (a literal), never into `q`.
                    *expr = replacement;
                }
            }
        }
        ControlFlow::Continue(())
    }

    fn pre_visit_query(&mut self, _query: &mut ast::Query) -> ControlFlow<()> {
        self.depth += 1;
        ControlFlow::Continue(())
    }

    fn post_visit_query(&mut self, _query: &mut ast::Query) -> ControlFlow<()> {
        self.depth -= 1;
        ControlFlow::Continue(())
    }
}

/// A SELECT of one expression without GROUP BY: at most one row, of one column.
fn is_scalar(q: &ast::Query) -> bool {
    let SetExpr::Select(s) = q.body.as_ref() else {
        return false;
    };
    let grouped = match &s.group_by {
        ast::GroupByExpr::Expressions(e, m) => !e.is_empty() || !m.is_empty(),
        ast::GroupByExpr::All(_) => true,
    };
    !grouped
        && s.from.len() == 1
        && matches!(
            s.projection.as_slice(),
            [SelectItem::UnnamedExpr(_) | SelectItem::ExprWithAlias { .. }]
        )
        && q.fetch.is_none()
        && q.locks.is_empty()
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

    fn value(cell: Cell, ty: CellType, name: &str) -> ScalarValue {
        ScalarValue {
            cell,
            ty,
            name: name.into(),
        }
    }

    #[test]
    fn subqueries_of_the_statements_own_level_are_split_once_each() {
        let split = split(&query(
            "WITH v AS (SELECT * FROM demo.visits) SELECT region, COUNT(*) * 1.0 / (SELECT COUNT(*) FROM v) AS share FROM demo.people WHERE age > (SELECT AVG(age) FROM demo.people) GROUP BY region HAVING COUNT(*) > (SELECT COUNT(*) FROM v) / 100 ORDER BY COUNT(*) / (SELECT COUNT(*) FROM v)",
        ))
        .expect("no refusal")
        .expect("split");
        let texts: Vec<String> = split.subqueries.iter().map(|q| q.to_string()).collect();
        // The statement's CTEs go with each subquery; a repeated subquery is one release.
        assert_eq!(
            texts,
            [
                "WITH v AS (SELECT * FROM demo.visits) SELECT COUNT(*) FROM v",
                "WITH v AS (SELECT * FROM demo.visits) SELECT AVG(age) FROM demo.people",
            ]
        );
        let substituted = split
            .substitute(&[
                value(Cell::Int(1003), CellType::Int8, "count"),
                value(Cell::Text("43.5".into()), CellType::Numeric, "avg"),
            ])
            .expect("substitutes");
        assert_eq!(
            substituted.to_string(),
            "WITH v AS (SELECT * FROM demo.visits) SELECT region, COUNT(*) * 1.0 / CAST('1003' AS BIGINT) AS share FROM demo.people WHERE age > CAST('43.5' AS NUMERIC) GROUP BY region HAVING COUNT(*) > CAST('1003' AS BIGINT) / 100 ORDER BY COUNT(*) / CAST('1003' AS BIGINT)"
        );
    }

    #[test]
    fn a_bare_subquery_keeps_its_columns_name_and_no_row_is_null() {
        let split = split(&query(
            "SELECT (SELECT COUNT(*) FROM demo.people), (SELECT MAX(visit_date) AS last FROM demo.visits) AS last_visit",
        ))
        .expect("no refusal")
        .expect("split");
        let substituted = split
            .substitute(&[
                value(Cell::Int(100000), CellType::Int8, "count"),
                value(Cell::Null, CellType::Date, "last"),
            ])
            .expect("substitutes");
        assert_eq!(
            substituted.to_string(),
            "SELECT CAST('100000' AS BIGINT) AS \"count\", CAST(NULL AS DATE) AS last_visit"
        );
        // A quote in a released text is a quote in the literal, never the literal's end.
        let split = super::split(&query("SELECT (SELECT MIN(region) FROM demo.people) AS r"))
            .expect("no refusal")
            .expect("split");
        assert_eq!(
            split
                .substitute(&[value(Cell::Text("O'Brien".into()), CellType::Text, "min")])
                .expect("substitutes")
                .to_string(),
            "SELECT CAST('O''Brien' AS TEXT) AS r"
        );
    }

    #[test]
    fn other_subqueries_are_left_to_analysis() {
        for sql in [
            // No subquery, or one the statement's level does not hold as a value.
            "SELECT COUNT(*) FROM demo.people",
            "SELECT COUNT(*) FROM demo.people WHERE person_id IN (SELECT person_id FROM demo.visits)",
            "SELECT COUNT(*) FROM demo.people p WHERE EXISTS (SELECT 1 FROM demo.visits v WHERE v.person_id = p.person_id)",
            "SELECT COUNT(*) FROM (SELECT person_id FROM demo.people WHERE age > (SELECT AVG(age) FROM demo.people)) t",
            // Not one value: grouped, several items, FROM-less, a set operation.
            "SELECT COUNT(*) * 1.0 / (SELECT COUNT(*) FROM demo.people GROUP BY region) FROM demo.people",
            "SELECT COUNT(*) FROM demo.people WHERE age > (SELECT 40)",
            "SELECT COUNT(*) FROM demo.people WHERE age > (SELECT MIN(age) FROM demo.people UNION ALL SELECT 3)",
            // A set operation of its own is split elsewhere.
            "SELECT COUNT(*) FROM demo.people UNION ALL SELECT (SELECT COUNT(*) FROM demo.visits)",
        ] {
            assert_eq!(split(&query(sql)).expect("no refusal"), None, "{sql}");
        }
        // A scalar subquery inside an IN subquery stays there.
        let nested = "SELECT COUNT(*) FROM demo.people WHERE person_id IN (SELECT person_id FROM demo.visits GROUP BY person_id HAVING COUNT(*) > (SELECT COUNT(*) FROM demo.visits))";
        assert_eq!(split(&query(nested)).expect("no refusal"), None);
    }

    #[test]
    fn more_subqueries_than_the_limit_are_refused() {
        let items: Vec<String> = (0..=SCALAR_SUBQUERIES_MAX)
            .map(|i| format!("(SELECT COUNT(*) FROM demo.people WHERE age > {i})"))
            .collect();
        let sql = format!("SELECT {}", items.join(", "));
        let refused = split(&query(&sql)).expect_err("refused");
        assert!(
            refused.to_string().contains("scalar subqueries"),
            "{refused}"
        );
    }
}
