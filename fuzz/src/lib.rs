//! The shared code of pgdp's fuzz targets. Each module is one target's logic, written against
//! pgdp's public API only, and is also compiled into the stable smoke test
//! `tests/integration/fuzz_smoke.rs` with `#[path]`, so the real fuzzers and CI check the same invariants.
//! See docs/fuzzing.md.

// The test harness (upstream PostgreSQL, fresh databases, the demo dataset), shared with the
// integration tests; the wire target uses part of it.
#[path = "../../tests/harness/mod.rs"]
pub mod harness;

pub mod policy_yaml;
pub mod sql;
pub mod wire;
