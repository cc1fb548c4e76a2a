//! A policy synopsis (private multiplicative weights) through the wire: a dashboard's counts over
//! region × sex × education answered from it for one charge, each within its stated bound of
//! PostgreSQL's count; the state and the payment kept across a restart; `pgdp.synopsis = off`
//! and an exhausted synopsis falling back to the per-query path, charged.

use std::collections::HashMap;

use crate::support::{demo_policy_text, upstream_client, Proxy, Session};

/// The demo policy with a synopsis over demo.people's region, sex and education (180 cells).
fn policy(rounds: usize, accuracy: f64) -> pgdp::policy::Policy {
    let text = format!(
        "{}\nsynopses:\n  people_cube: {{ table: demo.people, columns: [region, sex, education], epsilon: 2, rounds: {rounds}, accuracy: {accuracy} }}\n",
        demo_policy_text()
    );
    pgdp::policy::parse(&text).unwrap_or_else(|e| panic!("policy: {e:?}"))
}

/// PostgreSQL's answer to `sql` on the demo data, as key text → count.
async fn exact(sql: &str) -> HashMap<String, i64> {
    let client = upstream_client().await;
    client
        .query(sql, &[])
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .iter()
        .map(|r| {
            let key: Option<String> = r.get(0);
            (key.unwrap_or_default(), r.get::<_, i64>(1))
        })
        .collect()
}

/// The 95 % bounds a synopsis NOTICE states (an estimate's, then an update's, when present).
fn stated_bounds(notices: &[String]) -> Vec<f64> {
    let notice = notices
        .iter()
        .find(|n| n.starts_with("pgdp: answered from synopsis people_cube"))
        .unwrap_or_else(|| panic!("no synopsis NOTICE in {notices:?}"));
    notice
        .split("within ")
        .skip(1)
        .filter_map(|part| part.split(' ').next()?.parse::<f64>().ok())
        .collect()
}

/// Runs `sql` (key, count) through pgdp and compares each count with PostgreSQL's answer to
/// `exact_sql`: returns how many counts were outside the largest stated bound, and how many in
/// all.
async fn compare(s: &Session, sql: &str, exact_sql: &str) -> (usize, usize) {
    let rows = s
        .query(sql, &[])
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    let notices = s.take_notices();
    let bound = stated_bounds(&notices).into_iter().fold(0.0_f64, f64::max);
    assert!(bound > 0.0, "{notices:?}");
    let truth = exact(exact_sql).await;
    // Every group PostgreSQL has is released (and groups of the public domain it lacks, as 0s).
    assert!(
        rows.len() >= truth.len(),
        "{sql}: the groups PostgreSQL has"
    );
    let mut outside = 0;
    for row in &rows {
        let key: Option<String> = row.get(0);
        let count: i64 = row.get(1);
        let expected = truth.get(&key.unwrap_or_default()).copied().unwrap_or(0);
        assert!(count >= 0, "{sql}: {count}");
        if (count - expected).abs() as f64 > bound {
            outside += 1;
        }
    }
    (outside, rows.len())
}

#[tokio::test]
async fn a_dashboard_is_answered_from_one_synopsis_paid_once() {
    let mut proxy = Proxy::with_policy(policy(60, 1000.0), 150).await;
    let s = proxy.connect().await;
    // The first answer pays for the synopsis: its whole ε, once.
    let (mut outside, mut total) = compare(
        &s,
        "SELECT region, COUNT(*) FROM demo.people GROUP BY region ORDER BY region",
        "SELECT region, COUNT(*) FROM demo.people GROUP BY region",
    )
    .await;
    // The accountant bounds the synopsis's 2T + 1 pure parts of 2/121 each (as zCDP at the
    // analyst's δ) below their sum, 2.
    let paid = s.budget().await.epsilon_spent;
    assert!(paid > 0.0 && paid <= 2.0, "spent {paid}");
    // EXPLAIN says where the count comes from, and charges nothing.
    let explained = s
        .simple_rows("EXPLAIN SELECT COUNT(*) FROM demo.people WHERE sex = 'F'")
        .await
        .expect("EXPLAIN");
    let first = explained[0][0].clone().unwrap_or_default();
    assert!(
        first.starts_with("answered from synopsis people_cube (private multiplicative weights over region x sex x education of demo.people, 180 cells"),
        "{first}"
    );
    assert!(explained.iter().any(|l| l[0]
        .as_deref()
        .is_some_and(|l| l.contains("already paid: this answer costs nothing"))));
    // A dashboard: each filter and each grouping a new statement, none charged.
    let dashboard = [
        ("sex", "WHERE region IN ('CE', 'EA')"),
        ("education", "WHERE sex = 'F'"),
        ("region", "WHERE education <> 'none' AND sex IN ('F', 'X')"),
        ("sex", ""),
        ("education", "WHERE region = 'NO' OR region = 'SO'"),
        ("region", "WHERE sex = 'M'"),
        ("education", ""),
        ("sex", "WHERE education LIKE '%ary'"),
        ("region", "WHERE education IN ('bachelor', 'master')"),
        ("education", "WHERE region NOT IN ('CE') AND sex <> 'X'"),
    ];
    for reload in 0..2 {
        for (key, filter) in dashboard {
            let (o, t) = compare(
                &s,
                &format!("SELECT {key}, COUNT(*) AS n FROM demo.people {filter} GROUP BY {key}"),
                &format!("SELECT {key}, COUNT(*) FROM demo.people {filter} GROUP BY {key}"),
            )
            .await;
            outside += o;
            total += t;
            if reload == 0 && key == "sex" && filter.is_empty() {
                // Nothing charged after the first answer.
                assert_eq!(s.budget().await.epsilon_spent, paid);
            }
        }
    }
    // 95 % bounds: at most a tenth of the counts outside (seeded: always or never).
    assert!(
        outside * 10 <= total,
        "{outside} of {total} outside their bounds"
    );
    assert_eq!(s.budget().await.epsilon_spent, paid);
    // A count without GROUP BY, and a post-processed one, from the synopsis too.
    let rows = s
        .query(
            "SELECT COUNT(*) * 2 AS twice FROM demo.people WHERE region = 'WE'",
            &[],
        )
        .await
        .expect("post-processing over a synopsis count");
    let twice: i64 = rows[0].get(0);
    let truth = exact("SELECT '', COUNT(*) FROM demo.people WHERE region = 'WE'").await[""];
    let bound = stated_bounds(&s.take_notices())
        .into_iter()
        .fold(0.0, f64::max);
    assert!(
        ((twice / 2 - truth).abs() as f64) <= 2.0 * bound,
        "{twice} against {truth}"
    );

    // The ledger holds the state: rounds counted, at most T, each update stored.
    let ledger = crate::harness::connect(proxy.ledger_dsn()).await;
    let row = ledger
        .query_one(
            "SELECT rounds_started, cardinality(measurements) FROM pgdp.synopsis WHERE name = 'people_cube'",
            &[],
        )
        .await
        .expect("synopsis state");
    let (rounds, updates): (i32, i32) = (row.get(0), row.get(1));
    assert!(
        updates <= rounds && rounds <= 60,
        "{updates} updates in {rounds} rounds"
    );

    // Restarted, on the same ledger: the analyst has paid, and the state is the stored one.
    drop(s);
    proxy.restart().await;
    let s = proxy.connect().await;
    let (o, _) = compare(
        &s,
        "SELECT sex, COUNT(*) FROM demo.people WHERE region = 'CE' GROUP BY sex",
        "SELECT sex, COUNT(*) FROM demo.people WHERE region = 'CE' GROUP BY sex",
    )
    .await;
    assert!(o <= 1, "{o} of 3 outside");
    assert_eq!(
        s.budget().await.epsilon_spent,
        paid,
        "paid once, across restarts"
    );

    // Off for the session: the per-query path answers and charges.
    s.batch_execute(
        "SET pgdp.synopsis = off; SET pgdp.epsilon = 1; SET pgdp.mechanism = 'laplace'",
    )
    .await
    .expect("SET");
    s.query("SELECT sex, COUNT(*) FROM demo.people GROUP BY sex", &[])
        .await
        .expect("per-query path");
    let notices = s.take_notices();
    assert!(
        notices.iter().all(|n| !n.contains("synopsis")) && notices[0].starts_with("pgdp: charged"),
        "{notices:?}"
    );
    let spent = s.budget().await.epsilon_spent;
    assert!(spent > paid, "spent {spent}");
    proxy.stop().await;
}

#[tokio::test]
async fn an_exhausted_synopsis_leaves_its_counts_to_the_per_query_path() {
    // One round and a threshold far below the test's noise: the first count that needs the
    // data ends the only round, and the synopsis answers nothing more.
    let proxy = Proxy::with_policy(policy(1, 1.0), 151).await;
    let s = proxy.connect().await;
    s.batch_execute("SET pgdp.mechanism = 'laplace'")
        .await
        .expect("SET");
    let mut answered = 0;
    for region in ["CE", "EA", "IS", "NE", "NO", "NW"] {
        let rows = s
            .query(
                &format!("SELECT COUNT(*) FROM demo.people WHERE region = '{region}'"),
                &[],
            )
            .await
            .expect("answered by one path or the other");
        assert_eq!(rows.len(), 1);
        answered += 1;
        s.take_notices();
    }
    assert_eq!(answered, 6);
    let spent = s.budget().await.epsilon_spent;
    // The synopsis's 2 (bounded below it by the accountant), then at least one count by the
    // per-query path at the session's ε (1).
    assert!(spent > 2.5, "spent {spent}");
    let ledger = crate::harness::connect(proxy.ledger_dsn()).await;
    let rounds: i32 = ledger
        .query_one(
            "SELECT rounds_started FROM pgdp.synopsis WHERE name = 'people_cube'",
            &[],
        )
        .await
        .expect("synopsis state")
        .get(0);
    assert_eq!(rounds, 1);
    proxy.stop().await;
}

/// The synopsis's histogram SQL on a table where one unit has more rows than Δ: that unit counts
/// Δ rows, the others all theirs, and removing the unit (its neighbouring table) moves the
/// histogram by at most Δ in L1; rows outside the public values are in no cell.
#[tokio::test]
async fn the_histogram_counts_each_unit_up_to_its_cap_and_a_unit_moves_it_by_at_most_that() {
    let db = crate::harness::fresh_database("synopsis_cap").await;
    let client = db.client().await;
    client
        .batch_execute(
            "CREATE SCHEMA s;
             CREATE TABLE s.t (uid integer NOT NULL, k text NOT NULL);
             INSERT INTO s.t SELECT 1, 'a' FROM generate_series(1, 5);
             INSERT INTO s.t SELECT 1, 'b' FROM generate_series(1, 3);
             INSERT INTO s.t SELECT u, CASE WHEN u % 2 = 0 THEN 'a' ELSE 'b' END
               FROM generate_series(2, 41) AS u;
             INSERT INTO s.t VALUES (42, 'c');",
        )
        .await
        .expect("table");
    let policy = pgdp::policy::parse(
        "database: d
analysts:
  alice: { password_env: PATH, budget: { epsilon: 1 } }
tables:
  s.t:
    kind: private
    privacy_unit: uid
    max_groups_per_unit: 1
    max_rows_per_unit: 3
    columns:
      uid: { type: integer }
      k: { type: text, public_values: [a, b], exhaustive: true }
synopses:
  ks: { table: s.t, columns: [k], epsilon: 1, rounds: 2, accuracy: 5 }
",
    )
    .expect("policy");
    let query = match pgdp::session::classify::classify("SELECT k, COUNT(*) FROM s.t GROUP BY k")
        .expect("parses")
        .pop()
    {
        Some(pgdp::session::classify::Statement::Query(q)) => q,
        _ => panic!("not a query"),
    };
    let ctx = pgdp::dp::analyze::Context {
        policy: &policy,
        search_path: vec!["s".to_string()],
    };
    let plan = pgdp::dp::analyze::analyze(&query, &ctx).expect("admitted");
    let route = pgdp::dp::rewrite::synopsis::route(&plan, &policy, &[])
        .expect("routes")
        .expect("the synopsis answers it");
    let histogram = |client: tokio_postgres::Client| {
        let sql = route.histogram.as_str().to_string();
        async move {
            let mut counts = [0i64; 2];
            for row in client.simple_query(&sql).await.expect("histogram") {
                if let tokio_postgres::SimpleQueryMessage::Row(r) = row {
                    let cell: usize = r.get(0).expect("cell").parse().expect("index");
                    counts[cell] = r.get(1).expect("count").parse().expect("count");
                }
            }
            counts
        }
    };
    let with = histogram(db.client().await).await;
    // Unit 1 counts 3 of its 8 rows; units 2..41 one each (20 a, 20 b); unit 42's 'c' is in no cell.
    assert_eq!(with[0] + with[1], 3 + 40, "{with:?}");
    client
        .batch_execute("DELETE FROM s.t WHERE uid = 1")
        .await
        .expect("neighbour");
    let without = histogram(db.client().await).await;
    assert_eq!(without, [20, 20]);
    let moved: i64 = with.iter().zip(&without).map(|(a, b)| (a - b).abs()).sum();
    assert!(moved <= 3, "a unit moved the histogram by {moved}");
}

/// The counts ORMs and BI tools send for a dashboard over the cube, as each tool writes them
/// (Sequelize 6's `count` and `findAll` with `COUNT(pk)`, Prisma's `groupBy`, Knex, SQLAlchemy's
/// `func.count(col)`, Django's `Count('pk')`, Superset's bar chart and big number, Metabase's
/// question, `COUNT(1)`): each is answered from the synopsis, charged nothing after the first,
/// within its stated bound of PostgreSQL's count. `COUNT(x)` of a never-NULL `x` (the primary
/// key, NOT NULL upstream; a column declared exhaustive; a constant) is the count of rows, and
/// so is the count of a filtered selection (Prisma's `count()`, SQLAlchemy's `Query.count()`).
#[tokio::test]
async fn the_counts_orms_and_bi_tools_send_are_answered_from_the_synopsis() {
    let proxy = Proxy::with_policy(policy(60, 1000.0), 152).await;
    let s = proxy.connect().await;
    let grouped = [
        (
            r#"SELECT "region", count(*) AS "count" FROM "demo"."people" AS "people" GROUP BY "region";"#,
            "SELECT region, COUNT(*) FROM demo.people GROUP BY region",
        ),
        (
            r#"SELECT "education", COUNT("person_id") AS "n" FROM "demo"."people" AS "people" GROUP BY "education";"#,
            "SELECT education, COUNT(*) FROM demo.people GROUP BY education",
        ),
        (
            r#"SELECT "demo"."people"."region", COUNT(*) AS "_count._all" FROM "demo"."people" WHERE 1=1 GROUP BY "demo"."people"."region" OFFSET 0"#,
            "SELECT region, COUNT(*) FROM demo.people GROUP BY region",
        ),
        (
            "SELECT demo.people.sex AS demo_people_sex, count(demo.people.region) AS count_1 FROM demo.people WHERE demo.people.education IN ('bachelor', 'master') GROUP BY demo.people.sex",
            "SELECT sex, COUNT(*) FROM demo.people WHERE education IN ('bachelor', 'master') GROUP BY sex",
        ),
        (
            r#"SELECT "demo"."people"."region", COUNT("demo"."people"."person_id") AS "n" FROM "demo"."people" WHERE "demo"."people"."sex" = 'F' GROUP BY 1"#,
            "SELECT region, COUNT(*) FROM demo.people WHERE sex = 'F' GROUP BY region",
        ),
        (
            "SELECT region AS region, count(*) AS count FROM demo.people WHERE sex IN ('F') GROUP BY region ORDER BY count DESC LIMIT 10000",
            "SELECT region, COUNT(*) FROM demo.people WHERE sex = 'F' GROUP BY region",
        ),
        (
            r#"SELECT "demo"."people"."sex" AS "sex", COUNT(*) AS "count" FROM "demo"."people" WHERE ("demo"."people"."region" = 'CE') GROUP BY "demo"."people"."sex" ORDER BY "demo"."people"."sex" ASC"#,
            "SELECT sex, COUNT(*) FROM demo.people WHERE region = 'CE' GROUP BY sex",
        ),
        (
            "SELECT education, count(1) FROM demo.people WHERE region <> 'CE' GROUP BY 1 ORDER BY 1",
            "SELECT education, COUNT(*) FROM demo.people WHERE region <> 'CE' GROUP BY education",
        ),
    ];
    let (mut outside, mut total) = (0, 0);
    let mut paid = None;
    for (sql, exact_sql) in grouped {
        let (o, t) = compare(&s, sql, exact_sql).await;
        (outside, total) = (outside + o, total + t);
        let spent = s.budget().await.epsilon_spent;
        assert_eq!(*paid.get_or_insert(spent), spent, "{sql}: charged again");
    }
    let ungrouped = [
        (
            r#"SELECT count(*) AS "count" FROM "demo"."people" AS "people" WHERE "people"."sex" = 'F';"#,
            "SELECT '', COUNT(*) FROM demo.people WHERE sex = 'F'",
        ),
        (
            r#"select count(*) as "n" from "demo"."people" where "sex" = 'M'"#,
            "SELECT '', COUNT(*) FROM demo.people WHERE sex = 'M'",
        ),
        (
            "SELECT count(*) AS count FROM demo.people WHERE region IN ('CE', 'EA') LIMIT 50000",
            "SELECT '', COUNT(*) FROM demo.people WHERE region IN ('CE', 'EA')",
        ),
        // Prisma's count(), SQLAlchemy's Query.count(): the count of a filtered selection.
        (
            r#"SELECT COUNT(*) AS "_count._all" FROM (SELECT "demo"."people"."person_id" FROM "demo"."people" WHERE "demo"."people"."sex" = 'F' OFFSET 0) AS "sub""#,
            "SELECT '', COUNT(*) FROM demo.people WHERE sex = 'F'",
        ),
        (
            "SELECT count(*) AS count_1 FROM (SELECT demo.people.person_id AS demo_people_person_id, demo.people.sex AS demo_people_sex FROM demo.people WHERE demo.people.education = 'master') AS anon_1",
            "SELECT '', COUNT(*) FROM demo.people WHERE education = 'master'",
        ),
    ];
    for (sql, exact_sql) in ungrouped {
        let rows = s
            .query(sql, &[])
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
        let count: i64 = rows[0].get(0);
        let bound = stated_bounds(&s.take_notices())
            .into_iter()
            .fold(0.0, f64::max);
        let truth = exact(exact_sql).await[""];
        total += 1;
        if (count - truth).abs() as f64 > bound {
            outside += 1;
        }
        assert_eq!(s.budget().await.epsilon_spent, paid.expect("paid"), "{sql}");
    }
    // 95 % bounds: at most a tenth of the counts outside (seeded: always or never).
    assert!(
        outside * 10 <= total,
        "{outside} of {total} outside their bounds"
    );
    proxy.stop().await;
}

#[tokio::test]
async fn the_dataset_pays_for_a_synopsis_once_and_each_analyst_pays_for_it_once() {
    // Two analysts (the demo's, and `other` with the same password) and a dataset budget.
    let text = crate::support::policy_text_with_budget(1000, 2).replacen(
        "analysts:\n  # Password \"analyst\"",
        "analysts:\n  other:\n    scram_verifier: \"SCRAM-SHA-256$4096:cGdkcC1kZW1vLXNhbHQtMQ==$lInLWt8gswE0sagso62TdobVlP/4N1mG//OTC1uOjxU=:Cs+4xOdBEHF3GmuzWiAu/lrFp8VOJ+dfMKys15hYAlg=\"\n    budget: { epsilon: 1000, delta: 1.0e-5, epsilon_per_query_max: 2 }\n  # Password \"analyst\"",
        1,
    );
    let text = format!(
        "{text}\nbudget: {{ epsilon: 100, delta: 1.0e-5 }}\nsynopses:\n  people_cube: {{ table: demo.people, columns: [region, sex, education], epsilon: 2, rounds: 60, accuracy: 1000 }}\n"
    );
    let policy = pgdp::policy::parse(&text).unwrap_or_else(|e| panic!("policy: {e:?}"));
    let proxy = Proxy::with_policy(policy, 151).await;
    let ledger = crate::harness::connect(proxy.ledger_dsn()).await;
    // The dataset's totals, and its count of charges.
    let dataset = || async {
        let row = ledger
            .query_one(
                "SELECT epsilon::float8, rho::float8, charges FROM pgdp.dataset_spent WHERE id",
                &[],
            )
            .await
            .expect("the dataset's row");
        (
            row.get::<_, f64>(0),
            row.get::<_, f64>(1),
            row.get::<_, i64>(2),
        )
    };
    let sql = "SELECT region, COUNT(*) FROM demo.people GROUP BY region";
    let paying = |notices: &[String]| {
        notices.iter().any(|n| {
            n.starts_with("pgdp: charged") && n.contains("that pays for synopsis people_cube once")
        })
    };

    let first = proxy.connect().await;
    first.query(sql, &[]).await.expect("the first analyst");
    assert!(paying(&first.take_notices()));
    let paid = first.budget().await.epsilon_spent;
    let after_first = dataset().await;
    assert!(after_first.0 > 0.0 && after_first.2 == 1, "{after_first:?}");

    // The second analyst pays its own budget for the synopsis, the dataset nothing more: the
    // transcript both read is one mechanism, paid for once.
    let second = proxy
        .try_connect("other", crate::support::PASSWORD, crate::support::DATABASE)
        .await
        .expect("the second analyst");
    second.query(sql, &[]).await.expect("the second analyst");
    assert!(paying(&second.take_notices()));
    assert_eq!(second.budget().await.epsilon_spent, paid);
    assert_eq!(dataset().await, after_first);
    // Both payments are in the audit log.
    let payments: i64 = ledger
        .query_one(
            "SELECT count(*) FROM pgdp.charge_log WHERE mechanism = 'pmw'",
            &[],
        )
        .await
        .expect("audit log")
        .get(0);
    assert_eq!(payments, 2);
    // Each later answer, to either analyst, is free for both budgets.
    second
        .query("SELECT sex, COUNT(*) FROM demo.people GROUP BY sex", &[])
        .await
        .expect("a later answer");
    assert_eq!(dataset().await, after_first);
    // A query of the per-query path charges the dataset as before (through a budget lease,
    // whose reservation the dataset's totals take at once; its charges are counted when the
    // slice closes).
    second
        .batch_execute(
            "SET pgdp.synopsis = off; SET pgdp.epsilon = 1; SET pgdp.mechanism = 'laplace'",
        )
        .await
        .expect("SET");
    second
        .query("SELECT sex, COUNT(*) FROM demo.people GROUP BY sex", &[])
        .await
        .expect("the per-query path");
    let after = dataset().await;
    assert!(after.0 > after_first.0, "{after:?}");
    proxy.stop().await;
}
