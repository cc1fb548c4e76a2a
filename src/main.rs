//! The `pgdp` command line: `serve`, `check`, `demo`, and budget administration (`budget`,
//! `audit`, parsed and run by `pgdp::tools::admin`).
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context};

const USAGE: &str = "\
pgdp: a differentially private PostgreSQL proxy

USAGE:
    pgdp serve --policy FILE [--listen ADDR] [--upstream DSN] [--ledger DSN]
               [--tls-cert FILE --tls-key FILE [--require-tls]]
    pgdp check --policy FILE
    pgdp demo  [--upstream DSN] [--scale N] [--listen ADDR]
               [--tls-cert FILE --tls-key FILE [--require-tls]]
    pgdp budget show    [ANALYST] --policy FILE [--ledger DSN]
    pgdp budget grant   ANALYST --epsilon E [--delta D] [--reason TEXT] --policy FILE [--ledger DSN]
    pgdp budget reset   ANALYST [--reason TEXT] --policy FILE [--ledger DSN]
    pgdp budget history ANALYST [--since T] [--limit N] --policy FILE [--ledger DSN]
    pgdp audit --since T [--until T] [--analyst A] --format csv|json --policy FILE [--ledger DSN]
OPTIONS:
    --tls-cert FILE, --tls-key FILE   serve TLS (PEM certificate chain and private key); without
                                      them every SSLRequest is answered 'N' (clear text only)
    --require-tls                     refuse clients that do not negotiate TLS (FATAL 28000, as
                                      PostgreSQL with hostssl-only pg_hba.conf); needs --tls-cert

Budget administration reads the analysts from --policy and the ledger from --ledger (else
PGDP_LEDGER, --upstream, PGDP_UPSTREAM); times are ISO 8601, UTC unless an offset is given.

DSNs (--upstream, --ledger) are libpq key=value strings or postgres:// URLs; add
`sslmode=verify-full sslrootcert=FILE` for TLS that checks the server's CA and host name.

ENVIRONMENT:
    PGDP_LISTEN, PGDP_UPSTREAM, PGDP_LEDGER   defaults for --listen, --upstream, --ledger
    PGDP_TLS_CERT, PGDP_TLS_KEY               defaults for --tls-cert, --tls-key
    PGDP_REQUIRE_TLS=1                        same as --require-tls
    RUST_LOG                                  log filter (default: info)
";

const LISTEN_DEFAULT: &str = "127.0.0.1:6432";

#[derive(Debug, Default)]
struct Args {
    command: String,
    policy: Option<PathBuf>,
    listen: Option<String>,
    upstream: Option<String>,
    ledger: Option<String>,
    scale: Option<u32>,
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
    require_tls: bool,
}

fn parse_args() -> anyhow::Result<Args> {
    use lexopt::prelude::*;
    let mut args = Args::default();
    let mut parser = lexopt::Parser::from_env();
    while let Some(arg) = parser.next()? {
        match arg {
            Long("policy") => args.policy = Some(parser.value()?.into()),
            Long("listen") => args.listen = Some(parser.value()?.string()?),
            Long("upstream") => args.upstream = Some(parser.value()?.string()?),
            Long("ledger") => args.ledger = Some(parser.value()?.string()?),
            Long("scale") => args.scale = Some(parser.value()?.parse()?),
            Long("tls-cert") => args.tls_cert = Some(parser.value()?.into()),
            Long("tls-key") => args.tls_key = Some(parser.value()?.into()),
            Long("require-tls") => args.require_tls = true,
            Short('h') | Long("help") => {
                print!("{USAGE}");
                std::process::exit(0);
            }
            Value(v) if args.command.is_empty() => args.command = v.string()?,
            other => return Err(other.unexpected().into()),
        }
    }
    if args.listen.is_none() {
        args.listen = std::env::var("PGDP_LISTEN").ok();
    }
    if args.upstream.is_none() {
        args.upstream = std::env::var("PGDP_UPSTREAM").ok();
    }
    if args.ledger.is_none() {
        args.ledger = std::env::var("PGDP_LEDGER").ok();
    }
    if args.tls_cert.is_none() {
        args.tls_cert = std::env::var_os("PGDP_TLS_CERT").map(PathBuf::from);
    }
    if args.tls_key.is_none() {
        args.tls_key = std::env::var_os("PGDP_TLS_KEY").map(PathBuf::from);
    }
    if !args.require_tls {
        args.require_tls = std::env::var("PGDP_REQUIRE_TLS")
            .is_ok_and(|v| matches!(v.as_str(), "1" | "true" | "on" | "yes"));
    }
    Ok(args)
}

/// The TLS files, if both are given; one without the other is an error, not clear text, and so
/// is `--require-tls` without them.
fn tls_files(args: &Args) -> anyhow::Result<Option<pgdp::server::TlsFiles>> {
    if args.require_tls && args.tls_cert.is_none() && args.tls_key.is_none() {
        bail!("--require-tls needs a certificate: --tls-cert FILE --tls-key FILE (or PGDP_TLS_CERT, PGDP_TLS_KEY)");
    }
    match (&args.tls_cert, &args.tls_key) {
        (Some(certificate), Some(key)) => Ok(Some(pgdp::server::TlsFiles {
            certificate: certificate.clone(),
            key: key.clone(),
        })),
        (None, None) => Ok(None),
        (Some(_), None) => bail!("--tls-cert needs --tls-key (or PGDP_TLS_KEY)"),
        (None, Some(_)) => bail!("--tls-key needs --tls-cert (or PGDP_TLS_CERT)"),
    }
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

fn main() -> ExitCode {
    // `budget` and `audit` have arguments of their own: pgdp::tools::admin parses them.
    let raw: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    if matches!(
        raw.first().and_then(|a| a.to_str()),
        Some("budget" | "audit")
    ) {
        return admin(raw);
    }
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("pgdp: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    init_logging();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("pgdp: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match args.command.as_str() {
            "serve" => serve(&args).await,
            "check" => check(&args),
            "demo" => demo(&args).await,
            "" => bail!("a command is required\n\n{USAGE}"),
            other => bail!("unknown command {other:?}\n\n{USAGE}"),
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pgdp: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// `pgdp budget …` and `pgdp audit …`: output on standard output, errors on standard error,
/// exit status 2 for bad input (nothing changed), 1 for other failures.
fn admin(raw: Vec<std::ffi::OsString>) -> ExitCode {
    use pgdp::tools::admin;
    let env = |name: &str| std::env::var(name).ok();
    let invocation = match admin::parse(raw, env) {
        Ok(i) => i,
        Err(e) => {
            eprintln!("pgdp: {e}");
            return ExitCode::from(e.exit_status());
        }
    };
    init_logging();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("pgdp: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(admin::run(&invocation, &admin::os_user(env))) {
        Ok(output) => {
            print!("{output}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("pgdp: {e}");
            ExitCode::from(e.exit_status())
        }
    }
}

fn load_policy(args: &Args) -> anyhow::Result<pgdp::policy::Policy> {
    let path = args.policy.as_ref().context("--policy FILE is required")?;
    pgdp::policy::load(path).map_err(|errors| anyhow::anyhow!("invalid policy:\n{errors}"))
}

fn check(args: &Args) -> anyhow::Result<()> {
    let policy = load_policy(args)?;
    print!("policy OK\n{}", policy.summary());
    Ok(())
}

async fn serve(args: &Args) -> anyhow::Result<()> {
    let policy = load_policy(args)?;
    let upstream = args
        .upstream
        .clone()
        .context("--upstream DSN (or PGDP_UPSTREAM) is required")?;
    let listen = args.listen.clone().unwrap_or_else(|| LISTEN_DEFAULT.into());
    let tls = tls_files(args)?;
    run(
        policy,
        &upstream,
        args.ledger.as_deref(),
        &listen,
        tls,
        args.require_tls,
        None,
    )
    .await
}

/// Starts the proxy and serves until interrupted.
async fn run(
    policy: pgdp::policy::Policy,
    upstream: &str,
    ledger: Option<&str>,
    listen: &str,
    tls: Option<pgdp::server::TlsFiles>,
    require_tls: bool,
    banner: Option<String>,
) -> anyhow::Result<()> {
    let config = pgdp::server::Config {
        policy,
        upstream: upstream.to_string(),
        ledger: ledger.map(str::to_string),
        listen: listen.to_string(),
        noise_seed: None,
    };
    let options = pgdp::server::Options {
        tls,
        require_tls,
        ..Default::default()
    };
    let running = pgdp::server::start_with(config, options).await?;
    tracing::info!(addr = %running.addr, database = %running.shared.policy.database, "pgdp ready");
    if let Some(b) = banner {
        println!("{b}");
    }
    tokio::select! {
        _ = running.wait() => bail!("the listener stopped"),
        _ = tokio::signal::ctrl_c() => tracing::info!("interrupted; shutting down"),
    }
    Ok(())
}

async fn demo(args: &Args) -> anyhow::Result<()> {
    use pgdp::tools::cluster::{dsn_with_dbname, probe, Cluster, Probe};
    let scale = args.scale.unwrap_or(1);
    let tls = tls_files(args)?;
    let mut admin = args
        .upstream
        .clone()
        .unwrap_or_else(|| "host=127.0.0.1 port=5432 user=postgres dbname=postgres".into());
    let mut _cluster = None;
    let found = probe(&admin).await;
    if found != Probe::Answers {
        match (&found, args.upstream.is_some()) {
            (Probe::Refuses(why), true) => {
                bail!("the PostgreSQL server at the --upstream DSN refuses the connection ({why}); check the user, password and database in the DSN")
            }
            (_, true) => bail!("no PostgreSQL server answers at the --upstream DSN"),
            (Probe::Refuses(why), false) => println!(
                "The PostgreSQL server on 127.0.0.1:5432 refuses user postgres without a password ({why}); \
                 starting a throwaway cluster from the installed binaries instead (or pass --upstream DSN)…"
            ),
            (_, false) => println!(
                "No PostgreSQL server answers on 127.0.0.1:5432; starting a throwaway cluster from the installed binaries…"
            ),
        }
        let cluster = Cluster::start()
            .await
            .context("cannot start a throwaway PostgreSQL cluster")?;
        println!(
            "Throwaway cluster on port {} (it is deleted when pgdp demo stops).",
            cluster.port()
        );
        admin = cluster.dsn("postgres");
        _cluster = Some(cluster);
    }
    let (client, connection) = tokio_postgres::connect(&admin, tokio_postgres::NoTls)
        .await
        .context("cannot connect to the upstream")?;
    tokio::spawn(connection);
    let exists = client
        .query_opt(
            "SELECT 1 FROM pg_database WHERE datname = $1",
            &[&pgdp::tools::demo::DATABASE],
        )
        .await?
        .is_some();
    if !exists {
        println!("creating database {}…", pgdp::tools::demo::DATABASE);
        client
            .batch_execute(&format!("CREATE DATABASE {}", pgdp::tools::demo::DATABASE))
            .await?;
    }
    let upstream = dsn_with_dbname(&admin, pgdp::tools::demo::DATABASE);
    let (demo_client, connection) =
        tokio_postgres::connect(&upstream, tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    // `load` reports each step, the last one with what it loaded or reused.
    pgdp::tools::demo::load(&demo_client, scale, |line| println!("{line}"))
        .await
        .context("loading the demo dataset")?;
    let policy = pgdp::policy::parse(include_str!("../policies/demo.yaml"))
        .map_err(|e| anyhow::anyhow!("the built-in demo policy is invalid:\n{e}"))?;
    let listen = args.listen.clone().unwrap_or_else(|| LISTEN_DEFAULT.into());
    let port = listen.rsplit(':').next().unwrap_or("6432").to_string();
    let sslmode = if tls.is_some() { "require" } else { "disable" };
    let banner = format!(
        "\npgdp is serving the demo (policy policies/demo.yaml) on {listen}. Connect with:\n\n    psql \"postgresql://analyst:analyst@127.0.0.1:{port}/pgdp_demo?sslmode={sslmode}\"\n\nthen try: SELECT region, COUNT(*), AVG(income) FROM demo.people GROUP BY region;\nPress Ctrl-C to stop."
    );
    run(
        policy,
        &upstream,
        args.ledger.as_deref(),
        &listen,
        tls,
        args.require_tls,
        Some(banner),
    )
    .await
}
