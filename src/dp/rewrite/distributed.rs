//! The distributed shape: the single-server statement, written so that Citus plans its per-unit
//! work inside the workers' tasks for distinct counts and quantiles too (docs/scale-out.md,
//! "Citus"). Citus pushes a query over co-located tables grouped by their distribution column
//! into each shard's task; what it cannot push, it plans as a *distributed subplan* whose rows
//! go through the coordinator. The single-server text of a distinct count or a quantile has
//! two such things, and [`distributed`] changes only those:
//!
//! 1. A CTE over per-unit rows (`__dp_rows`, or one that reads it, such as `__dp_ranked`) read
//!    more than once: Citus plans it as a subplan, so every row of stage 1 crossed to the
//!    coordinator. Marked `NOT MATERIALIZED`, each reference is inlined and pushed into the tasks
//!    like any subquery grouped by the unit.
//! 2. Stage 4's scalar subqueries of the value-level measures,
//!    `COALESCE((SELECT s FROM __dp_dJ [WHERE __dp_dk0 IS NOT DISTINCT FROM __dp_k0 …]), e)`:
//!    with a subquery in its select list Citus inlines no CTE at all. Stage 4 without them
//!    becomes a derived table `__dp_out` (its other items as `__dp_oN`, its keys `__dp_kI`), and
//!    each such item `COALESCE(__dp_dJ.s, e)` over `__dp_out LEFT JOIN __dp_dJ ON
//!    ARRAY[__dp_dJ.__dp_dkI] = ARRAY[__dp_out.__dp_kI] AND …` (`ON TRUE` without keys). Citus
//!    computes stage 4 and `__dp_dJ` in the tasks (partial aggregates per group, per group and
//!    value, or per group and bucket cross to the coordinator) and joins the two on the
//!    coordinator, one row per group each: a hash join, since `ARRAY[a] = ARRAY[b]` is
//!    `a IS NOT DISTINCT FROM b` (array equality compares NULL elements as equal) and hashable,
//!    where the condition as written is not (a nested loop over groups × groups: 193 s for
//!    11,132 diagnoses at scale 1, against 3.3 s).
//!
//! Invariants:
//! - The statement computes the same rows as the one it was made from. `__dp_out` has one row
//!   per group of stage 4 with its items; `__dp_dJ` is grouped by its keys (NULLs together), or
//!   has exactly one row without keys, so the LEFT JOIN keeps every row of `__dp_out` once and
//!   gives it the row the scalar subquery read (NULL where it found none), and `COALESCE` gives
//!   the same default. PostgreSQL inlines a `NOT MATERIALIZED`
//!   CTE only if it has no volatile function, so every reference reads the same rows (tests
//!   compare the released rows with one server's).
//! - An inlined `__dp_ranked` is evaluated once per reference. Each evaluation ranks a unit's
//!   groups by the same keys (weight, then a 64-bit hash), so they agree unless two groups of one
//!   unit hash alike; even then each evaluation keeps at most the cap of groups per unit, which
//!   is all each measure's sensitivity relies on.
//! - Anything else is left as it is; where a pattern is not found the statement keeps the
//!   single-server text, and [`super::per_unit_stage_on_citus`] says what Citus pulls.

use std::collections::BTreeMap;
use std::ops::ControlFlow;

use sqlparser::ast::{self, CteAsMaterialized, SelectItem, SetExpr, Statement, TableFactor};
use sqlparser::dialect::PostgreSqlDialect;
use sqlparser::parser::Parser;

use super::ship::{base_tables, table_key, ROWS};
use super::{check_one_statement, Rewrite, UpstreamSql};
use crate::error::{Error, Result};

/// `rewrite` in the distributed shape (see the module documentation). The measures and
/// arguments are unchanged; the statement runs with the session's settings, as on one server.
pub fn distributed(rewrite: Rewrite) -> Result<Rewrite> {
    let text = reshape(rewrite.sql.as_str())?;
    check_one_statement(&text)?;
    Ok(Rewrite {
        sql: UpstreamSql {
            text,
            partitionwise: false,
        },
        ..rewrite
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
    let mut changed = joined_value_stages(query)?;
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

/// The value-level CTE `__dp_dJ` that a stage-4 item reads as `COALESCE((SELECT s FROM
/// __dp_dJ [WHERE condition]), default)`: (the CTE's name, `s`, the condition, the default).
fn value_subquery(item: &ast::Expr) -> Option<(String, String, Option<String>, String)> {
    let ast::Expr::Function(f) = item else {
        return None;
    };
    if !f.name.to_string().eq_ignore_ascii_case("coalesce") {
        return None;
    }
    let ast::FunctionArguments::List(list) = &f.args else {
        return None;
    };
    let [ast::FunctionArg::Unnamed(ast::FunctionArgExpr::Expr(ast::Expr::Subquery(sub))), ast::FunctionArg::Unnamed(ast::FunctionArgExpr::Expr(default))] =
        list.args.as_slice()
    else {
        return None;
    };
    let SetExpr::Select(select) = sub.body.as_ref() else {
        return None;
    };
    let [SelectItem::UnnamedExpr(ast::Expr::Identifier(column))] = select.projection.as_slice()
    else {
        return None;
    };
    let [ast::TableWithJoins {
        relation: TableFactor::Table {
            name, alias: None, ..
        },
        joins,
    }] = select.from.as_slice()
    else {
        return None;
    };
    let table = table_key(name);
    if !joins.is_empty()
        || !is_value_cte(&table)
        || sub.with.is_some()
        || select.group_by != no_grouping()
    {
        return None;
    }
    Some((
        table,
        column.value.clone(),
        select.selection.as_ref().map(ToString::to_string),
        default.to_string(),
    ))
}

fn no_grouping() -> ast::GroupByExpr {
    ast::GroupByExpr::Expressions(Vec::new(), Vec::new())
}

/// Change 2 of the module documentation, on the outermost SELECT of `query` when it is stage
/// 4 as the rewrite writes it: one CTE as its source, no join, grouped by the keys `__dp_kI` (or
/// not grouped), no HAVING, ORDER BY or LIMIT. Whether it changed anything.
fn joined_value_stages(query: &mut ast::Query) -> Result<bool> {
    if query.order_by.is_some() || query.limit_clause.is_some() || query.fetch.is_some() {
        return Ok(false);
    }
    let SetExpr::Select(select) = query.body.as_ref() else {
        return Ok(false);
    };
    let [source] = select.from.as_slice() else {
        return Ok(false);
    };
    if !source.joins.is_empty()
        || !matches!(source.relation, TableFactor::Table { .. })
        || select.having.is_some()
        || select.distinct.is_some()
    {
        return Ok(false);
    }
    let ast::GroupByExpr::Expressions(group_by, modifiers) = &select.group_by else {
        return Ok(false);
    };
    let keys: Option<Vec<String>> = group_by
        .iter()
        .enumerate()
        .map(|(i, e)| match e {
            ast::Expr::Identifier(id) if id.value == format!("__dp_k{i}") => Some(id.value.clone()),
            _ => None,
        })
        .collect();
    let Some(keys) = keys else {
        return Ok(false);
    };
    if !modifiers.is_empty() {
        return Ok(false);
    }
    // Each value stage's condition as stage 4 writes it, and the hashable form it becomes:
    // ARRAY[a] = ARRAY[b] is a = b for values and true for two NULLs (array equality compares
    // NULL elements as equal), i.e. a IS NOT DISTINCT FROM b, and it can be a hash join.
    let written = (!keys.is_empty()).then(|| {
        (0..keys.len())
            .map(|i| format!("__dp_dk{i} IS NOT DISTINCT FROM __dp_k{i}"))
            .collect::<Vec<_>>()
            .join(" AND ")
    });
    let hashable = |table: &str| {
        if keys.is_empty() {
            return "TRUE".to_string();
        }
        (0..keys.len())
            .map(|i| format!("ARRAY[{table}.__dp_dk{i}] = ARRAY[__dp_out.__dp_k{i}]"))
            .collect::<Vec<_>>()
            .join(" AND ")
    };
    let mut inner = keys.clone();
    let mut outer = Vec::new();
    let mut joins = Vec::new();
    for (n, item) in select.projection.iter().enumerate() {
        let (expr, alias) = match item {
            SelectItem::UnnamedExpr(e) => (e, None),
            SelectItem::ExprWithAlias { expr, alias } => (expr, Some(alias)),
            _ => return Ok(false),
        };
        let alias = alias.map(|a| format!(" AS {a}")).unwrap_or_default();
        match value_subquery(expr) {
            Some((table, column, condition, default)) => {
                if condition != written {
                    return Ok(false);
                }
                outer.push(format!("COALESCE({table}.{column}, {default}){alias}"));
                joins.push(format!("LEFT JOIN {table} ON {}", hashable(&table)));
            }
            None => {
                inner.push(format!("{expr} AS __dp_o{n}"));
                outer.push(format!("__dp_out.__dp_o{n}{alias}"));
            }
        }
    }
    if joins.is_empty() {
        return Ok(false);
    }
    let selection = select
        .selection
        .as_ref()
        .map(|w| format!(" WHERE {w}"))
        .unwrap_or_default();
    let grouping = if keys.is_empty() {
        String::new()
    } else {
        format!(" GROUP BY {}", keys.join(", "))
    };
    let text = format!(
        "SELECT {} FROM (SELECT {} FROM {source}{selection}{grouping}) AS __dp_out {}",
        outer.join(", "),
        inner.join(", "),
        joins.join(" ")
    );
    let statements = parse(&text)?;
    let [Statement::Query(parsed)] = statements.as_slice() else {
        return Err(Error::internal("joined value stages: not one query"));
    };
    query.body = parsed.body.clone();
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DISTINCT: &str = "WITH __dp_rows AS (SELECT \"__dp_t0\".\"person_id\" AS __dp_unit, \"__dp_t0\".\"clinic\" AS __dp_k0, \"__dp_t0\".\"diagnosis\" AS __dp_a0 FROM \"demo\".\"visits\" AS \"__dp_t0\"), __dp_per_unit AS (SELECT __dp_unit, __dp_k0, COUNT(__dp_a0) AS __dp_n0 FROM __dp_rows GROUP BY __dp_unit, __dp_k0), __dp_ranked AS (SELECT *, ROW_NUMBER() OVER (PARTITION BY __dp_unit ORDER BY hashtextextended(CAST(__dp_unit AS TEXT) || '|' || COALESCE(CAST(__dp_k0 AS TEXT), '<null>'), 7)) AS __dp_rank FROM __dp_per_unit), __dp_v0 AS (SELECT __dp_unit AS __dp_vu, __dp_k0 AS __dp_vk0, __dp_a0 AS __dp_v, ROW_NUMBER() OVER (PARTITION BY __dp_unit, __dp_k0 ORDER BY hashtextextended(CAST(__dp_unit AS TEXT) || '|' || CAST(__dp_a0 AS TEXT), 7)) AS __dp_vrank FROM (SELECT DISTINCT __dp_unit, __dp_k0, __dp_a0 FROM __dp_rows WHERE __dp_a0 IS NOT NULL) AS __dp_distinct0), __dp_d0 AS (SELECT COUNT(DISTINCT __dp_v) AS __dp_c, __dp_vk0 AS __dp_dk0 FROM __dp_v0 WHERE __dp_vrank <= 10 AND EXISTS (SELECT 1 FROM __dp_ranked WHERE __dp_unit = __dp_vu AND __dp_k0 IS NOT DISTINCT FROM __dp_vk0 AND __dp_rank <= 5) GROUP BY __dp_dk0) SELECT CAST(__dp_k0 AS TEXT), COALESCE((SELECT __dp_c FROM __dp_d0 WHERE __dp_dk0 IS NOT DISTINCT FROM __dp_k0), 0), COUNT(*) FROM __dp_ranked WHERE __dp_rank <= 5 GROUP BY __dp_k0";

    #[test]
    fn a_grouped_distinct_count_reads_its_ctes_inlined_and_joins_its_values() {
        let text = reshape(DISTINCT).unwrap();
        assert!(
            text.starts_with("WITH __dp_rows AS NOT MATERIALIZED (SELECT"),
            "{text}"
        );
        assert!(
            text.contains("__dp_ranked AS NOT MATERIALIZED (SELECT"),
            "{text}"
        );
        // Read once: left to PostgreSQL (and Citus), which inline it anyway.
        assert!(text.contains("__dp_per_unit AS (SELECT"), "{text}");
        assert!(text.contains("__dp_d0 AS (SELECT"), "{text}");
        assert!(
            text.ends_with("SELECT __dp_out.__dp_o0, COALESCE(__dp_d0.__dp_c, 0), __dp_out.__dp_o2 FROM (SELECT __dp_k0, CAST(__dp_k0 AS TEXT) AS __dp_o0, COUNT(*) AS __dp_o2 FROM __dp_ranked WHERE __dp_rank <= 5 GROUP BY __dp_k0) AS __dp_out LEFT JOIN __dp_d0 ON ARRAY[__dp_d0.__dp_dk0] = ARRAY[__dp_out.__dp_k0]"),
            "{text}"
        );
        assert!(!text.contains("(SELECT __dp_c"), "{text}");
    }

    #[test]
    fn an_ungrouped_quantile_joins_its_one_row() {
        let sql = "WITH __dp_rows AS (SELECT \"__dp_t0\".\"person_id\" AS __dp_unit, \"__dp_t0\".\"cost\" AS __dp_a0 FROM \"demo\".\"visits\" AS \"__dp_t0\"), __dp_per_unit AS (SELECT __dp_unit, COUNT(__dp_a0) AS __dp_n0 FROM __dp_rows GROUP BY __dp_unit), __dp_v0 AS (SELECT __dp_unit AS __dp_vu, __dp_a0 AS __dp_v, ROW_NUMBER() OVER (PARTITION BY __dp_unit ORDER BY __dp_a0) AS __dp_vrank FROM __dp_rows WHERE __dp_a0 IS NOT NULL), __dp_d0 AS (SELECT string_agg(CAST(__dp_v AS TEXT), ',') AS __dp_h FROM __dp_v0 WHERE __dp_vrank <= 10) SELECT COALESCE((SELECT __dp_h FROM __dp_d0), ''), COUNT(*) FROM __dp_per_unit";
        let text = reshape(sql).unwrap();
        assert!(
            text.starts_with("WITH __dp_rows AS NOT MATERIALIZED"),
            "{text}"
        );
        assert!(
            text.ends_with("SELECT COALESCE(__dp_d0.__dp_h, ''), __dp_out.__dp_o1 FROM (SELECT COUNT(*) AS __dp_o1 FROM __dp_per_unit) AS __dp_out LEFT JOIN __dp_d0 ON true"),
            "{text}"
        );
    }

    #[test]
    fn a_statement_without_value_stages_is_unchanged() {
        let sql = "WITH __dp_rows AS (SELECT \"__dp_t0\".\"person_id\" AS __dp_unit FROM \"demo\".\"visits\" AS \"__dp_t0\"), __dp_per_unit AS (SELECT __dp_unit, COUNT(*) AS __dp_r0 FROM __dp_rows GROUP BY __dp_unit) SELECT SUM(LEAST(__dp_r0, 10)), COUNT(*) FROM __dp_per_unit";
        assert_eq!(reshape(sql).unwrap(), sql);
        assert_eq!(reshape("SELECT 1").unwrap(), "SELECT 1");
    }
}
