//! The budget view: `SHOW pgdp.budget` and `SELECT … FROM pgdp.budget`, the analyst's own
//! balance as the ledger records it. Reading it costs nothing and reveals nothing about the data.

use sqlparser::ast::{Expr, SelectItem};

use crate::error::{Error, Result};
use crate::output::{Cell, CellType, OutColumn};

use super::dp::limit_of;
use super::{ClientRows, Session, Shared};

/// Columns of `SHOW pgdp.budget`: the balance, then how many more queries like this session's
/// last charged one the analyst's budget admits (NULL before the session's first charge), then
/// when a renewing budget's window ends (`2026-11-25 00:00 UTC`; NULL for a budget that never
/// renews): for a renewing budget the balance is the current window's. `SHOW pgdp.budget` and
/// `SELECT *` include `renews_at` only for a renewing budget, so a budget without a `period`
/// shows the seven columns it always showed; it can still be selected by name.
pub(super) fn budget_columns() -> Vec<OutColumn> {
    let mut columns: Vec<OutColumn> = [
        "epsilon_total",
        "epsilon_spent",
        "epsilon_remaining",
        "delta_total",
        "delta_spent",
        "delta_remaining",
    ]
    .iter()
    .map(|n| OutColumn::new(*n, CellType::Float8))
    .collect();
    columns.push(OutColumn::new("queries_like_last", CellType::Int8));
    columns.push(OutColumn::new("renews_at", CellType::Text));
    columns
}

/// Which columns of the budget view a statement asks for.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum BudgetColumns<'s> {
    /// All of them, in order (`SHOW pgdp.budget`, `SELECT *`).
    All,
    /// These items of the SELECT list (plain column names or `*`).
    Listed(&'s [SelectItem]),
}

impl BudgetColumns<'_> {
    /// The names of the columns asked for, in order, for a budget that does not renew; 42703
    /// for an unknown one.
    pub fn names(&self) -> Result<Vec<String>> {
        self.names_for(false)
    }

    /// The names of the columns asked for, in order: `*` and `SHOW` include `renews_at` only
    /// when the budget `renews`; 42703 for an unknown one.
    pub fn names_for(&self, renews: bool) -> Result<Vec<String>> {
        let all: Vec<String> = budget_columns().into_iter().map(|c| c.name).collect();
        let shown: Vec<String> = all
            .iter()
            .filter(|name| renews || name.as_str() != "renews_at")
            .cloned()
            .collect();
        let BudgetColumns::Listed(items) = self else {
            return Ok(shown);
        };
        let mut names = Vec::new();
        for item in *items {
            match item {
                SelectItem::Wildcard(_) | SelectItem::QualifiedWildcard(..) => {
                    names.extend(shown.iter().cloned());
                }
                SelectItem::UnnamedExpr(Expr::Identifier(i)) => {
                    let name = i.value.to_ascii_lowercase();
                    if !all.contains(&name) {
                        return Err(Error::UnknownColumn { name: i.value.clone() });
                    }
                    names.push(name);
                }
                _ => {
                    return Err(Error::unsupported(
                        "expressions on pgdp.budget",
                        "Select its columns by name: epsilon_total, epsilon_spent, epsilon_remaining, delta_total, delta_spent, delta_remaining, queries_like_last, renews_at.",
                    ))
                }
            }
        }
        Ok(names)
    }
}

impl Session {
    /// The analyst's balance, with the columns asked for.
    pub(super) async fn budget_view(
        &self,
        shared: &Shared,
        columns: BudgetColumns<'_>,
    ) -> Result<ClientRows> {
        let limit = limit_of(&self.analyst.budget)?;
        let (b, window) = shared
            .ledger
            .balance_with_window(&self.analyst.name, &limit)
            .await?;
        let all = budget_columns();
        // ε spent is what the accountant proves for the history (Σ ε for pure ε alone, else the
        // best order's conversion); δ spent and remaining are partition selection's share.
        let proven =
            crate::budget::guarantee(&b.limit, &b.spent).map_or(b.spent.epsilon, |g| g.epsilon);
        let like_last = self.last_cost.map_or(Cell::Null, |cost| {
            let k = crate::budget::repeats(&b.limit, &b.spent, &cost);
            Cell::Int(i64::try_from(k).unwrap_or(i64::MAX))
        });
        let values = [
            b.limit.epsilon,
            proven,
            b.remaining.epsilon,
            b.limit.delta,
            b.spent.delta,
            b.remaining.delta,
        ]
        .map(|v| Cell::Float(v.to_f64()))
        .into_iter()
        .chain([like_last])
        .chain([window.map_or(Cell::Null, |w| Cell::Text(w.until()))])
        .collect::<Vec<_>>();
        let mut out_columns = Vec::new();
        let mut row = Vec::new();
        for name in columns.names_for(self.analyst.budget.period.is_some())? {
            let i = all
                .iter()
                .position(|c| c.name == name)
                .ok_or_else(|| Error::UnknownColumn { name: name.clone() })?;
            out_columns.push(all[i].clone());
            row.push(values[i].clone());
        }
        Ok(ClientRows::computed(out_columns, vec![row]))
    }
}
