//! EXPLAIN of a DP statement: the plan, the upstream SQL (the secret redacted), the mechanisms
//! and their cost, for each release of a set operation, calendar, top-k join or statement with
//! scalar subqueries too.
//!
//! Invariant: touches neither the upstream's private data nor the budget; what it prints is a
//! function of the statement, the policy, the session's settings and, for the planned charge of
//! a statement of several releases, which of them the ledger already answers for this analyst
//! (free), as the session's check before their first charge reads it.

use crate::dp::plan::ListedKey;
use crate::dp::{release, rewrite};
use crate::error::Result;
use crate::output::{Cell, CellType, OutColumn};
use crate::upstream::Placement;

use super::composite::{branch_refusal, Composite};
use super::route::Route;
use super::{ClientRows, Session, Shared};

use sqlparser::ast;

impl Session {
    /// EXPLAIN: the plan, the upstream SQL (secret redacted), the mechanisms and their cost.
    /// Touches neither the upstream's data nor the budget.
    pub(super) async fn explain(
        &self,
        shared: &Shared,
        query: &ast::Query,
        params: &[Option<String>],
    ) -> Result<ClientRows> {
        self.explain_listed(shared, query, params, None).await
    }

    /// [`Session::explain`] of a query whose key `listed` names has listed values
    /// ([`Session::dp_query_listed`]).
    pub(super) async fn explain_listed(
        &self,
        shared: &Shared,
        query: &ast::Query,
        params: &[Option<String>],
        listed: Option<&ListedKey>,
    ) -> Result<ClientRows> {
        let (set, calendar) = (super::setop::split(query)?, super::calendar::split(query)?);
        if let Some(composite) = Composite::of(&set, &calendar) {
            return self.explain_composite(shared, composite, params).await;
        }
        if let Some(series) = super::series::split(query) {
            return self.explain_series(shared, &series, params).await;
        }
        if let Some(scalars) = self.scalars(shared, query).await? {
            return self.explain_scalars(shared, query, &scalars, params).await;
        }
        self.explain_one(shared, query, params, listed).await
    }

    /// EXPLAIN of a set operation or a calendar: each branch's plan under a heading; the rest
    /// is post-processing.
    async fn explain_composite(
        &self,
        shared: &Shared,
        composite: Composite<'_>,
        params: &[Option<String>],
    ) -> Result<ClientRows> {
        // Each branch's plan under a heading; the rest is post-processing.
        let branches = composite.branches();
        let mut lines = vec![vec![Cell::Text(format!(
            "{} of {} release(s), each charged on its own; PostgreSQL evaluates the rest of the statement over the released rows",
            composite.what(),
            branches.len()
        ))]];
        for (i, branch) in branches.iter().enumerate() {
            lines.push(vec![Cell::Text(format!("branch {}: {branch}", i + 1))]);
            match super::route::route_query(branch)? {
                Route::Constant(_) => {
                    lines.push(vec![Cell::Text("constants: no release, no charge".into())]);
                }
                Route::Dp(_) => {
                    let listed = match composite {
                        Composite::Calendar(calendar) => {
                            self.calendar_listed(shared, calendar).await?
                        }
                        Composite::Set(_) => None,
                    };
                    if let Some(listed) = &listed {
                        lines.push(vec![Cell::Text(format!(
                            "the series lists the {} value(s) of the key {}: its public domain, no partition selection",
                            listed.values().len(),
                            listed.column()
                        ))]);
                    }
                    let explained =
                        Box::pin(self.explain_listed(shared, branch, params, listed.as_ref()))
                            .await?;
                    lines.extend(explained.rows().iter().cloned());
                }
                _ => return Err(branch_refusal(branch)),
            }
        }
        let mut costs = Vec::new();
        for branch in branches {
            costs.extend(Box::pin(self.planned_costs(shared, branch, params, None)).await?);
        }
        lines.push(planned_charge(&costs));
        Ok(ClientRows::computed(explain_columns(), lines))
    }

    /// EXPLAIN of a top-k join: the inner release, then the main query restricted to its keys
    /// (a stand-in key of each key's type where the released keys will be: the same mechanisms
    /// and cost).
    async fn explain_series(
        &self,
        shared: &Shared,
        series: &super::series::SeriesLimit,
        params: &[Option<String>],
    ) -> Result<ClientRows> {
        // The inner release, then the main query restricted to its keys: a stand-in key of
        // each key's type where the released keys will be (the same mechanisms and cost).
        let mut lines = vec![vec![Cell::Text(
            "top-k join of 2 releases, each charged on its own: the inner aggregate is released first, and its released keys then restrict the main query".into(),
        )]];
        lines.push(vec![Cell::Text(format!("inner: {}", series.inner))]);
        let explained = Box::pin(self.explain(shared, &series.inner, params)).await?;
        lines.extend(explained.rows().iter().cloned());
        let columns = Box::pin(self.dp_columns(shared, &series.inner)).await?;
        let names: Vec<String> = columns.iter().map(|c| c.name.clone()).collect();
        let stand_in: Vec<Cell> = columns
            .iter()
            .map(|c| super::scalar::stand_in(c.ty))
            .collect();
        let outer = super::series::restrict(series, &names, &[stand_in])?;
        lines.push(vec![Cell::Text(format!(
            "main query, with a stand-in value where each released key will be: {outer}"
        ))]);
        let explained = Box::pin(self.explain(shared, &outer, params)).await?;
        lines.extend(explained.rows().iter().cloned());
        let mut costs = Box::pin(self.planned_costs(shared, &series.inner, params, None)).await?;
        costs.extend(Box::pin(self.planned_costs(shared, &outer, params, None)).await?);
        lines.push(planned_charge(&costs));
        Ok(ClientRows::computed(explain_columns(), lines))
    }

    /// EXPLAIN of a statement with scalar subqueries: each subquery's plan, then the statement
    /// with a stand-in value of each one's type.
    async fn explain_scalars(
        &self,
        shared: &Shared,
        query: &ast::Query,
        scalars: &super::composite::Scalars,
        params: &[Option<String>],
    ) -> Result<ClientRows> {
        let n = scalars.split.subqueries.len();
        let mut lines = vec![vec![Cell::Text(format!(
            "statement with {n} scalar subquery(ies), each released and charged on its own first; its noisy value then stands in the statement as a constant, and the statement is answered as what it has become"
        ))]];
        for (i, subquery) in scalars.released.iter().enumerate() {
            lines.push(vec![Cell::Text(format!("subquery {}: {subquery}", i + 1))]);
            let explained = Box::pin(self.explain(shared, subquery, params)).await?;
            lines.extend(explained.rows().iter().cloned());
        }
        let stand_in = &scalars.stand_in;
        lines.push(vec![Cell::Text(format!(
            "the statement, with a stand-in value of each subquery's type where its released value will be: {stand_in}"
        ))]);
        match super::route::route_query(stand_in)? {
            Route::Dp(_) => {
                let explained = Box::pin(self.explain(shared, stand_in, params)).await?;
                lines.extend(explained.rows().iter().cloned());
            }
            _ => lines.push(vec![Cell::Text("constants: no release, no charge".into())]),
        }
        let costs = Box::pin(self.planned_costs(shared, query, params, None)).await?;
        lines.push(planned_charge(&costs));
        Ok(ClientRows::computed(explain_columns(), lines))
    }

    /// EXPLAIN of one DP release: its plan, the choice of bounds, where the per-unit stage
    /// runs, and the release schedule.
    async fn explain_one(
        &self,
        shared: &Shared,
        query: &ast::Query,
        params: &[Option<String>],
        listed: Option<&ListedKey>,
    ) -> Result<ClientRows> {
        let secret = shared.secret().await?;
        let text = query.to_string();
        let (plan, rewrite, mechanisms, placement) = self
            .plan_dp_placed(shared, query, &text, params, secret, listed)
            .await?;
        let mut text = release::explain(&plan, &rewrite, &mechanisms, mechanisms.budget);
        if self.settings.choose_bounds {
            let domains = self.public_domains(shared, &plan, params).await?;
            if let Some(choice) =
                self.bounds_choice(&plan, &rewrite, &mechanisms, params, secret, &domains)?
            {
                // After the cost line: the query's cost with the histogram, then the rule.
                let mut added = vec![format!(
                    "cost with the choice of bounds: {} (epsilon {} for the histograms, the rest for the answer; the measures below are those of the tables' caps at the whole epsilon, which run with pgdp.choose_bounds off; the answer's are at the chosen caps and the rest)",
                    choice.cost(),
                    choice.choice.epsilon()
                )];
                added.extend(choice.choice.explain());
                let at = 2.min(text.len());
                text.splice(at..at, added);
            }
        }
        let mut lines: Vec<Vec<Cell>> = text
            .into_iter()
            .map(|l| vec![Cell::Text(redact_secret(&l, secret))])
            .collect();
        let per_unit = match &placement {
            Placement::ByUnit { tables } => {
                rewrite::per_unit_stage(rewrite.sql.as_str(), tables, &shared.policy)?
            }
            Placement::Distributed { tables, .. } => {
                let read = super::dp::tables_read(&plan, &shared.policy);
                let reference = shared.partitioning.reference_tables(&read);
                rewrite::per_unit_stage_on_citus(rewrite.sql.as_str(), tables, &reference)?
            }
            _ => None,
        };
        if let Some(line) = placement.explain(per_unit.as_ref()) {
            // Before the upstream SQL, which readers take to run to the end of the plan.
            let at = lines
                .iter()
                .position(|l| matches!(l.first(), Some(Cell::Text(t)) if t == "upstream SQL:"))
                .unwrap_or(lines.len());
            lines.insert(at, vec![Cell::Text(line)]);
        }
        if let Some(schedule) = &shared.policy.release_schedule {
            lines.push(vec![Cell::Text(format!(
                "release schedule: {}",
                schedule.describe()
            ))]);
        }
        // Answered from a synopsis: said first, the per-query plan after it as the fallback.
        let synopsis = self.explain_synopsis(shared, &plan, params).await?;
        lines.splice(0..0, synopsis.into_iter().map(|l| vec![Cell::Text(l)]));
        Ok(ClientRows::computed(explain_columns(), lines))
    }
}

/// The one column of EXPLAIN.
pub(super) fn explain_columns() -> Vec<OutColumn> {
    vec![OutColumn::new("QUERY PLAN", CellType::Text)]
}

/// `line` with the rewrite secret (and the ranking seed made from it) replaced by `<secret>`.
fn redact_secret(line: &str, secret: &str) -> String {
    if secret.is_empty() {
        return line.to_string();
    }
    line.replace(&secret.replace('\'', "''"), "<secret>")
        .replace(&rewrite::ranking_seed(secret).to_string(), "<secret>")
}

/// The last line of EXPLAIN of a statement of several releases: what they are planned to be
/// charged together (as the session's check before the first charge sums them).
fn planned_charge(costs: &[crate::budget::Cost]) -> Vec<Cell> {
    let total = costs
        .iter()
        .fold(crate::budget::Cost::default(), |sum, cost| sum + *cost);
    vec![Cell::Text(format!(
        "planned charge of the statement: {total}, the sum of {} release(s) charged on their own (a release whose answer or noisy measures the ledger already holds is free, and counts nothing here)",
        costs.len()
    ))]
}
