//! Tables whose privacy unit is found through a foreign-key path (`unit_path`, here
//! `demo.prescriptions` → `demo.visits.visit_id` → `person_id`), and FLOOR / CEIL, through the
//! wire on the demo data.
//!
//! Tolerances follow from the noise scale b of each measure (stated at each use): discrete
//! Laplace noise exceeds 20·b with probability below e^-20 ≈ 2·10^-9 per value, so a correct
//! pgdp fails with negligible probability; with the fixed seeds a run always passes or always
//! fails.

use tokio_postgres::error::SqlState;

use crate::support::{
    assert_code, demo_policy_text, policy_with_budget, upstream_client, Number, Proxy,
};

async fn rich_proxy(seed: u8) -> Proxy {
    Proxy::with_policy(policy_with_budget(1000, 100), seed).await
}

#[tokio::test]
async fn keypath_counts_are_close_to_the_capped_truth() {
    let proxy = rich_proxy(91).await;
    let s = proxy.connect().await;
    s.batch_execute("SET pgdp.epsilon = 10").await.expect("SET");
    let up = upstream_client().await;
    // Each person keeps at most 20 prescriptions (max_rows_per_unit); a prescription's person is
    // its visit's.
    let capped: i64 = up
        .query_one(
            "SELECT coalesce(sum(least(n, 20)), 0)::bigint FROM (SELECT count(*) AS n \
             FROM demo.prescriptions p JOIN demo.visits v USING (visit_id) GROUP BY v.person_id) t",
            &[],
        )
        .await
        .expect("capped truth")
        .get(0);
    assert!(capped > 10_000, "the demo has prescriptions: {capped}");
    // COUNT(*): sensitivity 20, ε 10: b = 2, tolerance 40.
    let n: i64 = s
        .query_one("SELECT COUNT(*) FROM demo.prescriptions", &[])
        .await
        .expect("DP count")
        .get(0);
    assert!((n - capped).abs() <= 40, "{n} vs {capped}");

    // The path join written by the analyst reads the same rows, each with its own visit.
    let joined: i64 = s
        .query_one(
            "SELECT COUNT(*) FROM demo.prescriptions p JOIN demo.visits v USING (visit_id)",
            &[],
        )
        .await
        .expect("DP count over the path join")
        .get(0);
    assert!((joined - capped).abs() <= 40, "{joined} vs {capped}");

    // Distinct persons: sensitivity 1, ε 10: b = 0.1.
    let patients: i64 = s
        .query_one(
            "SELECT COUNT(DISTINCT person_id) FROM demo.prescriptions",
            &[],
        )
        .await
        .expect("DP distinct count")
        .get(0);
    let truth: i64 = up
        .query_one(
            "SELECT count(DISTINCT v.person_id) FROM demo.prescriptions p JOIN demo.visits v USING (visit_id)",
            &[],
        )
        .await
        .expect("truth")
        .get(0);
    assert!((patients - truth).abs() <= 2, "{patients} vs {truth}");
}

#[tokio::test]
async fn keypath_joins_follow_the_rules() {
    let proxy = rich_proxy(92).await;
    let s = proxy.connect().await;
    // Joined with people on the derived unit: the three public values of sex.
    let rows = s
        .query(
            "SELECT pe.sex, COUNT(*) FROM demo.prescriptions p JOIN demo.people pe USING (person_id) GROUP BY pe.sex",
            &[],
        )
        .await
        .expect("join on the derived unit");
    let keys: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
    assert_eq!(keys, ["F", "M", "X"]);
    // Through visits to people, both directions of the path join.
    for sql in [
        "SELECT pe.region, AVG(p.quantity) FROM demo.prescriptions p JOIN demo.visits v ON v.visit_id = p.visit_id JOIN demo.people pe ON pe.person_id = v.person_id GROUP BY pe.region",
        "SELECT pe.region, AVG(p.quantity) FROM demo.visits v JOIN demo.prescriptions p ON p.visit_id = v.visit_id JOIN demo.people pe ON pe.person_id = v.person_id GROUP BY pe.region",
    ] {
        let rows = s.query(sql, &[]).await.expect(sql);
        assert_eq!(rows.len(), 10, "{sql}");
        for r in &rows {
            let mean: Option<Number> = r.get(1);
            if let Some(Number(m)) = mean {
                assert!((0.0..=100.0).contains(&m), "{sql}: {m} outside the bounds");
            }
        }
    }
    let before = s.budget().await.epsilon_spent;
    // Any other join of two private tables is refused, before anything is charged.
    assert_code(
        s.query(
            "SELECT COUNT(*) FROM demo.prescriptions p JOIN demo.visits v ON p.prescription_id = v.visit_id",
            &[],
        )
        .await,
        &SqlState::INSUFFICIENT_PRIVILEGE,
        "join on another column",
    );
    assert_code(
        s.query(
            "SELECT person_id, COUNT(*) FROM demo.prescriptions GROUP BY person_id",
            &[],
        )
        .await,
        &SqlState::INSUFFICIENT_PRIVILEGE,
        "grouping by the derived unit",
    );
    assert_code(
        s.query("SELECT * FROM demo.prescriptions", &[]).await,
        &SqlState::INSUFFICIENT_PRIVILEGE,
        "raw rows",
    );
    assert_eq!(s.budget().await.epsilon_spent, before, "refusals are free");
}

#[tokio::test]
async fn keypath_with_a_key_that_is_not_unique_is_refused_without_a_charge() {
    // demo.visits.person_id is not unique: a prescription could belong to several people.
    let text = demo_policy_text();
    let line = "- { column: visit_id, references: demo.visits, key: visit_id }";
    assert!(text.contains(line), "the demo policy's unit path changed");
    let policy = pgdp::policy::parse(&text.replace(
        line,
        "- { column: visit_id, references: demo.visits, key: person_id }",
    ))
    .expect("the variant validates: uniqueness is checked on the upstream");
    let proxy = Proxy::with_policy(policy, 93).await;
    let s = proxy.connect().await;
    let before = s.budget().await.epsilon_spent;
    for _ in 0..2 {
        assert_code(
            s.query("SELECT COUNT(*) FROM demo.prescriptions", &[])
                .await,
            &SqlState::INSUFFICIENT_PRIVILEGE,
            "non-unique key of a unit path",
        );
    }
    assert_eq!(s.budget().await.epsilon_spent, before, "nothing charged");
    // Tables without a unit path are unaffected.
    s.query_one("SELECT COUNT(*) FROM demo.visits", &[])
        .await
        .expect("other tables still answer");
}

#[tokio::test]
async fn floor_and_ceil_work_in_keys_and_aggregates() {
    let proxy = rich_proxy(94).await;
    let s = proxy.connect().await;
    s.batch_execute("SET pgdp.epsilon = 10").await.expect("SET");
    let rows = s
        .simple_rows("SELECT floor(age/10)*10 AS band, COUNT(*) FROM demo.people GROUP BY 1")
        .await
        .expect("floor key");
    assert!(rows.len() >= 8, "most bands released: {rows:?}");
    for r in &rows {
        let band: f64 = r[0].as_deref().expect("band").parse().expect("a number");
        assert!(
            (0.0..=100.0).contains(&band) && band % 10.0 == 0.0,
            "band {band}"
        );
    }
    let up = upstream_client().await;
    // Each person's sum of at most 10 values at their own mean (max_rows_per_unit of visits),
    // within [0, 10 · 2000].
    let capped: f64 = up
        .query_one(
            "SELECT sum(least(s * least(1, 10.0 / n), 20000))::float8 FROM (SELECT sum(ceil(least(greatest(cost, 0), 2000))) AS s, count(*) AS n FROM demo.visits GROUP BY person_id) t",
            &[],
        )
        .await
        .expect("capped truth")
        .get(0);
    // ε 10 on sensitivity 20 000: b = 2 000, tolerance 40 000 (plus the real-valued grid).
    let Number(sum) = s
        .query_one("SELECT SUM(ceil(cost)) FROM demo.visits", &[])
        .await
        .expect("ceil in an aggregate")
        .get(0);
    assert!((sum - capped).abs() <= 40_001.0, "{sum} vs {capped}");
    assert_code(
        s.query("SELECT SUM(FLOOR(cost, 1)) FROM demo.visits", &[])
            .await,
        &SqlState::FEATURE_NOT_SUPPORTED,
        "FLOOR with a scale",
    );
}

/// A unique key counts only where it holds for every row a query of the table reads: not on a
/// parent of plain inheritance (its children's rows are outside the parent's index, and a
/// query of the parent reads them), yes on a partitioned table (its unique index holds across
/// partitions) and on a plain table.
#[tokio::test]
async fn a_unique_key_of_an_inheritance_parent_is_not_a_unique_key() {
    let up = upstream_client().await;
    up.batch_execute(
        "DROP SCHEMA IF EXISTS pgdp_unique_facts CASCADE; CREATE SCHEMA pgdp_unique_facts; \
         CREATE TABLE pgdp_unique_facts.plain (id int PRIMARY KEY); \
         CREATE TABLE pgdp_unique_facts.parent (id int PRIMARY KEY); \
         CREATE TABLE pgdp_unique_facts.child () INHERITS (pgdp_unique_facts.parent); \
         CREATE TABLE pgdp_unique_facts.parted (id int PRIMARY KEY) PARTITION BY HASH (id); \
         CREATE TABLE pgdp_unique_facts.parted_0 PARTITION OF pgdp_unique_facts.parted \
         FOR VALUES WITH (MODULUS 2, REMAINDER 0); \
         CREATE TABLE pgdp_unique_facts.parted_1 PARTITION OF pgdp_unique_facts.parted \
         FOR VALUES WITH (MODULUS 2, REMAINDER 1)",
    )
    .await
    .expect("schema");
    for (table, unique) in [("plain", true), ("parent", false), ("parted", true)] {
        let name = format!("\"pgdp_unique_facts\".\"{table}\"");
        let holds: bool = up
            .query_one(
                pgdp::upstream::catalog_facts::UNIQUE_KEY_SQL,
                &[&name, &"id"],
            )
            .await
            .expect("catalog lookup")
            .get(0);
        assert_eq!(holds, unique, "{table}");
    }
    up.batch_execute("DROP SCHEMA pgdp_unique_facts CASCADE")
        .await
        .expect("drop");
}
