//! The integration-test harness: a PostgreSQL upstream, fresh databases, and the demo dataset.
//!
//! The one integration test binary (`tests/integration/main.rs`) includes it once, and the fuzz
//! crate (`fuzz/src/lib.rs`) for its targets, which the `fuzz_smoke` module also runs.
//!
//! Which upstream ([`upstream`], chosen once per test process):
//! 1. `PGDP_TEST_UPSTREAM`, if set and non-empty: a DSN (key=value or URL, with a user) of a
//!    server where the tests may create and drop databases. It must answer, or the tests fail.
//! 2. else the server on 127.0.0.1:5432 as user `postgres`, database `postgres`, if it answers;
//! 3. else a throwaway [`Cluster`] started for this process.
//!
//! `PGDP_TEST_FORCE_CLUSTER=1` skips 1 and 2 and always starts a throwaway cluster (to check that
//! fallback, or to get a server with [`pgdp::tools::cluster::MAX_CONNECTIONS`] connections).
//!
//! Clean-up. The throwaway cluster lives in a `static`, which is never dropped: a watcher process
//! stops it and deletes its directory once the test process has exited
//! ([`Cluster::stop_when_process_exits`]). Databases from [`fresh_database`] are dropped by
//! [`TestDb::drop_db`]; a [`TestDb`] dropped without it (a failed assertion, a forgotten call)
//! drops its database from a helper thread with its own runtime, because each `#[tokio::test]`
//! has its own runtime that may already be shutting down. Whatever still leaks (a killed test
//! process) carries the process id in its name, and the next test process that uses the
//! 127.0.0.1:5432 server drops the databases of processes that no longer exist. Leftovers on a
//! `PGDP_TEST_UPSTREAM` server are left alone (its processes are not ours to check) and are
//! harmless: names never repeat while a process lives.
//!
//! The demo dataset ([`demo_database`]) lives in one database per scale and generator version,
//! `pgdp_test_demo_s<N>_v<V>`,
//! kept across test processes and runs: [`pgdp::tools::demo::load`] reuses it when its marker matches and
//! reloads it when the generator's version changed. An advisory lock on the upstream's maintenance
//! database keeps two test processes from creating or loading it at the same time. Tests must only
//! read it; a test that writes gets its own copy from [`fresh_database`] and `pgdp::tools::demo::load`.
//!
//! Nothing here prints to stdout.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use pgdp::tools::cluster::{self, Cluster};
use tokio::sync::OnceCell;
use tokio_postgres::{Client, NoTls};

/// Environment variable naming an upstream DSN for the tests.
pub const UPSTREAM_ENV: &str = "PGDP_TEST_UPSTREAM";

/// Environment variable that, set to `1`, forces a throwaway cluster.
pub const FORCE_CLUSTER_ENV: &str = "PGDP_TEST_FORCE_CLUSTER";

/// The machine's own server, tried when no upstream is given.
pub const LOCAL_DSN: &str = "host=127.0.0.1 port=5432 user=postgres dbname=postgres";

/// Prefix of every database [`fresh_database`] creates: `pgdp_t_<prefix>_<pid>_<n>`.
const FRESH_PREFIX: &str = "pgdp_t_";

/// How long a [`TestDb`] dropped without [`TestDb::drop_db`] waits for its database to go.
const DROP_TIMEOUT: Duration = Duration::from_secs(15);

/// Where the upstream came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// `PGDP_TEST_UPSTREAM`.
    Env,
    /// The server on 127.0.0.1:5432.
    Local,
    /// A throwaway cluster owned by this process.
    Cluster,
}

/// The PostgreSQL server the tests of this process use.
#[derive(Debug)]
pub struct Upstream {
    source: Source,
    admin_dsn: String,
    cluster: Option<Cluster>,
}

impl Upstream {
    /// Where it came from.
    pub fn source(&self) -> Source {
        self.source
    }

    /// DSN of the maintenance database (where databases are created and dropped).
    pub fn admin_dsn(&self) -> &str {
        &self.admin_dsn
    }

    /// DSN of database `dbname` on this server, with the same user and credentials.
    pub fn dsn(&self, dbname: &str) -> String {
        match &self.cluster {
            Some(cluster) => cluster.dsn(dbname),
            None => cluster::dsn_with_dbname(&self.admin_dsn, dbname),
        }
    }

    /// A connection to the maintenance database, driven by the current runtime.
    pub async fn admin_client(&self) -> Client {
        connect(&self.admin_dsn).await
    }
}

static UPSTREAM: OnceCell<Upstream> = OnceCell::const_new();

/// The upstream of this test process, chosen on first use (see the module documentation).
pub async fn upstream() -> &'static Upstream {
    UPSTREAM
        .get_or_init(|| async {
            let upstream = choose_upstream().await;
            // Once per test process, on standard error (tests never print to standard output).
            let server = match upstream.source {
                Source::Env => format!("the server named by {UPSTREAM_ENV}"),
                Source::Local => "the server on 127.0.0.1:5432".to_string(),
                Source::Cluster => format!("a throwaway cluster ({})", upstream.dsn("postgres")),
            };
            // Written to the stream itself: the test harness captures `eprintln!`, and this line
            // is for every run, not only for failures.
            let _ = std::io::Write::write_all(
                &mut std::io::stderr(),
                format!("pgdp tests: upstream PostgreSQL is {server}\n").as_bytes(),
            );
            upstream
        })
        .await
}

async fn choose_upstream() -> Upstream {
    let forced = std::env::var(FORCE_CLUSTER_ENV).is_ok_and(|v| v == "1");
    if !forced {
        if let Some(dsn) = std::env::var(UPSTREAM_ENV)
            .ok()
            .filter(|dsn| !dsn.trim().is_empty())
        {
            assert!(
                cluster::server_answers(&dsn).await,
                "{UPSTREAM_ENV} is set but no server answers there"
            );
            return Upstream {
                source: Source::Env,
                admin_dsn: dsn,
                cluster: None,
            };
        }
        if cluster::server_answers(LOCAL_DSN).await {
            let upstream = Upstream {
                source: Source::Local,
                admin_dsn: LOCAL_DSN.to_string(),
                cluster: None,
            };
            drop_databases_of_dead_processes(&upstream).await;
            return upstream;
        }
    }
    let cluster = Cluster::start()
        .await
        .unwrap_or_else(|e| panic!("no test upstream: {e}"));
    cluster
        .stop_when_process_exits()
        .unwrap_or_else(|e| panic!("cannot arrange the throwaway cluster's clean-up: {e}"));
    Upstream {
        source: Source::Cluster,
        admin_dsn: cluster.dsn("postgres"),
        cluster: Some(cluster),
    }
}

/// Held for its whole length by each test that can open more upstream connections at once than
/// one in-process pgdp's pools (`UPSTREAM_POOL_SIZE` + `SHADOW_POOL_SIZE` + its ledger, about
/// 22): such tests run one at a time. The tests share one process and run in parallel, one per
/// core; measured on 2 cores, the process's peak was then 51 and 63 upstream connections in two
/// full runs, below the 100 of a default server. Not taken by other tests.
pub async fn exclusive() -> tokio::sync::MutexGuard<'static, ()> {
    // A tokio mutex works across the runtimes of different `#[tokio::test]`s and is not
    // poisoned by a failing test (the guard is dropped while unwinding).
    static EXCLUSIVE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    EXCLUSIVE.lock().await
}

/// Connects to `dsn` and drives the connection on the current runtime.
pub async fn connect(dsn: &str) -> Client {
    let (client, connection) = tokio_postgres::connect(dsn, NoTls)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to the test upstream: {e}"));
    tokio::spawn(async move {
        // Errors surface on the client's next call; nothing to do with them here.
        let _ = connection.await;
    });
    client
}

/// A database for one test.
#[derive(Debug)]
pub struct TestDb {
    name: String,
    dsn: String,
    /// Shared databases (the demo dataset) outlive their handles.
    shared: bool,
    dropped: bool,
}

impl TestDb {
    /// The database name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its DSN (key=value or URL, like the upstream's).
    pub fn dsn(&self) -> &str {
        &self.dsn
    }

    /// A new connection to it, driven by the current runtime.
    pub async fn client(&self) -> Client {
        connect(&self.dsn).await
    }

    /// Drops the database (closing other connections to it). Does nothing for the shared demo
    /// database.
    pub async fn drop_db(mut self) {
        self.dropped = true;
        if !self.shared {
            let admin = upstream().await.admin_dsn();
            drop_database(admin, &self.name).await;
            // The shadow catalog a pgdp over this database built beside it.
            drop_database(admin, &format!("{}{SHADOW_SUFFIX}", self.name)).await;
        }
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if self.dropped || self.shared {
            return;
        }
        let Some(upstream) = UPSTREAM.get() else {
            return;
        };
        let (admin_dsn, name) = (upstream.admin_dsn.clone(), self.name.clone());
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        // The test's runtime may be shutting down, and blocking it could deadlock: use a thread
        // with a runtime of its own, and give up after a while (leftovers are swept later).
        std::thread::spawn(move || {
            if let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                runtime.block_on(async {
                    let _ =
                        tokio::time::timeout(DROP_TIMEOUT, drop_database(&admin_dsn, &name)).await;
                });
            }
            let _ = done_tx.send(());
        });
        let _ = done_rx.recv_timeout(DROP_TIMEOUT);
    }
}

/// Creates an empty database named after `prefix`, this process and a counter.
pub async fn fresh_database(prefix: &str) -> TestDb {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let upstream = upstream().await;
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let name = format!(
        "{FRESH_PREFIX}{}_{}_{n}",
        sanitize(prefix),
        std::process::id()
    );
    let admin = upstream.admin_client().await;
    admin
        .batch_execute(&format!("CREATE DATABASE \"{name}\""))
        .await
        .unwrap_or_else(|e| panic!("cannot create test database {name}: {e}"));
    TestDb {
        dsn: upstream.dsn(&name),
        name,
        shared: false,
        dropped: false,
    }
}

/// The database holding the demo dataset at `scale`, loaded at most once per process and reused
/// across processes. Read-only by convention; dropping the handle keeps the database.
pub async fn demo_database(scale: u32) -> TestDb {
    static LOADED: OnceLock<Mutex<HashMap<u32, Arc<OnceCell<String>>>>> = OnceLock::new();
    let cell = {
        let mut loaded = LOADED
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        Arc::clone(loaded.entry(scale).or_default())
    };
    let name = cell.get_or_init(|| load_demo_database(scale)).await.clone();
    TestDb {
        dsn: upstream().await.dsn(&name),
        name,
        shared: true,
        dropped: false,
    }
}

async fn load_demo_database(scale: u32) -> String {
    let upstream = upstream().await;
    // The generator's version is part of the name: branches whose datasets differ can share one
    // PostgreSQL without reloading each other's database back and forth.
    let name = format!("pgdp_test_demo_s{scale}_v{}", pgdp::tools::demo::VERSION);
    let admin = upstream.admin_client().await;
    // Session-level lock on the maintenance database, shared by all test processes; it ends at
    // the latest when `admin` disconnects.
    let key = 0x7067_6470_7465_7374_i64 ^ i64::from(scale);
    admin
        .execute("SELECT pg_advisory_lock($1)", &[&key])
        .await
        .unwrap_or_else(|e| panic!("cannot lock the demo database: {e}"));
    let exists = admin
        .query_opt("SELECT 1 FROM pg_database WHERE datname = $1", &[&name])
        .await
        .unwrap_or_else(|e| panic!("cannot look for the demo database: {e}"))
        .is_some();
    if !exists {
        admin
            .batch_execute(&format!("CREATE DATABASE \"{name}\""))
            .await
            .unwrap_or_else(|e| panic!("cannot create {name}: {e}"));
    }
    let client = connect(&upstream.dsn(&name)).await;
    pgdp::tools::demo::load(&client, scale, |_| {})
        .await
        .unwrap_or_else(|e| panic!("cannot load the demo dataset into {name}: {e}"));
    admin
        .execute("SELECT pg_advisory_unlock($1)", &[&key])
        .await
        .unwrap_or_else(|e| panic!("cannot unlock the demo database: {e}"));
    name
}

/// `DROP DATABASE … WITH (FORCE)`, ignoring failures (the database may already be gone).
async fn drop_database(admin_dsn: &str, name: &str) {
    if let Ok((client, connection)) = tokio_postgres::connect(admin_dsn, NoTls).await {
        tokio::spawn(async move {
            let _ = connection.await;
        });
        let sql = format!(
            "DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)",
            name.replace('"', "\"\"")
        );
        let _ = client.batch_execute(&sql).await;
    }
}

/// Drops `pgdp_t_…_<pid>_<n>` databases whose process no longer exists on this machine. Runs
/// once when the 127.0.0.1:5432 server is chosen; never call it on a server other machines use.
pub async fn drop_databases_of_dead_processes(upstream: &Upstream) {
    let admin = upstream.admin_client().await;
    let Ok(rows) = admin
        .query(
            "SELECT datname FROM pg_database WHERE starts_with(datname, $1)",
            &[&FRESH_PREFIX],
        )
        .await
    else {
        return;
    };
    for row in rows {
        let Ok(name) = row.try_get::<_, String>(0) else {
            continue;
        };
        let Some(pid) = owner_pid(&name) else {
            continue;
        };
        if pid != std::process::id() && !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            drop_database(upstream.admin_dsn(), &name).await;
        }
    }
}

/// The suffix of the shadow catalog database pgdp builds beside its upstream database.
const SHADOW_SUFFIX: &str = "_pgdp_catalog";

/// The process id inside a [`fresh_database`] name (or its shadow catalog's).
pub fn owner_pid(name: &str) -> Option<u32> {
    let name = name.strip_suffix(SHADOW_SUFFIX).unwrap_or(name);
    let rest = name.strip_prefix(FRESH_PREFIX)?;
    let mut parts = rest.rsplit('_');
    let _counter: u32 = parts.next()?.parse().ok()?;
    parts.next()?.parse().ok()
}

/// A database-name fragment: lowercase ASCII letters, digits and `_`, at most 32 characters.
pub fn sanitize(prefix: &str) -> String {
    let cleaned: String = prefix
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .take(32)
        .collect();
    if cleaned.is_empty() {
        "db".to_string()
    } else {
        cleaned
    }
}
