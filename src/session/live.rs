//! The server's shared state across policy reloads (SIGHUP, `pgdp reload`).
//!
//! [`Live`] holds the current [`Shared`] and swaps it whole when a new policy is loaded: the
//! upstream, the ledger and the facts learnt from the upstream's catalog carry over; the policy,
//! the shadow catalog built from it, its declared unique keys (verified before the swap) and
//! the group-choice secret are the new policy's.
//!
//! Invariants:
//! - A statement sees one policy from start to end: the front end takes [`Live::current`] once
//!   per protocol message and passes that snapshot down, so a reload in the middle of a
//!   statement changes nothing about it (its analysis, its charge and its release all use the
//!   policy it started with).
//! - Only a validated [`Policy`] can be loaded (the type has no other constructor than
//!   validation), and the swap is all or nothing: a policy that fails validation never reaches
//!   [`Live::reload`], and one that [`Live::reload`] refuses (another logical database name, a
//!   declared unique key the upstream holds a value of twice) leaves the current one in force.
//! - Each reload bumps the generation. A session compares its generation with the snapshot's
//!   before every statement ([`super::Session::follow_policy`]): an analyst the new policy still
//!   lists continues under the new budget, caps and tables; a removed one's sessions end with
//!   57P01, and idle connections are ended as soon as the generation changes (the front end
//!   watches [`Live::subscribe`]).
//! - Nothing is refunded or reset by a reload: spent totals live in the ledger, keyed by analyst
//!   name, so an analyst removed and added back again continues from what they had spent.

use std::collections::BTreeSet;
use std::sync::{Arc, RwLock};

use tokio::sync::watch;

use super::Shared;
use crate::error::{Error, Result};
use crate::policy::Policy;

/// The current [`Shared`], replaced whole by a reload.
#[derive(Debug)]
pub struct Live {
    current: RwLock<Arc<Shared>>,
    generation: watch::Sender<u64>,
    /// Serialises reloads, so two at once cannot interleave their shadow builds.
    reloading: tokio::sync::Mutex<()>,
}

/// What a reload changed, for the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reloaded {
    /// The new generation (the first policy is generation 0).
    pub generation: u64,
    /// Analysts the new policy adds.
    pub added: Vec<String>,
    /// Analysts the new policy removes: their sessions are ended.
    pub removed: Vec<String>,
    /// Tables the new policy adds or removes (schema-qualified).
    pub tables_added: Vec<String>,
    /// Tables the new policy no longer lists.
    pub tables_removed: Vec<String>,
}

impl Live {
    /// The state of a server at start (generation 0).
    pub fn new(shared: Shared) -> Live {
        shared
            .upstream
            .set_statement_timeout(timeout_ms(&shared.policy));
        let (generation, _) = watch::channel(shared.generation);
        Live {
            current: RwLock::new(Arc::new(shared)),
            generation,
            reloading: tokio::sync::Mutex::new(()),
        }
    }

    /// The current state: take it once per message and use that snapshot throughout.
    pub fn current(&self) -> Arc<Shared> {
        // Every write is a single assignment of a complete value: a poisoned lock still holds
        // a consistent one.
        match self.current.read() {
            Ok(guard) => guard.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Notified of every reload, with the new generation.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.generation.subscribe()
    }

    /// Puts `policy` in force for every statement that starts from now on. The shadow catalog
    /// is rebuilt for it before the swap (a failure to build it is logged, and catalog queries
    /// retry it, as at start). Refused, changing nothing, if the policy serves another logical
    /// database (clients connected to the old name would otherwise be answered for the new
    /// one), or if it declares a unique key (`unique_keys`) that a read of its table finds a
    /// value of twice; a key that cannot be read now is verified on first need.
    pub async fn reload(&self, policy: Policy) -> Result<Reloaded> {
        let _one_at_a_time = self.reloading.lock().await;
        let old = self.current();
        if policy.database != old.policy.database {
            return Err(Error::forbidden(
                format!(
                    "a reload cannot change the database pgdp serves (from \"{}\" to \"{}\")",
                    old.policy.database, policy.database
                ),
                "Restart pgdp to serve another database.",
            ));
        }
        let shadow = old.shadow.as_ref().map(|s| s.for_policy(&policy));
        if let Some(shadow) = &shadow {
            if let Err(e) = shadow.ensure().await {
                tracing::warn!(error = %e, "reload: no shadow catalog for the new policy yet; catalog queries will retry it");
            }
        }
        let reloaded = changes(&old.policy, &policy, old.generation + 1);
        let next = old.successor(policy, shadow);
        match next.upstream.verify_declared_keys(&next.column_facts).await {
            Ok(duplicated) if !duplicated.is_empty() => {
                let keys: Vec<String> =
                    duplicated.iter().map(|(t, c)| format!("{t}.{c}")).collect();
                return Err(Error::forbidden(
                    format!(
                        "the new policy declares {} unique, but the upstream holds a value of each twice: the reload is refused and the current policy stays in force",
                        keys.join(", ")
                    ),
                    "Remove the duplicate values upstream, or drop the column from its table's unique_keys, and reload again.",
                ));
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = %e, "reload: cannot verify the new policy's declared unique keys: they are verified on first need")
            }
        }
        next.upstream
            .set_statement_timeout(timeout_ms(&next.policy));
        match self.current.write() {
            Ok(mut guard) => *guard = Arc::new(next),
            Err(poisoned) => *poisoned.into_inner() = Arc::new(next),
        }
        self.generation.send_replace(reloaded.generation);
        Ok(reloaded)
    }
}

/// The policy's `statement_timeout_s`, in milliseconds.
fn timeout_ms(policy: &crate::policy::Policy) -> u64 {
    u64::try_from(policy.statement_timeout.as_millis()).unwrap_or(u64::MAX)
}

/// The analysts and tables that differ between two policies.
fn changes(old: &Policy, new: &Policy, generation: u64) -> Reloaded {
    let difference = |a: &BTreeSet<String>, b: &BTreeSet<String>| -> Vec<String> {
        a.difference(b).cloned().collect()
    };
    let old_analysts: BTreeSet<String> = old.analysts.keys().cloned().collect();
    let new_analysts: BTreeSet<String> = new.analysts.keys().cloned().collect();
    let old_tables: BTreeSet<String> = old.tables.values().map(|t| t.qualified_name()).collect();
    let new_tables: BTreeSet<String> = new.tables.values().map(|t| t.qualified_name()).collect();
    Reloaded {
        generation,
        added: difference(&new_analysts, &old_analysts),
        removed: difference(&old_analysts, &new_analysts),
        tables_added: difference(&new_tables, &old_tables),
        tables_removed: difference(&old_tables, &new_tables),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const VERIFIER: &str = "SCRAM-SHA-256$4096:cGdkcC10ZXN0LXNhbHQtMQ==$r6rs3eSqXnnzDaEwb3G617CNh9NDVFxQd+xPmWnxk4M=:mYmZ1VMmQU332cWdfJ/Ftq/OUxAAVBM4FRMHVqONj4s=";

    fn policy(analysts: &[&str], tables: &str) -> Policy {
        let mut text = String::from("database: d\nanalysts:\n");
        for a in analysts {
            text.push_str(&format!(
                "  {a}:\n    scram_verifier: \"{VERIFIER}\"\n    budget: {{ epsilon: 1, delta: 1.0e-6 }}\n"
            ));
        }
        text.push_str(tables);
        crate::policy::parse(&text).expect("valid test policy")
    }

    const PEOPLE: &str = "tables:\n  s.people:\n    kind: private\n    privacy_unit: id\n    max_groups_per_unit: 1\n    max_rows_per_unit: 1\n    columns:\n      id: { type: bigint }\n";
    const REGIONS: &str =
        "  s.regions:\n    kind: public\n    columns:\n      name: { type: text }\n";

    #[test]
    fn changes_name_the_analysts_and_tables_added_and_removed() {
        let old = policy(&["alice", "bob"], PEOPLE);
        let new = policy(&["bob", "carol"], &format!("{PEOPLE}{REGIONS}"));
        assert_eq!(
            changes(&old, &new, 3),
            Reloaded {
                generation: 3,
                added: vec!["carol".into()],
                removed: vec!["alice".into()],
                tables_added: vec!["s.regions".into()],
                tables_removed: vec![],
            }
        );
    }
}
