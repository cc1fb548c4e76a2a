//! Table-driven tests of analysis: SQL in, the facts of its plan (or the SQLSTATE of its refusal)
//! out. Each row names its case; an accepted plan is compared as the one-line [`summary`]:
//!
//! `unit=… caps=(g<groups>,r<rows>) [tables=… on=…] [where=…] keys=[…] aggs=[…] out=[…]
//! [having=…] [order=[…]] [limit=…] [offset=…] [params=[…]] [unique=[…]]`
//!
//! - `unit`: the privacy unit column (`row(tN)` for a row-level table); `caps`: most groups per
//!   unit and most rows per unit and group.
//! - `keys`: `expression:type:domain`, the domain `private` (released by partition selection),
//!   `listed[…]` (public values) or `table schema.table.column` (read from a public table).
//! - `aggs`: `kind(argument)[lower,upper]`; `count_units` is `COUNT(DISTINCT <unit>)`, `qNNN` a
//!   quantile in thousandths (MIN and MAX are q10 and q990).
//! - `sets`: with ROLLUP / CUBE / GROUPING SETS, each grouping set's key indices.
//! - `out`: `name=kI` (group key I), `name=aJ` (aggregate J) or `name=g[I, …]` (GROUPING of
//!   keys I, …); HAVING and ORDER BY use the same
//!   indices. `params`: `$n:inferred type/declared SQL type`. `unique`: unit-path keys the plan
//!   relies on being unique upstream.
//!
//! Canonical column references print without the alias `"__dp_t0"` (`"__dp_t0"."age"` as `age`)
//! and as `tN.column` for the others; pgdp's dollar-quoted literals print as `'…'`. Refusals
//! compare [`Error::sqlstate`], never message text.
//!
//! The SQL goes through the session's classifier first, as it does in the proxy (string literals
//! arrive dollar-quoted); the layering test lets a `tests.rs` use the layers above.

use tokio_postgres::error::SqlState;

use super::*;
use crate::policy::Policy;
use crate::session::classify::{classify, Statement};

const DEMO_YAML: &str = include_str!("../../../policies/demo.yaml");

/// What the demo lacks: a row-level table with listed public values, a private table with its
/// own unit and a unit path onto it, a public table keyed by a private one, and a boolean.
const SMALL_YAML: &str = r#"
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
      level: { type: integer, public_values: [1, 2, 3] }
      score: { type: real, lower: -1, upper: 1 }
      ok:    { type: boolean, groupable: true }
  s.orders:
    kind: private
    privacy_unit: customer
    max_groups_per_unit: 2
    max_rows_per_unit: 3
    columns:
      order_id: { type: bigint }
      customer: { type: bigint }
      shop:     { type: integer, groupable: true }
      amount:   { type: numeric, lower: 0, upper: 50 }
      day:      { type: date, groupable: true }
  s.lines:
    kind: private
    unit_path:
      - { column: order_id, references: s.orders, key: order_id }
    max_groups_per_unit: 4
    max_rows_per_unit: 6
    columns:
      order_id: { type: bigint }
      item:     { type: text, groupable: true }
      qty:      { type: integer, lower: 1, upper: 9 }
  s.shops:
    kind: public
    columns:
      shop: { type: integer }
      city: { type: text }
"#;

/// What a row of a table expects.
enum Expect {
    /// Accepted, with this [`summary`].
    Plan(&'static str),
    /// Refused with this SQLSTATE.
    Refused(SqlState),
}
use Expect::{Plan as Accepted, Refused};

/// One row: name, SQL, expectation.
type Row = (&'static str, &'static str, Expect);

/// Which policy (and search_path) a table runs under.
#[derive(Clone, Copy)]
enum On {
    Demo,
    Small,
}

fn policy(on: On) -> Policy {
    let yaml = match on {
        On::Demo => DEMO_YAML,
        On::Small => SMALL_YAML,
    };
    crate::policy::parse(yaml).unwrap_or_else(|e| panic!("test policy does not validate: {e}"))
}

fn search_path(on: On) -> Vec<String> {
    match on {
        On::Demo => vec!["demo".into()],
        On::Small => vec!["s".into()],
    }
}

/// Classifies `sql` (one query, or EXPLAIN of one) as the session does, then analyses it.
fn analyze_sql(sql: &str, ctx: &Context) -> Result<Plan> {
    let mut statements = classify(sql)?;
    assert_eq!(statements.len(), 1, "a row holds one statement: {sql}");
    match statements.remove(0) {
        Statement::Query(query) | Statement::Explain(query) => analyze(&query, ctx),
        other => panic!("a row holds a query: {sql} is {}", other.kind()),
    }
}

// ---------------------------------------------------------------------------------------------
// The summary line
// ---------------------------------------------------------------------------------------------

/// Canonical SQL text made short: `"__dp_t0"."x"` → `x`, `"__dp_tN"."x"` → `tN.x`, pgdp's
/// dollar quotes → `'`.
fn short(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find("\"__dp_t") {
        out.push_str(&rest[..at]);
        let after = &rest[at + "\"__dp_t".len()..];
        let digits: String = after.chars().take_while(char::is_ascii_digit).collect();
        let tail = &after[digits.len()..];
        match tail.strip_prefix("\".\"").and_then(|t| t.split_once('"')) {
            Some((column, next)) if !digits.is_empty() => {
                if digits != "0" {
                    out.push_str(&format!("t{digits}."));
                }
                out.push_str(column);
                rest = next;
            }
            _ => {
                out.push_str("\"__dp_t");
                rest = after;
            }
        }
    }
    out.push_str(rest);
    for n in 0..3 {
        out = out.replace(&format!("$__dp_s{n}$"), "'");
    }
    out
}

fn number(x: f64) -> String {
    format!("{x}")
}

fn bounds(b: &Option<Bounds>) -> String {
    match b {
        Some(b) => format!("[{},{}]", number(b.lower), number(b.upper)),
        None => String::new(),
    }
}

fn aggregate_text(a: &Aggregate) -> String {
    let arg = a
        .argument
        .as_ref()
        .map(|c| short(c.as_str()))
        .unwrap_or_default();
    let head = match a.kind {
        AggregateKind::CountRows => "count(*)".to_string(),
        AggregateKind::CountUnits => "count_units".to_string(),
        AggregateKind::Quantile { permille } => format!("q{permille}({arg})"),
        kind => format!("{}({arg})", kind.sql_name()),
    };
    format!("{head}{}", bounds(&a.bounds))
}

fn key_text(k: &GroupKey) -> String {
    let domain = match &k.public {
        PublicKeys::No => "private".to_string(),
        PublicKeys::Listed { values, .. } => {
            let values: Vec<&str> = values
                .iter()
                .map(|v| v.as_deref().unwrap_or("NULL"))
                .collect();
            format!("listed{values:?}").replace('"', "")
        }
        PublicKeys::Table { table, column, .. } => format!("table {table}.{column}"),
    };
    let ty = format!("{:?}", k.ty).to_lowercase();
    format!("{}:{ty}:{domain}", short(k.expr.as_str()))
}

fn post_text(p: &Post) -> String {
    match p {
        Post::Aggregate(i) => format!("a{i}"),
        Post::Key(i) => format!("k{i}"),
        Post::Number(x) => number(*x),
        Post::Text(t) => format!("'{t}'"),
        Post::Null => "null".into(),
        Post::Binary(l, op, r) => {
            let op = match op {
                PostOp::Eq => "=",
                PostOp::NotEq => "<>",
                PostOp::Lt => "<",
                PostOp::LtEq => "<=",
                PostOp::Gt => ">",
                PostOp::GtEq => ">=",
                PostOp::And => "and",
                PostOp::Or => "or",
                PostOp::Plus => "+",
                PostOp::Minus => "-",
                PostOp::Multiply => "*",
                PostOp::Divide => "/",
            };
            format!("({} {op} {})", post_text(l), post_text(r))
        }
        Post::Not(x) => format!("not {}", post_text(x)),
        Post::Negate(x) => format!("-{}", post_text(x)),
        Post::IsNull(x, true) => format!("{} is null", post_text(x)),
        Post::IsNull(x, false) => format!("{} is not null", post_text(x)),
    }
}

/// A semijoin: `[not ]exists(tables: unit=outer[ where …][ having …])`.
fn semijoin_text(j: &Semijoin) -> String {
    let tables: Vec<&str> = j.tables.iter().map(|t| t.table.as_str()).collect();
    let mut s = format!(
        "{}exists({}: {}={}",
        if j.negated { "not " } else { "" },
        tables.join(","),
        short(&j.unit.to_string()),
        short(&j.outer.to_string())
    );
    if let Some(f) = &j.filter {
        s += &format!(" where {}", short(&f.to_string()));
    }
    if let Some(h) = &j.having {
        s += &format!(" having {}", short(&h.to_string()));
    }
    s + ")"
}

/// The facts of a plan on one line (see the module docs).
fn summary(plan: &Plan) -> String {
    let unit = match &plan.unit {
        Unit::Column(c) if c.alias == "__dp_t0" => c.column.clone(),
        Unit::Column(c) => format!("{}.{}", c.alias.replace("__dp_", ""), c.column),
        Unit::Row { alias } => format!("row({})", alias.replace("__dp_", "")),
    };
    let mut s = format!(
        "unit={unit} caps=(g{},r{})",
        plan.max_groups_per_unit, plan.max_rows_per_unit
    );
    // The tables only when there is more than one policy table, or a subquery.
    let simple = matches!(plan.tables.as_slice(), [t] if t.source.is_none());
    if !simple {
        let tables: Vec<String> = plan
            .tables
            .iter()
            .map(|t| {
                let kind = match (&t.source, t.private) {
                    (Some(_), _) => "sub",
                    (None, true) => "private",
                    (None, false) => "public",
                };
                format!("{}:{kind}", t.table)
            })
            .collect();
        s += &format!(" tables=[{}]", tables.join(", "));
        if !plan.joins.is_empty() {
            let joins: Vec<String> = plan.joins.iter().map(|j| short(&j.to_string())).collect();
            s += &format!(" on=[{}]", joins.join("; "));
        }
    }
    if let Some(f) = &plan.filter {
        s += &format!(" where={}", short(&f.to_string()));
    }
    if !plan.semijoins.is_empty() {
        let semijoins: Vec<String> = plan.semijoins.iter().map(semijoin_text).collect();
        s += &format!(" semi=[{}]", semijoins.join("; "));
    }
    let keys: Vec<String> = plan.keys.iter().map(key_text).collect();
    s += &format!(" keys=[{}]", keys.join(", "));
    if let Some(sets) = &plan.grouping_sets {
        s += &format!(" sets={sets:?}");
    }
    let aggs: Vec<String> = plan.aggregates.iter().map(aggregate_text).collect();
    s += &format!(" aggs=[{}]", aggs.join(", "));
    let outs: Vec<String> = plan
        .outputs
        .iter()
        .map(|o| match &o.source {
            OutputSource::Key(i) => format!("{}=k{i}", o.name),
            OutputSource::Aggregate(i) => format!("{}=a{i}", o.name),
            OutputSource::Computed(i) => format!("{}=c{i}", o.name),
            OutputSource::Grouping(args) => format!("{}=g{args:?}", o.name),
        })
        .collect();
    s += &format!(" out=[{}]", outs.join(", "));
    if let Some(h) = &plan.having {
        s += &format!(" having={}", post_text(h));
    }
    if !plan.order_by.is_empty() {
        let order: Vec<String> = plan
            .order_by
            .iter()
            .map(|o| {
                let dir = if o.ascending { "asc" } else { "desc" };
                let nulls = if o.nulls_first { "first" } else { "last" };
                format!("{} {dir} nulls {nulls}", post_text(&o.value))
            })
            .collect();
        s += &format!(" order=[{}]", order.join(", "));
    }
    if let Some(l) = plan.limit {
        s += &format!(" limit={l}");
    }
    if plan.offset != 0 {
        s += &format!(" offset={}", plan.offset);
    }
    if !plan.parameters.is_empty() {
        let params: Vec<String> = plan
            .parameters
            .iter()
            .map(|p| {
                let declared = p.declared.as_deref().unwrap_or("-");
                format!("${}:{:?}/{declared}", p.index, p.ty).to_lowercase()
            })
            .collect();
        s += &format!(" params=[{}]", params.join(", "));
    }
    if let Some(post) = &plan.post {
        s += &format!(" post=[{}]", short(post.sql()));
    }
    if !plan.unique_keys.is_empty() {
        let keys: Vec<String> = plan
            .unique_keys
            .iter()
            .map(|(t, c)| format!("{t}.{c}"))
            .collect();
        s += &format!(" unique=[{}]", keys.join(", "));
    }
    s
}

/// Runs a table under `on` and fails once, listing every row that did not match.
fn check(on: On, rows: &[Row]) {
    let policy = policy(on);
    let ctx = Context {
        policy: &policy,
        search_path: search_path(on),
    };
    let mut failures = Vec::new();
    let mut names = std::collections::BTreeSet::new();
    for (name, sql, expect) in rows {
        assert!(names.insert(*name), "duplicate row name {name}");
        let got = analyze_sql(sql, &ctx);
        let ok = match (expect, &got) {
            (Expect::Plan(want), Ok(plan)) => summary(plan) == *want,
            (Expect::Refused(code), Err(e)) => e.sqlstate() == *code,
            _ => false,
        };
        if !ok {
            let want = match expect {
                Expect::Plan(p) => format!("plan {p}"),
                Expect::Refused(c) => format!("refused {}", c.code()),
            };
            let got = match &got {
                Ok(plan) => format!("plan {}", summary(plan)),
                Err(e) => format!("refused {} ({e})", e.sqlstate().code()),
            };
            failures.push(format!("{name}: {sql}\n  want {want}\n  got  {got}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} rows failed:\n{}",
        failures.len(),
        rows.len(),
        failures.join("\n")
    );
}

// ---------------------------------------------------------------------------------------------
// Accepted shapes
// ---------------------------------------------------------------------------------------------

#[test]
fn accepted_shapes() {
    check(
        On::Demo,
        &[
            ("count rows", "SELECT COUNT(*) FROM demo.visits", Accepted("unit=person_id caps=(g1,r10) keys=[] aggs=[count(*)] out=[count=a0]")),
            ("month as a date", "SELECT CAST(date_trunc('month', visit_date) AS date) AS m, COUNT(*) FROM demo.visits GROUP BY 1", Accepted("unit=person_id caps=(g5,r10) keys=[CAST(pg_catalog.date_trunc('month', CASE WHEN (visit_date) > '294276-12-31' THEN 'infinity' WHEN (visit_date) < '4714-12-01 BC' THEN '-infinity' ELSE (visit_date) END) AS DATE):date:private] aggs=[count(*)] out=[m=k0, count=a0]")),
            // Regression: date_trunc of a date after 294276 AD, or to the millennium of a date
            // before 4000 BC, failed upstream only when such a row existed (an error channel).
            ("millennium guarded", "SELECT date_trunc('millennium', visit_date) AS m, COUNT(*) FROM demo.visits GROUP BY 1", Accepted("unit=person_id caps=(g5,r10) keys=[pg_catalog.date_trunc('millennium', CASE WHEN (visit_date) > '294276-12-31' THEN 'infinity' WHEN (visit_date) < '4000-01-01 BC' THEN '-infinity' ELSE (visit_date) END):timestamp:private] aggs=[count(*)] out=[m=k0, count=a0]")),
            ("date_trunc of a literal unguarded", "SELECT COUNT(*) FROM demo.visits WHERE visit_date >= date_trunc('year', DATE '2024-05-01')", Accepted("unit=person_id caps=(g1,r10) where=visit_date >= pg_catalog.date_trunc('year', DATE '2024-05-01') keys=[] aggs=[count(*)] out=[count=a0]")),
            // Regression: EXTRACT(hour FROM d) of a date fails upstream only when a row reaches it.
            ("hour of a date", "SELECT COUNT(*) FROM demo.visits WHERE person_id = 5 AND EXTRACT(hour FROM visit_date) = 0", Refused(SqlState::FEATURE_NOT_SUPPORTED)),
            ("minute of a date key", "SELECT EXTRACT(minute FROM visit_date) AS m, COUNT(*) FROM demo.visits GROUP BY 1", Refused(SqlState::FEATURE_NOT_SUPPORTED)),
            ("date_bin weekly", "SELECT date_bin(INTERVAL '1 week', visit_date, DATE '2023-01-02') AS w, COUNT(*) FROM demo.visits GROUP BY 1", Accepted("unit=person_id caps=(g5,r10) keys=[pg_catalog.date_bin('604800 seconds', CASE WHEN (visit_date) > '200000-01-01' THEN 'infinity' WHEN (visit_date) < '4000-01-01 BC' THEN '-infinity' ELSE (visit_date) END, DATE '2023-01-02'):timestamp:private] aggs=[count(*)] out=[w=k0, count=a0]")),
            ("date_bin zero stride", "SELECT date_bin('0 days', visit_date, DATE '2023-01-02') AS w, COUNT(*) FROM demo.visits GROUP BY 1", Refused(SqlState::FEATURE_NOT_SUPPORTED)),
            ("date_bin long stride", "SELECT date_bin('36501 days', visit_date, DATE '2023-01-02') AS w, COUNT(*) FROM demo.visits GROUP BY 1", Refused(SqlState::FEATURE_NOT_SUPPORTED)),
            ("date_bin far origin", "SELECT date_bin('1 day', visit_date, '20000-01-01') AS w, COUNT(*) FROM demo.visits GROUP BY 1", Refused(SqlState::FEATURE_NOT_SUPPORTED)),
            ("to_char month", "SELECT to_char(visit_date, 'YYYY-MM') AS m, COUNT(*) FROM demo.visits GROUP BY 1", Accepted("unit=person_id caps=(g5,r10) keys=[pg_catalog.to_char(CASE WHEN (visit_date) > '294276-12-31' THEN 'infinity' WHEN (visit_date) < '4714-11-25 BC' THEN '-infinity' ELSE (visit_date) END, 'YYYY-MM'):text:private] aggs=[count(*)] out=[m=k0, count=a0]")),
            ("to_char backslash format", "SELECT to_char(visit_date, 'YYYY\\MM') AS m, COUNT(*) FROM demo.visits GROUP BY 1", Refused(SqlState::FEATURE_NOT_SUPPORTED)),
            ("year minus a literal", "SELECT CAST(extract(year from visit_date) AS integer) - 2000 AS y, COUNT(*) FROM demo.visits GROUP BY 1", Accepted("unit=person_id caps=(g5,r10) keys=[EXTRACT(YEAR FROM visit_date):numeric:private] aggs=[count(*)] out=[y=c0, count=a0] post=[SELECT CAST(\"__dp_released\".\"k0\" AS INTEGER) - 2000 AS \"y\", \"__dp_released\".\"a0\" AS \"count\" FROM \"__dp_released\"]")),
            ("year divided refused", "SELECT CAST(extract(year from visit_date) AS integer) / 10 AS y, COUNT(*) FROM demo.visits GROUP BY 1", Refused(SqlState::INSUFFICIENT_PRIVILEGE)),
            ("date cast to timestamp", "SELECT extract(dow from CAST(visit_date AS timestamp)) AS d, COUNT(*) FROM demo.visits GROUP BY 1", Accepted("unit=person_id caps=(g5,r10) keys=[EXTRACT(DOW FROM CAST(CASE WHEN (visit_date) > '294276-12-31' THEN 'infinity' WHEN (visit_date) < '4714-11-24 BC' THEN '-infinity' ELSE (visit_date) END AS TIMESTAMP)):numeric:private] aggs=[count(*)] out=[d=k0, count=a0]")),
            ("date cast to timestamptz refused", "SELECT COUNT(*) FROM demo.visits WHERE CAST(visit_date AS timestamptz) > '2024-01-01'", Refused(SqlState::INSUFFICIENT_PRIVILEGE)),
            ("count filter", "SELECT COUNT(*) FILTER (WHERE cost > 10) FROM demo.visits", Accepted("unit=person_id caps=(g1,r10) keys=[] aggs=[count(CASE WHEN cost > 10 THEN 1 END)] out=[count=a0]")),
            ("sum filter", "SELECT clinic, SUM(cost) FILTER (WHERE diagnosis = 'J06') AS j06 FROM demo.visits GROUP BY clinic", Accepted("unit=person_id caps=(g5,r10) keys=[clinic:text:private] aggs=[sum(CASE WHEN diagnosis = 'J06' THEN cost END)[0,2000]] out=[clinic=k0, j06=a0]")),
            ("count distinct filter", "SELECT COUNT(DISTINCT diagnosis) FILTER (WHERE cost > 10) FROM demo.visits", Accepted("unit=person_id caps=(g1,r10) keys=[] aggs=[count_distinct(CASE WHEN cost > 10 THEN diagnosis END)] out=[count=a0]")),
            ("count people lower case", "select count(*) from demo.people", Accepted("unit=person_id caps=(g1,r1) keys=[] aggs=[count(*)] out=[count=a0]")),
            ("count by clinic", "SELECT clinic, COUNT(*) FROM demo.visits GROUP BY clinic", Accepted("unit=person_id caps=(g5,r10) keys=[clinic:text:private] aggs=[count(*)] out=[clinic=k0, count=a0]")),
            ("count values", "SELECT COUNT(cost) FROM demo.visits", Accepted("unit=person_id caps=(g1,r10) keys=[] aggs=[count(cost)] out=[count=a0]")),
            ("count distinct unit", "SELECT COUNT(DISTINCT person_id) AS patients FROM demo.visits", Accepted("unit=person_id caps=(g1,r10) keys=[] aggs=[count_units] out=[patients=a0]")),
            ("count distinct other", "SELECT COUNT(DISTINCT diagnosis) FROM demo.visits", Accepted("unit=person_id caps=(g1,r10) keys=[] aggs=[count_distinct(diagnosis)] out=[count=a0]")),
            ("sum", "SELECT SUM(cost) FROM demo.visits", Accepted("unit=person_id caps=(g1,r10) keys=[] aggs=[sum(cost)[0,2000]] out=[sum=a0]")),
            ("avg by sex", "SELECT sex, AVG(age) AS mean_age FROM demo.people GROUP BY sex", Accepted("unit=person_id caps=(g1,r1) keys=[sex:text:listed[F, M, X]] aggs=[avg(age)[0,100]] out=[sex=k0, mean_age=a0]")),
            ("variance and stddev", "SELECT VARIANCE(cost), STDDEV(cost) FROM demo.visits", Accepted("unit=person_id caps=(g1,r10) keys=[] aggs=[var_samp(cost)[0,2000], stddev_samp(cost)[0,2000]] out=[variance=a0, stddev=a1]")),
            ("pop and samp variances", "SELECT VAR_POP(income), STDDEV_POP(income), VAR_SAMP(income), STDDEV_SAMP(income) FROM demo.people", Accepted("unit=person_id caps=(g1,r1) keys=[] aggs=[var_pop(income)[0,250000], stddev_pop(income)[0,250000], var_samp(income)[0,250000], stddev_samp(income)[0,250000]] out=[var_pop=a0, stddev_pop=a1, var_samp=a2, stddev_samp=a3]")),
            ("median via percentile_cont", "SELECT PERCENTILE_CONT(0.5) WITHIN GROUP (ORDER BY cost) AS m FROM demo.visits", Accepted("unit=person_id caps=(g1,r10) keys=[] aggs=[q500(cost)[0,2000]] out=[m=a0]")),
            ("median and p90 by region", "SELECT region, MEDIAN(income), PERCENTILE_DISC(0.9) WITHIN GROUP (ORDER BY income) AS p90 FROM demo.people GROUP BY region", Accepted("unit=person_id caps=(g1,r1) keys=[region:text:listed[CE, EA, IS, NE, NO, NW, SE, SO, SW, WE]] aggs=[q500(income)[0,250000], q900(income)[0,250000]] out=[region=k0, median=a0, p90=a1]")),
            ("min and max", "SELECT MIN(age), MAX(age) FROM demo.people", Accepted("unit=person_id caps=(g1,r1) keys=[] aggs=[q10(age)[0,100], q990(age)[0,100]] out=[min=a0, max=a1]")),
            ("shared measures deduplicated", "SELECT AVG(cost), SUM(cost), COUNT(cost), VARIANCE(cost), SUM(cost) FROM demo.visits", Accepted("unit=person_id caps=(g1,r10) keys=[] aggs=[avg(cost)[0,2000], sum(cost)[0,2000], count(cost), var_samp(cost)[0,2000]] out=[avg=a0, sum=a1, count=a2, variance=a3, sum=a1]")),
            ("several aggregates with aliases", "SELECT clinic, COUNT(*) AS visits, SUM(cost) AS total, AVG(cost) AS mean, COUNT(DISTINCT person_id) AS patients FROM demo.visits GROUP BY clinic", Accepted("unit=person_id caps=(g5,r10) keys=[clinic:text:private] aggs=[count(*), sum(cost)[0,2000], avg(cost)[0,2000], count_units] out=[clinic=k0, visits=a0, total=a1, mean=a2, patients=a3]")),
            ("key not selected", "SELECT COUNT(*) FROM demo.visits GROUP BY clinic", Accepted("unit=person_id caps=(g5,r10) keys=[clinic:text:private] aggs=[count(*)] out=[count=a0]")),
            ("key selected twice and after aggregate", "SELECT COUNT(*), clinic, clinic AS c2 FROM demo.visits GROUP BY clinic", Accepted("unit=person_id caps=(g5,r10) keys=[clinic:text:private] aggs=[count(*)] out=[count=a0, clinic=k0, c2=k0]")),
            ("group by alias", "SELECT clinic AS c, COUNT(*) FROM demo.visits GROUP BY c", Accepted("unit=person_id caps=(g5,r10) keys=[clinic:text:private] aggs=[count(*)] out=[c=k0, count=a0]")),
            ("group by position", "SELECT diagnosis, COUNT(*) FROM demo.visits GROUP BY 1", Accepted("unit=person_id caps=(g5,r10) keys=[diagnosis:text:private] aggs=[count(*)] out=[diagnosis=k0, count=a0]")),
            ("search_path resolves bare table", "SELECT COUNT(*) FROM visits", Accepted("unit=person_id caps=(g1,r10) keys=[] aggs=[count(*)] out=[count=a0]")),
            ("quoted identifiers", "SELECT \"clinic\", COUNT(*) FROM \"demo\".\"visits\" GROUP BY \"clinic\"", Accepted("unit=person_id caps=(g5,r10) keys=[clinic:text:private] aggs=[count(*)] out=[clinic=k0, count=a0]")),
            ("table alias", "SELECT COUNT(*) AS n FROM demo.visits AS v WHERE v.clinic = 'C07'", Accepted("unit=person_id caps=(g1,r10) where=clinic = 'C07' keys=[] aggs=[count(*)] out=[n=a0]")),
            ("reserved prefix inside a string is fine", "SELECT COUNT(*) FROM demo.visits WHERE diagnosis = '__dp_x'", Accepted("unit=person_id caps=(g1,r10) where=diagnosis = '__dp_x' keys=[] aggs=[count(*)] out=[count=a0]")),
            ("explain reaches analysis", "EXPLAIN SELECT COUNT(*) FROM demo.visits", Accepted("unit=person_id caps=(g1,r10) keys=[] aggs=[count(*)] out=[count=a0]")),
            ("unquoted upper case folds", "SELECT COUNT(*) FROM DEMO.VISITS WHERE CLINIC = 'C07'", Accepted("unit=person_id caps=(g1,r10) where=clinic = 'C07' keys=[] aggs=[count(*)] out=[count=a0]")),
            ("count distinct non-unit id", "SELECT COUNT(DISTINCT visit_id) FROM demo.visits", Accepted("unit=person_id caps=(g1,r10) keys=[] aggs=[count_distinct(visit_id)] out=[count=a0]")),
            ("count of constant", "SELECT COUNT(1) FROM demo.visits", Accepted("unit=person_id caps=(g1,r10) keys=[] aggs=[count(1)] out=[count=a0]")),
            ("count distinct row", "SELECT COUNT(DISTINCT ROW(clinic, diagnosis)) FROM demo.visits", Accepted("unit=person_id caps=(g1,r10) keys=[] aggs=[count_distinct(ROW(clinic, diagnosis))] out=[count=a0]")),
            ("count distinct tuple", "SELECT clinic, COUNT(DISTINCT (diagnosis, cost)) AS n FROM demo.visits GROUP BY clinic", Accepted("unit=person_id caps=(g5,r10) keys=[clinic:text:private] aggs=[count_distinct(ROW(diagnosis, cost))] out=[clinic=k0, n=a0]")),
            ("count distinct row of one", "SELECT COUNT(DISTINCT ROW(clinic)) FROM demo.visits", Accepted("unit=person_id caps=(g1,r10) keys=[] aggs=[count_distinct(ROW(clinic))] out=[count=a0]")),
            ("count distinct row of an unknown column", "SELECT COUNT(DISTINCT ROW(clinic, nowhere)) FROM demo.visits", Refused(SqlState::UNDEFINED_COLUMN)),
            ("count distinct row of a subquery", "SELECT COUNT(DISTINCT ROW(clinic, (SELECT 1))) FROM demo.visits", Refused(SqlState::FEATURE_NOT_SUPPORTED)),
            // PostgreSQL: function sum(record) does not exist.
            ("sum distinct row refused", "SELECT SUM(DISTINCT ROW(cost)) FROM demo.visits", Refused(SqlState::UNDEFINED_FUNCTION)),
            ("count of groups", "SELECT count(*) AS count_1 FROM (SELECT demo.visits.clinic AS c FROM demo.visits WHERE demo.visits.cost > 10 GROUP BY demo.visits.clinic) AS anon_1", Accepted("unit=person_id caps=(g1,r10) where=cost > 10 keys=[] aggs=[count_distinct(ROW(clinic))] out=[count_1=a0]")),
            ("count of distinct selections", "SELECT COUNT(*) FROM (SELECT DISTINCT clinic, diagnosis FROM demo.visits) subquery", Accepted("unit=person_id caps=(g1,r10) keys=[] aggs=[count_distinct(ROW(clinic, diagnosis))] out=[count=a0]")),
        ],
    );
}

#[test]
fn filters() {
    check(
        On::Demo,
        &[
            ("where comparisons and or not", "SELECT COUNT(*) FROM demo.people WHERE (age >= 18 AND age < 65) OR NOT sex = 'F'", Accepted("unit=person_id caps=(g1,r1) where=(age >= 18 AND age < 65) OR NOT sex = 'F' keys=[] aggs=[count(*)] out=[count=a0]")),
            ("where in list", "SELECT COUNT(*) FROM demo.visits WHERE diagnosis IN ('J06', 'I10')", Accepted("unit=person_id caps=(g1,r10) where=diagnosis IN ('J06', 'I10') keys=[] aggs=[count(*)] out=[count=a0]")),
            ("where not in list", "SELECT COUNT(*) FROM demo.visits WHERE diagnosis NOT IN ('Z00')", Accepted("unit=person_id caps=(g1,r10) where=diagnosis NOT IN ('Z00') keys=[] aggs=[count(*)] out=[count=a0]")),
            ("where any of an array", "SELECT COUNT(*) FROM demo.visits WHERE diagnosis = ANY(ARRAY['J06', 'I10'])", Accepted("unit=person_id caps=(g1,r10) where=diagnosis IN ('J06', 'I10') keys=[] aggs=[count(*)] out=[count=a0]")),
            ("where all of an array", "SELECT COUNT(*) FROM demo.visits WHERE diagnosis <> ALL (ARRAY['Z00'])", Accepted("unit=person_id caps=(g1,r10) where=diagnosis NOT IN ('Z00') keys=[] aggs=[count(*)] out=[count=a0]")),
            ("where between dates", "SELECT SUM(cost) FROM demo.visits WHERE visit_date BETWEEN DATE '2024-01-01' AND DATE '2024-03-31'", Accepted("unit=person_id caps=(g1,r10) where=visit_date BETWEEN DATE '2024-01-01' AND DATE '2024-03-31' keys=[] aggs=[sum(cost)[0,2000]] out=[sum=a0]")),
            ("where date against string", "SELECT COUNT(*) FROM demo.visits WHERE visit_date >= '2024-06-01'", Accepted("unit=person_id caps=(g1,r10) where=visit_date >= '2024-06-01' keys=[] aggs=[count(*)] out=[count=a0]")),
            ("where is null", "SELECT COUNT(*) FROM demo.visits WHERE diagnosis IS NOT NULL AND cost IS NULL", Accepted("unit=person_id caps=(g1,r10) where=diagnosis IS NOT NULL AND cost IS NULL keys=[] aggs=[count(*)] out=[count=a0]")),
            ("where like", "SELECT COUNT(*) FROM demo.visits WHERE diagnosis LIKE 'J%'", Accepted("unit=person_id caps=(g1,r10) where=diagnosis LIKE 'J%' keys=[] aggs=[count(*)] out=[count=a0]")),
            ("where not ilike", "SELECT COUNT(*) FROM demo.visits WHERE diagnosis NOT ILIKE 'z99.%'", Accepted("unit=person_id caps=(g1,r10) where=diagnosis NOT ILIKE 'z99.%' keys=[] aggs=[count(*)] out=[count=a0]")),
            ("where division is null-safe", "SELECT COUNT(*) FROM demo.people WHERE income / age > 1000", Accepted("unit=person_id caps=(g1,r1) where=income / NULLIF(CAST((age) AS NUMERIC), 0) > 1000 keys=[] aggs=[count(*)] out=[count=a0]")),
            ("where case", "SELECT COUNT(*) FROM demo.people WHERE CASE WHEN age < 18 THEN income > 0 ELSE income > 50000 END", Accepted("unit=person_id caps=(g1,r1) where=CASE WHEN age < 18 THEN income > 0 ELSE income > 50000 END keys=[] aggs=[count(*)] out=[count=a0]")),
            ("where text functions", "SELECT COUNT(*) FROM demo.visits WHERE lower(clinic) = 'c07' AND length(diagnosis) = 3", Accepted("unit=person_id caps=(g1,r10) where=pg_catalog.lower(clinic) = 'c07' AND pg_catalog.length(diagnosis) = 3 keys=[] aggs=[count(*)] out=[count=a0]")),
            ("where extract", "SELECT COUNT(*) FROM demo.visits WHERE EXTRACT(MONTH FROM visit_date) IN (12, 1, 2)", Accepted("unit=person_id caps=(g1,r10) where=EXTRACT(MONTH FROM visit_date) IN (12, 1, 2) keys=[] aggs=[count(*)] out=[count=a0]")),
            ("where on the unit", "SELECT COUNT(*) FROM demo.visits WHERE person_id < 1000", Accepted("unit=person_id caps=(g1,r10) where=person_id < 1000 keys=[] aggs=[count(*)] out=[count=a0]")),
            ("where cast to text", "SELECT COUNT(*) FROM demo.people WHERE age::text LIKE '1%'", Accepted("unit=person_id caps=(g1,r1) where=age::TEXT LIKE '1%' keys=[] aggs=[count(*)] out=[count=a0]")),
            ("where concatenation", "SELECT COUNT(*) FROM demo.visits WHERE clinic || '/' || diagnosis = 'C07/J06'", Accepted("unit=person_id caps=(g1,r10) where=clinic || '/' || diagnosis = 'C07/J06' keys=[] aggs=[count(*)] out=[count=a0]")),
            ("where coalesce nullif greatest", "SELECT COUNT(*) FROM demo.visits WHERE COALESCE(NULLIF(cost, 0), 1) > 10 AND greatest(cost, 5) < 100", Accepted("unit=person_id caps=(g1,r10) where=COALESCE(NULLIF(cost, 0), 1) > 10 AND GREATEST(cost, 5) < 100 keys=[] aggs=[count(*)] out=[count=a0]")),
            ("where is true", "SELECT COUNT(*) FROM demo.people WHERE (age > 30) IS TRUE", Accepted("unit=person_id caps=(g1,r1) where=(age > 30) IS TRUE keys=[] aggs=[count(*)] out=[count=a0]")),
            ("where timestamp literal", "SELECT COUNT(*) FROM demo.visits WHERE date_trunc('week', visit_date) = TIMESTAMP '2024-01-01 00:00:00'", Accepted("unit=person_id caps=(g1,r10) where=pg_catalog.date_trunc('week', CASE WHEN (visit_date) > '294276-12-31' THEN 'infinity' WHEN (visit_date) < '4714-12-01 BC' THEN '-infinity' ELSE (visit_date) END) = TIMESTAMP '2024-01-01 00:00:00' keys=[] aggs=[count(*)] out=[count=a0]")),
            ("where on the unit with a literal", "SELECT SUM(cost) FROM demo.visits WHERE person_id = 5", Accepted("unit=person_id caps=(g1,r10) where=person_id = 5 keys=[] aggs=[sum(cost)[0,2000]] out=[sum=a0]")),
            ("where division by zero literal", "SELECT COUNT(*) FROM demo.visits WHERE cost / 0 IS NULL", Accepted("unit=person_id caps=(g1,r10) where=cost / NULLIF(CAST((0) AS NUMERIC), 0) IS NULL keys=[] aggs=[count(*)] out=[count=a0]")),
            ("where boolean literal", "SELECT COUNT(*) FROM demo.visits WHERE true", Accepted("unit=person_id caps=(g1,r10) where=true keys=[] aggs=[count(*)] out=[count=a0]")),
        ],
    );
}

// ---------------------------------------------------------------------------------------------
// Bounds derivation
// ---------------------------------------------------------------------------------------------

#[test]
fn bounds_derivation() {
    check(
        On::Demo,
        &[
            ("affine", "SELECT SUM(cost * 1.2 + 5) FROM demo.visits", Accepted("unit=person_id caps=(g1,r10) keys=[] aggs=[sum(cost * 1.2 + CAST((5) AS NUMERIC))[5,2405]] out=[sum=a0]")),
            ("shifted", "SELECT SUM(cost + 100) FROM demo.visits", Accepted("unit=person_id caps=(g1,r10) keys=[] aggs=[sum(cost + CAST((100) AS NUMERIC))[100,2100]] out=[sum=a0]")),
            ("division by literal", "SELECT AVG(income / 1000) AS income_k FROM demo.people", Accepted("unit=person_id caps=(g1,r1) keys=[] aggs=[avg(income / NULLIF(CAST((1000) AS NUMERIC), 0))[0,250]] out=[income_k=a0]")),
            ("case with else", "SELECT SUM(CASE WHEN diagnosis = 'I10' THEN cost ELSE 0 END) FROM demo.visits", Accepted("unit=person_id caps=(g1,r10) keys=[] aggs=[sum(CASE WHEN diagnosis = 'I10' THEN cost ELSE 0 END)[0,2000]] out=[sum=a0]")),
            ("case without else", "SELECT AVG(CASE WHEN sex = 'F' THEN income END) FROM demo.people", Accepted("unit=person_id caps=(g1,r1) keys=[] aggs=[avg(CASE WHEN sex = 'F' THEN income END)[0,250000]] out=[avg=a0]")),
            ("negated", "SELECT SUM(-cost) FROM demo.visits", Accepted("unit=person_id caps=(g1,r10) keys=[] aggs=[sum(-cost)[-2000,-0]] out=[sum=a0]")),
            ("abs of difference", "SELECT AVG(abs(age - 50)) FROM demo.people", Accepted("unit=person_id caps=(g1,r1) keys=[] aggs=[avg(pg_catalog.abs(CAST((age) AS NUMERIC) - CAST((50) AS NUMERIC)))[0,50]] out=[avg=a0]")),
            ("least", "SELECT SUM(LEAST(cost, 500)) FROM demo.visits", Accepted("unit=person_id caps=(g1,r10) keys=[] aggs=[sum(LEAST(cost, 500))[0,500]] out=[sum=a0]")),
            ("greatest", "SELECT SUM(GREATEST(cost, 500)) FROM demo.visits", Accepted("unit=person_id caps=(g1,r10) keys=[] aggs=[sum(GREATEST(cost, 500))[500,2000]] out=[sum=a0]")),
            ("round negative digits", "SELECT AVG(round(income, -3)) FROM demo.people", Accepted("unit=person_id caps=(g1,r1) keys=[] aggs=[avg(pg_catalog.round(income, -3))[0,250000]] out=[avg=a0]")),
            ("coalesce", "SELECT SUM(COALESCE(cost, 0)) FROM demo.visits", Accepted("unit=person_id caps=(g1,r10) keys=[] aggs=[sum(COALESCE(cost, 0))[0,2000]] out=[sum=a0]")),
            ("integer product", "SELECT AVG(age * 12) FROM demo.people", Accepted("unit=person_id caps=(g1,r1) keys=[] aggs=[avg(CAST((age) AS NUMERIC) * CAST((12) AS NUMERIC))[0,1200]] out=[avg=a0]")),
            ("product of columns", "SELECT SUM(age * age) FROM demo.people", Accepted("unit=person_id caps=(g1,r1) keys=[] aggs=[sum(CAST((age) AS NUMERIC) * CAST((age) AS NUMERIC))[0,10000]] out=[sum=a0]")),
            ("constant", "SELECT SUM(1) FROM demo.visits", Accepted("unit=person_id caps=(g1,r10) keys=[] aggs=[sum(1)[0.5,1.5]] out=[sum=a0]")),
            ("extract month", "SELECT AVG(EXTRACT(MONTH FROM visit_date)) FROM demo.visits", Accepted("unit=person_id caps=(g1,r10) keys=[] aggs=[avg(EXTRACT(MONTH FROM visit_date))[1,12]] out=[avg=a0]")),
            ("floor and ceil", "SELECT SUM(floor(cost)), AVG(ceil(cost / 10)) FROM demo.visits", Accepted(r#"unit=person_id caps=(g1,r10) keys=[] aggs=[sum(pg_catalog."floor"(cost))[0,2000], avg(pg_catalog."ceil"(cost / NULLIF(CAST((10) AS NUMERIC), 0)))[0,200]] out=[sum=a0, avg=a1]"#)),
            ("indicator", "SELECT SUM(CASE WHEN sex = 'F' THEN 1 ELSE 0 END) AS women FROM demo.people", Accepted("unit=person_id caps=(g1,r1) keys=[] aggs=[sum(CASE WHEN sex = 'F' THEN 1 ELSE 0 END)[0,1]] out=[women=a0]")),
            ("quantile of expression", "SELECT MEDIAN(cost / 2) FROM demo.visits", Accepted("unit=person_id caps=(g1,r10) keys=[] aggs=[q500(cost / NULLIF(CAST((2) AS NUMERIC), 0))[0,1000]] out=[median=a0]")),
            ("derived column keeps scaled bounds", "SELECT SUM(cost) FROM (SELECT person_id, cost * 1000 AS cost FROM demo.visits) t", Accepted("unit=t1.person_id caps=(g1,r10) tables=[t:sub] keys=[] aggs=[sum(t1.cost)[0,2000000]] out=[sum=a0]")),
            ("per-unit sum clamped by least", "SELECT SUM(n) FROM (SELECT person_id, LEAST(SUM(cost), 5) AS n FROM demo.visits GROUP BY person_id) t", Accepted("unit=t1.person_id caps=(g1,r1) tables=[t:sub] keys=[] aggs=[sum(t1.n)[0,5]] out=[sum=a0]")),
            ("sum of greatest per unit", "SELECT SUM(g) FROM (SELECT person_id, GREATEST(MAX(cost), 100) AS g FROM demo.visits GROUP BY person_id) t", Accepted("unit=t1.person_id caps=(g1,r1) tables=[t:sub] keys=[] aggs=[sum(t1.g)[100,2000]] out=[sum=a0]")),
        ],
    );
}

// ---------------------------------------------------------------------------------------------
// Key domains
// ---------------------------------------------------------------------------------------------

#[test]
fn key_domains() {
    check(
        On::Demo,
        &[
            ("listed text key", "SELECT region, COUNT(*) FROM demo.people GROUP BY region", Accepted("unit=person_id caps=(g1,r1) keys=[region:text:listed[CE, EA, IS, NE, NO, NW, SE, SO, SW, WE]] aggs=[count(*)] out=[region=k0, count=a0]")),
            ("two listed keys", "SELECT sex, education, COUNT(*) AS n FROM demo.people GROUP BY sex, education", Accepted("unit=person_id caps=(g1,r1) keys=[sex:text:listed[F, M, X], education:text:listed[bachelor, master, none, primary, secondary, vocational]] aggs=[count(*)] out=[sex=k0, education=k1, n=a0]")),
            ("bounded integer key", "SELECT age, COUNT(*) FROM demo.people GROUP BY age", Accepted("unit=person_id caps=(g1,r1) keys=[age:integer:private] aggs=[count(*)] out=[age=k0, count=a0]")),
            ("groupable text key is private", "SELECT diagnosis, COUNT(*) FROM demo.visits GROUP BY diagnosis", Accepted("unit=person_id caps=(g5,r10) keys=[diagnosis:text:private] aggs=[count(*)] out=[diagnosis=k0, count=a0]")),
            ("public and private keys", "SELECT sex, age, clinic, COUNT(*) FROM demo.people JOIN demo.visits USING (person_id) GROUP BY sex, age, clinic", Accepted("unit=person_id caps=(g5,r10) tables=[demo.people:private, demo.visits:private] on=[person_id = t1.person_id] keys=[sex:text:listed[F, M, X], age:integer:private, t1.clinic:text:private] aggs=[count(*)] out=[sex=k0, age=k1, clinic=k2, count=a0]")),
            ("date_trunc key", "SELECT date_trunc('month', visit_date) AS month, COUNT(*) FROM demo.visits GROUP BY 1", Accepted("unit=person_id caps=(g5,r10) keys=[pg_catalog.date_trunc('month', CASE WHEN (visit_date) > '294276-12-31' THEN 'infinity' WHEN (visit_date) < '4714-12-01 BC' THEN '-infinity' ELSE (visit_date) END):timestamp:private] aggs=[count(*)] out=[month=k0, count=a0]")),
            ("extract cast key", "SELECT EXTRACT(YEAR FROM visit_date)::int AS y, date_part('dow', visit_date)::smallint AS d, COUNT(*) FROM demo.visits GROUP BY 1, 2", Accepted("unit=person_id caps=(g5,r10) keys=[EXTRACT(YEAR FROM visit_date):numeric:private, pg_catalog.date_part('dow', CASE WHEN (visit_date) > '294276-12-31' THEN 'infinity' WHEN (visit_date) < '4714-11-25 BC' THEN '-infinity' ELSE (visit_date) END):numeric:private] aggs=[count(*)] out=[y=c0, d=c1, count=a0] post=[SELECT \"__dp_released\".\"k0\"::INT AS \"y\", \"__dp_released\".\"k1\"::SMALLINT AS \"d\", \"__dp_released\".\"a0\" AS \"count\" FROM \"__dp_released\"]")),
            ("extract keys", "SELECT EXTRACT(year FROM visit_date) AS y, EXTRACT(quarter FROM visit_date) AS q, COUNT(*) FROM demo.visits GROUP BY 1, 2", Accepted("unit=person_id caps=(g5,r10) keys=[EXTRACT(YEAR FROM visit_date):numeric:private, EXTRACT(QUARTER FROM visit_date):numeric:private] aggs=[count(*)] out=[y=k0, q=k1, count=a0]")),
            ("case literal key", "SELECT CASE WHEN age < 18 THEN 'child' WHEN age < 65 THEN 'adult' ELSE 'senior' END AS band, COUNT(*) FROM demo.people GROUP BY 1", Accepted("unit=person_id caps=(g1,r1) keys=[CASE WHEN age < 18 THEN 'child' WHEN age < 65 THEN 'adult' ELSE 'senior' END:text:listed[adult, child, senior]] aggs=[count(*)] out=[band=k0, count=a0]")),
            ("case integer key over non-groupable", "SELECT CASE WHEN cost >= 500 THEN 1 ELSE 0 END AS expensive, COUNT(*) FROM demo.visits GROUP BY 1", Accepted("unit=person_id caps=(g5,r10) keys=[CASE WHEN cost >= 500 THEN 1 ELSE 0 END:integer:listed[0, 1]] aggs=[count(*)] out=[expensive=k0, count=a0]")),
            ("case key with column result", "SELECT CASE WHEN age < 18 THEN 'child' ELSE sex END AS k, COUNT(*) FROM demo.people GROUP BY 1", Accepted("unit=person_id caps=(g1,r1) keys=[CASE WHEN age < 18 THEN 'child' ELSE sex END:text:private] aggs=[count(*)] out=[k=k0, count=a0]")),
            ("floor band key", "SELECT floor(age/10)*10 AS band, COUNT(*) FROM demo.people GROUP BY 1", Accepted(r#"unit=person_id caps=(g1,r1) keys=[pg_catalog."floor"(pg_catalog.div(CAST((age) AS NUMERIC), NULLIF(CAST((10) AS NUMERIC), 0))) * CAST((10) AS NUMERIC):numeric:private] aggs=[count(*)] out=[band=k0, count=a0]"#)),
            ("round band key", "SELECT round(age, -1) AS decade, COUNT(*) FROM demo.people GROUP BY round(age, -1)", Accepted("unit=person_id caps=(g1,r1) keys=[pg_catalog.round(age, -1):numeric:private] aggs=[count(*)] out=[decade=k0, count=a0]")),
            ("lower of listed key", "SELECT lower(region), COUNT(*) FROM demo.people GROUP BY lower(region)", Accepted("unit=person_id caps=(g1,r1) keys=[pg_catalog.lower(region):text:private] aggs=[count(*)] out=[lower=k0, count=a0]")),
            ("cast of integer key", "SELECT CAST(age AS text), COUNT(*) FROM demo.people GROUP BY CAST(age AS text)", Accepted("unit=person_id caps=(g1,r1) keys=[CAST(age AS TEXT):text:private] aggs=[count(*)] out=[age=k0, count=a0]")),
            ("public table key", "SELECT r.name, COUNT(*) FROM demo.people p JOIN demo.regions r ON p.region = r.region GROUP BY r.name", Accepted("unit=person_id caps=(g1,r1) tables=[demo.people:private, demo.regions:public] on=[region = t1.region] keys=[t1.name:text:table demo.regions.name] aggs=[count(*)] out=[name=k0, count=a0]")),
            ("duplicate key collapses", "SELECT region, COUNT(*) FROM demo.people GROUP BY region, region", Accepted("unit=person_id caps=(g1,r1) keys=[region:text:listed[CE, EA, IS, NE, NO, NW, SE, SO, SW, WE]] aggs=[count(*)] out=[region=k0, count=a0]")),
            // Documented (analyze/expr.rs): the NULL group of a CASE without ELSE is not released.
            // width_bucket with literal bounds and count: the n + 2 buckets 0 … n + 1 (issue 42).
            ("width_bucket key", "SELECT width_bucket(age, 0, 100, 4) AS b, COUNT(*) FROM demo.people GROUP BY 1", Accepted("unit=person_id caps=(g1,r1) keys=[pg_catalog.width_bucket(age, 0, 100, 4):integer:listed[0, 1, 2, 3, 4, 5]] aggs=[count(*)] out=[b=k0, count=a0]")),
            ("width_bucket key of a numeric column, NaN guarded", "SELECT width_bucket(cost, -0.5, 2000.5, 2) AS b, COUNT(*) FROM demo.visits GROUP BY 1", Accepted("unit=person_id caps=(g5,r10) keys=[pg_catalog.width_bucket(CASE WHEN (cost) = 'NaN' THEN NULL ELSE (cost) END, -0.5, 2000.5, 2):integer:listed[0, 1, 2, 3]] aggs=[count(*)] out=[b=k0, count=a0]")),
            ("width_bucket non-literal bound", "SELECT width_bucket(age, 0, income, 10) AS b, COUNT(*) FROM demo.people GROUP BY 1", Refused(SqlState::FEATURE_NOT_SUPPORTED)),
            ("width_bucket zero count", "SELECT width_bucket(age, 0, 100, 0) AS b, COUNT(*) FROM demo.people GROUP BY 1", Refused(SqlState::INVALID_PARAMETER_VALUE)),
            ("width_bucket equal bounds", "SELECT width_bucket(age, 5, 5.0, 3) AS b, COUNT(*) FROM demo.people GROUP BY 1", Refused(SqlState::INVALID_PARAMETER_VALUE)),
            ("width_bucket too many buckets", "SELECT width_bucket(age, 0, 100, 1001) AS b, COUNT(*) FROM demo.people GROUP BY 1", Refused(SqlState::INVALID_PARAMETER_VALUE)),
            ("width_bucket of text", "SELECT width_bucket(sex, 0, 100, 10) AS b, COUNT(*) FROM demo.people GROUP BY 1", Refused(SqlState::FEATURE_NOT_SUPPORTED)),
            ("width_bucket of the unit", "SELECT width_bucket(person_id, 0, 100, 10) AS b, COUNT(*) FROM demo.people GROUP BY 1", Refused(SqlState::INSUFFICIENT_PRIVILEGE)),
            ("width_bucket in an aggregate", "SELECT SUM(width_bucket(age, 0, 100, 10)) FROM demo.people", Accepted("unit=person_id caps=(g1,r1) keys=[] aggs=[sum(pg_catalog.width_bucket(age, 0, 100, 10))[0,11]] out=[sum=a0]")),
            ("case key without else", "SELECT CASE WHEN age < 18 THEN 'child' END AS minor, COUNT(*) FROM demo.people GROUP BY 1", Accepted("unit=person_id caps=(g1,r1) keys=[CASE WHEN age < 18 THEN 'child' END:text:listed[child, NULL]] aggs=[count(*)] out=[minor=k0, count=a0]")),
            ("public key joined on a non-groupable column", "SELECT r.name, COUNT(*) FROM demo.people p JOIN demo.regions r ON p.income = r.population GROUP BY r.name", Accepted("unit=person_id caps=(g1,r1) tables=[demo.people:private, demo.regions:public] on=[income = t1.population] keys=[t1.name:text:table demo.regions.name] aggs=[count(*)] out=[name=k0, count=a0]")),
            ("renamed unit as key", "SELECT x, COUNT(*) FROM (SELECT person_id AS x FROM demo.visits) t GROUP BY x", Refused(SqlState::INSUFFICIENT_PRIVILEGE)),
            ("renamed id as groupable name", "SELECT clinic, COUNT(*) FROM (SELECT person_id, visit_id AS clinic FROM demo.visits) t GROUP BY clinic", Refused(SqlState::INSUFFICIENT_PRIVILEGE)),
            ("renamed non-groupable as key", "SELECT c, COUNT(*) FROM (SELECT person_id, cost AS c FROM demo.visits) t GROUP BY c", Refused(SqlState::INSUFFICIENT_PRIVILEGE)),
        ],
    );
}

/// Key domains the demo policy has no example of: listed integers and booleans, public tables.
#[test]
fn key_domains_own_policy() {
    check(
        On::Small,
        &[
            ("row-level listed key", "SELECT kind, COUNT(*) FROM events GROUP BY kind", Accepted("unit=row(t0) caps=(g1,r1) keys=[kind:text:listed[a, b]] aggs=[count(*)] out=[kind=k0, count=a0]")),
            ("row-level integer listed key", "SELECT level, AVG(score) FROM events GROUP BY level", Accepted("unit=row(t0) caps=(g1,r1) keys=[level:integer:listed[1, 2, 3]] aggs=[avg(score)[-1,1]] out=[level=k0, avg=a0]")),
            ("boolean key", "SELECT ok, COUNT(*) FROM events GROUP BY ok", Accepted("unit=row(t0) caps=(g1,r1) keys=[ok:boolean:private] aggs=[count(*)] out=[ok=k0, count=a0]")),
            ("public table column key", "SELECT sh.city, SUM(o.amount) FROM orders o JOIN shops sh ON o.shop = sh.shop GROUP BY sh.city", Accepted("unit=customer caps=(g2,r3) tables=[s.orders:private, s.shops:public] on=[shop = t1.shop] keys=[t1.city:text:table s.shops.city] aggs=[sum(amount)[0,50]] out=[city=k0, sum=a0]")),
            ("private groupable integer", "SELECT shop, COUNT(*) FROM orders GROUP BY shop", Accepted("unit=customer caps=(g2,r3) keys=[shop:integer:private] aggs=[count(*)] out=[shop=k0, count=a0]")),
        ],
    );
}

// ---------------------------------------------------------------------------------------------
// Joins, unit paths, subqueries
// ---------------------------------------------------------------------------------------------

#[test]
fn joins_and_unit_paths() {
    check(
        On::Demo,
        &[
            ("join using unit", "SELECT region, COUNT(*), AVG(cost) FROM demo.visits JOIN demo.people USING (person_id) GROUP BY region", Accepted("unit=person_id caps=(g5,r10) tables=[demo.visits:private, demo.people:private] on=[person_id = t1.person_id] keys=[t1.region:text:listed[CE, EA, IS, NE, NO, NW, SE, SO, SW, WE]] aggs=[count(*), avg(cost)[0,2000]] out=[region=k0, count=a0, avg=a1]")),
            ("join on unit equality", "SELECT p.sex, SUM(v.cost) AS total FROM demo.visits v JOIN demo.people p ON v.person_id = p.person_id GROUP BY p.sex", Accepted("unit=person_id caps=(g5,r10) tables=[demo.visits:private, demo.people:private] on=[person_id = t1.person_id] keys=[t1.sex:text:listed[F, M, X]] aggs=[sum(cost)[0,2000]] out=[sex=k0, total=a0]")),
            ("join reversed condition", "SELECT COUNT(*) FROM demo.people p INNER JOIN demo.visits v ON v.person_id = p.person_id WHERE p.age > 70", Accepted("unit=person_id caps=(g1,r10) tables=[demo.people:private, demo.visits:private] on=[person_id = t1.person_id] where=age > 70 keys=[] aggs=[count(*)] out=[count=a0]")),
            ("public table joined", "SELECT COUNT(*) FROM demo.people p JOIN demo.regions r ON p.region = r.region WHERE r.population > 2000000", Accepted("unit=person_id caps=(g1,r1) tables=[demo.people:private, demo.regions:public] on=[region = t1.region] where=t1.population > 2000000 keys=[] aggs=[count(*)] out=[count=a0]")),
            ("public table first", "SELECT r.region, AVG(p.income) FROM demo.regions r JOIN demo.people p USING (region) GROUP BY r.region", Accepted("unit=t1.person_id caps=(g1,r1) tables=[demo.regions:public, demo.people:private] on=[region = t1.region] keys=[region:text:table demo.regions.region] aggs=[avg(t1.income)[0,250000]] out=[region=k0, avg=a0]")),
            ("three tables", "SELECT r.name, AVG(v.cost) FROM demo.visits v JOIN demo.people p USING (person_id) JOIN demo.regions r ON p.region = r.region GROUP BY r.name", Accepted("unit=person_id caps=(g5,r10) tables=[demo.visits:private, demo.people:private, demo.regions:public] on=[person_id = t1.person_id; t1.region = t2.region] keys=[t2.name:text:table demo.regions.name] aggs=[avg(cost)[0,2000]] out=[name=k0, avg=a0]")),
            ("self join on unit", "SELECT COUNT(*) FROM demo.visits a JOIN demo.visits b ON a.person_id = b.person_id WHERE a.clinic <> b.clinic", Accepted("unit=person_id caps=(g1,r10) tables=[demo.visits:private, demo.visits:private] on=[person_id = t1.person_id] where=clinic <> t1.clinic keys=[] aggs=[count(*)] out=[count=a0]")),
            ("unit path count", "SELECT COUNT(*) FROM demo.prescriptions", Accepted("unit=t2.person_id caps=(g1,r20) tables=[demo.prescriptions:sub] keys=[] aggs=[count(*)] out=[count=a0] unique=[demo.visits.visit_id]")),
            ("unit path listed key", "SELECT drug, COUNT(*), SUM(quantity) FROM demo.prescriptions GROUP BY drug", Accepted("unit=t2.person_id caps=(g5,r20) tables=[demo.prescriptions:sub] keys=[t2.drug:text:listed[amlodipine, amoxicillin, atorvastatin, cetirizine, ibuprofen, levothyroxine, lisinopril, metformin, omeprazole, paracetamol, salbutamol, sertraline]] aggs=[count(*), sum(t2.quantity)[0,100]] out=[drug=k0, count=a0, sum=a1] unique=[demo.visits.visit_id]")),
            ("unit path count distinct unit", "SELECT COUNT(DISTINCT person_id) FROM demo.prescriptions", Accepted("unit=t2.person_id caps=(g1,r20) tables=[demo.prescriptions:sub] keys=[] aggs=[count_units] out=[count=a0] unique=[demo.visits.visit_id]")),
            ("unit path joined on its step", "SELECT v.clinic, COUNT(*) FROM demo.prescriptions p JOIN demo.visits v USING (visit_id) GROUP BY v.clinic", Accepted("unit=t2.person_id caps=(g5,r20) tables=[demo.prescriptions:sub, demo.visits:private] on=[t2.visit_id = t3.visit_id AND t2.person_id = t3.person_id] keys=[t3.clinic:text:private] aggs=[count(*)] out=[clinic=k0, count=a0] unique=[demo.visits.visit_id]")),
            ("unit path joined to people", "SELECT pe.sex, COUNT(*) FROM demo.prescriptions p JOIN demo.people pe USING (person_id) GROUP BY pe.sex", Accepted("unit=t2.person_id caps=(g5,r20) tables=[demo.prescriptions:sub, demo.people:private] on=[t2.person_id = t3.person_id] keys=[t3.sex:text:listed[F, M, X]] aggs=[count(*)] out=[sex=k0, count=a0] unique=[demo.visits.visit_id]")),
            ("unit path with public table", "SELECT r.name, SUM(p.quantity) FROM demo.prescriptions p JOIN demo.visits v USING (visit_id) JOIN demo.people pe ON pe.person_id = v.person_id JOIN demo.regions r ON r.region = pe.region GROUP BY r.name", Accepted("unit=t2.person_id caps=(g5,r20) tables=[demo.prescriptions:sub, demo.visits:private, demo.people:private, demo.regions:public] on=[t2.visit_id = t3.visit_id AND t2.person_id = t3.person_id; t3.person_id = t4.person_id; t4.region = t5.region] keys=[t5.name:text:table demo.regions.name] aggs=[sum(t2.quantity)[0,100]] out=[name=k0, sum=a0] unique=[demo.visits.visit_id]")),
            // An inner join's filter in ON is a filter of WHERE (join_filters.rs); an outer join's is not.
            ("join with extra condition", "SELECT COUNT(*) FROM demo.visits v JOIN demo.people p ON v.person_id = p.person_id AND p.age > 30", Accepted("unit=person_id caps=(g1,r10) tables=[demo.visits:private, demo.people:private] on=[person_id = t1.person_id] where=(t1.age > 30) keys=[] aggs=[count(*)] out=[count=a0]")),
            ("left join with extra condition", "SELECT COUNT(*) FROM demo.visits v LEFT JOIN demo.people p ON v.person_id = p.person_id AND p.age > 30", Refused(SqlState::FEATURE_NOT_SUPPORTED)),
            ("count units across join", "SELECT COUNT(DISTINCT p.person_id) FROM demo.visits v JOIN demo.people p USING (person_id)", Accepted("unit=person_id caps=(g1,r10) tables=[demo.visits:private, demo.people:private] on=[person_id = t1.person_id] keys=[] aggs=[count_units] out=[count=a0]")),
            ("join on unit and another column", "SELECT COUNT(*) FROM demo.visits a JOIN demo.visits b ON a.person_id = b.person_id AND a.clinic = b.clinic", Accepted("unit=person_id caps=(g1,r10) tables=[demo.visits:private, demo.visits:private] on=[person_id = t1.person_id AND clinic = t1.clinic] keys=[] aggs=[count(*)] out=[count=a0]")),
        ],
    );
}

/// Row-level tables, a unit path of our own, search_path `s`.
#[test]
fn joins_and_unit_paths_own_policy() {
    check(
        On::Small,
        &[
            ("own unit path", "SELECT item, SUM(qty) FROM lines GROUP BY item", Accepted("unit=t2.customer caps=(g4,r6) tables=[s.lines:sub] keys=[t2.item:text:private] aggs=[sum(t2.qty)[1,9]] out=[item=k0, sum=a0] unique=[s.orders.order_id]")),
            ("row-level table alone", "SELECT COUNT(*), SUM(score) FROM events", Accepted("unit=row(t0) caps=(g1,r1) keys=[] aggs=[count(*), sum(score)[-1,1]] out=[count=a0, sum=a1]")),
            ("row-level refuses join to private", "SELECT COUNT(*) FROM events e JOIN orders o ON e.level = o.shop", Refused(SqlState::INSUFFICIENT_PRIVILEGE)),
            ("two row-level tables joined", "SELECT COUNT(*) FROM events e JOIN events f ON e.kind = f.kind", Refused(SqlState::FEATURE_NOT_SUPPORTED)),
            ("row-level and unit tables joined", "SELECT COUNT(*) FROM events e JOIN orders o ON e.kind = o.day", Refused(SqlState::INSUFFICIENT_PRIVILEGE)),
            ("row-level count distinct listed", "SELECT COUNT(DISTINCT kind) FROM events", Accepted("unit=row(t0) caps=(g1,r1) keys=[] aggs=[count_distinct(kind)] out=[count=a0]")),
            ("row-level quantile of float", "SELECT kind, MEDIAN(score) FROM events GROUP BY kind", Accepted("unit=row(t0) caps=(g1,r1) keys=[kind:text:listed[a, b]] aggs=[q500(score)[-1,1]] out=[kind=k0, median=a0]")),
            ("row-level system column", "SELECT COUNT(*) FROM events e WHERE e.ctid IS NULL", Refused(SqlState::INSUFFICIENT_PRIVILEGE)),
            ("orders by day", "SELECT day, SUM(amount) FROM orders GROUP BY day", Accepted("unit=customer caps=(g2,r3) keys=[day:date:private] aggs=[sum(amount)[0,50]] out=[day=k0, sum=a0]")),
            ("orders joined to lines on the path", "SELECT o.shop, SUM(l.qty) FROM lines l JOIN orders o USING (order_id) GROUP BY o.shop", Accepted("unit=t2.customer caps=(g4,r6) tables=[s.lines:sub, s.orders:private] on=[t2.order_id = t3.order_id AND t2.customer = t3.customer] keys=[t3.shop:integer:private] aggs=[sum(t2.qty)[1,9]] out=[shop=k0, sum=a0] unique=[s.orders.order_id]")),
            ("lines joined to orders on the unit", "SELECT COUNT(*) FROM lines l JOIN orders o ON l.customer = o.customer", Accepted("unit=t2.customer caps=(g1,r6) tables=[s.lines:sub, s.orders:private] on=[t2.customer = t3.customer] keys=[] aggs=[count(*)] out=[count=a0] unique=[s.orders.order_id]")),
            ("public table keyed join", "SELECT sh.city, COUNT(*) FROM orders o JOIN shops sh USING (shop) GROUP BY sh.city", Accepted("unit=customer caps=(g2,r3) tables=[s.orders:private, s.shops:public] on=[shop = t1.shop] keys=[t1.city:text:table s.shops.city] aggs=[count(*)] out=[city=k0, count=a0]")),
            ("demo schema absent", "SELECT COUNT(*) FROM demo.people", Refused(SqlState::UNDEFINED_TABLE)),
            ("unit of unit path grouped", "SELECT customer, COUNT(*) FROM lines GROUP BY customer", Refused(SqlState::INSUFFICIENT_PRIVILEGE)),
            ("sum of order id", "SELECT SUM(order_id) FROM lines", Refused(SqlState::INSUFFICIENT_PRIVILEGE)),
        ],
    );
}

#[test]
fn subqueries() {
    check(
        On::Demo,
        &[
            ("derived table row level", "SELECT COUNT(*) FROM (SELECT *, cost * 2 AS c FROM demo.visits WHERE cost > 100) v", Accepted("unit=t1.person_id caps=(g1,r10) tables=[v:sub] keys=[] aggs=[count(*)] out=[count=a0]")),
            ("count of a selection, flattened", "SELECT COUNT(*) FROM (SELECT * FROM demo.visits WHERE cost > 100) v", Accepted("unit=person_id caps=(g1,r10) where=cost > 100 keys=[] aggs=[count(*)] out=[count=a0]")),
            ("cte row level", "WITH recent AS (SELECT * FROM demo.visits WHERE visit_date > DATE '2024-06-01') SELECT clinic, COUNT(*) FROM recent GROUP BY clinic", Accepted("unit=t1.person_id caps=(g5,r10) tables=[recent:sub] keys=[t1.clinic:text:private] aggs=[count(*)] out=[clinic=k0, count=a0]")),
            ("derived projection bounds", "SELECT AVG(c2) FROM (SELECT person_id, cost / 2 AS c2 FROM demo.visits WHERE clinic = 'C01') AS t", Accepted("unit=t1.person_id caps=(g1,r10) tables=[t:sub] keys=[] aggs=[avg(t1.c2)[0,1000]] out=[avg=a0]")),
            ("cte joined to table", "WITH v AS (SELECT person_id, cost FROM demo.visits WHERE cost > 100) SELECT p.sex, SUM(v.cost) FROM v JOIN demo.people p USING (person_id) GROUP BY p.sex", Accepted("unit=t1.person_id caps=(g5,r10) tables=[v:sub, demo.people:private] on=[t1.person_id = t2.person_id] keys=[t2.sex:text:listed[F, M, X]] aggs=[sum(t1.cost)[0,2000]] out=[sex=k0, sum=a0]")),
            ("cte chain", "WITH a AS (SELECT * FROM demo.people WHERE age >= 18), b AS (SELECT region, income FROM a WHERE income > 0) SELECT region, AVG(income) FROM b GROUP BY region", Accepted("unit=t2.__dp_unit caps=(g1,r1) tables=[b:sub] keys=[t2.region:text:listed[CE, EA, IS, NE, NO, NW, SE, SO, SW, WE]] aggs=[avg(t2.income)[0,250000]] out=[region=k0, avg=a0]")),
            ("cte without unit column", "WITH c AS (SELECT cost FROM demo.visits) SELECT SUM(cost) FROM c", Accepted("unit=t1.__dp_unit caps=(g1,r10) tables=[c:sub] keys=[] aggs=[sum(t1.cost)[0,2000]] out=[sum=a0]")),
            ("per-unit average", "SELECT AVG(n) FROM (SELECT person_id, LEAST(COUNT(*), 20) AS n FROM demo.visits GROUP BY person_id) t", Accepted("unit=t1.person_id caps=(g1,r1) tables=[t:sub] keys=[] aggs=[avg(t1.n)[1,20]] out=[avg=a0]")),
            ("per-unit histogram key", "SELECT n_bucket, COUNT(*) FROM (SELECT person_id, LEAST(COUNT(*), 10) AS n_bucket FROM demo.visits GROUP BY person_id) t GROUP BY n_bucket", Accepted("unit=t1.person_id caps=(g1,r1) tables=[t:sub] keys=[t1.n_bucket:integer:listed[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]] aggs=[count(*)] out=[n_bucket=k0, count=a0]")),
            ("per-unit case class", "WITH u AS (SELECT person_id, CASE WHEN COUNT(*) >= 10 THEN 'frequent' ELSE 'occasional' END AS kind FROM demo.visits GROUP BY person_id) SELECT kind, COUNT(*) FROM u GROUP BY kind", Accepted("unit=t1.person_id caps=(g1,r1) tables=[u:sub] keys=[t1.kind:text:listed[frequent, occasional]] aggs=[count(*)] out=[kind=k0, count=a0]")),
            ("per-unit having", "SELECT COUNT(*) FROM (SELECT person_id FROM demo.visits GROUP BY person_id HAVING COUNT(*) > 5) t", Accepted("unit=t1.person_id caps=(g1,r1) tables=[t:sub] keys=[] aggs=[count(*)] out=[count=a0]")),
            ("per-unit joined", "SELECT p.sex, AVG(t.spend) FROM (SELECT person_id, LEAST(SUM(cost), 10000) AS spend FROM demo.visits GROUP BY person_id) t JOIN demo.people p USING (person_id) GROUP BY p.sex", Accepted("unit=t1.person_id caps=(g1,r1) tables=[t:sub, demo.people:private] on=[t1.person_id = t2.person_id] keys=[t2.sex:text:listed[F, M, X]] aggs=[avg(t1.spend)[0,10000]] out=[sex=k0, avg=a0]")),
            ("per-unit over unit path", "WITH pp AS (SELECT person_id, LEAST(COUNT(*), 20) AS n FROM demo.prescriptions GROUP BY person_id) SELECT n, COUNT(*) FROM pp GROUP BY n", Accepted("unit=t3.person_id caps=(g1,r1) tables=[pp:sub] keys=[t3.n:integer:listed[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20]] aggs=[count(*)] out=[n=k0, count=a0] unique=[demo.visits.visit_id]")),
            // A whole per-unit COUNT or SUM left without a bound takes the policy's row cap
            // (visits: 10 rows per unit; prescriptions: 20), clamped upstream.
            ("per-unit count bounded by the row cap", "SELECT AVG(n) FROM (SELECT person_id, COUNT(*) AS n FROM demo.visits GROUP BY person_id) t", Accepted("unit=t1.person_id caps=(g1,r1) tables=[t:sub] keys=[] aggs=[avg(t1.n)[1,10]] out=[avg=a0]")),
            ("per-unit sum bounded by the row cap", "SELECT AVG(s) FROM (SELECT person_id, SUM(cost) AS s FROM demo.visits GROUP BY person_id) t", Accepted("unit=t1.person_id caps=(g1,r1) tables=[t:sub] keys=[] aggs=[avg(t1.s)[0,20000]] out=[avg=a0]")),
            // A per-unit COUNT(*) is at least 1 (every group of GROUP BY person_id has a row):
            // its histogram has no row 0, which PostgreSQL never returns (issue 42).
            ("per-unit count histogram starts at 1", "SELECT n, COUNT(*) FROM (SELECT person_id, COUNT(*) AS n FROM demo.visits GROUP BY person_id) t GROUP BY n", Accepted("unit=t1.person_id caps=(g1,r1) tables=[t:sub] keys=[t1.n:integer:listed[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]] aggs=[count(*)] out=[n=k0, count=a0]")),
            // COUNT(x) is 0 for a unit whose every x is NULL (clinic may be NULL)…
            ("per-unit count of a nullable column starts at 0", "SELECT n, COUNT(*) FROM (SELECT person_id, LEAST(COUNT(clinic), 3) AS n FROM demo.visits GROUP BY person_id) t GROUP BY n", Accepted("unit=t1.person_id caps=(g1,r1) tables=[t:sub] keys=[t1.n:integer:listed[0, 1, 2, 3]] aggs=[count(*)] out=[n=k0, count=a0]")),
            ("per-unit count distinct of a nullable column starts at 0", "SELECT n, COUNT(*) FROM (SELECT person_id, LEAST(COUNT(DISTINCT diagnosis), 5) AS n FROM demo.visits GROUP BY person_id) t GROUP BY n", Accepted("unit=t1.person_id caps=(g1,r1) tables=[t:sub] keys=[t1.n:integer:listed[0, 1, 2, 3, 4, 5]] aggs=[count(*)] out=[n=k0, count=a0]")),
            // …but not of a column the policy declares exhaustive (never NULL).
            ("per-unit count distinct of an exhaustive column starts at 1", "SELECT n, COUNT(*) FROM (SELECT person_id, LEAST(COUNT(DISTINCT drug), 3) AS n FROM demo.prescriptions GROUP BY person_id) t GROUP BY n", Accepted("unit=t3.person_id caps=(g1,r1) tables=[t:sub] keys=[t3.n:integer:listed[1, 2, 3]] aggs=[count(*)] out=[n=k0, count=a0] unique=[demo.visits.visit_id]")),
            ("per-unit integer sum bounded by the row cap", "SELECT s, COUNT(*) FROM (SELECT person_id, SUM(quantity) AS s FROM demo.prescriptions GROUP BY person_id) t GROUP BY s", Accepted("unit=t3.person_id caps=(g1,r1) tables=[t:sub] keys=[t3.s:integer:private] aggs=[count(*)] out=[s=k0, count=a0] unique=[demo.visits.visit_id]")),
            ("per-unit sum of an unbounded column", "SELECT AVG(s) FROM (SELECT person_id, SUM(visit_id) AS s FROM demo.visits GROUP BY person_id) t", Refused(SqlState::INSUFFICIENT_PRIVILEGE)),
            ("per-unit count in an expression", "SELECT AVG(n) FROM (SELECT person_id, COUNT(*) * 2 AS n FROM demo.visits GROUP BY person_id) t", Refused(SqlState::INSUFFICIENT_PRIVILEGE)),
            ("per-unit grouped by other", "SELECT AVG(n) FROM (SELECT clinic, LEAST(COUNT(*), 10) AS n FROM demo.visits GROUP BY clinic) t", Refused(SqlState::INSUFFICIENT_PRIVILEGE)),
            ("per-unit bare column", "SELECT AVG(n) FROM (SELECT person_id, clinic, LEAST(COUNT(*), 10) AS n FROM demo.visits GROUP BY person_id) t", Refused(SqlState::FEATURE_NOT_SUPPORTED)),
            // Windows partitioned by the privacy unit in a row-level view (analyze::window).
            ("window visit number as a key", "WITH v AS (SELECT person_id, ROW_NUMBER() OVER (PARTITION BY person_id ORDER BY visit_date) AS visit_no FROM demo.visits) SELECT visit_no, COUNT(*) FROM v WHERE visit_no <= 3 GROUP BY visit_no", Accepted("unit=t1.person_id caps=(g5,r10) tables=[v:sub] where=t1.visit_no <= 3 keys=[t1.visit_no:integer:private] aggs=[count(*)] out=[visit_no=k0, count=a0]")),
            ("window days since first, bounded by the policy's dates", "WITH v AS (SELECT person_id, visit_date - MIN(visit_date) OVER (PARTITION BY person_id) AS days FROM demo.visits) SELECT AVG(days) FROM v", Accepted("unit=t1.person_id caps=(g1,r10) tables=[v:sub] keys=[] aggs=[avg(t1.days)[-2556,2556]] out=[avg=a0]")),
            ("window ids since first unclamped", "WITH v AS (SELECT person_id, visit_id - MIN(visit_id) OVER (PARTITION BY person_id) AS days FROM demo.visits) SELECT AVG(days) FROM v", Refused(SqlState::INSUFFICIENT_PRIVILEGE)),
            ("window days since first", "WITH v AS (SELECT person_id, LEAST(GREATEST(visit_date - MIN(visit_date) OVER (PARTITION BY person_id ORDER BY visit_date), 0), 3650) AS days FROM demo.visits) SELECT AVG(days) FROM v", Accepted("unit=t1.person_id caps=(g1,r10) tables=[v:sub] keys=[] aggs=[avg(t1.days)[0,2556]] out=[avg=a0]")),
            ("date difference", "SELECT AVG(LEAST(GREATEST(visit_date - DATE '2020-01-01', 0), 2000)) FROM demo.visits", Accepted("unit=person_id caps=(g1,r10) keys=[] aggs=[avg(LEAST(GREATEST((CASE WHEN pg_catalog.isfinite(visit_date) AND pg_catalog.isfinite(DATE '2020-01-01') THEN (visit_date) - (DATE '2020-01-01') END), 0), 2000))[0,2000]] out=[avg=a0]")),
            ("date difference with an untyped literal", "SELECT COUNT(*) FROM demo.visits WHERE visit_date - '2020-01-01' > 10", Refused(SqlState::FEATURE_NOT_SUPPORTED)),
            ("window clamped rank", "SELECT SUM(n) FROM (SELECT person_id, LEAST(COUNT(*) OVER (PARTITION BY person_id), 10) AS n FROM demo.visits) t", Accepted("unit=t1.person_id caps=(g1,r10) tables=[t:sub] keys=[] aggs=[sum(t1.n)[0,10]] out=[sum=a0]")),
            ("window ntile bounds", "SELECT AVG(q) FROM (SELECT person_id, ntile(4) OVER (PARTITION BY person_id ORDER BY cost) AS q FROM demo.visits) t", Accepted("unit=t1.person_id caps=(g1,r10) tables=[t:sub] keys=[] aggs=[avg(t1.q)[1,4]] out=[avg=a0]")),
            ("window lag with default", "SELECT AVG(prev) FROM (SELECT person_id, lag(cost, 1, 0) OVER (PARTITION BY person_id ORDER BY visit_date) AS prev FROM demo.visits) t", Accepted("unit=t1.person_id caps=(g1,r10) tables=[t:sub] keys=[] aggs=[avg(t1.prev)[0,2000]] out=[avg=a0]")),
            ("window rows frame", "SELECT AVG(m) FROM (SELECT person_id, AVG(cost) OVER (PARTITION BY person_id ORDER BY visit_date ROWS BETWEEN 2 PRECEDING AND CURRENT ROW) AS m FROM demo.visits) t", Accepted("unit=t1.person_id caps=(g1,r10) tables=[t:sub] keys=[] aggs=[avg(t1.m)[0,2000]] out=[avg=a0]")),
            ("window over a join on the unit", "WITH v AS (SELECT v.person_id, p.sex, ROW_NUMBER() OVER (PARTITION BY p.person_id ORDER BY v.visit_date) AS n FROM demo.visits v JOIN demo.people p ON p.person_id = v.person_id) SELECT sex, COUNT(*) FROM v WHERE n = 1 GROUP BY sex", Accepted("unit=t2.person_id caps=(g5,r10) tables=[v:sub] where=t2.n = 1 keys=[t2.sex:text:listed[F, M, X]] aggs=[count(*)] out=[sex=k0, count=a0]")),
            ("window unbounded rank refused", "SELECT AVG(n) FROM (SELECT person_id, ROW_NUMBER() OVER (PARTITION BY person_id) AS n FROM demo.visits) t", Refused(SqlState::INSUFFICIENT_PRIVILEGE)),
            ("window not by the unit", "SELECT AVG(LEAST(n, 10)) FROM (SELECT person_id, COUNT(*) OVER (PARTITION BY clinic) AS n FROM demo.visits) t", Refused(SqlState::INSUFFICIENT_PRIVILEGE)),
            ("window over everything", "SELECT SUM(LEAST(n, 10)) FROM (SELECT person_id, COUNT(*) OVER () AS n FROM demo.visits) t", Refused(SqlState::INSUFFICIENT_PRIVILEGE)),
            ("window by a null-extended unit", "WITH w AS (SELECT v.person_id, LEAST(COUNT(*) OVER (PARTITION BY p.person_id), 5) AS n FROM demo.visits v LEFT JOIN demo.people p ON p.person_id = v.person_id) SELECT SUM(n) FROM w", Refused(SqlState::INSUFFICIENT_PRIVILEGE)),
            ("window ntile zero", "SELECT AVG(q) FROM (SELECT person_id, ntile(0) OVER (PARTITION BY person_id) AS q FROM demo.visits) t", Refused(SqlState::FEATURE_NOT_SUPPORTED)),
            ("window ntile of a column", "SELECT AVG(q) FROM (SELECT person_id, ntile(person_id) OVER (PARTITION BY person_id) AS q FROM demo.visits) t", Refused(SqlState::FEATURE_NOT_SUPPORTED)),
            ("window negative frame offset", "SELECT AVG(m) FROM (SELECT person_id, AVG(cost) OVER (PARTITION BY person_id ORDER BY visit_date ROWS BETWEEN -1 PRECEDING AND CURRENT ROW) AS m FROM demo.visits) t", Refused(SqlState::FEATURE_NOT_SUPPORTED)),
            ("window range offset", "SELECT AVG(m) FROM (SELECT person_id, AVG(cost) OVER (PARTITION BY person_id ORDER BY cost RANGE BETWEEN 5 PRECEDING AND CURRENT ROW) AS m FROM demo.visits) t", Refused(SqlState::FEATURE_NOT_SUPPORTED)),
            ("window frame ends before it starts", "SELECT AVG(m) FROM (SELECT person_id, AVG(cost) OVER (PARTITION BY person_id ORDER BY visit_date ROWS BETWEEN CURRENT ROW AND 1 PRECEDING) AS m FROM demo.visits) t", Refused(SqlState::SYNTAX_ERROR)),
            ("window in a per-unit view", "SELECT AVG(n) FROM (SELECT person_id, LEAST(COUNT(*), 5) AS n, ROW_NUMBER() OVER (PARTITION BY person_id) AS r FROM demo.visits GROUP BY person_id) t", Refused(SqlState::FEATURE_NOT_SUPPORTED)),
            ("window in the view's where", "SELECT COUNT(*) FROM (SELECT person_id FROM demo.visits WHERE ROW_NUMBER() OVER (PARTITION BY person_id) = 1) t", Refused(SqlState::FEATURE_NOT_SUPPORTED)),
            ("window nested", "SELECT AVG(n) FROM (SELECT person_id, LEAST(SUM(ROW_NUMBER() OVER (PARTITION BY person_id)) OVER (PARTITION BY person_id), 5) AS n FROM demo.visits) t", Refused(SqlState::FEATURE_NOT_SUPPORTED)),
            ("window in the outer query", "SELECT COUNT(*) FROM (SELECT person_id FROM demo.visits) t WHERE 1 = 1 GROUP BY ROW_NUMBER() OVER (PARTITION BY person_id)", Refused(SqlState::FEATURE_NOT_SUPPORTED)),
            ("window sum of floats", "SELECT AVG(LEAST(s, 1)) FROM (SELECT person_id, SUM(CAST(age AS double precision)) OVER (PARTITION BY person_id) AS s FROM demo.people) t", Refused(SqlState::FEATURE_NOT_SUPPORTED)),
            ("window named", "SELECT AVG(LEAST(n, 5)) FROM (SELECT person_id, COUNT(*) OVER w AS n FROM demo.visits WINDOW w AS (PARTITION BY person_id)) t", Refused(SqlState::FEATURE_NOT_SUPPORTED)),
            ("window lag with a wider default", "SELECT AVG(LEAST(prev, 5)) FROM (SELECT person_id, lag(age, 1, 0.5) OVER (PARTITION BY person_id) AS prev FROM demo.people) t", Refused(SqlState::FEATURE_NOT_SUPPORTED)),
            ("recursive cte", "WITH RECURSIVE r AS (SELECT * FROM demo.visits) SELECT COUNT(*) FROM r", Refused(SqlState::FEATURE_NOT_SUPPORTED)),
            ("subquery order limit", "SELECT COUNT(*) FROM (SELECT * FROM demo.visits ORDER BY cost DESC LIMIT 10) AS t", Refused(SqlState::FEATURE_NOT_SUPPORTED)),
            ("cte over public only", "WITH r AS (SELECT * FROM demo.regions) SELECT COUNT(*) FROM r JOIN demo.people USING (region)", Refused(SqlState::FEATURE_NOT_SUPPORTED)),
            // A count of groups (an ORM's `.distinct().count()`): the distinct keys, NULL included.
            ("subquery distinct", "SELECT COUNT(*) FROM (SELECT DISTINCT clinic FROM demo.visits) AS t", Accepted("unit=person_id caps=(g1,r10) keys=[] aggs=[count_distinct(ROW(clinic))] out=[count=a0]")),
            ("subquery distinct with a having", "SELECT COUNT(*) FROM (SELECT clinic FROM demo.visits GROUP BY clinic HAVING COUNT(*) > 5) AS t", Refused(SqlState::INSUFFICIENT_PRIVILEGE)),
            ("cte with dml", "WITH d AS (DELETE FROM demo.visits RETURNING person_id) SELECT COUNT(*) FROM d", Refused(SqlState::FEATURE_NOT_SUPPORTED)),
        ],
    );
}

/// Semijoins on the privacy unit (semijoin.rs): the accepted forms, and what stays refused.
#[test]
fn semijoins() {
    use SqlState as S;
    check(
        On::Demo,
        &[
            ("in", "SELECT COUNT(*) FROM demo.people WHERE person_id IN (SELECT person_id FROM demo.visits WHERE diagnosis = 'J06')", Accepted("unit=person_id caps=(g1,r1) semi=[exists(demo.visits: t1.person_id=person_id where t1.diagnosis = 'J06')] keys=[] aggs=[count(*)] out=[count=a0]")),
            ("in beside a condition", "SELECT sex, COUNT(*) FROM demo.people WHERE age > 40 AND (person_id IN (SELECT person_id FROM demo.visits WHERE cost > 100)) GROUP BY sex", Accepted("unit=person_id caps=(g1,r1) where=age > 40 semi=[exists(demo.visits: t1.person_id=person_id where t1.cost > 100)] keys=[sex:text:listed[F, M, X]] aggs=[count(*)] out=[sex=k0, count=a0]")),
            ("in distinct with alias", "SELECT COUNT(*) FROM demo.people p WHERE p.person_id IN (SELECT DISTINCT v.person_id AS who FROM demo.visits v)", Accepted("unit=person_id caps=(g1,r1) semi=[exists(demo.visits: t1.person_id=person_id)] keys=[] aggs=[count(*)] out=[count=a0]")),
            ("exists reversed correlation", "SELECT COUNT(*) FROM demo.people p WHERE EXISTS (SELECT * FROM demo.visits v WHERE p.person_id = v.person_id AND v.cost > 100)", Accepted("unit=person_id caps=(g1,r1) semi=[exists(demo.visits: t1.person_id=person_id where t1.cost > 100)] keys=[] aggs=[count(*)] out=[count=a0]")),
            ("not exists", "SELECT COUNT(*) FROM demo.people p WHERE NOT EXISTS (SELECT 1 FROM demo.visits v WHERE v.person_id = p.person_id)", Accepted("unit=person_id caps=(g1,r1) semi=[not exists(demo.visits: t1.person_id=person_id)] keys=[] aggs=[count(*)] out=[count=a0]")),
            ("not not exists", "SELECT COUNT(*) FROM demo.people p WHERE NOT (NOT EXISTS (SELECT 1 FROM demo.visits v WHERE v.person_id = p.person_id))", Accepted("unit=person_id caps=(g1,r1) semi=[exists(demo.visits: t1.person_id=person_id)] keys=[] aggs=[count(*)] out=[count=a0]")),
            ("in per-unit having", "SELECT COUNT(*) FROM demo.people WHERE person_id IN (SELECT person_id FROM demo.visits GROUP BY person_id HAVING COUNT(*) > 3)", Accepted("unit=person_id caps=(g1,r1) semi=[exists(demo.visits: t1.person_id=person_id having pg_catalog.count(*) > 3)] keys=[] aggs=[count(*)] out=[count=a0]")),
            ("in over a cte", "WITH big AS (SELECT person_id, cost FROM demo.visits WHERE cost > 1000) SELECT COUNT(*) FROM demo.people WHERE person_id IN (SELECT person_id FROM big)", Accepted("unit=person_id caps=(g1,r1) semi=[exists(big: t2.person_id=person_id)] keys=[] aggs=[count(*)] out=[count=a0]")),
            ("in with a parameter", "SELECT COUNT(*) FROM demo.people WHERE person_id IN (SELECT person_id FROM demo.visits WHERE clinic = $1)", Accepted("unit=person_id caps=(g1,r1) semi=[exists(demo.visits: t1.person_id=person_id where t1.clinic = $1)] keys=[] aggs=[count(*)] out=[count=a0] params=[$1:text/text]")),
            ("inner name shadows outer", "SELECT COUNT(*) FROM demo.visits WHERE person_id IN (SELECT person_id FROM demo.people WHERE person_id > 10)", Accepted("unit=person_id caps=(g1,r10) semi=[exists(demo.people: t1.person_id=person_id where t1.person_id > 10)] keys=[] aggs=[count(*)] out=[count=a0]")),
            ("not in", "SELECT COUNT(*) FROM demo.people WHERE person_id NOT IN (SELECT person_id FROM demo.visits)", Refused(S::FEATURE_NOT_SUPPORTED)),
            ("in on non-unit", "SELECT COUNT(*) FROM demo.people WHERE age IN (SELECT person_id FROM demo.visits)", Refused(S::FEATURE_NOT_SUPPORTED)),
            ("in selecting non-unit", "SELECT COUNT(*) FROM demo.people WHERE person_id IN (SELECT visit_id FROM demo.visits)", Refused(S::FEATURE_NOT_SUPPORTED)),
            ("in over public only", "SELECT COUNT(*) FROM demo.people WHERE region IN (SELECT region FROM demo.regions)", Refused(S::FEATURE_NOT_SUPPORTED)),
            ("in limit", "SELECT COUNT(*) FROM demo.people WHERE person_id IN (SELECT person_id FROM demo.visits LIMIT 10)", Refused(S::FEATURE_NOT_SUPPORTED)),
            ("in offset", "SELECT COUNT(*) FROM demo.people WHERE person_id IN (SELECT person_id FROM demo.visits OFFSET 10)", Refused(S::FEATURE_NOT_SUPPORTED)),
            ("in union", "SELECT COUNT(*) FROM demo.people WHERE person_id IN (SELECT person_id FROM demo.visits UNION SELECT person_id FROM demo.people)", Refused(S::FEATURE_NOT_SUPPORTED)),
            ("in window", "SELECT COUNT(*) FROM demo.people WHERE person_id IN (SELECT person_id FROM demo.visits WHERE cost > AVG(cost) OVER ())", Refused(S::FEATURE_NOT_SUPPORTED)),
            ("in aggregate of units", "SELECT COUNT(*) FROM demo.people WHERE person_id IN (SELECT MIN(person_id) FROM demo.visits)", Refused(S::FEATURE_NOT_SUPPORTED)),
            ("in having without group", "SELECT COUNT(*) FROM demo.people WHERE person_id IN (SELECT person_id FROM demo.visits HAVING COUNT(*) > 3)", Refused(S::FEATURE_NOT_SUPPORTED)),
            ("in grouped by other", "SELECT COUNT(*) FROM demo.people WHERE person_id IN (SELECT person_id FROM demo.visits GROUP BY clinic)", Refused(S::FEATURE_NOT_SUPPORTED)),
            ("exists uncorrelated", "SELECT COUNT(*) FROM demo.people WHERE EXISTS (SELECT 1 FROM demo.visits WHERE cost > 1999)", Refused(S::FEATURE_NOT_SUPPORTED)),
            ("exists on non-unit", "SELECT COUNT(*) FROM demo.people p WHERE EXISTS (SELECT 1 FROM demo.visits v WHERE v.visit_id = p.age)", Refused(S::FEATURE_NOT_SUPPORTED)),
            ("exists outer reference", "SELECT COUNT(*) FROM demo.people p WHERE EXISTS (SELECT 1 FROM demo.visits v WHERE v.person_id = p.person_id AND v.cost > p.income)", Refused(S::FEATURE_NOT_SUPPORTED)),
            ("exists aggregate select", "SELECT COUNT(*) FROM demo.people p WHERE EXISTS (SELECT COUNT(*) FROM demo.visits v WHERE v.person_id = p.person_id)", Refused(S::FEATURE_NOT_SUPPORTED)),
            ("exists outer in having", "SELECT COUNT(*) FROM demo.people p WHERE EXISTS (SELECT 1 FROM demo.visits v WHERE v.person_id = p.person_id GROUP BY v.person_id HAVING COUNT(*) > p.age)", Refused(S::FEATURE_NOT_SUPPORTED)),
            ("semijoin under or", "SELECT COUNT(*) FROM demo.people WHERE age > 90 OR person_id IN (SELECT person_id FROM demo.visits)", Refused(S::FEATURE_NOT_SUPPORTED)),
            ("semijoin in case", "SELECT SUM(CASE WHEN person_id IN (SELECT person_id FROM demo.visits) THEN 1 ELSE 0 END) FROM demo.people", Refused(S::FEATURE_NOT_SUPPORTED)),
            ("semijoin in a cte", "WITH t AS (SELECT * FROM demo.people WHERE person_id IN (SELECT person_id FROM demo.visits)) SELECT COUNT(*) FROM t", Refused(S::FEATURE_NOT_SUPPORTED)),
            ("nested semijoin", "SELECT COUNT(*) FROM demo.people WHERE person_id IN (SELECT person_id FROM demo.visits WHERE person_id IN (SELECT person_id FROM demo.people))", Refused(S::FEATURE_NOT_SUPPORTED)),
            ("too many semijoins", "SELECT COUNT(*) FROM demo.people p WHERE person_id IN (SELECT person_id FROM demo.visits) AND person_id IN (SELECT person_id FROM demo.visits) AND person_id IN (SELECT person_id FROM demo.visits) AND person_id IN (SELECT person_id FROM demo.visits) AND person_id IN (SELECT person_id FROM demo.visits)", Refused(S::PROGRAM_LIMIT_EXCEEDED)),
            ("reserved name inside", "SELECT COUNT(*) FROM demo.people WHERE person_id IN (SELECT person_id FROM demo.visits WHERE __dp_unit > 0)", Refused(S::INSUFFICIENT_PRIVILEGE)),
        ],
    );
    check(
        On::Small,
        &[
            ("orders in orders", "SELECT COUNT(*) FROM s.orders WHERE customer IN (SELECT customer FROM s.orders WHERE amount > 10)", Accepted("unit=customer caps=(g1,r3) semi=[exists(s.orders: t1.customer=customer where t1.amount > 10)] keys=[] aggs=[count(*)] out=[count=a0]")),
            ("over the unit path", "SELECT COUNT(*) FROM s.orders o WHERE EXISTS (SELECT 1 FROM s.lines l WHERE l.customer = o.customer AND l.qty > 5)", Accepted("unit=customer caps=(g1,r3) semi=[exists(s.lines: t3.customer=customer where t3.qty > 5)] keys=[] aggs=[count(*)] out=[count=a0] unique=[s.orders.order_id]")),
            ("row-level table inside", "SELECT COUNT(*) FROM s.orders WHERE customer IN (SELECT level FROM s.events)", Refused(S::FEATURE_NOT_SUPPORTED)),
            ("row-level table outside", "SELECT COUNT(*) FROM s.events e WHERE EXISTS (SELECT 1 FROM s.orders o WHERE o.customer = e.level)", Refused(S::FEATURE_NOT_SUPPORTED)),
        ],
    );
}

// ---------------------------------------------------------------------------------------------
// Post-processing and parameters
// ---------------------------------------------------------------------------------------------

#[test]
fn post_processing_and_parameters() {
    check(
        On::Demo,
        &[
            ("having on count", "SELECT diagnosis, COUNT(*) FROM demo.visits GROUP BY diagnosis HAVING COUNT(*) > 100", Accepted("unit=person_id caps=(g5,r10) keys=[diagnosis:text:private] aggs=[count(*)] out=[diagnosis=k0, count=a0] having=(a0 > 100)")),
            ("having on unselected aggregate", "SELECT clinic, COUNT(*) FROM demo.visits GROUP BY clinic HAVING AVG(cost) > 100", Accepted("unit=person_id caps=(g5,r10) keys=[clinic:text:private] aggs=[count(*), avg(cost)[0,2000]] out=[clinic=k0, count=a0] having=(a1 > 100)")),
            ("having on alias and key", "SELECT region, COUNT(*) AS n FROM demo.people GROUP BY region HAVING n > 5000 AND region <> 'NO'", Accepted("unit=person_id caps=(g1,r1) keys=[region:text:listed[CE, EA, IS, NE, NO, NW, SE, SO, SW, WE]] aggs=[count(*)] out=[region=k0, n=a0] having=((a0 > 5000) and (k0 <> 'NO'))")),
            ("order by alias desc limit", "SELECT clinic, COUNT(*) AS n FROM demo.visits GROUP BY clinic ORDER BY n DESC LIMIT 5", Accepted("unit=person_id caps=(g5,r10) keys=[clinic:text:private] aggs=[count(*)] out=[clinic=k0, n=a0] order=[a0 desc nulls first] limit=5")),
            ("order by positions limit offset", "SELECT region, AVG(income) FROM demo.people GROUP BY region ORDER BY 2 DESC, 1 LIMIT 3 OFFSET 1", Accepted("unit=person_id caps=(g1,r1) keys=[region:text:listed[CE, EA, IS, NE, NO, NW, SE, SO, SW, WE]] aggs=[avg(income)[0,250000]] out=[region=k0, avg=a0] order=[a0 desc nulls first, k0 asc nulls last] limit=3 offset=1")),
            ("order by nulls first", "SELECT education, COUNT(*) FROM demo.people GROUP BY education ORDER BY education NULLS FIRST", Accepted("unit=person_id caps=(g1,r1) keys=[education:text:listed[bachelor, master, none, primary, secondary, vocational]] aggs=[count(*)] out=[education=k0, count=a0] order=[k0 asc nulls first]")),
            ("order by aggregate expression", "SELECT sex, SUM(income) AS total, COUNT(*) AS n FROM demo.people GROUP BY sex ORDER BY SUM(income) / COUNT(*) DESC", Accepted("unit=person_id caps=(g1,r1) keys=[sex:text:listed[F, M, X]] aggs=[sum(income)[0,250000], count(*)] out=[sex=k0, total=a0, n=a1] order=[(a0 / a1) desc nulls first]")),
            ("param text", "SELECT COUNT(*) FROM demo.visits WHERE clinic = $1", Accepted("unit=person_id caps=(g1,r10) where=clinic = $1 keys=[] aggs=[count(*)] out=[count=a0] params=[$1:text/text]")),
            ("params integer and date", "SELECT COUNT(*) FROM demo.visits v JOIN demo.people p USING (person_id) WHERE p.age >= $1 AND v.visit_date < $2", Accepted("unit=person_id caps=(g1,r10) tables=[demo.visits:private, demo.people:private] on=[person_id = t1.person_id] where=t1.age >= $1 AND visit_date < $2 keys=[] aggs=[count(*)] out=[count=a0] params=[$1:integer/integer, $2:date/date]")),
            ("params in list and between", "SELECT SUM(cost) FROM demo.visits WHERE diagnosis IN ($1, $2) AND cost BETWEEN $3 AND $4", Accepted("unit=person_id caps=(g1,r10) where=diagnosis IN ($1, $2) AND cost BETWEEN $3 AND $4 keys=[] aggs=[sum(cost)[0,2000]] out=[sum=a0] params=[$1:text/text, $2:text/text, $3:numeric/numeric, $4:numeric/numeric]")),
            ("param in cte", "WITH r AS (SELECT * FROM demo.visits WHERE clinic = $1) SELECT COUNT(*) FROM r", Accepted("unit=t1.person_id caps=(g1,r10) tables=[r:sub] keys=[] aggs=[count(*)] out=[count=a0] params=[$1:text/text]")),
            ("param in group by", "SELECT COUNT(*) FROM demo.visits GROUP BY $1", Refused(SqlState::FEATURE_NOT_SUPPORTED)),
            ("param in select list", "SELECT $1, COUNT(*) FROM demo.visits", Refused(SqlState::FEATURE_NOT_SUPPORTED)),
            ("param as limit", "SELECT clinic, COUNT(*) FROM demo.visits GROUP BY clinic LIMIT $1", Refused(SqlState::FEATURE_NOT_SUPPORTED)),
            ("having references a private column", "SELECT clinic, COUNT(*) FROM demo.visits GROUP BY clinic HAVING cost > 5", Refused(SqlState::INSUFFICIENT_PRIVILEGE)),
            ("order by a private column", "SELECT clinic, COUNT(*) FROM demo.visits GROUP BY clinic ORDER BY cost", Refused(SqlState::INSUFFICIENT_PRIVILEGE)),
            ("order by unselected aggregate", "SELECT clinic, COUNT(*) FROM demo.visits GROUP BY clinic ORDER BY SUM(cost) DESC", Accepted("unit=person_id caps=(g5,r10) keys=[clinic:text:private] aggs=[count(*), sum(cost)[0,2000]] out=[clinic=k0, count=a0] order=[a1 desc nulls first]")),
            ("having is null and not", "SELECT sex, AVG(income) FROM demo.people GROUP BY sex HAVING NOT AVG(income) IS NULL", Accepted("unit=person_id caps=(g1,r1) keys=[sex:text:listed[F, M, X]] aggs=[avg(income)[0,250000]] out=[sex=k0, avg=a0] having=not a0 is null")),
            ("limit zero", "SELECT clinic, COUNT(*) FROM demo.visits GROUP BY clinic LIMIT 0", Accepted("unit=person_id caps=(g5,r10) keys=[clinic:text:private] aggs=[count(*)] out=[clinic=k0, count=a0] limit=0")),
            ("offset alone", "SELECT clinic, COUNT(*) FROM demo.visits GROUP BY clinic OFFSET 2", Accepted("unit=person_id caps=(g5,r10) keys=[clinic:text:private] aggs=[count(*)] out=[clinic=k0, count=a0] offset=2")),
            ("param in having", "SELECT clinic, COUNT(*) FROM demo.visits GROUP BY clinic HAVING COUNT(*) > $1", Refused(SqlState::FEATURE_NOT_SUPPORTED)),
            ("param as quantile fraction", "SELECT PERCENTILE_CONT($1) WITHIN GROUP (ORDER BY cost) FROM demo.visits", Refused(SqlState::INVALID_PARAMETER_VALUE)),
            ("param as like pattern", "SELECT COUNT(*) FROM demo.visits WHERE diagnosis LIKE $1", Refused(SqlState::FEATURE_NOT_SUPPORTED)),
            ("param compared with the unit", "SELECT COUNT(*) FROM demo.visits WHERE person_id = $1", Accepted("unit=person_id caps=(g1,r10) where=person_id = $1 keys=[] aggs=[count(*)] out=[count=a0] params=[$1:integer/bigint]")),
            ("param on a listed column", "SELECT sex, COUNT(*) FROM demo.people WHERE region = $1 GROUP BY sex", Accepted("unit=person_id caps=(g1,r1) where=region = $1 keys=[sex:text:listed[F, M, X]] aggs=[count(*)] out=[sex=k0, count=a0] params=[$1:text/text]")),
            ("param reused", "SELECT COUNT(*) FROM demo.visits WHERE clinic = $1 OR diagnosis = $1", Accepted("unit=person_id caps=(g1,r10) where=clinic = $1 OR diagnosis = $1 keys=[] aggs=[count(*)] out=[count=a0] params=[$1:text/text]")),
        ],
    );
}

#[test]
fn post_processing_by_postgresql() {
    use SqlState as S;
    check(
        On::Demo,
        &[
            ("expression over aggregates", "SELECT SUM(cost) / COUNT(*) FROM demo.visits", Accepted("unit=person_id caps=(g1,r10) keys=[] aggs=[sum(cost)[0,2000], count(*)] out=[?column?=c0] post=[SELECT \"__dp_released\".\"a0\" / NULLIF((\"__dp_released\".\"a1\"), 0) AS \"?column?\" FROM \"__dp_released\"]")),
            ("function of aggregate", "SELECT round(AVG(cost), 2) FROM demo.visits", Accepted("unit=person_id caps=(g1,r10) keys=[] aggs=[avg(cost)[0,2000]] out=[round=c0] post=[SELECT pg_catalog.round(\"__dp_released\".\"a0\", 2) AS \"round\" FROM \"__dp_released\"]")),
            ("share of the total", "SELECT region, 100.0 * COUNT(*) / SUM(COUNT(*)) OVER () AS share FROM demo.people GROUP BY region ORDER BY share DESC LIMIT 3", Accepted("unit=person_id caps=(g1,r1) keys=[region:text:listed[CE, EA, IS, NE, NO, NW, SE, SO, SW, WE]] aggs=[count(*)] out=[region=k0, share=c1] post=[SELECT \"__dp_released\".\"k0\" AS \"region\", 100.0 * \"__dp_released\".\"a0\" / NULLIF((pg_catalog.sum(\"__dp_released\".\"a0\") OVER ()), 0) AS \"share\" FROM \"__dp_released\" ORDER BY \"share\" DESC LIMIT 3]")),
            ("case over aggregate and cast", "SELECT sex, CASE WHEN AVG(age) > 40 THEN 'older' ELSE 'younger' END AS band, COUNT(*)::int AS n FROM demo.people GROUP BY sex", Accepted("unit=person_id caps=(g1,r1) keys=[sex:text:listed[F, M, X]] aggs=[avg(age)[0,100], count(*)] out=[sex=k0, band=c1, n=c2] post=[SELECT \"__dp_released\".\"k0\" AS \"sex\", CASE WHEN \"__dp_released\".\"a0\" > 40 THEN 'older' ELSE 'younger' END AS \"band\", \"__dp_released\".\"a1\"::INT AS \"n\" FROM \"__dp_released\"]")),
            ("function of a key", "SELECT to_char(date_trunc('month', visit_date), 'YYYY-MM') AS month, COUNT(*) FROM demo.visits GROUP BY date_trunc('month', visit_date) ORDER BY 1", Accepted("unit=person_id caps=(g5,r10) keys=[pg_catalog.date_trunc('month', CASE WHEN (visit_date) > '294276-12-31' THEN 'infinity' WHEN (visit_date) < '4714-12-01 BC' THEN '-infinity' ELSE (visit_date) END):timestamp:private] aggs=[count(*)] out=[month=c0, count=a0] post=[SELECT pg_catalog.to_char(\"__dp_released\".\"k0\", 'YYYY-MM') AS \"month\", \"__dp_released\".\"a0\" AS \"count\" FROM \"__dp_released\" ORDER BY 1]")),
            ("having like on a key", "SELECT region, COUNT(*) FROM demo.people GROUP BY region HAVING COUNT(*) > 9000 AND region LIKE 'S%'", Accepted("unit=person_id caps=(g1,r1) keys=[region:text:listed[CE, EA, IS, NE, NO, NW, SE, SO, SW, WE]] aggs=[count(*)] out=[region=k0, count=a0] post=[SELECT \"__dp_released\".\"k0\" AS \"region\", \"__dp_released\".\"a0\" AS \"count\" FROM \"__dp_released\" WHERE \"__dp_released\".\"a0\" > 9000 AND \"__dp_released\".\"k0\" LIKE 'S%']")),
            ("rank of aggregates", "SELECT clinic, RANK() OVER (ORDER BY COUNT(*) DESC) FROM demo.visits GROUP BY clinic", Accepted("unit=person_id caps=(g5,r10) keys=[clinic:text:private] aggs=[count(*)] out=[clinic=k0, rank=c1] post=[SELECT \"__dp_released\".\"k0\" AS \"clinic\", pg_catalog.rank() OVER (ORDER BY \"__dp_released\".\"a0\" DESC) AS \"rank\" FROM \"__dp_released\"]")),
            ("metabase wrapper", "SELECT \"source\".* FROM (SELECT region, COUNT(*) AS \"count\" FROM demo.people GROUP BY region ORDER BY region) AS \"source\" LIMIT 2000", Accepted("unit=person_id caps=(g1,r1) keys=[region:text:listed[CE, EA, IS, NE, NO, NW, SE, SO, SW, WE]] aggs=[count(*)] out=[region=k0, count=a0] post=[SELECT \"source\".* FROM (SELECT \"__dp_released\".\"k0\" AS \"region\", \"__dp_released\".\"a0\" AS \"count\" FROM \"__dp_released\" ORDER BY \"region\") AS \"source\" LIMIT 2000]")),
            ("outer filter and sort", "SELECT s.region, s.n * 2 AS twice FROM (SELECT region, COUNT(*) AS n FROM demo.people GROUP BY region) s WHERE s.n > 10000 ORDER BY twice DESC", Accepted("unit=person_id caps=(g1,r1) keys=[region:text:listed[CE, EA, IS, NE, NO, NW, SE, SO, SW, WE]] aggs=[count(*)] out=[region=k0, n=a0] post=[SELECT s.region, s.n * 2 AS twice FROM (SELECT \"__dp_released\".\"k0\" AS \"region\", \"__dp_released\".\"a0\" AS \"n\" FROM \"__dp_released\") AS \"s\" WHERE s.n > 10000 ORDER BY \"twice\" DESC]")),
            ("outer sorts by a folded alias", "SELECT s.n AS Twice FROM (SELECT region, COUNT(*) AS n FROM demo.people GROUP BY region) s ORDER BY TWICE", Accepted("unit=person_id caps=(g1,r1) keys=[region:text:listed[CE, EA, IS, NE, NO, NW, SE, SO, SW, WE]] aggs=[count(*)] out=[region=k0, n=a0] post=[SELECT s.n AS Twice FROM (SELECT \"__dp_released\".\"k0\" AS \"region\", \"__dp_released\".\"a0\" AS \"n\" FROM \"__dp_released\") AS \"s\" ORDER BY \"twice\"]")),
            ("outer with cte", "WITH v AS (SELECT * FROM demo.visits WHERE cost > 10) SELECT * FROM (SELECT clinic, COUNT(*) AS n FROM v GROUP BY clinic) s", Accepted("unit=t1.person_id caps=(g5,r10) tables=[v:sub] keys=[t1.clinic:text:private] aggs=[count(*)] out=[clinic=k0, n=a0] post=[SELECT * FROM (SELECT \"__dp_released\".\"k0\" AS \"clinic\", \"__dp_released\".\"a0\" AS \"n\" FROM \"__dp_released\") AS \"s\"]")),
            ("non-key column beside aggregates", "SELECT age + 1, COUNT(*) FROM demo.people GROUP BY region", Refused(S::INSUFFICIENT_PRIVILEGE)),
            ("non-key column inside an expression", "SELECT COUNT(*) + age FROM demo.people", Refused(S::INSUFFICIENT_PRIVILEGE)),
            ("function off the list", "SELECT pg_sleep(COUNT(*)) FROM demo.people", Refused(S::UNDEFINED_FUNCTION)),
            ("set_config over an aggregate", "SELECT set_config('a.b', COUNT(*)::text, false) FROM demo.people", Refused(S::UNDEFINED_FUNCTION)),
            ("subquery beside an aggregate", "SELECT COUNT(*) + (SELECT 1) FROM demo.people", Refused(S::FEATURE_NOT_SUPPORTED)),
            ("parameter over an aggregate", "SELECT COUNT(*) * $1 FROM demo.people", Refused(S::FEATURE_NOT_SUPPORTED)),
            ("cast to regclass", "SELECT COUNT(*)::text::regclass FROM demo.people", Refused(S::FEATURE_NOT_SUPPORTED)),
            ("window over rows", "SELECT SUM(age) OVER () FROM demo.people", Refused(S::FEATURE_NOT_SUPPORTED)),
            ("named window", "SELECT region, SUM(COUNT(*)) OVER w FROM demo.people GROUP BY region WINDOW w AS ()", Refused(S::FEATURE_NOT_SUPPORTED)),
            ("window function off the list", "SELECT region, string_agg(region, ',') OVER () , COUNT(*) FROM demo.people GROUP BY region", Refused(S::UNDEFINED_FUNCTION)),
            ("outer names an unknown column", "SELECT income FROM (SELECT region, COUNT(*) AS n FROM demo.people GROUP BY region) s", Refused(S::UNDEFINED_COLUMN)),
            ("outer names the table of the subquery", "SELECT people.region FROM (SELECT region, COUNT(*) AS n FROM demo.people GROUP BY region) s", Refused(S::UNDEFINED_COLUMN)),
            ("outer subquery in where", "SELECT * FROM (SELECT region, COUNT(*) AS n FROM demo.people GROUP BY region) s WHERE n > (SELECT 1)", Refused(S::FEATURE_NOT_SUPPORTED)),
            ("double minus stays an expression, never a comment", "SELECT - -COUNT(*) AS n FROM demo.people", Accepted("unit=person_id caps=(g1,r1) keys=[] aggs=[count(*)] out=[n=c0] post=[SELECT -(-(\"__dp_released\".\"a0\")) AS \"n\" FROM \"__dp_released\"]")),
            ("outer select distinct", "SELECT DISTINCT n FROM (SELECT region, COUNT(*) AS n FROM demo.people GROUP BY region) s", Refused(S::FEATURE_NOT_SUPPORTED)),
        ],
    );
}

// ---------------------------------------------------------------------------------------------
// Refusals
// ---------------------------------------------------------------------------------------------

#[test]
fn refusals_resolution() {
    use SqlState as S;
    check(
        On::Demo,
        &[
            ("unknown table", "SELECT COUNT(*) FROM demo.invoices", Refused(S::UNDEFINED_TABLE)),
            ("table outside policy schema", "SELECT COUNT(*) FROM public.visits", Refused(S::UNDEFINED_TABLE)),
            ("unknown column", "SELECT COUNT(*) FROM demo.people WHERE name = 'Alice'", Refused(S::UNDEFINED_COLUMN)),
            ("undeclared column", "SELECT SUM(v.salary) FROM demo.visits v", Refused(S::UNDEFINED_COLUMN)),
            ("ambiguous column", "SELECT COUNT(*) FROM demo.people p JOIN demo.regions r ON p.region = r.region WHERE region = 'NO'", Refused(S::SYNTAX_ERROR)),
            ("unknown function", "SELECT COUNT(*) FROM demo.visits WHERE leak(cost) > 0", Refused(S::UNDEFINED_FUNCTION)),
            ("random", "SELECT COUNT(*) FROM demo.visits WHERE random() < 0.5", Refused(S::UNDEFINED_FUNCTION)),
            ("pg_sleep", "SELECT COUNT(*) FROM demo.visits WHERE pg_sleep(1) IS NULL", Refused(S::UNDEFINED_FUNCTION)),
            ("now", "SELECT COUNT(*) FROM demo.visits WHERE visit_date > now()", Refused(S::UNDEFINED_FUNCTION)),
            ("catalog function", "SELECT COUNT(*) FROM demo.visits WHERE pg_catalog.current_setting('x') = 'y'", Refused(S::UNDEFINED_FUNCTION)),
            ("catalog table", "SELECT COUNT(*) FROM pg_catalog.pg_class", Refused(S::FEATURE_NOT_SUPPORTED)),
            ("exists of a grouped subquery", "SELECT EXISTS (SELECT 1 FROM demo.people GROUP BY region HAVING COUNT(*) > 5)", Refused(S::INSUFFICIENT_PRIVILEGE)),
            ("information schema", "SELECT COUNT(*) FROM information_schema.tables", Refused(S::FEATURE_NOT_SUPPORTED)),
            ("reserved output alias", "SELECT COUNT(*) AS __dp_n FROM demo.visits", Refused(S::INSUFFICIENT_PRIVILEGE)),
            ("reserved table reference", "SELECT COUNT(*) FROM demo.visits WHERE \"__dp_t0\".person_id = 1", Refused(S::INSUFFICIENT_PRIVILEGE)),
            ("reserved table alias", "SELECT COUNT(*) FROM demo.visits __dp_rows", Refused(S::INSUFFICIENT_PRIVILEGE)),
            ("reserved cte name", "WITH __dp_x AS (SELECT * FROM demo.visits) SELECT COUNT(*) FROM __dp_x", Refused(S::INSUFFICIENT_PRIVILEGE)),
            ("reserved column", "SELECT COUNT(__dp_unit) FROM demo.visits", Refused(S::INSUFFICIENT_PRIVILEGE)),
            ("system column qualified", "SELECT COUNT(*) FROM demo.visits v WHERE v.ctid = '(0,1)'", Refused(S::INSUFFICIENT_PRIVILEGE)),
            ("system column bare", "SELECT COUNT(*) FROM demo.visits WHERE ctid = '(0,1)'", Refused(S::UNDEFINED_COLUMN)),
            ("system column xmin", "SELECT COUNT(*) FROM demo.visits v WHERE v.xmin = '1'", Refused(S::INSUFFICIENT_PRIVILEGE)),
            ("public table only", "SELECT COUNT(*) FROM demo.regions", Refused(S::FEATURE_NOT_SUPPORTED)),
            ("quoted upper case is another table", "SELECT COUNT(*) FROM demo.\"Visits\"", Refused(S::UNDEFINED_TABLE)),
            ("unknown schema-qualified column", "SELECT COUNT(*) FROM demo.visits v WHERE x.clinic = 'a'", Refused(S::UNDEFINED_TABLE)),
            ("text length has no bounds", "SELECT SUM(pg_catalog.length(diagnosis)) FROM demo.visits", Refused(S::INSUFFICIENT_PRIVILEGE)),
            ("catalog function unlisted", "SELECT COUNT(*) FROM demo.visits WHERE pg_catalog.pg_read_file('x') IS NULL", Refused(S::UNDEFINED_FUNCTION)),
            ("set-returning function in from", "SELECT COUNT(*) FROM generate_series(1, 10)", Refused(S::FEATURE_NOT_SUPPORTED)),
            ("lateral subquery", "SELECT COUNT(*) FROM demo.people p JOIN LATERAL (SELECT * FROM demo.visits v WHERE v.person_id = p.person_id) x ON true", Refused(S::FEATURE_NOT_SUPPORTED)),
        ],
    );
}

#[test]
fn refusals_privacy() {
    use SqlState as S;
    check(
        On::Demo,
        &[
            ("select star", "SELECT * FROM demo.people", Refused(S::INSUFFICIENT_PRIVILEGE)),
            ("qualified star", "SELECT v.* FROM demo.visits v", Refused(S::INSUFFICIENT_PRIVILEGE)),
            ("raw column", "SELECT age FROM demo.people", Refused(S::INSUFFICIENT_PRIVILEGE)),
            ("column beside aggregate", "SELECT diagnosis, COUNT(*) FROM demo.visits", Refused(S::INSUFFICIENT_PRIVILEGE)),
            ("column not grouped", "SELECT clinic, diagnosis, COUNT(*) FROM demo.visits GROUP BY clinic", Refused(S::INSUFFICIENT_PRIVILEGE)),
            ("group by unit", "SELECT person_id, COUNT(*) FROM demo.visits GROUP BY person_id", Refused(S::INSUFFICIENT_PRIVILEGE)),
            ("group by expression of unit", "SELECT COUNT(*) FROM demo.visits GROUP BY person_id + 0", Refused(S::INSUFFICIENT_PRIVILEGE)),
            ("group by case on unit", "SELECT COUNT(*) FROM demo.visits GROUP BY CASE WHEN person_id = 4711 THEN 'x' ELSE 'y' END", Refused(S::INSUFFICIENT_PRIVILEGE)),
            ("group by non-groupable", "SELECT cost, COUNT(*) FROM demo.visits GROUP BY cost", Refused(S::INSUFFICIENT_PRIVILEGE)),
            ("group by unit path", "SELECT person_id, COUNT(*) FROM demo.prescriptions GROUP BY person_id", Refused(S::INSUFFICIENT_PRIVILEGE)),
            ("join not on unit", "SELECT COUNT(*) FROM demo.visits v JOIN demo.people p ON v.visit_id = p.person_id", Refused(S::INSUFFICIENT_PRIVILEGE)),
            ("self join on clinic", "SELECT COUNT(*) FROM demo.visits a JOIN demo.visits b ON a.clinic = b.clinic", Refused(S::INSUFFICIENT_PRIVILEGE)),
            ("unit path join on other column", "SELECT COUNT(*) FROM demo.prescriptions p JOIN demo.visits v ON p.prescription_id = v.visit_id", Refused(S::INSUFFICIENT_PRIVILEGE)),
            ("subquery posing as path table", "SELECT COUNT(*) FROM demo.prescriptions p JOIN (SELECT visit_id, clinic FROM demo.visits) AS \"demo.visits\" ON p.visit_id = \"demo.visits\".visit_id", Refused(S::INSUFFICIENT_PRIVILEGE)),
            ("sum unbounded", "SELECT SUM(visit_id) FROM demo.visits", Refused(S::INSUFFICIENT_PRIVILEGE)),
            ("avg of unit", "SELECT AVG(person_id) FROM demo.people", Refused(S::INSUFFICIENT_PRIVILEGE)),
            ("max unbounded", "SELECT MAX(visit_id) FROM demo.visits", Refused(S::INSUFFICIENT_PRIVILEGE)),
            ("sum of division by column", "SELECT SUM(cost / age) FROM demo.visits JOIN demo.people USING (person_id)", Refused(S::INSUFFICIENT_PRIVILEGE)),
            ("avg of division by column", "SELECT AVG(income / age) FROM demo.people", Refused(S::INSUFFICIENT_PRIVILEGE)),
            ("sum bounds too large", "SELECT SUM(income * income * income) FROM demo.people", Refused(S::INSUFFICIENT_PRIVILEGE)),
            ("cast text to int", "SELECT COUNT(*) FROM demo.visits WHERE diagnosis::int > 3", Refused(S::INSUFFICIENT_PRIVILEGE)),
            ("extract to int under arithmetic fails on infinity", "SELECT EXTRACT(YEAR FROM visit_date)::int / 10 AS y, COUNT(*) FROM demo.visits GROUP BY 1", Refused(S::INSUFFICIENT_PRIVILEGE)),
            ("date_part to bigint in where fails on infinity", "SELECT COUNT(*) FROM demo.visits WHERE date_part('year', visit_date)::bigint = 2024", Refused(S::INSUFFICIENT_PRIVILEGE)),
            ("extract of a fractional field to int", "SELECT EXTRACT(epoch FROM visit_date)::int AS t, COUNT(*) FROM demo.visits GROUP BY 1", Refused(S::INSUFFICIENT_PRIVILEGE)),
            // The cast fails after 294276 AD: the date is guarded (sent as 'infinity' there).
            ("date to timestamp guarded", "SELECT COUNT(*) FROM demo.visits WHERE visit_date::timestamp > TIMESTAMP '2024-01-01'", Accepted("unit=person_id caps=(g1,r10) where=CASE WHEN (visit_date) > '294276-12-31' THEN 'infinity' WHEN (visit_date) < '4714-11-24 BC' THEN '-infinity' ELSE (visit_date) END::TIMESTAMP > TIMESTAMP '2024-01-01' keys=[] aggs=[count(*)] out=[count=a0]")),
            ("cast to narrow type", "SELECT COUNT(*) FROM demo.visits WHERE CAST(person_id AS smallint) > 0", Refused(S::INSUFFICIENT_PRIVILEGE)),
            ("numeric overflow by literals", "SELECT COUNT(*) FROM demo.people WHERE income * 1e100000 * 1e100000 > 0", Refused(S::INSUFFICIENT_PRIVILEGE)),
            ("for update", "SELECT COUNT(*) FROM demo.visits FOR UPDATE", Refused(S::INSUFFICIENT_PRIVILEGE)),
            ("select into", "SELECT COUNT(*) INTO stolen FROM demo.visits", Refused(S::INSUFFICIENT_PRIVILEGE)),
        ],
    );
}

#[test]
fn grouping_sets() {
    use SqlState as S;
    check(
        On::Demo,
        &[
            ("rollup", "SELECT sex, region, COUNT(*) FROM demo.people GROUP BY ROLLUP (sex, region)",
             Accepted("unit=person_id caps=(g1,r1) keys=[sex:text:listed[F, M, X], region:text:listed[CE, EA, IS, NE, NO, NW, SE, SO, SW, WE]] sets=[[0, 1], [0], []] aggs=[count(*)] out=[sex=k0, region=k1, count=a0]")),
            ("cube", "SELECT sex, region, COUNT(*), GROUPING(sex, region) FROM demo.people GROUP BY CUBE (sex, region)",
             Accepted("unit=person_id caps=(g1,r1) keys=[sex:text:listed[F, M, X], region:text:listed[CE, EA, IS, NE, NO, NW, SE, SO, SW, WE]] sets=[[0, 1], [0], [1], []] aggs=[count(*)] out=[sex=k0, region=k1, count=a0, grouping=g[0, 1]]")),
            ("grouping sets with empty and duplicate", "SELECT region, COUNT(*) FROM demo.people GROUP BY GROUPING SETS ((region), (), (region))",
             Accepted("unit=person_id caps=(g1,r1) keys=[region:text:listed[CE, EA, IS, NE, NO, NW, SE, SO, SW, WE]] sets=[[0], [], [0]] aggs=[count(*)] out=[region=k0, count=a0]")),
            ("mixed plain and rollup", "SELECT sex, region, diagnosis, COUNT(*) FROM demo.people JOIN demo.visits USING (person_id) GROUP BY sex, ROLLUP (region, diagnosis)",
             Accepted("unit=person_id caps=(g5,r10) tables=[demo.people:private, demo.visits:private] on=[person_id = t1.person_id] keys=[sex:text:listed[F, M, X], region:text:listed[CE, EA, IS, NE, NO, NW, SE, SO, SW, WE], t1.diagnosis:text:private] sets=[[0, 1, 2], [0, 1], [0]] aggs=[count(*)] out=[sex=k0, region=k1, diagnosis=k2, count=a0]")),
            ("rollup of two rollups", "SELECT sex, region, COUNT(*) FROM demo.people GROUP BY ROLLUP (sex), ROLLUP (region)",
             Accepted("unit=person_id caps=(g1,r1) keys=[sex:text:listed[F, M, X], region:text:listed[CE, EA, IS, NE, NO, NW, SE, SO, SW, WE]] sets=[[0, 1], [0], [1], []] aggs=[count(*)] out=[sex=k0, region=k1, count=a0]")),
            ("grouping in case is post-processing", "SELECT CASE WHEN GROUPING(region) = 1 THEN 'all' ELSE region END AS r, COUNT(*) FROM demo.people GROUP BY ROLLUP (region)",
             Accepted("unit=person_id caps=(g1,r1) keys=[region:text:listed[CE, EA, IS, NE, NO, NW, SE, SO, SW, WE]] sets=[[0], []] aggs=[count(*)] out=[r=c0, count=a0] post=[SELECT CASE WHEN (\"__dp_released\".\"g0\") = 1 THEN 'all' ELSE \"__dp_released\".\"k0\" END AS \"r\", \"__dp_released\".\"a0\" AS \"count\" FROM \"__dp_released\"]")),
            ("group by name is the input column before the alias", "SELECT CASE WHEN GROUPING(region) = 1 THEN 'all' ELSE region END AS region, COUNT(*) FROM demo.people GROUP BY ROLLUP (region) ORDER BY 1",
             Accepted("unit=person_id caps=(g1,r1) keys=[region:text:listed[CE, EA, IS, NE, NO, NW, SE, SO, SW, WE]] sets=[[0], []] aggs=[count(*)] out=[region=c0, count=a0] post=[SELECT CASE WHEN (\"__dp_released\".\"g0\") = 1 THEN 'all' ELSE \"__dp_released\".\"k0\" END AS \"region\", \"__dp_released\".\"a0\" AS \"count\" FROM \"__dp_released\" ORDER BY 1]")),
            ("group by alias of an expression", "SELECT upper(region) AS r, COUNT(*) FROM demo.people GROUP BY r",
             Accepted("unit=person_id caps=(g1,r1) keys=[pg_catalog.upper(region):text:private] aggs=[count(*)] out=[r=k0, count=a0]")),
            ("grouping of a non-key", "SELECT region, GROUPING(sex), COUNT(*) FROM demo.people GROUP BY ROLLUP (region)", Refused(S::INSUFFICIENT_PRIVILEGE)),
            ("grouping without sets", "SELECT region, GROUPING(region), COUNT(*) FROM demo.people GROUP BY region", Refused(S::FEATURE_NOT_SUPPORTED)),
            ("nested rollup", "SELECT region, COUNT(*) FROM demo.people GROUP BY GROUPING SETS (ROLLUP (region))", Refused(S::FEATURE_NOT_SUPPORTED)),
            ("cube too large", "SELECT COUNT(*) FROM demo.visits GROUP BY CUBE (clinic, diagnosis, visit_date, cost > 10, cost > 20)", Refused(S::PROGRAM_LIMIT_EXCEEDED)),
            ("rollup of unit", "SELECT COUNT(*) FROM demo.visits GROUP BY ROLLUP (person_id)", Refused(S::INSUFFICIENT_PRIVILEGE)),
        ],
    );
}

#[test]
fn refusals_unsupported() {
    use SqlState as S;
    check(
        On::Demo,
        &[
            ("window aggregate", "SELECT COUNT(*) OVER () FROM demo.visits", Refused(S::FEATURE_NOT_SUPPORTED)),
            ("row_number", "SELECT row_number() OVER (ORDER BY cost) FROM demo.visits", Refused(S::FEATURE_NOT_SUPPORTED)),
            ("named window", "SELECT COUNT(*) FROM demo.visits WINDOW w AS (ORDER BY cost)", Refused(S::FEATURE_NOT_SUPPORTED)),
            ("scalar subquery in where", "SELECT COUNT(*) FROM demo.visits WHERE cost > (SELECT AVG(cost) FROM demo.visits)", Refused(S::FEATURE_NOT_SUPPORTED)),
            ("in subquery on another column", "SELECT COUNT(*) FROM demo.visits WHERE visit_id IN (SELECT visit_id FROM demo.prescriptions)", Refused(S::FEATURE_NOT_SUPPORTED)),
            ("uncorrelated exists", "SELECT COUNT(*) FROM demo.people p WHERE EXISTS (SELECT 1 FROM demo.visits v)", Refused(S::FEATURE_NOT_SUPPORTED)),
            ("union", "SELECT COUNT(*) FROM demo.visits UNION ALL SELECT COUNT(*) FROM demo.people", Refused(S::FEATURE_NOT_SUPPORTED)),
            ("cross join", "SELECT COUNT(*) FROM demo.people CROSS JOIN demo.regions", Refused(S::FEATURE_NOT_SUPPORTED)),
            ("comma join", "SELECT COUNT(*) FROM demo.visits v, demo.people p WHERE v.person_id = p.person_id", Refused(S::FEATURE_NOT_SUPPORTED)),
            ("natural join", "SELECT COUNT(*) FROM demo.visits NATURAL JOIN demo.people", Refused(S::FEATURE_NOT_SUPPORTED)),
            ("join on inequality", "SELECT COUNT(*) FROM demo.visits v JOIN demo.people p ON v.person_id < p.person_id", Refused(S::FEATURE_NOT_SUPPORTED)),
            ("left join of a table with a unit path", "SELECT COUNT(*) FROM demo.visits v LEFT JOIN demo.prescriptions r USING (visit_id)", Refused(S::FEATURE_NOT_SUPPORTED)),
            ("count(*) over a left join that keeps public rows", "SELECT r.name, COUNT(*) FROM demo.regions r LEFT JOIN demo.people p USING (region) GROUP BY r.name", Refused(S::FEATURE_NOT_SUPPORTED)),
            ("a public column aggregated over a left join that keeps public rows", "SELECT r.name, COUNT(r.population) FROM demo.regions r LEFT JOIN demo.people p USING (region) GROUP BY r.name", Refused(S::FEATURE_NOT_SUPPORTED)),
            ("a private key over a left join that keeps public rows", "SELECT p.sex, COUNT(p.person_id) FROM demo.regions r LEFT JOIN demo.people p USING (region) GROUP BY p.sex", Refused(S::FEATURE_NOT_SUPPORTED)),
            ("select distinct with an aggregate", "SELECT DISTINCT COUNT(*) FROM demo.visits", Refused(S::FEATURE_NOT_SUPPORTED)),
            ("quantile filter", "SELECT MEDIAN(cost) FILTER (WHERE cost > 10) FROM demo.visits", Refused(S::FEATURE_NOT_SUPPORTED)),
            ("filter with window", "SELECT COUNT(*) FILTER (WHERE cost > 10) OVER () FROM demo.visits", Refused(S::FEATURE_NOT_SUPPORTED)),
            ("nested aggregate", "SELECT SUM(COUNT(*)) FROM demo.visits", Refused(S::FEATURE_NOT_SUPPORTED)),
            ("aggregate in where", "SELECT COUNT(*) FROM demo.visits WHERE COUNT(*) > 1", Refused(S::FEATURE_NOT_SUPPORTED)),
            ("sum distinct", "SELECT SUM(DISTINCT cost) FROM demo.visits", Refused(S::FEATURE_NOT_SUPPORTED)),
            ("regex operator", "SELECT COUNT(*) FROM demo.visits WHERE diagnosis ~ '^J0'", Refused(S::FEATURE_NOT_SUPPORTED)),
            ("similar to", "SELECT COUNT(*) FROM demo.visits WHERE diagnosis SIMILAR TO 'J%'", Refused(S::FEATURE_NOT_SUPPORTED)),
            ("modulo", "SELECT COUNT(*) FROM demo.people WHERE age % 2 = 0", Refused(S::FEATURE_NOT_SUPPORTED)),
            ("like column pattern", "SELECT COUNT(*) FROM demo.visits WHERE diagnosis LIKE clinic", Refused(S::FEATURE_NOT_SUPPORTED)),
            ("like escape clause", "SELECT COUNT(*) FROM demo.visits WHERE diagnosis LIKE 'J!%' ESCAPE '!'", Refused(S::FEATURE_NOT_SUPPORTED)),
            ("date arithmetic", "SELECT COUNT(*) FROM demo.visits WHERE visit_date + 1 > DATE '2024-01-01'", Refused(S::FEATURE_NOT_SUPPORTED)),
            ("mode within group", "SELECT mode() WITHIN GROUP (ORDER BY age) FROM demo.people", Refused(S::FEATURE_NOT_SUPPORTED)),
            ("greater than any of an array", "SELECT COUNT(*) FROM demo.people WHERE age > ANY(ARRAY[30, 40])", Refused(S::FEATURE_NOT_SUPPORTED)),
            ("any of an empty array", "SELECT COUNT(*) FROM demo.people WHERE age = ANY(ARRAY[])", Refused(S::FEATURE_NOT_SUPPORTED)),
            ("date_trunc unit from data", "SELECT COUNT(*) FROM demo.visits WHERE date_trunc(clinic, visit_date) IS NULL", Refused(S::FEATURE_NOT_SUPPORTED)),
            ("fetch first", "SELECT clinic, COUNT(*) FROM demo.visits GROUP BY clinic FETCH FIRST 3 ROWS ONLY", Refused(S::FEATURE_NOT_SUPPORTED)),
            ("tablesample", "SELECT COUNT(*) FROM demo.visits TABLESAMPLE BERNOULLI (10)", Refused(S::FEATURE_NOT_SUPPORTED)),
            ("floor with scale", "SELECT SUM(FLOOR(cost, 1)) FROM demo.visits", Refused(S::FEATURE_NOT_SUPPORTED)),
            ("values body", "VALUES (1)", Refused(S::FEATURE_NOT_SUPPORTED)),
        ],
    );
}

#[test]
fn refusals_data_dependent_errors_and_limits() {
    use SqlState as S;
    let many_aggregates = format!(
        "SELECT {} FROM demo.people",
        (0..=limits::AGGREGATES_PER_QUERY_MAX)
            .map(|i| format!("SUM(age + {i})"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let long_in_list = format!(
        "SELECT COUNT(*) FROM demo.people WHERE age IN ({})",
        (0..=limits::IN_LIST_VALUES_MAX)
            .map(|i| i.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    let many_joins = format!(
        "SELECT COUNT(*) FROM demo.visits v0{}",
        (1..=limits::JOINED_TABLES_MAX)
            .map(|i| format!(" JOIN demo.visits v{i} ON v{i}.person_id = v0.person_id"))
            .collect::<String>()
    );
    let leak = |s: String| -> &'static str { Box::leak(s.into_boxed_str()) };
    check(
        On::Demo,
        &[
            ("bad date literal", "SELECT COUNT(*) FROM demo.visits WHERE visit_date > DATE '2023-02-30'", Refused(S::INVALID_PARAMETER_VALUE)),
            ("bad date string compared", "SELECT COUNT(*) FROM demo.visits WHERE visit_date > 'yesterday'", Refused(S::INVALID_PARAMETER_VALUE)),
            ("impossible month in a date string", "SELECT COUNT(*) FROM demo.visits WHERE visit_date > '2024-13-01'", Refused(S::INVALID_PARAMETER_VALUE)),
            ("bad date in case key", "SELECT CASE WHEN visit_date < DATE '2024-13-01' THEN 'a' ELSE 'b' END AS k, COUNT(*) FROM demo.visits GROUP BY 1", Refused(S::INVALID_PARAMETER_VALUE)),
            ("bad timestamp literal", "SELECT COUNT(*) FROM demo.visits WHERE date_trunc('day', visit_date) = TIMESTAMP 'soon'", Refused(S::INVALID_PARAMETER_VALUE)),
            ("integer product computed in numeric", "SELECT COUNT(*) FROM demo.people WHERE age * 99999999999 > 0", Accepted("unit=person_id caps=(g1,r1) where=CAST((age) AS NUMERIC) * CAST((99999999999) AS NUMERIC) > 0 keys=[] aggs=[count(*)] out=[count=a0]")),
            ("typed literal smuggling", "SELECT COUNT(*) FROM demo.visits WHERE visit_date > DATE 'x\\'') SELECT 1 --'", Refused(S::INVALID_PARAMETER_VALUE)),
            ("date_trunc unknown unit", "SELECT COUNT(*) FROM demo.visits WHERE date_trunc('fortnight', visit_date) IS NOT NULL", Refused(S::INVALID_PARAMETER_VALUE)),
            ("date_part unknown unit", "SELECT COUNT(*) FROM demo.visits WHERE date_part('fortnight', visit_date) > 0", Refused(S::INVALID_PARAMETER_VALUE)),
            ("quantile fraction out of range", "SELECT PERCENTILE_CONT(1.5) WITHIN GROUP (ORDER BY cost) FROM demo.visits", Refused(S::INVALID_PARAMETER_VALUE)),
            ("like pattern ending in escape", "SELECT COUNT(*) FROM demo.visits WHERE diagnosis LIKE 'J\\'", Refused(S::SYNTAX_ERROR)),
            ("sum of text", "SELECT SUM(diagnosis) FROM demo.visits", Refused(S::SYNTAX_ERROR)),
            ("case key mixed types", "SELECT CASE WHEN age < 18 THEN 'child' ELSE 1 END AS band, COUNT(*) FROM demo.people GROUP BY 1", Refused(S::SYNTAX_ERROR)),
            ("where not boolean", "SELECT COUNT(*) FROM demo.people WHERE age", Refused(S::SYNTAX_ERROR)),
            ("too many group keys", "SELECT COUNT(*) FROM demo.visits JOIN demo.people USING (person_id) GROUP BY clinic, diagnosis, visit_date, age, sex, region, education, lower(clinic), lower(diagnosis)", Refused(S::PROGRAM_LIMIT_EXCEEDED)),
            ("too many aggregates", leak(many_aggregates), Refused(S::PROGRAM_LIMIT_EXCEEDED)),
            ("in list too long", leak(long_in_list), Refused(S::PROGRAM_LIMIT_EXCEEDED)),
            ("too many joined tables", leak(many_joins), Refused(S::PROGRAM_LIMIT_EXCEEDED)),
        ],
    );
}

/// The table checks itself: a wrong expectation fails, so no row can pass vacuously.
#[test]
#[should_panic(expected = "1 of 1 rows failed")]
fn a_wrong_expectation_fails() {
    check(
        On::Demo,
        &[(
            "wrong caps",
            "SELECT COUNT(*) FROM demo.visits",
            Accepted("unit=person_id caps=(g1,r11) keys=[] aggs=[count(*)] out=[count=a0]"),
        )],
    );
}

/// Messages name tables as the analyst did, never by pgdp's generated aliases (issue 21).
#[test]
fn refusals_name_what_the_analyst_wrote() {
    let policy = policy(On::Demo);
    let ctx = Context {
        policy: &policy,
        search_path: search_path(On::Demo),
    };
    for (sql, shown) in [
        (
            "SELECT AVG(n) FROM (SELECT person_id, COUNT(*) * 2 AS n FROM demo.visits GROUP BY person_id) t",
            "the bounds of t.\"n\" are not known",
        ),
        (
            "SELECT SUM(per_person.n) FROM (SELECT person_id, MAX(visit_id) - MIN(visit_id) AS n FROM demo.visits GROUP BY person_id) AS per_person",
            "the bounds of per_person.\"n\" are not known",
        ),
    ] {
        let message = analyze_sql(sql, &ctx).expect_err(sql).to_string();
        assert!(!message.contains(RESERVED_PREFIX), "{sql}: {message}");
        assert!(message.contains(shown), "{sql}: {message}");
    }
}

/// Every refused semijoin form says what to write instead: its hint shows a supported semijoin
/// (`… IN (SELECT …)` or `… EXISTS (SELECT …)`), or a join for a public filter (issue 15).
#[test]
fn semijoin_refusals_hint_a_supported_form() {
    let policy = policy(On::Demo);
    let ctx = Context {
        policy: &policy,
        search_path: search_path(On::Demo),
    };
    for sql in [
        "SELECT COUNT(*) FROM demo.people WHERE person_id NOT IN (SELECT person_id FROM demo.visits)",
        "SELECT COUNT(*) FROM demo.people WHERE age IN (SELECT person_id FROM demo.visits)",
        "SELECT COUNT(*) FROM demo.people WHERE person_id IN (SELECT visit_id FROM demo.visits)",
        "SELECT COUNT(*) FROM demo.people WHERE person_id IN (SELECT person_id FROM demo.visits ORDER BY cost LIMIT 10)",
        "SELECT COUNT(*) FROM demo.people WHERE person_id IN (SELECT DISTINCT ON (clinic) person_id FROM demo.visits)",
        "SELECT COUNT(*) FROM demo.people WHERE person_id IN (SELECT MAX(person_id) FROM demo.visits)",
        "SELECT COUNT(*) FROM demo.people WHERE person_id IN (SELECT person_id FROM demo.visits GROUP BY clinic)",
        "SELECT COUNT(*) FROM demo.people WHERE EXISTS (SELECT 1 FROM demo.visits WHERE cost > 1999)",
        "SELECT COUNT(*) FROM demo.people p WHERE EXISTS (SELECT 1 FROM demo.visits v WHERE v.visit_id = p.person_id)",
        "SELECT COUNT(*) FROM demo.people p WHERE EXISTS (SELECT 1 FROM demo.visits v WHERE v.person_id = p.person_id AND v.cost > p.income)",
        "SELECT COUNT(*) FROM demo.people p WHERE EXISTS (SELECT COUNT(*) FROM demo.visits v WHERE v.person_id = p.person_id)",
        "SELECT COUNT(*) FROM demo.people WHERE age > 90 OR person_id IN (SELECT person_id FROM demo.visits)",
        "SELECT COUNT(*) FROM demo.people WHERE region IN (SELECT region FROM demo.regions)",
    ] {
        let e = analyze_sql(sql, &ctx).expect_err(sql);
        assert_eq!(e.sqlstate(), SqlState::FEATURE_NOT_SUPPORTED, "{sql}: {e}");
        let hint = e.hint().unwrap_or_default();
        assert!(
            hint.contains("IN (SELECT") || hint.contains("EXISTS (SELECT") || hint.contains("JOIN"),
            "{sql}: {e} (hint: {hint})"
        );
        assert!(!hint.contains(RESERVED_PREFIX) && !e.to_string().contains(RESERVED_PREFIX), "{sql}");
    }
}

/// Refused grouping forms and key casts say what to write instead (issue 15): nested grouping
/// constructs show the supported GROUPING SETS / ROLLUP forms, GROUPING without grouping sets
/// shows ROLLUP, and a failing cast of EXTRACT / date_part or date_bin shows the key that works.
#[test]
fn grouping_and_key_refusals_hint_a_supported_form() {
    let policy = policy(On::Demo);
    let ctx = Context {
        policy: &policy,
        search_path: search_path(On::Demo),
    };
    for (sql, code, shown) in [
        (
            "SELECT region, COUNT(*) FROM demo.people GROUP BY GROUPING SETS ((region), ROLLUP (sex))",
            SqlState::FEATURE_NOT_SUPPORTED,
            "GROUPING SETS ((a, b), (a), ())",
        ),
        (
            "SELECT region, GROUPING(region), COUNT(*) FROM demo.people GROUP BY region",
            SqlState::FEATURE_NOT_SUPPORTED,
            "ROLLUP",
        ),
        (
            "SELECT EXTRACT(YEAR FROM visit_date)::int / 10 AS y, COUNT(*) FROM demo.visits GROUP BY 1",
            SqlState::INSUFFICIENT_PRIVILEGE,
            "GROUP BY EXTRACT(YEAR FROM visit_date)::int",
        ),
        (
            "SELECT date_bin('1 month', visit_date, DATE '2024-01-01') AS w, COUNT(*) FROM demo.visits GROUP BY 1",
            SqlState::FEATURE_NOT_SUPPORTED,
            "date_trunc('month'",
        ),
        // Issue 42: a total row above the groups is one grouping-sets query; a denominator
        // from a second query is the same query with FILTER.
        (
            "SELECT sex, COUNT(*) FROM demo.people GROUP BY sex UNION ALL SELECT 'all', COUNT(*) FROM demo.people",
            SqlState::FEATURE_NOT_SUPPORTED,
            "GROUP BY ROLLUP (sex)",
        ),
        (
            "SELECT COUNT(*) * 1.0 / (SELECT COUNT(*) FROM demo.visits) FROM demo.visits WHERE cost > 100",
            SqlState::FEATURE_NOT_SUPPORTED,
            "COUNT(*) FILTER (WHERE <condition>) * 1.0 / COUNT(*) FROM <table>",
        ),
    ] {
        let e = analyze_sql(sql, &ctx).expect_err(sql);
        assert_eq!(e.sqlstate(), code, "{sql}: {e}");
        let hint = e.hint().unwrap_or_default();
        assert!(hint.contains(shown), "{sql}: {e} (hint: {hint})");
    }
}

/// Refusals of unsupported syntax show a way to write the question that pgdp answers (issue
/// 15): every 0A000 here carries a hint, and no hint names a generated identifier.
#[test]
fn unsupported_forms_hint_a_supported_form() {
    let policy = policy(On::Demo);
    let ctx = Context {
        policy: &policy,
        search_path: search_path(On::Demo),
    };
    for sql in [
        "SELECT COUNT(*) FROM generate_series(1, 10)",
        "SELECT COUNT(*) FROM demo.people AS p (a, b)",
        "SELECT COUNT(*) FROM demo.people TABLESAMPLE SYSTEM (10)",
        "SELECT (SELECT COUNT(*) FROM demo.people)",
        "SELECT SUM(age ORDER BY age) FROM demo.people",
        "SELECT MEDIAN(DISTINCT age) FROM demo.people",
        "SELECT COUNT(*) FROM demo.people, demo.regions",
        "SELECT round(age, places => 0), COUNT(*) FROM demo.people GROUP BY 1",
        "SELECT SUM(DISTINCT age) FROM demo.people",
        "SELECT COUNT(*) FROM (SELECT DISTINCT ON (person_id) person_id FROM demo.visits) t",
        "WITH RECURSIVE r AS (SELECT 1 AS n) SELECT COUNT(*) FROM demo.people",
        "SELECT sex, COUNT(*) FROM demo.people GROUP BY sex HAVING COUNT(*) > ANY (SELECT 1)",
        "SELECT COUNT(*) FROM demo.people WHERE person_id NOT IN (SELECT person_id FROM demo.visits)",
    ] {
        let e = analyze_sql(sql, &ctx).expect_err(sql);
        assert_eq!(e.sqlstate(), SqlState::FEATURE_NOT_SUPPORTED, "{sql}: {e}");
        let hint = e.hint().unwrap_or_default();
        assert!(hint.len() > 10, "{sql}: {e} has no hint");
        assert!(!hint.contains(RESERVED_PREFIX), "{sql}: {hint}");
    }
}

/// Forms ORMs and BI tools write (issue 40): a LEFT JOIN of a private table on the privacy unit
/// (Django's join over a nullable foreign key), SELECT DISTINCT as group keys (a filter list).
#[test]
fn left_joins_on_the_unit_and_distinct_keys() {
    check(
        On::Demo,
        &[
            ("left join on the unit", "SELECT COUNT(*) FROM demo.people p LEFT JOIN demo.visits v USING (person_id)", Accepted("unit=person_id caps=(g1,r10) tables=[demo.people:private, demo.visits:private] on=[person_id = t1.person_id] keys=[] aggs=[count(*)] out=[count=a0]")),
            ("select distinct", "SELECT DISTINCT diagnosis FROM demo.visits", Accepted("unit=person_id caps=(g5,r10) keys=[diagnosis:text:private] aggs=[] out=[diagnosis=k0]")),
            ("keys without aggregate", "SELECT region FROM demo.people GROUP BY region", Accepted("unit=person_id caps=(g1,r1) keys=[region:text:listed[CE, EA, IS, NE, NO, NW, SE, SO, SW, WE]] aggs=[] out=[region=k0]")),
            ("select all", "SELECT ALL COUNT(*) FROM demo.visits", Accepted("unit=person_id caps=(g1,r10) keys=[] aggs=[count(*)] out=[count=a0]")),
            // Issue 42: a public table first, a private one LEFT JOINed: every public row a group.
            ("left join keeping public rows", "SELECT r.name, COUNT(p.person_id), AVG(p.income) FROM demo.regions r LEFT JOIN demo.people p ON p.region = r.region GROUP BY r.name", Accepted("unit=t1.person_id caps=(g1,r1) tables=[demo.regions:public, demo.people:private] on=[region = t1.region] keys=[name:text:table demo.regions.name] aggs=[count(t1.person_id), avg(t1.income)[0,250000]] out=[name=k0, count=a0, avg=a1]")),
        ],
    );
}

/// Questions of existence are answered from noisy counts of the same rows (issue 42,
/// existence.rs): bool_or / bool_and / every as a CASE over detected counts of the rows that
/// meet (fail) the condition and of the rows where it is not NULL, `SELECT [NOT] EXISTS (…)`
/// as whether the count of the subquery's rows is detected; each detected count shares its
/// count's measure. Shapes with no such count (a grouped EXISTS, a call inside a per-unit
/// subquery) stay refused with a hint whose rewrite asks the same question, and the analyst
/// cannot call the internal function.
#[test]
fn existence_is_answered_from_detected_counts() {
    let policy = policy(On::Demo);
    let ctx = Context {
        policy: &policy,
        search_path: search_path(On::Demo),
    };
    let detected = |plan: &Plan| -> Vec<String> {
        plan.aggregates
            .iter()
            .filter(|a| a.kind == AggregateKind::Detected)
            .map(aggregate_text)
            .collect()
    };
    for (sql, counts, output) in [
        (
            "SELECT EXISTS (SELECT 1 FROM demo.people WHERE age > 100)",
            vec!["detected()"],
            "exists",
        ),
        (
            "SELECT NOT EXISTS (SELECT * FROM demo.visits v WHERE v.cost > 1500 AND v.clinic = 'C01' LIMIT 1) AS none",
            vec!["detected()"],
            "none",
        ),
        (
            "SELECT region, bool_or(age > 90) AS old FROM demo.people GROUP BY region",
            vec![
                "detected(CASE WHEN (age > 90) THEN 1 END)",
                "detected((age > 90))",
            ],
            "old",
        ),
        (
            "SELECT bool_or(clinic = 'C01') FROM demo.visits",
            vec![
                "detected(CASE WHEN (clinic = 'C01') THEN 1 END)",
                "detected((clinic = 'C01'))",
            ],
            "bool_or",
        ),
        (
            "SELECT bool_and(cost < 1000) FILTER (WHERE clinic = 'C01') FROM demo.visits",
            vec![
                "detected(CASE WHEN NOT (cost < 1000) AND (clinic = 'C01') THEN 1 END)",
                "detected(CASE WHEN clinic = 'C01' THEN (cost < 1000) END)",
            ],
            "bool_and",
        ),
    ] {
        let plan = analyze_sql(sql, &ctx).unwrap_or_else(|e| panic!("{sql}: {e}"));
        let found = detected(&plan);
        assert_eq!(found, counts, "{sql}");
        assert!(
            plan.outputs.iter().any(|o| o.name == output),
            "{sql}: {:?}",
            plan.outputs
        );
        for a in plan.aggregates.iter().filter(|a| a.kind == AggregateKind::Detected) {
            assert_eq!(a.result, crate::output::CellType::Bool, "{sql}");
        }
        if let Some(post) = plan.post() {
            assert!(
                post.sql().contains("CASE WHEN") || post.sql().contains("NOT ("),
                "{sql}: {}",
                post.sql()
            );
            // The shadow types the released relation with the count as a boolean test.
            assert!(
                !post.measures_statement().contains("__dp_detected"),
                "{sql}: {}",
                post.measures_statement()
            );
        }
    }
    // HAVING and two questions in one statement.
    let plan = analyze_sql(
        "SELECT region, COUNT(*) FROM demo.people GROUP BY region HAVING bool_or(age > 90)",
        &ctx,
    )
    .expect("HAVING bool_or");
    assert_eq!(detected(&plan).len(), 2);
    let plan = analyze_sql(
        "SELECT bool_and(cost < 1000), EVERY(cost < 1000) FROM demo.visits",
        &ctx,
    )
    .expect("bool_and and every");
    assert_eq!(detected(&plan).len(), 2, "the same counts serve both");
    // Still refused, with a hint that answers the same question as a count.
    for (sql, shown) in [
        (
            "SELECT EXISTS (SELECT 1 FROM demo.people GROUP BY region HAVING COUNT(*) > 5)",
            ": SELECT COUNT(*) FROM … WHERE …",
        ),
        (
            "SELECT AVG(o) FROM (SELECT person_id, bool_or(cost > 1000) AS o FROM demo.visits GROUP BY person_id) t",
            "bool_or(cost > 1000) is LEAST(COUNT(CASE WHEN cost > 1000 THEN 1 END), 1)",
        ),
        (
            "SELECT AVG(o) FROM (SELECT person_id, bool_and(cost > 10)::int AS o FROM demo.visits GROUP BY person_id) t",
            "bool_and(cost > 10) is 1 - LEAST(COUNT(CASE WHEN NOT (cost > 10) THEN 1 END), 1)",
        ),
        (
            "SELECT COUNT(*) FROM demo.people WHERE EXISTS (SELECT 1 FROM demo.regions WHERE bool_or(true))",
            "",
        ),
    ] {
        let e = analyze_sql(sql, &ctx).expect_err(sql);
        let hint = e.hint().unwrap_or_default();
        assert!(hint.contains(shown), "{sql}: {e} (hint: {hint})");
        assert!(!hint.contains(RESERVED_PREFIX), "{sql}: {hint}");
    }
    // The per-person values the hints show are answered.
    for sql in [
        "SELECT AVG(o) FROM (SELECT person_id, LEAST(COUNT(CASE WHEN cost > 1000 THEN 1 END), 1) AS o FROM demo.visits GROUP BY person_id) t",
        "SELECT AVG(o) FROM (SELECT person_id, 1 - LEAST(COUNT(CASE WHEN NOT (cost > 10) THEN 1 END), 1) AS o FROM demo.visits GROUP BY person_id) t",
    ] {
        analyze_sql(sql, &ctx).unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
    // The internal function is pgdp's own.
    let e =
        analyze_sql("SELECT __dp_detected(COUNT(*)) FROM demo.people", &ctx).expect_err("reserved");
    assert!(!e.to_string().is_empty());
    let e = analyze_sql("SELECT \"__DP_DETECTED\"(COUNT(*)) FROM demo.people", &ctx)
        .expect_err("reserved, quoted");
    assert!(!e.to_string().is_empty());
}

// ---------------------------------------------------------------------------------------------
// corr, covar_*, regr_*: post-processing of bounded sums (moments.rs)
// ---------------------------------------------------------------------------------------------

#[test]
fn bivariate_statistics_are_post_processing_of_bounded_sums() {
    let policy = policy(On::Demo);
    let ctx = Context {
        policy: &policy,
        search_path: search_path(On::Demo),
    };
    // corr needs the count and the five centred sums, each released once.
    let plan = analyze_sql("SELECT corr(income, age) FROM demo.people", &ctx).expect("answered");
    let aggregates: Vec<String> = plan.aggregates.iter().map(|a| short(&a.text)).collect();
    assert_eq!(aggregates.len(), 6, "{aggregates:?}");
    assert!(
        aggregates.iter().any(|a| a.starts_with("count(CASE WHEN")),
        "{aggregates:?}"
    );
    let text = summary(&plan);
    assert!(text.contains("out=[corr=c0]"), "{text}");
    // Centred on the bounds' midpoints: age in [0, 100] → ±50, income in [0, 250000] → ±125000,
    // so the product's sum has bounds ±6.25e6 (not 2.5e7 uncentred).
    assert!(text.contains("[-6250000,6250000]"), "{text}");
    assert!(text.contains("[-50,50]"), "{text}");
    assert!(text.contains("AS DOUBLE PRECISION"), "{text}");
    // The statistic is clipped into its range: no noisy value reads as a correlation above 1.
    assert!(text.contains("GREATEST(-(1), LEAST(1,"), "{text}");
    // A slope needs the count and four sums; regr_count is the count alone, a bare aggregate.
    let plan =
        analyze_sql("SELECT regr_slope(income, age) FROM demo.people", &ctx).expect("answered");
    assert_eq!(plan.aggregates.len(), 5, "{}", summary(&plan));
    let plan =
        analyze_sql("SELECT regr_count(income, age) FROM demo.people", &ctx).expect("answered");
    let text = summary(&plan);
    assert!(text.contains("out=[regr_count=a0]"), "{text}");
    assert!(plan.post.is_none(), "{text}");
    // Calls share their sums: a slope and an intercept over the same arguments, grouped, with FILTER.
    let plan = analyze_sql(
        "SELECT sex, regr_slope(income, age) AS b, regr_intercept(income, age) FILTER (WHERE region = 'NO') AS a FROM demo.people GROUP BY sex ORDER BY corr(income, age)",
        &ctx,
    )
    .expect("answered");
    let text = summary(&plan);
    assert!(text.contains("out=[sex=k0, b=c1, a=c2]"), "{text}");
    // slope: 5; the filtered intercept: 5 of its own; corr adds the sum of Y² only.
    assert_eq!(plan.aggregates.len(), 5 + 5 + 1, "{text}");
    use SqlState as S;
    check(
        On::Demo,
        &[
            (
                "corr over a window",
                "SELECT corr(income, age) OVER () FROM demo.people",
                Refused(S::FEATURE_NOT_SUPPORTED),
            ),
            (
                "corr distinct",
                "SELECT corr(DISTINCT income, age) FROM demo.people",
                Refused(S::FEATURE_NOT_SUPPORTED),
            ),
            (
                "corr of one argument",
                "SELECT corr(income) FROM demo.people",
                Refused(S::SYNTAX_ERROR),
            ),
            (
                "corr of text",
                "SELECT corr(income, sex) FROM demo.people",
                Refused(S::SYNTAX_ERROR),
            ),
            (
                "corr of an unbounded expression",
                "SELECT corr(income * income, age / age) FROM demo.people",
                Refused(S::INSUFFICIENT_PRIVILEGE),
            ),
        ],
    );
}

// ---------------------------------------------------------------------------------------------
// MIN / MAX / MEDIAN / PERCENTILE_DISC of a date: a quantile of day numbers (dates.rs)
// ---------------------------------------------------------------------------------------------

/// The demo policy with two timestamp columns on demo.visits: `seen_at` (timestamptz, bounded)
/// and `logged` (timestamp, unbounded).
fn timestamped_demo() -> Policy {
    let line = "      visit_date: { type: date, groupable: true, lower: '2020-01-01', upper: '2026-12-31' }\n";
    assert!(DEMO_YAML.contains(line));
    let yaml = DEMO_YAML.replace(
        line,
        &format!("{line}      seen_at: {{ type: timestamp with time zone, lower: '2020-01-01', upper: '2026-12-31 23:59:59+00' }}\n      logged: {{ type: timestamp }}\n      entered: {{ type: timestamp(3), lower: '2020-01-01 06:00:00', upper: '2027-01-01' }}\n"),
    );
    crate::policy::parse(&yaml).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn timestamp_quantiles_are_quantiles_of_clamped_epoch_seconds() {
    let policy = timestamped_demo();
    let ctx = Context {
        policy: &policy,
        search_path: search_path(On::Demo),
    };
    let plan = analyze_sql(
        "SELECT MIN(seen_at), MAX(entered) AS last, median(seen_at) FROM demo.visits",
        &ctx,
    )
    .expect("answered");
    let text = summary(&plan);
    // 2020-01-01 00:00 UTC is 1577836800 s after 1970; 2026-12-31 23:59:59 is 1798761599.
    assert!(
        text.contains("LEAST(GREATEST(EXTRACT(EPOCH FROM seen_at), 1577836800), 1798761599)"),
        "{text}"
    );
    assert!(text.contains("[1577836800,1798761599]"), "{text}");
    // The timestamp without time zone counts from its own midnight, 06:00 is 21600 s later.
    assert!(text.contains("[1577858400,1798761600]"), "{text}");
    assert!(
        text.contains("TIMESTAMPTZ '1970-01-01 00:00:00+00' + CAST(pg_catalog.round("),
        "{text}"
    );
    assert!(
        text.contains("TIMESTAMP '1970-01-01 00:00:00' + CAST(pg_catalog.round("),
        "{text}"
    );
    assert!(text.contains("INTERVAL '1 second'"), "{text}");
    assert!(text.contains("out=[min=c0, last=c1, median=c2]"), "{text}");
    assert_eq!(plan.aggregates.len(), 3, "{text}");
    // A timestamp's bounds are its quantiles' alone: no expression inherits them.
    let e = analyze_sql(
        "SELECT MIN(date_trunc('day', seen_at)) FROM demo.visits",
        &ctx,
    )
    .expect_err("an expression of a timestamp");
    assert_eq!(e.sqlstate(), SqlState::INSUFFICIENT_PRIVILEGE);
    assert!(
        e.hint()
            .is_some_and(|h| h.contains("date_trunc('day', min(ts))")),
        "{e:?}"
    );
    let e = analyze_sql("SELECT MAX(logged) FROM demo.visits", &ctx).expect_err("no bounds");
    assert_eq!(e.sqlstate(), SqlState::INSUFFICIENT_PRIVILEGE);
    assert!(
        e.hint()
            .is_some_and(|h| h.contains("Declare the range of demo.visits.logged")),
        "{e:?}"
    );
    // The monotone form the hint shows is answered: post-processing of the release.
    analyze_sql(
        "SELECT date_trunc('day', MIN(seen_at)) FROM demo.visits",
        &ctx,
    )
    .expect("answered");
    analyze_sql(
        "SELECT COUNT(*) FROM demo.visits WHERE seen_at >= TIMESTAMPTZ '2024-01-01 00:00:00+00'",
        &ctx,
    )
    .expect("a filter on a bounded timestamp is as before");
    let e = analyze_sql(
        "SELECT SUM(EXTRACT(EPOCH FROM seen_at)) FROM demo.visits",
        &ctx,
    )
    .expect_err("a sum of epoch seconds has no bounds");
    assert_eq!(e.sqlstate(), SqlState::INSUFFICIENT_PRIVILEGE);
}

#[test]
fn timestamps_at_time_zone_utc_are_answered_and_other_zones_refused() {
    let policy = timestamped_demo();
    let ctx = Context {
        policy: &policy,
        search_path: search_path(On::Demo),
    };
    // What Django writes for TruncMonth, `__date` and ExtractHour of a DateTimeField (USE_TZ).
    for sql in [
        "SELECT DATE_TRUNC('month', checked_in AT TIME ZONE 'UTC') AS m, COUNT(*) FROM demo.visits GROUP BY 1",
        "SELECT COUNT(*) FROM demo.visits WHERE (seen_at AT TIME ZONE 'UTC')::date >= DATE '2024-01-01'",
        "SELECT EXTRACT(HOUR FROM checked_in AT TIME ZONE 'Etc/UTC') AS h, COUNT(*) FROM demo.visits GROUP BY 1",
        "SELECT COUNT(*) FROM demo.visits WHERE date_trunc('day', logged AT TIME ZONE 'utc') < TIMESTAMPTZ '2024-01-01 00:00:00+00'",
        "SELECT date_trunc('month', checked_in AT TIME ZONE $1) AS m, COUNT(*) FROM demo.visits GROUP BY 1",
    ] {
        let plan = analyze_sql(sql, &ctx).unwrap_or_else(|e| panic!("{sql}: {e:?}"));
        assert!(summary(&plan).contains("AT TIME ZONE"), "{}", summary(&plan));
    }
    for (sql, state) in [
        (
            "SELECT COUNT(*) FROM demo.visits WHERE (seen_at AT TIME ZONE 'Europe/Oslo')::date >= DATE '2024-01-01'",
            SqlState::FEATURE_NOT_SUPPORTED,
        ),
        (
            "SELECT COUNT(*) FROM demo.visits WHERE (seen_at AT TIME ZONE clinic) IS NULL",
            SqlState::FEATURE_NOT_SUPPORTED,
        ),
        (
            "SELECT COUNT(*) FROM demo.visits WHERE (visit_date AT TIME ZONE 'UTC') IS NULL",
            SqlState::FEATURE_NOT_SUPPORTED,
        ),
    ] {
        let e = analyze_sql(sql, &ctx).expect_err(sql);
        assert_eq!(e.sqlstate(), state, "{sql}: {e:?}");
    }
}

#[test]
fn date_quantiles_are_quantiles_of_day_numbers() {
    let policy = policy(On::Demo);
    let ctx = Context {
        policy: &policy,
        search_path: search_path(On::Demo),
    };
    let plan = analyze_sql(
        "SELECT MIN(visit_date), MAX(visit_date) AS last FROM demo.visits",
        &ctx,
    )
    .expect("answered");
    let text = summary(&plan);
    // The policy's dates 2020-01-01 and 2026-12-31 are days 7305 and 9861 since 2000-01-01.
    assert!(text.contains("[7305,9861]"), "{text}");
    assert!(text.contains("out=[min=c0, last=c1]"), "{text}");
    assert!(
        text.contains("DATE '2000-01-01' + CAST(pg_catalog.round("),
        "{text}"
    );
    assert_eq!(plan.aggregates.len(), 2, "{text}");
    // Per group, and PERCENTILE_DISC; a numeric quantile beside them is unchanged.
    let plan = analyze_sql(
        "SELECT clinic, percentile_disc(0.5) WITHIN GROUP (ORDER BY visit_date) AS mid, MAX(cost) FROM demo.visits GROUP BY clinic",
        &ctx,
    )
    .expect("answered");
    let text = summary(&plan);
    assert!(text.contains("out=[clinic=k0, mid=c1, max=a1]"), "{text}");
    use SqlState as S;
    check(
        On::Demo,
        &[
            ("a date without bounds", "SELECT MIN(d) FROM (SELECT person_id, CAST(date_trunc('month', visit_date) AS date) AS d FROM demo.visits) t", Refused(S::INSUFFICIENT_PRIVILEGE)),
            ("percentile_cont of a date", "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY visit_date) FROM demo.visits", Refused(S::FEATURE_NOT_SUPPORTED)),
            ("the days between dates sum with bounds", "SELECT SUM(visit_date - DATE '2020-01-01') FROM demo.visits", Accepted("unit=person_id caps=(g1,r10) keys=[] aggs=[sum((CASE WHEN pg_catalog.isfinite(visit_date) AND pg_catalog.isfinite(DATE '2020-01-01') THEN (visit_date) - (DATE '2020-01-01') END))[0,2556]] out=[sum=a0]")),
        ],
    );
}

/// Under `pgdp.accuracy`, post-processing keeps the `_error95` column of each output that is an
/// aggregate as released, read from the released relation's `e<i>`, with ORDER BY positions
/// moved past the added columns; computed outputs have none, an outer query's bare references to
/// the inner aggregates keep theirs.
#[test]
fn post_processing_keeps_the_error_bounds_of_released_aggregates() {
    let policy = policy(On::Demo);
    let ctx = Context {
        policy: &policy,
        search_path: search_path(On::Demo),
    };
    let plan = analyze_sql(
        "SELECT clinic, COUNT(*), ROUND(AVG(cost), 2) AS avg_cost FROM demo.visits GROUP BY clinic HAVING COUNT(*) > 10 ORDER BY 3 DESC, 2 LIMIT 5",
        &ctx,
    )
    .expect("answered");
    let post = plan.post().expect("post-processing");
    let errors = post.with_errors().expect("_error95 columns");
    assert_eq!(
        errors,
        "SELECT \"__dp_released\".\"k0\" AS \"clinic\", \"__dp_released\".\"a0\" AS \"count\", \"__dp_released\".\"e0\" AS \"count_error95\", pg_catalog.round(\"__dp_released\".\"a1\", 2) AS \"avg_cost\" FROM \"__dp_released\" WHERE \"__dp_released\".\"a0\" > 10 ORDER BY 4 DESC, 2 LIMIT 5",
        "{}",
        post.sql()
    );
    assert!(
        post.sql().ends_with("ORDER BY 3 DESC, 2 LIMIT 5"),
        "{}",
        post.sql()
    );
    // Metabase's form: the outer query's item that is the inner aggregate keeps its bound, named
    // after the outer item; a key and an expression over the aggregate get none.
    let outer = "SELECT \"source\".\"clinic\" AS \"clinic\", \"source\".\"n\" AS \"visits\", s2 FROM (SELECT clinic, COUNT(*) AS n, COUNT(*) * 2 AS s2 FROM demo.visits GROUP BY clinic) AS \"source\" WHERE \"source\".\"n\" > 5 ORDER BY 2 DESC LIMIT 2000";
    let plan = analyze_sql(outer, &ctx).expect("answered");
    let post = plan.post().expect("post-processing");
    let errors = post.with_errors().expect("_error95 columns");
    assert!(
        errors.starts_with("SELECT \"source\".\"clinic\" AS \"clinic\", \"source\".\"n\" AS \"visits\", \"source\".\"n_error95\" AS \"visits_error95\", s2 FROM (SELECT "),
        "{errors}"
    );
    assert!(errors.contains("AS \"n_error95\""), "{errors}");
    assert!(
        errors.ends_with("AS \"source\" WHERE \"source\".\"n\" > 5 ORDER BY 2 DESC LIMIT 2000"),
        "{errors}"
    );
    assert!(!errors.contains("s2_error95"), "{errors}");
    // `*` keeps the inner bounds; beside a sort by position, none.
    let star = "SELECT * FROM (SELECT clinic, COUNT(*) AS n FROM demo.visits GROUP BY clinic) AS s";
    let plan = analyze_sql(star, &ctx).expect("answered");
    assert!(plan
        .post()
        .and_then(|p| p.with_errors())
        .is_some_and(|e| e.starts_with("SELECT * FROM (") && e.contains("\"n_error95\"")));
    let plan = analyze_sql(&format!("{star} ORDER BY 2"), &ctx).expect("answered");
    assert_eq!(plan.post().and_then(|p| p.with_errors()), None);
}
