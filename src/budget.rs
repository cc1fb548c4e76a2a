//! budget: not written yet.
