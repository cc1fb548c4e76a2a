//! The lookup form of a join on the privacy unit: when the plan joins a table of rows to a table
//! that has at most one row per unit ([`UnitLookup`]), stage 2 aggregates the rows per unit
//! *before* the join, and the lookup table is joined to one row per unit (docs/privacy.md,
//! "Lookups on the privacy unit"):
//!
//! ```text
//! __dp_rows     AS (SELECT rows.unit AS __dp_unit, <keys of rows>, <arguments>
//!                   FROM rows WHERE <conditions on rows>)
//! __dp_below    AS (stage 2 over __dp_rows, grouped by __dp_unit and the keys of rows)
//! __dp_per_unit AS (SELECT __dp_below.*, <keys of the lookup table>
//!                   FROM __dp_below JOIN lookup ON __dp_below.__dp_unit = lookup.key
//!                   WHERE <conditions on the lookup table>)
//! ```
//!
//! [`split`] decides whether a plan can be written so, and where each key and condition goes.
//!
//! Invariants:
//! - `__dp_per_unit` holds the rows of the general form's stage 2, value for value. In the
//!   general form a unit's joined rows are its rows of `rows` that pass the conditions on
//!   `rows`, each paired with the one lookup row of the unit (the key is unique upstream), and
//!   kept if that row passes the conditions on the lookup table: so the unit's rows in each
//!   group are the same, and so are its counts and sums. A unit with no lookup row, or a NULL
//!   unit, has no joined row in either form.
//! - Only expressions whose every column is a column of one of the two tables (through its
//!   alias) are placed; arguments must read the rows table alone, each key and each `AND`ed
//!   condition one table. Anything else, semijoins, distinct counts and quantiles (which read
//!   `__dp_rows` row by row) keep the general form, which is always sound.

use std::collections::BTreeSet;

use sqlparser::ast::Expr;

use super::{Argument, Measure};
use crate::dp::plan::{Plan, UnitLookup};

/// Where the lookup form puts each part of a plan.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Split<'a> {
    /// The join.
    pub lookup: &'a UnitLookup,
    /// The keys (indices into the plan's keys) computed from the rows table, below the join.
    pub below_keys: Vec<usize>,
    /// The keys computed from the lookup table, above the join.
    pub above_keys: Vec<usize>,
    /// The conditions on the rows table (`AND`ed).
    pub below_filter: Vec<Expr>,
    /// The conditions on the lookup table (`AND`ed).
    pub above_filter: Vec<Expr>,
}

/// The table an expression reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Below,
    Above,
}

/// The lookup form of `plan`, if it has a [`UnitLookup`] and every part of it can be placed on
/// one side of the join; `None` keeps the general form.
pub(super) fn split<'a>(
    plan: &'a Plan,
    arguments: &[Argument],
    measures: &[Measure],
) -> Option<Split<'a>> {
    let lookup = plan.unit_lookup()?;
    let row_level = measures
        .iter()
        .any(|m| matches!(m, Measure::Distinct(_) | Measure::Quantile(..)));
    if row_level || !plan.semijoins.is_empty() {
        return None;
    }
    let side_of = |aliases: BTreeSet<String>| -> Option<Side> {
        if aliases.iter().all(|a| *a == lookup.rows_unit.alias) {
            Some(Side::Below)
        } else if aliases.iter().all(|a| *a == lookup.key.alias) {
            Some(Side::Above)
        } else {
            None
        }
    };
    for a in arguments {
        if side_of(a.text.aliases()?)? != Side::Below {
            return None;
        }
    }
    let (mut below_keys, mut above_keys) = (Vec::new(), Vec::new());
    for (i, k) in plan.keys.iter().enumerate() {
        match side_of(k.expr.aliases()?)? {
            Side::Below => below_keys.push(i),
            Side::Above => above_keys.push(i),
        }
    }
    let (mut below_filter, mut above_filter) = (Vec::new(), Vec::new());
    if let Some(f) = &plan.filter {
        let mut conjuncts = Vec::new();
        crate::dp::analyze::conjuncts(f, &mut conjuncts);
        for c in conjuncts {
            match side_of(crate::dp::plan::aliases(c)?)? {
                Side::Below => below_filter.push(c.clone()),
                Side::Above => above_filter.push(c.clone()),
            }
        }
    }
    Some(Split {
        lookup,
        below_keys,
        above_keys,
        below_filter,
        above_filter,
    })
}
