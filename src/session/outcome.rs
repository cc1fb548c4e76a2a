//! What a statement gives back to the front end: an [`Outcome`], whose rows are [`ClientRows`].
//!
//! Invariant: rows sent to a client come from a DP release ([`ClientRows::released`]), from the
//! data-free shadow catalog ([`ClientRows::catalog`]), from public tables alone
//! ([`ClientRows::public`], rows only the upstream's public queries make), or from values the session computed
//! itself ([`ClientRows::computed`]: constants, settings, the budget view, and the rows of a
//! release held by a cursor), or from PostgreSQL's evaluation of a set operation over such rows
//! ([`ClientRows::combined`], which takes them). The first two take types that only the release and the shadow
//! catalog can make; the last is visible inside [`crate::session`] only. Upstream rows of a DP
//! query are [`crate::dp::release::PrivateRows`], which none of these accepts.
//!
//! ```compile_fail,E0624
//! // Outside the session, rows cannot be made up from arbitrary cells.
//! use pgdp::output::{Cell, CellType, OutColumn};
//! let rows = pgdp::session::ClientRows::computed(
//!     vec![OutColumn::new("income", CellType::Int8)],
//!     vec![vec![Cell::Int(52_000)]],
//! );
//! ```
//!
//! An outcome's rows are [`ClientRows`]:
//!
//! ```
//! fn send(rows: pgdp::session::ClientRows) -> pgdp::session::Outcome {
//!     pgdp::session::Outcome::Rows(rows)
//! }
//! ```
//!
//! and private upstream rows are not, nor become them by any conversion:
//!
//! ```compile_fail,E0277
//! fn send(rows: pgdp::dp::release::PrivateRows) -> pgdp::session::Outcome {
//!     pgdp::session::Outcome::Rows(rows.into())
//! }
//! ```

use crate::dp::release::Released;
use crate::output::{Cell, OutColumn};
use crate::upstream::shadow::CatalogRows;
use crate::upstream::PublicRows;

/// A message to the client besides the result (a NOTICE). Only the session writes one (from
/// the charge, the mechanisms and released values); the front end reads its text.
///
/// ```compile_fail,E0451
/// // Outside the session, a notice cannot be made up.
/// let notice = pgdp::session::Notice { message: "42 people have diabetes".into() };
/// ```
///
/// ```
/// fn text(notice: &pgdp::session::Notice) -> &str {
///     notice.message()
/// }
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Notice {
    /// The notice text.
    message: String,
}

impl Notice {
    /// A notice with this text.
    pub(in crate::session) fn new(message: impl Into<String>) -> Notice {
        Notice {
            message: message.into(),
        }
    }

    /// The notice text.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The notice text, to send.
    pub fn into_message(self) -> String {
        self.message
    }
}

/// The result of one statement.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// A command with its tag (`SET`, `DEALLOCATE`, …) and the setting to report in a
    /// ParameterStatus, if it changed one clients track.
    Command {
        tag: String,
        reported: Option<(String, String)>,
    },
    /// `BEGIN`: enters a transaction block.
    TransactionStart,
    /// `COMMIT` / `ROLLBACK`: leaves it (the tag is the command's).
    TransactionEnd { tag: String },
    /// Rows, with the SELECT tag implied.
    Rows(ClientRows),
}

/// Rows a client may receive, with the notices that go before them. See the module docs for
/// where they may come from.
#[derive(Debug, Clone, PartialEq)]
pub struct ClientRows {
    columns: Vec<OutColumn>,
    rows: Vec<Vec<Cell>>,
    notices: Vec<Notice>,
}

impl ClientRows {
    /// The rows of a DP release (or of its replay).
    pub fn released(released: Released, notices: Vec<Notice>) -> ClientRows {
        let (columns, rows) = released.into_parts();
        ClientRows {
            columns,
            rows,
            notices,
        }
    }

    /// The answer of a catalog query, read from the shadow catalog, which holds no rows of any
    /// table.
    pub fn catalog(rows: CatalogRows) -> ClientRows {
        let (columns, rows) = rows.into_cells();
        ClientRows {
            columns,
            rows,
            notices: Vec::new(),
        }
    }

    /// The answer of a query over public tables alone ([`crate::dp::rewrite::public`]), typed
    /// as the shadow catalog described it.
    pub fn public(columns: Vec<OutColumn>, rows: PublicRows) -> ClientRows {
        let rows = rows
            .into_text()
            .into_iter()
            .map(|r| {
                r.into_iter()
                    .map(|c| c.map_or(Cell::Null, Cell::Text))
                    .collect()
            })
            .collect();
        ClientRows {
            columns,
            rows,
            notices: Vec::new(),
        }
    }

    /// Cells the session computed itself: constants, settings, the budget view, and rows it
    /// holds from an earlier release (a cursor's). Never upstream rows: the session has no way
    /// to read those.
    pub(in crate::session) fn computed(
        columns: Vec<OutColumn>,
        rows: Vec<Vec<Cell>>,
    ) -> ClientRows {
        ClientRows {
            columns,
            rows,
            notices: Vec::new(),
        }
    }

    /// The answer of a set operation over the answers `parts` of its branches
    /// ([`super::setop`]): `run` evaluates the SQL that `sql` writes from their columns and rows
    /// (on the shadow catalog), read as `columns` (the types the shadow gave the same SQL without
    /// rows, before anything was charged); the notices of every part go before it, in order.
    pub(in crate::session) async fn combined<S, F, Fut>(
        parts: Vec<ClientRows>,
        columns: Vec<OutColumn>,
        sql: S,
        run: F,
    ) -> crate::error::Result<ClientRows>
    where
        S: FnOnce(
            &[(&[OutColumn], &[Vec<Cell>])],
        ) -> crate::error::Result<crate::dp::sql::ShadowSql>,
        F: FnOnce(crate::dp::sql::ShadowSql) -> Fut,
        Fut: std::future::Future<Output = crate::error::Result<crate::dp::release::Evaluated>>,
    {
        let released: Vec<(&[OutColumn], &[Vec<Cell>])> = parts
            .iter()
            .map(|p| (p.columns.as_slice(), p.rows.as_slice()))
            .collect();
        let text = run(sql(&released)?).await?.into_rows();
        if text.len() > crate::limits::GROUPS_RELEASED_MAX {
            return Err(crate::error::Error::LimitExceeded {
                what: "the rows of an answer evaluated over released rows".into(),
                limit: crate::limits::GROUPS_RELEASED_MAX as u64,
            });
        }
        let mut rows = Vec::with_capacity(text.len());
        for row in text {
            if row.len() != columns.len() {
                return Err(crate::error::Error::internal(
                    "a set operation answered another width",
                ));
            }
            rows.push(
                row.into_iter()
                    .zip(&columns)
                    .map(|(t, c)| Cell::of_text(c.ty, t))
                    .collect(),
            );
        }
        Ok(ClientRows {
            columns,
            rows,
            notices: parts.into_iter().flat_map(|p| p.notices).collect(),
        })
    }

    /// The same rows with `notices` sent before them.
    pub fn with_notices(mut self, notices: Vec<Notice>) -> ClientRows {
        self.notices = notices;
        self
    }

    /// Output columns.
    pub fn columns(&self) -> &[OutColumn] {
        &self.columns
    }

    /// The rows.
    pub fn rows(&self) -> &[Vec<Cell>] {
        &self.rows
    }

    /// The notices.
    pub fn notices(&self) -> &[Notice] {
        &self.notices
    }

    /// Columns, rows and notices, to encode.
    pub fn into_parts(self) -> (Vec<OutColumn>, Vec<Vec<Cell>>, Vec<Notice>) {
        (self.columns, self.rows, self.notices)
    }
}
