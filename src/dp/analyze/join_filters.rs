//! Filters written in an inner join's ON, moved to WHERE: Sequelize's `include` with a `where`
//! writes `INNER JOIN people AS person ON visits.person_id = person.person_id AND person.region =
//! 'NO'`, and pgdp's joins are column equalities.
//!
//! Invariants:
//! - Only an inner join's (`JOIN`, `INNER JOIN`) conjuncts move, and only those that are not an
//!   equality of two columns; the equalities stay in ON, and a join left with none stays as
//!   written (analysis refuses it as before). For an inner join, `X JOIN t ON p AND q` is
//!   `X JOIN t ON p` filtered by `q`, and a filter on those rows commutes with the joins after
//!   it (a LEFT JOIN keeps every row it is given), so the query means what it meant.
//! - The moved conjuncts are ANDed to the SELECT's WHERE, each in parentheses, after it.
//! - Pure: no I/O.

use sqlparser::ast::{self, BinaryOperator, Expr, JoinConstraint, JoinOperator, SetExpr};

/// `query` with the filters of its inner joins moved to WHERE, or `None` when it has none.
pub(super) fn lift(query: &ast::Query) -> Option<ast::Query> {
    let mut lifted = query.clone();
    let mut changed = false;
    lift_in_query(&mut lifted, &mut changed);
    changed.then_some(lifted)
}

fn lift_in_query(query: &mut ast::Query, changed: &mut bool) {
    if let Some(with) = &mut query.with {
        for cte in &mut with.cte_tables {
            lift_in_query(&mut cte.query, changed);
        }
    }
    lift_in_body(&mut query.body, changed);
}

fn lift_in_body(body: &mut SetExpr, changed: &mut bool) {
    match body {
        SetExpr::Select(select) => lift_in_select(select, changed),
        SetExpr::Query(q) => lift_in_query(q, changed),
        SetExpr::SetOperation { left, right, .. } => {
            lift_in_body(left, changed);
            lift_in_body(right, changed);
        }
        _ => {}
    }
}

fn lift_in_select(select: &mut ast::Select, changed: &mut bool) {
    let mut moved = Vec::new();
    for table in &mut select.from {
        if let ast::TableFactor::Derived { subquery, .. } = &mut table.relation {
            lift_in_query(subquery, changed);
        }
        for join in &mut table.joins {
            if let ast::TableFactor::Derived { subquery, .. } = &mut join.relation {
                lift_in_query(subquery, changed);
            }
            let (JoinOperator::Join(JoinConstraint::On(on))
            | JoinOperator::Inner(JoinConstraint::On(on))) = &mut join.join_operator
            else {
                continue;
            };
            let mut parts = Vec::new();
            super::conjuncts(on, &mut parts);
            let (equalities, filters): (Vec<Expr>, Vec<Expr>) =
                parts.into_iter().cloned().partition(is_column_equality);
            if filters.is_empty() || equalities.is_empty() {
                continue;
            }
            *on = and_all(equalities);
            moved.extend(filters);
        }
    }
    if moved.is_empty() {
        return;
    }
    *changed = true;
    let mut all: Vec<Expr> = select.selection.take().into_iter().collect();
    all.extend(moved);
    select.selection = Some(and_all(
        all.into_iter().map(|e| Expr::Nested(Box::new(e))).collect(),
    ));
}

fn is_column_equality(e: &Expr) -> bool {
    fn column(e: &Expr) -> bool {
        match e {
            Expr::Nested(inner) => column(inner),
            Expr::Identifier(_) | Expr::CompoundIdentifier(_) => true,
            _ => false,
        }
    }
    match e {
        Expr::Nested(inner) => is_column_equality(inner),
        Expr::BinaryOp {
            left,
            op: BinaryOperator::Eq,
            right,
        } => column(left) && column(right),
        _ => false,
    }
}

fn and_all(mut parts: Vec<Expr>) -> Expr {
    let first = parts.remove(0);
    parts.into_iter().fold(first, |acc, e| Expr::BinaryOp {
        left: Box::new(acc),
        op: BinaryOperator::And,
        right: Box::new(e),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use sqlparser::dialect::PostgreSqlDialect;
    use sqlparser::parser::Parser;

    fn lifted(sql: &str) -> Option<String> {
        let statements = Parser::parse_sql(&PostgreSqlDialect {}, sql).expect("parses");
        let ast::Statement::Query(query) = &statements[0] else {
            panic!("not a query");
        };
        lift(query).map(|q| q.to_string())
    }

    #[test]
    fn an_inner_joins_filters_move_to_where() {
        // Sequelize's count with an include that has a where.
        assert_eq!(
            lifted(r#"SELECT count("visits"."visit_id") AS "count" FROM "demo"."visits" AS "visits" INNER JOIN "demo"."people" AS "person" ON "visits"."person_id" = "person"."person_id" AND "person"."region" = 'NO'"#).as_deref(),
            Some(r#"SELECT count("visits"."visit_id") AS "count" FROM "demo"."visits" AS "visits" INNER JOIN "demo"."people" AS "person" ON "visits"."person_id" = "person"."person_id" WHERE ("person"."region" = 'NO')"#)
        );
        assert_eq!(
            lifted("SELECT COUNT(*) FROM v JOIN p ON (v.a = p.a AND p.age > 3) WHERE v.x = 1")
                .as_deref(),
            Some("SELECT COUNT(*) FROM v JOIN p ON v.a = p.a WHERE (v.x = 1) AND (p.age > 3)")
        );
        // In a subquery in FROM too.
        assert_eq!(
            lifted("SELECT COUNT(*) FROM (SELECT v.a FROM v JOIN p ON v.a = p.a AND p.age > 3) s")
                .as_deref(),
            Some(
                "SELECT COUNT(*) FROM (SELECT v.a FROM v JOIN p ON v.a = p.a WHERE (p.age > 3)) s"
            )
        );
    }

    #[test]
    fn outer_joins_and_joins_without_an_equality_stay() {
        for sql in [
            "SELECT COUNT(*) FROM v LEFT JOIN p ON v.a = p.a AND p.age > 3",
            "SELECT COUNT(*) FROM v JOIN p ON p.age > v.a",
            "SELECT COUNT(*) FROM v JOIN p ON v.a = p.a",
            "SELECT COUNT(*) FROM v JOIN p USING (a)",
        ] {
            assert_eq!(lifted(sql), None, "{sql}");
        }
    }
}
