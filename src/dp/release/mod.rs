//! Release: noise the exact per-group statistics, select groups, derive the analyst's aggregates
//! from the noisy parts and apply HAVING, ORDER BY and LIMIT to the noisy rows.
//!
//! [`mechanisms`] decides, before anything runs, every mechanism of a query and what it costs;
//! [`measure`] applies them to the upstream's rows ([`NoisyMeasures`]: the released groups and
//! their noisy measures) and [`finish`] computes the analyst's answer from those alone, so the
//! same measures can answer a later query that differs only in post-processing
//! ([`measures_key`]); [`release`] is the two in a row. All are pure (randomness is injected).
//!
//! Invariants:
//! - Every aggregate value that leaves comes from a noisy measure; group keys leave only through
//!   public domains (all released, zero-filled) or DP partition selection.
//! - Everything after the noise (AVG = mean of noisy parts, clamping to bounds, rounding, HAVING,
//!   ORDER BY, LIMIT) is post-processing of noisy values and costs nothing.
//! - No NaN or infinity is ever released; counts are integers ≥ 0.
//! - The query's ε is split equally over its noisy measures and, when needed, partition
//!   selection (docs/privacy.md).

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};

use rand::{CryptoRng, Rng};

use crate::budget::{accountant::zcdp_to_epsilon, Cost, Fixed};
use crate::dp::mechanism::{Noise, PartitionSelection};
use crate::dp::plan::{AggregateKind, Plan, Post, PostOp};
use crate::dp::rewrite::Rewrite;
use crate::error::{Error, Result};
use crate::limits;
use crate::memo::Memo;
use crate::output::{Cell, CellType, OutColumn};
use crate::policy::{ColumnType, Mechanism};

pub mod bounds;
mod choose;
mod clamps;
pub mod derive;
mod explain;
mod grouping;
pub mod measures;
pub mod post;
pub mod rows;
mod statement;

use choose::fixed_ceil;
pub use choose::{
    budget_for_error, mechanisms, selection_measure, Budget, MechanismChoice, Mechanisms,
};
use clamps::clamp_label;
pub use clamps::clamped_arguments;
use explain::analyst_text;
pub use explain::{capped_statistic, detection_note, explain};
pub use grouping::derived_set as derived_grouping_set;
pub use measures::{derived_key, measures_key, NoisyMeasures, SynopsisCount};
pub use rows::{synopsis_histogram, Evaluated, PrivateRows, Released, TextRows};
pub use statement::{ChoiceStatement, Statement, SynopsisStatement};

fn key_cell(text: Option<&str>, ty: ColumnType) -> Cell {
    let Some(t) = text else { return Cell::Null };
    match ty {
        ColumnType::Integer => t
            .parse()
            .map(Cell::Int)
            .unwrap_or_else(|_| Cell::Text(t.to_string())),
        ColumnType::Numeric | ColumnType::Float => t
            .parse::<f64>()
            .ok()
            .filter(|f| f.is_finite())
            .map(Cell::Float)
            .unwrap_or_else(|| Cell::Text(t.to_string())),
        ColumnType::Boolean => Cell::Bool(t == "t" || t == "true"),
        ColumnType::Text | ColumnType::Date | ColumnType::Timestamp => Cell::Text(t.to_string()),
    }
}

fn key_type(ty: ColumnType) -> CellType {
    match ty {
        ColumnType::Integer => CellType::Int8,
        ColumnType::Numeric | ColumnType::Float => CellType::Float8,
        ColumnType::Boolean => CellType::Bool,
        ColumnType::Text | ColumnType::Date | ColumnType::Timestamp => CellType::Text,
    }
}

/// Output columns of a plan, with the types pgdp knows without the shadow catalog: a key
/// column's declared type, an aggregate's [`crate::dp::plan::Aggregate::result`].
///
/// With [`crate::dp::plan::PostProcessing`], the columns of the released relation it reads
/// instead: `k<i>` for each key, `a<i>` for each aggregate (and no error bounds).
pub fn columns(plan: &Plan, accuracy: bool) -> Vec<OutColumn> {
    let mut out = Vec::new();
    if plan.post.is_some() {
        for (i, key) in plan.keys.iter().enumerate() {
            let ty = key.declared.unwrap_or_else(|| key_type(key.ty));
            out.push(OutColumn::new(format!("k{i}"), ty));
        }
        for (i, agg) in plan.aggregates.iter().enumerate() {
            out.push(OutColumn::new(format!("a{i}"), agg.result));
        }
        if plan.grouping_sets.is_some() {
            for i in 0..plan.keys.len() {
                out.push(OutColumn::new(format!("g{i}"), CellType::Int4));
            }
        }
        for i in error_inputs(plan, accuracy) {
            out.push(OutColumn::new(format!("e{i}"), CellType::Float8));
        }
        return out;
    }
    for o in &plan.outputs {
        match o.source {
            crate::dp::plan::OutputSource::Key(i) => {
                let key = &plan.keys[i];
                let ty = key.declared.unwrap_or_else(|| key_type(key.ty));
                out.push(OutColumn::new(o.name.clone(), ty))
            }
            crate::dp::plan::OutputSource::Aggregate(i) => {
                out.push(OutColumn::new(o.name.clone(), plan.aggregates[i].result));
                if accuracy && states_error(plan, i) {
                    out.push(OutColumn::new(
                        format!("{}_error95", o.name),
                        CellType::Float8,
                    ));
                }
            }
            crate::dp::plan::OutputSource::Grouping(_) => {
                out.push(OutColumn::new(o.name.clone(), CellType::Int4))
            }
            crate::dp::plan::OutputSource::Computed(_) => {}
        }
    }
    out
}

/// The aggregates whose 95% error bound the released relation of a plan with post-processing
/// carries (as its column `e<i>`, after the keys, aggregates and groupings): under
/// `pgdp.accuracy`, where the post-processing has `_error95` columns, each aggregate with one.
pub fn error_inputs(plan: &Plan, accuracy: bool) -> Vec<usize> {
    match plan.post() {
        Some(post) if accuracy && post.with_errors().is_some() => (0..plan.aggregates.len())
            .filter(|&i| states_error(plan, i))
            .collect(),
        _ => Vec::new(),
    }
}

/// Whether aggregate `i` has an `_error95` column under `pgdp.accuracy`: every aggregate but a
/// question of existence ([`AggregateKind::Detected`]), whose boolean has no error bound (its
/// NOTICE states the detection bound instead).
fn states_error(plan: &Plan, i: usize) -> bool {
    plan.aggregates
        .get(i)
        .is_some_and(|a| a.kind != AggregateKind::Detected)
}

/// Some cells of one upstream row, as text (a group's keys or its statistics).
/// The output columns of a plan with the types PostgreSQL gives the analyst's SQL: `described`
/// holds, per output of the plan, the type the shadow catalog described (`None` where it could
/// not, or where pgdp cannot release that type). An aggregate keeps pgdp's own type unless the
/// described one is a number; a key takes the described type. With no description (another
/// number of columns), the plan's own types ([`columns`]).
pub fn described_columns(
    plan: &Plan,
    accuracy: bool,
    described: &[Option<CellType>],
) -> Vec<OutColumn> {
    let mut out = columns(plan, accuracy);
    if described.len() != plan.outputs.len() {
        return out;
    }
    let mut at = 0;
    for (o, ty) in plan.outputs.iter().zip(described) {
        let is_aggregate = matches!(o.source, crate::dp::plan::OutputSource::Aggregate(_));
        match ty {
            Some(ty) if !is_aggregate || ty.is_number() => out[at].ty = *ty,
            _ => {}
        }
        let error_column = match o.source {
            crate::dp::plan::OutputSource::Aggregate(i) => accuracy && states_error(plan, i),
            _ => false,
        };
        at += 1 + usize::from(error_column);
    }
    out
}

type Texts<'r> = &'r [Option<String>];

/// The public domain of the keys, in parts ([`crate::dp::rewrite::domain`]): each part's keys and
/// the combinations of their values. Every combination of the parts is released.
pub type PublicDomains = Vec<(Vec<usize>, crate::dp::rewrite::domain::Combinations)>;

/// Noises the upstream rows and post-processes them into the analyst's result: [`measure`],
/// then [`finish`].
pub fn release<R: Rng + CryptoRng + ?Sized>(
    plan: &Plan,
    rewrite: &Rewrite,
    mechanisms: &Mechanisms,
    rows: &PrivateRows,
    public_domains: &PublicDomains,
    accuracy: bool,
    rng: &mut R,
) -> Result<Released> {
    let measures = measure(plan, rewrite, mechanisms, rows, public_domains, rng)?;
    finish(plan, rewrite, mechanisms, &measures, accuracy)
}

/// The mechanisms proper: chooses the released groups (every combination of the public domain,
/// or partition selection over the upstream's candidate groups) and draws the noisy value of
/// every measure of each. The one reader of [`PrivateRows`]; what it returns holds released
/// groups only.
pub fn measure<R: Rng + CryptoRng + ?Sized>(
    plan: &Plan,
    rewrite: &Rewrite,
    mechanisms: &Mechanisms,
    rows: &PrivateRows,
    public_domains: &PublicDomains,
    rng: &mut R,
) -> Result<NoisyMeasures> {
    if plan.grouping_sets.is_some() {
        return grouping::measure(plan, rewrite, mechanisms, rows, public_domains, rng);
    }
    let k = plan.keys.len();
    let m = rewrite.measures.len();
    let expected = k + m + 1;
    // Exact statistics per candidate group, keyed by the key texts: slices of the upstream's
    // rows, so the candidates are held once, not copied (the release of 10^5 groups).
    let mut groups: BTreeMap<Texts<'_>, (Texts<'_>, u64)> = BTreeMap::new();
    for row in &rows.rows {
        if row.len() != expected {
            return Err(Error::internal(
                "upstream returned an unexpected number of columns",
            ));
        }
        let keys = &row[..k];
        let stats = &row[k..k + m];
        let units = row[k + m]
            .as_deref()
            .and_then(|u| u.parse::<u64>().ok())
            .unwrap_or(0);
        groups.insert(keys, (stats, units));
    }

    // Which groups are released, with the selection measure's noisy count when it decided.
    let released_keys: Vec<(Vec<Option<String>>, Option<i128>)> = if k == 0 {
        vec![(Vec::new(), None)]
    } else if let Some(selection) = &mechanisms.selection {
        match mechanisms.selection_measure {
            // Thresholding of the released count (Laplace or Gaussian): drawn once per candidate
            // group, and that same draw is what a kept group releases.
            Some(j) => {
                let mut kept = Vec::new();
                for (keys, (stats, _)) in &groups {
                    let exact: i128 = stats[j]
                        .as_deref()
                        .unwrap_or("0")
                        .parse()
                        .map_err(|_| Error::internal("count is not an integer"))?;
                    let noisy = mechanisms.noises[j].release_integer(rng, exact);
                    if selection.keeps_released(noisy) {
                        kept.push((keys.to_vec(), Some(noisy)));
                    }
                }
                kept
            }
            None => groups
                .iter()
                .filter(|(_, (_, units))| selection.keep(rng, *units))
                .map(|(keys, _)| (keys.to_vec(), None))
                .collect(),
        }
    } else {
        // All public: every combination of the domain, whether present or not.
        let covered: BTreeSet<usize> = public_domains
            .iter()
            .flat_map(|(keys, _)| keys.iter().copied())
            .collect();
        if covered.len() != k || covered.iter().any(|&i| i >= k) {
            return Err(Error::internal("missing public domain"));
        }
        crate::dp::rewrite::domain::combinations(k, public_domains)?
            .into_iter()
            .map(|keys| (keys, None))
            .collect()
    };

    let absent: Vec<Option<String>> = vec![None; m];
    let mut released = Vec::with_capacity(released_keys.len());
    for (keys, selected_count) in released_keys {
        let exact: &[Option<String>] = groups.get(keys.as_slice()).map_or(&absent, |(s, _)| s);
        // Noise every measure of the group (the selection measure was noised when it decided).
        let mut noisy = Vec::with_capacity(m);
        for (j, measure) in rewrite.measures.iter().enumerate() {
            let noise = &mechanisms.noises[j];
            if let (Some(count), true) = (selected_count, mechanisms.selection_measure == Some(j)) {
                noisy.push(count as f64);
                continue;
            }
            if let crate::dp::rewrite::Measure::Quantile(i, permille) = measure {
                // Report-noisy-max over the histogram (crate::dp::mechanism::quantile).
                let histogram =
                    crate::dp::mechanism::parse_histogram(exact[j].as_deref().unwrap_or(""))?;
                let b = rewrite.arguments[*i]
                    .bounds
                    .ok_or_else(|| Error::internal("quantile without bounds"))?;
                let bucket =
                    crate::dp::mechanism::noisy_quantile_bucket(rng, noise, &histogram, *permille);
                noisy.push(crate::dp::mechanism::bucket_value(bucket, b.lower, b.upper));
                continue;
            }
            let text = exact[j].as_deref().unwrap_or("0");
            let value = if measure.is_integer() {
                let e: i128 = text
                    .parse()
                    .map_err(|_| Error::internal("count is not an integer"))?;
                noise.release_integer(rng, e) as f64
            } else {
                noise.release_real(rng, text)?
            };
            noisy.push(value);
        }
        released.push((keys, noisy));
    }
    Ok(NoisyMeasures {
        keys: k,
        measures: m,
        groups: released,
        derivation: None,
    })
}

/// A released row before its output columns are laid out: keys, aggregates, their error bounds
/// and the index of its grouping set (0 without grouping sets).
type OutRow = (Vec<Cell>, Vec<Cell>, Vec<Cell>, usize);

/// Everything after the noise, a function of the noisy measures alone (post-processing, free):
/// the analyst's aggregates derived from them (AVG from a noisy sum and count, clamping,
/// rounding), the `_error95` columns, HAVING, ORDER BY, OFFSET and LIMIT. For a plan with
/// post-processing, the released relation it reads ([`post`]). `measures` are what
/// [`measure`] drew for this plan's rewrite, now or for an earlier query with the same
/// [`measures_key`].
pub fn finish(
    plan: &Plan,
    rewrite: &Rewrite,
    mechanisms: &Mechanisms,
    measures: &NoisyMeasures,
    accuracy: bool,
) -> Result<Released> {
    check_shape(plan, rewrite, mechanisms, measures)?;
    let mut out_rows = group_rows(plan, rewrite, mechanisms, measures, accuracy)?;
    sort_rows(plan, &mut out_rows);
    let start = usize::try_from(plan.offset).unwrap_or(usize::MAX);
    let mut rows_iter: Vec<OutRow> = out_rows.into_iter().skip(start).collect();
    if let Some(l) = plan.limit {
        rows_iter.truncate(usize::try_from(l).unwrap_or(usize::MAX));
    }
    let truncated = rows_iter.len() > limits::GROUPS_RELEASED_MAX;
    rows_iter.truncate(limits::GROUPS_RELEASED_MAX);
    if let Some(share) = mechanisms.max_bias {
        check_bias(plan, mechanisms, share)?;
    }
    if let Some(share) = mechanisms.max_relative_error {
        check_relative_error(plan, &rows_iter, share)?;
    }

    let mut rows_out = Vec::with_capacity(rows_iter.len());
    for row in rows_iter {
        rows_out.push(output_row(plan, accuracy, row)?);
    }
    Ok(Released {
        columns: columns(plan, accuracy),
        rows: rows_out,
        truncated,
    })
}

/// The noisy measures, mechanisms and rewrite of one plan agree in shape.
fn check_shape(
    plan: &Plan,
    rewrite: &Rewrite,
    mechanisms: &Mechanisms,
    measures: &NoisyMeasures,
) -> Result<()> {
    let sets = plan.grouping_sets.as_deref();
    if measures.keys != plan.keys.len() + usize::from(sets.is_some())
        || measures.measures != rewrite.measures.len()
        || mechanisms.noises.len() != rewrite.measures.len()
        || mechanisms.sets.len() != sets.map_or(0, |s| s.len())
    {
        return Err(Error::internal("noisy measures of another shape"));
    }
    // Derived measures state, group by group, the error of the sums they are (derive).
    if let Some(d) = &measures.derivation {
        let m = rewrite.measures.len();
        if d.cells.len() != measures.groups.len()
            || d.bounds.len() != measures.groups.len()
            || d.bounds.iter().any(|(a, b)| a.len() != m || b.len() != m)
        {
            return Err(Error::internal("derived measures of another shape"));
        }
    }
    Ok(())
}

/// Per grouping set (one entry without grouping sets): its 95% bounds, and its 97.5% bounds
/// for aggregates derived from two measures.
fn error_bounds_per_set(mechanisms: &Mechanisms) -> (Vec<Vec<f64>>, Vec<Vec<f64>>) {
    let bounds_of = |m: &Mechanisms, alpha: f64| -> Vec<f64> {
        m.noises
            .iter()
            .map(|n| n.error_bound(alpha).unwrap_or(f64::NAN))
            .collect()
    };
    let bounds_at = |alpha: f64| -> Vec<Vec<f64>> {
        if mechanisms.sets.is_empty() {
            vec![bounds_of(mechanisms, alpha)]
        } else {
            mechanisms
                .sets
                .iter()
                .map(|m| bounds_of(m, alpha))
                .collect()
        }
    };
    (bounds_at(0.05), bounds_at(0.025))
}

/// Each released group's key cells, aggregate values and error bounds, and its grouping set;
/// the groups HAVING removes left out.
fn group_rows(
    plan: &Plan,
    rewrite: &Rewrite,
    mechanisms: &Mechanisms,
    measures: &NoisyMeasures,
    accuracy: bool,
) -> Result<Vec<OutRow>> {
    let sets = plan.grouping_sets.as_deref();
    let (bounds95, bounds975) = error_bounds_per_set(mechanisms);
    let mut out_rows = Vec::new();
    for (g, (all_keys, noisy)) in measures.groups.iter().enumerate() {
        // With grouping sets, the last key text is the group's set.
        let (keys, set) = match sets {
            Some(sets) => (
                &all_keys[..plan.keys.len()],
                grouping::set_of(all_keys, sets.len())?,
            ),
            None => (&all_keys[..], 0),
        };
        let bounds = match &measures.derivation {
            Some(d) => (d.bounds[g].0.as_slice(), d.bounds[g].1.as_slice()),
            None => (bounds95[set].as_slice(), bounds975[set].as_slice()),
        };
        let mut aggregate_values = Vec::with_capacity(plan.aggregates.len());
        for (i, agg) in plan.aggregates.iter().enumerate() {
            let value = derive(
                agg.kind,
                agg.bounds,
                &rewrite.aggregate_measures[i],
                noisy,
                bounds.0,
                mechanisms,
            );
            aggregate_values.push(match value {
                // A sum of integers is an integer (post-processing; conform() does the same
                // for integer result types).
                Cell::Float(x) if agg.integral && agg.kind == AggregateKind::Sum => {
                    Cell::Float(x.round())
                }
                other => other,
            });
        }
        let key_cells: Vec<Cell> = keys
            .iter()
            .zip(&plan.keys)
            .map(|(t, key)| key_cell(t.as_deref(), key.ty))
            .collect();
        if let Some(h) = &plan.having {
            if evaluate(h, &key_cells, &aggregate_values) != Cell::Bool(true) {
                continue;
            }
        }
        let errors: Vec<Cell> = if accuracy || mechanisms.max_relative_error.is_some() {
            (0..plan.aggregates.len())
                .map(|i| error_bound_cell(plan, rewrite, mechanisms, i, bounds, noisy))
                .collect()
        } else {
            Vec::new()
        };
        out_rows.push((key_cells, aggregate_values, errors, set));
    }

    Ok(out_rows)
}

/// ORDER BY on released values (keys order by default, for stable output).
fn sort_rows(plan: &Plan, out_rows: &mut [OutRow]) {
    out_rows.sort_by(|a, b| {
        for s in &plan.order_by {
            let x = evaluate(&s.value, &a.0, &a.1);
            let y = evaluate(&s.value, &b.0, &b.1);
            let ord = compare_cells(&x, &y, s.nulls_first);
            let ord = if s.ascending { ord } else { ord.reverse() };
            if ord != Ordering::Equal {
                return ord;
            }
        }
        for (x, y) in a.0.iter().zip(&b.0) {
            let ord = compare_cells(x, y, false);
            if ord != Ordering::Equal {
                return ord;
            }
        }
        a.3.cmp(&b.3)
    });
}

/// One row as the client receives it: the plan's outputs (with `_error95` columns under
/// pgdp.accuracy), or for a plan with post-processing the released relation it reads.
fn output_row(plan: &Plan, accuracy: bool, row: OutRow) -> Result<Vec<Cell>> {
    let sets = plan.grouping_sets.as_deref();
    let set_keys = |set: usize| -> &[usize] { sets.and_then(|s| s.get(set)).map_or(&[], |s| s) };
    let (key_cells, aggregate_values, errors, set) = row;
    if plan.post.is_some() {
        // The released relation of the post-processing: keys, then aggregates, then with
        // grouping sets whether each key is rolled up (GROUPING of that key).
        let groupings: Vec<Cell> = match sets {
            Some(_) => (0..plan.keys.len())
                .map(|k| Cell::Int(grouping::grouping_value(&[k], set_keys(set))))
                .collect(),
            None => Vec::new(),
        };
        let bounds: Vec<Cell> = error_inputs(plan, accuracy)
            .into_iter()
            .map(|i| errors.get(i).cloned().unwrap_or(Cell::Null))
            .collect();
        return Ok(key_cells
            .into_iter()
            .chain(aggregate_values)
            .chain(groupings)
            .chain(bounds)
            .collect());
    }
    let mut row = Vec::new();
    for o in &plan.outputs {
        match o.source {
            crate::dp::plan::OutputSource::Key(i) => row.push(key_cells[i].clone()),
            crate::dp::plan::OutputSource::Aggregate(i) => {
                row.push(aggregate_values[i].clone());
                if accuracy && states_error(plan, i) {
                    row.push(errors.get(i).cloned().unwrap_or(Cell::Null));
                }
            }
            crate::dp::plan::OutputSource::Grouping(ref args) => {
                row.push(Cell::Int(grouping::grouping_value(args, set_keys(set))))
            }
            crate::dp::plan::OutputSource::Computed(_) => {
                return Err(Error::internal("a computed output without post-processing"))
            }
        }
    }
    Ok(row)
}

/// [`Mechanisms::max_relative_error`]: refuses when a returned cell's stated error exceeds
/// `share` of its value (a value of 0 with any error does: its relative error is unbounded),
/// naming the first such cell with its group and the number of others. Cells without a stated
/// error (quantiles) are not checked.
fn check_relative_error(plan: &Plan, rows: &[OutRow], share: f64) -> Result<()> {
    let mut first = None;
    let mut others = 0usize;
    for (keys, values, errors, _) in rows {
        for (i, (value, error)) in values.iter().zip(errors).enumerate() {
            let number = match value {
                Cell::Int(n) => Some(*n as f64),
                Cell::Float(x) => Some(*x),
                _ => None,
            };
            let (Some(v), Cell::Float(e)) = (number, error) else {
                continue;
            };
            if *e <= share * v.abs() {
                continue;
            }
            if first.is_some() {
                others += 1;
                continue;
            }
            let group: Vec<String> = plan
                .keys
                .iter()
                .zip(keys)
                .map(|(k, c)| {
                    let text = match c {
                        Cell::Null => "NULL".to_string(),
                        Cell::Int(n) => n.to_string(),
                        Cell::Float(x) => x.to_string(),
                        Cell::Text(t) => t.clone(),
                        Cell::Bool(b) => b.to_string(),
                    };
                    format!("{} = {text}", analyst_text(plan, &k.expr.to_string()))
                })
                .collect();
            let relative = if v == 0.0 {
                "of a value of 0".to_string()
            } else {
                format!("{:.0}% of it", 100.0 * e / v.abs())
            };
            first = Some(format!(
                "{}{} is {} ± {} ({relative}, above pgdp.max_relative_error, {}%)",
                analyst_text(plan, &plan.aggregates[i].text),
                if group.is_empty() {
                    String::new()
                } else {
                    format!(" for {}", group.join(", "))
                },
                round_for_message(v),
                round_for_message(*e),
                100.0 * share
            ));
        }
    }
    match first {
        None => Ok(()),
        Some(first) => Err(Error::TooInaccurate {
            detail: if others == 0 {
                first
            } else {
                format!("{first}, and {others} other cell(s)")
            },
        }),
    }
}

/// [`Mechanisms::max_bias`]: refuses when the caps chosen for the query are estimated to remove
/// more than `share` of the rows even at the lower end of the estimate's one-sided 95 %
/// interval (`removed_share_low`, from noisy histograms: post-processing) and the
/// query has a COUNT of rows or values or a SUM, which read every row and are low by that share.
/// Distinct counts, averages and quantiles are not checked (the removed rows are not known to
/// move them).
fn check_bias(plan: &Plan, mechanisms: &Mechanisms, share: f64) -> Result<()> {
    let (removed, at_least) = (mechanisms.removed_share, mechanisms.removed_share_low);
    if at_least.is_nan() || at_least <= share {
        return Ok(());
    }
    let low: Vec<String> = plan
        .aggregates
        .iter()
        .filter(|a| {
            matches!(
                a.kind,
                AggregateKind::CountRows | AggregateKind::CountValues | AggregateKind::Sum
            )
        })
        .map(|a| analyst_text(plan, &a.text))
        .collect();
    if low.is_empty() {
        return Ok(());
    }
    Err(Error::TooBiased {
        detail: format!(
            "the caps on rows and groups per privacy unit chosen for this query are estimated to remove about {} of the rows (at least {} at 95% confidence), so {} {} low by about that share, above pgdp.max_bias ({})",
            bounds::percent(removed),
            bounds::percent(at_least),
            low.join(", "),
            if low.len() == 1 { "is" } else { "are" },
            bounds::percent(share)
        ),
    })
}

/// A released number as a message shows it: three significant digits.
fn round_for_message(x: f64) -> String {
    if x == 0.0 || !x.is_finite() {
        return format!("{x}");
    }
    let digits = (2 - x.abs().log10().floor() as i32).max(0) as usize;
    format!("{x:.digits$}")
}

/// The 95% error bound of an aggregate, where pgdp can state one. For AVG it is approximate:
/// (bound of the centered sum + half-range × bound of the count) / noisy count.
fn error_bound_cell(
    plan: &Plan,
    rewrite: &Rewrite,
    mechanisms: &Mechanisms,
    i: usize,
    (bounds95, bounds975): (&[f64], &[f64]),
    noisy: &[f64],
) -> Cell {
    let ms = &rewrite.aggregate_measures[i];
    let finite = |x: f64| {
        if x.is_finite() {
            Cell::Float(x)
        } else {
            Cell::Null
        }
    };
    match plan.aggregates[i].kind {
        AggregateKind::CountRows
        | AggregateKind::CountValues
        | AggregateKind::CountUnits
        | AggregateKind::CountDistinct
        | AggregateKind::Sum => {
            let aggregate = &plan.aggregates[i];
            let (noise, value) = match (ms.as_slice(), aggregate.bounds) {
                // A derived sum: each part's bound at α/2 (a union bound keeps 95 %).
                ([n, c], Some(b)) => {
                    let mid = (b.lower + b.upper) / 2.0;
                    (
                        bounds975[*c] + mid.abs() * bounds975[*n],
                        noisy[*c] + mid * noisy[*n],
                    )
                }
                _ => (bounds95[ms[0]], noisy[ms[0]]),
            };
            // What a chosen cap removed: a released value v that is (1 − r) of the uncapped
            // one is short by v·r/(1 − r). Rows capped away are rows, not units or distinct
            // values, so only counts of rows or values and sums carry it.
            let r = mechanisms.removed_share.clamp(0.0, 0.99);
            // Clamping removed a share s of a sum's values too: (1 − r)(1 − s) of it is left.
            let s = clamp_share(mechanisms, i);
            let shortfall = match aggregate.kind {
                AggregateKind::CountRows | AggregateKind::CountValues => {
                    value.abs() * r / (1.0 - r)
                }
                AggregateKind::Sum => {
                    let kept = (1.0 - r) * (1.0 - s);
                    value.abs() * (1.0 - kept) / kept
                }
                _ => 0.0,
            };
            finite(noise + shortfall)
        }
        AggregateKind::Avg => {
            let n = noisy[ms[0]].round().max(1.0);
            let h = plan.aggregates[i]
                .bounds
                .map(|b| (b.upper - b.lower) / 2.0)
                .unwrap_or(0.0);
            let bound = (bounds95[ms[1]] + h * bounds95[ms[0]]) / n;
            // A clamped mean is within the bounds, so never further than their width.
            let bound = if mechanisms.clamp_means {
                bound.min(2.0 * h)
            } else {
                bound
            };
            // What clamping the values removed: the mean of the rest is (1 − s) of the whole.
            let s = clamp_share(mechanisms, i);
            let mean = plan.aggregates[i].bounds.map_or(0.0, |b| {
                ((b.lower + b.upper) / 2.0 + noisy[ms[1]] / n).clamp(b.lower, b.upper)
            });
            finite(bound + mean.abs() * s / (1.0 - s))
        }
        _ => Cell::Null,
    }
}

/// The estimated share of aggregate `i`'s argument that clamping removed
/// ([`Mechanisms::clamp_shares`]), in [0, 0.99]; 0 where none was estimated.
fn clamp_share(mechanisms: &Mechanisms, i: usize) -> f64 {
    mechanisms
        .clamp_shares
        .get(i)
        .copied()
        .filter(|s| s.is_finite())
        .unwrap_or(0.0)
        .clamp(0.0, 0.99)
}

/// An aggregate from the noisy measures (post-processing).
fn derive(
    kind: AggregateKind,
    bounds: Option<crate::policy::Bounds>,
    ms: &[usize],
    noisy: &[f64],
    bounds95: &[f64],
    m: &Mechanisms,
) -> Cell {
    let count = |x: f64| Cell::Int(x.round().max(0.0).min(i64::MAX as f64) as i64);
    let real = |x: f64| {
        if x.is_finite() {
            Cell::Float(x)
        } else {
            Cell::Null
        }
    };
    match kind {
        AggregateKind::CountRows
        | AggregateKind::CountValues
        | AggregateKind::CountUnits
        | AggregateKind::CountDistinct => count(noisy[ms[0]]),
        AggregateKind::Quantile { .. } => real(noisy[ms[0]]),
        // A count detected above its noise: its noisy value beyond the noise's 95 % bound (a
        // public number), so a count of 0 reads as detected with probability at most 2.5 %.
        AggregateKind::Detected => Cell::Bool(noisy[ms[0]] > bounds95[ms[0]]),
        AggregateKind::Sum => {
            // Derived from the count and centered sum of AVG's measures when the query has
            // both (rewrite::measures): sum = centered sum + midpoint × count.
            let mut s = match (ms, bounds) {
                ([n, c], Some(b)) => noisy[*c] + (b.lower + b.upper) / 2.0 * noisy[*n],
                _ => noisy[ms[0]],
            };
            if let Some(b) = bounds {
                if b.lower >= 0.0 {
                    s = s.max(0.0);
                }
                if b.upper <= 0.0 {
                    s = s.min(0.0);
                }
            }
            real(s)
        }
        AggregateKind::Avg
        | AggregateKind::VarPop
        | AggregateKind::VarSamp
        | AggregateKind::StddevPop
        | AggregateKind::StddevSamp => {
            let Some(b) = bounds else { return Cell::Null };
            let mid = (b.lower + b.upper) / 2.0;
            let h = (b.upper - b.lower) / 2.0;
            let n = noisy[ms[0]].round().max(1.0);
            if kind == AggregateKind::Avg && !m.clamp_means {
                return real(mid + noisy[ms[1]] / n);
            }
            let mean_c = (noisy[ms[1]] / n).clamp(-h, h);
            if kind == AggregateKind::Avg {
                return real((mid + mean_c).clamp(b.lower, b.upper));
            }
            let q = noisy[ms[2]] / n;
            let var_pop = (q - mean_c * mean_c).clamp(0.0, h * h);
            let var = match kind {
                AggregateKind::VarSamp | AggregateKind::StddevSamp if n > 1.0 => {
                    (var_pop * n / (n - 1.0)).min(4.0 * h * h)
                }
                _ => var_pop,
            };
            match kind {
                AggregateKind::StddevPop | AggregateKind::StddevSamp => real(var.sqrt()),
                _ => real(var),
            }
        }
    }
}

fn as_f64(c: &Cell) -> Option<f64> {
    match c {
        Cell::Int(i) => Some(*i as f64),
        Cell::Float(f) => Some(*f),
        _ => None,
    }
}

fn compare_cells(a: &Cell, b: &Cell, nulls_first: bool) -> Ordering {
    match (a, b) {
        (Cell::Null, Cell::Null) => Ordering::Equal,
        (Cell::Null, _) => {
            if nulls_first {
                Ordering::Less
            } else {
                Ordering::Greater
            }
        }
        (_, Cell::Null) => {
            if nulls_first {
                Ordering::Greater
            } else {
                Ordering::Less
            }
        }
        (Cell::Text(x), Cell::Text(y)) => x.cmp(y),
        (Cell::Bool(x), Cell::Bool(y)) => x.cmp(y),
        _ => match (as_f64(a), as_f64(b)) {
            (Some(x), Some(y)) => x.partial_cmp(&y).unwrap_or(Ordering::Equal),
            _ => Ordering::Equal,
        },
    }
}

/// Evaluates a HAVING / ORDER BY expression on one released row (SQL three-valued logic).
pub fn evaluate(p: &Post, keys: &[Cell], aggregates: &[Cell]) -> Cell {
    match p {
        Post::Aggregate(i) => aggregates.get(*i).cloned().unwrap_or(Cell::Null),
        Post::Key(i) => keys.get(*i).cloned().unwrap_or(Cell::Null),
        Post::Number(n) => Cell::Float(*n),
        Post::Text(t) => Cell::Text(t.clone()),
        Post::Null => Cell::Null,
        Post::Not(x) => match evaluate(x, keys, aggregates) {
            Cell::Bool(b) => Cell::Bool(!b),
            _ => Cell::Null,
        },
        Post::Negate(x) => match as_f64(&evaluate(x, keys, aggregates)) {
            Some(v) => Cell::Float(-v),
            None => Cell::Null,
        },
        Post::IsNull(x, want_null) => {
            Cell::Bool((evaluate(x, keys, aggregates) == Cell::Null) == *want_null)
        }
        Post::Binary(l, op, r) => {
            let a = evaluate(l, keys, aggregates);
            let b = evaluate(r, keys, aggregates);
            match op {
                PostOp::And => match (&a, &b) {
                    (Cell::Bool(false), _) | (_, Cell::Bool(false)) => Cell::Bool(false),
                    (Cell::Bool(true), Cell::Bool(true)) => Cell::Bool(true),
                    _ => Cell::Null,
                },
                PostOp::Or => match (&a, &b) {
                    (Cell::Bool(true), _) | (_, Cell::Bool(true)) => Cell::Bool(true),
                    (Cell::Bool(false), Cell::Bool(false)) => Cell::Bool(false),
                    _ => Cell::Null,
                },
                PostOp::Plus | PostOp::Minus | PostOp::Multiply | PostOp::Divide => {
                    match (as_f64(&a), as_f64(&b)) {
                        (Some(x), Some(y)) => {
                            let v = match op {
                                PostOp::Plus => x + y,
                                PostOp::Minus => x - y,
                                PostOp::Multiply => x * y,
                                _ => {
                                    if y == 0.0 {
                                        return Cell::Null;
                                    }
                                    x / y
                                }
                            };
                            if v.is_finite() {
                                Cell::Float(v)
                            } else {
                                Cell::Null
                            }
                        }
                        _ => Cell::Null,
                    }
                }
                _ => {
                    if a == Cell::Null || b == Cell::Null {
                        return Cell::Null;
                    }
                    let ord = compare_cells(&a, &b, false);
                    Cell::Bool(match op {
                        PostOp::Eq => ord == Ordering::Equal,
                        PostOp::NotEq => ord != Ordering::Equal,
                        PostOp::Lt => ord == Ordering::Less,
                        PostOp::LtEq => ord != Ordering::Greater,
                        PostOp::Gt => ord == Ordering::Greater,
                        _ => ord != Ordering::Less,
                    })
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
