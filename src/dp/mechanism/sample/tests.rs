//! Statistical tests of the exact samplers, with fixed seeds and stated false-positive rates.

use super::super::testing::{
    chi_square_critical, chi_square_statistic, seeded, wilson_interval, Z_TWO_SIDED_1E6,
};
use super::*;
use std::collections::BTreeMap;

fn q(n: i64, d: i64) -> BigRational {
    BigRational::new(BigInt::from(n), BigInt::from(d))
}

fn discrete_laplace_pmf(scale: f64) -> impl Fn(i64) -> f64 {
    move |x| (0.5 / scale).tanh() * (-(x.abs() as f64) / scale).exp()
}

fn discrete_gaussian_pmf(sigma: f64) -> impl Fn(i64) -> f64 {
    let weight = move |x: i64| (-((x * x) as f64) / (2.0 * sigma * sigma)).exp();
    let width = (sigma * 40.0) as i64 + 10;
    let total: f64 = (-width..=width).map(weight).sum();
    move |x| weight(x) / total
}

/// Draws `n` integer samples and returns their histogram.
fn histogram(n: usize, mut draw: impl FnMut() -> BigInt) -> BTreeMap<i64, u64> {
    let mut counts = BTreeMap::new();
    for _ in 0..n {
        let x = draw().to_i64().expect("samples in these tests are small");
        *counts.entry(x).or_insert(0) += 1;
    }
    counts
}

#[test]
fn uniform_below_is_unbiased() {
    let mut rng = seeded(1);
    // Word-sized bounds (for these the bias of a plain `mod` would be invisible; the byte
    // path below is where rejection matters).
    for (bound, n) in [(1u64, 1_000usize), (2, 20_000), (7, 70_000), (100, 100_000)] {
        let upper = BigUint::from(bound);
        let counts = histogram(n, || BigInt::from(uniform_below(&mut rng, &upper)));
        if bound == 1 {
            assert_eq!(counts.get(&0), Some(&(n as u64)));
            continue;
        }
        let (stat, df) = chi_square_statistic(&counts, n as u64, |x| {
            if (0..bound as i64).contains(&x) {
                1.0 / bound as f64
            } else {
                0.0
            }
        });
        // α = 1e-6 (Wilson–Hilferty critical value).
        assert!(
            stat < chi_square_critical(df),
            "bound {bound}: χ² = {stat}, df = {df}"
        );
    }
    // A 128-bit bound m ≈ 2^129/3 takes the two-word path, a 136-bit one m ≈ 2^137/3 the byte
    // path: 2^128 (or seventeen bytes, 2^136) ≈ 1.5·m values, so without rejection the lowest
    // third of [0, m) would be twice as likely. Ten equal-width bins (their sizes differ by
    // at most one value in 2^128, a negligible bias).
    for bits in [129usize, 137] {
        let big: BigUint = (BigUint::one() << bits) / 3u32 + 5u32;
        let n = 50_000usize;
        let counts = histogram(n, || {
            let x = uniform_below(&mut rng, &big);
            assert!(x < big);
            BigInt::from((x * 10u32) / &big)
        });
        let (stat, df) = chi_square_statistic(&counts, n as u64, |x| {
            if (0..10).contains(&x) {
                0.1
            } else {
                0.0
            }
        });
        // α = 1e-6 (Wilson–Hilferty critical value).
        assert!(
            stat < chi_square_critical(df),
            "2^{bits}/3 bound: χ² = {stat}, df = {df}"
        );
    }
}

#[test]
fn exp_neg_table_holds_the_first_128_bits_of_e_to_the_minus_v() {
    assert_eq!(e1_bits(2), BigUint::from(1u8), "e^-1 = 0.01…b");
    for v in 1..=EXP_NEG_THRESHOLDS {
        assert_eq!(
            exp_neg_bits(v, 128),
            BigUint::from(E_NEG_128[v as usize]),
            "v = {v}"
        );
    }
    assert_eq!(exp_neg_bits(1, 300), e1_bits(300));
    // The next bits continue them.
    assert_eq!(
        exp_neg_bits(3, 256) >> 128usize,
        BigUint::from(E_NEG_128[3])
    );
}

/// A generator that returns scripted words first, then a seeded stream.
struct Scripted {
    words: std::collections::VecDeque<u64>,
    then: rand::rngs::ChaCha20Rng,
}

impl rand::TryRng for Scripted {
    type Error = std::convert::Infallible;
    fn try_next_u32(&mut self) -> Result<u32, Self::Error> {
        self.try_next_u64().map(|w| w as u32)
    }
    fn try_next_u64(&mut self) -> Result<u64, Self::Error> {
        Ok(self
            .words
            .pop_front()
            .unwrap_or_else(|| self.then.next_u64()))
    }
    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Self::Error> {
        self.then.fill_bytes(dst);
        Ok(())
    }
}

impl rand::TryCryptoRng for Scripted {}

fn scripted(words: &[u128]) -> Scripted {
    Scripted {
        words: words
            .iter()
            .flat_map(|w| [(w >> 64) as u64, *w as u64])
            .collect(),
        then: seeded(99),
    }
}

#[test]
fn exp_neg_coins_decide_ties_with_further_exact_bits() {
    let one = BigUint::one();
    let e1 = E_NEG_128[1];
    let next = (exp_neg_bits(1, 256) & ((BigUint::one() << 128usize) - 1u32))
        .to_u128()
        .expect("128 bits");
    for (draw, expected) in [(next - 1, true), (next + 1, false)] {
        let mut work = Work::default();
        let coin = exp_neg_coin(&mut scripted(&[e1, draw]), &mut work, &one);
        assert_eq!((coin, work.fallbacks, work.trials), (expected, 1, 1));
    }
    for (draw, expected) in [(e1 - 1, true), (e1 + 1, false)] {
        let mut work = Work::default();
        let coin = exp_neg_coin(&mut scripted(&[draw]), &mut work, &one);
        assert_eq!((coin, work.fallbacks), (expected, 0));
    }
    // A geometric count whose draw ties with e^-3 is 3 or 2 as the next bits say.
    let next = (exp_neg_bits(3, 256) & ((BigUint::one() << 128usize) - 1u32))
        .to_u128()
        .expect("128 bits");
    for (draw, expected) in [(next - 1, 3), (next + 1, 2)] {
        let mut work = Work::default();
        let v = geometric_e1(&mut scripted(&[E_NEG_128[3], draw]), &mut work);
        assert_eq!((v, work.fallbacks), (expected, 1));
    }
    // Rates: two-sided Wilson intervals, α = 1e-6 each.
    let mut rng = seeded(8);
    let n = 100_000u64;
    for v in [0u64, 1, 2, 5] {
        let hits = (0..n)
            .filter(|_| exp_neg_coin(&mut rng, &mut Work::default(), &BigUint::from(v)))
            .count() as u64;
        let (lo, hi) = wilson_interval(hits, n, Z_TWO_SIDED_1E6);
        let p = (-(v as f64)).exp();
        assert!(lo <= p && p <= hi, "e^-{v}: {hits}/{n}");
    }
}

#[test]
fn fixed_budgets_fall_back_and_stay_exact() {
    // All 24 coins of an e^-1 loop true (x = 1: coin k is a uniform draw below k compared
    // with 1; the word 1 gives the draw 0 for every k): K > 24, the loop goes on.
    let mut rng = scripted(&[]);
    rng.words = std::iter::repeat_n(1u64, EXP_COIN_TRIALS as usize).collect();
    let mut work = Work::default();
    exp_coin_unit(&mut rng, &mut work, &BigUint::one(), &BigUint::one());
    assert_eq!(work.fallbacks, 1);
    assert!(work.trials == EXP_COIN_TRIALS);
    // A draw below e^-48: the geometric count goes on past 48.
    let mut rng = scripted(&[0]);
    let mut work = Work::default();
    let v = geometric_e1(&mut rng, &mut work);
    assert!(v >= EXP_NEG_THRESHOLDS, "{v}");
    assert_eq!(work.fallbacks, 1);
    // A coin on the 128-bit path whose first bits tie with x/k goes on exactly: x = 1/3 with
    // a denominator too large for a word; the draw equal to floor(2^128/3) is a tie, the
    // next bits decide.
    let d = BigUint::from(3u8) << 70usize;
    let n = BigUint::one() << 70usize;
    let prefix = u128::MAX / 3;
    for (next, expected) in [(0u128, true), (u128::MAX, false)] {
        let mut work = Work::default();
        let heads = lazy_coin(
            &mut scripted(&[prefix, next]),
            &mut work,
            prefix,
            || n.clone(),
            || d.clone(),
        );
        assert_eq!((heads, work.fallbacks), (expected, 1));
    }
    // An exponent of 60 and a draw below e^-48: e^-60 is computed exactly.
    let mut rng = scripted(&[0]);
    let mut work = Work::default();
    exp_coin(&mut rng, &mut work, &BigUint::from(60u8), &BigUint::one());
    assert_eq!(work.fallbacks, 1);
}

/// The heart of the timing defence: every sample, whatever its value, takes exactly the
/// trials its rejection rounds imply (no loop runs longer for larger noise), and the number
/// of rounds is independent of the value. Counted, not timed.
#[test]
fn trials_do_not_depend_on_the_noise_drawn() {
    let mut rng = seeded(9);
    let n = 20_000usize;
    let scales = [
        q(1, 2),
        q(1, 1),
        q(37, 10),
        q(20, 1),
        BigRational::from_integer(BigInt::one() << 45usize) + q(1, 3),
    ];
    for sampler in ["laplace", "discrete gaussian", "rounded gaussian"] {
        for scale in &scales {
            let b = scale.to_f64().expect("finite");
            let mut samples = Vec::with_capacity(n);
            for _ in 0..n {
                let (y, work) = match sampler {
                    "laplace" => sample_discrete_laplace_counted(&mut rng, scale),
                    "discrete gaussian" => sample_discrete_gaussian_counted(&mut rng, scale),
                    _ => sample_rounded_gaussian_counted(&mut rng, scale),
                };
                assert_eq!(work.fallbacks, 0, "a 2^-64 event in a fixed-seed test");
                assert_eq!(
                    work.trials,
                    work.expected_trials(),
                    "scale {scale}, value {y}: {work:?}"
                );
                samples.push((y.to_f64().expect("finite").abs() / b, work.trials));
            }
            // Large noise was drawn (the old samplers took many more trials for it).
            let largest = samples.iter().map(|(y, _)| *y).fold(0.0, f64::max);
            assert!(largest >= 3.0, "scale {scale}: largest |y|/b = {largest}");
            // Independence of trials and value: a 3×3 contingency table of |y|/b classes
            // against trial-count classes (at its terciles), χ² with df = 4 at α = 1e-6.
            let mut trials: Vec<u64> = samples.iter().map(|(_, t)| *t).collect();
            trials.sort_unstable();
            let (t1, t2) = (trials[n / 3], trials[2 * n / 3]);
            let value_class = |y: f64| {
                if y < 0.5 {
                    0
                } else if y < 1.5 {
                    1
                } else {
                    2
                }
            };
            let trial_class = |t: u64| {
                if t <= t1 {
                    0
                } else if t <= t2 {
                    1
                } else {
                    2
                }
            };
            let mut table = [[0f64; 3]; 3];
            for (y, t) in &samples {
                table[value_class(*y)][trial_class(*t)] += 1.0;
            }
            let rows: Vec<f64> = table.iter().map(|r| r.iter().sum()).collect();
            let cols: Vec<f64> = (0..3).map(|j| table.iter().map(|r| r[j]).sum()).collect();
            let mut stat = 0.0;
            let mut df = 0usize;
            let (live_rows, live_cols) = (
                rows.iter().filter(|r| **r > 0.0).count(),
                cols.iter().filter(|c| **c > 0.0).count(),
            );
            for i in 0..3 {
                for j in 0..3 {
                    let expected = rows[i] * cols[j] / n as f64;
                    if expected > 0.0 {
                        stat += (table[i][j] - expected).powi(2) / expected;
                    }
                }
            }
            df += (live_rows.saturating_sub(1)) * (live_cols.saturating_sub(1));
            if df > 0 {
                assert!(
                    stat < chi_square_critical(df),
                    "{sampler}, scale {scale}: χ² = {stat}, df = {df}, {table:?}"
                );
            }
        }
    }
}

#[test]
#[should_panic(expected = "positive bound")]
fn uniform_below_zero_is_a_bug() {
    uniform_below(&mut seeded(0), &BigUint::zero());
}

#[test]
fn bernoulli_rates_match() {
    let mut rng = seeded(2);
    let n = 100_000u64;
    for (num, den) in [
        (0, 1),
        (1, 1),
        (1, 3),
        (7, 10),
        (1, 1000),
        (999_999, 1_000_000),
    ] {
        let p = q(num, den);
        let hits = (0..n).filter(|_| bernoulli(&mut rng, &p)).count() as u64;
        let expected = num as f64 / den as f64;
        if num == 0 || num == den {
            assert_eq!(hits, if num == 0 { 0 } else { n });
            continue;
        }
        // Two-sided Wilson interval, α = 1e-6.
        let (lo, hi) = wilson_interval(hits, n, Z_TWO_SIDED_1E6);
        assert!(
            lo <= expected && expected <= hi,
            "p = {num}/{den}: {hits}/{n}"
        );
    }
    // A probability with a denominator beyond 2^64 takes the byte path.
    let p = BigRational::new(BigInt::one() << 80usize, BigInt::from(3) << 80usize);
    let hits = (0..n).filter(|_| bernoulli(&mut rng, &p)).count() as u64;
    let (lo, hi) = wilson_interval(hits, n, Z_TWO_SIDED_1E6);
    assert!(lo <= 1.0 / 3.0 && 1.0 / 3.0 <= hi, "big 1/3: {hits}/{n}");
}

#[test]
fn bernoulli_exp_rates_match() {
    let mut rng = seeded(3);
    let n = 100_000u64;
    for (num, den) in [(0, 1), (1, 2), (1, 1), (5, 2), (10, 3), (1, 1_000)] {
        let x = q(num, den);
        let hits = (0..n).filter(|_| bernoulli_exp(&mut rng, &x)).count() as u64;
        let expected = (-(num as f64) / den as f64).exp();
        if num == 0 {
            assert_eq!(hits, n);
            continue;
        }
        // Two-sided Wilson interval, α = 1e-6.
        let (lo, hi) = wilson_interval(hits, n, Z_TWO_SIDED_1E6);
        assert!(
            lo <= expected && expected <= hi,
            "x = {num}/{den}: {hits}/{n}"
        );
    }
}

#[test]
fn bernoulli_exp_with_huge_denominators_takes_the_128_bit_path() {
    // Denominators beyond 2^64/24: the coins of the fractional part compare 128 random bits.
    let mut rng = seeded(10);
    let n = 100_000u64;
    let big = BigInt::one() << 90usize;
    for (num, den) in [(1, 3), (2, 3), (7, 2), (1, 1)] {
        let x = BigRational::new(BigInt::from(num) * &big + 1, BigInt::from(den) * &big);
        let hits = (0..n).filter(|_| bernoulli_exp(&mut rng, &x)).count() as u64;
        let expected = (-(num as f64) / den as f64).exp();
        // Two-sided Wilson interval, α = 1e-6 (x differs from num/den by 2^-90).
        let (lo, hi) = wilson_interval(hits, n, Z_TWO_SIDED_1E6);
        assert!(
            lo <= expected && expected <= hi,
            "x ≈ {num}/{den}: {hits}/{n}"
        );
    }
}

#[test]
#[should_panic(expected = "p in [0, 1]")]
fn bernoulli_above_one_is_a_bug() {
    bernoulli(&mut seeded(0), &q(3, 2));
}

#[test]
fn geometric_matches_its_pmf() {
    let mut rng = seeded(4);
    let n = 50_000usize;
    for x in [q(1, 3), q(2, 1)] {
        let rate = x.to_f64().expect("small");
        let counts = histogram(n, || BigInt::from(sample_geometric(&mut rng, &x)));
        let pmf = |k: i64| {
            if k < 0 {
                0.0
            } else {
                (1.0 - (-rate).exp()) * (-(k as f64) * rate).exp()
            }
        };
        let (stat, df) = chi_square_statistic(&counts, n as u64, pmf);
        // α = 1e-6 (Wilson–Hilferty critical value).
        assert!(
            stat < chi_square_critical(df),
            "x = {x}: χ² = {stat}, df = {df}"
        );
    }
}

#[test]
fn discrete_laplace_matches_its_pmf() {
    let mut rng = seeded(5);
    let n = 100_000usize;
    for scale in [q(1, 2), q(1, 1), q(37, 10), q(20, 1)] {
        let b = scale.to_f64().expect("small");
        let counts = histogram(n, || sample_discrete_laplace(&mut rng, &scale));
        let (stat, df) = chi_square_statistic(&counts, n as u64, discrete_laplace_pmf(b));
        // α = 1e-6 (Wilson–Hilferty critical value).
        assert!(
            stat < chi_square_critical(df),
            "scale {scale}: χ² = {stat}, df = {df}"
        );
    }
}

/// `P(round(σZ) = x)` for a standard normal `Z`.
fn rounded_gaussian_pmf(sigma: f64) -> impl Fn(i64) -> f64 {
    move |x| {
        let m = x.abs() as f64;
        crate::budget::gdp::normal_upper_tail((m - 0.5) / sigma)
            - crate::budget::gdp::normal_upper_tail((m + 0.5) / sigma)
    }
}

#[test]
fn rounded_gaussian_matches_its_pmf() {
    let mut rng = seeded(16);
    let n = 100_000usize;
    // σ below one step (nearly all mass on 0 and ±1), near one, and a non-dyadic rational.
    for sigma in [q(1, 3), q(1, 1), q(37, 10), q(539, 100)] {
        let s = sigma.to_f64().expect("small");
        let counts = histogram(n, || sample_rounded_gaussian(&mut rng, &sigma));
        let (stat, df) = chi_square_statistic(&counts, n as u64, rounded_gaussian_pmf(s));
        // α = 1e-6 (Wilson–Hilferty critical value).
        assert!(
            stat < chi_square_critical(df),
            "sigma {sigma}: χ² = {stat}, df = {df}"
        );
    }
}

/// The standard normal behind the rounding, seen through a huge `σ`: `round(σZ)/σ` is `Z` to
/// within `1/(2σ)`, so the sample's quantiles are those of `N(0, 1)`.
#[test]
fn rounded_gaussian_with_a_huge_sigma_is_the_standard_normal() {
    let mut rng = seeded(17);
    let sigma = BigRational::from_integer(BigInt::one() << 80usize) + q(1, 7);
    let n = 20_000u64;
    let mut below = [0u64; 5];
    let cuts = [
        -1.6448536269514722,
        -0.6744897501960817,
        0.0,
        0.6744897501960817,
        1.6448536269514722,
    ];
    let expected = [0.05, 0.25, 0.5, 0.75, 0.95];
    for _ in 0..n {
        let z = (BigRational::from_integer(sample_rounded_gaussian(&mut rng, &sigma)) / &sigma)
            .to_f64()
            .expect("finite");
        for (count, cut) in below.iter_mut().zip(cuts) {
            *count += u64::from(z < cut);
        }
    }
    for (count, p) in below.iter().zip(expected) {
        let (lo, hi) = wilson_interval(*count, n, Z_TWO_SIDED_1E6);
        assert!(lo <= p && p <= hi, "{count}/{n} below the {p} quantile");
    }
}

#[test]
fn discrete_gaussian_matches_its_pmf() {
    let mut rng = seeded(6);
    let n = 100_000usize;
    for sigma in [q(1, 2), q(1, 1), q(37, 10), q(20, 1)] {
        let s = sigma.to_f64().expect("small");
        let counts = histogram(n, || sample_discrete_gaussian(&mut rng, &sigma));
        let (stat, df) = chi_square_statistic(&counts, n as u64, discrete_gaussian_pmf(s));
        // α = 1e-6 (Wilson–Hilferty critical value).
        assert!(
            stat < chi_square_critical(df),
            "sigma {sigma}: χ² = {stat}, df = {df}"
        );
    }
}

#[test]
fn huge_scales_take_the_big_integer_path() {
    // Scale 2^70 + 1/3: |X|/scale is then Exp(1) up to a 2^-70 discretisation, and X is
    // symmetric. Ten equiprobable bins of the signed value against their exact Laplace mass.
    let mut rng = seeded(7);
    let n = 20_000usize;
    let scale = BigRational::from_integer(BigInt::one() << 70usize) + q(1, 3);
    let b = scale.to_f64().expect("finite");
    // Bin edges at the Laplace deciles: ±b·ln(5/2), ±b·ln(5/4)... of the continuous limit.
    let edges: Vec<f64> = (1..10)
        .map(|i| {
            let p = i as f64 / 10.0;
            if p < 0.5 {
                b * (2.0 * p).ln()
            } else {
                -b * (2.0 * (1.0 - p)).ln()
            }
        })
        .collect();
    let counts = histogram(n, || {
        let x = sample_discrete_laplace(&mut rng, &scale)
            .to_f64()
            .expect("finite");
        BigInt::from(edges.iter().filter(|&&e| x >= e).count())
    });
    let (stat, df) = chi_square_statistic(&counts, n as u64, |k| {
        if (0..10).contains(&k) {
            0.1
        } else {
            0.0
        }
    });
    assert!(
        stat < chi_square_critical(df),
        "huge Laplace: χ² = {stat}, df = {df}"
    );

    // The same for a discrete Gaussian with σ = 2^70 against normal deciles.
    let sigma = BigRational::from_integer(BigInt::one() << 70usize);
    let s = sigma.to_f64().expect("finite");
    let deciles = [
        -1.2815515655446004,
        -0.8416212335729143,
        -0.5244005127080407,
        -0.2533471031357997,
        0.0,
        0.2533471031357997,
        0.5244005127080407,
        0.8416212335729143,
        1.2815515655446004,
    ];
    let counts = histogram(n, || {
        let x = sample_discrete_gaussian(&mut rng, &sigma)
            .to_f64()
            .expect("finite");
        BigInt::from(deciles.iter().filter(|&&e| x >= e * s).count())
    });
    let (stat, df) = chi_square_statistic(&counts, n as u64, |k| {
        if (0..10).contains(&k) {
            0.1
        } else {
            0.0
        }
    });
    assert!(
        stat < chi_square_critical(df),
        "huge Gaussian: χ² = {stat}, df = {df}"
    );
}
