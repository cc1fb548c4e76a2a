//! `cargo bench --bench utility -- --synopsis`: a dashboard-shaped workload (hundreds of distinct
//! counts over demo.people's region × sex × education cube, with filters, each asked twice as a
//! dashboard reloads) answered through a policy synopsis (private multiplicative weights) and
//! through the per-query path at the same total budget, each by an in-process pgdp with a fresh
//! ledger. Prints, per path: the queries answered, the median and worst absolute error of every
//! released count against PostgreSQL's, and the budget left. On the synopsis path, a statement
//! the synopsis cannot answer (its rounds spent) goes by the per-query path at the same ε per
//! statement as the other path, within what is left of the budget.

use std::fmt::Write as _;
use std::time::Instant;

use pgdp::server::{self, Config};

use super::common::{
    connect, demo_database, fail, proxy_dsn, simple_rows, with_dbname, Res, DEMO_POLICY, NOISE_SEED,
};

/// The total budget both paths spend: the synopsis's ε, once; the per-query path splits it
/// equally over its statements.
const TOTAL_EPSILON: f64 = 2.0;

/// The synopsis: T rounds, τ rows.
const ROUNDS: usize = 60;
const ACCURACY: f64 = 500.0;

/// The dashboard's statements: each grouping key with each filter (a region, a sex, an
/// education level, pairs of them), all distinct.
fn statements(smoke: bool) -> Vec<String> {
    let regions = ["CE", "EA", "IS", "NE", "NO", "NW", "SE", "SO", "SW", "WE"];
    let sexes = ["F", "M", "X"];
    let educations = [
        "bachelor",
        "master",
        "none",
        "primary",
        "secondary",
        "vocational",
    ];
    let mut filters = vec![String::new()];
    for r in regions {
        filters.push(format!("WHERE region = '{r}'"));
        for s in sexes {
            filters.push(format!("WHERE region = '{r}' AND sex = '{s}'"));
        }
    }
    for s in sexes {
        filters.push(format!("WHERE sex = '{s}'"));
    }
    for e in educations {
        filters.push(format!("WHERE education = '{e}'"));
        filters.push(format!("WHERE education <> '{e}' AND sex <> 'X'"));
    }
    let mut out = Vec::new();
    for key in ["region", "sex", "education"] {
        for f in &filters {
            out.push(format!(
                "SELECT {key}, COUNT(*) FROM demo.people {f} GROUP BY {key} ORDER BY {key}"
            ));
        }
    }
    if smoke {
        out.truncate(12);
    }
    out
}

/// One path's figures.
struct Figures {
    answered: usize,
    counts: usize,
    median: f64,
    worst: f64,
    left: f64,
    seconds: f64,
}

/// The policy: the demo's, the analyst's budget `TOTAL_EPSILON` (per query at most that), no
/// replay, and the synopsis.
fn policy_text() -> Res<String> {
    let mut text = DEMO_POLICY.to_string();
    for (from, to) in [
        ("replay_lifetime_s: 86400\n", "replay_lifetime_s: 0\n"),
        ("  choose_bounds: true\n", "  choose_bounds: false\n"),
        (
            "      epsilon: 10\n",
            &format!("      epsilon: {TOTAL_EPSILON}\n") as &str,
        ),
        (
            "      epsilon_per_query_max: 2\n",
            &format!("      epsilon_per_query_max: {TOTAL_EPSILON}\n"),
        ),
    ] {
        if !text.contains(from) {
            return Err(fail(format!(
                "the demo policy no longer contains {from:?}; update benches/utility/dashboard.rs"
            )));
        }
        text = text.replace(from, to);
    }
    writeln!(
        text,
        "\nsynopses:\n  people_cube: {{ table: demo.people, columns: [region, sex, education], epsilon: {TOTAL_EPSILON}, rounds: {ROUNDS}, accuracy: {ACCURACY} }}"
    )?;
    Ok(text)
}

/// Runs the workload through one pgdp (fresh ledger): `synopsis` on or off.
async fn path(admin_dsn: &str, demo: &str, synopsis: bool, sql: &[String]) -> Res<Figures> {
    let admin = connect(admin_dsn).await?;
    let ledger_name = format!("pgdp_dashboard_ledger_{}", std::process::id());
    admin
        .batch_execute(&format!(
            "DROP DATABASE IF EXISTS \"{ledger_name}\" WITH (FORCE)"
        ))
        .await?;
    admin
        .batch_execute(&format!("CREATE DATABASE \"{ledger_name}\""))
        .await?;
    let ledger = with_dbname(admin_dsn, &ledger_name);
    let result = async {
        let policy =
            pgdp::policy::parse(&policy_text()?).map_err(|e| fail(format!("policy: {e:?}")))?;
        let running = server::start(Config {
            policy,
            upstream: demo.to_string(),
            ledger: Some(ledger.clone()),
            listen: "127.0.0.1:0".into(),
            noise_seed: Some(NOISE_SEED),
        })
        .await?;
        let proxy = connect(&proxy_dsn(running.addr.port())).await?;
        let direct = connect(demo).await?;
        // Twice over (a reload), the per-query path splitting the budget over every statement.
        let statements = 2 * sql.len();
        // Both paths answer what the synopsis does not at the per-query path's ε per statement.
        let setup = format!(
            "SET pgdp.synopsis = {}; SET pgdp.mechanism = 'laplace'; SET pgdp.epsilon = {}",
            if synopsis { "on" } else { "off" },
            TOTAL_EPSILON / statements as f64 * (1.0 - 1e-9)
        );
        proxy.batch_execute(&setup).await?;
        let started = Instant::now();
        let mut errors = Vec::new();
        let mut answered = 0;
        for _ in 0..2 {
            for q in sql {
                let truth = simple_rows(&direct, q).await?;
                let Ok(rows) = simple_rows(&proxy, q).await else {
                    continue;
                };
                answered += 1;
                for row in &rows {
                    let exact = truth
                        .iter()
                        .find(|t| t[0] == row[0])
                        .and_then(|t| t[1].as_deref())
                        .unwrap_or("0")
                        .parse::<f64>()?;
                    let noisy = row[1].as_deref().unwrap_or("0").parse::<f64>()?;
                    errors.push((noisy - exact).abs());
                }
            }
        }
        let seconds = started.elapsed().as_secs_f64();
        let left = simple_rows(&proxy, "SELECT epsilon_remaining FROM pgdp.budget")
            .await?
            .first()
            .and_then(|r| r[0].clone())
            .unwrap_or_default()
            .parse::<f64>()?;
        drop(proxy);
        drop(running);
        errors.sort_by(f64::total_cmp);
        Ok::<_, super::common::Error>(Figures {
            answered,
            counts: errors.len(),
            median: errors.get(errors.len() / 2).copied().unwrap_or(f64::NAN),
            worst: errors.last().copied().unwrap_or(f64::NAN),
            left,
            seconds,
        })
    }
    .await;
    let _ = admin
        .batch_execute(&format!(
            "DROP DATABASE IF EXISTS \"{ledger_name}\" WITH (FORCE)"
        ))
        .await;
    result
}

/// The bench: both paths, printed side by side.
pub async fn run(admin_dsn: &str, scale: u32, smoke: bool) -> Res<()> {
    let admin = connect(admin_dsn).await?;
    let demo = demo_database(admin_dsn, &admin, scale).await?;
    let sql = statements(smoke);
    eprintln!(
        "dashboard: {} distinct statements, each twice, total epsilon {TOTAL_EPSILON}",
        sql.len()
    );
    let pmw = path(admin_dsn, &demo, true, &sql).await?;
    let per_query = path(admin_dsn, &demo, false, &sql).await?;
    println!(
        "dashboard workload: {} distinct count statements over demo.people (scale {scale}) by region, sex or education, each asked twice; total epsilon {TOTAL_EPSILON} per path",
        sql.len()
    );
    println!("| path | statements answered | counts | median abs error | worst abs error | epsilon left | seconds |");
    println!("|---|---|---|---|---|---|---|");
    for (name, f) in [
        (
            format!("synopsis (T = {ROUNDS}, accuracy {ACCURACY} rows)"),
            &pmw,
        ),
        (
            format!(
                "per-query path (epsilon {:.5} each)",
                TOTAL_EPSILON / (2 * sql.len()) as f64
            ),
            &per_query,
        ),
    ] {
        println!(
            "| {name} | {} of {} | {} | {:.0} | {:.0} | {:.4} | {:.1} |",
            f.answered,
            2 * sql.len(),
            f.counts,
            f.median,
            f.worst,
            f.left,
            f.seconds
        );
    }
    if pmw.counts == 0 || per_query.counts == 0 {
        return Err(fail("a path answered nothing"));
    }
    Ok(())
}
