//! Free helpers of analysis: literal domains, date units, the total-function whitelist, types of
//! SQL data types and checks of temporal literals.

use super::*;

/// The domain of a CASE whose results are all literals of one kind (strings, or integers), as
/// the text PostgreSQL prints for them; `None` if some result is not such a literal.
pub(super) fn literal_domain(results: &[&Expr]) -> Result<Option<Vec<Option<String>>>> {
    let mut strings = Vec::new();
    let mut integers = Vec::new();
    let mut null = false;
    for r in results {
        let Expr::Value(v) = r else { return Ok(None) };
        match &v.value {
            Value::Number(n, _) => match n.parse::<i64>() {
                Ok(i) => integers.push(i.to_string()),
                Err(_) => return Ok(None),
            },
            Value::Null => null = true,
            other => match crate::literal::string_value(other) {
                Some(t) => strings.push(t.to_string()),
                None => return Ok(None),
            },
        }
    }
    if !strings.is_empty() && !integers.is_empty() {
        // PostgreSQL would fail on this CASE (after the charge): refuse it before.
        return Err(Error::Syntax {
            message: "CASE types text and integer cannot be matched".into(),
        });
    }
    let mut domain = if strings.is_empty() {
        integers
    } else {
        strings
    };
    domain.sort();
    domain.dedup();
    if domain.is_empty() {
        return Ok(None);
    }
    let mut domain: Vec<Option<String>> = domain.into_iter().map(Some).collect();
    if null {
        domain.push(None);
    }
    Ok(Some(domain))
}

/// The unit of date_trunc / field of date_part must be one PostgreSQL knows, or the upstream
/// would fail (after the charge).
pub(super) fn check_date_unit(name: &str, e: &Expr) -> Result<()> {
    let text = match e {
        Expr::Value(v) => crate::literal::string_value(&v.value)
            .unwrap_or_default()
            .to_ascii_lowercase(),
        _ => String::new(),
    };
    let units: &[&str] = &[
        "microseconds",
        "milliseconds",
        "second",
        "minute",
        "hour",
        "day",
        "week",
        "month",
        "quarter",
        "year",
        "decade",
        "century",
        "millennium",
    ];
    let fields: &[&str] = &["dow", "doy", "isodow", "isoyear", "epoch", "julian"];
    let ok =
        units.contains(&text.as_str()) || (name == "date_part" && fields.contains(&text.as_str()));
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidParameter {
            name: format!("the first argument of {name}"),
            reason: "is not a unit PostgreSQL knows".into(),
            hint: "Use a quoted unit such as 'day', 'week', 'month', 'quarter' or 'year'.".into(),
        })
    }
}

/// Refuses comparisons PostgreSQL would reject for their types (text with numbers, …): they
/// would fail upstream only after the charge.
pub(super) fn check_comparable(l: &Info, r: &Info) -> Result<()> {
    use ColumnType as T;
    let family = |t: T| match t {
        T::Integer | T::Numeric | T::Float => 0,
        T::Text => 1,
        T::Date | T::Timestamp => 2,
        T::Boolean => 3,
    };
    match (l.ty, r.ty) {
        (Some(a), Some(b)) if family(a) != family(b) => Err(Error::UnknownFunction {
            name: format!("operator for {} and {}", a.name(), b.name()),
            hint: "Compare values of the same kind, e.g. a text column with a quoted string."
                .into(),
        }),
        _ => Ok(()),
    }
}

/// Wraps an integer-typed operand in a numeric cast so arithmetic cannot overflow.
pub(super) fn as_numeric(e: Expr, info: &Info) -> Expr {
    // Integer and float arithmetic overflow raise errors; numeric does not in practice.
    if matches!(info.ty, Some(ColumnType::Integer | ColumnType::Float)) {
        Expr::Cast {
            kind: ast::CastKind::Cast,
            expr: Box::new(Expr::Nested(Box::new(e))),
            data_type: ast::DataType::Numeric(ast::ExactNumberInfo::None),
            format: None,
        }
    } else {
        e
    }
}

pub(super) fn nullif_zero(e: Expr) -> Expr {
    Expr::Function(function_call(
        "NULLIF",
        vec![e, Expr::value(Value::Number("0".into(), false))],
    ))
}

/// A plain call `name(args…)`.
pub(super) fn function_call(name: &str, args: Vec<Expr>) -> ast::Function {
    ast::Function {
        name: ObjectName::from(vec![Ident::new(name)]),
        uses_odbc_syntax: false,
        parameters: FunctionArguments::None,
        args: FunctionArguments::List(ast::FunctionArgumentList {
            duplicate_treatment: None,
            args: args
                .into_iter()
                .map(|a| FunctionArg::Unnamed(FunctionArgExpr::Expr(a)))
                .collect(),
            clauses: vec![],
        }),
        filter: None,
        null_treatment: None,
        over: None,
        within_group: vec![],
    }
}

pub(super) fn function_name(name: &ObjectName) -> Result<String> {
    let parts: Vec<String> = name
        .0
        .iter()
        .map(|p| p.to_string().to_ascii_lowercase())
        .collect();
    match parts.as_slice() {
        [n] => Ok(n.clone()),
        [schema, n] if schema == "pg_catalog" => Ok(n.clone()),
        _ => Err(Error::UnknownFunction {
            name: name.to_string(),
            hint: "User-defined functions are not available through pgdp.".into(),
        }),
    }
}

/// An expression pgdp's own rewrites wrote as text (`what` names it): parsed, or an internal
/// error, since the text came from pgdp, not the analyst.
pub(super) fn parse_own_expr(text: &str, what: &str) -> Result<Expr> {
    let dialect = sqlparser::dialect::PostgreSqlDialect {};
    sqlparser::parser::Parser::new(&dialect)
        .with_recursion_limit(limits::PARSER_DEPTH_MAX)
        .try_with_sql(text)
        .and_then(|mut p| p.parse_expr())
        .map_err(|e| Error::internal(format!("{what} did not parse: {e}")))
}

pub(super) fn aggregate_kind(name: &str) -> Option<AggregateKind> {
    Some(match name {
        "count" => AggregateKind::CountRows,
        "sum" => AggregateKind::Sum,
        "avg" => AggregateKind::Avg,
        "variance" | "var_samp" => AggregateKind::VarSamp,
        "var_pop" => AggregateKind::VarPop,
        "stddev" | "stddev_samp" => AggregateKind::StddevSamp,
        "stddev_pop" => AggregateKind::StddevPop,
        "min" | "max" | "median" | "percentile_cont" | "percentile_disc" => {
            AggregateKind::Quantile { permille: 0 }
        }
        super::existence::DETECTED_FUNCTION => AggregateKind::Detected,
        _ => return None,
    })
}

pub(super) fn contains_aggregate(e: &Expr) -> bool {
    contains_function(e, |f| {
        function_name(&f.name)
            .ok()
            .and_then(|n| aggregate_kind(&n))
            .is_some()
    })
}

/// Whether `e` calls an aggregate as an aggregate (not over a window).
pub(super) fn contains_plain_aggregate(e: &Expr) -> bool {
    contains_function(e, |f| {
        f.over.is_none()
            && function_name(&f.name)
                .ok()
                .and_then(|n| aggregate_kind(&n))
                .is_some()
    })
}

/// Whether `e` calls a window function.
pub(super) fn contains_window(e: &Expr) -> bool {
    contains_function(e, |f| f.over.is_some())
}

fn contains_function(e: &Expr, test: impl Fn(&ast::Function) -> bool) -> bool {
    let mut found = false;
    let _ = ast::visit_expressions(e, |x| {
        if let Expr::Function(f) = x {
            if test(f) {
                found = true;
            }
        }
        std::ops::ControlFlow::<()>::Continue(())
    });
    found
}

pub(super) enum Result_ {
    Same(usize),
    Fixed(ColumnType),
}

pub(super) struct FunctionSpec {
    pub(super) min_args: usize,
    pub(super) max_args: usize,
    pub(super) literal_args: &'static [usize],
    pub(super) result: Result_,
}

/// The whitelist of total functions: none raises an error for some data values and not others,
/// none depends on time, randomness or session state, and none can run long on its input.
pub fn is_total_function(name: &str) -> bool {
    total_function(name).is_some()
}

pub(super) fn total_function(name: &str) -> Option<FunctionSpec> {
    use ColumnType as T;
    let spec = |min_args, max_args, literal_args, result| FunctionSpec {
        min_args,
        max_args,
        literal_args,
        result,
    };
    Some(match name {
        "lower" | "upper" | "btrim" | "ltrim" | "rtrim" | "trim" => {
            spec(1, 1, &[], Result_::Fixed(T::Text))
        }
        "length" | "char_length" | "character_length" => {
            spec(1, 1, &[], Result_::Fixed(T::Integer))
        }
        "abs" => spec(1, 1, &[], Result_::Same(0)),
        "round" | "trunc" => spec(1, 2, &[1], Result_::Fixed(T::Numeric)),
        "floor" | "ceil" | "ceiling" => spec(1, 1, &[], Result_::Fixed(T::Numeric)),
        "coalesce" | "greatest" | "least" => spec(1, 8, &[], Result_::Same(0)),
        "nullif" => spec(2, 2, &[], Result_::Same(0)),
        "date_trunc" => spec(2, 2, &[0], Result_::Fixed(T::Timestamp)),
        "date_part" => spec(2, 2, &[0], Result_::Fixed(T::Numeric)),
        // Analysed on its own (`Analyzer::date_bin`): literal stride and origin, guarded source.
        "date_bin" => spec(3, 3, &[0, 2], Result_::Fixed(T::Timestamp)),
        // Of a date or timestamp only, with a plain format (`check_to_char`).
        "to_char" => spec(2, 2, &[1], Result_::Fixed(T::Text)),
        // Analysed on its own (`Analyzer::width_bucket`): literal bounds and count, a NaN
        // argument sent to NULL, so it never fails on a row.
        "width_bucket" => spec(4, 4, &[1, 2, 3], Result_::Fixed(T::Integer)),
        _ => return None,
    })
}

pub(super) fn type_of_data_type(dt: &ast::DataType) -> Option<ColumnType> {
    use ast::DataType as D;
    Some(match dt {
        D::Text
        | D::Varchar(_)
        | D::CharacterVarying(_)
        | D::Char(_)
        | D::Character(_)
        | D::String(_) => ColumnType::Text,
        D::Int(_)
        | D::Integer(_)
        | D::BigInt(_)
        | D::SmallInt(_)
        | D::Int2(_)
        | D::Int4(_)
        | D::Int8(_) => ColumnType::Integer,
        D::Numeric(_) | D::Decimal(_) | D::Dec(_) => ColumnType::Numeric,
        D::Real | D::Float4 | D::Float8 | D::Double(_) | D::DoublePrecision | D::Float(_) => {
            ColumnType::Float
        }
        D::Date => ColumnType::Date,
        D::Timestamp(_, _) => ColumnType::Timestamp,
        D::Boolean | D::Bool => ColumnType::Boolean,
        _ => return None,
    })
}

/// Refuses (22023, before any charge) a string literal that the upstream would read as a value of
/// type `ty` (a date, timestamp, integer, numeric or boolean) and reject: the error would come
/// after the charge.
pub(super) fn check_literal_of_type(expr: &Expr, ty: Option<ColumnType>) -> Result<()> {
    let Some(ty) = ty else {
        return Ok(());
    };
    match expr {
        Expr::Nested(inner) => check_literal_of_type(inner, Some(ty)),
        Expr::Value(v) => match crate::literal::string_value(&v.value) {
            Some(text) => check_text_of_type(text, ty),
            None => Ok(()),
        },
        _ => Ok(()),
    }
}

/// Whether `text` is a value of `ty` the upstream accepts (for a date `YYYY-MM-DD`, for a
/// timestamp a date, then digits, spaces, `:.T+-`); 22023 otherwise.
pub(super) fn check_text_of_type(text: &str, ty: ColumnType) -> Result<()> {
    if let Some(what) = match ty {
        ColumnType::Integer => Some("integer"),
        ColumnType::Numeric => Some("numeric"),
        ColumnType::Boolean => Some("boolean"),
        _ => None,
    } {
        return check_scalar_text(text, ty, what);
    }
    let valid = match ty {
        // PostgreSQL's date input reads a timestamp's date ('2024-01-01 00:00:00', how drivers
        // write a JavaScript or Python datetime) and drops its time.
        ColumnType::Date => {
            crate::datetime::Date::parse(text).is_some() || crate::datetime::is_timestamp_text(text)
        }
        ColumnType::Timestamp => crate::datetime::is_timestamp_text(text),
        _ => true,
    };
    if valid {
        Ok(())
    } else {
        Err(Error::InvalidParameter {
            name: format!("the {} literal '{text}'", if ty == ColumnType::Date { "date" } else { "timestamp" }),
            reason: "is not a valid value".into(),
            hint: "Write dates as 'YYYY-MM-DD' (e.g. DATE '2024-06-01') and timestamps as 'YYYY-MM-DD HH:MM:SS'.".into(),
        })
    }
}

/// A string literal read as an integer, numeric or boolean (compared with such a column, in an
/// IN list or BETWEEN, or cast): PostgreSQL reads it with the type's input function and fails
/// on text it cannot read, which would happen upstream, after the charge. 22023 here instead.
fn check_scalar_text(text: &str, ty: ColumnType, what: &str) -> Result<()> {
    let t = text.trim();
    let valid = match ty {
        ColumnType::Integer => {
            let digits = t.strip_prefix(['+', '-']).unwrap_or(t);
            !digits.is_empty()
                && digits.bytes().all(|b| b.is_ascii_digit())
                && t.parse::<i64>().is_ok()
        }
        ColumnType::Numeric => {
            let lower = t.to_ascii_lowercase();
            let digits = lower.strip_prefix(['+', '-']).unwrap_or(&lower);
            matches!(digits, "nan" | "infinity" | "inf")
                || (digits
                    .bytes()
                    .all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'e' | b'+' | b'-'))
                    && digits
                        .bytes()
                        .next()
                        .is_some_and(|b| b.is_ascii_digit() || b == b'.')
                    && t.parse::<f64>().is_ok())
        }
        _ => matches!(
            t.to_ascii_lowercase().as_str(),
            "t" | "true" | "y" | "yes" | "on" | "1" | "f" | "false" | "n" | "no" | "off" | "0"
        ),
    };
    if valid {
        Ok(())
    } else {
        Err(Error::InvalidParameter {
            name: format!(
                "the {what} literal '{}'",
                text.chars().take(64).collect::<String>()
            ),
            reason: format!("is not a valid {what}"),
            hint: format!("Compare a {what} column with a {what} value."),
        })
    }
}

/// The first date or timestamp at which `date_trunc(unit, …)` stays inside PostgreSQL's
/// timestamp range (which starts at 4714-11-24 BC): the start of the first period of `unit`
/// that begins inside it. Earlier values truncate to a period start before the range, and
/// PostgreSQL fails with "timestamp out of range". Compared with the argument, the literal is
/// read in the session's time zone, as the truncation is. Below a week, and for a week, the first
/// days are given up as well: in a time zone east of UTC their local midnight or Monday lies
/// before the range.
fn datetime_lower_safe(unit: &str) -> &'static str {
    match unit {
        "millennium" => "4000-01-01 BC",
        "century" => "4700-01-01 BC",
        "decade" => "4711-01-01 BC",
        "year" | "quarter" => "4713-01-01 BC",
        "month" | "week" => "4714-12-01 BC",
        // Finer units, and date_part's fields (which only convert a date to a timestamp).
        _ => "4714-11-25 BC",
    }
}

/// Values after this fail: a date after it has no timestamp ("date out of range for
/// timestamp"), which date_trunc and date_part of a date convert to first. Timestamps on the
/// last day are given up too: in a time zone east of UTC their local time lies past the range.
const DATETIME_UPPER_SAFE: &str = "294276-12-31";

/// `CASE WHEN x > upper THEN 'infinity' WHEN x < lower THEN '-infinity' ELSE x END`: the date
/// or timestamp argument of `date_trunc(unit, x)` or `date_part(field, x)` made total.
///
/// PostgreSQL fails on finite values near the ends of its ranges (a date after 294276 AD has no
/// timestamp; the decade of 4712 BC starts before the first timestamp), and such an error would
/// tell the analyst that some row holds such a value. PostgreSQL's own answer for values beyond
/// every bound is ±infinity (`date_trunc('month', 'infinity'::date)` is `infinity`), so values
/// where it would fail are truncated as ±infinity instead. Every other value is answered as
/// PostgreSQL answers it, ±infinity and NULL included, except within the first week and the
/// last day of the timestamp range (see [`datetime_lower_safe`], [`DATETIME_UPPER_SAFE`]).
/// The untyped literals take the argument's type (date, timestamp or timestamptz), so the
/// function resolves exactly as before.
pub(super) fn datetime_range_guard(unit: &str, x: Expr) -> Expr {
    datetime_guard(x, datetime_lower_safe(unit), DATETIME_UPPER_SAFE)
}

/// `CASE WHEN x > upper THEN 'infinity' WHEN x < lower THEN '-infinity' ELSE x END`.
fn datetime_guard(x: Expr, lower: &str, upper: &str) -> Expr {
    let text = |s: &str| Expr::value(Value::SingleQuotedString(s.to_string()));
    let compare = |op: ast::BinaryOperator, bound: &str| Expr::BinaryOp {
        left: Box::new(Expr::Nested(Box::new(x.clone()))),
        op,
        right: Box::new(text(bound)),
    };
    Expr::Case {
        case_token: ast::helpers::attached_token::AttachedToken::empty(),
        end_token: ast::helpers::attached_token::AttachedToken::empty(),
        operand: None,
        conditions: vec![
            ast::CaseWhen {
                condition: compare(ast::BinaryOperator::Gt, upper),
                result: text("infinity"),
            },
            ast::CaseWhen {
                condition: compare(ast::BinaryOperator::Lt, lower),
                result: text("-infinity"),
            },
        ],
        else_result: Some(Box::new(Expr::Nested(Box::new(x)))),
    }
}

/// Functions pgdp's guards emit (`pg_catalog`-qualified) that analysts do not call themselves.
pub const GUARD_FUNCTIONS: [&str; 2] = ["isfinite", "div"];

/// `a / b` of two integers as PostgreSQL computes it, the quotient truncated toward zero
/// (7 / 2 = 3, -7 / 2 = -3), over `a` and `b` already cast to numeric (no overflow error that
/// depends on the data) and `b` guarded by NULLIF: `div` of numerics is that quotient, exact.
pub(super) fn integer_division(a: Expr, b: Expr) -> Expr {
    Expr::Function(function_call("pg_catalog.div", vec![a, b]))
}

/// `a - b` of two dates made total: PostgreSQL answers the number of days (an integer; the
/// widest difference, 2147483455, fits) except when either date is ±infinity, where it fails
/// ("cannot subtract infinite dates"), an error that would reveal the data. The guard answers
/// NULL there, and exactly PostgreSQL's difference everywhere else.
pub(super) fn date_difference_guard(a: Expr, b: Expr) -> Expr {
    let finite = |x: &Expr| Expr::Function(function_call("pg_catalog.isfinite", vec![x.clone()]));
    Expr::Case {
        case_token: ast::helpers::attached_token::AttachedToken::empty(),
        end_token: ast::helpers::attached_token::AttachedToken::empty(),
        operand: None,
        conditions: vec![ast::CaseWhen {
            condition: Expr::BinaryOp {
                left: Box::new(finite(&a)),
                op: ast::BinaryOperator::And,
                right: Box::new(finite(&b)),
            },
            result: Expr::BinaryOp {
                left: Box::new(Expr::Nested(Box::new(a))),
                op: ast::BinaryOperator::Minus,
                right: Box::new(Expr::Nested(Box::new(b))),
            },
        }],
        else_result: None,
    }
}

/// `to_char(x, format)` is total for a date or timestamp `x` (guarded at the ends of the range
/// like date_trunc's argument: a date after 294276 AD fails to convert; ±infinity gives NULL)
/// and a literal format of template patterns and plain separators: its length bounds the work,
/// and quoted text or backslashes, which could hide anything, are refused.
pub(super) fn check_to_char(x: &Info, format: &Expr) -> Result<()> {
    if !matches!(x.ty, Some(ColumnType::Date | ColumnType::Timestamp)) {
        return Err(Error::unsupported(
            "to_char of anything but a date or timestamp",
            "Format numbers in the outer query over the released values, e.g. SELECT to_char(n, '999,999') FROM (SELECT COUNT(*) AS n FROM demo.visits) t.",
        ));
    }
    let text = match format {
        Expr::Value(v) => crate::literal::string_value(&v.value),
        _ => None,
    };
    let plain = text.is_some_and(|t| {
        !t.is_empty()
            && t.len() <= 64
            && t.chars()
                .all(|c| c.is_ascii_alphanumeric() || " -/:.,_".contains(c))
    });
    if plain {
        Ok(())
    } else {
        Err(Error::unsupported(
            "this to_char format",
            "Use a literal format of at most 64 template patterns and separators (letters, digits, space and - / : . , _), e.g. to_char(visit_date, 'YYYY-MM').",
        ))
    }
}

/// The longest `date_bin` stride pgdp accepts, in seconds: 100 years of days. With the source
/// within [`DATE_BIN_SOURCE`] and the origin in the years 1 to 9999, a bin's start then stays
/// inside the timestamp range and `source - origin` inside an interval's microseconds.
const DATE_BIN_STRIDE_MAX_S: u64 = 36_500 * 86_400;

/// The sources `date_bin` bins as PostgreSQL does; earlier and later ones bin as ±infinity.
/// PostgreSQL fails past them for some origins ("interval out of range" when `source - origin`
/// overflows, "timestamp out of range" when a bin starts before the range).
pub(super) const DATE_BIN_SOURCE: (&str, &str) = ("4000-01-01 BC", "200000-01-01");

/// `date_bin(stride, source, origin)`'s stride as the text pgdp sends (`'<n> seconds'`, untyped:
/// both `date_bin`s take an interval there), from a literal `'<n> <unit>'` or `INTERVAL '…'`
/// of weeks, days, hours, minutes or seconds. PostgreSQL refuses months and years in a stride,
/// and a stride of zero; pgdp also refuses strides over 100 years.
pub(super) fn date_bin_stride(e: &Expr) -> Result<Expr> {
    let text = match e {
        Expr::Value(v) => crate::literal::string_value(&v.value).map(str::to_string),
        Expr::Interval(i)
            if i.leading_field.is_none()
                && i.last_field.is_none()
                && i.leading_precision.is_none()
                && i.fractional_seconds_precision.is_none() =>
        {
            match i.value.as_ref() {
                Expr::Value(v) => crate::literal::string_value(&v.value).map(str::to_string),
                _ => None,
            }
        }
        _ => None,
    };
    let seconds = text.as_deref().and_then(|t| {
        let mut words = t.split_whitespace();
        let (n, unit) = (words.next()?, words.next()?);
        if words.next().is_some() {
            return None;
        }
        let n: u64 = n.parse().ok()?;
        let per: u64 = match unit.to_ascii_lowercase().as_str() {
            "week" | "weeks" => 7 * 86_400,
            "day" | "days" => 86_400,
            "hour" | "hours" => 3_600,
            "minute" | "minutes" | "min" | "mins" => 60,
            "second" | "seconds" | "sec" | "secs" => 1,
            _ => return None,
        };
        n.checked_mul(per)
            .filter(|s| (1..=DATE_BIN_STRIDE_MAX_S).contains(s))
    });
    match seconds {
        Some(s) => Ok(Expr::value(Value::SingleQuotedString(format!("{s} seconds")))),
        None => Err(Error::unsupported(
            "this date_bin stride",
            "Use a literal stride of whole weeks, days, hours, minutes or seconds, at most 100 years, e.g. date_bin('7 days', visit_date, DATE '2024-01-01'); for months use date_trunc('month', …).",
        )),
    }
}

/// `date_bin`'s origin must be a literal date or timestamp in the years 1 to 9999 (see
/// [`DATE_BIN_STRIDE_MAX_S`]); it is sent as written, so the function resolves as PostgreSQL
/// resolves the analyst's call.
pub(super) fn check_date_bin_origin(e: &Expr) -> Result<()> {
    let text = match e {
        Expr::Value(v) => crate::literal::string_value(&v.value),
        Expr::TypedString(ts) => crate::literal::string_value(&ts.value.value),
        _ => None,
    };
    let plain = text.is_some_and(|t| {
        let t = t.trim();
        let date = t.get(..10).and_then(crate::datetime::Date::parse);
        date.is_some() && (t.len() == 10 || crate::datetime::is_timestamp_text(t))
    });
    if plain {
        Ok(())
    } else {
        Err(Error::unsupported(
            "this date_bin origin",
            "Use a literal date or timestamp in the years 1 to 9999 as the origin, e.g. DATE '2024-01-01'.",
        ))
    }
}

/// The source of `date_bin` made total: see [`DATE_BIN_SOURCE`].
pub(super) fn date_bin_guard(x: Expr) -> Expr {
    datetime_guard(x, DATE_BIN_SOURCE.0, DATE_BIN_SOURCE.1)
}

/// The date `x` of `CAST(x AS timestamp)` made total: dates after 294276 AD have no timestamp
/// ("date out of range for timestamp") and are sent as 'infinity'; every other date, and
/// ±infinity, converts as before (the first date is also the first timestamp).
pub(super) fn date_to_timestamp_guard(x: Expr) -> Expr {
    datetime_guard(x, "4714-11-24 BC", DATETIME_UPPER_SAFE)
}

/// The refusal of `bool_or(c)`, `bool_and(c)` and `every(c)` where no noisy count answers them:
/// in a subquery (a per-person value), WHERE or GROUP BY (those of the select list, HAVING and
/// ORDER BY were rewritten into detected counts before, existence.rs). The hint shows the
/// per-person value that asks the same question, which a per-person subquery can aggregate:
/// `bool_or(c)` is `LEAST(COUNT(CASE WHEN c THEN 1 END), 1)` (1 where some row meets `c`, 0
/// where none does), `bool_and(c)` and `every(c)` are `1 - LEAST(COUNT(CASE WHEN NOT (c) THEN 1
/// END), 1)`, with the analyst's own condition. `None` without such a call.
pub(super) fn boolean_aggregate_refusal(query: &ast::Query) -> Option<Error> {
    // (name as written, its condition, whether it asks "any")
    let mut calls: Vec<(String, String, bool)> = Vec::new();
    let _ = ast::visit_expressions(query, |e| {
        if let Some(call) = boolean_aggregate(e) {
            calls.push(call);
        }
        std::ops::ControlFlow::<()>::Continue(())
    });
    let (name, condition, any) = calls.first()?.clone();
    let value = if any {
        format!("LEAST(COUNT(CASE WHEN {condition} THEN 1 END), 1)")
    } else {
        format!("1 - LEAST(COUNT(CASE WHEN NOT ({condition}) THEN 1 END), 1)")
    };
    let hint = format!(
        "bool_or, bool_and and every are answered from noisy counts in the select list, HAVING and ORDER BY of the query itself; per person, {name}({condition}) is {value}"
    );
    // Literals as the analyst wrote them (classification dollar-quotes them).
    let hint = crate::literal::for_display(&hint);
    Some(Error::forbidden(
        format!(
            "{name} here: whether {} row satisfies the condition can hinge on one person, and only the query's own select list, HAVING and ORDER BY answer it from noisy counts",
            if any { "any" } else { "every" }
        ),
        hint,
    ))
}

/// `bool_or(c)`, `bool_and(c)` or `every(c)` as a plain call: its name as written, `c`, and
/// whether it asks for any row (`bool_or`).
fn boolean_aggregate(e: &Expr) -> Option<(String, String, bool)> {
    let Expr::Function(f) = e else { return None };
    let name = function_name(&f.name).ok()?;
    let any = match name.as_str() {
        "bool_or" => true,
        "bool_and" | "every" => false,
        _ => return None,
    };
    let condition = match &f.args {
        FunctionArguments::List(list) => match list.args.as_slice() {
            [FunctionArg::Unnamed(FunctionArgExpr::Expr(c))] => c.to_string(),
            _ => "c".to_string(),
        },
        _ => "c".to_string(),
    };
    Some((f.name.to_string(), condition, any))
}
