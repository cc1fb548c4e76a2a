//! Citus, where it is installed (`bash .ci/setup-citus <citus-source-dir>`): a coordinator and
//! two workers, throwaway clusters started from the installed binaries with the extension
//! preloaded ([`pgdp::tools::citus`]), `demo.people` and `demo.visits` distributed by
//! `person_id` and co-located, `demo.regions` a reference table, `demo.prescriptions` a local
//! table of the coordinator, the data copied from the demo dataset (scale 1) of the test
//! upstream ("one server").
//!
//! - [`citus_gives_the_answers_of_one_server`]: two pgdp with the same secret and noise seed,
//!   one over one server and one over the Citus coordinator, release the same noisy rows and
//!   spend the same budget for docs/queries.md-style statements (counts, sums, averages,
//!   partition selection, distinct counts, a median, the people–visits join, the public-table
//!   join); `demo.prescriptions`, whose unit path key `visits.visit_id` Citus cannot declare
//!   unique, is refused without the policy's `unique_keys` and answered as on one server with it.
//! - [`the_coordinator_runs_the_per_unit_stage_in_the_worker_tasks`]: the statement pgdp sends
//!   (its EXPLAIN's upstream SQL with the secret's seed put back), planned by the coordinator:
//!   a Citus distributed plan over all 32 shards whose tasks group by `person_id` for counts,
//!   sums and the join (the unique-unit form over `demo.people` has no per-unit stage, and
//!   nothing is pulled either); a distinct count and a median, in pgdp's distributed shape
//!   (`rewrite::distributed`), have their value stages planned as distributed subplans whose
//!   tasks group each shard's rows too (no task sends a shard's rows ungrouped: before that
//!   shape, every row of stage 1 was pulled to the coordinator); and for every statement pgdp's
//!   EXPLAIN line (`upstream: Citus: …`) claims a distributed subplan exactly where the
//!   coordinator plans one, rows pulled exactly where a task sends them ungrouped, and the
//!   per-unit stage in the workers' tasks elsewhere.
//! - [`the_distributed_shape_gives_the_rows_of_one_server`]: the statement pgdp sends to Citus
//!   (its EXPLAIN's upstream SQL) gives the pre-noise rows of pgdp's statement on one server,
//!   distinct counts and a median over demo.prescriptions (a local table: single-server shape)
//!   included.
//! - [`the_contribution_histograms_run_in_the_worker_tasks`]: the histograms that choose a
//!   query's caps, in the shape pgdp sends them, pull no per-unit rows to the coordinator and
//!   count what they count on one server.
//!
//! Where Citus is not installed (CI cannot fetch its source) each test says on standard error
//! that the Citus suite was skipped, and passes. The deployment is built once per test process
//! and shared under a lock.

use tokio::sync::{Mutex, MutexGuard, OnceCell};
use tokio_postgres::error::SqlState;

use pgdp::dp::analyze::{self, Context};
use pgdp::dp::{release, rewrite};
use pgdp::policy::{Policy, TableKind};
use pgdp::server::{self, Config, Options, Running};
use pgdp::session::classify::{self, Statement};
use pgdp::tools::citus::{Citus, CitusError, SHARD_COUNT};
use pgdp::upstream::Placement;

use crate::harness;
use crate::support::{
    code, policy_with_budget, Session, ANALYST, DATABASE as POLICY_DATABASE, PASSWORD,
};

/// Workers of the deployment.
const WORKERS: usize = 2;

/// The group-choice secret of every pgdp here: the same choice on both upstreams.
const SECRET: &str = "citus-tests-group-choice-secret";

/// Statements of docs/queries.md's kinds, answered on both upstreams.
const QUERIES: &[&str] = &[
    "SELECT COUNT(*) FROM demo.visits",
    "SELECT diagnosis, COUNT(*) FROM demo.visits GROUP BY diagnosis",
    "SELECT sex, AVG(income) FROM demo.people GROUP BY sex",
    "SELECT region, SUM(cost) FROM demo.visits v JOIN demo.people p USING (person_id) GROUP BY region",
    "SELECT r.name, COUNT(*) FROM demo.people p JOIN demo.regions r ON r.region = p.region GROUP BY r.name",
    "SELECT COUNT(DISTINCT clinic) FROM demo.visits",
    "SELECT MEDIAN(cost) FROM demo.visits",
    "SELECT clinic, COUNT(DISTINCT person_id) FROM demo.visits WHERE cost > 100 GROUP BY clinic",
    "SELECT drug, COUNT(*), SUM(quantity) FROM demo.prescriptions GROUP BY drug",
];

static DEPLOYMENT: OnceCell<Option<Mutex<Citus>>> = OnceCell::const_new();

/// The shared deployment, locked for the caller's test; `None` (said on standard error) where
/// Citus is not installed.
async fn deployment(test: &str) -> Option<MutexGuard<'static, Citus>> {
    let citus = DEPLOYMENT
        .get_or_init(|| async {
            let source = harness::demo_database(1).await;
            let client = harness::connect(source.dsn()).await;
            match Citus::start_demo(&client, WORKERS).await {
                Ok(citus) => {
                    citus
                        .stop_when_process_exits()
                        .unwrap_or_else(|e| panic!("cannot arrange Citus' clean-up: {e}"));
                    Some(Mutex::new(citus))
                }
                Err(CitusError::NotInstalled(why)) => {
                    eprintln!("citus: the Citus suite is skipped: Citus is not installed ({why}); build it with `bash .ci/setup-citus <citus-source-dir>`");
                    None
                }
                Err(e) => panic!("the Citus deployment: {e}"),
            }
        })
        .await;
    match citus {
        Some(citus) => Some(citus.lock().await),
        None => {
            eprintln!("citus: {test}: skipped (Citus is not installed)");
            None
        }
    }
}

/// The demo policy with this file's secret, `demo.visits.visit_id` declared unique if `declare`.
fn policy(declare: bool) -> Policy {
    let mut policy = policy_with_budget(1000, 2);
    policy.secret = Some(SECRET.into());
    if declare {
        let Some(TableKind::Private(visits)) =
            policy.tables.get_mut("demo.visits").map(|t| &mut t.kind)
        else {
            panic!("demo.visits is a private table of the demo policy");
        };
        visits.unique_keys.push("visit_id".into());
    }
    policy
}

/// pgdp over `upstream` with `policy`, a noise seed and a fresh ledger.
async fn pgdp(policy: Policy, upstream: String, ledger: &harness::TestDb) -> Running {
    server::start_with(
        Config {
            policy,
            upstream,
            ledger: Some(ledger.dsn().to_string()),
            listen: "127.0.0.1:0".into(),
            noise_seed: Some([37; 32]),
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

/// The rows of `sql` through `session`, sorted.
async fn sorted(session: &Session, sql: &str) -> Vec<Vec<Option<String>>> {
    let mut rows = session
        .simple_rows(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    rows.sort();
    rows
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn citus_gives_the_answers_of_one_server() {
    let Some(citus) = deployment("citus_gives_the_answers_of_one_server").await else {
        return;
    };
    let single = harness::demo_database(1).await;

    // Without the declaration, Citus' catalog cannot say visit_id is unique: refused.
    let ledger = harness::fresh_database("citus_ledger").await;
    let running = pgdp(policy(false), citus.dsn(), &ledger).await;
    let session = open(&running).await;
    let prescriptions = QUERIES[QUERIES.len() - 1];
    let refused = session
        .simple_rows(prescriptions)
        .await
        .expect_err("refused without a unique visit_id");
    assert_eq!(
        code(&refused),
        &SqlState::INSUFFICIENT_PRIVILEGE,
        "{refused:?}"
    );
    drop((session, running));
    ledger.drop_db().await;

    let mut answers = Vec::new();
    let mut budgets = Vec::new();
    for (declare, upstream) in [(false, single.dsn().to_string()), (true, citus.dsn())] {
        let ledger = harness::fresh_database("citus_ledger").await;
        let running = pgdp(policy(declare), upstream, &ledger).await;
        let session = open(&running).await;
        let mut answered = Vec::new();
        for sql in QUERIES {
            answered.push(sorted(&session, sql).await);
        }
        answers.push(answered);
        budgets.push(session.budget().await);
        drop((session, running));
        ledger.drop_db().await;
    }
    for (q, sql) in QUERIES.iter().enumerate() {
        assert!(!answers[0][q].is_empty(), "{sql}");
        assert_eq!(answers[1][q], answers[0][q], "{sql}");
    }
    assert_eq!(budgets[0], budgets[1]);
}

/// The lines of pgdp's EXPLAIN of `sql`.
async fn explain(session: &Session, sql: &str) -> Vec<String> {
    session
        .simple_rows(&format!("EXPLAIN {sql}"))
        .await
        .unwrap_or_else(|e| panic!("EXPLAIN {sql}: {e}"))
        .into_iter()
        .filter_map(|row| row.into_iter().next().flatten())
        .collect()
}

/// pgdp's upstream SQL for `sql` as its EXPLAIN shows it, with the secret's seed put back.
async fn upstream_sql(session: &Session, sql: &str) -> String {
    let lines = explain(session, sql).await;
    let start = lines
        .iter()
        .position(|l| l == "upstream SQL:")
        .unwrap_or_else(|| panic!("{sql}: no upstream SQL in {lines:#?}"));
    lines[start + 1..]
        .iter()
        .map(|l| l.trim())
        .collect::<Vec<_>>()
        .join(" ")
        .replace("<secret>", &rewrite::ranking_seed(SECRET).to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_coordinator_runs_the_per_unit_stage_in_the_worker_tasks() {
    let Some(citus) =
        deployment("the_coordinator_runs_the_per_unit_stage_in_the_worker_tasks").await
    else {
        return;
    };
    let ledger = harness::fresh_database("citus_ledger").await;
    let running = pgdp(policy(true), citus.dsn(), &ledger).await;
    let session = open(&running).await;
    let coordinator = harness::connect(&citus.dsn()).await;
    let plan = |sql: String| {
        let coordinator = &coordinator;
        async move {
            coordinator
                .simple_query(&format!("EXPLAIN (VERBOSE, COSTS OFF) {sql}"))
                .await
                .unwrap_or_else(|e| panic!("EXPLAIN on the coordinator: {e}\n{sql}"))
                .into_iter()
                .filter_map(|m| match m {
                    tokio_postgres::SimpleQueryMessage::Row(row) => row.get(0).map(str::to_string),
                    _ => None,
                })
                .collect::<Vec<String>>()
        }
    };
    let tasks = format!("Task Count: {SHARD_COUNT}");
    // demo.people has one row per person (its primary key): pgdp's unique-unit form has no
    // per-unit stage, and its plan is the same distributed aggregate without one.
    for (sql, per_unit_stage) in [(QUERIES[1], true), (QUERIES[2], false), (QUERIES[3], true)] {
        let lines = plan(upstream_sql(&session, sql).await).await;
        let text = lines.join("\n");
        assert!(
            text.contains("Custom Scan (Citus Adaptive)"),
            "{sql}\n{text}"
        );
        assert!(text.contains(&tasks), "{sql}: every shard\n{text}");
        assert!(
            !text.contains("Distributed Subplan"),
            "{sql}: nothing pulled to the coordinator\n{text}"
        );
        assert_eq!(
            lines
                .iter()
                .any(|l| l.contains("Group Key:") && l.contains("person_id")),
            per_unit_stage,
            "{sql}: the tasks group by the unit\n{text}"
        );
    }
    // A distinct count of another column and the median (pgdp's distributed shape): their
    // value stages are distributed subplans whose tasks group the shards' rows, as stage 4's.
    for sql in [QUERIES[5], QUERIES[6]] {
        let lines = plan(upstream_sql(&session, sql).await).await;
        let text = lines.join("\n");
        assert!(text.contains("Distributed Subplan"), "{sql}\n{text}");
        assert!(text.contains(&tasks), "{sql}: every shard\n{text}");
        assert!(
            !pulls_rows(&lines),
            "{sql}: no task sends a shard's rows ungrouped\n{text}"
        );
    }
    // pgdp's EXPLAIN says where the per-unit stage runs, and the coordinator agrees: a claim of
    // a distributed subplan exactly where the coordinator plans one, and of rows pulled to the
    // coordinator exactly where a task sends a shard's rows ungrouped.
    let mut claimed = Vec::new();
    for sql in QUERIES {
        let lines = explain(&session, sql).await;
        let claim = lines
            .iter()
            .find(|l| l.starts_with("upstream: Citus: "))
            .unwrap_or_else(|| panic!("{sql}: no Citus line in {lines:#?}"))
            .clone();
        let lines = plan(upstream_sql(&session, sql).await).await;
        let text = lines.join("\n");
        let subplan = claim.contains("distributed subplan");
        assert_eq!(
            subplan,
            text.contains("Distributed Subplan"),
            "{sql}: pgdp says {claim:?}; the coordinator plans\n{text}"
        );
        assert_eq!(
            claim.contains("pulls every row"),
            pulls_rows(&lines),
            "{sql}: pgdp says {claim:?}; the coordinator plans\n{text}"
        );
        if !claim.contains("pulls every row") && !claim.contains("local table") {
            assert!(
                claim.contains("runs in the workers' tasks"),
                "{sql}: {claim}"
            );
        }
        claimed.push(subplan);
    }
    // A distinct count of another column and the median have value stages (distributed
    // subplans computed in the tasks); the prescriptions are a local table of the coordinator,
    // sent to the workers. Nothing pulls a shard's rows.
    assert_eq!(
        claimed,
        [false, false, false, false, false, true, true, false, true],
        "{QUERIES:#?}"
    );
    drop((session, running));
    ledger.drop_db().await;
}

/// The contribution histograms that choose a query's caps (`pgdp.choose_bounds`, the demo
/// policy's default) of `sql` under `policy`: the single-server statement, in the shape pgdp
/// sends to Citus; `None` when the query chooses no cap.
fn histogram(policy: &Policy, sql: &str) -> Option<String> {
    let statements = classify::classify(sql).unwrap_or_else(|e| panic!("{sql}: {e}"));
    let [Statement::Query(query)] = statements.as_slice() else {
        panic!("{sql}: not one query");
    };
    let ctx = Context {
        policy,
        search_path: vec!["demo".into()],
    };
    let plan = analyze::analyze(query, &ctx).unwrap_or_else(|e| panic!("{sql}: {e}"));
    let single = rewrite::rewrite(&plan, &[], SECRET).unwrap_or_else(|e| panic!("{sql}: {e}"));
    let budget = release::Budget {
        epsilon: 1.0,
        delta: 1e-7,
        mechanism: pgdp::policy::Mechanism::Laplace,
    };
    let mechanisms =
        release::mechanisms(&plan, &single, budget).unwrap_or_else(|e| panic!("{sql}: {e}"));
    let choice = release::bounds::ChoicePlan::new(&plan, &single, &mechanisms, &[], SECRET, None)
        .unwrap_or_else(|e| panic!("{sql}: {e}"))?;
    let shaped = placement(sql)
        .shape(&plan, policy)
        .apply_to_histogram(choice.sql, policy)
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    Some(shaped.to_string())
}

/// The placement pgdp gives `sql` on this deployment: demo.people and demo.visits distributed by
/// the unit, demo.regions a reference table, demo.prescriptions a local table.
fn placement(sql: &str) -> Placement {
    Placement::Distributed {
        tables: vec!["demo.people".into(), "demo.visits".into()],
        local: sql
            .contains("demo.prescriptions")
            .then(|| "demo.prescriptions".to_string()),
    }
}

/// The rows of `sql` on `client`, as text, sorted; a quantile's histogram (`bucket:count,…`,
/// aggregated in no particular order) with its entries sorted.
async fn text_rows(client: &tokio_postgres::Client, sql: &str) -> Vec<Vec<Option<String>>> {
    let value = |t: &str| -> String {
        if t.contains(':') {
            let mut parts: Vec<&str> = t.split(',').collect();
            parts.sort_unstable();
            parts.join(",")
        } else {
            t.to_string()
        }
    };
    let mut rows: Vec<Vec<Option<String>>> = client
        .simple_query(sql)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{sql}"))
        .into_iter()
        .filter_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => {
                Some((0..r.len()).map(|i| r.get(i).map(value)).collect())
            }
            _ => None,
        })
        .collect();
    rows.sort();
    rows
}

/// The statement pgdp sends to Citus (its EXPLAIN's upstream SQL) gives one server's rows, for
/// every statement of this file and distinct counts and quantiles over demo.prescriptions, a
/// local table of the coordinator joined to demo.visits through its unit path. Sent in the
/// distributed shape (a `NOT MATERIALIZED` stage 1) such a count was 0: Citus 13.2 planned the
/// local table with the counted column as NULL; pgdp sends statements that read a local table in
/// the single-server shape.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_distributed_shape_gives_the_rows_of_one_server() {
    let Some(citus) = deployment("the_distributed_shape_gives_the_rows_of_one_server").await else {
        return;
    };
    let single = harness::demo_database(1).await;
    let on_single = harness::connect(single.dsn()).await;
    let coordinator = harness::connect(&citus.dsn()).await;
    let ledgers = [
        harness::fresh_database("citus_ledger").await,
        harness::fresh_database("citus_ledger").await,
    ];
    let running = pgdp(policy(true), citus.dsn(), &ledgers[0]).await;
    let session = open(&running).await;
    let over_single = pgdp(policy(true), single.dsn().to_string(), &ledgers[1]).await;
    let one_server = open(&over_single).await;
    let more = [
        "SELECT COUNT(DISTINCT drug) FROM demo.prescriptions",
        "SELECT drug, MEDIAN(quantity), SUM(quantity) FROM demo.prescriptions GROUP BY drug",
        "SELECT r.name, COUNT(DISTINCT v.diagnosis) FROM demo.visits v JOIN demo.people p USING (person_id) JOIN demo.regions r ON r.region = p.region GROUP BY r.name",
    ];
    for sql in QUERIES.iter().chain(more.iter()) {
        let sent = upstream_sql(&session, sql).await;
        let value_stages = sql.contains("MEDIAN")
            || (sql.contains("DISTINCT") && !sql.contains("DISTINCT person_id"));
        assert_eq!(
            sent.contains("NOT MATERIALIZED"),
            value_stages && !sql.contains("prescriptions"),
            "{sql}: {sent}"
        );
        let expected = text_rows(&on_single, &upstream_sql(&one_server, sql).await).await;
        assert!(!expected.is_empty(), "{sql}");
        assert_eq!(
            text_rows(&coordinator, &sent).await,
            expected,
            "{sql}\n{sent}"
        );
    }
    drop((session, running, one_server, over_single));
    for ledger in ledgers {
        ledger.drop_db().await;
    }
}

/// The histograms that choose a query's caps (run before its answer with `pgdp.choose_bounds`
/// on, the demo policy's default) are sent to Citus as pgdp sends them: the coordinator plans
/// them without pulling any shard's rows ungrouped, and they count what they count on one server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_contribution_histograms_run_in_the_worker_tasks() {
    let Some(citus) = deployment("the_contribution_histograms_run_in_the_worker_tasks").await
    else {
        return;
    };
    let single = harness::demo_database(1).await;
    let on_single = harness::connect(single.dsn()).await;
    let coordinator = harness::connect(&citus.dsn()).await;
    let policy = policy(true);
    let mut checked = 0;
    for sql in QUERIES {
        let Some(histogram) = histogram(&policy, sql) else {
            continue;
        };
        let lines: Vec<String> = coordinator
            .simple_query(&format!("EXPLAIN (VERBOSE, COSTS OFF) {histogram}"))
            .await
            .unwrap_or_else(|e| panic!("EXPLAIN on the coordinator: {e}\n{histogram}"))
            .into_iter()
            .filter_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(row) => row.get(0).map(str::to_string),
                _ => None,
            })
            .collect();
        let text = lines.join("\n");
        eprintln!("citus: histogram of {sql}:\n{histogram}\n{text}");
        assert!(
            text.contains("Custom Scan (Citus Adaptive)"),
            "{sql}\n{text}"
        );
        if !sql.contains("prescriptions") {
            assert!(
                !pulls_rows(&lines),
                "{sql}: a task sends a shard's rows ungrouped\n{text}"
            );
            // What crosses to the coordinator is each histogram's buckets, never per-unit rows
            // (an intermediate result with the unit, as the single-server shape pulled).
            assert!(
                !lines
                    .iter()
                    .any(|l| l.contains("Output: intermediate_result") && l.contains("__dp_unit")),
                "{sql}: per-unit rows pulled to the coordinator\n{text}"
            );
        }
        assert_eq!(
            text_rows(&coordinator, &histogram).await,
            text_rows(&on_single, &histogram).await,
            "{sql}"
        );
        checked += 1;
    }
    assert!(checked >= 4, "histograms checked: {checked}");
}

/// Whether a Citus task of the coordinator's plan `lines` sends a shard's rows (a table named
/// `<table>_<shard id>`) to the coordinator without grouping them: its query has no GROUP BY
/// and no aggregate.
fn pulls_rows(lines: &[String]) -> bool {
    lines
        .iter()
        .filter_map(|l| l.trim().strip_prefix("Query: "))
        .filter(|q| {
            q.split(|c: char| c.is_whitespace() || c == '(' || c == ')')
                .any(|word| {
                    word.strip_prefix("demo.").is_some_and(|t| {
                        t.rsplit_once('_').is_some_and(|(_, id)| {
                            !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit())
                        })
                    })
                })
        })
        .any(|q| !q.contains(" GROUP BY ") && !q.contains("count(") && !q.contains("sum("))
}
