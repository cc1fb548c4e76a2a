//! Exact samplers for the discrete Laplace and discrete Gaussian distributions.
//!
//! The algorithms are those of Canonne, Kamath & Steinke, "The Discrete Gaussian for Differential
//! Privacy" (NeurIPS 2020, arXiv:2004.00010), Algorithms 1–3, in the form OpenDP's Rust samplers
//! use: every probability is an exact rational, every coin comes from uniform integers drawn by
//! rejection from whole random bytes (or words), so each function returns a sample from exactly
//! the stated distribution, given an ideal random source.
//!
//! Invariants:
//! - No floating-point number is involved anywhere in this file.
//! - Randomness comes only from the `rng` argument; nothing is global or cached.
//! - Parameters are checked with assertions: a non-positive scale is a bug in the caller
//!   (`Noise` and `PartitionSelection` validate before they sample).
//! - Running time depends on the random draws and on the parameters, never on the data the noise
//!   is added to; but it does grow with the noise drawn (see the module documentation of
//!   [`super`] about the timing channel).

use num_bigint::{BigInt, BigUint, Sign};
use num_rational::BigRational;
use num_traits::{One, Signed, ToPrimitive, Zero};
use rand::{CryptoRng, Rng};

/// A uniform integer in `[0, upper)`, without modulo bias.
///
/// # Privacy
/// A building block: it spends no budget itself. Exact given an ideal random source.
///
/// Draws `L` random bytes, `L` the fewest that hold `upper - 1`, and rejects the draw when it falls
/// into the incomplete last block of `upper` values, so that every accepted value is equally
/// likely. Each draw is accepted with probability above 1/2. Bounds below 2^64 use whole 64-bit
/// words the same way. `upper = 1` returns 0 without drawing.
///
/// # Panics
/// If `upper` is zero.
pub fn uniform_below<R: Rng + CryptoRng + ?Sized>(rng: &mut R, upper: &BigUint) -> BigUint {
    assert!(!upper.is_zero(), "uniform_below needs a positive bound");
    if let Some(small) = upper.to_u64() {
        return BigUint::from(uniform_below_u64(rng, small));
    }
    let len = usize::try_from(upper.bits().div_ceil(8)).expect("invariant: a bound fits memory");
    let range = BigUint::one() << (8 * len);
    // The largest multiple of `upper` not above 256^len: draws below it are accepted.
    let threshold = &range - (&range % upper);
    let mut buf = vec![0u8; len];
    loop {
        rng.fill_bytes(&mut buf);
        let draw = BigUint::from_bytes_be(&buf);
        if draw < threshold {
            return draw % upper;
        }
    }
}

/// [`uniform_below`] for a bound that fits a word.
fn uniform_below_u64<R: Rng + CryptoRng + ?Sized>(rng: &mut R, upper: u64) -> u64 {
    debug_assert!(upper > 0);
    if upper == 1 {
        return 0;
    }
    // 2^64 mod upper: the accepted draws are [0, 2^64 - rem), a multiple of `upper` values.
    let rem = (u64::MAX % upper + 1) % upper;
    loop {
        let draw = rng.next_u64();
        if draw <= u64::MAX - rem {
            return draw % upper;
        }
    }
}

/// A fair coin.
fn fair_bit<R: Rng + CryptoRng + ?Sized>(rng: &mut R) -> bool {
    rng.next_u32() & 1 == 1
}

/// `true` with probability `n/d`, for `d > 0` (`n >= d` is always true).
fn bernoulli_ratio<R: Rng + CryptoRng + ?Sized>(rng: &mut R, n: &BigUint, d: &BigUint) -> bool {
    match (n.to_u64(), d.to_u64()) {
        (Some(n), Some(d)) => uniform_below_u64(rng, d) < n,
        _ => uniform_below(rng, d) < *n,
    }
}

/// `true` with probability exactly `p`.
///
/// # Privacy
/// A building block: it spends no budget itself. Exact for every rational `p` in `[0, 1]`: it
/// compares a uniform draw below the denominator with the numerator (CKS20).
///
/// # Panics
/// If `p` is outside `[0, 1]`.
pub fn bernoulli<R: Rng + CryptoRng + ?Sized>(rng: &mut R, p: &BigRational) -> bool {
    assert!(
        !p.is_negative() && *p <= BigRational::one(),
        "bernoulli needs p in [0, 1]"
    );
    bernoulli_ratio(rng, p.numer().magnitude(), p.denom().magnitude())
}

/// `true` with probability `exp(-n/d)` for `0 <= n/d <= 1` (CKS20 Algorithm 1, first part).
///
/// With `K` the first `k >= 1` whose coin with probability `x/k` comes up false, returns whether
/// `K` is odd; `P(K > k) = x^k/k!`, so `P(K odd) = Σ (-x)^k/k! = e^-x`.
fn bernoulli_exp_unit<R: Rng + CryptoRng + ?Sized>(rng: &mut R, n: &BigUint, d: &BigUint) -> bool {
    debug_assert!(n <= d && !d.is_zero());
    let mut k: u64 = 1;
    // Word-sized fast path while d·k fits a u64; then the same loop on big integers.
    if let (Some(n64), Some(d64)) = (n.to_u64(), d.to_u64()) {
        while let Some(dk) = d64.checked_mul(k) {
            if uniform_below_u64(rng, dk) < n64 {
                k += 1;
            } else {
                return k % 2 == 1;
            }
        }
    }
    loop {
        if uniform_below(rng, &(d * k)) < *n {
            k += 1;
        } else {
            return k % 2 == 1;
        }
    }
}

/// `true` with probability `exp(-n/d)` for any `n/d >= 0` (CKS20 Algorithm 1).
///
/// `e^-x = (e^-1)^floor(x) · e^-(x - floor(x))`: one `e^-1` coin per whole unit, stopping at the
/// first false one, then one coin for the fractional part.
fn bernoulli_exp_ratio<R: Rng + CryptoRng + ?Sized>(rng: &mut R, n: &BigUint, d: &BigUint) -> bool {
    debug_assert!(!d.is_zero());
    let one = BigUint::one();
    let mut rest = n.clone();
    while rest > *d {
        if !bernoulli_exp_unit(rng, &one, &one) {
            return false;
        }
        rest -= d;
    }
    bernoulli_exp_unit(rng, &rest, d)
}

/// `true` with probability exactly `exp(-x)`.
///
/// # Privacy
/// A building block: it spends no budget itself. Exact for every rational `x >= 0`
/// (CKS20 Algorithm 1).
///
/// # Panics
/// If `x` is negative.
pub fn bernoulli_exp<R: Rng + CryptoRng + ?Sized>(rng: &mut R, x: &BigRational) -> bool {
    assert!(!x.is_negative(), "bernoulli_exp needs x >= 0");
    bernoulli_exp_ratio(rng, x.numer().magnitude(), x.denom().magnitude())
}

/// Geometric with `P(k) = (1 - e^-(s/t)) e^-(k·s/t)` for `k >= 0` (CKS20 Algorithm 2, the part
/// before the sign).
///
/// `U` uniform in `[0, t)` accepted with probability `e^-(U/t)` and `V` geometric with ratio
/// `e^-1` make `U + t·V` geometric with ratio `e^-(1/t)`; dividing by `s` (rounding down) gives
/// ratio `e^-(s/t)`. The first loop accepts with probability at least `1 - e^-1`.
fn geometric_ratio<R: Rng + CryptoRng + ?Sized>(rng: &mut R, s: &BigUint, t: &BigUint) -> BigUint {
    debug_assert!(!s.is_zero() && !t.is_zero());
    let u = loop {
        let u = uniform_below(rng, t);
        if bernoulli_exp_ratio(rng, &u, t) {
            break u;
        }
    };
    let one = BigUint::one();
    let mut v: u64 = 0;
    while bernoulli_exp_unit(rng, &one, &one) {
        v += 1;
    }
    (u + t * v) / s
}

/// A geometric sample: `P(k) = (1 - e^-x) e^-(k x)` for `k = 0, 1, 2, …`.
///
/// # Privacy
/// A building block: it spends no budget itself. Exact for every rational `x > 0`
/// (CKS20 Algorithm 2).
///
/// # Panics
/// If `x <= 0`.
pub fn sample_geometric<R: Rng + CryptoRng + ?Sized>(rng: &mut R, x: &BigRational) -> BigUint {
    assert!(x.is_positive(), "sample_geometric needs x > 0");
    geometric_ratio(rng, x.numer().magnitude(), x.denom().magnitude())
}

/// Discrete Laplace with scale `t/s`: `P(y) ∝ e^-(|y| s/t)` over all integers.
fn discrete_laplace_ratio<R: Rng + CryptoRng + ?Sized>(
    rng: &mut R,
    t: &BigUint,
    s: &BigUint,
) -> BigInt {
    loop {
        let magnitude = geometric_ratio(rng, s, t);
        let negative = fair_bit(rng);
        // A sign and a geometric magnitude reach 0 twice; rejecting "-0" makes P(0) right.
        if negative && magnitude.is_zero() {
            continue;
        }
        return BigInt::from_biguint(if negative { Sign::Minus } else { Sign::Plus }, magnitude);
    }
}

/// A sample of the discrete Laplace distribution: `P(x) = tanh(1/(2b)) · e^(-|x|/b)` for every
/// integer `x`, where `b = scale`.
///
/// # Privacy
/// Added to an integer-valued statistic with L1 sensitivity `Δ`, it gives pure `ε`-DP with
/// `ε = Δ / scale`: neighbouring outputs' probabilities differ by at most `e^(Δ/scale)` pointwise
/// (the geometric mechanism of Ghosh, Roughgarden & Sundararajan 2009; CKS20). The sampler is
/// exact (CKS20 Algorithm 2).
///
/// # Panics
/// If `scale <= 0`.
pub fn sample_discrete_laplace<R: Rng + CryptoRng + ?Sized>(
    rng: &mut R,
    scale: &BigRational,
) -> BigInt {
    assert!(
        scale.is_positive(),
        "sample_discrete_laplace needs scale > 0"
    );
    discrete_laplace_ratio(rng, scale.numer().magnitude(), scale.denom().magnitude())
}

/// A sample of the discrete Gaussian distribution: `P(x) ∝ e^(-x²/(2σ²))` for every integer `x`.
///
/// Rejection sampling from a discrete Laplace with integer scale `t = floor(σ) + 1`, accepting `y`
/// with probability `exp(-(|y| - σ²/t)² / (2σ²))` (CKS20 Algorithm 3). The proposal is
/// `P(y) ∝ e^(-|y|/t)` and `-y²/(2σ²) + |y|/t = -(|y| - σ²/t)²/(2σ²) + σ²/(2t²)`, so accepted
/// values follow the target exactly; with `t = floor(σ) + 1` the expected number of rounds stays
/// small for every `σ` (CKS20 analyse it).
///
/// # Privacy
/// Added to an integer-valued statistic with sensitivity `Δ` (or independently to each entry of
/// an integer vector with L2 sensitivity `Δ`), it gives `ρ`-zCDP with `ρ = Δ² / (2σ²)` (CKS20,
/// one-dimensional and multivariate; zCDP as defined by Bun & Steinke 2016).
///
/// # Panics
/// If `sigma <= 0`.
pub fn sample_discrete_gaussian<R: Rng + CryptoRng + ?Sized>(
    rng: &mut R,
    sigma: &BigRational,
) -> BigInt {
    assert!(
        sigma.is_positive(),
        "sample_discrete_gaussian needs sigma > 0"
    );
    let p = sigma.numer().magnitude();
    let q = sigma.denom().magnitude();
    let t: BigUint = p / q + 1u32;
    let one = BigUint::one();
    let p2 = p * p;
    let q2 = q * q;
    // (|y| - σ²/t)² / (2σ²) = (|y|·q²·t - p²)² / (2·p²·q²·t²), with σ = p/q.
    let q2t = &q2 * &t;
    let den = (&p2 * &q2 * &t * &t) << 1usize;
    loop {
        let y = discrete_laplace_ratio(rng, &t, &one);
        let a = y.magnitude() * &q2t;
        let diff = if a >= p2 { &a - &p2 } else { &p2 - &a };
        if bernoulli_exp_ratio(rng, &(&diff * &diff), &den) {
            return y;
        }
    }
}

#[cfg(test)]
mod tests {
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
        // A 72-bit bound m ≈ 2^73/3 takes the byte path: nine bytes give 2^72 ≈ 1.5·m values, so
        // without rejection the lowest third of [0, m) would be twice as likely. Ten equal-width
        // bins (their sizes differ by at most one value in 2^72, a negligible bias).
        let big: BigUint = (BigUint::one() << 73usize) / 3u32 + 5u32;
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
            "72-bit bound: χ² = {stat}, df = {df}"
        );
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
}
