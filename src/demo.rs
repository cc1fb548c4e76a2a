//! demo: not written yet.
