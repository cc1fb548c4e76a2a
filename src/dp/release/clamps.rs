//! How NOTICEs name the clamping of aggregate arguments into their bounds, a bias that neither
//! a chosen cap's estimate nor `_error95` counts.
//!
//! An argument is clamped into its derived bounds before it is summed. When every value the
//! argument takes comes from an explicit clamp `LEAST(GREATEST(e, l), u)` (written by the
//! analyst, or by pgdp for `corr` and `regr_*`: `analyze::moments`) and literals, that clamp
//! is the one that binds and the argument's own never does: the NOTICE then names the clamped
//! expressions (`people.income in [0, 250000]`) rather than the whole argument.
//!
//! Arguments that read only per-unit values of subqueries grouped by the privacy unit are not
//! named: their bounds are exact. Display only: nothing here changes what is computed or
//! charged.

use sqlparser::ast::{self, Expr, Value};

use crate::dp::plan::{AggregateKind, Canonical, Plan};
use crate::policy::Bounds;

use super::analyst_text;

/// How a NOTICE names an argument clamped into its bounds: `visits.cost in [0, 2000]`.
pub(super) fn clamp_label(plan: &Plan, argument: &Canonical, b: Bounds) -> String {
    format!(
        "{} in [{}, {}]",
        analyst_text(plan, argument.as_str()),
        b.lower,
        b.upper
    )
}

/// The arguments of the plan's sums, averages and variances with the bounds their values are
/// clamped into, as `cost in [0, 2000]`, each once (an explicitly clamped argument by its
/// clamps: see the module's doc).
pub fn clamped_arguments(plan: &Plan) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for a in &plan.aggregates {
        let clamped = matches!(
            a.kind,
            AggregateKind::Sum
                | AggregateKind::Avg
                | AggregateKind::VarSamp
                | AggregateKind::VarPop
                | AggregateKind::StddevSamp
                | AggregateKind::StddevPop
        );
        let (true, Some(arg), Some(b)) = (clamped, &a.argument, a.bounds) else {
            continue;
        };
        if exact_bounds(plan, arg) {
            continue;
        }
        let labels = match explicit_clamps(arg) {
            Some(clamps) => clamps
                .into_iter()
                .map(|(e, l, u)| format!("{} in [{l}, {u}]", analyst_text(plan, &e)))
                .collect(),
            None => vec![clamp_label(plan, arg, b)],
        };
        for text in labels {
            if !out.contains(&text) {
                out.push(text);
            }
        }
    }
    out
}

/// Whether `argument` reads only per-unit values of subqueries grouped by the privacy unit,
/// whose bounds the subquery's SQL states exactly (`LEAST(COUNT(*), 20)`, or the cap pgdp
/// writes there), so clamping into them never binds; a policy column's declared bounds are a
/// promise the data may break.
fn exact_bounds(plan: &Plan, argument: &Canonical) -> bool {
    let per_unit = |alias: &str| {
        plan.tables.iter().any(|t| {
            t.alias == alias
                && t.source.as_ref().is_some_and(|q| {
                    matches!(q.body.as_ref(), ast::SetExpr::Select(s)
                        if !matches!(&s.group_by, ast::GroupByExpr::Expressions(e, _) if e.is_empty()))
                })
        })
    };
    argument
        .aliases()
        .is_some_and(|aliases| !aliases.is_empty() && aliases.iter().all(|a| per_unit(a)))
}

/// The explicit clamps `(e, l, u)` of `argument` when every value it takes comes from one of
/// them or from literals (so clamping the argument into its derived bounds never binds);
/// `None` when it has none, or a column outside them, or a construct this does not read.
pub(super) fn explicit_clamps(argument: &Canonical) -> Option<Vec<(String, f64, f64)>> {
    let dialect = sqlparser::dialect::PostgreSqlDialect {};
    let e = sqlparser::parser::Parser::new(&dialect)
        .with_recursion_limit(crate::limits::PARSER_DEPTH_MAX)
        .try_with_sql(argument.as_str())
        .and_then(|mut p| p.parse_expr())
        .ok()?;
    let mut clamps = Vec::new();
    values_clamped(&e, &mut clamps)?;
    (!clamps.is_empty()).then_some(clamps)
}

/// Walks the positions of `e` whose values become its value, collecting explicit clamps;
/// `None` at a column reference (or an unread construct) outside one. CASE conditions and
/// `IS [NOT] NULL` tests decide which value is taken, never what it is, so they are skipped.
fn values_clamped(e: &Expr, clamps: &mut Vec<(String, f64, f64)>) -> Option<()> {
    match e {
        Expr::Value(_) => Some(()),
        Expr::Nested(x) | Expr::UnaryOp { expr: x, .. } | Expr::Cast { expr: x, .. } => {
            values_clamped(x, clamps)
        }
        Expr::BinaryOp { left, right, .. } => {
            values_clamped(left, clamps)?;
            values_clamped(right, clamps)
        }
        Expr::Case {
            conditions,
            else_result,
            ..
        } => {
            for w in conditions {
                values_clamped(&w.result, clamps)?;
            }
            match else_result {
                Some(x) => values_clamped(x, clamps),
                None => Some(()),
            }
        }
        Expr::Function(f) => {
            let clamp = clamp_of(f)?;
            if !clamps.contains(&clamp) {
                clamps.push(clamp);
            }
            Some(())
        }
        _ => None,
    }
}

/// `LEAST(GREATEST(e, l), u)` with literal bounds, as `(e, l, u)`.
fn clamp_of(f: &ast::Function) -> Option<(String, f64, f64)> {
    let (least, [inner, upper]) = call(f)?;
    let Expr::Function(g) = strip(inner) else {
        return None;
    };
    let (greatest, [e, lower]) = call(g)?;
    if !(least.eq_ignore_ascii_case("least") && greatest.eq_ignore_ascii_case("greatest")) {
        return None;
    }
    Some((strip(e).to_string(), number(lower)?, number(upper)?))
}

/// A function's name and its two positional arguments.
fn call(f: &ast::Function) -> Option<(String, [&Expr; 2])> {
    let args = crate::dp::sql::expression_arguments(f);
    let [a, b] = args.as_slice() else {
        return None;
    };
    Some((f.name.to_string(), [*a, *b]))
}

/// `e` without parentheses and casts around it.
fn strip(e: &Expr) -> &Expr {
    match e {
        Expr::Nested(x) | Expr::Cast { expr: x, .. } => strip(x),
        other => other,
    }
}

/// A numeric literal, possibly negated, parenthesised or cast.
fn number(e: &Expr) -> Option<f64> {
    match strip(e) {
        Expr::Value(v) => match &v.value {
            Value::Number(n, _) => n.parse().ok(),
            _ => None,
        },
        Expr::UnaryOp {
            op: ast::UnaryOperator::Minus,
            expr,
        } => number(expr).map(|x| -x),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canonical(sql: &str) -> Canonical {
        let dialect = sqlparser::dialect::PostgreSqlDialect {};
        let e = sqlparser::parser::Parser::new(&dialect)
            .try_with_sql(sql)
            .and_then(|mut p| p.parse_expr())
            .expect("parses");
        Canonical::of(&e)
    }

    #[test]
    fn only_arguments_whose_values_all_come_from_clamps_are_named_by_them() {
        let moment = canonical(
            "CASE WHEN (\"__dp_t0\".\"income\") IS NOT NULL AND (\"__dp_t0\".\"age\") IS NOT NULL THEN (LEAST(GREATEST((\"__dp_t0\".\"income\"), 0), 250000) - CAST((125000) AS NUMERIC)) * (CAST(LEAST(GREATEST((\"__dp_t0\".\"age\"), 0), 100) AS NUMERIC) - CAST((50) AS NUMERIC)) END",
        );
        assert_eq!(
            explicit_clamps(&moment),
            Some(vec![
                ("\"__dp_t0\".\"income\"".to_string(), 0.0, 250000.0),
                ("\"__dp_t0\".\"age\"".to_string(), 0.0, 100.0),
            ])
        );
        let negative = canonical("LEAST(GREATEST(x, -5), (-1)) * 2");
        assert_eq!(
            explicit_clamps(&negative),
            Some(vec![("x".to_string(), -5.0, -1.0)])
        );
        // A column outside every clamp is clamped by the argument's own bounds.
        assert_eq!(
            explicit_clamps(&canonical("LEAST(GREATEST(x, 0), 5) + y")),
            None
        );
        assert_eq!(explicit_clamps(&canonical("cost")), None);
        assert_eq!(explicit_clamps(&canonical("LEAST(cost, 500)")), None);
        assert_eq!(explicit_clamps(&canonical("abs(x)")), None);
    }
}
