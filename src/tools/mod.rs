//! Tooling that is not part of what a client of the proxy observes: budget administration from
//! the command line ([`admin`]), the deterministic demo dataset ([`demo`]), throwaway
//! PostgreSQL clusters ([`cluster`]) for `pgdp demo` and the tests, and the demo dataset on a
//! coordinator with `postgres_fdw` shards ([`shards`]) for the tests and the shard bench, or on
//! Citus ([`citus`], where it is installed) for the Citus suite, and the
//! data team's report of which caps and bounds cost how much accuracy ([`suggest`]). Nothing in the proxy's core
//! depends on these modules.

pub mod admin;
pub mod citus;
pub mod cluster;
pub mod demo;
pub mod shards;
pub mod suggest;
