//! The client matrix: real PostgreSQL clients against an in-process pgdp over the demo data.
//!
//! Each test starts its own pgdp (a fresh ledger, a fixed noise seed, a budget large enough for
//! every client's queries), runs one client program from `tests/clients/` against it, and asserts
//! on what the client printed: every client program prints `ok <check> <detail>` or
//! `FAIL <check>: <error>` per named check, and each test names the checks it requires. psql and
//! isql are driven directly and their output is asserted here; tokio-postgres runs in-process.
//! `docs/clients.md` lists what each row checks.
//!
//! The introspection fixtures (`tests/fixtures/introspection/*.sql`, queries that Metabase and
//! Tableau send, with their source) are replayed through the simple and the extended protocol, and
//! each must be answered without a leak (no value of the upstream's row counts or sizes, and every
//! statistics column zero) or refused with the SQLSTATE the fixture records.
//!
//! Toolchains. The clients come from `.ci/setup-clients`, which `.ci/run` runs first (Debian
//! packages, `tests/clients/.venv` from the pinned `requirements.txt`, `tests/clients/node_modules`
//! from `package-lock.json`). Where one is missing, `build.rs` marks the tests that need it
//! ignored, with what to install as the reason, so `cargo test` counts them as ignored and names
//! the setup script on each line; with `CI=true` it marks none. Behind that, each test checks its
//! toolchain again when it starts and fails, naming what is missing, rather than pass without
//! running.
//!
//! Nothing here prints to stdout.

// The client tests use only part of the integration support module.
#[allow(dead_code)]
use crate::support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio_postgres::types::Type;
use tokio_postgres::{NoTls, SimpleQueryMessage};

use support::{Proxy, ANALYST, DATABASE, PASSWORD};

/// How long one client program may run.
pub(crate) const CLIENT_TIMEOUT: Duration = Duration::from_secs(120);

/// pgjdbc as Debian's libpostgresql-jdbc-java installs it.
const PGJDBC_JAR: &str = "/usr/share/java/postgresql.jar";

/// The psqlODBC driver name that Debian's odbc-postgresql registers in odbcinst.ini.
const ODBC_DRIVER: &str = "PostgreSQL Unicode";

pub(crate) fn clients_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients")
}

fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/introspection")
}

/// pgdp for one client: the demo policy with room for every query a client sends (each client
/// spends at most a few ε; the per-query cap stays at the demo's 2).
pub(crate) async fn start_proxy(seed: u8) -> Proxy {
    Proxy::with_policy(support::shipped_policy_with_budget(1000, 2), seed).await
}

/// Fails the test when `what` is missing. `build.rs` marks a test ignored when its toolchain is
/// missing (outside CI), so this fails only where the two disagree (a toolchain removed since
/// the build, another `PATH`) or in CI, where a missing toolchain is an error: either way a test
/// that cannot run must not pass.
#[track_caller]
pub(crate) fn require(present: bool, what: &str) {
    assert!(
        present,
        "client toolchain missing: {what}. With CI=true that is an error; otherwise build.rs \
         found it when the tests were built: install it, or `touch build.rs` to have the test \
         reported as ignored"
    );
}

pub(crate) fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(program).is_file()))
}

pub(crate) fn venv_python() -> PathBuf {
    clients_dir().join(".venv/bin/python")
}

pub(crate) fn require_python() {
    require(
        venv_python().is_file(),
        "tests/clients/.venv (bash .ci/setup-clients)",
    )
}

/// What a client program printed: its checks by name.
#[derive(Debug)]
pub(crate) struct ClientRun {
    pub(crate) what: String,
    pub(crate) status: Option<i32>,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
}

impl ClientRun {
    /// `ok` / `FAIL` lines by check name: `Ok(detail)` or `Err(error)`.
    pub(crate) fn checks(&self) -> BTreeMap<String, Result<String, String>> {
        let mut checks = BTreeMap::new();
        for line in self.stdout.lines() {
            if let Some(rest) = line.strip_prefix("ok ") {
                let (name, detail) = rest.split_once(' ').unwrap_or((rest, ""));
                checks.insert(name.to_string(), Ok(detail.to_string()));
            } else if let Some(rest) = line.strip_prefix("FAIL ") {
                let (name, error) = rest.split_once(": ").unwrap_or((rest, ""));
                checks.insert(name.to_string(), Err(error.to_string()));
            }
        }
        checks
    }

    /// Asserts that every one of `names` was reported `ok` and the program exited with 0.
    #[track_caller]
    pub(crate) fn assert_ok(&self, names: &[&str]) {
        let checks = self.checks();
        let mut failures = Vec::new();
        for name in names {
            match checks.get(*name) {
                Some(Ok(_)) => {}
                Some(Err(e)) => failures.push(format!("{name}: {e}")),
                None => failures.push(format!("{name}: not reported")),
            }
        }
        assert!(
            failures.is_empty() && self.status == Some(0),
            "{}: status {:?}\nfailed checks:\n  {}\nstdout:\n{}\nstderr:\n{}",
            self.what,
            self.status,
            failures.join("\n  "),
            self.stdout,
            self.stderr
        );
    }
}

/// Runs a client program with pgdp's address in its environment.
pub(crate) async fn run_client(
    proxy: &Proxy,
    what: &str,
    program: &Path,
    args: &[&str],
    checks: &[&str],
) -> ClientRun {
    let args: Vec<&str> = args.iter().chain(checks).copied().collect();
    run_client_in(proxy, what, &clients_dir(), program, &args, &[]).await
}

/// Runs `program` in `dir` with pgdp's address (`PGDP_HOST`, `PGDP_PORT`, `PGDP_USER`,
/// `PGDP_PASSWORD`, `PGDP_DATABASE`) and `env` in its environment.
pub(crate) async fn run_client_in(
    proxy: &Proxy,
    what: &str,
    dir: &Path,
    program: &Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> ClientRun {
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args)
        .current_dir(dir)
        .env("PGDP_HOST", "127.0.0.1")
        .env("PGDP_PORT", proxy.port().to_string())
        .env("PGDP_USER", ANALYST)
        .env("PGDP_PASSWORD", PASSWORD)
        .env("PGDP_DATABASE", DATABASE)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("LC_ALL", "C")
        .env_remove("PGOPTIONS")
        .env_remove("PGSERVICE")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let output = tokio::time::timeout(CLIENT_TIMEOUT, cmd.output())
        .await
        .unwrap_or_else(|_| panic!("{what} did not finish in {CLIENT_TIMEOUT:?}"))
        .unwrap_or_else(|e| panic!("{what} could not be run ({}): {e}", program.display()));
    ClientRun {
        what: what.to_string(),
        status: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

pub(crate) async fn run_python(proxy: &Proxy, script: &str, checks: &[&str]) -> ClientRun {
    run_client(proxy, script, &venv_python(), &[script], checks).await
}

// ---------------------------------------------------------------------------------------------
// psql

/// Runs `psql -X -f <script>` from `tests/clients/` as the demo analyst.
async fn psql_script(proxy: &Proxy, script: &str) -> ClientRun {
    let port = proxy.port().to_string();
    let args = [
        "-X",
        "-h",
        "127.0.0.1",
        "-p",
        &port,
        "-U",
        ANALYST,
        "-d",
        DATABASE,
        "-f",
        script,
    ];
    let mut cmd = tokio::process::Command::new("psql");
    cmd.args(args)
        .current_dir(clients_dir())
        .env("PGPASSWORD", PASSWORD)
        .env("PGCONNECT_TIMEOUT", "10")
        .env("LC_ALL", "C")
        .env_remove("PGOPTIONS")
        .env_remove("PGSERVICE")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let output = tokio::time::timeout(CLIENT_TIMEOUT, cmd.output())
        .await
        .expect("psql did not finish in time")
        .expect("psql could not be run");
    ClientRun {
        what: format!("psql -f {script}"),
        status: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// The rows of the psql table (aligned format) whose title line contains `title`: the lines after
/// its column names and rule, up to the `(N rows)` footer or an empty line.
fn psql_table<'a>(stdout: &'a str, title: &str) -> Vec<Vec<&'a str>> {
    let mut lines = stdout.lines().skip_while(|l| !l.contains(title));
    let _title = lines.next();
    let _column_names = lines.next();
    let _rule = lines.next();
    // The rows end at the row count, a blank line, or a footer such as `Indexes:`.
    lines
        .take_while(|l| !l.starts_with('(') && l.contains('|'))
        .map(|l| l.split('|').map(str::trim).collect())
        .collect()
}

#[tokio::test]
async fn psql_describe_dp_query_refusal_and_explain() {
    require(on_path("psql"), "psql (postgresql-client)");
    let proxy = start_proxy(11).await;
    let run = psql_script(&proxy, "psql_matrix.sql").await;
    assert_eq!(run.status, Some(0), "{run:#?}");
    let out = &run.stdout;

    // \d with demo on the search path: the four policy tables, and nothing else.
    let relations = psql_table(out, "List of relations");
    let names: Vec<&str> = relations.iter().map(|r| r[1]).collect();
    assert_eq!(
        names,
        ["people", "prescriptions", "regions", "visits"],
        "\\d: {run:#?}"
    );
    assert!(relations.iter().all(|r| r[0] == "demo" && r[2] == "table"));

    // \dt demo.*
    let out_after_dt = &out[out.find("-- dt").expect("marker -- dt")..];
    let tables = psql_table(out_after_dt, "List of relations");
    let names: Vec<&str> = tables.iter().map(|r| r[1]).collect();
    assert_eq!(
        names,
        ["people", "prescriptions", "regions", "visits"],
        "\\dt demo.*: {run:#?}"
    );

    // \d demo.people: the declared columns with their upstream types.
    let columns = psql_table(out, "Table \"demo.people\"");
    let columns: BTreeMap<&str, &str> = columns.iter().map(|r| (r[0], r[1])).collect();
    let expected: BTreeMap<&str, &str> = [
        ("person_id", "bigint"),
        ("age", "integer"),
        ("sex", "text"),
        ("region", "text"),
        ("education", "text"),
        ("income", "numeric(12,2)"),
    ]
    .into_iter()
    .collect();
    assert_eq!(columns, expected, "\\d demo.people: {run:#?}");

    // The DP query: a noisy count near 100,000 and the NOTICE of its charge.
    let count_line = out
        .lines()
        .find_map(|l| l.strip_prefix("dp_count="))
        .unwrap_or_else(|| panic!("no DP count: {run:#?}"));
    let count: i64 = count_line.trim().parse().expect("count is an integer");
    assert!((99_000..=101_000).contains(&count), "count {count}");
    assert!(run.stderr.contains("pgdp: charged epsilon"), "{run:#?}");

    // The refused query, with its SQLSTATE shown by VERBOSITY verbose.
    assert!(run.stderr.contains("ERROR:  42501"), "{run:#?}");
    assert!(out.contains("after_refusal=1"), "{run:#?}");

    // EXPLAIN: the release plan and the upstream SQL, with the group-choice secret redacted.
    let plan = &out[out.find("QUERY PLAN").expect("EXPLAIN output")..];
    assert!(plan.contains("upstream SQL"), "{run:#?}");
    assert!(plan.contains(r#""demo"."visits""#), "{run:#?}");
    assert!(plan.contains("<secret>"), "{run:#?}");

    // \set ON_ERROR_STOP: psql stops at the refusal with status 3 and runs nothing after it.
    let stop = psql_script(&proxy, "psql_on_error_stop.sql").await;
    assert_eq!(stop.status, Some(3), "{stop:#?}");
    assert!(stop.stdout.contains("before=1"), "{stop:#?}");
    assert!(!stop.stdout.contains("not_reached"), "{stop:#?}");
    assert!(stop.stderr.contains("ERROR:  42501"), "{stop:#?}");
    proxy.stop().await;
}

// ---------------------------------------------------------------------------------------------
// tokio-postgres (in-process)

#[tokio::test]
async fn tokio_postgres_prepare_query_binary_results() {
    let proxy = start_proxy(12).await;
    let (client, connection) = tokio_postgres::connect(&proxy.dsn(), NoTls)
        .await
        .expect("connect");
    tokio::spawn(connection);

    let statement = client
        .prepare(
            "SELECT region, COUNT(*), AVG(income) FROM demo.people WHERE sex = $1 GROUP BY region",
        )
        .await
        .expect("prepare");
    assert_eq!(statement.params(), &[Type::TEXT]);
    let types: Vec<Type> = statement
        .columns()
        .iter()
        .map(|c| c.type_().clone())
        .collect();
    // PostgreSQL's types: AVG of a numeric column is numeric.
    assert_eq!(types, [Type::TEXT, Type::INT8, Type::NUMERIC]);

    // tokio-postgres asks for every result column in binary format.
    let first = client.query(&statement, &[&"F"]).await.expect("query");
    let again = client
        .query(&statement, &[&"F"])
        .await
        .expect("query again");
    let decode = |rows: &[tokio_postgres::Row]| -> Vec<(String, i64, support::Number)> {
        rows.iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect()
    };
    let first = decode(&first);
    assert_eq!(first.len(), 10, "{first:?}");
    assert!(first
        .iter()
        .all(|(_, n, avg)| *n > 1_000 && (0.0..=250_000.0).contains(&avg.0)));
    assert_eq!(first, decode(&again), "an identical query is replayed");

    let count: i64 = client
        .query_one("SELECT COUNT(*) FROM demo.people WHERE age >= $1", &[&0i32])
        .await
        .expect("count")
        .get(0);
    assert!((99_000..=101_000).contains(&count), "count {count}");
    proxy.stop().await;
}

// ---------------------------------------------------------------------------------------------
// Python drivers

#[tokio::test]
#[cfg_attr(
    missing_toolchain = "clients-python",
    ignore = "needs tests/clients/.venv: bash .ci/setup-clients installs it (CI does)"
)]
async fn psycopg2_connect_dp_queries_and_error_classes() {
    require_python();
    let proxy = start_proxy(13).await;
    let checks = [
        "connect",
        "dp_query_client_binding",
        "errors",
        "error_in_transaction",
    ];
    run_python(&proxy, "psycopg2_client.py", &checks)
        .await
        .assert_ok(&checks);
    proxy.stop().await;
}

#[tokio::test]
#[cfg_attr(
    missing_toolchain = "clients-python",
    ignore = "needs tests/clients/.venv: bash .ci/setup-clients installs it (CI does)"
)]
async fn psycopg3_server_and_client_binding_and_error_classes() {
    require_python();
    let proxy = start_proxy(14).await;
    let checks = [
        "connect",
        "dp_query_server_binding",
        "dp_query_prepared_twice",
        "dp_query_binary_results",
        "dp_query_client_binding",
        "errors",
        "server_side_cursors",
        "any_of_a_list",
    ];
    run_python(&proxy, "psycopg3_client.py", &checks)
        .await
        .assert_ok(&checks);
    proxy.stop().await;
}

/// A Grafana-like session: the SQL of Grafana's PostgreSQL data source (its pickers and its
/// panel macros, cited in grafana_session.py) through psycopg 3.
#[tokio::test]
#[cfg_attr(
    missing_toolchain = "clients-python",
    ignore = "needs tests/clients/.venv: bash .ci/setup-clients installs it (CI does)"
)]
async fn grafana_like_session_pickers_time_series_and_table_panels() {
    require_python();
    let proxy = start_proxy(30).await;
    let checks = [
        "version_probes",
        "pickers",
        "time_series",
        "time_series_by_metric",
        "table_panel",
        "raw_rows_refused",
    ];
    run_python(&proxy, "grafana_session.py", &checks)
        .await
        .assert_ok(&checks);
    proxy.stop().await;
}

async fn sqlalchemy_checks(seed: u8, dialect: &str) {
    require_python();
    let proxy = start_proxy(seed).await;
    let names: Vec<String> = [
        "connect",
        "inspect",
        "dp_query_text",
        "dp_query_core",
        "dp_query_limit",
        "dp_query_filters",
        "dp_query_group_counts",
    ]
    .iter()
    .map(|c| format!("{c}_{dialect}"))
    .collect();
    let checks: Vec<&str> = names.iter().map(String::as_str).collect();
    // dp_query_filters and dp_query_group_counts compare with PostgreSQL's answers on the demo
    // database.
    run_python_beside_upstream(&proxy, "sqlalchemy_client.py", &checks)
        .await
        .assert_ok(&checks);
    proxy.stop().await;
}

/// [`run_python`] with `PGDP_UPSTREAM_DSN` naming the demo database on PostgreSQL itself, for
/// checks that compare pgdp's descriptions and answers with PostgreSQL's.
async fn run_python_beside_upstream(proxy: &Proxy, script: &str, checks: &[&str]) -> ClientRun {
    let upstream = crate::harness::demo_database(1).await;
    let args: Vec<&str> = [script].into_iter().chain(checks.iter().copied()).collect();
    run_client_in(
        proxy,
        script,
        &clients_dir(),
        &venv_python(),
        &args,
        &[("PGDP_UPSTREAM_DSN", upstream.dsn())],
    )
    .await
}

#[tokio::test]
#[cfg_attr(
    missing_toolchain = "clients-python",
    ignore = "needs tests/clients/.venv: bash .ci/setup-clients installs it (CI does)"
)]
async fn sqlalchemy_asyncpg_filters_match_postgresql() {
    require_python();
    let proxy = start_proxy(35).await;
    let checks = ["dp_query_filters_asyncpg"];
    run_python_beside_upstream(&proxy, "sqlalchemy_client.py", &checks)
        .await
        .assert_ok(&checks);
    proxy.stop().await;
}

#[tokio::test]
#[cfg_attr(
    missing_toolchain = "clients-python",
    ignore = "needs tests/clients/.venv: bash .ci/setup-clients installs it (CI does)"
)]
async fn sqlalchemy_psycopg2_engine_inspect_text_and_core() {
    sqlalchemy_checks(15, "psycopg2").await;
}

#[tokio::test]
#[cfg_attr(
    missing_toolchain = "clients-python",
    ignore = "needs tests/clients/.venv: bash .ci/setup-clients installs it (CI does)"
)]
async fn sqlalchemy_psycopg3_engine_inspect_text_and_core() {
    sqlalchemy_checks(25, "psycopg").await;
}

#[tokio::test]
#[cfg_attr(
    missing_toolchain = "clients-python",
    ignore = "needs tests/clients/.venv: bash .ci/setup-clients installs it (CI does)"
)]
async fn asyncpg_prepared_dp_query_with_parameters() {
    require_python();
    let proxy = start_proxy(16).await;
    let checks = [
        "connect",
        "prepared_dp_query",
        "typed_parameters",
        "refusal",
    ];
    // typed_parameters compares with PostgreSQL's descriptions and answers on the demo database.
    run_python_beside_upstream(&proxy, "asyncpg_client.py", &checks)
        .await
        .assert_ok(&checks);
    proxy.stop().await;
}

// ---------------------------------------------------------------------------------------------
// node-postgres

#[tokio::test]
#[cfg_attr(
    missing_toolchain = "clients-node",
    ignore = "needs node and tests/clients/node_modules: bash .ci/setup-clients installs them (CI does)"
)]
async fn node_pg_parameterised_dp_query() {
    require_node_pg();
    let proxy = start_proxy(17).await;
    let checks = ["connect", "parameterised_dp_query", "refusal"];
    run_node(&proxy, &checks).await.assert_ok(&checks);
    proxy.stop().await;
}

#[tokio::test]
#[cfg_attr(
    missing_toolchain = "clients-node",
    ignore = "needs node and tests/clients/node_modules: bash .ci/setup-clients installs them (CI does)"
)]
async fn node_pg_constant_select_is_int4() {
    require_node_pg();
    let proxy = start_proxy(26).await;
    let checks = ["constant_select_int4"];
    run_node(&proxy, &checks).await.assert_ok(&checks);
    proxy.stop().await;
}

fn require_node_pg() {
    require(on_path("node"), "node");
    require(
        clients_dir().join("node_modules/pg").is_dir(),
        "tests/clients/node_modules/pg (bash .ci/setup-clients)",
    );
}

async fn run_node(proxy: &Proxy, checks: &[&str]) -> ClientRun {
    run_client(
        proxy,
        "node_pg_client.js",
        Path::new("node"),
        &["node_pg_client.js"],
        checks,
    )
    .await
}

// ---------------------------------------------------------------------------------------------
// pgjdbc

/// Compiles JdbcClient.java into a fresh directory.
async fn compile_jdbc_client() -> tempdir::Dir {
    require(on_path("javac") && on_path("java"), "a JDK (javac, java)");
    require(
        Path::new(PGJDBC_JAR).is_file(),
        "pgjdbc (Debian package libpostgresql-jdbc-java)",
    );
    let dir = tempdir::Dir::new("jdbc");
    let output = tokio::process::Command::new("javac")
        .args(["-nowarn", "-d"])
        .arg(dir.path())
        .args(["-cp", PGJDBC_JAR])
        .arg(clients_dir().join("JdbcClient.java"))
        .stdin(Stdio::null())
        .output()
        .await
        .expect("javac runs");
    assert!(
        output.status.success(),
        "javac failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    dir
}

async fn run_jdbc(proxy: &Proxy, classes: &tempdir::Dir, checks: &[&str]) -> ClientRun {
    let classpath = format!("{}:{PGJDBC_JAR}", classes.path().display());
    run_client(
        proxy,
        "JdbcClient",
        Path::new("java"),
        &[
            "-Xshare:auto",
            "-XX:TieredStopAtLevel=1",
            "-cp",
            &classpath,
            "JdbcClient",
        ],
        checks,
    )
    .await
}

#[tokio::test]
#[cfg_attr(
    missing_toolchain = "jdbc",
    ignore = "needs a JDK and pgjdbc: bash .ci/setup-clients installs them (CI does)"
)]
async fn pgjdbc_metadata_and_prepared_statement_twice() {
    let classes = compile_jdbc_client().await;
    let proxy = start_proxy(18).await;
    let checks = [
        "connect",
        "metadata",
        "prepared_twice",
        "refusal",
        "result_types",
    ];
    run_jdbc(&proxy, &classes, &checks).await.assert_ok(&checks);
    proxy.stop().await;
}

/// A Metabase-like session through pgjdbc: its sync's catalog SQL and its MBQL questions
/// (cited in JdbcClient.java), each answered with PostgreSQL's column types.
#[tokio::test]
#[cfg_attr(
    missing_toolchain = "jdbc",
    ignore = "needs a JDK and pgjdbc: bash .ci/setup-clients installs them (CI does)"
)]
async fn metabase_like_session_sync_and_questions() {
    let classes = compile_jdbc_client().await;
    let proxy = start_proxy(31).await;
    let checks = ["metabase_sync", "metabase_questions"];
    run_jdbc(&proxy, &classes, &checks).await.assert_ok(&checks);
    proxy.stop().await;
}

#[tokio::test]
#[cfg_attr(
    missing_toolchain = "jdbc",
    ignore = "needs a JDK and pgjdbc: bash .ci/setup-clients installs them (CI does)"
)]
async fn pgjdbc_fetch_size_with_autocommit_off() {
    let classes = compile_jdbc_client().await;
    let proxy = start_proxy(19).await;
    let checks = ["fetch_size_autocommit_off"];
    run_jdbc(&proxy, &classes, &checks).await.assert_ok(&checks);
    proxy.stop().await;
}

// ---------------------------------------------------------------------------------------------
// psqlODBC + unixODBC

fn require_odbc() {
    let registered = std::fs::read_to_string("/etc/odbcinst.ini")
        .is_ok_and(|ini| ini.contains(&format!("[{ODBC_DRIVER}]")));
    require(
        registered,
        "psqlODBC registered with unixODBC (Debian packages odbc-postgresql, unixodbc)",
    )
}

async fn pyodbc_checks(seed: u8, declare_fetch: u8, checks: &[&str]) {
    require_python();
    require_odbc();
    let proxy = start_proxy(seed).await;
    let names: Vec<String> = checks
        .iter()
        .map(|c| format!("{c}_declare_fetch_{declare_fetch}"))
        .collect();
    let checks: Vec<&str> = names.iter().map(String::as_str).collect();
    run_python(&proxy, "pyodbc_client.py", &checks)
        .await
        .assert_ok(&checks);
    proxy.stop().await;
}

/// pyodbc's checks in autocommit mode (psqlODBC then sends each statement on its own).
const PYODBC_CHECKS: [&str; 4] = ["connect", "tables_columns", "dp_query", "refusal"];

#[tokio::test]
#[cfg_attr(
    any(missing_toolchain = "clients-python", missing_toolchain = "odbc"),
    ignore = "needs psqlODBC and tests/clients/.venv: bash .ci/setup-clients installs them (CI does)"
)]
async fn odbc_pyodbc_without_cursor_mode() {
    pyodbc_checks(20, 0, &PYODBC_CHECKS).await;
}

#[tokio::test]
#[cfg_attr(
    any(missing_toolchain = "clients-python", missing_toolchain = "odbc"),
    ignore = "needs psqlODBC and tests/clients/.venv: bash .ci/setup-clients installs them (CI does)"
)]
async fn odbc_pyodbc_with_cursor_mode() {
    pyodbc_checks(21, 1, &PYODBC_CHECKS).await;
}

#[tokio::test]
#[cfg_attr(
    any(missing_toolchain = "clients-python", missing_toolchain = "odbc"),
    ignore = "needs psqlODBC and tests/clients/.venv: bash .ci/setup-clients installs them (CI does)"
)]
async fn odbc_pyodbc_dp_query_in_transaction() {
    pyodbc_checks(27, 0, &["dp_query_in_transaction"]).await;
}

/// isql with a driver connection string (`-k`), reading commands from stdin.
async fn isql(proxy: &Proxy, declare_fetch: u8, input: &str) -> ClientRun {
    use tokio::io::AsyncWriteExt;
    let connection = format!(
        "DRIVER={{{ODBC_DRIVER}}};SERVER=127.0.0.1;PORT={};DATABASE={DATABASE};UID={ANALYST};PWD={PASSWORD};SSLmode=disable;UseDeclareFetch={declare_fetch}",
        proxy.port()
    );
    let mut child = tokio::process::Command::new("isql")
        .args(["-k", "-b", "-v", "-d|", &connection])
        // psqlODBC sets client_encoding from the locale's character set; pgdp speaks only UTF8.
        .env("LC_ALL", "C.UTF-8")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("isql runs");
    let mut stdin = child.stdin.take().expect("isql stdin");
    stdin.write_all(input.as_bytes()).await.expect("isql input");
    drop(stdin);
    let output = tokio::time::timeout(CLIENT_TIMEOUT, child.wait_with_output())
        .await
        .expect("isql finished in time")
        .expect("isql output");
    ClientRun {
        what: format!("isql UseDeclareFetch={declare_fetch}"),
        status: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

async fn isql_checks(seed: u8, declare_fetch: u8) {
    require(on_path("isql"), "isql (Debian package unixodbc)");
    require_odbc();
    let proxy = start_proxy(seed).await;
    // `help` is SQLTables.
    let tables = isql(&proxy, declare_fetch, "help\n").await;
    assert_eq!(tables.status, Some(0), "{tables:#?}");
    let demo_tables: Vec<&str> = tables
        .stdout
        .lines()
        .filter_map(|l| {
            let cells: Vec<&str> = l.split('|').collect();
            (cells.get(1) == Some(&"demo")).then(|| cells[2])
        })
        .collect();
    assert_eq!(
        demo_tables,
        ["people", "prescriptions", "regions", "visits"],
        "{tables:#?}"
    );

    // (isql's `help <table>` calls SQLColumns without a schema, which finds nothing outside the
    // search path even on PostgreSQL itself; pyodbc's test covers SQLColumns.)

    let query = isql(
        &proxy,
        declare_fetch,
        "SELECT COUNT(*) FROM demo.people\nSELECT * FROM demo.people\n",
    )
    .await;
    let count: i64 = query
        .stdout
        .lines()
        .find_map(|l| l.trim().parse().ok())
        .unwrap_or_else(|| panic!("no count: {query:#?}"));
    assert!((99_000..=101_000).contains(&count), "count {count}");
    assert!(
        query.stdout.contains("42501") || query.stderr.contains("42501"),
        "refusal not reported with its SQLSTATE: {query:#?}"
    );
    proxy.stop().await;
}

#[tokio::test]
#[cfg_attr(
    missing_toolchain = "odbc",
    ignore = "needs psqlODBC and isql: bash .ci/setup-clients installs them (CI does)"
)]
async fn odbc_isql_without_cursor_mode() {
    isql_checks(22, 0).await;
}

#[tokio::test]
#[cfg_attr(
    missing_toolchain = "odbc",
    ignore = "needs psqlODBC and isql: bash .ci/setup-clients installs them (CI does)"
)]
async fn odbc_isql_with_cursor_mode() {
    isql_checks(23, 1).await;
}

// ---------------------------------------------------------------------------------------------
// Introspection queries of BI tools

/// One recorded introspection query.
#[derive(Debug)]
struct Fixture {
    file: String,
    sql: String,
    /// `None`: answered; `Some(code)`: refused with this SQLSTATE.
    refused_with: Option<String>,
}

fn fixtures() -> Vec<Fixture> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(fixtures_dir())
        .expect("tests/fixtures/introspection")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "sql"))
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path).expect("fixture readable");
            let file = path
                .file_name()
                .expect("name")
                .to_string_lossy()
                .into_owned();
            let mut refused_with = None;
            let mut expect_seen = false;
            let mut source_seen = false;
            for line in text.lines().filter_map(|l| l.strip_prefix("-- ")) {
                if let Some(e) = line.strip_prefix("expect: ") {
                    expect_seen = true;
                    refused_with = match e.trim() {
                        "answered" => None,
                        other => Some(
                            other
                                .strip_prefix("refused ")
                                .unwrap_or_else(|| panic!("{file}: bad expect line {other:?}"))
                                .to_string(),
                        ),
                    };
                }
                source_seen |= line.starts_with("source: ");
            }
            assert!(
                expect_seen && source_seen,
                "{file}: needs -- source: and -- expect: lines"
            );
            let sql = text
                .lines()
                .filter(|l| !l.starts_with("--"))
                .collect::<Vec<_>>()
                .join("\n")
                .trim()
                .trim_end_matches(';')
                .to_string();
            Fixture {
                file,
                sql,
                refused_with,
            }
        })
        .collect()
}

/// Values the upstream must never let out through the catalog: row counts and estimates, page
/// counts and sizes of the demo tables and the demo database. Only values above 1000 are kept, so
/// small catalog numbers (attribute numbers, type lengths) cannot match by chance.
async fn upstream_secrets() -> Vec<String> {
    let upstream = support::upstream_client().await;
    let mut secrets = Vec::new();
    for table in ["demo.people", "demo.visits"] {
        let row = upstream
            .query_one(
                &format!(
                    "SELECT (SELECT count(*) FROM {table})::int8, c.reltuples::int8, c.relpages::int8, \
                     pg_relation_size(c.oid)::int8, pg_total_relation_size(c.oid)::int8, \
                     coalesce(s.n_live_tup, 0)::int8 \
                     FROM pg_class c LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid \
                     WHERE c.oid = '{table}'::regclass"
                ),
                &[],
            )
            .await
            .expect("upstream statistics");
        for i in 0..row.len() {
            secrets.push(row.get::<_, i64>(i));
        }
    }
    let db_size: i64 = upstream
        .query_one("SELECT pg_database_size(current_database())", &[])
        .await
        .expect("database size")
        .get(0);
    secrets.push(db_size);
    secrets.retain(|v| *v > 1000);
    secrets.sort_unstable();
    secrets.dedup();
    assert!(!secrets.is_empty(), "the demo data has more than 1000 rows");
    secrets.iter().map(i64::to_string).collect()
}

/// Column names whose values describe the data's volume: in an answer they must be zero, -1
/// (never analysed), empty or NULL.
fn is_volume_column(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    [
        "reltuples",
        "relpages",
        "relallvisible",
        "row_count",
        "n_live_tup",
        "n_dead_tup",
        "n_tup_",
        "seq_scan",
        "idx_scan",
        "size",
        "rows",
    ]
    .iter()
    .any(|k| name.contains(k))
}

/// Checks one answered fixture's text rows for leaks; returns the number of rows.
fn leaks_in(
    fixture: &Fixture,
    messages: &[SimpleQueryMessage],
    secrets: &[String],
    failures: &mut Vec<String>,
) -> usize {
    let mut rows = 0;
    for message in messages {
        let SimpleQueryMessage::Row(row) = message else {
            continue;
        };
        rows += 1;
        for (i, column) in row.columns().iter().enumerate() {
            let value = row.get(i).unwrap_or("");
            if secrets.iter().any(|s| s == value) {
                failures.push(format!(
                    "{}: column {} carries an upstream statistic ({value})",
                    fixture.file,
                    column.name()
                ));
            }
            if is_volume_column(column.name()) && !matches!(value, "" | "0" | "-1" | "0 bytes") {
                failures.push(format!(
                    "{}: volume column {} is {value}",
                    fixture.file,
                    column.name()
                ));
            }
        }
    }
    rows
}

/// Checks a refusal's SQLSTATE against the fixture's.
fn check_refusal(
    fixture: &Fixture,
    protocol: &str,
    error: &tokio_postgres::Error,
    failures: &mut Vec<String>,
) {
    let expected = fixture.refused_with.as_deref().unwrap_or("none");
    match error.code() {
        Some(c) if c.code() == expected => {}
        other => failures.push(format!(
            "{} ({protocol} protocol): expected {}, got {:?}: {error}",
            fixture.file,
            fixture
                .refused_with
                .as_deref()
                .map_or("an answer".to_string(), |c| format!("refusal {c}")),
            other.map(|c| c.code())
        )),
    }
}

async fn connect_plain(proxy: &Proxy) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(&proxy.dsn(), NoTls)
        .await
        .expect("connect");
    tokio::spawn(connection);
    client
}

#[tokio::test]
async fn introspection_of_metabase_and_tableau_answers_without_leak() {
    let fixtures = fixtures();
    assert!(fixtures.len() >= 10, "fixtures: {}", fixtures.len());
    let secrets = upstream_secrets().await;
    let proxy = start_proxy(24).await;
    let client = connect_plain(&proxy).await;
    let mut failures = Vec::new();
    let mut answered = 0;
    for fixture in &fixtures {
        match (
            client.simple_query(&fixture.sql).await,
            &fixture.refused_with,
        ) {
            (Ok(messages), None) => {
                leaks_in(fixture, &messages, &secrets, &mut failures);
                answered += 1;
            }
            (Ok(_), Some(code)) => failures.push(format!(
                "{}: answered, expected refusal {code}",
                fixture.file
            )),
            (Err(e), _) => check_refusal(fixture, "simple", &e, &mut failures),
        }
    }
    assert!(
        failures.is_empty(),
        "introspection fixtures:\n  {}",
        failures.join("\n  ")
    );
    assert!(answered > 0, "no fixture was answered");
    proxy.stop().await;
}

/// The same fixtures through the extended protocol with binary results (what pgjdbc and
/// tokio-postgres send): the same verdict, and as many rows as the simple protocol returns.
#[tokio::test]
async fn introspection_fixtures_through_the_extended_protocol() {
    let fixtures = fixtures();
    let proxy = start_proxy(28).await;
    let client = connect_plain(&proxy).await;
    let mut failures = Vec::new();
    for fixture in &fixtures {
        let simple = client.simple_query(&fixture.sql).await;
        match (client.query(fixture.sql.as_str(), &[]).await, simple) {
            (Ok(rows), Ok(messages)) => {
                let simple_rows = messages
                    .iter()
                    .filter(|m| matches!(m, SimpleQueryMessage::Row(_)))
                    .count();
                if rows.len() != simple_rows {
                    failures.push(format!(
                        "{}: {} rows, {simple_rows} by the simple protocol",
                        fixture.file,
                        rows.len()
                    ));
                }
            }
            (Err(e), _) => check_refusal(fixture, "extended", &e, &mut failures),
            (Ok(_), Err(e)) => failures.push(format!(
                "{}: answered by the extended protocol, refused by the simple: {e}",
                fixture.file
            )),
        }
    }
    assert!(
        failures.is_empty(),
        "introspection fixtures:\n  {}",
        failures.join("\n  ")
    );
    proxy.stop().await;
}

/// A temporary directory removed on drop (javac output).
mod tempdir {
    use std::path::{Path, PathBuf};
    use std::sync::atomic::{AtomicU32, Ordering};

    pub struct Dir(PathBuf);

    impl Dir {
        pub fn new(prefix: &str) -> Dir {
            static NEXT: AtomicU32 = AtomicU32::new(0);
            let path = std::env::temp_dir().join(format!(
                "pgdp-clients-{prefix}-{}-{}",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            ));
            std::fs::create_dir_all(&path).expect("temporary directory");
            Dir(path)
        }

        pub fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}
