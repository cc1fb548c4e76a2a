//! Apache Superset against pgdp, driven in-process through its own APIs by
//! `tests/tools/superset/superset_checks.py`.
//!
//! The program runs Superset inside its Python process (`superset.app.create_app()` and Flask's
//! test client, a throwaway SQLite metadata database copied from the template that
//! `.ci/setup-superset` migrated) and registers two Superset databases: one through this test's
//! pgdp, one straight to the upstream PostgreSQL database that pgdp serves (`PGDP_UPSTREAM_DSN`).
//! Each named check is one thing an analyst does in Superset:
//!
//! - connecting: the connection test, creating the database, the schema and table lists and a
//!   table's columns (`/api/v1/database/<id>/schemas/`, `/tables/`, `/table/visits/demo/`,
//!   `/table_metadata/`, `/table_extra/`, `/select_star/`), and a dataset over demo.visits and
//!   one over demo.people (their column types, as Superset introspects them);
//! - charts, through `POST /api/v1/chart/data` with the query context Superset's frontend builds:
//!   a big number (`COUNT(*)`) over people and over visits; a bar chart of `COUNT(*)` and
//!   `AVG(cost)` by clinic; a line chart by month with a time range (`visit_date >=
//!   TO_DATE('2023-01-01', 'YYYY-MM-DD') AND …`); a line chart by month and clinic with a series
//!   limit of 5 by `AVG(cost)` (Superset joins the main query to a `GROUP BY clinic ORDER BY
//!   AVG(cost) DESC LIMIT 5` subquery); and a table chart in raw-records mode, which pgdp must
//!   refuse;
//! - filters: the values of a filter dropdown from the datasource values endpoint (`SELECT
//!   DISTINCT clinic AS column_values FROM demo.visits LIMIT 10000`) and from a native select
//!   filter (`SELECT clinic … GROUP BY clinic ORDER BY clinic LIMIT 1000`), over demo.visits.clinic
//!   (released by partition selection) and demo.people.region (`public_values`);
//! - SQL Lab running a query over the public table demo.regions.
//!
//! Every answered chart is run on the upstream too, and counts as `ok` only when Superset's column
//! types (`coltypes`) and the statement's result type OIDs are the upstream's and its values are
//! plausible: a count of people or of all visits within 2 % of PostgreSQL's, counts of visits
//! within 25 % per clinic beside `AVG(cost)` (which shares ε) and 10 % per month (the demo chooses each query's caps on visits per
//! person, so its counts estimate PostgreSQL's); `AVG(cost)` within the policy's bounds, as
//! it estimates the mean of cost clamped into them; released values a subset of the upstream's.
//! SQL Lab's rows over the public table must be the upstream's exactly.
//!
//! The program prints `ok <check> <detail>` or `FAIL <check>: refused sqlstate=… | differs: … |
//! error: …` per check, with the SQL Superset sent through pgdp. [`EXPECTED`] holds the outcome
//! each check has with today's pgdp, asserted exactly both ways: a check that starts passing, or
//! is refused with another SQLSTATE, fails the test until its line is updated, so the table always
//! tells what pgdp does with Superset.
//!
//! [`superset_dashboard_from_a_synopsis`] runs the program with `PGDP_SYNOPSIS=people_cube`
//! against a pgdp whose policy declares that synopsis over demo.people's region, sex and education
//! (the demo policy at the tables' caps, ε 1000): the connecting checks, the people dataset, and a
//! dashboard of a big number `COUNT(*)` of people, a bar chart of `COUNT(*)` by region, the same
//! with the adhoc filter `sex IN ('F')`, one by education with `region = 'CE'`, and a reload of
//! the first two. Each is `ok` only when its counts are within 3,000 rows of PostgreSQL's (the
//! synopsis's 95 % bounds are about ±2,500), its types are the upstream's, and the analyst's
//! `epsilon_spent` (`SHOW pgdp.budget` through pgdp) grew on the first chart, which pays for the
//! synopsis, and not at all on any later one: a chart whose SQL is not answered from the synopsis
//! is reported `FAIL … charged after the synopsis was paid for` with the SQL Superset sent
//! ([`EXPECTED_SYNOPSIS`]).
//!
//! Toolchain: `tests/tools/superset/.venv` with the metadata template, made by
//! `.ci/setup-superset` from the pinned `requirements.txt`. Missing, `build.rs` marks the test
//! ignored with that as the reason (not under `CI=true`), and a run without it fails. Nothing
//! here prints to stdout.

use std::path::{Path, PathBuf};

use crate::clients::{require, run_client_in, start_proxy, ClientRun};
use crate::harness;
use crate::support::{self, Proxy};

/// The expected outcome of one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// Answered as PostgreSQL answers it (types, plausible values).
    Ok,
    /// Refused by pgdp with this SQLSTATE.
    Refused(&'static str),
}

/// What each check gives with today's pgdp.
const EXPECTED: &[(&str, Expect)] = &[
    ("connect_test_connection", Expect::Ok),
    ("connect_create_database", Expect::Ok),
    ("connect_schemas", Expect::Ok),
    ("connect_tables", Expect::Ok),
    ("connect_table_metadata", Expect::Ok),
    ("dataset_visits", Expect::Ok),
    ("dataset_people", Expect::Ok),
    ("big_number_people", Expect::Ok),
    ("big_number_visits", Expect::Ok),
    ("bar_chart_by_clinic", Expect::Ok),
    ("line_chart_by_month_time_range", Expect::Ok),
    ("filter_values_visits_clinic", Expect::Ok),
    ("filter_values_people_region", Expect::Ok),
    ("native_filter_visits_clinic", Expect::Ok),
    ("native_filter_people_region", Expect::Ok),
    ("series_limit_chart", Expect::Ok),
    ("sqllab_public_table", Expect::Ok),
    // Raw rows: must stay refused (see `raw_rows_stay_refused`).
    ("raw_rows_table_chart", Expect::Refused("42501")),
];

/// What each check of the dashboard over a synopsis (`PGDP_SYNOPSIS`) gives with today's pgdp:
/// every chart answered from the synopsis, charged nothing after the first.
const EXPECTED_SYNOPSIS: &[(&str, Expect)] = &[
    ("connect_test_connection", Expect::Ok),
    ("connect_create_database", Expect::Ok),
    ("connect_schemas", Expect::Ok),
    ("connect_tables", Expect::Ok),
    ("connect_table_metadata", Expect::Ok),
    ("dataset_people", Expect::Ok),
    ("synopsis_big_number_people", Expect::Ok),
    ("synopsis_bar_by_region", Expect::Ok),
    ("synopsis_bar_by_region_sex_f", Expect::Ok),
    ("synopsis_bar_by_education_region_ce", Expect::Ok),
    ("synopsis_reload_big_number_people", Expect::Ok),
    ("synopsis_reload_bar_by_region", Expect::Ok),
];

/// The check whose rows no version of pgdp may answer.
const RAW_ROWS: &str = "raw_rows_table_chart";

fn tools_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/tools/superset")
}

fn venv_python() -> PathBuf {
    tools_dir().join(".venv/bin/python")
}

/// Superset's metadata database as `.ci/setup-superset` initialised it.
fn metadata_template() -> PathBuf {
    tools_dir().join(".venv/pgdp-superset-metadata.sqlite")
}

/// The SQLSTATE of a reported refusal, `FAIL <check>: refused sqlstate=<code> …`.
fn refused_sqlstate(error: &str) -> Option<&str> {
    error
        .strip_prefix("refused sqlstate=")
        .and_then(|rest| rest.split_whitespace().next())
}

/// Whether a check's reported result is the expected outcome: `ok`, or a refusal with the
/// expected SQLSTATE (never an answer that differs from the upstream's, nor another error).
fn outcome_is(expect: Expect, result: &Result<String, String>) -> bool {
    match (expect, result) {
        (Expect::Ok, Ok(_)) => true,
        (Expect::Refused(code), Err(error)) => refused_sqlstate(error) == Some(code),
        _ => false,
    }
}

/// Asserts that the program reported exactly the checks of `expected` ([`EXPECTED`] or
/// [`EXPECTED_SYNOPSIS`]), each with its outcome, and exited with 0.
#[track_caller]
fn assert_outcomes(run: &ClientRun, expected: &[(&str, Expect)]) {
    let checks = run.checks();
    let mut wrong = Vec::new();
    for (name, expect) in expected {
        match checks.get(*name) {
            None => wrong.push(format!("{name}: expected {expect:?}, not reported")),
            Some(result) if !outcome_is(*expect, result) => {
                wrong.push(format!("{name}: expected {expect:?}, got {result:?}"));
            }
            Some(_) => {}
        }
    }
    for name in checks.keys() {
        if !expected.iter().any(|(n, _)| *n == name.as_str()) {
            wrong.push(format!(
                "{name}: reported, but not in the expectation table"
            ));
        }
    }
    assert!(
        wrong.is_empty() && run.status == Some(0),
        "{}: status {:?}; checks whose outcome is not the table's (update the table when pgdp \
         changed on purpose):\n  {}\nstdout:\n{}\nstderr:\n{}",
        run.what,
        run.status,
        wrong.join("\n  "),
        run.stdout,
        run.stderr
    );
}

#[test]
fn raw_rows_stay_refused() {
    let raw = EXPECTED.iter().find(|(name, _)| *name == RAW_ROWS);
    assert!(
        matches!(raw, Some((_, Expect::Refused(_)))),
        "Superset's raw-records table chart must be refused: {raw:?}"
    );
}

#[tokio::test]
#[cfg_attr(
    missing_toolchain = "superset",
    ignore = "needs tests/tools/superset/.venv: bash .ci/setup-superset installs it (CI does)"
)]
async fn superset_charts_filters_and_sql_lab() {
    require(
        venv_python().is_file() && metadata_template().is_file(),
        "tests/tools/superset/.venv with its metadata template (bash .ci/setup-superset)",
    );
    let upstream = harness::demo_database(1).await;
    let proxy = start_proxy(91).await;
    let run = run_client_in(
        &proxy,
        "Apache Superset",
        &tools_dir(),
        &venv_python(),
        &["superset_checks.py"],
        &[("PGDP_UPSTREAM_DSN", upstream.dsn())],
    )
    .await;
    assert_outcomes(&run, EXPECTED);
    proxy.stop().await;
}

#[tokio::test]
#[cfg_attr(
    missing_toolchain = "superset",
    ignore = "needs tests/tools/superset/.venv: bash .ci/setup-superset installs it (CI does)"
)]
async fn superset_dashboard_from_a_synopsis() {
    require(
        venv_python().is_file() && metadata_template().is_file(),
        "tests/tools/superset/.venv with its metadata template (bash .ci/setup-superset)",
    );
    let upstream = harness::demo_database(1).await;
    let proxy = Proxy::with_policy(support::people_cube_policy(), 97).await;
    let run = run_client_in(
        &proxy,
        "Apache Superset dashboard over a synopsis",
        &tools_dir(),
        &venv_python(),
        &["superset_checks.py"],
        &[
            ("PGDP_UPSTREAM_DSN", upstream.dsn()),
            ("PGDP_SYNOPSIS", "people_cube"),
        ],
    )
    .await;
    assert_outcomes(&run, EXPECTED_SYNOPSIS);
    proxy.stop().await;
}
