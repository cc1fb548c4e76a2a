//! The golden EXPLAIN corpus of the session's forms: statements that pgdp answers as several
//! releases or after folding constants (time folding, set operations, calendars, scalar
//! subqueries, top-k joins), which the rewrite corpus (`golden`, analyser-level) cannot reach.
//!
//! The corpus lives in `tests/cases/*.explain` (format in `tests/cases/README.md`). Each case's
//! `EXPLAIN` is run through a real pgdp over the demo dataset (fixed secret and seed, session time
//! zone UTC), so the text is what the session itself plans: the split into releases, each
//! release's upstream SQL and mechanisms, the folded constants and the series' public domain.
//! Values that depend on the day the test runs are replaced by the case's placeholders (`fold:`
//! lines: an expression evaluated by PostgreSQL in UTC, and the placeholder its value becomes).
//! `PGDP_BLESS=1 cargo test --test integration golden_session::` rewrites the `explain:` lines of
//! every case whose kind (explained / refused) did not change; review the diff. EXPLAIN charges
//! nothing: the test checks the budget is untouched at the end.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::case_file;
use crate::harness;
use crate::support::Proxy;

/// The corpus must stay at least this large.
const CASES_MIN: usize = 12;

/// Set to `1` to rewrite the expected lines of the corpus.
const BLESS_ENV: &str = "PGDP_BLESS";

/// What a case expects.
#[derive(Debug, Clone, PartialEq)]
enum Expected {
    /// EXPLAIN's lines, with the case's placeholders.
    Explained(Vec<String>),
    /// Refused with this SQLSTATE.
    Refused(String),
}

/// One case: a statement, its placeholders and what EXPLAIN says of it.
#[derive(Debug, Clone)]
struct Case {
    line: usize,
    /// `#` lines just before the case, kept when blessing.
    comments: Vec<String>,
    name: String,
    notes: Vec<String>,
    sql: String,
    /// `(expression, placeholder)`: the expression's value today, as text, reads as the
    /// placeholder in EXPLAIN's lines.
    folds: Vec<(String, String)>,
    expected: Expected,
}

struct CaseFile {
    path: PathBuf,
    header: Vec<String>,
    cases: Vec<Case>,
}

fn corpus() -> Vec<CaseFile> {
    case_file::paths("explain")
        .iter()
        .map(|p| parse(p))
        .collect()
}

fn parse(path: &Path) -> CaseFile {
    let raw = case_file::read(path);
    let cases = raw
        .cases
        .into_iter()
        .map(|c| {
            let at = format!("{}:{}", path.display(), c.line);
            let mut case = Case {
                line: c.line,
                comments: c.comments,
                name: c.name,
                notes: c.notes,
                sql: c.sql,
                folds: Vec::new(),
                expected: Expected::Refused(String::new()),
            };
            let (mut explain, mut error): (Option<Vec<String>>, Option<String>) = (None, None);
            for (key, value) in c.fields {
                match key.as_str() {
                    "fold" => {
                        let (expression, placeholder) =
                            value.rsplit_once(" = ").unwrap_or_else(|| {
                                panic!("{at}: `fold: <expression> = <placeholder>`")
                            });
                        case.folds
                            .push((expression.to_string(), placeholder.to_string()));
                    }
                    "explain" => explain.get_or_insert_with(Vec::new).push(value),
                    "error" => error = Some(value),
                    other => panic!("{at}: unknown key `{other}`"),
                }
            }
            case.expected = match (explain, error) {
                (Some(lines), None) => Expected::Explained(lines),
                (None, Some(code)) => Expected::Refused(code),
                _ => panic!("{at}: a case needs `explain:` lines or one `error:`, not both"),
            };
            case
        })
        .collect();
    CaseFile {
        path: raw.path,
        header: raw.header,
        cases,
    }
}

fn render(file: &CaseFile) -> String {
    let mut out = String::new();
    for case in &file.cases {
        case_file::render_start(
            &mut out,
            &file.header,
            &case.comments,
            (&case.name, &case.notes, &case.sql),
        );
        for (expression, placeholder) in &case.folds {
            let _ = writeln!(out, "-- fold: {expression} = {placeholder}");
        }
        match &case.expected {
            Expected::Explained(lines) => {
                for l in lines {
                    let _ = writeln!(out, "-- explain:{}{l}", if l.is_empty() { "" } else { " " });
                }
            }
            Expected::Refused(code) => {
                let _ = writeln!(out, "-- error: {code}");
            }
        }
    }
    out
}

/// `lines` with each fold's value today (as PostgreSQL writes it in UTC with ISO dates, the
/// settings pgdp folds with) replaced by its placeholder, longest value first.
async fn with_placeholders(
    upstream: &tokio_postgres::Client,
    folds: &[(String, String)],
    lines: Vec<String>,
) -> Vec<String> {
    let mut values = Vec::new();
    for (expression, placeholder) in folds {
        let sql = format!(
            "BEGIN; SET LOCAL TimeZone = 'UTC'; SET LOCAL DateStyle = 'ISO, YMD'; SET LOCAL IntervalStyle = 'postgres'; SELECT CAST(({expression}) AS text); COMMIT"
        );
        let messages = upstream
            .simple_query(&sql)
            .await
            .unwrap_or_else(|e| panic!("fold {expression}: {e}"));
        let value = messages
            .iter()
            .find_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_string),
                _ => None,
            })
            .unwrap_or_else(|| panic!("fold {expression}: no value"));
        values.push((value, placeholder.clone()));
    }
    values.sort_by_key(|(value, _)| std::cmp::Reverse(value.len()));
    lines
        .into_iter()
        .map(|mut l| {
            for (value, placeholder) in &values {
                l = l.replace(value.as_str(), placeholder);
            }
            l
        })
        .collect()
}

#[tokio::test]
async fn session_forms_explain() {
    let bless = std::env::var(BLESS_ENV).is_ok_and(|v| v == "1");
    let files = corpus();
    let total: usize = files.iter().map(|f| f.cases.len()).sum();
    assert!(total >= CASES_MIN, "only {total} session-form cases");
    for file in files.iter().filter(|_| !bless) {
        assert_eq!(
            std::fs::read_to_string(&file.path).expect("readable"),
            render(file),
            "{} is not in canonical form (blessing would rewrite it)",
            file.path.display()
        );
    }

    let db = harness::demo_database(1).await;
    let upstream = db.client().await;
    let proxy = Proxy::start(149).await;
    let s = proxy.connect().await;
    s.simple_rows("SET TimeZone = 'UTC'")
        .await
        .expect("SET TimeZone");
    let mut failures = Vec::new();
    for mut file in files {
        let mut changed = false;
        for case in &mut file.cases {
            let at = format!("{}:{} ({})", file.path.display(), case.line, case.name);
            let actual = match s.simple_rows(&format!("EXPLAIN {}", case.sql)).await {
                Ok(rows) => {
                    let lines = rows
                        .into_iter()
                        .map(|r| r.into_iter().flatten().collect::<Vec<_>>().join(" | "))
                        .collect();
                    Expected::Explained(with_placeholders(&upstream, &case.folds, lines).await)
                }
                Err(e) => Expected::Refused(
                    e.code()
                        .map(|c| c.code().to_string())
                        .unwrap_or_else(|| format!("no SQLSTATE: {e}")),
                ),
            };
            if actual == case.expected {
                continue;
            }
            let same_kind =
                std::mem::discriminant(&actual) == std::mem::discriminant(&case.expected);
            if bless && same_kind {
                case.expected = actual;
                changed = true;
                continue;
            }
            failures.push(format!(
                "{at}:\n  expected: {:#?}\n  actual:   {actual:#?}{}",
                case.expected,
                if same_kind {
                    "\n  (PGDP_BLESS=1 updates it)"
                } else {
                    "\n  (explained/refused changed: edit the case by hand)"
                }
            ));
        }
        if changed {
            std::fs::write(&file.path, render(&file))
                .unwrap_or_else(|e| panic!("cannot bless {}: {e}", file.path.display()));
        }
    }
    let budget = s.budget().await;
    assert_eq!(
        (budget.epsilon_spent, budget.delta_spent),
        (0.0, 0.0),
        "EXPLAIN charged"
    );
    proxy.stop().await;
    assert!(
        failures.is_empty(),
        "{} failure(s):\n{}",
        failures.len(),
        failures.join("\n")
    );
}
