//! Exact samplers for the discrete Laplace and discrete Gaussian distributions, doing the same
//! work whatever noise they draw.
//!
//! The algorithms are those of Canonne, Kamath & Steinke, "The Discrete Gaussian for Differential
//! Privacy" (NeurIPS 2020, arXiv:2004.00010), Algorithms 1–3, in the form OpenDP's Rust samplers
//! use: every probability is an exact rational, every coin comes from uniform integers drawn by
//! rejection from whole random words (or bytes), so each function returns a sample from exactly
//! the stated distribution, given an ideal random source.
//!
//! **Fixed work.** CKS20's loops run a number of times that depends on the value they produce: the
//! geometric part of a discrete Laplace flips one `e^-1` coin per unit of `|noise|/scale`, and each
//! `e^-x` coin flips coins until the first false one, whose index is the coin's result. Their
//! running time therefore tells an observer about the noise, hence about the exact value it was
//! added to (Jin, McMurtry, Rubinstein & Ohrimenko, IEEE S&P 2022). Here every such loop draws a
//! fixed number of trials and reads its result from them without stopping early:
//! - an `e^-x` coin for `x ∈ [0, 1]` ([`exp_coin_unit`]) always flips [`EXP_COIN_TRIALS`] coins
//!   (the loop needs more with probability at most `1/24! < 2^-79`);
//! - the geometric count of `e^-1` successes ([`geometric_e1`]) is read from one uniform draw
//!   compared with all of `e^-1, …, e^-48` (by inversion; it needs more with probability
//!   `e^-48 < 2^-69`), where CKS20 flips one coin per unit of the count;
//! - an `e^-v` coin for an integer `v` ([`exp_neg_coin`]: the whole part of an `e^-x` coin for
//!   `x > 1`, where CKS20 flips `floor(x)` coins) compares one uniform draw with `e^-v`.
//!
//! Uniform reals are compared with these constants 128 bits at a time, which decides unless the
//! bits tie (probability `2^-128`).
//!
//! When a fixed budget does not decide (the probabilities above), the loop simply goes on, so
//! the distribution stays exact; only then does the work depend on the value, and such an event
//! has probability below `2^-64` per sample (`Work::fallbacks` counts them). What remains
//! variable is the number of rounds of *rejection* loops (drawing `U` in the geometric sampler,
//! refusing "−0" in the discrete Laplace, and the discrete Gaussian's acceptance test) and of the
//! rejection inside [`uniform_below`]. A rejection loop's rounds are independent and identically
//! distributed, and it returns the value of the first accepted round, so the number of rounds is
//! statistically independent of the value returned; the work of each round is fixed; so the
//! whole trace of work is independent of the sample (docs/security.md, *Timing*). Arithmetic on
//! the result (`(u + t·v)/s`, sizes of big integers) still varies slightly with its size.
//!
//! Invariants:
//! - No floating-point number is involved anywhere in this file.
//! - Randomness comes only from the `rng` argument; nothing is global or cached.
//! - Parameters are checked with assertions: a non-positive scale is a bug in the caller
//!   (`Noise` and `PartitionSelection` validate before they sample).
//! - The number of trials a sample consumes is `Work::expected_trials` of its rejection rounds,
//!   whatever value it returns (checked by the tests at the bottom).

use num_bigint::{BigInt, BigUint, Sign};
use num_rational::BigRational;
use num_traits::{One, Signed, ToPrimitive, Zero};
use rand::{CryptoRng, Rng};

/// Coins flipped for every `e^-x` coin with `x ∈ [0, 1]`: CKS20's loop needs more than `C` with
/// probability `x^C/C! ≤ 1/24! < 2^-79`.
pub const EXP_COIN_TRIALS: u64 = 24;

/// Thresholds `e^-1, …, e^-48` every geometric count is compared with: a count of 48 or more, which
/// needs more work, has probability `e^-48 < 2^-69`.
pub const EXP_NEG_THRESHOLDS: u64 = 48;

/// `floor(e^-v · 2^128)` at index `v` for `v = 1..=48`, checked against exact bounds by a test.
const E_NEG_128: [u128; 49] = [
    u128::MAX, // v = 0: e^0 = 1, never compared
    0x5e2d_58d8_b3bc_df1a_bade_c782_9054_f90d,
    0x22a5_5547_7f03_973f_b6ed_d5c2_5a05_2ae3,
    0x0cbe_d866_6758_5764_a413_0191_c840_8680,
    0x04b0_556e_084f_3d1d_fa2b_c04c_b0ab_88f5,
    0x01b9_93fe_00d5_3761_c45c_2491_49a5_b95d,
    0x00a2_728f_889e_a6ae_c05d_023e_0004_35e6,
    0x003b_c2d7_3849_531d_5733_2efd_57ef_4a2b,
    0x0015_fc21_0410_27ac_bbfc_d467_80fe_e71e,
    0x0008_1679_1293_2a2c_c8ab_6d9e_082e_c1b6,
    0x0002_f9af_36ac_8f93_538b_648e_aa13_10e5,
    0x0001_1835_4238_f676_403c_9efc_ef2e_faad,
    0x0000_6715_30ed_0ef2_2bc6_43b0_6cff_1c8f,
    0x0000_25ec_0a77_303b_3068_42a4_a565_8da8,
    0x0000_0df3_637e_d80b_0908_6e67_0bd5_98c4,
    0x0000_0521_d728_89fb_0e02_fe38_b63e_ebcc,
    0x0000_01e3_55bb_aee8_5cad_a65f_73f3_2e88,
    0x0000_00b1_cf18_bad3_44e5_ecce_1dd4_e867,
    0x0000_0041_698a_31a6_7e83_2211_c55e_95af,
    0x0000_0018_1056_ff2c_5771_a77f_0f91_dbfb,
    0x0000_0008_da43_2af9_b933_7302_5a28_a80b,
    0x0000_0003_41b6_1a1b_b67d_8411_56e4_7a5e,
    0x0000_0001_32b4_8bf1_17da_253c_ef05_f685,
    0x0000_0000_70d4_9f90_cfea_c45f_ad30_edea,
    0x0000_0000_2982_0f1f_d245_1414_36ad_db03,
    0x0000_0000_0f45_1bd2_2fe1_96e8_18e4_ee1e,
    0x0000_0000_059e_14a9_c01f_9061_e363_dd59,
    0x0000_0000_0211_0a53_0ecf_d344_6f1d_fbcc,
    0x0000_0000_00c2_9f80_eb6a_9dcf_eb64_183c,
    0x0000_0000_0047_990a_ebae_1281_42bb_c1e7,
    0x0000_0000_001a_56e0_c2ac_7f74_d50f_d4e3,
    0x0000_0000_0009_b090_f126_9ddc_c4bc_6204,
    0x0000_0000_0003_908c_9eec_2c8d_03c5_3340,
    0x0000_0000_0001_4fb5_47c7_75da_786f_c232,
    0x0000_0000_0000_7b80_07bb_58aa_7f51_e38f,
    0x0000_0000_0000_2d6e_e334_b3e1_c054_f70b,
    0x0000_0000_0000_10b6_c3af_dde0_6380_6d10,
    0x0000_0000_0000_0626_11c7_f298_153f_9dab,
    0x0000_0000_0000_0243_115a_d5c6_6061_bb01,
    0x0000_0000_0000_00d5_06f2_5f9a_d9bf_4f1e,
    0x0000_0000_0000_004e_5e49_266c_6890_a552,
    0x0000_0000_0000_001c_d480_a1b7_481f_dd71,
    0x0000_0000_0000_000a_9b22_9771_7bad_f402,
    0x0000_0000_0000_0003_e6d7_a6fe_85e7_c2fb,
    0x0000_0000_0000_0001_6f74_1de1_748e_bebe,
    0x0000_0000_0000_0000_872d_b9e8_ffa9_e7d4,
    0x0000_0000_0000_0000_31ba_bc37_613a_fcd9,
    0x0000_0000_0000_0000_124b_6031_b49b_da70,
    0x0000_0000_0000_0000_06ba_eaeb_8e90_6d2f,
];

/// The work one sample took: rounds of each rejection loop, trials, and fallbacks (a fixed trial
/// budget that did not decide, after which the loop went on).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Work {
    /// Rounds of the loop drawing `U` in the geometric sampler.
    pub u_rounds: u64,
    /// Geometric counts of `e^-1` successes drawn (one per geometric sample).
    pub geometric_counts: u64,
    /// Rounds of the discrete Laplace's loop refusing "−0".
    pub laplace_rounds: u64,
    /// Rounds of the discrete Gaussian's acceptance loop.
    pub gaussian_rounds: u64,
    /// Rounds of the rounded Gaussian's loop (Karney's Algorithm N, [`normal`]).
    pub normal_rounds: u64,
    /// Trials: uniform draws, coins and `e^-1` comparisons, each counted once.
    pub trials: u64,
    /// Fixed budgets that did not decide.
    pub fallbacks: u64,
}

impl Work {
    /// The trials the rounds above take when no fallback happens: each round of each loop has a
    /// fixed cost.
    #[cfg(test)]
    pub(crate) fn expected_trials(&self) -> u64 {
        self.u_rounds * (1 + EXP_COIN_TRIALS)
            + self.geometric_counts
            + self.laplace_rounds
            + self.gaussian_rounds * (1 + EXP_COIN_TRIALS)
            + self.normal_rounds * (4 + EXP_COIN_TRIALS + 3 * normal::CHAINS * normal::CHAIN_STEPS)
    }
}

/// A uniform integer in `[0, upper)`, without modulo bias.
///
/// # Privacy
/// A building block: it spends no budget itself. Exact given an ideal random source.
///
/// Draws `L` random bytes, `L` the fewest that hold `upper - 1`, and rejects the draw when it falls
/// into the incomplete last block of `upper` values, so that every accepted value is equally
/// likely. Each draw is accepted with probability above 1/2, and the number of draws is
/// independent of the value returned. Bounds below 2^128 use whole 64-bit words the same way.
/// `upper = 1` returns 0 without drawing.
///
/// # Panics
/// If `upper` is zero.
pub fn uniform_below<R: Rng + CryptoRng + ?Sized>(rng: &mut R, upper: &BigUint) -> BigUint {
    assert!(!upper.is_zero(), "uniform_below needs a positive bound");
    if let Some(small) = upper.to_u128() {
        return BigUint::from(uniform_below_u128(rng, small));
    }
    let len = usize::try_from(upper.bits().div_ceil(8)).expect("invariant: a bound fits memory");
    let range = BigUint::one() << (8 * len);
    // The largest multiple of `upper` not above 256^len: draws below it are accepted.
    let threshold = &range - (&range % upper);
    let mut buf = vec![0u8; len];
    loop {
        rng.fill_bytes(&mut buf);
        let draw = BigUint::from_bytes_be(&buf);
        if draw < threshold {
            return draw % upper;
        }
    }
}

/// [`uniform_below`] for a bound that fits a word, by Lemire's multiply-and-reject method
/// ("Fast Random Integer Generation in an Interval", ACM TOMACS 2019): the high word of
/// `draw · upper` is the value; draws whose low word falls below `2^64 mod upper` are rejected,
/// which leaves exactly `floor(2^64 / upper)` accepted draws for every value.
fn uniform_below_u64<R: Rng + CryptoRng + ?Sized>(rng: &mut R, upper: u64) -> u64 {
    debug_assert!(upper > 0);
    if upper == 1 {
        return 0;
    }
    let first = rng.next_u64();
    uniform_below_u64_from(rng, first, upper)
}

/// [`uniform_below_u64`] whose first draw is the word `first` (drawn already), drawing further
/// words only when it is rejected; `upper ≥ 1`.
fn uniform_below_u64_from<R: Rng + CryptoRng + ?Sized>(rng: &mut R, first: u64, upper: u64) -> u64 {
    debug_assert!(upper > 0);
    let mut product = u128::from(first) * u128::from(upper);
    if (product as u64) < upper {
        // 2^64 mod upper, computed only when a rejection is possible.
        let threshold = upper.wrapping_neg() % upper;
        while (product as u64) < threshold {
            product = u128::from(rng.next_u64()) * u128::from(upper);
        }
    }
    (product >> 64) as u64
}

/// [`uniform_below`] for a bound that fits two words.
fn uniform_below_u128<R: Rng + CryptoRng + ?Sized>(rng: &mut R, upper: u128) -> u128 {
    debug_assert!(upper > 0);
    if let Ok(small) = u64::try_from(upper) {
        return u128::from(uniform_below_u64(rng, small));
    }
    let rem = (u128::MAX % upper + 1) % upper;
    loop {
        let draw = u128::from(rng.next_u64()) << 64 | u128::from(rng.next_u64());
        if draw <= u128::MAX - rem {
            return draw % upper;
        }
    }
}

/// A fair coin.
fn fair_bit<R: Rng + CryptoRng + ?Sized>(rng: &mut R) -> bool {
    rng.next_u32() & 1 == 1
}

/// `true` with probability `n/d`, for `d > 0` (`n >= d` is always true).
fn bernoulli_ratio<R: Rng + CryptoRng + ?Sized>(rng: &mut R, n: &BigUint, d: &BigUint) -> bool {
    match (n.to_u128(), d.to_u128()) {
        (Some(n), Some(d)) => uniform_below_u128(rng, d) < n,
        _ => uniform_below(rng, d) < *n,
    }
}

/// `true` with probability exactly `p`.
///
/// # Privacy
/// A building block: it spends no budget itself. Exact for every rational `p` in `[0, 1]`: it
/// compares a uniform draw below the denominator with the numerator (CKS20). One uniform draw.
///
/// # Panics
/// If `p` is outside `[0, 1]`.
pub fn bernoulli<R: Rng + CryptoRng + ?Sized>(rng: &mut R, p: &BigRational) -> bool {
    assert!(
        !p.is_negative() && *p <= BigRational::one(),
        "bernoulli needs p in [0, 1]"
    );
    bernoulli_ratio(rng, p.numer().magnitude(), p.denom().magnitude())
}

/// `true` with probability `n/(d·k)`: the `k`-th coin of CKS20's `e^-x` loop, `x = n/d`.
fn coin_k<R: Rng + CryptoRng + ?Sized>(rng: &mut R, n: &BigUint, d: &BigUint, k: u64) -> bool {
    if let (Some(n), Some(dk)) = (
        n.to_u128(),
        d.to_u128().and_then(|d| d.checked_mul(u128::from(k))),
    ) {
        return uniform_below_u128(rng, dk) < n;
    }
    uniform_below(rng, &(d * k)) < *n
}

/// `true` with probability `num/den <= 1`, given `prefix = floor(num · 2^128 / den)`: 128 random
/// bits compared with `prefix` decide unless they equal it (probability `2^-128`, a fallback:
/// the next 128 bits of the fraction are computed exactly).
fn lazy_coin<R: Rng + CryptoRng + ?Sized>(
    rng: &mut R,
    work: &mut Work,
    prefix: u128,
    num: impl FnOnce() -> BigUint,
    den: impl FnOnce() -> BigUint,
) -> bool {
    let draw = u128::from(rng.next_u64()) << 64 | u128::from(rng.next_u64());
    if draw != prefix {
        return draw < prefix;
    }
    work.fallbacks += 1;
    let den = den();
    let mut rest = (num() << 128usize) - BigUint::from(prefix) * &den;
    loop {
        let shifted = &rest << 128usize;
        let prefix = &shifted / &den;
        let draw = BigUint::from(u128::from(rng.next_u64()) << 64 | u128::from(rng.next_u64()));
        if draw != prefix {
            return draw < prefix;
        }
        rest = shifted - prefix * &den;
    }
}

/// `true` with probability `exp(-n/d)` for `0 <= n/d <= 1` (CKS20 Algorithm 1, first part), with
/// a fixed number of coins.
///
/// With `K` the first `k >= 1` whose coin with probability `x/k` comes up false, returns whether
/// `K` is odd; `P(K > k) = x^k/k!`, so `P(K odd) = Σ (-x)^k/k! = e^-x`. All
/// [`EXP_COIN_TRIALS`] coins are flipped and `K` is read from them; the coins after `K` do not
/// change its distribution. If all come up true, the loop goes on (a fallback). A coin is a
/// uniform draw below `d·k` while that fits a word, and otherwise 128 random bits compared with
/// `floor(2^128·x/k)`, all derived from one division (`floor(floor(a/d)/k) = floor(a/(d·k))`).
fn exp_coin_unit<R: Rng + CryptoRng + ?Sized>(
    rng: &mut R,
    work: &mut Work,
    n: &BigUint,
    d: &BigUint,
) -> bool {
    debug_assert!(n <= d && !d.is_zero());
    enum Coins {
        /// Uniform draws below `d·k < 2^64` compared with `n`.
        Word { n: u64, d: u64 },
        /// `floor(2^128 · n/d)`, for `n < d`.
        Lazy(u128),
    }
    let coins = match (n.to_u64(), d.to_u64()) {
        (Some(n), Some(d)) if d.checked_mul(EXP_COIN_TRIALS).is_some() => Coins::Word { n, d },
        _ if n == d => Coins::Word { n: 1, d: 1 },
        _ => Coins::Lazy(((n << 128usize) / d).to_u128().expect("invariant: x < 1")),
    };
    let coin = |rng: &mut R, work: &mut Work, k: u64| match coins {
        Coins::Word { n, d } => match d.checked_mul(k) {
            Some(dk) => uniform_below_u64(rng, dk) < n,
            None => coin_k(rng, &BigUint::from(n), &BigUint::from(d), k),
        },
        Coins::Lazy(prefix) => lazy_coin(rng, work, prefix / u128::from(k), || n.clone(), || d * k),
    };
    let mut first_false = None;
    for k in 1..=EXP_COIN_TRIALS {
        let heads = coin(rng, work, k);
        work.trials += 1;
        if !heads && first_false.is_none() {
            first_false = Some(k);
        }
    }
    let k = first_false.unwrap_or_else(|| {
        work.fallbacks += 1;
        let mut k = EXP_COIN_TRIALS + 1;
        while coin(rng, work, k) {
            k += 1;
        }
        k
    });
    k % 2 == 1
}

/// `floor(e^-1 · 2^bits)`, from the alternating series `Σ (-1)^k/k!` with its error bound
/// (`e^-1` is irrational, so enough terms always decide the floor).
fn e1_bits(bits: u64) -> BigUint {
    let scale = BigInt::one() << bits;
    let mut sum = BigRational::zero();
    let mut term = BigRational::one();
    let mut k: u64 = 0;
    loop {
        sum = if k % 2 == 0 { sum + &term } else { sum - &term };
        k += 1;
        term /= BigInt::from(k);
        // |e^-1 - sum| <= term: the floor is known once both ends of the interval agree.
        let low = ((&sum - &term) * &scale).floor();
        let high = ((&sum + &term) * &scale).floor();
        if low == high && k > 2 {
            return low
                .to_integer()
                .to_biguint()
                .expect("invariant: e^-1 is positive");
        }
    }
}

/// `floor(e^-v · 2^bits)` for `v >= 1`: fixed-point lower and upper bounds on `(e^-1)^v` at a
/// working precision that grows until their floors agree (`e^-v` is irrational).
fn exp_neg_bits(v: u64, bits: u64) -> BigUint {
    let mut precision = bits + 64 + u64::from(64 - v.leading_zeros());
    loop {
        let low1 = e1_bits(precision);
        let high1 = &low1 + 1u32;
        let round_up = (BigUint::one() << precision) - 1u32;
        let (mut low, mut high) = (low1.clone(), high1.clone());
        for _ in 1..v {
            low = (&low * &low1) >> precision;
            high = (&high * &high1 + &round_up) >> precision;
        }
        // low <= e^-v · 2^precision <= high.
        let shift = precision - bits;
        if (&low >> shift) == (&high >> shift) {
            return low >> shift;
        }
        precision += 64;
    }
}

/// Whether a uniform real in `[0, 1)` whose first 128 bits are `draw` lies below `e^-v`, drawing
/// further bits while they tie with those of `e^-v` (`v` at most a few thousand: this runs only
/// after a fallback).
fn below_exp_neg<R: Rng + CryptoRng + ?Sized>(rng: &mut R, draw: u128, v: u64) -> bool {
    let mask = (BigUint::one() << 128usize) - 1u32;
    let mut bits = 128;
    let mut draw = BigUint::from(draw);
    loop {
        let reference = exp_neg_bits(v, bits) & &mask;
        if draw != reference {
            return draw < reference;
        }
        bits += 128;
        draw = BigUint::from(u128::from(rng.next_u64()) << 64 | u128::from(rng.next_u64()));
    }
}

/// `true` with probability exactly `e^-v` for an integer `v >= 0`: 128 random bits compared
/// with the first 128 bits of `e^-v` ([`E_NEG_128`]). They decide unless they tie (probability
/// `2^-128`) or `v > 48` and they fall below `e^-48` (probability below `2^-69`); then further
/// exact bits decide (a fallback).
fn exp_neg_coin<R: Rng + CryptoRng + ?Sized>(rng: &mut R, work: &mut Work, v: &BigUint) -> bool {
    work.trials += 1;
    let draw = u128::from(rng.next_u64()) << 64 | u128::from(rng.next_u64());
    let last = E_NEG_128[EXP_NEG_THRESHOLDS as usize];
    match v.to_u64() {
        Some(0) => true,
        Some(v) if v <= EXP_NEG_THRESHOLDS => {
            let threshold = E_NEG_128[v as usize];
            if draw != threshold {
                return draw < threshold;
            }
            work.fallbacks += 1;
            below_exp_neg(rng, draw, v)
        }
        _ if draw > last => false,
        large => {
            work.fallbacks += 1;
            below_exp_neg(
                rng,
                draw,
                large.expect("invariant: exponents here are small"),
            )
        }
    }
}

/// The number of `e^-1` coins that come up true before the first false one: `P(V >= v) = e^-v`.
///
/// By inversion with one uniform `U`: `V >= v` exactly when `U < e^-v`, so `V` is the number of
/// thresholds `e^-1, …, e^-48` above `U`. The first 128 bits of `U` are compared with all 48
/// thresholds ([`E_NEG_128`]), which decides `V` unless they tie with one (probability
/// `48·2^-128`) or `V >= 48` (probability `e^-48 < 2^-69`); then further exact bits, or, since
/// the distribution is memoryless, `e^-1` coins counted one by one, decide (a fallback).
fn geometric_e1<R: Rng + CryptoRng + ?Sized>(rng: &mut R, work: &mut Work) -> u64 {
    work.geometric_counts += 1;
    work.trials += 1;
    let draw = u128::from(rng.next_u64()) << 64 | u128::from(rng.next_u64());
    let mut v = 0;
    let mut tie = None;
    for (w, threshold) in (0u64..).zip(E_NEG_128).skip(1) {
        v += u64::from(draw < threshold);
        if draw == threshold {
            tie = Some(w);
        }
    }
    if let Some(w) = tie {
        // Every threshold above the tied one is above U, every one below it below U.
        work.fallbacks += 1;
        v = if below_exp_neg(rng, draw, w) {
            w
        } else {
            w - 1
        };
    }
    if v == EXP_NEG_THRESHOLDS {
        work.fallbacks += 1;
        while exp_neg_coin(rng, work, &BigUint::one()) {
            v += 1;
        }
    }
    v
}

/// `true` with probability `exp(-n/d)` for any `n/d >= 0` (CKS20 Algorithm 1), with a fixed
/// number of coins.
///
/// `e^-x = e^-floor(x) · e^-(x - floor(x))`: one coin for the whole part ([`exp_neg_coin`],
/// CKS20 flips `floor(x)` `e^-1` coins instead, a number that depends on `x`) and one for the
/// fractional part ([`exp_coin_unit`]).
fn exp_coin<R: Rng + CryptoRng + ?Sized>(
    rng: &mut R,
    work: &mut Work,
    n: &BigUint,
    d: &BigUint,
) -> bool {
    debug_assert!(!d.is_zero());
    let whole = exp_neg_coin(rng, work, &(n / d));
    let fraction = exp_coin_unit(rng, work, &(n % d), d);
    whole && fraction
}

/// `true` with probability exactly `exp(-x)`.
///
/// # Privacy
/// A building block: it spends no budget itself. Exact for every rational `x >= 0`
/// (CKS20 Algorithm 1). It flips the same number of coins whatever its result, except with
/// probability below `2^-64`.
///
/// # Panics
/// If `x` is negative.
pub fn bernoulli_exp<R: Rng + CryptoRng + ?Sized>(rng: &mut R, x: &BigRational) -> bool {
    assert!(!x.is_negative(), "bernoulli_exp needs x >= 0");
    exp_coin(
        rng,
        &mut Work::default(),
        x.numer().magnitude(),
        x.denom().magnitude(),
    )
}

/// Geometric with `P(k) = (1 - e^-(s/t)) e^-(k·s/t)` for `k >= 0` (CKS20 Algorithm 2, the part
/// before the sign).
///
/// `U` uniform in `[0, t)` accepted with probability `e^-(U/t)` and `V` geometric with ratio
/// `e^-1` make `U + t·V` geometric with ratio `e^-(1/t)`; dividing by `s` (rounding down) gives
/// ratio `e^-(s/t)`. The loop for `U` accepts with probability at least `1 - e^-1`; each round
/// takes `1 + EXP_COIN_TRIALS` trials, and `V` one.
fn geometric_ratio<R: Rng + CryptoRng + ?Sized>(
    rng: &mut R,
    work: &mut Work,
    s: &BigUint,
    t: &BigUint,
) -> BigUint {
    debug_assert!(!s.is_zero() && !t.is_zero());
    let u = loop {
        work.u_rounds += 1;
        let u = uniform_below(rng, t);
        work.trials += 1;
        if exp_coin_unit(rng, work, &u, t) {
            break u;
        }
    };
    let v = geometric_e1(rng, work);
    (u + t * v) / s
}

/// A geometric sample: `P(k) = (1 - e^-x) e^-(k x)` for `k = 0, 1, 2, …`.
///
/// # Privacy
/// A building block: it spends no budget itself. Exact for every rational `x > 0`
/// (CKS20 Algorithm 2). The trials it consumes are independent of the value it returns, except
/// with probability below `2^-64`.
///
/// # Panics
/// If `x <= 0`.
pub fn sample_geometric<R: Rng + CryptoRng + ?Sized>(rng: &mut R, x: &BigRational) -> BigUint {
    assert!(x.is_positive(), "sample_geometric needs x > 0");
    geometric_ratio(
        rng,
        &mut Work::default(),
        x.numer().magnitude(),
        x.denom().magnitude(),
    )
}

/// Discrete Laplace with scale `t/s`: `P(y) ∝ e^-(|y| s/t)` over all integers.
fn discrete_laplace_ratio<R: Rng + CryptoRng + ?Sized>(
    rng: &mut R,
    work: &mut Work,
    t: &BigUint,
    s: &BigUint,
) -> BigInt {
    loop {
        work.laplace_rounds += 1;
        let magnitude = geometric_ratio(rng, work, s, t);
        let negative = fair_bit(rng);
        work.trials += 1;
        // A sign and a geometric magnitude reach 0 twice; rejecting "-0" makes P(0) right.
        if negative && magnitude.is_zero() {
            continue;
        }
        return BigInt::from_biguint(if negative { Sign::Minus } else { Sign::Plus }, magnitude);
    }
}

/// A sample of the discrete Laplace distribution: `P(x) = tanh(1/(2b)) · e^(-|x|/b)` for every
/// integer `x`, where `b = scale`.
///
/// # Privacy
/// Added to an integer-valued statistic with L1 sensitivity `Δ`, it gives pure `ε`-DP with
/// `ε = Δ / scale`: neighbouring outputs' probabilities differ by at most `e^(Δ/scale)` pointwise
/// (the geometric mechanism of Ghosh, Roughgarden & Sundararajan 2009; CKS20). The sampler is
/// exact (CKS20 Algorithm 2), and the trials it consumes are independent of the noise it returns
/// except with probability below `2^-64` (module documentation).
///
/// # Panics
/// If `scale <= 0`.
pub fn sample_discrete_laplace<R: Rng + CryptoRng + ?Sized>(
    rng: &mut R,
    scale: &BigRational,
) -> BigInt {
    sample_discrete_laplace_counted(rng, scale).0
}

/// [`sample_discrete_laplace`] and the work it took.
pub(crate) fn sample_discrete_laplace_counted<R: Rng + CryptoRng + ?Sized>(
    rng: &mut R,
    scale: &BigRational,
) -> (BigInt, Work) {
    assert!(
        scale.is_positive(),
        "sample_discrete_laplace needs scale > 0"
    );
    let mut work = Work::default();
    let y = discrete_laplace_ratio(
        rng,
        &mut work,
        scale.numer().magnitude(),
        scale.denom().magnitude(),
    );
    (y, work)
}

/// A sample of the discrete Gaussian distribution: `P(x) ∝ e^(-x²/(2σ²))` for every integer `x`.
///
/// Rejection sampling from a discrete Laplace with integer scale `t = floor(σ) + 1`, accepting `y`
/// with probability `exp(-(|y| - σ²/t)² / (2σ²))` (CKS20 Algorithm 3). The proposal is
/// `P(y) ∝ e^(-|y|/t)` and `-y²/(2σ²) + |y|/t = -(|y| - σ²/t)²/(2σ²) + σ²/(2t²)`, so accepted
/// values follow the target exactly; with `t = floor(σ) + 1` the expected number of rounds stays
/// small for every `σ` (CKS20 analyse it).
///
/// # Privacy
/// Added to an integer-valued statistic with sensitivity `Δ` (or independently to each entry of
/// an integer vector with L2 sensitivity `Δ`), it gives `ρ`-zCDP with `ρ = Δ² / (2σ²)` (CKS20,
/// one-dimensional and multivariate; zCDP as defined by Bun & Steinke 2016). The trials it
/// consumes are independent of the noise it returns except with probability below `2^-64`
/// (module documentation).
///
/// # Panics
/// If `sigma <= 0`.
pub fn sample_discrete_gaussian<R: Rng + CryptoRng + ?Sized>(
    rng: &mut R,
    sigma: &BigRational,
) -> BigInt {
    sample_discrete_gaussian_counted(rng, sigma).0
}

/// [`sample_discrete_gaussian`] and the work it took.
pub(crate) fn sample_discrete_gaussian_counted<R: Rng + CryptoRng + ?Sized>(
    rng: &mut R,
    sigma: &BigRational,
) -> (BigInt, Work) {
    assert!(
        sigma.is_positive(),
        "sample_discrete_gaussian needs sigma > 0"
    );
    let mut work = Work::default();
    let p = sigma.numer().magnitude();
    let q = sigma.denom().magnitude();
    let t: BigUint = p / q + 1u32;
    let one = BigUint::one();
    let p2 = p * p;
    let q2 = q * q;
    // (|y| - σ²/t)² / (2σ²) = (|y|·q²·t - p²)² / (2·p²·q²·t²), with σ = p/q.
    let q2t = &q2 * &t;
    let den = (&p2 * &q2 * &t * &t) << 1usize;
    loop {
        let y = discrete_laplace_ratio(rng, &mut work, &t, &one);
        work.gaussian_rounds += 1;
        let a = y.magnitude() * &q2t;
        let diff = if a >= p2 { &a - &p2 } else { &p2 - &a };
        if exp_coin(rng, &mut work, &(&diff * &diff), &den) {
            return (y, work);
        }
    }
}

mod normal;
pub use normal::sample_rounded_gaussian;
#[cfg(test)]
pub(crate) use normal::sample_rounded_gaussian_counted;

#[cfg(test)]
mod tests;
