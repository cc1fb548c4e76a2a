//! One analyst's session: the one dispatcher that orders the steps of every statement.
//!
//! The front end hands [`Session::run`] a classified statement (and bound parameters). `run`
//! asks [`route`] once what answers it, and calls that leaf: the session's own state
//! (transactions, settings, cursors), constants, the budget view, the shadow catalog, or the DP
//! pipeline ([`dp`]). Describe ([`describe`]) and parameter inference ([`parameter_types`]) use
//! the same route. It returns plain data ([`Outcome`]) that the front end encodes.
//!
//! Invariants, each held by a type (ARCHITECTURE.md names them):
//! - The only path from upstream rows to an [`Outcome`] goes through [`crate::dp::release`]:
//!   upstream rows are [`crate::dp::release::PrivateRows`], and [`ClientRows`] accepts only a
//!   release, shadow-catalog rows or cells the session computed itself.
//! - Budget is charged durably before the rewritten SQL reaches the upstream, and never refunded:
//!   running it takes the charge's [`crate::budget::Receipt`].
//! - A refused statement changes no state of the session and spends nothing.
//! - A cursor's query runs once, at DECLARE; FETCH and MOVE only read the rows it released
//!   (post-processing, never the upstream or the ledger).

pub mod bind;
pub mod classify;
pub mod settings;

mod calendar;
mod composite;
mod fold;
mod scalar;
mod series;
mod setop;

mod afford;
mod budget;
mod constant;
mod cursor;
mod dp;
mod explain;
mod live;
mod message;
mod notices;
mod observe;
mod outcome;
mod pipeline;
mod plans;
mod route;
mod synopsis;

pub use dp::limit_of;
pub use live::{Live, Reloaded};
pub use outcome::{ClientRows, Notice, Outcome};
pub use route::{route, BudgetColumns, Route};

use std::sync::Arc;

use rand::rngs::ChaCha20Rng;
use rand::SeedableRng;

use crate::budget::Ledger;
use crate::dp::analyze;
use crate::dp::release::Budget;
use crate::error::{Error, Result};
use crate::output::{Cell, CellType, OutColumn};
use crate::policy::{Analyst, Policy};
use crate::session::classify::Statement;
use crate::session::settings::{Changed, Settings};
use crate::upstream::Upstream;
use sqlparser::ast;

/// What the whole server shares: the policy, the upstream and the ledger.
#[derive(Debug)]
pub struct Shared {
    /// The validated policy.
    pub policy: Arc<Policy>,
    /// The upstream database.
    pub upstream: Arc<Upstream>,
    /// The durable privacy ledger.
    pub ledger: Arc<Ledger>,
    /// The secret keying which groups a unit keeps: the policy's, or the ledger's, read on
    /// first need (the ledger may be down at start); see [`Shared::secret`].
    secret: tokio::sync::OnceCell<String>,
    /// The shadow catalog answering introspection, if it could be built.
    pub shadow: Option<crate::upstream::Shadow>,
    /// What pgdp knows about columns it relies on (unique unit-path keys, `NOT NULL` aggregate
    /// arguments): the upstream catalog's facts, learnt on first need and kept across reloads
    /// (they are facts about the upstream, not the policy), and this policy's declared unique
    /// keys with what reading their tables found (verified afresh for each policy).
    pub column_facts: Arc<crate::upstream::ColumnFacts>,
    /// How the upstream partitions the private tables, learnt on first need (kept across
    /// reloads, like the catalog's facts).
    pub partitioning: Arc<crate::upstream::Partitioning>,
    /// How many reloads produced this state (0: the policy pgdp started with).
    pub generation: u64,
    /// Tests only: a seed for the noise generator. Production leaves it `None` and every session
    /// seeds a ChaCha20 generator from the operating system.
    pub noise_seed: Option<[u8; 32]>,
    /// The server's operational metrics (served only with `--metrics`).
    pub metrics: Arc<crate::metrics::Metrics>,
    /// The policy's synopses this process has loaded, by name and declaration fingerprint, with
    /// the round in progress (kept across reloads: a changed declaration has another key).
    pub(super) synopses: Arc<tokio::sync::Mutex<synopsis::Loaded>>,
    /// The analysis and rewrite of the DP statements this generation has planned
    /// ([`plans`]; not carried across a reload: they are the policy's).
    plans: plans::PlanCache,
}

impl Shared {
    /// The shared state of a server. Touches neither the ledger nor the upstream: either may be
    /// down at start.
    pub async fn new(
        policy: Policy,
        upstream: Upstream,
        ledger: Ledger,
        shadow: Option<crate::upstream::Shadow>,
    ) -> Result<Shared> {
        let secret = tokio::sync::OnceCell::new_with(policy.secret.clone());
        let column_facts =
            crate::upstream::ColumnFacts::new(Arc::default(), policy.declared_unique_keys());
        Ok(Shared {
            policy: Arc::new(policy),
            upstream: Arc::new(upstream),
            ledger: Arc::new(ledger),
            secret,
            shadow,
            column_facts: Arc::new(column_facts),
            partitioning: Arc::default(),
            generation: 0,
            noise_seed: None,
            metrics: Arc::new(crate::metrics::Metrics::new()),
            synopses: Arc::default(),
            plans: plans::PlanCache::default(),
        })
    }

    /// The state after a reload to `policy`: the same upstream, ledger, catalog facts and
    /// metrics, the new policy's shadow catalog, secret and declared unique keys (not verified
    /// yet), and the next generation.
    pub(super) fn successor(
        &self,
        policy: Policy,
        shadow: Option<crate::upstream::Shadow>,
    ) -> Shared {
        let column_facts = crate::upstream::ColumnFacts::new(
            self.column_facts.catalog(),
            policy.declared_unique_keys(),
        );
        Shared {
            secret: tokio::sync::OnceCell::new_with(policy.secret.clone()),
            policy: Arc::new(policy),
            upstream: self.upstream.clone(),
            ledger: self.ledger.clone(),
            shadow,
            column_facts: Arc::new(column_facts),
            partitioning: self.partitioning.clone(),
            metrics: self.metrics.clone(),
            synopses: self.synopses.clone(),
            plans: plans::PlanCache::default(),
            generation: self.generation + 1,
            noise_seed: self.noise_seed,
        }
    }

    /// The secret keying which groups a unit keeps: the policy's, else the one stored in the
    /// ledger (created there by the first pgdp to ask). 57P03 while the ledger is unreachable.
    pub async fn secret(&self) -> Result<&str> {
        self.secret
            .get_or_try_init(|| self.ledger.group_choice_secret())
            .await
            .map(String::as_str)
    }
}

/// One analyst's connection state.
#[derive(Debug)]
pub struct Session {
    /// The authenticated analyst.
    pub analyst: Analyst,
    /// Current settings.
    pub settings: Settings,
    /// Settings at connection start (values for RESET / DEFAULT).
    pub defaults: Settings,
    /// The upstream's version string, reported to clients.
    pub server_version: String,
    /// Whether a transaction block is open (BEGIN seen).
    pub in_transaction: bool,
    /// Settings at BEGIN, restored by ROLLBACK (SET is transactional in PostgreSQL).
    settings_at_begin: Option<Settings>,
    /// Open savepoints of the transaction block, innermost last, with the settings at each.
    savepoints: Vec<(String, Settings)>,
    /// pgdp's process id as reported by `pg_backend_pid()`.
    pub backend_pid: i32,
    /// Stops this connection's running upstream statement (CancelRequest, client gone).
    pub cancel: Arc<crate::upstream::Cancel>,
    /// The noise generator of this session.
    rng: ChaCha20Rng,
    /// Open cursors (see [`Session::run`]).
    cursors: cursor::Cursors,
    /// The cost of this session's last charged DP query, for the budget view's count of
    /// queries like it that still fit.
    last_cost: Option<crate::budget::Cost>,
    /// Charges made by this session, so the dispatcher can tell a DP statement that reached
    /// the ledger (whose answer or failure waits for the release schedule) from one refused
    /// before it.
    charges: u64,
    /// The policy generation this session last followed ([`Session::follow_policy`]).
    generation: u64,
    /// How the DP pipeline answered the statement running now (replayed, reused, charged), for
    /// the metrics ([`Session::observe`]).
    served: Option<crate::metrics::Served>,
    /// Reads of private data answered without a new charge (a synopsis's histogram, paid for
    /// once): the release schedule waits after them as after a charge.
    private_reads: u64,
}

impl Session {
    /// A new session for an authenticated analyst.
    pub fn new(
        shared: &Shared,
        analyst: Analyst,
        server_version: String,
        backend_pid: i32,
        cancel: Arc<crate::upstream::Cancel>,
    ) -> Result<Session> {
        let settings = Settings::new(&shared.policy, &analyst, "UTC");
        let rng = match shared.noise_seed {
            Some(seed) => ChaCha20Rng::from_seed(seed),
            None => crate::dp::mechanism::secure_rng()?,
        };
        Ok(Session {
            analyst,
            defaults: settings.clone(),
            settings,
            server_version,
            in_transaction: false,
            settings_at_begin: None,
            savepoints: Vec::new(),
            backend_pid,
            cancel,
            rng,
            cursors: cursor::Cursors::default(),
            last_cost: None,
            charges: 0,
            generation: shared.generation,
            served: None,
            private_reads: 0,
        })
    }

    /// Brings the session up to the policy of `shared` before a statement runs, if a reload
    /// changed it: the analyst's budget, caps and credentials are the new policy's, and the
    /// per-query ε, δ and mechanism that the session did not SET follow the new defaults (as
    /// PostgreSQL sessions follow a reloaded configuration file except where they SET a value).
    /// [`Error::AdminShutdown`] if the new policy no longer lists the analyst.
    pub fn follow_policy(&mut self, shared: &Shared) -> Result<()> {
        if self.generation == shared.generation {
            return Ok(());
        }
        let analyst = shared
            .policy
            .analysts
            .get(&self.analyst.name)
            .cloned()
            .ok_or(Error::AdminShutdown)?;
        let fresh = Settings::new(&shared.policy, &analyst, &self.defaults.time_zone);
        let old = self.defaults.clone();
        for settings in [&mut self.settings, &mut self.defaults]
            .into_iter()
            .chain(self.settings_at_begin.as_mut())
            .chain(self.savepoints.iter_mut().map(|(_, s)| s))
        {
            settings.follow_defaults(&old, &fresh);
        }
        self.analyst = analyst;
        self.generation = shared.generation;
        Ok(())
    }

    /// The analysis context of this session.
    pub fn context<'a>(&self, shared: &'a Shared) -> analyze::Context<'a> {
        let schemas = shared.policy.schemas();
        let mut search_path: Vec<String> = self
            .settings
            .search_path
            .split(',')
            .map(|s| s.trim().trim_matches('"').to_ascii_lowercase())
            .filter(|s| schemas.contains(s))
            .collect();
        if search_path.is_empty() {
            search_path = schemas;
        }
        analyze::Context {
            policy: &shared.policy,
            search_path,
        }
    }

    /// The session's search_path restricted to schemas that exist in the shadow catalog.
    fn catalog_search_path(&self, shared: &Shared) -> Vec<String> {
        let schemas = shared.policy.schemas();
        let mut path: Vec<String> = self
            .settings
            .search_path
            .split(',')
            .map(|s| s.trim().trim_matches('"').to_ascii_lowercase())
            .filter(|s| schemas.contains(s) || s == "public" || s == "pg_catalog")
            .collect();
        // Like a database whose search_path lists the policy's schemas, so `\d` shows tables.
        for s in schemas {
            if !path.contains(&s) {
                path.push(s);
            }
        }
        path
    }

    fn budget(&self) -> Budget {
        Budget {
            epsilon: self.settings.epsilon,
            delta: self.settings.delta,
            mechanism: self.settings.mechanism,
        }
    }

    /// Runs one classified statement: the one dispatcher. `params` are the bound parameter
    /// values as text.
    pub async fn run(
        &mut self,
        shared: &Shared,
        statement: &Statement,
        params: &[Option<String>],
    ) -> Result<Outcome> {
        // One route per statement: folding time constants replaces expressions by literals,
        // so only a folded statement is routed again.
        let routed = route(statement)?;
        let dp_query = match (&routed, statement) {
            (Route::Dp(query) | Route::Explain(query), _) => Some(*query),
            (Route::Cursor, Statement::DeclareCursor { query, .. }) => {
                match route::route_query(query)? {
                    Route::Dp(_) => Some(query.as_ref()),
                    _ => None,
                }
            }
            _ => None,
        };
        let folded = match dp_query {
            Some(query) => self.fold_query_time(shared, statement, query).await?,
            None => None,
        };
        let (statement, routed) = match &folded {
            Some(folded) => (folded, route(folded)?),
            None => (statement, routed),
        };
        match routed {
            Route::Session => self.session_statement_checked(shared, statement).await,
            Route::Cursor => match statement {
                Statement::DeclareCursor { name, hold, query } => {
                    self.declare_cursor(shared, name, *hold, query, params)
                        .await
                }
                Statement::Fetch {
                    name,
                    count,
                    move_only,
                } => self.fetch_cursor(name, *count, *move_only),
                Statement::CloseCursor { name } => self.close_cursor(name.as_deref()),
                _ => Err(Error::internal("not a cursor statement")),
            },
            answered => Ok(Outcome::Rows(self.rows(shared, answered, params).await?)),
        }
    }

    /// The rows of a statement whose route answers with rows.
    pub(super) async fn rows(
        &mut self,
        shared: &Shared,
        route: Route<'_>,
        params: &[Option<String>],
    ) -> Result<ClientRows> {
        match route {
            Route::Show(name) => {
                let (column, value) = self.settings.show(name, &self.server_version)?;
                Ok(ClientRows::computed(
                    vec![OutColumn::new(column, CellType::Text)],
                    vec![vec![Cell::Text(value)]],
                ))
            }
            Route::Budget(columns) => self.budget_view(shared, columns).await,
            Route::Constant(items) => self.constants(shared, items),
            Route::SetConfig(call) => self.set_config(shared, &call, params).await,
            Route::Catalog(query) => self.catalog_rows(shared, query, params).await,
            Route::Dp(query) => match shared.policy.release_schedule {
                None => self.dp_query(shared, query, params).await,
                Some(schedule) => {
                    self.dp_query_on_schedule(shared, query, params, schedule)
                        .await
                }
            },
            Route::Explain(query) => self.explain(shared, query, params).await,
            Route::Session | Route::Cursor => Err(Error::internal("a route without rows")),
        }
    }

    /// [`Self::session_statement`], with a new time zone checked on the shadow catalog (and
    /// the old one kept when it is refused).
    pub(super) async fn session_statement_checked(
        &mut self,
        shared: &Shared,
        statement: &Statement,
    ) -> Result<Outcome> {
        let zone_before = self.settings.time_zone.clone();
        let outcome = self.session_statement(shared, statement)?;
        if self.settings.time_zone != zone_before {
            if let Err(e) = self.check_time_zone(shared).await {
                self.settings.time_zone = zone_before;
                return Err(e);
            }
        }
        Ok(outcome)
    }

    /// Transaction control, SET, RESET and DEALLOCATE. The end of a transaction block also
    /// closes its cursors.
    fn session_statement(&mut self, shared: &Shared, statement: &Statement) -> Result<Outcome> {
        let outcome = self.session_state(shared, statement)?;
        match statement {
            Statement::Commit => self.end_block_cursors(true),
            Statement::Rollback => self.end_block_cursors(false),
            _ => {}
        }
        Ok(outcome)
    }

    fn session_state(&mut self, shared: &Shared, statement: &Statement) -> Result<Outcome> {
        match statement {
            Statement::Begin => {
                if !self.in_transaction {
                    self.settings_at_begin = Some(self.settings.clone());
                }
                self.in_transaction = true;
                Ok(Outcome::TransactionStart)
            }
            Statement::Commit => {
                self.in_transaction = false;
                self.settings_at_begin = None;
                self.savepoints.clear();
                Ok(Outcome::TransactionEnd {
                    tag: "COMMIT".into(),
                })
            }
            Statement::Rollback => {
                self.in_transaction = false;
                self.savepoints.clear();
                if let Some(saved) = self.settings_at_begin.take() {
                    self.settings = saved;
                }
                Ok(Outcome::TransactionEnd {
                    tag: "ROLLBACK".into(),
                })
            }
            Statement::Savepoint { name } => {
                if !self.in_transaction {
                    return Err(Error::NoTransaction {
                        what: "SAVEPOINT".into(),
                    });
                }
                self.savepoints.push((name.clone(), self.settings.clone()));
                Ok(Outcome::Command {
                    tag: "SAVEPOINT".into(),
                    reported: None,
                })
            }
            Statement::ReleaseSavepoint { name } | Statement::RollbackToSavepoint { name } => {
                let rollback = matches!(statement, Statement::RollbackToSavepoint { .. });
                let what = if rollback {
                    "ROLLBACK TO SAVEPOINT"
                } else {
                    "RELEASE SAVEPOINT"
                };
                if !self.in_transaction {
                    return Err(Error::NoTransaction { what: what.into() });
                }
                let Some(at) = self.savepoints.iter().rposition(|(n, _)| n == name) else {
                    return Err(Error::UnknownCursor {
                        kind: "savepoint",
                        name: name.clone(),
                    });
                };
                if rollback {
                    // Settings come back as they were; charges stay (nothing is refunded).
                    self.settings = self.savepoints[at].1.clone();
                    self.savepoints.truncate(at + 1);
                } else {
                    self.savepoints.truncate(at);
                }
                Ok(Outcome::Command {
                    tag: if rollback { "ROLLBACK" } else { "RELEASE" }.into(),
                    reported: None,
                })
            }
            Statement::Set { name, value } => {
                let Changed {
                    name,
                    value,
                    reported,
                } = self.settings.set(
                    name,
                    value,
                    &shared.policy,
                    &self.analyst,
                    &self.defaults,
                )?;
                Ok(Outcome::Command {
                    tag: "SET".into(),
                    reported: reported.then_some((name, value)),
                })
            }
            Statement::Reset { name } => {
                let Changed {
                    name,
                    value,
                    reported,
                } = self.settings.set(
                    name,
                    "DEFAULT",
                    &shared.policy,
                    &self.analyst,
                    &self.defaults,
                )?;
                Ok(Outcome::Command {
                    tag: "RESET".into(),
                    reported: reported.then_some((name, value)),
                })
            }
            // The wire layer frees the prepared statement itself; the tag is all that remains.
            Statement::Deallocate { .. } => Ok(Outcome::Command {
                tag: "DEALLOCATE".into(),
                reported: None,
            }),
            _ => Err(Error::internal("not a session statement")),
        }
    }
}

/// The schema of a statement's result, known before running it (for Describe): `None` for a
/// statement without rows. Follows the same [`route`] as [`Session::run`].
impl Session {
    /// A time zone PostgreSQL does not know would fail every DP query of the session upstream,
    /// after its charge (each runs under the session's zone): it is refused here, as PostgreSQL
    /// refuses it, by setting it on the shadow catalog.
    async fn check_time_zone(&self, shared: &Shared) -> Result<()> {
        let Some(shadow) = &shared.shadow else {
            return Ok(());
        };
        let sql = crate::dp::sql::ShadowSql::new("SELECT 1".to_string()).in_zone(
            &crate::upstream::time_zone_setting(&self.settings.time_zone)?,
        );
        match shadow.evaluate(&self.analyst.name, &sql).await {
            Ok(_) => Ok(()),
            Err(Error::PostProcessing { .. }) => Err(Error::InvalidParameter {
                name: "TimeZone".into(),
                reason: "is not a time zone PostgreSQL knows".into(),
                hint: "Use a name from pg_timezone_names, e.g. SET TimeZone = 'Europe/Paris'."
                    .into(),
            }),
            Err(other) => Err(other),
        }
    }
}

/// The columns `statement` answers with, without running it; `parameter_types` are the OIDs its
/// parameters are described with (the client's, else PostgreSQL's), for stand-in values of them.
pub async fn describe(
    shared: &Shared,
    session: &Session,
    statement: &Statement,
    parameter_types: &[u32],
) -> Result<Option<Vec<OutColumn>>> {
    Ok(Some(match route(statement)? {
        Route::Session => return Ok(None),
        Route::Cursor => match statement {
            // A prepared FETCH returns the cursor's columns (if it is open when prepared).
            Statement::Fetch {
                name,
                move_only: false,
                ..
            } => return Ok(session.cursor_columns(name)),
            _ => return Ok(None),
        },
        Route::Show(name) => {
            let (column, _) = session.settings.show(name, &session.server_version)?;
            vec![OutColumn::new(column, CellType::Text)]
        }
        Route::Budget(columns) => {
            let all = budget::budget_columns();
            columns
                .names_for(session.analyst.budget.period.is_some())?
                .iter()
                .filter_map(|n| all.iter().find(|c| c.name == *n).cloned())
                .collect()
        }
        Route::Constant(items) => items
            .iter()
            .map(|item| {
                let (name, _cell, ty) = session.evaluate_constant(shared, item)?;
                Ok(OutColumn::new(name, ty))
            })
            .collect::<Result<Vec<_>>>()?,
        Route::SetConfig(call) => vec![OutColumn::new(call.column, CellType::Text)],
        Route::Catalog(query) => session.catalog_columns(shared, query).await?,
        Route::Dp(query) => {
            let folded = session.fold_time(shared, statement).await?;
            let query = match &folded {
                Some(Statement::Query(folded)) => folded.as_ref(),
                _ => query,
            };
            session
                .dp_columns_before_bind(shared, query, parameter_types)
                .await?
        }
        Route::Explain(_) => explain::explain_columns(),
    }))
}

impl Session {
    /// A query of catalog relations (or of constants pgdp does not evaluate itself), checked
    /// against the allow-lists and run on the data-free shadow catalog.
    pub(super) async fn catalog_rows(
        &self,
        shared: &Shared,
        query: &ast::Query,
        params: &[Option<String>],
    ) -> Result<ClientRows> {
        let sql = crate::upstream::catalog::check(query, params, &|name| {
            Ok(self.settings.show(name, &self.server_version)?.1)
        })?;
        let shadow = shared.shadow.as_ref().ok_or_else(no_shadow)?;
        let search_path = self.catalog_search_path(shared);
        Ok(ClientRows::catalog(
            shadow.run(&self.analyst.name, &sql, &search_path).await?,
        ))
    }

    /// The columns of [`Session::catalog_rows`]' answer, described on the shadow catalog.
    pub(super) async fn catalog_columns(
        &self,
        shared: &Shared,
        query: &ast::Query,
    ) -> Result<Vec<OutColumn>> {
        let sql = crate::upstream::catalog::check(query, &[], &|name| {
            Ok(self.settings.show(name, &self.server_version)?.1)
        })?;
        let shadow = shared.shadow.as_ref().ok_or_else(no_shadow)?;
        shadow.describe(&sql).await
    }

    /// The columns of a DP query's answer, described before Bind.
    async fn dp_columns_before_bind(
        &self,
        shared: &Shared,
        query: &ast::Query,
        parameter_types: &[u32],
    ) -> Result<Vec<OutColumn>> {
        let refusal = match self.dp_columns(shared, query).await {
            Ok(columns) => return Ok(columns),
            Err(refusal) => refusal,
        };
        // Refused with `$n` in places only a value can stand (LIMIT $1, date_trunc($1, …),
        // CASE … THEN $2): described with stand-in values of the parameters' types; Execute
        // analyses it with the bound values. PostgreSQL's column types never depend on the
        // values, so any set of stand-ins analysis admits describes every binding; the second
        // set describes a statement that divides by a parameter (`AVG(income / $1)`). Refused
        // with every set, the refusal is the first set's: the one the statement gets with values
        // in place (raw rows with `LIMIT $1` are raw rows, 42501, not a parameter pgdp cannot
        // place).
        if !bind::has_parameters(query) {
            return Err(refusal);
        }
        let types: Vec<bind::ParameterType> = if parameter_types.is_empty() {
            match self.described_parameters(shared, query).await {
                Some(oids) => oids.into_iter().map(bind::ParameterType::of_oid).collect(),
                None => return Err(refusal),
            }
        } else {
            parameter_types
                .iter()
                .map(|oid| bind::ParameterType::of_oid(*oid))
                .collect()
        };
        let mut first = None;
        for set in bind::StandIns::ALL {
            let Ok(stand_in) = bind::bind(query, &set.values(query, &types), &types) else {
                break;
            };
            match self.dp_columns(shared, &stand_in).await {
                Ok(columns) => return Ok(columns),
                Err(e) => {
                    first.get_or_insert(e);
                }
            }
        }
        Err(first.unwrap_or(refusal))
    }
}

/// PostgreSQL's types (OIDs) of the parameters of a DP statement (or its EXPLAIN), as the shadow
/// catalog prepares it on the upstream's column types (what Describe reports where the client
/// declared none); empty when there are none or the shadow cannot prepare it.
pub async fn described_parameter_types(
    shared: &Shared,
    session: &Session,
    statement: &Statement,
) -> Vec<u32> {
    match route(statement) {
        Ok(Route::Dp(query) | Route::Explain(query)) if bind::has_parameters(query) => session
            .described_parameters(shared, query)
            .await
            .unwrap_or_default(),
        _ => Vec::new(),
    }
}

impl Session {
    async fn described_parameters(&self, shared: &Shared, query: &ast::Query) -> Option<Vec<u32>> {
        let search_path = self.context(shared).search_path;
        shared
            .shadow
            .as_ref()?
            .parameter_types(&query.to_string(), &search_path)
            .await
    }
}

/// The highest `$n` a statement's query uses (0 without parameters), at most
/// [`crate::limits::PARAMETERS_PER_STATEMENT_MAX`]: how many parameters Describe reports when
/// the client declared none (`SELECT set_config('TimeZone', $1, false)`).
pub fn placeholder_count(statement: &Statement) -> usize {
    let query = match statement {
        Statement::Query(query)
        | Statement::Explain(query)
        | Statement::DeclareCursor { query, .. } => query,
        _ => return 0,
    };
    let mut highest = 0;
    let _ = ast::visit_expressions(query.as_ref(), |e| {
        if let ast::Expr::Value(v) = e {
            if let ast::Value::Placeholder(p) = &v.value {
                if let Some(n) = p.strip_prefix('$').and_then(|n| n.parse::<usize>().ok()) {
                    highest = highest.max(n);
                }
            }
        }
        std::ops::ControlFlow::<()>::Continue(())
    });
    highest.min(crate::limits::PARAMETERS_PER_STATEMENT_MAX)
}

/// `statement` with its bound parameters written in as literals ([`bind`]), when it is a DP
/// query, an EXPLAIN or a cursor over one and has parameters; `None` otherwise (catalog queries
/// bind their parameters themselves, as strings the shadow catalog types).
pub fn bind_statement(
    statement: &Statement,
    values: &[Option<String>],
    types: &[bind::ParameterType],
) -> Result<Option<Statement>> {
    let Some(query) = dp_query_of(statement)? else {
        return Ok(None);
    };
    if !bind::has_parameters(query) {
        return Ok(None);
    }
    let bound = bind::bind(query, values, types)?;
    Ok(Some(with_dp_query(statement, bound)))
}

/// The DP query a statement runs or explains: a query routed to the DP pipeline, the query of
/// an EXPLAIN, or of a cursor over a DP query.
fn dp_query_of(statement: &Statement) -> Result<Option<&ast::Query>> {
    Ok(match statement {
        Statement::Query(query) | Statement::DeclareCursor { query, .. } => {
            match route::route_query(query)? {
                Route::Dp(_) => Some(query),
                _ => None,
            }
        }
        Statement::Explain(query) => Some(query),
        _ => None,
    })
}

/// `statement` with its DP query ([`dp_query_of`]) replaced by `query`.
fn with_dp_query(statement: &Statement, query: ast::Query) -> Statement {
    let query = Box::new(query);
    match statement {
        Statement::Explain(_) => Statement::Explain(query),
        Statement::DeclareCursor { name, hold, .. } => Statement::DeclareCursor {
            name: name.clone(),
            hold: *hold,
            query,
        },
        _ => Statement::Query(query),
    }
}

impl Session {
    /// `statement` with its DP query's time constants folded ([`fold`]) to their values now,
    /// in the session's time zone; `None` when there are none.
    async fn fold_time(&self, shared: &Shared, statement: &Statement) -> Result<Option<Statement>> {
        match dp_query_of(statement)? {
            Some(query) => self.fold_query_time(shared, statement, query).await,
            None => Ok(None),
        }
    }

    /// [`Self::fold_time`] of `statement`, whose DP query ([`dp_query_of`]) is `query`.
    async fn fold_query_time(
        &self,
        shared: &Shared,
        statement: &Statement,
        query: &ast::Query,
    ) -> Result<Option<Statement>> {
        let expressions = fold::foldable(query);
        if expressions.is_empty() {
            return Ok(None);
        }
        let shadow = shared.shadow.as_ref().ok_or_else(|| {
            Error::unsupported(
                "current_date, now() and TO_DATE(…) on this server",
                "pgdp computes them on its shadow catalog, which this server does not have; write the date as a literal: DATE '2024-01-01'.",
            )
        })?;
        let zone = crate::upstream::time_zone_setting(&self.settings.time_zone)?;
        let rows = shadow
            .evaluate(
                &self.analyst.name,
                &fold::evaluation_sql(&expressions, &zone),
            )
            .await?;
        let row = rows
            .into_rows()
            .into_iter()
            .next()
            .filter(|row| row.len() == 2 * expressions.len())
            .ok_or_else(|| Error::internal("folded constants: no row"))?;
        let values: Vec<(Option<String>, String)> = row
            .chunks(2)
            .map(|pair| (pair[0].clone(), pair[1].clone().unwrap_or_default()))
            .collect();
        let folded = fold::substitute(query, &values)?;
        Ok(Some(with_dp_query(statement, folded)))
    }
}

/// Parameter types a DP statement infers (for Describe of untyped parameters).
pub fn parameter_types(
    shared: &Shared,
    session: &Session,
    statement: &Statement,
) -> Vec<(usize, crate::policy::ColumnType, Option<String>)> {
    match route(statement) {
        Ok(Route::Dp(query) | Route::Explain(query)) => {
            match analyze::analyze(query, &session.context(shared)) {
                Ok(plan) => plan
                    .parameters()
                    .iter()
                    .map(|p| (p.index, p.ty, p.declared.clone()))
                    .collect(),
                Err(_) => Vec::new(),
            }
        }
        _ => Vec::new(),
    }
}

fn no_shadow() -> Error {
    Error::unsupported(
        "catalog queries on this server",
        "pgdp could not build its shadow catalog (the upstream role needs CREATEDB once); see the server log.",
    )
}

/// The shipped demo policy, for the session's unit tests.
#[cfg(test)]
pub(crate) fn demo_policy() -> crate::policy::Policy {
    crate::policy::parse(include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/policies/demo.yaml"
    )))
    .expect("the demo policy parses")
}
