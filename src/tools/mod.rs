//! Tooling that is not part of what a client of the proxy observes: budget administration from
//! the command line ([`admin`]), the deterministic demo dataset ([`demo`]) and throwaway
//! PostgreSQL clusters ([`cluster`]) for `pgdp demo` and the tests. Nothing in the proxy's core
//! depends on these modules.

pub mod admin;
pub mod cluster;
pub mod demo;
