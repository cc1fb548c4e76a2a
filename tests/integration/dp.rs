//! Differentially private answers through the wire, compared with the truth computed directly
//! on the upstream.
//!
//! Tolerances follow from the noise scale b = Δ / ε_share, where Δ is the L1 sensitivity the
//! policy implies and ε_share is the query's ε divided by the number of noisy measures (an upper
//! bound on that number is stated at each use). Discrete Laplace noise exceeds 20·b with
//! probability below e^-20 ≈ 2·10^-9, so a correct pgdp fails one of these assertions with
//! negligible probability; with the fixed seeds a run always passes or always fails.

use std::collections::{BTreeMap, BTreeSet};

use pgdp::tools::demo::REGIONS;

use tokio_postgres::error::SqlState;

use crate::support::{assert_code, policy_with_budget, upstream_client, Number, Proxy, Session};

/// Noise tolerance: 20 noise scales.
fn tolerance(scale: f64) -> f64 {
    20.0 * scale
}

/// A proxy whose analyst can afford every query of a test.
async fn rich_proxy(seed: u8) -> Proxy {
    Proxy::with_policy(policy_with_budget(1000, 100), seed).await
}

async fn set_epsilon(s: &Session, epsilon: f64) {
    s.batch_execute(&format!("SET pgdp.epsilon = {epsilon}"))
        .await
        .expect("SET pgdp.epsilon");
}

/// True number of people per region.
async fn true_region_counts() -> BTreeMap<String, i64> {
    upstream_client()
        .await
        .query(
            "SELECT region, count(*) FROM demo.people GROUP BY region",
            &[],
        )
        .await
        .expect("true counts")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

#[tokio::test]
async fn region_counts_and_averages_are_close_to_the_truth() {
    let proxy = rich_proxy(21).await;
    let s = proxy.connect().await;
    set_epsilon(&s, 2.0).await;
    let rows = s
        .query(
            "SELECT region, COUNT(*), AVG(income) FROM demo.people GROUP BY region",
            &[],
        )
        .await
        .expect("DP query");
    let truth: BTreeMap<String, (i64, f64)> = upstream_client()
        .await
        .query(
            "SELECT region, count(*), avg(least(greatest(income, 0), 250000))::float8
             FROM demo.people GROUP BY region",
            &[],
        )
        .await
        .expect("truth")
        .iter()
        .map(|r| (r.get(0), (r.get(1), r.get(2))))
        .collect();

    let released: BTreeMap<String, (i64, f64)> = rows
        .iter()
        .map(|r| (r.get(0), (r.get(1), r.get::<_, Number>(2).0)))
        .collect();
    assert_eq!(rows.len(), 10, "one row per region");
    let expected_regions: BTreeSet<String> = REGIONS.iter().map(|r| r.code.to_string()).collect();
    assert_eq!(
        released.keys().cloned().collect::<BTreeSet<_>>(),
        expected_regions
    );

    // ε = 2 over at most 3 measures (count, sum of income, a count for the average): a person is
    // in one region with one row, so the count has Δ = 1 and b ≤ 1.5; the sum has
    // Δ = 250000 (the upper bound of income) and b ≤ 375000.
    let count_tolerance = tolerance(1.5);
    let sum_tolerance = tolerance(375_000.0);
    for (region, (count, avg)) in &released {
        let (true_count, true_avg) = truth[region];
        assert!(
            (*count as f64 - true_count as f64).abs() <= count_tolerance,
            "{region}: count {count}, truth {true_count}"
        );
        assert!((0.0..=250_000.0).contains(avg), "{region}: avg {avg}");
        // avg = (S + e_s) / (n + e_c), so |avg − S/n| ≤ (|e_s| + (S/n)·|e_c|) / (n − |e_c|).
        let n = true_count as f64;
        let avg_tolerance = (sum_tolerance + true_avg * count_tolerance) / (n - count_tolerance);
        assert!(
            (avg - true_avg).abs() <= avg_tolerance,
            "{region}: avg {avg}, truth {true_avg}, tolerance {avg_tolerance}"
        );
    }
    proxy.stop().await;
}

#[tokio::test]
async fn noise_has_the_stated_scale() {
    let proxy = rich_proxy(29).await;
    let s = proxy.connect().await;
    // COUNT(*) alone over public keys: one measure, Δ = 1 (one row per person), so at ε = 0.1
    // the noise is discrete Laplace with scale b = 10, whose mean absolute value is 9.98 and
    // whose standard deviation of |X| is about 10.
    set_epsilon(&s, 0.1).await;
    let released: BTreeMap<(String, String, String), i64> = s
        .query(
            "SELECT region, sex, education, COUNT(*) FROM demo.people GROUP BY region, sex, education",
            &[],
        )
        .await
        .expect("DP query")
        .iter()
        .map(|r| ((r.get(0), r.get(1), r.get(2)), r.get(3)))
        .collect();
    assert_eq!(released.len(), 10 * 3 * 6, "every public combination");
    let truth: BTreeMap<(String, String, String), i64> = upstream_client()
        .await
        .query(
            "SELECT region, sex, education, count(*) FROM demo.people GROUP BY 1, 2, 3",
            &[],
        )
        .await
        .expect("truth")
        .iter()
        .map(|r| ((r.get(0), r.get(1), r.get(2)), r.get(3)))
        .collect();
    // Groups far from zero, where clamping at 0 cannot bias the error.
    let errors: Vec<f64> = truth
        .iter()
        .filter(|(_, n)| **n >= 100)
        .map(|(k, n)| (released[k] - n).abs() as f64)
        .collect();
    assert!(errors.len() >= 80, "{} large groups", errors.len());
    let mean = errors.iter().sum::<f64>() / errors.len() as f64;
    // The mean of n ≥ 80 absolute errors has standard error ≤ 10/√80 ≈ 1.1: [6, 14.5] is more
    // than 3.5 standard errors either side of 9.98, and excludes a scale off by a factor 1.5.
    assert!((6.0..=14.5).contains(&mean), "mean |error| {mean}");
    let exact = errors.iter().filter(|e| **e == 0.0).count();
    assert!(exact * 5 < errors.len(), "{exact} exact answers");
    proxy.stop().await;
}

/// The codes among `released` that fewer than two people hold, read from the upstream.
async fn held_by_one_person(released: &[String]) -> Vec<String> {
    upstream_client()
        .await
        .query(
            "SELECT diagnosis FROM demo.visits WHERE diagnosis = ANY($1)
             GROUP BY diagnosis HAVING count(DISTINCT person_id) < 2",
            &[&released],
        )
        .await
        .expect("truth")
        .iter()
        .map(|r| r.get(0))
        .collect()
}

#[tokio::test]
async fn partition_selection_hides_single_person_diagnoses() {
    let proxy = rich_proxy(22).await;
    let s = proxy.connect().await;
    set_epsilon(&s, 2.0).await;
    let rows = s
        .query(
            "SELECT diagnosis, COUNT(*) FROM demo.visits GROUP BY diagnosis",
            &[],
        )
        .await
        .expect("DP query");
    let released: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
    for common in ["J06", "I10"] {
        assert!(released.iter().any(|d| d == common), "{common} missing");
    }
    let single: Vec<&String> = released
        .iter()
        .filter(|d| d.starts_with(pgdp::tools::demo::SINGLE_PERSON_DIAGNOSIS_PREFIX))
        .collect();
    assert!(
        single.is_empty(),
        "single-person codes released: {single:?}"
    );
    for r in &rows {
        assert!(r.get::<_, i64>(1) >= 0);
    }
    // Stronger: no released code is held by fewer than two people. A code of one person passes
    // partition selection with probability at most δ = 1e-7 (the session default), and the demo
    // data has about 1,500 such codes.
    let held_by_one = held_by_one_person(&released).await;
    assert!(held_by_one.is_empty(), "released: {held_by_one:?}");
    proxy.stop().await;
}

/// The line of EXPLAIN that starts with `prefix` (without its leading spaces).
fn explain_line(explain: &[Vec<Option<String>>], prefix: &str) -> String {
    explain
        .iter()
        .filter_map(|r| r[0].as_deref())
        .map(str::trim_start)
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no EXPLAIN line {prefix:?}: {explain:?}"))
        .to_string()
}

/// A COUNT of a column the upstream declares `NOT NULL` is the count of rows: one release
/// shared with COUNT(*), so the query has one share fewer (docs/privacy.md, "Facts pgdp reads
/// from the upstream catalog"). `demo.people.sex` is NOT NULL; `age` is nullable and keeps a
/// count of its own. Tolerance: three shares of ε = 1 give the counts scale b = 3; discrete
/// Laplace noise exceeds 20·b with probability below 2·10⁻⁹ per value.
#[tokio::test]
async fn a_count_of_a_not_null_column_is_released_as_the_count_of_rows() {
    let proxy = rich_proxy(41).await;
    let s = proxy.connect().await;
    let sql = "SELECT region, COUNT(*), COUNT(sex), COUNT(age), AVG(age) FROM demo.people GROUP BY region ORDER BY region";
    let explain = s
        .simple_rows(&format!("EXPLAIN {sql}"))
        .await
        .expect("EXPLAIN");
    assert!(
        explain_line(&explain, "cost:").contains("split over 3 share(s)"),
        "{explain:?}"
    );
    let derived = explain_line(&explain, "count(people.sex) = count(*)");
    assert!(derived.contains("NOT NULL upstream"), "{derived}");
    let lines: Vec<&str> = explain.iter().filter_map(|r| r[0].as_deref()).collect();
    assert!(
        !lines
            .iter()
            .any(|l| l.contains("count(people.age) = count(*)")),
        "{lines:#?}"
    );
    let up = upstream_client().await;
    let truth = up
        .query(
            "SELECT region, count(*) FROM demo.people GROUP BY region ORDER BY region",
            &[],
        )
        .await
        .expect("truth");
    let rows = s.query(sql, &[]).await.expect("DP query");
    assert_eq!(rows.len(), truth.len());
    for (r, t) in rows.iter().zip(&truth) {
        let (region, rows_count, sex_count): (String, i64, i64) = (r.get(0), r.get(1), r.get(2));
        assert_eq!(region, t.get::<_, String>(0));
        assert_eq!(rows_count, sex_count, "one noisy value for both: {region}");
        let n: i64 = t.get(1);
        assert!(
            (rows_count - n).abs() <= 60,
            "{region}: {rows_count} vs {n}"
        );
    }
    proxy.stop().await;
}

/// `SET pgdp.clamp_means = off` releases an AVG as the plain ratio of its noisy sum and count,
/// which a small group's noise can carry outside the column's bounds, where the default clamps
/// it into them (docs/privacy.md §7). Tiny groups (3 to 7 people) at ε = 0.1 over two shares:
/// the mean's noise has scale about 1000/n, so each unclamped mean falls outside [0, 100] with
/// probability above 0.8 and all five stay inside with probability below 4·10⁻⁴ (fixed seed:
/// a run always passes or always fails). A bad value is 22023 and charges nothing.
#[tokio::test]
async fn clamp_means_off_releases_the_plain_ratio_of_the_noisy_measures() {
    let proxy = rich_proxy(43).await;
    let s = proxy.connect().await;
    let shown = s.simple_rows("SHOW pgdp.clamp_means").await.expect("SHOW");
    assert_eq!(shown[0][0].as_deref(), Some("on"));
    let before = s.budget().await.epsilon_spent;
    assert_code(
        s.batch_execute("SET pgdp.clamp_means = sometimes").await,
        &SqlState::INVALID_PARAMETER_VALUE,
        "pgdp.clamp_means takes on or off",
    );
    assert_eq!(s.budget().await.epsilon_spent, before);
    s.batch_execute("SET pgdp.epsilon = 0.1; SET pgdp.mechanism = 'laplace'")
        .await
        .expect("SET");
    let mean = |clamp: &'static str, n: i64| {
        let s = &s;
        async move {
            s.batch_execute(&format!("SET pgdp.clamp_means = {clamp}"))
                .await
                .expect("SET");
            let row = s
                .query_one(
                    &format!("SELECT AVG(age) FROM demo.people WHERE person_id <= {n}"),
                    &[],
                )
                .await
                .expect("DP mean");
            let Number(m) = row.get(0);
            m
        }
    };
    let mut outside = 0;
    for n in 3..8 {
        let clamped = mean("on", n).await;
        assert!((0.0..=100.0).contains(&clamped), "clamped: {clamped}");
        let plain = mean("off", n).await;
        outside += usize::from(!(0.0..=100.0).contains(&plain));
    }
    assert!(outside > 0, "no unclamped mean left the bounds");
    proxy.stop().await;
}

/// A grouped count of privacy units decides partition selection with its own released noisy
/// count (Laplace thresholding, and Gaussian thresholding under Gaussian noise): selection takes no share of ε, the count gets all of it, every
/// released count reaches the threshold, and single-person codes stay hidden (each passes with
/// probability at most δ/5 = 2·10⁻⁸; about 1,500 such codes: < 10⁻⁴ for the run).
#[tokio::test]
async fn a_released_count_of_units_decides_partition_selection() {
    let proxy = rich_proxy(24).await;
    let s = proxy.connect().await;
    let sql =
        "SELECT diagnosis, COUNT(DISTINCT person_id) AS people FROM demo.visits GROUP BY diagnosis";
    let explain = s
        .simple_rows(&format!("EXPLAIN {sql}"))
        .await
        .expect("EXPLAIN");
    let cost = explain_line(&explain, "cost:");
    assert!(
        cost.contains("epsilon split over 1 share(s) of 1.000000"),
        "{cost}"
    );
    // Five groups per person, ε = 1 for the count: scale 5 (half of the 10 a separate count
    // of units would leave it).
    let measure = explain_line(&explain, "measure count(distinct unit)");
    assert!(measure.contains("scale 5.000000"), "{measure}");
    let selection = explain_line(&explain, "partition selection:");
    assert!(
        selection.contains("its released count(distinct unit) reaches")
            && selection.contains("Laplace thresholding of the released count"),
        "{selection}"
    );
    let threshold: i64 = selection
        .split("reaches ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .expect("a threshold");
    let rows = s.query(sql, &[]).await.expect("DP query");
    assert!(rows.len() >= 20, "{} groups", rows.len());
    for r in &rows {
        let people: i64 = r.get(1);
        assert!(people >= threshold, "{people} < {threshold}");
    }
    let released: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
    let held_by_one = held_by_one_person(&released).await;
    assert!(held_by_one.is_empty(), "released: {held_by_one:?}");

    // A count of visits (up to 10 per person) is not a count of units: selection keeps a noisy
    // count of units of its own. COUNT(*) of people (one row each) is one.
    let visits = s
        .simple_rows("EXPLAIN SELECT diagnosis, COUNT(*) FROM demo.visits GROUP BY diagnosis")
        .await
        .expect("EXPLAIN");
    assert!(explain_line(&visits, "cost:").contains("split over 2 share(s)"));
    // Its own count under Laplace noise: the optimal rule, kept half the time well below the
    // 172 units a Laplace threshold would need.
    let own = explain_line(&visits, "partition selection:");
    assert!(own.contains("the optimal rule"), "{own}");
    let half: i64 = own
        .split("p(n) >= 1/2 from n = ")
        .nth(1)
        .and_then(|r| r.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{own}"));
    assert!((100..172).contains(&half), "{own}");
    let people = s
        .simple_rows("EXPLAIN SELECT age, COUNT(*) FROM demo.people GROUP BY age")
        .await
        .expect("EXPLAIN");
    assert!(explain_line(&people, "partition selection:").contains("its released count(*)"));
    // Gaussian noise: the released Gaussian count decides against a Gaussian threshold, with no
    // ε share of its own (the cost is ρ and δ only); every released count reaches it and
    // single-person codes stay hidden (each passes with probability at most δ/5 = 2·10⁻⁸).
    s.batch_execute("SET pgdp.mechanism = 'gaussian'")
        .await
        .expect("SET");
    let gaussian = s
        .simple_rows(&format!("EXPLAIN {sql}"))
        .await
        .expect("EXPLAIN");
    let selection = explain_line(&gaussian, "partition selection:");
    assert!(
        selection.contains("Gaussian thresholding of the released count"),
        "{selection}"
    );
    assert!(
        explain_line(&gaussian, "cost:").contains("rho split equally over 1 share(s)"),
        "{gaussian:?}"
    );
    let threshold: i64 = selection
        .split("reaches ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .expect("a threshold");
    let rows = s.query(sql, &[]).await.expect("DP query");
    assert!(rows.len() >= 20, "{} groups", rows.len());
    for r in &rows {
        let people: i64 = r.get(1);
        assert!(people >= threshold, "{people} < {threshold}");
    }
    let released: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
    let held_by_one = held_by_one_person(&released).await;
    assert!(held_by_one.is_empty(), "released: {held_by_one:?}");
    // A count of visits is not a count of units: a count of units of its own, Gaussian-
    // thresholded with a rho share.
    let visits = s
        .simple_rows("EXPLAIN SELECT diagnosis, COUNT(*) FROM demo.visits GROUP BY diagnosis")
        .await
        .expect("EXPLAIN");
    let own = explain_line(&visits, "partition selection:");
    assert!(
        own.contains("noisy count of units (Gaussian thresholding")
            && own.contains("its own rho share"),
        "{own}"
    );
    proxy.stop().await;
}

/// `SET pgdp.mechanism = 'auto'`: EXPLAIN names the mechanism pgdp chose and why, the cost line
/// and the charge use it, and a bad value is still refused with 22023 and nothing charged.
#[tokio::test]
async fn auto_mechanism_is_chosen_per_query_and_shown_in_explain() {
    let proxy = rich_proxy(25).await;
    let s = proxy.connect().await;
    s.batch_execute("SET pgdp.mechanism = 'auto'")
        .await
        .expect("SET auto");
    let explain = |sql: &'static str| {
        let s = &s;
        async move {
            s.simple_rows(&format!("EXPLAIN {sql}"))
                .await
                .expect("EXPLAIN")
        }
    };
    let people = explain("SELECT COUNT(*) FROM demo.people").await;
    assert!(explain_line(&people, "mechanism chosen by pgdp").contains("auto): laplace"));
    assert!(explain_line(&people, "cost:").contains("mechanism laplace"));
    let visits = explain(
        "SELECT clinic, COUNT(*), AVG(cost), STDDEV(cost) FROM demo.visits GROUP BY clinic",
    )
    .await;
    assert!(explain_line(&visits, "mechanism chosen by pgdp").contains("auto): gaussian"));
    assert!(explain_line(&visits, "cost:").contains("mechanism gaussian"));
    let rows = s
        .query("SELECT COUNT(*) FROM demo.people", &[])
        .await
        .expect("DP query under auto");
    let n: i64 = rows[0].get(0);
    assert!((99_000..=101_000).contains(&n), "{n}");
    let err = s
        .batch_execute("SET pgdp.mechanism = 'cauchy'")
        .await
        .expect_err("refused");
    assert_eq!(
        err.code(),
        Some(&tokio_postgres::error::SqlState::INVALID_PARAMETER_VALUE)
    );
    proxy.stop().await;
}

#[tokio::test]
async fn joined_sum_by_sex_releases_every_public_value() {
    let proxy = rich_proxy(23).await;
    let s = proxy.connect().await;
    set_epsilon(&s, 2.0).await;
    let rows = s
        .query(
            "SELECT sex, SUM(cost) FROM demo.visits JOIN demo.people USING (person_id) GROUP BY sex",
            &[],
        )
        .await
        .expect("DP query");
    let sums: BTreeMap<String, f64> = rows
        .iter()
        .map(|r| (r.get(0), r.get::<_, Number>(1).0))
        .collect();
    assert_eq!(
        sums.keys().map(String::as_str).collect::<Vec<_>>(),
        vec!["F", "M", "X"]
    );
    // Δ = 5 groups × 10 rows × 2000 = 100000 per unit; ε = 2 over at most 2 measures gives
    // b ≤ 100000. Without contribution bounds the clamped sums are about 5.4e7 (F, M) and 5.4e5
    // (X); bounding only removes rows, so the released sums lie below those plus the tolerance.
    let tol = tolerance(100_000.0);
    let upper: BTreeMap<String, f64> = upstream_client()
        .await
        .query(
            "SELECT p.sex, sum(least(greatest(v.cost, 0), 2000))::float8
             FROM demo.visits v JOIN demo.people p USING (person_id) GROUP BY p.sex",
            &[],
        )
        .await
        .expect("truth")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    for (sex, sum) in &sums {
        assert!(sum.is_finite(), "{sex}: {sum}");
        assert!(*sum >= -tol && *sum <= upper[sex] + tol, "{sex}: {sum}");
    }
    assert!(sums["F"] > sums["X"] + 2.0 * tol, "{sums:?}");
    assert!(sums["M"] > sums["X"] + 2.0 * tol, "{sums:?}");
    proxy.stop().await;
}

#[tokio::test]
async fn distinct_units_and_variance_are_plausible() {
    let proxy = rich_proxy(24).await;
    let s = proxy.connect().await;
    set_epsilon(&s, 2.0).await;
    let upstream = upstream_client().await;

    let people_with_visits: i64 = upstream
        .query_one("SELECT count(DISTINCT person_id) FROM demo.visits", &[])
        .await
        .expect("truth")
        .get(0);
    let released: i64 = s
        .query_one("SELECT COUNT(DISTINCT person_id) FROM demo.visits", &[])
        .await
        .expect("COUNT(DISTINCT person_id)")
        .get(0);
    // Δ = 1 (a person counts once), ε = 2 over at most 2 measures: b ≤ 1.
    assert!(
        (released - people_with_visits).abs() as f64 <= tolerance(1.0),
        "{released} vs {people_with_visits}"
    );

    let (true_var, true_sd): (f64, f64) = {
        let r = upstream
            .query_one(
                "SELECT var_samp(age)::float8, stddev_samp(age)::float8 FROM demo.people",
                &[],
            )
            .await
            .expect("truth");
        (r.get(0), r.get(1))
    };
    let r = s
        .query_one("SELECT VARIANCE(age), STDDEV(age) FROM demo.people", &[])
        .await
        .expect("VARIANCE, STDDEV");
    let (Number(var), Number(sd)): (Number, Number) = (r.get(0), r.get(1));
    // ε = 2 over at most 6 measures (count, Σx, Σx² for each): b ≤ 3·Δ with Δ = 100 for Σage
    // and 10000 for Σage². Over n = 100000 people that moves the mean by at most 0.06 and the
    // mean of squares by at most 6, so the variance (≈ 630) by at most about 11 and the
    // standard deviation (≈ 25) by about 0.25: we allow 30 and 1.
    assert!((var - true_var).abs() <= 30.0, "var {var} vs {true_var}");
    assert!((sd - true_sd).abs() <= 1.0, "stddev {sd} vs {true_sd}");
    proxy.stop().await;
}

#[tokio::test]
async fn having_order_by_limit_and_public_joins_work_on_noisy_values() {
    let proxy = rich_proxy(25).await;
    let s = proxy.connect().await;
    let truth = true_region_counts().await;
    // Each query runs at its own ε (2, 1.9, 1.8) so that none is answered from the replay cache
    // of another (see `budget::replay_cache_answers_only_the_same_query`). One measure at ε ≥ 1.8
    // with Δ = 1 gives b ≤ 0.56; we allow b = 1, so 20.
    let tol = tolerance(1.0);

    let threshold = 13_000;
    assert!(
        truth.values().all(|c| (c - threshold).abs() as f64 > tol),
        "the threshold must be clear of every true count"
    );
    let expected: BTreeSet<String> = truth
        .iter()
        .filter(|(_, c)| **c > threshold)
        .map(|(r, _)| r.clone())
        .collect();
    assert!(!expected.is_empty() && expected.len() < 10);
    set_epsilon(&s, 2.0).await;
    let having: BTreeSet<String> = s
        .query(
            &format!(
                "SELECT region, COUNT(*) FROM demo.people GROUP BY region HAVING COUNT(*) > {threshold}"
            ),
            &[],
        )
        .await
        .expect("HAVING")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(having, expected);

    set_epsilon(&s, 1.9).await;
    let top: Vec<(String, i64)> = s
        .query(
            "SELECT region, COUNT(*) AS n FROM demo.people GROUP BY region ORDER BY n DESC LIMIT 3",
            &[],
        )
        .await
        .expect("ORDER BY … LIMIT")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let mut by_truth: Vec<(&String, &i64)> = truth.iter().collect();
    by_truth.sort_by_key(|(_, c)| std::cmp::Reverse(**c));
    // The top true counts are hundreds apart, far more than the noise.
    let expected_top: Vec<String> = by_truth.iter().take(3).map(|(r, _)| (*r).clone()).collect();
    assert_eq!(
        top.iter().map(|(r, _)| r.clone()).collect::<Vec<_>>(),
        expected_top
    );
    assert!(top.windows(2).all(|w| w[0].1 >= w[1].1), "{top:?}");

    set_epsilon(&s, 1.8).await;
    let names: BTreeMap<String, i64> = s
        .query(
            "SELECT regions.name, COUNT(*) FROM demo.people JOIN demo.regions USING (region) GROUP BY regions.name",
            &[],
        )
        .await
        .expect("join with a public table")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(names.len(), REGIONS.len(), "{names:?}");
    for region in REGIONS {
        let released = names
            .get(region.name)
            .unwrap_or_else(|| panic!("{} missing", region.name));
        let true_count = truth[region.code];
        assert!(
            (released - true_count).abs() as f64 <= tol,
            "{}: {released} vs {true_count}",
            region.name
        );
    }
    proxy.stop().await;
}

#[tokio::test]
async fn every_dp_query_sends_a_charge_notice() {
    let proxy = rich_proxy(26).await;
    let s = proxy.connect().await;
    let queries = [
        "SELECT COUNT(*) FROM demo.people",
        "SELECT sex, AVG(age) FROM demo.people GROUP BY sex",
        "SELECT clinic, COUNT(*) FROM demo.visits GROUP BY clinic",
    ];
    for sql in queries {
        s.query(sql, &[])
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e:?}"));
        let notices = s.take_notices();
        assert_eq!(
            notices
                .iter()
                .filter(|n| n.starts_with("pgdp: charged"))
                .count(),
            1,
            "{sql}: {notices:?}"
        );
        // A count of visits (10 rows and 5 groups per person at most) says it is capped; a
        // count of people (one row each) does not.
        let capped = notices.iter().any(|n| {
            n.starts_with(
                "pgdp: a capped statistic: each privacy unit counts with at most 10 row(s)",
            )
        });
        assert_eq!(capped, sql.contains("visits"), "{sql}: {notices:?}");
    }
    // A replayed answer says so too, beside what remains.
    s.query(
        "SELECT clinic, COUNT(*) FROM demo.visits GROUP BY clinic",
        &[],
    )
    .await
    .expect("replay");
    let notices = s.take_notices();
    assert!(
        notices
            .iter()
            .any(|n| n.contains("replay cache") && n.contains("remaining epsilon="))
            && notices
                .iter()
                .any(|n| n.starts_with("pgdp: a capped statistic:")),
        "{notices:?}"
    );
    let explain = s
        .simple_rows("EXPLAIN SELECT clinic, COUNT(*) FROM demo.visits GROUP BY clinic")
        .await
        .expect("EXPLAIN");
    assert!(
        explain.iter().any(|r| r[0].as_deref().is_some_and(|l| l.starts_with(
            "estimates: a capped statistic: each privacy unit counts with at most 10 row(s) in each of at most 5 group(s)"
        ))),
        "{explain:?}"
    );
    // Session statements send none.
    s.batch_execute("SET pgdp.epsilon = 0.5")
        .await
        .expect("SET");
    s.query("SHOW pgdp.budget", &[]).await.expect("SHOW");
    assert!(s.take_notices().is_empty());
    // The simple protocol and psql get it too.
    s.simple_query("SELECT COUNT(*) FROM demo.visits WHERE cost > 100")
        .await
        .expect("simple");
    assert!(s
        .take_notices()
        .iter()
        .any(|n| n.starts_with("pgdp: charged")));
    let run = proxy
        .psql(
            &["-A", "-t"],
            &["SELECT COUNT(*) FROM demo.visits WHERE cost > 200"],
        )
        .await;
    run.assert_ok();
    assert!(
        run.stderr
            .lines()
            .any(|l| l.starts_with("NOTICE:  pgdp: charged")),
        "{run:?}"
    );
    proxy.stop().await;
}

#[tokio::test]
async fn released_values_are_never_nan_and_counts_never_negative() {
    let proxy = rich_proxy(27).await;
    let s = proxy.connect().await;
    // Empty groups (no one is older than 200) with large noise: counts near zero, averages and
    // variances of (almost) nothing. Every public region and sex is still released.
    let queries = [
        "SELECT region, COUNT(*), AVG(income), SUM(income), VARIANCE(income), STDDEV(income)
         FROM demo.people WHERE age > 200 GROUP BY region",
        "SELECT sex, education, COUNT(*), AVG(age), SUM(age), VARIANCE(age), STDDEV(age)
         FROM demo.people WHERE age > 200 GROUP BY sex, education",
        "SELECT sex, COUNT(*), AVG(cost), STDDEV(cost)
         FROM demo.visits JOIN demo.people USING (person_id) WHERE cost < 0 GROUP BY sex",
    ];
    let mut released = 0;
    for epsilon in [0.1, 0.3, 1.0] {
        set_epsilon(&s, epsilon).await;
        for sql in queries {
            let rows = s
                .query(sql, &[])
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e:?}"));
            assert!(!rows.is_empty(), "{sql}: public keys are zero-filled");
            for row in &rows {
                for (i, column) in row.columns().iter().enumerate() {
                    match column.type_().name() {
                        "int8" => {
                            let v: Option<i64> = row.get(i);
                            if let Some(v) = v {
                                assert!(v >= 0, "{sql}: {} = {v}", column.name());
                            }
                        }
                        "float8" | "numeric" => {
                            let v: Option<Number> = row.get(i);
                            if let Some(Number(v)) = v {
                                assert!(v.is_finite(), "{sql}: {} = {v}", column.name());
                                if column.name() != "sum" {
                                    assert!(v >= 0.0, "{sql}: {} = {v}", column.name());
                                }
                            }
                            released += 1;
                        }
                        _ => {}
                    }
                }
            }
        }
    }
    assert!(released > 100, "too few real values released: {released}");
    proxy.stop().await;
}

#[tokio::test]
async fn division_and_conditional_expressions_are_answered() {
    let proxy = rich_proxy(28).await;
    let s = proxy.connect().await;
    let queries = [
        "SELECT COUNT(*) FROM demo.people WHERE 1 / (age - 30) > 0",
        "SELECT COUNT(*) FROM demo.people WHERE income / 0 > 1",
        "SELECT SUM(age / 2) FROM demo.people",
        "SELECT COUNT(*) FROM demo.people WHERE coalesce(age, 0) > 10",
        "SELECT COUNT(*) FROM demo.people WHERE greatest(age, 10) > 10",
        "SELECT COUNT(*) FROM demo.people WHERE least(age, 10) < 10",
        "SELECT COUNT(*) FROM demo.people WHERE nullif(age, 5) > 10",
    ];
    let mut failed = Vec::new();
    for sql in queries {
        if let Err(e) = s.query(sql, &[]).await {
            failed.push((sql, e.code().map(|c| c.code().to_string())));
        }
    }
    assert!(failed.is_empty(), "{failed:?}");
    proxy.stop().await;
}

#[tokio::test]
async fn expressions_over_aggregates_are_post_processed_by_postgresql() {
    use tokio_postgres::error::SqlState;
    let proxy = rich_proxy(27).await;
    let s = proxy.connect().await;
    let truth = true_region_counts().await;
    let total: i64 = truth.values().sum();
    set_epsilon(&s, 2.0).await;
    let before = s.budget().await.epsilon_spent;

    // ROUND, a share of the released total (a window over the released rows), ORDER BY on it.
    let sql = "SELECT region, ROUND(AVG(income), 2) AS avg_income, 100.0 * COUNT(*) / SUM(COUNT(*)) OVER () AS share \
               FROM demo.people GROUP BY region ORDER BY share DESC";
    let rows = s.simple_rows(sql).await.expect("post-processed query");
    assert_eq!(rows.len(), REGIONS.len(), "{rows:?}");
    let after = s.budget().await.epsilon_spent;
    assert!(
        (after - before - 2.0).abs() < 1e-9,
        "one charge of the query's epsilon, nothing for post-processing: {before} -> {after}"
    );
    let mut shares = Vec::new();
    for row in &rows {
        let region = row[0].clone().expect("region");
        let avg = row[1].clone().expect("avg_income");
        let decimals = avg.split('.').nth(1).map_or(0, str::len);
        assert_eq!(decimals, 2, "ROUND(…, 2) prints two decimals: {avg}");
        let share: f64 = row[2].as_deref().expect("share").parse().expect("share");
        // Two measures at ε = 2 (count, and the centred sum of AVG): b = 1 per count, so the
        // count is within 20; the share within 20·100/total plus the total's own noise.
        let true_share = 100.0 * truth[&region] as f64 / total as f64;
        assert!(
            (share - true_share).abs() < 0.5,
            "{region}: share {share} vs {true_share}"
        );
        shares.push(share);
    }
    let sum: f64 = shares.iter().sum();
    assert!((sum - 100.0).abs() < 1e-6, "shares add up to 100: {sum}");
    assert!(shares.windows(2).all(|w| w[0] >= w[1]), "{shares:?}");

    // The same query again is the same answer, free.
    assert_eq!(s.simple_rows(sql).await.expect("replayed"), rows);
    assert!((s.budget().await.epsilon_spent - after).abs() < 1e-9);

    // What PostgreSQL refuses for the same SQL is refused before anything is charged, with
    // PostgreSQL's SQLSTATE.
    let refused = crate::support::assert_code(
        s.simple_rows("SELECT ROUND(COUNT(*)::float8, 2) FROM demo.people")
            .await,
        &SqlState::UNDEFINED_FUNCTION,
        "round(double precision, integer)",
    );
    let message = refused.as_db_error().map(|e| e.message().to_string());
    assert_eq!(
        message.as_deref(),
        Some("function round(double precision, integer) does not exist"),
        "PostgreSQL's own message, with the name the analyst wrote"
    );
    assert!((s.budget().await.epsilon_spent - after).abs() < 1e-9);
    // A column of a private table outside an aggregate is still a per-row value.
    crate::support::assert_code(
        s.simple_rows("SELECT COUNT(*) + age FROM demo.people")
            .await,
        &SqlState::INSUFFICIENT_PRIVILEGE,
        "a private column beside an aggregate",
    );

    // Metabase's wrapper around every native question: the inner query is the DP query.
    set_epsilon(&s, 1.9).await;
    let wrapped = s
        .simple_rows(
            "SELECT \"source\".* FROM (SELECT region, COUNT(*) AS \"count\" FROM demo.people GROUP BY region ORDER BY region) AS \"source\" LIMIT 2000",
        )
        .await
        .expect("Metabase wrapper");
    let regions: Vec<String> = wrapped
        .iter()
        .map(|r| r[0].clone().expect("region"))
        .collect();
    let mut sorted = regions.clone();
    sorted.sort();
    assert_eq!(regions, sorted);
    assert_eq!(regions.len(), REGIONS.len());
    for row in &wrapped {
        let region = row[0].as_deref().expect("region");
        let count: i64 = row[1].as_deref().expect("count").parse().expect("count");
        assert!(
            (count - truth[region]).abs() as f64 <= tolerance(1.0),
            "{region}: {count} vs {}",
            truth[region]
        );
    }

    // An outer query filtering the released rows.
    set_epsilon(&s, 1.8).await;
    let threshold = 13_000;
    let expected: BTreeSet<String> = truth
        .iter()
        .filter(|(_, c)| **c > threshold)
        .map(|(r, _)| r.clone())
        .collect();
    let filtered: BTreeSet<String> = s
        .simple_rows(&format!(
            "SELECT s.region FROM (SELECT region, COUNT(*) AS n FROM demo.people GROUP BY region) s WHERE s.n > {threshold}"
        ))
        .await
        .expect("outer WHERE")
        .into_iter()
        .map(|r| r[0].clone().expect("region"))
        .collect();
    assert_eq!(filtered, expected);
    s.assert_alive("post-processing").await;
    proxy.stop().await;
}

/// Semijoins on the privacy unit (issue 15): `IN`, correlated `EXISTS`, `NOT EXISTS` and `IN` with
/// a per-person `HAVING` answer near what PostgreSQL gives the same SQL directly on the upstream,
/// each is charged once, exactly the query's ε (one charge notice), with the caps of the outer
/// query (EXPLAIN's cost and measures equal those of the query without the semijoin), and EXPLAIN
/// shows the `[NOT] EXISTS` the rewrite sends.
#[tokio::test]
async fn semijoin_answers_are_near_the_truth_and_charged_once() {
    let proxy = rich_proxy(31).await;
    let s = proxy.connect().await;
    set_epsilon(&s, 1.0).await;
    let up = upstream_client().await;
    // COUNT(*) of people per region (a public list of 10): one measure, Δ = 1 (one row and one
    // group per person), so b = 1 at ε = 1.
    let queries = [
        "SELECT region, COUNT(*) FROM demo.people WHERE person_id IN (SELECT person_id FROM demo.visits WHERE diagnosis = 'J06') GROUP BY region",
        "SELECT region, COUNT(*) FROM demo.people p WHERE EXISTS (SELECT 1 FROM demo.visits v WHERE v.person_id = p.person_id AND v.clinic = 'C01') GROUP BY region",
        "SELECT region, COUNT(*) FROM demo.people p WHERE NOT EXISTS (SELECT 1 FROM demo.visits v WHERE v.person_id = p.person_id AND v.visit_date >= DATE '2024-01-01') GROUP BY region",
        "SELECT region, COUNT(*) FROM demo.people WHERE person_id IN (SELECT person_id FROM demo.visits GROUP BY person_id HAVING COUNT(*) > 10) GROUP BY region",
    ];
    for sql in queries {
        let before = s.budget().await;
        s.take_notices();
        let rows = s
            .query(sql, &[])
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e:?}"));
        let charges = s
            .take_notices()
            .into_iter()
            .filter(|n| n.starts_with("pgdp: charged"))
            .count();
        assert_eq!(charges, 1, "{sql}: one charge notice");
        let after = s.budget().await;
        assert!(
            (after.epsilon_spent - before.epsilon_spent - 1.0).abs() < 1e-9,
            "{sql}: charged {}",
            after.epsilon_spent - before.epsilon_spent
        );
        let truth: BTreeMap<String, i64> = up
            .query(sql, &[])
            .await
            .expect("the same SQL on the upstream")
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        // The semijoin filters: fewer people than the table holds, and not none.
        let total: i64 = truth.values().sum();
        assert!((1_000..90_000).contains(&total), "{sql}: truth {total}");
        assert_eq!(rows.len(), 10, "{sql}: every region");
        for r in &rows {
            let region: String = r.get(0);
            let count: i64 = r.get(1);
            let t = truth.get(&region).copied().unwrap_or(0);
            assert!(
                (count - t).abs() as f64 <= tolerance(1.0),
                "{sql}: {region} released {count}, truth {t}"
            );
        }
    }

    // A parameter inside the subquery is bound like one in WHERE (extended protocol).
    let sql = "SELECT COUNT(*) FROM demo.people WHERE person_id IN (SELECT person_id FROM demo.visits WHERE diagnosis = $1)";
    let released: i64 = s
        .query_one(sql, &[&"J06"])
        .await
        .expect("a bound parameter in the subquery")
        .get(0);
    let truth: i64 = up
        .query_one(sql, &[&"J06"])
        .await
        .expect("the same SQL on the upstream")
        .get(0);
    assert!(
        (released - truth).abs() as f64 <= tolerance(1.0),
        "released {released}, truth {truth}"
    );

    // Visits of the oldest people: each person counts at most 10 visits (demo.visits' cap), so
    // the truth is the capped count; Δ = 10, b = 10 at ε = 1.
    let sql = "SELECT COUNT(*) FROM demo.visits WHERE person_id IN (SELECT person_id FROM demo.people WHERE age > 90)";
    let released: i64 = s.query_one(sql, &[]).await.expect(sql).get(0);
    let capped: i64 = up
        .query_one(
            "SELECT sum(least(n, 10))::int8 FROM (SELECT person_id, count(*) AS n FROM demo.visits
             WHERE person_id IN (SELECT person_id FROM demo.people WHERE age > 90) GROUP BY person_id) t",
            &[],
        )
        .await
        .expect("capped truth")
        .get(0);
    assert!(
        (released - capped).abs() as f64 <= tolerance(10.0),
        "released {released}, capped truth {capped}"
    );

    // EXPLAIN shows the rewrite, and the semijoin changes neither the cost nor the measures.
    let explain = s
        .simple_rows(&format!("EXPLAIN {}", queries[2]))
        .await
        .expect("EXPLAIN");
    let text: Vec<String> = explain
        .iter()
        .filter_map(|r| r[0].as_deref().map(|l| l.trim().to_string()))
        .collect();
    let text = text.join(" ");
    assert!(
        text.contains("NOT EXISTS (SELECT 1 FROM \"demo\".\"visits\""),
        "{text}"
    );
    let plain = s
        .simple_rows("EXPLAIN SELECT region, COUNT(*) FROM demo.people GROUP BY region")
        .await
        .expect("EXPLAIN");
    for prefix in ["cost:", "measure count(*)"] {
        assert_eq!(
            explain_line(&explain, prefix),
            explain_line(&plain, prefix),
            "{prefix}"
        );
    }
    proxy.stop().await;
}

/// Regression: DP queries ran in the upstream's own time zone whatever the analyst had SET, so
/// `date_trunc('month', d)` of a date gave other months (UTC midnights) than PostgreSQL gives the
/// same session, printed with `+00`. Now they run under the session's `TimeZone`; a zone
/// PostgreSQL does not know is refused at SET (22023) instead of failing every query later,
/// after its charge; and the replay cache keeps an answer per zone.
#[tokio::test]
async fn dp_answers_follow_the_sessions_time_zone() {
    let proxy = rich_proxy(37).await;
    let s = proxy.connect().await;
    let query = "SELECT date_trunc('month', visit_date) AS m, COUNT(*) FROM demo.visits \
                 WHERE visit_date < DATE '2023-04-01' GROUP BY 1 ORDER BY 1";
    let keys = |rows: Vec<Vec<Option<String>>>| -> Vec<String> {
        rows.into_iter()
            .map(|r| r[0].clone().expect("a month"))
            .collect()
    };
    let upstream = upstream_client().await;
    for zone in ["America/New_York", "Asia/Tokyo", "UTC"] {
        s.batch_execute(&format!("SET TimeZone = '{zone}'"))
            .await
            .expect("a known zone");
        let released = keys(s.simple_rows(query).await.expect("DP query"));
        upstream
            .batch_execute(&format!("SET TimeZone = '{zone}'"))
            .await
            .expect("zone upstream");
        let truth: Vec<String> = upstream
            .simple_query(
                "SELECT date_trunc('month', visit_date) FROM demo.visits \
                 WHERE visit_date < DATE '2023-04-01' GROUP BY 1 ORDER BY 1",
            )
            .await
            .expect("truth")
            .into_iter()
            .filter_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_string),
                _ => None,
            })
            .collect();
        // Each month of the first quarter has thousands of visits: partition selection keeps
        // all three at ε = 1 whatever the noise.
        assert_eq!(released, truth, "{zone}");
    }
    let before = s.budget().await;
    let error = s
        .batch_execute("SET TimeZone = 'Mars/Olympus_Mons'")
        .await
        .expect_err("an unknown zone");
    assert_eq!(
        crate::support::code(&error),
        &tokio_postgres::error::SqlState::INVALID_PARAMETER_VALUE
    );
    assert_eq!(s.show("TimeZone").await, "UTC", "the zone is unchanged");
    s.simple_rows(query).await.expect("the session goes on");
    assert_eq!(
        s.budget().await.epsilon_spent,
        before.epsilon_spent,
        "UTC's answer again, from the replay cache"
    );
}

/// A join of visits to people on the privacy unit, people.person_id being the primary key
/// upstream, is aggregated per person below the join (docs/privacy.md, "Lookups on the privacy
/// unit"): EXPLAIN shows `__dp_below`, and the counts are those of the general form, close to
/// the capped truth. Each person has one region (the key is a column of people), so a person
/// has one group and the sensitivity of COUNT(*) is `max_rows_per_unit` = 10, not the policy's
/// 5 groups · 10 (docs/privacy.md, "One group per unit through a lookup"). Tolerance: at ε = 10
/// and at most 3 shares, b ≤ 3.
#[tokio::test]
async fn a_join_to_one_row_per_unit_is_aggregated_below_the_join() {
    let proxy = rich_proxy(42).await;
    let s = proxy.connect().await;
    set_epsilon(&s, 10.0).await;
    let sql = "SELECT region, COUNT(*), AVG(cost) FROM demo.visits v JOIN demo.people p USING (person_id) WHERE p.age >= 18 AND v.cost >= 0 GROUP BY region ORDER BY region";
    let explain = s
        .simple_rows(&format!("EXPLAIN {sql}"))
        .await
        .expect("EXPLAIN");
    let text: String = explain
        .iter()
        .filter_map(|r| r[0].as_deref())
        .collect::<Vec<_>>()
        .join("\n");
    assert!(text.contains("__dp_below"), "{text}");
    assert!(!text.contains("ROW_NUMBER"), "one group per unit: {text}");
    assert!(
        explain_line(&explain, "groups per unit: 1").contains("demo.people"),
        "{text}"
    );
    assert!(
        explain_line(&explain, "measure count(*)").contains("sensitivity 10.000000"),
        "{text}"
    );
    let up = upstream_client().await;
    let truth = up
        .query(
            "SELECT region, sum(least(n, 10))::bigint FROM (SELECT person_id, count(*) AS n \
             FROM demo.visits WHERE cost >= 0 GROUP BY person_id) u JOIN demo.people USING (person_id) \
             WHERE age >= 18 GROUP BY region ORDER BY region",
            &[],
        )
        .await
        .expect("truth");
    let rows = s.query(sql, &[]).await.expect("DP query");
    assert_eq!(rows.len(), truth.len(), "every public region is released");
    for (r, t) in rows.iter().zip(&truth) {
        let (region, n): (String, i64) = (r.get(0), r.get(1));
        assert_eq!(region, t.get::<_, String>(0));
        let want: i64 = t.get(1);
        assert!((n - want).abs() <= 60, "{region}: {n} vs {want}");
        let Number(avg) = r.get(2);
        assert!((0.0..=2000.0).contains(&avg), "{region}: mean cost {avg}");
    }
}
