//! The statement of one grouping: the four stages of [`super`] written as one SQL statement
//! (or, for the choice of caps, its contribution histograms instead of stage 4).
//!
//! Invariant: every value the statement aggregates is clamped to its bounds in stage 1 and every
//! unit's contribution is capped in stages 3 and 4, whichever [`Shape`] writes them; the
//! histograms of [`End::Contributions`] count units, never release values.

use super::*;

/// The statement of one grouping, its arguments, its measures and each aggregate's measures.
pub(super) fn statement_ending(
    plan: &Plan,
    parameters: &[Option<String>],
    secret: &str,
    shape: Shape,
    end: End<'_>,
) -> Result<Built> {
    let (arguments, measures, aggregate_measures) = measures(plan);
    // When every row is its own unit, a unit has one row in one group: stage 2 is the identity
    // on that row, stage 3 (which would keep rank 1 ≤ max_groups_per_unit) is skipped, and the
    // caps of stage 4 hold already (docs/privacy.md, "Unique units").
    let flat = (plan.unit_unique || plan.rows_are_units())
        && measures
            .iter()
            .all(|m| !matches!(m, Measure::Distinct(_) | Measure::Quantile(..)));
    // A join to a table with one row per unit: the fast shape aggregates below it (not for the
    // clamp histograms, which read the argument as written in stage 1's rows).
    let clamp_edges = match end {
        End::Contributions(edges) => edges.clamp,
        End::Release => None,
    };
    let below = match shape {
        Shape::Fast if !flat && clamp_edges.is_none() => lookup::split(plan, &arguments, &measures),
        _ => None,
    };
    let rows = rows_stage(plan, parameters, shape, &below, &arguments)?;

    // Stage 2: per unit and group.
    let keys = key_names(0..plan.keys.len());
    // In the lookup form, stage 2 groups by the keys of the rows table only; the lookup's keys
    // join afterwards.
    let below_keys = match &below {
        Some(b) => key_names(b.below_keys.iter().copied()),
        None => keys.clone(),
    };
    let caps = GroupCaps::new(plan, shape, flat, &below, &keys, &measures, secret);
    let stages = Stages {
        keys: &below_keys,
        measures: &measures,
        arguments: &arguments,
        rows_cap: caps.rows_cap,
        excess: clamp_edges.is_some(),
        weighted: caps.weighted,
        allowance: caps.total.is_some(),
    };
    let (per_unit_sql, outer) = match shape {
        Shape::Reference => stages.reference(flat)?,
        Shape::Fast if flat => (None, stages.fast_flat()),
        Shape::Fast => {
            let carried = caps.ranking.as_ref().filter(|_| caps.first_group_only);
            let (per_unit, outer) = stages.fast(carried)?;
            (Some(per_unit), outer)
        }
    };
    let ranked_sql = caps.ranked_stage();
    let Some(per_unit_sql) = per_unit_sql else {
        let statement = match end {
            // Every row its own unit: one row per pair, nothing to choose.
            End::Contributions(..) => Sql::text(""),
            End::Release => unique_unit_statement(rows, outer_items(&keys, outer), keys),
        };
        return Ok((statement, arguments, measures, aggregate_measures));
    };
    let source = if ranked_sql.is_some() {
        sql!(
            "__dp_ranked WHERE __dp_rank <= {}",
            plan.max_groups_per_unit
        )
    } else {
        Sql::text("__dp_per_unit")
    };
    let mut statement = match &below {
        Some(b) => {
            let per_unit = lookup_join(plan, b, parameters)?;
            sql!(
                "WITH __dp_rows AS ({}), __dp_below AS ({}), __dp_per_unit AS ({})",
                rows,
                per_unit_sql,
                per_unit
            )
        }
        None => sql!(
            "WITH __dp_rows AS ({}), __dp_per_unit AS ({})",
            rows,
            per_unit_sql
        ),
    };
    if let Some(r) = &ranked_sql {
        statement.push(sql!(", __dp_ranked AS ({})", r));
    }
    if let End::Contributions(histograms) = end {
        if !measures.contains(&Measure::Rows) {
            return Err(Error::internal(
                "a contribution histogram without a row count",
            ));
        }
        contribution_histograms(&mut statement, histograms, &source, caps.rows_cap);
        return Ok((statement, arguments, measures, aggregate_measures));
    }
    for stage in value_stages(
        &measures,
        &arguments,
        keys.len(),
        secret,
        caps.rows_cap,
        plan.max_groups_per_unit,
    )? {
        statement.push(stage);
    }
    statement.push(last_stage(&keys, &measures, outer, source));
    Ok((statement, arguments, measures, aggregate_measures))
}

/// The names stage 1 gives the keys of these indices (`__dp_k<i>`).
fn key_names(indices: impl Iterator<Item = usize>) -> Vec<Sql> {
    indices.map(|i| sql!("{}", Name("k", i))).collect()
}

/// The fast unique-unit form: every row its own unit, one aggregate over the rows.
fn unique_unit_statement(rows: Sql, outer: Vec<Sql>, keys: Vec<Sql>) -> Sql {
    let mut statement = sql!(
        "WITH __dp_rows AS ({}) SELECT {} FROM __dp_rows",
        rows,
        Sql::join(outer, ", ")
    );
    if !keys.is_empty() {
        statement.push(sql!(" GROUP BY {}", Sql::join(keys, ", ")));
    }
    statement
}

/// The CTEs of the value-level measures (distinct counts, quantiles): each one's histogram per
/// unit and group, capped as the other measures are.
fn value_stages(
    measures: &[Measure],
    arguments: &[Argument],
    keys: usize,
    secret: &str,
    rows_cap: u64,
    groups_cap: u64,
) -> Result<Vec<Sql>> {
    let mut stages = Vec::new();
    for (j, m) in measures.iter().enumerate() {
        let histogram = match m {
            Measure::Distinct(i) => Some((*i, None)),
            Measure::Quantile(i, _) => {
                let b = arguments[*i]
                    .bounds
                    .ok_or_else(|| Error::internal("quantile without bounds"))?;
                Some((*i, Some(b)))
            }
            _ => None,
        };
        if let Some((i, bounds)) = histogram {
            let stage = ValueStage {
                j,
                i,
                keys,
                seed: ranking_seed(secret),
                rows_cap,
                groups_cap,
                row: arguments[i].text.is_row(),
            };
            stages.push(stage.sql(bounds));
        }
    }
    Ok(stages)
}

/// Stage 1, `__dp_rows`: the analyst's FROM, JOIN and WHERE (with its semijoins), projecting
/// the privacy unit, the group keys and the clamped aggregate arguments. In the lookup form,
/// only the rows table and its own conditions.
fn rows_stage(
    plan: &Plan,
    parameters: &[Option<String>],
    shape: Shape,
    below: &Option<lookup::Split>,
    arguments: &[Argument],
) -> Result<Sql> {
    let mut select = vec![match below {
        Some(b) => sql!("{} AS __dp_unit", b.lookup.rows_unit),
        None => sql!("{} AS __dp_unit", plan.unit),
    }];
    for (i, k) in plan.keys.iter().enumerate() {
        if below.as_ref().is_some_and(|b| !b.below_keys.contains(&i)) {
            continue;
        }
        select.push(sql!("{} AS {}", k.expr, Name("k", i)));
    }
    for (i, a) in arguments.iter().enumerate() {
        let value = match &a.bounds {
            Some(b) => clamp(&a.text, b),
            None => sql!("{}", a.text),
        };
        select.push(sql!("{} AS {}", value, Name("a", i)));
        // The fast shape counts a bounded argument's values on the argument itself: PostgreSQL
        // inlines `__dp_rows` into every aggregate that reads it, and `COUNT(__dp_a{i})` would
        // evaluate the guarded clamp once more per row, only to test it for NULL (the clamp is
        // NULL exactly when the argument is).
        if shape == Shape::Fast && a.bounds.is_some() {
            select.push(sql!("{} AS {}", a.text, Name("x", i)));
        }
    }
    let source = |q: &ast::Query| {
        let mut q = q.clone();
        bind_parameters(&mut q, plan, parameters)?;
        Ok(sql!("{}", q))
    };
    let from = match below {
        Some(b) => {
            let rows = plan
                .tables
                .iter()
                .find(|t| t.alias == b.lookup.rows_unit.alias)
                .ok_or_else(|| Error::internal("a lookup join without its rows table"))?;
            from_clause(std::slice::from_ref(rows), &[], source)?
        }
        None => from_clause(&plan.tables, &plan.joins, source)?,
    };
    let mut conditions = Vec::new();
    if let Some(b) = below {
        for c in &b.below_filter {
            let mut c = c.clone();
            bind_parameters(&mut c, plan, parameters)?;
            conditions.push(conjunct(&c));
        }
    } else if let Some(f) = &plan.filter {
        let mut f = f.clone();
        bind_parameters(&mut f, plan, parameters)?;
        // Alone, the filter is sent as it is; beside semijoins, an OR is parenthesised.
        conditions.push(if plan.semijoins.is_empty() {
            sql!("{}", f)
        } else {
            conjunct(&f)
        });
    }
    for s in &plan.semijoins {
        conditions.push(semijoin(s, plan, parameters)?);
    }
    let filter = if conditions.is_empty() {
        Sql::text("")
    } else {
        sql!(" WHERE {}", Sql::join(conditions, " AND "))
    };
    Ok(sql!(
        "SELECT {} FROM {}{}",
        Sql::join(select, ", "),
        from,
        filter
    ))
}

/// How stage 3 keeps at most `max_groups_per_unit` groups of each unit, and the cap on rows
/// stage 4 applies.
struct GroupCaps {
    /// The keyed hash that ranks a unit's groups; none when a unit has one group.
    ranking: Option<Sql>,
    /// Whether a unit's groups with the most rows are kept first.
    weighted: bool,
    /// The total cap on a unit's rows over its kept groups, shared out as allowances.
    total: Option<u64>,
    /// The cap on a unit's rows in one group.
    rows_cap: u64,
    /// Whether stage 3 keeps each unit's one group with `DISTINCT ON` ([`first_group_only`]).
    first_group_only: bool,
}

impl GroupCaps {
    fn new(
        plan: &Plan,
        shape: Shape,
        flat: bool,
        below: &Option<lookup::Split>,
        keys: &[Sql],
        measures: &[Measure],
        secret: &str,
    ) -> GroupCaps {
        let groups_cap = plan.max_groups_per_unit;
        // Stage 3 ranks a unit's groups by a keyed hash of the unit and the keys, after their
        // rows (most first) when a measure grows with the rows: only when the query has keys and
        // a unit may have rows in several groups (in the lookup form, only when the rows table
        // has keys: without them each unit has one row of stage 2, so one group).
        let several_groups = !flat && below.as_ref().is_none_or(|b| !b.below_keys.is_empty());
        let ranking =
            (!keys.is_empty() && several_groups).then(|| ranking_hash(keys, ranking_seed(secret)));
        // Keeping a unit's groups with the most rows drops as few of its rows as the cap
        // allows, for counts and sums of rows. Where each kept group adds the same (counts of
        // units and of distinct values, quantiles) it would gain nothing and only starve the
        // groups that are small for many units (a rare diagnosis beside a common one): the hash
        // alone keeps each of a unit's groups alike.
        let weighted = ranking.is_some()
            && measures.iter().any(|m| {
                matches!(
                    m,
                    Measure::Rows
                        | Measure::Values(_)
                        | Measure::Sum(_)
                        | Measure::SumCentered(_)
                        | Measure::SumSquaresCentered(_)
                )
            });
        // With one group per unit, the fast shape keeps each unit's group of least hash with
        // `DISTINCT ON` instead of numbering them with a window, and its per-unit stage groups
        // by (unit, hash, keys) and carries the hash as `__dp_h`: grouped by sorting, its rows
        // come out in the order `DISTINCT ON` reads, so PostgreSQL sorts once where it sorted
        // twice (a hashed per-unit stage, then the ranking). With more groups per unit the
        // window stays: over a unit-ordered scan (an index on the unit) the ranking's sort is
        // incremental and cheap, and hashing every row instead of every group then costs more
        // than it saves (BENCHMARKS.md, "Issue 18").
        let first_group_only = first_group_only(shape, groups_cap, below);
        // A total cap on a unit's rows over its groups (chosen for the query): with several
        // ranked groups per unit, stage 3 gives each kept group an allowance `__dp_allow` out of
        // the total, which stage 4 caps at instead of `rows_cap`; with one group per unit the
        // total simply lowers the cap.
        let total = plan
            .max_rows_total
            .filter(|_| weighted && groups_cap > 1 && !first_group_only);
        let rows_cap = match plan.max_rows_total {
            Some(t) if total.is_none() => plan.max_rows_per_unit.min(t.max(1)),
            _ => plan.max_rows_per_unit,
        };
        GroupCaps {
            ranking,
            weighted,
            total,
            rows_cap,
            first_group_only,
        }
    }

    /// Stage 3, `__dp_ranked`: at most max_groups_per_unit groups per unit: when `weighted`,
    /// those with the most rows (`__dp_w`), ties broken by the keyed hash; else by the hash
    /// alone. Either is a function of the unit's own rows and the secret.
    fn ranked_stage(&self) -> Option<Sql> {
        let by_rows = if self.weighted { "__dp_w DESC, " } else { "" };
        let hash = self.ranking.clone()?;
        if self.first_group_only {
            return Some(sql!(
                "SELECT DISTINCT ON (__dp_unit) *, 1 AS __dp_rank FROM __dp_per_unit ORDER BY __dp_unit, {}__dp_h",
                Sql::text(by_rows)
            ));
        }
        let order = sql!(
            "PARTITION BY __dp_unit ORDER BY {}{}",
            Sql::text(by_rows),
            hash
        );
        // A kept group's allowance: the cap on rows, or what the groups ranked before it (each
        // at its rows, capped) left of the total, whichever is less; 0 once the total is used
        // up. The rows each kept group then adds, LEAST(rows, allowance), are the greedy fill of
        // the total in rank order, so they add up to at most the total.
        let allowance = match self.total {
            Some(t) => sql!(
                ", LEAST({}, GREATEST({} - COALESCE(SUM(LEAST(__dp_w, {})) OVER ({} ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0), 0)) AS __dp_allow",
                self.rows_cap,
                t,
                self.rows_cap,
                order.clone()
            ),
            None => Sql::text(""),
        };
        Some(sql!(
            "SELECT *, ROW_NUMBER() OVER ({}) AS __dp_rank{} FROM __dp_per_unit",
            order,
            allowance
        ))
    }
}

/// Stage 4's select list: the keys as text, each measure's capped statistic, and the number of
/// rows.
fn outer_items(keys: &[Sql], outer: Vec<Sql>) -> Vec<Sql> {
    let mut items: Vec<Sql> = keys
        .iter()
        .map(|k| sql!("CAST({} AS TEXT)", k))
        .chain(outer)
        .collect();
    items.push(Sql::text("COUNT(*)"));
    items
}

/// Stage 4 over `source` (the kept groups of each unit), grouped by the keys: [`outer_items`].
/// A value-level measure (a distinct count, a quantile) reads its own CTE `__dp_dJ`, one row per
/// group (grouped by its keys `__dp_dkI`, NULLs together) or exactly one row without keys: stage
/// 4's other items are then grouped in a derived table `__dp_out` (as `__dp_oN`, beside the keys)
/// and each `__dp_dJ` is LEFT JOINed to it on `ARRAY[__dp_dJ.__dp_dkI] = ARRAY[__dp_out.__dp_kI]`
/// (`ON true` without keys), its item `COALESCE(__dp_dJ.s, default)` (0 values, or no buckets).
/// `ARRAY[a] = ARRAY[b]` is `a IS NOT DISTINCT FROM b` (array equality compares NULL elements
/// as equal) and hashable, so the join is a hash join of one row per group on each side. Read
/// through a scalar subquery per group (`COALESCE((SELECT s FROM __dp_dJ WHERE __dp_dkI IS NOT
/// DISTINCT FROM __dp_kI …), default)`, the form this replaced), `__dp_dJ` is read once, so
/// PostgreSQL inlined it into the subquery and ran the whole value stage again for every group
/// (over 300 s instead of 3.8 s for the median by diagnosis at scale 1, 11,082 groups:
/// BENCHMARKS.md), and Citus inlined none of the statement's CTEs ([`super::distributed`]).
/// Every group of `__dp_out` is kept once with the value the subquery read, so the rows are the
/// same (`golden::joined_value_stages_give_the_rows_of_scalar_subqueries`).
fn last_stage(keys: &[Sql], measures: &[Measure], outer: Vec<Sql>, source: Sql) -> Sql {
    let grouping = if keys.is_empty() {
        Sql::text("")
    } else {
        sql!(" GROUP BY {}", Sql::join(keys.to_vec(), ", "))
    };
    let values: Vec<(usize, &'static str, &'static str)> = measures
        .iter()
        .enumerate()
        .filter_map(|(j, m)| match m {
            Measure::Distinct(_) => Some((j, "__dp_c", "0")),
            Measure::Quantile(..) => Some((j, "__dp_h", "''")),
            _ => None,
        })
        .collect();
    let items = outer_items(keys, outer);
    if values.is_empty() {
        return sql!(
            " SELECT {} FROM {}{}",
            Sql::join(items, ", "),
            source,
            grouping
        );
    }
    let mut inner = keys.to_vec();
    let mut selected = Vec::with_capacity(items.len());
    for (n, item) in items.into_iter().enumerate() {
        let value = n
            .checked_sub(keys.len())
            .and_then(|j| values.iter().find(|v| v.0 == j));
        match value {
            Some((j, stem, empty)) => selected.push(sql!(
                "COALESCE({}.{}, {})",
                Name("d", *j),
                Sql::text(stem),
                Sql::text(empty)
            )),
            None => {
                inner.push(sql!("{} AS {}", item, Name("o", n)));
                selected.push(sql!("__dp_out.{}", Name("o", n)));
            }
        }
    }
    let joins = values.iter().map(|(j, ..)| {
        let on = if keys.is_empty() {
            Sql::text("true")
        } else {
            Sql::join(
                (0..keys.len()).map(|i| {
                    sql!(
                        "ARRAY[{}.{}] = ARRAY[__dp_out.{}]",
                        Name("d", *j),
                        Name("dk", i),
                        Name("k", i)
                    )
                }),
                " AND ",
            )
        };
        sql!(" LEFT JOIN {} ON {}", Name("d", *j), on)
    });
    sql!(
        " SELECT {} FROM (SELECT {} FROM {}{}) AS __dp_out{}",
        Sql::join(selected, ", "),
        Sql::join(inner, ", "),
        source,
        grouping,
        Sql::join(joins, "")
    )
}

/// In place of stage 4: the histograms the choice of caps reads ([`Histograms`]), each a count
/// of units or of (unit, group) pairs per bucket of the candidate edges.
fn contribution_histograms(
    statement: &mut Sql,
    histograms: &Histograms,
    source: &Sql,
    rows_cap: u64,
) {
    let thresholds = |edges: &[u64]| -> Vec<Sql> {
        edges
            .iter()
            .map(|c| sql!("{}", c.saturating_add(1)))
            .collect()
    };
    let rows = thresholds(histograms.rows);
    statement.push(sql!(
        " SELECT 0 AS __dp_part, width_bucket(__dp_r0, ARRAY[{}]) AS __dp_b, COUNT(*) FROM {} GROUP BY width_bucket(__dp_r0, ARRAY[{}])",
        Sql::join(rows.clone(), ", "),
        source.clone(),
        Sql::join(rows, ", ")
    ));
    if let Some(groups) = histograms.groups {
        // Every group of each unit, before stage 3 keeps at most max_groups_per_unit.
        let groups = thresholds(groups);
        statement.push(sql!(
            " UNION ALL SELECT 1, width_bucket(__dp_g, ARRAY[{}]), COUNT(*) FROM (SELECT __dp_unit, COUNT(*) AS __dp_g FROM __dp_per_unit GROUP BY __dp_unit) AS __dp_groups GROUP BY width_bucket(__dp_g, ARRAY[{}])",
            Sql::join(groups.clone(), ", "),
            Sql::join(groups, ", ")
        ));
    }
    if let Some(totals) = histograms.totals {
        // Each unit's rows over the groups it keeps, at most the cap in each.
        let totals = thresholds(totals);
        statement.push(sql!(
            " UNION ALL SELECT 4, width_bucket(__dp_t, ARRAY[{}]), COUNT(*) FROM (SELECT __dp_unit, CAST(SUM(LEAST(__dp_r0, {})) AS BIGINT) AS __dp_t FROM {} GROUP BY __dp_unit) AS __dp_totals GROUP BY 2",
            Sql::join(totals, ", "),
            rows_cap,
            source.clone()
        ));
    }
    if let Some(clamp) = histograms.clamp {
        // Argument 0 of the counted plan is the clamped one (`contributions`).
        let (e, v) = (Name("e", 0), Name("s", 0));
        let numbers = |edges: &[f64]| -> Sql {
            Sql::join(edges.iter().map(|x| sql!("{}", Number(*x))), ", ")
        };
        if clamp.largest.is_empty() {
            statement.push(sql!(
                " UNION ALL SELECT 2, width_bucket(__dp_x, ARRAY[{}]::numeric[]), COUNT(*) FROM (SELECT __dp_unit, SUM({}) AS __dp_x FROM __dp_per_unit GROUP BY __dp_unit) AS __dp_excess WHERE __dp_x > 0 GROUP BY 2",
                numbers(&clamp.excess),
                e
            ));
        } else {
            // Each unit's largest value as written, over its rows after WHERE.
            statement.push(sql!(
                " UNION ALL SELECT 5, width_bucket(__dp_x, ARRAY[{}]::numeric[]), COUNT(*) FROM (SELECT __dp_unit, CAST(MAX({}) AS numeric) AS __dp_x FROM __dp_rows GROUP BY __dp_unit) AS __dp_largest WHERE __dp_x IS NOT NULL GROUP BY 2",
                numbers(&clamp.largest),
                Name("x", 0)
            ));
        }
        statement.push(sql!(
            " UNION ALL SELECT 3, width_bucket(__dp_x, ARRAY[{}]::numeric[]), COUNT(*) FROM (SELECT __dp_unit, ABS(SUM({})) AS __dp_x FROM __dp_per_unit GROUP BY __dp_unit) AS __dp_sums WHERE __dp_x > 0 GROUP BY 2",
            numbers(&clamp.sums),
            v
        ));
    }
}

/// Whether stage 3 keeps each unit's one group with `DISTINCT ON` (see [`GroupCaps::new`]).
fn first_group_only(shape: Shape, groups_cap: u64, below: &Option<lookup::Split>) -> bool {
    shape == Shape::Fast && groups_cap == 1 && below.is_none()
}
