//! `cargo bench --bench shards [-- --scale N] [-- --shards 1,2,4] [-- --runs R] [-- --citus]
//! [-- --only TEXT]`: pgdp over a PostgreSQL sharded by privacy unit (a coordinator with
//! `postgres_fdw` shards, all throwaway clusters on this machine, [`pgdp::tools::shards`])
//! against pgdp over one server holding the same demo data (the server of
//! `PGDP_BENCH_UPSTREAM`, else 127.0.0.1:5432). Both pgdp run the demo policy with the keys
//! docs/scale-out.md tells an operator to declare (`unique_keys`: `demo.people.person_id`,
//! `demo.visits.visit_id`), which the coordinator's partitioned tables cannot hold, so that
//! both plan every query in the same form ([`UNIQUE_KEYS`]).
//!
//! For each number of shards and each query it reports, measured in the same run:
//! - **rows moved**: the rows the coordinator's foreign scans received from the shards, from
//!   `EXPLAIN (ANALYZE, VERBOSE)` of the SQL pgdp sends (read from the sharded pgdp's own EXPLAIN,
//!   the seed put back: the partitionwise shape, run with pgdp's `SET LOCAL`s), beside the rows
//!   they receive for the SQL the one-server pgdp sends, run without them (every row the query
//!   reads), and the rows of the tables read;
//! - **latency**: the median over R runs of the whole query through pgdp over the coordinator,
//!   over the median through pgdp over one server, the two interleaved.
//!
//! It writes the table between `<!-- shards:begin -->` and `<!-- shards:end -->` in
//! BENCHMARKS.md (in the current directory) and prints it. With `--only TEXT` it measures only
//! the queries whose label contains TEXT and prints their table without writing it.
//!
//! With `--citus` it measures Citus instead ([`pgdp::tools::citus`]: a coordinator and
//! [`CITUS_WORKERS`] workers, throwaway clusters on this machine, `demo.people` and
//! `demo.visits` distributed by `person_id` and co-located), for the queries above and the
//! shapes Citus runs as a distributed subplan or keeps in the tasks ([`CITUS_QUERIES`]):
//! - **rows moved**: the rows the coordinator received from the workers for the SQL pgdp sends
//!   (read from pgdp's own EXPLAIN, the seed put back), from the coordinator's `EXPLAIN
//!   (ANALYZE, VERBOSE, FORMAT JSON)`: the actual rows of every `Citus Adaptive` scan, those of
//!   the distributed subplans (pulled to the coordinator before the main statement) among them,
//!   and what pgdp's EXPLAIN says about where the per-unit stage runs (scans whose tasks all ran
//!   on the coordinator, over a subplan's result written there, are not counted);
//! - **latency**: as above, pgdp over the coordinator against pgdp over one server, both with
//!   `SET pgdp.choose_bounds = off` ([`CAPS_FIXED`]), so that the statement timed is the one
//!   whose rows moved are read.
//!
//! It writes that table between `<!-- citus:begin -->` and `<!-- citus:end -->`. Where Citus is
//! not installed it fails, saying how to build it (`.ci/setup-citus`).

#[path = "../common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::{
    connect, demo_database, explain_lines, explained_upstream_sql, fail, machine, proxy_dsn,
    simple_rows, Res,
};
use pgdp::dp::rewrite;
use pgdp::policy::Policy;
use pgdp::server::{self, Config, Running};
use pgdp::tools::citus::{Citus, CitusError};
use pgdp::tools::shards::Shards;
use tokio_postgres::Client;

const SECRET: &str = "shard-bench-group-choice-secret";

/// The keys docs/scale-out.md ("Declaring the keys the coordinator cannot hold") tells an
/// operator to declare: without them the coordinator cannot know that `demo.people` has one row
/// per person, and the people–visits join keeps its groups per person (another statement than
/// one server's, whose catalog has the primary key).
const UNIQUE_KEYS: [(&str, &str); 2] = [("demo.people", "person_id"), ("demo.visits", "visit_id")];

/// The queries: (label, SQL, the rows of the tables it reads).
const QUERIES: [(&str, &str, &str); 6] = [
    (
        "count visits",
        "SELECT COUNT(*) FROM demo.visits",
        "demo.visits",
    ),
    (
        "visits by diagnosis (partition selection)",
        "SELECT diagnosis, COUNT(*), SUM(cost) FROM demo.visits GROUP BY diagnosis",
        "demo.visits",
    ),
    (
        "income by region (public keys)",
        "SELECT region, COUNT(*), AVG(income) FROM demo.people GROUP BY region",
        "demo.people",
    ),
    (
        "distinct diagnoses",
        "SELECT COUNT(DISTINCT diagnosis) FROM demo.visits",
        "demo.visits",
    ),
    (
        "visits by education (join on the unit)",
        "SELECT p.education, COUNT(*) FROM demo.visits v JOIN demo.people p ON p.person_id = v.person_id GROUP BY p.education",
        "demo.visits, demo.people",
    ),
    (
        "visits by month (date_trunc)",
        "SELECT date_trunc('month', visit_date) AS m, COUNT(*) FROM demo.visits GROUP BY 1",
        "demo.visits",
    ),
];

/// With `--citus`, besides [`QUERIES`]: the shapes whose per-unit rows Citus pulls to the
/// coordinator (a quantile; the distinct count is in [`QUERIES`]) and a join with a reference
/// table.
const CITUS_QUERIES: [(&str, &str, &str); 2] = [
    (
        "median cost (quantile)",
        "SELECT MEDIAN(cost) FROM demo.visits",
        "demo.visits",
    ),
    (
        "people by region name (reference-table join)",
        "SELECT r.name, COUNT(*) FROM demo.people p JOIN demo.regions r ON r.region = p.region GROUP BY r.name",
        "demo.people, demo.regions",
    ),
];

/// Sent to both pgdp in the Citus variant: the tables' caps, so that the statement timed is the
/// one EXPLAIN shows and whose rows moved are read (with `pgdp.choose_bounds` on, the demo
/// policy's default, a query first runs its DP histograms of rows per unit).
const CAPS_FIXED: &str = "SET pgdp.choose_bounds = off";

/// Workers of the Citus deployment.
const CITUS_WORKERS: usize = 2;

const PARTITIONWISE: &str =
    "SET LOCAL enable_partitionwise_aggregate = on; SET LOCAL enable_partitionwise_join = on;";

const BEGIN: &str =
    "<!-- shards:begin (generated by benches/shards/main.rs; edits inside are overwritten) -->";
const END: &str = "<!-- shards:end -->";

const CITUS_BEGIN: &str =
    "<!-- citus:begin (generated by benches/shards/main.rs --citus; edits inside are overwritten) -->";
const CITUS_END: &str = "<!-- citus:end -->";

struct Settings {
    admin_dsn: String,
    scale: u32,
    shards: Vec<usize>,
    runs: usize,
    /// Measure Citus (a coordinator and [`CITUS_WORKERS`] workers) instead of `postgres_fdw`.
    citus: bool,
    /// Only the queries whose label contains this (the table is then printed, not written).
    only: Option<String>,
}

impl Settings {
    fn measures(&self, label: &str) -> bool {
        self.only.as_deref().is_none_or(|text| label.contains(text))
    }
}

fn parse_args() -> Res<Settings> {
    let mut s = Settings {
        admin_dsn: std::env::var("PGDP_BENCH_UPSTREAM")
            .unwrap_or_else(|_| common::DEFAULT_ADMIN_DSN.to_string()),
        scale: 1,
        shards: vec![1, 2, 4],
        runs: 7,
        citus: false,
        only: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || {
            args.next()
                .ok_or_else(|| fail(format!("{arg} needs a value")))
        };
        match arg.as_str() {
            "--scale" => s.scale = value()?.parse()?,
            "--runs" => s.runs = value()?.parse()?,
            "--citus" => s.citus = true,
            "--only" => s.only = Some(value()?),
            "--shards" => {
                s.shards = value()?
                    .split(',')
                    .map(|n| n.trim().parse())
                    .collect::<Result<_, _>>()?
            }
            // cargo bench passes --bench to every bench target.
            "--bench" => {}
            other => return Err(fail(format!("unknown argument {other}"))),
        }
    }
    if s.runs == 0 {
        return Err(fail("--runs must be at least 1"));
    }
    Ok(s)
}

fn main() {
    common::run_and_exit("shards bench", async {
        let s = parse_args()?;
        bench(&s).await
    });
}

fn policy() -> Res<Policy> {
    let mut policy = pgdp::policy::parse(&common::budget_policy_text()?)
        .map_err(|e| fail(format!("bench policy: {e:?}")))?;
    policy.secret = Some(SECRET.into());
    for (table, column) in UNIQUE_KEYS {
        match policy.tables.get_mut(table).map(|t| &mut t.kind) {
            Some(pgdp::policy::TableKind::Private(private)) => {
                private.unique_keys.push(column.into())
            }
            _ => {
                return Err(fail(format!(
                    "{table} is not a private table of the policy"
                )))
            }
        }
    }
    Ok(policy)
}

/// The SQL pgdp behind `client` sends upstream for `sql`: its EXPLAIN's upstream SQL with the
/// ranking seed put back (as `tests/integration/citus.rs` reads it), and EXPLAIN's lines.
async fn sent_sql(client: &Client, sql: &str) -> Res<(String, Vec<String>)> {
    let lines = explain_lines(client, sql).await?;
    let sent = explained_upstream_sql(sql, &lines)?
        .replace("<secret>", &rewrite::ranking_seed(SECRET).to_string());
    Ok((sent, lines))
}

/// `EXPLAIN (ANALYZE, VERBOSE, FORMAT JSON)` of `sql` on `upstream`, in a read-only transaction
/// with `settings` first.
async fn explain_analyze(upstream: &Client, settings: &str, sql: &str) -> Res<serde_json::Value> {
    let text = simple_rows(
        upstream,
        &format!(
            "BEGIN READ ONLY; {settings} EXPLAIN (ANALYZE, VERBOSE, FORMAT JSON) {sql}; ROLLBACK"
        ),
    )
    .await?
    .into_iter()
    .next()
    .and_then(|r| r.into_iter().next().flatten())
    .ok_or_else(|| fail("EXPLAIN returned nothing"))?;
    Ok(serde_json::from_str(&text)?)
}

/// The rows the node received over all its loops.
fn actual_rows(node: &serde_json::Value) -> u64 {
    let rows = node["Actual Rows"].as_f64().unwrap_or(0.0);
    let loops = node["Actual Loops"].as_f64().unwrap_or(1.0);
    (rows * loops).round() as u64
}

/// The rows the foreign scans of `sql` received, from `EXPLAIN (ANALYZE, VERBOSE, FORMAT JSON)`
/// on the coordinator, with `settings` first.
async fn rows_moved(coordinator: &Client, settings: &str, sql: &str) -> Res<u64> {
    let json = explain_analyze(coordinator, settings, sql).await?;
    fn walk(node: &serde_json::Value) -> u64 {
        let own = if node["Node Type"] == "Foreign Scan" {
            actual_rows(node)
        } else {
            0
        };
        own + node["Plans"]
            .as_array()
            .map_or(0, |children| children.iter().map(walk).sum())
    }
    Ok(json
        .as_array()
        .and_then(|a| a.first())
        .map_or(0, |top| walk(&top["Plan"])))
}

/// What the Citus coordinator received from the workers for one statement.
#[derive(Default)]
struct Received {
    /// Actual rows of every `Citus Adaptive` scan with a task on a worker, the distributed
    /// subplans' included.
    rows: u64,
    /// Their "Tuple data received from nodes", summed (Citus prints it rounded, e.g. `12 MB`).
    bytes: u64,
    /// Distributed subplans: run first, their rows pulled to the coordinator.
    subplans: usize,
    /// The rows of the subplans' scans (part of `rows`).
    subplan_rows: u64,
    /// Where each subplan's result went ("Write locally", "Send to 2 nodes").
    destinations: Vec<String>,
}

/// A size as `pg_size_pretty` prints it (`123 bytes`, `12 kB`, `3 MB`), in bytes.
fn pretty_bytes(text: &str) -> u64 {
    let mut parts = text.split_whitespace();
    let number: u64 = parts.next().and_then(|n| n.parse().ok()).unwrap_or(0);
    let unit = match parts.next() {
        Some("kB") => 1 << 10,
        Some("MB") => 1 << 20,
        Some("GB") => 1 << 30,
        Some("TB") => 1 << 40,
        _ => 1,
    };
    number * unit
}

/// Whether every task of a `Citus Adaptive` scan ran on the coordinator itself (`Node:
/// host=… port=<its port> …`), as the tasks over a distributed subplan's result written there
/// do: their rows never left it. Citus lists all tasks when there is one.
fn on_coordinator_only(scan: &serde_json::Value, coordinator_port: u16) -> bool {
    let job = &scan["Distributed Query"]["Job"];
    let port = format!("port={coordinator_port}");
    match job["Tasks"].as_array() {
        Some(tasks) => {
            job["Task Count"].as_u64() == Some(tasks.len() as u64)
                && tasks.iter().all(|task| {
                    task["Node"]
                        .as_str()
                        .is_some_and(|node| node.split_whitespace().any(|p| p == port))
                })
        }
        None => false,
    }
}

/// What the coordinator received from the workers for `sql`, from its `EXPLAIN (ANALYZE,
/// VERBOSE, FORMAT JSON)`: Citus's scan node reports the rows it returned (those the tasks sent),
/// and each distributed subplan is a plan of its own under `Distributed Query` → `Subplans`. The
/// workers' own plans (`Tasks` → `Remote Plan`) are not read: they run on the workers. Scans whose
/// tasks all ran on the coordinator are not counted ([`on_coordinator_only`]).
async fn received_from_workers(
    coordinator: &Client,
    coordinator_port: u16,
    sql: &str,
) -> Res<Received> {
    let json = explain_analyze(coordinator, "", sql).await?;
    fn walk(value: &serde_json::Value, in_subplan: bool, port: u16, got: &mut Received) {
        match value {
            serde_json::Value::Array(items) => {
                for item in items {
                    walk(item, in_subplan, port, got);
                }
            }
            serde_json::Value::Object(fields) => {
                if value["Custom Plan Provider"] == "Citus Adaptive"
                    && !on_coordinator_only(value, port)
                {
                    let rows = actual_rows(value);
                    got.rows += rows;
                    if in_subplan {
                        got.subplan_rows += rows;
                    }
                    if let Some(size) =
                        value["Distributed Query"]["Job"]["Tuple data received from nodes"].as_str()
                    {
                        got.bytes += pretty_bytes(size);
                    }
                }
                if let Some(destination) = value["Result destination"].as_str() {
                    got.subplans += 1;
                    got.destinations.push(destination.to_string());
                }
                for (key, child) in fields {
                    match key.as_str() {
                        "Tasks" => {}
                        "Subplans" => walk(child, true, port, got),
                        _ => walk(child, in_subplan, port, got),
                    }
                }
            }
            _ => {}
        }
    }
    let mut got = Received::default();
    walk(&json, false, coordinator_port, &mut got);
    Ok(got)
}

async fn start(policy: &Policy, upstream: String, ledger: &str) -> Res<Running> {
    Ok(server::start(Config {
        policy: policy.clone(),
        upstream,
        ledger: Some(ledger.to_string()),
        listen: "127.0.0.1:0".into(),
        noise_seed: Some(common::NOISE_SEED),
    })
    .await?)
}

/// One run of `sql` through pgdp.
async fn timed(client: &Client, sql: &str) -> Res<Duration> {
    let started = Instant::now();
    let rows = simple_rows(client, sql).await?;
    let took = started.elapsed();
    if rows.is_empty() {
        return Err(fail(format!("{sql}: no rows")));
    }
    Ok(took)
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// The median latency (ms) of `sql` through pgdp over one server and through `other`, after one
/// warming run of each (caches, connections, the catalog lookups), the runs interleaved.
async fn interleaved(
    on_single: &Client,
    other: &Client,
    sql: &str,
    runs: usize,
) -> Res<(f64, f64)> {
    timed(on_single, sql).await?;
    timed(other, sql).await?;
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        a.push(timed(on_single, sql).await?.as_secs_f64() * 1e3);
        b.push(timed(other, sql).await?.as_secs_f64() * 1e3);
    }
    Ok((median(a), median(b)))
}

/// The rows of `tables` (`demo.a, demo.b`) on `source`, summed.
async fn table_rows(source: &Client, tables: &str) -> Res<u64> {
    let mut total = 0;
    for table in tables.split(", ") {
        let n = common::scalar(source, &format!("SELECT count(*) FROM {table}")).await?;
        total += n.parse::<u64>()?;
    }
    Ok(total)
}

struct Row {
    shards: usize,
    label: &'static str,
    tables: u64,
    moved: u64,
    moved_unpushed: u64,
    single_ms: f64,
    sharded_ms: f64,
}

async fn bench(s: &Settings) -> Res<()> {
    let admin = connect(&s.admin_dsn).await?;
    let machine = machine(&admin).await?;
    let source_dsn = demo_database(&s.admin_dsn, &admin, s.scale).await?;
    let source = connect(&source_dsn).await?;
    let ledger_name = format!("pgdp_bench_shards_ledger_{}", std::process::id());
    admin
        .batch_execute(&format!("CREATE DATABASE {ledger_name}"))
        .await?;
    let ledger = common::with_dbname(&s.admin_dsn, &ledger_name);
    let result = if s.citus {
        measure_citus(s, &source, &source_dsn, &ledger)
            .await
            .map(|measured| citus_report(s, &machine, &measured))
    } else {
        measure(s, &source, &source_dsn, &ledger)
            .await
            .map(|(rows, setups)| report(s, &machine, &rows, &setups))
    };
    admin
        .batch_execute(&format!(
            "DROP DATABASE IF EXISTS {ledger_name} WITH (FORCE)"
        ))
        .await?;
    let report = result?;
    print!("{report}");
    if s.only.is_some() {
        eprintln!("--only: BENCHMARKS.md left as it was");
        return Ok(());
    }
    let (begin, end) = if s.citus {
        (CITUS_BEGIN, CITUS_END)
    } else {
        (BEGIN, END)
    };
    write_report(std::path::Path::new("BENCHMARKS.md"), begin, end, &report)?;
    eprintln!("wrote BENCHMARKS.md");
    Ok(())
}

type Measured = (Vec<Row>, Vec<(usize, f64)>);

async fn measure(s: &Settings, source: &Client, source_dsn: &str, ledger: &str) -> Res<Measured> {
    let policy = policy()?;
    let single = start(&policy, source_dsn.to_string(), ledger).await?;
    let on_single = connect(&proxy_dsn(single.addr.port())).await?;
    let mut table_counts = Vec::new();
    for (_, _, tables) in QUERIES {
        table_counts.push(table_rows(source, tables).await?);
    }
    let mut rows = Vec::new();
    let mut setups = Vec::new();
    for &n in &s.shards {
        eprintln!("{n} shard(s): starting and copying scale {}…", s.scale);
        let started = Instant::now();
        let shards = Shards::start_demo(source, n).await?;
        setups.push((n, started.elapsed().as_secs_f64()));
        let coordinator = connect(&shards.dsn()).await?;
        let sharded = start(&policy, shards.dsn(), ledger).await?;
        let on_shards = connect(&proxy_dsn(sharded.addr.port())).await?;
        for (q, (label, sql, _)) in QUERIES.iter().enumerate() {
            if !s.measures(label) {
                continue;
            }
            let (one, _) = sent_sql(&on_single, sql).await?;
            let (partitionwise, _) = sent_sql(&on_shards, sql).await?;
            let moved = rows_moved(&coordinator, PARTITIONWISE, &partitionwise).await?;
            let moved_unpushed = rows_moved(&coordinator, "", &one).await?;
            let (single_ms, sharded_ms) = interleaved(&on_single, &on_shards, sql, s.runs).await?;
            let row = Row {
                shards: n,
                label,
                tables: table_counts[q],
                moved,
                moved_unpushed,
                single_ms,
                sharded_ms,
            };
            eprintln!(
                "  {label}: moved {} (unpushed {}), {:.1} ms vs {:.1} ms on one server",
                row.moved, row.moved_unpushed, row.sharded_ms, row.single_ms
            );
            rows.push(row);
        }
        drop((on_shards, sharded, coordinator, shards));
    }
    Ok((rows, setups))
}

/// One query's figures on Citus.
struct CitusRow {
    label: &'static str,
    tables: u64,
    received: Received,
    /// Where pgdp's EXPLAIN says the per-unit stage runs.
    claim: &'static str,
    single_ms: f64,
    citus_ms: f64,
}

struct CitusMeasured {
    rows: Vec<CitusRow>,
    setup_s: f64,
    version: String,
}

/// The SQL pgdp sends to the Citus coordinator for `sql` (its EXPLAIN's upstream SQL with the
/// ranking seed put back, as `tests/integration/citus.rs` reads it), and where its EXPLAIN says
/// the per-unit stage runs.
async fn sent_to_citus(on_citus: &Client, sql: &str) -> Res<(String, &'static str)> {
    let (sent, lines) = sent_sql(on_citus, sql).await?;
    let claim = lines
        .iter()
        .find(|l| l.starts_with("upstream: Citus: "))
        .ok_or_else(|| {
            fail(format!(
                "{sql}: pgdp's EXPLAIN has no `upstream: Citus:` line"
            ))
        })?;
    let claim = if claim.contains("pulls every row") {
        "pulled to the coordinator"
    } else if claim.contains("local table") {
        "local table sent as a distributed subplan"
    } else if claim.contains("runs in the workers' tasks") && claim.contains("subplans") {
        "workers' tasks (values per task as subplans)"
    } else if claim.contains("runs in the workers' tasks") {
        "workers' tasks"
    } else {
        "cannot tell"
    };
    Ok((sent, claim))
}

async fn measure_citus(
    s: &Settings,
    source: &Client,
    source_dsn: &str,
    ledger: &str,
) -> Res<CitusMeasured> {
    let policy = policy()?;
    let single = start(&policy, source_dsn.to_string(), ledger).await?;
    let on_single = connect(&proxy_dsn(single.addr.port())).await?;
    eprintln!(
        "Citus, {CITUS_WORKERS} workers: starting and copying scale {}…",
        s.scale
    );
    let started = Instant::now();
    let citus = Citus::start_demo(source, CITUS_WORKERS)
        .await
        .map_err(|e| match e {
            CitusError::NotInstalled(_) => fail(format!(
                "--citus: {e} (as root; the source is github.com/citusdata/citus, tag v13.2.2: \
                 docs/scale-out.md, \"Citus\")"
            )),
            other => other.into(),
        })?;
    let setup_s = started.elapsed().as_secs_f64();
    let coordinator = connect(&citus.dsn()).await?;
    let version = common::scalar(
        &coordinator,
        "SELECT extversion FROM pg_catalog.pg_extension WHERE extname = 'citus'",
    )
    .await?;
    let on_citus_server = start(&policy, citus.dsn(), ledger).await?;
    let on_citus = connect(&proxy_dsn(on_citus_server.addr.port())).await?;
    for client in [&on_single, &on_citus] {
        client.batch_execute(CAPS_FIXED).await?;
    }
    let mut rows = Vec::new();
    for (label, sql, tables) in QUERIES.iter().chain(&CITUS_QUERIES) {
        if !s.measures(label) {
            continue;
        }
        let (sent, claim) = sent_to_citus(&on_citus, sql).await?;
        let received =
            received_from_workers(&coordinator, citus.coordinator().port(), &sent).await?;
        let (single_ms, citus_ms) = interleaved(&on_single, &on_citus, sql, s.runs).await?;
        eprintln!(
            "  {label}: {} rows to the coordinator ({} from {} subplan(s)), {:.1} ms vs {:.1} ms on one server",
            received.rows, received.subplan_rows, received.subplans, citus_ms, single_ms
        );
        rows.push(CitusRow {
            label,
            tables: table_rows(source, tables).await?,
            received,
            claim,
            single_ms,
            citus_ms,
        });
    }
    drop((on_citus, on_citus_server, coordinator, citus));
    Ok(CitusMeasured {
        rows,
        setup_s,
        version,
    })
}

/// The first sentence of a report: the command (with `arguments`) and the machine.
fn generated_by(machine: &common::Machine, arguments: &str) -> String {
    format!(
        "Generated by `cargo bench --bench shards -- {arguments}` on {} \
         ({} cores, {:.1} GiB, {}; load at start {}), {}.",
        machine.cpu,
        machine.cores,
        machine.memory_gib,
        machine.postgres,
        machine.load,
        machine.date,
    )
}

fn report(
    s: &Settings,
    machine: &common::Machine,
    rows: &[Row],
    setups: &[(usize, f64)],
) -> String {
    let arguments = format!(
        "--scale {} --shards {} --runs {}",
        s.scale,
        s.shards
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(","),
        s.runs
    );
    let mut out = format!(
        "{} Every shard and the coordinator are throwaway clusters on this machine (fsync off), \
         the one server is the bench upstream; all share the same cores.\n\n",
        generated_by(machine, &arguments)
    );
    out.push_str(&format!(
        "Set-up (start the servers, copy scale {} and ANALYZE): {}.\n\n",
        s.scale,
        setups
            .iter()
            .map(|(n, secs)| format!("{n} shard(s) {secs:.0} s"))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    out.push_str(
        "| shards | query | rows read | rows moved (pgdp's SQL) | moved / read | rows moved without partitionwise | latency sharded (ms) | latency one server (ms) | sharded / one server |\n\
         |---:|---|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in rows {
        out.push_str(&format!(
            "| {} | {} | {} | {} | {:.3} | {} | {:.1} | {:.1} | {:.2} |\n",
            r.shards,
            r.label,
            r.tables,
            r.moved,
            r.moved as f64 / r.tables.max(1) as f64,
            r.moved_unpushed,
            r.sharded_ms,
            r.single_ms,
            r.sharded_ms / r.single_ms
        ));
    }
    out
}

fn citus_report(s: &Settings, machine: &common::Machine, measured: &CitusMeasured) -> String {
    let mut out = format!(
        "{} Citus {} with a coordinator and {CITUS_WORKERS} workers, {} shards per distributed \
         table, all throwaway clusters on this machine (fsync off); the one server is the bench \
         upstream; all share the same cores. Both pgdp run with `{CAPS_FIXED}` (the tables' \
         caps: the statement timed is the one whose rows are counted).\n\n",
        generated_by(
            machine,
            &format!("--citus --scale {} --runs {}", s.scale, s.runs)
        ),
        measured.version,
        pgdp::tools::citus::SHARD_COUNT,
    );
    out.push_str(&format!(
        "Set-up (start the nodes, copy scale {} through the coordinator, keys and ANALYZE): {:.0} s.\n\n",
        s.scale, measured.setup_s
    ));
    out.push_str(
        "| query | rows read | rows to the coordinator (pgdp's SQL) | moved / read | tuple data received | of which distributed subplans | per-unit stage (pgdp's EXPLAIN) | latency Citus (ms) | latency one server (ms) | Citus / one server |\n\
         |---|---:|---:|---:|---:|---|---|---:|---:|---:|\n",
    );
    for r in &measured.rows {
        let got = &r.received;
        let subplans = if got.subplans == 0 {
            "none".to_string()
        } else {
            format!(
                "{} rows ({} subplan(s): {})",
                got.subplan_rows,
                got.subplans,
                got.destinations.join(", ")
            )
        };
        out.push_str(&format!(
            "| {} | {} | {} | {:.3} | {} | {} | {} | {:.1} | {:.1} | {:.2} |\n",
            r.label,
            r.tables,
            got.rows,
            got.rows as f64 / r.tables.max(1) as f64,
            size(got.bytes),
            subplans,
            r.claim,
            r.citus_ms,
            r.single_ms,
            r.citus_ms / r.single_ms
        ));
    }
    out
}

/// `bytes` in kB below a MiB, in MiB above.
fn size(bytes: u64) -> String {
    if bytes < 1 << 20 {
        format!("{} kB", bytes >> 10)
    } else {
        format!("{:.1} MiB", bytes as f64 / f64::from(1 << 20))
    }
}

/// Replaces the section of `path` between `begin` and `end` (or appends it).
fn write_report(path: &std::path::Path, begin: &str, end: &str, generated: &str) -> Res<()> {
    let section = format!("{begin}\n{generated}{end}");
    let old = std::fs::read_to_string(path).unwrap_or_default();
    let text = match (old.find(begin), old.find(end)) {
        (Some(b), Some(e)) if b < e => format!("{}{section}{}", &old[..b], &old[e + end.len()..]),
        _ => format!("{old}\n{section}\n"),
    };
    std::fs::write(path, text)?;
    Ok(())
}
