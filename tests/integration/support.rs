//! What every integration test needs: an in-process pgdp over the demo dataset with a ledger of
//! its own, clients for it (tokio-postgres with its notices collected, and the real `psql`), and
//! small helpers for SQLSTATEs and the budget.
//!
//! Each [`Proxy`] owns a fresh ledger database, so every test starts with a full budget, and a
//! fixed noise seed, so every run releases the same values.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use pgdp::policy::Policy;
use pgdp::server::{self, Config, Options, Running, TlsFiles};
use tokio_postgres::error::SqlState;
use tokio_postgres::{AsyncMessage, Client, NoTls, SimpleQueryMessage};

use crate::harness::{self, TestDb};

/// The database name the demo policy serves.
pub const DATABASE: &str = "pgdp_demo";

/// The demo policy's analyst and password.
pub const ANALYST: &str = "analyst";
pub const PASSWORD: &str = "analyst";

/// How long any single psql run may take before the test fails.
const PSQL_TIMEOUT: Duration = Duration::from_secs(60);

/// The demo policy's YAML text as shipped (`policies/demo.yaml`): queries choose their caps
/// (`choose_bounds: true`).
pub fn shipped_policy_text() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("policies/demo.yaml");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The demo policy's YAML text with `choose_bounds: false`: every query runs at the tables' caps
/// (10 visits per person in each of 5 groups), the capped statistic that most tests compute on
/// the upstream to compare with. The tests of the shipped defaults (bounds, readme, the tools'
/// and clients' matrices, the query catalogue) use [`shipped_policy_text`].
pub fn demo_policy_text() -> String {
    let text = shipped_policy_text();
    let on = "  choose_bounds: true\n";
    assert!(text.contains(on), "the demo policy's defaults moved");
    text.replace(on, "  choose_bounds: false\n")
}

/// The demo policy as shipped, whose queries choose their caps (`choose_bounds: true`) up to
/// ceilings of 40 visits per person and group (a person has at most 40) in 16 groups per
/// person; checked here so that the tests that rely on them fail with this message if the
/// policy moves.
pub fn ceiling_policy_text() -> String {
    let text = shipped_policy_text();
    assert!(
        text.contains("ceilings: { max_rows_per_unit: 40, max_groups_per_unit: 16 }")
            && text.contains("choose_bounds: true"),
        "the demo policy's ceilings for demo.visits moved"
    );
    text
}

/// The demo policy at the tables' caps ([`demo_policy_text`]; ε 10, δ 1e-5, at most ε 2 per
/// query).
pub fn demo_policy() -> Policy {
    pgdp::policy::parse(&demo_policy_text()).unwrap_or_else(|e| panic!("demo policy: {e:?}"))
}

/// The demo policy as shipped ([`shipped_policy_text`]).
pub fn shipped_policy() -> Policy {
    pgdp::policy::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("policies/demo.yaml"))
        .unwrap_or_else(|e| panic!("demo policy: {e:?}"))
}

/// The demo policy at the tables' caps with the analyst's total ε and per-query cap replaced.
pub fn policy_with_budget(epsilon_total: u32, epsilon_per_query_max: u32) -> Policy {
    with_budget(&demo_policy_text(), epsilon_total, epsilon_per_query_max)
}

/// The demo policy as shipped with the analyst's total ε and per-query cap replaced.
pub fn shipped_policy_with_budget(epsilon_total: u32, epsilon_per_query_max: u32) -> Policy {
    with_budget(&shipped_policy_text(), epsilon_total, epsilon_per_query_max)
}

/// The text of [`policy_with_budget`], for tests that add to the policy (a synopsis).
pub(crate) fn policy_text_with_budget(epsilon_total: u32, epsilon_per_query_max: u32) -> String {
    budget_text(&demo_policy_text(), epsilon_total, epsilon_per_query_max)
}

/// The demo policy at the tables' caps with room for a tool's every query (ε 1000, the per-query
/// cap at the demo's 2) and the synopsis people_cube over demo.people's region, sex and education
/// (180 cells; ε 2, 60 rounds, accuracy 1000 rows), as the tools' dashboard tests use it.
pub(crate) fn people_cube_policy() -> Policy {
    let text = format!(
        "{}\nsynopses:\n  people_cube: {{ table: demo.people, columns: [region, sex, education], epsilon: 2, rounds: 60, accuracy: 1000 }}\n",
        policy_text_with_budget(1000, 2)
    );
    pgdp::policy::parse(&text).unwrap_or_else(|e| panic!("policy: {e:?}"))
}

fn with_budget(text: &str, epsilon_total: u32, epsilon_per_query_max: u32) -> Policy {
    let text = budget_text(text, epsilon_total, epsilon_per_query_max);
    pgdp::policy::parse(&text).unwrap_or_else(|e| panic!("policy variant: {e:?}"))
}

fn budget_text(text: &str, epsilon_total: u32, epsilon_per_query_max: u32) -> String {
    let total = "      epsilon: 10\n";
    let cap = "      epsilon_per_query_max: 2\n";
    assert!(
        text.contains(total) && text.contains(cap),
        "the demo policy's budget lines changed; update policy_with_budget"
    );
    text.replace(total, &format!("      epsilon: {epsilon_total}\n"))
        .replace(
            cap,
            &format!("      epsilon_per_query_max: {epsilon_per_query_max}\n"),
        )
}

/// A running pgdp with its own ledger database.
pub struct Proxy {
    // Field order matters: the server stops before its ledger database is dropped.
    running: Option<Running>,
    ledger: Option<TestDb>,
    ledger_dsn: String,
    policy: Policy,
    seed: u8,
    options: Options,
    /// The upstream's DSN when it is not the demo database.
    upstream: Option<String>,
}

impl Proxy {
    /// pgdp with the demo policy at the tables' caps ([`demo_policy`]) and a fresh ledger.
    pub async fn start(seed: u8) -> Proxy {
        Proxy::with_policy(demo_policy(), seed).await
    }

    /// pgdp with `policy` over the demo data and a fresh ledger.
    pub async fn with_policy(policy: Policy, seed: u8) -> Proxy {
        Proxy::with_options(policy, seed, Options::default()).await
    }

    /// pgdp with `policy` and `options` (TLS, limits) over the demo data and a fresh ledger.
    pub async fn with_options(policy: Policy, seed: u8, options: Options) -> Proxy {
        Proxy::over(None, policy, seed, options).await
    }

    /// pgdp with `policy` over the database `upstream` (a test's own tables) and a fresh ledger.
    pub async fn with_upstream(upstream: &str, policy: Policy, seed: u8) -> Proxy {
        Proxy::over(Some(upstream.to_string()), policy, seed, Options::default()).await
    }

    async fn over(upstream: Option<String>, policy: Policy, seed: u8, options: Options) -> Proxy {
        let ledger = harness::fresh_database("ledger").await;
        let ledger_dsn = ledger.dsn().to_string();
        let running = start_server(
            upstream.as_deref(),
            policy.clone(),
            &ledger_dsn,
            seed,
            options.clone(),
        )
        .await;
        Proxy {
            running: Some(running),
            ledger: Some(ledger),
            ledger_dsn,
            policy,
            seed,
            options,
            upstream,
        }
    }

    /// Stops the server and starts a new one on the same ledger (and a new port).
    pub async fn restart(&mut self) {
        drop(self.running.take());
        self.running = Some(
            start_server(
                self.upstream.as_deref(),
                self.policy.clone(),
                &self.ledger_dsn,
                self.seed,
                self.options.clone(),
            )
            .await,
        );
    }

    /// The DSN of this pgdp's ledger database.
    pub fn ledger_dsn(&self) -> &str {
        &self.ledger_dsn
    }

    /// Reloads the running server's policy, as SIGHUP does.
    pub async fn reload(&self, policy: Policy) {
        self.running
            .as_ref()
            .expect("server running")
            .reload(policy)
            .await
            .expect("reload");
    }

    /// The port pgdp listens on.
    pub fn port(&self) -> u16 {
        self.running.as_ref().expect("server running").addr.port()
    }

    /// The shared state of the running server.
    pub fn shared(&self) -> std::sync::Arc<pgdp::session::Shared> {
        self.running.as_ref().expect("server running").shared()
    }

    /// The address of the metrics endpoint (started with `Options::metrics`).
    pub fn metrics_addr(&self) -> std::net::SocketAddr {
        self.running
            .as_ref()
            .expect("server running")
            .metrics_addr
            .expect("a server started with a metrics endpoint")
    }

    /// A DSN for `user` / `password` on database `dbname`.
    pub fn dsn_for(&self, user: &str, password: &str, dbname: &str) -> String {
        format!(
            "host=127.0.0.1 port={} user={user} password={password} dbname={dbname} sslmode=disable connect_timeout=10",
            self.port()
        )
    }

    /// A connection as `user`, or the error of the attempt.
    pub async fn try_connect(
        &self,
        user: &str,
        password: &str,
        dbname: &str,
    ) -> Result<Session, tokio_postgres::Error> {
        Session::open(&self.dsn_for(user, password, dbname)).await
    }

    /// The DSN of the demo analyst.
    pub fn dsn(&self) -> String {
        self.dsn_for(ANALYST, PASSWORD, DATABASE)
    }

    /// A connection as the demo analyst.
    pub async fn connect(&self) -> Session {
        self.try_connect(ANALYST, PASSWORD, DATABASE)
            .await
            .unwrap_or_else(|e| panic!("cannot connect to pgdp: {e}"))
    }

    /// Runs the real `psql` as the demo analyst with the given `-c` commands (each one simple
    /// query message, or a backslash command) and extra arguments.
    pub async fn psql(&self, extra_args: &[&str], commands: &[&str]) -> PsqlRun {
        self.psql_as(ANALYST, PASSWORD, extra_args, commands).await
    }

    /// Runs `psql` as `user` with `password` (see [`Proxy::psql`]).
    pub async fn psql_as(
        &self,
        user: &str,
        password: &str,
        extra_args: &[&str],
        commands: &[&str],
    ) -> PsqlRun {
        let port = self.port().to_string();
        let mut cmd = tokio::process::Command::new("psql");
        cmd.args([
            "-X",
            "-h",
            "127.0.0.1",
            "-p",
            &port,
            "-U",
            user,
            "-d",
            DATABASE,
        ])
        .args(extra_args);
        for c in commands {
            cmd.arg("-c").arg(c);
        }
        cmd.env("PGPASSWORD", password)
            .env("PGCONNECT_TIMEOUT", "10")
            .env("LC_ALL", "C")
            .env_remove("PGSERVICE")
            .env_remove("PGOPTIONS")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let output = tokio::time::timeout(PSQL_TIMEOUT, cmd.output())
            .await
            .expect("psql did not finish in time")
            .expect("psql could not be run");
        PsqlRun {
            status: output.status.code(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }

    /// Stops the server and drops the ledger database.
    pub async fn stop(mut self) {
        drop(self.running.take());
        if let Some(ledger) = self.ledger.take() {
            ledger.drop_db().await;
        }
    }
}

async fn start_server(
    upstream: Option<&str>,
    policy: Policy,
    ledger_dsn: &str,
    seed: u8,
    options: Options,
) -> Running {
    let upstream = match upstream {
        Some(dsn) => dsn.to_string(),
        None => harness::demo_database(1).await.dsn().to_string(),
    };
    server::start_with(
        Config {
            policy,
            upstream,
            ledger: Some(ledger_dsn.to_string()),
            listen: "127.0.0.1:0".into(),
            noise_seed: Some([seed; 32]),
        },
        options,
    )
    .await
    .unwrap_or_else(|e| panic!("pgdp did not start: {e}"))
}

/// A tokio-postgres connection to pgdp whose NOTICE messages are collected.
pub struct Session {
    pub client: Client,
    notices: Arc<Mutex<Vec<String>>>,
}

impl std::ops::Deref for Session {
    type Target = Client;
    fn deref(&self) -> &Client {
        &self.client
    }
}

impl Session {
    /// Connects to `dsn`, driving the connection on the current runtime and collecting notices.
    pub async fn open(dsn: &str) -> Result<Session, tokio_postgres::Error> {
        let (client, mut connection) = tokio_postgres::connect(dsn, NoTls).await?;
        let notices = Arc::new(Mutex::new(Vec::new()));
        let sink = notices.clone();
        tokio::spawn(async move {
            let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
            while let Some(message) = messages.next().await {
                match message {
                    Ok(AsyncMessage::Notice(notice)) => sink
                        .lock()
                        .expect("notice list poisoned")
                        .push(notice.message().to_string()),
                    Ok(_) => {}
                    Err(_) => break,
                }
            }
        });
        Ok(Session { client, notices })
    }

    /// The notices received since the last call. The connection task records a notice before it
    /// passes on the rest of the response, so a finished query's notices are all here.
    pub fn take_notices(&self) -> Vec<String> {
        std::mem::take(&mut *self.notices.lock().expect("notice list poisoned"))
    }

    /// `SHOW pgdp.budget` as (total, spent, remaining) ε.
    pub async fn budget(&self) -> Budget {
        let row = self
            .client
            .query_one("SHOW pgdp.budget", &[])
            .await
            .expect("SHOW pgdp.budget");
        Budget {
            epsilon_total: row.get("epsilon_total"),
            epsilon_spent: row.get("epsilon_spent"),
            epsilon_remaining: row.get("epsilon_remaining"),
            delta_total: row.get("delta_total"),
            delta_spent: row.get("delta_spent"),
            delta_remaining: row.get("delta_remaining"),
        }
    }

    /// `queries_like_last` of `SHOW pgdp.budget`: how many more queries like this session's
    /// last charged one fit (`None` before its first charge).
    pub async fn queries_like_last(&self) -> Option<i64> {
        self.client
            .query_one("SELECT queries_like_last FROM pgdp.budget", &[])
            .await
            .expect("SELECT queries_like_last FROM pgdp.budget")
            .get(0)
    }

    /// Runs SQL with the simple protocol and returns the text rows (NULL as `None`).
    pub async fn simple_rows(
        &self,
        sql: &str,
    ) -> Result<Vec<Vec<Option<String>>>, tokio_postgres::Error> {
        let messages = self.client.simple_query(sql).await?;
        Ok(messages
            .into_iter()
            .filter_map(|m| match m {
                SimpleQueryMessage::Row(row) => Some(
                    (0..row.len())
                        .map(|i| row.get(i).map(str::to_string))
                        .collect(),
                ),
                _ => None,
            })
            .collect())
    }

    /// `SHOW name` through the simple protocol.
    pub async fn show(&self, name: &str) -> String {
        let rows = self
            .simple_rows(&format!("SHOW {name}"))
            .await
            .unwrap_or_else(|e| panic!("SHOW {name}: {e}"));
        rows.first()
            .and_then(|r| r.first().cloned().flatten())
            .unwrap_or_else(|| panic!("SHOW {name} returned no value"))
    }

    /// Asserts that the connection still answers a trivial query.
    pub async fn assert_alive(&self, after: &str) {
        let rows = self
            .simple_rows("SELECT 1")
            .await
            .unwrap_or_else(|e| panic!("connection unusable after {after:?}: {e}"));
        assert_eq!(rows, vec![vec![Some("1".to_string())]], "after {after:?}");
    }
}

/// The analyst's budget as `SHOW pgdp.budget` reports it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Budget {
    pub epsilon_total: f64,
    pub epsilon_spent: f64,
    pub epsilon_remaining: f64,
    pub delta_total: f64,
    pub delta_spent: f64,
    pub delta_remaining: f64,
}

/// The result of one psql run.
#[derive(Debug)]
pub struct PsqlRun {
    pub status: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl PsqlRun {
    /// stdout lines, without empty ones.
    pub fn lines(&self) -> Vec<&str> {
        self.stdout.lines().filter(|l| !l.is_empty()).collect()
    }

    /// SQLSTATEs of the `ERROR:  XXXXX: …` lines psql prints with `\set VERBOSITY verbose`, in
    /// order.
    pub fn error_codes(&self) -> Vec<String> {
        self.stderr
            .lines()
            .filter_map(|l| l.split_once("ERROR:  "))
            .map(|(_, rest)| rest.chars().take(5).collect::<String>())
            .collect()
    }

    /// Asserts psql exited with status 0 and printed no error.
    pub fn assert_ok(&self) {
        assert!(
            self.status == Some(0) && !self.stderr.contains("ERROR"),
            "psql failed: status {:?}\nstdout:\n{}\nstderr:\n{}",
            self.status,
            self.stdout,
            self.stderr
        );
    }
}

/// The SQLSTATE of a failed call (panics with the error if it carries none).
pub fn code(error: &tokio_postgres::Error) -> &SqlState {
    error
        .code()
        .unwrap_or_else(|| panic!("error without SQLSTATE: {error:?}"))
}

/// Asserts that `result` failed with `expected`, naming `what` on failure.
#[track_caller]
pub fn assert_code<T: std::fmt::Debug>(
    result: Result<T, tokio_postgres::Error>,
    expected: &SqlState,
    what: &str,
) -> tokio_postgres::Error {
    match result {
        Ok(v) => panic!(
            "{what}: expected SQLSTATE {}, got success: {v:?}",
            expected.code()
        ),
        Err(e) => {
            assert_eq!(
                code(&e).code(),
                expected.code(),
                "{what}: wrong SQLSTATE ({e:?})"
            );
            e
        }
    }
}

/// True counts on the upstream, computed directly with tokio-postgres.
pub async fn upstream_client() -> Client {
    harness::demo_database(1).await.client().await
}

/// A CA and a server certificate for `localhost` / 127.0.0.1, made with the `openssl` CLI in a
/// directory removed on drop.
pub struct Certificates {
    pub dir: PathBuf,
}

impl Certificates {
    pub fn make() -> Certificates {
        Certificates::make_for("DNS:localhost,IP:127.0.0.1")
    }

    /// A CA and a server certificate whose subjectAltName is `san` (openssl's syntax).
    pub fn make_for(san: &str) -> Certificates {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "pgdp-tls-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("temp dir");
        std::fs::write(
            dir.join("server.ext"),
            format!("subjectAltName={san}\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n"),
        )
        .expect("extensions file");
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        openssl(
            &dir,
            &[
                &["req", "-x509"],
                &ec[..],
                &[
                    "-keyout",
                    "ca.key",
                    "-out",
                    "ca.pem",
                    "-days",
                    "2",
                    "-subj",
                    "/CN=pgdp test CA",
                ],
            ]
            .concat(),
        );
        openssl(
            &dir,
            &[
                &["req"],
                &ec[..],
                &[
                    "-keyout",
                    "server.key",
                    "-out",
                    "server.csr",
                    "-subj",
                    "/CN=localhost",
                ],
            ]
            .concat(),
        );
        openssl(
            &dir,
            &[
                "x509",
                "-req",
                "-in",
                "server.csr",
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                "server.pem",
                "-days",
                "2",
                "-extfile",
                "server.ext",
            ],
        );
        Certificates { dir }
    }

    pub fn files(&self) -> TlsFiles {
        TlsFiles {
            certificate: self.dir.join("server.pem"),
            key: self.dir.join("server.key"),
        }
    }

    pub fn ca(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }
}

impl Drop for Certificates {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub fn openssl(dir: &Path, args: &[&str]) {
    let out = std::process::Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .expect("openssl could not be run");
    assert!(
        out.status.success(),
        "openssl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs `psql` on a full connection string with the given `-c` commands.
pub async fn psql(conninfo: &str, commands: &[&str]) -> PsqlRun {
    let mut cmd = tokio::process::Command::new("psql");
    cmd.args(["-X", "-d", conninfo]);
    for c in commands {
        cmd.arg("-c").arg(c);
    }
    cmd.env("LC_ALL", "C")
        .env_remove("PGSERVICE")
        .env_remove("PGOPTIONS")
        .env_remove("PGSSLMODE")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let output = tokio::time::timeout(Duration::from_secs(60), cmd.output())
        .await
        .expect("psql did not finish in time")
        .expect("psql could not be run");
    PsqlRun {
        status: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// A number of any PostgreSQL numeric type (`int2`, `int4`, `int8`, `float4`, `float8`,
/// `numeric`) read as the nearest `f64`. tokio-postgres decodes no `numeric` without a decimal
/// crate, so its binary form (base-10000 digits with a weight and a sign) is read here.
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd)]
pub struct Number(pub f64);

impl<'a> tokio_postgres::types::FromSql<'a> for Number {
    fn from_sql(
        ty: &tokio_postgres::types::Type,
        raw: &'a [u8],
    ) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        use tokio_postgres::types::Type;
        let fixed = |n: usize| -> Result<&[u8], Box<dyn std::error::Error + Sync + Send>> {
            (raw.len() == n)
                .then_some(raw)
                .ok_or_else(|| "bad length".into())
        };
        match ty {
            t if *t == Type::INT2 => {
                Ok(Number(f64::from(i16::from_be_bytes(fixed(2)?.try_into()?))))
            }
            t if *t == Type::INT4 => {
                Ok(Number(f64::from(i32::from_be_bytes(fixed(4)?.try_into()?))))
            }
            t if *t == Type::INT8 => Ok(Number(i64::from_be_bytes(fixed(8)?.try_into()?) as f64)),
            t if *t == Type::FLOAT4 => {
                Ok(Number(f64::from(f32::from_be_bytes(fixed(4)?.try_into()?))))
            }
            t if *t == Type::FLOAT8 => Ok(Number(f64::from_be_bytes(fixed(8)?.try_into()?))),
            _ => {
                let word = |i: usize| -> Result<i16, Box<dyn std::error::Error + Sync + Send>> {
                    let b = raw.get(2 * i..2 * i + 2).ok_or("short numeric")?;
                    Ok(i16::from_be_bytes([b[0], b[1]]))
                };
                let (ndigits, weight, sign) = (word(0)?, word(1)?, word(2)? as u16);
                let mut value = 0.0f64;
                for i in 0..usize::try_from(ndigits)? {
                    let exponent = i32::from(weight) - i32::try_from(i)?;
                    value += f64::from(word(4 + i)?) * 10_000f64.powi(exponent);
                }
                match sign {
                    0x0000 => Ok(Number(value)),
                    0x4000 => Ok(Number(-value)),
                    _ => Err("numeric NaN or infinity".into()),
                }
            }
        }
    }

    fn accepts(ty: &tokio_postgres::types::Type) -> bool {
        use tokio_postgres::types::Type;
        [
            Type::INT2,
            Type::INT4,
            Type::INT8,
            Type::FLOAT4,
            Type::FLOAT8,
            Type::NUMERIC,
        ]
        .contains(ty)
    }
}
