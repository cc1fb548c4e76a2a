//! Arbitrary YAML → `pgdp::policy::parse` (see `src/policy_yaml.rs`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| pgdp_fuzz::policy_yaml::run(data));
