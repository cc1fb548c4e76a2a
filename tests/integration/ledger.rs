//! The privacy ledger against a real PostgreSQL.
//!
//! Each test creates its own database on the harness's upstream (`PGDP_TEST_UPSTREAM`, else the
//! server on 127.0.0.1:5432, else a throwaway cluster) and drops it when done, even on failure.
//! Assertions check SQLSTATE codes and exact amounts, never message text.

use std::sync::Arc;
use std::time::Duration;

use pgdp::budget::{fingerprint, Cost, Fixed, Ledger, Limit, Spent};
use pgdp::policy::Accounting;
use pgdp::Error;

use crate::harness;

/// The DDL of schema version 2, as pgdp wrote it before budget administration (frozen here: the
/// migration tests start from it).
const SCHEMA_DDL_VERSION_2: &str = "
CREATE SCHEMA IF NOT EXISTS pgdp;
CREATE TABLE IF NOT EXISTS pgdp.meta (
    key text PRIMARY KEY,
    value text NOT NULL
);
INSERT INTO pgdp.meta (key, value) VALUES ('schema_version', '2') ON CONFLICT DO NOTHING;
CREATE TABLE IF NOT EXISTS pgdp.analyst_spent (
    analyst text PRIMARY KEY,
    epsilon numeric NOT NULL DEFAULT 0 CHECK (epsilon >= 0),
    delta numeric NOT NULL DEFAULT 0 CHECK (delta >= 0),
    rho numeric NOT NULL DEFAULT 0 CHECK (rho >= 0),
    renyi numeric[],
    charges bigint NOT NULL DEFAULT 0,
    updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS pgdp.dataset_spent (
    id boolean PRIMARY KEY DEFAULT true CHECK (id),
    epsilon numeric NOT NULL DEFAULT 0 CHECK (epsilon >= 0),
    delta numeric NOT NULL DEFAULT 0 CHECK (delta >= 0),
    rho numeric NOT NULL DEFAULT 0 CHECK (rho >= 0),
    renyi numeric[],
    charges bigint NOT NULL DEFAULT 0,
    updated_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO pgdp.dataset_spent (id) VALUES (true) ON CONFLICT DO NOTHING;
CREATE TABLE IF NOT EXISTS pgdp.charge_log (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    analyst text NOT NULL,
    charged_at timestamptz NOT NULL DEFAULT now(),
    fingerprint text NOT NULL,
    mechanism text NOT NULL,
    epsilon numeric NOT NULL,
    delta numeric NOT NULL,
    rho numeric NOT NULL,
    pure_rho numeric NOT NULL DEFAULT 0,
    outcome text NOT NULL DEFAULT 'charged',
    outcome_at timestamptz
);
CREATE INDEX IF NOT EXISTS charge_log_analyst_idx ON pgdp.charge_log (analyst, charged_at);
CREATE TABLE IF NOT EXISTS pgdp.replay_cache (
    analyst text NOT NULL,
    key text NOT NULL,
    payload bytea NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (analyst, key)
);
CREATE INDEX IF NOT EXISTS replay_cache_created_at_idx ON pgdp.replay_cache (created_at);
";

fn fx(s: &str) -> Fixed {
    Fixed::from_decimal_str(s).unwrap()
}

fn is_exhausted(result: &Result<impl std::fmt::Debug, Error>) -> bool {
    matches!(result, Err(e) if e.sqlstate().code() == "53400")
}

#[tokio::test]
async fn charges_add_up_exactly_and_survive_reconnecting() {
    let db = harness::fresh_database("ledger").await;
    let limit = Limit::new(fx("1"), fx("0.00001"));
    let fp = fingerprint(&["alice", "SELECT COUNT(*) FROM visits"]);
    {
        let ledger = Ledger::connect(db.dsn()).await.unwrap();
        let mut last_id = 0;
        for i in 1..=10u64 {
            let charge = ledger
                .charge(
                    "alice",
                    &limit,
                    None,
                    &Cost::pure(fx("0.1")),
                    &fp,
                    "laplace",
                )
                .await
                .unwrap();
            let id = charge
                .id()
                .logged()
                .expect("a charge of its own has an audit id");
            assert!(id > last_id);
            last_id = id;
            assert_eq!(
                charge.balance().spent.epsilon,
                Fixed::from_units(u128::from(i) * 100_000_000_000_000_000)
            );
            ledger.set_outcome(charge.id(), "released");
        }
        // Ten tenths are exactly one: not one unit more fits.
        let refused = ledger
            .charge(
                "alice",
                &limit,
                None,
                &Cost::pure(Fixed::EPSILON_UNIT),
                &fp,
                "laplace",
            )
            .await;
        assert!(is_exhausted(&refused), "{refused:?}");
        // A zCDP charge for another analyst, alongside δ.
        ledger
            .charge(
                "bob",
                &limit,
                None,
                &Cost::approx(fx("0.25"), fx("0.000001")),
                &fp,
                "selection",
            )
            .await
            .unwrap();
        ledger
            .charge(
                "bob",
                &limit,
                None,
                &Cost::zcdp(fx("0.001")),
                &fp,
                "gaussian",
            )
            .await
            .unwrap();
        // Outcomes go through the journal, which writes them after the answer: wait for it as a
        // clean shutdown does, so the audit log read below is complete.
        ledger.return_slices(Duration::from_secs(10)).await;
    }

    // A new Ledger (a restarted process) sees the same totals.
    let ledger = Ledger::connect(db.dsn()).await.unwrap();
    let alice = ledger.balance("alice", &limit).await.unwrap();
    let alice_spent = (0..10).fold(Spent::ZERO, |s, _| s + Cost::pure(fx("0.1")));
    assert_eq!(alice.spent, alice_spent.fixed_under(&limit));
    assert_eq!(alice.spent.accounting, Some(Accounting::Mixed));
    assert_eq!(alice.spent.epsilon, Fixed::ONE);
    assert_eq!(alice.remaining.epsilon, Fixed::ZERO);
    let bob = ledger.balance("bob", &limit).await.unwrap();
    let bob_spent =
        Spent::ZERO + Cost::approx(fx("0.25"), fx("0.000001")) + Cost::zcdp(fx("0.001"));
    assert_eq!(bob.spent, bob_spent.fixed_under(&limit));
    assert_eq!(bob.remaining, pgdp::budget::remaining(&limit, &bob.spent));
    assert!(bob.remaining.epsilon < fx("0.75"));
    // Half of δ is partition selection's (the other half is the conversion's).
    assert_eq!(bob.remaining.delta, fx("0.000004"));
    let nobody = ledger.balance("carol", &limit).await.unwrap();
    assert_eq!(nobody.spent, Spent::ZERO);
    let dataset = ledger.dataset_balance(&limit).await.unwrap();
    let mut dataset_spent = alice_spent;
    for cost in [
        Cost::approx(fx("0.25"), fx("0.000001")),
        Cost::zcdp(fx("0.001")),
    ] {
        dataset_spent = dataset_spent + cost;
    }
    assert_eq!(dataset.spent, dataset_spent);

    // The audit log holds one row per admitted charge, with exact amounts and outcomes.
    let client = db.client().await;
    let rows = client
        .query(
            "SELECT analyst, epsilon::text, outcome, fingerprint FROM pgdp.charge_log ORDER BY id",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(rows.len(), 12);
    assert_eq!(rows[0].get::<_, String>(1), "0.1");
    assert_eq!(rows[0].get::<_, String>(2), "released");
    assert_eq!(rows[0].get::<_, String>(3), fp);
    assert_eq!(rows[11].get::<_, String>(2), "charged");
    let total: String = client
        .query_one(
            "SELECT epsilon::text FROM pgdp.analyst_spent WHERE analyst = 'alice'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(total, "1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_processes_never_overspend() {
    const TASKS: usize = 50;
    const AFFORDABLE: usize = 7;
    // 50 ledgers, each with its own upstream connection.
    let _exclusive = harness::exclusive().await;
    let db = Arc::new(harness::fresh_database("ledger").await);
    // A budget that affords exactly AFFORDABLE charges of 0.3 (2.1 = 7 × 0.3, which a float sum misses).
    let limit = Limit::new(fx("2.1"), Fixed::ZERO);
    let cost = Cost::pure(fx("0.3"));
    let mut tasks = Vec::new();
    for i in 0..TASKS {
        let db = Arc::clone(&db);
        tasks.push(tokio::spawn(async move {
            // Every task is its own process: its own Ledger, all created on the fresh database at
            // once (which also races the schema creation).
            let ledger = Ledger::connect(db.dsn()).await.expect("connect");
            ledger
                .charge("mallory", &limit, None, &cost, &format!("q{i}"), "laplace")
                .await
        }));
    }
    let mut admitted = 0;
    let mut exhausted = 0;
    for task in tasks {
        match task.await.unwrap() {
            Ok(charge) => {
                admitted += 1;
                assert!(charge.balance().spent.epsilon <= limit.epsilon);
            }
            Err(error) => {
                assert_eq!(error.sqlstate().code(), "53400", "{error:?}");
                exhausted += 1;
            }
        }
    }
    assert_eq!((admitted, exhausted), (AFFORDABLE, TASKS - AFFORDABLE));
    let ledger = Ledger::connect(db.dsn()).await.unwrap();
    assert_eq!(
        ledger
            .balance("mallory", &limit)
            .await
            .unwrap()
            .spent
            .epsilon,
        limit.epsilon
    );
    let logged: i64 = db
        .client()
        .await
        .query_one("SELECT count(*) FROM pgdp.charge_log", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(logged, AFFORDABLE as i64);
}

/// The race above under zCDP accounting (issue 16): Gaussian releases with Gaussian thresholding
/// (ρ and δ) from 60 processes at once are admitted exactly as many times as the Rényi filter
/// admits them one at a time, never more, and the durable totals are the exact sums.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_processes_never_overspend_in_zcdp() {
    const TASKS: usize = 60;
    let _exclusive = harness::exclusive().await;
    let db = Arc::new(harness::fresh_database("ledger_zcdp_race").await);
    let limit = Limit::new(fx("2"), fx("0.000001"));
    // σ ≈ 11 for a count in one group: ρ = 1/(2σ²) ≈ 0.004, and the δ of its thresholding.
    let cost = Cost::zcdp(fx("0.004"))
        + Cost {
            delta: fx("0.00000001"),
            ..Cost::ZERO
        };
    let affordable = pgdp::budget::accountant::repeats(&limit, &Spent::ZERO, &cost) as usize;
    // The filter, not δ, ends the run, well inside the race: 0.00000001 × 50 = δ/2.
    assert!(
        (5..TASKS - 5).contains(&affordable),
        "{affordable} charges fit: the race would not be one"
    );
    // An independent lower bound: Bun & Steinke's conversion ε = ρ + 2√(ρ ln(1/δ')) at the
    // half of δ the filter keeps for the conversion; the grid of orders is at least as tight.
    let ln = (2.0f64 / 1e-6).ln();
    let bs16 = (1..TASKS)
        .take_while(|n| {
            let rho = 0.004 * *n as f64;
            rho + 2.0 * (rho * ln).sqrt() <= 2.0
        })
        .count();
    assert!(affordable >= bs16, "{affordable} < {bs16}");
    let expected = Spent::ZERO
        .after_repeats(&cost, affordable as u64)
        .expect("no overflow");
    let mut tasks = Vec::new();
    for i in 0..TASKS {
        let db = Arc::clone(&db);
        tasks.push(tokio::spawn(async move {
            let ledger = Ledger::connect(db.dsn()).await.expect("connect");
            ledger
                .charge("mallory", &limit, None, &cost, &format!("q{i}"), "gaussian")
                .await
        }));
    }
    let (mut admitted, mut exhausted) = (0, 0);
    for task in tasks {
        match task.await.unwrap() {
            Ok(charge) => {
                admitted += 1;
                assert!(charge.balance().spent.rho <= expected.rho);
            }
            Err(error) => {
                assert_eq!(error.sqlstate().code(), "53400", "{error:?}");
                exhausted += 1;
            }
        }
    }
    assert_eq!((admitted, exhausted), (affordable, TASKS - affordable));
    let ledger = Ledger::connect(db.dsn()).await.unwrap();
    let spent = ledger.balance("mallory", &limit).await.unwrap().spent;
    assert_eq!(spent, expected.fixed_under(&limit));
    assert!(pgdp::budget::admit(&limit, &spent, &cost).is_err());
    let logged: i64 = db
        .client()
        .await
        .query_one(
            "SELECT count(*) FROM pgdp.charge_log WHERE mechanism = 'gaussian' AND rho > 0 AND epsilon = 0",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(logged, affordable as i64);
}

#[tokio::test]
async fn dataset_cap_holds_across_analysts() {
    let db = harness::fresh_database("ledger").await;
    let ledger = Ledger::connect(db.dsn()).await.unwrap();
    let each = Limit::new(fx("1"), fx("0.00001"));
    let dataset = Limit::new(fx("1.5"), fx("0.00001"));
    ledger
        .charge(
            "alice",
            &each,
            Some(&dataset),
            &Cost::pure(fx("1")),
            "f",
            "laplace",
        )
        .await
        .unwrap();
    ledger
        .charge(
            "bob",
            &each,
            Some(&dataset),
            &Cost::pure(fx("0.4")),
            "f",
            "laplace",
        )
        .await
        .unwrap();
    // Bob has 0.6 left of his own budget, but the dataset has only 0.1 left.
    let refused = ledger
        .charge(
            "bob",
            &each,
            Some(&dataset),
            &Cost::pure(fx("0.2")),
            "f",
            "laplace",
        )
        .await;
    assert!(is_exhausted(&refused), "{refused:?}");
    assert_eq!(
        ledger.balance("bob", &each).await.unwrap().spent.epsilon,
        fx("0.4")
    );
    ledger
        .charge(
            "bob",
            &each,
            Some(&dataset),
            &Cost::pure(fx("0.1")),
            "f",
            "laplace",
        )
        .await
        .unwrap();
    assert_eq!(
        ledger
            .dataset_balance(&dataset)
            .await
            .unwrap()
            .remaining
            .epsilon,
        Fixed::ZERO
    );
    // The refused charge left no trace; the analyst's own limit is still checked first.
    let refused = ledger
        .charge(
            "alice",
            &each,
            Some(&dataset),
            &Cost::pure(fx("0.01")),
            "f",
            "laplace",
        )
        .await;
    assert!(is_exhausted(&refused), "{refused:?}");
    assert_eq!(
        ledger.balance("alice", &each).await.unwrap().spent.epsilon,
        fx("1")
    );
    let logged: i64 = db
        .client()
        .await
        .query_one("SELECT count(*) FROM pgdp.charge_log", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(logged, 3);
}

/// Many sessions of one process charging at once: their charges are committed in groups (several
/// per transaction), and each must still be admitted as if alone, in some order: every admitted
/// charge sees a distinct running total, nothing is overspent, and a refusal is final because
/// totals only grow.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn group_commit_admits_each_charge_as_if_alone() {
    const PER_ANALYST: usize = 40;
    let db = harness::fresh_database("ledger").await;
    let ledger = Arc::new(Ledger::connect(db.dsn()).await.unwrap());
    let dataset = Limit::new(fx("6"), fx("0.001"));
    // (analyst, own limit, cost of each charge)
    let analysts = [
        (
            "alice",
            Limit::new(fx("2.1"), fx("0.001")),
            Cost::pure(fx("0.3")),
        ),
        (
            "bob",
            Limit::new(fx("1"), fx("0.001")),
            Cost::approx(fx("0.25"), fx("0.0001")),
        ),
        (
            "carol",
            Limit::new(fx("10"), fx("0.001")),
            Cost::pure(fx("0.5")),
        ),
    ];
    let mut tasks = Vec::new();
    for i in 0..PER_ANALYST {
        for (a, (name, limit, cost)) in analysts.iter().enumerate() {
            let ledger = Arc::clone(&ledger);
            let (name, limit, cost, dataset) = (*name, *limit, *cost, dataset);
            tasks.push(tokio::spawn(async move {
                let result = ledger
                    .charge(
                        name,
                        &limit,
                        Some(&dataset),
                        &cost,
                        &format!("q{i}"),
                        "laplace",
                    )
                    .await;
                (a, result)
            }));
        }
    }
    let mut admitted: Vec<Vec<(i64, Spent)>> = vec![Vec::new(); analysts.len()];
    for task in tasks {
        let (a, result) = task.await.unwrap();
        match result {
            Ok(charge) => {
                assert!(charge.balance().spent.epsilon <= analysts[a].1.epsilon);
                admitted[a].push((
                    charge.id().logged().expect("an audit id"),
                    charge.balance().spent,
                ));
            }
            Err(error) => assert_eq!(error.sqlstate().code(), "53400", "{error:?}"),
        }
    }

    let mut ids: Vec<i64> = admitted.iter().flatten().map(|(id, _)| *id).collect();
    ids.sort_unstable();
    ids.dedup();
    let total_admitted: usize = admitted.iter().map(Vec::len).sum();
    assert_eq!(
        ids.len(),
        total_admitted,
        "every charge has its own audit row"
    );
    let client = db.client().await;
    let mut dataset_spent = Spent::ZERO;
    for (a, (name, limit, cost)) in analysts.iter().enumerate() {
        // The running totals the admitted charges saw are exactly cost, 2·cost, …, k·cost.
        let mut seen: Vec<Spent> = admitted[a].iter().map(|(_, spent)| *spent).collect();
        seen.sort_by_key(|s| s.epsilon);
        let mut expected = Spent::ZERO;
        for spent in &seen {
            expected = (expected + *cost).fixed_under(limit);
            assert_eq!(*spent, expected, "{name}");
        }
        let balance = ledger.balance(name, limit).await.unwrap();
        assert_eq!(balance.spent, expected, "{name}");
        let charges: i64 = client
            .query_one(
                "SELECT charges FROM pgdp.analyst_spent WHERE analyst = $1",
                &[name],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(charges as usize, admitted[a].len(), "{name}");
        for _ in 0..admitted[a].len() {
            dataset_spent = dataset_spent + *cost;
        }
    }
    let dataset_balance = ledger.dataset_balance(&dataset).await.unwrap();
    assert_eq!(dataset_balance.spent, dataset_spent.fixed_under(&dataset));
    assert!(dataset_balance.spent.epsilon <= dataset.epsilon);
    // Every analyst was refused for good: one more charge fits neither its budget nor the dataset's.
    for (name, limit, cost) in &analysts {
        let own = ledger.balance(name, limit).await.unwrap();
        assert!(
            pgdp::budget::admit(limit, &own.spent, cost).is_err()
                || pgdp::budget::admit(&dataset, &dataset_balance.spent, cost).is_err(),
            "{name} was refused while its charge still fitted"
        );
    }
    // One audit row per admitted charge, in fewer transactions than charges (charged_at is the
    // transaction's start time) whenever charges queued behind a commit, as 120 at once do.
    let (logged, transactions): (i64, i64) = client
        .query_one(
            "SELECT count(*), count(DISTINCT charged_at) FROM pgdp.charge_log",
            &[],
        )
        .await
        .map(|row| (row.get(0), row.get(1)))
        .unwrap();
    assert_eq!(logged as usize, total_admitted);
    assert!(
        transactions < logged,
        "{transactions} transactions for {logged} charges"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replay_cache_first_writer_wins_and_expires() {
    let db = Arc::new(harness::fresh_database("ledger").await);
    let ledger = Arc::new(Ledger::connect(db.dsn()).await.unwrap());
    let hour = Duration::from_secs(3600);
    let key = fingerprint(&["SELECT COUNT(*) FROM visits", "epsilon=0.1"]);
    assert_eq!(ledger.replay_get("alice", &key, hour).await.unwrap(), None);
    ledger.replay_put("alice", &key, b"first").await.unwrap();
    ledger.replay_put("alice", &key, b"second").await.unwrap();
    assert_eq!(
        ledger
            .replay_get("alice", &key, hour)
            .await
            .unwrap()
            .as_ref()
            .map(pgdp::budget::Stored::bytes),
        Some(&b"first"[..])
    );
    // Keys are per analyst.
    assert_eq!(ledger.replay_get("bob", &key, hour).await.unwrap(), None);
    // A zero lifetime turns the cache off (policy `replay_lifetime_s: 0`), even for an entry
    // stored a moment ago.
    assert_eq!(
        ledger
            .replay_get("alice", &key, Duration::ZERO)
            .await
            .unwrap(),
        None
    );

    // Expiry: an entry older than the lifetime is not returned, and a fresh answer replaces it.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        ledger
            .replay_get("alice", &key, Duration::from_millis(10))
            .await
            .unwrap(),
        None
    );
    ledger.replay_put("alice", &key, b"fresh").await.unwrap();
    assert_eq!(
        ledger
            .replay_get("alice", &key, hour)
            .await
            .unwrap()
            .as_ref()
            .map(pgdp::budget::Stored::bytes),
        Some(&b"fresh"[..])
    );

    // Racing identical queries (separate processes) all end up with the same answer.
    let race_key = fingerprint(&["race"]);
    let mut tasks = Vec::new();
    for i in 0..10u8 {
        let db = Arc::clone(&db);
        let race_key = race_key.clone();
        tasks.push(tokio::spawn(async move {
            let ledger = Ledger::connect(db.dsn()).await.unwrap();
            ledger.replay_put("alice", &race_key, &[i]).await.unwrap();
            ledger
                .replay_get("alice", &race_key, hour)
                .await
                .unwrap()
                .unwrap()
        }));
    }
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.unwrap());
    }
    assert!(answers.windows(2).all(|w| w[0] == w[1]), "{answers:?}");

    assert_eq!(ledger.replay_purge(Duration::ZERO).await.unwrap(), 2);
    assert_eq!(
        ledger.replay_get("alice", &race_key, hour).await.unwrap(),
        None
    );
}

/// The replayed bytes `ledger` finds for (`analyst`, `key`) within an hour, if any.
async fn found(ledger: &Ledger, analyst: &str, key: &str) -> Option<Vec<u8>> {
    ledger
        .replay_lookup(analyst, &[key], Duration::from_secs(3600))
        .await
        .expect("the ledger answers")
        .entries
        .pop()
        .flatten()
        .map(|stored| stored.bytes().to_vec())
}

/// Polls `ledger` for (`analyst`, `key`) until it finds an entry or 5 s pass.
async fn found_soon(ledger: &Ledger, analyst: &str, key: &str) -> Option<Vec<u8>> {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let entry = found(ledger, analyst, key).await;
        if entry.is_some() || std::time::Instant::now() > deadline {
            return entry;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until `ledger`'s replay index answers a lookup of a key never stored without a round
/// trip (it listens and has read the analyst's keys), or fails after 10 s.
async fn until_the_index_skips(ledger: &Ledger, analyst: &str) {
    let before = ledger.replay_lookups_skipped();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut i = 0;
    while ledger.replay_lookups_skipped() == before {
        assert!(
            std::time::Instant::now() < deadline,
            "the replay index never answered a miss"
        );
        i += 1;
        assert_eq!(
            found(ledger, analyst, &format!("never stored {i}")).await,
            None
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Issue 44 (the replay lookup off a DP query's critical path): a ledger's replay index answers
/// lookups of keys never stored without a round trip, yet finds what another process (another
/// `Ledger` on the same database) stores, through `replay_put` and through the journal, once its
/// notification arrives; and what this process stores at once. When its listening connection is
/// killed, lookups ask the ledger again (an entry stored meanwhile is found at once) until it
/// listens again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_replay_index_skips_misses_and_sees_every_process_s_entries() {
    let db = harness::fresh_database("ledger").await;
    let here = Ledger::connect(db.dsn()).await.unwrap();
    let there = Ledger::connect(db.dsn()).await.unwrap();
    let key = |name: &str| fingerprint(&["replay index", name]);
    until_the_index_skips(&here, "alice").await;
    until_the_index_skips(&there, "alice").await;

    there
        .replay_put("alice", &key("put there"), b"one")
        .await
        .unwrap();
    assert_eq!(
        found_soon(&here, "alice", &key("put there"))
            .await
            .as_deref(),
        Some(&b"one"[..]),
        "the other process's entry is notified"
    );
    there.record_release(
        pgdp::budget::ChargeId::Logged(0),
        "alice",
        &[(key("released there").as_str(), &b"two"[..])],
    );
    assert_eq!(
        found_soon(&here, "alice", &key("released there"))
            .await
            .as_deref(),
        Some(&b"two"[..]),
        "the journal's entries are notified too"
    );
    here.replay_put("alice", &key("put here"), b"three")
        .await
        .unwrap();
    assert_eq!(
        found(&here, "alice", &key("put here")).await.as_deref(),
        Some(&b"three"[..]),
        "this process's own entry, at once"
    );
    assert_eq!(
        found(&here, "bob", &key("put here")).await,
        None,
        "per analyst"
    );

    // The listening connections die: every lookup asks the ledger until they are back.
    let admin = db.client().await;
    let killed = admin
        .query_one(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
             WHERE datname = current_database() AND query = 'LISTEN pgdp_replay'",
            &[],
        )
        .await
        .unwrap()
        .get::<_, i64>(0);
    assert_eq!(killed, 2, "one listening connection per process");
    tokio::time::sleep(Duration::from_millis(500)).await;
    there
        .replay_put("alice", &key("while deaf"), b"four")
        .await
        .unwrap();
    assert_eq!(
        found(&here, "alice", &key("while deaf")).await.as_deref(),
        Some(&b"four"[..]),
        "asked the ledger while not listening"
    );
    until_the_index_skips(&here, "alice").await;
    assert_eq!(
        found(&here, "alice", &key("while deaf")).await.as_deref(),
        Some(&b"four"[..]),
        "read again after listening again"
    );
    there
        .replay_put("alice", &key("after"), b"five")
        .await
        .unwrap();
    assert_eq!(
        found_soon(&here, "alice", &key("after")).await.as_deref(),
        Some(&b"five"[..]),
        "notified again"
    );
}

#[tokio::test]
async fn ledger_reconnects_after_losing_its_connection() {
    let db = harness::fresh_database("ledger").await;
    let ledger = Ledger::connect(db.dsn()).await.unwrap();
    let limit = Limit::new(fx("1"), Fixed::ZERO);
    ledger
        .charge(
            "alice",
            &limit,
            None,
            &Cost::pure(fx("0.5")),
            "f",
            "laplace",
        )
        .await
        .unwrap();
    // An administrator (or a failover) kills the ledger's backend.
    let admin = db.client().await;
    let killed: i64 = admin
        .query_one(
            "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity
             WHERE datname = current_database() AND application_name = 'pgdp-ledger') AS t",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(killed >= 1);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let charge = ledger
        .charge(
            "alice",
            &limit,
            None,
            &Cost::pure(fx("0.5")),
            "f",
            "laplace",
        )
        .await
        .unwrap();
    assert_eq!(charge.balance().spent.epsilon, Fixed::ONE);
}

#[tokio::test]
async fn unreachable_ledger_is_unavailable() {
    // Nothing listens on port 1.
    let result =
        Ledger::connect("host=127.0.0.1 port=1 user=postgres dbname=postgres connect_timeout=2")
            .await;
    let error = result.unwrap_err();
    assert_eq!(error, Error::LedgerUnavailable);
    assert_eq!(error.sqlstate().code(), "57P03");
    assert!(Ledger::connect("not a dsn = = =").await.is_err());
}

/// The ledger databases' DSNs are the harness's upstream with the database replaced, by
/// `dsn_with_dbname` (this test checked the ledger tests' own copy of it before they used the
/// harness).
#[test]
fn dsn_database_is_replaced() {
    use pgdp::tools::cluster::dsn_with_dbname;
    assert_eq!(
        dsn_with_dbname("host=h user=u dbname=postgres", "x"),
        "host=h user=u dbname=postgres dbname=x"
    );
    assert_eq!(
        dsn_with_dbname("postgres://u:p@h:5432/postgres?sslmode=disable", "x"),
        "postgres://u:p@h:5432/x?sslmode=disable"
    );
    assert_eq!(
        dsn_with_dbname("postgresql://u@h", "x"),
        "postgresql://u@h/x"
    );
}

/// The session spawns ledger calls on a multi-threaded runtime, so every future must be `Send`.
#[allow(dead_code)] // a compile-time check, never called
fn ledger_futures_are_send(ledger: &Ledger, limit: &Limit, cost: &Cost) {
    fn send<T: Send>(_: T) {}
    send(Ledger::connect(""));
    send(ledger.charge("a", limit, Some(limit), cost, "f", "m"));
    send(ledger.charge_leased("a", limit, None, cost, "f", "m", &[]));
    send(ledger.replay_lookup("a", &["k"], Duration::ZERO));
    send(ledger.return_slices(Duration::ZERO));
    send(ledger.charge_reading("a", limit, None, cost, "f", "m", &[]));
    send(ledger.accounts(&[]));
    send(ledger.events(&pgdp::budget::ledger::AuditFilter::default()));
    send(ledger.reset("a", "", ""));
    let request = pgdp::budget::ledger::GrantRequest {
        analyst: "a",
        epsilon: Fixed::ONE,
        delta: Fixed::ZERO,
        reason: "",
        made_by: "",
    };
    send(ledger.grant(limit, &request));
    send(ledger.balance("a", limit));
    send(ledger.dataset_balance(limit));
    send(ledger.replay_get("a", "k", Duration::ZERO));
    send(ledger.replay_put("a", "k", b""));
    send(ledger.replay_purge(Duration::ZERO));
}

/// A ledger written by schema version 1 (sums only) is migrated in place on first use: its
/// histories are read as bounded by their sums, new charges record per-order totals, and the
/// version becomes 3 (through 2).
#[tokio::test]
async fn a_version_1_ledger_is_migrated_and_bounded_by_its_sums() {
    let db = harness::fresh_database("ledger_v1").await;
    let client = db.client().await;
    let version_1 = SCHEMA_DDL_VERSION_2
        .replace("    renyi numeric[],\n", "")
        .replace("    pure_rho numeric NOT NULL DEFAULT 0,\n", "")
        .replace("'schema_version', '2'", "'schema_version', '1'");
    assert!(!version_1.contains("renyi") && !version_1.contains("pure_rho"));
    client.batch_execute(&version_1).await.unwrap();
    client
        .batch_execute(
            "INSERT INTO pgdp.analyst_spent (analyst, epsilon, delta, rho, charges)
             VALUES ('old', 0.5, 0.000001, 0.01, 3);
             UPDATE pgdp.dataset_spent SET epsilon = 0.5, delta = 0.000001, rho = 0.01, charges = 3;",
        )
        .await
        .unwrap();
    let limit = Limit::new(fx("10"), fx("0.00001"));
    let ledger = Ledger::connect(db.dsn()).await.unwrap();
    let old = ledger.balance("old", &limit).await.unwrap();
    let by_sums = Spent::from_sums(fx("0.5"), fx("0.000001"), fx("0.01"));
    assert_eq!(old.spent, by_sums);
    let version: String = client
        .query_one(
            "SELECT value FROM pgdp.meta WHERE key = 'schema_version'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        version, "6",
        "migrated through version 2 to the current one"
    );
    let charge = ledger
        .charge(
            "old",
            &limit,
            Some(&limit),
            &Cost::zcdp(fx("0.02")),
            "fp",
            "gaussian",
        )
        .await
        .unwrap();
    assert_eq!(charge.balance().spent, by_sums + Cost::zcdp(fx("0.02")));
    assert_eq!(old.spent.accounting, Some(Accounting::Mixed));
    let row = client
        .query_one(
            "SELECT renyi IS NOT NULL, (SELECT renyi IS NOT NULL FROM pgdp.dataset_spent),
                    (SELECT pure_rho::text FROM pgdp.charge_log)
             FROM pgdp.analyst_spent WHERE analyst = 'old'",
            &[],
        )
        .await
        .unwrap();
    assert!(row.get::<_, bool>(0) && row.get::<_, bool>(1));
    assert_eq!(row.get::<_, String>(2), "0");
    // A restarted process reads the same totals back.
    let again = Ledger::connect(db.dsn()).await.unwrap();
    assert_eq!(
        again.balance("old", &limit).await.unwrap().spent,
        charge.balance().spent
    );
}

/// A ledger written by schema version 2 is migrated in place to version 3 on first use: its
/// totals and charge log read as before (old charges with no tables), analysts start with no
/// grants, and grants, resets and charges that record their tables work on it.
#[tokio::test]
async fn a_version_2_ledger_is_migrated_and_keeps_working() {
    use pgdp::budget::ledger::{AuditFilter, GrantRequest};
    let db = harness::fresh_database("ledger_v2").await;
    let client = db.client().await;
    client.batch_execute(SCHEMA_DDL_VERSION_2).await.unwrap();
    let limit = Limit::new(fx("1"), fx("0.00001"));
    {
        // Written the way a version-2 pgdp wrote it: through the same statements, before the
        // columns of version 3 existed.
        client
            .batch_execute(
                "INSERT INTO pgdp.analyst_spent (analyst, epsilon, delta, rho, charges)
                 VALUES ('old', 1, 0, 0, 2);
                 UPDATE pgdp.dataset_spent SET epsilon = 1, charges = 2;
                 INSERT INTO pgdp.charge_log (analyst, fingerprint, mechanism, epsilon, delta, rho)
                 VALUES ('old', 'f1', 'laplace', 0.5, 0, 0), ('old', 'f2', 'laplace', 0.5, 0, 0);",
            )
            .await
            .unwrap();
    }
    let ledger = Ledger::connect(db.dsn()).await.unwrap();
    let version: String = client
        .query_one(
            "SELECT value FROM pgdp.meta WHERE key = 'schema_version'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(version, "6");
    let old = ledger.balance("old", &limit).await.unwrap();
    assert_eq!(old.spent.epsilon, fx("1"));
    assert_eq!(old.limit, limit, "no grants after the migration");
    assert!(is_exhausted(
        &ledger
            .charge("old", &limit, None, &Cost::pure(fx("0.1")), "f3", "laplace")
            .await
    ));
    let request = GrantRequest {
        analyst: "old",
        epsilon: fx("0.5"),
        delta: Fixed::ZERO,
        reason: "migrated",
        made_by: "test",
    };
    ledger.grant(&limit, &request).await.unwrap();
    let tables = ["demo.people".to_string()];
    let charge = ledger
        .charge_reading(
            "old",
            &limit,
            None,
            &Cost::pure(fx("0.5")),
            "f4",
            "laplace",
            &tables,
        )
        .await
        .unwrap();
    assert_eq!(charge.balance().limit, Limit::new(fx("1.5"), fx("0.00001")));
    assert_eq!(charge.balance().spent.epsilon, fx("1.5"));
    let events = ledger
        .events(&AuditFilter {
            analyst: Some("old".into()),
            rows_max: 10,
            ..AuditFilter::default()
        })
        .await
        .unwrap();
    let kinds: Vec<(&str, Vec<String>)> = events
        .iter()
        .map(|e| (e.kind.as_str(), e.tables.clone()))
        .collect();
    assert_eq!(
        kinds,
        [
            ("charge", vec![]),
            ("charge", vec![]),
            ("grant", vec![]),
            ("charge", vec!["demo.people".to_string()]),
        ]
    );
    let reset = ledger.reset("old", "", "test").await.unwrap();
    assert_eq!(
        reset.epsilon,
        fx("1.5"),
        "the admin log keeps what was zeroed"
    );
    assert_eq!(
        ledger.balance("old", &limit).await.unwrap().spent,
        Spent::ZERO
    );
    // A restarted process on the migrated ledger migrates nothing again.
    drop(ledger);
    let again = Ledger::connect(db.dsn()).await.unwrap();
    assert_eq!(
        again.balance("old", &limit).await.unwrap().limit.epsilon,
        fx("1.5")
    );
}

/// Tables named in a charge survive any text, and the grant a charge sees is the one committed
/// before it: charges and a grant racing on one analyst never admit past policy + grants.
#[tokio::test]
async fn charges_racing_a_grant_never_exceed_policy_plus_grants() {
    use pgdp::budget::ledger::GrantRequest;
    let db = harness::fresh_database("ledger_grant").await;
    let ledger = Arc::new(Ledger::connect(db.dsn()).await.unwrap());
    let limit = Limit::new(fx("1"), Fixed::ZERO);
    let odd = ["a\"b,c\\d {e}".to_string()];
    let mut tasks = Vec::new();
    for i in 0..40 {
        let ledger = Arc::clone(&ledger);
        let odd = odd.clone();
        tasks.push(tokio::spawn(async move {
            ledger
                .charge_reading(
                    "racer",
                    &limit,
                    None,
                    &Cost::pure(fx("0.1")),
                    &format!("q{i}"),
                    "laplace",
                    &odd,
                )
                .await
                .is_ok()
        }));
    }
    let granted = ledger
        .grant(
            &limit,
            &GrantRequest {
                analyst: "racer",
                epsilon: fx("1"),
                delta: Fixed::ZERO,
                reason: "",
                made_by: "test",
            },
        )
        .await
        .unwrap();
    assert_eq!(granted.epsilon, fx("1"));
    let mut admitted = 0;
    for task in tasks {
        admitted += usize::from(task.await.unwrap());
    }
    // At least the policy's 10 fit; never more than the 20 that policy + grant allow.
    assert!((10..=20).contains(&admitted), "{admitted}");
    let balance = ledger.balance("racer", &limit).await.unwrap();
    assert_eq!(
        balance.spent.epsilon,
        fx("0.1").checked_mul_int(admitted as u64).unwrap()
    );
    assert_eq!(balance.limit.epsilon, fx("2"));
    let client = db.client().await;
    let tables: Vec<String> = client
        .query_one("SELECT tables FROM pgdp.charge_log LIMIT 1", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(tables, odd);
}

/// Microseconds in a day.
const DAY_US: i64 = 86_400_000_000;

/// The ledger server's clock now, in microseconds since the Unix epoch.
async fn server_now_us(db: &harness::TestDb) -> i64 {
    db.client()
        .await
        .query_one("SELECT (extract(epoch FROM now()) * 1000000)::int8", &[])
        .await
        .unwrap()
        .get(0)
}

/// A clock offset that puts `ledger`'s clock 10 seconds before the next midnight UTC; returns
/// that midnight (microseconds since the Unix epoch).
async fn ten_seconds_before_midnight(db: &harness::TestDb, ledger: &Ledger) -> (i64, i64) {
    let now = server_now_us(db).await;
    let midnight = (now.div_euclid(DAY_US) + 1) * DAY_US;
    let offset = midnight - 10_000_000 - now;
    ledger.set_test_clock_offset(offset);
    (midnight, offset)
}

/// (window start in µs, ε, charges) of every window row of `analyst` (the dataset's for
/// `None`), oldest first.
async fn window_rows(db: &harness::TestDb, analyst: Option<&str>) -> Vec<(i64, Fixed, i64)> {
    let client = db.client().await;
    let rows = match analyst {
        Some(a) => client
            .query(
                "SELECT (extract(epoch FROM window_start) * 1000000)::int8, epsilon::text, charges
                 FROM pgdp.analyst_window_spent WHERE analyst = $1 ORDER BY window_start",
                &[&a],
            )
            .await
            .unwrap(),
        None => client
            .query(
                "SELECT (extract(epoch FROM window_start) * 1000000)::int8, epsilon::text, charges
                 FROM pgdp.dataset_window_spent ORDER BY window_start",
                &[],
            )
            .await
            .unwrap(),
    };
    rows.iter()
        .map(|r| (r.get(0), fx(&r.get::<_, String>(1)), r.get(2)))
        .collect()
}

/// Renewing budgets (issue 16 part 4), the analyst's: a budget of ε = 1 per day admits ε = 1
/// in the last seconds of a day, refuses more, and admits again right after midnight UTC; the
/// old day's window keeps its totals at the limit, the whole history counts both, a reset
/// zeroes only the current window, and a budget without a period is not renewed.
#[tokio::test]
async fn a_daily_budget_renews_at_midnight_utc_and_keeps_the_old_window() {
    use pgdp::policy::Period;
    let db = harness::fresh_database("ledger_renew").await;
    let ledger = Ledger::connect(db.dsn()).await.unwrap();
    let daily = Limit::new(fx("1"), fx("0.00001")).per(Some(Period::Day));
    let forever = Limit::new(fx("1"), fx("0.00001"));
    let half = Cost::pure(fx("0.5"));
    let (midnight, offset) = ten_seconds_before_midnight(&db, &ledger).await;

    for (i, analyst) in ["alice", "alice", "bob", "bob"].into_iter().enumerate() {
        let limit = if analyst == "alice" { &daily } else { &forever };
        let charge = ledger
            .charge(analyst, limit, None, &half, &format!("q{i}"), "laplace")
            .await
            .unwrap();
        if analyst == "alice" {
            let window = charge.window().expect("a renewing budget has a window");
            assert_eq!(
                (window.start_us, window.end_us),
                (midnight - DAY_US, midnight)
            );
        } else {
            assert_eq!(charge.window(), None);
        }
    }
    for (analyst, limit) in [("alice", &daily), ("bob", &forever)] {
        let refused = ledger
            .charge(analyst, limit, None, &half, "again", "laplace")
            .await;
        assert!(is_exhausted(&refused), "{analyst}: {refused:?}");
    }

    // Twenty seconds later it is the next day: alice's budget renews, bob's does not.
    ledger.set_test_clock_offset(offset + 20_000_000);
    let (before, window) = ledger.balance_with_window("alice", &daily).await.unwrap();
    assert_eq!(before.spent, Spent::ZERO);
    assert_eq!(window.map(|w| w.start_us), Some(midnight));
    let charge = ledger
        .charge("alice", &daily, None, &half, "next day", "laplace")
        .await
        .unwrap();
    assert_eq!(charge.balance().spent.epsilon, fx("0.5"));
    assert_eq!(charge.balance().remaining.epsilon, fx("0.5"));
    assert!(is_exhausted(
        &ledger
            .charge("bob", &forever, None, &half, "next day", "laplace")
            .await
    ));
    assert_eq!(
        window_rows(&db, Some("alice")).await,
        [(midnight - DAY_US, fx("1"), 2), (midnight, fx("0.5"), 1)],
        "the old window stays at its limit"
    );
    assert!(window_rows(&db, Some("bob")).await.is_empty());
    // The whole history is kept: ε = 1.5 for alice, in the totals and the audit log.
    let whole = ledger.balance("alice", &forever).await.unwrap();
    assert_eq!(whole.spent.epsilon, fx("1.5"));
    let client = db.client().await;
    let logged: String = client
        .query_one(
            "SELECT sum(epsilon)::text FROM pgdp.charge_log WHERE analyst = 'alice'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(fx(&logged), fx("1.5"));

    // A reset zeroes the current window and leaves the old one alone.
    ledger.reset("alice", "renewal test", "test").await.unwrap();
    assert_eq!(
        ledger.balance("alice", &daily).await.unwrap().spent,
        Spent::ZERO
    );
    assert_eq!(
        window_rows(&db, Some("alice")).await,
        [(midnight - DAY_US, fx("1"), 2), (midnight, fx("0"), 0)]
    );
}

/// Renewing budgets, the dataset's: a dataset cap of ε = 1 per day shared by analysts with
/// budgets that never renew refuses a third analyst before midnight (scope dataset) and admits
/// it after; the old day's dataset window stays at the cap.
#[tokio::test]
async fn a_daily_dataset_cap_renews_at_midnight_utc() {
    use pgdp::policy::Period;
    let db = harness::fresh_database("ledger_renew_dataset").await;
    let ledger = Ledger::connect(db.dsn()).await.unwrap();
    let each = Limit::new(fx("5"), fx("0.00001"));
    let dataset = Limit::new(fx("1"), fx("0.00001")).per(Some(Period::Day));
    let half = Cost::pure(fx("0.5"));
    let (midnight, offset) = ten_seconds_before_midnight(&db, &ledger).await;
    for analyst in ["alice", "bob"] {
        ledger
            .charge(analyst, &each, Some(&dataset), &half, analyst, "laplace")
            .await
            .unwrap();
    }
    let refused = ledger
        .charge("carol", &each, Some(&dataset), &half, "carol", "laplace")
        .await;
    assert!(is_exhausted(&refused), "{refused:?}");
    let (day_balance, window) = ledger.dataset_balance_with_window(&dataset).await.unwrap();
    assert_eq!(day_balance.spent.epsilon, fx("1"));
    assert_eq!(window.map(|w| w.end_us), Some(midnight));

    ledger.set_test_clock_offset(offset + 20_000_000);
    assert_eq!(
        ledger.dataset_balance(&dataset).await.unwrap().spent,
        Spent::ZERO
    );
    let carol = ledger
        .charge("carol", &each, Some(&dataset), &half, "carol", "laplace")
        .await
        .unwrap();
    // carol's own budget never renews: her balance is of the whole history.
    assert_eq!(carol.window(), None);
    assert_eq!(carol.balance().spent.epsilon, fx("0.5"));
    assert_eq!(
        window_rows(&db, None).await,
        [(midnight - DAY_US, fx("1"), 2), (midnight, fx("0.5"), 1)]
    );
    // The dataset's whole history counts everything.
    let whole = ledger
        .dataset_balance(&Limit::new(fx("100"), Fixed::ZERO))
        .await
        .unwrap();
    assert_eq!(whole.spent.epsilon, fx("1.5"));
}

/// A ledger of schema version 4 (as pgdp wrote it before renewing budgets: no window tables, no
/// window columns on `pgdp.lease`) is migrated in place to version 5 on first use and keeps its
/// totals; budgets without a period read exactly as before and renewing ones work at once.
#[tokio::test]
async fn a_version_4_ledger_is_migrated_and_keeps_its_totals() {
    use pgdp::policy::Period;
    let db = harness::fresh_database("ledger_v4").await;
    let client = db.client().await;
    {
        // A version-4 ledger: today's tables without what version 5 added.
        let creator = Ledger::connect(db.dsn()).await.unwrap();
        drop(creator);
        client
            .batch_execute(
                "DROP TABLE pgdp.analyst_window_spent, pgdp.dataset_window_spent;
                 ALTER TABLE pgdp.lease DROP COLUMN window_period, DROP COLUMN window_start,
                     DROP COLUMN dataset_window_period, DROP COLUMN dataset_window_start;
                 UPDATE pgdp.meta SET value = '4' WHERE key = 'schema_version';
                 INSERT INTO pgdp.analyst_spent (analyst, epsilon, delta, rho, renyi, charges)
                 VALUES ('old', 0.75, 0, 0, NULL, 3);
                 UPDATE pgdp.dataset_spent SET epsilon = 0.75, charges = 3;",
            )
            .await
            .unwrap();
    }
    let ledger = Ledger::connect(db.dsn()).await.unwrap();
    let version: String = client
        .query_one(
            "SELECT value FROM pgdp.meta WHERE key = 'schema_version'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(version, "6");
    let limit = Limit::new(fx("1"), Fixed::ZERO);
    let old = ledger.balance("old", &limit).await.unwrap();
    assert_eq!(
        old.spent,
        Spent::from_sums(fx("0.75"), Fixed::ZERO, Fixed::ZERO)
    );
    let dataset = ledger.dataset_balance(&limit).await.unwrap();
    assert_eq!(dataset.spent.epsilon, fx("0.75"));
    // Without a period nothing changed: 0.5 more does not fit.
    assert!(is_exhausted(
        &ledger
            .charge("old", &limit, None, &Cost::pure(fx("0.5")), "f", "laplace")
            .await
    ));
    // The same analyst under a daily budget starts a fresh window at once.
    let daily = limit.per(Some(Period::Day));
    let charge = ledger
        .charge("old", &daily, None, &Cost::pure(fx("0.5")), "f", "laplace")
        .await
        .unwrap();
    assert_eq!(charge.balance().spent.epsilon, fx("0.5"));
    assert_eq!(
        ledger.balance("old", &limit).await.unwrap().spent.epsilon,
        fx("1.25"),
        "the whole history keeps the migrated totals"
    );
    let columns: i64 = client
        .query_one(
            "SELECT count(*) FROM information_schema.columns
             WHERE table_schema = 'pgdp' AND table_name = 'lease' AND column_name LIKE '%window%'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(columns, 4);
}

/// A version-5 ledger gains the synopsis tables (version 6), and their protocol holds: the first
/// start's total is the one kept, a round is counted before its update and never past T, an
/// update outside a started round is refused, another declaration is another synopsis, and a
/// pass exists only for a recorded payment, which a charge of the synopsis's cost makes.
#[tokio::test]
async fn a_version_5_ledger_gains_the_synopsis_tables_and_their_protocol_holds() {
    let db = harness::fresh_database("ledger_v5").await;
    let client = db.client().await;
    {
        let creator = Ledger::connect(db.dsn()).await.unwrap();
        drop(creator);
        client
            .batch_execute(
                "DROP TABLE pgdp.synopsis, pgdp.synopsis_payment;
                 UPDATE pgdp.meta SET value = '5' WHERE key = 'schema_version';",
            )
            .await
            .unwrap();
    }
    let ledger = Ledger::connect(db.dsn()).await.unwrap();
    let version: String = client
        .query_one(
            "SELECT value FROM pgdp.meta WHERE key = 'schema_version'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(version, "6");
    assert!(ledger.synopsis_state("cube", "fp").await.unwrap().is_none());
    let first = ledger.synopsis_create("cube", "fp", 1000).await.unwrap();
    let again = ledger.synopsis_create("cube", "fp", 5).await.unwrap();
    assert_eq!(
        (first.total, again.total),
        (1000, 1000),
        "the first start wins"
    );
    assert!(
        ledger
            .synopsis_measure("cube", "fp", &[1, 2], 7)
            .await
            .is_err(),
        "an update outside a started round"
    );
    let round = ledger
        .synopsis_begin_round("cube", "fp", 2)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(round.rounds_started, 1);
    ledger
        .synopsis_measure("cube", "fp", &[1, 2], -7)
        .await
        .unwrap();
    let round = ledger
        .synopsis_begin_round("cube", "fp", 2)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (round.rounds_started, round.measurements),
        (2, vec![(vec![1, 2], -7)])
    );
    assert!(
        ledger
            .synopsis_begin_round("cube", "fp", 2)
            .await
            .unwrap()
            .is_none(),
        "never past T"
    );
    assert!(ledger
        .synopsis_state("cube", "other")
        .await
        .unwrap()
        .is_none());
    assert!(ledger
        .synopsis_pass("cube", "fp", "alice")
        .await
        .unwrap()
        .is_none());
    let declared = pgdp::policy::Synopsis {
        name: "cube".into(),
        table: "s.t".into(),
        columns: vec![("k".into(), vec!["a".into(), "b".into()])],
        epsilon: 1.0,
        rounds: 2,
        accuracy: 10.0,
        rows_per_unit: 1,
    };
    let statement = pgdp::dp::release::SynopsisStatement::of(&declared).unwrap();
    let limit = Limit::new(fx("10"), Fixed::ZERO);
    let charged = ledger
        .charge_for("alice", &limit, None, statement, "f", "pmw", &[])
        .await
        .unwrap();
    let pass = ledger
        .synopsis_paid_with("cube", "fp", "alice", charged)
        .await
        .unwrap();
    assert_eq!((pass.synopsis(), pass.analyst()), ("cube", "alice"));
    assert!(ledger
        .synopsis_pass("cube", "fp", "alice")
        .await
        .unwrap()
        .is_some());
    assert!(ledger
        .synopsis_pass("cube", "fp", "bob")
        .await
        .unwrap()
        .is_none());
    assert_eq!(
        ledger.balance("alice", &limit).await.unwrap().spent.epsilon,
        fx("1")
    );
}

/// Totals written before the GDP member (the `renyi` array ends with the zCDP total) are read
/// with no GDP total when they hold a Gaussian charge (drawn then with the discrete Gaussian,
/// which is not known to be GDP), and with π·(zCDP total) when they hold only pure ε; the next
/// charge writes the GDP total, and an old Gaussian history goes on charging by the other
/// members.
#[tokio::test]
async fn totals_written_before_the_gdp_member_count_no_discrete_gaussian_charge_as_gdp() {
    use pgdp::budget::accountant::ORDER_COUNT;
    let db = harness::fresh_database("ledger_gdp").await;
    let client = db.client().await;
    let ledger = Ledger::connect(db.dsn()).await.unwrap();
    let old_totals = |zcdp: &str| format!("{{{}{zcdp}}}", "0.1,".repeat(ORDER_COUNT));
    client
        .execute(
            "INSERT INTO pgdp.analyst_spent (analyst, epsilon, delta, rho, renyi, charges)
             VALUES ('gaussian', 0, 0, 0.05, $1::text::numeric[], 1),
                    ('pure', 0.5, 0, 0, $2::text::numeric[], 1)",
            &[&old_totals("0.05"), &old_totals("0.125")],
        )
        .await
        .unwrap();
    let limit = Limit::new(fx("10"), fx("0.000001"));
    let gaussian = ledger.balance("gaussian", &limit).await.unwrap().spent;
    assert_eq!((gaussian.gdp, gaussian.zcdp), (Fixed::MAX, fx("0.05")));
    let pure = ledger.balance("pure", &limit).await.unwrap().spent;
    let pure_gdp = Cost {
        pure_rho: fx("0.125"),
        ..Cost::ZERO
    }
    .gaussian_dp();
    assert_eq!(pure.gdp, pure_gdp);
    // A Gaussian charge adds 2ρ to the GDP total, which is stored after the zCDP total.
    let charged = ledger
        .charge(
            "pure",
            &limit,
            None,
            &Cost::zcdp(fx("0.01")),
            "f",
            "gaussian",
        )
        .await
        .unwrap();
    assert_eq!(charged.balance().spent.gdp, pure_gdp + fx("0.02"));
    let stored: i32 = client
        .query_one(
            "SELECT cardinality(renyi) FROM pgdp.analyst_spent WHERE analyst = 'pure'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    // The totals, the zCDP total, the GDP total and the rule: an old history is mixed.
    assert_eq!(stored as usize, ORDER_COUNT + 3);
    assert_eq!(pure.accounting, Some(Accounting::Mixed));
    assert_eq!(charged.balance().spent.accounting, Some(Accounting::Mixed));
    assert_eq!(
        ledger.balance("pure", &limit).await.unwrap().spent,
        charged.balance().spent
    );
    // The old Gaussian history charges on (zCDP member, orders) and still has no GDP total.
    let after = ledger
        .charge(
            "gaussian",
            &limit,
            None,
            &Cost::zcdp(fx("0.01")),
            "f",
            "gaussian",
        )
        .await
        .unwrap();
    assert!(after.balance().spent.gdp > fx("1000000000"));
}

/// Gaussian counts at σ = 5.39 charged to `analyst` until the first refusal: the first under
/// `first`, the rest under `then`; through lease slices when `leased`.
async fn counts_admitted(
    ledger: &Ledger,
    analyst: &str,
    first: &Limit,
    then: &Limit,
    leased: bool,
) -> u32 {
    let count = Cost::zcdp(Fixed::from_f64_ceil(1.0 / (2.0 * 5.39 * 5.39)).unwrap());
    let mut admitted = 0u32;
    loop {
        let limit = if admitted == 0 { first } else { then };
        let fingerprint = format!("q{admitted}");
        let charged: Result<(), Error> = if leased {
            ledger
                .charge_leased(analyst, limit, None, &count, &fingerprint, "gaussian", &[])
                .await
                .map(drop)
        } else {
            ledger
                .charge(analyst, limit, None, &count, &fingerprint, "gaussian")
                .await
                .map(drop)
        };
        match charged {
            Ok(()) => admitted += 1,
            Err(e) if e.sqlstate().code() == "53400" => return admitted,
            Err(e) => panic!("charge failed: {e}"),
        }
    }
}

/// A history keeps the accounting rule of its first charge (docs/privacy.md, "Two rules"): the
/// ledger stores it with the totals, through group commits and lease slices alike, so a policy
/// that changes a budget's `accounting` applies only to histories that start afterwards (here
/// after a reset).
#[tokio::test]
async fn a_history_keeps_its_accounting_rule_when_the_policy_changes() {
    let db = harness::fresh_database("ledger_rule").await;
    let client = db.client().await;
    let ledger = Ledger::connect(db.dsn()).await.unwrap();
    let mixed = Limit::new(fx("10"), fx("0.000001"));
    let gaussian = mixed.under(Accounting::Gaussian);
    // Issue 45's counts: 95 under the Gaussian rule, 91 under the mixed one, whatever the
    // limit says after the first charge.
    assert_eq!(
        counts_admitted(&ledger, "g", &gaussian, &mixed, false).await,
        95
    );
    assert_eq!(
        counts_admitted(&ledger, "m", &mixed, &gaussian, false).await,
        91
    );
    let code = |analyst: &'static str| {
        let client = &client;
        async move {
            client
                .query_one(
                    "SELECT renyi[cardinality(renyi)]::int FROM pgdp.analyst_spent WHERE analyst = $1",
                    &[&analyst],
                )
                .await
                .unwrap()
                .get::<_, i32>(0)
        }
    };
    assert_eq!((code("g").await, code("m").await), (2, 1));
    let balance = ledger.balance("g", &mixed).await.unwrap();
    assert_eq!(balance.spent.accounting, Some(Accounting::Gaussian));
    // A reset starts a new history, under the rule the policy has now.
    ledger.reset("g", "rule change", "test").await.unwrap();
    assert_eq!(code("g").await, 0);
    assert_eq!(
        counts_admitted(&ledger, "g", &mixed, &mixed, false).await,
        91
    );
    // Lease slices fix the rule as charges do.
    let leasing = Ledger::connect(db.dsn()).await.unwrap();
    leasing.set_lease_queries(16);
    assert_eq!(
        counts_admitted(&leasing, "l", &gaussian, &mixed, true).await,
        95
    );
    assert_eq!(code("l").await, 2);
}
