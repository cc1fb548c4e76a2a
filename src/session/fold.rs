//! Time constants folded when a statement starts: `current_date`, `now()`, `current_timestamp`,
//! `localtimestamp`, `TO_DATE('2023-01-01', 'YYYY-MM-DD')` (how Superset writes a time range),
//! `make_date(…)`, and constant expressions over them (`current_date - interval '365 days'`,
//! `date_trunc('month', now())`) become typed literals of their value at the statement's start,
//! in the analyst's time zone, before analysis. Analysis, EXPLAIN and the replay key then see
//! the literals, as if the analyst had typed them.
//!
//! Invariants:
//! - Only a constant expression is folded: literals, these functions, date_trunc / date_part /
//!   make_interval, casts and `+ - * /` over them; never a column, a parameter or a subquery.
//!   Its value depends on the clock and the analyst's input alone, so computing it (on the
//!   data-free shadow catalog, which knows PostgreSQL's time zones and formats) reads no data,
//!   and an error it raises (a bad TO_DATE format) is about the analyst's input.
//! - Each maximal foldable expression is folded once, in the order a pre-order walk meets them;
//!   [`foldable`] and [`substitute`] walk the same tree in the same order.
//! - Pure: the evaluation itself is the caller's ([`super::Session`]).

use std::ops::ControlFlow;

use sqlparser::ast::{self, Expr, Value, VisitMut, VisitorMut};

use crate::dp::sql::ShadowSql;
use crate::error::{Error, Result};

/// Functions whose value is the statement's start time or a date built from literals: an
/// expression is folded only if it calls one of them.
const TIME_FUNCTIONS: &[&str] = &[
    "now",
    "current_date",
    "current_timestamp",
    "localtimestamp",
    "transaction_timestamp",
    "statement_timestamp",
    "to_date",
    "to_timestamp",
    "make_date",
    "make_timestamp",
    "make_timestamptz",
];

/// Other functions a folded expression may call (over constants).
const HELPER_FUNCTIONS: &[&str] = &["date_trunc", "date_part", "make_interval"];

/// The maximal foldable expressions of `query`, in pre-order.
pub fn foldable(query: &ast::Query) -> Vec<Expr> {
    // Every folded expression calls a time function: without one, no copy and no walk.
    if !calls_time_function(query) {
        return Vec::new();
    }
    let mut copy = query.clone();
    let mut found = Vec::new();
    let _ = copy.visit(&mut Folder::new(|e: &Expr| {
        found.push(e.clone());
        Some(Expr::value(Value::Null))
    }));
    found
}

/// The SQL that evaluates `expressions` on the shadow catalog, in `time_zone`: one row with,
/// per expression, its value as text and its type's name.
pub fn evaluation_sql(expressions: &[Expr], time_zone_setting: &str) -> ShadowSql {
    let items: Vec<String> = expressions
        .iter()
        .map(|e| format!("CAST(({e}) AS TEXT), pg_typeof(({e}))::text"))
        .collect();
    ShadowSql::new(format!(
        "SET LOCAL DateStyle = 'ISO, YMD'; SET LOCAL IntervalStyle = 'postgres'; SELECT {}",
        items.join(", ")
    ))
    .in_zone(time_zone_setting)
}

/// `query` with its maximal foldable expressions replaced, in order, by the literals of
/// `values` (each its text and PostgreSQL type name, from [`evaluation_sql`]'s row).
pub fn substitute(query: &ast::Query, values: &[(Option<String>, String)]) -> Result<ast::Query> {
    let literals = values
        .iter()
        .map(|(text, ty)| literal(text.as_deref(), ty))
        .collect::<Result<Vec<_>>>()?;
    let mut folded = query.clone();
    let mut next = literals.into_iter();
    let mut missing = false;
    let _ = folded.visit(&mut Folder::new(|_: &Expr| {
        let literal = next.next();
        missing |= literal.is_none();
        literal
    }));
    if missing || next.next().is_some() {
        return Err(Error::internal(
            "folded constants do not match their expressions",
        ));
    }
    Ok(folded)
}

/// The typed literal of a folded value.
fn literal(text: Option<&str>, ty: &str) -> Result<Expr> {
    let Some(text) = text else {
        return Ok(Expr::value(Value::Null));
    };
    let typed = |data_type: ast::DataType| {
        Expr::TypedString(ast::TypedString {
            data_type,
            value: crate::literal::dollar_quoted(text).into(),
            uses_odbc_syntax: false,
        })
    };
    Ok(match ty {
        "date" => typed(ast::DataType::Date),
        "timestamp with time zone" => {
            typed(ast::DataType::Timestamp(None, ast::TimezoneInfo::WithTimeZone))
        }
        "timestamp without time zone" => {
            typed(ast::DataType::Timestamp(None, ast::TimezoneInfo::None))
        }
        "interval" => Expr::Interval(ast::Interval {
            value: Box::new(Expr::value(crate::literal::dollar_quoted(text))),
            leading_field: None,
            leading_precision: None,
            last_field: None,
            fractional_seconds_precision: None,
        }),
        "integer" | "bigint" | "smallint" => {
            let n: i64 = text
                .parse()
                .map_err(|_| Error::internal("a folded integer that does not parse"))?;
            match n.checked_abs() {
                Some(magnitude) if n < 0 => Expr::UnaryOp {
                    op: ast::UnaryOperator::Minus,
                    expr: Box::new(Expr::value(Value::Number(magnitude.to_string(), false))),
                },
                _ => Expr::value(Value::Number(n.to_string(), false)),
            }
        }
        "numeric" | "double precision" => {
            let plain = text.strip_prefix('-').unwrap_or(text);
            if plain.is_empty() || !plain.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
                return Err(Error::unsupported(
                    format!("the constant {text}"),
                    "Write the number as a literal.",
                ));
            }
            let number = Expr::Cast {
                kind: ast::CastKind::Cast,
                expr: Box::new(Expr::value(Value::Number(plain.to_string(), false))),
                data_type: ast::DataType::Numeric(ast::ExactNumberInfo::None),
                format: None,
            };
            if plain.len() < text.len() {
                Expr::UnaryOp {
                    op: ast::UnaryOperator::Minus,
                    expr: Box::new(Expr::Nested(Box::new(number))),
                }
            } else {
                number
            }
        }
        "text" => Expr::value(crate::literal::dollar_quoted(text)),
        other => {
            return Err(Error::unsupported(
                format!("a constant of type {other} computed from the current time"),
                "Compare dates and timestamps with current_date, now(), TO_DATE(…) or TO_TIMESTAMP(…), and intervals.",
            ))
        }
    })
}

/// Replaces each maximal foldable expression (pre-order) by what `replace` returns for it.
struct Folder<F> {
    replace: F,
    /// Inside an expression left whole for after its subqueries' release: how deep.
    skip: usize,
}

impl<F> Folder<F> {
    fn new(replace: F) -> Folder<F> {
        Folder { replace, skip: 0 }
    }
}

impl<F: FnMut(&Expr) -> Option<Expr>> VisitorMut for Folder<F> {
    type Break = ();

    fn pre_visit_expr(&mut self, expr: &mut Expr) -> ControlFlow<()> {
        if self.skip > 0 {
            self.skip += 1;
            return ControlFlow::Continue(());
        }
        // `current_date - (SELECT MAX(age) FROM …) * interval '1 day'`: constant once the
        // subquery's released value stands in it ([`super::scalar`]), and folded whole then;
        // folding `current_date` alone now would leave date arithmetic no analysis reads.
        if waits_for_subqueries(expr) {
            self.skip = 1;
            return ControlFlow::Continue(());
        }
        if is_constant(expr) && calls_time_function(expr) {
            if let Some(replacement) = (self.replace)(expr) {
                *expr = replacement;
            }
        }
        ControlFlow::Continue(())
    }

    fn post_visit_expr(&mut self, _expr: &mut Expr) -> ControlFlow<()> {
        self.skip = self.skip.saturating_sub(1);
        ControlFlow::Continue(())
    }
}

/// Whether `e` is a constant expression over the clock but for scalar subqueries in it (not
/// inside them): `current_date - (SELECT …) * interval '1 day'`.
fn waits_for_subqueries(e: &Expr) -> bool {
    let has_subquery = ast::visit_expressions(e, |inner| match inner {
        Expr::Subquery(_) => ControlFlow::Break(()),
        _ => ControlFlow::Continue(()),
    })
    .is_break();
    if !has_subquery || !is_constant_with(e, true) {
        return false;
    }
    any_outside_subqueries(
        e,
        |inner| matches!(inner, Expr::Function(f) if TIME_FUNCTIONS.contains(&function_name(f).as_str())),
    )
}

/// Whether `found` holds for an expression of `e` outside every subquery in it (a subquery
/// expression itself is outside; what it holds is not).
pub(super) fn any_outside_subqueries(e: &Expr, found: impl FnMut(&Expr) -> bool) -> bool {
    struct Outside<F> {
        /// How many queries the walk is inside.
        depth: usize,
        found: F,
    }
    impl<F: FnMut(&Expr) -> bool> sqlparser::ast::Visitor for Outside<F> {
        type Break = ();

        fn pre_visit_query(&mut self, _query: &ast::Query) -> ControlFlow<()> {
            self.depth += 1;
            ControlFlow::Continue(())
        }

        fn post_visit_query(&mut self, _query: &ast::Query) -> ControlFlow<()> {
            self.depth -= 1;
            ControlFlow::Continue(())
        }

        fn pre_visit_expr(&mut self, expr: &Expr) -> ControlFlow<()> {
            if self.depth == 0 && (self.found)(expr) {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        }
    }
    sqlparser::ast::Visit::visit(e, &mut Outside { depth: 0, found }).is_break()
}

fn function_name(f: &ast::Function) -> String {
    f.name
        .0
        .last()
        .map(|p| p.to_string().to_ascii_lowercase())
        .unwrap_or_default()
}

/// Whether `e` is built only from literals, the time and helper functions, casts, intervals
/// and arithmetic.
fn is_constant(e: &Expr) -> bool {
    is_constant_with(e, false)
}

/// [`is_constant`], a scalar subquery counting as a constant when `subqueries` says so.
fn is_constant_with(e: &Expr, subqueries: bool) -> bool {
    let is_constant = |e: &Expr| is_constant_with(e, subqueries);
    match e {
        Expr::Subquery(_) => subqueries,
        Expr::Value(v) => !matches!(v.value, Value::Placeholder(_)),
        Expr::TypedString(_) => true,
        Expr::Interval(i) => is_constant(&i.value),
        Expr::Nested(inner) => is_constant(inner),
        Expr::UnaryOp { expr, .. } => is_constant(expr),
        Expr::BinaryOp { left, op, right } => {
            matches!(
                op,
                ast::BinaryOperator::Plus
                    | ast::BinaryOperator::Minus
                    | ast::BinaryOperator::Multiply
                    | ast::BinaryOperator::Divide
            ) && is_constant(left)
                && is_constant(right)
        }
        Expr::Cast { expr, format, .. } => format.is_none() && is_constant(expr),
        Expr::Extract { expr, .. } => is_constant(expr),
        Expr::Function(f) => {
            let name = function_name(f);
            let known = TIME_FUNCTIONS.contains(&name.as_str())
                || HELPER_FUNCTIONS.contains(&name.as_str());
            let plain = f.filter.is_none()
                && f.over.is_none()
                && f.within_group.is_empty()
                && f.null_treatment.is_none()
                && f.name.0.len() <= 2;
            let arguments = match &f.args {
                ast::FunctionArguments::None => true,
                ast::FunctionArguments::List(list) => {
                    list.duplicate_treatment.is_none()
                        && list.clauses.is_empty()
                        && list.args.iter().all(|a| {
                            matches!(a, ast::FunctionArg::Unnamed(ast::FunctionArgExpr::Expr(e)) if is_constant(e))
                        })
                }
                ast::FunctionArguments::Subquery(_) => false,
            };
            known && plain && arguments
        }
        _ => false,
    }
}

/// Whether `e` calls one of [`TIME_FUNCTIONS`].
fn calls_time_function<V: ast::Visit>(node: &V) -> bool {
    ast::visit_expressions(node, |inner| match inner {
        Expr::Function(f) if TIME_FUNCTIONS.contains(&function_name(f).as_str()) => {
            ControlFlow::Break(())
        }
        _ => ControlFlow::Continue(()),
    })
    .is_break()
}

#[cfg(test)]
mod tests {
    use super::*;
    use sqlparser::dialect::PostgreSqlDialect;
    use sqlparser::parser::Parser;

    fn query(sql: &str) -> Box<ast::Query> {
        match Parser::parse_sql(&PostgreSqlDialect {}, sql)
            .expect("parses")
            .pop()
        {
            Some(ast::Statement::Query(q)) => q,
            other => panic!("not a query: {other:?}"),
        }
    }

    fn texts(sql: &str) -> Vec<String> {
        foldable(&query(sql))
            .iter()
            .map(|e| e.to_string())
            .collect()
    }

    #[test]
    fn maximal_constant_expressions_over_the_clock_are_found_in_order() {
        assert_eq!(
            texts("SELECT COUNT(*) FROM v WHERE d >= current_date - INTERVAL '365 days' AND d < TO_DATE('2024-01-01', 'YYYY-MM-DD') AND t >= date_trunc('month', now())"),
            [
                "current_date - INTERVAL '365 days'",
                "TO_DATE('2024-01-01', 'YYYY-MM-DD')",
                "date_trunc('month', now())"
            ]
        );
        // Columns, parameters and plain literals are never folded.
        assert!(texts("SELECT COUNT(*) FROM v WHERE d >= d2 - INTERVAL '1 day' AND d < DATE '2024-01-01' AND e = to_date($1, 'YYYY')").is_empty());
        assert_eq!(
            texts("SELECT date_trunc('month', d), COUNT(*) FROM v WHERE d > now() - INTERVAL '1 day' GROUP BY 1"),
            ["now() - INTERVAL '1 day'"]
        );
        assert_eq!(
            texts("SELECT COUNT(*) FROM v WHERE d <= CURRENT_DATE"),
            ["CURRENT_DATE"]
        );
    }

    #[test]
    fn an_expression_waiting_for_a_subquerys_value_is_folded_whole_later() {
        // Left whole: folded after the subquery's release puts its value in place.
        assert!(texts("SELECT COUNT(*) FROM v WHERE d >= current_date - (SELECT MAX(age) FROM p) * INTERVAL '1 day'").is_empty());
        // The clock inside a subquery is still folded, there.
        assert_eq!(
            texts("SELECT COUNT(*) * 1.0 / (SELECT COUNT(*) FROM v WHERE d >= current_date - 30) FROM v WHERE d >= current_date - 365"),
            ["current_date - 30", "current_date - 365"]
        );
        assert_eq!(
            texts("SELECT COUNT(*) FROM v WHERE d >= current_date - (SELECT MAX(age) FROM p WHERE d < now()) * INTERVAL '1 day'"),
            Vec::<String>::new()
        );
    }

    #[test]
    fn values_become_typed_literals() {
        let q = query("SELECT COUNT(*) FROM v WHERE d >= current_date - INTERVAL '365 days' AND t < now() AND y = EXTRACT(YEAR FROM current_date) AND e = make_date(2024, 1, 31) AND i < make_interval(0, 1) + current_date");
        let folded = substitute(
            &q,
            &[
                (
                    Some("2025-11-25 00:00:00".into()),
                    "timestamp without time zone".into(),
                ),
                (
                    Some("2026-11-25 18:00:00.123+00".into()),
                    "timestamp with time zone".into(),
                ),
                (Some("2026".into()), "numeric".into()),
                (Some("2024-01-31".into()), "date".into()),
                (
                    Some("2026-12-25 00:00:00".into()),
                    "timestamp without time zone".into(),
                ),
            ],
        )
        .expect("substitutes");
        assert_eq!(
            crate::literal::for_display(&folded.to_string()),
            "SELECT COUNT(*) FROM v WHERE d >= TIMESTAMP '2025-11-25 00:00:00' AND t < TIMESTAMP WITH TIME ZONE '2026-11-25 18:00:00.123+00' AND y = CAST(2026 AS NUMERIC) AND e = DATE '2024-01-31' AND i < TIMESTAMP '2026-12-25 00:00:00'"
        );
        assert!(substitute(&q, &[]).is_err());
        let sql = evaluation_sql(&foldable(&q), "SET LOCAL TimeZone = 'UTC'; ").to_string();
        assert!(
            sql.starts_with("SET LOCAL TimeZone = 'UTC'; SET LOCAL DateStyle"),
            "{sql}"
        );
        assert!(sql.contains("CAST((current_date - INTERVAL '365 days') AS TEXT), pg_typeof((current_date - INTERVAL '365 days'))::text"), "{sql}");
    }
}
