//! Integration tests of pgdp through the PostgreSQL protocol: an in-process server over the demo
//! dataset on a real PostgreSQL, driven with tokio-postgres and the real `psql`.
//!
//! Every test starts its own pgdp with a fresh ledger database (a full budget) and a fixed noise
//! seed. Tests assert SQLSTATE codes, never message text, and never print to stdout.

#[path = "../harness/mod.rs"]
mod harness;

mod budget;
mod dp;
mod faults;
mod keypath;
mod protocol;
mod replicas;
mod sql;
mod support;
mod wire;
