//! What the proxy and utility benchmarks share: errors, connections, the machine facts, the demo
//! database and the budget of the bench policy. Included by both (`#[path] mod common`); each
//! uses most of it, so items one of them does not use are allowed to be dead there.
#![allow(dead_code)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use tokio_postgres::{Client, NoTls, SimpleQueryMessage};

pub type Error = Box<dyn std::error::Error + Send + Sync>;
pub type Res<T> = Result<T, Error>;

pub fn fail(message: impl Into<String>) -> Error {
    message.into().into()
}

/// The upstream used when `PGDP_BENCH_UPSTREAM` is not set.
pub const DEFAULT_ADMIN_DSN: &str = "host=127.0.0.1 port=5432 user=postgres dbname=postgres";

/// The demo policy (see [`budget_policy_text`]).
pub const DEMO_POLICY: &str = include_str!("../../policies/demo.yaml");

/// Fixed noise seed of the in-process server (results do not depend on it; runs repeat exactly).
pub const NOISE_SEED: [u8; 32] = [7; 32];

// ---------------------------------------------------------------------------------------------
// Connections and queries

pub async fn connect(dsn: &str) -> Res<Client> {
    let (client, connection) = tokio_postgres::connect(dsn, NoTls).await?;
    tokio::spawn(async move {
        // Errors surface on the client's next call.
        let _ = connection.await;
    });
    Ok(client)
}

/// `dsn` with its database replaced.
pub fn with_dbname(dsn: &str, dbname: &str) -> String {
    pgdp::tools::cluster::dsn_with_dbname(dsn, dbname)
}

/// The demo analyst's connection string for a pgdp listening on `port`.
pub fn proxy_dsn(port: u16) -> String {
    format!(
        "host=127.0.0.1 port={port} user=analyst password=analyst dbname={} sslmode=disable connect_timeout=30",
        pgdp::tools::demo::DATABASE
    )
}

/// Rows of a simple query's answer (the error names the SQL).
pub async fn simple_rows(client: &Client, sql: &str) -> Res<Vec<Vec<Option<String>>>> {
    let messages = client
        .simple_query(sql)
        .await
        .map_err(|e| fail(format!("{sql}: {e}")))?;
    Ok(messages
        .iter()
        .filter_map(|m| match m {
            SimpleQueryMessage::Row(r) => {
                Some((0..r.len()).map(|i| r.get(i).map(str::to_string)).collect())
            }
            _ => None,
        })
        .collect())
}

/// The lines of pgdp's `EXPLAIN` of `sql` (one text column per row).
pub async fn explain_lines(client: &Client, sql: &str) -> Res<Vec<String>> {
    Ok(simple_rows(client, &format!("EXPLAIN {sql}"))
        .await?
        .into_iter()
        .filter_map(|row| row.into_iter().next().flatten())
        .collect())
}

/// The upstream SQL in pgdp's EXPLAIN `lines` of `sql`, ranking seed redacted as `<secret>`.
/// EXPLAIN lays it out over the lines after "upstream SQL:", indented, to the end (a release
/// schedule's line aside); joined with spaces they give it back.
pub fn explained_upstream_sql(sql: &str, lines: &[String]) -> Res<String> {
    let start = lines
        .iter()
        .position(|line| line == "upstream SQL:")
        .ok_or_else(|| fail(format!("{sql}: pgdp's EXPLAIN shows no upstream SQL")))?;
    Ok(lines[start + 1..]
        .iter()
        .take_while(|line| !line.starts_with("release schedule:"))
        .map(|line| line.trim())
        .collect::<Vec<_>>()
        .join(" "))
}

/// The first column of the first row.
pub async fn scalar(client: &Client, sql: &str) -> Res<String> {
    simple_rows(client, sql)
        .await?
        .into_iter()
        .next()
        .and_then(|r| r.into_iter().next().flatten())
        .ok_or_else(|| fail(format!("no value from {sql}")))
}

/// DP queries sent to pgdp (to check against the ledger's charges).
pub static DP_QUERIES: AtomicU64 = AtomicU64::new(0);
static ALIAS: AtomicU64 = AtomicU64::new(1);

/// The query with its `{n}` replaced by a fresh number: a new text (the bench policy also turns
/// the replay cache and the reuse of noisy measures off, [`budget_policy_text`]).
pub fn fresh(template: &str) -> String {
    template.replace("{n}", &ALIAS.fetch_add(1, Ordering::Relaxed).to_string())
}

// ---------------------------------------------------------------------------------------------
// The demo data and the policy

/// The demo database at `scale`, shared with the integration tests (the harness's name,
/// `pgdp_test_demo_s<N>_v<VERSION>`), created and loaded when needed, only read otherwise.
/// Returns its DSN.
pub async fn demo_database(admin_dsn: &str, admin: &Client, scale: u32) -> Res<String> {
    let name = format!("pgdp_test_demo_s{scale}_v{}", pgdp::tools::demo::VERSION);
    let exists = admin
        .query_opt("SELECT 1 FROM pg_database WHERE datname = $1", &[&name])
        .await?
        .is_some();
    if !exists {
        if let Err(e) = admin
            .batch_execute(&format!("CREATE DATABASE \"{name}\""))
            .await
        {
            if e.code() != Some(&tokio_postgres::error::SqlState::DUPLICATE_DATABASE) {
                return Err(e.into());
            }
        }
    }
    let dsn = with_dbname(admin_dsn, &name);
    let client = connect(&dsn).await?;
    let started = Instant::now();
    let report = pgdp::tools::demo::load(&client, scale, |line| eprintln!("  {line}")).await?;
    if !report.reused {
        eprintln!(
            "  loaded scale {scale} in {:.0} s",
            started.elapsed().as_secs_f64()
        );
    }
    dup_table(&client).await?;
    Ok(dsn)
}

/// The bench's table with a non-unique unit column, shaped like SmartNoise's PUMS_dup: people
/// `1..=DUP_PEOPLE` with one to three identical rows each (about 10^6 rows), no key, no index.
/// Only the bench creates it (in the demo databases, schema `bench`, the same at every scale),
/// once; `pgdp demo` does not.
pub const DUP_TABLE: &str = "bench.pums_dup";

/// People in [`DUP_TABLE`] (two rows each on average).
pub const DUP_PEOPLE: u64 = 500_000;

/// The policy entry of [`DUP_TABLE`], added to the bench policy.
pub const DUP_POLICY: &str = "  bench.pums_dup:
    kind: private
    privacy_unit: pid
    max_groups_per_unit: 1
    max_rows_per_unit: 3
    columns:
      pid:    { type: bigint }
      age:    { type: integer, lower: 0, upper: 100, groupable: true }
      sex:    { type: text, public_values: [F, M] }
      educ:   { type: integer, groupable: true }
      income: { type: numeric, lower: 0, upper: 500000 }
";

/// Creates [`DUP_TABLE`] unless it is there with its rows (a deterministic function of `pid`).
pub async fn dup_table(client: &Client) -> Res<()> {
    let there = scalar(
        client,
        "SELECT count(*) FROM pg_tables WHERE schemaname = 'bench' AND tablename = 'pums_dup_done'",
    )
    .await?;
    if there == "1" {
        return Ok(());
    }
    let started = Instant::now();
    eprintln!("  creating {DUP_TABLE} ({DUP_PEOPLE} people, 1 to 3 rows each)…");
    client
        .batch_execute(&format!(
            "DROP SCHEMA IF EXISTS bench CASCADE; CREATE SCHEMA bench;
             CREATE TABLE bench.pums_dup (pid bigint, age integer, sex text, educ integer, income numeric(10,2));
             INSERT INTO bench.pums_dup
             SELECT pid, 18 + (hashint8(pid * 3) & 2147483647) % 70,
                    CASE WHEN hashint8(pid * 5) % 2 = 0 THEN 'F' ELSE 'M' END,
                    1 + (hashint8(pid * 7) & 2147483647) % 16,
                    round(((hashint8(pid * 11) & 2147483647) % 20000000) / 100.0, 2)
             FROM generate_series(1, {DUP_PEOPLE}) AS pid,
                  generate_series(1, 1 + (hashint8(pid) & 2147483647) % 3) AS copy;
"
        ))
        .await?;
    // VACUUM sets the visibility map, as autovacuum would on a table in use.
    client
        .batch_execute("VACUUM (ANALYZE) bench.pums_dup")
        .await?;
    client
        .batch_execute("CREATE TABLE bench.pums_dup_done ()")
        .await?;
    eprintln!(
        "  created {DUP_TABLE} in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The demo policy with a budget for a whole run: total ε 10^6, δ 0.5, at most ε 100 per query,
/// and no replay cache (`replay_lifetime_s: 0`): a query that differs from an earlier one only in
/// its output alias would otherwise be answered from that release's noisy measures, free, and
/// measure nothing; and `max_bias` off: the benches time and measure answers, and a daily
/// grouping the chosen caps leave more than 10 % low would be refused (after the same work).
/// Everything else (bounds, caps, public keys) is the demo's.
pub fn budget_policy_text() -> Res<String> {
    let mut text = DEMO_POLICY.to_string();
    for (from, to) in [
        ("replay_lifetime_s: 86400\n", "replay_lifetime_s: 0\n"),
        ("  max_bias: 0.1\n", "  max_bias: 'off'\n"),
        ("      epsilon: 10\n", "      epsilon: 1000000\n"),
        ("      delta: 1.0e-5\n", "      delta: 0.5\n"),
        (
            "      epsilon_per_query_max: 2\n",
            "      epsilon_per_query_max: 100\n",
        ),
    ] {
        if !text.contains(from) {
            return Err(fail(format!(
                "the demo policy no longer contains {from:?}; update benches/common"
            )));
        }
        text = text.replace(from, to);
    }
    Ok(text)
}

// ---------------------------------------------------------------------------------------------
// The machine

/// What the report says about where it ran.
pub struct Machine {
    pub cpu: String,
    pub cores: usize,
    pub memory_gib: f64,
    pub kernel: String,
    /// The upstream's version and the settings that matter to the figures.
    pub postgres: String,
    /// The load average at the start.
    pub load: String,
    pub date: String,
}

/// The text of a file, or nothing if it cannot be read.
pub fn read(path: &str) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

pub async fn machine(admin: &Client) -> Res<Machine> {
    let cpu = read("/proc/cpuinfo")
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
        .unwrap_or_else(|| "unknown CPU".into());
    let memory_kib: f64 = read("/proc/meminfo")
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    let settings = simple_rows(
        admin,
        "SELECT version(), current_setting('shared_buffers'), current_setting('work_mem'), \
         current_setting('max_parallel_workers_per_gather'), current_setting('synchronous_commit')",
    )
    .await?;
    let r = settings.first().ok_or_else(|| fail("no version"))?;
    let text = |i: usize| r.get(i).cloned().flatten().unwrap_or_default();
    let version = text(0);
    let version = version.split(" on ").next().unwrap_or(&version).to_string();
    Ok(Machine {
        cpu,
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        memory_gib: memory_kib / 1024.0 / 1024.0,
        kernel: read("/proc/sys/kernel/osrelease").trim().to_string(),
        postgres: format!(
            "{version} (shared_buffers {}, work_mem {}, max_parallel_workers_per_gather {}, synchronous_commit {})",
            text(1),
            text(2),
            text(3),
            text(4)
        ),
        load: read("/proc/loadavg")
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" "),
        date: utc_now(),
    })
}

/// The current UTC time as `YYYY-MM-DD HH:MM UTC`.
pub fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs()) as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let days_since_2000 = i32::try_from(days - DAYS_1970_TO_2000).unwrap_or(0);
    format!(
        "{} {:02}:{:02} UTC",
        pgdp::datetime::Date::from_days_since_2000(days_since_2000),
        rem / 3600,
        (rem % 3600) / 60
    )
}

/// Days from 1970-01-01 to 2000-01-01.
const DAYS_1970_TO_2000: i64 = 10_957;

// ---------------------------------------------------------------------------------------------
// The program

/// Runs `bench` on a multi-threaded runtime and exits: 0 on success, else 1 after printing the
/// error with its sources (tokio-postgres puts the server's message in the error's source).
pub fn run_and_exit<F>(name: &str, bench: F) -> !
where
    F: std::future::Future<Output = Res<()>>,
{
    let result = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(Error::from)
        .and_then(|runtime| runtime.block_on(bench));
    let code = match result {
        Ok(()) => 0,
        Err(e) => {
            let mut message = e.to_string();
            let mut source = e.source();
            while let Some(inner) = source {
                message.push_str(&format!(": {inner}"));
                source = inner.source();
            }
            eprintln!("{name}: {message}");
            1
        }
    };
    std::process::exit(code);
}
