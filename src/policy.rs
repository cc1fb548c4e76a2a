//! policy: not written yet.
