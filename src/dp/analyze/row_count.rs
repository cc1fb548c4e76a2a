//! LIMIT and OFFSET: the row counts an analyst's statement asks for, evaluated by pgdp as
//! PostgreSQL evaluates them, so that the released rows are cut exactly where PostgreSQL would
//! cut them.
//!
//! What is accepted is what tools write: an integer literal, `NULL` / `ALL`, an untyped string
//! (`LIMIT '10'`, and a bound parameter of unspecified type), a numeric literal (rounded, half
//! away from zero, as PostgreSQL converts numeric to bigint), a cast of any of them to an integer
//! or numeric type (`LIMIT $1::INTEGER`, SQLAlchemy's form with psycopg 3) and parentheses.
//!
//! Invariants:
//! - The count is a constant of the analyst's input: a column, a parameter left unbound or a
//!   subquery is refused (0A000), so no count depends on data.
//! - Every error is PostgreSQL's, with its SQLSTATE: text that is not an integer of the cast's
//!   type (22P02), a value outside that type's range (22003), a negative LIMIT (2201W) or OFFSET
//!   (2201X); each quotes only the analyst's own text.
//! - Pure: no I/O.

use sqlparser::ast::{self, DataType, Expr, UnaryOperator, Value};

use crate::error::{Error, Result, RowCountFault};
use crate::literal::string_value;

/// Whether a query's LIMIT / OFFSET selects every row: none, `LIMIT ALL` / `LIMIT NULL`,
/// `OFFSET 0` (Prisma's count wraps its rows in `SELECT … OFFSET $1` bound to 0).
pub(super) fn selects_every_row(query: &ast::Query) -> bool {
    query.limit_clause.is_none() || matches!(limit_offset(query), Ok((None, 0)))
}

/// The query's LIMIT (`None`: every row) and OFFSET (0 when there is none).
pub(crate) fn limit_offset(query: &ast::Query) -> Result<(Option<u64>, u64)> {
    match &query.limit_clause {
        None => Ok((None, 0)),
        Some(ast::LimitClause::LimitOffset {
            limit,
            offset,
            limit_by,
        }) => {
            if !limit_by.is_empty() {
                return Err(Error::unsupported(
                    "LIMIT BY",
                    "LIMIT BY is not PostgreSQL SQL: rank within each group with a window in an outer query, e.g. SELECT * FROM (SELECT k, n, ROW_NUMBER() OVER (PARTITION BY k ORDER BY n DESC) AS r FROM (<your query>) s) t WHERE r <= 3.",
                ));
            }
            let limit = match limit {
                Some(e) => row_count(e, Clause::Limit)?,
                None => None,
            };
            // `OFFSET NULL` is `OFFSET 0`.
            let offset = match offset {
                Some(o) => row_count(&o.value, Clause::Offset)?.unwrap_or(0),
                None => 0,
            };
            Ok((limit, offset))
        }
        Some(ast::LimitClause::OffsetCommaLimit { .. }) => Err(Error::unsupported(
            "LIMIT offset, count",
            "Use LIMIT … OFFSET …",
        )),
    }
}

#[derive(Debug, Clone, Copy)]
enum Clause {
    Limit,
    Offset,
}

/// The count `e` stands for, `None` for NULL (PostgreSQL's `LIMIT ALL`, `OFFSET 0`).
fn row_count(e: &Expr, clause: Clause) -> Result<Option<u64>> {
    // PostgreSQL coerces the clause's expression to bigint.
    let Some(value) = evaluate(e, IntegerType::Int8)? else {
        return Ok(None);
    };
    let value = IntegerType::Int8.checked(value)?;
    u64::try_from(value).map(Some).map_err(|_| {
        let (fault, word) = match clause {
            Clause::Limit => (RowCountFault::NegativeLimit, "LIMIT"),
            Clause::Offset => (RowCountFault::NegativeOffset, "OFFSET"),
        };
        Error::InvalidRowCount {
            fault,
            message: format!("{word} must not be negative"),
        }
    })
}

/// PostgreSQL's integer types, as a cast names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum IntegerType {
    Int2,
    Int4,
    Int8,
}

impl IntegerType {
    fn of(data_type: &DataType) -> Option<IntegerType> {
        match data_type {
            DataType::Int2(_) | DataType::SmallInt(_) => Some(IntegerType::Int2),
            DataType::Int(_) | DataType::Int4(_) | DataType::Integer(_) => Some(IntegerType::Int4),
            DataType::Int8(_) | DataType::BigInt(_) => Some(IntegerType::Int8),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            IntegerType::Int2 => "smallint",
            IntegerType::Int4 => "integer",
            IntegerType::Int8 => "bigint",
        }
    }

    fn range(self) -> (i128, i128) {
        match self {
            IntegerType::Int2 => (i16::MIN.into(), i16::MAX.into()),
            IntegerType::Int4 => (i32::MIN.into(), i32::MAX.into()),
            IntegerType::Int8 => (i64::MIN.into(), i64::MAX.into()),
        }
    }

    /// `value` converted to this type: PostgreSQL's `smallint out of range` otherwise.
    fn checked(self, value: i128) -> Result<i128> {
        let (low, high) = self.range();
        if (low..=high).contains(&value) {
            Ok(value)
        } else {
            Err(Error::InvalidRowCount {
                fault: RowCountFault::OutOfRange,
                message: format!("{} out of range", self.name()),
            })
        }
    }

    /// The text of a string literal read as this type (`int4in`): an optional sign and decimal
    /// digits, with white space around them.
    fn parse(self, text: &str) -> Result<i128> {
        let trimmed = text.trim_matches(|c: char| c.is_ascii_whitespace() || c == '\u{b}');
        let digits = trimmed.strip_prefix(['+', '-']).unwrap_or(trimmed);
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(Error::InvalidRowCount {
                fault: RowCountFault::InvalidText,
                message: format!("invalid input syntax for type {}: \"{text}\"", self.name()),
            });
        }
        let (low, high) = self.range();
        match trimmed.parse::<i128>() {
            Ok(v) if (low..=high).contains(&v) => Ok(v),
            _ => Err(Error::InvalidRowCount {
                fault: RowCountFault::OutOfRange,
                message: format!("value \"{text}\" is out of range for type {}", self.name()),
            }),
        }
    }
}

/// The integer value of `e`, an untyped string in it read as `context` (the type the enclosing
/// cast or clause gives it); `None` for NULL.
fn evaluate(e: &Expr, context: IntegerType) -> Result<Option<i128>> {
    match e {
        Expr::Nested(inner) => evaluate(inner, context),
        Expr::Value(v) => match &v.value {
            Value::Null => Ok(None),
            Value::Number(n, _) => numeric(n).map(Some),
            // Any quoting: the session dollar-quotes every literal before analysis.
            other => match string_value(other) {
                Some(text) => context.parse(text).map(Some),
                None => Err(not_a_count()),
            },
        },
        // `-1::integer` is `-(1::integer)`; a sign before an untyped string is not a number.
        Expr::UnaryOp {
            op: op @ (UnaryOperator::Minus | UnaryOperator::Plus),
            expr,
        } if !is_string(expr) => {
            let value = evaluate(expr, context)?;
            Ok(value.map(|v| if *op == UnaryOperator::Minus { -v } else { v }))
        }
        Expr::Cast {
            kind: ast::CastKind::Cast | ast::CastKind::DoubleColon,
            expr,
            data_type,
            format: None,
        } => {
            if let Some(target) = IntegerType::of(data_type) {
                evaluate(expr, target)?
                    .map(|v| target.checked(v))
                    .transpose()
            } else if matches!(
                data_type,
                DataType::Numeric(_) | DataType::Decimal(_) | DataType::Dec(_)
            ) && !is_string(expr)
            {
                // A number cast to numeric keeps its value; the clause rounds it to bigint.
                evaluate(expr, context)
            } else {
                Err(not_a_count())
            }
        }
        _ => Err(not_a_count()),
    }
}

/// Whether `e` is a string literal (an untyped constant, which takes its type from its context).
fn is_string(e: &Expr) -> bool {
    matches!(e, Expr::Value(v) if string_value(&v.value).is_some())
}

fn not_a_count() -> Error {
    Error::unsupported(
        "this LIMIT / OFFSET",
        "Write the count as an integer literal or a parameter, optionally cast to an integer type (LIMIT 10, LIMIT $1, LIMIT $1::integer).",
    )
}

/// A numeric literal (`10`, `5.5`, `1e2`) as an integer, rounded half away from zero as
/// PostgreSQL converts numeric to an integer type; beyond any integer type: `bigint out of range`.
fn numeric(text: &str) -> Result<i128> {
    let out_of_range = || Error::InvalidRowCount {
        fault: RowCountFault::OutOfRange,
        message: "bigint out of range".into(),
    };
    let lower = text.to_ascii_lowercase();
    let (mantissa, exponent) = match lower.split_once('e') {
        Some((m, e)) => (m, e.parse::<i64>().map_err(|_| not_a_count())?),
        None => (lower.as_str(), 0),
    };
    let (whole, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    if !(whole
        .bytes()
        .chain(fraction.bytes())
        .all(|b| b.is_ascii_digit()))
        || whole.len() + fraction.len() == 0
    {
        return Err(not_a_count());
    }
    // The digits with the decimal point after `point` of them.
    let digits: Vec<u8> = whole
        .bytes()
        .chain(fraction.bytes())
        .map(|b| b - b'0')
        .collect();
    let point = i64::try_from(whole.len()).map_err(|_| out_of_range())? + exponent;
    let mut value: i128 = 0;
    for position in 0..point.max(0) {
        let digit = usize::try_from(position)
            .ok()
            .and_then(|p| digits.get(p))
            .copied()
            .unwrap_or(0);
        value = value
            .checked_mul(10)
            .and_then(|v| v.checked_add(digit.into()))
            .filter(|v| *v <= i64::MAX as i128 + 1)
            .ok_or_else(out_of_range)?;
    }
    let first_dropped = usize::try_from(point)
        .ok()
        .and_then(|p| digits.get(p))
        .copied()
        .unwrap_or(0);
    if point >= 0 && first_dropped >= 5 {
        value += 1;
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sqlparser::dialect::PostgreSqlDialect;
    use sqlparser::parser::Parser;

    fn counts(sql: &str) -> Result<(Option<u64>, u64)> {
        let statements = Parser::parse_sql(&PostgreSqlDialect {}, sql).expect("parses");
        let ast::Statement::Query(query) = &statements[0] else {
            panic!("not a query: {sql}");
        };
        limit_offset(query)
    }

    fn fault(sql: &str) -> (String, String) {
        let e = counts(sql).expect_err(sql);
        (e.sqlstate().code().to_string(), e.to_string())
    }

    #[test]
    fn counts_are_what_postgresql_reads() {
        // Each expected value checked against PostgreSQL 15 (`SELECT … LIMIT …`).
        let cases: &[(&str, (Option<u64>, u64))] = &[
            ("SELECT 1 LIMIT 10", (Some(10), 0)),
            ("SELECT 1 LIMIT ALL OFFSET 3", (None, 3)),
            ("SELECT 1 LIMIT NULL OFFSET NULL", (None, 0)),
            ("SELECT 1 LIMIT '7'", (Some(7), 0)),
            ("SELECT 1 LIMIT ' 7 '::integer", (Some(7), 0)),
            ("SELECT 1 LIMIT '+7'::int8 OFFSET '2'::int2", (Some(7), 2)),
            (
                "SELECT 1 LIMIT CAST('5' AS INTEGER) OFFSET CAST(1 AS BIGINT)",
                (Some(5), 1),
            ),
            ("SELECT 1 LIMIT (2)::int", (Some(2), 0)),
            // How the session hands literals to analysis: dollar-quoted.
            (
                "SELECT 1 LIMIT $__dp_s0$4$__dp_s0$::int8 OFFSET $$1$$",
                (Some(4), 1),
            ),
            ("SELECT 1 LIMIT 5.5", (Some(6), 0)),
            ("SELECT 1 LIMIT 2.5::integer", (Some(3), 0)),
            ("SELECT 1 LIMIT 0.5", (Some(1), 0)),
            ("SELECT 1 LIMIT 0.49", (Some(0), 0)),
            ("SELECT 1 LIMIT -0.4", (Some(0), 0)),
            ("SELECT 1 LIMIT 1e2", (Some(100), 0)),
            ("SELECT 1 LIMIT 15e-1", (Some(2), 0)),
            ("SELECT 1 LIMIT 2::numeric", (Some(2), 0)),
            ("SELECT 1 LIMIT NULL::int", (None, 0)),
            ("SELECT 1 OFFSET 0", (None, 0)),
            (
                "SELECT 1 LIMIT 9223372036854775807",
                (Some(i64::MAX as u64), 0),
            ),
        ];
        for (sql, expected) in cases {
            assert_eq!(counts(sql).expect(sql), *expected, "{sql}");
        }
    }

    #[test]
    fn refusals_carry_postgresqls_sqlstate_and_message() {
        let cases: &[(&str, &str, &str)] = &[
            (
                "SELECT 1 LIMIT '5.5'::integer",
                "22P02",
                "invalid input syntax for type integer: \"5.5\"",
            ),
            (
                "SELECT 1 LIMIT 'ten'",
                "22P02",
                "invalid input syntax for type bigint: \"ten\"",
            ),
            (
                "SELECT 1 LIMIT 40000::smallint",
                "22003",
                "smallint out of range",
            ),
            (
                "SELECT 1 LIMIT '40000'::int2",
                "22003",
                "value \"40000\" is out of range for type smallint",
            ),
            (
                "SELECT 1 LIMIT 99999999999999999999",
                "22003",
                "bigint out of range",
            ),
            ("SELECT 1 LIMIT 1e30", "22003", "bigint out of range"),
            ("SELECT 1 LIMIT -1", "2201W", "LIMIT must not be negative"),
            (
                "SELECT 1 OFFSET -1::integer",
                "2201X",
                "OFFSET must not be negative",
            ),
            (
                "SELECT 1 OFFSET '-3'",
                "2201X",
                "OFFSET must not be negative",
            ),
        ];
        for (sql, state, message) in cases {
            assert_eq!(
                fault(sql),
                (state.to_string(), message.to_string()),
                "{sql}"
            );
        }
    }

    #[test]
    fn counts_that_are_not_constants_are_refused() {
        for sql in [
            "SELECT 1 LIMIT x",
            "SELECT 1 LIMIT (SELECT 1)",
            "SELECT 1 LIMIT 1 + 1",
            "SELECT 1 LIMIT '2'::text",
            "SELECT 1 LIMIT 2::float8",
            "SELECT 1 LIMIT $1",
        ] {
            assert_eq!(fault(sql).0, "0A000", "{sql}");
        }
    }
}
