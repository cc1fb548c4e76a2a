//! The release of a plan with grouping sets (`ROLLUP`, `CUBE`, `GROUPING SETS`).
//!
//! Two ways, chosen from the plan and its measures alone ([`derived_set`]):
//! - **Derived** (issue 15): when every key is public, one set holds the keys of every other
//!   ([`Plan::finest_grouping_set`]: ROLLUP, CUBE, and GROUPING SETS that list their union) and
//!   every measure adds up over cells ([`crate::dp::rewrite::Measure::is_additive`]), only that
//!   finest set is measured, at the query's whole ε, and every set's groups (the finest's own
//!   included, each adding one cell) are sums of its cells ([`super::derive::add_up`]):
//!   post-processing, so the query is charged once, for the finest set, and every subtotal and
//!   total equals the sum of its parts. A group adding `m` cells has the error of a sum of `m`
//!   noises (variances add). Summed over all the released cells, the noise variance is never
//!   larger than with one release per set at ε/S (S sets): the finest set's cells alone have
//!   that much at ε/S, and every set's cells add up to `n_finest` cells' worth (docs/privacy.md).
//! - **One release per set** otherwise: each grouping set is a release of its own
//!   ([`crate::dp::plan::Plan::grouping_set`]): its groups leave through its own partition
//!   selection, or its own public domain when every key of the query is public; its measures
//!   get their own noise. A privacy unit contributes to a group of every set, so the sets are
//!   not disjoint: the query's ε and δ are split equally over the sets, and the charge is the
//!   sequential composition (the sum) of every set's cost, duplicate sets included. The total is
//!   what a plain query at the same ε and δ would be charged, never less than what the sets
//!   spend.
//!
//! Invariants:
//! - The released groups of set `s` carry `s` as an extra, last key text (what tells a rolled-up
//!   NULL from a NULL key value, and what `GROUPING(…)` reads); it depends on the query alone.
//! - The rewrite sends the finest set's branch alone exactly when [`derived_set`] is `Some`
//!   (both read the same plan and measures), and [`measure`] reads that branch alone.

use std::collections::BTreeSet;

use rand::{CryptoRng, Rng};

use crate::dp::plan::Plan;
use crate::dp::rewrite::Rewrite;
use crate::error::{Error, Result};

use super::measures::Derivation;
use super::{fixed_ceil, Budget, Mechanisms, NoisyMeasures, PrivateRows, PublicDomains};

/// The grouping set every other set of `plan` is derived from, when they are
/// (module docs): [`Plan::finest_grouping_set`], with measures that all add up.
pub fn derived_set(plan: &Plan, rewrite: &Rewrite) -> Option<usize> {
    plan.finest_grouping_set()
        .filter(|_| rewrite.measures.iter().all(|m| m.is_additive()))
}

/// The plan of grouping set `s`, or an internal error.
pub(super) fn set_plan(plan: &Plan, s: usize) -> Result<Plan> {
    plan.grouping_set(s)
        .ok_or_else(|| Error::internal("a grouping set out of range"))
}

/// The privacy parameters of each set: an equal share of the query's ε and δ.
fn set_budget(budget: Budget, sets: usize) -> Budget {
    let n = sets.max(1) as f64;
    Budget {
        epsilon: budget.epsilon / n,
        delta: budget.delta / n,
        mechanism: budget.mechanism,
    }
}

/// The mechanisms of every set, and their composition: the returned [`Mechanisms`] holds the
/// sets' in [`Mechanisms::sets`], the sum of their costs, and the query's budget; its own
/// noises are the first set's (each set's are in its entry).
pub(super) fn mechanisms(plan: &Plan, rewrite: &Rewrite, budget: Budget) -> Result<Mechanisms> {
    let sets = plan
        .grouping_sets()
        .ok_or_else(|| Error::internal("grouping mechanisms of a plan without grouping sets"))?;
    if let Some(f) = derived_set(plan, rewrite) {
        // The finest set alone, at the whole budget; every set reads its noises.
        let finest = super::mechanisms(&set_plan(plan, f)?, rewrite, budget)?;
        return Ok(Mechanisms {
            sets: vec![finest.clone(); sets.len()],
            budget,
            ..finest
        });
    }
    let share = set_budget(budget, sets.len());
    let mut each = Vec::with_capacity(sets.len());
    for s in 0..sets.len() {
        each.push(super::mechanisms(&set_plan(plan, s)?, rewrite, share)?);
    }
    let mut cost = each
        .iter()
        .fold(crate::budget::Cost::ZERO, |sum, m| sum + m.cost);
    // The shares are f64 quotients of the query's ε and δ, each rounded up, so their sum is the
    // query's own ε (and δ, when every set selects) up to a few units of 10⁻¹⁸ either way. With
    // Laplace noise every set spends its whole share as pure ε, so the sets together spend the
    // query's ε, charged as a plain query's split over its measures is: the query's ε rounded
    // up. Likewise δ when every set spends its share of it.
    let (epsilon, delta) = (fixed_ceil(budget.epsilon)?, fixed_ceil(budget.delta)?);
    if budget.mechanism == crate::policy::Mechanism::Laplace {
        cost.epsilon = epsilon;
    } else {
        cost.epsilon = cost.epsilon.min(epsilon);
    }
    if each.iter().all(|m| m.selection.is_some()) {
        cost.delta = delta;
    } else {
        cost.delta = cost.delta.min(delta);
    }
    let first = each
        .first()
        .cloned()
        .ok_or_else(|| Error::internal("a plan with no grouping set"))?;
    Ok(Mechanisms {
        cost,
        shares: each.iter().map(|m| m.shares).sum(),
        budget,
        sets: each,
        ..first
    })
}

/// The public domain of set `set`: each part of the query's domain restricted to the set's keys
/// (indices into the set), its combinations projected and deduplicated; parts with no key in the
/// set are left out.
fn set_domains(domains: &PublicDomains, set: &[usize]) -> PublicDomains {
    let mut out = PublicDomains::new();
    for (keys, combinations) in domains {
        let kept: Vec<(usize, usize)> = keys
            .iter()
            .enumerate()
            .filter_map(|(p, k)| set.iter().position(|x| x == k).map(|q| (p, q)))
            .collect();
        if kept.is_empty() {
            continue;
        }
        let mut seen = BTreeSet::new();
        let mut projected = Vec::new();
        for row in combinations {
            let values: Vec<Option<String>> = kept
                .iter()
                .map(|&(p, _)| row.get(p).cloned().flatten())
                .collect();
            if seen.insert(values.clone()) {
                projected.push(values);
            }
        }
        out.push((kept.iter().map(|&(_, q)| q).collect(), projected));
    }
    out
}

/// [`super::measure`] of every set over its own rows of the upstream's (those whose first column
/// is its index), each with its own mechanisms; the groups of all sets, set by set, each with
/// every key of the query (NULL where not in its set) and its set's index last.
pub(super) fn measure<R: Rng + CryptoRng + ?Sized>(
    plan: &Plan,
    rewrite: &Rewrite,
    mechanisms: &Mechanisms,
    rows: &PrivateRows,
    public_domains: &PublicDomains,
    rng: &mut R,
) -> Result<NoisyMeasures> {
    let sets = plan
        .grouping_sets()
        .ok_or_else(|| Error::internal("grouping release of a plan without grouping sets"))?;
    if mechanisms.sets.len() != sets.len() {
        return Err(Error::internal("mechanisms of other grouping sets"));
    }
    let k = plan.keys.len();
    let m = rewrite.measures.len();
    let expected = 1 + k + m + 1;
    if rows.rows.iter().any(|r| r.len() != expected) {
        return Err(Error::internal(
            "upstream returned an unexpected number of columns",
        ));
    }
    if let Some(f) = derived_set(plan, rewrite) {
        return measure_derived(plan, rewrite, mechanisms, rows, public_domains, f, rng);
    }
    let mut groups = Vec::new();
    for (s, set) in sets.iter().enumerate() {
        let own = set_rows(rows, s, set, k);
        let released = super::measure(
            &set_plan(plan, s)?,
            rewrite,
            &mechanisms.sets[s],
            &own,
            &set_domains(public_domains, set),
            rng,
        )?;
        for (keys, noisy) in released.groups {
            let mut full = vec![None; k];
            for (p, &key) in set.iter().enumerate() {
                full[key] = keys.get(p).cloned().flatten();
            }
            full.push(Some(s.to_string()));
            groups.push((full, noisy));
        }
    }
    Ok(NoisyMeasures {
        keys: k + 1,
        measures: m,
        groups,
        derivation: None,
    })
}

/// An upper bound, from the plan alone, on how many cells of the finest set `f` one derived
/// group adds: the product, over the finest set's keys a set leaves out, of each key's listed
/// values, the most over the sets. A key read from a public table counts as
/// [`crate::limits::PUBLIC_KEY_COMBINATIONS_MAX`] values (its domain is read later), as does the
/// whole product (a larger domain is refused). For `pgdp.max_error`, which must not understate
/// the error of a total.
pub(super) fn cells_max(plan: &Plan, f: usize) -> u64 {
    let cap = crate::limits::PUBLIC_KEY_COMBINATIONS_MAX as u64;
    let (Some(sets), Some(finest)) = (
        plan.grouping_sets(),
        plan.grouping_sets().and_then(|s| s.get(f)),
    ) else {
        return 1;
    };
    sets.iter()
        .map(|set| {
            finest
                .iter()
                .filter(|k| !set.contains(k))
                .map(|&k| match plan.keys.get(k).map(|key| &key.public) {
                    Some(crate::dp::plan::PublicKeys::Listed { values, .. }) => {
                        values.len().max(1) as u64
                    }
                    _ => cap,
                })
                .fold(1u64, |n, size| n.saturating_mul(size))
                .min(cap)
        })
        .max()
        .unwrap_or(1)
}

/// [`measure`] when every set is derived from set `f` (module docs): set `f` measured over its
/// rows at the whole budget, then every set's groups added up from its cells, each with every
/// key of the query (NULL where not in its set) and its set's index last.
fn measure_derived<R: Rng + CryptoRng + ?Sized>(
    plan: &Plan,
    rewrite: &Rewrite,
    mechanisms: &Mechanisms,
    rows: &PrivateRows,
    public_domains: &PublicDomains,
    f: usize,
    rng: &mut R,
) -> Result<NoisyMeasures> {
    let sets = plan
        .grouping_sets()
        .ok_or_else(|| Error::internal("grouping release of a plan without grouping sets"))?;
    let finest_keys = sets
        .get(f)
        .ok_or_else(|| Error::internal("a grouping set out of range"))?;
    let finest_mechanisms = mechanisms
        .sets
        .get(f)
        .ok_or_else(|| Error::internal("mechanisms of other grouping sets"))?;
    let k = plan.keys.len();
    let own = set_rows(rows, f, finest_keys, k);
    if own.rows.len() != rows.rows.len() {
        return Err(Error::internal(
            "rows of a grouping set that is not measured",
        ));
    }
    let finest = super::measure(
        &set_plan(plan, f)?,
        rewrite,
        finest_mechanisms,
        &own,
        &set_domains(public_domains, finest_keys),
        rng,
    )?;
    let mut groups = Vec::new();
    let mut cells = Vec::new();
    let mut bounds = Vec::new();
    for (s, set) in sets.iter().enumerate() {
        // The set's keys as positions among the finest set's (every one is there).
        let positions = set
            .iter()
            .map(|key| finest_keys.iter().position(|x| x == key))
            .collect::<Option<Vec<usize>>>()
            .ok_or_else(|| Error::internal("a grouping set outside the finest"))?;
        let (sums, n, b) =
            super::derive::add_up(&finest.groups, &positions, &finest_mechanisms.noises)?;
        for (texts, values) in sums {
            let mut full = vec![None; k];
            for (p, &key) in set.iter().enumerate() {
                full[key] = texts.get(p).cloned().flatten();
            }
            full.push(Some(s.to_string()));
            groups.push((full, values));
        }
        cells.extend(n);
        bounds.extend(b);
    }
    Ok(NoisyMeasures {
        keys: k + 1,
        measures: rewrite.measures.len(),
        groups,
        derivation: Some(Derivation {
            from: None,
            cells,
            bounds,
        }),
    })
}

/// The grouping set of a released group of a plan with grouping sets (its last key text).
pub(super) fn set_of(keys: &[Option<String>], sets: usize) -> Result<usize> {
    keys.last()
        .cloned()
        .flatten()
        .and_then(|t| t.parse::<usize>().ok())
        .filter(|&s| s < sets)
        .ok_or_else(|| Error::internal("a released group without its grouping set"))
}

/// `GROUPING(args)` of a row of grouping set `set`: bit `n-1-p` set where key `args[p]` is not in
/// the set.
pub(super) fn grouping_value(args: &[usize], set: &[usize]) -> i64 {
    let n = args.len();
    args.iter()
        .enumerate()
        .filter(|(_, k)| !set.contains(k))
        .map(|(p, _)| 1i64 << (n - 1 - p))
        .sum()
}

/// EXPLAIN's lines for the grouping sets: each set's keys, its cost and its mechanisms (the lines
/// [`super::explain`] gives that set's plan alone, indented).
pub(super) fn explain_sets(
    plan: &Plan,
    rewrite: &Rewrite,
    mechanisms: &Mechanisms,
) -> Result<Vec<String>> {
    let sets = plan
        .grouping_sets()
        .ok_or_else(|| Error::internal("grouping explain of a plan without grouping sets"))?;
    if let Some(f) = derived_set(plan, rewrite) {
        let keys_of = |set: &[usize]| -> String {
            set.iter()
                .map(|&k| super::analyst_text(plan, plan.keys[k].expr.as_str()))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let m = mechanisms
            .sets
            .get(f)
            .ok_or_else(|| Error::internal("mechanisms of other grouping sets"))?;
        let mut lines = vec![format!(
            "grouping sets: {} set(s), all derived from one release of grouping set {} ({}) at the whole epsilon: each set's groups are sums of its cells (post-processing, no charge of their own), so every subtotal and total equals the sum of its parts; a group that adds m cells has the error of a sum of m noises (variances add); over all released cells the total variance is never larger than one release per set at epsilon/{}",
            sets.len(),
            f + 1,
            keys_of(&sets[f]),
            sets.len()
        )];
        for (s, set) in sets.iter().enumerate() {
            lines.push(format!(
                "  grouping set {} ({}): {}",
                s + 1,
                keys_of(set),
                if s == f {
                    format!("released, cost {}", m.cost)
                } else {
                    format!("sums of the cells of grouping set {}, no cost", f + 1)
                }
            ));
        }
        lines.extend(set_lines(super::explain(
            &set_plan(plan, f)?,
            rewrite,
            m,
            m.budget,
        )));
        return Ok(lines);
    }
    let mut lines = vec![format!(
        "grouping sets: {} release(s), one per set, each with an equal share of epsilon and delta (epsilon {:.6}, delta {:e}); a privacy unit is in a group of every set, so their costs add up (sequential composition), duplicate sets included",
        sets.len(),
        mechanisms.sets.first().map(|m| m.budget.epsilon).unwrap_or(0.0),
        mechanisms.sets.first().map(|m| m.budget.delta).unwrap_or(0.0),
    )];
    for (s, set) in sets.iter().enumerate() {
        let sub = set_plan(plan, s)?;
        let m = mechanisms
            .sets
            .get(s)
            .ok_or_else(|| Error::internal("mechanisms of other grouping sets"))?;
        let keys: Vec<String> = set
            .iter()
            .map(|&k| super::analyst_text(plan, plan.keys[k].expr.as_str()))
            .collect();
        lines.push(format!(
            "  grouping set {} ({}): cost {}",
            s + 1,
            keys.join(", "),
            m.cost
        ));
        lines.extend(set_lines(super::explain(&sub, rewrite, m, m.budget)));
    }
    Ok(lines)
}

/// A grouping set's own EXPLAIN lines, indented under the query's: its measures and selection,
/// without the header, the estimates note and the upstream SQL (the query shows those once).
fn set_lines(own: Vec<String>) -> impl Iterator<Item = String> {
    own.into_iter()
        .skip(2)
        .take_while(|l| l != "upstream SQL:")
        .filter(|l| !l.starts_with("estimates:"))
        .map(|l| format!("  {l}"))
}

/// The rows of grouping set `s` (those whose `__dp_set` is `s`), as a query grouped by `set`
/// alone reads them: the set's keys, then the measures and the number of units (`k` is the
/// number of the query's keys).
fn set_rows(rows: &PrivateRows, s: usize, set: &[usize], k: usize) -> PrivateRows {
    let index = s.to_string();
    PrivateRows {
        rows: rows
            .rows
            .iter()
            .filter(|r| r[0].as_deref() == Some(index.as_str()))
            .map(|r| {
                set.iter()
                    .map(|&key| r[1 + key].clone())
                    .chain(r[1 + k..].iter().cloned())
                    .collect()
            })
            .collect(),
    }
}
