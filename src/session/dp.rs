//! A DP query through the session: plan, replay, reuse of released noisy measures, derivation
//! of a coarser grouping from a finer release over public keys, public domains, charge,
//! upstream, release; and EXPLAIN, which plans without running or charging.
//!
//! The order of [`Session::dp_query`] is the privacy argument, and the types hold it: the
//! upstream runs only a rewrite's [`crate::dp::rewrite::UpstreamSql`] and only with the
//! [`crate::budget::Receipt`] of a durable charge, and its rows are
//! [`crate::dp::release::PrivateRows`], which only [`release::measure`] can turn into noisy
//! measures, and those only [`release::finish`] into rows for the client.

use sqlparser::ast;

use crate::budget::{Fixed, Limit};
use crate::dp::analyze;
use crate::dp::plan::{ListedKey, Plan};
use crate::dp::release::{self, Released};
use crate::dp::rewrite::{self, Rewrite};
use crate::error::{Error, Result};
use crate::metrics::Stage;
use crate::output::{CellType, OutColumn};
use crate::policy::BudgetSpec;
use crate::upstream::{ColumnFact, Placement};

use super::composite::Composite;
use super::{ClientRows, Session, Shared};

/// A policy budget as exact ledger limits (rounded down: never in the analyst's favour), per
/// window of its `period` when it renews, under its `accounting`.
pub fn limit_of(spec: &BudgetSpec) -> Result<Limit> {
    let e = Fixed::from_f64_floor(spec.epsilon).map_err(|_| Error::internal("budget epsilon"))?;
    let d = Fixed::from_f64_floor(spec.delta).map_err(|_| Error::internal("budget delta"))?;
    Ok(Limit::new(e, d).per(spec.period).under(spec.accounting))
}

/// The policy tables `plan` reads, sorted, each once, for the audit log (`pgdp audit`): the
/// tables of FROM and of semijoins, and the policy tables inside the SQL pgdp built for derived
/// tables and unit paths. Names only: no value of the query enters the log.
pub(super) fn tables_read(plan: &Plan, policy: &crate::policy::Policy) -> Vec<String> {
    let mut names = std::collections::BTreeSet::new();
    let refs = plan
        .tables()
        .iter()
        .chain(plan.semijoins().iter().flat_map(|s| s.tables.iter()));
    for table in refs {
        if policy.tables.contains_key(&table.table) {
            names.insert(table.table.clone());
        }
        if let Some(source) = &table.source {
            let _ = ast::visit_relations(source.as_ref(), |name| {
                let parts: Vec<String> = name
                    .0
                    .iter()
                    .filter_map(|p| p.as_ident())
                    .map(|i| match i.quote_style {
                        Some(_) => i.value.clone(),
                        None => i.value.to_ascii_lowercase(),
                    })
                    .collect();
                let name = parts.join(".");
                if policy.tables.contains_key(&name) {
                    names.insert(name);
                }
                std::ops::ControlFlow::<()>::Continue(())
            });
        }
    }
    names.into_iter().collect()
}

/// EXPLAIN shows the upstream SQL, but never the secret that keys the choice of groups.
/// The statement the shadow catalog describes for a DP query's column types: the query itself,
/// with each output alias of its top-level SELECT that occurs nowhere else in the text replaced
/// by a positional one (`pgdp_c0`, …). A column's type does not depend on its alias, so the types
/// are the query's; statements that differ only in such aliases (a tool numbering its columns
/// per query) share one entry of the shadow's cache. An alias that occurs elsewhere (ORDER BY n,
/// GROUP BY n, inside a literal or another name) is kept, as is every alias when the text
/// already holds `pgdp_c`.
fn described_statement(query: &ast::Query, text: &str) -> String {
    alias_free(query, text).unwrap_or_else(|| text.to_string())
}

/// `query` (whose text is `text`) with each output alias of its top-level SELECT that occurs
/// nowhere else in the text replaced by a positional one ([`described_statement`]); `None` when
/// no alias was replaced. Such an alias's printed form (`n` or `"N"`) occurs exactly once in
/// `text`, as the select item's `AS` name, so the replacement is made in the text itself.
fn alias_free(query: &ast::Query, text: &str) -> Option<String> {
    let ast::SetExpr::Select(select) = query.body.as_ref() else {
        return None;
    };
    if !select
        .projection
        .iter()
        .any(|item| matches!(item, ast::SelectItem::ExprWithAlias { .. }))
    {
        return None;
    }
    let lower = text.to_lowercase();
    if lower.contains("pgdp_c") {
        return None;
    }
    let mut renamed = text.to_string();
    let mut changed = false;
    for (i, item) in select.projection.iter().enumerate() {
        let ast::SelectItem::ExprWithAlias { alias, .. } = item else {
            continue;
        };
        if lower.matches(&alias.value.to_lowercase()).count() != 1 {
            continue;
        }
        let printed = format!(" AS {alias}");
        if renamed.matches(&printed).count() != 1 {
            continue;
        }
        renamed = renamed.replacen(&printed, &format!(" AS pgdp_c{i}"), 1);
        changed = true;
    }
    changed.then_some(renamed)
}

/// Whether `plan`'s outputs are the select list's names `names` ([`analyze::output_names`]), in
/// order, and nothing else of it can name them (no post-processing SQL): then the plan of a
/// statement that differs only in output aliases named nowhere else is this plan with those
/// names, and the plan cache keeps it under the statement without them.
fn named_by(plan: &Plan, names: Option<&[String]>) -> bool {
    plan.post().is_none()
        && names.is_some_and(|names| {
            plan.outputs().len() == names.len()
                && plan.outputs().iter().zip(names).all(|(o, n)| &o.name == n)
        })
}

/// The upstream facts a plan consults that this process does not know yet.
#[derive(Default)]
struct UnknownFacts {
    /// Unit and lookup keys whose uniqueness is unknown.
    unique: Vec<(String, String)>,
    /// Aggregate arguments whose `NOT NULL` is unknown.
    not_null: Vec<(String, String)>,
}

impl UnknownFacts {
    fn is_empty(&self) -> bool {
        self.unique.is_empty() && self.not_null.is_empty()
    }
}

fn unknown_facts(shared: &Shared, plan: &Plan) -> UnknownFacts {
    let facts = &shared.column_facts;
    let mut unit_key: Vec<(String, String)> = plan.unit_key().into_iter().collect();
    unit_key.extend(plan.unit_lookup_keys());
    let columns: Vec<(String, String)> = plan
        .column_arguments()
        .into_iter()
        .map(|(_, column)| column)
        .collect();
    UnknownFacts {
        unique: facts.unverified(ColumnFact::Unique, &unit_key),
        not_null: facts.unverified(ColumnFact::NotNull, &columns),
    }
}

impl Session {
    /// Analysis, rewrite and mechanisms: everything decided before the upstream is touched,
    /// and the upstream facts the plan consulted that are not known yet (none for a plan from
    /// the cache: one is kept only when all were known, and a process forgets no fact while
    /// its plan cache lives). `text` is `query` as printed (`query.to_string()`, printed once
    /// per query by the caller): the plan cache's key, so it must be this statement's own
    /// (checked in debug builds).
    fn prepare_dp(
        &self,
        shared: &Shared,
        query: &ast::Query,
        text: &str,
        params: &[Option<String>],
        secret: &str,
        listed: Option<&ListedKey>,
    ) -> Result<(Plan, Rewrite, release::Mechanisms, UnknownFacts)> {
        let context = self.context(shared);
        // Kept under the statement without its output aliases when the plan does not depend
        // on them (no post-processing SQL naming them), so a tool that numbers its aliases per
        // query hits; else under the statement itself (plans module invariants).
        debug_assert_eq!(
            text,
            query.to_string(),
            "the plan cache's key is the statement"
        );
        let listed_text = listed.map(|l| format!("{l:?}"));
        let key_of = |statement: &str| {
            super::plans::PlanKey::new(
                &self.analyst.name,
                statement,
                &context.search_path,
                params,
                listed_text.clone(),
                secret,
            )
        };
        let names = analyze::output_names(query);
        let generic_key = match &names {
            Some(_) => alias_free(query, text).and_then(|generic| key_of(&generic)),
            None => None,
        };
        let key = key_of(text);
        let renamed = |(mut plan, rewrite): (Plan, Rewrite)| {
            let names = names.as_deref()?;
            plan.rename_outputs(names).then_some((plan, rewrite))
        };
        let kept = generic_key
            .as_ref()
            .and_then(|k| shared.plans.get(k))
            .and_then(renamed)
            .or_else(|| key.as_ref().and_then(|k| shared.plans.get(k)));
        let (plan, rewrite, unknown) = match kept {
            Some((plan, rewrite)) => (plan, rewrite, UnknownFacts::default()),
            None => {
                let started = std::time::Instant::now();
                let mut plan = analyze::analyze(query, &context)?;
                shared.metrics.stage(Stage::Analyse, started.elapsed());
                if let Some(listed) = listed {
                    plan.list_key(listed);
                }
                let facts = shared.column_facts.as_ref();
                plan.assume_unique_unit(facts);
                plan.assume_unit_lookup(facts);
                plan.assume_not_null(facts);
                let started = std::time::Instant::now();
                let rewrite = rewrite::rewrite(&plan, params, secret)?;
                shared.metrics.stage(Stage::Rewrite, started.elapsed());
                // Kept only when every fact it consulted was known (plans module invariant).
                let unknown = unknown_facts(shared, &plan);
                if unknown.is_empty() {
                    match (generic_key, key) {
                        (Some(generic), _) if named_by(&plan, names.as_deref()) => {
                            shared.plans.put(generic, &plan, &rewrite)
                        }
                        (_, Some(key)) => shared.plans.put(key, &plan, &rewrite),
                        _ => {}
                    }
                }
                (plan, rewrite, unknown)
            }
        };
        let mut budget = self.budget();
        if let Some(target) = self.settings.max_error {
            let cap = super::settings::epsilon_cap(&self.analyst);
            budget = release::budget_for_error(&plan, &rewrite, budget, target, cap)?;
        }
        super::settings::check_epsilon(budget.epsilon, &self.analyst)?;
        let mut mechanisms = release::mechanisms(&plan, &rewrite, budget)?;
        mechanisms.max_error = self.settings.max_error;
        mechanisms.clamp_means = self.settings.clamp_means;
        mechanisms.max_relative_error = self.settings.max_relative_error;
        mechanisms.max_bias = self.settings.max_bias;
        Ok((plan, rewrite, mechanisms, unknown))
    }

    /// [`Session::plan_dp_placed`] without the placement.
    pub(super) async fn plan_dp(
        &self,
        shared: &Shared,
        query: &ast::Query,
        params: &[Option<String>],
        secret: &str,
    ) -> Result<(Plan, Rewrite, release::Mechanisms)> {
        let text = query.to_string();
        let (plan, rewrite, mechanisms, _) = self
            .plan_dp_placed(shared, query, &text, params, secret, None)
            .await?;
        Ok((plan, rewrite, mechanisms))
    }

    /// [`Session::plan_dp_for_one_server`], in the partitionwise shape when the private tables
    /// the plan reads are partitioned by their unit upstream (learnt once per process from the
    /// upstream catalog, [`crate::upstream::partitioning`]). Both shapes give the same rows on
    /// any partitioning; a failed lookup leaves the single-server shape.
    pub(super) async fn plan_dp_placed(
        &self,
        shared: &Shared,
        query: &ast::Query,
        text: &str,
        params: &[Option<String>],
        secret: &str,
        listed: Option<&ListedKey>,
    ) -> Result<(Plan, Rewrite, release::Mechanisms, Placement)> {
        let (plan, rewrite, mechanisms) = self
            .plan_dp_for_one_server(shared, query, text, params, secret, listed)
            .await?;
        let tables: Vec<(String, Option<String>)> = tables_read(&plan, &shared.policy)
            .into_iter()
            .filter_map(|name| {
                let private = shared.policy.tables.get(&name)?.private()?;
                match (&private.privacy_unit, &private.unit_path) {
                    (None, None) => None,
                    (unit, _) => Some((name, unit.clone())),
                }
            })
            .collect();
        // Public tables too: on Citus, whether each is a reference table (EXPLAIN's claim).
        let public: Vec<(String, Option<String>)> = tables_read(&plan, &shared.policy)
            .into_iter()
            .filter(|name| {
                shared
                    .policy
                    .tables
                    .get(name)
                    .is_some_and(|t| t.private().is_none())
            })
            .map(|name| (name, None))
            .collect();
        let mut unknown = shared.partitioning.unknown(&tables);
        unknown.extend(shared.partitioning.unknown(&public));
        if !unknown.is_empty() {
            // A failed lookup is tried again on the next query; until then, one server's shape.
            let _ = shared
                .upstream
                .learn_partitioning(&shared.partitioning, &unknown)
                .await;
        }
        let mut placement = shared.partitioning.placement(&tables);
        if let Placement::Distributed { local, .. } = &mut placement {
            *local = shared
                .partitioning
                .first_local(&tables_read(&plan, &shared.policy));
        }
        let rewrite = placement
            .shape(&plan, &shared.policy)
            .apply(rewrite, &shared.policy)?;
        Ok((plan, rewrite, mechanisms, placement))
    }

    /// [`Session::prepare_dp`], after learning (once per process, from the upstream catalog)
    /// whether the plan's unit column is unique, so the rewrite can use the unique-unit form
    /// (docs/privacy.md, "Unique units"), whether the table it joins on the unit has one row
    /// per unit, so the rewrite can aggregate below the join ("Lookups on the privacy unit"),
    /// and which of its aggregate arguments are columns
    /// declared `NOT NULL`, whose count of values is then the count of rows ("Facts pgdp reads
    /// from the upstream catalog"). A failed lookup leaves the general form, which is always
    /// sound.
    async fn plan_dp_for_one_server(
        &self,
        shared: &Shared,
        query: &ast::Query,
        text: &str,
        params: &[Option<String>],
        secret: &str,
        listed: Option<&ListedKey>,
    ) -> Result<(Plan, Rewrite, release::Mechanisms)> {
        let (plan, rewrite, mechanisms, unknown) =
            self.prepare_dp(shared, query, text, params, secret, listed)?;
        let facts = &shared.column_facts;
        if unknown.is_empty() {
            return Ok((plan, rewrite, mechanisms));
        }
        let UnknownFacts {
            unique: unknown_unique,
            not_null: unknown_not_null,
        } = unknown;
        let upstream = &shared.upstream;
        let learnt = match upstream
            .learn_column_facts(facts, ColumnFact::Unique, &unknown_unique)
            .await
        {
            Ok(_) => upstream
                .learn_column_facts(facts, ColumnFact::NotNull, &unknown_not_null)
                .await
                .is_ok(),
            Err(_) => false,
        };
        if learnt {
            let (plan, rewrite, mechanisms, _) =
                self.prepare_dp(shared, query, text, params, secret, listed)?;
            Ok((plan, rewrite, mechanisms))
        } else {
            Ok((plan, rewrite, mechanisms))
        }
    }

    /// The result columns a DP query will have (for Describe), without running it.
    pub(super) async fn dp_columns(
        &self,
        shared: &Shared,
        query: &ast::Query,
    ) -> Result<Vec<OutColumn>> {
        if let Some(sql) = self.public_sql(shared, query).await? {
            return self.public_columns(shared, &sql).await;
        }
        let (set, calendar) = (super::setop::split(query)?, super::calendar::split(query)?);
        if let Some(composite) = Composite::of(&set, &calendar) {
            return self.composite_columns(shared, composite).await;
        }
        if let Some(series) = super::series::split(query) {
            return Box::pin(self.dp_columns(shared, &series.outer)).await;
        }
        if let Some(scalars) = self.scalars(shared, query).await? {
            return self.statement_columns(shared, &scalars.stand_in).await;
        }
        let plan = analyze::analyze(query, &self.context(shared))?;
        let text = query.to_string();
        Ok(self
            .answer_shape(shared, query, &text, &plan)
            .await?
            .columns)
    }

    /// The upstream SQL of a query over public tables alone ([`rewrite::public`]), with each
    /// table's columns in the order the shadow catalog (built from the upstream) has them.
    pub(super) async fn public_sql(
        &self,
        shared: &Shared,
        query: &ast::Query,
    ) -> Result<Option<rewrite::PublicSql>> {
        let ctx = self.context(shared);
        let Some(tables) = rewrite::public::public_tables(query, &ctx) else {
            return Ok(None);
        };
        let mut order = std::collections::BTreeMap::new();
        if let Some(shadow) = &shared.shadow {
            for table in tables {
                // The policy's names of a public table, whose declared columns the shadow has.
                let sql = crate::dp::sql::ShadowSql::new(format!(
                    "SELECT * FROM {}.{}",
                    ast::Ident::with_quote('"', &table.schema),
                    ast::Ident::with_quote('"', &table.name)
                ));
                if let Ok(columns) = shadow.post_columns(&sql).await {
                    let names = columns.into_iter().map(|(name, _, _)| name).collect();
                    order.insert(table.qualified_name(), names);
                }
            }
        }
        rewrite::public::public_query(query, &ctx, &order)
    }

    /// The columns of a query over public tables alone, as PostgreSQL prepares it on the shadow
    /// catalog (which has the public tables' declared columns): PostgreSQL's refusal of it
    /// (an unknown column, a type mismatch) comes from there, before the upstream sees it.
    async fn public_columns(
        &self,
        shared: &Shared,
        sql: &rewrite::PublicSql,
    ) -> Result<Vec<OutColumn>> {
        let shadow = shared.shadow.as_ref().ok_or_else(|| {
            Error::unsupported(
                "queries over public tables on this server",
                "pgdp describes them on its shadow catalog, which this server does not have; see the server log.",
            )
        })?;
        Ok(shadow
            .post_columns(&sql.shadow())
            .await?
            .into_iter()
            .map(|(name, oid, _)| OutColumn::new(name, CellType::Raw(oid)))
            .collect())
    }

    /// A main query joined to the top keys of another aggregate ([`super::series`]): the inner
    /// aggregate released (and charged) first, then the main query restricted to its released
    /// keys, released (and charged) in turn; the NOTICEs of both charges go before the answer.
    async fn series_limit(
        &mut self,
        shared: &Shared,
        series: &super::series::SeriesLimit,
        params: &[Option<String>],
    ) -> Result<ClientRows> {
        let inner = Box::pin(self.dp_query(shared, &series.inner, params)).await?;
        let columns: Vec<String> = inner.columns().iter().map(|c| c.name.clone()).collect();
        let outer = super::series::restrict(series, &columns, inner.rows())?;
        let answer = Box::pin(self.dp_query(shared, &outer, params)).await?;
        let mut notices = inner.notices().to_vec();
        notices.extend(answer.notices().iter().cloned());
        Ok(answer.with_notices(notices))
    }

    /// A query over public tables alone ([`rewrite::public`]): public data, answered as
    /// PostgreSQL answers it, charged nothing.
    async fn public_rows(&self, shared: &Shared, sql: &rewrite::PublicSql) -> Result<ClientRows> {
        let columns = self.public_columns(shared, sql).await?;
        let started = std::time::Instant::now();
        let rows = shared
            .upstream
            .run_public_query(sql, &self.settings.time_zone, &self.cancel)
            .await?;
        shared.metrics.stage(Stage::Upstream, started.elapsed());
        Ok(ClientRows::public(columns, rows))
    }

    /// The columns of a DP query's answer, with the types PostgreSQL gives the same SQL where
    /// the shadow catalog can describe it (`release::described_columns`), else pgdp's own.
    /// For a plan with post-processing, the shadow catalog must type it (it evaluates it too),
    /// and PostgreSQL's refusal of that SQL is the answer's, before anything is charged.
    /// `text` is `query` as printed (checked in debug builds).
    pub(super) async fn answer_shape(
        &self,
        shared: &Shared,
        query: &ast::Query,
        text: &str,
        plan: &Plan,
    ) -> Result<AnswerShape> {
        debug_assert_eq!(
            text,
            query.to_string(),
            "the described statement is the query"
        );
        let search_path = self.context(shared).search_path;
        let Some(post) = plan.post() else {
            let described = match &shared.shadow {
                Some(shadow) => shadow
                    .result_types(&described_statement(query, text), &search_path)
                    .await
                    .unwrap_or_default(),
                None => Vec::new(),
            };
            let described: Vec<Option<CellType>> =
                described.into_iter().map(CellType::released).collect();
            return Ok(AnswerShape {
                columns: release::described_columns(plan, self.settings.accuracy, &described),
                inputs: None,
            });
        };
        let shadow = shared.shadow.as_ref().ok_or_else(|| {
            Error::unsupported(
                "expressions over aggregates on this server",
                "pgdp evaluates them with PostgreSQL on its shadow catalog, which this server does not have; select the aggregates themselves.",
            )
        })?;
        // The released relation's types: as PostgreSQL types the keys and aggregates of the
        // analyst's statement, else pgdp's own.
        // The released relation: keys, aggregates and groupings as the measures statement
        // describes them, then under pgdp.accuracy the `e<i>` bounds (float8, pgdp's own).
        let own = release::columns(plan, self.settings.accuracy);
        let measured = release::columns(plan, false).len();
        let described = shadow
            .result_types(post.measures_statement(), &search_path)
            .await
            .filter(|d| d.len() == measured)
            .unwrap_or_default();
        let inputs: Vec<CellType> = own
            .iter()
            .enumerate()
            .map(|(i, c)| {
                described
                    .get(i)
                    .and_then(|oid| CellType::released(*oid))
                    .unwrap_or(c.ty)
            })
            .collect();
        let typing = release::post::post_sql(post, self.settings.accuracy, &own, &inputs, &[])?;
        let columns = released_columns(shadow.post_columns(&typing).await?)?;
        Ok(AnswerShape {
            columns,
            inputs: Some(inputs),
        })
    }

    /// Runs a DP query: replay, reuse, derivation, public domains, charge, upstream, release.
    pub(super) async fn dp_query(
        &mut self,
        shared: &Shared,
        query: &ast::Query,
        params: &[Option<String>],
    ) -> Result<ClientRows> {
        self.dp_query_listed(shared, query, params, None).await
    }

    /// [`Session::dp_query`], with the values of one key listed by the statement around it
    /// ([`Plan::list_key`]: a calendar's series), which are then its public domain.
    pub(super) async fn dp_query_listed(
        &mut self,
        shared: &Shared,
        query: &ast::Query,
        params: &[Option<String>],
        listed: Option<&ListedKey>,
    ) -> Result<ClientRows> {
        if let Some(sql) = self.public_sql(shared, query).await? {
            return self.public_rows(shared, &sql).await;
        }
        let (set, calendar) = (super::setop::split(query)?, super::calendar::split(query)?);
        if let Some(composite) = Composite::of(&set, &calendar) {
            return self.composite(shared, composite, params).await;
        }
        if let Some(series) = super::series::split(query) {
            return self.series_limit(shared, &series, params).await;
        }
        if let Some(scalars) = self.scalars(shared, query).await? {
            return self.scalar_release(shared, &scalars, params).await;
        }
        let planned = self.planned(shared, query, params, listed).await?;
        let found = self.found(shared, &planned).await;
        if let Some(answer) = self
            .answered_from_ledger(shared, query, params, &planned, found)
            .await?
        {
            return Ok(answer);
        }
        // The answer's column types, described on the shadow catalog before anything is charged.
        let shape = self
            .answer_shape(shared, query, &planned.text, &planned.plan)
            .await?;
        // Public domains read from public tables (no private data, no charge).
        let domains = self.public_domains(shared, &planned.plan, params).await?;
        // A count a policy synopsis covers is answered from it, paid for once.
        if self.settings.synopsis {
            if let Some(route) = rewrite::synopsis::route(&planned.plan, &shared.policy, params)? {
                if let Some(answer) = self
                    .synopsis_release(shared, &planned, &route, &domains, &shape)
                    .await?
                {
                    return Ok(answer);
                }
            }
        }
        let charging = self
            .charge_release(shared, planned, params, &domains)
            .await?;
        let measured = self.measured(shared, charging, &domains).await?;
        self.release(shared, params, measured, shape).await
    }

    /// The public domains of `plan`'s keys when they are all public, read from public tables
    /// where the policy names one (no private data, no charge); empty otherwise.
    pub(super) async fn public_domains(
        &self,
        shared: &Shared,
        plan: &Plan,
        params: &[Option<String>],
    ) -> Result<release::PublicDomains> {
        let mut domains = release::PublicDomains::new();
        if plan.keys_public() {
            for part in rewrite::domain::public_domain(plan, params)? {
                let rows = match part.sql() {
                    Some(sql) => {
                        let started = std::time::Instant::now();
                        let rows = shared
                            .upstream
                            .run_public_query(sql, &self.settings.time_zone, &self.cancel)
                            .await?;
                        shared.metrics.stage(Stage::Upstream, started.elapsed());
                        Some(rows.into_text())
                    }
                    None => None,
                };
                domains.push(part.into_combinations(rows)?);
            }
        }
        Ok(domains)
    }

    /// How the query chooses its cap on rows per unit under `pgdp.choose_bounds`
    /// ([`release::bounds::ChoicePlan`]); `None` when the setting is off or nothing is chosen.
    /// The objective weighs the rows a cap removes per group over the public domain's
    /// groups when the keys are public.
    pub(super) fn bounds_choice(
        &self,
        plan: &Plan,
        rewrite: &Rewrite,
        mechanisms: &release::Mechanisms,
        params: &[Option<String>],
        secret: &str,
        domains: &release::PublicDomains,
    ) -> Result<Option<release::bounds::ChoicePlan>> {
        if !self.settings.choose_bounds {
            return Ok(None);
        }
        let cells = (plan.keys_public() && !plan.keys().is_empty()).then(|| {
            domains
                .iter()
                .map(|(_, c)| c.len() as u64)
                .fold(1u64, u64::saturating_mul)
        });
        release::bounds::ChoicePlan::new(plan, rewrite, mechanisms, params, secret, cells)
    }

    /// [`Session::dp_query`] under the policy's release schedule: once the statement has been
    /// charged, its answer or its failure leaves at the first point of `schedule` after the
    /// work is done, so the time the upstream took shows only as which point it was
    /// (docs/security.md §2). CancelRequests wait for the points too
    /// ([`crate::upstream::Cancel::defer_to_release_points`]). Refusals before the charge depend
    /// on the SQL and the policy only and leave at once; so do replays, which do no work on
    /// private data.
    pub(super) async fn dp_query_on_schedule(
        &mut self,
        shared: &Shared,
        query: &ast::Query,
        params: &[Option<String>],
        schedule: crate::policy::ReleaseSchedule,
    ) -> Result<ClientRows> {
        let started = std::time::Instant::now();
        let charges = (self.charges, self.private_reads);
        let cancel = self.cancel.clone();
        let answer = {
            let _deferred = cancel.defer_to_release_points(started, schedule);
            self.dp_query(shared, query, params).await
        };
        if (self.charges, self.private_reads) != charges {
            let at = started + schedule.release_at(started.elapsed());
            tokio::time::sleep_until(at.into()).await;
        }
        answer
    }

    /// The answer from released rows: PostgreSQL's post-processing over them on the shadow
    /// catalog where the answer needs it ([`AnswerShape::inputs`]), else the rows retyped to
    /// the answer's columns.
    pub(super) async fn post_process(
        &self,
        shared: &Shared,
        plan: &Plan,
        released: Released,
        shape: AnswerShape,
    ) -> Result<Released> {
        match (&shape.inputs, &shared.shadow) {
            (Some(inputs), Some(shadow)) => {
                let who = self.analyst.name.clone();
                let zone = crate::upstream::time_zone_setting(&self.settings.time_zone)?;
                released
                    .post_processed(plan, self.settings.accuracy, inputs, shape.columns, |sql| {
                        let sql = sql.in_zone(&zone);
                        async move { shadow.evaluate(&who, &sql).await }
                    })
                    .await
            }
            _ => Ok(released.retyped(shape.columns)),
        }
    }
}

/// PostgreSQL's error from evaluating SQL over released values, its message saying `where`
/// (and that the charge stands); any other error unchanged.
pub(super) fn after_release(e: Error, place: &str) -> Error {
    match e {
        Error::PostProcessing {
            state,
            message,
            hint,
        } => Error::PostProcessing {
            state,
            hint,
            message: format!("{message} ({place})"),
        },
        other => other,
    }
}

/// The columns of SQL evaluated over released rows, as the shadow catalog described them
/// (name, type OID, type name): each of a type pgdp sends, or a refusal naming it.
pub(super) fn released_columns(described: Vec<(String, u32, String)>) -> Result<Vec<OutColumn>> {
    described
        .into_iter()
        .map(|(name, oid, type_name)| {
            let ty = CellType::released(oid).ok_or_else(|| {
                Error::unsupported(
                    format!("the column {name} of type {type_name}"),
                    "pgdp sends numbers, text, booleans, dates and timestamps; cast the expression to one of them.",
                )
            })?;
            Ok(OutColumn::new(name, ty))
        })
        .collect()
}

/// The answer's columns, and for a plan with post-processing the PostgreSQL types of the
/// released relation it reads.
#[derive(Clone)]
pub(super) struct AnswerShape {
    pub(super) columns: Vec<OutColumn>,
    inputs: Option<Vec<CellType>>,
}

#[cfg(test)]
mod tests {
    use super::{alias_free, described_statement, named_by};
    use crate::dp::{analyze, rewrite};

    fn described(sql: &str) -> String {
        let query = match super::super::classify::parse(sql).unwrap().pop().unwrap() {
            sqlparser::ast::Statement::Query(q) => q,
            other => panic!("not a query: {other}"),
        };
        described_statement(&query, &query.to_string())
    }

    #[test]
    fn aliases_named_nowhere_else_are_positional() {
        let a = described("SELECT COUNT(*) AS total_1, SUM(x) AS s_1 FROM t");
        let b = described("SELECT COUNT(*) AS total_2, SUM(x) AS \"S_2\" FROM t");
        assert_eq!(a, b);
        assert_eq!(a, "SELECT COUNT(*) AS pgdp_c0, SUM(x) AS pgdp_c1 FROM t");
    }

    #[test]
    fn aliases_used_elsewhere_are_kept() {
        // ORDER BY and GROUP BY may name an output column: renaming it would change the meaning.
        assert_eq!(
            described("SELECT region AS r, COUNT(*) AS total FROM t GROUP BY r ORDER BY total"),
            "SELECT region AS r, COUNT(*) AS total FROM t GROUP BY r ORDER BY total"
        );
        // An alias that is also a substring elsewhere (here of a column name) is kept.
        assert_eq!(
            described("SELECT SUM(income) AS inc FROM t"),
            "SELECT SUM(income) AS inc FROM t"
        );
        // Text that already holds the positional names is left alone.
        assert_eq!(
            described("SELECT COUNT(*) AS total, 1 AS pgdp_c0 FROM t"),
            "SELECT COUNT(*) AS total, 1 AS pgdp_c0 FROM t"
        );
    }

    /// Every select item of `query` aliased `<stem>_<i>`; `None` when an alias it had is named
    /// elsewhere in the text (renaming it would change the statement).
    fn aliased(query: &sqlparser::ast::Query, stem: &str) -> Option<sqlparser::ast::Query> {
        use sqlparser::ast::{Ident, SelectItem, SetExpr};
        let lower = query.to_string().to_lowercase();
        let mut query = query.clone();
        let SetExpr::Select(select) = query.body.as_mut() else {
            return None;
        };
        for (i, item) in select.projection.iter_mut().enumerate() {
            let alias = Ident::new(format!("{stem}_{i}"));
            *item = match item {
                SelectItem::UnnamedExpr(expr) => SelectItem::ExprWithAlias {
                    expr: expr.clone(),
                    alias,
                },
                SelectItem::ExprWithAlias { expr, alias: old }
                    if lower.matches(&old.value.to_lowercase()).count() == 1 =>
                {
                    SelectItem::ExprWithAlias {
                        expr: expr.clone(),
                        alias,
                    }
                }
                _ => return None,
            };
        }
        Some(query)
    }

    /// The plan cache's alias-free key (plans module invariants): for every statement of the
    /// golden corpus, aliased two ways, when the first plan is kept under the key without its
    /// aliases, the second statement has that key and its plan and rewrite are the first's with
    /// the second's output names.
    #[test]
    fn statements_differing_only_in_unused_aliases_plan_alike_but_for_names() {
        let policy = crate::session::demo_policy();
        let ctx = crate::dp::plan::Context {
            policy: &policy,
            search_path: vec!["demo".to_string()],
        };
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/cases");
        let mut compared = 0;
        for entry in std::fs::read_dir(dir).expect("cases") {
            let path = entry.expect("entry").path();
            if path.extension().is_none_or(|e| e != "case") {
                continue;
            }
            let text = std::fs::read_to_string(&path).expect("case file");
            for sql in text.lines().filter_map(|l| l.strip_prefix("-- sql: ")) {
                let Ok(mut parsed) = super::super::classify::parse(sql) else {
                    continue;
                };
                let Some(sqlparser::ast::Statement::Query(query)) = parsed.pop() else {
                    continue;
                };
                let (Some(one), Some(two)) = (aliased(&query, "one"), aliased(&query, "two"))
                else {
                    continue;
                };
                let (Ok(plan_one), Ok(plan_two)) =
                    (analyze::analyze(&one, &ctx), analyze::analyze(&two, &ctx))
                else {
                    continue;
                };
                let names_one = analyze::output_names(&one);
                if !named_by(&plan_one, names_one.as_deref()) {
                    continue;
                }
                let key_one = alias_free(&one, &one.to_string());
                assert!(key_one.is_some(), "{sql}");
                assert_eq!(key_one, alias_free(&two, &two.to_string()), "{sql}");
                let names_two = analyze::output_names(&two).expect("names");
                let mut renamed = plan_one.clone();
                assert!(renamed.rename_outputs(&names_two));
                assert_eq!(renamed, plan_two, "{sql}");
                let params: Vec<Option<String>> = vec![Some("1".into()); 8];
                assert_eq!(
                    rewrite::rewrite(&plan_one, &params, "s").ok(),
                    rewrite::rewrite(&plan_two, &params, "s").ok(),
                    "{sql}"
                );
                compared += 1;
            }
        }
        assert!(compared >= 100, "only {compared} statements compared");
    }
}
