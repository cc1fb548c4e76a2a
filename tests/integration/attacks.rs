//! The attack corpus: known attacks on differentially private SQL systems and query-rewriting
//! anonymisers, each run against a real pgdp through the PostgreSQL protocol.
//!
//! The corpus lives in `tests/attacks/*.attack`, one file per family; the format is described in
//! `tests/attacks/README.md`. A case is a short script of steps, each an analyst's statement and
//! the outcome pgdp must produce: a refusal with a given SQLSTATE that spends nothing and leaves
//! the session usable, or an answer that is charged (or not) in the ledger, with optional checks
//! of the released values.
//!
//! One pgdp serves the whole corpus, with the demo policy whose analysts are replaced by one
//! analyst per case (`atk_000`, `atk_001`, …; same password as the demo analyst), so every case
//! starts with a full budget and an empty replay cache of its own. Charges are read through pgdp
//! (`SELECT * FROM pgdp.budget`) on a separate observer connection of the case's analyst.
//!
//! Invariants of the runner:
//! - A case never passes vacuously: every step states an outcome and the runner checks the
//!   SQLSTATE, the ledger and (after a refusal) that the session still answers.
//! - A case marked `xfail` states the correct outcome, which pgdp does not produce yet: it is
//!   reported, and the test fails as soon as the case passes, so the marker goes with the fix.

use crate::harness;

// Shared with the integration tests; this binary uses only part of it.
#[allow(dead_code)]
use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Row, SimpleQueryMessage};

use support::{Proxy, Session, DATABASE, PASSWORD};

/// The corpus must stay at least this large.
const CASES_MIN: usize = 60;

/// How long one step (or one race) may take before the case fails.
const STEP_TIMEOUT: Duration = Duration::from_secs(90);

/// Ledger amounts are printed as decimals; two amounts closer than this are equal.
const LEDGER_EPSILON_TOLERANCE: f64 = 1e-9;

/// The noise seed of the server (every run releases the same values).
const SEED: u8 = 61;

/// Prefix of the per-case analysts.
const ANALYST_PREFIX: &str = "atk_";

// ---------------------------------------------------------------------------------------------
// The corpus
// ---------------------------------------------------------------------------------------------

/// Which protocol a step is sent with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Protocol {
    /// One Query message.
    Simple,
    /// Parse / Bind / Describe / Execute / Sync (tokio-postgres `prepare_typed` + `query`).
    Extended,
    /// First simple, then extended; only for outcomes that spend nothing.
    Both,
}

/// Whether an answer is charged.
#[derive(Debug, Clone, PartialEq)]
enum Charge {
    /// ε spent grows, by exactly this much if given.
    Charged(Option<f64>),
    /// Neither ε nor δ spent changes.
    Uncharged,
}

/// What a step must produce.
#[derive(Debug, Clone, PartialEq)]
enum Outcome {
    /// An error with this SQLSTATE; nothing spent; the session still answers.
    Refuse(String),
    /// Rows (or a command tag).
    Answer(Charge),
    /// The step's SQL run at once on `connections` new connections (`{i}` replaced by 1…n);
    /// each either answers, charged `each`, or is refused with 53400; the ledger never
    /// overspends. With `exact`, the statements are distinct, so exactly as many succeed as the
    /// remaining budget allows.
    Race {
        connections: usize,
        each: f64,
        exact: bool,
    },
    /// A `login` step fails with this SQLSTATE; nothing spent.
    Fatal(String),
    /// A `login` step opens a session that answers.
    LoggedIn,
}

/// A `login` step: a new connection with these startup values. `$analyst` in `user` is the
/// case's analyst, `$password` in `password` the right password.
#[derive(Debug, Clone, PartialEq)]
struct Login {
    user: String,
    password: String,
    dbname: Option<String>,
}

impl Login {
    fn parse(text: &str) -> Result<Login, String> {
        let mut login = Login {
            user: String::new(),
            password: String::new(),
            dbname: None,
        };
        let mut has_user = false;
        for word in text.split_whitespace() {
            match word.split_once('=') {
                Some(("user", v)) => {
                    login.user = v.to_string();
                    has_user = true;
                }
                Some(("password", v)) => login.password = v.to_string(),
                Some(("dbname", v)) => login.dbname = Some(v.to_string()),
                _ => {
                    return Err(format!(
                        "`login:` takes user=, password=, dbname=; got {word}"
                    ))
                }
            }
        }
        if !has_user {
            return Err("`login:` needs user=".into());
        }
        Ok(login)
    }
}

/// A check of an answer's rows.
#[derive(Debug, Clone, PartialEq)]
enum Check {
    /// Exactly this many rows.
    Rows(usize),
    /// The first cell is this number, or has exactly this text.
    Value(String),
    /// The first cell is within this distance of the step's `truth`.
    WithinOfTruth(f64),
    /// The rows are exactly those of the previous answer that had rows.
    SameAsPrevious,
    /// The rows differ from those of the previous answer that had rows.
    DiffersFromPrevious,
    /// Some cell contains this text.
    Contains(String),
    /// No cell contains this text.
    Absent(String),
    /// The first cell is a whole number (released on a grid of at least 1).
    Integral,
    /// The first cell is a multiple of 2^k (the release grid).
    Grid(i32),
}

/// What a step must produce, and the checks of its rows.
#[derive(Debug, Clone, PartialEq)]
struct Expect {
    outcome: Outcome,
    checks: Vec<Check>,
}

/// One statement of a case.
#[derive(Debug, Clone)]
struct Step {
    line: usize,
    /// Which connection of the case sends it (1 is the first).
    session: usize,
    protocol: Option<Protocol>,
    sql: String,
    params: Vec<Option<String>>,
    /// SQL run directly on the upstream demo database; its first cell is the true value.
    truth: Option<String>,
    /// A login instead of a statement.
    login: Option<Login>,
    expect: Expect,
}

impl Step {
    /// The protocol the step is sent with: stated, else extended when there are parameters,
    /// both for outcomes that spend nothing, simple otherwise.
    fn protocol(&self) -> Protocol {
        if let Some(p) = self.protocol {
            return p;
        }
        if !self.params.is_empty() {
            return Protocol::Extended;
        }
        match self.expect.outcome {
            Outcome::Refuse(_) if !self.sql.contains(';') => Protocol::Both,
            _ => Protocol::Simple,
        }
    }
}

/// One case: an attack and the outcome pgdp must produce.
#[derive(Debug, Clone)]
struct Case {
    file: PathBuf,
    line: usize,
    name: String,
    cites: Vec<String>,
    /// The case's analyst's total ε (the demo analyst's 10 unless given).
    budget: u32,
    xfail: Option<String>,
    steps: Vec<Step>,
}

impl Case {
    fn at(&self) -> String {
        let file = self
            .file
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default();
        format!("{file}:{} ({})", self.line, self.name)
    }
}

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/attacks")
}

fn corpus() -> Vec<Case> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(corpus_dir())
        .expect("tests/attacks exists")
        .map(|e| e.expect("readable directory entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "attack"))
        .collect();
    paths.sort();
    let cases: Vec<Case> = paths.iter().flat_map(|p| parse_file(p)).collect();
    let mut names = BTreeSet::new();
    for c in &cases {
        assert!(names.insert(c.name.clone()), "{}: duplicate name", c.at());
    }
    cases
}

/// A step being read: its lines so far.
#[derive(Default)]
struct PendingStep {
    line: usize,
    session: Option<usize>,
    protocol: Option<Protocol>,
    sql: Vec<String>,
    params: Vec<Option<String>>,
    truth: Option<String>,
    login: Option<Login>,
}

fn parse_file(path: &Path) -> Vec<Case> {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let mut cases: Vec<Case> = Vec::new();
    let mut step = PendingStep::default();
    let at = |i: usize| format!("{}:{}", path.display(), i + 1);
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim_end();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some(rest) = line.strip_prefix("-- ") else {
            panic!("{}: expected `-- key: value` or `# comment`", at(i));
        };
        let (key, value) = rest
            .split_once(':')
            .unwrap_or_else(|| panic!("{}: missing `:`", at(i)));
        let value = value.strip_prefix(' ').unwrap_or(value).to_string();
        if key == "name" {
            assert!(
                step.sql.is_empty() && step.login.is_none(),
                "{}: the previous step has no `expect:`",
                at(i)
            );
            cases.push(Case {
                file: path.to_path_buf(),
                line: i + 1,
                name: value,
                cites: Vec::new(),
                budget: 10,
                xfail: None,
                steps: Vec::new(),
            });
            continue;
        }
        let case = cases
            .last_mut()
            .unwrap_or_else(|| panic!("{}: `{key}:` before `name:`", at(i)));
        match key {
            "cite" => case.cites.push(value),
            "note" => {}
            "xfail" => case.xfail = Some(value),
            "budget" => {
                case.budget = value
                    .parse()
                    .unwrap_or_else(|_| panic!("{}: budget is a whole ε", at(i)))
            }
            "session" => {
                step.session = Some(
                    value
                        .parse()
                        .unwrap_or_else(|_| panic!("{}: session is a number", at(i))),
                )
            }
            "protocol" => {
                step.protocol = Some(match value.as_str() {
                    "simple" => Protocol::Simple,
                    "extended" => Protocol::Extended,
                    "both" => Protocol::Both,
                    other => panic!("{}: unknown protocol {other}", at(i)),
                })
            }
            "sql" => {
                if step.sql.is_empty() {
                    step.line = i + 1;
                }
                step.sql.push(expand(&value));
            }
            "param" => step.params.push((value != "NULL").then_some(value)),
            "login" => {
                assert!(
                    step.login.is_none() && step.sql.is_empty(),
                    "{}: a step is a login or a statement",
                    at(i)
                );
                step.line = i + 1;
                step.login =
                    Some(Login::parse(&value).unwrap_or_else(|e| panic!("{}: {e}", at(i))));
            }
            "truth" => step.truth = Some(value),
            "expect" => {
                assert!(
                    !step.sql.is_empty() || step.login.is_some(),
                    "{}: `expect:` without `sql:` or `login:`",
                    at(i)
                );
                let expect = parse_expect(&value).unwrap_or_else(|e| panic!("{}: {e}", at(i)));
                let is_login_outcome =
                    matches!(expect.outcome, Outcome::Fatal(_) | Outcome::LoggedIn);
                assert_eq!(
                    is_login_outcome,
                    step.login.is_some(),
                    "{}: `fatal`/`logged-in` go with `login:`, and only they",
                    at(i)
                );
                let taken = std::mem::take(&mut step);
                let s = Step {
                    line: taken.line,
                    session: taken.session.unwrap_or(1),
                    protocol: taken.protocol,
                    sql: taken.sql.join("\n"),
                    params: taken.params,
                    truth: taken.truth,
                    login: taken.login,
                    expect,
                };
                let needs_truth = s
                    .expect
                    .checks
                    .iter()
                    .any(|c| matches!(c, Check::WithinOfTruth(_)));
                assert_eq!(
                    needs_truth,
                    s.truth.is_some(),
                    "{}: `within … of truth` and `truth:` go together",
                    at(i)
                );
                let spends = !matches!(
                    s.expect.outcome,
                    Outcome::Refuse(_)
                        | Outcome::Answer(Charge::Uncharged)
                        | Outcome::Fatal(_)
                        | Outcome::LoggedIn
                );
                assert!(
                    !(spends && s.protocol() == Protocol::Both),
                    "{}: `protocol: both` only for outcomes that spend nothing",
                    at(i)
                );
                case.steps.push(s);
            }
            other => panic!("{}: unknown key `{other}`", at(i)),
        }
    }
    assert!(
        step.sql.is_empty() && step.login.is_none(),
        "{}: the last step has no `expect:`",
        path.display()
    );
    for c in &cases {
        assert!(!c.cites.is_empty(), "{}: no `cite:`", c.at());
        assert!(!c.steps.is_empty(), "{}: no steps", c.at());
    }
    cases
}

/// Expands `{{repeat N|TEXT|SEP}}`: TEXT N times (with `{i}` replaced by 1…N), joined by SEP.
fn expand(sql: &str) -> String {
    let mut out = String::new();
    let mut rest = sql;
    while let Some(start) = rest.find("{{repeat ") {
        out.push_str(&rest[..start]);
        let after = &rest[start + "{{repeat ".len()..];
        let end = after.find("}}").expect("`{{repeat` closed by `}}`");
        let parts: Vec<&str> = after[..end].splitn(3, '|').collect();
        let [n, text, sep] = parts.as_slice() else {
            panic!(
                "`{{{{repeat N|TEXT|SEP}}}}` expected, got {}",
                &after[..end]
            );
        };
        let n: usize = n.trim().parse().expect("repeat count");
        let items: Vec<String> = (1..=n)
            .map(|i| text.replace("{i}", &i.to_string()))
            .collect();
        out.push_str(&items.join(sep));
        rest = &after[end + 2..];
    }
    out.push_str(rest);
    out
}

/// Parses `refuse CODE`, `answer charged [E]`, `answer uncharged`, `race N each E [exact]`,
/// followed by checks separated by commas.
fn parse_expect(text: &str) -> Result<Expect, String> {
    let mut clauses = text.split(',').map(str::trim);
    let head: Vec<&str> = clauses
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    let outcome = match head.as_slice() {
        ["refuse", code] if code.len() == 5 => Outcome::Refuse(code.to_string()),
        ["answer", "charged"] => Outcome::Answer(Charge::Charged(None)),
        ["answer", "charged", e] => Outcome::Answer(Charge::Charged(Some(
            e.parse().map_err(|_| format!("bad ε {e}"))?,
        ))),
        ["answer", "uncharged"] => Outcome::Answer(Charge::Uncharged),
        ["fatal", code] if code.len() == 5 => Outcome::Fatal(code.to_string()),
        ["logged-in"] => Outcome::LoggedIn,
        ["race", n, "each", e, rest @ ..] => Outcome::Race {
            connections: n.parse().map_err(|_| format!("bad count {n}"))?,
            each: e.parse().map_err(|_| format!("bad ε {e}"))?,
            exact: match rest {
                [] => false,
                ["exact"] => true,
                _ => return Err(format!("unknown race option {rest:?}")),
            },
        },
        other => return Err(format!("unknown outcome {other:?}")),
    };
    let mut checks = Vec::new();
    for clause in clauses {
        let words: Vec<&str> = clause.split_whitespace().collect();
        let quoted = |prefix: &str| -> Result<String, String> {
            clause
                .strip_prefix(prefix)
                .map(str::trim)
                .and_then(|q| q.strip_prefix('"'))
                .and_then(|q| q.strip_suffix('"'))
                .map(str::to_string)
                .ok_or_else(|| format!("`{prefix} \"text\"` expected"))
        };
        checks.push(match words.as_slice() {
            ["rows", n] => Check::Rows(n.parse().map_err(|_| format!("bad row count {n}"))?),
            ["value", v] => Check::Value(v.to_string()),
            ["within", t, "of", "truth"] => {
                Check::WithinOfTruth(t.parse().map_err(|_| format!("bad tolerance {t}"))?)
            }
            ["same-as-previous"] => Check::SameAsPrevious,
            ["differs-from-previous"] => Check::DiffersFromPrevious,
            ["integral"] => Check::Integral,
            ["grid", k] => Check::Grid(k.parse().map_err(|_| format!("bad grid exponent {k}"))?),
            ["contains", ..] => Check::Contains(quoted("contains")?),
            ["absent", ..] => Check::Absent(quoted("absent")?),
            _ => return Err(format!("unknown check `{clause}`")),
        });
    }
    if !matches!(outcome, Outcome::Answer(_)) && !checks.is_empty() {
        return Err("checks apply to answers only".into());
    }
    Ok(Expect { outcome, checks })
}

// ---------------------------------------------------------------------------------------------
// The server
// ---------------------------------------------------------------------------------------------

/// The demo policy with one analyst per case, `atk_NNN`, with the demo analyst's verifier.
fn policy_for(cases: &[Case]) -> pgdp::policy::Policy {
    let text = support::demo_policy_text();
    let start = text
        .find("\nanalysts:\n")
        .expect("the demo policy has analysts")
        + 1;
    let end = text[start..]
        .find("\ntables:")
        .map(|e| start + e + 1)
        .expect("the demo policy has tables after analysts");
    let verifier = text[start..end]
        .lines()
        .find_map(|l| l.trim().strip_prefix("scram_verifier: "))
        .expect("the demo analyst has a scram_verifier");
    let mut analysts = String::from("analysts:\n");
    for (i, case) in cases.iter().enumerate() {
        let _ = write!(
            analysts,
            "  {}:\n    scram_verifier: {verifier}\n    budget:\n      epsilon: {}\n      delta: 1.0e-5\n      epsilon_per_query_max: {}\n",
            analyst_name(i),
            case.budget,
            case.budget.min(2)
        );
    }
    let text = format!("{}{analysts}\n{}", &text[..start], &text[end..]);
    pgdp::policy::parse(&text).unwrap_or_else(|e| panic!("attack policy: {e:?}"))
}

fn analyst_name(index: usize) -> String {
    format!("{ANALYST_PREFIX}{index:03}")
}

// ---------------------------------------------------------------------------------------------
// Running a case
// ---------------------------------------------------------------------------------------------

type Rows = Vec<Vec<Option<String>>>;

/// ε and δ spent, as `SELECT * FROM pgdp.budget` reports them.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Spent {
    epsilon: f64,
    delta: f64,
    epsilon_total: f64,
}

async fn spent(observer: &Session) -> Result<Spent, String> {
    let messages = observer
        .simple_query("SELECT * FROM pgdp.budget")
        .await
        .map_err(|e| format!("SELECT * FROM pgdp.budget failed: {e:?}"))?;
    let row = messages
        .iter()
        .find_map(|m| match m {
            SimpleQueryMessage::Row(r) => Some(r),
            _ => None,
        })
        .ok_or("pgdp.budget returned no row")?;
    let number = |name: &str| -> Result<f64, String> {
        row.get(name)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| format!("pgdp.budget.{name} missing or not a number"))
    };
    Ok(Spent {
        epsilon: number("epsilon_spent")?,
        delta: number("delta_spent")?,
        epsilon_total: number("epsilon_total")?,
    })
}

fn text_of_simple(messages: Vec<SimpleQueryMessage>) -> Rows {
    messages
        .into_iter()
        .filter_map(|m| match m {
            SimpleQueryMessage::Row(row) => Some(
                (0..row.len())
                    .map(|i| row.get(i).map(str::to_string))
                    .collect(),
            ),
            _ => None,
        })
        .collect()
}

/// The text of a binary-format cell, for the types pgdp releases.
fn cell_text(row: &Row, i: usize) -> Option<String> {
    let ty = row.columns()[i].type_().clone();
    macro_rules! get {
        ($t:ty) => {
            row.try_get::<_, Option<$t>>(i)
                .ok()
                .flatten()
                .map(|v| v.to_string())
        };
    }
    match ty {
        Type::INT8 => get!(i64),
        Type::INT4 => get!(i32),
        Type::INT2 => get!(i16),
        Type::FLOAT8 => get!(f64),
        Type::FLOAT4 => get!(f32),
        Type::BOOL => get!(bool),
        _ => get!(String),
    }
}

fn text_of_rows(rows: Vec<Row>) -> Rows {
    rows.iter()
        .map(|r| (0..r.len()).map(|i| cell_text(r, i)).collect())
        .collect()
}

/// Runs one statement with one protocol.
async fn run_once(
    session: &Session,
    protocol: Protocol,
    sql: &str,
    params: &[Option<String>],
) -> Result<Rows, tokio_postgres::Error> {
    match protocol {
        Protocol::Simple | Protocol::Both => {
            assert!(params.is_empty(), "parameters need the extended protocol");
            Ok(text_of_simple(session.simple_query(sql).await?))
        }
        Protocol::Extended => {
            // Parameters go as text: pgdp checks them against the type it inferred.
            let statement = session
                .prepare_typed(sql, &vec![Type::TEXT; params.len()])
                .await?;
            let values: Vec<Option<&str>> = params.iter().map(|p| p.as_deref()).collect();
            let refs: Vec<&(dyn ToSql + Sync)> =
                values.iter().map(|v| v as &(dyn ToSql + Sync)).collect();
            Ok(text_of_rows(session.query(&statement, &refs).await?))
        }
    }
}

fn describe_error(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} {}", db.code().code(), db.message()),
        None => format!("{e}"),
    }
}

/// The state of a case being run.
struct CaseRun<'a> {
    proxy: &'a Proxy,
    analyst: String,
    observer: Session,
    sessions: BTreeMap<usize, Session>,
    previous: Option<Rows>,
    truth: &'a tokio_postgres::Client,
}

impl CaseRun<'_> {
    async fn session(&mut self, n: usize) -> Result<&Session, String> {
        if !self.sessions.contains_key(&n) {
            let s = self
                .proxy
                .try_connect(&self.analyst, PASSWORD, DATABASE)
                .await
                .map_err(|e| format!("cannot connect session {n}: {e}"))?;
            self.sessions.insert(n, s);
        }
        Ok(&self.sessions[&n])
    }

    async fn run_step(&mut self, step: &Step) -> Result<(), String> {
        let before = spent(&self.observer).await?;
        if let Some(login) = &step.login {
            return self.login(login, &step.expect.outcome, before).await;
        }
        match &step.expect.outcome {
            Outcome::Fatal(_) | Outcome::LoggedIn => {
                Err("`fatal`/`logged-in` outcome without `login:`".into())
            }
            Outcome::Race {
                connections,
                each,
                exact,
            } => return self.race(step, before, *connections, *each, *exact).await,
            Outcome::Refuse(code) => {
                let protocols: &[Protocol] = match step.protocol() {
                    Protocol::Both => &[Protocol::Simple, Protocol::Extended],
                    Protocol::Simple => &[Protocol::Simple],
                    Protocol::Extended => &[Protocol::Extended],
                };
                for &p in protocols {
                    let session = self.session(step.session).await?;
                    match run_once(session, p, &step.sql, &step.params).await {
                        Ok(rows) => {
                            return Err(format!("{p:?}: expected {code}, got rows {rows:?}"))
                        }
                        Err(e) => {
                            let got = e.code().map(|c| c.code().to_string());
                            if got.as_deref() != Some(code.as_str()) {
                                return Err(format!(
                                    "{p:?}: expected {code}, got {}",
                                    describe_error(&e)
                                ));
                            }
                        }
                    }
                    // The session still answers (a refusal inside a transaction block leaves
                    // it aborted until ROLLBACK, which is PostgreSQL's behaviour too).
                    if let Err(e) = session.simple_query("SELECT 1").await {
                        if e.code().map(|c| c.code()) != Some("25P02") {
                            return Err(format!(
                                "{p:?}: session unusable after the refusal: {}",
                                describe_error(&e)
                            ));
                        }
                    }
                }
                let after = spent(&self.observer).await?;
                if !same_spent(&before, &after) {
                    return Err(format!(
                        "refused, but the ledger changed: {before:?} -> {after:?}"
                    ));
                }
                Ok(())
            }
            Outcome::Answer(charge) => {
                let protocols: &[Protocol] = match step.protocol() {
                    Protocol::Both => &[Protocol::Simple, Protocol::Extended],
                    Protocol::Simple => &[Protocol::Simple],
                    Protocol::Extended => &[Protocol::Extended],
                };
                for &p in protocols {
                    let session = self.session(step.session).await?;
                    let rows = run_once(session, p, &step.sql, &step.params)
                        .await
                        .map_err(|e| {
                            format!("{p:?}: expected an answer, got {}", describe_error(&e))
                        })?;
                    let after = spent(&self.observer).await?;
                    match charge {
                        Charge::Uncharged if !same_spent(&before, &after) => {
                            return Err(format!(
                                "{p:?}: expected no charge, ledger {before:?} -> {after:?}"
                            ))
                        }
                        Charge::Charged(amount) => {
                            let grew = after.epsilon - before.epsilon;
                            let ok = match amount {
                                Some(e) => (grew - e).abs() < LEDGER_EPSILON_TOLERANCE,
                                None => grew > LEDGER_EPSILON_TOLERANCE,
                            };
                            if !ok {
                                return Err(format!(
                                    "{p:?}: expected a charge{}, ε spent {} -> {}",
                                    amount.map(|e| format!(" of {e}")).unwrap_or_default(),
                                    before.epsilon,
                                    after.epsilon
                                ));
                            }
                        }
                        Charge::Uncharged => {}
                    }
                    self.check_rows(step, &rows)
                        .await
                        .map_err(|e| format!("{p:?}: {e}"))?;
                    if !rows.is_empty() {
                        self.previous = Some(rows);
                    }
                }
                Ok(())
            }
        }
    }

    /// A `login` step: the connection fails with the expected SQLSTATE (and pgdp goes on
    /// serving the case's observer, with nothing spent), or opens and answers.
    async fn login(&self, login: &Login, outcome: &Outcome, before: Spent) -> Result<(), String> {
        let user = login.user.replace("$analyst", &self.analyst);
        let password = login.password.replace("$password", PASSWORD);
        let dbname = login.dbname.as_deref().unwrap_or(DATABASE);
        let result = self.proxy.try_connect(&user, &password, dbname).await;
        match (outcome, result) {
            (Outcome::Fatal(code), Err(e)) => {
                let got = e.code().map(|c| c.code().to_string());
                if got.as_deref() != Some(code.as_str()) {
                    return Err(format!("expected FATAL {code}, got {}", describe_error(&e)));
                }
            }
            (Outcome::Fatal(code), Ok(_)) => {
                return Err(format!("expected FATAL {code}, the login succeeded"))
            }
            (Outcome::LoggedIn, Ok(session)) => {
                session
                    .simple_query("SELECT 1")
                    .await
                    .map_err(|e| format!("logged in, then {}", describe_error(&e)))?;
            }
            (Outcome::LoggedIn, Err(e)) => {
                return Err(format!("expected a login, got {}", describe_error(&e)))
            }
            _ => return Err("a login step expects `fatal` or `logged-in`".into()),
        }
        let after = spent(&self.observer).await?;
        if !same_spent(&before, &after) {
            return Err(format!(
                "a login changed the ledger: {before:?} -> {after:?}"
            ));
        }
        Ok(())
    }

    async fn check_rows(&self, step: &Step, rows: &Rows) -> Result<(), String> {
        let first = || -> Result<&str, String> {
            rows.first()
                .and_then(|r| r.first())
                .and_then(|c| c.as_deref())
                .ok_or_else(|| format!("no first cell in {rows:?}"))
        };
        let number = |t: &str| -> Result<f64, String> {
            t.parse::<f64>()
                .map_err(|_| format!("{t:?} is not a number"))
        };
        for check in &step.expect.checks {
            match check {
                Check::Rows(n) if rows.len() != *n => {
                    return Err(format!("expected {n} row(s), got {rows:?}"))
                }
                Check::Value(v) => {
                    let got = first()?;
                    let same = match (got.parse::<f64>(), v.parse::<f64>()) {
                        (Ok(a), Ok(b)) => a == b,
                        _ => got == v,
                    };
                    if !same {
                        return Err(format!("expected first cell {v:?}, got {rows:?}"));
                    }
                }
                Check::WithinOfTruth(tolerance) => {
                    let sql = step.truth.as_deref().unwrap_or_default();
                    let truth = self
                        .truth
                        .simple_query(sql)
                        .await
                        .map_err(|e| format!("truth query failed: {}", describe_error(&e)))?;
                    let truth = text_of_simple(truth);
                    let t = truth
                        .first()
                        .and_then(|r| r.first())
                        .and_then(|c| c.as_deref())
                        .ok_or("the truth query returned no value")?;
                    let (t, v) = (number(t)?, number(first()?)?);
                    if (v - t).abs() > *tolerance {
                        return Err(format!(
                            "released {v}, true value {t}: off by more than {tolerance}"
                        ));
                    }
                }
                Check::SameAsPrevious if self.previous.as_ref() != Some(rows) => {
                    return Err(format!(
                        "expected the previous answer {:?}, got {rows:?}",
                        self.previous
                    ))
                }
                Check::DiffersFromPrevious if self.previous.as_ref() == Some(rows) => {
                    return Err(format!("expected another answer than {rows:?}"))
                }
                Check::Contains(t) if !any_cell(rows, |c| c.contains(t.as_str())) => {
                    return Err(format!("no cell contains {t:?}: {rows:?}"))
                }
                Check::Absent(t) if any_cell(rows, |c| c.contains(t.as_str())) => {
                    return Err(format!("a cell contains {t:?}: {rows:?}"))
                }
                Check::Grid(k) => {
                    let v = number(first()?)?;
                    let steps = v / 2f64.powi(*k);
                    if steps.fract() != 0.0 || !steps.is_finite() {
                        return Err(format!("{v} is not a multiple of 2^{k}"));
                    }
                }
                Check::Integral => {
                    let v = number(first()?)?;
                    if v.fract() != 0.0 || !v.is_finite() {
                        return Err(format!("{v} is not a whole number"));
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    async fn race(
        &mut self,
        step: &Step,
        before: Spent,
        connections: usize,
        each: f64,
        exact: bool,
    ) -> Result<(), String> {
        let mut sessions = Vec::new();
        for _ in 0..connections {
            sessions.push(
                self.proxy
                    .try_connect(&self.analyst, PASSWORD, DATABASE)
                    .await
                    .map_err(|e| format!("race: cannot connect: {e}"))?,
            );
        }
        let runs = sessions.iter().enumerate().map(|(i, s)| {
            let sql = step.sql.replace("{i}", &(i + 1).to_string());
            async move { s.simple_query(&sql).await }
        });
        let results = futures::future::join_all(runs).await;
        let mut answered = 0usize;
        for r in &results {
            match r {
                Ok(_) => answered += 1,
                Err(e) if e.code().map(|c| c.code()) == Some("53400") => {}
                Err(e) => return Err(format!("race: unexpected {}", describe_error(e))),
            }
        }
        let after = spent(&self.observer).await?;
        let grew = after.epsilon - before.epsilon;
        if after.epsilon > after.epsilon_total + LEDGER_EPSILON_TOLERANCE {
            return Err(format!("race overspent: {after:?}"));
        }
        let charged = grew / each;
        if (charged - charged.round()).abs() > LEDGER_EPSILON_TOLERANCE
            || charged.round() as usize > answered
        {
            return Err(format!(
                "race: {answered} answered, ε spent grew by {grew} (each {each})"
            ));
        }
        if exact {
            let remaining = before.epsilon_total - before.epsilon;
            let affordable = ((remaining + LEDGER_EPSILON_TOLERANCE) / each).floor() as usize;
            let expected = affordable.min(connections);
            if answered != expected || charged.round() as usize != expected {
                return Err(format!(
                    "race: expected {expected} answered and charged, got {answered} answered, ε spent grew by {grew}"
                ));
            }
        }
        Ok(())
    }
}

fn same_spent(a: &Spent, b: &Spent) -> bool {
    (a.epsilon - b.epsilon).abs() < LEDGER_EPSILON_TOLERANCE && a.delta == b.delta
}

fn any_cell(rows: &Rows, f: impl Fn(&str) -> bool) -> bool {
    rows.iter().flatten().flatten().any(|c| f(c))
}

async fn run_case(
    proxy: &Proxy,
    truth: &tokio_postgres::Client,
    index: usize,
    case: &Case,
) -> Result<(), String> {
    let analyst = analyst_name(index);
    let observer = proxy
        .try_connect(&analyst, PASSWORD, DATABASE)
        .await
        .map_err(|e| format!("cannot connect the observer: {e}"))?;
    let mut run = CaseRun {
        proxy,
        analyst,
        observer,
        sessions: BTreeMap::new(),
        previous: None,
        truth,
    };
    for step in &case.steps {
        tokio::time::timeout(STEP_TIMEOUT, run.run_step(step))
            .await
            .map_err(|_| format!("line {}: timed out", step.line))?
            .map_err(|e| format!("line {}: {e}", step.line))?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------------

#[test]
fn corpus_is_large_and_cited() {
    let cases = corpus();
    assert!(
        cases.len() >= CASES_MIN,
        "only {} attack cases (at least {CASES_MIN})",
        cases.len()
    );
    let files: BTreeSet<PathBuf> = cases.iter().map(|c| c.file.clone()).collect();
    assert!(files.len() >= 8, "only {} families", files.len());
    for c in &cases {
        assert!(
            c.cites.iter().all(|t| t.len() > 10),
            "{}: a citation names what the case defends against",
            c.at()
        );
    }
}

/// Every case of the corpus, through the wire. Run with `-- --nocapture` to see the expected
/// failures (`xfail`) listed on standard error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_corpus() {
    let cases = corpus();
    let only = std::env::var("PGDP_ATTACK").ok();
    let proxy = Proxy::with_policy(policy_for(&cases), SEED).await;
    let truth = harness::demo_database(1).await.client().await;
    let mut failures: Vec<String> = Vec::new();
    let mut xfailed: Vec<String> = Vec::new();
    let mut ran = 0usize;
    for (i, case) in cases.iter().enumerate() {
        if only.as_deref().is_some_and(|o| !case.name.contains(o)) {
            continue;
        }
        ran += 1;
        let result = run_case(&proxy, &truth, i, case).await;
        match (&case.xfail, result) {
            (None, Ok(())) => {}
            (None, Err(e)) => failures.push(format!("{}: {e}", case.at())),
            (Some(reason), Err(e)) => xfailed.push(format!("{}: {reason}\n    {e}", case.at())),
            (Some(reason), Ok(())) => failures.push(format!(
                "{}: marked xfail ({reason}) but passes: remove the marker",
                case.at()
            )),
        }
    }
    if !xfailed.is_empty() {
        eprintln!(
            "\n*** {} attack case(s) fail as expected (xfail: known bugs in pgdp) ***\n{}\n",
            xfailed.len(),
            xfailed.join("\n")
        );
    }
    proxy.stop().await;
    assert!(ran > 0, "no case matched PGDP_ATTACK={only:?}");
    assert!(
        failures.is_empty(),
        "{} of {ran} attack case(s) failed:\n{}\n({} xfail)",
        failures.len(),
        failures.join("\n"),
        xfailed.len()
    );
}
