//! Queries over public tables alone (`SELECT region, name FROM demo.regions`, Django's
//! `Region.objects.all()`, a BI tool's lookup list): public data, answered as PostgreSQL answers
//! it, uncharged.
//!
//! Invariants:
//! - [`public_query`] admits a query only if every relation it reads, in every subquery, is a
//!   table the policy declares `kind: public` (or a CTE of the query itself); a query touching
//!   anything else is left to the DP pipeline, which answers or refuses it.
//! - Each public table is read through a derived table of its declared columns only
//!   (`(SELECT "region", "name" FROM "demo"."regions") AS regions`), so an undeclared column
//!   does not exist for the query (PostgreSQL refuses it) and `*` expands to declared columns.
//! - Every function called is on [`PUBLIC_FUNCTIONS`] or is a total function of the DP pipeline:
//!   none reads other relations, files, settings or other sessions, so the answer depends on
//!   the public tables and the query alone.
//! - Pure: no I/O. The upstream runs the [`PublicSql`] it returns.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::ControlFlow;

use sqlparser::ast::{self, Expr, ObjectName, TableFactor, Visit, VisitMut, Visitor, VisitorMut};
use sqlparser::dialect::PostgreSqlDialect;
use sqlparser::parser::Parser;

use super::PublicSql;
use crate::dp::plan::Context;
use crate::error::{Error, Result};
use crate::policy::{Table, TableKind};

/// Functions a query over public tables may call besides the DP pipeline's total functions:
/// aggregates, window functions and ordinary scalar functions of values.
pub const PUBLIC_FUNCTIONS: &[&str] = &[
    // aggregates
    "count",
    "sum",
    "avg",
    "min",
    "max",
    "stddev",
    "stddev_samp",
    "stddev_pop",
    "variance",
    "var_samp",
    "var_pop",
    "string_agg",
    "array_agg",
    "bool_and",
    "bool_or",
    "every",
    "percentile_cont",
    "percentile_disc",
    "mode",
    // window functions
    "row_number",
    "rank",
    "dense_rank",
    "percent_rank",
    "cume_dist",
    "ntile",
    "lag",
    "lead",
    "first_value",
    "last_value",
    "nth_value",
    // scalar
    "concat",
    "concat_ws",
    "substr",
    "substring",
    "replace",
    "split_part",
    "left",
    "right",
    "strpos",
    "position",
    "initcap",
    "lpad",
    "rpad",
    "md5",
    "to_char",
    "to_date",
    "to_timestamp",
    "to_number",
    "make_date",
    "make_timestamp",
    "make_interval",
    "now",
    "current_date",
    "current_timestamp",
    "localtimestamp",
    "age",
    "sign",
    "sqrt",
    "power",
    "mod",
    "div",
    "ln",
    "log",
    "exp",
];

/// The public tables `query` reads when it reads public tables only (each once); `None` when it
/// reads anything else (a private or unknown table, a table function, the catalog).
pub fn public_tables<'p>(query: &ast::Query, ctx: &Context<'p>) -> Option<Vec<&'p Table>> {
    // The CTE names are read only when an unqualified name that is no public table needs
    // them, and the walk stops at the first relation that is neither (most DP statements:
    // their first table).
    let mut ctes: Option<BTreeSet<String>> = None;
    let mut tables: Vec<&Table> = Vec::new();
    let other = query
        .visit(&mut Relations(|factor: &TableFactor| match factor {
            TableFactor::Table {
                name, args: None, ..
            } => match resolve(name, ctx) {
                Some(table) if matches!(table.kind, TableKind::Public) => {
                    if !tables.iter().any(|t| std::ptr::eq(*t, table)) {
                        tables.push(table);
                    }
                    ControlFlow::Continue(())
                }
                _ if name.0.len() == 1
                    && is_cte(name, ctes.get_or_insert_with(|| cte_names(query))) =>
                {
                    ControlFlow::Continue(())
                }
                _ => ControlFlow::Break(()),
            },
            TableFactor::Derived { .. } | TableFactor::NestedJoin { .. } => {
                ControlFlow::Continue(())
            }
            _ => ControlFlow::Break(()),
        }))
        .is_break();
    (!other && !tables.is_empty()).then_some(tables)
}

/// The upstream SQL of `query` when it reads public tables only ([`public_tables`]); `None`
/// otherwise. `order` gives, by qualified name, the order of a table's columns upstream (the
/// order `*` expands to); a table not in it has the policy's order.
pub fn public_query(
    query: &ast::Query,
    ctx: &Context,
    order: &BTreeMap<String, Vec<String>>,
) -> Result<Option<PublicSql>> {
    if public_tables(query, ctx).is_none() {
        return Ok(None);
    }
    let ctes = cte_names(query);
    if !query.locks.is_empty() {
        return Err(Error::forbidden(
            "FOR UPDATE / FOR SHARE is not allowed through pgdp",
            "",
        ));
    }
    check_functions(query)?;
    let mut rewritten = query.clone();
    let mut failure = None;
    let _ = VisitMut::visit(
        &mut rewritten,
        &mut Rewriter {
            ctx,
            ctes: &ctes,
            order,
            failure: &mut failure,
        },
    );
    if let Some(e) = failure {
        return Err(e);
    }
    let sql = crate::dp::sql::sql!("{}", rewritten);
    Ok(Some(PublicSql(sql.into_string())))
}

/// The names of the CTEs defined anywhere in `query` (in its subqueries too), lower-cased.
pub(crate) fn cte_names(query: &ast::Query) -> BTreeSet<String> {
    struct Ctes(BTreeSet<String>);
    impl Visitor for Ctes {
        type Break = ();
        fn pre_visit_query(&mut self, q: &ast::Query) -> ControlFlow<()> {
            if let Some(with) = &q.with {
                for cte in &with.cte_tables {
                    self.0.insert(cte.alias.name.value.to_ascii_lowercase());
                }
            }
            ControlFlow::Continue(())
        }
    }
    let mut names = Ctes(BTreeSet::new());
    let _ = query.visit(&mut names);
    names.0
}

fn is_cte(name: &ObjectName, ctes: &BTreeSet<String>) -> bool {
    match name.0.as_slice() {
        [only] => only.as_ident().is_some_and(|i| ctes.contains(&lowered(i))),
        _ => false,
    }
}

fn lowered(ident: &ast::Ident) -> String {
    if ident.quote_style.is_some() {
        ident.value.clone()
    } else {
        ident.value.to_ascii_lowercase()
    }
}

/// The policy table `name` resolves to on the search path.
fn resolve<'a>(name: &ObjectName, ctx: &Context<'a>) -> Option<&'a Table> {
    let parts: Option<Vec<String>> = name.0.iter().map(|p| p.as_ident().map(lowered)).collect();
    match parts?.as_slice() {
        [schema, table] | [_, schema, table] => ctx.policy.table(&format!("{schema}.{table}")),
        [table] => ctx
            .search_path
            .iter()
            .find_map(|s| ctx.policy.table(&format!("{s}.{table}"))),
        _ => None,
    }
}

/// Calls its closure on every table factor of a query, subqueries included.
struct Relations<F>(F);

impl<F: FnMut(&TableFactor) -> ControlFlow<()>> Visitor for Relations<F> {
    type Break = ();
    fn pre_visit_table_factor(&mut self, factor: &TableFactor) -> ControlFlow<()> {
        (self.0)(factor)
    }
}

/// Refuses a call of a function outside [`PUBLIC_FUNCTIONS`] and the total functions.
pub(crate) fn check_functions(query: &ast::Query) -> Result<()> {
    let mut refused = None;
    let _ = ast::visit_expressions(query, |e| {
        if let Expr::Function(f) = e {
            let name = match f.name.0.as_slice() {
                [only] => only.as_ident().map(lowered),
                [schema, only]
                    if schema
                        .as_ident()
                        .is_some_and(|s| s.value.eq_ignore_ascii_case("pg_catalog")) =>
                {
                    only.as_ident().map(lowered)
                }
                _ => None,
            };
            let allowed = name.as_deref().is_some_and(|n| {
                PUBLIC_FUNCTIONS.contains(&n) || crate::dp::analyze::is_total_function(n)
            });
            if !allowed {
                refused = Some(Error::UnknownFunction {
                    name: f.name.to_string(),
                    hint: "Over public tables pgdp answers aggregates, window functions and ordinary functions of values (docs/queries.md lists them).".into(),
                });
                return ControlFlow::Break(());
            }
        }
        ControlFlow::Continue(())
    });
    match refused {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Replaces each public table by a derived table of its declared columns under the name the
/// query uses for it, and `schema.table.column` by `table.column`.
struct Rewriter<'c, 'p> {
    ctx: &'c Context<'p>,
    ctes: &'c BTreeSet<String>,
    order: &'c BTreeMap<String, Vec<String>>,
    failure: &'c mut Option<Error>,
}

impl VisitorMut for Rewriter<'_, '_> {
    type Break = ();

    // After the factor's children: the derived table put in its place is not visited again.
    fn post_visit_table_factor(&mut self, factor: &mut TableFactor) -> ControlFlow<()> {
        let TableFactor::Table { name, alias, .. } = factor else {
            return ControlFlow::Continue(());
        };
        if is_cte(name, self.ctes) {
            return ControlFlow::Continue(());
        }
        let Some(table) = resolve(name, self.ctx) else {
            *self.failure = Some(Error::internal("a public table that does not resolve"));
            return ControlFlow::Break(());
        };
        if alias.as_ref().is_some_and(|a| !a.columns.is_empty()) {
            *self.failure = Some(Error::unsupported(
                "column aliases on a public table",
                "Name the columns in the select list instead: SELECT r.name AS region_name FROM demo.regions r.",
            ));
            return ControlFlow::Break(());
        }
        let declared: Vec<&str> = match self.order.get(&table.qualified_name()) {
            Some(upstream) => upstream
                .iter()
                .filter(|c| table.column(c).is_some())
                .map(String::as_str)
                .collect(),
            None => table.columns.iter().map(|c| c.name.as_str()).collect(),
        };
        let columns: Vec<String> = declared
            .iter()
            .map(|c| ast::Ident::with_quote('"', *c).to_string())
            .collect();
        let alias = alias.clone().unwrap_or_else(|| ast::TableAlias {
            explicit: true,
            name: ast::Ident::with_quote('"', &table.name),
            columns: Vec::new(),
            at: None,
        });
        // Names from the policy, each quoted as an identifier.
        let text = format!(
            "SELECT {} FROM {}.{}",
            columns.join(", "),
            ast::Ident::with_quote('"', &table.schema),
            ast::Ident::with_quote('"', &table.name)
        );
        let subquery = match Parser::parse_sql(&PostgreSqlDialect {}, &text)
            .ok()
            .as_deref()
        {
            Some([ast::Statement::Query(q)]) => q.clone(),
            _ => {
                *self.failure = Some(Error::internal("a public table's columns do not parse"));
                return ControlFlow::Break(());
            }
        };
        *factor = TableFactor::Derived {
            lateral: false,
            subquery,
            alias: Some(alias),
            sample: None,
        };
        ControlFlow::Continue(())
    }

    fn pre_visit_expr(&mut self, expr: &mut Expr) -> ControlFlow<()> {
        // `"demo"."regions"."name"` (as Django writes it): the derived table is named `regions`.
        if let Expr::CompoundIdentifier(parts) = expr {
            if parts.len() >= 3 {
                let keep = parts.len() - 2;
                parts.drain(..keep);
            }
        }
        ControlFlow::Continue(())
    }
}
