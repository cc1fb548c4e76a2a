//! Unit tests of policy validation: every rule, with the path-named error it gives.

use super::*;

const VERIFIER: &str = "SCRAM-SHA-256$4096:cGdkcC10ZXN0LXNhbHQtMQ==$r6rs3eSqXnnzDaEwb3G617CNh9NDVFxQd+xPmWnxk4M=:mYmZ1VMmQU332cWdfJ/Ftq/OUxAAVBM4FRMHVqONj4s=";

fn minimal(extra_table: &str) -> String {
    format!(
        r#"
database: db
analysts:
  alice:
    scram_verifier: "{VERIFIER}"
    budget: {{ epsilon: 1, delta: 1.0e-6 }}
tables:
  s.t:
    kind: private
    privacy_unit: uid
    max_groups_per_unit: 2
    max_rows_per_unit: 3
    columns:
      uid: {{ type: bigint }}
      x: {{ type: numeric, lower: 0, upper: 10 }}
      k: {{ type: text, public_values: [a, b] }}
{extra_table}
"#
    )
}

fn errors(text: &str) -> Vec<String> {
    match parse(text) {
        Ok(_) => Vec::new(),
        Err(PolicyErrors(e)) => e,
    }
}

#[test]
fn minimal_policy_validates() {
    let p = parse(&minimal("")).expect("valid");
    let t = p.table("s.t").expect("table");
    let pt = t.private().expect("private");
    assert_eq!(pt.max_groups_per_unit, 2);
    assert_eq!(pt.privacy_unit.as_deref(), Some("uid"));
    let k = t.column("k").expect("k");
    assert!(k.groupable);
    assert_eq!(
        k.public_values.as_deref(),
        Some(&["a".to_string(), "b".to_string()][..])
    );
    assert_eq!(
        t.column("x").and_then(|c| c.bounds).map(|b| b.magnitude()),
        Some(10.0)
    );
    // Omitted: pgdp chooses per query.
    assert_eq!(p.defaults.mechanism, Mechanism::Auto);
}

#[test]
fn unknown_keys_are_rejected_with_location() {
    let e = errors(&minimal("  s.u:\n    kind: public\n    colums: {}\n"));
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(e[0].contains("colums"), "{e:?}");
    assert!(e[0].contains("line"), "{e:?}");
}

#[test]
fn bounds_errors_name_their_path() {
    let text = minimal("").replace("lower: 0, upper: 10", "lower: 10, upper: 5");
    let e = errors(&text);
    assert_eq!(
        e,
        vec!["tables.s.t.columns.x: lower (10) must be below upper (5)".to_string()]
    );
}

#[test]
fn every_problem_is_reported() {
    let text = minimal("")
        .replace("privacy_unit: uid", "privacy_unit: nobody")
        .replace("epsilon: 1, delta: 1.0e-6", "epsilon: -1, delta: 2");
    let e = errors(&text);
    assert!(
        e.iter().any(|m| m.starts_with("tables.s.t.privacy_unit:")),
        "{e:?}"
    );
    assert!(
        e.iter()
            .any(|m| m.starts_with("analysts.alice.budget.epsilon:")),
        "{e:?}"
    );
    assert!(
        e.iter()
            .any(|m| m.starts_with("analysts.alice.budget.delta:")),
        "{e:?}"
    );
}

#[test]
fn public_tables_take_no_contribution_bounds() {
    let e = errors(&minimal(
            "  s.d:\n    kind: public\n    max_rows_per_unit: 2\n    columns:\n      a: { type: text }\n",
        ));
    assert_eq!(
        e,
        vec!["tables.s.d.max_rows_per_unit: only private tables have contribution bounds"]
    );
}

#[test]
fn ceilings_default_to_the_caps_and_never_lower_them() {
    let p = parse(&minimal("")).expect("valid");
    let pt = p.table("s.t").and_then(|t| t.private()).expect("private");
    assert_eq!((pt.groups_ceiling, pt.rows_ceiling), (2, 3));

    let raised = minimal("").replace(
        "    max_rows_per_unit: 3\n",
        "    max_rows_per_unit: 3\n    ceilings: { max_rows_per_unit: 40, max_groups_per_unit: 16 }\n",
    );
    let p = parse(&raised).expect("valid");
    let pt = p.table("s.t").and_then(|t| t.private()).expect("private");
    assert_eq!(
        (pt.max_groups_per_unit, pt.max_rows_per_unit),
        (2, 3),
        "the caps stay those of queries that do not choose"
    );
    assert_eq!((pt.groups_ceiling, pt.rows_ceiling), (16, 40));

    // Only one of them: the other is the cap.
    let rows_only = minimal("").replace(
        "    max_rows_per_unit: 3\n",
        "    max_rows_per_unit: 3\n    ceilings: { max_rows_per_unit: 8 }\n",
    );
    let p = parse(&rows_only).expect("valid");
    let pt = p.table("s.t").and_then(|t| t.private()).expect("private");
    assert_eq!((pt.groups_ceiling, pt.rows_ceiling), (2, 8));

    let lower = minimal("").replace(
        "    max_rows_per_unit: 3\n",
        "    max_rows_per_unit: 3\n    ceilings: { max_rows_per_unit: 2, max_groups_per_unit: 10001 }\n",
    );
    assert_eq!(
        errors(&lower),
        vec![
            "tables.s.t.ceilings.max_groups_per_unit: must be between the table's max_groups_per_unit (2) and 10000: a query that chooses its caps may raise them up to it, never lower",
            "tables.s.t.ceilings.max_rows_per_unit: must be between the table's max_rows_per_unit (3) and 100000: a query that chooses its caps may raise them up to it, never lower",
        ]
    );

    let public = errors(&minimal(
        "  s.d:\n    kind: public\n    ceilings: { max_rows_per_unit: 2 }\n    columns:\n      a: { type: text }\n",
    ));
    assert_eq!(
        public,
        vec!["tables.s.d.ceilings: only private tables have contribution bounds"]
    );
}

#[test]
fn unique_keys_name_declared_columns_of_private_tables_once() {
    let declared = minimal("").replace(
        "    max_rows_per_unit: 3\n",
        "    max_rows_per_unit: 3\n    unique_keys: [UID]\n",
    );
    let p = parse(&declared).expect("valid");
    let pt = p.table("s.t").and_then(|t| t.private()).expect("private");
    assert_eq!(pt.unique_keys, vec!["uid".to_string()]);
    assert_eq!(
        p.declared_unique_keys().into_iter().collect::<Vec<_>>(),
        vec![("s.t".to_string(), "uid".to_string())]
    );
    assert!(parse(&minimal(""))
        .expect("valid")
        .declared_unique_keys()
        .is_empty());

    let wrong = minimal("").replace(
        "    max_rows_per_unit: 3\n",
        "    max_rows_per_unit: 3\n    unique_keys: [nope, x, x]\n",
    );
    assert_eq!(
        errors(&wrong),
        vec![
            "tables.s.t.unique_keys[0]: column nope is not declared in columns",
            "tables.s.t.unique_keys[2]: named twice",
        ]
    );
    let public = errors(&minimal(
        "  s.d:\n    kind: public\n    unique_keys: [a]\n    columns:\n      a: { type: text }\n",
    ));
    assert_eq!(
        public,
        vec!["tables.s.d.unique_keys: only a private table's unique keys matter to pgdp (unit paths and one row per unit)"]
    );
}

#[test]
fn bounds_only_on_numeric_and_date_columns() {
    let text = minimal("").replace("k: { type: text,", "k: { type: text, lower: 0, upper: 1,");
    let e = errors(&text);
    assert!(
        e[0].contains("bounds need a numeric, date or timestamp column"),
        "{e:?}"
    );
    // A date column's bounds are dates, stored as days since 2000-01-01.
    let dated = minimal("").replace(
        "k: { type: text,",
        "d: { type: date, lower: '1999-12-31', upper: 2026-12-31 }\n      k: { type: text,",
    );
    let policy = crate::policy::parse(&dated).unwrap_or_else(|e| panic!("{e}"));
    let column = policy
        .tables
        .values()
        .flat_map(|t| t.columns.iter().find(|c| c.name == "d"))
        .next()
        .expect("column d");
    let b = column.bounds.expect("bounds");
    assert_eq!((b.lower, b.upper), (-1.0, 9861.0));
    for (bounds, error) in [
        ("lower: 0, upper: 10", "a date column's bounds are dates"),
        ("lower: '2020-02-30', upper: '2021-01-01'", "is not a date"),
        (
            "lower: '2021-01-01', upper: '2020-01-01'",
            "must be below upper",
        ),
        (
            "lower: '2020-01-01', upper: '2021-01-01', upper_ceiling: 20000",
            "needs a numeric column",
        ),
    ] {
        let text = minimal("").replace(
            "k: { type: text,",
            &format!("d: {{ type: date, {bounds} }}\n      k: {{ type: text,"),
        );
        let e = errors(&text);
        assert!(e.iter().any(|x| x.contains(error)), "{bounds}: {e:?}");
    }
    // A timestamp column's bounds are dates or timestamps, stored as epoch seconds; a
    // timestamptz bound may carry an offset (UTC without one), a timestamp's may not.
    for (ty, bounds, expected) in [
        (
            "timestamp",
            "lower: '2020-01-01', upper: '2020-01-02 12:00:00'",
            Ok((1_577_836_800.0, 1_577_966_400.0)),
        ),
        (
            "timestamptz",
            "lower: '2020-01-01 02:00:00+02', upper: '2020-01-02T12:00:00Z'",
            Ok((1_577_836_800.0, 1_577_966_400.0)),
        ),
        (
            "timestamp(6) with time zone",
            "lower: '2020-01-01', upper: '2020-01-02 14:00:00+02'",
            Ok((1_577_836_800.0, 1_577_966_400.0)),
        ),
        (
            "timestamp",
            "lower: '2020-01-01 02:00:00+02', upper: '2021-01-01'",
            Err("no offset: the column has no time zone"),
        ),
        (
            "timestamptz",
            "lower: 0, upper: 10",
            Err("a timestamp column's bounds are dates or timestamps"),
        ),
        (
            "timestamp",
            "lower: '2020-01-01', upper: '2021-01-01', upper_ceiling: 2000000000",
            Err("needs a numeric column"),
        ),
    ] {
        let text = minimal("").replace(
            "k: { type: text,",
            &format!("t: {{ type: {ty}, {bounds} }}\n      k: {{ type: text,"),
        );
        match expected {
            Ok((lower, upper)) => {
                let policy =
                    crate::policy::parse(&text).unwrap_or_else(|e| panic!("{bounds}: {e}"));
                let b = policy
                    .tables
                    .values()
                    .flat_map(|t| t.columns.iter().find(|c| c.name == "t"))
                    .next()
                    .and_then(|c| c.bounds)
                    .expect("bounds");
                assert_eq!((b.lower, b.upper), (lower, upper), "{ty} {bounds}");
            }
            Err(error) => {
                let e = errors(&text);
                assert!(e.iter().any(|x| x.contains(error)), "{bounds}: {e:?}");
            }
        }
    }
    let numeric = minimal("").replace(
        "k: { type: text,",
        "x: { type: integer, lower: '2020-01-01', upper: 5 }\n      k: { type: text,",
    );
    let e = errors(&numeric);
    assert!(
        e.iter()
            .any(|x| x.contains("a numeric column's bounds are numbers")),
        "{e:?}"
    );
}

#[test]
fn verifier_parses_and_rejects_garbage() {
    assert!(matches!(
        parse_scram_verifier(VERIFIER),
        Ok(Credential::Verifier {
            iterations: 4096,
            ..
        })
    ));
    assert!(parse_scram_verifier("md5abc").is_err());
    assert!(parse_scram_verifier("SCRAM-SHA-256$10:c2FsdA==$AA==:AA==").is_err());
}

fn with_path(path: &str, extra_columns: &str) -> String {
    minimal(&format!(
            "  s.c:\n    kind: private\n    unit_path: {path}\n    max_groups_per_unit: 2\n    columns:\n      t_id: {{ type: bigint }}\n{extra_columns}"
        ))
        .replace(
            "      uid: { type: bigint }\n",
            "      uid: { type: bigint }\n      t_key: { type: bigint }\n",
        )
}

#[test]
fn unit_path_resolves_to_the_unit_of_the_table_it_reaches() {
    let p = parse(&with_path(
        "[ { column: t_id, references: s.t, key: t_key } ]",
        "",
    ))
    .expect("valid");
    let pt = p.table("s.c").and_then(|t| t.private()).expect("private");
    assert_eq!(pt.privacy_unit, None);
    let path = pt.unit_path.as_ref().expect("resolved path");
    assert_eq!(path.unit, "uid");
    assert_eq!(path.steps.len(), 1);
    assert_eq!(pt.max_groups_per_unit, 2);
    assert!(p.summary().contains("uid via t_id -> s.t.t_key"));
}

#[test]
fn unit_path_errors_name_the_step() {
    let e = errors(&with_path(
        "[ { column: t_id, references: s.t, key: nothing } ]",
        "",
    ));
    assert_eq!(
        e,
        vec!["tables.s.c.unit_path[0].key: column nothing is not declared in s.t"]
    );
    let e = errors(&with_path(
        "[ { column: t_id, references: s.missing, key: t_key } ]",
        "",
    ));
    assert_eq!(
        e,
        vec!["tables.s.c.unit_path[0].references: s.missing is not a table of the policy"]
    );
    let e = errors(&with_path(
        "[ { column: nope, references: s.t, key: t_key } ]",
        "",
    ));
    assert_eq!(
        e,
        vec!["tables.s.c.unit_path[0].column: column nope is not declared in s.c"]
    );
    // The derived unit cannot also be a declared column.
    let e = errors(&with_path(
        "[ { column: t_id, references: s.t, key: t_key } ]",
        "      uid: { type: bigint }\n",
    ));
    assert!(e[0].starts_with("tables.s.c.columns.uid:"), "{e:?}");
    // Both ways of naming the unit at once.
    let e = errors(
        &with_path("[ { column: t_id, references: s.t, key: t_key } ]", "")
            .replace("    unit_path:", "    privacy_unit: t_id\n    unit_path:"),
    );
    assert!(e.iter().any(|m| m.contains("exclude each other")), "{e:?}");
}

#[test]
fn unit_path_cycles_and_row_level_ends_are_refused() {
    let cyclic = minimal(
            "  s.a:\n    kind: private\n    unit_path: [ { column: b_id, references: s.b, key: id } ]\n    columns:\n      id: { type: bigint }\n      b_id: { type: bigint }\n  s.b:\n    kind: private\n    unit_path: [ { column: a_id, references: s.a, key: id } ]\n    columns:\n      id: { type: bigint }\n      a_id: { type: bigint }\n",
        );
    let e = errors(&cyclic);
    assert!(e.iter().any(|m| m.contains("(a cycle)")), "{e:?}");
    let row_level = minimal(
            "  s.a:\n    kind: private\n    unit_path: [ { column: r_id, references: s.r, key: id } ]\n    columns:\n      r_id: { type: bigint }\n  s.r:\n    kind: private\n    columns:\n      id: { type: bigint }\n",
        );
    let e = errors(&row_level);
    assert_eq!(
            e,
            vec!["tables.s.a.unit_path[0].references: s.r is row-level: a unit path must end at a table with a privacy_unit"]
        );
}

#[test]
fn unit_path_chains_through_tables_with_paths_up_to_the_limit() {
    let mut extra = String::new();
    // s.c0 -> s.t directly, s.cN -> s.c(N-1): N + 1 steps in all.
    for i in 0..=limits::UNIT_PATH_STEPS_MAX {
        let target = if i == 0 {
            "s.t".to_string()
        } else {
            format!("s.c{}", i - 1)
        };
        let key = if i == 0 { "t_key" } else { "id" };
        extra.push_str(&format!(
                "  s.c{i}:\n    kind: private\n    unit_path: [ {{ column: up, references: {target}, key: {key} }} ]\n    columns:\n      id: {{ type: bigint }}\n      up: {{ type: bigint }}\n"
            ));
    }
    let text = minimal(&extra).replace(
        "      uid: { type: bigint }\n",
        "      uid: { type: bigint }\n      t_key: { type: bigint }\n",
    );
    let e = errors(&text);
    let last = limits::UNIT_PATH_STEPS_MAX;
    assert_eq!(
        e,
        vec![format!(
            "tables.s.c{last}.unit_path: the chain to the privacy unit has more than {last} steps"
        )]
    );
    let ok = parse(&minimal(
            "  s.a:\n    kind: private\n    unit_path: [ { column: b_id, references: s.b, key: id } ]\n    columns:\n      b_id: { type: bigint }\n  s.b:\n    kind: private\n    unit_path: [ { column: uid_ref, references: s.t, key: uid } ]\n    columns:\n      id: { type: bigint }\n      uid_ref: { type: bigint }\n",
        ))
        .expect("a chain through a table with its own path");
    let path = ok
        .table("s.a")
        .and_then(|t| t.private())
        .and_then(|p| p.unit_path.clone())
        .expect("resolved");
    assert_eq!(path.steps.len(), 2);
    assert_eq!(path.steps[1].references, "s.t");
    assert_eq!(path.unit, "uid");
}

/// `exhaustive` states that the listed values are every value: it needs the list, and it is
/// off unless written.
#[test]
fn exhaustive_needs_public_values_and_is_off_by_default() {
    let p = parse(&minimal("")).expect("valid");
    assert!(
        !p.table("s.t")
            .and_then(|t| t.column("k"))
            .expect("k")
            .exhaustive
    );
    let text = minimal("").replace(
        "public_values: [a, b]",
        "public_values: [a, b], exhaustive: true",
    );
    let p = parse(&text).expect("valid");
    assert!(
        p.table("s.t")
            .and_then(|t| t.column("k"))
            .expect("k")
            .exhaustive
    );
    let text = minimal("").replace("upper: 10 }", "upper: 10, exhaustive: true }");
    let e = errors(&text);
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(
        e[0].starts_with("tables.s.t.columns.x: exhaustive: true needs public_values"),
        "{e:?}"
    );
}

#[test]
fn demo_policy_is_valid() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("policies/demo.yaml");
    let p = load(&path).expect("demo policy validates");
    assert_eq!(p.database, "pgdp_demo");
    let a = p.analysts.get("analyst").expect("demo analyst");
    assert_eq!(a.budget.epsilon, 10.0);
    assert_eq!(a.budget.delta, 1e-5);
    assert!(p.table("demo.people").and_then(|t| t.private()).is_some());
    let visits = p
        .table("demo.visits")
        .and_then(|t| t.private())
        .expect("demo.visits is private");
    assert_eq!(
        (
            visits.max_rows_per_unit,
            visits.max_groups_per_unit,
            visits.rows_ceiling,
            visits.groups_ceiling
        ),
        (10, 5, 40, 16)
    );
    assert!(
        p.defaults.choose_bounds,
        "the demo chooses its caps per query"
    );
    assert_eq!(
        p.defaults.max_bias,
        Some(0.1),
        "the demo refuses biased answers"
    );
    let omitted = parse(&minimal("")).expect("valid");
    assert_eq!(
        omitted.defaults.max_bias,
        Some(crate::limits::MAX_BIAS_DEFAULT),
        "a policy that names no max_bias refuses biased answers"
    );
    let off = parse(&format!("defaults: {{ max_bias: 'off' }}\n{}", minimal(""))).expect("valid");
    assert_eq!(off.defaults.max_bias, None);
    assert_eq!(
        p.table("demo.prescriptions")
            .and_then(|t| t.private())
            .and_then(|p| p.unit_path.as_ref())
            .map(|path| path.unit.as_str()),
        Some("person_id")
    );
    assert_eq!(
        p.table("demo.regions").map(|t| &t.kind),
        Some(&TableKind::Public)
    );
}

#[test]
fn release_schedule_is_read_and_checked_at_its_path() {
    let plain = parse(&minimal("")).expect("valid");
    assert_eq!(plain.release_schedule, None);
    let with = |schedule: &str| format!("release_schedule: {schedule}\n{}", minimal(""));
    let p = parse(&with("{ floor_ms: 250, ratio: 2 }")).expect("valid");
    let s = p.release_schedule.expect("a schedule");
    assert_eq!((s.floor_ms(), s.ratio()), (250, 2.0));
    assert!(p
        .summary()
        .contains("release schedule: DP answers leave at 250 ms"));

    let e = errors(&with("{ floor_ms: 0, ratio: 2 }"));
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(
        e[0].starts_with("release_schedule: floor_ms must be between 1"),
        "{e:?}"
    );
    let e = errors(&with("{ floor_ms: 100, ratio: 1 }"));
    assert!(
        e[0].starts_with("release_schedule: ratio must be between"),
        "{e:?}"
    );
    let e = errors(&with("{ floor_ms: 100 }"));
    assert!(e[0].contains("ratio"), "{e:?}");
    let e = errors(&with("{ floor_ms: 100, ratio: 2, jitter: 1 }"));
    assert!(e[0].contains("jitter"), "{e:?}");
}

#[test]
fn budgets_renew_per_day_week_or_month() {
    let text = minimal("")
        .replace(
            "epsilon: 1, delta: 1.0e-6 }",
            "epsilon: 1, delta: 1.0e-6, period: Week }",
        )
        .replace(
            "database: db",
            "database: db\nbudget: { epsilon: 5, period: month }",
        );
    let p = parse(&text).expect("valid");
    assert_eq!(p.analysts["alice"].budget.period, Some(Period::Week));
    let dataset = p.dataset_budget.clone().expect("a dataset budget");
    assert_eq!(dataset.period, Some(Period::Month));
    assert!(p
        .summary()
        .contains("per week (renews Mondays at 00:00 UTC)"));
    // No period: the budget never renews, as before.
    let plain = parse(&minimal("")).expect("valid");
    assert_eq!(plain.analysts["alice"].budget.period, None);
}

#[test]
fn a_malformed_period_is_named_by_its_path() {
    for bad in ["hourly", "'1 day'", "7", "[day]", "''"] {
        let text = minimal("").replace(
            "epsilon: 1, delta: 1.0e-6 }",
            &format!("epsilon: 1, delta: 1.0e-6, period: {bad} }}"),
        );
        let e = errors(&text);
        assert_eq!(e.len(), 1, "{bad}: {e:?}");
        assert!(
            e[0].starts_with("analysts.alice.budget.period: must be day, week or month"),
            "{bad}: {e:?}"
        );
    }
    let text = minimal("").replace(
        "database: db",
        "database: db\nbudget: { epsilon: 5, period: fortnight }",
    );
    let e = errors(&text);
    assert!(
        e.iter()
            .any(|m| m.starts_with("budget.period:") && m.contains("'fortnight'")),
        "{e:?}"
    );
}

#[test]
fn a_budget_names_its_accounting_rule() {
    let text = minimal("")
        .replace(
            "epsilon: 1, delta: 1.0e-6 }",
            "epsilon: 1, delta: 1.0e-6, accounting: Gaussian }",
        )
        .replace(
            "database: db",
            "database: db\nbudget: { epsilon: 5, delta: 1.0e-5, accounting: mixed }",
        );
    let p = parse(&text).expect("valid");
    assert_eq!(p.analysts["alice"].budget.accounting, Accounting::Gaussian);
    let dataset = p.dataset_budget.clone().expect("a dataset budget");
    assert_eq!(dataset.accounting, Accounting::Mixed);
    assert!(
        p.summary().contains("delta 0.000001, gaussian accounting"),
        "{}",
        p.summary()
    );
    // Left out: mixed.
    let plain = parse(&minimal("")).expect("valid");
    assert_eq!(plain.analysts["alice"].budget.accounting, Accounting::Mixed);
    for bad in ["gdp", "7", "[gaussian]", "''"] {
        let text = minimal("").replace(
            "epsilon: 1, delta: 1.0e-6 }",
            &format!("epsilon: 1, delta: 1.0e-6, accounting: {bad} }}"),
        );
        let e = errors(&text);
        assert_eq!(e.len(), 1, "{bad}: {e:?}");
        assert!(
            e[0].starts_with("analysts.alice.budget.accounting: must be mixed or gaussian"),
            "{bad}: {e:?}"
        );
    }
}

#[test]
fn an_upper_ceiling_lies_above_upper_of_a_non_negative_column() {
    let with = |spec: &str| minimal("").replace("x: { type: numeric, lower: 0, upper: 10 }", spec);
    let p = parse(&with(
        "x: { type: numeric, lower: 0, upper: 10, upper_ceiling: 1000 }",
    ))
    .expect("valid");
    let t = p.table("s.t").expect("table");
    assert_eq!(t.column("x").and_then(|c| c.upper_ceiling), Some(1000.0));
    assert_eq!(t.column("uid").and_then(|c| c.upper_ceiling), None);
    for (spec, problem) in [
        (
            "x: { type: numeric, lower: 0, upper: 10, upper_ceiling: 10 }",
            "s.t.columns.x.upper_ceiling: must be a finite number above upper (10)",
        ),
        (
            "x: { type: numeric, lower: -1, upper: 10, upper_ceiling: 100 }",
            "s.t.columns.x.upper_ceiling: needs lower >= 0",
        ),
        (
            "x: { type: numeric, upper_ceiling: 100 }",
            "s.t.columns.x: upper_ceiling needs lower and upper",
        ),
        (
            "x: { type: numeric, lower: 0, upper: 10, upper_ceiling: 1.0e16 }",
            "s.t.columns.x.upper_ceiling: must lie within",
        ),
    ] {
        let e = errors(&with(spec));
        assert!(e.iter().any(|m| m.contains(problem)), "{spec}: {e:?}");
    }
}

#[test]
fn login_throttle_is_a_policy_setting_with_safe_limits() {
    let default = parse(&minimal("")).expect("valid");
    assert_eq!(default.login_throttle, LoginThrottle::default());
    let set = parse(&format!(
        "login_throttle: {{ failures_per_user: 5, failures_per_address: 50, window_s: 300 }}\n{}",
        minimal("")
    ))
    .expect("valid");
    assert_eq!(
        set.login_throttle,
        LoginThrottle {
            failures_per_user: 5,
            failures_per_address: 50,
            window: std::time::Duration::from_secs(300),
        }
    );
    for (throttle, error) in [
        (
            "{ failures_per_user: 2 }",
            "login_throttle.failures_per_user: must be at least 3",
        ),
        (
            "{ failures_per_user: 20, failures_per_address: 10 }",
            "login_throttle.failures_per_address: must be at least failures_per_user (20)",
        ),
        (
            "{ window_s: 0 }",
            "login_throttle.window_s: must be between 1 and 86400 seconds, not 0",
        ),
    ] {
        let e = errors(&format!("login_throttle: {throttle}\n{}", minimal("")));
        assert!(e.iter().any(|x| x.starts_with(error)), "{throttle}: {e:?}");
    }
}

/// `statement_timeout_s` bounds every upstream DP statement: 60 s unless the policy says
/// otherwise, between 1 s and a day.
#[test]
fn statement_timeout_is_a_policy_setting_within_its_range() {
    let default = parse(&minimal("")).expect("valid");
    assert_eq!(
        default.statement_timeout,
        std::time::Duration::from_secs(60)
    );
    let long = parse(&format!("statement_timeout_s: 600\n{}", minimal(""))).expect("valid");
    assert_eq!(long.statement_timeout, std::time::Duration::from_secs(600));
    for bad in ["0", "86401"] {
        let e = errors(&format!("statement_timeout_s: {bad}\n{}", minimal("")));
        assert!(
            e.iter()
                .any(|m| m.contains("statement_timeout_s") && m.contains("between 1 and 86400")),
            "{bad}: {e:?}"
        );
    }
}

/// `minimal` with an exhaustive table `s.c` (row-level or with a unit) and these synopses.
fn with_synopses(unit: &str, synopses: &str) -> String {
    minimal(&format!(
        r#"  s.c:
    kind: private
    {unit}
    columns:
      uid: {{ type: bigint }}
      region: {{ type: text, public_values: [n, s, e, w], exhaustive: true }}
      sex: {{ type: text, public_values: [f, m, x], exhaustive: true }}
      age: {{ type: integer, lower: 0, upper: 100, groupable: true }}
synopses:
{synopses}"#
    ))
}

#[test]
fn a_synopsis_is_declared_over_exhaustive_columns_of_a_private_table() {
    let text = with_synopses(
        "privacy_unit: uid\n    max_groups_per_unit: 2\n    max_rows_per_unit: 3",
        "  cube: { table: s.c, columns: [region, sex], epsilon: 0.5, rounds: 10, accuracy: 25 }\n",
    );
    let p = parse(&text).expect("valid");
    let s = &p.synopses["cube"];
    assert_eq!(s.table, "s.c");
    assert_eq!(s.cells(), 12);
    assert_eq!(s.column("sex").map(|(i, v)| (i, v.len())), Some((1, 3)));
    assert_eq!(s.rows_per_unit, 6, "the table's caps' product");
    assert_eq!((s.epsilon, s.rounds, s.accuracy), (0.5, 10, 25.0));
    assert!(p
        .summary()
        .contains("synopsis cube: s.c over region x sex (12 cells)"));
    // Row-level: each row is a unit.
    let row_level = with_synopses(
        "",
        "  cube: { table: s.c, columns: [sex], epsilon: 0.5, rounds: 10, accuracy: 25 }\n",
    );
    assert_eq!(
        parse(&row_level).expect("valid").synopses["cube"].rows_per_unit,
        1
    );
    // A changed declaration changes the fingerprint the ledger's state is kept under.
    let other = parse(&text.replace("accuracy: 25", "accuracy: 30")).expect("valid");
    assert_ne!(s.fingerprint(), other.synopses["cube"].fingerprint());
}

#[test]
fn synopsis_errors_name_their_path() {
    let unit = "privacy_unit: uid\n    max_groups_per_unit: 1\n    max_rows_per_unit: 1";
    let cases = [
        (
            "  cube: { table: s.c, columns: [age], epsilon: 0.5, rounds: 10, accuracy: 25 }\n",
            "synopses.cube.columns[0]: age needs public_values and exhaustive: true",
        ),
        (
            "  cube: { table: s.t, columns: [k], epsilon: 0.5, rounds: 10, accuracy: 25 }\n",
            "synopses.cube.columns[0]: k needs public_values and exhaustive: true",
        ),
        (
            "  cube: { table: s.c, columns: [uid], epsilon: 0.5, rounds: 10, accuracy: 25 }\n",
            "synopses.cube.columns[0]: uid is the privacy unit",
        ),
        (
            "  cube: { table: s.c, columns: [sex, sex], epsilon: 0.5, rounds: 10, accuracy: 25 }\n",
            "synopses.cube.columns[1]: named twice",
        ),
        (
            "  cube: { table: s.c, columns: [nope], epsilon: 0.5, rounds: 10, accuracy: 25 }\n",
            "synopses.cube.columns[0]: nope is not a declared column of s.c",
        ),
        (
            "  cube: { table: s.x, columns: [sex], epsilon: 0.5, rounds: 10, accuracy: 25 }\n",
            "synopses.cube.table: s.x is not a table of the policy",
        ),
        (
            "  cube: { table: s.c, columns: [sex], epsilon: 0.5, rounds: 0, accuracy: 25 }\n",
            "synopses.cube.rounds: must be between 1 and 200, not 0",
        ),
        (
            "  cube: { table: s.c, columns: [sex], epsilon: 0.5, rounds: 10, accuracy: -1 }\n",
            "synopses.cube.accuracy: must be a positive number of rows, not -1",
        ),
        (
            "  cube: { table: s.c, columns: [sex], epsilon: 0, rounds: 10, accuracy: 25 }\n",
            "synopses.cube.epsilon: epsilon must be positive",
        ),
        (
            "  Cube: { table: s.c, columns: [sex], epsilon: 0.5, rounds: 10, accuracy: 25 }\n",
            "synopses.Cube: synopsis names must be plain lower-case identifiers",
        ),
    ];
    for (synopses, expected) in cases {
        let e = errors(&with_synopses(unit, synopses));
        assert!(
            e.iter().any(|e| e.starts_with(expected)),
            "{synopses}: expected {expected:?} in {e:?}"
        );
    }
    // The synopsis is charged as one query: within every analyst's per-query cap.
    let capped = with_synopses(
        unit,
        "  cube: { table: s.c, columns: [sex], epsilon: 0.5, rounds: 10, accuracy: 25 }\n",
    )
    .replace(
        "budget: { epsilon: 1, delta: 1.0e-6 }",
        "budget: { epsilon: 1, delta: 1.0e-6, epsilon_per_query_max: 0.25 }",
    );
    assert!(errors(&capped).iter().any(|e| e.starts_with(
        "synopses.cube.epsilon: 0.5 is above analyst alice's epsilon_per_query_max (0.25)"
    )));
    // Unknown keys are refused, as everywhere in the policy.
    assert!(!errors(&with_synopses(
        unit,
        "  cube: { table: s.c, columns: [sex], epsilon: 0.5, rounds: 10, accuracy: 25, alpha: 1 }\n",
    ))
    .is_empty());
}

#[test]
fn a_synopsis_domain_stays_within_its_cell_limit() {
    let values: Vec<String> = (0..200).map(|i| format!("v{i}")).collect();
    let text = minimal(&format!(
        "  s.big:\n    kind: private\n    columns:\n      a: {{ type: text, public_values: [{0}], exhaustive: true }}\n      b: {{ type: text, public_values: [{0}], exhaustive: true }}\nsynopses:\n  big: {{ table: s.big, columns: [a, b], epsilon: 1, rounds: 5, accuracy: 10 }}\n",
        values.join(", ")
    ));
    let e = errors(&text);
    assert!(
        e.iter()
            .any(|e| e.starts_with("synopses.big.columns: the domain has 40000 cells")),
        "{e:?}"
    );
}
