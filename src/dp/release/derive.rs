//! Coarser groupings derived from a finer release, by post-processing (issue 16 part 3).
//!
//! A release whose group keys all have a declared public domain released every cell of that
//! domain, noisy zeros included, with no partition selection. The noisy measures of a coarser
//! grouping (a subset of those keys, same tables, filters, bounds, measures and noise) are then
//! sums over the finer cells that project onto each coarser group: COUNT and SUM add, and AVG,
//! VARIANCE and STDDEV follow from the summed counts and centred sums exactly as
//! [`super::finish`] derives them from drawn ones. This reads released values only, so it costs
//! nothing (docs/privacy.md, "Coarser groupings derived from a finer release").
//!
//! Invariants:
//! - Only drawn measures ([`super::measure`], not themselves derived) of a plan without grouping
//!   sets whose keys are all public, and only when every measure adds up over cells
//!   ([`additive`]): counts of rows or values, sums, centred sums and sums of squares. Distinct
//!   counts (a unit or value in several finer cells is one in the coarser group), quantiles and
//!   MIN/MAX do not, and then nothing is derived.
//! - A release with no group derives nothing: its domain is empty, and the sum of no cells
//!   would be an exact, noiseless zero.
//! - The stated error of a derived value is that of a sum of `m` independent noises, `m` the
//!   finer cells it adds ([`crate::dp::mechanism::Noise::sum_error_bound`]): variances add.
//! - A derived value is the sum of the finer release's cells, so it carries that release's
//!   contribution bounds (each unit in at most `max_groups_per_unit` finer cells). A key is
//!   dropped only when it is exhaustive ([`Plan::key_exhaustive`]): every row's value is in its
//!   domain, so the finer cells hold every row the coarser query counts.

use std::collections::BTreeMap;

use crate::dp::mechanism::Noise;
use crate::dp::plan::Plan;
use crate::dp::rewrite::{Measure, Rewrite};
use crate::error::{Error, Result};
use crate::limits;

use super::measures::Derivation;
use super::{Mechanisms, NoisyMeasures};

/// Whether every measure of `rewrite` adds up over disjoint cells of the same rows
/// ([`Measure::is_additive`]): counts of rows and values, sums, centred sums and sums of
/// squares. Not distinct counts (of units or of values: one unit or value in two finer cells
/// counts once in their union) nor quantiles.
pub fn additive(rewrite: &Rewrite) -> bool {
    rewrite.measures.iter().all(Measure::is_additive)
}

/// The coarser groupings a release of `plan` can answer: every proper subset of its keys (in
/// the plan's key order, the empty one included) that leaves out only exhaustive keys
/// ([`Plan::key_exhaustive`]), when its keys are all public, it has no
/// grouping sets, at most [`limits::COARSER_GROUPINGS_KEYS_MAX`] keys and only [`additive`]
/// measures; none otherwise.
pub fn coarser_groupings(plan: &Plan, rewrite: &Rewrite) -> Vec<Vec<usize>> {
    let k = plan.keys.len();
    if plan.grouping_sets.is_some()
        || !plan.keys_public()
        || k == 0
        || k > limits::COARSER_GROUPINGS_KEYS_MAX
        || !additive(rewrite)
    {
        return Vec::new();
    }
    // A key left out must be exhaustive (Plan::key_exhaustive): otherwise a row whose value is
    // outside its domain is in no finer cell, and missing from the coarser group.
    (0..(1usize << k) - 1)
        .filter(|mask| (0..k).all(|i| mask & (1 << i) != 0 || plan.key_exhaustive(i)))
        .map(|mask| (0..k).filter(|i| mask & (1 << i) != 0).collect())
        .collect()
}

/// The noisy measures of the grouping by `keys` (indices into `plan`'s keys, in its order),
/// each group the sum of the cells of `measures` that project onto it, with the error bounds of
/// such sums. `measures` and `mechanisms` are what [`super::measure`] drew for `plan`. `None`
/// where nothing may be derived (module docs).
pub fn coarser(
    plan: &Plan,
    rewrite: &Rewrite,
    mechanisms: &Mechanisms,
    measures: &NoisyMeasures,
    keys: &[usize],
) -> Result<Option<NoisyMeasures>> {
    if !coarser_groupings(plan, rewrite).iter().any(|s| s == keys)
        || measures.derivation.is_some()
        || measures.groups.is_empty()
    {
        return Ok(None);
    }
    let m = rewrite.measures.len();
    if measures.keys != plan.keys.len() || measures.measures != m || mechanisms.noises.len() != m {
        return Err(Error::internal("noisy measures of another shape"));
    }
    let (groups, cells, bounds) = add_up(&measures.groups, keys, &mechanisms.noises)?;
    let from: Vec<String> = plan
        .keys
        .iter()
        .map(|k| super::analyst_text(plan, k.expr.as_str()))
        .collect();
    Ok(Some(NoisyMeasures {
        keys: keys.len(),
        measures: m,
        groups,
        derivation: Some(Derivation {
            from: Some(from.join(", ")),
            cells,
            bounds,
        }),
    }))
}

/// Released groups: key texts and noisy values.
type Groups = Vec<(Vec<Option<String>>, Vec<f64>)>;

/// Per group, the 95 % and the 97.5 % error bound of each measure.
type Bounds = Vec<(Vec<f64>, Vec<f64>)>;

/// The groups of the grouping by `keys` (positions in the key texts of `cells`), each the sum
/// of the `cells` that project onto it, in key order; with, per group, how many cells it adds
/// and the 95 % and 97.5 % error bounds of each measure for a sum of that many draws of its
/// noise in `noises`. The grouping by no key over no cell is one group of zeros, adding no cell,
/// with no error: the sum of nothing.
pub(super) fn add_up(
    cells: &[(Vec<Option<String>>, Vec<f64>)],
    keys: &[usize],
    noises: &[Noise],
) -> Result<(Groups, Vec<u64>, Bounds)> {
    let m = noises.len();
    let mut sums: BTreeMap<Vec<Option<String>>, (Vec<f64>, u64)> = BTreeMap::new();
    if keys.is_empty() {
        sums.insert(Vec::new(), (vec![0.0; m], 0));
    }
    for (texts, values) in cells {
        if values.len() != m || keys.iter().any(|&k| k >= texts.len()) {
            return Err(Error::internal("noisy measures of another shape"));
        }
        let projected: Vec<Option<String>> = keys.iter().map(|&k| texts[k].clone()).collect();
        let entry = sums.entry(projected).or_insert_with(|| (vec![0.0; m], 0));
        for (sum, value) in entry.0.iter_mut().zip(values) {
            *sum += value;
        }
        entry.1 += 1;
    }
    let mut bounds_of: BTreeMap<u64, (Vec<f64>, Vec<f64>)> = BTreeMap::new();
    let mut groups = Vec::with_capacity(sums.len());
    let mut counts = Vec::with_capacity(sums.len());
    let mut bounds = Vec::with_capacity(sums.len());
    for (texts, (values, n)) in sums {
        let b = bounds_of
            .entry(n)
            .or_insert_with(|| {
                let at = |alpha: f64| -> Vec<f64> {
                    noises
                        .iter()
                        .map(|noise| match n {
                            0 => 0.0,
                            _ => noise.sum_error_bound(n, alpha).unwrap_or(f64::NAN),
                        })
                        .collect()
                };
                (at(0.05), at(0.025))
            })
            .clone();
        bounds.push(b);
        counts.push(n);
        groups.push((texts, values));
    }
    Ok((groups, counts, bounds))
}

/// The coarser groupings a release of `plan` answers ([`coarser_groupings`]), each with the
/// ledger key the coarser query itself computes ([`super::derived_key`] of its
/// [`super::measures_key`]: its plan ([`Plan::coarser`]), its rewrite with `parameters` and
/// `secret` (in `shape`, as the session places it), its
/// mechanisms at the same budget and its public domain) and the sums of `measures`' cells. A
/// grouping whose own rewrite has other measures, or that fails to plan, is left out, and so are
/// those past [`limits::COARSER_STORED_GROUPS_MAX`] groups in all (the coarsest are kept
/// first): a later query of them is then charged (the safe direction). Pure: no I/O.
#[allow(clippy::too_many_arguments)] // the release's parts, and how the session shapes its SQL
pub fn coarser_releases(
    plan: &Plan,
    rewrite: &Rewrite,
    mechanisms: &Mechanisms,
    measures: &NoisyMeasures,
    parameters: &[Option<String>],
    secret: &str,
    shape: crate::dp::rewrite::UpstreamShape,
    policy: &crate::policy::Policy,
) -> Vec<(String, NoisyMeasures)> {
    let entry = |keys: &[usize]| -> Result<Option<(String, NoisyMeasures)>> {
        let Some(sub) = plan.coarser(keys) else {
            return Ok(None);
        };
        let sub_rewrite = shape.apply(
            crate::dp::rewrite::rewrite(&sub, parameters, secret)?,
            policy,
        )?;
        if sub_rewrite.measures != rewrite.measures
            || sub_rewrite.arguments != rewrite.arguments
            || sub_rewrite.aggregate_measures != rewrite.aggregate_measures
        {
            return Ok(None);
        }
        let Some(derived) = coarser(plan, rewrite, mechanisms, measures, keys)? else {
            return Ok(None);
        };
        let sub_mechanisms = super::mechanisms(&sub, &sub_rewrite, mechanisms.budget)?;
        let domain = crate::dp::rewrite::domain::public_domain(&sub, parameters)?;
        let key = super::derived_key(&super::measures_key(
            &sub,
            &sub_rewrite,
            &sub_mechanisms,
            parameters,
            &domain,
        ));
        Ok(Some((key, derived)))
    };
    // The coarsest first, and no more groups in all than one stored release may have.
    let mut groupings = coarser_groupings(plan, rewrite);
    groupings.sort_by_key(Vec::len);
    let mut stored = 0usize;
    let mut entries = Vec::new();
    for keys in groupings {
        if let Ok(Some((key, derived))) = entry(&keys) {
            if stored + derived.len() > limits::COARSER_STORED_GROUPS_MAX {
                continue;
            }
            stored += derived.len();
            entries.push((key, derived));
        }
    }
    entries
}
