//! Post-processing of released values by PostgreSQL ([`crate::dp::plan::PostProcessing`]): the
//! SQL that evaluates it over released rows, and the answer it gives.
//!
//! Invariants:
//! - The only rows the SQL reads are a [`Released`]'s, written into it as one JSON literal: the
//!   released keys and noisy aggregates, nothing from the upstream.
//! - Its answer becomes a [`Released`] again only through [`Released::post_processed`], which
//!   takes the released rows it is computed from and hands the [`ShadowSql`] it wrote over them
//!   to an evaluation that can only answer an [`Evaluated`], the shadow catalog's answer to SQL
//!   pgdp wrote (neither type can be made outside pgdp); so rows from post-processing are
//!   released rows, and the typed pipeline's rule that client rows come from a release still
//!   holds.

use std::future::Future;

use crate::dp::plan::{Plan, PostProcessing, RELEASED_RELATION};
use crate::dp::sql::ShadowSql;
use crate::error::{Error, Result};
use crate::output::{Cell, CellType, OutColumn};

use super::{Evaluated, Released};

/// A cell as PostgreSQL's text input reads it back (the text pgdp sends for it).
fn cell_text(cell: &Cell) -> Option<String> {
    match cell {
        Cell::Null => None,
        Cell::Int(i) => Some(i.to_string()),
        Cell::Float(f) => Some(f.to_string()),
        Cell::Text(t) => Some(t.clone()),
        Cell::Bool(b) => Some(if *b { "t" } else { "f" }.to_string()),
    }
}

/// `text` as a JSON string.
fn json_string(text: &str, out: &mut String) {
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// `text` as a PostgreSQL escape-string literal (`E'…'`), whatever
/// `standard_conforming_strings` is.
fn escape_literal(text: &str) -> String {
    format!("E'{}'", text.replace('\\', "\\\\").replace('\'', "\\'"))
}

/// The SQL that evaluates `post` over `rows`, the released relation whose columns have the
/// PostgreSQL types `inputs` (`k<i>` for the keys, then `a<i>` for the aggregates, as
/// [`super::columns`] names them). With no rows it only types the answer (the shadow catalog
/// prepares it before anything is charged). The SQL is checked to be one statement with no
/// comment (an internal error otherwise), so no piece of the analyst's query can end it or hide
/// what follows, whatever it prints as.
///
/// With `accuracy` (and `_error95` columns in `post`), the SQL with them, over a released
/// relation that ends with the `e<i>` bounds ([`super::error_inputs`]).
pub fn post_sql(
    post: &PostProcessing,
    accuracy: bool,
    names: &[OutColumn],
    inputs: &[CellType],
    rows: &[Vec<Cell>],
) -> Result<ShadowSql> {
    let columns: Vec<(String, ReadAs)> = names
        .iter()
        .zip(inputs)
        .map(|(c, ty)| (c.name.clone(), ReadAs::Typed(*ty)))
        .collect();
    let sql = format!(
        "WITH \"{RELEASED_RELATION}\" AS ({}) {}",
        rows_relation(&columns, rows),
        match (accuracy, post.with_errors()) {
            (true, Some(errors)) => errors,
            _ => post.sql(),
        }
    );
    crate::dp::rewrite::check_one_statement(&sql)?;
    Ok(ShadowSql::new(sql))
}

/// How [`rows_relation`] reads a column of released rows.
#[derive(Debug, Clone, PartialEq)]
pub enum ReadAs {
    /// The cell's text, cast to the type.
    Typed(CellType),
    /// Not read: the SQL of an untyped literal (`NULL`, `'all'`) every row of a branch selects,
    /// written as such so that PostgreSQL resolves its type with the other branches' as it does
    /// for the analyst's statement.
    Constant(String),
}

/// [`rows_relation`]'s SQL (or other SQL pgdp wrote) as a query to put into a statement.
pub fn parsed_relation(sql: &str) -> Result<Box<sqlparser::ast::Query>> {
    let parsed =
        sqlparser::parser::Parser::parse_sql(&sqlparser::dialect::PostgreSqlDialect {}, sql)
            .map_err(|_| Error::internal("released rows as SQL"))?;
    match parsed.into_iter().next() {
        Some(sqlparser::ast::Statement::Query(query)) => Ok(query),
        _ => Err(Error::internal("released rows as SQL")),
    }
}

/// A `SELECT` whose rows are `rows` (released rows: keys and noisy values), written into it as
/// one JSON literal, with `columns` named and read as given. With no rows it still types them.
pub fn rows_relation(columns: &[(String, ReadAs)], rows: &[Vec<Cell>]) -> String {
    let mut json = String::from("[");
    for (r, row) in rows.iter().enumerate() {
        if r > 0 {
            json.push(',');
        }
        json.push('[');
        for (i, cell) in row.iter().enumerate() {
            if i > 0 {
                json.push(',');
            }
            match cell_text(cell) {
                Some(t) => json_string(&t, &mut json),
                None => json.push_str("null"),
            }
        }
        json.push(']');
    }
    json.push(']');
    let items: Vec<String> = columns
        .iter()
        .enumerate()
        .map(|(i, (name, read))| {
            let name = sqlparser::ast::Ident::with_quote('"', name);
            match read {
                ReadAs::Typed(ty) => {
                    format!("(\"__dp_row\" ->> {i})::{} AS {name}", ty.sql_name())
                }
                ReadAs::Constant(sql) => format!("{sql} AS {name}"),
            }
        })
        .collect();
    format!(
        "SELECT {} FROM pg_catalog.jsonb_array_elements({}::jsonb) AS \"__dp_in\"(\"__dp_row\")",
        items.join(", "),
        escape_literal(&json),
    )
}

impl Released {
    /// The analyst's answer from released rows of a plan with post-processing: `run` evaluates
    /// the SQL of [`post_sql`] over these rows on the shadow catalog
    /// ([`crate::upstream::Shadow::evaluate`], the only maker of [`Evaluated`] rows, so `run`
    /// cannot answer rows of another origin), read as `columns` (the types the shadow gave the
    /// same SQL before the charge).
    /// `inputs` are the released relation's PostgreSQL types, which the rows are first
    /// conformed to.
    pub async fn post_processed<F, Fut>(
        self,
        plan: &Plan,
        accuracy: bool,
        inputs: &[CellType],
        columns: Vec<OutColumn>,
        run: F,
    ) -> Result<Released>
    where
        F: FnOnce(ShadowSql) -> Fut,
        Fut: Future<Output = Result<Evaluated>>,
    {
        let post = plan
            .post()
            .ok_or_else(|| Error::internal("post-processing of a plan without one"))?;
        let names = super::columns(plan, accuracy);
        if names.len() != inputs.len() {
            return Err(Error::internal("released relation of another width"));
        }
        let truncated = self.truncated;
        let typed: Vec<OutColumn> = names
            .iter()
            .zip(inputs)
            .map(|(c, ty)| OutColumn::new(c.name.clone(), *ty))
            .collect();
        let conformed = self.retyped(typed);
        let sql = post_sql(post, accuracy, &names, inputs, &conformed.rows)?;
        let rows = run(sql).await?.into_rows();
        let mut out = Vec::with_capacity(rows.len());
        for row in rows {
            if row.len() != columns.len() {
                return Err(Error::internal("post-processing answered another width"));
            }
            out.push(
                row.into_iter()
                    .zip(&columns)
                    .map(|(text, c)| Cell::of_text(c.ty, text))
                    .collect(),
            );
        }
        Ok(Released {
            columns,
            rows: out,
            truncated,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn released_values_are_one_escaped_json_literal() {
        let mut out = String::new();
        json_string("a\"b\\c\nd'", &mut out);
        assert_eq!(out, "\"a\\\"b\\\\c\\u000ad'\"");
        assert_eq!(escape_literal("it's \\"), "E'it\\'s \\\\'");
    }
}
