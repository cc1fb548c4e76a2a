//! Exact conversions between `f64`, PostgreSQL `numeric` text and rationals.
//!
//! Invariants:
//! - Nothing here goes through a floating-point parse or a floating-point division: an `f64` is
//!   converted to the rational `m·2^e` it denotes, `numeric` text to the rational its digits
//!   denote, and a rational back to `f64` with one correctly rounded step.
//! - The functions are total on their documented domain; malformed input is an error, never a
//!   panic, and error messages carry no value read from the upstream.

use num_bigint::{BigInt, BigUint, Sign};
use num_integer::Integer;
use num_rational::BigRational;
use num_traits::{One, Signed, ToPrimitive, Zero};

use crate::{Error, Result};

/// Largest absolute decimal exponent accepted in `numeric` text (`1e20000`). PostgreSQL's
/// `numeric` output never uses an exponent; `float8` text does, up to `e±308`. The cap keeps
/// `10^exponent` small enough to build quickly.
pub const NUMERIC_EXPONENT_ABS_MAX: u32 = 20_000;

/// The exact rational value of a finite `f64`, or `None` for NaN and ±∞.
///
/// Every finite `f64` is `m·2^e` with integer `m` and `e`; this returns that number exactly.
pub fn rational_from_f64(x: f64) -> Option<BigRational> {
    if !x.is_finite() {
        return None;
    }
    let bits = x.to_bits();
    let negative = bits >> 63 == 1;
    let biased_exponent = ((bits >> 52) & 0x7ff) as i64;
    let fraction = bits & ((1u64 << 52) - 1);
    let (mantissa, exponent) = if biased_exponent == 0 {
        (fraction, -1074)
    } else {
        (fraction | (1u64 << 52), biased_exponent - 1075)
    };
    let magnitude = BigInt::from(mantissa);
    let value = if exponent >= 0 {
        BigRational::from_integer(magnitude << exponent as usize)
    } else {
        BigRational::new(magnitude, BigInt::one() << (-exponent) as usize)
    };
    Some(if negative { -value } else { value })
}

/// `2^k` as an exact rational.
pub(crate) fn pow2(k: i64) -> BigRational {
    if k >= 0 {
        BigRational::from_integer(BigInt::one() << k as usize)
    } else {
        BigRational::new(BigInt::one(), BigInt::one() << (-k) as usize)
    }
}

/// `floor(log2(n/d))` for positive integers `n`, `d`.
fn floor_log2_ratio(n: &BigUint, d: &BigUint) -> i64 {
    debug_assert!(!n.is_zero() && !d.is_zero());
    // bits(n) - bits(d) - 1 <= log2(n/d) < bits(n) - bits(d) + 1; test the larger candidate.
    let e = n.bits() as i64 - d.bits() as i64;
    let at_least_2_pow_e = if e >= 0 {
        *n >= d << e as usize
    } else {
        (n << (-e) as usize) >= *d
    };
    if at_least_2_pow_e {
        e
    } else {
        e - 1
    }
}

/// `floor(log2(r))` for a positive rational `r`.
///
/// # Panics
/// If `r <= 0` (a caller bug: scales and sensitivities are validated positive first).
pub(crate) fn floor_log2(r: &BigRational) -> i64 {
    assert!(
        r.is_positive(),
        "invariant: floor_log2 of a positive rational"
    );
    floor_log2_ratio(r.numer().magnitude(), r.denom().magnitude())
}

/// How [`rational_to_f64`] rounds a value that is not exactly an `f64`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rounding {
    /// To the nearest `f64`, ties to even (IEEE 754's default).
    Nearest,
    /// To the `f64` of larger magnitude (used to round scales up, never down).
    AwayFromZero,
}

/// `x · 2^exp`, exact whenever the result is representable (including subnormals).
///
/// Scaling in steps of `2^±1000` keeps every intermediate value normal or, going down, at least
/// as large as the (representable) result, so no step rounds.
fn ldexp(mut x: f64, mut exp: i64) -> f64 {
    let two_pow = |k: i64| f64::from_bits(((1023 + k) as u64) << 52);
    while exp > 1000 {
        x *= two_pow(1000);
        exp -= 1000;
        if x.is_infinite() {
            return x;
        }
    }
    while exp < -1000 {
        x *= two_pow(-1000);
        exp += 1000;
    }
    x * two_pow(exp)
}

/// The `f64` nearest to (or, with [`Rounding::AwayFromZero`], not smaller in magnitude than) the
/// rational `r`. Values beyond `f64::MAX` become ±∞; the callers decide whether to refuse or
/// saturate.
pub(crate) fn rational_to_f64(r: &BigRational, rounding: Rounding) -> f64 {
    if r.is_zero() {
        return 0.0;
    }
    let n = r.numer().magnitude();
    let d = r.denom().magnitude();
    let e = floor_log2_ratio(n, d);
    let magnitude = if e > 1024 {
        f64::INFINITY
    } else {
        // The representable neighbours of r are multiples of the quantum 2^(max(e,-1022) - 52).
        let quantum_exponent = e.max(-1022) - 52;
        let (num, den) = if quantum_exponent <= 0 {
            (n << (-quantum_exponent) as usize, d.clone())
        } else {
            (n.clone(), d << quantum_exponent as usize)
        };
        let (mut m, rem) = num.div_rem(&den);
        let round_up = match rounding {
            Rounding::Nearest => {
                let twice = &rem << 1usize;
                twice > den || (twice == den && m.is_odd())
            }
            Rounding::AwayFromZero => !rem.is_zero(),
        };
        if round_up {
            m += 1u32;
        }
        let m = m
            .to_u64()
            .expect("invariant: a rounded significand is at most 2^53");
        ldexp(m as f64, quantum_exponent)
    };
    if r.is_negative() {
        -magnitude
    } else {
        magnitude
    }
}

/// The smallest `f64` that is `>= r`, for a positive rational `r`; `None` if it exceeds
/// `f64::MAX`.
pub(crate) fn f64_at_least(r: &BigRational) -> Option<f64> {
    debug_assert!(r.is_positive());
    let x = rational_to_f64(r, Rounding::AwayFromZero);
    x.is_finite().then_some(x)
}

/// The next `f64` above a non-negative finite `x`.
pub(crate) fn next_up(x: f64) -> f64 {
    debug_assert!(x >= 0.0 && x.is_finite());
    f64::from_bits(x.to_bits() + 1)
}

/// The next `f64` below a positive finite `x`.
pub(crate) fn next_down(x: f64) -> f64 {
    debug_assert!(x > 0.0 && x.is_finite());
    f64::from_bits(x.to_bits() - 1)
}

/// `round(x / 2^k)`: the index of the multiple of `2^k` nearest to `x`, ties to even.
///
/// Whatever the tie rule, the result is within `2^(k-1)` of `x`; that is all the sensitivity
/// argument for the grid uses.
pub(crate) fn round_to_grid(x: &BigRational, k: i64) -> BigInt {
    let (num, den) = if k >= 0 {
        (x.numer().clone(), x.denom() << k as usize)
    } else {
        (x.numer() << (-k) as usize, x.denom().clone())
    };
    let (q, rem) = num.div_mod_floor(&den);
    // 0 <= rem < den because den > 0.
    let twice: BigInt = rem << 1usize;
    if twice > den || (twice == den && q.is_odd()) {
        q + 1
    } else {
        q
    }
}

/// The `f64` nearest to `n · 2^k`, saturated to `±f64::MAX` (never ±∞, never NaN).
pub(crate) fn grid_to_f64(n: &BigInt, k: i64) -> f64 {
    let value = BigRational::from_integer(n.clone()) * pow2(k);
    let x = rational_to_f64(&value, Rounding::Nearest);
    if x.is_infinite() {
        f64::MAX.copysign(x)
    } else {
        x
    }
}

/// Parses PostgreSQL `numeric` text (`-1234.5600`, `0`, `0.00`, `+.5`, `12.`) exactly into a
/// rational. A decimal exponent (`1e3`, `-2.5E-7`, as `float8` text uses) is accepted too.
///
/// No floating-point parse is involved: the digits become an integer and the position of the
/// decimal point and the exponent a power of ten.
///
/// # Errors
/// [`Error::Internal`] with a fixed message (never the text itself, which came from the upstream)
/// for anything else: empty text, whitespace, `NaN`, `Infinity`, several points, an exponent
/// beyond ±[`NUMERIC_EXPONENT_ABS_MAX`].
pub fn parse_numeric_exact(text: &str) -> Result<BigRational> {
    let malformed = || Error::internal("numeric text from the upstream is not a finite decimal");
    let bytes = text.as_bytes();
    let (negative, rest) = match bytes.split_first() {
        Some((b'-', rest)) => (true, rest),
        Some((b'+', rest)) => (false, rest),
        _ => (false, bytes),
    };
    let (mantissa, exponent_text) = match rest.iter().position(|&b| b == b'e' || b == b'E') {
        Some(i) => (&rest[..i], Some(&rest[i + 1..])),
        None => (rest, None),
    };
    let (integer_digits, fraction_digits) = match mantissa.iter().position(|&b| b == b'.') {
        Some(i) => (&mantissa[..i], &mantissa[i + 1..]),
        None => (mantissa, &mantissa[mantissa.len()..]),
    };
    let all_digits = |s: &[u8]| s.iter().all(u8::is_ascii_digit);
    if integer_digits.len() + fraction_digits.len() == 0
        || !all_digits(integer_digits)
        || !all_digits(fraction_digits)
    {
        return Err(malformed());
    }
    let exponent: i64 = match exponent_text {
        None => 0,
        Some(e) => {
            let (exponent_negative, digits) = match e.split_first() {
                Some((b'-', digits)) => (true, digits),
                Some((b'+', digits)) => (false, digits),
                _ => (false, e),
            };
            // Ten digits cannot overflow an i64; the cap below is far smaller anyway.
            if digits.is_empty() || digits.len() > 10 || !all_digits(digits) {
                return Err(malformed());
            }
            let magnitude = digits
                .iter()
                .fold(0i64, |acc, &b| acc * 10 + i64::from(b - b'0'));
            if magnitude > i64::from(NUMERIC_EXPONENT_ABS_MAX) {
                return Err(malformed());
            }
            if exponent_negative {
                -magnitude
            } else {
                magnitude
            }
        }
    };
    let mut digits = Vec::with_capacity(integer_digits.len() + fraction_digits.len());
    digits.extend_from_slice(integer_digits);
    digits.extend_from_slice(fraction_digits);
    let magnitude = BigUint::parse_bytes(&digits, 10).ok_or_else(malformed)?;
    let sign = if negative { Sign::Minus } else { Sign::Plus };
    let integer = BigInt::from_biguint(sign, magnitude);
    let power_of_ten = exponent - fraction_digits.len() as i64;
    let ten_pow = |p: i64| {
        BigInt::from(10u32).pow(u32::try_from(p).expect("invariant: decimal exponent fits u32"))
    };
    Ok(if power_of_ten >= 0 {
        BigRational::from_integer(integer * ten_pow(power_of_ten))
    } else {
        BigRational::new(integer, ten_pow(-power_of_ten))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(n: i64, d: i64) -> BigRational {
        BigRational::new(BigInt::from(n), BigInt::from(d))
    }

    #[test]
    fn f64_round_trips_exactly() {
        for x in [
            0.0,
            -0.0,
            1.0,
            -1.5,
            0.1,
            3.7,
            1e300,
            -1e-300,
            f64::MIN_POSITIVE,
            5e-324,
            f64::MAX,
            f64::MIN,
        ] {
            let r = rational_from_f64(x).expect("finite");
            assert_eq!(
                rational_to_f64(&r, Rounding::Nearest).to_bits(),
                (x + 0.0).to_bits()
            );
            assert_eq!(
                rational_to_f64(&r, Rounding::AwayFromZero).to_bits(),
                (x + 0.0).to_bits()
            );
        }
        assert_eq!(
            rational_from_f64(0.1),
            Some(BigRational::new(
                BigInt::from(3602879701896397i64),
                BigInt::one() << 55usize
            ))
        );
        assert_eq!(rational_from_f64(f64::NAN), None);
        assert_eq!(rational_from_f64(f64::INFINITY), None);
    }

    #[test]
    fn rational_to_f64_rounds_correctly() {
        // 1/3 to nearest is the f64 literal; rounded away from zero it is the next one up.
        assert_eq!(rational_to_f64(&q(1, 3), Rounding::Nearest), 1.0 / 3.0);
        assert_eq!(
            rational_to_f64(&q(1, 3), Rounding::AwayFromZero),
            next_up(1.0 / 3.0)
        );
        assert_eq!(rational_to_f64(&q(-1, 3), Rounding::Nearest), -1.0 / 3.0);
        // Ties to even at 2^53 + 1 and 2^53 + 3.
        let two53 = 1i64 << 53;
        assert_eq!(
            rational_to_f64(&q(two53 + 1, 1), Rounding::Nearest),
            two53 as f64
        );
        assert_eq!(
            rational_to_f64(&q(two53 + 3, 1), Rounding::Nearest),
            (two53 + 4) as f64
        );
        assert_eq!(
            rational_to_f64(&q(two53 + 1, 1), Rounding::AwayFromZero),
            (two53 + 2) as f64
        );
        // Subnormal results: 3·2^-1076 is 0.75 of the smallest subnormal.
        let tiny = BigRational::new(BigInt::from(3), BigInt::one() << 1076usize);
        assert_eq!(rational_to_f64(&tiny, Rounding::Nearest), 5e-324);
        let below_half = BigRational::new(BigInt::one(), BigInt::one() << 1076usize);
        assert_eq!(rational_to_f64(&below_half, Rounding::Nearest), 0.0);
        assert_eq!(rational_to_f64(&below_half, Rounding::AwayFromZero), 5e-324);
        // Overflow.
        let huge = BigRational::from_integer(BigInt::one() << 1024usize);
        assert_eq!(rational_to_f64(&huge, Rounding::Nearest), f64::INFINITY);
        assert_eq!(grid_to_f64(&(-(BigInt::one() << 2000usize)), 0), f64::MIN);
        assert_eq!(f64_at_least(&huge), None);
    }

    #[test]
    fn floor_log2_is_exact() {
        assert_eq!(floor_log2(&q(1, 1)), 0);
        assert_eq!(floor_log2(&q(3, 1)), 1);
        assert_eq!(floor_log2(&q(4, 1)), 2);
        assert_eq!(floor_log2(&q(1, 3)), -2);
        assert_eq!(floor_log2(&q(1, 4)), -2);
        assert_eq!(floor_log2(&q(5, 16)), -2);
        assert_eq!(floor_log2(&q(7, 2)), 1);
    }

    #[test]
    fn round_to_grid_is_nearest_with_ties_to_even() {
        assert_eq!(round_to_grid(&q(5, 2), 0), BigInt::from(2));
        assert_eq!(round_to_grid(&q(7, 2), 0), BigInt::from(4));
        assert_eq!(round_to_grid(&q(-5, 2), 0), BigInt::from(-2));
        assert_eq!(round_to_grid(&q(-7, 3), 0), BigInt::from(-2));
        assert_eq!(round_to_grid(&q(1, 3), -2), BigInt::from(1)); // 1/3 ≈ 1.33 quarters
        assert_eq!(round_to_grid(&q(13, 1), 2), BigInt::from(3)); // 13 ≈ 3.25 fours
        assert_eq!(round_to_grid(&q(0, 1), -40), BigInt::zero());
    }

    #[test]
    fn numeric_text_is_parsed_exactly() {
        let parse = |s: &str| parse_numeric_exact(s).expect(s);
        assert_eq!(parse("-1234.5600"), q(-123456, 100));
        assert_eq!(parse("0"), q(0, 1));
        assert_eq!(parse("0.00"), q(0, 1));
        assert_eq!(parse("-0"), q(0, 1));
        assert_eq!(parse("+.5"), q(1, 2));
        assert_eq!(parse("12."), q(12, 1));
        assert_eq!(parse("1e3"), q(1000, 1));
        assert_eq!(parse("-2.5E-7"), q(-25, 100_000_000));
        assert_eq!(parse("0.1"), q(1, 10));
        let many = "123456789012345678901234567890.123456789012345678901234567890";
        let expected = BigRational::new(
            BigInt::parse_bytes(
                b"123456789012345678901234567890123456789012345678901234567890",
                10,
            )
            .expect("digits"),
            BigInt::from(10).pow(30u32),
        );
        assert_eq!(parse(many), expected);
        for bad in [
            "",
            "-",
            "+",
            ".",
            "-.",
            "1.2.3",
            "abc",
            "NaN",
            "Infinity",
            "-Infinity",
            " 1",
            "1 ",
            "1e",
            "1e+",
            "--1",
            "1e99999",
            "0x10",
            "1_000",
        ] {
            let err = parse_numeric_exact(bad).expect_err(bad);
            assert!(matches!(err, Error::Internal { .. }), "{bad}");
            if let Error::Internal { detail } = err {
                assert!(
                    bad.is_empty() || !detail.contains(bad),
                    "the message must not echo the text"
                );
            }
        }
    }
}
