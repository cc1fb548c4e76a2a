//! pgdp: a differentially private PostgreSQL proxy.
//!
//! Analysts speak the PostgreSQL protocol to pgdp; pgdp parses each statement, checks it against
//! a YAML policy, rewrites aggregates into contribution-bounded SQL, runs that SQL on the backing
//! PostgreSQL, adds calibrated noise, charges the analyst's budget and returns ordinary rows.
//!
//! Reading order (see ARCHITECTURE.md): [`limits`], [`error`], [`policy`], [`classify`],
//! [`analyze`], [`rewrite`], [`mechanism`], [`budget`], [`release`], [`backend`], [`session`],
//! [`wire`]. The first seven do no I/O.
#![forbid(unsafe_code)]

pub mod analyze;
pub mod backend;
pub mod budget;
pub mod catalog;
pub mod classify;
pub mod cluster;
pub mod demo;
pub mod error;
pub mod limits;
pub mod mechanism;
pub mod policy;
pub mod release;
pub mod rewrite;
pub mod server;
pub mod session;
pub mod settings;
pub mod wire;

pub use error::{Error, Result};
