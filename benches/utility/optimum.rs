//! The accountant against the optimum (issue 45), part of `--budget`: for Gaussian, Laplace and
//! mixed workloads in a budget of (10, 10⁻⁶), how many queries basic composition, pgdp's
//! accountant under each rule (`accounting: mixed` and `gaussian`) and the exact composition
//! admit. The exact composition of a fixed sequence of mechanisms is what no accountant can
//! beat for that sequence (an adaptive one only does worse), so it is the optimum.
//!
//! The exact composition, from the privacy loss L (Dwork–Roth; Dong, Roth & Su 2022): a
//! sequence is (ε, δ)-DP with δ = E_P[(1 − e^{ε − L})₊], L the sum of the parts' losses.
//! - A Laplace count at ε (discrete Laplace, sensitivity 1) has the loss of randomized response:
//!   +ε with probability p = e^ε/(1 + e^ε), −ε otherwise; a of them, (2j − a)·ε with j
//!   binomial (a, p).
//! - k Gaussian counts at σ have the loss N(m²/2, m²), m = √k/σ, and
//!   E[(1 − e^{e − L_G})₊] = Φ(−e/m + m/2) − e^e·Φ(−e/m − m/2) for every real e.
//!
//! So δ(ε) = Σ_j P(j)·g(ε − (2j − a)·ε_L), g the Gaussian term (or (1 − e^e)₊ with no Gaussian
//! count). Independent of the accountant's code (no Rényi divergence, no GDP budget): a check
//! of its figures, computed in plain floating point with fit.rs's Φ.

use std::fmt::Write as _;

use pgdp::budget::{admit, Cost, Fixed, Limit, Spent};
use pgdp::policy::Accounting;

use super::fit::normal_cdf;
use super::Res;
use crate::common::fail;

/// Queries counted at most per workload.
const COUNTED_MAX: usize = 5_000;

/// One part of a workload.
#[derive(Clone, Copy)]
enum Part {
    /// A Laplace count at this ε.
    Laplace(f64),
    /// A Gaussian count at the table's σ.
    Gaussian,
}

/// A workload: the parts of its prefix, then its cycle repeated until the first refusal.
struct Workload {
    name: &'static str,
    prefix: Vec<Part>,
    cycle: Vec<Part>,
}

impl Workload {
    fn part(&self, n: usize) -> Part {
        match self.prefix.get(n) {
            Some(p) => *p,
            None => self.cycle[(n - self.prefix.len()) % self.cycle.len()],
        }
    }
}

/// δ at `epsilon` of the exact composition of the first `n` parts of `w`, Gaussian counts at
/// `sigma` (the module docs' formula). Laplace parts must share one ε.
fn exact_delta(w: &Workload, n: usize, epsilon: f64, sigma: f64) -> f64 {
    let (mut laplace, mut laplace_epsilon, mut gaussian) = (0usize, 0.0_f64, 0usize);
    for i in 0..n {
        match w.part(i) {
            Part::Laplace(e) => {
                laplace += 1;
                laplace_epsilon = e;
            }
            Part::Gaussian => gaussian += 1,
        }
    }
    let m = (gaussian as f64).sqrt() / sigma;
    let g = |e: f64| {
        if gaussian == 0 {
            (1.0 - e.exp()).max(0.0)
        } else {
            normal_cdf(-e / m + m / 2.0) - e.exp() * normal_cdf(-e / m - m / 2.0)
        }
    };
    let ln_p = laplace_epsilon - (1.0 + laplace_epsilon.exp()).ln();
    let ln_q = -(1.0 + laplace_epsilon.exp()).ln();
    let mut ln_choose = 0.0_f64;
    let mut delta = 0.0;
    for j in 0..=laplace {
        if j > 0 {
            ln_choose += ((laplace - j + 1) as f64).ln() - (j as f64).ln();
        }
        let weight = (ln_choose + j as f64 * ln_p + (laplace - j) as f64 * ln_q).exp();
        let loss = (2.0 * j as f64 - laplace as f64) * laplace_epsilon;
        delta += weight * g(epsilon - loss);
    }
    delta
}

/// The largest n whose first n parts compose exactly to (ε, δ).
fn optimum(w: &Workload, epsilon: f64, delta: f64, sigma: f64) -> usize {
    (0..COUNTED_MAX)
        .find(|&n| exact_delta(w, n + 1, epsilon, sigma) > delta)
        .unwrap_or(COUNTED_MAX)
}

/// Parts admitted by pgdp's accountant before the first refusal.
fn admitted(w: &Workload, limit: &Limit, count: &Cost) -> Res<usize> {
    let mut spent = Spent::ZERO;
    for n in 0..COUNTED_MAX {
        let cost = match w.part(n) {
            Part::Laplace(e) => Cost::pure(Fixed::from_f64_floor(e).map_err(|_| fail("ε"))?),
            Part::Gaussian => *count,
        };
        match admit(limit, &spent, &cost) {
            Ok(after) => spent = after,
            Err(_) => return Ok(n),
        }
    }
    Ok(COUNTED_MAX)
}

/// Parts admitted by basic composition: Laplace at their ε, Gaussian counts at (1, 10⁻⁸), the
/// (ε, δ) their σ is calibrated to.
fn basic(w: &Workload, epsilon: f64, delta: f64) -> usize {
    let (mut e, mut d) = (0.0, 0.0);
    (0..COUNTED_MAX)
        .find(|&n| {
            match w.part(n) {
                Part::Laplace(x) => e += x,
                Part::Gaussian => {
                    e += 1.0;
                    d += 1e-8;
                }
            }
            e > epsilon + 1e-9 || d > delta
        })
        .unwrap_or(COUNTED_MAX)
}

/// Appends the table to `text`: `limit` is (10, 10⁻⁶), `count` a Gaussian count at `sigma`.
pub fn table(text: &mut String, limit: &Limit, count: &Cost, sigma: f64) -> Res<()> {
    let workloads = [
        Workload {
            name: "Gaussian counts at σ = 5.39",
            prefix: vec![],
            cycle: vec![Part::Gaussian],
        },
        Workload {
            name: "Laplace counts at ε = 1",
            prefix: vec![],
            cycle: vec![Part::Laplace(1.0)],
        },
        Workload {
            name: "Laplace counts at ε = 0.1",
            prefix: vec![],
            cycle: vec![Part::Laplace(0.1)],
        },
        Workload {
            name: "two Laplace counts at ε = 1, then Gaussian counts",
            prefix: vec![Part::Laplace(1.0), Part::Laplace(1.0)],
            cycle: vec![Part::Gaussian],
        },
        Workload {
            name: "Laplace counts at ε = 0.1 and Gaussian counts, alternating",
            prefix: vec![],
            cycle: vec![Part::Laplace(0.1), Part::Gaussian],
        },
    ];
    let (epsilon, delta) = (limit.epsilon.to_f64(), limit.delta.to_f64());
    writeln!(
        text,
        "\nThe accountant against the optimum, in (ε, δ) = (10, 10⁻⁶): queries admitted before \
         the first refusal (all of them, the two Laplace counts of a prefix included). The \
         optimum is the exact composition of the same sequence (its privacy loss distribution; \
         no accountant admits more, an adaptive one less), computed independently of the \
         accountant (benches/utility/optimum.rs); pgdp reserves half of δ for partition \
         selection, so its column to compare with is the one at δ/2.\n"
    )?;
    writeln!(
        text,
        "| workload | basic composition | `accounting: mixed` | `accounting: gaussian` | optimum at δ/2 | optimum at δ |"
    )?;
    writeln!(text, "|---|---:|---:|---:|---:|---:|")?;
    let gaussian_limit = limit.under(Accounting::Gaussian);
    for w in &workloads {
        let row = (
            basic(w, epsilon, delta),
            admitted(w, limit, count)?,
            admitted(w, &gaussian_limit, count)?,
            optimum(w, epsilon, delta / 2.0, sigma),
            optimum(w, epsilon, delta, sigma),
        );
        writeln!(
            text,
            "| {} | {} | {} | {} | {} | {} |",
            w.name, row.0, row.1, row.2, row.3, row.4
        )?;
        eprintln!("{}: {row:?}", w.name);
    }
    Ok(())
}
