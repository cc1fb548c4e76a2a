//! A statement of several releases (a set operation's branches, scalar subqueries and the
//! statement over their values) is charged release by release, each charge checked by the
//! ledger on its own. Before the first of them, the session asks whether all of them fit
//! together: the cost each release is planned to have, summed, against the analyst's balance
//! and the dataset's, read from the ledger. A statement they do not fit is refused (53400)
//! before anything is charged, instead of after its first releases were charged and their
//! answers lost with the statement.
//!
//! Invariant: this check only refuses; it never admits. Every release is still charged by
//! the ledger before the upstream sees it ([`crate::budget::Charged`]), so a check made on a
//! stale balance (another session charging in between), or one that could not read the
//! ledger (then skipped), costs the analyst at most what the statement cost before it
//! existed, and never releases anything uncharged.
//!
//! What a release is planned to cost is what it will be charged when nothing changes in
//! between: nothing when its answer, its noisy measures or measures it can be derived from
//! are already in the ledger (or it reads only public tables or constants), else its
//! mechanisms' cost (at a cap chosen per query, the choice's cost). Within one statement, a
//! later release derived from an earlier one's new measures is counted as charged, so the sum
//! can overstate the statement's cost. It can also understate it, which the ledger's own
//! charges then catch: a top-k join's second release (planned over the first's keys) is not
//! counted, and an entry found now may expire before its release asks for it.

use sqlparser::ast;

use crate::budget::accountant::{admit, Refusal, Scope};
use crate::budget::Cost;
use crate::dp::plan::ListedKey;
use crate::error::{Error, Result};

use super::dp::limit_of;
use super::route::Route;
use super::{Session, Shared};

impl Session {
    /// What `query` (a branch or a subquery of a statement of several releases) is planned to
    /// be charged, one cost per release it makes: empty when it is answered free. Refusals of
    /// the query itself are returned, before any charge.
    pub(super) async fn planned_costs(
        &self,
        shared: &Shared,
        query: &ast::Query,
        params: &[Option<String>],
        listed: Option<&ListedKey>,
    ) -> Result<Vec<Cost>> {
        if !matches!(super::route::route_query(query)?, Route::Dp(_))
            || self.public_sql(shared, query).await?.is_some()
        {
            return Ok(Vec::new());
        }
        // A main query joined to another's top keys: its second release is planned over the
        // first's released keys, so only the first is counted (the second is still charged
        // and checked by the ledger).
        if let Some(series) = super::series::split(query) {
            return Box::pin(self.planned_costs(shared, &series.inner, params, None)).await;
        }
        if let Some(scalars) = self.scalars(shared, query).await? {
            let mut costs = Vec::new();
            for subquery in scalars.released.iter().chain([&scalars.stand_in]) {
                costs.extend(Box::pin(self.planned_costs(shared, subquery, params, None)).await?);
            }
            return Ok(costs);
        }
        let planned = self.planned(shared, query, params, listed).await?;
        if self
            .found(shared, &planned)
            .await
            .answers(&planned, self.settings.choose_bounds)
        {
            return Ok(Vec::new());
        }
        let cost = if self.settings.choose_bounds {
            let domains = self.public_domains(shared, &planned.plan, params).await?;
            let secret = shared.secret().await?;
            self.bounds_choice(
                &planned.plan,
                &planned.rewrite,
                &planned.mechanisms,
                params,
                secret,
                &domains,
            )?
            .map_or(planned.mechanisms.cost, |choice| choice.cost())
        } else {
            planned.mechanisms.cost
        };
        Ok(vec![cost])
    }

    /// Refuses (53400, nothing charged) a statement whose planned releases `costs` do not fit
    /// together in what is left of the analyst's budget, or of the dataset's; `what` names
    /// them for the message. One release or none is left to its own charge.
    pub(super) async fn afford(&self, shared: &Shared, costs: &[Cost], what: &str) -> Result<()> {
        if costs.len() < 2 {
            return Ok(());
        }
        let total = costs.iter().fold(Cost::default(), |sum, cost| sum + *cost);
        let context = |refusal: Refusal| -> Error {
            match Error::from(refusal) {
                Error::BudgetExhausted { detail } => Error::BudgetExhausted {
                    detail: format!(
                        "{detail} (the sum of the {} releases {what}, each charged on its own; nothing was charged: ask for fewer of them, or each on its own)",
                        costs.len()
                    ),
                },
                other => other,
            }
        };
        let limit = limit_of(&self.analyst.budget)?;
        // A ledger that cannot be read leaves each release to its own charge.
        if let Ok((balance, window)) = shared
            .ledger
            .balance_with_window(&self.analyst.name, &limit)
            .await
        {
            if let Err(refusal) = admit(&balance.limit, &balance.spent, &total) {
                return Err(context(Refusal { window, ..refusal }));
            }
        }
        if let Some(spec) = &shared.policy.dataset_budget {
            let limit = limit_of(spec)?;
            if let Ok((balance, window)) = shared.ledger.dataset_balance_with_window(&limit).await {
                if let Err(refusal) = admit(&balance.limit, &balance.spent, &total) {
                    return Err(context(Refusal {
                        scope: Scope::Dataset,
                        window,
                        ..refusal
                    }));
                }
            }
        }
        Ok(())
    }
}
