//! Dates and timestamps at the ends of PostgreSQL's ranges: the SQL pgdp sends never fails on
//! them, and everywhere PostgreSQL itself answers, it answers the same.
//!
//! Regression: `date_trunc('month', d)` of a date after 294276 AD, `date_trunc('millennium', d)`
//! of a date before 4000 BC `date_part('year', d)`, `to_char(d, …)` and `CAST(d AS timestamp)` of such dates fail with "out of range", and `d - DATE '…'` of an infinite date with "cannot subtract infinite dates",
//! only when a row holds such a value. An analyst could learn from the error alone that a person
//! (`WHERE person_id = 5`) has one. pgdp guards the argument (`datetime_range_guard`); these
//! tests run its rewritten SQL on a real PostgreSQL over a table of edge values, in several
//! session time zones.

use pgdp::dp::analyze::{self, Context};
use pgdp::dp::rewrite;
use pgdp::policy::{self, Policy};
use pgdp::session::classify::{self, Statement};
use tokio_postgres::SimpleQueryMessage;

use crate::harness;

const SECRET: &str = "datetime-ranges-secret";

const POLICY: &str = r#"
database: edges
analysts:
  a:
    scram_verifier: "SCRAM-SHA-256$4096:cGdkcC1kZW1vLXNhbHQtMQ==$lInLWt8gswE0sagso62TdobVlP/4N1mG//OTC1uOjxU=:Cs+4xOdBEHF3GmuzWiAu/lrFp8VOJ+dfMKys15hYAlg="
    budget: { epsilon: 10, delta: 1.0e-5 }
tables:
  edge.events:
    kind: private
    privacy_unit: person_id
    max_groups_per_unit: 100
    max_rows_per_unit: 100
    columns:
      person_id: { type: bigint }
      d:         { type: date, groupable: true }
      ts:        { type: timestamp, groupable: true }
      tz:        { type: timestamptz, groupable: true }
"#;

/// Dates near both ends of the date and timestamp ranges, ±infinity, NULL and ordinary ones.
const DATES: &[&str] = &[
    "4714-11-24 BC",
    "4714-11-30 BC",
    "4714-12-05 BC",
    "4713-01-01 BC",
    "4713-06-01 BC",
    "4712-06-01 BC",
    "4711-01-01 BC",
    "4705-06-01 BC",
    "4700-01-01 BC",
    "4650-06-01 BC",
    "4001-06-01 BC",
    "4000-01-01 BC",
    "3999-06-01 BC",
    "0001-01-01 BC",
    "0001-01-01",
    "2024-02-29",
    "294276-11-30",
    "294276-12-31",
    "294277-01-01",
    "300000-01-01",
    "5874897-12-31",
    "infinity",
    "-infinity",
];

/// The dates of [`DATES`] where pgdp answers ±infinity and PostgreSQL may answer (in some time
/// zones): the first week and the last day of the timestamp range.
const TOLERATED: &[&str] = &["4714-11-24 BC", "4714-11-30 BC", "294276-12-31"];

/// Whether `date_bin` bins a date of [`DATES`] as ±infinity while PostgreSQL answers for some
/// origins and strides: before 4000 BC, after 200000 AD, and on the bound 4000-01-01 BC itself
/// (in a time zone far from UTC its UTC midnight lies before the bound's).
fn date_bin_tolerated(date: &str) -> bool {
    let bound = DATES.iter().position(|d| *d == "4000-01-01 BC");
    let at = DATES.iter().position(|d| *d == date);
    matches!((at, bound), (Some(i), Some(b)) if i <= b) || date.starts_with("294276-")
}

/// The dates of [`DATES`] after the last timestamp.
const BEYOND_TIMESTAMPS: &[&str] = &["294277-01-01", "300000-01-01", "5874897-12-31"];

const UNITS: &[&str] = &[
    "microseconds",
    "milliseconds",
    "second",
    "minute",
    "hour",
    "day",
    "week",
    "month",
    "quarter",
    "year",
    "decade",
    "century",
    "millennium",
];

/// Zones with the largest offsets either way, and UTC.
const ZONES: &[&str] = &[
    "UTC",
    "Pacific/Kiritimati",
    "Pacific/Niue",
    "America/Los_Angeles",
];

fn policy() -> Policy {
    policy::parse(POLICY).unwrap_or_else(|e| panic!("edge policy: {e}"))
}

/// The upstream SQL pgdp sends for `sql` to one server, and to shards (the partitionwise shape,
/// whose time buckets are date arithmetic: `rewrite::bucket_start_sql`).
fn rewritten(policy: &Policy, sql: &str) -> (String, String) {
    let statements = classify::classify(sql).unwrap_or_else(|e| panic!("{sql}: {e}"));
    let [Statement::Query(query)] = statements.as_slice() else {
        panic!("{sql}: not one query");
    };
    let ctx = Context {
        policy,
        search_path: vec!["edge".into()],
    };
    let plan = analyze::analyze(query, &ctx).unwrap_or_else(|e| panic!("{sql}: {e}"));
    let rw = rewrite::rewrite(&plan, &[], SECRET).unwrap_or_else(|e| panic!("{sql}: {e}"));
    let single = rw.sql.to_string();
    let shaped = rewrite::partitionwise(rw, policy, true).unwrap_or_else(|e| panic!("{sql}: {e}"));
    (single, shaped.sql.to_string())
}

/// The first column of every row of `sql`, or the error's message.
async fn keys(client: &tokio_postgres::Client, sql: &str) -> Result<Vec<Option<String>>, String> {
    let messages = client.simple_query(sql).await.map_err(|e| {
        e.as_db_error()
            .map(|d| d.message().to_string())
            .unwrap_or_else(|| e.to_string())
    })?;
    let mut out: Vec<Option<String>> = messages
        .into_iter()
        .filter_map(|m| match m {
            SimpleQueryMessage::Row(r) => Some(r.get(0).map(str::to_string)),
            _ => None,
        })
        .collect();
    out.sort();
    Ok(out)
}

#[tokio::test]
async fn date_trunc_and_date_part_never_fail_on_edge_values_and_agree_where_postgresql_answers() {
    let db = harness::fresh_database("datetime_ranges").await;
    let client = db.client().await;
    client
        .batch_execute(
            "CREATE SCHEMA edge;
             CREATE TABLE edge.events (person_id bigint, d date, ts timestamp, tz timestamptz);",
        )
        .await
        .expect("create the edge table");
    // One person per value; the timestamps at midnight and just before the next midnight.
    for (i, d) in DATES.iter().enumerate() {
        for (j, time) in ["00:00:00", "23:59:59"].iter().enumerate() {
            let person = (i * 2 + j) as i64;
            // Dates past the timestamp range have no timestamp: those rows keep only the date.
            let ts = if d.contains("infinity") {
                format!("TIMESTAMP '{d}'")
            } else if BEYOND_TIMESTAMPS.contains(d) {
                "NULL".to_string()
            } else {
                format!("TIMESTAMP '{}'", with_time(d, time))
            };
            client
                .batch_execute(&format!(
                    "SET TimeZone = 'UTC'; INSERT INTO edge.events VALUES ({person}, DATE '{d}', {ts}, {ts})"
                ))
                .await
                .unwrap_or_else(|e| panic!("insert {d}: {e}"));
        }
    }
    client
        .batch_execute("INSERT INTO edge.events VALUES (999, NULL, NULL, NULL)")
        .await
        .expect("insert NULLs");

    let policy = policy();
    let mut answered = 0;
    let mut buckets = 0;
    let mut years = 0;
    for zone in ZONES {
        client
            .batch_execute(&format!("SET TimeZone = '{zone}'"))
            .await
            .expect("set the zone");
        for column in ["d", "ts", "tz"] {
            let mut expressions: Vec<(String, Option<&str>)> = UNITS
                .iter()
                .map(|u| (format!("date_trunc('{u}', {column})"), Some(*u)))
                .collect();
            expressions.push((format!("date_part('year', {column})"), None));
            expressions.push((format!("EXTRACT(YEAR FROM {column})"), None));
            expressions.push((format!("date_part('dow', {column})"), None));
            expressions.push((format!("to_char({column}, 'YYYY-MM-DD HH24 BC')"), None));
            if column == "d" {
                expressions.push(("CAST(d AS timestamp)".to_string(), None));
                expressions.push(("extract(dow from CAST(d AS timestamp))".to_string(), None));
                // date - date fails on ±infinity ("cannot subtract infinite dates").
                expressions.push(("d - DATE '2000-01-01'".to_string(), None));
                expressions.push(("DATE '2000-01-01' - d".to_string(), None));
            }
            for origin in ["DATE '0001-01-01'", "TIMESTAMP '9999-12-31 23:00'"] {
                for stride in ["'1 second'", "'7 days'", "'36500 days'"] {
                    expressions.push((format!("date_bin({stride}, {column}, {origin})"), None));
                }
            }
            for (expression, _) in &expressions {
                let (sql, shaped) = rewritten(
                    &policy,
                    &format!("SELECT {expression} AS k, COUNT(*) FROM edge.events GROUP BY 1"),
                );
                let through_pgdp = keys(&client, &sql).await.unwrap_or_else(|e| {
                    panic!("{zone}: {expression}: the rewritten SQL failed ({e}): {sql}")
                });
                // The shards' shape gives the same keys, with the same text.
                let on_shards = keys(&client, &shaped).await.unwrap_or_else(|e| {
                    panic!("{zone}: {expression}: the partitionwise SQL failed ({e}): {shaped}")
                });
                assert_eq!(on_shards, through_pgdp, "{zone}: {expression}: {shaped}");
                if expression.starts_with("date_trunc(")
                    && column != "tz"
                    && ["day", "week", "month", "quarter", "year"]
                        .iter()
                        .any(|u| expression.contains(&format!("'{u}'")))
                {
                    assert!(
                        !shaped.contains("date_trunc"),
                        "{expression}: the shards' shape keeps date_trunc: {shaped}"
                    );
                    buckets += 1;
                }
                // A year of a date or timestamp is grouped on the shards by its first day: the
                // function reads only the key (`__dp_k0`), never the column (`"__dp_t0"."d"`).
                if !expression.starts_with("date_trunc")
                    && expression.to_ascii_lowercase().contains("year")
                    && column != "tz"
                {
                    assert!(
                        !shaped.contains("date_part('year', \"")
                            && !shaped.contains("EXTRACT(YEAR FROM \""),
                        "{expression}: the shards' shape keeps the year's function in stage 1: {shaped}"
                    );
                    years += 1;
                }
                // PostgreSQL's own answer over the rows it can answer for: every such key must
                // be among pgdp's, with the same text.
                let mut plain = Vec::new();
                let rows = client
                    .query("SELECT person_id FROM edge.events", &[])
                    .await
                    .expect("people");
                for row in rows {
                    let person: i64 = row.get(0);
                    if person == 999 {
                        continue;
                    }
                    let one = format!(
                        "SELECT CAST({expression} AS TEXT) FROM edge.events WHERE person_id = {person}"
                    );
                    if let Ok(k) = keys(&client, &one).await {
                        plain.extend(k.into_iter().map(|k| (person as usize, k)));
                        answered += 1;
                    }
                }
                for (person, key) in plain {
                    let date = DATES[person / 2];
                    let tolerated = if expression.starts_with("date_bin") {
                        date_bin_tolerated(date)
                    } else {
                        TOLERATED.contains(&date)
                    };
                    if tolerated {
                        continue;
                    }
                    assert!(
                        through_pgdp.contains(&key),
                        "{zone}: {expression}: PostgreSQL gives {key:?}, pgdp's SQL gives {through_pgdp:?}"
                    );
                }
            }
        }
    }
    assert!(answered > 0, "PostgreSQL answered for some rows");
    assert_eq!(
        buckets,
        ZONES.len() * 2 * 5,
        "time buckets in date arithmetic"
    );
    assert_eq!(
        years,
        ZONES.len() * 2 * 2,
        "years of a date or timestamp in date arithmetic"
    );
    db.drop_db().await;
}

/// The first day of each unit in date arithmetic (`rewrite::bucket_start_sql`, what the shards
/// compute for `date_trunc`) is PostgreSQL's `date_trunc` on every day of 1890–2110, every day
/// of the first and last three years of the timestamp range (from 4713 BC, whose years start
/// within it), and every 997th day between.
#[tokio::test]
async fn the_shards_time_buckets_are_date_trunc_over_the_calendar() {
    let client = harness::upstream().await.admin_client().await;
    let days = "(SELECT d FROM (
            SELECT DATE '1890-01-01' + i AS d FROM generate_series(0, 80717) AS i
            UNION ALL SELECT DATE '4713-01-01 BC' + i FROM generate_series(0, 3 * 366) AS i
            UNION ALL SELECT DATE '294273-11-30' + i FROM generate_series(0, 3 * 366) AS i
            UNION ALL SELECT DATE '4713-01-01 BC' + i * 997 FROM generate_series(0, 108000) AS i
        ) AS s WHERE d <= DATE '294276-11-30') AS days";
    for unit in ["day", "week", "month", "quarter", "year"] {
        let start = rewrite::bucket_start_sql(unit, "d").expect("a unit of whole days");
        let sql = format!(
            "SELECT COUNT(*), COUNT(*) FILTER (WHERE {start} IS DISTINCT FROM CAST(date_trunc('{unit}', CAST(d AS timestamp)) AS date)), MIN(d)::text, MAX(d)::text FROM {days}"
        );
        let row = client
            .query_one(sql.as_str(), &[])
            .await
            .unwrap_or_else(|e| panic!("{unit}: {e}: {sql}"));
        let (n, wrong): (i64, i64) = (row.get(0), row.get(1));
        let (first, last): (String, String) = (row.get(2), row.get(3));
        assert!(n > 190_000, "{unit}: {n} days");
        assert_eq!(
            (first.as_str(), last.as_str()),
            ("4713-01-01 BC", "294276-11-30")
        );
        assert_eq!(
            wrong, 0,
            "{unit}: {wrong} of {n} days disagree with date_trunc"
        );
    }
}

/// `date '2024-02-29'` with a time of day.
fn with_time(date: &str, time: &str) -> String {
    match date.strip_suffix(" BC") {
        Some(d) => format!("{d} {time} BC"),
        None => format!("{date} {time}"),
    }
}
