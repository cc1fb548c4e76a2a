//! The exact per-group statistics a rewrite computes ([`Measure`]), the aggregate arguments
//! they read ([`Argument`]), and which of them each aggregate of a plan needs ([`measures`]).
//! Each measure's sensitivity is a function of the policy's caps and bounds alone
//! ([`Measure::contribution`]).

use crate::dp::plan::{AggregateKind, Canonical, Plan};
use crate::policy::Bounds;

/// An exact per-group statistic that the release step noises.
#[derive(Debug, Clone, PartialEq)]
pub enum Measure {
    /// Rows of the group (capped per unit).
    Rows,
    /// Non-NULL values of argument `i` (capped per unit).
    Values(usize),
    /// Distinct privacy units in the group.
    Units,
    /// Sum of argument `i`, clamped to its bounds.
    Sum(usize),
    /// Sum of (clamped argument `i` − midpoint).
    SumCentered(usize),
    /// Sum of (clamped argument `i` − midpoint)².
    SumSquaresCentered(usize),
    /// Distinct non-NULL values of argument `i`, each unit keeping at most `max_rows_per_unit`
    /// of its values per group (chosen by a keyed hash of the unit and the value).
    Distinct(usize),
    /// The histogram of clamped argument `i` over [`crate::dp::mechanism::QUANTILE_BUCKETS`] equal
    /// buckets of its bounds, each unit keeping at most `max_rows_per_unit` values per group;
    /// released as one bucket chosen by report-noisy-max for the quantile `permille`/1000.
    Quantile(usize, u16),
}

/// An aggregate argument with its bounds.
#[derive(Debug, Clone, PartialEq)]
pub struct Argument {
    /// The argument expression.
    pub text: Canonical,
    /// Declared or derived bounds (None for COUNT(expr)).
    pub bounds: Option<Bounds>,
}

impl Argument {
    /// Midpoint and half-width of the bounds.
    pub fn center(&self) -> (f64, f64) {
        match self.bounds {
            Some(b) => ((b.lower + b.upper) / 2.0, (b.upper - b.lower) / 2.0),
            None => (0.0, 0.0),
        }
    }
}

impl Measure {
    /// Whether this statistic adds up over disjoint cells of the same rows, so that a coarser
    /// group's value is the sum of its finer cells': counts of rows or values, sums, centred
    /// sums and sums of squares. Not distinct counts (a unit or value in two cells is one in
    /// their union) nor quantile histograms released as one chosen bucket.
    pub fn is_additive(&self) -> bool {
        match self {
            Measure::Rows
            | Measure::Values(_)
            | Measure::Sum(_)
            | Measure::SumCentered(_)
            | Measure::SumSquaresCentered(_) => true,
            Measure::Units | Measure::Distinct(_) | Measure::Quantile(..) => false,
        }
    }

    /// The most one privacy unit can add to or remove from this statistic in one group.
    pub fn contribution(&self, arguments: &[Argument], max_rows_per_unit: u64) -> f64 {
        let c = max_rows_per_unit as f64;
        match self {
            Measure::Rows | Measure::Values(_) | Measure::Distinct(_) => c,
            Measure::Units => 1.0,
            Measure::Quantile(..) => {
                crate::dp::mechanism::quantile_noise_sensitivity(max_rows_per_unit)
            }
            Measure::Sum(i) => c * arguments[*i].bounds.map(|b| b.magnitude()).unwrap_or(0.0),
            Measure::SumCentered(i) => c * arguments[*i].center().1,
            Measure::SumSquaresCentered(i) => {
                let h = arguments[*i].center().1;
                c * h * h
            }
        }
    }

    /// Whether the statistic is an integer (counts) or real (sums).
    pub fn is_integer(&self) -> bool {
        matches!(
            self,
            Measure::Rows
                | Measure::Values(_)
                | Measure::Units
                | Measure::Distinct(_)
                | Measure::Quantile(..)
        )
    }

    /// A short label for EXPLAIN.
    pub fn label(&self, arguments: &[Argument]) -> String {
        match self {
            Measure::Rows => "count(*)".into(),
            Measure::Values(i) => format!("count({})", arguments[*i].text),
            Measure::Units => "count(distinct unit)".into(),
            Measure::Distinct(i) => format!("count(distinct {})", arguments[*i].text),
            Measure::Quantile(i, p) => format!(
                "quantile {}.{:03} of {} (noisy max over {} buckets)",
                p / 1000,
                p % 1000,
                arguments[*i].text,
                crate::dp::mechanism::QUANTILE_BUCKETS
            ),
            Measure::Sum(i) => format!("sum({})", arguments[*i].text),
            Measure::SumCentered(i) => {
                format!("sum({} - {})", arguments[*i].text, arguments[*i].center().0)
            }
            Measure::SumSquaresCentered(i) => {
                format!(
                    "sum(({} - {})^2)",
                    arguments[*i].text,
                    arguments[*i].center().0
                )
            }
        }
    }
}

fn push<T: PartialEq>(v: &mut Vec<T>, x: T) -> usize {
    match v.iter().position(|y| *y == x) {
        Some(i) => i,
        None => {
            v.push(x);
            v.len() - 1
        }
    }
}

/// The measures a plan needs, and for each aggregate which ones.
///
/// Under `max_rows_per_unit = 1` a unit adds at most one row to a group, so the capped count
/// of rows (`SUM(LEAST(n, 1))` over the units in the group) is the count of units in it: when
/// the query releases both, `COUNT(DISTINCT unit)` takes the rows measure instead of a second
/// noisy count. Only with `max_groups_per_unit = 1` too: the rows measure adds up over the
/// cells of a finer grouping ([`Measure::is_additive`], which lets a coarser grouping be
/// derived from it), and a count of units does so only when each unit is in one cell.
pub fn measures(plan: &Plan) -> (Vec<Argument>, Vec<Measure>, Vec<Vec<usize>>) {
    let built = measures_with(plan, false);
    if plan.max_rows_per_unit == 1
        && plan.max_groups_per_unit == 1
        && built.1.contains(&Measure::Rows)
        && built.1.contains(&Measure::Units)
    {
        return measures_with(plan, true);
    }
    built
}

/// [`measures`], with `COUNT(DISTINCT unit)` released as the rows measure when
/// `units_as_rows`.
fn measures_with(
    plan: &Plan,
    units_as_rows: bool,
) -> (Vec<Argument>, Vec<Measure>, Vec<Vec<usize>>) {
    let mut arguments: Vec<Argument> = Vec::new();
    let mut measures = Vec::new();
    let mut per_aggregate = Vec::new();
    // Arguments (with their bounds) whose count and centered sum some aggregate releases
    // anyway.
    let centered: Vec<(&Option<Canonical>, Option<Bounds>)> = plan
        .aggregates
        .iter()
        .filter(|a| {
            a.argument.is_some()
                && matches!(
                    a.kind,
                    AggregateKind::Avg
                        | AggregateKind::VarSamp
                        | AggregateKind::VarPop
                        | AggregateKind::StddevSamp
                        | AggregateKind::StddevPop
                )
        })
        .map(|a| (&a.argument, a.bounds))
        .collect();
    for agg in &plan.aggregates {
        // One argument per expression: COUNT(x) and AVG(x) share the count of x.
        let arg = agg.argument.as_ref().map(|text| {
            match arguments.iter().position(|a| a.text == *text) {
                Some(i) => {
                    if arguments[i].bounds.is_none() {
                        arguments[i].bounds = agg.bounds;
                    }
                    i
                }
                None => {
                    arguments.push(Argument {
                        text: text.clone(),
                        bounds: agg.bounds,
                    });
                    arguments.len() - 1
                }
            }
        });
        // The count of an argument's values: the count of rows where it is never NULL
        // (derived, not noised apart: `COUNT(x)` and `COUNT(*)` are then one release).
        let count = |a: usize| match &agg.argument {
            Some(text) if plan.not_null(text) => Measure::Rows,
            _ => Measure::Values(a),
        };
        let m: Vec<Measure> = match (agg.kind, arg) {
            (AggregateKind::CountRows, _) => vec![Measure::Rows],
            (AggregateKind::CountUnits, _) if units_as_rows => vec![Measure::Rows],
            (AggregateKind::CountUnits, _) => vec![Measure::Units],
            // A detected count shares its count's measure (no noise of its own).
            (AggregateKind::CountValues | AggregateKind::Detected, Some(a)) => vec![count(a)],
            // Minimal measures: where the query also has the count and centered sum of the
            // same argument (AVG, VARIANCE, STDDEV), the sum is derived from them by
            // post-processing (sum = centered sum + midpoint × count), not noised apart.
            (AggregateKind::Sum, Some(a))
                if agg.bounds.is_some() && centered.contains(&(&agg.argument, agg.bounds)) =>
            {
                vec![count(a), Measure::SumCentered(a)]
            }
            (AggregateKind::Sum, Some(a)) => vec![Measure::Sum(a)],
            (AggregateKind::Avg, Some(a)) => vec![count(a), Measure::SumCentered(a)],
            (
                AggregateKind::VarSamp
                | AggregateKind::VarPop
                | AggregateKind::StddevSamp
                | AggregateKind::StddevPop,
                Some(a),
            ) => vec![
                count(a),
                Measure::SumCentered(a),
                Measure::SumSquaresCentered(a),
            ],
            (AggregateKind::CountDistinct, Some(a)) => vec![Measure::Distinct(a)],
            (AggregateKind::Quantile { permille }, Some(a)) => vec![Measure::Quantile(a, permille)],
            (_, None) => vec![Measure::Rows],
        };
        per_aggregate.push(m.into_iter().map(|x| push(&mut measures, x)).collect());
    }
    (arguments, measures, per_aggregate)
}
