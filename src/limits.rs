//! Every bound pgdp enforces, in one place, with their relations checked at compile time.
//!
//! Names end in their unit (`_bytes`, `_ms`) or say what they count (`_max`). A value past a limit
//! is refused with [`crate::Error::LimitExceeded`] (SQLSTATE 54000) or the more specific code the
//! caller documents; the connection and the process survive.

/// Largest SQL text accepted in one Query or Parse message.
pub const SQL_BYTES_MAX: usize = 64 * 1024;

/// Deepest expression nesting the parser accepts (sqlparser's recursion limit).
pub const PARSER_DEPTH_MAX: usize = 64;

/// Most statements in one simple-query message.
pub const STATEMENTS_PER_MESSAGE_MAX: usize = 32;

/// Largest literal frame offset, `lag` / `lead` offset and `nth_value` position of a window
/// partitioned by the privacy unit (`analyze::window`).
pub const WINDOW_FRAME_OFFSET_MAX: u64 = 100_000;

/// Most buckets of `ntile(n)` over a window partitioned by the privacy unit.
pub const NTILE_BUCKETS_MAX: u64 = 100_000;

/// Most branches of a set operation over DP queries (`… UNION ALL …`): each is a release of its
/// own, charged on its own.
pub const SET_OPERATION_BRANCHES_MAX: usize = 8;

/// Most distinct scalar subqueries in one statement (`… / (SELECT COUNT(*) FROM …)`), each
/// released and charged on its own before the statement.
pub const SCALAR_SUBQUERIES_MAX: usize = 8;

/// Most aggregates in one DP query.
pub const AGGREGATES_PER_QUERY_MAX: usize = 16;

/// Most GROUP BY keys in one DP query, and most fields of a row counted by `COUNT(DISTINCT ROW(…))`
/// (an ORM's count of groups).
pub const GROUP_KEYS_PER_QUERY_MAX: usize = 8;

/// Most grouping sets of one DP query (`ROLLUP`, `CUBE`, `GROUPING SETS` expanded): each is a
/// release of its own, with an equal share of the query's ε and δ.
pub const GROUPING_SETS_PER_QUERY_MAX: usize = 16;

/// Most arguments of `GROUPING(…)` (PostgreSQL's own limit: its result is an int4 bit mask).
pub const GROUPING_ARGUMENTS_MAX: usize = 31;

/// Most groups pgdp releases for one query (after partition selection / public keys).
pub const GROUPS_RELEASED_MAX: usize = 100_000;

/// Most rows pgdp reads from the upstream for one DP query (one row per candidate group).
pub const UPSTREAM_ROWS_MAX: usize = 1_000_000;

/// Most combinations of public group values pgdp zero-fills.
pub const PUBLIC_KEY_COMBINATIONS_MAX: usize = GROUPS_RELEASED_MAX;

/// Statement timeout set on every upstream DP statement, unless the policy's
/// `statement_timeout_s` says otherwise.
pub const STATEMENT_TIMEOUT_MS: u64 = 60_000;

/// The longest `statement_timeout_s` a policy may set (a day): a sharded grouping of a large
/// table can take minutes, but a statement that never ends would hold an upstream connection
/// and the analyst's session for ever.
pub const STATEMENT_TIMEOUT_MAX_S: u64 = 86_400;

/// `statement_timeout` of a catalog query on the shadow catalog (which holds no rows). Client and
/// BI-tool introspection takes milliseconds there; the limit bounds the upstream server's CPU a
/// crafted catalog query can burn (e.g. a large `generate_series`).
pub const CATALOG_STATEMENT_TIMEOUT_MS: u64 = 1_000;

/// Statement timeout of the post-processing of released values on the shadow catalog (ms):
/// its input is at most [`GROUPS_RELEASED_MAX`] rows.
pub const POST_PROCESSING_TIMEOUT_MS: u64 = 5_000;

/// Catalog queries of one analyst that run at once on the shadow catalog (over all of the
/// analyst's connections); more wait their turn (post-processing shares them).
pub const CATALOG_QUERIES_PER_ANALYST_MAX: usize = 2;

/// Time a client has to finish startup and authentication.
pub const STARTUP_TIMEOUT_MS: u64 = 10_000;

/// Time to wait for an upstream connection before reporting it unavailable.
pub const UPSTREAM_CONNECT_TIMEOUT_MS: u64 = 5_000;

/// Most client connections at once, in total.
pub const CONNECTIONS_MAX: usize = 1_000;

/// Most client connections at once for one analyst.
pub const CONNECTIONS_PER_ANALYST_MAX: usize = 200;

/// Connections past [`CONNECTIONS_MAX`] being told so (53300) at once; beyond this many, further
/// sockets are closed without a message.
pub const CONNECTIONS_REFUSING_MAX: usize = 64;

/// The default (a policy's `login_throttle` may set another) of failed logins of one user name
/// from one client IP address within [`AUTH_FAILURE_WINDOW_MS`] after which further logins of that user from that address are refused (FATAL 53300) until
/// the window ends; other users behind the address (a BI server's) are served.
pub const AUTH_FAILURES_PER_USER_MAX: u32 = 10;

/// The default of failed logins from one client IP address, all user names together, within
/// [`AUTH_FAILURE_WINDOW_MS`] after which every login from that address is refused (FATAL 53300)
/// until the window ends: a spray over many user names.
pub const AUTH_FAILURES_PER_ADDRESS_MAX: u32 = 100;

/// The window in which failed logins of one user from one IP address, and of one address, are
/// counted; it starts at the first failure and is not extended by refused attempts.
pub const AUTH_FAILURE_WINDOW_MS: u64 = 60_000;

/// The windows a policy's `login_throttle.window_s` may set, in seconds: at least a second,
/// at most a day.
pub const AUTH_FAILURE_WINDOW_S_RANGE: (u64, u64) = (1, 86_400);

/// Entries each failed-login table (per user and address; per address) remembers at once (fixed
/// capacity: when it is full, an expired entry or else the oldest is forgotten to make room).
/// Each entry is at most about a hundred bytes.
pub const AUTH_FAILURE_PEERS_MAX: usize = 4_096;

/// Largest protocol message a client may send (a Query, Parse or Bind with its parameters); a
/// larger one ends the connection with FATAL 54000 as soon as its header arrives.
pub const MESSAGE_BYTES_MAX: usize = 1024 * 1024;

/// Open cursors (`DECLARE`) one session may hold.
pub const CURSORS_PER_SESSION_MAX: usize = 64;

/// Released rows one session may hold in its open cursors, all cursors together.
pub const CURSOR_ROWS_PER_SESSION_MAX: usize = 2 * GROUPS_RELEASED_MAX;

/// Upstream connections in the pool.
pub const UPSTREAM_POOL_SIZE: usize = 16;

/// How often the read replicas' health and replay lag are checked (`upstream::standby`).
pub const STANDBY_CHECK_MS: u64 = 500;

/// How far back the primary's WAL positions are kept to measure a standby's lag; a standby
/// further behind counts as lagging by at least this.
pub const STANDBY_LAG_WINDOW_MS: u64 = 120_000;

/// The default largest replay lag at which a standby still serves reads (`--replica-lag-max-ms`).
pub const STANDBY_LAG_MAX_MS: u64 = 5_000;

/// The range `--replica-lag-max-ms` accepts: at least one check interval, at most the window.
pub const STANDBY_LAG_MAX_RANGE_MS: (u64, u64) = (STANDBY_CHECK_MS, STANDBY_LAG_WINDOW_MS);

/// At most this many read replicas.
pub const STANDBYS_MAX: usize = 16;

/// DP statements whose result types (described on the shadow catalog) are remembered per
/// process; the cache is emptied when full. Each entry is a statement's text and a few OIDs.
pub const RESULT_TYPES_CACHED_MAX: usize = 4_096;

/// (ε, δ) pairs whose Gaussian ρ the release step remembers (`dp::release::rho_for`); a policy
/// uses a handful, and the oldest is forgotten first.
pub const RHO_FOR_CACHED_MAX: usize = 64;

/// (ε, δ) limits whose per-order Rényi budgets and zCDP budget the accountant remembers
/// (`budget::accountant::budgets`): one per analyst and window, and the dataset's; the oldest
/// is forgotten first.
pub const RENYI_BUDGETS_CACHED_MAX: usize = 256;

/// (sensitivity, ρ) pairs whose Gaussian scale the mechanism remembers
/// (`dp::mechanism::noise::sigma_for`); the oldest is forgotten first.
pub const SIGMAS_CACHED_MAX: usize = 256;

/// Noises (mechanism, sensitivity, budget, cells per unit) the mechanism remembers
/// (`dp::mechanism::noise::remembered`): `auto` builds both mechanisms of a policy's few
/// measures query after query; the oldest is forgotten first.
pub const NOISES_CACHED_MAX: usize = 256;

/// (scale, cells, α) triples whose Laplace sum error bound the mechanism remembers
/// (`dp::mechanism::noise::laplace_sum_half_width`); the oldest is forgotten first.
pub const SUM_HALF_WIDTHS_CACHED_MAX: usize = 1_024;

/// Connections to the shadow catalog database (catalog queries hold no private data and are
/// short, so a few suffice).
pub const SHADOW_POOL_SIZE: usize = 4;

/// How long after a failed build of the shadow catalog the next catalog query tries again, so a
/// permanent failure (the upstream role lacks CREATEDB) costs little.
pub const SHADOW_RETRY_MS: u64 = 2_000;

/// Connections one ledger opens at most (lazily, beyond the first); group commit batches the
/// charges waiting for them.
pub const LEDGER_CONNECTIONS: usize = 4;

/// How often a client's socket is looked at again while it holds bytes pgdp has not read yet
/// (to notice a client that went away mid-statement).
pub const CLIENT_WATCH_INTERVAL_MS: u64 = 200;

/// Most charges the ledger commits in one transaction (group commit; see `budget::ledger`).
/// Larger batches share one lock and one WAL flush among more queries, but each waits for all.
pub const CHARGES_PER_COMMIT_MAX: usize = 64;

/// Budget leases (`budget::lease`): the most charges one slice reserves (`--lease-queries`,
/// whose default this is; 1 turns leases off, and every charge is then its own durable commit).
pub const SLICE_QUERIES_DEFAULT: u64 = 64;

/// The largest `--lease-queries`.
pub const SLICE_QUERIES_MAX: u64 = 4_096;

/// A slice reserves at most this share (1/n) of the queries like the one that opens it that
/// still fit the budget, so slices shrink near exhaustion (one query at a time once fewer than
/// 2n fit), and what several processes hold unused stays a small part of what is left.
pub const SLICE_SHARE_DIVISOR: u64 = 4;

/// A slice of at least this many queries has the next one reserved ahead, in the background,
/// once half of it is used, so that queries rarely wait for a durable reservation. Smaller
/// slices (near exhaustion, where they shrink) are reserved in the query's own path only, so a
/// process never holds more than it needs when little is left.
pub const SLICE_AHEAD_QUERIES_MIN: u64 = 8;

/// A slice nobody charged for this long is closed and its unused part returned to the budget,
/// so that another process (or the same one after a policy change) can use it.
pub const SLICE_IDLE_RETURN_MS: u64 = 1_000;

/// How long a clean shutdown waits for the ledger to take back slices and the journal's rows.
pub const SHUTDOWN_LEDGER_WAIT_MS: u64 = 5_000;

/// Audit rows, outcomes and replay entries waiting for the journal's next lazy commit
/// (`budget::ledger::journal`); beyond it the oldest replay entries are dropped (a later
/// identical query then costs again), never an audit row.
pub const JOURNAL_PENDING_MAX: usize = 10_000;

/// How long a woken journal waits before taking what is queued into one lazy commit: a query's
/// charge and its outcome then share one row, and the queries of those milliseconds one round
/// trip to the ledger (an identical query on another process finds a replay entry that much
/// later; this process sees it at once).
pub const JOURNAL_COALESCE_MS: u64 = 5;

/// Replay-cache keys the ledger's replay index (`budget::ledger::index`) holds in all; past it
/// the index starts over (each analyst's keys are read again on their next query, expired
/// entries deleted). 64-bit hashes: a few tens of MB at most.
pub const REPLAY_INDEX_KEYS_MAX: usize = 1_000_000;

/// Replay-cache keys the replay index holds for one analyst; an analyst with more is not
/// indexed (each of their DP queries looks its keys up in the ledger, as without an index).
pub const REPLAY_INDEX_ANALYST_KEYS_MAX: usize = 100_000;

/// How long the replay index's listener waits before connecting again after its connection to
/// the ledger failed or ended (meanwhile every lookup goes to the ledger).
pub const REPLAY_INDEX_RETRY_MS: u64 = 1_000;

/// Most threads `--worker-threads` may give the runtime that runs sessions.
pub const WORKER_THREADS_MAX: usize = 1024;

/// How long the journal waits before trying again after the ledger failed a lazy commit.
pub const JOURNAL_RETRY_MS: u64 = 1_000;

/// Prepared statements one connection may hold.
pub const PREPARED_STATEMENTS_PER_CONNECTION_MAX: usize = 1_000;

/// Parameters (`$1` … `$n`) of one statement: the analysis refuses a higher number, and
/// ParameterDescription describes at most this many untyped ones.
pub const PARAMETERS_PER_STATEMENT_MAX: usize = 256;

/// Most values in one `IN (…)` list.
pub const IN_LIST_VALUES_MAX: usize = 1_000;

/// Most semijoins (`IN` / `EXISTS` subqueries on the privacy unit) in the WHERE of one query.
pub const SEMIJOINS_PER_QUERY_MAX: usize = 4;

/// Most tables one query may join (policy tables, at any depth of its subqueries).
pub const JOINED_TABLES_MAX: usize = 8;

/// Most tables (policy tables and subqueries, at any depth) one query may name; bounds the
/// expansion of CTEs referenced several times.
pub const VIEW_TABLES_MAX: usize = 32;

/// Most foreign-key steps from a table to its privacy unit (`unit_path` in the policy, counting
/// the steps of the tables it passes through): each step is one more join in every query of
/// the table.
pub const UNIT_PATH_STEPS_MAX: usize = 4;

/// Most values of an integer per-unit value (e.g. `LEAST(COUNT(*), 10)`) treated as a public
/// domain of group keys.
pub const INTEGER_DOMAIN_VALUES_MAX: f64 = 1001.0;

/// Most buckets `n` of a `width_bucket(x, lo, hi, n)` group key: its public domain is the
/// `n + 2` values `0 … n + 1`.
pub const WIDTH_BUCKETS_MAX: i64 = 1000;
const _: () = assert!((WIDTH_BUCKETS_MAX as usize) + 2 <= GROUPS_RELEASED_MAX);

/// Number of equal buckets of `[lower, upper]` a quantile is chosen from: the released value is
/// the middle of a bucket, so the bucketing alone costs at most `(upper − lower)/512` of accuracy.
pub const QUANTILE_BUCKETS: u64 = 256;

/// Rows sent for one Execute message; a larger row limit asked by the client is lowered to this
/// (the portal is then suspended and the client fetches the rest with the next Execute).
pub const ROWS_PER_EXECUTE_MAX: usize = GROUPS_RELEASED_MAX;

/// Largest `max_groups_per_unit` a policy may declare.
pub const GROUPS_PER_UNIT_MAX: u64 = 10_000;

/// Largest `max_rows_per_unit` a policy may declare.
pub const ROWS_PER_UNIT_MAX: u64 = 100_000;

/// The share of a query's ε (or of the ε its ρ is calibrated from) spent choosing its cap on
/// rows per unit when `pgdp.choose_bounds` is on (`dp::release::bounds`); the answer gets the
/// rest.
pub const BOUNDS_CHOICE_SHARE: f64 = 0.1;

/// The further share of a query's ε spent, beside [`BOUNDS_CHOICE_SHARE`], on estimating what
/// clamping a summed argument into its bounds removes when the query chooses its caps
/// (`dp::release::bounds`: two DP histograms of each unit's values outside the bounds and of
/// its clamped sum).
pub const BOUNDS_CLAMP_SHARE: f64 = 0.05;

/// How many groups the choice of a cap assumes the answer has when its keys are released by
/// partition selection (their number is not known before the release): the rows a cap removes
/// weigh per group, against the noise of one group.
pub const BOUNDS_CHOICE_CELLS_SELECTED: u64 = 10;

/// How many times a query that chooses a clamped column's upper bound may halve the policy's
/// `upper_ceiling` (`dp::release::bounds`): its candidates span a factor of 2^this, each in
/// its own bucket of the histogram of each unit's largest value.
pub const BOUNDS_UPPER_HALVINGS: i32 = 20;

/// How far beyond the policy's cap the contribution histogram reaches (as a multiple of the
/// cap), to estimate the rows a cap removes from pairs with more rows than the policy allows.
pub const BOUNDS_HISTOGRAM_REACH: u64 = 8;

/// How many standard deviations of its histograms' noise the choice of a cap adds to the rows a
/// cap is estimated to remove (`dp::release::bounds`): the one-sided 95 % normal quantile, so
/// that a cap below the ceiling is taken only where the histograms show, above their noise,
/// that it removes little.
pub const BOUNDS_REMOVAL_Z: f64 = 1.645;

const _: () = assert!(BOUNDS_CHOICE_SHARE > 0.0 && BOUNDS_CHOICE_SHARE < 0.5);
/// How many standard deviations of their noise the noisy counts of a caps' histogram, summed
/// from its top candidate's bucket down, must exceed for the data to reach that bucket
/// (`dp::release::bounds`): above it the buckets read as empty. 2.5 lets pure noise through
/// at any one start with probability about 1 % (0.6 % for a normal sum, 1.5 % for one
/// Laplace bucket).
pub const BOUNDS_TAIL_Z: f64 = 2.5;

/// The most of a query's rows that the caps it chooses may remove from what their histograms
/// cannot see when `pgdp.max_bias` is unset (`dp::release::bounds`): below the data's reach
/// the histograms read as empty, and a tail hidden there by their noise, at its one-sided 95 %
/// bound, may remove at most this share at the caps taken; at a small ε or over few rows, where
/// any cap below the ceilings could remove more, the choice keeps to the ceilings.
pub const BOUNDS_HIDDEN_SHARE: f64 = 0.1;

/// `defaults.max_bias` when a policy omits it (`pgdp.max_bias` of every session that does not
/// SET it): an answer with a COUNT or SUM whose chosen caps are estimated, even at the low end
/// of the estimate's one-sided 95 % interval, to remove more than this share of its rows is
/// refused rather than returned that far low to a tool that never shows the NOTICE
/// (docs/privacy.md, "Refusing answers the caps bias").
pub const MAX_BIAS_DEFAULT: f64 = 0.1;

const _: () = assert!(MAX_BIAS_DEFAULT > 0.0 && MAX_BIAS_DEFAULT < 1.0);
const _: () = assert!(BOUNDS_REMOVAL_Z >= 0.0);
const _: () = assert!(BOUNDS_HIDDEN_SHARE > 0.0 && BOUNDS_HIDDEN_SHARE < 1.0);
const _: () = assert!(BOUNDS_TAIL_Z > 0.0);
const _: () = assert!(BOUNDS_CLAMP_SHARE > 0.0 && BOUNDS_CHOICE_SHARE + BOUNDS_CLAMP_SHARE < 0.5);
const _: () = assert!(BOUNDS_HISTOGRAM_REACH >= 2);
const _: () = assert!(BOUNDS_UPPER_HALVINGS >= 1 && BOUNDS_UPPER_HALVINGS <= 60);

/// Smallest ε a single query may spend; below it noise is astronomically large and samplers slow.
pub const EPSILON_PER_QUERY_MIN: f64 = 1e-6;

/// Largest ε a single query may spend, whatever the policy says.
pub const EPSILON_PER_QUERY_MAX: f64 = 100.0;

/// Largest absolute bound a policy may declare for a column, so that sensitivities and noisy sums
/// stay exactly representable.
pub const COLUMN_BOUND_ABS_MAX: f64 = 1e15;

/// The most repeats of a query the budget view and the charge NOTICE count
/// (`budget::repeats`): "about this many more queries like the last one". Beyond it they say
/// "at least" this many.
pub const REPEATS_COUNTED_MAX: u64 = 1_000_000;

/// Lifetime of a replayed answer in the replay cache when the policy does not set one.
pub const REPLAY_LIFETIME_DEFAULT_S: u64 = 24 * 60 * 60;

/// Smallest factor between consecutive points of a policy's `release_schedule`.
pub const RELEASE_SCHEDULE_RATIO_MIN: f64 = 1.01;

/// Largest factor between consecutive points of a policy's `release_schedule`.
pub const RELEASE_SCHEDULE_RATIO_MAX: f64 = 10.0;

/// Most points a `release_schedule` may have within its horizon (the statement timeout plus the
/// post-processing timeout): at most log2 of this many bits per query from timing.
pub const RELEASE_SCHEDULE_POINTS_MAX: usize = 64;

/// Most released groups whose noisy measures the ledger keeps for reuse by later queries
/// (`dp::release::NoisyMeasures`); a larger release is answered but not kept, so a query that
/// could have reused it is charged (the safe direction). One release's payload stays within a
/// few megabytes.
pub const MEASURES_STORED_GROUPS_MAX: usize = GROUPS_RELEASED_MAX;

/// Most group keys of a release whose coarser groupings the ledger keeps for reuse
/// (`dp::release::derive`): a release over public keys stores the sums of its cells for each
/// proper subset of its keys, `2^keys − 1` entries beside its own, so at most 15. A release with
/// more keys is answered and kept, but no coarser query is derived from it (it is charged: the
/// safe direction).
pub const COARSER_GROUPINGS_KEYS_MAX: usize = 4;

/// Most groups, over all the coarser groupings of one release, whose sums the ledger keeps
/// (`dp::release::derive::coarser_releases`, the coarsest first), so that the sums stored
/// beside a release are no larger than one stored release.
pub const COARSER_STORED_GROUPS_MAX: usize = MEASURES_STORED_GROUPS_MAX;

/// Largest HTTP request head the metrics endpoint reads (`--metrics`); a longer one gets 431.
pub const METRICS_REQUEST_BYTES_MAX: usize = 8 * 1024;

/// Time a client of the metrics endpoint has to send its request head, and to read the answer.
pub const METRICS_IO_TIMEOUT_MS: u64 = 5_000;

/// Most metrics-endpoint connections served at once; past it a connection is closed at once.
pub const METRICS_CONNECTIONS_MAX: usize = 32;

/// How long `/health` waits for the upstream and for the ledger to answer `SELECT 1`.
pub const HEALTH_CHECK_TIMEOUT_MS: u64 = 2_000;

/// How long a `/health` answer is reused, so that frequent probes do not each open connections.
pub const HEALTH_CACHE_MS: u64 = 1_000;
/// Events `pgdp budget history` lists when `--limit` is not given (the most recent ones).
pub const HISTORY_ROWS_DEFAULT: u64 = 50;

/// Most events `pgdp audit` exports (and `pgdp budget history --limit` lists) at once; a longer
/// window is refused with the hint to narrow `--since`/`--until`, so an export never holds an
/// unbounded log in memory.
pub const AUDIT_ROWS_MAX: u64 = 1_000_000;

/// Longest `--reason` text of a grant or reset, in bytes.
pub const ADMIN_REASON_BYTES_MAX: usize = 1_000;

const _: () = assert!(
    STATEMENTS_PER_MESSAGE_MAX >= 4,
    "psqlODBC sends several statements at connect"
);
const _: () = assert!(GROUPS_RELEASED_MAX <= UPSTREAM_ROWS_MAX);
const _: () = assert!(
    STANDBY_LAG_MAX_RANGE_MS.0 <= STANDBY_LAG_MAX_MS
        && STANDBY_LAG_MAX_MS <= STANDBY_LAG_MAX_RANGE_MS.1
);
const _: () = assert!(HISTORY_ROWS_DEFAULT >= 1 && HISTORY_ROWS_DEFAULT <= AUDIT_ROWS_MAX);
const _: () = assert!(PUBLIC_KEY_COMBINATIONS_MAX <= GROUPS_RELEASED_MAX);
const _: () = assert!(COARSER_GROUPINGS_KEYS_MAX <= GROUP_KEYS_PER_QUERY_MAX);
const _: () = assert!(
    MEASURES_STORED_GROUPS_MAX >= PUBLIC_KEY_COMBINATIONS_MAX,
    "a release over a whole public domain can be kept for reuse"
);
const _: () = assert!(CONNECTIONS_PER_ANALYST_MAX <= CONNECTIONS_MAX);
const _: () = assert!(CONNECTIONS_REFUSING_MAX >= 1 && CONNECTIONS_REFUSING_MAX <= CONNECTIONS_MAX);
const _: () = assert!(
    MESSAGE_BYTES_MAX > SQL_BYTES_MAX + 1024,
    "a Query or Parse of SQL_BYTES_MAX must fit in one message, so that it is refused by \
     classify with an ordinary error rather than by the message-size guard"
);
const _: () = assert!(
    CURSOR_ROWS_PER_SESSION_MAX >= GROUPS_RELEASED_MAX,
    "one cursor over a full release must fit"
);
const _: () = assert!(UPSTREAM_CONNECT_TIMEOUT_MS < STATEMENT_TIMEOUT_MS);
const _: () = assert!(CATALOG_STATEMENT_TIMEOUT_MS <= STATEMENT_TIMEOUT_MS);
const _: () = assert!(STARTUP_TIMEOUT_MS > 0);
const _: () = assert!(
    RELEASE_SCHEDULE_RATIO_MIN > 1.0 && RELEASE_SCHEDULE_RATIO_MIN < RELEASE_SCHEDULE_RATIO_MAX
);
const _: () = assert!(
    RELEASE_SCHEDULE_POINTS_MAX >= 2,
    "a floor at the statement timeout with the largest ratio has two points in the horizon"
);
const _: () = assert!(
    AUTH_FAILURES_PER_USER_MAX >= 3,
    "a user who mistypes a password twice must not be locked out"
);
const _: () = assert!(
    AUTH_FAILURES_PER_ADDRESS_MAX >= 5 * AUTH_FAILURES_PER_USER_MAX,
    "one user's typos behind a shared address must not lock the address out"
);
const _: () = assert!(AUTH_FAILURE_WINDOW_MS > 0 && AUTH_FAILURE_PEERS_MAX >= 1);
const _: () = assert!(AGGREGATES_PER_QUERY_MAX >= 1 && GROUP_KEYS_PER_QUERY_MAX >= 1);
// CUBE over four keys (16 sets) fits; GROUPING over every key fits its int4 mask.
const _: () = assert!(GROUPING_SETS_PER_QUERY_MAX >= 16 && GROUPING_ARGUMENTS_MAX < 32);
const _: () = assert!(GROUP_KEYS_PER_QUERY_MAX <= GROUPING_ARGUMENTS_MAX);
const _: () = assert!(
    UNIT_PATH_STEPS_MAX >= 1 && UNIT_PATH_STEPS_MAX < VIEW_TABLES_MAX,
    "a unit path is read through joins inside one table of a query"
);
const _: () = assert!(EPSILON_PER_QUERY_MIN > 0.0 && EPSILON_PER_QUERY_MIN < EPSILON_PER_QUERY_MAX);
const _: () = assert!(
    HEALTH_CHECK_TIMEOUT_MS < METRICS_IO_TIMEOUT_MS,
    "a health check answers before its client's read times out"
);
const _: () = assert!(METRICS_CONNECTIONS_MAX >= 1 && METRICS_REQUEST_BYTES_MAX >= 1024);

/// Most entries of the optimal partition selection's table of keep probabilities (one per count
/// of units until it is certain, about `2·ln(1/δ')/ε'`): beyond it (a tiny ε per group), pgdp
/// uses Laplace thresholding, which needs no table.
pub const SELECTION_TABLE_MAX: usize = 100_000;

/// The most cells of a synopsis's public domain (private multiplicative weights,
/// [`crate::dp::mechanism::pmw`]): each update reweights every cell
/// [`crate::dp::mechanism::pmw::REWEIGHT_PASSES`] times per measurement (16,384 cells × 200
/// measurements × 20 passes: about 65 million steps for the last update).
pub const SYNOPSIS_CELLS_MAX: usize = 16_384;

/// The most update rounds of a synopsis: its budget is split into `2T + 1` parts.
pub const SYNOPSIS_ROUNDS_MAX: usize = 200;

/// The most DP statements whose analysis and rewrite a pgdp process keeps
/// ([`crate::session`]'s plan cache, per policy generation): the oldest is forgotten first.
pub const PLANS_CACHED_MAX: usize = 512;

/// The longest statement text (bytes) whose analysis and rewrite are kept: longer statements
/// (long IN lists, generated SQL) are analysed each time rather than held in memory.
pub const PLAN_CACHE_TEXT_MAX: usize = 8_192;
