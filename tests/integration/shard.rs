//! A PostgreSQL sharded by privacy unit: a coordinator whose `demo.people` and `demo.visits` are
//! hash-partitioned by `person_id` over `postgres_fdw` foreign tables on two shards
//! ([`pgdp::tools::shards`]), every server a throwaway cluster started from the installed
//! binaries, the data copied from the demo dataset (scale 1) of the test upstream ("one server").
//!
//! - [`the_coordinator_gives_the_answers_of_one_server`]: pgdp's upstream SQL (one server's
//!   shape, and the partitionwise shape) gives the same rows on the coordinator as on one
//!   server, for COUNT, SUM, AVG, a join, a distinct count, grouped queries with partition
//!   selection and time buckets (`date_trunc` by day to year, and `EXTRACT` / `date_part` of the
//!   year, which the partitionwise shape writes in date arithmetic); and two pgdp with the same secret and noise seed, one over each, release the
//!   same noisy answers.
//! - [`the_per_unit_stage_runs_on_every_shard`]: through pgdp's EXPLAIN the statement is in the
//!   partitionwise shape, and PostgreSQL's `EXPLAIN VERBOSE` of it on the coordinator sends every
//!   shard a remote SQL that groups by the unit (asynchronous foreign scans); without pgdp's
//!   `SET LOCAL`s the shards send their rows ungrouped.
//! - [`explain_says_when_the_per_unit_stage_stays_on_the_coordinator`]: for a grouping by a
//!   stable date function (a `timestamptz`'s hour), a unit below a day, a quantile and a join with a table the shards do not hold, EXPLAIN
//!   names the construct that keeps the per-unit stage on the coordinator, and the coordinator's
//!   plan fetches every shard's rows ungrouped.
//! - [`a_lookup_join_is_grouped_on_every_shard`]: a join on the unit with demo.people (one row
//!   per person) is one aggregate over the join in the partitionwise shape: every shard runs the
//!   join, and without a filter the grouping too, and the rows are one server's.
//! - [`a_shard_that_is_down_refuses_and_keeps_the_charge`]: with one shard stopped a DP query is
//!   refused with 57P03 and no rows, its charge stands, and answers come back with the shard.
//! - [`a_table_partitioned_by_another_column_keeps_the_single_server_shape`]: on one server,
//!   a table partitioned by `visit_id` gets the single-server shape, one partitioned by the unit
//!   the partitionwise shape, and both answer as the unpartitioned table does.
//!
//! - [`declared_unique_keys_answer_on_the_coordinator_as_on_one_server`]: the coordinator has
//!   no primary key on its partitioned tables of foreign partitions; with the policy's
//!   `unique_keys` (verified by reading the tables at start) `demo.prescriptions` is answered
//!   instead of refused, the people–visits join takes its one-group-per-person form, and both
//!   answer as one server does; a declared key that holds a value twice stops pgdp at start and
//!   is refused at reload, the policy in force staying.
//!
//! The sharded deployment is built once per test process and shared under a lock (the fault
//! test stops a shard), so these tests run one at a time.

use std::collections::BTreeMap;

use pgdp::dp::analyze::{self, Context};
use pgdp::dp::release;
use pgdp::dp::rewrite::{self, Rewrite};
use pgdp::policy::Policy;
use pgdp::server::{self, Config, Options, Running};
use pgdp::session::classify::{self, Statement};
use pgdp::tools::shards::Shards;
use pgdp::upstream::{ColumnFact, ColumnFacts, Upstream};
use tokio::sync::{Mutex, MutexGuard, OnceCell};
use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, SimpleQueryMessage};

use crate::harness::{self, TestDb};
use crate::support::{
    code, policy_with_budget, Session, ANALYST, DATABASE as POLICY_DATABASE, PASSWORD,
};

/// Shards of the shared deployment.
const SHARDS: usize = 2;

/// The group-choice secret of every pgdp here, so that two of them choose the same groups.
const SECRET: &str = "shard-tests-group-choice-secret";

/// The queries compared on one server and on the coordinator.
const QUERIES: &[&str] = &[
    "SELECT COUNT(*) FROM demo.visits",
    "SELECT SUM(cost) FROM demo.visits",
    "SELECT AVG(income) FROM demo.people",
    "SELECT region, COUNT(*), AVG(income) FROM demo.people GROUP BY region",
    "SELECT diagnosis, COUNT(*), SUM(cost) FROM demo.visits GROUP BY diagnosis",
    "SELECT clinic, COUNT(DISTINCT person_id) AS patients, AVG(cost) FROM demo.visits WHERE cost > 50 GROUP BY clinic",
    "SELECT COUNT(DISTINCT diagnosis) FROM demo.visits",
    "SELECT p.education, COUNT(*) FROM demo.visits v JOIN demo.people p ON p.person_id = v.person_id GROUP BY p.education",
    "SELECT date_trunc('month', visit_date) AS m, COUNT(*) FROM demo.visits GROUP BY 1",
    "SELECT date_trunc('quarter', visit_date) AS q, COUNT(DISTINCT diagnosis), SUM(cost) FROM demo.visits GROUP BY 1",
    "SELECT date_trunc('week', CAST(visit_date AS timestamp)) AS w, AVG(cost) FROM demo.visits WHERE visit_date >= '2024-06-01' GROUP BY 1",
    "SELECT EXTRACT(YEAR FROM visit_date) AS y, COUNT(*), SUM(cost) FROM demo.visits GROUP BY 1",
    "SELECT date_part('year', CAST(visit_date AS timestamp)) AS y, COUNT(DISTINCT diagnosis) FROM demo.visits GROUP BY 1",
];

static DEPLOYMENT: OnceCell<Mutex<Shards>> = OnceCell::const_new();

/// The shared deployment, locked for the caller's test.
async fn deployment() -> MutexGuard<'static, Shards> {
    DEPLOYMENT
        .get_or_init(|| async {
            let source = harness::demo_database(1).await;
            let client = harness::connect(source.dsn()).await;
            let shards = Shards::start_demo(&client, SHARDS)
                .await
                .unwrap_or_else(|e| panic!("the sharded deployment: {e}"));
            shards
                .stop_when_process_exits()
                .unwrap_or_else(|e| panic!("cannot arrange the shards' clean-up: {e}"));
            Mutex::new(shards)
        })
        .await
        .lock()
        .await
}

fn policy() -> Policy {
    let mut policy = policy_with_budget(1000, 2);
    policy.secret = Some(SECRET.into());
    policy
}

/// The policy, and the plan and single-server rewrite of `sql` under it.
fn single_server(sql: &str) -> (Policy, pgdp::dp::plan::Plan, Rewrite) {
    let policy = policy();
    let statements = classify::classify(sql).unwrap_or_else(|e| panic!("{sql}: {e}"));
    let [Statement::Query(query)] = statements.as_slice() else {
        panic!("{sql}: not one query");
    };
    let ctx = Context {
        policy: &policy,
        search_path: vec!["demo".into()],
    };
    let plan = analyze::analyze(query, &ctx).unwrap_or_else(|e| panic!("{sql}: {e}"));
    let single = rewrite::rewrite(&plan, &[], SECRET).unwrap_or_else(|e| panic!("{sql}: {e}"));
    (policy, plan, single)
}

/// The single-server rewrite of `sql` under the demo policy, and its partitionwise shape.
fn compile(sql: &str) -> (Rewrite, Rewrite) {
    let (policy, _, single) = single_server(sql);
    let partitionwise = rewrite::partitionwise(single.clone(), &policy, true)
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    assert!(partitionwise.sql.partitionwise() && !single.sql.partitionwise());
    (single, partitionwise)
}

/// The rows of `sql` (text, sorted), run in a transaction with `settings` first.
async fn rows(client: &Client, settings: &str, sql: &str) -> Vec<Vec<Option<String>>> {
    let batch = format!("BEGIN READ ONLY; {settings} {sql}; COMMIT");
    let messages = client
        .simple_query(&batch)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    let mut rows: Vec<Vec<Option<String>>> = messages
        .into_iter()
        .filter_map(|m| match m {
            SimpleQueryMessage::Row(row) => Some(
                (0..row.len())
                    .map(|i| row.get(i).map(str::to_string))
                    .collect(),
            ),
            _ => None,
        })
        .collect();
    rows.sort();
    rows
}

const PARTITIONWISE: &str =
    "SET LOCAL enable_partitionwise_aggregate = on; SET LOCAL enable_partitionwise_join = on;";

/// The contribution histogram of `sql` (the demo policy; `pgdp.choose_bounds` on): in the
/// single-server shape, and in the shape pgdp sends to shards; `None` when the query chooses no
/// cap.
fn histogram(sql: &str) -> Option<(String, String)> {
    let (policy, plan, single) = single_server(sql);
    let budget = release::Budget {
        epsilon: 1.0,
        delta: 1e-7,
        mechanism: pgdp::policy::Mechanism::Laplace,
    };
    let mechanisms =
        release::mechanisms(&plan, &single, budget).unwrap_or_else(|e| panic!("{sql}: {e}"));
    let choice = release::bounds::ChoicePlan::new(&plan, &single, &mechanisms, &[], SECRET, None)
        .unwrap_or_else(|e| panic!("{sql}: {e}"))?;
    let shaped = rewrite::UpstreamShape::Partitionwise {
        lookup_on_shards: true,
    }
    .apply_to_histogram(choice.sql.clone(), &policy)
    .unwrap_or_else(|e| panic!("{sql}: {e}"));
    assert!(shaped.partitionwise());
    Some((choice.sql.to_string(), shaped.to_string()))
}

/// pgdp over `upstream` with the shared secret, a noise seed and a fresh ledger.
async fn pgdp(upstream: String, ledger: &TestDb) -> Running {
    server::start_with(
        Config {
            policy: policy(),
            upstream,
            ledger: Some(ledger.dsn().to_string()),
            listen: "127.0.0.1:0".into(),
            noise_seed: Some([23; 32]),
        },
        Options::default(),
    )
    .await
    .expect("pgdp starts")
}

async fn open(running: &Running) -> Session {
    let dsn = format!(
        "host=127.0.0.1 port={} user={ANALYST} password={PASSWORD} dbname={POLICY_DATABASE} sslmode=disable",
        running.addr.port()
    );
    Session::open(&dsn).await.expect("connect to pgdp")
}

/// EXPLAIN through pgdp: its lines.
async fn explain(session: &Session, sql: &str) -> Vec<String> {
    session
        .simple_rows(&format!("EXPLAIN {sql}"))
        .await
        .unwrap_or_else(|e| panic!("EXPLAIN {sql}: {e}"))
        .into_iter()
        .filter_map(|row| row.into_iter().next().flatten())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_coordinator_gives_the_answers_of_one_server() {
    let shards = deployment().await;
    let single = harness::demo_database(1).await;
    let on_single = harness::connect(single.dsn()).await;
    let on_coordinator = harness::connect(&shards.dsn()).await;

    // The exact pre-noise rows, in both shapes.
    for sql in QUERIES {
        let (one, partitionwise) = compile(sql);
        let expected = rows(&on_single, "", &one.sql).await;
        assert!(!expected.is_empty(), "{sql}");
        assert_eq!(
            rows(&on_coordinator, "", &one.sql).await,
            expected,
            "single-server shape on the coordinator: {sql}"
        );
        assert_eq!(
            rows(&on_coordinator, PARTITIONWISE, &partitionwise.sql).await,
            expected,
            "partitionwise shape on the coordinator: {sql}"
        );
        assert_eq!(
            rows(&on_single, PARTITIONWISE, &partitionwise.sql).await,
            expected,
            "partitionwise shape on one server: {sql}"
        );
    }

    // End to end: the same secret and noise seed give the same released rows, where both
    // servers know the same facts. One fact only one server can know: a coordinator cannot
    // declare `PRIMARY KEY (person_id)` over foreign partitions, so a query grouped by columns of
    // demo.people joined on the unit has one group per person on the single server and the
    // policy's five on the coordinator (docs/privacy.md, "One group per unit through a
    // lookup"): another noise scale, answered after the others.
    let ledgers = [
        harness::fresh_database("shard_ledger").await,
        harness::fresh_database("shard_ledger").await,
    ];
    let over_single = pgdp(single.dsn().to_string(), &ledgers[0]).await;
    let over_shards = pgdp(shards.dsn(), &ledgers[1]).await;
    let (a, b) = (open(&over_single).await, open(&over_shards).await);
    let explain = |rows: Vec<Vec<Option<String>>>| -> String {
        rows.into_iter()
            .flatten()
            .flatten()
            .collect::<Vec<_>>()
            .join("\n")
    };
    let mut one_group_on_single = Vec::new();
    for sql in QUERIES {
        let plan = explain(
            a.simple_rows(&format!("EXPLAIN {sql}"))
                .await
                .expect("EXPLAIN"),
        );
        if plan.contains("groups per unit: 1") {
            let coordinator = explain(
                b.simple_rows(&format!("EXPLAIN {sql}"))
                    .await
                    .expect("EXPLAIN"),
            );
            assert!(!coordinator.contains("groups per unit: 1"), "{coordinator}");
            one_group_on_single.push(*sql);
        }
    }
    assert_eq!(
        one_group_on_single,
        [QUERIES[7]],
        "the join grouped by a column of demo.people"
    );
    for sql in QUERIES.iter().filter(|q| !one_group_on_single.contains(q)) {
        let from_single = a
            .simple_rows(sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
        let from_shards = b
            .simple_rows(sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
        assert!(!from_single.is_empty(), "{sql}");
        assert_eq!(from_single, from_shards, "{sql}");
    }
    assert_eq!(a.budget().await, b.budget().await);
    for sql in one_group_on_single {
        let keys = |rows: Vec<Vec<Option<String>>>| -> Vec<Option<String>> {
            rows.into_iter().map(|r| r[0].clone()).collect()
        };
        let from_single = a.simple_rows(sql).await.expect("single server");
        let from_shards = b.simple_rows(sql).await.expect("coordinator");
        assert_eq!(
            keys(from_single),
            keys(from_shards),
            "the same groups: {sql}"
        );
    }
    drop((a, b, over_single, over_shards));
    for ledger in ledgers {
        ledger.drop_db().await;
    }
}

/// The foreign scans of an `EXPLAIN (VERBOSE)` plan: per foreign relation named in it, its
/// remote SQL.
fn remote_sql(plan: &[String]) -> BTreeMap<String, String> {
    let mut found = BTreeMap::new();
    let mut relation = None;
    for line in plan {
        let line = line.trim();
        if let Some(rest) = line.strip_prefix("Relations: ") {
            relation = Some(rest.to_string());
        } else if let Some(rest) = line
            .strip_prefix("->  Async Foreign Scan on ")
            .or_else(|| line.strip_prefix("->  Foreign Scan on "))
        {
            relation = Some(rest.to_string());
        } else if let Some(sql) = line.strip_prefix("Remote SQL: ") {
            found.insert(relation.take().unwrap_or_default(), sql.to_string());
        }
    }
    found
}

/// The coordinator's `EXPLAIN (VERBOSE, COSTS OFF)` of `statement`, run after `settings` in a
/// transaction: its lines.
async fn coordinator_plan(coordinator: &Client, settings: &str, statement: &str) -> Vec<String> {
    let rows = coordinator
        .simple_query(&format!(
            "BEGIN; {settings} EXPLAIN (VERBOSE, COSTS OFF) {statement}; ROLLBACK"
        ))
        .await
        .unwrap_or_else(|e| panic!("EXPLAIN: {e}"));
    rows.into_iter()
        .filter_map(|m| match m {
            SimpleQueryMessage::Row(r) => r.get(0).map(str::to_string),
            _ => None,
        })
        .collect()
}

/// EXPLAIN's claim that the per-unit stage runs on the coordinator is what the coordinator's
/// plan does: for each shape, pgdp names the construct, and PostgreSQL's plan of the statement
/// (in the partitionwise shape, with pgdp's settings) fetches every shard's rows ungrouped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_says_when_the_per_unit_stage_stays_on_the_coordinator() {
    let shards = deployment().await;
    let ledger = harness::fresh_database("shard_ledger").await;
    let running = pgdp(shards.dsn(), &ledger).await;
    let session = open(&running).await;
    let coordinator = harness::connect(&shards.dsn()).await;

    for (sql, construct) in [
        (
            "SELECT date_trunc('hour', checked_in) AS h, COUNT(*) FROM demo.visits GROUP BY 1",
            "date_trunc of a date or timestamptz",
        ),
        (
            "SELECT EXTRACT(hour FROM checked_in) AS h, COUNT(*) FROM demo.visits GROUP BY 1",
            "EXTRACT from a timestamptz",
        ),
        (
            "SELECT date_trunc('hour', CAST(visit_date AS timestamp)) AS h, COUNT(*) FROM demo.visits GROUP BY 1",
            "date_trunc takes its unit as text",
        ),
        (
            "SELECT EXTRACT(month FROM visit_date) AS m, COUNT(*) FROM demo.visits GROUP BY 1",
            "EXTRACT takes its field as text",
        ),
        ("SELECT MEDIAN(cost) FROM demo.visits", "window function"),
        (
            "SELECT r.name, COUNT(*) FROM demo.people p JOIN demo.regions r ON r.region = p.region GROUP BY r.name",
            "demo.regions is not partitioned by the privacy unit",
        ),
    ] {
        let lines = explain(&session, sql).await;
        assert!(
            lines.iter().any(|l| l.starts_with("upstream: ")
                && l.contains("the per-unit stage runs on the coordinator")
                && l.contains(construct)),
            "{sql}: {lines:#?}"
        );
        let (_, partitionwise) = compile(sql);
        let plan = coordinator_plan(&coordinator, PARTITIONWISE, &partitionwise.sql).await;
        let remote = remote_sql(&plan);
        for shard in 0..SHARDS {
            let ungrouped = remote.iter().any(|(relation, sql)| {
                relation.contains(&format!("_shard_{shard}")) && !sql.contains(" GROUP BY ")
            });
            assert!(ungrouped, "{sql}, shard {shard}: {plan:#?}");
        }
    }
    drop((session, running));
    ledger.drop_db().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_per_unit_stage_runs_on_every_shard() {
    let shards = deployment().await;
    let ledger = harness::fresh_database("shard_ledger").await;
    let running = pgdp(shards.dsn(), &ledger).await;
    let session = open(&running).await;
    let coordinator = harness::connect(&shards.dsn()).await;
    let mut histograms = 0;

    for sql in [
        "SELECT diagnosis, COUNT(*), SUM(cost) FROM demo.visits GROUP BY diagnosis",
        "SELECT COUNT(DISTINCT diagnosis) FROM demo.visits",
        "SELECT p.education, COUNT(*) FROM demo.visits v JOIN demo.people p ON p.person_id = v.person_id GROUP BY p.education",
        // Time buckets of whole days, in date arithmetic on the shards.
        "SELECT date_trunc('month', visit_date) AS m, COUNT(*) FROM demo.visits GROUP BY 1",
        "SELECT date_trunc('year', CAST(visit_date AS timestamp)) AS y, SUM(cost) FROM demo.visits GROUP BY 1",
        // A year of a date, as its first day on the shards.
        "SELECT EXTRACT(YEAR FROM visit_date) AS y, COUNT(*) FROM demo.visits GROUP BY 1",
    ] {
        let lines = explain(&session, sql).await;
        assert!(
            lines.iter().any(|l| l.starts_with("upstream: ")
                && l.contains("partitioned by the privacy unit")
                && l.contains("the per-unit stage can run on each shard")),
            "{sql}: {lines:#?}"
        );
        let (one, partitionwise) = compile(sql);
        let text = lines.join(" ");
        let distinct = sql.contains("DISTINCT diagnosis");
        assert_eq!(text.contains("NOT MATERIALIZED"), distinct, "{sql}: {text}");

        let pushed = coordinator_plan(&coordinator, PARTITIONWISE, &partitionwise.sql).await;
        let remote = remote_sql(&pushed);
        for shard in 0..SHARDS {
            let grouped_by_unit = remote.iter().any(|(relation, sql)| {
                relation.contains(&format!("visits_shard_{shard}"))
                    && sql.contains("person_id")
                    && sql.contains(" GROUP BY ")
            });
            assert!(grouped_by_unit, "{sql}, shard {shard}: {pushed:#?}");
        }
        assert!(
            pushed.iter().any(|l| l.contains("Async Foreign Scan")),
            "{sql}: {pushed:#?}"
        );
        // The contribution histogram that chooses the query's caps is sent in the same shape:
        // it groups by the unit on every shard too, and gives one server's rows.
        if let Some((single_histogram, histogram)) = histogram(sql) {
            let plan = coordinator_plan(&coordinator, PARTITIONWISE, &histogram).await;
            let remote = remote_sql(&plan);
            for shard in 0..SHARDS {
                let grouped_by_unit = remote.iter().any(|(relation, sql)| {
                    relation.contains(&format!("visits_shard_{shard}"))
                        && sql.contains("person_id")
                        && sql.contains(" GROUP BY ")
                });
                assert!(grouped_by_unit, "histogram of {sql}, shard {shard}: {plan:#?}");
            }
            assert_eq!(
                rows(&coordinator, PARTITIONWISE, &histogram).await,
                rows(&coordinator, "", &single_histogram).await,
                "histogram of {sql}"
            );
            histograms += 1;
        }
        // Without the settings pgdp adds, every shard sends its rows ungrouped.
        let unpushed = coordinator_plan(&coordinator, "", &one.sql).await;
        assert!(
            remote_sql(&unpushed)
                .values()
                .all(|remote| !remote.contains(" GROUP BY ")),
            "{sql}: {unpushed:#?}"
        );
    }
    assert!(histograms >= 3, "histograms checked: {histograms}");
    drop((session, running));
    ledger.drop_db().await;
}

/// The lookup form of a join on the unit (demo.people has one row per person: its primary key
/// on one server, `unique_keys` on a coordinator) aggregates demo.visits per person and joins
/// demo.people to that. On shards where both tables are partitioned by `person_id`, pgdp writes
/// it as one aggregate over the join (`rewrite::partitionwise`, item 5): the coordinator's plan
/// then sends every shard the join (without it every people row crossed to the coordinator) and,
/// for the unfiltered joins, the grouping (under a selective filter the planner may group on the
/// coordinator), EXPLAIN's reading of the text says so, and the rows are one server's. With
/// demo.people not partitioned the two CTEs stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lookup_join_is_grouped_on_every_shard() {
    let shards = deployment().await;
    let single = harness::demo_database(1).await;
    let on_single = harness::connect(single.dsn()).await;
    let coordinator = harness::connect(&shards.dsn()).await;
    let upstream = Upstream::new(single.dsn()).expect("the test database's DSN");
    let sharded = ["demo.people".to_string(), "demo.visits".to_string()];
    for sql in [
        "SELECT p.education, COUNT(*) FROM demo.visits v JOIN demo.people p ON p.person_id = v.person_id GROUP BY p.education",
        "SELECT p.region, COUNT(*), SUM(v.cost) FROM demo.visits v JOIN demo.people p ON p.person_id = v.person_id WHERE p.sex = 'F' AND v.cost > 20 GROUP BY p.region",
        "SELECT v.clinic, p.education, AVG(v.cost) FROM demo.people p JOIN demo.visits v ON v.person_id = p.person_id GROUP BY 1, 2",
        "SELECT COUNT(*), SUM(v.cost) FROM demo.visits v JOIN demo.people p ON p.person_id = v.person_id WHERE p.income > 50000",
    ] {
        let (policy, mut plan, _) = single_server(sql);
        let facts = ColumnFacts::default();
        upstream
            .learn_column_facts(&facts, ColumnFact::Unique, &plan.unit_lookup_keys())
            .await
            .expect("catalog lookup");
        assert!(plan.assume_unit_lookup(&facts), "{sql}: a lookup join");
        let one = rewrite::rewrite(&plan, &[], SECRET).unwrap_or_else(|e| panic!("{sql}: {e}"));
        assert!(one.sql.contains("__dp_below"), "{sql}: {}", one.sql);
        assert!(
            rewrite::lookup_on_shards(&plan, &sharded, &policy),
            "{sql}"
        );
        assert!(
            !rewrite::lookup_on_shards(&plan, &sharded[1..], &policy),
            "{sql}: demo.people not partitioned"
        );
        let kept = rewrite::partitionwise(one.clone(), &policy, false).expect("reshaped");
        assert!(kept.sql.contains("__dp_below"), "{sql}: {}", kept.sql);
        let merged = rewrite::partitionwise(one.clone(), &policy, true).expect("reshaped");
        assert!(!merged.sql.contains("__dp_below"), "{sql}: {}", merged.sql);
        assert_eq!(
            rewrite::per_unit_stage(merged.sql.as_str(), &sharded, &policy).expect("read"),
            Some(rewrite::PerUnitStage::Shippable),
            "{sql}"
        );
        match rewrite::per_unit_stage(merged.sql.as_str(), &sharded[1..], &policy).expect("read")
        {
            Some(rewrite::PerUnitStage::Coordinator { reason }) => assert!(
                reason.contains("demo.people is not partitioned by the privacy unit"),
                "{sql}: {reason}"
            ),
            other => panic!("{sql}: {other:?}"),
        }

        let expected = rows(&on_single, "", &one.sql).await;
        assert!(!expected.is_empty(), "{sql}");
        assert_eq!(
            rows(&coordinator, PARTITIONWISE, &merged.sql).await,
            expected,
            "{sql}"
        );
        assert_eq!(
            rows(&on_single, PARTITIONWISE, &merged.sql).await,
            expected,
            "{sql}"
        );
        let plan = coordinator_plan(&coordinator, PARTITIONWISE, &merged.sql).await;
        let remote = remote_sql(&plan);
        for shard in 0..SHARDS {
            let joined = remote.iter().any(|(relation, sql)| {
                relation.contains(&format!("visits_shard_{shard}"))
                    && relation.contains(&format!("people_shard_{shard}"))
                    && sql.contains(" JOIN ")
            });
            assert!(joined, "{sql}, shard {shard}: {plan:#?}");
        }
        // Every shard joins; whether it also groups is the coordinator planner's cost choice
        // (postgres_fdw's remote estimates): with about one joined row per (unit, key) group, as
        // under the selective condition above, it has once grouped the joined rows over the
        // Append on the coordinator instead (a fresh-clone run, 2026-12-01). Unconditionally
        // grouped on every shard: the unfiltered joins.
        if !sql.contains(" WHERE ") {
            assert!(
                remote.iter().all(|(_, sql)| sql.contains(" GROUP BY ")),
                "{sql}: a shard sends rows ungrouped: {plan:#?}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_that_is_down_refuses_and_keeps_the_charge() {
    let shards = deployment().await;
    let ledger = harness::fresh_database("shard_ledger").await;
    let running = pgdp(shards.dsn(), &ledger).await;
    let session = open(&running).await;
    let sql = "SELECT COUNT(*) FROM demo.people";
    let truth = 100_000.0;
    let count = |rows: Vec<Vec<Option<String>>>| -> f64 {
        rows[0][0]
            .as_deref()
            .and_then(|v| v.parse().ok())
            .expect("a count")
    };
    let before = count(session.simple_rows(sql).await.expect("answered"));
    // ε = 1, one row per person: Laplace of scale 1; P(|noise| > 30) = e^-30.
    assert!((before - truth).abs() < 30.0, "{before}");
    let spent = session.budget().await.epsilon_spent;

    shards.shards()[1].stop().await.expect("stop shard 1");
    let refused = session
        .simple_rows("SELECT COUNT(*) FROM demo.people WHERE age > 30")
        .await
        .expect_err("refused while a shard is down");
    assert_eq!(code(&refused), &SqlState::CANNOT_CONNECT_NOW, "{refused:?}");
    let message = refused
        .as_db_error()
        .map(|e| e.message().to_string())
        .unwrap_or_default();
    assert!(!message.contains("shard"), "no upstream text: {message}");
    // Charged before the upstream ran, and kept.
    let after = session.budget().await.epsilon_spent;
    assert!((after - spent - 1.0).abs() < 1e-9, "{spent} -> {after}");

    shards.shards()[1].resume().await.expect("resume shard 1");
    let again = count(
        session
            .simple_rows("SELECT COUNT(*) FROM demo.people WHERE age >= 0")
            .await
            .expect("answered with the shard back"),
    );
    assert!((again - truth).abs() < 30.0, "{again}");
    drop((session, running));
    ledger.drop_db().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_partitioned_by_another_column_keeps_the_single_server_shape() {
    // Three databases on one server, each with s.visits holding the same rows: unpartitioned,
    // partitioned by visit_id, partitioned by person_id (the unit).
    let layouts = [
        ("plain", ""),
        ("by_visit", "PARTITION BY HASH (visit_id)"),
        ("by_person", "PARTITION BY HASH (person_id)"),
    ];
    let mut databases = Vec::new();
    for (name, partitioning) in layouts {
        let db = harness::fresh_database(&format!("shard_{name}")).await;
        let client = db.client().await;
        let mut ddl = format!(
            "CREATE SCHEMA s; CREATE TABLE s.visits (visit_id bigint NOT NULL, person_id bigint NOT NULL, \
             diagnosis text, cost numeric(10,2)) {partitioning};"
        );
        if !partitioning.is_empty() {
            for i in 0..3 {
                ddl.push_str(&format!(
                    "CREATE TABLE s.visits_{i} PARTITION OF s.visits FOR VALUES WITH (MODULUS 3, REMAINDER {i});"
                ));
            }
        }
        ddl.push_str(
            "INSERT INTO s.visits SELECT g, g % 4000, 'D' || (g % 37), (g % 500)::numeric \
             FROM generate_series(1, 60000) g; ANALYZE s.visits;",
        );
        client.batch_execute(&ddl).await.expect("load s.visits");
        databases.push(db);
    }
    let verifier = crate::support::demo_policy_text()
        .lines()
        .find(|l| l.trim_start().starts_with("scram_verifier:"))
        .expect("the demo analyst's verifier")
        .to_string();
    let text = format!(
        "database: {POLICY_DATABASE}\n\
         defaults: {{ epsilon: 1.0, delta: 1.0e-7, mechanism: laplace }}\n\
         analysts:\n  {ANALYST}:\n{verifier}\n    budget: {{ epsilon: 100, delta: 1.0e-5 }}\n\
         tables:\n  s.visits:\n    kind: private\n    privacy_unit: person_id\n\
         \x20   max_groups_per_unit: 3\n    max_rows_per_unit: 5\n    columns:\n\
         \x20     visit_id: {{ type: bigint }}\n      person_id: {{ type: bigint }}\n\
         \x20     diagnosis: {{ type: text, groupable: true }}\n\
         \x20     cost: {{ type: numeric, lower: 0, upper: 400 }}\n"
    );
    let mut policy = pgdp::policy::parse(&text).unwrap_or_else(|e| panic!("policy: {e}"));
    policy.secret = Some(SECRET.into());

    let queries = [
        "SELECT diagnosis, COUNT(*), AVG(cost) FROM s.visits GROUP BY diagnosis",
        "SELECT COUNT(DISTINCT diagnosis), SUM(cost) FROM s.visits",
    ];
    let mut answers = Vec::new();
    let mut shapes = Vec::new();
    for db in &databases {
        let ledger = harness::fresh_database("shard_ledger").await;
        let running = server::start_with(
            Config {
                policy: policy.clone(),
                upstream: db.dsn().to_string(),
                ledger: Some(ledger.dsn().to_string()),
                listen: "127.0.0.1:0".into(),
                noise_seed: Some([29; 32]),
            },
            Options::default(),
        )
        .await
        .expect("pgdp starts");
        let session = open(&running).await;
        let mut explained = Vec::new();
        let mut answered = Vec::new();
        for sql in queries {
            explained.push(explain(&session, sql).await);
            answered.push(
                session
                    .simple_rows(sql)
                    .await
                    .unwrap_or_else(|e| panic!("{sql}: {e}")),
            );
        }
        shapes.push(explained);
        answers.push(answered);
        drop((session, running));
        ledger.drop_db().await;
    }
    let note = |lines: &[String]| -> Option<String> {
        lines.iter().find(|l| l.starts_with("upstream: ")).cloned()
    };
    let sql_lines = |lines: &[String]| -> Vec<String> {
        lines
            .iter()
            .filter(|l| !l.starts_with("upstream: "))
            .cloned()
            .collect()
    };
    for (q, sql) in queries.iter().enumerate() {
        let (plain, by_visit, by_person) = (&shapes[0][q], &shapes[1][q], &shapes[2][q]);
        assert_eq!(note(plain), None, "{sql}");
        assert!(
            note(by_visit).is_some_and(|n| n.contains("not by its privacy unit")),
            "{sql}: {by_visit:#?}"
        );
        // The same statement as on the unpartitioned table.
        assert_eq!(sql_lines(by_visit), sql_lines(plain), "{sql}");
        assert!(
            note(by_person).is_some_and(|n| n.contains("partitioned by the privacy unit")),
            "{sql}: {by_person:#?}"
        );
        // And the same answers on all three.
        assert_eq!(answers[1][q], answers[0][q], "{sql}");
        assert_eq!(answers[2][q], answers[0][q], "{sql}");
    }
    for db in databases {
        db.drop_db().await;
    }
}

/// `policy` with `column` of `table` declared unique (`unique_keys`).
fn declare_unique(policy: &mut Policy, table: &str, column: &str) {
    let Some(pgdp::policy::TableKind::Private(private)) =
        policy.tables.get_mut(table).map(|t| &mut t.kind)
    else {
        panic!("{table} is a private table of the policy");
    };
    private.unique_keys.push(column.into());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declared_unique_keys_answer_on_the_coordinator_as_on_one_server() {
    let shards = deployment().await;
    let source = harness::demo_database(1).await;
    let start = |policy: Policy, upstream: String, ledger: String| {
        server::start_with(
            Config {
                policy,
                upstream,
                ledger: Some(ledger),
                listen: "127.0.0.1:0".into(),
                noise_seed: Some([31; 32]),
            },
            Options::default(),
        )
    };
    let mut declared = policy();
    declare_unique(&mut declared, "demo.visits", "visit_id");
    declare_unique(&mut declared, "demo.people", "person_id");
    let prescriptions =
        "SELECT drug, COUNT(*), SUM(quantity) FROM demo.prescriptions GROUP BY drug";
    let join = QUERIES
        .iter()
        .find(|q| q.contains("JOIN demo.people"))
        .expect("the people-visits join");

    // Without the declaration the coordinator cannot say visit_id is unique: refused.
    let ledger = harness::fresh_database("shard_ledger").await;
    let running = pgdp(shards.dsn(), &ledger).await;
    let session = open(&running).await;
    let refused = session
        .simple_rows(prescriptions)
        .await
        .expect_err("refused without a unique visit_id");
    assert_eq!(
        code(&refused),
        &SqlState::INSUFFICIENT_PRIVILEGE,
        "{refused:?}"
    );
    let hint = refused
        .as_db_error()
        .and_then(|e| e.hint())
        .unwrap_or_default()
        .to_string();
    assert!(hint.contains("unique_keys"), "{hint}");
    let general = explain(&session, join).await;
    assert!(
        !general.iter().any(|l| l.starts_with("groups per unit: 1")),
        "{general:#?}"
    );
    drop((session, running));
    ledger.drop_db().await;

    // With it, the coordinator answers as one server (whose catalog has the primary keys).
    let mut answers = Vec::new();
    let mut explained = Vec::new();
    for (policy, upstream) in [
        (policy(), source.dsn().to_string()),
        (declared.clone(), shards.dsn()),
    ] {
        let ledger = harness::fresh_database("shard_ledger").await;
        let running = start(policy, upstream, ledger.dsn().to_string())
            .await
            .expect("pgdp starts");
        let session = open(&running).await;
        let mut answered = Vec::new();
        for sql in [prescriptions, join] {
            let mut rows = session
                .simple_rows(sql)
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}"));
            rows.sort();
            answered.push(rows);
        }
        answers.push(answered);
        explained.push(explain(&session, join).await);
        drop((session, running));
        ledger.drop_db().await;
    }
    assert_eq!(answers[1], answers[0]);
    assert_eq!(answers[0][0].len(), 12, "{:?}", answers[0][0]);
    for lines in &explained {
        assert!(
            lines.iter().any(|l| l.starts_with("groups per unit: 1")),
            "{lines:#?}"
        );
    }

    // A declared key that holds a value twice: pgdp does not start with it...
    let mut false_key = declared.clone();
    declare_unique(&mut false_key, "demo.visits", "clinic");
    let ledger = harness::fresh_database("shard_ledger").await;
    match start(false_key.clone(), shards.dsn(), ledger.dsn().to_string()).await {
        Err(e) => {
            let message = e.to_string();
            assert!(message.contains("demo.visits.clinic"), "{message}");
            assert!(!message.contains("visit_id"), "{message}");
        }
        Ok(_) => panic!("pgdp started with a false unique key"),
    }
    // ... nor takes it at reload, and keeps serving under the policy in force.
    let running = start(declared, shards.dsn(), ledger.dsn().to_string())
        .await
        .expect("pgdp starts");
    let refused = running
        .reload(false_key)
        .await
        .expect_err("the reload is refused");
    assert!(
        refused.to_string().contains("demo.visits.clinic"),
        "{refused}"
    );
    let session = open(&running).await;
    session
        .simple_rows(prescriptions)
        .await
        .expect("answered under the policy in force");
    drop((session, running));
    ledger.drop_db().await;
}
