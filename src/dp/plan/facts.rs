//! Facts about the upstream's columns that let a plan take a faster form with the same
//! sensitivity, or lower a cap the data cannot reach: a unit column that is a unique key (the
//! unique-unit form), a join key with one row per unit (the lookup form, one group per unit),
//! an aggregate argument declared `NOT NULL` (its count of values is the count of rows).
//!
//! Invariants:
//! - Every such fact reaches a plan only as an [`UpstreamFacts`], a sealed trait that only
//!   pgdp's own types implement: in production the upstream's verified facts
//!   (`crate::upstream::ColumnFacts`, filled only by catalog lookups and reads of declared keys).
//!   No caller outside pgdp can tell a plan that a column is unique or never NULL:
//!
//! ```compile_fail,E0603
//! use pgdp::dp::plan::UpstreamFacts;
//! struct Claimed;
//! impl pgdp::dp::plan::seal::Sealed for Claimed {}
//! ```
//!
//! while reading the facts the upstream verified is open to all:
//!
//! ```no_run
//! # use pgdp::dp::plan::Plan;
//! # use pgdp::upstream::{ColumnFact, ColumnFacts, Upstream};
//! # async fn f(upstream: &Upstream, plan: &mut Plan) -> pgdp::Result<()> {
//! let facts = ColumnFacts::default();
//! let keys: Vec<(String, String)> = plan.unit_key().into_iter().collect();
//! upstream.learn_column_facts(&facts, ColumnFact::Unique, &keys).await?;
//! plan.assume_unique_unit(&facts);
//! # Ok(())
//! # }
//! ```

/// What the upstream is known to guarantee about columns, keyed by `(table, column)`. Sealed
/// (see the module doc): only types inside pgdp implement it.
#[allow(private_bounds)] // the seal is the point: the bound cannot be named outside the crate
pub trait UpstreamFacts: seal::Sealed {
    /// Whether the column is known to be a unique key upstream (false while unknown).
    fn unique(&self, column: &(String, String)) -> bool;
    /// Whether the column is known never to hold NULL upstream (false while unknown).
    fn not_null(&self, column: &(String, String)) -> bool;
}

/// The seal of [`UpstreamFacts`]: visible inside pgdp only.
pub(crate) mod seal {
    /// Implemented by the types that may vouch for upstream facts.
    pub trait Sealed {}
}

/// Unit tests only: facts a test states outright, `unique` and `not_null` from one predicate.
#[cfg(test)]
pub(crate) struct Stated<F: Fn(&(String, String)) -> bool>(pub F);

#[cfg(test)]
impl<F: Fn(&(String, String)) -> bool> seal::Sealed for Stated<F> {}

#[cfg(test)]
impl<F: Fn(&(String, String)) -> bool> UpstreamFacts for Stated<F> {
    fn unique(&self, column: &(String, String)) -> bool {
        (self.0)(column)
    }
    fn not_null(&self, column: &(String, String)) -> bool {
        (self.0)(column)
    }
}
