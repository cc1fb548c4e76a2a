//! Smoke tests of the test harness, the throwaway cluster and the demo dataset.
//!
//! Run them against the throwaway cluster with
//! `PGDP_TEST_FORCE_CLUSTER=1 cargo test --test integration harness_smoke::` (`.ci/run` does).

use crate::harness;

use std::collections::BTreeSet;

use pgdp::tools::cluster::{self, Cluster};
use pgdp::tools::demo;

#[tokio::test]
async fn upstream_answers_and_names_its_databases() {
    let upstream = harness::upstream().await;
    assert!(cluster::server_answers(upstream.admin_dsn()).await);
    assert_eq!(
        cluster::probe(upstream.admin_dsn()).await,
        cluster::Probe::Answers
    );
    // A server that answers but refuses the role is told apart from no server (issue 21: `pgdp
    // demo` said "No PostgreSQL server answers" for a server that refused its password).
    let config: tokio_postgres::Config = upstream.admin_dsn().parse().expect("valid dsn");
    let port = config.get_ports().first().copied().expect("port");
    let refused = cluster::probe(&format!(
        "host=127.0.0.1 port={port} user=pgdp_no_such_role dbname=postgres"
    ))
    .await;
    assert!(
        matches!(&refused, cluster::Probe::Refuses(why) if why.starts_with("28")),
        "{refused:?}"
    );
    if std::env::var(harness::FORCE_CLUSTER_ENV).is_ok_and(|v| v == "1") {
        assert_eq!(upstream.source(), harness::Source::Cluster);
    }
    let config: tokio_postgres::Config = upstream.dsn("x_y").parse().expect("valid dsn");
    assert_eq!(config.get_dbname(), Some("x_y"));
}

#[tokio::test]
async fn fresh_databases_are_distinct_usable_and_dropped() {
    let first = harness::fresh_database("Smoke Test!").await;
    let second = harness::fresh_database("smoke").await;
    assert_ne!(first.name(), second.name());
    assert!(
        first.name().starts_with("pgdp_t_smoke_test__"),
        "{}",
        first.name()
    );
    assert_eq!(harness::owner_pid(first.name()), Some(std::process::id()));

    let client = first.client().await;
    client
        .batch_execute("CREATE TABLE t (x int); INSERT INTO t VALUES (1), (2)")
        .await
        .expect("write");
    let row = client
        .query_one("SELECT count(*) FROM t", &[])
        .await
        .expect("read");
    assert_eq!(row.get::<_, i64>(0), 2);
    let current: String = client
        .query_one("SELECT current_database()", &[])
        .await
        .expect("name")
        .get(0);
    assert_eq!(current, first.name());

    let (first_name, second_name) = (first.name().to_string(), second.name().to_string());
    // Explicitly, with our own connection still open (WITH (FORCE) closes it) …
    first.drop_db().await;
    // … and through Drop.
    drop(second);
    let admin = harness::upstream().await.admin_client().await;
    for name in [first_name, second_name] {
        let left = admin
            .query_opt("SELECT 1 FROM pg_database WHERE datname = $1", &[&name])
            .await
            .expect("query pg_database");
        assert!(left.is_none(), "{name} was not dropped");
    }
}

#[tokio::test]
async fn databases_of_dead_processes_are_swept() {
    let upstream = harness::upstream().await;
    if upstream.source() == harness::Source::Env {
        return; // other machines' processes cannot be checked, so no sweep there
    }
    let mut child = std::process::Command::new("true").spawn().expect("spawn");
    let dead_pid = child.id();
    child.wait().expect("wait");
    let name = format!("pgdp_t_stale_{dead_pid}_0");
    let admin = upstream.admin_client().await;
    admin
        .batch_execute(&format!("CREATE DATABASE \"{name}\""))
        .await
        .expect("create");
    harness::drop_databases_of_dead_processes(upstream).await;
    let left = admin
        .query_opt("SELECT 1 FROM pg_database WHERE datname = $1", &[&name])
        .await
        .expect("query pg_database");
    assert!(left.is_none(), "{name} was not swept");
}

#[test]
fn database_names_carry_the_process_id() {
    assert_eq!(harness::owner_pid("pgdp_t_a_b_42_7"), Some(42));
    // The shadow catalog pgdp builds beside a test's database is swept with it.
    assert_eq!(harness::owner_pid("pgdp_t_a_b_42_7_pgdp_catalog"), Some(42));
    assert_eq!(
        harness::owner_pid(&format!(
            "pgdp_test_demo_s1_v{}",
            pgdp::tools::demo::VERSION
        )),
        None
    );
    assert_eq!(harness::owner_pid("pgdp_t_x_y"), None);
    assert_eq!(harness::sanitize("A-b c"), "a_b_c");
    assert_eq!(harness::sanitize(""), "db");
}

#[tokio::test]
async fn a_cluster_starts_answers_and_is_removed_on_drop() {
    let cluster = Cluster::start().await.expect("start a throwaway cluster");
    let dsn = cluster.dsn("postgres");
    assert!(cluster::server_answers(&dsn).await);
    let client = harness::connect(&dsn).await;
    let row = client
        .query_one("SHOW max_connections", &[])
        .await
        .expect("show");
    assert_eq!(
        row.get::<_, String>(0),
        cluster::MAX_CONNECTIONS.to_string()
    );
    let row = client
        .query_one("SHOW listen_addresses", &[])
        .await
        .expect("show");
    assert_eq!(row.get::<_, String>(0), "127.0.0.1");
    drop(client);

    let data_dir = cluster.data_dir().to_path_buf();
    assert!(data_dir.join("PG_VERSION").exists());
    drop(cluster);
    assert!(!data_dir.exists(), "{} is left behind", data_dir.display());
    assert!(!cluster::server_answers(&dsn).await);
}

#[tokio::test]
async fn demo_load_has_the_documented_shape_and_is_reused() {
    let db = harness::fresh_database("demo_load").await;
    let client = db.client().await;
    let mut lines = Vec::new();
    let report = demo::load(&client, 1, |line| lines.push(line.to_string()))
        .await
        .expect("load");
    assert!(!report.reused);
    assert_eq!(report.people, demo::PEOPLE_PER_SCALE);
    assert!(
        (900_000..1_100_000).contains(&report.visits),
        "{} visits",
        report.visits
    );
    assert!(
        lines
            .iter()
            .any(|l| l == "loading demo.people (100000 rows)…"),
        "{lines:?}"
    );

    let count = |sql: &'static str| {
        let client = &client;
        async move {
            client
                .query_one(sql, &[])
                .await
                .expect(sql)
                .get::<_, i64>(0)
        }
    };
    assert_eq!(
        count("SELECT count(*) FROM demo.people").await,
        report.people
    );
    assert_eq!(
        count("SELECT count(*) FROM demo.visits").await,
        report.visits
    );
    assert_eq!(count("SELECT count(*) FROM demo.regions").await, 10);

    let distinct = |column: &'static str| {
        let client = &client;
        async move {
            let sql = format!("SELECT DISTINCT {column} FROM demo.people");
            let rows = client.query(sql.as_str(), &[]).await.expect("distinct");
            rows.iter()
                .map(|r| r.get::<_, String>(0))
                .collect::<BTreeSet<String>>()
        }
    };
    let set = |values: &[&str]| {
        values
            .iter()
            .map(|v| v.to_string())
            .collect::<BTreeSet<_>>()
    };
    assert_eq!(distinct("sex").await, set(&demo::SEXES));
    assert_eq!(distinct("education").await, set(&demo::EDUCATION_LEVELS));
    let codes: Vec<&str> = demo::REGIONS.iter().map(|r| r.code).collect();
    assert_eq!(distinct("region").await, set(&codes));
    let regions: BTreeSet<String> = client
        .query("SELECT region FROM demo.regions", &[])
        .await
        .expect("regions")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(regions, set(&codes));

    let row = client
        .query_one(
            "SELECT min(age), max(age), min(income)::float8, max(income)::float8, \
                    count(*) FILTER (WHERE income > 1000000), count(*) FILTER (WHERE age IS NULL \
                    OR sex IS NULL OR region IS NULL OR education IS NULL OR income IS NULL) \
             FROM demo.people",
            &[],
        )
        .await
        .expect("people domains");
    assert!(row.get::<_, i32>(0) >= 0 && row.get::<_, i32>(1) <= 100);
    assert!(row.get::<_, f64>(2) >= 0.0);
    assert!(row.get::<_, f64>(3) > 1_000_000.0);
    assert!(
        row.get::<_, i64>(4) >= 3,
        "only {} incomes above 1,000,000",
        row.get::<_, i64>(4)
    );
    assert_eq!(row.get::<_, i64>(5), 0);

    let row = client
        .query_one(
            "SELECT min(visit_date)::text, max(visit_date)::text, min(cost)::float8, \
                    count(DISTINCT clinic), count(*) FILTER (WHERE clinic !~ '^C(0[1-9]|[1-4][0-9]|50)$') \
             FROM demo.visits",
            &[],
        )
        .await
        .expect("visit domains");
    assert!(row.get::<_, String>(0).as_str() >= demo::FIRST_VISIT_DATE);
    assert!(row.get::<_, String>(1).as_str() <= demo::LAST_VISIT_DATE);
    assert!(row.get::<_, f64>(2) >= 0.0);
    assert_eq!(row.get::<_, i64>(3), i64::from(demo::CLINICS));
    assert_eq!(row.get::<_, i64>(4), 0);

    let per_person = "SELECT max(n), count(*) FILTER (WHERE n <= 5), count(*) \
                      FROM (SELECT p.person_id, count(v.visit_id) AS n FROM demo.people p \
                            LEFT JOIN demo.visits v USING (person_id) GROUP BY p.person_id) AS c";
    let row = client
        .query_one(per_person, &[])
        .await
        .expect("visits per person");
    assert_eq!(row.get::<_, i64>(0), demo::VISITS_PER_PERSON_MAX);
    assert!(
        row.get::<_, i64>(1) * 2 > row.get::<_, i64>(2),
        "most people have few visits"
    );

    let diagnoses = "SELECT count(*) FILTER (WHERE holders = 1 AND starts_with(diagnosis, 'Z99.')), \
                            count(*) FILTER (WHERE starts_with(diagnosis, 'Z99.') AND holders > 1), \
                            count(*) FILTER (WHERE holders BETWEEN 2 AND 10), count(*) \
                     FROM (SELECT diagnosis, count(DISTINCT person_id) AS holders \
                           FROM demo.visits GROUP BY diagnosis) AS d";
    let row = client.query_one(diagnoses, &[]).await.expect("diagnoses");
    assert!(
        row.get::<_, i64>(0) >= 10,
        "single-person codes: {}",
        row.get::<_, i64>(0)
    );
    assert_eq!(row.get::<_, i64>(1), 0);
    assert!(
        row.get::<_, i64>(2) >= 100,
        "rare codes: {}",
        row.get::<_, i64>(2)
    );
    let top: String = client
        .query_one(
            "SELECT diagnosis FROM demo.visits GROUP BY 1 ORDER BY count(*) DESC LIMIT 1",
            &[],
        )
        .await
        .expect("top diagnosis")
        .get(0);
    assert_eq!(top, demo::COMMON_DIAGNOSES[0]);

    let orphans = count(
        "SELECT count(*) FROM demo.visits v WHERE NOT EXISTS \
         (SELECT 1 FROM demo.people p WHERE p.person_id = v.person_id)",
    );
    assert_eq!(orphans.await, 0);

    // Deterministic: fingerprints of the columns computed without transcendental functions are
    // the same on every run and machine. Update them together with `demo::VERSION`.
    let people_fingerprint = "SELECT md5(string_agg(concat_ws(',', person_id, age, sex, region, \
                              education), ';' ORDER BY person_id)) \
                              FROM demo.people WHERE person_id <= 1000";
    let visits_fingerprint = "SELECT md5(string_agg(concat_ws(',', visit_id, person_id, \
                              visit_date), ';' ORDER BY visit_id)) \
                              FROM demo.visits WHERE person_id <= 1000";
    let fingerprints = || {
        let client = &client;
        async move {
            let people = client
                .query_one(people_fingerprint, &[])
                .await
                .expect("people");
            let visits = client
                .query_one(visits_fingerprint, &[])
                .await
                .expect("visits");
            (people.get::<_, String>(0), visits.get::<_, String>(0))
        }
    };
    let first = fingerprints().await;
    assert_eq!(
        (first.0.as_str(), first.1.as_str()),
        (
            "78cfc72992d1c489f80b2c35d51d22ac",
            "c57bd1d3bd1862a8cb0ebf417e70c5f1"
        )
    );

    let mut lines = Vec::new();
    let again = demo::load(&client, 1, |line| lines.push(line.to_string()))
        .await
        .expect("reload");
    assert!(again.reused, "{lines:?}");
    assert_eq!((again.people, again.visits), (report.people, report.visits));
    assert!(lines.iter().any(|l| l.contains("reusing")), "{lines:?}");

    // An invalid scale is refused before anything happens.
    assert!(matches!(
        demo::load(&client, 0, |_| {}).await,
        Err(demo::LoadError::InvalidScale { .. })
    ));

    // Without the schema's marker the dataset is dropped and loaded again, with the same rows.
    client
        .batch_execute("COMMENT ON SCHEMA demo IS NULL")
        .await
        .expect("clear marker");
    let reloaded = demo::load(&client, 1, |_| {}).await.expect("reload");
    assert!(!reloaded.reused);
    assert_eq!(
        (reloaded.people, reloaded.visits),
        (report.people, report.visits)
    );
    assert_eq!(fingerprints().await, first);

    drop(client);
    db.drop_db().await;
}

#[tokio::test]
async fn the_shared_demo_database_is_loaded_once() {
    let first = harness::demo_database(1).await;
    let second = harness::demo_database(1).await;
    assert_eq!(first.name(), second.name());
    let client = first.client().await;
    let report = demo::load(&client, 1, |_| {}).await.expect("load");
    assert!(report.reused);
    assert_eq!(report.people, demo::PEOPLE_PER_SCALE);
    drop(first);
    // Dropping a handle keeps the shared database.
    let client = second.client().await;
    client
        .query_one("SELECT count(*) FROM demo.regions", &[])
        .await
        .expect("still there");
}
