//! TLS as a requirement: with `require_tls` a client that does not negotiate TLS gets
//! PostgreSQL's FATAL 28000 for a `hostssl`-only server before any authentication, and a server
//! asked to require TLS without a certificate does not start. Verified TLS upstream: against a
//! throwaway cluster with `ssl = on` and a CA and certificate made in the test, pgdp starts and
//! answers over `sslmode=verify-full` connections to the upstream, its shadow catalog and the
//! ledger, and refuses to start with a wrong CA or host name, naming the host.
//!
//! Like `auth`, these tests assert the message text too: it is PostgreSQL's, which is the point.

use pgdp::server::{self, Config, Options, StartError};
use pgdp::tools::cluster::Cluster;
use tokio_postgres::error::SqlState;

use crate::harness;
use crate::support::{
    assert_code, demo_policy, psql, Certificates, Proxy, ANALYST, DATABASE, PASSWORD,
};

async fn tls_required_proxy(certificates: &Certificates) -> Proxy {
    Proxy::with_options(
        demo_policy(),
        51,
        Options {
            tls: Some(certificates.files()),
            require_tls: true,
            ..Options::default()
        },
    )
    .await
}

#[tokio::test]
async fn required_tls_refuses_clear_text_with_postgres_hostssl_error() {
    let certificates = Certificates::make();
    let proxy = tls_required_proxy(&certificates).await;
    let expected = format!(
        "no pg_hba.conf entry for host \"127.0.0.1\", user \"{ANALYST}\", database \"{DATABASE}\", no encryption"
    );
    // tokio-postgres without TLS; the right password does not matter, nothing is authenticated.
    let e = assert_code(
        proxy
            .try_connect(ANALYST, PASSWORD, DATABASE)
            .await
            .map(drop),
        &SqlState::INVALID_AUTHORIZATION_SPECIFICATION,
        "a clear-text login",
    );
    let db = e.as_db_error().expect("a server error");
    assert_eq!(db.severity(), "FATAL");
    assert_eq!(db.message(), expected);
    // An unknown user learns nothing more: the same refusal, naming what it sent.
    let e = assert_code(
        proxy.try_connect("mallory", "x", DATABASE).await.map(drop),
        &SqlState::INVALID_AUTHORIZATION_SPECIFICATION,
        "a clear-text login of an unknown user",
    );
    assert!(
        e.as_db_error()
            .is_some_and(|d| d.message().contains("user \"mallory\"")),
        "{e:?}"
    );

    let conninfo = |sslmode: &str| {
        format!(
            "host=127.0.0.1 port={} user={ANALYST} password={PASSWORD} dbname={DATABASE} connect_timeout=10 sslmode={sslmode}",
            proxy.port()
        )
    };
    let run = psql(&conninfo("disable"), &["SELECT 1"]).await;
    assert_ne!(run.status, Some(0), "clear text was served");
    assert!(
        run.stderr.contains(&format!("FATAL:  {expected}")),
        "{}",
        run.stderr
    );
    // TLS clients are served: libpq's default (prefer) and require.
    for sslmode in ["prefer", "require"] {
        let run = psql(&conninfo(sslmode), &["\\conninfo", "SHOW pgdp.budget"]).await;
        run.assert_ok();
        assert!(run.stdout.contains("SSL connection"), "{}", run.stdout);
    }
    proxy.stop().await;
}

#[tokio::test]
async fn required_tls_without_a_certificate_does_not_start() {
    let upstream = harness::demo_database(1).await.dsn().to_string();
    let started = server::start_with(
        Config {
            policy: demo_policy(),
            upstream,
            ledger: None,
            listen: "127.0.0.1:0".into(),
            noise_seed: Some([52; 32]),
        },
        Options {
            require_tls: true,
            ..Options::default()
        },
    )
    .await;
    assert!(
        matches!(started, Err(StartError::RequireTlsWithoutCertificate)),
        "{started:?}"
    );
}

/// A throwaway cluster serving TLS with a certificate for `localhost` only (no IP address), and
/// the demo data in database `demo_tls`.
async fn tls_cluster(certificates: &Certificates) -> Cluster {
    let cluster = Cluster::start().await.expect("throwaway cluster");
    let files = certificates.files();
    cluster
        .enable_tls(&files.certificate, &files.key)
        .await
        .expect("restart the cluster with ssl = on");
    let admin = harness::connect(&cluster.dsn("postgres")).await;
    for db in ["demo_tls", "ledger_tls"] {
        admin
            .batch_execute(&format!("CREATE DATABASE {db}"))
            .await
            .expect("create database");
    }
    let demo = harness::connect(&cluster.dsn("demo_tls")).await;
    pgdp::tools::demo::load(&demo, 1, |_| {})
        .await
        .expect("load the demo data");
    cluster
}

/// A verify-full DSN for `host` (connecting to 127.0.0.1) trusting `ca`; the password is never
/// checked (trust authentication) but must never show in an error.
fn verify_full(cluster: &Cluster, host: &str, dbname: &str, ca: &std::path::Path) -> String {
    format!(
        "host={host} hostaddr=127.0.0.1 port={} user=postgres password=hunter2-secret dbname={dbname} sslmode=verify-full sslrootcert={}",
        cluster.port(),
        ca.display()
    )
}

async fn start(upstream: String, ledger: String) -> Result<server::Running, StartError> {
    server::start_with(
        Config {
            policy: demo_policy(),
            upstream,
            ledger: Some(ledger),
            listen: "127.0.0.1:0".into(),
            noise_seed: Some([53; 32]),
        },
        Options::default(),
    )
    .await
}

#[tokio::test]
async fn upstream_and_ledger_over_verified_tls() {
    let certificates = Certificates::make_for("DNS:localhost");
    let cluster = tls_cluster(&certificates).await;
    let ca = certificates.ca();

    // The right CA and host name: pgdp starts and answers a DP query (upstream and ledger) and
    // a catalog query (shadow catalog), all over TLS.
    let running = start(
        verify_full(&cluster, "localhost", "demo_tls", &ca),
        verify_full(&cluster, "localhost", "ledger_tls", &ca),
    )
    .await
    .unwrap_or_else(|e| panic!("pgdp did not start over verified TLS: {e}"));
    let dsn = format!(
        "host=127.0.0.1 port={} user={ANALYST} password={PASSWORD} dbname={DATABASE} sslmode=disable",
        running.addr.port()
    );
    let session = crate::support::Session::open(&dsn)
        .await
        .expect("analyst connects");
    session
        .simple_query("SELECT COUNT(*) FROM demo.people")
        .await
        .expect("a DP query over TLS to upstream and ledger");
    session
        .simple_query("SELECT relname FROM pg_catalog.pg_class WHERE relname = 'people'")
        .await
        .expect("a catalog query over TLS to the shadow catalog");
    let admin = harness::connect(&cluster.dsn("postgres")).await;
    let rows = admin
        .query(
            "SELECT a.datname, s.ssl FROM pg_catalog.pg_stat_ssl s \
             JOIN pg_catalog.pg_stat_activity a USING (pid) \
             WHERE a.application_name LIKE 'pgdp%'",
            &[],
        )
        .await
        .expect("pg_stat_ssl");
    let mut databases: Vec<String> = rows.iter().map(|r| r.get::<_, String>(0)).collect();
    databases.sort();
    databases.dedup();
    assert!(
        rows.iter().all(|r| r.get::<_, bool>(1)),
        "a pgdp connection without TLS: {databases:?}"
    );
    for db in ["demo_tls", "ledger_tls", "demo_tls_pgdp_catalog"] {
        assert!(
            databases.iter().any(|d| d == db),
            "no TLS connection to {db}: {databases:?}"
        );
    }
    drop(session);
    drop(running);

    // A CA that did not sign the server's certificate, for the upstream and for the ledger.
    let other = Certificates::make_for("DNS:localhost");
    for (upstream_ca, ledger_ca, which) in [
        (other.ca(), ca.clone(), "upstream"),
        (ca.clone(), other.ca(), "ledger"),
    ] {
        let e = start(
            verify_full(&cluster, "localhost", "demo_tls", &upstream_ca),
            verify_full(&cluster, "localhost", "ledger_tls", &ledger_ca),
        )
        .await
        .expect_err("started with a wrong CA");
        let message = e.to_string();
        assert!(
            matches!(&e, StartError::UpstreamTls { which: w, host, .. } if *w == which && host == "localhost"),
            "{message}"
        );
        assert!(message.contains("host localhost"), "{message}");
        assert!(!message.contains("hunter2"), "{message}");
    }

    // The right CA, but a host name the certificate does not carry (it names localhost only).
    let e = start(
        verify_full(&cluster, "127.0.0.1", "demo_tls", &ca),
        verify_full(&cluster, "localhost", "ledger_tls", &ca),
    )
    .await
    .expect_err("started with a wrong host name");
    let message = e.to_string();
    assert!(
        matches!(&e, StartError::UpstreamTls { which: "upstream", host, .. } if host == "127.0.0.1"),
        "{message}"
    );
    assert!(message.contains("not valid for name"), "{message}");
    assert!(!message.contains("hunter2"), "{message}");
}

#[tokio::test]
async fn verify_full_without_sslrootcert_does_not_start() {
    let e = start(
        "host=localhost user=postgres sslmode=verify-full".into(),
        "host=localhost user=postgres".into(),
    )
    .await
    .expect_err("started without a CA file");
    assert!(
        matches!(
            &e,
            StartError::Dsn {
                which: "upstream",
                ..
            }
        ),
        "{e}"
    );
}
