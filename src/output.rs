//! The values pgdp sends to a client: cells, their types and output columns.
//!
//! Plain data shared by the DP pipeline (which releases cells), the session (which computes
//! constants, settings and the budget view) and the front end (which encodes them). Whether a
//! set of rows may be sent at all is decided by the types that carry them
//! ([`crate::dp::release::Released`], [`crate::session::ClientRows`]), not here. No I/O.

/// Types of output columns. pgdp releases counts as `int8` and real statistics as `float8`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CellType {
    /// `bigint`.
    Int8,
    /// `integer`.
    Int4,
    /// `double precision`.
    Float8,
    /// `text`.
    Text,
    /// `boolean`.
    Bool,
    /// A catalog column of the given PostgreSQL type OID, sent as text.
    Raw(u32),
}

/// One output value.
#[derive(Debug, Clone, PartialEq)]
pub enum Cell {
    /// SQL NULL.
    Null,
    /// An integer.
    Int(i64),
    /// A real number (never NaN or infinite when released).
    Float(f64),
    /// Text.
    Text(String),
    /// A boolean.
    Bool(bool),
}

/// An output column.
#[derive(Debug, Clone, PartialEq)]
pub struct OutColumn {
    /// Column name.
    pub name: String,
    /// Column type.
    pub ty: CellType,
}

impl OutColumn {
    /// A column.
    pub fn new(name: impl Into<String>, ty: CellType) -> OutColumn {
        OutColumn {
            name: name.into(),
            ty,
        }
    }
}
