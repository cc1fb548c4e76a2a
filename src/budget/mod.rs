//! Privacy budgets: the accountant (exact composition and the zCDP → (ε, δ) conversion) and the
//! durable ledger in PostgreSQL that several pgdp processes share.
//!
//! Invariants:
//! - Budget arithmetic is exact: every parameter is a [`Fixed`] (a count of 10⁻¹⁸ units) and
//!   totals are sums of those. The only floating point is inside [`zcdp_to_epsilon`], whose result
//!   is rounded up; no rounding anywhere favours the analyst.
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
//! Caveat (for review): the admission rule adds pure ε linearly and converts the summed ρ with
//! all δ that partition selection has not spent. When an analyst only spends pure ε and δ, or
//! only ρ, this is exactly a privacy filter with a fixed budget (Rogers et al. 2016; Feldman &
//! Zrnic 2021). When one analyst interleaves ρ with pure ε or δ, the trade-off between them is
//! chosen adaptively, which those filter theorems do not cover: an analyst who switches from
//! Gaussian-type to Laplace-type queries depending on earlier answers can in principle push the
//! realised δ above the limit (by a factor that grows slowly with the number of switch points).
//! A rule proven for that case would fix, per budget, either the Rényi order used for the
//! conversion or the split between pure ε, ρ and δ in advance.

pub mod accountant;
pub mod fixed;
pub mod ledger;

pub use accountant::{
    admit, guarantee, remaining, within, zcdp_to_epsilon, Cost, Guarantee, Limit, Refusal,
    Remaining, Scope, Spent,
};
pub use fixed::{Fixed, FixedError};
pub use ledger::{Balance, Ledger, Receipt};

/// The SHA-256 (hex, lowercase) of `parts`, each prefixed with its length as 8 big-endian bytes,
/// so that different part lists never share an encoding (`["ab", "c"]` ≠ `["a", "bc"]`). Used for
/// query fingerprints in the audit log and for replay-cache keys.
pub fn fingerprint(parts: &[&str]) -> String {
    let mut context = ring::digest::Context::new(&ring::digest::SHA256);
    for part in parts {
        context.update(&(part.len() as u64).to_be_bytes());
        context.update(part.as_bytes());
    }
    let digest = context.finish();
    let mut hex = String::with_capacity(2 * digest.as_ref().len());
    for byte in digest.as_ref() {
        hex.push(char::from_digit(u32::from(byte >> 4), 16).expect("a nibble is a hex digit"));
        hex.push(char::from_digit(u32::from(byte & 0xf), 16).expect("a nibble is a hex digit"));
    }
    hex
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
}
