//! The public domain of a query's group keys: which groups a query with public keys releases,
//! computed from public facts only (the policy's lists, CASE literals, public tables), before
//! anything private is read.
//!
//! A released group must be one the analyst's SQL could return on *some* data, never a made-up
//! one. So:
//! - keys that are columns of one public table (one alias in FROM) take the combinations of
//!   values that table's rows hold (`SELECT DISTINCT r.region, r.population FROM regions r`),
//!   not the cross product of each column's values;
//! - a WHERE conjunct that reads only such a table, or only one listed column, restricts the
//!   domain as it restricts the data (`WHERE region IN ('CE', 'EA')` releases two groups, not
//!   ten); PostgreSQL evaluates it on the public values, so its meaning is PostgreSQL's;
//! - a conjunct that also reads anything else is not applied: whether its groups are empty
//!   depends on the data, and a public domain releases them (with noisy zeros) for that reason.
//!
//! Invariants: every SQL built here ([`PublicSql`]) reads public tables and literals only; the
//! domain depends on the policy, the query and public tables, never on private rows.

use std::ops::ControlFlow;

use sqlparser::ast::{self, Expr, Visit};
use sqlparser::dialect::PostgreSqlDialect;
use sqlparser::parser::Parser;

use super::PublicSql;
use crate::dp::plan::{Canonical, Plan, PublicKeys, TableRef};
use crate::dp::sql::{relation, sql, Ident, Sql};
use crate::error::{Error, Result};
use crate::limits::PUBLIC_KEY_COMBINATIONS_MAX;
use crate::policy::ColumnType;

/// Values of some of the keys, one row per combination, in the order of [`Part::keys`].
pub type Combinations = Vec<Vec<Option<String>>>;

/// One factor of the public domain: the keys it covers and where their combinations come from.
/// The domain is the cross product of the parts.
#[derive(Debug, Clone, PartialEq)]
pub struct Part {
    /// Indices into the plan's keys.
    pub keys: Vec<usize>,
    /// The combinations, or the SQL that lists them.
    pub source: Source,
}

/// Where the combinations of a [`Part`] come from.
#[derive(Debug, Clone, PartialEq)]
pub enum Source {
    /// Known without reading anything.
    Values(Combinations),
    /// Read from the upstream: one row per combination, one text column per key.
    Query(PublicSql),
    /// A listed column filtered by WHERE conjuncts: the SQL returns the indices (as text) of the
    /// listed values that pass.
    Filtered {
        /// The SQL over the listed values.
        sql: PublicSql,
        /// The listed values, by index.
        values: Vec<Option<String>>,
    },
}

impl Part {
    /// The SQL that lists this part's combinations, if it must be read from the upstream.
    pub fn sql(&self) -> Option<&PublicSql> {
        match &self.source {
            Source::Values(_) => None,
            Source::Query(sql) | Source::Filtered { sql, .. } => Some(sql),
        }
    }

    /// The part's keys and combinations, given the text rows its [`Part::sql`] returned (none
    /// when it has no SQL). More than [`PUBLIC_KEY_COMBINATIONS_MAX`] rows are refused.
    pub fn into_combinations(
        self,
        rows: Option<Vec<Vec<Option<String>>>>,
    ) -> Result<(Vec<usize>, Combinations)> {
        let rows = match (&self.source, rows) {
            (Source::Values(_), None) => None,
            (Source::Values(_), Some(_)) | (_, None) => {
                return Err(Error::internal("public domain rows do not match the part"))
            }
            (_, Some(rows)) => Some(rows),
        };
        if rows
            .as_ref()
            .is_some_and(|r| r.len() > PUBLIC_KEY_COMBINATIONS_MAX)
        {
            return Err(Error::LimitExceeded {
                what: "the number of values of the public group keys".into(),
                limit: PUBLIC_KEY_COMBINATIONS_MAX as u64,
            });
        }
        let combinations = match (self.source, rows) {
            (Source::Values(values), _) => values,
            (Source::Query(_), Some(rows)) => {
                if rows.iter().any(|r| r.len() != self.keys.len()) {
                    return Err(Error::internal("public domain rows of the wrong width"));
                }
                rows
            }
            (Source::Filtered { values, .. }, Some(rows)) => rows
                .into_iter()
                .map(|r| {
                    r.first()
                        .cloned()
                        .flatten()
                        .and_then(|i| i.parse::<usize>().ok())
                        .and_then(|i| values.get(i).cloned())
                        .map(|v| vec![v])
                        .ok_or_else(|| Error::internal("a listed value index out of range"))
                })
                .collect::<Result<_>>()?,
            (_, None) => return Err(Error::internal("public domain rows missing")),
        };
        Ok((self.keys, combinations))
    }
}

/// The parts of the public domain of `plan`'s keys (all public; see [`Plan::keys_public`]).
pub fn public_domain(plan: &Plan, parameters: &[Option<String>]) -> Result<Vec<Part>> {
    let conjuncts = bound_conjuncts(plan, parameters)?;
    let mut parts: Vec<Part> = Vec::new();
    // Keys of public tables, by alias, in order of first appearance.
    let mut tables: Vec<(&str, Vec<usize>)> = Vec::new();
    for (i, key) in plan.keys.iter().enumerate() {
        match &key.public {
            PublicKeys::No => return Err(Error::internal("a key without a public domain")),
            PublicKeys::Table { alias, .. } => {
                match tables.iter_mut().find(|(a, _)| *a == alias.as_str()) {
                    Some((_, keys)) => keys.push(i),
                    None => tables.push((alias.as_str(), vec![i])),
                }
            }
            PublicKeys::Listed { values, .. } => {
                let column = plain_column(key.expr.as_str());
                let applicable: Vec<&Expr> = match &column {
                    Some((alias, column)) => conjuncts
                        .iter()
                        .filter(|c| reads_only(c, alias, Some(column)))
                        .collect(),
                    None => Vec::new(),
                };
                let source = match column {
                    Some((alias, column)) if !applicable.is_empty() => Source::Filtered {
                        sql: filtered_values_sql(&alias, &column, key.ty, values, &applicable)?,
                        values: values.clone(),
                    },
                    _ => Source::Values(values.iter().map(|v| vec![v.clone()]).collect()),
                };
                parts.push(Part {
                    keys: vec![i],
                    source,
                });
            }
        }
    }
    for (alias, keys) in tables {
        let table = plan
            .tables
            .iter()
            .find(|t| t.alias == alias)
            .ok_or_else(|| Error::internal("a public key of a table not in FROM"))?;
        let applicable: Vec<&Expr> = conjuncts
            .iter()
            .filter(|c| reads_only(c, alias, None))
            .collect();
        let exprs: Vec<&Canonical> = keys.iter().map(|&i| &plan.keys[i].expr).collect();
        let sql = table_values_sql(plan, parameters, table, &exprs, &applicable)?;
        parts.push(Part {
            keys,
            source: Source::Query(sql),
        });
    }
    Ok(parts)
}

/// The WHERE clause split at its top-level ANDs, with parameters bound.
pub(super) fn bound_conjuncts(plan: &Plan, parameters: &[Option<String>]) -> Result<Vec<Expr>> {
    let Some(filter) = &plan.filter else {
        return Ok(Vec::new());
    };
    let mut filter = filter.clone();
    super::bind_parameters(&mut filter, plan, parameters)?;
    let mut out = Vec::new();
    split_and(filter, &mut out);
    Ok(out)
}

/// `e` split at its top-level ANDs (through parentheses); a parenthesised conjunct keeps its
/// parentheses, so the parts can be joined with AND again.
pub(crate) fn split_and(e: Expr, out: &mut Vec<Expr>) {
    match e {
        Expr::BinaryOp {
            left,
            op: ast::BinaryOperator::And,
            right,
        } => {
            split_and(*left, out);
            split_and(*right, out);
        }
        Expr::Nested(inner) => match *inner {
            e @ Expr::BinaryOp {
                op: ast::BinaryOperator::And,
                ..
            } => split_and(e, out),
            other => out.push(Expr::Nested(Box::new(other))),
        },
        other => out.push(other),
    }
}

/// `"alias"."column"` of a canonical key, if the key is a plain column.
pub(super) fn plain_column(expr: &str) -> Option<(String, String)> {
    let parsed = Parser::new(&PostgreSqlDialect {})
        .try_with_sql(expr)
        .and_then(|mut p| p.parse_expr())
        .ok()?;
    match parsed {
        Expr::CompoundIdentifier(parts) => match parts.as_slice() {
            [alias, column] => Some((alias.value.clone(), column.value.clone())),
            _ => None,
        },
        _ => None,
    }
}

/// Whether `conjunct` reads columns of `alias` only (and only `column` of it, when given), and no
/// subquery.
fn reads_only(conjunct: &Expr, alias: &str, column: Option<&str>) -> bool {
    let mut columns = 0usize;
    let verdict = conjunct.visit(&mut OnlyColumnsOf {
        alias,
        column,
        columns: &mut columns,
    });
    verdict.is_continue() && columns > 0
}

struct OnlyColumnsOf<'a> {
    alias: &'a str,
    column: Option<&'a str>,
    columns: &'a mut usize,
}

impl ast::Visitor for OnlyColumnsOf<'_> {
    type Break = ();

    fn pre_visit_expr(&mut self, expr: &Expr) -> ControlFlow<()> {
        match expr {
            Expr::CompoundIdentifier(parts) => match parts.as_slice() {
                [a, c] if a.value == self.alias && self.column.is_none_or(|col| c.value == col) => {
                    *self.columns += 1;
                    ControlFlow::Continue(())
                }
                _ => ControlFlow::Break(()),
            },
            Expr::Identifier(_)
            | Expr::Subquery(_)
            | Expr::Exists { .. }
            | Expr::InSubquery { .. }
            | Expr::AnyOp { .. }
            | Expr::AllOp { .. } => ControlFlow::Break(()),
            _ => ControlFlow::Continue(()),
        }
    }
}

/// The SQL type listed values of a key of type `ty` are compared as.
pub(super) fn sql_type(ty: ColumnType) -> &'static str {
    match ty {
        ColumnType::Integer => "bigint",
        ColumnType::Numeric => "numeric",
        ColumnType::Float => "double precision",
        ColumnType::Text => "text",
        ColumnType::Date => "date",
        ColumnType::Timestamp => "timestamp",
        ColumnType::Boolean => "boolean",
    }
}

/// `SELECT "alias"."__dp_i" FROM (VALUES (0, CAST('CE' AS text)), …) AS "alias"("__dp_i",
/// "column") WHERE <conjuncts>`: the indices of the listed values that pass the conjuncts.
fn filtered_values_sql(
    alias: &str,
    column: &str,
    ty: ColumnType,
    values: &[Option<String>],
    conjuncts: &[&Expr],
) -> Result<PublicSql> {
    if values.is_empty() {
        return Err(Error::internal("an empty listed domain"));
    }
    let ty = Sql::text(sql_type(ty));
    let rows = values.iter().enumerate().map(|(i, v)| {
        let literal = match v {
            Some(text) => sql!(
                "{}",
                Expr::value(ast::Value::SingleQuotedString(text.clone()))
            ),
            None => Sql::text("NULL"),
        };
        sql!("({}, CAST({} AS {}))", i, literal, ty)
    });
    let filter = Sql::join(conjuncts.iter().map(|c| sql!("{}", c)), " AND ");
    let sql = sql!(
        "SELECT CAST({}.\"__dp_i\" AS TEXT) FROM (VALUES {}) AS {}(\"__dp_i\", {}) WHERE {}",
        Ident(alias),
        Sql::join(rows, ", "),
        Ident(alias),
        Ident(column),
        filter
    );
    checked(&sql.into_string())
}

/// `SELECT DISTINCT CAST(k AS TEXT), … FROM <table> AS "alias" WHERE <conjuncts> LIMIT n`: the
/// combinations of the keys' values that the public table's rows hold.
fn table_values_sql(
    plan: &Plan,
    parameters: &[Option<String>],
    table: &TableRef,
    keys: &[&Canonical],
    conjuncts: &[&Expr],
) -> Result<PublicSql> {
    if table.private {
        return Err(Error::internal("a public domain read from a private table"));
    }
    let relation = relation(table, |q| {
        let mut q = q.clone();
        super::bind_parameters(&mut q, plan, parameters)?;
        Ok(sql!("{}", q))
    })?;
    let select = Sql::join(keys.iter().map(|k| sql!("CAST({} AS TEXT)", k)), ", ");
    let filter = if conjuncts.is_empty() {
        Sql::text("")
    } else {
        sql!(
            " WHERE {}",
            Sql::join(conjuncts.iter().map(|c| sql!("{}", c)), " AND ")
        )
    };
    let sql = sql!(
        "SELECT DISTINCT {} FROM {}{} LIMIT {}",
        select,
        relation,
        filter,
        PUBLIC_KEY_COMBINATIONS_MAX + 1
    );
    checked(&sql.into_string())
}

/// Parses `sql` as exactly one query and prints it back (the form every [`PublicSql`] has).
pub(super) fn checked(sql: &str) -> Result<PublicSql> {
    let statements = Parser::parse_sql(&PostgreSqlDialect {}, sql)
        .map_err(|e| Error::internal(format!("public domain SQL does not parse: {e}")))?;
    match statements.as_slice() {
        [ast::Statement::Query(q)] => Ok(PublicSql(q.to_string())),
        _ => Err(Error::internal("public domain SQL is not one query")),
    }
}

/// Every combination of the parts' values, as full key rows (`k` keys), in the parts' order.
/// Refused when there are more than [`PUBLIC_KEY_COMBINATIONS_MAX`].
pub fn combinations(k: usize, parts: &[(Vec<usize>, Combinations)]) -> Result<Combinations> {
    let mut combos: Combinations = vec![vec![None; k]];
    for (keys, values) in parts {
        let mut next = Vec::with_capacity(combos.len() * values.len());
        for c in &combos {
            for v in values {
                let mut row = c.clone();
                for (&key, value) in keys.iter().zip(v) {
                    row[key] = value.clone();
                }
                next.push(row);
            }
        }
        if next.len() > PUBLIC_KEY_COMBINATIONS_MAX {
            return Err(Error::LimitExceeded {
                what: "the number of public group combinations".into(),
                limit: PUBLIC_KEY_COMBINATIONS_MAX as u64,
            });
        }
        combos = next;
    }
    Ok(combos)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn combinations_place_each_part_in_its_keys() {
        let s = |v: &str| Some(v.to_string());
        let parts = vec![
            (vec![1], vec![vec![s("F")], vec![s("M")]]),
            (
                vec![0, 2],
                vec![vec![s("CE"), s("4500000")], vec![s("EA"), None]],
            ),
        ];
        assert_eq!(
            combinations(3, &parts).unwrap(),
            vec![
                vec![s("CE"), s("F"), s("4500000")],
                vec![s("EA"), s("F"), None],
                vec![s("CE"), s("M"), s("4500000")],
                vec![s("EA"), s("M"), None],
            ]
        );
        // An empty part (a filter no public value passes) releases no group.
        assert!(combinations(1, &[(vec![0], vec![])]).unwrap().is_empty());
    }

    #[test]
    fn conjuncts_apply_only_when_they_read_only_the_domain() {
        let e = |sql: &str| {
            Parser::new(&PostgreSqlDialect {})
                .try_with_sql(sql)
                .and_then(|mut p| p.parse_expr())
                .unwrap()
        };
        let t1 = "__dp_t1";
        assert!(reads_only(
            &e(r#""__dp_t1"."region" IN ('CE', 'EA')"#),
            t1,
            Some("region")
        ));
        assert!(reads_only(
            &e(r#"lower("__dp_t1"."region") = 'ce'"#),
            t1,
            Some("region")
        ));
        assert!(!reads_only(
            &e(r#""__dp_t1"."region" = 'CE' OR "__dp_t1"."age" > 3"#),
            t1,
            Some("region")
        ));
        assert!(reads_only(
            &e(r#""__dp_t1"."region" = 'CE' OR "__dp_t1"."age" > 3"#),
            t1,
            None
        ));
        assert!(!reads_only(&e(r#""__dp_t2"."region" = 'CE'"#), t1, None));
        assert!(!reads_only(&e("1 = 1"), t1, None));
        assert!(!reads_only(
            &e(r#""__dp_t1"."region" IN (SELECT 'CE')"#),
            t1,
            None
        ));
    }

    #[test]
    fn where_is_split_at_top_level_and() {
        let e = Parser::new(&PostgreSqlDialect {})
            .try_with_sql("a = 1 AND (b = 2 AND c = 3) AND (d = 4 OR e = 5)")
            .and_then(|mut p| p.parse_expr())
            .unwrap();
        let mut out = Vec::new();
        split_and(e, &mut out);
        let printed: Vec<String> = out.iter().map(|c| c.to_string()).collect();
        assert_eq!(printed, ["a = 1", "b = 2", "c = 3", "(d = 4 OR e = 5)"]);
    }
}
