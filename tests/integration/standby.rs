//! Read replicas (`--replica`): DP queries go to a healthy streaming replica, skip it while it
//! lags past the limit or is down, and fail over to the primary while queries run; catalog
//! queries read the shadow catalog on a replica only once it has replayed the shadow's build.
//!
//! The servers are real: a throwaway primary started from the installed binaries and a hot
//! standby cloned from it with `pg_basebackup -R`. Which server answered is told by the data:
//! with the standby's replay paused, rows inserted on the primary make the two servers' counts
//! differ by 40,000, far beyond the noise; for catalog queries, by a table that only one of the
//! two shadow databases holds, and by the primary being stopped.

use std::time::{Duration, Instant};

use pgdp::server::{self, Config, Options, Running};
use pgdp::tools::cluster::Cluster;
use pgdp::upstream::standby::Health;
use tokio_postgres::error::SqlState;
use tokio_postgres::NoTls;

use crate::harness;
use crate::support::{code, demo_policy_text, Session, ANALYST, PASSWORD};

/// Rows before the standby's replay is paused, and rows inserted on the primary afterwards.
const BEFORE: f64 = 2_000.0;
const AFTER: f64 = 42_000.0;

/// How far a noisy count (ε = 1, one row per person: Laplace of scale 1) may be from the truth
/// here: P(|Laplace(1)| > 30) = e^-30.
const TOLERANCE: f64 = 30.0;

const DATABASE: &str = "standby_demo";

fn policy() -> pgdp::policy::Policy {
    policy_with("")
}

/// The policy of these tests, with `tables` (YAML lines under `tables:`) added.
fn policy_with(tables: &str) -> pgdp::policy::Policy {
    let demo = demo_policy_text();
    let verifier = demo
        .lines()
        .find(|l| l.trim_start().starts_with("scram_verifier:"))
        .expect("the demo analyst's verifier");
    let text = format!(
        "database: {DATABASE}\n\
         defaults: {{ epsilon: 1.0, delta: 1.0e-7, mechanism: laplace }}\n\
         replay_lifetime_s: 0\n\
         analysts:\n  {ANALYST}:\n{verifier}\n    budget: {{ epsilon: 200, delta: 1.0e-5 }}\n\
         tables:\n  s.people:\n    kind: private\n    privacy_unit: person_id\n\
         \x20   max_groups_per_unit: 1\n    max_rows_per_unit: 1\n    columns:\n\
         \x20     person_id: {{ type: bigint }}\n      age: {{ type: integer, lower: 0, upper: 100 }}\n{tables}"
    );
    pgdp::policy::parse(&text).unwrap_or_else(|e| panic!("standby policy: {e}"))
}

async fn connect(dsn: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(dsn, NoTls)
        .await
        .unwrap_or_else(|e| panic!("connect to {dsn}: {e}"));
    tokio::spawn(connection);
    client
}

/// pgdp over `primary` with `standby` as its replica.
async fn pgdp(primary: &Cluster, standby: &Cluster, ledger: &str, lag_max_ms: u64) -> Running {
    server::start_with(
        Config {
            policy: policy(),
            upstream: primary.dsn(DATABASE),
            ledger: Some(ledger.to_string()),
            listen: "127.0.0.1:0".into(),
            noise_seed: Some([11; 32]),
        },
        Options {
            replicas: vec![standby.dsn(DATABASE)],
            replica_lag_max_ms: Some(lag_max_ms),
            ..Default::default()
        },
    )
    .await
    .expect("pgdp starts")
}

/// Waits until the replica's health satisfies `wanted`.
async fn wait_for_health(running: &Running, what: &str, wanted: impl Fn(Health) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let health = running.shared().upstream.standby_health();
        if health.iter().all(|(_, h)| wanted(*h)) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "replica never {what}: {health:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn open(running: &Running) -> Session {
    let dsn = format!(
        "host=127.0.0.1 port={} user={ANALYST} password={PASSWORD} dbname={DATABASE} sslmode=disable",
        running.addr.port()
    );
    Session::open(&dsn).await.expect("connect to pgdp")
}

async fn noisy_count(session: &Session) -> Result<f64, tokio_postgres::Error> {
    let row = session
        .query_one("SELECT COUNT(*)::float8 FROM s.people", &[])
        .await?;
    Ok(row.get(0))
}

fn near(value: f64, truth: f64) -> bool {
    (value - truth).abs() <= TOLERANCE
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_go_to_a_healthy_replica_skip_a_lagging_one_and_fail_over_to_the_primary() {
    let primary = Cluster::start().await.expect("a throwaway primary");
    connect(&primary.dsn("postgres"))
        .await
        .batch_execute(&format!("CREATE DATABASE {DATABASE}"))
        .await
        .expect("create the database");
    let data = connect(&primary.dsn(DATABASE)).await;
    data.batch_execute(&format!(
        "CREATE SCHEMA s; CREATE TABLE s.people (person_id bigint PRIMARY KEY, age integer);
         INSERT INTO s.people SELECT g, g % 90 FROM generate_series(1, {BEFORE}) g;"
    ))
    .await
    .expect("load the primary");
    let standby = Cluster::standby_of(&primary).await.expect("a hot standby");
    let ledger = harness::fresh_database("standby_ledger").await;

    // `tolerant` accepts any lag within the window; `strict` skips the replica past 1 s.
    let tolerant = pgdp(&primary, &standby, ledger.dsn(), 120_000).await;
    let strict = pgdp(&primary, &standby, ledger.dsn(), 1_000).await;
    for running in [&tolerant, &strict] {
        wait_for_health(running, "serving", |h| matches!(h, Health::Serving { .. })).await;
    }

    // Freeze the replica, then change the primary: the two now answer differently.
    let replica = connect(&standby.dsn(DATABASE)).await;
    replica
        .batch_execute("SELECT pg_catalog.pg_wal_replay_pause()")
        .await
        .expect("pause replay");
    data.batch_execute(&format!(
        "INSERT INTO s.people SELECT g, g % 90 FROM generate_series({BEFORE} + 1, {AFTER}) g"
    ))
    .await
    .expect("insert on the primary");

    // The strict pgdp sees the lag grow past its limit and reads from the primary.
    wait_for_health(&strict, "lagging", |h| matches!(h, Health::Lagging { .. })).await;
    let on_strict = open(&strict).await;
    let count = noisy_count(&on_strict)
        .await
        .expect("answered by the primary");
    assert!(near(count, AFTER), "the primary's count, got {count}");

    // The tolerant one still reads from the replica: the count it had when replay stopped.
    let on_tolerant = open(&tolerant).await;
    let count = noisy_count(&on_tolerant)
        .await
        .expect("answered by the replica");
    assert!(near(count, BEFORE), "the replica's count, got {count}");

    // Replay resumes: the strict pgdp uses the replica again once it has caught up.
    replica
        .batch_execute("SELECT pg_catalog.pg_wal_replay_resume()")
        .await
        .expect("resume replay");
    wait_for_health(&strict, "serving again", |h| {
        matches!(h, Health::Serving { .. })
    })
    .await;
    let count = noisy_count(&on_strict).await.expect("answered");
    assert!(near(count, AFTER), "caught up, got {count}");

    // The replica goes down while queries run: each is answered (by the replica, or by the
    // primary after a retry) or refused with 57P03, and the charge rules stay: a refusal before
    // the charge costs nothing, a failure after it keeps it.
    // The strict pgdp is done: it returns its budget slice, which otherwise counts in full in
    // the tolerant one's balance until it is returned (after 1 s idle).
    strict
        .shared()
        .ledger
        .return_slices(Duration::from_secs(5))
        .await;
    let spent_before = on_tolerant.budget().await.epsilon_spent;
    let queries = tokio::spawn(async move {
        let mut outcomes = Vec::new();
        for _ in 0..30 {
            outcomes.push(noisy_count(&on_tolerant).await);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        (on_tolerant, outcomes)
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    standby.stop().await.expect("stop the replica");
    let (on_tolerant, outcomes) = queries.await.expect("the query loop");
    let mut answered = 0;
    let mut refused = 0;
    for outcome in &outcomes {
        match outcome {
            Ok(count) => {
                assert!(near(*count, AFTER), "a current count, got {count}");
                answered += 1;
            }
            Err(e) => {
                assert_eq!(code(e), &SqlState::CANNOT_CONNECT_NOW, "{e:?}");
                refused += 1;
            }
        }
    }
    assert!(
        refused <= 2,
        "at most the queries in flight fail: {outcomes:?}"
    );
    wait_for_health(&tolerant, "down", |h| h == Health::Down).await;
    let count = noisy_count(&on_tolerant)
        .await
        .expect("the primary answers with the replica down");
    assert!(near(count, AFTER), "got {count}");
    let spent = on_tolerant.budget().await.epsilon_spent - spent_before;
    let charged = answered as f64 + 1.0;
    assert!(
        spent >= charged && spent <= charged + refused as f64,
        "ε 1 per answered query, and per failed one only if charged: spent {spent}, answered {answered}, refused {refused}"
    );
}

/// The tables of schema `s` that a catalog query through pgdp lists.
const TABLES_OF_S: &str = "SELECT table_name FROM information_schema.tables \
     WHERE table_schema = 's' ORDER BY table_name";

async fn catalog_tables(session: &Session) -> Result<Vec<String>, tokio_postgres::Error> {
    Ok(session
        .simple_rows(TABLES_OF_S)
        .await?
        .into_iter()
        .filter_map(|row| row.into_iter().next().flatten())
        .collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catalog_queries_read_a_replica_that_holds_the_shadow_build_and_else_the_primary() {
    let primary = Cluster::start().await.expect("a throwaway primary");
    connect(&primary.dsn("postgres"))
        .await
        .batch_execute(&format!("CREATE DATABASE {DATABASE}"))
        .await
        .expect("create the database");
    let data = connect(&primary.dsn(DATABASE)).await;
    data.batch_execute(
        "CREATE SCHEMA s; CREATE TABLE s.people (person_id bigint PRIMARY KEY, age integer);
         CREATE TABLE s.visits (person_id bigint, cost integer);",
    )
    .await
    .expect("create the tables on the primary");
    let standby = Cluster::standby_of(&primary).await.expect("a hot standby");
    let ledger = harness::fresh_database("standby_catalog_ledger").await;
    // A lag limit far above anything here: the replica keeps serving DP queries throughout,
    // so only the shadow's own rule (replayed past its build) keeps stale catalogs away.
    let running = pgdp(&primary, &standby, ledger.dsn(), 120_000).await;
    wait_for_health(&running, "serving", |h| matches!(h, Health::Serving { .. })).await;
    let session = open(&running).await;
    assert_eq!(
        catalog_tables(&session).await.expect("a catalog query"),
        ["people"]
    );

    // Replay stops; a reload adds s.visits to the policy and rebuilds the shadow on the
    // primary. The replica's shadow still lacks it, so catalog queries read the primary's.
    let shadow_db = format!("{DATABASE}_pgdp_catalog");
    // The shadow database was created on the primary when pgdp started; on a loaded machine
    // the replica may not have replayed its creation yet.
    let deadline = Instant::now() + Duration::from_secs(30);
    let replica_shadow = loop {
        match tokio_postgres::connect(&standby.dsn(&shadow_db), NoTls).await {
            Ok((client, connection)) => {
                tokio::spawn(connection);
                break client;
            }
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("the replica never replayed the shadow database: {e}"),
        }
    };
    let replica_postgres = connect(&standby.dsn("postgres")).await;
    replica_postgres
        .batch_execute("SELECT pg_catalog.pg_wal_replay_pause()")
        .await
        .expect("pause replay");
    let visits = "  s.visits:\n    kind: private\n    privacy_unit: person_id\n\
                  \x20   max_groups_per_unit: 1\n    max_rows_per_unit: 1\n    columns:\n\
                  \x20     person_id: { type: bigint }\n      cost: { type: integer, lower: 0, upper: 10 }\n";
    running
        .reload(policy_with(visits))
        .await
        .expect("reload adding s.visits");
    let holds_visits = async |server: &tokio_postgres::Client| -> bool {
        server
            .query_one("SELECT pg_catalog.to_regclass('s.visits') IS NOT NULL", &[])
            .await
            .expect("look up s.visits")
            .get(0)
    };
    assert!(
        !holds_visits(&replica_shadow).await,
        "replay is paused: the replica's shadow is the old build"
    );
    assert!(
        matches!(
            running.shared().upstream.standby_health()[0].1,
            Health::Serving { .. }
        ),
        "the replica still serves DP queries"
    );
    for _ in 0..10 {
        assert_eq!(
            catalog_tables(&session)
                .await
                .expect("answered by the primary"),
            ["people", "visits"],
            "a replica that has not replayed the build must not answer"
        );
    }

    // Replay resumes and catches up with the primary's position after the build.
    let target: String = data
        .query_one("SELECT pg_catalog.pg_current_wal_lsn()::text", &[])
        .await
        .expect("the primary's WAL position")
        .get(0);
    replica_postgres
        .batch_execute("SELECT pg_catalog.pg_wal_replay_resume()")
        .await
        .expect("resume replay");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let caught_up: bool = replica_postgres
            .query_one(
                "SELECT pg_catalog.pg_last_wal_replay_lsn() >= $1::text::pg_lsn",
                &[&target],
            )
            .await
            .expect("the replica's replay position")
            .get(0);
        if caught_up {
            break;
        }
        assert!(Instant::now() < deadline, "the replica never caught up");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(holds_visits(&replica_shadow).await, "replayed the build");
    // Two checks of the watcher, so it has read the replica's new position.
    tokio::time::sleep(Duration::from_millis(3 * pgdp::limits::STANDBY_CHECK_MS)).await;

    // With the primary stopped, only the replica can answer, and it does.
    drop(data);
    primary.stop().await.expect("stop the primary");
    for _ in 0..10 {
        assert_eq!(
            catalog_tables(&session)
                .await
                .expect("answered by the replica with the primary stopped"),
            ["people", "visits"]
        );
    }

    // The primary comes back and the replica goes away: catalog queries keep answering, from
    // the primary (at most one in flight when the replica stops may fail).
    primary.resume().await.expect("restart the primary");
    wait_for_health(&running, "serving", |h| matches!(h, Health::Serving { .. })).await;
    let queries = tokio::spawn(async move {
        let mut outcomes = Vec::new();
        for _ in 0..30 {
            outcomes.push(catalog_tables(&session).await);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        (session, outcomes)
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    drop(replica_shadow);
    drop(replica_postgres);
    standby.stop().await.expect("stop the replica");
    let (session, outcomes) = queries.await.expect("the query loop");
    let failed: Vec<_> = outcomes.iter().filter(|o| o.is_err()).collect();
    assert!(failed.len() <= 1, "catalog queries failed: {failed:?}");
    for tables in outcomes.iter().flatten() {
        assert_eq!(tables, &["people", "visits"]);
    }
    wait_for_health(&running, "down", |h| h == Health::Down).await;
    assert_eq!(
        catalog_tables(&session)
            .await
            .expect("answered by the primary with the replica down"),
        ["people", "visits"]
    );
}
