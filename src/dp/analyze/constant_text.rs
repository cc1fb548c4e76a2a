//! Text constants written the way tools write them, folded to the one string literal they are
//! where analysis needs a literal: a LIKE pattern and the unit of date_trunc / date_part.
//!
//! SQLAlchemy with psycopg 3 or asyncpg casts every string parameter (`LIKE $1::VARCHAR`,
//! `date_trunc($1::VARCHAR, …)`), Prisma's `contains` writes `LIKE ('%' || $1 || '%')` and
//! Django's `icontains` `LIKE UPPER('%a%')`. Each is a constant of the analyst's input whose value
//! pgdp computes exactly as PostgreSQL does, so the statement is analysed (and sent) with the
//! literal in its place.
//!
//! Invariants:
//! - Only constants fold: string literals (parameters are bound to literals before analysis),
//!   parentheses, casts to `text` / `varchar` / `character varying` without a length (which keep
//!   the string as it is), `||` of two such strings, and `upper` / `lower` of an ASCII string
//!   (whose result does not depend on the collation). A NULL or anything else is left as written,
//!   for analysis to accept or refuse as before.
//! - Only the positions named above are rewritten; there the folded literal has the meaning of
//!   the expression it replaces (a LIKE pattern and a date unit are read as text either way).
//! - Pure: no I/O.

use std::ops::ControlFlow;

use sqlparser::ast::{self, DataType, Expr, FunctionArg, FunctionArgExpr, FunctionArguments};

use crate::literal::{dollar_quoted, string_value};

/// `query` with its foldable LIKE patterns and date units replaced by their literals, or `None`
/// when it has none.
pub(super) fn fold(query: &ast::Query) -> Option<ast::Query> {
    if !ast::visit_expressions(query, |e| {
        if positions(e).into_iter().any(needs_folding) {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    })
    .is_break()
    {
        return None;
    }
    let mut folded = query.clone();
    let _ = ast::visit_expressions_mut(&mut folded, |e| {
        for position in positions_mut(e) {
            if let Some(text) = needs_folding(position).then(|| value(position)).flatten() {
                *position = Expr::value(dollar_quoted(&text));
            }
        }
        ControlFlow::<()>::Continue(())
    });
    Some(folded)
}

/// The positions of `e` where a literal is needed.
fn positions(e: &Expr) -> Vec<&Expr> {
    match e {
        Expr::Like { pattern, .. } | Expr::ILike { pattern, .. } => vec![pattern.as_ref()],
        Expr::Function(f) if is_date_function(f) => match &f.args {
            FunctionArguments::List(list) => match list.args.first() {
                Some(FunctionArg::Unnamed(FunctionArgExpr::Expr(unit))) => vec![unit],
                _ => Vec::new(),
            },
            _ => Vec::new(),
        },
        _ => Vec::new(),
    }
}

fn positions_mut(e: &mut Expr) -> Vec<&mut Expr> {
    match e {
        Expr::Like { pattern, .. } | Expr::ILike { pattern, .. } => vec![pattern.as_mut()],
        Expr::Function(f) if is_date_function(f) => match &mut f.args {
            FunctionArguments::List(list) => match list.args.first_mut() {
                Some(FunctionArg::Unnamed(FunctionArgExpr::Expr(unit))) => vec![unit],
                _ => Vec::new(),
            },
            _ => Vec::new(),
        },
        _ => Vec::new(),
    }
}

fn is_date_function(f: &ast::Function) -> bool {
    f.name.0.last().is_some_and(|part| {
        let name = part.to_string().to_ascii_lowercase();
        name == "date_trunc" || name == "date_part"
    })
}

/// Whether `e` is a foldable constant other than a plain string literal.
fn needs_folding(e: &Expr) -> bool {
    !matches!(e, Expr::Value(_)) && value(e).is_some()
}

/// The string `e` evaluates to, if it is a foldable constant (see the module documentation).
fn value(e: &Expr) -> Option<String> {
    match e {
        Expr::Value(v) => string_value(&v.value).map(str::to_string),
        Expr::Nested(inner) => value(inner),
        Expr::Cast {
            kind: ast::CastKind::Cast | ast::CastKind::DoubleColon,
            expr,
            data_type,
            format: None,
        } if keeps_the_string(data_type) => value(expr),
        Expr::BinaryOp {
            left,
            op: ast::BinaryOperator::StringConcat,
            right,
        } => Some(value(left)? + &value(right)?),
        Expr::Function(f) => {
            let name = f.name.0.last()?.to_string().to_ascii_lowercase();
            let FunctionArguments::List(list) = &f.args else {
                return None;
            };
            let plain = f.filter.is_none()
                && f.over.is_none()
                && f.within_group.is_empty()
                && list.duplicate_treatment.is_none()
                && list.clauses.is_empty()
                && f.name.0.len() == 1;
            let [FunctionArg::Unnamed(FunctionArgExpr::Expr(argument))] = list.args.as_slice()
            else {
                return None;
            };
            let text = value(argument).filter(|t| t.is_ascii())?;
            match name.as_str() {
                "upper" if plain => Some(text.to_ascii_uppercase()),
                "lower" if plain => Some(text.to_ascii_lowercase()),
                _ => None,
            }
        }
        _ => None,
    }
}

/// Whether a cast to `data_type` leaves any string as it is.
fn keeps_the_string(data_type: &DataType) -> bool {
    matches!(
        data_type,
        DataType::Text
            | DataType::Varchar(None)
            | DataType::CharacterVarying(None)
            | DataType::String(None)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use sqlparser::dialect::PostgreSqlDialect;
    use sqlparser::parser::Parser;

    fn folded(sql: &str) -> Option<String> {
        let statements = Parser::parse_sql(&PostgreSqlDialect {}, sql).expect("parses");
        let ast::Statement::Query(query) = &statements[0] else {
            panic!("not a query");
        };
        fold(query).map(|q| crate::literal::for_display(&q.to_string()))
    }

    #[test]
    fn tools_constants_become_the_literal_postgresql_computes() {
        let cases = [
            // SQLAlchemy + psycopg 3 / asyncpg.
            (
                "SELECT COUNT(*) FROM t WHERE c LIKE 'C%'::VARCHAR",
                "SELECT COUNT(*) FROM t WHERE c LIKE 'C%'",
            ),
            (
                "SELECT date_trunc('month'::text, d), COUNT(*) FROM t GROUP BY date_trunc(CAST('month' AS VARCHAR), d)",
                "SELECT date_trunc('month', d), COUNT(*) FROM t GROUP BY date_trunc('month', d)",
            ),
            // Prisma's contains.
            (
                "SELECT COUNT(*) FROM t WHERE c::text LIKE ('%' || 'a' || '%')",
                "SELECT COUNT(*) FROM t WHERE c::TEXT LIKE '%a%'",
            ),
            // Django's icontains.
            (
                "SELECT COUNT(*) FROM t WHERE UPPER(c::text) LIKE UPPER('%a%')",
                "SELECT COUNT(*) FROM t WHERE UPPER(c::TEXT) LIKE '%A%'",
            ),
            (
                "SELECT COUNT(*) FROM t WHERE c ILIKE lower('AB_'::character varying)",
                "SELECT COUNT(*) FROM t WHERE c ILIKE 'ab_'",
            ),
        ];
        for (sql, expected) in cases {
            assert_eq!(folded(sql).as_deref(), Some(expected), "{sql}");
        }
    }

    #[test]
    fn what_is_not_a_text_constant_stays_as_written() {
        for sql in [
            "SELECT COUNT(*) FROM t WHERE c LIKE 'C%'",
            // A length changes the string; NULL is not a string; a column is not a constant.
            "SELECT COUNT(*) FROM t WHERE c LIKE 'Cabc%'::varchar(2)",
            "SELECT COUNT(*) FROM t WHERE c LIKE '%' || NULL",
            "SELECT COUNT(*) FROM t WHERE c LIKE '%' || d",
            // upper / lower of non-ASCII text depend on the collation.
            "SELECT COUNT(*) FROM t WHERE c LIKE upper('%é%')",
            "SELECT COUNT(*) FROM t WHERE 'a'::text = c",
        ] {
            assert_eq!(folded(sql), None, "{sql}");
        }
    }
}
