//! One analyst's session, and the one function that orders the steps of a statement.
//!
//! The wire layer hands [`Session::execute`] a classified statement (and bound parameters);
//! `execute` answers session statements locally, and sends DP queries through
//! analyze → plan → charge → rewrite → backend → release. It returns plain data ([`Outcome`]) that
//! the wire layer encodes.
//!
//! Invariants:
//! - The only path from upstream rows to an [`Outcome`] goes through [`crate::dp::release`].
//! - Budget is charged durably before the rewritten SQL reaches the upstream, and never refunded.
//! - A refused statement changes no state of the session and spends nothing.
//! - A cursor's query runs once, at DECLARE, through [`Session::execute`]; FETCH and MOVE only
//!   read the rows it released (post-processing, never the upstream or the ledger).

pub mod classify;
pub mod settings;

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use sqlparser::ast::{self, Expr, SelectItem, SetExpr};

use rand::rngs::ChaCha20Rng;
use rand::SeedableRng;

use crate::budget::{self, Fixed, Ledger, Limit};
use crate::dp::analyze::{self, Plan};
use crate::dp::release::{self, Budget};
use crate::dp::rewrite::{self, Rewrite};
use crate::error::{Error, Result};
use crate::output::{Cell, CellType, OutColumn};
use crate::policy::{Analyst, BudgetSpec, Policy};
use crate::session::classify::Statement;
use crate::session::settings::{Changed, Settings};
use crate::upstream::Upstream;

/// What the whole server shares: the policy, the upstream and the ledger.
#[derive(Debug)]
pub struct Shared {
    /// The validated policy.
    pub policy: Arc<Policy>,
    /// The upstream database.
    pub backend: Arc<Upstream>,
    /// The durable privacy ledger.
    pub ledger: Arc<Ledger>,
    /// The secret keying which groups a unit keeps: the policy's, or the ledger's, read on
    /// first need (the ledger may be down at start); see [`Shared::secret`].
    secret: tokio::sync::OnceCell<String>,
    /// The shadow catalog answering introspection, if it could be built.
    pub shadow: Option<crate::upstream::Shadow>,
    /// Which keys of unit paths the upstream declares unique, learnt on first need.
    pub unique_keys: crate::upstream::UniqueKeys,
    /// Tests only: a seed for the noise generator. Production leaves it `None` and every session
    /// seeds a ChaCha20 generator from the operating system.
    pub noise_seed: Option<[u8; 32]>,
}

impl Shared {
    /// The shared state of a server. Touches neither the ledger nor the upstream: either may be
    /// down at start.
    pub async fn new(
        policy: Policy,
        backend: Upstream,
        ledger: Ledger,
        shadow: Option<crate::upstream::Shadow>,
    ) -> Result<Shared> {
        let secret = tokio::sync::OnceCell::new_with(policy.secret.clone());
        Ok(Shared {
            policy: Arc::new(policy),
            backend: Arc::new(backend),
            ledger: Arc::new(ledger),
            secret,
            shadow,
            unique_keys: crate::upstream::UniqueKeys::default(),
            noise_seed: None,
        })
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

/// A policy budget as exact ledger limits (rounded down: never in the analyst's favour).
pub fn limit_of(spec: &BudgetSpec) -> Result<Limit> {
    let e = Fixed::from_f64_floor(spec.epsilon).map_err(|_| Error::internal("budget epsilon"))?;
    let d = Fixed::from_f64_floor(spec.delta).map_err(|_| Error::internal("budget delta"))?;
    Ok(Limit::new(e, d))
}

/// A message to the client besides the result (a NOTICE).
#[derive(Debug, Clone, PartialEq)]
pub struct Notice {
    /// The notice text.
    pub message: String,
}

/// The result of one statement.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// A command with its tag (`SET`, `DEALLOCATE`, …).
    Command {
        tag: String,
        reported: Option<(String, String)>,
    },
    /// `BEGIN`: enters a transaction block.
    TransactionStart,
    /// `COMMIT` / `ROLLBACK`: leaves it (the tag is the command's).
    TransactionEnd { tag: String },
    /// Rows, with the SELECT tag implied.
    Rows {
        columns: Vec<OutColumn>,
        rows: Vec<Vec<Cell>>,
        notices: Vec<Notice>,
    },
}

/// The schema of a statement's result, known before running it (for Describe).
pub async fn describe(
    shared: &Shared,
    session: &Session,
    statement: &Statement,
) -> Result<Option<Vec<OutColumn>>> {
    match statement {
        Statement::Query(query) => match constant_select(query) {
            Some(items) => Ok(Some(
                items
                    .iter()
                    .map(|item| {
                        let (name, _cell, ty) = session.evaluate_constant(shared, item)?;
                        Ok(OutColumn::new(name, ty))
                    })
                    .collect::<Result<Vec<_>>>()?,
            )),
            None if budget_view(query)?.is_some() => {
                let all = budget_columns();
                let names = budget_view(query)?.unwrap_or_default();
                Ok(Some(
                    names
                        .iter()
                        .map(|n| {
                            all.iter()
                                .find(|a| a.name == *n)
                                .cloned()
                                .ok_or_else(|| Error::UnknownColumn { name: n.clone() })
                        })
                        .collect::<Result<Vec<_>>>()?,
                ))
            }
            None if crate::upstream::catalog::is_catalog_query(query) => {
                crate::upstream::catalog::check(query, &shared.policy)?;
                let shadow = shared.shadow.as_ref().ok_or_else(no_shadow)?;
                let mut q = query.as_ref().clone();
                crate::upstream::catalog::bind_parameters(&mut q, &[]);
                let columns = shadow.describe(&q.to_string()).await?;
                Ok(Some(
                    columns
                        .into_iter()
                        .map(|(n, oid)| OutColumn::new(n, CellType::Raw(oid)))
                        .collect(),
                ))
            }
            None => {
                let plan = analyze::analyze(query, &session.context(shared))?;
                Ok(Some(release::columns(&plan, session.settings.accuracy)))
            }
        },
        Statement::Show { name } if name == "pgdp.budget" => Ok(Some(budget_columns())),
        Statement::Show { name } => {
            let (column, _) = session.settings.show(name, &session.server_version)?;
            Ok(Some(vec![OutColumn::new(column, CellType::Text)]))
        }
        Statement::Explain(_) => Ok(Some(vec![OutColumn::new("QUERY PLAN", CellType::Text)])),
        _ => Ok(None),
    }
}

fn no_shadow() -> Error {
    Error::unsupported(
        "catalog queries on this server",
        "pgdp could not build its shadow catalog (the upstream role needs CREATEDB once); see the server log.",
    )
}

/// EXPLAIN shows the upstream SQL, but never the secret that keys the choice of groups.
fn redact_secret(line: &str, secret: &str) -> String {
    if secret.is_empty() {
        return line.to_string();
    }
    line.replace(&secret.replace('\'', "''"), "<secret>")
        .replace(
            &crate::dp::rewrite::ranking_seed(secret).to_string(),
            "<secret>",
        )
}

/// Parameter types a DP or catalog statement infers (for Describe of untyped parameters).
pub fn parameter_types(
    shared: &Shared,
    session: &Session,
    statement: &Statement,
) -> Vec<(usize, crate::policy::ColumnType, Option<String>)> {
    match statement {
        Statement::Query(q) | Statement::Explain(q)
            if constant_select(q).is_none() && !crate::upstream::catalog::is_catalog_query(q) =>
        {
            match analyze::analyze(q, &session.context(shared)) {
                Ok(plan) => plan
                    .parameters
                    .iter()
                    .map(|p| (p.index, p.ty, p.declared.clone()))
                    .collect(),
                Err(_) => Vec::new(),
            }
        }
        _ => Vec::new(),
    }
}

/// `SELECT <columns> FROM pgdp.budget`: the analyst's own budget as a one-row virtual table.
/// Returns the requested column names, or None if the query is not about `pgdp.budget`.
fn budget_view(query: &ast::Query) -> Result<Option<Vec<String>>> {
    let SetExpr::Select(select) = query.body.as_ref() else {
        return Ok(None);
    };
    let [from] = select.from.as_slice() else {
        return Ok(None);
    };
    let ast::TableFactor::Table { name, .. } = &from.relation else {
        return Ok(None);
    };
    let parts: Vec<String> = name
        .0
        .iter()
        .map(|p| p.to_string().to_ascii_lowercase())
        .collect();
    if parts != ["pgdp", "budget"] {
        return Ok(None);
    }
    let plain = from.joins.is_empty()
        && select.selection.is_none()
        && select.having.is_none()
        && matches!(&select.group_by, ast::GroupByExpr::Expressions(e, _) if e.is_empty())
        && query.with.is_none();
    if !plain {
        return Err(Error::unsupported(
            "clauses on pgdp.budget",
            "Use SELECT * FROM pgdp.budget (or name its columns).",
        ));
    }
    let mut columns = Vec::new();
    for item in &select.projection {
        match item {
            SelectItem::Wildcard(_) | SelectItem::QualifiedWildcard(..) => {
                columns.extend(budget_columns().into_iter().map(|c| c.name));
            }
            SelectItem::UnnamedExpr(Expr::Identifier(i)) => columns.push(i.value.to_ascii_lowercase()),
            _ => {
                return Err(Error::unsupported(
                    "expressions on pgdp.budget",
                    "Select its columns by name: epsilon_total, epsilon_spent, epsilon_remaining, delta_total, delta_spent, delta_remaining.",
                ))
            }
        }
    }
    Ok(Some(columns))
}

/// Columns of `SHOW pgdp.budget`.
fn budget_columns() -> Vec<OutColumn> {
    [
        "epsilon_total",
        "epsilon_spent",
        "epsilon_remaining",
        "delta_total",
        "delta_spent",
        "delta_remaining",
    ]
    .iter()
    .map(|n| OutColumn::new(*n, CellType::Float8))
    .collect()
}

/// The type PostgreSQL gives a FROM-less constant: an integer literal is `integer` when it fits
/// in 32 bits and `bigint` otherwise (so `SELECT 1` is `int4`, as clients expect), and an
/// explicit cast decides.
fn constant_type(expr: &Expr, cell: &Cell) -> CellType {
    match expr {
        Expr::Nested(inner) => constant_type(inner, cell),
        Expr::Cast { data_type, .. } => {
            let ty = data_type.to_string().to_ascii_lowercase();
            match ty.split('(').next().unwrap_or("").trim() {
                "int" | "integer" | "int4" | "smallint" | "int2" => CellType::Int4,
                "bigint" | "int8" => CellType::Int8,
                _ => cell_type_of(cell),
            }
        }
        _ => cell_type_of(cell),
    }
}

fn cell_type_of(cell: &Cell) -> CellType {
    match cell {
        Cell::Int(i) if i32::try_from(*i).is_ok() => CellType::Int4,
        Cell::Int(_) => CellType::Int8,
        Cell::Float(_) => CellType::Float8,
        Cell::Bool(_) => CellType::Bool,
        Cell::Null | Cell::Text(_) => CellType::Text,
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
    cursors: Cursors,
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
            cursors: Cursors::default(),
        })
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

    /// Analysis, rewrite and mechanisms: everything decided before the upstream is touched.
    fn prepare_dp(
        &self,
        shared: &Shared,
        query: &ast::Query,
        params: &[Option<String>],
        secret: &str,
    ) -> Result<(Plan, Rewrite, release::Mechanisms)> {
        let mut plan = analyze::analyze(query, &self.context(shared))?;
        plan.unit_unique = plan
            .unit_key()
            .is_some_and(|key| shared.unique_keys.is_unique(&key));
        let rewrite = rewrite::rewrite(&plan, params, secret)?;
        crate::session::settings::check_epsilon(self.settings.epsilon, &self.analyst)?;
        let mechanisms = release::mechanisms(&plan, &rewrite, self.budget())?;
        Ok((plan, rewrite, mechanisms))
    }

    /// [`Session::prepare_dp`], after learning (once per process, from the upstream catalog)
    /// whether the plan's unit column is unique, so the rewrite can use the unique-unit form
    /// (docs/privacy.md, "Unique units"). A failed lookup leaves the general form, which is
    /// always sound.
    async fn plan_dp(
        &self,
        shared: &Shared,
        query: &ast::Query,
        params: &[Option<String>],
        secret: &str,
    ) -> Result<(Plan, Rewrite, release::Mechanisms)> {
        let prepared = self.prepare_dp(shared, query, params, secret)?;
        let Some(key) = prepared.0.unit_key() else {
            return Ok(prepared);
        };
        let keys = [key];
        if shared.unique_keys.unverified(&keys).is_empty() {
            return Ok(prepared);
        }
        match shared
            .backend
            .learn_unique_keys(&shared.unique_keys, &keys)
            .await
        {
            Ok(_) => self.prepare_dp(shared, query, params, secret),
            Err(_) => Ok(prepared),
        }
    }

    /// Runs a DP query: replay, charge, upstream, release. The order is the privacy argument.
    async fn dp_query(
        &mut self,
        shared: &Shared,
        query: &ast::Query,
        params: &[Option<String>],
    ) -> Result<Outcome> {
        let secret = shared.secret().await?;
        let (plan, rewrite, mechanisms) = self.plan_dp(shared, query, params, secret).await?;
        // A row of a table with a unit path has one unit only if each key of the path is unique.
        shared
            .backend
            .verify_unique_keys(&shared.unique_keys, &plan.unique_keys)
            .await?;
        let budget = self.budget();
        // The replay key is the analyst's whole query (HAVING, ORDER BY and LIMIT are applied by
        // pgdp, so the upstream SQL alone does not identify the answer), the bound parameters
        // and every privacy setting.
        let query_text = query.to_string();
        let bound: Vec<String> = params
            .iter()
            .map(|p| {
                p.as_deref()
                    .map(|v| format!("v{v}"))
                    .unwrap_or_else(|| "null".into())
            })
            .collect();
        let bound = bound.join("\u{1f}");
        let key = budget::fingerprint(&[
            &query_text,
            &bound,
            &rewrite.sql,
            &budget.epsilon.to_string(),
            &budget.delta.to_string(),
            budget.mechanism.name(),
            if self.settings.accuracy {
                "accuracy"
            } else {
                ""
            },
        ]);
        let ledger = &shared.ledger;
        let analyst = self.analyst.name.clone();

        // 1. Replay: the same query again gets the same noisy answer, free.
        if let Some(payload) = ledger
            .replay_get(&analyst, &key, shared.policy.replay_lifetime)
            .await?
        {
            if let Some(rows) = decode_rows(&payload) {
                let notice = Notice {
                    message: "pgdp: identical query answered again from the replay cache; charged nothing".into(),
                };
                return Ok(Outcome::Rows {
                    columns: release::columns(&plan, self.settings.accuracy),
                    rows,
                    notices: vec![notice],
                });
            }
        }

        // 2. Public domains read from public tables (no private data, no charge).
        let (mut domains, to_fetch) = release::listed_domains(&plan);
        for (i, table, column) in to_fetch {
            let sql = rewrite::public_values_sql(&table, &column)?;
            let rows = shared.backend.run_public_query(&sql, &self.cancel).await?;
            if rows.len() > crate::limits::PUBLIC_KEY_COMBINATIONS_MAX {
                return Err(Error::LimitExceeded {
                    what: format!("the number of values of public column {table}.{column}"),
                    limit: crate::limits::PUBLIC_KEY_COMBINATIONS_MAX as u64,
                });
            }
            domains.insert(
                i,
                rows.into_iter()
                    .filter_map(|r| r.into_iter().next().flatten())
                    .collect(),
            );
        }

        // 3. Charge, durably, before the upstream sees the statement; an upstream connection is
        // taken first, so an unreachable upstream refuses (57P03) without spending.
        let upstream = shared.backend.get().await?;
        let limit = limit_of(&self.analyst.budget)?;
        let dataset_limit = match &shared.policy.dataset_budget {
            Some(b) => Some(limit_of(b)?),
            None => None,
        };
        let charge = ledger
            .charge(
                &analyst,
                &limit,
                dataset_limit.as_ref(),
                &mechanisms.cost,
                &key,
                budget.mechanism.name(),
            )
            .await?;

        // 4. The upstream; a failure keeps the charge.
        let rows = match upstream.run_release_query(&rewrite.sql, &self.cancel).await {
            Ok(rows) => rows,
            Err(e) => {
                let _ = ledger.set_outcome(charge.id, "upstream failed").await;
                return Err(e);
            }
        };

        // 5. Noise and post-processing.
        let released = release::release(
            &plan,
            &rewrite,
            &mechanisms,
            &rows,
            &domains,
            self.settings.accuracy,
            &mut self.rng,
        )?;
        let _ = ledger
            .record_release(charge.id, &analyst, &key, &encode_rows(&released.rows))
            .await;
        let b = &charge.balance;
        let mut notices = vec![Notice {
            message: format!(
                "pgdp: charged epsilon={}, delta={}; remaining epsilon={} of {}, delta={} of {}",
                mechanisms.cost.epsilon,
                mechanisms.cost.delta,
                b.remaining.epsilon,
                b.limit.epsilon,
                b.remaining.delta,
                b.limit.delta
            ),
        }];
        if released.truncated {
            notices.push(Notice {
                message: format!(
                    "pgdp: only the first {} groups were returned",
                    crate::limits::GROUPS_RELEASED_MAX
                ),
            });
        }
        Ok(Outcome::Rows {
            columns: released.columns,
            rows: released.rows,
            notices,
        })
    }

    async fn show_budget(&self, shared: &Shared) -> Result<Outcome> {
        let limit = limit_of(&self.analyst.budget)?;
        let b = shared.ledger.balance(&self.analyst.name, &limit).await?;
        let row = vec![
            Cell::Float(b.limit.epsilon.to_f64()),
            Cell::Float(b.spent.epsilon.to_f64()),
            Cell::Float(b.remaining.epsilon.to_f64()),
            Cell::Float(b.limit.delta.to_f64()),
            Cell::Float(b.spent.delta.to_f64()),
            Cell::Float(b.remaining.delta.to_f64()),
        ];
        Ok(Outcome::Rows {
            columns: budget_columns(),
            rows: vec![row],
            notices: Vec::new(),
        })
    }

    /// Runs one classified statement. `params` are the bound parameter values as text.
    pub async fn execute(
        &mut self,
        shared: &Shared,
        statement: &Statement,
        params: &[Option<String>],
    ) -> Result<Outcome> {
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
            Statement::Show { name } if name == "pgdp.budget" => self.show_budget(shared).await,
            Statement::Show { name } => {
                let (column, value) = self.settings.show(name, &self.server_version)?;
                Ok(Outcome::Rows {
                    columns: vec![OutColumn::new(column, CellType::Text)],
                    rows: vec![vec![Cell::Text(value)]],
                    notices: Vec::new(),
                })
            }
            // The wire layer frees the prepared statement itself; the tag is all that remains.
            Statement::Deallocate { .. } => Ok(Outcome::Command {
                tag: "DEALLOCATE".into(),
                reported: None,
            }),
            Statement::Query(query) => {
                if let Some(items) = constant_select(query) {
                    let mut columns = Vec::new();
                    let mut row = Vec::new();
                    for item in items {
                        let (name, cell, ty) = self.evaluate_constant(shared, item)?;
                        columns.push(OutColumn::new(name, ty));
                        row.push(cell);
                    }
                    return Ok(Outcome::Rows {
                        columns,
                        rows: vec![row],
                        notices: Vec::new(),
                    });
                }
                if let Some(columns) = budget_view(query)? {
                    let Outcome::Rows { rows, .. } = self.show_budget(shared).await? else {
                        return Err(Error::internal("budget view"));
                    };
                    let all = budget_columns();
                    let picked: Vec<usize> = columns
                        .iter()
                        .map(|c| {
                            all.iter()
                                .position(|a| a.name == *c)
                                .ok_or_else(|| Error::UnknownColumn { name: c.clone() })
                        })
                        .collect::<Result<_>>()?;
                    return Ok(Outcome::Rows {
                        columns: picked.iter().map(|&i| all[i].clone()).collect(),
                        rows: rows
                            .into_iter()
                            .map(|r| picked.iter().map(|&i| r[i].clone()).collect())
                            .collect(),
                        notices: Vec::new(),
                    });
                }
                if crate::upstream::catalog::is_catalog_query(query) {
                    crate::upstream::catalog::check(query, &shared.policy)?;
                    let shadow = shared.shadow.as_ref().ok_or_else(no_shadow)?;
                    let mut q = query.as_ref().clone();
                    crate::upstream::catalog::bind_parameters(&mut q, params);
                    let search_path = self.catalog_search_path(shared);
                    let (columns, rows) = shadow.run(&q.to_string(), &search_path).await?;
                    return Ok(Outcome::Rows {
                        columns: columns
                            .into_iter()
                            .map(|(n, oid)| OutColumn::new(n, CellType::Raw(oid)))
                            .collect(),
                        rows: rows
                            .into_iter()
                            .map(|r| {
                                r.into_iter()
                                    .map(|c| c.map(Cell::Text).unwrap_or(Cell::Null))
                                    .collect()
                            })
                            .collect(),
                        notices: Vec::new(),
                    });
                }
                self.dp_query(shared, query, params).await
            }
            Statement::DeclareCursor { .. }
            | Statement::Fetch { .. }
            | Statement::CloseCursor { .. } => {
                Err(Error::internal("cursor statements are run by Session::run"))
            }
            Statement::Explain(query) => {
                let secret = shared.secret().await?;
                let (plan, rewrite, mechanisms) =
                    self.plan_dp(shared, query, params, secret).await?;
                let lines = release::explain(&plan, &rewrite, &mechanisms, self.budget())
                    .into_iter()
                    .map(|l| redact_secret(&l, secret))
                    .collect::<Vec<_>>();
                Ok(Outcome::Rows {
                    columns: vec![OutColumn::new("QUERY PLAN", CellType::Text)],
                    rows: lines.into_iter().map(|l| vec![Cell::Text(l)]).collect(),
                    notices: Vec::new(),
                })
            }
        }
    }

    /// Evaluates one item of a FROM-less SELECT of constants and harmless session lookups, with
    /// the column type PostgreSQL would give it.
    fn evaluate_constant(
        &self,
        shared: &Shared,
        item: &SelectItem,
    ) -> Result<(String, Cell, CellType)> {
        let (expr, alias) = match item {
            SelectItem::UnnamedExpr(e) => (e, None),
            SelectItem::ExprWithAlias { expr, alias } => (expr, Some(alias.value.clone())),
            _ => return Err(Error::unsupported("* without FROM", "")),
        };
        let (default_name, cell) = self.constant_value(shared, expr)?;
        let ty = constant_type(expr, &cell);
        Ok((alias.unwrap_or(default_name), cell, ty))
    }

    fn constant_value(&self, shared: &Shared, expr: &Expr) -> Result<(String, Cell)> {
        let not_constant = || {
            Error::unsupported(
                "this expression without FROM",
                "Without FROM, pgdp answers only literals and lookups such as version(), current_schema() and current_setting('…').",
            )
        };
        match expr {
            Expr::Value(v) => {
                let cell = match &v.value {
                    ast::Value::Number(n, _) => match n.parse::<i64>() {
                        Ok(i) => Cell::Int(i),
                        Err(_) => n
                            .parse::<f64>()
                            .map(Cell::Float)
                            .map_err(|_| not_constant())?,
                    },
                    ast::Value::SingleQuotedString(s) => Cell::Text(s.clone()),
                    ast::Value::DollarQuotedString(d) => Cell::Text(d.value.clone()),
                    ast::Value::Boolean(b) => Cell::Bool(*b),
                    ast::Value::Null => Cell::Null,
                    _ => return Err(not_constant()),
                };
                Ok(("?column?".into(), cell))
            }
            Expr::Nested(inner) => self.constant_value(shared, inner),
            Expr::Cast {
                expr, data_type, ..
            } => {
                let (_, cell) = self.constant_value(shared, expr)?;
                let ty = data_type.to_string().to_ascii_lowercase();
                let name = ty.split('(').next().unwrap_or("").trim().to_string();
                let cast = match (name.as_str(), cell) {
                    ("text" | "varchar" | "name" | "character varying", c) => {
                        Cell::Text(cell_text(&c))
                    }
                    (
                        "int" | "integer" | "int4" | "bigint" | "int8" | "smallint" | "int2",
                        Cell::Int(i),
                    ) => Cell::Int(i),
                    (
                        "int" | "integer" | "int4" | "bigint" | "int8" | "smallint" | "int2",
                        Cell::Text(t),
                    ) => Cell::Int(t.trim().parse().map_err(|_| not_constant())?),
                    (
                        "float8" | "double precision" | "float" | "numeric" | "real",
                        Cell::Int(i),
                    ) => Cell::Float(i as f64),
                    (
                        "float8" | "double precision" | "float" | "numeric" | "real",
                        Cell::Float(f),
                    ) => Cell::Float(f),
                    ("bool" | "boolean", Cell::Bool(b)) => Cell::Bool(b),
                    ("regclass" | "regtype" | "oid", _) => return Err(not_constant()),
                    (_, Cell::Null) => Cell::Null,
                    _ => return Err(not_constant()),
                };
                Ok((name, cast))
            }
            Expr::Function(f) => {
                let name = f
                    .name
                    .0
                    .last()
                    .map(|p| p.to_string().to_ascii_lowercase())
                    .unwrap_or_default();
                let qualifier_ok = f.name.0.len() == 1
                    || (f.name.0.len() == 2
                        && f.name.0[0].to_string().eq_ignore_ascii_case("pg_catalog"));
                if !qualifier_ok {
                    return Err(not_constant());
                }
                let args: Vec<&Expr> = match &f.args {
                    ast::FunctionArguments::None => Vec::new(),
                    ast::FunctionArguments::List(list) => list
                        .args
                        .iter()
                        .map(|a| match a {
                            ast::FunctionArg::Unnamed(ast::FunctionArgExpr::Expr(e)) => Ok(e),
                            _ => Err(not_constant()),
                        })
                        .collect::<Result<Vec<_>>>()?,
                    ast::FunctionArguments::Subquery(_) => return Err(not_constant()),
                };
                let cell = match (name.as_str(), args.len()) {
                    ("version", 0) => Cell::Text(format!(
                        "PostgreSQL {} (pgdp {}, differentially private proxy)",
                        self.server_version,
                        env!("CARGO_PKG_VERSION")
                    )),
                    ("current_database", 0) => Cell::Text(shared.policy.database.clone()),
                    ("current_schema", 0) => Cell::Text(self.current_schema(shared)),
                    ("current_user" | "session_user" | "user", 0) => Cell::Text(self.analyst.name.clone()),
                    ("pg_backend_pid", 0) => Cell::Int(i64::from(self.backend_pid)),
                    ("current_schemas", 1) => {
                        let mut schemas = vec!["pg_catalog".to_string()];
                        schemas.push(self.current_schema(shared));
                        Cell::Text(format!("{{{}}}", schemas.join(",")))
                    }
                    ("current_setting", 1 | 2) => {
                        let (_, arg) = self.constant_value(shared, args[0])?;
                        let Cell::Text(setting) = arg else { return Err(not_constant()) };
                        Cell::Text(self.settings.show(&setting, &self.server_version)?.1)
                    }
                    _ => {
                        return Err(Error::UnknownFunction {
                            name: f.name.to_string(),
                            hint: "Without FROM, pgdp answers only literals and lookups such as version(), current_schema() and current_setting('…').".into(),
                        })
                    }
                };
                Ok((name, cell))
            }
            Expr::Identifier(id) => {
                let n = id.value.to_ascii_lowercase();
                match n.as_str() {
                    "current_user" | "session_user" | "user" | "current_role" => {
                        Ok((n, Cell::Text(self.analyst.name.clone())))
                    }
                    "current_schema" => Ok((n, Cell::Text(self.current_schema(shared)))),
                    "current_catalog" => Ok((n, Cell::Text(shared.policy.database.clone()))),
                    _ => Err(Error::UnknownColumn {
                        name: id.value.clone(),
                    }),
                }
            }
            _ => Err(not_constant()),
        }
    }

    fn current_schema(&self, shared: &Shared) -> String {
        let schemas = shared.policy.schemas();
        self.settings
            .search_path
            .split(',')
            .map(|s| s.trim().trim_matches('"').to_ascii_lowercase())
            .find(|s| schemas.contains(s))
            .unwrap_or_else(|| "public".into())
    }
}

// ---------------------------------------------------------------------------------------------
// Cursors
// ---------------------------------------------------------------------------------------------
//
// A cursor's query runs once, at DECLARE, through `Session::execute` like any query (a DP query
// is analysed, charged and released there); its released rows are kept in the session, and FETCH
// and MOVE serve them without the upstream or the ledger: post-processing of a release, free.
// A cursor without HOLD lives until its transaction block ends; one WITH HOLD survives COMMIT,
// but not the ROLLBACK of the block that declared it. Bounded by `CURSORS_PER_SESSION_MAX` and
// `CURSOR_ROWS_PER_SESSION_MAX`.

/// An open cursor: the rows its query released, not yet fetched.
#[derive(Debug)]
struct Cursor {
    columns: Vec<OutColumn>,
    rows: VecDeque<Vec<Cell>>,
    /// The notices of the DECLARE (what it charged), sent with the first FETCH.
    notices: Vec<Notice>,
    hold: bool,
    /// Declared in the transaction block still open (its ROLLBACK removes even a HOLD cursor).
    in_block: bool,
}

/// The open cursors of a session, by name.
#[derive(Debug, Default)]
struct Cursors {
    open: HashMap<String, Cursor>,
}

impl Cursors {
    fn rows_held(&self) -> usize {
        self.open.values().map(|c| c.rows.len()).sum()
    }
}

/// Refusals of [`Session::run`]: the one [`Error`] type (cursor conditions have variants of
/// their own there).
pub type Refusal = Error;

impl Session {
    /// Runs one classified statement, cursor statements included: the wire layer's entry point.
    /// Everything but cursor statements goes to [`Session::execute`]; the end of a transaction
    /// block closes its cursors.
    pub async fn run(
        &mut self,
        shared: &Shared,
        statement: &Statement,
        params: &[Option<String>],
    ) -> std::result::Result<Outcome, Refusal> {
        match statement {
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
            other => {
                let outcome = self.execute(shared, other, params).await?;
                match other {
                    Statement::Commit => self.end_block_cursors(true),
                    Statement::Rollback => self.end_block_cursors(false),
                    _ => {}
                }
                Ok(outcome)
            }
        }
    }

    /// The result columns of an open cursor (for Describe of a prepared FETCH).
    pub fn cursor_columns(&self, name: &str) -> Option<Vec<OutColumn>> {
        self.cursors.open.get(name).map(|c| c.columns.clone())
    }

    async fn declare_cursor(
        &mut self,
        shared: &Shared,
        name: &str,
        hold: bool,
        query: &ast::Query,
        params: &[Option<String>],
    ) -> std::result::Result<Outcome, Refusal> {
        if !hold && !self.in_transaction {
            return Err(Error::NoTransaction {
                what: "DECLARE CURSOR".into(),
            });
        }
        if self.cursors.open.contains_key(name) {
            return Err(Error::DuplicateCursor { name: name.into() });
        }
        if self.cursors.open.len() >= crate::limits::CURSORS_PER_SESSION_MAX {
            return Err(Error::LimitExceeded {
                what: "the number of open cursors of this session".into(),
                limit: crate::limits::CURSORS_PER_SESSION_MAX as u64,
            });
        }
        // Checked before the query runs, so that the check below cannot refuse a release that
        // was charged: every release fits in what is left (`GROUPS_RELEASED_MAX`).
        let room = crate::limits::CURSOR_ROWS_PER_SESSION_MAX - crate::limits::GROUPS_RELEASED_MAX;
        if self.cursors.rows_held() > room {
            return Err(Error::LimitExceeded {
                what: "the number of rows held in the open cursors of this session".into(),
                limit: crate::limits::CURSOR_ROWS_PER_SESSION_MAX as u64,
            });
        }
        let statement = Statement::Query(Box::new(query.clone()));
        let Outcome::Rows {
            columns,
            rows,
            notices,
        } = self.execute(shared, &statement, params).await?
        else {
            return Err(Error::internal("a query answered without rows"));
        };
        // A safety net for answers that are not releases (catalog rows), which charge nothing.
        if self.cursors.rows_held() + rows.len() > crate::limits::CURSOR_ROWS_PER_SESSION_MAX {
            return Err(Error::LimitExceeded {
                what: "the number of rows held in the open cursors of this session".into(),
                limit: crate::limits::CURSOR_ROWS_PER_SESSION_MAX as u64,
            });
        }
        self.cursors.open.insert(
            name.to_string(),
            Cursor {
                columns,
                rows: rows.into(),
                notices,
                hold,
                in_block: self.in_transaction,
            },
        );
        Ok(Outcome::Command {
            tag: "DECLARE CURSOR".into(),
            reported: None,
        })
    }

    fn fetch_cursor(
        &mut self,
        name: &str,
        count: Option<u64>,
        move_only: bool,
    ) -> std::result::Result<Outcome, Refusal> {
        let cursor = self
            .cursors
            .open
            .get_mut(name)
            .ok_or_else(|| Error::UnknownCursor {
                kind: "cursor",
                name: name.into(),
            })?;
        let wanted = count.map_or(usize::MAX, |c| usize::try_from(c).unwrap_or(usize::MAX));
        let n = wanted.min(cursor.rows.len());
        let rows: Vec<Vec<Cell>> = cursor.rows.drain(..n).collect();
        if move_only {
            return Ok(Outcome::Command {
                tag: format!("MOVE {}", rows.len()),
                reported: None,
            });
        }
        Ok(Outcome::Rows {
            columns: cursor.columns.clone(),
            rows,
            notices: std::mem::take(&mut cursor.notices),
        })
    }

    fn close_cursor(&mut self, name: Option<&str>) -> std::result::Result<Outcome, Refusal> {
        match name {
            None => self.cursors.open.clear(),
            Some(n) => {
                self.cursors
                    .open
                    .remove(n)
                    .ok_or_else(|| Error::UnknownCursor {
                        kind: "cursor",
                        name: n.into(),
                    })?;
            }
        }
        Ok(Outcome::Command {
            tag: "CLOSE CURSOR".into(),
            reported: None,
        })
    }

    /// The end of a transaction block: cursors without HOLD close; after a ROLLBACK, so do the
    /// HOLD cursors the block declared.
    fn end_block_cursors(&mut self, committed: bool) {
        self.cursors
            .open
            .retain(|_, c| c.hold && (committed || !c.in_block));
        for c in self.cursors.open.values_mut() {
            c.in_block = false;
        }
    }
}

fn cell_text(cell: &Cell) -> String {
    match cell {
        Cell::Null => String::new(),
        Cell::Int(i) => i.to_string(),
        Cell::Float(f) => f.to_string(),
        Cell::Text(t) => t.clone(),
        Cell::Bool(b) => {
            if *b {
                "t".into()
            } else {
                "f".into()
            }
        }
    }
}

/// The select items of a `SELECT <items>` with no FROM, WHERE, GROUP BY or other clauses.
pub fn constant_select(query: &ast::Query) -> Option<&[SelectItem]> {
    if query.with.is_some()
        || query.order_by.is_some()
        || query.limit_clause.is_some()
        || query.fetch.is_some()
        || !query.locks.is_empty()
    {
        return None;
    }
    let SetExpr::Select(select) = query.body.as_ref() else {
        return None;
    };
    let plain = select.from.is_empty()
        && select.selection.is_none()
        && select.having.is_none()
        && select.distinct.is_none()
        && select.into.is_none()
        && matches!(&select.group_by, ast::GroupByExpr::Expressions(e, m) if e.is_empty() && m.is_empty());
    plain.then_some(select.projection.as_slice())
}

/// Serialises released rows for the replay cache (a simple tagged, length-prefixed format).
pub fn encode_rows(rows: &[Vec<Cell>]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&(rows.len() as u64).to_be_bytes());
    for row in rows {
        out.extend_from_slice(&(row.len() as u64).to_be_bytes());
        for cell in row {
            match cell {
                Cell::Null => out.push(b'N'),
                Cell::Int(i) => {
                    out.push(b'I');
                    out.extend_from_slice(&i.to_be_bytes());
                }
                Cell::Float(f) => {
                    out.push(b'F');
                    out.extend_from_slice(&f.to_bits().to_be_bytes());
                }
                Cell::Bool(b) => {
                    out.push(b'B');
                    out.push(u8::from(*b));
                }
                Cell::Text(t) => {
                    out.push(b'T');
                    out.extend_from_slice(&(t.len() as u64).to_be_bytes());
                    out.extend_from_slice(t.as_bytes());
                }
            }
        }
    }
    out
}

/// The inverse of [`encode_rows`]; `None` for a payload it did not write.
pub fn decode_rows(mut b: &[u8]) -> Option<Vec<Vec<Cell>>> {
    fn u64_of(b: &mut &[u8]) -> Option<u64> {
        let (head, rest) = b.split_at_checked(8)?;
        *b = rest;
        Some(u64::from_be_bytes(head.try_into().ok()?))
    }
    let n = usize::try_from(u64_of(&mut b)?).ok()?;
    let mut rows = Vec::with_capacity(n.min(crate::limits::GROUPS_RELEASED_MAX));
    for _ in 0..n {
        let width = u64_of(&mut b)?;
        let mut row = Vec::new();
        for _ in 0..width {
            let (tag, rest) = b.split_first()?;
            b = rest;
            row.push(match tag {
                b'N' => Cell::Null,
                b'I' => Cell::Int(u64_of(&mut b)? as i64),
                b'F' => Cell::Float(f64::from_bits(u64_of(&mut b)?)),
                b'B' => {
                    let (v, rest) = b.split_first()?;
                    b = rest;
                    Cell::Bool(*v != 0)
                }
                b'T' => {
                    let len = usize::try_from(u64_of(&mut b)?).ok()?;
                    let (t, rest) = b.split_at_checked(len)?;
                    b = rest;
                    Cell::Text(String::from_utf8(t.to_vec()).ok()?)
                }
                _ => return None,
            });
        }
        rows.push(row);
    }
    b.is_empty().then_some(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replay_payload_round_trips() {
        let rows = vec![
            vec![
                Cell::Text("a'b".into()),
                Cell::Int(-3),
                Cell::Float(0.1),
                Cell::Null,
                Cell::Bool(true),
            ],
            vec![],
        ];
        assert_eq!(decode_rows(&encode_rows(&rows)), Some(rows));
        assert_eq!(decode_rows(b"garbage"), None);
    }
}
