//! backend: not written yet.
