//! Why a charge was refused: the request, the limit, what was left, and the message and SQLSTATE
//! the analyst sees ([`Refusal`], [`crate::Error::BudgetExhausted`]). Pure: no I/O.
//!
//! Invariant: for the dataset's budget the message states neither what is left nor what others
//! spent (it depends on other analysts); amounts are rounded down, never overstating what is left.

use std::fmt;

use super::accountant::{Cost, Limit, Remaining};
use super::window::Window;
use crate::Error;

/// Whose budget refused a charge.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scope {
    /// The analyst's own budget.
    Analyst,
    /// The dataset-wide budget shared by all analysts.
    Dataset,
}

/// Why a charge was not admitted: the request and what was left.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Refusal {
    /// Which budget refused.
    pub scope: Scope,
    /// The cost asked for.
    pub requested: Cost,
    /// The limit it was checked against.
    pub limit: Limit,
    /// What was left before the request.
    pub remaining: Remaining,
    /// For a renewing limit: the window whose totals refused it (the ledger fills it in).
    pub window: Option<Window>,
}

/// Digits shown for remaining amounts in messages (rounded down, never overstating).
const MESSAGE_DIGITS: u32 = 6;

impl fmt::Display for Refusal {
    /// For an analyst: `requested ε=0.5, remaining ε=0.2 of 10` (and the remaining δ when the
    /// query spends δ). For the dataset
    /// the remaining amounts are not shown: they depend on what other analysts did.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Cost {
            epsilon,
            delta,
            rho,
            ..
        } = self.requested;
        let mut parts = Vec::new();
        if !epsilon.is_zero() || (delta.is_zero() && rho.is_zero()) {
            parts.push(format!("ε={epsilon}"));
        }
        if !delta.is_zero() {
            parts.push(format!("δ={delta}"));
        }
        if !rho.is_zero() {
            parts.push(format!("ρ={rho} (zCDP)"));
        }
        write!(f, "requested {}", parts.join(" and "))?;
        match self.scope {
            Scope::Analyst => {
                write!(
                    f,
                    ", remaining ε={} of {}",
                    self.remaining.epsilon.floor_significant(MESSAGE_DIGITS),
                    self.limit.epsilon,
                )?;
                // δ only for a query that spends it (partition selection): it cannot be what
                // refused a query that needs none.
                if !delta.is_zero() {
                    write!(
                        f,
                        ", δ={} of {} (partition selection's half of δ={})",
                        self.remaining.delta.floor_significant(MESSAGE_DIGITS),
                        self.limit.selection_delta(),
                        self.limit.delta,
                    )?;
                }
                if !rho.is_zero() {
                    write!(
                        f,
                        ", ρ={} (zCDP)",
                        self.remaining.rho.floor_significant(MESSAGE_DIGITS)
                    )?;
                }
            }
            Scope::Dataset => write!(
                f,
                ", more than is left of the dataset-wide budget of ε={}, δ={} shared by all analysts",
                self.limit.epsilon, self.limit.delta,
            )?,
        }
        match &self.window {
            Some(window) => write!(f, " {window}; the budget renews then"),
            None => Ok(()),
        }
    }
}

impl From<Refusal> for Error {
    /// [`Error::BudgetExhausted`] (SQLSTATE 53400). For the analyst's own budget the message
    /// says whether it is used up or only too small for this query (then a smaller ε fits); for
    /// the dataset's budget it says neither, since what is left depends on other analysts.
    fn from(refusal: Refusal) -> Error {
        let summary = match refusal.scope {
            Scope::Analyst => {
                let needs_delta = !refusal.requested.delta.is_zero();
                let used_up = (refusal.remaining.epsilon.is_zero()
                    && refusal.remaining.rho.is_zero())
                    || (needs_delta && refusal.remaining.delta.is_zero());
                if used_up {
                    "privacy budget exhausted"
                } else {
                    "privacy budget too small for this query"
                }
            }
            Scope::Dataset => "the dataset's privacy budget does not cover this query",
        };
        Error::BudgetExhausted {
            detail: format!("{summary}: {refusal}"),
        }
    }
}
