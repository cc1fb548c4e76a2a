//! Rewrite: a [`Plan`] becomes the contribution-bounded SQL pgdp runs on the upstream, and the
//! list of [`Measure`]s (the exact statistics per group that the release step noises).
//!
//! The SQL has four stages (docs/privacy.md has the argument):
//! 1. `__dp_rows`: the analyst's FROM / JOIN / WHERE, projecting the privacy unit, the group keys
//!    and the aggregate arguments;
//! 2. `__dp_per_unit`: one row per (unit, group) with the unit's row count and its counts and
//!    sums of the clamped arguments (`LEAST(GREATEST(x, lower), upper)`, in exact `numeric`),
//!    all from one scan;
//! 3. `__dp_ranked`: each unit keeps at most `max_groups_per_unit` groups, chosen by
//!    `hashtextextended(unit || keys, seed)`, the seed derived from a secret
//!    ([`ranking_seed`]): the choice depends only on the unit's own rows and the secret (a
//!    window numbers each unit's groups; with one group per unit the fast shape keeps the first
//!    with `DISTINCT ON`);
//! 4. per group: the sum over units of each statistic capped per unit (`LEAST(n, max_rows)`;
//!    a unit's sum over more than `max_rows` values scaled to `max_rows` of them and clamped to
//!    `[min(0, max_rows·lower), max(0, max_rows·upper)]`), and the number of units.
//!
//! When every row is its own unit, stages 2 and 3 are the identity and stage 4 is one aggregate
//! over the rows. When the query joins a table with one row per unit on the unit, the fast shape
//! computes stage 2 below that join ([`lookup`]). [`Shape`] names the two ways of writing stages 2 and 4: pgdp sends
//! [`Shape::Fast`]; [`Shape::Reference`] is the per-measure form docs/privacy.md argues, which
//! the tests run beside it on PostgreSQL to show both give the same statistics.
//!
//! Invariants:
//! - Every value aggregated is clamped to declared bounds, and every unit's contribution to every
//!   released statistic is capped, so the sensitivity of each [`Measure`] is a function of the
//!   policy alone ([`Measure::contribution`]).
//! - The emitted SQL is assembled with the typed builder [`crate::dp::sql`]: literal templates
//!   of pgdp's source, integers, numbers, generated names, quoted identifiers, and sqlparser's
//!   printing of the analyst's *parsed* expressions ([`crate::dp::plan::Canonical`], the plan's
//!   filter, [`crate::dp::plan::JoinOn`]); a `String` cannot be spliced in (it is not a
//!   [`crate::dp::sql::Fragment`]), and the statement is rendered once, at the end. Bound
//!   parameters become typed literals. Before it leaves [`rewrite`] it is
//!   tokenized and must be one statement with no comment and no statement separator
//!   ([`check_one_statement`]), in every build; in builds with debug assertions (every test) it
//!   must also parse as exactly one statement. (A full re-parse costs ~70 µs per query, most of
//!   the front end's time, and checks nothing the token check does not for injection: both use
//!   sqlparser's lexer, and neither can see a wrong operator precedence.) `tests/integration/golden.rs`
//!   checks that the text of every corpus rewrite is exactly sqlparser's printing of its parse.
//! - Generated identifiers carry the reserved prefix `__dp_`.

use sqlparser::ast::{self, Expr, Value, VisitMut, VisitorMut};
use sqlparser::dialect::PostgreSqlDialect;
use sqlparser::parser::Parser;

use crate::dp::plan::{AggregateKind, Canonical, Plan, Semijoin};
use crate::dp::sql::{from_clause, sql, Name, Number, Sql};

mod bucket;
mod distributed;
pub mod domain;
mod ending;
mod grouping;
mod lookup;
mod measure;
mod partitionwise;
pub mod public;
mod ship;
mod stages;
pub mod synopsis;
use crate::error::{Error, Result};
use crate::policy::{Bounds, ColumnType};
pub use distributed::distributed;
use ending::statement_ending;
pub use measure::{measures, Argument, Measure};

/// The shape of the upstream statement, from where the rows of the private tables it reads
/// are (`upstream::Placement::shape`): every shape computes the same rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamShape {
    /// The single-server text.
    OneServer,
    /// Tables partitioned by their unit (`postgres_fdw` shards): [`partitionwise`].
    Partitionwise {
        /// The plan's lookup join, if it has one, equates the partition columns of two tables
        /// partitioned by their unit ([`lookup_on_shards`]): the lookup form's per-unit stage
        /// is then one aggregate over the join, which each shard can run.
        lookup_on_shards: bool,
    },
    /// Tables distributed by their unit on Citus: [`distributed`].
    Distributed,
}

impl UpstreamShape {
    /// `rewrite` (in the single-server shape) in this shape; `policy` gives its columns' types.
    pub fn apply(self, rewrite: Rewrite, policy: &crate::policy::Policy) -> Result<Rewrite> {
        match self {
            UpstreamShape::OneServer => Ok(rewrite),
            UpstreamShape::Partitionwise { lookup_on_shards } => {
                partitionwise(rewrite, policy, lookup_on_shards)
            }
            UpstreamShape::Distributed => distributed(rewrite),
        }
    }

    /// A contribution histogram's SQL ([`contributions`], in the single-server shape) in this
    /// shape. On shards it is partitionwise like the answer's, so its per-unit stage runs on
    /// the shards too instead of every row crossing to the coordinator. On Citus it is in the
    /// distributed shape like the answer's: its stages read more than once are inlined, so that
    /// Citus does not pull them to the coordinator as distributed subplans.
    pub fn apply_to_histogram(
        self,
        sql: UpstreamSql,
        policy: &crate::policy::Policy,
    ) -> Result<UpstreamSql> {
        match self {
            UpstreamShape::Partitionwise { lookup_on_shards } => {
                partitionwise::partitionwise_sql(&sql, policy, lookup_on_shards)
            }
            UpstreamShape::Distributed => distributed::distributed_sql(&sql),
            UpstreamShape::OneServer => Ok(sql),
        }
    }
}
pub use bucket::bucket_start_sql;
pub use partitionwise::{lookup_on_shards, partitionwise};
pub use ship::{per_unit_stage, per_unit_stage_on_citus, PerUnitStage};
use stages::{Stages, ValueStage};

/// The contribution-bounded SQL of one DP query, as [`rewrite`] built it from a [`Plan`]: the
/// only SQL over private tables that pgdp runs on the upstream. Only this module can make one
/// (its field is private and it has no public constructor), so the upstream's
/// `run_release_query` cannot be handed an analyst's text or SQL assembled elsewhere.
///
/// ```compile_fail,E0451
/// // Analyst text (or any string) cannot pass as upstream SQL.
/// let sql = pgdp::dp::rewrite::UpstreamSql { text: "SELECT * FROM demo.people".to_string(), partitionwise: false };
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamSql {
    text: String,
    /// In the partitionwise shape ([`partitionwise`]): the upstream plans it with partitionwise
    /// aggregation and joins on.
    partitionwise: bool,
}

impl UpstreamSql {
    /// The SQL text, to send or to show in EXPLAIN.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Whether the statement is in the partitionwise shape, to be run with
    /// `enable_partitionwise_aggregate` and `enable_partitionwise_join` on.
    pub fn partitionwise(&self) -> bool {
        self.partitionwise
    }
}

impl std::ops::Deref for UpstreamSql {
    type Target = str;
    fn deref(&self) -> &str {
        &self.text
    }
}

impl std::fmt::Display for UpstreamSql {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

/// SQL that reads only public tables and literals, built by [`domain::public_domain`] (the public
/// domain of a query's keys) and [`public::public_query`] (a query over public tables alone).
///
/// ```compile_fail,E0423
/// let sql = pgdp::dp::rewrite::PublicSql("SELECT income FROM demo.people".to_string());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublicSql(String);

impl PublicSql {
    /// The SQL text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The same SQL for the shadow catalog, which has the public tables' declared columns (and
    /// no rows): to type it before the upstream runs it.
    pub fn shadow(&self) -> crate::dp::sql::ShadowSql {
        crate::dp::sql::ShadowSql::new(self.0.clone())
    }
}

/// The rewrite of a plan.
#[derive(Debug, Clone, PartialEq)]
pub struct Rewrite {
    /// The SQL sent upstream. Its columns: one text column per key, then one per measure, then
    /// the number of units per group.
    pub sql: UpstreamSql,
    /// Aggregate arguments, indexed by the measures.
    pub arguments: Vec<Argument>,
    /// Measures, in SQL column order after the keys.
    pub measures: Vec<Measure>,
    /// For each aggregate of the plan, the measures it is computed from.
    pub aggregate_measures: Vec<Vec<usize>>,
}

/// Replaces `$n` placeholders with typed literals of the bound values.
struct BindParameters<'a> {
    plan: &'a Plan,
    values: &'a [Option<String>],
    error: Option<Error>,
}

impl VisitorMut for BindParameters<'_> {
    type Break = ();

    fn post_visit_expr(&mut self, expr: &mut Expr) -> std::ops::ControlFlow<()> {
        let Expr::Value(v) = expr else {
            return std::ops::ControlFlow::Continue(());
        };
        let Value::Placeholder(p) = &v.value else {
            return std::ops::ControlFlow::Continue(());
        };
        let index = p
            .strip_prefix('$')
            .and_then(|n| n.parse::<usize>().ok())
            .unwrap_or(0);
        let ty = self
            .plan
            .parameters
            .iter()
            .find(|q| q.index == index)
            .map(|q| q.ty)
            .unwrap_or(ColumnType::Text);
        match bind_literal(index, self.values.get(index.wrapping_sub(1)), ty) {
            Ok(e) => *expr = e,
            Err(e) => {
                self.error = Some(e);
                return std::ops::ControlFlow::Break(());
            }
        }
        std::ops::ControlFlow::Continue(())
    }
}

fn bind_literal(index: usize, value: Option<&Option<String>>, ty: ColumnType) -> Result<Expr> {
    let Some(value) = value else {
        return Err(Error::Protocol {
            what: format!("there is no parameter ${index}"),
        });
    };
    let Some(text) = value else {
        return Ok(Expr::value(Value::Null));
    };
    let bad = |what: &str| Error::InvalidParameter {
        name: format!("${index}"),
        reason: format!("is not a valid {what}"),
        hint: "Bind a value of the type of the column it is compared with.".into(),
    };
    let data_type = match ty {
        ColumnType::Integer => {
            text.trim().parse::<i64>().map_err(|_| bad("integer"))?;
            ast::DataType::BigInt(None)
        }
        ColumnType::Numeric | ColumnType::Float => {
            let f: f64 = text.trim().parse().map_err(|_| bad("number"))?;
            if !f.is_finite() {
                return Err(bad("finite number"));
            }
            ast::DataType::Numeric(ast::ExactNumberInfo::None)
        }
        ColumnType::Boolean => {
            match text.trim().to_ascii_lowercase().as_str() {
                "t" | "true" | "f" | "false" | "1" | "0" | "yes" | "no" | "on" | "off" => {}
                _ => return Err(bad("boolean")),
            }
            ast::DataType::Boolean
        }
        ColumnType::Date => {
            crate::datetime::Date::parse(text).ok_or_else(|| bad("date (YYYY-MM-DD)"))?;
            ast::DataType::Date
        }
        ColumnType::Timestamp => {
            // Only the date is checked: the upstream reads the rest (time zone names included), and
            // a bound value that fails there depends on the analyst's input, not on the data.
            text.get(..10)
                .and_then(crate::datetime::Date::parse)
                .ok_or_else(|| bad("timestamp"))?;
            ast::DataType::Timestamp(None, ast::TimezoneInfo::None)
        }
        ColumnType::Text => ast::DataType::Text,
    };
    Ok(Expr::Cast {
        kind: ast::CastKind::Cast,
        expr: Box::new(Expr::value(crate::literal::dollar_quoted(text))),
        data_type,
        format: None,
    })
}

/// Measure `j` of a unit scaled to at most `cap` values of argument `i`.
fn scaled(j: usize, i: usize, cap: Sql) -> Sql {
    sql!(
        "{} * LEAST(1, CAST({} AS NUMERIC) / GREATEST({}, 1))",
        Name("m", j),
        cap,
        Name("n", i)
    )
}

/// Clamps a value to its bounds, keeping NULL as NULL (GREATEST and LEAST ignore NULLs, so a
/// bare clamp would turn a NULL into the lower bound).
fn clamp(arg: &Canonical, b: &Bounds) -> Sql {
    sql!(
        "CASE WHEN ({}) IS NULL THEN NULL ELSE LEAST(GREATEST(CAST({} AS NUMERIC), {}), {}) END",
        arg,
        arg,
        Number(b.lower),
        Number(b.upper)
    )
}

/// `COUNT(__dp_a{i})` over one row.
fn present(i: usize) -> Sql {
    sql!("CASE WHEN {} IS NULL THEN 0 ELSE 1 END", Name("a", i))
}

/// The key of the keyed hash that ranks a unit's groups and values: the first 63 bits of
/// SHA-256(secret). PostgreSQL's `hashtextextended(text, seed)` (the hash of hash partitioning,
/// stable across platforms) costs a fraction of `md5` over text. Privacy does not rest on the
/// hash: any choice that depends only on the unit's own rows keeps the contribution bound; the
/// keyed hash makes the choice unbiased and unpredictable.
pub fn ranking_seed(secret: &str) -> i64 {
    let digest = ring::digest::digest(&ring::digest::SHA256, secret.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest.as_ref()[..8]);
    i64::from_be_bytes(first) & i64::MAX
}

/// The keyed hash that ranks a unit's groups, over the columns of `__dp_per_unit`:
/// `hashtextextended(unit || '|' || key || …, seed)`, a NULL key written `<null>`.
fn ranking_hash(keys: &[Sql], seed: i64) -> Sql {
    let key_text = keys
        .iter()
        .map(|k| sql!("COALESCE(CAST({} AS TEXT), '<null>')", k));
    sql!(
        "hashtextextended(CAST(__dp_unit AS TEXT) || '|' || {}, {})",
        Sql::join(key_text, " || '|' || "),
        seed
    )
}

/// How stages 2 and 4 are written. Both give the same statistics (tests/integration/golden.rs
/// runs both on PostgreSQL over the corpus and compares them); pgdp sends [`Shape::Fast`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// The stages as docs/privacy.md argues them: per unit, one column per measure, and stage 4
    /// scales and clamps every unit's sums; the unique-unit form is that projection of one row.
    /// The specification [`Shape::Fast`] is tested against.
    Reference,
    /// The shape pgdp sends: per unit, one column per base statistic (rows; per argument its
    /// count, its sum, its centred sum of squares), the centred sum derived exactly from the sum
    /// and the count; stage 4 scales and clamps only the units over `max_rows_per_unit`, whose
    /// sums may leave the bounds; the unique-unit form is one aggregate over the rows.
    Fast,
}

/// Produces the upstream SQL for a plan with bound parameter values ([`Shape::Fast`]).
pub fn rewrite(plan: &Plan, parameters: &[Option<String>], secret: &str) -> Result<Rewrite> {
    rewrite_shaped(plan, parameters, secret, Shape::Fast)
}

/// Produces the upstream SQL for a plan with bound parameter values, in the given shape. With
/// grouping sets, one statement computes every set's statistics ([`grouping::statement`]).
pub fn rewrite_shaped(
    plan: &Plan,
    parameters: &[Option<String>],
    secret: &str,
    shape: Shape,
) -> Result<Rewrite> {
    let (statement, arguments, measures, aggregate_measures) = match plan.grouping_sets() {
        Some(_) => grouping::statement(plan, parameters, secret, shape)?,
        None => statement(plan, parameters, secret, shape)?,
    };
    finish(statement, arguments, measures, aggregate_measures)
}

/// A statement before rendering, with the arguments and measures it computes and, per
/// aggregate, its measures.
type Built = (Sql, Vec<Argument>, Vec<Measure>, Vec<Vec<usize>>);

/// The statement of one grouping (the four stages), unrendered.
fn statement(
    plan: &Plan,
    parameters: &[Option<String>],
    secret: &str,
    shape: Shape,
) -> Result<Built> {
    statement_ending(plan, parameters, secret, shape, End::Release)
}

/// What the last SELECT of a statement computes.
#[derive(Debug, Clone, Copy)]
enum End<'a> {
    /// Stage 4: per group, the capped statistics and the number of units.
    Release,
    /// The histogram of [`contributions`]: over the (unit, group) pairs stage 3 keeps, how
    /// many have their row count in each bucket between the candidate caps.
    Contributions(&'a Histograms<'a>),
}

/// The bucket edges of the contribution histograms ([`contributions`]).
#[derive(Debug, Clone, Copy)]
pub struct Histograms<'a> {
    /// Rows per kept (unit, group) pair: the candidate caps on rows, then beyond.
    pub rows: &'a [u64],
    /// Groups per unit (all of them, before stage 3), when the cap on groups is chosen.
    pub groups: Option<&'a [u64]>,
    /// Each unit's rows over its kept groups, each group's at most the cap on rows, when a
    /// total cap is chosen.
    pub totals: Option<&'a [u64]>,
    /// What clamping a summed argument removes, when estimated.
    pub clamp: Option<&'a ClampEdges>,
}

/// The bucket edges of the two histograms that estimate what clamping a summed argument into
/// its bounds removes ([`contributions`]): each unit's total distance of its values from
/// their clamped values, and the absolute value of its sum of clamped values.
#[derive(Debug, Clone, PartialEq)]
pub struct ClampEdges {
    /// The plan's aggregate whose argument is estimated (a SUM or AVG with bounds).
    pub aggregate: usize,
    /// Edges of the per-unit distance outside the bounds, ascending.
    pub excess: Vec<f64>,
    /// Edges of the per-unit absolute sum of clamped values, ascending.
    pub sums: Vec<f64>,
    /// When the upper bound is chosen: the edges of each unit's largest value (as written),
    /// ascending. The distance histogram is then not computed (`excess` is empty).
    pub largest: Vec<f64>,
}

/// The SQL of the contribution histograms a query's caps are chosen from
/// ([`crate::dp::release::bounds`]): the plan's stages 1 to 3 (its FROM, WHERE, keys and the
/// groups each unit keeps, as the answer has them) counting rows per (unit, group), then one
/// row `(0, bucket, pairs)` per non-empty bucket of `width_bucket(rows, [c1 + 1, c2 + 1, …])`
/// (bucket 0 holds pairs with at most `c1` rows, bucket j those with more than `c_j` and at
/// most `c_{j+1}`, the last those above the last edge); with `groups`, also one row
/// `(1, bucket, units)` per non-empty bucket of each unit's number of groups (all of them,
/// before stage 3). With `clamp`, two more: `(2, bucket, units)` of each unit's total distance
/// of the aggregate's argument from its clamped value (units with none left out), and
/// `(3, bucket, units)` of the absolute value of each unit's sum of clamped values (units
/// with none left out), both over all of the unit's rows after WHERE; when the clamp's upper
/// bound is chosen, `(5, bucket, units)` of each unit's largest value of the argument as
/// written (units with none left out) instead of the first. With `totals`, one more:
/// `(4, bucket, units)` of each unit's rows over the pairs stage 3 keeps, each pair's at most
/// the plan's cap on rows. `None` when every row is its own unit (nothing to choose). Its rows
/// are private like a release's: they reach the analyst only through the noise of
/// [`crate::dp::release::bounds::choose`].
pub fn contributions(
    plan: &Plan,
    parameters: &[Option<String>],
    secret: &str,
    edges: &Histograms<'_>,
) -> Result<Option<UpstreamSql>> {
    let empty = |e: Option<&[u64]>| e.is_some_and(|e| e.is_empty());
    if plan.grouping_sets.is_some()
        || edges.rows.is_empty()
        || empty(edges.groups)
        || empty(edges.totals)
        || edges
            .clamp
            .is_some_and(|c| c.sums.is_empty() || c.excess.is_empty() == c.largest.is_empty())
    {
        return Ok(None);
    }
    let mut counted = plan.counting_rows();
    if let Some(c) = edges.clamp {
        // The count of rows, and the argument summed: stage 1 then carries it as written and
        // clamped, and stage 2 sums both per unit and group.
        let aggregate = plan
            .aggregates
            .get(c.aggregate)
            .filter(|a| a.argument.is_some() && a.bounds.is_some())
            .ok_or_else(|| Error::internal("a clamp histogram without a bounded argument"))?;
        counted.aggregates.push(crate::dp::plan::Aggregate {
            kind: AggregateKind::Sum,
            ..aggregate.clone()
        });
    }
    let (statement, ..) = statement_ending(
        &counted,
        parameters,
        secret,
        Shape::Fast,
        End::Contributions(edges),
    )?;
    if statement.is_empty() {
        return Ok(None);
    }
    let text = statement.into_string();
    check_one_statement(&text)?;
    Ok(Some(UpstreamSql {
        text,
        partitionwise: false,
    }))
}

/// The lookup form's `__dp_per_unit` ([`lookup`]): each unit's rows of `__dp_below` with the
/// lookup table's row of the unit, its keys and its conditions.
fn lookup_join(plan: &Plan, b: &lookup::Split, parameters: &[Option<String>]) -> Result<Sql> {
    let table = plan
        .tables
        .iter()
        .find(|t| t.alias == b.lookup.key.alias)
        .ok_or_else(|| Error::internal("a lookup join without its lookup table"))?;
    let relation = from_clause(std::slice::from_ref(table), &[], |_| {
        Err(Error::internal("a lookup table is a policy table"))
    })?;
    let mut select = vec![Sql::text("__dp_below.*")];
    for &i in &b.above_keys {
        select.push(sql!("{} AS {}", plan.keys[i].expr, Name("k", i)));
    }
    let mut sql = sql!(
        "SELECT {} FROM __dp_below JOIN {} ON __dp_below.__dp_unit = {}",
        Sql::join(select, ", "),
        relation,
        b.lookup.key
    );
    let mut conditions = Vec::new();
    for c in &b.above_filter {
        let mut c = c.clone();
        bind_parameters(&mut c, plan, parameters)?;
        conditions.push(conjunct(&c));
    }
    if !conditions.is_empty() {
        sql.push(sql!(" WHERE {}", Sql::join(conditions, " AND ")));
    }
    Ok(sql)
}

/// Renders the statement, checks it is one statement, and returns the rewrite.
fn finish(
    statement: Sql,
    arguments: Vec<Argument>,
    measures: Vec<Measure>,
    aggregate_measures: Vec<Vec<usize>>,
) -> Result<Rewrite> {
    let text = statement.into_string();
    check_one_statement(&text)?;
    Ok(Rewrite {
        sql: UpstreamSql {
            text,
            partitionwise: false,
        },
        arguments,
        measures,
        aggregate_measures,
    })
}

/// A condition to AND with others: parenthesised when it is an OR.
fn conjunct(e: &Expr) -> Sql {
    match e {
        Expr::BinaryOp {
            op: ast::BinaryOperator::Or | ast::BinaryOperator::Xor,
            ..
        } => sql!("({})", e),
        _ => sql!("{}", e),
    }
}

/// A semijoin on the privacy unit as a condition of stage 1: `[NOT] EXISTS (SELECT 1 FROM …
/// WHERE <its unit> = <the outer unit> AND <its filter> [GROUP BY <its unit> HAVING …])`. Whether
/// a row passes depends only on the rows of its own unit in the subquery's private tables (and on
/// public tables), so the rest of the rewrite, and every contribution bound, is unchanged
/// (docs/privacy.md, "Semijoins on the privacy unit").
fn semijoin(s: &Semijoin, plan: &Plan, parameters: &[Option<String>]) -> Result<Sql> {
    let from = from_clause(&s.tables, &s.joins, |q| {
        let mut q = q.clone();
        bind_parameters(&mut q, plan, parameters)?;
        Ok(sql!("{}", q))
    })?;
    let mut body = sql!("SELECT 1 FROM {} WHERE {} = {}", from, s.unit, s.outer);
    if let Some(f) = &s.filter {
        let mut f = f.clone();
        bind_parameters(&mut f, plan, parameters)?;
        body.push(sql!(" AND {}", conjunct(&f)));
    }
    if let Some(h) = &s.having {
        body.push(sql!(" GROUP BY {} HAVING {}", s.unit, h));
    }
    Ok(if s.negated {
        sql!("NOT EXISTS ({})", body)
    } else {
        sql!("EXISTS ({})", body)
    })
}

/// Replaces the `$n` placeholders in `tree` with typed literals of the bound values.
fn bind_parameters<T: VisitMut>(
    tree: &mut T,
    plan: &Plan,
    parameters: &[Option<String>],
) -> Result<()> {
    let mut binder = BindParameters {
        plan,
        values: parameters,
        error: None,
    };
    let _ = tree.visit(&mut binder);
    match binder.error {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Checks that `sql` is one statement: it tokenizes, and no token ends a statement or starts a
/// comment, so no piece spliced into it can end the statement or hide what follows. With debug
/// assertions (tests) it must also parse as exactly one statement. An internal error otherwise:
/// that would be a bug in the rewrite, caught before anything is charged or sent.
pub(crate) fn check_one_statement(sql: &str) -> Result<()> {
    use sqlparser::tokenizer::{Token, Tokenizer, Whitespace};
    let dialect = PostgreSqlDialect {};
    let tokens = Tokenizer::new(&dialect, sql).tokenize().map_err(|e| {
        Error::internal(format!("rewrite produced SQL that does not tokenize: {e}"))
    })?;
    let separator_or_comment = tokens.iter().any(|token| {
        matches!(
            token,
            Token::SemiColon
                | Token::Whitespace(
                    Whitespace::SingleLineComment { .. } | Whitespace::MultiLineComment(_)
                )
        )
    });
    if separator_or_comment {
        return Err(Error::internal(
            "rewrite produced SQL with a statement separator or a comment",
        ));
    }
    if cfg!(debug_assertions) {
        let statements = Parser::parse_sql(&dialect, sql).map_err(|e| {
            Error::internal(format!("rewrite produced SQL that does not parse: {e}"))
        })?;
        if statements.len() != 1 {
            return Err(Error::internal("rewrite produced more than one statement"));
        }
    }
    Ok(())
}
