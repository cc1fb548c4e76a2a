//! The accountant: what a history of charges guarantees, and whether one more charge fits.
//!
//! Pure arithmetic, no I/O. Invariants:
//! - Every sum is exact ([`Fixed`] arithmetic); floating point is used only inside the zCDP →
//!   (ε, δ) conversion, whose result is rounded up (a safety margin, then the 10⁻¹⁸ grid), so
//!   rounding never favours the analyst.
//! - [`admit`] returns the new totals only if the history *including* the new charge stays within
//!   the limit under the rule of [`guarantee`]; it never admits a charge that leaves the state
//!   over the limit, whatever was charged before or in which order.
//! - The conversion is monotone: more ρ never yields a smaller ε, more δ never a larger one.
//!
//! # Composition rule
//! A history of charges is summarised by [`Spent`]: ε_pure (the sum of ε of pure/Laplace-type
//! mechanisms and of partition selection), δ_spent (the sum of δ of partition selection) and ρ
//! (the sum of zCDP ρ of Gaussian-type mechanisms). Sums are basic composition for pure and
//! approximate DP (Dwork & Roth 2014, Thm 3.16) and zCDP composition (Bun & Steinke 2016,
//! Lemma 2.3). The history is reported as (ε, δ)-DP with
//!
//! ```text
//! δ_conv = δ_limit − δ_spent
//! ε      = ε_pure + ε_conv(ρ, δ_conv)        (ε_conv = 0 and δ_conv unused when ρ = 0)
//! δ      = δ_spent + δ_conv                  (= δ_limit when ρ > 0)
//! ```
//!
//! where ε_conv is the zCDP → (ε, δ) conversion of Canonne, Kamath & Steinke 2020 ("The Discrete
//! Gaussian for Differential Privacy", NeurIPS 2020, Proposition 12 / Corollary 13): a ρ-zCDP
//! mechanism has Rényi divergence at most αρ at every order α > 1, so it is (ε, δ)-DP for
//!
//! ```text
//! ε_conv(ρ, δ) = inf_{α>1}  αρ + ln(1/(αδ))/(α−1) + ln(1 − 1/α)
//! ```
//!
//! Any α > 1 gives a valid bound, so the exact optimiser is not needed for soundness. The
//! derivative in α is ρ − ln(1/(αδ))/(α−1)², which is negative at α → 1 and non-negative at
//! α = 1 + √(ln(1/δ)/ρ); pgdp bisects for its root between these points, evaluates the bound at
//! the upper end of the final bracket, adds a margin far above f64 rounding error
//! (10⁻¹⁰ relative to the terms, plus 10⁻¹⁴·(1 + 1/(α−1)) absolute), takes the minimum with the
//! simpler Bun & Steinke 2016 (Prop. 1.3) bound ρ + 2√(ρ ln(1/δ)) (also margined), clamps at 0 and
//! rounds up to the 10⁻¹⁸ grid.
//!
//! # Admission (the privacy filter)
//! A charge is admitted iff, after adding it, ε ≤ ε_limit and δ_spent ≤ δ_limit (and δ_conv > 0
//! when ρ > 0). Stopping an adaptive sequence of mechanisms when the next one would cross a
//! *fixed* budget is a valid privacy filter: for basic composition of (ε_i, δ_i) with
//! Σε_i ≤ ε_limit and Σδ_i ≤ δ_limit (Rogers, Roth, Ullman & Vadhan 2016, "Privacy Odometers and
//! Filters: Pay-as-you-Go Composition"), and for Rényi DP / zCDP with Σρ_i ≤ ρ_limit at every
//! order (Feldman & Zrnic 2021, "Individual Privacy Accounting via a Rényi Filter"). Those two
//! cases are exactly what this rule does when an analyst spends only pure ε and δ (ρ = 0), or only
//! ρ (δ_conv is then the fixed δ_limit and the rule is Σρ_i ≤ the largest ρ whose conversion
//! fits). When one analyst *mixes* ρ with pure ε or δ, the split between them is chosen
//! adaptively; the cited theorems are about a fixed budget and do not cover that choice (see the
//! caveat in the module docs of [`crate::budget`]).

use std::fmt;
use std::ops::Add;

use super::fixed::Fixed;
use crate::Error;

/// Bisection steps for the optimal Rényi order; f64 bisection stops improving long before.
const BISECTION_STEPS_MAX: u32 = 300;

/// Relative safety margin added to the f64 conversion before rounding up.
const CONVERSION_MARGIN_RELATIVE: f64 = 1e-10;

/// Absolute safety margin added to the f64 conversion before rounding up.
const CONVERSION_MARGIN_ABSOLUTE: f64 = 1e-14;

/// What one query spends.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Cost {
    /// Pure ε: Laplace-type mechanisms (and the ε of partition selection). Adds.
    pub epsilon: Fixed,
    /// δ: partition selection. Adds.
    pub delta: Fixed,
    /// zCDP ρ: Gaussian-type mechanisms. Adds.
    pub rho: Fixed,
}

impl Cost {
    /// Nothing.
    pub const ZERO: Cost = Cost {
        epsilon: Fixed::ZERO,
        delta: Fixed::ZERO,
        rho: Fixed::ZERO,
    };

    /// A pure ε-DP cost.
    pub const fn pure(epsilon: Fixed) -> Cost {
        Cost {
            epsilon,
            delta: Fixed::ZERO,
            rho: Fixed::ZERO,
        }
    }

    /// An (ε, δ)-DP cost (e.g. noisy aggregates plus partition selection).
    pub const fn approx(epsilon: Fixed, delta: Fixed) -> Cost {
        Cost {
            epsilon,
            delta,
            rho: Fixed::ZERO,
        }
    }

    /// A ρ-zCDP cost.
    pub const fn zcdp(rho: Fixed) -> Cost {
        Cost {
            epsilon: Fixed::ZERO,
            delta: Fixed::ZERO,
            rho,
        }
    }

    /// Whether this spends nothing.
    pub const fn is_zero(&self) -> bool {
        self.epsilon.is_zero() && self.delta.is_zero() && self.rho.is_zero()
    }

    /// Exact sum, or `None` on overflow.
    pub fn checked_add(&self, other: &Cost) -> Option<Cost> {
        Some(Cost {
            epsilon: self.epsilon.checked_add(other.epsilon)?,
            delta: self.delta.checked_add(other.delta)?,
            rho: self.rho.checked_add(other.rho)?,
        })
    }
}

impl Add for Cost {
    type Output = Cost;

    /// Exact sum (composition), saturating at [`Fixed::MAX`], which only ever refuses more.
    fn add(self, other: Cost) -> Cost {
        Cost {
            epsilon: self.epsilon + other.epsilon,
            delta: self.delta + other.delta,
            rho: self.rho + other.rho,
        }
    }
}

/// A total (ε, δ) budget: an analyst's, or the dataset's across all analysts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Limit {
    /// Total ε.
    pub epsilon: Fixed,
    /// Total δ.
    pub delta: Fixed,
}

impl Limit {
    /// A limit of (ε, δ).
    pub const fn new(epsilon: Fixed, delta: Fixed) -> Limit {
        Limit { epsilon, delta }
    }
}

/// The sum of all costs charged so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Spent {
    /// Sum of pure ε.
    pub epsilon: Fixed,
    /// Sum of δ.
    pub delta: Fixed,
    /// Sum of zCDP ρ.
    pub rho: Fixed,
}

impl Spent {
    /// Nothing spent yet.
    pub const ZERO: Spent = Spent {
        epsilon: Fixed::ZERO,
        delta: Fixed::ZERO,
        rho: Fixed::ZERO,
    };

    /// The totals after one more cost, or `None` on overflow.
    pub fn checked_add(&self, cost: &Cost) -> Option<Spent> {
        Some(Spent {
            epsilon: self.epsilon.checked_add(cost.epsilon)?,
            delta: self.delta.checked_add(cost.delta)?,
            rho: self.rho.checked_add(cost.rho)?,
        })
    }
}

impl Add<Cost> for Spent {
    type Output = Spent;

    /// Exact sum, saturating at [`Fixed::MAX`], which only ever refuses more.
    fn add(self, cost: Cost) -> Spent {
        Spent {
            epsilon: self.epsilon + cost.epsilon,
            delta: self.delta + cost.delta,
            rho: self.rho + cost.rho,
        }
    }
}

/// What is left of a limit, for display.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Remaining {
    /// Pure ε that could still be spent, given the ρ and δ already spent (a later δ or ρ charge
    /// lowers it further, because it shrinks δ_conv).
    pub epsilon: Fixed,
    /// δ not yet spent by partition selection.
    pub delta: Fixed,
}

/// The (ε, δ)-DP guarantee of a whole history of charges.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Guarantee {
    /// ε of the history: ε_pure + ε_conv(ρ, δ_conv).
    pub epsilon: Fixed,
    /// δ of the history: δ_spent, plus δ_conv when ρ > 0.
    pub delta: Fixed,
}

/// Whose budget refused a charge.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scope {
    /// The analyst's own budget.
    Analyst,
    /// The dataset-wide budget shared by all analysts.
    Dataset,
}

/// Why a charge was not admitted: the request and what was left.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Refusal {
    /// Which budget refused.
    pub scope: Scope,
    /// The cost asked for.
    pub requested: Cost,
    /// The limit it was checked against.
    pub limit: Limit,
    /// What was left before the request.
    pub remaining: Remaining,
}

/// Digits shown for remaining amounts in messages (rounded down, never overstating).
const MESSAGE_DIGITS: u32 = 6;

impl fmt::Display for Refusal {
    /// For an analyst: `requested ε=0.5, remaining ε=0.2 of 10, δ=0 of 0.00001`. For the dataset
    /// the remaining amounts are not shown: they depend on what other analysts did.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Cost {
            epsilon,
            delta,
            rho,
        } = self.requested;
        let mut parts = Vec::new();
        if !epsilon.is_zero() || (delta.is_zero() && rho.is_zero()) {
            parts.push(format!("ε={epsilon}"));
        }
        if !delta.is_zero() {
            parts.push(format!("δ={delta}"));
        }
        if !rho.is_zero() {
            parts.push(format!("ρ={rho} (zCDP)"));
        }
        write!(f, "requested {}", parts.join(" and "))?;
        match self.scope {
            Scope::Analyst => write!(
                f,
                ", remaining ε={} of {}, δ={} of {}",
                self.remaining.epsilon.floor_significant(MESSAGE_DIGITS),
                self.limit.epsilon,
                self.remaining.delta.floor_significant(MESSAGE_DIGITS),
                self.limit.delta,
            ),
            Scope::Dataset => write!(
                f,
                ", more than is left of the dataset-wide budget of ε={}, δ={} shared by all analysts",
                self.limit.epsilon, self.limit.delta,
            ),
        }
    }
}

impl From<Refusal> for Error {
    /// [`Error::BudgetExhausted`] (SQLSTATE 53400). For the analyst's own budget the message
    /// says whether it is used up or only too small for this query (then a smaller ε fits); for
    /// the dataset's budget it says neither, since what is left depends on other analysts.
    fn from(refusal: Refusal) -> Error {
        let summary = match refusal.scope {
            Scope::Analyst => {
                let needs_delta = !refusal.requested.delta.is_zero();
                let used_up = refusal.remaining.epsilon.is_zero()
                    || (needs_delta && refusal.remaining.delta.is_zero());
                if used_up {
                    "privacy budget exhausted"
                } else {
                    "privacy budget too small for this query"
                }
            }
            Scope::Dataset => "the dataset's privacy budget does not cover this query",
        };
        Error::BudgetExhausted {
            detail: format!("{summary}: {refusal}"),
        }
    }
}

/// The smallest ε (on the 10⁻¹⁸ grid, rounded up) such that a ρ-zCDP mechanism is (ε, δ)-DP,
/// by the Canonne–Kamath–Steinke 2020 conversion (see the module docs for the formula and the
/// rounding). `None` when no finite ε exists (ρ > 0 with δ = 0) or it does not fit a [`Fixed`].
/// ρ = 0 gives 0; δ ≥ 1 gives 0.
pub fn zcdp_to_epsilon(rho: Fixed, delta: Fixed) -> Option<Fixed> {
    if rho.is_zero() || delta >= Fixed::ONE {
        return Some(Fixed::ZERO);
    }
    if delta.is_zero() {
        return None;
    }
    let epsilon = zcdp_to_epsilon_f64(rho.to_f64(), delta.to_f64());
    if !epsilon.is_finite() {
        return None;
    }
    Fixed::from_f64_ceil(epsilon.max(0.0)).ok()
}

/// The margined f64 conversion, for 0 < ρ and 0 < δ < 1. May return +∞ or NaN for absurd
/// inputs; the caller treats both as "no finite ε".
fn zcdp_to_epsilon_f64(rho: f64, delta: f64) -> f64 {
    let log_inv_delta = -delta.ln();

    // Bun & Steinke 2016, Proposition 1.3.
    let bun_steinke = rho + 2.0 * (rho * log_inv_delta).sqrt();
    let bun_steinke =
        bun_steinke + CONVERSION_MARGIN_RELATIVE * bun_steinke + CONVERSION_MARGIN_ABSOLUTE;

    // Canonne, Kamath & Steinke 2020: bisect for the root of ρ(α−1)² − ln(1/(αδ)), which is
    // negative at α = 1 and non-negative at α = 1 + √(ln(1/δ)/ρ).
    let mut lo = 1.0_f64;
    let mut hi = 1.0 + (log_inv_delta / rho).sqrt();
    for _ in 0..BISECTION_STEPS_MAX {
        let mid = lo + (hi - lo) / 2.0;
        if mid <= lo || mid >= hi {
            break;
        }
        if rho * (mid - 1.0) * (mid - 1.0) >= log_inv_delta - mid.ln() {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    let alpha = hi;
    if alpha.is_nan() || alpha <= 1.0 {
        return bun_steinke;
    }
    let t1 = alpha * rho;
    let t2 = (log_inv_delta - alpha.ln()) / (alpha - 1.0);
    let t3 = (-1.0 / alpha).ln_1p();
    let margin = CONVERSION_MARGIN_RELATIVE * (t1.abs() + t2.abs() + t3.abs())
        + CONVERSION_MARGIN_ABSOLUTE * (1.0 + 1.0 / (alpha - 1.0));
    let canonne_kamath_steinke = t1 + t2 + t3 + margin;
    if canonne_kamath_steinke.is_finite() {
        canonne_kamath_steinke.min(bun_steinke)
    } else {
        bun_steinke
    }
}

/// The (ε, δ)-DP guarantee of a history, when all δ up to `delta_limit` not spent by partition
/// selection is used for the zCDP conversion. `None` when ρ > 0 and nothing is left for the
/// conversion (δ_spent ≥ δ_limit), or the result does not fit a [`Fixed`].
pub fn guarantee(spent: &Spent, delta_limit: Fixed) -> Option<Guarantee> {
    if spent.rho.is_zero() {
        return Some(Guarantee {
            epsilon: spent.epsilon,
            delta: spent.delta,
        });
    }
    let delta_conv = delta_limit
        .checked_sub(spent.delta)
        .filter(|d| !d.is_zero())?;
    let epsilon = spent
        .epsilon
        .checked_add(zcdp_to_epsilon(spent.rho, delta_conv)?)?;
    Some(Guarantee {
        epsilon,
        delta: delta_limit,
    })
}

/// Whether `spent` is within `limit` under the rule of [`guarantee`].
pub fn within(limit: &Limit, spent: &Spent) -> bool {
    spent.delta <= limit.delta
        && guarantee(spent, limit.delta).is_some_and(|g| g.epsilon <= limit.epsilon)
}

/// Admits `cost` on top of `spent` if the history stays within `limit`, returning the new
/// totals; otherwise says what was asked and what is left ([`Scope::Analyst`]).
///
/// The rule (module docs): after the charge, ε_pure + ε_conv(ρ, δ_limit − δ_spent) ≤ ε_limit and
/// δ_spent ≤ δ_limit, with δ_limit − δ_spent > 0 if ρ > 0.
// A refusal is 128 bytes of plain numbers, returned once per refused query and consumed at
// once; boxing it would only add an allocation.
#[allow(clippy::result_large_err)]
pub fn admit(limit: &Limit, spent: &Spent, cost: &Cost) -> Result<Spent, Refusal> {
    match spent.checked_add(cost) {
        Some(after) if within(limit, &after) => Ok(after),
        _ => Err(Refusal {
            scope: Scope::Analyst,
            requested: *cost,
            limit: *limit,
            remaining: remaining(limit, spent),
        }),
    }
}

/// What is left of `limit` after `spent`: δ not spent by partition selection, and the pure ε
/// that would still fit given the ρ and δ spent so far. Both are zero when the history is
/// already over the limit (e.g. after the policy lowered it).
pub fn remaining(limit: &Limit, spent: &Spent) -> Remaining {
    let delta = limit.delta.saturating_sub(spent.delta);
    let epsilon = match guarantee(spent, limit.delta) {
        Some(g) if spent.delta <= limit.delta => limit.epsilon.saturating_sub(g.epsilon),
        _ => Fixed::ZERO,
    };
    Remaining { epsilon, delta }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::ChaCha20Rng;
    use rand::{Rng, RngExt, SeedableRng};

    fn fx(s: &str) -> Fixed {
        Fixed::from_decimal_str(s).unwrap()
    }

    fn limit(eps: &str, delta: &str) -> Limit {
        Limit::new(fx(eps), fx(delta))
    }

    /// Reference values from the authors' own `cdp_eps` (Canonne, Kamath & Steinke,
    /// github.com/IBM/discrete-gaussian-differential-privacy, `cdp2adp.py`), run in Python.
    const CKS_REFERENCE: [(&str, &str, f64); 7] = [
        ("0.5", "0.00001", 4.728386984943314),
        ("0.01", "0.000001", 0.6216926545596025),
        ("1", "0.0000000001", 10.034343581347631),
        ("0.001", "0.00001", 0.15733539316121553),
        ("2", "0.00001", 10.724824112939174),
        ("0.000001", "0.000000001", 0.006804060822206219),
        ("10", "0.00001", 30.11085730379573),
    ];

    #[test]
    fn conversion_matches_the_reference_and_rounds_up() {
        for (rho, delta, reference) in CKS_REFERENCE {
            let eps = zcdp_to_epsilon(fx(rho), fx(delta)).unwrap().to_f64();
            assert!(eps >= reference, "ρ={rho} δ={delta}: {eps} < {reference}");
            assert!(
                eps <= reference * (1.0 + 1e-9) + 1e-12,
                "ρ={rho} δ={delta}: {eps} ≫ {reference}"
            );
        }
    }

    #[test]
    fn conversion_beats_bun_steinke() {
        let (rho, delta) = (0.5_f64, 1e-5_f64);
        let bs = rho + 2.0 * (rho * (1.0 / delta).ln()).sqrt();
        let eps = zcdp_to_epsilon(fx("0.5"), fx("0.00001")).unwrap().to_f64();
        assert!(eps < bs - 0.5, "{eps} vs {bs}");
    }

    #[test]
    fn conversion_edge_cases() {
        assert_eq!(zcdp_to_epsilon(Fixed::ZERO, Fixed::ZERO), Some(Fixed::ZERO));
        assert_eq!(zcdp_to_epsilon(fx("0.1"), Fixed::ZERO), None);
        assert_eq!(zcdp_to_epsilon(fx("0.1"), Fixed::ONE), Some(Fixed::ZERO));
        assert!(zcdp_to_epsilon(Fixed::EPSILON_UNIT, Fixed::EPSILON_UNIT).unwrap() > Fixed::ZERO);
        assert!(zcdp_to_epsilon(fx("1000000"), Fixed::EPSILON_UNIT).unwrap() > fx("1000000"));
        // Astronomical ρ: either a huge finite ε or "unbounded", never a small number.
        assert!(zcdp_to_epsilon(Fixed::MAX, fx("0.5")).is_none_or(|e| e > fx("1000000")));
    }

    #[test]
    fn conversion_is_monotone() {
        let mut rng = ChaCha20Rng::seed_from_u64(0x00c0_ffee);
        for _ in 0..5_000 {
            let r1 = random_amount(&mut rng, 12);
            let r2 = random_amount(&mut rng, 12);
            let d1 = random_delta(&mut rng);
            let d2 = random_delta(&mut rng);
            let (rl, rh) = (r1.min(r2), r1.max(r2));
            let (dl, dh) = (d1.min(d2), d1.max(d2));
            let at = |r, d| zcdp_to_epsilon(r, d).unwrap_or(Fixed::MAX);
            assert!(at(rl, dl) <= at(rh, dl), "ρ {rl} ≤ {rh} at δ={dl}");
            assert!(at(rl, dh) <= at(rl, dl), "δ {dl} ≤ {dh} at ρ={rl}");
        }
        // A fine sweep, where neighbouring inputs are close.
        let delta = fx("0.00001");
        let mut previous = Fixed::ZERO;
        for k in 1..=2_000u64 {
            let eps = zcdp_to_epsilon(Fixed::from_units(u128::from(k) * 1_000_000_000_000), delta)
                .unwrap();
            assert!(eps >= previous, "ρ = {k}e-6");
            previous = eps;
        }
        let rho = fx("0.05");
        let mut previous = Fixed::MAX;
        for k in 1..=2_000u64 {
            let eps =
                zcdp_to_epsilon(rho, Fixed::from_units(u128::from(k) * 1_000_000_000)).unwrap();
            assert!(eps <= previous, "δ = {k}e-9");
            previous = eps;
        }
    }

    #[test]
    fn pure_budget_affords_exactly_its_share() {
        let lim = limit("1", "0");
        let mut spent = Spent::ZERO;
        for _ in 0..10 {
            spent = admit(&lim, &spent, &Cost::pure(fx("0.1"))).unwrap();
        }
        assert_eq!(spent.epsilon, Fixed::ONE);
        let refusal = admit(&lim, &spent, &Cost::pure(Fixed::EPSILON_UNIT)).unwrap_err();
        assert_eq!(
            refusal.remaining,
            Remaining {
                epsilon: Fixed::ZERO,
                delta: Fixed::ZERO
            }
        );
        // A free query is still admitted.
        assert_eq!(admit(&lim, &spent, &Cost::ZERO), Ok(spent));
    }

    #[test]
    fn delta_is_a_hard_limit() {
        let lim = limit("10", "0.00001");
        let spent = admit(&lim, &Spent::ZERO, &Cost::approx(fx("1"), fx("0.00001"))).unwrap();
        assert!(admit(
            &lim,
            &spent,
            &Cost::approx(Fixed::ZERO, Fixed::EPSILON_UNIT)
        )
        .is_err());
        // All δ is spent, so nothing is left for a zCDP conversion.
        assert!(admit(&lim, &spent, &Cost::zcdp(Fixed::EPSILON_UNIT)).is_err());
        assert!(admit(&lim, &spent, &Cost::pure(fx("9"))).is_ok());
    }

    #[test]
    fn zcdp_needs_delta() {
        assert!(admit(&limit("100", "0"), &Spent::ZERO, &Cost::zcdp(fx("0.0001"))).is_err());
        assert!(admit(
            &limit("100", "0.000001"),
            &Spent::ZERO,
            &Cost::zcdp(fx("0.0001"))
        )
        .is_ok());
    }

    #[test]
    fn mixed_history_uses_the_documented_rule() {
        let lim = limit("5", "0.00001");
        let spent = Spent {
            epsilon: fx("0.25"),
            delta: fx("0.000001"),
            rho: fx("0.5"),
        };
        let g = guarantee(&spent, lim.delta).unwrap();
        let conv = zcdp_to_epsilon(fx("0.5"), fx("0.000009")).unwrap();
        assert_eq!(
            g,
            Guarantee {
                epsilon: fx("0.25") + conv,
                delta: lim.delta
            }
        );
        assert!(g.epsilon > fx("5"));
        assert!(!within(&lim, &spent));
        assert_eq!(remaining(&lim, &spent).epsilon, Fixed::ZERO);
        assert_eq!(remaining(&lim, &spent).delta, fx("0.000009"));
        let lim = limit("10", "0.00001");
        assert_eq!(
            remaining(&lim, &spent).epsilon,
            fx("10").saturating_sub(g.epsilon)
        );
    }

    #[test]
    fn refusal_names_request_and_remaining() {
        let lim = limit("10", "0.00001");
        let spent = Spent {
            epsilon: fx("9.8"),
            ..Spent::ZERO
        };
        let refusal = admit(&lim, &spent, &Cost::pure(fx("0.5"))).unwrap_err();
        assert_eq!(
            refusal.to_string(),
            "requested ε=0.5, remaining ε=0.2 of 10, δ=0.00001 of 0.00001"
        );
        let error = Error::from(refusal);
        assert_eq!(error.sqlstate().code(), "53400");
        // ε = 0.2 is left: too small for this query, not exhausted.
        assert_eq!(
            error.to_string(),
            "privacy budget too small for this query: requested ε=0.5, remaining ε=0.2 of 10, δ=0.00001 of 0.00001"
        );
        let used_up = Spent {
            epsilon: fx("10"),
            ..Spent::ZERO
        };
        let refusal_at_zero = admit(&lim, &used_up, &Cost::pure(fx("0.5"))).unwrap_err();
        assert!(Error::from(refusal_at_zero)
            .to_string()
            .starts_with("privacy budget exhausted: requested ε=0.5, remaining ε=0 of 10"));
        let dataset = Refusal {
            scope: Scope::Dataset,
            ..refusal
        };
        assert!(!dataset.to_string().contains("0.2"));
        let dataset_error = Error::from(dataset).to_string();
        assert!(
            dataset_error.starts_with("the dataset's privacy budget does not cover this query"),
            "{dataset_error}"
        );
        let zcdp = Refusal {
            requested: Cost {
                rho: fx("0.1"),
                delta: fx("0.000001"),
                ..Cost::ZERO
            },
            ..refusal
        };
        assert!(zcdp
            .to_string()
            .starts_with("requested δ=0.000001 and ρ=0.1 (zCDP), remaining"));
    }

    fn random_amount(rng: &mut impl Rng, max_digits: u32) -> Fixed {
        let digits = rng.random_range(1..=max_digits);
        let mantissa: u128 = rng.random_range(1..1000);
        Fixed::from_units(mantissa * 10u128.pow(18 - digits.min(18)))
    }

    fn random_delta(rng: &mut impl Rng) -> Fixed {
        let exponent = rng.random_range(3..=15u32);
        Fixed::from_units(rng.random_range(1..10u128) * 10u128.pow(18 - exponent))
    }

    fn random_cost(rng: &mut impl Rng) -> Cost {
        let eps = random_amount(rng, 4);
        match rng.random_range(0..4u8) {
            0 => Cost::pure(eps),
            1 => Cost::approx(eps, random_delta(rng)),
            2 => Cost::zcdp(random_amount(rng, 5)),
            _ => Cost::ZERO,
        }
    }

    #[test]
    fn no_interleaving_of_admitted_charges_exceeds_the_limit() {
        let mut rng = ChaCha20Rng::seed_from_u64(0xb0d9e7);
        let (mut admissions, mut refusals, mut mixed) = (0, 0, 0);
        for _ in 0..300 {
            let lim = Limit::new(
                random_amount(&mut rng, 2),
                random_delta(&mut rng).saturating_add(random_delta(&mut rng)),
            );
            let costs: Vec<Cost> = (0..rng.random_range(1..60))
                .map(|_| random_cost(&mut rng))
                .collect();
            // Several orders of the same requests, as concurrent sessions could interleave them.
            for _ in 0..5 {
                let mut order = costs.clone();
                for i in (1..order.len()).rev() {
                    order.swap(i, rng.random_range(0..=i));
                }
                let mut spent = Spent::ZERO;
                let mut admitted = Cost::ZERO;
                for cost in &order {
                    match admit(&lim, &spent, cost) {
                        Ok(after) => {
                            admissions += 1;
                            assert_eq!(after, spent + *cost);
                            admitted = admitted + *cost;
                            spent = after;
                            assert!(within(&lim, &spent));
                        }
                        Err(refusal) => {
                            refusals += 1;
                            assert!(!within(&lim, &(spent + *cost)));
                            assert_eq!(refusal.remaining, remaining(&lim, &spent));
                        }
                    }
                }
                let g = guarantee(&spent, lim.delta).unwrap();
                assert!(g.epsilon <= lim.epsilon && g.delta <= lim.delta);
                if !spent.rho.is_zero() && !spent.epsilon.is_zero() && !spent.delta.is_zero() {
                    mixed += 1;
                }
                assert!(spent.delta <= lim.delta);
                assert_eq!(
                    Spent {
                        epsilon: admitted.epsilon,
                        delta: admitted.delta,
                        rho: admitted.rho
                    },
                    spent
                );
            }
        }
        // The generator exercises both outcomes and histories mixing all three kinds of cost.
        assert!(
            admissions > 5_000 && refusals > 5_000 && mixed > 100,
            "{admissions} {refusals} {mixed}"
        );
    }

    #[test]
    fn remaining_epsilon_is_affordable() {
        let mut rng = ChaCha20Rng::seed_from_u64(0x4e4a);
        for _ in 0..2_000 {
            let lim = Limit::new(random_amount(&mut rng, 2), random_delta(&mut rng));
            let spent = Spent {
                epsilon: random_amount(&mut rng, 3),
                delta: Fixed::ZERO,
                rho: if rng.random_bool(0.5) {
                    random_amount(&mut rng, 4)
                } else {
                    Fixed::ZERO
                },
            };
            let left = remaining(&lim, &spent);
            if within(&lim, &spent) {
                // Exactly the remaining pure ε fits, one unit more does not.
                assert!(admit(&lim, &spent, &Cost::pure(left.epsilon)).is_ok());
                assert!(admit(
                    &lim,
                    &spent,
                    &Cost::pure(left.epsilon + Fixed::EPSILON_UNIT)
                )
                .is_err());
            } else {
                assert_eq!(left.epsilon, Fixed::ZERO);
            }
        }
    }
}
