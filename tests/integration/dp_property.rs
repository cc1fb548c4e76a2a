//! Differential privacy checked end to end on neighbouring databases.
//!
//! `D` is the demo dataset (scale 1) in a fresh database; `D′` is `D` without every row of one
//! heavy user: the person with the most visits (40), ties broken by the largest income, so that
//! the person also reaches the income bound and the neighbours are as far apart as the policy
//! allows. `D′` is made inside a transaction that deletes the person's visits and person row and
//! is rolled back. Both are loaded once per test process ([`neighbours`]); the exact pre-noise
//! statistics of every query below are computed on both sides there, by running pgdp's rewritten
//! SQL directly on the upstream (in text format, as the proxy does), and the database is dropped.
//!
//! 1. [`claimed_sensitivity_bounds_the_change_from_removing_a_heavy_user`]: for every group and
//!    measure, `|exact(D) − exact(D′)|` is at most [`Measure::contribution`], the count of units
//!    moves by at most 1, and at most `max_groups_per_unit` groups change. Exact rationals, no
//!    tolerance: a failure is a bug.
//! 2. [`released_count_and_sum_pass_the_neighbour_distinguisher`]: `N = 2·10⁵` releases on each
//!    side with the production mechanism, then the empirical ratio condition
//!    `S = Σ_x max(0, p̂₁(x) − e^ε p̂₂(x)) < slack` in both directions, over bins one noise scale
//!    wide (binning is post-processing, so the condition holds for the binned probabilities too).
//! 3. [`distinguisher_catches_half_the_noise`]: the same with half the noise scale must exceed the
//!    slack.
//!
//! The slack and its false-positive rate. For an ε-DP mechanism every term has mean
//! `E[p̂₁(x) − e^ε p̂₂(x)] = P₁(x) − e^ε P₂(x) ≤ 0`, so `E[max(0, ·)]` is at most half the mean
//! absolute deviation, at most `½·√((P₁(x) + e^{2ε} P₂(x))/N)`; summed over the bins this bounds
//! `E[S]` (computed from the exact distribution of the correct mechanism at the two exact values).
//! Changing one sample moves `S` by at most `1/N` (side 1) or `e^ε/N` (side 2), so McDiarmid's
//! inequality gives `P(S − E[S] ≥ t) ≤ exp(−2t²N/(1 + e^{2ε}))`; `t` is chosen for `α = 10⁻⁶`.
//! `slack = bound on E[S] + t`, so a correct mechanism fails an assertion (two directions) with
//! probability at most `2·10⁻⁶` over the seed; the seeds are fixed, so each test always passes or
//! always fails. For the sum, the continuous Laplace distribution stands in for the discrete one
//! on the grid `2^k` (its unit scale is at least `2⁴⁰`, so bin probabilities differ by ~`2⁻⁴⁰`).
//! With bins one scale wide the slack comes to 0.0264. Measured (not asserted) on this data:
//! the fixed seeds give `S` ≈ 0.005 (count) and 0.004 (sum) for the production mechanism and
//! 0.29–0.35 with half the noise; over 30 other seeds the production mechanism's larger
//! direction had mean 0.0026 / 0.0032, standard deviation 0.0014 / 0.0016 and maximum 0.0056 /
//! 0.0063 (count / sum), so the slack sits about 16 standard deviations above the mean.

use crate::harness;

use std::collections::{BTreeMap, BTreeSet};

use num_rational::BigRational;
use num_traits::{Signed, Zero};
use pgdp::dp::analyze::{self, Context, Plan};
use pgdp::dp::mechanism::{parse_numeric_exact, rational_from_f64, Noise};
use pgdp::dp::release::{self, Budget, Mechanisms};
use pgdp::dp::rewrite::{self, Rewrite};
use pgdp::policy::{self, Mechanism, Policy};
use pgdp::session::classify::{self, Statement};
use rand::rngs::ChaCha20Rng;
use rand::SeedableRng;
use tokio::sync::OnceCell;
use tokio_postgres::{Client, SimpleQueryMessage};

const SECRET: &str = "dp-property-secret";

const EPSILON: f64 = 1.0;

const BUDGET: Budget = Budget {
    epsilon: EPSILON,
    delta: 1e-7,
    mechanism: Mechanism::Laplace,
};

/// Releases per side.
const RELEASES: usize = 200_000;

/// False-positive rate of one direction of one distinguisher assertion.
const ALPHA: f64 = 1e-6;

/// Bins on each side of the exact values; outputs beyond fall into the two outer bins.
const BINS_EACH_SIDE: i64 = 24;

/// Queries whose sensitivity is checked: counts, sums, averages, variances, partition selection
/// on a non-public key, public keys, a date key, joins, and a table reached through a unit path
/// (the heavy user's prescriptions go with their visits), and semijoins on the privacy unit (the
/// heavy user leaves the subquery's table as well as the outer one).
const SENSITIVITY_QUERIES: [&str; 14] = [
    "SELECT COUNT(*) FROM demo.visits",
    "SELECT SUM(cost) FROM demo.visits",
    "SELECT AVG(income) FROM demo.people",
    "SELECT diagnosis, COUNT(*), SUM(cost), COUNT(DISTINCT person_id) FROM demo.visits GROUP BY diagnosis",
    "SELECT clinic, AVG(cost), VARIANCE(cost) FROM demo.visits GROUP BY clinic",
    "SELECT date_trunc('month', visit_date) AS month, COUNT(*) FROM demo.visits GROUP BY 1",
    "SELECT region, COUNT(*), AVG(cost) FROM demo.visits JOIN demo.people USING (person_id) GROUP BY region",
    "SELECT r.name, SUM(p.income), COUNT(*) FROM demo.people p JOIN demo.regions r ON p.region = r.region GROUP BY r.name",
    "SELECT drug, COUNT(*), SUM(quantity) FROM demo.prescriptions GROUP BY drug",
    "SELECT v.clinic, COUNT(*), AVG(p.quantity) FROM demo.prescriptions p JOIN demo.visits v USING (visit_id) GROUP BY v.clinic",
    // Semijoins on the privacy unit: the heavy user leaves the subquery's table too.
    "SELECT region, COUNT(*), AVG(income) FROM demo.people WHERE person_id IN (SELECT person_id FROM demo.visits WHERE cost > 100) GROUP BY region",
    "SELECT clinic, COUNT(*), SUM(cost) FROM demo.visits v WHERE EXISTS (SELECT 1 FROM demo.people p WHERE p.person_id = v.person_id AND p.income > 50000) GROUP BY clinic",
    "SELECT sex, COUNT(*) FROM demo.people p WHERE NOT EXISTS (SELECT 1 FROM demo.visits v WHERE v.person_id = p.person_id AND v.cost > 1000) GROUP BY sex",
    "SELECT education, SUM(income) FROM demo.people WHERE person_id IN (SELECT person_id FROM demo.visits GROUP BY person_id HAVING COUNT(*) > 20) GROUP BY education",
];

/// Queries that choose their cap on rows per unit (`pgdp.choose_bounds`), under the demo policy
/// with a ceiling of 64 visits per person and clinic: ungrouped, grouped by a key released by
/// partition selection, by public keys through a join, and with a mean.
const CHOSEN_QUERIES: [&str; 4] = [
    "SELECT COUNT(*) FROM demo.visits",
    "SELECT clinic, COUNT(*), SUM(cost) FROM demo.visits GROUP BY clinic",
    "SELECT region, COUNT(*), AVG(cost) FROM demo.visits JOIN demo.people USING (person_id) GROUP BY region",
    "SELECT date_trunc('month', visit_date) AS month, COUNT(*) FROM demo.visits WHERE cost > 50 GROUP BY 1",
];

/// The plan, rewrite and mechanisms of `sql` under the demo policy with the visits' caps as
/// ceilings ([`crate::support::ceiling_policy_text`]), whose `upper_ceiling` of 200,000 on
/// visits.cost lets SUM and AVG of it choose their upper bound too, and how it chooses.
fn compile_choosing(sql: &str) -> (Compiled, release::bounds::ChoicePlan) {
    let text = crate::support::ceiling_policy_text();
    assert!(
        text.contains("upper: 2000, upper_ceiling: 200000 }"),
        "the demo policy's cost bounds moved"
    );
    let policy =
        policy::parse(&text).unwrap_or_else(|e| panic!("the ceiling policy is valid: {e}"));
    let compiled = compile_under(&policy, sql);
    let choice = release::bounds::ChoicePlan::new(
        &compiled.plan,
        &compiled.rewrite,
        &compiled.mechanisms,
        &[],
        SECRET,
        None,
    )
    .unwrap_or_else(|e| panic!("{sql}: {e}"))
    .unwrap_or_else(|| panic!("{sql}: chooses no cap"));
    (compiled, choice)
}

/// The rows of the contribution histograms: (histogram, bucket) → pairs or units.
async fn run_histogram(client: &Client, sql: &str) -> BTreeMap<(i64, i64), i64> {
    let mut histogram = BTreeMap::new();
    for message in client
        .simple_query(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
    {
        if let SimpleQueryMessage::Row(row) = message {
            let cell = |i: usize| -> i64 {
                row.get(i)
                    .and_then(|t| t.parse().ok())
                    .unwrap_or_else(|| panic!("{sql}: an integer cell"))
            };
            histogram.insert((cell(0), cell(1)), cell(2));
        }
    }
    histogram
}

fn demo_policy() -> Policy {
    policy::parse(include_str!("../../policies/demo.yaml"))
        .unwrap_or_else(|e| panic!("the demo policy is valid: {e}"))
}

struct Compiled {
    plan: Plan,
    rewrite: Rewrite,
    mechanisms: Mechanisms,
}

fn compile(sql: &str) -> Compiled {
    compile_under(&demo_policy(), sql)
}

fn compile_under(policy: &Policy, sql: &str) -> Compiled {
    let statements = classify::classify(sql).unwrap_or_else(|e| panic!("{sql}: {e}"));
    let [Statement::Query(query)] = statements.as_slice() else {
        panic!("{sql}: not one query");
    };
    let ctx = Context {
        policy,
        search_path: vec!["demo".into()],
    };
    let plan = analyze::analyze(query, &ctx).unwrap_or_else(|e| panic!("{sql}: {e}"));
    let rewrite = rewrite::rewrite(&plan, &[], SECRET).unwrap_or_else(|e| panic!("{sql}: {e}"));
    let mechanisms =
        release::mechanisms(&plan, &rewrite, BUDGET).unwrap_or_else(|e| panic!("{sql}: {e}"));
    Compiled {
        plan,
        rewrite,
        mechanisms,
    }
}

/// The exact pre-noise result of a rewrite: per group (key texts), the measures and the count of
/// units, as the upstream's text.
type Exact = BTreeMap<Vec<Option<String>>, (Vec<Option<String>>, u64)>;

async fn run_exact(client: &Client, c: &Compiled) -> Exact {
    let k = c.plan.keys().len();
    let m = c.rewrite.measures.len();
    let messages = client
        .simple_query(&c.rewrite.sql)
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", c.rewrite.sql));
    let mut exact = Exact::new();
    for message in messages {
        let SimpleQueryMessage::Row(row) = message else {
            continue;
        };
        assert_eq!(row.len(), k + m + 1, "columns of {}", c.rewrite.sql);
        let cells: Vec<Option<String>> = (0..row.len())
            .map(|i| row.get(i).map(str::to_string))
            .collect();
        let units = cells[k + m]
            .as_deref()
            .and_then(|u| u.parse().ok())
            .expect("the count of units is an integer");
        let previous = exact.insert(cells[..k].to_vec(), (cells[k..k + m].to_vec(), units));
        assert!(previous.is_none(), "one row per group");
    }
    exact
}

/// The neighbouring databases, reduced to what the tests need.
struct Neighbours {
    /// The removed person.
    person_id: i64,
    /// Per query of [`SENSITIVITY_QUERIES`]: the exact results on D and D′.
    sensitivity: Vec<(Exact, Exact)>,
    /// The released count: query and exact values on D and D′.
    count: (String, i128, i128),
    /// The released sum: query and exact values (numeric text) on D and D′.
    sum: (String, String, String),
    /// Per query of [`CHOSEN_QUERIES`]: the contribution histogram (bucket → pairs) on D and
    /// D′, the cap chosen from D's, and the exact answer at that cap on D and D′.
    chosen: Vec<ChosenCase>,
}

/// A query that chooses its cap ([`pgdp::dp::release::bounds`]), on both neighbours.
struct ChosenCase {
    histogram: [BTreeMap<(i64, i64), i64>; 2],
    groups_per_unit: u64,
    groups_ceiling: u64,
    rows_per_unit: u64,
    /// The cap on a unit's rows over all its groups, when chosen.
    rows_total: Option<u64>,
    /// The answer's rewrite at the chosen caps and bounds.
    rewrite: Rewrite,
    /// The chosen caps' L1 sensitivity in rows (`Plan::row_sensitivity`).
    l1_rows: f64,
    ceiling: u64,
    answer: [Exact; 2],
}

static NEIGHBOURS: OnceCell<Neighbours> = OnceCell::const_new();

async fn neighbours() -> &'static Neighbours {
    NEIGHBOURS.get_or_init(load_neighbours).await
}

async fn load_neighbours() -> Neighbours {
    let db = harness::fresh_database("dp_property").await;
    let client = db.client().await;
    pgdp::tools::demo::load(&client, 1, |_| {})
        .await
        .unwrap_or_else(|e| panic!("cannot load the demo dataset: {e}"));
    let heavy = client
        .query_one(
            "SELECT v.person_id, count(*) AS n FROM demo.visits v JOIN demo.people p USING (person_id) \
             GROUP BY v.person_id, p.income ORDER BY n DESC, p.income DESC, v.person_id LIMIT 1",
            &[],
        )
        .await
        .expect("the heavy user");
    let person_id: i64 = heavy.get(0);
    let home: String = client
        .query_one(
            "SELECT clinic FROM demo.visits WHERE person_id = $1 GROUP BY clinic \
             ORDER BY count(*) DESC, clinic LIMIT 1",
            &[&person_id],
        )
        .await
        .expect("the heavy user's clinic")
        .get(0);
    // The clinic literal comes from the generator (C01..C50); quote it anyway.
    let count_sql = format!(
        "SELECT COUNT(*) FROM demo.visits WHERE clinic = '{}'",
        home.replace('\'', "''")
    );
    let sum_sql = "SELECT SUM(income) FROM demo.people".to_string();

    let mut queries: Vec<Compiled> = SENSITIVITY_QUERIES.iter().map(|q| compile(q)).collect();
    queries.push(compile(&count_sql));
    queries.push(compile(&sum_sql));
    let mut on_d = Vec::new();
    for q in &queries {
        on_d.push(run_exact(&client, q).await);
    }
    // Queries that choose their cap: the histogram on D, the cap chosen from it (a fixed seed),
    // and the answer's SQL at that cap, run again on D′ below.
    let mut choosing = Vec::new();
    let mut rng = ChaCha20Rng::seed_from_u64(41);
    for sql in CHOSEN_QUERIES {
        let (compiled, choice) = compile_choosing(sql);
        let histogram = run_histogram(&client, choice.sql.as_str()).await;
        let rows = release::PrivateRows::new(
            histogram
                .iter()
                .map(|((h, b), n)| {
                    vec![
                        Some(h.to_string()),
                        Some(b.to_string()),
                        Some(n.to_string()),
                    ]
                })
                .collect(),
        );
        let chosen =
            release::bounds::choose(&choice.choice, &rows, choice.noise_per_row(), &mut rng)
                .unwrap_or_else(|e| panic!("{sql}: {e}"));
        let (plan, rewrite, mechanisms) = choice
            .answer(
                &compiled.plan,
                &chosen,
                &[],
                SECRET,
                pgdp::dp::rewrite::UpstreamShape::OneServer,
                &demo_policy(),
            )
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
        let at_cap = Compiled {
            plan,
            rewrite,
            mechanisms,
        };
        let answer = run_exact(&client, &at_cap).await;
        choosing.push((choice, at_cap, histogram, answer));
    }
    client
        .batch_execute(&format!(
            "BEGIN; DELETE FROM demo.prescriptions WHERE visit_id IN \
             (SELECT visit_id FROM demo.visits WHERE person_id = {person_id}); \
             DELETE FROM demo.visits WHERE person_id = {person_id}; \
             DELETE FROM demo.people WHERE person_id = {person_id}"
        ))
        .await
        .expect("delete the heavy user");
    let mut on_d2 = Vec::new();
    for q in &queries {
        on_d2.push(run_exact(&client, q).await);
    }
    let mut chosen = Vec::new();
    for (choice, at_cap, histogram, answer) in choosing {
        let histogram2 = run_histogram(&client, choice.sql.as_str()).await;
        let answer2 = run_exact(&client, &at_cap).await;
        chosen.push(ChosenCase {
            histogram: [histogram, histogram2],
            groups_per_unit: at_cap.plan.max_groups_per_unit(),
            groups_ceiling: choice.choice.groups_ceiling(),
            rows_per_unit: at_cap.plan.max_rows_per_unit(),
            rows_total: at_cap.plan.max_rows_total(),
            rewrite: at_cap.rewrite.clone(),
            l1_rows: at_cap.plan.row_sensitivity().0,
            ceiling: choice.choice.ceiling(),
            answer: [answer, answer2],
        });
    }
    client.batch_execute("ROLLBACK").await.expect("rollback");
    drop(client);
    db.drop_db().await;

    let mut pairs: Vec<(Exact, Exact)> = on_d.into_iter().zip(on_d2).collect();
    let single = |e: &Exact| -> String {
        let (measures, _) = e.get(&Vec::new()).expect("an ungrouped query has one row");
        measures[0].clone().unwrap_or_else(|| "0".into())
    };
    let (sum_d, sum_d2) = pairs.pop().expect("sum");
    let (count_d, count_d2) = pairs.pop().expect("count");
    let parse_count = |t: String| -> i128 { t.parse().expect("a count is an integer") };
    Neighbours {
        person_id,
        sensitivity: pairs,
        count: (
            count_sql,
            parse_count(single(&count_d)),
            parse_count(single(&count_d2)),
        ),
        sum: (sum_sql, single(&sum_d), single(&sum_d2)),
        chosen,
    }
}

fn exact_value(text: Option<&String>) -> BigRational {
    match text {
        Some(t) => parse_numeric_exact(t).unwrap_or_else(|e| panic!("{t}: {e}")),
        None => BigRational::zero(),
    }
}

// ---------------------------------------------------------------------------------------------
// 1. Empirical sensitivity
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn claimed_sensitivity_bounds_the_change_from_removing_a_heavy_user() {
    let n = neighbours().await;
    let mut failures = Vec::new();
    for (sql, (d, d2)) in SENSITIVITY_QUERIES.iter().zip(&n.sensitivity) {
        let c = compile(sql);
        let m = c.rewrite.measures.len();
        let keys: BTreeSet<&Vec<Option<String>>> = d.keys().chain(d2.keys()).collect();
        let mut changed = 0u64;
        for key in keys {
            let empty = (vec![None; m], 0u64);
            let (a, units_a) = d.get(key).unwrap_or(&empty);
            let (b, units_b) = d2.get(key).unwrap_or(&empty);
            let mut moved = units_a != units_b;
            if units_a.abs_diff(*units_b) > 1 {
                failures.push(format!("{sql}: group {key:?}: units {units_a} → {units_b}"));
            }
            for (j, measure) in c.rewrite.measures.iter().enumerate() {
                let diff = (exact_value(a[j].as_ref()) - exact_value(b[j].as_ref())).abs();
                let claimed =
                    measure.contribution(&c.rewrite.arguments, c.plan.max_rows_per_unit());
                let bound = rational_from_f64(claimed).expect("finite contribution");
                if diff > bound {
                    failures.push(format!(
                        "{sql}: group {key:?}, {}: changed by {diff}, claimed at most {claimed}",
                        measure.label(&c.rewrite.arguments)
                    ));
                }
                moved |= !diff.is_zero();
            }
            changed += u64::from(moved);
        }
        if changed > c.plan.max_groups_per_unit() {
            failures.push(format!(
                "{sql}: {changed} groups changed, claimed at most {}",
                c.plan.max_groups_per_unit()
            ));
        }
        // The person has visits everywhere these queries look: the check is not vacuous.
        if changed == 0 {
            failures.push(format!(
                "{sql}: removing person {} changed nothing",
                n.person_id
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Queries that choose their caps (docs/privacy.md, "Contribution bounds chosen per query"): on
/// D and D′ the histogram of rows per pair moves by at most the policy's `max_groups_per_unit`
/// pairs in L1 and the histogram of groups per unit by at most 1 (their noises'
/// sensitivities), and the answer at the caps chosen from D's noisy histograms by at most its
/// claimed sensitivity at those caps, in at most the chosen number of groups. Exact integers
/// and rationals: a failure is a bug.
#[tokio::test]
async fn chosen_bounds_stay_within_their_claimed_sensitivity() {
    let n = neighbours().await;
    let mut failures = Vec::new();
    for (sql, case) in CHOSEN_QUERIES.iter().zip(&n.chosen) {
        let [d, d2] = &case.histogram;
        let buckets: BTreeSet<&(i64, i64)> = d.keys().chain(d2.keys()).collect();
        // Histogram 0 (rows per pair) has sensitivity max_groups_per_unit, histogram 1
        // (groups per unit) 1, and with a SUM or AVG the clamp's: 2 (units by their distance
        // outside the bounds: the heavy user may have none, so it may not move) and 3 (units by
        // their clamped sum) 1 each; 4 (units by their rows over all groups) 1; 5 (units by their
        // largest value, in place of 2 when the upper bound is chosen) 1.
        for (part, claimed, moves) in [
            (0, case.groups_ceiling, true),
            (1, 1, true),
            (2, 1, false),
            (3, 1, true),
            (4, 1, true),
            (5, 1, true),
        ] {
            let l1: i64 = buckets
                .iter()
                .filter(|(h, _)| *h == part)
                .map(|b| (d.get(b).unwrap_or(&0) - d2.get(b).unwrap_or(&0)).abs())
                .sum();
            let present = buckets.iter().any(|(h, _)| *h == part);
            if present && ((moves && l1 < 1) || l1 as u64 > claimed) {
                failures.push(format!(
                    "{sql}: histogram {part} moved by {l1}, claimed between 1 and {claimed}"
                ));
            }
        }
        // SUM and AVG of cost choose its upper bound, from histogram 5, within the ceiling.
        if sql.contains("(cost)") {
            if !buckets.iter().any(|(h, _)| *h == 5) {
                failures.push(format!("{sql}: no histogram of each unit's largest cost"));
            }
            let uppers: Vec<f64> = case
                .rewrite
                .arguments
                .iter()
                .filter_map(|a| a.bounds.map(|b| b.upper))
                .collect();
            if uppers.iter().any(|&u| u > 200_000.0) {
                failures.push(format!(
                    "{sql}: an upper bound above the ceiling: {uppers:?}"
                ));
            }
        }
        if case.rows_per_unit > case.ceiling || case.rows_per_unit < 2 {
            failures.push(format!(
                "{sql}: chose {} outside [2, {}]",
                case.rows_per_unit, case.ceiling
            ));
        }
        let [a_d, a_d2] = &case.answer;
        let keys: BTreeSet<&Vec<Option<String>>> = a_d.keys().chain(a_d2.keys()).collect();
        // The measures are the same at any cap; their contributions are the chosen caps' and
        // bounds'.
        let rewrite = &case.rewrite;
        let m = rewrite.measures.len();
        let mut changed = 0u64;
        // Per measure that grows with rows, the change summed over the groups: at most what
        // one row adds times the chosen caps' L1 sensitivity in rows (the total, when chosen).
        let mut moved_in_all = vec![BigRational::zero(); m];
        for key in keys {
            let empty = (vec![None; m], 0u64);
            let (a, _) = a_d.get(key).unwrap_or(&empty);
            let (b, _) = a_d2.get(key).unwrap_or(&empty);
            let mut moved = false;
            for (j, measure) in rewrite.measures.iter().enumerate() {
                let diff = (exact_value(a[j].as_ref()) - exact_value(b[j].as_ref())).abs();
                let claimed = measure.contribution(&rewrite.arguments, case.rows_per_unit);
                let bound = rational_from_f64(claimed).expect("finite contribution");
                if diff > bound {
                    failures.push(format!(
                        "{sql}: group {key:?}, {}: changed by {diff} at cap {}, claimed at most {claimed}",
                        measure.label(&rewrite.arguments),
                        case.rows_per_unit
                    ));
                }
                moved |= !diff.is_zero();
                moved_in_all[j] += diff;
            }
            changed += u64::from(moved);
        }
        for (j, measure) in rewrite.measures.iter().enumerate() {
            if !measure.is_additive() {
                continue;
            }
            let per_row = measure.contribution(&rewrite.arguments, 1);
            let claimed = per_row * case.l1_rows;
            let bound = rational_from_f64(claimed).expect("finite contribution");
            if moved_in_all[j] > bound {
                failures.push(format!(
                    "{sql}: {} changed by {} over all groups at caps {} × {} (total {:?}), claimed at most {claimed}",
                    measure.label(&rewrite.arguments),
                    moved_in_all[j],
                    case.rows_per_unit,
                    case.groups_per_unit,
                    case.rows_total
                ));
            }
        }
        if changed == 0 || changed > case.groups_per_unit {
            failures.push(format!(
                "{sql}: {changed} groups changed at cap {}, claimed between 1 and {}",
                case.rows_per_unit, case.groups_per_unit
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The heavy user moves the released count and sum by exactly one unit's contribution, so the
/// distinguisher below runs at the edge of the guarantee (and half the noise must be caught).
#[tokio::test]
async fn neighbours_are_as_far_apart_as_the_policy_allows() {
    let n = neighbours().await;
    let (count_sql, d, d2) = &n.count;
    let c = compile(count_sql);
    let contribution =
        c.rewrite.measures[0].contribution(&c.rewrite.arguments, c.plan.max_rows_per_unit());
    assert_eq!((d - d2) as f64, contribution, "{count_sql}");
    let (sum_sql, s, s2) = &n.sum;
    let c = compile(sum_sql);
    let contribution =
        c.rewrite.measures[0].contribution(&c.rewrite.arguments, c.plan.max_rows_per_unit());
    let gap = parse_numeric_exact(s).expect("numeric") - parse_numeric_exact(s2).expect("numeric");
    assert_eq!(
        gap,
        rational_from_f64(contribution).expect("finite"),
        "{sum_sql}"
    );
}

// ---------------------------------------------------------------------------------------------
// 2 and 3. The neighbour distinguisher
// ---------------------------------------------------------------------------------------------

/// A mechanism under test: draws one release (as f64) of an exact value.
trait Release: Sync {
    fn draw(&self, rng: &mut ChaCha20Rng, side: usize) -> f64;
}

struct IntegerRelease<'a> {
    noise: &'a Noise,
    exact: [i128; 2],
}

impl Release for IntegerRelease<'_> {
    fn draw(&self, rng: &mut ChaCha20Rng, side: usize) -> f64 {
        self.noise.release_integer(rng, self.exact[side]) as f64
    }
}

struct RealRelease<'a> {
    noise: &'a Noise,
    exact: [&'a str; 2],
}

impl Release for RealRelease<'_> {
    fn draw(&self, rng: &mut ChaCha20Rng, side: usize) -> f64 {
        self.noise
            .release_real(rng, self.exact[side])
            .expect("a real release")
    }
}

/// Bins of width `width` anchored at `anchor`, the outer ones open.
#[derive(Clone, Copy)]
struct Bins {
    anchor: f64,
    width: f64,
}

impl Bins {
    fn count() -> usize {
        (2 * BINS_EACH_SIDE + 1) as usize
    }

    fn index(&self, x: f64) -> usize {
        let i = ((x - self.anchor) / self.width).floor() as i64;
        (i.clamp(-BINS_EACH_SIDE, BINS_EACH_SIDE) + BINS_EACH_SIDE) as usize
    }

    /// Lower edge of bin `i` (−∞ for the first).
    fn lower(&self, i: usize) -> f64 {
        if i == 0 {
            f64::NEG_INFINITY
        } else {
            self.anchor + (i as i64 - BINS_EACH_SIDE) as f64 * self.width
        }
    }

    /// Upper edge of bin `i` (+∞ for the last).
    fn upper(&self, i: usize) -> f64 {
        if i + 1 == Bins::count() {
            f64::INFINITY
        } else {
            self.anchor + (i as i64 + 1 - BINS_EACH_SIDE) as f64 * self.width
        }
    }
}

/// `N` releases on each side, binned; sides run on two threads with fixed seeds.
fn histograms(mechanism: &dyn Release, bins: Bins, seed: u64) -> [Vec<f64>; 2] {
    let run = |side: usize| {
        let mut key = [0u8; 32];
        key[..8].copy_from_slice(&seed.to_le_bytes());
        key[8] = side as u8;
        let mut rng = ChaCha20Rng::from_seed(key);
        let mut counts = vec![0u64; Bins::count()];
        for _ in 0..RELEASES {
            counts[bins.index(mechanism.draw(&mut rng, side))] += 1;
        }
        counts
            .into_iter()
            .map(|c| c as f64 / RELEASES as f64)
            .collect::<Vec<f64>>()
    };
    std::thread::scope(|s| {
        let first = s.spawn(|| run(0));
        let second = run(1);
        [first.join().expect("sampler thread"), second]
    })
}

/// `Σ_x max(0, p̂_a(x) − e^ε p̂_b(x))`.
fn violation(a: &[f64], b: &[f64]) -> f64 {
    let bound = EPSILON.exp();
    a.iter().zip(b).map(|(x, y)| (x - bound * y).max(0.0)).sum()
}

/// The slack for one direction (see the module documentation), from the exact bin
/// probabilities `p_a`, `p_b` of the correct mechanism.
fn slack(p_a: &[f64], p_b: &[f64]) -> f64 {
    let n = RELEASES as f64;
    let e2 = (2.0 * EPSILON).exp();
    let mean_bound: f64 = p_a
        .iter()
        .zip(p_b)
        .map(|(a, b)| ((a + e2 * b) / n).sqrt() / 2.0)
        .sum();
    let deviation = ((1.0 + e2) * (1.0 / ALPHA).ln() / (2.0 * n)).sqrt();
    mean_bound + deviation
}

/// Bin probabilities of `exact + Z`, Z discrete Laplace with scale `b` (integer values).
fn discrete_laplace_bins(bins: Bins, exact: i128, b: f64) -> Vec<f64> {
    let q = (-1.0 / b).exp();
    let norm = (1.0 - q) / (1.0 + q);
    let mut p = vec![0.0; Bins::count()];
    let reach = (80.0 * b).ceil() as i64;
    for z in -reach..=reach {
        p[bins.index((exact + i128::from(z)) as f64)] += norm * q.powi(z.unsigned_abs() as i32);
    }
    p
}

/// Bin probabilities of `exact + Z`, Z continuous Laplace with scale `b`.
fn laplace_bins(bins: Bins, exact: f64, b: f64) -> Vec<f64> {
    let cdf = |x: f64| {
        if x < 0.0 {
            0.5 * (x / b).exp()
        } else {
            1.0 - 0.5 * (-x / b).exp()
        }
    };
    (0..Bins::count())
        .map(|i| cdf(bins.upper(i) - exact) - cdf(bins.lower(i) - exact))
        .collect()
}

/// The statistic in both directions and the slack for each.
struct Outcome {
    statistic: [f64; 2],
    slack: [f64; 2],
}

fn distinguish(mechanism: &dyn Release, bins: Bins, exact_p: [Vec<f64>; 2], seed: u64) -> Outcome {
    let [h0, h1] = histograms(mechanism, bins, seed);
    Outcome {
        statistic: [violation(&h0, &h1), violation(&h1, &h0)],
        slack: [
            slack(&exact_p[0], &exact_p[1]),
            slack(&exact_p[1], &exact_p[0]),
        ],
    }
}

struct Setup {
    count: Compiled,
    count_exact: [i128; 2],
    sum: Compiled,
    sum_exact: [String; 2],
}

async fn setup() -> Setup {
    let n = neighbours().await;
    Setup {
        count: compile(&n.count.0),
        count_exact: [n.count.1, n.count.2],
        sum: compile(&n.sum.0),
        sum_exact: [n.sum.1.clone(), n.sum.2.clone()],
    }
}

fn count_bins(s: &Setup) -> (Bins, [Vec<f64>; 2]) {
    let correct = &s.count.mechanisms.noises[0];
    let bins = Bins {
        anchor: s.count_exact[0].min(s.count_exact[1]) as f64,
        width: correct.scale().round().max(1.0),
    };
    let p = s
        .count_exact
        .map(|e| discrete_laplace_bins(bins, e, correct.scale()));
    (bins, p)
}

fn sum_bins(s: &Setup) -> (Bins, [Vec<f64>; 2]) {
    let correct = &s.sum.mechanisms.noises[0];
    let values = s
        .sum_exact
        .each_ref()
        .map(|t| t.parse::<f64>().expect("numeric text"));
    let bins = Bins {
        anchor: values[0].min(values[1]),
        width: correct.scale(),
    };
    let p = values.map(|v| laplace_bins(bins, v, correct.scale()));
    (bins, p)
}

#[tokio::test]
async fn released_count_and_sum_pass_the_neighbour_distinguisher() {
    let s = setup().await;
    let count_noise = &s.count.mechanisms.noises[0];
    let (bins, p) = count_bins(&s);
    let count = distinguish(
        &IntegerRelease {
            noise: count_noise,
            exact: s.count_exact,
        },
        bins,
        p,
        1,
    );
    let sum_noise = &s.sum.mechanisms.noises[0];
    let (bins, p) = sum_bins(&s);
    let sum = distinguish(
        &RealRelease {
            noise: sum_noise,
            exact: [&s.sum_exact[0], &s.sum_exact[1]],
        },
        bins,
        p,
        2,
    );
    for (what, o) in [("count", &count), ("sum", &sum)] {
        for d in 0..2 {
            assert!(
                o.statistic[d] < o.slack[d],
                "{what}, direction {d}: statistic {} ≥ slack {}",
                o.statistic[d],
                o.slack[d]
            );
        }
    }
}

#[tokio::test]
async fn distinguisher_catches_half_the_noise() {
    let s = setup().await;
    let m = &s.count.mechanisms;
    let broken_count =
        Noise::laplace(m.sensitivities[0] / 2.0, m.epsilon_per_measure).expect("valid");
    let (bins, p) = count_bins(&s);
    let count = distinguish(
        &IntegerRelease {
            noise: &broken_count,
            exact: s.count_exact,
        },
        bins,
        p,
        3,
    );
    let m = &s.sum.mechanisms;
    let broken_sum =
        Noise::laplace_real(m.sensitivities[0] / 2.0, m.epsilon_per_measure, 1).expect("valid");
    let (bins, p) = sum_bins(&s);
    let sum = distinguish(
        &RealRelease {
            noise: &broken_sum,
            exact: [&s.sum_exact[0], &s.sum_exact[1]],
        },
        bins,
        p,
        4,
    );
    for (what, o) in [("count", &count), ("sum", &sum)] {
        let worst = (0..2).any(|d| o.statistic[d] > o.slack[d]);
        assert!(
            worst,
            "{what}: half the noise went undetected: statistics {:?}, slacks {:?}",
            o.statistic, o.slack
        );
    }
}
