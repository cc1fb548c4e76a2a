//! Noise mechanisms: exact samplers, calibrated noise for released statistics, partition
//! selection and accuracy bounds. `docs/mechanisms.md` explains the mathematics and cites the
//! sources.
//!
//! The parts, in reading order:
//! - `sample`: exact samplers of the discrete Laplace and discrete Gaussian (Canonne, Kamath &
//!   Steinke 2020) and of the rounded Gaussian (Karney 2016), and their building blocks ([`uniform_below`], [`bernoulli`], [`bernoulli_exp`],
//!   [`sample_geometric`]), all on exact rationals.
//! - `exact`: `f64` ↔ rational conversions and the exact parse of PostgreSQL `numeric` text
//!   ([`parse_numeric_exact`]).
//! - `noise`: [`Noise`], built from a sensitivity and a budget share, releasing integer or real
//!   statistics, and [`Noise::error_bound`] for EXPLAIN.
//! - `partition`: [`PartitionSelection`] for group keys that are not public.
//! - `quantile`: report-noisy-max over a bucketed histogram for quantiles, MIN and MAX
//!   ([`noisy_quantile_bucket`]).
//! - `pmw`: private multiplicative weights, a synopsis answering a stream of counting queries
//!   over a public domain with a budget fixed in advance ([`pmw::Synopsis`]).
//!
//! Invariants:
//! - Pure: no I/O, no global state, no clock. Randomness is a parameter
//!   `R: rand::Rng + rand::CryptoRng + ?Sized`; production passes [`secure_rng`]'s OS-seeded
//!   ChaCha20, tests a seeded one. [`secure_rng`] is the only function that touches the OS.
//! - No noise is ever computed in floating point (Mironov 2012). Statistics are put on an integer
//!   grid (integers themselves, or multiples of a power of two for reals) and receive integer
//!   noise from exact samplers; `f64` appears only in parameters, in the final conversion of a
//!   released value and in accuracy figures.
//! - Every constructor validates its parameters the way OpenDP's `make_*` functions do and
//!   returns [`crate::Error::InvalidMechanism`] (SQLSTATE 22023) otherwise: sensitivities finite
//!   and positive, `ε`/`ρ` finite and at least [`BUDGET_MIN`], `δ` strictly inside (0, 1),
//!   resulting scales normal finite `f64`. A sensitivity of zero is refused: a statistic that one
//!   unit cannot change needs no mechanism, and a zero that comes from a bug must not turn into
//!   an exact release.
//! - Every scale is rounded *up* to an `f64` and then used exactly, so the cost actually incurred
//!   is at most the one requested, and the scale shown by EXPLAIN is the one used.
//! - No released value is NaN or ±∞.
//!
//! Timing. CKS20's samplers run loops whose length depends on the value they produce, so their
//! running time reveals the noise, hence the exact value (Jin, McMurtry, Rubinstein & Ohrimenko,
//! "Are We There Yet? Timing and Floating-Point Attacks on Differential Privacy Systems", IEEE
//! S&P 2022). `sample` does a fixed number of trials per round of each loop and reads results
//! from them without stopping early; rounds of rejection loops are independent of the value
//! returned. So the trials consumed are independent of the noise, except with probability below
//! `2^-64` per sample (see `sample`'s documentation and docs/mechanisms.md §8). Arithmetic on the
//! result varies slightly with its size; parsing `numeric` text takes time linear in its length,
//! which depends on the data, as the upstream's own query time does far more.

mod exact;
mod noise;
mod partition;
pub mod pmw;
mod quantile;
mod sample;
#[cfg(test)]
mod testing;

use num_rational::BigRational;
use rand::rngs::{ChaCha20Rng, SysRng};
use rand::SeedableRng;

use crate::{Error, Result};

pub use exact::{parse_numeric_exact, rational_from_f64, NUMERIC_EXPONENT_ABS_MAX};
pub use noise::{MechanismKind, Noise, GRID_BITS};
pub use partition::PartitionSelection;
pub use quantile::{
    bucket_value, noisy_quantile_bucket, parse_histogram, quantile_noise_sensitivity, MAX_PERMILLE,
    MIN_PERMILLE, QUANTILE_BUCKETS,
};
pub use sample::{
    bernoulli, bernoulli_exp, sample_discrete_gaussian, sample_discrete_laplace, sample_geometric,
    sample_rounded_gaussian, uniform_below,
};

/// The smallest `ε` or `ρ` a mechanism accepts: `2^-50`. Below it the noise scale is beyond any
/// useful size and the sampler's numbers grow for nothing. (The policy's per-query minimum,
/// [`crate::limits::EPSILON_PER_QUERY_MIN`], is much larger.)
pub const BUDGET_MIN: f64 = 1.0 / (1u64 << 50) as f64;

/// A ChaCha20 generator seeded with 256 bits from the operating system's random source.
///
/// This is the generator production code passes to every sampler; create one per connection (or
/// per query), never share a seeded one across analysts.
///
/// # Errors
/// [`Error::Internal`] if the operating system cannot provide randomness.
pub fn secure_rng() -> Result<ChaCha20Rng> {
    ChaCha20Rng::try_from_rng(&mut SysRng)
        .map_err(|e| Error::internal(format!("the operating system's random source failed: {e}")))
}

fn invalid(reason: &str) -> Error {
    Error::InvalidMechanism {
        reason: reason.to_owned(),
    }
}

/// A sensitivity as an exact rational, refusing anything not finite and positive.
fn validate_sensitivity(name: &str, value: f64) -> Result<BigRational> {
    if !(value.is_finite() && value > 0.0) {
        return Err(invalid(&format!("{name} must be finite and positive")));
    }
    Ok(rational_from_f64(value).expect("invariant: checked finite"))
}

/// `ε` or `ρ` as an exact rational, refusing anything not finite or below [`BUDGET_MIN`].
fn validate_budget(name: &str, value: f64) -> Result<BigRational> {
    if !(value.is_finite() && value >= BUDGET_MIN) {
        return Err(invalid(&format!(
            "{name} must be finite and at least 2^-50"
        )));
    }
    Ok(rational_from_f64(value).expect("invariant: checked finite"))
}

/// A computed scale, refusing one that overflowed or is not a normal positive `f64`.
fn positive_scale(scale: Option<f64>) -> Result<f64> {
    match scale {
        Some(s) if s.is_finite() && s >= f64::MIN_POSITIVE => Ok(s),
        _ => Err(invalid(
            "the noise scale (sensitivity divided by the budget) is out of range",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::Rng;

    #[test]
    fn secure_rng_draws() {
        let mut a = secure_rng().expect("the OS has randomness");
        let mut b = secure_rng().expect("the OS has randomness");
        // Two OS-seeded generators agreeing on 128 bits would mean a broken seed.
        assert_ne!((a.next_u64(), a.next_u64()), (b.next_u64(), b.next_u64()));
    }

    #[test]
    fn budget_min_is_two_to_minus_fifty() {
        assert_eq!(BUDGET_MIN, 2f64.powi(-50));
    }

    #[test]
    fn invalid_parameters_are_refused_with_22023() {
        let refusals = [
            Noise::laplace(0.0, 1.0),
            Noise::laplace(-1.0, 1.0),
            Noise::laplace(f64::NAN, 1.0),
            Noise::laplace(f64::INFINITY, 1.0),
            Noise::laplace(1.0, 0.0),
            Noise::laplace(1.0, -1.0),
            Noise::laplace(1.0, f64::NAN),
            Noise::laplace(1.0, f64::INFINITY),
            Noise::laplace(1.0, BUDGET_MIN / 2.0),
            Noise::laplace(f64::MAX, 0.5),
            Noise::laplace(1e-300, 1e300),
            Noise::laplace_real(1.0, 1.0, 0),
            Noise::gaussian(0.0, 1.0),
            Noise::gaussian(1.0, 0.0),
            Noise::gaussian(1.0, f64::NAN),
            Noise::gaussian(f64::MAX, 1e-10),
            Noise::gaussian_real(1.0, 1.0, 0),
        ];
        for (i, r) in refusals.into_iter().enumerate() {
            let err = r.expect_err(&format!("case {i}"));
            assert!(
                matches!(err, Error::InvalidMechanism { .. }),
                "case {i}: {err:?}"
            );
            assert_eq!(err.sqlstate().code(), "22023");
        }
        for (eps, delta, k) in [
            (1.0, 0.0, 1),
            (1.0, 1.0, 1),
            (1.0, -0.1, 1),
            (1.0, f64::NAN, 1),
            (1.0, 1e-6, 0),
            (0.0, 1e-6, 1),
            (f64::INFINITY, 1e-6, 1),
            (1.0, f64::MIN_POSITIVE, 2),
        ] {
            let err = PartitionSelection::new(eps, delta, k).expect_err("refused");
            assert!(
                matches!(err, Error::InvalidMechanism { .. }),
                "{eps} {delta} {k}"
            );
        }
        // The smallest accepted budget works.
        assert!(Noise::laplace(1.0, BUDGET_MIN).is_ok());
        assert!(Noise::gaussian(1.0, BUDGET_MIN).is_ok());
    }
}
