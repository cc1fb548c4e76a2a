//! Throttling of password guessing: failed logins are counted per client IP address in a table
//! of fixed capacity, and an address with too many failures in a window is refused at startup
//! (FATAL 53300) until its window ends.
//!
//! Why refuse rather than delay: PostgreSQL's own answer to guessing is `auth_delay`, which keeps
//! the failing backend asleep; in a proxy a sleeping connection holds one of the
//! `connections_max` slots, so a guesser could fill them. A refusal before SCRAM costs one
//! message and holds no slot for longer than the startup packet. The refusal comes before the
//! password is checked, so it says nothing about the password. The cost is that other clients
//! behind the same address (NAT) are refused for the rest of the window too.
//!
//! Memory is bounded: at most `peers_max` addresses are remembered. When the table is full, an
//! entry whose window has ended is dropped, else the one whose window started first (so an
//! attacker with many addresses can make pgdp forget old ones, never grow the table).

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// Failed logins per IP address; see the module documentation.
#[derive(Debug)]
pub(super) struct Throttle {
    failures_max: u32,
    window: Duration,
    peers_max: usize,
    table: std::sync::Mutex<HashMap<IpAddr, Failures>>,
}

#[derive(Debug, Clone, Copy)]
struct Failures {
    /// When the first failure of this window happened.
    since: Instant,
    count: u32,
}

impl Throttle {
    pub(super) fn new(failures_max: u32, window: Duration, peers_max: usize) -> Throttle {
        Throttle {
            failures_max,
            window,
            peers_max: peers_max.max(1),
            table: std::sync::Mutex::new(HashMap::new()),
        }
    }

    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<IpAddr, Failures>> {
        // Every update leaves the map consistent, so a poisoned lock is still usable.
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether logins from `ip` are refused at `now`.
    pub(super) fn refuses(&self, ip: IpAddr, now: Instant) -> bool {
        self.table().get(&ip).is_some_and(|f| {
            now.saturating_duration_since(f.since) < self.window && f.count >= self.failures_max
        })
    }

    /// Counts a failed login from `ip` at `now`; returns the failures of its current window.
    pub(super) fn record_failure(&self, ip: IpAddr, now: Instant) -> u32 {
        let mut table = self.table();
        if !table.contains_key(&ip) && table.len() >= self.peers_max {
            let window = self.window;
            let victim = table
                .iter()
                .find(|(_, f)| now.saturating_duration_since(f.since) >= window)
                .or_else(|| table.iter().min_by_key(|(_, f)| f.since))
                .map(|(ip, _)| *ip);
            if let Some(victim) = victim {
                table.remove(&victim);
            }
        }
        let entry = table.entry(ip).or_insert(Failures {
            since: now,
            count: 0,
        });
        if now.saturating_duration_since(entry.since) >= self.window {
            *entry = Failures {
                since: now,
                count: 0,
            };
        }
        entry.count = entry.count.saturating_add(1);
        entry.count
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.table().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, last])
    }

    #[test]
    fn refuses_after_the_maximum_until_the_window_ends() {
        let throttle = Throttle::new(3, Duration::from_secs(60), 16);
        let t0 = Instant::now();
        for n in 1..=3 {
            assert!(!throttle.refuses(ip(1), t0));
            assert_eq!(throttle.record_failure(ip(1), t0), n);
        }
        assert!(throttle.refuses(ip(1), t0 + Duration::from_secs(59)));
        assert!(
            !throttle.refuses(ip(2), t0),
            "other addresses are not affected"
        );
        assert!(!throttle.refuses(ip(1), t0 + Duration::from_secs(60)));
        // A failure after the window starts a new one.
        assert_eq!(
            throttle.record_failure(ip(1), t0 + Duration::from_secs(61)),
            1
        );
    }

    #[test]
    fn the_table_never_grows_past_its_capacity() {
        let throttle = Throttle::new(3, Duration::from_secs(60), 4);
        let t0 = Instant::now();
        for n in 0..100u8 {
            throttle.record_failure(ip(n), t0 + Duration::from_millis(u64::from(n)));
            assert!(throttle.len() <= 4);
        }
        // The newest addresses are the ones remembered.
        assert_eq!(
            throttle.record_failure(ip(99), t0 + Duration::from_secs(1)),
            2
        );
    }

    #[test]
    fn expired_entries_are_dropped_before_live_ones() {
        let throttle = Throttle::new(2, Duration::from_secs(10), 2);
        let t0 = Instant::now();
        throttle.record_failure(ip(1), t0 + Duration::from_secs(5));
        throttle.record_failure(ip(1), t0 + Duration::from_secs(5));
        throttle.record_failure(ip(2), t0);
        // At t0 + 12 s the entry of ip(2) has expired, that of ip(1) has not.
        throttle.record_failure(ip(3), t0 + Duration::from_secs(12));
        assert!(throttle.refuses(ip(1), t0 + Duration::from_secs(12)));
    }
}
