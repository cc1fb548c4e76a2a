//! Result column types: a DP query's answer has the column names and types PostgreSQL gives the
//! same SQL (compared with a Describe of that SQL on the upstream itself), and its values are
//! the same in the binary format as in the text format (each binary value compared with the
//! bytes PostgreSQL's own `send` function makes of the text value).

use tokio_postgres::types::{FromSql, Type};
use tokio_postgres::Statement;

use crate::support::{policy_with_budget, upstream_client, Proxy};

/// Supported DP queries over every kind of column and aggregate the demo has. Each runs once
/// (ε = 2, so that partition selection releases groups) and is then replayed for free.
const QUERIES: &[&str] = &[
    "SELECT region, COUNT(*), AVG(income), SUM(income) FROM demo.people GROUP BY region",
    "SELECT sex, COUNT(DISTINCT person_id), STDDEV(age), VAR_POP(income) FROM demo.people GROUP BY sex",
    "SELECT COUNT(*) FROM demo.visits",
    "SELECT SUM(age), AVG(age), MIN(age), MAX(age) FROM demo.people",
    "SELECT age, COUNT(*) FROM demo.people GROUP BY age",
    "SELECT SUM(cost), AVG(cost), MAX(cost) FROM demo.visits",
    "SELECT visit_date, COUNT(*) FROM demo.visits GROUP BY visit_date",
    "SELECT date_trunc('month', visit_date) AS month, COUNT(*) FROM demo.visits GROUP BY 1",
    "SELECT EXTRACT(YEAR FROM visit_date) AS year, SUM(cost) FROM demo.visits GROUP BY 1",
    "SELECT drug, SUM(quantity), AVG(quantity) FROM demo.prescriptions GROUP BY drug",
    "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY income) FROM demo.people",
    // Semijoins on the privacy unit: the filter changes no column.
    "SELECT sex, COUNT(*), AVG(income), SUM(age) FROM demo.people WHERE person_id IN (SELECT person_id FROM demo.visits WHERE diagnosis = 'J06') GROUP BY sex",
    "SELECT clinic, SUM(cost), MAX(cost) FROM demo.visits v WHERE EXISTS (SELECT 1 FROM demo.people p WHERE p.person_id = v.person_id AND p.age > 60) GROUP BY clinic",
    "SELECT COUNT(*), AVG(age) FROM demo.people p WHERE NOT EXISTS (SELECT 1 FROM demo.visits v WHERE v.person_id = p.person_id GROUP BY v.person_id HAVING SUM(v.cost) > 5000)",
    "SELECT region, ROUND(AVG(income), 2) AS mean FROM demo.people WHERE person_id IN (SELECT person_id FROM demo.visits WHERE clinic = 'C01') GROUP BY region ORDER BY mean DESC",
    "SELECT s.region, s.n FROM (SELECT region, COUNT(*) AS n FROM demo.people p WHERE EXISTS (SELECT 1 FROM demo.visits v WHERE v.person_id = p.person_id) GROUP BY region) s WHERE s.n > 10",
    // Post-processing of released values, typed and evaluated by PostgreSQL.
    "SELECT region, ROUND(AVG(income), 2) AS avg_income FROM demo.people GROUP BY region ORDER BY avg_income DESC",
    "SELECT COUNT(*) * 100.0 / 100000 AS pct, COUNT(*)::int AS n, SUM(age) / COUNT(*) AS mean_age FROM demo.people",
    "SELECT region, 100.0 * COUNT(*) / SUM(COUNT(*)) OVER () AS share, RANK() OVER (ORDER BY COUNT(*) DESC) FROM demo.people GROUP BY region",
    "SELECT SUM(cost) / COUNT(DISTINCT person_id) AS cost_per_person FROM demo.visits",
    "SELECT sex, CASE WHEN AVG(age) > 40 THEN 'older' ELSE 'younger' END AS band, to_char(COUNT(*), 'FM999999') AS n FROM demo.people GROUP BY sex",
    "SELECT to_char(date_trunc('month', visit_date), 'YYYY-MM') AS month, COUNT(*) FROM demo.visits GROUP BY date_trunc('month', visit_date) ORDER BY 1",
    // Unquoted aliases are folded to lower case, quoted ones kept (regression: `AS N` was "N").
    "SELECT COUNT(*) AS N, AVG(age) AS \"MeanAge\", SUM(age) AS Total_Age FROM demo.people",
    "SELECT region AS Region, ROUND(AVG(income), 1) AS Mean FROM demo.people GROUP BY region",
    "SELECT \"source\".* FROM (SELECT region, COUNT(*) AS \"count\", AVG(age) FROM demo.people GROUP BY region ORDER BY region) AS \"source\" LIMIT 2000",
    // Grouping sets: rolled-up keys are NULL in their own column's type; GROUPING() is int4.
    "SELECT sex, region, COUNT(*), AVG(income) FROM demo.people GROUP BY ROLLUP (sex, region)",
    "SELECT sex, age, COUNT(*), GROUPING(sex, age) FROM demo.people GROUP BY CUBE (sex, age)",
    "SELECT region, COUNT(*), SUM(income) FROM demo.people GROUP BY GROUPING SETS ((region), ())",
    "SELECT sex, region, clinic, COUNT(*) FROM demo.people JOIN demo.visits USING (person_id) GROUP BY sex, ROLLUP (region, clinic)",
    "SELECT CASE WHEN GROUPING(region) = 1 THEN 'all' ELSE region END AS region, ROUND(AVG(income), 2) AS mean FROM demo.people GROUP BY ROLLUP (region) ORDER BY 1",
    "SELECT date_trunc('month', visit_date) AS month, clinic, COUNT(*) FROM demo.visits GROUP BY ROLLUP (1, 2)",
    // Integer casts of EXTRACT keys: grouped by the EXTRACT, the released keys cast (int4, int2).
    "SELECT EXTRACT(YEAR FROM visit_date)::int AS y, COUNT(*) FROM demo.visits GROUP BY 1 ORDER BY 1",
    "SELECT date_bin('7 days', visit_date, DATE '2023-01-02') AS week, COUNT(*) FROM demo.visits GROUP BY 1 ORDER BY 1",
    "SELECT date_bin(INTERVAL '1 day', visit_date, TIMESTAMP '2023-01-01 06:00') AS day, COUNT(*) FROM demo.visits GROUP BY 1 ORDER BY 1",
    "SELECT (CAST(extract(dow from \"demo\".\"visits\".\"visit_date\") AS integer) + 1) AS \"visit_date\", count(*) AS \"count\" FROM \"demo\".\"visits\" GROUP BY (CAST(extract(dow from \"demo\".\"visits\".\"visit_date\") AS integer) + 1) ORDER BY (CAST(extract(dow from \"demo\".\"visits\".\"visit_date\") AS integer) + 1) ASC",
    "SELECT extract(year from CAST(\"demo\".\"visits\".\"visit_date\" AS timestamp)) AS \"visit_date\", count(*) AS \"count\" FROM \"demo\".\"visits\" GROUP BY extract(year from CAST(\"demo\".\"visits\".\"visit_date\" AS timestamp)) ORDER BY extract(year from CAST(\"demo\".\"visits\".\"visit_date\" AS timestamp)) ASC",
    "SELECT to_char(visit_date, 'YYYY-MM') AS month, COUNT(*) FROM demo.visits GROUP BY 1 ORDER BY 1",
    "SELECT CAST(extract(month from \"demo\".\"visits\".\"visit_date\") AS integer) AS \"visit_date\", count(*) AS \"count\" FROM \"demo\".\"visits\" GROUP BY CAST(extract(month from \"demo\".\"visits\".\"visit_date\") AS integer) ORDER BY CAST(extract(month from \"demo\".\"visits\".\"visit_date\") AS integer) ASC",
    "SELECT date_part('dow', visit_date)::smallint AS weekday, AVG(cost) FROM demo.visits GROUP BY date_part('dow', visit_date)::smallint",
    // date_trunc of a timestamp is a timestamp (of a date, timestamptz); date_part is float8; a
    // public table's int4 column stays int4 as a key.
    "SELECT date_trunc('month', CAST(visit_date AS timestamp)) AS month, COUNT(*) FROM demo.visits GROUP BY 1",
    "SELECT date_part('year', visit_date) AS y, COUNT(*) FROM demo.visits GROUP BY 1",
    "SELECT r.population, COUNT(*) FROM demo.people p JOIN demo.regions r ON p.region = r.region GROUP BY 1",
    // Windows partitioned by the privacy unit in a view: row_number is int8, ntile int4, lag
    // keeps its argument's type, a date difference is int4 (SUM int8, MAX int4, AVG numeric).
    "WITH v AS (SELECT person_id, ROW_NUMBER() OVER (PARTITION BY person_id ORDER BY visit_date) AS visit_no FROM demo.visits) SELECT visit_no, COUNT(*) FROM v WHERE visit_no <= 3 GROUP BY visit_no",
    "SELECT q, COUNT(*), AVG(prev), MAX(prev) FROM (SELECT person_id, ntile(4) OVER (PARTITION BY person_id ORDER BY cost) AS q, lag(cost, 1, 0) OVER (PARTITION BY person_id ORDER BY visit_date) AS prev FROM demo.visits) t GROUP BY q",
    "WITH v AS (SELECT person_id, LEAST(GREATEST(visit_date - MIN(visit_date) OVER (PARTITION BY person_id), 0), 3650) AS days FROM demo.visits) SELECT SUM(days), MAX(days), AVG(days) FROM v",
];

/// A value's bytes as sent, whatever its type.
struct Bytes(Vec<u8>);

impl<'a> FromSql<'a> for Bytes {
    fn from_sql(_: &Type, raw: &'a [u8]) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        Ok(Bytes(raw.to_vec()))
    }

    fn accepts(_: &Type) -> bool {
        true
    }
}

fn shape(statement: &Statement) -> Vec<(String, Type)> {
    statement
        .columns()
        .iter()
        .map(|c| (c.name().to_string(), c.type_().clone()))
        .collect()
}

#[tokio::test]
async fn dp_answers_have_the_column_types_postgresql_gives_the_same_sql() {
    let proxy = Proxy::with_policy(policy_with_budget(100, 2), 41).await;
    let s = proxy.connect().await;
    s.batch_execute("SET pgdp.epsilon = 2")
        .await
        .expect("SET pgdp.epsilon");
    let direct = upstream_client().await;
    for sql in QUERIES {
        let expected = direct
            .prepare(sql)
            .await
            .unwrap_or_else(|e| panic!("upstream: {sql}: {e}"));
        let statement = s
            .prepare(sql)
            .await
            .unwrap_or_else(|e| panic!("pgdp: {sql}: {e:?}"));
        assert_eq!(shape(&statement), shape(&expected), "{sql}");

        // The extended protocol asks for binary results; the simple protocol then gets the same
        // answer again from the replay cache, as text.
        let binary = s
            .query(&statement, &[])
            .await
            .unwrap_or_else(|e| panic!("pgdp: {sql}: {e:?}"));
        let text = s.simple_rows(sql).await.expect("replayed");
        assert_eq!(binary.len(), text.len(), "{sql}");
        assert!(!text.is_empty(), "{sql}: no rows");
        for (row, text_row) in binary.iter().zip(&text) {
            for (i, column) in statement.columns().iter().enumerate() {
                let sent: Option<Bytes> = row.get(i);
                let Some(value) = &text_row[i] else {
                    assert!(sent.is_none(), "{sql}: column {i} NULL as text only");
                    continue;
                };
                // PostgreSQL's binary form of the text value, by the type's own send function.
                let cast = format!("SELECT $1::text::{}", column.type_().name());
                let reference: Bytes = direct
                    .query_one(&cast, &[value])
                    .await
                    .unwrap_or_else(|e| panic!("{sql}: {value} as {}: {e}", column.type_()))
                    .get(0);
                assert_eq!(
                    sent.map(|b| b.0),
                    Some(reference.0),
                    "{sql}: column {} ({}) = {value}",
                    column.name(),
                    column.type_()
                );
            }
        }
    }
    proxy.stop().await;
}
