//! The pgdp utility benchmark: how accurate pgdp's answers are on the demo dataset, for a
//! representative set of the analyst queries of docs/queries.md, at several privacy settings.
//!
//! ```text
//! cargo bench --bench utility                # scale 1, ε ∈ {0.1, 1, 10} and Gaussian; writes docs/utility.md
//! cargo bench --bench utility -- --smoke     # seconds; CI; writes target/utility-smoke/utility.md
//! cargo bench --bench utility -- --reps 200  # repetitions per query and setting
//! cargo bench --bench utility -- --budget    # no database: queries that fit in a budget (fit.rs)
//! cargo bench --bench utility -- --synopsis  # a dashboard through a synopsis and per query (dashboard.rs)
//! ```
//!
//! For each query and setting it reports, per aggregate column:
//! - the bias of contribution bounding: the exact answer of the contribution-bounded, clipped SQL
//!   pgdp sends upstream (before noise) against the plain SQL's exact answer;
//! - over R repetitions, the total error (DP answer against the plain answer: median absolute and
//!   median relative), and the noise error (DP answer against the clipped answer) as an RMSE next
//!   to the mechanism's theoretical standard deviation, with their ratio (≈ 1 when pgdp noises at
//!   the scale it claims);
//! - for partition selection: the fraction of true groups released and the number of released
//!   groups that do not exist in the data (must be 0);
//! - for quantiles: the error in rank (the fraction of rows between the true and the DP answer).
//!
//! How the repetitions are drawn: every query runs once end to end through an in-process pgdp
//! (fixed noise seed, a policy with `replay_lifetime_s: 0` so neither the replay cache nor the
//! reuse of noisy measures answers; the ledger is checked to hold one charge per query sent). The other repetitions apply
//! `pgdp::dp::release::release` — the function pgdp itself calls after the upstream — to the rows of
//! pgdp's rewritten SQL, fetched once, with a seeded generator: the same mechanisms on the same
//! rows, without re-running a multi-second upstream query per repetition. The plan, rewrite and
//! mechanisms come from the library (`classify`, `analyze`, `rewrite`, `release::mechanisms`) with
//! the server's own secret, so the SQL is byte for byte what pgdp sends.
//!
//! The demo database (`pgdp_test_demo_s<N>_v<VERSION>`, benches/common) is shared with the integration tests and the
//! performance benchmark and only read here; the ledger is a database of this process, dropped
//! at the end. The upstream is `PGDP_BENCH_UPSTREAM` or
//! `host=127.0.0.1 port=5432 user=postgres dbname=postgres`.
//!
//! A benchmark program, not a test: progress goes to standard error, the report to a file.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::Instant;

use pgdp::dp::analyze::{self, AggregateKind, Context, OutputSource, Plan};
use pgdp::dp::mechanism::{MechanismKind, Noise};
use pgdp::dp::release::{self, Budget, PublicDomains};
use pgdp::dp::rewrite::{self, Measure, Rewrite};
use pgdp::output::Cell;
use pgdp::policy::{Mechanism, Policy};
use pgdp::server::{self, Config, Running};
use pgdp::session::classify::{self, Statement};
use rand::rngs::ChaCha20Rng;
use rand::SeedableRng;
use tokio_postgres::Client;

mod bias;
#[path = "../common/mod.rs"]
mod common;
mod dashboard;
mod fit;
mod optimum;

use common::{
    budget_policy_text, connect, demo_database, fail, fresh, machine, proxy_dsn, scalar,
    simple_rows, with_dbname, Machine, Res, DEFAULT_ADMIN_DSN, DP_QUERIES, NOISE_SEED,
};

/// The group-choice secret of the benchmark's policy (benchmark only; see [`bench_policy`]).
const GROUP_CHOICE_SECRET: &str = "pgdp-utility-benchmark-secret";

/// Groups near a clamp named in the report per row (the rest are counted).
const NEAR_CLAMP_LISTED: usize = 6;

/// Candidate groups beyond which a query gets a fifth of the repetitions.
const MANY_CANDIDATES: usize = 1000;

/// Distance of RMSE / σ from 1, beyond four standard errors, at which a row is flagged for a look
/// (slack for the rounding of counts and the delta method of averages).
const RATIO_SLACK: f64 = 0.05;

/// One analyst query. `{n}` in `template` is replaced by a fresh number at each run through
/// pgdp (it names an output column, so it changes the text and not the upstream SQL; the bench
/// policy's `replay_lifetime_s: 0` keeps earlier releases from answering it).
struct Case {
    /// The number in docs/queries.md (0: not in the catalogue) and a short label.
    number: u32,
    label: &'static str,
    template: &'static str,
    /// The plain SQL when it is not the template itself (PostgreSQL has no MEDIAN).
    plain: Option<&'static str>,
    /// Quantile queries: the rows (group keys, then the value as float8) whose ranks measure the
    /// error in rank.
    values: Option<&'static str>,
    /// Part of the smoke run.
    smoke: bool,
}

const fn case(number: u32, label: &'static str, template: &'static str) -> Case {
    Case {
        number,
        label,
        template,
        plain: None,
        values: None,
        smoke: false,
    }
}

const fn smoke(c: Case) -> Case {
    Case { smoke: true, ..c }
}

const fn quantile(c: Case, plain: Option<&'static str>, values: &'static str) -> Case {
    Case {
        plain,
        values: Some(values),
        ..c
    }
}

fn cases() -> Vec<Case> {
    vec![
        smoke(case(
            1,
            "people",
            "SELECT COUNT(*) AS people_{n} FROM demo.people",
        )),
        smoke(case(
            2,
            "people per region (public keys)",
            "SELECT region, COUNT(*) AS people_{n} FROM demo.people GROUP BY region",
        )),
        smoke(case(
            3,
            "mean age by sex",
            "SELECT sex, AVG(age) AS mean_age_{n} FROM demo.people GROUP BY sex",
        )),
        case(
            4,
            "mean income by education",
            "SELECT education, AVG(income) AS mean_income_{n} FROM demo.people GROUP BY education",
        ),
        smoke(case(
            0,
            "people per age (partition selection)",
            "SELECT age, COUNT(*) AS people_{n} FROM demo.people GROUP BY age",
        )),
        case(
            5,
            "visits per clinic (partition selection)",
            "SELECT clinic, COUNT(*) AS visits_{n} FROM demo.visits GROUP BY clinic",
        ),
        case(
            6,
            "patients per diagnosis (partition selection)",
            "SELECT diagnosis, COUNT(DISTINCT person_id) AS patients_{n} FROM demo.visits GROUP BY diagnosis",
        ),
        case(
            7,
            "spending in 2024",
            "SELECT SUM(cost) AS total_cost_{n} FROM demo.visits WHERE visit_date >= DATE '2024-01-01'",
        ),
        case(
            8,
            "people per region name (public table join)",
            "SELECT r.name, COUNT(*) AS people_{n} FROM demo.people p JOIN demo.regions r USING (region) GROUP BY r.name",
        ),
        case(
            9,
            "visits and mean cost by sex (join)",
            "SELECT p.sex, COUNT(*) AS visits_{n}, AVG(v.cost) AS mean_cost FROM demo.visits v JOIN demo.people p USING (person_id) GROUP BY p.sex",
        ),
        case(
            11,
            "women (CASE in SUM)",
            "SELECT SUM(CASE WHEN sex = 'F' THEN 1 ELSE 0 END) AS women_{n}, COUNT(*) AS people FROM demo.people",
        ),
        case(
            12,
            "age bands (CASE key)",
            "SELECT CASE WHEN age < 18 THEN 'child' WHEN age < 65 THEN 'adult' ELSE 'senior' END AS band, COUNT(*) AS people_{n} FROM demo.people GROUP BY 1",
        ),
        case(
            18,
            "visits per month (date_trunc, partition selection)",
            "SELECT date_trunc('month', visit_date) AS month, COUNT(*) AS visits_{n} FROM demo.visits GROUP BY 1",
        ),
        case(
            20,
            "mean cost by weekday (extract, partition selection)",
            "SELECT EXTRACT(dow FROM visit_date) AS weekday, AVG(cost) AS mean_cost_{n} FROM demo.visits GROUP BY 1",
        ),
        case(
            22,
            "distinct diagnoses",
            "SELECT COUNT(DISTINCT diagnosis) AS diagnoses_{n} FROM demo.visits",
        ),
        case(
            31,
            "mean visits per person (per-unit subquery)",
            "SELECT AVG(n) AS visits_per_person_{n} FROM (SELECT person_id, LEAST(COUNT(*), 20) AS n FROM demo.visits GROUP BY person_id) t",
        ),
        case(
            32,
            "histogram of visits per person",
            "SELECT n_bucket, COUNT(*) AS people_{n} FROM (SELECT person_id, LEAST(COUNT(*), 10) AS n_bucket FROM demo.visits GROUP BY person_id) t GROUP BY n_bucket",
        ),
        quantile(
            case(
                39,
                "median visit cost",
                "SELECT PERCENTILE_CONT(0.5) WITHIN GROUP (ORDER BY cost) AS median_cost_{n} FROM demo.visits",
            ),
            None,
            "SELECT CAST(cost AS float8) FROM demo.visits",
        ),
        quantile(
            case(
                40,
                "median and 90th percentile of income by region",
                "SELECT region, MEDIAN(income) AS median_income_{n}, PERCENTILE_DISC(0.9) WITHIN GROUP (ORDER BY income) AS p90 FROM demo.people GROUP BY region",
            ),
            Some("SELECT region, PERCENTILE_CONT(0.5) WITHIN GROUP (ORDER BY income) AS median_income, PERCENTILE_DISC(0.9) WITHIN GROUP (ORDER BY income) AS p90 FROM demo.people GROUP BY region"),
            "SELECT region, CAST(income AS float8) FROM demo.people",
        ),
        smoke(quantile(
            case(
                41,
                "youngest and oldest (MIN, MAX)",
                "SELECT MIN(age) AS youngest_{n}, MAX(age) AS oldest FROM demo.people",
            ),
            None,
            "SELECT CAST(age AS float8) FROM demo.people",
        )),
    ]
}

/// A privacy setting of the session.
#[derive(Debug, Clone, Copy)]
struct Setting {
    epsilon: f64,
    delta: f64,
    mechanism: Mechanism,
}

impl Setting {
    fn label(&self) -> String {
        match self.mechanism {
            Mechanism::Laplace => format!("Laplace ε={}", self.epsilon),
            Mechanism::Gaussian => format!("Gaussian ε={} δ={:e}", self.epsilon, self.delta),
            Mechanism::Auto => format!("auto ε={} δ={:e}", self.epsilon, self.delta),
        }
    }

    fn budget(&self) -> Budget {
        Budget {
            epsilon: self.epsilon,
            delta: self.delta,
            mechanism: self.mechanism,
        }
    }
}

/// δ of the Laplace settings: the demo policy's default, spent only by partition selection.
const LAPLACE_DELTA: f64 = 1e-7;

fn settings_full() -> Vec<Setting> {
    let laplace = |epsilon| Setting {
        epsilon,
        delta: LAPLACE_DELTA,
        mechanism: Mechanism::Laplace,
    };
    vec![
        laplace(0.1),
        laplace(1.0),
        laplace(10.0),
        Setting {
            epsilon: 1.0,
            delta: 1e-5,
            mechanism: Mechanism::Gaussian,
        },
        // pgdp chooses Laplace or Gaussian per query (`SET pgdp.mechanism = 'auto'`).
        Setting {
            epsilon: 1.0,
            delta: 1e-5,
            mechanism: Mechanism::Auto,
        },
    ]
}

/// How much work the run does.
struct Options {
    smoke: bool,
    /// `--budget`: only the queries that fit in a budget ([`fit`]).
    budget: bool,
    /// `--synopsis`: only the dashboard through a synopsis and per query ([`dashboard`]).
    synopsis: bool,
    scale: u32,
    reps: usize,
    out: PathBuf,
    admin_dsn: String,
    command: String,
}

fn parse_args() -> Res<Options> {
    let mut smoke = false;
    let mut budget = false;
    let mut synopsis = false;
    let mut reps = None;
    let mut scale = None;
    let mut out = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--smoke" => smoke = true,
            "--budget" => budget = true,
            "--synopsis" => synopsis = true,
            "--reps" => {
                let v = args.next().ok_or_else(|| fail("--reps needs a number"))?;
                reps = Some(
                    v.parse::<usize>()
                        .map_err(|_| fail("--reps takes a number"))?,
                );
            }
            "--scale" => {
                let v = args.next().ok_or_else(|| fail("--scale needs a number"))?;
                scale = Some(
                    v.parse::<u32>()
                        .map_err(|_| fail("--scale takes a number"))?,
                );
            }
            "--out" => {
                out = Some(PathBuf::from(
                    args.next().ok_or_else(|| fail("--out needs a file"))?,
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
    let mut command = String::from("cargo bench --bench utility");
    let mut extra = Vec::new();
    if smoke {
        extra.push("--smoke".to_string());
    }
    if budget {
        extra.push("--budget".to_string());
    }
    if synopsis {
        extra.push("--synopsis".to_string());
    }
    if let Some(r) = reps {
        extra.push(format!("--reps {r}"));
    }
    if let Some(s) = scale {
        extra.push(format!("--scale {s}"));
    }
    if !extra.is_empty() {
        write!(command, " -- {}", extra.join(" "))?;
    }
    let scale = scale.unwrap_or(1);
    if scale == 0 || scale > 10 {
        return Err(fail("the scale must be between 1 and 10"));
    }
    let reps = reps.unwrap_or(if smoke { 20 } else { 2000 });
    if reps == 0 {
        return Err(fail("--reps must be at least 1"));
    }
    Ok(Options {
        smoke,
        budget,
        synopsis,
        scale,
        reps,
        out: out.unwrap_or_else(|| {
            if smoke {
                root.join("target/utility-smoke/utility.md")
            } else {
                root.join("docs/utility.md")
            }
        }),
        admin_dsn,
        command,
    })
}

fn main() {
    let options = match parse_args() {
        Ok(options) => options,
        Err(e) => {
            eprintln!("utility bench: {e}");
            std::process::exit(1);
        }
    };
    if options.budget {
        let demo = common::DEMO_POLICY;
        let result = pgdp::policy::parse(demo)
            .map_err(|e| fail(format!("demo policy: {e:?}")))
            .and_then(|policy| {
                fit::run(&policy, GROUP_CHOICE_SECRET, &options.command, &options.out)
            });
        if let Err(e) = result {
            eprintln!("utility bench --budget: {e}");
            std::process::exit(1);
        }
        eprintln!("wrote {}", options.out.display());
        return;
    }
    if options.synopsis {
        common::run_and_exit(
            "utility bench --synopsis",
            dashboard::run(&options.admin_dsn, options.scale, options.smoke),
        )
    }
    common::run_and_exit("utility bench", bench(options))
}

// ---------------------------------------------------------------------------------------------
// The policy (connections, the demo data and the machine are in benches/common)

type Rows = Vec<Vec<Option<String>>>;

/// The demo policy with a budget for the whole run ([`budget_policy_text`]) and a fixed
/// group-choice secret.
fn bench_policy() -> Res<Policy> {
    // The tables below measure the policy's caps (their bias and noise); caps chosen per query
    // are compared with PostgreSQL's answer in their own section (bias.rs).
    let text = budget_policy_text()?.replace("  choose_bounds: true\n", "  choose_bounds: false\n");
    if !text.contains("choose_bounds: false") {
        return Err(fail(
            "the demo policy's defaults moved: update bench_policy",
        ));
    }
    let mut policy =
        pgdp::policy::parse(&text).map_err(|e| fail(format!("bench policy: {e:?}")))?;
    // A fixed group-choice secret (instead of a random one kept in this run's new ledger), so
    // that which groups each person keeps, and so every figure, is the same from run to run.
    policy.secret = Some(GROUP_CHOICE_SECRET.into());
    Ok(policy)
}

// ---------------------------------------------------------------------------------------------
// Group keys and values

/// A group's key: the normalised texts of its key columns, joined.
type Key = String;

/// Numbers compare as numbers (`2023` from the upstream, `2023.0` released as float8).
fn norm_key_text(t: Option<&str>) -> String {
    match t {
        None => "<null>".into(),
        Some(t) => match t.trim().parse::<f64>() {
            Ok(f) if f.is_finite() => format!("{f}"),
            _ => t.to_string(),
        },
    }
}

fn key_of(texts: &[Option<String>]) -> Key {
    texts
        .iter()
        .map(|t| norm_key_text(t.as_deref()))
        .collect::<Vec<_>>()
        .join("\u{1f}")
}

fn cell_text(c: &Cell) -> Option<String> {
    match c {
        Cell::Null => None,
        Cell::Int(i) => Some(i.to_string()),
        Cell::Float(f) => Some(format!("{f}")),
        Cell::Text(t) => Some(t.clone()),
        Cell::Bool(b) => Some(b.to_string()),
    }
}

fn cell_f64(c: &Cell) -> Option<f64> {
    match c {
        Cell::Int(i) => Some(*i as f64),
        Cell::Float(f) => Some(*f),
        _ => None,
    }
}

/// One answer: per group, the value of each aggregate (in the plan's aggregate order).
type Answer = BTreeMap<Key, Vec<Option<f64>>>;

/// An answer from rows laid out as the plan's outputs (keys and aggregates in output order).
fn answer_from_output_rows(plan: &Plan, rows: &Rows) -> Res<Answer> {
    let mut answer = Answer::new();
    for row in rows {
        if row.len() != plan.outputs().len() {
            return Err(fail("a row does not have the plan's output columns"));
        }
        let mut keys = vec![None; plan.keys().len()];
        let mut values = vec![None; plan.aggregates().len()];
        for (o, cell) in plan.outputs().iter().zip(row) {
            match o.source {
                OutputSource::Key(i) => keys[i] = cell.clone(),
                OutputSource::Aggregate(i) => {
                    values[i] = cell.as_deref().and_then(|t| t.trim().parse::<f64>().ok())
                }
                OutputSource::Computed(_) | OutputSource::Grouping(_) => {
                    return Err(fail("the utility bench measures bare aggregates only"))
                }
            }
        }
        answer.insert(key_of(&keys), values);
    }
    Ok(answer)
}

/// An answer from pgdp's released cells (also in output order).
fn answer_from_cells(plan: &Plan, rows: &[Vec<Cell>]) -> Res<Answer> {
    let mut answer = Answer::new();
    for row in rows {
        if row.len() != plan.outputs().len() {
            return Err(fail(
                "a released row does not have the plan's output columns",
            ));
        }
        let mut keys = vec![None; plan.keys().len()];
        let mut values = vec![None; plan.aggregates().len()];
        for (o, cell) in plan.outputs().iter().zip(row) {
            match o.source {
                OutputSource::Key(i) => keys[i] = cell_text(cell),
                OutputSource::Aggregate(i) => values[i] = cell_f64(cell),
                OutputSource::Computed(_) | OutputSource::Grouping(_) => {
                    return Err(fail("the utility bench measures bare aggregates only"))
                }
            }
        }
        answer.insert(key_of(&keys), values);
    }
    Ok(answer)
}

// ---------------------------------------------------------------------------------------------
// The exact answer of the clipped SQL (what pgdp computes before noise)

/// The exact statistics of one candidate group of the rewritten SQL.
struct Clipped {
    /// Each measure as a number (quantiles: NaN, see `histograms`).
    measures: Vec<f64>,
    /// Quantile measures: the histogram.
    histograms: Vec<Option<Vec<u64>>>,
}

fn clipped_groups(plan: &Plan, rw: &Rewrite, rows: &Rows) -> Res<BTreeMap<Key, Clipped>> {
    let k = plan.keys().len();
    let m = rw.measures.len();
    let mut out = BTreeMap::new();
    for row in rows {
        if row.len() != k + m + 1 {
            return Err(fail(
                "the rewritten SQL returned an unexpected number of columns",
            ));
        }
        let mut measures = Vec::with_capacity(m);
        let mut histograms = Vec::with_capacity(m);
        for (j, measure) in rw.measures.iter().enumerate() {
            let text = row[k + j].as_deref().unwrap_or("");
            if let Measure::Quantile(..) = measure {
                histograms.push(Some(
                    pgdp::dp::mechanism::parse_histogram(text)
                        .map_err(|e| fail(format!("histogram: {e}")))?,
                ));
                measures.push(f64::NAN);
            } else {
                histograms.push(None);
                measures.push(if text.is_empty() {
                    0.0
                } else {
                    text.parse::<f64>()
                        .map_err(|_| fail(format!("measure {text:?} is not a number")))?
                });
            }
        }
        out.insert(
            key_of(&row[..k]),
            Clipped {
                measures,
                histograms,
            },
        );
    }
    Ok(out)
}

/// The bucket report-noisy-max would choose without noise: the first with the highest score
/// (the score formula of `pgdp::dp::mechanism::quantile`).
fn exact_quantile_bucket(histogram: &[u64], permille: u16) -> usize {
    let n: i128 = histogram.iter().map(|&c| i128::from(c)).sum();
    let target = i128::from(permille.min(1000)) * n;
    let mut below: i128 = 0;
    let mut best: Option<(i128, usize)> = None;
    for (b, &c) in histogram.iter().enumerate() {
        let above = below + i128::from(c);
        let score = -(1000 * below - target).max(target - 1000 * above).max(0);
        if best.is_none_or(|(v, _)| score > v) {
            best = Some((score, b));
        }
        below = above;
    }
    best.map(|(_, b)| b).unwrap_or(0)
}

/// Aggregate `i` of a group from its exact clipped statistics: what pgdp would release with no
/// noise (the formulas of `release::derive`, applied to exact values).
fn clipped_value(plan: &Plan, rw: &Rewrite, i: usize, g: &Clipped) -> f64 {
    let ms = &rw.aggregate_measures[i];
    let agg = &plan.aggregates()[i];
    match agg.kind {
        AggregateKind::CountRows
        | AggregateKind::CountValues
        | AggregateKind::CountUnits
        | AggregateKind::CountDistinct
        | AggregateKind::Sum => g.measures[ms[0]],
        AggregateKind::Quantile { .. } => {
            let (Measure::Quantile(a, permille), Some(h)) =
                (&rw.measures[ms[0]], &g.histograms[ms[0]])
            else {
                return f64::NAN;
            };
            let Some(b) = rw.arguments[*a].bounds else {
                return f64::NAN;
            };
            pgdp::dp::mechanism::bucket_value(exact_quantile_bucket(h, *permille), b.lower, b.upper)
        }
        // Whether the count is nonzero, as 1 or 0 (without noise any nonzero count is detected).
        AggregateKind::Detected => f64::from(u8::from(g.measures[ms[0]] > 0.0)),
        AggregateKind::Avg
        | AggregateKind::VarPop
        | AggregateKind::VarSamp
        | AggregateKind::StddevPop
        | AggregateKind::StddevSamp => {
            let Some(b) = agg.bounds else { return f64::NAN };
            let mid = (b.lower + b.upper) / 2.0;
            let h = (b.upper - b.lower) / 2.0;
            let n = g.measures[ms[0]].round().max(1.0);
            let mean_c = (g.measures[ms[1]] / n).clamp(-h, h);
            if agg.kind == AggregateKind::Avg {
                return (mid + mean_c).clamp(b.lower, b.upper);
            }
            let var_pop = (g.measures[ms[2]] / n - mean_c * mean_c).clamp(0.0, h * h);
            let var = match agg.kind {
                AggregateKind::VarSamp | AggregateKind::StddevSamp if n > 1.0 => {
                    (var_pop * n / (n - 1.0)).min(4.0 * h * h)
                }
                _ => var_pop,
            };
            match agg.kind {
                AggregateKind::StddevPop | AggregateKind::StddevSamp => var.sqrt(),
                _ => var,
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Theoretical standard deviations

/// Variance of the discrete Laplace distribution of scale `b` (on the integers):
/// `2q/(1−q)²` with `q = e^(−1/b)`.
fn discrete_laplace_variance(b: f64) -> f64 {
    let q = (-1.0 / b).exp();
    let one_minus_q = -(-1.0 / b).exp_m1();
    2.0 * q / (one_minus_q * one_minus_q)
}

/// Variance of the discrete Gaussian with parameter `σ` (on the integers), summed; `σ²` up to a
/// relative `e^(−2π²σ²)` once σ is not small.
fn discrete_gaussian_variance(sigma: f64) -> f64 {
    if sigma > 10.0 {
        return sigma * sigma;
    }
    let range = (12.0 * sigma).ceil() as i64 + 2;
    let (mut num, mut den) = (0.0, 0.0);
    for x in -range..=range {
        let x = x as f64;
        let w = (-(x * x) / (2.0 * sigma * sigma)).exp();
        num += x * x * w;
        den += w;
    }
    num / den
}

/// Kurtosis `E[X⁴]/E[X²]²` of the discrete Laplace of scale `b`: `(1 + 10q + q²)/(2q)`.
fn discrete_laplace_kurtosis(b: f64) -> f64 {
    let q = (-1.0 / b).exp();
    (1.0 + 10.0 * q + q * q) / (2.0 * q)
}

/// Kurtosis of the discrete Gaussian with parameter `σ`, summed; 3 once σ is not small.
fn discrete_gaussian_kurtosis(sigma: f64) -> f64 {
    if sigma > 10.0 {
        return 3.0;
    }
    let range = (12.0 * sigma).ceil() as i64 + 2;
    let (mut m2, mut m4, mut den) = (0.0, 0.0, 0.0);
    for x in -range..=range {
        let x = x as f64;
        let w = (-(x * x) / (2.0 * sigma * sigma)).exp();
        m2 += x * x * w;
        m4 += x * x * x * x * w;
        den += w;
    }
    (m4 / den) / (m2 / den).powi(2)
}

/// Kurtosis of one measure's noise: how noisy an RMSE estimate from it is (the relative
/// standard error of a mean of N squared draws is `√((κ − 1)/N)`).
fn noise_kurtosis(noise: &Noise) -> f64 {
    let s = noise.scale();
    match (noise.kind(), noise.grid_exponent().is_some()) {
        (MechanismKind::Laplace, true) => 6.0,
        (MechanismKind::Gaussian, true) => 3.0,
        (MechanismKind::Laplace, false) => discrete_laplace_kurtosis(s),
        (MechanismKind::Gaussian, false) => discrete_gaussian_kurtosis(s),
    }
}

/// Variance of one measure's noise, in the statistic's units.
fn noise_variance(noise: &Noise) -> f64 {
    let s = noise.scale();
    let real = noise.grid_exponent().is_some();
    match (noise.kind(), real) {
        // Real statistics: integer noise of at least 2^40 grid steps; the continuous formula.
        (MechanismKind::Laplace, true) => 2.0 * s * s,
        (MechanismKind::Gaussian, true) => s * s,
        (MechanismKind::Laplace, false) => discrete_laplace_variance(s),
        (MechanismKind::Gaussian, false) => discrete_gaussian_variance(s),
    }
}

/// The theoretical standard deviation of aggregate `i` of a group (NaN where none is stated:
/// quantiles, variances). AVG by the delta method: `√(σ_S² + (S/N)²·σ_N²) / N` with the exact
/// centered sum `S` and count `N`.
fn theoretical_sigma(plan: &Plan, rw: &Rewrite, variances: &[f64], i: usize, g: &Clipped) -> f64 {
    let ms = &rw.aggregate_measures[i];
    match plan.aggregates()[i].kind {
        AggregateKind::CountRows
        | AggregateKind::CountValues
        | AggregateKind::CountUnits
        | AggregateKind::CountDistinct
        | AggregateKind::Sum => variances[ms[0]].sqrt(),
        AggregateKind::Avg => {
            let n = g.measures[ms[0]].max(1.0);
            let s = g.measures[ms[1]];
            ((variances[ms[1]] + (s / n).powi(2) * variances[ms[0]]).sqrt()) / n
        }
        _ => f64::NAN,
    }
}

/// Whether pgdp's post-processing clamp is likely to act on aggregate `i` of a group (the clipped
/// value within 3σ of it): counts and non-negative sums are released at ≥ 0, averages inside their
/// bounds (with the noisy count rounded and at least 1). There the error is smaller than σ says,
/// so such groups are left out of the RMSE / σ comparison (and listed in the report).
fn near_clamp(
    plan: &Plan,
    rw: &Rewrite,
    variances: &[f64],
    i: usize,
    g: &Clipped,
    value: f64,
    sigma: f64,
) -> bool {
    let agg = &plan.aggregates()[i];
    let ms = &rw.aggregate_measures[i];
    match agg.kind {
        AggregateKind::CountRows
        | AggregateKind::CountValues
        | AggregateKind::CountUnits
        | AggregateKind::CountDistinct => 3.0 * sigma > value,
        AggregateKind::Sum => match agg.bounds {
            Some(b) if b.lower >= 0.0 => 3.0 * sigma > value,
            Some(b) if b.upper <= 0.0 => 3.0 * sigma > -value,
            _ => false,
        },
        AggregateKind::Avg => {
            let Some(b) = agg.bounds else { return false };
            let room = (value - b.lower).min(b.upper - value);
            3.0 * sigma > room || 3.0 * variances[ms[0]].sqrt() > g.measures[ms[0]]
        }
        _ => false,
    }
}

// ---------------------------------------------------------------------------------------------
// Statistics

fn median(xs: &[f64]) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Mid-rank fraction of `v` among sorted `values`: (rows below + rows at or below) / 2n.
fn rank_fraction(values: &[f64], v: f64) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    let below = values.partition_point(|x| *x < v);
    let at_or_below = values.partition_point(|x| *x <= v);
    (below + at_or_below) as f64 / (2.0 * values.len() as f64)
}

/// Results for one aggregate column at one setting.
#[derive(Default)]
struct Row {
    aggregate: String,
    setting: String,
    /// Why the setting does not apply (the refusal), if it does not.
    refused: Option<String>,
    /// Groups: true (plain), mean released fraction, spurious released (total over reps).
    groups_true: usize,
    released_fraction: Option<f64>,
    spurious: usize,
    /// Median over groups of |clipped − plain| and of that relative to |plain|.
    bias_abs: f64,
    bias_rel: f64,
    /// Over (repetition, released true group): median |dp − plain|, median |dp − plain|/|plain|.
    err_abs: f64,
    err_rel: f64,
    /// √mean (dp − clipped)² and √mean σ², over the groups not near a clamp.
    rmse_noise: f64,
    sigma: f64,
    /// Standard error of RMSE / σ (from the noise's kurtosis and the number of draws).
    ratio_se: f64,
    /// Groups left out of the RMSE / σ comparison (near a clamp), by key.
    near_clamp: Vec<Key>,
    /// Quantiles: median |F(dp) − F(plain)|.
    rank_err: Option<f64>,
    plain_typical: f64,
}

impl Row {
    fn ratio(&self) -> f64 {
        self.rmse_noise / self.sigma
    }

    /// Farther from 1 than sampling error (4 standard errors) and a small model slack allow.
    fn flagged(&self) -> bool {
        let r = self.ratio();
        r.is_finite() && (r - 1.0).abs() > RATIO_SLACK + 4.0 * self.ratio_se
    }
}

struct CaseResult {
    number: u32,
    label: &'static str,
    sql: String,
    keys: &'static str,
    candidates: usize,
    reps: usize,
    rows: Vec<Row>,
    proxy_runs: Vec<String>,
}

// ---------------------------------------------------------------------------------------------
// The run

async fn bench(o: Options) -> Res<()> {
    let started = Instant::now();
    let admin = connect(&o.admin_dsn).await?;
    let machine = machine(&admin).await?;
    eprintln!(
        "pgdp utility bench ({}): scale {}, {} repetitions, upstream {}",
        if o.smoke { "smoke" } else { "full" },
        o.scale,
        o.reps,
        machine.postgres
    );
    eprintln!("demo data, scale {}", o.scale);
    let demo = demo_database(&o.admin_dsn, &admin, o.scale).await?;
    let ledger_name = format!("pgdp_utility_ledger_{}", std::process::id());
    admin
        .batch_execute(&format!(
            "DROP DATABASE IF EXISTS \"{ledger_name}\" WITH (FORCE)"
        ))
        .await?;
    admin
        .batch_execute(&format!("CREATE DATABASE \"{ledger_name}\""))
        .await?;
    let ledger_dsn = with_dbname(&o.admin_dsn, &ledger_name);
    let result = bench_cases(&o, &demo, &ledger_dsn).await;
    let charges = match connect(&ledger_dsn).await {
        Ok(c) => scalar(&c, "SELECT count(*) FROM pgdp.charge_log")
            .await
            .and_then(|t| Ok(t.parse::<u64>()?)),
        Err(e) => Err(e),
    };
    let _ = admin
        .batch_execute(&format!(
            "DROP DATABASE IF EXISTS \"{ledger_name}\" WITH (FORCE)"
        ))
        .await;
    let (results, bias_rows, people, visits) = result?;
    let charges = charges?;
    let sent = DP_QUERIES.load(Ordering::Relaxed);
    let report = report(
        &o,
        &machine,
        &results,
        people,
        visits,
        charges,
        sent,
        started.elapsed().as_secs_f64(),
    )?;
    let report = report + &bias::report(&bias_rows, bias_reps(&o))?;
    if let Some(dir) = o.out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    write_report(&o.out, &report)?;
    eprintln!(
        "wrote {} in {:.0} s",
        o.out.display(),
        started.elapsed().as_secs_f64()
    );
    if charges != sent {
        return Err(fail(format!(
            "the ledger holds {charges} charges for {sent} DP queries: some were replayed"
        )));
    }
    let spurious: usize = results
        .iter()
        .flat_map(|c| &c.rows)
        .map(|r| r.spurious)
        .sum();
    if spurious > 0 {
        return Err(fail(format!(
            "{spurious} released groups do not exist in the data: partition selection is broken"
        )));
    }
    Ok(())
}

/// Repetitions of the comparison with PostgreSQL's exact answer ([`bias`]) per query and column.
fn bias_reps(o: &Options) -> usize {
    o.reps.min(200)
}

type CaseResults = (Vec<CaseResult>, Vec<bias::BiasRow>, u64, u64);

async fn bench_cases(o: &Options, demo: &str, ledger: &str) -> Res<CaseResults> {
    let running: Running = server::start(Config {
        policy: bench_policy()?,
        upstream: demo.to_string(),
        ledger: Some(ledger.to_string()),
        listen: "127.0.0.1:0".into(),
        noise_seed: Some(NOISE_SEED),
    })
    .await?;
    let policy = running.shared().policy.clone();
    let secret = running.shared().secret().await?.to_string();
    let proxy = connect(&proxy_dsn(running.addr.port())).await?;
    let direct = connect(demo).await?;
    let people: u64 = scalar(&direct, "SELECT count(*) FROM demo.people")
        .await?
        .parse()?;
    let visits: u64 = scalar(&direct, "SELECT count(*) FROM demo.visits")
        .await?
        .parse()?;
    let settings = if o.smoke {
        vec![settings_full()[1]]
    } else {
        settings_full()
    };
    let mut results = Vec::new();
    for (ci, c) in cases().into_iter().enumerate() {
        if o.smoke && !c.smoke {
            continue;
        }
        let t0 = Instant::now();
        let result = bench_case(o, ci, &c, &settings, &policy, &secret, &proxy, &direct)
            .await
            .map_err(|e| fail(format!("query {} ({}): {e}", c.number, c.label)))?;
        eprintln!(
            "  {:>2} {:<52} {:>6.1} s",
            c.number,
            c.label,
            t0.elapsed().as_secs_f64()
        );
        results.push(result);
    }
    drop(running);
    // Against PostgreSQL's exact answer: the policy's caps, and caps chosen per query under
    // the same policy with its caps as ceilings.
    let mut ceiling = pgdp::policy::parse(&bias::ceiling_policy_text(&budget_policy_text()?)?)
        .map_err(|e| fail(format!("ceiling policy: {e:?}")))?;
    ceiling.secret = policy.secret.clone();
    let mut bias_rows = Vec::new();
    for (ci, c) in cases().into_iter().enumerate() {
        if (o.smoke && !c.smoke) || c.values.is_some() {
            continue;
        }
        let t0 = Instant::now();
        let sql = c.template.replace("{n}", "0");
        let (plan, _) = plan_of(&policy, &secret, &sql)?;
        let plain_sql = c.plain.map(str::to_string).unwrap_or_else(|| sql.clone());
        let plain = answer_from_output_rows(&plan, &simple_rows(&direct, &plain_sql).await?)?;
        let row = bias::measure(
            c.number,
            c.label,
            &sql,
            &plain,
            &policy,
            &ceiling,
            &secret,
            &direct,
            bias_reps(o),
            seed(ci, 200),
        )
        .await
        .map_err(|e| {
            fail(format!(
                "query {} ({}) against the exact answer: {e}",
                c.number, c.label
            ))
        })?;
        eprintln!(
            "  {:>2} {:<52} {:>6.1} s (exact answer: {} before, {} after)",
            c.number,
            c.label,
            t0.elapsed().as_secs_f64(),
            pct(row.before),
            pct(row.after)
        );
        bias_rows.push(row);
    }
    Ok((results, bias_rows, people, visits))
}

/// Plan and rewrite of `sql` as pgdp makes them (demo schema on the search path).
fn plan_of(policy: &Policy, secret: &str, sql: &str) -> Res<(Plan, Rewrite)> {
    let statements = classify::classify(sql).map_err(|e| fail(format!("{e}")))?;
    let [Statement::Query(query)] = statements.as_slice() else {
        return Err(fail("not one query"));
    };
    let ctx = Context {
        policy,
        search_path: vec![pgdp::tools::demo::SCHEMA.to_string()],
    };
    let plan = analyze::analyze(query, &ctx).map_err(|e| fail(format!("{e}")))?;
    let rw = rewrite::rewrite(&plan, &[], secret).map_err(|e| fail(format!("{e}")))?;
    Ok((plan, rw))
}

/// The domains of the plan's public keys, as pgdp reads them.
async fn public_domains(plan: &Plan, direct: &Client) -> Res<PublicDomains> {
    let mut domains = PublicDomains::new();
    if !plan.keys_public() {
        return Ok(domains);
    }
    for part in rewrite::domain::public_domain(plan, &[]).map_err(|e| fail(e.to_string()))? {
        let rows = match part.sql() {
            Some(sql) => Some(simple_rows(direct, sql.as_str()).await?),
            None => None,
        };
        domains.push(
            part.into_combinations(rows)
                .map_err(|e| fail(e.to_string()))?,
        );
    }
    Ok(domains)
}

/// The sorted values of each group, for ranks.
async fn group_values(direct: &Client, sql: &str, keys: usize) -> Res<BTreeMap<Key, Vec<f64>>> {
    let mut out: BTreeMap<Key, Vec<f64>> = BTreeMap::new();
    for row in simple_rows(direct, sql).await? {
        let Some(v) = row
            .get(keys)
            .cloned()
            .flatten()
            .and_then(|t| t.parse::<f64>().ok())
        else {
            continue;
        };
        out.entry(key_of(&row[..keys])).or_default().push(v);
    }
    for v in out.values_mut() {
        v.sort_by(f64::total_cmp);
    }
    Ok(out)
}

fn seed(case: usize, setting: usize) -> [u8; 32] {
    let mut s = [42u8; 32];
    s[0] = case as u8;
    s[1] = setting as u8;
    s
}

#[allow(clippy::too_many_arguments)] // one call site; the parts are unrelated
async fn bench_case(
    o: &Options,
    ci: usize,
    c: &Case,
    settings: &[Setting],
    policy: &Policy,
    secret: &str,
    proxy: &Client,
    direct: &Client,
) -> Res<CaseResult> {
    let t_upstream = Instant::now();
    let (plan, rw) = plan_of(policy, secret, &c.template.replace("{n}", "0"))?;
    let plain_sql = c
        .plain
        .map(str::to_string)
        .unwrap_or_else(|| c.template.replace("{n}", "0"));
    let plain = answer_from_output_rows(&plan, &simple_rows(direct, &plain_sql).await?)?;
    let upstream_rows = simple_rows(direct, &rw.sql).await?;
    let clipped = clipped_groups(&plan, &rw, &upstream_rows)?;
    let upstream_rows = release::PrivateRows::new(upstream_rows);
    let domains = public_domains(&plan, direct).await?;
    let values = match c.values {
        Some(sql) => Some(group_values(direct, sql, plan.keys().len()).await?),
        None => None,
    };
    let selection = !plan.keys_public();
    let keys = if plan.keys().is_empty() {
        "none"
    } else if selection {
        "partition selection"
    } else {
        "public"
    };

    // One run end to end through pgdp, at a setting that rotates with the query (the first one
    // that applies), so that every setting is exercised through the wire.
    let mut proxy_answers: Vec<(usize, Answer)> = Vec::new();
    let mut proxy_runs = Vec::new();
    for k in 0..settings.len() {
        let si = (ci + k) % settings.len();
        let s = settings[si];
        if release::mechanisms(&plan, &rw, s.budget()).is_err() {
            continue;
        }
        for stmt in [
            format!("SET pgdp.epsilon = {}", s.epsilon),
            format!("SET pgdp.delta = {:e}", s.delta),
            format!("SET pgdp.mechanism = '{}'", s.mechanism.name()),
        ] {
            simple_rows(proxy, &stmt).await?;
        }
        DP_QUERIES.fetch_add(1, Ordering::Relaxed);
        let rows = simple_rows(proxy, &fresh(c.template)).await?;
        proxy_answers.push((si, answer_from_output_rows(&plan, &rows)?));
        proxy_runs.push(s.label());
        break;
    }

    let upstream_s = t_upstream.elapsed().as_secs_f64();
    // A release draws one noise per candidate group: with thousands of candidates (diagnoses),
    // fewer repetitions keep the run short; each repetition still gives thousands of errors.
    let reps = if clipped.len() > MANY_CANDIDATES {
        (o.reps / 5).max(o.reps.min(20))
    } else {
        o.reps
    };
    let t_release = Instant::now();
    let mut rows = Vec::new();
    for (si, s) in settings.iter().enumerate() {
        let mech = match release::mechanisms(&plan, &rw, s.budget()) {
            Ok(m) => m,
            Err(e) => {
                rows.push(Row {
                    aggregate: "all".into(),
                    setting: s.label(),
                    refused: Some(format!("{e}")),
                    ..Row::default()
                });
                continue;
            }
        };
        let variances: Vec<f64> = mech.noises.iter().map(noise_variance).collect();
        let kurtoses: Vec<f64> = mech.noises.iter().map(noise_kurtosis).collect();
        let mut answers: Vec<Answer> = proxy_answers
            .iter()
            .filter(|(i, _)| *i == si)
            .map(|(_, a)| a.clone())
            .collect();
        let mut rng = ChaCha20Rng::from_seed(seed(ci, si));
        while answers.len() < reps {
            let released =
                release::release(&plan, &rw, &mech, &upstream_rows, &domains, false, &mut rng)
                    .map_err(|e| fail(format!("release: {e}")))?;
            answers.push(answer_from_cells(&plan, released.rows())?);
        }
        for (ai, agg) in plan.aggregates().iter().enumerate() {
            rows.push(measure_row(
                &plan,
                &rw,
                &variances,
                &kurtoses,
                ai,
                agg.kind,
                s,
                &plain,
                &clipped,
                &answers,
                values.as_ref(),
                selection,
            ));
        }
    }
    eprintln!(
        "     upstream and pgdp {upstream_s:.1} s, {} in-process releases {:.1} s",
        reps * settings.len(),
        t_release.elapsed().as_secs_f64()
    );
    Ok(CaseResult {
        number: c.number,
        label: c.label,
        sql: c.template.replace("_{n}", ""),
        keys,
        candidates: clipped.len(),
        reps,
        rows,
        proxy_runs,
    })
}

#[allow(clippy::too_many_arguments)] // one call site; the parts are unrelated
fn measure_row(
    plan: &Plan,
    rw: &Rewrite,
    variances: &[f64],
    kurtoses: &[f64],
    ai: usize,
    kind: AggregateKind,
    s: &Setting,
    plain: &Answer,
    clipped: &BTreeMap<Key, Clipped>,
    answers: &[Answer],
    values: Option<&BTreeMap<Key, Vec<f64>>>,
    selection: bool,
) -> Row {
    let name = plan
        .outputs()
        .iter()
        .find(|o| o.source == OutputSource::Aggregate(ai))
        .map(|o| o.name.strip_suffix("_0").unwrap_or(&o.name).to_string())
        .unwrap_or_else(|| kind.sql_name().to_string());
    let is_quantile = matches!(kind, AggregateKind::Quantile { .. });
    // The true groups: those of the plain answer with a value.
    let truth: BTreeMap<&Key, f64> = plain
        .iter()
        .filter_map(|(k, v)| v[ai].map(|x| (k, x)))
        .collect();
    let clipped_values: BTreeMap<&Key, f64> = clipped
        .iter()
        .map(|(k, g)| (k, clipped_value(plan, rw, ai, g)))
        .collect();
    let sigmas: BTreeMap<&Key, f64> = clipped
        .iter()
        .map(|(k, g)| (k, theoretical_sigma(plan, rw, variances, ai, g)))
        .collect();
    let near: BTreeSet<&Key> = clipped
        .iter()
        .filter(|(k, g)| near_clamp(plan, rw, variances, ai, g, clipped_values[k], sigmas[k]))
        .map(|(k, _)| k)
        .collect();
    let rank = |k: &Key, v: f64| -> Option<f64> {
        values
            .and_then(|vs| vs.get(k))
            .map(|vs| rank_fraction(vs, v))
    };

    let mut bias_abs = Vec::new();
    let mut bias_rel = Vec::new();
    for (k, p) in &truth {
        if let Some(cv) = clipped_values.get(k) {
            bias_abs.push((cv - p).abs());
            if *p != 0.0 {
                bias_rel.push((cv - p).abs() / p.abs());
            }
        }
    }
    let mut err_abs = Vec::new();
    let mut err_rel = Vec::new();
    let mut rank_err = Vec::new();
    let (mut sq_noise, mut sq_sigma, mut n_noise) = (0.0, 0.0, 0usize);
    let mut released_fractions = Vec::new();
    let mut spurious = 0usize;
    for a in answers {
        let mut released_true = 0usize;
        for (k, v) in a {
            // Partition selection may release only groups that exist in the data.
            if selection && !plain.contains_key(k) {
                spurious += 1;
                continue;
            }
            if plain.contains_key(k) {
                released_true += 1;
            }
            let Some(dp) = v[ai] else { continue };
            if let Some(p) = truth.get(k) {
                err_abs.push((dp - p).abs());
                if *p != 0.0 {
                    err_rel.push((dp - p).abs() / p.abs());
                }
                if is_quantile {
                    if let (Some(rd), Some(rp)) = (rank(k, dp), rank(k, *p)) {
                        rank_err.push((rd - rp).abs());
                    }
                }
            }
            if let (Some(cv), Some(sg)) = (clipped_values.get(k), sigmas.get(k)) {
                if sg.is_finite() && !near.contains(k) {
                    sq_noise += (dp - cv).powi(2);
                    sq_sigma += sg * sg;
                    n_noise += 1;
                }
            }
        }
        if !plain.is_empty() {
            released_fractions.push(released_true as f64 / plain.len() as f64);
        }
    }
    let rmse = |sq: f64| {
        if n_noise == 0 {
            f64::NAN
        } else {
            (sq / n_noise as f64).sqrt()
        }
    };
    Row {
        aggregate: name,
        setting: s.label(),
        refused: None,
        groups_true: plain.len(),
        released_fraction: if selection {
            Some(released_fractions.iter().sum::<f64>() / released_fractions.len().max(1) as f64)
        } else {
            None
        },
        spurious,
        bias_abs: median(&bias_abs),
        bias_rel: median(&bias_rel),
        err_abs: median(&err_abs),
        err_rel: median(&err_rel),
        rmse_noise: rmse(sq_noise),
        sigma: rmse(sq_sigma),
        ratio_se: {
            let kappa = rw.aggregate_measures[ai]
                .last()
                .map_or(f64::NAN, |&m| kurtoses[m]);
            0.5 * ((kappa - 1.0) / n_noise as f64).sqrt()
        },
        near_clamp: near
            .iter()
            .filter(|k| truth.contains_key(**k))
            .map(|k| k.to_string())
            .collect(),
        rank_err: if is_quantile {
            Some(median(&rank_err))
        } else {
            None
        },
        plain_typical: median(&truth.values().map(|x| x.abs()).collect::<Vec<_>>()),
    }
}

// ---------------------------------------------------------------------------------------------
// The report

/// A number with about three significant digits.
fn num(x: f64) -> String {
    if !x.is_finite() {
        return "—".into();
    }
    let a = x.abs();
    if a == 0.0 {
        "0".into()
    } else if a >= 1e6 {
        format!("{x:.3e}")
    } else if a >= 100.0 {
        format!("{x:.0}")
    } else if a >= 10.0 {
        format!("{x:.1}")
    } else if a >= 1.0 {
        format!("{x:.2}")
    } else if a >= 0.001 {
        format!("{x:.3}")
    } else {
        format!("{x:.2e}")
    }
}

fn pct(x: f64) -> String {
    if !x.is_finite() {
        return "—".into();
    }
    let p = 100.0 * x;
    if p == 0.0 {
        "0%".into()
    } else if p >= 10.0 {
        format!("{p:.0}%")
    } else if p >= 0.1 {
        format!("{p:.1}%")
    } else {
        format!("{p:.1e}%")
    }
}

#[allow(clippy::too_many_arguments)] // one call site; the parts are unrelated
fn report(
    o: &Options,
    m: &Machine,
    results: &[CaseResult],
    people: u64,
    visits: u64,
    charges: u64,
    sent: u64,
    seconds: f64,
) -> Res<String> {
    let mut r = String::new();
    writeln!(
        r,
        "Command: `{}`{}\n",
        o.command,
        if o.smoke {
            " (smoke mode: few repetitions, one setting; not for reading)"
        } else {
            ""
        }
    )?;
    writeln!(
        r,
        "- Machine: {}, {} cores, {:.1} GiB, Linux {}; upstream {} on the same machine",
        m.cpu, m.cores, m.memory_gib, m.kernel, m.postgres
    )?;
    writeln!(
        r,
        "- Run: {}, {:.0} s; demo data at scale {} ({people} people, {visits} visits)",
        m.date, seconds, o.scale
    )?;
    writeln!(
        r,
        "- R = {} repetitions per query and setting (a fifth for queries with more than {MANY_CANDIDATES} candidate groups): one end to end through pgdp for each query (at the setting named below the query), the rest by `pgdp::dp::release::release` on the rows of pgdp's rewritten SQL; fixed noise seeds and group-choice secret, so a rerun gives the same figures",
        o.reps
    )?;
    writeln!(
        r,
        "- Replay check: the ledger holds {charges} charges for {sent} queries sent through pgdp ({})",
        if charges == sent {
            "none answered from the replay cache"
        } else {
            "**some were replayed**"
        }
    )?;
    let flagged: Vec<String> = results
        .iter()
        .flat_map(|c| {
            c.rows
                .iter()
                .filter(|r| r.flagged())
                .map(move |r| format!("{} {} ({})", c.number, r.aggregate, r.setting))
        })
        .collect();
    writeln!(
        r,
        "- RMSE / σ farther from 1 than {RATIO_SLACK} + 4 standard errors: {}\n",
        if flagged.is_empty() {
            "none".to_string()
        } else {
            flagged.join("; ")
        }
    )?;
    for c in results {
        let title = if c.number == 0 {
            format!("#### {} (not in docs/queries.md)", c.label)
        } else {
            format!("#### {}. {}", c.number, c.label)
        };
        writeln!(r, "{title}\n\n```sql\n{}\n```\n", c.sql)?;
        writeln!(
            r,
            "Group keys: {}; {} true group(s), {} candidate group(s) after contribution bounding; R = {}; end to end through pgdp at {}.\n",
            c.keys,
            c.rows.first().map_or(0, |r| r.groups_true),
            c.candidates,
            c.reps,
            if c.proxy_runs.is_empty() {
                "no setting".to_string()
            } else {
                c.proxy_runs.join(", ")
            }
        )?;
        let quantile = c.rows.iter().any(|r| r.rank_err.is_some());
        let selection = c.rows.iter().any(|r| r.released_fraction.is_some());
        let mut header =
            String::from("| aggregate | setting | typical answer | bias: clipped − plain |");
        let mut rule = String::from("|---|---|---:|---:|");
        if selection {
            header.push_str(" groups released | spurious |");
            rule.push_str("---:|---:|");
        }
        header.push_str(
            " median abs. error | median rel. error | noise RMSE | σ (theory) | RMSE / σ |",
        );
        rule.push_str("---:|---:|---:|---:|---:|");
        if quantile {
            header.push_str(" median rank error |");
            rule.push_str("---:|");
        }
        writeln!(r, "{header}\n{rule}")?;
        for row in &c.rows {
            if let Some(why) = &row.refused {
                writeln!(
                    r,
                    "| {} | {} | refused: {} |",
                    row.aggregate,
                    row.setting,
                    why.replace('|', "/")
                )?;
                continue;
            }
            let mut line = format!(
                "| {} | {} | {} | {} ({}) |",
                row.aggregate,
                row.setting,
                num(row.plain_typical),
                num(row.bias_abs),
                pct(row.bias_rel)
            );
            if selection {
                write!(
                    line,
                    " {} | {} |",
                    pct(row.released_fraction.unwrap_or(f64::NAN)),
                    row.spurious
                )?;
            }
            let ratio = row.ratio();
            write!(
                line,
                " {} | {} | {} | {} | {}{} |",
                num(row.err_abs),
                pct(row.err_rel),
                num(row.rmse_noise),
                num(row.sigma),
                if ratio.is_finite() {
                    format!("{ratio:.2} ± {:.2}", row.ratio_se)
                } else {
                    "—".into()
                },
                if row.flagged() { " **check**" } else { "" }
            )?;
            if quantile {
                write!(line, " {} |", pct(row.rank_err.unwrap_or(f64::NAN)))?;
            }
            writeln!(r, "{line}")?;
        }
        r.push('\n');
        let near: Vec<String> = c
            .rows
            .iter()
            .filter(|row| !row.near_clamp.is_empty())
            .map(|row| {
                let keys: Vec<String> = row
                    .near_clamp
                    .iter()
                    .take(NEAR_CLAMP_LISTED)
                    .map(|k| {
                        if k.is_empty() {
                            "the one group".to_string()
                        } else {
                            k.replace('\u{1f}', "/")
                        }
                    })
                    .collect();
                let more = row.near_clamp.len().saturating_sub(NEAR_CLAMP_LISTED);
                format!(
                    "{} at {}: {}{}",
                    row.aggregate,
                    row.setting,
                    keys.join(" "),
                    if more > 0 {
                        format!(" and {more} more of the {} true groups", row.groups_true)
                    } else {
                        String::new()
                    }
                )
            })
            .collect();
        if !near.is_empty() {
            writeln!(
                r,
                "Left out of noise RMSE and σ, because pgdp's clamp is likely to act there (the clipped value is within 3σ of it): {}.\n",
                near.join("; ")
            )?;
        }
    }
    Ok(r)
}

const BEGIN: &str =
    "<!-- utility:begin (generated by benches/utility/main.rs; edits inside are overwritten) -->";
const END: &str = "<!-- utility:end -->";

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
        Err(_) => format!("# pgdp utility benchmark\n\n{section}\n"),
    };
    std::fs::write(path, text)?;
    Ok(())
}
