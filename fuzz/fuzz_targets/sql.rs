//! Arbitrary SQL → classify → analyze → rewrite → mechanisms → release (see `src/sql.rs`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| pgdp_fuzz::sql::run(data));
