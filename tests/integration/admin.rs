//! Budget administration through the built binary (`pgdp budget …`, `pgdp audit`) against a
//! running in-process pgdp and its ledger: a grant or a reset lets a refused analyst query again
//! through the wire (the running process sees the change on its next charge), the charge log
//! survives a reset, bad input exits non-zero and leaves the ledger exactly as it was, and the
//! audit export parses as CSV and JSON with the query's tables and analyst.
//!
//! The CLI's messages are its interface, so these tests check that a refusal names what was
//! wrong (the analyst, the flag); through the wire they check SQLSTATEs only.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use tokio_postgres::error::SqlState;

use crate::harness;
use crate::support::{assert_code, demo_policy_text, Proxy, ANALYST};

/// How long one run of the binary may take.
const RUN_TIMEOUT: Duration = Duration::from_secs(60);

/// The OS user the tests run the binary as (through `USER`).
const OWNER: &str = "dataowner";

/// A policy file with the demo analyst's total ε and per-query cap set to `epsilon`; removed
/// when dropped.
struct PolicyFile {
    path: PathBuf,
    text: String,
}

impl PolicyFile {
    fn with_epsilon(epsilon: u32) -> PolicyFile {
        PolicyFile::with_budget(epsilon, "")
    }

    /// As [`PolicyFile::with_epsilon`], with `extra` (e.g. `period: day`) added to the budget.
    fn with_budget(epsilon: u32, extra: &str) -> PolicyFile {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let extra = if extra.is_empty() {
            String::new()
        } else {
            format!("      {extra}\n")
        };
        let text = demo_policy_text()
            .replace(
                "      epsilon: 10\n",
                &format!("      epsilon: {epsilon}\n{extra}"),
            )
            .replace(
                "      epsilon_per_query_max: 2\n",
                &format!("      epsilon_per_query_max: {epsilon}\n"),
            );
        let path = std::env::temp_dir().join(format!(
            "pgdp-admin-test-{}-{}.yaml",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::write(&path, &text).expect("write the policy file");
        PolicyFile { path, text }
    }

    fn policy(&self) -> pgdp::policy::Policy {
        pgdp::policy::parse(&self.text).expect("the test policy is valid")
    }
}

impl Drop for PolicyFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Runs `pgdp <args> --policy <policy> --ledger <ledger>` with `USER` set to [`OWNER`].
async fn pgdp(args: &[&str], policy: &Path, ledger: &str) -> Output {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_pgdp"));
    command
        .args(args)
        .arg("--policy")
        .arg(policy)
        .arg("--ledger")
        .arg(ledger)
        .env("USER", OWNER)
        .env("RUST_LOG", "error")
        .env_remove("PGDP_LEDGER")
        .env_remove("PGDP_UPSTREAM")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    tokio::time::timeout(RUN_TIMEOUT, command.output())
        .await
        .expect("pgdp did not finish in time")
        .expect("pgdp could not be run")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn assert_success(output: &Output, what: &str) {
    assert!(
        output.status.success(),
        "{what}: {:?}\nstdout: {}\nstderr: {}",
        output.status,
        stdout(output),
        stderr(output)
    );
}

/// Waits (at most 10 s) until the proxy's lazy ledger work is done: its budget slices returned
/// (after `limits::SLICE_IDLE_RETURN_MS` idle) and every outcome written by its journal.
async fn settled(ledger: &str) {
    let client = harness::connect(ledger).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let busy: i64 = client
            .query_one(
                "SELECT (SELECT count(*) FROM pgdp.lease WHERE closed_at IS NULL)
                      + (SELECT count(*) FROM pgdp.charge_log WHERE outcome = 'charged')",
                &[],
            )
            .await
            .expect("read the ledger")
            .get(0);
        if busy == 0 {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the ledger never settled"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Everything in the ledger a change could touch, as text: analysts' rows (with their
/// `updated_at`), the dataset row, and the charge and admin logs.
async fn ledger_state(ledger: &str) -> String {
    let client = harness::connect(ledger).await;
    client
        .query_one(
            "SELECT concat_ws(E'\\n',
                (SELECT string_agg(s::text, E'\\n' ORDER BY analyst) FROM pgdp.analyst_spent s),
                (SELECT string_agg(d::text, E'\\n') FROM pgdp.dataset_spent d),
                (SELECT string_agg(c::text, E'\\n' ORDER BY id) FROM pgdp.charge_log c),
                (SELECT string_agg(a::text, E'\\n' ORDER BY id) FROM pgdp.admin_log a))",
            &[],
        )
        .await
        .expect("read the ledger")
        .get(0)
}

/// A DP query that differs with `i` (no replay), at the session's ε.
fn count_query(i: usize) -> String {
    format!("SELECT COUNT(*) FROM demo.people WHERE age > {i}")
}

/// The cells of the row of `name` in a table printed by `pgdp budget show`, by header name.
fn show_row(text: &str, name: &str) -> std::collections::HashMap<String, String> {
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().expect("a header").split_whitespace().collect();
    let row = lines
        .find(|l| l.split_whitespace().next() == Some(name))
        .unwrap_or_else(|| panic!("no row for {name} in:\n{text}"));
    header
        .iter()
        .zip(row.split_whitespace())
        .map(|(h, c)| (h.to_string(), c.to_string()))
        .collect()
}

#[tokio::test]
async fn a_grant_lets_a_refused_analyst_query_again_through_the_wire() {
    let file = PolicyFile::with_epsilon(1);
    let proxy = Proxy::with_policy(file.policy(), 71).await;
    let s = proxy.connect().await;
    s.batch_execute("SET pgdp.epsilon = 1").await.expect("SET");
    s.query(&count_query(1), &[]).await.expect("first query");
    let refused = s.query(&count_query(2), &[]).await;
    assert_code(
        refused,
        &SqlState::CONFIGURATION_LIMIT_EXCEEDED,
        "the second query",
    );

    let output = pgdp(
        &[
            "budget",
            "grant",
            ANALYST,
            "--epsilon",
            "1.5",
            "--delta",
            "0.000001",
            "--reason",
            "second study",
        ],
        &file.path,
        proxy.ledger_dsn(),
    )
    .await;
    assert_success(&output, "grant");

    // The same running process and session: the next charge reads the grant under the lock.
    s.query(&count_query(3), &[])
        .await
        .expect("the query after the grant");
    let b = s.budget().await;
    assert_eq!(b.epsilon_total, 2.5);
    assert_eq!(b.epsilon_spent, 2.0);
    assert_eq!(b.epsilon_remaining, 0.5);
    assert!(
        (b.delta_total - 0.000011).abs() < 1e-15,
        "{}",
        b.delta_total
    );

    // The charge count grows when a budget slice closes.
    settled(proxy.ledger_dsn()).await;
    let shown = pgdp(&["budget", "show"], &file.path, proxy.ledger_dsn()).await;
    assert_success(&shown, "show");
    let row = show_row(&stdout(&shown), ANALYST);
    assert_eq!(row["epsilon_policy"], "1");
    assert_eq!(row["epsilon_granted"], "1.5");
    assert_eq!(row["epsilon_limit"], "2.5");
    assert_eq!(row["epsilon_spent"], "2");
    assert_eq!(row["epsilon_remaining"], "0.5");
    assert_eq!(row["charges"], "2");
    assert!(row["last_charge"].ends_with('Z'), "{row:?}");
    assert_eq!(row["accounting"], "mixed", "the history's rule");
    let dataset = show_row(&stdout(&shown), "(dataset)");
    assert_eq!(dataset["epsilon_spent"], "2");

    // The admin log says who granted what and why.
    let client = harness::connect(proxy.ledger_dsn()).await;
    let row = client
        .query_one(
            "SELECT action, analyst, epsilon::text, delta::text, reason, made_by,
                    ledger_role = current_user
             FROM pgdp.admin_log",
            &[],
        )
        .await
        .expect("one admin row");
    assert_eq!(row.get::<_, String>(0), "grant");
    assert_eq!(row.get::<_, String>(1), ANALYST);
    assert_eq!(row.get::<_, String>(2), "1.5");
    assert_eq!(row.get::<_, String>(3), "0.000001");
    assert_eq!(row.get::<_, String>(4), "second study");
    assert_eq!(row.get::<_, String>(5), OWNER);
    assert!(row.get::<_, bool>(6));
    proxy.stop().await;
}

#[tokio::test]
async fn a_reset_lets_the_analyst_query_again_and_the_log_keeps_the_old_charges() {
    let file = PolicyFile::with_epsilon(1);
    let proxy = Proxy::with_policy(file.policy(), 72).await;
    let s = proxy.connect().await;
    s.batch_execute("SET pgdp.epsilon = 1").await.expect("SET");
    s.query(&count_query(1), &[]).await.expect("first query");
    assert_code(
        s.query(&count_query(2), &[]).await,
        &SqlState::CONFIGURATION_LIMIT_EXCEEDED,
        "the second query",
    );

    let output = pgdp(
        &["budget", "reset", ANALYST, "--reason", "new quarter"],
        &file.path,
        proxy.ledger_dsn(),
    )
    .await;
    assert_success(&output, "reset");
    let b = s.budget().await;
    assert_eq!(b.epsilon_spent, 0.0);
    assert_eq!(b.epsilon_total, 1.0, "a reset does not change the limit");
    s.query(&count_query(3), &[])
        .await
        .expect("the query after the reset");

    let client = harness::connect(proxy.ledger_dsn()).await;
    // Audit rows of leased charges come from the journal, just after the answers.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while client
        .query_one(
            "SELECT count(*) FROM pgdp.charge_log WHERE analyst = $1",
            &[&ANALYST],
        )
        .await
        .expect("count audit rows")
        .get::<_, i64>(0)
        < 2
        && std::time::Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let row = client
        .query_one(
            "SELECT (SELECT count(*) FROM pgdp.charge_log WHERE analyst = $1),
                    (SELECT epsilon::text FROM pgdp.analyst_spent WHERE analyst = $1),
                    (SELECT epsilon::text FROM pgdp.dataset_spent),
                    (SELECT epsilon::text || ' ' || reason FROM pgdp.admin_log WHERE action = 'reset')",
            &[&ANALYST],
        )
        .await
        .expect("the ledger");
    assert_eq!(row.get::<_, i64>(0), 2, "both charges stay in the log");
    assert_eq!(row.get::<_, String>(1), "1", "spent since the reset");
    assert_eq!(
        row.get::<_, String>(2),
        "2",
        "the dataset's totals are not reset"
    );
    assert_eq!(row.get::<_, String>(3), "1 new quarter", "the zeroed total");

    let history = pgdp(
        &["budget", "history", ANALYST],
        &file.path,
        proxy.ledger_dsn(),
    )
    .await;
    assert_success(&history, "history");
    let text = stdout(&history);
    let events: Vec<&str> = text
        .lines()
        .skip(2)
        .filter_map(|l| l.split_whitespace().nth(1))
        .collect();
    assert_eq!(events, ["charge", "reset", "charge"], "{text}");
    let since_now = pgdp(
        &["budget", "history", ANALYST, "--since", "2999-01-01"],
        &file.path,
        proxy.ledger_dsn(),
    )
    .await;
    assert_success(&since_now, "history --since");
    assert_eq!(stdout(&since_now), "no charges or admin actions\n");
    let last = pgdp(
        &["budget", "history", ANALYST, "--limit", "1"],
        &file.path,
        proxy.ledger_dsn(),
    )
    .await;
    assert_eq!(stdout(&last).lines().count(), 3, "header, rule, one event");
    proxy.stop().await;
}

#[tokio::test]
async fn unknown_analysts_and_bad_grants_are_refused_and_change_nothing() {
    let file = PolicyFile::with_epsilon(1);
    let proxy = Proxy::with_policy(file.policy(), 73).await;
    let s = proxy.connect().await;
    s.query(&count_query(1), &[]).await.expect("a charge");
    settled(proxy.ledger_dsn()).await;
    let before = ledger_state(proxy.ledger_dsn()).await;
    let cases: &[(&[&str], &str)] = &[
        (&["budget", "grant", "mallory", "--epsilon", "1"], "mallory"),
        (&["budget", "reset", "mallory"], "mallory"),
        (&["budget", "show", "mallory"], "mallory"),
        (&["budget", "history", "mallory"], "mallory"),
        (
            &[
                "audit",
                "--since",
                "2000-01-01",
                "--analyst",
                "mallory",
                "--format",
                "csv",
            ],
            "mallory",
        ),
        (
            &["budget", "grant", ANALYST, "--epsilon", "-1"],
            "--epsilon",
        ),
        (&["budget", "grant", ANALYST, "--epsilon", "0"], "--epsilon"),
        (
            &["budget", "grant", ANALYST, "--epsilon", "NaN"],
            "--epsilon",
        ),
        (
            &["budget", "grant", ANALYST, "--epsilon", "inf"],
            "--epsilon",
        ),
        (
            &["budget", "grant", ANALYST, "--epsilon", "lots"],
            "--epsilon",
        ),
        (&["budget", "grant", ANALYST], "--epsilon"),
        (
            &[
                "budget",
                "grant",
                ANALYST,
                "--epsilon",
                "1",
                "--delta",
                "-0.1",
            ],
            "--delta",
        ),
        // Refused by the ledger, inside the transaction: δ would reach 1.
        (
            &["budget", "grant", ANALYST, "--epsilon", "1", "--delta", "1"],
            "delta",
        ),
        (&["budget", "frobnicate"], "frobnicate"),
        (
            &["audit", "--since", "last week", "--format", "csv"],
            "--since",
        ),
        (
            &["audit", "--since", "2000-01-01", "--format", "xml"],
            "--format",
        ),
    ];
    for (args, named) in cases {
        let output = pgdp(args, &file.path, proxy.ledger_dsn()).await;
        assert!(
            !output.status.success(),
            "{args:?} succeeded: {}",
            stdout(&output)
        );
        let message = stderr(&output);
        assert!(
            message.contains(named),
            "{args:?}: the message does not name {named}: {message}"
        );
        assert!(stdout(&output).is_empty(), "{args:?} printed output");
        assert_eq!(
            ledger_state(proxy.ledger_dsn()).await,
            before,
            "{args:?} changed the ledger"
        );
    }
    // Bad input is a usage error (2); the ledger's own refusal is 1.
    let unknown = pgdp(
        &["budget", "reset", "mallory"],
        &file.path,
        proxy.ledger_dsn(),
    )
    .await;
    assert_eq!(unknown.status.code(), Some(2));
    let too_much = pgdp(
        &["budget", "grant", ANALYST, "--epsilon", "1", "--delta", "1"],
        &file.path,
        proxy.ledger_dsn(),
    )
    .await;
    assert_eq!(too_much.status.code(), Some(1));
    proxy.stop().await;
}

/// Parses RFC 4180 CSV (quoted fields, doubled quotes, CRLF line ends).
fn parse_csv(text: &str) -> Vec<Vec<String>> {
    let mut rows = Vec::new();
    let mut row = Vec::new();
    let mut field = String::new();
    let mut quoted = false;
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match (quoted, c) {
            (true, '"') if chars.peek() == Some(&'"') => {
                chars.next();
                field.push('"');
            }
            (true, '"') => quoted = false,
            (true, c) => field.push(c),
            (false, '"') => quoted = true,
            (false, ',') => row.push(std::mem::take(&mut field)),
            (false, '\r') => {}
            (false, '\n') => {
                row.push(std::mem::take(&mut field));
                rows.push(std::mem::take(&mut row));
            }
            (false, c) => field.push(c),
        }
    }
    assert!(
        !quoted && field.is_empty() && row.is_empty(),
        "CSV ends with a line end"
    );
    rows
}

#[tokio::test]
async fn audit_exports_parse_as_csv_and_json_with_the_tables_and_the_analyst() {
    let file = PolicyFile::with_epsilon(10);
    let proxy = Proxy::with_policy(file.policy(), 74).await;
    let s = proxy.connect().await;
    s.batch_execute("SET pgdp.epsilon = 1").await.expect("SET");
    s.query(
        "SELECT pe.sex, AVG(v.cost) FROM demo.visits v JOIN demo.people pe USING (person_id) GROUP BY pe.sex",
        &[],
    )
    .await
    .expect("a join");
    let reason = "study \"B\", second part";
    let grant = pgdp(
        &[
            "budget",
            "grant",
            ANALYST,
            "--epsilon",
            "0.25",
            "--reason",
            reason,
        ],
        &file.path,
        proxy.ledger_dsn(),
    )
    .await;
    assert_success(&grant, "grant");
    let role: String = harness::connect(proxy.ledger_dsn())
        .await
        .query_one("SELECT current_user::text", &[])
        .await
        .expect("current_user")
        .get(0);

    let csv = pgdp(
        &["audit", "--since", "2000-01-01", "--format", "csv"],
        &file.path,
        proxy.ledger_dsn(),
    )
    .await;
    assert_success(&csv, "audit csv");
    let rows = parse_csv(&stdout(&csv));
    let header = &rows[0];
    let column = |name: &str| header.iter().position(|h| h == name).expect(name);
    assert_eq!(rows.len(), 3, "a header, the charge, the grant: {rows:?}");
    let charge = &rows[1];
    assert_eq!(charge[column("kind")], "charge");
    assert_eq!(charge[column("analyst")], ANALYST);
    assert_eq!(charge[column("tables")], "demo.people;demo.visits");
    assert_eq!(charge[column("epsilon")], "1");
    assert!(charge[column("at")].ends_with('Z'));
    let granted = &rows[2];
    assert_eq!(granted[column("kind")], "grant");
    assert_eq!(granted[column("epsilon")], "0.25");
    assert_eq!(granted[column("reason")], reason);
    assert_eq!(granted[column("made_by")], OWNER);
    assert_eq!(granted[column("ledger_role")], role);

    let json = pgdp(
        &[
            "audit",
            "--since",
            "2000-01-01T00:00:00Z",
            "--analyst",
            ANALYST,
            "--format",
            "json",
        ],
        &file.path,
        proxy.ledger_dsn(),
    )
    .await;
    assert_success(&json, "audit json");
    let value: serde_json::Value = serde_json::from_str(&stdout(&json)).expect("JSON");
    let events = value.as_array().expect("an array");
    assert_eq!(events.len(), 2);
    assert_eq!(events[0]["kind"], "charge");
    assert_eq!(events[0]["analyst"], ANALYST);
    assert_eq!(
        events[0]["tables"],
        serde_json::json!(["demo.people", "demo.visits"])
    );
    assert_eq!(events[1]["reason"], reason);

    // A window before anything happened is empty.
    let none = pgdp(
        &[
            "audit",
            "--since",
            "2000-01-01",
            "--until",
            "2000-01-02",
            "--format",
            "json",
        ],
        &file.path,
        proxy.ledger_dsn(),
    )
    .await;
    assert_success(&none, "empty window");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&stdout(&none)).expect("JSON"),
        serde_json::json!([])
    );
    proxy.stop().await;
}

#[tokio::test]
async fn help_lists_the_admin_commands() {
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_pgdp"))
        .arg("--help")
        .output()
        .await
        .expect("pgdp --help");
    let text = stdout(&output);
    for line in pgdp::tools::admin::USAGE.lines() {
        assert!(text.contains(line), "--help lacks {line:?}");
    }
}

/// `pgdp budget show` of a renewing budget (issue 16 part 4) shows the current window's totals
/// and when it ends; once the day is over (simulated by moving the day's ledger row one day
/// back) the window is fresh, while `pgdp budget history` keeps the old day's charge.
#[tokio::test]
async fn budget_show_gives_a_renewing_budget_its_current_window() {
    let file = PolicyFile::with_budget(2, "period: day");
    let proxy = Proxy::with_policy(file.policy(), 73).await;
    let s = proxy.connect().await;
    s.batch_execute("SET pgdp.epsilon = 1").await.expect("SET");
    s.query(&count_query(1), &[]).await.expect("first query");
    settled(proxy.ledger_dsn()).await;
    let shown = pgdp(&["budget", "show"], &file.path, proxy.ledger_dsn()).await;
    assert_success(&shown, "show");
    let row = show_row(&stdout(&shown), ANALYST);
    assert_eq!(row["epsilon_spent"], "1");
    assert_eq!(row["epsilon_remaining"], "1");
    assert!(row["renews_at"].ends_with("T00:00:00Z"), "{row:?}");
    assert_eq!(show_row(&stdout(&shown), "(dataset)")["renews_at"], "-");

    let client = harness::connect(proxy.ledger_dsn()).await;
    let moved = client
        .execute(
            "UPDATE pgdp.analyst_window_spent
             SET window_start = window_start - interval '1 day',
                 window_end = window_end - interval '1 day'",
            &[],
        )
        .await
        .expect("move the window");
    assert_eq!(moved, 1);
    let shown = pgdp(&["budget", "show"], &file.path, proxy.ledger_dsn()).await;
    assert_success(&shown, "show");
    let row = show_row(&stdout(&shown), ANALYST);
    assert_eq!(row["epsilon_spent"], "0");
    assert_eq!(row["epsilon_remaining"], "2");
    let history = pgdp(
        &["budget", "history", ANALYST],
        &file.path,
        proxy.ledger_dsn(),
    )
    .await;
    assert_success(&history, "history");
    assert_eq!(
        stdout(&history)
            .lines()
            .filter(|l| l.contains(" charge "))
            .count(),
        1,
        "{}",
        stdout(&history)
    );
    proxy.stop().await;
}
