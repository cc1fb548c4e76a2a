//! SQL coverage through the wire (issue 8): CASE in aggregates and keys, COUNT(DISTINCT col),
//! CTEs and derived tables, per-person subqueries, quantiles; and the catalogue of analyst
//! queries in `docs/queries.md`, every one of which must run end to end.
//!
//! Tolerances follow from the noise scale b of each measure (stated at each use) as in `dp.rs`:
//! discrete Laplace noise exceeds 20·b with probability below e^-20 ≈ 2·10^-9 per value, so a
//! correct pgdp fails with negligible probability; with the fixed seeds a run always passes or
//! always fails.

use std::path::Path;

use tokio_postgres::error::SqlState;

use crate::support::{
    assert_code, policy_with_budget, shipped_policy_with_budget, upstream_client, Number, Proxy,
    Session,
};

/// A proxy whose analyst can afford every query of a test (ε 1000, at most 100 per query), at
/// the tables' caps: most tests here compare with the capped statistic computed on the upstream.
async fn rich_proxy(seed: u8) -> Proxy {
    Proxy::with_policy(policy_with_budget(1000, 100), seed).await
}

async fn set_epsilon(s: &Session, epsilon: f64) {
    s.batch_execute(&format!("SET pgdp.epsilon = {epsilon}"))
        .await
        .expect("SET pgdp.epsilon");
}

/// One query of the catalogue.
#[derive(Debug)]
enum Entry {
    /// Must run, return these `name type` columns and charge `charge`: the cost its NOTICE
    /// states (`epsilon=…, delta=…`, with `, rho=…` under zCDP), or `nothing` for an answer
    /// reused from an earlier release of the catalogue.
    Runs {
        sql: String,
        columns: Vec<String>,
        charge: Option<String>,
    },
    /// Must be refused with this SQLSTATE; `instead` must run.
    Refused {
        sql: String,
        code: String,
        instead: String,
    },
}

/// Extracts the catalogue: each ```sql block followed by `Columns: `…`` (and, in the same
/// paragraph, `Charge: `…``) or `Refused: `…``.
fn catalogue() -> Vec<Entry> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/queries.md");
    let text = std::fs::read_to_string(&path).expect("docs/queries.md");
    let mut blocks: Vec<(String, usize)> = Vec::new();
    let lines: Vec<&str> = text.lines().collect();
    let mut i = 0;
    while i < lines.len() {
        if lines[i].trim() == "```sql" {
            let start = i + 1;
            let mut end = start;
            while lines[end].trim() != "```" {
                end += 1;
            }
            blocks.push((lines[start..end].join(" "), end + 1));
            i = end + 1;
        } else {
            i += 1;
        }
    }
    let after = |line: usize| -> String {
        lines[line..]
            .iter()
            .find(|l| !l.trim().is_empty())
            .map(|l| l.to_string())
            .unwrap_or_default()
    };
    let quoted = |l: &str| -> String { l.split('`').nth(1).expect("a `…` value").to_string() };
    let mut entries = Vec::new();
    let mut k = 0;
    while k < blocks.len() {
        let (sql, end) = &blocks[k];
        let next = after(*end);
        if next.starts_with("Columns:") {
            let columns = quoted(&next).split(", ").map(str::to_string).collect();
            // The charge is stated in the paragraph that starts with the columns.
            let paragraph: String = lines[*end..]
                .iter()
                .skip_while(|l| l.trim().is_empty())
                .take_while(|l| !l.trim().is_empty())
                .copied()
                .collect::<Vec<_>>()
                .join(" ");
            let charge = paragraph
                .split_once("Charge: `")
                .and_then(|(_, rest)| rest.split_once('`'))
                .map(|(c, _)| c.to_string());
            entries.push(Entry::Runs {
                sql: sql.clone(),
                columns,
                charge,
            });
            k += 1;
        } else if next.starts_with("Refused:") {
            let instead = blocks.get(k + 1).expect("an Instead: block").0.clone();
            entries.push(Entry::Refused {
                sql: sql.clone(),
                code: quoted(&next),
                instead,
            });
            k += 2;
        } else {
            panic!("sql block not followed by Columns: or Refused: {sql}");
        }
    }
    entries
}

#[tokio::test]
async fn catalogue_of_analyst_queries_runs_end_to_end() {
    let entries = catalogue();
    let runs = entries
        .iter()
        .filter(|e| matches!(e, Entry::Runs { .. }))
        .count();
    assert!(runs >= 40, "docs/queries.md has only {runs} queries");
    // The demo policy as shipped (caps chosen per query), as docs/queries.md describes it.
    let proxy = Proxy::with_policy(shipped_policy_with_budget(1000, 100), 81).await;
    let s = proxy.connect().await;
    let direct = upstream_client().await;
    let mut charges_wrong = Vec::new();
    let mut not_described = 0;
    for entry in &entries {
        match entry {
            Entry::Runs {
                sql,
                columns,
                charge,
            } => {
                s.take_notices();
                let stmt = s
                    .prepare(sql)
                    .await
                    .unwrap_or_else(|e| panic!("{sql}: prepare failed: {e:?}"));
                let rows = s
                    .query(&stmt, &[])
                    .await
                    .unwrap_or_else(|e| panic!("{sql}: {e:?}"));
                let got: Vec<String> = stmt
                    .columns()
                    .iter()
                    .map(|c| format!("{} {}", c.name(), c.type_().name()))
                    .collect();
                assert_eq!(&got, columns, "{sql}: columns");
                assert!(!rows.is_empty(), "{sql}: no rows released");
                let charged = stated_charge(&s.take_notices());
                if charge.as_ref() != Some(&charged) {
                    charges_wrong.push(format!(
                        "{sql}\n    documented {charge:?}, charged `{charged}`"
                    ));
                }
                // pgdp's columns are PostgreSQL's for the same SQL, wherever PostgreSQL can
                // describe it: all but pgdp's own forms (MEDIAN, the person_id a unit path adds).
                match direct.prepare(sql).await {
                    Ok(expected) => {
                        let expected: Vec<String> = expected
                            .columns()
                            .iter()
                            .map(|c| format!("{} {}", c.name(), c.type_().name()))
                            .collect();
                        assert_eq!(got, expected, "{sql}: PostgreSQL's columns");
                    }
                    Err(e) => {
                        assert!(
                            pgdp_own_form(sql),
                            "{sql}: PostgreSQL cannot describe it ({e:?}), so its types are not checked"
                        );
                        not_described += 1;
                    }
                }
            }
            Entry::Refused { sql, code, instead } => {
                let err = s
                    .simple_query(sql)
                    .await
                    .map(|_| ())
                    .expect_err(&format!("{sql}: should be refused"));
                assert_eq!(
                    err.code().map(|c| c.code()),
                    Some(code.as_str()),
                    "{sql}: {err:?}"
                );
                s.simple_query(instead)
                    .await
                    .unwrap_or_else(|e| panic!("{instead}: the suggested query failed: {e:?}"));
            }
        }
    }
    assert!(
        not_described <= 6,
        "{not_described} queries PostgreSQL cannot describe: their types go unchecked"
    );
    assert!(
        charges_wrong.is_empty(),
        "docs/queries.md states other charges (Charge: `…`) than pgdp's NOTICEs:\n{}",
        charges_wrong.join("\n")
    );
}

/// SQL that only pgdp answers, so PostgreSQL cannot describe it: MEDIAN (pgdp's aggregate) and
/// the person_id of demo.prescriptions (derived through its unit path; not a column upstream).
fn pgdp_own_form(sql: &str) -> bool {
    sql.contains("MEDIAN(") || (sql.contains("demo.prescriptions") && sql.contains("person_id"))
}

/// The cost a DP answer's NOTICEs state: `epsilon=…, delta=…` or `rho=… (zCDP), delta=…` of
/// `pgdp: charged …;` (without the ε a ρ took, which depends on the session's earlier charges),
/// or `nothing` for an answer replayed, reused or derived from an earlier release.
fn stated_charge(notices: &[String]) -> String {
    for n in notices {
        if let Some(rest) = n.strip_prefix("pgdp: charged ") {
            return rest
                .split([';', ':'])
                .next()
                .unwrap_or_default()
                .to_string();
        }
        if n.contains("charged nothing") {
            return "nothing".to_string();
        }
    }
    format!("no charge stated in {notices:?}")
}

#[tokio::test]
async fn case_sum_and_case_keys_are_close_to_the_truth() {
    let proxy = rich_proxy(82).await;
    let s = proxy.connect().await;
    set_epsilon(&s, 10.0).await;
    let up = upstream_client().await;
    // SUM(CASE … 1 ELSE 0) over people: one measure, bounds [0, 1], one row per person:
    // sensitivity 1, ε share 10, real grid: b ≈ 0.1.
    let Number(women) = s
        .query_one(
            "SELECT SUM(CASE WHEN sex = 'F' THEN 1 ELSE 0 END) FROM demo.people",
            &[],
        )
        .await
        .expect("DP query")
        .get(0);
    let truth: i64 = up
        .query_one("SELECT count(*) FROM demo.people WHERE sex = 'F'", &[])
        .await
        .expect("truth")
        .get(0);
    assert!(
        (women - truth as f64).abs() <= 20.0 * 0.1 + 1.0,
        "{women} vs {truth}"
    );

    // A literal CASE key has a public domain: exactly the three bands, in key order.
    let rows = s
        .query(
            "SELECT CASE WHEN age < 18 THEN 'child' WHEN age < 65 THEN 'adult' ELSE 'senior' END AS band, COUNT(*) FROM demo.people GROUP BY 1",
            &[],
        )
        .await
        .expect("DP query");
    let bands: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
    assert_eq!(bands, ["adult", "child", "senior"]);
    for r in &rows {
        let band: String = r.get(0);
        let n: i64 = r.get(1);
        let (lo, hi) = match band.as_str() {
            "child" => (0, 17),
            "adult" => (18, 64),
            _ => (65, 1000),
        };
        let truth: i64 = up
            .query_one(
                "SELECT count(*) FROM demo.people WHERE age BETWEEN $1 AND $2",
                &[&lo, &hi],
            )
            .await
            .expect("truth")
            .get(0);
        // COUNT(*): sensitivity 1, ε 10, b = 0.1.
        assert!((n - truth).abs() <= 2, "{band}: {n} vs {truth}");
    }
}

#[tokio::test]
async fn count_distinct_of_a_column_is_close_to_the_capped_truth() {
    let proxy = rich_proxy(83).await;
    let s = proxy.connect().await;
    set_epsilon(&s, 10.0).await;
    let n: i64 = s
        .query_one("SELECT COUNT(DISTINCT clinic) FROM demo.visits", &[])
        .await
        .expect("DP query")
        .get(0);
    let truth: i64 = upstream_client()
        .await
        .query_one("SELECT count(DISTINCT clinic) FROM demo.visits", &[])
        .await
        .expect("truth")
        .get(0);
    // Every person keeps at most 10 distinct clinics; with 100 000 people every clinic is kept
    // by someone. Sensitivity 10, ε 10: b = 1, tolerance 20.
    assert!((n - truth).abs() <= 20, "{n} vs {truth}");
}

#[tokio::test]
async fn cte_and_derived_table_match_the_direct_query() {
    let proxy = rich_proxy(84).await;
    let s = proxy.connect().await;
    set_epsilon(&s, 10.0).await;
    let capped: i64 = upstream_client()
        .await
        .query_one(
            "SELECT sum(n)::bigint FROM (SELECT least(count(*), 10) AS n FROM demo.visits WHERE visit_date > DATE '2024-06-01' GROUP BY person_id) t",
            &[],
        )
        .await
        .expect("capped truth")
        .get(0);
    for sql in [
        "WITH recent AS (SELECT * FROM demo.visits WHERE visit_date > DATE '2024-06-01') SELECT COUNT(*) FROM recent",
        "SELECT COUNT(*) FROM (SELECT person_id, visit_date FROM demo.visits) AS v WHERE v.visit_date > DATE '2024-06-01'",
    ] {
        let n: i64 = s.query_one(sql, &[]).await.expect(sql).get(0);
        // COUNT(*) of visits, 10 per person: sensitivity 10, ε 10, b = 1.
        assert!((n - capped).abs() <= 20, "{sql}: {n} vs {capped}");
    }
}

#[tokio::test]
async fn per_person_subqueries_release_averages_and_public_histograms() {
    let proxy = rich_proxy(85).await;
    let s = proxy.connect().await;
    set_epsilon(&s, 10.0).await;
    let up = upstream_client().await;
    let Number(avg) = s
        .query_one(
            "SELECT AVG(n) FROM (SELECT person_id, LEAST(COUNT(*), 20) AS n FROM demo.visits GROUP BY person_id) t",
            &[],
        )
        .await
        .expect("DP query")
        .get(0);
    let truth: f64 = up
        .query_one(
            "SELECT avg(least(n, 20))::float8 FROM (SELECT count(*) AS n FROM demo.visits GROUP BY person_id) t",
            &[],
        )
        .await
        .expect("truth")
        .get(0);
    // Two measures at ε 5 each over ~100 000 people: the mean is off by far less than 0.1.
    assert!((avg - truth).abs() < 0.1, "{avg} vs {truth}");

    let rows = s
        .query(
            "SELECT n_bucket, COUNT(*) FROM (SELECT person_id, LEAST(COUNT(*), 10) AS n_bucket FROM demo.visits GROUP BY person_id) t GROUP BY n_bucket",
            &[],
        )
        .await
        .expect("DP query");
    let keys: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
    // Every person in the subquery has a visit: no row 0, which PostgreSQL never returns.
    assert_eq!(
        keys,
        (1..=10).collect::<Vec<i64>>(),
        "the public domain 1..10"
    );

    // A per-person COUNT(*) left without a bound takes the policy's cap of 10 visits per person
    // (issue 15): the mean is the capped one, as tight as above.
    let Number(avg) = s
        .query_one(
            "SELECT AVG(n) FROM (SELECT person_id, COUNT(*) AS n FROM demo.visits GROUP BY person_id) t",
            &[],
        )
        .await
        .expect("DP query")
        .get(0);
    let truth: f64 = up
        .query_one(
            "SELECT avg(least(n, 10))::float8 FROM (SELECT count(*) AS n FROM demo.visits GROUP BY person_id) t",
            &[],
        )
        .await
        .expect("truth")
        .get(0);
    assert!((avg - truth).abs() < 0.1, "{avg} vs {truth}");

    // An expression of the count has no bound that follows from the policy.
    let refused = s
        .query(
            "SELECT AVG(n) FROM (SELECT person_id, COUNT(*) * 2 AS n FROM demo.visits GROUP BY person_id) t",
            &[],
        )
        .await;
    assert_code(
        refused,
        &SqlState::INSUFFICIENT_PRIVILEGE,
        "unbounded per-person expression",
    );
}

#[tokio::test]
async fn median_is_close_to_the_truth() {
    let proxy = rich_proxy(86).await;
    let s = proxy.connect().await;
    set_epsilon(&s, 10.0).await;
    let median: f64 = s
        .query_one(
            "SELECT PERCENTILE_CONT(0.5) WITHIN GROUP (ORDER BY age) FROM demo.people",
            &[],
        )
        .await
        .expect("DP query")
        .get(0);
    let truth: f64 = upstream_client()
        .await
        .query_one(
            "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY age)::float8 FROM demo.people",
            &[],
        )
        .await
        .expect("truth")
        .get(0);
    // Buckets of 100/256 years; the noise is 2/ε = 0.2 ranks among 100 000: the chosen bucket
    // is the true one or a neighbour.
    assert!((median - truth).abs() <= 1.5, "{median} vs {truth}");
}

/// The keys (the first `keys` columns, as text) of every row `sql` returns.
async fn key_set(
    client: &tokio_postgres::Client,
    sql: &str,
    keys: usize,
) -> std::collections::BTreeSet<Vec<Option<String>>> {
    client
        .simple_query(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .into_iter()
        .filter_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => {
                Some((0..keys).map(|i| r.get(i).map(str::to_string)).collect())
            }
            _ => None,
        })
        .collect()
}

/// Issue 15's wrong answers: a public domain releases only groups the analyst's SQL can return.
/// In these queries every possible group holds many people, so the released groups are exactly
/// the groups PostgreSQL returns for the same SQL (no made-up one, none missing).
#[tokio::test]
async fn public_domains_release_only_groups_the_sql_can_return() {
    let proxy = rich_proxy(91).await;
    let s = proxy.connect().await;
    set_epsilon(&s, 1.0).await;
    let upstream = upstream_client().await;
    let cases = [
        // Two columns of one public table: the pairs its rows hold (10), not 10 × 9 made-up ones.
        ("SELECT r.region, r.population, COUNT(*) FROM demo.people p JOIN demo.regions r ON p.region = r.region GROUP BY r.region, r.population", 2),
        // WHERE on the public table restricts its domain.
        ("SELECT r.name, COUNT(*) FROM demo.people p JOIN demo.regions r ON p.region = r.region WHERE r.population > 2500000 GROUP BY r.name", 1),
        // WHERE on a listed column restricts its domain, also beside a condition on private data.
        ("SELECT region, COUNT(*) FROM demo.people WHERE region IN ('CE', 'EA') AND age > 30 GROUP BY region", 1),
        ("SELECT region, sex, COUNT(*) FROM demo.people WHERE sex <> 'X' AND lower(region) LIKE 's%' GROUP BY region, sex", 2),
        // A CASE without ELSE groups the rows no branch matches under NULL.
        ("SELECT CASE WHEN age < 18 THEN 'child' END AS minor, COUNT(*) FROM demo.people GROUP BY 1", 1),
    ];
    for (sql, keys) in cases {
        let released = key_set(&s, sql, keys).await;
        let truth = key_set(&upstream, sql, keys).await;
        assert_eq!(released, truth, "{sql}");
    }
}

/// One row of README.md's table of refusals: the SQLSTATE, and what shows it.
#[derive(Debug)]
struct ReadmeRefusal {
    code: String,
    shown: Shown,
}

/// What README.md gives to show a claim: statement chains (every statement but the last must
/// succeed; the last is the claim) and `module::test` names of integration tests.
#[derive(Debug, Default)]
struct Shown {
    chains: Vec<Vec<String>>,
    tests: Vec<(String, String)>,
}

/// README.md's "Supported and refused" section.
fn readme_section() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md");
    let text = std::fs::read_to_string(&path).expect("README.md");
    text.split("## Supported and refused")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .expect("README.md has a Supported and refused section")
        .to_string()
}

/// Reads the examples in `text`: each `…` is a statement or a test name; statements joined by
/// the word `then` form one chain. Text between examples must be empty or `then`; a `.` outside
/// the backquotes ends the list.
fn shown_by(text: &str, context: &str) -> Shown {
    let mut shown = Shown::default();
    let mut chained = false;
    for (i, piece) in text.split('`').enumerate() {
        if i % 2 == 0 {
            let between = piece.trim();
            if between.starts_with('.') {
                break;
            }
            chained = between == "then";
            assert!(
                between.is_empty() || chained,
                "README: text between examples must be `then`: {between:?} in {context}"
            );
            continue;
        }
        if !piece.contains(' ') && piece.contains("::") {
            let (module, name) = piece.split_once("::").expect("module::test");
            shown.tests.push((module.to_string(), name.to_string()));
        } else if chained {
            shown
                .chains
                .last_mut()
                .expect("`then` after a statement")
                .push(piece.to_string());
        } else {
            shown.chains.push(vec![piece.to_string()]);
        }
    }
    assert!(
        !shown.chains.is_empty() || !shown.tests.is_empty(),
        "README shows nothing for {context}"
    );
    shown
}

/// Parses the table under "## Supported and refused" in README.md: the last column says what
/// shows each refusal ([`shown_by`]).
fn readme_refusals() -> Vec<ReadmeRefusal> {
    let section = readme_section();
    let mut rows = Vec::new();
    for line in section.lines().filter(|l| l.starts_with("| ")) {
        let cells: Vec<&str> = line.trim_matches('|').split(" | ").map(str::trim).collect();
        assert_eq!(
            cells.len(),
            3,
            "README refusal row with other than 3 cells: {line}"
        );
        if cells[0] == "what" {
            continue;
        }
        let code: String = cells[1].chars().take(5).collect();
        rows.push(ReadmeRefusal {
            code,
            shown: shown_by(cells[2], line),
        });
    }
    rows
}

/// The bullets of README.md's list of what is supported, each with what shows it (the text after
/// its `Shown by`).
fn readme_supported() -> Vec<(String, Shown)> {
    let section = readme_section();
    let list = section
        .split("\nRefused, before anything runs")
        .next()
        .expect("the supported list");
    let mut bullets: Vec<String> = Vec::new();
    for line in list.lines() {
        if line.starts_with("- ") {
            bullets.push(line.to_string());
        } else if let (Some(b), true) = (bullets.last_mut(), line.starts_with("  ")) {
            b.push(' ');
            b.push_str(line.trim());
        }
    }
    bullets
        .into_iter()
        .map(|b| {
            let title = b.split(":**").next().unwrap_or(&b).to_string();
            let (_, shown) = b
                .split_once("Shown by ")
                .unwrap_or_else(|| panic!("README bullet {title} has no `Shown by`"));
            let shown = shown_by(shown, &title);
            (title, shown)
        })
        .collect()
}

/// The test `module::name` exists in tests/integration, and its body, if `code` is given,
/// checks that SQLSTATE.
fn assert_test_exists(module: &str, name: &str, code: Option<&str>) {
    let file = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/integration")
        .join(format!("{module}.rs"));
    let source = std::fs::read_to_string(&file)
        .unwrap_or_else(|e| panic!("{module}::{name}: {}: {e}", file.display()));
    let start = source
        .find(&format!("async fn {name}("))
        .unwrap_or_else(|| panic!("README names {module}::{name}, which does not exist"));
    let body = &source[start..];
    let end = body[1..]
        .find("\n#[tokio::test]")
        .map_or(body.len(), |i| i + 1);
    let body = &body[..end];
    if let Some(code) = code {
        let constant = sqlstate_constant(code);
        assert!(
            body.contains(code) || constant.is_some_and(|c| body.contains(c)),
            "{module}::{name} does not check {code} (README)"
        );
    }
}

/// README.md's table of refusals is what pgdp does: each statement is refused with the row's
/// SQLSTATE and charges nothing, each named test exists and expects that SQLSTATE.
#[tokio::test]
async fn readme_refusals_are_what_pgdp_answers() {
    let rows = readme_refusals();
    assert!(
        rows.len() >= 15,
        "README.md lists only {} refusals",
        rows.len()
    );
    let proxy = rich_proxy(83).await;
    let mut failures = Vec::new();
    for row in &rows {
        for chain in &row.shown.chains {
            // A session of its own, so that a chain's SET does not reach the next.
            let s = proxy.connect().await;
            let before = s.budget().await;
            let (last, prefix) = chain.split_last().expect("a statement");
            for sql in prefix {
                s.simple_query(sql)
                    .await
                    .unwrap_or_else(|e| panic!("{sql}: should run before {last}: {e:?}"));
            }
            match s.simple_query(last).await {
                Ok(_) => failures.push(format!("{last}: answered, README says {}", row.code)),
                Err(e) => {
                    let got = e.code().map(|c| c.code().to_string()).unwrap_or_default();
                    if got != row.code {
                        failures.push(format!("{last}: {got}, README says {} ({e:?})", row.code));
                    }
                }
            }
            s.assert_alive(last).await;
            if s.budget().await != before {
                failures.push(format!("{last}: charged"));
            }
        }
        for (module, name) in &row.shown.tests {
            assert_test_exists(module, name, Some(&row.code));
        }
    }
    assert!(
        failures.is_empty(),
        "README.md disagrees with pgdp:\n{}",
        failures.join("\n")
    );
}

/// README.md's list of what is supported is what pgdp does: every statement a bullet shows is
/// answered (over the simple protocol, and single statements over the extended one too), every
/// test a bullet names exists, and the counts and limits the section states are the code's.
#[tokio::test]
async fn readme_supported_is_what_pgdp_answers() {
    let bullets = readme_supported();
    assert!(
        bullets.len() >= 10,
        "README.md lists only {} kinds of supported SQL",
        bullets.len()
    );
    let proxy = rich_proxy(84).await;
    let mut failures = Vec::new();
    for (title, shown) in &bullets {
        for chain in &shown.chains {
            let s = proxy.connect().await;
            for sql in chain {
                if let Err(e) = s.simple_query(sql).await {
                    failures.push(format!("{title}: {sql}: refused ({e:?})"));
                }
            }
            if let [sql] = chain.as_slice() {
                if let Err(e) = s.query(sql.as_str(), &[]).await {
                    failures.push(format!(
                        "{title}: {sql}: refused over the extended protocol ({e:?})"
                    ));
                }
            }
            s.assert_alive(title).await;
        }
        for (module, name) in &shown.tests {
            assert_test_exists(module, name, None);
        }
    }
    assert!(
        failures.is_empty(),
        "README.md claims what pgdp does not answer:\n{}",
        failures.join("\n")
    );

    // The numbers the section states.
    let section = readme_section();
    let entries = catalogue();
    let runs = entries
        .iter()
        .filter(|e| matches!(e, Entry::Runs { .. }))
        .count();
    let refused = entries.len() - runs;
    let thousands = |n: usize| {
        let digits = n.to_string();
        let mut out = String::new();
        for (i, c) in digits.chars().enumerate() {
            if i > 0 && (digits.len() - i) % 3 == 0 {
                out.push(',');
            }
            out.push(c);
        }
        out
    };
    use pgdp::limits;
    let claims = [
        format!("{runs} analyst queries"),
        format!("{refused} refusals"),
        format!("at most {} per query", limits::AGGREGATES_PER_QUERY_MAX),
        format!("at most {} tables", limits::JOINED_TABLES_MAX),
        format!(
            "at most {} semijoins per query",
            limits::SEMIJOINS_PER_QUERY_MAX
        ),
        format!("at most {} keys", limits::GROUP_KEYS_PER_QUERY_MAX),
        format!(
            "at most {} grouping sets",
            limits::GROUPING_SETS_PER_QUERY_MAX
        ),
        format!("(at most {})", thousands(limits::IN_LIST_VALUES_MAX)),
        format!(
            "a {} s timeout and at most {} at once per analyst",
            limits::CATALOG_STATEMENT_TIMEOUT_MS / 1000,
            limits::CATALOG_QUERIES_PER_ANALYST_MAX
        ),
        format!(
            "too many connections in total ({}) or for one analyst ({})",
            thousands(limits::CONNECTIONS_MAX),
            limits::CONNECTIONS_PER_ANALYST_MAX
        ),
        format!(
            "more than {} prepared statements, {} open cursors or {} rows held in cursors",
            thousands(limits::PREPARED_STATEMENTS_PER_CONNECTION_MAX),
            limits::CURSORS_PER_SESSION_MAX,
            thousands(limits::CURSOR_ROWS_PER_SESSION_MAX)
        ),
        format!(
            "a protocol message over {} MiB",
            limits::MESSAGE_BYTES_MAX / (1024 * 1024)
        ),
    ];
    let flat = section.split_whitespace().collect::<Vec<_>>().join(" ");
    for claim in claims {
        assert!(
            flat.contains(&claim),
            "README.md's Supported and refused section should say {claim:?}"
        );
    }
}

/// README.md's project layout names every file and folder of the repository's top level and
/// of `src/`, `docs/`, `tests/`, `benches/`, `examples/` and `.ci/`.
#[test]
fn readme_layout_names_every_file() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(root.join("README.md")).expect("README.md");
    let layout = text
        .split("## Project layout")
        .nth(1)
        .and_then(|s| s.split("```").nth(1))
        .expect("README.md has a Project layout block");
    let mut missing = Vec::new();
    for dir in ["", "src", "docs", "tests", "benches", "examples", ".ci"] {
        let entries = std::fs::read_dir(root.join(dir)).expect("a folder of the repository");
        for entry in entries {
            let name = entry.expect("a folder entry").file_name();
            let name = name.to_string_lossy();
            // Build output and version control are not the repository's layout.
            if matches!(name.as_ref(), "target" | ".git") {
                continue;
            }
            if name.starts_with('.') && !matches!(name.as_ref(), ".ci" | ".gitignore") {
                continue;
            }
            if !layout.contains(name.as_ref()) {
                missing.push(format!("{dir}/{name}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "README.md's project layout does not name: {}",
        missing.join(", ")
    );
}

/// The tokio-postgres constant the tests use for a SQLSTATE the README names by code.
fn sqlstate_constant(code: &str) -> Option<&'static str> {
    [
        ("53300", "TOO_MANY_CONNECTIONS"),
        ("54000", "PROGRAM_LIMIT_EXCEEDED"),
        ("42P03", "DUPLICATE_CURSOR"),
        ("53400", "CONFIGURATION_LIMIT_EXCEEDED"),
    ]
    .iter()
    .find(|(c, _)| *c == code)
    .map(|(_, name)| *name)
}
