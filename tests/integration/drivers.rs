//! What ORMs, drivers and BI tools send, through the wire with tokio-postgres (issue 40): the
//! statements Sequelize, Knex, Prisma, Django and Superset generate, each as the tool writes it
//! (their own test programs are in `tools_*`). Every answer is compared with PostgreSQL's column
//! types for the same SQL on the upstream; public data exactly with the upstream's rows.
//!
//! Tolerances: a count of people (one row per person, no cap) with ε = 1 has discrete Laplace
//! noise of scale 1 (Gaussian noise of a similar σ under `auto`); ±1,000 is hundreds of scales,
//! so a correct pgdp fails with negligible probability, and the fixed seed makes each run pass or
//! fail the same way.

use tokio_postgres::types::Type;

use crate::support::{assert_code, policy_with_budget, upstream_client, Proxy, Session};

async fn rich_proxy(seed: u8) -> Proxy {
    Proxy::with_policy(policy_with_budget(1000, 2), seed).await
}

/// The column types PostgreSQL gives `sql` on the upstream.
async fn upstream_types(sql: &str) -> Vec<Type> {
    let upstream = upstream_client().await;
    let statement = upstream
        .prepare(sql)
        .await
        .unwrap_or_else(|e| panic!("upstream prepare {sql}: {e}"));
    statement
        .columns()
        .iter()
        .map(|c| c.type_().clone())
        .collect()
}

async fn types_of(s: &Session, sql: &str) -> Vec<Type> {
    s.prepare(sql)
        .await
        .unwrap_or_else(|e| panic!("prepare {sql}: {e}"))
        .columns()
        .iter()
        .map(|c| c.type_().clone())
        .collect()
}

fn people_count_plausible(n: i64) {
    assert!((99_000..=101_000).contains(&n), "count of people {n}");
}

#[tokio::test]
async fn sequelize_connection_setup_sets_a_fixed_offset_time_zone() {
    let proxy = rich_proxy(81).await;
    let s = proxy.connect().await;
    // Sequelize 6's set-up string on every new connection, one simple-protocol message.
    s.batch_execute(
        "SET client_min_messages TO warning;SET TIME ZONE INTERVAL '+00:00' HOUR TO MINUTE;",
    )
    .await
    .expect("Sequelize's connection set-up");
    // As PostgreSQL 15 answers.
    assert_eq!(s.show("TimeZone").await, "<+00>-00");
    s.batch_execute("SET TIME ZONE INTERVAL '+05:30' HOUR TO MINUTE")
        .await
        .expect("an offset with minutes");
    assert_eq!(s.show("TimeZone").await, "<+05:30>-05:30");
    // DP queries run under it upstream (the zone must be one PostgreSQL accepts).
    let n: i64 = s
        .query_one("SELECT COUNT(*) FROM demo.people", &[])
        .await
        .expect("a DP query under the offset zone")
        .get(0);
    people_count_plausible(n);
    let e = s
        .batch_execute("SET TIME ZONE INTERVAL '1 fortnight'")
        .await
        .expect_err("not an offset");
    assert_code(
        Err::<(), _>(e),
        &tokio_postgres::error::SqlState::FEATURE_NOT_SUPPORTED,
        "fortnight",
    );
    proxy.stop().await;
}

#[tokio::test]
async fn bound_limit_offset_and_values_where_literals_stand() {
    let proxy = rich_proxy(82).await;
    let s = proxy.connect().await;

    // Knex: `.orderBy('n', 'desc').limit(3)`, LIMIT bound as a parameter (int8, as PostgreSQL
    // infers it).
    let sql =
        "SELECT region, COUNT(*) AS n FROM demo.people GROUP BY region ORDER BY n DESC LIMIT $1";
    let statement = s.prepare(sql).await.expect("prepare with LIMIT $1");
    assert_eq!(statement.params(), &[Type::INT8]);
    let rows = s.query(&statement, &[&3i64]).await.expect("LIMIT $1 = 3");
    assert_eq!(rows.len(), 3);
    let counts: Vec<i64> = rows.iter().map(|r| r.get(1)).collect();
    assert!(counts.windows(2).all(|w| w[0] >= w[1]), "{counts:?}");
    assert_eq!(types_of(&s, sql).await, upstream_types(sql).await);

    // SQLAlchemy with psycopg 3: `.order_by(region).limit(3).offset(2)` casts its parameters,
    // `LIMIT $1::INTEGER OFFSET $2::INTEGER`; the rows are PostgreSQL's for those counts over the
    // ten public regions, and a UNION takes the same counts.
    let cast = "SELECT region, COUNT(*) AS n FROM demo.people GROUP BY region ORDER BY region LIMIT $1::INTEGER OFFSET $2::INTEGER";
    let statement = s.prepare(cast).await.expect("prepare LIMIT $1::INTEGER");
    assert_eq!(statement.params(), &[Type::INT4, Type::INT4]);
    let rows = s
        .query(&statement, &[&3i32, &2i32])
        .await
        .expect("LIMIT 3 OFFSET 2");
    let regions: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
    assert_eq!(regions, ["IS", "NE", "NO"]);
    let union = "SELECT region, COUNT(*) FROM demo.people WHERE age < 50 GROUP BY region UNION ALL SELECT region, COUNT(*) FROM demo.people WHERE age >= 50 GROUP BY region ORDER BY 1 LIMIT '2'::int8 OFFSET 2.5";
    let rows = s
        .simple_query(union)
        .await
        .expect("a UNION with cast counts");
    let regions: Vec<&str> = rows
        .iter()
        .filter_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0),
            _ => None,
        })
        .collect();
    // CE, CE, EA, EA, IS, …: OFFSET 2.5 is OFFSET 3, as in PostgreSQL.
    assert_eq!(regions, ["EA", "IS"]);
    // Counts PostgreSQL refuses are refused with its SQLSTATE, before anything runs.
    let e = s.query(&statement, &[&-1i32, &0i32]).await;
    assert_code(
        e,
        &tokio_postgres::error::SqlState::INVALID_ROW_COUNT_IN_LIMIT_CLAUSE,
        "LIMIT must not be negative",
    );
    let e = s
        .simple_query("SELECT COUNT(*) FROM demo.people LIMIT '1.5'::integer")
        .await;
    assert_code(
        e,
        &tokio_postgres::error::SqlState::INVALID_TEXT_REPRESENTATION,
        "invalid input syntax for type integer",
    );

    // Prisma's count: rows wrapped in `… OFFSET $1` bound to 0, counted outside.
    let prisma = r#"SELECT COUNT(*) FROM (SELECT "demo"."people"."person_id" FROM "demo"."people" WHERE 1=1 OFFSET $1) AS "sub""#;
    let n: i64 = s
        .query_one(prisma, &[&0i64])
        .await
        .expect("Prisma's count")
        .get(0);
    people_count_plausible(n);
    // An offset that skips rows is still refused, and says which construct.
    let e = s.query_one(prisma, &[&5i64]).await;
    assert_code(
        e,
        &tokio_postgres::error::SqlState::FEATURE_NOT_SUPPORTED,
        "OFFSET 5 inside",
    );

    // Django with server-side binding: date_trunc's unit, a FILTER and a HAVING bound.
    let trunc = "SELECT DATE_TRUNC($1, visit_date) AS m, COUNT(*) AS n FROM demo.visits WHERE visit_date >= DATE '2024-01-01' GROUP BY 1 ORDER BY 1";
    let statement = s.prepare(trunc).await.expect("prepare DATE_TRUNC($1, …)");
    assert_eq!(statement.params(), &[Type::TEXT]);
    let expected = upstream_types(trunc).await;
    let got: Vec<Type> = statement
        .columns()
        .iter()
        .map(|c| c.type_().clone())
        .collect();
    assert_eq!(got, expected, "{trunc}");
    let months = s
        .query(&statement, &[&"month"])
        .await
        .expect("DATE_TRUNC('month', …)");
    assert_eq!(months.len(), 12, "the months of 2024");

    let filtered = "SELECT COUNT(*) FILTER (WHERE age >= $1) AS adults FROM demo.people";
    let adults: i64 = s
        .query_one(filtered, &[&30i32])
        .await
        .expect("FILTER (WHERE age >= $1)")
        .get(0);
    let truth: i64 = upstream_client()
        .await
        .query_one(
            "SELECT COUNT(*) FILTER (WHERE age >= 30) FROM demo.people",
            &[],
        )
        .await
        .expect("upstream")
        .get(0);
    assert!((adults - truth).abs() < 1_000, "{adults} against {truth}");

    let having =
        "SELECT region, COUNT(*) AS n FROM demo.people GROUP BY region HAVING COUNT(*) > $1";
    let big = s
        .query(having, &[&12_000i64])
        .await
        .expect("HAVING COUNT(*) > $1");
    assert!(big.iter().all(|r| r.get::<_, i64>(1) > 12_000));
    assert!(!big.is_empty() && big.len() < 10, "{} regions", big.len());

    // A JavaScript Date as Prisma and node-postgres bind it, against a date column.
    let dated = s
        .prepare_typed(
            "SELECT COUNT(*) AS n FROM demo.visits WHERE visit_date >= $1",
            &[Type::TEXT],
        )
        .await
        .expect("prepare with a text date");
    let n: i64 = s
        .query_one(&dated, &[&"2024-01-01 00:00:00"])
        .await
        .expect("a date bound with a time of day")
        .get(0);
    assert!(n > 0, "{n}");
    let e = s.query_one(&dated, &[&"yesterday-ish"]).await;
    assert_code(
        e,
        &tokio_postgres::error::SqlState::INVALID_PARAMETER_VALUE,
        "not a date",
    );
    proxy.stop().await;
}

#[tokio::test]
async fn time_ranges_as_superset_and_analysts_write_them() {
    let proxy = rich_proxy(83).await;
    let s = proxy.connect().await;
    // Superset's time range on a date column.
    let superset = "SELECT DATE_TRUNC('month', visit_date) AS visit_date, COUNT(*) AS count FROM demo.visits WHERE visit_date >= TO_DATE('2024-01-01', 'YYYY-MM-DD') AND visit_date < TO_DATE('2024-07-01', 'YYYY-MM-DD') GROUP BY DATE_TRUNC('month', visit_date) LIMIT 10000";
    let rows = s.query(superset, &[]).await.expect("Superset's time range");
    assert_eq!(rows.len(), 6, "January to June 2024");
    assert_eq!(types_of(&s, superset).await, upstream_types(superset).await);
    // EXPLAIN shows the folded constants in the upstream SQL.
    let plan: Vec<String> = s
        .simple_rows(&format!("EXPLAIN {superset}"))
        .await
        .expect("EXPLAIN")
        .into_iter()
        .filter_map(|r| r.into_iter().next().flatten())
        .collect();
    assert!(
        // Dollar-quoted, as every literal pgdp sends upstream.
        plan.iter()
            .any(|l| l.contains("DATE $__dp_s0$2024-01-01$__dp_s0$")),
        "{plan:#?}"
    );
    // An analyst's "last 12 months": relative to the clock, folded when the statement starts
    // (the demo's visits end in 2024, so the count is noise around zero).
    let relative =
        "SELECT COUNT(*) FROM demo.visits WHERE visit_date >= current_date - interval '365 days'";
    let n: i64 = s
        .query_one(relative, &[])
        .await
        .expect("current_date - interval")
        .get(0);
    assert!(n.abs() < 1_000, "{n}");
    let now = "SELECT COUNT(*) FROM demo.visits WHERE visit_date < date_trunc('month', now())";
    s.query_one(now, &[])
        .await
        .expect("date_trunc('month', now())");
    // A malformed format is PostgreSQL's error about the analyst's input, before any charge.
    let before = s.budget().await.epsilon_spent;
    let e = s
        .query_one(
            "SELECT COUNT(*) FROM demo.visits WHERE visit_date >= TO_DATE('2024-13-45', 'YYYY-MM-DD')",
            &[],
        )
        .await;
    assert!(e.is_err(), "{e:?}");
    assert_eq!(s.budget().await.epsilon_spent, before);
    proxy.stop().await;
}

#[tokio::test]
async fn public_tables_alone_are_answered_as_postgresql_answers_them_uncharged() {
    let proxy = rich_proxy(84).await;
    let s = proxy.connect().await;
    let upstream = upstream_client().await;
    for sql in [
        "SELECT region, name FROM demo.regions ORDER BY region",
        // Django's Region.objects.all()
        r#"SELECT "demo"."regions"."region", "demo"."regions"."name", "demo"."regions"."population" FROM "demo"."regions" ORDER BY "demo"."regions"."region" ASC"#,
        "SELECT * FROM demo.regions r ORDER BY r.population DESC LIMIT 3",
        "SELECT COUNT(*), SUM(population) FROM demo.regions",
    ] {
        let ours = s
            .simple_rows(sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
        let theirs: Vec<Vec<Option<String>>> = upstream
            .simple_query(sql)
            .await
            .expect("upstream")
            .into_iter()
            .filter_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(r) => {
                    Some((0..r.len()).map(|i| r.get(i).map(str::to_string)).collect())
                }
                _ => None,
            })
            .collect();
        assert_eq!(ours, theirs, "{sql}");
        assert_eq!(types_of(&s, sql).await, upstream_types(sql).await, "{sql}");
    }
    assert!(s.take_notices().is_empty(), "no charge, no NOTICE");
    assert_eq!(s.budget().await.epsilon_spent, 0.0);
    // Functions outside the list are refused, and so are undeclared columns.
    let e = s
        .query("SELECT pg_read_file('/etc/passwd') FROM demo.regions", &[])
        .await;
    assert_code(
        e,
        &tokio_postgres::error::SqlState::UNDEFINED_FUNCTION,
        "pg_read_file",
    );
    let e = s.query("SELECT xmin FROM demo.regions", &[]).await;
    assert!(e.is_err(), "a system column: {e:?}");
    // A public table joined to a private one stays a DP query.
    let n: i64 = s
        .query_one(
            "SELECT COUNT(*) FROM demo.people p JOIN demo.regions r ON r.region = p.region",
            &[],
        )
        .await
        .expect("DP join")
        .get(0);
    people_count_plausible(n);
    proxy.stop().await;
}

#[tokio::test]
async fn distinct_values_and_left_joins_on_the_unit() {
    let proxy = rich_proxy(85).await;
    let s = proxy.connect().await;
    // Superset's filter list over a public_values column: the declared values.
    let regions = s
        .simple_rows("SELECT DISTINCT region AS column_values FROM demo.people LIMIT 10000")
        .await
        .expect("SELECT DISTINCT of a public_values column");
    assert_eq!(regions.len(), 10, "{regions:?}");
    // Over a groupable column without a public list: released by partition selection.
    let clinics = s
        .simple_rows("SELECT DISTINCT clinic AS column_values FROM demo.visits LIMIT 10000")
        .await
        .expect("SELECT DISTINCT of a groupable column");
    assert!(!clinics.is_empty());
    let truth = upstream_client()
        .await
        .simple_query("SELECT DISTINCT clinic FROM demo.visits")
        .await
        .expect("upstream")
        .len();
    assert!(clinics.len() < truth, "{} of {truth}", clinics.len());
    // Django's join over a nullable foreign key.
    let join = r#"SELECT "demo"."people"."region" AS "person__region", COUNT("demo"."visits"."visit_id") AS "n" FROM "demo"."visits" LEFT OUTER JOIN "demo"."people" ON ("demo"."visits"."person_id" = "demo"."people"."person_id") GROUP BY 1"#;
    let rows = s
        .query(join, &[])
        .await
        .expect("LEFT OUTER JOIN on the unit");
    assert!(!rows.is_empty());
    assert_eq!(types_of(&s, join).await, upstream_types(join).await);
    // exists(): rows, refused with a message that names the aggregate form.
    let e = s
        .query(r#"SELECT 1 AS "a" FROM "demo"."people" LIMIT 1"#, &[])
        .await;
    let e = assert_code(
        e,
        &tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE,
        "exists()",
    );
    let hint = e
        .as_db_error()
        .and_then(|d| d.hint())
        .unwrap_or_default()
        .to_string();
    assert!(hint.contains("COUNT(*)"), "{hint}");
    proxy.stop().await;
}

#[tokio::test]
async fn catalog_shows_the_served_database_and_not_null_columns() {
    let proxy = rich_proxy(86).await;
    let s = proxy.connect().await;
    let names = s
        .simple_rows("SELECT datname FROM pg_catalog.pg_database ORDER BY 1")
        .await
        .expect("pg_database");
    assert_eq!(names, vec![vec![Some("pgdp_demo".to_string())]]);
    let nullable = s
        .simple_rows(
            "SELECT column_name, is_nullable FROM information_schema.columns WHERE table_schema = 'demo' AND table_name = 'people' AND column_name IN ('person_id', 'age') ORDER BY 1",
        )
        .await
        .expect("information_schema.columns");
    assert_eq!(
        nullable,
        vec![
            vec![Some("age".to_string()), Some("YES".to_string())],
            vec![Some("person_id".to_string()), Some("NO".to_string())],
        ]
    );
    // The upstream's primary keys (Sequelize's describeTable, Metabase's sync read them).
    let keys = s
        .simple_rows(
            "SELECT tc.table_name, kcu.column_name FROM information_schema.table_constraints tc JOIN information_schema.key_column_usage kcu ON kcu.constraint_name = tc.constraint_name AND kcu.table_schema = tc.table_schema WHERE tc.table_schema = 'demo' AND tc.constraint_type = 'PRIMARY KEY' ORDER BY 1",
        )
        .await
        .expect("primary keys");
    let upstream = upstream_client().await;
    let expected: Vec<Vec<Option<String>>> = upstream
        .query(
            "SELECT tc.table_name::text, kcu.column_name::text FROM information_schema.table_constraints tc JOIN information_schema.key_column_usage kcu ON kcu.constraint_name = tc.constraint_name AND kcu.table_schema = tc.table_schema WHERE tc.table_schema = 'demo' AND tc.constraint_type = 'PRIMARY KEY' ORDER BY 1",
            &[],
        )
        .await
        .expect("upstream primary keys")
        .iter()
        .map(|r| vec![Some(r.get::<_, String>(0)), Some(r.get::<_, String>(1))])
        .collect();
    assert!(!keys.is_empty());
    assert_eq!(keys, expected);
    proxy.stop().await;
}

#[tokio::test]
async fn set_config_is_the_set_it_means() {
    let proxy = rich_proxy(87).await;
    let s = proxy.connect().await;
    // Django on connect when its TIME_ZONE is not the server's, client-side binding.
    let rows = s
        .simple_rows("SELECT set_config('TimeZone', 'Europe/Berlin', false)")
        .await
        .expect("set_config");
    assert_eq!(rows, vec![vec![Some("Europe/Berlin".to_string())]]);
    assert_eq!(s.show("TimeZone").await, "Europe/Berlin");
    // Server-side binding: the value bound as $1, the column typed text.
    let statement = s
        .prepare("SELECT set_config('TimeZone', $1, false)")
        .await
        .expect("prepare set_config");
    assert_eq!(statement.columns()[0].type_(), &Type::TEXT);
    assert_eq!(statement.columns()[0].name(), "set_config");
    let row = s
        .query_one(&statement, &[&"UTC"])
        .await
        .expect("set_config with $1");
    assert_eq!(row.get::<_, String>(0), "UTC");
    assert_eq!(s.show("TimeZone").await, "UTC");
    // A zone PostgreSQL does not know is refused as SET refuses it, and the zone stays.
    assert_code(
        s.simple_rows("SELECT set_config('TimeZone', 'Mars/Olympus', false)")
            .await,
        &tokio_postgres::error::SqlState::INVALID_PARAMETER_VALUE,
        "unknown zone",
    );
    assert_eq!(s.show("TimeZone").await, "UTC");
    // A privacy setting through set_config is the SET, with its checks.
    assert_code(
        s.simple_rows("SELECT set_config('pgdp.epsilon', '1000', false)")
            .await,
        &tokio_postgres::error::SqlState::INVALID_PARAMETER_VALUE,
        "epsilon above the cap",
    );
    assert_eq!(s.budget().await.epsilon_spent, 0.0);
    proxy.stop().await;
}

#[tokio::test]
async fn text_that_is_not_a_number_is_refused_before_any_charge() {
    let proxy = rich_proxy(88).await;
    let s = proxy.connect().await;
    for sql in [
        "SELECT COUNT(*) FROM demo.people WHERE age > '30 OR true'",
        "SELECT COUNT(*) FROM demo.people WHERE age IN (30, 'x')",
        "SELECT COUNT(*) FROM demo.people WHERE age BETWEEN '1.5' AND 40",
        "SELECT COUNT(*) FROM demo.people WHERE income > 'lots'",
    ] {
        assert_code(
            s.simple_rows(sql).await,
            &tokio_postgres::error::SqlState::INVALID_PARAMETER_VALUE,
            sql,
        );
    }
    // What PostgreSQL reads as numbers is answered.
    let n: i64 = s
        .query_one(
            "SELECT COUNT(*) FROM demo.people WHERE age > ' 30 ' AND income < '1e6'",
            &[],
        )
        .await
        .expect("numbers as text")
        .get(0);
    assert!(n > 10_000, "{n}");
    assert_eq!(
        s.budget().await.epsilon_spent,
        1.0,
        "one charge, for the answer"
    );
    proxy.stop().await;
}

#[tokio::test]
async fn superset_series_limit_releases_both_aggregates() {
    let proxy = rich_proxy(87).await;
    let s = proxy.connect().await;
    let sql = r#"SELECT DATE_TRUNC('month', visit_date) AS visit_date, clinic AS clinic, AVG(cost) AS "AVG(cost)" FROM demo.visits JOIN (SELECT clinic AS clinic__, AVG(cost) AS mme_inner__ FROM demo.visits WHERE visit_date >= TO_DATE('2024-01-01', 'YYYY-MM-DD') AND visit_date < TO_DATE('2025-01-01', 'YYYY-MM-DD') GROUP BY clinic ORDER BY mme_inner__ DESC LIMIT 5) AS series_limit ON clinic = clinic__ WHERE visit_date >= TO_DATE('2024-01-01', 'YYYY-MM-DD') AND visit_date < TO_DATE('2025-01-01', 'YYYY-MM-DD') GROUP BY DATE_TRUNC('month', visit_date), clinic LIMIT 10000"#;
    let rows = s.query(sql, &[]).await.expect("Superset's series limit");
    let mut clinics: Vec<String> = rows.iter().map(|r| r.get::<_, String>(1)).collect();
    clinics.sort();
    clinics.dedup();
    assert!(!clinics.is_empty() && clinics.len() <= 5, "{clinics:?}");
    let charges = s
        .take_notices()
        .into_iter()
        .filter(|n| n.contains("charged"))
        .count();
    assert_eq!(charges, 2, "the top five and the series are two releases");
    assert_eq!(types_of(&s, sql).await, upstream_types(sql).await);
    proxy.stop().await;
}
