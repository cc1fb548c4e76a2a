//! Semijoins on the privacy unit: conditions of WHERE such as
//! `person_id IN (SELECT person_id FROM demo.visits WHERE …)` and
//! `[NOT] EXISTS (SELECT 1 FROM demo.visits v WHERE v.person_id = p.person_id AND …)`.
//!
//! Such a condition keeps a row by a predicate of the rows of *its own* privacy unit in other
//! private tables (and of public tables), so adding or removing one unit changes only that unit's
//! rows, and the contribution bounds of the outer query hold unchanged (docs/privacy.md,
//! "Semijoins on the privacy unit"). That is true only for the shapes accepted here:
//! - the outer column (left of IN, or the outer side of EXISTS's correlation) is the privacy unit
//!   of a private table of the query, and the subquery's selected (or correlated) column the
//!   privacy unit of one of its own private tables;
//! - the subquery reads private tables with a unit column, joined on it, and public tables, under
//!   the join rules of the outer query; row-level private tables take no part;
//! - it refers to the outer query only through that equality of units, and its WHERE passes the
//!   same whitelist of total expressions as the outer WHERE;
//! - it has no ORDER BY, LIMIT, OFFSET, DISTINCT ON, window or set operation (they pick rows by
//!   other units' values), and aggregates only per unit (`GROUP BY <unit> HAVING …`);
//! - `NOT IN` is refused: it is NULL for every row as soon as the subquery yields one NULL, and
//!   for a row whose unit is NULL it is true exactly when the subquery is empty, so its answer
//!   would depend on rows outside the unit. `NOT EXISTS` says what is meant without that.
//!
//! A semijoin is a condition of WHERE on its own (a top-level conjunct); anywhere else (under OR,
//! in a CASE, in a subquery in FROM) subqueries stay refused.

use super::*;

/// The tables in scope of one query level, as [`Analyzer::tables`] holds them.
type Scope<'a> = Vec<(TableRef, Cow<'a, Table>, String)>;

/// A condition of WHERE that is a semijoin, as written.
enum Form<'q> {
    /// `expr IN (subquery)`.
    In(&'q Expr, &'q ast::Query),
    /// `EXISTS (subquery)`.
    Exists(&'q ast::Query),
}

/// Whether `e` is a semijoin (through parentheses and NOT): whether it is negated, and its form.
fn semijoin_form(e: &Expr) -> Option<(bool, Form<'_>)> {
    match e {
        Expr::Nested(inner) => semijoin_form(inner),
        Expr::UnaryOp {
            op: UnaryOperator::Not,
            expr,
        } => semijoin_form(expr).map(|(negated, form)| (!negated, form)),
        Expr::Exists { subquery, negated } => Some((*negated, Form::Exists(subquery))),
        Expr::InSubquery {
            expr,
            subquery,
            negated,
        } => Some((*negated, Form::In(expr, subquery))),
        _ => None,
    }
}

/// The conditions of a WHERE clause: `e` split at its top-level ANDs (through parentheses).
pub(in crate::dp) fn conjuncts<'e>(e: &'e Expr, out: &mut Vec<&'e Expr>) {
    match e {
        Expr::BinaryOp {
            left,
            op: BinaryOperator::And,
            right,
        } => {
            conjuncts(left, out);
            conjuncts(right, out);
        }
        Expr::Nested(inner)
            if matches!(
                inner.as_ref(),
                Expr::BinaryOp {
                    op: BinaryOperator::And,
                    ..
                } | Expr::Nested(_)
            ) =>
        {
            conjuncts(inner, out)
        }
        _ => out.push(e),
    }
}

/// `a AND b AND …`, or `None` for no conditions.
fn and_all(conditions: Vec<Expr>) -> Option<Expr> {
    conditions.into_iter().reduce(|l, r| Expr::BinaryOp {
        left: Box::new(l),
        op: BinaryOperator::And,
        right: Box::new(r),
    })
}

fn example(unit: &str) -> String {
    format!(
        "Write a semijoin on the privacy unit as a condition of WHERE: {unit} IN (SELECT {unit} FROM <table> WHERE …), or EXISTS (SELECT 1 FROM <table> t WHERE t.{unit} = <outer>.{unit} AND …)."
    )
}

fn not_unit(what: &str, unit: &str) -> Error {
    Error::unsupported(
        format!("a semijoin on {what} other than the privacy unit"),
        format!(
            "Only a semijoin on the privacy unit keeps each person's rows by that person's own rows. {} To filter by a public table, join it in the outer query.",
            example(unit)
        ),
    )
}

impl<'a> Analyzer<'a> {
    /// The query's WHERE: its conditions without the semijoins (checked like any WHERE), and the
    /// semijoins. Without a semijoin the expression is kept as written.
    pub(super) fn where_clause(&mut self, e: &Expr) -> Result<(Option<Expr>, Vec<Semijoin>)> {
        let mut parts = Vec::new();
        conjuncts(e, &mut parts);
        if !parts.iter().any(|c| semijoin_form(c).is_some()) {
            let mut e = e.clone();
            self.filter_condition(&mut e)?;
            return Ok((Some(e), Vec::new()));
        }
        let mut rest = Vec::new();
        let mut semijoins = Vec::new();
        for c in parts {
            match semijoin_form(c) {
                Some((negated, form)) => {
                    if semijoins.len() >= limits::SEMIJOINS_PER_QUERY_MAX {
                        return Err(Error::LimitExceeded {
                            what: "the number of semijoins (IN / EXISTS subqueries)".into(),
                            limit: limits::SEMIJOINS_PER_QUERY_MAX as u64,
                        });
                    }
                    semijoins.push(self.semijoin(negated, form)?);
                }
                None => {
                    let mut c = c.clone();
                    self.filter_condition(&mut c)?;
                    rest.push(c);
                }
            }
        }
        Ok((and_all(rest), semijoins))
    }

    /// Checks a condition of WHERE (canonicalising it in place): whitelisted and boolean.
    fn filter_condition(&mut self, e: &mut Expr) -> Result<()> {
        let info = self.expr(e, Role::Filter)?;
        if info.ty.is_some_and(|t| t != ColumnType::Boolean) {
            return Err(Error::Syntax {
                message: "argument of WHERE must be type boolean".into(),
            });
        }
        Ok(())
    }

    /// The name of the privacy unit of the query's first private table that names it, for hints
    /// (a subquery's hidden `__dp_unit` is not a name the analyst can write).
    fn unit_name(&self) -> String {
        self.tables
            .iter()
            .filter(|(r, _, _)| r.private)
            .filter_map(|(_, t, _)| t.private().and_then(|p| p.privacy_unit.clone()))
            .find(|u| !u.starts_with(RESERVED_PREFIX))
            .unwrap_or_else(|| "<privacy unit>".into())
    }

    /// Whether column `col` of table `idx` in scope is the privacy unit of a private table.
    fn is_unit_column(&self, idx: usize, col: &str) -> bool {
        let (r, t, _) = &self.tables[idx];
        r.private && t.private().and_then(|p| p.privacy_unit.as_deref()) == Some(col)
    }

    /// `e` as a privacy unit column of the current scope, or `None`.
    fn unit_column_ref(&self, e: &Expr) -> Option<ColumnRef> {
        let e = match e {
            Expr::Nested(inner) => inner.as_ref(),
            e => e,
        };
        let (idx, col) = self.column_ref(e).ok().flatten()?;
        self.is_unit_column(idx, &col)
            .then(|| ColumnRef::new(&self.tables[idx].0.alias, &col))
    }

    /// The type of column `c` of the current scope.
    fn column_type(&self, c: &ColumnRef) -> Option<ColumnType> {
        self.tables
            .iter()
            .find(|(r, _, _)| r.alias == c.alias)
            .and_then(|(_, t, _)| t.column(&c.column))
            .map(|col| col.ty)
    }

    /// Refuses equating the subquery's unit `inner` with the outer unit `outer` when their types
    /// cannot be compared (the upstream would fail on every run, after the charge).
    fn comparable_units(
        &mut self,
        inner: &ColumnRef,
        outer: &ColumnRef,
        scope: &mut Scope<'a>,
    ) -> Result<()> {
        let a = self.column_type(inner);
        let b = self.in_scope(scope, |o| o.column_type(outer));
        check_comparable(&Info::constant(a, None), &Info::constant(b, None))
    }

    /// Runs `f` with `scope` in place of the current tables.
    fn in_scope<T>(&mut self, scope: &mut Scope<'a>, f: impl FnOnce(&mut Self) -> T) -> T {
        std::mem::swap(&mut self.tables, scope);
        let out = f(self);
        std::mem::swap(&mut self.tables, scope);
        out
    }

    /// Whether `e` names a column that the current scope lacks and `outer` has.
    fn mentions_outer(&mut self, e: &Expr, outer: &mut Scope<'a>) -> bool {
        let mut names = Vec::new();
        let _ = ast::visit_expressions(e, |x| {
            if matches!(x, Expr::Identifier(_) | Expr::CompoundIdentifier(_)) {
                names.push(x.clone());
            }
            std::ops::ControlFlow::<()>::Continue(())
        });
        names.iter().any(|n| {
            self.column_ref(n).ok().flatten().is_none()
                && self.in_scope(outer, |a| a.column_ref(n).ok().flatten().is_some())
        })
    }

    /// The refusal for a subquery that refers to the outer query other than by equating units.
    fn outer_reference(&self, unit: &str) -> Error {
        Error::unsupported(
            "a subquery that refers to the outer query other than by equating the privacy units",
            format!(
                "Correlate only on the privacy unit and filter the subquery's own columns. {}",
                example(unit)
            ),
        )
    }

    /// Checks `e` in the subquery's scope; an unknown name the outer query knows is an outer
    /// reference, refused as such.
    fn inner_expr(&mut self, e: &mut Expr, role: Role, outer: &mut Scope<'a>) -> Result<Info> {
        let original = e.clone();
        match self.expr(e, role) {
            Err(Error::UnknownColumn { .. } | Error::UnknownTable { .. })
                if self.mentions_outer(&original, outer) =>
            {
                let unit = self.in_scope(outer, |a| a.unit_name());
                Err(self.outer_reference(&unit))
            }
            other => other,
        }
    }

    /// A correlation `inner.unit = outer.unit` (either way round): the subquery's unit column and
    /// the outer one. `None` when `e` does not refer to the outer query; refused when it equates
    /// other columns across the two.
    fn correlation(
        &mut self,
        e: &Expr,
        outer: &mut Scope<'a>,
    ) -> Result<Option<(ColumnRef, ColumnRef)>> {
        let e = match e {
            Expr::Nested(inner) => inner.as_ref(),
            e => e,
        };
        let Expr::BinaryOp {
            left,
            op: BinaryOperator::Eq,
            right,
        } = e
        else {
            return Ok(None);
        };
        // A name is the subquery's when it resolves there (the nearest scope, as in SQL).
        let side = |a: &mut Self, x: &Expr, outer: &mut Scope<'a>| -> Option<bool> {
            if a.column_ref(x).ok().flatten().is_some() {
                Some(true)
            } else if a.in_scope(outer, |o| o.column_ref(x).ok().flatten().is_some()) {
                Some(false)
            } else {
                None
            }
        };
        let (l, r) = (side(self, left, outer), side(self, right, outer));
        let (inner_side, outer_side) = match (l, r) {
            (Some(true), Some(false)) => (left.as_ref(), right.as_ref()),
            (Some(false), Some(true)) => (right.as_ref(), left.as_ref()),
            _ => return Ok(None),
        };
        let unit = self.in_scope(outer, |a| a.unit_name());
        let inner_unit = self.unit_column_ref(inner_side);
        let outer_unit = self.in_scope(outer, |a| a.unit_column_ref(outer_side));
        match (inner_unit, outer_unit) {
            (Some(i), Some(o)) => {
                self.comparable_units(&i, &o, outer)?;
                Ok(Some((i, o)))
            }
            _ => Err(not_unit("a correlation", &unit)),
        }
    }

    /// Analyses one semijoin of WHERE.
    fn semijoin(&mut self, negated: bool, form: Form<'_>) -> Result<Semijoin> {
        let unit = self.unit_name();
        let (left, query) = match form {
            Form::In(e, q) => (Some(e), q),
            Form::Exists(q) => (None, q),
        };
        if negated && left.is_some() {
            return Err(Error::unsupported(
                "NOT IN (subquery)",
                format!(
                    "NOT IN is NULL for every row once the subquery yields a NULL (and true for a NULL {unit} only when the subquery is empty), so its answer would depend on rows of other people. Write NOT EXISTS (SELECT 1 FROM <table> t WHERE t.{unit} = <outer>.{unit} AND …)."
                ),
            ));
        }
        let outer_column = match left {
            Some(e) => Some(
                self.unit_column_ref(e)
                    .ok_or_else(|| not_unit("a column", &unit))?,
            ),
            None => None,
        };
        let select = subquery_select(query, &unit)?;
        let mut outer = std::mem::take(&mut self.tables);
        let body = self.semijoin_body(select, &mut outer, outer_column.as_ref(), &unit);
        self.tables = outer;
        let body = body?;
        let (inner_unit, outer_unit) = match (outer_column, body.selected, body.correlation) {
            // IN: the selected unit equals the column on the left.
            (Some(o), Some(s), _) => (s, o),
            // EXISTS: the correlation equates the two units.
            (None, _, Some((i, o))) => (i, o),
            (None, _, None) => {
                return Err(Error::unsupported(
                    "EXISTS without a correlation on the privacy unit",
                    format!(
                        "An uncorrelated EXISTS is true or false for everyone at once, by other people's rows. {}",
                        example(&unit)
                    ),
                ))
            }
            (Some(_), None, _) => return Err(not_unit("a column", &unit)),
        };
        Ok(Semijoin {
            negated,
            outer: outer_unit,
            tables: body.tables,
            joins: body.joins,
            unit: inner_unit,
            filter: body.filter,
            having: body.having,
        })
    }

    /// The subquery of a semijoin, analysed with `self.tables` holding its own FROM (`outer` is
    /// the outer query's scope). `left`: the outer unit of the form `x IN (subquery)`, whose
    /// select list is one unit column.
    fn semijoin_body(
        &mut self,
        select: &ast::Select,
        outer: &mut Scope<'a>,
        left: Option<&ColumnRef>,
        unit: &str,
    ) -> Result<SemijoinBody> {
        let joins = self.resolve_from(&select.from)?;
        if !self.tables.iter().any(|t| t.0.private) {
            return Err(Error::unsupported(
                "a semijoin over public tables only",
                "Join the public table in the outer query, e.g. JOIN demo.regions r USING (region) WHERE r.population > 1000000.",
            ));
        }
        if matches!(self.unit()?, Unit::Row { .. }) {
            return Err(Error::unsupported(
                "a semijoin over a row-level private table",
                format!("A row-level table has no {unit} column to match; query it on its own."),
            ));
        }

        let selected = self.semijoin_select_list(select, outer, left, unit)?;

        // WHERE: correlations on the unit, and conditions on the subquery's own tables.
        let mut correlation = None;
        let mut conditions = Vec::new();
        if let Some(w) = &select.selection {
            let mut parts = Vec::new();
            conjuncts(w, &mut parts);
            for c in parts {
                if let Some(pair) = self.correlation(c, outer)? {
                    correlation.get_or_insert(pair);
                    continue;
                }
                let mut c = c.clone();
                let info = self.inner_expr(&mut c, Role::Filter, outer)?;
                if info.ty.is_some_and(|t| t != ColumnType::Boolean) {
                    return Err(Error::Syntax {
                        message: "argument of WHERE must be type boolean".into(),
                    });
                }
                conditions.push(c);
            }
        }

        // GROUP BY the unit alone, with HAVING on the unit's aggregates; or no aggregation.
        let group_exprs = match &select.group_by {
            GroupByExpr::Expressions(exprs, modifiers) if modifiers.is_empty() => exprs,
            _ => return Err(group_refusal(unit)),
        };
        let grouped = match group_exprs.as_slice() {
            [] => false,
            [g] => {
                let g = resolve_group_reference(g, &select.projection)?;
                if self.unit_column_ref(&g).is_none() {
                    return Err(group_refusal(unit));
                }
                true
            }
            _ => return Err(group_refusal(unit)),
        };
        let aggregates = select.projection.iter().any(|item| match item {
            SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. } => {
                contains_aggregate(e)
            }
            _ => false,
        });
        if aggregates || (select.having.is_some() && !grouped) {
            return Err(aggregate_refusal(unit));
        }
        let having = match &select.having {
            Some(h) => {
                let mut h = h.clone();
                let info = self.inner_expr(&mut h, Role::UnitAggregate, outer)?;
                if info.ty.is_some_and(|t| t != ColumnType::Boolean) {
                    return Err(Error::Syntax {
                        message: "argument of HAVING must be type boolean".into(),
                    });
                }
                Some(h)
            }
            None => None,
        };
        Ok(SemijoinBody {
            tables: self.tables.iter().map(|t| t.0.clone()).collect(),
            joins,
            selected,
            correlation,
            filter: and_all(conditions),
            having,
        })
    }

    /// The select list of a semijoin's subquery: one unit column for IN (returned);
    /// anything that is not evaluated for EXISTS.
    fn semijoin_select_list(
        &mut self,
        select: &ast::Select,
        outer: &mut Scope<'a>,
        left: Option<&ColumnRef>,
        unit: &str,
    ) -> Result<Option<ColumnRef>> {
        let is_in = left.is_some();
        let mut selected = None;
        for item in &select.projection {
            let expr = match item {
                SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. } => Some(e),
                SelectItem::Wildcard(_) | SelectItem::QualifiedWildcard(..) => None,
                SelectItem::ExprWithAliases { .. } => {
                    return Err(Error::unsupported(
                        "multiple aliases for one select item",
                        "Give the item one alias: expr AS name.",
                    ))
                }
            };
            if is_in {
                let column = match (expr, select.projection.len()) {
                    (Some(e), 1) => self.unit_column_ref(e),
                    _ => None,
                };
                if column.is_none() {
                    if let Some(e) = expr {
                        if contains_aggregate(e) {
                            return Err(aggregate_refusal(unit));
                        }
                        if self.mentions_outer(e, outer) {
                            return Err(self.outer_reference(unit));
                        }
                    }
                    return Err(not_unit("a column", unit));
                }
                if let (Some(c), Some(l)) = (&column, left) {
                    self.comparable_units(c, l, outer)?;
                }
                selected = column;
                continue;
            }
            let plain = match expr {
                None => true,
                Some(Expr::Value(v)) => !matches!(v.value, Value::Placeholder(_)),
                Some(e) => self.column_ref(e).ok().flatten().is_some(),
            };
            if !plain {
                return Err(Error::unsupported(
                    "this select list in EXISTS",
                    format!(
                        "EXISTS only asks whether a row exists: write EXISTS (SELECT 1 FROM <table> t WHERE t.{unit} = <outer>.{unit} AND …), with per-person aggregates in GROUP BY t.{unit} HAVING …"
                    ),
                ));
            }
        }
        Ok(selected)
    }
}

/// What the subquery of a semijoin holds.
struct SemijoinBody {
    tables: Vec<TableRef>,
    joins: Vec<JoinOn>,
    /// For IN: the unit column it selects.
    selected: Option<ColumnRef>,
    /// The first correlation: the subquery's unit and the outer one.
    correlation: Option<(ColumnRef, ColumnRef)>,
    filter: Option<Expr>,
    having: Option<Expr>,
}

fn group_refusal(unit: &str) -> Error {
    Error::unsupported(
        "a semijoin's subquery grouped by something other than the privacy unit",
        format!(
            "Aggregate per person only: {unit} IN (SELECT {unit} FROM <table> GROUP BY {unit} HAVING COUNT(*) > 3)."
        ),
    )
}

fn aggregate_refusal(unit: &str) -> Error {
    Error::unsupported(
        "aggregates over several people in a semijoin's subquery",
        format!(
            "Which people pass would depend on other people's rows. Aggregate per person: {unit} IN (SELECT {unit} FROM <table> GROUP BY {unit} HAVING COUNT(*) > 3)."
        ),
    )
}

/// The SELECT of a semijoin's subquery, refusing what would pick rows by other units' values.
fn subquery_select<'q>(q: &'q ast::Query, unit: &str) -> Result<&'q ast::Select> {
    if q.with.is_some() {
        return Err(Error::unsupported(
            "WITH inside a subquery",
            "Move the CTEs to the top of the query.",
        ));
    }
    if q.order_by.is_some() || q.limit_clause.is_some() || q.fetch.is_some() {
        return Err(Error::unsupported(
            "ORDER BY / LIMIT / OFFSET inside a semijoin's subquery",
            format!(
                "They would let other people's rows decide who passes; filter with WHERE instead. {}",
                example(unit)
            ),
        ));
    }
    if !q.locks.is_empty() {
        return Err(Error::forbidden(
            "FOR UPDATE / FOR SHARE is not allowed through pgdp",
            "",
        ));
    }
    if q.for_clause.is_some()
        || q.settings.is_some()
        || q.format_clause.is_some()
        || !q.pipe_operators.is_empty()
    {
        return Err(Error::unsupported(
            "this clause in a semijoin's subquery",
            example(unit),
        ));
    }
    let SetExpr::Select(select) = q.body.as_ref() else {
        return Err(Error::unsupported(
            "set operations or nested parentheses in a semijoin's subquery",
            format!(
                "Write one SELECT per semijoin and AND (or NOT EXISTS) them in WHERE. {}",
                example(unit)
            ),
        ));
    };
    if matches!(select.distinct, Some(ast::Distinct::On(_))) {
        return Err(Error::unsupported(
            "DISTINCT ON in a semijoin's subquery",
            format!(
                "It picks one row per value by the sort order of other rows. {}",
                example(unit)
            ),
        ));
    }
    if select.into.is_some()
        || select.qualify.is_some()
        || !select.named_window.is_empty()
        || select.top.is_some()
        || select.prewhere.is_some()
        || !select.lateral_views.is_empty()
        || !select.connect_by.is_empty()
        || !select.cluster_by.is_empty()
        || !select.distribute_by.is_empty()
        || !select.sort_by.is_empty()
        || select.exclude.is_some()
    {
        return Err(Error::unsupported(
            "this clause in a semijoin's subquery",
            example(unit),
        ));
    }
    Ok(select)
}
