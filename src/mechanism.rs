//! mechanism: not written yet.
