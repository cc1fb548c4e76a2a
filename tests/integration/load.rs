//! Load: many concurrent analyst connections against a `pgdp serve` child process for a while.
//!
//! [`CONNECTIONS`] clients connect at once and run a mix of statements (constants, `SHOW
//! pgdp.budget`, a catalog query, and DP queries that after their first run are replays) until
//! the time is up: `PGDP_LOAD_SECONDS` (default 20). pgdp runs as a separate process
//! (`target/…/pgdp serve`) so that its resident memory can be read from `/proc/<pid>/status`.
//!
//! Asserted: the process is alive at the end and still serves a new connection; its peak
//! resident memory stays below [`RSS_MAX_KIB`]; every statement was answered or refused cleanly,
//! with an ErrorResponse whose SQLSTATE is a refusal a loaded server may give (53300 too many
//! connections, 53400 budget exhausted); no connection broke without one.

use crate::harness;

use std::collections::BTreeMap;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio_postgres::NoTls;

/// Concurrent client connections.
const CONNECTIONS: usize = 500;

/// Default duration, overridden by `PGDP_LOAD_SECONDS`.
const SECONDS_DEFAULT: u64 = 20;

/// Peak resident memory pgdp may reach under this load.
const RSS_MAX_KIB: u64 = 512 * 1024;

/// SQLSTATEs that count as a clean refusal under load.
const CLEAN_REFUSALS: [&str; 2] = ["53300", "53400"];

/// The statements each client cycles through.
const STATEMENTS: [&str; 6] = [
    "SELECT 1",
    "SHOW pgdp.budget",
    "SELECT COUNT(*) FROM demo.people WHERE age > 30",
    "SELECT table_name FROM information_schema.tables WHERE table_schema = 'demo'",
    "SELECT region, COUNT(*) FROM demo.people GROUP BY region",
    "SELECT COUNT(*) FROM demo.people WHERE age > 30",
];

/// `VmRSS` of process `pid` in KiB.
fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

#[derive(Default)]
struct Tally {
    answered: AtomicU64,
    refused: Mutex<BTreeMap<String, u64>>,
    broken: Mutex<Vec<String>>,
}

impl Tally {
    fn record(&self, result: Result<(), tokio_postgres::Error>) -> bool {
        match result {
            Ok(()) => {
                self.answered.fetch_add(1, Ordering::Relaxed);
                true
            }
            Err(e) => match e.code() {
                Some(code) => {
                    *self
                        .refused
                        .lock()
                        .expect("tally")
                        .entry(code.code().to_string())
                        .or_default() += 1;
                    !e.is_closed()
                }
                None => {
                    self.broken.lock().expect("tally").push(e.to_string());
                    false
                }
            },
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_connections_for_a_while() {
    let seconds = std::env::var("PGDP_LOAD_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(SECONDS_DEFAULT);
    // A pgdp with full pools, and 500 clients that keep both cores busy for the whole run.
    let _exclusive = harness::exclusive().await;
    let upstream = harness::demo_database(1).await;
    let ledger = harness::fresh_database("load_ledger").await;
    let policy = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("policies/demo.yaml");

    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_pgdp"))
        .arg("serve")
        .arg("--policy")
        .arg(&policy)
        .args(["--listen", "127.0.0.1:0", "--upstream", upstream.dsn()])
        .args(["--ledger", ledger.dsn()])
        .env("RUST_LOG", "warn,pgdp::server=info")
        // No NO_COLOR: a log that is not a terminal must be plain text without being told.
        .env_remove("NO_COLOR")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start pgdp serve");
    let pid = child.id().expect("pgdp pid");

    // The listening address from the log; the rest of the log is drained (and kept for failures).
    let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let addr = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = lines.next_line().await.expect("read pgdp log") {
            assert!(
                !line.contains('\u{1b}'),
                "colour codes in a log that is not a terminal: {line:?}"
            );
            if let Some(rest) = line.split("pgdp listening").nth(1) {
                let addr = rest.split("addr=").nth(1).expect("addr in the log line");
                return addr.split_whitespace().next().expect("addr").to_string();
            }
        }
        panic!("pgdp exited before listening");
    })
    .await
    .expect("pgdp listens within a minute");
    let log = Arc::new(Mutex::new(Vec::<String>::new()));
    let kept = log.clone();
    tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            let mut kept = kept.lock().expect("log");
            if kept.len() < 1_000 {
                kept.push(line);
            }
        }
    });
    let port = addr.rsplit(':').next().expect("port").to_string();
    let dsn = format!(
        "host=127.0.0.1 port={port} user=analyst password=analyst dbname=pgdp_demo sslmode=disable connect_timeout=30"
    );

    let peak = Arc::new(AtomicU64::new(rss_kib(pid).unwrap_or(0)));
    let sampling = {
        let peak = peak.clone();
        tokio::spawn(async move {
            while let Some(rss) = rss_kib(pid) {
                peak.fetch_max(rss, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        })
    };

    let tally = Arc::new(Tally::default());
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let clients: Vec<_> = (0..CONNECTIONS)
        .map(|i| {
            let (dsn, tally) = (dsn.clone(), tally.clone());
            tokio::spawn(async move {
                let (client, connection) = match tokio_postgres::connect(&dsn, NoTls).await {
                    Ok(pair) => pair,
                    Err(e) => {
                        tally.record(Err(e));
                        return;
                    }
                };
                let driver = tokio::spawn(connection);
                let mut n = i;
                while Instant::now() < deadline {
                    let sql = STATEMENTS[n % STATEMENTS.len()];
                    n += 1;
                    if !tally.record(client.simple_query(sql).await.map(|_| ())) {
                        break;
                    }
                }
                drop(client);
                let _ = driver.await;
            })
        })
        .collect();
    for c in clients {
        c.await.expect("client task");
    }

    // Still alive, and still serving.
    assert!(
        child.try_wait().expect("pgdp status").is_none(),
        "pgdp exited under load; log: {:?}",
        log.lock().expect("log")
    );
    let (client, connection) = tokio_postgres::connect(&dsn, NoTls)
        .await
        .expect("connect after the load");
    tokio::spawn(connection);
    client
        .simple_query(STATEMENTS[2])
        .await
        .expect("a DP query after the load");
    sampling.abort();

    let answered = tally.answered.load(Ordering::Relaxed);
    let refused = tally.refused.lock().expect("tally").clone();
    let broken = tally.broken.lock().expect("tally").clone();
    let peak_kib = peak.load(Ordering::Relaxed);
    assert!(
        broken.is_empty(),
        "{} statements or connections broke without an ErrorResponse, e.g. {:?}",
        broken.len(),
        broken.first()
    );
    for (code, n) in &refused {
        assert!(
            CLEAN_REFUSALS.contains(&code.as_str()),
            "{n} statements refused with unexpected SQLSTATE {code}; log: {:?}",
            log.lock().expect("log")
        );
    }
    assert!(
        answered >= CONNECTIONS as u64,
        "only {answered} statements answered in {seconds} s"
    );
    assert!(
        peak_kib < RSS_MAX_KIB,
        "pgdp peaked at {peak_kib} KiB resident under {CONNECTIONS} connections"
    );
    eprintln!(
        "load: {CONNECTIONS} connections for {seconds} s: {answered} answered, refused {refused:?}, peak RSS {peak_kib} KiB"
    );

    child.kill().await.expect("stop pgdp");
    ledger.drop_db().await;
}
