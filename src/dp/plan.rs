//! The plan of a DP query: what [`crate::dp::analyze`] found the analyst's query to mean, in the
//! narrow terms the rewrite and the release work from (tables and their privacy unit, the
//! contribution caps, filter, group keys and whether their domain is public, aggregates with
//! their bounds, outputs, HAVING, ORDER BY, LIMIT and parameters). Plain data; no I/O.

use sqlparser::ast::{self, Expr};

use crate::policy::{Bounds, ColumnType, Policy};

/// Prefix of every identifier pgdp generates; analyst SQL may not use it.
pub const RESERVED_PREFIX: &str = "__dp_";

pub use crate::limits::{INTEGER_DOMAIN_VALUES_MAX, JOINED_TABLES_MAX, VIEW_TABLES_MAX};

mod column;
mod facts;
mod output;
pub use column::{aliases, Canonical, ColumnRef, JoinOn};
pub(crate) use facts::seal;
#[cfg(test)]
pub(crate) use facts::Stated;
pub use facts::UpstreamFacts;
pub use output::{
    Output, OutputSource, Parameter, Post, PostOp, PostProcessing, SortKey, RELEASED_RELATION,
};

/// Context of the analysis: the session's view of the policy.
#[derive(Debug, Clone)]
pub struct Context<'a> {
    /// The policy.
    pub policy: &'a Policy,
    /// Schemas searched for unqualified table names, in order.
    pub search_path: Vec<String>,
}

/// A table in the FROM clause.
#[derive(Debug, Clone, PartialEq)]
pub struct TableRef {
    /// The policy table (qualified name).
    pub table: String,
    /// The generated alias `__dp_tN`.
    pub alias: String,
    /// Whether the table is private.
    pub private: bool,
    /// For a subquery in FROM (a derived table or a CTE): the contribution-preserving SQL pgdp
    /// built for it, with `$n` placeholders until the rewrite binds them. `None` for a policy
    /// table.
    pub source: Option<Box<ast::Query>>,
    /// The right side of a `LEFT JOIN` (a public table): its columns are NULL in the rows that
    /// have no match, so they have no public domain of their own (the NULL group is released,
    /// or not, by partition selection like any data-dependent group).
    pub nullable: bool,
}

/// A semijoin on the privacy unit: a condition of WHERE that keeps a row when its privacy unit
/// has a row in the subquery's tables that passes the subquery's filter (and, with `having`, whose
/// rows pass that per-unit condition), or, `negated`, when it has none. Written by the analyst as
/// `person_id IN (SELECT person_id FROM … WHERE …)` or `[NOT] EXISTS (SELECT 1 FROM … WHERE
/// v.person_id = p.person_id AND …)`; emitted as `[NOT] EXISTS (SELECT 1 FROM … WHERE unit =
/// outer AND …)` (docs/privacy.md, "Semijoins on the privacy unit").
///
/// Invariants (checked by [`crate::dp::analyze`]): `outer` is the privacy unit of a private table
/// of the query and `unit` that of a private table of the subquery; the subquery's tables are
/// private tables with a unit column joined on it, and public tables; `filter` and `having` are
/// whitelisted, total expressions over the subquery's tables only, so whether a row passes
/// depends on its own unit's rows (and public tables) alone.
#[derive(Debug, Clone, PartialEq)]
pub struct Semijoin {
    /// `NOT EXISTS`: keep the rows whose unit has no such row.
    pub negated: bool,
    /// The privacy unit of the outer query the condition reads (a column of a table in FROM).
    pub outer: ColumnRef,
    /// The subquery's tables, in order (their aliases are distinct from the outer query's).
    pub tables: Vec<TableRef>,
    /// The subquery's join conditions, one per table after the first.
    pub joins: Vec<JoinOn>,
    /// The privacy unit of the subquery, equated with `outer`.
    pub unit: ColumnRef,
    /// The subquery's WHERE without the correlation (canonical, with `$n` placeholders until the
    /// rewrite binds them).
    pub filter: Option<Expr>,
    /// A condition on the unit's aggregates (the subquery's `GROUP BY <unit> HAVING …`).
    pub having: Option<Expr>,
}

/// An inner join of two policy tables on one equality `a = b` where one side is the privacy
/// unit, and the other table's column is unique upstream: each row of `rows` then meets at
/// most one row of the lookup table, the row of its own unit, so a unit's joined rows are its
/// own rows of `rows`, each with the same lookup row. The rewrite may then aggregate `rows`
/// per unit first and join the lookup table to one row per unit (docs/privacy.md, "Lookups on
/// the privacy unit").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitLookup {
    /// The column of the aggregated table in the equality: equal to the unit on every joined
    /// row (it is the unit, or the lookup key the unit is).
    pub rows_unit: ColumnRef,
    /// The lookup table's column in the equality, unique upstream.
    pub key: ColumnRef,
    /// The lookup table (qualified policy name).
    pub table: String,
}

/// How the privacy unit of a row is found.
#[derive(Debug, Clone, PartialEq)]
pub enum Unit {
    /// A column of a table in FROM.
    Column(ColumnRef),
    /// Row-level table: each row is a unit (its `ctid`).
    Row {
        /// The alias `__dp_tN` of the row-level table.
        alias: String,
    },
}

/// What one aggregate computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AggregateKind {
    /// `COUNT(*)`.
    CountRows,
    /// `COUNT(expr)`: rows where the expression is not NULL.
    CountValues,
    /// `COUNT(DISTINCT <privacy unit>)`.
    CountUnits,
    /// `SUM(expr)`.
    Sum,
    /// `AVG(expr)`.
    Avg,
    /// `VAR_SAMP` / `VARIANCE`.
    VarSamp,
    /// `VAR_POP`.
    VarPop,
    /// `STDDEV_SAMP` / `STDDEV`.
    StddevSamp,
    /// `STDDEV_POP`.
    StddevPop,
    /// `COUNT(DISTINCT expr)` for an expression other than the privacy unit.
    CountDistinct,
    /// A quantile (`PERCENTILE_CONT`, `PERCENTILE_DISC`, `MEDIAN`; `MIN` and `MAX` as the
    /// [`crate::dp::mechanism::MIN_PERMILLE`] and [`crate::dp::mechanism::MAX_PERMILLE`]
    /// quantiles) of a bounded argument, in thousandths.
    Quantile {
        /// The quantile × 1000, in 0..=1000.
        permille: u16,
    },
    /// Whether a count of rows (`argument` `None`) or of an argument's values is detected above
    /// its noise: its noisy value exceeds the 95 % bound of that noise (a `boolean`). Made only
    /// by the questions of existence (`bool_or`, `bool_and`, `every`, `EXISTS`) the analysis
    /// rewrites into counts ([`crate::dp::analyze`], existence.rs); it shares the count's
    /// measure, so it costs nothing beyond the count.
    Detected,
}

impl AggregateKind {
    /// The SQL name, also the default output column name.
    pub fn sql_name(self) -> &'static str {
        match self {
            AggregateKind::CountRows | AggregateKind::CountValues | AggregateKind::CountUnits => {
                "count"
            }
            AggregateKind::Sum => "sum",
            AggregateKind::Avg => "avg",
            AggregateKind::VarSamp => "var_samp",
            AggregateKind::VarPop => "var_pop",
            AggregateKind::StddevSamp => "stddev_samp",
            AggregateKind::StddevPop => "stddev_pop",
            AggregateKind::CountDistinct => "count_distinct",
            AggregateKind::Quantile { .. } => "quantile",
            AggregateKind::Detected => "detected",
        }
    }
}

/// One aggregate of the query.
#[derive(Debug, Clone, PartialEq)]
pub struct Aggregate {
    /// What it computes.
    pub kind: AggregateKind,
    /// The argument, for all but `COUNT(*)` and `COUNT(DISTINCT unit)`.
    pub argument: Option<Canonical>,
    /// Bounds of the argument, for sums, averages and variances.
    pub bounds: Option<Bounds>,
    /// For a SUM or AVG of a bare column whose policy has an `upper_ceiling`: how
    /// far a query that chooses its bounds may raise `bounds.upper` ([`Plan::at_ceilings`],
    /// [`Plan::with_chosen_bounds`]); `None` otherwise.
    pub upper_ceiling: Option<f64>,
    /// Canonical text of the whole aggregate (to match HAVING / ORDER BY references).
    pub text: String,
    /// The type PostgreSQL gives the aggregate, as far as pgdp knows the argument's type
    /// ([`crate::output::CellType::of_aggregate`]); the answer uses the type the shadow
    /// catalog describes where it can.
    pub result: crate::output::CellType,
    /// Whether the true value is an integer whatever the data: a count, or a sum of an
    /// integer-typed argument (released rounded to the nearest integer, as post-processing, also
    /// where its type is `numeric`: `SUM` of a `bigint`).
    pub integral: bool,
}

/// A GROUP BY key.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupKey {
    /// The key expression.
    pub expr: Canonical,
    /// Output type.
    pub ty: ColumnType,
    /// The type PostgreSQL gives the key, where pgdp knows it (a column of a declared type);
    /// `None` for expressions, which are sent as pgdp's own type of [`GroupKey::ty`] unless the
    /// shadow catalog describes the statement.
    pub declared: Option<crate::output::CellType>,
    /// Where the set of possible values is public knowledge.
    pub public: PublicKeys,
}

/// Whether a key's domain is public.
#[derive(Debug, Clone, PartialEq)]
pub enum PublicKeys {
    /// Not public: groups released only through partition selection.
    No,
    /// The values are known without reading data: the policy lists them, or the key is a CASE
    /// whose results are literals (NULL included when a row can match no branch).
    Listed {
        /// The values (NULL as `None`).
        values: Vec<Option<String>>,
        /// Whether every row's key is one of them: a CASE of literals, or a policy column
        /// declared `exhaustive`. Only then may a total over the key add up its cells.
        exhaustive: bool,
    },
    /// A column of a public table in FROM: the values are read from that table. Keys of one
    /// table (one alias) take the combinations of values its rows hold, not the cross product.
    Table {
        /// The policy table.
        table: String,
        /// Its alias `__dp_tN` in FROM.
        alias: String,
        /// The column.
        column: String,
    },
}

/// The values one output column's group key can take in the statement around the query,
/// computed from that statement's constants alone: a calendar's `generate_series`, whose values
/// are the only keys its join can match ([`Plan::list_key`]).
///
/// Listed values are released without partition selection, so they must never come from data:
/// only pgdp makes one (the constructor is crate-private, the fields private), from the shadow
/// catalog's evaluation of the series' constants.
///
/// ```compile_fail,E0451
/// // A list of values from elsewhere (the data, say) cannot be made into a public domain.
/// let _ = pgdp::dp::plan::ListedKey { column: "diagnosis".into(), values: vec![Some("J45".into())] };
/// ```
///
/// ```
/// // Reading one is public.
/// fn listed(key: &pgdp::dp::plan::ListedKey) -> (&str, usize) {
///     (key.column(), key.values().len())
/// }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedKey {
    /// The query's output column (as PostgreSQL names it).
    column: String,
    /// The values, as the upstream prints the key's type (no NULL: a NULL key matches nothing).
    values: Vec<Option<String>>,
}

impl ListedKey {
    /// The values of output column `column` that the statement's constants alone give (the
    /// session's calendars, evaluated on the data-free shadow catalog).
    pub(crate) fn new(column: String, values: Vec<Option<String>>) -> ListedKey {
        ListedKey { column, values }
    }

    /// The query's output column (as PostgreSQL names it).
    pub fn column(&self) -> &str {
        &self.column
    }

    /// The listed values.
    pub fn values(&self) -> &[Option<String>] {
        &self.values
    }
}

/// What one unit's rows can add to a statistic that grows with them, in rows, under caps of
/// `rows` per group, `groups` groups and, when given, `total` in all: `(L1, L2)`
/// ([`Plan::row_sensitivity`]).
pub fn row_sensitivity(rows: u64, groups: u64, total: Option<u64>) -> (f64, f64) {
    let c = rows as f64;
    let g = groups as f64;
    match total {
        Some(t) if t < rows.saturating_mul(groups) => {
            let full = (t / rows.max(1)).min(groups);
            let rest = t.saturating_sub(full.saturating_mul(rows)) as f64;
            (t as f64, (full as f64 * c * c + rest * rest).sqrt())
        }
        _ => (c * g, c * g.sqrt()),
    }
}

/// The analysed query. Only [`crate::dp::analyze::analyze`] makes one, and only the DP pipeline
/// can change it: its fields are private to [`crate::dp`], and the accessors below read them.
/// The one change allowed from outside is [`Plan::assume_unique_unit`], which decides from the
/// plan's own unit key.
///
/// ```compile_fail,E0616
/// // A plan cannot be edited outside the DP pipeline, e.g. to lift its caps.
/// fn lift(plan: &mut pgdp::dp::plan::Plan) {
///     plan.max_rows_per_unit = u64::MAX;
/// }
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// Tables in FROM, in order; the first is the driving table.
    pub(in crate::dp) tables: Vec<TableRef>,
    /// Join conditions, one per joined table (index i+1).
    pub(in crate::dp) joins: Vec<JoinOn>,
    /// The privacy unit.
    pub(in crate::dp) unit: Unit,
    /// Most groups a unit contributes to.
    pub(in crate::dp) max_groups_per_unit: u64,
    /// Most rows a unit contributes to a group.
    pub(in crate::dp) max_rows_per_unit: u64,
    /// The most groups per unit a query that chooses its caps may choose
    /// ([`crate::dp::release::bounds`]): the policy's `ceilings`, at least
    /// `max_groups_per_unit` (1 whenever that is 1 because of the query's shape).
    pub(in crate::dp) groups_ceiling: u64,
    /// The most rows per unit and group a query that chooses its caps may choose: at least
    /// `max_rows_per_unit`.
    pub(in crate::dp) rows_ceiling: u64,
    /// A cap on a unit's rows over all its groups together, below `max_rows_per_unit ×
    /// max_groups_per_unit`, when a query chose one ([`Plan::with_chosen_bounds`]); `None`
    /// otherwise. Stage 3 gives each of a unit's kept groups, largest first, an allowance of
    /// `LEAST(max_rows_per_unit, what is left of the total)` rows, and stage 4 caps the unit's
    /// rows and values there at its allowance ([`Plan::row_sensitivity`]). Only a measure that
    /// grows with rows uses it (counts of rows and values, sums, centred sums and squares).
    pub(in crate::dp) max_rows_total: Option<u64>,
    /// WHERE (canonical, with parameters as `$n` placeholders until the rewrite binds them),
    /// without its semijoins.
    pub(in crate::dp) filter: Option<Expr>,
    /// The semijoins on the privacy unit among the conditions of WHERE (ANDed with `filter`).
    pub(in crate::dp) semijoins: Vec<Semijoin>,
    /// GROUP BY keys.
    pub(in crate::dp) keys: Vec<GroupKey>,
    /// With `ROLLUP`, `CUBE` or `GROUPING SETS`: the grouping sets, each the sorted indices of
    /// its keys, in PostgreSQL's expansion order (duplicates kept). Each set is a release of its
    /// own ([`Plan::grouping_set`]): its own partition selection or public domain, an equal
    /// share of the query's ε and δ, the costs composed sequentially (docs/privacy.md,
    /// "Grouping sets"). `None` for a plain GROUP BY.
    pub(in crate::dp) grouping_sets: Option<Vec<Vec<usize>>>,
    /// Aggregates, each released through a mechanism.
    pub(in crate::dp) aggregates: Vec<Aggregate>,
    /// Output columns in order.
    pub(in crate::dp) outputs: Vec<Output>,
    /// HAVING, applied to released rows.
    pub(in crate::dp) having: Option<Post>,
    /// ORDER BY, applied to released rows.
    pub(in crate::dp) order_by: Vec<SortKey>,
    /// LIMIT, applied to released rows.
    pub(in crate::dp) limit: Option<u64>,
    /// OFFSET, applied to released rows.
    pub(in crate::dp) offset: u64,
    /// Post-processing evaluated by PostgreSQL after the release; when present, the release
    /// yields the relation [`RELEASED_RELATION`] and `having`, `order_by`, `limit` and `offset`
    /// above are empty (the SQL holds them).
    pub(in crate::dp) post: Option<PostProcessing>,
    /// Parameters used in WHERE.
    pub(in crate::dp) parameters: Vec<Parameter>,
    /// Every row of `__dp_rows` has a unit of its own: one policy table, no join, and a unit that
    /// is the row itself or a column the upstream declares unique. Analysis leaves it `false`;
    /// the session sets it from upstream catalog facts ([`Plan::unit_key`]). It only lets the
    /// rewrite skip work that is then the identity (docs/privacy.md, "Unique units").
    pub(in crate::dp) unit_unique: bool,
    /// A join the rewrite may aggregate below: the joined table has at most one row per unit
    /// (docs/privacy.md, "Lookups on the privacy unit"). Analysis leaves it `None`; the session
    /// sets it from upstream catalog facts ([`Plan::assume_unit_lookup`]).
    pub(in crate::dp) unit_lookup: Option<UnitLookup>,
    /// Aggregate arguments that are a column the upstream declares `NOT NULL`, of a table whose
    /// rows no outer join extends with NULLs: their count of values is the count of rows, so
    /// the rewrite releases one count for both (`COUNT(x)` and `COUNT(*)`, the count of an
    /// `AVG(x)`). Analysis leaves it empty; the session sets it from upstream catalog facts
    /// ([`Plan::assume_not_null`]). Either way the answer has the same sensitivity.
    pub(in crate::dp) not_null: Vec<Canonical>,
    /// Aggregate arguments that are never NULL whatever the data, by the analyst's SQL or the
    /// policy: a literal other than NULL (`COUNT(1)`), or a plain column the policy declares
    /// `exhaustive` (the data team's statement that every row holds one of its listed values)
    /// of a table no outer join extends with NULLs. Counted as rows like [`Plan::not_null`]'s;
    /// set by analysis ([`Plan::declare_never_null`]).
    pub(in crate::dp) never_null: Vec<Canonical>,
    /// `(table, column)` pairs the plan relies on being unique upstream: the keys of the unit
    /// paths it reads through (docs/privacy.md, "Tables with a unit path"). The caller verifies
    /// them on the upstream catalog before running the plan and refuses it otherwise.
    pub(in crate::dp) unique_keys: Vec<(String, String)>,
    /// Per-unit values of subqueries grouped by the privacy unit that the analyst left without
    /// an upper bound (a whole `COUNT(…)` or `SUM(x)`), bounded by the policy's row cap and
    /// clamped to it upstream, as `view.column = LEAST(…)` (the answer's NOTICE lists them).
    pub(in crate::dp) unit_caps: Vec<String>,
}

impl Plan {
    /// Tables in FROM, in order; the first is the driving table.
    pub fn tables(&self) -> &[TableRef] {
        &self.tables
    }

    /// The privacy unit.
    pub fn unit(&self) -> &Unit {
        &self.unit
    }

    /// Per-unit values bounded by the policy's row cap (see the field).
    pub fn unit_caps(&self) -> &[String] {
        &self.unit_caps
    }

    /// The same query run with the caps on rows per unit and group and on groups per unit that
    /// [`crate::dp::release::bounds::choose`] chose for it under a charge, and the clamp's upper
    /// bound when it chose one: never above this plan's ceilings (the policy's).
    pub fn with_chosen_bounds(&self, chosen: &crate::dp::release::bounds::ChosenBounds) -> Plan {
        let rows = chosen.rows_per_unit.clamp(1, self.rows_ceiling);
        let groups = chosen.groups_per_unit.clamp(1, self.groups_ceiling);
        // A total that one group's cap already meets is that cap: with one group per unit the
        // total lowers the cap on rows, and a total of at least rows × groups binds nothing.
        let (rows, total) = match chosen.rows_total {
            Some(t) if groups == 1 || self.keys.is_empty() => (rows.min(t.max(1)), None),
            Some(t) if t < rows.saturating_mul(groups) => (rows, Some(t.max(1))),
            _ => (rows, None),
        };
        // A chosen upper bound replaces the policy's for every aggregate of the estimated
        // argument that may raise it, never above its ceiling.
        let upper = chosen.clamp_upper().and_then(|(a, upper)| {
            let argument = self.aggregates.get(a)?.argument.clone()?;
            Some((argument, upper))
        });
        let aggregates = self
            .aggregates
            .iter()
            .map(|a| match (&upper, a.upper_ceiling, a.bounds, &a.argument) {
                (Some((argument, upper)), Some(ceiling), Some(b), Some(x))
                    if x == argument && *upper > b.lower && self.may_raise_upper(a) =>
                {
                    Aggregate {
                        bounds: Some(Bounds {
                            upper: upper.min(ceiling),
                            ..b
                        }),
                        ..a.clone()
                    }
                }
                _ => a.clone(),
            })
            .collect();
        Plan {
            max_rows_per_unit: rows,
            max_groups_per_unit: groups,
            max_rows_total: total,
            aggregates,
            ..self.clone()
        }
    }

    /// What one unit's rows can add to a statistic that grows with them, in rows: `(L1, L2)`
    /// over the groups. At most `C = max_rows_per_unit` rows in each of at most
    /// `G = max_groups_per_unit` groups: `(C·G, C·√G)`. With a total cap `T < C·G` as well: at
    /// most `T` rows in all, so `L1 = T`, and the squares are largest with the rows packed into
    /// as few groups as the cap allows, `k = ⌊T/C⌋` groups of `C` and one of the rest `r`:
    /// `L2 = √(k·C² + r²) ≤ √(C·T)`.
    pub fn row_sensitivity(&self) -> (f64, f64) {
        row_sensitivity(
            self.max_rows_per_unit,
            self.max_groups_per_unit,
            self.max_rows_total,
        )
    }

    /// The cap on a unit's rows over all its groups, when the query chose one.
    pub fn max_rows_total(&self) -> Option<u64> {
        self.max_rows_total
    }

    /// The same query at the policy's ceilings ([`Plan::rows_ceiling`], and each aggregate's
    /// [`Aggregate::upper_ceiling`]): the plan a query that chooses its caps prices and
    /// histograms, whose caps and bounds the chosen ones never exceed.
    /// Borrowed when the plan is at its ceilings already (a copy of the plan is most of what
    /// a query that chooses no cap would spend here).
    pub(in crate::dp) fn at_ceilings(&self) -> std::borrow::Cow<'_, Plan> {
        let raised = |a: &Aggregate| match (a.upper_ceiling, a.bounds) {
            (Some(ceiling), Some(b)) => ceiling.max(b.upper) != b.upper && self.may_raise_upper(a),
            _ => false,
        };
        if self.rows_ceiling <= self.max_rows_per_unit
            && self.groups_ceiling <= self.max_groups_per_unit
            && self.max_rows_total.is_none()
            && !self.aggregates.iter().any(raised)
        {
            std::borrow::Cow::Borrowed(self)
        } else {
            std::borrow::Cow::Owned(self.raised_to_ceilings())
        }
    }

    /// [`Plan::at_ceilings`], always copied.
    pub(in crate::dp) fn raised_to_ceilings(&self) -> Plan {
        Plan {
            max_rows_per_unit: self.rows_ceiling.max(self.max_rows_per_unit),
            max_groups_per_unit: self.groups_ceiling.max(self.max_groups_per_unit),
            max_rows_total: None,
            aggregates: self
                .aggregates
                .iter()
                .map(|a| match (a.upper_ceiling, a.bounds) {
                    // Only when every aggregate of the argument may raise it (a variance of the
                    // same argument keeps the policy's bounds, and so do its sum and average).
                    (Some(ceiling), Some(b)) if self.may_raise_upper(a) => Aggregate {
                        bounds: Some(Bounds {
                            upper: ceiling.max(b.upper),
                            ..b
                        }),
                        ..a.clone()
                    },
                    _ => a.clone(),
                })
                .collect(),
            ..self.clone()
        }
    }

    /// Whether the upper bound of `aggregate`'s argument may be chosen: it has an
    /// `upper_ceiling`, and so has every other aggregate of the same argument and bounds.
    fn may_raise_upper(&self, aggregate: &Aggregate) -> bool {
        aggregate.upper_ceiling.is_some()
            && self.aggregates.iter().all(|a| {
                a.argument != aggregate.argument
                    || a.bounds != aggregate.bounds
                    || a.upper_ceiling.is_some()
            })
    }

    /// The plan of the contribution histogram ([`crate::dp::rewrite::contributions`]): the same
    /// FROM, WHERE, keys and caps, counting rows only, with no post-processing.
    pub(in crate::dp) fn counting_rows(&self) -> Plan {
        Plan {
            aggregates: vec![Aggregate {
                kind: AggregateKind::CountRows,
                argument: None,
                bounds: None,
                upper_ceiling: None,
                text: "count(*)".into(),
                result: crate::output::CellType::Int8,
                integral: true,
            }],
            outputs: vec![Output {
                name: "count".into(),
                source: OutputSource::Aggregate(0),
            }],
            having: None,
            order_by: Vec::new(),
            limit: None,
            offset: 0,
            post: None,
            not_null: Vec::new(),
            never_null: Vec::new(),
            ..self.clone()
        }
    }

    /// Most groups a unit contributes to.
    pub fn max_groups_per_unit(&self) -> u64 {
        self.max_groups_per_unit
    }

    /// Most rows a unit contributes to a group.
    pub fn max_rows_per_unit(&self) -> u64 {
        self.max_rows_per_unit
    }

    /// GROUP BY keys.
    pub fn keys(&self) -> &[GroupKey] {
        &self.keys
    }

    /// The plan of the same query grouped by `keys` only (indices into this plan's keys, in
    /// its order), with no post-processing: the coarser grouping a release of this plan can be
    /// added up into ([`crate::dp::release::derive`]). Built like [`Plan::grouping_set`], so it
    /// is the plan the analysis gives the coarser query itself (its HAVING, ORDER BY, LIMIT and
    /// expressions aside). `None` with grouping sets, or for a key out of range.
    pub fn coarser(&self, keys: &[usize]) -> Option<Plan> {
        if self.grouping_sets.is_some() {
            return None;
        }
        Plan {
            grouping_sets: Some(vec![keys.to_vec()]),
            ..self.clone()
        }
        .grouping_set(0)
    }

    /// The grouping sets of `ROLLUP`, `CUBE` or `GROUPING SETS` (see [`Plan::grouping_set`]).
    pub fn grouping_sets(&self) -> Option<&[Vec<usize>]> {
        self.grouping_sets.as_deref()
    }

    /// The plan of grouping set `i`'s release: this plan with the set's keys only, no grouping
    /// sets and no post-processing (its rows are concatenated with the other sets' before
    /// HAVING, ORDER BY, LIMIT and expressions apply). A unit contributes to at most
    /// `max_groups_per_unit` groups of the set (one for the empty set). Its keys keep their
    /// public domains when every key of the query is public; otherwise the set's groups are
    /// released through partition selection, even where its own keys are public (its domain was
    /// not read), which spends δ but is never less private.
    pub fn grouping_set(&self, i: usize) -> Option<Plan> {
        let set = self.grouping_sets.as_ref()?.get(i)?;
        let all_public = self.keys_public();
        let keys = set
            .iter()
            .map(|&k| {
                let mut key = self.keys.get(k)?.clone();
                if !all_public {
                    key.public = PublicKeys::No;
                }
                Some(key)
            })
            .collect::<Option<Vec<GroupKey>>>()?;
        Some(Plan {
            max_groups_per_unit: if keys.is_empty() {
                1
            } else {
                self.max_groups_per_unit
            },
            groups_ceiling: if keys.is_empty() {
                1
            } else {
                self.groups_ceiling
            },
            keys,
            grouping_sets: None,
            outputs: Vec::new(),
            having: None,
            order_by: Vec::new(),
            limit: None,
            offset: 0,
            post: None,
            ..self.clone()
        })
    }

    /// Aggregates, each released through a mechanism.
    pub fn aggregates(&self) -> &[Aggregate] {
        &self.aggregates
    }

    /// Output columns in order.
    pub fn outputs(&self) -> &[Output] {
        &self.outputs
    }

    /// Gives the outputs the names `names`, in order (a plan kept for a statement that differs
    /// from this one only in its output aliases); `false`, and nothing changed, when the numbers
    /// differ.
    pub fn rename_outputs(&mut self, names: &[String]) -> bool {
        if names.len() != self.outputs.len() {
            return false;
        }
        for (output, name) in self.outputs.iter_mut().zip(names) {
            output.name.clone_from(name);
        }
        true
    }

    /// HAVING, applied by pgdp to released rows.
    pub fn having(&self) -> Option<&Post> {
        self.having.as_ref()
    }

    /// ORDER BY, applied by pgdp to released rows.
    pub fn order_by(&self) -> &[SortKey] {
        &self.order_by
    }

    /// LIMIT, applied by pgdp to released rows.
    pub fn limit(&self) -> Option<u64> {
        self.limit
    }

    /// OFFSET, applied by pgdp to released rows.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Post-processing that PostgreSQL evaluates after the release, if any.
    pub fn post(&self) -> Option<&PostProcessing> {
        self.post.as_ref()
    }

    /// The semijoins on the privacy unit among the conditions of WHERE.
    pub fn semijoins(&self) -> &[Semijoin] {
        &self.semijoins
    }

    /// Parameters used in WHERE.
    pub fn parameters(&self) -> &[Parameter] {
        &self.parameters
    }

    /// Whether the rewrite may treat every row as its own unit (see [`Plan::assume_unique_unit`]).
    pub fn unit_unique(&self) -> bool {
        self.unit_unique
    }

    /// Keys of unit paths the plan relies on being unique upstream; the caller verifies them on
    /// the upstream catalog before running the plan.
    pub fn unique_keys(&self) -> &[(String, String)] {
        &self.unique_keys
    }

    /// Lets the rewrite use the unique-unit form (docs/privacy.md, "Unique units") if the plan
    /// has a unit key ([`Plan::unit_key`]) and `facts` say the upstream holds it unique;
    /// otherwise keeps the general form, which is always sound. Returns what it decided.
    pub fn assume_unique_unit(&mut self, facts: &impl UpstreamFacts) -> bool {
        self.unit_unique = self.unit_key().is_some_and(|key| facts.unique(&key));
        self.unit_unique
    }

    /// The aggregate arguments that are a plain column of a policy table in FROM that is never
    /// NULL-extended (not the right side of a `LEFT JOIN`, not a subquery), as
    /// `(argument, (table, column))`: those whose count of values equals the count of rows
    /// when the upstream declares the column `NOT NULL`.
    pub fn column_arguments(&self) -> Vec<(Canonical, (String, String))> {
        let mut found: Vec<(Canonical, (String, String))> = Vec::new();
        for argument in self.aggregates.iter().filter_map(|a| a.argument.as_ref()) {
            let Some(column) = ColumnRef::of_canonical(argument) else {
                continue;
            };
            let table = self
                .tables
                .iter()
                .find(|t| t.alias == column.alias && t.source.is_none() && !t.nullable);
            if let Some(t) = table {
                if !found.iter().any(|(a, _)| a == argument) {
                    found.push((argument.clone(), (t.table.clone(), column.column)));
                }
            }
        }
        found
    }

    /// Records which of [`Plan::column_arguments`] `facts` say the upstream declares
    /// `NOT NULL` ([`Plan::not_null`]); the others keep a count of their own values, which is
    /// always sound.
    pub fn assume_not_null(&mut self, facts: &impl UpstreamFacts) {
        self.not_null = self
            .column_arguments()
            .into_iter()
            .filter(|(_, column)| facts.not_null(column))
            .map(|(argument, _)| argument)
            .collect();
    }

    /// Records which aggregate arguments are never NULL whatever the data ([`Plan::never_null`]):
    /// literals other than NULL, and plain columns that `exhaustive(table, column)` says the
    /// policy declares exhaustive.
    pub fn declare_never_null(&mut self, exhaustive: impl Fn(&str, &str) -> bool) {
        let mut found: Vec<Canonical> = self
            .column_arguments()
            .into_iter()
            .filter(|(_, (table, column))| exhaustive(table, column))
            .map(|(argument, _)| argument)
            .collect();
        for argument in self.aggregates.iter().filter_map(|a| a.argument.as_ref()) {
            if argument.is_non_null_literal() && !found.contains(argument) {
                found.push(argument.clone());
            }
        }
        self.never_null = found;
    }

    /// Whether `argument` is known never to be NULL: the upstream declares it `NOT NULL`
    /// ([`Plan::not_null_upstream`]), or it is never NULL whatever the data ([`Plan::never_null`]).
    pub fn not_null(&self, argument: &Canonical) -> bool {
        self.not_null_upstream(argument) || self.never_null(argument)
    }

    /// Whether the upstream declares `argument`'s column `NOT NULL` (see the field `not_null`).
    pub fn not_null_upstream(&self, argument: &Canonical) -> bool {
        self.not_null.contains(argument)
    }

    /// Whether `argument` is a non-NULL literal or a column the policy declares exhaustive (see
    /// the field).
    pub fn never_null(&self, argument: &Canonical) -> bool {
        self.never_null.contains(argument)
    }

    /// The joins the rewrite could aggregate below if the lookup side's key is unique upstream:
    /// two policy tables (no subquery, no outer join) joined by one equality one side of which
    /// is the privacy unit; one candidate per side that can be the lookup.
    fn unit_lookup_candidates(&self) -> Vec<UnitLookup> {
        let [first, second] = self.tables.as_slice() else {
            return Vec::new();
        };
        let plain = |t: &TableRef| t.source.is_none() && !t.nullable;
        let (Unit::Column(unit), [join]) = (&self.unit, self.joins.as_slice()) else {
            return Vec::new();
        };
        let [(l, r)] = join.on.as_slice() else {
            return Vec::new();
        };
        if !plain(first) || !plain(second) || join.left || l.alias == r.alias {
            return Vec::new();
        }
        [(l, r), (r, l)]
            .into_iter()
            .filter(|(rows, key)| unit == *rows || unit == *key)
            .filter_map(|(rows, key)| {
                let table = self.tables.iter().find(|t| t.alias == key.alias)?;
                Some(UnitLookup {
                    rows_unit: rows.clone(),
                    key: key.clone(),
                    table: table.table.clone(),
                })
            })
            .collect()
    }

    /// The `(table, column)` keys whose uniqueness upstream would let the rewrite aggregate
    /// below the plan's join ([`Plan::assume_unit_lookup`]).
    pub fn unit_lookup_keys(&self) -> Vec<(String, String)> {
        self.unit_lookup_candidates()
            .into_iter()
            .map(|l| (l.table, l.key.column))
            .collect()
    }

    /// Lets the rewrite aggregate below the plan's join (docs/privacy.md, "Lookups on the
    /// privacy unit") when `facts` say the upstream holds a lookup side's key unique;
    /// otherwise keeps the general form, which is always sound. Returns what it decided.
    ///
    /// When every key reads the lookup table alone, each unit's rows share one lookup row and
    /// so one group: the plan's `max_groups_per_unit` becomes 1 (docs/privacy.md, "One group
    /// per unit through a lookup"). The general form keeps at most `max_groups_per_unit` groups
    /// per unit whatever the data, and the lookup form has one by the key's uniqueness, the
    /// fact the form itself rests on; the uniqueness also makes the cap cost nothing (no unit
    /// has a second group to drop).
    pub fn assume_unit_lookup(&mut self, facts: &impl UpstreamFacts) -> bool {
        self.unit_lookup = self
            .unit_lookup_candidates()
            .into_iter()
            .find(|l| facts.unique(&(l.table.clone(), l.key.column.clone())));
        if self.keys_follow_unit() {
            self.max_groups_per_unit = 1;
            self.groups_ceiling = 1;
        }
        self.unit_lookup.is_some()
    }

    /// Whether the plan has keys and every one reads only the lookup table of its
    /// [`UnitLookup`]: a unit then has one group.
    pub fn keys_follow_unit(&self) -> bool {
        let Some(lookup) = &self.unit_lookup else {
            return false;
        };
        !self.keys.is_empty()
            && self.keys.iter().all(|k| {
                k.expr
                    .aliases()
                    .is_some_and(|a| a.iter().all(|alias| *alias == lookup.key.alias))
            })
    }

    /// The join the rewrite may aggregate below, if any (see [`Plan::assume_unit_lookup`]).
    pub fn unit_lookup(&self) -> Option<&UnitLookup> {
        self.unit_lookup.as_ref()
    }

    /// For a plan over one policy table without joins: the (table, column) whose uniqueness
    /// upstream makes every row its own unit, or `None` when the unit is the row itself (always
    /// unique) or the plan has joins or subqueries (never considered unique).
    pub fn unit_key(&self) -> Option<(String, String)> {
        let [table] = self.tables.as_slice() else {
            return None;
        };
        if !table.private || table.source.is_some() || !self.joins.is_empty() {
            return None;
        }
        let Unit::Column(c) = &self.unit else {
            return None;
        };
        (c.alias == table.alias).then(|| (table.table.clone(), c.column.clone()))
    }

    /// Whether every row is its own unit without a catalog fact: one policy table, no join,
    /// and row-level (each row is a unit).
    pub fn rows_are_units(&self) -> bool {
        matches!(self.unit, Unit::Row { .. })
            && matches!(self.tables.as_slice(), [t] if t.private && t.source.is_none())
            && self.joins.is_empty()
    }

    /// With grouping sets over public keys only, the first set that holds the keys of every
    /// other set: the finest, whose cells every other set's groups are sums of (each cell of a
    /// public domain is released, so a coarser group is exactly the union of the finer cells
    /// that project onto it). `None` without grouping sets, with a private key, when no set
    /// holds all the others (`GROUPING SETS ((a), (b))`), or when a key some set leaves out is
    /// not [`Plan::key_exhaustive`]: a row whose key is outside the released cells would then be
    /// missing from the totals over it, which PostgreSQL counts.
    pub fn finest_grouping_set(&self) -> Option<usize> {
        let sets = self.grouping_sets.as_ref()?;
        if !self.keys_public() {
            return None;
        }
        let f = sets.iter().position(|set| {
            sets.iter()
                .all(|other| other.iter().all(|k| set.contains(k)))
        })?;
        let dropped_exhaustive = sets.iter().all(|set| {
            sets[f]
                .iter()
                .filter(|k| !set.contains(k))
                .all(|&k| self.key_exhaustive(k))
        });
        dropped_exhaustive.then_some(f)
    }

    /// Whether every row's value of key `k` is in its public domain, so the released cells
    /// partition the rows by it: a CASE of literals or a policy column declared `exhaustive`
    /// (listed), or a column of a public table (its domain is the values the table's rows hold,
    /// NULL included). Never for a key without a public domain.
    pub fn key_exhaustive(&self, k: usize) -> bool {
        match self.keys.get(k).map(|key| &key.public) {
            Some(PublicKeys::Listed { exhaustive, .. }) => *exhaustive,
            Some(PublicKeys::Table { .. }) => true,
            Some(PublicKeys::No) | None => false,
        }
    }

    /// Whether every key's domain is public, so no partition selection is needed.
    pub fn keys_public(&self) -> bool {
        self.keys.iter().all(|k| k.public != PublicKeys::No)
    }

    /// The group key that output column `column` releases, when listing its values
    /// ([`Plan::list_key`]) would make every key public: the column is a key without a public
    /// domain, every other key has one, and there are no grouping sets.
    pub fn listable_key(&self, column: &str) -> Option<usize> {
        if self.grouping_sets.is_some() {
            return None;
        }
        let k = self.outputs.iter().find_map(|o| match o.source {
            OutputSource::Key(k) if o.name == column => Some(k),
            _ => None,
        })?;
        let others_public = self
            .keys
            .iter()
            .enumerate()
            .all(|(i, key)| i == k || key.public != PublicKeys::No);
        (self.keys.get(k)?.public == PublicKeys::No && others_public).then_some(k)
    }

    /// Gives the key of [`ListedKey::column`] the listed values as its public domain (not
    /// exhaustive), if [`Plan::listable_key`] finds it; returns whether it did. Every listed
    /// value is then released with its noisy aggregates and no partition selection runs.
    /// Sound only because the values are public: the caller computes them from the statement's
    /// constants alone (a calendar's series), never from data.
    pub fn list_key(&mut self, listed: &ListedKey) -> bool {
        let Some(k) = self.listable_key(&listed.column) else {
            return false;
        };
        self.keys[k].public = PublicKeys::Listed {
            values: listed.values.clone(),
            exhaustive: false,
        };
        true
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use sqlparser::dialect::PostgreSqlDialect;
    use sqlparser::parser::Parser;

    use super::*;

    fn parse(text: &str) -> Expr {
        Parser::new(&PostgreSqlDialect {})
            .try_with_sql(text)
            .and_then(|mut p| p.parse_expr())
            .expect("parses")
    }

    #[test]
    fn aliases_are_read_from_qualified_columns_only() {
        let set = |v: &[&str]| Some(v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>());
        assert_eq!(
            aliases(&parse(r#""__dp_t0"."cost" * 2 + "__dp_t1"."age""#)),
            set(&["__dp_t0", "__dp_t1"])
        );
        assert_eq!(
            aliases(&parse(r#"lower("__dp_t1"."region") = 'x'"#)),
            set(&["__dp_t1"])
        );
        assert_eq!(aliases(&parse("1 + 2")), set(&[]));
        assert_eq!(aliases(&parse("cost > 1")), None);
        assert_eq!(
            aliases(&parse(r#""__dp_t0"."a" IN (SELECT 1)"#)),
            None,
            "a subquery is not placed"
        );
    }

    #[test]
    fn a_column_is_read_back_from_its_canonical_text_and_nothing_else_is() {
        for (alias, column) in [
            ("__dp_t0", "age"),
            ("__dp_t12", "Mixed Case"),
            ("__dp_t1", "a\"b"),
        ] {
            let c = ColumnRef::new(alias, column);
            assert_eq!(ColumnRef::of_canonical(&Canonical::of(&c.expr())), Some(c));
        }
        let not_columns = [
            "\"__dp_t0\".\"age\" + 1",
            "\"__dp_t0\".\"age\".\"x\"",
            "CASE WHEN \"__dp_t0\".\"a\" > 1 THEN \"__dp_t0\".\"b\" END",
            "age",
        ];
        for text in not_columns {
            let expr = sqlparser::parser::Parser::new(&sqlparser::dialect::PostgreSqlDialect {})
                .try_with_sql(text)
                .and_then(|mut p| p.parse_expr())
                .expect("parses");
            assert_eq!(
                ColumnRef::of_canonical(&Canonical::of(&expr)),
                None,
                "{text}"
            );
        }
    }
}
