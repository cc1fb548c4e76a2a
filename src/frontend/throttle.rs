//! Throttling of password guessing: failed logins are counted per (client IP address, user
//! name) and per client IP address, each in a table of fixed capacity; a login whose user has
//! too many failures from its address in a window, or whose address has too many in all (a
//! spray over many user names), is refused at startup (FATAL 53300) until that window ends.
//!
//! Why per user as well as per address: BI servers and notebooks connect for all their users
//! from one address, and one stale saved password (which such tools retry) must not lock every
//! analyst behind that address out. The address-wide limit is higher and stops a guesser who
//! tries many user names.
//!
//! Why refuse rather than delay: PostgreSQL's own answer to guessing is `auth_delay`, which keeps
//! the failing backend asleep; in a proxy a sleeping connection holds one of the
//! `connections_max` slots, so a guesser could fill them. A refusal before SCRAM costs one
//! message and holds no slot for longer than the startup packet. The refusal comes before the
//! password is checked, so it says nothing about the password.
//!
//! Memory is bounded: each table remembers at most `peers_max` keys, and a user name is kept to
//! its first [`USER_BYTES_MAX`] bytes (longer names sharing them count together: more
//! throttling, never less). When a table is full, an entry whose window has ended is dropped,
//! else the one whose window started first (so an attacker with many addresses can make pgdp
//! forget old ones, never grow the table).

use std::collections::HashMap;
use std::hash::Hash;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use crate::policy::LoginThrottle;

/// Bytes of a user name the table keys on (PostgreSQL's `NAMEDATALEN` − 1).
const USER_BYTES_MAX: usize = 63;

/// Which limit refuses a login.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Lockout {
    /// This user's failures from this address.
    User,
    /// All failures from this address (many user names).
    Address,
}

/// Failed logins per (address, user) and per address; see the module documentation.
#[derive(Debug)]
pub(super) struct Throttle {
    logins: FailureTable<(IpAddr, String)>,
    addresses: FailureTable<IpAddr>,
}

/// What [`Throttle::record_failure`] counted: the failures of the login's and of the address's
/// current windows, and whether this failure locked either out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Counted {
    pub(super) user: u32,
    pub(super) address: u32,
    pub(super) locked: Option<Lockout>,
}

impl Throttle {
    pub(super) fn new(peers_max: usize) -> Throttle {
        Throttle {
            logins: FailureTable::new(peers_max),
            addresses: FailureTable::new(peers_max),
        }
    }

    /// Whether a login of `user` from `ip` is refused at `now` under `limits`, and by which
    /// limit.
    pub(super) fn refuses(
        &self,
        ip: IpAddr,
        user: &str,
        now: Instant,
        limits: &LoginThrottle,
    ) -> Option<Lockout> {
        if self
            .addresses
            .refuses(&ip, now, limits.failures_per_address, limits.window)
        {
            Some(Lockout::Address)
        } else if self.logins.refuses(
            &(ip, key_user(user)),
            now,
            limits.failures_per_user,
            limits.window,
        ) {
            Some(Lockout::User)
        } else {
            None
        }
    }

    /// Counts a failed login of `user` from `ip` at `now` under `limits`.
    pub(super) fn record_failure(
        &self,
        ip: IpAddr,
        user: &str,
        now: Instant,
        limits: &LoginThrottle,
    ) -> Counted {
        let user = self
            .logins
            .record(&(ip, key_user(user)), now, limits.window);
        let address = self.addresses.record(&ip, now, limits.window);
        let locked = if address == limits.failures_per_address {
            Some(Lockout::Address)
        } else if user == limits.failures_per_user {
            Some(Lockout::User)
        } else {
            None
        };
        Counted {
            user,
            address,
            locked,
        }
    }
}

/// The user name as the table keys it: its first [`USER_BYTES_MAX`] bytes (at a char boundary).
fn key_user(user: &str) -> String {
    let mut end = user.len().min(USER_BYTES_MAX);
    while !user.is_char_boundary(end) {
        end -= 1;
    }
    user[..end].to_string()
}

/// Failures per key in windows, with a fixed capacity.
#[derive(Debug)]
struct FailureTable<K> {
    peers_max: usize,
    table: std::sync::Mutex<HashMap<K, Failures>>,
}

#[derive(Debug, Clone, Copy)]
struct Failures {
    /// When the first failure of this window happened.
    since: Instant,
    count: u32,
}

impl<K: Eq + Hash + Clone> FailureTable<K> {
    fn new(peers_max: usize) -> Self {
        FailureTable {
            peers_max: peers_max.max(1),
            table: std::sync::Mutex::new(HashMap::new()),
        }
    }

    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<K, Failures>> {
        // Every update leaves the map consistent, so a poisoned lock is still usable.
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn refuses(&self, key: &K, now: Instant, failures_max: u32, window: Duration) -> bool {
        self.table().get(key).is_some_and(|f| {
            now.saturating_duration_since(f.since) < window && f.count >= failures_max
        })
    }

    /// Counts a failure of `key` at `now`; returns the failures of its current window.
    fn record(&self, key: &K, now: Instant, window: Duration) -> u32 {
        let mut table = self.table();
        if !table.contains_key(key) && table.len() >= self.peers_max {
            let victim = table
                .iter()
                .find(|(_, f)| now.saturating_duration_since(f.since) >= window)
                .or_else(|| table.iter().min_by_key(|(_, f)| f.since))
                .map(|(k, _)| k.clone());
            if let Some(victim) = victim {
                table.remove(&victim);
            }
        }
        let entry = table.entry(key.clone()).or_insert(Failures {
            since: now,
            count: 0,
        });
        if now.saturating_duration_since(entry.since) >= window {
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

    fn limits(per_user: u32, per_address: u32, window_s: u64) -> LoginThrottle {
        LoginThrottle {
            failures_per_user: per_user,
            failures_per_address: per_address,
            window: Duration::from_secs(window_s),
        }
    }

    #[test]
    fn refuses_after_the_maximum_until_the_window_ends() {
        let throttle = Throttle::new(16);
        let l = &limits(3, 100, 60);
        let t0 = Instant::now();
        for n in 1..=3 {
            assert_eq!(throttle.refuses(ip(1), "ana", t0, l), None);
            assert_eq!(throttle.record_failure(ip(1), "ana", t0, l).user, n);
        }
        assert_eq!(
            throttle.record_failure(ip(1), "ana", t0, l).locked,
            None,
            "the lockout is reported once, when it starts"
        );
        assert_eq!(
            throttle.refuses(ip(1), "ana", t0 + Duration::from_secs(59), l),
            Some(Lockout::User)
        );
        assert_eq!(
            throttle.refuses(ip(2), "ana", t0, l),
            None,
            "other addresses are not affected"
        );
        assert_eq!(
            throttle.refuses(ip(1), "bob", t0, l),
            None,
            "nor other users behind the same address"
        );
        assert_eq!(
            throttle.refuses(ip(1), "ana", t0 + Duration::from_secs(60), l),
            None
        );
        // A failure after the window starts a new one.
        assert_eq!(
            throttle
                .record_failure(ip(1), "ana", t0 + Duration::from_secs(61), l)
                .user,
            1
        );
    }

    #[test]
    fn a_spray_over_many_users_locks_the_address_out() {
        let throttle = Throttle::new(64);
        let l = &limits(3, 10, 60);
        let t0 = Instant::now();
        let mut locked = Vec::new();
        for n in 0..10 {
            let counted = throttle.record_failure(ip(1), &format!("user{n}"), t0, l);
            assert_eq!(counted.user, 1);
            locked.extend(counted.locked);
        }
        assert_eq!(locked, vec![Lockout::Address]);
        assert_eq!(
            throttle.refuses(ip(1), "someone-else", t0, l),
            Some(Lockout::Address)
        );
        assert_eq!(throttle.refuses(ip(2), "user0", t0, l), None);
    }

    #[test]
    fn user_names_are_keyed_on_their_first_bytes() {
        let long = "é".repeat(40);
        assert_eq!(key_user(&long).len(), 62, "cut at a char boundary");
        assert_eq!(key_user("ana"), "ana");
    }

    #[test]
    fn the_table_never_grows_past_its_capacity() {
        let table = FailureTable::new(4);
        let window = Duration::from_secs(60);
        let t0 = Instant::now();
        for n in 0..100u8 {
            table.record(&ip(n), t0 + Duration::from_millis(u64::from(n)), window);
            assert!(table.len() <= 4);
        }
        // The newest addresses are the ones remembered.
        assert_eq!(
            table.record(&ip(99), t0 + Duration::from_secs(1), window),
            2
        );
    }

    #[test]
    fn expired_entries_are_dropped_before_live_ones() {
        let table = FailureTable::new(2);
        let window = Duration::from_secs(10);
        let t0 = Instant::now();
        table.record(&ip(1), t0 + Duration::from_secs(5), window);
        table.record(&ip(1), t0 + Duration::from_secs(5), window);
        table.record(&ip(2), t0, window);
        // At t0 + 12 s the entry of ip(2) has expired, that of ip(1) has not.
        table.record(&ip(3), t0 + Duration::from_secs(12), window);
        assert!(table.refuses(&ip(1), t0 + Duration::from_secs(12), 2, window));
    }
}
