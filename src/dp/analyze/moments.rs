//! PostgreSQL's two-argument statistical aggregates — `corr`, `covar_pop`, `covar_samp` and the
//! `regr_*` family, each `f(Y, X)` — read as post-processing of bounded sums: the count of rows
//! where both arguments are non-NULL and the sums of the centred values, their squares and their
//! product over those rows, each an ordinary aggregate released through its own mechanism.
//!
//! # Invariants
//! - A call is replaced, before the statement is analysed again, by an expression over `COUNT`
//!   and `SUM` aggregates of the two arguments only (plus the call's FILTER condition), and
//!   literals; nothing of the data reaches the answer except through those aggregates, so the
//!   charge is theirs (one equal ε share each, as for any measures) and the rest is
//!   post-processing.
//! - Both arguments need bounds (from the policy, or literals); each is clamped into them (as
//!   any SUM's argument is) and centred on the midpoint of its bounds, which minimises the sums' sensitivity (`|x − c| ≤ (upper − lower)/2`) and
//!   changes no moment: covariances, correlations and slopes are invariant under the shift, and
//!   the means and the intercept add the centres back.
//! - The expression is total over any noisy values: every division is by a count guarded to
//!   be at least 1 (2 for `covar_samp`), a square root reads a non-negative value, and each
//!   result is clipped into the range the true statistic lies in (a correlation into [-1, 1],
//!   R² into [0, 1], means into the argument's bounds, a covariance into ±the product of the
//!   half-widths), where PostgreSQL would return NULL (no rows, no spread) the answer is NULL.
//! - The result has PostgreSQL's type (`double precision`; `regr_count` is `bigint`) and, as
//!   a bare select item, PostgreSQL's column name (the function's).

use super::*;

/// One of PostgreSQL's two-argument statistical aggregates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Bivariate {
    Corr,
    CovarPop,
    CovarSamp,
    RegrCount,
    RegrAvgX,
    RegrAvgY,
    RegrSxx,
    RegrSyy,
    RegrSxy,
    RegrSlope,
    RegrIntercept,
    RegrR2,
}

fn bivariate(name: &str) -> Option<Bivariate> {
    Some(match name {
        "corr" => Bivariate::Corr,
        "covar_pop" => Bivariate::CovarPop,
        "covar_samp" => Bivariate::CovarSamp,
        "regr_count" => Bivariate::RegrCount,
        "regr_avgx" => Bivariate::RegrAvgX,
        "regr_avgy" => Bivariate::RegrAvgY,
        "regr_sxx" => Bivariate::RegrSxx,
        "regr_syy" => Bivariate::RegrSyy,
        "regr_sxy" => Bivariate::RegrSxy,
        "regr_slope" => Bivariate::RegrSlope,
        "regr_intercept" => Bivariate::RegrIntercept,
        "regr_r2" => Bivariate::RegrR2,
        _ => return None,
    })
}

/// Which of them `f` calls.
fn call_of(f: &ast::Function) -> Option<Bivariate> {
    bivariate(&function_name(&f.name).ok()?)
}

/// Whether the select list, HAVING or ORDER BY of `query` calls one of them.
pub(super) fn calls_bivariate(query: &ast::Query) -> bool {
    let mut found = false;
    let mut look = |e: &Expr| {
        let _ = ast::visit_expressions(e, |x| {
            found |= matches!(x, Expr::Function(f) if call_of(f).is_some());
            std::ops::ControlFlow::<()>::Continue(())
        });
    };
    if let SetExpr::Select(select) = query.body.as_ref() {
        for item in &select.projection {
            if let SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. } = item {
                look(e);
            }
        }
        if let Some(h) = &select.having {
            look(h);
        }
    }
    if let Some(order_by) = &query.order_by {
        if let ast::OrderByKind::Expressions(items) = &order_by.kind {
            for o in items {
                look(&o.expr);
            }
        }
    }
    found
}

/// A number as a SQL literal (parenthesised when negative).
fn literal(v: f64) -> String {
    if v < 0.0 {
        format!("({v})")
    } else {
        format!("{v}")
    }
}

/// The pieces of one call: the arguments' text, their bounds and the rows condition.
struct Moments {
    /// `(y)` and `(x)` as written, parenthesised.
    y: String,
    x: String,
    /// Bounds of Y and X.
    y_bounds: Bounds,
    x_bounds: Bounds,
    /// The condition a row must meet to count: both arguments non-NULL, and the FILTER.
    rows: String,
}

impl Moments {
    fn centre(b: &Bounds) -> f64 {
        (b.lower + b.upper) / 2.0
    }

    fn half_width(b: &Bounds) -> f64 {
        (b.upper - b.lower) / 2.0
    }

    /// `clamp(v) − c`: the value clamped into its bounds, centred on their midpoint. Clamping
    /// the argument itself (not each sum's term) makes every sum a moment of the same clamped
    /// values, so the statistics computed from them are consistent (a correlation of the
    /// clamped data lies in [-1, 1] before noise); the sums' own clamps then never bind.
    fn centred(v: &str, b: &Bounds) -> String {
        let c = Self::centre(b);
        let clamped = format!(
            "LEAST(GREATEST({v}, {}), {})",
            literal(b.lower),
            literal(b.upper)
        );
        if c < 0.0 {
            format!("({clamped} + {})", -c)
        } else {
            format!("({clamped} - {c})")
        }
    }

    fn n(&self) -> String {
        format!("COUNT(CASE WHEN {} THEN 1 END)", self.rows)
    }

    fn sum(&self, value: &str) -> String {
        format!("SUM(CASE WHEN {} THEN {value} END)", self.rows)
    }

    fn sx(&self) -> String {
        self.sum(&Self::centred(&self.x, &self.x_bounds))
    }

    fn sy(&self) -> String {
        self.sum(&Self::centred(&self.y, &self.y_bounds))
    }

    fn sxx(&self) -> String {
        let x = Self::centred(&self.x, &self.x_bounds);
        self.sum(&format!("{x} * {x}"))
    }

    fn syy(&self) -> String {
        let y = Self::centred(&self.y, &self.y_bounds);
        self.sum(&format!("{y} * {y}"))
    }

    fn sxy(&self) -> String {
        let x = Self::centred(&self.x, &self.x_bounds);
        let y = Self::centred(&self.y, &self.y_bounds);
        self.sum(&format!("{x} * {y}"))
    }

    /// Σ(x − x̄)², never below 0.
    fn mxx(&self) -> String {
        format!(
            "GREATEST({} - {sx} * {sx} / {n}, 0)",
            self.sxx(),
            sx = self.sx(),
            n = self.n()
        )
    }

    /// Σ(y − ȳ)², never below 0.
    fn myy(&self) -> String {
        format!(
            "GREATEST({} - {sy} * {sy} / {n}, 0)",
            self.syy(),
            sy = self.sy(),
            n = self.n()
        )
    }

    /// Σ(x − x̄)(y − ȳ).
    fn mxy(&self) -> String {
        format!(
            "({} - {} * {} / {})",
            self.sxy(),
            self.sx(),
            self.sy(),
            self.n()
        )
    }

    /// The mean of `v` over the counted rows, clipped into its bounds.
    fn mean(&self, v: &str, b: &Bounds) -> String {
        format!(
            "GREATEST({}, LEAST({}, {} + {} / {}))",
            literal(b.lower),
            literal(b.upper),
            literal(Self::centre(b)),
            self.sum(&Self::centred(v, b)),
            self.n()
        )
    }

    /// The statistic as an expression over the released aggregates (before the cast).
    fn expression(&self, kind: Bivariate) -> String {
        let n = self.n();
        let some = format!("{n} >= 1");
        let h = Self::half_width(&self.x_bounds) * Self::half_width(&self.y_bounds);
        match kind {
            Bivariate::RegrCount => n,
            Bivariate::RegrAvgX => format!("CASE WHEN {some} THEN {} END", self.mean(&self.x, &self.x_bounds)),
            Bivariate::RegrAvgY => format!("CASE WHEN {some} THEN {} END", self.mean(&self.y, &self.y_bounds)),
            Bivariate::RegrSxx => format!("CASE WHEN {some} THEN {} END", self.mxx()),
            Bivariate::RegrSyy => format!("CASE WHEN {some} THEN {} END", self.myy()),
            Bivariate::RegrSxy => format!("CASE WHEN {some} THEN {} END", self.mxy()),
            Bivariate::CovarPop => format!(
                "CASE WHEN {some} THEN GREATEST({}, LEAST({}, {} / {n})) END",
                literal(-h),
                literal(h),
                self.mxy()
            ),
            Bivariate::CovarSamp => format!(
                "CASE WHEN {n} >= 2 THEN GREATEST({}, LEAST({}, {} / ({n} - 1))) END",
                literal(-2.0 * h),
                literal(2.0 * h),
                self.mxy()
            ),
            Bivariate::Corr => format!(
                "CASE WHEN {some} AND {mxx} > 0 AND {myy} > 0 THEN GREATEST(-1, LEAST(1, {mxy} / sqrt({mxx} * {myy}))) END",
                mxx = self.mxx(),
                myy = self.myy(),
                mxy = self.mxy()
            ),
            Bivariate::RegrSlope => format!(
                "CASE WHEN {some} AND {mxx} > 0 THEN {mxy} / {mxx} END",
                mxx = self.mxx(),
                mxy = self.mxy()
            ),
            Bivariate::RegrIntercept => format!(
                "CASE WHEN {some} AND {mxx} > 0 THEN {avgy} - {mxy} / {mxx} * {avgx} END",
                mxx = self.mxx(),
                mxy = self.mxy(),
                avgy = self.mean(&self.y, &self.y_bounds),
                avgx = self.mean(&self.x, &self.x_bounds)
            ),
            Bivariate::RegrR2 => format!(
                "CASE WHEN {some} AND {mxx} > 0 THEN CASE WHEN {myy} > 0 THEN LEAST(1, {mxy} * {mxy} / ({mxx} * {myy})) ELSE 1 END END",
                mxx = self.mxx(),
                myy = self.myy(),
                mxy = self.mxy()
            ),
        }
    }
}

/// `query` with each function call of its select list, HAVING and ORDER BY that `rewrite`
/// replaces (innermost first) replaced; a bare select item so replaced keeps PostgreSQL's
/// column name, the function's.
pub(super) fn rewrite_calls_with(
    query: &ast::Query,
    mut rewrite: impl FnMut(&ast::Function) -> Result<Option<Expr>>,
) -> Result<ast::Query> {
    let mut rewritten = query.clone();
    let mut failure = None;
    let mut expand = |e: &mut Expr| {
        let _ = ast::visit_expressions_mut(e, |x| {
            if failure.is_some() {
                return std::ops::ControlFlow::<()>::Break(());
            }
            if let Expr::Function(f) = x {
                match rewrite(f) {
                    Ok(Some(expanded)) => *x = expanded,
                    Ok(None) => {}
                    Err(err) => failure = Some(err),
                }
            }
            std::ops::ControlFlow::Continue(())
        });
    };
    if let SetExpr::Select(select) = rewritten.body.as_mut() {
        for item in select.projection.iter_mut() {
            match item {
                SelectItem::UnnamedExpr(e) => {
                    let name = match &*e {
                        Expr::Function(f) => function_name(&f.name).ok(),
                        _ => None,
                    };
                    let before = e.clone();
                    expand(e);
                    if let (Some(name), true) = (name, *e != before) {
                        *item = SelectItem::ExprWithAlias {
                            expr: e.clone(),
                            alias: Ident::new(name),
                        };
                    }
                }
                SelectItem::ExprWithAlias { expr, .. } => expand(expr),
                _ => {}
            }
        }
        if let Some(h) = select.having.as_mut() {
            expand(h);
        }
    }
    if let Some(order_by) = rewritten.order_by.as_mut() {
        if let ast::OrderByKind::Expressions(items) = &mut order_by.kind {
            for o in items {
                expand(&mut o.expr);
            }
        }
    }
    match failure {
        Some(err) => Err(err),
        None => Ok(rewritten),
    }
}

/// What [`Analyzer::rewrite_calls`] does with one function call: `Ok(None)` keeps it.
pub(super) type CallRewrite = fn(&mut Analyzer<'_>, &ast::Function) -> Result<Option<Expr>>;

impl Analyzer<'_> {
    /// `query` with every two-argument statistical aggregate in its select list, HAVING and
    /// ORDER BY replaced by its expression over bounded sums (see the module's invariants);
    /// the caller analyses the result as the analyst's statement.
    pub(super) fn bivariate_as_sums(&mut self, query: &ast::Query) -> Result<ast::Query> {
        self.rewrite_calls(query, |this, f| match call_of(f) {
            Some(kind) => this.bivariate_expression(f, kind).map(Some),
            None => Ok(None),
        })
    }

    /// `query` with each function call of its select list, HAVING and ORDER BY that `rewrite`
    /// replaces ([`rewrite_calls_with`]).
    pub(super) fn rewrite_calls(
        &mut self,
        query: &ast::Query,
        rewrite: CallRewrite,
    ) -> Result<ast::Query> {
        rewrite_calls_with(query, |f| rewrite(self, f))
    }

    /// One call as its expression over bounded sums, cast to PostgreSQL's result type.
    fn bivariate_expression(&mut self, f: &ast::Function, kind: Bivariate) -> Result<Expr> {
        let name = function_name(&f.name)?;
        if f.over.is_some() {
            return Err(window_refusal());
        }
        if !f.within_group.is_empty() || f.null_treatment.is_some() {
            return Err(Error::unsupported(
                format!("WITHIN GROUP / IGNORE NULLS on {name}"),
                format!("Call {name}(y, x) as a plain aggregate."),
            ));
        }
        let FunctionArguments::List(list) = &f.args else {
            return Err(Error::Syntax {
                message: format!("{name} needs two arguments"),
            });
        };
        if !list.clauses.is_empty() {
            return Err(Error::unsupported(
                "ORDER BY / LIMIT inside aggregates",
                AGGREGATE_ORDER_HINT,
            ));
        }
        if matches!(
            list.duplicate_treatment,
            Some(ast::DuplicateTreatment::Distinct)
        ) {
            return Err(Error::unsupported(
                format!("{name}(DISTINCT …)"),
                format!("Call {name}(y, x) over all rows, or aggregate per privacy unit in a subquery first."),
            ));
        }
        let arguments = crate::dp::sql::expression_arguments(f);
        let [y, x] = arguments.as_slice() else {
            return Err(Error::Syntax {
                message: format!("function {name} takes two arguments, {name}(y, x)"),
            });
        };
        let mut bounds_of = |e: &Expr| -> Result<Bounds> {
            let mut checked = e.clone();
            let info = self.expr(&mut checked, Role::Argument)?;
            if !info.ty.is_none_or(|t| t.is_numeric()) {
                return Err(Error::Syntax {
                    message: format!("function {name} needs numeric arguments"),
                });
            }
            let text = Canonical::of(&checked).to_string();
            self.checked_bounds(&info, &text, &e.to_string(), &name)
        };
        let y_bounds = bounds_of(y)?;
        let x_bounds = bounds_of(x)?;
        let (y, x) = (format!("({y})"), format!("({x})"));
        let mut rows = format!("{y} IS NOT NULL AND {x} IS NOT NULL");
        if let Some(condition) = &f.filter {
            rows.push_str(&format!(" AND ({condition})"));
        }
        let moments = Moments {
            y,
            x,
            y_bounds,
            x_bounds,
            rows,
        };
        let text = match kind {
            Bivariate::RegrCount => moments.expression(kind),
            _ => format!("CAST({} AS double precision)", moments.expression(kind)),
        };
        let dialect = sqlparser::dialect::PostgreSqlDialect {};
        sqlparser::parser::Parser::new(&dialect)
            .with_recursion_limit(limits::PARSER_DEPTH_MAX)
            .try_with_sql(&text)
            .and_then(|mut p| p.parse_expr())
            .map_err(|e| Error::internal(format!("{name} as sums did not parse: {e}")))
    }
}
