//! Group keys over whole-number date fields: `CAST(EXTRACT(month FROM d) AS integer)` and integer
//! arithmetic over such a field, grouped upstream by the `EXTRACT` itself (which cannot fail)
//! when the arithmetic is one-to-one over the field's values, the cast applied to the released
//! keys afterwards.
//!
//! Invariant: the rewrite groups by an expression that makes exactly the groups the analyst's
//! key makes ([`integer_cast_of_whole_field`] checks the arithmetic is one-to-one), so no two
//! of the analyst's groups are merged or split.

use super::*;

/// The date field of `EXTRACT(field FROM …)` or `date_part('field', …)`, lower case; `None` for
/// any other expression.
fn extracted_field(e: &Expr) -> Option<String> {
    match e {
        Expr::Nested(inner) => extracted_field(inner),
        Expr::Extract { field, .. } => Some(field.to_string().to_ascii_lowercase()),
        Expr::Function(f) if function_name(&f.name).is_ok_and(|n| n == "date_part") => {
            let FunctionArguments::List(list) = &f.args else {
                return None;
            };
            match list.args.first() {
                Some(FunctionArg::Unnamed(FunctionArgExpr::Expr(Expr::Value(v)))) => {
                    crate::literal::string_value(&v.value).map(|s| s.to_ascii_lowercase())
                }
                _ => None,
            }
        }
        _ => None,
    }
}

/// A group key `CAST(EXTRACT(field FROM d) AS integer)` (or `::int2`, `::int8`, `date_part`)
/// whose field is a whole number for every finite date and timestamp: the `EXTRACT` under the
/// cast, else `None`.
///
/// Grouping by that `EXTRACT` makes the same groups (an integer cast is one-to-one on whole
/// numbers), and unlike the cast it cannot fail (`EXTRACT` of an infinite date is `Infinity`,
/// which no integer holds). So pgdp groups by the `EXTRACT` upstream and applies the cast to
/// the released keys afterwards, on the shadow catalog: an error there (a released `Infinity`
/// key) depends on released values only, as PostgreSQL's own error would.
pub(super) fn integer_cast_of_whole_field(e: &Expr) -> Option<Expr> {
    let (extract, field) = whole_field_key(e)?;
    // The groups are the same only if the arithmetic is one-to-one over the field's values.
    let injective = match field_values(&field) {
        Some(values) => {
            let mut images: Vec<i64> = Vec::new();
            for x in values {
                images.push(evaluate_over_field(e, x)?);
            }
            images.sort_unstable();
            images.windows(2).all(|w| w[0] != w[1])
        }
        None => structurally_injective(e),
    };
    injective.then_some(extract)
}

/// Every value a whole-number field takes for finite dates and timestamps, for the fields with
/// a small fixed range; `None` for the others (year, isoyear, decade, century).
fn field_values(field: &str) -> Option<std::ops::RangeInclusive<i64>> {
    Some(match field {
        "month" => 1..=12,
        "quarter" => 1..=4,
        "week" => 1..=53,
        "day" => 1..=31,
        "dow" => 0..=6,
        "isodow" => 1..=7,
        "doy" => 1..=366,
        "hour" => 0..=23,
        "minute" => 0..=59,
        _ => return None,
    })
}

/// The value of a key written as integer arithmetic with literals around one
/// `CAST(EXTRACT(…) AS integer)`, for the field value `x`, as PostgreSQL computes it on
/// integers (division truncates, `%` takes the dividend's sign); `None` on division by zero or
/// overflow.
fn evaluate_over_field(e: &Expr, x: i64) -> Option<i64> {
    match e {
        Expr::Nested(inner) => evaluate_over_field(inner, x),
        Expr::Cast { .. } => Some(x),
        Expr::Value(v) => match &v.value {
            Value::Number(n, _) => n.parse().ok(),
            _ => None,
        },
        Expr::UnaryOp {
            op: ast::UnaryOperator::Minus,
            expr,
        } => evaluate_over_field(expr, x)?.checked_neg(),
        Expr::BinaryOp { left, op, right } => {
            let (l, r) = (
                evaluate_over_field(left, x)?,
                evaluate_over_field(right, x)?,
            );
            match op {
                ast::BinaryOperator::Plus => l.checked_add(r),
                ast::BinaryOperator::Minus => l.checked_sub(r),
                ast::BinaryOperator::Multiply => l.checked_mul(r),
                ast::BinaryOperator::Divide => l.checked_div(r),
                ast::BinaryOperator::Modulo => l.checked_rem(r),
                _ => None,
            }
        }
        _ => None,
    }
}

/// Whether integer arithmetic of the form [`whole_field_key`] accepts is one-to-one whatever
/// the field's value: only `+`, `-` and `*` by a non-zero literal.
fn structurally_injective(e: &Expr) -> bool {
    match e {
        Expr::Nested(inner) => structurally_injective(inner),
        Expr::Cast { .. } => true,
        Expr::UnaryOp {
            op: ast::UnaryOperator::Minus,
            expr,
        } => structurally_injective(expr),
        Expr::BinaryOp { left, op, right } => {
            let literal =
                |side: &Expr| evaluate_over_field(side, 0).filter(|_| is_integer_literal(side));
            let (value, other) = if is_integer_literal(left) {
                (literal(left), right.as_ref())
            } else {
                (literal(right), left.as_ref())
            };
            match op {
                ast::BinaryOperator::Plus | ast::BinaryOperator::Minus => {
                    value.is_some() && structurally_injective(other)
                }
                ast::BinaryOperator::Multiply => {
                    value.is_some_and(|v| v != 0) && structurally_injective(other)
                }
                _ => false,
            }
        }
        _ => false,
    }
}

fn is_integer_literal(e: &Expr) -> bool {
    match e {
        Expr::Nested(inner) => is_integer_literal(inner),
        Expr::Value(v) => matches!(&v.value, Value::Number(n, _) if n.parse::<i64>().is_ok()),
        _ => false,
    }
}

/// The `EXTRACT` (and its field) under a key written as integer arithmetic with integer
/// literals (`+ - * / %`, as Metabase adjusts the day of week:
/// `((CAST(extract(dow from d) AS integer) + 1 + 6) % 7) + 1`) around one integer cast of a
/// whole-number field; `None` for anything else.
fn whole_field_key(e: &Expr) -> Option<(Expr, String)> {
    match e {
        Expr::Nested(inner) => whole_field_key(inner),
        Expr::Cast { expr, .. } => {
            let field = extracted_field(expr)?;
            integer_cast_of_whole_field_only(e).map(|x| (x, field))
        }
        Expr::UnaryOp {
            op: ast::UnaryOperator::Minus,
            expr,
        } => whole_field_key(expr),
        Expr::BinaryOp {
            left,
            op:
                ast::BinaryOperator::Plus
                | ast::BinaryOperator::Minus
                | ast::BinaryOperator::Multiply
                | ast::BinaryOperator::Divide
                | ast::BinaryOperator::Modulo,
            right,
        } => {
            if is_integer_literal(right) {
                whole_field_key(left)
            } else if is_integer_literal(left) {
                whole_field_key(right)
            } else {
                None
            }
        }
        _ => None,
    }
}

/// The `EXTRACT` under exactly `CAST(EXTRACT(field FROM d) AS integer)` (see
/// [`integer_cast_of_whole_field`]).
fn integer_cast_of_whole_field_only(e: &Expr) -> Option<Expr> {
    let Expr::Cast {
        expr,
        data_type,
        format: None,
        ..
    } = e
    else {
        return None;
    };
    use ast::DataType as D;
    let to_integer = matches!(
        data_type,
        D::Int(_)
            | D::Integer(_)
            | D::SmallInt(_)
            | D::BigInt(_)
            | D::Int2(_)
            | D::Int4(_)
            | D::Int8(_)
    );
    // Whole numbers for every finite date and timestamp (second, epoch and julian have
    // fractions for timestamps, milliseconds and microseconds too large a range to matter).
    let whole = extracted_field(expr).is_some_and(|f| {
        matches!(
            f.as_str(),
            "year"
                | "isoyear"
                | "month"
                | "quarter"
                | "week"
                | "day"
                | "dow"
                | "isodow"
                | "doy"
                | "hour"
                | "minute"
                | "decade"
                | "century"
        )
    });
    (to_integer && whole).then(|| match expr.as_ref() {
        Expr::Nested(inner) => inner.as_ref().clone(),
        other => other.clone(),
    })
}
