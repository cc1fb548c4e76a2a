//! The privacy budget through the wire: what SHOW pgdp.budget reports, what costs nothing
//! (EXPLAIN, replays), exhaustion, durability across restarts, and racing connections.

use std::sync::Arc;

use tokio_postgres::error::SqlState;

use crate::support::{
    assert_code, code, demo_policy, demo_policy_text, policy_with_budget, Number, Proxy, Session,
};

/// A DP query whose text differs with `i`, so that no two are replays of each other.
fn distinct_query(i: usize) -> String {
    format!("SELECT COUNT(*) FROM demo.people WHERE age > {i}")
}

#[tokio::test]
async fn spent_grows_by_exactly_each_query_epsilon() {
    let proxy = Proxy::start(31).await;
    let s = proxy.connect().await;
    let start = s.budget().await;
    assert_eq!(start.epsilon_total, 10.0);
    assert_eq!(start.epsilon_spent, 0.0);
    assert_eq!(start.epsilon_remaining, 10.0);
    assert_eq!(start.delta_spent, 0.0);

    // Laplace noise: each query is charged its ε as pure ε (`auto` could take Gaussian noise,
    // charged as ρ).
    s.batch_execute("SET pgdp.mechanism = 'laplace'")
        .await
        .expect("SET");
    let mut expected_spent = 0.0;
    for (i, epsilon) in [0.5, 2.0, 0.25, 1.0].into_iter().enumerate() {
        s.batch_execute(&format!("SET pgdp.epsilon = {epsilon}"))
            .await
            .expect("SET");
        s.query(&distinct_query(i), &[]).await.expect("DP query");
        expected_spent += epsilon;
        let b = s.budget().await;
        assert_eq!(b.epsilon_spent, expected_spent, "after ε = {epsilon}");
        assert_eq!(b.epsilon_remaining, 10.0 - expected_spent);
        assert_eq!(b.epsilon_total, 10.0);
        assert_eq!(b.delta_spent, 0.0, "public keys and Laplace need no δ");
    }

    // Partition selection (diagnosis is not public) spends the session's δ.
    s.batch_execute("SET pgdp.epsilon = 1; SET pgdp.delta = 1e-6")
        .await
        .expect("SET");
    s.query(
        "SELECT diagnosis, COUNT(*) FROM demo.visits GROUP BY diagnosis",
        &[],
    )
    .await
    .expect("partition selection");
    let b = s.budget().await;
    assert_eq!(b.epsilon_spent, expected_spent + 1.0);
    assert!(
        (b.delta_spent - 1e-6).abs() < 1e-15,
        "δ spent {}",
        b.delta_spent
    );
    // Half of the analyst's δ = 10⁻⁵ is reserved for the composition of Rényi orders; the
    // other half is what partition selection may spend.
    assert!((b.delta_remaining - (5e-6 - 1e-6)).abs() < 1e-15);

    // Another connection of the same analyst sees the same ledger.
    let other = proxy.connect().await;
    assert_eq!(other.budget().await, b);
    proxy.stop().await;
}

#[tokio::test]
async fn explain_shows_the_plan_and_costs_nothing() {
    let proxy = Proxy::start(32).await;
    let s = proxy.connect().await;
    let before = s.budget().await;
    for sql in [
        "EXPLAIN SELECT region, COUNT(*), AVG(income) FROM demo.people GROUP BY region",
        "EXPLAIN SELECT diagnosis, COUNT(*) FROM demo.visits GROUP BY diagnosis",
        "EXPLAIN SELECT pe.sex, AVG(v.cost) FROM demo.visits v JOIN demo.people pe USING (person_id) GROUP BY pe.sex",
    ] {
        let lines: Vec<String> = s
            .query(sql, &[])
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e:?}"))
            .iter()
            .map(|r| r.get(0))
            .collect();
        assert!(
            lines.iter().any(|l| l.contains("upstream SQL")),
            "{sql}: {lines:?}"
        );
        // Above the upstream SQL, the plan speaks the analyst's names, not pgdp's aliases.
        let plan: Vec<&String> = lines
            .iter()
            .take_while(|l| !l.starts_with("upstream SQL"))
            .collect();
        assert!(
            plan.iter().all(|l| !l.contains("__dp_")),
            "{sql}: {plan:?}"
        );
        assert!(s.take_notices().is_empty(), "{sql}: EXPLAIN charged");
    }
    assert_eq!(s.budget().await, before);
    // EXPLAIN of a refused query is refused the same way.
    assert_code(
        s.query("EXPLAIN SELECT * FROM demo.people", &[]).await,
        &SqlState::INSUFFICIENT_PRIVILEGE,
        "EXPLAIN SELECT *",
    );
    proxy.stop().await;
}

/// demo.people's unit is its primary key: pgdp learns that from the upstream catalog and skips
/// the per-unit aggregation and the ranking (docs/privacy.md, "Unique units"); demo.visits has
/// many rows per person and keeps them. EXPLAIN shows the SQL pgdp runs.
#[tokio::test]
async fn unique_unit_tables_skip_the_per_unit_stage() {
    let proxy = Proxy::start(37).await;
    let s = proxy.connect().await;
    let upstream_sql = |lines: Vec<tokio_postgres::Row>| -> String {
        lines
            .iter()
            .map(|r| r.get::<_, String>(0))
            .skip_while(|l| !l.contains("upstream SQL"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let people = upstream_sql(
        s.query(
            "EXPLAIN SELECT region, COUNT(*), AVG(income) FROM demo.people GROUP BY region",
            &[],
        )
        .await
        .unwrap(),
    );
    assert!(!people.contains("ROW_NUMBER"), "{people}");
    assert!(!people.contains("GROUP BY __dp_unit"), "{people}");
    let visits = upstream_sql(
        s.query(
            "EXPLAIN SELECT clinic, COUNT(*) FROM demo.visits GROUP BY clinic",
            &[],
        )
        .await
        .unwrap(),
    );
    assert!(visits.contains("ROW_NUMBER"), "{visits}");
    assert!(visits.contains("GROUP BY __dp_unit"), "{visits}");
    // The answer is still a DP release over all 100,000 people (noise scale 3 per count).
    let rows = s
        .query("SELECT COUNT(*) AS n FROM demo.people WHERE age >= 0", &[])
        .await
        .unwrap();
    let n: i64 = rows[0].get(0);
    assert!((99_000..=101_000).contains(&n), "{n}");
    proxy.stop().await;
}

#[tokio::test]
async fn identical_query_is_replayed_without_charge() {
    let proxy = Proxy::start(33).await;
    let s = proxy.connect().await;
    let sql = "SELECT region, COUNT(*), AVG(income) FROM demo.people GROUP BY region";
    let rows = |rows: Vec<tokio_postgres::Row>| -> Vec<(String, i64, Number)> {
        rows.iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect()
    };
    let first = rows(s.query(sql, &[]).await.expect("first"));
    let notices = s.take_notices();
    // ε = 1 of 10 spent: the rule admits exactly 9 more of the same.
    assert!(
        notices.iter().any(|n| n.starts_with("pgdp: charged")
            && n.ends_with("; room for about 9 more queries like this one")),
        "{notices:?}"
    );
    let after_first = s.budget().await;
    assert_eq!(after_first.epsilon_spent, 1.0, "the default ε");
    assert_eq!(s.queries_like_last().await, Some(9));

    // The session's generator has moved on, so a fresh release would differ: equality means
    // the answer was replayed.
    let second = rows(s.query(sql, &[]).await.expect("second"));
    assert_eq!(first, second);
    let notices = s.take_notices();
    assert!(
        notices.iter().any(|n| n.contains("replay cache")
            && n.ends_with(
                "charged nothing; remaining epsilon=9 of 10, delta=0.000005 of 0.00001"
            )),
        "{notices:?}"
    );
    assert!(!notices.iter().any(|n| n.starts_with("pgdp: charged")));
    assert_eq!(s.budget().await, after_first);
    assert_eq!(
        s.queries_like_last().await,
        Some(9),
        "a replay is not a charge"
    );

    // The simple protocol and another connection get the same answer, also free.
    let other = proxy.connect().await;
    assert_eq!(
        other.queries_like_last().await,
        None,
        "no charge in this session yet"
    );
    let third = other.simple_rows(sql).await.expect("simple");
    assert_eq!(third.len(), first.len());
    for (t, f) in third.iter().zip(&first) {
        assert_eq!(t[0].as_deref(), Some(f.0.as_str()));
        assert_eq!(t[1].as_deref(), Some(f.1.to_string().as_str()));
    }
    assert_eq!(other.budget().await, after_first);

    // A different ε is a different query.
    s.batch_execute("SET pgdp.epsilon = 0.5")
        .await
        .expect("SET");
    s.query(sql, &[]).await.expect("at ε = 0.5");
    assert_eq!(s.budget().await.epsilon_spent, 1.5);
    proxy.stop().await;
}

#[tokio::test]
async fn budget_runs_out_after_exactly_five_queries_at_epsilon_two() {
    let proxy = Proxy::start(34).await;
    let s = proxy.connect().await;
    s.batch_execute("SET pgdp.epsilon = 2").await.expect("SET");
    let mut answered = 0;
    let mut first_answer = None;
    let refusal = loop {
        match s.query(&distinct_query(answered), &[]).await {
            Ok(rows) => {
                first_answer.get_or_insert_with(|| rows[0].get::<_, i64>(0));
                answered += 1;
                assert!(answered <= 5, "more than ε 10 / 2 queries answered");
            }
            Err(e) => break e,
        }
    };
    assert_eq!(answered, 5);
    assert_eq!(code(&refusal), &SqlState::CONFIGURATION_LIMIT_EXCEEDED);
    assert!(refusal.as_db_error().and_then(|d| d.hint()).is_some());
    let b = s.budget().await;
    assert_eq!(b.epsilon_spent, 10.0, "the refused query was not charged");
    assert_eq!(b.epsilon_remaining, 0.0);

    // The session keeps working for everything that costs nothing.
    s.assert_alive("exhaustion").await;
    assert_eq!(s.show("pgdp.epsilon").await, "2");
    s.batch_execute("SET pgdp.epsilon = 0.5")
        .await
        .expect("SET");
    s.query("EXPLAIN SELECT COUNT(*) FROM demo.people", &[])
        .await
        .expect("EXPLAIN");
    // A replay of an answered query is still free, at the ε it was asked with.
    s.batch_execute("SET pgdp.epsilon = 2").await.expect("SET");
    let replayed: i64 = s
        .query_one(&distinct_query(0), &[])
        .await
        .expect("replay after exhaustion")
        .get(0);
    assert_eq!(Some(replayed), first_answer);
    // Any new query is refused, however small its ε, here and on a new connection.
    s.batch_execute("SET pgdp.epsilon = 0.5")
        .await
        .expect("SET");
    assert_code(
        s.query(&distinct_query(100), &[]).await,
        &SqlState::CONFIGURATION_LIMIT_EXCEEDED,
        "small query after exhaustion",
    );
    let fresh = proxy.connect().await;
    assert_code(
        fresh.query(&distinct_query(101), &[]).await,
        &SqlState::CONFIGURATION_LIMIT_EXCEEDED,
        "new connection",
    );
    assert_code(
        fresh.simple_query(&distinct_query(102)).await,
        &SqlState::CONFIGURATION_LIMIT_EXCEEDED,
        "new connection, simple protocol",
    );
    assert_eq!(fresh.budget().await.epsilon_spent, 10.0);
    proxy.stop().await;
}

#[tokio::test]
async fn spent_budget_survives_a_restart() {
    let mut proxy = Proxy::with_policy(demo_policy(), 35).await;
    let s = proxy.connect().await;
    s.batch_execute("SET pgdp.epsilon = 1.5")
        .await
        .expect("SET");
    let answer: i64 = s
        .query_one(&distinct_query(40), &[])
        .await
        .expect("query")
        .get(0);
    let before = s.budget().await;
    assert_eq!(before.epsilon_spent, 1.5);
    drop(s);

    let old_port = proxy.port();
    proxy.restart().await;
    assert_ne!(proxy.port(), old_port);
    let s = proxy.connect().await;
    assert_eq!(s.budget().await, before);
    // The replay cache is durable too: the same query is answered the same way, free.
    s.batch_execute("SET pgdp.epsilon = 1.5")
        .await
        .expect("SET");
    let again: i64 = s
        .query_one(&distinct_query(40), &[])
        .await
        .expect("replay")
        .get(0);
    assert_eq!(again, answer);
    assert_eq!(s.budget().await, before);
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_connections_never_overspend() {
    const CONNECTIONS: usize = 30;
    const AFFORDABLE: usize = 7;
    // ε 7 in total, 1 per query (the default ε of 1 is within the cap): exactly 7 queries fit.
    let proxy = Proxy::with_policy(policy_with_budget(AFFORDABLE as u32, 1), 36).await;
    let dsn = proxy.dsn();
    let start = Arc::new(tokio::sync::Barrier::new(CONNECTIONS));
    let mut tasks = Vec::new();
    for i in 0..CONNECTIONS {
        let dsn = dsn.clone();
        let start = start.clone();
        tasks.push(tokio::spawn(async move {
            let s = Session::open(&dsn).await.expect("connect");
            start.wait().await;
            s.query(&distinct_query(i), &[]).await.map(|_| ())
        }));
    }
    let mut answered = 0;
    let mut refused = 0;
    for task in tasks {
        match task.await.expect("task") {
            Ok(()) => answered += 1,
            Err(e) => {
                assert_eq!(code(&e), &SqlState::CONFIGURATION_LIMIT_EXCEEDED, "{e:?}");
                refused += 1;
            }
        }
    }
    assert_eq!(answered, AFFORDABLE);
    assert_eq!(refused, CONNECTIONS - AFFORDABLE);
    let b = proxy.connect().await.budget().await;
    assert_eq!(b.epsilon_spent, AFFORDABLE as f64);
    assert!(b.epsilon_spent <= b.epsilon_total);
    proxy.stop().await;
}

#[tokio::test]
async fn replay_cache_answers_only_the_same_query() {
    let proxy = Proxy::start(37).await;
    let s = proxy.connect().await;
    s.batch_execute("SET pgdp.epsilon = 2").await.expect("SET");
    let having = s
        .query(
            "SELECT region, COUNT(*) FROM demo.people GROUP BY region HAVING COUNT(*) > 13000",
            &[],
        )
        .await
        .expect("HAVING");
    assert_eq!(having.len(), 2, "CE and SE have more than 13,000 people");
    // Without HAVING every one of the ten public regions is released.
    let all = s
        .query(
            "SELECT region, COUNT(*) FROM demo.people GROUP BY region",
            &[],
        )
        .await
        .expect("all regions");
    assert_eq!(all.len(), 10, "got another query's rows");
    // The same aggregates in another order: the count column must be the count.
    let swapped = s
        .query(
            "SELECT COUNT(*), region FROM demo.people GROUP BY region",
            &[],
        )
        .await
        .expect("swapped select list");
    assert_eq!(swapped.len(), 10);
    for row in &swapped {
        let count: Option<i64> = row.get(0);
        assert!(count.is_some_and(|c| c > 1000), "count {count:?}");
        let region: String = row.get(1);
        assert_eq!(region.len(), 2, "region {region:?}");
    }
    proxy.stop().await;
}

#[tokio::test]
async fn rollback_refunds_nothing() {
    let proxy = Proxy::start(38).await;
    let s = proxy.connect().await;
    s.batch_execute("BEGIN").await.expect("BEGIN");
    s.query(&distinct_query(1), &[]).await.expect("DP query");
    s.batch_execute("ROLLBACK").await.expect("ROLLBACK");
    assert_eq!(s.budget().await.epsilon_spent, 1.0);
    // Two DP statements in one simple-query message are two charges and two results.
    let results = s
        .simple_rows(&format!("{}; {}", distinct_query(2), distinct_query(3)))
        .await
        .expect("two statements");
    assert_eq!(results.len(), 2);
    assert_eq!(
        s.take_notices()
            .iter()
            .filter(|n| n.starts_with("pgdp: charged"))
            .count(),
        3
    );
    assert_eq!(s.budget().await.epsilon_spent, 3.0);
    proxy.stop().await;
}

#[tokio::test]
async fn budget_is_a_virtual_table_in_select() {
    let proxy = Proxy::start(38).await;
    let s = proxy.connect().await;
    s.batch_execute("SET pgdp.epsilon = 1.5")
        .await
        .expect("SET");
    s.query(&distinct_query(0), &[]).await.expect("DP query");
    let row = s
        .query_one("SELECT * FROM pgdp.budget", &[])
        .await
        .expect("SELECT * FROM pgdp.budget");
    assert_eq!(row.columns().len(), 7);
    assert_eq!(row.get::<_, f64>("epsilon_spent"), 1.5);
    assert_eq!(row.get::<_, f64>("epsilon_remaining"), 8.5);
    // At least the 5 that adding up ε admits (8.5 / 1.5), more by composing in zCDP.
    let like_last: Option<i64> = row.get("queries_like_last");
    assert!(like_last >= Some(5), "{like_last:?}");
    let row = s
        .query_one(
            "SELECT epsilon_remaining, delta_total FROM pgdp.budget",
            &[],
        )
        .await
        .expect("named columns");
    assert_eq!(row.columns().len(), 2);
    assert_eq!(row.get::<_, f64>(0), 8.5);
    assert_eq!(row.get::<_, f64>(1), 1e-5);
    assert_code(
        s.query("SELECT nope FROM pgdp.budget", &[]).await,
        &SqlState::UNDEFINED_COLUMN,
        "unknown budget column",
    );
    assert_eq!(
        s.budget().await.epsilon_spent,
        1.5,
        "reading the budget is free"
    );
}

#[tokio::test]
async fn every_execution_of_a_prepared_statement_is_charged_or_replayed() {
    let proxy = Proxy::start(39).await;
    let mut s = proxy.connect().await;
    s.batch_execute("SET pgdp.epsilon = 0.5")
        .await
        .expect("SET");
    let by_age = s
        .prepare("SELECT COUNT(*) FROM demo.people WHERE age > $1")
        .await
        .expect("prepare");
    assert_eq!(
        s.budget().await.epsilon_spent,
        0.0,
        "Parse/Describe are free"
    );

    let first: i64 = s.query_one(&by_age, &[&30i32]).await.expect("30").get(0);
    assert_eq!(s.budget().await.epsilon_spent, 0.5);
    let other: i64 = s.query_one(&by_age, &[&40i32]).await.expect("40").get(0);
    assert_eq!(
        s.budget().await.epsilon_spent,
        1.0,
        "new parameters, new charge"
    );
    assert!(other < first, "fewer people are older than 40 than 30");
    // The same statement with the same parameters and settings is the same query: replayed.
    let again: i64 = s
        .query_one(&by_age, &[&30i32])
        .await
        .expect("30 again")
        .get(0);
    assert_eq!(again, first);
    assert_eq!(s.budget().await.epsilon_spent, 1.0, "a replay is free");
    // New privacy settings make it a new query.
    s.batch_execute("SET pgdp.epsilon = 0.25")
        .await
        .expect("SET");
    s.query_one(&by_age, &[&30i32]).await.expect("30 at ε 0.25");
    assert_eq!(s.budget().await.epsilon_spent, 1.25);

    // Inside a transaction that is rolled back, executions are charged all the same.
    s.batch_execute("BEGIN").await.expect("BEGIN");
    s.query_one(&by_age, &[&50i32]).await.expect("50");
    s.query_one(&by_age, &[&60i32]).await.expect("60");
    s.batch_execute("ROLLBACK").await.expect("ROLLBACK");
    assert_eq!(s.budget().await.epsilon_spent, 1.75);

    // A portal bound once and executed in parts is one execution: one charge.
    let regions = s
        .prepare("SELECT region, COUNT(*) FROM demo.people WHERE age > $1 GROUP BY region")
        .await
        .expect("prepare");
    let mut rows = 0;
    {
        let transaction = s.client.transaction().await.expect("BEGIN");
        let portal = transaction.bind(&regions, &[&70i32]).await.expect("bind");
        loop {
            let part = transaction
                .query_portal(&portal, 3)
                .await
                .expect("execute 3 rows");
            rows += part.len();
            if part.len() < 3 {
                break;
            }
        }
        transaction.commit().await.expect("COMMIT");
    }
    assert_eq!(rows, 10, "every public region, in parts");
    assert_eq!(s.budget().await.epsilon_spent, 2.0);
    proxy.stop().await;
}

/// Issue 17: a simple-protocol message is all or nothing for refusals, as PostgreSQL's implicit
/// transaction is. A refused statement in any position refuses the whole message with its own
/// SQLSTATE: no statement of it runs, nothing is charged, and the session's settings are as
/// before.
#[tokio::test]
async fn a_message_with_a_refused_statement_runs_and_charges_nothing() {
    let proxy = Proxy::start(62).await;
    let s = proxy.connect().await;
    let before = s.budget().await;
    let ok = "SELECT COUNT(*) FROM demo.people WHERE age > 1";
    let refused = [
        // Not an aggregate: raw rows are never released.
        "SELECT person_id FROM demo.people",
        // Over the analyst's per-query ε limit.
        "SET pgdp.epsilon = 1000",
        // An unknown table, an unknown column, a forbidden catalog relation.
        "SELECT COUNT(*) FROM demo.nope",
        "SELECT SUM(nope) FROM demo.people",
        "SELECT query FROM pg_stat_activity",
        // A policy table with a set-returning function (never the shadow catalog).
        "SELECT COUNT(*) FROM demo.people, generate_series(1, 3) g",
        // Partition selection with δ = 0 (refused at the mechanisms, before any charge).
        "SET pgdp.delta = 0; SELECT diagnosis, COUNT(*) FROM demo.visits GROUP BY diagnosis",
    ];
    for bad in refused {
        // The statement's own refusal, alone.
        let alone = s.simple_query(bad).await.expect_err(bad);
        let expected = code(&alone).clone();
        for message in [
            format!("{ok}; {bad}"),
            format!("{bad}; {ok}"),
            format!("{ok}; {bad}; {ok}"),
            format!("SET pgdp.epsilon = 0.5; {ok}; {bad}"),
            format!("BEGIN; {ok}; {bad}; COMMIT"),
            // The split comes from a `;` inside a comment of the first statement.
            format!("{ok} /* ; */ AND age < 90; {bad}"),
        ] {
            let error = s.simple_query(&message).await.expect_err(&message);
            assert_eq!(code(&error), &expected, "{message}: {error:?}");
            assert_eq!(s.budget().await, before, "{message}: something was charged");
        }
        let epsilon = s.simple_rows("SHOW pgdp.epsilon").await.expect("SHOW");
        assert_eq!(
            epsilon[0][0].as_deref(),
            Some("1"),
            "{bad}: a SET stayed in force"
        );
        let delta = s.simple_rows("SHOW pgdp.delta").await.expect("SHOW");
        assert_eq!(
            delta[0][0].as_deref(),
            Some("0.0000001"),
            "{bad}: a SET stayed in force"
        );
    }
    // A message without a refusal runs every statement, each charged as it runs.
    let messages = s
        .simple_query(&format!(
            "SET pgdp.epsilon = 0.5; {ok}; SELECT COUNT(*) FROM demo.people WHERE age > 3"
        ))
        .await
        .expect("a message without refusal");
    let rows = messages
        .iter()
        .filter(|m| matches!(m, tokio_postgres::SimpleQueryMessage::Row(_)))
        .count();
    assert_eq!(rows, 2);
    assert_eq!(s.budget().await.epsilon_spent, before.epsilon_spent + 1.0);
    proxy.stop().await;
}

/// Issues 16 and 45: Gaussian queries are recorded as zCDP ρ and composed by the accountant's
/// GDP member (and its zCDP member). At the noise of ε = 1, δ = 10⁻⁷ per query (σ ≈ 4.8 for a
/// count), the demo analyst's budget (ε = 10, δ = 10⁻⁵) admitted 10 such counts by basic
/// composition, 69 by the grid of Rényi orders alone and 82 with the zCDP member; the GDP
/// member admits more, and then refuses with 53400. Every answer's NOTICE states the ρ charged
/// and left.
#[tokio::test]
async fn gaussian_counts_are_composed_in_zcdp_and_last_far_longer() {
    let proxy = Proxy::start(64).await;
    let s = proxy.connect().await;
    s.batch_execute("SET pgdp.mechanism = 'gaussian'; SET pgdp.epsilon = 1; SET pgdp.delta = 1e-7")
        .await
        .expect("SET");
    let mut answered = 0;
    let refusal = loop {
        match s.query(&distinct_query(answered), &[]).await {
            Ok(rows) => {
                assert_eq!(rows.len(), 1);
                let notices = s.take_notices();
                assert!(
                    // ρ, and what it took in ε (the drop of the largest pure ε still admitted:
                    // about 1.03 for the first, less for the next): never "epsilon=0".
                    notices
                        .iter()
                        .any(|n| n.starts_with("pgdp: charged rho=0.0")
                            && n.contains(" (zCDP), delta=0: about epsilon=")
                            && !n.contains("about epsilon=0 ")
                            && n.contains(" of the budget; remaining epsilon=")),
                    "{notices:?}"
                );
                answered += 1;
                assert!(answered < 200, "the budget never ran out");
            }
            Err(e) => break e,
        }
    };
    // 82 at this noise (σ ≈ 4.8: δ = 10⁻⁷ per query calibrates less noise than the σ ≈ 5.39 of
    // the accountant's unit test); the grid of orders alone answered 69, basic composition 10.
    assert!(
        answered >= 80,
        "only {answered} Gaussian counts were answered"
    );
    assert_eq!(code(&refusal).code(), "53400", "{refusal:?}");
    let b = s.budget().await;
    assert!(b.epsilon_spent <= 10.0 && b.epsilon_spent > 9.0, "{b:?}");
    assert_eq!(
        b.delta_spent, 0.0,
        "Gaussian noise spends no δ of partition selection"
    );
    // A Laplace query of ε = 1 no longer fits either: the history is over its orders' budgets.
    s.batch_execute("SET pgdp.mechanism = 'laplace'")
        .await
        .expect("SET");
    assert_code(
        s.query(&distinct_query(1000), &[]).await,
        &SqlState::from_code("53400"),
        "a Laplace query after the Gaussian ones used the budget",
    );
    proxy.stop().await;
}

/// `epsilon=` of EXPLAIN's cost line and the largest `95% error bound ±…` of its measures.
fn explained_cost_and_bound(lines: &[Vec<Option<String>>]) -> (f64, f64) {
    let text: Vec<&str> = lines.iter().filter_map(|r| r[0].as_deref()).collect();
    let epsilon = text
        .iter()
        .find_map(|l| l.strip_prefix("cost: epsilon="))
        .and_then(|r| r.split(' ').next())
        .and_then(|e| e.parse().ok())
        .unwrap_or_else(|| panic!("no cost line: {text:?}"));
    let bound = text
        .iter()
        .filter_map(|l| l.split("95% error bound ±").nth(1))
        .map(|b| b.parse::<f64>().expect("a bound"))
        .fold(0.0, f64::max);
    (epsilon, bound)
}

/// `SET pgdp.max_error`: the query spends the smallest ε (to three digits) at which every
/// measure's stated 95 % bound meets the target; EXPLAIN shows that cost before anything is
/// spent; a target the per-query cap cannot meet, quantiles and bad values are refused with
/// nothing charged.
#[tokio::test]
async fn max_error_charges_the_smallest_epsilon_that_meets_it() {
    let proxy = Proxy::start(39).await;
    let s = proxy.connect().await;
    let sql = "SELECT region, COUNT(*), SUM(age) FROM demo.people GROUP BY region";
    s.batch_execute("SET pgdp.max_error = 1000")
        .await
        .expect("SET");
    assert_eq!(s.show("pgdp.max_error").await, "1000");
    let explained = s
        .simple_rows(&format!("EXPLAIN {sql}"))
        .await
        .expect("EXPLAIN");
    assert!(
        explained.iter().any(|r| r[0]
            .as_deref()
            .is_some_and(|l| l.starts_with("epsilon chosen for pgdp.max_error = 1000"))),
        "{explained:?}"
    );
    let (epsilon, bound) = explained_cost_and_bound(&explained);
    assert!(bound <= 1000.0, "bound {bound} at epsilon {epsilon}");
    // SUM(age) has sensitivity 100 and half of ε: a bound of about 3·100/(ε/2) = 600/ε.
    assert!(
        (0.55..0.7).contains(&epsilon),
        "{epsilon}: the default ε = 1 would be more than needed"
    );
    assert_eq!(s.budget().await.epsilon_spent, 0.0, "EXPLAIN is free");

    // The smallest: 1 % less ε misses the target.
    s.batch_execute(&format!(
        "SET pgdp.max_error = off; SET pgdp.epsilon = {}",
        epsilon * 0.99
    ))
    .await
    .expect("SET");
    let lower = s
        .simple_rows(&format!("EXPLAIN {sql}"))
        .await
        .expect("EXPLAIN");
    let (_, lower_bound) = explained_cost_and_bound(&lower);
    assert!(lower_bound > 1000.0, "{lower_bound} at 0.99·{epsilon}");

    // Charged what EXPLAIN said; the released error columns meet the target.
    s.batch_execute("SET pgdp.max_error = 1000; SET pgdp.accuracy = on")
        .await
        .expect("SET");
    let rows = s.simple_rows(sql).await.expect("DP query");
    assert_eq!(rows.len(), 10);
    for r in &rows {
        let count_error: f64 = r[2].as_deref().expect("count_error95").parse().unwrap();
        assert!(count_error <= 1000.0, "{r:?}");
    }
    assert_eq!(s.budget().await.epsilon_spent, epsilon);
    let notices = s.take_notices();
    assert!(
        notices
            .iter()
            .any(|n| n.starts_with(&format!("pgdp: charged epsilon={epsilon}, delta=0;"))),
        "{notices:?}"
    );

    // Beyond the per-query cap (ε = 2): 22023 naming the parameter, with the reachable bound.
    s.batch_execute("SET pgdp.max_error = 1")
        .await
        .expect("SET");
    let refusal = assert_code(
        s.simple_rows(sql).await,
        &SqlState::INVALID_PARAMETER_VALUE,
        "max_error below what the cap reaches",
    );
    let db = refusal.as_db_error().expect("a server error");
    assert!(db.message().contains("pgdp.max_error"), "{db:?}");
    assert!(
        db.hint()
            .is_some_and(|h| h.contains("SET pgdp.max_error to at least")),
        "{db:?}"
    );
    // Quantiles have no bound in the answer's units: refused, not guessed.
    s.batch_execute("SET pgdp.max_error = 50")
        .await
        .expect("SET");
    assert_code(
        s.simple_rows("SELECT MEDIAN(age) FROM demo.people").await,
        &SqlState::FEATURE_NOT_SUPPORTED,
        "max_error with a quantile",
    );
    for bad in ["0", "-1", "'ten'", "'1e400'"] {
        assert_code(
            s.batch_execute(&format!("SET pgdp.max_error = {bad}"))
                .await,
            &SqlState::INVALID_PARAMETER_VALUE,
            bad,
        );
    }
    assert_eq!(
        s.show("pgdp.max_error").await,
        "50",
        "refused SETs change nothing"
    );
    assert_eq!(s.budget().await.epsilon_spent, epsilon, "refusals are free");
    proxy.stop().await;
}

/// Text rows keyed by their first cell (the group key).
fn by_key(rows: &[Vec<Option<String>>]) -> std::collections::BTreeMap<String, Vec<Option<String>>> {
    rows.iter()
        .map(|r| (r[0].clone().expect("a key"), r[1..].to_vec()))
        .collect()
}

/// The NOTICE of an answer reused from released noisy measures.
fn reused_notice(notices: &[String]) -> Option<&String> {
    notices.iter().find(|n| {
        n.starts_with("pgdp: answered from the noisy measures released for an earlier query")
    })
}

#[tokio::test]
async fn post_processing_variants_reuse_the_released_noisy_measures() {
    let text = demo_policy_text();
    let text = text.replacen(
        "analysts:\n  # Password \"analyst\"",
        "analysts:\n  other:\n    scram_verifier: \"SCRAM-SHA-256$4096:cGdkcC1kZW1vLXNhbHQtMQ==$lInLWt8gswE0sagso62TdobVlP/4N1mG//OTC1uOjxU=:Cs+4xOdBEHF3GmuzWiAu/lrFp8VOJ+dfMKys15hYAlg=\"\n    budget: { epsilon: 10, delta: 1.0e-5, epsilon_per_query_max: 2 }\n  # Password \"analyst\"",
        1,
    );
    let policy = pgdp::policy::parse(&text).expect("a second analyst");
    let proxy = Proxy::with_policy(policy, 42).await;
    let s = proxy.connect().await;
    let a_sql = "SELECT region, COUNT(*), AVG(income) FROM demo.people GROUP BY region";
    let a = s.simple_rows(a_sql).await.expect("A");
    assert_eq!(a.len(), 10);
    assert!(s
        .take_notices()
        .iter()
        .any(|n| n.starts_with("pgdp: charged epsilon=1,")));
    let after_a = s.budget().await;
    assert_eq!(after_a.epsilon_spent, 1.0);
    let a_rows = by_key(&a);
    let count_of = |row: &Vec<Option<String>>| -> i64 {
        row[0]
            .as_deref()
            .expect("a count")
            .parse()
            .expect("an integer")
    };

    // Each variant is answered from A's noisy measures: free, with A's values.
    let uncharged = |label: &'static str| {
        let s = &s;
        async move {
            let notices = s.take_notices();
            let notice = reused_notice(&notices).unwrap_or_else(|| panic!("{label}: {notices:?}"));
            assert!(
                notice.ends_with(
                    "charged nothing; remaining epsilon=9 of 10, delta=0.000005 of 0.00001"
                ),
                "{label}: {notice}"
            );
            assert!(
                !notices.iter().any(|n| n.starts_with("pgdp: charged")),
                "{label}"
            );
            assert_eq!(s.budget().await, after_a, "{label} is free");
        }
    };

    // Aliases, ORDER BY and LIMIT: the three largest noisy counts, in order.
    let top = s
        .simple_rows(
            "SELECT region AS r, COUNT(*) AS n, AVG(income) AS mean FROM demo.people GROUP BY region ORDER BY n DESC LIMIT 3",
        )
        .await
        .expect("top three");
    uncharged("ORDER BY, LIMIT, aliases").await;
    let mut expected: Vec<_> = a.clone();
    expected.sort_by_key(|r| std::cmp::Reverse(count_of(&r[1..].to_vec())));
    expected.truncate(3);
    assert_eq!(top, expected, "a reordering and subset of A's noisy rows");

    // Case and spacing.
    let spelled = s
        .simple_rows("select   REGION, count(*),\n avg(Income) from DEMO.people group by Region")
        .await
        .expect("case and spacing");
    uncharged("case and spacing").await;
    assert_eq!(by_key(&spelled), a_rows);

    // HAVING: the groups whose noisy count passes, with A's values.
    let having = s
        .simple_rows(
            "SELECT region, COUNT(*), AVG(income) FROM demo.people GROUP BY region HAVING COUNT(*) > 10000",
        )
        .await
        .expect("HAVING");
    uncharged("HAVING").await;
    let passing: std::collections::BTreeMap<_, _> = a_rows
        .iter()
        .filter(|(_, row)| count_of(row) > 10000)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    assert!(!passing.is_empty() && passing.len() < 10);
    assert_eq!(by_key(&having), passing);

    // Expressions over the aggregates, evaluated over A's noisy values.
    let expressions = s
        .simple_rows(
            "SELECT region, COUNT(*) * 2 AS twice, ROUND(AVG(income)) AS mean FROM demo.people GROUP BY region",
        )
        .await
        .expect("expressions");
    uncharged("expressions").await;
    assert_eq!(expressions.len(), 10);
    for row in &expressions {
        let key = row[0].clone().expect("key");
        let original = &a_rows[&key];
        let twice: i64 = row[1].as_deref().expect("twice").parse().expect("integer");
        assert_eq!(twice, 2 * count_of(original), "{key}");
        let mean: f64 = row[2].as_deref().expect("mean").parse().expect("number");
        let avg: f64 = original[1]
            .as_deref()
            .expect("avg")
            .parse()
            .expect("number");
        assert_eq!(mean, avg.round(), "{key}");
    }
    // The accuracy columns are computed from the same noisy values and the mechanisms.
    s.batch_execute("SET pgdp.accuracy = on")
        .await
        .expect("SET");
    let accurate = s.simple_rows(a_sql).await.expect("accuracy");
    uncharged("accuracy columns").await;
    for row in &accurate {
        let original = &a_rows[row[0].as_deref().expect("key")];
        assert_eq!(row[1], original[0], "the same noisy count");
        assert_eq!(row[3], original[1], "the same noisy average");
    }
    s.batch_execute("SET pgdp.accuracy = off")
        .await
        .expect("SET");

    // What changes the noisy measures is charged: another ε, filter or bounds.
    let charged = |label: &'static str, before: f64, by: f64| {
        let s = &s;
        async move {
            let notices = s.take_notices();
            assert!(reused_notice(&notices).is_none(), "{label}: {notices:?}");
            assert!(
                notices.iter().any(|n| n.starts_with("pgdp: charged")),
                "{label}: {notices:?}"
            );
            assert_eq!(s.budget().await.epsilon_spent, before + by, "{label}");
        }
    };
    s.batch_execute("SET pgdp.epsilon = 0.5")
        .await
        .expect("SET");
    s.simple_rows("SELECT region AS r, COUNT(*), AVG(income) FROM demo.people GROUP BY region")
        .await
        .expect("ε 0.5");
    charged("another epsilon", 1.0, 0.5).await;
    s.batch_execute("RESET pgdp.epsilon").await.expect("RESET");
    s.simple_rows(
        "SELECT region, COUNT(*), AVG(income) FROM demo.people WHERE age > 30 GROUP BY region",
    )
    .await
    .expect("filter");
    charged("another filter", 1.5, 1.0).await;
    s.simple_rows(
        "SELECT region, COUNT(*), AVG(LEAST(income, 100000)) FROM demo.people GROUP BY region",
    )
    .await
    .expect("bounds");
    charged("other bounds", 2.5, 1.0).await;
    // The ε 0.5 release is reused at ε 0.5 only.
    s.batch_execute("SET pgdp.epsilon = 0.5")
        .await
        .expect("SET");
    s.simple_rows("SELECT region, COUNT(*) AS n, AVG(income) FROM demo.people GROUP BY region ORDER BY region DESC")
        .await
        .expect("ε 0.5 again");
    let notices = s.take_notices();
    assert!(reused_notice(&notices).is_some(), "{notices:?}");
    assert_eq!(s.budget().await.epsilon_spent, 3.5);

    // Another analyst's release is not this one's: charged.
    let other = Session::open(&proxy.dsn().replace("user=analyst ", "user=other "))
        .await
        .expect("the other analyst");
    other
        .simple_rows("SELECT region AS r, COUNT(*), AVG(income) FROM demo.people GROUP BY region")
        .await
        .expect("other analyst");
    let notices = other.take_notices();
    assert!(reused_notice(&notices).is_none(), "{notices:?}");
    assert_eq!(other.budget().await.epsilon_spent, 1.0);
    assert_eq!(s.budget().await.epsilon_spent, 3.5);
    proxy.stop().await;
}

/// The NOTICE of an answer derived from a finer release's noisy measures (issue 16 part 3).
fn derived_notice(notices: &[String]) -> Option<&String> {
    notices.iter().find(|n| {
        n.starts_with("pgdp: derived from the noisy measures released for an earlier query")
    })
}

/// The integer in a text cell.
fn int_of(cell: &Option<String>) -> i64 {
    cell.as_deref()
        .expect("a value")
        .parse()
        .expect("an integer")
}

/// Issue 16 part 3: after a release grouped by public keys (sex, region), a query grouped by a
/// subset of them (region, sex, or none) with the same tables, filters, bounds and noise is
/// answered with the sums of the finer noisy cells, charged nothing, with a NOTICE naming the
/// finer grouping; its stated error is that of a sum of cells. A coarser query with another
/// filter, another ε or a measure that does not add up is charged, and so is another analyst's.
#[tokio::test]
async fn a_coarser_grouping_is_derived_from_a_finer_release_for_free() {
    let text = demo_policy_text().replacen(
        "analysts:\n  # Password \"analyst\"",
        "analysts:\n  other:\n    scram_verifier: \"SCRAM-SHA-256$4096:cGdkcC1kZW1vLXNhbHQtMQ==$lInLWt8gswE0sagso62TdobVlP/4N1mG//OTC1uOjxU=:Cs+4xOdBEHF3GmuzWiAu/lrFp8VOJ+dfMKys15hYAlg=\"\n    budget: { epsilon: 10, delta: 1.0e-5, epsilon_per_query_max: 2 }\n  # Password \"analyst\"",
        1,
    );
    let policy = pgdp::policy::parse(&text).expect("a second analyst");
    let proxy = Proxy::with_policy(policy, 43).await;
    let s = proxy.connect().await;
    let fine = s
        .simple_rows("SELECT sex, region, COUNT(*) FROM demo.people GROUP BY sex, region")
        .await
        .expect("finer release");
    assert_eq!(fine.len(), 30, "every listed (sex, region)");
    assert!(s
        .take_notices()
        .iter()
        .any(|n| n.starts_with("pgdp: charged epsilon=1,")));
    let after = s.budget().await;
    assert_eq!(after.epsilon_spent, 1.0);
    let free = |label: &'static str| {
        let s = &s;
        async move {
            let notices = s.take_notices();
            let notice = derived_notice(&notices).unwrap_or_else(|| panic!("{label}: {notices:?}"));
            assert!(
                notice.contains("grouped by (people.sex, people.region)"),
                "{label}: {notice}"
            );
            assert!(
                notice.ends_with(
                    "charged nothing; remaining epsilon=9 of 10, delta=0.000005 of 0.00001"
                ),
                "{label}: {notice}"
            );
            assert!(
                !notices.iter().any(|n| n.starts_with("pgdp: charged")),
                "{label}"
            );
            assert_eq!(s.budget().await, after, "{label} is free");
        }
    };
    let sum_where = |keep: &dyn Fn(&Vec<Option<String>>) -> bool| -> i64 {
        fine.iter().filter(|r| keep(r)).map(|r| int_of(&r[2])).sum()
    };

    // By region (another order, an alias, ORDER BY): each region the sum of its three cells.
    let by_region = s
        .simple_rows(
            "SELECT region, COUNT(*) AS n FROM demo.people GROUP BY region ORDER BY n DESC",
        )
        .await
        .expect("by region");
    free("by region").await;
    assert_eq!(by_region.len(), 10);
    for row in &by_region {
        assert_eq!(int_of(&row[1]), sum_where(&|r| r[1] == row[0]), "{row:?}");
    }
    // By sex, and the grand total.
    let by_sex = s
        .simple_rows("SELECT sex, COUNT(*) FROM demo.people GROUP BY sex")
        .await
        .expect("by sex");
    free("by sex").await;
    assert_eq!(by_sex.len(), 3);
    for row in &by_sex {
        assert_eq!(int_of(&row[1]), sum_where(&|r| r[0] == row[0]), "{row:?}");
    }
    let total = s
        .simple_rows("SELECT COUNT(*) FROM demo.people")
        .await
        .expect("total");
    free("total").await;
    assert_eq!(int_of(&total[0][0]), sum_where(&|_| true));

    // The stated error of a sum of ten cells is larger than that of one cell.
    s.batch_execute("SET pgdp.accuracy = on")
        .await
        .expect("SET");
    let derived = s
        .simple_rows("SELECT sex, COUNT(*) FROM demo.people GROUP BY sex")
        .await
        .expect("by sex, with accuracy");
    free("accuracy").await;
    let cells = s
        .simple_rows("SELECT sex, region, COUNT(*) FROM demo.people GROUP BY sex, region")
        .await
        .expect("the cells, with accuracy");
    let error_of = |row: &Vec<Option<String>>| -> f64 {
        row.last()
            .cloned()
            .flatten()
            .expect("an error bound")
            .parse()
            .expect("a number")
    };
    assert!(error_of(&derived[0]) > error_of(&cells[0]));
    s.batch_execute("SET pgdp.accuracy = off")
        .await
        .expect("SET");
    s.take_notices();

    // What is not derived is charged: another filter, another ε, a distinct count.
    let charged = |label: &'static str, before: f64, by: f64| {
        let s = &s;
        async move {
            let notices = s.take_notices();
            assert!(derived_notice(&notices).is_none(), "{label}: {notices:?}");
            assert!(
                notices.iter().any(|n| n.starts_with("pgdp: charged")),
                "{label}: {notices:?}"
            );
            assert_eq!(s.budget().await.epsilon_spent, before + by, "{label}");
        }
    };
    s.simple_rows("SELECT region, COUNT(*) FROM demo.people WHERE age > 30 GROUP BY region")
        .await
        .expect("another filter");
    charged("another filter", 1.0, 1.0).await;
    s.batch_execute("SET pgdp.epsilon = 0.5")
        .await
        .expect("SET");
    s.simple_rows("SELECT region, COUNT(*) FROM demo.people GROUP BY region")
        .await
        .expect("another epsilon");
    charged("another epsilon", 2.0, 0.5).await;
    s.batch_execute("RESET pgdp.epsilon").await.expect("RESET");
    s.simple_rows(
        "SELECT sex, region, COUNT(DISTINCT person_id) FROM demo.people GROUP BY sex, region",
    )
    .await
    .expect("finer distinct count");
    charged("finer distinct count", 2.5, 1.0).await;
    s.simple_rows("SELECT region, COUNT(DISTINCT person_id) FROM demo.people GROUP BY region")
        .await
        .expect("coarser distinct count");
    charged("a distinct count does not add up", 3.5, 1.0).await;

    // Another analyst's release is not this one's: charged.
    let other = Session::open(&proxy.dsn().replace("user=analyst ", "user=other "))
        .await
        .expect("the other analyst");
    other
        .simple_rows("SELECT region, COUNT(*) FROM demo.people GROUP BY region")
        .await
        .expect("other analyst");
    let notices = other.take_notices();
    assert!(derived_notice(&notices).is_none(), "{notices:?}");
    assert_eq!(other.budget().await.epsilon_spent, 1.0);
    proxy.stop().await;
}

/// Issue 15: a ROLLUP over public keys is one release of its finest set, charged once, and every
/// subtotal and the total equal the sums of their parts.
#[tokio::test]
async fn rollup_subtotals_are_the_sums_of_their_parts() {
    let proxy = Proxy::with_policy(demo_policy(), 44).await;
    let s = proxy.connect().await;
    let rows = s
        .simple_rows(
            "SELECT sex, region, COUNT(*), GROUPING(sex, region) AS g FROM demo.people GROUP BY ROLLUP (sex, region)",
        )
        .await
        .expect("rollup");
    assert_eq!(rows.len(), 34);
    assert!(s
        .take_notices()
        .iter()
        .any(|n| n.starts_with("pgdp: charged epsilon=1,")));
    assert_eq!(s.budget().await.epsilon_spent, 1.0);
    let level = |r: &Vec<Option<String>>| int_of(&r[3]);
    let cells: Vec<&Vec<Option<String>>> = rows.iter().filter(|r| level(r) == 0).collect();
    assert_eq!(cells.len(), 30);
    for sub in rows.iter().filter(|r| level(r) == 1) {
        let parts: i64 = cells
            .iter()
            .filter(|c| c[0] == sub[0])
            .map(|c| int_of(&c[2]))
            .sum();
        assert_eq!(int_of(&sub[2]), parts, "{sub:?}");
    }
    let total = rows.iter().find(|r| level(r) == 3).expect("the total");
    let all: i64 = cells.iter().map(|c| int_of(&c[2])).sum();
    assert_eq!(int_of(&total[2]), all);
    proxy.stop().await;
}

/// Renewing budgets through the wire (issue 16 part 4): with `period: day` and ε = 2 per day,
/// two queries at ε = 1 use up the day and a third is refused (53400); the NOTICE and
/// `SHOW pgdp.budget` name the window. When the day is over (simulated by moving the day's
/// ledger rows one day back, which is what they are once midnight has passed) the next query is
/// admitted in a fresh window, while the previous window stays at its limit.
#[tokio::test]
async fn a_daily_budget_admits_again_in_a_new_day_and_keeps_the_old_one_at_its_limit() {
    let text = demo_policy_text()
        .replace(
            "      epsilon: 10\n",
            "      epsilon: 2\n      period: day\n",
        )
        .replace(
            "      epsilon_per_query_max: 2\n",
            "      epsilon_per_query_max: 1\n",
        );
    let policy = pgdp::policy::parse(&text).expect("a daily budget");
    let proxy = Proxy::with_policy(policy, 61).await;
    let s = proxy.connect().await;
    s.batch_execute("SET pgdp.epsilon = 1").await.expect("SET");
    for i in 0..2 {
        s.query(&distinct_query(i), &[])
            .await
            .expect("within the day");
    }
    let notices = s.take_notices();
    assert!(
        notices
            .iter()
            .any(|n| n.contains("remaining this day (until ")
                && n.contains(" 00:00 UTC): epsilon=0 of 2")),
        "{notices:?}"
    );
    let refused = s.query(&distinct_query(2), &[]).await;
    assert_code(
        refused,
        &SqlState::CONFIGURATION_LIMIT_EXCEEDED,
        "the day is used up",
    );
    let renews_at: Option<String> = s
        .query_one("SELECT renews_at FROM pgdp.budget", &[])
        .await
        .expect("renews_at")
        .get(0);
    let renews_at = renews_at.expect("a renewing budget says when");
    assert!(renews_at.ends_with(" 00:00 UTC"), "{renews_at}");
    assert_eq!(s.budget().await.epsilon_remaining, 0.0);

    // Midnight passes: the day's rows become yesterday's.
    let ledger = crate::harness::connect(proxy.ledger_dsn()).await;
    let moved = ledger
        .execute(
            "UPDATE pgdp.analyst_window_spent
             SET window_start = window_start - interval '1 day',
                 window_end = window_end - interval '1 day'",
            &[],
        )
        .await
        .expect("move the window");
    assert_eq!(moved, 1);
    assert_eq!(s.budget().await.epsilon_remaining, 2.0, "a fresh window");
    s.query(&distinct_query(3), &[])
        .await
        .expect("admitted in the new day");
    let b = s.budget().await;
    assert_eq!((b.epsilon_spent, b.epsilon_remaining), (1.0, 1.0));
    // ε per window (charges made under a budget slice are counted when it closes).
    let windows: Vec<String> = ledger
        .query(
            "SELECT epsilon::text FROM pgdp.analyst_window_spent ORDER BY window_start",
            &[],
        )
        .await
        .expect("the windows")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        windows,
        ["2", "1"],
        "the previous window stays at its limit"
    );
    let row = s
        .query_one("SHOW pgdp.budget", &[])
        .await
        .expect("SHOW pgdp.budget");
    assert_eq!(row.columns().len(), 8, "a renewing budget shows renews_at");
}

/// Issue 42: a statement of several releases (a set operation's branches, scalar subqueries
/// and the statement over their values) is checked against the budget as one before its first
/// charge. One whose releases do not fit together is refused (53400) with nothing charged,
/// where each release's own charge would have spent the first ones and lost them with the
/// statement; a release already in the ledger (a replay) is not counted.
#[tokio::test]
async fn a_statement_of_several_releases_is_refused_whole_when_they_do_not_fit() {
    let proxy = Proxy::start(148).await;
    let s = proxy.connect().await;
    s.batch_execute("SET pgdp.epsilon = 2").await.expect("SET");
    for i in 0..4 {
        s.query(&distinct_query(i), &[]).await.expect("answered");
    }
    assert_eq!(s.budget().await.epsilon_spent, 8.0);
    // Each statement below is two new releases of ε 2, with 2 left.
    let union = format!("{} UNION ALL {}", distinct_query(4), distinct_query(5));
    let scalar = "SELECT COUNT(*) FROM demo.people WHERE age > (SELECT AVG(age) FROM demo.people)";
    for (sql, names) in [
        (union.as_str(), "of this set operation"),
        (scalar, "of this statement's scalar subqueries"),
    ] {
        let refusal = s.simple_query(sql).await.expect_err(sql);
        assert_eq!(
            code(&refusal),
            &SqlState::CONFIGURATION_LIMIT_EXCEEDED,
            "{sql}"
        );
        let message = refusal
            .as_db_error()
            .map(|d| d.message().to_string())
            .unwrap_or_default();
        assert!(
            message.contains(&format!("the sum of the 2 releases {names}"))
                && message.contains("requested ε=4")
                && message.contains("nothing was charged"),
            "{sql}: {message}"
        );
        assert_eq!(s.budget().await.epsilon_spent, 8.0, "{sql}: charged");
        s.assert_alive(sql).await;
    }
    // A branch answered before is a replay, free: the one new release fits in the 2 left.
    let union = format!("{} UNION ALL {}", distinct_query(0), distinct_query(4));
    let answered = s.simple_query(&union).await.expect("answered");
    let rows = answered
        .iter()
        .filter(|m| matches!(m, tokio_postgres::SimpleQueryMessage::Row(_)))
        .count();
    assert_eq!(rows, 2);
    assert_eq!(s.budget().await.epsilon_spent, 10.0);
    proxy.stop().await;
}

/// A budget's `accounting: gaussian` reaches the ledger through the wire: the analyst's first
/// Gaussian count fixes the Gaussian rule for the history (the `renyi` array's last element is
/// 2), and exactly as many counts are answered as the accountant admits under that rule, more
/// than under the default mixed rule.
#[tokio::test]
async fn a_budget_s_gaussian_accounting_is_fixed_at_the_first_charge_and_lasts_longer() {
    use pgdp::budget::{repeats, Cost, Fixed, Limit, Spent};
    use pgdp::policy::Accounting;
    let text = demo_policy_text().replace(
        "      epsilon: 10\n",
        "      epsilon: 10\n      accounting: gaussian\n",
    );
    let policy = pgdp::policy::parse(&text).expect("gaussian accounting");
    assert_eq!(
        policy.analysts["analyst"].budget.accounting,
        Accounting::Gaussian
    );
    let proxy = Proxy::with_policy(policy, 62).await;
    let s = proxy.connect().await;
    s.batch_execute("SET pgdp.mechanism = 'gaussian'; SET pgdp.epsilon = 1; SET pgdp.delta = 1e-7")
        .await
        .expect("SET");
    let mut answered = 0;
    let refusal = loop {
        match s.query(&distinct_query(answered), &[]).await {
            Ok(_) => answered += 1,
            Err(e) => break e,
        }
        assert!(answered < 400, "the budget never ran out");
    };
    assert_eq!(code(&refusal).code(), "53400", "{refusal:?}");
    let ledger = crate::harness::connect(proxy.ledger_dsn()).await;
    let rule: i32 = ledger
        .query_one(
            "SELECT renyi[cardinality(renyi)]::int FROM pgdp.analyst_spent WHERE analyst = 'analyst'",
            &[],
        )
        .await
        .expect("the analyst's totals")
        .get(0);
    assert_eq!(rule, 2, "the Gaussian rule is stored with the totals");
    // Every count costs the same ρ: the audit log has it exactly (written after the answers).
    let mut rho = None;
    for _ in 0..200 {
        let row = ledger
            .query_opt(
                "SELECT rho::text FROM pgdp.charge_log WHERE analyst = 'analyst' LIMIT 1",
                &[],
            )
            .await
            .expect("the audit log");
        if let Some(row) = row {
            rho = Some(Fixed::from_numeric_text(&row.get::<_, String>(0)).expect("an amount"));
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let count = Cost::zcdp(rho.expect("an audit row"));
    let demo = Limit::new(
        Fixed::from_decimal_str("10").unwrap(),
        Fixed::from_decimal_str("0.00001").unwrap(),
    );
    let gaussian = repeats(&demo.under(Accounting::Gaussian), &Spent::ZERO, &count);
    let mixed = repeats(&demo, &Spent::ZERO, &count);
    eprintln!("{answered} Gaussian counts answered; the mixed rule admits {mixed}");
    assert_eq!(answered as u64, gaussian, "mixed would answer {mixed}");
    assert!(gaussian > mixed, "{gaussian} vs {mixed}");
    proxy.stop().await;
}
