//! Statements made of several releases: set operations (`UNION`, `INTERSECT`, `EXCEPT` at the
//! top of a statement, each branch its own release) and calendars (a public series joined to an
//! aggregate subquery), whose rest PostgreSQL evaluates over the released rows; and statements
//! with scalar subqueries ([`super::scalar`]), each subquery released first, the statement then
//! answered with the released values in its text.
//!
//! Invariant: every branch (every subquery, and the statement with stand-ins of their values)
//! is analysed, planned and its columns described before the first charge, so a refused branch
//! costs nothing; the answer's rows are made only by `ClientRows::combined` from the branches'
//! released rows (or constants), or, for scalar subqueries, by answering the statement with
//! their released values as literals.

use sqlparser::ast;

use crate::dp::analyze;
use crate::dp::plan::ListedKey;
use crate::error::{Error, Result};
use crate::output::{Cell, CellType, OutColumn};

use super::classify::Statement;
use super::dp::{after_release, released_columns};
use super::notices::RHO_DIGITS;
use super::route::Route;
use super::scalar::{ScalarSplit, ScalarValue};
use super::{ClientRows, Notice, Session, Shared};

impl Session {
    /// A statement of released DP queries ([`Composite`]: a set operation, a calendar): every
    /// branch planned and the answer's columns described first, so that a refusal comes before
    /// any charge; then each branch released (and charged) in order, as the DP query it is;
    /// then the statement evaluated by PostgreSQL over the released rows. The NOTICEs of every
    /// charge go before the answer; for a set operation, after one that sums them.
    pub(super) async fn composite(
        &mut self,
        shared: &Shared,
        composite: Composite<'_>,
        params: &[Option<String>],
    ) -> Result<ClientRows> {
        let columns = self.composite_columns(shared, composite).await?;
        let branches = composite.branches();
        // Every branch planned (a refusal of any costs nothing), and what they will be charged
        // checked against the budget as one, before the first charge.
        let mut costs = Vec::new();
        for branch in branches {
            costs.extend(self.planned_costs(shared, branch, params, None).await?);
        }
        self.afford(shared, &costs, &format!("of this {}", composite.what()))
            .await?;
        let shadow = shared
            .shadow
            .as_ref()
            .ok_or_else(|| no_shadow_for(composite))?;
        let zone = crate::upstream::time_zone_setting(&self.settings.time_zone)?;
        let listed = match composite {
            Composite::Calendar(calendar) => self.calendar_listed(shared, calendar).await?,
            Composite::Set(_) => None,
        };
        let mut parts = Vec::with_capacity(branches.len());
        let (mut charged, mut total) = (0, crate::budget::Cost::default());
        for branch in branches {
            let charges = self.charges;
            let part = match super::route::route_query(branch)? {
                Route::Constant(items) => self.constants(shared, items)?,
                Route::Dp(_) => {
                    Box::pin(self.dp_query_listed(shared, branch, params, listed.as_ref())).await?
                }
                _ => return Err(branch_refusal(branch)),
            };
            parts.push(part);
            if let (true, Some(cost)) = (self.charges > charges, self.last_cost) {
                charged += 1;
                total = total + cost;
            }
        }
        let released: Vec<usize> = parts.iter().map(|p| p.rows().len()).collect();
        let who = self.analyst.name.clone();
        let answer = ClientRows::combined(
            parts,
            columns,
            |released| composite.evaluation_sql(released),
            |sql| {
                let sql = sql.in_zone(&zone);
                async move { shadow.evaluate(&who, &sql).await }
            },
        )
        .await
        .map_err(|e| {
            after_release(
                e,
                &format!(
                    "in the {} over released answers; the charges for them stand",
                    composite.what()
                ),
            )
        })?;
        if let Composite::Calendar(_) = composite {
            // Which series values found no released group is post-processing; why is not: the
            // data may have none, or too few people to pass partition selection.
            let mut notices = answer.notices().to_vec();
            let released = released.first().copied().unwrap_or(0);
            notices.push(Notice::new(match &listed {
                    Some(listed) => format!(
                        "pgdp: the calendar's series gave the subquery's key {} its {} value(s) as a public domain: each was released with its noisy value and no partition selection, so a value without data has a noisy value near zero, not NULL",
                        listed.column(),
                        listed.values().len()
                    ),
                    None => format!(
                        "pgdp: the calendar's subquery released {released} group(s); a series value with no released group is NULL in the join (or your COALESCE's value): the data has none, or too few people for partition selection at this epsilon (EXPLAIN the subquery for its threshold)"
                    ),
                }));
            return Ok(answer.with_notices(notices));
        }
        // First the sum of what the branches were charged, then each branch's NOTICEs.
        let n = branches.len();
        let sum = charged_sum(charged, total);
        let free = if charged < n {
            "; the others were free (answered again, or public)"
        } else {
            ""
        };
        let mut notices = vec![Notice::new(format!(
                "pgdp: charged {sum}; the sum for the {n} branches of this set operation, each a release charged on its own ({charged} now{free}; their NOTICEs follow); groups and their total asked in one query with GROUP BY ROLLUP (…) are one release"
            ))];
        notices.extend(answer.notices().iter().cloned());
        Ok(answer.with_notices(notices))
    }

    /// The values of a calendar subquery's key that its series can match
    /// ([`super::calendar::SeriesKey`]), evaluated from the statement's constants on the shadow
    /// catalog in the session's time zone, as text of the key's type: when listing them makes
    /// every key of the subquery public ([`Plan::listable_key`]) and there are at most
    /// [`crate::limits::PUBLIC_KEY_COMBINATIONS_MAX`]. `None` leaves partition selection.
    pub(super) async fn calendar_listed(
        &self,
        shared: &Shared,
        calendar: &super::calendar::Calendar,
    ) -> Result<Option<ListedKey>> {
        let (Some(key), Some(shadow)) = (&calendar.key, &shared.shadow) else {
            return Ok(None);
        };
        let plan = analyze::analyze(&calendar.inner, &self.context(shared))?;
        if plan.listable_key(&key.column).is_none() {
            return Ok(None);
        }
        let columns = self
            .answer_shape(shared, &calendar.inner, &calendar.inner.to_string(), &plan)
            .await?
            .columns;
        let Some(ty) = columns.iter().find(|c| c.name == key.column).map(|c| c.ty) else {
            return Ok(None);
        };
        let most = crate::limits::PUBLIC_KEY_COMBINATIONS_MAX;
        let Some(sql) = calendar.key_domain_sql(ty, most) else {
            return Ok(None);
        };
        let zone = crate::upstream::time_zone_setting(&self.settings.time_zone)?;
        let rows = shadow
            .evaluate(&self.analyst.name, &sql.in_zone(&zone))
            .await?;
        let values: Vec<Option<String>> = rows
            .into_rows()
            .into_iter()
            .filter_map(|row| row.into_iter().next())
            .collect();
        if values.is_empty() || values.len() > most {
            return Ok(None);
        }
        Ok(Some(ListedKey::new(key.column.clone(), values)))
    }

    /// The columns of a [`Composite`] statement, as PostgreSQL types it over its branches'
    /// released columns (described on the shadow catalog, never run).
    pub(super) async fn composite_columns(
        &self,
        shared: &Shared,
        composite: Composite<'_>,
    ) -> Result<Vec<OutColumn>> {
        let branches = composite.branches();
        let mut described = Vec::with_capacity(branches.len());
        for branch in branches {
            described.push(match super::route::route_query(branch)? {
                Route::Constant(items) => self.constants(shared, items)?.columns().to_vec(),
                Route::Dp(_) => Box::pin(self.dp_columns(shared, branch)).await?,
                _ => return Err(branch_refusal(branch)),
            });
        }
        let none: Vec<Vec<Cell>> = Vec::new();
        let parts: Vec<(&[OutColumn], &[Vec<Cell>])> = described
            .iter()
            .map(|c| (c.as_slice(), none.as_slice()))
            .collect();
        let sql = composite.evaluation_sql(&parts)?;
        let shadow = shared
            .shadow
            .as_ref()
            .ok_or_else(|| no_shadow_for(composite))?;
        released_columns(shadow.post_columns(&sql).await?)
    }
}

/// The sum of `charged` releases' costs, for a NOTICE: `nothing`, or `epsilon=…, delta=…`.
fn charged_sum(charged: usize, total: crate::budget::Cost) -> String {
    match (charged, total.rho.is_zero()) {
        (0, _) => "nothing".to_string(),
        (_, true) => format!("epsilon={}, delta={}", total.epsilon, total.delta),
        (_, false) => format!(
            "epsilon={}, rho={} (zCDP), delta={}",
            total.epsilon,
            total.rho.ceil_significant(RHO_DIGITS),
            total.delta
        ),
    }
}

/// A statement's scalar subqueries to release first, with each one's column (name, type).
pub(super) struct Scalars {
    pub(super) split: ScalarSplit,
    /// The subqueries as released: each with its own time constants folded.
    pub(super) released: Vec<ast::Query>,
    pub(super) described: Vec<(String, CellType)>,
    /// The statement with a stand-in of each value, its time constants folded: what is
    /// described and explained before the first charge.
    pub(super) stand_in: ast::Query,
}

impl Session {
    /// The scalar subqueries of `query` to release before it ([`super::scalar`]): only when
    /// the statement as written is refused by analysis (a statement answered in one release
    /// keeps it), and every subquery is a DP query answerable on its own. Checked before any
    /// charge: each subquery described, and the statement with stand-ins of their values
    /// described as what it becomes. A subquery that reads the outer query's columns leaves the
    /// statement's own refusal.
    pub(super) async fn scalars(
        &self,
        shared: &Shared,
        query: &ast::Query,
    ) -> Result<Option<Scalars>> {
        let Some(split) = super::scalar::split(query)? else {
            return Ok(None);
        };
        let refusal = match analyze::analyze(query, &self.context(shared)) {
            Ok(_) => return Ok(None),
            Err(e) => e,
        };
        let mut described = Vec::with_capacity(split.subqueries.len());
        let mut released = Vec::with_capacity(split.subqueries.len());
        for subquery in &split.subqueries {
            if !matches!(super::route::route_query(subquery)?, Route::Dp(_)) {
                return Err(refusal);
            }
            let subquery = self.time_folded(shared, subquery.clone()).await?;
            let columns = match Box::pin(self.dp_columns(shared, &subquery)).await {
                Ok(columns) => columns,
                // Correlated (or a typo): refused as what it is, before the statement's own
                // refusal, which may name a clock left for after the subquery's release.
                Err(Error::UnknownColumn { name }) => {
                    return Err(outside_refusal(&subquery, &format!("column {name}")))
                }
                Err(Error::UnknownTable { name }) => {
                    return Err(outside_refusal(&subquery, &format!("table {name}")))
                }
                Err(e) => return Err(e),
            };
            // Under pgdp.accuracy its error bound follows: the value is the first column.
            let column = columns
                .first()
                .ok_or_else(|| Error::internal("a scalar subquery without a column"))?;
            described.push((column.name.clone(), column.ty));
            released.push(subquery);
        }
        let stand_in = split.with_stand_ins(&described)?;
        let stand_in = self.time_folded(shared, stand_in).await?;
        Box::pin(self.statement_columns(shared, &stand_in)).await?;
        Ok(Some(Scalars {
            split,
            released,
            described,
            stand_in,
        }))
    }

    /// `statement` with its time constants folded ([`super::fold`]): an expression over a
    /// subquery's value and the clock (`current_date - (SELECT …) * interval '1 day'`) is
    /// constant once the value is in place.
    async fn time_folded(&self, shared: &Shared, statement: ast::Query) -> Result<ast::Query> {
        let statement = Statement::Query(Box::new(statement));
        Ok(match self.fold_time(shared, &statement).await? {
            Some(Statement::Query(folded)) => *folded,
            _ => match statement {
                Statement::Query(q) => *q,
                _ => return Err(Error::internal("a query that is not one")),
            },
        })
    }

    /// The columns of a statement whose scalar subqueries are values: a DP query, or constants.
    pub(super) async fn statement_columns(
        &self,
        shared: &Shared,
        statement: &ast::Query,
    ) -> Result<Vec<OutColumn>> {
        match super::route::route_query(statement)? {
            Route::Constant(items) => Ok(self.constants(shared, items)?.columns().to_vec()),
            Route::Dp(_) => Box::pin(self.dp_columns(shared, statement)).await,
            // Constants pgdp's evaluator does not cover: PostgreSQL's, on the shadow catalog.
            Route::Catalog(query) => self.catalog_columns(shared, query).await,
            _ => Err(scalar_statement_refusal(statement)),
        }
    }

    /// Releases (and charges) each scalar subquery in turn, then answers the statement with
    /// their released values in its text; the NOTICEs of every charge go before the answer,
    /// after one that sums them.
    pub(super) async fn scalar_release(
        &mut self,
        shared: &Shared,
        scalars: &Scalars,
        params: &[Option<String>],
    ) -> Result<ClientRows> {
        // What the subqueries and the statement will be charged, checked as one first.
        let mut costs = Vec::new();
        for statement in scalars.released.iter().chain([&scalars.stand_in]) {
            costs.extend(Box::pin(self.planned_costs(shared, statement, params, None)).await?);
        }
        self.afford(
            shared,
            &costs,
            "of this statement's scalar subqueries and the statement over their values",
        )
        .await?;
        let mut values = Vec::with_capacity(scalars.described.len());
        let mut notices = Vec::new();
        let (mut charged, mut total) = (0, crate::budget::Cost::default());
        for (subquery, (name, ty)) in scalars.released.iter().zip(&scalars.described) {
            let charges = self.charges;
            let part = Box::pin(self.dp_query(shared, subquery, params)).await?;
            if let (true, Some(cost)) = (self.charges > charges, self.last_cost) {
                charged += 1;
                total = total + cost;
            }
            let cell = match part.rows() {
                [] => Cell::Null,
                [row] => row.first().cloned().unwrap_or(Cell::Null),
                // A subquery over public tables alone may return several rows: PostgreSQL's
                // error; its rows are public, and a DP release of one aggregate has one row.
                _ => {
                    return Err(Error::PostProcessing {
                        state: tokio_postgres::error::SqlState::CARDINALITY_VIOLATION,
                        message: "more than one row returned by a subquery used as an expression"
                            .into(),
                        hint: Some(format!("The subquery {subquery} returned {} rows; a scalar subquery is one value: add a WHERE that keeps one row, or aggregate it.", part.rows().len())),
                    })
                }
            };
            values.push(ScalarValue {
                cell,
                ty: *ty,
                name: name.clone(),
            });
            notices.extend(part.notices().iter().cloned());
        }
        let statement = scalars.split.substitute(&values)?;
        let statement = self.time_folded(shared, statement).await?;
        let charges = self.charges;
        let answer = match super::route::route_query(&statement)? {
            Route::Constant(items) => self.constants(shared, items),
            Route::Dp(_) => Box::pin(self.dp_query(shared, &statement, params)).await,
            Route::Catalog(query) => self.catalog_rows(shared, query, params).await,
            _ => Err(scalar_statement_refusal(&statement)),
        }
        .map_err(|e| {
            let place = format!(
                "in the statement over its released subqueries; the charges for them stand: {}",
                charged_sum(charged, total)
            );
            match e {
                // Refused for budget after the subqueries' charges: say what they took.
                Error::BudgetExhausted { detail } if charged > 0 => Error::BudgetExhausted {
                    detail: format!("{detail} ({place})"),
                },
                other => after_release(other, &place),
            }
        })?;
        if let (true, Some(cost)) = (self.charges > charges, self.last_cost) {
            charged += 1;
            total = total + cost;
        }
        let n = values.len();
        let mut all = vec![Notice::new(format!(
            "pgdp: charged {}; the sum for this statement's {n} scalar subquery(ies), each released and charged on its own first (its noisy value then a constant of the statement), and the statement itself ({charged} charged now; their NOTICEs follow); aggregates of the same rows asked in one query are one release",
            charged_sum(charged, total)
        ))];
        all.extend(notices);
        all.extend(answer.notices().iter().cloned());
        Ok(answer.with_notices(all))
    }
}

/// The refusal of a scalar subquery that names a column or table (`what`) outside its own FROM:
/// correlated with the outer query, or misspelt.
fn outside_refusal(subquery: &ast::Query, what: &str) -> Error {
    Error::unsupported(
        format!("the scalar subquery ({subquery}), which names {what} outside its own FROM (a correlated subquery reads the outer query's columns),"),
        "A scalar subquery is answered when every column it names belongs to its own FROM: one aggregate without GROUP BY, released first and charged on its own, its noisy value then a constant of the statement. A correlated subquery is a value per outer row computed from other rows; ask for the per-key values as a query of their own (SELECT region, AVG(age) FROM demo.people GROUP BY region), or check the spelling of the name.",
    )
}

/// The refusal of a statement that, with its subqueries' values in place, is neither a DP
/// query nor a SELECT of constants.
fn scalar_statement_refusal(statement: &ast::Query) -> Error {
    Error::unsupported(
        format!("the statement {statement} over released subqueries"),
        "With each scalar subquery's released value in its place, a statement is answered as a DP query over the data or a SELECT of constants pgdp evaluates; ask for the subqueries' aggregates on their own.",
    )
}

/// The refusal of a branch of a set operation that is neither a DP query nor a SELECT of
/// constants (a catalog query, the budget view, set_config).
pub(super) fn branch_refusal(branch: &ast::Query) -> Error {
    Error::unsupported(
        format!("the branch {branch} of a set operation"),
        "Each branch of a UNION, INTERSECT or EXCEPT is a DP query over the data or a SELECT of constants; run catalog queries and settings on their own.",
    )
}

/// A statement answered by releasing DP queries, its branches, and evaluating the rest over
/// their released rows with PostgreSQL: post-processing.
#[derive(Clone, Copy)]
pub(super) enum Composite<'q> {
    /// UNION, INTERSECT, EXCEPT ([`super::setop`]).
    Set(&'q super::setop::SetOperation),
    /// generate_series joined to an aggregate subquery ([`super::calendar`]).
    Calendar(&'q super::calendar::Calendar),
}

impl<'q> Composite<'q> {
    /// The statement's composite form, if it has one.
    pub(super) fn of(
        set: &'q Option<super::setop::SetOperation>,
        calendar: &'q Option<super::calendar::Calendar>,
    ) -> Option<Composite<'q>> {
        match (set, calendar) {
            (Some(set), _) => Some(Composite::Set(set)),
            (None, Some(calendar)) => Some(Composite::Calendar(calendar)),
            (None, None) => None,
        }
    }

    /// The DP queries (or SELECTs of constants) released first.
    pub(super) fn branches(self) -> &'q [ast::Query] {
        match self {
            Composite::Set(set) => &set.branches,
            Composite::Calendar(calendar) => std::slice::from_ref(&calendar.inner),
        }
    }

    /// The SQL that evaluates the statement over the branches' released columns and rows.
    pub(super) fn evaluation_sql(
        self,
        parts: &[(&[OutColumn], &[Vec<Cell>])],
    ) -> Result<crate::dp::sql::ShadowSql> {
        match self {
            Composite::Set(set) => set.evaluation_sql(parts),
            Composite::Calendar(calendar) => calendar.evaluation_sql(parts),
        }
    }

    /// The statement's kind, for messages.
    pub(super) fn what(self) -> &'static str {
        match self {
            Composite::Set(_) => "set operation",
            Composite::Calendar(_) => "calendar",
        }
    }
}

/// The refusal of a [`Composite`] statement where there is no shadow catalog to evaluate it on.
pub(super) fn no_shadow_for(composite: Composite<'_>) -> Error {
    Error::unsupported(
        format!("a {} on this server", composite.what()),
        "pgdp evaluates it with PostgreSQL on its shadow catalog, which this server does not have; run each aggregate query on its own.",
    )
}
