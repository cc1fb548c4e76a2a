//! Utility benchmark: how far pgdp's released answers are from the true ones on the demo data.
//!
//! ```text
//! cargo run --release --example utility
//! ```
//!
//! Connects to `PGDP_UPSTREAM` (a DSN), or by default to `host=127.0.0.1 user=postgres
//! dbname=pgdp_demo`; creates that database and loads the demo dataset (scale 1) if it holds no
//! demo dataset yet (an existing one of any scale is used as it is). For each query below, at
//! ε = 1, δ = 1e-7, Laplace:
//! - the true answer is the analyst's SQL run directly on the upstream (no clamping, no caps);
//! - the DP answer goes through pgdp's own steps in process — classify, analyze, rewrite,
//!   mechanisms, the rewritten SQL on the upstream, release — [`RUNS`] times with different seeds
//!   (the exact pre-noise rows are read once: the rewrite is deterministic);
//! - per query it prints the median and 90th percentile, over released cells and runs, of the
//!   relative error `|dp − true| / max(|true|, 1)` of each aggregate cell of a group that exists
//!   in the true answer, and the fraction of true groups released (mean over runs);
//! - and, as `bias`, the median relative error of one release at ε = [`BIAS_EPSILON`], where the
//!   noise is negligible: what clamping to the policy's bounds and capping each person's
//!   contribution (`max_rows_per_unit`, `max_groups_per_unit`) cost on their own.
//!
//! The error includes that bias on purpose: it is what an analyst gets. A benchmark program, not
//! a test; it prints to stdout only.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use pgdp::dp::analyze::{self, Context, OutputSource};
use pgdp::dp::release::{self, Budget};
use pgdp::dp::rewrite;
use pgdp::output::Cell;
use pgdp::policy::{self, Mechanism};
use pgdp::session::classify::{self, Statement};
use rand::rngs::ChaCha20Rng;
use rand::SeedableRng;
use tokio_postgres::{Client, NoTls, SimpleQueryMessage};

/// Releases per query.
const RUNS: u64 = 20;

/// ε of the one extra release that measures the bias (the noise is then negligible, and partition
/// selection keeps nearly every group).
const BIAS_EPSILON: f64 = 1e6;

/// The default upstream.
const DEFAULT_DSN: &str = "host=127.0.0.1 user=postgres dbname=pgdp_demo";

const BUDGET: Budget = Budget {
    epsilon: 1.0,
    delta: 1e-7,
    mechanism: Mechanism::Laplace,
};

/// Representative analyst queries: (label, SQL).
const QUERIES: [(&str, &str); 21] = [
    ("count visits", "SELECT COUNT(*) FROM demo.visits"),
    ("sum cost", "SELECT SUM(cost) FROM demo.visits"),
    ("avg income", "SELECT AVG(income) FROM demo.people"),
    (
        "people by region",
        "SELECT region, COUNT(*) FROM demo.people GROUP BY region",
    ),
    (
        "avg income by education",
        "SELECT education, AVG(income) FROM demo.people GROUP BY education",
    ),
    (
        "stddev age by sex",
        "SELECT sex, STDDEV(age) FROM demo.people GROUP BY sex",
    ),
    (
        "people by age (selected)",
        "SELECT age, COUNT(*) FROM demo.people GROUP BY age",
    ),
    (
        "visits by diagnosis (sel.)",
        "SELECT diagnosis, COUNT(*) FROM demo.visits GROUP BY diagnosis",
    ),
    (
        "cost by clinic (sel.)",
        "SELECT clinic, SUM(cost), AVG(cost) FROM demo.visits GROUP BY clinic",
    ),
    (
        "patients by month (sel.)",
        "SELECT date_trunc('month', visit_date), COUNT(DISTINCT person_id) FROM demo.visits GROUP BY 1",
    ),
    (
        "avg cost by region (join)",
        "SELECT region, AVG(cost) FROM demo.visits JOIN demo.people USING (person_id) GROUP BY region",
    ),
    (
        "people by region name (pub.)",
        "SELECT r.name, COUNT(*) FROM demo.people p JOIN demo.regions r ON p.region = r.region GROUP BY r.name",
    ),
    (
        "women (CASE in SUM)",
        "SELECT SUM(CASE WHEN sex = 'F' THEN 1 ELSE 0 END) FROM demo.people",
    ),
    (
        "people by age band (CASE key)",
        "SELECT CASE WHEN age < 18 THEN 'child' WHEN age < 65 THEN 'adult' ELSE 'senior' END, COUNT(*) FROM demo.people GROUP BY 1",
    ),
    (
        "distinct clinics",
        "SELECT COUNT(DISTINCT clinic) FROM demo.visits",
    ),
    (
        "recent visits by clinic (CTE)",
        "WITH recent AS (SELECT * FROM demo.visits WHERE visit_date > DATE '2024-06-01') SELECT clinic, COUNT(*) FROM recent GROUP BY clinic",
    ),
    (
        "avg visits per person (subq.)",
        "SELECT AVG(n) FROM (SELECT person_id, LEAST(COUNT(*), 20) AS n FROM demo.visits GROUP BY person_id) t",
    ),
    (
        "visits-per-person histogram",
        "SELECT n, COUNT(*) FROM (SELECT person_id, LEAST(COUNT(*), 10) AS n FROM demo.visits GROUP BY person_id) t GROUP BY n",
    ),
    (
        "median cost (quantile)",
        "SELECT PERCENTILE_CONT(0.5) WITHIN GROUP (ORDER BY cost) FROM demo.visits",
    ),
    (
        "median income by region",
        "SELECT region, PERCENTILE_CONT(0.5) WITHIN GROUP (ORDER BY income) FROM demo.people GROUP BY region",
    ),
    (
        "min / max age (p1 / p99)",
        "SELECT MIN(age), MAX(age) FROM demo.people",
    ),
];

type Rows = Vec<Vec<Option<String>>>;

async fn connect(dsn: &str) -> Result<Client, tokio_postgres::Error> {
    let (client, connection) = tokio_postgres::connect(dsn, NoTls).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

async fn rows(client: &Client, sql: &str) -> Result<Rows, String> {
    let messages = client
        .simple_query(sql)
        .await
        .map_err(|e| format!("{sql}: {e}"))?;
    Ok(messages
        .into_iter()
        .filter_map(|m| match m {
            SimpleQueryMessage::Row(r) => {
                Some((0..r.len()).map(|i| r.get(i).map(str::to_string)).collect())
            }
            _ => None,
        })
        .collect())
}

/// Connects to the demo database, creating it and loading the dataset when needed.
async fn demo_client(dsn: &str) -> Result<Client, String> {
    let client = match connect(dsn).await {
        Ok(c) => c,
        Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::INVALID_CATALOG_NAME) => {
            let config: tokio_postgres::Config =
                dsn.parse().map_err(|e| format!("bad DSN: {e}"))?;
            let name = config
                .get_dbname()
                .unwrap_or(pgdp::tools::demo::DATABASE)
                .to_string();
            let admin = connect(&pgdp::tools::cluster::dsn_with_dbname(dsn, "postgres"))
                .await
                .map_err(|e| format!("cannot connect to create {name}: {e}"))?;
            admin
                .batch_execute(&format!(
                    "CREATE DATABASE \"{}\"",
                    name.replace('"', "\"\"")
                ))
                .await
                .map_err(|e| format!("cannot create {name}: {e}"))?;
            connect(dsn)
                .await
                .map_err(|e| format!("cannot connect to {name}: {e}"))?
        }
        Err(e) => return Err(format!("cannot connect to {dsn}: {e}")),
    };
    let marker = rows(
        &client,
        "SELECT pg_catalog.obj_description(oid, 'pg_namespace') FROM pg_catalog.pg_namespace WHERE nspname = 'demo'",
    )
    .await?;
    let loaded = marker
        .first()
        .and_then(|r| r[0].as_deref())
        .is_some_and(|m| m.starts_with("pgdp demo dataset"));
    if !loaded {
        println!("loading the demo dataset (scale 1) …");
        pgdp::tools::demo::load(&client, 1, |_| {})
            .await
            .map_err(|e| format!("cannot load the demo dataset: {e}"))?;
    }
    Ok(client)
}

fn cell_text(c: &Cell) -> Option<String> {
    match c {
        Cell::Null => None,
        Cell::Int(i) => Some(i.to_string()),
        Cell::Float(f) if f.fract() == 0.0 && f.abs() < 1e15 => Some(format!("{}", *f as i64)),
        Cell::Float(f) => Some(f.to_string()),
        Cell::Text(t) => Some(t.clone()),
        Cell::Bool(b) => Some(if *b { "t" } else { "f" }.into()),
    }
}

fn cell_number(c: &Cell) -> Option<f64> {
    match c {
        Cell::Int(i) => Some(*i as f64),
        Cell::Float(f) => Some(*f),
        _ => None,
    }
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[i]
}

struct Line {
    label: &'static str,
    true_groups: usize,
    released_fraction: f64,
    median: f64,
    p90: f64,
    bias: f64,
    cells: usize,
}

async fn measure(
    client: &Client,
    policy: &policy::Policy,
    label: &'static str,
    sql: &str,
) -> Result<Line, String> {
    let statements = classify::classify(sql).map_err(|e| format!("{label}: {e}"))?;
    let [Statement::Query(query)] = statements.as_slice() else {
        return Err(format!("{label}: not one query"));
    };
    let ctx = Context {
        policy,
        search_path: vec!["demo".into()],
    };
    let plan = analyze::analyze(query, &ctx).map_err(|e| format!("{label}: {e}"))?;
    let rw = rewrite::rewrite(&plan, &[], "utility-benchmark").map_err(|e| format!("{e}"))?;
    let mechanisms = release::mechanisms(&plan, &rw, BUDGET).map_err(|e| format!("{e}"))?;
    let mut domains = release::PublicDomains::new();
    if plan.keys_public() {
        for part in rewrite::domain::public_domain(&plan, &[]).map_err(|e| format!("{e}"))? {
            let values = match part.sql() {
                Some(sql) => Some(rows(client, sql.as_str()).await?),
                None => None,
            };
            domains.push(part.into_combinations(values).map_err(|e| format!("{e}"))?);
        }
    }
    let exact = release::PrivateRows::new(rows(client, &rw.sql).await?);

    // The true answer, in the same column order as the released one.
    let truth = rows(client, sql).await?;
    let key_columns: Vec<usize> = plan
        .outputs()
        .iter()
        .enumerate()
        .filter(|(_, o)| matches!(o.source, OutputSource::Key(_)))
        .map(|(i, _)| i)
        .collect();
    let value_columns: Vec<usize> = plan
        .outputs()
        .iter()
        .enumerate()
        .filter(|(_, o)| matches!(o.source, OutputSource::Aggregate(_)))
        .map(|(i, _)| i)
        .collect();
    let truth: BTreeMap<Vec<Option<String>>, Vec<Option<f64>>> = truth
        .into_iter()
        .map(|r| {
            let key = key_columns.iter().map(|&i| r[i].clone()).collect();
            let values = value_columns
                .iter()
                .map(|&i| r[i].as_deref().and_then(|t| t.parse().ok()))
                .collect();
            (key, values)
        })
        .collect();

    let prepared = Prepared {
        plan: &plan,
        rewrite: &rw,
        exact: &exact,
        domains: &domains,
    };
    let truth = Truth {
        groups: truth,
        key_columns,
        value_columns,
    };
    let noisy =
        compare(&prepared, &mechanisms, &truth, RUNS).map_err(|e| format!("{label}: {e}"))?;
    // Nearly no noise: what is left is the bias of clamping and contribution bounding.
    let nearly_exact = Budget {
        epsilon: BIAS_EPSILON,
        ..BUDGET
    };
    let bias_mechanisms =
        release::mechanisms(&plan, &rw, nearly_exact).map_err(|e| format!("{e}"))?;
    let bias =
        compare(&prepared, &bias_mechanisms, &truth, 1).map_err(|e| format!("{label}: {e}"))?;
    Ok(Line {
        label,
        true_groups: truth.groups.len(),
        released_fraction: noisy.fraction,
        median: percentile(&noisy.errors, 0.5),
        p90: percentile(&noisy.errors, 0.9),
        bias: percentile(&bias.errors, 0.5),
        cells: noisy.errors.len(),
    })
}

/// Relative errors of released cells (sorted) and the mean fraction of true groups released.
struct Comparison {
    errors: Vec<f64>,
    fraction: f64,
}

/// A query up to its exact pre-noise rows.
struct Prepared<'a> {
    plan: &'a analyze::Plan,
    rewrite: &'a rewrite::Rewrite,
    exact: &'a release::PrivateRows,
    domains: &'a release::PublicDomains,
}

/// The true answer: aggregate values per group key, and where keys and values sit in a row.
struct Truth {
    groups: BTreeMap<Vec<Option<String>>, Vec<Option<f64>>>,
    key_columns: Vec<usize>,
    value_columns: Vec<usize>,
}

fn compare(
    q: &Prepared,
    mechanisms: &release::Mechanisms,
    truth: &Truth,
    runs: u64,
) -> Result<Comparison, pgdp::Error> {
    let mut errors = Vec::new();
    let mut fractions = Vec::new();
    for run in 0..runs {
        let mut seed = [0u8; 32];
        seed[..8].copy_from_slice(&run.to_le_bytes());
        let mut rng = ChaCha20Rng::from_seed(seed);
        let released = release::release(
            q.plan, q.rewrite, mechanisms, q.exact, q.domains, false, &mut rng,
        )?;
        let mut seen = BTreeSet::new();
        for row in released.rows() {
            let key: Vec<Option<String>> = truth
                .key_columns
                .iter()
                .map(|&i| cell_text(&row[i]))
                .collect();
            let Some(true_values) = truth.groups.get(&key) else {
                continue;
            };
            seen.insert(key.clone());
            for (v, &i) in true_values.iter().zip(&truth.value_columns) {
                if let (Some(t), Some(d)) = (v, cell_number(&row[i])) {
                    errors.push((d - t).abs() / t.abs().max(1.0));
                }
            }
        }
        fractions.push(seen.len() as f64 / truth.groups.len().max(1) as f64);
    }
    errors.sort_by(f64::total_cmp);
    Ok(Comparison {
        errors,
        fraction: fractions.iter().sum::<f64>() / fractions.len().max(1) as f64,
    })
}

#[tokio::main]
async fn main() {
    let dsn = std::env::var("PGDP_UPSTREAM")
        .ok()
        .filter(|d| !d.trim().is_empty())
        .unwrap_or_else(|| DEFAULT_DSN.to_string());
    let client = match demo_client(&dsn).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("utility: {e}");
            std::process::exit(1);
        }
    };
    let policy = policy::parse(include_str!("../policies/demo.yaml"))
        .unwrap_or_else(|e| panic!("the demo policy is valid: {e}"));
    println!(
        "pgdp utility on the demo data: epsilon={} delta={} {}, {RUNS} runs per query",
        BUDGET.epsilon,
        BUDGET.delta,
        BUDGET.mechanism.name()
    );
    println!(
        "{:<30} {:>7} {:>9} {:>11} {:>11} {:>11} {:>6} {:>5}",
        "query", "groups", "released", "median rel", "p90 rel", "bias", "cells", "secs"
    );
    for (label, sql) in QUERIES {
        let started = Instant::now();
        match measure(&client, &policy, label, sql).await {
            Ok(l) => println!(
                "{:<30} {:>7} {:>8.1}% {:>11.2e} {:>11.2e} {:>11.2e} {:>6} {:>5.1}",
                l.label,
                l.true_groups,
                100.0 * l.released_fraction,
                l.median,
                l.p90,
                l.bias,
                l.cells,
                started.elapsed().as_secs_f64()
            ),
            Err(e) => println!("{label:<30} failed: {e}"),
        }
    }
}
