//! classify: not written yet.
