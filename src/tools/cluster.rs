//! A throwaway PostgreSQL cluster, for `pgdp demo` without an upstream and for the tests.
//!
//! [`Cluster::start`] finds the server binaries (`initdb`, `pg_ctl`, `postgres`: the first `PATH`
//! directory holding all three, else the highest version under `/usr/lib/postgresql/*/bin`),
//! initialises a data directory in a fresh temporary directory, and starts a server that listens
//! only on 127.0.0.1, on a free port, with trust authentication for the superuser `postgres`. It
//! is tuned for speed, not durability (`fsync = off`, small shared buffers, no autovacuum) and
//! allows [`MAX_CONNECTIONS`] connections because tests open many. Dropping the [`Cluster`]
//! stops the server (`pg_ctl stop -m immediate`) and deletes the directory, best effort; a cluster
//! kept in a `static` is never dropped, so [`Cluster::stop_when_process_exits`] hands that job to a
//! small watcher process. [`Cluster::stop`] and [`Cluster::resume`] stop and restart the server
//! on the same port and data, for tests of an upstream that goes away.
//!
//! PostgreSQL refuses to run as root. When the effective uid is 0 (read from `/proc/self/status`,
//! else from `id -u`), every server command runs as the unprivileged user `postgres` (or `nobody`
//! if there is none) through `runuser -u USER --` (or `su` where `runuser` is missing), the
//! directory is handed to that user with `chown`, and the temporary directory is created under
//! `/tmp` so that user can reach it. The Unix socket goes into the data directory.
//!
//! Errors are [`ClusterError`], a small enum local to this tool-side module: nothing here is seen
//! by a client of the proxy, so it stays out of [`crate::Error`].

use std::io::ErrorKind;
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio_postgres::NoTls;

/// The superuser of a throwaway cluster (no password: trust authentication).
pub const SUPERUSER: &str = "postgres";

/// `max_connections` of a throwaway cluster.
pub const MAX_CONNECTIONS: u32 = 300;

/// How long [`Cluster::start`] waits for the server to accept connections.
pub const START_TIMEOUT: Duration = Duration::from_secs(60);

/// How long [`server_answers`] waits for an answer.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(3);

/// Ports tried before [`Cluster::start`] gives up (another process may grab a free port first).
const PORT_ATTEMPTS: u32 = 3;

const BINARIES: [&str; 3] = ["initdb", "pg_ctl", "postgres"];

/// Settings appended to `postgresql.conf`; the port is passed on the command line.
const SETTINGS: &str = "
# pgdp throwaway cluster: fast, not durable
listen_addresses = '127.0.0.1'
fsync = off
synchronous_commit = off
full_page_writes = off
shared_buffers = 32MB
autovacuum = off
";

/// Why a throwaway cluster could not be started.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// No directory holds `initdb`, `pg_ctl` and `postgres`.
    #[error(
        "PostgreSQL server binaries (initdb, pg_ctl, postgres) not found on PATH \
         or under /usr/lib/postgresql/*/bin"
    )]
    BinariesNotFound,
    /// Running as root, and neither `postgres` nor `nobody` exists to run the server as.
    #[error("running as root and no unprivileged user (postgres or nobody) to run PostgreSQL as")]
    NoUnprivilegedUser,
    /// A file-system or process-spawning operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A command ran and failed.
    #[error("{command} failed ({status}): {output}")]
    CommandFailed {
        /// The command, for the reader.
        command: String,
        /// Its exit status.
        status: String,
        /// Its output, or the tail of the server log.
        output: String,
    },
    /// The server started but did not accept connections in time.
    #[error("the server on port {port} did not accept connections within {waited_ms} ms; server log: {log}")]
    NotReady {
        /// The port it was told to listen on.
        port: u16,
        /// How long we waited.
        waited_ms: u64,
        /// The tail of the server log.
        log: String,
    },
}

fn io_error(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> ClusterError {
    let what = what.into();
    move |source| ClusterError::Io { what, source }
}

/// A running throwaway PostgreSQL server; see the module documentation.
#[derive(Debug)]
pub struct Cluster {
    /// The temporary directory holding everything (data directory, log); removed on drop.
    root: PathBuf,
    data_dir: PathBuf,
    bin_dir: PathBuf,
    port: u16,
    /// The user the server runs as when we are root.
    run_as: Option<String>,
}

impl Cluster {
    /// Initialises and starts a new cluster; returns once it accepts connections.
    pub async fn start() -> Result<Cluster, ClusterError> {
        let cluster = Cluster::empty().await?;
        cluster.initdb().await?;
        cluster.serve().await
    }

    /// A streaming replica (hot standby) of `primary`: a base backup taken with `pg_basebackup
    /// -R` (which writes `primary_conninfo` and `standby.signal`), started on a port of its own;
    /// returns once it accepts connections. For tests of read replicas.
    pub async fn standby_of(primary: &Cluster) -> Result<Cluster, ClusterError> {
        let cluster = Cluster::empty().await?;
        // The directory found may hold links to only the three binaries the cluster needs
        // (/usr/local/bin on some machines): pg_basebackup is beside the real initdb.
        let basebackup = std::fs::canonicalize(cluster.bin_dir.join("initdb"))
            .ok()
            .and_then(|initdb| Some(initdb.parent()?.join("pg_basebackup")))
            .filter(|path| is_executable(path))
            .unwrap_or_else(|| cluster.bin_dir.join("pg_basebackup"));
        let mut command = as_user(cluster.run_as.as_deref(), &basebackup);
        command
            .arg("-D")
            .arg(&cluster.data_dir)
            .args(["-h", "127.0.0.1", "-p", &primary.port.to_string()])
            .args(["-U", SUPERUSER, "-R", "-X", "stream", "--no-sync"])
            // An immediate checkpoint: the default spread one makes an idle cluster wait
            // for most of checkpoint_timeout.
            .args(["--checkpoint", "fast"]);
        run(&mut command).await?;
        // The copied configuration names the primary's socket directory: later lines win.
        let conf = cluster.data_dir.join("postgresql.conf");
        let mut text =
            std::fs::read_to_string(&conf).map_err(io_error("reading postgresql.conf"))?;
        text.push_str(&format!(
            "unix_socket_directories = '{}'\nhot_standby = on\n",
            cluster.data_dir.display().to_string().replace('\'', "''")
        ));
        std::fs::write(&conf, text).map_err(io_error("writing postgresql.conf"))?;
        cluster.serve().await
    }

    /// A cluster value with its own (empty) root directory, owned by the server's user.
    async fn empty() -> Result<Cluster, ClusterError> {
        let bin_dir = find_bin_dir().ok_or(ClusterError::BinariesNotFound)?;
        let run_as = if effective_uid() == Some(0) {
            Some(unprivileged_user().ok_or(ClusterError::NoUnprivilegedUser)?)
        } else {
            None
        };
        // The unprivileged user must be able to reach the directory: root's TMPDIR may not be.
        let base = if run_as.is_some() {
            PathBuf::from("/tmp")
        } else {
            std::env::temp_dir()
        };
        let root = base.join(unique_name());
        std::fs::create_dir(&root).map_err(io_error(format!("creating {}", root.display())))?;
        let cluster = Cluster {
            data_dir: root.join("data"),
            root,
            bin_dir,
            port: 0,
            run_as,
        };
        // From here on, dropping `cluster` on an error removes the directory again.
        if let Some(user) = &cluster.run_as {
            let root_text = cluster.root.display().to_string();
            run(Command::new("chown").args([user.as_str(), root_text.as_str()])).await?;
        }
        Ok(cluster)
    }

    /// Starts the server of an initialised data directory on a free port and waits until it
    /// accepts connections.
    async fn serve(self) -> Result<Cluster, ClusterError> {
        let mut cluster = self;
        let mut attempt = 1;
        loop {
            cluster.port = free_port()?;
            match cluster.start_server().await {
                Ok(()) => break,
                // Another process may have taken the port between our probe and the server's bind.
                Err(_) if attempt < PORT_ATTEMPTS => attempt += 1,
                Err(error) => return Err(error),
            }
        }
        cluster.wait_until_ready().await?;
        Ok(cluster)
    }

    /// Stops the server (`pg_ctl stop -m fast`: sessions are terminated, as when an operator
    /// restarts PostgreSQL) and keeps the data directory, so [`Cluster::resume`] can start it
    /// again. For tests of an upstream or ledger that goes away.
    pub async fn stop(&self) -> Result<(), ClusterError> {
        let mut command = self.server_command("pg_ctl");
        command.arg("stop").arg("-D").arg(&self.data_dir).args([
            "-m",
            "fast",
            "-w",
            "-t",
            &START_TIMEOUT.as_secs().to_string(),
        ]);
        run(&mut command).await
    }

    /// Starts a server stopped by [`Cluster::stop`] again, on the same port; returns once it
    /// accepts connections.
    pub async fn resume(&self) -> Result<(), ClusterError> {
        self.start_server().await?;
        self.wait_until_ready().await
    }

    /// Restarts the server with `settings` appended to its `postgresql.conf` (e.g.
    /// `shared_preload_libraries`, which takes effect only at start).
    pub async fn configure(&self, settings: &str) -> Result<(), ClusterError> {
        self.stop().await?;
        let conf = self.data_dir.join("postgresql.conf");
        let mut text =
            std::fs::read_to_string(&conf).map_err(io_error("reading postgresql.conf"))?;
        text.push_str(settings);
        text.push('\n');
        std::fs::write(&conf, text).map_err(io_error("writing postgresql.conf"))?;
        self.resume().await
    }

    /// Restarts the server with `ssl = on`, serving `certificate` (PEM chain) and `key` (PEM),
    /// which are copied into the data directory with the owner and mode PostgreSQL insists on.
    /// For tests of verified TLS to the upstream; plain connections are still accepted.
    pub async fn enable_tls(&self, certificate: &Path, key: &Path) -> Result<(), ClusterError> {
        self.stop().await?;
        for (from, name) in [(certificate, "server.crt"), (key, "server.key")] {
            let to = self.data_dir.join(name);
            std::fs::copy(from, &to).map_err(io_error(format!("copying {}", from.display())))?;
            std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o600))
                .map_err(io_error(format!("chmod {}", to.display())))?;
            if let Some(user) = &self.run_as {
                let path = to.display().to_string();
                run(Command::new("chown").args([user.as_str(), path.as_str()])).await?;
            }
        }
        let conf = self.data_dir.join("postgresql.conf");
        let mut text =
            std::fs::read_to_string(&conf).map_err(io_error("reading postgresql.conf"))?;
        text.push_str("ssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n");
        std::fs::write(&conf, text).map_err(io_error("writing postgresql.conf"))?;
        self.resume().await
    }

    /// The TCP port the server listens on (on 127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A key=value connection string for database `dbname` as the superuser.
    pub fn dsn(&self, dbname: &str) -> String {
        format!(
            "host=127.0.0.1 port={} user={SUPERUSER} dbname={}",
            self.port,
            quote_dsn_value(dbname)
        )
    }

    /// The data directory (also the Unix socket directory).
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The server's log file.
    pub fn log_path(&self) -> PathBuf {
        self.root.join("server.log")
    }

    /// Starts a small watcher process (`sh`) that stops the server and deletes the directory as
    /// soon as this process has exited, however it exits (even when killed). Use it for a
    /// cluster that is never dropped, such as one held in a `static`. The watcher runs in its own
    /// process group so that Ctrl-C does not kill it, and polls once a second.
    pub fn stop_when_process_exits(&self) -> Result<(), ClusterError> {
        const SCRIPT: &str = "while kill -0 \"$1\" 2>/dev/null; do sleep 1; done; \
                              root=\"$2\"; shift 2; \"$@\" >/dev/null 2>&1; rm -rf \"$root\"";
        let stop = self.stop_command();
        let mut command = Command::new("sh");
        command
            .arg("-c")
            .arg(SCRIPT)
            .arg("pgdp-cluster-watcher")
            .arg(std::process::id().to_string())
            .arg(&self.root)
            .arg(stop.get_program())
            .args(stop.get_args())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0);
        // The watcher must outlive us, so it is never waited for.
        command
            .spawn()
            .map(drop)
            .map_err(io_error("starting the cluster watcher"))
    }

    async fn initdb(&self) -> Result<(), ClusterError> {
        let mut command = self.server_command("initdb");
        command.arg("-D").arg(&self.data_dir).args([
            "-U",
            SUPERUSER,
            "--auth=trust",
            "--encoding=UTF8",
            "--locale=C",
            "--no-sync",
        ]);
        run(&mut command).await?;
        let conf = self.data_dir.join("postgresql.conf");
        let settings = format!(
            "{SETTINGS}max_connections = {MAX_CONNECTIONS}\nunix_socket_directories = '{}'\n",
            self.data_dir.display().to_string().replace('\'', "''")
        );
        let mut text =
            std::fs::read_to_string(&conf).map_err(io_error("reading postgresql.conf"))?;
        text.push_str(&settings);
        // Rewriting in place keeps the file's owner (the server's user).
        std::fs::write(&conf, text).map_err(io_error("writing postgresql.conf"))
    }

    async fn start_server(&self) -> Result<(), ClusterError> {
        let mut command = self.server_command("pg_ctl");
        command
            .arg("start")
            .arg("-D")
            .arg(&self.data_dir)
            .arg("-l")
            .arg(self.log_path())
            .args(["-w", "-t", &START_TIMEOUT.as_secs().to_string()])
            .arg("-o")
            .arg(format!("-p {}", self.port));
        run(&mut command).await.map_err(|error| match error {
            ClusterError::CommandFailed {
                command, status, ..
            } => ClusterError::CommandFailed {
                command,
                status,
                output: self.log_tail(),
            },
            other => other,
        })
    }

    async fn wait_until_ready(&self) -> Result<(), ClusterError> {
        let started = Instant::now();
        let dsn = self.dsn("postgres");
        while started.elapsed() < START_TIMEOUT {
            if server_answers(&dsn).await {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(ClusterError::NotReady {
            port: self.port,
            waited_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
            log: self.log_tail(),
        })
    }

    /// A command running server binary `name`, as the unprivileged user when we are root.
    fn server_command(&self, name: &str) -> Command {
        as_user(self.run_as.as_deref(), &self.bin_dir.join(name))
    }

    fn stop_command(&self) -> Command {
        let mut command = self.server_command("pg_ctl");
        command.arg("stop").arg("-D").arg(&self.data_dir).args([
            "-m",
            "immediate",
            "-w",
            "-t",
            "30",
        ]);
        command
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // Best effort and silent: a failure here must not turn into a panic during unwinding.
        if self.data_dir.join("postmaster.pid").exists() {
            let _ = self
                .stop_command()
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// What a PostgreSQL server at a DSN does when pgdp connects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
    /// It answers `SELECT 1`.
    Answers,
    /// A server answers but refuses the connection (wrong password, unknown role or database):
    /// its SQLSTATE and message.
    Refuses(String),
    /// Nothing answers within a few seconds.
    Silent,
}

/// Connects to `dsn` and runs `SELECT 1`, within a few seconds.
pub async fn probe(dsn: &str) -> Probe {
    let attempt = async {
        let (client, connection) = match tokio_postgres::connect(dsn, NoTls).await {
            Ok(c) => c,
            Err(e) => {
                return match e.as_db_error() {
                    Some(db) => Probe::Refuses(format!("{}: {}", db.code().code(), db.message())),
                    None => Probe::Silent,
                }
            }
        };
        tokio::spawn(connection);
        match client.simple_query("SELECT 1").await {
            Ok(_) => Probe::Answers,
            Err(e) => match e.as_db_error() {
                Some(db) => Probe::Refuses(format!("{}: {}", db.code().code(), db.message())),
                None => Probe::Silent,
            },
        }
    };
    tokio::time::timeout(ANSWER_TIMEOUT, attempt)
        .await
        .unwrap_or(Probe::Silent)
}

/// True if a PostgreSQL server answers `SELECT 1` at `dsn` within a few seconds.
pub async fn server_answers(dsn: &str) -> bool {
    let attempt = async {
        let (client, connection) = tokio_postgres::connect(dsn, NoTls).await.ok()?;
        // The connection task ends by itself once `client` is dropped below.
        tokio::spawn(connection);
        client.simple_query("SELECT 1").await.ok()
    };
    matches!(
        tokio::time::timeout(ANSWER_TIMEOUT, attempt).await,
        Ok(Some(_))
    )
}

/// `dsn` (key=value or `postgres://` URL form) with its database replaced by `dbname`.
///
/// A key=value string gets `dbname=…` appended (the last occurrence of a key wins, in libpq and
/// in tokio-postgres); a URL gets its path replaced.
pub fn dsn_with_dbname(dsn: &str, dbname: &str) -> String {
    let dsn = dsn.trim();
    let Some(scheme_end) = ["postgresql://", "postgres://"]
        .iter()
        .find(|scheme| dsn.starts_with(**scheme))
        .map(|scheme| scheme.len())
    else {
        let separator = if dsn.is_empty() { "" } else { " " };
        return format!("{dsn}{separator}dbname={}", quote_dsn_value(dbname));
    };
    let rest = &dsn[scheme_end..];
    let query_start = rest.find('?').unwrap_or(rest.len());
    let authority_end = rest[..query_start].find('/').unwrap_or(query_start);
    format!(
        "{}{}/{}{}",
        &dsn[..scheme_end],
        &rest[..authority_end],
        percent_encode(dbname),
        &rest[query_start..]
    )
}

/// A value for a key=value connection string, quoted when it needs to be.
pub fn quote_dsn_value(value: &str) -> String {
    let plain = !value.is_empty()
        && !value
            .chars()
            .any(|c| c.is_whitespace() || c == '\'' || c == '\\' || c == '=');
    if plain {
        value.to_string()
    } else {
        format!("'{}'", value.replace('\\', "\\\\").replace('\'', "\\'"))
    }
}

fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// Runs a prepared command to completion, turning a non-zero exit into an error with its output.
async fn run(command: &mut Command) -> Result<(), ClusterError> {
    let description = describe(command);
    command.stdin(Stdio::null());
    let output = tokio::process::Command::from(std::mem::replace(command, Command::new("true")))
        .output()
        .await
        .map_err(io_error(format!("running {description}")))?;
    if output.status.success() {
        return Ok(());
    }
    let mut text = String::from_utf8_lossy(&output.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&output.stderr));
    Err(ClusterError::CommandFailed {
        command: description,
        status: output.status.to_string(),
        output: text.trim().to_string(),
    })
}

fn describe(command: &Command) -> String {
    let mut parts = vec![command.get_program().to_string_lossy().into_owned()];
    parts.extend(
        command
            .get_args()
            .map(|arg| arg.to_string_lossy().into_owned()),
    );
    parts.join(" ")
}

/// `program` run directly, or as `user` through `runuser` (or `su` where `runuser` is missing).
fn as_user(user: Option<&str>, program: &Path) -> Command {
    let Some(user) = user else {
        return Command::new(program);
    };
    if let Some(runuser) = find_on_path("runuser") {
        let mut command = Command::new(runuser);
        command.args(["-u", user, "--"]).arg(program);
        command
    } else {
        // `su USER -c SCRIPT ARG0 ARGS…` hands the extra arguments to the shell, so nothing needs
        // quoting: `exec "$0" "$@"` runs the program with exactly the arguments given later.
        let mut command = Command::new("su");
        command
            .args(["-s", "/bin/sh", user, "-c", "exec \"$0\" \"$@\""])
            .arg(program);
        command
    }
}

/// The first `PATH` directory holding all server binaries, else the highest-versioned
/// `/usr/lib/postgresql/<version>/bin` that does.
fn find_bin_dir() -> Option<PathBuf> {
    let has_all = |dir: &Path| BINARIES.iter().all(|name| is_executable(&dir.join(name)));
    if let Some(path) = std::env::var_os("PATH") {
        if let Some(dir) = std::env::split_paths(&path).find(|dir| has_all(dir)) {
            return Some(dir);
        }
    }
    let versions: Vec<String> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
        .collect();
    versions_highest_first(versions)
        .into_iter()
        .map(|version| Path::new("/usr/lib/postgresql").join(version).join("bin"))
        .find(|dir| has_all(dir))
}

/// Directory names that look like versions ("15", "9.6"), highest first.
fn versions_highest_first(names: Vec<String>) -> Vec<String> {
    let mut versioned: Vec<(Vec<u32>, String)> = names
        .into_iter()
        .filter_map(|name| {
            let parts: Option<Vec<u32>> = name.split('.').map(|part| part.parse().ok()).collect();
            Some((parts?, name))
        })
        .collect();
    versioned.sort_by(|a, b| b.0.cmp(&a.0));
    versioned.into_iter().map(|(_, name)| name).collect()
}

fn find_on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|file| is_executable(file))
}

fn is_executable(path: &Path) -> bool {
    std::fs::metadata(path)
        .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
}

/// The effective uid, from `/proc/self/status` or else `id -u`; `None` if neither works.
fn effective_uid() -> Option<u32> {
    if let Some(uid) = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| parse_euid(&s))
    {
        return Some(uid);
    }
    let output = Command::new("id")
        .arg("-u")
        .stderr(Stdio::null())
        .output()
        .ok()?;
    String::from_utf8_lossy(&output.stdout).trim().parse().ok()
}

/// The effective uid from the text of `/proc/<pid>/status` (`Uid: real effective saved fs`).
fn parse_euid(status: &str) -> Option<u32> {
    let line = status.lines().find(|line| line.starts_with("Uid:"))?;
    line.split_whitespace().nth(2)?.parse().ok()
}

/// `postgres` if that user exists, else `nobody`, else `None`.
fn unprivileged_user() -> Option<String> {
    ["postgres", "nobody"]
        .into_iter()
        .find(|user| {
            Command::new("id")
                .arg("-u")
                .arg(user)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|status| status.success())
        })
        .map(str::to_string)
}

/// A directory name no other cluster of this or another process uses.
fn unique_name() -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("pgdp-cluster-{}-{nanos}-{n}", std::process::id())
}

/// A TCP port on 127.0.0.1 that was free a moment ago.
fn free_port() -> Result<u16, ClusterError> {
    let listener = TcpListener::bind(("127.0.0.1", 0)).map_err(io_error("finding a free port"))?;
    let port = listener
        .local_addr()
        .map_err(io_error("finding a free port"))?
        .port();
    match port {
        0 => Err(ClusterError::Io {
            what: "finding a free port".into(),
            source: std::io::Error::new(ErrorKind::AddrNotAvailable, "port 0"),
        }),
        port => Ok(port),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn euid_is_the_second_uid_field() {
        let status = "Name:\tcat\nUid:\t1000\t0\t1000\t1000\nGid:\t100\t100\t100\t100\n";
        assert_eq!(parse_euid(status), Some(0));
        assert_eq!(parse_euid("Name:\tcat\n"), None);
    }

    #[test]
    fn versions_sort_numerically() {
        let names = ["9.6", "15", "13", "README", "16"]
            .map(String::from)
            .to_vec();
        assert_eq!(versions_highest_first(names), ["16", "15", "13", "9.6"]);
    }

    #[test]
    fn dsn_values_are_quoted_when_needed() {
        assert_eq!(quote_dsn_value("pgdp_demo"), "pgdp_demo");
        assert_eq!(quote_dsn_value("my db"), "'my db'");
        assert_eq!(quote_dsn_value("it's"), "'it\\'s'");
        assert_eq!(quote_dsn_value(""), "''");
    }

    #[test]
    fn dbname_is_appended_to_key_value_dsns() {
        assert_eq!(
            dsn_with_dbname("host=127.0.0.1 user=postgres dbname=postgres", "t1"),
            "host=127.0.0.1 user=postgres dbname=postgres dbname=t1"
        );
        let config: tokio_postgres::Config = dsn_with_dbname("host=h user=u dbname=a", "b c")
            .parse()
            .expect("valid dsn");
        assert_eq!(config.get_dbname(), Some("b c"));
    }

    #[test]
    fn dbname_replaces_the_url_path() {
        let cases = [
            (
                "postgresql://u:p@h:5432/postgres",
                "postgresql://u:p@h:5432/t1",
            ),
            (
                "postgres://u@h/postgres?sslmode=disable",
                "postgres://u@h/t1?sslmode=disable",
            ),
            ("postgresql://u@h", "postgresql://u@h/t1"),
            (
                "postgresql://u@h?application_name=x",
                "postgresql://u@h/t1?application_name=x",
            ),
        ];
        for (dsn, expected) in cases {
            assert_eq!(dsn_with_dbname(dsn, "t1"), expected, "{dsn}");
        }
        assert_eq!(
            dsn_with_dbname("postgresql://h/x", "a b"),
            "postgresql://h/a%20b"
        );
        let config: tokio_postgres::Config = dsn_with_dbname("postgresql://u@h/x", "a b")
            .parse()
            .expect("valid url");
        assert_eq!(config.get_dbname(), Some("a b"));
    }

    #[test]
    fn unique_names_differ() {
        assert_ne!(unique_name(), unique_name());
    }
}
