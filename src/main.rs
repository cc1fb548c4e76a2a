//! The `pgdp` command line: `serve`, `check`, `suggest`, `reload`, `demo`, and budget administration
//! (`budget`, `audit`, parsed and run by `pgdp::tools::admin`).
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context};

const USAGE: &str = "\
pgdp: a differentially private PostgreSQL proxy

USAGE:
    pgdp serve --policy FILE [--listen ADDR] [--upstream DSN] [--ledger DSN]
               [--tls-cert FILE --tls-key FILE [--require-tls]] [--pid-file FILE]
               [--replica DSN]... [--replica-lag-max-ms MS] [--metrics ADDR]
               [--lease-queries N] [--worker-threads N]
    pgdp check --policy FILE
    pgdp suggest --policy FILE [--upstream DSN] [--epsilon E]
    pgdp reload (--pid-file FILE | --pid PID) [--policy FILE]
    pgdp demo  [--upstream DSN] [--scale N] [--listen ADDR]
               [--tls-cert FILE --tls-key FILE [--require-tls]] [--metrics ADDR]
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
    --pid-file FILE                   serve: write the process id there; reload: signal that process
    --replica DSN                     a streaming replica of the upstream (repeatable): DP,
                                      public-table and shadow-catalog queries go to healthy
                                      replicas in turn, the upstream is the fallback
    --replica-lag-max-ms MS           a replica further behind than this serves nothing (5000)
    --metrics ADDR                    serve GET /metrics (Prometheus) and GET /health over HTTP
                                      on ADDR, e.g. 127.0.0.1:9187; for operators only
    --lease-queries N                 budget leases: reserve an analyst's budget for up to N
                                      queries in one durable commit and charge them in memory
                                      (64; 1 turns leases off: one durable commit per query)
    --worker-threads N                threads that run sessions (default: one per core); on a
                                      small machine shared with PostgreSQL, 1 costs less CPU
                                      per query (BENCHMARKS.md, figure 9)

SUGGEST:
    `pgdp suggest` reads DP histograms of each private table's contributions on the upstream
    (as a query that chooses its caps at epsilon E, the policy's default, would) and prints,
    for every candidate cap, the share of rows it would remove, the caps such a query would
    choose with their noise, and what clamping removes from each bounded column. Every bucket
    is noised; the report states the epsilon it spent and may be shared where the data may not.

RELOAD:
    `pgdp serve` reloads its --policy file on SIGHUP; `pgdp reload` checks the file first (with
    --policy) and sends the signal. Statements that start afterwards use the new policy; an
    invalid one is refused and the old one stays in force (the server's log says which).

Budget administration reads the analysts from --policy and the ledger from --ledger (else
PGDP_LEDGER, --upstream, PGDP_UPSTREAM); times are ISO 8601, UTC unless an offset is given.

DSNs (--upstream, --ledger) are libpq key=value strings or postgres:// URLs; add
`sslmode=verify-full sslrootcert=FILE` for TLS that checks the server's CA and host name.

ENVIRONMENT:
    PGDP_LISTEN, PGDP_UPSTREAM, PGDP_LEDGER   defaults for --listen, --upstream, --ledger
    PGDP_TLS_CERT, PGDP_TLS_KEY               defaults for --tls-cert, --tls-key
    PGDP_REQUIRE_TLS=1                        same as --require-tls
    PGDP_PID_FILE                             default for --pid-file
    PGDP_REPLICAS                             replica DSNs separated by ';' (if no --replica)
    PGDP_METRICS                              default for --metrics
    PGDP_LEASE_QUERIES                        default for --lease-queries
    PGDP_WORKER_THREADS                       default for --worker-threads
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
    pid_file: Option<PathBuf>,
    pid: Option<i32>,
    replicas: Vec<String>,
    replica_lag_max_ms: Option<u64>,
    metrics: Option<String>,
    lease_queries: Option<u64>,
    worker_threads: Option<usize>,
    epsilon: Option<f64>,
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
            Long("pid-file") => args.pid_file = Some(parser.value()?.into()),
            Long("pid") => args.pid = Some(parser.value()?.parse()?),
            Long("replica") => args.replicas.push(parser.value()?.string()?),
            Long("replica-lag-max-ms") => args.replica_lag_max_ms = Some(parser.value()?.parse()?),
            Long("metrics") => args.metrics = Some(parser.value()?.string()?),
            Long("lease-queries") => args.lease_queries = Some(parser.value()?.parse()?),
            Long("worker-threads") => args.worker_threads = Some(parser.value()?.parse()?),
            Long("epsilon") => args.epsilon = Some(parser.value()?.parse()?),
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
    if args.metrics.is_none() {
        args.metrics = std::env::var("PGDP_METRICS").ok();
    }
    if args.lease_queries.is_none() {
        if let Ok(n) = std::env::var("PGDP_LEASE_QUERIES") {
            args.lease_queries = Some(
                n.trim()
                    .parse()
                    .context("PGDP_LEASE_QUERIES must be a whole number")?,
            );
        }
    }
    if args.worker_threads.is_none() {
        if let Ok(n) = std::env::var("PGDP_WORKER_THREADS") {
            args.worker_threads = Some(
                n.trim()
                    .parse()
                    .context("PGDP_WORKER_THREADS must be a whole number")?,
            );
        }
    }
    if let Some(n) = args.worker_threads {
        let most = pgdp::limits::WORKER_THREADS_MAX;
        if n == 0 || n > most {
            bail!("--worker-threads must be between 1 and {most}, not {n}");
        }
    }
    if args.tls_cert.is_none() {
        args.tls_cert = std::env::var_os("PGDP_TLS_CERT").map(PathBuf::from);
    }
    if args.tls_key.is_none() {
        args.tls_key = std::env::var_os("PGDP_TLS_KEY").map(PathBuf::from);
    }
    if args.replicas.is_empty() {
        if let Ok(list) = std::env::var("PGDP_REPLICAS") {
            args.replicas = list
                .split(';')
                .map(str::trim)
                .filter(|d| !d.is_empty())
                .map(str::to_string)
                .collect();
        }
    }
    if args.pid_file.is_none() {
        args.pid_file = std::env::var_os("PGDP_PID_FILE").map(PathBuf::from);
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
    // Colour only for a person at a terminal: logs piped to a file or a collector stay plain
    // text (NO_COLOR, https://no-color.org, turns it off at a terminal too).
    use std::io::IsTerminal;
    let colour = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour)
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
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = args.worker_threads {
        builder.worker_threads(n);
    }
    let runtime = match builder.enable_all().build() {
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
            "suggest" => suggest(&args).await,
            "reload" => reload(&args),
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

/// `pgdp suggest`: the caps and bounds report of [`pgdp::tools::suggest`] for the policy's
/// tables on the upstream.
async fn suggest(args: &Args) -> anyhow::Result<()> {
    let policy = load_policy(args)?;
    let upstream = args
        .upstream
        .clone()
        .context("--upstream DSN (or PGDP_UPSTREAM) is required")?;
    let epsilon = args.epsilon.unwrap_or(policy.defaults.epsilon);
    if !(epsilon.is_finite() && epsilon > 0.0) {
        bail!("--epsilon must be a positive number, not {epsilon}");
    }
    let dsn = pgdp::dsn::Dsn::parse(&upstream).map_err(|e| anyhow::anyhow!("--upstream: {e}"))?;
    let client = dsn
        .connect("upstream")
        .await
        .context("cannot connect to the upstream")?;
    let mut rng = pgdp::dp::mechanism::secure_rng()?;
    let report = pgdp::tools::suggest::report(&policy, &client, epsilon, &mut rng).await?;
    print!("{}", report.text);
    Ok(())
}

async fn serve(args: &Args) -> anyhow::Result<()> {
    let policy = load_policy(args)?;
    let upstream = args
        .upstream
        .clone()
        .context("--upstream DSN (or PGDP_UPSTREAM) is required")?;
    let options = options(args)?;
    let _pid_file = match &args.pid_file {
        Some(path) => Some(PidFile::write(path)?),
        None => None,
    };
    run(policy, args.policy.clone(), &upstream, args, options, None).await
}

/// The process id, written for `pgdp reload` and removed when `serve` returns.
struct PidFile(PathBuf);

impl PidFile {
    fn write(path: &std::path::Path) -> anyhow::Result<PidFile> {
        std::fs::write(path, format!("{}\n", std::process::id()))
            .with_context(|| format!("cannot write the pid file {}", path.display()))?;
        Ok(PidFile(path.to_path_buf()))
    }
}

impl Drop for PidFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// `pgdp reload`: checks the policy file when given (an invalid one is reported here and no
/// signal is sent), then sends SIGHUP to the server named by --pid-file or --pid.
fn reload(args: &Args) -> anyhow::Result<()> {
    use rustix::process::{kill_process, Pid, Signal};
    if args.policy.is_some() {
        load_policy(args)?;
    }
    let raw = match (&args.pid, &args.pid_file) {
        (Some(pid), None) => *pid,
        (None, Some(path)) => std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the pid file {}", path.display()))?
            .trim()
            .parse()
            .with_context(|| {
                format!("the pid file {} does not hold a process id", path.display())
            })?,
        _ => bail!(
            "pgdp reload needs exactly one of --pid-file FILE (or PGDP_PID_FILE) and --pid PID"
        ),
    };
    let pid = Pid::from_raw(raw)
        .filter(|_| raw > 0)
        .with_context(|| format!("{raw} is not a process id"))?;
    kill_process(pid, Signal::HUP).with_context(|| {
        format!("cannot signal process {raw} (is pgdp serve running with this pid file?)")
    })?;
    println!("sent SIGHUP to pgdp (pid {raw}); its log says whether the new policy is in force");
    Ok(())
}

/// Loads the policy file again and puts it in force; an invalid policy is refused with its
/// path-named errors and the old one stays in force.
async fn reload_policy(running: &pgdp::server::Running, path: Option<&std::path::Path>) {
    let Some(path) = path else {
        tracing::warn!("SIGHUP: pgdp demo serves its built-in policy; there is nothing to reload");
        return;
    };
    let policy = match pgdp::policy::load(path) {
        Ok(policy) => policy,
        Err(errors) => {
            tracing::error!(
                policy = %path.display(),
                "reload refused: the policy is invalid, the old policy stays in force:\n{errors}"
            );
            return;
        }
    };
    match running.reload(policy).await {
        Ok(r) => tracing::info!(
            policy = %path.display(),
            generation = r.generation,
            analysts_added = ?r.added,
            analysts_removed = ?r.removed,
            tables_added = ?r.tables_added,
            tables_removed = ?r.tables_removed,
            "policy reloaded"
        ),
        Err(e) => tracing::error!(
            policy = %path.display(),
            "reload refused: {e}; the old policy stays in force"
        ),
    }
}

/// The server options of `args`: TLS, read replicas, metrics and budget leases.
fn options(args: &Args) -> anyhow::Result<pgdp::server::Options> {
    let most = pgdp::limits::SLICE_QUERIES_MAX;
    if let Some(n) = args.lease_queries {
        if !(1..=most).contains(&n) {
            bail!("--lease-queries must be between 1 (leases off) and {most}");
        }
    }
    let (low, high) = pgdp::limits::STANDBY_LAG_MAX_RANGE_MS;
    if let Some(ms) = args.replica_lag_max_ms {
        if !(low..=high).contains(&ms) {
            bail!("--replica-lag-max-ms must be between {low} and {high}");
        }
    }
    Ok(pgdp::server::Options {
        tls: tls_files(args)?,
        require_tls: args.require_tls,
        replicas: args.replicas.clone(),
        replica_lag_max_ms: args.replica_lag_max_ms,
        metrics: args.metrics.clone(),
        lease_queries: args.lease_queries,
        ..Default::default()
    })
}

/// Starts the proxy and serves until interrupted, reloading `policy_path` on SIGHUP.
async fn run(
    policy: pgdp::policy::Policy,
    policy_path: Option<PathBuf>,
    upstream: &str,
    args: &Args,
    options: pgdp::server::Options,
    banner: Option<String>,
) -> anyhow::Result<()> {
    let config = pgdp::server::Config {
        policy,
        upstream: upstream.to_string(),
        ledger: args.ledger.clone(),
        listen: args.listen.clone().unwrap_or_else(|| LISTEN_DEFAULT.into()),
        noise_seed: None,
    };
    let mut running = pgdp::server::start_with(config, options).await?;
    tracing::info!(addr = %running.addr, database = %running.shared().policy.database, "pgdp ready");
    if let Some(b) = banner {
        println!("{b}");
    }
    let mut hangups = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .context("cannot listen for SIGHUP")?;
    let mut terminations =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .context("cannot listen for SIGTERM")?;
    loop {
        tokio::select! {
            _ = running.stopped() => bail!("the listener stopped"),
            _ = tokio::signal::ctrl_c() => {
                tracing::info!("interrupted; shutting down");
                return_slices(&running).await;
                return Ok(());
            }
            _ = terminations.recv() => {
                tracing::info!("terminated; shutting down");
                return_slices(&running).await;
                return Ok(());
            }
            _ = hangups.recv() => reload_policy(&running, policy_path.as_deref()).await,
        }
    }
}

/// On a clean shutdown: returns the unused parts of this process's budget slices and lets the
/// ledger's journal write what it holds (a process killed instead leaves its slices spent).
async fn return_slices(running: &pgdp::server::Running) {
    let wait = std::time::Duration::from_millis(pgdp::limits::SHUTDOWN_LEDGER_WAIT_MS);
    let closed = running.shared().ledger.return_slices(wait).await;
    if closed > 0 {
        tracing::info!(
            closed,
            "returned the unused budget of this process's slices"
        );
    }
}

async fn demo(args: &Args) -> anyhow::Result<()> {
    use pgdp::tools::cluster::{dsn_with_dbname, probe, Cluster, Probe};
    let scale = args.scale.unwrap_or(1);
    let options = options(args)?;
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
    let sslmode = if options.tls.is_some() {
        "require"
    } else {
        "disable"
    };
    let banner = format!(
        "\npgdp is serving the demo (policy policies/demo.yaml) on {listen}. Connect with:\n\n    psql \"postgresql://analyst:analyst@127.0.0.1:{port}/pgdp_demo?sslmode={sslmode}\"\n\nthen try: SELECT region, COUNT(*), AVG(income) FROM demo.people GROUP BY region;\nPress Ctrl-C to stop."
    );
    run(policy, None, &upstream, args, options, Some(banner)).await
}
