//! The `-- key: value` case files of the golden corpora (`tests/cases/*.case`, `*.explain`):
//! comment lines (`#`), a header of the `#` lines at the very top of a file, and cases that each
//! start with `-- name:`. Each corpus reads its own keys from a case's fields.

use std::path::{Path, PathBuf};

/// One case as written: where it starts, the `#` lines before it, the keys every corpus has
/// (`name`, `note` lines, `sql` lines joined with a space) and its other `key: value` fields in
/// order.
pub struct RawCase {
    pub line: usize,
    pub comments: Vec<String>,
    pub name: String,
    pub notes: Vec<String>,
    pub sql: String,
    pub fields: Vec<(String, String)>,
}

/// A case file: its header and its cases.
pub struct RawFile {
    pub path: PathBuf,
    pub header: Vec<String>,
    pub cases: Vec<RawCase>,
}

/// The files of `tests/cases` with extension `ext`, sorted.
pub fn paths(ext: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cases");
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("tests/cases exists")
        .map(|e| e.expect("readable directory entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == ext))
        .collect();
    paths.sort();
    paths
}

/// Reads a case file; panics with the file and line on a malformed line.
pub fn read(path: &Path) -> RawFile {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let mut header = Vec::new();
    let mut cases: Vec<RawCase> = Vec::new();
    let mut pending = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim_end();
        if line.is_empty() {
            continue;
        }
        if line.starts_with('#') {
            // Header comments are the `#` lines at the very top of a file, before any blank line.
            if cases.is_empty() && pending.is_empty() && header.len() == i {
                header.push(line.to_string());
            } else {
                pending.push(line.to_string());
            }
            continue;
        }
        let (key, value) = line
            .strip_prefix("-- ")
            .and_then(|rest| rest.split_once(':'))
            .unwrap_or_else(|| {
                panic!(
                    "{}:{}: expected `-- key: value` or `# comment`",
                    path.display(),
                    i + 1
                )
            });
        let value = value.strip_prefix(' ').unwrap_or(value).to_string();
        if key == "name" {
            cases.push(RawCase {
                line: i + 1,
                comments: std::mem::take(&mut pending),
                name: value,
                notes: Vec::new(),
                sql: String::new(),
                fields: Vec::new(),
            });
            continue;
        }
        let case = cases
            .last_mut()
            .unwrap_or_else(|| panic!("{}:{}: `{key}:` before `name:`", path.display(), i + 1));
        match key {
            "note" => case.notes.push(value),
            "sql" => {
                if !case.sql.is_empty() {
                    case.sql.push(' ');
                }
                case.sql.push_str(&value);
            }
            _ => case.fields.push((key.to_string(), value)),
        }
    }
    let mut names: Vec<&str> = cases.iter().map(|c| c.name.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(
        names.len(),
        cases.len(),
        "{}: duplicate case names",
        path.display()
    );
    RawFile {
        path: path.to_path_buf(),
        header,
        cases,
    }
}

/// The header (before the first case) and a case's leading lines (`#` comments, `name`, `note`s,
/// `sql`) as [`read`] reads them back.
pub fn render_start(
    out: &mut String,
    header: &[String],
    comments: &[String],
    (name, notes, sql): (&str, &[String], &str),
) {
    use std::fmt::Write as _;
    if out.is_empty() {
        for h in header {
            let _ = writeln!(out, "{h}");
        }
    }
    if !out.is_empty() {
        out.push('\n');
    }
    for c in comments {
        let _ = writeln!(out, "{c}");
    }
    let _ = writeln!(out, "-- name: {name}");
    for n in notes {
        let _ = writeln!(out, "-- note: {n}");
    }
    let _ = writeln!(out, "-- sql: {sql}");
}
