//! A typed builder for the SQL pgdp generates: [`Sql`] fragments assembled by the [`sql!`]
//! macro from pgdp's own templates and typed pieces only.
//!
//! Invariants:
//! - The text of a [`Sql`] comes from string literals in pgdp's source (the macro's template
//!   must be a literal, and it reaches `format!` through `concat!`, so it cannot capture a
//!   variable by name: `sql!("{text}")` does not compile), from
//!   integers, from finite numbers printed as decimals ([`Number`]), from generated names
//!   ([`Name`], always with the reserved prefix), from quoted identifiers of the policy
//!   ([`Ident`]), and from sqlparser's printing of parsed expressions ([`Canonical`], [`Expr`],
//!   [`ColumnRef`], [`JoinOn`]). A `String` or `&str` is not a [`Fragment`], so no text from
//!   elsewhere (the analyst's, or formatted ad hoc) can be spliced in: the compiler refuses it.
//! - Fragments are rendered once, into the one statement [`crate::dp::rewrite`] checks and wraps
//!   as its `UpstreamSql`.

use std::fmt::Write;

use sqlparser::ast::{Expr, Query};

use crate::dp::plan::{Canonical, ColumnRef, JoinOn, TableRef, Unit, RESERVED_PREFIX};
use crate::error::{Error, Result};

/// A fragment of generated SQL. Only [`sql!`] and the constructors here make one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sql(String);

/// Something that may be spliced into a [`Sql`] template: implemented only for typed pieces.
pub trait Fragment {
    /// Appends the piece's SQL text.
    fn write_sql(&self, out: &mut String);
}

/// Displays a [`Fragment`] as its SQL text (what the [`sql!`] macro formats).
///
/// ```
/// // A typed piece is.
/// let piece = pgdp::dp::sql::Piece(&pgdp::dp::sql::Number(2.5));
/// assert_eq!(piece.to_string(), "2.5");
/// ```
///
/// ```compile_fail,E0277
/// // Text is not a fragment: it cannot be spliced into generated SQL.
/// let analyst = String::from("1; DROP TABLE demo.people");
/// let _ = pgdp::dp::sql::Piece(&analyst);
/// ```
///
/// ```compile_fail,E0277
/// // Nor is a string slice.
/// let _ = pgdp::dp::sql::Piece(&"SELECT income FROM demo.people");
/// ```
pub struct Piece<'a, T: Fragment + ?Sized>(pub &'a T);

impl<T: Fragment + ?Sized> std::fmt::Display for Piece<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut out = String::new();
        self.0.write_sql(&mut out);
        f.write_str(&out)
    }
}

/// Assembles a [`Sql`] from a literal template and [`Fragment`]s:
/// `sql!("SUM(LEAST({}, {}))", value, Number(cap))`.
macro_rules! sql {
    ($template:literal $(, $piece:expr)* $(,)?) => {
        // `concat!` makes the template "expanded from a macro", so it cannot capture a variable
        // by name (`{text}`): every piece must be an argument, and so a `Fragment`.
        $crate::dp::sql::Sql::assembled(format!(
            concat!($template) $(, $crate::dp::sql::Piece(&$piece))*
        ))
    };
}
pub(crate) use sql;

impl Sql {
    /// Only for [`sql!`]: its template is a literal and its pieces are fragments. Crate-private
    /// (the macro is too), so no caller outside pgdp can label text as SQL:
    ///
    /// ```compile_fail,E0624
    /// let _ = pgdp::dp::sql::Sql::assembled("SELECT * FROM demo.people".to_string());
    /// ```
    ///
    /// whereas pgdp's own literal text is a fragment:
    ///
    /// ```
    /// let _ = pgdp::dp::sql::Sql::text("COUNT(*)");
    /// ```
    pub(crate) fn assembled(text: String) -> Sql {
        Sql(text)
    }

    /// A fragment of pgdp's own text.
    pub fn text(text: &'static str) -> Sql {
        Sql(text.to_string())
    }

    /// `items` separated by `separator` (a literal, such as `", "` or `" AND "`).
    pub fn join(items: impl IntoIterator<Item = Sql>, separator: &'static str) -> Sql {
        let mut out = String::new();
        for (i, item) in items.into_iter().enumerate() {
            if i > 0 {
                out.push_str(separator);
            }
            out.push_str(&item.0);
        }
        Sql(out)
    }

    /// Appends another fragment.
    pub fn push(&mut self, more: Sql) {
        self.0.push_str(&more.0);
    }

    /// Whether the fragment is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The rendered text, once, for the statement that wraps it.
    pub fn into_string(self) -> String {
        self.0
    }
}

/// SQL for the shadow catalog, the data-free PostgreSQL database pgdp keeps beside the upstream
/// (its tables have the upstream's columns and no rows, its public tables their declared
/// columns): it types statements and evaluates post-processing, set operations, calendars and
/// folded constants over values written into it as literals.
///
/// Invariant: its text reads no upstream data. It is made only inside pgdp (the constructor is
/// crate-private) from released rows written as literals
/// ([`crate::dp::release::post::post_sql`], the session's set operations and calendars), from
/// constant expressions of the analyst's statement (time folding, a calendar's series) or from the
/// policy's names, so no caller outside pgdp can send text of its own to the shadow catalog, and
/// what the shadow answers ([`crate::dp::release::Evaluated`]) is a function of released values
/// and constants.
///
/// ```compile_fail,E0624
/// let _ = pgdp::dp::sql::ShadowSql::new("SELECT 1".to_string());
/// ```
///
/// whereas post-processing SQL over released rows is one:
///
/// ```
/// use pgdp::dp::analyze::{analyze, Context};
/// let policy = pgdp::policy::parse(include_str!(concat!(
///     env!("CARGO_MANIFEST_DIR"),
///     "/policies/demo.yaml"
/// )))
/// .expect("policy");
/// let query = match pgdp::session::classify::classify("SELECT COUNT(*) * 2 AS twice FROM demo.people")
///     .expect("one query")
///     .pop()
/// {
///     Some(pgdp::session::classify::Statement::Query(q)) => q,
///     _ => unreachable!(),
/// };
/// let ctx = Context { policy: &policy, search_path: vec!["demo".to_string()] };
/// let plan = analyze(&query, &ctx).expect("admitted");
/// let post = plan.post().expect("an expression over an aggregate is post-processing");
/// let names = pgdp::dp::release::columns(&plan, false);
/// let inputs: Vec<_> = names.iter().map(|c| c.ty).collect();
/// let sql: pgdp::dp::sql::ShadowSql =
///     pgdp::dp::release::post::post_sql(post, false, &names, &inputs, &[]).expect("sql");
/// assert!(sql.as_str().contains("jsonb_array_elements"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShadowSql(String);

impl ShadowSql {
    /// Only pgdp's own SQL for the shadow catalog (see the type's invariant).
    pub(crate) fn new(text: String) -> ShadowSql {
        ShadowSql(text)
    }

    /// The same SQL after `setting`, the session's `SET LOCAL TimeZone …; ` from
    /// [`crate::upstream::time_zone_setting`] (checked there), so dates and times read and print
    /// in the analyst's zone.
    pub(crate) fn in_zone(self, setting: &str) -> ShadowSql {
        ShadowSql(format!("{setting}{}", self.0))
    }

    /// The text, for the shadow catalog's connection.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for ShadowSql {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl<T: Fragment + ?Sized> Fragment for &T {
    fn write_sql(&self, out: &mut String) {
        (**self).write_sql(out);
    }
}

impl Fragment for Sql {
    fn write_sql(&self, out: &mut String) {
        out.push_str(&self.0);
    }
}

impl Fragment for Canonical {
    fn write_sql(&self, out: &mut String) {
        out.push_str(self.as_str());
    }
}

impl Fragment for Expr {
    fn write_sql(&self, out: &mut String) {
        let _ = write!(out, "{self}");
    }
}

impl Fragment for Query {
    fn write_sql(&self, out: &mut String) {
        let _ = write!(out, "{self}");
    }
}

impl Fragment for ColumnRef {
    fn write_sql(&self, out: &mut String) {
        let _ = write!(out, "{self}");
    }
}

impl Fragment for Unit {
    fn write_sql(&self, out: &mut String) {
        match self {
            Unit::Column(c) => c.write_sql(out),
            Unit::Row { alias } => {
                Ident(alias).write_sql(out);
                out.push_str(".ctid");
            }
        }
    }
}

impl Fragment for JoinOn {
    fn write_sql(&self, out: &mut String) {
        let _ = write!(out, "{self}");
    }
}

macro_rules! integer_fragment {
    ($($t:ty),*) => {$(
        impl Fragment for $t {
            fn write_sql(&self, out: &mut String) {
                let _ = write!(out, "{self}");
            }
        }
    )*};
}
integer_fragment!(u16, u64, usize, i64);

/// A number, printed as the shortest decimal that round-trips the `f64` (never in exponent
/// notation, which PostgreSQL would read as `double precision`). Bounds are finite (the policy
/// validates them); a non-finite value would print as a name PostgreSQL refuses, never as a
/// number.
#[derive(Debug, Clone, Copy)]
pub struct Number(pub f64);

impl Fragment for Number {
    fn write_sql(&self, out: &mut String) {
        let x = self.0;
        let s = format!("{x}");
        if s.contains('e') || s.contains('E') {
            let _ = write!(out, "{x:.1}");
        } else {
            out.push_str(&s);
        }
    }
}

/// A generated name: the reserved prefix, a literal stem and an index (`__dp_k0`).
#[derive(Debug, Clone, Copy)]
pub struct Name(pub &'static str, pub usize);

impl Fragment for Name {
    fn write_sql(&self, out: &mut String) {
        let _ = write!(out, "{RESERVED_PREFIX}{}{}", self.0, self.1);
    }
}

/// A quoted identifier of the policy or a generated alias (`"demo"`, `"__dp_t0"`); a `"` inside
/// is doubled.
#[derive(Debug, Clone, Copy)]
pub struct Ident<'a>(pub &'a str);

impl Fragment for Ident<'_> {
    fn write_sql(&self, out: &mut String) {
        out.push('"');
        out.push_str(&self.0.replace('"', "\"\""));
        out.push('"');
    }
}

/// The positional expression arguments of a call, in order (named and wildcard arguments left
/// out; none for a call without an argument list).
pub fn expression_arguments(f: &sqlparser::ast::Function) -> Vec<&Expr> {
    match &f.args {
        sqlparser::ast::FunctionArguments::List(list) => list
            .args
            .iter()
            .filter_map(|a| match a {
                sqlparser::ast::FunctionArg::Unnamed(sqlparser::ast::FunctionArgExpr::Expr(e)) => {
                    Some(e)
                }
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    }
}

/// A table of FROM with its alias: `"schema"."name" AS "alias"`, or a subquery rendered by
/// `source` (the rewrite binds its parameters there) `(…) AS "alias"`.
pub fn relation(table: &TableRef, source: impl Fn(&Query) -> Result<Sql>) -> Result<Sql> {
    let alias = Ident(&table.alias);
    Ok(match &table.source {
        Some(q) => sql!("({}) AS {}", source(q)?, alias),
        None => {
            let (schema, name) = table
                .table
                .split_once('.')
                .ok_or_else(|| Error::internal("unqualified table"))?;
            sql!("{}.{} AS {}", Ident(schema), Ident(name), alias)
        }
    })
}

/// The FROM clause of tables and their join conditions (one per table after the first); a
/// subquery's SQL is rendered by `source` (the rewrite binds its parameters there).
pub fn from_clause(
    tables: &[TableRef],
    joins: &[JoinOn],
    source: impl Fn(&Query) -> Result<Sql>,
) -> Result<Sql> {
    let mut from = Sql::text("");
    for (i, t) in tables.iter().enumerate() {
        let relation = relation(t, &source)?;
        if i == 0 {
            from.push(relation);
        } else {
            let on = joins
                .get(i - 1)
                .ok_or_else(|| Error::internal("missing join condition"))?;
            let join = if on.left { " LEFT JOIN " } else { " JOIN " };
            from.push(sql!("{}{} ON {}", Sql::text(join), relation, on));
        }
    }
    Ok(from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fragments_render_as_sql() {
        let k = Name("k", 0);
        let list = Sql::join([sql!("{}", k), sql!("{}", Name("m", 3))], ", ");
        let s = sql!(
            "SELECT {} FROM {}.{} WHERE x < {} AND y > {}",
            list,
            Ident("demo"),
            Ident("we\"ird"),
            Number(2.5e20),
            Number(-0.125)
        );
        assert_eq!(
            s.into_string(),
            "SELECT __dp_k0, __dp_m3 FROM \"demo\".\"we\"\"ird\" WHERE x < 250000000000000000000 AND y > -0.125"
        );
        assert_eq!(sql!("{}", Number(f64::NAN)).into_string(), "NaN");
    }
}
