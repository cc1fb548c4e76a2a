//! The release schedule: a DP answer leaves pgdp only at one of a fixed, public set of times after
//! its statement started, so its response time tells an analyst only which point it waited for.
//!
//! The points are geometric above a floor, `floor, ⌈floor·r⌉, ⌈floor·r²⌉, …` milliseconds
//! after the statement started (each at least one millisecond after the one before), and depend
//! on the policy alone, never on data. An answer whose work ends at `t` is held until the first
//! point `≥ t`. The number of points an answer can land on before [`ReleaseSchedule::horizon`]
//! bounds what timing reveals about one query: at most `log2(points)` bits
//! ([`ReleaseSchedule::bits_per_query`]), against an unbounded number without it. What it costs
//! is latency: an answer waits for at most the floor, or a factor `r` of its own time.
//!
//! Invariants (checked by `validate`): `1 ≤ floor_ms ≤` [`limits::STATEMENT_TIMEOUT_MS`],
//! `ratio` finite within [`limits::RELEASE_SCHEDULE_RATIO_MIN`] ..=
//! [`limits::RELEASE_SCHEDULE_RATIO_MAX`], and at most [`limits::RELEASE_SCHEDULE_POINTS_MAX`]
//! points up to the horizon.

use std::time::Duration;

use crate::limits;

/// When DP answers may leave pgdp: `floor_ms · ratio^i` milliseconds after their statement
/// started, for i = 0, 1, 2, …
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReleaseSchedule {
    floor_ms: u64,
    ratio: f64,
}

impl ReleaseSchedule {
    /// A schedule, or what is wrong with the values (for `validate` to put at its key path).
    pub fn new(floor_ms: u64, ratio: f64) -> Result<ReleaseSchedule, String> {
        if !(1..=limits::STATEMENT_TIMEOUT_MS).contains(&floor_ms) {
            return Err(format!(
                "floor_ms must be between 1 and {} (the statement timeout)",
                limits::STATEMENT_TIMEOUT_MS
            ));
        }
        if !ratio.is_finite()
            || !(limits::RELEASE_SCHEDULE_RATIO_MIN..=limits::RELEASE_SCHEDULE_RATIO_MAX)
                .contains(&ratio)
        {
            return Err(format!(
                "ratio must be between {} and {}",
                limits::RELEASE_SCHEDULE_RATIO_MIN,
                limits::RELEASE_SCHEDULE_RATIO_MAX
            ));
        }
        let schedule = ReleaseSchedule { floor_ms, ratio };
        let points = schedule.points_until(Self::horizon());
        if points > limits::RELEASE_SCHEDULE_POINTS_MAX {
            return Err(format!(
                "floor_ms {floor_ms} with ratio {ratio} gives {points} release points within {} s; at most {} are allowed (raise the floor or the ratio)",
                Self::horizon().as_secs(),
                limits::RELEASE_SCHEDULE_POINTS_MAX
            ));
        }
        Ok(schedule)
    }

    /// The first point, in milliseconds.
    pub fn floor_ms(&self) -> u64 {
        self.floor_ms
    }

    /// The factor between consecutive points.
    pub fn ratio(&self) -> f64 {
        self.ratio
    }

    /// The longest a DP statement's work can take short of the unforeseen: the upstream's
    /// statement timeout plus the post-processing timeout. Bits are counted up to it.
    pub fn horizon() -> Duration {
        Duration::from_millis(limits::STATEMENT_TIMEOUT_MS + limits::POST_PROCESSING_TIMEOUT_MS)
    }

    /// The point after `point_ms`: `⌈point·ratio⌉`, at least one millisecond later.
    fn next_ms(&self, point_ms: u64) -> u64 {
        let scaled = (point_ms as f64 * self.ratio).ceil();
        // Past u64's range the schedule has long stopped mattering; saturate.
        let scaled = if scaled >= u64::MAX as f64 {
            u64::MAX
        } else {
            scaled as u64
        };
        scaled.max(point_ms.saturating_add(1))
    }

    /// The first point at or after `elapsed`: when an answer whose work took `elapsed` leaves.
    pub fn release_at(&self, elapsed: Duration) -> Duration {
        let elapsed_us = elapsed.as_micros();
        let mut point = self.floor_ms;
        // Each step multiplies by at least RATIO_MIN, so this ends after a few thousand steps
        // even for an elapsed time of u64::MAX milliseconds.
        while u128::from(point) * 1000 < elapsed_us && point < u64::MAX {
            point = self.next_ms(point);
        }
        Duration::from_millis(point)
    }

    /// How many points lie at or before `horizon` (the first is counted even past it).
    pub fn points_until(&self, horizon: Duration) -> usize {
        let horizon_ms = horizon.as_millis();
        let mut point = self.floor_ms;
        let mut count = 1;
        while u128::from(point) < horizon_ms {
            point = self.next_ms(point);
            count += 1;
        }
        count
    }

    /// At most how many bits one answer's timing reveals about the data, for answers within
    /// [`ReleaseSchedule::horizon`]: `log2` of the number of points it can land on.
    pub fn bits_per_query(&self) -> f64 {
        (self.points_until(Self::horizon()) as f64).log2()
    }

    /// One line for `pgdp check` and EXPLAIN.
    pub fn describe(&self) -> String {
        format!(
            "DP answers leave at {} ms after their statement started, times {} for each later point ({} points within {} s: at most {:.2} bits per query from timing)",
            self.floor_ms,
            self.ratio,
            self.points_until(Self::horizon()),
            Self::horizon().as_secs(),
            self.bits_per_query()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn answers_wait_for_the_first_point_at_or_after_their_time() {
        let s = ReleaseSchedule::new(100, 2.0).expect("valid");
        assert_eq!(s.release_at(ms(0)), ms(100));
        assert_eq!(s.release_at(ms(100)), ms(100));
        assert_eq!(s.release_at(Duration::from_micros(100_001)), ms(200));
        assert_eq!(s.release_at(ms(101)), ms(200));
        assert_eq!(s.release_at(ms(399)), ms(400));
        assert_eq!(s.release_at(ms(60_000)), ms(102_400));
    }

    #[test]
    fn points_are_rounded_up_and_strictly_increasing() {
        let s = ReleaseSchedule::new(1, 1.5).expect("valid");
        // 1, 2 (⌈1.5⌉), 3, 5 (⌈4.5⌉), 8 (⌈7.5⌉), 12, 18, …
        let mut seen = Vec::new();
        let mut t = 0;
        while seen.len() < 7 {
            let p = s.release_at(ms(t)).as_millis() as u64;
            if seen.last() != Some(&p) {
                seen.push(p);
            }
            t = p + 1;
        }
        assert_eq!(seen, vec![1, 2, 3, 5, 8, 12, 18]);
    }

    #[test]
    fn the_number_of_points_bounds_the_bits() {
        let s = ReleaseSchedule::new(100, 2.0).expect("valid");
        // 100, 200, …, 51_200, 102_400: 11 points up to the 65 s horizon.
        assert_eq!(s.points_until(ReleaseSchedule::horizon()), 11);
        assert!((s.bits_per_query() - 11f64.log2()).abs() < 1e-12);
        let one = ReleaseSchedule::new(limits::STATEMENT_TIMEOUT_MS, 10.0).expect("valid");
        assert_eq!(one.points_until(ReleaseSchedule::horizon()), 2);
    }

    #[test]
    fn invalid_schedules_are_refused_with_the_reason() {
        assert!(ReleaseSchedule::new(0, 2.0)
            .unwrap_err()
            .contains("floor_ms must be between 1"));
        assert!(ReleaseSchedule::new(limits::STATEMENT_TIMEOUT_MS + 1, 2.0).is_err());
        for ratio in [f64::NAN, f64::INFINITY, 1.0, 0.5, -2.0, 1000.0] {
            assert!(
                ReleaseSchedule::new(100, ratio)
                    .unwrap_err()
                    .contains("ratio must be between"),
                "{ratio}"
            );
        }
        let dense = ReleaseSchedule::new(1, limits::RELEASE_SCHEDULE_RATIO_MIN).unwrap_err();
        assert!(dense.contains("release points"), "{dense}");
    }

    #[test]
    fn the_largest_elapsed_time_still_ends() {
        let s = ReleaseSchedule::new(1, limits::RELEASE_SCHEDULE_RATIO_MAX).expect("valid");
        assert_eq!(s.release_at(Duration::MAX), ms(u64::MAX));
    }
}
