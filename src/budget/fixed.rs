//! [`Fixed`]: an exact, non-negative fixed-point quantity for privacy parameters (ε, δ, ρ).
//!
//! Invariants:
//! - A `Fixed` is a whole number of 10⁻¹⁸ units held in a `u128`; it is never negative, never
//!   NaN, and its arithmetic is exact (checked, or saturating where documented). No budget sum is
//!   ever accumulated in floating point.
//! - Decimal text round-trips exactly: `Fixed::from_decimal_str(&x.to_string()) == Ok(x)`, and
//!   the text is what PostgreSQL's `numeric` input accepts and its output produces (plain
//!   decimal, no exponent), so values cross the ledger as text without loss.
//! - Conversions that cannot be exact say which way they round: [`Fixed::from_f64_ceil`] for
//!   costs (never in the analyst's favour), [`Fixed::from_f64_floor`] for budgets.

use std::fmt;
use std::ops::Add;

/// Number of decimal places a [`Fixed`] holds.
const SCALE_DIGITS: usize = 18;

/// 10^18, the number of units in 1.
const UNITS_PER_ONE: u128 = 1_000_000_000_000_000_000;

/// Largest exponent magnitude the parser keeps track of; anything beyond is certainly out of
/// range (too large or too precise), so clamping there keeps the arithmetic in `i64`.
const EXPONENT_ABS_MAX: i64 = 1_000_000;

/// An exact non-negative decimal with 18 places (a count of 10⁻¹⁸ units), used for every privacy
/// parameter pgdp adds up.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Fixed(u128);

/// Why a text or `f64` value is not a [`Fixed`]. The messages are lowercase fragments meant to
/// follow a path, e.g. `analysts.alice.epsilon: has more than 18 decimal places`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FixedError {
    /// Not a decimal number (`"abc"`, `""`, `"1..2"`).
    #[error("is not a decimal number")]
    Malformed,
    /// Below zero.
    #[error("must not be negative")]
    Negative,
    /// NaN or infinite.
    #[error("must be finite")]
    NotFinite,
    /// Needs more than 18 decimal places to be represented exactly.
    #[error("has more than 18 decimal places")]
    TooPrecise,
    /// Larger than the largest representable value (about 3.4·10²⁰).
    #[error("is too large")]
    TooLarge,
}

/// Which way an inexact conversion goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Rounding {
    /// Refuse anything that is not exactly on the grid.
    Exact,
    /// Round up to the next grid point.
    Up,
    /// Round down to the previous grid point.
    Down,
}

impl Fixed {
    /// Zero.
    pub const ZERO: Fixed = Fixed(0);

    /// One.
    pub const ONE: Fixed = Fixed(UNITS_PER_ONE);

    /// The smallest positive value, 10⁻¹⁸.
    pub const EPSILON_UNIT: Fixed = Fixed(1);

    /// The largest value (about 3.4·10²⁰).
    pub const MAX: Fixed = Fixed(u128::MAX);

    /// The number of decimal places.
    pub const SCALE_DIGITS: u32 = SCALE_DIGITS as u32;

    /// The value `units · 10⁻¹⁸`.
    pub const fn from_units(units: u128) -> Fixed {
        Fixed(units)
    }

    /// The number of 10⁻¹⁸ units.
    pub const fn units(self) -> u128 {
        self.0
    }

    /// An integer value.
    pub const fn from_integer(n: u64) -> Fixed {
        // u64::MAX · 10^18 < 2^64 · 2^60 = 2^124, so this cannot overflow.
        Fixed(n as u128 * UNITS_PER_ONE)
    }

    /// Whether this is zero.
    pub const fn is_zero(self) -> bool {
        self.0 == 0
    }

    /// Parses decimal text exactly: `"0.1"`, `"10"`, `"+2.50"`, `".5"`, `"1e-5"`, `"1.5E+2"`.
    /// Leading and trailing ASCII whitespace is ignored; `"-0"` is zero. Text that needs more
    /// than 18 decimal places is refused ([`FixedError::TooPrecise`]) rather than rounded.
    pub fn from_decimal_str(text: &str) -> Result<Fixed, FixedError> {
        parse(text, Rounding::Exact)
    }

    /// Parses PostgreSQL `numeric` output exactly. PostgreSQL pads to the column's scale, so
    /// trailing zeros beyond 18 places are accepted; `NaN` and infinities are refused.
    pub fn from_numeric_text(text: &str) -> Result<Fixed, FixedError> {
        match text.trim() {
            "NaN" | "Infinity" | "-Infinity" => Err(FixedError::NotFinite),
            other => parse(other, Rounding::Exact),
        }
    }

    /// The text to send to PostgreSQL as a `numeric` (the same as [`fmt::Display`]).
    pub fn to_numeric_text(self) -> String {
        self.to_string()
    }

    /// Converts an `f64` through its shortest decimal representation (`format!("{}", x)`), so
    /// `0.1` becomes exactly 0.1. Refuses values that need more than 18 decimal places; use
    /// [`Fixed::from_f64_ceil`] or [`Fixed::from_f64_floor`] to round instead.
    pub fn from_f64(x: f64) -> Result<Fixed, FixedError> {
        from_f64(x, Rounding::Exact)
    }

    /// Like [`Fixed::from_f64`], rounding its shortest decimal representation up to the grid.
    /// Use it for costs, so that rounding never favours the analyst.
    pub fn from_f64_ceil(x: f64) -> Result<Fixed, FixedError> {
        from_f64(x, Rounding::Up)
    }

    /// Like [`Fixed::from_f64`], rounding its shortest decimal representation down to the grid.
    /// Use it for budgets, so that rounding never favours the analyst.
    pub fn from_f64_floor(x: f64) -> Result<Fixed, FixedError> {
        from_f64(x, Rounding::Down)
    }

    /// The nearest `f64`, for display and for the (conservatively rounded) conversions.
    pub fn to_f64(self) -> f64 {
        // Rust's decimal parser is correctly rounded, so going through the exact text gives the
        // nearest f64 with a single rounding.
        self.to_string()
            .parse()
            .expect("Fixed always prints a valid decimal")
    }

    /// An `f64` within a relative 2⁻⁵¹ of this value (two roundings: the units, then the
    /// division), without [`Fixed::to_f64`]'s text: for estimates that are rounded afterwards
    /// with a margin far wider than that ([`Fixed::from_f64_below`]).
    pub fn to_f64_approx(self) -> f64 {
        self.0 as f64 / UNITS_PER_ONE as f64
    }

    /// A value at most `x` and within a relative 2⁻⁴⁸ (and one unit) below it, without
    /// [`Fixed::from_f64_floor`]'s text; zero for a negative, zero or non-finite `x`, and
    /// [`Fixed::MAX`] above it. `x · 10¹⁸` rounds up by at most a relative 2⁻⁵³ (10¹⁸ is an exact
    /// `f64`), truncation only lowers it, and taking 2⁻⁴⁹ of the units off more than undoes
    /// the rounding, so the result never exceeds `x`. For estimates that must not favour the
    /// analyst and need not be on the shortest decimal's grid point.
    pub fn from_f64_below(x: f64) -> Fixed {
        if !x.is_finite() || x <= 0.0 {
            return Fixed::ZERO;
        }
        let scaled = x * UNITS_PER_ONE as f64;
        if scaled >= u128::MAX as f64 {
            return Fixed::MAX;
        }
        let units = scaled as u128;
        Fixed(units - units.div_ceil(1 << 49))
    }

    /// Exact sum, or `None` on overflow.
    pub fn checked_add(self, other: Fixed) -> Option<Fixed> {
        self.0.checked_add(other.0).map(Fixed)
    }

    /// Exact difference, or `None` if it would be negative.
    pub fn checked_sub(self, other: Fixed) -> Option<Fixed> {
        self.0.checked_sub(other.0).map(Fixed)
    }

    /// Exact sum, saturating at [`Fixed::MAX`].
    pub fn saturating_add(self, other: Fixed) -> Fixed {
        Fixed(self.0.saturating_add(other.0))
    }

    /// Exact difference, saturating at zero.
    pub fn saturating_sub(self, other: Fixed) -> Fixed {
        Fixed(self.0.saturating_sub(other.0))
    }

    /// `self · k`, or `None` on overflow.
    pub fn checked_mul_int(self, k: u64) -> Option<Fixed> {
        self.0.checked_mul(u128::from(k)).map(Fixed)
    }

    /// `self · p / q` rounded up to the grid, saturating at [`Fixed::MAX`] (which only ever
    /// refuses more). For the Rényi orders of the accountant, which are small fractions.
    pub fn mul_ratio_ceil(self, p: u32, q: u32) -> Fixed {
        let (p, q) = (u128::from(p), u128::from(q.max(1)));
        match self.0.checked_mul(p) {
            Some(n) => Fixed(n / q + u128::from(n % q != 0)),
            None => Fixed::MAX,
        }
    }

    /// `self · p / q` rounded down to the grid (on overflow, computed as `self / q · p`, still
    /// rounded down, saturating at [`Fixed::MAX`]).
    pub fn mul_ratio_floor(self, p: u32, q: u32) -> Fixed {
        let (p, q) = (u128::from(p), u128::from(q.max(1)));
        match self.0.checked_mul(p) {
            Some(n) => Fixed(n / q),
            None => Fixed((self.0 / q).saturating_mul(p)),
        }
    }

    /// `self² / 2` rounded up to the grid, saturating at [`Fixed::MAX`]: the zCDP ρ of a pure
    /// ε-DP mechanism (Bun & Steinke 2016, Proposition 1.4).
    pub fn half_square_ceil(self) -> Fixed {
        // Exact while self.0² fits in u128 (self < 1.8·10¹); beyond, f64 with a margin.
        match self.0.checked_mul(self.0) {
            Some(square) => {
                let divisor = 2 * UNITS_PER_ONE;
                Fixed(square / divisor + u128::from(square % divisor != 0))
            }
            None => {
                let x = self.to_f64();
                Fixed::from_f64_ceil(x * x / 2.0 * (1.0 + 1e-12)).unwrap_or(Fixed::MAX)
            }
        }
    }

    /// This value rounded down to `digits` significant decimal digits (at least 1), for short
    /// human-readable messages that never overstate what is left.
    pub fn floor_significant(self, digits: u32) -> Fixed {
        let digits = digits.max(1);
        let len = decimal_len(self.0);
        if len <= digits {
            return self;
        }
        let unit = 10u128.pow(len - digits);
        Fixed(self.0 - self.0 % unit)
    }

    /// This value rounded up to `digits` significant decimal digits (at least 1), for short
    /// human-readable messages that never understate a cost.
    pub fn ceil_significant(self, digits: u32) -> Fixed {
        let digits = digits.max(1);
        let len = decimal_len(self.0);
        if len <= digits {
            return self;
        }
        let unit = 10u128.pow(len - digits);
        let down = self.0 - self.0 % unit;
        if down == self.0 {
            self
        } else {
            Fixed(down.saturating_add(unit))
        }
    }
}

/// Number of decimal digits of `n` (1 for zero).
fn decimal_len(mut n: u128) -> u32 {
    let mut len = 1;
    while n >= 10 {
        n /= 10;
        len += 1;
    }
    len
}

impl Add for Fixed {
    type Output = Fixed;

    /// Exact sum, saturating at [`Fixed::MAX`] (about 3.4·10²⁰, far beyond any budget). A
    /// saturated total only ever refuses more, never less.
    fn add(self, other: Fixed) -> Fixed {
        self.saturating_add(other)
    }
}

impl fmt::Display for Fixed {
    /// Plain decimal without exponent or trailing zeros: `0`, `10`, `9.5`, `0.00001`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let int = self.0 / UNITS_PER_ONE;
        let frac = self.0 % UNITS_PER_ONE;
        if frac == 0 {
            return write!(f, "{int}");
        }
        let digits = format!("{frac:0width$}", width = SCALE_DIGITS);
        write!(f, "{int}.{}", digits.trim_end_matches('0'))
    }
}

impl std::str::FromStr for Fixed {
    type Err = FixedError;

    /// Same as [`Fixed::from_decimal_str`].
    fn from_str(text: &str) -> Result<Fixed, FixedError> {
        Fixed::from_decimal_str(text)
    }
}

fn from_f64(x: f64, rounding: Rounding) -> Result<Fixed, FixedError> {
    if !x.is_finite() {
        return Err(FixedError::NotFinite);
    }
    if x == 0.0 {
        return Ok(Fixed::ZERO);
    }
    if x < 0.0 {
        return Err(FixedError::Negative);
    }
    // `Display` for f64 prints the shortest decimal that reads back as the same f64, without an
    // exponent.
    parse(&format!("{x}"), rounding)
}

/// Parses `[+-]digits[.digits][(e|E)[+-]digits]` onto the 10⁻¹⁸ grid.
fn parse(text: &str, rounding: Rounding) -> Result<Fixed, FixedError> {
    let text = text.trim();
    let (negative, unsigned) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    let (mantissa, exponent) = match unsigned.find(['e', 'E']) {
        Some(at) => (&unsigned[..at], parse_exponent(&unsigned[at + 1..])?),
        None => (unsigned, 0),
    };
    let (int_part, frac_part) = match mantissa.find('.') {
        Some(at) => (&mantissa[..at], &mantissa[at + 1..]),
        None => (mantissa, ""),
    };
    let all_digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if int_part.len() + frac_part.len() == 0 || !all_digits(int_part) || !all_digits(frac_part) {
        return Err(FixedError::Malformed);
    }

    // value = digits · 10^exp10, with digits stripped of leading and trailing zeros.
    let joined: String = [int_part, frac_part].concat();
    let significant = joined.trim_start_matches('0');
    let digits = significant.trim_end_matches('0');
    if digits.is_empty() {
        return Ok(Fixed::ZERO);
    }
    if negative {
        return Err(FixedError::Negative);
    }
    let trailing_zeros = (significant.len() - digits.len()) as i64;
    let frac_len = frac_part.len() as i64;
    // The number of places to move `digits` left to land on units (10⁻¹⁸).
    let shift = exponent - frac_len + trailing_zeros + SCALE_DIGITS as i64;

    if shift >= 0 {
        // digits · 10^shift must fit in a u128 (at most 39 decimal digits).
        if digits.len() as i64 + shift > 39 {
            return Err(FixedError::TooLarge);
        }
        let base = digits_to_u128(digits).ok_or(FixedError::TooLarge)?;
        let scale = 10u128
            .checked_pow(shift as u32)
            .ok_or(FixedError::TooLarge)?;
        return base
            .checked_mul(scale)
            .map(Fixed)
            .ok_or(FixedError::TooLarge);
    }

    // Some non-zero digits fall below 10⁻¹⁸ (the last digit is non-zero by construction).
    let dropped = (-shift) as u64;
    let kept = if dropped >= digits.len() as u64 {
        ""
    } else {
        &digits[..digits.len() - dropped as usize]
    };
    if kept.len() > 39 {
        return Err(FixedError::TooLarge);
    }
    let floor = if kept.is_empty() {
        0
    } else {
        digits_to_u128(kept).ok_or(FixedError::TooLarge)?
    };
    match rounding {
        Rounding::Exact => Err(FixedError::TooPrecise),
        Rounding::Down => Ok(Fixed(floor)),
        Rounding::Up => floor.checked_add(1).map(Fixed).ok_or(FixedError::TooLarge),
    }
}

/// Parses an exponent, clamping its magnitude at [`EXPONENT_ABS_MAX`].
fn parse_exponent(text: &str) -> Result<i64, FixedError> {
    let (negative, digits) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(FixedError::Malformed);
    }
    let mut value: i64 = 0;
    for b in digits.bytes() {
        value = (value * 10 + i64::from(b - b'0')).min(EXPONENT_ABS_MAX);
    }
    Ok(if negative { -value } else { value })
}

/// The value of a string of ASCII digits, or `None` if it does not fit.
fn digits_to_u128(digits: &str) -> Option<u128> {
    digits.bytes().try_fold(0u128, |acc, b| {
        acc.checked_mul(10)?.checked_add(u128::from(b - b'0'))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::ChaCha20Rng;
    use rand::{RngExt, SeedableRng};

    fn fx(s: &str) -> Fixed {
        Fixed::from_decimal_str(s).unwrap()
    }

    #[test]
    fn parses_plain_and_exponent_forms() {
        assert_eq!(fx("0.1").units(), 100_000_000_000_000_000);
        assert_eq!(fx("10"), Fixed::from_integer(10));
        assert_eq!(fx("+2.50"), fx("2.5"));
        assert_eq!(fx(".5"), fx("0.5"));
        assert_eq!(fx("5."), fx("5"));
        assert_eq!(fx("1e-5"), fx("0.00001"));
        assert_eq!(fx("1.5E+2"), fx("150"));
        assert_eq!(fx("-0"), Fixed::ZERO);
        assert_eq!(fx("0e999999999999999999999"), Fixed::ZERO);
        assert_eq!(fx(" 1 "), Fixed::ONE);
        assert_eq!(fx("0.000000000000000001"), Fixed::EPSILON_UNIT);
        assert_eq!(fx("1000000000000000000000e-21"), Fixed::ONE);
    }

    #[test]
    fn refuses_what_it_cannot_hold_exactly() {
        use FixedError::*;
        for (text, why) in [
            ("", Malformed),
            ("abc", Malformed),
            ("1..2", Malformed),
            (".", Malformed),
            ("1e", Malformed),
            ("1e+", Malformed),
            ("- 1", Malformed),
            ("0x10", Malformed),
            ("-0.1", Negative),
            ("0.0000000000000000001", TooPrecise),
            ("1e-19", TooPrecise),
            ("1e999999999999", TooLarge),
            ("1e-999999999999", TooPrecise),
            ("400000000000000000000", TooLarge),
        ] {
            assert_eq!(Fixed::from_decimal_str(text), Err(why), "{text:?}");
        }
        assert_eq!(Fixed::from_numeric_text("NaN"), Err(FixedError::NotFinite));
        assert_eq!(Fixed::from_f64(f64::NAN), Err(FixedError::NotFinite));
        assert_eq!(Fixed::from_f64(f64::INFINITY), Err(FixedError::NotFinite));
        assert_eq!(Fixed::from_f64(-0.5), Err(FixedError::Negative));
        assert_eq!(Fixed::from_f64(1e-20), Err(FixedError::TooPrecise));
    }

    #[test]
    fn largest_value_parses_and_prints() {
        let max = Fixed::MAX.to_string();
        assert_eq!(max, "340282366920938463463.374607431768211455");
        assert_eq!(fx(&max), Fixed::MAX);
        assert_eq!(
            Fixed::from_decimal_str("340282366920938463463.374607431768211456"),
            Err(FixedError::TooLarge)
        );
    }

    #[test]
    fn display_is_clean_decimal() {
        assert_eq!(Fixed::ZERO.to_string(), "0");
        assert_eq!(fx("9.50").to_string(), "9.5");
        assert_eq!(fx("1e-5").to_string(), "0.00001");
        assert_eq!(fx("10").to_string(), "10");
        assert_eq!(Fixed::EPSILON_UNIT.to_string(), "0.000000000000000001");
    }

    #[test]
    fn numeric_text_with_padding_is_exact() {
        assert_eq!(
            Fixed::from_numeric_text("0.100000000000000000000000").unwrap(),
            fx("0.1")
        );
        assert_eq!(
            Fixed::from_numeric_text("12.000").unwrap(),
            Fixed::from_integer(12)
        );
        assert_eq!(fx("0.3").to_numeric_text(), "0.3");
    }

    #[test]
    fn fast_conversions_stay_close_and_below() {
        let mut x = 1.0e-17_f64;
        while x < 1.0e19 {
            for y in [x, x * 1.000_000_1, x * 3.7, x * 7.123_456_789] {
                let exact = Fixed::from_f64_floor(y).unwrap();
                let below = Fixed::from_f64_below(y);
                // The shortest decimal's floor is within a unit of the exact value, which
                // from_f64_below never exceeds.
                assert!(below.units() <= exact.units() + 1, "{y}");
                assert!(
                    below.units() + 2 + (exact.units() >> 47) >= exact.units(),
                    "{y}: {below} against {exact}"
                );
                let back = exact.to_f64_approx();
                assert!((back - exact.to_f64()).abs() <= exact.to_f64() * 2.0 * f64::EPSILON);
            }
            x *= 1.9;
        }
        assert_eq!(Fixed::from_f64_below(0.0), Fixed::ZERO);
        assert_eq!(Fixed::from_f64_below(-1.0), Fixed::ZERO);
        assert_eq!(Fixed::from_f64_below(f64::NAN), Fixed::ZERO);
        assert_eq!(Fixed::from_f64_below(f64::INFINITY), Fixed::ZERO);
        assert_eq!(Fixed::from_f64_below(1e300), Fixed::MAX);
        assert!(Fixed::from_f64_below(1.0) < Fixed::ONE);
    }

    #[test]
    fn from_f64_keeps_the_shortest_decimal() {
        assert_eq!(Fixed::from_f64(0.1).unwrap(), fx("0.1"));
        assert_eq!(Fixed::from_f64(1e-5).unwrap(), fx("0.00001"));
        assert_eq!(
            Fixed::from_f64(0.1 + 0.2).unwrap(),
            fx("0.30000000000000004")
        );
        assert_eq!(Fixed::from_f64(-0.0).unwrap(), Fixed::ZERO);
        assert_eq!(Fixed::from_f64_ceil(1e-20).unwrap(), Fixed::EPSILON_UNIT);
        assert_eq!(Fixed::from_f64_floor(1e-20).unwrap(), Fixed::ZERO);
        assert_eq!(
            Fixed::from_f64_ceil(1.2345678901234567e-5).unwrap(),
            fx("0.000012345678901235")
        );
        assert_eq!(
            Fixed::from_f64_floor(1.2345678901234567e-5).unwrap(),
            fx("0.000012345678901234")
        );
        assert_eq!(Fixed::from_f64_ceil(2.0).unwrap(), Fixed::from_integer(2));
        assert_eq!(fx("0.1").to_f64(), 0.1);
    }

    #[test]
    fn exact_sums_have_no_float_drift() {
        let tenth = fx("0.1");
        let mut sum = Fixed::ZERO;
        for _ in 0..10 {
            sum = sum + tenth;
        }
        assert_eq!(sum, Fixed::ONE);
        assert_eq!(Fixed::MAX + Fixed::ONE, Fixed::MAX);
        assert_eq!(Fixed::ONE.checked_add(Fixed::MAX), None);
        assert_eq!(Fixed::ZERO.checked_sub(Fixed::ONE), None);
        assert_eq!(Fixed::ZERO.saturating_sub(Fixed::ONE), Fixed::ZERO);
    }

    #[test]
    fn ceil_significant_never_rounds_down() {
        let x = Fixed::from_f64_ceil(0.000253557949540744).unwrap();
        assert_eq!(x.ceil_significant(6).to_string(), "0.000253558");
        assert_eq!(x.ceil_significant(3).to_string(), "0.000254");
        assert!(x.ceil_significant(3) >= x);
        assert_eq!(Fixed::ONE.ceil_significant(3), Fixed::ONE);
        assert_eq!(Fixed::ZERO.ceil_significant(3), Fixed::ZERO);
    }

    #[test]
    fn floor_significant_never_rounds_up() {
        assert_eq!(fx("0.123456789").floor_significant(3), fx("0.123"));
        assert_eq!(fx("9.999").floor_significant(2), fx("9.9"));
        assert_eq!(fx("10").floor_significant(6), fx("10"));
        assert_eq!(Fixed::ZERO.floor_significant(0), Fixed::ZERO);
    }

    #[test]
    fn decimal_text_round_trips_exactly() {
        let mut rng = ChaCha20Rng::seed_from_u64(0x5eed_f1c5);
        for _ in 0..20_000 {
            // Mix magnitudes: tiny δ-like values, ordinary ε, and huge ones.
            let units: u128 = match rng.random_range(0..4u8) {
                0 => rng.random_range(0..1_000_000u128),
                1 => rng.random_range(0..100 * UNITS_PER_ONE),
                2 => rng.random_range(0..u128::MAX),
                _ => {
                    u128::from(rng.random_range(0..1000u32))
                        * 10u128.pow(rng.random_range(0..19u32))
                }
            };
            let x = Fixed::from_units(units);
            let text = x.to_string();
            assert_eq!(Fixed::from_decimal_str(&text), Ok(x), "{text}");
            if text.contains('.') {
                // PostgreSQL pads numeric output to the column's scale.
                assert_eq!(
                    Fixed::from_numeric_text(&format!("{text}000")),
                    Ok(x),
                    "{text}"
                );
            }
            // Exponent form of the same value.
            let sci = format!("{}e-18", x.units());
            assert_eq!(Fixed::from_decimal_str(&sci), Ok(x), "{sci}");
            // f64 round trip: through the shortest representation, f64 → Fixed → f64 is the identity.
            let f = x.to_f64();
            if let Ok(back) = Fixed::from_f64_floor(f) {
                assert_eq!(back.to_f64(), f, "{text}");
            }
        }
    }
}
