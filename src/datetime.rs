//! The one place pgdp reads and writes calendar dates and timestamps as text.
//!
//! pgdp never computes with dates: the upstream does. It needs to know only whether a literal is a
//! date or timestamp the upstream will accept (so a bad literal is refused before any charge,
//! instead of failing on the upstream after it), and how to print a binary `date` parameter
//! (days since 2000-01-01) in PostgreSQL's ISO form. Pure functions; no I/O.

use std::fmt;

/// A proleptic Gregorian calendar date in the years 1 to 9999, the range pgdp accepts in
/// literals (PostgreSQL's own range is wider, so every date accepted here is accepted there).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Date {
    year: i64,
    month: u32,
    day: u32,
}

/// Days from 0000-03-01 to 2000-01-01 in Hinnant's day count, and from 1970-01-01 to 2000-01-01.
const DAYS_0000_03_01_TO_1970: i64 = 719_468;
const DAYS_1970_TO_2000: i64 = 10_957;

fn days_in_month(year: i64, month: u32) -> Option<u32> {
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    Some(match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if leap => 29,
        2 => 28,
        _ => return None,
    })
}

impl Date {
    /// Reads `YYYY-MM-DD` (surrounding blanks allowed), or `None` if it is not a calendar date
    /// in the years 1 to 9999.
    pub fn parse(text: &str) -> Option<Date> {
        let mut parts = text.trim().split('-');
        let (y, m, d) = (parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() {
            return None;
        }
        let (year, month, day): (u32, u32, u32) =
            (y.parse().ok()?, m.parse().ok()?, d.parse().ok()?);
        let year = i64::from(year);
        let last = days_in_month(year, month)?;
        ((1..=9999).contains(&year) && (1..=last).contains(&day)).then_some(Date {
            year,
            month,
            day,
        })
    }

    /// The date `days` after 2000-01-01 (before it when negative): PostgreSQL's binary `date`.
    /// Hinnant's civil-from-days, exact for every `i32`.
    pub fn from_days_since_2000(days: i32) -> Date {
        let z = i64::from(days) + DAYS_1970_TO_2000 + DAYS_0000_03_01_TO_1970;
        let era = z.div_euclid(146_097);
        let doe = z - era * 146_097;
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        // Both casts are in range by construction: day in 1..=31, month in 1..=12.
        let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
        let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
        let year = yoe + era * 400 + i64::from(month <= 2);
        Date { year, month, day }
    }
}

impl Date {
    /// Days from 2000-01-01 to this date (negative before it): the inverse of
    /// [`Date::from_days_since_2000`], Hinnant's days-from-civil.
    pub fn days_since_2000(&self) -> i64 {
        let month = i64::from(self.month);
        let year = self.year - i64::from(self.month <= 2);
        let era = year.div_euclid(400);
        let yoe = year - era * 400;
        let mp = (month + 9) % 12;
        let doy = (153 * mp + 2) / 5 + i64::from(self.day) - 1;
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
        era * 146_097 + doe - DAYS_0000_03_01_TO_1970 - DAYS_1970_TO_2000
    }
}

/// Microseconds in a day.
const MICROS_PER_DAY: i64 = 86_400_000_000;

/// Reads a timestamp as PostgreSQL prints it with `DateStyle` ISO —
/// `YYYY-MM-DD HH:MM:SS[.ffffff][±HH[:MM[:SS]]]` — as microseconds since 2000-01-01 00:00:00
/// (PostgreSQL's binary `timestamp`), and, when `with_zone`, minus the printed offset (its
/// binary `timestamptz`, in UTC). `None` for any other form, or an offset where none belongs.
pub fn timestamp_micros(text: &str, with_zone: bool) -> Option<i64> {
    let text = text.trim();
    let date = Date::parse(text.get(..10)?)?;
    let rest = text.get(10..)?;
    let rest = rest.strip_prefix([' ', 'T'])?;
    // The time of day, up to an offset sign.
    let zone_at = rest.find(['+', '-']).unwrap_or(rest.len());
    let (time, zone) = rest.split_at(zone_at);
    let mut hms = time.split(':');
    let hours: i64 = hms.next()?.parse().ok()?;
    let minutes: i64 = hms.next()?.parse().ok()?;
    let seconds = hms.next()?;
    if hms.next().is_some() || !(0..=24).contains(&hours) || !(0..60).contains(&minutes) {
        return None;
    }
    let (whole, fraction) = seconds.split_once('.').unwrap_or((seconds, ""));
    let whole: i64 = whole.parse().ok()?;
    if !(0..=60).contains(&whole)
        || fraction.len() > 6
        || !fraction.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let micros: i64 = format!("{fraction:0<6}").parse().ok()?;
    let mut total = date.days_since_2000() * MICROS_PER_DAY
        + ((hours * 60 + minutes) * 60 + whole) * 1_000_000
        + micros;
    match (zone.is_empty(), with_zone) {
        (true, false) => {}
        (false, true) => {
            let sign = if zone.starts_with('-') { -1 } else { 1 };
            let mut parts = zone.get(1..)?.split(':');
            let mut offset = 0i64;
            for (i, unit) in [3600i64, 60, 1].into_iter().enumerate() {
                match parts.next() {
                    Some(p) if p.len() == 2 && p.bytes().all(|b| b.is_ascii_digit()) => {
                        offset += p.parse::<i64>().ok()? * unit;
                    }
                    None if i > 0 => break,
                    _ => return None,
                }
            }
            if parts.next().is_some() {
                return None;
            }
            total -= sign * offset * 1_000_000;
        }
        _ => return None,
    }
    Some(total)
}

/// PostgreSQL's binary `timestamp` (microseconds since 2000-01-01 00:00:00) in the ISO text
/// [`timestamp_micros`] reads back, and, when `with_zone`, its binary `timestamptz` (the same
/// count in UTC) with the offset `+00`. `None` for `infinity` / `-infinity` (`i64::MAX` /
/// `i64::MIN`) and for instants outside the years 1 to 9999, which pgdp does not accept in
/// literals.
pub fn timestamp_text(micros: i64, with_zone: bool) -> Option<String> {
    if micros == i64::MAX || micros == i64::MIN {
        return None;
    }
    let days = i32::try_from(micros.div_euclid(MICROS_PER_DAY)).ok()?;
    let date = Date::from_days_since_2000(days);
    if !(1..=9999).contains(&date.year) {
        return None;
    }
    let of_day = micros.rem_euclid(MICROS_PER_DAY);
    let (seconds, fraction) = (of_day / 1_000_000, of_day % 1_000_000);
    let mut text = format!(
        "{date} {:02}:{:02}:{:02}",
        seconds / 3600,
        seconds / 60 % 60,
        seconds % 60
    );
    if fraction > 0 {
        text.push_str(format!(".{fraction:06}").trim_end_matches('0'));
    }
    if with_zone {
        text.push_str("+00");
    }
    Some(text)
}

/// Seconds between 1970-01-01 00:00:00 and 2000-01-01 00:00:00 (PostgreSQL's two epochs).
const SECONDS_1970_TO_2000: i64 = 946_684_800;

/// A date `YYYY-MM-DD` (its midnight) or a timestamp as [`timestamp_micros`] reads it, as
/// seconds since 1970-01-01 00:00:00: what `EXTRACT(EPOCH FROM ts)` gives for it. With
/// `with_zone`, an offset may follow the time (`Z` or none is UTC); without, none may.
pub fn epoch_seconds(text: &str, with_zone: bool) -> Option<f64> {
    let text = text.trim();
    let text = if text.len() == 10 {
        format!("{text} 00:00:00")
    } else {
        text.to_string()
    };
    let text = match text.strip_suffix(['Z', 'z']) {
        Some(utc) if with_zone => format!("{utc}+00"),
        Some(_) => return None,
        None => text,
    };
    let has_offset = text.get(10..).is_some_and(|rest| rest.contains(['+', '-']));
    let text = if with_zone && !has_offset {
        format!("{text}+00")
    } else {
        text
    };
    let micros = timestamp_micros(&text, with_zone)?;
    Some((micros as f64) / 1e6 + SECONDS_1970_TO_2000 as f64)
}

impl fmt::Display for Date {
    /// ISO `YYYY-MM-DD`, as PostgreSQL prints a date with `DateStyle` ISO.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:04}-{:02}-{:02}", self.year, self.month, self.day)
    }
}

/// Whether `text` is a timestamp literal pgdp lets through: a [`Date`] in its first ten
/// characters, then only digits, blanks and `:.T+-` (a time of day and an optional zone offset),
/// and a final `Z`.
/// Deliberately narrow: anything else is refused before the upstream could reject it.
pub fn is_timestamp_text(text: &str) -> bool {
    text.get(..10).and_then(Date::parse).is_some()
        && text.get(10..).is_none_or(|rest| {
            // A final `Z` is UTC (ISO 8601, how Grafana and JavaScript write instants).
            let rest = rest.strip_suffix(['Z', 'z']).unwrap_or(rest);
            rest.chars()
                .all(|c| c.is_ascii_digit() || " :.Tt+-".contains(c))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calendar_dates_parse_and_impossible_ones_do_not() {
        assert_eq!(
            Date::parse("2024-02-29").map(|d| d.to_string()),
            Some("2024-02-29".into())
        );
        assert_eq!(
            Date::parse(" 0001-01-01 ").map(|d| d.to_string()),
            Some("0001-01-01".into())
        );
        for bad in [
            "2023-02-29",
            "1900-02-29",
            "2024-13-01",
            "2024-00-10",
            "2024-04-31",
            "0000-01-01",
            "10000-01-01",
            "2024-1",
            "2024-01-01-01",
            "x-01-01",
            "",
        ] {
            assert_eq!(Date::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn binary_dates_print_as_postgresql_does() {
        assert_eq!(Date::from_days_since_2000(0).to_string(), "2000-01-01");
        assert_eq!(Date::from_days_since_2000(-1).to_string(), "1999-12-31");
        assert_eq!(Date::from_days_since_2000(59).to_string(), "2000-02-29");
        assert_eq!(Date::from_days_since_2000(8_766).to_string(), "2024-01-01");
        assert_eq!(
            Date::from_days_since_2000(-730_119).to_string(),
            "0001-01-01"
        );
    }

    #[test]
    fn binary_timestamps_print_as_postgresql_reads_them() {
        // (EXTRACT(EPOCH FROM TIMESTAMP '…') - 946684800) * 1e6 on PostgreSQL 15.
        let cases = [
            (770_560_496_789_000, "2024-06-01 12:34:56.789"),
            (-500_000, "1999-12-31 23:59:59.5"),
            (0, "2000-01-01 00:00:00"),
            (1, "2000-01-01 00:00:00.000001"),
            (-63_082_281_600_000_000, "0001-01-01 00:00:00"),
        ];
        for (micros, text) in cases {
            assert_eq!(timestamp_text(micros, false).as_deref(), Some(text));
            assert_eq!(timestamp_micros(text, false), Some(micros), "{text}");
            let zoned = format!("{text}+00");
            assert_eq!(timestamp_text(micros, true), Some(zoned.clone()));
            assert_eq!(timestamp_micros(&zoned, true), Some(micros), "{zoned}");
        }
        assert_eq!(timestamp_text(i64::MAX, true), None, "infinity");
        assert_eq!(timestamp_text(i64::MIN, false), None, "-infinity");
        assert_eq!(timestamp_text(-63_082_281_600_000_001, false), None, "1 BC");
    }

    #[test]
    fn bounds_read_as_postgresqls_epoch_seconds() {
        // SELECT EXTRACT(EPOCH FROM TIMESTAMP '2020-01-01 00:00:00') → 1577836800
        assert_eq!(epoch_seconds("2020-01-01", false), Some(1_577_836_800.0));
        assert_eq!(
            epoch_seconds("2020-01-01 06:30:15", false),
            Some(1_577_860_215.0)
        );
        assert_eq!(epoch_seconds("2020-01-01 06:00:00+02", false), None);
        // timestamptz: an offset, Z, or none (UTC).
        assert_eq!(
            epoch_seconds("2020-01-01 06:00:00+02", true),
            Some(1_577_851_200.0)
        );
        assert_eq!(
            epoch_seconds("2020-01-01 04:00:00Z", true),
            Some(1_577_851_200.0)
        );
        assert_eq!(
            epoch_seconds("2020-01-01 04:00:00", true),
            Some(1_577_851_200.0)
        );
        assert_eq!(epoch_seconds("1969-12-31", true), Some(-86_400.0));
        assert_eq!(epoch_seconds("2020-13-01", false), None);
        assert_eq!(epoch_seconds("yesterday", true), None);
    }

    #[test]
    fn days_since_2000_inverts_the_binary_date() {
        for days in (-730_119..2_921_000).step_by(991) {
            assert_eq!(
                Date::from_days_since_2000(days).days_since_2000(),
                i64::from(days)
            );
        }
    }

    #[test]
    fn timestamps_read_as_postgresql_binary_micros() {
        assert_eq!(timestamp_micros("2000-01-01 00:00:00", false), Some(0));
        assert_eq!(
            timestamp_micros("2000-01-02 00:00:01.5", false),
            Some(86_401_500_000)
        );
        assert_eq!(
            timestamp_micros("1999-12-31 23:59:59.999999", false),
            Some(-1)
        );
        // 2024-03-01 00:00:00+01 is 2024-02-29 23:00:00 UTC.
        let utc = timestamp_micros("2024-02-29 23:00:00", false).unwrap();
        assert_eq!(timestamp_micros("2024-03-01 00:00:00+01", true), Some(utc));
        assert_eq!(
            timestamp_micros("2024-02-29 18:30:00-04:30", true),
            Some(utc)
        );
        assert_eq!(timestamp_micros("2024-03-01 00:00:00+01", false), None);
        assert_eq!(timestamp_micros("2024-03-01 00:00:00", true), None);
        for bad in [
            "2024-03-01",
            "2024-03-01 25:00:00",
            "2024-03-01 10:61:00",
            "x",
            "2024-03-01 10:00:00.1234567",
        ] {
            assert_eq!(timestamp_micros(bad, false), None, "{bad}");
        }
    }

    #[test]
    fn every_printed_date_parses_back() {
        for days in (-730_119..2_921_000).step_by(997) {
            let date = Date::from_days_since_2000(days);
            assert_eq!(Date::parse(&date.to_string()), Some(date), "{days}");
        }
    }

    #[test]
    fn timestamps_need_a_valid_date_and_a_plain_time() {
        assert!(is_timestamp_text("2024-06-01"));
        assert!(is_timestamp_text("2024-06-01 12:30:00.5+02"));
        assert!(is_timestamp_text("2024-06-01T12:30:00"));
        assert!(is_timestamp_text("2023-01-01T00:00:00Z"));
        assert!(!is_timestamp_text("2023-01-01 Z00"));
        assert!(!is_timestamp_text("2024-02-30 00:00"));
        assert!(!is_timestamp_text("2024-06-01 noon"));
        assert!(!is_timestamp_text("today"));
    }
}
