//! The values pgdp sends to a client: cells, their types and output columns.
//!
//! Plain data shared by the DP pipeline (which releases cells), the session (which computes
//! constants, settings and the budget view) and the front end (which encodes them). Whether a
//! set of rows may be sent at all is decided by the types that carry them
//! ([`crate::dp::release::Released`], [`crate::session::ClientRows`]), not here. No I/O.

/// Types of output columns. A DP query's columns have the types PostgreSQL gives the same SQL
/// (described on the shadow catalog, [`crate::upstream::shadow`]); where it cannot say, pgdp
/// releases counts as `int8` and real statistics as `float8`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CellType {
    /// `bigint`.
    Int8,
    /// `integer`.
    Int4,
    /// `smallint`.
    Int2,
    /// `numeric`.
    Numeric,
    /// `double precision`.
    Float8,
    /// `real`.
    Float4,
    /// `text`.
    Text,
    /// `boolean`.
    Bool,
    /// `date`.
    Date,
    /// `timestamp without time zone`.
    Timestamp,
    /// `timestamp with time zone`.
    Timestamptz,
    /// A catalog column, or a text-like released key (`varchar`, `bpchar`, `name`), of the given
    /// PostgreSQL type OID, sent as text.
    Raw(u32),
}

/// Type OIDs of PostgreSQL's built-in types that pgdp releases.
mod oid {
    pub const BOOL: u32 = 16;
    pub const NAME: u32 = 19;
    pub const INT8: u32 = 20;
    pub const INT2: u32 = 21;
    pub const INT4: u32 = 23;
    pub const TEXT: u32 = 25;
    pub const FLOAT4: u32 = 700;
    pub const FLOAT8: u32 = 701;
    pub const BPCHAR: u32 = 1042;
    pub const VARCHAR: u32 = 1043;
    pub const DATE: u32 = 1082;
    pub const TIMESTAMP: u32 = 1114;
    pub const TIMESTAMPTZ: u32 = 1184;
    pub const NUMERIC: u32 = 1700;
}

impl CellType {
    /// The type of a released column of PostgreSQL type `oid`, if pgdp can release values of
    /// that type: numbers, booleans, text-like types, dates and timestamps.
    pub fn released(oid: u32) -> Option<CellType> {
        Some(match oid {
            oid::BOOL => CellType::Bool,
            oid::INT8 => CellType::Int8,
            oid::INT2 => CellType::Int2,
            oid::INT4 => CellType::Int4,
            oid::TEXT => CellType::Text,
            oid::FLOAT4 => CellType::Float4,
            oid::FLOAT8 => CellType::Float8,
            oid::NUMERIC => CellType::Numeric,
            oid::DATE => CellType::Date,
            oid::TIMESTAMP => CellType::Timestamp,
            oid::TIMESTAMPTZ => CellType::Timestamptz,
            oid::NAME | oid::BPCHAR | oid::VARCHAR => CellType::Raw(oid),
            _ => return None,
        })
    }

    /// The PostgreSQL type OID.
    pub fn oid(self) -> u32 {
        match self {
            CellType::Int8 => oid::INT8,
            CellType::Int4 => oid::INT4,
            CellType::Int2 => oid::INT2,
            CellType::Numeric => oid::NUMERIC,
            CellType::Float8 => oid::FLOAT8,
            CellType::Float4 => oid::FLOAT4,
            CellType::Text => oid::TEXT,
            CellType::Bool => oid::BOOL,
            CellType::Date => oid::DATE,
            CellType::Timestamp => oid::TIMESTAMP,
            CellType::Timestamptz => oid::TIMESTAMPTZ,
            CellType::Raw(oid) => oid,
        }
    }

    /// The type's name in SQL (for a cast).
    pub fn sql_name(self) -> &'static str {
        match self {
            CellType::Int8 => "int8",
            CellType::Int4 => "int4",
            CellType::Int2 => "int2",
            CellType::Numeric => "numeric",
            CellType::Float8 => "float8",
            CellType::Float4 => "float4",
            CellType::Text => "text",
            CellType::Bool => "bool",
            CellType::Date => "date",
            CellType::Timestamp => "timestamp",
            CellType::Timestamptz => "timestamptz",
            CellType::Raw(oid::NAME) => "name",
            CellType::Raw(oid::BPCHAR) => "bpchar",
            CellType::Raw(oid::VARCHAR) => "varchar",
            CellType::Raw(_) => "text",
        }
    }

    /// Whether values of the type are numbers (what an aggregate may be released as).
    pub fn is_number(self) -> bool {
        matches!(
            self,
            CellType::Int8
                | CellType::Int4
                | CellType::Int2
                | CellType::Numeric
                | CellType::Float8
                | CellType::Float4
        )
    }

    /// The type of a value of a column declared as `declared` (the policy's type name, e.g.
    /// `integer`, `numeric(12,2)`, `character varying`), if pgdp releases that type.
    pub fn of_declared(declared: &str) -> Option<CellType> {
        let t = declared.trim().to_ascii_lowercase();
        let base = t.split('(').next().unwrap_or("").trim();
        Some(match base {
            "smallint" | "int2" => CellType::Int2,
            "integer" | "int" | "int4" => CellType::Int4,
            "bigint" | "int8" => CellType::Int8,
            "numeric" | "decimal" => CellType::Numeric,
            "real" | "float4" => CellType::Float4,
            "double precision" | "float8" | "double" => CellType::Float8,
            "text" => CellType::Text,
            "varchar" | "character varying" => CellType::Raw(oid::VARCHAR),
            "char" | "character" | "bpchar" => CellType::Raw(oid::BPCHAR),
            "date" => CellType::Date,
            "timestamp" | "timestamp without time zone" => CellType::Timestamp,
            "timestamptz" | "timestamp with time zone" => CellType::Timestamptz,
            "boolean" | "bool" => CellType::Bool,
            _ => return None,
        })
    }

    /// PostgreSQL's result type of an aggregate over an argument of type `argument`
    /// (PostgreSQL's `pg_aggregate` for the built-in aggregates): `sum` of `int2`/`int4` is
    /// `int8`, of `int8` and `numeric` is `numeric`; `avg`, the variances and standard
    /// deviations of integers and numerics are `numeric`, of reals `float8`; a discrete
    /// quantile (`min`, `max`, `percentile_disc`) has the argument's type, a continuous one
    /// (`percentile_cont`, `median`) `float8`. `None` for the argument when its type is not
    /// known: `float8`, as pgdp always sent.
    pub fn of_aggregate(function: Aggregation, argument: Option<CellType>) -> CellType {
        use CellType as T;
        match (function, argument) {
            (Aggregation::Count, _) => T::Int8,
            (Aggregation::Sum, Some(T::Int2 | T::Int4)) => T::Int8,
            (Aggregation::Sum, Some(T::Int8 | T::Numeric)) => T::Numeric,
            (Aggregation::Sum, Some(T::Float4)) => T::Float4,
            (Aggregation::Moment, Some(T::Int2 | T::Int4 | T::Int8 | T::Numeric)) => T::Numeric,
            (Aggregation::Discrete, Some(t)) if t.is_number() => t,
            _ => T::Float8,
        }
    }

    /// The range of an integer type.
    fn integer_range(self) -> Option<(i64, i64)> {
        match self {
            CellType::Int8 => Some((i64::MIN, i64::MAX)),
            CellType::Int4 => Some((i32::MIN.into(), i32::MAX.into())),
            CellType::Int2 => Some((i16::MIN.into(), i16::MAX.into())),
            _ => None,
        }
    }
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

/// Families of aggregates with the same rule for their result type ([`CellType::of_aggregate`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Aggregation {
    /// `count`.
    Count,
    /// `sum`.
    Sum,
    /// `avg`, `var_*`, `stddev_*`.
    Moment,
    /// `min`, `max`, `percentile_disc`.
    Discrete,
    /// `percentile_cont`, `median`.
    Continuous,
}

impl Cell {
    /// A value PostgreSQL printed as text for a column of type `ty` (NULL as `None`).
    pub fn of_text(ty: CellType, text: Option<String>) -> Cell {
        let Some(t) = text else { return Cell::Null };
        match ty {
            CellType::Int8 | CellType::Int4 | CellType::Int2 => {
                t.parse().map(Cell::Int).unwrap_or(Cell::Text(t))
            }
            CellType::Float8 | CellType::Float4 => match t.parse::<f64>() {
                Ok(f) if f.is_finite() => Cell::Float(f),
                _ => Cell::Text(t),
            },
            CellType::Bool => Cell::Bool(t == "t"),
            _ => Cell::Text(t),
        }
    }

    /// The cell as a value of type `ty`, by post-processing that keeps its meaning: a real
    /// released for an integer type (a noisy sum of integers, a noisy minimum of an integer
    /// column) is rounded to the nearest integer and clamped into the type's range; an integer
    /// for a real type becomes a real; text stays text (keys come as PostgreSQL printed them).
    pub fn conform(self, ty: CellType) -> Cell {
        if let Some((lo, hi)) = ty.integer_range() {
            return match self {
                Cell::Int(i) => Cell::Int(i.clamp(lo, hi)),
                // `as` saturates, and a released real is never NaN.
                Cell::Float(f) => Cell::Int((f.round() as i64).clamp(lo, hi)),
                other => other,
            };
        }
        match (ty, self) {
            (CellType::Float8 | CellType::Float4, Cell::Int(i)) => Cell::Float(i as f64),
            (_, other) => other,
        }
    }
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
