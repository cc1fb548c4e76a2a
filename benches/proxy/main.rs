//! The pgdp benchmark: what the proxy costs on the demo dataset, next to baselines measured in the
//! same run on the same machine.
//!
//! ```text
//! cargo bench --bench proxy                      # scales 1 and 10, writes BENCHMARKS.md
//! cargo bench --bench proxy -- --scale 1         # one scale
//! cargo bench --bench proxy -- --smoke           # seconds; CI; writes target/bench-smoke/
//! cargo bench --bench proxy -- --scale 10 --load-only   # only load the demo data
//! cargo bench --bench proxy -- --schedule        # only the release-schedule figure (scale 1)
//! cargo bench --bench proxy -- --leases          # only the budget-lease figure (scale 1)
//! cargo bench --bench proxy -- --privacy --scale 10   # only the cost of privacy, at scale 10
//! ```
//!
//! Figures (BENCHMARKS.md states the targets and reads the results):
//! 1. proxy overhead: a DP query through pgdp against its rewritten SQL sent directly;
//! 2. cost of privacy: the DP query through pgdp against the plain aggregate sent directly;
//! 3. throughput: 1, 8, 32 and 128 concurrent clients through pgdp against direct;
//! 4. front end: classify + analyze + rewrite per golden-corpus query, and release per row;
//! 5. memory: resident size of a `pgdp serve` child process idle, while releasing ~10^5 groups,
//!    and with many idle connections;
//! 6. scaling: DP latency against table size and number of groups;
//! 7. release schedule (`--schedule` only): DP latency with the policy's `release_schedule`
//!    against the same pgdp without one, on the queries of figures 1 and 2 (docs/security.md §2);
//! 9. budget leases (`--leases` only): the tiny query at 1 and 32 clients directly, through a
//!    byte-forwarding TCP proxy (the floor of any proxy), through pgdp with leases (the default)
//!    and with `--lease-queries 1` (both in the bench's process), and through `pgdp serve`
//!    processes of their own with the default threads and with `--worker-threads 1`, each
//!    against the forwarder (issue 44's targets), the ledger's durable commits per DP query, and
//!    pgdp's CPU per tiny DP query in a `pgdp serve` process of its own, with either threading
//!    (writes benches/leases.md);
//! 8. non-unique unit column (first scale): queries on `bench.pums_dup` (10^6 rows, 1 to 3 per
//!    person, no key), through pgdp against the plain aggregate, the hand-written floor and, when
//!    `PGDP_BENCH_SMARTNOISE` names a Python with smartnoise-sql, SmartNoise SQL.
//!
//! `--privacy` runs figure 2 alone at every scale of the run and writes benches/privacy.md and
//! the plans of benches/plans-s<N>.txt (a scale-10 run of it takes minutes, not an hour).
//!
//! Figures 2 and 8 also time the *floor* of each query: its per-unit aggregation written by hand
//! in the fastest SQL found, sent directly.
//!
//! Invariants:
//! - Every latency is a median over repeated runs, measured interleaved with its baselines (the
//!   order alternates from run to run), after one discarded warm-up of each.
//! - No DP query is answered from pgdp's replay cache or from earlier noisy measures: the bench
//!   policy sets `replay_lifetime_s: 0`, and each run gives its query a fresh output alias, which
//!   leaves the upstream SQL unchanged. The report checks it: the ledger holds one charge per DP
//!   query sent.
//! - The demo databases (`pgdp_test_demo_s<N>_v<VERSION>`, benches/common) are shared with the
//!   integration tests and only read here; the ledger is a database of this process, dropped at the end.
//! - The upstream is `PGDP_BENCH_UPSTREAM` (a DSN of a maintenance database, user allowed to
//!   create databases) or `host=127.0.0.1 port=5432 user=postgres dbname=postgres`.
//!
//! A benchmark program, not a test: progress goes to standard error, the report to a file.

#[path = "../common/mod.rs"]
mod common;
mod plot;

use common::{
    budget_policy_text, connect, demo_database, explain_lines, explained_upstream_sql, fail, fresh,
    machine, proxy_dsn, read, scalar, simple_rows, with_dbname, Machine, Res, DEFAULT_ADMIN_DSN,
    DEMO_POLICY, DP_QUERIES, DUP_PEOPLE, DUP_POLICY, DUP_TABLE, NOISE_SEED,
};

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pgdp::dp::analyze::{self, Context};
use pgdp::dp::release::{self, Budget};
use pgdp::dp::rewrite;
use pgdp::policy::{Mechanism, Policy};
use pgdp::server::{self, Config, Running};
use pgdp::session::classify::{self, Statement};
use pgdp::session::Shared;
use rand::rngs::ChaCha20Rng;
use rand::SeedableRng;
use tokio_postgres::{Client, SimpleQueryMessage};

/// Most direct upstream connections the throughput figure opens (PostgreSQL's default
/// `max_connections` is 100 and the machine is shared); more clients share them.
const DIRECT_CONNECTIONS_MAX: usize = 48;

/// Queries whose output alias `{n}` is replaced by a fresh number at each run.
struct Query {
    label: &'static str,
    template: &'static str,
}

const fn q(label: &'static str, template: &'static str) -> Query {
    Query { label, template }
}

/// Figure 1: proxy overhead (target ratio).
const OVERHEAD: [(Query, f64); 4] = [
    (
        q(
            "tiny: people, 100 rows by key",
            "SELECT COUNT(*) AS n_{n} FROM demo.people WHERE person_id <= 100",
        ),
        1.3,
    ),
    (
        q(
            "people: COUNT(*)",
            "SELECT COUNT(*) AS n_{n} FROM demo.people",
        ),
        1.05,
    ),
    (
        q(
            "visits: COUNT(*)",
            "SELECT COUNT(*) AS n_{n} FROM demo.visits",
        ),
        1.05,
    ),
    (
        q(
            "visits: SUM by clinic",
            "SELECT clinic, SUM(cost) AS s_{n} FROM demo.visits GROUP BY clinic",
        ),
        1.05,
    ),
];

/// Labels of [`OVERHEAD`] in the plot.
const OVERHEAD_SHORT: [&str; 4] = ["TINY", "PEOPLE", "VISITS", "BY CLINIC"];

/// Figure 2: cost of privacy (target ratio), and the floor: the per-unit aggregation of the
/// same query written by hand in the fastest SQL found (sent directly; it neither scales sums
/// of units over the row cap nor ranks a unit's groups, so it is below any correct rewrite).
const PRIVACY: [(Query, &str, f64); 5] = [
    (
        q("COUNT(*) visits", "SELECT COUNT(*) AS n_{n} FROM demo.visits"),
        "SELECT SUM(LEAST(n, 10)), COUNT(*) FROM (SELECT person_id, COUNT(*) AS n FROM demo.visits GROUP BY person_id) AS u",
        1.5,
    ),
    (
        q(
            "SUM+AVG cost",
            "SELECT SUM(cost) AS s_{n}, AVG(cost) FROM demo.visits",
        ),
        "SELECT SUM(s), SUM(LEAST(n, 10)), COUNT(*) FROM (SELECT person_id, COUNT(cost) AS n, SUM(LEAST(GREATEST(cost, 0), 2000)) AS s FROM demo.visits GROUP BY person_id) AS u",
        1.5,
    ),
    (
        q(
            "GROUP BY public",
            "SELECT region, COUNT(*) AS n_{n}, AVG(income) FROM demo.people GROUP BY region",
        ),
        "SELECT region, COUNT(*), SUM(LEAST(GREATEST(income, 0), 250000)) FROM demo.people GROUP BY region",
        1.5,
    ),
    (
        q(
            "GROUP BY selected",
            "SELECT clinic, COUNT(*) AS n_{n}, SUM(cost) FROM demo.visits GROUP BY clinic",
        ),
        "SELECT clinic, SUM(LEAST(n, 10)), SUM(s), COUNT(*) FROM (SELECT person_id, clinic, COUNT(*) AS n, SUM(LEAST(GREATEST(cost, 0), 2000)) AS s FROM demo.visits GROUP BY person_id, clinic) AS u GROUP BY clinic",
        2.5,
    ),
    (
        q(
            "join",
            "SELECT region, AVG(cost) AS a_{n} FROM demo.visits JOIN demo.people USING (person_id) GROUP BY region",
        ),
        "SELECT region, SUM(n), SUM(s), COUNT(*) FROM (SELECT person_id, COUNT(cost) AS n, SUM(LEAST(GREATEST(cost, 0), 2000)) AS s FROM demo.visits GROUP BY person_id) AS u JOIN demo.people USING (person_id) GROUP BY region",
        2.5,
    ),
];

/// Figure 8: the table with a non-unique unit column (benches/common `DUP_TABLE`, PUMS_dup-like),
/// each query with its floor as in [`PRIVACY`]. `benches/smartnoise.py` runs the same queries
/// through SmartNoise SQL on the same PostgreSQL.
const DUP: [(Query, &str); 3] = [
    (
        q("dup: COUNT(*)", "SELECT COUNT(*) AS n_{n} FROM bench.pums_dup"),
        "SELECT SUM(LEAST(n, 3)), COUNT(*) FROM (SELECT pid, COUNT(*) AS n FROM bench.pums_dup GROUP BY pid) AS u",
    ),
    (
        q(
            "dup: COUNT, AVG(income) by sex",
            "SELECT sex, COUNT(*) AS n_{n}, AVG(income) FROM bench.pums_dup GROUP BY sex",
        ),
        "SELECT sex, SUM(LEAST(n, 3)), SUM(s), COUNT(*) FROM (SELECT pid, sex, COUNT(income) AS n, SUM(LEAST(GREATEST(income, 0), 500000)) AS s FROM bench.pums_dup GROUP BY pid, sex) AS u GROUP BY sex",
    ),
    (
        q(
            "dup: COUNT, SUM(income) by educ",
            "SELECT educ, COUNT(*) AS n_{n}, SUM(income) FROM bench.pums_dup GROUP BY educ",
        ),
        "SELECT educ, SUM(LEAST(n, 3)), SUM(s), COUNT(*) FROM (SELECT pid, educ, COUNT(*) AS n, SUM(LEAST(GREATEST(income, 0), 500000)) AS s FROM bench.pums_dup GROUP BY pid, educ) AS u GROUP BY educ",
    ),
];

/// Labels of [`PRIVACY`] in the plot.
const PRIVACY_SHORT: [&str; 5] = ["COUNT", "SUM+AVG", "PUBLIC KEYS", "SELECTED", "JOIN"];

/// Figure 3: the throughput workloads.
const THROUGHPUT: [Query; 2] = [
    q(
        "people: COUNT(*)",
        "SELECT COUNT(*) AS n_{n} FROM demo.people",
    ),
    q(
        "tiny: people, 100 rows by key",
        "SELECT COUNT(*) AS n_{n} FROM demo.people WHERE person_id <= 100",
    ),
];

/// Figure 6: scaling with rows (the table's row count is read from the upstream).
const SCALING_ROWS: [Query; 2] = [
    q(
        "people: COUNT+SUM",
        "SELECT COUNT(*) AS n_{n}, SUM(income) FROM demo.people",
    ),
    q(
        "visits: COUNT+SUM",
        "SELECT COUNT(*) AS n_{n}, SUM(cost) FROM demo.visits",
    ),
];

/// Figure 6: scaling with groups (all on demo.visits, keys released by partition selection).
const SCALING_GROUPS: [Query; 3] = [
    q(
        "month (12 keys)",
        "SELECT date_part('month', visit_date), COUNT(*) AS n_{n} FROM demo.visits GROUP BY 1",
    ),
    q(
        "day (731 keys)",
        "SELECT visit_date, COUNT(*) AS n_{n} FROM demo.visits GROUP BY visit_date",
    ),
    q(
        "clinic × diagnosis (~10^5 keys)",
        "SELECT clinic, diagnosis, COUNT(*) AS n_{n} FROM demo.visits GROUP BY clinic, diagnosis",
    ),
];

/// Figure 4: the query whose release cost is measured, with the most candidate groups the demo
/// offers (~238k at scale 1; few are released: most have one or two people).
const WIDE: Query = q(
    "visits by day, clinic, diagnosis",
    "SELECT visit_date, clinic, diagnosis, COUNT(*) AS n_{n}, SUM(cost) FROM demo.visits GROUP BY visit_date, clinic, diagnosis",
);

/// ε of [`WIDE`] and [`MANY`] in the release and memory figures.
const WIDE_EPSILON: f64 = 100.0;

/// Figure 5: the query whose release the memory figure watches, at the largest scale of the run:
/// ~110k candidate groups (days × clinics × three cost bands) with enough people each that at
/// scale 10 and ε = [`WIDE_EPSILON`] pgdp releases `GROUPS_RELEASED_MAX` (10^5) of them.
const MANY: Query = q(
    "visits by day, clinic, cost band",
    "SELECT visit_date, clinic, CASE WHEN cost < 100 THEN 'low' WHEN cost < 300 THEN 'mid' ELSE 'high' END AS band, COUNT(*) AS n_{n} FROM demo.visits GROUP BY 1, 2, 3",
);

/// How much work each figure does.
#[derive(Debug, Clone)]
struct Settings {
    smoke: bool,
    /// Only create and load the demo databases of `scales`, measure nothing.
    load_only: bool,
    /// Only figure 7, the release schedule, at the first scale.
    schedule_only: bool,
    /// Only figure 9, budget leases, at the first scale.
    leases_only: bool,
    /// Only figure 2, the cost of privacy, at every scale (writes benches/privacy.md).
    privacy_only: bool,
    scales: Vec<u32>,
    out: PathBuf,
    admin_dsn: String,
    runs_min: usize,
    runs_max: usize,
    /// Stop adding runs to a latency series after this long (once `runs_min` are done).
    series_budget: Duration,
    throughput_window: Duration,
    clients: Vec<usize>,
    idle_connections: usize,
    frontend_samples: usize,
    frontend_sample_time: Duration,
    release_runs: usize,
    command: String,
}

fn parse_args() -> Res<Settings> {
    let mut smoke = false;
    let mut load_only = false;
    let mut schedule_only = false;
    let mut leases_only = false;
    let mut privacy_only = false;
    let mut scales = None;
    let mut out = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--smoke" => smoke = true,
            "--load-only" => load_only = true,
            "--schedule" => schedule_only = true,
            "--leases" => leases_only = true,
            "--privacy" => privacy_only = true,
            "--scale" => {
                let value = args.next().ok_or_else(|| fail("--scale needs a value"))?;
                let parsed: Result<Vec<u32>, _> =
                    value.split(',').map(|s| s.trim().parse::<u32>()).collect();
                scales = Some(parsed.map_err(|_| fail("--scale takes numbers like 1,10"))?);
            }
            "--out" => {
                out = Some(PathBuf::from(
                    args.next().ok_or_else(|| fail("--out needs a directory"))?,
                ))
            }
            // cargo passes --bench to harness = false targets; filters are ignored.
            _ => {}
        }
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let admin_dsn = std::env::var("PGDP_BENCH_UPSTREAM")
        .ok()
        .filter(|d| !d.trim().is_empty())
        .unwrap_or_else(|| DEFAULT_ADMIN_DSN.to_string());
    let mut options = String::new();
    if smoke {
        options.push_str(" --smoke");
    }
    if schedule_only {
        options.push_str(" --schedule");
    }
    if leases_only {
        options.push_str(" --leases");
    }
    if privacy_only {
        options.push_str(" --privacy");
    }
    if let Some(s) = &scales {
        let list: Vec<String> = s.iter().map(u32::to_string).collect();
        write!(options, " --scale {}", list.join(","))?;
    }
    let mut command = String::from("cargo bench --bench proxy");
    if !options.is_empty() {
        write!(command, " --{options}")?;
    }
    let settings = if smoke {
        Settings {
            smoke,
            load_only,
            schedule_only,
            leases_only,
            privacy_only,
            scales: scales.unwrap_or_else(|| vec![1]),
            out: out.unwrap_or_else(|| root.join("target/bench-smoke")),
            admin_dsn,
            runs_min: 1,
            runs_max: 1,
            series_budget: Duration::from_secs(1),
            throughput_window: Duration::from_secs(2),
            clients: vec![1, 8, 32, 128],
            idle_connections: 50,
            frontend_samples: 3,
            frontend_sample_time: Duration::from_micros(200),
            release_runs: 1,
            command,
        }
    } else {
        Settings {
            smoke,
            load_only,
            schedule_only,
            leases_only,
            privacy_only,
            scales: scales.unwrap_or_else(|| {
                if schedule_only || leases_only {
                    vec![1]
                } else {
                    vec![1, 10]
                }
            }),
            out: out.unwrap_or(root),
            admin_dsn,
            runs_min: 5,
            runs_max: 21,
            series_budget: Duration::from_secs(20),
            throughput_window: Duration::from_secs(8),
            clients: vec![1, 8, 32, 128],
            idle_connections: 500,
            frontend_samples: 21,
            frontend_sample_time: Duration::from_millis(2),
            release_runs: 7,
            command,
        }
    };
    if settings.scales.is_empty() || settings.scales.iter().any(|&s| s == 0 || s > 10) {
        return Err(fail("scales must be between 1 and 10"));
    }
    Ok(settings)
}

fn main() {
    let settings = match parse_args() {
        Ok(settings) => settings,
        Err(e) => {
            eprintln!("bench: {e}");
            std::process::exit(1);
        }
    };
    common::run_and_exit("bench", bench(settings))
}

// ---------------------------------------------------------------------------------------------
// Statistics

fn median(xs: &[f64]) -> f64 {
    percentile(xs, 0.5)
}

fn percentile(xs: &[f64], q: f64) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let i = ((v.len() - 1) as f64 * q).round() as usize;
    v[i]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

// ---------------------------------------------------------------------------------------------
// Connections and queries

/// One way of running a query: through pgdp (fresh alias each time) or a fixed SQL directly.
#[derive(Clone, Copy)]
enum Way<'a> {
    Proxy(&'a Client, &'a str),
    Direct(&'a Client, &'a str),
}

impl Way<'_> {
    /// Runs once; returns the latency and the number of rows.
    async fn once(&self) -> Res<(Duration, usize)> {
        let (client, sql) = match self {
            Way::Proxy(c, template) => {
                DP_QUERIES.fetch_add(1, Ordering::Relaxed);
                (*c, fresh(template))
            }
            Way::Direct(c, sql) => (*c, sql.to_string()),
        };
        let started = Instant::now();
        let messages = client
            .simple_query(&sql)
            .await
            .map_err(|e| fail(format!("{sql}: {e}")))?;
        let elapsed = started.elapsed();
        let rows = messages
            .iter()
            .filter(|m| matches!(m, SimpleQueryMessage::Row(_)))
            .count();
        Ok((elapsed, rows))
    }
}

/// Latencies (ms) of several ways of running one query, interleaved.
#[derive(Debug, Clone, Default)]
struct Series {
    ms: Vec<Vec<f64>>,
    rows: Vec<usize>,
}

impl Series {
    fn median(&self, i: usize) -> f64 {
        median(&self.ms[i])
    }

    /// Median of way `i` over median of way `j`.
    fn ratio(&self, i: usize, j: usize) -> f64 {
        self.median(i) / self.median(j)
    }
}

async fn series(s: &Settings, ways: &[Way<'_>]) -> Res<Series> {
    // One warm-up of each (caches, plans, pool connections), discarded; smoke runs skip it.
    if !s.smoke {
        for w in ways {
            w.once().await?;
        }
    }
    let mut out = Series {
        ms: vec![Vec::new(); ways.len()],
        rows: vec![0; ways.len()],
    };
    let started = Instant::now();
    let mut run = 0usize;
    while run < s.runs_max && (run < s.runs_min || started.elapsed() < s.series_budget) {
        let order: Vec<usize> = if run % 2 == 0 {
            (0..ways.len()).collect()
        } else {
            (0..ways.len()).rev().collect()
        };
        for i in order {
            let (d, rows) = ways[i].once().await?;
            out.ms[i].push(ms(d));
            out.rows[i] = rows;
        }
        run += 1;
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// Setup: the machine, the demo data, the ledger, the policy, the server

/// The ledger database of this run.
struct LedgerDb {
    name: String,
    dsn: String,
}

impl LedgerDb {
    async fn create(s: &Settings, admin: &Client) -> Res<LedgerDb> {
        let name = format!("pgdp_bench_ledger_{}", std::process::id());
        admin
            .batch_execute(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
            .await?;
        admin
            .batch_execute(&format!("CREATE DATABASE \"{name}\""))
            .await?;
        Ok(LedgerDb {
            dsn: with_dbname(&s.admin_dsn, &name),
            name,
        })
    }

    async fn charges(&self) -> Res<u64> {
        let client = connect(&self.dsn).await?;
        Ok(scalar(&client, "SELECT count(*) FROM pgdp.charge_log")
            .await?
            .parse()?)
    }

    async fn drop_db(&self, admin: &Client) {
        let _ = admin
            .batch_execute(&format!(
                "DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)",
                self.name
            ))
            .await;
    }
}

/// The demo policy with a budget for thousands of queries ([`budget_policy_text`]) and the
/// analysts of the idle connections.
fn bench_policy_text() -> Res<String> {
    let text = budget_policy_text()?;
    // The idle connections of the memory figure are spread over more analysts (same password),
    // since one analyst may hold at most CONNECTIONS_PER_ANALYST_MAX connections.
    let verifier = text
        .lines()
        .find(|line| line.trim_start().starts_with("scram_verifier:"))
        .ok_or_else(|| fail("the demo policy has no scram_verifier; update bench_policy_text"))?
        .to_string();
    let mut idle = String::from("analysts:\n");
    for k in 0..IDLE_ANALYSTS {
        writeln!(
            idle,
            "  {IDLE_ANALYST_PREFIX}{k}:\n{verifier}\n    budget: {{ epsilon: 1, delta: 0 }}"
        )?;
    }
    if !text.contains("\nanalysts:\n") {
        return Err(fail(
            "the demo policy has no analysts: section; update bench_policy_text",
        ));
    }
    let last_section = text
        .lines()
        .rfind(|l| !l.starts_with([' ', '#']) && !l.is_empty());
    if last_section != Some("tables:") || !text.ends_with('\n') {
        return Err(fail(
            "the demo policy does not end with its tables: section; update bench_policy_text",
        ));
    }
    // The table of figure 8 (benches/common DUP_TABLE), after the demo's tables.
    Ok(text.replacen("\nanalysts:\n", &format!("\n{idle}"), 1) + DUP_POLICY)
}

/// Analysts `bench_idle_0` … that hold the memory figure's idle connections: enough that none
/// exceeds pgdp's per-analyst connection cap with 500 connections.
const IDLE_ANALYSTS: usize = 4;
const IDLE_ANALYST_PREFIX: &str = "bench_idle_";
const _: () = assert!(IDLE_ANALYSTS * pgdp::limits::CONNECTIONS_PER_ANALYST_MAX > 500);

fn bench_policy() -> Res<Policy> {
    pgdp::policy::parse(&bench_policy_text()?).map_err(|e| fail(format!("bench policy: {e:?}")))
}

async fn start_server(upstream: &str, ledger: &LedgerDb) -> Res<Running> {
    start_server_with(bench_policy()?, upstream, ledger).await
}

async fn start_server_with(policy: Policy, upstream: &str, ledger: &LedgerDb) -> Res<Running> {
    Ok(server::start(Config {
        policy,
        upstream: upstream.to_string(),
        ledger: Some(ledger.dsn.clone()),
        listen: "127.0.0.1:0".into(),
        noise_seed: Some(NOISE_SEED),
    })
    .await?)
}

/// The upstream SQL pgdp sends for `template` (the alias does not change it), so that baselines
/// run exactly what pgdp runs. pgdp's own EXPLAIN shows that SQL with the ranking seed redacted;
/// the bench rewrites the query itself with the facts pgdp learnt from the upstream's catalog
/// for it (the unique-unit form when the unit column is unique, the lookup form when a joined
/// table has one row per unit, counts of `NOT NULL` columns as rows) and checks that its
/// redacted text is the one pgdp shows. Fails if it is not.
async fn rewritten(proxy: &Client, shared: &Shared, secret: &str, template: &str) -> Res<String> {
    let policy = shared.policy.as_ref();
    let sql = template.replace("{n}", "0");
    let shown = explained_upstream_sql(&sql, &explain_lines(proxy, &sql).await?)?;
    let statements = classify::classify(&sql).map_err(|e| fail(format!("{sql}: {e}")))?;
    let [Statement::Query(query)] = statements.as_slice() else {
        return Err(fail(format!("{sql}: not one query")));
    };
    let ctx = Context {
        policy,
        search_path: vec![pgdp::tools::demo::SCHEMA.to_string()],
    };
    let seed = rewrite::ranking_seed(secret).to_string();
    // pgdp's EXPLAIN above learnt them: the facts it planned with.
    let facts = shared.column_facts.as_ref();
    let mut plan = analyze::analyze(query, &ctx).map_err(|e| fail(format!("{sql}: {e}")))?;
    plan.assume_unique_unit(facts);
    plan.assume_unit_lookup(facts);
    plan.assume_not_null(facts);
    let upstream = rewrite::rewrite(&plan, &[], secret)
        .map_err(|e| fail(format!("{sql}: {e}")))?
        .sql;
    if upstream.replace(&seed, "<secret>") == shown {
        return Ok(upstream.to_string());
    }
    Err(fail(format!(
        "{sql}: the bench cannot reproduce the upstream SQL pgdp's EXPLAIN shows: {shown}"
    )))
}

// ---------------------------------------------------------------------------------------------
// Results

struct Overhead {
    label: &'static str,
    target: f64,
    series: Series, // 0 = direct rewritten SQL, 1 = pgdp
}

struct Privacy {
    label: &'static str,
    target: f64,
    series: Series, // 0 = plain, 1 = rewritten direct, 2 = pgdp, 3 = floor
}

/// Figure 8: one query on the table with a non-unique unit column.
struct Dup {
    label: &'static str,
    series: Series, // 0 = plain, 1 = pgdp, 2 = floor
    /// SmartNoise SQL's median latency on the same query, when `PGDP_BENCH_SMARTNOISE` is set.
    smartnoise_ms: Option<f64>,
}

/// The environment variable naming a Python with `smartnoise-sql` and `psycopg2` installed;
/// when it is set, figure 8 also runs `benches/smartnoise.py` with it.
const SMARTNOISE_ENV: &str = "PGDP_BENCH_SMARTNOISE";

/// Figure 8's queries through SmartNoise SQL (`benches/smartnoise.py`), when [`SMARTNOISE_ENV`]
/// names a Python: label → median ms. Empty when it is not set.
fn smartnoise(demo: &str, runs: usize) -> Res<Vec<(String, f64)>> {
    let Ok(python) = std::env::var(SMARTNOISE_ENV) else {
        return Ok(Vec::new());
    };
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/smartnoise.py");
    let output = std::process::Command::new(python)
        .arg(script)
        .arg(demo)
        .arg(runs.to_string())
        .output()?;
    if !output.status.success() {
        return Err(fail(format!(
            "benches/smartnoise.py failed: {}",
            String::from_utf8_lossy(&output.stderr)
        )));
    }
    let mut medians = Vec::new();
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        let mut fields = line.split('\t');
        if let (Some(label), Some(ms)) = (fields.next(), fields.next()) {
            medians.push((label.to_string(), ms.parse()?));
        }
    }
    Ok(medians)
}

/// EXPLAIN (ANALYZE, BUFFERS) of each `(what, sql)` of one query, appended to `plans`.
async fn explain_into(
    plans: &mut String,
    direct: &Client,
    label: &str,
    texts: &[(&str, &str)],
) -> Res<()> {
    for (what, text) in texts {
        let explained = simple_rows(
            direct,
            &format!("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) {text}"),
        )
        .await?;
        writeln!(plans, "=== {label} ({what}) ===\n{text}\n")?;
        for row in explained {
            writeln!(plans, "{}", row.into_iter().flatten().collect::<String>())?;
        }
        plans.push('\n');
    }
    Ok(())
}

struct Throughput {
    label: &'static str,
    /// (clients, direct qps, pgdp qps, pgdp errors)
    levels: Vec<(usize, f64, f64, u64)>,
}

struct Scaling {
    label: String,
    /// Table rows or upstream candidate groups.
    size: u64,
    series: Series, // 0 = plain, 1 = pgdp
}

struct ScaleResult {
    scale: u32,
    people: u64,
    visits: u64,
    overhead: Vec<Overhead>,
    privacy: Vec<Privacy>,
    dup: Vec<Dup>,
    throughput: Vec<Throughput>,
    rows: Vec<Scaling>,
    groups: Vec<Scaling>,
    ledger_commit: Series, // 0 = synchronous_commit off, 1 = on
    plans: String,
}

struct Frontend {
    accepted: Vec<(String, f64)>,
    refused: Vec<(String, f64)>,
    /// For each accepted case, µs up to classify, up to analyze, and in all.
    stages: Vec<[f64; 3]>,
}

struct ReleaseCost {
    label: String,
    candidates: usize,
    released: usize,
    ms: f64,
}

struct Memory {
    idle_kib: u64,
    release_peak_kib: u64,
    release_after_kib: u64,
    released_rows: usize,
    release_ms: f64,
    idle_connections: usize,
    connections_kib: u64,
    connect_failures: usize,
}

// ---------------------------------------------------------------------------------------------
// The run

async fn bench(s: Settings) -> Res<()> {
    let admin = connect(&s.admin_dsn).await?;
    if s.load_only {
        for &scale in &s.scales {
            eprintln!("scale {scale}: demo data");
            demo_database(&s.admin_dsn, &admin, scale).await?;
        }
        return Ok(());
    }
    if s.schedule_only {
        let ledger = LedgerDb::create(&s, &admin).await?;
        let result = schedule_figure(&s, &admin, &ledger).await;
        ledger.drop_db(&admin).await;
        return result;
    }
    if s.leases_only {
        let ledger = LedgerDb::create(&s, &admin).await?;
        let result = leases_figure(&s, &admin, &ledger).await;
        ledger.drop_db(&admin).await;
        return result;
    }
    if s.privacy_only {
        let ledger = LedgerDb::create(&s, &admin).await?;
        let result = privacy_only(&s, &admin, &ledger).await;
        ledger.drop_db(&admin).await;
        return result;
    }
    let machine = machine(&admin).await?;
    eprintln!(
        "pgdp bench ({}): scales {:?}, upstream {}",
        if s.smoke { "smoke" } else { "full" },
        s.scales,
        machine.postgres
    );
    let ledger = LedgerDb::create(&s, &admin).await?;
    let result = bench_all(&s, &admin, &ledger).await;
    // Audit rows of charges made under budget leases are written just after the answers.
    let sent = DP_QUERIES.load(Ordering::Relaxed);
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut charges = ledger.charges().await;
    while matches!(charges, Ok(n) if n < sent) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        charges = ledger.charges().await;
    }
    ledger.drop_db(&admin).await;
    let (frontend, releases, memory, scales) = result?;
    let charges = charges?;
    let sent = DP_QUERIES.load(Ordering::Relaxed);
    let report = report(
        &s, &machine, &frontend, &releases, &memory, &scales, charges, sent,
    )?;
    std::fs::create_dir_all(&s.out)?;
    let md = s.out.join("BENCHMARKS.md");
    write_report(&md, &report)?;
    let png = s.out.join("benches/ratios.png");
    if let Some(dir) = png.parent() {
        std::fs::create_dir_all(dir)?;
    }
    plot::ratios(&png, &plot_data(&scales))?;
    for sc in &scales {
        let plans = s.out.join(format!("benches/plans-s{}.txt", sc.scale));
        std::fs::write(&plans, &sc.plans)?;
    }
    eprintln!("wrote {} and {}", md.display(), png.display());
    if charges != sent {
        return Err(fail(format!(
            "the ledger holds {charges} charges for {sent} DP queries: some were replayed"
        )));
    }
    Ok(())
}

type All = (
    Frontend,
    Vec<ReleaseCost>,
    Option<(u32, Memory)>,
    Vec<ScaleResult>,
);

async fn bench_all(s: &Settings, admin: &Client, ledger: &LedgerDb) -> Res<All> {
    eprintln!("front end: golden corpus");
    let frontend = frontend(s)?;
    let mut scales = Vec::new();
    let mut releases = Vec::new();
    let mut memory = None;
    let largest = s.scales.iter().copied().max().unwrap_or(1);
    for &scale in &s.scales {
        eprintln!("scale {scale}: demo data");
        let demo = demo_database(&s.admin_dsn, admin, scale).await?;
        let running = start_server(&demo, ledger).await?;
        let result = bench_scale(s, scale, &demo, ledger, &running).await?;
        if releases.is_empty() {
            eprintln!("scale {scale}: release cost");
            releases = release_cost(s, &demo, &running).await?;
        }
        drop(running);
        if scale == largest && memory.is_none() {
            eprintln!("scale {scale}: memory (child process)");
            memory = Some((scale, memory_figure(s, &demo, ledger).await?));
        }
        scales.push(result);
    }
    Ok((frontend, releases, memory, scales))
}

async fn bench_scale(
    s: &Settings,
    scale: u32,
    demo: &str,
    ledger: &LedgerDb,
    running: &Running,
) -> Res<ScaleResult> {
    // Larger scales take seconds per query: fewer runs.
    let fewer = Settings {
        runs_min: if scale > 1 {
            s.runs_min.min(3)
        } else {
            s.runs_min
        },
        ..s.clone()
    };
    let s = &fewer;
    let shared = running.shared();
    let secret = shared.secret().await?;
    let port = running.addr.port();
    let proxy = connect(&proxy_dsn(port)).await?;
    let direct = connect(demo).await?;
    let people: u64 = scalar(&direct, "SELECT count(*) FROM demo.people")
        .await?
        .parse()?;
    let visits: u64 = scalar(&direct, "SELECT count(*) FROM demo.visits")
        .await?
        .parse()?;

    eprintln!("scale {scale}: 1. proxy overhead");
    let mut overhead = Vec::new();
    for (query, target) in &OVERHEAD {
        let sql = rewritten(&proxy, &shared, secret, query.template).await?;
        let series = series(
            s,
            &[
                Way::Direct(&direct, &sql),
                Way::Proxy(&proxy, query.template),
            ],
        )
        .await?;
        eprintln!(
            "  {:<34} direct {:>9.2} ms  pgdp {:>9.2} ms  {:.3}x",
            query.label,
            series.median(0),
            series.median(1),
            series.ratio(1, 0)
        );
        overhead.push(Overhead {
            label: query.label,
            target: *target,
            series,
        });
    }

    eprintln!("scale {scale}: ledger commit round trip");
    let ledger_commit = ledger_commit(s, ledger).await?;

    eprintln!("scale {scale}: 2. cost of privacy");
    let mut plans = String::new();
    let privacy = privacy_figure(s, &proxy, &direct, &shared, secret, &mut plans).await?;

    // Figure 8 at the first scale only: the table is the same at every scale.
    let mut dup = Vec::new();
    if scale == s.scales[0] {
        eprintln!("scale {scale}: 8. non-unique unit column ({DUP_TABLE})");
        for (query, floor) in &DUP {
            let plain = query.template.replace("{n}", "0");
            let sql = rewritten(&proxy, &shared, secret, query.template).await?;
            let series = series(
                s,
                &[
                    Way::Direct(&direct, &plain),
                    Way::Proxy(&proxy, query.template),
                    Way::Direct(&direct, floor),
                ],
            )
            .await?;
            eprintln!(
                "  {:<34} plain {:>9.2} ms  pgdp {:>9.2} ms  floor {:>9.2} ms",
                query.label,
                series.median(0),
                series.median(1),
                series.median(2)
            );
            if !s.smoke {
                explain_into(
                    &mut plans,
                    &direct,
                    query.label,
                    &[("plain", &plain), ("rewritten", &sql), ("floor", floor)],
                )
                .await?;
            }
            dup.push(Dup {
                label: query.label,
                series,
                smartnoise_ms: None,
            });
        }
        let runs = if s.smoke { 1 } else { s.runs_min };
        for (label, ms) in smartnoise(demo, runs)? {
            eprintln!("  {label:<34} SmartNoise SQL {ms:>9.2} ms");
            if let Some(d) = dup.iter_mut().find(|d| d.label == label) {
                d.smartnoise_ms = Some(ms);
            }
        }
    }

    eprintln!("scale {scale}: 3. throughput");
    let mut throughput = Vec::new();
    for query in &THROUGHPUT {
        let sql = rewritten(&proxy, &shared, secret, query.template).await?;
        let mut levels = Vec::new();
        for &clients in &s.clients {
            let (direct_qps, _) = load_test(s, demo, &sql, false, clients).await?;
            let (proxy_qps, errors) =
                load_test(s, &proxy_dsn(port), query.template, true, clients).await?;
            eprintln!(
                "  {:<34} {clients:>3} clients: direct {direct_qps:>8.1} q/s  pgdp {proxy_qps:>8.1} q/s  {:.2}x",
                query.label,
                proxy_qps / direct_qps
            );
            levels.push((clients, direct_qps, proxy_qps, errors));
        }
        throughput.push(Throughput {
            label: query.label,
            levels,
        });
    }

    eprintln!("scale {scale}: 6. scaling");
    let mut rows = Vec::new();
    for (query, table) in SCALING_ROWS.iter().zip([people, visits]) {
        let plain = query.template.replace("{n}", "0");
        let series = series(
            s,
            &[
                Way::Direct(&direct, &plain),
                Way::Proxy(&proxy, query.template),
            ],
        )
        .await?;
        eprintln!(
            "  {:<34} {table:>9} rows: plain {:>9.2} ms  pgdp {:>9.2} ms",
            query.label,
            series.median(0),
            series.median(1)
        );
        rows.push(Scaling {
            label: query.label.to_string(),
            size: table,
            series,
        });
    }
    let mut groups = Vec::new();
    for query in &SCALING_GROUPS {
        let plain = query.template.replace("{n}", "0");
        let sql = rewritten(&proxy, &shared, secret, query.template).await?;
        let candidates = simple_rows(&direct, &sql).await?.len() as u64;
        let series = series(
            s,
            &[
                Way::Direct(&direct, &plain),
                Way::Proxy(&proxy, query.template),
            ],
        )
        .await?;
        eprintln!(
            "  {:<34} {candidates:>9} candidate groups, {} released: plain {:>9.2} ms  pgdp {:>9.2} ms",
            query.label,
            series.rows[1],
            series.median(0),
            series.median(1)
        );
        groups.push(Scaling {
            label: query.label.to_string(),
            size: candidates,
            series,
        });
    }

    Ok(ScaleResult {
        scale,
        people,
        visits,
        overhead,
        privacy,
        dup,
        throughput,
        rows,
        groups,
        ledger_commit,
        plans,
    })
}

/// Schedules figure 7 measures: (floor in ms, ratio).
const SCHEDULES: [(u64, f64); 2] = [(50, 2.0), (250, 2.0)];

/// Figure 7 (`--schedule`): the latency of DP answers under a `release_schedule`, against the same
/// pgdp without one, measured interleaved on the queries of figures 1 and 2 at the first scale;
/// printed, and written to `<out>/benches/schedule.md`.
async fn schedule_figure(s: &Settings, admin: &Client, ledger: &LedgerDb) -> Res<()> {
    let scale = s.scales.first().copied().unwrap_or(1);
    eprintln!("scale {scale}: demo data");
    let demo = demo_database(&s.admin_dsn, admin, scale).await?;
    let plain = start_server(&demo, ledger).await?;
    let mut servers = Vec::new();
    for (floor_ms, ratio) in SCHEDULES {
        let text = format!(
            "release_schedule: {{ floor_ms: {floor_ms}, ratio: {ratio} }}\n{}",
            bench_policy_text()?
        );
        let policy =
            pgdp::policy::parse(&text).map_err(|e| fail(format!("schedule policy: {e:?}")))?;
        let bits = policy
            .release_schedule
            .map(|r| r.bits_per_query())
            .unwrap_or(0.0);
        servers.push((
            floor_ms,
            ratio,
            bits,
            start_server_with(policy, &demo, ledger).await?,
        ));
    }
    let plain_client = connect(&proxy_dsn(plain.addr.port())).await?;
    let mut clients = Vec::new();
    for (_, _, _, running) in &servers {
        clients.push(connect(&proxy_dsn(running.addr.port())).await?);
    }
    let mut table = String::new();
    writeln!(
        table,
        "Release schedule: median DP latency (ms) without and with `release_schedule`, scale {scale}, `{}`\n",
        s.command
    )?;
    write!(table, "| query | no schedule |")?;
    for (floor_ms, ratio, bits, _) in &servers {
        write!(
            table,
            " floor {floor_ms} ms, ×{ratio} ({bits:.2} bits) | ratio |"
        )?;
    }
    writeln!(table)?;
    writeln!(table, "|---|---:|{}", "---:|---:|".repeat(servers.len()))?;
    eprintln!("scale {scale}: 7. release schedule");
    let queries = OVERHEAD
        .iter()
        .map(|(q, _)| q)
        .chain(PRIVACY.iter().map(|(q, _, _)| q));
    for query in queries {
        let mut ways = vec![Way::Proxy(&plain_client, query.template)];
        for client in &clients {
            ways.push(Way::Proxy(client, query.template));
        }
        let series = series(s, &ways).await?;
        write!(table, "| {} | {:.1} |", query.label, series.median(0))?;
        let mut line = format!("  {:<34} plain {:>8.1} ms", query.label, series.median(0));
        for (i, (floor_ms, _, _, _)) in servers.iter().enumerate() {
            write!(
                table,
                " {:.1} | {:.2}× |",
                series.median(i + 1),
                series.ratio(i + 1, 0)
            )?;
            write!(
                line,
                "  floor {floor_ms}: {:>8.1} ms {:.2}x",
                series.median(i + 1),
                series.ratio(i + 1, 0)
            )?;
        }
        writeln!(table)?;
        eprintln!("{line}");
    }
    let path = s.out.join("benches/schedule.md");
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&path, &table)?;
    eprintln!("wrote {}", path.display());
    Ok(())
}

/// Figure 9: the tiny query directly, through pgdp with budget leases (the default) and through
/// pgdp with `--lease-queries 1` (one durable commit per DP query), as latency at one client and
/// throughput at 32, with the ledger's durable commits per DP query of each.
async fn leases_figure(s: &Settings, admin: &Client, ledger: &LedgerDb) -> Res<()> {
    let scale = s.scales.first().copied().unwrap_or(1);
    eprintln!("scale {scale}: demo data");
    let demo = demo_database(&s.admin_dsn, admin, scale).await?;
    let leased = start_server(&demo, ledger).await?;
    let off = server::start_with(
        Config {
            policy: bench_policy()?,
            upstream: demo.clone(),
            ledger: Some(ledger.dsn.clone()),
            listen: "127.0.0.1:0".into(),
            noise_seed: Some(NOISE_SEED),
        },
        server::Options {
            lease_queries: Some(1),
            ..Default::default()
        },
    )
    .await?;
    let template = OVERHEAD[0].0.template;
    let shared = leased.shared();
    let secret = shared.secret().await?;
    let leased_dsn = proxy_dsn(leased.addr.port());
    let off_dsn = proxy_dsn(off.addr.port());
    let leased_client = connect(&leased_dsn).await?;
    let off_client = connect(&off_dsn).await?;
    let sql = rewritten(&leased_client, &shared, secret, template).await?;
    let direct = connect(&demo).await?;
    // `pgdp serve` processes of their own, with the default threads and with one worker thread
    // (the two servers above share the bench's process and runtime with their clients).
    let child = ServeChild::start(&demo, ledger, &[]).await?;
    let child_client = child.connect().await?;
    let one_thread = ServeChild::start(&demo, ledger, &["--worker-threads", "1"]).await?;
    let one_thread_client = one_thread.connect().await?;
    let forwarded_dsn = forwarder(&demo).await?;
    let forwarded = match &forwarded_dsn {
        Some(dsn) => Some(connect(dsn).await?),
        None => None,
    };
    let log = connect(&ledger.dsn).await?;
    // Durable ledger commits: slices reserved, and charges committed on their own.
    let durable = || async {
        let slices: u64 = scalar(&log, "SELECT count(*) FROM pgdp.lease")
            .await?
            .parse()?;
        let alone: u64 = scalar(
            &log,
            "SELECT count(*) FROM pgdp.charge_log WHERE lease_id IS NULL",
        )
        .await?
        .parse()?;
        Res::Ok((slices, alone))
    };

    eprintln!("scale {scale}: 9. budget leases, one client");
    let before = DP_QUERIES.load(Ordering::Relaxed);
    let (slices0, alone0) = durable().await?;
    let mut ways = vec![
        Way::Direct(&direct, &sql),
        Way::Proxy(&leased_client, template),
        Way::Proxy(&off_client, template),
        Way::Proxy(&one_thread_client, template),
        Way::Proxy(&child_client, template),
    ];
    if let Some(client) = &forwarded {
        ways.push(Way::Direct(client, &sql));
    }
    let latency = series(s, &ways).await?;
    let sent = DP_QUERIES.load(Ordering::Relaxed) - before;
    let (slices1, alone1) = durable().await?;
    // The four proxies ran `sent / 4` DP queries each; the slices counted are the three leasing
    // servers': per query of the three.
    let per_query = |n: u64| n as f64 / (sent as f64 / 4.0).max(1.0);
    let per_leased_query = |n: u64| n as f64 / (3.0 * sent as f64 / 4.0).max(1.0);

    eprintln!("scale {scale}: 9. budget leases, 32 clients");
    let clients = 32;
    let (direct_qps, _) = load_test(s, &demo, &sql, false, clients).await?;
    let forwarded_qps = match &forwarded_dsn {
        Some(dsn) => Some(load_test(s, dsn, &sql, false, clients).await?.0),
        None => None,
    };
    let (slices2, alone2) = durable().await?;
    let before = DP_QUERIES.load(Ordering::Relaxed);
    let (leased_qps, leased_errors) = load_test(s, &leased_dsn, template, true, clients).await?;
    let leased_sent = DP_QUERIES.load(Ordering::Relaxed) - before;
    let (slices3, _) = durable().await?;
    let before = DP_QUERIES.load(Ordering::Relaxed);
    let (off_qps, off_errors) = load_test(s, &off_dsn, template, true, clients).await?;
    let off_sent = DP_QUERIES.load(Ordering::Relaxed) - before;
    let (_, alone4) = durable().await?;
    let (one_qps, one_errors) = load_test(s, &one_thread.dsn(), template, true, clients).await?;
    let (child_qps, child_errors) = load_test(s, &child.dsn(), template, true, clients).await?;
    drop((one_thread_client, child_client));
    drop((one_thread, child));

    eprintln!("scale {scale}: 9. pgdp's CPU per tiny DP query (a `pgdp serve` process)");
    let cpu_queries = if s.smoke { 50 } else { CPU_QUERIES };
    let cpu = pgdp_cpu_per_query(&demo, ledger, template, cpu_queries, &[]).await?;
    let cpu_one = pgdp_cpu_per_query(
        &demo,
        ledger,
        template,
        cpu_queries,
        &["--worker-threads", "1"],
    )
    .await?;

    let mut table = String::new();
    writeln!(
        table,
        "Budget leases: the tiny query (`{template}`), scale {scale}, `{}`\n",
        s.command
    )?;
    // The issue-44 targets are against the forwarder: any proxy pays its hop.
    let floor = forwarded_qps.map(|qps| (latency.median(5), qps));
    let versus = |ms: f64, qps: f64| match floor {
        Some((floor_ms, floor_qps)) => (
            format!("{:.2}×", ms / floor_ms),
            format!("{:.2}", qps / floor_qps),
        ),
        None => ("–".to_string(), "–".to_string()),
    };
    writeln!(
        table,
        "| way | median latency, 1 client (ms) | / direct | / forwarder | target (/ forwarder) | throughput, {clients} clients (q/s) | / direct | / forwarder | target (/ forwarder) | durable ledger commits per DP query (1 client / {clients} clients) |"
    )?;
    writeln!(table, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")?;
    let (lat, qps) = versus(latency.median(0), direct_qps);
    writeln!(
        table,
        "| direct (the rewritten SQL) | {:.3} | 1 | {lat} | | {direct_qps:.0} | 1 | {qps} | | 0 |",
        latency.median(0)
    )?;
    match forwarded_qps {
        Some(qps) => writeln!(
            table,
            "| floor of any proxy: the direct SQL through a byte-forwarding TCP proxy | {:.3} | {:.2}× | 1 | | {qps:.0} | {:.2} | 1 | | 0 |",
            latency.median(5),
            latency.ratio(5, 0),
            qps / direct_qps,
        )?,
        None => writeln!(
            table,
            "| floor of any proxy: not run (the upstream is not reached over TCP) | | | | | | | | | |"
        )?,
    }
    let (lat, qps) = versus(latency.median(1), leased_qps);
    let met = |ok: Option<bool>| ok.map_or("not measured", mark);
    writeln!(
        table,
        "| pgdp, budget leases (`--lease-queries 64`) | {:.3} | {:.2}× | {lat} | ≤ 1.3× {} | {leased_qps:.0} | {:.2} | {qps} | ≥ 0.6 {} | {:.3} / {:.3} |",
        latency.median(1),
        latency.ratio(1, 0),
        met(floor.map(|(ms, _)| latency.median(1) / ms <= 1.3)),
        leased_qps / direct_qps,
        met(floor.map(|(_, q)| leased_qps / q >= 0.6)),
        per_leased_query(slices1 - slices0),
        (slices3 - slices2) as f64 / (leased_sent as f64).max(1.0),
    )?;
    let (lat, qps) = versus(latency.median(2), off_qps);
    writeln!(
        table,
        "| pgdp, one durable commit per query (`--lease-queries 1`) | {:.3} | {:.2}× | {lat} | | {off_qps:.0} | {:.2} | {qps} | | {:.3} / {:.3} |",
        latency.median(2),
        latency.ratio(2, 0),
        off_qps / direct_qps,
        per_query(alone1 - alone0),
        (alone4 - alone2) as f64 / (off_sent as f64).max(1.0),
    )?;
    let (lat, qps) = versus(latency.median(4), child_qps);
    writeln!(
        table,
        "| pgdp serve, a process of its own (leases on, one worker thread per core) | {:.3} | {:.2}× | {lat} | ≤ 1.3× {} | {child_qps:.0} | {:.2} | {qps} | ≥ 0.6 {} | |",
        latency.median(4),
        latency.ratio(4, 0),
        met(floor.map(|(ms, _)| latency.median(4) / ms <= 1.3)),
        child_qps / direct_qps,
        met(floor.map(|(_, q)| child_qps / q >= 0.6)),
    )?;
    let (lat, qps) = versus(latency.median(3), one_qps);
    writeln!(
        table,
        "| pgdp serve `--worker-threads 1` (a process of its own, leases on) | {:.3} | {:.2}× | {lat} | ≤ 1.3× {} | {one_qps:.0} | {:.2} | {qps} | ≥ 0.6 {} | |",
        latency.median(3),
        latency.ratio(3, 0),
        met(floor.map(|(ms, _)| latency.median(3) / ms <= 1.3)),
        one_qps / direct_qps,
        met(floor.map(|(_, q)| one_qps / q >= 0.6)),
    )?;
    match cpu {
        Some(us) => writeln!(
            table,
            "\npgdp's CPU per tiny DP query: {us:.0} µs (user + system time of a separate `pgdp serve` process over {cpu_queries} queries from one client, leases on; target ≤ 100 µs {}).",
            mark(us <= 100.0)
        )?,
        None => writeln!(
            table,
            "\npgdp's CPU per tiny DP query: not measured (no /proc/<pid>/stat on this system)."
        )?,
    }
    if let Some(us) = cpu_one {
        writeln!(
            table,
            "\nThe same with `--worker-threads 1`: {us:.0} µs ({}).",
            mark(us <= 100.0)
        )?;
    }
    writeln!(
        table,
        "\npgdp's overhead over the direct query at one client: {:.3} ms with leases, {:.3} ms with one durable commit per query; the ledger work leases take off each query's path: {:.3} ms. Errors during the throughput windows: {leased_errors} with leases, {off_errors} without, {child_errors} from the process of its own, {one_errors} from the one with one worker thread.",
        latency.median(1) - latency.median(0),
        latency.median(2) - latency.median(0),
        latency.median(2) - latency.median(1),
    )?;
    eprint!("{table}");
    let path = s.out.join("benches/leases.md");
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&path, &table)?;
    eprintln!("wrote {}", path.display());
    Ok(())
}

/// Tiny DP queries sent from one client to a `pgdp serve` process for figure 9's CPU figure.
const CPU_QUERIES: usize = 5_000;

/// A `pgdp serve` process of the bench's own (the bench policy, the upstream `demo`, the run's
/// ledger, `extra` arguments), killed and its policy file removed when dropped.
struct ServeChild {
    child: std::process::Child,
    port: u16,
    policy: std::path::PathBuf,
}

impl ServeChild {
    async fn start(demo: &str, ledger: &LedgerDb, extra: &[&str]) -> Res<ServeChild> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let policy = std::env::temp_dir().join(format!(
            "pgdp_bench_serve_{}_{port}.yaml",
            std::process::id()
        ));
        std::fs::write(&policy, bench_policy_text()?)?;
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_pgdp"))
            .arg("serve")
            .arg("--policy")
            .arg(&policy)
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(["--upstream", demo, "--ledger", &ledger.dsn])
            .args(extra)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()?;
        let serve = ServeChild {
            child,
            port,
            policy,
        };
        serve.connect().await?;
        Ok(serve)
    }

    /// A client of the process (waiting up to a minute for it to listen).
    async fn connect(&self) -> Res<Client> {
        let started = Instant::now();
        loop {
            match connect(&self.dsn()).await {
                Ok(client) => return Ok(client),
                Err(e) if started.elapsed() > Duration::from_secs(60) => {
                    return Err(fail(format!("pgdp serve did not start: {e}")))
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }

    fn dsn(&self) -> String {
        proxy_dsn(self.port)
    }
}

impl Drop for ServeChild {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.policy);
    }
}

/// pgdp's CPU (user + system, µs) per DP query of `template`: a `pgdp serve` process of its own
/// (the bench policy, the upstream `demo`, the run's ledger, `extra` arguments) answers `queries`
/// of them from one client after a warm-up, and its CPU time is read from `/proc/<pid>/stat`
/// before and after. `None` where that file does not exist.
async fn pgdp_cpu_per_query(
    demo: &str,
    ledger: &LedgerDb,
    template: &str,
    queries: usize,
    extra: &[&str],
) -> Res<Option<f64>> {
    let serve = ServeChild::start(demo, ledger, extra).await?;
    let child = &serve.child;
    let measured = async {
        let client = serve.connect().await?;
        for _ in 0..queries.min(200) {
            client.simple_query(&fresh(template)).await?;
        }
        let Some(before) = cpu_seconds(child.id())? else {
            return Ok(None);
        };
        for _ in 0..queries {
            DP_QUERIES.fetch_add(1, Ordering::Relaxed);
            client.simple_query(&fresh(template)).await?;
        }
        let Some(after) = cpu_seconds(child.id())? else {
            return Ok(None);
        };
        Res::Ok(Some((after - before) * 1e6 / queries as f64))
    }
    .await;
    drop(serve);
    measured
}

/// User + system CPU seconds of process `pid` (every thread, live or ended), from
/// `/proc/<pid>/stat`; `None` where that file does not exist.
fn cpu_seconds(pid: u32) -> Res<Option<f64>> {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return Ok(None);
    };
    // Fields after the command name in parentheses: state is field 3, utime 14, stime 15.
    let after_name = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .ok_or_else(|| fail("unreadable /proc/<pid>/stat"))?;
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let ticks = |i: usize| -> Res<f64> {
        Ok(fields
            .get(i - 3)
            .ok_or_else(|| fail("short /proc/<pid>/stat"))?
            .parse::<f64>()?)
    };
    Ok(Some((ticks(14)? + ticks(15)?) / clock_ticks_per_second()))
}

/// The kernel's clock ticks per second (`getconf CLK_TCK`; 100 if that cannot be run).
fn clock_ticks_per_second() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|t| t.trim().parse::<f64>().ok())
        .filter(|t| *t > 0.0)
        .unwrap_or(100.0)
}

/// A process-local TCP forwarder to the upstream named by the DSN `upstream`: every connection
/// accepted is piped byte for byte to a new connection to the upstream, and nothing else. The
/// floor of any proxy on this machine: one more hop and two more socket copies per message, no
/// parsing. Returns a DSN that reaches the upstream through it, or `None` when the upstream is
/// not reached over TCP (a Unix socket).
async fn forwarder(upstream: &str) -> Res<Option<String>> {
    let config: tokio_postgres::Config = upstream.parse()?;
    let (Some(tokio_postgres::config::Host::Tcp(host)), port) = (
        config.get_hosts().first().cloned(),
        config.get_ports().first().copied().unwrap_or(5432),
    ) else {
        return Ok(None);
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let local = listener.local_addr()?;
    let target = format!("{host}:{port}");
    tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            let target = target.clone();
            tokio::spawn(async move {
                if let Ok(mut outbound) = tokio::net::TcpStream::connect(&target).await {
                    let _ = inbound.set_nodelay(true);
                    let _ = outbound.set_nodelay(true);
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    });
    let mut dsn = format!("host=127.0.0.1 port={}", local.port());
    if let Some(user) = config.get_user() {
        dsn.push_str(&format!(" user='{user}'"));
    }
    if let Some(password) = config.get_password() {
        dsn.push_str(&format!(
            " password='{}'",
            String::from_utf8_lossy(password)
        ));
    }
    if let Some(dbname) = config.get_dbname() {
        dsn.push_str(&format!(" dbname='{dbname}'"));
    }
    Ok(Some(dsn))
}

/// Figure 2: each query of [`PRIVACY`] plain, rewritten and sent directly, through pgdp, and
/// its floor, interleaved; their plans go to `plans` (not in smoke runs).
async fn privacy_figure(
    s: &Settings,
    proxy: &Client,
    direct: &Client,
    shared: &Shared,
    secret: &str,
    plans: &mut String,
) -> Res<Vec<Privacy>> {
    let mut privacy = Vec::new();
    for (query, floor, target) in &PRIVACY {
        let plain = query.template.replace("{n}", "0");
        let sql = rewritten(proxy, shared, secret, query.template).await?;
        let series = series(
            s,
            &[
                Way::Direct(direct, &plain),
                Way::Direct(direct, &sql),
                Way::Proxy(proxy, query.template),
                Way::Direct(direct, floor),
            ],
        )
        .await?;
        eprintln!(
            "  {:<34} plain {:>9.2} ms  rewritten {:>9.2} ms  pgdp {:>9.2} ms  floor {:>9.2} ms  {:.2}x",
            query.label,
            series.median(0),
            series.median(1),
            series.median(2),
            series.median(3),
            series.ratio(2, 0)
        );
        if !s.smoke {
            explain_into(
                plans,
                direct,
                query.label,
                &[("plain", &plain), ("rewritten", &sql), ("floor", floor)],
            )
            .await?;
        }
        privacy.push(Privacy {
            label: query.label,
            target: *target,
            series,
        });
    }
    Ok(privacy)
}

/// The table of figure 2 and the note on its floor.
fn privacy_table(r: &mut String, privacy: &[Privacy]) -> Res<()> {
    writeln!(r, "| query | plain ms | rewritten SQL direct ms | pgdp ms | floor ms | rewrite / plain | pgdp / plain | floor / plain | target | |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")?;
    for p in privacy {
        let ratio = p.series.ratio(2, 0);
        writeln!(
            r,
            "| {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.2} | {:.2} | {:.2} | ≤ {} | {} |",
            p.label,
            p.series.median(0),
            p.series.median(1),
            p.series.median(2),
            p.series.median(3),
            p.series.ratio(1, 0),
            ratio,
            p.series.ratio(3, 0),
            p.target,
            mark(ratio <= p.target)
        )?;
    }
    writeln!(r, "\nFloor: the per-unit aggregation of the same query written by hand (no scaling of units over the row cap, no ranking of a unit's groups; the join aggregates visits by person before joining), sent directly.")?;
    Ok(())
}

/// `--privacy`: figure 2 alone at every scale of the run, written to `benches/privacy.md`, with
/// the plans to `benches/plans-s<N>.txt` (figure 8's plans are written by a full run only).
async fn privacy_only(s: &Settings, admin: &Client, ledger: &LedgerDb) -> Res<()> {
    let machine = machine(admin).await?;
    let mut report = format!(
        "Cost of privacy (figure 2) alone: `{}`\n\n- Machine: {}, {} cores, {:.1} GiB, Linux {}; load average at start {}\n- Upstream on the same machine: {}\n- Run: {}; latencies are medians of {}–{} interleaved runs (3–{} above scale 1)\n",
        s.command,
        machine.cpu,
        machine.cores,
        machine.memory_gib,
        machine.kernel,
        machine.load,
        machine.postgres,
        machine.date,
        s.runs_min,
        s.runs_max,
        s.runs_max
    );
    for &scale in &s.scales {
        eprintln!("scale {scale}: demo data");
        let demo = demo_database(&s.admin_dsn, admin, scale).await?;
        let running = start_server(&demo, ledger).await?;
        let shared = running.shared();
        let secret = shared.secret().await?;
        let proxy = connect(&proxy_dsn(running.addr.port())).await?;
        let direct = connect(&demo).await?;
        // Larger scales take seconds per query: fewer runs, as in a full run.
        let fewer = Settings {
            runs_min: if scale > 1 {
                s.runs_min.min(3)
            } else {
                s.runs_min
            },
            ..s.clone()
        };
        eprintln!("scale {scale}: 2. cost of privacy");
        let mut plans = String::new();
        let privacy = privacy_figure(&fewer, &proxy, &direct, &shared, secret, &mut plans).await?;
        writeln!(report, "\n### Scale {scale}\n")?;
        privacy_table(&mut report, &privacy)?;
        if !s.smoke {
            std::fs::write(s.out.join(format!("benches/plans-s{scale}.txt")), &plans)?;
        }
    }
    let path = s.out.join("benches/privacy.md");
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&path, &report)?;
    eprint!("{report}");
    eprintln!("wrote {}", path.display());
    Ok(())
}

/// Latency of one single-row commit on the upstream server, with `synchronous_commit` off and
/// on, in a table of the bench's own ledger database. pgdp's ledger commits twice per DP query:
/// the charge, durably, before the upstream runs the query, and the replay entry with the outcome
/// after the release, with `synchronous_commit` off.
async fn ledger_commit(s: &Settings, ledger: &LedgerDb) -> Res<Series> {
    let off = connect(&ledger.dsn).await?;
    let on = connect(&ledger.dsn).await?;
    off.batch_execute(
        "CREATE TABLE IF NOT EXISTS bench_commit (id int PRIMARY KEY, n bigint); \
         INSERT INTO bench_commit VALUES (1, 0) ON CONFLICT DO NOTHING",
    )
    .await?;
    off.batch_execute("SET synchronous_commit = off").await?;
    on.batch_execute("SET synchronous_commit = on").await?;
    let sql = "UPDATE bench_commit SET n = n + 1 WHERE id = 1";
    series(s, &[Way::Direct(&off, sql), Way::Direct(&on, sql)]).await
}

/// Queries per second over the measurement window with `clients` concurrent clients.
/// `is_proxy`: connect to pgdp and give each query a fresh alias.
async fn load_test(
    s: &Settings,
    dsn: &str,
    template: &str,
    is_proxy: bool,
    clients: usize,
) -> Res<(f64, u64)> {
    let connections = if is_proxy {
        clients
    } else {
        clients.min(DIRECT_CONNECTIONS_MAX)
    };
    let mut pool = Vec::new();
    for _ in 0..connections {
        pool.push(Arc::new(connect(dsn).await?));
    }
    let stop = Arc::new(AtomicBool::new(false));
    let counting = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for i in 0..clients {
        let client = Arc::clone(&pool[i % pool.len()]);
        let (stop, counting, done, errors) = (
            Arc::clone(&stop),
            Arc::clone(&counting),
            Arc::clone(&done),
            Arc::clone(&errors),
        );
        let template = template.to_string();
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let sql = if is_proxy {
                    DP_QUERIES.fetch_add(1, Ordering::Relaxed);
                    fresh(&template)
                } else {
                    template.clone()
                };
                let ok = client.simple_query(&sql).await.is_ok();
                if counting.load(Ordering::Relaxed) {
                    if ok {
                        done.fetch_add(1, Ordering::Relaxed);
                    } else {
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }));
    }
    // A short ramp-up, then the window.
    tokio::time::sleep(s.throughput_window / 4).await;
    counting.store(true, Ordering::Relaxed);
    let started = Instant::now();
    tokio::time::sleep(s.throughput_window).await;
    counting.store(false, Ordering::Relaxed);
    let elapsed = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        let _ = t.await;
    }
    Ok((
        done.load(Ordering::Relaxed) as f64 / elapsed.as_secs_f64(),
        errors.load(Ordering::Relaxed),
    ))
}

// ---------------------------------------------------------------------------------------------
// Figure 4: front end

struct Case {
    name: String,
    sql: String,
    params: Vec<Option<String>>,
    accepted: bool,
}

/// The golden corpus (tests/cases/README.md describes the format).
fn corpus() -> Res<Vec<Case>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cases");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "case"))
        .collect();
    files.sort();
    let mut cases = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file)?;
        let mut current: Option<Case> = None;
        for line in text.lines() {
            let Some(rest) = line.strip_prefix("-- ") else {
                continue;
            };
            let Some((key, value)) = rest.split_once(':') else {
                continue;
            };
            let value = value.trim();
            match key {
                "name" => {
                    cases.extend(current.take());
                    current = Some(Case {
                        name: value.to_string(),
                        sql: String::new(),
                        params: Vec::new(),
                        accepted: false,
                    });
                }
                "sql" => {
                    if let Some(c) = current.as_mut() {
                        if !c.sql.is_empty() {
                            c.sql.push(' ');
                        }
                        c.sql.push_str(value);
                    }
                }
                "param" => {
                    if let Some(c) = current.as_mut() {
                        c.params.push((value != "NULL").then(|| value.to_string()));
                    }
                }
                "expect" => {
                    if let Some(c) = current.as_mut() {
                        c.accepted = true;
                    }
                }
                _ => {}
            }
        }
        cases.extend(current.take());
    }
    Ok(cases)
}

/// classify + analyze + rewrite, as the session runs them.
/// Stages of the front end, timed cumulatively: classify (parse), + analyze, + rewrite.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Stage {
    Classify,
    Analyze,
    Rewrite,
}

/// Runs the front end on `case` up to and including `stage`; whether every stage run succeeded.
fn front_end(policy: &Policy, case: &Case, stage: Stage) -> bool {
    let Ok(statements) = classify::classify(&case.sql) else {
        return false;
    };
    let [Statement::Query(query)] = statements.as_slice() else {
        return false;
    };
    if stage == Stage::Classify {
        std::hint::black_box(&statements);
        return true;
    }
    let ctx = Context {
        policy,
        search_path: vec![pgdp::tools::demo::SCHEMA.to_string()],
    };
    let Ok(plan) = analyze::analyze(query, &ctx) else {
        return false;
    };
    if stage == Stage::Analyze {
        std::hint::black_box(&plan);
        return true;
    }
    let rewritten = rewrite::rewrite(&plan, &case.params, "bench-secret");
    std::hint::black_box(&rewritten);
    rewritten.is_ok()
}

/// Median µs per run of `case` up to `stage`, criterion-style: warm up, size a sample to a minimum
/// time, take the median over samples.
fn time_front_end(s: &Settings, policy: &Policy, case: &Case, stage: Stage) -> f64 {
    let mut iterations = 1u32;
    loop {
        let started = Instant::now();
        for _ in 0..iterations {
            std::hint::black_box(front_end(policy, case, stage));
        }
        if started.elapsed() >= s.frontend_sample_time || iterations >= 1 << 20 {
            break;
        }
        iterations *= 2;
    }
    let mut samples = Vec::new();
    for _ in 0..s.frontend_samples {
        let started = Instant::now();
        for _ in 0..iterations {
            std::hint::black_box(front_end(policy, case, stage));
        }
        samples.push(started.elapsed().as_secs_f64() * 1e6 / f64::from(iterations));
    }
    median(&samples)
}

/// Median µs per query of each case (see [`time_front_end`]); for accepted cases also the time up
/// to classify and up to analyze.
fn frontend(s: &Settings) -> Res<Frontend> {
    let policy = pgdp::policy::parse(DEMO_POLICY).map_err(|e| fail(format!("{e:?}")))?;
    let mut out = Frontend {
        accepted: Vec::new(),
        refused: Vec::new(),
        stages: Vec::new(),
    };
    for case in corpus()? {
        let ok = front_end(&policy, &case, Stage::Rewrite);
        let us = time_front_end(s, &policy, &case, Stage::Rewrite);
        if ok && case.accepted {
            out.stages.push([
                time_front_end(s, &policy, &case, Stage::Classify),
                time_front_end(s, &policy, &case, Stage::Analyze),
                us,
            ]);
            out.accepted.push((case.name, us));
        } else {
            out.refused.push((case.name, us));
        }
    }
    if out.accepted.is_empty() {
        return Err(fail("no accepted case in tests/cases"));
    }
    Ok(out)
}

/// Noise and release time per released row, on exact rows read once from the upstream.
async fn release_cost(s: &Settings, demo: &str, running: &Running) -> Res<Vec<ReleaseCost>> {
    let direct = connect(demo).await?;
    let shared = running.shared();
    let policy = &shared.policy;
    let mut out = Vec::new();
    for (query, epsilon) in [
        (&WIDE, WIDE_EPSILON),
        (&WIDE, 1.0),
        (&PRIVACY[2].0, 1.0),
        (&PRIVACY[3].0, 1.0),
    ] {
        let sql = query.template.replace("{n}", "0");
        let statements = classify::classify(&sql)?;
        let [Statement::Query(ast)] = statements.as_slice() else {
            return Err(fail("not one query"));
        };
        let ctx = Context {
            policy,
            search_path: vec![pgdp::tools::demo::SCHEMA.to_string()],
        };
        let plan = analyze::analyze(ast, &ctx)?;
        let rw = rewrite::rewrite(&plan, &[], shared.secret().await?)?;
        let budget = Budget {
            epsilon,
            delta: 1e-7,
            mechanism: Mechanism::Laplace,
        };
        let mechanisms = release::mechanisms(&plan, &rw, budget)?;
        let mut domains = release::PublicDomains::new();
        if plan.keys_public() {
            for part in rewrite::domain::public_domain(&plan, &[])? {
                let rows = match part.sql() {
                    Some(sql) => Some(simple_rows(&direct, sql.as_str()).await?),
                    None => None,
                };
                domains.push(part.into_combinations(rows)?);
            }
        }
        let exact = release::PrivateRows::new(simple_rows(&direct, &rw.sql).await?);
        let mut times = Vec::new();
        let mut released = 0;
        for run in 0..s.release_runs {
            let mut seed = [0u8; 32];
            seed[..8].copy_from_slice(&(run as u64).to_le_bytes());
            let mut rng = ChaCha20Rng::from_seed(seed);
            let started = Instant::now();
            let r = release::release(&plan, &rw, &mechanisms, &exact, &domains, false, &mut rng)?;
            times.push(ms(started.elapsed()));
            released = r.rows().len();
        }
        out.push(ReleaseCost {
            label: format!("{} (ε = {epsilon})", query.label),
            candidates: exact.len(),
            released,
            ms: median(&times),
        });
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// Figure 5: memory of a `pgdp serve` child process

fn rss_kib(pid: u32) -> u64 {
    read(&format!("/proc/{pid}/status"))
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Kills the child when dropped.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn memory_figure(s: &Settings, demo: &str, ledger: &LedgerDb) -> Res<Memory> {
    let dir =
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let policy_path = dir.join("policy.yaml");
    std::fs::write(&policy_path, bench_policy_text()?)?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let log = std::fs::File::create(dir.join("pgdp.log"))?;
    let child = Child(
        std::process::Command::new(env!("CARGO_BIN_EXE_pgdp"))
            .arg("serve")
            .arg("--policy")
            .arg(&policy_path)
            .arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .arg("--upstream")
            .arg(demo)
            .arg("--ledger")
            .arg(&ledger.dsn)
            .env("RUST_LOG", "warn")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()?,
    );
    let pid = child.0.id();
    let dsn = proxy_dsn(port);
    let started = Instant::now();
    let client = loop {
        match connect(&dsn).await {
            Ok(c) => break c,
            Err(e) if started.elapsed() > Duration::from_secs(60) => {
                return Err(fail(format!("pgdp serve did not come up: {e}")))
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    };
    // Idle: one small query done (pools and caches warm), then quiet.
    DP_QUERIES.fetch_add(1, Ordering::Relaxed);
    client.simple_query(&fresh(OVERHEAD[0].0.template)).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let idle_kib = rss_kib(pid);

    // Many idle connections (authenticated with SCRAM, a few at a time).
    let idle_dsns: Vec<String> = (0..IDLE_ANALYSTS)
        .map(|k| dsn.replace("user=analyst", &format!("user={IDLE_ANALYST_PREFIX}{k}")))
        .collect();
    let mut idle = Vec::new();
    let mut connect_failures = 0;
    let mut pending = Vec::new();
    for i in 0..s.idle_connections {
        pending.push(connect(&idle_dsns[i % IDLE_ANALYSTS]));
        if pending.len() == 8 || i + 1 == s.idle_connections {
            for r in futures::future::join_all(pending.drain(..)).await {
                match r {
                    Ok(c) => idle.push(c),
                    Err(_) => connect_failures += 1,
                }
            }
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let connections_kib = rss_kib(pid);
    drop(idle);
    tokio::time::sleep(Duration::from_millis(500)).await;

    // Releasing many groups: sample the resident size while the query runs.
    client
        .batch_execute(&format!("SET pgdp.epsilon = {WIDE_EPSILON}"))
        .await?;
    let peak = Arc::new(AtomicU64::new(0));
    let sampling = Arc::new(AtomicBool::new(true));
    let sampler = {
        let (peak, sampling) = (Arc::clone(&peak), Arc::clone(&sampling));
        tokio::spawn(async move {
            while sampling.load(Ordering::Relaxed) {
                peak.fetch_max(rss_kib(pid), Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };
    DP_QUERIES.fetch_add(1, Ordering::Relaxed);
    let t = Instant::now();
    let released = client.simple_query(&fresh(MANY.template)).await?;
    let release_ms = ms(t.elapsed());
    sampling.store(false, Ordering::Relaxed);
    let _ = sampler.await;
    let released_rows = released
        .iter()
        .filter(|m| matches!(m, SimpleQueryMessage::Row(_)))
        .count();
    drop(released);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let release_after_kib = rss_kib(pid);

    drop(client);
    drop(child);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(Memory {
        idle_kib,
        release_peak_kib: peak.load(Ordering::Relaxed),
        release_after_kib,
        released_rows,
        release_ms,
        idle_connections: s.idle_connections,
        connections_kib,
        connect_failures,
    })
}

// ---------------------------------------------------------------------------------------------
// Report

fn mark(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "**missed**"
    }
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

#[allow(clippy::too_many_arguments)] // one call site; a struct would only rename the arguments
fn report(
    s: &Settings,
    m: &Machine,
    frontend: &Frontend,
    releases: &[ReleaseCost],
    memory: &Option<(u32, Memory)>,
    scales: &[ScaleResult],
    charges: u64,
    sent: u64,
) -> Res<String> {
    let mut r = String::new();
    writeln!(
        r,
        "Command: `{}`{}\n",
        s.command,
        if s.smoke {
            " (smoke mode: few runs, short windows; not for reading)"
        } else {
            ""
        }
    )?;
    writeln!(
        r,
        "- Machine: {}, {} cores, {:.1} GiB, Linux {}; load average at start {}",
        m.cpu, m.cores, m.memory_gib, m.kernel, m.load
    )?;
    writeln!(r, "- Upstream on the same machine: {}", m.postgres)?;
    writeln!(r, "- Run: {}; latencies are medians of {}–{} interleaved runs (order alternating, one warm-up discarded), with the baseline measured in the same run", m.date, s.runs_min, s.runs_max)?;
    writeln!(
        r,
        "- Replay check: the ledger holds {charges} charges for {sent} DP queries sent ({})",
        if charges == sent {
            "none was answered from the replay cache"
        } else {
            "SOME WERE REPLAYED"
        }
    )?;
    writeln!(r, "- Policy: policies/demo.yaml with a larger budget (ε 10^6 total, δ 0.5, ε ≤ 100 per query); queries at ε = 1, δ = 1e-7, Laplace unless stated\n")?;
    writeln!(
        r,
        "![overhead and cost-of-privacy ratios](benches/ratios.png)\n"
    )?;

    for sc in scales {
        writeln!(
            r,
            "### Scale {} ({} people, {} visits)\n",
            sc.scale, sc.people, sc.visits
        )?;
        writeln!(
            r,
            "**1. Proxy overhead** (pgdp vs. its rewritten SQL sent directly, one client)\n"
        )?;
        writeln!(
            r,
            "| query | direct ms | pgdp ms | ratio | target | |\n|---|---:|---:|---:|---:|---|"
        )?;
        for o in &sc.overhead {
            let ratio = o.series.ratio(1, 0);
            writeln!(
                r,
                "| {} | {:.2} | {:.2} | {:.3} | ≤ {} | {} |",
                o.label,
                o.series.median(0),
                o.series.median(1),
                ratio,
                o.target,
                mark(ratio <= o.target)
            )?;
        }
        let c = &sc.ledger_commit;
        writeln!(r, "\nOne single-row commit on this server: {:.2} ms with synchronous_commit = on, {:.2} ms with off (pgdp's ledger commits twice per DP query: the charge durably, by design, and the replay entry with the outcome with synchronous_commit off).\n", c.median(1), c.median(0))?;
        writeln!(
            r,
            "**2. Cost of privacy** (pgdp vs. the plain aggregate sent directly)\n"
        )?;
        privacy_table(&mut r, &sc.privacy)?;
        if !sc.dup.is_empty() {
            writeln!(r, "\n**8. Non-unique unit column** (`{DUP_TABLE}`: {DUP_PEOPLE} people, 1 to 3 identical rows each, no key or index; at most 3 rows and 1 group per person)\n")?;
            writeln!(r, "| query | plain ms | pgdp ms | floor ms | SmartNoise SQL ms | pgdp / plain | floor / plain | pgdp / SmartNoise | target | |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")?;
            for d in &sc.dup {
                let (smartnoise, versus, met) = match d.smartnoise_ms {
                    Some(ms) => {
                        let ratio = d.series.median(1) / ms;
                        (
                            format!("{ms:.1}"),
                            format!("{ratio:.2}"),
                            mark(ratio <= 0.5),
                        )
                    }
                    None => ("not run".into(), "".into(), ""),
                };
                writeln!(
                    r,
                    "| {} | {:.1} | {:.1} | {:.1} | {smartnoise} | {:.2} | {:.2} | {versus} | ≤ 0.5 | {met} |",
                    d.label,
                    d.series.median(0),
                    d.series.median(1),
                    d.series.median(2),
                    d.series.ratio(1, 0),
                    d.series.ratio(2, 0),
                )?;
            }
            writeln!(r, "\nSmartNoise SQL runs `benches/smartnoise.py` (same database, bounds and caps; ε = 1, δ = 1e-7) with the Python named by `{SMARTNOISE_ENV}`, after pgdp's series, not interleaved with them.")?;
        }
        writeln!(r, "\n**3. Throughput** (queries per second over {:.1} s; direct uses at most {DIRECT_CONNECTIONS_MAX} connections, shared by more clients)\n", s.throughput_window.as_secs_f64())?;
        for t in &sc.throughput {
            writeln!(r, "{}:\n\n| clients | direct q/s | pgdp q/s | ratio | errors |\n|---:|---:|---:|---:|---:|", t.label)?;
            for (clients, d, p, e) in &t.levels {
                let target = if *clients == 32 {
                    format!(" ({}, target ≥ 0.9)", mark(p / d >= 0.9))
                } else {
                    String::new()
                };
                writeln!(
                    r,
                    "| {clients} | {d:.1} | {p:.1} | {:.2}{target} | {e} |",
                    p / d
                )?;
            }
            r.push('\n');
        }
        writeln!(
            r,
            "**6. Scaling** (DP through pgdp vs. the plain aggregate directly)\n"
        )?;
        writeln!(
            r,
            "| query | rows | plain ms | pgdp ms | ratio |\n|---|---:|---:|---:|---:|"
        )?;
        for x in &sc.rows {
            writeln!(
                r,
                "| {} | {} | {:.1} | {:.1} | {:.2} |",
                x.label,
                x.size,
                x.series.median(0),
                x.series.median(1),
                x.series.ratio(1, 0)
            )?;
        }
        writeln!(r, "\n| query (demo.visits) | candidate groups | released | plain ms | pgdp ms | ratio |\n|---|---:|---:|---:|---:|---:|")?;
        for x in &sc.groups {
            writeln!(
                r,
                "| {} | {} | {} | {:.1} | {:.1} | {:.2} |",
                x.label,
                x.size,
                x.series.rows[1],
                x.series.median(0),
                x.series.median(1),
                x.series.ratio(1, 0)
            )?;
        }
        r.push('\n');
    }

    writeln!(r, "### Scale-independent figures\n")?;
    let accepted: Vec<f64> = frontend.accepted.iter().map(|(_, us)| *us).collect();
    let refused: Vec<f64> = frontend.refused.iter().map(|(_, us)| *us).collect();
    let slowest = frontend.accepted.iter().max_by(|a, b| a.1.total_cmp(&b.1));
    let med = median(&accepted);
    writeln!(r, "**4. Front end**: classify + analyze + rewrite over the golden corpus (tests/cases/*.case), median of {} samples per case\n", s.frontend_samples)?;
    writeln!(
        r,
        "| cases | median µs | p90 µs | max µs | target | |\n|---|---:|---:|---:|---:|---|"
    )?;
    writeln!(
        r,
        "| {} accepted | {:.1} | {:.1} | {:.1} | ≤ 50 (median) | {} |",
        accepted.len(),
        med,
        percentile(&accepted, 0.9),
        percentile(&accepted, 1.0),
        mark(med <= 50.0)
    )?;
    writeln!(
        r,
        "| {} refused | {:.1} | {:.1} | {:.1} | | |",
        refused.len(),
        median(&refused),
        percentile(&refused, 0.9),
        percentile(&refused, 1.0)
    )?;
    if let Some((name, us)) = slowest {
        writeln!(r, "\nSlowest accepted case: `{name}` ({us:.1} µs).")?;
    }
    let stage =
        |f: fn(&[f64; 3]) -> f64| median(&frontend.stages.iter().map(f).collect::<Vec<_>>());
    writeln!(
        r,
        "\nAccepted cases by stage (medians of the per-case differences, µs): classify (parse) {:.1}, analyze {:.1}, rewrite (build the upstream SQL and check its tokens) {:.1}.",
        stage(|t| t[0]),
        stage(|t| t[1] - t[0]),
        stage(|t| t[2] - t[1]),
    )?;
    writeln!(
        r,
        "\nNoise and release (release::release on exact rows read once; median of {} runs):\n",
        s.release_runs
    )?;
    writeln!(r, "| query | candidate groups | released | ms | µs per released row | µs per candidate |\n|---|---:|---:|---:|---:|---:|")?;
    for x in releases {
        writeln!(
            r,
            "| {} | {} | {} | {:.1} | {:.2} | {:.2} |",
            x.label,
            x.candidates,
            x.released,
            x.ms,
            x.ms * 1e3 / x.released.max(1) as f64,
            x.ms * 1e3 / x.candidates.max(1) as f64
        )?;
    }
    if let Some((scale, mem)) = memory {
        writeln!(
            r,
            "\n**5. Memory** (`pgdp serve` child process, VmRSS, scale {scale})\n"
        )?;
        writeln!(
            r,
            "| state | resident MiB | target | |\n|---|---:|---:|---|"
        )?;
        writeln!(
            r,
            "| idle (after one query) | {:.1} | | |",
            mib(mem.idle_kib)
        )?;
        let ok = mib(mem.connections_kib) <= 64.0 && mem.connect_failures == 0;
        writeln!(
            r,
            "| {} idle connections over 4 analysts ({} failed to connect) | {:.1} | ≤ 64 | {} |",
            mem.idle_connections,
            mem.connect_failures,
            mib(mem.connections_kib),
            if mem.idle_connections < 500 {
                "(smoke: fewer connections)"
            } else {
                mark(ok)
            }
        )?;
        writeln!(
            r,
            "| peak while releasing {} groups of `{}` ({:.0} ms, ε = {WIDE_EPSILON}) | {:.1} | | |",
            mem.released_rows,
            MANY.label,
            mem.release_ms,
            mib(mem.release_peak_kib)
        )?;
        writeln!(
            r,
            "| after that release | {:.1} | | |",
            mib(mem.release_after_kib)
        )?;
    }
    Ok(r)
}

const BEGIN: &str =
    "<!-- bench:begin (generated by benches/proxy/main.rs; edits inside are overwritten) -->";
const END: &str = "<!-- bench:end -->";

/// Replaces the generated section of `path` (or writes a file holding only it).
fn write_report(path: &Path, generated: &str) -> Res<()> {
    let section = format!("{BEGIN}\n{generated}{END}");
    let text = match std::fs::read_to_string(path) {
        Ok(old) => match (old.find(BEGIN), old.find(END)) {
            (Some(b), Some(e)) if b < e => {
                format!("{}{section}{}", &old[..b], &old[e + END.len()..])
            }
            _ => format!("{old}\n{section}\n"),
        },
        Err(_) => format!("# pgdp benchmarks\n\n{section}\n"),
    };
    std::fs::write(path, text)?;
    Ok(())
}

fn plot_data(scales: &[ScaleResult]) -> plot::Data {
    let mut panels = Vec::new();
    let mut o = plot::Panel {
        title: "PROXY OVERHEAD: PGDP / REWRITTEN SQL DIRECT".into(),
        groups: Vec::new(),
        series: scales
            .iter()
            .map(|s| format!("SCALE {}", s.scale))
            .collect(),
    };
    for (i, (_, target)) in OVERHEAD.iter().enumerate() {
        o.groups.push(plot::Group {
            label: OVERHEAD_SHORT[i].into(),
            target: *target,
            values: scales
                .iter()
                .map(|s| s.overhead[i].series.ratio(1, 0))
                .collect(),
        });
    }
    panels.push(o);
    let mut p = plot::Panel {
        title: "COST OF PRIVACY: PGDP / PLAIN AGGREGATE DIRECT".into(),
        groups: Vec::new(),
        series: scales
            .iter()
            .map(|s| format!("SCALE {}", s.scale))
            .collect(),
    };
    for (i, (_, _, target)) in PRIVACY.iter().enumerate() {
        p.groups.push(plot::Group {
            label: PRIVACY_SHORT[i].into(),
            target: *target,
            values: scales
                .iter()
                .map(|s| s.privacy[i].series.ratio(2, 0))
                .collect(),
        });
    }
    panels.push(p);
    plot::Data { panels }
}
