//! The NOTICE lines of an answer: what the charge cost and what is left of the budget (in the
//! accountant's words), and the notes on clamps, chosen caps and truncation that go with it.
//!
//! Invariant: every text here is a function of the charge, the budget, the plan, its mechanisms
//! and the released rows: nothing the release did not release.

use crate::dp::plan::Plan;
use crate::dp::release::{self, Released};
use crate::dp::rewrite::Rewrite;

use super::Notice;
/// The NOTICE of a charged answer: what it cost and what is left, in the words of
/// `budget::accountant`. A pure-ε charge reads `charged epsilon=…, delta=…`; a charge with
/// zCDP ρ (Gaussian noise) states ρ, rounded up, and what it took in the analyst's currency,
/// `about epsilon=… of the budget` ([`crate::budget::epsilon_taken`]), never `epsilon=0`.
pub(super) fn charge_notice(
    cost: &crate::budget::Cost,
    balance: &crate::budget::Balance,
    window: Option<crate::budget::Window>,
) -> String {
    let charged = if cost.rho.is_zero() {
        format!("epsilon={}, delta={}", cost.epsilon, cost.delta)
    } else {
        let rho = cost.rho.ceil_significant(RHO_DIGITS);
        let pure = if cost.epsilon.is_zero() {
            String::new()
        } else {
            format!("epsilon={} and ", cost.epsilon)
        };
        let taken = crate::budget::epsilon_taken(&balance.limit, &balance.spent, cost)
            .ceil_significant(TAKEN_DIGITS);
        format!(
            "{pure}rho={rho} (zCDP), delta={}: about epsilon={taken} of the budget",
            cost.delta
        )
    };
    format!(
        "pgdp: charged {charged}; {}; {}",
        remaining_text(balance, window, !cost.rho.is_zero()),
        repeats_text(&balance.limit, &balance.spent, cost)
    )
}

/// Significant digits of a charged ρ in NOTICEs, rounded up (never less than was charged).
pub(super) const RHO_DIGITS: u32 = 6;

/// Significant digits of the ε a ρ charge took, rounded up.
const TAKEN_DIGITS: u32 = 3;

/// The NOTICEs of an answer: `first` (what it cost, or where it came from), then what a
/// question of existence's answer means ([`release::detection_note`]), whether a
/// statistic was capped and whether groups were cut at the release limit.
///
/// With a cap chosen for the query, its NOTICE ([`release::bounds::ChosenBounds::notice`]: the
/// cap, and the rows it is estimated to have removed) takes the place of the policy's, with the
/// policy's cap on groups per unit when it can bind.
pub(super) fn answer_notices(
    first: String,
    (plan, rewrite, mechanisms): (&Plan, &Rewrite, &release::Mechanisms),
    (released, measures): (&Released, &release::NoisyMeasures),
    chosen: Option<&release::bounds::ChosenBounds>,
) -> Vec<Notice> {
    let mut notices = vec![Notice::new(first)];
    if let Some(note) = release::detection_note(plan, rewrite, mechanisms, Some(measures)) {
        notices.push(Notice::new(note));
    }
    if let Some(chosen) = chosen {
        let groups = if !chosen.groups_chosen()
            && plan.max_groups_per_unit() > 1
            && !plan.keys().is_empty()
        {
            format!(
                "; each unit also counts in at most {} group(s) (the policy's cap), which that estimate does not cover",
                plan.max_groups_per_unit()
            )
        } else {
            String::new()
        };
        let mut clamped = release::clamped_arguments(plan);
        // The argument whose clamping was estimated has its own clause in the NOTICE.
        clamped.retain(|c| Some(c.as_str()) != chosen.clamp_label());
        let clamped = if clamped.is_empty() {
            String::new()
        } else {
            format!(
                "; values are still clamped into the policy's bounds ({}), a bias neither that estimate nor _error95 counts",
                clamped.join(", ")
            )
        };
        notices.push(Notice::new(format!("{}{groups}{clamped}", chosen.notice())));
    } else if let Some(note) = release::capped_statistic(plan) {
        notices.push(Notice::new(format!(
            "pgdp: {note} (EXPLAIN shows the caps, the bounds and the SQL)"
        )));
    }
    if released.truncated() {
        notices.push(Notice::new(format!(
            "pgdp: only the first {} groups were returned",
            crate::limits::GROUPS_RELEASED_MAX
        )));
    }
    notices
}

/// Significant digits of the remaining amounts in NOTICEs, rounded down (never more than is
/// left).
const REMAINING_DIGITS: u32 = 6;

/// "remaining epsilon=… of …, delta=… of …", with ρ when `with_rho` or ρ was spent; for a
/// renewing budget "remaining this day (until 2026-11-25 00:00 UTC): epsilon=…".
pub(super) fn remaining_text(
    balance: &crate::budget::Balance,
    window: Option<crate::budget::Window>,
    with_rho: bool,
) -> String {
    let left_of = |x: crate::budget::Fixed| x.floor_significant(REMAINING_DIGITS);
    let window = window.map_or(String::new(), |w| format!("{w}: "));
    let mut left = format!(
        "remaining {window}epsilon={} of {}, delta={} of {}",
        left_of(balance.remaining.epsilon),
        balance.limit.epsilon,
        left_of(balance.remaining.delta),
        balance.limit.delta
    );
    if with_rho || !balance.spent.rho.is_zero() {
        left.push_str(&format!(", rho={} (zCDP)", left_of(balance.remaining.rho)));
    }
    left
}

/// "room for about N more queries like this one" in the analyst's budget
/// ([`crate::budget::repeats`]), "at least N" at the counting limit.
pub(super) fn repeats_text(
    limit: &crate::budget::Limit,
    spent: &crate::budget::Spent,
    cost: &crate::budget::Cost,
) -> String {
    let k = crate::budget::repeats(limit, spent, cost);
    let about = if k >= crate::limits::REPEATS_COUNTED_MAX {
        "at least"
    } else {
        "about"
    };
    let queries = if k == 1 { "query" } else { "queries" };
    format!("room for {about} {k} more {queries} like this one")
}

#[cfg(test)]
mod tests {
    #[test]
    fn room_for_one_more_query_is_singular() {
        use crate::budget::{Cost, Fixed, Limit, Spent};
        let f = |x: f64| Fixed::from_f64_ceil(x).unwrap();
        let limit = Limit::new(f(10.0), f(1e-5));
        let cost = Cost::pure(f(0.5));
        let text =
            |spent: f64| super::repeats_text(&limit, &(Spent::ZERO + Cost::pure(f(spent))), &cost);
        assert_eq!(text(9.5), "room for about 1 more query like this one");
        assert_eq!(text(9.0), "room for about 2 more queries like this one");
    }
}
