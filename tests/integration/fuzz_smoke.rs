//! The fuzz targets of `fuzz/` on stable Rust, for CI: each target's code (`fuzz/src/*.rs`,
//! included here with `#[path]`) runs over its seed corpus, then over a deterministic mutation
//! loop (a fixed-seed xorshift generator) for a bounded time, about 30 s for all three.
//! The real, coverage-guided fuzzers are run with cargo-fuzz on nightly (docs/fuzzing.md).
//!
//! Seeds: the golden corpus (`tests/cases/*.case`) and the attack corpus (`tests/attacks/*`) for
//! SQL and wire streams, `policies/*.yaml` for policies, and every input kept under
//! `fuzz/regressions/<target>/`. Inputs that still crash pgdp are listed in [`KNOWN_BUGS`]: the
//! main runs skip them, and each has its own `#[ignore = "bug: …"]` test (none is open now).

#[path = "../../fuzz/src/policy_yaml.rs"]
mod policy_yaml;
#[path = "../../fuzz/src/sql.rs"]
mod sql;
#[path = "../../fuzz/src/wire.rs"]
mod wire;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Time given to each target's mutation loop (after its seeds).
const SQL_MUTATION_TIME: Duration = Duration::from_secs(10);
const POLICY_MUTATION_TIME: Duration = Duration::from_secs(4);
const WIRE_MUTATION_TIME: Duration = Duration::from_secs(8);

/// Upper bounds on mutations, so that a fast machine does not run for the whole time.
const SQL_MUTATIONS_MAX: usize = 20_000;
const POLICY_MUTATIONS_MAX: usize = 5_000;
const WIRE_MUTATIONS_MAX: usize = 400;

/// How many SQL seeds are sent over the wire (each costs a login and maybe a DP query).
const WIRE_SQL_SEEDS: usize = 12;

/// Regression inputs that still crash pgdp: (target, file name under fuzz/regressions/<target>/).
/// Each has an ignored test below; remove the entry with the fix.
const KNOWN_BUGS: &[(&str, &str)] = &[];

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

// ---------------------------------------------------------------------------------------------
// Seeds and mutations
// ---------------------------------------------------------------------------------------------

/// Every `-- sql:` line of the golden and attack corpora.
fn sql_seeds() -> Vec<String> {
    let mut paths: Vec<PathBuf> = Vec::new();
    for dir in ["tests/cases", "tests/attacks"] {
        let entries = std::fs::read_dir(root().join(dir)).expect("corpus directory");
        paths.extend(
            entries
                .map(|e| e.expect("entry").path())
                .filter(|p| p.extension().is_some_and(|e| e == "case" || e == "attack")),
        );
    }
    paths.sort();
    let mut seeds = Vec::new();
    for p in paths {
        let text = std::fs::read_to_string(&p).expect("readable corpus file");
        seeds.extend(
            text.lines()
                .filter_map(|l| l.strip_prefix("-- sql: "))
                .map(str::to_string),
        );
    }
    assert!(seeds.len() > 300, "only {} SQL seeds", seeds.len());
    seeds
}

fn policy_seeds() -> Vec<String> {
    let demo = std::fs::read_to_string(root().join("policies/demo.yaml")).expect("demo policy");
    vec![
        demo.clone(),
        demo.replace("epsilon: 10", "epsilon: .nan"),
        demo.replace("upper: 250000", "upper: .inf"),
        demo.replace("lower: 0, upper: 100", "lower: 100, upper: 0"),
        demo.replace("max_rows_per_unit: 10", "max_rows_per_unit: 0"),
        demo.replace("kind: private", "kind: public"),
        demo.replace("privacy_unit: person_id", "privacy_unit: nobody"),
        String::new(),
        "database: x\n".to_string(),
    ]
}

/// Files kept under `fuzz/regressions/<target>/`, without the known bugs.
fn regressions(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = root().join("fuzz/regressions").join(target);
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut out: Vec<(String, Vec<u8>)> = entries
        .map(|e| e.expect("entry").path())
        .filter(|p| p.is_file())
        .map(|p| {
            let name = p
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            (name, std::fs::read(&p).expect("readable regression input"))
        })
        .filter(|(name, _)| !KNOWN_BUGS.iter().any(|(t, n)| *t == target && n == name))
        .collect();
    out.sort();
    out
}

/// A small fixed-seed generator (xorshift64*): the same mutations on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }
}

/// Tokens worth inserting into SQL and YAML.
const DICTIONARY: &[&str] = &[
    "SELECT ",
    " FROM ",
    " WHERE ",
    " GROUP BY ",
    " HAVING ",
    " ORDER BY ",
    " LIMIT ",
    "COUNT(*)",
    "SUM(",
    "AVG(",
    "COUNT(DISTINCT person_id)",
    " JOIN demo.visits v ON ",
    "person_id",
    "income",
    "cost",
    "age",
    "demo.people",
    "demo.visits",
    "demo.regions",
    "pg_catalog.pg_class",
    "'",
    "''",
    "\\'",
    "$$",
    "$a$",
    "E'",
    "U&'",
    "\"",
    "(",
    ")",
    ",",
    ";",
    "--",
    "/*",
    "*/",
    " AND ",
    " OR ",
    " NOT ",
    " IS NULL",
    "NULL",
    "CASE WHEN ",
    " THEN ",
    " ELSE ",
    " END",
    "CAST(",
    " AS ",
    "numeric",
    "float8",
    "integer",
    "text",
    "date",
    "::",
    "$1",
    "$2",
    "1e308",
    "-1e308",
    "'NaN'",
    "'Infinity'",
    "1e-400",
    "0",
    "-0",
    "9223372036854775807",
    "0.5",
    "/",
    "*",
    "-",
    "+",
    "||",
    "%",
    "^",
    "~",
    " LIKE ",
    " ILIKE ",
    " BETWEEN ",
    " IN (",
    "round(",
    "abs(",
    "coalesce(",
    "nullif(",
    "greatest(",
    "least(",
    "lower(",
    "date_trunc('day', ",
    "EXTRACT(",
    "EXPLAIN ",
    "SET pgdp.epsilon = ",
    "SHOW ",
    "BEGIN",
    "ROLLBACK",
    "ctid",
    "__dp_",
    " OVER ()",
    "\u{0}",
    "\u{feff}",
    "é",
    ": ",
    "\n  ",
    "- ",
    "{ ",
    " }",
    "[",
    "]",
    ".nan",
    ".inf",
    "~",
    "&a",
    "*a",
    "!!str ",
    "<<: ",
];

/// Values that break naive numeric handling, for replacing a number.
const NUMBERS: &[&str] = &[
    "0",
    "-1",
    "1e308",
    "1e-320",
    "NaN",
    "Infinity",
    "-Infinity",
    "18446744073709551616",
    "99999999999999999999999",
    "0.0000000001",
    "-0",
    "2147483648",
];

fn mutate(rng: &mut Rng, input: &[u8], seeds: &[Vec<u8>]) -> Vec<u8> {
    let mut out = input.to_vec();
    for _ in 0..=rng.below(3) {
        let len = out.len();
        match rng.below(7) {
            0 if len > 0 => {
                let i = rng.below(len);
                out[i] ^= 1 << rng.below(8);
            }
            1 => {
                let token = DICTIONARY[rng.below(DICTIONARY.len())].as_bytes();
                let at = rng.below(len + 1);
                out.splice(at..at, token.iter().copied());
            }
            2 if len > 0 => {
                let a = rng.below(len);
                let b = (a + 1 + rng.below(16)).min(len);
                out.drain(a..b);
            }
            3 if len > 0 => {
                let a = rng.below(len);
                let b = (a + 1 + rng.below(32)).min(len);
                let piece = out[a..b].to_vec();
                let at = rng.below(len + 1);
                out.splice(at..at, piece);
            }
            4 if !seeds.is_empty() => {
                let other = &seeds[rng.below(seeds.len())];
                let cut = rng.below(len + 1);
                let from = rng.below(other.len() + 1);
                out.truncate(cut);
                out.extend_from_slice(&other[from..]);
            }
            5 => {
                // Replace the first run of digits after a random point with an odd number.
                let start = rng.below(len + 1);
                if let Some(a) = out[start..].iter().position(u8::is_ascii_digit) {
                    let a = start + a;
                    let b = out[a..]
                        .iter()
                        .position(|c| !c.is_ascii_digit() && *c != b'.')
                        .map_or(out.len(), |e| a + e);
                    let n = NUMBERS[rng.below(NUMBERS.len())].as_bytes();
                    out.splice(a..b, n.iter().copied());
                }
            }
            _ => {
                let at = rng.below(len + 1);
                out.insert(at, rng.next() as u8);
            }
        }
    }
    out
}

/// Runs `check` over the seeds, then over mutations until the time or the count runs out.
/// Returns how many inputs ran.
fn fuzz_loop(
    seeds: &[Vec<u8>],
    time: Duration,
    mutations_max: usize,
    seed: u64,
    mut check: impl FnMut(&[u8]),
) -> usize {
    for s in seeds {
        check(s);
    }
    let mut rng = Rng(seed);
    let deadline = Instant::now() + time;
    let mut n = 0;
    while n < mutations_max && Instant::now() < deadline {
        let base = &seeds[rng.below(seeds.len())];
        let input = mutate(&mut rng, base, seeds);
        check(&input);
        n += 1;
    }
    seeds.len() + n
}

// ---------------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------------

#[test]
fn sql_target_survives_seeds_and_mutations() {
    let mut seeds: Vec<Vec<u8>> = sql_seeds().into_iter().map(String::into_bytes).collect();
    seeds.extend(regressions("sql").into_iter().map(|(_, d)| d));
    let ran = fuzz_loop(
        &seeds,
        SQL_MUTATION_TIME,
        SQL_MUTATIONS_MAX,
        0x5eed_0001,
        sql::run,
    );
    assert!(ran > seeds.len(), "no mutation ran");
}

#[test]
fn policy_target_survives_seeds_and_mutations() {
    let mut seeds: Vec<Vec<u8>> = policy_seeds().into_iter().map(String::into_bytes).collect();
    seeds.extend(regressions("policy_yaml").into_iter().map(|(_, d)| d));
    // The demo policy is accepted: the target's checks of an accepted policy do run.
    assert!(pgdp::policy::parse(&String::from_utf8_lossy(&seeds[0])).is_ok());
    let ran = fuzz_loop(
        &seeds,
        POLICY_MUTATION_TIME,
        POLICY_MUTATIONS_MAX,
        0x5eed_0002,
        policy_yaml::run,
    );
    assert!(ran > seeds.len(), "no mutation ran");
}

/// Panics on the threads of the runtimes the wire tests run pgdp on ([`on_wire_runtime`]), since
/// the hook was set. Other tests share this process, so panics elsewhere are not counted.
static PANICS: AtomicUsize = AtomicUsize::new(0);

/// The name of the worker threads that run the wire tests and the pgdp they start.
const WIRE_THREAD: &str = "pgdp-wire-fuzz";

fn count_panics() {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if std::thread::current().name() == Some(WIRE_THREAD) {
                PANICS.fetch_add(1, Ordering::SeqCst);
            }
            default(info);
        }));
    });
}

/// Runs a wire test on a runtime of its own, whose two worker threads (which also run the pgdp it
/// starts and its connection tasks) are named [`WIRE_THREAD`].
fn on_wire_runtime<F: std::future::Future<Output = ()> + Send + 'static>(test: F) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name(WIRE_THREAD)
        .enable_all()
        .build()
        .expect("a runtime for the wire test");
    // Spawned, so the test body itself runs on a named worker thread too.
    runtime
        .block_on(runtime.spawn(test))
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
}

#[test]
fn wire_target_survives_seeds_and_mutations() {
    on_wire_runtime(async {
        count_panics();
        let target = wire::start().await;
        let addr = target.addr;
        let sqls = sql_seeds();
        // A spread of the SQL seeds: every k-th one.
        let step = (sqls.len() / WIRE_SQL_SEEDS).max(1);
        let chosen: Vec<String> = sqls.iter().step_by(step).cloned().collect();
        let mut seeds = wire::seeds(&chosen);
        seeds.extend(regressions("wire").into_iter().map(|(_, d)| d));
        let mut failures = Vec::new();
        for s in &seeds {
            assert!(
                wire::known_bug(s).is_none(),
                "a seed hits a known bug: {s:?}"
            );
            if let Err(e) = wire::exchange(addr, s).await {
                failures.push(format!("seed {s:?}: {e}"));
            }
        }
        let mut rng = Rng(0x5eed_0003);
        let deadline = Instant::now() + WIRE_MUTATION_TIME;
        let mut n = 0;
        while n < WIRE_MUTATIONS_MAX && Instant::now() < deadline {
            let base = &seeds[rng.below(seeds.len())];
            let input = mutate(&mut rng, base, &seeds);
            if let Err(e) = wire::exchange(addr, &input).await {
                failures.push(format!("input {input:?}: {e}"));
            }
            n += 1;
        }
        let alive = wire::alive(addr).await;
        let panics = PANICS.load(Ordering::SeqCst);
        target.stop().await;
        assert!(n > 0, "no mutation ran");
        assert!(failures.is_empty(), "{}", failures.join("\n"));
        alive.unwrap_or_else(|e| panic!("after {n} mutations: {e}"));
        assert_eq!(panics, 0, "pgdp panicked (see the panic messages above)");
    });
}

/// Sends the input of a fixed bug: pgdp must keep every wire invariant.
async fn wire_fixed_regression(name: &str) {
    let data = std::fs::read(root().join("fuzz/regressions/wire").join(name)).expect("input");
    send_regression(name, &data).await;
}

async fn send_regression(name: &str, data: &[u8]) {
    count_panics();
    let target = wire::start().await;
    let result = wire::exchange_unfiltered(target.addr, data).await;
    let alive = wire::alive(target.addr).await;
    let panics = PANICS.load(Ordering::SeqCst);
    target.stop().await;
    result.unwrap_or_else(|e| panic!("{name}: {e}"));
    alive.unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(panics, 0, "{name}: pgdp panicked");
}

/// A `p` message of 8 bytes ("junk") after a valid StartupMessage, before authentication:
/// pgwire 0.42 reads "junk" as the mechanism name and then a length past the end of the
/// message, and panicked (`split_to out of bounds`) in the connection task. Anyone who could reach
/// the port could trigger it. Fixed: pgdp's `Framing` checks the SASLInitialResponse's layout
/// before pgwire decodes it and answers FATAL 08P01 (the wire target checks the code).
#[test]
fn sasl_initial_response_without_length_does_not_panic() {
    on_wire_runtime(async {
        wire_fixed_regression("bug-sasl-initial-response-without-length").await;
    });
}

/// A Parse message whose payload has bytes after its fields: pgwire 0.42 read those bytes as
/// the next message (a Query embedded in a Parse ran), so client and server disagreed on the
/// framing; here the embedded bytes declare a 128 MiB Bind and the connection hung. Fixed:
/// pgdp's `Framing` checks that every message's fields exactly fill it and answers FATAL 08P01
/// otherwise, before pgwire decodes anything (the wire target checks the code, and that nothing
/// after the message runs).
#[test]
fn parse_trailing_bytes_are_not_read_as_a_message() {
    on_wire_runtime(async {
        wire_fixed_regression("bug-parse-trailing-bytes-read-as-next-message").await;
    });
}

/// Execute with a negative row limit: pgwire 0.42's `Portal::fetch` calls
/// `Vec::with_capacity(max_rows as usize)`, which panicked (`capacity overflow`) and ended the
/// connection. Fixed: pgdp's `on_execute` treats a limit <= 0 as "all rows" before pgwire sees it.
#[test]
fn execute_negative_max_rows_does_not_panic() {
    on_wire_runtime(async {
        wire_fixed_regression("bug-execute-max-rows-negative-panics").await;
    });
}

/// Execute with max_rows = 2^31 - 1 after Parse/Bind of `SELECT 1`: pgwire 0.42 preallocates
/// that many rows (about 80 GB), the allocation fails, and **the whole pgdp process aborts**
/// ("memory allocation of 85899345880 bytes failed"): any authenticated analyst could stop pgdp
/// for everyone with one message (tokio-postgres: `Transaction::bind` then
/// `query_portal(&portal, i32::MAX)`). Fixed: pgdp caps the limit at
/// `limits::ROWS_PER_EXECUTE_MAX` before pgwire sees it.
#[test]
fn execute_huge_max_rows_does_not_abort_the_server() {
    on_wire_runtime(async {
        wire_fixed_regression("bug-execute-max-rows-huge-aborts-the-server").await;
    });
}
