//! Protocol features and connection limits: the total and per-analyst connection limits (53300),
//! the startup timeout, the message-size and prepared-statement limits (54000), TLS (psql with
//! `sslmode=require` and `verify-full`, SCRAM with and without channel binding, clear text beside
//! TLS, `N` to an SSLRequest without a certificate), Execute with a row limit (PortalSuspended),
//! and SQL cursors (DECLARE / FETCH / MOVE / CLOSE).
//!
//! Each test starts its own server with lowered limits where it needs them, and checks that
//! the refused client gets its SQLSTATE while the process and the other sessions keep running.

use std::time::Duration;

use pgdp::frontend::ConnectionLimits;
use pgdp::policy::Policy;
use pgdp::server::{self, Config, Options, Running, TlsFiles};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_postgres::error::SqlState;
use tokio_postgres::SimpleQueryMessage;

use crate::harness::{self, TestDb};
use crate::support::{
    assert_code, demo_policy, demo_policy_text, psql, Certificates, Session, ANALYST, DATABASE,
    PASSWORD,
};

/// A second analyst with the demo analyst's verifier (SCRAM verifiers do not depend on the name),
/// so the password is the same.
const SECOND_ANALYST: &str = "analyst2";

/// How long a test waits for a released connection slot to be given back.
const SLOT_RETURN_TIMEOUT: Duration = Duration::from_secs(10);

/// A pgdp started with [`Options`] and a ledger of its own.
struct Server {
    running: Option<Running>,
    ledger: Option<TestDb>,
}

impl Server {
    async fn start(policy: Policy, options: Options) -> Server {
        let ledger = harness::fresh_database("ledger").await;
        let upstream = harness::demo_database(1).await.dsn().to_string();
        let running = server::start_with(
            Config {
                policy,
                upstream,
                ledger: Some(ledger.dsn().to_string()),
                listen: "127.0.0.1:0".into(),
                noise_seed: Some([11; 32]),
            },
            options,
        )
        .await
        .unwrap_or_else(|e| panic!("pgdp did not start: {e}"));
        Server {
            running: Some(running),
            ledger: Some(ledger),
        }
    }

    async fn with_limits(limits: ConnectionLimits) -> Server {
        Server::start(
            demo_policy(),
            Options {
                limits,
                ..Options::default()
            },
        )
        .await
    }

    fn port(&self) -> u16 {
        self.running.as_ref().expect("server running").addr.port()
    }

    /// A libpq-style connection string for `user` (password `analyst`) with `extra` settings.
    fn conninfo(&self, user: &str, extra: &str) -> String {
        format!(
            "host=127.0.0.1 port={} user={user} password={PASSWORD} dbname={DATABASE} connect_timeout=10 {extra}",
            self.port()
        )
    }

    async fn connect_as(&self, user: &str) -> Result<Session, tokio_postgres::Error> {
        Session::open(&self.conninfo(user, "sslmode=disable")).await
    }

    async fn connect(&self) -> Session {
        self.connect_as(ANALYST)
            .await
            .unwrap_or_else(|e| panic!("cannot connect to pgdp: {e}"))
    }

    /// Connects as `user`, retrying while the server still counts a connection that was just
    /// closed (its task ends asynchronously).
    async fn connect_when_freed(&self, user: &str) -> Session {
        let deadline = tokio::time::Instant::now() + SLOT_RETURN_TIMEOUT;
        loop {
            match self.connect_as(user).await {
                Ok(s) => return s,
                Err(e) if tokio::time::Instant::now() < deadline => {
                    assert_eq!(
                        e.code(),
                        Some(&SqlState::TOO_MANY_CONNECTIONS),
                        "unexpected error while waiting for a slot: {e}"
                    );
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("the closed connection's slot was never given back: {e}"),
            }
        }
    }

    async fn stop(mut self) {
        drop(self.running.take());
        if let Some(ledger) = self.ledger.take() {
            ledger.drop_db().await;
        }
    }
}

/// The demo policy with a second analyst.
fn two_analyst_policy() -> Policy {
    let text = demo_policy_text();
    let analyst = "analysts:\n  # Password \"analyst\" (a PostgreSQL SCRAM-SHA-256 verifier: pgdp never stores the password).\n  analyst:\n";
    assert!(
        text.contains(analyst),
        "the demo policy's analysts changed; update two_analyst_policy"
    );
    let verifier = text
        .lines()
        .find(|l| l.trim_start().starts_with("scram_verifier:"))
        .expect("the demo analyst has a verifier");
    let second = format!(
        "analysts:\n  {SECOND_ANALYST}:\n{verifier}\n    budget:\n      epsilon: 10\n      delta: 1.0e-5\n      epsilon_per_query_max: 2\n  analyst:\n"
    );
    let text = text.replacen(analyst, &second, 1);
    pgdp::policy::parse(&text).unwrap_or_else(|e| panic!("two-analyst policy: {e:?}"))
}

/// ε spent so far, from `SHOW pgdp.budget`.
async fn spent(session: &Session) -> f64 {
    session.budget().await.epsilon_spent
}

/// Text rows of a simple query, and the row counts of its CommandComplete messages.
async fn simple(
    session: &Session,
    sql: &str,
) -> Result<(Vec<Vec<Option<String>>>, Vec<u64>), tokio_postgres::Error> {
    let messages = session.client.simple_query(sql).await?;
    let mut rows = Vec::new();
    let mut counts = Vec::new();
    for m in messages {
        match m {
            SimpleQueryMessage::Row(row) => rows.push(
                (0..row.len())
                    .map(|i| row.get(i).map(str::to_string))
                    .collect(),
            ),
            SimpleQueryMessage::CommandComplete(n) => counts.push(n),
            _ => {}
        }
    }
    Ok((rows, counts))
}

// ---------------------------------------------------------------------------------------------
// Connection limits
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn connections_past_the_total_limit_are_refused_with_53300() {
    let server = Server::with_limits(ConnectionLimits {
        connections_max: 2,
        ..ConnectionLimits::default()
    })
    .await;
    let first = server.connect().await;
    let second = server.connect().await;
    assert_code(
        server.connect_as(ANALYST).await.map(|_| ()),
        &SqlState::TOO_MANY_CONNECTIONS,
        "third connection",
    );
    // psql shows the refusal the way PostgreSQL words it.
    let run = psql(&server.conninfo(ANALYST, "sslmode=disable"), &["SELECT 1"]).await;
    assert_ne!(run.status, Some(0), "psql connected past the limit");
    assert!(
        run.stderr.contains("too many connections"),
        "{}",
        run.stderr
    );
    first.assert_alive("refused connections").await;
    second.assert_alive("refused connections").await;
    drop(second);
    let again = server.connect_when_freed(ANALYST).await;
    again.assert_alive("reconnect after a slot was freed").await;
    first.assert_alive("reconnect").await;
    drop((first, again));
    server.stop().await;
}

#[tokio::test]
async fn connections_past_the_per_analyst_limit_are_refused_with_53300() {
    let server = Server::start(
        two_analyst_policy(),
        Options {
            tls: None,
            limits: ConnectionLimits {
                connections_per_analyst_max: 1,
                ..ConnectionLimits::default()
            },
            ..Options::default()
        },
    )
    .await;
    let first = server.connect().await;
    assert_code(
        server.connect_as(ANALYST).await.map(|_| ()),
        &SqlState::TOO_MANY_CONNECTIONS,
        "second connection of one analyst",
    );
    // Another analyst is not affected, and a wrong password is still 28P01 (the limit is
    // checked only after authentication, so it reveals nothing to a stranger).
    let other = server
        .connect_as(SECOND_ANALYST)
        .await
        .unwrap_or_else(|e| panic!("the other analyst was refused: {e}"));
    other.assert_alive("the first analyst's refusal").await;
    let wrong = Session::open(&format!(
        "host=127.0.0.1 port={} user={ANALYST} password=wrong dbname={DATABASE} sslmode=disable",
        server.port()
    ))
    .await;
    assert_code(
        wrong.map(|_| ()),
        &SqlState::INVALID_PASSWORD,
        "wrong password",
    );
    first.assert_alive("the refusal").await;
    drop(first);
    let again = server.connect_when_freed(ANALYST).await;
    again.assert_alive("reconnect").await;
    drop((other, again));
    server.stop().await;
}

#[tokio::test]
async fn a_client_that_sends_nothing_is_dropped_after_the_startup_timeout() {
    let server = Server::with_limits(ConnectionLimits {
        startup_timeout_ms: 300,
        ..ConnectionLimits::default()
    })
    .await;
    let session = server.connect().await;
    let started = std::time::Instant::now();
    let mut silent = TcpStream::connect(("127.0.0.1", server.port()))
        .await
        .expect("tcp connect");
    let mut byte = [0u8; 1];
    let read = tokio::time::timeout(Duration::from_secs(10), silent.read(&mut byte))
        .await
        .expect("the silent client was never dropped");
    assert!(
        matches!(read, Ok(0) | Err(_)),
        "the server sent something to a silent client: {read:?}"
    );
    assert!(
        started.elapsed() >= Duration::from_millis(250),
        "dropped before the timeout"
    );
    // A client that stops after the SSLRequest is dropped too.
    let mut stalled = TcpStream::connect(("127.0.0.1", server.port()))
        .await
        .expect("tcp connect");
    stalled.write_all(&ssl_request()).await.expect("write");
    let mut answer = [0u8; 1];
    stalled.read_exact(&mut answer).await.expect("SSL answer");
    assert_eq!(&answer, b"N");
    let read = tokio::time::timeout(Duration::from_secs(10), stalled.read(&mut byte))
        .await
        .expect("the stalled client was never dropped");
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    // The session that had started up is not subject to the timeout.
    session.assert_alive("startup timeouts of others").await;
    server
        .connect()
        .await
        .assert_alive("a new connection")
        .await;
    drop(session);
    server.stop().await;
}

#[tokio::test]
async fn an_oversized_message_ends_only_its_connection_with_54000() {
    let server = Server::with_limits(ConnectionLimits::default()).await;
    let victim = server.connect().await;
    let bystander = server.connect().await;
    // Over SQL_BYTES_MAX but within the message limit: an ordinary refusal.
    let long = format!("SELECT '{}'", "x".repeat(pgdp::limits::SQL_BYTES_MAX));
    assert_code(
        victim.simple_query(&long).await,
        &SqlState::PROGRAM_LIMIT_EXCEEDED,
        "SQL over SQL_BYTES_MAX",
    );
    victim.assert_alive("an over-long SQL text").await;
    // Over MESSAGE_BYTES_MAX: refused as soon as the header arrives, and the connection ends.
    let huge = format!(
        "SELECT '{}'",
        "x".repeat(2 * pgdp::limits::MESSAGE_BYTES_MAX)
    );
    assert_code(
        victim.simple_query(&huge).await,
        &SqlState::PROGRAM_LIMIT_EXCEEDED,
        "message over MESSAGE_BYTES_MAX",
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !victim.is_closed() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        victim.is_closed(),
        "the connection survived an oversized message"
    );
    bystander
        .assert_alive("another connection's oversized message")
        .await;
    server
        .connect()
        .await
        .assert_alive("a new connection")
        .await;
    drop((victim, bystander));
    server.stop().await;
}

#[tokio::test]
async fn an_oversized_startup_message_is_refused_with_54000() {
    let server = Server::with_limits(ConnectionLimits {
        message_bytes_max: 4096,
        ..ConnectionLimits::default()
    })
    .await;
    let mut raw = TcpStream::connect(("127.0.0.1", server.port()))
        .await
        .expect("tcp connect");
    // A startup message header declaring 1 MiB, then a little of its body.
    let mut header = Vec::new();
    header.extend_from_slice(&(1024u32 * 1024).to_be_bytes());
    header.extend_from_slice(&196_608u32.to_be_bytes());
    header.extend_from_slice(b"user\0analyst\0");
    raw.write_all(&header).await.expect("write");
    let mut reply = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), raw.read_to_end(&mut reply))
        .await
        .expect("the server kept the connection open");
    assert_eq!(
        reply.first(),
        Some(&b'E'),
        "not an ErrorResponse: {reply:?}"
    );
    let text = String::from_utf8_lossy(&reply);
    assert!(text.contains("C54000"), "{text}");
    assert!(text.contains("SFATAL"), "{text}");
    server
        .connect()
        .await
        .assert_alive("a refused startup")
        .await;
    server.stop().await;
}

#[tokio::test]
async fn prepared_statements_past_the_limit_are_refused_with_54000() {
    let server = Server::with_limits(ConnectionLimits {
        prepared_statements_max: 3,
        ..ConnectionLimits::default()
    })
    .await;
    let session = server.connect().await;
    let mut held = Vec::new();
    for i in 0..3 {
        held.push(
            session
                .prepare(&format!("SELECT {i}"))
                .await
                .unwrap_or_else(|e| panic!("statement {i}: {e}")),
        );
    }
    assert_code(
        session.prepare("SELECT 3").await,
        &SqlState::PROGRAM_LIMIT_EXCEEDED,
        "fourth prepared statement",
    );
    session.assert_alive("the prepared-statement limit").await;
    // The statements held still run; closing one (tokio-postgres sends Close on drop) makes room.
    let rows = session.query(&held[1], &[]).await.expect("held statement");
    assert_eq!(rows[0].get::<_, i32>(0), 1);
    drop(held.pop());
    let again = session.prepare("SELECT 4").await.expect("room after Close");
    assert_eq!(
        session.query(&again, &[]).await.expect("run")[0].get::<_, i32>(0),
        4
    );
    // Unnamed statements (query with parameters through the unnamed statement) do not count.
    let other = server.connect().await;
    other.assert_alive("another connection").await;
    drop((session, other, held, again));
    server.stop().await;
}

// ---------------------------------------------------------------------------------------------
// TLS
// ---------------------------------------------------------------------------------------------

/// PostgreSQL's SSLRequest message.
fn ssl_request() -> [u8; 8] {
    let mut m = [0u8; 8];
    m[..4].copy_from_slice(&8u32.to_be_bytes());
    m[4..].copy_from_slice(&80_877_103u32.to_be_bytes());
    m
}

async fn tls_server(certificates: &Certificates) -> Server {
    Server::start(
        demo_policy(),
        Options {
            tls: Some(certificates.files()),
            ..Options::default()
        },
    )
    .await
}

#[tokio::test]
async fn psql_connects_over_tls_with_require_and_verify_full() {
    let certificates = Certificates::make();
    let server = tls_server(&certificates).await;
    let run = psql(
        &server.conninfo(ANALYST, "sslmode=require"),
        &["\\conninfo", "SELECT COUNT(*) FROM demo.people"],
    )
    .await;
    run.assert_ok();
    assert!(
        run.stdout.contains("SSL connection (protocol: TLSv1.3"),
        "{}",
        run.stdout
    );
    let verify = format!(
        "host=localhost hostaddr=127.0.0.1 port={} user={ANALYST} password={PASSWORD} dbname={DATABASE} sslmode=verify-full sslrootcert={}",
        server.port(),
        certificates.ca().display()
    );
    let run = psql(&verify, &["\\conninfo", "SHOW pgdp.budget"]).await;
    run.assert_ok();
    assert!(run.stdout.contains("SSL connection"), "{}", run.stdout);
    // SCRAM with channel binding to the server certificate (SCRAM-SHA-256-PLUS).
    let run = psql(&format!("{verify} channel_binding=require"), &["SELECT 1"]).await;
    run.assert_ok();
    // A wrong password over TLS is still 28P01.
    let wrong = psql(
        &format!(
            "host=127.0.0.1 port={} user={ANALYST} password=wrong dbname={DATABASE} sslmode=require",
            server.port()
        ),
        &["SELECT 1"],
    )
    .await;
    assert_ne!(wrong.status, Some(0));
    assert!(
        wrong
            .stderr
            .to_lowercase()
            .contains("password authentication failed"),
        "{}",
        wrong.stderr
    );
    // A CA that did not sign the certificate is rejected by the client.
    let other = Certificates::make();
    let run = psql(
        &format!(
            "host=localhost hostaddr=127.0.0.1 port={} user={ANALYST} password={PASSWORD} dbname={DATABASE} sslmode=verify-full sslrootcert={}",
            server.port(),
            other.ca().display()
        ),
        &["SELECT 1"],
    )
    .await;
    assert_ne!(run.status, Some(0), "verify-full accepted a foreign CA");
    server.stop().await;
}

#[tokio::test]
async fn clear_text_connections_still_work_when_tls_is_configured() {
    let certificates = Certificates::make();
    let server = tls_server(&certificates).await;
    let session = server.connect().await;
    session.assert_alive("a clear-text connection").await;
    let run = psql(
        &server.conninfo(ANALYST, "sslmode=disable"),
        &["\\conninfo"],
    )
    .await;
    run.assert_ok();
    assert!(!run.stdout.contains("SSL connection"), "{}", run.stdout);
    // sslmode=prefer (libpq's default) takes TLS when offered.
    let run = psql(&server.conninfo(ANALYST, "sslmode=prefer"), &["\\conninfo"]).await;
    run.assert_ok();
    assert!(run.stdout.contains("SSL connection"), "{}", run.stdout);
    drop(session);
    server.stop().await;
}

#[tokio::test]
async fn without_a_certificate_an_ssl_request_is_answered_n() {
    let server = Server::with_limits(ConnectionLimits::default()).await;
    let mut raw = TcpStream::connect(("127.0.0.1", server.port()))
        .await
        .expect("tcp connect");
    raw.write_all(&ssl_request()).await.expect("write");
    let mut answer = [0u8; 1];
    raw.read_exact(&mut answer).await.expect("SSL answer");
    assert_eq!(&answer, b"N");
    let run = psql(&server.conninfo(ANALYST, "sslmode=require"), &["SELECT 1"]).await;
    assert_ne!(run.status, Some(0), "sslmode=require connected without TLS");
    assert!(
        run.stderr.contains("does not support SSL"),
        "{}",
        run.stderr
    );
    // prefer falls back to clear text.
    let run = psql(&server.conninfo(ANALYST, "sslmode=prefer"), &["SELECT 1"]).await;
    run.assert_ok();
    server.stop().await;
}

#[tokio::test]
async fn unusable_tls_files_stop_the_server_from_starting() {
    let certificates = Certificates::make();
    let missing = TlsFiles {
        certificate: certificates.dir.join("nope.pem"),
        key: certificates.dir.join("server.key"),
    };
    assert!(matches!(
        server::load_tls(&missing),
        Err(server::StartError::Tls { .. })
    ));
    // The CA's key does not belong to the server certificate.
    let mismatched = TlsFiles {
        certificate: certificates.dir.join("server.pem"),
        key: certificates.dir.join("ca.key"),
    };
    assert!(matches!(
        server::load_tls(&mismatched),
        Err(server::StartError::Tls { .. })
    ));
    assert!(server::load_tls(&certificates.files()).is_ok());
}

// ---------------------------------------------------------------------------------------------
// Execute with a row limit
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn execute_with_a_row_limit_suspends_and_resumes_the_portal() {
    let server = Server::with_limits(ConnectionLimits::default()).await;
    let mut session = server.connect().await;
    let before = spent(&session).await;
    let transaction = session.client.transaction().await.expect("BEGIN");
    let statement = transaction
        .prepare("SELECT region, COUNT(*) AS people FROM demo.people GROUP BY region")
        .await
        .expect("prepare");
    let portal = transaction.bind(&statement, &[]).await.expect("bind");
    let mut regions = Vec::new();
    let mut batches = 0;
    loop {
        let rows = transaction
            .query_portal(&portal, 3)
            .await
            .expect("execute with a row limit");
        assert!(rows.len() <= 3, "more rows than the limit");
        if rows.is_empty() {
            break;
        }
        batches += 1;
        regions.extend(rows.iter().map(|r| r.get::<_, String>("region")));
    }
    transaction.commit().await.expect("COMMIT");
    // Ten public regions, released once and served in batches of three.
    assert_eq!(regions.len(), 10, "{regions:?}");
    assert_eq!(batches, 4);
    let mut distinct = regions.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), 10, "{regions:?}");
    let charged = spent(&session).await - before;
    assert!(charged > 0.0, "nothing was charged");
    // The query charged once, not once per batch: the same query again is a replay (free), so
    // one more full run leaves the budget where it is.
    let again = session
        .query(
            "SELECT region, COUNT(*) AS people FROM demo.people GROUP BY region",
            &[],
        )
        .await
        .expect("the same query");
    assert_eq!(again.len(), 10);
    assert_eq!(spent(&session).await - before, charged);
    drop(session);
    server.stop().await;
}

// ---------------------------------------------------------------------------------------------
// Cursors
// ---------------------------------------------------------------------------------------------

const REGION_COUNTS: &str = "SELECT region, COUNT(*) AS people FROM demo.people GROUP BY region";

#[tokio::test]
async fn a_cursor_serves_the_rows_its_declare_released_and_charged() {
    let server = Server::with_limits(ConnectionLimits::default()).await;
    let session = server.connect().await;
    let before = spent(&session).await;
    simple(&session, "BEGIN").await.expect("BEGIN");
    simple(
        &session,
        &format!("DECLARE c NO SCROLL CURSOR FOR {REGION_COUNTS}"),
    )
    .await
    .expect("DECLARE");
    let charged = spent(&session).await - before;
    assert!(charged > 0.0, "DECLARE charged nothing");
    let (first, counts) = simple(&session, "FETCH 4 FROM c").await.expect("FETCH 4");
    assert_eq!((first.len(), counts.clone()), (4, vec![4]));
    let (next, _) = simple(&session, "FETCH NEXT c").await.expect("FETCH NEXT");
    assert_eq!(next.len(), 1);
    let (_, moved) = simple(&session, "MOVE 2 IN c").await.expect("MOVE");
    assert_eq!(moved, vec![2]);
    let (rest, counts) = simple(&session, "FETCH ALL IN c").await.expect("FETCH ALL");
    assert_eq!((rest.len(), counts), (3, vec![3]));
    let (none, counts) = simple(&session, "FETCH FORWARD 5 FROM c")
        .await
        .expect("FETCH past the end");
    assert_eq!((none.len(), counts), (0, vec![0]));
    // FETCH is post-processing of the release: free.
    assert_eq!(spent(&session).await - before, charged);
    simple(&session, "CLOSE c").await.expect("CLOSE");
    assert_code(
        simple(&session, "FETCH 1 FROM c").await,
        &SqlState::INVALID_CURSOR_NAME,
        "FETCH after CLOSE",
    );
    simple(&session, "ROLLBACK").await.expect("ROLLBACK");
    // The rows fetched are the release: the same query again is answered from the replay cache.
    let direct = session.simple_rows(REGION_COUNTS).await.expect("direct");
    let mut fetched: Vec<_> = first.into_iter().chain(next).chain(rest).collect();
    fetched.sort();
    let mut direct_without_moved = direct.clone();
    direct_without_moved.sort();
    assert!(
        fetched.iter().all(|r| direct_without_moved.contains(r)),
        "fetched rows differ from the release: {fetched:?} vs {direct:?}"
    );
    assert_eq!(spent(&session).await - before, charged);
    drop(session);
    server.stop().await;
}

#[tokio::test]
async fn cursor_lifetimes_follow_postgresql() {
    let server = Server::with_limits(ConnectionLimits::default()).await;
    let session = server.connect().await;
    assert_code(
        simple(&session, "DECLARE c CURSOR FOR SELECT 1").await,
        &SqlState::NO_ACTIVE_SQL_TRANSACTION,
        "DECLARE without HOLD outside a transaction block",
    );
    session.assert_alive("25P01").await;
    // WITH HOLD outside a block lives on.
    simple(
        &session,
        "DECLARE held CURSOR WITH HOLD FOR SELECT 1 AS one",
    )
    .await
    .expect("DECLARE WITH HOLD");
    assert_code(
        simple(&session, "DECLARE held CURSOR WITH HOLD FOR SELECT 2").await,
        &SqlState::DUPLICATE_CURSOR,
        "duplicate cursor",
    );
    // Without HOLD: gone at COMMIT.
    simple(&session, "BEGIN; DECLARE c CURSOR FOR SELECT 2; COMMIT")
        .await
        .expect("block");
    assert_code(
        simple(&session, "FETCH c").await,
        &SqlState::INVALID_CURSOR_NAME,
        "cursor after COMMIT",
    );
    // WITH HOLD declared in a rolled-back block: gone; one declared before it: kept.
    simple(
        &session,
        "BEGIN; DECLARE h2 CURSOR WITH HOLD FOR SELECT 3; ROLLBACK",
    )
    .await
    .expect("rolled back block");
    assert_code(
        simple(&session, "FETCH h2").await,
        &SqlState::INVALID_CURSOR_NAME,
        "HOLD cursor of a rolled-back block",
    );
    // A failed block: COMMIT rolls back, so its HOLD cursors go too.
    let _ = simple(&session, "BEGIN").await.expect("BEGIN");
    simple(&session, "DECLARE h3 CURSOR WITH HOLD FOR SELECT 4")
        .await
        .expect("DECLARE h3");
    let _ = simple(&session, "SELECT nope FROM demo.people").await;
    let (_, _) = simple(&session, "COMMIT")
        .await
        .expect("COMMIT of a failed block");
    assert_code(
        simple(&session, "FETCH h3").await,
        &SqlState::INVALID_CURSOR_NAME,
        "HOLD cursor of a failed block",
    );
    let (rows, _) = simple(&session, "FETCH ALL FROM held")
        .await
        .expect("FETCH held");
    assert_eq!(rows, vec![vec![Some("1".to_string())]]);
    simple(&session, "CLOSE ALL").await.expect("CLOSE ALL");
    assert_code(
        simple(&session, "CLOSE held").await,
        &SqlState::INVALID_CURSOR_NAME,
        "CLOSE after CLOSE ALL",
    );
    assert_code(
        simple(&session, "FETCH BACKWARD 1 FROM held").await,
        &SqlState::FEATURE_NOT_SUPPORTED,
        "backward fetch",
    );
    session.assert_alive("cursor errors").await;
    drop(session);
    server.stop().await;
}

#[tokio::test]
async fn psqlodbc_declare_fetch_sequence_works() {
    let server = Server::with_limits(ConnectionLimits::default()).await;
    let session = server.connect().await;
    // psqlODBC with UseDeclareFetch=1 sends this in one message (note the empty statement).
    let (rows, _) = simple(
        &session,
        "BEGIN;declare \"SQL_CUR0x55d1\" cursor with hold for SELECT COUNT(*) FROM demo.people;;fetch 100 in \"SQL_CUR0x55d1\"",
    )
    .await
    .expect("psqlODBC's DECLARE/FETCH");
    assert_eq!(rows.len(), 1);
    let count: i64 = rows[0][0]
        .as_deref()
        .expect("a count")
        .parse()
        .expect("an integer");
    assert!(count > 0, "{count}");
    let (rows, _) = simple(&session, "fetch 100 in \"SQL_CUR0x55d1\"")
        .await
        .expect("second FETCH");
    assert!(rows.is_empty());
    simple(&session, "close \"SQL_CUR0x55d1\";COMMIT")
        .await
        .expect("CLOSE and COMMIT");
    drop(session);
    server.stop().await;
}

#[tokio::test]
async fn a_cursor_over_a_catalog_query_is_free() {
    let server = Server::with_limits(ConnectionLimits::default()).await;
    let session = server.connect().await;
    let before = spent(&session).await;
    simple(
        &session,
        "DECLARE cat CURSOR WITH HOLD FOR SELECT nspname FROM pg_catalog.pg_namespace ORDER BY nspname",
    )
    .await
    .expect("DECLARE over the catalog");
    let (rows, _) = simple(&session, "FETCH ALL FROM cat")
        .await
        .expect("FETCH ALL");
    assert!(rows.contains(&vec![Some("demo".to_string())]), "{rows:?}");
    assert_eq!(spent(&session).await, before);
    drop(session);
    server.stop().await;
}

#[tokio::test]
async fn cursors_past_the_session_limit_are_refused_with_54000() {
    let server = Server::with_limits(ConnectionLimits::default()).await;
    let session = server.connect().await;
    for i in 0..pgdp::limits::CURSORS_PER_SESSION_MAX {
        simple(
            &session,
            &format!("DECLARE c{i} CURSOR WITH HOLD FOR SELECT {i}"),
        )
        .await
        .unwrap_or_else(|e| panic!("cursor {i}: {e}"));
    }
    assert_code(
        simple(
            &session,
            "DECLARE one_too_many CURSOR WITH HOLD FOR SELECT 1",
        )
        .await,
        &SqlState::PROGRAM_LIMIT_EXCEEDED,
        "one cursor too many",
    );
    simple(&session, "CLOSE c0").await.expect("CLOSE");
    simple(&session, "DECLARE one_more CURSOR WITH HOLD FOR SELECT 1")
        .await
        .expect("room after CLOSE");
    session.assert_alive("the cursor limit").await;
    drop(session);
    server.stop().await;
}

#[tokio::test]
async fn a_prepared_fetch_describes_the_cursor_columns() {
    let server = Server::with_limits(ConnectionLimits::default()).await;
    let session = server.connect().await;
    simple(
        &session,
        &format!("DECLARE pc CURSOR WITH HOLD FOR {REGION_COUNTS}"),
    )
    .await
    .expect("DECLARE");
    let rows = session
        .query("FETCH 3 FROM pc", &[])
        .await
        .expect("FETCH through the extended protocol");
    assert_eq!(rows.len(), 3);
    let _: String = rows[0].get("region");
    let _: i64 = rows[0].get("people");
    drop(session);
    server.stop().await;
}

/// Issue 17: at most `limits::CATALOG_QUERIES_PER_ANALYST_MAX` (2) catalog queries of one analyst
/// run on the shadow catalog at once, however many connections send them; the others wait and
/// are answered. Observed in the upstream's pg_stat_activity while six connections each send a
/// catalog query that takes a few hundred milliseconds (a literal unique to this test marks it).
#[tokio::test]
async fn catalog_queries_of_one_analyst_run_two_at_a_time() {
    let proxy = crate::support::Proxy::start(63).await;
    let sql = "SELECT COUNT(*) FROM generate_series(1, 3000017) g";
    let mut sessions = Vec::new();
    for _ in 0..6 {
        sessions.push(proxy.connect().await);
    }
    let observer = crate::support::upstream_client().await;
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watch = {
        let done = done.clone();
        async move {
            let mut most = 0i64;
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                let running: i64 = observer
                    .query_one(
                        "SELECT COUNT(*) FROM pg_stat_activity WHERE state = 'active' AND backend_type = 'client backend' AND query LIKE '%generate_series(1, 3000017)%' AND pid <> pg_backend_pid()",
                        &[],
                    )
                    .await
                    .expect("pg_stat_activity")
                    .get(0);
                most = most.max(running);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            most
        }
    };
    let run = async {
        let results = futures::future::join_all(sessions.iter().map(|s| s.simple_query(sql))).await;
        done.store(true, std::sync::atomic::Ordering::SeqCst);
        results
    };
    let (most, results) = tokio::join!(watch, run);
    for result in results {
        match result {
            Ok(_) => {}
            // On a very slow machine a query may pass the 1 s timeout: PostgreSQL's 57014.
            Err(e) => assert_eq!(e.code(), Some(&SqlState::QUERY_CANCELED), "{e:?}"),
        }
    }
    assert!(
        most <= 2,
        "{most} catalog queries of one analyst ran at once"
    );
    assert!(most >= 1, "the catalog queries were never seen running");
    proxy.stop().await;
}

/// Regression: pgdp processes that start at once over an upstream database without a shadow
/// catalog raced in `CREATE DATABASE`; the loser got 23505 (a unique violation in
/// pg_database), not 42P04, and refused every catalog query with 0A000 for the retry interval
/// (seen in the attack corpus on a fresh machine). Every server that starts at once must answer
/// catalog queries.
#[tokio::test]
async fn servers_starting_at_once_all_get_the_shadow_catalog() {
    let upstream = harness::fresh_database("shadow_race").await;
    upstream
        .client()
        .await
        .batch_execute("CREATE SCHEMA f; CREATE TABLE f.items (person_id bigint, v integer)")
        .await
        .expect("create f.items");
    let policy = pgdp::policy::parse(&format!(
        r#"
database: {}
analysts:
  analyst:
    scram_verifier: "SCRAM-SHA-256$4096:cGdkcC1kZW1vLXNhbHQtMQ==$lInLWt8gswE0sagso62TdobVlP/4N1mG//OTC1uOjxU=:Cs+4xOdBEHF3GmuzWiAu/lrFp8VOJ+dfMKys15hYAlg="
    budget: {{ epsilon: 1, delta: 1.0e-6 }}
tables:
  f.items:
    kind: private
    privacy_unit: person_id
    columns:
      person_id: {{ type: bigint }}
      v: {{ type: integer, lower: 0, upper: 100 }}
"#,
        upstream.name()
    ))
    .expect("policy");
    let ledger = harness::fresh_database("shadow_race_ledger").await;
    let servers = futures::future::join_all((0..6).map(|_| {
        server::start(Config {
            policy: policy.clone(),
            upstream: upstream.dsn().to_string(),
            ledger: Some(ledger.dsn().to_string()),
            listen: "127.0.0.1:0".into(),
            noise_seed: Some([5; 32]),
        })
    }))
    .await;
    for (i, running) in servers.iter().enumerate() {
        let running = running.as_ref().expect("pgdp starts");
        let dsn = format!(
            "host=127.0.0.1 port={} user=analyst password=analyst dbname={} sslmode=disable",
            running.addr.port(),
            upstream.name()
        );
        let (client, connection) = tokio_postgres::connect(&dsn, tokio_postgres::NoTls)
            .await
            .expect("connect to pgdp");
        tokio::spawn(connection);
        let rows = client
            .simple_query(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = 'f'",
            )
            .await
            .unwrap_or_else(|e| panic!("server {i}: catalog query refused: {e:?}"));
        let names: Vec<&str> = rows
            .iter()
            .filter_map(|m| match m {
                SimpleQueryMessage::Row(r) => r.get(0),
                _ => None,
            })
            .collect();
        assert_eq!(names, vec!["items"], "server {i}");
    }
    // A server that starts later with the same policy finds the build it would make and leaves
    // it alone: the shadow table is not dropped and recreated under the others' queries.
    let shadow = harness::connect(
        &harness::upstream()
            .await
            .dsn(&format!("{}_pgdp_catalog", upstream.name())),
    )
    .await;
    let table_oid = || async {
        shadow
            .query_one("SELECT 'f.items'::regclass::oid", &[])
            .await
            .expect("the shadow table")
            .get::<_, u32>(0)
    };
    let before = table_oid().await;
    let later = server::start(Config {
        policy: policy.clone(),
        upstream: upstream.dsn().to_string(),
        ledger: Some(ledger.dsn().to_string()),
        listen: "127.0.0.1:0".into(),
        noise_seed: Some([5; 32]),
    })
    .await
    .expect("a later pgdp starts");
    assert_eq!(table_oid().await, before, "the same build was made again");
    drop(later);
    drop(shadow);
    drop(servers);
    harness::upstream()
        .await
        .admin_client()
        .await
        .batch_execute(&format!(
            "DROP DATABASE IF EXISTS \"{}_pgdp_catalog\" WITH (FORCE)",
            upstream.name()
        ))
        .await
        .expect("drop the shadow catalog");
    ledger.drop_db().await;
    upstream.drop_db().await;
}
