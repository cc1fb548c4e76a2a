//! release: not written yet.
