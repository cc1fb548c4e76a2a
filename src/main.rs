//! The `pgdp` command line: `serve`, `check` and `demo`.
#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{bail, Context};
use pgdp::backend::Backend;
use pgdp::session::Shared;

const USAGE: &str = "\
pgdp: a differentially private PostgreSQL proxy

USAGE:
    pgdp serve --policy FILE [--listen ADDR] [--upstream DSN] [--ledger DSN]
    pgdp check --policy FILE
    pgdp demo  [--upstream DSN] [--scale N] [--listen ADDR]

ENVIRONMENT:
    PGDP_LISTEN, PGDP_UPSTREAM, PGDP_LEDGER   defaults for --listen, --upstream, --ledger
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
    Ok(args)
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
    run(policy, &upstream, args.ledger.as_deref(), &listen, None).await
}

/// Starts the proxy and serves until interrupted.
async fn run(
    policy: pgdp::policy::Policy,
    upstream: &str,
    ledger: Option<&str>,
    listen: &str,
    banner: Option<String>,
) -> anyhow::Result<()> {
    let backend = Backend::new(upstream).map_err(|_| anyhow::anyhow!("invalid upstream DSN"))?;
    match backend.server_version().await {
        Ok(v) => tracing::info!(server_version = %v, "upstream reachable"),
        Err(_) => tracing::warn!("upstream unreachable at start; pgdp will serve once it is back"),
    }
    let addr: SocketAddr = listen
        .parse()
        .with_context(|| format!("invalid --listen address {listen}"))?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))?;
    let ledger_dsn = ledger.unwrap_or(upstream);
    let ledger = pgdp::budget::Ledger::connect(ledger_dsn)
        .await
        .map_err(|e| anyhow::anyhow!("cannot open the privacy ledger: {e}"))?;
    let shared = Arc::new(
        Shared::new(policy, backend, ledger)
            .await
            .map_err(|e| anyhow::anyhow!("cannot start: {e}"))?,
    );
    tracing::info!(%addr, database = %shared.policy.database, "pgdp listening");
    if let Some(b) = banner {
        println!("{b}");
    }
    tokio::select! {
        r = pgdp::wire::serve(listener, shared) => r.context("serving")?,
        _ = tokio::signal::ctrl_c() => tracing::info!("interrupted; shutting down"),
    }
    Ok(())
}

async fn demo(args: &Args) -> anyhow::Result<()> {
    let _ = args;
    let _ = run;
    bail!("demo is not wired yet")
}
