//! Private multiplicative weights, online (Hardt & Rothblum 2010; Dwork & Roth 2014, §4.2), over
//! a public domain of cells: a synopsis that answers a stream of counting queries, spending
//! budget only on the few that it answers badly.
//!
//! A counting query is a set of cells ([`CellSet`]); its answer on the data is the number of rows
//! in them ([`PrivateHistogram`], each unit's rows capped, so one unit changes the histogram's L1
//! norm by at most [`SynopsisParams::sensitivity`] = Δ). The synopsis holds a distribution `w`
//! over the cells and a noisy total `n̂`, and estimates a query as `n̂ · Σ_{c∈q} w(c)`.
//!
//! The mechanism ([`Synopsis::answer`]), with `ε_p = ε / (2T + 1)` (one share for the total, two
//! for each of at most `T` rounds):
//! 1. Start: release `n̂` = the histogram's total + discrete Laplace of scale `Δ/ε_p`.
//! 2. A round is one AboveThreshold instance (Dwork & Roth, Algorithm 1 and Theorem 3.23): at its
//!    start draw `ρ` ~ discrete Laplace of scale `2Δ/ε_p`, kept secret. For each query `q`:
//!    `s = round(estimate(q))`, `v = |count(q) − s| + ν` with fresh `ν` ~ discrete Laplace of
//!    scale `4Δ/ε_p`. If `v < τ + ρ`, answer `estimate(q)` (from the synopsis). Else the round ends:
//!    release `a = count(q) +` discrete Laplace of scale `Δ/ε_p`, answer `a`, and update `w` with
//!    `(q, a)` and every earlier measurement, [`REWEIGHT_PASSES`] passes from uniform (as MWEM
//!    does, Hardt, Ligett & McSherry 2012), each step the multiplicative update whose size makes
//!    the estimate match the measurement (`w(c) ∝ w(c)·a/estimate(q)` in `q`, `·(n̂ − a)/(n̂ −
//!    estimate(q))` outside: an entropy projection, iterative proportional fitting).
//! 3. After `T` rounds have started and ended, [`Answer::Exhausted`]: the caller answers by its
//!    ordinary per-query path.
//!
//! Privacy. `|count(q) − s|` has sensitivity Δ (`s` is a function of released values only), so
//! each round is `ε_p`-DP whatever the number of queries it answers (AboveThreshold with
//! integer-valued queries and discrete Laplace noise: the proof's shifts are integers, where the
//! discrete Laplace's density ratio is that of the continuous one), each update's release is
//! `ε_p`-DP (the discrete Laplace mechanism), the total too, and the weights and every estimate
//! are post-processing of released values. Sequential composition over at most `2T + 1` parts
//! gives `ε`-DP for the whole transcript, for any adaptively chosen stream of queries, and
//! `Σ ε_p²/2`-zCDP ([`Synopsis::cost_parts`] lists the parts for the accountant). The noisy
//! threshold `τ + ρ` is never released; a round's start is recorded durably before anything of
//! the round is released (the caller records it, then [`Synopsis::begin_round`] draws the
//! threshold; [`Synopsis::answer`] refuses to answer outside a begun round), so that at most `T`
//! rounds ever run, across restarts and processes sharing the state.
//!
//! Invariants:
//! - Pure: randomness is a parameter; no I/O.
//! - [`PrivateHistogram`] is opaque: only this module reads its counts, and only through the
//!   mechanisms above.
//! - No answer leaves [`Synopsis::answer`] but an estimate (post-processing), a released noisy
//!   count, or [`Answer::Exhausted`]; the state kept between calls ([`Synopsis::released`]) is
//!   the released values only, plus the secret threshold of the round in progress.

use rand::{CryptoRng, Rng};

use crate::error::{Error, Result};
use crate::limits;

use super::noise::Noise;

/// Passes over all the measurements after each update (MWEM repeats its multiplicative updates
/// over the measurements so far; each pass is post-processing).
pub const REWEIGHT_PASSES: usize = 20;

/// The declared shape of a synopsis.
#[derive(Debug, Clone, PartialEq)]
pub struct SynopsisParams {
    /// The number of cells of the public domain (the product of its columns' domains).
    pub cells: usize,
    /// Δ: the most rows one privacy unit adds to the histogram (the table's per-unit cap; 1 for
    /// a table with one row per unit).
    pub sensitivity: u64,
    /// ε: the whole budget of the synopsis, over its total and all its rounds.
    pub epsilon: f64,
    /// T: the most rounds (updates).
    pub rounds: usize,
    /// τ: the error, in rows, under which an estimate is answered as is.
    pub threshold: f64,
}

/// A counting query over the synopsis's domain: the cells it counts, sorted, each once.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CellSet(Vec<u32>);

impl CellSet {
    /// The set of `cells`, each below `domain`.
    pub fn new(mut cells: Vec<u32>, domain: usize) -> Result<CellSet> {
        cells.sort_unstable();
        cells.dedup();
        if cells.last().is_some_and(|&c| c as usize >= domain) {
            return Err(Error::internal(
                "a counting query names a cell outside its domain",
            ));
        }
        Ok(CellSet(cells))
    }

    /// The cells.
    pub fn cells(&self) -> &[u32] {
        &self.0
    }
}

/// The exact histogram of the data over the synopsis's cells (each unit's rows capped): private.
/// Opaque: only the synopsis reads it, through its mechanisms.
pub struct PrivateHistogram {
    counts: Vec<u64>,
}

impl PrivateHistogram {
    /// Wraps the counts read from the upstream (wrapping reveals nothing).
    pub fn new(counts: Vec<u64>) -> PrivateHistogram {
        PrivateHistogram { counts }
    }

    fn count(&self, q: &CellSet) -> i128 {
        q.0.iter()
            .map(|&c| i128::from(self.counts.get(c as usize).copied().unwrap_or(0)))
            .sum()
    }

    fn total(&self) -> i128 {
        self.counts.iter().map(|&c| i128::from(c)).sum()
    }
}

/// What the synopsis has released: enough to rebuild it exactly ([`Synopsis::restore`]).
#[derive(Debug, Clone, PartialEq)]
pub struct ReleasedState {
    /// The noisy total.
    pub total: i128,
    /// Each update's query and released noisy count, in order.
    pub measurements: Vec<(CellSet, i128)>,
    /// Rounds started (each ended by an update, or left when the process stopped): recorded
    /// durably before a round's first answer.
    pub rounds_started: usize,
}

/// The answer to one counting query.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// The synopsis's estimate: within τ of the count, up to the noise of the test
    /// ([`Synopsis::estimate_error_bound`]).
    Estimate(f64),
    /// The released noisy count, which also updated the synopsis (a round ended).
    Updated(i128),
    /// Every round is spent: answer by the per-query path.
    Exhausted,
}

/// The mechanisms of a synopsis, from its parameters.
#[derive(Debug, Clone)]
struct Mechanisms {
    /// `ε_p`.
    share: f64,
    /// The total's and each update's noise: scale `Δ/ε_p`.
    count: Noise,
    /// The round's threshold noise: scale `2Δ/ε_p`.
    threshold: Noise,
    /// Each test's noise: scale `4Δ/ε_p`.
    test: Noise,
}

impl Mechanisms {
    fn of(params: &SynopsisParams) -> Result<Mechanisms> {
        if params.cells == 0 || params.cells > limits::SYNOPSIS_CELLS_MAX {
            return Err(Error::InvalidMechanism {
                reason: format!(
                    "a synopsis needs between 1 and {} cells, not {}",
                    limits::SYNOPSIS_CELLS_MAX,
                    params.cells
                ),
            });
        }
        if params.rounds == 0 || params.rounds > limits::SYNOPSIS_ROUNDS_MAX {
            return Err(Error::InvalidMechanism {
                reason: format!(
                    "a synopsis needs between 1 and {} rounds, not {}",
                    limits::SYNOPSIS_ROUNDS_MAX,
                    params.rounds
                ),
            });
        }
        if !(params.threshold.is_finite() && params.threshold > 0.0) {
            return Err(Error::InvalidMechanism {
                reason: "a synopsis's threshold must be a positive number of rows".into(),
            });
        }
        let share = params.epsilon / (2 * params.rounds + 1) as f64;
        let delta = params.sensitivity as f64;
        Ok(Mechanisms {
            share,
            count: Noise::laplace(delta, share)?,
            threshold: Noise::laplace(2.0 * delta, share)?,
            test: Noise::laplace(4.0 * delta, share)?,
        })
    }
}

/// A synopsis: the released state, the weights it implies, and the round in progress.
pub struct Synopsis {
    params: SynopsisParams,
    mechanisms: Mechanisms,
    released: ReleasedState,
    /// `log w(c)` up to a constant.
    log_weights: Vec<f64>,
    /// `w(c)`, normalised.
    weights: Vec<f64>,
    /// The round in progress: its noisy threshold `τ + ρ`, in rows. Secret.
    round: Option<i128>,
}

impl std::fmt::Debug for Synopsis {
    /// Never prints the round's secret threshold.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Synopsis")
            .field("params", &self.params)
            .field("rounds_started", &self.released.rounds_started)
            .field("measurements", &self.released.measurements.len())
            .field("round_in_progress", &self.round.is_some())
            .finish()
    }
}

impl Synopsis {
    /// A new synopsis: releases the noisy total of `data` (the first of its `2T + 1` parts).
    pub fn start<R: Rng + CryptoRng + ?Sized>(
        params: SynopsisParams,
        rng: &mut R,
        data: &PrivateHistogram,
    ) -> Result<Synopsis> {
        let mechanisms = Mechanisms::of(&params)?;
        let total = mechanisms.count.release_integer(rng, data.total());
        Synopsis::restore(
            params,
            ReleasedState {
                total,
                measurements: Vec::new(),
                rounds_started: 0,
            },
        )
    }

    /// The synopsis that `released` describes, with no round in progress (a round left by a
    /// stopped process stays counted in `rounds_started`).
    pub fn restore(params: SynopsisParams, released: ReleasedState) -> Result<Synopsis> {
        let mechanisms = Mechanisms::of(&params)?;
        if released.measurements.len() > released.rounds_started
            || released.rounds_started > params.rounds
        {
            return Err(Error::internal(
                "a synopsis with more rounds than it may run",
            ));
        }
        let cells = params.cells;
        let mut synopsis = Synopsis {
            params,
            mechanisms,
            released,
            log_weights: vec![0.0; cells],
            weights: vec![1.0 / cells as f64; cells],
            round: None,
        };
        synopsis.reweight();
        Ok(synopsis)
    }

    /// The released state (what the caller stores).
    pub fn released(&self) -> &ReleasedState {
        &self.released
    }

    /// The parameters.
    pub fn params(&self) -> &SynopsisParams {
        &self.params
    }

    /// The cost of the whole synopsis, as its `2T + 1` pure ε parts of `ε_p` each: what a
    /// party that sees its answers is charged, once.
    pub fn cost_parts(&self) -> Vec<f64> {
        vec![self.mechanisms.share; 2 * self.params.rounds + 1]
    }

    /// Rounds left to start.
    pub fn rounds_left(&self) -> usize {
        self.params.rounds - self.released.rounds_started
    }

    /// The synopsis's estimate of `q`: `n̂ · Σ_{c∈q} w(c)` (post-processing).
    pub fn estimate(&self, q: &CellSet) -> f64 {
        let total = self.released.total.max(1) as f64;
        total * q.0.iter().map(|&c| self.weights[c as usize]).sum::<f64>()
    }

    /// A bound that an [`Answer::Estimate`]'s error exceeds with probability at most `alpha`:
    /// an estimate is answered only when `|count − round(estimate)| + ν < τ + ρ`, so its error is
    /// below `τ + |ρ| + |ν| + ½`; each noise's bound is taken at `alpha / 2`.
    pub fn estimate_error_bound(&self, alpha: f64) -> Result<f64> {
        Ok(self.params.threshold
            + self.mechanisms.threshold.error_bound(alpha / 2.0)?
            + self.mechanisms.test.error_bound(alpha / 2.0)?
            + 0.5)
    }

    /// The bound of an [`Answer::Updated`] count's noise at `alpha`.
    pub fn update_error_bound(&self, alpha: f64) -> Result<f64> {
        self.mechanisms.count.error_bound(alpha)
    }

    /// Whether the synopsis answers nothing more: every round has started and none is in
    /// progress here.
    pub fn exhausted(&self) -> bool {
        self.round.is_none() && self.rounds_left() == 0
    }

    /// Whether answering now needs a new round: none is in progress and rounds are left. The
    /// caller records the round's start durably, then calls [`Synopsis::begin_round`].
    pub fn starts_round(&self) -> bool {
        self.round.is_none() && self.rounds_left() > 0
    }

    /// Starts a round that the caller has recorded durably: `recorded` is the stored state after
    /// the record (its `rounds_started` counts this round; its measurements may hold other
    /// processes' updates, all released values). Draws the round's secret threshold.
    pub fn begin_round<R: Rng + CryptoRng + ?Sized>(
        &mut self,
        rng: &mut R,
        recorded: ReleasedState,
    ) -> Result<()> {
        if self.round.is_some() || recorded.rounds_started == 0 {
            return Err(Error::internal("a synopsis round begun without its record"));
        }
        self.refresh(recorded)?;
        let tau = self.params.threshold.ceil() as i128;
        self.round = Some(self.mechanisms.threshold.release_integer(rng, tau));
        Ok(())
    }

    /// Takes the stored state (another process's updates and rounds) with no round in progress
    /// here, or keeping the one in progress when the stored state still counts it.
    pub fn refresh(&mut self, stored: ReleasedState) -> Result<()> {
        if stored.measurements.len() > stored.rounds_started
            || stored.rounds_started > self.params.rounds
            || stored.rounds_started < self.released.rounds_started
        {
            return Err(Error::internal(
                "a synopsis's stored state is behind or beyond its rounds",
            ));
        }
        let changed = stored.measurements.len() != self.released.measurements.len()
            || stored.total != self.released.total;
        self.released = stored;
        if changed {
            self.reweight();
        }
        Ok(())
    }

    /// Answers `q` on `data` (see the module's mechanism) within the round in progress; after
    /// the last round, [`Answer::Exhausted`]. Answering with rounds left and none in progress is
    /// an error: the round must be recorded first ([`Synopsis::begin_round`]).
    pub fn answer<R: Rng + CryptoRng + ?Sized>(
        &mut self,
        rng: &mut R,
        data: &PrivateHistogram,
        q: &CellSet,
    ) -> Result<Answer> {
        let threshold = match self.round {
            Some(t) => t,
            None if self.rounds_left() == 0 => return Ok(Answer::Exhausted),
            None => {
                return Err(Error::internal(
                    "a synopsis answered before its round was recorded",
                ))
            }
        };
        let estimate = self.estimate(q);
        let exact = data.count(q);
        let gap = (exact - estimate.round() as i128).abs();
        let tested = self.mechanisms.test.release_integer(rng, gap);
        if tested < threshold {
            return Ok(Answer::Estimate(estimate));
        }
        self.round = None;
        let noisy = self.mechanisms.count.release_integer(rng, exact);
        self.released.measurements.push((q.clone(), noisy));
        self.reweight();
        Ok(Answer::Updated(noisy))
    }

    /// The weights implied by the released measurements (multiplicative updates projecting onto
    /// each measurement in turn, [`REWEIGHT_PASSES`] passes from uniform): post-processing.
    fn reweight(&mut self) {
        let cells = self.params.cells;
        self.log_weights = vec![0.0; cells];
        self.weights = vec![1.0 / cells as f64; cells];
        if self.released.measurements.is_empty() {
            return;
        }
        let total = self.released.total.max(1) as f64;
        let mut inside = vec![false; cells];
        for _ in 0..REWEIGHT_PASSES {
            for i in 0..self.released.measurements.len() {
                let (q, measured) = &self.released.measurements[i];
                let estimate = self.estimate(q);
                // The multiplicative step that makes the estimate match the measurement (an
                // entropy projection onto it): cells in q scaled by measured/estimate, the others
                // by what is left of the total. A measurement outside (0, n̂) is taken at the
                // nearest half row inside.
                let target = (*measured as f64).clamp(0.5, (total - 0.5).max(0.5));
                if estimate <= 0.0 || estimate >= total {
                    continue;
                }
                let step_in = (target / estimate).ln();
                let step_out = ((total - target).max(0.5) / (total - estimate)).ln();
                for &c in &q.0 {
                    inside[c as usize] = true;
                }
                for (c, l) in self.log_weights.iter_mut().enumerate() {
                    *l += if inside[c] { step_in } else { step_out };
                }
                for &c in &q.0 {
                    inside[c as usize] = false;
                }
                self.normalise();
            }
        }
    }

    fn normalise(&mut self) {
        let top = self
            .log_weights
            .iter()
            .copied()
            .fold(f64::NEG_INFINITY, f64::max);
        let mut sum = 0.0;
        for (w, l) in self.weights.iter_mut().zip(&self.log_weights) {
            *w = (l - top).exp();
            sum += *w;
        }
        for w in &mut self.weights {
            *w /= sum;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dp::mechanism::testing::seeded;

    /// A skewed histogram over `cells` cells with about `rows` rows.
    fn skewed(cells: usize, rows: u64) -> Vec<u64> {
        let weights: Vec<f64> = (0..cells)
            .map(|c| 1.0 / (1.0 + (c % 17) as f64) * if c % 5 == 0 { 6.0 } else { 1.0 })
            .collect();
        let sum: f64 = weights.iter().sum();
        weights
            .iter()
            .map(|w| (w / sum * rows as f64).round() as u64)
            .collect()
    }

    /// A cube of 4 × 3 × 10 cells (region × sex × age band); `cell(r, s, a)`.
    const CUBE: (usize, usize, usize) = (4, 3, 10);
    fn cell(r: usize, s: usize, a: usize) -> u32 {
        ((r * CUBE.1 + s) * CUBE.2 + a) as u32
    }
    fn cells() -> usize {
        CUBE.0 * CUBE.1 * CUBE.2
    }

    /// Dashboard-shaped queries: each region, sex and age band alone, and each pair of a region
    /// and a sex, with age ranges.
    fn dashboard() -> Vec<CellSet> {
        let mut out = Vec::new();
        let all = |f: &dyn Fn(usize, usize, usize) -> bool| {
            let mut v = Vec::new();
            for r in 0..CUBE.0 {
                for s in 0..CUBE.1 {
                    for a in 0..CUBE.2 {
                        if f(r, s, a) {
                            v.push(cell(r, s, a));
                        }
                    }
                }
            }
            CellSet::new(v, cells()).expect("cells")
        };
        for r in 0..CUBE.0 {
            out.push(all(&|rr, _, _| rr == r));
            for s in 0..CUBE.1 {
                out.push(all(&|rr, ss, _| rr == r && ss == s));
                out.push(all(&|rr, ss, a| rr == r && ss == s && a >= 5));
            }
        }
        for a in 0..CUBE.2 {
            out.push(all(&|_, _, aa| aa == a));
        }
        out
    }

    /// Answers as the caller does: a round recorded (here in memory) before it begins.
    fn ask(
        synopsis: &mut Synopsis,
        rng: &mut rand::rngs::ChaCha20Rng,
        data: &PrivateHistogram,
        q: &CellSet,
    ) -> Answer {
        if synopsis.starts_round() {
            let mut recorded = synopsis.released().clone();
            recorded.rounds_started += 1;
            synopsis.begin_round(rng, recorded).expect("round");
        }
        synopsis.answer(rng, data, q).expect("answer")
    }

    fn params(epsilon: f64, rounds: usize, threshold: f64) -> SynopsisParams {
        SynopsisParams {
            cells: cells(),
            sensitivity: 1,
            epsilon,
            rounds,
            threshold,
        }
    }

    /// A dashboard's 38 queries asked three times over (reloads): each costs at most one update,
    /// the reloads are answered from the synopsis, at least 95% of all answers are within their
    /// stated 95% bounds, and the rounds stay within T. Seeded: always passes or always fails.
    #[test]
    fn a_dashboard_is_answered_mostly_from_the_synopsis_within_its_bounds() {
        let data = PrivateHistogram::new(skewed(cells(), 100_000));
        let mut rng = seeded(71);
        let p = params(4.0, 40, 400.0);
        let mut synopsis = Synopsis::start(p, &mut rng, &data).expect("synopsis");
        let queries = dashboard();
        let (mut estimates, mut updates, mut outside) = (0, 0, 0);
        let mut reloaded_estimates = 0;
        let estimate_bound = synopsis.estimate_error_bound(0.05).expect("bound");
        let update_bound = synopsis.update_error_bound(0.05).expect("bound");
        for reload in 0..3 {
            for q in &queries {
                let exact = data.count(q) as f64;
                match ask(&mut synopsis, &mut rng, &data, q) {
                    Answer::Estimate(v) => {
                        estimates += 1;
                        reloaded_estimates += usize::from(reload > 0);
                        outside += usize::from((v - exact).abs() > estimate_bound);
                    }
                    Answer::Updated(v) => {
                        updates += 1;
                        outside += usize::from((v as f64 - exact).abs() > update_bound);
                    }
                    Answer::Exhausted => panic!("rounds spent after {updates} updates"),
                }
            }
        }
        let answered = 3 * queries.len();
        // Each distinct query costs at most one update; the reloads are answered from the
        // synopsis (at least 90% of them: a test's noise can still end a round).
        assert!(updates <= queries.len(), "{updates} updates");
        assert!(
            reloaded_estimates * 10 >= 2 * queries.len() * 9,
            "only {reloaded_estimates} of {} reloaded queries from the synopsis ({estimates} in all, {updates} updates)",
            2 * queries.len()
        );
        assert!(
            outside * 20 <= answered,
            "{outside} of {answered} outside their bounds"
        );
        assert_eq!(synopsis.released().measurements.len(), updates);
    }

    /// After T rounds the synopsis answers nothing more; a restored synopsis gives the same
    /// estimates as the one that released its state, and counts the rounds it started.
    #[test]
    fn rounds_end_the_synopsis_and_its_released_state_rebuilds_it() {
        let data = PrivateHistogram::new(skewed(cells(), 50_000));
        let mut rng = seeded(72);
        // A threshold far below the test's noise: nearly every query ends a round.
        let mut synopsis = Synopsis::start(params(1.0, 3, 1.0), &mut rng, &data).expect("ok");
        let q = dashboard();
        let mut answers = Vec::new();
        for query in q.iter().cycle().take(200) {
            let a = ask(&mut synopsis, &mut rng, &data, query);
            let done = a == Answer::Exhausted;
            answers.push(a);
            if done {
                break;
            }
        }
        assert_eq!(answers.last(), Some(&Answer::Exhausted));
        assert_eq!(synopsis.rounds_left(), 0);
        assert!(!synopsis.starts_round());
        let restored =
            Synopsis::restore(params(1.0, 3, 1.0), synopsis.released().clone()).expect("restores");
        for query in &q {
            assert_eq!(restored.estimate(query), synopsis.estimate(query));
        }
        assert_eq!(
            Synopsis::restore(params(1.0, 2, 1.0), synopsis.released().clone())
                .err()
                .map(|e| e.sqlstate().code().to_string()),
            Some("XX000".to_string()),
            "more rounds than the parameters allow"
        );
        assert_eq!(synopsis.cost_parts().len(), 7);
        let total: f64 = synopsis.cost_parts().iter().sum();
        assert!((total - 1.0).abs() < 1e-12, "{total}");
    }

    /// Neighbouring databases (one unit, one row, removed from the most queried cell): the
    /// probability that the first query of a round ends it differs by at most the factor
    /// `e^(2ε_p)` that the round and its release allow (here the only random outputs). Checked
    /// on 40,000 runs per database with a two-sided binomial tolerance at α = 1e-6.
    #[test]
    fn a_unit_removed_changes_a_round_by_at_most_its_share() {
        let counts = skewed(cells(), 20_000);
        let mut fewer = counts.clone();
        fewer[0] -= 1;
        let (d, d_) = (PrivateHistogram::new(counts), PrivateHistogram::new(fewer));
        let q = CellSet::new(vec![0, 1, 2], cells()).expect("cells");
        // ε 0.9 over 3 parts: ε_p 0.3. The totals of D and D' differ; both start from the same
        // released state so only the round differs. The threshold is the gap between D's count
        // and the estimate, so the round ends about half the time.
        let state = ReleasedState {
            total: 20_000,
            measurements: Vec::new(),
            rounds_started: 0,
        };
        let estimate = Synopsis::restore(params(0.9, 1, 1.0), state.clone())
            .expect("ok")
            .estimate(&q);
        let gap = (d.count(&q) as f64 - estimate.round()).abs();
        let p = params(0.9, 1, gap.max(1.0));
        let runs = 40_000;
        let ended = |data: &PrivateHistogram, seed: u64| {
            let mut rng = seeded(seed);
            (0..runs)
                .filter(|_| {
                    let mut s = Synopsis::restore(p.clone(), state.clone()).expect("ok");
                    matches!(ask(&mut s, &mut rng, data, &q), Answer::Updated(_))
                })
                .count() as f64
                / runs as f64
        };
        let (a, b) = (ended(&d, 73), ended(&d_, 74));
        let share = 0.3_f64;
        let z = crate::dp::mechanism::testing::Z_TWO_SIDED_1E6;
        let slack = |p: f64| z * (p * (1.0 - p) / runs as f64).sqrt();
        // P(D) ≤ e^ε_p P(D') for the round's outcome (the release does not enter the event).
        assert!(
            a - slack(a) <= share.exp() * (b + slack(b)),
            "ended {a} on D, {b} on D'"
        );
        assert!(
            b - slack(b) <= share.exp() * (a + slack(a)),
            "ended {a} on D, {b} on D'"
        );
        // And the event is not degenerate: both outcomes occur.
        assert!(a > 0.05 && a < 0.95, "{a}");
    }

    #[test]
    fn parameters_out_of_range_are_refused() {
        let data = PrivateHistogram::new(vec![1; 4]);
        let mut rng = seeded(75);
        for p in [
            SynopsisParams {
                cells: 0,
                ..params(1.0, 2, 5.0)
            },
            SynopsisParams {
                rounds: 0,
                ..params(1.0, 2, 5.0)
            },
            SynopsisParams {
                threshold: -1.0,
                ..params(1.0, 2, 5.0)
            },
            SynopsisParams {
                epsilon: 0.0,
                ..params(1.0, 2, 5.0)
            },
        ] {
            assert!(Synopsis::start(p, &mut rng, &data).is_err());
        }
        assert!(CellSet::new(vec![4], 4).is_err());
        assert_eq!(CellSet::new(vec![3, 1, 3], 4).expect("ok").cells(), &[1, 3]);
    }
}
