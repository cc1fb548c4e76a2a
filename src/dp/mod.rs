//! The differential-privacy pipeline, pure from end to end: a parsed query is analysed against
//! the policy into a [`plan::Plan`] ([`analyze`]), turned into contribution-bounded upstream SQL
//! ([`rewrite`]), given its mechanisms and cost, and, once its rows come back, released with
//! noise ([`release`], using the samplers of [`mechanism`]).
//!
//! Invariants:
//! - Nothing here does I/O (apart from [`mechanism::secure_rng`] seeding from the OS).
//! - The only upstream SQL of a DP query is a [`rewrite::UpstreamSql`], which only [`rewrite`]
//!   can build; the rows it returns are [`release::PrivateRows`], which only [`release`] can read.

pub mod analyze;
pub mod mechanism;
pub mod plan;
pub mod release;
pub mod rewrite;
pub mod sql;
