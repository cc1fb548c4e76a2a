//! SQL a new analyst types on the demo (issue 42), through the wire and against PostgreSQL's own
//! answer to the same SQL: histograms of per-person counts release only the keys PostgreSQL can
//! return (no row `n = 0`), `width_bucket` with literal bounds is a group key over its `n + 2`
//! buckets, and questions of existence (`EXISTS`, `bool_or`, `bool_and`, `every`) are answered
//! from noisy counts of the same rows, as PostgreSQL answers them where the counts are clear.
//!
//! Tolerances follow from the noise scale b of each count (stated at each use), as in `dp.rs`:
//! discrete Laplace noise exceeds 20·b with probability below e^-20 ≈ 2·10^-9 per value.

use std::collections::BTreeSet;

use tokio_postgres::error::SqlState;
use tokio_postgres::SimpleQueryMessage;

use crate::support::{assert_code, policy_with_budget, upstream_client, Proxy, Session};

/// A proxy whose analyst can afford every query of a test (ε 1000, at most 100 per query).
async fn rich_proxy(seed: u8) -> Proxy {
    Proxy::with_policy(policy_with_budget(1000, 100), seed).await
}

/// The rows of `sql` as text, each the first `width` columns.
async fn rows(
    client: &tokio_postgres::Client,
    sql: &str,
    width: usize,
) -> Vec<Vec<Option<String>>> {
    client
        .simple_query(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e:?}"))
        .into_iter()
        .filter_map(|m| match m {
            SimpleQueryMessage::Row(r) => {
                Some((0..width).map(|i| r.get(i).map(str::to_string)).collect())
            }
            _ => None,
        })
        .collect()
}

/// The keys (first column) of `sql`'s rows, as integers; NULL keys apart.
async fn integer_keys(client: &tokio_postgres::Client, sql: &str) -> BTreeSet<i64> {
    rows(client, sql, 1)
        .await
        .into_iter()
        .filter_map(|r| {
            r[0].as_ref()
                .map(|k| k.parse::<i64>().expect("an integer key"))
        })
        .collect()
}

/// `name type` of each column `client` describes for `sql`.
async fn described(client: &tokio_postgres::Client, sql: &str) -> Vec<String> {
    client
        .prepare(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e:?}"))
        .columns()
        .iter()
        .map(|c| format!("{} {}", c.name(), c.type_().name()))
        .collect()
}

/// Issue 42's wrong answer: `SELECT n, COUNT(*) FROM (SELECT person_id, COUNT(*) AS n … GROUP BY
/// person_id) t GROUP BY n` released a row `n = 0`, which PostgreSQL never returns (every group of
/// `GROUP BY person_id` has a row). Now the keys are those PostgreSQL returns, with its types.
#[tokio::test]
async fn per_unit_count_histograms_release_only_keys_postgresql_can_return() {
    let proxy = rich_proxy(142).await;
    let s = proxy.connect().await;
    let up = upstream_client().await;
    // Bounded by the analyst: every key 1 … 10 holds many people, so the released keys are
    // exactly PostgreSQL's.
    let sql = "SELECT n, COUNT(*) FROM (SELECT person_id, LEAST(COUNT(*), 10) AS n FROM demo.visits GROUP BY person_id) t GROUP BY n";
    let released = integer_keys(&s, sql).await;
    assert_eq!(released, integer_keys(&up, sql).await, "{sql}");
    assert!(!released.contains(&0), "{sql}: a row 0");
    assert_eq!(
        described(&s, sql).await,
        described(&up, sql).await,
        "{sql}: PostgreSQL's types"
    );
    // COUNT(DISTINCT x) of a column the policy declares exhaustive (never NULL) starts at 1 too
    // (demo.prescriptions has no person_id upstream: pgdp derives it through the visit).
    let sql = "WITH u AS (SELECT person_id, LEAST(COUNT(DISTINCT drug), 3) AS n FROM demo.prescriptions GROUP BY person_id) SELECT n, COUNT(*) FROM u GROUP BY n";
    assert_eq!(
        integer_keys(&s, sql).await,
        (1..=3).collect::<BTreeSet<i64>>(),
        "{sql}"
    );
    // The issue's query: the per-person count takes the policy's cap of 10 visits, so the keys
    // are 1 … 10 (PostgreSQL's go on to 40, people over the cap are in row 10); never 0.
    let sql = "SELECT n, COUNT(*) FROM (SELECT person_id, COUNT(*) AS n FROM demo.visits GROUP BY person_id) t GROUP BY n";
    let released = integer_keys(&s, sql).await;
    assert_eq!(released, (1..=10).collect::<BTreeSet<i64>>(), "{sql}");
    let truth = integer_keys(&up, sql).await;
    assert!(
        released.is_subset(&truth),
        "{sql}: {released:?} not among {truth:?}"
    );
    assert_eq!(
        described(&s, sql).await,
        described(&up, sql).await,
        "{sql}: PostgreSQL's types"
    );
    // COUNT(x) of a column that may be NULL is 0 for a person whose every x is NULL: that key
    // stays in the domain (a noisy zero where, as here, the data has no such person).
    for sql in [
        "SELECT n, COUNT(*) FROM (SELECT person_id, LEAST(COUNT(diagnosis), 2) AS n FROM demo.visits GROUP BY person_id) t GROUP BY n",
        "WITH u AS (SELECT person_id, LEAST(COUNT(DISTINCT clinic), 3) AS n FROM demo.visits GROUP BY person_id) SELECT n, COUNT(*) FROM u GROUP BY n",
    ] {
        let released = integer_keys(&s, sql).await;
        assert_eq!(released.first(), Some(&0), "{sql}");
        let truth = integer_keys(&up, sql).await;
        assert!(truth.is_subset(&released), "{sql}: {truth:?} not all in {released:?}");
    }
}

/// `width_bucket(x, lo, hi, n)` with literal bounds and count groups by PostgreSQL's `integer`
/// bucket over the public domain `0 … n + 1`: every bucket PostgreSQL returns is released, the
/// others as noisy zeros, and counts of people are close to PostgreSQL's.
#[tokio::test]
async fn width_bucket_keys_are_postgresql_buckets() {
    let proxy = rich_proxy(143).await;
    let s = proxy.connect().await;
    s.batch_execute("SET pgdp.epsilon = 10")
        .await
        .expect("SET pgdp.epsilon");
    let up = upstream_client().await;
    for (sql, buckets) in [
        ("SELECT width_bucket(age, 0, 100, 10) AS b, COUNT(*) FROM demo.people GROUP BY 1", 10),
        ("SELECT width_bucket(cost, 100, 1900, 4) AS b, COUNT(*) AS visits FROM demo.visits GROUP BY 1", 4),
        ("SELECT width_bucket(income, 0, 250000, 5) AS b, COUNT(*) AS people FROM demo.people GROUP BY 1", 5),
    ] {
        let released = rows(&s, sql, 2).await;
        let keys: BTreeSet<i64> = released
            .iter()
            .map(|r| r[0].as_deref().expect("no NULL key").parse().expect("an integer"))
            .collect();
        assert_eq!(keys, (0..=buckets + 1).collect::<BTreeSet<i64>>(), "{sql}");
        assert_eq!(described(&s, sql).await, described(&up, sql).await, "{sql}: PostgreSQL's types");
        let truth = rows(&up, sql, 2).await;
        let truth_keys: BTreeSet<i64> = truth
            .iter()
            .filter_map(|t| t[0].as_deref().map(|k| k.parse().expect("an integer")))
            .collect();
        assert!(truth_keys.is_subset(&keys), "{sql}: {truth_keys:?} not all in {keys:?}");
        // Visits are counted under the policy's caps (10 per person in a group), so only the
        // counts of people compare with PostgreSQL's.
        if sql.contains("demo.visits") {
            continue;
        }
        for t in &truth {
            let Some(key) = &t[0] else { continue };
            let exact: i64 = t[1].as_deref().expect("a count").parse().expect("a count");
            let noisy: i64 = released
                .iter()
                .find(|r| r[0].as_ref() == Some(key))
                .unwrap_or_else(|| panic!("{sql}: bucket {key} not released"))[1]
                .as_deref()
                .expect("a count")
                .parse()
                .expect("a count");
            // ε 10 on a count of people (sensitivity 1): b = 0.1, 20·b = 2.
            assert!((noisy - exact).abs() <= 2, "{sql}: bucket {key}: {noisy} vs {exact}");
        }
    }
    // Bounds or a count that are not literals are refused before anything runs.
    let before = s.budget().await;
    for sql in [
        "SELECT width_bucket(age, 0, income, 10) AS b, COUNT(*) FROM demo.people GROUP BY 1",
        "SELECT width_bucket(age, age, 100, 10) AS b, COUNT(*) FROM demo.people GROUP BY 1",
    ] {
        assert_code(
            s.simple_query(sql).await,
            &SqlState::FEATURE_NOT_SUPPORTED,
            sql,
        );
    }
    assert_code(
        s.simple_query(
            "SELECT width_bucket(age, 0, 100, 0) AS b, COUNT(*) FROM demo.people GROUP BY 1",
        )
        .await,
        &SqlState::INVALID_PARAMETER_VALUE,
        "a count of 0 buckets (PostgreSQL fails on it)",
    );
    assert_eq!(
        s.budget().await.epsilon_spent,
        before.epsilon_spent,
        "refusals charge nothing"
    );
}

/// The SQL a refusal's hint ends with, after `marker`.
fn hinted_sql(error: &tokio_postgres::Error, marker: &str) -> String {
    let hint = error
        .as_db_error()
        .and_then(|e| e.hint())
        .unwrap_or_else(|| panic!("no hint: {error:?}"));
    hint.rsplit_once(marker)
        .unwrap_or_else(|| panic!("no SQL after {marker:?} in the hint: {hint}"))
        .1
        .to_string()
}

/// Questions of existence are answered from noisy counts of the same rows (existence.rs), with
/// PostgreSQL's column names and types, and agree with PostgreSQL's answer where the counts are
/// far from their noise: at ε 100 per statement (at most six counts share it) each count has a
/// noise of scale about 0.06 (people has one row per person), so its 95 %
/// bound is 0 and a count is misread only when |noise| ≥ 1, probability about 2·e^-16 per count.
/// Each answer is charged once (or, over the same count as an earlier one, is free), and its
/// NOTICE says what a detected count is.
#[tokio::test]
async fn existence_questions_are_answered_from_detected_counts() {
    let proxy = rich_proxy(144).await;
    let s: Session = proxy.connect().await;
    let up = upstream_client().await;
    s.simple_query("SET pgdp.epsilon = 100").await.expect("SET");
    let cases = [
        ("SELECT region, bool_or(age > 90) AS old, bool_and(age >= 18) AS adults, every(age > 30) FROM demo.people GROUP BY region ORDER BY region", 4, true),
        ("SELECT EXISTS (SELECT 1 FROM demo.people WHERE age > 100)", 1, true),
        ("SELECT EXISTS (SELECT 1 FROM demo.people WHERE age > 60 AND region = 'NO' LIMIT 1) AS any_old", 1, true),
        // The same count as the EXISTS above: post-processing of its release, free.
        ("SELECT NOT EXISTS (SELECT 1 FROM demo.people WHERE age > 100)", 1, false),
        ("SELECT bool_or(age > 95) FILTER (WHERE region = 'CE') FROM demo.people", 1, true),
    ];
    for (sql, width, charged) in cases {
        let expected = rows(&up, sql, width).await;
        let before = s.budget().await;
        s.take_notices();
        let answered = rows(&s, sql, width).await;
        assert_eq!(answered, expected, "{sql}");
        assert_eq!(
            s.budget().await.epsilon_spent > before.epsilon_spent,
            charged,
            "{sql}: charged"
        );
        let notices = s.take_notices().join("\n");
        assert!(
            notices.contains("95% noise bound") && !notices.contains("__dp_"),
            "{sql}: {notices}"
        );
        assert_eq!(described(&s, sql).await, described(&up, sql).await, "{sql}");
    }
    // Still refused inside a per-person subquery, with the per-person value that asks the same
    // question in the hint.
    let sql = "SELECT AVG(o) FROM (SELECT person_id, bool_or(cost > 1000)::int AS o FROM demo.visits GROUP BY person_id) t";
    let before = s.budget().await;
    let err = assert_code(
        s.simple_query(sql).await,
        &SqlState::INSUFFICIENT_PRIVILEGE,
        sql,
    );
    assert_eq!(
        s.budget().await.epsilon_spent,
        before.epsilon_spent,
        "{sql}: charged"
    );
    let value = hinted_sql(&err, "is ");
    assert!(value.starts_with("LEAST(COUNT(CASE WHEN"), "{err:?}");
    // The per-person value of the hint runs in the same statement.
    let instead = format!(
        "SELECT AVG(o) FROM (SELECT person_id, {value} AS o FROM demo.visits GROUP BY person_id) t"
    );
    s.simple_query(&instead)
        .await
        .unwrap_or_else(|e| panic!("{instead}: {e:?}"));
    // The internal function is not the analyst's.
    let err = s
        .simple_query("SELECT __dp_detected(COUNT(*)) FROM demo.people")
        .await
        .expect_err("reserved");
    assert!(err.as_db_error().is_some(), "{err:?}");
}

/// A policy over `app.events` (timestamps of events per person) in the database `app_ts`, for
/// the demo analyst with a budget every test query fits in.
const TIMESTAMPS_POLICY: &str = r#"
database: app_ts
analysts:
  analyst:
    scram_verifier: "SCRAM-SHA-256$4096:cGdkcC1kZW1vLXNhbHQtMQ==$lInLWt8gswE0sagso62TdobVlP/4N1mG//OTC1uOjxU=:Cs+4xOdBEHF3GmuzWiAu/lrFp8VOJ+dfMKys15hYAlg="
    budget: { epsilon: 1000, delta: 1.0e-5, epsilon_per_query_max: 100 }
tables:
  app.events:
    kind: private
    privacy_unit: person_id
    max_groups_per_unit: 1
    max_rows_per_unit: 3
    columns:
      person_id: { type: bigint }
      at:        { type: timestamptz, lower: '2020-01-01', upper: '2026-12-31 23:59:59' }
      local_at:  { type: timestamp, lower: '2020-01-01', upper: '2026-12-31 23:59:59' }
      noted:     { type: timestamp }
"#;

/// Issue 42's BI card "first and last date" over timestamps: `MIN` / `MAX` of a `timestamptz`
/// and a `timestamp` column with declared bounds are DP quantiles of their epoch seconds,
/// answered with PostgreSQL's column types (`timestamptz`, `timestamp`), printed in the session's
/// time zone as PostgreSQL prints them, and within a few weeks of PostgreSQL's answer: 9,000
/// events of 3,000 people over 2024, bounds 2020…2026 (the quantile's buckets are about 10 days;
/// MIN and MAX are its 1st and 99th percentiles, about 4 days inside the data's ends).
/// A timestamp without bounds is refused (42501) with the policy keys to declare.
#[tokio::test]
async fn first_and_last_timestamps_are_dp_quantiles_of_postgresqls_types() {
    let db = crate::harness::fresh_database("timestamps").await;
    let up = db.client().await;
    up.batch_execute(
        "CREATE SCHEMA app;
         CREATE TABLE app.events (person_id bigint NOT NULL, at timestamptz, local_at timestamp, noted timestamp);
         INSERT INTO app.events
           SELECT p, t, t AT TIME ZONE 'UTC', NULL
           FROM generate_series(1, 3000) p, generate_series(1, 3) k,
                LATERAL (SELECT TIMESTAMPTZ '2024-01-01 00:00:00+00'
                          + ((p * 37 + k * 101) % 366) * INTERVAL '1 day'
                          + (p % 86400) * INTERVAL '1 second' AS t) s;
         ANALYZE app.events;",
    )
    .await
    .expect("timestamps loaded");
    let policy = pgdp::policy::parse(TIMESTAMPS_POLICY).expect("policy");
    let proxy = Proxy::with_upstream(db.dsn(), policy, 145).await;
    let s = Session::open(&proxy.dsn_for("analyst", "analyst", "app_ts"))
        .await
        .expect("connect");
    s.simple_query("SET pgdp.epsilon = 20").await.expect("SET");
    let sql =
        "SELECT MIN(at) AS first, MAX(at) AS last, MIN(local_at), MAX(local_at) FROM app.events";
    assert_eq!(
        described(&s, sql).await,
        described(&up, sql).await,
        "PostgreSQL's names and types"
    );
    let expected = rows(&up, sql, 4).await;
    let answered = rows(&s, sql, 4).await;
    let seconds = |text: &Option<String>, with_zone: bool| {
        let text = text.as_deref().expect("a timestamp");
        pgdp::datetime::epoch_seconds(text, with_zone)
            .unwrap_or_else(|| panic!("{text} is not a timestamp as PostgreSQL prints it"))
    };
    for (i, with_zone) in [true, true, false, false].into_iter().enumerate() {
        let (dp, pg) = (
            seconds(&answered[0][i], with_zone),
            seconds(&expected[0][i], with_zone),
        );
        assert!(
            (dp - pg).abs() <= 30.0 * 86_400.0,
            "column {i}: {:?} against PostgreSQL's {:?}",
            answered[0][i],
            expected[0][i]
        );
        assert_eq!(dp.fract(), 0.0, "whole seconds: {:?}", answered[0][i]);
    }
    // The session's time zone prints a timestamptz as PostgreSQL prints it; a timestamp has none.
    s.simple_query("SET TimeZone = 'Asia/Kolkata'")
        .await
        .expect("SET");
    let zoned = rows(&s, sql, 4).await;
    assert!(
        zoned[0][0]
            .as_deref()
            .is_some_and(|t| t.ends_with("+05:30")),
        "{zoned:?}"
    );
    assert_eq!(zoned[0][2], answered[0][2], "replayed: the same release");
    // A monotone function of the answer, as the refusal's hint says: post-processing.
    let day = "SELECT date_trunc('day', MIN(local_at)) AS first_day FROM app.events";
    assert_eq!(described(&s, day).await, described(&up, day).await);
    let first_day = rows(&s, day, 1).await;
    assert!(
        first_day[0][0]
            .as_deref()
            .is_some_and(|t| t.ends_with(" 00:00:00")),
        "{first_day:?}"
    );
    for refused in [
        "SELECT MAX(noted) FROM app.events",
        "SELECT MIN(date_trunc('day', at)) FROM app.events",
    ] {
        let e = assert_code(
            s.simple_query(refused).await,
            &SqlState::INSUFFICIENT_PRIVILEGE,
            refused,
        );
        let hint = e
            .as_db_error()
            .and_then(|d| d.hint())
            .unwrap_or_default()
            .to_string();
        assert!(
            hint.contains("app.events.noted") || hint.contains("date_trunc('day', min(ts))"),
            "{refused}: {hint}"
        );
    }
    s.assert_alive("the refusals").await;
    drop(s);
    proxy.stop().await;
    db.drop_db().await;
}

/// Under `SET pgdp.accuracy = on`, a statement with post-processing (here `ROUND(AVG(…))` and an
/// ORDER BY position) keeps the `_error95` column of each aggregate that is released as is,
/// with PostgreSQL's types for the rest and the ORDER BY position still meaning the analyst's
/// column: the same bound as the statement without the expression states for the same count.
#[tokio::test]
async fn error_bounds_stay_beside_released_aggregates_under_post_processing() {
    let proxy = rich_proxy(146).await;
    let s: Session = proxy.connect().await;
    s.simple_query("SET pgdp.accuracy = on").await.expect("SET");
    let computed =
        "SELECT region, COUNT(*), ROUND(AVG(income)) AS mean FROM demo.people GROUP BY region ORDER BY 3 DESC";
    assert_eq!(
        described(&s, computed).await,
        [
            "region text",
            "count int8",
            "count_error95 float8",
            "mean numeric"
        ]
    );
    let rows_computed = rows(&s, computed, 4).await;
    assert_eq!(rows_computed.len(), 10, "{rows_computed:?}");
    let means: Vec<f64> = rows_computed
        .iter()
        .map(|r| r[3].as_deref().expect("mean").parse().expect("number"))
        .collect();
    assert!(
        means.windows(2).all(|w| w[0] >= w[1]),
        "ORDER BY 3 is the mean: {means:?}"
    );
    // The plain statement over the same measures (answered from them, free) states the same
    // bound for the same noisy count.
    let plain = "SELECT region, COUNT(*), AVG(income) AS mean FROM demo.people GROUP BY region";
    let rows_plain = rows(&s, plain, 3).await;
    for r in &rows_computed {
        let same = rows_plain
            .iter()
            .find(|p| p[0] == r[0])
            .unwrap_or_else(|| panic!("{r:?} in {rows_plain:?}"));
        assert_eq!(same[1], r[1], "the same noisy count");
        assert_eq!(same[2], r[2], "the same bound");
        let bound: f64 = r[2].as_deref().expect("bound").parse().expect("number");
        assert!(bound > 0.0 && bound < 100.0, "{r:?}");
    }
    // Metabase's outer query over the question's SQL: the item that is the inner count keeps
    // its bound (named after the outer item), from the same measures (free) and equal to it.
    let metabase = "SELECT \"source\".\"region\" AS \"region\", \"source\".\"count\" AS \"visits\" FROM (SELECT region, COUNT(*), AVG(income) AS mean FROM demo.people GROUP BY region) AS \"source\" ORDER BY 2 DESC LIMIT 1048575";
    assert_eq!(
        described(&s, metabase).await,
        ["region text", "visits int8", "visits_error95 float8"]
    );
    let spent = s.budget().await.epsilon_spent;
    let rows_outer = rows(&s, metabase, 3).await;
    assert_eq!(rows_outer.len(), 10, "{rows_outer:?}");
    for r in &rows_outer {
        let same = rows_plain
            .iter()
            .find(|p| p[0] == r[0])
            .unwrap_or_else(|| panic!("{r:?} in {rows_plain:?}"));
        assert_eq!(
            (&same[1], &same[2]),
            (&r[1], &r[2]),
            "the same count and bound"
        );
    }
    let counts: Vec<i64> = rows_outer
        .iter()
        .map(|r| r[1].as_deref().expect("count").parse().expect("integer"))
        .collect();
    assert!(
        counts.windows(2).all(|w| w[0] >= w[1]),
        "ORDER BY 2: {counts:?}"
    );
    assert_eq!(
        s.budget().await.epsilon_spent,
        spent,
        "answered from the same measures"
    );
    proxy.stop().await;
}

/// Issue 42's scalar subqueries: a subquery of one aggregate that reads only its own tables is
/// released first and charged on its own, and its noisy value is a literal of the statement.
/// Compared with PostgreSQL's answer at ε 100 per release (Laplace scale of a count of people
/// 1/100; the mean age's and a share's errors are far inside the tolerances stated below), with
/// PostgreSQL's column types, the charge of every release, and the refusals before any charge.
#[tokio::test]
async fn scalar_subqueries_are_releases_of_their_own_before_the_statement() {
    let proxy = rich_proxy(147).await;
    let s: Session = proxy.connect().await;
    let up = upstream_client().await;
    s.simple_query("SET pgdp.epsilon = 100").await.expect("SET");
    let number =
        |v: &Option<String>| -> f64 { v.as_deref().expect("a value").parse().expect("a number") };
    // (statement, columns, releases charged, tolerance per column against PostgreSQL)
    let cases: [(&str, usize, f64, &[f64]); 4] = [
        // Another WHERE: the total is a count of all people (scale 0.01), the numerator too.
        (
            "SELECT COUNT(*) * 1.0 / (SELECT COUNT(*) FROM demo.people) AS share FROM demo.people WHERE age > 60",
            1,
            200.0,
            &[0.001],
        ),
        // A threshold from the data: the mean age (sum over count, each at scale ~1), then the
        // count above it: people near the mean age are many, so allow one year's worth (~2%).
        (
            "SELECT COUNT(*) AS older FROM demo.people WHERE age > (SELECT AVG(age) FROM demo.people)",
            1,
            200.0,
            &[2500.0],
        ),
        // A row of totals: two releases (the count of people is the first case's, answered
        // again free), then constants, free.
        (
            "SELECT (SELECT COUNT(*) FROM demo.people) AS people, (SELECT COUNT(DISTINCT region) FROM demo.people) AS regions",
            2,
            100.0,
            &[1.0, 1.0],
        ),
        // HAVING over a released value (free again): the regions above a twentieth of all people.
        (
            "SELECT region, COUNT(*) AS n FROM demo.people GROUP BY region HAVING COUNT(*) > (SELECT COUNT(*) FROM demo.people) / 20 ORDER BY region",
            2,
            100.0,
            &[0.0, 1.0],
        ),
    ];
    for (sql, width, charge, tolerance) in cases {
        assert_eq!(described(&s, sql).await, described(&up, sql).await, "{sql}");
        let expected = rows(&up, sql, width).await;
        let before = s.budget().await;
        s.take_notices();
        let answered = rows(&s, sql, width).await;
        let spent = s.budget().await.epsilon_spent - before.epsilon_spent;
        assert!((spent - charge).abs() < 1e-6, "{sql}: charged {spent}");
        let notices = s.take_notices().join("\n");
        assert!(
            notices.starts_with(&format!(
                "pgdp: charged epsilon={charge}, delta=0; the sum for this statement's"
            )),
            "{sql}: {notices}"
        );
        assert_eq!(
            answered.len(),
            expected.len(),
            "{sql}: {answered:?} {expected:?}"
        );
        for (a, e) in answered.iter().zip(&expected) {
            for (i, t) in tolerance.iter().enumerate() {
                if *t == 0.0 {
                    assert_eq!(a[i], e[i], "{sql}");
                } else {
                    let (a, e) = (number(&a[i]), number(&e[i]));
                    assert!((a - e).abs() <= *t, "{sql}: column {i}: {a} against {e}");
                }
            }
        }
        // Asked again: every release is a replay, free.
        let before = s.budget().await;
        rows(&s, sql, width).await;
        assert_eq!(
            s.budget().await.epsilon_spent,
            before.epsilon_spent,
            "{sql}: replay"
        );
    }
    // Refused before anything is charged: a correlated subquery (0A000), raw rows with a
    // released threshold (42501), a subquery refused on its own (42501).
    for (sql, code) in [
        (
            "SELECT COUNT(*) FROM demo.people p WHERE income > (SELECT AVG(income) FROM demo.people) AND age > (SELECT AVG(age) FROM demo.people q WHERE q.region = p.region)",
            &SqlState::FEATURE_NOT_SUPPORTED,
        ),
        (
            "SELECT person_id FROM demo.people WHERE age > (SELECT AVG(age) FROM demo.people)",
            &SqlState::INSUFFICIENT_PRIVILEGE,
        ),
        (
            "SELECT COUNT(*) FROM demo.visits WHERE cost > (SELECT AVG(visit_id) FROM demo.visits)",
            &SqlState::INSUFFICIENT_PRIVILEGE,
        ),
    ] {
        let before = s.budget().await;
        assert_code(s.simple_query(sql).await, code, sql);
        assert_eq!(
            s.budget().await.epsilon_spent,
            before.epsilon_spent,
            "{sql}: charged"
        );
    }
    // A correlated subquery is refused as such, also inside a clock expression (whose clock
    // was left for after a release that never comes).
    for sql in [
        "SELECT COUNT(*) FROM demo.people p WHERE age > (SELECT AVG(age) FROM demo.people q WHERE q.region = p.region)",
        "SELECT COUNT(*) FROM demo.visits v WHERE visit_date >= current_date - (SELECT MAX(age) FROM demo.people p WHERE p.person_id = v.person_id) * interval '1 day'",
    ] {
        let refusal = assert_code(
            s.simple_query(sql).await,
            &SqlState::FEATURE_NOT_SUPPORTED,
            sql,
        );
        let message = refusal
            .as_db_error()
            .map(|d| d.message().to_string())
            .unwrap_or_default();
        assert!(
            message.starts_with("the scalar subquery (SELECT")
                && message.contains("outside its own FROM (a correlated subquery"),
            "{sql}: {message}"
        );
    }
    // A bound parameter inside the subquery, through the extended protocol (Describe before
    // Bind, then Execute): the same answer as PostgreSQL's, within the threshold's tolerance.
    let sql = "SELECT COUNT(*) AS older FROM demo.people WHERE age > (SELECT AVG(age) FROM demo.people WHERE region = $1)";
    let statement = s.prepare(sql).await.expect("prepare");
    let got: i64 = s
        .query_one(&statement, &[&"NO"])
        .await
        .expect("execute")
        .get(0);
    let expected: i64 = up.query_one(sql, &[&"NO"]).await.expect("upstream").get(0);
    assert!((got - expected).abs() <= 2500, "{got} against {expected}");
    // EXPLAIN shows each release and the statement with a stand-in, charging nothing.
    let before = s.budget().await;
    let plan: Vec<String> = rows(
        &s,
        "EXPLAIN SELECT COUNT(*) FROM demo.people WHERE income > (SELECT AVG(income) FROM demo.people)",
        1,
    )
    .await
    .into_iter()
    .filter_map(|r| r[0].clone())
    .collect();
    assert!(
        plan[0].starts_with("statement with 1 scalar subquery(ies)")
            && plan
                .iter()
                .any(|l| l == "subquery 1: SELECT AVG(income) FROM demo.people")
            && plan
                .iter()
                .any(|l| l.contains("WHERE income > CAST('1' AS NUMERIC)")),
        "{plan:#?}"
    );
    assert_eq!(
        s.budget().await.epsilon_spent,
        before.epsilon_spent,
        "EXPLAIN"
    );
    proxy.stop().await;
}
