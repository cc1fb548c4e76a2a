//! Statement kinds, from the sqlparser AST.
//!
//! [`classify`] parses one message's SQL text and sorts each statement into a [`Statement`]: a
//! session statement pgdp answers itself, a query for the analyzer, an `EXPLAIN` of one, or a
//! cursor statement (`DECLARE … CURSOR FOR <query>`, `FETCH`/`MOVE` forward, `CLOSE`).
//! Everything else is refused here, before anything reaches the upstream.
//!
//! Invariants:
//! - A message is accepted or refused as a whole: if any statement in it is refused, none runs
//!   (no smuggling of a forbidden statement behind an allowed one).
//! - Only statements whose every part pgdp understands come out; the upstream never receives the
//!   analyst's text, only SQL that pgdp regenerates from its own AST.
//! - Parsing is bounded by [`limits::SQL_BYTES_MAX`], [`limits::PARSER_DEPTH_MAX`] and
//!   [`limits::STATEMENTS_PER_MESSAGE_MAX`].

use sqlparser::ast::{self, Statement as Ast};
use sqlparser::dialect::PostgreSqlDialect;
use sqlparser::parser::Parser;

use crate::error::{Error, Result};
use crate::limits;
use crate::literal::dollar_quoted;

/// A classified statement.
#[derive(Debug, Clone, PartialEq)]
pub enum Statement {
    /// `BEGIN`, `START TRANSACTION`.
    Begin,
    /// `COMMIT`, `END`.
    Commit,
    /// `ROLLBACK`, `ABORT`.
    Rollback,
    /// `SAVEPOINT name` (lower-cased unless quoted).
    Savepoint { name: String },
    /// `RELEASE [SAVEPOINT] name`.
    ReleaseSavepoint { name: String },
    /// `ROLLBACK TO [SAVEPOINT] name`.
    RollbackToSavepoint { name: String },
    /// `SET name = value` / `SET name TO value` / `SET TIME ZONE value`. The name is lower-cased;
    /// the value is the literal text (quotes removed). `local` is `SET LOCAL`.
    Set { name: String, value: String },
    /// `RESET name`.
    Reset { name: String },
    /// `SHOW name` (lower-cased, dotted names joined with `.`).
    Show { name: String },
    /// `DEALLOCATE [PREPARE] name | ALL`: frees a prepared statement of this connection.
    Deallocate { name: Option<String> },
    /// A query: a DP aggregate, a constant lookup, the budget view or a catalog query; which one
    /// is decided once, by [`crate::session::route`].
    Query(Box<ast::Query>),
    /// `EXPLAIN <query>` without ANALYZE.
    Explain(Box<ast::Query>),
    /// `DECLARE name [NO SCROLL] CURSOR [WITH HOLD | WITHOUT HOLD] FOR <query>` (name lower-cased
    /// unless quoted).
    DeclareCursor {
        name: String,
        hold: bool,
        query: Box<ast::Query>,
    },
    /// `FETCH` or `MOVE` forward: `count` rows, or all remaining rows when `None`.
    Fetch {
        name: String,
        count: Option<u64>,
        move_only: bool,
    },
    /// `CLOSE name`, or `CLOSE ALL` when `name` is `None`.
    CloseCursor { name: Option<String> },
}

impl Statement {
    /// A short kind for logs (never contains analyst values).
    pub fn kind(&self) -> &'static str {
        match self {
            Statement::Begin => "begin",
            Statement::Commit => "commit",
            Statement::Rollback => "rollback",
            Statement::Savepoint { .. } => "savepoint",
            Statement::ReleaseSavepoint { .. } => "release",
            Statement::RollbackToSavepoint { .. } => "rollback to savepoint",
            Statement::Set { .. } => "set",
            Statement::Reset { .. } => "reset",
            Statement::Show { .. } => "show",
            Statement::Deallocate { .. } => "deallocate",
            Statement::Query(_) => "query",
            Statement::Explain(_) => "explain",
            Statement::DeclareCursor { .. } => "declare",
            Statement::Fetch {
                move_only: false, ..
            } => "fetch",
            Statement::Fetch {
                move_only: true, ..
            } => "move",
            Statement::CloseCursor { .. } => "close",
        }
    }
}

/// Parses SQL text into statements (without classifying them).
pub fn parse(sql: &str) -> Result<Vec<Ast>> {
    if sql.len() > limits::SQL_BYTES_MAX {
        return Err(Error::LimitExceeded {
            what: "the SQL text length in bytes".into(),
            limit: limits::SQL_BYTES_MAX as u64,
        });
    }
    let dialect = PostgreSqlDialect {};
    let statements = Parser::new(&dialect)
        .with_recursion_limit(limits::PARSER_DEPTH_MAX)
        .try_with_sql(sql)
        .and_then(|mut p| p.parse_statements())
        .map_err(|e| match e {
            sqlparser::parser::ParserError::RecursionLimitExceeded => Error::LimitExceeded {
                what: "the nesting depth of the statement".into(),
                limit: limits::PARSER_DEPTH_MAX as u64,
            },
            other => syntax_error(sql, &other.to_string()),
        })?;
    if statements.len() > limits::STATEMENTS_PER_MESSAGE_MAX {
        return Err(Error::LimitExceeded {
            what: "the number of statements in one message".into(),
            limit: limits::STATEMENTS_PER_MESSAGE_MAX as u64,
        });
    }
    Ok(statements)
}

/// A parser error as PostgreSQL words it: sqlparser's `Expected: X, found: T at Line: L,
/// Column: C` becomes `syntax error at or near "T"` with T's character position in `sql` (or
/// `at end of input`), X as detail; any other message stays sqlparser's, lower-cased.
fn syntax_error(sql: &str, message: &str) -> Error {
    let message = strip_parser_prefix(message);
    let parsed = message
        .strip_prefix("expected: ")
        .and_then(|rest| rest.rsplit_once(", found: "))
        .and_then(|(expected, found)| {
            let (token, at) = found.rsplit_once(" at Line: ")?;
            let (line, column) = at.split_once(", Column: ")?;
            let line: usize = line.trim().parse().ok()?;
            let column: usize = column.trim().parse().ok()?;
            Some((expected.to_string(), token.to_string(), line, column))
        });
    let Some((expected, token, line, column)) = parsed else {
        // `found: EOF` has no line and column.
        if let Some(expected) = message
            .strip_prefix("expected: ")
            .and_then(|rest| rest.strip_suffix(", found: EOF"))
        {
            return Error::SyntaxAt {
                near: "end of input".into(),
                position: Some(sql.chars().count() + 1),
                expected: expected.to_string(),
            };
        }
        return Error::Syntax { message };
    };
    // Line and column count characters from 1; PostgreSQL's position counts characters of the
    // whole text from 1.
    let position = sql
        .split_inclusive('\n')
        .take(line.saturating_sub(1))
        .map(|l| l.chars().count())
        .sum::<usize>()
        + column;
    Error::SyntaxAt {
        near: format!("or near \"{token}\""),
        position: Some(position),
        expected,
    }
}

fn strip_parser_prefix(message: &str) -> String {
    let m = message
        .strip_prefix("sql parser error: ")
        .unwrap_or(message);
    // sqlparser capitalises some messages; PostgreSQL style is lower case.
    let mut chars = m.chars();
    match chars.next() {
        Some(c) => c.to_lowercase().collect::<String>() + chars.as_str(),
        None => String::new(),
    }
}

/// Parses and classifies all statements of one message. Refuses the whole message if any
/// statement is refused.
pub fn classify(sql: &str) -> Result<Vec<Statement>> {
    if let Some(fetch) = fetch_with_from(sql) {
        // sqlparser requires FROM or IN before the cursor name; PostgreSQL does not.
        return classify(&fetch);
    }
    if let Some(fetch) = move_as_fetch(sql) {
        // sqlparser has no MOVE; it is FETCH without the rows, so it is parsed as one.
        let mut statements = parse(&fetch)?
            .into_iter()
            .map(classify_statement)
            .collect::<Result<Vec<_>>>()?;
        if let [Statement::Fetch { move_only, .. }] = statements.as_mut_slice() {
            *move_only = true;
            return Ok(statements);
        }
        return Err(Error::Syntax {
            message: "MOVE must be sent on its own".into(),
        });
    }
    parse(sql)?.into_iter().map(classify_statement).collect()
}

/// `MOVE …` rewritten as `FETCH …`, if the text is a MOVE statement.
fn move_as_fetch(sql: &str) -> Option<String> {
    let trimmed = sql.trim_start();
    let (keyword, rest) = trimmed.split_at_checked(4)?;
    let separated = rest.starts_with(|c: char| c.is_whitespace());
    (keyword.eq_ignore_ascii_case("move") && separated).then(|| format!("FETCH{rest}"))
}

/// A lone `FETCH …`/`MOVE …` without `FROM`/`IN`, with `FROM` inserted before the cursor name
/// (its last word).
fn fetch_with_from(sql: &str) -> Option<String> {
    let text = sql.trim().trim_end_matches(';').trim_end();
    let words: Vec<&str> = text.split_whitespace().collect();
    let [first, .., name] = words.as_slice() else {
        return None;
    };
    let cursor_statement =
        first.eq_ignore_ascii_case("fetch") || first.eq_ignore_ascii_case("move");
    let has_from = words
        .iter()
        .any(|w| w.eq_ignore_ascii_case("from") || w.eq_ignore_ascii_case("in"));
    let simple = !text.contains(';') && !name.contains('"');
    (cursor_statement && !has_from && simple).then(|| {
        if words.len() == 2 {
            // `FETCH name`: sqlparser also wants a direction.
            return format!("{first} NEXT FROM {name}");
        }
        let head = &text[..text.len() - name.len()];
        format!("{head}FROM {name}")
    })
}

/// A cursor statement's name as PostgreSQL folds it: lower case unless quoted.
fn cursor_name(ident: &ast::Ident) -> String {
    if ident.quote_style.is_some() {
        ident.value.clone()
    } else {
        ident.value.to_lowercase()
    }
}

/// The count of a FETCH/MOVE direction: a non-negative integer literal.
fn fetch_count(value: &ast::ValueWithSpan) -> Result<u64> {
    match &value.value {
        ast::Value::Number(n, _) => n.parse::<u64>().map_err(|_| {
            Error::unsupported(
                "FETCH backward or with this count",
                "pgdp cursors scan forward only: FETCH n, NEXT, FORWARD n, ALL.",
            )
        }),
        _ => Err(Error::Syntax {
            message: "FETCH count must be an integer".into(),
        }),
    }
}

/// `DECLARE … CURSOR FOR <query>`: only forward-only, text-format cursors over a query.
fn classify_declare(stmts: Vec<ast::Declare>) -> Result<Statement> {
    let [declare] = <[ast::Declare; 1]>::try_from(stmts).map_err(|_| {
        Error::unsupported("DECLARE of several names", "Declare one cursor at a time.")
    })?;
    let not_a_cursor = || {
        Error::unsupported(
            "DECLARE of anything but a cursor",
            "Declare a cursor: DECLARE name CURSOR [WITH HOLD] FOR SELECT …",
        )
    };
    if !matches!(declare.declare_type, Some(ast::DeclareType::Cursor))
        || declare.data_type.is_some()
        || declare.assignment.is_some()
    {
        return Err(not_a_cursor());
    }
    let [name] = declare.names.as_slice() else {
        return Err(not_a_cursor());
    };
    if declare.binary == Some(true) {
        return Err(Error::unsupported(
            "BINARY cursors",
            "Declare the cursor without BINARY; drivers choose binary results per Execute.",
        ));
    }
    if declare.scroll == Some(true) {
        return Err(Error::unsupported(
            "SCROLL cursors",
            "pgdp cursors scan forward only: declare the cursor with NO SCROLL (or without SCROLL).",
        ));
    }
    let Some(mut query) = declare.for_query else {
        return Err(not_a_cursor());
    };
    neutralize_literals(&mut query);
    Ok(Statement::DeclareCursor {
        name: cursor_name(name),
        hold: declare.hold == Some(true),
        query,
    })
}

/// `FETCH [direction] [FROM | IN] name`, forward directions only.
fn classify_fetch(name: &ast::Ident, direction: &ast::FetchDirection) -> Result<Statement> {
    use ast::FetchDirection as D;
    let count = match direction {
        D::Next | D::Forward { limit: None } => Some(1),
        D::Count { limit } | D::Forward { limit: Some(limit) } => Some(fetch_count(limit)?),
        D::All | D::ForwardAll => None,
        D::Prior
        | D::First
        | D::Last
        | D::Absolute { .. }
        | D::Relative { .. }
        | D::Backward { .. }
        | D::BackwardAll => {
            return Err(Error::unsupported(
                format!("FETCH {direction}"),
                "pgdp cursors scan forward only: FETCH n, NEXT, FORWARD n, ALL.",
            ))
        }
    };
    if count == Some(0) {
        return Err(Error::unsupported(
            "FETCH 0 (re-fetching the current row)",
            "pgdp cursors scan forward only: FETCH n, NEXT, FORWARD n, ALL.",
        ));
    }
    Ok(Statement::Fetch {
        name: cursor_name(name),
        count,
        move_only: false,
    })
}

/// Rewrites every string literal of a query as a dollar-quoted string of the value sqlparser
/// parsed. sqlparser's own rendering of quotes after backslashes differs from PostgreSQL's
/// reading, which would let a literal end early upstream and smuggle SQL past the analysis.
pub fn neutralize_literals(query: &mut ast::Query) {
    let fix = |v: &mut ast::Value| {
        let text = match v {
            ast::Value::SingleQuotedString(s)
            | ast::Value::EscapedStringLiteral(s)
            | ast::Value::NationalStringLiteral(s) => Some(s.clone()),
            ast::Value::DollarQuotedString(d) => Some(d.value.clone()),
            _ => None,
        };
        if let Some(t) = text {
            *v = dollar_quoted(&t);
        }
    };
    let _ = ast::visit_expressions_mut(query, |e| {
        match e {
            ast::Expr::Value(v) => fix(&mut v.value),
            ast::Expr::TypedString(ts) => fix(&mut ts.value.value),
            _ => {}
        }
        std::ops::ControlFlow::<()>::Continue(())
    });
}

/// An identifier as PostgreSQL folds it: lower-cased unless quoted.
fn identifier_name(ident: &ast::Ident) -> String {
    if ident.quote_style.is_some() {
        ident.value.clone()
    } else {
        ident.value.to_lowercase()
    }
}

/// Classifies one parsed statement.
pub fn classify_statement(statement: Ast) -> Result<Statement> {
    match statement {
        Ast::Query(mut query) => {
            neutralize_literals(&mut query);
            Ok(Statement::Query(query))
        }
        Ast::StartTransaction { statements, exception, .. } => {
            if !statements.is_empty() || exception.is_some() {
                return Err(Error::unsupported(
                    "procedural BEGIN … END blocks",
                    "Send the statements one at a time, inside BEGIN; … COMMIT; if you need a transaction.",
                ));
            }
            Ok(Statement::Begin)
        }
        Ast::Commit { chain: false, .. } => Ok(Statement::Commit),
        Ast::Rollback { chain: false, savepoint: None } => Ok(Statement::Rollback),
        Ast::Rollback { chain: false, savepoint: Some(name) } => Ok(Statement::RollbackToSavepoint {
            name: identifier_name(&name),
        }),
        Ast::Savepoint { name } => Ok(Statement::Savepoint { name: identifier_name(&name) }),
        Ast::ReleaseSavepoint { name } => Ok(Statement::ReleaseSavepoint {
            name: identifier_name(&name),
        }),
        Ast::Commit { .. } | Ast::Rollback { .. } => Err(Error::unsupported(
            "transaction chaining and savepoints",
            "pgdp runs each statement on its own; use plain BEGIN / COMMIT / ROLLBACK.",
        )),
        Ast::Set(set) => classify_set(set),
        Ast::Reset(reset) => match reset.reset {
            ast::Reset::ALL => Err(Error::forbidden(
                "RESET ALL is not allowed through pgdp",
                "Reset parameters one at a time, e.g. RESET pgdp.epsilon.",
            )),
            ast::Reset::SessionAuthorization => Err(Error::forbidden(
                "changing the session authorization is not allowed through pgdp",
                "",
            )),
            ast::Reset::ConfigurationParameter(name) => {
                Ok(Statement::Reset { name: object_name_text(&name) })
            }
        },
        Ast::ShowVariable { variable } => {
            let parts: Vec<String> = variable.iter().map(|i| i.value.to_ascii_lowercase()).collect();
            // `SHOW pgdp.epsilon` arrives as two identifiers, `SHOW transaction isolation level`
            // as three words: custom parameters are the dotted ones.
            let name = if parts.len() == 2 && parts[0] == "pgdp" { parts.join(".") } else { parts.join(" ") };
            Ok(Statement::Show { name })
        }
        Ast::Deallocate { name, .. } => {
            let n = name.value.clone();
            Ok(Statement::Deallocate { name: (!n.eq_ignore_ascii_case("all")).then_some(n) })
        }
        Ast::Explain { analyze, statement, options, .. } => {
            let analyze_option = options.as_ref().is_some_and(|opts| {
                opts.iter().any(|o| o.name.value.eq_ignore_ascii_case("analyze"))
            });
            if analyze || analyze_option {
                return Err(Error::forbidden(
                    "EXPLAIN ANALYZE is not allowed through pgdp",
                    "Its timings and row counts depend on the data. Use EXPLAIN without ANALYZE to see the DP plan.",
                ));
            }
            match *statement {
                Ast::Query(mut query) => {
                    neutralize_literals(&mut query);
                    Ok(Statement::Explain(query))
                }
                _ => Err(Error::unsupported(
                    "EXPLAIN of anything but a query",
                    "EXPLAIN a SELECT to see its DP plan, cost and accuracy.",
                )),
            }
        }
        Ast::Insert(_) | Ast::Update(_) | Ast::Delete(_) | Ast::Merge(_) => {
            Err(Error::forbidden(
                "data modification is not allowed through pgdp",
                "pgdp is read-only: only aggregate SELECT queries are answered, with differential privacy.",
            ))
        }
        Ast::Copy { .. } | Ast::CopyIntoSnowflake { .. } => Err(Error::forbidden(
            "COPY is not allowed through pgdp",
            "Rows never leave pgdp one by one; use an aggregate SELECT.",
        )),
        Ast::Prepare { .. } | Ast::Execute { .. } => Err(Error::unsupported(
            "SQL-level PREPARE and EXECUTE",
            "Use your driver's prepared statements (the extended protocol) instead.",
        )),
        Ast::Declare { stmts } => classify_declare(stmts),
        Ast::Fetch { name, direction, into: None, .. } => classify_fetch(&name, &direction),
        Ast::Fetch { .. } => Err(Error::unsupported(
            "FETCH … INTO",
            "Fetch the rows to the client: FETCH 100 FROM my_cursor.",
        )),
        Ast::Close { cursor } => match cursor {
            ast::CloseCursor::All => Ok(Statement::CloseCursor { name: None }),
            ast::CloseCursor::Specific { name } => Ok(Statement::CloseCursor {
                name: Some(cursor_name(&name)),
            }),
        },
        Ast::Discard { .. } => Err(Error::forbidden(
            "DISCARD is not allowed through pgdp",
            "pgdp keeps no server-side state worth discarding; reconnect for a fresh session.",
        )),
        Ast::LISTEN { .. } | Ast::NOTIFY { .. } | Ast::UNLISTEN { .. } => Err(Error::forbidden(
            "LISTEN / NOTIFY is not allowed through pgdp",
            "",
        )),
        other => Err(refuse_other(&other)),
    }
}

/// The refusal for any statement kind pgdp does not handle.
fn refuse_other(statement: &Ast) -> Error {
    let text = statement.to_string();
    let keyword: String = text
        .split_whitespace()
        .take(2)
        .collect::<Vec<_>>()
        .join(" ")
        .to_ascii_uppercase();
    let is_ddl = [
        "CREATE", "DROP", "ALTER", "TRUNCATE", "GRANT", "REVOKE", "COMMENT", "VACUUM",
    ]
    .iter()
    .any(|k| keyword.starts_with(k));
    if is_ddl {
        Error::forbidden(
            format!("{keyword} is not allowed through pgdp"),
            "pgdp is read-only: only aggregate SELECT queries are answered, with differential privacy.",
        )
    } else {
        Error::unsupported(
            format!("the {keyword} statement"),
            "pgdp answers aggregate SELECT queries, EXPLAIN, SET/SHOW of session parameters and transaction control.",
        )
    }
}

fn classify_set(set: ast::Set) -> Result<Statement> {
    match set {
        ast::Set::SingleAssignment {
            variable,
            values,
            hivevar: false,
            ..
        } => {
            let name = object_name_text(&variable);
            let value = values
                .iter()
                .map(expr_setting_text)
                .collect::<Result<Vec<_>>>()?
                .join(", ");
            Ok(Statement::Set { name, value })
        }
        ast::Set::SetTimeZone { value, .. } => Ok(Statement::Set {
            name: "timezone".into(),
            value: match &value {
                ast::Expr::Interval(interval) => time_zone_of_interval(interval)?,
                other => expr_setting_text(other)?,
            },
        }),
        ast::Set::SetNames { charset_name, .. } => Ok(Statement::Set {
            name: "client_encoding".into(),
            value: charset_name.value,
        }),
        ast::Set::SetRole { .. } | ast::Set::SetSessionAuthorization(_) => Err(Error::forbidden(
            "changing the role or session authorization is not allowed through pgdp",
            "",
        )),
        ast::Set::SetTransaction { .. } => Ok(Statement::Set {
            // Every upstream statement runs in its own read-only transaction; the analyst's
            // transaction characteristics have no effect and are accepted as a no-op.
            name: "transaction".into(),
            value: String::new(),
        }),
        other => Err(Error::unsupported(
            format!("the statement {other}"),
            "Set a session parameter with SET name = value (SET pgdp.epsilon = 0.5, SET TimeZone = 'UTC').",
        )),
    }
}

/// `SET TIME ZONE INTERVAL '+05:30' HOUR TO MINUTE` (Sequelize sends it on every connection):
/// the fixed offset as PostgreSQL names it, a POSIX zone such as `<+05:30>-05:30` (`<+00>-00`
/// for UTC), which is what `SHOW TimeZone` then answers and what the upstream accepts.
fn time_zone_of_interval(interval: &ast::Interval) -> Result<String> {
    let refuse = || {
        Error::unsupported(
            format!("the time zone {interval}"),
            "Give the offset as INTERVAL '+05:30' HOUR TO MINUTE, INTERVAL '-8 hours', or a zone name: SET TIME ZONE 'UTC'.",
        )
    };
    let text = match interval.value.as_ref() {
        ast::Expr::Value(v) => match &v.value {
            ast::Value::SingleQuotedString(s) => s.trim().to_ascii_lowercase(),
            _ => return Err(refuse()),
        },
        _ => return Err(refuse()),
    };
    let (negative, body) = match text.strip_prefix('-') {
        Some(rest) => (true, rest.trim_start()),
        None => (false, text.strip_prefix('+').unwrap_or(&text).trim_start()),
    };
    let number = |t: &str| -> Result<i64> {
        if t.is_empty() || t.len() > 4 || !t.bytes().all(|b| b.is_ascii_digit()) {
            return Err(refuse());
        }
        t.parse().map_err(|_| refuse())
    };
    let unit_seconds = |field: Option<&ast::DateTimeField>| match field {
        None | Some(ast::DateTimeField::Hour) | Some(ast::DateTimeField::Hours) => Some(3600),
        Some(ast::DateTimeField::Minute) | Some(ast::DateTimeField::Minutes) => Some(60),
        Some(ast::DateTimeField::Second) | Some(ast::DateTimeField::Seconds) => Some(1),
        _ => None,
    };
    let seconds = if body.contains(':') {
        // `[+-]H:MM[:SS]`, whatever the fields say (PostgreSQL reads it as a time of day).
        let parts: Vec<&str> = body.split(':').collect();
        if parts.len() > 3 {
            return Err(refuse());
        }
        let mut seconds = 0;
        for (part, unit) in parts.iter().zip([3600, 60, 1]) {
            seconds += number(part)? * unit;
        }
        seconds
    } else if let Some((amount, unit)) = body.split_once(char::is_whitespace) {
        let unit = match unit.trim() {
            "hour" | "hours" | "h" => 3600,
            "minute" | "minutes" | "min" | "mins" => 60,
            _ => return Err(refuse()),
        };
        number(amount)? * unit
    } else {
        number(body)? * unit_seconds(interval.leading_field.as_ref()).ok_or_else(refuse)?
    };
    // PostgreSQL refuses offsets beyond 14 hours (22023).
    if seconds > 14 * 3600 {
        return Err(Error::InvalidParameter {
            name: "TimeZone".into(),
            reason: format!("{interval} is outside the range of time zone offsets"),
            hint: "Give an offset between -14:00 and +14:00.".into(),
        });
    }
    let (hours, minutes, secs) = (seconds / 3600, seconds / 60 % 60, seconds % 60);
    let mut magnitude = format!("{hours:02}");
    if minutes != 0 || secs != 0 {
        magnitude.push_str(&format!(":{minutes:02}"));
    }
    if secs != 0 {
        magnitude.push_str(&format!(":{secs:02}"));
    }
    let (east, west) = if negative && seconds != 0 {
        ('-', '+')
    } else {
        ('+', '-')
    };
    Ok(format!("<{east}{magnitude}>{west}{magnitude}"))
}

/// The dotted, lower-cased name of a configuration parameter.
fn object_name_text(name: &ast::ObjectName) -> String {
    name.0
        .iter()
        .map(|part| match part.as_ident() {
            Some(ident) => ident.value.to_ascii_lowercase(),
            None => part.to_string().to_ascii_lowercase(),
        })
        .collect::<Vec<_>>()
        .join(".")
}

/// The text of a SET value: a literal, an identifier or a keyword like DEFAULT / LOCAL.
fn expr_setting_text(expr: &ast::Expr) -> Result<String> {
    match expr {
        ast::Expr::Value(v) => match &v.value {
            ast::Value::SingleQuotedString(s)
            | ast::Value::DoubleQuotedString(s)
            | ast::Value::EscapedStringLiteral(s) => Ok(s.clone()),
            ast::Value::Number(n, _) => Ok(n.to_string()),
            ast::Value::Boolean(b) => Ok(b.to_string()),
            other => Ok(other.to_string()),
        },
        ast::Expr::Identifier(ident) => Ok(ident.value.clone()),
        ast::Expr::CompoundIdentifier(parts) => Ok(parts
            .iter()
            .map(|p| p.value.clone())
            .collect::<Vec<_>>()
            .join(".")),
        ast::Expr::UnaryOp {
            op: ast::UnaryOperator::Minus,
            expr,
        } => Ok(format!("-{}", expr_setting_text(expr)?)),
        ast::Expr::UnaryOp {
            op: ast::UnaryOperator::Plus,
            expr,
        } => expr_setting_text(expr),
        _ => Err(Error::unsupported(
            "expressions as SET values",
            "Give the value as a literal, e.g. SET pgdp.epsilon = 0.5.",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(sql: &str) -> String {
        match classify(sql) {
            Ok(s) => format!(
                "ok {}",
                s.iter().map(|s| s.kind()).collect::<Vec<_>>().join(",")
            ),
            Err(e) => e.sqlstate().code().to_string(),
        }
    }

    #[test]
    fn session_statements() {
        assert_eq!(code("BEGIN"), "ok begin");
        assert_eq!(code("start transaction read only"), "ok begin");
        assert_eq!(code("COMMIT; END"), "ok commit,commit");
        assert_eq!(code("ROLLBACK"), "ok rollback");
        assert_eq!(code("SET extra_float_digits = 3"), "ok set");
        assert_eq!(code("SHOW transaction isolation level"), "ok show");
        assert_eq!(
            classify("SHOW pgdp.epsilon").ok(),
            Some(vec![Statement::Show {
                name: "pgdp.epsilon".into()
            }])
        );
        assert_eq!(code("DEALLOCATE \"_PLAN0x1\""), "ok deallocate");
        assert_eq!(code("DEALLOCATE ALL"), "ok deallocate");
    }

    #[test]
    fn set_time_zone_interval_is_a_posix_offset() {
        let zone = |sql: &str| match classify(sql).expect("parses").pop() {
            Some(Statement::Set { value, .. }) => value,
            other => panic!("{sql}: {other:?}"),
        };
        // As `SHOW TimeZone` answers on PostgreSQL 15 after each.
        assert_eq!(
            zone("SET TIME ZONE INTERVAL '+00:00' HOUR TO MINUTE"),
            "<+00>-00"
        );
        assert_eq!(
            zone("SET TIME ZONE INTERVAL '+05:30' HOUR TO MINUTE"),
            "<+05:30>-05:30"
        );
        assert_eq!(
            zone("SET TIME ZONE INTERVAL '-08:00' HOUR TO MINUTE"),
            "<-08>+08"
        );
        assert_eq!(zone("SET TIME ZONE INTERVAL '-3 hours'"), "<-03>+03");
        assert_eq!(
            code("SET TIME ZONE INTERVAL '15:00' HOUR TO MINUTE"),
            "22023"
        );
        assert_eq!(code("SET TIME ZONE INTERVAL '1 fortnight'"), "0A000");
        // Sequelize's connection set-up, one string.
        assert_eq!(
            code("SET client_min_messages TO warning;SET TIME ZONE INTERVAL '+00:00' HOUR TO MINUTE;"),
            "ok set,set"
        );
    }

    #[test]
    fn set_values_are_literal_text() {
        let s =
            classify("SET pgdp.epsilon = 0.5; SET TIME ZONE 'UTC'; set application_name to psql")
                .expect("parses");
        assert_eq!(
            s[0],
            Statement::Set {
                name: "pgdp.epsilon".into(),
                value: "0.5".into()
            }
        );
        assert_eq!(
            s[1],
            Statement::Set {
                name: "timezone".into(),
                value: "UTC".into()
            }
        );
        assert_eq!(
            s[2],
            Statement::Set {
                name: "application_name".into(),
                value: "psql".into()
            }
        );
    }

    #[test]
    fn writes_and_ddl_are_forbidden() {
        assert_eq!(code("INSERT INTO demo.people VALUES (1)"), "42501");
        assert_eq!(code("UPDATE demo.people SET age = 1"), "42501");
        assert_eq!(code("DELETE FROM demo.people"), "42501");
        assert_eq!(code("DROP TABLE demo.people"), "42501");
        assert_eq!(code("CREATE TEMP TABLE t (a int)"), "42501");
        assert_eq!(code("COPY demo.people TO STDOUT"), "42501");
        assert_eq!(code("TRUNCATE demo.people"), "42501");
        assert_eq!(code("DISCARD ALL"), "42501");
        assert_eq!(code("RESET ALL"), "42501");
        assert_eq!(code("SET ROLE postgres"), "42501");
    }

    #[test]
    fn explain_analyze_is_forbidden() {
        assert_eq!(
            code("EXPLAIN SELECT COUNT(*) FROM demo.people"),
            "ok explain"
        );
        assert_eq!(
            code("EXPLAIN ANALYZE SELECT COUNT(*) FROM demo.people"),
            "42501"
        );
        assert_eq!(
            code("EXPLAIN (ANALYZE) SELECT COUNT(*) FROM demo.people"),
            "42501"
        );
    }

    #[test]
    fn one_bad_statement_refuses_the_message() {
        assert_eq!(code("SELECT 1; DROP TABLE demo.people"), "42501");
    }

    #[test]
    fn syntax_errors_read_as_postgresql_words_them() {
        let error = |sql: &str| match classify(sql) {
            Err(e) => (e.to_string(), e.position(), e.sqlstate().code().to_string()),
            Ok(_) => panic!("{sql} parsed"),
        };
        assert_eq!(
            error("SELEC COUNT(*) FROM demo.people"),
            (
                "syntax error at or near \"SELEC\"".to_string(),
                Some(1),
                "42601".to_string()
            )
        );
        assert_eq!(
            error("SELECT COUNT(*)\nFROM demo.people WHERE age > > 3"),
            (
                "syntax error at or near \">\"".to_string(),
                Some(46),
                "42601".to_string()
            )
        );
        assert_eq!(
            error("SELECT COUNT(* FROM demo.people").0,
            "syntax error at or near \"FROM\""
        );
        assert_eq!(
            error("SELECT COUNT(*) FROM"),
            (
                "syntax error at end of input".to_string(),
                Some(21),
                "42601".to_string()
            )
        );
    }

    #[test]
    fn syntax_errors_and_limits() {
        assert_eq!(code("SELEC 1"), "42601");
        let deep = format!("SELECT {}1{}", "(".repeat(200), ")".repeat(200));
        assert_eq!(code(&deep), "54000");
        let long = format!("SELECT '{}'", "x".repeat(limits::SQL_BYTES_MAX));
        assert_eq!(code(&long), "54000");
        let many = "SELECT 1;".repeat(limits::STATEMENTS_PER_MESSAGE_MAX + 1);
        assert_eq!(code(&many), "54000");
    }

    #[test]
    fn literals_cannot_end_early_upstream() {
        let sql = r"SELECT COUNT(*) FROM demo.visits WHERE clinic = 'x\'') SELECT 1 --'";
        let Ok(mut s) = classify(sql) else { return };
        let Some(Statement::Query(q)) = s.pop() else {
            panic!("query")
        };
        let text = q.to_string();
        // The whole literal is one dollar-quoted constant; nothing of it is SQL.
        assert!(text.contains("$__dp_s0$"), "{text}");
        let again = parse(&text).expect("re-parses");
        assert_eq!(again.len(), 1);
        assert_eq!(again[0].to_string(), text);
    }

    #[test]
    fn cursors() {
        assert_eq!(
            code("DECLARE c CURSOR WITH HOLD FOR SELECT COUNT(*) FROM demo.people"),
            "ok declare"
        );
        assert_eq!(
            code("declare c no scroll cursor for select 1"),
            "ok declare"
        );
        assert_eq!(code("DECLARE c SCROLL CURSOR FOR SELECT 1"), "0A000");
        assert_eq!(code("DECLARE c BINARY CURSOR FOR SELECT 1"), "0A000");
        assert_eq!(
            code("FETCH 10 FROM c; FETCH NEXT FROM c; FETCH ALL IN c"),
            "ok fetch,fetch,fetch"
        );
        // Without FROM/IN, sqlparser needs the statement alone (pgdp then adds FROM itself).
        assert_eq!(code("FETCH NEXT c"), "ok fetch");
        assert_eq!(code("FETCH FORWARD 3 c"), "ok fetch");
        assert_eq!(code("FETCH FORWARD ALL c"), "ok fetch");
        assert_eq!(code("FETCH BACKWARD 1 c"), "0A000");
        assert_eq!(code("FETCH PRIOR c"), "0A000");
        assert_eq!(code("CLOSE c; CLOSE ALL"), "ok close,close");
        assert_eq!(code("MOVE 5 IN c"), "ok move");
        assert_eq!(code("FETCH c"), "ok fetch");
        assert_eq!(code("fetch next c;"), "ok fetch");
        assert_eq!(code("MOVE 2 c"), "ok move");
        assert_eq!(code("move forward all from c"), "ok move");
        assert_eq!(code("MOVE 5 IN c; SELECT 1"), "42601");
        assert_eq!(
            classify("BEGIN;declare \"SQL_CUR1\" cursor with hold for SELECT 1;;fetch 100 in \"SQL_CUR1\"")
                .ok()
                .map(|s| s[2].clone()),
            Some(Statement::Fetch {
                name: "SQL_CUR1".into(),
                count: Some(100),
                move_only: false
            })
        );
        assert_eq!(
            classify("DECLARE MyCur CURSOR FOR SELECT 1")
                .ok()
                .and_then(|mut s| s.pop())
                .map(|s| match s {
                    Statement::DeclareCursor { name, hold, .. } => (name, hold),
                    _ => (String::new(), true),
                }),
            Some(("mycur".to_string(), false))
        );
    }

    #[test]
    fn empty_statements_between_semicolons_are_skipped() {
        assert_eq!(code("BEGIN;;COMMIT"), "ok begin,commit");
    }
}
