//! The rows of a DP query on their way through pgdp: [`PrivateRows`] as the upstream returned
//! them, which nothing outside [`crate::dp::release`] can read, and [`Released`] rows, which only
//! the release (or the replay of an earlier release) makes.
//!
//! Invariants (each enforced by the types, not by the order of calls):
//! - Upstream rows of a DP query are a [`PrivateRows`]: its cells have no public accessor, so the
//!   only way to turn them into anything a client can receive is [`super::measure`], which
//!   noises them into [`super::NoisyMeasures`].
//! - A [`Released`] cannot be built from arbitrary cells: its fields are private and its only
//!   constructors are [`super::finish`] (from noisy measures), [`Released::post_processed`]
//!   (from a [`Released`]) and [`Released::replayed`], which decodes a payload that
//!   [`Released::replay_payload`] wrote for an earlier release, as the ledger returns it (a
//!   [`Stored`], which only the ledger makes; bytes of any other origin do not compile:
//!   `Released::replayed(columns, &bytes[..])` is a type error).
//!
//! ```compile_fail,E0616
//! // Reading upstream rows outside the release does not compile.
//! fn peek(rows: &pgdp::dp::release::PrivateRows) -> usize {
//!     rows.rows.len()
//! }
//! ```
//!
//! ```compile_fail,E0451
//! // Nor does making released rows out of other cells.
//! use pgdp::output::Cell;
//! let released = pgdp::dp::release::Released {
//!     columns: Vec::new(),
//!     rows: vec![vec![Cell::Int(42)]],
//!     truncated: false,
//! };
//! ```

use crate::budget::Stored;
use crate::limits;
use crate::output::{Cell, OutColumn};

/// Rows as PostgreSQL's text format: one `Option<String>` per column (None = NULL).
pub type TextRows = Vec<Vec<Option<String>>>;

/// The text rows the shadow catalog answered for a [`crate::dp::sql::ShadowSql`]: values computed
/// from released rows and constants only. Made only by [`crate::upstream::Shadow::evaluate`] (the
/// constructor is crate-private), so [`Released::post_processed`] cannot be handed rows of any
/// other origin:
///
/// ```compile_fail,E0624
/// let _ = pgdp::dp::release::Evaluated::new(vec![vec![Some("42".to_string())]]);
/// ```
///
/// ```
/// // Reading them is public: they are released values.
/// fn width(rows: pgdp::dp::release::Evaluated) -> usize {
///     rows.into_rows().first().map_or(0, Vec::len)
/// }
/// ```
#[derive(Debug, Default)]
pub struct Evaluated(TextRows);

impl Evaluated {
    /// Rows the shadow catalog answered ([`crate::upstream::Shadow::evaluate`] only).
    pub(crate) fn new(rows: TextRows) -> Evaluated {
        Evaluated(rows)
    }

    /// The rows, as PostgreSQL's text format.
    pub fn into_rows(self) -> TextRows {
        self.0
    }

    /// How many rows.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The rows the upstream returned for a DP query's [`crate::dp::rewrite::UpstreamSql`]: exact
/// per-group statistics of private data. Opaque: only [`super::release`] reads them.
#[derive(Default)]
pub struct PrivateRows {
    pub(super) rows: TextRows,
}

impl PrivateRows {
    /// Wraps rows read from the upstream (the upstream module, and tests that run a rewrite's SQL
    /// themselves). Wrapping reveals nothing; reading is what only the release may do.
    pub fn new(rows: TextRows) -> PrivateRows {
        PrivateRows { rows }
    }

    /// How many rows (candidate groups) there are: a count pgdp never sends to a client, used
    /// for limits and logs.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// Whether there are no rows.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }
}

/// A synopsis's private histogram from the rows of its SQL
/// ([`crate::dp::rewrite::synopsis::histogram`]: a cell index and a count per row), over
/// `cells` cells. Read here, as every [`PrivateRows`] is, and handed on opaque.
pub fn synopsis_histogram(
    rows: &PrivateRows,
    cells: usize,
) -> crate::error::Result<crate::dp::mechanism::pmw::PrivateHistogram> {
    let mut counts = vec![0u64; cells];
    for row in &rows.rows {
        let parsed = match row.as_slice() {
            [Some(cell), Some(count)] => cell.parse::<usize>().ok().zip(count.parse::<u64>().ok()),
            _ => None,
        };
        match parsed {
            Some((cell, count)) if cell < cells => counts[cell] = count,
            _ => {
                return Err(crate::error::Error::internal(
                    "a synopsis histogram row that is not a cell and a count",
                ))
            }
        }
    }
    Ok(crate::dp::mechanism::pmw::PrivateHistogram::new(counts))
}

impl std::fmt::Debug for PrivateRows {
    /// Never prints a value: a log line must not carry private data.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PrivateRows({} rows)", self.rows.len())
    }
}

/// The analyst's result of a DP query: noisy, post-processed rows ready to send.
#[derive(Debug, Clone, PartialEq)]
pub struct Released {
    pub(super) columns: Vec<OutColumn>,
    pub(super) rows: Vec<Vec<Cell>>,
    /// Whether rows were dropped because of [`limits::GROUPS_RELEASED_MAX`].
    pub(super) truncated: bool,
}

impl Released {
    /// Output columns.
    pub fn columns(&self) -> &[OutColumn] {
        &self.columns
    }

    /// Released rows.
    pub fn rows(&self) -> &[Vec<Cell>] {
        &self.rows
    }

    /// Whether rows were dropped because of [`limits::GROUPS_RELEASED_MAX`].
    pub fn truncated(&self) -> bool {
        self.truncated
    }

    /// The columns and rows, to send.
    pub fn into_parts(self) -> (Vec<OutColumn>, Vec<Vec<Cell>>) {
        (self.columns, self.rows)
    }

    /// The rows as a payload for the replay cache (a simple tagged, length-prefixed format).
    pub fn replay_payload(&self) -> Vec<u8> {
        encode_rows(&self.rows)
    }

    /// An earlier release of the same query, read back from the replay cache: the same noisy
    /// answer again (post-processing of a release; it costs nothing). Only the ledger makes a
    /// [`Stored`], so replayed rows are rows a release of this analyst stored. `None` if the
    /// bytes are not ones [`Released::replay_payload`] wrote.
    pub fn replayed(columns: Vec<OutColumn>, stored: &Stored) -> Option<Released> {
        let rows = decode_rows(stored.bytes())?;
        let released = Released {
            columns: Vec::new(),
            rows,
            truncated: false,
        };
        Some(released.retyped(columns))
    }

    /// The same rows under `columns` (the analyst's column types as PostgreSQL gives them, from
    /// [`super::described_columns`]), each cell conformed to its column's type by
    /// [`Cell::conform`], which is post-processing and keeps the value's meaning.
    pub fn retyped(self, columns: Vec<OutColumn>) -> Released {
        let rows = self
            .rows
            .into_iter()
            .map(|row| {
                row.into_iter()
                    .enumerate()
                    .map(|(i, cell)| match columns.get(i) {
                        Some(column) => cell.conform(column.ty),
                        None => cell,
                    })
                    .collect()
            })
            .collect();
        Released {
            columns,
            rows,
            truncated: self.truncated,
        }
    }
}

/// Serialises released rows for the replay cache (a simple tagged, length-prefixed format).
fn encode_rows(rows: &[Vec<Cell>]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&(rows.len() as u64).to_be_bytes());
    for row in rows {
        out.extend_from_slice(&(row.len() as u64).to_be_bytes());
        for cell in row {
            match cell {
                Cell::Null => out.push(b'N'),
                Cell::Int(i) => {
                    out.push(b'I');
                    out.extend_from_slice(&i.to_be_bytes());
                }
                Cell::Float(f) => {
                    out.push(b'F');
                    out.extend_from_slice(&f.to_bits().to_be_bytes());
                }
                Cell::Bool(b) => {
                    out.push(b'B');
                    out.push(u8::from(*b));
                }
                Cell::Text(t) => {
                    out.push(b'T');
                    out.extend_from_slice(&(t.len() as u64).to_be_bytes());
                    out.extend_from_slice(t.as_bytes());
                }
            }
        }
    }
    out
}

/// The inverse of [`encode_rows`]; `None` for a payload it did not write.
fn decode_rows(mut b: &[u8]) -> Option<Vec<Vec<Cell>>> {
    fn u64_of(b: &mut &[u8]) -> Option<u64> {
        let (head, rest) = b.split_at_checked(8)?;
        *b = rest;
        Some(u64::from_be_bytes(head.try_into().ok()?))
    }
    let n = usize::try_from(u64_of(&mut b)?).ok()?;
    let mut rows = Vec::with_capacity(n.min(limits::GROUPS_RELEASED_MAX));
    for _ in 0..n {
        let width = u64_of(&mut b)?;
        let mut row = Vec::new();
        for _ in 0..width {
            let (tag, rest) = b.split_first()?;
            b = rest;
            row.push(match tag {
                b'N' => Cell::Null,
                b'I' => Cell::Int(u64_of(&mut b)? as i64),
                b'F' => Cell::Float(f64::from_bits(u64_of(&mut b)?)),
                b'B' => {
                    let (v, rest) = b.split_first()?;
                    b = rest;
                    Cell::Bool(*v != 0)
                }
                b'T' => {
                    let len = usize::try_from(u64_of(&mut b)?).ok()?;
                    let (t, rest) = b.split_at_checked(len)?;
                    b = rest;
                    Cell::Text(String::from_utf8(t.to_vec()).ok()?)
                }
                _ => return None,
            });
        }
        rows.push(row);
    }
    b.is_empty().then_some(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replay_payload_round_trips() {
        let rows = vec![
            vec![
                Cell::Text("a'b".into()),
                Cell::Int(-3),
                Cell::Float(0.1),
                Cell::Null,
                Cell::Bool(true),
            ],
            vec![],
        ];
        assert_eq!(decode_rows(&encode_rows(&rows)), Some(rows));
        assert_eq!(decode_rows(b"garbage"), None);
    }

    #[test]
    fn private_rows_never_print_their_values() {
        let rows = PrivateRows::new(vec![vec![Some("secret-diagnosis".into())]]);
        assert_eq!(format!("{rows:?}"), "PrivateRows(1 rows)");
    }
}
