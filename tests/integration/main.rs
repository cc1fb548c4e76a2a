//! Every test that needs a real PostgreSQL, in one test binary (the harness is compiled once):
//! `cargo test --test integration` runs them all, and a module path selects a part, e.g.
//! `cargo test --test integration golden::` or `cargo test --test integration attacks::`.
//!
//! - through the PostgreSQL protocol, against an in-process pgdp over the demo dataset, driven
//!   with tokio-postgres and the real `psql`: `budget`, `dp`, `faults`, `keypath`, `protocol`,
//!   `replicas`, `sql`, `wire` (helpers in `support`; the golden corpora's case files in
//!   `case_file`);
//! - `auth`: PostgreSQL's authentication failures (28P01 and its message) and the throttling of
//!   repeated failures;
//! - `tls`: TLS required of clients (28000 for clear text, PostgreSQL's `hostssl` message);
//! - `types`: DP answers with the column names and types PostgreSQL gives the same SQL, equal in
//!   the text and binary formats;
//! - `analyst`: SQL a new analyst types (issue 42): per-unit count histograms, width_bucket keys,
//!   and EXISTS / bool_or / bool_and / every answered from detected noisy counts;
//! - `attacks`: the attack corpus in `tests/attacks/`;
//! - `drivers`: the SQL that ORMs, drivers and BI tools generate (bound LIMIT and OFFSET, time
//!   ranges, public tables alone, DISTINCT lists, their set-up statements), through tokio-postgres;
//! - `tools_node`, `tools_python`, `tools_superset`: those tools themselves, through their APIs;
//! - `clients`: the real clients (pgjdbc, psqlODBC, psycopg 2 and 3, SQLAlchemy, node-postgres,
//!   psql) in `tests/clients/`;
//! - `golden`: the rewrite corpus in `tests/cases/*.case`; `golden_session`: the EXPLAIN corpus of
//!   the session's forms (time folding, set operations, calendars, scalar subqueries) in
//!   `tests/cases/*.explain`;
//! - `datetime_ranges`: the SQL pgdp sends over dates and timestamps at the ends of their ranges;
//! - `dp_property`: neighbouring databases and the empirical sensitivity of the rewrites;
//! - `fuzz_smoke`: the fuzz targets of `fuzz/` over their seeds and bounded mutations;
//! - `ledger`: the privacy ledger against a real PostgreSQL;
//! - `admin`: `pgdp budget …` and `pgdp audit` (the built binary) against a running pgdp and
//!   its ledger: grants and resets seen through the wire, refusals that change nothing, exports;
//! - `harness_smoke`: the harness, the throwaway cluster and the demo loader;
//! - `load`: many concurrent connections against a `pgdp serve` child process;
//! - `reload`: policy reload (SIGHUP, `pgdp reload`) of a `pgdp serve` child process;
//! - `standby`: read replicas, with a throwaway primary and a hot standby cloned from it;
//! - `shard`: a coordinator whose private tables are hash-partitioned by the privacy unit over
//!   `postgres_fdw` shards, all throwaway clusters: answers, pushdown, a shard that is down,
//!   and partitioning by another column;
//! - `citus`: the same on Citus where it is installed (`.ci/setup-citus`; skipped, saying so,
//!   elsewhere): answers of one server and the coordinator's distributed plan;
//! - `synopsis`: a policy synopsis (private multiplicative weights) answering a dashboard's
//!   counts for one charge, kept across a restart, and the per-query path when it is off or
//!   exhausted;
//! - `metrics`: the `--metrics` endpoint scraped over HTTP (counters, histograms, `/health`);
//! - `readme`: README.md's psql transcripts, run as one psql session and compared (or, with
//!   `PGDP_BLESS=1`, rewritten).
//!
//! The upstream comes from `harness` (`PGDP_TEST_UPSTREAM`, else 127.0.0.1:5432, else a
//! throwaway cluster; `PGDP_TEST_FORCE_CLUSTER=1` forces the cluster), chosen once per run and
//! named on standard error. Every pgdp a test starts has a fresh ledger database (a full budget)
//! and a fixed noise seed. Tests assert SQLSTATE codes, never message text, and never print to
//! stdout.
//!
//! The tests run in parallel threads of this one process (one per core unless
//! `RUST_TEST_THREADS` says otherwise), so nothing a test sets for the process may change
//! another's outcome, and the few that open many upstream connections at once hold
//! [`harness::exclusive`] to run one at a time.

#[path = "../harness/mod.rs"]
mod harness;

mod admin;
mod analyst;
mod attacks;
mod auth;
mod bounds;
mod budget;
mod case_file;
mod citus;
mod clients;
mod datetime_ranges;
mod dp;
mod dp_property;
mod drivers;
mod faults;
mod fuzz_smoke;
mod golden;
mod golden_session;
mod group_counts;
mod harness_smoke;
mod keypath;
mod lease;
mod ledger;
mod load;
mod metrics;
mod protocol;
mod readme;
mod reload;
mod replicas;
mod shard;
mod sql;
mod standby;
mod support;
mod synopsis;
mod tls;
mod tools_node;
mod tools_python;
mod tools_superset;
mod types;
mod wire;
