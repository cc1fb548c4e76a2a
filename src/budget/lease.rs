//! Budget leases, the arithmetic: a pgdp process reserves the totals of k charges of a cost
//! durably in one ledger commit (a *slice*), then charges queries against the slice in memory.
//! Pure, no I/O; the ledger side (reserving, returning, the audit rows) is
//! `budget::ledger::lease`.
//!
//! Invariants:
//! - A slice is reserved only by the admission rule itself: its reservation `k·cost` is added to
//!   the analyst's (and the dataset's) durable totals under the row locks, and only when the
//!   totals with it are within the limits ([`slice_size`] is [`repeats`], so `k ≥ 1` means the
//!   rule admits all k).
//! - [`Slice::take`] charges a cost only if the slice's use after it is at most its reservation
//!   in every coordinate ([`Spent::covers`]). Since the rule is monotone in every coordinate,
//!   the true history (the other durable totals plus the use of every slice) is then within the
//!   limit whenever the durable totals are: every query charged under a slice would have been
//!   admitted by a charge of its own. docs/privacy.md §8 has the proof, crash included.
//! - Slices shrink near exhaustion: a slice holds at most `1/`[`SLICE_SHARE_DIVISOR`] of the
//!   queries like this one that still fit, and a single query when fewer than
//!   2·[`SLICE_SHARE_DIVISOR`] fit, so the last queries of a budget are reserved one at a time
//!   and the last unit of budget is charged exactly.
//!
//! [`SLICE_SHARE_DIVISOR`]: crate::limits::SLICE_SHARE_DIVISOR

use super::accountant::{repeats, Cost, Limit, Spent};

/// A reservation and what has been charged under it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slice {
    /// The totals reserved durably (k charges of the cost that opened the slice).
    pub reserved: Spent,
    /// The totals of the charges made under it so far.
    pub used: Spent,
    /// How many charges were made under it.
    pub charges: u64,
}

impl Slice {
    /// A slice of `k` charges of `cost` (`None` on overflow).
    pub fn of(cost: &Cost, k: u64) -> Option<Slice> {
        Some(Slice {
            reserved: Spent::ZERO.after_repeats(cost, k)?,
            used: Spent::ZERO,
            charges: 0,
        })
    }

    /// Charges `cost` if the slice still covers it; false (and nothing changed) otherwise.
    pub fn take(&mut self, cost: &Cost) -> bool {
        match self.used.checked_add(cost) {
            Some(used) if self.reserved.covers(&used) => {
                self.used = used;
                self.charges += 1;
                true
            }
            _ => false,
        }
    }

    /// Whether [`Slice::take`] would charge `cost` (nothing changes).
    pub fn covers(&self, cost: &Cost) -> bool {
        self.used
            .checked_add(cost)
            .is_some_and(|used| self.reserved.covers(&used))
    }

    /// What was reserved and not used: returned to the totals when the slice closes, counted as
    /// spent when the process dies first.
    pub fn unused(&self) -> Spent {
        // `take` keeps `used` covered by `reserved`, so the difference exists.
        self.reserved
            .checked_sub_spent(&self.used)
            .unwrap_or(Spent::ZERO)
    }
}

/// How many charges of `cost` the next slice reserves, given the totals and limits it is
/// reserved against (the analyst's, and the dataset's when it has a limit): 0 when not even one
/// fits (the query is refused), else at most `slice_max`, at most a
/// 1/[`crate::limits::SLICE_SHARE_DIVISOR`] share of the charges that still fit, and 1 near
/// exhaustion.
pub fn slice_size(
    limit: &Limit,
    spent: &Spent,
    dataset: Option<(&Limit, &Spent)>,
    cost: &Cost,
    slice_max: u64,
) -> u64 {
    let mut fit = repeats(limit, spent, cost);
    if let Some((dataset_limit, dataset_spent)) = dataset {
        fit = fit.min(repeats(dataset_limit, dataset_spent, cost));
    }
    if fit == 0 {
        return 0;
    }
    (fit / crate::limits::SLICE_SHARE_DIVISOR).clamp(1, slice_max.max(1))
}

/// Totals as vectors, for budget leases (`budget::ledger`): a lease reserves the totals of k
/// charges of a cost, and the charges made under it must stay within that reservation in every
/// coordinate. The rule of the module docs is monotone in every coordinate (each condition is
/// an upper bound on a total), so a history whose totals are at most, coordinate by coordinate,
/// those of a history within the limit is itself within the limit. Sums and differences keep
/// the rule of `self` ([`Spent::accounting`]): a reservation has none of its own.
impl Spent {
    /// Exact coordinate-wise sum, or `None` on overflow.
    pub fn checked_add_spent(&self, other: &Spent) -> Option<Spent> {
        let mut renyi = self.renyi;
        for (slot, add) in renyi.iter_mut().zip(other.renyi) {
            *slot = slot.checked_add(add)?;
        }
        Some(Spent {
            epsilon: self.epsilon.checked_add(other.epsilon)?,
            delta: self.delta.checked_add(other.delta)?,
            rho: self.rho.checked_add(other.rho)?,
            renyi,
            zcdp: self.zcdp.checked_add(other.zcdp)?,
            gdp: self.gdp.saturating_add(other.gdp),
            accounting: self.accounting,
        })
    }

    /// Exact coordinate-wise difference, or `None` where `other` exceeds `self` in any
    /// coordinate.
    pub fn checked_sub_spent(&self, other: &Spent) -> Option<Spent> {
        let mut renyi = self.renyi;
        for (slot, sub) in renyi.iter_mut().zip(other.renyi) {
            *slot = slot.checked_sub(sub)?;
        }
        Some(Spent {
            epsilon: self.epsilon.checked_sub(other.epsilon)?,
            delta: self.delta.checked_sub(other.delta)?,
            rho: self.rho.checked_sub(other.rho)?,
            renyi,
            zcdp: self.zcdp.checked_sub(other.zcdp)?,
            gdp: self.gdp.checked_sub(other.gdp)?,
            accounting: self.accounting,
        })
    }

    /// Whether every coordinate of `other` is at most this one's.
    pub fn covers(&self, other: &Spent) -> bool {
        self.epsilon >= other.epsilon
            && self.delta >= other.delta
            && self.rho >= other.rho
            && self.zcdp >= other.zcdp
            && self.gdp >= other.gdp
            && self.renyi.iter().zip(other.renyi).all(|(a, b)| *a >= b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::accountant::{admit, within};
    use crate::budget::Fixed;
    use rand::rngs::ChaCha20Rng;
    use rand::{RngExt, SeedableRng};

    fn fixed(text: &str) -> Fixed {
        Fixed::from_decimal_str(text).expect("a valid amount")
    }

    /// Costs of every kind the session charges: Laplace (pure, one or several measures),
    /// Gaussian (ρ), partition selection (ε, δ) with a Gaussian measure.
    fn cost_of(kind: u32, scale: u32) -> Cost {
        let e = Fixed::from_f64(f64::from(scale) / 10.0).expect("finite");
        match kind {
            0 => Cost::pure(e),
            1 => Cost::pure_split(e, 3),
            2 => Cost::zcdp(e.mul_ratio_ceil(1, 20)),
            _ => Cost::approx(e, fixed("0.0000001")) + Cost::zcdp(e.mul_ratio_ceil(1, 40)),
        }
    }

    #[test]
    fn a_slice_takes_what_it_covers_and_nothing_else() {
        let one = Cost::pure(fixed("1"));
        let mut slice = Slice::of(&one, 3).expect("no overflow");
        assert!(slice.take(&one));
        assert!(slice.take(&Cost::pure(fixed("0.5"))));
        assert!(slice.take(&one));
        assert_eq!(slice.charges, 3);
        // 2.5 of 3 used: a whole query no longer fits, half of one does.
        assert!(!slice.take(&one));
        assert!(slice.take(&Cost::pure(fixed("0.5"))));
        assert!(!slice.take(&Cost::pure(fixed("0.000000000000000001"))));
        // ε is used up; two halves cost less than a whole at the finite orders (α·ε²/2).
        assert_eq!(slice.unused().epsilon, Fixed::ZERO);
        assert!(slice.unused().renyi.iter().any(|r| !r.is_zero()));
        // A Gaussian query does not fit a slice reserved for pure ε (ρ = 0 there).
        let mut pure = Slice::of(&one, 10).expect("no overflow");
        assert!(!pure.take(&Cost::zcdp(fixed("0.01"))));
        assert_eq!(pure.unused(), pure.reserved);
    }

    #[test]
    fn slices_shrink_to_one_query_near_exhaustion() {
        let limit = Limit::new(fixed("10"), Fixed::ZERO);
        let one = Cost::pure(fixed("1"));
        let after = |k: u64| Spent::ZERO.after_repeats(&one, k).expect("no overflow");
        assert_eq!(slice_size(&limit, &Spent::ZERO, None, &one, 64), 2);
        assert_eq!(slice_size(&limit, &after(3), None, &one, 64), 1);
        assert_eq!(slice_size(&limit, &after(9), None, &one, 64), 1);
        assert_eq!(slice_size(&limit, &after(10), None, &one, 64), 0);
        let big = Limit::new(fixed("100000"), Fixed::ZERO);
        assert_eq!(slice_size(&big, &Spent::ZERO, None, &one, 64), 64);
        // The dataset's limit binds too.
        let dataset = Limit::new(fixed("2"), Fixed::ZERO);
        assert_eq!(
            slice_size(&big, &Spent::ZERO, Some((&dataset, &after(2))), &one, 64),
            0
        );
    }

    /// Leases never admit more than one-by-one admission would: random interleavings of slice
    /// reservations, returns and in-memory charges by several holders, checked after every step
    /// against the accountant's own rule applied to the true history. Deterministic (fixed
    /// seed), so it cannot fail by chance.
    #[test]
    fn charges_under_slices_keep_the_true_history_within_the_limit() {
        let mut rng = ChaCha20Rng::seed_from_u64(0x1ea5e);
        for round in 0..60 {
            let limit = Limit::new(
                Fixed::from_f64(rng.random_range(1.0..20.0)).expect("finite"),
                fixed("0.000001"),
            );
            // Durable totals (with reservations) and the true history (with uses only).
            let mut durable = Spent::ZERO;
            let mut truth = Spent::ZERO;
            let mut holders: Vec<Option<Slice>> = vec![None; 3];
            let mut answered = 0u32;
            for _ in 0..300 {
                let who = rng.random_range(0..holders.len());
                let cost = cost_of(rng.random_range(0..4), rng.random_range(1..12));
                let fits = holders[who].as_mut().is_some_and(|s| s.take(&cost));
                if fits {
                    truth = truth.checked_add(&cost).expect("no overflow");
                    answered += 1;
                } else {
                    // Return the old slice's unused part, then reserve a new one.
                    if let Some(old) = holders[who].take() {
                        durable = durable
                            .checked_sub_spent(&old.unused())
                            .expect("a reservation is part of the totals");
                    }
                    let k = slice_size(&limit, &durable, None, &cost, 16);
                    if k > 0 {
                        let mut slice = Slice::of(&cost, k).expect("no overflow");
                        durable = durable
                            .checked_add_spent(&slice.reserved)
                            .expect("no overflow");
                        assert!(
                            within(&limit, &durable),
                            "round {round}: slice beyond limit"
                        );
                        assert!(slice.take(&cost));
                        truth = truth.checked_add(&cost).expect("no overflow");
                        answered += 1;
                        holders[who] = Some(slice);
                    } else {
                        // Refused: one-by-one admission refuses it too, given the others'
                        // reservations.
                        assert!(admit(&limit, &durable, &cost).is_err());
                    }
                }
                assert!(
                    within(&limit, &truth),
                    "round {round}: history beyond limit"
                );
                assert!(
                    durable.covers(&truth),
                    "round {round}: use beyond the totals"
                );
            }
            assert!(answered > 0);
            // Closing every slice leaves the durable totals equal to the true history.
            for slice in holders.iter().flatten() {
                durable = durable.checked_sub_spent(&slice.unused()).expect("covered");
            }
            assert_eq!(durable, truth, "round {round}");
        }
    }
}
