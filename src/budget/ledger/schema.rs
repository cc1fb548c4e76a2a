//! The ledger's tables: their DDL ([`SCHEMA_DDL`], idempotent), the schema version stored in
//! `pgdp.meta`, and the migrations from each earlier version, one at a time under an advisory
//! lock ([`ensure_schema`]).
//!
//! Invariants:
//! - A ledger of a version this pgdp does not know is refused ([`super::Fault::Corrupt`]), never
//!   written to: a newer pgdp's totals are not reinterpreted.
//! - Each migration only adds (columns with defaults that read as the old meaning, tables the DDL
//!   creates) and records its version; no total is rewritten, so a migrated ledger bounds the
//!   same loss it did before.

use tokio_postgres::Client;

use super::Fault;

/// Version of the tables below, stored in `pgdp.meta`.
pub(super) const SCHEMA_VERSION: &str = "6";

/// Key of the advisory lock that serialises schema creation (ASCII "pgdpledg").
const SCHEMA_LOCK_KEY: i64 = 0x7067_6470_6c65_6467;

/// The DDL of the ledger, idempotent.
pub const SCHEMA_DDL: &str = "
CREATE SCHEMA IF NOT EXISTS pgdp;
CREATE TABLE IF NOT EXISTS pgdp.meta (
    key text PRIMARY KEY,
    value text NOT NULL
);
INSERT INTO pgdp.meta (key, value) VALUES ('schema_version', '6') ON CONFLICT DO NOTHING;
CREATE TABLE IF NOT EXISTS pgdp.analyst_spent (
    analyst text PRIMARY KEY,
    epsilon numeric NOT NULL DEFAULT 0 CHECK (epsilon >= 0),
    delta numeric NOT NULL DEFAULT 0 CHECK (delta >= 0),
    rho numeric NOT NULL DEFAULT 0 CHECK (rho >= 0),
    renyi numeric[],
    charges bigint NOT NULL DEFAULT 0,
    updated_at timestamptz NOT NULL DEFAULT now(),
    granted_epsilon numeric NOT NULL DEFAULT 0 CHECK (granted_epsilon >= 0),
    granted_delta numeric NOT NULL DEFAULT 0 CHECK (granted_delta >= 0)
);
CREATE TABLE IF NOT EXISTS pgdp.dataset_spent (
    id boolean PRIMARY KEY DEFAULT true CHECK (id),
    epsilon numeric NOT NULL DEFAULT 0 CHECK (epsilon >= 0),
    delta numeric NOT NULL DEFAULT 0 CHECK (delta >= 0),
    rho numeric NOT NULL DEFAULT 0 CHECK (rho >= 0),
    renyi numeric[],
    charges bigint NOT NULL DEFAULT 0,
    updated_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO pgdp.dataset_spent (id) VALUES (true) ON CONFLICT DO NOTHING;
CREATE TABLE IF NOT EXISTS pgdp.charge_log (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    analyst text NOT NULL,
    charged_at timestamptz NOT NULL DEFAULT now(),
    fingerprint text NOT NULL,
    mechanism text NOT NULL,
    epsilon numeric NOT NULL,
    delta numeric NOT NULL,
    rho numeric NOT NULL,
    pure_rho numeric NOT NULL DEFAULT 0,
    outcome text NOT NULL DEFAULT 'charged',
    outcome_at timestamptz,
    tables text[] NOT NULL DEFAULT '{}'
);
CREATE INDEX IF NOT EXISTS charge_log_analyst_idx ON pgdp.charge_log (analyst, charged_at);
ALTER TABLE pgdp.charge_log ADD COLUMN IF NOT EXISTS lease_id bigint,
    ADD COLUMN IF NOT EXISTS lease_seq bigint;
CREATE INDEX IF NOT EXISTS charge_log_lease_idx ON pgdp.charge_log (lease_id, lease_seq)
    WHERE lease_id IS NOT NULL;
CREATE TABLE IF NOT EXISTS pgdp.lease (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    analyst text NOT NULL,
    holder text NOT NULL,
    granted_at timestamptz NOT NULL DEFAULT now(),
    queries bigint NOT NULL CHECK (queries >= 1),
    epsilon numeric NOT NULL CHECK (epsilon >= 0),
    delta numeric NOT NULL CHECK (delta >= 0),
    rho numeric NOT NULL CHECK (rho >= 0),
    renyi numeric[] NOT NULL,
    closed_at timestamptz,
    charges bigint,
    used_epsilon numeric,
    used_delta numeric,
    used_rho numeric,
    used_renyi numeric[]
);
CREATE INDEX IF NOT EXISTS lease_open_idx ON pgdp.lease (analyst) WHERE closed_at IS NULL;
ALTER TABLE pgdp.lease ADD COLUMN IF NOT EXISTS window_period text,
    ADD COLUMN IF NOT EXISTS window_start timestamptz,
    ADD COLUMN IF NOT EXISTS dataset_window_period text,
    ADD COLUMN IF NOT EXISTS dataset_window_start timestamptz;
CREATE TABLE IF NOT EXISTS pgdp.analyst_window_spent (
    analyst text NOT NULL,
    period text NOT NULL CHECK (period IN ('day', 'week', 'month')),
    window_start timestamptz NOT NULL,
    window_end timestamptz NOT NULL CHECK (window_end > window_start),
    epsilon numeric NOT NULL DEFAULT 0 CHECK (epsilon >= 0),
    delta numeric NOT NULL DEFAULT 0 CHECK (delta >= 0),
    rho numeric NOT NULL DEFAULT 0 CHECK (rho >= 0),
    renyi numeric[],
    charges bigint NOT NULL DEFAULT 0,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (analyst, period, window_start)
);
CREATE TABLE IF NOT EXISTS pgdp.dataset_window_spent (
    period text NOT NULL CHECK (period IN ('day', 'week', 'month')),
    window_start timestamptz NOT NULL,
    window_end timestamptz NOT NULL CHECK (window_end > window_start),
    epsilon numeric NOT NULL DEFAULT 0 CHECK (epsilon >= 0),
    delta numeric NOT NULL DEFAULT 0 CHECK (delta >= 0),
    rho numeric NOT NULL DEFAULT 0 CHECK (rho >= 0),
    renyi numeric[],
    charges bigint NOT NULL DEFAULT 0,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (period, window_start)
);
CREATE TABLE IF NOT EXISTS pgdp.replay_cache (
    analyst text NOT NULL,
    key text NOT NULL,
    payload bytea NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (analyst, key)
);
CREATE INDEX IF NOT EXISTS replay_cache_created_at_idx ON pgdp.replay_cache (created_at);
CREATE TABLE IF NOT EXISTS pgdp.admin_log (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at timestamptz NOT NULL DEFAULT now(),
    action text NOT NULL CHECK (action IN ('grant', 'reset')),
    analyst text NOT NULL,
    epsilon numeric NOT NULL,
    delta numeric NOT NULL,
    rho numeric NOT NULL DEFAULT 0,
    reason text NOT NULL DEFAULT '',
    made_by text NOT NULL,
    ledger_role text NOT NULL DEFAULT current_user
);
CREATE INDEX IF NOT EXISTS admin_log_analyst_idx ON pgdp.admin_log (analyst, at);
CREATE TABLE IF NOT EXISTS pgdp.synopsis (
    name text NOT NULL,
    fingerprint text NOT NULL,
    total numeric NOT NULL,
    rounds_started integer NOT NULL DEFAULT 0 CHECK (rounds_started >= 0),
    measurements text[] NOT NULL DEFAULT '{}'
        CHECK (cardinality(measurements) <= rounds_started),
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (name, fingerprint)
);
CREATE TABLE IF NOT EXISTS pgdp.synopsis_payment (
    name text NOT NULL,
    fingerprint text NOT NULL,
    analyst text NOT NULL,
    charge text NOT NULL,
    paid_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (name, fingerprint, analyst)
);
";

/// Creates the tables if any is missing (under an advisory lock) and checks the version.
pub(super) async fn ensure_schema(client: &mut Client) -> Result<(), Fault> {
    let tx = client.transaction().await?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&SCHEMA_LOCK_KEY])
        .await?;
    let present: bool = tx
        .query_one(
            "SELECT to_regclass('pgdp.meta') IS NOT NULL
                AND to_regclass('pgdp.analyst_spent') IS NOT NULL
                AND to_regclass('pgdp.dataset_spent') IS NOT NULL
                AND to_regclass('pgdp.charge_log') IS NOT NULL
                AND to_regclass('pgdp.replay_cache') IS NOT NULL
                AND to_regclass('pgdp.admin_log') IS NOT NULL
                AND to_regclass('pgdp.lease') IS NOT NULL
                AND to_regclass('pgdp.analyst_window_spent') IS NOT NULL
                AND to_regclass('pgdp.dataset_window_spent') IS NOT NULL
                AND to_regclass('pgdp.synopsis') IS NOT NULL
                AND to_regclass('pgdp.synopsis_payment') IS NOT NULL",
            &[],
        )
        .await?
        .try_get(0)?;
    if !present {
        tx.batch_execute(SCHEMA_DDL).await?;
    }
    let version: Option<String> = tx
        .query_opt(
            "SELECT value FROM pgdp.meta WHERE key = 'schema_version'",
            &[],
        )
        .await?
        .map(|row| row.try_get(0))
        .transpose()?;
    // Each step migrates one version to the next, in order, under the lock.
    let mut version = version;
    if version.as_deref() == Some("1") {
        tx.batch_execute(MIGRATE_1_TO_2).await?;
        version = Some("2".to_string());
    }
    if version.as_deref() == Some("2") {
        tx.batch_execute(MIGRATE_2_TO_3).await?;
        version = Some("3".to_string());
    }
    if version.as_deref() == Some("3") {
        tx.batch_execute(MIGRATE_3_TO_4).await?;
        version = Some("4".to_string());
    }
    if version.as_deref() == Some("4") {
        tx.batch_execute(MIGRATE_4_TO_5).await?;
        version = Some("5".to_string());
    }
    if version.as_deref() == Some("5") {
        tx.batch_execute(MIGRATE_5_TO_6).await?;
        version = Some("6".to_string());
    }
    if version.as_deref() != Some(SCHEMA_VERSION) {
        return Err(Fault::Corrupt(
            "pgdp.meta schema_version is not the one this pgdp understands",
        ));
    }
    tx.commit().await?;
    Ok(())
}

/// Migrates a ledger of schema version 1 (sums only) to version 2, under the schema lock: the
/// per-order totals start NULL, which reads as the bound from the sums
/// ([`Spent::from_sums`]), and the audit log gains each charge's ρ of its pure parts (0 for the
/// old rows, whose ε alone bounds them). A version-1 pgdp refuses the migrated ledger.
const MIGRATE_1_TO_2: &str = "
ALTER TABLE pgdp.analyst_spent ADD COLUMN IF NOT EXISTS renyi numeric[];
ALTER TABLE pgdp.dataset_spent ADD COLUMN IF NOT EXISTS renyi numeric[];
ALTER TABLE pgdp.charge_log ADD COLUMN IF NOT EXISTS pure_rho numeric NOT NULL DEFAULT 0;
UPDATE pgdp.meta SET value = '2' WHERE key = 'schema_version';
";

/// Migrates a ledger of schema version 2 to version 3, under the schema lock: analysts' rows gain
/// the grants added to their policy limit (0 for existing rows: their limit is the policy's, as
/// before), the audit log gains the tables each charge read (empty for the old rows, which did
/// not record them), and `pgdp.admin_log` records grants and resets (created by [`SCHEMA_DDL`],
/// which runs first because the table is missing). A version-2 pgdp refuses the migrated ledger.
const MIGRATE_2_TO_3: &str = "
ALTER TABLE pgdp.analyst_spent
    ADD COLUMN IF NOT EXISTS granted_epsilon numeric NOT NULL DEFAULT 0 CHECK (granted_epsilon >= 0),
    ADD COLUMN IF NOT EXISTS granted_delta numeric NOT NULL DEFAULT 0 CHECK (granted_delta >= 0);
ALTER TABLE pgdp.charge_log ADD COLUMN IF NOT EXISTS tables text[] NOT NULL DEFAULT '{}';
UPDATE pgdp.meta SET value = '3' WHERE key = 'schema_version';
";

/// Migrates a ledger of schema version 3 to version 4, under the schema lock: `pgdp.lease`
/// holds budget slices and the audit log says which slice covered a charge (NULL for charges
/// committed on their own). [`SCHEMA_DDL`], which runs first because `pgdp.lease` is missing,
/// creates both; this only records the version. A version-3 pgdp refuses the migrated ledger.
const MIGRATE_3_TO_4: &str = "
UPDATE pgdp.meta SET value = '4' WHERE key = 'schema_version';
";

/// Migrates a ledger of schema version 4 to version 5, under the schema lock: the per-window
/// totals of renewing budgets (`pgdp.analyst_window_spent`, `pgdp.dataset_window_spent`) and
/// the window each budget slice was reserved in (`pgdp.lease.window_*`, NULL for slices of
/// budgets that do not renew, which all version-4 slices are). [`SCHEMA_DDL`], which runs first
/// because the window tables are missing, creates them; the existing totals are not touched, so
/// budgets without a `period` go on exactly as before. A version-4 pgdp refuses the migrated
/// ledger.
const MIGRATE_4_TO_5: &str = "
ALTER TABLE pgdp.lease ADD COLUMN IF NOT EXISTS window_period text,
    ADD COLUMN IF NOT EXISTS window_start timestamptz,
    ADD COLUMN IF NOT EXISTS dataset_window_period text,
    ADD COLUMN IF NOT EXISTS dataset_window_start timestamptz;
UPDATE pgdp.meta SET value = '5' WHERE key = 'schema_version';
";

/// Migrates a ledger of schema version 5 to version 6, under the schema lock: the synopses'
/// released states (`pgdp.synopsis`) and who has paid for each (`pgdp.synopsis_payment`).
/// [`SCHEMA_DDL`], which runs first because the tables are missing, creates them; no total is
/// touched. A version-5 pgdp refuses the migrated ledger.
const MIGRATE_5_TO_6: &str = "
UPDATE pgdp.meta SET value = '6' WHERE key = 'schema_version';
";
