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

use crate::budget::{self, Fixed, Limit};
use crate::dp::analyze;
use crate::dp::plan::{ListedKey, Plan};
use crate::dp::release::{self, Released};
use crate::dp::rewrite::{self, Rewrite};
use crate::error::{Error, Result};
use crate::metrics::{Lookup, Served, Stage};
use crate::output::{CellType, OutColumn};
use crate::policy::BudgetSpec;
use crate::upstream::{ColumnFact, Placement};

use super::composite::Composite;
use super::notices::{answer_notices, charge_notice, remaining_text};
use super::{ClientRows, Notice, Session, Shared};

/// A policy budget as exact ledger limits (rounded down: never in the analyst's favour), per
/// window of its `period` when it renews.
pub fn limit_of(spec: &BudgetSpec) -> Result<Limit> {
    let e = Fixed::from_f64_floor(spec.epsilon).map_err(|_| Error::internal("budget epsilon"))?;
    let d = Fixed::from_f64_floor(spec.delta).map_err(|_| Error::internal("budget delta"))?;
    Ok(Limit::new(e, d).per(spec.period))
}

/// The policy tables `plan` reads, sorted, each once, for the audit log (`pgdp audit`): the
/// tables of FROM and of semijoins, and the policy tables inside the SQL pgdp built for derived
/// tables and unit paths. Names only: no value of the query enters the log.
fn tables_read(plan: &Plan, policy: &crate::policy::Policy) -> Vec<String> {
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
fn described_statement(query: &ast::Query) -> String {
    let text = query.to_string();
    let lower = text.to_lowercase();
    if lower.contains("pgdp_c") {
        return text;
    }
    let mut renamed = query.clone();
    let ast::SetExpr::Select(select) = renamed.body.as_mut() else {
        return text;
    };
    let mut changed = false;
    for (i, item) in select.projection.iter_mut().enumerate() {
        if let ast::SelectItem::ExprWithAlias { alias, .. } = item {
            if lower.matches(&alias.value.to_lowercase()).count() == 1 {
                *alias = ast::Ident::new(format!("pgdp_c{i}"));
                changed = true;
            }
        }
    }
    if changed {
        renamed.to_string()
    } else {
        text
    }
}

impl Session {
    /// Analysis, rewrite and mechanisms: everything decided before the upstream is touched.
    fn prepare_dp(
        &self,
        shared: &Shared,
        query: &ast::Query,
        params: &[Option<String>],
        secret: &str,
        listed: Option<&ListedKey>,
    ) -> Result<(Plan, Rewrite, release::Mechanisms)> {
        let started = std::time::Instant::now();
        let mut plan = analyze::analyze(query, &self.context(shared))?;
        shared.metrics.stage(Stage::Analyse, started.elapsed());
        if let Some(listed) = listed {
            plan.list_key(listed);
        }
        let facts = &shared.catalog_facts;
        plan.assume_unique_unit(|key| facts.holds(ColumnFact::Unique, key));
        plan.assume_unit_lookup(|key| facts.holds(ColumnFact::Unique, key));
        plan.assume_not_null(|column| facts.holds(ColumnFact::NotNull, column));
        let started = std::time::Instant::now();
        let rewrite = rewrite::rewrite(&plan, params, secret)?;
        shared.metrics.stage(Stage::Rewrite, started.elapsed());
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
        Ok((plan, rewrite, mechanisms))
    }

    /// [`Session::plan_dp_placed`] without the placement.
    pub(super) async fn plan_dp(
        &self,
        shared: &Shared,
        query: &ast::Query,
        params: &[Option<String>],
        secret: &str,
    ) -> Result<(Plan, Rewrite, release::Mechanisms)> {
        let (plan, rewrite, mechanisms, _) = self
            .plan_dp_placed(shared, query, params, secret, None)
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
        params: &[Option<String>],
        secret: &str,
        listed: Option<&ListedKey>,
    ) -> Result<(Plan, Rewrite, release::Mechanisms, Placement)> {
        let (plan, rewrite, mechanisms) = self
            .plan_dp_for_one_server(shared, query, params, secret, listed)
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
        let unknown = shared.partitioning.unknown(&tables);
        if !unknown.is_empty() {
            // A failed lookup is tried again on the next query; until then, one server's shape.
            let _ = shared
                .upstream
                .learn_partitioning(&shared.partitioning, &unknown)
                .await;
        }
        let placement = shared.partitioning.placement(&tables);
        let rewrite = match placement {
            Placement::ByUnit { .. } => rewrite::partitionwise(rewrite)?,
            _ => rewrite,
        };
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
        params: &[Option<String>],
        secret: &str,
        listed: Option<&ListedKey>,
    ) -> Result<(Plan, Rewrite, release::Mechanisms)> {
        let prepared = self.prepare_dp(shared, query, params, secret, listed)?;
        let facts = &shared.catalog_facts;
        let mut unit_key: Vec<(String, String)> = prepared.0.unit_key().into_iter().collect();
        unit_key.extend(prepared.0.unit_lookup_keys());
        let columns: Vec<(String, String)> = prepared
            .0
            .column_arguments()
            .into_iter()
            .map(|(_, column)| column)
            .collect();
        let unknown_unique = facts.unverified(ColumnFact::Unique, &unit_key);
        let unknown_not_null = facts.unverified(ColumnFact::NotNull, &columns);
        if unknown_unique.is_empty() && unknown_not_null.is_empty() {
            return Ok(prepared);
        }
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
            self.prepare_dp(shared, query, params, secret, listed)
        } else {
            Ok(prepared)
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
        Ok(self.answer_shape(shared, query, &plan).await?.columns)
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
                let sql = format!(
                    "SELECT * FROM {}.{}",
                    ast::Ident::with_quote('"', &table.schema),
                    ast::Ident::with_quote('"', &table.name)
                );
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
            .post_columns(sql.as_str())
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
    pub(super) async fn answer_shape(
        &self,
        shared: &Shared,
        query: &ast::Query,
        plan: &Plan,
    ) -> Result<AnswerShape> {
        let search_path = self.context(shared).search_path;
        let Some(post) = plan.post() else {
            let described = match &shared.shadow {
                Some(shadow) => shadow
                    .result_types(&described_statement(query), &search_path)
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
        let secret = shared.secret().await?;
        let (plan, rewrite, mechanisms, placement) = self
            .plan_dp_placed(shared, query, params, secret, listed)
            .await?;
        // A row of a table with a unit path has one unit only if each key of the path is unique.
        shared
            .upstream
            .verify_unique_keys(&shared.catalog_facts, plan.unique_keys())
            .await?;
        let budget = mechanisms.budget;
        // The replay key is the analyst's whole query (HAVING, ORDER BY and LIMIT are applied by
        // pgdp, so the upstream SQL alone does not identify the answer), the bound parameters
        // and every privacy setting.
        let query_text = query.to_string();
        let bound: Vec<String> = params
            .iter()
            .map(|p| {
                p.as_deref()
                    .map(|v| format!("v{v}"))
                    .unwrap_or_else(|| "null".into())
            })
            .collect();
        let bound = bound.join("\u{1f}");
        let key = budget::fingerprint(&[
            &query_text,
            &bound,
            rewrite.sql.as_str(),
            &budget.epsilon.to_string(),
            &budget.delta.to_string(),
            budget.mechanism.name(),
            if self.settings.accuracy {
                "accuracy"
            } else {
                ""
            },
        ]);
        // Unclamped means are another answer to the same query; the default keeps the keys
        // stored before the setting existed.
        let key = if self.settings.clamp_means {
            key
        } else {
            budget::fingerprint(&[&key, "unclamped means"])
        };
        // A cap chosen per query is another answer to the same query.
        let key = if self.settings.choose_bounds {
            budget::fingerprint(&[&key, "chosen bounds"])
        } else {
            key
        };
        let key = in_zone(key, &self.settings.time_zone);
        // Keys listed by the statement around the query are another answer to it.
        let key = match listed {
            Some(listed) => {
                let values: Vec<&str> =
                    listed.values.iter().flatten().map(String::as_str).collect();
                budget::fingerprint(&[&key, "listed", &listed.column, &values.join("\u{1f}")])
            }
            None => key,
        };
        // Under pgdp.max_relative_error the answer may be a refusal: its entry is the refusal
        // (REFUSED_PAYLOAD), and the rows are stored under the key without the setting, so that
        // asking again without it replays them, free.
        let rows_key = key.clone();
        let key = match self.settings.max_relative_error {
            Some(share) => budget::fingerprint(&[&key, &format!("max_relative_error={share}")]),
            None => key,
        };
        let ledger = &shared.ledger;
        let analyst = self.analyst.name.clone();

        // The key of the noisy measures this query needs, for reuse (1b).
        let measures_key = {
            let domain = if plan.keys_public() {
                rewrite::domain::public_domain(&plan, params)?
            } else {
                Vec::new()
            };
            let key = release::measures_key(&plan, &rewrite, &mechanisms, params, &domain);
            // Measures at chosen caps are stored with those caps (their noise is that caps'),
            // under a key of their own, so such a query reuses none stored at the tables' caps
            // and a query at the tables' caps none stored at chosen ones.
            let key = if self.settings.choose_bounds {
                budget::fingerprint(&[&key, "chosen bounds"])
            } else {
                key
            };
            in_zone(key, &self.settings.time_zone)
        };
        // The key of measures derived for this grouping from a finer release of the analyst's
        // (issue 16 part 3), when this query could be answered so.
        let derived_key = (derivable(&plan, &rewrite) && !self.settings.choose_bounds)
            .then(|| release::derived_key(&measures_key));
        // All looked up at once, in one ledger round trip.
        let started = std::time::Instant::now();
        // A ledger that cannot be read is a miss: the query is then charged like a new one
        // (under a budget slice reserved before the ledger went down, if one covers it), which
        // costs the analyst at most a second charge and never releases anything uncharged.
        let mut keys: Vec<&str> = vec![&key, &measures_key];
        keys.extend(derived_key.as_deref());
        let looked_up = ledger
            .replay_lookup(&analyst, &keys, shared.policy.replay_lifetime)
            .await;
        if looked_up.is_err() {
            shared.metrics.ledger_failed();
        }
        let mut found = looked_up.unwrap_or_default().into_iter();
        shared.metrics.stage(Stage::Ledger, started.elapsed());
        let (replay, stored, derived) = (
            found.next().flatten(),
            found.next().flatten(),
            found.next().flatten(),
        );

        // 1. Replay: the same query again gets the same noisy answer, free.
        shared
            .metrics
            .replay_lookup(Lookup::Answer, replay.is_some());
        if let Some(detail) = replay.as_ref().and_then(refused_detail) {
            self.served = Some(Served::Replayed);
            return Err(Error::TooInaccurate { detail });
        }
        if let Some(payload) = replay {
            let columns = self.answer_shape(shared, query, &plan).await?.columns;
            if let Some(replayed) = Released::replayed(columns, &payload) {
                let limit = limit_of(&self.analyst.budget)?;
                let (balance, window) = ledger.balance_with_window(&analyst, &limit).await?;
                let mut notices = vec![Notice::new(format!(
                        "pgdp: identical query answered again from the replay cache; charged nothing; {}",
                        remaining_text(&balance, window, false)
                    ))];
                // A replay keeps no measures: the bound of one draw (a grouping set's own
                // release), which understates it only for an answer derived from finer cells.
                if let Some(note) = release::detection_note(&plan, &rewrite, &mechanisms, None) {
                    notices.push(Notice::new(note));
                }
                let chose = self.settings.choose_bounds
                    && mechanisms.max_error.is_none()
                    && release::bounds::may_choose(&plan, &rewrite);
                if chose {
                    notices.push(Notice::new("pgdp: the contribution bound of this answer was chosen when it was first released; that answer's NOTICE stated it and the rows it removed"));
                } else if let Some(note) = release::capped_statistic(&plan) {
                    notices.push(Notice::new(format!(
                        "pgdp: {note} (EXPLAIN shows the caps, the bounds and the SQL)"
                    )));
                }
                self.served = Some(Served::Replayed);
                return Ok(ClientRows::released(replayed, notices));
            }
        }

        // 1b. Reuse: the noisy measures an earlier release of this analyst drew for the same
        // measures and mechanisms, post-processed again for this query, free.
        shared
            .metrics
            .replay_lookup(Lookup::Measures, stored.is_some());
        // 1c. Derivation: the sums of the cells of a finer release of this analyst over public
        // keys (release::derive), free. (Under pgdp.choose_bounds there is no derived key.)
        let drawn = stored.as_ref().and_then(|p| {
            release::NoisyMeasures::from_payload(p, &plan, &rewrite)
                .filter(|m| m.derived_from().is_none())
        });
        let summed = derived.as_ref().and_then(|p| {
            release::NoisyMeasures::from_payload(p, &plan, &rewrite)
                .filter(|m| m.derived_from().is_some())
        });
        if let Some(measures) = drawn.or(summed) {
            self.served = Some(Served::Reused);
            return self
                .reuse(
                    shared,
                    query,
                    (&plan, &rewrite, &mechanisms),
                    &measures,
                    None,
                )
                .await;
        }
        // Measures released at caps chosen for an earlier query with the same measures key:
        // that query's choice (the same plan, budget and candidates) at the caps it chose,
        // which the payload carries (released values).
        if let (Some(payload), true) = (&stored, self.settings.choose_bounds) {
            let domains = self.public_domains(shared, &plan, params).await?;
            let choice =
                self.bounds_choice(&plan, &rewrite, &mechanisms, params, secret, &domains)?;
            let at_chosen = choice.as_ref().and_then(|choice| {
                let (chosen, rest) =
                    release::bounds::ChosenBounds::stored(payload.bytes(), &choice.choice)?;
                let rest = payload.suffix(rest)?;
                let partitionwise = matches!(placement, Placement::ByUnit { .. });
                let (p, r, m) = choice
                    .answer(&plan, &chosen, params, secret, partitionwise)
                    .ok()?;
                let measures = release::NoisyMeasures::from_payload(&rest, &p, &r)
                    .filter(|m| m.derived_from().is_none())?;
                Some((p, r, m, chosen, measures))
            });
            if let Some((p, r, m, chosen, measures)) = at_chosen {
                self.served = Some(Served::Reused);
                return self
                    .reuse(shared, query, (&p, &r, &m), &measures, Some(&chosen))
                    .await;
            }
        }

        // The answer's column types, described on the shadow catalog before anything is charged.
        let shape = self.answer_shape(shared, query, &plan).await?;

        // 2. Public domains read from public tables (no private data, no charge).
        let domains = self.public_domains(shared, &plan, params).await?;

        // 2b. A cap on rows per unit chosen for this query from a DP histogram of its data
        // (release::bounds), decided now so that the charge covers the histogram and the answer.
        let choice = self.bounds_choice(&plan, &rewrite, &mechanisms, params, secret, &domains)?;

        // 3. Charge, durably, before the upstream sees the statement; an upstream connection is
        // taken first, so an unreachable upstream refuses (57P03) without spending. The charge
        // is bound to the statement it pays for (`Charged`): the upstream runs nothing else.
        let connection = shared.upstream.get_for_read().await?;
        let tables = tables_read(&plan, &shared.policy);
        let mechanism = budget.mechanism.name();

        // 3b. With a cap chosen for this query: the charge covers the contribution histogram
        // and the answer at any cap it may choose; the histogram runs under it, then its noise
        // chooses the cap, and the charge passes to the answer's plan, rewrite and mechanisms at
        // that cap (which cost no more: `Charged::narrowed`).
        let (plan, rewrite, mechanisms, connection, chosen, charged) = match &choice {
            None => {
                let statement = release::Statement::of(&rewrite, &mechanisms);
                let charged = self
                    .charge(shared, statement, &key, mechanism, &tables)
                    .await?;
                (plan, rewrite, mechanisms, connection, None, charged)
            }
            Some(choice) => {
                let statement = release::ChoiceStatement::of(choice);
                let charged = self
                    .charge(shared, statement, &key, mechanism, &tables)
                    .await?;
                let charge_id = charged.receipt().id();
                let started = std::time::Instant::now();
                let histogram = connection
                    .run_choice_query(&charged, &self.settings.time_zone, &self.cancel)
                    .await;
                shared.metrics.stage(Stage::Upstream, started.elapsed());
                let chosen = histogram.and_then(|rows| {
                    release::bounds::choose(
                        &choice.choice,
                        &rows,
                        choice.noise_per_row(),
                        &mut self.rng,
                    )
                });
                let answer = chosen.and_then(|chosen| {
                    let (p, r, m) = choice.answer(
                        &plan,
                        &chosen,
                        params,
                        secret,
                        matches!(placement, Placement::ByUnit { .. }),
                    )?;
                    let charged = charged.narrowed(|_| Ok(release::Statement::of(&r, &m)))?;
                    Ok((p, r, m, chosen, charged))
                });
                let (p, r, m, chosen, charged) = match answer {
                    Ok(a) => a,
                    Err(e) => {
                        ledger.set_outcome(charge_id, "choosing bounds failed");
                        return Err(e);
                    }
                };
                let connection = match shared.upstream.get_for_read().await {
                    Ok(c) => c,
                    Err(e) => {
                        ledger.set_outcome(charge_id, "upstream failed");
                        return Err(e);
                    }
                };
                (p, r, m, connection, Some(chosen), charged)
            }
        };
        let charge_id = charged.receipt().id();
        let balance = *charged.receipt().balance();
        let window = charged.receipt().window();
        let cost = choice.as_ref().map_or(mechanisms.cost, |c| c.cost());

        // 4. The upstream, which takes the charged statement; a failure keeps the charge.
        let started = std::time::Instant::now();
        let rows = match connection
            .run_release_query(charged, &self.settings.time_zone, &self.cancel)
            .await
        {
            Ok(rows) => rows,
            Err(e) => {
                ledger.set_outcome(charge_id, "upstream failed");
                return Err(e);
            }
        };

        shared.metrics.stage(Stage::Upstream, started.elapsed());

        // 5. Noise (the only way to read the rows), then post-processing of the noisy measures.
        let started = std::time::Instant::now();
        let measures =
            release::measure(&plan, &rewrite, &mechanisms, &rows, &domains, &mut self.rng)?;
        // Under pgdp.max_relative_error, a refusal is kept with the rows it refuses, which are
        // stored for a replay without the setting.
        let (released, refused) = match release::finish(
            &plan,
            &rewrite,
            &mechanisms,
            &measures,
            self.settings.accuracy,
        ) {
            Ok(released) => (released, None),
            Err(Error::TooInaccurate { detail }) => {
                let unchecked = release::Mechanisms {
                    max_relative_error: None,
                    ..mechanisms.clone()
                };
                let released = release::finish(
                    &plan,
                    &rewrite,
                    &unchecked,
                    &measures,
                    self.settings.accuracy,
                )?;
                (released, Some(detail))
            }
            Err(e) => return Err(e),
        };
        // 6. Post-processing by PostgreSQL over the released rows, on the shadow catalog.
        let released = match self.post_process(shared, &plan, released, shape).await {
            Ok(released) => released,
            Err(e) => {
                ledger.set_outcome(charge_id, "post-processing failed");
                return Err(after_release(
                    e,
                    "in the post-processing of released values; the charge for them stands",
                ));
            }
        };
        shared.metrics.stage(Stage::Release, started.elapsed());
        let answer = released.replay_payload();
        let measured = measures.payload();
        let refusal: Vec<u8> = refused
            .as_ref()
            .map(|d| [REFUSED_PAYLOAD, d.as_bytes()].concat())
            .unwrap_or_default();
        let mut entries: Vec<(&str, &[u8])> = match &refused {
            None => vec![(&key, &answer)],
            Some(_) => vec![(&key, &refusal), (&rows_key, &answer)],
        };
        // At chosen caps, the caps go with the measures: a later query with the same measures
        // key reads both, and is answered at those caps.
        let measured = match &chosen {
            Some(chosen) => chosen.stored_with(&measured),
            None => measured,
        };
        if measures.storable() {
            entries.push((&measures_key, &measured));
        }
        // Coarser groupings are derived only from measures at the tables' caps.
        let storable = measures.storable() && chosen.is_none();
        // The coarser groupings this release answers (release::derive), each under the key the
        // coarser query itself will look up.
        let coarser: Vec<(String, Vec<u8>)> = if storable {
            release::derive::coarser_releases(
                &plan,
                &rewrite,
                &mechanisms,
                &measures,
                params,
                secret,
                matches!(placement, Placement::ByUnit { .. }),
            )
            .into_iter()
            .map(|(k, m)| (in_zone(k, &self.settings.time_zone), m.payload()))
            .collect()
        } else {
            Vec::new()
        };
        entries.extend(coarser.iter().map(|(k, p)| (k.as_str(), p.as_slice())));
        // Written by the ledger's journal after the answer has left.
        ledger.record_release(charge_id, &analyst, &entries);
        self.served = Some(Served::AnsweredDp);
        if let Some(detail) = refused {
            return Err(Error::TooInaccurate { detail });
        }
        let notices = answer_notices(
            charge_notice(&cost, &balance, window),
            (&plan, &rewrite, &mechanisms),
            (&released, &measures),
            chosen.as_ref(),
        );
        Ok(ClientRows::released(released, notices))
    }

    /// Charges `item`'s own cost to the analyst (and the dataset's budget), durably, and
    /// counts it for the session's NOTICEs and the metrics: the item bound to its receipt.
    async fn charge<T: budget::Priced>(
        &mut self,
        shared: &Shared,
        item: T,
        fingerprint: &str,
        mechanism: &str,
        tables: &[String],
    ) -> Result<budget::Charged<T>> {
        let limit = limit_of(&self.analyst.budget)?;
        let dataset_limit = match &shared.policy.dataset_budget {
            Some(b) => Some(limit_of(b)?),
            None => None,
        };
        let cost = item.cost();
        let started = std::time::Instant::now();
        let charged = shared
            .ledger
            .charge_for(
                &self.analyst.name,
                &limit,
                dataset_limit.as_ref(),
                item,
                fingerprint,
                mechanism,
                tables,
            )
            .await?;
        shared.metrics.stage(Stage::Ledger, started.elapsed());
        shared
            .metrics
            .charged(&self.analyst.name, &cost, charged.receipt().balance());
        self.last_cost = Some(cost);
        self.charges += 1;
        Ok(charged)
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
        let charges = self.charges;
        let cancel = self.cancel.clone();
        let answer = {
            let _deferred = cancel.defer_to_release_points(started, schedule);
            self.dp_query(shared, query, params).await
        };
        if self.charges != charges {
            let at = started + schedule.release_at(started.elapsed());
            tokio::time::sleep_until(at.into()).await;
        }
        answer
    }

    /// A DP query answered from noisy measures an earlier release of the same analyst stored
    /// under the same [`release::measures_key`], or the sums of a finer release's cells stored
    /// under its [`release::derived_key`]: [`release::finish`] and the post-processing by
    /// PostgreSQL run again over them, for this query's HAVING, ORDER BY, LIMIT, expressions
    /// and names. Post-processing of released values: nothing is charged, nothing reaches the
    /// upstream.
    async fn reuse(
        &self,
        shared: &Shared,
        query: &ast::Query,
        (plan, rewrite, mechanisms): (&Plan, &Rewrite, &release::Mechanisms),
        measures: &release::NoisyMeasures,
        chosen: Option<&release::bounds::ChosenBounds>,
    ) -> Result<ClientRows> {
        let shape = self.answer_shape(shared, query, plan).await?;
        let released =
            release::finish(plan, rewrite, mechanisms, measures, self.settings.accuracy)?;
        let released = self
            .post_process(shared, plan, released, shape)
            .await
            .map_err(|e| after_release(e, "in the post-processing of released values"))?;
        let limit = limit_of(&self.analyst.budget)?;
        let (balance, window) = shared
            .ledger
            .balance_with_window(&self.analyst.name, &limit)
            .await?;
        let first = match measures.derived_from() {
            None if chosen.is_some() => format!(
                "pgdp: answered from the noisy measures released for an earlier query (same tables, filters, grouping and noise, at the contribution bounds that query chose; HAVING, ORDER BY, LIMIT and expressions recomputed over them); charged nothing; {}",
                remaining_text(&balance, window, false)
            ),
            None => format!(
                "pgdp: answered from the noisy measures released for an earlier query (same tables, filters, grouping, bounds and noise; HAVING, ORDER BY, LIMIT and expressions recomputed over them); charged nothing; {}",
                remaining_text(&balance, window, false)
            ),
            Some(from) => format!(
                "pgdp: derived from the noisy measures released for an earlier query grouped by ({from}) (same tables, filters, bounds and noise): each group is the sum of up to {} of its cells, so its noise is the sum of that many independent noises (variances add; SET pgdp.accuracy = on shows each bound); charged nothing; {}",
                measures.cells_max(),
                remaining_text(&balance, window, false)
            ),
        };
        let notices = answer_notices(
            first,
            (plan, rewrite, mechanisms),
            (&released, measures),
            chosen,
        );
        Ok(ClientRows::released(released, notices))
    }

    /// The answer from released rows: PostgreSQL's post-processing over them on the shadow
    /// catalog where the answer needs it ([`AnswerShape::inputs`]), else the rows retyped to
    /// the answer's columns.
    async fn post_process(
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
                        let sql = format!("{zone}{sql}");
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

/// Whether `plan` could be answered by adding up the cells of a finer release
/// ([`release::derive`]): no grouping sets, public keys, fewer than
/// [`crate::limits::COARSER_GROUPINGS_KEYS_MAX`] of them, additive measures.
/// A replay or measures key of an answer computed in the session's `time_zone`: PostgreSQL
/// computes `date_trunc` of a date or a `timestamptz`, and prints a `timestamptz`, in the
/// session's zone, so an answer computed in another zone is another answer. Keys of the
/// default zone (UTC) are unchanged, so entries stored before zones were part of the key
/// still match.
fn in_zone(key: String, time_zone: &str) -> String {
    if time_zone == "UTC" {
        key
    } else {
        format!("{key}@TimeZone={time_zone}")
    }
}

fn derivable(plan: &Plan, rewrite: &Rewrite) -> bool {
    plan.grouping_sets().is_none()
        && plan.keys_public()
        && plan.keys().len() < crate::limits::COARSER_GROUPINGS_KEYS_MAX
        && release::derive::additive(rewrite)
}

/// The answer's columns, and for a plan with post-processing the PostgreSQL types of the
/// released relation it reads.
pub(super) struct AnswerShape {
    pub(super) columns: Vec<OutColumn>,
    inputs: Option<Vec<CellType>>,
}

/// The replay entry of an answer refused under `pgdp.max_relative_error`: this prefix, then the
/// refusal's detail (never the start of a replay payload of rows).
const REFUSED_PAYLOAD: &[u8] = b"pgdp-refused-too-inaccurate\x1f";

/// The detail of a refusal stored for replay, if `payload` is one.
fn refused_detail(stored: &budget::Stored) -> Option<String> {
    stored
        .bytes()
        .strip_prefix(REFUSED_PAYLOAD)
        .map(|d| String::from_utf8_lossy(d).into_owned())
}

#[cfg(test)]
mod tests {
    use super::described_statement;

    fn described(sql: &str) -> String {
        let query = match super::super::classify::parse(sql).unwrap().pop().unwrap() {
            sqlparser::ast::Statement::Query(q) => q,
            other => panic!("not a query: {other}"),
        };
        described_statement(&query)
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
}
