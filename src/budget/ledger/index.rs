//! The replay index: the keys this process knows `pgdp.replay_cache` holds for each analyst, so
//! that a DP query none of whose keys is stored (a new query: the common case) skips the ledger
//! round trip of [`super::Ledger::replay_lookup`] and goes straight to its charge.
//!
//! Invariants:
//! - The index says *absent* or *ask*, nothing else: an entry is always read from the ledger,
//!   never from the index, and a key the index holds that the ledger does not (expired, purged,
//!   dropped by a journal that fell behind, a hash collision) costs one round trip.
//! - While the index *listens* and an analyst is *loaded*, every key of the analyst's entries in
//!   `pgdp.replay_cache` is in it, except one that another process committed moments ago and
//!   whose notification has not arrived: the listener's connection runs `LISTEN pgdp_replay`
//!   before any analyst is loaded; every writer of an entry notifies in the transaction that
//!   stores it ([`notify_stored!`], in the journal's and [`super::Ledger::replay_put`]'s
//!   INSERT); an analyst's keys are read after that (expired entries deleted in the same
//!   statement, so a fresh entry under their key can be stored), and what notifications bring
//!   while they are read is kept; this process's own entries enter the index when queued.
//! - When the listener's connection ends, everything is forgotten and every lookup goes to the
//!   ledger until it listens again (a new *generation*); a load begun in an earlier generation
//!   is discarded. So a lost notification can only come from a connection that died without
//!   this process noticing yet.
//! - Privacy: a skipped lookup is a miss, and a miss is answered as a new release, charged
//!   before it leaves. The index can therefore cost an analyst a second charge for a query
//!   another process answered a moment ago (as two identical queries racing on two processes
//!   always could), never a release that was not charged (docs/privacy.md, "The replay index").
//! - Bounded: [`REPLAY_INDEX_KEYS_MAX`] 64-bit hashes in all (past it the index starts over) and
//!   [`REPLAY_INDEX_ANALYST_KEYS_MAX`] per analyst (past it the analyst is not indexed).

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasher, RandomState};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use tokio_postgres::Notification;
use tracing::warn;

use crate::dsn::{Dsn, OnNotification};
use crate::limits::{
    REPLAY_INDEX_ANALYST_KEYS_MAX, REPLAY_INDEX_KEYS_MAX, REPLAY_INDEX_RETRY_MS,
    UPSTREAM_CONNECT_TIMEOUT_MS,
};

/// The channel pgdp's replay-cache writers notify and the index listens on.
const CHANNEL: &str = "pgdp_replay";

/// The tail of `WITH stored AS (INSERT INTO pgdp.replay_cache … RETURNING analyst, key)`: one
/// notification on [`CHANNEL`] per entry stored, `<octets of analyst>:<analyst><key>`, sent when
/// the transaction commits. An entry whose payload would pass PostgreSQL's 8000-byte limit is
/// stored without one (other processes then miss it: a second charge, never an error that
/// would stop the journal).
macro_rules! notify_stored {
    () => {
        " SELECT pg_notify('pgdp_replay', octet_length(analyst)::text || ':' || analyst || key)
          FROM stored WHERE octet_length(analyst) + octet_length(key) < 7900"
    };
}
pub(super) use notify_stored;

/// The (analyst, key) of a notification's payload (see [`notify_stored!`]).
fn parse_payload(payload: &str) -> Option<(&str, &str)> {
    let (octets, rest) = payload.split_once(':')?;
    let octets: usize = octets.parse().ok()?;
    Some((rest.get(..octets)?, rest.get(octets..)?))
}

/// See the module docs. Shared behind an `Arc` by the ledger, its listener task (weakly) and
/// the loads under way.
pub(super) struct ReplayIndex {
    state: Mutex<State>,
    hasher: RandomState,
    listener: Mutex<Option<Listener>>,
}

/// The listener task, stopped when the index goes.
struct Listener(tokio::task::JoinHandle<()>);

impl Drop for Listener {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[derive(Default)]
struct State {
    /// The listener's connection is up and has run LISTEN.
    listening: bool,
    /// Bumped whenever everything is forgotten.
    generation: u64,
    analysts: HashMap<String, Keys>,
    /// Hashes held, all analysts together.
    total: usize,
}

/// What the index holds for one analyst.
enum Keys {
    /// Being read from the ledger; what notifications brought meanwhile.
    Loading(HashSet<u64>),
    /// Every stored key (see the module docs).
    Loaded(HashSet<u64>),
    /// Too many to hold: every lookup asks the ledger (until the next generation).
    Unindexed,
}

impl State {
    fn forget(&mut self) {
        self.analysts.clear();
        self.total = 0;
        self.generation += 1;
    }

    /// Adds `hashes` to `analyst`'s keys, if the index holds any for them.
    fn add(&mut self, analyst: &str, hashes: impl IntoIterator<Item = u64>) {
        let Some(keys) = self.analysts.get_mut(analyst) else {
            return;
        };
        let (Keys::Loading(set) | Keys::Loaded(set)) = keys else {
            return;
        };
        for hash in hashes {
            if set.insert(hash) {
                self.total += 1;
            }
        }
        if set.len() > REPLAY_INDEX_ANALYST_KEYS_MAX {
            self.total -= set.len();
            *keys = Keys::Unindexed;
        }
        if self.total > REPLAY_INDEX_KEYS_MAX {
            self.forget();
        }
    }
}

/// What [`ReplayIndex::verdict`] says about a lookup.
pub(super) enum Verdict {
    /// None of the keys is stored: the lookup is a miss without asking the ledger.
    Absent,
    /// Ask the ledger.
    Ask,
    /// Ask the ledger; and read the analyst's keys for the next lookups, under this token.
    Load(LoadToken),
}

/// The right to fill in one analyst's keys, given to one lookup. Dropped without
/// [`LoadToken::complete`] (the read failed, or the session went away), it leaves the analyst
/// unloaded, so the next lookup tries again.
pub(super) struct LoadToken {
    index: Arc<ReplayIndex>,
    analyst: String,
    generation: u64,
    done: bool,
}

impl LoadToken {
    /// The analyst whose keys to read.
    pub(super) fn analyst(&self) -> &str {
        &self.analyst
    }

    /// The analyst's stored keys, as read from the ledger after the token was given (at most
    /// [`ReplayIndex::LOAD_LIMIT`]; more means too many to index).
    pub(super) fn complete(mut self, keys: &[String]) {
        self.done = true;
        let hashes: HashSet<u64> = keys.iter().map(|k| self.index.hash(k)).collect();
        let mut state = self.index.state();
        if state.generation != self.generation {
            return;
        }
        let loading = match state.analysts.get_mut(&self.analyst) {
            Some(Keys::Loading(set)) => std::mem::take(set),
            _ => return,
        };
        state.total -= loading.len();
        if keys.len() >= ReplayIndex::LOAD_LIMIT {
            state.analysts.insert(self.analyst.clone(), Keys::Unindexed);
            return;
        }
        state
            .analysts
            .insert(self.analyst.clone(), Keys::Loaded(HashSet::new()));
        state.add(&self.analyst, loading.into_iter().chain(hashes));
    }
}

impl Drop for LoadToken {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let mut state = self.index.state();
        if state.generation != self.generation {
            return;
        }
        if let Some(Keys::Loading(set)) = state.analysts.get(&self.analyst) {
            let held = set.len();
            state.analysts.remove(&self.analyst);
            state.total -= held;
        }
    }
}

impl ReplayIndex {
    /// Most keys one load reads: one more than an analyst may have indexed.
    pub(super) const LOAD_LIMIT: usize = REPLAY_INDEX_ANALYST_KEYS_MAX + 1;

    pub(super) fn new() -> ReplayIndex {
        ReplayIndex {
            state: Mutex::new(State::default()),
            hasher: RandomState::new(),
            listener: Mutex::new(None),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // Plain data, and nothing panics while holding the lock.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn hash(&self, key: &str) -> u64 {
        self.hasher.hash_one(key)
    }

    /// Starts the listener on `config`'s server unless it runs (the first lookup with the
    /// replay cache on does; until it listens, every lookup asks the ledger).
    pub(super) fn listen(self: &Arc<Self>, config: &Dsn) {
        let mut listener = self
            .listener
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if listener.is_none() {
            let task = tokio::spawn(listen(config.clone(), Arc::downgrade(self)));
            *listener = Some(Listener(task));
        }
    }

    /// Whether `analyst`'s entries may include one of `keys`.
    pub(super) fn verdict(self: &Arc<Self>, analyst: &str, keys: &[&str]) -> Verdict {
        let mut state = self.state();
        if !state.listening {
            return Verdict::Ask;
        }
        match state.analysts.get(analyst) {
            Some(Keys::Loaded(set)) => {
                if keys.iter().any(|key| set.contains(&self.hash(key))) {
                    Verdict::Ask
                } else {
                    Verdict::Absent
                }
            }
            Some(Keys::Loading(_) | Keys::Unindexed) => Verdict::Ask,
            None => {
                state
                    .analysts
                    .insert(analyst.to_string(), Keys::Loading(HashSet::new()));
                Verdict::Load(LoadToken {
                    index: Arc::clone(self),
                    analyst: analyst.to_string(),
                    generation: state.generation,
                    done: false,
                })
            }
        }
    }

    /// An entry stored, or queued to be, for `analyst` under `key`.
    pub(super) fn insert(&self, analyst: &str, key: &str) {
        let hash = self.hash(key);
        self.state().add(analyst, [hash]);
    }

    fn listening(&self, listening: bool) {
        let mut state = self.state();
        state.forget();
        state.listening = listening;
    }
}

/// The listener: one ledger connection that LISTENs on [`CHANNEL`] and puts each notified key
/// in the index; whenever it is not up, the index is off. Runs until the index goes.
async fn listen(config: Dsn, index: Weak<ReplayIndex>) {
    let timeout = Duration::from_millis(UPSTREAM_CONNECT_TIMEOUT_MS);
    loop {
        let notified = index.clone();
        let deliver: OnNotification = Box::new(move |notification: Notification| {
            if notification.channel() != CHANNEL {
                return;
            }
            if let (Some(index), Some((analyst, key))) =
                (notified.upgrade(), parse_payload(notification.payload()))
            {
                index.insert(analyst, key);
            }
        });
        let connected = tokio::time::timeout(
            timeout,
            config.connect_listening("privacy ledger (replay index)", Some(deliver)),
        )
        .await;
        match connected {
            Ok(Ok((client, driver))) => match client.batch_execute("LISTEN pgdp_replay").await {
                Ok(()) => {
                    let Some(live) = index.upgrade() else { return };
                    live.listening(true);
                    drop(live);
                    // Until the connection ends; `client` keeps it open meanwhile.
                    let _ended = driver.await;
                    let Some(live) = index.upgrade() else { return };
                    live.listening(false);
                    warn!(endpoint = %config.endpoints(), "the privacy ledger's replay-index connection ended; every replay lookup asks the ledger until it is back");
                }
                Err(error) => {
                    warn!(error = %error, "the privacy ledger refused LISTEN; every replay lookup asks the ledger")
                }
            },
            Ok(Err(error)) => {
                warn!(error = %error, endpoint = %config.endpoints(), "cannot connect the replay index to the privacy ledger")
            }
            Err(_) => {
                warn!(endpoint = %config.endpoints(), "connecting the replay index to the privacy ledger timed out")
            }
        }
        if index.strong_count() == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(REPLAY_INDEX_RETRY_MS)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listening() -> Arc<ReplayIndex> {
        let index = Arc::new(ReplayIndex::new());
        index.listening(true);
        index
    }

    fn absent(index: &Arc<ReplayIndex>, analyst: &str, keys: &[&str]) -> bool {
        matches!(index.verdict(analyst, keys), Verdict::Absent)
    }

    fn asks(index: &Arc<ReplayIndex>, analyst: &str, keys: &[&str]) -> bool {
        matches!(index.verdict(analyst, keys), Verdict::Ask)
    }

    #[test]
    fn payloads_round_trip_names_with_colons_and_multibyte_characters() {
        assert_eq!(parse_payload("5:aliceabc"), Some(("alice", "abc")));
        assert_eq!(parse_payload("4:a:b:k:1"), Some(("a:b:", "k:1")));
        assert_eq!(parse_payload("5:zoëyk"), Some(("zoëy", "k")));
        assert_eq!(parse_payload("3:zoëk"), None, "not on a character boundary");
        assert_eq!(parse_payload("9:short"), None);
        assert_eq!(parse_payload("alice"), None);
    }

    #[test]
    fn nothing_is_absent_until_the_index_listens_and_the_analyst_is_loaded() {
        let index = Arc::new(ReplayIndex::new());
        assert!(asks(&index, "alice", &["k"]), "not listening");
        index.listening(true);
        let Verdict::Load(token) = index.verdict("alice", &["k"]) else {
            panic!("the first lookup loads")
        };
        assert!(asks(&index, "alice", &["k"]), "loading");
        token.complete(&["other".to_string()]);
        assert!(absent(&index, "alice", &["k"]));
        assert!(asks(&index, "alice", &["k", "other"]));
        assert!(matches!(index.verdict("bob", &["k"]), Verdict::Load(_)));
    }

    #[test]
    fn notifications_during_a_load_are_kept_and_entries_queued_here_enter_at_once() {
        let index = listening();
        let Verdict::Load(token) = index.verdict("alice", &["k"]) else {
            panic!("the first lookup loads")
        };
        index.insert("alice", "notified");
        token.complete(&[]);
        assert!(asks(&index, "alice", &["notified"]));
        index.insert("alice", "queued");
        assert!(asks(&index, "alice", &["queued"]));
        index.insert("bob", "never loaded");
        let Verdict::Load(_token) = index.verdict("bob", &["never loaded"]) else {
            panic!("bob was not loaded")
        };
    }

    #[test]
    fn a_lost_connection_forgets_everything_and_discards_loads_under_way() {
        let index = listening();
        let Verdict::Load(token) = index.verdict("alice", &["k"]) else {
            panic!("the first lookup loads")
        };
        token.complete(&[]);
        let Verdict::Load(stale) = index.verdict("bob", &["k"]) else {
            panic!("the first lookup loads")
        };
        index.listening(false);
        assert!(asks(&index, "alice", &["k"]), "not listening: ask");
        index.listening(true);
        stale.complete(&[]);
        assert!(
            matches!(index.verdict("bob", &["k"]), Verdict::Load(_)),
            "the load begun before the connection ended counts for nothing"
        );
        assert!(matches!(index.verdict("alice", &["k"]), Verdict::Load(_)));
    }

    #[test]
    fn a_load_that_never_completes_leaves_the_analyst_to_the_next_lookup() {
        let index = listening();
        let Verdict::Load(token) = index.verdict("alice", &["k"]) else {
            panic!("the first lookup loads")
        };
        index.insert("alice", "notified");
        drop(token);
        assert_eq!(index.state().total, 0);
        assert!(matches!(index.verdict("alice", &["k"]), Verdict::Load(_)));
    }

    #[test]
    fn an_analyst_with_too_many_keys_is_not_indexed() {
        let index = listening();
        let Verdict::Load(token) = index.verdict("alice", &["k"]) else {
            panic!("the first lookup loads")
        };
        let keys: Vec<String> = (0..ReplayIndex::LOAD_LIMIT)
            .map(|i| i.to_string())
            .collect();
        token.complete(&keys);
        assert!(asks(&index, "alice", &["k"]));
        assert_eq!(index.state().total, 0);

        let Verdict::Load(token) = index.verdict("bob", &["k"]) else {
            panic!("the first lookup loads")
        };
        token.complete(&keys[..REPLAY_INDEX_ANALYST_KEYS_MAX]);
        assert!(absent(&index, "bob", &["k"]));
        index.insert("bob", "one more");
        assert!(asks(&index, "bob", &["k"]), "past the analyst's limit");
        assert_eq!(index.state().total, 0);
    }
}
