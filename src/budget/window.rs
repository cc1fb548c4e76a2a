//! Renewal windows: the calendar window (UTC) of a budget with a `period`, as a pure function of
//! one instant read from the ledger's clock. No I/O; the ledger supplies the instant.
//!
//! Invariants:
//! - Windows are fixed in advance and depend only on the instant: a day is [00:00, 24:00) UTC, a
//!   week [Monday 00:00, next Monday 00:00) UTC (ISO 8601 weeks), a month [1st 00:00, next 1st
//!   00:00) UTC. Consecutive windows of a period tile time without gap or overlap, so every
//!   charge falls in exactly one window of each period.
//! - Instants are whole microseconds since 1970-01-01 00:00:00 UTC (PostgreSQL's resolution),
//!   in the years 1 to 9999 that [`INSTANT_MIN_US`] and [`INSTANT_MAX_US`] bound.

use std::fmt;

use crate::policy::Period;

/// Microseconds in a day.
const DAY_US: i64 = 86_400_000_000;

/// Days from 0000-03-01 to 1970-01-01 in Hinnant's day count.
const DAYS_0000_03_01_TO_1970: i64 = 719_468;

/// 0001-01-01 00:00:00 UTC, the earliest instant a window is computed for.
pub const INSTANT_MIN_US: i64 = -62_135_596_800_000_000;

/// 9999-12-01 00:00:00 UTC: the last window of any period ends by 10000-01-01.
pub const INSTANT_MAX_US: i64 = 253_399_622_400_000_000;

/// One window of a renewing budget: `[start, end)` in microseconds since the Unix epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Window {
    /// The period the window belongs to.
    pub period: Period,
    /// Its first instant.
    pub start_us: i64,
    /// The first instant of the next window.
    pub end_us: i64,
}

/// A date in the proleptic Gregorian calendar (Hinnant's civil-from-days).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + DAYS_0000_03_01_TO_1970;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    // In range by construction: day in 1..=31, month in 1..=12.
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(month <= 2), month, day)
}

/// Days since 1970-01-01 of a date (Hinnant's days-from-civil).
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let year = year - i64::from(month <= 2);
    let era = year.div_euclid(400);
    let yoe = year - era * 400;
    let mp = (i64::from(month) + 9) % 12;
    let doy = (153 * mp + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - DAYS_0000_03_01_TO_1970
}

impl Window {
    /// The window of `period` that contains `at_us` (clamped into
    /// [[`INSTANT_MIN_US`], [`INSTANT_MAX_US`]]).
    pub fn containing(period: Period, at_us: i64) -> Window {
        let at_us = at_us.clamp(INSTANT_MIN_US, INSTANT_MAX_US);
        let day = at_us.div_euclid(DAY_US);
        let (start_day, end_day) = match period {
            Period::Day => (day, day + 1),
            Period::Week => {
                // 1970-01-01 was a Thursday: Monday is day 4 (mod 7) of the epoch's count.
                let monday = day - (day + 3).rem_euclid(7);
                (monday, monday + 7)
            }
            Period::Month => {
                let (year, month, _) = civil_from_days(day);
                let (next_year, next_month) = if month == 12 {
                    (year + 1, 1)
                } else {
                    (year, month + 1)
                };
                (
                    days_from_civil(year, month, 1),
                    days_from_civil(next_year, next_month, 1),
                )
            }
        };
        Window {
            period,
            start_us: start_day * DAY_US,
            end_us: end_day * DAY_US,
        }
    }

    /// Whether `at_us` lies in the window.
    pub fn contains(&self, at_us: i64) -> bool {
        self.start_us <= at_us && at_us < self.end_us
    }

    /// The window's start as a PostgreSQL `timestamptz` literal (`2026-11-23 00:00:00+00`):
    /// windows start at midnight UTC.
    pub fn start_literal(&self) -> String {
        format!("{} 00:00:00+00", date_text(self.start_us))
    }

    /// The window's end as a PostgreSQL `timestamptz` literal.
    pub fn end_literal(&self) -> String {
        format!("{} 00:00:00+00", date_text(self.end_us))
    }

    /// When the window ends, for messages: `2026-11-25 00:00 UTC`.
    pub fn until(&self) -> String {
        format!("{} 00:00 UTC", date_text(self.end_us))
    }

    /// When the window ends in UTC ISO 8601, as `pgdp budget` prints times:
    /// `2026-11-25T00:00:00Z`.
    pub fn end_iso8601(&self) -> String {
        format!("{}T00:00:00Z", date_text(self.end_us))
    }
}

/// `this day (until 2026-11-25 00:00 UTC)`: what NOTICEs and `SHOW pgdp.budget` say of the
/// window a balance covers.
impl fmt::Display for Window {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "this {} (until {})", self.period.name(), self.until())
    }
}

/// `YYYY-MM-DD` of the day holding `at_us`.
fn date_text(at_us: i64) -> String {
    let (year, month, day) = civil_from_days(at_us.div_euclid(DAY_US));
    format!("{year:04}-{month:02}-{day:02}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Microseconds of `YYYY-MM-DD` at `h:m:s` UTC.
    fn at(date: &str, h: i64, m: i64, s: i64) -> i64 {
        let parts: Vec<i64> = date
            .split('-')
            .map(|p| p.parse().expect("a number"))
            .collect();
        let day = days_from_civil(parts[0], parts[1] as u32, parts[2] as u32);
        day * DAY_US + ((h * 60 + m) * 60 + s) * 1_000_000
    }

    #[test]
    fn days_start_at_midnight_utc() {
        let w = Window::containing(Period::Day, at("2026-11-24", 3, 14, 0));
        assert_eq!(w.start_us, at("2026-11-24", 0, 0, 0));
        assert_eq!(w.end_us, at("2026-11-25", 0, 0, 0));
        assert_eq!(w.to_string(), "this day (until 2026-11-25 00:00 UTC)");
        assert_eq!(w.start_literal(), "2026-11-24 00:00:00+00");
        assert_eq!(w.end_iso8601(), "2026-11-25T00:00:00Z");
        // The last microsecond of a day is in it; the next one is not.
        let last = at("2026-11-25", 0, 0, 0) - 1;
        assert!(w.contains(last));
        assert!(!w.contains(last + 1));
        assert_eq!(Window::containing(Period::Day, last + 1).start_us, last + 1);
    }

    #[test]
    fn weeks_are_iso_weeks_from_monday() {
        // 2026-11-24 is a Tuesday; its ISO week starts Monday 2026-11-23.
        let w = Window::containing(Period::Week, at("2026-11-24", 12, 0, 0));
        assert_eq!(w.start_us, at("2026-11-23", 0, 0, 0));
        assert_eq!(w.end_us, at("2026-11-30", 0, 0, 0));
        // Sunday 23:59:59 belongs to the week that started the Monday before.
        let sunday = Window::containing(Period::Week, at("2026-11-29", 23, 59, 59));
        assert_eq!(sunday, w);
        assert_eq!(
            Window::containing(Period::Week, at("2026-11-30", 0, 0, 0)).start_us,
            at("2026-11-30", 0, 0, 0)
        );
        // The epoch was a Thursday: its week started Monday 1969-12-29.
        assert_eq!(
            Window::containing(Period::Week, 0).start_us,
            at("1969-12-29", 0, 0, 0)
        );
    }

    #[test]
    fn months_start_on_the_first_and_cross_years_and_leap_days() {
        let dec = Window::containing(Period::Month, at("2026-12-31", 23, 0, 0));
        assert_eq!(dec.start_us, at("2026-12-01", 0, 0, 0));
        assert_eq!(dec.end_us, at("2027-01-01", 0, 0, 0));
        let feb = Window::containing(Period::Month, at("2028-02-29", 1, 0, 0));
        assert_eq!(feb.end_us, at("2028-03-01", 0, 0, 0));
        assert_eq!(feb.until(), "2028-03-01 00:00 UTC");
        let feb = Window::containing(Period::Month, at("2100-02-15", 0, 0, 0));
        assert_eq!(feb.end_us - feb.start_us, 28 * DAY_US);
    }

    /// Windows of each period tile time: the window after a window starts where it ends, and
    /// every instant of a range falls in exactly the window that contains it.
    #[test]
    fn windows_tile_time_without_gaps() {
        for period in [Period::Day, Period::Week, Period::Month] {
            let mut w = Window::containing(period, at("1999-12-20", 0, 0, 0));
            for _ in 0..500 {
                let next = Window::containing(period, w.end_us);
                assert_eq!(next.start_us, w.end_us, "{period:?}");
                assert!(next.end_us > next.start_us);
                assert_eq!(Window::containing(period, w.end_us - 1), w);
                w = next;
            }
        }
        // Instants are clamped into the years 1 to 9999.
        let far = Window::containing(Period::Month, i64::MAX);
        assert_eq!(far.end_literal(), "10000-01-01 00:00:00+00");
    }
}
