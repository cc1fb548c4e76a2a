//! Calendars: an aggregate subquery joined to a `generate_series` of constants, the zero-filled
//! time axis of every BI chart:
//! `SELECT d.m, COALESCE(v.n, 0) FROM generate_series(DATE '2024-01-01', DATE '2024-12-01',
//! INTERVAL '1 month') AS d(m) LEFT JOIN (SELECT date_trunc('month', visit_date) AS m, COUNT(*)
//! AS n FROM demo.visits GROUP BY 1) AS v ON v.m = d.m`.
//!
//! The subquery is released (and charged) as the DP query it is; then PostgreSQL evaluates the
//! statement on the shadow catalog with the subquery replaced by its released rows. The series
//! is a function of the statement's constants and the join, COALESCE and the rest are functions
//! of released values: post-processing, which costs nothing more. A month partition selection
//! dropped is a row of the series with no match (NULL, or the analyst's COALESCE), exactly as
//! PostgreSQL answers the same statement over the released rows.
//!
//! Invariants:
//! - [`split`] recognises only a statement whose one FROM item joins `generate_series` calls to
//!   exactly one aggregate subquery (a derived table or a CTE of the statement). The series'
//!   arguments hold no column, parameter or subquery; the rest of the statement reads no other
//!   relation, has no subquery, and calls only functions of values
//!   ([`crate::dp::rewrite::public::check_functions`]).
//! - [`Calendar::evaluation_sql`] reads only the rows it is given, written as literals; the
//!   session gives it released rows only ([`super::ClientRows::combined`]).
//! - Pure: the session releases the subquery and evaluates the statement.

use std::ops::ControlFlow;

use sqlparser::ast::{self, Expr, SetExpr, TableFactor};

use crate::dp::release::post::{parsed_relation, rows_relation, ReadAs};
use crate::error::{Error, Result};
use crate::output::{Cell, OutColumn};

/// A statement joining `generate_series` to one aggregate subquery.
#[derive(Debug, Clone, PartialEq)]
pub struct Calendar {
    /// The aggregate subquery, released as a DP query (with the statement's CTEs).
    pub inner: ast::Query,
    /// The statement without its CTEs, its subquery still in place (replaced on evaluation).
    template: ast::Query,
}

/// The hint of a refused calendar.
const HINT: &str = "A calendar joins generate_series(constants…) to one aggregate subquery, e.g. FROM generate_series(DATE '2024-01-01', DATE '2024-12-01', INTERVAL '1 month') AS d(m) LEFT JOIN (SELECT date_trunc('month', visit_date) AS m, COUNT(*) AS n FROM demo.visits GROUP BY 1) AS v ON v.m = d.m; the rest of the statement may use functions of values only.";

/// Whether `factor` is a call of `generate_series`.
fn is_series(factor: &TableFactor) -> bool {
    let name = match factor {
        TableFactor::Table {
            name,
            args: Some(_),
            ..
        } => name,
        TableFactor::Function { name, .. } => name,
        _ => return false,
    };
    let parts: Vec<String> = name
        .0
        .iter()
        .filter_map(|p| p.as_ident())
        .map(|i| i.value.to_ascii_lowercase())
        .collect();
    matches!(
        parts
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>()
            .as_slice(),
        ["generate_series"] | ["pg_catalog", "generate_series"]
    )
}

/// The calendar form of `query`, if it has one: `Ok(None)` for any statement without a
/// `generate_series` beside one subquery; a refusal for one that cannot be evaluated over
/// released rows.
pub fn split(query: &ast::Query) -> Result<Option<Calendar>> {
    let SetExpr::Select(select) = query.body.as_ref() else {
        return Ok(None);
    };
    let [from] = select.from.as_slice() else {
        return Ok(None);
    };
    let factors: Vec<&TableFactor> = std::iter::once(&from.relation)
        .chain(from.joins.iter().map(|j| &j.relation))
        .collect();
    let (series, others): (Vec<&TableFactor>, Vec<&TableFactor>) =
        factors.into_iter().partition(|f| is_series(f));
    let [other] = others.as_slice() else {
        return Ok(None);
    };
    if series.is_empty() {
        return Ok(None);
    }
    let ctes: Vec<&ast::Cte> = query
        .with
        .as_ref()
        .map(|w| w.cte_tables.iter().collect())
        .unwrap_or_default();
    let subquery: ast::Query = match other {
        TableFactor::Derived {
            lateral: false,
            subquery,
            ..
        } => subquery.as_ref().clone(),
        TableFactor::Table {
            name, args: None, ..
        } => {
            let named = match name.0.as_slice() {
                [only] => only.as_ident().map(|i| i.value.to_ascii_lowercase()),
                _ => None,
            };
            match ctes
                .iter()
                .find(|c| Some(c.alias.name.value.to_ascii_lowercase()) == named)
            {
                Some(cte) => cte.query.as_ref().clone(),
                None => return Ok(None),
            }
        }
        _ => return Ok(None),
    };
    if query.with.as_ref().is_some_and(|w| w.recursive) {
        return Err(Error::unsupported("a recursive CTE in a calendar", HINT));
    }
    // The series' arguments: constants only.
    for factor in &series {
        let mut variable = false;
        let _ = ast::visit_expressions(*factor, |e| {
            variable |= matches!(
                e,
                Expr::Identifier(_)
                    | Expr::CompoundIdentifier(_)
                    | Expr::Subquery(_)
                    | Expr::Exists { .. }
                    | Expr::InSubquery { .. }
            ) || matches!(e, Expr::Value(v) if matches!(v.value, ast::Value::Placeholder(_)));
            ControlFlow::<()>::Continue(())
        });
        if variable {
            return Err(Error::unsupported(
                "generate_series over columns, parameters or subqueries",
                HINT,
            ));
        }
    }
    // The rest of the statement: no subquery, no other relation, functions of values only.
    let mut template = query.clone();
    template.with = None;
    let mut outer = template.clone();
    replace_subquery(&mut outer, "SELECT 1")?;
    let mut nested = false;
    let _ = ast::visit_expressions(&outer, |e| {
        nested |= matches!(
            e,
            Expr::Subquery(_) | Expr::Exists { .. } | Expr::InSubquery { .. }
        );
        ControlFlow::<()>::Continue(())
    });
    if nested {
        return Err(Error::unsupported(
            "a subquery in an expression of a calendar",
            HINT,
        ));
    }
    crate::dp::rewrite::public::check_functions(&outer)?;
    let mut inner = subquery;
    if let Some(with) = &query.with {
        if inner.with.is_some() {
            return Err(Error::unsupported(
                "WITH both on a calendar and inside its subquery",
                "Define every CTE in the statement's one WITH.",
            ));
        }
        inner.with = Some(with.clone());
    }
    Ok(Some(Calendar { inner, template }))
}

/// `statement` with its one non-series FROM item replaced by a derived table of `sql` under
/// the item's alias (or, for a CTE, its name).
fn replace_subquery(statement: &mut ast::Query, sql: &str) -> Result<()> {
    let rows = parsed_relation(sql)?;
    let SetExpr::Select(select) = statement.body.as_mut() else {
        return Err(Error::internal("a calendar without its SELECT"));
    };
    let Some(from) = select.from.first_mut() else {
        return Err(Error::internal("a calendar without its FROM"));
    };
    let factor = std::iter::once(&mut from.relation)
        .chain(from.joins.iter_mut().map(|j| &mut j.relation))
        .find(|f| !is_series(f))
        .ok_or_else(|| Error::internal("a calendar without its subquery"))?;
    let alias = match factor {
        TableFactor::Derived { alias, .. } => alias.clone(),
        TableFactor::Table {
            name, alias: None, ..
        } => name
            .0
            .last()
            .and_then(|p| p.as_ident())
            .map(|i| ast::TableAlias {
                explicit: true,
                name: i.clone(),
                columns: Vec::new(),
                at: None,
            }),
        TableFactor::Table { alias, .. } => alias.clone(),
        _ => None,
    };
    *factor = TableFactor::Derived {
        lateral: false,
        subquery: rows,
        alias,
        sample: None,
    };
    Ok(())
}

impl Calendar {
    /// The SQL that evaluates the statement over `parts` (the subquery's released columns and
    /// rows, the one part). With no rows it types the answer.
    pub fn evaluation_sql(&self, parts: &[(&[OutColumn], &[Vec<Cell>])]) -> Result<String> {
        let [(columns, rows)] = parts else {
            return Err(Error::internal("a calendar of another number of parts"));
        };
        let read: Vec<(String, ReadAs)> = columns
            .iter()
            .map(|c| (c.name.clone(), ReadAs::Typed(c.ty)))
            .collect();
        let mut statement = self.template.clone();
        replace_subquery(&mut statement, &rows_relation(&read, rows))?;
        let sql = statement.to_string();
        crate::dp::rewrite::check_one_statement(&sql)?;
        Ok(sql)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(sql: &str) -> ast::Query {
        *parsed_relation(sql).expect("a query")
    }

    const CALENDAR: &str = "SELECT d.m, COALESCE(v.n, 0) AS visits FROM generate_series(DATE '2024-01-01', DATE '2024-12-01', INTERVAL '1 month') AS d(m) LEFT JOIN (SELECT date_trunc('month', visit_date) AS m, COUNT(*) AS n FROM demo.visits GROUP BY 1) AS v ON v.m = d.m ORDER BY 1";

    #[test]
    fn the_subquery_is_released_and_the_rest_reads_its_rows() {
        let calendar = split(&query(CALENDAR))
            .expect("accepted")
            .expect("a calendar");
        assert_eq!(
            calendar.inner.to_string(),
            "SELECT date_trunc('month', visit_date) AS m, COUNT(*) AS n FROM demo.visits GROUP BY 1"
        );
        let columns = [
            OutColumn::new("m", crate::output::CellType::Timestamptz),
            OutColumn::new("n", crate::output::CellType::Int8),
        ];
        let rows = vec![vec![
            Cell::Text("2024-01-01 00:00:00+00".into()),
            Cell::Int(41),
        ]];
        let sql = calendar.evaluation_sql(&[(&columns, &rows)]).expect("sql");
        assert!(!sql.contains("demo"), "{sql}");
        assert!(sql.contains("AS v ON v.m = d.m"), "{sql}");
    }

    #[test]
    fn the_cte_form_is_a_calendar_too() {
        let q = query("WITH v AS (SELECT date_trunc('month', visit_date) AS m, COUNT(*) AS n FROM demo.visits GROUP BY 1) SELECT d.m, v.n FROM generate_series(DATE '2024-01-01', DATE '2024-03-01', INTERVAL '1 month') AS d(m) LEFT JOIN v ON v.m = d.m");
        let calendar = split(&q).expect("accepted").expect("a calendar");
        assert!(calendar.inner.to_string().starts_with("WITH v AS"));
    }

    #[test]
    fn only_constants_and_released_rows_are_read() {
        for sql in [
            "SELECT d.x FROM generate_series(1, (SELECT MAX(age) FROM demo.people)) AS d(x) LEFT JOIN (SELECT age, COUNT(*) AS n FROM demo.people GROUP BY age) AS v ON v.age = d.x",
            "SELECT d.x, (SELECT 1) FROM generate_series(1, 3) AS d(x) LEFT JOIN (SELECT age, COUNT(*) AS n FROM demo.people GROUP BY age) AS v ON v.age = d.x",
            "SELECT d.x, pg_read_file('/etc/passwd') FROM generate_series(1, 3) AS d(x) LEFT JOIN (SELECT age, COUNT(*) AS n FROM demo.people GROUP BY age) AS v ON v.age = d.x",
        ] {
            assert!(split(&query(sql)).is_err(), "{sql}");
        }
        assert!(split(&query("SELECT COUNT(*) FROM demo.people"))
            .expect("accepted")
            .is_none());
    }
}
