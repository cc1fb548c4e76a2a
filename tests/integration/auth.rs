//! Authentication as PostgreSQL does it: a wrong password and an unknown user both get FATAL
//! 28P01 `password authentication failed for user "<name>"` with the name the client sent
//! (tokio-postgres and psql), a database pgdp does not serve gets FATAL 3D000 with a hint naming
//! the one it serves, and repeated failures from one address are refused with 53300 while other
//! addresses are still served.
//!
//! Unlike the other modules, these tests also assert the message text: matching PostgreSQL's
//! exact wording is the point of the feature (clients and tools match on it).

use std::net::SocketAddr;

use pgdp::server::Options;
use tokio::net::TcpSocket;
use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, Config, NoTls};

use crate::support::{assert_code, Proxy, ANALYST, DATABASE, PASSWORD};

/// PostgreSQL's message for a failed password login.
fn failed_for(user: &str) -> String {
    format!("password authentication failed for user \"{user}\"")
}

#[track_caller]
fn assert_password_failure(error: &tokio_postgres::Error, user: &str) {
    let db = error
        .as_db_error()
        .unwrap_or_else(|| panic!("not a server error: {error:?}"));
    assert_eq!(db.code(), &SqlState::INVALID_PASSWORD, "{db:?}");
    assert_eq!(db.severity(), "FATAL", "{db:?}");
    assert_eq!(db.message(), failed_for(user), "{db:?}");
}

#[tokio::test]
async fn wrong_password_and_unknown_user_get_postgres_message() {
    let proxy = Proxy::start(41).await;
    let wrong = assert_code(
        proxy
            .try_connect(ANALYST, "not-the-password", DATABASE)
            .await
            .map(drop),
        &SqlState::INVALID_PASSWORD,
        "wrong password",
    );
    assert_password_failure(&wrong, ANALYST);
    let unknown = assert_code(
        proxy
            .try_connect("mallory", PASSWORD, DATABASE)
            .await
            .map(drop),
        &SqlState::INVALID_PASSWORD,
        "unknown user",
    );
    assert_password_failure(&unknown, "mallory");

    // psql prints the server's FATAL line as is.
    for (user, password) in [(ANALYST, "wrong"), ("nobody", PASSWORD)] {
        let run = proxy.psql_as(user, password, &[], &["SELECT 1"]).await;
        assert_ne!(run.status, Some(0), "{user} logged in");
        let expected = format!("FATAL:  {}", failed_for(user));
        assert!(run.stderr.contains(&expected), "{}", run.stderr);
    }
    // The right password still works.
    proxy.connect().await.assert_alive("failed logins").await;
    proxy.stop().await;
}

#[tokio::test]
async fn a_database_pgdp_does_not_serve_is_fatal_3d000_naming_the_served_one() {
    let proxy = Proxy::start(42).await;
    let error = assert_code(
        proxy
            .try_connect(ANALYST, PASSWORD, "postgres")
            .await
            .map(drop),
        &SqlState::INVALID_CATALOG_NAME,
        "another database",
    );
    let db = error.as_db_error().expect("a server error");
    assert_eq!(db.severity(), "FATAL", "{db:?}");
    assert_eq!(db.message(), "database \"postgres\" does not exist");
    assert!(
        db.hint()
            .is_some_and(|h| h.contains(&format!("\"{DATABASE}\""))),
        "{db:?}"
    );
    // psql shows it as PostgreSQL's FATAL line, with the hint.
    let run = proxy
        .psql_as(ANALYST, PASSWORD, &["-d", "postgres"], &["SELECT 1"])
        .await;
    assert_ne!(run.status, Some(0));
    assert!(
        run.stderr
            .contains("FATAL:  database \"postgres\" does not exist"),
        "{}",
        run.stderr
    );
    proxy
        .connect()
        .await
        .assert_alive("a refused database")
        .await;
    proxy.stop().await;
}

/// Connects from `source` (any 127.0.0.0/8 address is this machine) to pgdp on `port`.
async fn connect_from(
    source: [u8; 4],
    port: u16,
    password: &str,
) -> Result<Client, tokio_postgres::Error> {
    connect_as_from(source, port, ANALYST, password).await
}

/// [`connect_from`] as `user`.
async fn connect_as_from(
    source: [u8; 4],
    port: u16,
    user: &str,
    password: &str,
) -> Result<Client, tokio_postgres::Error> {
    let socket = TcpSocket::new_v4().expect("socket");
    socket
        .bind(SocketAddr::from((source, 0)))
        .expect("bind to a loopback source address");
    let stream = socket
        .connect(SocketAddr::from(([127, 0, 0, 1], port)))
        .await
        .expect("tcp connect");
    let mut config = Config::new();
    config
        .user(user)
        .password(password)
        .dbname(DATABASE)
        .ssl_mode(tokio_postgres::config::SslMode::Disable);
    let (client, connection) = config.connect_raw(stream, NoTls).await?;
    tokio::spawn(connection);
    Ok(client)
}

#[tokio::test]
async fn repeated_failures_from_one_address_are_throttled_others_are_served() {
    let failures_max = 3;
    // The limit is the policy's (login_throttle), not a constant of pgdp's.
    let text = format!(
        "login_throttle: {{ failures_per_user: {failures_max}, window_s: 600 }}\n{}",
        crate::support::demo_policy_text()
    );
    let policy = pgdp::policy::parse(&text).expect("the demo policy with a login throttle");
    let proxy = Proxy::with_options(policy, 42, Options::default()).await;
    let port = proxy.port();
    let guesser = [127, 0, 0, 2];
    for _ in 0..failures_max {
        let e = assert_code(
            connect_from(guesser, port, "guess").await,
            &SqlState::INVALID_PASSWORD,
            "a guess",
        );
        assert_password_failure(&e, ANALYST);
    }
    // Now refused before the password is looked at: the right one is refused too.
    for password in ["guess", PASSWORD] {
        let e = assert_code(
            connect_from(guesser, port, password).await,
            &SqlState::TOO_MANY_CONNECTIONS,
            "a login from a throttled address",
        );
        assert_eq!(
            e.as_db_error().map(|d| d.severity()),
            Some("FATAL"),
            "{e:?}"
        );
    }
    // Other addresses are served as before, and their failures are their own.
    let client = connect_from([127, 0, 0, 3], port, PASSWORD)
        .await
        .expect("another address logs in");
    client.simple_query("SELECT 1").await.expect("and queries");
    let e = assert_code(
        connect_from([127, 0, 0, 3], port, "guess").await,
        &SqlState::INVALID_PASSWORD,
        "one wrong guess from another address",
    );
    assert_password_failure(&e, ANALYST);
    proxy.connect().await.assert_alive("throttling").await;
    drop(client);
    // The limit is read at each login: a reload that raises it lets the locked-out login in
    // again (its failures are kept: 3 of the new 10).
    let raised = text.replacen(
        &format!("failures_per_user: {failures_max},"),
        "failures_per_user: 10,",
        1,
    );
    proxy
        .reload(pgdp::policy::parse(&raised).expect("the raised throttle"))
        .await;
    let client = connect_from(guesser, port, PASSWORD)
        .await
        .expect("after the reload the locked-out address logs in");
    client.simple_query("SELECT 1").await.expect("and queries");
    drop(client);
    proxy.stop().await;
}

/// A BI server connects for all its users from one address (issue 43): one user's stale saved
/// password locks that user out there, while another analyst behind the same address is served;
/// a spray over many user names locks the address out for everyone.
#[tokio::test]
async fn two_analysts_behind_one_address_one_locked_out_the_other_served() {
    let text = crate::support::shipped_policy_text();
    let analyst_block = text
        .split("\n  analyst:\n")
        .nth(1)
        .and_then(|rest| rest.split("\ntables:").next())
        .expect("the demo analyst's block");
    // The same SCRAM verifier: `second` logs in with the demo password too.
    let text = text.replacen(
        "\n  analyst:\n",
        &format!("\n  second:\n{analyst_block}\n  analyst:\n"),
        1,
    );
    let (per_user, per_address) = (3, 6);
    let text = format!(
        "login_throttle: {{ failures_per_user: {per_user}, failures_per_address: {per_address}, window_s: 600 }}\n{text}"
    );
    let policy = pgdp::policy::parse(&text).expect("a policy with two analysts");
    let proxy = Proxy::with_options(policy, 43, Options::default()).await;
    let port = proxy.port();
    let bi_server = [127, 0, 0, 4];
    for _ in 0..per_user {
        assert_code(
            connect_as_from(bi_server, port, ANALYST, "stale").await,
            &SqlState::INVALID_PASSWORD,
            "a stale saved password",
        );
    }
    let e = assert_code(
        connect_as_from(bi_server, port, ANALYST, PASSWORD).await,
        &SqlState::TOO_MANY_CONNECTIONS,
        "the locked-out user, even with the right password",
    );
    assert_eq!(
        e.as_db_error().map(|d| d.message()),
        Some("too many failed authentication attempts for this user from this address"),
        "{e:?}"
    );
    let second = connect_as_from(bi_server, port, "second", PASSWORD)
        .await
        .expect("another analyst behind the same address logs in");
    second.simple_query("SELECT 1").await.expect("and queries");
    drop(second);
    // Three more failures under other names reach the address's limit of 6: everyone behind it
    // is refused, the second analyst with the right password included.
    for user in ["mallory", "eve", "trudy"] {
        assert_code(
            connect_as_from(bi_server, port, user, "guess").await,
            &SqlState::INVALID_PASSWORD,
            "a spray over user names",
        );
    }
    let e = assert_code(
        connect_as_from(bi_server, port, "second", PASSWORD).await,
        &SqlState::TOO_MANY_CONNECTIONS,
        "an address that sprayed user names",
    );
    assert_eq!(
        e.as_db_error().map(|d| d.message()),
        Some("too many failed authentication attempts from this address"),
        "{e:?}"
    );
    // Another address is served.
    connect_as_from([127, 0, 0, 5], port, "second", PASSWORD)
        .await
        .expect("another address logs in");
    proxy.stop().await;
}
