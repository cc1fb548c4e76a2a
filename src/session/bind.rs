//! Bound parameters as literals: a DP statement's `$n` are values known at Bind, so pgdp analyses
//! the statement with them in place (`LIMIT $1`, `date_trunc($1, …)`, `FILTER (WHERE age >= $1)`,
//! `HAVING COUNT(*) > $1`), exactly as if the analyst had typed the literals.
//!
//! Invariants:
//! - A bound value becomes a literal of the parameter's type (a number, a boolean, a typed date or
//!   timestamp string) or an untyped string literal, which PostgreSQL types from its context as
//!   it types an untyped parameter. The literal then passes every check analysis applies to
//!   literals the analyst writes: a parameter can say nothing a literal could not.
//! - A value that is not of its declared type is refused here with 22P02 and the value, as
//!   PostgreSQL refuses it at Bind; nothing has run yet.
//! - Before Bind (Describe of a statement), [`StandIns`] give each parameter a fixed value of its
//!   type, so the answer's columns can be described; PostgreSQL's column types never depend on
//!   parameter values, so the description holds for every binding.
//! - Pure: no I/O.

use std::ops::ControlFlow;

use sqlparser::ast::{self, Expr, Value};

use crate::error::{Error, Result};

/// What pgdp needs to know of a parameter's type to write its value as a literal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParameterType {
    /// int2, int4, int8, oid.
    Integer,
    /// numeric, float4, float8.
    Number,
    Boolean,
    Date,
    Timestamp,
    Timestamptz,
    /// text, varchar, unknown (unspecified) and every other type: an untyped string literal.
    Untyped,
    /// int2[], int4[], int8[] (`= ANY($1)` with a list).
    IntegerArray,
    /// numeric[], float4[], float8[].
    NumberArray,
    /// text[], varchar[].
    TextArray,
}

impl ParameterType {
    /// The type of a parameter with PostgreSQL type `oid` (0: unspecified).
    pub fn of_oid(oid: u32) -> ParameterType {
        match oid {
            20 | 21 | 23 | 26 => ParameterType::Integer,
            700 | 701 | 1700 => ParameterType::Number,
            16 => ParameterType::Boolean,
            1082 => ParameterType::Date,
            1114 => ParameterType::Timestamp,
            1184 => ParameterType::Timestamptz,
            1005 | 1007 | 1016 => ParameterType::IntegerArray,
            1021 | 1022 | 1231 => ParameterType::NumberArray,
            1009 | 1015 => ParameterType::TextArray,
            _ => ParameterType::Untyped,
        }
    }

    /// A value of this type that analysis accepts wherever a literal of it may stand (a limit, a
    /// threshold, a date_trunc unit, a bound of a range), for describing a statement before Bind.
    fn stand_in(self, set: StandIns) -> &'static str {
        match (self, set) {
            // Zero: `OFFSET 0` selects every row (Prisma wraps its rows in `OFFSET $1`).
            (ParameterType::Integer | ParameterType::Number, StandIns::Zero) => "0",
            // One: a divisor (`AVG(income / $1)`), where zero is a division by zero.
            (ParameterType::Integer | ParameterType::Number, StandIns::One) => "1",
            (ParameterType::Boolean, _) => "true",
            (ParameterType::Date, _) => "2000-01-01",
            (ParameterType::Timestamp | ParameterType::Timestamptz, _) => "2000-01-01 00:00:00",
            (ParameterType::Untyped, _) => "month",
            (ParameterType::IntegerArray | ParameterType::NumberArray, StandIns::Zero) => "{0}",
            (ParameterType::IntegerArray | ParameterType::NumberArray, StandIns::One) => "{1}",
            (ParameterType::TextArray, _) => "{month}",
        }
    }
}

/// Sets of stand-in values for parameters before Bind (see the module documentation), tried in
/// order until analysis admits the statement with one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StandIns {
    /// Numbers 0.
    Zero,
    /// Numbers 1.
    One,
}

impl StandIns {
    pub const ALL: [StandIns; 2] = [StandIns::Zero, StandIns::One];

    /// Stand-in values of this set for the parameters of `query`, of `types`; a parameter
    /// that is the zone of `AT TIME ZONE $n` (Django with server-side binding) stands for 'UTC',
    /// the zone analysis answers in.
    pub fn values(self, query: &ast::Query, types: &[ParameterType]) -> Vec<Option<String>> {
        let mut zones = std::collections::BTreeSet::new();
        let _ = ast::visit_expressions(query, |e| {
            if let Expr::AtTimeZone { time_zone, .. } = e {
                if let Expr::Value(v) = time_zone.as_ref() {
                    if let Value::Placeholder(p) = &v.value {
                        zones.extend(p.strip_prefix('$').and_then(|n| n.parse::<usize>().ok()));
                    }
                }
            }
            ControlFlow::<()>::Continue(())
        });
        types
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let zone = *t == ParameterType::Untyped && zones.contains(&(i + 1));
                Some(if zone { "UTC" } else { t.stand_in(self) }.to_string())
            })
            .collect()
    }
}

/// Whether `query` has a `$n` parameter anywhere.
pub fn has_parameters(query: &ast::Query) -> bool {
    let found = ast::visit_expressions(query, |e| match e {
        Expr::Value(v) if matches!(v.value, Value::Placeholder(_)) => ControlFlow::Break(()),
        _ => ControlFlow::Continue(()),
    });
    found.is_break()
}

/// `query` with each `$n` replaced by the literal of bound value `values[n - 1]` of type
/// `types[n - 1]` (untyped when the type is not known).
pub fn bind(
    query: &ast::Query,
    values: &[Option<String>],
    types: &[ParameterType],
) -> Result<ast::Query> {
    let mut bound = query.clone();
    let mut failure = None;
    let _ = ast::visit_expressions_mut(&mut bound, |e| {
        let Expr::Value(v) = e else {
            return ControlFlow::Continue(());
        };
        let Value::Placeholder(p) = &v.value else {
            return ControlFlow::Continue(());
        };
        let index = p
            .strip_prefix('$')
            .and_then(|n| n.parse::<usize>().ok())
            .filter(|n| *n >= 1);
        let result = match index {
            None => Err(Error::unsupported(
                format!("the parameter syntax {p}"),
                "Number parameters $1, $2, …",
            )),
            Some(n) => match values.get(n - 1) {
                None => Err(Error::Protocol {
                    what: format!("there is no parameter ${n}"),
                }),
                Some(value) => literal(
                    n,
                    value.as_deref(),
                    types.get(n - 1).copied().unwrap_or(ParameterType::Untyped),
                ),
            },
        };
        match result {
            Ok(literal) => {
                *e = literal;
                ControlFlow::Continue(())
            }
            Err(error) => {
                failure = Some(error);
                ControlFlow::Break(())
            }
        }
    });
    match failure {
        Some(error) => Err(error),
        None => Ok(bound),
    }
}

/// The literal of parameter `$index` bound to `value`.
fn literal(index: usize, value: Option<&str>, ty: ParameterType) -> Result<Expr> {
    let Some(text) = value else {
        return Ok(Expr::value(Value::Null));
    };
    let invalid = |what: &str| Error::InvalidText {
        what: what.into(),
        value: text.chars().take(64).collect(),
        parameter: index,
    };
    let trimmed = text.trim();
    Ok(match ty {
        ParameterType::Integer => {
            let n: i64 = trimmed.parse().map_err(|_| invalid("integer"))?;
            number(&n.to_string())
        }
        ParameterType::Number => {
            let f: f64 = trimmed.parse().map_err(|_| invalid("numeric"))?;
            if !f.is_finite() {
                return Err(invalid("numeric"));
            }
            // The decimal text as sent (f64's shortest form for a binary float parameter).
            let plain = trimmed.trim_start_matches('+');
            let decimal = plain
                .strip_prefix('-')
                .unwrap_or(plain)
                .bytes()
                .all(|b| b.is_ascii_digit() || b == b'.');
            if decimal {
                number(plain)
            } else {
                number(&f.to_string())
            }
        }
        ParameterType::Boolean => match trimmed.to_ascii_lowercase().as_str() {
            "t" | "true" | "yes" | "on" | "1" | "y" => Expr::value(Value::Boolean(true)),
            "f" | "false" | "no" | "off" | "0" | "n" => Expr::value(Value::Boolean(false)),
            _ => return Err(invalid("boolean")),
        },
        ParameterType::Date => {
            // PostgreSQL's date input reads the date of a timestamp ('2024-01-01 00:00:00',
            // '2024-01-01T00:00:00.000Z', how drivers send a JavaScript Date) and drops the time.
            let date = trimmed
                .get(..10)
                .filter(|d| crate::datetime::Date::parse(d).is_some())
                .filter(|_| trimmed.len() == 10 || trimmed[10..].starts_with([' ', 'T', 't']))
                .ok_or_else(|| invalid("date"))?;
            typed(ast::DataType::Date, date)
        }
        ParameterType::Timestamp | ParameterType::Timestamptz => {
            trimmed
                .get(..10)
                .and_then(crate::datetime::Date::parse)
                .ok_or_else(|| invalid("timestamp"))?;
            let zone = if ty == ParameterType::Timestamp {
                ast::TimezoneInfo::None
            } else {
                ast::TimezoneInfo::WithTimeZone
            };
            typed(ast::DataType::Timestamp(None, zone), trimmed)
        }
        ParameterType::Untyped => Expr::value(crate::literal::dollar_quoted(text)),
        ParameterType::IntegerArray | ParameterType::NumberArray | ParameterType::TextArray => {
            let element = match ty {
                ParameterType::IntegerArray => ParameterType::Integer,
                ParameterType::NumberArray => ParameterType::Number,
                _ => ParameterType::Untyped,
            };
            let elements = array_elements(text).ok_or_else(|| invalid("array"))?;
            if elements.len() > crate::limits::IN_LIST_VALUES_MAX {
                return Err(Error::LimitExceeded {
                    what: "the length of an array parameter".into(),
                    limit: crate::limits::IN_LIST_VALUES_MAX as u64,
                });
            }
            let elem = elements
                .iter()
                .map(|e| literal(index, e.as_deref(), element))
                .collect::<Result<Vec<Expr>>>()?;
            // `x = ANY($1)` becomes `x = ANY (ARRAY[…])`, which analysis reads as `x IN (…)`.
            Expr::Array(ast::Array { elem, named: true })
        }
    })
}

/// The elements of a one-dimensional array in PostgreSQL's text form (`{a,"b c",NULL}`), NULL
/// as `None`; `None` for anything else (a nested or malformed array).
fn array_elements(text: &str) -> Option<Vec<Option<String>>> {
    let inner = text.trim().strip_prefix('{')?.strip_suffix('}')?;
    if inner.trim().is_empty() {
        return Some(Vec::new());
    }
    let mut elements = Vec::new();
    let mut chars = inner.chars().peekable();
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let element = if chars.next_if_eq(&'"').is_some() {
            let mut value = String::new();
            loop {
                match chars.next()? {
                    '"' => break,
                    '\\' => value.push(chars.next()?),
                    c => value.push(c),
                }
            }
            Some(value)
        } else {
            let mut value = String::new();
            while let Some(c) = chars.next_if(|c| *c != ',') {
                if matches!(c, '{' | '}' | '"' | '\\') {
                    return None;
                }
                value.push(c);
            }
            let value = value.trim().to_string();
            if value.is_empty() {
                return None;
            }
            (!value.eq_ignore_ascii_case("null")).then_some(value)
        };
        elements.push(element);
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        match chars.next() {
            None => return Some(elements),
            Some(',') => {}
            Some(_) => return None,
        }
    }
}

/// A number literal; a negative one as the negation of its magnitude, as the parser reads `-5`.
fn number(text: &str) -> Expr {
    match text.strip_prefix('-') {
        Some(magnitude) => Expr::UnaryOp {
            op: ast::UnaryOperator::Minus,
            expr: Box::new(Expr::value(Value::Number(magnitude.to_string(), false))),
        },
        None => Expr::value(Value::Number(text.to_string(), false)),
    }
}

fn typed(data_type: ast::DataType, text: &str) -> Expr {
    Expr::TypedString(ast::TypedString {
        data_type,
        value: crate::literal::dollar_quoted(text).into(),
        uses_odbc_syntax: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::classify::{classify, Statement};

    fn query(sql: &str) -> Box<ast::Query> {
        match classify(sql).expect("parses").pop() {
            Some(Statement::Query(q)) => q,
            other => panic!("not a query: {other:?}"),
        }
    }

    fn bound(sql: &str, values: &[&str], types: &[ParameterType]) -> String {
        let values: Vec<Option<String>> = values.iter().map(|v| Some(v.to_string())).collect();
        // As shown to the analyst: pgdp dollar-quotes every literal it writes.
        crate::literal::for_display(
            &bind(&query(sql), &values, types)
                .expect("binds")
                .to_string(),
        )
    }

    #[test]
    fn values_become_literals_of_their_type() {
        use ParameterType::*;
        assert_eq!(
            bound(
                "SELECT COUNT(*) FROM t WHERE a >= $1 AND d < $2 AND b = $3 GROUP BY k HAVING COUNT(*) > $4 LIMIT $5 OFFSET $6",
                &["-3", "2024-01-01 00:00:00", "x'y", "10", "10", "0"],
                &[Integer, Date, Untyped, Integer, Integer, Number],
            ),
            "SELECT COUNT(*) FROM t WHERE a >= -3 AND d < DATE '2024-01-01' AND b = 'x''y' GROUP BY k HAVING COUNT(*) > 10 LIMIT 10 OFFSET 0"
        );
        assert_eq!(
            bound(
                "SELECT date_trunc($1, ts) FROM t WHERE ts >= $2 AND ok = $3",
                &["month", "2024-01-01T00:00:00.000Z", "t"],
                &[Untyped, Timestamptz, Boolean],
            ),
            "SELECT date_trunc('month', ts) FROM t WHERE ts >= TIMESTAMP WITH TIME ZONE '2024-01-01T00:00:00.000Z' AND ok = true"
        );
        assert_eq!(
            bound("SELECT 1 FROM t WHERE x = $1", &["2.5"], &[Number]),
            "SELECT 1 FROM t WHERE x = 2.5"
        );
        assert_eq!(
            bound("SELECT 1 FROM t WHERE x = $1", &["1e-3"], &[Number]),
            "SELECT 1 FROM t WHERE x = 0.001"
        );
    }

    #[test]
    fn a_value_not_of_its_type_is_refused_with_22p02() {
        use ParameterType::*;
        for (value, ty) in [
            ("ten", Integer),
            ("NaN", Number),
            ("2024-13-01", Date),
            ("2024-01-01x", Date),
            ("maybe", Boolean),
        ] {
            let e = bind(
                &query("SELECT 1 FROM t WHERE x = $1"),
                &[Some(value.into())],
                &[ty],
            )
            .expect_err(value);
            assert_eq!(e.sqlstate().code(), "22P02", "{value}");
            assert!(e.to_string().contains(value), "{e}");
        }
        let missing = bind(&query("SELECT 1 FROM t WHERE x = $2"), &[None], &[]).expect_err("$2");
        assert_eq!(missing.sqlstate().code(), "08P01");
    }

    #[test]
    fn array_parameters_become_array_constructors() {
        use ParameterType::*;
        assert_eq!(
            bound(
                "SELECT 1 FROM t WHERE r = ANY($1) AND a = ANY($2)",
                &[r#"{NO, "S E", "q\"t", NULL}"#, "{1,-2}"],
                &[TextArray, IntegerArray],
            ),
            r#"SELECT 1 FROM t WHERE r = ANY(ARRAY['NO', 'S E', 'q"t', NULL]) AND a = ANY(ARRAY[1, -2])"#
        );
        for bad in ["NO,SE", "{{1},{2}}", "{a,,b}", r#"{"open}"#, "{1,x}"] {
            let ty = if bad == "{1,x}" {
                IntegerArray
            } else {
                TextArray
            };
            let e = bind(
                &query("SELECT 1 FROM t WHERE x = ANY($1)"),
                &[Some(bad.into())],
                &[ty],
            )
            .expect_err(bad);
            assert_eq!(e.sqlstate().code(), "22P02", "{bad}");
        }
        assert_eq!(array_elements("{}"), Some(vec![]));
    }

    #[test]
    fn null_and_stand_ins() {
        let q = bind(
            &query("SELECT 1 FROM t WHERE x = $1 LIMIT $2"),
            &[None, Some("5".into())],
            &[ParameterType::Untyped, ParameterType::Integer],
        )
        .expect("binds");
        assert_eq!(q.to_string(), "SELECT 1 FROM t WHERE x = NULL LIMIT 5");
        assert!(has_parameters(&query("SELECT 1 FROM t LIMIT $1")));
        assert!(!has_parameters(&q));
        let types = [
            ParameterType::Integer,
            ParameterType::Untyped,
            ParameterType::Untyped,
        ];
        let q = query("SELECT date_trunc($2, ts AT TIME ZONE $3) FROM t LIMIT $1");
        let strings = |v: &[&str]| v.iter().map(|s| Some(s.to_string())).collect::<Vec<_>>();
        assert_eq!(
            StandIns::Zero.values(&q, &types),
            strings(&["0", "month", "UTC"])
        );
        assert_eq!(
            StandIns::One.values(&q, &types),
            strings(&["1", "month", "UTC"])
        );
    }
}
