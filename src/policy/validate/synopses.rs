//! The policy's `synopses`: each a shared private-multiplicative-weights synopsis over the public
//! domain of a few columns of one private table (docs/policy.md, "Synopses").

use super::*;

/// A synopsis as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(in crate::policy) struct RawSynopsis {
    table: String,
    columns: Vec<String>,
    epsilon: f64,
    rounds: usize,
    accuracy: f64,
}

/// The synopses, each checked against the validated tables and analysts.
pub(super) fn validate_synopses(
    p: &mut Problems,
    raw: &BTreeMap<String, RawSynopsis>,
    tables: &BTreeMap<String, Table>,
    analysts: &BTreeMap<String, Analyst>,
) -> BTreeMap<String, Synopsis> {
    let mut out = BTreeMap::new();
    for (name, s) in raw {
        let path = format!("synopses.{name}");
        if !is_identifier(name) || name.len() > 63 {
            p.add(
                &path,
                "synopsis names must be plain lower-case identifiers of at most 63 characters",
            );
        }
        check_epsilon(p, &format!("{path}.epsilon"), s.epsilon);
        for a in analysts.values() {
            if let Some(cap) = a.budget.epsilon_per_query_max.filter(|c| s.epsilon > *c) {
                p.add(
                    &format!("{path}.epsilon"),
                    format!(
                        "{} is above analyst {}'s epsilon_per_query_max ({cap}): the synopsis is charged as one query",
                        s.epsilon, a.name
                    ),
                );
            }
        }
        if !(1..=limits::SYNOPSIS_ROUNDS_MAX).contains(&s.rounds) {
            p.add(
                &format!("{path}.rounds"),
                format!(
                    "must be between 1 and {}, not {}",
                    limits::SYNOPSIS_ROUNDS_MAX,
                    s.rounds
                ),
            );
        }
        if !(s.accuracy.is_finite() && s.accuracy > 0.0) {
            p.add(
                &format!("{path}.accuracy"),
                format!("must be a positive number of rows, not {}", s.accuracy),
            );
        }
        let Some((table, rows_per_unit)) = synopsis_table(p, &path, &s.table, tables) else {
            continue;
        };
        let columns = synopsis_columns(p, &path, &s.columns, table);
        let synopsis = Synopsis {
            name: name.clone(),
            table: table.qualified_name(),
            columns,
            epsilon: s.epsilon,
            rounds: s.rounds,
            accuracy: s.accuracy,
            rows_per_unit,
        };
        if synopsis.cells() > limits::SYNOPSIS_CELLS_MAX {
            p.add(
                &format!("{path}.columns"),
                format!(
                    "the domain has {} cells (the product of the columns' public values); at most {}",
                    synopsis.cells(),
                    limits::SYNOPSIS_CELLS_MAX
                ),
            );
        }
        out.insert(name.clone(), synopsis);
    }
    out
}

/// The synopsis's table and Δ, the most rows of one unit it counts: a private table with a
/// privacy unit column (its caps' product) or row-level (1).
fn synopsis_table<'t>(
    p: &mut Problems,
    path: &str,
    name: &str,
    tables: &'t BTreeMap<String, Table>,
) -> Option<(&'t Table, u64)> {
    let Some(table) = tables.get(&name.to_ascii_lowercase()) else {
        p.add(
            &format!("{path}.table"),
            format!("{name} is not a table of the policy"),
        );
        return None;
    };
    let Some(private) = table.private() else {
        p.add(
            &format!("{path}.table"),
            format!("{name} is public: a synopsis is for a private table"),
        );
        return None;
    };
    if private.unit_path.is_some() {
        p.add(
            &format!("{path}.table"),
            format!(
                "{name} finds its privacy unit through a unit path; a synopsis needs a table with a privacy unit column or a row-level one"
            ),
        );
        return None;
    }
    let rows = match private.privacy_unit {
        Some(_) => private
            .max_groups_per_unit
            .saturating_mul(private.max_rows_per_unit),
        None => 1,
    };
    Some((table, rows))
}

/// The synopsis's columns with their public values: each declared, exhaustive, not the privacy
/// unit, named once.
fn synopsis_columns(
    p: &mut Problems,
    path: &str,
    raw: &[String],
    table: &Table,
) -> Vec<(String, Vec<String>)> {
    if raw.is_empty() {
        p.add(
            &format!("{path}.columns"),
            "at least one column is required",
        );
    }
    let unit = table.private().and_then(|t| t.privacy_unit.as_deref());
    let mut columns: Vec<(String, Vec<String>)> = Vec::new();
    for (i, name) in raw.iter().enumerate() {
        let cpath = format!("{path}.columns[{i}]");
        let name = name.to_ascii_lowercase();
        let Some(column) = table.column(&name) else {
            p.add(
                &cpath,
                format!(
                    "{name} is not a declared column of {}",
                    table.qualified_name()
                ),
            );
            continue;
        };
        if Some(name.as_str()) == unit {
            p.add(&cpath, format!("{name} is the privacy unit"));
            continue;
        }
        if columns.iter().any(|(c, _)| *c == name) {
            p.add(&cpath, "named twice");
            continue;
        }
        match (&column.public_values, column.exhaustive) {
            (Some(values), true) => columns.push((name, values.clone())),
            _ => p.add(
                &cpath,
                format!(
                    "{name} needs public_values and exhaustive: true in {}: a synopsis's cells must hold every row",
                    table.qualified_name()
                ),
            ),
        }
    }
    columns
}
