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

/// SQL text for a message to the analyst: each literal pgdp dollar-quoted (`$__dp_s0$…$__dp_s0$`)
/// is shown single-quoted, as analysts write it. Display only: never sent upstream.
pub fn for_display(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len());
    let mut rest = sql;
    while let Some(start) = rest.find("$__dp_s") {
        let after = &rest[start + 1..];
        let Some(tag_len) = after.find('$') else {
            break;
        };
        let closing = &rest[start..start + tag_len + 2];
        let body_start = start + tag_len + 2;
        let Some(body_len) = rest[body_start..].find(closing) else {
            break;
        };
        out.push_str(&rest[..start]);
        out.push('\'');
        out.push_str(&rest[body_start..body_start + body_len].replace('\'', "''"));
        out.push('\'');
        rest = &rest[body_start + body_len + closing.len()..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dollar_quoted_literals_display_single_quoted() {
        let quoted = ast::Value::DollarQuotedString(ast::DollarQuotedString {
            value: "it's".into(),
            tag: Some("__dp_s0".into()),
        });
        let sql = format!("d - DATE {quoted} AND x = {quoted}");
        assert_eq!(for_display(&sql), "d - DATE 'it''s' AND x = 'it''s'");
        assert_eq!(for_display("a $__dp_s0$ unclosed"), "a $__dp_s0$ unclosed");
        assert_eq!(for_display("plain"), "plain");
    }
}
