//! What a release says about itself beyond its rows: the NOTICE lines on capped statistics,
//! clamped arguments and questions of existence, and EXPLAIN's account of the plan, its
//! mechanisms, their cost and the upstream SQL.
//!
//! Invariant: everything here is a function of the plan, the rewrite and the mechanisms (and,
//! for a detection bound, the number of released cells summed), all public: policy facts and
//! the analyst's SQL, never the data.

use super::*;
/// What the aggregates of a capped query estimate, when the policy's contribution caps can leave
/// rows out: each privacy unit counts with at most `max_rows_per_unit` rows in each of at most
/// `max_groups_per_unit` groups, so a COUNT or SUM is the capped total, below the table's where
/// units have more rows; and the per-unit values of subqueries that the policy's row cap bounds
/// ([`Plan::unit_caps`]); and the bounds its sums, averages and variances clamp their
/// arguments into ([`clamped_arguments`]), which alone bias a query over a table of one row per
/// unit (`AVG(income)`, `corr(income, age)`). `None` when the caps cannot bind (one row and one
/// group per unit, no such per-unit value) and nothing is clamped, or the query has no COUNT or
/// SUM of rows. Policy facts only: nothing here depends on the data.
pub fn capped_statistic(plan: &Plan) -> Option<String> {
    let clamped = clamped_arguments(plan);
    let rows = rows_capped_statistic(plan, &clamped).or_else(|| {
        // Without caps on rows the clamp is the only bias: named on its own.
        (!clamped.is_empty()).then(|| {
            format!(
                "values are clamped into their bounds ({}), so SUM, AVG, variances and the statistics computed from them describe the clamped values, which differ from the table's where values lie outside the bounds",
                clamped.join(", ")
            )
        })
    });
    let units = (!plan.unit_caps.is_empty()).then(|| {
        format!(
            "per-unit values left without a bound are bounded by the policy's cap on rows per unit: {} (write LEAST(…) in the subquery to choose another bound)",
            plan.unit_caps.join(", ")
        )
    });
    match (rows, units) {
        (Some(r), Some(u)) => Some(format!("{r}; {u}")),
        (r, u) => r.or(u),
    }
}

/// The NOTICE of an answer to questions of existence ([`AggregateKind::Detected`]:
/// `bool_or`, `bool_and`, `every`, `EXISTS`): what a detected count is and the largest 95 %
/// noise bound such a count was compared with: over the grouping sets' releases, or, for
/// `measures` derived from finer cells, over the groups' bounds of their summed noises (what
/// [`finish`] compares with). `None` without one. Public facts only: the bound depends on the
/// mechanism and the number of released cells summed, not on the data.
pub fn detection_note(
    plan: &Plan,
    rewrite: &Rewrite,
    mechanisms: &Mechanisms,
    measures: Option<&NoisyMeasures>,
) -> Option<String> {
    let detected = detected_measures(plan, rewrite);
    if detected.is_empty() {
        return None;
    }
    let bound = match measures.and_then(|m| m.derivation.as_ref()) {
        Some(d) => d
            .bounds
            .iter()
            .flat_map(|(bounds95, _)| detected.iter().filter_map(|&i| bounds95.get(i)))
            .copied()
            .filter(|b| b.is_finite())
            .fold(0.0_f64, f64::max),
        None => {
            let releases: Vec<&Mechanisms> = if mechanisms.sets.is_empty() {
                vec![mechanisms]
            } else {
                mechanisms.sets.iter().collect()
            };
            releases
                .iter()
                .flat_map(|m| detected.iter().filter_map(|&i| m.noises.get(i)))
                .filter_map(|n| n.error_bound(0.05).ok())
                .fold(0.0_f64, f64::max)
        }
    };
    Some(format!(
        "pgdp: bool_or, bool_and, every and EXISTS are answered from noisy counts of the rows that meet (or, for bool_and and every, fail) the condition: such a count is taken as nonzero only where it exceeds its 95% noise bound (about {} rows here), which a count of 0 does at most 2.5% of the time; so true from bool_or or EXISTS (false from bool_and) is reliable, while a condition met (failed) by fewer rows than about that reads as not met, and NULL means the rows where the condition is not NULL were not detected either; COUNT(*) FILTER (WHERE …) gives the count itself",
        round_for_message(bound)
    ))
}

/// The measures that questions of existence ([`AggregateKind::Detected`]) test, each once.
fn detected_measures(plan: &Plan, rewrite: &Rewrite) -> Vec<usize> {
    let mut detected: Vec<usize> = plan
        .aggregates
        .iter()
        .zip(&rewrite.aggregate_measures)
        .filter(|(a, _)| a.kind == AggregateKind::Detected)
        .filter_map(|(_, ms)| ms.first().copied())
        .collect();
    detected.sort_unstable();
    detected.dedup();
    detected
}

/// The capped-statistic note of the plan's own caps on rows and groups per unit.
fn rows_capped_statistic(plan: &Plan, clamped: &[String]) -> Option<String> {
    let rows_capped = plan.max_rows_per_unit > 1;
    let groups_capped = plan.max_groups_per_unit > 1 && !plan.keys.is_empty();
    let sums_rows = plan.aggregates.iter().any(|a| {
        matches!(
            a.kind,
            AggregateKind::CountRows
                | AggregateKind::CountValues
                | AggregateKind::CountDistinct
                | AggregateKind::Sum
        )
    });
    if !(rows_capped || groups_capped) || !sums_rows {
        return None;
    }
    let groups = if groups_capped {
        format!(" in each of at most {} group(s)", plan.max_groups_per_unit)
    } else {
        String::new()
    };
    let clamped = if clamped.is_empty() {
        String::new()
    } else {
        format!(" ({})", clamped.join(", "))
    };
    Some(format!(
        "a capped statistic: each privacy unit counts with at most {} row(s){groups} (the policy's caps) and values are clamped into their bounds{clamped}, so COUNT and SUM estimate the capped total, which is below the table's where units have more rows",
        plan.max_rows_per_unit
    ))
}

/// A measure's label in the analyst's terms: the generated table aliases (`"__dp_t0"."age"`)
/// replaced by the table's name (`people.age`), and quotes dropped from plain lower-case names.
/// For display only; the upstream SQL keeps its own text.
pub(super) fn analyst_text(plan: &Plan, label: &str) -> String {
    let mut text = label.to_string();
    for t in &plan.tables {
        let name = t.table.rsplit('.').next().unwrap_or(&t.table);
        text = text.replace(&format!("\"{}\".", t.alias), &format!("{name}."));
    }
    let plain = |s: &str| {
        !s.is_empty()
            && s.chars()
                .next()
                .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
            && s.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
    };
    let mut out = String::new();
    let mut rest = text.as_str();
    while let Some(start) = rest.find('"') {
        out.push_str(&rest[..start]);
        let after = &rest[start + 1..];
        match after.find('"') {
            Some(end) if plain(&after[..end]) => {
                out.push_str(&after[..end]);
                rest = &after[end + 1..];
            }
            _ => {
                out.push('"');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// EXPLAIN: the plan as lines of text, without touching data or budget.
pub fn explain(
    plan: &Plan,
    rewrite: &Rewrite,
    mechanisms: &Mechanisms,
    budget: Budget,
) -> Vec<String> {
    let mut lines = header_lines(plan, rewrite, mechanisms, budget);
    if plan.grouping_sets.is_some() {
        lines.extend(grouping::explain_sets(plan, rewrite, mechanisms).unwrap_or_default());
    }
    lines.extend(measure_lines(plan, rewrite, mechanisms));
    lines.extend(selection_line(plan, rewrite, mechanisms));
    lines.extend(post_processing_lines(plan));
    lines.push("upstream SQL:".into());
    lines.extend(
        sql_lines(rewrite.sql.as_str())
            .into_iter()
            .map(|l| format!("  {l}")),
    );
    lines
}

/// EXPLAIN's first lines: the caps, the cost, how the mechanism and ε were chosen, and notes on
/// the estimates and the groups per unit.
fn header_lines(
    plan: &Plan,
    rewrite: &Rewrite,
    mechanisms: &Mechanisms,
    budget: Budget,
) -> Vec<String> {
    let mut lines = vec![
        format!(
            "DP aggregate: {} group key(s), {} aggregate(s); each privacy unit contributes to at most {} group(s) with at most {} row(s) each",
            plan.keys.len(),
            plan.aggregates.len(),
            plan.max_groups_per_unit,
            plan.max_rows_per_unit
        ),
        match plan.grouping_sets.as_deref() {
            Some(sets) if grouping::derived_set(plan, rewrite).is_some() => format!(
                "cost: {} (mechanism {}; one release, {} grouping set(s) derived from it, below)",
                mechanisms.cost,
                budget.mechanism.name(),
                sets.len()
            ),
            Some(sets) => format!(
                "cost: {} (mechanism {}; the sum of the costs of {} grouping set(s), below)",
                mechanisms.cost,
                budget.mechanism.name(),
                sets.len()
            ),
            None if budget.mechanism == Mechanism::Gaussian => format!(
                "cost: {} (mechanism {}; rho split equally over {} share(s))",
                mechanisms.cost,
                budget.mechanism.name(),
                mechanisms.shares
            ),
            None => format!(
                "cost: {} (mechanism {}; epsilon split over {} share(s) of {:.6})",
                mechanisms.cost,
                budget.mechanism.name(),
                mechanisms.shares,
                mechanisms.epsilon_per_measure
            ),
        },
    ];
    if mechanisms.choice.is_some() && mechanisms.noises.is_empty() {
        // Keys alone: no measure to compare the mechanisms by.
        lines.push(format!(
            "mechanism chosen by pgdp (pgdp.mechanism = auto): {}, as there are no noisy measures to compare by (the keys alone, released by partition selection)",
            budget.mechanism.name()
        ));
    } else if let Some(choice) = mechanisms.choice {
        let mean = |m: Option<f64>| m.map_or("not possible".to_string(), |b| format!("{b:.4}"));
        lines.push(format!(
            "mechanism chosen by pgdp (pgdp.mechanism = auto): {}, the smaller geometric mean of the measures' 95% error bounds (laplace {}, gaussian {})",
            budget.mechanism.name(),
            mean(choice.laplace),
            mean(choice.gaussian)
        ));
    }
    if let Some(target) = mechanisms.max_error {
        lines.push(format!(
            "epsilon chosen for pgdp.max_error = {target}: the smallest (to three digits) at which every measure's 95% error bound is at most {target}"
        ));
    }
    if let Some(note) = capped_statistic(plan) {
        lines.push(format!("estimates: {note}"));
    }
    if let (true, Some(lookup)) = (plan.keys_follow_unit(), plan.unit_lookup()) {
        lines.push(format!(
            "groups per unit: 1: every key is a column of {}, which has one row per unit (its {} is unique upstream)",
            lookup.table, lookup.key.column
        ));
    }
    lines
}

/// EXPLAIN's line for each measure (its noise and 95% bound), and for each released value
/// derived from them with no noise of its own.
fn measure_lines(plan: &Plan, rewrite: &Rewrite, mechanisms: &Mechanisms) -> Vec<String> {
    let mut lines = Vec::new();
    for (j, m) in rewrite.measures.iter().enumerate() {
        if plan.grouping_sets.is_some() {
            break;
        }
        let n = &mechanisms.noises[j];
        let b95 = n
            .error_bound(0.05)
            .map(|b| format!("{b:.4}"))
            .unwrap_or_else(|_| "?".into());
        lines.push(format!(
            "  measure {}: {:?} noise, sensitivity {:.6}, scale {:.6}, 95% error bound ±{b95}",
            analyst_text(plan, &m.label(&rewrite.arguments)),
            n.kind(),
            mechanisms.sensitivities[j],
            n.scale()
        ));
    }
    // Questions of existence (bool_or, bool_and, every, EXISTS): detection tests of counts.
    for j in detected_measures(plan, rewrite) {
        let bound = mechanisms
            .noises
            .get(j)
            .and_then(|n| n.error_bound(0.05).ok())
            .map_or_else(|| "?".to_string(), |b| format!("{b:.4}"));
        lines.push(format!(
            "  question of existence: the noisy {} is taken as nonzero (the condition met) only above its 95% error bound ±{bound}; no noise or epsilon of its own (post-processing)",
            analyst_text(plan, &rewrite.measures[j].label(&rewrite.arguments)),
        ));
    }
    let mut not_null: Vec<&crate::dp::plan::Canonical> = Vec::new();
    for (i, agg) in plan.aggregates.iter().enumerate() {
        let Some(argument) = agg.argument.as_ref() else {
            continue;
        };
        let counted_as_rows = rewrite.aggregate_measures[i]
            .iter()
            .any(|&j| rewrite.measures[j] == crate::dp::rewrite::Measure::Rows);
        if plan.not_null(argument) && counted_as_rows && !not_null.contains(&argument) {
            not_null.push(argument);
        }
    }
    for argument in not_null {
        let why = if plan.not_null_upstream(argument) {
            "the column is NOT NULL upstream"
        } else if argument.is_non_null_literal() {
            "a constant is never NULL"
        } else {
            "the policy declares the column exhaustive (never NULL)"
        };
        lines.push(format!(
            "  count({}) = count(*): {why}, so its values are counted by the count of rows, with no noise or epsilon of its own",
            analyst_text(plan, argument.as_str())
        ));
    }
    let units_as_rows = plan.aggregates.iter().enumerate().any(|(i, agg)| {
        agg.kind == AggregateKind::CountUnits
            && rewrite.aggregate_measures[i]
                .iter()
                .any(|&j| rewrite.measures[j] == crate::dp::rewrite::Measure::Rows)
    });
    if units_as_rows {
        lines.push(
            "  count(distinct unit) = count(*): each privacy unit adds at most one row to one group (max_rows_per_unit = max_groups_per_unit = 1), so the count of rows is the count of units, with no noise or epsilon of its own".to_string(),
        );
    }
    for (i, agg) in plan.aggregates.iter().enumerate() {
        if agg.kind == AggregateKind::Sum && rewrite.aggregate_measures[i].len() == 2 {
            lines.push(format!(
                "  {} = centered sum + midpoint x count: derived from the measures above, no noise or epsilon of its own",
                analyst_text(plan, agg.text.as_str())
            ));
        }
    }
    lines
}

/// EXPLAIN's line on how groups are released: partition selection or public domains.
fn selection_line(plan: &Plan, rewrite: &Rewrite, mechanisms: &Mechanisms) -> Option<String> {
    use crate::dp::mechanism::MechanismKind;
    match (&mechanisms.selection, mechanisms.selection_measure) {
        (Some(s), Some(j)) => Some(format!(
            "  partition selection: keep a group iff its released {} reaches {} ({} thresholding of the released count: no epsilon of its own; delta {})",
            analyst_text(plan, &rewrite.measures[j].label(&rewrite.arguments)),
            s.threshold(),
            match s.kind() {
                MechanismKind::Laplace => "Laplace",
                MechanismKind::Gaussian => "Gaussian",
            },
            s.delta()
        )),
        (Some(s), None) if s.is_optimal_rule() => Some(format!(
            "  partition selection: keep a group of n units with probability p(n), the optimal rule (Desfontaines et al. 2022) at epsilon {:.6} and delta {:.3e} per group: p(1) = {:.3e}, p(n) >= 1/2 from n = {}, p(n) = 1 from n = {} (its own epsilon share, delta {})",
            s.epsilon() / s.max_groups_per_unit() as f64,
            s.delta_per_group(),
            s.keep_probability(1).unwrap_or(0.0),
            s.threshold(),
            s.certain_from().unwrap_or(0),
            s.delta()
        )),
        (Some(s), None) => Some(format!(
            "  partition selection: keep a group iff its noisy count of units ({} scale {:.4}) reaches {} ({}delta {})",
            match s.kind() {
                MechanismKind::Laplace => "Laplace",
                MechanismKind::Gaussian => "Gaussian thresholding,",
            },
            s.scale(),
            s.threshold(),
            match s.kind() {
                MechanismKind::Laplace => "its own epsilon share, ",
                MechanismKind::Gaussian => "its own rho share, ",
            },
            s.delta()
        )),
        _ if plan.grouping_sets.is_some() => None,
        (None, _) if !plan.keys.is_empty() => Some("  group keys: public domains, every value released (missing ones with noisy zeros)".into()),
        (None, _) => None,
    }
}

/// EXPLAIN's lines on what is done to the released rows: HAVING, ORDER BY, LIMIT by pgdp, or
/// the post-processing statement PostgreSQL runs over them.
fn post_processing_lines(plan: &Plan) -> Vec<String> {
    let mut lines = Vec::new();
    if plan.having.is_some() || !plan.order_by.is_empty() || plan.limit.is_some() {
        lines.push("  HAVING / ORDER BY / LIMIT: applied by pgdp to the noisy rows".into());
    }
    if let Some(post) = &plan.post {
        let mut legend: Vec<String> = plan
            .keys
            .iter()
            .enumerate()
            .map(|(i, k)| format!("k{i} = {}", analyst_text(plan, k.expr.as_str())))
            .collect();
        legend.extend(
            plan.aggregates
                .iter()
                .enumerate()
                .map(|(i, a)| format!("a{i} = {}", analyst_text(plan, a.text.as_str()))),
        );
        if plan.grouping_sets.is_some() {
            legend.extend((0..plan.keys.len()).map(|i| format!("g{i} = GROUPING(k{i})")));
        }
        lines.push(format!(
            "  post-processing by PostgreSQL over the released rows ({}), no charge:",
            legend.join(", ")
        ));
        lines.push(format!("    {}", post.sql()));
    }
    lines
}

/// The upstream SQL as readable lines for EXPLAIN: a new line for each CTE and before each
/// `FROM`, `WHERE`, `GROUP BY` and `SELECT` outside literals and quoted names, indented by the
/// parenthesis depth. Only whitespace changes: joining the lines with spaces gives the SQL back.
fn sql_lines(sql: &str) -> Vec<String> {
    const BREAK_BEFORE: [&str; 4] = [" FROM ", " WHERE ", " GROUP BY ", " SELECT "];
    let bytes = sql.as_bytes();
    let mut lines = Vec::new();
    let push = |lines: &mut Vec<String>, text: &str, depth: usize| {
        let text = text.trim();
        if !text.is_empty() {
            lines.push(format!("{}{text}", "  ".repeat(depth)));
        }
    };
    let (mut depth, mut i, mut start, mut start_depth) = (0usize, 0usize, 0usize, 0usize);
    while i < bytes.len() {
        match bytes[i] {
            quote @ (b'\'' | b'"') => {
                i += 1;
                while i < bytes.len() && bytes[i] != quote {
                    i += 1;
                }
                i += 1;
                continue;
            }
            b'$' => {
                // A dollar-quoted literal `$tag$ … $tag$`.
                if let Some(len) = sql[i + 1..].find('$') {
                    let tag = &sql[i..i + len + 2];
                    let word = tag[1..tag.len() - 1]
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_');
                    if let Some(end) = sql[i + tag.len()..].find(tag).filter(|_| word) {
                        i += tag.len() + end + tag.len();
                        continue;
                    }
                }
            }
            b'(' => depth += 1,
            b')' => depth = depth.saturating_sub(1),
            b',' if depth == 0 => {
                push(&mut lines, &sql[start..=i], start_depth);
                i += 1;
                (start, start_depth) = (i, depth);
                continue;
            }
            _ => {}
        }
        if depth <= 1 && BREAK_BEFORE.iter().any(|k| sql[i..].starts_with(k)) {
            push(&mut lines, &sql[start..i], start_depth);
            i += 1;
            (start, start_depth) = (i, depth);
            continue;
        }
        i += 1;
    }
    push(&mut lines, &sql[start.min(sql.len())..], start_depth);
    lines
}

#[cfg(test)]
mod sql_lines_tests {
    use super::sql_lines;

    #[test]
    fn explain_breaks_the_upstream_sql_into_lines_without_changing_it() {
        let sql = "WITH a AS (SELECT x, 'a FROM b' AS y FROM t WHERE z = $q$ GROUP BY $q$ GROUP BY x), b AS (SELECT 1 FROM a) SELECT \"q FROM\" FROM b";
        let lines = sql_lines(sql);
        assert_eq!(
            lines,
            [
                "WITH a AS (SELECT x, 'a FROM b' AS y",
                "  FROM t",
                "  WHERE z = $q$ GROUP BY $q$",
                "  GROUP BY x),",
                "b AS (SELECT 1",
                "  FROM a)",
                "SELECT \"q FROM\"",
                "FROM b",
            ]
        );
        let normalise = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
        assert_eq!(normalise(&lines.join(" ")), normalise(sql));
    }
}
