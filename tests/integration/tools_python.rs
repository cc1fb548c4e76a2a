//! Analysts' Python tools against pgdp: Django's ORM (psycopg 3, in both of its binding modes) and
//! pgcli, each driven by a program in `tests/tools/python/`.
//!
//! `django_orm.py` declares unmanaged models over `demo.people`, `demo.visits` (with a nullable
//! ForeignKey to people, which Django joins with LEFT OUTER JOIN) and `demo.regions`, and runs
//! ordinary ORM operations, one named check each: `.count()` (of people and of visits), `.aggregate(Avg, Sum, Count)`,
//! `.values(..).annotate(Count)`, `TruncMonth`, `Count(.., filter=Q(..))`, `.filter(..).count()`,
//! `icontains` (`UPPER(col) LIKE UPPER(…)`), a filter on a DateTimeField by an aware datetime,
//! `.exists()`, the join over the nullable ForeignKey, annotate + filter (HAVING), the public
//! table, and raw rows (`Person.objects.all()[:5]`), which pgdp must refuse. It runs once with
//! Django's default client-side binding and once with `server_side_binding`. `pgcli_client.py`
//! runs pgcli's own command line (`pgcli -c …`: start-up with a local time zone that differs
//! from the server's, `\dt demo.*`, `\d demo.people`, a DP query, a refusal), each refresher
//! of the completion metadata that pgcli's interactive mode loads, and one interactive session
//! in a pseudo-terminal (start-up, the completion refresh in its thread, a DP query typed at the
//! prompt). `django_synopsis.py` runs a dashboard of Django counting operations over
//! demo.people's region, sex and education (`.count()`, `.filter(..).count()`,
//! `.values(..).annotate(Count(..))` with `filter`, `exclude`, `order_by`, `Count('pk')`, a
//! reload) against a policy with the synopsis people_cube: `ok` only when pgdp's NOTICE says the
//! answer came from the synopsis, nothing was charged after the answer that paid for it (its
//! NOTICE and `SHOW pgdp.budget`), and every count is within the NOTICE's stated 95 % bound of
//! PostgreSQL's (at most a tenth of a check's counts outside); an answer of the per-query path is
//! a mismatch, so [`DJANGO_SYNOPSIS`] tells which operations fall back.
//!
//! Every operation is also run against the upstream PostgreSQL database holding the demo data
//! (`PGDP_UPSTREAM_DSN`): an answer counts as `ok` only when its result column types (type
//! OIDs), the Python types of its values and its values are what PostgreSQL gives, the values
//! within plausibility ranges only (pgdp's are noisy: a count of people or of all visits within
//! 2 % of PostgreSQL's, counts of visits per group within 5 %, 10 % per month; the demo chooses
//! each query's caps on visits per person). A program prints `ok <check> …` or
//! `FAIL <check>: refused sqlstate=… | mismatch … | error …` per check, with the SQL pgdp
//! received, and exits with 0 once it has reported them all.
//!
//! The tables below hold the outcome each check has today, [`Expect::Ok`] or
//! [`Expect::Refused`] with its SQLSTATE, asserted exactly both ways: a check that starts passing
//! (or refusing with another SQLSTATE) fails its test until its line here is updated, so the
//! tables always tell what pgdp does with these tools.
//!
//! Toolchain: `tests/tools/python/.venv`, made by `.ci/setup-python-tools` from the pinned
//! `requirements.txt`. Missing, `build.rs` marks the tests ignored with that as the reason (none
//! under `CI=true`), and a test that runs without it fails.
//! Nothing here prints to stdout.

use std::path::{Path, PathBuf};

use crate::clients::{require, run_client_in, start_proxy, ClientRun};
use crate::harness;
use crate::support::{self, Proxy};

/// The expected outcome of one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// Answered as PostgreSQL answers (types, plausible values).
    Ok,
    /// Refused with this SQLSTATE.
    Refused(&'static str),
}

/// Django's ORM with client-side binding (psycopg 3's ClientCursor, Django's default).
const DJANGO_CLIENT_BINDING: &[(&str, Expect)] = &[
    ("connect", Expect::Ok),
    // Django's SELECT set_config('TimeZone', %s, false) on connect, sent when the zone it wants
    // (a database's TIME_ZONE, or TIME_ZONE with USE_TZ = False) is not the one pgdp reports:
    // the SET it means.
    ("connect_time_zone", Expect::Ok),
    ("count", Expect::Ok),
    ("visit_count", Expect::Ok),
    ("aggregate", Expect::Ok),
    ("values_annotate", Expect::Ok),
    ("trunc_month", Expect::Ok),
    ("count_filter", Expect::Ok),
    ("filter_count", Expect::Ok),
    // UPPER(diagnosis::text) LIKE UPPER('%j0%'): the pattern folded to its literal.
    ("icontains", Expect::Ok),
    // checked_in >= '2024-06-01T00:00:00+00:00'::timestamptz
    ("checked_in_since", Expect::Ok),
    // DATE_TRUNC('month', checked_in AT TIME ZONE 'UTC'): USE_TZ's truncation in UTC.
    ("trunc_month_checked_in", Expect::Ok),
    // (checked_in AT TIME ZONE 'UTC')::date >= '2024-06-01'::date
    ("checked_in_date", Expect::Ok),
    // .iterator(): a server-side cursor WITH HOLD, its portal described, FETCH FORWARD 4.
    ("iterator", Expect::Ok),
    // values(k).distinct().count() and values(k1, k2).annotate(…).count(): a count of groups,
    // answered as COUNT(DISTINCT ROW(…)), compared with PostgreSQL's count of groups.
    ("distinct_count", Expect::Ok),
    ("distinct_months_count", Expect::Ok),
    ("group_count", Expect::Ok),
    // SELECT 1 AS "a" … LIMIT 1 tells whether a row exists: refused like raw rows (the hint
    // says to count instead).
    ("exists", Expect::Refused("42501")),
    ("join_nullable_fk", Expect::Ok),
    ("having", Expect::Ok),
    ("public_table", Expect::Ok),
    // Raw rows of a private table: refused, as they must be.
    ("raw_rows", Expect::Refused("42501")),
];

/// Django's ORM with `OPTIONS: {"server_side_binding": True}` ($1 … in the extended protocol).
const DJANGO_SERVER_BINDING: &[(&str, Expect)] = &[
    ("connect", Expect::Ok),
    // As with client-side binding (set_config with $1).
    ("connect_time_zone", Expect::Ok),
    ("count", Expect::Ok),
    ("visit_count", Expect::Ok),
    ("aggregate", Expect::Ok),
    ("values_annotate", Expect::Ok),
    ("trunc_month", Expect::Ok),
    ("count_filter", Expect::Ok),
    ("filter_count", Expect::Ok),
    // UPPER(diagnosis::text) LIKE UPPER($1): the pattern folded to its literal.
    ("icontains", Expect::Ok),
    // An aware datetime, sent by psycopg 3 as a binary timestamptz.
    ("checked_in_since", Expect::Ok),
    // AT TIME ZONE $1, the zone bound as a parameter.
    ("trunc_month_checked_in", Expect::Ok),
    ("checked_in_date", Expect::Ok),
    // .iterator(): DECLARE … WITH HOLD with $1 bound, the portal described, FETCH FORWARD 4.
    ("iterator", Expect::Ok),
    // values(k).distinct().count() and values(k1, k2).annotate(…).count(): a count of groups,
    // answered as COUNT(DISTINCT ROW(…)), compared with PostgreSQL's count of groups.
    ("distinct_count", Expect::Ok),
    ("distinct_months_count", Expect::Ok),
    ("group_count", Expect::Ok),
    // SELECT $1 AS "a" … LIMIT 1: with its value in place, whether a row exists (42501), as
    // with client-side binding.
    ("exists", Expect::Refused("42501")),
    ("join_nullable_fk", Expect::Ok),
    ("having", Expect::Ok),
    ("public_table", Expect::Ok),
    // Raw rows of a private table: refused, as they must be.
    ("raw_rows", Expect::Refused("42501")),
];

/// A Django ORM dashboard against a policy with the synopsis people_cube over demo.people's
/// region, sex and education: `ok` when answered from the synopsis, charged nothing after the
/// answer that paid for it, and within its stated bounds of PostgreSQL's counts.
const DJANGO_SYNOPSIS: &[(&str, Expect)] = &[
    // `.count()`: SELECT COUNT(*) AS "__count" FROM "demo"."people", the answer that pays.
    ("total", Expect::Ok),
    ("count_filter", Expect::Ok),
    // `region__in`: WHERE … IN ('CE', 'EA').
    ("count_in", Expect::Ok),
    // ORDER BY 1 ASC over the released counts.
    ("by_region", Expect::Ok),
    // ORDER BY 2 DESC: ordered by the noisy counts.
    ("by_sex_filtered", Expect::Ok),
    ("by_region_sex", Expect::Ok),
    // COUNT("demo"."people"."person_id"): the primary key is NOT NULL upstream, so a count of
    // rows, routed to the synopsis (before COUNT(x) of a never-NULL x was routed, it took the
    // per-query path and was charged).
    ("count_pk", Expect::Ok),
    // COUNT("demo"."people"."sex"): sex is exhaustive in the policy, so never NULL, as above.
    ("count_column", Expect::Ok),
    // `.exclude(region='CE')`: WHERE NOT ("demo"."people"."region" = 'CE').
    ("exclude", Expect::Ok),
    // by_region and count_filter again, a dashboard's reload: charged nothing.
    ("reload", Expect::Ok),
];

/// pgcli: its command line, and the refreshers of its completion metadata.
const PGCLI: &[(&str, Expect)] = &[
    ("startup", Expect::Ok),
    ("refresh_schemata", Expect::Ok),
    ("refresh_tables", Expect::Ok),
    ("refresh_views", Expect::Ok),
    ("refresh_types", Expect::Ok),
    ("refresh_databases", Expect::Ok),
    ("refresh_functions", Expect::Ok),
    ("dt", Expect::Ok),
    ("d_people", Expect::Ok),
    ("dp_query", Expect::Ok),
    // SELECT * FROM demo.people: refused, as it must be.
    ("refusal", Expect::Refused("42501")),
    ("interactive", Expect::Ok),
];

fn tools_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/tools/python")
}

fn venv_python() -> PathBuf {
    tools_dir().join(".venv/bin/python")
}

fn require_venv() {
    require(
        venv_python().is_file(),
        "tests/tools/python/.venv (bash .ci/setup-python-tools)",
    )
}

/// Whether a check's reported result is the expected outcome: `ok`, or a refusal with the
/// expected SQLSTATE (never a mismatch with PostgreSQL or another error).
fn outcome_is(expect: Expect, result: &Result<String, String>) -> bool {
    match (expect, result) {
        (Expect::Ok, Ok(_)) => true,
        (Expect::Refused(code), Err(error)) => error
            .strip_prefix("refused sqlstate=")
            .and_then(|rest| rest.split_whitespace().next())
            .is_some_and(|sqlstate| sqlstate == code),
        _ => false,
    }
}

/// Asserts that the program reported exactly the checks of `expected`, each with its outcome,
/// and exited with 0.
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

/// Runs `args` with the venv's Python in `tests/tools/python/` against a fresh pgdp, with the
/// upstream demo database's DSN for the comparison with PostgreSQL.
async fn run_tool(seed: u8, what: &str, args: &[&str], expected: &[(&str, Expect)]) {
    run_tool_on(start_proxy(seed).await, what, args, expected).await;
}

/// [`run_tool`] against `proxy`.
async fn run_tool_on(proxy: Proxy, what: &str, args: &[&str], expected: &[(&str, Expect)]) {
    require_venv();
    let upstream = harness::demo_database(1).await;
    let run = run_client_in(
        &proxy,
        what,
        &tools_dir(),
        &venv_python(),
        args,
        &[("PGDP_UPSTREAM_DSN", upstream.dsn())],
    )
    .await;
    assert_outcomes(&run, expected);
    proxy.stop().await;
}

#[tokio::test]
#[cfg_attr(
    missing_toolchain = "tools-python",
    ignore = "needs tests/tools/python/.venv: bash .ci/setup-python-tools installs it (CI does)"
)]
async fn django_orm_client_side_binding() {
    run_tool(
        71,
        "Django ORM, client-side binding",
        &["django_orm.py", "client"],
        DJANGO_CLIENT_BINDING,
    )
    .await;
}

#[tokio::test]
#[cfg_attr(
    missing_toolchain = "tools-python",
    ignore = "needs tests/tools/python/.venv: bash .ci/setup-python-tools installs it (CI does)"
)]
async fn django_orm_server_side_binding() {
    run_tool(
        72,
        "Django ORM, server-side binding",
        &["django_orm.py", "server"],
        DJANGO_SERVER_BINDING,
    )
    .await;
}

#[tokio::test]
#[cfg_attr(
    missing_toolchain = "tools-python",
    ignore = "needs tests/tools/python/.venv: bash .ci/setup-python-tools installs it (CI does)"
)]
async fn django_dashboard_from_a_synopsis() {
    // Seeded: the answers are always or never within their bounds. A check of a single count
    // allows none outside its 95 % bound, so about one seed in twenty per fresh noisy count
    // fails (seed 75 draws count_in's 190 rows from PostgreSQL's against 181, seed 78 one of
    // by_sex_filtered's 3 counts 251 rows off): a failure with another seed is that, not a bug.
    run_tool_on(
        Proxy::with_policy(support::people_cube_policy(), 76).await,
        "Django ORM dashboard over a synopsis",
        &["django_synopsis.py"],
        DJANGO_SYNOPSIS,
    )
    .await;
}

#[tokio::test]
#[cfg_attr(
    missing_toolchain = "tools-python",
    ignore = "needs tests/tools/python/.venv: bash .ci/setup-python-tools installs it (CI does)"
)]
async fn pgcli_startup_completions_describe_dp_query_refusal() {
    run_tool(73, "pgcli", &["pgcli_client.py"], PGCLI).await;
}
