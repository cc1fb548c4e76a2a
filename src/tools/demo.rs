//! The demo dataset: a synthetic health-care population that `pgdp demo` and the tests query.
//!
//! [`load`] creates schema `demo` in the database the client is connected to (the caller creates
//! and connects to [`DATABASE`]) and fills it deterministically: the same scale gives the same
//! rows, on every run and every machine. Pseudo-randomness comes from
//! `hashint8extended(index, seed)`, PostgreSQL's seeded 64-bit hash of an integer, which is
//! computed arithmetically (no byte order involved) and kept stable across releases because hash
//! partitioning depends on it. `random()` is never used. A person's attributes depend only on
//! their `person_id`, so scale 2 contains scale 1's people unchanged.
//!
//! Tables (all values are non-NULL):
//! - `demo.people(person_id bigint primary key, age int, sex text, region text, education text,
//!   income numeric(12,2))`: [`PEOPLE_PER_SCALE`] × scale rows. `person_id` runs from 1 to the row
//!   count. `age` is 0 to 100, roughly flat to 65 and thinning out after. `sex` is one of [`SEXES`]
//!   (`X` for about 0.5 %). `region` is one of the ten [`REGIONS`] codes, weighted by population.
//!   `education` is one of [`EDUCATION_LEVELS`], depending on age. `income` is 0 for children and
//!   about 5 % of adults, log-normal otherwise (median near 27,000), and between 1,000,000 and
//!   50,000,000 for about 0.03 % of adults, so that clamping matters.
//! - `demo.visits(visit_id bigint primary key, person_id bigint references demo.people,
//!   visit_date date, clinic text, diagnosis text, cost numeric(10,2), checked_in timestamptz)`:
//!   about 1,000,000 × scale
//!   rows, `visit_id` from 1 to the row count. Each person has 0 to [`VISITS_PER_PERSON_MAX`]
//!   visits: about 29 % none, a median of 5, and about 1.8 % heavy users with exactly 40.
//!   `visit_date` lies in [`FIRST_VISIT_DATE`]..=[`LAST_VISIT_DATE`]. `clinic` is `C01`..`C50`
//!   (three visits in four at the person's home clinic, low numbers more common). `diagnosis`
//!   is one of the [`COMMON_DIAGNOSES`] for 80 % of visits; otherwise a code from a long tail of
//!   20,000 codes of the form `A00.0` (letters `A`..`T`, Zipf-like, so thousands of codes are held
//!   by only a handful of people). About 0.2 % of people with a visit also get a code of their own,
//!   [`SINGLE_PERSON_DIAGNOSIS_PREFIX`] followed by their `person_id` (`Z99.4711`), on their first
//!   visit: partition selection must hide those. `cost` is 0 for 3 % of visits, log-normal
//!   (median near 70) for most, and 5,000 to 200,000 for 0.1 %. `checked_in` is the moment of the
//!   visit: its date at a whole second between 07:00:00 and 18:59:59 UTC, uniform.
//! - `demo.regions(region text primary key, name text, population int)`: the ten [`REGIONS`], a
//!   public dimension table; `demo.people.region` references it.
//! - `demo.prescriptions(prescription_id bigint primary key, visit_id bigint references
//!   demo.visits, drug text, quantity int, prescribed_on date)`: about 400,000 × scale rows,
//!   generated from the visits after them (the earlier tables are unchanged). About one visit in
//!   five gets 1 to [`PRESCRIPTIONS_PER_VISIT_MAX`] prescriptions; `prescription_id` is
//!   `4 × visit_id + k` for the k-th (unique, not dense). `drug` is one of [`DRUGS`] (low
//!   indexes more common), `quantity` one of [`QUANTITIES`] for 99 % and 100 to 499 for 1 %, and
//!   `prescribed_on` the visit's date. A prescription has no person column: its privacy unit is
//!   the person of its visit (`unit_path` in the demo policy).
//!
//! A comment on schema `demo` records the scale and [`VERSION`] ([`marker`]); [`load`] reuses a
//! dataset whose marker matches and drops and reloads it otherwise. Loading runs in one
//! transaction under an advisory lock, so concurrent loaders of the same database wait for each
//! other and readers never see half a dataset. Errors are [`LoadError`], a small tool-side enum:
//! the demo is not part of what a client of the proxy observes, so it is not in [`crate::Error`].

use tokio_postgres::Client;

/// The database `pgdp demo` creates on the upstream and loads the dataset into.
pub const DATABASE: &str = "pgdp_demo";

/// The schema holding the dataset.
pub const SCHEMA: &str = "demo";

/// Version of the generator. Bump it whenever the generated rows or the schema change, so that
/// stored datasets are reloaded instead of reused (3: the columns the policy declares
/// `exhaustive` are NOT NULL with a CHECK of their values; 4: `visits.checked_in`, a
/// `timestamptz`).
pub const VERSION: u32 = 4;

/// Largest accepted scale (10 million people, about 100 million visits).
pub const SCALE_MAX: u32 = 100;

/// Rows of `demo.people` per unit of scale.
pub const PEOPLE_PER_SCALE: i64 = 100_000;

/// Most visits one person has.
pub const VISITS_PER_PERSON_MAX: i64 = 40;

/// First possible `visit_date`.
pub const FIRST_VISIT_DATE: &str = "2023-01-01";

/// Last possible `visit_date`.
pub const LAST_VISIT_DATE: &str = "2024-12-31";

/// Values of `demo.people.sex`.
pub const SEXES: [&str; 3] = ["F", "M", "X"];

/// Values of `demo.people.education`, lowest first.
pub const EDUCATION_LEVELS: [&str; 6] = [
    "none",
    "primary",
    "secondary",
    "vocational",
    "bachelor",
    "master",
];

/// Number of clinics; their codes are `C01` to `C50`.
pub const CLINICS: u32 = 50;

/// The frequent diagnosis codes, most frequent first (ICD-10 categories).
pub const COMMON_DIAGNOSES: [&str; 20] = [
    "J06", "I10", "E11", "M54", "Z00", "J20", "K21", "F32", "F41", "E78", "N39", "R51", "J45",
    "L20", "H10", "M79", "R10", "K59", "B34", "I25",
];

/// Most prescriptions written at one visit.
pub const PRESCRIPTIONS_PER_VISIT_MAX: i64 = 3;

/// Values of `demo.prescriptions.drug`, most prescribed first.
pub const DRUGS: [&str; 12] = [
    "paracetamol",
    "ibuprofen",
    "amoxicillin",
    "omeprazole",
    "metformin",
    "atorvastatin",
    "amlodipine",
    "lisinopril",
    "salbutamol",
    "sertraline",
    "levothyroxine",
    "cetirizine",
];

/// The usual pack sizes of `demo.prescriptions.quantity`.
pub const QUANTITIES: [i32; 8] = [7, 10, 14, 20, 28, 30, 60, 90];

/// Prefix of the diagnosis codes that each belong to exactly one person (`Z99.<person_id>`).
pub const SINGLE_PERSON_DIAGNOSIS_PREFIX: &str = "Z99.";

/// One row of `demo.regions`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Region {
    /// The two-letter code stored in `demo.people.region`.
    pub code: &'static str,
    /// A readable name.
    pub name: &'static str,
    /// The (public, invented) population; people are spread over regions in proportion to it.
    pub population: i32,
}

/// The ten regions, as stored in `demo.regions`.
pub const REGIONS: [Region; 10] = [
    Region {
        code: "NO",
        name: "North",
        population: 1_500_000,
    },
    Region {
        code: "NE",
        name: "North-East",
        population: 2_000_000,
    },
    Region {
        code: "EA",
        name: "East",
        population: 2_750_000,
    },
    Region {
        code: "SE",
        name: "South-East",
        population: 3_500_000,
    },
    Region {
        code: "SO",
        name: "South",
        population: 3_000_000,
    },
    Region {
        code: "SW",
        name: "South-West",
        population: 2_250_000,
    },
    Region {
        code: "WE",
        name: "West",
        population: 2_500_000,
    },
    Region {
        code: "NW",
        name: "North-West",
        population: 2_000_000,
    },
    Region {
        code: "CE",
        name: "Central",
        population: 4_500_000,
    },
    Region {
        code: "IS",
        name: "Islands",
        population: 1_000_000,
    },
];

/// Key of the transaction-level advisory lock that serialises loaders ("pgdpdemo" in ASCII).
const LOCK_KEY: i64 = 0x7067_6470_6465_6d6f;

/// Seeds of `hashint8extended`, one per independent stream of draws.
const SEED_PEOPLE_A: i64 = 101;
const SEED_PEOPLE_B: i64 = 102;
const SEED_VISIT_COUNT: i64 = 200;
const SEED_VISIT_A: i64 = 201;
const SEED_VISIT_B: i64 = 202;
const SEED_VISIT_TIME: i64 = 203;
const SEED_PRESCRIPTION_COUNT: i64 = 300;
const SEED_PRESCRIPTION: i64 = 301;

/// What [`load`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoadReport {
    /// Rows in `demo.people`.
    pub people: i64,
    /// Rows in `demo.visits`.
    pub visits: i64,
    /// Rows in `demo.prescriptions`.
    pub prescriptions: i64,
    /// True when a dataset at the same scale and version was already there and was kept.
    pub reused: bool,
}

/// Why [`load`] failed.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The scale is 0 or above [`SCALE_MAX`].
    #[error("demo scale must be between 1 and {max}, got {scale}")]
    InvalidScale {
        /// The scale asked for.
        scale: u32,
        /// [`SCALE_MAX`].
        max: u32,
    },
    /// A statement failed; the transaction was rolled back.
    #[error("loading the demo dataset failed while {step}: {source}")]
    Sql {
        /// What was being done.
        step: String,
        /// The database error.
        #[source]
        source: tokio_postgres::Error,
    },
}

/// Which table's row count a [`Step`] reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Inserted {
    /// The step fills `demo.people`.
    People,
    /// The step fills `demo.visits`.
    Visits,
    /// The step fills `demo.prescriptions`.
    Prescriptions,
}

/// One statement of the load script, with the progress line shown before it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// Progress line, e.g. `loading demo.people (100000 rows)…`.
    pub label: String,
    /// The SQL; a single statement when `inserted` is set, otherwise possibly several.
    pub sql: String,
    /// Set on the big `INSERT … SELECT` statements, whose row counts [`load`] reports.
    pub inserted: Option<Inserted>,
}

/// The text stored as the comment of schema `demo` once a load at `scale` has committed.
pub fn marker(scale: u32) -> String {
    format!("pgdp demo dataset; scale={scale}; version={VERSION}")
}

/// The load script for `scale` (assumed to be in `1..=SCALE_MAX`; [`load`] checks it), to run in
/// one transaction in the target database. It does not set the [`marker`].
pub fn steps(scale: u32) -> Vec<Step> {
    let people = PEOPLE_PER_SCALE * i64::from(scale);
    vec![
        Step {
            label: format!("creating schema {SCHEMA}…"),
            sql: schema_sql(),
            inserted: None,
        },
        Step {
            label: format!("loading {SCHEMA}.regions ({} rows)…", REGIONS.len()),
            sql: regions_sql(),
            inserted: None,
        },
        Step {
            label: format!("loading {SCHEMA}.people ({people} rows)…"),
            sql: people_sql(people),
            inserted: Some(Inserted::People),
        },
        Step {
            label: format!("loading {SCHEMA}.visits (about {} rows)…", people * 10),
            sql: visits_sql(people),
            inserted: Some(Inserted::Visits),
        },
        Step {
            label: format!(
                "loading {SCHEMA}.prescriptions (about {} rows)…",
                people * 4
            ),
            sql: prescriptions_sql(),
            inserted: Some(Inserted::Prescriptions),
        },
        Step {
            label: "creating keys and indexes…".to_string(),
            sql: indexes_sql(),
            inserted: None,
        },
        Step {
            label: format!("analyzing {SCHEMA}…"),
            sql: format!(
                "ANALYZE {SCHEMA}.regions; ANALYZE {SCHEMA}.people; ANALYZE {SCHEMA}.visits; \
                 ANALYZE {SCHEMA}.prescriptions;"
            ),
            inserted: None,
        },
    ]
}

/// Creates (or reuses) the demo dataset at `scale` in the database `client` is connected to.
///
/// Calls `progress` with one line per step. Returns quickly with `reused: true` when the schema's
/// [`marker`] already says this scale and version; otherwise drops schema `demo` (with everything
/// in it) and loads it anew, in one transaction. Takes a few seconds per unit of scale.
pub async fn load(
    client: &Client,
    scale: u32,
    mut progress: impl FnMut(&str),
) -> Result<LoadReport, LoadError> {
    if scale == 0 || scale > SCALE_MAX {
        return Err(LoadError::InvalidScale {
            scale,
            max: SCALE_MAX,
        });
    }
    let wanted = marker(scale);
    if current_marker(client).await?.as_deref() == Some(wanted.as_str()) {
        return reuse(client, scale, &mut progress).await;
    }
    // Without the "schema does not exist, skipping" NOTICEs of the first DROP … IF EXISTS.
    client
        .batch_execute("BEGIN; SET LOCAL client_min_messages = warning")
        .await
        .map_err(|source| LoadError::Sql {
            step: "starting the transaction".into(),
            source,
        })?;
    match load_in_transaction(client, scale, &wanted, &mut progress).await {
        Ok(report) => Ok(report),
        Err(error) => {
            // Best effort: the connection may already be gone, and the error that matters is the
            // first one.
            let _ = client.batch_execute("ROLLBACK").await;
            Err(error)
        }
    }
}

async fn load_in_transaction(
    client: &Client,
    scale: u32,
    wanted: &str,
    progress: &mut impl FnMut(&str),
) -> Result<LoadReport, LoadError> {
    // Session settings that make a large set-based load fast and keep an upstream's timeouts from
    // killing it; LOCAL so they end with the transaction. JIT only adds compile time here.
    let setup = format!(
        "SET LOCAL statement_timeout = 0; SET LOCAL lock_timeout = 0; SET LOCAL jit = off; \
         SET LOCAL work_mem = '64MB'; SET LOCAL maintenance_work_mem = '256MB'; \
         SELECT pg_advisory_xact_lock({LOCK_KEY});"
    );
    client
        .batch_execute(&setup)
        .await
        .map_err(|source| LoadError::Sql {
            step: "taking the demo load lock".into(),
            source,
        })?;
    // Another loader may have finished while this one waited for the lock.
    if current_marker(client).await?.as_deref() == Some(wanted) {
        client
            .batch_execute("COMMIT")
            .await
            .map_err(|source| LoadError::Sql {
                step: "committing".into(),
                source,
            })?;
        return reuse(client, scale, progress).await;
    }
    let mut report = LoadReport {
        people: 0,
        visits: 0,
        prescriptions: 0,
        reused: false,
    };
    for step in steps(scale) {
        progress(&step.label);
        let failed = |source: tokio_postgres::Error| LoadError::Sql {
            step: step.label.trim_end_matches('…').into(),
            source,
        };
        match step.inserted {
            None => client.batch_execute(&step.sql).await.map_err(failed)?,
            Some(table) => {
                let rows = client
                    .execute(step.sql.as_str(), &[])
                    .await
                    .map_err(failed)?;
                let rows = i64::try_from(rows).unwrap_or(i64::MAX);
                match table {
                    Inserted::People => report.people = rows,
                    Inserted::Visits => report.visits = rows,
                    Inserted::Prescriptions => report.prescriptions = rows,
                }
            }
        }
    }
    let finish = format!(
        "COMMENT ON SCHEMA {SCHEMA} IS {}; COMMIT",
        quote_literal(wanted)
    );
    client
        .batch_execute(&finish)
        .await
        .map_err(|source| LoadError::Sql {
            step: "committing".into(),
            source,
        })?;
    progress(&format!(
        "demo dataset loaded: {} people, {} visits, {} prescriptions (scale {scale})",
        report.people, report.visits, report.prescriptions
    ));
    Ok(report)
}

/// Reads the schema's marker, `None` when schema `demo` does not exist or has no comment.
async fn current_marker(client: &Client) -> Result<Option<String>, LoadError> {
    let rows = client
        .query(
            "SELECT pg_catalog.obj_description(n.oid, 'pg_namespace') \
             FROM pg_catalog.pg_namespace n WHERE n.nspname = $1",
            &[&SCHEMA],
        )
        .await
        .map_err(|source| LoadError::Sql {
            step: "reading the dataset marker".into(),
            source,
        })?;
    match rows.first() {
        None => Ok(None),
        Some(row) => row
            .try_get::<_, Option<String>>(0)
            .map_err(|source| LoadError::Sql {
                step: "reading the dataset marker".into(),
                source,
            }),
    }
}

async fn reuse(
    client: &Client,
    scale: u32,
    progress: &mut impl FnMut(&str),
) -> Result<LoadReport, LoadError> {
    let counted = |source: tokio_postgres::Error| LoadError::Sql {
        step: "counting rows".into(),
        source,
    };
    let row = client
        .query_one(
            &format!(
                "SELECT (SELECT count(*) FROM {SCHEMA}.people), (SELECT count(*) FROM {SCHEMA}.visits), \
                 (SELECT count(*) FROM {SCHEMA}.prescriptions)"
            ),
            &[],
        )
        .await
        .map_err(counted)?;
    let people: i64 = row.try_get(0).map_err(counted)?;
    let visits: i64 = row.try_get(1).map_err(counted)?;
    let prescriptions: i64 = row.try_get(2).map_err(counted)?;
    progress(&format!(
        "demo dataset (scale {scale}) already loaded: reusing {people} people, {visits} visits, \
         {prescriptions} prescriptions"
    ));
    Ok(LoadReport {
        people,
        visits,
        prescriptions,
        reused: true,
    })
}

/// A SQL string literal (standard_conforming_strings on).
fn quote_literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// The 16-bit slice `k` (0..4) of the 64-bit hash `h`, as an integer in 0..65536.
fn raw16(h: &str, k: u32) -> String {
    format!("(({h} >> {}) & 65535)", 16 * k)
}

/// The 16-bit slice `k` of `h` as a float in [0, 1).
fn unit(h: &str, k: u32) -> String {
    format!("({}::float8 / 65536)", raw16(h, k))
}

/// The 16-bit slice `k` of `h` as a float in (0, 1), safe under `ln`.
fn unit_open(h: &str, k: u32) -> String {
    format!("(({} + 0.5)::float8 / 65536)", raw16(h, k))
}

/// A standard normal draw from two uniforms (Box–Muller). This shapes the synthetic data; it is
/// not privacy noise.
fn normal(u_open: &str, u: &str) -> String {
    format!("(sqrt(-2 * ln({u_open})) * cos(2 * pi() * {u}))")
}

/// `CASE` picking one of `choices` by comparing the raw 16-bit draw `raw` against cumulative
/// integer thresholds proportional to the weights (integers keep the cut points exact).
fn weighted_case(raw: &str, choices: &[(&str, i64)]) -> String {
    let total: i64 = choices.iter().map(|(_, weight)| weight).sum();
    let mut sql = String::from("CASE");
    let mut cumulative = 0;
    for (i, (value, weight)) in choices.iter().enumerate() {
        cumulative += weight;
        if i + 1 == choices.len() {
            sql.push_str(&format!(" ELSE {} END", quote_literal(value)));
        } else {
            let threshold = cumulative * 65536 / total;
            sql.push_str(&format!(
                " WHEN {raw} < {threshold} THEN {}",
                quote_literal(value)
            ));
        }
    }
    sql
}

/// The DDL of schema `demo` and its tables, without rows, keys or indexes (dropping the schema
/// first).
pub(crate) fn schema_sql() -> String {
    let sexes = SEXES.map(quote_literal).join(", ");
    let levels = EDUCATION_LEVELS.map(quote_literal).join(", ");
    let regions = REGIONS.map(|r| quote_literal(r.code)).join(", ");
    let drugs = DRUGS.map(quote_literal).join(", ");
    format!(
        "DROP SCHEMA IF EXISTS {SCHEMA} CASCADE;
CREATE SCHEMA {SCHEMA};
CREATE TABLE {SCHEMA}.regions (
    region text NOT NULL,
    name text NOT NULL,
    population int NOT NULL CHECK (population >= 0)
);
CREATE TABLE {SCHEMA}.people (
    person_id bigint NOT NULL,
    age int CHECK (age BETWEEN 0 AND 100),
    sex text NOT NULL CHECK (sex IN ({sexes})),
    region text NOT NULL CHECK (region IN ({regions})),
    education text NOT NULL CHECK (education IN ({levels})),
    income numeric(12,2) CHECK (income >= 0)
);
CREATE TABLE {SCHEMA}.visits (
    visit_id bigint NOT NULL,
    person_id bigint,
    visit_date date CHECK (visit_date BETWEEN DATE '{FIRST_VISIT_DATE}' AND DATE '{LAST_VISIT_DATE}'),
    clinic text,
    diagnosis text,
    cost numeric(10,2) CHECK (cost >= 0),
    checked_in timestamptz NOT NULL
);
CREATE TABLE {SCHEMA}.prescriptions (
    prescription_id bigint NOT NULL,
    visit_id bigint,
    drug text NOT NULL CHECK (drug IN ({drugs})),
    quantity int CHECK (quantity > 0),
    prescribed_on date
);
COMMENT ON TABLE {SCHEMA}.regions IS 'pgdp demo: regions, a public dimension table';
COMMENT ON TABLE {SCHEMA}.people IS 'pgdp demo: one row per person, the privacy unit';
COMMENT ON TABLE {SCHEMA}.visits IS 'pgdp demo: clinic visits, 0 to {VISITS_PER_PERSON_MAX} per person';
COMMENT ON TABLE {SCHEMA}.prescriptions IS 'pgdp demo: prescriptions, 0 to {PRESCRIPTIONS_PER_VISIT_MAX} per visit; the person is the visit''s';"
    )
}

fn regions_sql() -> String {
    let rows: Vec<String> = REGIONS
        .iter()
        .map(|r| {
            format!(
                "({}, {}, {})",
                quote_literal(r.code),
                quote_literal(r.name),
                r.population
            )
        })
        .collect();
    format!(
        "INSERT INTO {SCHEMA}.regions (region, name, population) VALUES {};",
        rows.join(", ")
    )
}

/// `INSERT … SELECT` for `people` rows. Each level is a subquery with `OFFSET 0`, which stops
/// the planner from pulling it up and so evaluates each hash and draw once per row instead of once
/// per reference.
fn people_sql(people: i64) -> String {
    let sex = weighted_case(&raw16("h0", 2), &[("X", 5), ("F", 498), ("M", 497)]);
    let regions: Vec<(&str, i64)> = REGIONS
        .iter()
        .map(|r| (r.code, i64::from(r.population)))
        .collect();
    let region = weighted_case(&raw16("h0", 3), &regions);
    let (u_age_branch, u_age) = (unit("h0", 0), unit("h0", 1));
    let (u_edu, u_inc) = (unit("h1", 0), unit("h1", 1));
    let u_amount = unit_open("h1", 2);
    let z = normal(&unit_open("h1", 2), &unit("h1", 3));
    format!(
        "INSERT INTO {SCHEMA}.people (person_id, age, sex, region, education, income)
SELECT person_id, age, sex, region, education,
    round((CASE
        WHEN age < 16 THEN 0
        WHEN age < 18 THEN CASE WHEN u_inc < 0.7 THEN 0 ELSE exp(8.0 + 0.5 * z) END
        WHEN u_inc < 0.05 THEN 0
        WHEN u_inc >= 0.9997 THEN 1000000 + 49000000 * u_amount
        ELSE exp(10.2 + 0.75 * z + CASE education
            WHEN 'none' THEN -0.4 WHEN 'primary' THEN -0.25 WHEN 'secondary' THEN 0
            WHEN 'vocational' THEN 0.05 WHEN 'bachelor' THEN 0.3 ELSE 0.45 END)
    END)::numeric, 2)
FROM (
    SELECT person_id, age, sex, region, u_inc, u_amount, z,
        CASE WHEN age < 7 THEN 'none' WHEN age < 12 THEN 'primary'
            WHEN age < 18 THEN CASE WHEN u_edu < 0.5 THEN 'primary' ELSE 'secondary' END
            WHEN u_edu < 0.03 THEN 'none' WHEN u_edu < 0.15 THEN 'primary'
            WHEN u_edu < 0.50 THEN 'secondary' WHEN u_edu < 0.72 THEN 'vocational'
            WHEN u_edu < 0.90 THEN 'bachelor' ELSE 'master' END AS education
    FROM (
        SELECT person_id,
            CASE WHEN {u_age_branch} < 0.78 THEN floor(65 * {u_age})::int
                ELSE 65 + least(35, floor(36 * (1 - sqrt({u_age}))))::int END AS age,
            {sex} AS sex,
            {region} AS region,
            {u_edu} AS u_edu, {u_inc} AS u_inc, {u_amount} AS u_amount, {z} AS z
        FROM (
            SELECT i AS person_id,
                hashint8extended(i, {SEED_PEOPLE_A}) AS h0,
                hashint8extended(i, {SEED_PEOPLE_B}) AS h1
            FROM generate_series(1::bigint, {people}::bigint) AS g(i)
            OFFSET 0) AS hashed
        OFFSET 0) AS drawn
    OFFSET 0) AS educated"
    )
}

/// `INSERT … SELECT` for `visits`. Visits are generated per `person_id` from 1 to `people`
/// (exactly the ids of `people_sql`), numbered densely by a running sum of the per-person counts.
fn visits_sql(people: i64) -> String {
    let heavy = unit("h", 0);
    let count = unit("h", 1);
    let home = unit("h", 2);
    let single = unit("h", 3);
    let common: Vec<String> = COMMON_DIAGNOSES.iter().map(|c| quote_literal(c)).collect();
    let common_len = COMMON_DIAGNOSES.len();
    let (u_date, u_away, u_clinic, u_kind) =
        (unit("h0", 0), unit("h0", 1), unit("h0", 2), unit("h0", 3));
    let (u_common, u_cost) = (unit("h1", 0), unit("h1", 1));
    let u_amount = unit_open("h1", 2);
    let z = normal(&unit_open("h1", 2), &unit("h1", 3));
    let u_time = unit("h2", 0);
    // Long tail: a log-uniform index into 20,000 codes gives Zipf-like frequencies (1/rank).
    let u_tail = "((((h0 >> 8) # (h1 >> 40)) & 65535)::float8 / 65536)";
    let max = VISITS_PER_PERSON_MAX;
    format!(
        "INSERT INTO {SCHEMA}.visits (visit_id, person_id, visit_date, clinic, diagnosis, cost, checked_in)
SELECT visit_id, person_id, visit_date,
    'C' || lpad((CASE WHEN u_away < 0.75 THEN home ELSE 1 + floor({CLINICS} * u_clinic)::int END)::text, 2, '0'),
    CASE WHEN k = 1 AND single THEN '{SINGLE_PERSON_DIAGNOSIS_PREFIX}' || person_id
        WHEN u_kind < 0.80 THEN (ARRAY[{common}])[1 + floor({common_len} * power(u_common, 2.2))::int]
        ELSE chr(65 + tail % 20) || lpad(((tail / 20) % 100)::text, 2, '0') || '.' || (tail / 2000)::text
    END,
    round((CASE WHEN u_cost < 0.03 THEN 0
        WHEN u_cost >= 0.999 THEN 5000 + 195000 * u_amount
        ELSE exp(4.3 + 0.9 * z) END)::numeric, 2),
    (visit_date + TIME '07:00' + second_of_day * INTERVAL '1 second') AT TIME ZONE 'UTC'
FROM (
    SELECT visit_id, person_id, k, home, single,
        DATE '{FIRST_VISIT_DATE}' + floor((DATE '{LAST_VISIT_DATE}' - DATE '{FIRST_VISIT_DATE}' + 1) * {u_date})::int AS visit_date,
        floor(43200 * {u_time})::int AS second_of_day,
        {u_away} AS u_away, {u_clinic} AS u_clinic, {u_kind} AS u_kind,
        {u_common} AS u_common, {u_cost} AS u_cost, {u_amount} AS u_amount, {z} AS z,
        least(19999, floor(exp(ln(20000) * {u_tail}))::int - 1) AS tail
    FROM (
        SELECT first_id + k AS visit_id, person_id, k, home, single,
            hashint8extended(first_id + k, {SEED_VISIT_A}) AS h0,
            hashint8extended(first_id + k, {SEED_VISIT_B}) AS h1,
            hashint8extended(first_id + k, {SEED_VISIT_TIME}) AS h2
        FROM (
            SELECT person_id, n, home, single, sum(n) OVER (ORDER BY person_id) - n AS first_id
            FROM (
                SELECT person_id,
                    CASE WHEN {heavy} < 0.01 THEN {max}
                        ELSE least({max}, floor(({max} + 1) * power({count}, 3))::int) END AS n,
                    1 + floor({CLINICS} * power({home}, 1.5))::int AS home,
                    {single} < 0.002 AS single
                FROM (
                    SELECT i AS person_id, hashint8extended(i, {SEED_VISIT_COUNT}) AS h
                    FROM generate_series(1::bigint, {people}::bigint) AS g(i)
                    OFFSET 0) AS hashed
                OFFSET 0) AS counted
            OFFSET 0) AS numbered
        CROSS JOIN LATERAL generate_series(1, numbered.n) AS g(k)
        OFFSET 0) AS hashed_visits
    OFFSET 0) AS drawn",
        common = common.join(", "),
    )
}

/// `INSERT … SELECT` for `prescriptions`, drawn per visit from the visits already loaded (each
/// visit's draws depend only on its `visit_id`).
fn prescriptions_sql() -> String {
    let count = raw16("hc", 0);
    let how_many = raw16("hc", 1);
    let drugs: Vec<String> = DRUGS.iter().map(|d| quote_literal(d)).collect();
    let drugs_len = DRUGS.len();
    let quantities: Vec<String> = QUANTITIES.iter().map(|q| q.to_string()).collect();
    let quantities_len = QUANTITIES.len();
    let (u_drug, u_quantity, u_large, u_amount) =
        (unit("h", 0), unit("h", 1), unit("h", 2), unit("h", 3));
    let max = PRESCRIPTIONS_PER_VISIT_MAX;
    format!(
        "INSERT INTO {SCHEMA}.prescriptions (prescription_id, visit_id, drug, quantity, prescribed_on)
SELECT prescription_id, visit_id,
    (ARRAY[{drugs}])[1 + floor({drugs_len} * power(u_drug, 1.6))::int],
    CASE WHEN u_large < 0.01 THEN 100 + floor(400 * u_amount)::int
        ELSE (ARRAY[{quantities}])[1 + floor({quantities_len} * u_quantity)::int] END,
    visit_date
FROM (
    SELECT prescription_id, visit_id, visit_date,
        {u_drug} AS u_drug, {u_quantity} AS u_quantity, {u_large} AS u_large, {u_amount} AS u_amount
    FROM (
        SELECT 4 * visit_id + k AS prescription_id, visit_id, visit_date,
            hashint8extended(4 * visit_id + k, {SEED_PRESCRIPTION}) AS h
        FROM (
            SELECT visit_id, visit_date, hashint8extended(visit_id, {SEED_PRESCRIPTION_COUNT}) AS hc
            FROM {SCHEMA}.visits
            OFFSET 0) AS hashed
        CROSS JOIN LATERAL generate_series(1, CASE WHEN {count} < 13107
            THEN 1 + ({how_many} % {max})::int ELSE 0 END) AS g(k)
        OFFSET 0) AS numbered
    OFFSET 0) AS drawn",
        drugs = drugs.join(", "),
        quantities = quantities.join(", "),
    )
}

fn indexes_sql() -> String {
    format!(
        "ALTER TABLE {SCHEMA}.regions ADD PRIMARY KEY (region);
ALTER TABLE {SCHEMA}.people ADD PRIMARY KEY (person_id);
ALTER TABLE {SCHEMA}.people ADD FOREIGN KEY (region) REFERENCES {SCHEMA}.regions (region);
ALTER TABLE {SCHEMA}.visits ADD PRIMARY KEY (visit_id);
ALTER TABLE {SCHEMA}.visits ADD FOREIGN KEY (person_id) REFERENCES {SCHEMA}.people (person_id);
CREATE INDEX visits_person_id_idx ON {SCHEMA}.visits (person_id);
ALTER TABLE {SCHEMA}.prescriptions ADD PRIMARY KEY (prescription_id);
ALTER TABLE {SCHEMA}.prescriptions ADD FOREIGN KEY (visit_id) REFERENCES {SCHEMA}.visits (visit_id);
CREATE INDEX prescriptions_visit_id_idx ON {SCHEMA}.prescriptions (visit_id);"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_scale_with_the_row_counts() {
        let one = steps(1);
        let labels: Vec<&str> = one.iter().map(|s| s.label.as_str()).collect();
        assert!(
            labels.contains(&"loading demo.people (100000 rows)…"),
            "{labels:?}"
        );
        assert!(
            labels.contains(&"loading demo.visits (about 1000000 rows)…"),
            "{labels:?}"
        );
        let people = one
            .iter()
            .find(|s| s.inserted == Some(Inserted::People))
            .expect("people step");
        assert!(people
            .sql
            .contains("generate_series(1::bigint, 100000::bigint)"));
        let three = steps(3);
        let visits = three
            .iter()
            .find(|s| s.inserted == Some(Inserted::Visits))
            .expect("visits");
        assert!(visits
            .sql
            .contains("generate_series(1::bigint, 300000::bigint)"));
    }

    #[test]
    fn steps_are_deterministic_and_never_use_random() {
        assert_eq!(steps(2), steps(2));
        for step in steps(1) {
            assert!(
                !step.sql.to_lowercase().contains("random("),
                "{}",
                step.label
            );
        }
    }

    #[test]
    fn inserts_are_single_statements() {
        for step in steps(1).iter().filter(|s| s.inserted.is_some()) {
            assert!(!step.sql.contains(';'), "{}", step.label);
        }
    }

    #[test]
    fn marker_names_scale_and_version() {
        assert_eq!(
            marker(7),
            format!("pgdp demo dataset; scale=7; version={VERSION}")
        );
        assert_ne!(marker(1), marker(2));
    }

    #[test]
    fn weighted_case_uses_exact_integer_cut_points() {
        let sql = weighted_case("r", &[("a", 1), ("b", 1), ("c", 2)]);
        assert_eq!(
            sql,
            "CASE WHEN r < 16384 THEN 'a' WHEN r < 32768 THEN 'b' ELSE 'c' END"
        );
    }

    #[test]
    fn every_domain_value_appears_in_the_script() {
        let script: String = steps(1).into_iter().map(|s| s.sql).collect();
        for value in SEXES
            .iter()
            .chain(EDUCATION_LEVELS.iter())
            .chain(COMMON_DIAGNOSES.iter())
            .chain(DRUGS.iter())
        {
            assert!(script.contains(&format!("'{value}'")), "{value}");
        }
        for region in REGIONS {
            assert!(
                script.contains(&format!("'{}'", region.code)),
                "{}",
                region.code
            );
        }
    }

    #[test]
    fn region_codes_are_distinct() {
        let mut codes: Vec<&str> = REGIONS.iter().map(|r| r.code).collect();
        codes.sort_unstable();
        codes.dedup();
        assert_eq!(codes.len(), REGIONS.len());
    }

    #[test]
    fn literals_are_quoted() {
        assert_eq!(quote_literal("it's"), "'it''s'");
    }
}
