//! The routing decision: what answers a statement. Made once per statement, by [`route`], and
//! used by Describe ([`super::describe`]), by parameter inference and by the dispatcher
//! ([`super::Session::run`]) alike, so they cannot disagree.
//!
//! The order for a query is part of the privacy argument: a FROM-less SELECT of constants and
//! the budget view are answered by pgdp, a query of catalog relations goes to the data-free
//! shadow catalog, and everything else is a DP query, which is analysed against the policy (and
//! refused if it is anything but an aggregate pgdp can bound). Nothing reaches the upstream
//! unanalysed. Pure; no I/O.

use std::ops::ControlFlow;

use sqlparser::ast::{self, SelectItem, SetExpr};

use crate::error::{Error, Result};
use crate::session::classify::Statement;
use crate::upstream::catalog::is_catalog_query;

pub use super::budget::BudgetColumns;

/// What answers a statement.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Route<'s> {
    /// Transaction control, SET, RESET and DEALLOCATE: the session's own state; no rows.
    Session,
    /// DECLARE, FETCH, MOVE and CLOSE: the session's cursors.
    Cursor,
    /// `SHOW name` of a setting.
    Show(&'s str),
    /// `SHOW pgdp.budget`, or `SELECT … FROM pgdp.budget` of these columns: the analyst's balance
    /// in the ledger.
    Budget(BudgetColumns<'s>),
    /// A FROM-less SELECT of constants and session lookups, evaluated by pgdp.
    Constant(&'s [SelectItem]),
    /// `SELECT set_config('name', 'value', is_local)` alone (Django sends it on connect to set
    /// the time zone): a SET of the session's setting, answered with its new value.
    SetConfig(SetConfig<'s>),
    /// A query of catalog relations only: checked against the allow-lists, run on the shadow
    /// catalog.
    Catalog(&'s ast::Query),
    /// Everything else a query can be: analysed, charged, run and released under DP.
    Dp(&'s ast::Query),
    /// EXPLAIN of a DP query: analysed and described, never run or charged.
    Explain(&'s ast::Query),
}

/// Decides what answers `statement`. Refuses (before anything runs) only the forms of the budget
/// view pgdp does not answer; every other refusal comes from the stage the route leads to.
pub fn route(statement: &Statement) -> Result<Route<'_>> {
    Ok(match statement {
        Statement::Query(query) => route_query(query)?,
        Statement::Explain(query) => Route::Explain(query),
        Statement::Show { name } if name == "pgdp.budget" => Route::Budget(BudgetColumns::All),
        Statement::Show { name } => Route::Show(name),
        Statement::DeclareCursor { .. }
        | Statement::Fetch { .. }
        | Statement::CloseCursor { .. } => Route::Cursor,
        Statement::Begin
        | Statement::Commit
        | Statement::Rollback
        | Statement::Savepoint { .. }
        | Statement::ReleaseSavepoint { .. }
        | Statement::RollbackToSavepoint { .. }
        | Statement::Set { .. }
        | Statement::Reset { .. }
        | Statement::Deallocate { .. } => Route::Session,
    })
}

/// The arguments of a `SELECT set_config(name, value, is_local) [AS alias]` (literals or
/// parameters, as the statement gives them) and the name of its one column.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SetConfig<'s> {
    pub column: &'s str,
    pub name: &'s ast::Expr,
    pub value: &'s ast::Expr,
    pub local: &'s ast::Expr,
}

/// The route of a query: constants, then the budget view, then the catalog, else DP.
pub(super) fn route_query(query: &ast::Query) -> Result<Route<'_>> {
    if let Some(items) = constant_select(query) {
        if let Some(call) = set_config(items) {
            return Ok(Route::SetConfig(call));
        }
        // What pgdp's own evaluator does not cover (`current_setting('server_version_num')::int
        // / 100`, as Grafana asks) is a catalog query with no relation: checked against the
        // allow-lists and run on the data-free shadow catalog, settings bound by pgdp.
        // Sizes stay refused there: on their own they would be the shadow's (empty) sizes,
        // answered as if they were the tables'.
        if items.iter().all(evaluated_by_pgdp) || calls_size_function(query) {
            return Ok(Route::Constant(items));
        }
        // `SELECT EXISTS (SELECT 1 FROM demo.people WHERE …)` reads a policy table: a data
        // query, which DP analysis answers or refuses as one (not a catalog lookup).
        if !reads_no_relation(query) && !is_catalog_query(query) {
            return Ok(Route::Dp(query));
        }
        return Ok(Route::Catalog(query));
    }
    if let Some(columns) = budget_view(query)? {
        return Ok(Route::Budget(columns));
    }
    // A query over VALUES lists and nothing else (psql's \gdesc describes a result as
    // `SELECT name, format_type(tp, tpm) FROM (VALUES …) s(name, tp, tpm)`) reads no data:
    // the shadow catalog answers it like a FROM-less one.
    if is_catalog_query(query) || (reads_no_relation(query) && !calls_size_function(query)) {
        return Ok(Route::Catalog(query));
    }
    Ok(Route::Dp(query))
}

/// `set_config(name, value, is_local)` as the one item of a FROM-less SELECT.
fn set_config(items: &[SelectItem]) -> Option<SetConfig<'_>> {
    let [item] = items else {
        return None;
    };
    let (expr, column) = match item {
        SelectItem::UnnamedExpr(e) => (e, "set_config"),
        SelectItem::ExprWithAlias { expr, alias } => (expr, alias.value.as_str()),
        _ => return None,
    };
    let ast::Expr::Function(f) = expr else {
        return None;
    };
    let parts: Vec<String> = f
        .name
        .0
        .iter()
        .map(|p| p.to_string().to_ascii_lowercase())
        .collect();
    if !matches!(parts.as_slice(), [n] | [_, n] if n == "set_config")
        || (parts.len() == 2 && parts[0] != "pg_catalog")
    {
        return None;
    }
    let ast::FunctionArguments::List(list) = &f.args else {
        return None;
    };
    let args: Vec<&ast::Expr> = list
        .args
        .iter()
        .filter_map(|a| match a {
            ast::FunctionArg::Unnamed(ast::FunctionArgExpr::Expr(e)) => Some(e),
            _ => None,
        })
        .collect();
    match args.as_slice() {
        [name, value, local] if list.args.len() == 3 => Some(SetConfig {
            column,
            name,
            value,
            local,
        }),
        _ => None,
    }
}

/// Whether `query` names no table, view, CTE or table function anywhere.
fn reads_no_relation(query: &ast::Query) -> bool {
    ast::visit_relations(query, |_| ControlFlow::Break(())).is_continue()
}

/// `SELECT <columns> FROM pgdp.budget`: the analyst's own budget as a one-row virtual table.
/// `None` if the query is not about `pgdp.budget`; 0A000 for clauses pgdp does not answer there.
fn budget_view(query: &ast::Query) -> Result<Option<BudgetColumns<'_>>> {
    let SetExpr::Select(select) = query.body.as_ref() else {
        return Ok(None);
    };
    let [from] = select.from.as_slice() else {
        return Ok(None);
    };
    let ast::TableFactor::Table { name, .. } = &from.relation else {
        return Ok(None);
    };
    let parts: Vec<String> = name
        .0
        .iter()
        .map(|p| p.to_string().to_ascii_lowercase())
        .collect();
    if parts != ["pgdp", "budget"] {
        return Ok(None);
    }
    let plain = from.joins.is_empty()
        && select.selection.is_none()
        && select.having.is_none()
        && matches!(&select.group_by, ast::GroupByExpr::Expressions(e, _) if e.is_empty())
        && query.with.is_none();
    if !plain {
        return Err(Error::unsupported(
            "clauses on pgdp.budget",
            "Use SELECT * FROM pgdp.budget (or name its columns).",
        ));
    }
    let columns = BudgetColumns::Listed(&select.projection);
    // Expressions are refused when routed, as before any other step.
    columns.names()?;
    Ok(Some(columns))
}

/// Whether pgdp's own evaluator of FROM-less SELECTs ([`super::Session::evaluate_constant`])
/// answers `item`: literals, casts, and the session lookups it knows, over such arguments.
fn evaluated_by_pgdp(item: &SelectItem) -> bool {
    fn expr(e: &ast::Expr) -> bool {
        match e {
            ast::Expr::Value(_) | ast::Expr::Identifier(_) => true,
            ast::Expr::Nested(inner) => expr(inner),
            ast::Expr::Cast { expr: inner, .. } => expr(inner),
            ast::Expr::Function(f) => {
                let name = f
                    .name
                    .0
                    .last()
                    .map(|p| p.to_string().to_ascii_lowercase())
                    .unwrap_or_default();
                let known = matches!(
                    name.as_str(),
                    "version"
                        | "current_database"
                        | "current_schema"
                        | "current_user"
                        | "session_user"
                        | "user"
                        | "pg_backend_pid"
                        | "current_schemas"
                        | "current_setting"
                );
                let arguments = match &f.args {
                    ast::FunctionArguments::None => true,
                    ast::FunctionArguments::List(list) => list.args.iter().all(|a| {
                        matches!(a, ast::FunctionArg::Unnamed(ast::FunctionArgExpr::Expr(e)) if expr(e))
                    }),
                    ast::FunctionArguments::Subquery(_) => false,
                };
                known && arguments
            }
            _ => false,
        }
    }
    match item {
        SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. } => expr(e),
        _ => true,
    }
}

/// Whether `query` calls a function that reports the size of a relation or a database.
fn calls_size_function(query: &ast::Query) -> bool {
    ast::visit_expressions(query, |e| match e {
        ast::Expr::Function(f)
            if f.name
                .0
                .last()
                .is_some_and(|p| p.to_string().to_ascii_lowercase().contains("_size")) =>
        {
            std::ops::ControlFlow::Break(())
        }
        _ => std::ops::ControlFlow::Continue(()),
    })
    .is_break()
}

/// The select items of a `SELECT <items>` with no FROM, WHERE, GROUP BY or other clauses.
pub fn constant_select(query: &ast::Query) -> Option<&[SelectItem]> {
    if query.with.is_some()
        || query.order_by.is_some()
        || query.limit_clause.is_some()
        || query.fetch.is_some()
        || !query.locks.is_empty()
    {
        return None;
    }
    let SetExpr::Select(select) = query.body.as_ref() else {
        return None;
    };
    let plain = select.from.is_empty()
        && select.selection.is_none()
        && select.having.is_none()
        && select.distinct.is_none()
        && select.into.is_none()
        && matches!(&select.group_by, ast::GroupByExpr::Expressions(e, m) if e.is_empty() && m.is_empty());
    plain.then_some(select.projection.as_slice())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::classify::classify;

    fn route_of(sql: &str) -> std::result::Result<&'static str, String> {
        let statements = classify(sql).map_err(|e| e.sqlstate().code().to_string())?;
        let [statement] = statements.as_slice() else {
            panic!("{sql}: one statement expected");
        };
        route(statement)
            .map(|r| match r {
                Route::Session => "session",
                Route::Cursor => "cursor",
                Route::Show(_) => "show",
                Route::Budget(_) => "budget",
                Route::Constant(_) => "constant",
                Route::SetConfig(_) => "set_config",
                Route::Catalog(_) => "catalog",
                Route::Dp(_) => "dp",
                Route::Explain(_) => "explain",
            })
            .map_err(|e| e.sqlstate().code().to_string())
    }

    #[test]
    fn every_statement_has_one_route() {
        let cases = [
            ("BEGIN", Ok("session")),
            ("COMMIT", Ok("session")),
            ("SET pgdp.epsilon = 0.5", Ok("session")),
            ("RESET pgdp.epsilon", Ok("session")),
            ("SHOW pgdp.epsilon", Ok("show")),
            ("SHOW pgdp.budget", Ok("budget")),
            ("SELECT * FROM pgdp.budget", Ok("budget")),
            ("SELECT epsilon_remaining FROM pgdp.budget", Ok("budget")),
            ("SELECT nope FROM pgdp.budget", Err("42703")),
            (
                "SELECT epsilon_remaining * 2 FROM pgdp.budget",
                Err("0A000"),
            ),
            ("SELECT * FROM pgdp.budget WHERE true", Err("0A000")),
            ("SELECT 1", Ok("constant")),
            // psql's \gdesc: VALUES and nothing else read no data.
            (
                "SELECT name AS \"Column\", pg_catalog.format_type(tp, tpm) AS \"Type\" FROM (VALUES ('m', '25'::pg_catalog.oid, -1)) s(name, tp, tpm)",
                Ok("catalog"),
            ),
            ("SELECT * FROM (VALUES (1)) v WHERE v.column1 IN (SELECT person_id FROM demo.people)", Ok("dp")),
            ("WITH v AS (VALUES (1)) SELECT * FROM v", Ok("dp")),
            ("SELECT version(), current_schema()", Ok("constant")),
            // Django on connect, with client- and server-side binding.
            ("SELECT set_config('TimeZone', 'UTC', false)", Ok("set_config")),
            ("SELECT pg_catalog.set_config('TimeZone', $1, false) AS tz", Ok("set_config")),
            // With anything else it is not a SET: the shadow catalog refuses it.
            ("SELECT set_config('TimeZone', 'UTC', false), 1", Ok("catalog")),
            ("SELECT set_config('TimeZone', 'UTC')", Ok("catalog")),
            (
                "SELECT current_setting('server_version_num')::int/100 as version",
                Ok("catalog"),
            ),
            ("SELECT 1 + 1", Ok("catalog")),
            // Whether a row exists is a data query.
            ("SELECT EXISTS (SELECT 1 FROM demo.people WHERE age > 100)", Ok("dp")),
            ("SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_class)", Ok("catalog")),
            ("SELECT pg_relation_size('demo.people')", Ok("constant")),
            ("SELECT relname FROM pg_catalog.pg_class", Ok("catalog")),
            (
                "SELECT table_name FROM information_schema.tables",
                Ok("catalog"),
            ),
            ("SELECT COUNT(*) FROM demo.visits", Ok("dp")),
            ("SELECT 1 FROM demo.visits", Ok("dp")),
            ("SELECT COUNT(*) FROM demo.visits LIMIT 1", Ok("dp")),
            ("EXPLAIN SELECT COUNT(*) FROM demo.visits", Ok("explain")),
            (
                "DECLARE c CURSOR WITH HOLD FOR SELECT COUNT(*) FROM demo.visits",
                Ok("cursor"),
            ),
            ("FETCH 10 FROM c", Ok("cursor")),
            ("CLOSE c", Ok("cursor")),
        ];
        for (sql, expected) in cases {
            assert_eq!(route_of(sql), expected.map_err(str::to_string), "{sql}");
        }
    }
}
