//! The budget view: `SHOW pgdp.budget` and `SELECT … FROM pgdp.budget`, the analyst's own
//! balance as the ledger records it. Reading it costs nothing and reveals nothing about the data.

use crate::error::Result;
use crate::output::{Cell, CellType, OutColumn};

use super::dp::limit_of;
use super::route::BudgetColumns;
use super::{ClientRows, Session, Shared};

/// Columns of `SHOW pgdp.budget`.
pub(super) fn budget_columns() -> Vec<OutColumn> {
    [
        "epsilon_total",
        "epsilon_spent",
        "epsilon_remaining",
        "delta_total",
        "delta_spent",
        "delta_remaining",
    ]
    .iter()
    .map(|n| OutColumn::new(*n, CellType::Float8))
    .collect()
}

impl Session {
    /// The analyst's balance, with the columns asked for.
    pub(super) async fn budget_view(
        &self,
        shared: &Shared,
        columns: BudgetColumns<'_>,
    ) -> Result<ClientRows> {
        let limit = limit_of(&self.analyst.budget)?;
        let b = shared.ledger.balance(&self.analyst.name, &limit).await?;
        let all = budget_columns();
        let values = [
            b.limit.epsilon,
            b.spent.epsilon,
            b.remaining.epsilon,
            b.limit.delta,
            b.spent.delta,
            b.remaining.delta,
        ];
        let mut out_columns = Vec::new();
        let mut row = Vec::new();
        for name in columns.names()? {
            let i = all
                .iter()
                .position(|c| c.name == name)
                .ok_or_else(|| crate::error::Error::UnknownColumn { name: name.clone() })?;
            out_columns.push(all[i].clone());
            row.push(Cell::Float(values[i].to_f64()));
        }
        Ok(ClientRows::computed(out_columns, vec![row]))
    }
}
