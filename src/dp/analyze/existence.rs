//! Questions of existence — `bool_or(c)`, `bool_and(c)`, `every(c)` and
//! `SELECT EXISTS (SELECT … FROM … WHERE …)` — answered from noisy counts of the same rows.
//!
//! Whether any row satisfies a condition can hinge on one person; a count of those rows only
//! moves by what one person contributes, which its noise covers. So each question is a test
//! on noisy counts: a count is *detected* where its noisy value exceeds the 95 % bound of its
//! noise ([`AggregateKind::Detected`]), and
//! - `bool_or(c)` is true where the count of rows with `c` true is detected, else false where
//!   the count of rows with `c` not NULL is detected, else NULL (PostgreSQL's NULL: no row
//!   with a non-NULL `c`);
//! - `bool_and(c)` and `every(c)` are false where the count of rows with `c` false is
//!   detected, else true where the count of rows with `c` not NULL is, else NULL;
//! - `SELECT EXISTS (SELECT … FROM … WHERE …)` is whether the count of the subquery's rows is
//!   detected (never NULL, as in PostgreSQL); `NOT EXISTS` its negation.
//!
//! # Invariants
//! - A call is replaced, before the statement is analysed again, by a CASE over
//!   `__dp_detected(COUNT(…))` of the call's own rows (its FILTER included); the counts are
//!   ordinary aggregates, each released through its mechanism and charged as a count, and the
//!   test compares the noisy count with a bound that depends only on the mechanism (public):
//!   post-processing, free.
//! - Where no row satisfies the condition, a count is detected with probability at most
//!   2.5 % (one side of the 95 % bound); a condition met by fewer rows than about the bound
//!   reads as not detected. The answer's NOTICE states both, with the bound.
//! - The analyst cannot call `__dp_detected` (the reserved prefix is refused); only this
//!   rewrite writes it.
//! - The answer is `boolean`, named as PostgreSQL names it (`bool_or`, `exists`, `?column?`
//!   for `NOT EXISTS`).
//! - A call inside a subquery or WHERE is not rewritten and stays refused with its hint.

use super::*;
use crate::output::CellType;

/// The function this rewrite writes for a detected count; an aggregate of kind
/// [`AggregateKind::Detected`] to the analysis.
pub(super) const DETECTED_FUNCTION: &str = "__dp_detected";

/// `bool_or` (any) or `bool_and` / `every` (all).
fn existence_call(f: &ast::Function) -> Option<bool> {
    match function_name(&f.name).ok()?.as_str() {
        "bool_or" => Some(true),
        "bool_and" | "every" => Some(false),
        _ => None,
    }
}

fn parse(text: &str) -> Result<Expr> {
    parse_own_expr(text, "a question of existence as counts")
}

/// `query` with its questions of existence as tests on noisy counts (module docs), or `None`
/// when it asks none in its select list, HAVING or ORDER BY and is no `SELECT EXISTS (…)`.
pub(super) fn as_counts(query: &ast::Query) -> Result<Option<ast::Query>> {
    if let Some(rewritten) = exists_as_count(query)? {
        return Ok(Some(rewritten));
    }
    let mut found = false;
    let rewritten = moments::rewrite_calls_with(query, |f| {
        let Some(any) = existence_call(f) else {
            return Ok(None);
        };
        found = true;
        call_as_counts(f, any).map(Some)
    })?;
    Ok(found.then_some(rewritten))
}

/// One call of `bool_or` (`any`) or `bool_and` / `every` as a CASE over detected counts.
fn call_as_counts(f: &ast::Function, any: bool) -> Result<Expr> {
    let name = function_name(&f.name)?;
    if f.over.is_some() {
        return Err(window_refusal());
    }
    let FunctionArguments::List(list) = &f.args else {
        return Err(Error::Syntax {
            message: format!("{name} needs an argument"),
        });
    };
    if !list.clauses.is_empty() || !f.within_group.is_empty() || f.null_treatment.is_some() {
        return Err(Error::unsupported(
            format!("ORDER BY / WITHIN GROUP / IGNORE NULLS on {name}"),
            format!("Call {name}(condition) as a plain aggregate."),
        ));
    }
    let [FunctionArg::Unnamed(FunctionArgExpr::Expr(c))] = list.args.as_slice() else {
        return Err(Error::Syntax {
            message: format!("function {name} takes one boolean argument"),
        });
    };
    // DISTINCT changes nothing: whether any (every) value is true.
    let filter = f
        .filter
        .as_ref()
        .map(|w| format!(" AND ({w})"))
        .unwrap_or_default();
    let non_null = match &f.filter {
        Some(w) => format!("COUNT(({c})) FILTER (WHERE {w})"),
        None => format!("COUNT(({c}))"),
    };
    let (witness, verdict) = if any {
        (format!("COUNT(*) FILTER (WHERE ({c}){filter})"), "true")
    } else {
        (
            format!("COUNT(*) FILTER (WHERE NOT ({c}){filter})"),
            "false",
        )
    };
    let otherwise = if any { "false" } else { "true" };
    parse(&format!(
        "CASE WHEN {DETECTED_FUNCTION}({witness}) THEN {verdict} WHEN {DETECTED_FUNCTION}({non_null}) THEN {otherwise} END"
    ))
}

/// `SELECT [NOT] EXISTS (SELECT … FROM … WHERE … [LIMIT n ≥ 1]) [AS name]` as
/// `SELECT [NOT] __dp_detected(COUNT(*)) AS name FROM … WHERE …`; `None` for any other shape.
fn exists_as_count(query: &ast::Query) -> Result<Option<ast::Query>> {
    let SetExpr::Select(outer) = query.body.as_ref() else {
        return Ok(None);
    };
    if !outer.from.is_empty()
        || outer.selection.is_some()
        || outer.having.is_some()
        || query.with.is_some()
        || query.order_by.is_some()
        || query.limit_clause.is_some()
    {
        return Ok(None);
    }
    let [item] = outer.projection.as_slice() else {
        return Ok(None);
    };
    let (e, alias) = match item {
        SelectItem::UnnamedExpr(e) => (e, None),
        SelectItem::ExprWithAlias { expr, alias } => (expr, Some(alias.clone())),
        _ => return Ok(None),
    };
    let Expr::Exists { subquery, negated } = e else {
        return Ok(None);
    };
    let SetExpr::Select(inner) = subquery.body.as_ref() else {
        return Ok(None);
    };
    let plain = !inner.from.is_empty()
        && inner.having.is_none()
        && inner.distinct.is_none()
        && matches!(&inner.group_by, GroupByExpr::Expressions(e, m) if e.is_empty() && m.is_empty())
        && subquery.fetch.is_none();
    if !plain || !at_least_one_row(subquery) {
        return Ok(None);
    }
    let count = parse(&format!(
        "{}{DETECTED_FUNCTION}(COUNT(*))",
        if *negated { "NOT " } else { "" }
    ))?;
    // PostgreSQL names `EXISTS (…)` "exists" and `NOT EXISTS (…)` "?column?".
    let name = alias
        .unwrap_or_else(|| Ident::with_quote('"', if *negated { "?column?" } else { "exists" }));
    let mut rewritten = subquery.as_ref().clone();
    rewritten.order_by = None;
    rewritten.limit_clause = None;
    if let SetExpr::Select(s) = rewritten.body.as_mut() {
        s.projection = vec![SelectItem::ExprWithAlias {
            expr: count,
            alias: name,
        }];
    }
    Ok(Some(rewritten))
}

/// Whether the subquery's LIMIT / OFFSET leave its rows' existence as it is: none, or a LIMIT
/// of at least 1 (or ALL) without OFFSET (`EXISTS (SELECT 1 … LIMIT 1)`).
fn at_least_one_row(subquery: &ast::Query) -> bool {
    matches!(super::limit_offset(subquery), Ok((limit, 0)) if limit.is_none_or(|n| n >= 1))
}

/// The expression the shadow catalog types in place of a detected count: `(count > 0)`, a
/// `boolean` like the released value ([`Analyzer::detected_aggregate`]).
pub(super) fn for_typing(e: &Expr) -> Expr {
    let mut typed = e.clone();
    let _ = ast::visit_expressions_mut(&mut typed, |x| {
        if let Expr::Function(f) = x {
            let detected = function_name(&f.name).is_ok_and(|n| n == DETECTED_FUNCTION);
            if let (true, [count]) = (detected, crate::dp::sql::expression_arguments(f).as_slice())
            {
                if let Ok(e) = parse(&format!("({count} > 0)")) {
                    *x = e;
                }
            }
        }
        std::ops::ControlFlow::<()>::Continue(())
    });
    typed
}

impl Analyzer<'_> {
    /// `__dp_detected(COUNT(…))`: whether the count (of rows, or of an argument's values) is
    /// detected above its noise, a `boolean` sharing the count's measure.
    pub(super) fn detected_aggregate(&mut self, f: &ast::Function) -> Result<Aggregate> {
        let arguments = crate::dp::sql::expression_arguments(f);
        let [count] = arguments.as_slice() else {
            return Err(Error::internal("a detected count without its count"));
        };
        let count = self
            .aggregate(count)?
            .ok_or_else(|| Error::internal("a detected count of no aggregate"))?;
        if !matches!(
            count.kind,
            AggregateKind::CountRows | AggregateKind::CountValues
        ) {
            return Err(Error::internal("a detected aggregate other than a count"));
        }
        Ok(Aggregate {
            kind: AggregateKind::Detected,
            argument: count.argument,
            bounds: None,
            upper_ceiling: None,
            text: format!("{DETECTED_FUNCTION}({})", count.text),
            result: CellType::Bool,
            integral: false,
        })
    }
}
