//! Set operations over DP queries: `SELECT region, COUNT(*) … GROUP BY region UNION ALL SELECT
//! 'all', COUNT(*) …` (a total row above the groups), `UNION`, `INTERSECT`, `EXCEPT`, nested
//! and parenthesised.
//!
//! Each branch is released as the DP query it is, and charged as its own release (sequential
//! composition: the answer costs the sum of the branches' costs); then PostgreSQL evaluates the
//! set operation, its ORDER BY, LIMIT and OFFSET over the released rows on the shadow catalog.
//! That is post-processing, which costs nothing more, and it is PostgreSQL's own: its type
//! resolution across the branches (an `int4` key beside a `NULL` label is `int4`), its duplicate
//! elimination, its ordering and its column names.
//!
//! Invariants:
//! - [`split`] recognises only a statement whose body is a set operation; each leaf becomes a
//!   query of its own (with the statement's CTEs), which the DP pipeline answers or refuses as
//!   it would on its own. Nothing else of the analyst's text reaches the evaluation but the
//!   operators, ORDER BY of output names or positions, literal LIMIT and OFFSET, and the untyped
//!   literals (`NULL`, `'all'`) a branch selects, which are constants, not data.
//! - [`SetOperation::evaluation_sql`] reads only the rows it is given, written as literals; the
//!   session gives it released rows only ([`super::ClientRows::combined`]).
//! - Pure: the session plans every branch before the first is charged, then runs them in order.

use sqlparser::ast::{self, Expr, OrderByKind, SetExpr, Value};

use crate::dp::release::post::{parsed_relation, rows_relation, ReadAs};
use crate::dp::sql::ShadowSql;
use crate::error::{Error, Result};
use crate::limits::SET_OPERATION_BRANCHES_MAX;
use crate::output::{Cell, CellType, OutColumn};

/// A statement whose body is a set operation of DP queries.
#[derive(Debug, Clone, PartialEq)]
pub struct SetOperation {
    /// The leaves, in the order they appear, each a query of its own.
    pub branches: Vec<ast::Query>,
    /// Per branch, per select item: the untyped literal it selects, if it is one.
    constants: Vec<Vec<Option<String>>>,
    /// The statement without its CTEs; its leaves are replaced, in order, by released rows.
    template: ast::Query,
}

/// The set-operation form of `query`, if its body is one: `Ok(None)` for any other query;
/// a refusal for what cannot be evaluated over released rows.
pub fn split(query: &ast::Query) -> Result<Option<SetOperation>> {
    if !matches!(query.body.as_ref(), SetExpr::SetOperation { .. }) {
        return Ok(None);
    }
    if query.fetch.is_some() || !query.locks.is_empty() {
        return Err(Error::unsupported(
            "FETCH or FOR UPDATE on a set operation",
            "Use LIMIT; pgdp answers reads only.",
        ));
    }
    check_order_and_limit(query)?;
    let mut leaves = Vec::new();
    collect_leaves(query.body.as_ref(), &mut leaves);
    if leaves.len() > SET_OPERATION_BRANCHES_MAX {
        return Err(Error::unsupported(
            format!("a set operation of more than {SET_OPERATION_BRANCHES_MAX} queries"),
            "Each branch is a release charged on its own: split the statement, or ask for the groups and their totals in one query with GROUP BY ROLLUP (…) or GROUPING SETS.",
        ));
    }
    let mut branches = Vec::with_capacity(leaves.len());
    let mut constants = Vec::with_capacity(leaves.len());
    for leaf in leaves {
        let mut branch = match leaf {
            SetExpr::Query(inner) => inner.as_ref().clone(),
            other => ast::Query {
                with: None,
                body: Box::new(other.clone()),
                order_by: None,
                limit_clause: None,
                fetch: None,
                locks: Vec::new(),
                for_clause: None,
                settings: None,
                format_clause: None,
                pipe_operators: Vec::new(),
            },
        };
        if let Some(with) = &query.with {
            if branch.with.is_some() {
                return Err(Error::unsupported(
                    "WITH both on a set operation and inside one of its branches",
                    "Define every CTE in the statement's one WITH.",
                ));
            }
            branch.with = Some(with.clone());
        }
        constants.push(select_constants(&branch));
        branches.push(branch);
    }
    let mut template = query.clone();
    template.with = None;
    Ok(Some(SetOperation {
        branches,
        constants,
        template,
    }))
}

/// The leaves of a set operation, left to right; a parenthesised set operation without its own
/// ORDER BY, LIMIT or WITH is looked into.
fn collect_leaves<'q>(body: &'q SetExpr, leaves: &mut Vec<&'q SetExpr>) {
    match body {
        SetExpr::SetOperation { left, right, .. } => {
            collect_leaves(left, leaves);
            collect_leaves(right, leaves);
        }
        SetExpr::Query(q) if plain_parentheses(q) => collect_leaves(q.body.as_ref(), leaves),
        leaf => leaves.push(leaf),
    }
}

/// Whether `q` is only parentheses around a set operation.
fn plain_parentheses(q: &ast::Query) -> bool {
    matches!(q.body.as_ref(), SetExpr::SetOperation { .. })
        && q.with.is_none()
        && q.order_by.is_none()
        && q.limit_clause.is_none()
        && q.fetch.is_none()
}

/// The statement's own ORDER BY may name output columns (by name or position) only, and LIMIT
/// and OFFSET must be constant counts: PostgreSQL evaluates them over the released rows, where nothing
/// else has a meaning (and a subquery would read the shadow catalog's empty tables).
fn check_order_and_limit(query: &ast::Query) -> Result<()> {
    let hint = "After a UNION, INTERSECT or EXCEPT, ORDER BY names output columns (by name or position), and LIMIT and OFFSET are numbers.";
    if let Some(order) = &query.order_by {
        match &order.kind {
            OrderByKind::Expressions(items) => {
                for item in items {
                    let plain = match &item.expr {
                        Expr::Identifier(_) => true,
                        Expr::Value(v) => matches!(v.value, Value::Number(..)),
                        _ => false,
                    };
                    if !plain || item.with_fill.is_some() {
                        return Err(Error::unsupported(
                            format!("ORDER BY {} on a set operation", item.expr),
                            hint,
                        ));
                    }
                }
            }
            OrderByKind::All(_) => {
                return Err(Error::unsupported("ORDER BY ALL", hint));
            }
        }
    }
    // Constant counts only (`LIMIT 10`, `LIMIT $1::integer` once bound), with PostgreSQL's
    // errors for bad ones: the same rule as a single SELECT's.
    crate::dp::analyze::limit_offset(query).map(|_| ())
}

/// Per select item of a branch (a plain SELECT with no wildcard): the SQL of the untyped
/// literal it is (`NULL`, `'all'`), if it is one.
fn select_constants(branch: &ast::Query) -> Vec<Option<String>> {
    let SetExpr::Select(select) = branch.body.as_ref() else {
        return Vec::new();
    };
    let untyped = |e: &Expr| match e {
        Expr::Value(v) => matches!(v.value, Value::Null | Value::SingleQuotedString(_))
            .then(|| v.value.to_string()),
        _ => None,
    };
    select
        .projection
        .iter()
        .map(|item| match item {
            ast::SelectItem::UnnamedExpr(e) | ast::SelectItem::ExprWithAlias { expr: e, .. } => {
                untyped(e)
            }
            _ => None,
        })
        .collect()
}

impl SetOperation {
    /// The SQL that evaluates the set operation over `parts`, the released columns and rows of
    /// each branch in order: the statement with each leaf replaced by its rows. With no rows it
    /// types the answer (PostgreSQL's refusal of the statement, a type mismatch or a different
    /// number of columns, comes from there, before anything is charged).
    pub fn evaluation_sql(&self, parts: &[(&[OutColumn], &[Vec<Cell>])]) -> Result<ShadowSql> {
        if parts.len() != self.branches.len() {
            return Err(Error::internal("released parts of another set operation"));
        }
        let mut relations = Vec::with_capacity(parts.len());
        for (i, (columns, rows)) in parts.iter().enumerate() {
            let mut read = Vec::with_capacity(columns.len());
            for (j, column) in columns.iter().enumerate() {
                let constant = self.constants[i].get(j).cloned().flatten();
                let how = match constant {
                    Some(sql) => ReadAs::Constant(sql),
                    None => ReadAs::Typed(evaluable(column)?),
                };
                read.push((column.name.clone(), how));
            }
            relations.push(rows_relation(&read, rows));
        }
        let mut statement = self.template.clone();
        let mut next = relations.into_iter();
        replace_leaves(statement.body.as_mut(), &mut next)?;
        let sql = statement.to_string();
        crate::dp::rewrite::check_one_statement(&sql)?;
        Ok(ShadowSql::new(sql))
    }
}

/// A released column's type as the evaluation casts to it: a type pgdp releases by name.
fn evaluable(column: &OutColumn) -> Result<CellType> {
    match column.ty {
        CellType::Raw(_) if column.ty.sql_name() == "text" => Err(Error::unsupported(
            format!("the column {} in a set operation", column.name),
            "pgdp combines branches of numbers, text, booleans, dates and timestamps; cast the column to one of them.",
        )),
        ty => Ok(ty),
    }
}

/// `body` with its leaves (as [`collect_leaves`] finds them) replaced by `relations`, in order.
fn replace_leaves(body: &mut SetExpr, relations: &mut impl Iterator<Item = String>) -> Result<()> {
    match body {
        SetExpr::SetOperation { left, right, .. } => {
            replace_leaves(left, relations)?;
            replace_leaves(right, relations)
        }
        SetExpr::Query(q) if plain_parentheses(q) => replace_leaves(q.body.as_mut(), relations),
        leaf => {
            let sql = relations
                .next()
                .ok_or_else(|| Error::internal("fewer released parts than branches"))?;
            // Parenthesised, so that the relation is one operand whatever the operators around it.
            *leaf = SetExpr::Query(parsed_relation(&sql)?);
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(sql: &str) -> ast::Query {
        *parsed_relation(sql).expect("a query")
    }

    #[test]
    fn each_leaf_is_a_query_with_the_statements_ctes() {
        let q = query(
            "WITH v AS (SELECT * FROM demo.visits) SELECT clinic, COUNT(*) FROM v GROUP BY clinic UNION ALL (SELECT 'all', COUNT(*) FROM v) ORDER BY 2 DESC LIMIT 3",
        );
        let set = split(&q).expect("accepted").expect("a set operation");
        assert_eq!(set.branches.len(), 2);
        assert_eq!(
            set.branches[1].to_string(),
            "WITH v AS (SELECT * FROM demo.visits) SELECT 'all', COUNT(*) FROM v"
        );
        assert_eq!(set.constants[1], vec![Some("'all'".to_string()), None]);
        assert_eq!(set.constants[0], vec![None, None]);
        assert!(split(&query("SELECT COUNT(*) FROM demo.people"))
            .expect("accepted")
            .is_none());
    }

    #[test]
    fn the_evaluation_reads_only_released_rows() {
        let q = query(
            "SELECT sex, COUNT(*) AS n FROM demo.people GROUP BY sex UNION ALL SELECT NULL, COUNT(*) FROM demo.people ORDER BY n DESC",
        );
        let set = split(&q).expect("accepted").expect("a set operation");
        let first = [
            OutColumn::new("sex", CellType::Text),
            OutColumn::new("n", CellType::Int8),
        ];
        let second = [
            OutColumn::new("?column?", CellType::Text),
            OutColumn::new("count", CellType::Int8),
        ];
        let rows = vec![vec![Cell::Text("F".into()), Cell::Int(10)]];
        let total = vec![vec![Cell::Null, Cell::Int(21)]];
        let sql = set
            .evaluation_sql(&[(&first, &rows), (&second, &total)])
            .expect("sql")
            .to_string();
        assert!(!sql.contains("demo"), "{sql}");
        assert!(sql.contains("NULL AS \"?column?\""), "{sql}");
        assert!(sql.contains("::INT8 AS \"n\""), "{sql}");
        assert!(sql.ends_with("ORDER BY n DESC"), "{sql}");
    }

    #[test]
    fn only_output_names_order_a_set_operation() {
        for sql in [
            "SELECT COUNT(*) FROM demo.people UNION ALL SELECT COUNT(*) FROM demo.visits ORDER BY COUNT(*) + 1",
            "SELECT COUNT(*) FROM demo.people UNION ALL SELECT COUNT(*) FROM demo.visits LIMIT (SELECT 1)",
        ] {
            assert!(split(&query(sql)).is_err(), "{sql}");
        }
        let many = ["SELECT COUNT(*) FROM demo.people"; SET_OPERATION_BRANCHES_MAX + 1];
        assert!(split(&query(&many.join(" UNION ALL "))).is_err());
    }
}
