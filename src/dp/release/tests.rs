//! The split of the release into [`measure`] (noise and selection) and [`finish`]
//! (post-processing), and the [`measures_key`] that lets a later query reuse the noisy measures:
//! plans from analysed SQL over the demo policy, upstream rows written by hand, seeded noise.
//! The layering test lets a `tests.rs` classify SQL as the session does.

use crate::budget::Stored;
use crate::dp::plan::Context;
use crate::dp::rewrite::{self, Rewrite};
use crate::output::Cell;
use crate::policy::Policy;
use crate::session::classify::{classify, Statement};

use super::*;

/// A seeded generator: each test always passes or always fails.
fn seeded(seed: u64) -> rand::rngs::ChaCha20Rng {
    rand::SeedableRng::seed_from_u64(seed)
}

const DEMO_YAML: &str = include_str!("../../../policies/demo.yaml");
const SECRET: &str = "split-test-secret";
const LAPLACE: Budget = Budget {
    epsilon: 1.0,
    delta: 1e-5,
    mechanism: Mechanism::Laplace,
};

fn policy() -> Policy {
    crate::policy::parse(DEMO_YAML).expect("the demo policy validates")
}

/// Plan, rewrite and mechanisms of `sql` at `budget`, with the key of its noisy measures.
fn prepared(policy: &Policy, sql: &str, budget: Budget) -> (Plan, Rewrite, Mechanisms, String) {
    let ctx = Context {
        policy,
        search_path: vec!["demo".into()],
    };
    let mut statements = classify(sql).expect("classifies");
    let Statement::Query(query) = statements.remove(0) else {
        panic!("{sql} is not a query");
    };
    let plan = crate::dp::analyze::analyze(&query, &ctx).expect("analyses");
    let rewrite = rewrite::rewrite(&plan, &[], SECRET).expect("rewrites");
    let mechanisms = mechanisms(&plan, &rewrite, budget).expect("mechanisms");
    let domain = if plan.keys_public() {
        rewrite::domain::public_domain(&plan, &[]).expect("public domain")
    } else {
        Vec::new()
    };
    let key = measures_key(&plan, &rewrite, &mechanisms, &[], &domain);
    (plan, rewrite, mechanisms, key)
}

/// The public domain of a plan whose keys are all listed in the policy.
fn listed_domain(plan: &Plan) -> PublicDomains {
    rewrite::domain::public_domain(plan, &[])
        .expect("public domain")
        .into_iter()
        .map(|part| part.into_combinations(None).expect("listed values"))
        .collect()
}

/// Upstream rows for a grouped query: each key text, every measure `value`, then the units.
fn upstream(rewrite: &Rewrite, groups: &[(&str, i64)]) -> PrivateRows {
    PrivateRows::new(
        groups
            .iter()
            .map(|(key, value)| {
                let mut row = vec![Some(key.to_string())];
                row.extend(rewrite.measures.iter().map(|_| Some(value.to_string())));
                row.push(Some(value.to_string()));
                row
            })
            .collect(),
    )
}

const BY_REGION: &str = "SELECT region, COUNT(*) FROM demo.people GROUP BY region";

#[test]
fn release_is_measure_then_finish() {
    let policy = policy();
    let (plan, rewrite, mechanisms, _) = prepared(&policy, BY_REGION, LAPLACE);
    let domains = listed_domain(&plan);
    let rows = upstream(&rewrite, &[("CE", 14000), ("EA", 9000)]);
    let whole = release(
        &plan,
        &rewrite,
        &mechanisms,
        &rows,
        &domains,
        false,
        &mut seeded(7),
    )
    .expect("release");
    let measures = measure(
        &plan,
        &rewrite,
        &mechanisms,
        &rows,
        &domains,
        &mut seeded(7),
    )
    .expect("measure");
    assert_eq!(measures.len(), 10, "every listed region, present or not");
    let finished = finish(&plan, &rewrite, &mechanisms, &measures, false).expect("finish");
    assert_eq!(finished, whole);
    // Finishing is a function of the measures alone: again, the same rows.
    assert_eq!(
        finish(&plan, &rewrite, &mechanisms, &measures, false).expect("finish again"),
        whole
    );
}

#[test]
fn post_processing_variants_share_the_measures_and_read_the_same_noisy_values() {
    let policy = policy();
    let (plan, rewrite, mechanisms, key) = prepared(&policy, BY_REGION, LAPLACE);
    let rows = upstream(&rewrite, &[("CE", 14000), ("EA", 9000), ("NO", 3)]);
    let measures = measure(
        &plan,
        &rewrite,
        &mechanisms,
        &rows,
        &listed_domain(&plan),
        &mut seeded(11),
    )
    .expect("measure");
    let first = finish(&plan, &rewrite, &mechanisms, &measures, false).expect("finish");
    let value_of = |rows: &[Vec<Cell>], region: &str, key: usize, value: usize| -> Cell {
        rows.iter()
            .find(|r| r[key] == Cell::Text(region.into()))
            .map(|r| r[value].clone())
            .expect("region released")
    };
    let variant = "select COUNT(*) AS n,   region FROM demo.people GROUP BY region HAVING COUNT(*) > 5000 ORDER BY n DESC LIMIT 1";
    let (plan_b, rewrite_b, mechanisms_b, key_b) = prepared(&policy, variant, LAPLACE);
    assert_eq!(rewrite_b.sql.as_str(), rewrite.sql.as_str());
    assert_eq!(
        key_b, key,
        "HAVING, ORDER BY, LIMIT, alias, case and spacing"
    );
    let b = finish(&plan_b, &rewrite_b, &mechanisms_b, &measures, false).expect("finish B");
    assert_eq!(b.rows().len(), 1, "LIMIT 1 of the regions above 5000");
    assert_eq!(
        b.rows()[0][1],
        Cell::Text("CE".into()),
        "the larger noisy count"
    );
    assert_eq!(b.rows()[0][0], value_of(first.rows(), "CE", 0, 1));
    // The accuracy columns are post-processing too.
    let accurate = finish(&plan, &rewrite, &mechanisms, &measures, true).expect("accuracy");
    assert_eq!(accurate.rows()[0].len(), 3);
    assert_eq!(accurate.rows()[0][1], first.rows()[0][1]);

    // What changes the noisy values changes the key.
    for other in [
        "SELECT region, COUNT(*) FROM demo.people WHERE age > 30 GROUP BY region",
        "SELECT sex, COUNT(*) FROM demo.people GROUP BY sex",
        "SELECT region, COUNT(*), SUM(income) FROM demo.people GROUP BY region",
    ] {
        let (_, _, _, k) = prepared(&policy, other, LAPLACE);
        assert_ne!(k, key, "{other}");
    }
    let half = Budget {
        epsilon: 0.5,
        ..LAPLACE
    };
    assert_ne!(prepared(&policy, BY_REGION, half).3, key, "another ε");
    let gaussian = Budget {
        mechanism: Mechanism::Gaussian,
        ..LAPLACE
    };
    assert_ne!(
        prepared(&policy, BY_REGION, gaussian).3,
        key,
        "another family"
    );
    let delta = Budget {
        delta: 1e-6,
        ..LAPLACE
    };
    assert_ne!(prepared(&policy, BY_REGION, delta).3, key, "another δ");
}

#[test]
fn bounds_are_part_of_the_key() {
    let policy = policy();
    let sum = "SELECT region, SUM(income) FROM demo.people GROUP BY region";
    let (_, _, _, key) = prepared(&policy, sum, LAPLACE);
    let narrower = crate::policy::parse(&DEMO_YAML.replace(
        "income:    { type: numeric, lower: 0, upper: 250000 }",
        "income:    { type: numeric, lower: 0, upper: 100000 }",
    ))
    .expect("narrower bounds validate");
    assert_ne!(prepared(&narrower, sum, LAPLACE).3, key);
}

#[test]
fn groups_dropped_by_partition_selection_are_not_kept() {
    let policy = policy();
    let sql = "SELECT diagnosis, COUNT(DISTINCT person_id) FROM demo.visits GROUP BY diagnosis";
    let (plan, rewrite, mechanisms, _) = prepared(&policy, sql, LAPLACE);
    assert!(mechanisms.selection.is_some());
    let rows = upstream(&rewrite, &[("common", 5000), ("rare", 1)]);
    let measures = measure(
        &plan,
        &rewrite,
        &mechanisms,
        &rows,
        &PublicDomains::new(),
        &mut seeded(3),
    )
    .expect("measure");
    let keys: Vec<_> = measures.groups.iter().map(|(k, _)| k.clone()).collect();
    assert_eq!(keys, vec![vec![Some("common".to_string())]]);
    // What is stored is what was kept, and it reads back for the same plan only.
    let back = NoisyMeasures::from_payload(&Stored::for_tests(measures.payload()), &plan, &rewrite)
        .expect("reads");
    assert_eq!(back, measures);
    let (other_plan, other_rewrite, _, _) =
        prepared(&policy, "SELECT COUNT(*) FROM demo.people", LAPLACE);
    assert_eq!(
        NoisyMeasures::from_payload(
            &Stored::for_tests(measures.payload()),
            &other_plan,
            &other_rewrite
        )
        .map(|m| m.len()),
        None,
        "another shape of measures is not reused"
    );
}

/// Grouping sets (issue 15) that are not derived: every set is its own release with an equal share of ε, the charge
/// is their sum (the query's ε), the rows of every set come back (rolled-up keys NULL, GROUPING
/// from the set), and a set with private keys releases only what its own selection keeps.
#[test]
fn grouping_sets_release_every_set_and_charge_their_sum() {
    let policy = policy();
    // A distinct count does not add up over cells, so the sets are not derived from the finest.
    let sql = "SELECT sex, COUNT(DISTINCT person_id), GROUPING(sex) AS g FROM demo.people GROUP BY GROUPING SETS ((sex), (), (sex))";
    let (plan, rewrite, mechanisms, _) = prepared(&policy, sql, LAPLACE);
    assert_eq!(mechanisms.sets.len(), 3);
    for set in &mechanisms.sets {
        assert!((set.budget.epsilon - 1.0 / 3.0).abs() < 1e-15);
        // A count of people has sensitivity 1: the scale of a third of ε is 3.
        assert!(
            (set.noises[0].scale() - 3.0).abs() < 1e-9,
            "{}",
            set.noises[0].scale()
        );
    }
    assert_eq!(mechanisms.cost.epsilon.to_string(), "1");
    assert_eq!(mechanisms.cost.delta.to_string(), "0");
    // Upstream rows: set index, the key (NULL outside the set), the count, the units.
    let row = |set: &str, key: Option<&str>, n: &str| {
        vec![
            Some(set.to_string()),
            key.map(str::to_string),
            Some(n.to_string()),
            Some(n.to_string()),
        ]
    };
    let rows = PrivateRows::new(vec![
        row("0", Some("F"), "50000"),
        row("0", Some("M"), "49000"),
        row("1", None, "99000"),
        row("2", Some("F"), "50000"),
        row("2", Some("M"), "49000"),
    ]);
    let released = release(
        &plan,
        &rewrite,
        &mechanisms,
        &rows,
        &listed_domain(&plan),
        false,
        &mut seeded(7),
    )
    .expect("releases");
    // The public list of sex (F, M, X) twice, and the total; sorted by key, NULLs last, then set.
    let keys: Vec<(Cell, Cell)> = released
        .rows()
        .iter()
        .map(|r| (r[0].clone(), r[2].clone()))
        .collect();
    let text = |s: &str| Cell::Text(s.into());
    assert_eq!(
        keys,
        [
            (text("F"), Cell::Int(0)),
            (text("F"), Cell::Int(0)),
            (text("M"), Cell::Int(0)),
            (text("M"), Cell::Int(0)),
            (text("X"), Cell::Int(0)),
            (text("X"), Cell::Int(0)),
            (Cell::Null, Cell::Int(1)),
        ]
    );
    // Duplicate sets are separate releases: their noise differs (with this seed).
    assert_ne!(released.rows()[0][1], released.rows()[1][1]);
    let Cell::Int(total) = released.rows()[6][1] else {
        panic!("a count");
    };
    assert!((total - 99000).abs() < 200, "{total}");
}

#[test]
fn grouping_sets_with_private_keys_select_each_set() {
    let policy = policy();
    let sql =
        "SELECT diagnosis, COUNT(DISTINCT person_id) FROM demo.visits GROUP BY ROLLUP (diagnosis)";
    let (plan, rewrite, mechanisms, _) = prepared(&policy, sql, LAPLACE);
    assert!(mechanisms.sets[0].selection.is_some());
    assert!(mechanisms.sets[1].selection.is_none());
    // Only the set that selects spends δ: half of it.
    assert_eq!(mechanisms.cost.epsilon.to_string(), "1");
    let delta = mechanisms.cost.delta.to_f64();
    assert!((delta - 5e-6).abs() < 1e-15, "{delta}");
    let row = |set: &str, key: Option<&str>, n: &str| {
        let mut r = vec![Some(set.to_string()), key.map(str::to_string)];
        r.extend(rewrite.measures.iter().map(|_| Some(n.to_string())));
        r.push(Some(n.to_string()));
        r
    };
    // One group of a single person, one large group, and the total.
    let rows = PrivateRows::new(vec![
        row("0", Some("Z99"), "1"),
        row("0", Some("J06"), "30000"),
        row("1", None, "30001"),
    ]);
    let released = release(
        &plan,
        &rewrite,
        &mechanisms,
        &rows,
        &Vec::new(),
        false,
        &mut seeded(3),
    )
    .expect("releases");
    let keys: Vec<Cell> = released.rows().iter().map(|r| r[0].clone()).collect();
    assert_eq!(keys, [Cell::Text("J06".into()), Cell::Null]);
}

/// Grouping sets with Gaussian noise: each set's measures are ρ-zCDP at its share, and the
/// charge is the sum of the sets' ρ (and of the δ of their selections).
#[test]
fn grouping_sets_with_gaussian_noise_charge_the_sum_of_the_sets() {
    let policy = policy();
    let gaussian = Budget {
        mechanism: Mechanism::Gaussian,
        ..LAPLACE
    };
    let sql = "SELECT diagnosis, COUNT(*) FROM demo.visits GROUP BY ROLLUP (diagnosis)";
    let (plan, rewrite, mechanisms, _) = prepared(&policy, sql, gaussian);
    assert_eq!(mechanisms.sets.len(), 2);
    let sum = mechanisms
        .sets
        .iter()
        .fold(crate::budget::Cost::ZERO, |s, m| s + m.cost);
    assert!(!mechanisms.cost.rho.is_zero());
    assert_eq!(mechanisms.cost.rho, sum.rho);
    assert!(mechanisms.cost.epsilon <= sum.epsilon);
    assert!(mechanisms.sets[0].selection.is_some() && mechanisms.sets[1].selection.is_none());
    assert!(!explain(&plan, &rewrite, &mechanisms, gaussian)
        .iter()
        .filter(|l| l.contains("grouping set "))
        .count()
        .eq(&0));
}

#[test]
fn a_sum_with_avg_of_the_same_column_is_derived_from_its_measures() {
    let policy = policy();
    let sql = "SELECT SUM(income), AVG(income) FROM demo.people";
    let (plan, rewrite, mechanisms, _) = prepared(&policy, sql, LAPLACE);
    // Two measures (count, centred sum), two shares: the sum has no noise of its own.
    assert_eq!(rewrite.measures.len(), 2);
    assert_eq!(mechanisms.shares, 2);
    assert_eq!(rewrite.aggregate_measures[0], rewrite.aggregate_measures[1]);
    // Noisy count 10, noisy centred sum −50,000 (income bounds [0, 250000], midpoint 125,000):
    // SUM = −50,000 + 125,000 × 10, AVG = 125,000 − 5,000.
    let measures = NoisyMeasures {
        keys: 0,
        measures: 2,
        groups: vec![(Vec::new(), vec![10.0, -50_000.0])],
        derivation: None,
    };
    let released = finish(&plan, &rewrite, &mechanisms, &measures, true).expect("finishes");
    let row = &released.rows[0];
    assert_eq!(row[0], Cell::Float(1_200_000.0));
    assert_eq!(row[2], Cell::Float(120_000.0));
    // The sum's 95 % bound adds the parts' 97.5 % bounds.
    let b = |j: usize| mechanisms.noises[j].error_bound(0.025).expect("bound");
    assert_eq!(row[1], Cell::Float(b(1) + 125_000.0 * b(0)));
    let lines = explain(&plan, &rewrite, &mechanisms, LAPLACE);
    assert!(
        lines
            .iter()
            .any(|l| l.contains("= centered sum + midpoint x count")),
        "{lines:?}"
    );
}

#[test]
fn a_gaussian_count_of_units_is_thresholded_without_an_epsilon_share() {
    let policy = policy();
    let gaussian = Budget {
        epsilon: 1.0,
        delta: 1e-7,
        mechanism: Mechanism::Gaussian,
    };
    let sql = "SELECT diagnosis, COUNT(DISTINCT person_id) FROM demo.visits GROUP BY diagnosis";
    let (plan, rewrite, mechanisms, key) = prepared(&policy, sql, gaussian);
    let selection = mechanisms.selection.as_ref().expect("selection");
    assert_eq!(mechanisms.selection_measure, Some(0));
    assert_eq!(
        selection.kind(),
        crate::dp::mechanism::MechanismKind::Gaussian
    );
    assert_eq!(selection.scale(), mechanisms.noises[0].scale());
    assert_eq!(mechanisms.shares, 1);
    // Charged ρ and δ only: no pure ε.
    assert!(mechanisms.cost.epsilon.is_zero() && !mechanisms.cost.rho.is_zero());
    assert_eq!(
        mechanisms.cost.delta,
        crate::budget::Fixed::from_f64_ceil(1e-7).expect("δ")
    );
    // Its measures are not those of the Laplace release.
    let (_, _, _, laplace_key) = prepared(
        &policy,
        sql,
        Budget {
            delta: 1e-7,
            ..LAPLACE
        },
    );
    assert_ne!(key, laplace_key);
    // A group with one unit is kept only if its noisy count reaches the threshold; every kept
    // group's released count is the noisy count that decided.
    let rows = upstream(&rewrite, &[("A00", 1), ("B00", 5000)]);
    let released = measure(
        &plan,
        &rewrite,
        &mechanisms,
        &rows,
        &Vec::new(),
        &mut seeded(7),
    )
    .expect("measures");
    for (_, noisy) in &released.groups {
        assert!(noisy[0] >= selection.threshold() as f64);
    }
    assert!(released
        .groups
        .iter()
        .any(|(k, _)| k[0].as_deref() == Some("B00")));
    let lines = explain(&plan, &rewrite, &mechanisms, gaussian);
    assert!(
        lines
            .iter()
            .any(|l| l.contains("Gaussian thresholding of the released count")),
        "{lines:?}"
    );
}

/// With Gaussian noise and no released count of units, partition selection draws its own
/// count of units as one more ρ share (Gaussian thresholding): the query is charged ρ and δ
/// only, and the selection's σ is that of a count of L2 sensitivity √G at ρ/(m + 1).
#[test]
fn a_gaussian_selection_of_its_own_takes_a_rho_share_not_an_epsilon_share() {
    let policy = policy();
    let gaussian = Budget {
        epsilon: 1.0,
        delta: 1e-7,
        mechanism: Mechanism::Gaussian,
    };
    let sql = "SELECT diagnosis, AVG(cost) FROM demo.visits GROUP BY diagnosis";
    let (plan, rewrite, mechanisms, _) = prepared(&policy, sql, gaussian);
    let selection = mechanisms.selection.as_ref().expect("selection");
    assert_eq!(mechanisms.selection_measure, None);
    assert_eq!(
        selection.kind(),
        crate::dp::mechanism::MechanismKind::Gaussian
    );
    // AVG: a count and a centered sum, and the selection: three ρ shares.
    assert_eq!(rewrite.measures.len(), 2);
    assert_eq!(mechanisms.shares, 3);
    assert!(mechanisms.cost.epsilon.is_zero() && !mechanisms.cost.rho.is_zero());
    assert_eq!(
        mechanisms.cost.delta,
        crate::budget::Fixed::from_f64_ceil(1e-7).expect("δ")
    );
    // The released count (L2 sensitivity √G·C, C the row cap) and the selection's count of
    // units (√G) have the same ρ share: their σ are in the ratio C.
    let groups = plan.max_groups_per_unit as f64;
    let rho_share = groups / (2.0 * selection.scale() * selection.scale());
    let count = mechanisms.noises[0].scale();
    let rows = plan.max_rows_per_unit as f64;
    let count_rho = groups * rows * rows / (2.0 * count * count);
    assert!(
        (rho_share / count_rho - 1.0).abs() < 1e-6,
        "{rho_share} {count_rho}"
    );
    // The three shares add up to the charged ρ (up to its rounding up).
    let charged = mechanisms.cost.rho.to_f64();
    assert!(3.0 * rho_share <= charged * (1.0 + 1e-9) && charged <= 3.0 * rho_share * 1.001);
    // A one-unit group is kept with probability at most δ/G: below every threshold by far.
    assert!(selection.threshold() > 10);
    let lines = explain(&plan, &rewrite, &mechanisms, gaussian);
    assert!(
        lines
            .iter()
            .any(|l| l.contains("Gaussian thresholding,") && l.contains("its own rho share")),
        "{lines:?}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("rho split equally over 3 share(s)")),
        "{lines:?}"
    );
}

#[test]
fn auto_takes_the_mechanism_with_the_smaller_stated_errors() {
    let policy = policy();
    let auto = Budget {
        mechanism: Mechanism::Auto,
        ..LAPLACE
    };
    let mean = |m: &Mechanisms| {
        let logs: f64 = m
            .noises
            .iter()
            .map(|n| n.error_bound(0.05).expect("bound").ln())
            .sum();
        (logs / m.noises.len() as f64).exp()
    };
    // One count per person: Laplace's bound (±3) is well below Gaussian's.
    let (_, _, people, _) = prepared(&policy, "SELECT COUNT(*) FROM demo.people", auto);
    assert_eq!(people.budget.mechanism, Mechanism::Laplace);
    // Four measures of visits per clinic, five clinics per person: L2 sensitivity grows as √5
    // and the Gaussian split as √4, so Gaussian states smaller errors.
    let sql = "SELECT clinic, COUNT(*), AVG(cost), STDDEV(cost) FROM demo.visits GROUP BY clinic";
    let (plan, rewrite, chosen, _) = prepared(&policy, sql, auto);
    assert_eq!(chosen.budget.mechanism, Mechanism::Gaussian);
    let (_, _, laplace, _) = prepared(&policy, sql, LAPLACE);
    let gaussian_budget = Budget {
        mechanism: Mechanism::Gaussian,
        ..LAPLACE
    };
    let (_, _, gaussian, _) = prepared(&policy, sql, gaussian_budget);
    assert!(mean(&gaussian) < mean(&laplace));
    // The chosen mechanisms are exactly the Gaussian ones: same noises and charge.
    assert_eq!(chosen.noises, gaussian.noises);
    assert_eq!(chosen.cost, gaussian.cost);
    let choice = chosen.choice.expect("a recorded choice");
    assert_eq!(choice.gaussian, Some(mean(&gaussian)));
    let lines = explain(&plan, &rewrite, &chosen, chosen.budget);
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("mechanism chosen by pgdp (pgdp.mechanism = auto): gaussian")),
        "{lines:?}"
    );
    // A quantile cannot be Gaussian: auto takes Laplace.
    let (_, _, median, _) = prepared(&policy, "SELECT MEDIAN(age) FROM demo.people", auto);
    assert_eq!(median.budget.mechanism, Mechanism::Laplace);
    assert_eq!(median.choice.expect("choice").gaussian, None);
    // An explicit mechanism is never second-guessed.
    assert!(laplace.choice.is_none());
}

/// Upstream rows of the finest set (index `set`) of a plan with grouping sets: the set index,
/// each key's text, every measure `value`, then the units.
fn finest_rows(rewrite: &Rewrite, set: &str, groups: &[(&[&str], i64)]) -> PrivateRows {
    PrivateRows::new(
        groups
            .iter()
            .map(|(keys, value)| {
                let mut row = vec![Some(set.to_string())];
                row.extend(keys.iter().map(|k| Some(k.to_string())));
                row.extend(rewrite.measures.iter().map(|_| Some(value.to_string())));
                row.push(Some(value.to_string()));
                row
            })
            .collect(),
    )
}

/// Issue 15: ROLLUP over public keys with measures that add up is one release, of the finest
/// set at the whole ε, and every subtotal and the total are sums of its cells, with the error
/// of such sums.
#[test]
fn rollup_over_public_keys_derives_subtotals_from_the_finest_set() {
    let policy = policy();
    let sql =
        "SELECT sex, region, COUNT(*), SUM(income) FROM demo.people GROUP BY ROLLUP (sex, region)";
    let (plan, rewrite, mechanisms, _) = prepared(&policy, sql, LAPLACE);
    assert_eq!(grouping::derived_set(&plan, &rewrite), Some(0));
    // Charged once, the whole ε; the upstream reads the finest set's branch alone.
    assert_eq!(mechanisms.cost.epsilon.to_string(), "1");
    assert!(!rewrite.sql.as_str().contains("UNION ALL"));
    assert!(rewrite.sql.as_str().starts_with("SELECT 0 AS __dp_set"));
    // Every set reads the finest set's noises, at the whole ε: a count of scale 1/ε share.
    assert_eq!(mechanisms.sets.len(), 3);
    for m in &mechanisms.sets {
        assert_eq!(m.noises, mechanisms.sets[0].noises);
    }
    let rows = finest_rows(
        &rewrite,
        "0",
        &[
            (&["F", "CE"], 1000),
            (&["F", "EA"], 2000),
            (&["M", "CE"], 500),
        ],
    );
    let measures = measure(
        &plan,
        &rewrite,
        &mechanisms,
        &rows,
        &listed_domain(&plan),
        &mut seeded(5),
    )
    .expect("measure");
    // 3 × 10 cells, 3 subtotals, 1 total.
    assert_eq!(measures.len(), 34);
    let set_of = |g: &(Vec<Option<String>>, Vec<f64>)| g.0[2].clone().expect("set");
    let cells: Vec<_> = measures
        .groups
        .iter()
        .filter(|g| set_of(g) == "0")
        .collect();
    let m = rewrite.measures.len();
    for (g, group) in measures.groups.iter().enumerate() {
        let parts: Vec<_> = match set_of(group).as_str() {
            "0" => continue,
            "1" => cells.iter().filter(|c| c.0[0] == group.0[0]).collect(),
            _ => cells.iter().collect(),
        };
        for j in 0..m {
            let sum: f64 = parts.iter().map(|c| c.1[j]).sum();
            assert_eq!(group.1[j], sum, "group {:?} measure {j}", group.0);
        }
        let d = measures.derivation.as_ref().expect("derived");
        assert_eq!(d.cells[g], parts.len() as u64);
        let n = &mechanisms.sets[0].noises[0];
        assert_eq!(
            d.bounds[g].0[0],
            n.sum_error_bound(parts.len() as u64, 0.05).expect("bound")
        );
    }
    // The total of the counts is the sum of the subtotals too, and the answer shows it.
    let released = finish(&plan, &rewrite, &mechanisms, &measures, true).expect("finish");
    let count_of = |r: &Vec<Cell>| match r[2] {
        Cell::Int(i) => i,
        ref other => panic!("{other:?}"),
    };
    let subtotals: Vec<&Vec<Cell>> = released
        .rows()
        .iter()
        .filter(|r| r[0] != Cell::Null && r[1] == Cell::Null)
        .collect();
    assert_eq!(subtotals.len(), 3);
    let total = released
        .rows()
        .iter()
        .find(|r| r[0] == Cell::Null)
        .expect("the total");
    let unclamped: f64 = cells.iter().map(|c| c.1[0]).sum();
    assert_eq!(count_of(total), unclamped.round().max(0.0) as i64);
    // The total's stated error is that of a sum of 30 noises.
    assert_eq!(
        total[3],
        Cell::Float(
            mechanisms.sets[0].noises[0]
                .sum_error_bound(30, 0.05)
                .expect("bound")
        )
    );
    let lines = explain(&plan, &rewrite, &mechanisms, LAPLACE);
    assert!(
        lines
            .iter()
            .any(|l| l.contains("grouping set 3 (): sums of the cells of grouping set 1")),
        "{lines:?}"
    );
    // With a private key, or a measure that does not add up, each set is its own release.
    for sql in [
        "SELECT diagnosis, COUNT(*) FROM demo.visits GROUP BY ROLLUP (diagnosis)",
        "SELECT sex, COUNT(DISTINCT person_id) FROM demo.people GROUP BY ROLLUP (sex)",
        "SELECT sex, MEDIAN(age) FROM demo.people GROUP BY ROLLUP (sex)",
        "SELECT sex, region, COUNT(*) FROM demo.people GROUP BY GROUPING SETS ((sex), (region))",
    ] {
        let (plan, rewrite, mechanisms, _) = prepared(&policy, sql, LAPLACE);
        assert_eq!(grouping::derived_set(&plan, &rewrite), None, "{sql}");
        assert!(rewrite.sql.as_str().contains("UNION ALL"), "{sql}");
        assert!(mechanisms.sets.len() >= 2);
    }
}

/// Issue 16 part 3: a release over public keys stores, for each coarser grouping, the sums of
/// its cells under exactly the key the coarser query computes; queries that differ in filter,
/// bounds, ε or keys compute other keys; measures that do not add up are not derived.
#[test]
fn a_coarser_grouping_is_derived_under_the_key_of_the_coarser_query() {
    let policy = policy();
    let fine = "SELECT sex, region, COUNT(*), AVG(income) FROM demo.people WHERE age > 30 GROUP BY sex, region";
    let (plan, rewrite, mechanisms, fine_key) = prepared(&policy, fine, LAPLACE);
    assert_eq!(
        derive::coarser_groupings(&plan, &rewrite),
        vec![vec![], vec![0], vec![1]]
    );
    let rows = PrivateRows::new(
        [("F", "CE", 10), ("F", "EA", 20), ("M", "CE", 5)]
            .iter()
            .map(|(a, b, v)| {
                let mut row = vec![Some(a.to_string()), Some(b.to_string())];
                row.extend(rewrite.measures.iter().map(|_| Some(v.to_string())));
                row.push(Some(v.to_string()));
                row
            })
            .collect(),
    );
    let measures = measure(
        &plan,
        &rewrite,
        &mechanisms,
        &rows,
        &listed_domain(&plan),
        &mut seeded(9),
    )
    .expect("measure");
    let entries = derive::coarser_releases(
        &plan,
        &rewrite,
        &mechanisms,
        &measures,
        &[],
        SECRET,
        crate::dp::rewrite::UpstreamShape::OneServer,
        &policy,
    );
    assert_eq!(entries.len(), 3);
    // Another select list and post-processing, the same aggregates in the same order (the
    // order of the measures is part of the key, as for reuse).
    let coarse = "SELECT COUNT(*) AS n, region, AVG(income) AS mean FROM demo.people WHERE age > 30 GROUP BY region HAVING COUNT(*) > 3 ORDER BY 3";
    let (cplan, crewrite, cmechanisms, ckey) = prepared(&policy, coarse, LAPLACE);
    let derived_key = derived_key(&ckey);
    assert_ne!(derived_key, ckey);
    let (_, derived) = entries
        .iter()
        .find(|(k, _)| *k == derived_key)
        .expect("the coarser query's key");
    assert_eq!(derived.derived_from(), Some("people.sex, people.region"));
    assert_eq!(derived.cells_max(), 3);
    // Each region is the sum of its three cells (F, M, X), measure by measure.
    assert_eq!(derived.len(), 10);
    for (keys, values) in &derived.groups {
        let parts: Vec<&Vec<f64>> = measures
            .groups
            .iter()
            .filter(|(k, _)| k[1] == keys[0])
            .map(|(_, v)| v)
            .collect();
        assert_eq!(parts.len(), 3);
        for (j, v) in values.iter().enumerate() {
            assert_eq!(*v, parts.iter().map(|p| p[j]).sum::<f64>());
        }
    }
    // The coarser query finishes them like its own, with the error of sums of 3 noises.
    let released = finish(&cplan, &crewrite, &cmechanisms, derived, true).expect("finish");
    assert!(!released.rows().is_empty());
    let payload = derived.payload();
    assert_eq!(
        NoisyMeasures::from_payload(&Stored::for_tests(payload.clone()), &cplan, &crewrite)
            .as_ref(),
        Some(derived)
    );
    // The grand total too.
    let (_, _, _, total_key) = prepared(
        &policy,
        "SELECT COUNT(*), AVG(income) FROM demo.people WHERE age > 30",
        LAPLACE,
    );
    assert!(entries
        .iter()
        .any(|(k, _)| *k == derived_key_of(&total_key)));
    // Other filters, bounds, ε or keys: other keys.
    let other = |sql: &str, budget: Budget| derived_key_of(&prepared(&policy, sql, budget).3);
    let keys: Vec<&String> = entries.iter().map(|(k, _)| k).collect();
    for (sql, budget) in [
        ("SELECT region, COUNT(*), AVG(income) FROM demo.people WHERE age > 31 GROUP BY region", LAPLACE),
        ("SELECT region, COUNT(*), AVG(LEAST(income, 1000)) FROM demo.people WHERE age > 30 GROUP BY region", LAPLACE),
        ("SELECT region, COUNT(*), AVG(income) FROM demo.people WHERE age > 30 GROUP BY region", Budget { epsilon: 0.5, ..LAPLACE }),
        ("SELECT region, COUNT(*) FROM demo.people WHERE age > 30 GROUP BY region", LAPLACE),
        ("SELECT education, COUNT(*), AVG(income) FROM demo.people WHERE age > 30 GROUP BY education", LAPLACE),
    ] {
        assert!(!keys.contains(&&other(sql, budget)), "{sql}");
    }
    assert!(!keys.contains(&&derived_key_of(&fine_key)));
    // Measures that do not add up, private keys and grouping sets store nothing.
    for sql in [
        "SELECT sex, region, COUNT(DISTINCT person_id) FROM demo.people GROUP BY sex, region",
        "SELECT sex, region, MEDIAN(age) FROM demo.people GROUP BY sex, region",
        "SELECT diagnosis, clinic, COUNT(*) FROM demo.visits GROUP BY diagnosis, clinic",
        "SELECT sex, region, COUNT(*) FROM demo.people GROUP BY ROLLUP (sex, region)",
    ] {
        let (plan, rewrite, _, _) = prepared(&policy, sql, LAPLACE);
        assert!(
            derive::coarser_groupings(&plan, &rewrite).is_empty(),
            "{sql}"
        );
    }
}

fn derived_key_of(key: &str) -> String {
    derived_key(key)
}

/// `pgdp.max_error` on a derived ROLLUP: the ε chosen makes the stated error of the total (a
/// sum of 30 cells) meet the target, not only a cell's.
#[test]
fn max_error_of_a_derived_rollup_covers_its_total() {
    let policy = policy();
    let sql = "SELECT sex, region, COUNT(*) FROM demo.people GROUP BY ROLLUP (sex, region)";
    let (plan, rewrite, _, _) = prepared(&policy, sql, LAPLACE);
    assert_eq!(grouping::cells_max(&plan, 0), 30);
    let budget = budget_for_error(&plan, &rewrite, LAPLACE, 50.0, 10.0).expect("an epsilon");
    let m = mechanisms(&plan, &rewrite, budget).expect("mechanisms");
    let total = m.noises[0].sum_error_bound(30, 0.05).expect("bound");
    assert!(total <= 50.0, "{total}");
}

/// A total over a key is added up from released cells only when every row's value of that key
/// is a cell's (the key is exhaustive): with `public_values` alone, a row with a NULL or an
/// unlisted region would be in no cell and missing from the derived total, which PostgreSQL's
/// total counts. Such a ROLLUP is released set by set, and no coarser grouping drops the key.
#[test]
fn a_key_that_is_not_exhaustive_is_never_dropped_from_a_derived_total() {
    let mut policy = policy();
    let people = policy.tables.get_mut("demo.people").expect("demo.people");
    for c in people.columns.iter_mut().filter(|c| c.name == "region") {
        c.exhaustive = false;
    }
    let sql =
        "SELECT sex, region, COUNT(*), SUM(income) FROM demo.people GROUP BY ROLLUP (sex, region)";
    let (plan, rewrite, mechanisms, _) = prepared(&policy, sql, LAPLACE);
    assert!(!plan.key_exhaustive(1), "region is listed, not exhaustive");
    assert!(plan.key_exhaustive(0), "sex stays exhaustive");
    assert_eq!(grouping::derived_set(&plan, &rewrite), None);
    assert!(
        rewrite.sql.as_str().contains("UNION ALL"),
        "one branch per set"
    );
    assert_eq!(mechanisms.sets.len(), 3);

    // A plain grouping by both keys derives only the coarser grouping that keeps region.
    let (plan, rewrite, _, _) = prepared(
        &policy,
        "SELECT sex, region, COUNT(*) FROM demo.people GROUP BY sex, region",
        LAPLACE,
    );
    assert_eq!(derive::coarser_groupings(&plan, &rewrite), vec![vec![1]]);

    // A CASE of literals is exhaustive by construction: its total is derived.
    let (plan, rewrite, _, _) = prepared(
        &policy,
        "SELECT CASE WHEN age < 40 THEN 'young' ELSE 'old' END AS band, sex, COUNT(*) FROM demo.people GROUP BY ROLLUP (1, 2)",
        LAPLACE,
    );
    assert!(plan.key_exhaustive(0) && plan.key_exhaustive(1));
    assert_eq!(grouping::derived_set(&plan, &rewrite), Some(0));
}

/// A per-person COUNT or SUM that takes the policy's row cap is named in the capped-statistic
/// note (NOTICE and EXPLAIN), as the analyst wrote it; a bound the analyst wrote is not.
#[test]
fn per_unit_values_bounded_by_the_row_cap_are_named() {
    let policy = policy();
    let (plan, ..) = prepared(
        &policy,
        "SELECT AVG(n), AVG(s) FROM (SELECT person_id, COUNT(*) AS n, SUM(cost) AS s FROM demo.visits GROUP BY person_id) t",
        LAPLACE,
    );
    let note = capped_statistic(&plan).expect("a capped-statistic note");
    assert!(note.contains("t.n = LEAST(COUNT(*), 10)"), "{note}");
    assert!(
        note.contains("t.s = LEAST(GREATEST(SUM(cost), 0), 20000)"),
        "{note}"
    );
    assert!(!note.contains(crate::dp::plan::RESERVED_PREFIX), "{note}");
    let (plan, ..) = prepared(
        &policy,
        "SELECT AVG(n) FROM (SELECT person_id, LEAST(COUNT(*), 20) AS n FROM demo.visits GROUP BY person_id) t",
        LAPLACE,
    );
    assert_eq!(capped_statistic(&plan), None);
}

/// A sum of an integer-typed argument is a whole number whatever the data, so its noisy value is
/// released rounded (post-processing), also where PostgreSQL's type for it is `numeric`
/// (`SUM` of a `bigint`), where the type alone would not round it.
#[test]
fn a_sum_of_integers_is_released_as_a_whole_number() {
    let policy = policy();
    let sql = "SELECT region, SUM(age), AVG(age) FROM demo.people GROUP BY region";
    let (plan, rewrite, mechanisms, _) = prepared(&policy, sql, LAPLACE);
    assert!(plan.aggregates[0].integral && !plan.aggregates[1].integral);
    let rows = upstream(&rewrite, &[("CE", 400_000), ("EA", 300_000)]);
    let released = release(
        &plan,
        &rewrite,
        &mechanisms,
        &rows,
        &listed_domain(&plan),
        false,
        &mut seeded(3),
    )
    .expect("release");
    let mut fractional_means = 0;
    for row in released.rows() {
        match &row[1] {
            Cell::Float(x) => assert_eq!(x.fract(), 0.0, "{row:?}"),
            Cell::Int(_) => {}
            other => panic!("a sum: {other:?}"),
        }
        if let Cell::Float(m) = row[2] {
            fractional_means += usize::from(m.fract() != 0.0);
        }
    }
    // The average of the same integers is not rounded.
    assert!(fractional_means > 0);
}

/// `(table, column)` is the demo's `people.age`, declared `NOT NULL` for these tests.
fn age_not_null(column: &(String, String)) -> bool {
    column.0 == "demo.people" && column.1 == "age"
}

#[test]
fn a_count_of_a_not_null_column_is_the_count_of_rows() {
    let policy = policy();
    let sql = "SELECT region, COUNT(*), COUNT(age), AVG(age), COUNT(income) FROM demo.people GROUP BY region";
    let (mut plan, rewrite, mechanisms, _) = prepared(&policy, sql, LAPLACE);
    // Without the catalog fact: rows, values of age, centred sum of age, values of income.
    assert_eq!(rewrite.measures.len(), 4);
    assert_eq!(mechanisms.shares, 4);
    let columns: Vec<(String, String)> = plan
        .column_arguments()
        .into_iter()
        .map(|(_, c)| c)
        .collect();
    let expected = [("demo.people", "age"), ("demo.people", "income")]
        .map(|(t, c)| (t.to_string(), c.to_string()));
    assert_eq!(columns, expected);

    plan.assume_not_null(&crate::dp::plan::Stated(age_not_null));
    let rewrite = rewrite::rewrite(&plan, &[], SECRET).expect("rewrites");
    let mechanisms = super::mechanisms(&plan, &rewrite, LAPLACE).expect("mechanisms");
    // COUNT(age) and the count of AVG(age) are COUNT(*)'s measure; income keeps its own.
    assert_eq!(
        rewrite.measures,
        [
            rewrite::Measure::Rows,
            rewrite::Measure::SumCentered(0),
            rewrite::Measure::Values(1)
        ]
    );
    assert_eq!(mechanisms.shares, 3);
    assert_eq!(rewrite.aggregate_measures[0], rewrite.aggregate_measures[1]);
    assert_eq!(
        rewrite.aggregate_measures[2][0],
        rewrite.aggregate_measures[0][0]
    );
    let lines = explain(&plan, &rewrite, &mechanisms, LAPLACE);
    let derived: Vec<&String> = lines.iter().filter(|l| l.contains("= count(*)")).collect();
    assert_eq!(derived.len(), 1, "{lines:#?}");
    assert!(derived[0].contains("count(people.age)"), "{lines:#?}");
    // The released COUNT(*) and COUNT(age) are one noisy value.
    let rows = upstream(&rewrite, &[("CE", 400), ("EA", 300)]);
    let released = release(
        &plan,
        &rewrite,
        &mechanisms,
        &rows,
        &listed_domain(&plan),
        false,
        &mut seeded(5),
    )
    .expect("release");
    for row in released.rows() {
        assert_eq!(row[1], row[2], "{row:?}");
    }
}

#[test]
fn only_plain_columns_of_tables_never_null_extended_can_be_counted_as_rows() {
    let policy = policy();
    for sql in [
        // An expression, a FILTER (a CASE), a column of a subquery.
        "SELECT COUNT(age + 1) FROM demo.people",
        "SELECT COUNT(age) FILTER (WHERE sex = 'F') FROM demo.people",
        // (Not the count of a selection, which `analyze::selection` reads as the count of the
        // table's column: the outer WHERE keeps it a subquery.)
        "SELECT COUNT(a) FROM (SELECT age AS a FROM demo.people) AS s WHERE s.a > 1",
        // SUM needs no count of its own.
        "SELECT SUM(quantity) FROM demo.prescriptions",
    ] {
        let (mut plan, _, _, _) = prepared(&policy, sql, LAPLACE);
        plan.assume_not_null(&crate::dp::plan::Stated(|_: &(String, String)| true));
        let rewrite = rewrite::rewrite(&plan, &[], SECRET).expect("rewrites");
        assert!(
            !rewrite.measures.contains(&rewrite::Measure::Rows),
            "{sql}: {:?}",
            rewrite.measures
        );
    }
}

#[test]
fn counts_of_constants_and_exhaustive_columns_are_the_count_of_rows() {
    let policy = policy();
    // No upstream facts: `sex` is declared exhaustive in the policy, `1` is a constant.
    let sql = "SELECT COUNT(*), COUNT(1), COUNT(sex) FROM demo.people";
    let (plan, _, _, _) = prepared(&policy, sql, LAPLACE);
    let rewrite = rewrite::rewrite(&plan, &[], SECRET).expect("rewrites");
    assert_eq!(rewrite.measures, vec![rewrite::Measure::Rows]);
    // A column without that declaration keeps a count of its own values.
    let (plan, _, _, _) = prepared(&policy, "SELECT COUNT(age) FROM demo.people", LAPLACE);
    let rewrite = rewrite::rewrite(&plan, &[], SECRET).expect("rewrites");
    assert!(!rewrite.measures.contains(&rewrite::Measure::Rows));
}

#[test]
fn pgdp_clamp_means_off_releases_the_plain_ratio_of_the_noisy_measures() {
    let policy = policy();
    let sql = "SELECT AVG(income) FROM demo.people";
    let (plan, rewrite, mut mechanisms, _) = prepared(&policy, sql, LAPLACE);
    // A small group whose noise pushed the centred sum past the bound: noisy count 2, noisy
    // centred sum 400,000 (income bounds [0, 250000], midpoint 125,000).
    let measures = NoisyMeasures {
        keys: 0,
        measures: 2,
        groups: vec![(Vec::new(), vec![2.0, 400_000.0])],
        derivation: None,
    };
    let mean = |m: &Mechanisms| -> (f64, f64) {
        let released = finish(&plan, &rewrite, m, &measures, true).expect("finishes");
        let row = &released.rows()[0];
        match (&row[0], &row[1]) {
            (Cell::Float(v), Cell::Float(e)) => (*v, *e),
            other => panic!("{other:?}"),
        }
    };
    // Clamped (the default): the upper bound, and a stated error of at most the bounds' width.
    let (clamped, clamped_error) = mean(&mechanisms);
    assert_eq!(clamped, 250_000.0);
    assert!(clamped_error <= 250_000.0, "{clamped_error}");
    // Unclamped: 125,000 + 400,000 / 2, with its error bound uncapped.
    mechanisms.clamp_means = false;
    let (plain, plain_error) = mean(&mechanisms);
    assert_eq!(plain, 325_000.0);
    assert!(
        plain_error > clamped_error,
        "{plain_error} vs {clamped_error}"
    );
}

#[test]
fn under_one_row_per_unit_the_count_of_units_is_the_count_of_rows() {
    let policy = policy();
    // demo.people: one row per person (max_rows_per_unit 1).
    let sql = "SELECT region, COUNT(*), COUNT(DISTINCT person_id) FROM demo.people GROUP BY region";
    let (plan, rewrite, mechanisms, _) = prepared(&policy, sql, LAPLACE);
    assert_eq!(rewrite.measures, [rewrite::Measure::Rows]);
    assert_eq!(mechanisms.shares, 1);
    assert_eq!(rewrite.aggregate_measures[0], rewrite.aggregate_measures[1]);
    let lines = explain(&plan, &rewrite, &mechanisms, LAPLACE);
    assert!(
        lines
            .iter()
            .any(|l| l.contains("count(distinct unit) = count(*)")),
        "{lines:#?}"
    );
    // Alone, COUNT(DISTINCT unit) keeps its own measure; with more rows per unit (visits, up
    // to 10) the two counts differ and both are released.
    for (sql, measures) in [
        (
            "SELECT COUNT(DISTINCT person_id) FROM demo.people",
            vec![rewrite::Measure::Units],
        ),
        (
            "SELECT clinic, COUNT(*), COUNT(DISTINCT person_id) FROM demo.visits GROUP BY clinic",
            vec![rewrite::Measure::Rows, rewrite::Measure::Units],
        ),
    ] {
        let (_, rewrite, _, _) = prepared(&policy, sql, LAPLACE);
        assert_eq!(rewrite.measures, measures, "{sql}");
    }
}

/// Under `pgdp.accuracy` a question of existence has no `_error95` column (a boolean has no
/// error bound; its NOTICE states the detection bound), while a count keeps its own; EXPLAIN
/// names the detection test and its bound.
#[test]
fn a_question_of_existence_has_no_error_column() {
    let policy = policy();
    let (plan, rewrite, mechanisms, _) = prepared(
        &policy,
        "SELECT EXISTS (SELECT 1 FROM demo.people WHERE age > 100)",
        LAPLACE,
    );
    let names: Vec<String> = columns(&plan, true).into_iter().map(|c| c.name).collect();
    assert_eq!(names, vec!["exists".to_string()]);
    // EXPLAIN says the answer is a detection test of the count, at its noise's bound.
    let lines = explain(&plan, &rewrite, &mechanisms, LAPLACE);
    let bound = mechanisms.noises[0].error_bound(0.05).expect("a bound");
    assert!(
        lines
            .iter()
            .any(|l| l.contains("question of existence") && l.contains(&format!("±{bound:.4}"))),
        "{lines:#?}"
    );
    let (plan, _, _, _) = prepared(
        &policy,
        "SELECT region, COUNT(*) FROM demo.people GROUP BY region",
        LAPLACE,
    );
    let names: Vec<String> = columns(&plan, true).into_iter().map(|c| c.name).collect();
    assert_eq!(names, vec!["region", "count", "count_error95"]);
}

/// `pgdp.max_bias`: a COUNT or SUM is refused when the caps chosen for the query are estimated
/// to remove more than the share, with the share and the aggregate in the message; a smaller
/// estimate, the setting off, or a query with neither (an average alone) is answered.
#[test]
fn an_answer_the_chosen_caps_bias_beyond_max_bias_is_refused() {
    let policy = policy();
    let answer_between = |sql: &str, removed: f64, at_least: f64, max_bias: Option<f64>| {
        let (plan, rewrite, mut mechanisms, _) = prepared(&policy, sql, LAPLACE);
        mechanisms.removed_share = removed;
        mechanisms.removed_share_low = at_least;
        mechanisms.max_bias = max_bias;
        let domains = listed_domain(&plan);
        let rows = upstream(&rewrite, &[("CE", 14000), ("EA", 9000)]);
        let measures = measure(
            &plan,
            &rewrite,
            &mechanisms,
            &rows,
            &domains,
            &mut seeded(3),
        )
        .expect("measure");
        finish(&plan, &rewrite, &mechanisms, &measures, false)
    };
    let answer = |sql: &str, removed: f64, max_bias: Option<f64>| {
        answer_between(sql, removed, removed, max_bias)
    };
    let e = answer_between(BY_REGION, 0.25, 0.2, Some(0.1)).expect_err("25% removed, 10% allowed");
    assert_eq!(e.sqlstate().code(), "22000");
    let message = e.to_string();
    assert!(
        message.contains("about 25% of the rows (at least 20% at 95% confidence)")
            && message.contains("count(*)"),
        "{message}"
    );
    // An estimate above the share whose lower end is not: answered (the histograms cannot
    // tell it from one within the share).
    assert!(answer_between(BY_REGION, 0.25, 0.05, Some(0.1)).is_ok());
    assert!(e.hint().is_some_and(|h| h.contains("pgdp.max_bias = off")));
    assert!(answer(BY_REGION, 0.08, Some(0.1)).is_ok());
    assert!(answer(BY_REGION, 0.25, None).is_ok());
    assert!(answer(
        "SELECT region, SUM(income) FROM demo.people GROUP BY region",
        0.5,
        Some(0.1)
    )
    .is_err());
    assert!(answer(
        "SELECT region, AVG(age) FROM demo.people GROUP BY region",
        0.5,
        Some(0.1)
    )
    .is_ok());
}

#[test]
fn a_plan_at_its_ceilings_is_borrowed_exactly_when_raising_changes_nothing() {
    let policy = policy();
    let mut borrowed = 0;
    for sql in [
        "SELECT COUNT(*) FROM people WHERE person_id <= 100",
        "SELECT region, COUNT(*) FROM people GROUP BY region",
        "SELECT COUNT(*), SUM(cost) FROM visits",
        "SELECT AVG(cost), VARIANCE(cost) FROM visits",
        "SELECT SUM(cost) FROM visits WHERE cost > 10",
        "SELECT date_trunc('month', visit_date) AS m, COUNT(*) FROM visits GROUP BY m",
        "SELECT p.region, SUM(v.cost) FROM people p JOIN visits v ON v.person_id = p.person_id GROUP BY p.region",
    ] {
        let (plan, ..) = prepared(&policy, sql, LAPLACE);
        let at = plan.at_ceilings();
        let raised = plan.raised_to_ceilings();
        assert_eq!(*at, raised, "{sql}");
        let is_borrowed = matches!(at, std::borrow::Cow::Borrowed(_));
        assert_eq!(is_borrowed, raised == plan, "{sql}");
        borrowed += usize::from(is_borrowed);
    }
    assert!(borrowed > 0 && borrowed < 7, "both cases are tried");
}

/// The keys of stored measures stay what they were (stop 86's, when each part was printed
/// on its own), so measures stored before a change are found after it. They change, rightly,
/// when the rewrite's SQL or the mechanisms of these queries change.
#[test]
fn measures_keys_stay_the_keys_stored_before() {
    let policy = policy();
    for (sql, stored) in [
        (
            "SELECT COUNT(*) FROM people WHERE person_id <= 100",
            "measures:5a52214b64ffba4c67dfe31b97c07bfb00cd9afe38bc744cdf88fb342c1ad861",
        ),
        (
            "SELECT region, sex, COUNT(*), AVG(age) FROM people GROUP BY GROUPING SETS ((region), (sex), ())",
            "measures:b46b2ac80b0f917b0630684c2fb885a3011ed7a18faa42eb24ad60be74a06689",
        ),
        (
            "SELECT region, COUNT(*) FROM people WHERE region IN ('north', 'south') GROUP BY region",
            "measures:ec35bd50c97bce2b4ad79146f02bc9dcf58804cfee2bff0db4a36ce5307ee094",
        ),
    ] {
        let (plan, rewrite, mechanisms, _) = prepared(&policy, sql, LAPLACE);
        let domain = if plan.keys_public() {
            rewrite::domain::public_domain(&plan, &[]).expect("public domain")
        } else {
            Vec::new()
        };
        let params = [Some("5".to_string()), None];
        let key = measures_key(&plan, &rewrite, &mechanisms, &params, &domain);
        assert_eq!(key, stored, "{sql}");
    }
}
