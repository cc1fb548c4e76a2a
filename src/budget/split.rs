//! How the conversions' δ (δ_tail, half of a limit's δ) is shared by the members of the
//! accountant's rule, per [`Accounting`].
//!
//! Pure arithmetic. Invariant: the shares of a split add up to δ_tail exactly (the orders take
//! what the others leave), and a split depends only on δ_tail and the rule, both fixed for a
//! history before its first charge, so the union bound of the accountant's theorem holds.

use super::fixed::Fixed;
use crate::policy::Accounting;

/// The shares of δ_tail, in quarters, of the GDP member and the zCDP member under
/// [`Accounting::Mixed`]; the Rényi orders take the rest. Half for the GDP member, which admits
/// Gaussian histories furthest (exact composition), a quarter for the zCDP member (histories
/// of many small pure components with Gaussian ones, and histories with charges drawn from the
/// discrete Gaussian before the GDP member existed, which it cannot count), a quarter for the
/// orders (mixes of large pure components with Gaussian ones). Under
/// [`Accounting::Gaussian`] the GDP member has all of δ_tail.
pub const TAIL_SHARES: (u32, u32) = (2, 1);

/// δ_tail split over the members that convert with it.
pub(super) struct TailSplit {
    pub(super) gdp: Fixed,
    pub(super) zcdp: Fixed,
    pub(super) orders: Fixed,
}

/// δ_tail split under `accounting`. Mixed: δ_G = ⌊δ_tail/4⌋·2, δ_z = ⌊δ_tail/4⌋ on the grid,
/// and δ_Λ the rest. Gaussian: δ_G = δ_tail, nothing for the others (they admit nothing).
pub(super) fn split_tail(tail: Fixed, accounting: Accounting) -> TailSplit {
    match accounting {
        Accounting::Mixed => {
            let (gdp, zcdp) = TAIL_SHARES;
            let quarter = tail.units() / 4;
            let gdp = Fixed::from_units(quarter * u128::from(gdp));
            let zcdp = Fixed::from_units(quarter * u128::from(zcdp));
            TailSplit {
                gdp,
                zcdp,
                orders: tail.saturating_sub(gdp).saturating_sub(zcdp),
            }
        }
        Accounting::Gaussian => TailSplit {
            gdp: tail,
            zcdp: Fixed::ZERO,
            orders: Fixed::ZERO,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_add_up_to_the_tail() {
        for units in [0u128, 1, 3, 4, 7, 500_000_000_000, 123_456_789_012_345] {
            let tail = Fixed::from_units(units);
            for accounting in [Accounting::Mixed, Accounting::Gaussian] {
                let s = split_tail(tail, accounting);
                assert_eq!(s.gdp.units() + s.zcdp.units() + s.orders.units(), units);
            }
            let mixed = split_tail(tail, Accounting::Mixed);
            assert!(mixed.gdp.units() >= 2 * (units / 4) && mixed.zcdp.units() == units / 4);
            assert_eq!(split_tail(tail, Accounting::Gaussian).gdp.units(), units);
        }
    }
}
