//! [`PartitionSelection`]: deciding, with differential privacy, which non-public group keys may be
//! released at all.
//!
//! Invariants:
//! - A group is kept iff its exact count of distinct privacy units plus discrete Laplace noise of
//!   scale `k/ε` reaches the threshold `T`; nothing else about the group is consulted.
//! - `T` is chosen from the exact discrete Laplace tail so that a group with a single unit is kept
//!   with probability at most `δ/k`; it is computed in `f64` with an upward margin only.

use num_bigint::BigInt;
use num_rational::BigRational;
use rand::{CryptoRng, Rng};

use super::exact::{f64_at_least, next_down, rational_from_f64};
use super::noise::FLOAT_MARGIN;
use super::sample::sample_discrete_laplace;
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
/// partition selection" (PoPETs 2022, arXiv:2006.03684), whose optimal rule keeps somewhat more
/// groups at the same `(ε, δ)` and could replace this one later.
#[derive(Debug, Clone, PartialEq)]
pub struct PartitionSelection {
    epsilon: f64,
    delta: f64,
    max_groups_per_unit: u64,
    scale: f64,
    scale_exact: BigRational,
    delta_per_group: f64,
    threshold: i128,
}

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
        let scale_exact = rational_from_f64(scale).expect("invariant: the scale is finite");

        // δ' = δ/k rounded down, checked exactly: k·δ' ≤ δ.
        let delta_exact = rational_from_f64(delta).expect("invariant: delta is finite");
        let mut delta_per_group = delta / max_groups_per_unit as f64;
        while delta_per_group >= f64::MIN_POSITIVE
            && rational_from_f64(delta_per_group).expect("invariant: finite") * &groups
                > delta_exact
        {
            delta_per_group = next_down(delta_per_group);
        }
        if delta_per_group < f64::MIN_POSITIVE {
            return Err(invalid("delta divided by max_groups_per_unit is too small"));
        }
        let threshold = laplace_threshold(scale, delta_per_group);
        Ok(PartitionSelection {
            epsilon,
            delta,
            max_groups_per_unit,
            scale,
            scale_exact,
            delta_per_group,
            threshold,
        })
    }

    /// The threshold `T` on the noisy distinct-unit count (for EXPLAIN): a group is kept iff
    /// `units + noise ≥ T`.
    pub fn threshold(&self) -> i128 {
        self.threshold
    }

    /// The scale `k/ε` of the discrete Laplace noise on the distinct-unit count.
    pub fn scale(&self) -> f64 {
        self.scale
    }

    /// The `ε` this selection spends.
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
    /// for kept groups need their own mechanism and budget.
    pub fn keep<R: Rng + CryptoRng + ?Sized>(&self, rng: &mut R, units: u64) -> bool {
        let noisy = BigInt::from(units) + sample_discrete_laplace(rng, &self.scale_exact);
        noisy >= BigInt::from(self.threshold)
    }
}

impl PartitionSelection {
    /// Whether to release a group whose count was released as `noisy` by the measure's own
    /// discrete Laplace noise (Laplace thresholding of a released count).
    ///
    /// # Privacy
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
}
