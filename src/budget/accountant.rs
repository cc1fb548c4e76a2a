//! The accountant: what a history of charges guarantees, and whether one more charge fits.
//!
//! Pure arithmetic, no I/O. Invariants:
//! - Totals are exact sums of [`Fixed`] amounts. Floating point is used only for the per-order
//!   budgets and conversions (natural logarithms of fixed parameters), whose results are
//!   margined and rounded so that rounding never favours the analyst: budgets down, spending up.
//! - [`admit`] returns the new totals only if the history *including* the new charge satisfies
//!   the rule below; it never admits a charge that leaves the state outside it, whatever was
//!   charged before or in which order.
//! - The rule is fixed in advance for a history: the Rényi orders, the split of δ, and each
//!   order's budget depend on the limit and on the history's [`Accounting`] only, and that is
//!   fixed at the history's first charge ([`Spent::fixed_under`]) and never changes after, so
//!   the rule is a privacy filter under fully adaptive choice of queries (see "Theorem" below).
//!
//! # What a charge records
//! A [`Cost`] has four parts: ε (the sum of the ε of the query's pure ε-DP components: Laplace
//! measures, report-noisy-max quantiles, the noisy count of partition selection), ρ_pure (the
//! sum of ε_c²/2 over those components), ρ (the zCDP ρ = Δ₂²/2σ² of its Gaussian measures) and δ
//! (the δ of partition selection). At each Rényi order α its divergence is bounded by
//!
//! ```text
//! D_α(cost) ≤ min(ε, α·ρ_pure) + α·ρ
//! ```
//!
//! because an ε-DP mechanism has D_α ≤ D_∞ ≤ ε and is ε²/2-zCDP (Bun & Steinke 2016,
//! "Concentrated Differential Privacy", Proposition 1.4), pure components compose in both forms,
//! and a ρ-zCDP mechanism has D_α ≤ αρ. Partition selection is (ε, δ)-DP: with probability at
//! least 1 − δ it behaves as its ε-DP part (the decomposition of (ε, δ)-indistinguishable
//! distributions, Kairouz, Oh & Viswanath 2015; Murtagh & Vadhan 2016; approximate zCDP in Bun &
//! Steinke 2016), so its δ is added apart.
//!
//! # The rule (GDP, zCDP and Rényi filters over a grid of orders, with a union bound)
//! For a limit (ε_L, δ_L): δ_tail = ⌊δ_L/2⌋ is reserved for the conversions and δ_sel =
//! δ_L − δ_tail for partition selection; δ_tail is split, in advance, into δ_G = ½·δ_tail for
//! the GDP member, δ_z = ¼·δ_tail for the zCDP member and δ_Λ = the rest for the orders
//! ([`TAIL_SHARES`]) under the mixed rule ([`Accounting::Mixed`], the default), and into
//! δ_G = δ_tail and nothing for the others under the Gaussian rule ([`Accounting::Gaussian`]:
//! a member with no δ admits nothing). Λ is the
//! fixed grid [`ORDERS`] of |Λ| finite orders. Each order has the budget
//!
//! ```text
//! B_α = ε_L − (ln(|Λ|/δ_Λ) − ln α)/(α − 1) − ln(1 − 1/α)        (rounded down, margined)
//! ```
//!
//! the largest Rényi divergence at order α that the conversion of Canonne, Kamath & Steinke 2020
//! ("The Discrete Gaussian for Differential Privacy", Proposition 12: (α, τ)-RDP implies
//! (τ + (ln(1/δ) − ln α)/(α − 1) + ln(1 − 1/α), δ)-DP) turns into (ε_L, δ_Λ/|Λ|). The zCDP
//! member has the budget B_z, the largest ρ whose conversion by the same proposition at the
//! best order of the continuum (ρ-zCDP is (α, αρ)-RDP at every α > 1 at once,
//! [`zcdp_to_epsilon`]) is (ε_L, δ_z). A cost's zCDP part is D_z(c) = ρ_pure + ρ
//! ([`Cost::concentrated`]). The GDP member has the budget B_G, the largest μ² whose μ-GDP
//! guarantee is (ε_L, δ_G)-DP ([`gdp::budget_mu_squared`]); a cost's GDP part is
//! μ²(c) = π·ρ_pure + 2ρ ([`Cost::gaussian_dp`]: the Gaussian measures are the rounded
//! Gaussian, exactly √(2ρ)-GDP, and an ε-DP component is μ(ε)-GDP with μ(ε)² ≤ (π/2)·ε²). A
//! history of costs c₁ … c_k is within the limit iff
//!
//! ```text
//! Σ δ_i ≤ δ_sel   and   ( Σ ρ_i = 0 and Σ ε_i ≤ ε_L          [the order ∞: basic composition]
//!                         or  Σ μ²(c_i) ≤ B_G                 [Gaussian DP]
//!                         or  Σ D_z(c_i) ≤ B_z                [zCDP, every order at once]
//!                         or  Σ D_α(c_i) ≤ B_α for some α ∈ Λ )
//! ```
//!
//! and [`admit`] admits a charge iff the history with it is within the limit.
//!
//! # Theorem
//! Any interaction in which an analyst chooses each query (and its cost) adaptively from earlier
//! answers, and every query runs only if admitted, is (ε_L, δ_L)-DP. Proof sketch: replace each
//! partition selection by its ε-DP part; by a union bound over the queries (conditional
//! probabilities, Σ δ_i ≤ δ_sel always) the transcript changes with probability at most δ_sel.
//! For each order α ∈ Λ ∪ {∞}, let F_α be the filter that admits while Σ D_α ≤ B_α (with
//! B_∞ = ε_L). F_α alone is a Rényi filter: its adaptive composition is (α, B_α)-RDP (Feldman &
//! Zrnic 2021, "Individual Privacy Accounting via a Rényi Filter"), hence (ε_L, δ_Λ/|Λ|)-DP by
//! the conversion above, and F_∞ is the basic-composition filter, ε_L-DP (Rogers, Roth, Ullman &
//! Vadhan 2016, "Privacy Odometers and Filters: Pay-as-you-Go Composition"). Let F_z be the
//! filter that admits while Σ D_z ≤ B_z: at every order α at once, each charge's divergence is
//! at most α·D_z(c) (its pure components are ε_c²/2-zCDP, Bun & Steinke 2016, Proposition 1.4;
//! its Gaussian ones ρ-zCDP) and F_z is the Rényi filter with budget α·B_z, so its
//! composition is (α, α·B_z)-RDP for every α, i.e. B_z-zCDP, hence (ε_L, δ_z)-DP by the
//! conversion at the best order. Let F_G be the filter that admits while Σ μ²(c_i) ≤ B_G:
//! each charge is μ(c_i)-GDP given the past, so F_G is the fully adaptive GDP filter of Smith
//! & Thakurta 2022 ("Fully Adaptive Composition for Gaussian Differential Privacy"), √B_G-GDP,
//! hence (ε_L, δ_G)-DP (Dong, Roth & Su 2022, Corollary 2.13). Partition the transcripts by the
//! first member (∞, then G, then z, then Λ in order) that is still within its budget at the
//! end; on the part of member m the interaction and F_m produce the same transcripts with the
//! same probabilities. Summing the per-part guarantees gives, for every set E of transcripts,
//! P[M(x) ∈ E] ≤ e^{ε_L} P[M(x') ∈ E] + δ_G + δ_z + |Λ|·δ_Λ/|Λ| + δ_sel
//! = e^{ε_L} P[M(x') ∈ E] + δ_L.
//! Whitehouse, Ramdas, Rogers & Wu 2023 ("Fully-Adaptive Composition in Differential Privacy",
//! ICML) give filters for approximate zCDP; the rule here adds a grid of orders fixed in advance
//! and pays for it with the union bound. docs/privacy.md states it for users.
//!
//! What the rule buys: a history of only pure ε is admitted exactly as by basic composition
//! (the order ∞); a history of Gaussian queries by exact composition (Gaussian DP) at δ_G
//! (91 counts at σ ≈ 5.39 within (10, 10⁻⁶), where the zCDP member alone at ¾·δ_tail admitted
//! 84, the grid alone 72 and basic composition 10); mixes of large pure components and
//! Gaussian ones at the best order of the grid. Charges made before the GDP member with the
//! *discrete* Gaussian (zCDP with the continuous one's ρ, CKS20 Theorem 4, but not μ-GDP with
//! its μ) are not GDP: a history holding one has [`Spent::gdp`] = MAX and the other members
//! admit for it. Under the Gaussian rule the GDP member has all of δ_tail and admits 95 of
//! those counts (99 with the whole δ), and the orders and the zCDP member admit nothing: mixes
//! of large pure components with Gaussian ones fit fewer, histories of pure ε alone exactly
//! as many (docs/privacy.md, "Two rules").
//!
//! A history keeps the rule of its first charge: changing a limit's rule in the middle of a
//! history would let its final totals fall in a member of either rule, and the union bound
//! would then pay both rules' δ_tail. The ledger stores the rule with the totals, so a policy
//! that changes `accounting` takes effect for histories that start afterwards.
//!
//! A history recorded before per-order totals existed (a ledger of schema version 1) is read
//! with D_α ≤ ε + αρ for every old charge ([`Spent::from_sums`]), which bounds it.

use std::fmt;
use std::ops::Add;

use super::fixed::Fixed;
use super::gdp;
pub use super::refusal::{Refusal, Scope};
use super::split::split_tail;
pub use super::split::TAIL_SHARES;
use crate::memo::Memo;
use crate::policy::{Accounting, Period};

/// Bisection steps for the optimal Rényi order; f64 bisection stops improving long before.
const BISECTION_STEPS_MAX: u32 = 300;

/// Relative safety margin added to the f64 conversion before rounding up.
const CONVERSION_MARGIN_RELATIVE: f64 = 1e-10;

/// Absolute safety margin added to the f64 conversion before rounding up.
const CONVERSION_MARGIN_ABSOLUTE: f64 = 1e-14;

/// How many finite Rényi orders the filter uses.
pub const ORDER_COUNT: usize = 23;

/// The finite Rényi orders α of the filter, as exact fractions (p, q) = p/q, fixed in advance.
/// Dense where Gaussian histories of a usual budget find their best order (2 to 16), sparse
/// beyond; pure ε is served by the order ∞ apart.
pub const ORDERS: [(u32, u32); ORDER_COUNT] = [
    (5, 4),
    (3, 2),
    (7, 4),
    (2, 1),
    (5, 2),
    (3, 1),
    (7, 2),
    (4, 1),
    (9, 2),
    (5, 1),
    (6, 1),
    (7, 1),
    (8, 1),
    (10, 1),
    (12, 1),
    (16, 1),
    (20, 1),
    (24, 1),
    (32, 1),
    (48, 1),
    (64, 1),
    (128, 1),
    (256, 1),
];

/// The order α of index `i` of [`ORDERS`], as an f64 (for the conversions only).
fn order(i: usize) -> f64 {
    let (p, q) = ORDERS[i];
    f64::from(p) / f64::from(q)
}

/// Rényi divergence bounds at each order of [`ORDERS`].
pub type Renyi = [Fixed; ORDER_COUNT];

/// What one query spends.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Cost {
    /// Pure ε: the sum over the query's ε-DP components (Laplace-type measures, quantiles, the
    /// noisy count of partition selection). Adds.
    pub epsilon: Fixed,
    /// The zCDP ρ of those same components, Σ ε_c²/2 (at least ε²/2 divided by their number).
    pub pure_rho: Fixed,
    /// δ: partition selection. Adds.
    pub delta: Fixed,
    /// zCDP ρ: Gaussian-type mechanisms. Adds.
    pub rho: Fixed,
}

impl Cost {
    /// Nothing.
    pub const ZERO: Cost = Cost {
        epsilon: Fixed::ZERO,
        pure_rho: Fixed::ZERO,
        delta: Fixed::ZERO,
        rho: Fixed::ZERO,
    };

    /// Whether this cost is at least `other` in every part: a charge of `self` pays for a
    /// release of cost `other`.
    pub fn covers(&self, other: &Cost) -> bool {
        self.epsilon >= other.epsilon
            && self.pure_rho >= other.pure_rho
            && self.delta >= other.delta
            && self.rho >= other.rho
    }

    /// A pure ε-DP cost of one component.
    pub fn pure(epsilon: Fixed) -> Cost {
        Cost::pure_parts(&[epsilon])
    }

    /// A pure ε-DP cost of several components (each measure of a query with its own noise):
    /// ε = Σ ε_c, ρ_pure = Σ ε_c²/2.
    pub fn pure_parts(parts: &[Fixed]) -> Cost {
        parts.iter().fold(Cost::ZERO, |sum, &epsilon| {
            sum + Cost {
                epsilon,
                pure_rho: epsilon.half_square_ceil(),
                ..Cost::ZERO
            }
        })
    }

    /// A pure ε-DP cost of `parts` equal components that share `epsilon` (a query's measures
    /// and partition selection): ε = `epsilon`, ρ_pure = ε²/(2·parts), rounded up.
    pub fn pure_split(epsilon: Fixed, parts: usize) -> Cost {
        let parts = u32::try_from(parts.max(1)).unwrap_or(u32::MAX);
        Cost {
            epsilon,
            pure_rho: epsilon.half_square_ceil().mul_ratio_ceil(1, parts),
            ..Cost::ZERO
        }
    }

    /// An (ε, δ)-DP cost of one component (e.g. partition selection).
    pub fn approx(epsilon: Fixed, delta: Fixed) -> Cost {
        Cost {
            delta,
            ..Cost::pure(epsilon)
        }
    }

    /// A ρ-zCDP cost.
    pub const fn zcdp(rho: Fixed) -> Cost {
        Cost {
            epsilon: Fixed::ZERO,
            pure_rho: Fixed::ZERO,
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
            pure_rho: self.pure_rho.checked_add(other.pure_rho)?,
            delta: self.delta.checked_add(other.delta)?,
            rho: self.rho.checked_add(other.rho)?,
        })
    }

    /// This cost as zCDP: ρ_pure + ρ (an ε-DP component is ε²/2-zCDP and zCDP composes by
    /// adding ρ), saturating at [`Fixed::MAX`], which only ever refuses more.
    pub fn concentrated(&self) -> Fixed {
        self.pure_rho.saturating_add(self.rho)
    }

    /// This cost as Gaussian DP, μ² (the GDP member of the rule): each pure component of ε_c is
    /// μ(ε_c)-GDP with μ(ε_c)² ≤ (π/2)·ε_c², so the pure part is at most π·ρ_pure (π rounded up
    /// to 355/113), and the Gaussian measures (the rounded Gaussian, exactly GDP) are
    /// √(2ρ)-GDP together; μ² adds. Saturating at [`Fixed::MAX`], which only ever refuses more.
    pub fn gaussian_dp(&self) -> Fixed {
        self.pure_rho
            .mul_ratio_ceil(355, 113)
            .saturating_add(self.rho.saturating_add(self.rho))
    }

    /// The bound on this cost's Rényi divergence at order `ORDERS[i]`:
    /// min(ε, α·ρ_pure) + α·ρ, rounded up.
    pub fn renyi(&self, i: usize) -> Fixed {
        let (p, q) = ORDERS[i];
        self.epsilon.min(self.pure_rho.mul_ratio_ceil(p, q)) + self.rho.mul_ratio_ceil(p, q)
    }
}

impl fmt::Display for Cost {
    /// `epsilon=1 delta=0`, with `rho=0.0171 (zCDP)` after them when ρ was spent.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "epsilon={} delta={}", self.epsilon, self.delta)?;
        if !self.rho.is_zero() {
            write!(f, " rho={} (zCDP)", self.rho)?;
        }
        Ok(())
    }
}

impl Add for Cost {
    type Output = Cost;

    /// Exact sum (composition), saturating at [`Fixed::MAX`], which only ever refuses more.
    fn add(self, other: Cost) -> Cost {
        Cost {
            epsilon: self.epsilon + other.epsilon,
            pure_rho: self.pure_rho + other.pure_rho,
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
    /// The window the limit covers: each calendar window of the period (`budget::window`) on its
    /// own, or `None` for the whole history. The rule of the module docs is the same either way;
    /// the ledger chooses which totals it is applied to.
    pub period: Option<Period>,
    /// The rule a history that starts under this limit is composed under (the split of
    /// δ_tail); a history keeps the rule of its first charge ([`Spent::accounting`]).
    pub accounting: Accounting,
}

impl Limit {
    /// A limit of (ε, δ) over the whole history.
    pub const fn new(epsilon: Fixed, delta: Fixed) -> Limit {
        Limit {
            epsilon,
            delta,
            period: None,
            accounting: Accounting::Mixed,
        }
    }

    /// This limit, with histories that start under it composed by `accounting`.
    pub const fn under(self, accounting: Accounting) -> Limit {
        Limit { accounting, ..self }
    }

    /// This limit, renewed every window of `period` (`None`: never).
    pub const fn per(self, period: Option<Period>) -> Limit {
        Limit { period, ..self }
    }

    /// This limit raised by `grants` (`pgdp budget grant`): ε and δ each add, saturating at
    /// [`Fixed::MAX`]. The rule of the module docs then applies to the raised limit as to any
    /// other: the orders' budgets and the split of δ are those of the sum, so an analyst's
    /// guarantee over the whole history is (policy + grants). The ledger reads the grants under
    /// the analyst's row lock, in the charge's transaction, so the rule stays fixed for each
    /// admission even as grants arrive.
    pub fn granted(&self, grants: &Limit) -> Limit {
        Limit {
            epsilon: self.epsilon.saturating_add(grants.epsilon),
            delta: self.delta.saturating_add(grants.delta),
            period: self.period,
            accounting: self.accounting,
        }
    }

    /// δ_tail: the half of δ reserved, in advance, for the conversions (the zCDP member's and
    /// the Rényi orders').
    pub fn tail_delta(&self) -> Fixed {
        Fixed::from_units(self.delta.units() / 2)
    }

    /// δ_G: the share of δ_tail the GDP member converts with (`TAIL_SHARES`).
    pub fn gdp_delta(&self) -> Fixed {
        split_tail(self.tail_delta(), self.accounting).gdp
    }

    /// δ_z: the share of δ_tail the zCDP member converts with (`TAIL_SHARES`).
    pub fn zcdp_delta(&self) -> Fixed {
        split_tail(self.tail_delta(), self.accounting).zcdp
    }

    /// δ_Λ: the rest of δ_tail, split equally over the Rényi orders.
    pub fn orders_delta(&self) -> Fixed {
        split_tail(self.tail_delta(), self.accounting).orders
    }

    /// δ_sel: the δ that partition selection may spend, the rest of the limit's δ.
    pub fn selection_delta(&self) -> Fixed {
        self.delta.saturating_sub(self.tail_delta())
    }

    /// B_α for `ORDERS[i]`: the largest Rényi divergence at that order whose conversion fits
    /// (ε, δ_Λ/|Λ|), rounded down; `None` when there is none (δ_Λ = 0, or the conversion
    /// alone exceeds ε).
    pub fn renyi_budget(&self, i: usize) -> Option<Fixed> {
        self.budgets().orders[i]
    }

    /// Every member's budget at once: one memo lookup for a loop over the orders.
    fn budgets(&self) -> Budgets {
        budgets(self.epsilon, self.tail_delta(), self.accounting)
    }

    /// B_z: the largest zCDP ρ whose conversion ([`zcdp_to_epsilon`], over the continuum of
    /// orders) at δ_z is at most ε, rounded down; `None` when there is none (δ_z = 0).
    pub fn zcdp_budget(&self) -> Option<Fixed> {
        budgets(self.epsilon, self.tail_delta(), self.accounting).zcdp
    }

    /// B_G: the largest μ² whose μ-GDP guarantee is (ε, δ_G)-DP ([`gdp::budget_mu_squared`]),
    /// rounded down; `None` when there is none (δ_G = 0).
    pub fn gdp_budget(&self) -> Option<Fixed> {
        budgets(self.epsilon, self.tail_delta(), self.accounting).gdp
    }
}

/// The budgets of the rule's members for one (ε, δ_tail): each Rényi order's, the zCDP
/// member's and the GDP member's.
#[derive(Clone, Copy)]
struct Budgets {
    orders: [Option<Fixed>; ORDER_COUNT],
    zcdp: Option<Fixed>,
    gdp: Option<Fixed>,
}

/// The [`Budgets`] for (ε, δ_tail) under a rule, computed once per triple and remembered ([`crate::memo`]):
/// admission, the remaining budget and the count of repeats ask for them query after query,
/// and each costs exact decimal conversions (and the zCDP member's a bisection).
fn budgets(epsilon: Fixed, tail: Fixed, accounting: Accounting) -> Budgets {
    static MEMO: Memo<(Fixed, Fixed, Accounting), Budgets> =
        Memo::new(crate::limits::RENYI_BUDGETS_CACHED_MAX);
    MEMO.get_or((epsilon, tail, accounting), || {
        let split = split_tail(tail, accounting);
        let epsilon_f64 = epsilon.to_f64();
        Budgets {
            orders: std::array::from_fn(|i| {
                let term = conversion_term(split.orders, i)?;
                let budget = epsilon_f64 - term;
                if !budget.is_finite() || budget <= 0.0 {
                    return None;
                }
                Fixed::from_f64_floor(budget).ok()
            }),
            zcdp: zcdp_budget(epsilon, split.zcdp),
            gdp: gdp::budget_mu_squared(epsilon_f64, split.gdp.to_f64())
                .and_then(|b| Fixed::from_f64_floor(b).ok())
                .filter(|b| !b.is_zero()),
        }
    })
}

/// The largest ρ on the [`Fixed`] grid with `zcdp_to_epsilon(ρ, δ) ≤ ε` (the conversion is
/// monotone in ρ), by bisection over the grid's units; `None` when δ = 0 or no positive ρ fits.
fn zcdp_budget(epsilon: Fixed, delta: Fixed) -> Option<Fixed> {
    if delta.is_zero() {
        return None;
    }
    let fits = |units: u128| {
        zcdp_to_epsilon(Fixed::from_units(units), delta).is_some_and(|e| e <= epsilon)
    };
    // A ρ-zCDP conversion is at least ρ, so ρ = ε + 1 never fits.
    let hi = epsilon.saturating_add(Fixed::ONE).units();
    if fits(hi) {
        return None;
    }
    let lo = largest_fitting(0, hi, fits);
    (lo > 0).then(|| Fixed::from_units(lo))
}

/// The largest n in [lo, hi) with `fits(n)`, by bisection, for a monotone `fits` (true up to
/// some point, false after) with `fits(lo)` true (or taken as true) and `fits(hi)` false.
fn largest_fitting(mut lo: u128, mut hi: u128, fits: impl Fn(u128) -> bool) -> u128 {
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if fits(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    lo
}

/// (ln(|Λ|/δ_Λ) − ln α)/(α − 1) + ln(1 − 1/α) plus a safety margin: what the conversion at
/// `ORDERS[i]` adds to a Rényi divergence. `None` when δ_Λ = 0.
fn conversion_term(orders_delta: Fixed, i: usize) -> Option<f64> {
    if orders_delta.is_zero() {
        return None;
    }
    let alpha = order(i);
    let per_order = orders_delta.to_f64() / ORDER_COUNT as f64;
    let t1 = (-per_order.ln() - alpha.ln()) / (alpha - 1.0);
    let t2 = (-1.0 / alpha).ln_1p();
    let margin = CONVERSION_MARGIN_RELATIVE * (t1.abs() + t2.abs())
        + CONVERSION_MARGIN_ABSOLUTE * (1.0 + 1.0 / (alpha - 1.0));
    let term = t1 + t2 + margin;
    term.is_finite().then_some(term)
}

/// The sum of all costs charged so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Spent {
    /// Sum of pure ε (the order ∞ of the rule).
    pub epsilon: Fixed,
    /// Sum of δ (partition selection).
    pub delta: Fixed,
    /// Sum of zCDP ρ of Gaussian-type mechanisms.
    pub rho: Fixed,
    /// Sum of the charges' Rényi divergence bounds, per order of [`ORDERS`].
    pub renyi: Renyi,
    /// Sum of the charges' zCDP ρ ([`Cost::concentrated`]): the zCDP member of the rule.
    pub zcdp: Fixed,
    /// Sum of the charges' μ² as Gaussian DP ([`Cost::gaussian_dp`]): the GDP member of the
    /// rule. [`Fixed::MAX`] (or anything near it) for a history with a charge that is not known
    /// to be GDP (a Gaussian one drawn with the discrete Gaussian, before the GDP member
    /// existed), which no GDP budget admits; kept by saturating sums.
    pub gdp: Fixed,
    /// The rule this history is composed under, fixed at its first charge from the limit then
    /// in force ([`Spent::fixed_under`]) and kept by every sum; `None` before any charge, and
    /// for totals no limit governs (the dataset's without a dataset budget).
    pub accounting: Option<Accounting>,
}

impl Spent {
    /// Nothing spent yet.
    pub const ZERO: Spent = Spent {
        epsilon: Fixed::ZERO,
        delta: Fixed::ZERO,
        rho: Fixed::ZERO,
        renyi: [Fixed::ZERO; ORDER_COUNT],
        zcdp: Fixed::ZERO,
        gdp: Fixed::ZERO,
        accounting: None,
    };

    /// A history known only by its sums (a ledger written before per-order totals): each of its
    /// charges had D_α ≤ ε + αρ, so ε_sum + α·ρ_sum bounds the history at every order; and
    /// its ρ_pure, a sum of ε_c²/2 over components whose ε_c add up to ε_sum, is at most
    /// ε_sum²/2, so ε_sum²/2 + ρ_sum bounds its zCDP total. Its Gaussian charges (ρ_sum > 0)
    /// were drawn with the discrete Gaussian, so it has no GDP total ([`Spent::gdp`] is MAX);
    /// without them its μ² is at most π·ε_sum²/2. Every history then was composed by the mixed
    /// rule.
    pub fn from_sums(epsilon: Fixed, delta: Fixed, rho: Fixed) -> Spent {
        let mut renyi = [Fixed::ZERO; ORDER_COUNT];
        for (i, slot) in renyi.iter_mut().enumerate() {
            *slot = Cost {
                epsilon,
                pure_rho: Fixed::MAX,
                delta,
                rho,
            }
            .renyi(i);
        }
        Spent {
            epsilon,
            delta,
            rho,
            renyi,
            zcdp: epsilon.half_square_ceil().saturating_add(rho),
            gdp: if rho.is_zero() {
                Cost {
                    pure_rho: epsilon.half_square_ceil(),
                    ..Cost::ZERO
                }
                .gaussian_dp()
            } else {
                Fixed::MAX
            },
            accounting: (!(epsilon.is_zero() && delta.is_zero() && rho.is_zero()))
                .then_some(Accounting::Mixed),
        }
    }

    /// Whether nothing was charged: every total is zero.
    pub fn is_zero(&self) -> bool {
        self.epsilon.is_zero()
            && self.delta.is_zero()
            && self.rho.is_zero()
            && self.zcdp.is_zero()
            && self.gdp.is_zero()
            && self.renyi.iter().all(|d| d.is_zero())
    }

    /// These totals with their rule fixed: the one they already have, else, once something was
    /// charged, the rule of `limit`, the limit they are admitted under. Every admission fixes
    /// the rule of the totals it is checked against ([`admit`], and the ledger's reservations
    /// of lease slices), so a history is composed by one rule from its first charge on, even
    /// when the policy changes the limit's rule later (docs/privacy.md, "Two rules").
    pub fn fixed_under(self, limit: &Limit) -> Spent {
        if self.accounting.is_some() || self.is_zero() {
            return self;
        }
        Spent {
            accounting: Some(limit.accounting),
            ..self
        }
    }

    /// The totals after one more cost, or `None` on overflow.
    pub fn checked_add(&self, cost: &Cost) -> Option<Spent> {
        let mut renyi = self.renyi;
        for (i, slot) in renyi.iter_mut().enumerate() {
            *slot = slot.checked_add(cost.renyi(i))?;
        }
        Some(Spent {
            epsilon: self.epsilon.checked_add(cost.epsilon)?,
            delta: self.delta.checked_add(cost.delta)?,
            rho: self.rho.checked_add(cost.rho)?,
            renyi,
            zcdp: self.zcdp.checked_add(cost.concentrated())?,
            gdp: self.gdp.saturating_add(cost.gaussian_dp()),
            accounting: self.accounting,
        })
    }
}

impl Spent {
    /// The totals after `k` charges of `cost`, or `None` on overflow.
    pub fn after_repeats(&self, cost: &Cost, k: u64) -> Option<Spent> {
        let mut renyi = self.renyi;
        for (i, slot) in renyi.iter_mut().enumerate() {
            *slot = slot.checked_add(cost.renyi(i).checked_mul_int(k)?)?;
        }
        Some(Spent {
            epsilon: self.epsilon.checked_add(cost.epsilon.checked_mul_int(k)?)?,
            delta: self.delta.checked_add(cost.delta.checked_mul_int(k)?)?,
            rho: self.rho.checked_add(cost.rho.checked_mul_int(k)?)?,
            renyi,
            zcdp: self
                .zcdp
                .checked_add(cost.concentrated().checked_mul_int(k)?)?,
            gdp: self
                .gdp
                .saturating_add(cost.gaussian_dp().checked_mul_int(k)?),
            accounting: self.accounting,
        })
    }
}

impl Add<Cost> for Spent {
    type Output = Spent;

    /// Exact sum, saturating at [`Fixed::MAX`], which only ever refuses more.
    fn add(self, cost: Cost) -> Spent {
        let mut renyi = self.renyi;
        for (i, slot) in renyi.iter_mut().enumerate() {
            *slot = *slot + cost.renyi(i);
        }
        Spent {
            epsilon: self.epsilon + cost.epsilon,
            delta: self.delta + cost.delta,
            rho: self.rho + cost.rho,
            renyi,
            zcdp: self.zcdp + cost.concentrated(),
            gdp: self.gdp + cost.gaussian_dp(),
            accounting: self.accounting,
        }
    }
}

/// What is left of a limit, for display.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Remaining {
    /// The largest ε of one more pure ε-DP query of one component that would be admitted
    /// (a query whose ε is split over several measures may spend somewhat more).
    pub epsilon: Fixed,
    /// δ that partition selection may still spend.
    pub delta: Fixed,
    /// The largest zCDP ρ of one more Gaussian query that would be admitted.
    pub rho: Fixed,
}

/// The (ε, δ)-DP guarantee of a whole history of charges.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Guarantee {
    /// The smallest ε the rule proves for the history: Σ ε when no ρ was spent (order ∞), or
    /// the conversion of its divergence at the best order of the grid.
    pub epsilon: Fixed,
    /// δ of the history: δ spent by partition selection plus the δ_tail the grid reserves.
    pub delta: Fixed,
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

/// The (ε, δ)-DP guarantee the rule proves for `spent` under `limit` (module docs): the order ∞
/// when no ρ was spent, else the best of the zCDP member's conversion and the converted
/// orders. `None` when no member applies (ρ spent and δ_tail = 0) or the result does not fit a
/// [`Fixed`].
pub fn guarantee(limit: &Limit, spent: &Spent) -> Option<Guarantee> {
    let limit = &in_force(limit, spent);
    let tail = limit.tail_delta();
    let mut best: Option<Fixed> = spent.rho.is_zero().then_some(spent.epsilon);
    let mut consider = |epsilon: Fixed, within_budget: bool| {
        // Within a member's budget, the rule proves the limit's ε itself (the f64 conversion
        // may land an ulp beyond it).
        let epsilon = if within_budget {
            epsilon.min(limit.epsilon)
        } else {
            epsilon
        };
        best = Some(best.map_or(epsilon, |b| b.min(epsilon)));
    };
    let zcdp_delta = limit.zcdp_delta();
    if !zcdp_delta.is_zero() {
        if let Some(epsilon) = zcdp_to_epsilon(spent.zcdp, zcdp_delta) {
            consider(
                epsilon,
                limit.zcdp_budget().is_some_and(|b| spent.zcdp <= b),
            );
        }
    }
    let gdp_delta = limit.gdp_delta();
    if !gdp_delta.is_zero() && spent.gdp < Fixed::MAX {
        let epsilon = gdp::epsilon_for(spent.gdp.to_f64().sqrt(), gdp_delta.to_f64())
            .and_then(|e| Fixed::from_f64_ceil(e).ok());
        if let Some(epsilon) = epsilon {
            consider(epsilon, limit.gdp_budget().is_some_and(|b| spent.gdp <= b));
        }
    }
    let orders_delta = limit.orders_delta();
    for (i, divergence) in spent.renyi.iter().enumerate() {
        let Some(term) = conversion_term(orders_delta, i) else {
            break;
        };
        let Ok(epsilon) = Fixed::from_f64_ceil((divergence.to_f64() + term).max(0.0)) else {
            continue;
        };
        consider(
            epsilon,
            limit.renyi_budget(i).is_some_and(|b| *divergence <= b),
        );
    }
    let epsilon = best?;
    let only_pure = spent.rho.is_zero() && epsilon == spent.epsilon;
    let delta = if only_pure || tail.is_zero() {
        spent.delta
    } else {
        spent.delta.saturating_add(tail)
    };
    Some(Guarantee { epsilon, delta })
}

/// `limit` with the rule `spent` is composed under: the history's own once it has one
/// ([`Spent::accounting`]), else the limit's.
pub fn in_force(limit: &Limit, spent: &Spent) -> Limit {
    match spent.accounting {
        Some(accounting) => limit.under(accounting),
        None => *limit,
    }
}

/// Whether `spent` is within `limit` under the rule of the module docs.
pub fn within(limit: &Limit, spent: &Spent) -> bool {
    let limit = &in_force(limit, spent);
    if spent.delta > limit.selection_delta() {
        return false;
    }
    if spent.rho.is_zero() && spent.epsilon <= limit.epsilon {
        return true;
    }
    let budgets = limit.budgets();
    if budgets.zcdp.is_some_and(|b| spent.zcdp <= b) {
        return true;
    }
    if budgets.gdp.is_some_and(|b| spent.gdp <= b) {
        return true;
    }
    (0..ORDER_COUNT).any(|i| budgets.orders[i].is_some_and(|budget| spent.renyi[i] <= budget))
}

/// Admits `cost` on top of `spent` if the history stays within `limit`, returning the new
/// totals; otherwise says what was asked and what is left ([`Scope::Analyst`]).
// A refusal is a few hundred bytes of plain numbers, returned once per refused query and
// consumed at once; boxing it would only add an allocation.
#[allow(clippy::result_large_err)]
pub fn admit(limit: &Limit, spent: &Spent, cost: &Cost) -> Result<Spent, Refusal> {
    match spent.checked_add(cost) {
        Some(after) if within(limit, &after) => Ok(after.fixed_under(limit)),
        _ => Err(Refusal {
            scope: Scope::Analyst,
            requested: *cost,
            limit: *limit,
            remaining: remaining(limit, spent),
            window: None,
        }),
    }
}

/// The ε a charge of `cost` took from what was left, `spent` being the totals after it: the
/// remaining ε ([`remaining`]) before the charge minus the remaining ε after it. This is the
/// price of a charge in the analyst's currency whatever its mechanism (a Gaussian query's ρ
/// costs ε through the Rényi filter), and it depends on what was spent before: the same ρ
/// takes less ε from a fresh budget than from one that holds only pure-ε charges. Exact (the
/// sums are exact) except where a total saturated at [`Fixed::MAX`].
pub fn epsilon_taken(limit: &Limit, spent: &Spent, cost: &Cost) -> Fixed {
    let mut renyi = spent.renyi;
    for (i, slot) in renyi.iter_mut().enumerate() {
        *slot = slot.saturating_sub(cost.renyi(i));
    }
    let before = Spent {
        epsilon: spent.epsilon.saturating_sub(cost.epsilon),
        delta: spent.delta.saturating_sub(cost.delta),
        rho: spent.rho.saturating_sub(cost.rho),
        renyi,
        zcdp: spent.zcdp.saturating_sub(cost.concentrated()),
        gdp: spent.gdp.saturating_sub(cost.gaussian_dp()),
        accounting: spent.accounting,
    };
    remaining(limit, &before)
        .epsilon
        .saturating_sub(remaining(limit, spent).epsilon)
}

/// How many more times `cost` would be admitted on top of `spent`, one after the other: the
/// largest k with `spent + k·cost` within `limit`, counted up to
/// [`limits::REPEATS_COUNTED_MAX`](crate::limits::REPEATS_COUNTED_MAX) (also for a zero cost).
/// This is the admission rule itself applied to k copies (the totals after k charges of the
/// same cost are exactly `spent + k·cost`, per order too), so the count is exact, not an
/// estimate; it is "about" only in that the next query may cost a little more or less.
pub fn repeats(limit: &Limit, spent: &Spent, cost: &Cost) -> u64 {
    let fits = |k: u64| {
        spent
            .after_repeats(cost, k)
            .is_some_and(|s| within(limit, &s))
    };
    let max = crate::limits::REPEATS_COUNTED_MAX;
    if !fits(0) {
        return 0;
    }
    if fits(max) {
        return max;
    }
    // within(spent + k·cost) holds for k = 0 and fails for k = max; it is monotone in k since
    // every total only grows with k.
    let k = largest_fitting(0, u128::from(max), |k| u64::try_from(k).is_ok_and(&fits));
    u64::try_from(k).unwrap_or(0)
}

/// π rounded up as [`Cost::gaussian_dp`] rounds it (355/113), for [`remaining`]'s pure ε.
const PI_UP: f64 = 355.0 / 113.0;

/// [`remaining`] understates what is left by 1/`REMAINING_SHRINK_DIVISOR` of itself (10⁻⁹), so
/// that what it shows is admitted in spite of the rounding of the per-order costs.
const REMAINING_SHRINK_DIVISOR: u128 = 1_000_000_000;

/// What is left of `limit` after `spent`: the δ partition selection may still spend, and the
/// largest pure ε (one component) and Gaussian ρ of one more query that would be admitted.
/// All zero when the history is already outside the limit (e.g. after the policy lowered it).
pub fn remaining(limit: &Limit, spent: &Spent) -> Remaining {
    let limit = &in_force(limit, spent);
    if !within(limit, spent) {
        return Remaining::default();
    }
    let delta = limit.selection_delta().saturating_sub(spent.delta);
    let mut epsilon = if spent.rho.is_zero() {
        limit.epsilon.saturating_sub(spent.epsilon)
    } else {
        Fixed::ZERO
    };
    let mut rho = Fixed::ZERO;
    let budgets = limit.budgets();
    // The zCDP member: a Gaussian ρ costs ρ there, one pure component of ε costs ε²/2.
    if let Some(left) = budgets.zcdp.and_then(|b| b.checked_sub(spent.zcdp)) {
        rho = rho.max(shrink(left));
        let by_square = Fixed::from_f64_below((2.0 * left.to_f64_approx()).sqrt());
        epsilon = epsilon.max(shrink(by_square));
    }
    // The GDP member: a Gaussian ρ costs 2ρ there, one pure component of ε costs (π/2)·ε².
    if let Some(left) = budgets.gdp.and_then(|b| b.checked_sub(spent.gdp)) {
        rho = rho.max(shrink(left.mul_ratio_floor(1, 2)));
        let by_square = Fixed::from_f64_below((2.0 * left.to_f64_approx() / PI_UP).sqrt());
        epsilon = epsilon.max(shrink(by_square));
    }
    for (i, &(p, q)) in ORDERS.iter().enumerate() {
        let Some(budget) = budgets.orders[i] else {
            continue;
        };
        let Some(left) = budget.checked_sub(spent.renyi[i]) else {
            continue;
        };
        rho = rho.max(shrink(left.mul_ratio_floor(q, p)));
        // One pure component of ε costs min(ε, αε²/2) here: the larger ε of the two forms fits.
        // The fast conversions' rounding (a few 2⁻⁵³ up, relative, through the division and
        // the root) is far inside from_f64_below's margin: never above the exact root.
        let by_square = Fixed::from_f64_below((2.0 * left.to_f64_approx() / order(i)).sqrt());
        epsilon = epsilon.max(shrink(left)).max(shrink(by_square));
    }
    Remaining {
        epsilon,
        delta,
        rho,
    }
}

/// `x` reduced by 1/[`REMAINING_SHRINK_DIVISOR`] of itself, rounded up to the grid, and one
/// grid unit, never below zero; in integers on the grid, exactly.
fn shrink(x: Fixed) -> Fixed {
    let cut = Fixed::from_units(x.units().div_ceil(REMAINING_SHRINK_DIVISOR));
    x.saturating_sub(cut).saturating_sub(Fixed::EPSILON_UNIT)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Error;
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
        assert_eq!(refusal.remaining, Remaining::default());
        // A free query is still admitted.
        assert_eq!(admit(&lim, &spent, &Cost::ZERO), Ok(spent));
    }

    #[test]
    fn laplace_queries_compose_as_by_basic_composition() {
        // The demo analyst: ε = 10, δ = 10⁻⁵, queries at ε = 1 (the order ∞).
        let lim = limit("10", "0.00001");
        let mut spent = Spent::ZERO;
        for _ in 0..10 {
            spent = admit(&lim, &spent, &Cost::pure_parts(&[fx("0.5"), fx("0.5")])).unwrap();
        }
        assert!(admit(&lim, &spent, &Cost::pure(fx("0.5"))).is_err());
        assert_eq!(
            guarantee(&lim, &spent),
            Some(Guarantee {
                epsilon: fx("10"),
                delta: Fixed::ZERO
            })
        );
    }

    /// The target of issue 16: at the noise of today's Gaussian count at ε = 1, δ = 10⁻⁷
    /// (σ ≈ 5.4 for Δ₂ = 1, ρ = 1/(2σ²) ≈ 0.0171), at least 7× the 10 such queries that basic
    /// composition admitted fit in a (10, 10⁻⁶) budget.
    #[test]
    fn gaussian_counts_fit_many_times_more_than_by_basic_composition() {
        let lim = limit("10", "0.000001");
        // The σ of a Gaussian count at (ε = 1, δ = 10⁻⁸), sensitivity 1 (issue 45's measure).
        let sigma = 5.39_f64;
        let rho = Fixed::from_f64_ceil(1.0 / (2.0 * sigma * sigma)).unwrap();
        let mut spent = Spent::ZERO;
        let mut admitted = 0;
        while let Ok(after) = admit(&lim, &spent, &Cost::zcdp(rho)) {
            spent = after;
            admitted += 1;
        }
        eprintln!("{admitted} Gaussian counts at σ = {sigma} fit in (10, 10⁻⁶)");
        // The GDP member at δ_G = 2.5·10⁻⁷: 91 (the zCDP member alone at 3.75·10⁻⁷ admitted
        // 84, the grid of orders alone 72).
        assert_eq!(admitted, 91, "{admitted} queries");
        // Independently: the history as μ-GDP, μ² = 2·Σρ, converts to ε within the limit at
        // δ_G, one more count does not, and its guarantee is within the limit.
        let mu = |rho: Fixed| (2.0 * rho.to_f64()).sqrt();
        let delta = lim.gdp_delta().to_f64();
        let total = gdp::epsilon_for(mu(spent.rho), delta).unwrap();
        assert!(total <= lim.epsilon.to_f64(), "{total}");
        let over = gdp::epsilon_for(mu(spent.rho + rho), delta).unwrap();
        assert!(over > lim.epsilon.to_f64(), "{over}");
        let g = guarantee(&lim, &spent).unwrap();
        assert!(g.epsilon <= lim.epsilon && g.delta <= lim.delta, "{g:?}");
    }

    /// Under the Gaussian rule the GDP member converts with all of δ_tail: issue 45's 95
    /// counts at σ = 5.39 in (10, 10⁻⁶); pure ε alone still composes basically, and two
    /// Laplace queries at ε = 1 leave room for few counts (the mixed rule's orders keep more).
    #[test]
    fn the_gaussian_rule_admits_95_counts_and_keeps_basic_composition() {
        let lim = limit("10", "0.000001").under(Accounting::Gaussian);
        assert_eq!(lim.gdp_delta(), lim.tail_delta());
        assert!(lim.zcdp_budget().is_none() && lim.renyi_budget(12).is_none());
        let sigma = 5.39_f64;
        let rho = Fixed::from_f64_ceil(1.0 / (2.0 * sigma * sigma)).unwrap();
        let count = Cost::zcdp(rho);
        let run = |lim: &Limit, start: Spent| {
            let mut spent = start;
            let mut admitted = 0;
            while let Ok(after) = admit(lim, &spent, &count) {
                spent = after;
                admitted += 1;
            }
            (admitted, spent)
        };
        let (admitted, spent) = run(&lim, Spent::ZERO);
        assert_eq!(admitted, 95, "{admitted} queries");
        assert_eq!(spent.accounting, Some(Accounting::Gaussian));
        // Independently: μ² = 2·Σρ converts within the limit at δ_tail, one more count not.
        let mu = |rho: Fixed| (2.0 * rho.to_f64()).sqrt();
        let delta = lim.tail_delta().to_f64();
        assert!(gdp::epsilon_for(mu(spent.rho), delta).unwrap() <= 10.0);
        assert!(gdp::epsilon_for(mu(spent.rho + rho), delta).unwrap() > 10.0);
        let g = guarantee(&lim, &spent).unwrap();
        assert!(g.epsilon <= lim.epsilon && g.delta <= lim.delta, "{g:?}");
        // Pure ε alone: basic composition, as under the mixed rule.
        let one = Cost::pure(fx("1"));
        let mut pure = Spent::ZERO;
        let mut laplace = 0;
        while let Ok(after) = admit(&lim, &pure, &one) {
            pure = after;
            laplace += 1;
        }
        assert_eq!(laplace, 10);
        // Two Laplace queries at ε = 1, then counts: the GDP member prices each at
        // μ² = π/2, nearly all of its budget; the mixed rule's orders keep room for more.
        let two = Spent::ZERO.after_repeats(&one, 2).unwrap();
        let (after_gaussian, _) = run(&lim, two);
        let (after_mixed, _) = run(&limit("10", "0.000001"), two);
        assert_eq!((after_gaussian, after_mixed), (3, 45));
    }

    /// Soundness against the exact composition (the privacy loss distribution, computed here
    /// apart from every member of the rule): whatever a rule admits of a fixed sequence of
    /// Laplace counts (randomized response's loss, ±ε) and rounded-Gaussian measures (μ² = 2ρ
    /// each, the continuous Gaussian's loss before rounding) is (ε_L, δ)-DP with δ at most
    /// δ_tail, the δ the rule claims for it. No sequence is adaptive here, so this checks the
    /// members' arithmetic and conversions (the lemma for pure parts among them), not the
    /// filter theorems. Fixed seed; no false positives (the comparison is exact up to 10⁻⁶
    /// relative).
    #[test]
    fn admitted_sequences_are_within_the_exact_composition() {
        // δ(ε) = Σ_j P(j)·g(ε − (2j − a)·ε_r), j ~ binomial(a, e^ε_r/(1 + e^ε_r)), g the
        // Gaussian part's E[(1 − e^{e − L_G})₊] at μ² = m2.
        fn exact_delta(a: u64, eps_r: f64, m2: f64, eps: f64) -> f64 {
            let m = m2.sqrt();
            let g = |e: f64| {
                if m2 == 0.0 {
                    (1.0 - e.exp()).max(0.0)
                } else if e > 700.0 {
                    0.0
                } else {
                    let lo = gdp::normal_upper_tail(e / m - m / 2.0);
                    let hi = gdp::normal_upper_tail(e / m + m / 2.0);
                    (lo - e.exp() * hi).max(0.0)
                }
            };
            let ln_norm = (1.0 + eps_r.exp()).ln();
            let mut ln_choose = 0.0_f64;
            let mut delta = 0.0;
            for j in 0..=a {
                if j > 0 {
                    ln_choose += ((a - j + 1) as f64).ln() - (j as f64).ln();
                }
                let ln_weight = ln_choose + j as f64 * eps_r - a as f64 * ln_norm;
                let loss = (2.0 * j as f64 - a as f64) * eps_r;
                delta += ln_weight.exp() * g(eps - loss);
            }
            delta
        }
        let mut rng = ChaCha20Rng::seed_from_u64(0x0b71);
        let (mut checked, mut mixed_histories, mut tightest) = (0, 0, 0.0_f64);
        for run in 0..240 {
            let rule = if run % 2 == 0 {
                Accounting::Mixed
            } else {
                Accounting::Gaussian
            };
            let epsilon = ["0.5", "1", "3", "10"][rng.random_range(0..4)];
            let delta = ["0.00000001", "0.000001", "0.00001", "0.001"][rng.random_range(0..4)];
            let lim = limit(epsilon, delta).under(rule);
            let eps_r = [0.02, 0.1, 0.3, 1.0, 2.0][rng.random_range(0..5)];
            let laplace = Cost::pure(Fixed::from_f64_floor(eps_r).unwrap());
            let gaussian_share = rng.random_range(0.0..1.0);
            let (mut spent, mut a, mut m2) = (Spent::ZERO, 0u64, 0.0_f64);
            for _ in 0..5_000 {
                let (cost, is_laplace) = if rng.random_bool(gaussian_share) {
                    let sigma: f64 = rng.random_range(0.5..20.0);
                    let rho = Fixed::from_f64_ceil(1.0 / (2.0 * sigma * sigma)).unwrap();
                    (Cost::zcdp(rho), false)
                } else {
                    (laplace, true)
                };
                let Ok(after) = admit(&lim, &spent, &cost) else {
                    break;
                };
                spent = after;
                if is_laplace {
                    a += 1;
                } else {
                    m2 += 2.0 * cost.rho.to_f64();
                }
            }
            if a > 0 && m2 > 0.0 {
                mixed_histories += 1;
            }
            let exact = exact_delta(a, eps_r, m2, lim.epsilon.to_f64());
            let claimed = lim.tail_delta().to_f64();
            tightest = tightest.max(exact / claimed);
            assert!(
                exact <= claimed * (1.0 + 1e-6),
                "{rule:?} {lim:?}: {a} Laplace at {eps_r}, μ² = {m2}: δ {exact} > {claimed}"
            );
            checked += 1;
        }
        // Some admitted history comes close to its claim (the GDP member under the Gaussian
        // rule is exact for Gaussian measures), so an overclaim of 2× would be caught.
        eprintln!("{mixed_histories} mixed histories; largest δ / claim {tightest}");
        assert!(checked == 240 && mixed_histories > 60, "{mixed_histories}");
        assert!(tightest > 0.5, "{tightest}");
    }

    /// A history is composed by the rule of its first charge, whatever the limit says later;
    /// a history with nothing charged takes the limit's.
    #[test]
    fn a_history_keeps_the_rule_of_its_first_charge() {
        let mixed = limit("10", "0.000001");
        let gaussian = mixed.under(Accounting::Gaussian);
        let count = Cost::zcdp(Fixed::from_f64_ceil(1.0 / (2.0 * 5.39 * 5.39)).unwrap());
        assert_eq!(Spent::ZERO.fixed_under(&gaussian).accounting, None);
        let first = admit(&gaussian, &Spent::ZERO, &count).unwrap();
        assert_eq!(first.accounting, Some(Accounting::Gaussian));
        assert_eq!(in_force(&mixed, &first), gaussian);
        // Admitted under a limit that now says mixed: the Gaussian rule still decides.
        let mut spent = first;
        let mut admitted = 1;
        while let Ok(after) = admit(&mixed, &spent, &count) {
            assert_eq!(after.accounting, Some(Accounting::Gaussian));
            spent = after;
            admitted += 1;
        }
        assert_eq!(admitted, 95);
        assert_eq!(remaining(&mixed, &spent), remaining(&gaussian, &spent));
        assert_eq!(repeats(&mixed, &first, &count), 94);
        // And the other way round: a mixed history stays mixed (91 in all).
        let first = admit(&mixed, &Spent::ZERO, &count).unwrap();
        assert_eq!(repeats(&gaussian, &first, &count), 90);
        // Zero-cost admissions fix nothing.
        let nothing = admit(&gaussian, &Spent::ZERO, &Cost::ZERO).unwrap();
        assert_eq!(nothing.accounting, None);
    }

    /// A history with Gaussian charges made before the GDP member (drawn with the discrete
    /// Gaussian) has no GDP total: the other members go on admitting, fewer than the GDP member
    /// would, and the total stays unknown.
    #[test]
    fn histories_with_discrete_gaussian_charges_have_no_gdp_member() {
        let lim = limit("10", "0.000001");
        let rho = Fixed::from_f64_ceil(1.0 / (2.0 * 5.39 * 5.39)).unwrap();
        let mut spent = Spent {
            gdp: Fixed::MAX,
            ..Spent::ZERO
        };
        let mut admitted = 0;
        while let Ok(after) = admit(&lim, &spent, &Cost::zcdp(rho)) {
            spent = after;
            admitted += 1;
        }
        // The zCDP member alone at δ_z = 1.25·10⁻⁷.
        assert_eq!(admitted, 79, "{admitted}");
        assert_eq!(spent.gdp, Fixed::MAX);
        // Version-1 sums: with ρ no GDP total; pure ε alone is bounded by π·ε²/2.
        assert_eq!(
            Spent::from_sums(fx("1"), Fixed::ZERO, fx("0.1")).gdp,
            Fixed::MAX
        );
        assert_eq!(
            Spent::from_sums(fx("1"), Fixed::ZERO, Fixed::ZERO).gdp,
            Cost::pure(fx("1")).gaussian_dp()
        );
        assert_eq!(
            Cost::pure(fx("1")).gaussian_dp(),
            fx("1.570796460176991151")
        );
    }

    #[test]
    fn delta_of_partition_selection_is_a_hard_limit() {
        let lim = limit("10", "0.00001");
        // Half of δ is partition selection's; the other half is reserved for the conversion.
        assert_eq!(lim.selection_delta(), fx("0.000005"));
        assert!(admit(&lim, &Spent::ZERO, &Cost::approx(fx("1"), fx("0.00001"))).is_err());
        let spent = admit(&lim, &Spent::ZERO, &Cost::approx(fx("1"), fx("0.000005"))).unwrap();
        assert!(admit(
            &lim,
            &spent,
            &Cost::approx(Fixed::ZERO, Fixed::EPSILON_UNIT)
        )
        .is_err());
        // The reserved half still serves zCDP and pure ε.
        assert!(admit(&lim, &spent, &Cost::zcdp(fx("0.01"))).is_ok());
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
        let costs = [
            Cost::pure(fx("0.25")),
            Cost::approx(fx("0.1"), fx("0.000001")),
            Cost::zcdp(fx("0.05")),
        ];
        let spent = costs.iter().fold(Spent::ZERO, |s, c| s + *c);
        // By hand, at every order: Σ min(ε, αε²/2) + αρ, and its conversion at δ_Λ/|Λ|, where
        // δ_Λ is a quarter of δ_tail; the zCDP member's Σ ε²/2 + ρ converted at δ_z (another
        // quarter), and the GDP member's μ² = π·Σ ε²/2 + 2ρ at δ_G (half).
        assert_eq!(lim.gdp_delta(), fx("0.0000025"));
        assert_eq!(lim.zcdp_delta(), fx("0.00000125"));
        assert_eq!(lim.orders_delta(), fx("0.00000125"));
        let tail = lim.orders_delta().to_f64() / ORDER_COUNT as f64;
        let zcdp = 0.25 * 0.25 / 2.0 + 0.1 * 0.1 / 2.0 + 0.05;
        assert!((spent.zcdp.to_f64() - zcdp).abs() < 1e-12);
        let mut best = zcdp_to_epsilon_f64(zcdp, lim.zcdp_delta().to_f64());
        let mu_squared = 355.0 / 113.0 * (0.25 * 0.25 / 2.0 + 0.1 * 0.1 / 2.0) + 2.0 * 0.05;
        assert!((spent.gdp.to_f64() - mu_squared).abs() < 1e-12);
        best = best.min(gdp::epsilon_for(mu_squared.sqrt(), lim.gdp_delta().to_f64()).unwrap());
        for (i, divergence) in spent.renyi.iter().enumerate() {
            let a = order(i);
            let by_hand =
                (0.25f64).min(a * 0.25 * 0.25 / 2.0) + (0.1f64).min(a * 0.1 * 0.1 / 2.0) + a * 0.05;
            assert!((divergence.to_f64() - by_hand).abs() < 1e-12, "α={a}");
            best = best.min(by_hand + (-tail.ln() - a.ln()) / (a - 1.0) + (1.0 - 1.0 / a).ln());
        }
        let g = guarantee(&lim, &spent).unwrap();
        assert!(g.epsilon.to_f64() >= best - 1e-9 && g.epsilon.to_f64() <= best + 1e-8);
        assert_eq!(g.delta, fx("0.000001") + lim.tail_delta());
        assert!(within(&lim, &spent));
        assert_eq!(remaining(&lim, &spent).delta, fx("0.000004"));
        // A history over every order's budget is outside, with nothing remaining.
        let heavy = spent + Cost::zcdp(fx("2"));
        assert!(!within(&lim, &heavy));
        assert_eq!(remaining(&lim, &heavy), Remaining::default());
    }

    #[test]
    fn a_grant_raises_the_limit_and_admits_what_the_policy_limit_refused() {
        let policy = limit("1", "0.00001");
        let spent = admit(&policy, &Spent::ZERO, &Cost::pure(fx("1"))).unwrap();
        assert!(admit(&policy, &spent, &Cost::pure(fx("0.5"))).is_err());
        let raised = policy.granted(&limit("0.5", "0.000002"));
        assert_eq!(raised, limit("1.5", "0.000012"));
        let after = admit(&raised, &spent, &Cost::pure(fx("0.5"))).unwrap();
        assert_eq!(after.epsilon, fx("1.5"));
        assert_eq!(remaining(&raised, &after).epsilon, Fixed::ZERO);
        // Not one unit more than the sum.
        assert!(admit(&raised, &after, &Cost::pure(Fixed::EPSILON_UNIT)).is_err());
        // A zero grant changes nothing; a huge one saturates rather than wrapping.
        assert_eq!(policy.granted(&Limit::default()), policy);
        assert_eq!(
            policy.granted(&Limit::new(Fixed::MAX, Fixed::ZERO)).epsilon,
            Fixed::MAX
        );
    }

    #[test]
    fn histories_of_a_version_1_ledger_are_bounded_by_their_sums() {
        let lim = limit("10", "0.00001");
        // Ten charges of ε = 0.5 (sum 5) and ρ = 0.1: every order sees at least ε + αρ.
        let by_charges = (0..10).fold(Spent::ZERO, |s, _| {
            s + Cost::pure(fx("0.5")) + Cost::zcdp(fx("0.01"))
        });
        let by_sums = Spent::from_sums(fx("5"), Fixed::ZERO, fx("0.1"));
        for i in 0..ORDER_COUNT {
            assert!(by_sums.renyi[i] >= by_charges.renyi[i], "order {i}");
        }
        // As zCDP: ε_sum²/2 + ρ_sum = 12.6 bounds Σ ε_c²/2 + ρ = 1.35 (also for totals written
        // before the zCDP member, read the same way).
        assert_eq!(by_charges.zcdp, fx("1.35"));
        assert_eq!(by_sums.zcdp, fx("12.6"));
        assert!(
            guarantee(&lim, &by_sums).unwrap().epsilon
                >= guarantee(&lim, &by_charges).unwrap().epsilon
        );
    }

    #[test]
    fn refusal_names_request_and_remaining() {
        let lim = limit("10", "0.00001");
        let spent = Spent::ZERO + Cost::pure(fx("9.8"));
        let refusal = admit(&lim, &spent, &Cost::pure(fx("0.5"))).unwrap_err();
        // A query that spends no δ: the message says nothing of δ.
        assert_eq!(
            refusal.to_string(),
            "requested ε=0.5, remaining ε=0.2 of 10"
        );
        let error = Error::from(refusal);
        assert_eq!(error.sqlstate().code(), "53400");
        // ε = 0.2 is left: too small for this query, not exhausted.
        assert_eq!(
            error.to_string(),
            "privacy budget too small for this query: requested ε=0.5, remaining ε=0.2 of 10"
        );
        // One that spends δ (partition selection) is told what is left of it.
        let with_delta = Cost {
            delta: fx("0.0000001"),
            ..Cost::pure(fx("0.5"))
        };
        assert_eq!(
            admit(&lim, &spent, &with_delta).unwrap_err().to_string(),
            "requested ε=0.5 and δ=0.0000001, remaining ε=0.2 of 10, δ=0.000005 of 0.000005 (partition selection's half of δ=0.00001)"
        );
        let used_up = Spent::ZERO + Cost::pure(fx("10"));
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

    /// `repeats` counts exactly what admitting the same cost one charge after another admits,
    /// on random limits, histories and costs (fixed seed).
    #[test]
    fn repeats_count_what_one_by_one_admission_admits() {
        let mut rng = ChaCha20Rng::seed_from_u64(0x5e9ea7);
        let mut counted = 0;
        for run in 0..200 {
            let gaussian = run % 2 == 1;
            let lim =
                Limit::new(random_amount(&mut rng, 2), random_delta(&mut rng)).under(if gaussian {
                    Accounting::Gaussian
                } else {
                    Accounting::Mixed
                });
            let mut spent = Spent::ZERO;
            for _ in 0..rng.random_range(0..5) {
                if let Ok(after) = admit(&lim, &spent, &random_cost(&mut rng)) {
                    spent = after;
                }
            }
            let cost = random_cost(&mut rng);
            let k = repeats(&lim, &spent, &cost);
            if cost.is_zero() {
                assert_eq!(k, crate::limits::REPEATS_COUNTED_MAX);
                continue;
            }
            if k > 5_000 {
                continue;
            }
            let (mut one_by_one, mut s) = (0, spent);
            while let Ok(after) = admit(&lim, &s, &cost) {
                s = after;
                one_by_one += 1;
            }
            assert_eq!(k, one_by_one, "{lim:?} {cost:?}");
            counted += 1;
        }
        assert!(counted > 50, "only {counted} histories compared");
        // The figure of the module docs: 91 Gaussian counts at σ ≈ 5.39 in (10, 10⁻⁶), and 10
        // queries at ε = 1 in ε = 10.
        let rho = Fixed::from_f64_ceil(1.0 / (2.0 * 5.39 * 5.39)).unwrap();
        assert_eq!(
            repeats(&limit("10", "0.000001"), &Spent::ZERO, &Cost::zcdp(rho)),
            91
        );
        assert_eq!(
            repeats(&limit("10", "0.000001"), &Spent::ZERO, &Cost::pure(fx("1"))),
            10
        );
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
                            assert_eq!(after, (spent + *cost).fixed_under(&lim));
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
                if let Some(g) = guarantee(&lim, &spent) {
                    assert!(g.epsilon <= lim.epsilon && g.delta <= lim.delta, "{g:?}");
                } else {
                    assert_eq!(spent, Spent::ZERO);
                }
                if !spent.rho.is_zero() && !spent.epsilon.is_zero() && !spent.delta.is_zero() {
                    mixed += 1;
                }
                assert!(spent.delta <= lim.selection_delta());
                assert_eq!(
                    (admitted.epsilon, admitted.delta, admitted.rho),
                    (spent.epsilon, spent.delta, spent.rho)
                );
            }
        }
        // The generator exercises both outcomes and histories mixing all three kinds of cost.
        assert!(
            admissions > 5_000 && refusals > 5_000 && mixed > 100,
            "{admissions} {refusals} {mixed}"
        );
    }

    /// The ε a charge takes is the drop of the remaining ε: the pure ε itself under basic
    /// composition, and a positive amount for a Gaussian ρ (never "epsilon=0").
    #[test]
    fn epsilon_taken_is_the_drop_of_the_remaining_epsilon() {
        let f = |x: f64| Fixed::from_f64_ceil(x).unwrap();
        let lim = Limit::new(f(10.0), f(1e-5));
        let pure = Cost::pure(f(0.5));
        let spent = admit(&lim, &Spent::ZERO, &pure).unwrap();
        assert_eq!(epsilon_taken(&lim, &spent, &pure), f(0.5));
        let gaussian = Cost::zcdp(f(0.000253557949540744));
        let after = admit(&lim, &spent, &gaussian).unwrap();
        let taken = epsilon_taken(&lim, &after, &gaussian);
        assert!(taken > Fixed::ZERO, "{taken}");
        assert_eq!(
            remaining(&lim, &spent).epsilon.saturating_sub(taken),
            remaining(&lim, &after).epsilon
        );
    }

    #[test]
    fn remaining_epsilon_and_rho_are_affordable() {
        let mut rng = ChaCha20Rng::seed_from_u64(0x4e4a);
        let (mut checked, mut gaussian) = (0, 0);
        for _ in 0..2_000 {
            let lim = Limit::new(random_amount(&mut rng, 2), random_delta(&mut rng));
            let mut spent = Spent::ZERO + Cost::pure(random_amount(&mut rng, 3));
            if rng.random_bool(0.5) {
                spent = spent + Cost::zcdp(random_amount(&mut rng, 4));
            }
            let left = remaining(&lim, &spent);
            if !within(&lim, &spent) {
                assert_eq!(left, Remaining::default());
                continue;
            }
            checked += 1;
            // What is shown fits; a little more (10⁻⁶ of it) does not.
            let more = |x: Fixed| x + Fixed::from_f64_ceil(x.to_f64() * 1e-6 + 1e-12).unwrap();
            assert!(admit(&lim, &spent, &Cost::pure(left.epsilon)).is_ok());
            assert!(admit(&lim, &spent, &Cost::pure(more(left.epsilon))).is_err());
            if !left.rho.is_zero() {
                gaussian += 1;
                assert!(admit(&lim, &spent, &Cost::zcdp(left.rho)).is_ok());
                assert!(admit(&lim, &spent, &Cost::zcdp(more(left.rho))).is_err());
            }
        }
        assert!(checked > 300 && gaussian > 100, "{checked} {gaussian}");
    }

    /// An independent accountant: the rule of the module docs evaluated from the list of charges
    /// in plain f64 (no running totals, no rounding to the grid), compared with [`admit`] on
    /// random adaptive-looking histories. They may disagree only where the f64 slack is below
    /// 10⁻⁹, i.e. at the rounding margins; fixed seed, so a failure is a real disagreement.
    #[test]
    fn admissions_agree_with_an_independent_accountant() {
        struct Charge {
            parts: Vec<f64>,
            rho: f64,
            delta: f64,
        }
        // ε of ρ-zCDP at δ by CKS20 Proposition 12 over the continuum of orders, minimised by
        // golden-section search on ln(α − 1) (the bound is convex there in practice), not by
        // the root of its derivative as `zcdp_to_epsilon` does.
        fn zcdp_epsilon(rho: f64, delta: f64) -> f64 {
            let at = |t: f64| {
                let a = 1.0 + t.exp();
                a * rho + ((1.0 / delta).ln() - a.ln()) / (a - 1.0) + (1.0 - 1.0 / a).ln()
            };
            let (mut lo, mut hi) = (-20.0_f64, 20.0_f64);
            let g = (5.0_f64.sqrt() - 1.0) / 2.0;
            for _ in 0..300 {
                let (x1, x2) = (hi - g * (hi - lo), lo + g * (hi - lo));
                if at(x1) < at(x2) {
                    hi = x2;
                } else {
                    lo = x1;
                }
            }
            at((lo + hi) / 2.0)
        }
        // P(N(0,1) > x) by Simpson's rule over [x, x + 14] (no erfc, no continued fraction).
        fn tail_by_quadrature(x: f64) -> f64 {
            if x < 0.0 {
                return 1.0 - tail_by_quadrature(-x);
            }
            let steps = 6_000;
            let h = 14.0 / f64::from(steps);
            let f = |t: f64| (-t * t / 2.0).exp() / (2.0 * std::f64::consts::PI).sqrt();
            let mut sum = f(x) + f(x + 14.0);
            for i in 1..steps {
                let weight = if i % 2 == 1 { 4.0 } else { 2.0 };
                sum += weight * f(x + f64::from(i) * h);
            }
            sum * h / 3.0
        }
        // The smallest ε at which μ-GDP is (ε, δ)-DP, by bisection over the profile.
        fn gdp_epsilon(mu: f64, delta: f64) -> f64 {
            let profile = |e: f64| {
                tail_by_quadrature(e / mu - mu / 2.0)
                    - e.exp() * tail_by_quadrature(e / mu + mu / 2.0)
            };
            let (mut lo, mut hi) = (0.0_f64, 200.0_f64);
            if profile(0.0) <= delta {
                return 0.0;
            }
            for _ in 0..60 {
                let mid = (lo + hi) / 2.0;
                if profile(mid) <= delta {
                    hi = mid;
                } else {
                    lo = mid;
                }
            }
            hi
        }
        // Slack of the rule for a list of charges: > 0 within, < 0 outside.
        // Under the Gaussian rule the GDP member has all of δ_tail, the others nothing.
        fn slack(eps_limit: f64, delta_limit: f64, gaussian: bool, charges: &[Charge]) -> f64 {
            let tail = (delta_limit * 1e18 / 2.0).floor() / 1e18;
            let sel = delta_limit - tail;
            let quarter = (tail * 1e18 / 4.0).floor();
            let (gdp_delta, zcdp_delta) = if gaussian {
                (tail, 0.0)
            } else {
                (quarter * 2.0 / 1e18, quarter / 1e18)
            };
            let orders_delta = if gaussian {
                0.0
            } else {
                tail - gdp_delta - zcdp_delta
            };
            let delta: f64 = charges.iter().map(|c| c.delta).sum();
            if delta > sel * (1.0 + 1e-12) {
                return -1.0;
            }
            let rho: f64 = charges.iter().map(|c| c.rho).sum();
            let eps: f64 = charges.iter().flat_map(|c| c.parts.iter()).sum();
            let mut best = if rho == 0.0 {
                eps_limit - eps
            } else {
                f64::MIN
            };
            if zcdp_delta > 0.0 {
                let concentrated: f64 = charges
                    .iter()
                    .map(|c| c.rho + c.parts.iter().map(|x| x * x / 2.0).sum::<f64>())
                    .sum();
                best = best.max(eps_limit - zcdp_epsilon(concentrated, zcdp_delta));
            }
            if orders_delta > 0.0 {
                for &(p, q) in ORDERS.iter() {
                    let a = f64::from(p) / f64::from(q);
                    let divergence: f64 = charges
                        .iter()
                        .map(|c| {
                            let e: f64 = c.parts.iter().sum();
                            let r: f64 = c.parts.iter().map(|x| x * x / 2.0).sum();
                            e.min(a * r) + a * c.rho
                        })
                        .sum();
                    let n = ORDERS.len() as f64;
                    let convert =
                        ((n / orders_delta).ln() - a.ln()) / (a - 1.0) + (1.0 - 1.0 / a).ln();
                    best = best.max(eps_limit - convert - divergence);
                }
            }
            // Only where it can decide (the other members leave the history near or outside).
            if gdp_delta > 0.0 && best < 1e-6 {
                // The rule's cost: π·Σ ε_c²/2 with π as 355/113, plus 2ρ.
                let mu_squared: f64 = charges
                    .iter()
                    .map(|c| {
                        2.0 * c.rho
                            + 355.0 / 113.0 * c.parts.iter().map(|x| x * x / 2.0).sum::<f64>()
                    })
                    .sum();
                if mu_squared > 0.0 {
                    best = best.max(eps_limit - gdp_epsilon(mu_squared.sqrt(), gdp_delta));
                }
            }
            best
        }
        let mut rng = ChaCha20Rng::seed_from_u64(0x1dea);
        let (mut agree, mut margin) = (0, 0);
        for run in 0..200 {
            let gaussian = run % 2 == 1;
            let rule = if gaussian {
                Accounting::Gaussian
            } else {
                Accounting::Mixed
            };
            let lim = Limit::new(random_amount(&mut rng, 2), random_delta(&mut rng)).under(rule);
            let (eps_limit, delta_limit) = (lim.epsilon.to_f64(), lim.delta.to_f64());
            let mut spent = Spent::ZERO;
            let mut charges: Vec<Charge> = Vec::new();
            for _ in 0..rng.random_range(1..80) {
                let parts: Vec<Fixed> = (0..rng.random_range(0..4))
                    .map(|_| random_amount(&mut rng, 3))
                    .collect();
                let rho = if rng.random_bool(0.5) {
                    random_amount(&mut rng, 5)
                } else {
                    Fixed::ZERO
                };
                let delta = if rng.random_bool(0.2) {
                    random_delta(&mut rng)
                } else {
                    Fixed::ZERO
                };
                let cost = Cost {
                    rho,
                    delta,
                    ..Cost::pure_parts(&parts)
                };
                charges.push(Charge {
                    parts: parts.iter().map(|x| x.to_f64()).collect(),
                    rho: rho.to_f64(),
                    delta: delta.to_f64(),
                });
                let independent = slack(eps_limit, delta_limit, gaussian, &charges);
                match admit(&lim, &spent, &cost) {
                    Ok(after) => {
                        spent = after;
                        if independent < -1e-9 {
                            panic!("admitted at slack {independent}");
                        }
                        agree += 1;
                    }
                    Err(_) => {
                        charges.pop();
                        if independent > 1e-9 {
                            panic!("refused at slack {independent}");
                        }
                        if independent > -1e-9 {
                            margin += 1;
                        } else {
                            agree += 1;
                        }
                    }
                }
            }
        }
        assert!(agree > 5_000 && margin < 50, "{agree} {margin}");
    }
}
