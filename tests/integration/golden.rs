//! The golden rewrite corpus: analyst SQL on the demo schema → the upstream SQL pgdp sends and
//! the release plan it charges for, or the SQLSTATE it refuses with.
//!
//! The corpus lives in `tests/cases/*.case`; the format is described in `tests/cases/README.md`.
//! Each case is classified, analysed against `policies/demo.yaml` (search_path `demo`),
//! rewritten with the fixed secret [`SECRET`] and the case's parameters, and given mechanisms at
//! ε = 1, δ = 1e-7, Laplace. `PGDP_BLESS=1 cargo test --test integration golden::` rewrites the
//! expected parts of every case whose outcome kind (accepted / refused) is unchanged, the way
//! `expect-test` does; review the diff. It never turns an intended refusal into an acceptance (or back), and it
//! leaves cases marked `expect_bug` alone.
//!
//! Besides comparing, every accepted case is checked for invariants that hold whatever the
//! expected text says: the SQL round-trips through sqlparser, names only canonical
//! `"__dp_tN"."column"` references (or a generated column of a CTE or derived table pgdp named,
//! `__dp_out.__dp_o0`), policy tables, `__dp_` identifiers and whitelisted
//! functions, and every measure has a finite positive sensitivity. Then the same SQL runs on the
//! demo dataset in a real PostgreSQL ([`golden_sql_runs_on_postgres`]).
//!
//! Cases marked `expect_bug` are strict expected failures: the case states the correct outcome,
//! and the test fails if the code now produces it (so the marker gets removed with the fix).
//! The tests marked `#[ignore = "bug: …"]` at the bottom reproduce bugs that need a database.

use crate::case_file;
use crate::harness;

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

use pgdp::dp::analyze::{self, Context, Plan, PublicKeys};
use pgdp::dp::mechanism::MechanismKind;
use pgdp::dp::release::{self, Budget, Mechanisms};
use pgdp::dp::rewrite::{self, Rewrite};
use pgdp::policy::{self, Mechanism, Policy};
use pgdp::session::classify::{self, Statement};
use pgdp::upstream::{ColumnFact, ColumnFacts, Upstream};
use sqlparser::ast::{self, Expr};
use sqlparser::dialect::PostgreSqlDialect;
use sqlparser::parser::Parser;

/// The secret keying the groups-per-unit choice; fixed so the expected SQL is stable.
const SECRET: &str = "golden-secret";

/// The budget every case is given mechanisms for.
const BUDGET: Budget = Budget {
    epsilon: 1.0,
    delta: 1e-7,
    mechanism: Mechanism::Laplace,
};

/// Set to `1` to rewrite the expected parts of the corpus.
const BLESS_ENV: &str = "PGDP_BLESS";

/// The corpus must stay at least this large.
const CASES_MIN: usize = 70;

// ---------------------------------------------------------------------------------------------
// The corpus
// ---------------------------------------------------------------------------------------------

/// What a case expects.
#[derive(Debug, Clone, PartialEq)]
enum Expected {
    /// Accepted: the upstream SQL and the release description (one line each).
    Accepted { sql: String, release: Vec<String> },
    /// Refused with this SQLSTATE.
    Refused { code: String },
}

/// One case of the corpus.
#[derive(Debug, Clone)]
struct Case {
    file: PathBuf,
    line: usize,
    /// `#` lines just before the case, kept when blessing.
    comments: Vec<String>,
    name: String,
    notes: Vec<String>,
    sql: String,
    params: Vec<Option<String>>,
    /// `gaussian` when the case is released with Gaussian noise (`-- mechanism: gaussian`);
    /// `None` for the default [`BUDGET`] (Laplace).
    mechanism: Option<String>,
    /// The case states the correct outcome, which the code does not produce yet.
    expect_bug: Option<String>,
    expected: Expected,
}

impl Case {
    fn at(&self) -> String {
        format!("{}:{} ({})", self.file.display(), self.line, self.name)
    }
}

/// A parsed case file: its header (comment lines before the first case) and its cases.
struct CaseFile {
    path: PathBuf,
    header: Vec<String>,
    cases: Vec<Case>,
}

fn parse_case_file(path: &Path) -> CaseFile {
    let raw = case_file::read(path);
    let cases = raw
        .cases
        .into_iter()
        .map(|c| {
            let mut case = Case {
                file: path.to_path_buf(),
                line: c.line,
                comments: c.comments,
                name: c.name,
                notes: c.notes,
                sql: c.sql,
                params: Vec::new(),
                mechanism: None,
                expect_bug: None,
                expected: Expected::Refused {
                    code: String::new(),
                },
            };
            let (mut expect, mut release, mut error) = (None, Vec::new(), None);
            for (key, value) in c.fields {
                match key.as_str() {
                    "param" => case.params.push((value != "NULL").then_some(value)),
                    "mechanism" => case.mechanism = Some(value),
                    "expect_bug" => case.expect_bug = Some(value),
                    "expect" => expect = Some(value),
                    "release" => release.push(value),
                    "error" => error = Some(value),
                    other => panic!("{}: unknown key `{other}`", case.at()),
                }
            }
            case.expected = match (expect, error) {
                (Some(sql), None) => Expected::Accepted { sql, release },
                (None, Some(code)) if release.is_empty() => Expected::Refused { code },
                _ => panic!(
                    "{}: a case needs exactly one of `expect:` (with `release:` lines) or `error:`",
                    case.at()
                ),
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

fn render_case_file(file: &CaseFile) -> String {
    let mut out = String::new();
    for case in &file.cases {
        case_file::render_start(
            &mut out,
            &file.header,
            &case.comments,
            (&case.name, &case.notes, &case.sql),
        );
        for p in &case.params {
            let _ = writeln!(out, "-- param: {}", p.as_deref().unwrap_or("NULL"));
        }
        if let Some(m) = &case.mechanism {
            let _ = writeln!(out, "-- mechanism: {m}");
        }
        if let Some(b) = &case.expect_bug {
            let _ = writeln!(out, "-- expect_bug: {b}");
        }
        match &case.expected {
            Expected::Accepted { sql, release } => {
                let _ = writeln!(
                    out,
                    "-- expect:{}{sql}",
                    if sql.is_empty() { "" } else { " " }
                );
                for r in release {
                    let _ = writeln!(out, "-- release: {r}");
                }
            }
            Expected::Refused { code } => {
                let _ = writeln!(out, "-- error: {code}");
            }
        }
    }
    out
}

fn corpus() -> Vec<CaseFile> {
    case_file::paths("case")
        .iter()
        .map(|p| parse_case_file(p))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Running a case
// ---------------------------------------------------------------------------------------------

fn demo_policy() -> Policy {
    policy::parse(include_str!("../../policies/demo.yaml"))
        .unwrap_or_else(|e| panic!("the demo policy is valid: {e}"))
}

/// Everything pgdp decides before the upstream is touched.
struct Compiled {
    plan: Plan,
    rewrite: Rewrite,
    mechanisms: Mechanisms,
}

fn compile(policy: &Policy, sql: &str, params: &[Option<String>]) -> Result<Compiled, pgdp::Error> {
    compile_with(policy, sql, params, BUDGET)
}

/// Every accepted corpus case (not marked `expect_bug`) with its compilation.
fn accepted_cases(policy: &Policy) -> Vec<(Case, Compiled)> {
    corpus()
        .into_iter()
        .flat_map(|f| f.cases)
        .filter(|case| case.expect_bug.is_none())
        .filter_map(|case| {
            let c = compile(policy, &case.sql, &case.params).ok()?;
            Some((case, c))
        })
        .collect()
}

/// The budget of a case: [`BUDGET`], with Gaussian noise when the case says so.
fn case_budget(case: &Case) -> Budget {
    match case.mechanism.as_deref() {
        None => BUDGET,
        Some("gaussian") => Budget {
            mechanism: Mechanism::Gaussian,
            ..BUDGET
        },
        Some(other) => panic!("{}: unknown mechanism {other:?}", case.at()),
    }
}

fn compile_with(
    policy: &Policy,
    sql: &str,
    params: &[Option<String>],
    budget: Budget,
) -> Result<Compiled, pgdp::Error> {
    let statements = classify::classify(sql)?;
    let query = match statements.as_slice() {
        [Statement::Query(q)] => q,
        other => panic!("a case must be one query, got {other:?}"),
    };
    let ctx = Context {
        policy,
        search_path: vec!["demo".to_string()],
    };
    let plan = analyze::analyze(query, &ctx)?;
    let rewrite = rewrite::rewrite(&plan, params, SECRET)?;
    let mechanisms = release::mechanisms(&plan, &rewrite, budget)?;
    Ok(Compiled {
        plan,
        rewrite,
        mechanisms,
    })
}

/// The release description of an accepted case: one line per fact, stable across runs.
fn describe(c: &Compiled) -> Vec<String> {
    let (plan, rw, m) = (&c.plan, &c.rewrite, &c.mechanisms);
    // ρ is shown only where there is some (Gaussian cases), so Laplace lines stay as they were.
    let rho = if m.cost.rho.is_zero() {
        String::new()
    } else {
        format!(" rho={}", m.cost.rho)
    };
    let mut lines = vec![format!(
        "cost epsilon={} delta={}{rho}; {} group(s) x {} row(s) per unit",
        m.cost.epsilon,
        m.cost.delta,
        plan.max_groups_per_unit(),
        plan.max_rows_per_unit()
    )];
    for (j, measure) in rw.measures.iter().enumerate() {
        let noise = &m.noises[j];
        let grid = match noise.grid_exponent() {
            Some(k) => format!(", grid 2^{k}"),
            None => String::new(),
        };
        lines.push(format!(
            "m{j} {}: sensitivity {}, {:?} scale {:.6}{grid}",
            measure.label(&rw.arguments),
            m.sensitivities[j],
            noise.kind(),
            noise.scale()
        ));
    }
    let aggregates: Vec<String> = plan
        .aggregates()
        .iter()
        .zip(&rw.aggregate_measures)
        .map(|(a, ms)| {
            let ms: Vec<String> = ms.iter().map(|j| format!("m{j}")).collect();
            format!("{} <- {}", a.text, ms.join(" "))
        })
        .collect();
    if aggregates.is_empty() {
        lines.push("aggregates: none (keys alone)".to_string());
    } else {
        lines.push(format!("aggregates: {}", aggregates.join("; ")));
    }
    let outputs: Vec<String> = plan
        .outputs()
        .iter()
        .map(|o| match o.source {
            analyze::OutputSource::Key(i) => format!("{}=key{i}", o.name),
            analyze::OutputSource::Aggregate(i) => format!("{}=agg{i}", o.name),
            analyze::OutputSource::Computed(i) => format!("{}=post{i}", o.name),
            analyze::OutputSource::Grouping(ref keys) => format!("{}=grouping{keys:?}", o.name),
        })
        .collect();
    lines.push(format!("outputs: {}", outputs.join(", ")));
    if let Some(post) = plan.post() {
        lines.push(format!("post-processing by PostgreSQL: {}", post.sql()));
    }
    for (i, k) in plan.keys().iter().enumerate() {
        let domain = match &k.public {
            PublicKeys::No => "selected".to_string(),
            PublicKeys::Listed { values, exhaustive } => format!(
                "public list of {}{}",
                values.len(),
                if *exhaustive { ", exhaustive" } else { "" }
            ),
            PublicKeys::Table { table, column, .. } => format!("public table {table}.{column}"),
        };
        lines.push(format!("key{i} {} ({:?}): {domain}", k.expr, k.ty));
    }
    // With grouping sets, each set's own release (the lines above are the first set's), or,
    // when the sets are derived from the finest, which set is released.
    let derived = pgdp::dp::release::derived_grouping_set(plan, rw);
    for (s, (set, sm)) in plan
        .grouping_sets()
        .unwrap_or_default()
        .iter()
        .zip(&m.sets)
        .enumerate()
    {
        let scales: Vec<String> = sm
            .noises
            .iter()
            .zip(&sm.sensitivities)
            .map(|(n, d)| format!("{d}/{:.6}", n.scale()))
            .collect();
        if let Some(f) = derived.filter(|&f| f != s) {
            lines.push(format!("set{s} keys {set:?}: sums of the cells of set{f}"));
            continue;
        }
        let selection = match &sm.selection {
            Some(sel) => format!(
                "selection threshold {} delta {}",
                sel.threshold(),
                sel.delta()
            ),
            None => "public".to_string(),
        };
        lines.push(format!(
            "set{s} keys {set:?}: cost epsilon={} delta={}; sensitivity/scale {}; {selection}",
            sm.cost.epsilon,
            sm.cost.delta,
            scales.join(" ")
        ));
    }
    if let Some(s) = &m.selection {
        let by = match (m.selection_measure, s.kind()) {
            (Some(j), MechanismKind::Laplace) => format!("released m{j}"),
            (Some(j), MechanismKind::Gaussian) => format!("released m{j} (Gaussian threshold)"),
            (None, MechanismKind::Laplace) if s.is_optimal_rule() => format!(
                "own count of units (optimal rule, certain from {})",
                s.certain_from().unwrap_or(0)
            ),
            (None, MechanismKind::Laplace) => "own count of units".to_string(),
            (None, MechanismKind::Gaussian) => {
                "own count of units (Gaussian threshold)".to_string()
            }
        };
        lines.push(format!(
            "partition selection by {by}: scale {}, threshold {}, delta {}",
            s.scale(),
            s.threshold(),
            s.delta()
        ));
    }
    let mut post = Vec::new();
    if plan.having().is_some() {
        post.push("having".to_string());
    }
    if !plan.order_by().is_empty() {
        post.push(format!("order by {} key(s)", plan.order_by().len()));
    }
    if let Some(l) = plan.limit() {
        post.push(format!("limit {l}"));
    }
    if plan.offset() > 0 {
        post.push(format!("offset {}", plan.offset()));
    }
    if !post.is_empty() {
        lines.push(format!("post-processing: {}", post.join(", ")));
    }
    lines
}

/// What the code does with a case, in the corpus's terms.
fn outcome(policy: &Policy, case: &Case) -> (Expected, Option<Compiled>) {
    match compile_with(policy, &case.sql, &case.params, case_budget(case)) {
        Ok(c) => (
            Expected::Accepted {
                sql: c.rewrite.sql.to_string(),
                release: describe(&c),
            },
            Some(c),
        ),
        Err(e) => (
            Expected::Refused {
                code: e.sqlstate().code().to_string(),
            },
            None,
        ),
    }
}

// ---------------------------------------------------------------------------------------------
// Invariants of every accepted case
// ---------------------------------------------------------------------------------------------

/// Functions the rewrite itself emits, unqualified.
const REWRITE_FUNCTIONS: [&str; 8] = [
    "count",
    "sum",
    "least",
    "greatest",
    "coalesce",
    "hashtextextended",
    "row_number",
    "string_agg",
];

/// Aggregates of one unit's rows in a subquery grouped by the privacy unit, emitted
/// `pg_catalog`-qualified.
const UNIT_AGGREGATES: [&str; 5] = ["count", "sum", "avg", "min", "max"];

/// The policy table (or `None` for a subquery pgdp built) behind each generated alias of the
/// emitted SQL, read from its `"schema"."table" AS "__dp_tN"` and `(…) AS "__dp_tN"` items.
fn aliases_in(sql: &str) -> std::collections::BTreeMap<String, Option<String>> {
    let mut out = std::collections::BTreeMap::new();
    let marker = " AS \"__dp_t";
    let mut rest = sql;
    let mut offset = 0;
    while let Some(i) = rest.find(marker) {
        let at = offset + i;
        let after = &sql[at + marker.len()..];
        let digits: String = after.chars().take_while(|c| c.is_ascii_digit()).collect();
        let alias = format!("__dp_t{digits}");
        let before = &sql[..at];
        let table = if before.ends_with(')') {
            None
        } else {
            // "schema"."table"
            let start = before.rfind(' ').map(|p| p + 1).unwrap_or(0);
            Some(before[start..].replace('"', ""))
        };
        out.insert(alias, table);
        offset = at + marker.len();
        rest = &sql[offset..];
    }
    out
}

/// SQL constructs that look like functions but are not functions of `pg_catalog`: PostgreSQL
/// refuses `pg_catalog.coalesce(…)` and the like. `ROW(…)`, a row constructor, is emitted for
/// `COUNT(DISTINCT ROW(…))`.
const SPECIAL_FORMS: [&str; 6] = ["coalesce", "nullif", "greatest", "least", "trim", "row"];

fn is_generated(name: &str) -> bool {
    name.starts_with(analyze::RESERVED_PREFIX)
}

/// Checks the emitted SQL: round trip, identifiers, relations, functions, no placeholders.
fn check_emitted_sql(policy: &Policy, c: &Compiled) -> Result<(), String> {
    let sql = c.rewrite.sql.as_str();
    let statements = Parser::parse_sql(&PostgreSqlDialect {}, sql)
        .map_err(|e| format!("the emitted SQL does not parse: {e}"))?;
    let [statement] = statements.as_slice() else {
        return Err(format!("{} statements emitted", statements.len()));
    };
    let again = statement.to_string();
    if again != sql {
        return Err(format!("round trip changed the SQL:\n  {sql}\n  {again}"));
    }
    let aliases = aliases_in(sql);
    // A column of a policy table must be declared; a column of a subquery pgdp built is one of
    // the names it gave with AS.
    let column_ok = |alias: &str, column: &str| match aliases.get(alias) {
        Some(Some(table)) => policy
            .table(table)
            .is_some_and(|t| t.column(column).is_some()),
        Some(None) => sql.contains(&format!("AS \"{column}\"")),
        None => false,
    };
    let mut problems: Vec<String> = Vec::new();
    let _ = ast::visit_expressions(statement, |e| {
        match e {
            Expr::Identifier(i) if !is_generated(&i.value) => {
                problems.push(format!("bare identifier {i}"));
            }
            Expr::CompoundIdentifier(parts) => {
                let ok = match parts.as_slice() {
                    [t, col] if t.quote_style.is_none() => {
                        // A generated column of a CTE or derived table pgdp named (stage 4's
                        // `__dp_out` and the value stages `__dp_dJ` it joins).
                        col.quote_style.is_none()
                            && is_generated(&t.value)
                            && is_generated(&col.value)
                            && (sql.contains(&format!(" {} AS (", t.value))
                                || sql.contains(&format!(") AS {} ", t.value)))
                    }
                    [t, col] => {
                        t.quote_style == Some('"')
                            && col.quote_style == Some('"')
                            && column_ok(&t.value, &col.value)
                    }
                    _ => false,
                };
                if !ok {
                    problems.push(format!("non-canonical column reference {e}"));
                }
            }
            Expr::Function(f) => {
                // Quoted names (`pg_catalog."floor"`) are compared by their value.
                let parts: Vec<String> = f
                    .name
                    .0
                    .iter()
                    .map(|p| {
                        p.as_ident()
                            .map(|i| i.value.to_ascii_lowercase())
                            .unwrap_or_else(|| p.to_string().to_ascii_lowercase())
                    })
                    .collect();
                let ok = match parts.as_slice() {
                    // The special forms are emitted unqualified (they cannot be shadowed).
                    [n] => {
                        REWRITE_FUNCTIONS.contains(&n.as_str())
                            || (SPECIAL_FORMS.contains(&n.as_str()) && n != "trim")
                    }
                    [schema, n] => {
                        schema == "pg_catalog"
                            && (analyze::is_total_function(n)
                                || UNIT_AGGREGATES.contains(&n.as_str())
                                || analyze::is_window_function(n)
                                || analyze::GUARD_FUNCTIONS.contains(&n.as_str()))
                            && !SPECIAL_FORMS.contains(&n.as_str())
                    }
                    _ => false,
                };
                if !ok {
                    problems.push(format!("function {}", f.name));
                }
            }
            Expr::Value(v) if matches!(v.value, ast::Value::Placeholder(_)) => {
                problems.push(format!("unbound parameter {v}"));
            }
            _ => {}
        }
        ControlFlow::<()>::Continue(())
    });
    let _ = ast::visit_relations(statement, |name| {
        let parts: Vec<&ast::Ident> = name.0.iter().filter_map(|p| p.as_ident()).collect();
        let ok = match parts.as_slice() {
            [n] => is_generated(&n.value),
            [s, t] => {
                s.quote_style == Some('"')
                    && t.quote_style == Some('"')
                    && policy.table(&format!("{}.{}", s.value, t.value)).is_some()
            }
            _ => false,
        };
        if !ok || parts.len() != name.0.len() {
            problems.push(format!("relation {name}"));
        }
        ControlFlow::<()>::Continue(())
    });
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("; "))
    }
}

fn check_sensitivities(c: &Compiled) -> Result<(), String> {
    for (j, m) in c.rewrite.measures.iter().enumerate() {
        let contribution = m.contribution(&c.rewrite.arguments, c.plan.max_rows_per_unit());
        let sensitivity = c.mechanisms.sensitivities[j];
        for (what, x) in [("contribution", contribution), ("sensitivity", sensitivity)] {
            if !(x.is_finite() && x > 0.0) {
                return Err(format!("measure m{j} has {what} {x}"));
            }
        }
        if sensitivity < contribution {
            return Err(format!(
                "measure m{j}: sensitivity {sensitivity} below one group's contribution {contribution}"
            ));
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------------

#[test]
fn golden_rewrites() {
    let policy = demo_policy();
    let bless = std::env::var(BLESS_ENV).is_ok_and(|v| v == "1");
    let mut failures: Vec<String> = Vec::new();
    for mut file in corpus() {
        let mut changed = false;
        for case in &mut file.cases {
            let (actual, compiled) = outcome(&policy, case);
            let invariants = compiled
                .as_ref()
                .map(|c| check_emitted_sql(&policy, c).and_then(|()| check_sensitivities(c)));
            let same_kind =
                std::mem::discriminant(&actual) == std::mem::discriminant(&case.expected);
            if let Some(bug) = &case.expect_bug {
                // Strict expected failure: the case must not pass yet.
                let fixed = match (&case.expected, &actual) {
                    // A refusal is safe whatever the case intended; an internal error is not a
                    // refusal.
                    (_, Expected::Refused { code }) if code != "XX000" => {
                        let stated =
                            matches!(&case.expected, Expected::Refused { code: c } if c == code);
                        Some(format!(
                            "it is now refused with {code}{}",
                            if stated { "" } else { " (update the case)" }
                        ))
                    }
                    (
                        Expected::Accepted { sql, .. },
                        Expected::Accepted {
                            sql: actual_sql, ..
                        },
                    ) => (matches!(invariants, Some(Ok(())))
                        && (sql.is_empty() || sql == actual_sql))
                        .then(|| "it is now accepted with a sound rewrite".to_string()),
                    _ => None,
                };
                if let Some(how) = fixed {
                    failures.push(format!(
                        "{}: marked expect_bug ({bug}) but {how}: remove the marker",
                        case.at()
                    ));
                }
                continue;
            }
            if let Some(Err(e)) = invariants {
                failures.push(format!("{}: invariant broken: {e}", case.at()));
            }
            if matches!(&actual, Expected::Refused { code } if code == "XX000") {
                let message = compile(&policy, &case.sql, &case.params)
                    .err()
                    .map(|e| e.to_string())
                    .unwrap_or_default();
                failures.push(format!(
                    "{}: internal error (XX000) is never an expectation: {message}",
                    case.at()
                ));
                continue;
            }
            if actual == case.expected {
                continue;
            }
            if bless && same_kind {
                case.expected = actual;
                changed = true;
                continue;
            }
            failures.push(format!(
                "{}:\n  expected: {:?}\n  actual:   {:?}{}",
                case.at(),
                case.expected,
                actual,
                if same_kind {
                    "\n  (PGDP_BLESS=1 updates it)"
                } else {
                    "\n  (accepted/refused changed: edit the case by hand)"
                }
            ));
        }
        if changed {
            std::fs::write(&file.path, render_case_file(&file))
                .unwrap_or_else(|e| panic!("cannot bless {}: {e}", file.path.display()));
        }
    }
    assert!(
        failures.is_empty(),
        "{} failure(s):\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn corpus_is_large_and_files_are_canonical() {
    let files = corpus();
    let cases: Vec<&Case> = files.iter().flat_map(|f| &f.cases).collect();
    let accepted = cases
        .iter()
        .filter(|c| matches!(c.expected, Expected::Accepted { .. }))
        .count();
    assert!(cases.len() >= CASES_MIN, "only {} cases", cases.len());
    assert!(
        accepted >= 30 && cases.len() - accepted >= 30,
        "{accepted} accepted of {}",
        cases.len()
    );
    let names: BTreeSet<&str> = cases.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(
        names.len(),
        cases.len(),
        "case names are unique across files"
    );
    for f in &files {
        let text = std::fs::read_to_string(&f.path).expect("readable");
        assert_eq!(
            text,
            render_case_file(f),
            "{} is not in canonical form (blessing would rewrite it)",
            f.path.display()
        );
    }
}

/// Every accepted case's SQL runs on the demo dataset without error.
#[tokio::test]
async fn golden_sql_runs_on_postgres() {
    let policy = demo_policy();
    let db = harness::demo_database(1).await;
    let client = db.client().await;
    let mut failures = Vec::new();
    let mut ran = 0;
    for (case, c) in accepted_cases(&policy) {
        let sql = format!("SELECT count(*) FROM ({}) q", c.rewrite.sql);
        ran += 1;
        if let Err(e) = client.simple_query(&sql).await {
            let detail = e
                .as_db_error()
                .map(|d| d.message().to_string())
                .unwrap_or_else(|| e.to_string());
            failures.push(format!("{}: {detail}", case.at()));
        }
    }
    assert!(ran >= 30, "only {ran} cases ran");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// demo.people.person_id, the unit column of the demo's one-row-per-person table.
fn person_id() -> (String, String) {
    ("demo.people".into(), "person_id".into())
}

/// What the upstream catalog of `db` says of `keys` being unique, learnt as pgdp learns it:
/// the only way a plan is told that a column is unique (the facts are sealed).
async fn upstream_facts(db: &harness::TestDb, keys: &[(String, String)]) -> ColumnFacts {
    let upstream = Upstream::new(db.dsn()).expect("the test database's DSN");
    let facts = ColumnFacts::default();
    upstream
        .learn_column_facts(&facts, ColumnFact::Unique, keys)
        .await
        .expect("catalog lookup");
    facts
}

/// When every row is its own unit (one table whose unit column is unique upstream, as
/// demo.people.person_id is), the rewrite skips the per-unit aggregation and the ranking. Its SQL
/// must give exactly the rows of the general form, for every corpus case it applies to.
#[tokio::test]
async fn unique_unit_rewrite_gives_the_same_statistics() {
    let policy = demo_policy();
    let db = harness::demo_database(1).await;
    let client = db.client().await;
    let person_facts = upstream_facts(&db, &[person_id()]).await;
    let mut compared = 0;
    for (case, c) in accepted_cases(&policy) {
        if c.plan.unit_key() != Some(("demo.people".into(), "person_id".into())) {
            continue;
        }
        let mut plan = c.plan.clone();
        assert!(plan.assume_unique_unit(&person_facts), "{}", case.at());
        let flat = rewrite::rewrite(&plan, &case.params, SECRET).unwrap();
        assert_eq!(flat.measures, c.rewrite.measures, "{}", case.at());
        let general = text_rows(&client, &c.rewrite.sql).await.unwrap();
        let fast = text_rows(&client, &flat.sql).await.unwrap();
        // Numeric sums print with the scale of their terms; compare values.
        let value = |t: &Option<String>| {
            t.as_deref().map(|t| {
                t.parse::<f64>()
                    .map_or(t.to_string(), |x| format!("{x:.6}"))
            })
        };
        let norm = |rows: Vec<Vec<Option<String>>>| -> Vec<Vec<Option<String>>> {
            let mut rows: Vec<Vec<Option<String>>> =
                rows.iter().map(|r| r.iter().map(value).collect()).collect();
            rows.sort();
            rows
        };
        assert_eq!(norm(general), norm(fast), "{}", case.at());
        if !flat.sql.contains("ROW_NUMBER") {
            compared += 1;
        }
    }
    assert!(
        compared >= 5,
        "only {compared} cases used the unique-unit form"
    );
}

/// pgdp sends [`rewrite::Shape::Fast`]; [`rewrite::Shape::Reference`] is the shape
/// docs/privacy.md argues (the SQL pgdp sent before issue 18). Over every accepted corpus case,
/// in the general form and, where the unit is demo.people's primary key, in the unique-unit form,
/// both must give exactly the same statistics on the demo data: the same groups, the same counts,
/// the same sums as exact decimals (the fast shape prints fewer trailing zeros).
#[tokio::test]
async fn fast_shape_gives_the_statistics_of_the_reference_shape() {
    let policy = demo_policy();
    let db = harness::demo_database(1).await;
    let client = db.client().await;
    let person_facts = upstream_facts(&db, &[person_id()]).await;
    let (mut general, mut flat, mut below) = (0, 0, 0);
    for file in corpus() {
        for case in &file.cases {
            if case.expect_bug.is_some() {
                continue;
            }
            let Ok(c) = compile(&policy, &case.sql, &case.params) else {
                continue;
            };
            let mut plans = vec![c.plan.clone()];
            if c.plan.unit_key() == Some(("demo.people".into(), "person_id".into())) {
                let mut unique = c.plan.clone();
                assert!(unique.assume_unique_unit(&person_facts), "{}", case.at());
                plans.push(unique);
            }
            // Where the join has a side with one row per unit, as the upstream catalog says.
            let lookup_facts = upstream_facts(&db, &c.plan.unit_lookup_keys()).await;
            let mut joined = c.plan.clone();
            if joined.assume_unit_lookup(&lookup_facts) {
                plans.push(joined);
            }
            for plan in plans {
                let shaped = |shape| rewrite::rewrite_shaped(&plan, &case.params, SECRET, shape);
                let reference = shaped(rewrite::Shape::Reference).unwrap();
                let fast = shaped(rewrite::Shape::Fast).unwrap();
                assert_eq!(reference.measures, fast.measures, "{}", case.at());
                let want = exact_rows(text_rows(&client, &reference.sql).await.unwrap());
                let got = text_rows(&client, &fast.sql).await.unwrap();
                assert_eq!(want, exact_rows(got), "{}", case.at());
                if plan.unit_unique() {
                    flat += 1;
                } else if fast.sql.contains("__dp_below") {
                    below += 1;
                    // On shards where both tables are partitioned by the unit, the lookup form
                    // is one aggregate over the join (rewrite::partitionwise, item 5): the
                    // same statistics.
                    let merged = rewrite::partitionwise(fast.clone(), &policy, true).unwrap();
                    assert!(!merged.sql.contains("__dp_below"), "{}", merged.sql);
                    let on_shards = text_rows(&client, &merged.sql).await.unwrap();
                    assert_eq!(want, exact_rows(on_shards), "{} (merged)", case.at());
                } else {
                    general += 1;
                }
            }
        }
    }
    assert!(general >= 100, "only {general} cases in the general form");
    assert!(flat >= 5, "only {flat} cases in the unique-unit form");
    assert!(below >= 5, "only {below} cases in the lookup form");
}

/// A unit whose values of an argument are all NULL contributes nothing to that argument's sums
/// (before issue 18 the clamp `LEAST(GREATEST(NULL, lower), upper)` made it the lower end:
/// every man added −max_rows·half_range to the centred sum of `AVG(CASE WHEN sex = 'F' THEN
/// income END)`). The pre-noise centred sum must be the women's, in both forms.
#[tokio::test]
async fn units_without_values_add_nothing_to_sums() {
    let policy = demo_policy();
    let db = harness::demo_database(1).await;
    let client = db.client().await;
    let truth = text_rows(
        &client,
        "SELECT SUM(LEAST(GREATEST(income, 0), 250000) - 125000), SUM(LEAST(GREATEST(income, 0), 250000)) FROM demo.people WHERE sex = 'F'",
    )
    .await
    .expect("runs");
    let person_facts = upstream_facts(&db, &[person_id()]).await;
    let number =
        |t: &Option<String>| -> f64 { t.as_deref().expect("a value").parse().expect("numeric") };
    // With AVG the sum is derived from the count and the centred sum (sum = centred + 125000 ×
    // count); alone it is a measure of its own. Both must leave out units without values.
    for sql in [
        "SELECT AVG(CASE WHEN sex = 'F' THEN income END), SUM(CASE WHEN sex = 'F' THEN income END) FROM demo.people",
        "SELECT SUM(CASE WHEN sex = 'F' THEN income END) FROM demo.people",
    ] {
        let c = compile(&policy, sql, &[]).expect("accepted");
        let mut unique = c.plan.clone();
        assert!(unique.assume_unique_unit(&person_facts), "{sql}");
        for shape in [rewrite::Shape::Reference, rewrite::Shape::Fast] {
            for plan in [&c.plan, &unique] {
                let rw = rewrite::rewrite_shaped(plan, &[], SECRET, shape).expect("rewrites");
                let rows = text_rows(&client, &rw.sql).await.expect("runs");
                let at = |f: fn(&rewrite::Measure) -> bool| rw.measures.iter().position(f);
                let centred = at(|m| matches!(m, rewrite::Measure::SumCentered(_)));
                let count = at(|m| matches!(m, rewrite::Measure::Values(_)));
                let sum = match at(|m| matches!(m, rewrite::Measure::Sum(_))) {
                    Some(j) => number(&rows[0][j]),
                    None => {
                        let (c, n) = (centred.expect("a centred sum"), count.expect("a count"));
                        number(&rows[0][c]) + 125000.0 * number(&rows[0][n])
                    }
                };
                if let Some(c) = centred {
                    assert_eq!(
                        number(&rows[0][c]),
                        number(&truth[0][0]),
                        "{shape:?}: centred sum"
                    );
                }
                assert_eq!(sum, number(&truth[0][1]), "{shape:?}: sum of {sql}");
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Bugs that need a database to show. Each test asserts the correct behaviour and is ignored
// until the bug is fixed; `cargo test --test integration golden:: -- --ignored` runs them.
// ---------------------------------------------------------------------------------------------

/// `rows` sorted, each cell an exact decimal without trailing zeros, a quantile's histogram
/// with its buckets sorted.
fn exact_rows(rows: Vec<Vec<Option<String>>>) -> Vec<Vec<Option<String>>> {
    let exact = |t: &Option<String>| -> Option<String> {
        let t = t.as_deref()?;
        if t.contains(':') {
            let mut parts: Vec<&str> = t.split(',').collect();
            parts.sort_unstable();
            return Some(parts.join(","));
        }
        let is_number = t.parse::<f64>().is_ok();
        Some(if is_number && t.contains('.') {
            t.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            t.to_string()
        })
    };
    let mut rows: Vec<Vec<Option<String>>> =
        rows.iter().map(|r| r.iter().map(exact).collect()).collect();
    rows.sort();
    rows
}

/// Stage 4 joins a distinct count's or quantile's CTE `__dp_dJ` to its groups
/// (`rewrite::ending::last_stage`: `LEFT JOIN __dp_dJ ON ARRAY[__dp_dJ.__dp_dkI] =
/// ARRAY[__dp_out.__dp_kI]`). Over every accepted corpus case that has one, it must give exactly
/// the rows of the form it replaced, a scalar subquery per group (`COALESCE((SELECT s FROM
/// __dp_dJ WHERE __dp_dkI IS NOT DISTINCT FROM __dp_kI …), default)`), on the demo data: the
/// same groups once each (a NULL group too), the same values and defaults.
#[tokio::test]
async fn joined_value_stages_give_the_rows_of_scalar_subqueries() {
    let policy = demo_policy();
    let db = harness::demo_database(1).await;
    let client = db.client().await;
    let (mut compared, mut grouped) = (0, 0);
    for (case, c) in accepted_cases(&policy) {
        let sql = c.rewrite.sql.as_str();
        let Some((subqueries, keys)) = as_scalar_subqueries(sql) else {
            assert!(!sql.contains(" __dp_d0 AS ("), "{}: {sql}", case.at());
            continue;
        };
        let joined = text_rows(&client, sql).await.unwrap();
        let read = text_rows(&client, &subqueries).await.unwrap();
        assert!(!joined.is_empty(), "{}", case.at());
        assert_eq!(
            exact_rows(joined),
            exact_rows(read),
            "{}: {subqueries}",
            case.at()
        );
        compared += 1;
        grouped += usize::from(keys > 0);
    }
    assert!(
        compared >= 8 && grouped >= 4,
        "{compared} cases compared, {grouped} grouped"
    );
}

/// The statement `sql` with stage 4 reading each joined `__dp_dJ` through a scalar subquery per
/// group instead (the CTE materialised, so that the subquery scans its rows rather than computing
/// them again per group), and its number of keys; `None` without a joined value stage.
fn as_scalar_subqueries(sql: &str) -> Option<(String, usize)> {
    let (head, joins) = sql.split_once(") AS __dp_out LEFT JOIN ")?;
    let first = joins.split(" LEFT JOIN ").next()?;
    let keys = first.matches("ARRAY[").count() / 2;
    let condition = if keys == 0 {
        String::new()
    } else {
        let parts: Vec<String> = (0..keys)
            .map(|i| format!("__dp_dk{i} IS NOT DISTINCT FROM __dp_out.__dp_k{i}"))
            .collect();
        format!(" WHERE {}", parts.join(" AND "))
    };
    // The outer select list: from stage 4's SELECT to its derived table.
    let list_end = head.rfind(" FROM (SELECT ")?;
    let list_start = head[..list_end].rfind(") SELECT ")?;
    let mut list = head[list_start..list_end].to_string();
    while let Some(at) = list.find("COALESCE(__dp_d") {
        let rest = &list[at + "COALESCE(".len()..];
        let (table, after) = rest.split_once('.')?;
        let (stem, _) = after.split_once(',')?;
        let from = format!("COALESCE({table}.{stem}");
        let to = format!("COALESCE((SELECT {stem} FROM {table}{condition})");
        list = list.replacen(&from, &to, 1);
    }
    let mut ctes = head[..list_start].to_string();
    for join in joins.split(" LEFT JOIN ") {
        let (table, _) = join.split_once(" ON ")?;
        ctes = ctes.replace(
            &format!(" {table} AS ("),
            &format!(" {table} AS MATERIALIZED ("),
        );
    }
    Some((
        format!("{ctes}{list}{}) AS __dp_out", &head[list_end..]),
        keys,
    ))
}

/// Runs a query on the demo dataset and returns its rows as text.
async fn text_rows(
    client: &tokio_postgres::Client,
    sql: &str,
) -> Result<Vec<Vec<Option<String>>>, String> {
    let messages = client.simple_query(sql).await.map_err(|e| {
        e.as_db_error()
            .map(|d| d.message().to_string())
            .unwrap_or_else(|| e.to_string())
    })?;
    Ok(messages
        .into_iter()
        .filter_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => {
                Some((0..r.len()).map(|i| r.get(i).map(str::to_string)).collect())
            }
            _ => None,
        })
        .collect())
}

/// A string value with a backslash before a quote ends the literal early in the emitted SQL, so
/// the rest of the value is run as SQL: here a SELECT of one person's income, returned as the
/// "count" and released with noise of scale 10 (income·100 ± a few tens).
///
/// Reproduction (psql through pgdp, any analyst):
/// `SELECT COUNT(*) FROM demo.visits WHERE clinic = 'x\'') SELECT CAST(income * 100 AS bigint), 1 FROM demo.people WHERE person_id = 6 --';`
/// returns about 164217 (person 6's income is 1642.17). The correct answer is a noisy 0.
#[tokio::test]
async fn string_literals_cannot_change_the_upstream_query() {
    let policy = demo_policy();
    let db = harness::demo_database(1).await;
    let client = db.client().await;
    let payload = "SELECT CAST(income * 100 AS bigint), 1 FROM demo.people WHERE person_id = 6 --";
    let attacks: [(String, Vec<Option<String>>); 2] = [
        (
            format!("SELECT COUNT(*) FROM demo.visits WHERE clinic = 'x\\'') {payload}'"),
            vec![],
        ),
        (
            "SELECT COUNT(*) FROM demo.visits WHERE clinic = $1".to_string(),
            vec![Some(format!("x\\' AS TEXT)) {payload}"))],
        ),
    ];
    let mut failures = Vec::new();
    for (sql, params) in attacks {
        let Ok(c) = compile(&policy, &sql, &params) else {
            continue; // Refusing such values is a fix too.
        };
        let rows = text_rows(&client, &c.rewrite.sql).await.expect("runs");
        // No visit has that clinic: no unit contributes, and the count is 0.
        if rows != vec![vec![None, Some("0".to_string())]] {
            failures.push(format!(
                "{sql} {params:?}\n  sent: {}\n  got:  {rows:?}",
                c.rewrite.sql
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Accepted queries whose upstream statement fails for some data and not for other data. Each
/// template is filled with two literals: with the first the failing expression reaches rows (and
/// the upstream fails), with the second it reaches none (and the query succeeds), so whether a
/// query fails tells the analyst whether such rows exist.
#[tokio::test]
async fn data_dependent_upstream_errors_are_refused() {
    let pairs: [(&str, &str, &str); 7] = [
        (
            "SELECT COUNT(*) FROM demo.visits WHERE person_id = {} AND date_trunc('fortnight', visit_date) IS NOT NULL",
            "5",
            "-1",
        ),
        (
            "SELECT COUNT(*) FROM demo.visits WHERE person_id = {} AND date_part('fortnight', visit_date) > 0",
            "5",
            "-1",
        ),
        (
            "SELECT COUNT(*) FROM demo.visits WHERE person_id = {} AND CAST(person_id AS smallint) > 0",
            "40001",
            "1",
        ),
        (
            "SELECT SUM(CAST(income AS numeric(5,2))) FROM demo.people WHERE person_id = {}",
            "6",
            "5",
        ),
        // The pattern is only read as far as the text matches it: the error needs a row whose
        // text runs into the trailing escape.
        (
            "SELECT COUNT(*) FROM demo.visits WHERE diagnosis LIKE E'{}\\\\'",
            "J",
            "QQ",
        ),
        (
            "SELECT COUNT(*) FROM demo.visits WHERE diagnosis = 'J06' AND diagnosis || '\\x' LIKE '{}\\\\\\'",
            "J06",
            "QQ",
        ),
        (
            "SELECT COUNT(*) FROM demo.people WHERE person_id = {} AND income * 1e100000 * 1e100000 > 0",
            "6",
            "5",
        ),
    ];
    let policy = demo_policy();
    let db = harness::demo_database(1).await;
    let client = db.client().await;
    let mut failures = Vec::new();
    for (template, reaching, not_reaching) in pairs {
        for literal in [reaching, not_reaching] {
            let sql = template.replace("{}", literal);
            let Ok(c) = compile(&policy, &sql, &[]) else {
                continue;
            };
            if let Err(e) = text_rows(&client, &c.rewrite.sql).await {
                failures.push(format!("{sql}: accepted, but the upstream fails: {e}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// `LEAST(GREATEST(x, lower), upper)` maps NULL to `lower` (GREATEST ignores NULLs), so NULL
/// arguments are counted and averaged as the lower bound: `AVG(CASE WHEN sex = 'F' THEN income
/// END)` counts every person and averages the men's incomes as 0. With one row per person and
/// no grouping, the exact count of values must be the number of women.
#[tokio::test]
async fn clamp_turns_null_arguments_into_the_lower_bound() {
    let policy = demo_policy();
    let db = harness::demo_database(1).await;
    let client = db.client().await;
    let c = compile(
        &policy,
        "SELECT AVG(CASE WHEN sex = 'F' THEN income END) FROM demo.people",
        &[],
    )
    .expect("accepted");
    let rows = text_rows(&client, &c.rewrite.sql).await.expect("runs");
    let values = rows[0][0].clone().expect("a count");
    let women = text_rows(&client, "SELECT count(*) FROM demo.people WHERE sex = 'F'")
        .await
        .expect("runs")[0][0]
        .clone()
        .expect("a count");
    assert_eq!(values, women, "count of non-NULL values of the CASE");
}

/// Each unit's sum is clamped to `[max_rows·lower, max_rows·upper]`; with `lower > 0` a unit with
/// fewer than `max_rows` rows is raised to `max_rows·lower`. `SUM(cost + 100)` (bounds 100..2100,
/// 10 rows per unit) over one visit gives 1000 instead of `cost + 100`. Clamping to
/// `[min(0, max_rows·lower), max(0, max_rows·upper)]` keeps the same sensitivity without the bias.
#[tokio::test]
async fn sum_clamp_inflates_units_below_the_lower_cap() {
    let policy = demo_policy();
    let db = harness::demo_database(1).await;
    let client = db.client().await;
    let c = compile(
        &policy,
        "SELECT SUM(cost + 100) FROM demo.visits WHERE visit_id = 1",
        &[],
    )
    .expect("accepted");
    let rows = text_rows(&client, &c.rewrite.sql).await.expect("runs");
    let exact = rows[0][0].clone().expect("a sum");
    let truth = text_rows(
        &client,
        "SELECT LEAST(GREATEST(cost, 0), 2000) + 100 FROM demo.visits WHERE visit_id = 1",
    )
    .await
    .expect("runs")[0][0]
        .clone()
        .expect("a value");
    let as_f64 = |t: &str| t.parse::<f64>().expect("numeric");
    assert_eq!(
        as_f64(&exact),
        as_f64(&truth),
        "the pre-noise sum of one visit"
    );
}

/// AVG (and the variances) divide a per-unit centred sum taken over *all* of a unit's rows
/// (clamped to `±max_rows·half_range`) by a count capped at `max_rows`. A unit with more rows than
/// the cap and values below the midpoint is pushed to the lower bound: with cost in [0, 2000]
/// (midpoint 1000) a person with 40 visits of about 90 contributes as 10 visits of 0. On the demo
/// data the exact, pre-noise AVG(cost) comes out at 33.5 where the clamped average is 109.2 (and
/// scaling each unit's sum by `min(1, max_rows/rows)` gives 109.2 too).
#[tokio::test]
async fn avg_caps_count_and_centred_sum_alike() {
    let policy = demo_policy();
    let db = harness::demo_database(1).await;
    let client = db.client().await;
    let c = compile(&policy, "SELECT AVG(cost) FROM demo.visits", &[]).expect("accepted");
    let rows = text_rows(&client, &c.rewrite.sql).await.expect("runs");
    let number = |t: &Option<String>| -> f64 {
        t.as_deref()
            .expect("a value")
            .parse()
            .expect("numeric text")
    };
    let (count, centred) = (number(&rows[0][0]), number(&rows[0][1]));
    let derived = 1000.0 + centred / count;
    let clamped = number(
        &text_rows(
            &client,
            "SELECT AVG(LEAST(GREATEST(cost, 0), 2000)) FROM demo.visits",
        )
        .await
        .expect("runs")[0][0],
    );
    assert!(
        (derived - clamped).abs() <= 0.1 * clamped,
        "pre-noise AVG(cost) {derived}, clamped average {clamped}"
    );
}

/// A chosen caps record with a total cap on each unit's rows over all its groups, as the
/// ledger stores one ([`release::bounds::ChosenBounds::stored_with`]): caps of `rows` in each of
/// `groups` groups and `total` in all, every estimate 0, with a clamp estimate of aggregate
/// `clamped` when the query's choice makes one. Read back only through
/// [`release::bounds::ChosenBounds::stored`], which checks the caps against the query's own
/// candidates.
fn chosen_payload(
    rows: u64,
    groups: u64,
    ceiling: u64,
    groups_ceiling: u64,
    total: u64,
    clamped: Option<u64>,
) -> Vec<u8> {
    let mut out = b"pgdp-chosen-bounds-3".to_vec();
    for n in [rows, groups, ceiling, groups_ceiling, 1, total] {
        out.extend_from_slice(&n.to_be_bytes());
    }
    for _ in 0..11 {
        out.extend_from_slice(&0f64.to_bits().to_be_bytes());
    }
    match clamped {
        None => out.extend_from_slice(&0u64.to_be_bytes()),
        Some(aggregate) => {
            out.extend_from_slice(&1u64.to_be_bytes());
            out.extend_from_slice(&aggregate.to_be_bytes());
            for _ in 0..4 {
                out.extend_from_slice(&0f64.to_bits().to_be_bytes());
            }
        }
    }
    out
}

/// Under a total cap `T` (docs/privacy.md, "A cap on each unit's rows over all its groups"),
/// stage 3 gives each of a unit's groups an allowance out of `T` and stage 4 caps there: both
/// shapes must give the same statistics, and over all clinics the capped count of visits must
/// be exactly `Σ_units min(T, Σ_clinics min(visits, C))`, computed here independently (over
/// the clinics C01 to C16 every person has at most 16 clinics, so stage 3 keeps all of them and
/// the ranking does not matter), at most `T` per person.
#[tokio::test]
async fn a_total_cap_keeps_each_unit_within_it_in_both_shapes() {
    let policy = demo_policy();
    let db = harness::demo_database(1).await;
    let client = db.client().await;
    let most_clinics: i64 = client
        .query_one(
            "SELECT max(n) FROM (SELECT person_id, count(DISTINCT clinic) AS n FROM demo.visits WHERE clinic <= 'C16' GROUP BY 1) AS p",
            &[],
        )
        .await
        .expect("clinics per person")
        .get(0);
    assert!(most_clinics <= 16, "{most_clinics} clinics for one person");
    let sql = "SELECT clinic, COUNT(*), SUM(cost), AVG(cost), VARIANCE(cost) FROM demo.visits WHERE clinic <= 'C16' GROUP BY clinic";
    let c = compile(&policy, sql, &[]).expect("compiles");
    let choice =
        release::bounds::ChoicePlan::new(&c.plan, &c.rewrite, &c.mechanisms, &[], SECRET, None)
            .expect("choice")
            .expect("the query chooses its caps");
    let (ceiling, groups) = (choice.choice.ceiling(), choice.choice.groups_ceiling());
    assert!(
        choice.choice.totals().contains(&24),
        "{:?}",
        choice.choice.totals()
    );
    for total in [3, 24, 64] {
        // SUM(cost), aggregate 1, is the one whose clamping the choice estimates.
        let payload = chosen_payload(ceiling, groups, ceiling, groups, total, Some(1));
        let (chosen, _) = release::bounds::ChosenBounds::stored(&payload, &choice.choice)
            .unwrap_or_else(|| panic!("a total of {total} is a candidate"));
        let (plan, fast, _) = choice
            .answer(
                &c.plan,
                &chosen,
                &[],
                SECRET,
                pgdp::dp::rewrite::UpstreamShape::OneServer,
                &policy,
            )
            .expect("the answer at the total");
        assert_eq!(plan.max_rows_total(), Some(total));
        assert!(fast.sql.contains("__dp_allow"), "{}", fast.sql);
        let reference = rewrite::rewrite_shaped(&plan, &[], SECRET, rewrite::Shape::Reference)
            .expect("reference shape");
        let norm = |rows: Vec<Vec<Option<String>>>| -> Vec<Vec<String>> {
            let mut rows: Vec<Vec<String>> = rows
                .iter()
                .map(|r| {
                    r.iter()
                        .map(|t| {
                            let t = t.clone().unwrap_or_default();
                            match t.parse::<f64>() {
                                Ok(x) => format!("{x:.6e}"),
                                Err(_) => t,
                            }
                        })
                        .collect()
                })
                .collect();
            rows.sort();
            rows
        };
        let want = text_rows(&client, &reference.sql)
            .await
            .expect("reference runs");
        let got = text_rows(&client, &fast.sql).await.expect("fast runs");
        assert_eq!(norm(want.clone()), norm(got.clone()), "total {total}");
        // The partitionwise shape (shards, partitions by unit) keeps the allowance's window.
        let sharded =
            rewrite::partitionwise(fast.clone(), &policy, true).expect("partitionwise shape");
        assert!(sharded.sql.contains("__dp_allow"), "{}", sharded.sql);
        let on_shards = text_rows(&client, &sharded.sql)
            .await
            .expect("partitionwise runs");
        assert_eq!(norm(want), norm(on_shards), "total {total}, partitionwise");
        // Column 1 is the capped count of rows.
        let released: i64 = got
            .iter()
            .map(|r| {
                r[1].as_deref()
                    .expect("a count")
                    .parse::<i64>()
                    .expect("integer")
            })
            .sum();
        let expected: i64 = client
            .query_one(
                &format!(
                    "SELECT sum(LEAST({total}, t))::bigint FROM (SELECT person_id, sum(LEAST(n, {ceiling})) AS t \
                     FROM (SELECT person_id, clinic, count(*) AS n FROM demo.visits WHERE clinic <= 'C16' GROUP BY 1, 2) AS g GROUP BY 1) AS u"
                ),
                &[],
            )
            .await
            .expect("the independent count")
            .get(0);
        assert_eq!(released, expected, "total {total}");
        let units: i64 = client
            .query_one(
                "SELECT count(DISTINCT person_id) FROM demo.visits WHERE clinic <= 'C16'",
                &[],
            )
            .await
            .expect("units")
            .get(0);
        assert!(released <= units * total as i64);
    }
}
