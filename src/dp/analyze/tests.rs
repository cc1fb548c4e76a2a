//! Table-driven tests of analysis: SQL in, the facts of its plan (or the SQLSTATE of its
//! refusal) out, over the demo policy and a few small policies of their own. A plan is summed up
//! on one line by [`summary`], so each row reads like the query it checks:
//!
//! `tables | unit | caps g<groups>/r<rows> | keys | aggregates | outputs | post-processing`
//!
//! Canonical column references print without their generated table alias (`"__dp_t0"."age"` as
//! `age`, and `t1.x` for a table after the first).

use super::*;
use crate::policy::Policy;
use crate::session::classify::{classify, Statement};

const DEMO: &str = include_str!("../../../policies/demo.yaml");

/// A policy with a row-level table, a public table joined to a private one, listed public
/// values and a table with few columns, next to nothing else.
const SMALL: &str = r#"
database: db
analysts:
  a:
    scram_verifier: "SCRAM-SHA-256$4096:cGdkcC10ZXN0LXNhbHQtMQ==$r6rs3eSqXnnzDaEwb3G617CNh9NDVFxQd+xPmWnxk4M=:mYmZ1VMmQU332cWdfJ/Ftq/OUxAAVBM4FRMHVqONj4s="
    budget: { epsilon: 10, delta: 1.0e-5 }
tables:
  s.events:
    kind: private
    columns:
      kind:  { type: text, public_values: [a, b] }
      score: { type: double precision, lower: -1, upper: 1 }
  s.orders:
    kind: private
    privacy_unit: customer
    max_groups_per_unit: 2
    max_rows_per_unit: 3
    columns:
      customer: { type: bigint }
      shop:     { type: integer }
      amount:   { type: numeric, lower: 0, upper: 50 }
      day:      { type: date, groupable: true }
  s.shops:
    kind: public
    columns:
      shop: { type: integer, groupable: true }
      city: { type: text, groupable: true }
"#;

/// What a row of the table expects.
enum Expect {
    /// The plan's [`summary`].
    Plan(&'static str),
    /// A refusal with this SQLSTATE (never message text).
    Refused(&'static str),
}
use Expect::{Plan as Accepted, Refused};

fn policy(yaml: &str) -> Policy {
    crate::policy::parse(yaml).unwrap_or_else(|e| panic!("test policy: {e}"))
}

/// Classifies and analyses `sql` (one query) under `policy` with the policy's schemas as the
/// search path.
fn analyse(policy: &Policy, sql: &str) -> Result<Plan> {
    let mut statements = classify(sql)?;
    assert_eq!(statements.len(), 1, "{sql}: one statement");
    let query = match statements.pop() {
        Some(Statement::Query(q)) | Some(Statement::Explain(q)) => q,
        other => panic!("{sql}: not a query: {other:?}"),
    };
    let ctx = Context {
        policy,
        search_path: policy.schemas(),
    };
    analyze(&query, &ctx)
}

/// `"__dp_t0"."age"` as `age`, `"__dp_t1"."x"` as `t1.x`; other quotes dropped.
fn short(sql: &str) -> String {
    let mut out = sql.replace("\"__dp_t0\".", "");
    for n in 1..10 {
        out = out.replace(&format!("\"__dp_t{n}\"."), &format!("t{n}."));
    }
    out.replace('"', "")
}

fn post(p: &Post) -> String {
    match p {
        Post::Aggregate(i) => format!("a{i}"),
        Post::Key(i) => format!("k{i}"),
        Post::Number(x) => format!("{x}"),
        Post::Text(t) => format!("'{t}'"),
        Post::Null => "null".into(),
        Post::Binary(l, op, r) => format!("({} {op:?} {})", post(l), post(r)),
        Post::Not(x) => format!("not {}", post(x)),
        Post::Negate(x) => format!("-{}", post(x)),
        Post::IsNull(x, true) => format!("{} is null", post(x)),
        Post::IsNull(x, false) => format!("{} is not null", post(x)),
    }
}

/// One line with the facts of a plan that matter for privacy and for the answer.
fn summary(p: &Plan) -> String {
    let tables: Vec<String> = p
        .tables
        .iter()
        .map(|t| match (&t.source, t.private) {
            (Some(_), _) => format!("({})", t.table),
            (None, true) => t.table.clone(),
            (None, false) => format!("{} public", t.table),
        })
        .collect();
    let unit = match &p.unit {
        Unit::Column(c) => short(&c.to_string()),
        Unit::Row { .. } => "row".into(),
    };
    let keys: Vec<String> = p
        .keys
        .iter()
        .map(|k| {
            let domain = match &k.public {
                PublicKeys::No => "selected".to_string(),
                PublicKeys::Listed(v) => format!("listed {}", v.len()),
                PublicKeys::Table { table, column } => format!("from {table}.{column}"),
            };
            format!("{} {:?} {domain}", short(&k.expr), k.ty)
        })
        .collect();
    let aggregates: Vec<String> = p
        .aggregates
        .iter()
        .map(|a| {
            let kind = match a.kind {
                AggregateKind::Quantile { permille } => format!("q{permille}"),
                other => format!("{other:?}"),
            };
            let argument = a.argument.as_deref().map(short).unwrap_or_default();
            let bounds = a
                .bounds
                .map(|b| format!(" [{}, {}]", b.lower, b.upper))
                .unwrap_or_default();
            format!("{kind}({argument}){bounds}")
        })
        .collect();
    let outputs: Vec<String> = p
        .outputs
        .iter()
        .map(|o| match o.source {
            OutputSource::Key(i) => format!("{}=k{i}", o.name),
            OutputSource::Aggregate(i) => format!("{}=a{i}", o.name),
        })
        .collect();
    let mut line = format!(
        "{} | {unit} | g{}/r{} | [{}] | [{}] | [{}]",
        tables.join(", "),
        p.max_groups_per_unit,
        p.max_rows_per_unit,
        keys.join("; "),
        aggregates.join("; "),
        outputs.join(", ")
    );
    if p.filter.is_some() {
        line.push_str(" | where");
    }
    if let Some(h) = &p.having {
        line.push_str(&format!(" | having {}", post(h)));
    }
    for s in &p.order_by {
        line.push_str(&format!(
            " | order {}{}",
            post(&s.value),
            if s.ascending { "" } else { " desc" }
        ));
    }
    if let Some(l) = p.limit {
        line.push_str(&format!(" | limit {l}"));
    }
    if p.offset > 0 {
        line.push_str(&format!(" | offset {}", p.offset));
    }
    for q in &p.parameters {
        line.push_str(&format!(" | ${} {:?}", q.index, q.ty));
    }
    if !p.unique_keys.is_empty() {
        let keys: Vec<String> = p
            .unique_keys
            .iter()
            .map(|(t, c)| format!("{t}.{c}"))
            .collect();
        line.push_str(&format!(" | unique {}", keys.join(", ")));
    }
    line
}

/// Runs a table: every row's outcome must be what it expects; all mismatches are reported.
fn check(policy: &Policy, rows: &[(&str, &str, Expect)]) {
    let mut failures = Vec::new();
    for (name, sql, expect) in rows {
        let got = match analyse(policy, sql) {
            Ok(plan) => Ok(summary(&plan)),
            Err(e) => Err(e.sqlstate().code().to_string()),
        };
        let ok = match (expect, &got) {
            (Accepted(want), Ok(line)) => want == line,
            (Refused(code), Err(got)) => code == got,
            _ => false,
        };
        if !ok {
            let want = match expect {
                Accepted(line) => format!("plan    {line}"),
                Refused(code) => format!("refused {code}"),
            };
            let got = match got {
                Ok(line) => format!("plan    {line}"),
                Err(code) => format!("refused {code}"),
            };
            failures.push(format!("{name}: {sql}\n  want {want}\n  got  {got}"));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

/// Accepted shapes over the demo policy: counts, sums, averages, variances, distinct counts,
/// quantiles, filters, keys, joins, unit paths, subqueries and post-processing.
const DEMO_ACCEPTED: &[(&str, &str, Expect)] = &[
    ("count rows", "SELECT COUNT(*) FROM demo.visits", Accepted("demo.visits | person_id | g1/r10 | [] | [CountRows()] | [count=a0]")),
    ("count people", "SELECT COUNT(*) FROM demo.people", Accepted("demo.people | person_id | g1/r1 | [] | [CountRows()] | [count=a0]")),
    ("search path", "SELECT COUNT(*) FROM visits", Accepted("demo.visits | person_id | g1/r10 | [] | [CountRows()] | [count=a0]")),
    ("count values", "SELECT COUNT(cost) FROM demo.visits", Accepted("demo.visits | person_id | g1/r10 | [] | [CountValues(cost)] | [count=a0]")),
    ("count by private key", "SELECT clinic, COUNT(*) FROM demo.visits GROUP BY clinic", Accepted("demo.visits | person_id | g5/r10 | [clinic Text selected] | [CountRows()] | [clinic=k0, count=a0]")),
    ("count by listed key", "SELECT region, COUNT(*) FROM demo.people GROUP BY region", Accepted("demo.people | person_id | g1/r1 | [region Text listed 10] | [CountRows()] | [region=k0, count=a0]")),
    ("two keys by position", "SELECT sex, region, COUNT(*) FROM demo.people GROUP BY 1, 2", Accepted("demo.people | person_id | g1/r1 | [sex Text listed 3; region Text listed 10] | [CountRows()] | [sex=k0, region=k1, count=a0]")),
    ("aliases", "SELECT sex AS s, AVG(income) AS mean FROM demo.people GROUP BY sex", Accepted("demo.people | person_id | g1/r1 | [sex Text listed 3] | [Avg(income) [0, 250000]] | [s=k0, mean=a0]")),
    ("sum and avg", "SELECT SUM(cost), AVG(cost) FROM demo.visits", Accepted("demo.visits | person_id | g1/r10 | [] | [Sum(cost) [0, 2000]; Avg(cost) [0, 2000]] | [sum=a0, avg=a1]")),
    ("variance and stddev", "SELECT VARIANCE(income), STDDEV(income), VAR_POP(age), STDDEV_POP(age) FROM demo.people", Accepted("demo.people | person_id | g1/r1 | [] | [VarSamp(income) [0, 250000]; StddevSamp(income) [0, 250000]; VarPop(age) [0, 100]; StddevPop(age) [0, 100]] | [variance=a0, stddev=a1, var_pop=a2, stddev_pop=a3]")),
    ("count distinct unit", "SELECT COUNT(DISTINCT person_id) FROM demo.visits", Accepted("demo.visits | person_id | g1/r10 | [] | [CountUnits()] | [count=a0]")),
    ("count distinct value", "SELECT COUNT(DISTINCT clinic) FROM demo.visits", Accepted("demo.visits | person_id | g1/r10 | [] | [CountDistinct(clinic)] | [count=a0]")),
    ("median", "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY age) FROM demo.people", Accepted("demo.people | person_id | g1/r1 | [] | [q500(age) [0, 100]] | [percentile_cont=a0]")),
    ("min and max", "SELECT MIN(age), MAX(age) FROM demo.people", Accepted("demo.people | person_id | g1/r1 | [] | [q10(age) [0, 100]; q990(age) [0, 100]] | [min=a0, max=a1]")),
    ("integer key with bounds", "SELECT age, COUNT(*) FROM demo.people GROUP BY age", Accepted("demo.people | person_id | g1/r1 | [age Integer selected] | [CountRows()] | [age=k0, count=a0]")),
    ("between and in", "SELECT COUNT(*) FROM demo.people WHERE age BETWEEN 18 AND 65 AND region IN ('NO', 'SO')", Accepted("demo.people | person_id | g1/r1 | [] | [CountRows()] | [count=a0] | where")),
    ("like and is null", "SELECT COUNT(*) FROM demo.visits WHERE diagnosis LIKE 'J%' AND cost IS NOT NULL", Accepted("demo.visits | person_id | g1/r10 | [] | [CountRows()] | [count=a0] | where")),
    ("date literal", "SELECT COUNT(*) FROM demo.visits WHERE visit_date >= DATE '2024-01-01'", Accepted("demo.visits | person_id | g1/r10 | [] | [CountRows()] | [count=a0] | where")),
    ("date_trunc key", "SELECT date_trunc('month', visit_date) AS m, COUNT(*) FROM demo.visits GROUP BY 1", Accepted("demo.visits | person_id | g5/r10 | [pg_catalog.date_trunc($__dp_s0$month$__dp_s0$, visit_date) Timestamp selected] | [CountRows()] | [m=k0, count=a0]")),
    ("case key with literal results", "SELECT CASE WHEN age < 18 THEN 'minor' ELSE 'adult' END AS g, COUNT(*) FROM demo.people GROUP BY 1", Accepted("demo.people | person_id | g1/r1 | [CASE WHEN age < 18 THEN $__dp_s0$minor$__dp_s0$ ELSE $__dp_s0$adult$__dp_s0$ END Text listed 2] | [CountRows()] | [g=k0, count=a0]")),
    ("floor key", "SELECT FLOOR(age / 10) AS decade, COUNT(*) FROM demo.people GROUP BY 1", Accepted("demo.people | person_id | g1/r1 | [pg_catalog.floor(CAST((age) AS NUMERIC) / NULLIF(CAST((10) AS NUMERIC), 0)) Numeric selected] | [CountRows()] | [decade=k0, count=a0]")),
    ("arithmetic argument", "SELECT SUM(cost * 2) FROM demo.visits", Accepted("demo.visits | person_id | g1/r10 | [] | [Sum(cost * CAST((2) AS NUMERIC)) [0, 4000]] | [sum=a0]")),
    ("division has no bounds", "SELECT AVG(income / age) FROM demo.people", Refused("42501")),
    ("total function in a filter", "SELECT COUNT(*) FROM demo.visits WHERE lower(clinic) = 'c01'", Accepted("demo.visits | person_id | g1/r10 | [] | [CountRows()] | [count=a0] | where")),
    ("join on the unit", "SELECT p.region, COUNT(*) FROM demo.visits v JOIN demo.people p ON v.person_id = p.person_id GROUP BY p.region", Accepted("demo.visits, demo.people | person_id | g5/r10 | [t1.region Text listed 10] | [CountRows()] | [region=k0, count=a0]")),
    ("join with a public table", "SELECT r.name, COUNT(*) FROM demo.people p JOIN demo.regions r ON p.region = r.region GROUP BY r.name", Accepted("demo.people, demo.regions public | person_id | g1/r1 | [t1.name Text from demo.regions.name] | [CountRows()] | [name=k0, count=a0]")),
    ("unit path", "SELECT drug, COUNT(*) FROM demo.prescriptions GROUP BY drug", Accepted("(demo.prescriptions) | t2.person_id | g5/r20 | [t2.drug Text listed 12] | [CountRows()] | [drug=k0, count=a0] | unique demo.visits.visit_id")),
    ("unit path sum", "SELECT SUM(quantity) FROM demo.prescriptions", Accepted("(demo.prescriptions) | t2.person_id | g1/r20 | [] | [Sum(t2.quantity) [0, 100]] | [sum=a0] | unique demo.visits.visit_id")),
    ("row-level derived table", "SELECT COUNT(*) FROM (SELECT * FROM demo.visits WHERE cost > 100) v", Accepted("(v) | t1.person_id | g1/r10 | [] | [CountRows()] | [count=a0]")),
    ("cte", "WITH v AS (SELECT person_id, clinic FROM demo.visits) SELECT clinic, COUNT(*) FROM v GROUP BY clinic", Accepted("(v) | t1.person_id | g5/r10 | [t1.clinic Text selected] | [CountRows()] | [clinic=k0, count=a0]")),
    ("per-unit subquery", "SELECT COUNT(*) FROM (SELECT person_id FROM demo.visits GROUP BY person_id) u", Accepted("(u) | t1.person_id | g1/r1 | [] | [CountRows()] | [count=a0]")),
    ("having order limit offset", "SELECT clinic, COUNT(*) FROM demo.visits GROUP BY clinic HAVING COUNT(*) > 100 ORDER BY 2 DESC LIMIT 5 OFFSET 1", Accepted("demo.visits | person_id | g5/r10 | [clinic Text selected] | [CountRows()] | [clinic=k0, count=a0] | having (a0 Gt 100) | order a0 desc | limit 5 | offset 1")),
    ("order by key", "SELECT region, AVG(age) FROM demo.people GROUP BY region ORDER BY region", Accepted("demo.people | person_id | g1/r1 | [region Text listed 10] | [Avg(age) [0, 100]] | [region=k0, avg=a0] | order k0")),
    ("having on another aggregate", "SELECT sex, AVG(age) FROM demo.people GROUP BY sex HAVING COUNT(*) > 10", Accepted("demo.people | person_id | g1/r1 | [sex Text listed 3] | [Avg(age) [0, 100]; CountRows()] | [sex=k0, avg=a0] | having (a1 Gt 10)")),
    ("parameter", "SELECT COUNT(*) FROM demo.people WHERE age > $1", Accepted("demo.people | person_id | g1/r1 | [] | [CountRows()] | [count=a0] | where | $1 Integer")),
    ("typed parameters", "SELECT COUNT(*) FROM demo.visits WHERE visit_date > $1 AND clinic = $2", Accepted("demo.visits | person_id | g1/r10 | [] | [CountRows()] | [count=a0] | where | $1 Date | $2 Text")),
    ("explain", "EXPLAIN SELECT COUNT(*) FROM demo.visits", Accepted("demo.visits | person_id | g1/r10 | [] | [CountRows()] | [count=a0]")),
];

/// Refusals over the demo policy, each with its SQLSTATE.
const DEMO_REFUSED: &[(&str, &str, Expect)] = &[
    (
        "unknown table",
        "SELECT COUNT(*) FROM demo.nope",
        Refused("42P01"),
    ),
    (
        "unknown schema",
        "SELECT COUNT(*) FROM secret.visits",
        Refused("42P01"),
    ),
    (
        "unknown column",
        "SELECT COUNT(nope) FROM demo.visits",
        Refused("42703"),
    ),
    (
        "unknown function",
        "SELECT COUNT(*) FROM demo.visits WHERE nope(clinic) = 'c01'",
        Refused("42883"),
    ),
    (
        "timing function",
        "SELECT COUNT(*) FROM demo.visits WHERE pg_sleep(1) IS NULL",
        Refused("42883"),
    ),
    (
        "reserved alias",
        "SELECT COUNT(*) AS __dp_x FROM demo.visits",
        Refused("42501"),
    ),
    (
        "reserved column",
        "SELECT COUNT(__dp_unit) FROM demo.visits",
        Refused("42501"),
    ),
    (
        "window",
        "SELECT COUNT(*) OVER () FROM demo.visits",
        Refused("0A000"),
    ),
    (
        "bare private column",
        "SELECT age FROM demo.people",
        Refused("42501"),
    ),
    ("star", "SELECT * FROM demo.people", Refused("42501")),
    (
        "private column without grouping",
        "SELECT clinic, COUNT(*) FROM demo.visits",
        Refused("42501"),
    ),
    (
        "join not on the unit",
        "SELECT COUNT(*) FROM demo.visits v JOIN demo.people p ON v.visit_id = p.person_id",
        Refused("42501"),
    ),
    (
        "cross join",
        "SELECT COUNT(*) FROM demo.visits, demo.people",
        Refused("0A000"),
    ),
    (
        "left join",
        "SELECT COUNT(*) FROM demo.visits v LEFT JOIN demo.people p ON v.person_id = p.person_id",
        Refused("0A000"),
    ),
    (
        "unbounded argument",
        "SELECT SUM(visit_id) FROM demo.visits",
        Refused("42501"),
    ),
    (
        "key not groupable",
        "SELECT income, COUNT(*) FROM demo.people GROUP BY income",
        Refused("42501"),
    ),
    (
        "unit as key",
        "SELECT person_id, COUNT(*) FROM demo.visits GROUP BY person_id",
        Refused("42501"),
    ),
    (
        "impossible date",
        "SELECT COUNT(*) FROM demo.visits WHERE visit_date > '2024-13-01'",
        Refused("22023"),
    ),
    (
        "impossible date literal",
        "SELECT COUNT(*) FROM demo.visits WHERE visit_date = DATE '2023-02-29'",
        Refused("22023"),
    ),
    (
        "system column",
        "SELECT COUNT(ctid) FROM demo.visits",
        Refused("42703"),
    ),
    (
        "union",
        "SELECT COUNT(*) FROM demo.visits UNION SELECT COUNT(*) FROM demo.people",
        Refused("0A000"),
    ),
    (
        "distinct rows",
        "SELECT DISTINCT clinic FROM demo.visits",
        Refused("0A000"),
    ),
    (
        "nested aggregate",
        "SELECT SUM(COUNT(*)) FROM demo.visits",
        Refused("0A000"),
    ),
    (
        "regex",
        "SELECT COUNT(*) FROM demo.visits WHERE clinic ~ 'C0.*'",
        Refused("0A000"),
    ),
    (
        "cast that can fail",
        "SELECT COUNT(*) FROM demo.visits WHERE CAST(clinic AS integer) > 3",
        Refused("42501"),
    ),
    (
        "like with a column pattern",
        "SELECT COUNT(*) FROM demo.visits WHERE clinic LIKE diagnosis",
        Refused("0A000"),
    ),
    (
        "public table alone",
        "SELECT COUNT(*) FROM demo.regions",
        Refused("0A000"),
    ),
    (
        "order by a private column",
        "SELECT COUNT(*) FROM demo.visits ORDER BY cost",
        Refused("42501"),
    ),
    (
        "limit that is not a number",
        "SELECT COUNT(*) FROM demo.visits LIMIT $1",
        Refused("0A000"),
    ),
];

/// The small policy: a row-level table, a public table joined to a private one.
const SMALL_ROWS: &[(&str, &str, Expect)] = &[
    ("row-level table", "SELECT kind, AVG(score) FROM s.events GROUP BY kind", Accepted("s.events | row | g1/r1 | [kind Text listed 2] | [Avg(score) [-1, 1]] | [kind=k0, avg=a0]")),
    ("row-level count", "SELECT COUNT(*) FROM s.events", Accepted("s.events | row | g1/r1 | [] | [CountRows()] | [count=a0]")),
    ("caps of the table", "SELECT day, SUM(amount) FROM s.orders GROUP BY day", Accepted("s.orders | customer | g2/r3 | [day Date selected] | [Sum(amount) [0, 50]] | [day=k0, sum=a0]")),
    ("public table key", "SELECT sh.city, SUM(o.amount) FROM s.orders o JOIN s.shops sh ON o.shop = sh.shop GROUP BY sh.city", Accepted("s.orders, s.shops public | customer | g2/r3 | [t1.city Text from s.shops.city] | [Sum(amount) [0, 50]] | [city=k0, sum=a0]")),
    ("column not groupable", "SELECT shop, COUNT(*) FROM s.orders GROUP BY shop", Refused("42501")),
    ("two row-level tables joined", "SELECT COUNT(*) FROM s.events e JOIN s.events f ON e.kind = f.kind", Refused("0A000")),
    ("row-level and unit tables joined", "SELECT COUNT(*) FROM s.events e JOIN s.orders o ON e.kind = o.day", Refused("42501")),
];

#[test]
fn demo_queries_are_planned_with_their_caps_keys_and_bounds() {
    check(&policy(DEMO), DEMO_ACCEPTED);
}

#[test]
fn demo_refusals_carry_their_sqlstate() {
    check(&policy(DEMO), DEMO_REFUSED);
}

#[test]
fn row_level_and_public_tables() {
    check(&policy(SMALL), SMALL_ROWS);
}

/// The table checks itself: a wrong expectation must fail (so no row can pass vacuously).
#[test]
#[should_panic(expected = "want plan")]
fn a_wrong_expectation_fails() {
    check(
        &policy(DEMO),
        &[(
            "wrong caps",
            "SELECT COUNT(*) FROM demo.visits",
            Accepted("demo.visits | person_id | g1/r11 | [] | [CountRows()] | [count=a0]"),
        )],
    );
}
