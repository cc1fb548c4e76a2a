//! rewrite: not written yet.
