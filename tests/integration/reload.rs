//! Policy reload of a running `pgdp serve` (SIGHUP, sent by `pgdp reload`): new analysts are
//! admitted, removed ones' sessions end with 57P01, open sessions follow the new caps and
//! tables, and an invalid policy is kept out while the old one stays in force.
//!
//! Through the real binary and the wire: the server is a child process, the reload is the
//! `pgdp reload` command, and every check is a client's view.

use std::time::{Duration, Instant};

use tokio::process::Command;
use tokio_postgres::error::SqlState;
use tokio_postgres::NoTls;

use crate::harness;
use crate::replicas::Replica;
use crate::support::{code, demo_policy_text, Session};

/// How long a reload may take to be in force (the shadow catalog is rebuilt first).
const RELOAD_TIMEOUT: Duration = Duration::from_secs(30);

/// The demo policy with extra analysts (each with the demo analyst's password), the analyst's
/// per-query ε cap replaced, and optionally without `demo.prescriptions`.
fn policy(extra_analysts: &[&str], epsilon_per_query_max: u32, prescriptions: bool) -> String {
    let mut text = demo_policy_text();
    let verifier_line = text
        .lines()
        .find(|l| l.trim_start().starts_with("scram_verifier:"))
        .expect("the demo analyst's verifier")
        .to_string();
    let mut analysts = String::new();
    for name in extra_analysts {
        analysts.push_str(&format!(
            "  {name}:\n{verifier_line}\n    budget: {{ epsilon: 5, delta: 1.0e-5 }}\n"
        ));
    }
    let cap = "      epsilon_per_query_max: 2\n";
    assert!(text.contains(cap), "the demo policy's cap line changed");
    text = text.replace(
        cap,
        &format!("      epsilon_per_query_max: {epsilon_per_query_max}\n{analysts}"),
    );
    if !prescriptions {
        let start = text
            .find("  demo.prescriptions:\n")
            .expect("the prescriptions table");
        let end = text.find("  demo.regions:\n").expect("the regions table");
        text.replace_range(start..end, "");
    }
    pgdp::policy::parse(&text).unwrap_or_else(|e| panic!("test policy: {e}"));
    text
}

/// `pgdp reload --pid-file … --policy …`: its exit status and output.
async fn pgdp_reload(replica: &Replica) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_pgdp"))
        .arg("reload")
        .arg("--pid-file")
        .arg(replica.pid_file())
        .arg("--policy")
        .arg(replica.policy_path())
        .output()
        .await
        .expect("run pgdp reload")
}

/// Waits until `user` can (or, with `admitted` false, cannot) log in.
async fn wait_for_login(replica: &Replica, user: &str, admitted: bool) {
    let deadline = Instant::now() + RELOAD_TIMEOUT;
    loop {
        let login = Session::open(&replica.dsn_for(user)).await;
        match (&login, admitted) {
            (Ok(_), true) => return,
            (Err(e), false) if e.code() == Some(&SqlState::INVALID_PASSWORD) => return,
            _ => {}
        }
        assert!(
            Instant::now() < deadline,
            "login of {user} still {} after the reload",
            if admitted { "refused" } else { "admitted" }
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_admits_new_analysts_ends_removed_ones_and_applies_new_caps_and_tables() {
    let ledger = harness::fresh_database("reload_policy").await;
    let replica = Replica::start(&policy(&["auditor"], 2, true), &ledger).await;
    let analyst = replica.connect().await;
    analyst
        .batch_execute("SET pgdp.epsilon = 2")
        .await
        .expect("ε 2 is within the cap");
    analyst
        .query("SELECT COUNT(*) FROM demo.prescriptions", &[])
        .await
        .expect("prescriptions are in the policy");
    // The auditor's session, idle when the reload comes: its connection task reports how the
    // server ended it.
    let (auditor, connection) = tokio_postgres::connect(&replica.dsn_for("auditor"), NoTls)
        .await
        .expect("the auditor logs in");
    let auditor_ended = tokio::spawn(connection);
    auditor
        .simple_query("SELECT 1")
        .await
        .expect("the auditor's session works");
    wait_for_login(&replica, "newcomer", false).await;

    std::fs::write(
        replica.policy_path(),
        policy(&["newcomer"], 1, false).as_bytes(),
    )
    .expect("write the new policy");
    let reload = pgdp_reload(&replica).await;
    assert!(reload.status.success(), "pgdp reload: {reload:?}");
    wait_for_login(&replica, "newcomer", true).await;

    // The removed analyst: the idle session was ended with FATAL 57P01, and logins fail.
    let ended = tokio::time::timeout(RELOAD_TIMEOUT, auditor_ended)
        .await
        .expect("the auditor's session ends")
        .expect("connection task");
    let error = ended.expect_err("ended by the server with an error");
    assert_eq!(error.code(), Some(&SqlState::ADMIN_SHUTDOWN), "{error:?}");
    assert!(auditor.is_closed());
    wait_for_login(&replica, "auditor", false).await;

    // The analyst's open session follows the new policy: the lower cap refuses its ε of 2,
    // the removed table does not exist, and ε 1 still runs.
    let over_cap = analyst
        .query("SELECT COUNT(*) FROM demo.people", &[])
        .await
        .expect_err("ε 2 is over the new cap of 1");
    assert_eq!(code(&over_cap), &SqlState::INVALID_PARAMETER_VALUE);
    analyst
        .batch_execute("SET pgdp.epsilon = 1")
        .await
        .expect("ε 1 is within the new cap");
    let removed = analyst
        .query("SELECT COUNT(*) FROM demo.prescriptions", &[])
        .await
        .expect_err("prescriptions left the policy");
    assert_eq!(code(&removed), &SqlState::UNDEFINED_TABLE);
    let rows = analyst
        .query("SELECT COUNT(*) FROM demo.people", &[])
        .await
        .expect("a query within the new policy");
    assert_eq!(rows.len(), 1);
    // The shadow catalog is the new policy's too: \d no longer lists the table.
    let listed = analyst
        .query(
            "SELECT c.relname::text FROM pg_catalog.pg_class c \
             JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = 'demo' AND c.relkind = 'r' ORDER BY 1",
            &[],
        )
        .await
        .expect("a catalog query");
    let tables: Vec<String> = listed.iter().map(|r| r.get(0)).collect();
    assert_eq!(tables, ["people", "regions", "visits"]);
    // Spent budget is not reset by a reload.
    let budget = analyst.budget().await;
    assert_eq!(budget.epsilon_spent, 2.0 + 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_policy_is_kept_out_and_the_old_one_stays_in_force() {
    let ledger = harness::fresh_database("reload_invalid").await;
    let replica = Replica::start(&policy(&["auditor"], 2, true), &ledger).await;
    let session = replica.connect().await;
    let good = policy(&["auditor"], 2, true);
    // Negative ε: invalid, with the error named by its path.
    let bad = good.replace("epsilon: 5,", "epsilon: -5,");
    assert_ne!(bad, good);
    std::fs::write(replica.policy_path(), bad.as_bytes()).expect("write the bad policy");

    // `pgdp reload` checks the file itself, says why it is refused, and sends nothing.
    let reload = pgdp_reload(&replica).await;
    assert!(!reload.status.success(), "an invalid policy is refused");
    let stderr = String::from_utf8_lossy(&reload.stderr);
    assert!(
        stderr.contains("analysts.auditor.budget.epsilon"),
        "the error names the path: {stderr}"
    );

    // A SIGHUP sent anyway (as `kill -HUP` would) is refused by the server, which keeps
    // serving the old policy: the auditor still logs in, the session still runs.
    let pid: i32 = std::fs::read_to_string(replica.pid_file())
        .expect("pid file")
        .trim()
        .parse()
        .expect("a pid");
    let signal = Command::new(env!("CARGO_BIN_EXE_pgdp"))
        .args(["reload", "--pid", &pid.to_string()])
        .output()
        .await
        .expect("pgdp reload --pid");
    assert!(signal.status.success(), "{signal:?}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    Session::open(&replica.dsn_for("auditor"))
        .await
        .expect("the old policy's analyst still logs in");
    session
        .query("SELECT COUNT(*) FROM demo.prescriptions", &[])
        .await
        .expect("the old policy still serves its tables");

    // A reload that cannot point at a server fails clearly.
    let missing = Command::new(env!("CARGO_BIN_EXE_pgdp"))
        .args(["reload", "--pid-file", "/nonexistent/pgdp.pid"])
        .output()
        .await
        .expect("pgdp reload");
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("pid file"));
}
