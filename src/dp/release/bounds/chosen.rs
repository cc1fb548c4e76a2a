//! The caps a query ran with ([`ChosenBounds`]) and what the noisy histograms say the caps and
//! the chosen clamp removed ([`ClampEstimate`]): the NOTICE's and `_error95`'s estimates, the
//! lines EXPLAIN prints, and the bytes a stored answer keeps them in.
//!
//! # Invariants
//! - A [`ChosenBounds`] is made only by [`super::choose`] (its fields are private to the
//!   bounds module), so a plan's caps are lowered only to values chosen under a charge.
//! - Everything here is post-processing of noisy counts: no value in it is read from the data
//!   without noise.

use super::*;

/// The caps a query ran with and what the noisy histograms say they removed. Made only by
/// [`choose`], so a plan's caps can be lowered only to values chosen under a charge
/// ([`crate::dp::plan::Plan::with_chosen_bounds`]).
#[derive(Debug, Clone, PartialEq)]
pub struct ChosenBounds {
    pub(in crate::dp) rows_per_unit: u64,
    pub(in crate::dp) groups_per_unit: u64,
    /// A cap on a unit's rows over all its groups, when chosen.
    pub(in crate::dp) rows_total: Option<u64>,
    /// Units in the totals histogram, and those above the chosen total (noisy; 0 without one).
    pub(super) total_units: f64,
    pub(super) total_units_over: f64,
    pub(super) ceiling: u64,
    pub(super) groups_ceiling: u64,
    pub(super) groups_chosen: bool,
    pub(super) epsilon: f64,
    pub(super) pairs: f64,
    pub(super) pairs_over: f64,
    pub(super) units: f64,
    pub(super) units_over: f64,
    pub(super) rows: f64,
    pub(super) rows_removed: f64,
    /// The standard deviation of `rows_removed` from the noise of the buckets read raw
    /// ([`super::noisy::Removal::spread`]; those beyond the ceilings passed their floor).
    pub(super) rows_removed_spread: f64,
    /// The rows of `rows_removed` from counts beyond the ceilings up to their floor, which
    /// noise alone can make ([`super::noisy::Removal::floored`]): the low end leaves them out.
    pub(super) rows_removed_floored: f64,
    pub(super) beyond_reach: f64,
    pub(super) over_ceiling: f64,
    /// What clamping removed, when the choice estimated it.
    pub(super) clamp: Option<ClampEstimate>,
}

/// What the clamp's noisy histograms say clamping removed (post-processing of them).
#[derive(Debug, Clone, PartialEq)]
pub struct ClampEstimate {
    /// The plan's aggregate whose argument was estimated.
    pub(super) aggregate: usize,
    /// `argument in [lower, upper]`.
    pub(super) label: String,
    /// Units with values outside the bounds (noisy).
    pub(super) units_outside: f64,
    /// Total distance of the values outside the bounds from the bounds (noisy buckets at
    /// their midpoints).
    pub(super) excess: f64,
    /// Total of the units' absolute clamped sums (noisy buckets at their midpoints).
    pub(super) sums: f64,
    /// Noisy counts at or below this many units read as empty.
    pub(super) floor: f64,
    /// When the upper bound was chosen: it and the policy's ceiling (`label` names it). Then
    /// `units_outside` counts the units whose largest value is above it and `excess` their
    /// largest values' distance from it (a lower estimate: one value per unit).
    pub(super) chosen_upper: Option<(f64, f64)>,
}

impl ClampEstimate {
    /// The estimated share of the argument's sum (of absolute values) that clamping removed,
    /// in [0, 1].
    pub fn share(&self) -> f64 {
        let whole = self.excess + self.sums;
        if whole > 0.0 {
            (self.excess / whole).clamp(0.0, 1.0)
        } else {
            0.0
        }
    }

    /// The units with values outside the bounds (noisy; 0 when none passed the floor).
    pub fn units_outside(&self) -> f64 {
        self.units_outside
    }

    /// `argument in [lower, upper]`, in the analyst's terms.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// Whether some value outside the bounds passed the noise floor.
    pub fn detected(&self) -> bool {
        self.excess > 0.0
    }

    /// Noisy counts at or below this many units read as empty.
    pub fn floor(&self) -> f64 {
        self.floor
    }

    /// The upper bound chosen for the argument and the policy's ceiling, when chosen.
    pub fn chosen_upper(&self) -> Option<(f64, f64)> {
        self.chosen_upper
    }

    /// The NOTICE's clause.
    pub(super) fn notice(&self) -> String {
        if let Some((upper, ceiling)) = self.chosen_upper {
            if self.excess <= 0.0 {
                return format!(
                    "; {} clamped at an upper bound chosen from a DP histogram of each unit's largest value (the policy allows up to {ceiling}): no unit's largest value above {upper} was detected (buckets of {} units or fewer read as empty)",
                    self.label,
                    self.floor.ceil()
                );
            }
            return format!(
                "; {} clamped at an upper bound chosen from a DP histogram of each unit's largest value (the policy allows up to {ceiling}): about {} unit(s) have values above {upper}, and clamping removed at least about {} of the sum of its absolute values (one value per unit counted; buckets of {} units or fewer read as empty), so SUM and AVG of it are low by about that share, and their _error95 includes it",
                self.label,
                self.units_outside.round(),
                percent(self.share()),
                self.floor.ceil()
            );
        }
        if self.excess <= 0.0 {
            // Nothing seen is not nothing there: a few units far outside the bounds can carry
            // much of the sum in buckets below the noise.
            return format!(
                "; values outside the policy's bounds ({}): none detected, but the histogram reads buckets of {} units or fewer as empty, so a few units far outside the bounds may still make SUM and AVG of it low, which _error95 does not count",
                self.label,
                self.floor.ceil()
            );
        }
        format!(
            "; values outside the policy's bounds ({}): about {} unit(s) have some, and clamping removed about {} of the sum of its absolute values (buckets of {} units or fewer read as empty), so SUM and AVG of it are low by about that share, and their _error95 includes it",
            self.label,
            self.units_outside.round(),
            percent(self.share()),
            self.floor.ceil()
        )
    }
}

impl ChosenBounds {
    /// The cap on rows per unit and group the answer used.
    pub fn rows_per_unit(&self) -> u64 {
        self.rows_per_unit
    }

    /// The cap on groups per unit the answer used.
    pub fn groups_per_unit(&self) -> u64 {
        self.groups_per_unit
    }

    /// The cap on a unit's rows over all its groups the answer used, when it chose one.
    pub fn rows_total(&self) -> Option<u64> {
        self.rows_total
    }

    /// The plan's aggregate whose argument's upper bound was chosen, and the bound.
    pub fn clamp_upper(&self) -> Option<(usize, f64)> {
        let c = self.clamp.as_ref()?;
        c.chosen_upper.map(|(upper, _)| (c.aggregate, upper))
    }

    /// Whether the cap on groups was chosen too (else it is the policy's).
    pub fn groups_chosen(&self) -> bool {
        self.groups_chosen
    }

    /// The estimated share of the rows (after WHERE) that the caps removed, in [0, 1]; a lower
    /// estimate when units exceed the histograms' reach.
    pub fn rows_removed_share(&self) -> f64 {
        if self.rows <= 0.0 {
            0.0
        } else {
            (self.rows_removed / self.rows).clamp(0.0, 1.0)
        }
    }

    /// The share of the rows the caps removed at the lower end of its one-sided 95 % interval
    /// (`rows_removed − floored − 1.645·σ`: the counts beyond the ceilings only above their
    /// floor), in [0, 1]: what `pgdp.max_bias` tests, so that it refuses only where even the
    /// least the histograms allow is above the share.
    pub fn rows_removed_share_low(&self) -> f64 {
        if self.rows <= 0.0 {
            0.0
        } else {
            let low = self.rows_removed
                - self.rows_removed_floored
                - crate::limits::BOUNDS_REMOVAL_Z * self.rows_removed_spread;
            (low / self.rows).clamp(0.0, 1.0)
        }
    }

    /// The estimated share of (unit, group) pairs with more rows than the cap, in [0, 1].
    pub fn pairs_over_share(&self) -> f64 {
        if self.pairs <= 0.0 {
            0.0
        } else {
            (self.pairs_over / self.pairs).clamp(0.0, 1.0)
        }
    }

    /// The estimated share of units with more groups than the cap, in [0, 1] (0 when the cap
    /// on groups was not chosen: no histogram of groups was released).
    pub fn units_over_share(&self) -> f64 {
        if self.units <= 0.0 {
            0.0
        } else {
            (self.units_over / self.units).clamp(0.0, 1.0)
        }
    }

    /// What clamping removed, when the choice estimated it.
    pub fn clamp(&self) -> Option<&ClampEstimate> {
        self.clamp.as_ref()
    }

    /// The clamped argument whose bias the NOTICE states (`argument in [lower, upper]`).
    pub fn clamp_label(&self) -> Option<&str> {
        self.clamp.as_ref().map(|c| c.label.as_str())
    }

    /// The NOTICE: the caps, the policy's, the ε share, and the estimated bias.
    pub fn notice(&self) -> String {
        let mut caveats = String::new();
        if self.over_ceiling > 0.0 && self.pairs > 0.0 && self.rows_per_unit == self.ceiling {
            caveats.push_str(&format!(
                "; about {} of the pairs have more rows than the policy's ceiling allows",
                percent(self.over_ceiling / self.pairs)
            ));
        }
        if self.beyond_reach > 0.0 {
            caveats.push_str(&format!(
                "; some units have more than {} times the policy's caps, counted at that many (the estimate is low)",
                limits::BOUNDS_HISTOGRAM_REACH
            ));
        }
        let (groups, units) = if self.rows_total.is_some() {
            (
                format!(
                    " in all, at most {} in each of at most {} group(s) (the policy's ceilings: {} row(s) in {} group(s))",
                    self.rows_per_unit, self.groups_per_unit, self.ceiling, self.groups_ceiling
                ),
                format!(
                    ", {} of the units had more rows in all",
                    percent(if self.total_units > 0.0 {
                        (self.total_units_over / self.total_units).clamp(0.0, 1.0)
                    } else {
                        0.0
                    })
                ),
            )
        } else if self.groups_chosen {
            (
                format!(
                    " in each of at most {} group(s) (the policy's ceilings: {} row(s) in {} group(s))",
                    self.groups_per_unit, self.ceiling, self.groups_ceiling
                ),
                format!(
                    ", {} of the units had more groups",
                    percent(self.units_over_share())
                ),
            )
        } else {
            (
                format!(" in each group (the policy's ceiling: {})", self.ceiling),
                String::new(),
            )
        };
        let clamp = self
            .clamp
            .as_ref()
            .map_or(String::new(), ClampEstimate::notice);
        format!(
            "pgdp: contribution bound chosen for this query: at most {} row(s) per unit{groups}, from DP histograms costing epsilon {} of the charge; estimated bias: the caps removed about {} of the rows ({} of the (unit, group) pairs had more rows{units}){caveats}; COUNT and SUM are low by about that share, and _error95 includes it{clamp}",
            self.rows_total.unwrap_or(self.rows_per_unit),
            fmt_epsilon(self.epsilon),
            percent(self.rows_removed_share()),
            percent(self.pairs_over_share()),
        )
    }
}

/// The prefix of a stored release at chosen caps ([`ChosenBounds::stored_with`]).
pub(super) const MAGIC_CHOSEN: &[u8] = b"pgdp-chosen-bounds-5";
/// The payload before the floored counts of the removal were stored (read back with none).
const MAGIC_CHOSEN_4: &[u8] = b"pgdp-chosen-bounds-4";
/// The payload before the spread of the removal was stored (read back with a spread of 0).
const MAGIC_CHOSEN_3: &[u8] = b"pgdp-chosen-bounds-3";

impl ChosenBounds {
    /// The ledger's payload of a release at these caps: the caps and the noisy histograms'
    /// estimates (released values), then `measures`, the payload of the noisy measures drawn
    /// at them. A later query with the same measures key reads both back
    /// ([`ChosenBounds::stored`]) and answers from them: post-processing.
    pub fn stored_with(&self, measures: &[u8]) -> Vec<u8> {
        let mut out = Vec::from(MAGIC_CHOSEN);
        for n in [
            self.rows_per_unit,
            self.groups_per_unit,
            self.ceiling,
            self.groups_ceiling,
            u64::from(self.groups_chosen),
            self.rows_total.unwrap_or(0),
        ] {
            out.extend_from_slice(&n.to_be_bytes());
        }
        for x in [
            self.total_units,
            self.total_units_over,
            self.epsilon,
            self.pairs,
            self.pairs_over,
            self.units,
            self.units_over,
            self.rows,
            self.rows_removed,
            self.beyond_reach,
            self.over_ceiling,
            self.rows_removed_spread,
            self.rows_removed_floored,
        ] {
            out.extend_from_slice(&x.to_bits().to_be_bytes());
        }
        match &self.clamp {
            None => out.extend_from_slice(&0u64.to_be_bytes()),
            Some(c) => {
                let tag: u64 = if c.chosen_upper.is_some() { 2 } else { 1 };
                out.extend_from_slice(&tag.to_be_bytes());
                out.extend_from_slice(&(c.aggregate as u64).to_be_bytes());
                for x in [c.units_outside, c.excess, c.sums, c.floor] {
                    out.extend_from_slice(&x.to_bits().to_be_bytes());
                }
                if let Some((upper, _)) = c.chosen_upper {
                    out.extend_from_slice(&upper.to_bits().to_be_bytes());
                }
            }
        }
        out.extend_from_slice(measures);
        out
    }

    /// The caps and the measures' payload of a payload [`ChosenBounds::stored_with`] wrote;
    /// `None` for any other payload (measures stored without a choice, or damaged), or for
    /// caps the ceilings of `choice` do not allow, so that a stored payload can never raise a
    /// cap above what the policy allows.
    pub fn stored<'a>(
        payload: &'a [u8],
        choice: &BoundsChoice,
    ) -> Option<(ChosenBounds, &'a [u8])> {
        let (mut b, floats) = [
            (MAGIC_CHOSEN, 13),
            (MAGIC_CHOSEN_4, 12),
            (MAGIC_CHOSEN_3, 11),
        ]
        .into_iter()
        .find_map(|(magic, floats)| Some((payload.strip_prefix(magic)?, floats)))?;
        let mut next = || -> Option<u64> {
            let (head, rest) = b.split_at_checked(8)?;
            b = rest;
            Some(u64::from_be_bytes(head.try_into().ok()?))
        };
        let mut n = [0u64; 6];
        for v in &mut n {
            *v = next()?;
        }
        let mut x = [0f64; 13];
        for v in x.iter_mut().take(floats) {
            *v = f64::from_bits(next()?);
            if !v.is_finite() {
                return None;
            }
        }
        // The clamp's estimate, when the choice made one (its label is the choice's).
        let clamp = match (next()?, &choice.clamp) {
            (0, None) => None,
            (tag @ (1 | 2), Some(c)) if (tag == 2) == c.upper.is_some() => {
                let aggregate = next()?;
                let mut y = [0f64; 4];
                for v in &mut y {
                    *v = f64::from_bits(next()?);
                    if !v.is_finite() {
                        return None;
                    }
                }
                if aggregate != c.edges.aggregate as u64 {
                    return None;
                }
                // A chosen upper bound only among the choice's candidates.
                let chosen_upper = match &c.upper {
                    None => None,
                    Some(u) => {
                        let upper = f64::from_bits(next()?);
                        if !u.candidates.contains(&upper) {
                            return None;
                        }
                        Some((upper, u.ceiling))
                    }
                };
                let [units_outside, excess, sums, floor] = y;
                Some(ClampEstimate {
                    aggregate: c.edges.aggregate,
                    label: match (&c.upper, chosen_upper) {
                        (Some(u), Some((upper, _))) => c.label_at(u.lower, upper),
                        _ => c.label.clone(),
                    },
                    units_outside,
                    excess,
                    sums,
                    floor,
                    chosen_upper,
                })
            }
            _ => return None,
        };
        let [rows_per_unit, groups_per_unit, ceiling, groups_ceiling, groups_chosen, total] = n;
        let [total_units, total_units_over, epsilon, pairs, pairs_over, units, units_over, rows, rows_removed, beyond_reach, over_ceiling, rows_removed_spread, rows_removed_floored] =
            x;
        // A total only among the choice's candidates (the last, rows × groups, is none).
        let rows_total = (total != 0).then_some(total);
        let total_allowed = rows_total.is_none_or(|t| {
            choice
                .totals
                .split_last()
                .is_some_and(|(_, below)| below.contains(&t))
        });
        let allowed = ceiling == choice.ceiling
            && groups_ceiling == choice.groups
            && choice.candidates.contains(&rows_per_unit)
            && choice.group_candidates.contains(&groups_per_unit)
            && groups_chosen <= 1
            && total_allowed;
        allowed.then_some((
            ChosenBounds {
                rows_per_unit,
                groups_per_unit,
                rows_total,
                total_units,
                total_units_over,
                ceiling,
                groups_ceiling,
                groups_chosen: groups_chosen == 1,
                epsilon,
                pairs,
                pairs_over,
                units,
                units_over,
                rows,
                rows_removed,
                rows_removed_spread,
                rows_removed_floored,
                beyond_reach,
                over_ceiling,
                clamp,
            },
            b,
        ))
    }
}

/// A share as the NOTICEs print it: `0%`, `<0.1%`, `2.5%`, `49%`.
pub fn percent(share: f64) -> String {
    let p = share * 100.0;
    if p == 0.0 {
        "0%".into()
    } else if p < 0.1 {
        "<0.1%".into()
    } else if p < 10.0 {
        format!("{p:.1}%")
    } else {
        format!("{p:.0}%")
    }
}
