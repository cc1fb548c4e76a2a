//! The noisy histograms of a [`BoundsChoice`] and what is read from them: the caps that
//! minimise the estimated error ([`super::choose`]), the chosen upper bound of a clamp, the
//! profile `pgdp suggest` shows ([`ContributionProfile`]) and the rows the caps remove.
//!
//! # Invariants
//! - Only [`NoisyHistograms::new`] makes the histograms, noising every bucket, present or not;
//!   everything else here is post-processing of the noisy counts.

use super::*;

/// The noisy histograms of a [`BoundsChoice`]: rows per (unit, group) pair, units by their
/// number of groups (when groups are chosen), and the clamp's estimate (when it estimates one).
/// Only [`NoisyHistograms::new`] makes them, noising every bucket.
#[derive(Debug, Clone)]
pub(super) struct NoisyHistograms {
    pub(super) rows: Vec<f64>,
    pub(super) groups: Option<Vec<f64>>,
    pub(super) totals: Option<Vec<f64>>,
    pub(super) clamp: Option<NoisyClamp>,
    pub(super) reach: Reach,
    pub(super) hidden: Hidden,
}

/// The most pairs (units, for the groups and totals histograms) each bucket that a caps'
/// histogram reads as empty below the data's reach ([`reach`]) may hold, at the one-sided
/// 95 % bound of every tail's noisy sum ([`hidden_tail`]); 0 for every other bucket, and
/// empty for a histogram the choice does not make. What these could remove is what the
/// histograms cannot see: the choice takes a cap below the ceilings only where it is a small
/// share of the rows. Post-processing of the noisy counts.
#[derive(Debug, Clone, Default)]
pub(super) struct Hidden {
    pub(super) rows: Vec<f64>,
    pub(super) groups: Vec<f64>,
    pub(super) totals: Vec<f64>,
}

/// How many of each caps' histogram's first buckets are read raw ([`reach`]): the rest of
/// the candidates' buckets read as empty, those beyond the ceilings as floored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Reach {
    pub(super) rows: usize,
    pub(super) groups: usize,
    pub(super) totals: usize,
}

impl Reach {
    /// Every candidate's bucket read raw.
    #[cfg(test)]
    pub(super) fn full(choice: &BoundsChoice) -> Reach {
        Reach {
            rows: choice.candidates.len(),
            groups: choice.group_candidates.len(),
            totals: choice.totals.len().saturating_sub(1),
        }
    }
}

/// A caps' histogram as the choice reads it, with how far the data reaches: the candidates'
/// own buckets (the first `candidates`, below the ceiling) raw, as the clamp's are
/// (`estimate_clamp`), up to where the data reaches ([`reach`]), and empty above; the buckets
/// at and beyond the ceiling, wider in value, floored at their noise's bound at 5 % over all
/// the buckets. At a small ε a heavy tail spreads over several buckets each below the floor,
/// and flooring each read it as none, so the choice took a cap of 2 visits per clinic and
/// stated 0 % removed where 74 % were; raw noisy counts are unbiased and sum to the tail's
/// weight. Post-processing of the noisy counts.
fn read_caps(noise: &Noise, noisy: Vec<f64>, candidates: usize) -> (Vec<f64>, usize, Vec<f64>) {
    let floor = floor(noise, noisy.len());
    let reached = reach(&noisy, candidates, noise);
    let hidden = hidden_tail(&noisy, reached, candidates, noise);
    let read = noisy
        .into_iter()
        .enumerate()
        .map(|(b, x)| match b {
            b if b < reached => x,
            b if b < candidates => 0.0,
            _ if x > floor => x,
            _ => 0.0,
        })
        .collect();
    (read, reached, hidden)
}

/// The count at or below which a bucket of a histogram of `buckets` buckets noised with
/// `noise` reads as empty: the noise's bound at 5 % over all the buckets (Bonferroni: with 95 %
/// probability no empty bucket passes).
pub(super) fn floor(noise: &Noise, buckets: usize) -> f64 {
    noise
        .error_bound(0.05 / buckets.max(1) as f64)
        .unwrap_or(0.0)
}

/// The rows above `cap` of the counts from bucket `beyond` on (past the ceiling, where a count
/// reads either as empty or as more than `floor`), each counted up to `floor` (buckets at
/// their midpoints `mid`): a bucket there passes its floor on noise alone in up to 5 % of
/// choices, and then about all of its count is noise, so the low end of what caps remove
/// leaves this out. Post-processing of the noisy counts.
pub(super) fn floored(counts: &[f64], mid: &[f64], beyond: usize, floor: f64, cap: f64) -> f64 {
    counts
        .iter()
        .zip(mid)
        .skip(beyond)
        .map(|(x, m)| x.clamp(0.0, floor) * (m - cap).max(0.0))
        .sum()
}

/// The most pairs each bucket of `noisy` from `reached` up to `raw` may hide ([`Hidden`]):
/// every tail's noisy sum from bucket `j` up (which did not pass [`reach`]'s test) bounds its
/// pairs at `max(sum, 0) + 1.645·sd·√k` over its `k` buckets; the least bound from `j` down
/// holds for the tail from `j` too; and the rows a cap removes, weighing each pair by how far
/// its bucket lies above the cap, are largest when each tail holds its bound, so bucket `j`
/// holds its tail's bound less the next one's. Post-processing of the noisy counts.
pub(super) fn hidden_tail(noisy: &[f64], reached: usize, raw: usize, noise: &Noise) -> Vec<f64> {
    let raw = raw.min(noisy.len());
    let sd = laplace_variance(noise).sqrt();
    let mut bound = vec![0.0; raw + 1];
    let mut sum = 0.0;
    for j in (reached..raw).rev() {
        sum += noisy[j];
        bound[j] = sum.max(0.0) + limits::BOUNDS_REMOVAL_Z * sd * ((raw - j) as f64).sqrt();
    }
    let mut least = f64::INFINITY;
    for b in bound.iter_mut().take(raw).skip(reached) {
        least = least.min(*b);
        *b = least;
    }
    let mut hidden = vec![0.0; noisy.len()];
    for j in reached..raw {
        hidden[j] = bound[j] - bound[j + 1];
    }
    hidden
}

/// How many of the first `raw` buckets of `noisy` (noised with `noise`) the data reaches: one
/// past the highest bucket `j` from which the noisy counts up to bucket `raw - 1` sum to more
/// than `limits::BOUNDS_TAIL_Z` standard deviations of their noise (0 when none does). Summed
/// from the top, a tail spread thinly over many buckets, each below the noise floor, is seen
/// by its weight; buckets above it, which only noise fills, read as empty, so that their
/// noise, weighed by the many rows each would remove, neither counts as rows nor widens the
/// estimate's spread. Post-processing of the noisy counts.
pub(super) fn reach(noisy: &[f64], raw: usize, noise: &Noise) -> usize {
    let variance = laplace_variance(noise);
    let mut sum = 0.0;
    for j in (0..raw.min(noisy.len())).rev() {
        sum += noisy[j];
        let k = (raw - j) as f64;
        if sum > limits::BOUNDS_TAIL_Z * (k * variance).sqrt() {
            return j + 1;
        }
    }
    0
}

/// The clamp's noisy histograms: distances outside the bounds (or, when the upper bound is
/// chosen, each unit's largest value) and absolute clamped sums, with the count at or below
/// which a bucket reads as empty.
#[derive(Debug, Clone)]
pub(super) struct NoisyClamp {
    pub(super) excess: Vec<f64>,
    pub(super) largest: Vec<f64>,
    pub(super) sums: Vec<f64>,
    pub(super) floor: f64,
}

impl NoisyHistograms {
    /// What clamping removes at the caps of `chosen`: the estimate at the bounds, or, when
    /// the upper bound is chosen, the bound [`choose_upper`] picks and what it removes.
    pub(super) fn clamp_estimate(
        &self,
        choice: &BoundsChoice,
        chosen: &ChosenBounds,
    ) -> Option<ClampEstimate> {
        let (c, n) = (choice.clamp.as_ref()?, self.clamp.as_ref()?);
        Some(match &c.upper {
            None => estimate_clamp(c, &n.excess, &n.sums, n.floor),
            Some(u) => {
                let at_caps = choice.noise_with_total(
                    1.0,
                    chosen.groups_per_unit,
                    chosen.rows_per_unit,
                    chosen.rows_total,
                ) / choice.noise_with_total(1.0, choice.groups, choice.ceiling, None);
                choose_upper(c, u, n, at_caps, choice.cells)
            }
        })
    }
}

/// The upper bound among `u`'s candidates that minimises what clamping there removes per
/// group (`cells` groups; from the noisy histogram of each unit's largest value, each bucket
/// at its midpoint, one value per unit: a lower estimate; the buckets below the ceiling read
/// raw, those above it floored) plus the answer's 95 % noise bound
/// on its sum at that bound (`u.noise_at_ceiling` scaled by `at_caps`, the chosen caps' share
/// of the ceilings' sensitivity, and by the bound), the larger on a tie; with what it removes
/// as a share of the units' absolute clamped sums at the ceiling. Post-processing of the
/// noisy counts.
pub(super) fn choose_upper(
    c: &ClampChoice,
    u: &UpperChoice,
    n: &NoisyClamp,
    at_caps: f64,
    cells: f64,
) -> ClampEstimate {
    let edges = u.edges();
    let mid = real_midpoints(&edges);
    let whole: f64 = n
        .sums
        .iter()
        .zip(real_midpoints(&c.edges.sums))
        .map(|(n, m)| n * m)
        .sum();
    // Bucket j + 1 onwards holds the units whose largest value is at least candidate j. The
    // candidates' own buckets (below the ceiling) are read raw: a heavy tail spreads over many
    // buckets each below the noise floor, and their unbiased noisy counts sum to its weight,
    // where flooring each would read it as none. The buckets at and beyond the ceiling, far
    // wider in value, are floored as elsewhere, so that their noise alone does not count as
    // units with values eight times the ceiling.
    let ceiling_bucket = u.candidates.len();
    let counts: Vec<f64> = n
        .largest
        .iter()
        .enumerate()
        .map(|(b, &x)| {
            if b < ceiling_bucket || x > n.floor {
                x
            } else {
                0.0
            }
        })
        .collect();
    let above = |j: usize, upper: f64| -> (f64, f64) {
        let (units, removed) = counts
            .iter()
            .zip(&mid)
            .skip(j + 1)
            .fold((0.0, 0.0), |(units, removed), (count, m)| {
                (units + count, removed + count * (m - upper).max(0.0))
            });
        (units.max(0.0), removed.max(0.0))
    };
    let mut best: Option<(f64, usize)> = None;
    for (j, &upper) in u.candidates.iter().enumerate() {
        let (_, removed) = above(j, upper);
        let error = removed / cells + u.noise_at_ceiling * at_caps * u.noise_ratio(upper);
        if best.is_none_or(|(e, _)| error <= e) {
            best = Some((error, j));
        }
    }
    let j = best.map_or(u.candidates.len() - 1, |(_, j)| j);
    let upper = u.candidates[j];
    let (units, removed) = above(j, upper);
    ClampEstimate {
        aggregate: c.edges.aggregate,
        label: c.label_at(u.lower, upper),
        units_outside: units,
        excess: removed,
        sums: (whole - removed).max(0.0),
        floor: n.floor,
        chosen_upper: Some((upper, u.ceiling)),
    }
}

impl NoisyHistograms {
    /// Histograms of noisy counts read raw, every bucket: what tests of the choice give it.
    #[cfg(test)]
    pub(super) fn read_raw(
        choice: &BoundsChoice,
        rows: &[f64],
        groups: Option<&[f64]>,
        totals: Option<&[f64]>,
    ) -> NoisyHistograms {
        NoisyHistograms {
            rows: rows.to_vec(),
            groups: groups.map(<[f64]>::to_vec),
            totals: totals.map(<[f64]>::to_vec),
            clamp: None,
            reach: Reach::full(choice),
            hidden: Hidden::default(),
        }
    }

    /// Noises the histograms the upstream returned for `choice` (rows of histogram number,
    /// bucket number, count). [`Error::Internal`] on a row that is not (histogram, bucket,
    /// count) with both in range.
    pub(super) fn new<R: Rng + CryptoRng + ?Sized>(
        choice: &BoundsChoice,
        rows: &PrivateRows,
        rng: &mut R,
    ) -> Result<NoisyHistograms> {
        let mut exact = vec![0i128; choice.edges.len() + 1];
        let mut exact_groups = vec![0i128; choice.group_edges.len() + 1];
        let mut exact_totals = vec![0i128; choice.totals.len() + 1];
        let (mut exact_excess, mut exact_sums, mut exact_largest) = match &choice.clamp {
            Some(c) => (
                vec![0i128; c.edges.excess.len() + 1],
                vec![0i128; c.edges.sums.len() + 1],
                vec![0i128; c.edges.largest.len() + 1],
            ),
            None => (Vec::new(), Vec::new(), Vec::new()),
        };
        let (estimates, chooses) = match &choice.clamp {
            Some(c) => (c.upper.is_none(), c.upper.is_some()),
            None => (false, false),
        };
        for row in &rows.rows {
            let parse = |i: usize| -> Result<i128> {
                row.get(i)
                    .and_then(|c| c.as_deref())
                    .and_then(|t| t.parse::<i128>().ok())
                    .ok_or_else(|| Error::internal("a contribution histogram row"))
            };
            let part = match parse(0)? {
                0 => &mut exact,
                1 if choice.group_noise.is_some() => &mut exact_groups,
                2 if estimates => &mut exact_excess,
                3 if choice.clamp.is_some() => &mut exact_sums,
                5 if chooses => &mut exact_largest,
                4 if choice.total_noise.is_some() => &mut exact_totals,
                _ => return Err(Error::internal("a contribution histogram part")),
            };
            let bucket = usize::try_from(parse(1)?)
                .ok()
                .filter(|&b| b < part.len())
                .ok_or_else(|| Error::internal("a contribution histogram bucket"))?;
            part[bucket] = part[bucket].saturating_add(parse(2)?);
        }
        // A bucket's noisy count at or below its noise's bound at 5 % over all the buckets
        // (Bonferroni: with 95 % probability no empty bucket passes) reads as empty: every
        // empty bucket's noise would otherwise count as pairs, and those beyond the ceiling as
        // many rows each (post-processing).
        let mut draw = |noise: &Noise, exact: &[i128]| -> Vec<f64> {
            exact
                .iter()
                .map(|&e| noise.release_integer(rng, e) as f64)
                .collect()
        };
        let floored = |noise: &Noise, noisy: Vec<f64>| -> Vec<f64> {
            let floor = floor(noise, noisy.len());
            noisy
                .into_iter()
                .map(|x| if x > floor { x } else { 0.0 })
                .collect()
        };
        let (noisy, rows_reach, hidden_rows) = read_caps(
            &choice.noise,
            draw(&choice.noise, &exact),
            choice.candidates.len(),
        );
        let (groups, groups_seen) = choice
            .group_noise
            .as_ref()
            .map(|noise| {
                let noisy = draw(noise, &exact_groups);
                let (read, reached, hidden) =
                    read_caps(noise, noisy, choice.group_candidates.len());
                (read, (reached, hidden))
            })
            .unzip();
        let (totals, totals_seen) = choice
            .total_noise
            .as_ref()
            .map(|noise| {
                let noisy = draw(noise, &exact_totals);
                let (read, reached, hidden) =
                    read_caps(noise, noisy, choice.totals.len().saturating_sub(1));
                (read, (reached, hidden))
            })
            .unzip();
        let (groups_reach, hidden_groups) = groups_seen.unzip();
        let (totals_reach, hidden_totals) = totals_seen.unzip();
        let clamp = choice.clamp.as_ref().map(|c| {
            // The histogram that is not computed stays empty (`release` of no buckets).
            let excess = floored(
                &c.noise,
                draw(&c.noise, if estimates { &exact_excess } else { &[] }),
            );
            // Read raw below the ceiling (see `choose_upper`), floored above it.
            let largest = draw(&c.noise, if chooses { &exact_largest } else { &[] });
            let sums = floored(&c.noise, draw(&c.noise, &exact_sums));
            let buckets = excess.len().max(largest.len()).max(1);
            let floor = c.noise.error_bound(0.05 / buckets as f64).unwrap_or(0.0);
            NoisyClamp {
                excess,
                largest,
                sums,
                floor,
            }
        });
        Ok(NoisyHistograms {
            rows: noisy,
            groups,
            totals,
            clamp,
            reach: Reach {
                rows: rows_reach,
                groups: groups_reach.unwrap_or(0),
                totals: totals_reach.unwrap_or(0),
            },
            hidden: Hidden {
                rows: hidden_rows,
                groups: hidden_groups.unwrap_or_default(),
                totals: hidden_totals.unwrap_or_default(),
            },
        })
    }
}

/// What the caps would remove, read from a choice's noisy histograms: what `pgdp suggest`
/// shows a data team for every candidate, where a query keeps only the caps it chose.
/// Post-processing of the noisy counts.
#[derive(Debug, Clone)]
pub struct ContributionProfile {
    pub(super) choice: BoundsChoice,
    pub(super) noisy: NoisyHistograms,
}

impl ContributionProfile {
    /// Noises the histograms the upstream returned for `choice`'s statement
    /// ([`rewrite::contributions`]), as [`choose`] does, at the choice's ε.
    ///
    /// # Errors
    /// [`Error::Internal`] on a row that is not (histogram, bucket, count) with both in range.
    pub fn new<R: Rng + CryptoRng + ?Sized>(
        choice: &BoundsChoice,
        rows: &PrivateRows,
        rng: &mut R,
    ) -> Result<ContributionProfile> {
        Ok(ContributionProfile {
            choice: choice.clone(),
            noisy: NoisyHistograms::new(choice, rows, rng)?,
        })
    }

    /// The estimated share of the rows (at the ceilings, and beyond them as far as the
    /// histograms reach) that caps of `rows_per_unit` rows in each of `groups_per_unit`
    /// groups remove, in [0, 1].
    pub fn removed_share(&self, groups_per_unit: u64, rows_per_unit: u64) -> f64 {
        let removal = Removal::new(
            &self.choice,
            &self.noisy.rows,
            self.noisy.groups.as_deref(),
            self.noisy.reach,
        );
        let rows = removal.rows();
        if rows > 0.0 {
            (removal.removed(groups_per_unit, rows_per_unit) / rows).clamp(0.0, 1.0)
        } else {
            0.0
        }
    }

    /// The estimated share of the rows that a cap of `total` rows per unit over all its groups
    /// removes, with rows and groups at the ceilings; `None` when the choice has no totals
    /// histogram (no group keys).
    pub fn total_removed_share(&self, total: u64) -> Option<f64> {
        let totals = self.noisy.totals.as_deref()?;
        let removal = Removal::new(
            &self.choice,
            &self.noisy.rows,
            self.noisy.groups.as_deref(),
            self.noisy.reach,
        );
        let rows = removal.rows();
        let removed = removal.removed(self.choice.groups, self.choice.ceiling)
            + above(totals, &midpoints(&self.choice.totals), total);
        Some(if rows > 0.0 {
            (removed / rows).clamp(0.0, 1.0)
        } else {
            0.0
        })
    }

    /// The estimated number of rows (noisy, post-processed).
    pub fn rows(&self) -> f64 {
        Removal::new(
            &self.choice,
            &self.noisy.rows,
            self.noisy.groups.as_deref(),
            self.noisy.reach,
        )
        .rows()
    }

    /// What clamping removes, when the choice estimated it: at the bounds, or, when the upper
    /// bound is chosen, at the bound a query with the caps of `chosen` would take.
    pub fn clamp(&self, chosen: &ChosenBounds) -> Option<ClampEstimate> {
        self.noisy.clamp_estimate(&self.choice, chosen)
    }

    /// The caps a query with this choice would take at `noise_per_row`
    /// ([`ChoicePlan::noise_per_row`]).
    pub fn chosen(&self, noise_per_row: f64) -> ChosenBounds {
        let mut chosen = pick_with_totals(&self.choice, &self.noisy, noise_per_row);
        chosen.clamp = self.noisy.clamp_estimate(&self.choice, &chosen);
        chosen
    }
}

/// The clamp's estimate from its noisy histograms (`excess` and `sums`, one count per bucket
/// of their edges and one beyond): each bucket at its midpoint.
pub(super) fn estimate_clamp(
    c: &ClampChoice,
    excess: &[f64],
    sums: &[f64],
    floor: f64,
) -> ClampEstimate {
    let total = |counts: &[f64], edges: &[f64]| -> f64 {
        counts
            .iter()
            .zip(real_midpoints(edges))
            .map(|(n, m)| n * m)
            .sum()
    };
    ClampEstimate {
        aggregate: c.edges.aggregate,
        label: c.label.clone(),
        units_outside: excess.iter().sum(),
        excess: total(excess, &c.edges.excess),
        sums: total(sums, &c.edges.sums),
        floor,
        chosen_upper: None,
    }
}

/// The rows that caps remove, estimated from the noisy histograms of a choice: the rows of the
/// groups beyond `g` (each unit's groups past the cap, at the mean rows per pair) plus, of the
/// pairs kept, the rows above `c` (each bucket at its midpoint).
pub(super) struct Removal<'a> {
    pub(super) noisy: &'a [f64],
    pub(super) noisy_groups: Option<&'a [f64]>,
    pub(super) mid: Vec<f64>,
    pub(super) group_mid: Vec<f64>,
    /// Rows of all pairs at the ceiling on groups (buckets at their midpoints).
    pub(super) pair_rows: f64,
    /// Pairs of every unit, from the groups histogram (0 without one).
    pub(super) all_pairs: f64,
    /// Pairs kept at the ceiling on groups.
    pub(super) at_ceiling: f64,
    pub(super) rows_per_pair: f64,
    /// The variance of a bucket's noise, how many buckets are read raw (the candidates' own,
    /// up to where the data reaches: [`Reach`]), and the first bucket beyond the ceiling, for
    /// the pairs' histogram and the groups'.
    pair_variance: f64,
    raw_pairs: usize,
    beyond_pairs: usize,
    group_variance: f64,
    raw_groups: usize,
    beyond_groups: usize,
    /// The floors of the pairs' and the groups' histograms ([`floor`]).
    pair_floor: f64,
    group_floor: f64,
}

impl<'a> Removal<'a> {
    pub(super) fn new(
        choice: &BoundsChoice,
        noisy: &'a [f64],
        noisy_groups: Option<&'a [f64]>,
        reach: Reach,
    ) -> Self {
        let mid = midpoints(&choice.edges);
        let pairs: f64 = noisy.iter().sum();
        let pair_rows: f64 = noisy.iter().zip(&mid).map(|(n, m)| n * m).sum();
        let group_mid = midpoints(&choice.group_edges);
        let mut removal = Removal {
            noisy,
            noisy_groups,
            mid,
            group_mid,
            pair_rows,
            all_pairs: 0.0,
            at_ceiling: 0.0,
            rows_per_pair: if pairs > 0.0 { pair_rows / pairs } else { 1.0 },
            pair_variance: laplace_variance(&choice.noise),
            raw_pairs: reach.rows,
            beyond_pairs: choice.candidates.len(),
            group_variance: choice.group_noise.as_ref().map_or(0.0, laplace_variance),
            raw_groups: reach.groups,
            beyond_groups: choice.group_candidates.len(),
            pair_floor: floor(&choice.noise, noisy.len()),
            group_floor: choice
                .group_noise
                .as_ref()
                .map_or(0.0, |n| floor(n, noisy_groups.map_or(0, <[f64]>::len))),
        };
        removal.all_pairs = noisy_groups.map_or(0.0, |u| {
            u.iter().zip(&removal.group_mid).map(|(c, m)| c * m).sum()
        });
        removal.at_ceiling = removal.kept_pairs(choice.groups);
        removal
    }

    /// Pairs a cap of `g` groups keeps (each unit min(its groups, g)), from the groups
    /// histogram; without one, the groups are the policy's and nothing else is known.
    pub(super) fn kept_pairs(&self, g: u64) -> f64 {
        self.noisy_groups.map_or(0.0, |u| {
            u.iter()
                .zip(&self.group_mid)
                .map(|(count, m)| count * m.min(g as f64))
                .sum()
        })
    }

    pub(super) fn removed_rows(&self, cap: u64) -> f64 {
        self.noisy
            .iter()
            .zip(&self.mid)
            .map(|(n, m)| n * (m - cap as f64).max(0.0))
            .sum()
    }

    pub(super) fn removed(&self, g: u64, c: u64) -> f64 {
        match self.noisy_groups {
            Some(_) if self.at_ceiling > 0.0 => {
                let kept = self.kept_pairs(g);
                (self.all_pairs - kept).max(0.0) * self.rows_per_pair
                    + self.removed_rows(c) * kept / self.at_ceiling
            }
            _ => self.removed_rows(c),
        }
    }

    /// The standard deviation of [`Removal::removed`]`(g, c)` from the noise of the buckets
    /// it counts: those read raw, and those beyond the ceilings that passed their floor (the
    /// rest read as empty and are not counted); each bucket's noise weighs in as the rows it
    /// would remove. What a cap removes is only as well known as this; the choice weighs it
    /// ([`Removal::removed_upper`]) and `pgdp.max_bias` refuses only beyond its low end.
    pub(super) fn spread(&self, g: u64, c: u64) -> f64 {
        let kept_share = self.kept_share(g);
        let pairs: f64 = counted(self.noisy, self.raw_pairs, self.beyond_pairs)
            .filter_map(|b| self.mid.get(b))
            .map(|m| ((m - c as f64).max(0.0) * kept_share).powi(2))
            .sum();
        let groups: f64 = match self.noisy_groups {
            Some(u) if self.at_ceiling > 0.0 => counted(u, self.raw_groups, self.beyond_groups)
                .filter_map(|b| self.group_mid.get(b))
                .map(|m| ((m - g as f64).max(0.0) * self.rows_per_pair).powi(2))
                .sum(),
            _ => 0.0,
        };
        (pairs * self.pair_variance + groups * self.group_variance).sqrt()
    }

    /// The share of the pairs at the ceiling on groups that a cap of `g` groups keeps.
    fn kept_share(&self, g: u64) -> f64 {
        match self.noisy_groups {
            Some(_) if self.at_ceiling > 0.0 => (self.kept_pairs(g) / self.at_ceiling).max(0.0),
            _ => 1.0,
        }
    }

    /// The most rows caps of `(g, c)` could remove that the histograms cannot see
    /// ([`Hidden`]): the hidden pairs' rows above `c` (of the pairs a cap of `g` keeps), and the
    /// hidden units' groups beyond `g` at the mean rows per pair.
    pub(super) fn hidden(&self, hidden: &Hidden, g: u64, c: u64) -> f64 {
        let pairs = above(&hidden.rows, &self.mid, c) * self.kept_share(g);
        let groups = above(&hidden.groups, &self.group_mid, g) * self.rows_per_pair;
        pairs + groups
    }

    /// The rows of [`Removal::removed`]`(g, c)` from counts beyond the ceilings up to their
    /// floor ([`floored`]): the low end of the estimate leaves them out.
    pub(super) fn floored(&self, g: u64, c: u64) -> f64 {
        let pairs = floored(
            self.noisy,
            &self.mid,
            self.beyond_pairs,
            self.pair_floor,
            c as f64,
        ) * self.kept_share(g);
        let groups = match self.noisy_groups {
            Some(u) if self.at_ceiling > 0.0 => {
                floored(
                    u,
                    &self.group_mid,
                    self.beyond_groups,
                    self.group_floor,
                    g as f64,
                ) * self.rows_per_pair
            }
            _ => 0.0,
        };
        pairs + groups
    }

    /// [`Removal::removed`] at its one-sided 95 % upper bound (`removed + 1.645·spread`): the
    /// choice weighs what a cap removes at this bound, so that it takes a cap below the
    /// ceiling only where the histograms show, above their noise, that it removes little. The
    /// point estimate, minimised over many noisy candidates, favours the candidate whose noise
    /// happened to be lowest: at a small ε it took caps that removed three quarters of the
    /// rows while estimating none.
    pub(super) fn removed_upper(&self, g: u64, c: u64) -> f64 {
        self.removed(g, c).max(0.0) + limits::BOUNDS_REMOVAL_Z * self.spread(g, c)
    }

    /// Every row the histograms see: the pairs' rows plus, beyond the ceiling on groups, the
    /// groups' pairs at the mean rows per pair.
    pub(super) fn rows(&self) -> f64 {
        match self.noisy_groups {
            Some(_) if self.at_ceiling > 0.0 => {
                self.pair_rows + (self.all_pairs - self.at_ceiling).max(0.0) * self.rows_per_pair
            }
            _ => self.pair_rows,
        }
    }
}

/// The buckets of a histogram read by [`read_caps`] whose noisy counts are counted: the first
/// `raw` (read raw), and those from `beyond` (past the ceiling) that passed their floor.
pub(super) fn counted(read: &[f64], raw: usize, beyond: usize) -> impl Iterator<Item = usize> + '_ {
    (0..read.len()).filter(move |&b| b < raw || (b >= beyond && read[b] != 0.0))
}

/// The variance of a discrete Laplace noise of `noise`'s scale, at most the continuous one's
/// `2b²`.
pub(super) fn laplace_variance(noise: &Noise) -> f64 {
    2.0 * noise.scale().powi(2)
}

/// The rows above `cap` in a histogram of `counts` with bucket midpoints `mid`.
pub(super) fn above(counts: &[f64], mid: &[f64], cap: u64) -> f64 {
    counts
        .iter()
        .zip(mid)
        .map(|(n, m)| n * (m - cap as f64).max(0.0))
        .sum()
}
