//! Fuzz target: arbitrary SQL text → classify → analyze → rewrite → mechanisms → release.
//!
//! Shared by the cargo-fuzz target `fuzz/fuzz_targets/sql.rs` and the stable smoke test
//! `tests/integration/fuzz_smoke.rs` (which includes this file with `#[path]`), so it uses only pgdp's public
//! API and crates pgdp itself depends on.
//!
//! Invariants checked for every input (a violation panics, which the fuzzer reports):
//! - Nothing panics, whatever the text.
//! - Refusals never carry SQLSTATE XX000 (an internal error is a bug, not a refusal).
//! - Every accepted query's rewrite parses back into exactly one statement that prints the same
//!   SQL again, and names no relation but the policy's tables and pgdp's `__dp_` CTEs.
//! - Every aggregated value is clamped: each `__dp_aN` argument of the `__dp_rows` CTE is
//!   `CASE WHEN … IS NULL THEN NULL ELSE LEAST(GREATEST(…)) END` with finite bounds, and every
//!   measure column of the outer SELECT (or of `__dp_out`, which stage 4 groups in when it joins
//!   a distinct count's or quantile's own stage) is `SUM(LEAST(…))` (capped or clamped per unit).
//! - Every output column is released through a mechanism: an aggregate through at least one
//!   noisy measure with a finite positive sensitivity and scale; a group key through a public
//!   domain or partition selection.
//! - Releasing synthetic upstream rows (derived from the input) never panics and never yields a
//!   NaN or infinite value.

use std::ops::ControlFlow;

use pgdp::dp::analyze::{self, Context, OutputSource, Plan, PublicKeys};
use pgdp::dp::release::{self, Budget, PrivateRows};
use pgdp::dp::rewrite::{self, Measure, Rewrite};
use pgdp::output::Cell;
use pgdp::policy::{ColumnType, Mechanism, Policy};
use pgdp::session::classify::{self, Statement};
use rand::SeedableRng;
use sqlparser::ast::{self, SetExpr};
use sqlparser::dialect::PostgreSqlDialect;
use sqlparser::parser::Parser;

/// The secret keying the per-unit group choice in the rewrite.
const SECRET: &str = "fuzz-secret";

/// The privacy parameters every query is given mechanisms for.
const BUDGETS: [Budget; 2] = [
    Budget {
        epsilon: 1.0,
        delta: 1e-7,
        mechanism: Mechanism::Laplace,
    },
    Budget {
        epsilon: 0.5,
        delta: 1e-6,
        mechanism: Mechanism::Gaussian,
    },
];

/// The demo policy, parsed once.
pub fn demo_policy() -> &'static Policy {
    static POLICY: std::sync::OnceLock<Policy> = std::sync::OnceLock::new();
    POLICY.get_or_init(|| {
        pgdp::policy::parse(include_str!("../../policies/demo.yaml"))
            .unwrap_or_else(|e| panic!("the demo policy is valid: {e}"))
    })
}

/// Runs the target on one input.
pub fn run(data: &[u8]) {
    let Ok(sql) = std::str::from_utf8(data) else {
        return;
    };
    check_sql(sql);
}

/// Runs the target on SQL text.
pub fn check_sql(sql: &str) {
    let statements = match classify::classify(sql) {
        Ok(s) => s,
        Err(e) => {
            assert_not_internal(&e, sql);
            return;
        }
    };
    let policy = demo_policy();
    for statement in statements {
        let query = match statement {
            Statement::Query(q) | Statement::Explain(q) => q,
            _ => continue,
        };
        if pgdp::upstream::catalog::is_catalog_query(&query) {
            continue;
        }
        let ctx = Context {
            policy,
            search_path: vec!["demo".to_string()],
        };
        let plan = match analyze::analyze(&query, &ctx) {
            Ok(p) => p,
            Err(e) => {
                assert_not_internal(&e, sql);
                continue;
            }
        };
        for params in parameter_sets(&plan) {
            let rw = match rewrite::rewrite(&plan, &params, SECRET) {
                Ok(r) => r,
                Err(e) => {
                    assert_not_internal(&e, sql);
                    continue;
                }
            };
            check_rewrite(policy, &plan, &rw, sql);
            for budget in BUDGETS {
                let mechanisms = match release::mechanisms(&plan, &rw, budget) {
                    Ok(m) => m,
                    Err(e) => {
                        assert_not_internal(&e, sql);
                        continue;
                    }
                };
                check_mechanisms(&plan, &rw, &mechanisms, sql);
                let _ = release::explain(&plan, &rw, &mechanisms, budget);
                check_release(&plan, &rw, &mechanisms, sql);
            }
        }
    }
}

fn assert_not_internal(e: &pgdp::Error, sql: &str) {
    assert!(
        e.sqlstate().code() != "XX000",
        "internal error for {sql:?}: {e:?}"
    );
}

/// Parameter values of the right types, and all NULLs.
fn parameter_sets(plan: &Plan) -> Vec<Vec<Option<String>>> {
    let n = plan.parameters().iter().map(|p| p.index).max().unwrap_or(0);
    if n == 0 {
        return vec![Vec::new()];
    }
    let mut typed = vec![Some("1".to_string()); n];
    for p in plan.parameters() {
        let value = match p.ty {
            ColumnType::Integer => "7",
            ColumnType::Numeric | ColumnType::Float => "1.5",
            ColumnType::Text => "it\\'s",
            ColumnType::Date => "2020-01-01",
            ColumnType::Timestamp => "2020-01-01 00:00:00",
            ColumnType::Boolean => "true",
        };
        if let Some(slot) = typed.get_mut(p.index.wrapping_sub(1)) {
            *slot = Some(value.to_string());
        }
    }
    vec![typed, vec![None; n]]
}

fn check_rewrite(policy: &Policy, plan: &Plan, rw: &Rewrite, sql: &str) {
    let statements = Parser::parse_sql(&PostgreSqlDialect {}, &rw.sql)
        .unwrap_or_else(|e| panic!("rewrite of {sql:?} does not parse: {e}\n{}", rw.sql));
    let [statement] = statements.as_slice() else {
        panic!("rewrite of {sql:?} is {} statements", statements.len());
    };
    assert_eq!(
        statement.to_string(),
        rw.sql.as_str(),
        "rewrite of {sql:?} does not round-trip"
    );
    let _ = ast::visit_relations(statement, |name| {
        let parts: Vec<String> = name
            .0
            .iter()
            .filter_map(|p| p.as_ident())
            .map(|i| i.value.clone())
            .collect();
        let ok = match parts.as_slice() {
            [n] => n.starts_with(analyze::RESERVED_PREFIX),
            [s, t] => policy.table(&format!("{s}.{t}")).is_some(),
            _ => false,
        };
        assert!(ok, "rewrite of {sql:?} reads relation {name}");
        ControlFlow::<()>::Continue(())
    });
    let ast::Statement::Query(query) = statement else {
        panic!("rewrite of {sql:?} is not a query");
    };
    check_clamps(query, plan, rw, sql);
}

/// Every argument in `__dp_rows` is clamped, and every measure of the outer SELECT is a capped
/// or clamped sum over units.
fn check_clamps(query: &ast::Query, plan: &Plan, rw: &Rewrite, sql: &str) {
    // Grouping sets: one UNION ALL branch per set, each the full rewrite of that set's plan.
    if let Some(sets) = plan.grouping_sets() {
        fn branches<'q>(body: &'q SetExpr, out: &mut Vec<&'q ast::Select>) {
            match body {
                SetExpr::SetOperation { left, right, .. } => {
                    branches(left, out);
                    branches(right, out);
                }
                SetExpr::Select(select) => out.push(select),
                _ => {}
            }
        }
        let mut selects = Vec::new();
        branches(query.body.as_ref(), &mut selects);
        // Each branch names its set (`<s> AS __dp_set`). Either every set has its branch, in
        // order, or (public keys, additive measures) only the finest set is measured and the
        // others are derived from its cells at the release.
        let set_of = |select: &ast::Select| -> usize {
            match select.projection.first() {
                Some(ast::SelectItem::ExprWithAlias { expr, alias })
                    if alias.value == "__dp_set" =>
                {
                    expr.to_string()
                        .parse()
                        .unwrap_or_else(|_| panic!("{sql:?}: __dp_set is {expr}"))
                }
                _ => panic!("{sql:?}: a grouping set branch without __dp_set"),
            }
        };
        let measured: Vec<usize> = selects.iter().map(|s| set_of(s)).collect();
        let every: Vec<usize> = (0..sets.len()).collect();
        assert!(
            measured == every
                || (measured.len() == 1 && plan.finest_grouping_set() == Some(measured[0])),
            "{sql:?}: branches for sets {measured:?}, expected {every:?} or the finest set alone"
        );
        for (select, s) in selects.into_iter().zip(measured) {
            let Some(ast::TableWithJoins {
                relation: ast::TableFactor::Derived { subquery, .. },
                ..
            }) = select.from.first()
            else {
                panic!("{sql:?}: grouping set {s} is not read from its own rewrite");
            };
            let set_plan = plan
                .grouping_set(s)
                .unwrap_or_else(|| panic!("{sql:?}: no plan for grouping set {s}"));
            check_clamps(subquery, &set_plan, rw, sql);
        }
        return;
    }
    let with = query
        .with
        .as_ref()
        .unwrap_or_else(|| panic!("rewrite of {sql:?} has no WITH"));
    let rows = with
        .cte_tables
        .iter()
        .find(|c| c.alias.name.value == "__dp_rows")
        .unwrap_or_else(|| panic!("rewrite of {sql:?} has no __dp_rows"));
    let SetExpr::Select(select) = rows.query.body.as_ref() else {
        panic!("__dp_rows of {sql:?} is not a SELECT");
    };
    let clamps: std::collections::BTreeMap<String, String> = select
        .projection
        .iter()
        .filter_map(|item| match item {
            ast::SelectItem::ExprWithAlias { expr, alias } => {
                Some((alias.value.clone(), expr.to_string()))
            }
            _ => None,
        })
        .collect();
    // Arguments that are summed (SUM, AVG, the variances) must be clamped; COUNT(x) only
    // counts them.
    for measure in &rw.measures {
        let (Measure::Sum(i) | Measure::SumCentered(i) | Measure::SumSquaresCentered(i)) = measure
        else {
            continue;
        };
        let alias = format!("__dp_a{i}");
        let text = clamps
            .get(&alias)
            .unwrap_or_else(|| panic!("{sql:?}: summed argument {alias} is not in __dp_rows"));
        assert!(
            text.starts_with("CASE WHEN (")
                && text.contains(") IS NULL THEN NULL ELSE LEAST(GREATEST(CAST(")
                && text.ends_with(" END"),
            "argument {alias} of {sql:?} is summed but not clamped: {text}"
        );
        assert!(
            rw.arguments[*i].bounds.is_some(),
            "{sql:?}: summed argument {alias} has no bounds"
        );
    }
    for a in &rw.arguments {
        if let Some(b) = a.bounds {
            assert!(
                b.lower.is_finite() && b.upper.is_finite() && b.lower <= b.upper,
                "{sql:?}: argument {} has bounds {b:?}",
                a.text
            );
        }
    }
    let SetExpr::Select(outer) = query.body.as_ref() else {
        panic!("the outer query of {sql:?} is not a SELECT");
    };
    let k = plan.keys().len();
    let m = rw.measures.len();
    assert_eq!(
        outer.projection.len(),
        k + m + 1,
        "{sql:?}: outer SELECT has {} columns for {k} key(s) and {m} measure(s)",
        outer.projection.len()
    );
    // With a distinct count or a quantile, stage 4's other items are computed in the derived
    // table `__dp_out` (`expr AS __dp_oN`) and read from it (`__dp_out.__dp_oN`).
    let grouped: Vec<(String, String)> = match outer.from.as_slice() {
        [ast::TableWithJoins {
            relation:
                ast::TableFactor::Derived {
                    subquery,
                    alias: Some(alias),
                    ..
                },
            ..
        }] if alias.name.value == "__dp_out" => match subquery.body.as_ref() {
            SetExpr::Select(inner) => inner
                .projection
                .iter()
                .filter_map(|item| match item {
                    ast::SelectItem::ExprWithAlias { expr, alias } => {
                        Some((format!("__dp_out.{alias}"), expr.to_string()))
                    }
                    _ => None,
                })
                .collect(),
            _ => panic!("{sql:?}: __dp_out is not a SELECT"),
        },
        _ => Vec::new(),
    };
    for (j, item) in outer.projection[k..k + m].iter().enumerate() {
        let mut text = item.to_string();
        if let Some((_, expr)) = grouped.iter().find(|(name, _)| *name == text) {
            text = expr.clone();
        }
        let capped = match rw.measures[j] {
            Measure::Units => text.starts_with("COUNT(") || text.starts_with("SUM("),
            // Distinct values are counted in their own stage, where each unit keeps at most
            // max_rows_per_unit values per group (see rewrite::Measure::Distinct).
            Measure::Distinct(_) => {
                text.starts_with("COALESCE(__dp_d") && text.contains(".__dp_c, ")
            }
            // The histogram is built in its own stage, where each unit keeps at most
            // max_rows_per_unit values per group (see rewrite::Measure::Quantile).
            Measure::Quantile(..) => {
                text.starts_with("COALESCE(__dp_d") && text.contains(".__dp_h, ")
            }
            _ => {
                text.starts_with("SUM(LEAST(")
                    || scaled_only_over_the_cap(&text, plan.max_rows_per_unit())
            }
        };
        assert!(
            capped,
            "{sql:?}: measure m{j} is not bounded per unit: {text}"
        );
    }
}

/// Stage 4 of the rewrite's fast shape: a unit with at most `cap` rows adds its per-unit sum (of
/// values, centred values `s - mid * n` or squares), each row clamped to the argument's bounds in the
/// first stage, so it lies within `cap` times the bounds; only a unit with more rows is scaled
/// down and clamped.
fn scaled_only_over_the_cap(text: &str, cap: u64) -> bool {
    let then = format!(" <= {cap} THEN ");
    let small_units = text
        .find(&then)
        .map(|at| &text[at + then.len()..])
        .is_some_and(|rest| rest.starts_with("__dp_") || rest.starts_with("(__dp_"));
    text.starts_with("SUM(CASE WHEN __dp_n")
        && small_units
        && text.contains(" ELSE LEAST(GREATEST(")
}

fn check_mechanisms(plan: &Plan, rw: &Rewrite, m: &release::Mechanisms, sql: &str) {
    assert_eq!(
        m.noises.len(),
        rw.measures.len(),
        "{sql:?}: one noise per measure"
    );
    for (j, noise) in m.noises.iter().enumerate() {
        let s = m.sensitivities[j];
        assert!(
            s.is_finite() && s > 0.0,
            "{sql:?}: measure m{j} sensitivity {s}"
        );
        let contribution = rw.measures[j].contribution(&rw.arguments, plan.max_rows_per_unit());
        assert!(
            s >= contribution,
            "{sql:?}: measure m{j} sensitivity {s} below one group's contribution {contribution}"
        );
        let scale = noise.scale();
        assert!(
            scale.is_finite() && scale > 0.0,
            "{sql:?}: measure m{j} scale {scale}"
        );
    }
    assert_eq!(
        rw.aggregate_measures.len(),
        plan.aggregates().len(),
        "{sql:?}: measures per aggregate"
    );
    for output in plan.outputs() {
        match output.source {
            OutputSource::Aggregate(i) => {
                let ms = &rw.aggregate_measures[i];
                assert!(
                    !ms.is_empty() && ms.iter().all(|&j| j < rw.measures.len()),
                    "{sql:?}: output {} is released through no measure",
                    output.name
                );
            }
            OutputSource::Key(i) => {
                let key = &plan.keys()[i];
                assert!(
                    key.public != PublicKeys::No || m.selection.is_some(),
                    "{sql:?}: key {} is neither public nor selected",
                    key.expr
                );
            }
            OutputSource::Grouping(ref keys) => {
                assert!(
                    plan.grouping_sets().is_some()
                        && !keys.is_empty()
                        && keys.iter().all(|&k| k < plan.keys().len()),
                    "{sql:?}: GROUPING({keys:?}) without grouping sets or over a non-key"
                );
            }
            OutputSource::Computed(_) => {
                let post = plan.post().unwrap_or_else(|| {
                    panic!("{sql:?}: a computed output without post-processing")
                });
                // Post-processing reads the released relation only, never a table of the query.
                assert!(
                    !post.sql().contains("\"__dp_t"),
                    "{sql:?}: post-processing names a table of the query: {}",
                    post.sql()
                );
            }
        }
    }
}

/// Releases a few synthetic groups derived from the query text.
fn check_release(plan: &Plan, rw: &Rewrite, m: &release::Mechanisms, sql: &str) {
    let mut seed = [0u8; 32];
    for (i, b) in sql.bytes().enumerate() {
        seed[i % 32] = seed[i % 32].wrapping_mul(31).wrapping_add(b);
    }
    let mut rng = rand::rngs::ChaCha20Rng::from_seed(seed);
    // Public domains, with synthetic rows standing in for what public tables would return.
    let mut domains = release::PublicDomains::new();
    if plan.keys_public() {
        let Ok(parts) = pgdp::dp::rewrite::domain::public_domain(plan, &[]) else {
            return;
        };
        for part in parts {
            let rows = part.sql().map(|_| {
                (0..2)
                    .map(|r| {
                        (0..part.keys.len())
                            .map(|_| Some(r.to_string()))
                            .collect::<Vec<_>>()
                    })
                    .collect::<Vec<_>>()
            });
            match part.into_combinations(rows) {
                Ok(d) => domains.push(d),
                Err(_) => return,
            }
        }
    }
    let mut per_key: std::collections::BTreeMap<usize, Vec<Option<String>>> = Default::default();
    for (keys, combinations) in &domains {
        for (position, &key) in keys.iter().enumerate() {
            per_key.insert(
                key,
                combinations.iter().map(|c| c[position].clone()).collect(),
            );
        }
    }
    let values = [
        "0",
        "1",
        "-3",
        "12345678901234567890",
        "0.5",
        "-0.25",
        "99999999999999999999.125",
    ];
    let mut rows = Vec::new();
    for g in 0..3usize {
        let mut row: Vec<Option<String>> = (0..plan.keys().len())
            .map(|i| {
                per_key
                    .get(&i)
                    .and_then(|d| d.get(g % d.len().max(1)).cloned().flatten())
                    .or_else(|| (g != 2).then(|| format!("k{g}")))
            })
            .collect();
        for (j, measure) in rw.measures.iter().enumerate() {
            let v = values[(g * 3 + j) % values.len()];
            let v = if measure.is_integer() {
                v.split('.').next().unwrap_or("0").to_string()
            } else {
                v.to_string()
            };
            row.push(Some(v));
        }
        row.push(Some(format!("{}", 200 * g + 1)));
        // With grouping sets, each upstream row starts with its set's index.
        if let Some(sets) = plan.grouping_sets() {
            row.insert(0, Some((g % sets.len().max(1)).to_string()));
        }
        rows.push(row);
    }
    if let Ok(released) = release::release(
        plan,
        rw,
        m,
        &PrivateRows::new(rows),
        &domains,
        true,
        &mut rng,
    ) {
        let finite = released
            .rows()
            .iter()
            .flatten()
            .all(|c| !matches!(c, Cell::Float(f) if !f.is_finite()));
        assert!(finite, "{sql:?}: a released value is not finite");
    }
}
