//! The distributed shape: the single-server statement, written so that Citus plans its per-unit
//! work inside the workers' tasks for distinct counts and quantiles too (docs/scale-out.md,
//! "Citus"). Citus pushes a query over co-located tables grouped by their distribution column
//! into each shard's task; what it cannot push, it plans as a *distributed subplan* whose rows
//! go through the coordinator. A CTE over per-unit rows (`__dp_rows`, or one that reads it, such
//! as `__dp_ranked`) read more than once is one: Citus plans it as a subplan, so every row of
//! stage 1 crossed to the coordinator. [`distributed`] marks each such CTE `NOT MATERIALIZED`,
//! so each reference is inlined and pushed into the tasks like any subquery grouped by the unit.
//! (The other thing that kept them on the coordinator, a scalar subquery in stage 4's select
//! list, with which Citus inlines no CTE at all, is gone from every shape: stage 4 joins the
//! value stages, `super::ending::last_stage`.) Citus then computes stage 4 and each `__dp_dJ`
//! in the tasks (partial aggregates per group, per group and value, or per group and bucket
//! cross to the coordinator) and hash-joins the two on the coordinator, one row per group each.
//!
//! Invariants:
//! - The statement computes the same rows as the one it was made from: PostgreSQL inlines a
//!   `NOT MATERIALIZED` CTE only if it has no volatile function, so every reference reads the
//!   same rows (tests compare the released rows with one server's).
//! - An inlined `__dp_ranked` is evaluated once per reference. Each evaluation ranks a unit's
//!   groups by the same keys (weight, then a 64-bit hash), so they agree unless two groups of one
//!   unit hash alike; even then each evaluation keeps at most the cap of groups per unit, which
//!   is all each measure's sensitivity relies on.
//! - Anything else is left as it is, and [`super::per_unit_stage_on_citus`] says what Citus
//!   pulls.

use std::collections::BTreeMap;
use std::ops::ControlFlow;

use sqlparser::ast::{self, CteAsMaterialized, Statement};
use sqlparser::dialect::PostgreSqlDialect;
use sqlparser::parser::Parser;

use super::ship::{base_tables, table_key, ROWS};
use super::{check_one_statement, Rewrite, UpstreamSql};
use crate::error::{Error, Result};

/// `rewrite` in the distributed shape (see the module documentation). The measures and
/// arguments are unchanged; the statement runs with the session's settings, as on one server.
pub fn distributed(rewrite: Rewrite) -> Result<Rewrite> {
    Ok(Rewrite {
        sql: distributed_sql(&rewrite.sql)?,
        ..rewrite
    })
}

/// `sql` (a statement of the rewrite: an answer's or a contribution histogram's) in the
/// distributed shape.
pub(super) fn distributed_sql(sql: &UpstreamSql) -> Result<UpstreamSql> {
    let text = reshape(sql.as_str())?;
    check_one_statement(&text)?;
    Ok(UpstreamSql {
        text,
        partitionwise: false,
    })
}

fn parse(sql: &str) -> Result<Vec<Statement>> {
    Parser::parse_sql(&PostgreSqlDialect {}, sql)
        .map_err(|e| Error::internal(format!("a rewrite does not parse again: {e}")))
}

/// The text of the distributed shape of the rewrite `sql`.
fn reshape(sql: &str) -> Result<String> {
    let mut statements = parse(sql)?;
    let [Statement::Query(query)] = statements.as_mut_slice() else {
        return Err(Error::internal("a rewrite is not one query"));
    };
    let Some(with) = &query.with else {
        return Ok(sql.to_string());
    };
    if !with.cte_tables.iter().any(|c| c.alias.name.value == ROWS) {
        return Ok(sql.to_string());
    }
    let mut changed = false;
    let over_rows = ctes_over_rows(query);
    let reads = reads(query);
    if let Some(with) = &mut query.with {
        for cte in &mut with.cte_tables {
            let name = cte.alias.name.value.as_str();
            if over_rows.iter().any(|c| c == name) && reads.get(name).copied().unwrap_or(0) > 1 {
                cte.materialized = Some(CteAsMaterialized::NotMaterialized);
                changed = true;
            }
        }
    }
    Ok(if changed {
        query.to_string()
    } else {
        sql.to_string()
    })
}

/// How many times `query` reads each relation (CTEs included), by [`table_key`].
pub(super) fn reads(query: &ast::Query) -> BTreeMap<String, usize> {
    let mut reads: BTreeMap<String, usize> = BTreeMap::new();
    let _ = ast::visit_relations(query, |name| {
        *reads.entry(table_key(name)).or_default() += 1;
        ControlFlow::<()>::Continue(())
    });
    reads
}

/// Whether `name` is a value-level measure's CTE, `__dp_d{j}`.
pub(super) fn is_value_cte(name: &str) -> bool {
    name.strip_prefix("__dp_d")
        .is_some_and(|j| !j.is_empty() && j.bytes().all(|b| b.is_ascii_digit()))
}

/// The CTEs of `query` over per-unit rows: stage 1, and every CTE that reads one of them.
pub(super) fn ctes_over_rows(query: &ast::Query) -> Vec<String> {
    let mut over_rows = vec![ROWS.to_string()];
    if let Some(with) = &query.with {
        for cte in &with.cte_tables {
            if base_tables(&cte.query)
                .iter()
                .any(|t| over_rows.contains(t))
            {
                over_rows.push(cte.alias.name.value.clone());
            }
        }
    }
    over_rows
}

#[cfg(test)]
mod tests {
    use super::*;

    const DISTINCT: &str = "WITH __dp_rows AS (SELECT \"__dp_t0\".\"person_id\" AS __dp_unit, \"__dp_t0\".\"clinic\" AS __dp_k0, \"__dp_t0\".\"diagnosis\" AS __dp_a0 FROM \"demo\".\"visits\" AS \"__dp_t0\"), __dp_per_unit AS (SELECT __dp_unit, __dp_k0, COUNT(__dp_a0) AS __dp_n0 FROM __dp_rows GROUP BY __dp_unit, __dp_k0), __dp_ranked AS (SELECT *, ROW_NUMBER() OVER (PARTITION BY __dp_unit ORDER BY hashtextextended(CAST(__dp_unit AS TEXT) || '|' || COALESCE(CAST(__dp_k0 AS TEXT), '<null>'), 7)) AS __dp_rank FROM __dp_per_unit), __dp_v0 AS (SELECT __dp_unit AS __dp_vu, __dp_k0 AS __dp_vk0, __dp_a0 AS __dp_v, ROW_NUMBER() OVER (PARTITION BY __dp_unit, __dp_k0 ORDER BY hashtextextended(CAST(__dp_unit AS TEXT) || '|' || CAST(__dp_a0 AS TEXT), 7)) AS __dp_vrank FROM (SELECT DISTINCT __dp_unit, __dp_k0, __dp_a0 FROM __dp_rows WHERE __dp_a0 IS NOT NULL) AS __dp_distinct0), __dp_d0 AS (SELECT COUNT(DISTINCT __dp_v) AS __dp_c, __dp_vk0 AS __dp_dk0 FROM __dp_v0 WHERE __dp_vrank <= 10 AND EXISTS (SELECT 1 FROM __dp_ranked WHERE __dp_unit = __dp_vu AND __dp_k0 IS NOT DISTINCT FROM __dp_vk0 AND __dp_rank <= 5) GROUP BY __dp_dk0) SELECT __dp_out.__dp_o0, COALESCE(__dp_d0.__dp_c, 0), __dp_out.__dp_o2 FROM (SELECT __dp_k0, CAST(__dp_k0 AS TEXT) AS __dp_o0, COUNT(*) AS __dp_o2 FROM __dp_ranked WHERE __dp_rank <= 5 GROUP BY __dp_k0) AS __dp_out LEFT JOIN __dp_d0 ON ARRAY[__dp_d0.__dp_dk0] = ARRAY[__dp_out.__dp_k0]";

    #[test]
    fn a_grouped_distinct_count_reads_its_ctes_inlined() {
        let text = reshape(DISTINCT).unwrap();
        // Read twice (stage 2 and the value stage; stage 4 and the value stage's EXISTS):
        // inlined. Read once: left to PostgreSQL (and Citus), which inline it anyway.
        let expected = DISTINCT
            .replace("__dp_rows AS (", "__dp_rows AS NOT MATERIALIZED (")
            .replace("__dp_ranked AS (", "__dp_ranked AS NOT MATERIALIZED (");
        assert_eq!(text, expected);
        assert!(text.contains("__dp_per_unit AS (SELECT"), "{text}");
        assert!(text.contains("__dp_d0 AS (SELECT"), "{text}");
    }

    #[test]
    fn an_ungrouped_quantile_reads_its_rows_inlined() {
        let sql = "WITH __dp_rows AS (SELECT \"__dp_t0\".\"person_id\" AS __dp_unit, \"__dp_t0\".\"cost\" AS __dp_a0 FROM \"demo\".\"visits\" AS \"__dp_t0\"), __dp_per_unit AS (SELECT __dp_unit, COUNT(__dp_a0) AS __dp_n0 FROM __dp_rows GROUP BY __dp_unit), __dp_v0 AS (SELECT __dp_unit AS __dp_vu, __dp_a0 AS __dp_v, ROW_NUMBER() OVER (PARTITION BY __dp_unit ORDER BY __dp_a0) AS __dp_vrank FROM __dp_rows WHERE __dp_a0 IS NOT NULL), __dp_d0 AS (SELECT string_agg(CAST(__dp_v AS TEXT), ',') AS __dp_h FROM __dp_v0 WHERE __dp_vrank <= 10) SELECT COALESCE(__dp_d0.__dp_h, ''), __dp_out.__dp_o1 FROM (SELECT COUNT(*) AS __dp_o1 FROM __dp_per_unit) AS __dp_out LEFT JOIN __dp_d0 ON true";
        assert_eq!(
            reshape(sql).unwrap(),
            sql.replace("__dp_rows AS (", "__dp_rows AS NOT MATERIALIZED (")
        );
    }

    #[test]
    fn a_statement_without_value_stages_is_unchanged() {
        let sql = "WITH __dp_rows AS (SELECT \"__dp_t0\".\"person_id\" AS __dp_unit FROM \"demo\".\"visits\" AS \"__dp_t0\"), __dp_per_unit AS (SELECT __dp_unit, COUNT(*) AS __dp_r0 FROM __dp_rows GROUP BY __dp_unit) SELECT SUM(LEAST(__dp_r0, 10)), COUNT(*) FROM __dp_per_unit";
        assert_eq!(reshape(sql).unwrap(), sql);
        assert_eq!(reshape("SELECT 1").unwrap(), "SELECT 1");
    }
}
