//! What the replay cache gives back: the bytes a release stored for one analyst and key, as the
//! ledger read them ([`Stored`]).
//!
//! # Invariants
//! - Only the ledger makes a [`Stored`] (its field and constructor are private to
//!   [`crate::budget`]): from a row of `pgdp.replay_cache`, or from its journal's entry not yet
//!   written, for the analyst and key asked. A replayed answer
//!   ([`crate::dp::release::Released::replayed`]) and reused noisy measures
//!   ([`crate::dp::release::NoisyMeasures::from_payload`]) are read only from a [`Stored`], so
//!   they come only from bytes a release of that analyst stored, never from bytes another
//!   caller made up and labelled as released.
//! - A suffix of stored bytes is stored bytes ([`Stored::suffix`]: the measures after the
//!   chosen caps' prefix of a release at chosen caps).
//!
//! Reading stored bytes compiles:
//!
//! ```
//! fn size(stored: &pgdp::budget::Stored) -> usize {
//!     stored.bytes().len()
//! }
//! ```
//!
//! and making them up does not (the field is private):
//!
//! ```compile_fail,E0423
//! let forged = pgdp::budget::Stored(b"pgdp-noisy-measures-1".to_vec());
//! ```

/// The bytes stored for one analyst and key in the replay cache, as the ledger read them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored(Vec<u8>);

impl Stored {
    /// Bytes read from the replay cache (or its journal) for the analyst and key asked.
    pub(in crate::budget) fn read(bytes: Vec<u8>) -> Stored {
        Stored(bytes)
    }

    /// Stored bytes made in a unit test (the release's own round trips).
    #[cfg(test)]
    pub(crate) fn for_tests(bytes: Vec<u8>) -> Stored {
        Stored(bytes)
    }

    /// The bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.0
    }

    /// `rest` as stored bytes, when it is a suffix of these (a part of what was stored).
    pub fn suffix(&self, rest: &[u8]) -> Option<Stored> {
        self.0.ends_with(rest).then(|| Stored(rest.to_vec()))
    }
}
