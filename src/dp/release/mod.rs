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
mod clamps;
pub mod derive;
mod grouping;
pub mod measures;
pub mod post;
pub mod rows;
mod statement;

use clamps::clamp_label;
pub use clamps::clamped_arguments;
pub use grouping::derived_set as derived_grouping_set;
pub use measures::{derived_key, measures_key, NoisyMeasures};
pub use rows::{PrivateRows, Released, TextRows};
pub use statement::{ChoiceStatement, Statement};

/// Privacy parameters of one query (from the session settings).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Budget {
    /// ε of the whole query.
    pub epsilon: f64,
    /// δ the query may spend (partition selection, Gaussian conversion).
    pub delta: f64,
    /// Noise family.
    pub mechanism: Mechanism,
}

/// The mechanisms of one query and their total cost.
#[derive(Debug, Clone)]
pub struct Mechanisms {
    /// One noise per measure, in the rewrite's order.
    pub noises: Vec<Noise>,
    /// Partition selection, when some key is not public.
    pub selection: Option<PartitionSelection>,
    /// The measure whose released noisy count partition selection thresholds, when there is
    /// one (see [`selection_measure`]); `None` when selection draws a count of units of its own.
    pub selection_measure: Option<usize>,
    /// What the query costs, charged before it runs.
    pub cost: Cost,
    /// ε share of each measure.
    pub epsilon_per_measure: f64,
    /// How many equal shares ε is split into: one per measure, and one for partition selection
    /// when it draws a count of its own.
    pub shares: usize,
    /// L1 (Laplace) or L2 (Gaussian) sensitivity of each measure.
    pub sensitivities: Vec<f64>,
    /// The privacy parameters these mechanisms spend.
    pub budget: Budget,
    /// `pgdp.max_error` when it chose `budget.epsilon` ([`budget_for_error`]).
    pub max_error: Option<f64>,
    /// `pgdp.clamp_means`: whether a released mean (`AVG`) is clamped into its argument's
    /// bounds (the default: never outside them, but biased toward the middle for a small
    /// group whose noise reaches a bound), or released as the plain ratio of its noisy
    /// measures, unbiased in the noisy sum. Post-processing either way: it changes neither the
    /// cost nor what the noise depends on.
    pub clamp_means: bool,
    /// The estimated share of the rows that a cap chosen for this query removed
    /// ([`bounds::ChosenBounds::rows_removed_share`], a noisy estimate, post-processing): the
    /// `_error95` of a COUNT or SUM adds the shortfall it implies, so that it states the
    /// distance to the uncapped answer as far as pgdp can estimate it. 0 under the policy's caps.
    pub removed_share: f64,
    /// Per aggregate of the plan (empty: none), the estimated share of its argument's sum that
    /// clamping into the bounds removed ([`bounds::ClampEstimate::share`], a noisy estimate,
    /// post-processing): the `_error95` of a SUM or AVG of it adds the shortfall it implies.
    pub clamp_shares: Vec<f64>,
    /// `pgdp.max_relative_error`: when set, [`finish`] refuses an answer in which a returned
    /// cell's stated error (its `_error95`) exceeds this share of its value
    /// ([`Error::TooInaccurate`]). Post-processing of the noisy measures.
    pub max_relative_error: Option<f64>,
    /// With grouping sets, the mechanisms of each set's release, in the plan's order (the
    /// fields above are then the first set's, but `cost`, `shares` and `budget` the whole
    /// query's); empty otherwise.
    pub sets: Vec<Mechanisms>,
    /// Under `pgdp.mechanism = 'auto'`, why `budget.mechanism` was chosen (for EXPLAIN);
    /// `None` when the analyst or the policy named the mechanism.
    pub choice: Option<MechanismChoice>,
}

/// How [`mechanisms`] chose the noise under [`Mechanism::Auto`]: the geometric mean over the
/// query's measures of each candidate's stated 95 % error bound (`None` where that mechanism
/// cannot release the query, e.g. Gaussian with δ = 0 or a quantile).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MechanismChoice {
    /// The geometric mean of the Laplace bounds.
    pub laplace: Option<f64>,
    /// The geometric mean of the Gaussian bounds.
    pub gaussian: Option<f64>,
}

/// The geometric mean of the stated 95 % error bounds of every measure of `m` (of every set's,
/// with grouping sets): the measures have different units (counts, sums of money), so each
/// counts by its ratio, not by its size.
fn mean_error_bound(m: &Mechanisms) -> f64 {
    let noises: Vec<&Noise> = if m.sets.is_empty() {
        m.noises.iter().collect()
    } else {
        m.sets.iter().flat_map(|s| s.noises.iter()).collect()
    };
    if noises.is_empty() {
        return f64::INFINITY;
    }
    let log_sum: f64 = noises
        .iter()
        .map(|n| n.error_bound(0.05).unwrap_or(f64::INFINITY).max(0.5).ln())
        .sum();
    (log_sum / noises.len() as f64).exp()
}

/// [`Mechanism::Auto`]: the mechanisms of the query under Laplace and under Gaussian noise at
/// the same (ε, δ), and the one whose measures have the smaller geometric mean of stated 95 %
/// error bounds (Laplace on a tie, or when Gaussian cannot release the query). Both candidates
/// are valid mechanisms at the session's (ε, δ) and the choice depends on the plan and the
/// budget only, never on the data, so choosing costs nothing; the charge is the chosen one's.
fn choose_mechanism(plan: &Plan, rewrite: &Rewrite, budget: Budget) -> Result<Mechanisms> {
    let with = |mechanism| Budget {
        mechanism,
        ..budget
    };
    let laplace = mechanisms(plan, rewrite, with(Mechanism::Laplace));
    let gaussian = mechanisms(plan, rewrite, with(Mechanism::Gaussian)).ok();
    let choice = MechanismChoice {
        laplace: laplace.as_ref().ok().map(mean_error_bound),
        gaussian: gaussian.as_ref().map(mean_error_bound),
    };
    let chosen = match (laplace, gaussian) {
        (Ok(l), Some(g)) if mean_error_bound(&g) < mean_error_bound(&l) => g,
        (Ok(l), _) => l,
        (Err(_), Some(g)) => g,
        (Err(e), None) => return Err(e),
    };
    Ok(Mechanisms {
        choice: Some(choice),
        ..chosen
    })
}

/// Relative margin on the charged ρ of the Gaussian measures: the per-measure ρ is a float
/// quotient, so their float sum may exceed the total by a few ulps.
const RHO_SUM_MARGIN: f64 = 1e-12;

fn fixed_ceil(x: f64) -> Result<Fixed> {
    Fixed::from_f64_ceil(x).map_err(|_| Error::InvalidMechanism {
        reason: format!("cost {x} is not representable"),
    })
}

/// The ρ whose CKS20 conversion at `delta` is at most `epsilon` (bisection, rounded down),
/// remembered per (ε, δ): the bisection converts a ρ to ε a hundred times and more, each
/// conversion a bisection of its own (~0.2 ms of CPU, most of a small query's time in pgdp under
/// `auto`), while a policy's queries ask for a handful of pairs ([`crate::memo`]).
fn rho_for(epsilon: f64, delta: f64) -> Result<f64> {
    static MEMO: Memo<(u64, u64), f64> = Memo::new(limits::RHO_FOR_CACHED_MAX);
    MEMO.get_or_try((epsilon.to_bits(), delta.to_bits()), || {
        rho_by_bisection(epsilon, delta)
    })
}

/// [`rho_for`] itself.
fn rho_by_bisection(epsilon: f64, delta: f64) -> Result<f64> {
    let delta_fixed = Fixed::from_f64_floor(delta).map_err(|_| Error::InvalidMechanism {
        reason: "delta".into(),
    })?;
    let eps_of = |rho: f64| -> f64 {
        Fixed::from_f64_ceil(rho)
            .ok()
            .and_then(|r| zcdp_to_epsilon(r, delta_fixed))
            .map(|e| e.to_f64())
            .unwrap_or(f64::INFINITY)
    };
    let (mut lo, mut hi) = (0.0f64, epsilon.max(1e-12));
    while eps_of(hi) < epsilon {
        hi *= 2.0;
    }
    for _ in 0..100 {
        let mid = (lo + hi) / 2.0;
        if eps_of(mid) <= epsilon {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    if lo <= 0.0 {
        return Err(Error::InvalidMechanism {
            reason: "epsilon too small for the Gaussian mechanism".into(),
        });
    }
    Ok(lo)
}

/// The measure whose noisy count can decide partition selection itself, so that selection takes
/// no share of ε: a count to which each privacy unit adds at most 1 per group
/// (`COUNT(DISTINCT <unit>)`, or `COUNT(*)`/`COUNT(col)` when the policy caps rows at one per
/// unit), whose per-group values then have the sensitivity and the one-unit-group bound that
/// [`PartitionSelection::keeps_released`] needs. With Laplace noise the count is thresholded as
/// a Laplace count; with Gaussian noise by Gaussian thresholding
/// ([`PartitionSelection::gaussian_threshold`]). The first such measure.
pub fn selection_measure(plan: &Plan, rewrite: &Rewrite, _budget: Budget) -> Option<usize> {
    if plan.keys_public() {
        return None;
    }
    rewrite.measures.iter().position(|m| {
        matches!(
            m,
            crate::dp::rewrite::Measure::Units
                | crate::dp::rewrite::Measure::Rows
                | crate::dp::rewrite::Measure::Values(_)
        ) && m.contribution(&rewrite.arguments, plan.max_rows_per_unit) == 1.0
            // Under a total cap a count of rows has the total's sensitivity, not the groups'.
            && (*m == crate::dp::rewrite::Measure::Units || plan.max_rows_total.is_none())
    })
}

/// Chooses every mechanism of the query and its cost. Refuses before anything runs.
pub fn mechanisms(plan: &Plan, rewrite: &Rewrite, budget: Budget) -> Result<Mechanisms> {
    if budget.mechanism == Mechanism::Auto {
        return choose_mechanism(plan, rewrite, budget);
    }
    if plan.grouping_sets().is_some() {
        return grouping::mechanisms(plan, rewrite, budget);
    }
    let needs_selection = !plan.keys_public();
    let groups = plan.max_groups_per_unit;
    let selection_measure = selection_measure(plan, rewrite, budget);
    let shares =
        rewrite.measures.len() + usize::from(needs_selection && selection_measure.is_none());
    let epsilon_share = budget.epsilon / shares as f64;
    if needs_selection && budget.delta <= 0.0 {
        return Err(Error::forbidden(
            "this query needs delta > 0: its group keys are not public, so groups are released only through DP partition selection",
            "Group by columns with public_values in the policy, or SET pgdp.delta to a small positive value (e.g. 1e-7) within your budget.",
        ));
    }
    if budget.mechanism == Mechanism::Gaussian && budget.delta <= 0.0 {
        return Err(Error::forbidden(
            "the Gaussian mechanism needs delta > 0",
            "SET pgdp.delta to a small positive value, or SET pgdp.mechanism = 'laplace'.",
        ));
    }
    let has_quantile = rewrite
        .measures
        .iter()
        .any(|m| matches!(m, crate::dp::rewrite::Measure::Quantile(..)));
    if has_quantile && budget.mechanism == Mechanism::Gaussian {
        return Err(Error::forbidden(
            "quantiles (MIN, MAX, MEDIAN, PERCENTILE_*) are released with the Laplace report-noisy-max mechanism only",
            "SET pgdp.mechanism = 'laplace' for this query.",
        ));
    }
    let mut noises = Vec::new();
    let mut sensitivities = Vec::new();
    // Gaussian: every share is a Gaussian part (the measures, and partition selection's own
    // count of units when no released count decides it), ρ-zCDP together with ρ converted from
    // the query's ε at δ and split equally over the shares.
    let gaussian_rho = match budget.mechanism {
        Mechanism::Gaussian => Some(rho_for(budget.epsilon, budget.delta)? / shares as f64),
        Mechanism::Laplace => None,
        Mechanism::Auto => return Err(Error::internal("an unresolved automatic mechanism")),
    };
    // Under a total cap on a unit's rows, a statistic that grows with rows is linear in them:
    // its L1 and L2 sensitivities are what one row adds times the plan's row sensitivities
    // (`Plan::row_sensitivity`). Otherwise, and for the others, a unit adds its contribution in
    // each of at most `G` groups: `G·c` and `√G·c`.
    let (l1_rows, l2_rows) = plan.row_sensitivity();
    for m in &rewrite.measures {
        let c = m.contribution(&rewrite.arguments, plan.max_rows_per_unit);
        let per_row = (m.is_additive() && plan.max_rows_total.is_some())
            .then(|| m.contribution(&rewrite.arguments, 1));
        let noise = match gaussian_rho {
            None => {
                let l1 = per_row.map_or(groups as f64 * c, |r| r * l1_rows);
                sensitivities.push(l1);
                if m.is_integer() {
                    Noise::laplace(l1, epsilon_share)?
                } else {
                    Noise::laplace_real(l1, epsilon_share, groups)?
                }
            }
            Some(rho) => {
                let l2 = per_row.map_or((groups as f64).sqrt() * c, |r| r * l2_rows);
                sensitivities.push(l2);
                if m.is_integer() {
                    Noise::gaussian(l2, rho)?
                } else {
                    Noise::gaussian_real(l2, rho, groups)?
                }
            }
        };
        noises.push(noise);
    }
    let selection = match (needs_selection, selection_measure, gaussian_rho) {
        (false, _, _) => None,
        // Gaussian thresholding of the released count: the threshold is set for that count's σ.
        (true, Some(j), Some(_)) => Some(PartitionSelection::gaussian_threshold(
            noises[j].scale(),
            budget.delta,
            groups,
        )?),
        // Gaussian thresholding of a count of units of its own, drawn with the ρ share of a
        // count of L2 sensitivity √k: no pure ε at all.
        (true, None, Some(rho)) => Some(PartitionSelection::gaussian_threshold(
            Noise::gaussian((groups as f64).sqrt(), rho)?.scale(),
            budget.delta,
            groups,
        )?),
        // Laplace thresholding of the released count: its own noise decides.
        (true, Some(_), None) => Some(PartitionSelection::new(
            epsilon_share,
            budget.delta,
            groups,
        )?),
        // A count of units of its own under pure ε: the optimal rule (a probability of keeping
        // per count, Desfontaines et al. 2022), Laplace thresholding when its table would be
        // too long.
        (true, None, None) => Some(
            match PartitionSelection::optimal(epsilon_share, budget.delta, groups)? {
                Some(optimal) => optimal,
                None => PartitionSelection::new(epsilon_share, budget.delta, groups)?,
            },
        ),
    };
    // Thresholding a released count is valid only with that count's own noise, of the
    // selection's kind, on the integers, at exactly the selection's scale (k/ε share, as a count
    // of sensitivity 1 in k groups gets, for Laplace; the count's σ for Gaussian).
    if let (Some(j), Some(s)) = (selection_measure, &selection) {
        let noise = &noises[j];
        if noise.kind() != s.kind() || noise.scale() != s.scale() || noise.grid_exponent().is_some()
        {
            return Err(Error::internal(
                "the selection measure's noise differs from partition selection's",
            ));
        }
    }
    // Charged by component (the accountant composes them, budget::accountant): each Laplace
    // measure is a pure ε-DP part of its ε share, and Laplace partition selection is
    // (ε share, δ)-DP, with a selection measure that share being the measure's own (the count
    // and its thresholding together); the Gaussian parts together are ρ-zCDP, their ρ recorded
    // as such (the ε at δ above only calibrates their noise), and Gaussian thresholding adds
    // its δ. Rounded up, so the charge is never below what was spent.
    let selection_delta = match &selection {
        Some(_) => fixed_ceil(budget.delta)?,
        None => Fixed::ZERO,
    };
    let cost = match gaussian_rho {
        None => Cost {
            delta: selection_delta,
            ..Cost::pure_split(fixed_ceil(budget.epsilon)?, shares)
        },
        // Gaussian thresholding (of a released count or of its own count of units): every
        // count is charged in ρ with the measures, and the selection adds its δ only
        // (δ-approximate zCDP).
        Some(rho) => {
            Cost::zcdp(fixed_ceil(rho * shares as f64 * (1.0 + RHO_SUM_MARGIN))?)
                + Cost {
                    delta: selection_delta,
                    ..Cost::ZERO
                }
        }
    };
    Ok(Mechanisms {
        noises,
        selection,
        selection_measure,
        cost,
        epsilon_per_measure: epsilon_share,
        shares,
        sensitivities,
        budget,
        max_error: None,
        clamp_means: true,
        removed_share: 0.0,
        clamp_shares: Vec::new(),
        max_relative_error: None,
        sets: Vec::new(),
        choice: None,
    })
}

/// The largest stated 95 % error bound over the measures of `plan` at `budget` (infinite
/// where no mechanism exists at that ε).
fn worst_error_bound(plan: &Plan, rewrite: &Rewrite, budget: Budget) -> f64 {
    let Ok(m) = mechanisms(plan, rewrite, budget) else {
        return f64::INFINITY;
    };
    // Derived grouping sets: a total adds many cells, each with its noise.
    let cells = grouping::derived_set(plan, rewrite).map_or(1, |f| grouping::cells_max(plan, f));
    m.noises
        .iter()
        .chain(m.sets.iter().flat_map(|s| s.noises.iter()))
        .map(|n| n.sum_error_bound(cells, 0.05).unwrap_or(f64::INFINITY))
        .fold(0.0, f64::max)
}

/// `x` rounded up to three significant digits, as the shortest decimal (so that the ε
/// charged reads 0.632, not 0.63198…).
fn ceil_three_digits(x: f64) -> f64 {
    let digits = 2 - x.log10().floor() as i32;
    let scale = 10f64.powi(digits);
    let up = (x * scale).ceil() / scale;
    let text = format!("{up:.prec$}", prec = digits.max(0) as usize);
    text.parse::<f64>().ok().filter(|v| *v >= x).unwrap_or(up)
}

/// The privacy parameters of a query under `pgdp.max_error = target`: `budget` with the
/// smallest ε in [`limits::EPSILON_PER_QUERY_MIN`, `cap`] (rounded up to three significant
/// digits) at which the stated 95 % error bound of every measure (EXPLAIN's `measure` lines)
/// is at most `target`. The bound of a measure falls as ε grows, so bisection finds it.
///
/// Refuses quantiles (0A000: their error is in ranks, not in the answer's units), and a
/// target that even `cap` does not meet (22023 naming `pgdp.max_error`, with the bound `cap`
/// gives). Policy facts only: the bounds depend on the plan's sensitivities and on ε, never
/// on the data, so the choice reveals nothing.
pub fn budget_for_error(
    plan: &Plan,
    rewrite: &Rewrite,
    budget: Budget,
    target: f64,
    cap: f64,
) -> Result<Budget> {
    if rewrite
        .measures
        .iter()
        .any(|m| matches!(m, crate::dp::rewrite::Measure::Quantile(..)))
    {
        return Err(Error::unsupported(
            "pgdp.max_error for quantiles (MIN, MAX, MEDIAN, PERCENTILE_*)",
            "SET pgdp.max_error = off and choose pgdp.epsilon for this query; EXPLAIN shows its cost.",
        ));
    }
    let at = |epsilon: f64| Budget { epsilon, ..budget };
    let worst = |epsilon: f64| worst_error_bound(plan, rewrite, at(epsilon));
    let at_cap = worst(cap);
    if at_cap > target {
        return Err(Error::InvalidParameter {
            name: "pgdp.max_error".into(),
            reason: format!(
                "{target} is below what this query can reach within the per-query cap of epsilon={cap}: its 95% error bound there is {at_cap:.4}"
            ),
            hint: format!(
                "SET pgdp.max_error to at least {}, or ask a coarser question (fewer groups per person, narrower bounds).",
                ceil_three_digits(at_cap)
            ),
        });
    }
    let (mut lo, mut hi) = (limits::EPSILON_PER_QUERY_MIN, cap);
    if worst(lo) <= target {
        return Ok(at(lo));
    }
    // worst(lo) > target ≥ worst(hi): halve the ratio until it is within 10⁻⁹.
    while hi / lo > 1.0 + 1e-9 {
        let mid = (lo * hi).sqrt();
        if worst(mid) <= target {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    let rounded = ceil_three_digits(hi).min(cap);
    Ok(at(if worst(rounded) <= target {
        rounded
    } else {
        hi
    }))
}

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
    let sets = plan.grouping_sets.as_deref();
    if measures.keys != plan.keys.len() + usize::from(sets.is_some())
        || measures.measures != rewrite.measures.len()
        || mechanisms.noises.len() != rewrite.measures.len()
        || mechanisms.sets.len() != sets.map_or(0, |s| s.len())
    {
        return Err(Error::internal("noisy measures of another shape"));
    }
    let bounds_of = |m: &Mechanisms, alpha: f64| -> Vec<f64> {
        m.noises
            .iter()
            .map(|n| n.error_bound(alpha).unwrap_or(f64::NAN))
            .collect()
    };
    // Per grouping set (one entry without grouping sets): its 95% bounds, and its 97.5% bounds
    // for aggregates derived from two measures.
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
    let (bounds95, bounds975) = (bounds_at(0.05), bounds_at(0.025));
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

    // ORDER BY on released values (keys order by default, for stable output).
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
    let start = usize::try_from(plan.offset).unwrap_or(usize::MAX);
    let mut rows_iter: Vec<OutRow> = out_rows.into_iter().skip(start).collect();
    if let Some(l) = plan.limit {
        rows_iter.truncate(usize::try_from(l).unwrap_or(usize::MAX));
    }
    let truncated = rows_iter.len() > limits::GROUPS_RELEASED_MAX;
    rows_iter.truncate(limits::GROUPS_RELEASED_MAX);
    if let Some(share) = mechanisms.max_relative_error {
        check_relative_error(plan, &rows_iter, share)?;
    }

    let mut rows_out = Vec::with_capacity(rows_iter.len());
    let set_keys = |set: usize| -> &[usize] { sets.and_then(|s| s.get(set)).map_or(&[], |s| s) };
    for (key_cells, aggregate_values, errors, set) in rows_iter {
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
            rows_out.push(
                key_cells
                    .into_iter()
                    .chain(aggregate_values)
                    .chain(groupings)
                    .chain(bounds)
                    .collect(),
            );
            continue;
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
        rows_out.push(row);
    }
    Ok(Released {
        columns: columns(plan, accuracy),
        rows: rows_out,
        truncated,
    })
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
                "{}{} is {} ± {} ({relative}, above {}%)",
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
fn analyst_text(plan: &Plan, label: &str) -> String {
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
    if let Some(choice) = mechanisms.choice {
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
    if plan.grouping_sets.is_some() {
        lines.extend(grouping::explain_sets(plan, rewrite, mechanisms).unwrap_or_default());
    }
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
        lines.push(format!(
            "  count({}) = count(*): the column is NOT NULL upstream, so its values are counted by the count of rows, with no noise or epsilon of its own",
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
    match (&mechanisms.selection, mechanisms.selection_measure) {
        (Some(s), Some(j)) => lines.push(format!(
            "  partition selection: keep a group iff its released {} reaches {} ({} thresholding of the released count: no epsilon of its own; delta {})",
            analyst_text(plan, &rewrite.measures[j].label(&rewrite.arguments)),
            s.threshold(),
            match s.kind() {
                crate::dp::mechanism::MechanismKind::Laplace => "Laplace",
                crate::dp::mechanism::MechanismKind::Gaussian => "Gaussian",
            },
            s.delta()
        )),
        (Some(s), None) if s.is_optimal_rule() => lines.push(format!(
            "  partition selection: keep a group of n units with probability p(n), the optimal rule (Desfontaines et al. 2022) at epsilon {:.6} and delta {:.3e} per group: p(1) = {:.3e}, p(n) >= 1/2 from n = {}, p(n) = 1 from n = {} (its own epsilon share, delta {})",
            s.epsilon() / s.max_groups_per_unit() as f64,
            s.delta_per_group(),
            s.keep_probability(1).unwrap_or(0.0),
            s.threshold(),
            s.certain_from().unwrap_or(0),
            s.delta()
        )),
        (Some(s), None) => lines.push(format!(
            "  partition selection: keep a group iff its noisy count of units ({} scale {:.4}) reaches {} ({}delta {})",
            match s.kind() {
                crate::dp::mechanism::MechanismKind::Laplace => "Laplace",
                crate::dp::mechanism::MechanismKind::Gaussian => "Gaussian thresholding,",
            },
            s.scale(),
            s.threshold(),
            match s.kind() {
                crate::dp::mechanism::MechanismKind::Laplace => "its own epsilon share, ",
                crate::dp::mechanism::MechanismKind::Gaussian => "its own rho share, ",
            },
            s.delta()
        )),
        _ if plan.grouping_sets.is_some() => {}
        (None, _) if !plan.keys.is_empty() => lines.push("  group keys: public domains, every value released (missing ones with noisy zeros)".into()),
        (None, _) => {}
    }
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
    lines.push("upstream SQL:".into());
    lines.extend(
        sql_lines(rewrite.sql.as_str())
            .into_iter()
            .map(|l| format!("  {l}")),
    );
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

#[cfg(test)]
mod tests;

#[cfg(test)]
mod epsilon_tests {
    use super::{ceil_three_digits, rho_by_bisection, rho_for};

    #[test]
    fn rho_for_remembers_exactly_what_the_bisection_gives() {
        for (epsilon, delta) in [(1.0, 1e-7), (0.1, 1e-9), (2.5, 1e-5), (1.0, 1e-6)] {
            let computed = rho_by_bisection(epsilon, delta).expect("a rho");
            // First call (may fill the memo) and second (may read it): the same bits.
            assert_eq!(
                rho_for(epsilon, delta).expect("a rho").to_bits(),
                computed.to_bits()
            );
            assert_eq!(
                rho_for(epsilon, delta).expect("a rho").to_bits(),
                computed.to_bits()
            );
        }
        // Each (ε, δ) has its own answer: a larger δ buys a larger ρ for the same ε.
        let (tight, loose) = (rho_for(1.0, 1e-9), rho_for(1.0, 1e-5));
        assert!(tight.expect("a rho") < loose.expect("a rho"));
    }

    #[test]
    fn epsilon_is_rounded_up_to_three_significant_digits() {
        for (x, want) in [
            (0.631_98, 0.632),
            (0.6, 0.6),
            (1.000_000_1, 1.01),
            (0.000_123_41, 0.000_124),
            (12.34, 12.4),
            (2.0, 2.0),
        ] {
            let got = ceil_three_digits(x);
            assert_eq!(got, want, "{x}");
            assert!(got >= x, "{x}: rounded down");
        }
    }
}
