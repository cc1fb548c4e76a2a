//! Budget leases (issue 19 part 4) on a real ledger: two `Ledger`s stand for two pgdp processes
//! (each has its own slices, connections and journal; they share only the database), so the
//! races, the exact exhaustion and the reset are checked without the wire. The process-level
//! tests (SIGKILL mid-slice, two `pgdp serve` processes racing) are in `replicas`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use pgdp::budget::{Cost, Fixed, Ledger, Limit};

use crate::harness::{self, TestDb};

fn fx(s: &str) -> Fixed {
    Fixed::from_decimal_str(s).expect("a valid amount")
}

async fn ledger(db: &TestDb, lease_queries: u64) -> Ledger {
    let ledger = Ledger::connect(db.dsn()).await.expect("connect the ledger");
    ledger.set_lease_queries(lease_queries);
    ledger
}

/// The analyst's durable ε total, as the ledger row holds it (reservations included).
async fn durable_epsilon(db: &TestDb, analyst: &str) -> Fixed {
    let client = db.client().await;
    let row = client
        .query_one(
            "SELECT epsilon::text FROM pgdp.analyst_spent WHERE analyst = $1",
            &[&analyst],
        )
        .await
        .expect("read the totals");
    Fixed::from_numeric_text(&row.get::<_, String>(0)).expect("an amount")
}

/// Waits until the journal has written `n` audit rows for `analyst` (it writes after the
/// answer), then returns their ε sum.
async fn audit_rows(db: &TestDb, analyst: &str, n: i64) -> Fixed {
    let client = db.client().await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let row = client
            .query_one(
                "SELECT count(*), coalesce(sum(epsilon), 0)::text FROM pgdp.charge_log WHERE analyst = $1",
                &[&analyst],
            )
            .await
            .expect("read the audit log");
        if row.get::<_, i64>(0) == n {
            return Fixed::from_numeric_text(&row.get::<_, String>(1)).expect("an amount");
        }
        assert!(
            row.get::<_, i64>(0) < n,
            "more audit rows than charges: {}",
            row.get::<_, i64>(0)
        );
        assert!(
            Instant::now() < deadline,
            "the journal never wrote {n} rows"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn is_exhausted(result: &pgdp::Result<pgdp::budget::Receipt>) -> bool {
    matches!(result, Err(e) if e.sqlstate().code() == "53400")
}

/// One process: every charge up to the last unit of budget is admitted and the next is refused,
/// with far fewer durable commits than charges; the durable totals, the audit rows and the
/// slices all agree once the slices are returned.
#[tokio::test]
async fn one_process_spends_the_budget_exactly_with_few_commits() {
    let db = harness::fresh_database("lease_one").await;
    let ledger = ledger(&db, 64).await;
    let limit = Limit::new(fx("20"), Fixed::ZERO);
    let cost = Cost::pure(fx("0.1"));
    let mut answered = 0;
    loop {
        let charged = ledger
            .charge_leased(
                "ann",
                &limit,
                None,
                &cost,
                &format!("q{answered}"),
                "laplace",
                &[],
            )
            .await;
        if is_exhausted(&charged) {
            break;
        }
        let receipt = charged.expect("charged under a slice");
        answered += 1;
        // The balance each receipt shows is the true one: this process's unused reservation is
        // not counted as spent.
        assert_eq!(
            receipt.balance().spent.epsilon,
            fx("0.1").checked_mul_int(answered).expect("small")
        );
        assert!(answered <= 200, "more than the budget affords");
    }
    assert_eq!(answered, 200, "exactly 20 / 0.1 charges");
    let client = db.client().await;
    let slices: i64 = client
        .query_one("SELECT count(*) FROM pgdp.lease WHERE analyst = 'ann'", &[])
        .await
        .expect("count slices")
        .get(0);
    assert!(
        slices < 40,
        "{slices} durable reservations for 200 charges: slices should batch them"
    );
    // Near exhaustion slices shrink to one charge: the last slice reserved exactly one.
    let last: i64 = client
        .query_one(
            "SELECT queries FROM pgdp.lease WHERE analyst = 'ann' ORDER BY id DESC LIMIT 1",
            &[],
        )
        .await
        .expect("last slice")
        .get(0);
    assert_eq!(last, 1);
    assert_eq!(durable_epsilon(&db, "ann").await, fx("20"));
    assert_eq!(audit_rows(&db, "ann", 200).await, fx("20"));
    ledger.return_slices(Duration::from_secs(5)).await;
    let open: i64 = client
        .query_one(
            "SELECT count(*) FROM pgdp.lease WHERE closed_at IS NULL",
            &[],
        )
        .await
        .expect("open slices")
        .get(0);
    assert_eq!(open, 0);
    let used: i64 = client
        .query_one("SELECT sum(charges)::int8 FROM pgdp.lease", &[])
        .await
        .expect("charges under slices")
        .get(0);
    assert_eq!(used, 200);
    drop(client);
    db.drop_db().await;
}

/// Two processes racing for one analyst's budget never overspend together; once both return
/// their slices, charging one by one reaches exactly the last affordable query.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_never_overspend_and_reach_the_exact_end() {
    let db = harness::fresh_database("lease_race").await;
    let (a, b) = (
        Arc::new(ledger(&db, 64).await),
        Arc::new(ledger(&db, 64).await),
    );
    let limit = Limit::new(fx("10"), Fixed::ZERO);
    let cost = Cost::pure(fx("0.25"));
    let mut tasks = Vec::new();
    for i in 0..120 {
        let ledger = Arc::clone(if i % 2 == 0 { &a } else { &b });
        tasks.push(tokio::spawn(async move {
            ledger
                .charge_leased("bo", &limit, None, &cost, &format!("q{i}"), "laplace", &[])
                .await
        }));
    }
    let mut answered = 0u64;
    for task in tasks {
        let charged = task.await.expect("task");
        if !is_exhausted(&charged) {
            charged.expect("charged or refused for budget");
            answered += 1;
        }
    }
    assert!(answered <= 40, "{answered} charges of 0.25 within 10");
    assert!(
        fx("0.25").checked_mul_int(answered).expect("small") <= durable_epsilon(&db, "bo").await,
        "the durable totals cover every charge made"
    );
    // Both return their slices (a clean shutdown); then one by one, alternating, to the end.
    a.return_slices(Duration::from_secs(5)).await;
    b.return_slices(Duration::from_secs(5)).await;
    assert_eq!(
        durable_epsilon(&db, "bo").await,
        fx("0.25").checked_mul_int(answered).expect("small"),
        "returned slices leave exactly what was charged"
    );
    let mut turn = 0;
    loop {
        let ledger = if turn % 2 == 0 { &a } else { &b };
        turn += 1;
        let charged = ledger
            .charge_leased("bo", &limit, None, &cost, "again", "laplace", &[])
            .await;
        if is_exhausted(&charged) {
            // The other process's slice may hold the rest: it returns it, then tries.
            ledger.return_slices(Duration::from_secs(5)).await;
            let other = if turn % 2 == 0 { &a } else { &b };
            other.return_slices(Duration::from_secs(5)).await;
            let retry = other
                .charge_leased("bo", &limit, None, &cost, "again", "laplace", &[])
                .await;
            if is_exhausted(&retry) {
                break;
            }
            retry.expect("charged");
        } else {
            charged.expect("charged");
        }
        answered += 1;
        assert!(answered <= 40);
    }
    assert_eq!(answered, 40, "exactly 10 / 0.25 charges in all");
    a.return_slices(Duration::from_secs(5)).await;
    b.return_slices(Duration::from_secs(5)).await;
    assert_eq!(durable_epsilon(&db, "bo").await, fx("10"));
    assert_eq!(audit_rows(&db, "bo", 40).await, fx("10"));
    db.drop_db().await;
}

/// A reset while another process holds a slice keeps the slice's reservation counted (that
/// process may still charge under it); when the slice is returned, what was used under it stays.
#[tokio::test]
async fn a_reset_keeps_open_slices_counted() {
    let db = harness::fresh_database("lease_reset").await;
    let holder = ledger(&db, 64).await;
    let admin = ledger(&db, 1).await;
    let limit = Limit::new(fx("100"), Fixed::ZERO);
    let cost = Cost::pure(fx("1"));
    holder
        .charge_leased("cy", &limit, None, &cost, "q", "laplace", &[])
        .await
        .expect("charged");
    // 100 / 1 fits 100 times: the slice reserved a quarter of them.
    assert_eq!(durable_epsilon(&db, "cy").await, fx("25"));
    // The holder does not count its own unused reservation; another process does.
    assert_eq!(
        holder
            .balance("cy", &limit)
            .await
            .expect("balance")
            .spent
            .epsilon,
        fx("1")
    );
    assert_eq!(
        admin
            .balance("cy", &limit)
            .await
            .expect("balance")
            .spent
            .epsilon,
        fx("25")
    );
    admin.reset("cy", "test", "tester").await.expect("reset");
    assert_eq!(durable_epsilon(&db, "cy").await, fx("25"));
    holder
        .charge_leased("cy", &limit, None, &cost, "q2", "laplace", &[])
        .await
        .expect("charged under the same slice");
    holder.return_slices(Duration::from_secs(5)).await;
    // Both charges were made under the slice that was open at the reset.
    assert_eq!(durable_epsilon(&db, "cy").await, fx("2"));
    db.drop_db().await;
}

/// With leases off (`--lease-queries 1`) every charge is its own durable commit: no slices, and
/// the audit row is written in the charge's transaction.
#[tokio::test]
async fn leases_off_charges_each_query_on_its_own() {
    let db = harness::fresh_database("lease_off").await;
    let ledger = ledger(&db, 1).await;
    let limit = Limit::new(fx("10"), Fixed::ZERO);
    for i in 0..3 {
        let receipt = ledger
            .charge_leased(
                "di",
                &limit,
                None,
                &Cost::pure(fx("1")),
                &format!("q{i}"),
                "laplace",
                &[],
            )
            .await
            .expect("charged");
        assert!(receipt.id().logged().is_some());
    }
    let client = db.client().await;
    let row = client
        .query_one(
            "SELECT (SELECT count(*) FROM pgdp.lease), (SELECT count(*) FROM pgdp.charge_log WHERE lease_id IS NULL)",
            &[],
        )
        .await
        .expect("count");
    assert_eq!((row.get::<_, i64>(0), row.get::<_, i64>(1)), (0, 3));
    assert_eq!(durable_epsilon(&db, "di").await, fx("3"));
    drop(client);
    db.drop_db().await;
}

/// Microseconds in a day.
const DAY_US: i64 = 86_400_000_000;

/// Puts `ledgers`' clocks 10 seconds before the next midnight UTC (by the ledger server's
/// clock); returns that midnight and the offset (microseconds).
async fn before_midnight(db: &TestDb, ledgers: &[&Ledger]) -> (i64, i64) {
    let now: i64 = db
        .client()
        .await
        .query_one("SELECT (extract(epoch FROM now()) * 1000000)::int8", &[])
        .await
        .expect("the server's clock")
        .get(0);
    let midnight = (now.div_euclid(DAY_US) + 1) * DAY_US;
    let offset = midnight - 10_000_000 - now;
    for ledger in ledgers {
        ledger.set_test_clock_offset(offset);
    }
    (midnight, offset)
}

/// (window start, ε) of the analyst's daily windows, oldest first.
async fn day_windows(db: &TestDb, analyst: &str) -> Vec<(i64, Fixed)> {
    db.client()
        .await
        .query(
            "SELECT (extract(epoch FROM window_start) * 1000000)::int8, epsilon::text
             FROM pgdp.analyst_window_spent WHERE analyst = $1 AND period = 'day'
             ORDER BY window_start",
            &[&analyst],
        )
        .await
        .expect("read the windows")
        .iter()
        .map(|r| (r.get(0), fx(&r.get::<_, String>(1))))
        .collect()
}

/// Renewing budgets under leases (issue 16 part 4): a slice reserved in the last seconds of a
/// day is never charged under after midnight. The first charge after midnight closes it, its
/// unused part going back to the old day, and reserves a new slice in the new day; the old
/// day's window ends with exactly what was charged in it. Near exhaustion at the boundary, no
/// day's window goes past its limit.
#[tokio::test]
async fn a_slice_reserved_before_midnight_is_not_spent_after_it() {
    use pgdp::policy::Period;
    let db = harness::fresh_database("lease_renew").await;
    let holder = ledger(&db, 64).await;
    let (midnight, offset) = before_midnight(&db, &[&holder]).await;
    let daily = Limit::new(fx("100"), Fixed::ZERO).per(Some(Period::Day));
    let cost = Cost::pure(fx("1"));
    for i in 0..3 {
        holder
            .charge_leased("ed", &daily, None, &cost, &format!("q{i}"), "laplace", &[])
            .await
            .expect("charged");
    }
    // One slice of 25 reserved in the old day.
    assert_eq!(
        day_windows(&db, "ed").await,
        [(midnight - DAY_US, fx("25"))]
    );

    holder.set_test_clock_offset(offset + 20_000_000);
    let receipt = holder
        .charge_leased("ed", &daily, None, &cost, "after", "laplace", &[])
        .await
        .expect("charged in the new day");
    assert_eq!(receipt.window().map(|w| w.start_us), Some(midnight));
    assert_eq!(receipt.balance().spent.epsilon, fx("1"));
    // The old slice closed with its 3 charges; the new day holds a new reservation.
    assert_eq!(
        day_windows(&db, "ed").await,
        [(midnight - DAY_US, fx("3")), (midnight, fx("25"))]
    );
    // A reset in the new day keeps the open slice's reservation counted in its window and
    // leaves the old day alone.
    let admin = ledger(&db, 1).await;
    admin.set_test_clock_offset(offset + 20_000_000);
    admin.reset("ed", "test", "tester").await.expect("reset");
    assert_eq!(
        day_windows(&db, "ed").await,
        [(midnight - DAY_US, fx("3")), (midnight, fx("25"))]
    );
    holder.return_slices(Duration::from_secs(5)).await;
    assert_eq!(
        day_windows(&db, "ed").await,
        [(midnight - DAY_US, fx("3")), (midnight, fx("1"))]
    );
    assert_eq!(
        durable_epsilon(&db, "ed").await,
        fx("1"),
        "reset, then the slice's one charge"
    );
    assert_eq!(audit_rows(&db, "ed", 4).await, fx("4"));

    // A budget of 2 per day, spent to the end on both sides of midnight.
    let tight = Limit::new(fx("2"), Fixed::ZERO).per(Some(Period::Day));
    holder.set_test_clock_offset(offset);
    let mut admitted = 0;
    for i in 0..3 {
        let result = holder
            .charge_leased("fy", &tight, None, &cost, &format!("a{i}"), "laplace", &[])
            .await;
        if i < 2 {
            result.expect("within the old day's budget");
            admitted += 1;
        } else {
            assert!(is_exhausted(&result), "{result:?}");
        }
    }
    holder.set_test_clock_offset(offset + 20_000_000);
    for i in 0..3 {
        let result = holder
            .charge_leased("fy", &tight, None, &cost, &format!("b{i}"), "laplace", &[])
            .await;
        if i < 2 {
            result.expect("within the new day's budget");
            admitted += 1;
        } else {
            assert!(is_exhausted(&result), "{result:?}");
        }
    }
    assert_eq!(admitted, 4);
    holder.return_slices(Duration::from_secs(5)).await;
    assert_eq!(
        day_windows(&db, "fy").await,
        [(midnight - DAY_US, fx("2")), (midnight, fx("2"))]
    );
    db.drop_db().await;
}

/// A process that dies holding a slice reserved before midnight leaves it spent in the old
/// day: another process charging after midnight neither sees nor returns it, and the old day's
/// window keeps the whole reservation.
#[tokio::test]
async fn a_slice_left_open_by_a_crash_stays_spent_in_its_day() {
    use pgdp::policy::Period;
    let db = harness::fresh_database("lease_renew_crash").await;
    let crashed = ledger(&db, 64).await;
    let survivor = ledger(&db, 64).await;
    let (midnight, offset) = before_midnight(&db, &[&crashed, &survivor]).await;
    let daily = Limit::new(fx("100"), Fixed::ZERO).per(Some(Period::Day));
    let cost = Cost::pure(fx("1"));
    crashed
        .charge_leased("gu", &daily, None, &cost, "q", "laplace", &[])
        .await
        .expect("charged");
    // Dies: its slice is never returned.
    drop(crashed);
    survivor.set_test_clock_offset(offset + 20_000_000);
    survivor
        .charge_leased("gu", &daily, None, &cost, "q2", "laplace", &[])
        .await
        .expect("charged in the new day");
    survivor.return_slices(Duration::from_secs(5)).await;
    assert_eq!(
        day_windows(&db, "gu").await,
        [(midnight - DAY_US, fx("25")), (midnight, fx("1"))]
    );
    db.drop_db().await;
}
