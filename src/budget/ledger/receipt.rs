//! What a charge hands back: the [`Balance`] it left, the [`Receipt`] that proves it durable,
//! and the [`Charged`] item it paid for ([`Priced`] states an item's own cost).
//!
//! Invariants (each with a `compile_fail` doc test beside a compiling use):
//! - Only the ledger makes a [`Receipt`] or a [`Charged`]: their fields are visible to the
//!   ledger module alone, and neither is `Clone`, so one charge covers one run.
//! - [`Charged::narrowed`] hands a charge on only to an item that costs no more.

use std::fmt;

use super::super::accountant::{remaining, Cost, Limit, Remaining, Spent};
use super::super::window::Window;
use crate::{Error, Result};

/// An analyst's (or the dataset's) budget as of one moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Balance {
    /// The limit the balance was computed against.
    pub limit: Limit,
    /// Everything charged so far (in the current window, for a renewing limit: see
    /// [`super::Ledger::balance_with_window`] and [`Receipt::window`]).
    pub spent: Spent,
    /// What is left of the limit (see [`remaining`]).
    pub remaining: Remaining,
}

impl Balance {
    pub(super) fn new(limit: &Limit, spent: Spent) -> Balance {
        Balance {
            limit: *limit,
            spent,
            remaining: remaining(limit, &spent),
        }
    }
}

/// Proof that a charge was committed durably. Bound to the statement it pays for
/// ([`Charged`], made by [`super::Ledger::charge_for`]) it is what running a DP query's SQL on the
/// upstream requires (`upstream::Pooled::run_release_query` takes the charged statement by
/// value, so one charge covers one run). Only the ledger's charges make one: its fields are
/// private and it has no other constructor, not even `Clone`.
///
/// Its parts are public values that anyone may hold and read:
///
/// ```
/// use pgdp::budget::{Balance, ChargeId, Receipt, Window};
/// fn parts(r: &Receipt) -> (ChargeId, Balance, Option<Window>) {
///     (r.id(), *r.balance(), r.window())
/// }
/// let _ = ChargeId::Logged(1);
/// ```
///
/// but a receipt cannot be assembled from them outside the budget module (its fields are
/// private: the same parts, of the right types, do not make one):
///
/// ```compile_fail,E0451
/// use pgdp::budget::{Balance, ChargeId, Receipt, Window};
/// fn forge(id: ChargeId, balance: Balance, window: Option<Window>) -> Receipt {
///     Receipt { id, balance, window }
/// }
/// ```
///
/// Nor copied to cover a second run (it is neither `Clone` nor `Copy`; a receipt moves):
///
/// ```
/// fn once(r: pgdp::budget::Receipt) -> pgdp::budget::Receipt {
///     r
/// }
/// ```
///
/// ```compile_fail,E0599
/// fn twice(r: pgdp::budget::Receipt) -> (pgdp::budget::Receipt, pgdp::budget::Receipt) {
///     (r.clone(), r)
/// }
/// ```
#[derive(Debug, PartialEq, Eq)]
pub struct Receipt {
    pub(super) id: ChargeId,
    pub(super) balance: Balance,
    pub(super) window: Option<Window>,
}

/// Which audit row a charge has (or will have: a charge under a lease gets its row from the
/// journal, after the answer).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ChargeId {
    /// A charge committed on its own: its `pgdp.charge_log` id.
    Logged(i64),
    /// The `seq`-th charge under lease `lease` (`pgdp.charge_log.lease_id`, `lease_seq`).
    Leased {
        /// The `pgdp.lease` id.
        lease: i64,
        /// Its charges are numbered from 0 in the order they were made.
        seq: i64,
    },
}

impl ChargeId {
    /// The `pgdp.charge_log` id of a charge committed on its own (a leased charge's row is
    /// found by its lease and number instead).
    pub fn logged(&self) -> Option<i64> {
        match self {
            ChargeId::Logged(id) => Some(*id),
            ChargeId::Leased { .. } => None,
        }
    }
}

impl fmt::Display for ChargeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ChargeId::Logged(id) => write!(f, "{id}"),
            ChargeId::Leased { lease, seq } => write!(f, "lease {lease} #{seq}"),
        }
    }
}

impl Receipt {
    /// Which audit row the charge has, for [`super::Ledger::set_outcome`] and
    /// [`super::Ledger::record_release`].
    pub fn id(&self) -> ChargeId {
        self.id
    }

    /// The analyst's balance right after the charge.
    pub fn balance(&self) -> &Balance {
        &self.balance
    }

    /// For a renewing limit, the window the charge was admitted in (and the balance is of).
    pub fn window(&self) -> Option<Window> {
        self.window
    }
}

/// What a charge pays for: an item that states its own cost, so that the ledger takes the cost
/// it charges from the item it pays for ([`super::Ledger::charge_for`]) and never from an argument
/// beside it.
pub trait Priced {
    /// What releasing the item costs.
    fn cost(&self) -> Cost;
}

/// An item together with the receipt of the durable charge of its own cost
/// ([`Priced::cost`]): the charge bound to what it pays for. Only [`super::Ledger::charge_for`] makes
/// one (its fields are private, and it is neither `Clone` nor `Copy`), so a charge for one item
/// cannot pay for another; [`Charged::narrowed`] hands it on only to an item that costs no more.
/// Running a DP query upstream takes a `Charged` statement by value
/// (`upstream::Pooled::run_release_query`): one charge, one run.
///
/// Its parts can be read:
///
/// ```
/// use pgdp::budget::{Charged, Priced, Receipt};
/// fn parts<T: Priced>(c: &Charged<T>) -> (&T, &Receipt) {
///     (c.item(), c.receipt())
/// }
/// ```
///
/// but an item cannot be put under another item's charge, however it is made:
///
/// ```compile_fail,E0451
/// use pgdp::budget::{Charged, Priced};
/// fn swap<T: Priced>(paid: Charged<T>, other: T) -> Charged<T> {
///     let (_, receipt) = paid.into_parts();
///     Charged { item: other, receipt }
/// }
/// ```
#[derive(Debug)]
pub struct Charged<T> {
    pub(super) item: T,
    pub(super) receipt: Receipt,
}

impl<T: Priced> Charged<T> {
    /// The item charged for.
    pub fn item(&self) -> &T {
        &self.item
    }

    /// The receipt of its charge.
    pub fn receipt(&self) -> &Receipt {
        &self.receipt
    }

    /// The item and the receipt, apart: the item can no longer be run as charged.
    pub fn into_parts(self) -> (T, Receipt) {
        (self.item, self.receipt)
    }

    /// The same charge for the item `narrow` makes of this one (a query's answer at the cap
    /// chosen from the charged histogram), provided that item costs no more than this one:
    /// an internal error otherwise, and the charge stays spent.
    pub fn narrowed<U: Priced>(self, narrow: impl FnOnce(T) -> Result<U>) -> Result<Charged<U>> {
        let paid = self.item.cost();
        let item = narrow(self.item)?;
        if !paid.covers(&item.cost()) {
            return Err(Error::internal(
                "a release costs more than the charge it was handed",
            ));
        }
        Ok(Charged {
            item,
            receipt: self.receipt,
        })
    }
}
