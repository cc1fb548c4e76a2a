//! `MIN`, `MAX`, `MEDIAN` and `PERCENTILE_DISC` of a date or a timestamp (the BI card "first
//! and last date"): the DP quantile of the date's day number, `d - DATE '2000-01-01'`, or of the
//! timestamp's epoch seconds, `EXTRACT(EPOCH FROM ts)`, turned back into a date or timestamp.
//!
//! # Invariants
//! - A call over a `date` argument is replaced, before the statement is analysed again, by
//!   `DATE '2000-01-01' + CAST(ROUND(<call>(d - DATE '2000-01-01')) AS integer)`: the quantile
//!   of an integer with the column's bounds (the policy's `lower`/`upper` dates, as day numbers)
//!   through the quantile mechanism like any number's, and the date computed from the released
//!   value by PostgreSQL as post-processing. Its type is `date`, as PostgreSQL's `MIN(date)`.
//! - A call over a `timestamp` or `timestamptz` column is replaced by
//!   `TIMESTAMP[TZ] '1970-01-01 00:00:00[+00]' + CAST(ROUND(<call>(LEAST(GREATEST(EXTRACT(EPOCH
//!   FROM ts), L), U))) AS double precision) * INTERVAL '1 second'`, `L`/`U` the policy's bounds
//!   as epoch seconds: the quantile of a number clamped into public bounds, the timestamp again
//!   post-processing, of the column's own type (with or without time zone, from its declared
//!   type), as PostgreSQL types `MIN(ts)`. Only a bare column has bounds: a timestamp's bounds
//!   are never inherited by an expression (see `expr.rs`), and the hint for an expression shows
//!   the monotone form (`date_trunc('day', MIN(ts))`).
//! - A date or timestamp argument without bounds is refused (42501) with the policy keys to
//!   declare; nothing about the data decides the bounds.
//! - `PERCENTILE_CONT` of a date is refused by PostgreSQL itself and stays refused here.

use super::moments::CallRewrite;
use super::*;

/// PostgreSQL's date epoch, whose day number is 0.
const EPOCH: &str = "DATE '2000-01-01'";

impl Analyzer<'_> {
    /// `query` with every quantile of a date replaced (see the module's invariants), or
    /// `None` when it has none.
    pub(super) fn date_quantiles_as_days(
        &mut self,
        query: &ast::Query,
    ) -> Result<Option<ast::Query>> {
        let mut found = false;
        let _ = ast::visit_expressions(query, |e| {
            found |= matches!(e, Expr::Function(f) if quantile_name(f).is_some());
            std::ops::ControlFlow::<()>::Continue(())
        });
        if !found {
            return Ok(None);
        }
        let rewrite: CallRewrite = |this, f| this.date_quantile(f);
        let rewritten = self.rewrite_calls(query, rewrite)?;
        Ok((rewritten != *query).then_some(rewritten))
    }

    /// One call as the date of its quantile of day numbers, or `None` when it is no quantile of
    /// a date (the ordinary path analyses it, and reports what is wrong with it).
    fn date_quantile(&mut self, f: &ast::Function) -> Result<Option<Expr>> {
        let Some(name) = quantile_name(f) else {
            return Ok(None);
        };
        if f.over.is_some() {
            return Ok(None);
        }
        let mut call = f.clone();
        let argument: &mut Expr = if name == "percentile_disc" {
            match call.within_group.as_mut_slice() {
                [ob] => &mut ob.expr,
                _ => return Ok(None),
            }
        } else {
            match &mut call.args {
                FunctionArguments::List(list) => match list.args.as_mut_slice() {
                    [FunctionArg::Unnamed(FunctionArgExpr::Expr(e))] => e,
                    _ => return Ok(None),
                },
                _ => return Ok(None),
            }
        };
        let Ok(info) = self.expr(&mut argument.clone(), Role::Argument) else {
            return Ok(None);
        };
        if info.ty == Some(ColumnType::Timestamp) {
            let (seconds, origin) = self.timestamp_seconds(&name, argument)?;
            *argument = seconds;
            return parse_expr(&format!(
                "({origin} + CAST(ROUND({call}) AS double precision) * INTERVAL '1 second')"
            ))
            .map(Some);
        }
        if info.ty != Some(ColumnType::Date) {
            return Ok(None);
        }
        if info.bounds.is_none() {
            let column = info.column.as_deref().unwrap_or("the date column");
            return Err(Error::forbidden(
                format!("{name} of {argument} needs bounds on its dates"),
                format!("Declare the range of {column} in the policy as dates, e.g. lower: '2015-01-01', upper: '2026-12-31'; a DP quantile is computed over bounded values."),
            ));
        }
        let days = parse_expr(&format!("({argument}) - {EPOCH}"))?;
        *argument = days;
        parse_expr(&format!("({EPOCH} + CAST(ROUND({call}) AS integer))")).map(Some)
    }

    /// The argument of a quantile of a timestamp as clamped epoch seconds, and the origin those
    /// count from, of the column's type: see the module's invariants.
    fn timestamp_seconds(&self, name: &str, argument: &Expr) -> Result<(Expr, &'static str)> {
        let mut bare = argument;
        while let Expr::Nested(inner) = bare {
            bare = inner;
        }
        let column = match self.column_ref(bare) {
            Ok(Some((idx, col))) => self.tables[idx]
                .1
                .column(&col)
                .map(|c| (format!("{}.{}", self.tables[idx].0.table, c.name), c)),
            _ => None,
        };
        let Some((qualified, column)) = column else {
            return Err(Error::forbidden(
                format!("{name} of the timestamp expression {argument}"),
                format!("pgdp answers {name} of a timestamp column with declared bounds. For a monotone function of one, apply it to the answer: {name}(date_trunc('day', ts)) is date_trunc('day', {name}(ts)), post-processing of the same release."),
            ));
        };
        let Some(bounds) = column.bounds else {
            return Err(Error::forbidden(
                format!("{name} of {argument} needs bounds on its timestamps"),
                format!("Declare the range of {qualified} in the policy as dates or timestamps, e.g. lower: '2015-01-01', upper: '2026-12-31 23:59:59'; a DP quantile is computed over bounded values."),
            ));
        };
        let seconds = parse_expr(&format!(
            "LEAST(GREATEST(EXTRACT(EPOCH FROM {argument}), {}), {})",
            bounds.lower, bounds.upper
        ))?;
        let origin = if crate::policy::with_time_zone(&column.declared_type) {
            "TIMESTAMPTZ '1970-01-01 00:00:00+00'"
        } else {
            "TIMESTAMP '1970-01-01 00:00:00'"
        };
        Ok((seconds, origin))
    }
}

/// The name of a quantile call that has a date form.
fn quantile_name(f: &ast::Function) -> Option<String> {
    let name = function_name(&f.name).ok()?;
    matches!(name.as_str(), "min" | "max" | "median" | "percentile_disc").then_some(name)
}

fn parse_expr(text: &str) -> Result<Expr> {
    parse_own_expr(text, "a date quantile")
}
