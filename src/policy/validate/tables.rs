//! The policy's tables and their columns, validated one by one (unit paths are resolved once
//! every table is known, in [`super::resolve_unit_paths`]).

use super::*;

/// The tables of the policy, keyed by their lower-case qualified name.
pub(super) fn validate_tables(
    p: &mut Problems,
    raw: &BTreeMap<String, RawTable>,
) -> BTreeMap<String, Table> {
    let mut tables = BTreeMap::new();
    // Unit paths as written (table → steps), resolved once every table is known.
    let mut raw_paths: BTreeMap<String, Vec<PathStep>> = BTreeMap::new();
    if raw.is_empty() {
        p.add("tables", "at least one table is required");
    }
    for (qualified, t) in raw {
        if let Some((lowered, table)) = validate_table(p, qualified, t, &mut raw_paths) {
            if tables.contains_key(&lowered) {
                p.add(
                    &format!("tables.{qualified}"),
                    "declared twice (names are case-insensitive)",
                );
            }
            tables.insert(lowered, table);
        }
    }
    resolve_unit_paths(p, &raw_paths, &mut tables);
    tables
}

/// One table: its name, columns and kind; a private table's unit path goes to `raw_paths`.
fn validate_table(
    p: &mut Problems,
    qualified: &str,
    t: &RawTable,
    raw_paths: &mut BTreeMap<String, Vec<PathStep>>,
) -> Option<(String, Table)> {
    let path = format!("tables.{qualified}");
    let lowered = qualified.to_ascii_lowercase();
    let Some((schema, name)) = lowered.split_once('.') else {
        p.add(&path, "table names must be qualified as schema.table");
        return None;
    };
    if !is_identifier(schema) || !is_identifier(name) {
        p.add(
            &path,
            "schema and table names must be plain lower-case identifiers",
        );
        return None;
    }
    if matches!(schema, "pg_catalog" | "information_schema" | "pgdp") || schema.starts_with("pg_") {
        p.add(&path, format!("schema {schema} is reserved"));
        return None;
    }

    let mut columns = Vec::new();
    if t.columns.is_empty() {
        p.add(
            &format!("{path}.columns"),
            "at least one column is required",
        );
    }
    for (cname, c) in &t.columns {
        columns.extend(validate_column(p, &path, cname, c));
    }
    let kind = match t.kind.as_str() {
        "public" => public_table(p, &path, t),
        "private" => TableKind::Private(private_table(p, &path, &lowered, t, &columns, raw_paths)),
        other => {
            p.add(
                &format!("{path}.kind"),
                format!("must be public or private, got {other:?}"),
            );
            return None;
        }
    };
    if let TableKind::Private(pt) = &kind {
        if let Some(u) = &pt.privacy_unit {
            if let Some(c) = columns.iter().find(|c| &c.name == u) {
                if c.groupable {
                    p.add(
                        &format!("{path}.columns.{u}"),
                        "the privacy unit column cannot be groupable",
                    );
                }
            }
        }
    }
    let table = Table {
        schema: schema.to_string(),
        name: name.to_string(),
        kind,
        columns,
    };
    Some((lowered.clone(), table))
}

/// A public table: no contribution bounds, no unique keys.
fn public_table(p: &mut Problems, path: &str, t: &RawTable) -> TableKind {
    for (key, present) in [
        ("privacy_unit", t.privacy_unit.is_some()),
        ("unit_path", t.unit_path.is_some()),
        ("max_groups_per_unit", t.max_groups_per_unit.is_some()),
        ("max_rows_per_unit", t.max_rows_per_unit.is_some()),
        ("ceilings", t.ceilings.is_some()),
    ] {
        if present {
            p.add(
                &format!("{path}.{key}"),
                "only private tables have contribution bounds",
            );
        }
    }
    if t.unique_keys.is_some() {
        p.add(
            &format!("{path}.unique_keys"),
            "only a private table's unique keys matter to pgdp (unit paths and one row per unit)",
        );
    }
    TableKind::Public
}

/// A private table's privacy unit (or unit path, kept in `raw_paths`), caps and ceilings.
fn private_table(
    p: &mut Problems,
    path: &str,
    lowered: &str,
    t: &RawTable,
    columns: &[Column],
    raw_paths: &mut BTreeMap<String, Vec<PathStep>>,
) -> PrivateTable {
    let unit = t.privacy_unit.as_ref().map(|u| u.to_ascii_lowercase());
    if let Some(u) = &unit {
        if !columns.iter().any(|c| &c.name == u) {
            p.add(
                &format!("{path}.privacy_unit"),
                format!("column {u} is not declared in columns"),
            );
        }
    }
    let own_path = match (&unit, &t.unit_path) {
        (Some(_), Some(_)) => {
            p.add(
                path,
                "privacy_unit and unit_path exclude each other: name the unit column, or the path to it",
            );
            None
        }
        (None, Some(steps)) => {
            // Steps are checked against the tables they name once all are read.
            Some(raw_path_steps(p, path, steps))
        }
        _ => None,
    };
    if let Some(steps) = &own_path {
        raw_paths.insert(lowered.to_string(), steps.clone());
    }
    let groups = t.max_groups_per_unit.unwrap_or(1);
    let rows = t.max_rows_per_unit.unwrap_or(1);
    if !(1..=limits::GROUPS_PER_UNIT_MAX).contains(&groups) {
        p.add(
            &format!("{path}.max_groups_per_unit"),
            format!("must be between 1 and {}", limits::GROUPS_PER_UNIT_MAX),
        );
    }
    if !(1..=limits::ROWS_PER_UNIT_MAX).contains(&rows) {
        p.add(
            &format!("{path}.max_rows_per_unit"),
            format!("must be between 1 and {}", limits::ROWS_PER_UNIT_MAX),
        );
    }
    let raw_ceilings = t.ceilings.as_ref();
    let groups_ceiling = raw_ceilings
        .and_then(|c| c.max_groups_per_unit)
        .unwrap_or(groups);
    let rows_ceiling = raw_ceilings
        .and_then(|c| c.max_rows_per_unit)
        .unwrap_or(rows);
    for (key, ceiling, cap, max) in [
        (
            "max_groups_per_unit",
            groups_ceiling,
            groups,
            limits::GROUPS_PER_UNIT_MAX,
        ),
        (
            "max_rows_per_unit",
            rows_ceiling,
            rows,
            limits::ROWS_PER_UNIT_MAX,
        ),
    ] {
        if !(cap..=max).contains(&ceiling) {
            p.add(
                &format!("{path}.ceilings.{key}"),
                format!(
                    "must be between the table's {key} ({cap}) and {max}: a query that chooses its caps may raise them up to it, never lower"
                ),
            );
        }
    }
    if unit.is_none()
        && own_path.is_none()
        && (groups != 1 || rows != 1 || groups_ceiling != 1 || rows_ceiling != 1)
    {
        p.add(
            path,
            "a row-level table (no privacy_unit) has one group and one row per unit",
        );
    }
    PrivateTable {
        privacy_unit: unit,
        unit_path: None,
        max_groups_per_unit: groups,
        max_rows_per_unit: rows,
        groups_ceiling,
        rows_ceiling,
        unique_keys: unique_keys(p, path, t.unique_keys.as_deref(), columns),
    }
}

/// One column: its name, type, bounds, upper ceiling and public values.
fn validate_column(p: &mut Problems, path: &str, raw_name: &str, c: &RawColumn) -> Option<Column> {
    let cpath = format!("{path}.columns.{raw_name}");
    let cname = raw_name.to_ascii_lowercase();
    if !is_identifier(&cname) || cname.starts_with("__dp_") {
        p.add(
            &cpath,
            "column names must be plain identifiers not starting with __dp_",
        );
        return None;
    }
    let Some(ty) = ColumnType::parse(&c.ty) else {
        p.add(&format!("{cpath}.type"), format!("unknown type {:?}", c.ty));
        return None;
    };
    let bounds = column_bounds(p, &cpath, c, ty);
    let upper_ceiling = upper_ceiling(p, &cpath, c.upper_ceiling, bounds, ty);
    let public_values = public_values(p, &cpath, c.public_values.as_deref());
    let groupable = c.groupable.unwrap_or(public_values.is_some());
    if public_values.is_some() && !groupable {
        p.add(&cpath, "public_values need groupable: true");
    }
    let exhaustive = c.exhaustive.unwrap_or(false);
    if exhaustive && public_values.is_none() {
        p.add(
            &cpath,
            "exhaustive: true needs public_values (it says every row holds one of them)",
        );
    }
    Some(Column {
        name: cname,
        ty,
        declared_type: c.ty.trim().to_ascii_lowercase(),
        bounds,
        upper_ceiling,
        groupable,
        public_values,
        exhaustive,
    })
}

/// A column's bounds (`lower` and `upper` together, finite, ordered, within the limit).
fn column_bounds(p: &mut Problems, cpath: &str, c: &RawColumn, ty: ColumnType) -> Option<Bounds> {
    match (&c.lower, &c.upper) {
        (None, None) => None,
        (Some(lower), Some(upper)) => {
            let mut ok = true;
            let mut value = |b: &RawBound, key: &str| match b.value(ty, &c.ty) {
                Ok(x) => x,
                Err(e) => {
                    p.add(&format!("{cpath}.{key}"), e);
                    ok = false;
                    0.0
                }
            };
            let (lower, upper) = (value(lower, "lower"), value(upper, "upper"));
            if !ok {
                // Reported above.
            } else if !lower.is_finite() || !upper.is_finite() {
                p.add(cpath, "bounds must be finite");
                ok = false;
            } else if lower >= upper {
                p.add(
                    cpath,
                    format!("lower ({lower}) must be below upper ({upper})"),
                );
                ok = false;
            } else if lower.abs().max(upper.abs()) > limits::COLUMN_BOUND_ABS_MAX {
                p.add(
                    cpath,
                    format!("bounds must lie within ±{}", limits::COLUMN_BOUND_ABS_MAX),
                );
                ok = false;
            }
            ok.then_some(Bounds { lower, upper })
        }
        _ => {
            p.add(cpath, "lower and upper must be given together");
            None
        }
    }
}

/// How far a query may raise a non-negative numeric column's upper bound.
fn upper_ceiling(
    p: &mut Problems,
    cpath: &str,
    ceiling: Option<f64>,
    bounds: Option<Bounds>,
    ty: ColumnType,
) -> Option<f64> {
    match (ceiling, bounds) {
        (None, _) => None,
        (Some(_), None) => {
            p.add(
                cpath,
                "upper_ceiling needs lower and upper (it is how far a query may raise upper)",
            );
            None
        }
        (Some(ceiling), Some(b)) => {
            if !ty.is_numeric() {
                p.add(
                    &format!("{cpath}.upper_ceiling"),
                    "needs a numeric column (only sums and averages choose an upper bound)",
                );
                None
            } else if !ceiling.is_finite() || ceiling <= b.upper {
                p.add(
                    &format!("{cpath}.upper_ceiling"),
                    format!("must be a finite number above upper ({})", b.upper),
                );
                None
            } else if b.lower < 0.0 {
                p.add(
                    &format!("{cpath}.upper_ceiling"),
                    "needs lower >= 0 (pgdp chooses only the upper bound of non-negative columns)",
                );
                None
            } else if ceiling > limits::COLUMN_BOUND_ABS_MAX {
                p.add(
                    &format!("{cpath}.upper_ceiling"),
                    format!("must lie within {}", limits::COLUMN_BOUND_ABS_MAX),
                );
                None
            } else {
                Some(ceiling)
            }
        }
    }
}

/// A column's public values as text, sorted and without duplicates.
fn public_values(
    p: &mut Problems,
    cpath: &str,
    values: Option<&[serde_norway::Value]>,
) -> Option<Vec<String>> {
    match values {
        None => None,
        Some(values) => {
            let mut out = Vec::new();
            for (i, v) in values.iter().enumerate() {
                match value_text(v) {
                    Some(s) => out.push(s),
                    None => p.add(
                        &format!("{cpath}.public_values[{i}]"),
                        "must be a string, number or boolean",
                    ),
                }
            }
            out.sort();
            out.dedup();
            if out.len() > limits::PUBLIC_KEY_COMBINATIONS_MAX {
                p.add(&format!("{cpath}.public_values"), "too many values");
            }
            Some(out)
        }
    }
}
