//! README.md's psql transcripts are one real session (issue 46).
//!
//! A transcript is a code block of README.md whose first line is psql's prompt `pgdp_demo=> `;
//! a statement is a prompt line and the `pgdp_demo-> ` lines after it, the rest is what psql
//! printed for it. [`transcripts_are_one_real_session`] runs the statements of every transcript,
//! in the README's order, through the real `psql` in one session against an in-process pgdp with
//! the demo policy as shipped (`policies/demo.yaml`), a fresh ledger and the demo data, and
//! compares what psql printed (standard output and error, in the order psql wrote them) with the
//! blocks.
//!
//! What a block shows of psql's output is decided by rules applied here, never by hand:
//! - empty lines and trailing spaces are left out;
//! - a result of more than [`ROWS_MAX`] rows shows its first [`ROWS_SHOWN`] rows, then `…`;
//! - EXPLAIN's rows are shown without psql's `QUERY PLAN` header and row count (its lines are
//!   wider than a screen), up to the [`UPSTREAM_SQL_LINES_SHOWN`]th line of the upstream SQL,
//!   then `…`.
//!
//! The comparison masks what differs from run to run or after any change to the noise: the
//! numbers in a result's rows (noisy values, the budget of `SHOW pgdp.budget`), the numbers in
//! a NOTICE and its DETAIL and HINT lines (the budget left, "room for about N more", and
//! whatever a NOTICE estimates from noisy values), and the column widths psql derives from them.
//! Partition selection's noisy counts differ between runs even with a fixed noise seed, so this
//! is needed, not only tidy. Everything else must match: each statement's command tag, NOTICE
//! wording, errors and their hints (numbers included), column names, row counts, EXPLAIN's text.
//!
//! `PGDP_BLESS=1 cargo test --locked --test integration readme::` rewrites the blocks from the
//! session's output (the statements stay as written, and so does the output of a statement that
//! differs only in masked numbers): that is how they are made after a change to pgdp's messages,
//! the demo policy or the transcripts' statements.
//!
//! Nothing here prints to stdout.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::io::AsyncWriteExt;

use crate::support::{Proxy, ANALYST, DATABASE, PASSWORD};

/// psql's prompt for the demo analyst (not a superuser) on the demo database, and its
/// continuation prompt.
const PROMPT: &str = "pgdp_demo=> ";
const CONTINUATION: &str = "pgdp_demo-> ";

/// A result with more rows than this is trimmed to its first [`ROWS_SHOWN`].
const ROWS_MAX: usize = 5;
const ROWS_SHOWN: usize = 3;

/// How many lines of EXPLAIN's upstream SQL a transcript shows.
const UPSTREAM_SQL_LINES_SHOWN: usize = 3;

/// Where a transcript leaves rows out.
const ELLIPSIS: &str = " …";

/// What the script echoes before each statement, to cut psql's output into statements.
const MARKER: &str = "@@pgdp-readme-statement ";

/// How long the whole session may take.
const SESSION_TIMEOUT: Duration = Duration::from_secs(180);

const BLESS_ENV: &str = "PGDP_BLESS";

fn readme_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")
}

/// One statement of a transcript and what the block shows psql printed for it.
#[derive(Debug, Clone)]
struct Statement {
    /// The statement's lines, without the prompts.
    sql: Vec<String>,
    output: Vec<String>,
}

/// A transcript: the README's lines `first..end` (the block's content, between its fences).
#[derive(Debug)]
struct Block {
    first: usize,
    end: usize,
    statements: Vec<Statement>,
}

/// The transcripts of `text`, in order.
fn transcripts(text: &str) -> Vec<Block> {
    let lines: Vec<&str> = text.lines().collect();
    let mut blocks = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        if !lines[i].starts_with("```") {
            i += 1;
            continue;
        }
        let first = i + 1;
        let end = (first..lines.len())
            .find(|&j| lines[j].trim_end() == "```")
            .unwrap_or_else(|| panic!("README.md:{}: a code block without its end", i + 1));
        if lines[first..end]
            .first()
            .is_some_and(|l| l.starts_with(PROMPT))
        {
            blocks.push(Block {
                first,
                end,
                statements: statements(&lines[first..end]),
            });
        }
        i = end + 1;
    }
    blocks
}

/// Splits a transcript's lines into statements.
fn statements(lines: &[&str]) -> Vec<Statement> {
    let mut statements: Vec<Statement> = Vec::new();
    for line in lines {
        if let Some(sql) = line.strip_prefix(PROMPT) {
            statements.push(Statement {
                sql: vec![sql.to_string()],
                output: Vec::new(),
            });
            continue;
        }
        let last = statements
            .last_mut()
            .expect("a transcript starts with a prompt");
        match line.strip_prefix(CONTINUATION) {
            Some(sql) if last.output.is_empty() => last.sql.push(sql.to_string()),
            _ => last.output.push(line.to_string()),
        }
    }
    statements
}

/// Runs `statements` through psql in one session and returns what it printed for each, by the
/// rules of [`render`].
async fn run_session(proxy: &Proxy, statements: &[&Statement]) -> Vec<Vec<String>> {
    let mut script = String::new();
    for (i, statement) in statements.iter().enumerate() {
        script.push_str(&format!("\\echo {MARKER}{i}\n"));
        for line in &statement.sql {
            script.push_str(line);
            script.push('\n');
        }
    }
    let port = proxy.port().to_string();
    // Standard output and error on one pipe, so that each NOTICE and ERROR stays where psql
    // printed it between the rows (psql flushes its output before each message).
    let mut child = tokio::process::Command::new("sh")
        .args(["-c", "exec psql \"$@\" 2>&1", "psql"])
        .args(["-X", "-h", "127.0.0.1", "-p", &port, "-U", ANALYST])
        .args(["-d", DATABASE])
        .env("PGPASSWORD", PASSWORD)
        .env("PGCONNECT_TIMEOUT", "10")
        .env("LC_ALL", "C")
        .env_remove("PGSERVICE")
        .env_remove("PGOPTIONS")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("psql runs");
    let mut stdin = child.stdin.take().expect("psql's stdin");
    stdin
        .write_all(script.as_bytes())
        .await
        .expect("the script reaches psql");
    drop(stdin);
    let output = tokio::time::timeout(SESSION_TIMEOUT, child.wait_with_output())
        .await
        .expect("psql finished in time")
        .expect("psql's output");
    let printed = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "psql failed ({:?}):\n{printed}{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );

    let mut outputs: Vec<Vec<String>> = Vec::new();
    let mut before_first = Vec::new();
    for line in printed.lines() {
        if let Some(i) = line.strip_prefix(MARKER) {
            assert_eq!(i, outputs.len().to_string(), "markers out of order");
            outputs.push(Vec::new());
            continue;
        }
        match outputs.last_mut() {
            Some(current) => current.push(line.to_string()),
            None => before_first.push(line),
        }
    }
    assert!(
        before_first.iter().all(|l| l.is_empty()),
        "psql printed before the first statement:\n{}",
        before_first.join("\n")
    );
    assert_eq!(outputs.len(), statements.len(), "psql's output:\n{printed}");
    outputs.iter().map(|raw| render(raw)).collect()
}

/// psql's output for one statement as a transcript shows it (the module's rules).
fn render(raw: &[String]) -> Vec<String> {
    let lines: Vec<&str> = raw
        .iter()
        .map(|l| without_location(l).trim_end())
        .filter(|l| !l.is_empty())
        .collect();
    let mut shown = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        if !lines.get(i + 1).is_some_and(|l| is_rule(l)) {
            shown.push(lines[i].to_string());
            i += 1;
            continue;
        }
        // A result: header, rule, rows, then the row count.
        let end = (i + 2..lines.len())
            .find(|&j| is_row_count(lines[j]))
            .unwrap_or(lines.len());
        let rows = &lines[i + 2..end];
        if lines[i].trim() == "QUERY PLAN" {
            let upstream = rows.iter().position(|r| r.trim() == "upstream SQL:");
            let keep = upstream.map_or(rows.len(), |u| u + 1 + UPSTREAM_SQL_LINES_SHOWN);
            shown.extend(rows.iter().take(keep).map(|r| r.to_string()));
            if rows.len() > keep {
                shown.push(ELLIPSIS.to_string());
            }
        } else {
            shown.push(lines[i].to_string());
            shown.push(lines[i + 1].to_string());
            if rows.len() > ROWS_MAX {
                shown.extend(rows[..ROWS_SHOWN].iter().map(|r| r.to_string()));
                shown.push(ELLIPSIS.to_string());
            } else {
                shown.extend(rows.iter().map(|r| r.to_string()));
            }
            shown.extend(lines.get(end).map(|r| r.to_string()));
        }
        i = end + 1;
    }
    shown
}

/// A line without the `psql:<stdin>:12: ` psql puts before messages when reading a script
/// (interactive psql prints none).
fn without_location(line: &str) -> &str {
    line.strip_prefix("psql:<stdin>:")
        .and_then(|rest| rest.split_once(": "))
        .filter(|(number, _)| number.bytes().all(|b| b.is_ascii_digit()))
        .map_or(line, |(_, message)| message)
}

/// psql's line under a result's header: `-----+-----`.
fn is_rule(line: &str) -> bool {
    line.starts_with('-') && line.chars().all(|c| c == '-' || c == '+')
}

/// psql's `(3 rows)` under a result.
fn is_row_count(line: &str) -> bool {
    line.starts_with('(') && (line.ends_with(" row)") || line.ends_with(" rows)"))
}

/// A statement's shown output with what may differ between runs masked: numbers in a result's
/// rows and in a NOTICE (with its DETAIL and HINT lines), and runs of spaces and dashes (column
/// widths).
fn masked(output: &[String]) -> Vec<String> {
    let mut masked = Vec::new();
    let mut in_rows = false;
    let mut in_notice = false;
    for (i, line) in output.iter().enumerate() {
        let next_is_rule = output.get(i + 1).is_some_and(|l| is_rule(l));
        in_notice = line.starts_with("NOTICE:")
            || (in_notice && (line.starts_with("DETAIL:") || line.starts_with("HINT:")));
        let line = if in_notice {
            mask_numbers(line.trim_end())
        } else if is_rule(line) {
            in_rows = true;
            "-".to_string()
        } else if next_is_rule {
            squeezed(line)
        } else if in_rows && is_row_count(line) {
            in_rows = false;
            line.clone()
        } else if in_rows {
            squeezed(&mask_numbers(line))
        } else {
            line.trim_end().to_string()
        };
        masked.push(line);
    }
    masked
}

/// `line` with runs of whitespace made one space.
fn squeezed(line: &str) -> String {
    line.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// `line` with every number (`12`, `-0.5`, `4.9e-6`) replaced by `#`.
fn mask_numbers(line: &str) -> String {
    let chars: Vec<char> = line.chars().collect();
    let mut out = String::new();
    let mut i = 0;
    while i < chars.len() {
        let starts_number = chars[i].is_ascii_digit()
            || (chars[i] == '-'
                && chars.get(i + 1).is_some_and(char::is_ascii_digit)
                && !out.ends_with(|c: char| c.is_alphanumeric()));
        if !starts_number {
            out.push(chars[i]);
            i += 1;
            continue;
        }
        i += 1;
        while i < chars.len() {
            let c = chars[i];
            let exponent = (c == 'e' || c == 'E')
                && chars
                    .get(i + 1)
                    .is_some_and(|n| n.is_ascii_digit() || *n == '-' || *n == '+');
            let sign_of_exponent = (c == '-' || c == '+') && matches!(chars[i - 1], 'e' | 'E');
            let fraction = c == '.' && chars.get(i + 1).is_some_and(char::is_ascii_digit);
            if c.is_ascii_digit() || exponent || sign_of_exponent || fraction {
                i += 1;
            } else {
                break;
            }
        }
        out.push('#');
    }
    out
}

/// The block as the session printed it: its statements as written, each with the output of the
/// run, or with the output the block shows where the two differ only in what [`masked`] masks
/// (so that blessing does not churn the noisy numbers of unchanged statements).
fn blessed(block: &Block, outputs: &[Vec<String>]) -> Vec<String> {
    let mut lines = Vec::new();
    for (statement, real) in block.statements.iter().zip(outputs) {
        for (k, sql) in statement.sql.iter().enumerate() {
            let prompt = if k == 0 { PROMPT } else { CONTINUATION };
            lines.push(format!("{prompt}{sql}"));
        }
        let output = if masked(&statement.output) == masked(real) {
            &statement.output
        } else {
            real
        };
        lines.extend(output.iter().cloned());
    }
    lines
}

/// README.md's psql transcripts are what one psql session over the demo prints, up to the
/// numbers noise and the budget make differ; `PGDP_BLESS=1` rewrites them from the session.
#[tokio::test]
async fn transcripts_are_one_real_session() {
    let path = readme_path();
    let text = std::fs::read_to_string(&path).expect("README.md");
    let blocks = transcripts(&text);
    assert!(
        blocks.len() >= 5,
        "README.md has {} psql transcripts; expected the section's five or more",
        blocks.len()
    );
    let statements: Vec<&Statement> = blocks.iter().flat_map(|b| &b.statements).collect();

    let proxy = Proxy::with_policy(crate::support::shipped_policy(), 46).await;
    let outputs = run_session(&proxy, &statements).await;
    proxy.stop().await;

    let mut outputs = outputs.into_iter();
    let mut per_block: Vec<Vec<Vec<String>>> = Vec::new();
    for block in &blocks {
        per_block.push(outputs.by_ref().take(block.statements.len()).collect());
    }

    if std::env::var(BLESS_ENV).is_ok_and(|v| v == "1") {
        let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
        // From the last block up, so that the earlier blocks' line numbers stay valid.
        for (block, outputs) in blocks.iter().zip(&per_block).rev() {
            lines.splice(block.first..block.end, blessed(block, outputs));
        }
        let mut new_text = lines.join("\n");
        new_text.push('\n');
        if new_text != text {
            // Renamed into place, so that the tests reading README.md at the same time never
            // see half of it.
            let partial = path.with_extension("md.blessing");
            std::fs::write(&partial, &new_text).expect("write README.md.blessing");
            std::fs::rename(&partial, &path).expect("rename README.md.blessing to README.md");
        }
        return;
    }

    let mut differences = Vec::new();
    for (block, outputs) in blocks.iter().zip(&per_block) {
        for (statement, real) in block.statements.iter().zip(outputs) {
            if masked(&statement.output) != masked(real) {
                differences.push(format!(
                    "README.md:{} {}\n  README shows:\n    {}\n  psql printed:\n    {}",
                    block.first + 1,
                    statement.sql.join(" "),
                    statement.output.join("\n    "),
                    real.join("\n    ")
                ));
            }
        }
    }
    assert!(
        differences.is_empty(),
        "README.md's transcripts are not what a session prints \
         (PGDP_BLESS=1 cargo test --locked --test integration readme:: rewrites them):\n{}",
        differences.join("\n")
    );
}

#[test]
fn numbers_are_masked_and_words_kept() {
    assert_eq!(
        mask_numbers(" CE     | 17793 | 28217.394676271302"),
        " CE     | # | #"
    );
    assert_eq!(mask_numbers("4.9e-6 of 1e-7, -3 J06"), "# of #, # J#");
    assert_eq!(
        mask_numbers("room for about 844 more."),
        "room for about # more."
    );
}

#[test]
fn notices_are_masked_and_errors_kept() {
    let output: Vec<String> = [
        "NOTICE:  pgdp: charged epsilon=0.1; remaining epsilon=9.9 of 10",
        "DETAIL:  about 12 rows removed",
        "ERROR:  exceeds the per-query cap of 2",
        "HINT:  Choose an epsilon of at most 2.",
    ]
    .iter()
    .map(|l| l.to_string())
    .collect();
    assert_eq!(
        masked(&output),
        [
            "NOTICE:  pgdp: charged epsilon=#; remaining epsilon=# of #",
            "DETAIL:  about # rows removed",
            "ERROR:  exceeds the per-query cap of 2",
            "HINT:  Choose an epsilon of at most 2.",
        ]
    );
}

#[test]
fn a_long_result_shows_its_first_rows() {
    let raw: Vec<String> = [
        "psql:<stdin>:3: NOTICE:  pgdp: charged epsilon=0.1",
        " n ",
        "---",
        " 1",
        " 2",
        " 3",
        " 4",
        " 5",
        " 6",
        "(6 rows)",
        "",
    ]
    .iter()
    .map(|l| l.to_string())
    .collect();
    assert_eq!(
        render(&raw),
        [
            "NOTICE:  pgdp: charged epsilon=0.1",
            " n",
            "---",
            " 1",
            " 2",
            " 3",
            " …",
            "(6 rows)"
        ]
    );
}
