//! Choosing every mechanism of a query and what it costs, before anything runs: the noise of
//! each measure, partition selection, the split of the query's ε (or ρ) over them, the
//! automatic choice between Laplace and Gaussian, and the ε a requested error needs.
//!
//! Invariant: a function of the plan, the rewrite and the session's budget alone (no data), and
//! the cost it states is never below what the mechanisms spend (rounded up).

use super::*;

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
    /// The lower end of `removed_share`'s one-sided 95 % interval
    /// ([`bounds::ChosenBounds::rows_removed_share_low`]): what `max_bias` tests.
    pub removed_share_low: f64,
    /// Per aggregate of the plan (empty: none), the estimated share of its argument's sum that
    /// clamping into the bounds removed ([`bounds::ClampEstimate::share`], a noisy estimate,
    /// post-processing): the `_error95` of a SUM or AVG of it adds the shortfall it implies.
    pub clamp_shares: Vec<f64>,
    /// `pgdp.max_relative_error`: when set, [`finish`] refuses an answer in which a returned
    /// cell's stated error (its `_error95`) exceeds this share of its value
    /// ([`Error::TooInaccurate`]). Post-processing of the noisy measures.
    pub max_relative_error: Option<f64>,
    /// `pgdp.max_bias`: when set, [`finish`] refuses an answer with a COUNT or SUM when the
    /// caps chosen for the query are estimated to remove more than this share of the rows
    /// (`removed_share`; [`Error::TooInaccurate`]). Post-processing of the noisy estimate.
    pub max_bias: Option<f64>,
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

pub(super) fn fixed_ceil(x: f64) -> Result<Fixed> {
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
    check_mechanism_allowed(rewrite, budget, needs_selection)?;
    // Gaussian: every share is a Gaussian part (the measures, and partition selection's own
    // count of units when no released count decides it), ρ-zCDP together with ρ converted from
    // the query's ε at δ and split equally over the shares.
    let gaussian_rho = match budget.mechanism {
        Mechanism::Gaussian => Some(rho_for(budget.epsilon, budget.delta)? / shares as f64),
        Mechanism::Laplace => None,
        Mechanism::Auto => return Err(Error::internal("an unresolved automatic mechanism")),
    };
    let (noises, sensitivities) = measure_noises(plan, rewrite, epsilon_share, gaussian_rho)?;
    let selection = partition_selection(
        &noises,
        selection_measure,
        needs_selection,
        gaussian_rho,
        budget,
        epsilon_share,
        groups,
    )?;
    let cost = statement_cost(budget, shares, gaussian_rho, selection.is_some())?;
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
        removed_share_low: 0.0,
        clamp_shares: Vec::new(),
        max_relative_error: None,
        max_bias: None,
        sets: Vec::new(),
        choice: None,
    })
}

/// The refusals of a mechanism that cannot answer the query at the session's settings:
/// partition selection or the Gaussian mechanism without δ, quantiles under Gaussian noise.
fn check_mechanism_allowed(rewrite: &Rewrite, budget: Budget, needs_selection: bool) -> Result<()> {
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
    Ok(())
}

/// Each measure's noise and sensitivity (L1 for Laplace, L2 for Gaussian at `gaussian_rho`).
fn measure_noises(
    plan: &Plan,
    rewrite: &Rewrite,
    epsilon_share: f64,
    gaussian_rho: Option<f64>,
) -> Result<(Vec<Noise>, Vec<f64>)> {
    let groups = plan.max_groups_per_unit;
    let mut noises = Vec::new();
    let mut sensitivities = Vec::new();
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
    Ok((noises, sensitivities))
}

/// Partition selection of the groups, when the keys are not public: thresholding of the
/// released count `selection_measure` (with its own noise) or of a count of units of its own.
fn partition_selection(
    noises: &[Noise],
    selection_measure: Option<usize>,
    needs_selection: bool,
    gaussian_rho: Option<f64>,
    budget: Budget,
    epsilon_share: f64,
    groups: u64,
) -> Result<Option<PartitionSelection>> {
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
    Ok(selection)
}

/// The statement's cost, by component (see below).
fn statement_cost(
    budget: Budget,
    shares: usize,
    gaussian_rho: Option<f64>,
    selection: bool,
) -> Result<Cost> {
    // Charged by component (the accountant composes them, budget::accountant): each Laplace
    // measure is a pure ε-DP part of its ε share, and Laplace partition selection is
    // (ε share, δ)-DP, with a selection measure that share being the measure's own (the count
    // and its thresholding together); the Gaussian parts together are ρ-zCDP, their ρ recorded
    // as such (the ε at δ above only calibrates their noise), and Gaussian thresholding adds
    // its δ. Rounded up, so the charge is never below what was spent.
    let selection_delta = if selection {
        fixed_ceil(budget.delta)?
    } else {
        Fixed::ZERO
    };
    Ok(match gaussian_rho {
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
