//! pgdp: a differentially private PostgreSQL proxy.
//!
//! Analysts speak the PostgreSQL protocol to pgdp; pgdp parses each statement, checks it against
//! a YAML policy, rewrites aggregates into contribution-bounded SQL, runs that SQL on the backing
//! PostgreSQL, adds calibrated noise, charges the analyst's budget and returns ordinary rows.
//!
//! The folders are the architecture (see ARCHITECTURE.md), each depending only on those listed
//! before it (a test, `layering`, checks it): [`limits`], [`memo`] (memos of pure functions),
//! [`error`], [`output`], [`datetime`], [`literal`], [`dsn`], [`policy`], [`budget`],
//! [`metrics`] (counters and the metrics
//! endpoint), [`dp`] (plan, analyze, rewrite, mechanism, release),
//! [`upstream`] (pool, catalog check, shadow catalog), [`session`] (classify, route, settings,
//! the dispatcher), [`frontend`] (pgwire), [`server`]; [`tools`] (the demo dataset and throwaway
//! clusters) sits apart from the proxy. The layers up to [`dp`] do no I/O, but for
//! [`budget`]'s ledger, the policy file and the metrics endpoint ([`metrics::http`]).
#![forbid(unsafe_code)]

pub mod budget;
pub mod datetime;
pub mod dp;
pub mod dsn;
pub mod error;
pub mod frontend;
pub mod limits;
pub mod literal;
pub mod memo;
pub mod metrics;
pub mod output;
pub mod policy;
pub mod server;
pub mod session;
pub mod tools;
pub mod upstream;

pub use error::{Error, Result};

#[cfg(test)]
mod layering;
