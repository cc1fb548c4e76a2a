//! DP quantiles by report-noisy-max over a fixed bucketing of the argument's bounds.
//!
//! The upstream returns, per group, the histogram of the clamped argument over
//! [`QUANTILE_BUCKETS`] equal buckets of `[lower, upper]`, each privacy unit keeping at most
//! `max_rows_per_unit` values per group (and contributing to at most `max_groups_per_unit`
//! groups). pgdp scores each bucket `b` by how far the target rank is from the bucket's ranks,
//!
//! `u(b) = −max(1000·L(b) − q·n, q·n − 1000·L(b+1), 0)`,
//!
//! where `L(b)` is the number of values in buckets before `b`, `n` the number of values and
//! `q` the quantile in thousandths (so `u(b)` is −1000 × the distance in ranks from the target
//! `(q/1000)·n` to the interval `[L(b), L(b+1)]`, an integer), adds independent discrete Laplace
//! noise to every score and releases the middle of the bucket with the highest noisy score (the
//! first on ties).
//!
//! Every bucket at or below the smallest value has rank interval `[0, 0]`, so the 0-quantile
//! cannot tell them apart: a DP minimum is not estimable. `MIN` and `MAX` are therefore released
//! as the quantiles [`MIN_PERMILLE`] and [`MAX_PERMILLE`] (1st and 99th percentiles).
//!
//! Invariants:
//! - Scores are integers and the noise comes from the exact discrete Laplace sampler of
//!   [`crate::dp::mechanism::Noise`]; no floating-point noise.
//! - The bucketing depends only on the declared or derived bounds, never on the data.
//!
//! # Privacy
//! Adding or removing one unit adds or removes `m ≤ C = max_rows_per_unit` values of a group:
//! `1000·L(b)` and `1000·L(b+1)` move by values in `[0, 1000·m]` and `q·n` by `q·m ∈ [0, 1000·m]`,
//! all in the same direction, so each of the three terms of the max moves by at most `1000·m`
//! and so does their max: every score moves by at most `Δu = 1000·C`. Report-noisy-max
//! with Laplace noise of scale `2Δu/ε` is `ε`-DP for any scores of sensitivity `Δu` (Dwork & Roth
//! 2014, Claim 3.9 and the remark after it; McSherry & Talwar 2007 for the exponential mechanism
//! it approximates). The proof fixes the other noises and shows the threshold noise `r*` at which
//! bucket `b` wins moves by at most `2Δu`; for discrete Laplace noise of scale `t` on integer
//! scores `P[X ≥ r + k] ≥ e^(−k/t)·P[X ≥ r]` for every integer `k ≥ 0`, so the same argument goes
//! through with ties broken by a fixed rule. A unit touches at most `G = max_groups_per_unit`
//! groups, so by basic composition each group's choice gets `ε/G`: the noise scale is
//! `2·Δu·G/ε = 2000·C·G/ε` score units, that is `2·C·G/ε` ranks.

use rand::{CryptoRng, Rng};

use crate::dp::mechanism::Noise;
use crate::error::{Error, Result};

pub use crate::limits::QUANTILE_BUCKETS;

/// The quantile (in thousandths) released for `MIN`: the 1st percentile.
pub const MIN_PERMILLE: u16 = 10;

/// The quantile (in thousandths) released for `MAX`: the 99th percentile.
pub const MAX_PERMILLE: u16 = 990;

/// The L1 "sensitivity" to build the quantile's [`Noise`] with (per group, before multiplying by
/// the groups per unit): twice the score sensitivity `Δu = 1000·max_rows_per_unit`, so that
/// `Noise::laplace(G · this, ε)` has the report-noisy-max scale `2·Δu·G/ε`.
pub fn quantile_noise_sensitivity(max_rows_per_unit: u64) -> f64 {
    2.0 * 1000.0 * max_rows_per_unit as f64
}

/// Parses the upstream's histogram text `bucket:count,bucket:count` (empty for no values).
///
/// # Errors
/// [`Error::Internal`] if the text is malformed or names a bucket outside the bucketing.
pub fn parse_histogram(text: &str) -> Result<Vec<u64>> {
    let mut counts = vec![0u64; QUANTILE_BUCKETS as usize];
    let bad = || Error::internal("upstream returned a malformed histogram");
    for part in text.split(',').filter(|p| !p.is_empty()) {
        let (b, c) = part.split_once(':').ok_or_else(bad)?;
        let b: usize = b.trim().parse().map_err(|_| bad())?;
        let c: u64 = c.trim().parse().map_err(|_| bad())?;
        let slot = counts.get_mut(b).ok_or_else(bad)?;
        *slot = slot.saturating_add(c);
    }
    Ok(counts)
}

/// Chooses a bucket for quantile `permille`/1000 of the histogram by report-noisy-max with
/// `noise` (built with [`quantile_noise_sensitivity`]).
///
/// # Privacy
/// See the module documentation: `ε`-DP per group for the `ε` the noise was built with, divided
/// by the groups per unit folded into its sensitivity.
pub fn noisy_quantile_bucket<R: Rng + CryptoRng + ?Sized>(
    rng: &mut R,
    noise: &Noise,
    histogram: &[u64],
    permille: u16,
) -> usize {
    let n: i128 = histogram.iter().map(|&c| i128::from(c)).sum();
    let target = i128::from(permille.min(1000)) * n;
    let mut below: i128 = 0;
    let mut best: Option<(i128, usize)> = None;
    for (b, &c) in histogram.iter().enumerate() {
        let above = below + i128::from(c);
        let score = -(1000 * below - target).max(target - 1000 * above).max(0);
        let noisy = noise.release_integer(rng, score);
        if best.is_none_or(|(v, _)| noisy > v) {
            best = Some((noisy, b));
        }
        below = above;
    }
    best.map(|(_, b)| b).unwrap_or(0)
}

/// The value released for bucket `b` of `[lower, upper]`: its middle.
pub fn bucket_value(b: usize, lower: f64, upper: f64) -> f64 {
    let width = (upper - lower) / QUANTILE_BUCKETS as f64;
    (lower + (b as f64 + 0.5) * width).clamp(lower, upper)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dp::mechanism::testing::seeded;

    #[test]
    fn histogram_parses_and_rejects_garbage() {
        let h = parse_histogram("0:3,255:2").unwrap();
        assert_eq!(h[0], 3);
        assert_eq!(h[255], 2);
        assert_eq!(parse_histogram("").unwrap().iter().sum::<u64>(), 0);
        assert!(parse_histogram("256:1").is_err());
        assert!(parse_histogram("x").is_err());
    }

    #[test]
    fn median_of_a_concentrated_histogram_is_found_at_high_epsilon() {
        // 10 000 values in bucket 100, one unit contributes at most 1 value: noise scale
        // 2000/ε score units = 2/ε ranks. With ε = 10 every other bucket is thousands of ranks
        // worse, so a wrong choice has probability far below 1e-9 (false-positive rate).
        let mut h = vec![0u64; QUANTILE_BUCKETS as usize];
        h[100] = 10_000;
        let noise = Noise::laplace(quantile_noise_sensitivity(1), 10.0).unwrap();
        let mut rng = seeded(7);
        for _ in 0..20 {
            assert_eq!(noisy_quantile_bucket(&mut rng, &noise, &h, 500), 100);
        }
    }

    #[test]
    fn minimum_and_maximum_pick_the_extreme_occupied_buckets() {
        let mut h = vec![0u64; QUANTILE_BUCKETS as usize];
        h[50..=200].fill(1000);
        let noise = Noise::laplace(quantile_noise_sensitivity(1), 10.0).unwrap();
        let mut rng = seeded(11);
        // 151 000 values; the 1st percentile (rank 1510) is in bucket 51, the 99th (rank
        // 149 490) in bucket 199; other buckets are at least 490 ranks off and the noise is 0.2
        // ranks: exact with overwhelming probability (false-positive rate below 1e-9).
        assert_eq!(
            noisy_quantile_bucket(&mut rng, &noise, &h, MIN_PERMILLE),
            51
        );
        assert_eq!(
            noisy_quantile_bucket(&mut rng, &noise, &h, MAX_PERMILLE),
            199
        );
    }

    #[test]
    fn bucket_value_is_the_middle_inside_the_bounds() {
        assert_eq!(bucket_value(0, 0.0, 256.0), 0.5);
        assert_eq!(bucket_value(255, 0.0, 256.0), 255.5);
    }
}
