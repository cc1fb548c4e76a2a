//! The one error type of everything a client can observe, and its exhaustive SQLSTATE mapping.
//!
//! Invariants:
//! - Every refusal a client sees is a variant here; [`Error::sqlstate`] maps each variant to one
//!   code with an exhaustive `match`, so adding a variant forces choosing its code.
//! - Messages never carry a value read from the backend. They may name what the analyst wrote
//!   (a table, a column, a function) and what the policy says (bounds, budgets), nothing else.
//!   Backend failures are logged by the caller and reach the client as [`Error::Upstream`], whose
//!   message is fixed.
//! - Messages follow PostgreSQL's style: lowercase, no trailing period. Hints are full sentences.

use tokio_postgres::error::SqlState;

/// Which of PostgreSQL's errors a LIMIT or OFFSET raises ([`Error::InvalidRowCount`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowCountFault {
    /// 22P02: a string that is not an integer of its type.
    InvalidText,
    /// 22003: a value outside its integer type's range.
    OutOfRange,
    /// 2201W.
    NegativeLimit,
    /// 2201X.
    NegativeOffset,
}

/// Everything that can go wrong in a way a client observes.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// The SQL text does not parse.
    #[error("syntax error: {message}")]
    Syntax { message: String },

    /// The parser stopped at a token (or the end of the text): PostgreSQL's wording, `syntax
    /// error at or near "…"` or `syntax error at end of input`, with the token's 1-based
    /// character position for the client to point at, and what the parser expected as detail.
    #[error("syntax error at {near}")]
    SyntaxAt {
        near: String,
        position: Option<usize>,
        expected: String,
    },

    /// A construct pgdp does not support (yet); nothing was run.
    #[error("{what} is not supported by pgdp")]
    Unsupported { what: String, hint: String },

    /// The statement is understood but the policy forbids it.
    #[error("{what}")]
    Forbidden { what: String, hint: String },

    /// A table the policy does not list (it does not exist for the analyst).
    #[error("relation \"{name}\" does not exist")]
    UnknownTable { name: String },

    /// A column the policy does not list.
    #[error("column \"{name}\" does not exist")]
    UnknownColumn { name: String },

    /// A function that is not on pgdp's whitelist of total functions.
    #[error("function {name} is not available through pgdp")]
    UnknownFunction { name: String, hint: String },

    /// A session parameter outside the whitelist.
    #[error("unrecognized configuration parameter \"{name}\"")]
    UnknownParameter { name: String },

    /// A session parameter or mechanism argument with a bad value.
    #[error("invalid value for {name}: {reason}")]
    InvalidParameter {
        name: String,
        reason: String,
        hint: String,
    },

    /// A bound parameter whose text is not a value of its type (PostgreSQL's 22P02 at Bind). The
    /// value is the analyst's own input, never data.
    #[error("invalid input syntax for type {what}: \"{value}\" (parameter ${parameter})")]
    InvalidText {
        what: String,
        value: String,
        parameter: usize,
    },

    /// A LIMIT or OFFSET that PostgreSQL would refuse when it runs (`dp::analyze::row_count`):
    /// text that is not an integer, a value out of its type's range, a negative count. Raised
    /// before anything runs, in PostgreSQL's words; it quotes only the analyst's own text.
    #[error("{message}")]
    InvalidRowCount {
        fault: RowCountFault,
        message: String,
    },

    /// A mechanism that cannot be constructed (ε ≤ 0, non-finite bounds, …).
    #[error("invalid mechanism: {reason}")]
    InvalidMechanism { reason: String },

    /// Wrong password or an analyst the policy does not know. One message for both, so that a
    /// client cannot learn which analysts exist.
    #[error("password authentication failed for user \"{user}\"")]
    Authentication { user: String },

    /// Too many failed logins of this user from the client's IP address, or from the address
    /// in all, recently; refused before authentication, whatever the credentials (see
    /// `frontend::throttle`). `scope`: `for this user from this address` or `from this address`.
    #[error("too many failed authentication attempts {scope}")]
    AuthenticationThrottled { scope: &'static str },

    /// A clear-text connection to a server that requires TLS (`--require-tls`): PostgreSQL's
    /// message for a `hostssl`-only `pg_hba.conf`, sent before any authentication.
    #[error("no pg_hba.conf entry for host \"{host}\", user \"{user}\", database \"{database}\", no encryption")]
    EncryptionRequired {
        host: String,
        user: String,
        database: String,
    },

    /// The client connected to a database the policy does not serve.
    /// A startup packet naming a database pgdp does not serve; the hint names the one it does.
    #[error("database \"{name}\" does not exist")]
    UnknownDatabase { name: String, hint: String },

    /// The query would spend more than the analyst (or the dataset) has left.
    #[error("{detail}")]
    BudgetExhausted { detail: String },

    /// A limit from [`crate::limits`] was exceeded.
    #[error("{what} exceeds the limit of {limit}")]
    LimitExceeded { what: String, limit: u64 },

    /// Too many connections, in total or for one analyst.
    #[error("too many connections{scope}")]
    TooManyConnections { scope: String },

    /// The upstream statement was cancelled or ran past its timeout.
    #[error("canceling statement due to {reason}")]
    Canceled { reason: String },

    /// The upstream database cannot be reached right now.
    #[error("the upstream database is unavailable")]
    UpstreamUnavailable,

    /// The upstream failed while running a DP statement. The upstream's own text can contain row
    /// values, so it is never shown: this message is fixed.
    #[error("the upstream query failed; the charge for it stands")]
    Upstream,

    /// The privacy ledger cannot be reached, so no DP query can be charged and none is run.
    #[error("the privacy ledger is unavailable; no query was run and nothing was charged")]
    LedgerUnavailable,

    /// A transaction-state error (e.g. a statement in a failed transaction).
    #[error("{what}")]
    Transaction { what: String },

    /// A statement that needs a transaction block ran outside one (`DECLARE` without `WITH
    /// HOLD`, `SAVEPOINT`, `RELEASE`, `ROLLBACK TO`).
    #[error("{what} can only be used in transaction blocks")]
    NoTransaction { what: String },

    /// `FETCH`/`MOVE`/`CLOSE` of a cursor that is not open, or a savepoint that does not exist.
    #[error("{kind} \"{name}\" does not exist")]
    UnknownCursor { kind: &'static str, name: String },

    /// `DECLARE` of a cursor name already open.
    #[error("cursor \"{name}\" already exists")]
    DuplicateCursor { name: String },

    /// A protocol-level misuse by the client (unknown portal, bad Bind …).
    #[error("{what}")]
    Protocol { what: String },

    /// PostgreSQL's own error for the post-processing of released values
    /// ([`crate::dp::plan::PostProcessing`]), with its SQLSTATE and message. That SQL runs on the
    /// shadow catalog, which holds no rows, over released values and the query's literals only,
    /// so its message can carry nothing else.
    #[error("{message}")]
    PostProcessing {
        state: SqlState,
        message: String,
        hint: Option<String>,
    },

    /// The analyst was removed from the policy by a reload: each of their sessions ends, as
    /// PostgreSQL ends a backend with `pg_terminate_backend`. The only error that ends a session
    /// once it is open ([`Error::ends_session`]).
    #[error("terminating connection due to administrator command")]
    AdminShutdown,

    /// A released answer with a cell whose stated error (the 95 % noise bound, plus the
    /// estimated shortfall of a cap chosen for the query) exceeds the share of its value the
    /// session's `pgdp.max_relative_error` allows: refused after the charge, so that a tool
    /// that never shows NOTICEs shows an error instead of a number that far off.
    /// Post-processing of released values: `detail` quotes only released numbers (and
    /// estimates) and the analyst's own keys.
    #[error(
        "the answer is less accurate than this session allows: {detail}; the charge for it stands"
    )]
    TooInaccurate { detail: String },

    /// A released COUNT or SUM whose caps, chosen for the query, are estimated to remove more
    /// of its rows than the session's `pgdp.max_bias` allows: refused after the charge, so that
    /// a tool that never shows NOTICEs shows an error instead of a number that far low. More ε
    /// does not help; fewer units over the caps in each group does. Post-processing of the
    /// noisy histograms: `detail` quotes only their estimates and the analyst's own SQL.
    #[error(
        "the answer is more biased than this session allows: {detail}; the charge for it stands"
    )]
    TooBiased { detail: String },

    /// A bug in pgdp. Logged in full; the client sees this fixed text.
    #[error("internal error in pgdp")]
    Internal { detail: String },
}

/// The result type of fallible pgdp functions.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The SQLSTATE a client receives for this error.
    pub fn sqlstate(&self) -> SqlState {
        match self {
            Error::Syntax { .. } | Error::SyntaxAt { .. } => SqlState::SYNTAX_ERROR,
            Error::Unsupported { .. } => SqlState::FEATURE_NOT_SUPPORTED,
            Error::Forbidden { .. } => SqlState::INSUFFICIENT_PRIVILEGE,
            Error::UnknownTable { .. } => SqlState::UNDEFINED_TABLE,
            Error::UnknownColumn { .. } => SqlState::UNDEFINED_COLUMN,
            Error::UnknownFunction { .. } => SqlState::UNDEFINED_FUNCTION,
            Error::UnknownParameter { .. } => SqlState::UNDEFINED_OBJECT,
            Error::InvalidParameter { .. } => SqlState::INVALID_PARAMETER_VALUE,
            Error::InvalidText { .. } => SqlState::INVALID_TEXT_REPRESENTATION,
            Error::InvalidRowCount { fault, .. } => match fault {
                RowCountFault::InvalidText => SqlState::INVALID_TEXT_REPRESENTATION,
                RowCountFault::OutOfRange => SqlState::NUMERIC_VALUE_OUT_OF_RANGE,
                RowCountFault::NegativeLimit => SqlState::INVALID_ROW_COUNT_IN_LIMIT_CLAUSE,
                RowCountFault::NegativeOffset => {
                    SqlState::INVALID_ROW_COUNT_IN_RESULT_OFFSET_CLAUSE
                }
            },
            Error::InvalidMechanism { .. } => SqlState::INVALID_PARAMETER_VALUE,
            Error::Authentication { .. } => SqlState::INVALID_PASSWORD,
            Error::AuthenticationThrottled { .. } => SqlState::TOO_MANY_CONNECTIONS,
            Error::EncryptionRequired { .. } => SqlState::INVALID_AUTHORIZATION_SPECIFICATION,
            Error::UnknownDatabase { .. } => SqlState::INVALID_CATALOG_NAME,
            Error::BudgetExhausted { .. } => SqlState::CONFIGURATION_LIMIT_EXCEEDED,
            Error::LimitExceeded { .. } => SqlState::PROGRAM_LIMIT_EXCEEDED,
            Error::TooManyConnections { .. } => SqlState::TOO_MANY_CONNECTIONS,
            Error::Canceled { .. } => SqlState::QUERY_CANCELED,
            Error::UpstreamUnavailable => SqlState::CANNOT_CONNECT_NOW,
            Error::Upstream => SqlState::SYSTEM_ERROR,
            Error::LedgerUnavailable => SqlState::CANNOT_CONNECT_NOW,
            Error::Transaction { .. } => SqlState::IN_FAILED_SQL_TRANSACTION,
            Error::NoTransaction { .. } => SqlState::NO_ACTIVE_SQL_TRANSACTION,
            Error::UnknownCursor {
                kind: "savepoint", ..
            } => SqlState::S_E_INVALID_SPECIFICATION,
            Error::UnknownCursor { .. } => SqlState::INVALID_CURSOR_NAME,
            Error::DuplicateCursor { .. } => SqlState::DUPLICATE_CURSOR,
            Error::Protocol { .. } => SqlState::PROTOCOL_VIOLATION,
            Error::PostProcessing { state, .. } => state.clone(),
            Error::AdminShutdown => SqlState::ADMIN_SHUTDOWN,
            Error::TooInaccurate { .. } | Error::TooBiased { .. } => SqlState::DATA_EXCEPTION,
            Error::Internal { .. } => SqlState::INTERNAL_ERROR,
        }
    }

    /// A hint telling the analyst what to change, where one helps.
    pub fn hint(&self) -> Option<&str> {
        match self {
            Error::Unsupported { hint, .. }
            | Error::Forbidden { hint, .. }
            | Error::UnknownFunction { hint, .. }
            | Error::InvalidParameter { hint, .. }
            | Error::UnknownDatabase { hint, .. } => (!hint.is_empty()).then_some(hint.as_str()),
            Error::PostProcessing { hint, .. } => hint.as_deref(),
            Error::UnknownTable { .. } => {
                Some("Only the tables listed in the pgdp policy can be queried.")
            }
            Error::UnknownColumn { .. } => {
                Some("Only the columns listed in the pgdp policy can be used.")
            }
            Error::BudgetExhausted { .. } => {
                Some("Ask the data owner for more budget, or lower pgdp.epsilon / pgdp.delta.")
            }
            Error::UnknownParameter { .. } => {
                Some("pgdp answers SET and SHOW only for a whitelist of harmless parameters and pgdp.* settings.")
            }
            Error::InvalidText { .. } => {
                Some("Bind a value of the parameter's type, or leave its type unspecified.")
            }
            Error::NoTransaction { .. } => {
                Some("Run BEGIN first (a cursor can also be declared WITH HOLD).")
            }
            Error::AdminShutdown => {
                Some("The data owner removed this analyst from the pgdp policy.")
            }
            Error::InvalidRowCount { .. } => {
                Some("LIMIT and OFFSET take a count of rows: a non-negative integer.")
            }
            Error::TooInaccurate { .. } => Some(
                "Ask a coarser question (fewer or larger groups, e.g. months instead of weeks or days), raise pgdp.epsilon, or SET pgdp.max_relative_error = off and read each number with its error (SET pgdp.accuracy = on) and the NOTICE's estimate of what the caps removed.",
            ),
            Error::TooBiased { .. } => Some(
                "Ask a coarser question: larger groups (e.g. months instead of weeks or days) or fewer of them, so that fewer privacy units have more rows or groups than the policy's ceilings allow in each; more epsilon does not help. Or SET pgdp.max_bias = off and read the NOTICE's estimate of the rows the caps removed.",
            ),
            Error::Syntax { .. }
            | Error::SyntaxAt { .. }
            | Error::UnknownCursor { .. }
            | Error::DuplicateCursor { .. }
            | Error::InvalidMechanism { .. }
            | Error::Authentication { .. }
            | Error::AuthenticationThrottled { .. }
            | Error::EncryptionRequired { .. }
            | Error::LimitExceeded { .. }
            | Error::TooManyConnections { .. }
            | Error::Canceled { .. }
            | Error::UpstreamUnavailable
            | Error::Upstream
            | Error::LedgerUnavailable
            | Error::Transaction { .. }
            | Error::Protocol { .. }
            | Error::Internal { .. } => None,
        }
    }

    /// Whether the error ends the session (sent with severity FATAL, then the connection
    /// closes), rather than the statement.
    pub fn ends_session(&self) -> bool {
        matches!(self, Error::AdminShutdown)
    }

    /// The 1-based character position in the statement text that the error points at.
    pub fn position(&self) -> Option<usize> {
        match self {
            Error::SyntaxAt { position, .. } => *position,
            _ => None,
        }
    }

    /// Detail for the client, where the error has one.
    pub fn detail(&self) -> Option<String> {
        match self {
            Error::SyntaxAt { expected, .. } if !expected.is_empty() => {
                Some(format!("pgdp's parser expected {expected} there."))
            }
            _ => None,
        }
    }

    /// Shorthand for a policy refusal.
    pub fn forbidden(what: impl Into<String>, hint: impl Into<String>) -> Error {
        Error::Forbidden {
            what: what.into(),
            hint: hint.into(),
        }
    }

    /// Shorthand for an unsupported construct.
    pub fn unsupported(what: impl Into<String>, hint: impl Into<String>) -> Error {
        Error::Unsupported {
            what: what.into(),
            hint: hint.into(),
        }
    }

    /// Shorthand for a bug.
    pub fn internal(detail: impl Into<String>) -> Error {
        Error::Internal {
            detail: detail.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_the_documented_ones() {
        assert_eq!(
            Error::Syntax {
                message: "x".into()
            }
            .sqlstate()
            .code(),
            "42601"
        );
        assert_eq!(Error::forbidden("x", "y").sqlstate().code(), "42501");
        assert_eq!(Error::unsupported("x", "y").sqlstate().code(), "0A000");
        assert_eq!(
            Error::UnknownTable { name: "t".into() }.sqlstate().code(),
            "42P01"
        );
        assert_eq!(
            Error::UnknownColumn { name: "c".into() }.sqlstate().code(),
            "42703"
        );
        assert_eq!(
            Error::BudgetExhausted { detail: "d".into() }
                .sqlstate()
                .code(),
            "53400"
        );
        assert_eq!(
            Error::Authentication { user: "u".into() }.sqlstate().code(),
            "28P01"
        );
    }

    /// Every 0A000 refusal says how to write the question so that pgdp answers it (issue 15):
    /// no call of [`Error::unsupported`] in the crate passes an empty hint. A source check in
    /// the manner of rust-analyzer's tidy tests, since the sites are too many to reach one by
    /// one from SQL (the analyser's tests reach the common ones).
    #[test]
    fn every_unsupported_refusal_carries_a_hint() {
        fn rust_files(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
            for entry in std::fs::read_dir(dir).expect("readable source directory") {
                let path = entry.expect("directory entry").path();
                if path.is_dir() {
                    rust_files(&path, out);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    out.push(path);
                }
            }
        }
        let mut files = Vec::new();
        rust_files(
            &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
            &mut files,
        );
        // Split so that this test's own text holds no call.
        const NEEDLE: &str = concat!("Error::", "unsupported(");
        let mut calls = 0;
        let mut empty = Vec::new();
        for path in files {
            let text = std::fs::read_to_string(&path).expect("readable source file");
            for (at, _) in text.match_indices(NEEDLE) {
                // The call's text up to its closing parenthesis.
                let start = at + NEEDLE.len();
                let mut depth = 1;
                let end = text[start..]
                    .char_indices()
                    .find_map(|(i, c)| {
                        match c {
                            '(' => depth += 1,
                            ')' => depth -= 1,
                            _ => {}
                        }
                        (depth == 0).then_some(start + i)
                    })
                    .expect("a closed call");
                let call: String = text[start..end].split_whitespace().collect();
                calls += 1;
                let call = call.trim_end_matches(',');
                if call.ends_with(",\"\"") || call.ends_with(",String::new()") {
                    let line = text[..at].matches('\n').count() + 1;
                    empty.push(format!("{}:{line}", path.display()));
                }
            }
        }
        assert!(calls > 100, "only {calls} calls found: the scan is broken");
        assert!(empty.is_empty(), "0A000 refusals without a hint: {empty:?}");
    }

    #[test]
    fn connection_refusals_use_postgres_codes_and_text() {
        let throttled = Error::AuthenticationThrottled {
            scope: "for this user from this address",
        };
        assert_eq!(throttled.sqlstate().code(), "53300");
        let refusal = Error::EncryptionRequired {
            host: "127.0.0.1".into(),
            user: "analyst".into(),
            database: "pgdp_demo".into(),
        };
        assert_eq!(refusal.sqlstate().code(), "28000");
        assert_eq!(
            refusal.to_string(),
            "no pg_hba.conf entry for host \"127.0.0.1\", user \"analyst\", database \"pgdp_demo\", no encryption"
        );
    }

    #[test]
    fn removal_by_reload_ends_the_session_as_pg_terminate_backend() {
        assert_eq!(Error::AdminShutdown.sqlstate().code(), "57P01");
        assert!(Error::AdminShutdown.ends_session());
        assert!(!Error::Upstream.ends_session());
        assert_eq!(
            Error::AdminShutdown.to_string(),
            "terminating connection due to administrator command"
        );
    }

    #[test]
    fn upstream_message_is_fixed() {
        assert_eq!(
            Error::Upstream.to_string(),
            "the upstream query failed; the charge for it stands"
        );
    }
}
