//! How far pgdp's answers are from PostgreSQL's exact answer (not from the capped statistic) at
//! ε = 1 with Laplace noise, under the demo policy's caps ("before") and with each query's cap
//! on rows per unit chosen from a DP histogram of its data (`pgdp.choose_bounds`, issue 41)
//! under the demo policy with its row caps raised to ceilings ("after":
//! [`ceiling_policy_text`]).
//!
//! Per query: over R repetitions, every true group and aggregate, the relative error
//! `|released − exact| / |exact|` (a true group that is not released counts as 100 % off; cells
//! whose exact value is 0 are left out). The report gives each query's median and the
//! catalogue's median and worst of those medians, and the caps the choice took.
//!
//! The repetitions apply the library's own steps to rows fetched from the upstream, as the rest
//! of the bench does: "before" `release::release` on the rewrite's rows; "after" the noise of
//! the contribution histogram and the choice (`release::bounds::choose`) on the histogram's rows,
//! then `release::release` at the chosen cap on that cap's rows (fetched once per cap).

use std::collections::{BTreeMap, BTreeSet};

/// The caps a query chose: rows per group, groups per unit, a total, and a chosen upper bound
/// (as the NOTICE prints it).
pub type Caps = (u64, u64, Option<u64>, Option<String>);
use std::fmt::Write as _;

use pgdp::dp::release::{self, bounds, Budget, PrivateRows};
use pgdp::policy::{Mechanism, Policy};
use rand::rngs::ChaCha20Rng;
use rand::SeedableRng;
use tokio_postgres::Client;

use super::common::{fail, simple_rows, Res};
use super::{answer_from_cells, plan_of, Answer};

/// The setting of both columns.
const BUDGET: Budget = Budget {
    epsilon: 1.0,
    delta: super::LAPLACE_DELTA,
    mechanism: Mechanism::Laplace,
};

/// The demo policy, whose tables' caps rise to ceilings when a query chooses them: 40 visits
/// per person and group (a person has at most 40), 120 prescriptions, and 16 groups per person
/// for both (visits reach 13 clinics at the 99th percentile).
pub fn ceiling_policy_text(demo: &str) -> Res<String> {
    if demo.matches("ceilings: { max_rows_per_unit:").count() != 2 {
        return Err(fail(
            "the demo policy's ceilings moved: update benches/utility/bias.rs",
        ));
    }
    Ok(demo.to_string())
}

/// One query's relative errors before and after.
pub struct BiasRow {
    pub number: u32,
    pub label: &'static str,
    pub before: f64,
    pub after: f64,
    /// The caps (rows per group, groups per unit, total per unit, upper bound) the choice took
    /// over the repetitions (empty: the query does not choose).
    pub caps: BTreeSet<Caps>,
}

/// Relative errors of `answers` against `plain`, over every true group and aggregate.
fn relative_errors(plain: &Answer, answers: &[Answer]) -> Vec<f64> {
    let mut out = Vec::new();
    for answer in answers {
        for (key, exact) in plain {
            for (i, x) in exact.iter().enumerate() {
                let Some(x) = x.filter(|x| *x != 0.0 && x.is_finite()) else {
                    continue;
                };
                let released = answer.get(key).and_then(|v| v.get(i).copied().flatten());
                out.push(match released {
                    Some(v) => (v - x).abs() / x.abs(),
                    None => 1.0,
                });
            }
        }
    }
    out
}

fn median(mut xs: Vec<f64>) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// One query: `template` without its `{n}`, its exact answer `plain`, `reps` repetitions each.
#[allow(clippy::too_many_arguments)] // one call site; the parts are unrelated
pub async fn measure(
    number: u32,
    label: &'static str,
    sql: &str,
    plain: &Answer,
    policy: &Policy,
    ceiling: &Policy,
    secret: &str,
    direct: &Client,
    reps: usize,
    seed: [u8; 32],
) -> Res<BiasRow> {
    let err = |e: pgdp::error::Error| fail(e.to_string());
    // Before: the policy's caps.
    let (plan, rw) = plan_of(policy, secret, sql)?;
    let mech = release::mechanisms(&plan, &rw, BUDGET).map_err(err)?;
    let domains = super::public_domains(&plan, direct).await?;
    let rows = PrivateRows::new(simple_rows(direct, rw.sql.as_str()).await?);
    let mut rng = ChaCha20Rng::from_seed(seed);
    let mut answers = Vec::new();
    for _ in 0..reps {
        let released =
            release::release(&plan, &rw, &mech, &rows, &domains, false, &mut rng).map_err(err)?;
        answers.push(answer_from_cells(&plan, released.rows())?);
    }
    let before = median(relative_errors(plain, &answers));

    // After: the ceilings, each repetition choosing its cap.
    let (plan, rw) = plan_of(ceiling, secret, sql)?;
    let mech = release::mechanisms(&plan, &rw, BUDGET).map_err(err)?;
    let cells = (plan.keys_public() && !plan.keys().is_empty()).then(|| {
        domains
            .iter()
            .map(|(_, c)| c.len() as u64)
            .fold(1u64, u64::saturating_mul)
    });
    let choice = bounds::ChoicePlan::new(&plan, &rw, &mech, &[], secret, cells).map_err(err)?;
    let mut answers = Vec::new();
    let mut caps = BTreeSet::new();
    match choice {
        None => {
            let rows = PrivateRows::new(simple_rows(direct, rw.sql.as_str()).await?);
            for _ in 0..reps {
                let released =
                    release::release(&plan, &rw, &mech, &rows, &domains, false, &mut rng)
                        .map_err(err)?;
                answers.push(answer_from_cells(&plan, released.rows())?);
            }
        }
        Some(choice) => {
            let histogram = simple_rows(direct, choice.sql.as_str()).await?;
            let mut at_cap: BTreeMap<Caps, PrivateRows> = BTreeMap::new();
            for _ in 0..reps {
                let chosen = bounds::choose(
                    &choice.choice,
                    &PrivateRows::new(histogram.clone()),
                    choice.noise_per_row(),
                    &mut rng,
                )
                .map_err(err)?;
                let (p, r, m) = choice
                    .answer(
                        &plan,
                        &chosen,
                        &[],
                        secret,
                        pgdp::dp::rewrite::UpstreamShape::OneServer,
                        policy,
                    )
                    .map_err(err)?;
                // The rewritten SQL depends on the caps and on a chosen upper bound.
                let caps_of = (
                    chosen.rows_per_unit(),
                    chosen.groups_per_unit(),
                    chosen.rows_total(),
                    chosen.clamp_upper().map(|(_, u)| u.to_string()),
                );
                caps.insert(caps_of.clone());
                let rows = match at_cap.entry(caps_of) {
                    std::collections::btree_map::Entry::Occupied(o) => o.into_mut(),
                    std::collections::btree_map::Entry::Vacant(v) => {
                        let fetched = simple_rows(direct, r.sql.as_str()).await?;
                        v.insert(PrivateRows::new(fetched))
                    }
                };
                let released =
                    release::release(&p, &r, &m, rows, &domains, false, &mut rng).map_err(err)?;
                answers.push(answer_from_cells(&p, released.rows())?);
            }
        }
    }
    let after = median(relative_errors(plain, &answers));
    Ok(BiasRow {
        number,
        label,
        before,
        after,
        caps,
    })
}

/// The report's section.
pub fn report(rows: &[BiasRow], reps: usize) -> Res<String> {
    let mut r = String::new();
    writeln!(
        r,
        "### Against PostgreSQL's exact answer: the policy's caps and caps chosen per query\n"
    )?;
    writeln!(
        r,
        "ε = 1, Laplace, {reps} repetitions per query. **Before**: the demo policy's caps (10 visits and 20 prescriptions per person and group). **After**: the demo policy as shipped (`choose_bounds: true`), whose tables' caps rise to ceilings of 40 visits and 120 prescriptions in 16 groups per person, and cost's upper bound to 200,000: each query spends 10 % of its ε (15 % with a SUM or AVG of cost) on DP histograms of its contributions and chooses its caps and cost's upper bound from them (docs/privacy.md, \"Contribution bounds chosen per query\"). The error is `|released − exact| / |exact|` over every true group and aggregate (a group not released counts as 100 %), against the plain SQL's answer on PostgreSQL, not the capped statistic: it counts both noise and the bias of the caps. Each query's median; quantile queries are left out (their error is in ranks, above).\n"
    )?;
    writeln!(
        r,
        "| # | query | before | after | caps chosen (rows per group × groups per person, ≤ rows per person in all when a total is chosen; a chosen upper bound of cost) |"
    )?;
    writeln!(r, "|---|---|---|---|---|")?;
    for row in rows {
        let caps = if row.caps.is_empty() {
            "— (does not choose)".to_string()
        } else {
            row.caps
                .iter()
                .map(|(c, g, t, u)| {
                    let caps = match t {
                        Some(t) => format!("{c}×{g} ≤{t}"),
                        None => format!("{c}×{g}"),
                    };
                    match u {
                        Some(u) => format!("{caps} (upper bound {u})"),
                        None => caps,
                    }
                })
                .collect::<Vec<_>>()
                .join(", ")
        };
        writeln!(
            r,
            "| {} | {} | {} | {} | {} |",
            row.number,
            row.label,
            super::pct(row.before),
            super::pct(row.after),
            caps
        )?;
    }
    let finite = |f: fn(&BiasRow) -> f64| -> Vec<f64> {
        rows.iter().map(f).filter(|x| x.is_finite()).collect()
    };
    let worst = |xs: Vec<f64>| xs.into_iter().fold(f64::NAN, f64::max);
    let (b, a) = (finite(|r| r.before), finite(|r| r.after));
    writeln!(
        r,
        "\nOver the {} queries: median of the medians {} before, {} after; worst {} before, {} after.\n",
        rows.len(),
        super::pct(median(b.clone())),
        super::pct(median(a.clone())),
        super::pct(worst(b)),
        super::pct(worst(a))
    )?;
    Ok(r)
}
