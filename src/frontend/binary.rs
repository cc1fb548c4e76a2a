//! PostgreSQL's binary formats of the released types that neither pgwire nor postgres-types
//! encode from pgdp's cells: `numeric` from its decimal text, `date` and `timestamp[tz]` from
//! PostgreSQL's ISO text (as the upstream printed the key). Pure functions; no I/O.

use bytes::BytesMut;
use pgwire::types::format::FormatOptions;
use pgwire::types::ToSqlText;
use tokio_postgres::types::{to_sql_checked, IsNull, ToSql, Type};

/// Base of `numeric`'s digits, and decimal digits per base digit.
const NUMERIC_BASE_DIGITS: usize = 4;
/// Sign words of the binary `numeric`.
const NUMERIC_POSITIVE: u16 = 0x0000;
const NUMERIC_NEGATIVE: u16 = 0x4000;

/// The binary `numeric` of a plain decimal (`-12.3400`, `0.0000001`; no exponent, no NaN):
/// digit count, weight, sign and display scale, then base-10000 digits. `None` for any other
/// text.
pub(super) fn numeric(text: &str) -> Option<Vec<u8>> {
    let (negative, unsigned) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (integer, fraction) = unsigned.split_once('.').unwrap_or((unsigned, ""));
    if (integer.is_empty() && fraction.is_empty())
        || !integer
            .bytes()
            .chain(fraction.bytes())
            .all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let scale = i16::try_from(fraction.len()).ok()?;
    let integer = integer.trim_start_matches('0');
    // Align both parts on base-10000 groups around the decimal point.
    let left_pad =
        (NUMERIC_BASE_DIGITS - integer.len() % NUMERIC_BASE_DIGITS) % NUMERIC_BASE_DIGITS;
    let right_pad =
        (NUMERIC_BASE_DIGITS - fraction.len() % NUMERIC_BASE_DIGITS) % NUMERIC_BASE_DIGITS;
    let digits: Vec<u8> = std::iter::repeat_n(b'0', left_pad)
        .chain(integer.bytes())
        .chain(fraction.bytes())
        .chain(std::iter::repeat_n(b'0', right_pad))
        .map(|b| b - b'0')
        .collect();
    let mut groups: Vec<i16> = digits
        .chunks(NUMERIC_BASE_DIGITS)
        .map(|c| c.iter().fold(0i16, |acc, d| acc * 10 + i16::from(*d)))
        .collect();
    let mut weight = i16::try_from((left_pad + integer.len()) / NUMERIC_BASE_DIGITS).ok()? - 1;
    let leading = groups.iter().take_while(|g| **g == 0).count();
    groups.drain(..leading);
    weight -= i16::try_from(leading).ok()?;
    while groups.last() == Some(&0) {
        groups.pop();
    }
    if groups.is_empty() {
        weight = 0;
    }
    let sign = if negative && !groups.is_empty() {
        NUMERIC_NEGATIVE
    } else {
        NUMERIC_POSITIVE
    };
    let mut out = Vec::with_capacity(8 + 2 * groups.len());
    out.extend_from_slice(&i16::try_from(groups.len()).ok()?.to_be_bytes());
    out.extend_from_slice(&weight.to_be_bytes());
    out.extend_from_slice(&sign.to_be_bytes());
    out.extend_from_slice(&scale.to_be_bytes());
    for g in groups {
        out.extend_from_slice(&g.to_be_bytes());
    }
    Some(out)
}

/// The decimal text of a binary `numeric` parameter (what asyncpg and psycopg 3 send for a
/// Decimal): PostgreSQL's numeric_out of it, with its display scale. `None` for NaN, ±Infinity
/// or a malformed value.
pub(super) fn numeric_text(bytes: &[u8]) -> Option<String> {
    let word = |i: usize| -> Option<i16> {
        Some(i16::from_be_bytes([
            *bytes.get(2 * i)?,
            *bytes.get(2 * i + 1)?,
        ]))
    };
    let count = usize::try_from(word(0)?).ok()?;
    let (weight, sign, scale) = (i64::from(word(1)?), word(2)? as u16, word(3)?);
    let scale = usize::try_from(scale).ok()?;
    if bytes.len() != 8 + 2 * count || !matches!(sign, NUMERIC_POSITIVE | NUMERIC_NEGATIVE) {
        return None;
    }
    let groups = (0..count)
        .map(|i| word(4 + i).filter(|g| (0..10_000).contains(g)))
        .collect::<Option<Vec<i16>>>()?;
    // The base-10000 digit whose place value is 10000^place.
    let group = |place: i64| -> i16 {
        usize::try_from(weight - place)
            .ok()
            .and_then(|k| groups.get(k).copied())
            .unwrap_or(0)
    };
    let mut integer = String::new();
    for place in (0..=weight.max(0)).rev() {
        integer.push_str(&format!("{:04}", group(place)));
    }
    let integer = match integer.trim_start_matches('0') {
        "" => "0",
        digits => digits,
    };
    let mut fraction = String::new();
    let mut place = -1;
    while fraction.len() < scale {
        fraction.push_str(&format!("{:04}", group(place)));
        place -= 1;
    }
    fraction.truncate(scale);
    let zero = integer == "0" && fraction.bytes().all(|b| b == b'0');
    let mut text = String::new();
    if sign == NUMERIC_NEGATIVE && !zero {
        text.push('-');
    }
    text.push_str(integer);
    if scale > 0 {
        text.push('.');
        text.push_str(&fraction);
    }
    Some(text)
}

/// The binary `date` (days since 2000-01-01) of `YYYY-MM-DD`.
pub(super) fn date(text: &str) -> Option<Vec<u8>> {
    let days = crate::datetime::Date::parse(text)?.days_since_2000();
    Some(i32::try_from(days).ok()?.to_be_bytes().to_vec())
}

/// The binary `timestamp` (`with_zone`: `timestamptz`, in UTC) of PostgreSQL's ISO text.
pub(super) fn timestamp(text: &str, with_zone: bool) -> Option<Vec<u8>> {
    Some(
        crate::datetime::timestamp_micros(text, with_zone)?
            .to_be_bytes()
            .to_vec(),
    )
}

/// A value already in its wire form, for either format.
#[derive(Debug)]
pub(super) enum Encoded {
    /// PostgreSQL's text output.
    Text(String),
    /// The binary format's bytes.
    Binary(Vec<u8>),
}

impl ToSql for Encoded {
    fn to_sql(
        &self,
        _ty: &Type,
        out: &mut BytesMut,
    ) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        match self {
            Encoded::Text(t) => out.extend_from_slice(t.as_bytes()),
            Encoded::Binary(b) => out.extend_from_slice(b),
        }
        Ok(IsNull::No)
    }

    fn accepts(_ty: &Type) -> bool {
        true
    }

    to_sql_checked!();
}

impl ToSqlText for Encoded {
    fn to_sql_text(
        &self,
        ty: &Type,
        out: &mut BytesMut,
        _options: &FormatOptions,
    ) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        self.to_sql(ty, out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(b: &[u8]) -> Vec<i16> {
        b.chunks(2)
            .map(|c| i16::from_be_bytes([c[0], c[1]]))
            .collect()
    }

    #[test]
    fn numerics_encode_as_postgresql_does() {
        // ndigits, weight, sign, dscale, digits… (checked against numeric_send).
        assert_eq!(words(&numeric("0").unwrap()), [0, 0, 0, 0]);
        assert_eq!(words(&numeric("12.34").unwrap()), [2, 0, 0, 2, 12, 3400]);
        assert_eq!(
            words(&numeric("-12.34").unwrap()),
            [2, 0, 0x4000, 2, 12, 3400]
        );
        assert_eq!(
            words(&numeric("123456.5").unwrap()),
            [3, 1, 0, 1, 12, 3456, 5000]
        );
        assert_eq!(words(&numeric("0.0000001").unwrap()), [1, -2, 0, 7, 10]);
        assert_eq!(words(&numeric("10000").unwrap()), [1, 1, 0, 0, 1]);
        assert_eq!(words(&numeric("0.00").unwrap()), [0, 0, 0, 2]);
        assert_eq!(words(&numeric("-0.0").unwrap()), [0, 0, 0, 1]);
        for bad in ["", "-", "1e5", "NaN", "1.2.3", " 1"] {
            assert_eq!(numeric(bad), None, "{bad}");
        }
    }

    #[test]
    fn binary_numerics_decode_to_their_decimal_text() {
        for text in [
            "0",
            "12.34",
            "-12.34",
            "123456.5",
            "0.0000001",
            "10000",
            "0.00",
            "250000",
            "-0.5",
            "99999999.99990",
            "1.000000001",
        ] {
            assert_eq!(numeric_text(&numeric(text).unwrap()).as_deref(), Some(text));
        }
        // Words as numeric_send writes them: 1e-7 with display scale 7; -12.34.
        let bytes = |w: &[i16]| w.iter().flat_map(|x| x.to_be_bytes()).collect::<Vec<u8>>();
        assert_eq!(
            numeric_text(&bytes(&[1, -2, 0, 7, 10])).as_deref(),
            Some("0.0000001")
        );
        assert_eq!(
            numeric_text(&bytes(&[1, 1, 0, 0, 1])).as_deref(),
            Some("10000")
        );
        // NaN, +Infinity, a digit out of range, a short message.
        for bad in [
            bytes(&[0, 0, 0xC000u16 as i16, 0]),
            bytes(&[0, 0, 0xD000u16 as i16, 0]),
            bytes(&[1, 0, 0, 0, 10_000]),
            bytes(&[2, 0, 0, 0, 1]),
        ] {
            assert_eq!(numeric_text(&bad), None);
        }
    }

    #[test]
    fn dates_and_timestamps_encode_as_postgresql_does() {
        assert_eq!(date("2000-01-02").unwrap(), 1i32.to_be_bytes());
        assert_eq!(date("1999-12-31").unwrap(), (-1i32).to_be_bytes());
        assert_eq!(
            timestamp("2000-01-01 00:00:01", false).unwrap(),
            1_000_000i64.to_be_bytes()
        );
        assert_eq!(
            timestamp("2000-01-01 01:00:00+01", true).unwrap(),
            0i64.to_be_bytes()
        );
    }
}
