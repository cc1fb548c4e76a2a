//! A query answered from a synopsis (private multiplicative weights over a policy-declared public
//! domain, [`crate::dp::mechanism::pmw`]): which queries can be, which cells each of their groups
//! counts, and the SQL of the synopsis's private histogram.
//!
//! A query is routed to a synopsis ([`route`]) when it is a count of rows of the synopsis's
//! table alone (`COUNT(*)`, or `COUNT(x)` of an `x` that is never NULL, as many times as it
//! likes), grouped by none or some of the synopsis's
//! columns, filtered by WHERE conditions that read only those columns (parameters bound), with
//! no grouping sets, semijoins, derived tables or per-unit caps of its own; HAVING, ORDER BY,
//! LIMIT and post-processing apply to the released counts as on the per-query path. Everything
//! else takes the per-query path.
//!
//! Each released group is one counting query: the cells whose column values are the group's keys
//! and that pass WHERE. Which cells pass WHERE is decided by PostgreSQL on the domain's literals
//! ([`Route::cells_sql`], a [`PublicSql`] over `VALUES` only), so its meaning is PostgreSQL's.
//!
//! Invariants: [`Route::cells_sql`] reads literals only; [`histogram`] is the one SQL over the
//! private table, and counts each unit's rows up to the synopsis's Δ (`rows_per_unit`), in cells
//! of the domain only: removing a unit changes the histogram's L1 norm by at most Δ.

use std::ops::ControlFlow;

use sqlparser::ast::{self, Expr, Visit};

use super::domain::{bound_conjuncts, checked, plain_column, sql_type};
use super::{check_one_statement, PublicSql, UpstreamSql};
use crate::dp::plan::{Aggregate, AggregateKind, Plan, Unit};
use crate::dp::sql::{sql, Ident, Sql};
use crate::error::{Error, Result};
use crate::policy::{Policy, Synopsis};

/// A query routed to a synopsis.
#[derive(Debug, Clone, PartialEq)]
pub struct Route {
    /// The synopsis's name.
    pub synopsis: String,
    /// For each of the plan's keys, the synopsis column it is.
    pub key_columns: Vec<usize>,
    /// The SQL listing the cells that pass WHERE (their indices, as text), over the domain's
    /// literals; `None` without WHERE (every cell passes).
    pub cells_sql: Option<PublicSql>,
    /// The synopsis's private histogram ([`histogram`]).
    pub histogram: UpstreamSql,
}

/// The synopsis that answers `plan`, if one can ([`Route`]): of the synopses over the plan's
/// table whose columns hold its keys and WHERE's columns, the one with the fewest cells.
pub fn route(plan: &Plan, policy: &Policy, parameters: &[Option<String>]) -> Result<Option<Route>> {
    let [table] = plan.tables.as_slice() else {
        return Ok(None);
    };
    if !policy.synopses.values().any(|s| s.table == table.table) {
        return Ok(None);
    }
    if !table.private
        || table.source.is_some()
        || !plan.semijoins.is_empty()
        || plan.grouping_sets.is_some()
        || !plan.unit_caps.is_empty()
        || plan.aggregates.is_empty()
        || !plan.aggregates.iter().all(|a| counts_rows(plan, a))
    {
        return Ok(None);
    }
    let keys: Option<Vec<String>> = plan
        .keys
        .iter()
        .map(|k| {
            plain_column(k.expr.as_str())
                .filter(|(alias, _)| *alias == table.alias)
                .map(|(_, column)| column)
        })
        .collect();
    let Some(keys) = keys else {
        return Ok(None);
    };
    // A WHERE whose parameters do not bind is the per-query path's to refuse.
    let Ok(conjuncts) = bound_conjuncts(plan, parameters) else {
        return Ok(None);
    };
    let mut filtered: Vec<String> = Vec::new();
    for c in &conjuncts {
        match columns_read(c, &table.alias) {
            Some(columns) => filtered.extend(columns),
            None => return Ok(None),
        }
    }
    let covers = |s: &Synopsis| {
        s.table == table.table && keys.iter().chain(&filtered).all(|c| s.column(c).is_some())
    };
    let Some(synopsis) = policy
        .synopses
        .values()
        .filter(|s| covers(s))
        .min_by_key(|s| s.cells())
    else {
        return Ok(None);
    };
    let key_columns = keys
        .iter()
        .map(|k| synopsis.column(k).map(|(i, _)| i))
        .collect::<Option<Vec<usize>>>()
        .ok_or_else(|| Error::internal("a synopsis key outside its columns"))?;
    let cells_sql = if conjuncts.is_empty() {
        None
    } else {
        Some(cells_sql(synopsis, policy, &table.alias, &conjuncts)?)
    };
    Ok(Some(Route {
        synopsis: synopsis.name.clone(),
        key_columns,
        cells_sql,
        histogram: histogram(synopsis, policy, plan)?,
    }))
}

/// Whether `aggregate` counts the rows: `COUNT(*)`, or `COUNT(x)` of an `x` that is never NULL
/// (a `NOT NULL` column upstream, a column the policy declares exhaustive, a constant), which
/// the rewrite releases as the count of rows ([`Plan::not_null`]).
fn counts_rows(plan: &Plan, aggregate: &Aggregate) -> bool {
    match aggregate.kind {
        AggregateKind::CountRows => true,
        AggregateKind::CountValues => aggregate
            .argument
            .as_ref()
            .is_some_and(|a| plan.not_null(a)),
        _ => false,
    }
}

/// The columns of `alias` that `conjunct` reads, if it reads nothing else and no subquery.
fn columns_read(conjunct: &Expr, alias: &str) -> Option<Vec<String>> {
    struct Columns<'a> {
        alias: &'a str,
        found: Vec<String>,
    }
    impl ast::Visitor for Columns<'_> {
        type Break = ();
        fn pre_visit_expr(&mut self, expr: &Expr) -> ControlFlow<()> {
            match expr {
                Expr::CompoundIdentifier(parts) => match parts.as_slice() {
                    [a, c] if a.value == self.alias => {
                        self.found.push(c.value.clone());
                        ControlFlow::Continue(())
                    }
                    _ => ControlFlow::Break(()),
                },
                Expr::Identifier(_)
                | Expr::Subquery(_)
                | Expr::Exists { .. }
                | Expr::InSubquery { .. } => ControlFlow::Break(()),
                _ => ControlFlow::Continue(()),
            }
        }
    }
    let mut visitor = Columns {
        alias,
        found: Vec::new(),
    };
    conjunct
        .visit(&mut visitor)
        .is_continue()
        .then_some(visitor.found)
}

/// The SQL type the synopsis's column `i` is compared as (its policy column's type).
fn column_type(synopsis: &Synopsis, policy: &Policy, i: usize) -> Result<&'static str> {
    let (name, _) = &synopsis.columns[i];
    policy
        .table(&synopsis.table)
        .and_then(|t| t.column(name))
        .map(|c| sql_type(c.ty))
        .ok_or_else(|| Error::internal("a synopsis column outside its table"))
}

/// `CAST('v' AS type)`.
fn literal(value: &str, ty: &'static str) -> Sql {
    sql!(
        "CAST({} AS {})",
        Expr::value(ast::Value::SingleQuotedString(value.to_string())),
        Sql::text(ty)
    )
}

/// `SELECT CAST("alias"."__dp_cell" AS TEXT) FROM (VALUES (0, CAST('CE' AS text), …), …) AS
/// "alias"("__dp_cell", "region", …) WHERE <conjuncts>`: the cells that pass WHERE.
fn cells_sql(
    synopsis: &Synopsis,
    policy: &Policy,
    alias: &str,
    conjuncts: &[Expr],
) -> Result<PublicSql> {
    let types = (0..synopsis.columns.len())
        .map(|i| column_type(synopsis, policy, i))
        .collect::<Result<Vec<_>>>()?;
    let mut rows = Vec::with_capacity(synopsis.cells());
    for cell in 0..synopsis.cells() {
        let values = cell_values(synopsis, cell);
        let mut row = vec![sql!("{}", cell)];
        for (k, &v) in values.iter().enumerate() {
            row.push(literal(&synopsis.columns[k].1[v], types[k]));
        }
        rows.push(sql!("({})", Sql::join(row, ", ")));
    }
    let names = Sql::join(
        synopsis.columns.iter().map(|(c, _)| sql!("{}", Ident(c))),
        ", ",
    );
    let filter = Sql::join(conjuncts.iter().map(|c| sql!("({})", c)), " AND ");
    let text = sql!(
        "SELECT CAST({}.\"__dp_cell\" AS TEXT) FROM (VALUES {}) AS {}(\"__dp_cell\", {}) WHERE {}",
        Ident(alias),
        Sql::join(rows, ", "),
        Ident(alias),
        names,
        filter
    );
    checked(&text.into_string())
}

/// The value index of each column of `cell` (the domain is the columns' product, the last
/// column varying fastest).
pub fn cell_values(synopsis: &Synopsis, cell: usize) -> Vec<usize> {
    let mut rest = cell;
    let mut values = vec![0; synopsis.columns.len()];
    for (k, (_, domain)) in synopsis.columns.iter().enumerate().rev() {
        let n = domain.len().max(1);
        values[k] = rest % n;
        rest /= n;
    }
    values
}

/// The synopsis's private histogram: one row per non-empty cell, its index and its count (as
/// text), each unit's rows counted up to Δ (`rows_per_unit`; the unit's cells in the order of a
/// hash of their index, so which of a unit's rows are left out depends on that unit's rows
/// only). A row whose values are not in the domain is in no cell. Without a privacy unit column
/// (a row-level table), or when the plan knows the unit unique upstream, every row counts.
pub fn histogram(synopsis: &Synopsis, policy: &Policy, plan: &Plan) -> Result<UpstreamSql> {
    let [table] = plan.tables.as_slice() else {
        return Err(Error::internal("a synopsis histogram of a join"));
    };
    let relation = crate::dp::sql::relation(table, |_| {
        Err(Error::internal("a synopsis histogram of a derived table"))
    })?;
    // Σ index(column k) · (cells of the columns after k): NULL when any value is outside.
    let mut cell = Vec::new();
    let mut stride = synopsis.cells();
    for (k, (column, values)) in synopsis.columns.iter().enumerate() {
        stride /= values.len().max(1);
        let ty = column_type(synopsis, policy, k)?;
        let whens = values
            .iter()
            .enumerate()
            .map(|(i, v)| sql!("WHEN {} THEN {}", literal(v, ty), i * stride));
        cell.push(sql!(
            "(CASE {}.{} {} END)",
            Ident(&table.alias),
            Ident(column),
            Sql::join(whens, " ")
        ));
    }
    let cell = Sql::join(cell, " + ");
    let unit = match &plan.unit {
        Unit::Column(c) if !plan.unit_unique && synopsis.rows_per_unit < u64::MAX => Some(c),
        _ => None,
    };
    let text = match unit {
        None => sql!(
            "SELECT CAST(\"__dp_cell\" AS TEXT), CAST(COUNT(*) AS TEXT) FROM (SELECT {} AS \"__dp_cell\" FROM {}) AS \"__dp_cells\" WHERE \"__dp_cell\" IS NOT NULL GROUP BY \"__dp_cell\"",
            cell,
            relation
        ),
        Some(unit) => sql!(
            "SELECT CAST(\"__dp_cell\" AS TEXT), CAST(COUNT(*) AS TEXT) FROM (SELECT \"__dp_cell\", ROW_NUMBER() OVER (PARTITION BY \"__dp_unit\" ORDER BY hashint8(\"__dp_cell\"), \"__dp_cell\") AS \"__dp_rank\" FROM (SELECT {} AS \"__dp_unit\", {} AS \"__dp_cell\" FROM {}) AS \"__dp_rows\" WHERE \"__dp_cell\" IS NOT NULL) AS \"__dp_cells\" WHERE \"__dp_rank\" <= {} GROUP BY \"__dp_cell\"",
            unit,
            cell,
            relation,
            synopsis.rows_per_unit
        ),
    }
    .into_string();
    check_one_statement(&text)?;
    Ok(UpstreamSql {
        text,
        partitionwise: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dp::analyze::{analyze, Context};

    fn policy() -> Policy {
        let text = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/policies/demo.yaml"))
            .to_string()
            + "\nsynopses:\n  people_cube: { table: demo.people, columns: [region, sex, education], epsilon: 1, rounds: 10, accuracy: 50 }\n  sexes: { table: demo.people, columns: [sex], epsilon: 1, rounds: 10, accuracy: 50 }\n";
        crate::policy::parse(&text).expect("policy")
    }

    fn routed(sql: &str) -> Option<Route> {
        let policy = policy();
        let query = match crate::session::classify::classify(sql)
            .expect("parses")
            .pop()
        {
            Some(crate::session::classify::Statement::Query(q)) => q,
            _ => panic!("not a query"),
        };
        let ctx = Context {
            policy: &policy,
            search_path: vec!["demo".to_string()],
        };
        let plan = analyze(&query, &ctx).expect("admitted");
        route(&plan, &policy, &[]).expect("routes")
    }

    #[test]
    fn counts_over_the_columns_are_routed_to_the_smallest_synopsis_that_covers_them() {
        let r = routed("SELECT COUNT(*) FROM demo.people").expect("routed");
        assert_eq!(r.synopsis, "sexes", "the fewest cells");
        assert!(r.cells_sql.is_none());
        let r = routed("SELECT region, COUNT(*) FROM demo.people WHERE sex = 'F' GROUP BY region")
            .expect("routed");
        assert_eq!(
            (r.synopsis.as_str(), r.key_columns.as_slice()),
            ("people_cube", &[0][..])
        );
        let cells = r.cells_sql.expect("WHERE").as_str().to_string();
        assert!(cells.starts_with("SELECT CAST(\"__dp_t0\".\"__dp_cell\" AS TEXT) FROM (VALUES (0, CAST('CE' AS TEXT), CAST('F' AS TEXT), CAST('bachelor' AS TEXT)), (1,"), "{cells}");
        assert!(cells.ends_with(") AS \"__dp_t0\" (\"__dp_cell\", \"region\", \"sex\", \"education\") WHERE (\"__dp_t0\".\"sex\" = $__dp_s0$F$__dp_s0$)"), "{cells}");
        let r = routed("SELECT sex, education, COUNT(*) AS n FROM demo.people GROUP BY 2, 1 ORDER BY n DESC LIMIT 3")
            .expect("routed");
        assert_eq!(r.key_columns, vec![2, 1]);
    }

    #[test]
    fn counts_of_arguments_never_null_are_counts_of_rows() {
        for sql in [
            "SELECT region, COUNT(1) FROM demo.people GROUP BY region",
            "SELECT COUNT(sex) FROM demo.people WHERE region = 'CE'",
            "SELECT COUNT(region), COUNT(*), COUNT('x') FROM demo.people",
        ] {
            assert!(routed(sql).is_some(), "{sql}");
        }
        // COUNT of the unit column once the upstream says it is NOT NULL (the session's facts).
        let policy = policy();
        let sql = "SELECT region, COUNT(person_id) FROM demo.people GROUP BY region";
        let Some(crate::session::classify::Statement::Query(query)) =
            crate::session::classify::classify(sql)
                .expect("parses")
                .pop()
        else {
            panic!("not a query");
        };
        let ctx = Context {
            policy: &policy,
            search_path: vec!["demo".to_string()],
        };
        let mut plan = analyze(&query, &ctx).expect("admitted");
        plan.assume_not_null(&crate::dp::plan::Stated(|_: &(String, String)| true));
        assert!(route(&plan, &policy, &[]).expect("routes").is_some());
    }

    #[test]
    fn other_queries_take_the_per_query_path() {
        for sql in [
            "SELECT AVG(income) FROM demo.people",
            "SELECT COUNT(*), SUM(income) FROM demo.people",
            "SELECT age, COUNT(*) FROM demo.people GROUP BY age",
            "SELECT COUNT(*) FROM demo.people WHERE age > 30",
            "SELECT COUNT(DISTINCT person_id) FROM demo.people",
            "SELECT COUNT(age) FROM demo.people",
            "SELECT COUNT(NULL) FROM demo.people",
            "SELECT region, COUNT(person_id) FROM demo.people GROUP BY region",
            "SELECT COUNT(*) FROM demo.visits",
            "SELECT COUNT(*) FROM demo.people p JOIN demo.visits v ON v.person_id = p.person_id",
            "SELECT region, sex, COUNT(*) FROM demo.people GROUP BY ROLLUP (region, sex)",
            "SELECT COUNT(*) FROM demo.people WHERE person_id IN (SELECT person_id FROM demo.visits)",
        ] {
            assert!(routed(sql).is_none(), "{sql}");
        }
    }

    #[test]
    fn the_histogram_counts_cells_of_the_domain_up_to_each_units_cap() {
        let r = routed("SELECT COUNT(*) FROM demo.people WHERE region = 'CE'").expect("routed");
        let sql = r.histogram.as_str();
        // Analysis alone does not know person_id unique: the cap is applied (Δ = 1).
        assert!(
            sql.contains("ROW_NUMBER() OVER (PARTITION BY \"__dp_unit\""),
            "{sql}"
        );
        assert!(
            sql.contains("WHERE \"__dp_rank\" <= 1 GROUP BY \"__dp_cell\""),
            "{sql}"
        );
        // region's index × 18 (3 sexes × 6 education levels) + sex's × 6 + education's.
        assert!(sql.contains("(CASE \"__dp_t0\".\"region\" WHEN CAST('CE' AS text) THEN 0 WHEN CAST('EA' AS text) THEN 18"), "{sql}");
        assert!(sql.contains("(CASE \"__dp_t0\".\"sex\" WHEN CAST('F' AS text) THEN 0 WHEN CAST('M' AS text) THEN 6"), "{sql}");
        assert!(
            sql.contains("FROM \"demo\".\"people\" AS \"__dp_t0\""),
            "{sql}"
        );
        let policy = policy();
        let s = &policy.synopses["people_cube"];
        assert_eq!(cell_values(s, 18 + 6 + 5), vec![1, 1, 5]);
        assert_eq!(cell_values(s, 179), vec![9, 2, 5]);
    }
}
