//! The `--metrics` endpoint, scraped over HTTP from a pgdp started in process: the counters and
//! histograms move with the statements run through the wire (a DP query, its replay, a refusal,
//! a catalog query, a failed login), every sample line is well formed, no label carries a value
//! of the data; `/health` answers 200, and 503 naming the ledger when the ledger cannot be
//! reached, and 200 while every pooled upstream connection is busy; other paths are 404, and a client that sends nothing stalls no one else.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::Duration;

use pgdp::server::{self, Config, Options};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_postgres::error::SqlState;

use crate::harness;
use crate::support::{
    assert_code, demo_policy, upstream_client, Proxy, ANALYST, DATABASE, PASSWORD,
};

/// How long one HTTP exchange with the endpoint may take.
const HTTP_TIMEOUT: Duration = Duration::from_secs(15);

/// An HTTP answer: status code and body.
struct Answer {
    status: u16,
    head: String,
    body: String,
}

/// Sends `request` as it is and reads the whole answer (the endpoint closes after one).
async fn exchange(addr: SocketAddr, request: &[u8]) -> Answer {
    let run = async {
        let mut socket = TcpStream::connect(addr).await.expect("connect to /metrics");
        socket.write_all(request).await.expect("send the request");
        let mut raw = Vec::new();
        socket.read_to_end(&mut raw).await.expect("read the answer");
        raw
    };
    let raw = tokio::time::timeout(HTTP_TIMEOUT, run)
        .await
        .expect("the metrics endpoint answered in time");
    let text = String::from_utf8(raw).expect("a UTF-8 answer");
    let (head, body) = text.split_once("\r\n\r\n").expect("a head and a body");
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {head:?}"));
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("Content-Length: "))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no Content-Length in {head:?}"));
    assert_eq!(length, body.len(), "Content-Length matches the body");
    Answer {
        status,
        head: head.to_string(),
        body: body.to_string(),
    }
}

async fn get(addr: SocketAddr, path: &str) -> Answer {
    exchange(
        addr,
        format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n").as_bytes(),
    )
    .await
}

/// One sample of the exposition: its name, labels and value.
#[derive(Debug)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// Parses one sample line of the text format, or says why it is not one.
fn parse_sample(line: &str) -> Result<Sample, String> {
    let name_end = line
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .ok_or("no value")?;
    let name = &line[..name_end];
    if name.is_empty() || name.starts_with(|c: char| c.is_ascii_digit()) {
        return Err("bad metric name".into());
    }
    let mut rest = &line[name_end..];
    let mut labels = BTreeMap::new();
    if let Some(after) = rest.strip_prefix('{') {
        let mut chars = after.char_indices().peekable();
        let end = loop {
            let Some(&(start, c)) = chars.peek() else {
                return Err("unterminated label set".into());
            };
            if c == '}' {
                break start + 1;
            }
            // A label name, `=`, a quoted value with \\ \" \n escapes, then `,` or `}`.
            let mut key = String::new();
            while let Some(&(_, c)) = chars.peek() {
                if c.is_ascii_alphanumeric() || c == '_' {
                    key.push(c);
                    chars.next();
                } else {
                    break;
                }
            }
            if key.is_empty() || key.starts_with(|c: char| c.is_ascii_digit()) {
                return Err("bad label name".into());
            }
            if chars.next().map(|(_, c)| c) != Some('=')
                || chars.next().map(|(_, c)| c) != Some('"')
            {
                return Err("label without =\"".into());
            }
            let mut value = String::new();
            loop {
                match chars.next().map(|(_, c)| c) {
                    None => return Err("unterminated label value".into()),
                    Some('"') => break,
                    Some('\\') => match chars.next().map(|(_, c)| c) {
                        Some('\\') => value.push('\\'),
                        Some('"') => value.push('"'),
                        Some('n') => value.push('\n'),
                        _ => return Err("bad escape".into()),
                    },
                    Some(c) => value.push(c),
                }
            }
            if labels.insert(key, value).is_some() {
                return Err("repeated label".into());
            }
            match chars.peek().map(|&(_, c)| c) {
                Some(',') => {
                    chars.next();
                }
                Some('}') => {}
                _ => return Err("labels not separated by ,".into()),
            }
        };
        rest = &after[end..];
    }
    let rest = rest.strip_prefix(' ').ok_or("no space before the value")?;
    let mut fields = rest.split(' ');
    let value = fields.next().ok_or("no value")?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        "NaN" => f64::NAN,
        v => v
            .parse()
            .map_err(|_| format!("value {v:?} is not a number"))?,
    };
    // An optional timestamp; nothing more (pgdp records no exemplars).
    if let Some(ts) = fields.next() {
        ts.parse::<f64>().map_err(|_| "bad timestamp")?;
    }
    if fields.next().is_some() {
        return Err("trailing fields".into());
    }
    Ok(Sample {
        name: name.to_string(),
        labels,
        value,
    })
}

/// A scrape: every sample line parsed (the test fails on the first that does not parse), and
/// the comment lines checked (HELP and TYPE of each family, `# EOF` last).
struct Scrape {
    samples: Vec<Sample>,
}

impl Scrape {
    async fn of(addr: SocketAddr) -> Scrape {
        let answer = get(addr, "/metrics").await;
        assert_eq!(answer.status, 200, "{}", answer.body);
        assert!(
            answer
                .head
                .contains("Content-Type: application/openmetrics-text; version=1.0.0"),
            "{}",
            answer.head
        );
        let mut samples = Vec::new();
        let mut helped = BTreeSet::new();
        let mut typed = BTreeSet::new();
        let lines: Vec<&str> = answer.body.lines().collect();
        assert_eq!(lines.last(), Some(&"# EOF"), "the exposition ends in # EOF");
        for line in &lines[..lines.len() - 1] {
            if let Some(help) = line.strip_prefix("# HELP ") {
                let (name, text) = help.split_once(' ').expect("HELP name text");
                assert!(!text.is_empty(), "{line}");
                helped.insert(name.to_string());
            } else if let Some(ty) = line.strip_prefix("# TYPE ") {
                let (name, kind) = ty.split_once(' ').expect("TYPE name kind");
                assert!(["counter", "gauge", "histogram"].contains(&kind), "{line}");
                typed.insert(name.to_string());
            } else if let Some(unit) = line.strip_prefix("# UNIT ") {
                let (name, unit) = unit.split_once(' ').expect("UNIT name unit");
                assert!(name.ends_with(&format!("_{unit}")), "{line}");
            } else {
                let sample =
                    parse_sample(line).unwrap_or_else(|e| panic!("malformed sample {line:?}: {e}"));
                assert!(
                    sample.name.starts_with("pgdp_"),
                    "a sample outside pgdp's namespace: {line}"
                );
                samples.push(sample);
            }
        }
        assert_eq!(helped, typed, "every family has HELP and TYPE");
        for sample in &samples {
            assert!(
                typed
                    .iter()
                    .any(|family| sample.name.starts_with(family.as_str())),
                "sample {} of no family",
                sample.name
            );
        }
        Scrape { samples }
    }

    /// The value of the sample `name` whose labels include `labels` (0 if there is none).
    fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let found: Vec<&Sample> = self
            .samples
            .iter()
            .filter(|s| {
                s.name == name
                    && s.labels.len() == labels.len()
                    && labels
                        .iter()
                        .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
            })
            .collect();
        assert!(found.len() <= 1, "{name} {labels:?} appears twice");
        found.first().map_or(0.0, |s| s.value)
    }

    /// How many observations the stage's histogram holds.
    fn stage_count(&self, stage: &str) -> f64 {
        self.value("pgdp_stage_duration_seconds_count", &[("stage", stage)])
    }

    fn statements(&self, outcome: &str, class: &str) -> f64 {
        self.value(
            "pgdp_statements_total",
            &[("outcome", outcome), ("sqlstate_class", class)],
        )
    }
}

/// pgdp over the demo data with a metrics endpoint on a free port.
async fn proxy_with_metrics(seed: u8) -> Proxy {
    Proxy::with_options(
        demo_policy(),
        seed,
        Options {
            metrics: Some("127.0.0.1:0".into()),
            ..Options::default()
        },
    )
    .await
}

#[tokio::test]
async fn a_scrape_counts_dp_refused_and_catalog_statements_and_their_stages() {
    let proxy = proxy_with_metrics(41).await;
    let addr = proxy.metrics_addr();
    let before = Scrape::of(addr).await;
    for stage in [
        "parse", "analyse", "rewrite", "ledger", "upstream", "release",
    ] {
        assert_eq!(before.stage_count(stage), 0.0, "{stage} before any query");
    }

    let wrong = proxy.try_connect(ANALYST, "wrong-password", DATABASE).await;
    assert_code(
        wrong.map(|_| ()),
        &SqlState::INVALID_PASSWORD,
        "a wrong password",
    );
    let session = proxy.connect().await;
    let dp = "SELECT region, COUNT(*) FROM demo.people GROUP BY region";
    session.simple_query(dp).await.expect("a DP query");
    session
        .simple_query(dp)
        .await
        .expect("the same query again");
    assert_code(
        session.simple_query("SELECT * FROM demo.people").await,
        &SqlState::INSUFFICIENT_PRIVILEGE,
        "SELECT * of a private table",
    );
    session
        .simple_query(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'demo'",
        )
        .await
        .expect("a catalog query");

    let after = Scrape::of(addr).await;
    let moved = |f: &dyn Fn(&Scrape) -> f64| f(&after) - f(&before);
    assert_eq!(moved(&|s| s.statements("answered_dp", "00")), 1.0);
    assert_eq!(moved(&|s| s.statements("replayed", "00")), 1.0);
    assert_eq!(moved(&|s| s.statements("refused", "42")), 1.0);
    assert_eq!(moved(&|s| s.statements("catalog", "00")), 1.0);
    assert_eq!(moved(&|s| s.statements("error", "57")), 0.0);

    // One parse per message. Analysis and rewrite: twice for the first DP query (again once
    // this process has learnt that the unit column is unique, `Session::plan_dp`), and not for
    // its replay, planned from the plan cache (`session::plans`); the refusal stops inside
    // analysis, which records no time. The ledger: one lookup
    // (the answer and the noisy measures together) and the charge, then the replay's lookup. The
    // upstream and the release once.
    let stages: Vec<f64> = [
        "parse", "analyse", "rewrite", "ledger", "upstream", "release",
    ]
    .iter()
    .map(|stage| moved(&|s| s.stage_count(stage)))
    .collect();
    assert_eq!(
        stages,
        vec![4.0, 2.0, 2.0, 3.0, 1.0, 1.0],
        "parse, analyse, rewrite, ledger, upstream, release"
    );
    let bucket = |s: &Scrape, le: &str| {
        s.value(
            "pgdp_stage_duration_seconds_bucket",
            &[("stage", "upstream"), ("le", le)],
        )
    };
    assert_eq!(
        bucket(&after, "+Inf"),
        1.0,
        "the +Inf bucket holds every observation"
    );

    let lookups = |s: &Scrape, cache: &str, result: &str| {
        s.value(
            "pgdp_replay_lookups_total",
            &[("cache", cache), ("result", result)],
        )
    };
    assert_eq!(lookups(&after, "answer", "miss"), 1.0);
    assert_eq!(lookups(&after, "answer", "hit"), 1.0);
    assert_eq!(lookups(&after, "measures", "miss"), 1.0);

    // The demo analyst's default ε is 1 and GROUP BY a public key spends no δ.
    let analyst = [("analyst", ANALYST)];
    assert_eq!(after.value("pgdp_charges_total", &analyst), 1.0);
    assert_eq!(after.value("pgdp_charged_epsilon_total", &analyst), 1.0);
    assert_eq!(after.value("pgdp_charged_delta_total", &analyst), 0.0);
    assert_eq!(after.value("pgdp_budget_spent_epsilon", &analyst), 1.0);
    assert_eq!(
        session.budget().await.epsilon_spent,
        after.value("pgdp_budget_spent_epsilon", &analyst),
        "the gauge is the ledger's spent budget"
    );

    assert_eq!(moved(&|s| s.value("pgdp_logins_failed_total", &[])), 1.0);
    assert_eq!(
        moved(&|s| s.value("pgdp_connections_accepted_total", &[])),
        2.0
    );
    // The refused login's connection closes on its own time: wait for it.
    let mut open = after.value("pgdp_connections_open", &[]);
    for _ in 0..50 {
        if open == 1.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        open = Scrape::of(addr).await.value("pgdp_connections_open", &[]);
    }
    assert_eq!(open, 1.0, "the analyst's one connection is open");
    drop(session);

    // No label value is a value of the data: every distinct text value of the demo tables.
    let upstream = upstream_client().await;
    let data: BTreeSet<String> = upstream
        .query(
            "SELECT region FROM demo.regions UNION SELECT name FROM demo.regions \
             UNION SELECT DISTINCT sex FROM demo.people UNION SELECT DISTINCT education FROM demo.people \
             UNION SELECT DISTINCT clinic FROM demo.visits UNION SELECT DISTINCT diagnosis FROM demo.visits \
             UNION SELECT DISTINCT drug FROM demo.prescriptions \
             UNION SELECT COUNT(*)::text FROM demo.people",
            &[],
        )
        .await
        .expect("the demo data's text values")
        .iter()
        .filter_map(|row| row.get::<_, Option<String>>(0))
        .collect();
    assert!(data.len() > 10, "the demo data has text values: {data:?}");
    for sample in &after.samples {
        for (key, value) in &sample.labels {
            assert!(
                !data.contains(value),
                "label {key}={value:?} of {} is a value of the data",
                sample.name
            );
        }
    }
    proxy.stop().await;
}

/// Issue 44: once the process's replay index listens and holds the analyst's keys, a new DP
/// query (none of its keys stored) skips the ledger lookup, and the scrape counts it; a
/// repeated one still finds its replay.
#[tokio::test]
async fn the_replay_index_s_skipped_lookups_are_counted() {
    let proxy = proxy_with_metrics(7).await;
    let addr = proxy.metrics_addr();
    let session = proxy.connect().await;
    session
        .batch_execute("SET pgdp.epsilon = 0.05")
        .await
        .expect("SET");
    let skips = || async {
        Scrape::of(addr)
            .await
            .value("pgdp_replay_index_skips_total", &[])
    };
    assert_eq!(skips().await, 0.0);
    let mut asked = 0;
    while skips().await == 0.0 {
        assert!(
            asked < 40,
            "no lookup skipped the ledger in {asked} new queries"
        );
        session
            .simple_rows(&format!(
                "SELECT COUNT(*) FROM demo.people WHERE age > {asked}"
            ))
            .await
            .expect("a new query");
        asked += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let last = format!("SELECT COUNT(*) FROM demo.people WHERE age > {}", asked - 1);
    session.take_notices();
    session.simple_rows(&last).await.expect("replayed");
    assert!(
        session
            .take_notices()
            .iter()
            .any(|n| n.contains("replay cache")),
        "the identical query is still replayed"
    );
    proxy.stop().await;
}

#[tokio::test]
async fn health_is_200_and_other_paths_are_404() {
    let proxy = proxy_with_metrics(42).await;
    let addr = proxy.metrics_addr();
    let health = get(addr, "/health").await;
    assert_eq!(health.status, 200, "{}", health.body);
    assert!(health.body.contains("upstream: ok"), "{}", health.body);
    assert!(health.body.contains("ledger: ok"), "{}", health.body);

    for path in ["/", "/metricsx", "/health/", "/../metrics"] {
        assert_eq!(get(addr, path).await.status, 404, "GET {path}");
    }
    let post = exchange(addr, b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n").await;
    assert_eq!(post.status, 404, "POST /metrics");
    assert_eq!(
        exchange(addr, b"GET /metrics\r\n\r\n").await.status,
        400,
        "a request line without a version"
    );
    let huge = format!(
        "GET /metrics HTTP/1.1\r\nX-Padding: {}\r\n\r\n",
        "a".repeat(pgdp::limits::METRICS_REQUEST_BYTES_MAX)
    );
    assert_eq!(exchange(addr, huge.as_bytes()).await.status, 431);

    // A client that connects and sends nothing does not hold up the next one.
    let _silent = TcpStream::connect(addr).await.expect("connect");
    let _half = {
        let mut s = TcpStream::connect(addr).await.expect("connect");
        s.write_all(b"GET /metr")
            .await
            .expect("send half a request");
        s
    };
    let started = std::time::Instant::now();
    assert_eq!(get(addr, "/metrics").await.status, 200);
    assert!(
        started.elapsed() < Duration::from_millis(pgdp::limits::METRICS_IO_TIMEOUT_MS),
        "a scrape waited for a silent client"
    );
    proxy.stop().await;
}

#[tokio::test]
async fn health_does_not_wait_for_a_pooled_connection_when_every_one_is_busy() {
    let proxy = proxy_with_metrics(44).await;
    let upstream = proxy.shared().upstream.clone();
    // Every permit of the upstream pool taken, as by that many queries running at once.
    let mut busy = Vec::new();
    for _ in 0..pgdp::limits::UPSTREAM_POOL_SIZE {
        busy.push(upstream.get().await.expect("a pooled connection"));
    }
    let health = get(proxy.metrics_addr(), "/health").await;
    assert_eq!(health.status, 200, "{}", health.body);
    assert!(health.body.contains("upstream: ok"), "{}", health.body);
    drop(busy);
    proxy.stop().await;
}

#[tokio::test]
async fn health_is_503_naming_the_ledger_when_it_cannot_be_reached() {
    // A port nothing listens on: bound, then closed.
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("local address").port()
    };
    let upstream = harness::demo_database(1).await.dsn().to_string();
    let running = server::start_with(
        Config {
            policy: demo_policy(),
            upstream,
            ledger: Some(format!(
                "host=127.0.0.1 port={closed} user=postgres dbname=postgres connect_timeout=2"
            )),
            listen: "127.0.0.1:0".into(),
            noise_seed: Some([43; 32]),
        },
        Options {
            metrics: Some("127.0.0.1:0".into()),
            ..Options::default()
        },
    )
    .await
    .unwrap_or_else(|e| panic!("pgdp did not start: {e}"));
    let addr = running.metrics_addr.expect("a metrics endpoint");
    let health = get(addr, "/health").await;
    assert_eq!(health.status, 503, "{}", health.body);
    assert!(
        health.body.contains("ledger: unreachable"),
        "{}",
        health.body
    );
    assert!(health.body.contains("upstream: ok"), "{}", health.body);

    // A DP query is refused (57P03) and counted as a ledger error.
    let dsn = format!(
        "host=127.0.0.1 port={} user={ANALYST} password={PASSWORD} dbname={DATABASE} sslmode=disable connect_timeout=10",
        running.addr.port()
    );
    let session = crate::support::Session::open(&dsn)
        .await
        .expect("connect to pgdp");
    assert_code(
        session
            .simple_query("SELECT COUNT(*) FROM demo.people")
            .await,
        &SqlState::CANNOT_CONNECT_NOW,
        "a DP query without a ledger",
    );
    let scrape = Scrape::of(addr).await;
    assert_eq!(scrape.value("pgdp_ledger_errors_total", &[]), 1.0);
    assert_eq!(scrape.statements("error", "57"), 1.0);
    assert_eq!(
        scrape.value("pgdp_charges_total", &[("analyst", ANALYST)]),
        0.0
    );
}
