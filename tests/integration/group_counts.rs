//! Counts of groups (an ORM's `query(k).distinct().count()`, `values(k).annotate(…).count()`)
//! and `COUNT(DISTINCT (a, b))`: pgdp's upstream SQL, run on a real PostgreSQL over a table with
//! NULL keys, counts exactly the groups PostgreSQL counts for the analyst's SQL, the NULL group
//! included, wherever the per-unit caps remove nothing (each person here has at most three rows
//! and the caps allow ten). The noise is added afterwards; these tests read the value it is
//! added to.

use pgdp::dp::analyze::{self, Context};
use pgdp::dp::rewrite;
use pgdp::policy;
use pgdp::session::classify::{self, Statement};
use tokio_postgres::SimpleQueryMessage;

use crate::harness;

const POLICY: &str = r#"
database: groups
analysts:
  a:
    scram_verifier: "SCRAM-SHA-256$4096:cGdkcC1kZW1vLXNhbHQtMQ==$lInLWt8gswE0sagso62TdobVlP/4N1mG//OTC1uOjxU=:Cs+4xOdBEHF3GmuzWiAu/lrFp8VOJ+dfMKys15hYAlg="
    budget: { epsilon: 10, delta: 1.0e-5 }
tables:
  g.rows:
    kind: private
    privacy_unit: person_id
    max_groups_per_unit: 5
    max_rows_per_unit: 10
    columns:
      person_id: { type: bigint }
      a:         { type: text, groupable: true }
      b:         { type: integer, groupable: true }
      n:         { type: numeric, groupable: true }
"#;

/// The first cell of the first row of `sql`'s answer.
async fn first_cell(client: &tokio_postgres::Client, sql: &str) -> String {
    let messages = client
        .simple_query(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    messages
        .into_iter()
        .find_map(|m| match m {
            SimpleQueryMessage::Row(r) => Some(r.get(0).map(str::to_string)),
            _ => None,
        })
        .flatten()
        .unwrap_or_else(|| panic!("{sql}: no value"))
}

#[tokio::test]
async fn counts_of_groups_count_what_postgresql_counts_null_group_included() {
    let db = harness::fresh_database("group_counts").await;
    let client = db.client().await;
    // 40 people, up to three rows each; `a` NULL for some, `b` NULL for others, both for a few;
    // `n` equal as numbers but written with other scales (1.0 and 1.00 are one group).
    client
        .batch_execute(
            "CREATE SCHEMA g;
             CREATE TABLE g.rows (person_id bigint, a text, b integer, n numeric);
             INSERT INTO g.rows
             SELECT p, CASE WHEN (p + r) % 7 = 0 THEN NULL ELSE 'k' || ((p * r) % 5) END,
                    CASE WHEN (p + r) % 4 = 0 THEN NULL ELSE (p + r) % 3 END,
                    CASE WHEN r = 1 THEN 1.0 WHEN r = 2 THEN 1.00 ELSE NULL END
             FROM generate_series(1, 40) AS p, generate_series(1, 3) AS r
             WHERE (p + r) % 5 <> 0;",
        )
        .await
        .expect("create the table");
    let policy = policy::parse(POLICY).expect("policy");
    let ctx = Context {
        policy: &policy,
        search_path: vec!["g".into()],
    };
    let mut differs_from_plain_distinct = 0;
    for (sql, without_null_group) in [
        (
            "SELECT COUNT(*) FROM (SELECT DISTINCT a FROM g.rows) s",
            Some("SELECT COUNT(DISTINCT a) FROM g.rows"),
        ),
        (
            "SELECT count(*) AS count_1 FROM (SELECT g.rows.a AS g_rows_a, g.rows.b AS g_rows_b FROM g.rows GROUP BY g.rows.a, g.rows.b) AS anon_1",
            None,
        ),
        (
            r#"SELECT COUNT(*) FROM (SELECT "rows"."b" AS "col1", COUNT("rows"."person_id") AS "n" FROM "g"."rows" GROUP BY 1) subquery"#,
            Some("SELECT COUNT(DISTINCT b) FROM g.rows"),
        ),
        (
            "SELECT COUNT(*) FROM (SELECT DISTINCT a, b FROM g.rows WHERE person_id > 10) s",
            None,
        ),
        ("SELECT COUNT(DISTINCT (a, b)) FROM g.rows", None),
        ("SELECT COUNT(DISTINCT ROW(n)) FROM g.rows", None),
        (
            "SELECT COUNT(*) FROM (SELECT DISTINCT n FROM g.rows) s",
            Some("SELECT COUNT(DISTINCT n) FROM g.rows"),
        ),
    ] {
        let statements = classify::classify(sql).unwrap_or_else(|e| panic!("{sql}: {e}"));
        let [Statement::Query(query)] = statements.as_slice() else {
            panic!("{sql}: not one query");
        };
        let plan = analyze::analyze(query, &ctx).unwrap_or_else(|e| panic!("{sql}: {e}"));
        let upstream = rewrite::rewrite(&plan, &[], "group-counts-secret")
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
            .sql
            .to_string();
        let capped = first_cell(&client, &upstream).await;
        let truth = first_cell(&client, sql).await;
        assert_eq!(capped, truth, "{sql}: pgdp counts {capped}, PostgreSQL {truth}");
        if let Some(plain) = without_null_group {
            if first_cell(&client, plain).await != truth {
                differs_from_plain_distinct += 1;
            }
        }
    }
    // The data has NULL keys: a COUNT(DISTINCT k) would have been off by the NULL group.
    assert_eq!(differs_from_plain_distinct, 3);
}
