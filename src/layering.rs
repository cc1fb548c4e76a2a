//! The architecture as a test: the top-level modules form layers, and a module may use only the
//! layers below it (`crate::…` paths in its source), so no two modules import each other and the
//! tooling stays apart from the proxy. Reads the source tree; runs only in tests.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The layers, bottom first. `tools` sits beside the proxy: nothing else may use it.
const LAYERS: &[&str] = &[
    "limits", "memo", "error", "output", "datetime", "literal", "dsn", "policy", "budget",
    "metrics", "dp", "upstream", "session", "frontend", "server",
];

/// Names the crate root re-exports from a lower layer (`crate::Error`, `crate::Result`).
const ROOT_ITEMS: &[(&str, &str)] = &[("Error", "error"), ("Result", "error")];

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).expect("src is readable");
    for entry in entries {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a file of `src/` belongs to (`None` for the crate root and `main.rs`).
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let relative = file.strip_prefix(src).ok()?;
    let first = relative.components().next()?.as_os_str().to_str()?;
    let name = first.strip_suffix(".rs").unwrap_or(first);
    (!matches!(name, "lib" | "main" | "layering")).then(|| name.to_string())
}

/// `text` without its test-only items: each item after a `#[cfg(test)]` line (a `mod tests;`
/// line, or an item up to the line where its braces close), so that code after a test module
/// or a test-only helper is still read.
fn without_tests(text: &str) -> String {
    let mut out = String::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        if line.trim() != "#[cfg(test)]" {
            out.push_str(line);
            out.push('\n');
            continue;
        }
        // Skip the item the attribute applies to (and any attributes before it).
        let mut depth: i64 = 0;
        let mut opened = false;
        for item in lines.by_ref() {
            let code = item.split("//").next().unwrap_or("");
            for c in code.chars() {
                match c {
                    '{' => {
                        depth += 1;
                        opened = true;
                    }
                    '}' => depth -= 1,
                    _ => {}
                }
            }
            let attribute = item.trim_start().starts_with("#[");
            if !attribute && depth <= 0 && (opened || code.trim_end().ends_with(';')) {
                break;
            }
        }
    }
    out
}

/// The top-level modules a source text uses through `crate::` paths, outside its test-only
/// items ([`without_tests`]) and comments.
fn uses(text: &str) -> Vec<String> {
    let code = without_tests(text);
    let mut found = Vec::new();
    for line in code.lines() {
        let line = line.split("//").next().unwrap_or("");
        let mut rest = line;
        while let Some(at) = rest.find("crate::") {
            rest = &rest[at + "crate::".len()..];
            let braced = rest.starts_with('{');
            let names: Vec<&str> = if braced {
                let inner = rest[1..].split('}').next().unwrap_or("");
                inner.split(',').map(str::trim).collect()
            } else {
                vec![rest]
            };
            for name in names {
                let head: String = name
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                let module = ROOT_ITEMS
                    .iter()
                    .find(|(item, _)| *item == head)
                    .map_or(head.clone(), |(_, m)| m.to_string());
                if !module.is_empty() {
                    found.push(module);
                }
            }
        }
    }
    found
}

#[test]
fn modules_use_only_the_layers_below_them() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let rank: BTreeMap<&str, usize> = LAYERS.iter().enumerate().map(|(i, m)| (*m, i)).collect();
    let mut violations = Vec::new();
    for file in &files {
        let Some(module) = module_of(&src, file) else {
            continue;
        };
        // A folder's `tests.rs` is test code, like a `#[cfg(test)]` module: it may drive a module
        // through the layers above it (analysis tests classify SQL first, as the session does).
        if file.file_name().is_some_and(|n| n == "tests.rs") {
            continue;
        }
        let text = std::fs::read_to_string(file).expect("source is readable");
        for used in uses(&text) {
            if used == module {
                continue;
            }
            let allowed = match (rank.get(module.as_str()), rank.get(used.as_str())) {
                // tools may use the proxy's modules; nothing in the proxy may use tools.
                _ if module == "tools" => used != "tools",
                (Some(from), Some(to)) => to < from,
                _ => false,
            };
            if !allowed {
                violations.push(format!("{}: {module} uses {used}", file.display()));
            }
        }
    }
    violations.sort();
    violations.dedup();
    assert!(
        violations.is_empty(),
        "layering violations:\n{}",
        violations.join("\n")
    );
}

#[test]
fn every_top_level_module_has_a_layer() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    for file in &files {
        if let Some(module) = module_of(&src, file) {
            assert!(
                LAYERS.contains(&module.as_str()) || module == "tools",
                "{module} ({}) is in no layer: add it to LAYERS",
                file.display()
            );
        }
    }
}

#[test]
fn code_after_a_test_item_is_still_read() {
    let text = "use crate::policy::X;\n#[cfg(test)]\nmod tests {\n    use crate::server::Y;\n    fn f() {\n    }\n}\n\nfn g() { crate::session::z(); }\n#[cfg(test)]\nmod more;\n#[cfg(test)]\n#[allow(dead_code)]\nfn helper() -> u8 {\n    crate::frontend::w()\n}\nuse crate::budget::V;\n";
    assert_eq!(uses(text), vec!["policy", "session", "budget"]);
}

/// The core's directories whose functions and files stay short enough to read as a reviewer
/// would: the privacy pipeline, the session's stages and the accounting.
const SHORT_CODE_DIRS: &[&str] = &["dp", "session", "budget"];

/// The most lines a function outside tests may span in [`SHORT_CODE_DIRS`], from its `fn` line
/// to its closing brace.
const FUNCTION_LINES_MAX: usize = 120;

/// The most lines a file of [`SHORT_CODE_DIRS`] may have before its tests.
const FILE_LINES_MAX: usize = 1_000;

/// The functions of rustfmt-formatted `code` (test items removed) with the lines each spans:
/// from its `fn` line to the line that closes it at the same indentation. Declarations without
/// a body and one-line functions are left out.
fn function_spans(code: &str) -> Vec<(String, usize)> {
    let lines: Vec<&str> = code.lines().collect();
    let mut spans = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let trimmed = line.trim_start();
        let indent = &line[..line.len() - trimmed.len()];
        let mut words = trimmed.split_whitespace().peekable();
        while let Some(word) = words.next_if(|w| {
            matches!(*w, "pub" | "async" | "const" | "unsafe") || w.starts_with("pub(")
        }) {
            if word == "pub(in" {
                words.next();
            }
        }
        if words.next() != Some("fn") {
            continue;
        }
        let name: String = words
            .next()
            .unwrap_or("")
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        // The end of the signature: a body opens, or a declaration ends.
        let Some(opens) = (i..lines.len()).find(|&j| {
            let l = lines[j].trim_end();
            l.ends_with('{') || l.ends_with(';') || l.ends_with('}')
        }) else {
            continue;
        };
        if !lines[opens].trim_end().ends_with('{') {
            continue;
        }
        let close = format!("{indent}}}");
        if let Some(end) = (opens + 1..lines.len()).find(|&j| lines[j] == close) {
            spans.push((name, end - i));
        }
    }
    spans
}

#[test]
fn core_functions_and_files_stay_short() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut long = Vec::new();
    for dir in SHORT_CODE_DIRS {
        let mut files = Vec::new();
        sources(&src.join(dir), &mut files);
        assert!(!files.is_empty(), "src/{dir} has no sources");
        for file in files {
            // Test-only files, like `#[cfg(test)]` items.
            if file
                .file_name()
                .is_some_and(|n| n == "tests.rs" || n == "testing.rs")
            {
                continue;
            }
            let text = std::fs::read_to_string(&file).expect("source is readable");
            // Before its tests: up to the first test-only item.
            let before_tests = text
                .lines()
                .take_while(|l| l.trim() != "#[cfg(test)]")
                .count();
            if before_tests > FILE_LINES_MAX {
                long.push(format!(
                    "{}: {before_tests} lines before its tests",
                    file.display()
                ));
            }
            for (name, lines) in function_spans(&without_tests(&text)) {
                if lines > FUNCTION_LINES_MAX {
                    long.push(format!("{}: fn {name} spans {lines} lines", file.display()));
                }
            }
        }
    }
    assert!(
        long.is_empty(),
        "split these (functions at most {FUNCTION_LINES_MAX} lines, files at most {FILE_LINES_MAX} before their tests):\n{}",
        long.join("\n")
    );
}

#[test]
fn function_spans_measure_bodies_only() {
    let code = "fn one() -> u8 { 1 }\n\ntrait T {\n    fn declared(&self) -> u8;\n}\n\npub(crate) async fn f(\n    a: u8,\n) -> u8 {\n    let b = a;\n    b\n}\n\nimpl X {\n    pub(in crate::dp) fn g(&self) {\n        if true {\n        }\n    }\n}\n";
    assert_eq!(
        function_spans(code),
        vec![("f".to_string(), 5), ("g".to_string(), 3)]
    );
}
