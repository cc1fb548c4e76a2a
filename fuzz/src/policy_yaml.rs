//! Fuzz target: arbitrary YAML text → `pgdp::policy::parse`.
//!
//! Shared by `fuzz/fuzz_targets/policy_yaml.rs` and `tests/integration/fuzz_smoke.rs` (through `#[path]`).
//!
//! Invariants checked for every input:
//! - Nothing panics, whatever the text.
//! - A refused policy names at least one problem.
//! - An accepted policy is one pgdp can serve: every budget is finite and positive, every
//!   private table has positive caps, every declared bound is finite with lower below upper, and
//!   its summary can be printed.

/// Runs the target on one input.
pub fn run(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    check_policy(text);
}

/// Runs the target on YAML text.
pub fn check_policy(text: &str) {
    let policy = match pgdp::policy::parse(text) {
        Ok(p) => p,
        Err(errors) => {
            assert!(!errors.0.is_empty(), "a refused policy names no problem");
            return;
        }
    };
    let _ = policy.summary();
    let finite_positive = |x: f64| x.is_finite() && x > 0.0;
    assert!(
        finite_positive(policy.defaults.epsilon),
        "default epsilon {}",
        policy.defaults.epsilon
    );
    for analyst in policy.analysts.values() {
        let b = &analyst.budget;
        assert!(
            finite_positive(b.epsilon),
            "analyst {} epsilon {}",
            analyst.name,
            b.epsilon
        );
        assert!(
            b.delta.is_finite() && (0.0..1.0).contains(&b.delta),
            "analyst {} delta {}",
            analyst.name,
            b.delta
        );
        if let Some(cap) = b.epsilon_per_query_max {
            assert!(finite_positive(cap), "analyst {} cap {cap}", analyst.name);
        }
    }
    for table in policy.tables.values() {
        if let Some(private) = table.private() {
            assert!(
                private.max_groups_per_unit > 0 && private.max_rows_per_unit > 0,
                "table {} has a zero cap",
                table.qualified_name()
            );
        }
        for column in &table.columns {
            if let Some(b) = column.bounds {
                assert!(
                    b.lower.is_finite() && b.upper.is_finite() && b.lower < b.upper,
                    "table {} column bounds {b:?}",
                    table.qualified_name()
                );
            }
        }
    }
}
