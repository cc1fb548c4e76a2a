//! Operational metrics in the Prometheus (OpenMetrics) text format, and the HTTP endpoint that
//! serves them with a health check (`--metrics ADDR`, [`http`]).
//!
//! [`Metrics`] holds one `prometheus-client` registry per server (not a process-wide one, so
//! servers started side by side in one process, as the tests do, count apart). The session and
//! the front end record into it through the few methods below; it is encoded only when
//! `/metrics` is scraped.
//!
//! Invariants:
//! - No label and no value derives from upstream rows or from SQL text. Labels are pgdp's own
//!   words (an outcome, a stage, a kind of failure), the first two characters of a SQLSTATE pgdp
//!   chose ([`crate::Error::sqlstate`]), and analyst names, which come from the policy (only
//!   authenticated analysts are ever recorded, so the label set is bounded by the policy). Values
//!   are counts, durations, and the costs and spent budget of charges, which the policy and the
//!   analyst's settings decide before anything runs (`budget::Receipt`).
//! - Durations do depend on the data (the upstream's running time, the number of groups
//!   released): that is why the endpoint is for operators and must not be reachable by analysts
//!   (docs/operations.md).
//! - Recording never fails and never blocks on I/O; it cannot change what a statement does.

pub mod http;

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

use crate::budget::{Balance, Cost};
use crate::error::Error;

/// Upper bounds of the latency buckets, in seconds: 100 µs (a parse) to the statement timeout's
/// order of magnitude (an upstream query).
pub const STAGE_BUCKETS_S: [f64; 18] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0, 30.0, 60.0,
];

/// How a statement that succeeded was answered (the `outcome` label of
/// `pgdp_statements_total`, beside `refused` and `error`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Served {
    /// A DP query charged, run upstream and released.
    AnsweredDp,
    /// A DP query answered again from the replay cache, free.
    Replayed,
    /// A DP query answered from noisy measures released earlier, free.
    Reused,
    /// EXPLAIN of a DP query.
    Explain,
    /// A catalog query, on the shadow catalog.
    Catalog,
    /// A SELECT without FROM, computed by pgdp.
    Constant,
    /// The budget view (`SHOW pgdp.budget`, `pgdp.budget`).
    Budget,
    /// SET, SHOW, BEGIN, COMMIT and the other session statements.
    Session,
    /// DECLARE, FETCH, MOVE, CLOSE.
    Cursor,
}

impl Served {
    /// The label value.
    pub fn label(self) -> &'static str {
        match self {
            Served::AnsweredDp => "answered_dp",
            Served::Replayed => "replayed",
            Served::Reused => "reused",
            Served::Explain => "explain",
            Served::Catalog => "catalog",
            Served::Constant => "constant",
            Served::Budget => "budget",
            Served::Session => "session",
            Served::Cursor => "cursor",
        }
    }
}

/// A step of a statement whose latency is recorded (`pgdp_stage_duration_seconds`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// Parsing and classifying a message (`session::classify`).
    Parse,
    /// Analysing a DP query against the policy (`dp::analyze`).
    Analyse,
    /// Rewriting its plan into upstream SQL (`dp::rewrite`).
    Rewrite,
    /// One call to the ledger on a DP query's path: a replay lookup or the charge.
    Ledger,
    /// One query on the upstream: a public domain or the charged release query.
    Upstream,
    /// Noise, selection and post-processing of one release.
    Release,
}

impl Stage {
    /// The label value.
    pub fn label(self) -> &'static str {
        match self {
            Stage::Parse => "parse",
            Stage::Analyse => "analyse",
            Stage::Rewrite => "rewrite",
            Stage::Ledger => "ledger",
            Stage::Upstream => "upstream",
            Stage::Release => "release",
        }
    }
}

/// Which replay-cache lookup of a DP query (`pgdp_replay_lookups_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lookup {
    /// The identical query's released answer.
    Answer,
    /// Noisy measures of an earlier release with the same measures and mechanisms.
    Measures,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StatementLabels {
    outcome: &'static str,
    sqlstate_class: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AnalystLabels {
    analyst: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StageLabels {
    stage: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LookupLabels {
    cache: &'static str,
    result: &'static str,
}

/// The `kind` label values of `pgdp_upstream_errors_total`.
const UPSTREAM_ERROR_KINDS: [&str; 3] = ["unavailable", "failed", "canceled"];

type Amount = Counter<f64, AtomicU64>;
type Level = Gauge<f64, AtomicU64>;

/// The metrics of one server.
pub struct Metrics {
    registry: Registry,
    statements: Family<StatementLabels, Counter>,
    charges: Family<AnalystLabels, Counter>,
    charged_epsilon: Family<AnalystLabels, Amount>,
    charged_delta: Family<AnalystLabels, Amount>,
    charged_rho: Family<AnalystLabels, Amount>,
    spent_epsilon: Family<AnalystLabels, Level>,
    spent_delta: Family<AnalystLabels, Level>,
    spent_rho: Family<AnalystLabels, Level>,
    stages: Family<StageLabels, Histogram, fn() -> Histogram>,
    upstream_errors: Family<KindLabels, Counter>,
    ledger_errors: Counter,
    connections_open: Gauge,
    connections_accepted: Counter,
    logins_failed: Counter,
    replay_index_skips: Counter,
    replay_lookups: Family<LookupLabels, Counter>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics::new()
    }
}

fn stage_histogram() -> Histogram {
    Histogram::new(STAGE_BUCKETS_S)
}

impl Metrics {
    /// Every metric at zero, registered with its help text.
    pub fn new() -> Metrics {
        let metrics = Metrics {
            registry: Registry::default(),
            statements: Family::default(),
            charges: Family::default(),
            charged_epsilon: Family::default(),
            charged_delta: Family::default(),
            charged_rho: Family::default(),
            spent_epsilon: Family::default(),
            spent_delta: Family::default(),
            spent_rho: Family::default(),
            stages: Family::new_with_constructor(stage_histogram as fn() -> Histogram),
            upstream_errors: Family::default(),
            ledger_errors: Counter::default(),
            connections_open: Gauge::default(),
            connections_accepted: Counter::default(),
            logins_failed: Counter::default(),
            replay_index_skips: Counter::default(),
            replay_lookups: Family::default(),
        };
        metrics.registered().with_known_labels()
    }

    /// Every series whose labels are known in advance exists from the start, at zero, so that
    /// rates over them are defined before the first event. (Per-analyst series appear with the
    /// analyst's first charge; a statement's SQLSTATE class with its first failure.)
    fn with_known_labels(self) -> Metrics {
        for how in [
            Served::AnsweredDp,
            Served::Replayed,
            Served::Reused,
            Served::Explain,
            Served::Catalog,
            Served::Constant,
            Served::Budget,
            Served::Session,
            Served::Cursor,
        ] {
            self.statements.get_or_create_owned(&StatementLabels {
                outcome: how.label(),
                sqlstate_class: "00".into(),
            });
        }
        for stage in [
            Stage::Parse,
            Stage::Analyse,
            Stage::Rewrite,
            Stage::Ledger,
            Stage::Upstream,
            Stage::Release,
        ] {
            self.stages.get_or_create_owned(&StageLabels {
                stage: stage.label(),
            });
        }
        for kind in UPSTREAM_ERROR_KINDS {
            self.upstream_errors
                .get_or_create_owned(&KindLabels { kind });
        }
        for cache in ["answer", "measures"] {
            for result in ["hit", "miss"] {
                self.replay_lookups
                    .get_or_create_owned(&LookupLabels { cache, result });
            }
        }
        self
    }

    fn registered(mut self) -> Metrics {
        let r = &mut self.registry;
        r.register(
            "pgdp_statements",
            "Statements by outcome (answered_dp, replayed, reused, explain, catalog, constant, budget, session, cursor, refused, error) and SQLSTATE class (00 when answered)",
            self.statements.clone(),
        );
        r.register(
            "pgdp_charges",
            "Charges committed to the privacy ledger, per analyst",
            self.charges.clone(),
        );
        r.register(
            "pgdp_charged_epsilon",
            "Pure epsilon charged, per analyst (sum of the charges' costs)",
            self.charged_epsilon.clone(),
        );
        r.register(
            "pgdp_charged_delta",
            "Delta charged, per analyst (sum of the charges' costs)",
            self.charged_delta.clone(),
        );
        r.register(
            "pgdp_charged_rho",
            "zCDP rho of Gaussian-type mechanisms charged, per analyst",
            self.charged_rho.clone(),
        );
        r.register(
            "pgdp_budget_spent_epsilon",
            "The analyst's pure epsilon spent, as the ledger reported it with the last charge this process made",
            self.spent_epsilon.clone(),
        );
        r.register(
            "pgdp_budget_spent_delta",
            "The analyst's delta spent, as the ledger reported it with the last charge this process made",
            self.spent_delta.clone(),
        );
        r.register(
            "pgdp_budget_spent_rho",
            "The analyst's zCDP rho spent, as the ledger reported it with the last charge this process made",
            self.spent_rho.clone(),
        );
        r.register_with_unit(
            "pgdp_stage_duration",
            "Latency of the steps of statements: parse (per message), analyse, rewrite, ledger (per call), upstream (per query), release",
            Unit::Seconds,
            self.stages.clone(),
        );
        r.register(
            "pgdp_upstream_errors",
            "Statements that failed at the upstream: unavailable (57P03), failed (58000), canceled (57014, timeout or cancel request)",
            self.upstream_errors.clone(),
        );
        r.register(
            "pgdp_ledger_errors",
            "Privacy ledger calls that failed: statements refused because the ledger is unavailable, and release records that could not be written",
            self.ledger_errors.clone(),
        );
        r.register(
            "pgdp_connections_open",
            "Client connections open now",
            self.connections_open.clone(),
        );
        r.register(
            "pgdp_connections_accepted",
            "Client connections accepted (including those refused past a connection limit)",
            self.connections_accepted.clone(),
        );
        r.register(
            "pgdp_logins_failed",
            "Failed logins (wrong password, unknown analyst, malformed SCRAM)",
            self.logins_failed.clone(),
        );
        r.register(
            "pgdp_replay_index_skips",
            "DP queries whose replay-cache lookups the replay index answered (none stored) without a round trip to the ledger",
            self.replay_index_skips.clone(),
        );
        r.register(
            "pgdp_replay_lookups",
            "Replay-cache lookups of DP queries: cache=answer (the identical query) or measures (noisy measures to reuse), result=hit or miss",
            self.replay_lookups.clone(),
        );
        self
    }

    /// The exposition in the OpenMetrics text format (which Prometheus scrapes), ending in
    /// `# EOF`.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        // Writing into a String cannot fail; an encoder error would leave a truncated text,
        // which Prometheus rejects rather than misreads.
        if prometheus_client::encoding::text::encode(&mut text, &self.registry).is_err() {
            tracing::error!("cannot encode the metrics");
        }
        text
    }

    /// A statement answered.
    pub fn served(&self, how: Served) {
        self.statements
            .get_or_create(&StatementLabels {
                outcome: how.label(),
                sqlstate_class: "00".into(),
            })
            .inc();
    }

    /// A statement refused or failed with `error`: counted as `refused` when pgdp or the policy
    /// turned it down, as `error` when the upstream, the ledger or pgdp itself failed, and in
    /// the upstream or ledger error counters when they were the cause.
    pub fn failed(&self, error: &Error) {
        let outcome = match error {
            Error::Upstream | Error::UpstreamUnavailable | Error::Canceled { .. } => {
                let [unavailable, failed, canceled] = UPSTREAM_ERROR_KINDS;
                let kind = match error {
                    Error::Upstream => failed,
                    Error::UpstreamUnavailable => unavailable,
                    _ => canceled,
                };
                self.upstream_errors
                    .get_or_create(&KindLabels { kind })
                    .inc();
                "error"
            }
            Error::LedgerUnavailable => {
                self.ledger_errors.inc();
                "error"
            }
            Error::Internal { .. } => "error",
            _ => "refused",
        };
        let state = error.sqlstate();
        self.statements
            .get_or_create(&StatementLabels {
                outcome,
                sqlstate_class: state.code().chars().take(2).collect(),
            })
            .inc();
    }

    /// A ledger call whose failure the statement does not see (recording a release).
    pub fn ledger_failed(&self) {
        self.ledger_errors.inc();
    }

    /// The latency of one stage.
    pub fn stage(&self, stage: Stage, took: Duration) {
        self.stages
            .get_or_create(&StageLabels {
                stage: stage.label(),
            })
            .observe(took.as_secs_f64());
    }

    /// A charge committed for `analyst` (a name from the policy): its cost, and the balance the
    /// ledger returned with the receipt.
    pub fn charged(&self, analyst: &str, cost: &Cost, balance: &Balance) {
        let labels = AnalystLabels {
            analyst: analyst.to_string(),
        };
        self.charges.get_or_create(&labels).inc();
        self.charged_epsilon
            .get_or_create(&labels)
            .inc_by(cost.epsilon.to_f64_approx());
        self.charged_delta
            .get_or_create(&labels)
            .inc_by(cost.delta.to_f64_approx());
        self.charged_rho
            .get_or_create(&labels)
            .inc_by(cost.rho.to_f64_approx());
        self.spent_epsilon
            .get_or_create(&labels)
            .set(balance.spent.epsilon.to_f64_approx());
        self.spent_delta
            .get_or_create(&labels)
            .set(balance.spent.delta.to_f64_approx());
        self.spent_rho
            .get_or_create(&labels)
            .set(balance.spent.rho.to_f64_approx());
    }

    /// A replay-cache lookup and whether it found an entry.
    pub fn replay_lookup(&self, cache: Lookup, hit: bool) {
        self.replay_lookups
            .get_or_create(&LookupLabels {
                cache: match cache {
                    Lookup::Answer => "answer",
                    Lookup::Measures => "measures",
                },
                result: if hit { "hit" } else { "miss" },
            })
            .inc();
    }

    /// A client connection accepted; the returned guard counts it as open until dropped.
    pub fn connection_accepted(self: &std::sync::Arc<Self>) -> OpenConnection {
        self.connections_accepted.inc();
        self.connections_open.inc();
        OpenConnection {
            metrics: self.clone(),
        }
    }

    /// A failed login.
    pub fn login_failed(&self) {
        self.logins_failed.inc();
    }

    /// A DP query's replay-cache lookups answered by the replay index, without the ledger.
    pub fn replay_index_skip(&self) {
        self.replay_index_skips.inc();
    }
}

/// Counts a client connection as open while it lives.
#[derive(Debug)]
pub struct OpenConnection {
    metrics: std::sync::Arc<Metrics>,
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.metrics.connections_open.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::{Fixed, Limit, Spent};

    fn sample(text: &str, name: &str, labels: &str) -> Option<f64> {
        let prefix = format!("{name}{labels} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .map(|v| v.parse().expect("a number"))
    }

    #[test]
    fn every_family_has_help_and_type() {
        let metrics = Metrics::new();
        let limit = Limit::new(Fixed::from_f64(10.0).unwrap(), Fixed::ZERO);
        let balance = Balance {
            limit,
            spent: Spent::ZERO,
            remaining: crate::budget::remaining(&limit, &Spent::ZERO),
        };
        metrics.charged("ana", &Cost::ZERO, &balance);
        let text = metrics.encode();
        for name in [
            "pgdp_statements",
            "pgdp_charges",
            "pgdp_charged_epsilon",
            "pgdp_charged_delta",
            "pgdp_charged_rho",
            "pgdp_budget_spent_epsilon",
            "pgdp_budget_spent_delta",
            "pgdp_budget_spent_rho",
            "pgdp_stage_duration_seconds",
            "pgdp_upstream_errors",
            "pgdp_ledger_errors",
            "pgdp_connections_open",
            "pgdp_connections_accepted",
            "pgdp_logins_failed",
            "pgdp_replay_index_skips",
            "pgdp_replay_lookups",
        ] {
            assert!(text.contains(&format!("# HELP {name} ")), "{name}: {text}");
            assert!(text.contains(&format!("# TYPE {name} ")), "{name}: {text}");
        }
        assert!(text.ends_with("# EOF\n"));
    }

    #[test]
    fn failures_are_counted_by_outcome_class_and_cause() {
        let metrics = Metrics::new();
        metrics.served(Served::AnsweredDp);
        metrics.failed(&Error::UnknownTable { name: "t".into() });
        metrics.failed(&Error::UpstreamUnavailable);
        metrics.failed(&Error::Upstream);
        metrics.failed(&Error::LedgerUnavailable);
        let text = metrics.encode();
        let count = |labels: &str| sample(&text, "pgdp_statements_total", labels);
        assert_eq!(
            count("{outcome=\"answered_dp\",sqlstate_class=\"00\"}"),
            Some(1.0)
        );
        assert_eq!(
            count("{outcome=\"refused\",sqlstate_class=\"42\"}"),
            Some(1.0)
        );
        assert_eq!(
            count("{outcome=\"error\",sqlstate_class=\"57\"}"),
            Some(2.0)
        );
        assert_eq!(
            count("{outcome=\"error\",sqlstate_class=\"58\"}"),
            Some(1.0)
        );
        assert_eq!(
            sample(
                &text,
                "pgdp_upstream_errors_total",
                "{kind=\"unavailable\"}"
            ),
            Some(1.0)
        );
        assert_eq!(
            sample(&text, "pgdp_upstream_errors_total", "{kind=\"failed\"}"),
            Some(1.0)
        );
        assert_eq!(sample(&text, "pgdp_ledger_errors_total", ""), Some(1.0));
    }

    #[test]
    fn charges_add_costs_and_set_the_spent_gauge() {
        let metrics = Metrics::new();
        let limit = Limit::new(Fixed::from_f64(10.0).unwrap(), Fixed::ZERO);
        let cost = Cost::pure(Fixed::from_f64(0.5).unwrap());
        let after_one = Spent::ZERO.checked_add(&cost).unwrap();
        let after_two = after_one.checked_add(&cost).unwrap();
        let balance = |spent: Spent| Balance {
            limit,
            spent,
            remaining: crate::budget::remaining(&limit, &spent),
        };
        metrics.charged("ana", &cost, &balance(after_one));
        metrics.charged("ana", &cost, &balance(after_two));
        let text = metrics.encode();
        let labels = "{analyst=\"ana\"}";
        assert_eq!(sample(&text, "pgdp_charges_total", labels), Some(2.0));
        assert_eq!(
            sample(&text, "pgdp_charged_epsilon_total", labels),
            Some(1.0)
        );
        assert_eq!(
            sample(&text, "pgdp_budget_spent_epsilon", labels),
            Some(1.0)
        );
    }

    #[test]
    fn stage_latencies_fall_into_their_buckets() {
        let metrics = Metrics::new();
        metrics.stage(Stage::Parse, Duration::from_micros(50));
        metrics.stage(Stage::Upstream, Duration::from_millis(300));
        let text = metrics.encode();
        let name = "pgdp_stage_duration_seconds_bucket";
        assert_eq!(
            sample(&text, name, "{le=\"0.0001\",stage=\"parse\"}"),
            Some(1.0)
        );
        assert_eq!(
            sample(&text, name, "{le=\"0.25\",stage=\"upstream\"}"),
            Some(0.0)
        );
        assert_eq!(
            sample(&text, name, "{le=\"0.5\",stage=\"upstream\"}"),
            Some(1.0)
        );
        assert_eq!(
            sample(
                &text,
                "pgdp_stage_duration_seconds_count",
                "{stage=\"upstream\"}"
            ),
            Some(1.0)
        );
    }

    #[test]
    fn open_connections_are_counted_until_dropped() {
        let metrics = std::sync::Arc::new(Metrics::new());
        let first = metrics.connection_accepted();
        let second = metrics.connection_accepted();
        drop(first);
        let text = metrics.encode();
        assert_eq!(sample(&text, "pgdp_connections_open", ""), Some(1.0));
        assert_eq!(
            sample(&text, "pgdp_connections_accepted_total", ""),
            Some(2.0)
        );
        drop(second);
        assert_eq!(
            sample(&metrics.encode(), "pgdp_connections_open", ""),
            Some(0.0)
        );
    }
}
