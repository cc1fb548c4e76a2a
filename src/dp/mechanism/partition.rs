//! [`PartitionSelection`]: deciding, with differential privacy, which non-public group keys may be
//! released at all.
//!
//! Invariants:
//! - A group is kept iff a noisy count to which each privacy unit adds at most 1 (its exact count
//!   of distinct privacy units, or a released count of that kind) reaches the threshold `T`;
//!   nothing else about the group is consulted.
//! - The noise is discrete Laplace of scale `k/ε` ([`PartitionSelection::new`]) or, for Gaussian
//!   thresholding of a released Gaussian count, the rounded Gaussian of that count's `σ`
//!   ([`PartitionSelection::gaussian_threshold`], `sample::sample_rounded_gaussian`).
//! - `T` is chosen from an upper bound on the noise's tail so that a group with a single unit is
//!   kept with probability at most `δ/k`; it is computed in `f64` with an upward margin only.

use num_bigint::BigInt;
use num_rational::BigRational;
use rand::{CryptoRng, Rng};

use super::exact::{f64_at_least, next_down, rational_from_f64};
use super::noise::MechanismKind;
use super::noise::FLOAT_MARGIN;
use super::sample::{sample_discrete_laplace, sample_rounded_gaussian};
use super::{invalid, positive_scale, validate_budget};
use crate::Result;

/// Laplace partition selection with a threshold on the noisy count of distinct privacy units.
///
/// # Privacy
/// Sensitivity: each privacy unit contributes to at most `k = max_groups_per_unit` groups (the
/// rewrite caps it) and to each group's distinct-unit count by at most 1. Noise: discrete Laplace
/// with scale `b = k/ε`, rounded up to an `f64`. Threshold: `T = 1 + m`, with `m` the smallest
/// integer `≥ 0` such that `P(Z ≥ m) = q^m/(1+q) ≤ δ'`, where `q = e^(−1/b)` and `δ' = δ/k`
/// (rounded down). Cost: `(ε, δ)`-DP for the set of kept keys.
///
/// Why: adding one unit changes the counts of at most `k` groups, each by one. Groups that exist
/// without it are decided by discrete Laplace mechanisms with sensitivity 1 and scale `k/ε`,
/// `ε/k`-DP each, `ε` together. A group that exists only because of it has count 1 and is kept
/// with probability `P(1 + Z ≥ T) = P(Z ≥ m) ≤ δ'`; there are at most `k` of them, so the union
/// bound adds at most `kδ' ≤ δ`. `δ/k` is at most Google's `1 − (1 − δ)^(1/k)`, so this threshold
/// is slightly more conservative than theirs.
///
/// Sources: Korolova, Kenthapadi, Mishra & Ntoulas 2009; Google's differential-privacy library
/// ("Laplace partition selection"); Wilson et al., "Differentially Private SQL with Bounded User
/// Contribution" (PoPETs 2020); Desfontaines, Voss, Gipson & Mandayam, "Differentially private
/// partition selection" (PoPETs 2022, arXiv:2006.03684), whose optimal rule
/// ([`PartitionSelection::optimal`]) keeps somewhat more groups at the same `(ε, δ)` and is what
/// pgdp uses for a count of units of its own; thresholding remains for a released count.
#[derive(Debug, Clone, PartialEq)]
pub struct PartitionSelection {
    /// The noise the threshold is set for: Laplace (its own count, or a released Laplace count)
    /// or Gaussian (a released Gaussian count only).
    kind: MechanismKind,
    epsilon: f64,
    delta: f64,
    max_groups_per_unit: u64,
    scale: f64,
    scale_exact: BigRational,
    delta_per_group: f64,
    threshold: i128,
    /// For [`PartitionSelection::optimal`]: the probability of keeping a group with `n` units,
    /// `π(n)` as a numerator over 2⁶⁴, for `n = 0, 1, …` up to the first `n` with `π(n) = 1`
    /// (the last entry, which every larger `n` takes too). Empty for thresholding.
    keep_probabilities: Vec<u128>,
}

/// 1 in the fixed point of [`PartitionSelection::optimal`]'s probabilities (64 fraction bits).
const ONE: u128 = 1 << 64;

impl PartitionSelection {
    /// Partition selection spending `(epsilon, delta)` when each privacy unit can add to at most
    /// `max_groups_per_unit` groups.
    ///
    /// # Privacy
    /// See the type's documentation: scale `max_groups_per_unit/ε`, threshold from the exact
    /// discrete Laplace tail at `δ/max_groups_per_unit`, cost `(ε, δ)`.
    ///
    /// # Errors
    /// [`crate::Error::InvalidMechanism`] if `ε` is not finite or below `2^-50`, `δ` is not
    /// strictly between 0 and 1 (or `δ/k` is below the smallest normal `f64`),
    /// `max_groups_per_unit` is zero, or the scale is not a normal `f64`.
    pub fn new(epsilon: f64, delta: f64, max_groups_per_unit: u64) -> Result<PartitionSelection> {
        let epsilon_exact = validate_budget("epsilon", epsilon)?;
        if !(delta > 0.0 && delta < 1.0) {
            return Err(invalid(
                "delta for partition selection must be strictly between 0 and 1",
            ));
        }
        if max_groups_per_unit == 0 {
            return Err(invalid("max_groups_per_unit must be at least 1"));
        }
        let groups = BigRational::from_integer(BigInt::from(max_groups_per_unit));
        let scale = positive_scale(f64_at_least(&(&groups / &epsilon_exact)))?;
        let scale_exact = finite_exact(scale)?;
        let delta_per_group = delta_per_group(delta, max_groups_per_unit)?;
        let threshold = laplace_threshold(scale, delta_per_group);
        Ok(PartitionSelection {
            kind: MechanismKind::Laplace,
            epsilon,
            delta,
            max_groups_per_unit,
            scale,
            scale_exact,
            delta_per_group,
            threshold,
            keep_probabilities: Vec::new(),
        })
    }

    /// Gaussian thresholding of a released count: the selection that keeps a group iff a count
    /// released with rounded Gaussian noise `round(σ·Z)` reaches `T`, spending `delta`
    /// beyond that count's own zCDP cost, when each privacy unit adds at most 1 to the count of
    /// each of at most `max_groups_per_unit` groups.
    ///
    /// # Privacy
    /// Threshold: `T = 1 + m`, with `m ≥ 1` the smallest integer such that the upper bound
    /// `P(round(σZ) ≥ m) = P(Z ≥ t) ≤ e^(−t²/2)·min(1/2, 1/(t√(2π)))`, `t = (m − ½)/σ`, is at
    /// most `δ' = δ/k` (rounded down). The bound is the standard normal's tail: `1/2·e^(−t²/2)`
    /// (Chernoff) and the Mills ratio `φ(t)/t`, both for `t > 0`.
    ///
    /// Cost: the released counts are a Gaussian mechanism, `ρ`-zCDP (and `√(2ρ)`-GDP) as charged
    /// for the measure. Adding one unit creates at most `k` groups, each with a count of at most 1, each
    /// kept with probability at most `δ'`; outside that event (probability `≤ kδ' ≤ δ`, and the
    /// new groups' noise is independent of the others') the kept groups and values are
    /// post-processing of the `ρ`-zCDP vector of counts of the groups that exist without the
    /// unit. So the whole is `δ`-approximately `ρ`-zCDP (Bun & Steinke 2016, Definition 1.8),
    /// charged as `ρ` plus `δ` apart, with no `ε` of its own. This is Gaussian thresholding as
    /// in Google's differential-privacy library ("Gaussian partition selection") and Wilson et
    /// al., "Differentially Private SQL with Bounded User Contribution" (PoPETs 2020), with the
    /// threshold derived from the noise's tail as [`PartitionSelection::new`] derives Laplace's.
    ///
    /// # Errors
    /// [`crate::Error::InvalidMechanism`] if `sigma` is not a positive normal `f64`, `δ` is not
    /// strictly between 0 and 1 (or `δ/k` is below the smallest normal `f64`), or
    /// `max_groups_per_unit` is zero.
    pub fn gaussian_threshold(
        sigma: f64,
        delta: f64,
        max_groups_per_unit: u64,
    ) -> Result<PartitionSelection> {
        let scale = positive_scale(Some(sigma))?;
        if !(delta > 0.0 && delta < 1.0) {
            return Err(invalid(
                "delta for partition selection must be strictly between 0 and 1",
            ));
        }
        if max_groups_per_unit == 0 {
            return Err(invalid("max_groups_per_unit must be at least 1"));
        }
        let scale_exact = finite_exact(scale)?;
        let delta_per_group = delta_per_group(delta, max_groups_per_unit)?;
        let threshold = gaussian_threshold(scale, delta_per_group);
        Ok(PartitionSelection {
            kind: MechanismKind::Gaussian,
            epsilon: 0.0,
            delta,
            max_groups_per_unit,
            scale,
            scale_exact,
            delta_per_group,
            threshold,
            keep_probabilities: Vec::new(),
        })
    }

    /// The optimal selection rule for a count of units of its own (Desfontaines, Voss, Gipson &
    /// Mandayam, PoPETs 2022, arXiv:2006.03684): keep a group with `n` distinct units with
    /// probability `π(n)`, the largest that is `(ε', δ')`-DP between `n − 1` and `n` for every
    /// `n`, with `ε' = ε/k` and `δ' = δ/k` per group. Keeps more groups than Laplace
    /// thresholding at the same `(ε, δ)`: the count at which a group is kept half the time is
    /// about `ln(1/2δ')/ε'` instead of about `ln(1/2δ')/ε' + k/ε·ln 2`. `None` when the table of
    /// `π` would exceed [`crate::limits::SELECTION_TABLE_MAX`] entries (a tiny `ε'`): the caller
    /// then uses [`PartitionSelection::new`].
    ///
    /// # Privacy
    /// `π(0) = 0` and `π(n) = min(e^ε'·π(n−1) + δ', 1 − e^(−ε')·(1 − π(n−1) − δ'), 1)`: adding
    /// one unit to a group of `n − 1` units keeps `P(kept | n) ≤ e^ε'·P(kept | n−1) + δ'` and
    /// `P(dropped | n−1) ≤ e^ε'·P(dropped | n) + δ'`, and since `π` is non-decreasing the two
    /// inequalities of the other direction hold too; a group that exists only because of the
    /// unit (`n = 1`) is kept with probability `π(1) ≤ δ'`. The decisions of different groups
    /// are independent and one unit changes at most `k` of them, so the kept set is
    /// `(kε', kδ') ≤ (ε, δ)`-DP (basic composition). Computed exactly in fixed point with 64
    /// fraction bits: `ε'` is `ε/k` rounded down, `e^ε'` is replaced by a lower bound and
    /// `e^(−ε')` by an upper bound (each from `f64` with a relative margin of 2⁻⁴⁸, far above
    /// the error of `exp`), every product rounded so that both terms only shrink, and `δ'` by
    /// its value rounded down, so every inequality above holds for the probabilities actually
    /// used. Each decision draws one uniform 64-bit integer `r` from the CSPRNG and keeps iff
    /// `r < π(n)·2⁶⁴`: exactly Bernoulli(`π(n)`).
    ///
    /// # Errors
    /// As [`PartitionSelection::new`].
    pub fn optimal(
        epsilon: f64,
        delta: f64,
        max_groups_per_unit: u64,
    ) -> Result<Option<PartitionSelection>> {
        let laplace = PartitionSelection::new(epsilon, delta, max_groups_per_unit)?;
        let epsilon_per_group = next_down(epsilon / max_groups_per_unit as f64);
        if !(epsilon_per_group.is_normal() && epsilon_per_group > 0.0) {
            return Ok(None);
        }
        // The table reaches 1 after about 2·ln(1/δ')/ε' counts; decline at once when that is
        // beyond the limit (the loop below checks the exact length too).
        let expected = 2.0 * (1.0 / laplace.delta_per_group).ln() / epsilon_per_group;
        if expected.is_nan() || expected >= crate::limits::SELECTION_TABLE_MAX as f64 {
            return Ok(None);
        }
        let margin = f64::powi(2.0, -48);
        // e^ε' from below, at least 1; e^(−ε') from above, at most 1.
        let growth = ((epsilon_per_group.exp() * (1.0 - margin)) * ONE as f64).floor();
        let shrink = ((-epsilon_per_group).exp() * (1.0 + margin) * ONE as f64).ceil();
        if !(growth.is_finite() && growth < 2f64.powi(120) && shrink.is_finite()) {
            return Ok(None);
        }
        let growth = (growth as u128).max(ONE);
        let shrink = (shrink as u128).min(ONE);
        // δ'·2⁶⁴ is exact in f64 (a power-of-two scaling); rounded down.
        let delta_fixed = (laplace.delta_per_group * ONE as f64).floor() as u128;
        if delta_fixed == 0 {
            return Ok(None);
        }
        let mut probabilities = vec![0u128];
        let mut p = 0u128;
        while p < ONE {
            if probabilities.len() > crate::limits::SELECTION_TABLE_MAX {
                return Ok(None);
            }
            // floor(e^ε'·p) + δ': rounded down. An overflow means it is far above 1.
            let grown = growth
                .checked_mul(p)
                .map_or(u128::MAX, |x| (x >> 64).saturating_add(delta_fixed));
            // 1 − ceil(e^(−ε')·(1 − p − δ')): the product rounded up, so the term rounds down;
            // when 1 − p − δ' ≤ 0 the bound is at least 1.
            let rest = ONE.saturating_sub(p).saturating_sub(delta_fixed);
            let kept = if rest == 0 {
                ONE
            } else {
                // shrink ≤ 2⁶⁴ and rest < 2⁶⁴: the product fits in u128.
                let product = shrink * rest;
                let up = (product >> 64) + u128::from(product & (ONE - 1) != 0);
                ONE.saturating_sub(up)
            };
            let next = grown.min(kept).min(ONE);
            // π never decreases: both terms exceed p (e^ε' ≥ 1 and δ' > 0; e^(−ε') ≤ 1).
            if next <= p {
                return Err(crate::error::Error::internal(
                    "the optimal partition selection's probabilities did not increase",
                ));
            }
            probabilities.push(next);
            p = next;
        }
        let half = probabilities
            .iter()
            .position(|&q| q >= ONE / 2)
            .unwrap_or(probabilities.len() - 1);
        Ok(Some(PartitionSelection {
            threshold: half as i128,
            keep_probabilities: probabilities,
            ..laplace
        }))
    }

    /// Whether this is [`PartitionSelection::optimal`]'s rule (a probability per count) rather
    /// than a threshold on a noisy count.
    pub fn is_optimal_rule(&self) -> bool {
        !self.keep_probabilities.is_empty()
    }

    /// For the optimal rule: the smallest count of units that is always kept (`π(n) = 1`).
    pub fn certain_from(&self) -> Option<usize> {
        (!self.keep_probabilities.is_empty()).then(|| self.keep_probabilities.len() - 1)
    }

    /// For the optimal rule: `π(n)` as an `f64` (for tests and EXPLAIN).
    pub fn keep_probability(&self, units: u64) -> Option<f64> {
        let last = self.keep_probabilities.len().checked_sub(1)?;
        let i = usize::try_from(units).map_or(last, |u| u.min(last));
        Some(self.keep_probabilities[i] as f64 / ONE as f64)
    }

    /// The noise the threshold is set for.
    pub fn kind(&self) -> MechanismKind {
        self.kind
    }

    /// The threshold `T` on the noisy distinct-unit count (for EXPLAIN): a group is kept iff
    /// `units + noise ≥ T`. For the optimal rule, the smallest count kept at least half the
    /// time.
    pub fn threshold(&self) -> i128 {
        self.threshold
    }

    /// The scale of the noise on the count: `k/ε` (Laplace) or the released count's `σ`
    /// (Gaussian).
    pub fn scale(&self) -> f64 {
        self.scale
    }

    /// The `ε` this selection spends (0 for Gaussian thresholding, whose count is charged in
    /// `ρ` as a measure).
    pub fn epsilon(&self) -> f64 {
        self.epsilon
    }

    /// The `δ` this selection spends.
    pub fn delta(&self) -> f64 {
        self.delta
    }

    /// `k`, the number of groups one privacy unit can add to.
    pub fn max_groups_per_unit(&self) -> u64 {
        self.max_groups_per_unit
    }

    /// `δ' = δ/k`: the bound on the probability that a group with one unit is kept.
    pub fn delta_per_group(&self) -> f64 {
        self.delta_per_group
    }

    /// Whether to release a group whose exact number of distinct privacy units (after contribution
    /// bounding) is `units`. Draws fresh noise on every call; call it once per group.
    ///
    /// # Privacy
    /// See [`PartitionSelection`]. The decision must be the only use of `units`; counts released
    /// for kept groups need their own mechanism and budget. For a Gaussian threshold the noise is
    /// the rounded Gaussian of `σ` = [`PartitionSelection::scale`], which costs
    /// `k/(2σ²)`-zCDP plus `δ` ([`PartitionSelection::gaussian_threshold`]); pgdp uses that form
    /// only through [`PartitionSelection::keeps_released`].
    pub fn keep<R: Rng + CryptoRng + ?Sized>(&self, rng: &mut R, units: u64) -> bool {
        if let Some(last) = self.keep_probabilities.len().checked_sub(1) {
            let i = usize::try_from(units).map_or(last, |u| u.min(last));
            let p = self.keep_probabilities[i];
            return p >= ONE || u128::from(rng.next_u64()) < p;
        }
        let noise = match self.kind {
            MechanismKind::Laplace => sample_discrete_laplace(rng, &self.scale_exact),
            MechanismKind::Gaussian => sample_rounded_gaussian(rng, &self.scale_exact),
        };
        let noisy = BigInt::from(units) + noise;
        noisy >= BigInt::from(self.threshold)
    }
}

impl PartitionSelection {
    /// Whether to release a group whose count was released as `noisy` by the measure's own
    /// noise: discrete Laplace (Laplace thresholding of a released count) or, for a selection
    /// built by [`PartitionSelection::gaussian_threshold`], the rounded Gaussian.
    ///
    /// # Privacy
    /// Gaussian: see [`PartitionSelection::gaussian_threshold`]; the count's noise must be
    /// the rounded Gaussian with exactly this selection's `σ`. Laplace:
    /// Valid only when the released count is one to which each privacy unit adds at most 1 in
    /// each of at most `k` groups (so a group that exists only because of one unit has a count
    /// of at most 1), and its noise is discrete Laplace with exactly this selection's scale:
    /// then the vector of noisy counts of the groups that exist without the unit is `ε`-DP,
    /// the kept set and values are post-processing of it, and the at most `k` groups that exist
    /// only because of the unit are each kept with probability at most `δ'`, as in
    /// [`PartitionSelection`]. The count and the selection together cost `(ε, δ)`, not
    /// `(2ε, δ)` (Korolova et al. 2009; Wilson et al. 2020 release such thresholded counts).
    /// `release::mechanisms` checks both conditions.
    pub fn keeps_released(&self, noisy: i128) -> bool {
        noisy >= self.threshold
    }
}

/// The exact value of a finite `f64` (the callers have checked that it is finite; an internal
/// error, not a panic, if not).
fn finite_exact(x: f64) -> Result<BigRational> {
    rational_from_f64(x)
        .ok_or_else(|| crate::error::Error::internal("a non-finite value in partition selection"))
}

/// `δ' = δ/k` rounded down, checked exactly: `k·δ' ≤ δ`.
fn delta_per_group(delta: f64, max_groups_per_unit: u64) -> Result<f64> {
    let groups = BigRational::from_integer(BigInt::from(max_groups_per_unit));
    let delta_exact = finite_exact(delta)?;
    let mut delta_per_group = delta / max_groups_per_unit as f64;
    while delta_per_group >= f64::MIN_POSITIVE
        && finite_exact(delta_per_group)? * &groups > delta_exact
    {
        delta_per_group = next_down(delta_per_group);
    }
    if delta_per_group < f64::MIN_POSITIVE {
        return Err(invalid("delta divided by max_groups_per_unit is too small"));
    }
    Ok(delta_per_group)
}

/// `ln` of the upper bound `e^(−t²/2)·min(1/2, 1/(t√(2π)))`, `t = (m − ½)/σ`, on
/// `P(round(σZ) ≥ m)` for a standard normal `Z` and an integer `m ≥ 1` (see
/// [`PartitionSelection::gaussian_threshold`]).
fn ln_gaussian_tail_bound(sigma: f64, m: f64) -> f64 {
    let ln_sqrt_two_pi = 0.5 * std::f64::consts::TAU.ln();
    let t = (m - 0.5) / sigma;
    -t * t / 2.0 + (-std::f64::consts::LN_2).min(-t.ln() - ln_sqrt_two_pi)
}

/// `1 + m`, `m ≥ 1` the smallest integer at which [`ln_gaussian_tail_bound`] is at most
/// `ln δ'`. The bound decreases in `m`, so bisection finds it; the comparison keeps a margin of
/// a relative `1e-12` of the terms plus `1e-9`, which more than covers the rounding of `ln`
/// and the products, so `m` is never too small.
fn gaussian_threshold(sigma: f64, delta_per_group: f64) -> i128 {
    let target = delta_per_group.ln();
    let fits = |m: f64| {
        let bound = ln_gaussian_tail_bound(sigma, m);
        let margin = FLOAT_MARGIN * (bound.abs() + target.abs()) + 1e-9;
        bound + margin <= target
    };
    // Integers held exactly in f64 (below 2^52): `lo` never fits (0 is not a valid m), `hi`
    // always does.
    let mut hi = 1.0f64;
    while !fits(hi) {
        hi *= 2.0;
        if hi > 4_503_599_627_370_496.0 {
            // Unreachable with a normal σ and δ'; keeps nothing rather than loop.
            return i128::MAX;
        }
    }
    let mut lo = 0.0f64;
    while hi - lo > 1.0 {
        let mid = ((lo + hi) / 2.0).floor();
        if fits(mid) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    (hi as i128).saturating_add(1)
}

/// `1 + m`, `m` the smallest integer `≥ 0` with `q^m/(1+q) ≤ delta_per_group`, `q = e^(−1/b)`.
///
/// For the discrete Laplace `Z` with scale `b`, `P(Z = z) = (1−q)/(1+q)·q^|z|`, so for `m ≥ 0`
/// `P(Z ≥ m) = q^m/(1+q)`. The condition is `m ≥ b·(ln(1/δ') − ln(1+q))`; the right side is
/// computed in `f64` and enlarged by a relative `1e-12` and an absolute `1e-9` before rounding up,
/// which more than covers the rounding of `ln`, `exp` and the products.
fn laplace_threshold(b: f64, delta_per_group: f64) -> i128 {
    let x = b * (-delta_per_group.ln() - (-1.0 / b).exp().ln_1p());
    let m = if x <= 0.0 {
        0.0
    } else {
        (x * (1.0 + FLOAT_MARGIN) + 1e-9).ceil()
    };
    // `as` saturates; thresholds beyond i128 (impossible with the validated parameters) would
    // keep nothing.
    (m as i128).saturating_add(1)
}

#[cfg(test)]
mod tests {
    use super::super::testing::{seeded, wilson_interval, Z_TWO_SIDED_1E6};
    use super::*;

    /// `P(Z ≥ m)` for the discrete Laplace with scale `b`, by summing its pmf.
    fn upper_tail(b: f64, m: i128) -> f64 {
        let pmf = |x: i128| (0.5 / b).tanh() * (-(x.abs() as f64) / b).exp();
        (m..m + (b * 200.0) as i128 + 100).map(pmf).sum()
    }

    #[test]
    fn threshold_is_the_smallest_that_bounds_a_single_unit() {
        // ε = 1, δ = 0.01, k = 1: b = 1, m = ⌈4.605 − 0.313⌉ = 5, T = 6.
        let selection = PartitionSelection::new(1.0, 0.01, 1).expect("valid");
        assert_eq!((selection.threshold(), selection.scale()), (6, 1.0));
        for (epsilon, delta, k) in [
            (1.0, 0.01, 1),
            (1.0, 0.03, 3),
            (0.1, 1e-6, 1),
            (2.0, 1e-9, 10),
            (0.5, 0.5, 1),
        ] {
            let selection = PartitionSelection::new(epsilon, delta, k).expect("valid");
            let b = selection.scale();
            let delta_per_group = selection.delta_per_group();
            assert!(delta_per_group * k as f64 <= delta);
            let t = selection.threshold();
            // A group with one unit is kept iff 1 + Z ≥ T.
            assert!(
                upper_tail(b, t - 1) <= delta_per_group,
                "{epsilon} {delta} {k}: T = {t}"
            );
            if t >= 2 {
                assert!(
                    upper_tail(b, t - 2) > delta_per_group,
                    "{epsilon} {delta} {k}: T = {t} not tight"
                );
            }
        }
        // Tiny δ and many groups per unit stay finite and sensible.
        let selection = PartitionSelection::new(1.0, 1e-300, 10_000).expect("valid");
        let expected = 10_000.0 * (1e-304f64.recip().ln());
        assert!((selection.threshold() as f64 / expected - 1.0).abs() < 1e-3);
        assert_eq!(selection.max_groups_per_unit(), 10_000);
        assert_eq!((selection.epsilon(), selection.delta()), (1.0, 1e-300));
    }

    #[test]
    fn a_single_unit_is_rarely_kept() {
        // δ large enough to be measured: k = 1 (δ' = 0.01, exact rate 0.004926) and k = 3
        // (δ' = 0.01, exact rate 0.007645). N = 2·10⁵; two-sided Wilson interval at α = 1e-6
        // must contain the exact rate, and its upper end must stay below δ'.
        for (k, seed) in [(1u64, 31u64), (3, 32)] {
            let selection = PartitionSelection::new(1.0, 0.01 * k as f64, k).expect("valid");
            let exact_rate = upper_tail(selection.scale(), selection.threshold() - 1);
            let mut rng = seeded(seed);
            let n = 200_000u64;
            let kept = (0..n).filter(|_| selection.keep(&mut rng, 1)).count() as u64;
            let (lo, hi) = wilson_interval(kept, n, Z_TWO_SIDED_1E6);
            assert!(
                lo <= exact_rate && exact_rate <= hi,
                "k = {k}: {kept}/{n} vs {exact_rate}"
            );
            assert!(
                hi <= selection.delta_per_group(),
                "k = {k}: {kept}/{n} exceeds δ'"
            );
        }
    }

    #[test]
    fn many_units_are_kept() {
        // With 100 units and T = 6 a group is dropped only if Z ≤ -95: probability ≈ e^-95.
        let selection = PartitionSelection::new(1.0, 0.01, 1).expect("valid");
        let mut rng = seeded(33);
        assert!((0..10_000).all(|_| selection.keep(&mut rng, 100)));
        // With 30 units at k = 3 (T = 14, b = 3) a group is dropped iff Z ≤ -17, which has
        // probability q^17/(1+q) ≈ 0.002 (q = e^(-1/3)): the rate must match (two-sided Wilson
        // interval, α = 1e-6).
        let selection = PartitionSelection::new(1.0, 0.03, 3).expect("valid");
        let n = 100_000u64;
        let dropped = (0..n).filter(|_| !selection.keep(&mut rng, 30)).count() as u64;
        let exact_rate = upper_tail(selection.scale(), 30 - selection.threshold() + 1);
        let (lo, hi) = wilson_interval(dropped, n, Z_TWO_SIDED_1E6);
        assert!(
            lo <= exact_rate && exact_rate <= hi,
            "{dropped}/{n} vs {exact_rate}"
        );
    }

    /// `P(round(σZ) ≥ m) = P(Z ≥ (m − ½)/σ)` for a standard normal `Z`.
    fn gaussian_upper_tail(sigma: f64, m: i128) -> f64 {
        crate::budget::gdp::normal_upper_tail((m as f64 - 0.5) / sigma)
    }

    #[test]
    fn gaussian_threshold_bounds_a_single_unit_and_is_within_one_of_the_smallest() {
        for (sigma, delta, k) in [
            (2.0, 0.01, 1),
            (4.8, 1e-5, 1),
            (5.4, 1e-7, 5),
            (0.5, 0.01, 1),
            (30.0, 1e-6, 3),
            (1.0, 0.3, 1),
        ] {
            let selection = PartitionSelection::gaussian_threshold(sigma, delta, k).expect("valid");
            assert_eq!(selection.kind(), MechanismKind::Gaussian);
            assert_eq!((selection.scale(), selection.epsilon()), (sigma, 0.0));
            let delta_per_group = selection.delta_per_group();
            assert!(delta_per_group * k as f64 <= delta);
            let t = selection.threshold();
            // A group with one unit is kept iff 1 + Z ≥ T.
            assert!(
                gaussian_upper_tail(sigma, t - 1) <= delta_per_group,
                "{sigma} {delta} {k}: T = {t}"
            );
            // The tail bound costs at most one step against the exact smallest threshold.
            assert!(
                gaussian_upper_tail(sigma, t - 3) > delta_per_group,
                "{sigma} {delta} {k}: T = {t} is loose"
            );
        }
        for refused in [
            PartitionSelection::gaussian_threshold(0.0, 0.01, 1),
            PartitionSelection::gaussian_threshold(f64::NAN, 0.01, 1),
            PartitionSelection::gaussian_threshold(1.0, 0.0, 1),
            PartitionSelection::gaussian_threshold(1.0, 1.0, 1),
            PartitionSelection::gaussian_threshold(1.0, 0.01, 0),
        ] {
            assert!(refused.is_err());
        }
    }

    #[test]
    fn a_single_unit_is_rarely_kept_by_a_gaussian_threshold() {
        // σ = 1, δ = 0.3 (T = 3, exact rate 0.05856) and σ = 2, δ = 0.01 (T = 7, exact rate
        // 0.002728), N = 2·10⁵ each: the two-sided Wilson interval at α = 1e-6 must contain the
        // exact rate, and its upper end must stay below δ'.
        for (sigma, delta, seed) in [(1.0, 0.3, 41u64), (2.0, 0.01, 42)] {
            let selection = PartitionSelection::gaussian_threshold(sigma, delta, 1).expect("valid");
            let exact_rate = gaussian_upper_tail(sigma, selection.threshold() - 1);
            let mut rng = seeded(seed);
            let n = 200_000u64;
            let kept = (0..n).filter(|_| selection.keep(&mut rng, 1)).count() as u64;
            let (lo, hi) = wilson_interval(kept, n, Z_TWO_SIDED_1E6);
            assert!(
                lo <= exact_rate && exact_rate <= hi,
                "σ = {sigma}: {kept}/{n} vs {exact_rate}"
            );
            assert!(hi <= selection.delta_per_group(), "σ = {sigma}: {kept}/{n}");
            // The released-count form decides the same way on the same noisy value.
            let t = selection.threshold();
            assert!(selection.keeps_released(t) && !selection.keeps_released(t - 1));
        }
    }

    /// The optimal rule's table satisfies, in independent f64 arithmetic with the true `e^ε'`,
    /// the four (ε', δ') inequalities between every `n − 1` and `n`, starts at 0, gives a
    /// one-unit group at most δ', ends at 1, and never decreases.
    #[test]
    fn optimal_rule_is_epsilon_delta_dp_between_neighbouring_counts() {
        for (epsilon, delta, k) in [
            (1.0, 1e-7, 1),
            (1.0 / 3.0, 1e-7, 5),
            (0.1, 1e-5, 1),
            (2.0, 1e-9, 3),
            (0.05, 1e-6, 10),
        ] {
            let s = PartitionSelection::optimal(epsilon, delta, k)
                .expect("valid")
                .expect("a table");
            let eps = epsilon / k as f64;
            let dp = delta / k as f64;
            let last = s.certain_from().expect("a table") as u64;
            let p = |n: u64| s.keep_probability(n).expect("a table");
            assert_eq!(p(0), 0.0);
            assert!(p(1) <= dp * (1.0 + 1e-12), "{}", p(1));
            assert_eq!(p(last), 1.0);
            assert_eq!(p(last + 1000), 1.0);
            assert!(p(last - 1) < 1.0);
            let slack = 1e-12;
            for n in 1..=last {
                let (a, b) = (p(n - 1), p(n));
                assert!(b >= a, "n={n}");
                assert!(b <= eps.exp() * a + dp + slack, "keep, n={n}");
                assert!(1.0 - a <= eps.exp() * (1.0 - b) + dp + slack, "drop, n={n}");
            }
            // The optimum is reached up to the fixed point: each step is within 2⁻⁶⁰ of the
            // larger of the two bounds' minimum.
            for n in 1..last {
                let a = p(n - 1);
                let bound = (eps.exp() * a + dp).min(1.0 - (-eps).exp() * (1.0 - a - dp));
                assert!(p(n) >= bound - 1e-9, "n={n}: {} < {bound}", p(n));
            }
        }
    }

    /// The optimal rule keeps groups from a smaller count than Laplace thresholding at the same
    /// (ε, δ, k): its half-way count is below Laplace's threshold.
    #[test]
    fn optimal_rule_keeps_smaller_groups_than_laplace_thresholding() {
        for (epsilon, delta, k) in [(1.0, 1e-7, 1), (1.0 / 3.0, 1e-7, 5), (0.5, 1e-7, 5)] {
            let laplace = PartitionSelection::new(epsilon, delta, k).expect("valid");
            let optimal = PartitionSelection::optimal(epsilon, delta, k)
                .expect("valid")
                .expect("a table");
            assert!(
                optimal.threshold() < laplace.threshold(),
                "{} vs {}",
                optimal.threshold(),
                laplace.threshold()
            );
        }
        // ε = 1/3 over 5 groups, δ = 10⁻⁷ (AVG by diagnosis on the demo): 258 for Laplace.
        let optimal = PartitionSelection::optimal(1.0 / 3.0, 1e-7, 5)
            .expect("valid")
            .expect("a table");
        assert!(optimal.threshold() < 230, "{}", optimal.threshold());
    }

    /// `keep` draws Bernoulli(π(n)): at the half-way count, and at the count where π is about
    /// 0.1, the frequency over 200,000 draws lies in the Wilson interval at z for a two-sided
    /// 10⁻⁶ false-positive rate; a count of 0 is never kept and a count past the table always.
    #[test]
    fn optimal_rule_keeps_with_its_stated_probability() {
        let s = PartitionSelection::optimal(1.0 / 3.0, 1e-7, 5)
            .expect("valid")
            .expect("a table");
        let mut rng = seeded(41);
        let tenth = (0..)
            .find(|&n| s.keep_probability(n).expect("a table") >= 0.1)
            .expect("reaches 1");
        for n in [s.threshold() as u64, tenth] {
            let p = s.keep_probability(n).expect("a table");
            let draws = 200_000u64;
            let kept = (0..draws).filter(|_| s.keep(&mut rng, n)).count() as u64;
            let (lo, hi) = wilson_interval(kept, draws, Z_TWO_SIDED_1E6);
            assert!(lo <= p && p <= hi, "n={n}: p={p}, [{lo}, {hi}]");
        }
        assert!((0..1000).all(|_| !s.keep(&mut rng, 0)));
        let certain = s.certain_from().expect("a table") as u64;
        assert!((0..1000).all(|_| s.keep(&mut rng, certain + 5)));
    }

    /// A tiny ε per group would need an enormous table: the caller falls back to thresholding.
    #[test]
    fn optimal_rule_declines_a_table_too_long() {
        assert!(PartitionSelection::optimal(1e-6, 1e-7, 1)
            .expect("valid")
            .is_none());
    }
}
