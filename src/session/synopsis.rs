//! A count answered from a policy synopsis (private multiplicative weights,
//! [`crate::dp::mechanism::pmw`]; routing in [`crate::dp::rewrite::synopsis`]).
//!
//! The order is the privacy argument, and the types hold its key steps:
//! 1. An exhausted synopsis (every round started, none in progress here) answers nothing and
//!    charges nothing: the per-query path answers.
//! 2. The analyst pays once per synopsis declaration: a durable charge of the synopsis's whole
//!    cost ([`release::SynopsisStatement`], `2T + 1` pure parts of `ε/(2T + 1)`), recorded as the
//!    analyst's payment; the histogram is read only under the [`crate::budget::SynopsisPass`] the
//!    ledger makes from a recorded payment.
//! 3. The private histogram is read from the upstream and handed to the synopsis opaque; the
//!    cells each group counts come from PostgreSQL's evaluation of WHERE on the domain's
//!    literals (public).
//! 4. Each group is one counting query to the shared synopsis: a new round is counted in the
//!    ledger before it begins, and an update's noisy count is stored before it is answered.
//!    The whole transcript (every analyst's answers) is `ε`-DP (docs/privacy.md §13), so what
//!    any analyst sees of it costs at most the `ε` they paid.
//! 5. The answer is post-processing of the synopsis's released values: the per-query path's
//!    HAVING, ORDER BY, LIMIT and PostgreSQL post-processing apply; NOTICEs state where the
//!    counts came from and their bounds. Nothing is stored for replay or reuse (the synopsis
//!    itself answers a repeated query alike until an update).

use std::collections::HashMap;

use crate::budget;
use crate::dp::mechanism::pmw::{
    Answer, CellSet, PrivateHistogram, ReleasedState, Synopsis, SynopsisParams,
};
use crate::dp::release::{self, NoisyMeasures, PublicDomains};
use crate::dp::rewrite::{self, synopsis::Route};
use crate::error::{Error, Result};
use crate::metrics::{Served, Stage};
use crate::policy::Synopsis as Declared;

use super::dp::AnswerShape;
use super::notices::charge_notice;
use super::pipeline::{Paying, Planned};
use super::{ClientRows, Notice, Session, Shared};

/// The synopses a process has loaded, by [`state_key`].
pub(super) type Loaded = HashMap<String, Synopsis>;

/// The key of a declared synopsis's state: its name and declaration fingerprint.
fn state_key(declared: &Declared) -> String {
    format!("{}\u{1f}{}", declared.name, declared.fingerprint())
}

fn params_of(declared: &Declared) -> SynopsisParams {
    SynopsisParams {
        cells: declared.cells(),
        sensitivity: declared.rows_per_unit,
        epsilon: declared.epsilon,
        rounds: declared.rounds,
        threshold: declared.accuracy,
    }
}

fn released_of(stored: budget::StoredSynopsis, cells: usize) -> Result<ReleasedState> {
    let measurements = stored
        .measurements
        .into_iter()
        .map(|(c, noisy)| CellSet::new(c, cells).map(|c| (c, noisy)))
        .collect::<Result<Vec<_>>>()?;
    Ok(ReleasedState {
        total: stored.total,
        measurements,
        rounds_started: stored.rounds_started,
    })
}

/// How a synopsis answered one query's groups, for the NOTICE.
#[derive(Default)]
struct Tally {
    estimates: usize,
    updates: usize,
    estimate_bound: f64,
    update_bound: f64,
    rounds_started: usize,
}

impl Session {
    /// The answer of `planned` from the synopsis `route` names, or `None` when that synopsis is
    /// exhausted (the per-query path then answers; nothing was charged for it here).
    pub(super) async fn synopsis_release(
        &mut self,
        shared: &Shared,
        planned: &Planned<'_>,
        route: &Route,
        domains: &PublicDomains,
        shape: &AnswerShape,
    ) -> Result<Option<ClientRows>> {
        let declared = shared
            .policy
            .synopses
            .get(&route.synopsis)
            .ok_or_else(|| Error::internal("a route to an undeclared synopsis"))?;
        if planned.rewrite.measures.len() != 1 || self.synopsis_exhausted(shared, declared).await? {
            return Ok(None);
        }
        let fingerprint = declared.fingerprint();
        let analyst = self.analyst.name.clone();
        let (pass, paid_now) = match shared
            .ledger
            .synopsis_pass(&declared.name, &fingerprint, &analyst)
            .await?
        {
            Some(pass) => (pass, None),
            None => {
                let statement = release::SynopsisStatement::of(declared)?;
                let audit = budget::fingerprint(&["synopsis", &declared.name, &fingerprint]);
                let paying = Paying::Synopsis {
                    name: &declared.name,
                    declaration: &fingerprint,
                };
                let charged = self
                    .charge_paying(
                        shared,
                        statement,
                        &audit,
                        paying,
                        std::slice::from_ref(&declared.table),
                    )
                    .await?;
                let notice = charge_notice(
                    &budget::Priced::cost(charged.item()),
                    charged.receipt().balance(),
                    charged.receipt().window(),
                );
                let pass = shared
                    .ledger
                    .synopsis_paid_with(&declared.name, &fingerprint, &analyst, charged)
                    .await?;
                (pass, Some(notice))
            }
        };
        self.private_reads += 1;
        let started = std::time::Instant::now();
        let rows = shared
            .upstream
            .get_for_read()
            .await?
            .run_synopsis_query(&pass, route, &self.settings.time_zone, &self.cancel)
            .await?;
        shared.metrics.stage(Stage::Upstream, started.elapsed());
        let histogram = release::synopsis_histogram(&rows, declared.cells())?;
        let groups = self
            .synopsis_groups(shared, planned, route, declared, domains)
            .await?;
        let Some((counts, tally)) = self
            .synopsis_counts(shared, declared, &histogram, groups)
            .await?
        else {
            return Ok(None);
        };
        let measures = NoisyMeasures::from_synopsis(planned.plan.keys().len(), counts);
        let released = release::finish(
            &planned.plan,
            &planned.rewrite,
            &planned.mechanisms,
            &measures,
            self.settings.accuracy,
        )?;
        let released = self
            .post_process(shared, &planned.plan, released, shape.clone())
            .await?;
        self.served = Some(Served::AnsweredDp);
        let mut notices = Vec::new();
        notices.push(Notice::new(match paid_now {
            Some(charged) => format!(
                "{charged}; that pays for synopsis {} once: its later answers to you cost nothing",
                declared.name
            ),
            None => format!(
                "pgdp: charged nothing: synopsis {} was paid for once (epsilon={})",
                declared.name, declared.epsilon
            ),
        }));
        notices.push(Notice::new(synopsis_notice(declared, &tally)));
        if released.truncated() {
            notices.push(Notice::new(format!(
                "pgdp: only the first {} groups were returned",
                crate::limits::GROUPS_RELEASED_MAX
            )));
        }
        Ok(Some(ClientRows::released(released, notices)))
    }

    /// Whether the synopsis answers nothing more (loaded from the ledger if this process has
    /// not loaded it yet; a synopsis not started yet is not exhausted).
    async fn synopsis_exhausted(&self, shared: &Shared, declared: &Declared) -> Result<bool> {
        let key = state_key(declared);
        let mut loaded = shared.synopses.lock().await;
        if let Some(synopsis) = loaded.get(&key) {
            return Ok(synopsis.exhausted());
        }
        let stored = shared
            .ledger
            .synopsis_state(&declared.name, &declared.fingerprint())
            .await?;
        let Some(stored) = stored else {
            return Ok(false);
        };
        let synopsis =
            Synopsis::restore(params_of(declared), released_of(stored, declared.cells())?)?;
        let exhausted = synopsis.exhausted();
        loaded.insert(key, synopsis);
        Ok(exhausted)
    }

    /// The released groups (the public domain's combinations, as the per-query path releases
    /// them) with the cells each counts: those whose values are the group's keys and that pass
    /// WHERE.
    async fn synopsis_groups(
        &self,
        shared: &Shared,
        planned: &Planned<'_>,
        route: &Route,
        declared: &Declared,
        domains: &PublicDomains,
    ) -> Result<Vec<(Vec<Option<String>>, Vec<u32>)>> {
        let k = planned.plan.keys().len();
        let combinations = rewrite::domain::combinations(k, domains)?;
        let passing: Option<std::collections::BTreeSet<usize>> = match &route.cells_sql {
            None => None,
            Some(sql) => {
                let started = std::time::Instant::now();
                let rows = shared
                    .upstream
                    .run_public_query(sql, &self.settings.time_zone, &self.cancel)
                    .await?;
                shared.metrics.stage(Stage::Upstream, started.elapsed());
                Some(
                    rows.into_text()
                        .into_iter()
                        .filter_map(|r| r.first().cloned().flatten())
                        .map(|c| c.parse::<usize>())
                        .collect::<std::result::Result<_, _>>()
                        .map_err(|_| Error::internal("a synopsis cell that is not an index"))?,
                )
            }
        };
        // Each combination by the value indices of its keys in the synopsis's columns.
        let mut index: HashMap<Vec<usize>, usize> = HashMap::new();
        for (g, combination) in combinations.iter().enumerate() {
            let indices: Option<Vec<usize>> = combination
                .iter()
                .zip(&route.key_columns)
                .map(|(value, &c)| {
                    let value = value.as_deref()?;
                    declared.columns[c].1.iter().position(|v| v == value)
                })
                .collect();
            if let Some(indices) = indices {
                index.insert(indices, g);
            }
        }
        let mut cells: Vec<Vec<u32>> = vec![Vec::new(); combinations.len()];
        for cell in 0..declared.cells() {
            if passing.as_ref().is_some_and(|p| !p.contains(&cell)) {
                continue;
            }
            let values = rewrite::synopsis::cell_values(declared, cell);
            let keys: Vec<usize> = route.key_columns.iter().map(|&c| values[c]).collect();
            if let Some(&g) = index.get(&keys) {
                cells[g].push(u32::try_from(cell).map_err(|_| Error::internal("cell index"))?);
            }
        }
        Ok(combinations.into_iter().zip(cells).collect())
    }

    /// Each group's count from the shared synopsis (started now if it has not been), with its
    /// bounds; `None` when the synopsis ran out of rounds on the way (the answers drawn are
    /// dropped: nothing is sent, and what the synopsis released is stored).
    async fn synopsis_counts(
        &mut self,
        shared: &Shared,
        declared: &Declared,
        histogram: &PrivateHistogram,
        groups: Vec<(Vec<Option<String>>, Vec<u32>)>,
    ) -> Result<Option<(Vec<release::SynopsisCount>, Tally)>> {
        let fingerprint = declared.fingerprint();
        let key = state_key(declared);
        let mut loaded = shared.synopses.lock().await;
        if !loaded.contains_key(&key) {
            let started = Synopsis::start(params_of(declared), &mut self.rng, histogram)?;
            let stored = shared
                .ledger
                .synopsis_create(&declared.name, &fingerprint, started.released().total)
                .await?;
            // The first start wins: another process's total may be the released one.
            let synopsis =
                Synopsis::restore(params_of(declared), released_of(stored, declared.cells())?)?;
            loaded.insert(key.clone(), synopsis);
        }
        let synopsis = loaded
            .get_mut(&key)
            .ok_or_else(|| Error::internal("a synopsis loaded and not found"))?;
        let estimate = (
            synopsis.estimate_error_bound(0.05)?,
            synopsis.estimate_error_bound(0.025)?,
        );
        let update = (
            synopsis.update_error_bound(0.05)?,
            synopsis.update_error_bound(0.025)?,
        );
        let mut tally = Tally {
            estimate_bound: estimate.0,
            update_bound: update.0,
            ..Tally::default()
        };
        let mut counts = Vec::with_capacity(groups.len());
        for (keys, cells) in groups {
            if cells.is_empty() {
                // No cell passes: every row of the table is in a cell (the columns are
                // exhaustive), so the count is 0, known without the data.
                counts.push((keys, 0.0, (0.0, 0.0)));
                continue;
            }
            let query = CellSet::new(cells, declared.cells())?;
            if synopsis.starts_round() {
                match shared
                    .ledger
                    .synopsis_begin_round(&declared.name, &fingerprint, declared.rounds)
                    .await?
                {
                    Some(recorded) => synopsis
                        .begin_round(&mut self.rng, released_of(recorded, declared.cells())?)?,
                    None => {
                        let stored = shared
                            .ledger
                            .synopsis_state(&declared.name, &fingerprint)
                            .await?
                            .ok_or_else(|| Error::internal("a started synopsis not found"))?;
                        synopsis.refresh(released_of(stored, declared.cells())?)?;
                    }
                }
            }
            match synopsis.answer(&mut self.rng, histogram, &query)? {
                Answer::Estimate(value) => {
                    tally.estimates += 1;
                    counts.push((keys, value, estimate));
                }
                Answer::Updated(noisy) => {
                    shared
                        .ledger
                        .synopsis_measure(&declared.name, &fingerprint, query.cells(), noisy)
                        .await?;
                    tally.updates += 1;
                    counts.push((keys, noisy as f64, update));
                }
                Answer::Exhausted => return Ok(None),
            }
        }
        tally.rounds_started = synopsis.released().rounds_started;
        Ok(Some((counts, tally)))
    }
}

impl Session {
    /// EXPLAIN's lines for a query a synopsis answers (empty otherwise): the synopsis, what it
    /// costs this analyst, its bounds, its rounds, and its histogram's SQL; nothing is charged
    /// or read from the upstream.
    pub(super) async fn explain_synopsis(
        &self,
        shared: &Shared,
        plan: &crate::dp::plan::Plan,
        params: &[Option<String>],
    ) -> Result<Vec<String>> {
        if !self.settings.synopsis {
            return Ok(Vec::new());
        }
        let Some(route) = rewrite::synopsis::route(plan, &shared.policy, params)? else {
            return Ok(Vec::new());
        };
        let declared = shared
            .policy
            .synopses
            .get(&route.synopsis)
            .ok_or_else(|| Error::internal("a route to an undeclared synopsis"))?;
        let fingerprint = declared.fingerprint();
        let stored = shared
            .ledger
            .synopsis_state(&declared.name, &fingerprint)
            .await?;
        let paid = shared
            .ledger
            .synopsis_pass(&declared.name, &fingerprint, &self.analyst.name)
            .await?
            .is_some();
        let rounds = stored.as_ref().map_or(0, |s| s.rounds_started);
        // Exhausted: every round started and none in progress in this process.
        let in_progress = shared
            .synopses
            .lock()
            .await
            .get(&state_key(declared))
            .is_some_and(|s| !s.exhausted() && s.rounds_left() == 0);
        if rounds >= declared.rounds && !in_progress {
            return Ok(vec![format!(
                "synopsis {} covers this count but is exhausted ({} of {} update rounds used): answered by the per-query plan below",
                declared.name, rounds, declared.rounds
            )]);
        }
        let bounds = Synopsis::restore(
            params_of(declared),
            ReleasedState {
                total: 0,
                measurements: Vec::new(),
                rounds_started: 0,
            },
        )?;
        let columns: Vec<&str> = declared.columns.iter().map(|(c, _)| c.as_str()).collect();
        let cost = release::SynopsisStatement::of(declared)?;
        Ok(vec![
            format!(
                "answered from synopsis {} (private multiplicative weights over {} of {}, {} cells, each unit's rows counted up to {})",
                declared.name,
                columns.join(" x "),
                declared.table,
                declared.cells(),
                declared.rows_per_unit
            ),
            format!(
                "synopsis cost: {}, once per analyst ({}); {} of {} update rounds used",
                budget::Priced::cost(&cost),
                if paid {
                    "already paid: this answer costs nothing"
                } else {
                    "charged at this analyst's first answer from it"
                },
                rounds,
                declared.rounds
            ),
            format!(
                "each count: from the synopsis's estimate, within {:.0} rows at 95 %, or by a fresh noisy count within {:.0} rows at 95 % that updates it (one round); when every round is used, by the per-query plan below",
                bounds.estimate_error_bound(0.05)?,
                bounds.update_error_bound(0.05)?
            ),
            format!("synopsis histogram SQL: {}", route.histogram.as_str()),
            "per-query plan (SET pgdp.synopsis = off, or the synopsis exhausted):".to_string(),
        ])
    }
}

/// The NOTICE of an answer from a synopsis: where its counts came from and their bounds.
fn synopsis_notice(declared: &Declared, tally: &Tally) -> String {
    let columns: Vec<&str> = declared.columns.iter().map(|(c, _)| c.as_str()).collect();
    let mut parts = Vec::new();
    if tally.estimates > 0 {
        parts.push(format!(
            "{} count(s) from its estimate, within {:.0} rows at 95 %",
            tally.estimates, tally.estimate_bound
        ));
    }
    if tally.updates > 0 {
        parts.push(format!(
            "{} by a fresh noisy count (within {:.0} rows at 95 %) that updated it",
            tally.updates, tally.update_bound
        ));
    }
    if parts.is_empty() {
        parts.push("no count needed the data (no cell passes WHERE)".to_string());
    }
    format!(
        "pgdp: answered from synopsis {} (private multiplicative weights over {} of {}, {} cells, each unit's rows counted up to {}): {}; {} of {} update rounds used",
        declared.name,
        columns.join(" x "),
        declared.table,
        declared.cells(),
        declared.rows_per_unit,
        parts.join("; "),
        tally.rounds_started,
        declared.rounds
    )
}
