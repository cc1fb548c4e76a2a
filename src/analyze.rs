//! analyze: not written yet.
