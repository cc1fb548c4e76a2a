//! The rounded Gaussian: `round(σ·Z)` for a standard normal `Z`, sampled exactly, with work that
//! does not depend on the value it returns.
//!
//! **Why not the discrete Gaussian.** Adding `round(σ·Z)` to an integer statistic is the
//! continuous Gaussian mechanism followed by rounding (post-processing: `v + round(σZ) =
//! round(v + σZ)` for an integer `v`), so it has *exactly* the continuous mechanism's privacy:
//! `μ`-GDP with `μ = Δ₂/σ` (Dong, Roth & Su 2022, Theorem 2.7) and `ρ`-zCDP with `ρ = Δ₂²/2σ²`
//! (Bun & Steinke 2016, Proposition 1.6), for one value or independently for each entry of a
//! vector of L2 sensitivity `Δ₂`. The discrete Gaussian of CKS20 is `ρ`-zCDP but not `μ`-GDP at
//! that `μ` (docs/privacy.md §8), and Gaussian DP is what composes exactly.
//!
//! **The algorithm** is Karney's Algorithm N ("Sampling exactly from the normal distribution",
//! ACM TOMS 42(1), 2016), which draws `Z = ±(k + x)` with an integer `k ≥ 0` and a real `x ∈
//! [0, 1)` whose binary digits are drawn only as far as comparisons need them:
//! 1. `k` with `P(k) ∝ e^(−k/2)`: here `k = 2g + b` with `g` geometric of ratio `e^-1`
//!    ([`geometric_e1`]) and a fair bit `b`, kept with probability `e^(−b/2)`;
//! 2. kept with probability `e^(−k(k−1)/2)` (`k(k−1)/2` is an integer: [`exp_neg_coin`]);
//! 3. `x` uniform, kept with probability `e^(−x(2k+x)/2)`: `k + 1` runs of a von Neumann chain
//!    ([`chain`], Karney's Algorithm B) that each return true with probability
//!    `e^(−x(2k+x)/(2k+2))`;
//! 4. a fair sign.
//!
//! A round that keeps all three has density `∝ e^(−k/2)·e^(−k(k−1)/2)·e^(−x(2k+x)/2) =
//! e^(−(k+x)²/2)` at `k + x`, so the accepted `±(k + x)` is exactly standard normal. The result is
//! `±round(σ·(k + x))` for the exact rational `σ`, with as many digits of `x` as decide the
//! rounding ([`round_scaled`]).
//!
//! **Fixed work** (module documentation of `sample`): every round draws the same trials whatever
//! it keeps. Step 3 always runs [`CHAINS`] chains (only the first `k + 1` count; `k ≥ CHAINS`
//! needs more, with probability `P(|Z| ≥ 10) < 2^-75` for an accepted round), each always
//! [`CHAIN_STEPS`] steps (a chain needs more with probability below `1/24! < 2^-79`); every
//! comparison of uniform reals reads one 128-bit word of each (a tie, probability `2^-128`, reads
//! more); `x` starts with two words, which decide the rounding unless `σ` in grid steps is beyond
//! `2^100` or so. Rounds are i.i.d. and the sample is the first accepted one, so the number of
//! rounds is independent of the value. The rare events above are counted as `Work::fallbacks`.
//!
//! Invariants: no floating-point number is involved; randomness comes only from `rng`.

use num_bigint::{BigInt, BigUint, Sign};
use num_rational::BigRational;
use num_traits::{One, Signed, Zero};
use rand::{CryptoRng, Rng};

use super::{exp_coin_unit, exp_neg_coin, fair_bit, geometric_e1, uniform_below_u64_from, Work};

/// Steps every chain takes: a chain continues past `n` steps with probability at most `1/n!`
/// (its continuation probability per step is below 1), `1/24! < 2^-79`.
pub const CHAIN_STEPS: u64 = 24;

/// Chains every round runs: an accepted `k` needs `k + 1` of them, and `k ≥ 10` has probability
/// `P(|Z| ≥ 10) < 2^-75`.
pub const CHAINS: u64 = 11;

/// A uniform real in `[0, 1)`: its first 128 binary digits (`head`), then further words drawn
/// only when a comparison or the rounding needs them.
struct Lazy {
    head: u128,
    tail: Vec<u128>,
}

fn draw_word<R: Rng + CryptoRng + ?Sized>(rng: &mut R) -> u128 {
    u128::from(rng.next_u64()) << 64 | u128::from(rng.next_u64())
}

impl Lazy {
    /// A uniform real whose first word is `head` (already drawn).
    fn from_head(head: u128) -> Lazy {
        Lazy {
            head,
            tail: Vec::new(),
        }
    }

    /// A uniform real with `words ≥ 1` words drawn now.
    fn new<R: Rng + CryptoRng + ?Sized>(rng: &mut R, words: usize) -> Lazy {
        let head = draw_word(rng);
        let tail = (1..words).map(|_| draw_word(rng)).collect();
        Lazy { head, tail }
    }

    /// Word `i` (0 is the most significant), drawing the words up to it if needed.
    fn word<R: Rng + CryptoRng + ?Sized>(&mut self, rng: &mut R, i: usize) -> u128 {
        if i == 0 {
            return self.head;
        }
        while self.tail.len() < i {
            self.tail.push(draw_word(rng));
        }
        self.tail[i - 1]
    }

    /// The words drawn so far.
    fn drawn(&self) -> usize {
        1 + self.tail.len()
    }
}

/// Whether `a < b`: their words are compared in order until they differ (equal reals have
/// probability 0). Reading past the first word is a fallback.
fn less<R: Rng + CryptoRng + ?Sized>(
    rng: &mut R,
    work: &mut Work,
    a: &mut Lazy,
    b: &mut Lazy,
) -> bool {
    if a.head != b.head {
        return a.head < b.head;
    }
    work.fallbacks += 1;
    let mut i = 1;
    loop {
        let (x, y) = (a.word(rng, i), b.word(rng, i));
        if x != y {
            return x < y;
        }
        i += 1;
    }
}

/// Random words one chain step reads: a uniform `z` (two), the coin's `j` (one) and its
/// uniform `w` (two).
const STEP_WORDS: usize = 5;

/// `true` with probability `(2k + x)/(2k + 2)`: a uniform `j` below `2k + 2` (from the word
/// `j_word`) is below `2k`, or equal to `2k` with the uniform real `w` below `x`. Two trials,
/// always both read.
fn coin_two_k_plus_x<R: Rng + CryptoRng + ?Sized>(
    rng: &mut R,
    work: &mut Work,
    (k, j_word, w): (u64, u64, u128),
    x: &mut Lazy,
) -> bool {
    let j = uniform_below_u64_from(rng, j_word, 2 * k + 2);
    let below = less(rng, work, &mut Lazy::from_head(w), x);
    work.trials += 2;
    j < 2 * k || (j == 2 * k && below)
}

/// `true` with probability `e^(−x(2k+x)/(2k+2))` (Karney's Algorithm B), always taking
/// [`CHAIN_STEPS`] steps unless the chain is still going after them (a fallback).
///
/// Step `i` draws a uniform `z_i` and a coin of probability `p = (2k+x)/(2k+2)`; the chain
/// goes on while `z_i` is below the previous `z` (`z_0 = x`) and the coin is true. So it takes
/// at least `n` steps with probability `P(x > z_1 > … > z_n)·pⁿ = (xp)ⁿ/n!`, and the number of
/// steps it takes is even with probability `Σ_n even ((xp)ⁿ/n! − (xp)ⁿ⁺¹/(n+1)!) = e^(−xp)`.
///
/// The words of the fixed steps are drawn at once (one `fill_bytes`).
fn chain<R: Rng + CryptoRng + ?Sized>(rng: &mut R, work: &mut Work, k: u64, x: &mut Lazy) -> bool {
    const STEPS: usize = CHAIN_STEPS as usize;
    let mut bytes = [0u8; 8 * STEP_WORDS * STEPS];
    rng.fill_bytes(&mut bytes);
    let words: [u64; STEP_WORDS * STEPS] = std::array::from_fn(|i| {
        let mut word = [0u8; 8];
        word.copy_from_slice(&bytes[8 * i..8 * i + 8]);
        u64::from_le_bytes(word)
    });
    // The last accepted z; `None` while it is x itself.
    let mut last: Option<Lazy> = None;
    let mut taken = 0u64;
    let mut stopped = false;
    let mut step = |rng: &mut R, work: &mut Work, drawn: &[u64]| {
        let pair = |i: usize| u128::from(drawn[i]) << 64 | u128::from(drawn[i + 1]);
        let mut z = Lazy::from_head(pair(0));
        work.trials += 1;
        let below = match last.as_mut() {
            Some(previous) => less(rng, work, &mut z, previous),
            None => less(rng, work, &mut z, x),
        };
        let coin = coin_two_k_plus_x(rng, work, (k, drawn[2], pair(3)), x);
        if !stopped {
            if below && coin {
                last = Some(z);
                taken += 1;
            } else {
                stopped = true;
            }
        }
        stopped
    };
    let mut done = false;
    for drawn in words.chunks_exact(STEP_WORDS) {
        done = step(rng, work, drawn);
    }
    if !done {
        work.fallbacks += 1;
        while !done {
            let drawn: [u64; STEP_WORDS] = std::array::from_fn(|_| rng.next_u64());
            done = step(rng, work, &drawn);
        }
    }
    taken % 2 == 0
}

/// One round of Algorithm N: `Some((k, x, negative))` if it is accepted.
fn round<R: Rng + CryptoRng + ?Sized>(rng: &mut R, work: &mut Work) -> Option<(u64, Lazy, bool)> {
    work.normal_rounds += 1;
    let g = geometric_e1(rng, work);
    let b = fair_bit(rng);
    let half = exp_coin_unit(rng, work, &BigUint::one(), &BigUint::from(2u8));
    work.trials += 1;
    let k = 2 * g + u64::from(b);
    let whole = !b || half;
    let square = exp_neg_coin(rng, work, &(BigUint::from(k) * k.saturating_sub(1) / 2u8));
    let mut x = Lazy::new(rng, 2);
    work.trials += 1;
    let mut fraction = true;
    for i in 0..CHAINS {
        let kept = chain(rng, work, k, &mut x);
        if i <= k {
            fraction &= kept;
        }
    }
    if whole && square && k >= CHAINS {
        work.fallbacks += 1;
        for _ in CHAINS..=k {
            fraction &= chain(rng, work, k, &mut x);
        }
    }
    let negative = fair_bit(rng);
    work.trials += 1;
    (whole && square && fraction).then_some((k, x, negative))
}

/// `round(σ·(k + x))` for `σ = p/q`, reading digits of `x` until they decide it.
///
/// With `B` digits read, `x` lies in `[X/2^B, (X+1)/2^B)` and `σ(k + x) + 1/2` in
/// `[L/D, H/D)` with `D = 2q·2^B`, `L = 2p(k·2^B + X) + q·2^B`, `H = L + 2p`. The rounding is
/// `floor` of that: decided when `floor(L/D) = floor(H/D)`, or when `H/D` is exactly the next
/// integer (the interval is open there).
fn round_scaled<R: Rng + CryptoRng + ?Sized>(
    rng: &mut R,
    work: &mut Work,
    p: &BigUint,
    q: &BigUint,
    k: u64,
    x: &mut Lazy,
) -> BigUint {
    let mut words = x.drawn();
    loop {
        let bits = 128 * words;
        let mut prefix = BigUint::zero();
        for i in 0..words {
            prefix = (prefix << 128usize) + BigUint::from(x.word(rng, i));
        }
        let den = q << (bits + 1);
        let low = ((p * ((BigUint::from(k) << bits) + prefix)) << 1usize) + (q << bits);
        let high = &low + (p << 1usize);
        let floor_low = &low / &den;
        let floor_high = &high / &den;
        if floor_low == floor_high || (floor_high == &floor_low + 1u32 && (&high % &den).is_zero())
        {
            return floor_low;
        }
        work.fallbacks += 1;
        words += 1;
    }
}

/// A sample of `round(σ·Z)`, `Z` standard normal: `P(m) = Φ((m + ½)/σ) − Φ((m − ½)/σ)` for
/// every integer `m`.
///
/// # Privacy
/// Added to an integer-valued statistic with sensitivity `Δ` (or independently to each entry of
/// an integer vector with L2 sensitivity `Δ`), it is the continuous Gaussian mechanism followed
/// by rounding: exactly `μ`-GDP with `μ = Δ/σ`, hence `ρ`-zCDP with `ρ = Δ²/(2σ²)` (module
/// documentation). Exact given an ideal random source; the trials it consumes are independent
/// of the noise it returns except with probability below `2^-64`.
///
/// # Panics
/// If `sigma <= 0`.
pub fn sample_rounded_gaussian<R: Rng + CryptoRng + ?Sized>(
    rng: &mut R,
    sigma: &BigRational,
) -> BigInt {
    sample_rounded_gaussian_counted(rng, sigma).0
}

/// [`sample_rounded_gaussian`] and the work it took.
pub(crate) fn sample_rounded_gaussian_counted<R: Rng + CryptoRng + ?Sized>(
    rng: &mut R,
    sigma: &BigRational,
) -> (BigInt, Work) {
    assert!(
        sigma.is_positive(),
        "sample_rounded_gaussian needs sigma > 0"
    );
    let mut work = Work::default();
    let (p, q) = (sigma.numer().magnitude(), sigma.denom().magnitude());
    loop {
        if let Some((k, mut x, negative)) = round(rng, &mut work) {
            let magnitude = round_scaled(rng, &mut work, p, q, k, &mut x);
            let sign = if negative { Sign::Minus } else { Sign::Plus };
            return (BigInt::from_biguint(sign, magnitude), work);
        }
    }
}
