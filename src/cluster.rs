//! cluster: not written yet.
