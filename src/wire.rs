//! wire: not written yet.
