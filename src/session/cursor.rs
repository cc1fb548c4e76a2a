//! Cursors: `DECLARE … CURSOR`, `FETCH`, `MOVE`, `CLOSE`.
//!
//! A cursor's query runs once, at DECLARE, through [`Session::run`] like any query (a DP query
//! is analysed, charged and released there); its released rows are kept in the session, and FETCH
//! and MOVE serve them without the upstream or the ledger: post-processing of a release, free.
//! A cursor without HOLD lives until its transaction block ends; one WITH HOLD survives COMMIT,
//! but not the ROLLBACK of the block that declared it. Bounded by `CURSORS_PER_SESSION_MAX` and
//! `CURSOR_ROWS_PER_SESSION_MAX`.

use std::collections::{HashMap, VecDeque};

use sqlparser::ast;

use crate::error::{Error, Result};
use crate::output::{Cell, OutColumn};
use crate::session::classify::Statement;

use super::{ClientRows, Notice, Outcome, Session, Shared};

/// An open cursor: the rows its query released, not yet fetched.
#[derive(Debug)]
struct Cursor {
    columns: Vec<OutColumn>,
    rows: VecDeque<Vec<Cell>>,
    /// The notices of the DECLARE (what it charged), sent with the first FETCH.
    notices: Vec<Notice>,
    hold: bool,
    /// Declared in the transaction block still open (its ROLLBACK removes even a HOLD cursor).
    in_block: bool,
}

/// The open cursors of a session, by name.
#[derive(Debug, Default)]
pub(super) struct Cursors {
    open: HashMap<String, Cursor>,
}

impl Cursors {
    fn rows_held(&self) -> usize {
        self.open.values().map(|c| c.rows.len()).sum()
    }
}

impl Session {
    /// The result columns of an open cursor (for Describe of a prepared FETCH).
    pub fn cursor_columns(&self, name: &str) -> Option<Vec<OutColumn>> {
        self.cursors.open.get(name).map(|c| c.columns.clone())
    }

    pub(super) async fn declare_cursor(
        &mut self,
        shared: &Shared,
        name: &str,
        hold: bool,
        query: &ast::Query,
        params: &[Option<String>],
    ) -> Result<Outcome> {
        if !hold && !self.in_transaction {
            return Err(Error::NoTransaction {
                what: "DECLARE CURSOR".into(),
            });
        }
        if self.cursors.open.contains_key(name) {
            return Err(Error::DuplicateCursor { name: name.into() });
        }
        if self.cursors.open.len() >= crate::limits::CURSORS_PER_SESSION_MAX {
            return Err(Error::LimitExceeded {
                what: "the number of open cursors of this session".into(),
                limit: crate::limits::CURSORS_PER_SESSION_MAX as u64,
            });
        }
        // Checked before the query runs, so that the check below cannot refuse a release that
        // was charged: every release fits in what is left (`GROUPS_RELEASED_MAX`).
        let room = crate::limits::CURSOR_ROWS_PER_SESSION_MAX - crate::limits::GROUPS_RELEASED_MAX;
        if self.cursors.rows_held() > room {
            return Err(Error::LimitExceeded {
                what: "the number of rows held in the open cursors of this session".into(),
                limit: crate::limits::CURSOR_ROWS_PER_SESSION_MAX as u64,
            });
        }
        let statement = Statement::Query(Box::new(query.clone()));
        let (columns, rows, notices) = self
            .rows(shared, super::route(&statement)?, params)
            .await?
            .into_parts();
        // A safety net for answers that are not releases (catalog rows), which charge nothing.
        if self.cursors.rows_held() + rows.len() > crate::limits::CURSOR_ROWS_PER_SESSION_MAX {
            return Err(Error::LimitExceeded {
                what: "the number of rows held in the open cursors of this session".into(),
                limit: crate::limits::CURSOR_ROWS_PER_SESSION_MAX as u64,
            });
        }
        self.cursors.open.insert(
            name.to_string(),
            Cursor {
                columns,
                rows: rows.into(),
                notices,
                hold,
                in_block: self.in_transaction,
            },
        );
        Ok(Outcome::Command {
            tag: "DECLARE CURSOR".into(),
            reported: None,
        })
    }

    pub(super) fn fetch_cursor(
        &mut self,
        name: &str,
        count: Option<u64>,
        move_only: bool,
    ) -> Result<Outcome> {
        let cursor = self
            .cursors
            .open
            .get_mut(name)
            .ok_or_else(|| Error::UnknownCursor {
                kind: "cursor",
                name: name.into(),
            })?;
        let wanted = count.map_or(usize::MAX, |c| usize::try_from(c).unwrap_or(usize::MAX));
        let n = wanted.min(cursor.rows.len());
        let rows: Vec<Vec<Cell>> = cursor.rows.drain(..n).collect();
        if move_only {
            return Ok(Outcome::Command {
                tag: format!("MOVE {}", rows.len()),
                reported: None,
            });
        }
        Ok(Outcome::Rows(
            ClientRows::computed(cursor.columns.clone(), rows)
                .with_notices(std::mem::take(&mut cursor.notices)),
        ))
    }

    pub(super) fn close_cursor(&mut self, name: Option<&str>) -> Result<Outcome> {
        match name {
            None => self.cursors.open.clear(),
            Some(n) => {
                self.cursors
                    .open
                    .remove(n)
                    .ok_or_else(|| Error::UnknownCursor {
                        kind: "cursor",
                        name: n.into(),
                    })?;
            }
        }
        Ok(Outcome::Command {
            tag: "CLOSE CURSOR".into(),
            reported: None,
        })
    }

    /// The end of a transaction block: cursors without HOLD close; after a ROLLBACK, so do the
    /// HOLD cursors the block declared.
    pub(super) fn end_block_cursors(&mut self, committed: bool) {
        self.cursors
            .open
            .retain(|_, c| c.hold && (committed || !c.in_block));
        for c in self.cursors.open.values_mut() {
            c.in_block = false;
        }
    }
}
