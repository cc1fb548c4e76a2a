//! The upstream statement of a plan with grouping sets (`ROLLUP`, `CUBE`, `GROUPING SETS`): one
//! branch per grouping set, each the complete four-stage statement of that set's own plan
//! ([`Plan::grouping_set`]), concatenated with `UNION ALL`.
//!
//! Columns: `__dp_set` (the set's index), one text column per key of the query (NULL for the keys
//! not in the set), then the measures and the number of units, as in a plain rewrite.
//!
//! When every key is public, one set holds every other's keys and every measure adds up
//! ([`Plan::finest_grouping_set`], [`super::Measure::is_additive`]), the statement is that
//! finest set's branch alone: the release derives every other set from its cells
//! (`release::grouping`).
//!
//! Invariants:
//! - Each branch bounds contributions exactly as a query grouped by that set alone: its own
//!   stage 3 keeps at most `max_groups_per_unit` groups of the set per unit (one for the empty
//!   set), so the sensitivity of each set's measures is a function of the policy alone, and the
//!   release charges every set ([`crate::dp::release`]).
//! - The measures (and their order) are those of the plan's aggregates, the same in every
//!   branch; an internal error otherwise.

use super::{Built, Shape};
use crate::dp::plan::Plan;
use crate::dp::sql::{sql, Name, Sql};
use crate::error::{Error, Result};

/// The statement of every grouping set of `plan`, unrendered.
pub(super) fn statement(
    plan: &Plan,
    parameters: &[Option<String>],
    secret: &str,
    shape: Shape,
) -> Result<Built> {
    let sets = plan
        .grouping_sets()
        .ok_or_else(|| Error::internal("grouping statement of a plan without grouping sets"))?;
    let k = plan.keys().len();
    // When every set is derived from the finest (release::grouping), its branch alone.
    let mut measured: Vec<usize> = (0..sets.len()).collect();
    if let Some(f) = plan.finest_grouping_set() {
        let sub = plan
            .grouping_set(f)
            .ok_or_else(|| Error::internal("a grouping set out of range"))?;
        let (_, _, measures, _) = super::statement(&sub, parameters, secret, shape)?;
        if measures.iter().all(|m| m.is_additive()) {
            measured = vec![f];
        }
    }
    let mut branches = Vec::new();
    let mut shared: Option<Built> = None;
    for s in measured {
        let set = &sets[s];
        let sub = plan
            .grouping_set(s)
            .ok_or_else(|| Error::internal("a grouping set out of range"))?;
        let (body, arguments, measures, aggregate_measures) =
            super::statement(&sub, parameters, secret, shape)?;
        let width = set.len() + measures.len() + 1;
        let columns = Sql::join((0..width).map(|c| sql!("{}", Name("c", c))), ", ");
        let mut select = vec![sql!("{} AS __dp_set", s)];
        for key in 0..k {
            select.push(match set.iter().position(|&x| x == key) {
                Some(p) => sql!("{}", Name("c", p)),
                None => Sql::text("CAST(NULL AS TEXT)"),
            });
        }
        select.extend((set.len()..width).map(|c| sql!("{}", Name("c", c))));
        branches.push(sql!(
            "SELECT {} FROM ({}) AS {} ({})",
            Sql::join(select, ", "),
            body,
            Name("set", s),
            columns
        ));
        match &shared {
            None => shared = Some((Sql::text(""), arguments, measures, aggregate_measures)),
            Some((_, a, m, am)) => {
                if *a != arguments || *m != measures || *am != aggregate_measures {
                    return Err(Error::internal("grouping sets with different measures"));
                }
            }
        }
    }
    let (_, arguments, measures, aggregate_measures) =
        shared.ok_or_else(|| Error::internal("a plan with no grouping set"))?;
    Ok((
        Sql::join(branches, " UNION ALL "),
        arguments,
        measures,
        aggregate_measures,
    ))
}
