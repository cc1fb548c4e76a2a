//! Privacy budgets: the accountant (exact per-order Rényi totals, the privacy filter, and the
//! zCDP → (ε, δ) conversion) and the durable ledger in PostgreSQL that several pgdp processes
//! share.
//!
//! Invariants:
//! - Budget arithmetic is exact: every parameter is a [`Fixed`] (a count of 10⁻¹⁸ units) and
//!   totals are sums of those. Floating point is used only for conversions and per-order budgets,
//!   rounded so that no rounding anywhere favours the analyst.
//! - A charge is admitted only if the analyst's whole history, including it, stays within the
//!   analyst's [`Limit`] (and the dataset's, when one is set) under the rule of [`accountant`].
//!   [`Ledger::charge`] checks and records in one transaction holding the analyst's row lock, so
//!   concurrent sessions and processes can never overspend, and it returns only after the charge
//!   is committed.
//! - Charges are never refunded: [`Ledger::set_outcome`] only annotates the audit log. Refunding
//!   a query that failed upstream would make the failure itself a free, data-dependent signal.
//! - Query text and results never enter error messages; the ledger's PostgreSQL errors are
//!   logged and reported as [`crate::Error::LedgerUnavailable`].
//!
//! - The admission rule is fixed in advance per history: by the limit and the [`Accounting`]
//!   rule of the history's first charge, which the ledger stores with the totals (a GDP filter,
//!   a zCDP filter and Rényi filters over a fixed grid of orders, with the order ∞ for pure ε
//!   and a union bound over the members; the Gaussian rule gives the GDP filter all of their
//!   δ), so it stays valid
//!   when an analyst mixes Laplace, Gaussian and partition selection adaptively; the theorem and
//!   its sources are in [`accountant`].

pub mod accountant;
pub mod fixed;
pub mod gdp;
pub mod lease;
pub mod ledger;
pub mod refusal;
pub mod split;
pub mod window;

pub use crate::policy::Accounting;

pub use accountant::{
    admit, epsilon_taken, guarantee, in_force, remaining, repeats, within, zcdp_to_epsilon, Cost,
    Guarantee, Limit, Refusal, Remaining, Scope, Spent,
};
pub use fixed::{Fixed, FixedError};
pub use lease::{slice_size, Slice};
pub use ledger::{
    Balance, ChargeId, Charged, Ledger, Looked, Priced, Receipt, Stored, StoredSynopsis,
    SynopsisPass,
};
pub use window::Window;

/// The SHA-256 (hex, lowercase) of `parts`, each prefixed with its length as 8 big-endian bytes,
/// so that different part lists never share an encoding (`["ab", "c"]` ≠ `["a", "bc"]`). Used for
/// query fingerprints in the audit log and for replay-cache keys.
pub fn fingerprint(parts: &[&str]) -> String {
    let mut fingerprint = Fingerprint::default();
    for part in parts {
        fingerprint.part(part);
    }
    fingerprint.finish()
}

/// [`fingerprint`] of parts given one at a time, a formatted part printed into one buffer
/// reused for all of them (a key of many small parts allocates once, not once per part).
pub struct Fingerprint {
    context: ring::digest::Context,
    printed: String,
}

impl Default for Fingerprint {
    fn default() -> Fingerprint {
        Fingerprint {
            context: ring::digest::Context::new(&ring::digest::SHA256),
            printed: String::new(),
        }
    }
}

impl Fingerprint {
    /// Adds the part `text`.
    pub fn part(&mut self, text: &str) {
        self.context.update(&(text.len() as u64).to_be_bytes());
        self.context.update(text.as_bytes());
    }

    /// Adds the part `format_args!(…)` prints: the same as [`Fingerprint::part`] of
    /// `format!(…)`.
    pub fn printed(&mut self, args: std::fmt::Arguments<'_>) {
        use std::fmt::Write as _;
        let mut printed = std::mem::take(&mut self.printed);
        printed.clear();
        // Writing to a String cannot fail.
        let _ = printed.write_fmt(args);
        self.part(&printed);
        self.printed = printed;
    }

    /// The hex digest of the parts added.
    pub fn finish(self) -> String {
        let digest = self.context.finish();
        let mut hex = String::with_capacity(2 * digest.as_ref().len());
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        for byte in digest.as_ref() {
            hex.push(char::from(DIGITS[usize::from(byte >> 4)]));
            hex.push(char::from(DIGITS[usize::from(byte & 0xf)]));
        }
        hex
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprint_is_sha256_of_length_prefixed_parts() {
        // SHA-256 of the empty input.
        assert_eq!(
            fingerprint(&[]),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        // Independently: hashlib.sha256(pack('>Q', 5) + b'hello' + pack('>Q', 0)).
        assert_eq!(
            fingerprint(&["hello", ""]),
            "ea53a96738ea9f24c1565516c943f47e2b1d06bdb3dabb70cfa97890bee01a5e"
        );
        assert_ne!(fingerprint(&["ab", "c"]), fingerprint(&["a", "bc"]));
        assert_ne!(fingerprint(&["a"]), fingerprint(&["a", ""]));
        assert_eq!(fingerprint(&["x", "y"]), fingerprint(&["x", "y"]));
    }

    #[test]
    fn a_printed_part_is_the_part_of_its_text() {
        let mut printed = Fingerprint::default();
        printed.printed(format_args!("epsilon {:e} of {}", 0.5, "x"));
        printed.part("");
        printed.printed(format_args!("{}", 1e-5));
        assert_eq!(
            printed.finish(),
            fingerprint(&["epsilon 5e-1 of x", "", &1e-5.to_string()])
        );
    }
}
