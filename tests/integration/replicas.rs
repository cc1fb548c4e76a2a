//! pgdp as separate operating-system processes sharing one ledger: replicas racing for the last
//! of a budget, and a process killed with SIGKILL while its upstream query runs.
//!
//! These tests run the real `pgdp serve` binary (`CARGO_BIN_EXE_pgdp`), so nothing is shared
//! between the replicas but the ledger database: no in-process lock or cache can make them pass.

use std::net::TcpListener;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::process::{Child, Command};
use tokio_postgres::error::SqlState;

use crate::harness::{self, TestDb};
use crate::support::{code, demo_policy_text, Session, ANALYST, DATABASE, PASSWORD};

/// How long a child pgdp may take to accept connections.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// A `pgdp serve` child process; killed (SIGKILL) when dropped. Also used by `reload`.
pub(crate) struct Replica {
    pub(crate) child: Child,
    port: u16,
    policy: tempfile_path::PolicyFile,
    pid_file: tempfile_path::PolicyFile,
}

mod tempfile_path {
    //! A policy file in the system temporary directory, removed on drop.
    use std::path::PathBuf;

    pub struct PolicyFile(pub PathBuf);

    impl PolicyFile {
        pub fn write(text: &str) -> PolicyFile {
            let file = PolicyFile::named("yaml");
            std::fs::write(&file.0, text).expect("write the policy file");
            file
        }

        /// A path for a file (of the given extension) that does not exist yet.
        pub fn named(extension: &str) -> PolicyFile {
            use std::sync::atomic::{AtomicU32, Ordering};
            static COUNTER: AtomicU32 = AtomicU32::new(0);
            PolicyFile(std::env::temp_dir().join(format!(
                "pgdp-replica-policy-{}-{}.{extension}",
                std::process::id(),
                COUNTER.fetch_add(1, Ordering::Relaxed)
            )))
        }
    }

    impl Drop for PolicyFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
}

impl Replica {
    /// Starts `pgdp serve` with `policy_text` over the demo data and the given ledger, and waits
    /// until the analyst can connect.
    pub(crate) async fn start(policy_text: &str, ledger: &TestDb) -> Replica {
        Replica::start_with(policy_text, ledger, &[]).await
    }

    /// [`Replica::start`] with `extra` arguments to `pgdp serve`.
    pub(crate) async fn start_with(policy_text: &str, ledger: &TestDb, extra: &[&str]) -> Replica {
        let upstream = harness::demo_database(1).await.dsn().to_string();
        let policy = tempfile_path::PolicyFile::write(policy_text);
        let pid_file = tempfile_path::PolicyFile::named("pid");
        let port = free_port();
        let child = Command::new(env!("CARGO_BIN_EXE_pgdp"))
            .arg("serve")
            .arg("--policy")
            .arg(&policy.0)
            .arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .arg("--upstream")
            .arg(&upstream)
            .arg("--ledger")
            .arg(ledger.dsn())
            .arg("--pid-file")
            .arg(&pid_file.0)
            .args(extra)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn pgdp serve");
        let mut replica = Replica {
            child,
            port,
            policy,
            pid_file,
        };
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Ok(session) = Session::open(&replica.dsn()).await {
                drop(session);
                return replica;
            }
            if let Ok(Some(status)) = replica.child.try_wait() {
                panic!("pgdp serve exited during startup: {status}");
            }
            assert!(
                Instant::now() < deadline,
                "pgdp serve did not start in time"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub(crate) fn dsn(&self) -> String {
        self.dsn_for(ANALYST)
    }

    /// The DSN of another analyst of the policy (with the demo analyst's password).
    pub(crate) fn dsn_for(&self, analyst: &str) -> String {
        format!(
            "host=127.0.0.1 port={} user={analyst} password={PASSWORD} dbname={DATABASE} sslmode=disable connect_timeout=10",
            self.port
        )
    }

    /// The policy file it serves (rewrite it, then reload).
    pub(crate) fn policy_path(&self) -> &std::path::Path {
        &self.policy.0
    }

    /// The file `pgdp serve --pid-file` wrote.
    pub(crate) fn pid_file(&self) -> &std::path::Path {
        &self.pid_file.0
    }

    pub(crate) async fn connect(&self) -> Session {
        Session::open(&self.dsn())
            .await
            .unwrap_or_else(|e| panic!("cannot connect to the replica: {e}"))
    }

    /// SIGKILL: no shutdown code runs.
    async fn kill(mut self) {
        self.child.start_kill().expect("SIGKILL pgdp");
        let status = self.child.wait().await.expect("wait for pgdp");
        assert!(!status.success(), "pgdp was killed, not stopped: {status}");
    }
}

/// A port nobody listens on right now (a race with other processes is possible but harmless:
/// the replica then fails to start and the test says so).
fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().expect("local address").port()
}

/// The demo policy with the analyst's ε total and per-query cap replaced.
fn policy_text(epsilon_total: u32, epsilon_per_query_max: u32) -> String {
    let text = demo_policy_text();
    let total = "      epsilon: 10\n";
    let cap = "      epsilon_per_query_max: 2\n";
    assert!(text.contains(total) && text.contains(cap));
    text.replace(total, &format!("      epsilon: {epsilon_total}\n"))
        .replace(
            cap,
            &format!("      epsilon_per_query_max: {epsilon_per_query_max}\n"),
        )
}

fn distinct_query(i: usize) -> String {
    format!("SELECT COUNT(*) FROM demo.people WHERE age > {i}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_on_one_ledger_never_overspend() {
    const AFFORDABLE: usize = 9;
    // Two pgdp processes, each with full pools under 40 racing connections (one of them runs
    // its sessions on one worker thread).
    let _exclusive = harness::exclusive().await;
    let ledger = harness::fresh_database("replicas_race").await;
    let text = policy_text(AFFORDABLE as u32, 1);
    let (a, b) = tokio::join!(
        Replica::start(&text, &ledger),
        Replica::start_with(&text, &ledger, &["--worker-threads", "1"])
    );
    let log = ledger.client().await;
    let answered =
        race_then_drain(&[a.dsn(), b.dsn()], "SET pgdp.mechanism = 'laplace'", &log).await;
    assert_eq!(answered, AFFORDABLE, "exactly the affordable queries run");
    // Both replicas report the same, exact balance.
    for replica in [&a, &b] {
        let budget = replica.connect().await.budget().await;
        assert_eq!(budget.epsilon_spent, AFFORDABLE as f64);
        assert_eq!(budget.epsilon_remaining, 0.0);
    }
    // The audit log has one row per admitted query (written by the journals after the
    // answers), and its sum is the total.
    let sum = audit_rows_when_complete(&log, AFFORDABLE, "epsilon").await;
    assert_eq!(sum.parse::<f64>().expect("sum"), AFFORDABLE as f64);
    a.kill().await;
    b.kill().await;
    ledger.drop_db().await;
}

/// The same race under zCDP accounting (issue 16): Gaussian queries, charged in ρ, from two
/// processes on one ledger, admitted exactly as often as the Rényi filter admits them one at a
/// time, never more; the durable ρ is the exact sum of the answered queries' charges.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_on_one_ledger_never_overspend_in_zcdp() {
    use pgdp::budget::{accountant::repeats, Cost, Fixed, Limit, Spent};
    let _exclusive = harness::exclusive().await;
    let ledger = harness::fresh_database("replicas_race_zcdp").await;
    let text = policy_text(3, 1);
    let (a, b) = tokio::join!(
        Replica::start(&text, &ledger),
        Replica::start(&text, &ledger)
    );
    let gaussian = "SET pgdp.mechanism = 'gaussian'";
    // The cost of one query, from EXPLAIN (which charges nothing): ρ only.
    let probe = a.connect().await;
    probe.batch_execute(gaussian).await.expect("SET");
    let explained = probe
        .simple_rows(&format!("EXPLAIN {}", distinct_query(0)))
        .await
        .expect("EXPLAIN");
    let cost_line = explained
        .iter()
        .filter_map(|r| r.first().cloned().flatten())
        .find(|l| l.trim_start().starts_with("cost:"))
        .expect("a cost line");
    let rho_text = cost_line
        .split("rho=")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or_else(|| panic!("no rho in {cost_line:?}"));
    assert!(cost_line.contains("epsilon=0 delta=0"), "{cost_line}");
    let rho = Fixed::from_decimal_str(rho_text).expect("rho");
    let limit = Limit::new(
        Fixed::from_decimal_str("3").expect("3"),
        Fixed::from_decimal_str("0.00001").expect("δ"),
    );
    let affordable = repeats(&limit, &Spent::ZERO, &Cost::zcdp(rho)) as usize;
    // Basic composition would fit 3 of these ε = 1 queries; the filter fits at least twice as many.
    assert!((6..30).contains(&affordable), "{affordable}");
    let log = ledger.client().await;
    let answered = race_then_drain(&[a.dsn(), b.dsn()], gaussian, &log).await;
    assert_eq!(answered, affordable, "exactly the affordable queries run");
    let spent_rho: String = log
        .query_one(
            "SELECT rho::text FROM pgdp.analyst_spent WHERE analyst = $1",
            &[&ANALYST],
        )
        .await
        .expect("analyst totals")
        .get(0);
    let expected = Spent::ZERO
        .after_repeats(&Cost::zcdp(rho), affordable as u64)
        .expect("no overflow");
    assert_eq!(
        Fixed::from_numeric_text(&spent_rho).expect("rho"),
        expected.rho
    );
    let sum = audit_rows_when_complete(&log, affordable, "rho").await;
    assert_eq!(Fixed::from_numeric_text(&sum).expect("rho"), expected.rho);
    a.kill().await;
    b.kill().await;
    ledger.drop_db().await;
}

/// 40 connections over the two processes race one query each (after `setup`); then, once idle
/// slices are returned, one query at a time on either process until both refuse. Every refusal
/// is 53200; returns how many queries were answered in all.
async fn race_then_drain(
    dsns: &[String; 2],
    setup: &'static str,
    log: &tokio_postgres::Client,
) -> usize {
    const CONNECTIONS: usize = 40;
    let start = Arc::new(tokio::sync::Barrier::new(CONNECTIONS));
    let mut tasks = Vec::new();
    for i in 0..CONNECTIONS {
        let dsn = dsns[i % 2].clone();
        let start = start.clone();
        tasks.push(tokio::spawn(async move {
            let s = Session::open(&dsn).await.expect("connect");
            s.batch_execute(setup).await.expect("SET");
            start.wait().await;
            s.query(&distinct_query(i), &[]).await.map(|_| ())
        }));
    }
    let (mut answered, mut refused) = (0, 0);
    for task in tasks {
        match task.await.expect("task") {
            Ok(()) => answered += 1,
            Err(e) => {
                assert_eq!(code(&e), &SqlState::CONFIGURATION_LIMIT_EXCEEDED, "{e:?}");
                refused += 1;
            }
        }
    }
    // Budget leases: a slice one process holds unused refuses the other's queries until it is
    // returned, so the race may answer fewer than affordable, never more (checked by the
    // callers on the total).
    assert_eq!(refused, CONNECTIONS - answered);
    // Idle slices are returned within limits::SLICE_IDLE_RETURN_MS; then one by one, on
    // either process, to the exact last affordable query.
    wait_until_no_open_slices(log).await;
    let mut i = CONNECTIONS;
    loop {
        let mut refused_on_both = true;
        for dsn in dsns {
            let s = Session::open(dsn).await.expect("connect");
            s.batch_execute(setup).await.expect("SET");
            i += 1;
            match s.query(&distinct_query(i), &[]).await {
                Ok(_) => {
                    answered += 1;
                    refused_on_both = false;
                }
                Err(e) => assert_eq!(code(&e), &SqlState::CONFIGURATION_LIMIT_EXCEEDED, "{e:?}"),
            }
        }
        if refused_on_both {
            break;
        }
        wait_until_no_open_slices(log).await;
    }
    wait_until_no_open_slices(log).await;
    answered
}

/// Waits (at most 10 s) until the audit log holds `rows` rows of the analyst (the journals write
/// them after the answers); returns the sum of `column` as text.
async fn audit_rows_when_complete(
    log: &tokio_postgres::Client,
    rows: usize,
    column: &str,
) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let row = log
            .query_one(
                &format!("SELECT count(*), coalesce(sum({column}), 0)::text FROM pgdp.charge_log WHERE analyst = $1"),
                &[&ANALYST],
            )
            .await
            .expect("read the audit log");
        if row.get::<_, i64>(0) == rows as i64 {
            return row.get(1);
        }
        assert!(Instant::now() < deadline, "the audit rows never arrived");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits (at most 10 s) until no budget slice is open in the ledger: processes return idle ones
/// after `limits::SLICE_IDLE_RETURN_MS`.
async fn wait_until_no_open_slices(log: &tokio_postgres::Client) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let open: i64 = log
            .query_one(
                "SELECT count(*) FROM pgdp.lease WHERE closed_at IS NULL",
                &[],
            )
            .await
            .expect("count open slices")
            .get(0);
        if open == 0 {
            return;
        }
        assert!(Instant::now() < deadline, "slices stayed open");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Sends the region count on `session` with demo.people locked, waits until its charge is in
/// the ledger's audit log (the query is then past the charge and blocked on the lock upstream),
/// SIGKILLs `replica`, unlocks, and checks that the client saw its connection die, never an
/// answer.
async fn kill_while_the_upstream_query_waits(
    replica: Replica,
    session: Session,
    log: &tokio_postgres::Client,
) {
    // Hold the upstream query back deterministically: an exclusive lock on a table of the demo
    // dataset makes the (already charged) upstream query wait. Nothing before the charge reads
    // demo.people (its region keys are public values from the policy). Other tests reading the
    // table wait a moment too; nobody else ever writes it.
    let demo = harness::demo_database(1).await;
    let locker = demo.client().await;
    locker
        .batch_execute("BEGIN; LOCK TABLE demo.people IN ACCESS EXCLUSIVE MODE")
        .await
        .expect("lock demo.people");
    let query = tokio::spawn(async move {
        let result = session
            .query(
                "SELECT region, COUNT(*) FROM demo.people GROUP BY region",
                &[],
            )
            .await;
        (session, result)
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let row = log
            .query_one(
                "SELECT count(*) FROM pgdp.charge_log WHERE analyst = $1",
                &[&ANALYST],
            )
            .await
            .expect("read the audit log");
        if row.get::<_, i64>(0) == 1 {
            break;
        }
        assert!(Instant::now() < deadline, "the charge never appeared");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!query.is_finished(), "the query must still be running");
    replica.kill().await;
    locker.batch_execute("ROLLBACK").await.expect("unlock");
    let (_session, result) = query.await.expect("query task");
    assert!(result.is_err(), "a killed pgdp cannot have answered");
}

/// SIGKILL in the middle of a budget slice: the process had reserved two queries' worth and
/// used one; the whole reservation stays spent, the slice stays open in the ledger, and a new
/// process spends exactly the rest, to the last query.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_during_the_upstream_query_keeps_the_charge() {
    let ledger = harness::fresh_database("replicas_kill").await;
    let text = policy_text(10, 2);
    let replica = Replica::start(&text, &ledger).await;
    let session = replica.connect().await;
    session
        .batch_execute("SET pgdp.epsilon = 1.25")
        .await
        .expect("SET");

    let log = ledger.client().await;
    kill_while_the_upstream_query_waits(replica, session, &log).await;

    // A new process on the same ledger reports the charge: the slice covering it was committed
    // before the upstream saw the query, and nothing refunds it. 8 queries of 1.25 fitted, so
    // the slice reserved a quarter of them (limits::SLICE_SHARE_DIVISOR): 2, i.e. 2.5, of
    // which the unused half is spent too, since the dead process cannot say it was unused.
    let slice = log
        .query_one(
            "SELECT queries, epsilon::text, closed_at IS NULL FROM pgdp.lease WHERE analyst = $1",
            &[&ANALYST],
        )
        .await
        .expect("read the slice");
    assert_eq!(slice.get::<_, i64>(0), 2);
    assert_eq!(slice.get::<_, String>(1).parse::<f64>().expect("ε"), 2.5);
    assert!(
        slice.get::<_, bool>(2),
        "the slice of a killed process stays open"
    );
    let restarted = Replica::start(&text, &ledger).await;
    let session = restarted.connect().await;
    let budget = session.budget().await;
    assert_eq!(budget.epsilon_spent, 2.5);
    assert_eq!(budget.epsilon_remaining, 10.0 - 2.5);
    // The rest is spent exactly: 7.5 / 1.25 = 6 more queries, then 53400.
    session
        .batch_execute("SET pgdp.epsilon = 1.25")
        .await
        .expect("SET");
    for i in 0..6 {
        session
            .query(&distinct_query(i), &[])
            .await
            .unwrap_or_else(|e| panic!("query {i} of the rest: {e:?}"));
    }
    let refused = session
        .query(&distinct_query(6), &[])
        .await
        .expect_err("the budget is spent");
    assert_eq!(code(&refused), &SqlState::CONFIGURATION_LIMIT_EXCEEDED);
    // The rows of the rest follow from the journal; the killed process's row is the first.
    let deadline = Instant::now() + Duration::from_secs(10);
    while log
        .query_one(
            "SELECT count(*) FROM pgdp.charge_log WHERE analyst = $1",
            &[&ANALYST],
        )
        .await
        .expect("count")
        .get::<_, i64>(0)
        < 7
    {
        assert!(
            Instant::now() < deadline,
            "the audit rows of the rest never arrived"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let row = log
        .query_one(
            "SELECT epsilon::text, outcome FROM pgdp.charge_log WHERE analyst = $1 ORDER BY id LIMIT 1",
            &[&ANALYST],
        )
        .await
        .expect("read the audit log");
    assert_eq!(row.get::<_, String>(0).parse::<f64>().expect("ε"), 1.25);
    // The process died before it could record an outcome: the row still says it was charged.
    assert_eq!(row.get::<_, String>(1), "charged");
    restarted.kill().await;
    ledger.drop_db().await;
}

/// The SIGKILL above under zCDP accounting (issue 16): a Gaussian query's slice is reserved in ρ;
/// after the kill the whole slice stays spent, and a new process admits exactly as many more
/// queries as the Rényi filter allows after it, then refuses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_during_a_gaussian_query_keeps_its_rho_charged() {
    use pgdp::budget::{accountant::repeats, Cost, Fixed, Limit, Spent};
    let ledger = harness::fresh_database("replicas_kill_zcdp").await;
    let text = policy_text(3, 1);
    let replica = Replica::start(&text, &ledger).await;
    let session = replica.connect().await;
    let gaussian = "SET pgdp.mechanism = 'gaussian'";
    session.batch_execute(gaussian).await.expect("SET");
    let log = ledger.client().await;
    kill_while_the_upstream_query_waits(replica, session, &log).await;
    let charged = log
        .query_one(
            "SELECT epsilon::text, rho::text FROM pgdp.charge_log WHERE analyst = $1",
            &[&ANALYST],
        )
        .await
        .expect("read the audit log");
    let charged: (String, String) = (charged.get(0), charged.get(1));

    // The charge was ρ only; the slice reserved k of them in ρ and stays open.
    assert_eq!(
        Fixed::from_numeric_text(&charged.0).expect("ε"),
        Fixed::ZERO
    );
    let cost = Cost::zcdp(Fixed::from_numeric_text(&charged.1).expect("ρ"));
    assert!(!cost.rho.is_zero());
    let slice = log
        .query_one(
            "SELECT queries, epsilon::text, rho::text, closed_at IS NULL FROM pgdp.lease WHERE analyst = $1",
            &[&ANALYST],
        )
        .await
        .expect("read the slice");
    let k = slice.get::<_, i64>(0) as u64;
    let reserved = Spent::ZERO.after_repeats(&cost, k).expect("no overflow");
    assert!(k >= 1);
    assert_eq!(
        Fixed::from_numeric_text(&slice.get::<_, String>(1)).expect("ε"),
        Fixed::ZERO
    );
    assert_eq!(
        Fixed::from_numeric_text(&slice.get::<_, String>(2)).expect("ρ"),
        reserved.rho
    );
    assert!(
        slice.get::<_, bool>(3),
        "the slice of a killed process stays open"
    );
    // The analyst's durable totals hold the whole slice.
    let spent_rho: String = log
        .query_one(
            "SELECT rho::text FROM pgdp.analyst_spent WHERE analyst = $1",
            &[&ANALYST],
        )
        .await
        .expect("analyst totals")
        .get(0);
    assert_eq!(
        Fixed::from_numeric_text(&spent_rho).expect("ρ"),
        reserved.rho
    );

    // A new process spends exactly what the filter admits after the slice, then refuses.
    let limit = Limit::new(
        Fixed::from_decimal_str("3").expect("3"),
        Fixed::from_decimal_str("0.00001").expect("δ"),
    );
    let rest = repeats(&limit, &reserved, &cost);
    assert!(rest >= 3, "{rest}");
    let restarted = Replica::start(&text, &ledger).await;
    let session = restarted.connect().await;
    session.batch_execute(gaussian).await.expect("SET");
    for i in 0..rest as usize {
        session
            .query(&distinct_query(i), &[])
            .await
            .unwrap_or_else(|e| panic!("query {i} of the rest: {e:?}"));
    }
    let refused = session
        .query(&distinct_query(rest as usize), &[])
        .await
        .expect_err("the budget is spent");
    assert_eq!(code(&refused), &SqlState::CONFIGURATION_LIMIT_EXCEEDED);
    restarted.kill().await;
    ledger.drop_db().await;
}

/// Issue 20 (several pgdp processes behind one address): the replay cache and the stored noisy
/// measures live in the shared ledger, so a query answered by one process is answered again by
/// the other with the same noisy rows, a post-processing variant from the same measures and the
/// total derived from its cells, all free; both processes report the same balance. Issue 44: B
/// has read the analyst's keys into its replay index (its own earlier query) before A
/// releases, so B finds A's entries through the journal's notifications.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_on_one_process_is_replayed_and_reused_on_the_other() {
    let ledger = harness::fresh_database("replicas_replay").await;
    let text = policy_text(10, 2);
    let (a, b) = tokio::join!(
        Replica::start(&text, &ledger),
        Replica::start(&text, &ledger)
    );
    let on_b = b.connect().await;
    on_b.simple_rows("SELECT COUNT(*) FROM demo.visits")
        .await
        .expect("charged on B");
    wait_until_no_open_slices(&ledger.client().await).await;
    let entries_before: i64 = ledger
        .client()
        .await
        .query_one("SELECT count(*) FROM pgdp.replay_cache", &[])
        .await
        .expect("count replay entries")
        .get(0);
    let sql = "SELECT region, COUNT(*) AS n FROM demo.people GROUP BY region ORDER BY region";
    let on_a = a.connect().await;
    let first = on_a.simple_rows(sql).await.expect("charged on A");
    assert_eq!(first.len(), 10, "one row per declared region");
    assert!(
        on_a.take_notices()
            .iter()
            .any(|n| n.starts_with("pgdp: charged")),
        "A charged the query"
    );
    let spent = on_a.budget().await.epsilon_spent;
    assert!(spent > 0.0);

    // A's journal writes the release (the answer, its noisy measures and their sums) after the answer has
    // left; other processes see it from then on.
    let log = ledger.client().await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while log
        .query_one("SELECT count(*) FROM pgdp.replay_cache", &[])
        .await
        .expect("count replay entries")
        .get::<_, i64>(0)
        < entries_before + 3
    {
        assert!(
            Instant::now() < deadline,
            "A's release never reached the ledger"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The notifications of A's commit reach B's replay index within milliseconds of it.
    tokio::time::sleep(Duration::from_millis(300)).await;
    on_b.take_notices();
    let again = on_b.simple_rows(sql).await.expect("replayed on B");
    assert_eq!(again, first, "B replays A's noisy rows");
    assert!(
        on_b.take_notices()
            .iter()
            .any(|n| n.contains("replay cache")),
        "B says it replayed"
    );
    let variant = on_b
        .simple_rows("SELECT region AS r, COUNT(*) AS people FROM demo.people GROUP BY region ORDER BY 2 DESC LIMIT 3")
        .await
        .expect("reused on B");
    assert_eq!(variant.len(), 3);
    for row in &variant {
        assert!(
            first.contains(row),
            "{row:?} is not one of A's released rows {first:?}"
        );
    }
    assert!(
        on_b.take_notices()
            .iter()
            .any(|n| n.contains("answered from the noisy measures")),
        "B says it reused the measures"
    );
    // The total is derived from A's cells (issue 16 part 3), on B too: the sum of A's counts.
    let total = on_b
        .simple_rows("SELECT COUNT(*) FROM demo.people")
        .await
        .expect("derived on B");
    let sum: i64 = first
        .iter()
        .map(|r| {
            r[1].as_deref()
                .expect("a count")
                .parse::<i64>()
                .expect("an integer")
        })
        .sum();
    assert_eq!(
        total[0][0]
            .as_deref()
            .expect("a count")
            .parse::<i64>()
            .expect("an integer"),
        sum
    );
    assert!(
        on_b.take_notices()
            .iter()
            .any(|n| n.contains("derived from the noisy measures")),
        "B says it derived the total"
    );
    // A's unused slice counts on B until A returns it (idle for limits::SLICE_IDLE_RETURN_MS).
    wait_until_no_open_slices(&ledger.client().await).await;
    for session in [&on_a, &on_b] {
        assert_eq!(
            session.budget().await.epsilon_spent,
            spent,
            "nothing more was charged, and both processes say so"
        );
    }
    a.kill().await;
    b.kill().await;
    ledger.drop_db().await;
}

/// `--worker-threads` outside 1 to `limits::WORKER_THREADS_MAX`, or not a number, stops `pgdp
/// serve` before it starts, with exit status 2 and the reason (nothing listens, nothing runs).
#[tokio::test]
async fn serve_refuses_a_worker_thread_count_out_of_range() {
    for (value, reason) in [
        ("0", "--worker-threads must be between 1 and 1024, not 0"),
        (
            "1025",
            "--worker-threads must be between 1 and 1024, not 1025",
        ),
        ("two", "invalid digit"),
    ] {
        let output = Command::new(env!("CARGO_BIN_EXE_pgdp"))
            .args([
                "serve",
                "--policy",
                "/nonexistent.yaml",
                "--worker-threads",
                value,
            ])
            .output()
            .await
            .expect("run pgdp serve");
        assert_eq!(output.status.code(), Some(2), "{value}: {output:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(reason), "{value}: {stderr}");
    }
}
