//! Read replicas: streaming standbys of the upstream that serve DP and public-table queries in
//! turn while they are up and not lagging, with the primary as the fallback.
//!
//! Invariants:
//! - A standby serves a query only while its last health check found it answering and its
//!   replay lag at most the limit ([`Standbys::lag_max_ms`]); before its first check, after a
//!   failed check, and as soon as a connection to it fails, it serves nothing. When no standby
//!   can serve, the primary does. Which server answers never changes what is charged: the
//!   connection is taken before the charge ([`super::Upstream::get_for_read`]), so a query that
//!   finds no server is refused (57P03) uncharged, and a failure after the charge keeps it, as
//!   with one server.
//! - Lag is measured from LSNs, not clocks: every [`limits::STANDBY_CHECK_MS`] the watcher reads
//!   the primary's `pg_current_wal_lsn()` and keeps the samples of the last
//!   [`limits::STANDBY_LAG_WINDOW_MS`]; a standby whose `pg_last_wal_replay_lsn()` has reached
//!   the sample taken at time t holds every transaction committed by t, so its lag is at most
//!   now − t for the latest such t. While the primary cannot be read, nothing new is committed
//!   there, and standbys that answer are used whatever their last lag.
//! - A promoted standby (no longer in recovery) serves with lag 0: it is a primary itself.
//! - The shadow catalog reads its database on a standby only while the standby serves and had
//!   replayed, at its last check, past the primary's WAL position recorded after the shadow's
//!   build ([`View::serving_past`]); a promoted standby counts as having replayed nothing,
//!   since builds on the primary no longer reach it.
//! - The watcher holds only a weak reference: it stops when the upstream is dropped.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use tokio_postgres::Client;

use super::{first_value, Upstream};
use crate::limits;

/// The standbys of an upstream, and what the watcher last found out about each.
#[derive(Debug)]
pub(super) struct Standbys {
    pub(super) servers: Vec<Upstream>,
    /// What the watcher found out, shared with the shadow catalog ([`super::shadow`]).
    view: Arc<View>,
    /// Where the next query starts looking (round robin).
    next: AtomicUsize,
    /// The largest replay lag at which a standby still serves.
    pub(super) lag_max_ms: u64,
}

/// A standby's state as of the last check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Health {
    /// Not checked yet: serves nothing.
    Unknown,
    /// Answering, with a replay lag of at most this many ms (`None`: not measurable while the
    /// primary cannot be read).
    Serving { lag_ms: Option<u64> },
    /// Answering, but its replay lag is past the limit.
    Lagging { lag_ms: u64 },
    /// Not answering, or a connection to it failed since the last check.
    Down,
}

/// What the watcher last found out about each standby (by index, in the order of
/// [`Standbys::servers`]): its health and how far it has replayed the primary's WAL. Shared
/// with the shadow catalog, whose reads go to the same servers' copy of the shadow database.
#[derive(Debug)]
pub struct View {
    hosts: Vec<String>,
    health: Vec<Mutex<Health>>,
    /// The replay LSN each standby reported at its last successful check; 0 before the first,
    /// and for a promoted standby (its WAL is no longer the primary's, so it has replayed
    /// nothing written on the primary since).
    replayed: Vec<AtomicU64>,
    lag_max_ms: u64,
}

impl View {
    pub(super) fn health(&self, i: usize) -> Health {
        self.health.get(i).map_or(Health::Down, |h| {
            *h.lock().unwrap_or_else(|e| e.into_inner())
        })
    }

    fn set(&self, i: usize, new: Health) {
        let Some(slot) = self.health.get(i) else {
            return;
        };
        let mut health = slot.lock().unwrap_or_else(|e| e.into_inner());
        let host = self.hosts.get(i).map_or("?", String::as_str);
        match (*health, new) {
            (Health::Serving { .. }, Health::Serving { .. }) => {}
            (_, Health::Serving { lag_ms }) => {
                tracing::info!(standby = %host, ?lag_ms, "standby serves reads")
            }
            (Health::Down, Health::Down) | (Health::Lagging { .. }, Health::Lagging { .. }) => {}
            (_, Health::Down) => tracing::warn!(standby = %host, "standby down: reads skip it"),
            (_, Health::Lagging { lag_ms }) => {
                tracing::warn!(standby = %host, lag_ms, limit_ms = self.lag_max_ms, "standby lagging: reads skip it")
            }
            (_, Health::Unknown) => {}
        }
        *health = new;
    }

    /// A connection to standby `i` failed: it serves nothing until a check finds it back.
    pub(super) fn mark_down(&self, i: usize) {
        self.set(i, Health::Down);
    }

    /// The standbys that serve now and had replayed the primary's WAL up to `lsn` at their last
    /// check, in index order. (Replay only moves forward, so an older reading is a lower bound.)
    pub(super) fn serving_past(&self, lsn: u64) -> Vec<usize> {
        (0..self.health.len())
            .filter(|&i| matches!(self.health(i), Health::Serving { .. }))
            .filter(|&i| {
                self.replayed
                    .get(i)
                    .is_some_and(|r| r.load(Ordering::Acquire) >= lsn)
            })
            .collect()
    }

    fn set_replayed(&self, i: usize, lsn: u64) {
        if let Some(slot) = self.replayed.get(i) {
            slot.store(lsn, Ordering::Release);
        }
    }
}

impl Standbys {
    pub(super) fn new(servers: Vec<Upstream>, lag_max_ms: u64) -> Standbys {
        let view = View {
            hosts: servers.iter().map(|s| s.dsn.endpoints()).collect(),
            health: servers
                .iter()
                .map(|_| Mutex::new(Health::Unknown))
                .collect(),
            replayed: servers.iter().map(|_| AtomicU64::new(0)).collect(),
            lag_max_ms,
        };
        Standbys {
            servers,
            view: Arc::new(view),
            next: AtomicUsize::new(0),
            lag_max_ms,
        }
    }

    /// The watcher's findings, to share.
    pub(super) fn view(&self) -> Arc<View> {
        self.view.clone()
    }

    /// The standbys that may serve now, in round-robin order.
    /// (The rotation is over the serving ones, so each gets an equal share.)
    pub(super) fn in_turn(&self) -> Vec<usize> {
        let mut serving: Vec<usize> = (0..self.servers.len())
            .filter(|&i| matches!(self.health(i), Health::Serving { .. }))
            .collect();
        if !serving.is_empty() {
            let start = self.next.fetch_add(1, Ordering::Relaxed) % serving.len();
            serving.rotate_left(start);
        }
        serving
    }

    pub(super) fn health(&self, i: usize) -> Health {
        self.view.health(i)
    }

    fn set(&self, i: usize, new: Health) {
        self.view.set(i, new);
    }

    /// A connection to standby `i` failed: it serves nothing until a check finds it back.
    pub(super) fn mark_down(&self, i: usize) {
        self.view.mark_down(i);
    }
}

/// Primary WAL positions over the last [`limits::STANDBY_LAG_WINDOW_MS`], oldest first.
#[derive(Debug, Default)]
struct Samples(VecDeque<(Instant, u64)>);

impl Samples {
    fn push(&mut self, at: Instant, lsn: u64) {
        self.0.push_back((at, lsn));
        let window = Duration::from_millis(limits::STANDBY_LAG_WINDOW_MS);
        while self
            .0
            .front()
            .is_some_and(|(t, _)| at.duration_since(*t) > window)
        {
            self.0.pop_front();
        }
    }

    /// The replay lag of a standby at `replayed`, in ms: `None` with no samples (the primary
    /// cannot be read), the whole window when it has not reached even the oldest sample.
    fn lag_ms(&self, replayed: u64, now: Instant) -> Option<u64> {
        let (oldest, _) = *self.0.front()?;
        let ms = |t: Instant| u64::try_from(now.duration_since(t).as_millis()).unwrap_or(u64::MAX);
        Some(
            match self.0.iter().rev().find(|(_, lsn)| *lsn <= replayed) {
                Some((t, _)) => ms(*t),
                None => ms(oldest).max(limits::STANDBY_LAG_WINDOW_MS),
            },
        )
    }
}

/// `X/Y`, PostgreSQL's text form of an LSN, as a number.
pub(super) fn parse_lsn(text: &str) -> Option<u64> {
    let (high, low) = text.split_once('/')?;
    let high = u64::from_str_radix(high, 16).ok()?;
    let low = u64::from_str_radix(low, 16).ok()?;
    (high <= u64::from(u32::MAX) && low <= u64::from(u32::MAX)).then_some((high << 32) | low)
}

/// Checks the standbys of `upstream` every [`limits::STANDBY_CHECK_MS`] until it is dropped.
/// Its connections are its own, outside the pools.
pub(super) async fn watch(upstream: Weak<Upstream>) {
    let mut primary: Option<Client> = None;
    let mut standbys: Vec<Option<Client>> = Vec::new();
    let mut samples = Samples::default();
    let mut tick = tokio::time::interval(Duration::from_millis(limits::STANDBY_CHECK_MS));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(upstream) = upstream.upgrade() else {
            return;
        };
        let Some(set) = upstream.standbys.as_ref() else {
            return;
        };
        standbys.resize_with(set.servers.len(), || None);
        match read_one(
            &upstream,
            &mut primary,
            "SELECT pg_catalog.pg_current_wal_lsn()::text",
        )
        .await
        .and_then(|v| parse_lsn(&v?))
        {
            Some(lsn) => samples.push(Instant::now(), lsn),
            None => samples.0.clear(),
        }
        for (i, (server, client)) in set.servers.iter().zip(standbys.iter_mut()).enumerate() {
            let state = read_one(
                server,
                client,
                "SELECT CASE WHEN pg_catalog.pg_is_in_recovery() \
                 THEN pg_catalog.pg_last_wal_replay_lsn()::text ELSE 'primary' END",
            )
            .await;
            let health = match state {
                None | Some(None) => Health::Down,
                Some(Some(v)) if v == "primary" => {
                    set.view.set_replayed(i, 0);
                    Health::Serving { lag_ms: Some(0) }
                }
                Some(Some(v)) => match parse_lsn(&v) {
                    None => Health::Down,
                    Some(replayed) => {
                        set.view.set_replayed(i, replayed);
                        match samples.lag_ms(replayed, Instant::now()) {
                            None => Health::Serving { lag_ms: None },
                            Some(lag_ms) if lag_ms <= set.lag_max_ms => Health::Serving {
                                lag_ms: Some(lag_ms),
                            },
                            Some(lag_ms) => Health::Lagging { lag_ms },
                        }
                    }
                },
            };
            set.set(i, health);
        }
    }
}

/// The first value of `sql` on `server` over the watcher's own connection, reconnecting when it
/// has none: `None` if the server cannot be reached or the query fails (the connection is then
/// dropped), `Some(None)` for a NULL.
async fn read_one(
    server: &Upstream,
    client: &mut Option<Client>,
    sql: &str,
) -> Option<Option<String>> {
    if client.as_ref().is_none_or(Client::is_closed) {
        *client = server.connect().await.ok();
    }
    let connection = client.as_ref()?;
    let timeout = Duration::from_millis(limits::STANDBY_CHECK_MS.max(1_000));
    match tokio::time::timeout(timeout, connection.simple_query(sql)).await {
        Ok(Ok(rows)) => Some(first_value(&rows)),
        _ => {
            *client = None;
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lsns_parse_as_postgresql_prints_them() {
        assert_eq!(parse_lsn("0/0"), Some(0));
        assert_eq!(parse_lsn("16/B374D848"), Some((0x16 << 32) | 0xB374_D848));
        assert_eq!(parse_lsn("16"), None);
        assert_eq!(parse_lsn("x/1"), None);
        assert_eq!(parse_lsn("100000000/0"), None);
    }

    #[test]
    fn lag_is_the_age_of_the_latest_primary_position_replayed() {
        let start = Instant::now();
        let mut samples = Samples::default();
        assert_eq!(
            samples.lag_ms(5, start),
            None,
            "no primary samples: unknown"
        );
        for (ms, lsn) in [(0, 100), (500, 200), (1_000, 200), (1_500, 300)] {
            samples.push(start + Duration::from_millis(ms), lsn);
        }
        let now = start + Duration::from_millis(1_600);
        // Caught up with the newest sample.
        assert_eq!(samples.lag_ms(300, now), Some(100));
        // Reached 200 (taken at 500 and 1000 ms): holds everything committed by 1000 ms.
        assert_eq!(samples.lag_ms(250, now), Some(600));
        assert_eq!(samples.lag_ms(100, now), Some(1_600));
        // Behind every sample: at least the whole window.
        assert_eq!(samples.lag_ms(50, now), Some(limits::STANDBY_LAG_WINDOW_MS));
    }

    #[test]
    fn only_serving_standbys_are_offered_in_turn() {
        let servers = (0..3)
            .map(|i| Upstream::new(&format!("host=127.0.0.1 port={} user=u", 5500 + i)))
            .collect::<crate::Result<Vec<_>>>()
            .expect("valid DSNs");
        let set = Standbys::new(servers, 1_000);
        assert!(set.in_turn().is_empty(), "unchecked standbys serve nothing");
        set.set(0, Health::Serving { lag_ms: Some(3) });
        set.set(1, Health::Lagging { lag_ms: 5_000 });
        set.set(2, Health::Serving { lag_ms: None });
        let first = set.in_turn();
        let second = set.in_turn();
        assert_eq!(first.len(), 2);
        assert!(first.iter().all(|i| [0, 2].contains(i)));
        assert_ne!(first[0], second[0], "round robin");
        set.mark_down(0);
        assert_eq!(set.in_turn(), vec![2]);
    }

    #[test]
    fn the_shadow_reads_only_serving_standbys_that_replayed_past_its_build() {
        let servers = (0..3)
            .map(|i| Upstream::new(&format!("host=127.0.0.1 port={} user=u", 5600 + i)))
            .collect::<crate::Result<Vec<_>>>()
            .expect("valid DSNs");
        let set = Standbys::new(servers, 1_000);
        let view = set.view();
        for i in 0..3 {
            view.set_replayed(i, 500);
        }
        assert!(view.serving_past(100).is_empty(), "unchecked: none");
        set.set(0, Health::Serving { lag_ms: Some(3) });
        set.set(1, Health::Serving { lag_ms: None });
        set.set(2, Health::Lagging { lag_ms: 5_000 });
        view.set_replayed(1, 99);
        assert_eq!(
            view.serving_past(100),
            vec![0],
            "1 has not replayed it, 2 lags"
        );
        assert_eq!(view.serving_past(500), vec![0]);
        assert!(
            view.serving_past(501).is_empty(),
            "nobody holds a newer build yet"
        );
        view.mark_down(0);
        assert!(view.serving_past(100).is_empty());
    }
}
