//! Time buckets a `postgres_fdw` shard can compute: the group key `date_trunc(unit, x)` of a
//! `date` or `timestamp` `x`, written as the bucket's first day in date arithmetic, so that the
//! per-unit stage of a grouping by day, week, month, quarter or year runs on the shards
//! (docs/scale-out.md).
//!
//! `date_trunc` does not ship in PostgreSQL 15: of a date it is the `timestamptz` overload
//! (stable), and postgres_fdw sends no function whose text input (the unit) is not a column.
//! Date arithmetic ships: `date - date` (days), integer `+ - * / %`, `date - integer`, casts
//! between `date` and `timestamp`, and `CASE`. In the partitionwise shape, stage 1 computes
//! the key as the bucket's first day (a `date`, [`bucket_start_sql`]); stage 2 groups by that
//! date on the shards; and every stage that reads stage 1 turns it back into `date_trunc`'s
//! value where it reads it: `CAST(k AS TIMESTAMP WITH TIME ZONE)` for a date (the local
//! midnight of that day, which is what `date_trunc` of a date gives in the session's time
//! zone) and `CAST(k AS TIMESTAMP)` for a timestamp (its midnight). A `GROUP BY k` in such a
//! stage still groups by stage 1's date: PostgreSQL resolves a `GROUP BY` name to the input
//! column before an output alias, and the conversion is one to one.
//!
//! The day arithmetic is the civil-from-days conversion of the proleptic Gregorian calendar
//! (PostgreSQL's) in whole 400-year eras: `z` counts days from 0000-03-01 shifted by 17 eras
//! (so it is positive for every date PostgreSQL holds), `doe` is the day of its era, `yoe` the
//! year of the era (March-based), `doy` the day of that March-based year and `mp` its month
//! (0 = March). Only `CASE`, integer arithmetic and one date difference per use appear.
//!
//! Invariants:
//! - The key stage 2 groups by is a one-to-one function of `date_trunc`'s value, and every
//!   reader of stage 1 sees `date_trunc`'s value itself (tests compare the rows of both shapes
//!   on PostgreSQL, and [`bucket_start_sql`] with `date_trunc` over the whole range of dates).
//! - Only the guarded argument pgdp's analysis writes (`CASE WHEN x > upper THEN 'infinity'
//!   WHEN x < lower THEN '-infinity' ELSE x END`, [`crate::dp::analyze`]) is rewritten: within
//!   its bounds `x` is finite and the arithmetic cannot overflow; its ±infinity stay ±infinity.
//!   Anything else (another unit, a `timestamptz`, a time zone argument) is left as it is and
//!   runs on the coordinator, as EXPLAIN says.
//! - A year (`EXTRACT(YEAR FROM x)`, `date_part('year', x)`, unguarded: they never fail) of a
//!   date or timestamp becomes the first day of `x`'s year, which is one to one with the year;
//!   the readers apply the same function to that day. The day count is a `bigint`, so every
//!   date PostgreSQL holds (to 5874897 AD) is in range, and ±infinity, NULL and the days of
//!   4714 BC before its first held day are kept out of the arithmetic ([`year_as_first_day`]).

use sqlparser::ast::{self, DataType, Expr, TimezoneInfo, Value};
use sqlparser::dialect::PostgreSqlDialect;
use sqlparser::parser::Parser;

use super::ship::Kind;

/// Days from 0000-03-01 to 2000-01-01 (the start of the calendar's 400-year cycle to the date
/// PostgreSQL counts from), plus 17 eras of 146097 days: `x - DATE '2000-01-01' + ERA_SHIFT`
/// (computed in `bigint`) is positive for every date from 4714-11-24 BC on.
const ERA_SHIFT: i64 = 730_425 + 17 * 146_097;

/// The units [`bucket_start_sql`] computes, as `date_trunc` spells them (lower case).
const UNITS: [&str; 5] = ["day", "week", "month", "quarter", "year"];

/// SQL for the first day of the `unit` (`day`, `week`, `month`, `quarter` or `year`) that holds
/// `date`, a finite date within the timestamp range (a SQL expression, evaluated several times);
/// `None` for another unit. Its value is `date_trunc(unit, date)`'s day: Monday for weeks,
/// January, April, July or October 1 for quarters. Public for the integration test that compares
/// it with PostgreSQL's `date_trunc` over the calendar.
pub fn bucket_start_sql(unit: &str, date: &str) -> Option<String> {
    let unit = unit.to_ascii_lowercase();
    if !UNITS.contains(&unit.as_str()) {
        return None;
    }
    // In bigint: the difference of two dates is an integer, but with the shift it can pass 2^31
    // for the dates after the timestamp range that a year's key reads (up to 5874897 AD).
    let days = format!("(CAST(({date}) - DATE '2000-01-01' AS BIGINT) + {ERA_SHIFT})");
    // Weekday from Monday = 0: 2000-01-01 was a Saturday (5), and ERA_SHIFT ≡ 3 (mod 7).
    let weekday = format!("({days} + 2) % 7");
    let doe = format!("({days} % 146097)");
    let yoe = format!("(({doe} - {doe} / 1460 + {doe} / 36524 - {doe} / 146096) / 365)");
    let doy = format!("({doe} - (365 * {yoe} + {yoe} / 4 - {yoe} / 100))");
    let mp = format!("((5 * {doy} + 2) / 153)");
    // Days from March 1 to the first of month `mp` (0 = March).
    let month_start = |m: &str| format!("((153 * {m} + 2) / 5)");
    // January 1 of the civil year: after the March-based year's day 306 for January and
    // February, else 59 days (60 in a leap year) before its March 1.
    let leap =
        format!("CASE WHEN {yoe} % 4 = 0 AND ({yoe} % 100 <> 0 OR {yoe} = 0) THEN 1 ELSE 0 END");
    let since_january =
        format!("CASE WHEN {mp} >= 10 THEN {doy} - 306 ELSE {doy} + 59 + {leap} END");
    let offset = match unit.as_str() {
        "day" => return Some(format!("({date})")),
        "week" => weekday,
        "month" => format!("({doy} - {})", month_start(&mp)),
        "quarter" => format!(
            "CASE WHEN {mp} >= 10 OR {mp} = 0 THEN {since_january} ELSE {doy} - {} END",
            month_start(&format!("((({mp} - 1) / 3) * 3 + 1)"))
        ),
        _ => since_january,
    };
    Some(format!("(({date}) - CAST({offset} AS INTEGER))"))
}

/// For a stage-1 key `date_trunc(unit, guarded)` that [`bucket_start_sql`] can compute, or a
/// year of a date or timestamp ([`year_as_first_day`]): the key as its bucket's first day (a
/// `date`, ±infinity kept), and the key's value computed from that day named `alias` (what
/// the stages reading stage 1 put in its place). `kind` gives the temporal kind of an
/// expression of stage 1.
pub(super) fn as_first_day(
    key: &Expr,
    kind: impl Fn(&Expr) -> Option<Kind>,
    alias: &ast::Ident,
) -> Option<(Expr, Expr)> {
    if let Some(year) = year_as_first_day(key, &kind, alias) {
        return Some(year);
    }
    let (first_day, back) = trunc_as_first_day(key, kind)?;
    let value = Expr::Cast {
        kind: ast::CastKind::Cast,
        expr: Box::new(Expr::Identifier(alias.clone())),
        data_type: back,
        format: None,
    };
    Some((first_day, value))
}

/// A key `EXTRACT(YEAR FROM x)` or `date_part('year', x)` of a date or timestamp `x` as the first
/// day of `x`'s year, and the same function of that day named `alias`: the year of a day is the
/// year of its year's first day, and two days of different years have different first days, so
/// stage 2 groups by the year (one to one). Neither function is guarded by pgdp's analysis (it
/// never fails), so the first day is computed for every date PostgreSQL holds: ±infinity stay
/// (their year is ±Infinity, as `x`'s), NULL stays NULL, and the days of 4714 BC before its
/// first day PostgreSQL holds (4714-11-24 BC) all take that day (their year is 4714 BC).
fn year_as_first_day(
    key: &Expr,
    kind: impl Fn(&Expr) -> Option<Kind>,
    alias: &ast::Ident,
) -> Option<(Expr, Expr)> {
    let mut value = key.clone();
    let x: &Expr = match key {
        Expr::Extract {
            field: ast::DateTimeField::Year,
            expr,
            ..
        } => {
            if let Expr::Extract { expr, .. } = &mut value {
                **expr = Expr::Identifier(alias.clone());
            }
            expr
        }
        Expr::Function(f) => {
            let (field, x) = text_and_argument(f, "date_part")?;
            if !field.eq_ignore_ascii_case("year") {
                return None;
            }
            if let Expr::Function(g) = &mut value {
                if let ast::FunctionArguments::List(list) = &mut g.args {
                    if let Some(argument) = list.args.get_mut(1) {
                        *argument = ast::FunctionArg::Unnamed(ast::FunctionArgExpr::Expr(
                            Expr::Identifier(alias.clone()),
                        ));
                    }
                }
            }
            x
        }
        _ => return None,
    };
    let date = match kind(x)? {
        Kind::Date => format!("({x})"),
        Kind::Timestamp => format!("CAST({x} AS DATE)"),
        Kind::TimestampTz | Kind::Interval => return None,
    };
    let start = bucket_start_sql("year", &date)?;
    let text = format!(
        "CASE WHEN {date} = DATE 'infinity' OR {date} = DATE '-infinity' THEN {date} \
         WHEN {date} < DATE '4713-01-01 BC' THEN DATE '4714-11-24 BC' ELSE {start} END"
    );
    let first_day = Parser::new(&PostgreSqlDialect {})
        .try_with_sql(&text)
        .and_then(|mut p| p.parse_expr())
        .ok()?;
    Some((first_day, value))
}

/// `date_trunc(unit, guarded)` as its bucket's first day, and the type that turns that day back
/// into `date_trunc`'s value.
fn trunc_as_first_day(
    key: &Expr,
    kind: impl Fn(&Expr) -> Option<Kind>,
) -> Option<(Expr, DataType)> {
    let Expr::Function(f) = key else {
        return None;
    };
    let (unit, guarded) = text_and_argument(f, "date_trunc")?;
    let (upper, lower, x) = guard_parts(guarded)?;
    let (date, back) = match kind(x)? {
        Kind::Date => (
            x.to_string(),
            DataType::Timestamp(None, TimezoneInfo::WithTimeZone),
        ),
        Kind::Timestamp => (
            format!("CAST({x} AS DATE)"),
            DataType::Timestamp(None, TimezoneInfo::None),
        ),
        Kind::TimestampTz | Kind::Interval => return None,
    };
    let start = bucket_start_sql(unit, &date)?;
    let text = format!(
        "CASE WHEN {upper} THEN DATE 'infinity' WHEN {lower} THEN DATE '-infinity' ELSE {start} END"
    );
    let parsed = Parser::new(&PostgreSqlDialect {})
        .try_with_sql(&text)
        .and_then(|mut p| p.parse_expr())
        .ok()?;
    Some((parsed, back))
}

/// The text literal and the expression of a plain call `name('text', x)` (no `OVER`, no
/// `FILTER`, no named arguments).
fn text_and_argument<'a>(f: &'a ast::Function, name: &str) -> Option<(&'a str, &'a Expr)> {
    let called = f.name.0.last()?.as_ident()?;
    if !called.value.eq_ignore_ascii_case(name) || f.over.is_some() || f.filter.is_some() {
        return None;
    }
    let ast::FunctionArguments::List(list) = &f.args else {
        return None;
    };
    match list.args.as_slice() {
        [ast::FunctionArg::Unnamed(ast::FunctionArgExpr::Expr(Expr::Value(text))), ast::FunctionArg::Unnamed(ast::FunctionArgExpr::Expr(x))] => {
            Some((crate::literal::string_value(&text.value)?, x))
        }
        _ => None,
    }
}

/// The parts `(x > upper, x < lower, x)` of the guard `CASE WHEN x > upper THEN 'infinity' WHEN
/// x < lower THEN '-infinity' ELSE x END`.
fn guard_parts(guarded: &Expr) -> Option<(&Expr, &Expr, &Expr)> {
    let Expr::Case {
        operand: None,
        conditions,
        else_result: Some(x),
        ..
    } = guarded
    else {
        return None;
    };
    let [above, below] = conditions.as_slice() else {
        return None;
    };
    let literal = |e: &Expr, want: &str| matches!(e, Expr::Value(v) if v.value == Value::SingleQuotedString(want.to_string()));
    let compares = |e: &Expr, op: ast::BinaryOperator| matches!(e, Expr::BinaryOp { left, op: o, .. } if *o == op && **left == **x);
    let well_formed = literal(&above.result, "infinity")
        && literal(&below.result, "-infinity")
        && compares(&above.condition, ast::BinaryOperator::Gt)
        && compares(&below.condition, ast::BinaryOperator::Lt);
    well_formed.then_some((&above.condition, &below.condition, x))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_units_of_whole_days_have_a_first_day() {
        for unit in UNITS {
            assert!(bucket_start_sql(unit, "d").is_some(), "{unit}");
        }
        assert!(bucket_start_sql("MONTH", "d").is_some());
        for unit in [
            "hour",
            "minute",
            "decade",
            "century",
            "millennium",
            "months",
            "",
        ] {
            assert_eq!(bucket_start_sql(unit, "d"), None, "{unit}");
        }
        assert_eq!(bucket_start_sql("day", "d").as_deref(), Some("(d)"));
    }

    fn expr(sql: &str) -> Expr {
        Parser::new(&PostgreSqlDialect {})
            .try_with_sql(sql)
            .and_then(|mut p| p.parse_expr())
            .expect("parses")
    }

    #[test]
    fn a_year_key_groups_by_its_first_day_and_is_read_back_as_the_same_function() {
        let alias = ast::Ident::new("__dp_k0");
        for (key, kind, back) in [
            (
                "EXTRACT(YEAR FROM t.d)",
                Kind::Date,
                "EXTRACT(YEAR FROM __dp_k0)",
            ),
            (
                "date_part('year', t.ts)",
                Kind::Timestamp,
                "date_part('year', __dp_k0)",
            ),
            (
                "DATE_PART('YEAR', t.d)",
                Kind::Date,
                "DATE_PART('YEAR', __dp_k0)",
            ),
        ] {
            let (first_day, value) = as_first_day(&expr(key), |_| Some(kind), &alias).expect(key);
            assert_eq!(value.to_string(), back);
            let sql = first_day.to_string();
            for word in ["EXTRACT", "date_part", "DATE_PART", "date_trunc"] {
                assert!(!sql.contains(word), "{key}: {word}: {sql}");
            }
            assert!(
                sql.contains("DATE 'infinity'") && sql.contains("'4714-11-24 BC'"),
                "{sql}"
            );
        }
        // A zone-dependent year, another field, a year of something else: left to the coordinator.
        for (key, kind) in [
            ("EXTRACT(YEAR FROM t.tz)", Kind::TimestampTz),
            ("EXTRACT(MONTH FROM t.d)", Kind::Date),
            ("date_part('dow', t.d)", Kind::Date),
            ("date_part('year', t.i)", Kind::Interval),
            ("date_part(t.f, t.d)", Kind::Date),
        ] {
            assert_eq!(
                as_first_day(&expr(key), |_| Some(kind), &alias),
                None,
                "{key}"
            );
        }
    }

    #[test]
    fn the_first_day_uses_only_arithmetic_that_ships() {
        let sql = bucket_start_sql("quarter", "x").expect("quarter");
        for word in [
            "date_trunc",
            "date_part",
            "EXTRACT",
            "to_char",
            "LEAST",
            "GREATEST",
        ] {
            assert!(!sql.contains(word), "{word}: {sql}");
        }
        // It parses as one expression.
        Parser::new(&PostgreSqlDialect {})
            .try_with_sql(&sql)
            .and_then(|mut p| p.parse_expr())
            .expect("parses");
    }
}
