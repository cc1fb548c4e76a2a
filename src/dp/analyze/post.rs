//! Post-processing that PostgreSQL evaluates over released values ([`PostProcessing`]): select
//! items that are expressions over aggregates and keys (`ROUND(AVG(x), 2)`,
//! `SUM(cost) / COUNT(DISTINCT person_id)`, `100.0 * COUNT(*) / SUM(COUNT(*)) OVER ()`, CASE,
//! casts), HAVING, ORDER BY and LIMIT on them (an outer query over an aggregate subquery, the
//! form Metabase wraps every question in, is [`super::outer`]).
//!
//! Invariants:
//! - Each aggregate is replaced by the column `a<i>` of [`RELEASED_RELATION`] and released
//!   through a mechanism like any other aggregate; each group key by the column `k<i>`. A column
//!   of a table that is neither is refused: it would be a per-row value.
//! - What remains uses only literals, operators, CASE, casts to scalar types, and the pure
//!   built-in functions of [`post_function`] and [`window_function`]: no table, no subquery, no
//!   parameter, nothing that reads the clock, the session or a sequence.
//! - A division's divisor `d` becomes `NULLIF(d, 0)`: a released count of 0 gives NULL, as
//!   PostgreSQL's own `SUM(x) / COUNT(*)` does over no rows (NULL / 0 is NULL), never an error
//!   after the answer was charged.

use super::*;

/// Output and aggregate columns of the released relation, as the post-processing SQL names them.
pub(super) fn released_column(prefix: char, i: usize) -> Expr {
    Expr::CompoundIdentifier(vec![
        Ident::with_quote('"', RELEASED_RELATION),
        Ident::with_quote('"', format!("{prefix}{i}")),
    ])
}

/// The aggregates found in post-processing expressions, each with the analyst's own expression
/// (for the statement that types the released relation).
pub(super) struct Staging<'k> {
    /// The query's group keys.
    pub(super) keys: &'k [GroupKey],
    /// For an outer query over an aggregate subquery: the subquery's alias and its output
    /// names, the only columns the outer query may name (no aggregates there).
    pub(super) outer: Option<(&'k str, &'k [String])>,
    /// The query's grouping sets, if any (`GROUPING(…)` is allowed only with them).
    pub(super) sets: Option<&'k [Vec<usize>]>,
    /// Aggregates, in the order of their `a<i>` columns.
    pub(super) aggregates: Vec<Aggregate>,
    /// The analyst's expression of each aggregate.
    pub(super) originals: Vec<Expr>,
}

impl Staging<'_> {
    fn push(&mut self, agg: Aggregate, original: &Expr) -> usize {
        match self.aggregates.iter().position(|a| a.text == agg.text) {
            Some(i) => i,
            None => {
                self.aggregates.push(agg);
                self.originals.push(original.clone());
                self.aggregates.len() - 1
            }
        }
    }
}

/// Where a post-processing expression stands, which decides what a bare name means.
#[derive(Clone, Copy)]
pub(super) enum Place<'o> {
    /// A select item.
    Select,
    /// HAVING: a bare name that is no column may name an output column (a pgdp extension kept
    /// from its earlier HAVING), replaced by that output's expression.
    Having(&'o [(String, Expr)]),
    /// ORDER BY: a bare name of an output column sorts by that column, as in PostgreSQL.
    OrderBy(&'o [(String, Expr)]),
}

/// The hint of a refused construct in post-processing.
const POST_HINT: &str = "Over aggregates pgdp evaluates literals, + - * / %, comparisons, AND/OR/NOT, CASE, casts to scalar types, pure built-in functions (round, trunc, abs, ceil, floor, sqrt, power, ln, exp, greatest, least, coalesce, nullif, to_char, concat, date_trunc, date_part …) and window functions over the released rows.";

fn has_column_reference(e: &Expr) -> bool {
    let mut found = false;
    let _ = ast::visit_expressions(e, |x| {
        found |= matches!(x, Expr::Identifier(_) | Expr::CompoundIdentifier(_));
        std::ops::ControlFlow::<()>::Continue(())
    });
    found
}

/// Whether a select item must go through [`PostProcessing`]: it is neither a bare aggregate
/// nor free of aggregates and windows (a key or a refusal).
pub(super) fn needs_post_processing(e: &Expr) -> bool {
    let bare = match e {
        Expr::Nested(inner) => inner.as_ref(),
        other => other,
    };
    let is_aggregate = matches!(bare, Expr::Function(f) if f.over.is_none()
        && function_name(&f.name).ok().and_then(|n| aggregate_kind(&n)).is_some());
    !is_aggregate && (contains_aggregate(e) || contains_window(e))
}

/// Pure built-in scalar functions allowed over released values: immutable, no side effects,
/// bounded work (the evaluation has a short statement timeout as well).
pub(super) fn post_function(name: &str) -> bool {
    matches!(
        name,
        "abs"
            | "round"
            | "trunc"
            | "ceil"
            | "ceiling"
            | "floor"
            | "sign"
            | "sqrt"
            | "cbrt"
            | "power"
            | "pow"
            | "exp"
            | "ln"
            | "log"
            | "log10"
            | "mod"
            | "div"
            | "scale"
            | "width_bucket"
            | "greatest"
            | "least"
            | "coalesce"
            | "nullif"
            | "to_char"
            | "lower"
            | "upper"
            | "initcap"
            | "length"
            | "char_length"
            | "concat"
            | "concat_ws"
            | "left"
            | "right"
            | "substr"
            | "replace"
            | "btrim"
            | "ltrim"
            | "rtrim"
            | "date_trunc"
            | "date_part"
            | "make_date"
    )
}

/// Window functions allowed over the released rows (one row per released group).
pub(super) fn window_function(name: &str) -> bool {
    matches!(
        name,
        "sum"
            | "avg"
            | "count"
            | "min"
            | "max"
            | "row_number"
            | "rank"
            | "dense_rank"
            | "percent_rank"
            | "cume_dist"
            | "ntile"
            | "lag"
            | "lead"
            | "first_value"
            | "last_value"
    )
}

/// Scalar types a released value may be cast to.
fn castable(dt: &ast::DataType) -> bool {
    let text = dt.to_string().to_ascii_lowercase();
    let base = text.split('(').next().unwrap_or("").trim();
    matches!(
        base,
        "smallint"
            | "int2"
            | "integer"
            | "int"
            | "int4"
            | "bigint"
            | "int8"
            | "numeric"
            | "decimal"
            | "real"
            | "float4"
            | "float"
            | "double precision"
            | "float8"
            | "double"
            | "text"
            | "varchar"
            | "character varying"
            | "char"
            | "character"
            | "bpchar"
            | "boolean"
            | "bool"
            | "date"
            | "timestamp"
            | "timestamp without time zone"
            | "timestamptz"
            | "timestamp with time zone"
    )
}

/// A function name as the post-processing SQL calls it: `pg_catalog.` qualified (no search path
/// can substitute another), except the SQL constructs that cannot be qualified.
fn qualified(name: &str) -> ObjectName {
    if matches!(name, "coalesce" | "nullif" | "greatest" | "least") {
        ObjectName::from(vec![Ident::new(name.to_ascii_uppercase())])
    } else {
        ObjectName::from(vec![Ident::new("pg_catalog"), Ident::new(name)])
    }
}

/// A name in an outer query over an aggregate subquery `alias` whose released columns are
/// `names`: `Some(Ok)` for one of them, an error for any other column or an aggregate over its
/// rows, `None` for other expressions.
fn outer_reference(e: &Expr, alias: &str, names: &[String]) -> Option<Result<()>> {
    let named = |n: &Ident| names.contains(&ident_lower(n));
    match e {
        Expr::Identifier(id) if named(id) => Some(Ok(())),
        Expr::Identifier(id) => Some(Err(Error::UnknownColumn {
            name: id.value.clone(),
        })),
        Expr::CompoundIdentifier(parts) => Some(match parts.as_slice() {
            [a, c] if ident_lower(a) == alias && named(c) => Ok(()),
            _ => Err(Error::UnknownColumn {
                name: e.to_string(),
            }),
        }),
        Expr::Function(f)
            if f.over.is_none()
                && function_name(&f.name)
                    .ok()
                    .and_then(|n| aggregate_kind(&n))
                    .is_some() =>
        {
            Some(Err(Error::unsupported(
                "aggregates over the rows of an aggregate subquery",
                "Aggregate in the subquery itself; the outer query may filter, sort, limit and compute expressions over its rows.",
            )))
        }
        _ => None,
    }
}

/// A literal in an expression over released values: numbers, strings, booleans, NULL and
/// typed literals of the types released values can be cast to; no parameters.
fn released_literal(e: &Expr) -> Result<()> {
    match e {
        Expr::Value(v) => match &v.value {
            Value::Number(..)
            | Value::SingleQuotedString(_)
            | Value::DollarQuotedString(_)
            | Value::Boolean(_)
            | Value::Null => Ok(()),
            Value::Placeholder(p) => Err(Error::unsupported(
                format!("the parameter {p} in an expression over aggregates"),
                "Use a literal there; parameters are allowed in WHERE.",
            )),
            _ => Err(Error::unsupported(
                format!("the literal {v} in an expression over aggregates"),
                POST_HINT,
            )),
        },
        Expr::TypedString(ts) => {
            if castable(&ts.data_type) {
                Ok(())
            } else {
                Err(Error::unsupported(
                    format!("the literal {ts} in an expression over aggregates"),
                    POST_HINT,
                ))
            }
        }
        other => Err(Error::unsupported(
            format!("{other} in an expression over aggregates"),
            POST_HINT,
        )),
    }
}

/// The hint of a correlated or unsupported subquery in an expression over aggregates.
const SUBQUERY_HINT: &str = "pgdp releases a scalar subquery that reads only its own tables first, charged on its own, and uses its noisy value as a constant; this one reads the outer query's columns (a correlated subquery), or is not one aggregate without GROUP BY. Or ask for the numerator and the denominator in one query of the table, one release charged once: move the numerator's WHERE condition into FILTER, as in SELECT COUNT(*) FILTER (WHERE <condition>) * 1.0 / COUNT(*) FROM <table>; for each group's share of all rows, divide by SUM(COUNT(*)) OVER (), as in SELECT <key>, COUNT(*) * 1.0 / SUM(COUNT(*)) OVER () FROM <table> GROUP BY <key>.";

impl Analyzer<'_> {
    /// Rewrites `e` in place into an expression over [`RELEASED_RELATION`]: aggregates become
    /// released columns (and are added to `st`), group keys become key columns; refuses what is
    /// neither, and every construct off the allow-list.
    pub(super) fn released_expr(
        &mut self,
        e: &mut Expr,
        st: &mut Staging<'_>,
        place: Place<'_>,
    ) -> Result<()> {
        if self.released_reference(e, st, place)? {
            return Ok(());
        }
        let inner = Place::Select;
        match e {
            Expr::Nested(x) => self.released_expr(x, st, inner),
            Expr::Value(_) | Expr::TypedString(_) => released_literal(e),
            Expr::BinaryOp { left, op, right } => self.released_binary(left, op, right, st),
            Expr::UnaryOp { op, expr } => match op {
                UnaryOperator::Not | UnaryOperator::Minus | UnaryOperator::Plus => {
                    self.released_expr(expr, st, inner)?;
                    // `- -x` must not print as `--x`, which starts a comment.
                    **expr = Expr::Nested(expr.clone());
                    Ok(())
                }
                other => Err(Error::unsupported(
                    format!("the operator {other} in an expression over aggregates"),
                    POST_HINT,
                )),
            },
            Expr::Cast {
                expr,
                data_type,
                format,
                ..
            } => {
                if format.is_some() || !castable(data_type) {
                    return Err(Error::unsupported(
                        format!("a cast to {data_type} in an expression over aggregates"),
                        "Cast released values to numbers, text, booleans, dates or timestamps.",
                    ));
                }
                self.released_expr(expr, st, inner)
            }
            Expr::Case {
                operand,
                conditions,
                else_result,
                ..
            } => {
                // In the order written: the operand, each WHEN and THEN, ELSE.
                let whens = conditions
                    .iter_mut()
                    .flat_map(|w| [&mut w.condition, &mut w.result]);
                let all = (operand.iter_mut().map(|x| &mut **x))
                    .chain(whens)
                    .chain(else_result.iter_mut().map(|x| &mut **x));
                self.released_all(all, st)
            }
            Expr::IsNull(x)
            | Expr::IsNotNull(x)
            | Expr::IsTrue(x)
            | Expr::IsFalse(x)
            | Expr::IsNotTrue(x)
            | Expr::IsNotFalse(x)
            | Expr::IsUnknown(x)
            | Expr::IsNotUnknown(x) => self.released_expr(x, st, inner),
            Expr::IsDistinctFrom(a, b) | Expr::IsNotDistinctFrom(a, b) => {
                self.released_all([&mut **a, &mut **b], st)
            }
            Expr::Between {
                expr, low, high, ..
            } => self.released_all([&mut **expr, &mut **low, &mut **high], st),
            Expr::InList { expr, list, .. } => {
                if list.len() > limits::IN_LIST_VALUES_MAX {
                    return Err(Error::LimitExceeded {
                        what: "the number of values in an IN list".into(),
                        limit: limits::IN_LIST_VALUES_MAX as u64,
                    });
                }
                self.released_expr(expr, st, inner)?;
                self.released_all(list.iter_mut(), st)
            }
            Expr::Like {
                expr,
                pattern,
                escape_char,
                any: false,
                ..
            }
            | Expr::ILike {
                expr,
                pattern,
                escape_char,
                any: false,
                ..
            } if escape_char.is_none() => self.released_all([&mut **expr, &mut **pattern], st),
            Expr::Extract { expr, .. } => self.released_expr(expr, st, inner),
            // An interval literal (`released_date + INTERVAL '1 day'`, and the seconds a timestamp
            // quantile counts): a constant; a malformed one fails when the shadow catalog
            // describes the statement, before anything is charged.
            Expr::Interval(iv)
                if matches!(
                    iv.value.as_ref(),
                    Expr::Value(v) if matches!(v.value, Value::SingleQuotedString(_))
                ) =>
            {
                Ok(())
            }
            Expr::Floor { expr, .. } | Expr::Ceil { expr, .. } => {
                self.released_expr(expr, st, inner)
            }
            Expr::Function(f) => self.released_function(f, st),
            // A denominator from another query (`COUNT(*) * 1.0 / (SELECT COUNT(*) FROM t)`):
            // the same question is one query of t, its condition moved into FILTER.
            Expr::Subquery(_) => Err(Error::unsupported(
                format!("the subquery {e} in an expression over aggregates"),
                SUBQUERY_HINT,
            )),
            other => Err(Error::unsupported(
                format!("{other} in an expression over aggregates"),
                POST_HINT,
            )),
        }
    }

    /// [`Analyzer::released_expr`] of each of `exprs`, in order.
    fn released_all<'e>(
        &mut self,
        exprs: impl IntoIterator<Item = &'e mut Expr>,
        st: &mut Staging<'_>,
    ) -> Result<()> {
        for x in exprs {
            self.released_expr(x, st, Place::Select)?;
        }
        Ok(())
    }

    /// `e` when it is a name or a released value itself: an output column named in ORDER BY, a
    /// released column of an aggregate subquery, GROUPING(…), an aggregate (released through a
    /// mechanism, added to `st`) or a group key, rewritten in place; `false` when it is none.
    fn released_reference(
        &mut self,
        e: &mut Expr,
        st: &mut Staging<'_>,
        place: Place<'_>,
    ) -> Result<bool> {
        // An output column named in ORDER BY.
        if let (Place::OrderBy(outputs), Expr::Identifier(id)) = (place, &*e) {
            if let Some((name, _)) = outputs
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(&id.value))
            {
                *e = Expr::Identifier(Ident::with_quote('"', name.as_str()));
                return Ok(true);
            }
        }
        if let Some((alias, names)) = st.outer {
            if let Some(named) = outer_reference(e, alias, names) {
                return named.map(|()| true);
            }
        }
        // GROUPING(…): a function of the released row's grouping set (columns `g<i>`).
        if st.outer.is_none() && grouping::is_grouping_call(e) {
            if st.sets.is_none() {
                return Err(grouping::grouping_without_sets());
            }
            let args = self.grouping_arguments(e, st.keys)?;
            *e = grouping::released_grouping(&args);
            return Ok(true);
        }
        // An aggregate: released through a mechanism.
        if let Expr::Function(f) = &*e {
            let name = function_name(&f.name)?;
            if f.over.is_none() && aggregate_kind(&name).is_some() {
                let original = e.clone();
                let agg = self
                    .aggregate(&original)?
                    .ok_or_else(|| Error::internal("an aggregate was not recognised"))?;
                // The shadow catalog types a detected count as the `boolean` it is.
                let i = st.push(agg, &existence::for_typing(&original));
                *e = released_column('a', i);
                return Ok(true);
            }
        }
        // A group key (or an expression that reads a table's column and is none).
        if st.outer.is_none()
            && !contains_aggregate(e)
            && !contains_window(e)
            && has_column_reference(e)
        {
            let mut c = e.clone();
            if self.expr(&mut c, Role::Key).is_ok() {
                let text = c.to_string();
                if let Some(i) = st.keys.iter().position(|k| k.expr == text) {
                    *e = released_column('k', i);
                    return Ok(true);
                }
            }
            if let (Place::Having(outputs), Expr::Identifier(id)) = (place, &*e) {
                if let Some((_, x)) = outputs
                    .iter()
                    .find(|(n, _)| n.eq_ignore_ascii_case(&id.value))
                {
                    *e = x.clone();
                    return Ok(true);
                }
            }
            if matches!(e, Expr::Identifier(_) | Expr::CompoundIdentifier(_)) {
                return Err(Error::forbidden(
                    format!("{e} must appear in GROUP BY or be used in an aggregate"),
                    "pgdp releases only aggregates (COUNT, SUM, AVG, VARIANCE, STDDEV, quantiles) and GROUP BY keys; expressions may combine them.",
                ));
            }
        }
        Ok(false)
    }

    /// A binary operator over released values, dividing by `NULLIF(divisor, 0)`.
    fn released_binary(
        &mut self,
        left: &mut Expr,
        op: &BinaryOperator,
        right: &mut Box<Expr>,
        st: &mut Staging<'_>,
    ) -> Result<()> {
        let inner = Place::Select;
        use BinaryOperator as B;
        if !matches!(
            op,
            B::Plus
                | B::Minus
                | B::Multiply
                | B::Divide
                | B::Modulo
                | B::Eq
                | B::NotEq
                | B::Lt
                | B::LtEq
                | B::Gt
                | B::GtEq
                | B::And
                | B::Or
                | B::StringConcat
        ) {
            return Err(Error::unsupported(
                format!("the operator {op} in an expression over aggregates"),
                POST_HINT,
            ));
        }
        self.released_expr(left, st, inner)?;
        self.released_expr(right, st, inner)?;
        if matches!(op, B::Divide | B::Modulo) {
            **right = nullif_zero(Expr::Nested(right.clone()));
        }
        Ok(())
    }

    /// A scalar or window function over released values.
    fn released_function(&mut self, f: &mut ast::Function, st: &mut Staging<'_>) -> Result<()> {
        let name = function_name(&f.name)?;
        if f.filter.is_some() || !f.within_group.is_empty() || f.null_treatment.is_some() {
            return Err(Error::unsupported(
                format!("FILTER / WITHIN GROUP / IGNORE NULLS on {name} over aggregates"),
                POST_HINT,
            ));
        }
        let windowed = f.over.is_some();
        // A window over the rows of a private table (no aggregate in it, no group to run over)
        // would release per-row values.
        if windowed && st.outer.is_none() && st.keys.is_empty() && {
            let call = Expr::Function(f.clone());
            !contains_plain_aggregate(&call)
        } {
            return Err(window_refusal());
        }
        if windowed && !window_function(&name) {
            return Err(Error::UnknownFunction {
                name: format!("{name} as a window function"),
                hint: "Over the released rows pgdp allows the window functions sum, avg, count, min, max, row_number, rank, dense_rank, percent_rank, cume_dist, ntile, lag, lead, first_value and last_value.".into(),
            });
        }
        if !windowed && !post_function(&name) {
            return Err(Error::UnknownFunction {
                name: f.name.to_string(),
                hint: POST_HINT.into(),
            });
        }
        match &mut f.args {
            FunctionArguments::List(list) => {
                if list.duplicate_treatment.is_some() || !list.clauses.is_empty() {
                    return Err(Error::unsupported(
                        format!("DISTINCT or clauses in the arguments of {name}"),
                        POST_HINT,
                    ));
                }
                for a in &mut list.args {
                    match a {
                        FunctionArg::Unnamed(FunctionArgExpr::Expr(x)) => {
                            self.released_expr(x, st, Place::Select)?
                        }
                        FunctionArg::Unnamed(FunctionArgExpr::Wildcard)
                            if windowed && name == "count" => {}
                        _ => {
                            return Err(Error::unsupported(
                                format!("named or wildcard arguments of {name}"),
                                POST_HINT,
                            ))
                        }
                    }
                }
            }
            FunctionArguments::None if windowed => {}
            _ => {
                return Err(Error::unsupported(
                    format!("{name} without an argument list"),
                    POST_HINT,
                ))
            }
        }
        if let Some(over) = &mut f.over {
            let ast::WindowType::WindowSpec(spec) = over else {
                return Err(Error::unsupported(
                    "named windows",
                    "Write the window in OVER (…).",
                ));
            };
            if spec.window_name.is_some() || spec.window_frame.is_some() {
                return Err(Error::unsupported(
                    "named windows and window frames over aggregates",
                    "Use OVER (PARTITION BY … ORDER BY …) with the default frame.",
                ));
            }
            for p in &mut spec.partition_by {
                self.released_expr(p, st, Place::Select)?;
            }
            for o in &mut spec.order_by {
                if o.with_fill.is_some() {
                    return Err(Error::unsupported("WITH FILL", WITH_FILL_HINT));
                }
                if matches!(o.options.sort, Some(ast::OrderBySort::Using(_))) {
                    return Err(Error::unsupported("ORDER BY … USING", "Use ASC or DESC."));
                }
                self.released_expr(&mut o.expr, st, Place::Select)?;
            }
        }
        f.name = qualified(&name);
        Ok(())
    }
}

/// Aggregates, outputs and the post-processing of a plan whose select list, HAVING or ORDER BY
/// PostgreSQL evaluates.
pub(super) type Staged = (Vec<Aggregate>, Vec<Output>, PostProcessing);

pub(super) fn quoted(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

impl Analyzer<'_> {
    /// The select list, HAVING, ORDER BY, LIMIT and OFFSET as [`PostProcessing`] over the
    /// released keys and aggregates.
    pub(super) fn post_processing(
        &mut self,
        query: &ast::Query,
        select: &ast::Select,
        keys: &[GroupKey],
        key_originals: &[Expr],
        sets: Option<&[Vec<usize>]>,
    ) -> Result<Staged> {
        let mut st = Staging {
            keys,
            sets,
            outer: None,
            aggregates: Vec::new(),
            originals: Vec::new(),
        };
        let mut outputs = Vec::new();
        let mut items: Vec<(String, Expr)> = Vec::new();
        for item in &select.projection {
            let (expr, alias) = select_item(item)?;
            let mut e = expr.clone();
            self.released_expr(&mut e, &mut st, Place::Select)?;
            let name = alias.unwrap_or_else(|| default_name(expr));
            if name.starts_with(RESERVED_PREFIX) {
                return Err(reserved_refusal());
            }
            let source = (0..st.aggregates.len())
                .find(|&i| e == released_column('a', i))
                .map(OutputSource::Aggregate)
                .or_else(|| {
                    (0..keys.len())
                        .find(|&i| e == released_column('k', i))
                        .map(OutputSource::Key)
                })
                .unwrap_or(OutputSource::Computed(items.len()));
            outputs.push(Output {
                name: name.clone(),
                source,
            });
            items.push((name, e));
        }
        if st.aggregates.is_empty() {
            return Err(Error::forbidden(
                "a query on private tables must compute at least one aggregate",
                "Add COUNT(*) (or another aggregate) to the select list; group keys alone are released only with a noisy count.",
            ));
        }
        let mut sql = String::from("SELECT ");
        let list: Vec<String> = items
            .iter()
            .map(|(name, e)| format!("{e} AS {}", quoted(name)))
            .collect();
        sql.push_str(&list.join(", "));
        sql.push_str(&format!(" FROM {}", quoted(RELEASED_RELATION)));
        let mut where_sql = String::new();
        if let Some(h) = &select.having {
            let mut h = h.clone();
            self.released_expr(&mut h, &mut st, Place::Having(&items))?;
            where_sql = format!(" WHERE {h}");
        }
        sql.push_str(&where_sql);
        let order_limit = self.order_limit(query, &mut st, &items, Some(items.len()))?;
        if st.aggregates.len() > limits::AGGREGATES_PER_QUERY_MAX {
            return Err(Error::LimitExceeded {
                what: "the number of aggregates".into(),
                limit: limits::AGGREGATES_PER_QUERY_MAX as u64,
            });
        }
        // Under pgdp.accuracy: the same SQL with `<name>_error95` (the column `e<i>` of the
        // released relation) after each output that is an aggregate as released. DISTINCT would
        // compare the bounds too, so a DISTINCT select list has none.
        let errors = select.distinct.is_none().then(|| {
            let mut listed = Vec::new();
            let mut positions = Vec::new();
            for ((name, e), o) in items.iter().zip(&outputs) {
                listed.push(format!("{e} AS {}", quoted(name)));
                positions.push(listed.len());
                if let OutputSource::Aggregate(i) = o.source {
                    if st.aggregates[i].kind != AggregateKind::Detected {
                        listed.push(format!(
                            "{} AS {}",
                            released_column('e', i),
                            quoted(&format!("{name}_error95"))
                        ));
                    }
                }
            }
            format!(
                "SELECT {} FROM {}{}{}",
                listed.join(", "),
                quoted(RELEASED_RELATION),
                where_sql,
                order_limit.sql(|i| positions.get(i - 1).copied().unwrap_or(i))
            )
        });
        sql.push_str(&order_limit.sql(|i| i));
        let measures = measures_statement(query, key_originals, &st.originals, sets)?;
        Ok((
            st.aggregates,
            outputs,
            PostProcessing {
                sql,
                errors,
                measures: measures.to_string(),
            },
        ))
    }
}

/// ` ORDER BY … LIMIT … OFFSET …` of post-processing SQL, printed with its output positions
/// mapped (the select list with `_error95` columns has the outputs at other positions).
pub(super) struct OrderLimit {
    /// Each sort key, with its output position (1-based) when it is one.
    sorted: Vec<(Option<usize>, ast::OrderByExpr)>,
    /// ` LIMIT … OFFSET …`.
    tail: String,
}

impl OrderLimit {
    /// Whether a sort key is an output position.
    pub(super) fn by_position(&self) -> bool {
        self.sorted.iter().any(|(at, _)| at.is_some())
    }

    /// The clause, each output position `i` printed as `position(i)`.
    pub(super) fn sql(&self, position: impl Fn(usize) -> usize) -> String {
        let mut sql = String::new();
        if !self.sorted.is_empty() {
            let keys: Vec<String> = self
                .sorted
                .iter()
                .map(|(at, o)| match at {
                    Some(i) => {
                        let mut o = o.clone();
                        o.expr = Expr::value(Value::Number(position(*i).to_string(), false));
                        o.to_string()
                    }
                    None => o.to_string(),
                })
                .collect();
            sql.push_str(&format!(" ORDER BY {}", keys.join(", ")));
        }
        sql.push_str(&self.tail);
        sql
    }
}

impl Analyzer<'_> {
    /// ` ORDER BY … LIMIT … OFFSET …` of post-processing SQL: sort keys over released values,
    /// output names (`outputs`) and positions (checked against `width` when the number of
    /// output columns is known), and the literal LIMIT and OFFSET.
    pub(super) fn order_limit(
        &mut self,
        query: &ast::Query,
        st: &mut Staging<'_>,
        outputs: &[(String, Expr)],
        width: Option<usize>,
    ) -> Result<OrderLimit> {
        let mut sorted = Vec::new();
        if let Some(ob) = &query.order_by {
            let ast::OrderByKind::Expressions(exprs) = &ob.kind else {
                return Err(Error::unsupported("ORDER BY ALL", ORDER_BY_ALL_HINT));
            };
            for o in exprs {
                if o.with_fill.is_some() {
                    return Err(Error::unsupported("WITH FILL", WITH_FILL_HINT));
                }
                if matches!(o.options.sort, Some(ast::OrderBySort::Using(_))) {
                    return Err(Error::unsupported("ORDER BY … USING", "Use ASC or DESC."));
                }
                let mut o = o.clone();
                let position =
                    matches!(&o.expr, Expr::Value(v) if matches!(v.value, Value::Number(..)));
                if position {
                    let n = o.expr.to_string();
                    let i: usize = n.parse().map_err(|_| Error::Syntax {
                        message: format!("invalid ORDER BY position {n}"),
                    })?;
                    if i == 0 || width.is_some_and(|w| i > w) {
                        return Err(Error::Syntax {
                            message: format!("ORDER BY position {i} is not in select list"),
                        });
                    }
                    sorted.push((Some(i), o));
                } else {
                    self.released_expr(&mut o.expr, st, Place::OrderBy(outputs))?;
                    sorted.push((None, o));
                }
            }
        }
        let mut tail = String::new();
        let (limit, offset) = limit_offset(query)?;
        if let Some(l) = limit {
            tail.push_str(&format!(" LIMIT {l}"));
        }
        if offset > 0 {
            tail.push_str(&format!(" OFFSET {offset}"));
        }
        Ok(OrderLimit { sorted, tail })
    }
}

/// The analyst's statement with the group keys and the aggregates as its select list, grouped by
/// the same keys, without HAVING, ORDER BY or LIMIT: what the shadow catalog describes to type
/// the released relation (never run).
///
/// With grouping sets, the select list ends with `GROUPING(key)` for each key (the `g<i>`
/// columns), and GROUP BY is the equivalent `GROUPING SETS` clause over the keys.
fn measures_statement(
    query: &ast::Query,
    keys: &[Expr],
    aggregates: &[Expr],
    sets: Option<&[Vec<usize>]>,
) -> Result<ast::Query> {
    let mut q = query.clone();
    q.order_by = None;
    q.limit_clause = None;
    let mut groupings = Vec::new();
    if sets.is_some() {
        for k in keys {
            let text = format!("GROUPING({k})");
            let e = sqlparser::parser::Parser::new(&sqlparser::dialect::PostgreSqlDialect {})
                .try_with_sql(&text)
                .and_then(|mut p| p.parse_expr())
                .map_err(|e| Error::internal(format!("GROUPING of a key does not parse: {e}")))?;
            groupings.push(e);
        }
    }
    if let SetExpr::Select(s) = q.body.as_mut() {
        s.projection = keys
            .iter()
            .chain(aggregates)
            .chain(&groupings)
            .map(|e| SelectItem::UnnamedExpr(e.clone()))
            .collect();
        s.having = None;
        match sets {
            Some(sets) => {
                s.group_by = GroupByExpr::Expressions(
                    vec![grouping::grouping_sets_expr(sets, keys)],
                    Vec::new(),
                );
            }
            None if !keys.is_empty() => {
                s.group_by = GroupByExpr::Expressions(keys.to_vec(), Vec::new());
            }
            None => {}
        }
    }
    Ok(q)
}
