//! An outer query over an aggregate subquery, `SELECT … FROM (<aggregate query>) AS s …` (the
//! form Metabase wraps every question in, and what analysts write to filter or rank aggregates):
//! the inner query is the DP query, the outer one post-processing of its released rows.
//!
//! Invariants: as [`super::post`]'s. The outer query reads only the inner query's output
//! columns (released values), through the same checks as any post-processing; under
//! `pgdp.accuracy` an outer item that is an inner aggregate itself keeps that aggregate's
//! `_error95`, read from the inner query's released bounds (public).

use super::post::{quoted, OrderLimit, Place, Staging};
use super::*;

/// The outer query of `SELECT … FROM (<aggregate query>) AS s …` (how Metabase wraps every
/// question, and what analysts write to filter or rank aggregates): the inner query is the DP
/// query, and the outer one post-processing of its released rows. `None` when `query` is not of
/// that form: one derived table in FROM, no aggregate, GROUP BY or HAVING outside it.
pub(super) fn outer_query(query: &ast::Query, ctx: &Context) -> Option<Result<Plan>> {
    let SetExpr::Select(outer) = query.body.as_ref() else {
        return None;
    };
    let (subquery, alias) = one_derived_table(outer)?;
    let items_aggregate = outer.projection.iter().any(|item| match item {
        SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. } => {
            contains_aggregate(e)
        }
        _ => false,
    });
    let grouped =
        !matches!(&outer.group_by, GroupByExpr::Expressions(e, m) if e.is_empty() && m.is_empty());
    if items_aggregate || grouped || outer.having.is_some() {
        return None;
    }
    // Only an aggregate subquery (not one grouped by the privacy unit, which the main analysis
    // reads as a per-unit table).
    let SetExpr::Select(inner) = subquery.body.as_ref() else {
        return None;
    };
    let inner_aggregates = inner.projection.iter().any(|item| match item {
        SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. } => {
            contains_aggregate(e)
        }
        _ => false,
    });
    if !inner_aggregates {
        return None;
    }
    Some(outer_plan(query, outer, subquery, alias.as_ref(), ctx))
}

fn outer_plan(
    query: &ast::Query,
    outer: &ast::Select,
    subquery: &ast::Query,
    alias: Option<&ast::TableAlias>,
    ctx: &Context,
) -> Result<Plan> {
    let alias_name = outer_alias(query, outer, alias)?;
    // The outer WITH list belongs to the inner (DP) query.
    let mut inner_query = subquery.clone();
    if inner_query.with.is_none() {
        inner_query.with = query.with.clone();
    } else if query.with.is_some() {
        return Err(Error::unsupported(
            "WITH both outside and inside an aggregate subquery",
            "Put the CTEs in one WITH list.",
        ));
    }
    let mut plan = analyze_with(&inner_query, ctx, true)?;
    let post = plan
        .post
        .take()
        .ok_or_else(|| Error::internal("an aggregate subquery without post-processing"))?;
    let names: Vec<String> = plan.outputs.iter().map(|o| o.name.clone()).collect();

    let mut a = Analyzer::new(ctx, Vec::new());
    let mut st = Staging {
        keys: &[],
        sets: None,
        outer: Some((alias_name.as_str(), &names)),
        aggregates: Vec::new(),
        originals: Vec::new(),
    };
    let with_errors = outputs_with_errors(&plan, post.errors.is_some());
    let OuterItems {
        items,
        names: item_names,
        errors_of,
    } = a.outer_items(outer, &mut st, &alias_name, &with_errors)?;
    let from_alias = if alias_name.is_empty() {
        "\"__dp_subquery\"".to_string()
    } else {
        quoted(&alias_name)
    };
    let mut where_sql = String::new();
    if let Some(w) = &outer.selection {
        let mut w = w.clone();
        a.released_expr(&mut w, &mut st, Place::Select)?;
        where_sql = format!(" WHERE {w}");
    }
    let order_limit = a.order_limit(query, &mut st, &item_names, None)?;
    let sql = format!(
        "SELECT {} FROM ({}) AS {from_alias}{where_sql}{}",
        items.join(", "),
        post.sql,
        order_limit.sql(|i| i)
    );
    let errors = post.errors.as_ref().and_then(|inner_errors| {
        outer_errors(
            inner_errors,
            &items,
            &errors_of,
            &from_alias,
            &where_sql,
            &order_limit,
        )
    });
    plan.post = Some(PostProcessing {
        sql,
        errors,
        measures: post.measures,
    });
    Ok(plan)
}

/// The subquery and its alias when `select`'s FROM is one derived table and nothing else (no
/// join, not LATERAL, no TABLESAMPLE).
pub(super) fn one_derived_table(
    select: &ast::Select,
) -> Option<(&ast::Query, &Option<ast::TableAlias>)> {
    let [from] = select.from.as_slice() else {
        return None;
    };
    match &from.relation {
        TableFactor::Derived {
            lateral: false,
            subquery,
            alias,
            sample: None,
        } if from.joins.is_empty() => Some((subquery, alias)),
        _ => None,
    }
}

/// The outer query's alias of the subquery, with the clauses an outer query may not have
/// refused.
fn outer_alias(
    query: &ast::Query,
    outer: &ast::Select,
    alias: Option<&ast::TableAlias>,
) -> Result<String> {
    if outer.distinct.is_some()
        || outer.into.is_some()
        || outer.qualify.is_some()
        || !outer.named_window.is_empty()
        || outer.top.is_some()
        || outer.prewhere.is_some()
        || !outer.lateral_views.is_empty()
        || !query.locks.is_empty()
        || query.fetch.is_some()
    {
        return Err(Error::unsupported(
            "this clause on the rows of an aggregate subquery",
            "The outer query may have a select list, WHERE, ORDER BY, LIMIT and OFFSET.",
        ));
    }
    Ok(match alias {
        Some(a) if !a.columns.is_empty() => {
            return Err(Error::unsupported(
                "column lists on a subquery alias",
                "Name the columns inside the subquery with AS.",
            ))
        }
        Some(a) => ident_lower(&a.name),
        None => String::new(),
    })
}

/// The inner outputs that have an `_error95` column under pgdp.accuracy (an aggregate as
/// released, not a question of existence), when the inner post-processing has them.
fn outputs_with_errors(plan: &Plan, has_errors: bool) -> Vec<&str> {
    if !has_errors {
        return Vec::new();
    }
    plan.outputs
        .iter()
        .filter(|o| {
            matches!(o.source, OutputSource::Aggregate(i)
                if plan.aggregates.get(i).is_some_and(|a| a.kind != AggregateKind::Detected))
        })
        .map(|o| o.name.as_str())
        .collect()
}

/// The outer query's select list over the released rows.
struct OuterItems {
    /// Each item's SQL.
    items: Vec<String>,
    /// Each named item's name and expression (for ORDER BY).
    names: Vec<(String, Expr)>,
    /// Per select item: the inner output whose `_error95` follows it (a bare reference to an
    /// aggregate with one), and the name it has in the outer query; `None` for `*` items.
    errors_of: Vec<Option<Option<(String, String)>>>,
}

impl Analyzer<'_> {
    /// The outer query's select items, each an expression over the released columns.
    fn outer_items(
        &mut self,
        outer: &ast::Select,
        st: &mut Staging<'_>,
        alias_name: &str,
        with_errors: &[&str],
    ) -> Result<OuterItems> {
        let mut items = Vec::new();
        let mut names: Vec<(String, Expr)> = Vec::new();
        let mut errors_of: Vec<Option<Option<(String, String)>>> = Vec::new();
        for item in &outer.projection {
            match item {
                SelectItem::Wildcard(o)
                    if o.opt_exclude.is_none()
                        && o.opt_except.is_none()
                        && o.opt_replace.is_none()
                        && o.opt_rename.is_none() =>
                {
                    items.push("*".to_string());
                    errors_of.push(None);
                }
                SelectItem::QualifiedWildcard(
                    ast::SelectItemQualifiedWildcardKind::ObjectName(n),
                    o,
                ) if o.opt_exclude.is_none()
                    && o.opt_except.is_none()
                    && o.opt_replace.is_none()
                    && o.opt_rename.is_none()
                    && matches!(n.0.as_slice(), [p] if p.as_ident().is_some_and(|i| ident_lower(i) == *alias_name)) =>
                {
                    items.push(format!("{}.*", quoted(alias_name)));
                    errors_of.push(None);
                }
                SelectItem::UnnamedExpr(e) => {
                    let referenced = inner_reference(e, alias_name, with_errors);
                    let mut e = e.clone();
                    self.released_expr(&mut e, st, Place::Select)?;
                    let name = default_name(&e);
                    errors_of.push(Some(referenced.map(|r| (r, name.clone()))));
                    names.push((name, e.clone()));
                    items.push(e.to_string());
                }
                SelectItem::ExprWithAlias { expr, alias } => {
                    let referenced = inner_reference(expr, alias_name, with_errors);
                    let mut e = expr.clone();
                    self.released_expr(&mut e, st, Place::Select)?;
                    if alias.value.starts_with(RESERVED_PREFIX) {
                        return Err(reserved_refusal());
                    }
                    errors_of.push(Some(referenced.map(|r| (r, ident_lower(alias)))));
                    names.push((ident_lower(alias), e.clone()));
                    items.push(format!("{e} AS {alias}"));
                }
                _ => {
                    return Err(Error::unsupported(
                        "this select item on the rows of an aggregate subquery",
                        "Select the subquery's columns by name, with AS for new names, or \"source\".* of the whole subquery.",
                    ))
                }
            }
        }
        Ok(OuterItems {
            items,
            names,
            errors_of,
        })
    }
}

/// The outer query over the inner query's `_error95` columns, under pgdp.accuracy: an item
/// that is the inner query's aggregate itself (Metabase's `"source"."count"`) keeps its
/// `_error95`, read from the inner query's, and `*` brings the inner's along. An expression
/// over it gets none (its bound is not its input's), and with `*` a sort by position keeps none
/// (the positions would move): `None` then.
fn outer_errors(
    inner_errors: &str,
    items: &[String],
    errors_of: &[Option<Option<(String, String)>>],
    from_alias: &str,
    where_sql: &str,
    order_limit: &OrderLimit,
) -> Option<String> {
    let wildcard = errors_of.iter().any(Option::is_none);
    if wildcard && order_limit.by_position() {
        return None;
    }
    let mut listed = Vec::new();
    let mut positions = Vec::new();
    for (item, error) in items.iter().zip(errors_of) {
        listed.push(item.clone());
        positions.push(listed.len());
        if let Some(Some((inner, name))) = error {
            listed.push(format!(
                "{from_alias}.{} AS {}",
                quoted(&format!("{inner}_error95")),
                quoted(&format!("{name}_error95"))
            ));
        }
    }
    Some(format!(
        "SELECT {} FROM ({inner_errors}) AS {from_alias}{where_sql}{}",
        listed.join(", "),
        order_limit.sql(|i| positions.get(i - 1).copied().unwrap_or(i))
    ))
}
/// The inner output a select item of an outer query is (a bare column reference to it, alone or
/// qualified by the subquery's alias), if it is one of `outputs`.
fn inner_reference(e: &Expr, alias: &str, outputs: &[&str]) -> Option<String> {
    let name = match e {
        Expr::Identifier(i) => ident_lower(i),
        Expr::CompoundIdentifier(parts) => match parts.as_slice() {
            [q, i] if ident_lower(q) == alias => ident_lower(i),
            _ => return None,
        },
        Expr::Nested(inner) => return inner_reference(inner, alias, outputs),
        _ => return None,
    };
    outputs.contains(&name.as_str()).then_some(name)
}
