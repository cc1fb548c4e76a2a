//! SQL string literals, read and written the way PostgreSQL reads them: shared by the statement
//! classifier, analysis, the rewrite and the catalog check. No I/O.
//!
//! Invariant: every literal pgdp writes into SQL it sends is dollar-quoted with a tag that does not
//! occur in the value, so the upstream reads exactly the value pgdp analysed, whatever
//! `standard_conforming_strings` says.

use sqlparser::ast;

/// A dollar-quoted string literal holding exactly `value`, with a tag that does not occur in it.
/// PostgreSQL reads dollar-quoted strings literally (no escapes, whatever
/// `standard_conforming_strings` says), so the value pgdp analysed is the value the upstream sees.
pub fn dollar_quoted(value: &str) -> ast::Value {
    let mut n = 0u32;
    let tag = loop {
        let tag = format!("__dp_s{n}");
        // The first closing delimiter after the opening one must be the one pgdp writes.
        let closing = format!("${tag}$");
        if format!("{value}{closing}").find(&closing) == Some(value.len()) {
            break tag;
        }
        n += 1;
    };
    ast::Value::DollarQuotedString(ast::DollarQuotedString {
        value: value.to_string(),
        tag: Some(tag),
    })
}

/// The text of a string literal of any quoting style.
pub fn string_value(v: &ast::Value) -> Option<&str> {
    match v {
        ast::Value::SingleQuotedString(s)
        | ast::Value::EscapedStringLiteral(s)
        | ast::Value::NationalStringLiteral(s)
        | ast::Value::DoubleQuotedString(s) => Some(s),
        ast::Value::DollarQuotedString(d) => Some(&d.value),
        _ => None,
    }
}
