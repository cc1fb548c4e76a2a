//! What a charge pays for: a DP query's upstream SQL with the cost of its mechanisms
//! ([`Statement`]), and, for a query that chooses its cap, the contribution histogram's SQL with
//! the whole cost of the histogram and the answer ([`ChoiceStatement`]).
//!
//! Invariants:
//! - The fields are private. [`Statement::of`] takes the SQL and the cost from one rewrite and
//!   its mechanisms, [`ChoiceStatement::of`] from one [`ChoicePlan`]: the cost the ledger
//!   charges ([`Priced::cost`], `Ledger::charge_for`) is the cost of the SQL that runs.
//! - The upstream runs a [`Statement`] only as `Charged<Statement>`, by value (one charge, one
//!   run), and a histogram only as `&Charged<ChoiceStatement>`, whose charge then passes to the
//!   answer's [`Statement`] through `Charged::narrowed`, which refuses an answer that costs
//!   more than what was charged.
//!
//! A statement cannot be assembled from other SQL and a lower cost:
//!
//! ```
//! use pgdp::dp::release::{Mechanisms, Statement};
//! use pgdp::dp::rewrite::Rewrite;
//! fn priced(rewrite: &Rewrite, mechanisms: &Mechanisms) -> Statement {
//!     Statement::of(rewrite, mechanisms)
//! }
//! ```
//!
//! ```compile_fail,E0451
//! use pgdp::budget::Cost;
//! use pgdp::dp::release::Statement;
//! use pgdp::dp::rewrite::Rewrite;
//! fn cheap(expensive: &Rewrite) -> Statement {
//!     Statement { sql: expensive.sql.clone(), cost: Cost::ZERO }
//! }
//! ```

use crate::budget::{Cost, Priced};
use crate::dp::rewrite::{Rewrite, UpstreamSql};

use super::bounds::ChoicePlan;
use super::Mechanisms;

/// A DP query's upstream SQL, priced by its mechanisms.
#[derive(Debug, Clone, PartialEq)]
pub struct Statement {
    sql: UpstreamSql,
    cost: Cost,
}

impl Statement {
    /// The statement of `rewrite` at the cost of `mechanisms` (built for that rewrite).
    pub fn of(rewrite: &Rewrite, mechanisms: &Mechanisms) -> Statement {
        Statement {
            sql: rewrite.sql.clone(),
            cost: mechanisms.cost,
        }
    }

    /// The SQL to run.
    pub fn sql(&self) -> &UpstreamSql {
        &self.sql
    }
}

impl Priced for Statement {
    fn cost(&self) -> Cost {
        self.cost
    }
}

/// The contribution histogram of a query that chooses its cap, priced at the whole cost of
/// the histogram and the answer at any cap it may choose.
#[derive(Debug, Clone, PartialEq)]
pub struct ChoiceStatement {
    histogram: UpstreamSql,
    cost: Cost,
}

impl ChoiceStatement {
    /// The statement of `choice`: its histogram's SQL at its whole cost.
    pub fn of(choice: &ChoicePlan) -> ChoiceStatement {
        ChoiceStatement {
            histogram: choice.sql.clone(),
            cost: choice.cost(),
        }
    }

    /// The histogram's SQL.
    pub fn histogram(&self) -> &UpstreamSql {
        &self.histogram
    }
}

impl Priced for ChoiceStatement {
    fn cost(&self) -> Cost {
        self.cost
    }
}

/// A synopsis's whole cost ([`crate::dp::mechanism::pmw::Synopsis::cost_parts`]: `2T + 1` pure
/// parts of `ε/(2T + 1)`), charged once to each analyst it answers; the charge is recorded as
/// the analyst's payment (`Ledger::synopsis_paid_with`).
#[derive(Debug, Clone, PartialEq)]
pub struct SynopsisStatement {
    synopsis: String,
    cost: Cost,
}

impl SynopsisStatement {
    /// The cost of `synopsis`: its ε rounded up to the ledger's precision, in `2T + 1` equal
    /// pure parts.
    pub fn of(synopsis: &crate::policy::Synopsis) -> crate::error::Result<SynopsisStatement> {
        let epsilon = super::fixed_ceil(synopsis.epsilon)?;
        Ok(SynopsisStatement {
            synopsis: synopsis.name.clone(),
            cost: Cost::pure_split(epsilon, 2 * synopsis.rounds + 1),
        })
    }

    /// The synopsis's name.
    pub fn synopsis(&self) -> &str {
        &self.synopsis
    }
}

impl Priced for SynopsisStatement {
    fn cost(&self) -> Cost {
        self.cost
    }
}
