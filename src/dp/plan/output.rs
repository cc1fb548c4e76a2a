//! The outputs of a plan and what pgdp computes after the release: each output's source, the
//! post-processing PostgreSQL evaluates over the released relation, HAVING, ORDER BY, and the
//! bound parameters' slots. Released values only: nothing here reads the data.

use crate::policy::ColumnType;

/// One output column of the query.
#[derive(Debug, Clone, PartialEq)]
pub struct Output {
    /// Output column name.
    pub name: String,
    /// What the column is.
    pub source: OutputSource,
}

/// Where an output column comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum OutputSource {
    /// The value of group key `i`.
    Key(usize),
    /// The released value of aggregate `i`.
    Aggregate(usize),
    /// An expression over released values that PostgreSQL evaluates after the release
    /// ([`PostProcessing`]): the select item `i` of its SQL.
    Computed(usize),
    /// `GROUPING(…)` of the keys listed (by index), with grouping sets: an int4 bit mask, the
    /// first key the highest bit, a bit set where the key is not in the row's grouping set.
    Grouping(Vec<usize>),
}

/// Name of the relation of released values in [`PostProcessing::sql`]: one row per released
/// group, with the columns `k0`, `k1`, … (the group keys) and `a0`, `a1`, … (the released
/// aggregates), and with grouping sets `g0`, `g1`, … (1 where the key is not in the row's
/// grouping set, else 0: what `GROUPING(key)` gives).
pub const RELEASED_RELATION: &str = "__dp_released";

/// Post-processing of released values that PostgreSQL itself evaluates, so that its functions,
/// operators, casts, windows, sort order and result types are PostgreSQL's: `ROUND(AVG(x), 2)`,
/// `100.0 * COUNT(*) / SUM(COUNT(*)) OVER ()`, CASE over aggregates, HAVING / ORDER BY / LIMIT
/// on them, an outer query over an aggregate subquery.
///
/// Invariants (checked by [`crate::dp::analyze`]): [`PostProcessing::sql`] reads no table; its
/// only relation is [`RELEASED_RELATION`] (released keys and noisy aggregates), its only other
/// inputs are the query's literals, and it calls only pure built-in functions from an
/// allow-list. It runs on the shadow catalog (no rows) after the release, so it is
/// post-processing: it costs no budget and reveals nothing beyond the released values.
#[derive(Debug, Clone, PartialEq)]
pub struct PostProcessing {
    /// The SQL over [`RELEASED_RELATION`], one select item per output column.
    pub(in crate::dp) sql: String,
    /// [`PostProcessing::sql`] with a column `<name>_error95` after each output that is an
    /// aggregate as released, read from the column `e<i>` of [`RELEASED_RELATION`] (the 95%
    /// error bound of aggregate `i`): the SQL under `pgdp.accuracy`. `None` where the outputs
    /// are not the released aggregates (an outer query over an aggregate subquery, DISTINCT).
    pub(in crate::dp) errors: Option<String>,
    /// The analyst's statement with the group keys and the aggregates as its select list (and
    /// no HAVING, ORDER BY or LIMIT): described on the shadow catalog, it gives the PostgreSQL
    /// types of the released relation's columns.
    pub(in crate::dp) measures: String,
}

impl PostProcessing {
    /// The SQL over [`RELEASED_RELATION`].
    pub fn sql(&self) -> &str {
        &self.sql
    }

    /// The SQL over [`RELEASED_RELATION`] with `_error95` columns, if the outputs have them.
    pub fn with_errors(&self) -> Option<&str> {
        self.errors.as_deref()
    }

    /// The statement whose description types the released relation.
    pub fn measures_statement(&self) -> &str {
        &self.measures
    }
}

/// A post-processing predicate or sort expression over released values.
#[derive(Debug, Clone, PartialEq)]
pub enum Post {
    /// Output or aggregate value by index into `Plan::aggregates`.
    Aggregate(usize),
    /// Group key value.
    Key(usize),
    /// A literal number.
    Number(f64),
    /// A literal string.
    Text(String),
    /// NULL.
    Null,
    /// A comparison or arithmetic / boolean operator.
    Binary(Box<Post>, PostOp, Box<Post>),
    /// NOT.
    Not(Box<Post>),
    /// Unary minus.
    Negate(Box<Post>),
    /// IS NULL / IS NOT NULL.
    IsNull(Box<Post>, bool),
}

/// Operators allowed in HAVING.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PostOp {
    /// `=`
    Eq,
    /// `<>`
    NotEq,
    /// `<`
    Lt,
    /// `<=`
    LtEq,
    /// `>`
    Gt,
    /// `>=`
    GtEq,
    /// `AND`
    And,
    /// `OR`
    Or,
    /// `+`
    Plus,
    /// `-`
    Minus,
    /// `*`
    Multiply,
    /// `/`
    Divide,
}

/// An ORDER BY item applied by pgdp to released rows.
#[derive(Debug, Clone, PartialEq)]
pub struct SortKey {
    /// The value to sort by.
    pub value: Post,
    /// Ascending?
    pub ascending: bool,
    /// NULLs first?
    pub nulls_first: bool,
}

/// A parameter `$n` of the extended protocol.
#[derive(Debug, Clone, PartialEq)]
pub struct Parameter {
    /// 1-based index.
    pub index: usize,
    /// Type inferred from the context (the column compared with).
    pub ty: ColumnType,
    /// The declared SQL type of that column, when the parameter is compared with a column.
    pub declared: Option<String>,
}
