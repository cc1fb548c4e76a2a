//! session: not written yet.
