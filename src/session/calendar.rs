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
use crate::dp::sql::ShadowSql;
use crate::error::{Error, Result};
use crate::output::{Cell, CellType, OutColumn};

/// A statement joining `generate_series` to one aggregate subquery.
#[derive(Debug, Clone, PartialEq)]
pub struct Calendar {
    /// The aggregate subquery, released as a DP query (with the statement's CTEs).
    pub inner: ast::Query,
    /// The statement without its CTEs, its subquery still in place (replaced on evaluation).
    template: ast::Query,
    /// The join of the series to the subquery's key, when the series' values are the only keys
    /// the join can match ([`Calendar::key_domain_sql`]).
    pub key: Option<SeriesKey>,
}

/// An equality `v.column = <series expression>` in the ON of an inner join or a LEFT JOIN that
/// preserves the series: a row of the subquery reaches the answer only if its `column` equals a
/// value of the expression over the series, so those values are the subquery key's domain.
#[derive(Debug, Clone, PartialEq)]
pub struct SeriesKey {
    /// The subquery's output column (as PostgreSQL names it).
    pub column: String,
    /// The other side of the equality: reads only the series (and constants).
    matched: Expr,
    /// The series, as written in FROM.
    series: Vec<TableFactor>,
    /// `date_trunc`'s unit when the subquery's column is `date_trunc('unit', …)`: only values
    /// truncated to it can be keys.
    truncation: Option<String>,
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
    let key = series_key(from, &inner, &series);
    Ok(Some(Calendar {
        inner,
        template,
        key,
    }))
}

/// The name a FROM item's columns are qualified with: its alias, or a CTE's name.
fn qualifier(factor: &TableFactor) -> Option<String> {
    match factor {
        TableFactor::Derived { alias, .. } | TableFactor::Table { alias, .. }
            if alias.is_some() =>
        {
            alias.as_ref().map(|a| folded(&a.name))
        }
        TableFactor::Table { name, .. } => name.0.last().and_then(|p| p.as_ident()).map(folded),
        _ => None,
    }
}

/// An identifier as PostgreSQL names it: unquoted ones fold to lower case.
fn folded(ident: &ast::Ident) -> String {
    match ident.quote_style {
        Some(_) => ident.value.clone(),
        None => ident.value.to_lowercase(),
    }
}

/// The [`SeriesKey`] of a calendar whose subquery is joined (inner, or LEFT JOIN with the
/// subquery on the right) on `alias.column = <expression of the series>`.
fn series_key(
    from: &ast::TableWithJoins,
    inner: &ast::Query,
    series: &[&TableFactor],
) -> Option<SeriesKey> {
    use ast::{JoinConstraint, JoinOperator};
    let join = from.joins.iter().find(|j| !is_series(&j.relation))?;
    let (JoinOperator::Join(JoinConstraint::On(on))
    | JoinOperator::Inner(JoinConstraint::On(on))
    | JoinOperator::Left(JoinConstraint::On(on))
    | JoinOperator::LeftOuter(JoinConstraint::On(on))) = &join.join_operator
    else {
        return None;
    };
    let alias = qualifier(&join.relation)?;
    let mut conjuncts = Vec::new();
    crate::dp::rewrite::domain::split_and(on.clone(), &mut conjuncts);
    let (column, matched) = conjuncts.iter().find_map(|c| match unnested(c) {
        Expr::BinaryOp {
            left,
            op: ast::BinaryOperator::Eq,
            right,
        } => subquery_column(left, &alias)
            .filter(|_| reads_series_only(right, &alias))
            .map(|col| (col, right.as_ref().clone()))
            .or_else(|| {
                subquery_column(right, &alias)
                    .filter(|_| reads_series_only(left, &alias))
                    .map(|col| (col, left.as_ref().clone()))
            }),
        _ => None,
    })?;
    Some(SeriesKey {
        truncation: truncation_of(inner, &column),
        column,
        matched,
        series: series.iter().map(|f| (*f).clone()).collect(),
    })
}

/// `e` without the parentheses around it.
fn unnested(e: &Expr) -> &Expr {
    match e {
        Expr::Nested(inner) => unnested(inner),
        other => other,
    }
}

/// `alias.column` as the column's name.
fn subquery_column(e: &Expr, alias: &str) -> Option<String> {
    match e {
        Expr::CompoundIdentifier(parts) => match parts.as_slice() {
            [a, column] if folded(a) == alias => Some(folded(column)),
            _ => None,
        },
        Expr::Nested(inner) => subquery_column(inner, alias),
        _ => None,
    }
}

/// Whether `e` reads only qualified columns of relations other than `alias` (the series) and
/// constants: no bare column, which could be the subquery's.
fn reads_series_only(e: &Expr, alias: &str) -> bool {
    let mut series_only = true;
    let mut columns = 0;
    let _ = ast::visit_expressions(e, |x| {
        match x {
            Expr::Identifier(_) | Expr::Subquery(_) | Expr::Exists { .. } => series_only = false,
            Expr::CompoundIdentifier(parts) => {
                columns += 1;
                series_only &= parts.first().is_some_and(|a| folded(a) != alias);
            }
            _ => {}
        }
        ControlFlow::<()>::Continue(())
    });
    series_only && columns > 0
}

/// The unit of `date_trunc('unit', …)` when the subquery's output `column` is that call.
fn truncation_of(inner: &ast::Query, column: &str) -> Option<String> {
    let SetExpr::Select(select) = inner.body.as_ref() else {
        return None;
    };
    let expr = select.projection.iter().find_map(|item| match item {
        ast::SelectItem::ExprWithAlias { expr, alias } if folded(alias) == column => Some(expr),
        _ => None,
    })?;
    let Expr::Function(f) = expr else {
        return None;
    };
    let name = f.name.0.last()?.as_ident()?.value.to_ascii_lowercase();
    let ast::FunctionArguments::List(list) = &f.args else {
        return None;
    };
    match (name.as_str(), list.args.as_slice()) {
        (
            "date_trunc",
            [ast::FunctionArg::Unnamed(ast::FunctionArgExpr::Expr(Expr::Value(v))), _],
        ) => match &v.value {
            ast::Value::SingleQuotedString(unit) => Some(unit.to_ascii_lowercase()),
            _ => None,
        },
        _ => None,
    }
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
    /// The SQL that lists, as text of the subquery's key type `ty`, the distinct non-NULL values
    /// the series gives the join's other side (truncated values only, for a `date_trunc` key),
    /// at most `limit` + 1 of them. Reads the statement's constants only.
    pub fn key_domain_sql(&self, ty: CellType, limit: usize) -> Option<ShadowSql> {
        let key = self.key.as_ref()?;
        let series: Vec<String> = key.series.iter().map(ToString::to_string).collect();
        let truncated = match &key.truncation {
            Some(unit) => format!(
                " AND date_trunc({}, \"__dp_v\") = \"__dp_v\"",
                Expr::value(ast::Value::SingleQuotedString(unit.clone()))
            ),
            None => String::new(),
        };
        let sql = format!(
            "SELECT DISTINCT CAST(\"__dp_v\" AS text) FROM (SELECT CAST({} AS {}) AS \"__dp_v\" FROM {}) AS \"__dp_series\" WHERE \"__dp_v\" IS NOT NULL{truncated} LIMIT {}",
            key.matched,
            ty.sql_name(),
            series.join(", "),
            limit + 1
        );
        crate::dp::rewrite::check_one_statement(&sql).ok()?;
        Some(ShadowSql::new(sql))
    }

    /// The SQL that evaluates the statement over `parts` (the subquery's released columns and
    /// rows, the one part). With no rows it types the answer.
    pub fn evaluation_sql(&self, parts: &[(&[OutColumn], &[Vec<Cell>])]) -> Result<ShadowSql> {
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
        Ok(ShadowSql::new(sql))
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
        let sql = calendar
            .evaluation_sql(&[(&columns, &rows)])
            .expect("sql")
            .to_string();
        assert!(!sql.contains("demo"), "{sql}");
        assert!(sql.contains("AS v ON v.m = d.m"), "{sql}");
    }

    #[test]
    fn the_series_values_are_the_keys_a_left_join_can_match() {
        let calendar = split(&query(CALENDAR))
            .expect("accepted")
            .expect("a calendar");
        let key = calendar.key.as_ref().expect("a series key");
        assert_eq!(key.column, "m");
        assert_eq!(key.truncation.as_deref(), Some("month"));
        let sql = calendar
            .key_domain_sql(CellType::Timestamptz, 4096)
            .expect("domain SQL")
            .to_string();
        assert_eq!(
            sql,
            "SELECT DISTINCT CAST(\"__dp_v\" AS text) FROM (SELECT CAST(d.m AS timestamptz) AS \"__dp_v\" FROM generate_series(DATE '2024-01-01', DATE '2024-12-01', INTERVAL '1 month') AS d (m)) AS \"__dp_series\" WHERE \"__dp_v\" IS NOT NULL AND date_trunc('month', \"__dp_v\") = \"__dp_v\" LIMIT 4097"
        );
        // The other side first, an inner join, a CTE: the same key.
        for sql in [
            "SELECT d.x, v.n FROM generate_series(0, 100) AS d(x) JOIN (SELECT age AS a, COUNT(*) AS n FROM demo.people GROUP BY age) AS v ON d.x = v.a",
            "WITH v AS (SELECT age AS a, COUNT(*) AS n FROM demo.people GROUP BY age) SELECT d.x, v.n FROM generate_series(0, 100) AS d(x) LEFT JOIN v ON (d.x = v.a AND v.n > 0)",
        ] {
            let calendar = split(&query(sql)).expect("accepted").expect("a calendar");
            assert_eq!(calendar.key.as_ref().map(|k| k.column.as_str()), Some("a"), "{sql}");
            assert!(calendar.key.as_ref().is_some_and(|k| k.truncation.is_none()));
        }
    }

    #[test]
    fn a_join_that_keeps_unmatched_subquery_rows_lists_nothing() {
        for sql in [
            // The subquery's rows are kept whether they match or not.
            "SELECT d.x, v.n FROM generate_series(0, 100) AS d(x) RIGHT JOIN (SELECT age AS a, COUNT(*) AS n FROM demo.people GROUP BY age) AS v ON d.x = v.a",
            "SELECT d.x, v.n FROM generate_series(0, 100) AS d(x) FULL JOIN (SELECT age AS a, COUNT(*) AS n FROM demo.people GROUP BY age) AS v ON d.x = v.a",
            "SELECT d.x, v.n FROM (SELECT age AS a, COUNT(*) AS n FROM demo.people GROUP BY age) AS v LEFT JOIN generate_series(0, 100) AS d(x) ON d.x = v.a",
            // No equality with the series alone.
            "SELECT d.x, v.n FROM generate_series(0, 100) AS d(x) LEFT JOIN (SELECT age AS a, COUNT(*) AS n FROM demo.people GROUP BY age) AS v ON d.x < v.a",
            "SELECT d.x, v.n FROM generate_series(0, 100) AS d(x) LEFT JOIN (SELECT age AS a, COUNT(*) AS n FROM demo.people GROUP BY age) AS v ON v.n = v.a",
            "SELECT d.x, v.n FROM generate_series(0, 100) AS d(x) CROSS JOIN (SELECT age AS a, COUNT(*) AS n FROM demo.people GROUP BY age) AS v",
        ] {
            let calendar = split(&query(sql)).expect("accepted").expect("a calendar");
            assert_eq!(calendar.key, None, "{sql}");
        }
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
