//! Contribution bounds chosen per query (`SET pgdp.choose_bounds = on`, docs/privacy.md
//! "Contribution bounds chosen per query"), through the wire against the demo data, compared
//! with PostgreSQL's own answer (not the capped statistic).
//!
//! The policy is the demo's, whose visits' caps (10 rows per person and group in 5 groups) rise
//! to ceilings of 40 rows (a person has at most 40 visits) in 16 groups when a query chooses
//! them. Noise is seeded (each test always passes or always fails); the tolerances are many
//! noise scales wide: at ε = 1 the count's Laplace scale is at most 40·16/0.9 ≈ 711 at the
//! ceilings, far less at the caps chosen, against totals of a million and clinic counts in the
//! thousands.

use crate::support::{Proxy, Session};

/// The demo policy with `choose_bounds` as given (its default is on).
fn policy(choose_bounds: bool) -> pgdp::policy::Policy {
    let mut text = crate::support::ceiling_policy_text();
    if !choose_bounds {
        text = text.replace("  choose_bounds: true\n", "  choose_bounds: false\n");
        assert!(
            text.contains("choose_bounds: false"),
            "the demo policy's defaults moved"
        );
    }
    pgdp::policy::parse(&text).expect("a valid policy")
}

/// PostgreSQL's answer to `sql` on the demo data: one row of `(key, count)`, or `(None, count)`.
async fn exact(sql: &str) -> Vec<(Option<String>, i64)> {
    let client = crate::support::upstream_client().await;
    client
        .query(sql, &[])
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .iter()
        .map(|r| {
            if r.len() == 1 {
                (None, r.get::<_, i64>(0))
            } else {
                (r.get::<_, Option<String>>(0), r.get::<_, i64>(1))
            }
        })
        .collect()
}

async fn count(session: &Session, sql: &str) -> Vec<(Option<String>, i64)> {
    session
        .simple_rows(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .into_iter()
        .map(|r| match r.as_slice() {
            [n] => (
                None,
                n.as_deref().and_then(|t| t.parse().ok()).expect("a count"),
            ),
            [k, n, ..] => (
                k.clone(),
                n.as_deref().and_then(|t| t.parse().ok()).expect("a count"),
            ),
            _ => panic!("{sql}: an empty row"),
        })
        .collect()
}

/// PostgreSQL's own AVG(cost) over the demo's visits.
async fn postgres_mean_cost() -> f64 {
    crate::support::upstream_client()
        .await
        .query_one("SELECT AVG(cost)::float8 FROM demo.visits", &[])
        .await
        .expect("PostgreSQL's mean")
        .get(0)
}

/// The cap a chosen-bounds NOTICE states (`at most N row(s) per unit`).
fn chosen_cap(notices: &[String]) -> Option<u64> {
    notices.iter().find_map(|n| {
        let rest = n
            .split("contribution bound chosen for this query: at most ")
            .nth(1)?;
        rest.split(' ').next()?.parse().ok()
    })
}

#[tokio::test]
async fn the_total_count_is_within_two_percent_of_postgresql() {
    let proxy = Proxy::with_policy(policy(true), 61).await;
    let session = proxy.connect().await;
    let truth = exact("SELECT COUNT(*) FROM demo.visits").await[0].1;
    let before = session.budget().await;
    let answer = count(&session, "SELECT COUNT(*) FROM demo.visits").await[0].1;
    let notices = session.take_notices();
    let error = (answer - truth).abs() as f64 / truth as f64;
    assert!(
        error < 0.02,
        "{answer} against {truth}: {:.2}% off",
        error * 100.0
    );
    // The cap fits the data (at most 40 visits per person): at least 40, at most the ceiling.
    let cap = chosen_cap(&notices).unwrap_or_else(|| panic!("no chosen cap in {notices:?}"));
    assert!((40..=64).contains(&cap), "chose {cap}: {notices:?}");
    assert!(
        notices.iter().any(|n| n.contains("estimated bias")),
        "{notices:?}"
    );
    assert!(
        !notices.iter().any(|n| n.contains("a capped statistic")),
        "{notices:?}"
    );
    // The histogram's share is inside the query's ε: the charge is ε = 1 in all.
    let after = session.budget().await;
    let spent = after.epsilon_spent - before.epsilon_spent;
    assert!((spent - 1.0).abs() < 1e-9, "spent {spent}");
    // The same query again is the same answer, free.
    let again = count(&session, "SELECT COUNT(*) FROM demo.visits").await[0].1;
    assert_eq!(again, answer);
    assert_eq!(session.budget().await.epsilon_spent, after.epsilon_spent);
}

#[tokio::test]
async fn counts_by_clinic_are_closer_to_postgresql_than_under_the_policys_caps() {
    // Relative error per clinic (50 clinics, thousands of visits each), median and worst, with
    // the cap chosen and with the policy's demo cap of 10 (the demo policy as shipped).
    let sql = "SELECT clinic, COUNT(*) FROM demo.visits GROUP BY clinic ORDER BY clinic";
    let truth: std::collections::BTreeMap<Option<String>, i64> =
        exact("SELECT clinic, COUNT(*)::int8 FROM demo.visits GROUP BY clinic ORDER BY clinic")
            .await
            .into_iter()
            .collect();
    let errors = |answer: Vec<(Option<String>, i64)>| -> Vec<f64> {
        let mut e: Vec<f64> = answer
            .iter()
            .map(|(k, v)| {
                let t = truth[k] as f64;
                (*v as f64 - t).abs() / t
            })
            .collect();
        e.sort_by(f64::total_cmp);
        e
    };
    let chosen = {
        let proxy = Proxy::with_policy(policy(true), 62).await;
        let session = proxy.connect().await;
        let answer = count(&session, sql).await;
        let notices = session.take_notices();
        assert!(chosen_cap(&notices).is_some(), "{notices:?}");
        assert!(
            notices
                .iter()
                .any(|n| n.contains("of the units had more groups")
                    || n.contains("of the units had more rows in all")),
            "{notices:?}"
        );
        assert_eq!(answer.len(), truth.len(), "every clinic is selected");
        errors(answer)
    };
    let fixed = {
        let proxy = Proxy::with_policy(policy(false), 62).await;
        let session = proxy.connect().await;
        errors(count(&session, sql).await)
    };
    // With the policy's ceilings (40 visits in 16 groups) the caps chosen fit the data, against
    // the tables' caps of 10 visits in 5 groups.
    let median = |e: &[f64]| e[e.len() / 2];
    // Issue 41's target: within 2 % of PostgreSQL's count per clinic at ε = 1 (a cap on each
    // person's visits over all clinics makes it about 0.3 % in docs/utility.md).
    assert!(
        median(&chosen) < 0.02,
        "median relative error {:.4} with the chosen caps",
        median(&chosen)
    );
    assert!(
        median(&chosen) < 0.75 * median(&fixed),
        "median relative error {:.3} chosen against {:.3} under the policy's caps",
        median(&chosen),
        median(&fixed)
    );
}

#[tokio::test]
async fn another_query_over_the_same_measures_reuses_the_chosen_caps_free() {
    let proxy = Proxy::with_policy(policy(true), 64).await;
    let session = proxy.connect().await;
    let counts = count(
        &session,
        "SELECT clinic, COUNT(*) FROM demo.visits GROUP BY clinic ORDER BY clinic",
    )
    .await;
    let first = session.take_notices();
    let cap = chosen_cap(&first).unwrap_or_else(|| panic!("no chosen cap in {first:?}"));
    let spent = session.budget().await.epsilon_spent;
    // The same count by clinic with a label and a filter on it: post-processing of the same
    // noisy counts, at the caps the first query chose, charged nothing.
    let labelled = session
        .simple_rows(
            "SELECT clinic, CASE WHEN COUNT(*) > 100000 THEN 'busy' ELSE 'quiet' END AS load, COUNT(*)::int AS visits FROM demo.visits GROUP BY clinic ORDER BY visits DESC",
        )
        .await
        .expect("the labelled counts");
    let notices = session.take_notices();
    assert_eq!(session.budget().await.epsilon_spent, spent, "{notices:?}");
    assert!(
        notices.iter().any(
            |n| n.contains("at the contribution bounds that query chose")
                && n.contains("charged nothing")
        ),
        "{notices:?}"
    );
    assert_eq!(chosen_cap(&notices), Some(cap), "{notices:?}");
    assert_eq!(labelled.len(), counts.len());
    for row in &labelled {
        let visits: i64 = row[2]
            .as_deref()
            .and_then(|t| t.parse().ok())
            .expect("visits");
        assert!(
            counts.contains(&(row[0].clone(), visits)),
            "{row:?} is not one of the first answer's counts"
        );
        assert_eq!(
            row[1].as_deref(),
            Some(if visits > 100000 { "busy" } else { "quiet" })
        );
    }
    // Without the choice, the same query is another release, at the tables' caps: charged.
    session
        .simple_rows("SET pgdp.choose_bounds = off")
        .await
        .expect("the setting");
    session
        .simple_rows("SELECT clinic, COUNT(*) FROM demo.visits GROUP BY clinic")
        .await
        .expect("the counts at the tables' caps");
    assert!(session.budget().await.epsilon_spent > spent);
}

#[tokio::test]
async fn explain_states_the_rule_and_the_setting_turns_it_off() {
    let proxy = Proxy::with_policy(policy(true), 63).await;
    let session = proxy.connect().await;
    assert_eq!(session.show("pgdp.choose_bounds").await, "on");
    let lines: Vec<String> = session
        .simple_rows("EXPLAIN SELECT clinic, COUNT(*) FROM demo.visits GROUP BY clinic")
        .await
        .expect("EXPLAIN")
        .into_iter()
        .filter_map(|r| r.into_iter().next().flatten())
        .collect();
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("contribution bounds chosen per query")),
        "{lines:?}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("cost with the choice of bounds")),
        "{lines:?}"
    );
    session
        .simple_rows("SET pgdp.choose_bounds = off")
        .await
        .expect("SET");
    session
        .simple_rows("SELECT COUNT(*) FROM demo.visits")
        .await
        .expect("a count");
    let notices = session.take_notices();
    assert!(chosen_cap(&notices).is_none(), "{notices:?}");
    assert!(
        notices.iter().any(|n| n.contains("a capped statistic")),
        "{notices:?}"
    );
    let e = session
        .simple_rows("SET pgdp.choose_bounds = sometimes")
        .await
        .expect_err("not a boolean");
    assert_eq!(
        e.code(),
        Some(&tokio_postgres::error::SqlState::INVALID_PARAMETER_VALUE)
    );
    session.assert_alive("a refused SET").await;
}

#[tokio::test]
async fn accuracy_columns_include_the_estimated_shortfall() {
    // The demo policy without its ceilings: the tables' caps (10 visits per person) are then the
    // ceilings, which bind for the heavier half of the visits.
    let text = crate::support::ceiling_policy_text().replace(
        "    ceilings: { max_rows_per_unit: 40, max_groups_per_unit: 16 }\n",
        "",
    );
    let policy = pgdp::policy::parse(&text).expect("a valid policy");
    assert!(
        policy
            .table("demo.visits")
            .and_then(|t| t.private())
            .is_some_and(|p| p.rows_ceiling == 10),
        "the visits' ceiling is their cap"
    );
    let proxy = Proxy::with_policy(policy, 64).await;
    let session = proxy.connect().await;
    // Under pgdp.max_bias = 0.1, a count the caps leave half short is refused (22000), naming
    // the share removed; with the setting off it is answered with its error.
    for set in ["SET pgdp.choose_bounds = on", "SET pgdp.max_bias = 0.1"] {
        session.simple_rows(set).await.expect("SET");
    }
    let refused = session
        .simple_rows("SELECT COUNT(*) FROM demo.visits")
        .await
        .expect_err("a count the caps bias beyond pgdp.max_bias");
    assert_eq!(
        crate::support::code(&refused).code(),
        "22000",
        "{refused:?}"
    );
    assert!(
        refused
            .as_db_error()
            .is_some_and(|e| e.message().contains("pgdp.max_bias")),
        "{refused:?}"
    );
    session.take_notices();
    for set in ["SET pgdp.max_bias = off", "SET pgdp.accuracy = on"] {
        session.simple_rows(set).await.expect("SET");
    }
    let rows = session
        .simple_rows("SELECT COUNT(*) FROM demo.visits")
        .await
        .expect("a count");
    let notices = session.take_notices();
    let cap = chosen_cap(&notices).unwrap_or_else(|| panic!("{notices:?}"));
    assert!(cap <= 10, "the policy's cap is the ceiling: chose {cap}");
    let value: f64 = rows[0][0]
        .as_deref()
        .and_then(|t| t.parse().ok())
        .expect("count");
    let error95: f64 = rows[0][1]
        .as_deref()
        .and_then(|t| t.parse().ok())
        .expect("error");
    let truth = exact("SELECT COUNT(*) FROM demo.visits").await[0].1 as f64;
    // Capped at 10 visits a person, about half the visits are left out; the stated error now
    // reaches PostgreSQL's answer (it estimates the shortfall from the noisy histogram).
    assert!(value < 0.7 * truth, "{value} against {truth}");
    assert!(
        value + error95 > 0.9 * truth && value + error95 < 1.3 * truth,
        "{value} ± {error95} against {truth}"
    );
}

#[tokio::test]
async fn a_too_inaccurate_answer_is_an_error_for_tools_that_never_show_notices() {
    // At ε = 0.05 the count of the few thousand costly visits has a 95 % error of hundreds,
    // far above 1 % of it: refused after the charge with 22000, and asked again, refused again
    // for free; without the setting the same rows are replayed, free.
    let proxy = Proxy::start(65).await;
    let session = proxy.connect().await;
    let sql = "SELECT COUNT(*) FROM demo.visits WHERE cost > 1000";
    for set in [
        "SET pgdp.epsilon = 0.05",
        "SET pgdp.max_relative_error = 0.01",
    ] {
        session.simple_rows(set).await.expect("SET");
    }
    let before = session.budget().await;
    let e = session.simple_rows(sql).await.expect_err("too inaccurate");
    assert_eq!(
        e.code(),
        Some(&tokio_postgres::error::SqlState::DATA_EXCEPTION),
        "{e:?}"
    );
    let charged = session.budget().await;
    assert!(
        charged.epsilon_spent > before.epsilon_spent,
        "the refusal comes after the charge"
    );
    let again = session.simple_rows(sql).await.expect_err("refused again");
    assert_eq!(
        again.code(),
        Some(&tokio_postgres::error::SqlState::DATA_EXCEPTION)
    );
    assert_eq!(
        session.budget().await.epsilon_spent,
        charged.epsilon_spent,
        "replayed, free"
    );
    session
        .simple_rows("SET pgdp.max_relative_error = off")
        .await
        .expect("SET");
    let rows = session.simple_rows(sql).await.expect("the rows, replayed");
    assert!(!rows.is_empty());
    assert_eq!(
        session.budget().await.epsilon_spent,
        charged.epsilon_spent,
        "replayed, free"
    );
    // A generous share lets an accurate answer through.
    session
        .simple_rows("SET pgdp.max_relative_error = '50%'")
        .await
        .expect("SET");
    session
        .simple_rows("SET pgdp.epsilon = 1")
        .await
        .expect("SET");
    session
        .simple_rows("SELECT COUNT(*) FROM demo.visits")
        .await
        .expect("an accurate count passes");
    session.assert_alive("a refusal after the charge").await;
}

#[tokio::test]
async fn the_mean_of_a_clamped_column_states_what_clamping_removed() {
    // Without the demo's upper_ceiling, visit costs are clamped into [0, 2000], but 0.1 % of
    // the visits cost 5,000 to 200,000 and carry about half of the total: AVG(cost) is about
    // half of PostgreSQL's. The NOTICE estimates that share from DP histograms of each person's
    // values outside the bounds, and the _error95 of the mean reaches PostgreSQL's answer. With
    // a stated limit on the relative error, a dashboard gets an error instead of the mean.
    let text = crate::support::ceiling_policy_text().replace(", upper_ceiling: 200000", "");
    assert!(
        !text.contains("upper_ceiling"),
        "the demo policy has another upper_ceiling"
    );
    let proxy = Proxy::with_policy(pgdp::policy::parse(&text).expect("a valid policy"), 66).await;
    let session = proxy.connect().await;
    session
        .simple_rows("SET pgdp.accuracy = on")
        .await
        .expect("SET");
    let explain = session
        .simple_rows("EXPLAIN SELECT AVG(cost) FROM demo.visits")
        .await
        .expect("EXPLAIN");
    assert!(
        explain.iter().any(|l| l[0]
            .as_deref()
            .is_some_and(|t| t.contains("clamping estimated"))),
        "{explain:?}"
    );
    let rows = session
        .simple_rows("SELECT AVG(cost) FROM demo.visits")
        .await
        .expect("the mean");
    let notices = session.take_notices();
    let number = |i: usize| -> f64 {
        rows[0][i]
            .as_deref()
            .and_then(|t| t.parse().ok())
            .unwrap_or_else(|| panic!("{rows:?}"))
    };
    let (mean, error95) = (number(0), number(1));
    let truth = postgres_mean_cost().await;
    let clause = notices
        .iter()
        .find_map(|n| n.split("clamping removed about ").nth(1))
        .unwrap_or_else(|| panic!("no clamp estimate in {notices:?}"));
    let share: f64 = clause
        .split('%')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("{clause}"));
    assert!(
        (25.0..=75.0).contains(&share),
        "clamping removed {share}% of the sum: {notices:?}"
    );
    assert!(
        notices
            .iter()
            .any(|n| n.contains("(visits.cost in [0, 2000])")),
        "{notices:?}"
    );
    assert!(
        !notices.iter().any(|n| n.contains("a bias neither")),
        "the estimated argument is not also called unestimated: {notices:?}"
    );
    assert!(mean < 0.75 * truth, "{mean} against {truth}");
    // The estimate is noisy and reads buckets at their midpoints (small buckets as empty), so
    // it is checked to reach most of the way to PostgreSQL's mean, not all of it.
    assert!(
        mean + error95 > 0.8 * truth && mean + error95 < 1.5 * truth,
        "{mean} ± {error95} against {truth}"
    );
    // Under a limit of 20 % on the stated error, the mean is refused after its charge.
    session
        .simple_rows("SET pgdp.max_relative_error = '20%'")
        .await
        .expect("SET");
    let e = session
        .simple_rows("SELECT AVG(cost) AS mean_cost FROM demo.visits")
        .await
        .expect_err("too inaccurate");
    assert_eq!(
        e.code(),
        Some(&tokio_postgres::error::SqlState::DATA_EXCEPTION),
        "{e:?}"
    );
}

/// `pgdp suggest` (issue 41 item 4): from DP histograms of the demo data, the share of rows
/// each candidate cap removes, the caps a query would choose and what clamping removes, with
/// the ε the report spent. Noise comes from the OS, so the tolerances are wide: each histogram
/// bucket has Laplace noise of scale at most 16/0.05 = 320 against shares of a million visits.
#[tokio::test]
async fn suggest_shows_what_each_cap_would_remove_from_dp_histograms() {
    let db = crate::harness::demo_database(1).await;
    let policy = concat!(env!("CARGO_MANIFEST_DIR"), "/policies/demo.yaml");
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_pgdp"))
        .args(["suggest", "--policy", policy, "--upstream", db.dsn()])
        .output()
        .await
        .expect("pgdp suggest");
    let text = String::from_utf8_lossy(&output.stdout).to_string();
    assert!(
        output.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    // The total count of visits: a cap of 2 visits per person removes most of them (PostgreSQL:
    // 87 %), the ceiling of 40 (every visit of the heaviest person) almost none.
    let section = text
        .split("SELECT COUNT(*) FROM \"demo\".\"visits\"")
        .nth(1)
        .expect("a section for the count of visits");
    let removed: Vec<f64> = section
        .lines()
        .find(|l| l.trim_start().starts_with("rows removed"))
        .expect("a line of shares removed")
        .split_whitespace()
        .skip(2)
        .map(|p| {
            p.trim_end_matches('%')
                .trim_start_matches('<')
                .parse()
                .expect("a share")
        })
        .collect();
    assert!(removed[0] > 70.0 && removed[0] < 95.0, "{section}");
    assert!(*removed.last().expect("the ceiling") < 3.0, "{section}");
    assert!(
        removed.windows(2).all(|w| w[0] >= w[1]),
        "a larger cap never removes more: {section}"
    );
    assert!(
        text.contains("groups      2      3"),
        "a grid for grouped counts: {text}"
    );
    assert!(
        text.contains("upper bound chosen (visits.cost in [0, ")
            && text.contains("the policy allows up to 200000)"),
        "{text}"
    );
    assert!(
        text.contains("demo.people (privacy unit person_id): caps 1 row(s) in each of 1 group(s)")
            && text.contains("nothing to choose"),
        "{text}"
    );
    // 8 statements at 0.1 (a count and 4 groupings of demo.visits, a timestamp's by the day; a
    // count and 2 groupings of demo.prescriptions) and 2 sums at 0.15.
    assert!(
        text.contains("epsilon spent on this report: 1.1 (pure DP"),
        "{text}"
    );
}

#[tokio::test]
async fn a_chosen_upper_bound_brings_the_mean_of_a_heavy_tailed_column_closer() {
    // With the demo's `upper_ceiling: 200000` on visits.cost (no visit costs more), a
    // query may clamp cost anywhere up to 200,000, chosen from a DP histogram of each person's
    // largest cost against the noise of the sum at that bound. Under the policy's [0, 2000]
    // the mean is about half of PostgreSQL's (the test above); with the bound chosen it is
    // nearer, and the NOTICE and EXPLAIN say which bound was taken and from what.
    let text = crate::support::ceiling_policy_text();
    assert!(
        text.contains(
            "cost:       { type: numeric, lower: 0, upper: 2000, upper_ceiling: 200000 }"
        ),
        "the demo policy's cost bounds moved"
    );
    let proxy = Proxy::with_policy(policy(true), 67).await;
    let session = proxy.connect().await;
    let explain = session
        .simple_rows("EXPLAIN SELECT AVG(cost) FROM demo.visits")
        .await
        .expect("EXPLAIN");
    assert!(
        explain.iter().any(|l| l[0].as_deref().is_some_and(|t| t
            .contains("upper bound chosen per query: visits.cost clamped at one of 21 upper bounds up to the policy's upper_ceiling of 200000"))),
        "{explain:?}"
    );
    let rows = session
        .simple_rows("SELECT AVG(cost) FROM demo.visits")
        .await
        .expect("the mean");
    let notices = session.take_notices();
    let mean: f64 = rows[0][0]
        .as_deref()
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("{rows:?}"));
    let truth = postgres_mean_cost().await;
    let clause = notices
        .iter()
        .find_map(|n| n.split("visits.cost in [0, ").nth(1))
        .unwrap_or_else(|| panic!("no chosen bound in {notices:?}"));
    let upper: f64 = clause
        .split(']')
        .next()
        .and_then(|u| u.parse().ok())
        .unwrap_or_else(|| panic!("{clause}"));
    assert!(
        upper > 2000.0 && upper <= 200_000.0,
        "the chosen bound {upper}: {notices:?}"
    );
    assert!(
        notices
            .iter()
            .any(|n| n.contains("clamped at an upper bound chosen from a DP histogram")),
        "{notices:?}"
    );
    // Under [0, 2000] the mean is below 0.75 of PostgreSQL's; chosen, within 25 %.
    assert!(
        (mean - truth).abs() < 0.25 * truth,
        "{mean} against {truth} (upper bound {upper}): {notices:?}"
    );
    // A variance of the same argument keeps the policy's bounds for all of them (its noise
    // grows with the bound's square, which the choice does not weigh): caps chosen, bound not.
    session
        .simple_rows("SELECT AVG(cost), STDDEV(cost) FROM demo.visits")
        .await
        .expect("the mean and deviation");
    let notices = session.take_notices();
    assert!(chosen_cap(&notices).is_some(), "{notices:?}");
    assert!(
        !notices
            .iter()
            .any(|n| n.contains("clamped at an upper bound chosen")),
        "{notices:?}"
    );
    session.assert_alive("after a chosen bound").await;
}
