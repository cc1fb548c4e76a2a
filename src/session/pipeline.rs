//! One DP query's release as stages, each a type the next consumes, so that their order is
//! the compiler's: [`Planned`] (plan, rewrite, mechanisms and the ledger keys of the release;
//! nothing read, nothing charged) → [`Found`] (what the analyst's ledger already holds: a
//! replay, noisy measures to reuse or to derive from, answered free) → [`Charging`] (the
//! charge, durable and bound to the statement the upstream will run; at a cap chosen per
//! query, the contribution histogram run under it and the cap chosen) → [`Measured`] (the
//! upstream's rows, which only the noise reads) → the release (finished, post-processed,
//! stored for replays and reuse, with its NOTICEs).
//!
//! Invariants: the upstream runs a release's SQL only inside [`Session::charge_release`] and
//! [`Session::measured`], each time with the [`budget::Charged`] statement (consumed by the
//! run), so a [`Charging`] exists only after a durable charge; private rows leave
//! [`Session::measured`] only as noisy measures ([`release::measure`]); an answer served from
//! the ledger ([`Session::answered_from_ledger`]) reads only released values.

use sqlparser::ast;

use crate::budget::{self, Balance, ChargeId, Cost, Stored, Window};
use crate::dp::plan::{ListedKey, Plan};
use crate::dp::release::{self, bounds::ChosenBounds, NoisyMeasures, PublicDomains, Released};
use crate::dp::rewrite::{self, Rewrite};
use crate::error::{Error, Result};
use crate::metrics::{Lookup, Served, Stage};
use crate::upstream::{Placement, Pooled};

use super::dp::{after_release, limit_of, tables_read, AnswerShape};
use super::notices::{answer_notices, charge_notice, remaining_text};
use super::{ClientRows, Notice, Session, Shared};

/// The ledger keys a DP query's release is stored and looked up under.
pub(super) struct ReleaseKeys {
    /// The answer's replay key: the analyst's whole query, the bound parameters and every
    /// privacy setting (and pgdp.max_relative_error's value, under which the entry may be a
    /// refusal).
    pub(super) answer: String,
    /// The key of the released rows themselves, without pgdp.max_relative_error.
    pub(super) rows: String,
    /// The key of the noisy measures the query needs, for reuse.
    pub(super) measures: String,
    /// The key of measures derived for this grouping from a finer release, when it could be.
    pub(super) derived: Option<String>,
}

/// Stage 1: a DP query planned at its placement, with the keys of its release. Nothing has
/// been read from the data and nothing charged.
pub(super) struct Planned<'s> {
    /// The analyst's statement as printed (the key of its plan and of its release).
    pub(super) text: String,
    pub(super) plan: Plan,
    pub(super) rewrite: Rewrite,
    pub(super) mechanisms: release::Mechanisms,
    pub(super) placement: Placement,
    pub(super) keys: ReleaseKeys,
    /// The group-choice secret the plan was made with (the ledger's).
    secret: &'s str,
}

impl Planned<'_> {
    fn shape(&self, policy: &crate::policy::Policy) -> rewrite::UpstreamShape {
        self.placement.shape(&self.plan, policy)
    }
}

/// Stage 2: what the analyst's ledger holds under a planned release's keys (one round trip;
/// a ledger that cannot be read holds nothing).
pub(super) struct Found {
    /// The answer, released before (or a refusal under pgdp.max_relative_error).
    replay: Option<Stored>,
    /// Noisy measures drawn for an earlier query with the same measures.
    stored: Option<Stored>,
    /// Measures derived for this grouping from a finer release.
    derived: Option<Stored>,
}

impl Found {
    /// 1b: the noisy measures an earlier release drew for the same measures and mechanisms.
    fn drawn(&self, planned: &Planned<'_>) -> Option<NoisyMeasures> {
        self.stored.as_ref().and_then(|p| {
            NoisyMeasures::from_payload(p, &planned.plan, &planned.rewrite)
                .filter(|m| m.derived_from().is_none())
        })
    }

    /// 1c: the sums of the cells of a finer release over public keys.
    fn summed(&self, planned: &Planned<'_>) -> Option<NoisyMeasures> {
        self.derived.as_ref().and_then(|p| {
            NoisyMeasures::from_payload(p, &planned.plan, &planned.rewrite)
                .filter(|m| m.derived_from().is_some())
        })
    }

    /// Whether the release will be answered from the ledger, charged nothing (measures
    /// stored at caps chosen for an earlier query count, under `choose_bounds`).
    pub(super) fn answers(&self, planned: &Planned<'_>, choose_bounds: bool) -> bool {
        self.replay.is_some()
            || (self.stored.is_some() && choose_bounds)
            || self.drawn(planned).is_some()
            || self.summed(planned).is_some()
    }
}

/// Stage 3: a release charged durably: the statement the upstream may run bound to its
/// receipt, and the plan, rewrite and mechanisms it answers with (at a cap chosen per query,
/// those of the chosen cap).
pub(super) struct Charging<'s> {
    planned: Planned<'s>,
    chosen: Option<ChosenBounds>,
    charged: budget::Charged<release::Statement>,
    connection: Pooled<'s>,
    /// What was charged (at a chosen cap, the histogram's and the answer's together).
    cost: Cost,
}

/// Stage 4: the upstream's rows turned into noisy measures; the charge's receipt as read.
pub(super) struct Measured<'s> {
    planned: Planned<'s>,
    chosen: Option<ChosenBounds>,
    measures: NoisyMeasures,
    charge: ChargeId,
    balance: Balance,
    window: Option<Window>,
    cost: Cost,
}

/// What a charge pays for.
#[derive(Debug, Clone, Copy)]
pub(super) enum Paying<'a> {
    /// A query's release by this mechanism (`laplace`, `gaussian`, …, for the audit log).
    Query(&'a str),
    /// Synopsis `name` under its declaration's fingerprint `declaration`, once per analyst.
    Synopsis { name: &'a str, declaration: &'a str },
}

impl Session {
    /// Stage 1: `query` planned (in the partitionwise shape where its tables are partitioned
    /// by their unit), the unique keys of its unit paths verified upstream, and its release's
    /// ledger keys.
    pub(super) async fn planned<'s>(
        &self,
        shared: &'s Shared,
        query: &ast::Query,
        params: &[Option<String>],
        listed: Option<&ListedKey>,
    ) -> Result<Planned<'s>> {
        let secret = shared.secret().await?;
        // Printed once: the plan cache's key, the release keys and the described statement.
        let text = query.to_string();
        let (plan, rewrite, mechanisms, placement) = self
            .plan_dp_placed(shared, query, &text, params, secret, listed)
            .await?;
        // A row of a table with a unit path has one unit only if each key of the path is unique.
        shared
            .upstream
            .verify_unique_keys(&shared.column_facts, plan.unique_keys())
            .await?;
        let keys = self.release_keys(&text, params, listed, (&plan, &rewrite, &mechanisms))?;
        Ok(Planned {
            text,
            plan,
            rewrite,
            mechanisms,
            placement,
            keys,
            secret,
        })
    }

    /// Stage 2: the entries of `planned`'s keys in the analyst's ledger, in one round trip. A
    /// ledger that cannot be read is a miss: the query is then charged like a new one (under
    /// a budget slice reserved before the ledger went down, if one covers it), which costs the
    /// analyst at most a second charge and never releases anything uncharged.
    pub(super) async fn found(&self, shared: &Shared, planned: &Planned<'_>) -> Found {
        let started = std::time::Instant::now();
        let keys = &planned.keys;
        let mut lookup: Vec<&str> = vec![&keys.answer, &keys.measures];
        lookup.extend(keys.derived.as_deref());
        let looked_up = shared
            .ledger
            .replay_lookup(&self.analyst.name, &lookup, shared.policy.replay_lifetime)
            .await;
        if looked_up.is_err() {
            shared.metrics.ledger_failed();
        }
        let looked_up = looked_up.unwrap_or_default();
        if looked_up.skipped {
            shared.metrics.replay_index_skip();
        }
        let mut found = looked_up.entries.into_iter();
        shared.metrics.stage(Stage::Ledger, started.elapsed());
        Found {
            replay: found.next().flatten(),
            stored: found.next().flatten(),
            derived: found.next().flatten(),
        }
    }

    /// The answer from what the ledger holds, charged nothing: 1. a replay of the same query
    /// (or its refusal under pgdp.max_relative_error); 1b. the noisy measures an earlier query
    /// drew for the same measures, post-processed again for this one; 1c. measures derived
    /// from a finer release over public keys; 1d. measures released at caps chosen for an
    /// earlier query with the same measures key, at those caps. `None`: a new release.
    pub(super) async fn answered_from_ledger(
        &mut self,
        shared: &Shared,
        query: &ast::Query,
        params: &[Option<String>],
        planned: &Planned<'_>,
        found: Found,
    ) -> Result<Option<ClientRows>> {
        let Planned {
            plan,
            rewrite,
            mechanisms,
            ..
        } = planned;
        shared
            .metrics
            .replay_lookup(Lookup::Answer, found.replay.is_some());
        if let Some(refusal) = found.replay.as_ref().and_then(Refusal::stored) {
            self.served = Some(Served::Replayed);
            return Err(refusal.into_error());
        }
        if let Some(payload) = &found.replay {
            let columns = self
                .answer_shape(shared, query, &planned.text, plan)
                .await?
                .columns;
            if let Some(replayed) = Released::replayed(columns, payload) {
                let limit = limit_of(&self.analyst.budget)?;
                let (balance, window) = shared
                    .ledger
                    .balance_with_window(&self.analyst.name, &limit)
                    .await?;
                let mut notices = vec![Notice::new(format!(
                        "pgdp: identical query answered again from the replay cache; charged nothing; {}",
                        remaining_text(&balance, window, false)
                    ))];
                // A replay keeps no measures: the bound of one draw (a grouping set's own
                // release), which understates it only for an answer derived from finer cells.
                if let Some(note) = release::detection_note(plan, rewrite, mechanisms, None) {
                    notices.push(Notice::new(note));
                }
                let chose = self.settings.choose_bounds
                    && mechanisms.max_error.is_none()
                    && release::bounds::may_choose(plan, rewrite);
                if chose {
                    notices.push(Notice::new("pgdp: the contribution bound of this answer was chosen when it was first released; that answer's NOTICE stated it and the rows it removed"));
                } else if let Some(note) = release::capped_statistic(plan) {
                    notices.push(Notice::new(format!(
                        "pgdp: {note} (EXPLAIN shows the caps, the bounds and the SQL)"
                    )));
                }
                self.served = Some(Served::Replayed);
                return Ok(Some(ClientRows::released(replayed, notices)));
            }
        }
        shared
            .metrics
            .replay_lookup(Lookup::Measures, found.stored.is_some());
        // (Under pgdp.choose_bounds there is no derived key.)
        if let Some(measures) = found.drawn(planned).or_else(|| found.summed(planned)) {
            self.served = Some(Served::Reused);
            let answer = self
                .reuse(
                    shared,
                    (query, &planned.text),
                    (plan, rewrite, mechanisms),
                    &measures,
                    None,
                )
                .await?;
            return Ok(Some(answer));
        }
        // 1d. That query's choice (the same plan, budget and candidates) at the caps it chose,
        // which the payload carries (released values).
        if let (Some(payload), true) = (&found.stored, self.settings.choose_bounds) {
            let secret = planned.secret;
            let domains = self.public_domains(shared, plan, params).await?;
            let choice = self.bounds_choice(plan, rewrite, mechanisms, params, secret, &domains)?;
            let at_chosen = choice.as_ref().and_then(|choice| {
                let (chosen, rest) = ChosenBounds::stored(payload.bytes(), &choice.choice)?;
                let rest = payload.suffix(rest)?;
                let (p, r, m) = choice
                    .answer(
                        plan,
                        &chosen,
                        params,
                        secret,
                        planned.shape(&shared.policy),
                        &shared.policy,
                    )
                    .ok()?;
                let measures = NoisyMeasures::from_payload(&rest, &p, &r)
                    .filter(|m| m.derived_from().is_none())?;
                Some((p, r, m, chosen, measures))
            });
            if let Some((p, r, m, chosen, measures)) = at_chosen {
                self.served = Some(Served::Reused);
                let answer = self
                    .reuse(
                        shared,
                        (query, &planned.text),
                        (&p, &r, &m),
                        &measures,
                        Some(&chosen),
                    )
                    .await?;
                return Ok(Some(answer));
            }
        }
        Ok(None)
    }

    /// Stage 3: the charge, durable, before the upstream sees the statement; an upstream
    /// connection is taken first, so an unreachable upstream refuses (57P03) without
    /// spending. The charge is bound to the statement it pays for (`Charged`): the upstream
    /// runs nothing else. With a cap chosen for this query (`release::bounds`, decided from
    /// the public `domains` and the settings): the charge covers the contribution histogram
    /// and the answer at any cap it may choose; the histogram runs under it, then its noise
    /// chooses the cap, and the charge passes to the answer's plan, rewrite and mechanisms at
    /// that cap (which cost no more: `Charged::narrowed`).
    pub(super) async fn charge_release<'s>(
        &mut self,
        shared: &'s Shared,
        planned: Planned<'s>,
        params: &[Option<String>],
        domains: &PublicDomains,
    ) -> Result<Charging<'s>> {
        let choice = self.bounds_choice(
            &planned.plan,
            &planned.rewrite,
            &planned.mechanisms,
            params,
            planned.secret,
            domains,
        )?;
        // The histogram reads what the answer reads: on shards, in the same shape.
        let choice = match choice {
            Some(mut choice) => {
                choice.sql = planned
                    .shape(&shared.policy)
                    .apply_to_histogram(choice.sql, &shared.policy)?;
                Some(choice)
            }
            None => None,
        };
        let connection = shared.upstream.get_for_read().await?;
        let tables = tables_read(&planned.plan, &shared.policy);
        let mechanism = planned.mechanisms.budget.mechanism.name();
        let key = planned.keys.answer.clone();
        let Some(choice) = choice else {
            let statement = release::Statement::of(&planned.rewrite, &planned.mechanisms);
            let charged = self
                .charge(shared, statement, &key, mechanism, &tables)
                .await?;
            return Ok(Charging {
                cost: planned.mechanisms.cost,
                planned,
                chosen: None,
                charged,
                connection,
            });
        };
        let statement = release::ChoiceStatement::of(&choice);
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
            release::bounds::choose(&choice.choice, &rows, choice.noise_per_row(), &mut self.rng)
        });
        let answer = chosen.and_then(|chosen| {
            let (p, r, m) = choice.answer(
                &planned.plan,
                &chosen,
                params,
                planned.secret,
                planned.shape(&shared.policy),
                &shared.policy,
            )?;
            let charged = charged.narrowed(|_| Ok(release::Statement::of(&r, &m)))?;
            Ok((p, r, m, chosen, charged))
        });
        let (plan, rewrite, mechanisms, chosen, charged) = match answer {
            Ok(a) => a,
            Err(e) => {
                shared
                    .ledger
                    .set_outcome(charge_id, "choosing bounds failed");
                return Err(e);
            }
        };
        let connection = match shared.upstream.get_for_read().await {
            Ok(c) => c,
            Err(e) => {
                shared.ledger.set_outcome(charge_id, "upstream failed");
                return Err(e);
            }
        };
        Ok(Charging {
            planned: Planned {
                plan,
                rewrite,
                mechanisms,
                ..planned
            },
            chosen: Some(chosen),
            charged,
            connection,
            cost: choice.cost(),
        })
    }

    /// Charges `item`'s own cost to the analyst (and the dataset's budget), durably, and
    /// counts it for the session's NOTICEs and the metrics: the item bound to its receipt.
    pub(super) async fn charge<T: budget::Priced>(
        &mut self,
        shared: &Shared,
        item: T,
        fingerprint: &str,
        mechanism: &str,
        tables: &[String],
    ) -> Result<budget::Charged<T>> {
        self.charge_paying(shared, item, fingerprint, Paying::Query(mechanism), tables)
            .await
    }

    /// [`Session::charge`] of a query's release or of a payment for a synopsis (whose cost the
    /// dataset's budget takes once, from the first analyst's payment:
    /// [`crate::budget::Ledger::charge_synopsis_payment`]).
    pub(super) async fn charge_paying<T: budget::Priced>(
        &mut self,
        shared: &Shared,
        item: T,
        fingerprint: &str,
        paying: Paying<'_>,
        tables: &[String],
    ) -> Result<budget::Charged<T>> {
        let limit = limit_of(&self.analyst.budget)?;
        let dataset_limit = match &shared.policy.dataset_budget {
            Some(b) => Some(limit_of(b)?),
            None => None,
        };
        let cost = item.cost();
        let started = std::time::Instant::now();
        let ledger = &shared.ledger;
        let analyst = &self.analyst.name;
        let dataset_limit = dataset_limit.as_ref();
        let charged = match paying {
            Paying::Query(mechanism) => {
                ledger
                    .charge_for(
                        analyst,
                        &limit,
                        dataset_limit,
                        item,
                        fingerprint,
                        mechanism,
                        tables,
                    )
                    .await?
            }
            Paying::Synopsis { name, declaration } => {
                ledger
                    .charge_synopsis_payment(
                        name,
                        declaration,
                        analyst,
                        &limit,
                        dataset_limit,
                        item,
                        fingerprint,
                        tables,
                    )
                    .await?
            }
        };
        shared.metrics.stage(Stage::Ledger, started.elapsed());
        shared
            .metrics
            .charged(&self.analyst.name, &cost, charged.receipt().balance());
        self.last_cost = Some(cost);
        self.charges += 1;
        Ok(charged)
    }

    /// Stage 4: the upstream runs the charged statement (a failure keeps the charge), and its
    /// rows are read only by the noise: the noisy measures of the release.
    pub(super) async fn measured<'s>(
        &mut self,
        shared: &Shared,
        charging: Charging<'s>,
        domains: &PublicDomains,
    ) -> Result<Measured<'s>> {
        let Charging {
            planned,
            chosen,
            charged,
            connection,
            cost,
        } = charging;
        let charge = charged.receipt().id();
        let balance = *charged.receipt().balance();
        let window = charged.receipt().window();
        let started = std::time::Instant::now();
        let rows = match connection
            .run_release_query(charged, &self.settings.time_zone, &self.cancel)
            .await
        {
            Ok(rows) => rows,
            Err(e) => {
                shared.ledger.set_outcome(charge, "upstream failed");
                return Err(e);
            }
        };
        shared.metrics.stage(Stage::Upstream, started.elapsed());
        let measures = release::measure(
            &planned.plan,
            &planned.rewrite,
            &planned.mechanisms,
            &rows,
            domains,
            &mut self.rng,
        )?;
        Ok(Measured {
            planned,
            chosen,
            measures,
            charge,
            balance,
            window,
            cost,
        })
    }

    /// Stage 5: the release: the noisy measures finished into rows (under
    /// pgdp.max_relative_error, a refusal is kept with the rows it refuses, stored for a
    /// replay without the setting), post-processed by PostgreSQL on the shadow catalog into
    /// `shape`, stored for replays, reuse and the coarser groupings it answers, and sent with
    /// the charge's NOTICEs.
    pub(super) async fn release(
        &mut self,
        shared: &Shared,
        params: &[Option<String>],
        measured: Measured<'_>,
        shape: AnswerShape,
    ) -> Result<ClientRows> {
        let Measured {
            planned,
            chosen,
            measures,
            charge,
            balance,
            window,
            cost,
        } = measured;
        let Planned {
            plan,
            rewrite,
            mechanisms,
            placement,
            keys,
            secret,
            ..
        } = planned;
        let started = std::time::Instant::now();
        let (released, refused) = match release::finish(
            &plan,
            &rewrite,
            &mechanisms,
            &measures,
            self.settings.accuracy,
        ) {
            Ok(released) => (released, None),
            // Refused under the session's accuracy or bias guard: the rows are finished
            // without it, to be stored for a replay with the setting off.
            Err(e) => {
                let refusal = Refusal::of(e)?;
                let unchecked = release::Mechanisms {
                    max_relative_error: None,
                    max_bias: None,
                    ..mechanisms.clone()
                };
                let released = release::finish(
                    &plan,
                    &rewrite,
                    &unchecked,
                    &measures,
                    self.settings.accuracy,
                )?;
                (released, Some(refusal))
            }
        };
        // Post-processing by PostgreSQL over the released rows, on the shadow catalog.
        let released = match self.post_process(shared, &plan, released, shape).await {
            Ok(released) => released,
            Err(e) => {
                shared.ledger.set_outcome(charge, "post-processing failed");
                return Err(after_release(
                    e,
                    "in the post-processing of released values; the charge for them stands",
                ));
            }
        };
        shared.metrics.stage(Stage::Release, started.elapsed());
        let answer = released.replay_payload();
        let measured = measures.payload();
        let refusal: Vec<u8> = refused.as_ref().map(Refusal::payload).unwrap_or_default();
        let mut entries: Vec<(&str, &[u8])> = match &refused {
            None => vec![(&keys.answer, &answer)],
            Some(_) => vec![(&keys.answer, &refusal), (&keys.rows, &answer)],
        };
        // At chosen caps, the caps go with the measures: a later query with the same measures
        // key reads both, and is answered at those caps.
        let measured = match &chosen {
            Some(chosen) => chosen.stored_with(&measured),
            None => measured,
        };
        if measures.storable() {
            entries.push((&keys.measures, &measured));
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
                placement.shape(&plan, &shared.policy),
                &shared.policy,
            )
            .into_iter()
            .map(|(k, m)| (in_zone(k, &self.settings.time_zone), m.payload()))
            .collect()
        } else {
            Vec::new()
        };
        entries.extend(coarser.iter().map(|(k, p)| (k.as_str(), p.as_slice())));
        // Written by the ledger's journal after the answer has left.
        shared
            .ledger
            .record_release(charge, &self.analyst.name, &entries);
        self.served = Some(Served::AnsweredDp);
        if let Some(refusal) = refused {
            return Err(refusal.into_error());
        }
        let notices = answer_notices(
            charge_notice(&cost, &balance, window),
            (&plan, &rewrite, &mechanisms),
            (&released, &measures),
            chosen.as_ref(),
        );
        Ok(ClientRows::released(released, notices))
    }

    /// The ledger keys of the release of the query printed as `query_text` ([`ReleaseKeys`])
    /// under the session's settings, from its plan, rewrite and mechanisms, its bound
    /// `params`, and the values of a key listed by the statement around it.
    pub(super) fn release_keys(
        &self,
        query_text: &str,
        params: &[Option<String>],
        listed: Option<&ListedKey>,
        (plan, rewrite, mechanisms): (&Plan, &Rewrite, &release::Mechanisms),
    ) -> Result<ReleaseKeys> {
        let budget = mechanisms.budget;
        // The replay key is the analyst's whole query (HAVING, ORDER BY and LIMIT are applied by
        // pgdp, so the upstream SQL alone does not identify the answer), the bound parameters
        // and every privacy setting.
        let mut bound = String::new();
        for (i, p) in params.iter().enumerate() {
            if i > 0 {
                bound.push('\u{1f}');
            }
            match p {
                Some(v) => {
                    bound.push('v');
                    bound.push_str(v);
                }
                None => bound.push_str("null"),
            }
        }
        let mut key = budget::Fingerprint::default();
        key.part(query_text);
        key.part(&bound);
        key.part(rewrite.sql.as_str());
        key.printed(format_args!("{}", budget.epsilon));
        key.printed(format_args!("{}", budget.delta));
        key.part(budget.mechanism.name());
        key.part(if self.settings.accuracy {
            "accuracy"
        } else {
            ""
        });
        let key = key.finish();
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
                let values: Vec<&str> = listed
                    .values()
                    .iter()
                    .flatten()
                    .map(String::as_str)
                    .collect();
                budget::fingerprint(&[&key, "listed", listed.column(), &values.join("\u{1f}")])
            }
            None => key,
        };
        // Under pgdp.max_relative_error (or pgdp.max_bias, below) the answer may be a refusal:
        // its entry is the refusal ([`Refusal::payload`]), and the rows are stored under the key without the setting, so that
        // asking again without it replays them, free.
        let rows_key = key.clone();
        let key = match self.settings.max_relative_error {
            Some(share) => budget::fingerprint(&[&key, &format!("max_relative_error={share}")]),
            None => key,
        };
        // Likewise under pgdp.max_bias (only answers at chosen caps can be refused for it).
        let key = match self.settings.max_bias {
            Some(share) if self.settings.choose_bounds => {
                budget::fingerprint(&[&key, &format!("max_bias={share}")])
            }
            _ => key,
        };
        // The key of the noisy measures this query needs, for reuse (1b).
        let measures_key = {
            let domain = if plan.keys_public() {
                rewrite::domain::public_domain(plan, params)?
            } else {
                Vec::new()
            };
            let key = release::measures_key(plan, rewrite, mechanisms, params, &domain);
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
        let derived_key = (derivable(plan, rewrite) && !self.settings.choose_bounds)
            .then(|| release::derived_key(&measures_key));
        Ok(ReleaseKeys {
            answer: key,
            rows: rows_key,
            measures: measures_key,
            derived: derived_key,
        })
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
        (query, text): (&ast::Query, &str),
        (plan, rewrite, mechanisms): (&Plan, &Rewrite, &release::Mechanisms),
        measures: &release::NoisyMeasures,
        chosen: Option<&release::bounds::ChosenBounds>,
    ) -> Result<ClientRows> {
        let shape = self.answer_shape(shared, query, text, plan).await?;
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
}

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

/// Whether `plan` could be answered by adding up the cells of a finer release
/// ([`release::derive`]): no grouping sets, public keys, fewer than
/// [`crate::limits::COARSER_GROUPINGS_KEYS_MAX`] of them, additive measures.
fn derivable(plan: &Plan, rewrite: &Rewrite) -> bool {
    plan.grouping_sets().is_none()
        && plan.keys_public()
        && plan.keys().len() < crate::limits::COARSER_GROUPINGS_KEYS_MAX
        && release::derive::additive(rewrite)
}

/// An answer refused after its release under the session's `pgdp.max_relative_error`
/// ([`Error::TooInaccurate`]) or `pgdp.max_bias` ([`Error::TooBiased`]), with the refusal's
/// detail: stored for replay under the answer's key, so that asking again is refused the same
/// way, free.
#[derive(Debug, Clone, PartialEq)]
enum Refusal {
    Inaccurate(String),
    Biased(String),
}

/// The replay entries of refusals: this prefix, then the detail (never the start of a replay
/// payload of rows).
const REFUSED_PAYLOAD: &[u8] = b"pgdp-refused-too-inaccurate\x1f";
const REFUSED_BIASED_PAYLOAD: &[u8] = b"pgdp-refused-too-biased\x1f";

impl Refusal {
    /// The refusal `error` is; any other error back.
    fn of(error: Error) -> Result<Refusal> {
        match error {
            Error::TooInaccurate { detail } => Ok(Refusal::Inaccurate(detail)),
            Error::TooBiased { detail } => Ok(Refusal::Biased(detail)),
            other => Err(other),
        }
    }

    fn into_error(self) -> Error {
        match self {
            Refusal::Inaccurate(detail) => Error::TooInaccurate { detail },
            Refusal::Biased(detail) => Error::TooBiased { detail },
        }
    }

    fn payload(&self) -> Vec<u8> {
        match self {
            Refusal::Inaccurate(d) => [REFUSED_PAYLOAD, d.as_bytes()].concat(),
            Refusal::Biased(d) => [REFUSED_BIASED_PAYLOAD, d.as_bytes()].concat(),
        }
    }

    /// The refusal stored for replay, if `stored` is one.
    fn stored(stored: &budget::Stored) -> Option<Refusal> {
        let text = |d: &[u8]| String::from_utf8_lossy(d).into_owned();
        let bytes = stored.bytes();
        if let Some(d) = bytes.strip_prefix(REFUSED_PAYLOAD) {
            Some(Refusal::Inaccurate(text(d)))
        } else {
            bytes
                .strip_prefix(REFUSED_BIASED_PAYLOAD)
                .map(|d| Refusal::Biased(text(d)))
        }
    }
}
