//! The plan cache: each DP statement's analysis and rewrite, kept per process and per policy
//! generation (it lives in [`super::Shared`], which a reload replaces), so that a statement sent
//! again (a dashboard's reload, an ORM's repeated count, a replay) is not analysed and
//! rewritten again: ~40 µs of a small query's CPU.
//!
//! Invariants:
//! - An entry is the `(Plan, Rewrite)` that analysis, the plan's adjustments and the rewrite
//!   returned for an equal key: the statement as parsed (after the time-constant fold), the
//!   search path, the bound parameters, the listed key, the group-choice secret; the policy is
//!   the generation's. The key also names the analyst: one analyst's entries are never another's
//!   hits, so how fast a statement is planned tells no analyst what another has asked. So a hit
//!   gives the same plan and rewrite, value for value, as the miss would have computed.
//! - A plan whose outputs are named by the select list's aliases and by nothing else (no
//!   post-processing SQL) is kept under the statement with each output alias named nowhere
//!   else in the text made positional (`pgdp_c0`, …, as the shadow catalog's descriptions
//!   are), so a tool that numbers its aliases per query (a dashboard, the bench's fresh
//!   aliases) hits; a hit takes the statement's own output names ([`Plan::rename_outputs`]).
//!   Such an alias is only a name: the upstream SQL never holds it, and analysis reads it
//!   nowhere else (checked over the golden corpus by the session's
//!   `statements_differing_only_in_unused_aliases_plan_alike_but_for_names`).
//! - Only plans made when every upstream fact they consult was known are kept (the session
//!   decides: [`PlanCache::put`] is called only then); known facts never change within a
//!   generation, so nothing kept depends on a fact learnt later.
//! - Refusals are never kept; nothing budget- or setting-dependent is (mechanisms are made from
//!   the plan on every query).
//! - Bounded: at most [`crate::limits::PLANS_CACHED_MAX`] entries, of statements at most
//!   [`crate::limits::PLAN_CACHE_TEXT_MAX`] bytes; a poisoned lock costs a recomputation. No I/O.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use crate::dp::plan::Plan;
use crate::dp::rewrite::Rewrite;
use crate::limits::{PLANS_CACHED_MAX, PLAN_CACHE_TEXT_MAX};

/// What a statement's analysis and rewrite depend on besides the policy.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct PlanKey(String);

impl PlanKey {
    /// The key of `statement` (its parsed text) planned for `analyst` under `search_path`
    /// with `params` bound, the listed key `listed` (its debug text) and the group-choice
    /// `secret`; `None` for a statement too long to keep.
    pub(super) fn new(
        analyst: &str,
        statement: &str,
        search_path: &[String],
        params: &[Option<String>],
        listed: Option<String>,
        secret: &str,
    ) -> Option<PlanKey> {
        if statement.len() > PLAN_CACHE_TEXT_MAX {
            return None;
        }
        // Unit separators cannot occur in an identifier of the search path or be confused with
        // the parts' own text: each part is prefixed by its length.
        let mut key = String::with_capacity(statement.len() + 64);
        let mut part = |text: &str| {
            key.push_str(&text.len().to_string());
            key.push(':');
            key.push_str(text);
        };
        part(analyst);
        part(statement);
        part(&search_path.join(","));
        for p in params {
            match p {
                Some(value) => part(value),
                None => part("\u{0}NULL"),
            }
        }
        part(&listed.unwrap_or_default());
        part(secret);
        Some(PlanKey(key))
    }
}

/// The cache.
#[derive(Debug, Default)]
pub struct PlanCache {
    entries: Mutex<Entries>,
}

#[derive(Debug, Default)]
struct Entries {
    by_key: HashMap<PlanKey, (Plan, Rewrite)>,
    /// Keys, oldest first.
    order: VecDeque<PlanKey>,
}

impl PlanCache {
    /// The plan and rewrite kept for `key`, if any.
    pub(super) fn get(&self, key: &PlanKey) -> Option<(Plan, Rewrite)> {
        self.entries.lock().ok()?.by_key.get(key).cloned()
    }

    /// Keeps `plan` and `rewrite` for `key`, forgetting the oldest entry when full.
    pub(super) fn put(&self, key: PlanKey, plan: &Plan, rewrite: &Rewrite) {
        let Ok(mut entries) = self.entries.lock() else {
            return;
        };
        if entries.by_key.contains_key(&key) {
            return;
        }
        while entries.order.len() >= PLANS_CACHED_MAX {
            let Some(oldest) = entries.order.pop_front() else {
                break;
            };
            entries.by_key.remove(&oldest);
        }
        entries.order.push_back(key.clone());
        entries.by_key.insert(key, (plan.clone(), rewrite.clone()));
    }

    /// How many entries are kept.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.lock().map_or(0, |e| e.by_key.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_tell_every_part_apart() {
        let key = |s: &str, p: &[Option<String>], l: Option<&str>, secret: &str| {
            PlanKey::new("a", s, &["demo".into()], p, l.map(str::to_string), secret)
        };
        let base = key("SELECT 1", &[Some("1".into())], None, "s");
        assert_eq!(base, key("SELECT 1", &[Some("1".into())], None, "s"));
        for other in [
            key("SELECT 2", &[Some("1".into())], None, "s"),
            key("SELECT 1", &[Some("2".into())], None, "s"),
            key("SELECT 1", &[None], None, "s"),
            key("SELECT 1", &[Some("1".into()), None], None, "s"),
            key("SELECT 1", &[Some("1".into())], Some("k"), "s"),
            key("SELECT 1", &[Some("1".into())], None, "t"),
            PlanKey::new(
                "a",
                "SELECT 1",
                &["public".into()],
                &[Some("1".into())],
                None,
                "s",
            ),
            PlanKey::new(
                "b",
                "SELECT 1",
                &["demo".into()],
                &[Some("1".into())],
                None,
                "s",
            ),
            // A part's text that looks like the next part's boundary.
            key("SELECT 1", &[Some("1".into())], None, "1:s"),
        ] {
            assert_ne!(base, other);
        }
        assert_eq!(
            PlanKey::new(
                "a",
                &"x".repeat(PLAN_CACHE_TEXT_MAX + 1),
                &[],
                &[],
                None,
                ""
            ),
            None
        );
    }

    #[test]
    fn a_full_cache_forgets_its_oldest_entry() {
        let policy = crate::session::demo_policy();
        let ctx = crate::dp::plan::Context {
            policy: &policy,
            search_path: vec!["demo".to_string()],
        };
        let query = match crate::session::classify::classify("SELECT COUNT(*) FROM demo.people")
            .expect("parses")
            .pop()
        {
            Some(crate::session::classify::Statement::Query(q)) => q,
            _ => panic!("not a query"),
        };
        let plan = crate::dp::analyze::analyze(&query, &ctx).expect("plan");
        let rewrite = crate::dp::rewrite::rewrite(&plan, &[], "secret").expect("rewrite");
        let cache = PlanCache::default();
        let key =
            |i: usize| PlanKey::new("a", &format!("q{i}"), &[], &[], None, "").expect("short");
        for i in 0..=PLANS_CACHED_MAX {
            cache.put(key(i), &plan, &rewrite);
        }
        assert_eq!(cache.len(), PLANS_CACHED_MAX);
        assert!(cache.get(&key(0)).is_none());
        let (p, r) = cache.get(&key(PLANS_CACHED_MAX)).expect("kept");
        assert_eq!((p, r), (plan, rewrite));
    }
}
