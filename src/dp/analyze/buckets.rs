//! Buckets of a column whose keys are a public list: `date_bin` with a literal stride and
//! origin, and `width_bucket` with literal bounds and count.

use super::*;

impl Analyzer<'_> {
    /// `date_bin(stride, source, origin)` with a literal stride and origin (checked in
    /// `date_bin_stride`, `check_date_bin_origin`) and its source guarded (`date_bin_guard`):
    /// PostgreSQL fails on some sources near the ends of the range, which would reveal them.
    pub(super) fn date_bin(&mut self, f: &mut ast::Function, role: Role) -> Result<Info> {
        let FunctionArguments::List(list) = &mut f.args else {
            return Err(Error::UnknownFunction {
                name: "date_bin".into(),
                hint: String::new(),
            });
        };
        let mut exprs = positional_arguments(
            list,
            "Call date_bin on plain arguments, by position: date_bin('7 days', visit_date, TIMESTAMP '2024-01-01').",
        )?;
        let [stride, source, origin] = exprs.as_mut_slice() else {
            return Err(Error::UnknownFunction {
                name: format!("date_bin with {} argument(s)", list.args.len()),
                hint: "date_bin takes a stride, a date or timestamp and an origin.".into(),
            });
        };
        **stride = date_bin_stride(stride)?;
        check_date_bin_origin(origin)?;
        let info = self.expr(source, role)?;
        if !matches!(info.ty, Some(ColumnType::Date | ColumnType::Timestamp)) {
            return Err(Error::unsupported(
                "date_bin of anything but a date or timestamp",
                "Bin a date or timestamp column, e.g. date_bin('7 days', visit_date, DATE '2024-01-01').",
            ));
        }
        if !info.constant {
            **source = date_bin_guard(source.clone());
        }
        f.name = ObjectName::from(vec![Ident::new("pg_catalog"), Ident::new("date_bin")]);
        Ok(Info::derived(Some(ColumnType::Timestamp), &[&info], None))
    }

    /// `width_bucket(x, lo, hi, n)` of a number `x` with literal bounds `lo ≠ hi` and a literal
    /// count `1 ≤ n ≤ WIDTH_BUCKETS_MAX`: PostgreSQL's `integer` bucket, whatever `x` is one of
    /// `0 … n + 1` (0 below the range, `n + 1` above it), so those `n + 2` values are a public
    /// domain of keys, as a CASE of literals. A NULL `x` gives NULL, which is not in the domain
    /// (that group is not released: pgdp does not know whether the column holds NULLs). The
    /// arguments PostgreSQL rejects (a count ≤ 0, equal or infinite bounds) are literals,
    /// refused before anything runs; the one failure the data could cause, a NaN `x`, is sent to
    /// NULL first (`CASE WHEN x = 'NaN' THEN NULL ELSE x END`), so no error depends on a row.
    pub(super) fn width_bucket(&mut self, f: &mut ast::Function, role: Role) -> Result<Info> {
        let FunctionArguments::List(list) = &mut f.args else {
            return Err(Error::unsupported(
                "width_bucket without arguments",
                WIDTH_BUCKET_HINT,
            ));
        };
        let mut exprs = positional_arguments(list, WIDTH_BUCKET_HINT)?;
        // width_bucket(x, array) (thresholds in an array) is not this form.
        let [x, lo, hi, n] = exprs.as_mut_slice() else {
            return Err(Error::UnknownFunction {
                name: format!("width_bucket with {} argument(s)", list.args.len()),
                hint: WIDTH_BUCKET_HINT.into(),
            });
        };
        let (Some((_, low)), Some((_, high)), Some((count_text, count))) =
            (number_literal(lo), number_literal(hi), number_literal(n))
        else {
            return Err(Error::unsupported(
                "width_bucket with bounds or a count that are not number literals",
                WIDTH_BUCKET_HINT,
            ));
        };
        let bound_max = limits::COLUMN_BOUND_ABS_MAX;
        if !low.is_finite() || !high.is_finite() || low.abs() > bound_max || high.abs() > bound_max
        {
            return Err(Error::InvalidParameter {
                name: "the bounds of width_bucket".into(),
                reason: format!("must be finite and within ±{bound_max}"),
                hint: WIDTH_BUCKET_HINT.into(),
            });
        }
        if low == high {
            return Err(Error::InvalidParameter {
                name: "the bounds of width_bucket".into(),
                reason: "are equal (PostgreSQL: lower bound cannot equal upper bound)".into(),
                hint: WIDTH_BUCKET_HINT.into(),
            });
        }
        let count = match count_text.parse::<i64>() {
            Ok(c) if (1..=limits::WIDTH_BUCKETS_MAX).contains(&c) && count.fract() == 0.0 => c,
            _ => {
                return Err(Error::InvalidParameter {
                    name: "the count of width_bucket".into(),
                    reason: format!(
                        "is not an integer literal from 1 to {}",
                        limits::WIDTH_BUCKETS_MAX
                    ),
                    hint: WIDTH_BUCKET_HINT.into(),
                })
            }
        };
        let info = self.expr(x, role)?;
        let guard = match info.ty {
            Some(ColumnType::Integer) => false,
            Some(ColumnType::Numeric | ColumnType::Float) => !info.constant,
            _ => {
                return Err(Error::unsupported(
                    "width_bucket of anything but a number",
                    WIDTH_BUCKET_HINT,
                ))
            }
        };
        if guard {
            let text = format!("CASE WHEN ({x}) = 'NaN' THEN NULL ELSE ({x}) END");
            let dialect = sqlparser::dialect::PostgreSqlDialect {};
            **x = sqlparser::parser::Parser::new(&dialect)
                .try_with_sql(&text)
                .and_then(|mut p| p.parse_expr())
                .map_err(|e| Error::internal(format!("width_bucket guard does not parse: {e}")))?;
        }
        f.name = ObjectName::from(vec![Ident::new("pg_catalog"), Ident::new("width_bucket")]);
        let mut out = Info::derived(
            Some(ColumnType::Integer),
            &[&info],
            Some((0.0, (count + 1) as f64)),
        );
        out.public = PublicKeys::Listed {
            values: (0..=count + 1).map(|v| Some(v.to_string())).collect(),
            exhaustive: false,
        };
        // A public domain: as safe as a CASE of literals, except on the privacy unit.
        out.groupable = !out.uses_unit;
        Ok(out)
    }
}

/// The hint of a refused `width_bucket`.
const WIDTH_BUCKET_HINT: &str = "Write the bounds and the number of buckets as literals, e.g. width_bucket(cost, 0, 2000, 10): its buckets 0 … 11 are then a public list of keys.";

/// A number literal, possibly negated, as written and as a value.
fn number_literal(e: &Expr) -> Option<(String, f64)> {
    match e {
        Expr::Nested(inner) => number_literal(inner),
        Expr::UnaryOp {
            op: UnaryOperator::Minus,
            expr,
        } => number_literal(expr).map(|(t, v)| (format!("-{t}"), -v)),
        Expr::Value(v) => match &v.value {
            Value::Number(n, _) => n.parse::<f64>().ok().map(|f| (n.clone(), f)),
            _ => None,
        },
        _ => None,
    }
}

/// The arguments of a call of a function that takes plain arguments by position; `hint` says
/// how to call it when it has DISTINCT, ORDER BY or another clause, or a named or wildcard
/// argument.
fn positional_arguments<'l>(
    list: &'l mut ast::FunctionArgumentList,
    hint: &str,
) -> Result<Vec<&'l mut Expr>> {
    if list.duplicate_treatment.is_some() || !list.clauses.is_empty() {
        return Err(Error::unsupported(
            "DISTINCT or clauses in function arguments",
            hint,
        ));
    }
    list.args
        .iter_mut()
        .map(|a| match a {
            FunctionArg::Unnamed(FunctionArgExpr::Expr(e)) => Ok(e),
            _ => Err(Error::unsupported(
                "named or wildcard function arguments",
                hint,
            )),
        })
        .collect()
}
