//! Window functions partitioned by the privacy unit, in the select list of a row-level subquery
//! in FROM or CTE: per-unit features of each row such as its visit number
//! (`ROW_NUMBER() OVER (PARTITION BY person_id ORDER BY visit_date)`) or the days since the
//! unit's first visit (`visit_date - MIN(visit_date) OVER (PARTITION BY person_id)`).
//!
//! Invariants:
//! - A window is analysed only in the select list of a row-level view ([`Analyzer::view_body`]
//!   sets `windows_allowed`); everywhere else a window over a table's rows is refused, before any
//!   key is resolved.
//! - Its `PARTITION BY` holds the privacy unit of a table that is never NULL-extended (the view's
//!   unit, or the unit of an inner-joined private table): every partition is made of one unit's
//!   rows (the rows whose unit is NULL form one partition, the one pooled unit of stages 2–4), so
//!   the value a row gets depends on its own unit's rows only. Adding or removing a unit changes
//!   that unit's rows and nothing else, and the view stays a table of rows of one unit each:
//!   the outer query's contribution bounds and sensitivities are those of any row-level view.
//! - Nothing here can fail on the data: frame offsets and the arguments of `ntile`, `nth_value`,
//!   `lag` and `lead` are literals checked here (PostgreSQL fails on a non-positive `ntile` or
//!   `nth_value`, or a negative frame offset, only when a row reaches it); `SUM` / `AVG` of
//!   floating-point values (which fail on overflow) are refused; arguments go through the same
//!   analysis as any expression.
//! - Bounds follow from the function and its argument, never from the data: ranks lie in
//!   `[1, ∞)`, `COUNT` in `[0, ∞)`, `ntile(n)` in `[1, n]`, `percent_rank` and `cume_dist` in
//!   `[0, 1]`, `MIN`, `MAX`, `AVG` and the value functions in their argument's bounds (and the
//!   default's, for `lag` / `lead`). Unbounded values must be clamped before a DP aggregate reads
//!   them (`LEAST(ROW_NUMBER() OVER (…), 10)`), as for per-unit subqueries.

use super::*;

/// The hint of a refused window.
pub(super) const WINDOW_HINT: &str = "A window is allowed in the select list of a subquery in FROM or a CTE, partitioned by the privacy unit, e.g. WITH v AS (SELECT person_id, visit_date - MIN(visit_date) OVER (PARTITION BY person_id) AS days_since_first, ROW_NUMBER() OVER (PARTITION BY person_id ORDER BY visit_date) AS visit_no FROM demo.visits) SELECT visit_no, COUNT(*) FROM v WHERE visit_no <= 5 GROUP BY visit_no.";

/// The function of a window, as pgdp handles it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WindowFunction {
    /// `row_number`, `rank`, `dense_rank`: bigint in `[1, ∞)`.
    Rank,
    /// `percent_rank`, `cume_dist`: double precision in `[0, 1]`.
    Fraction,
    /// `ntile(n)`: integer in `[1, n]`.
    Ntile,
    /// `lag`, `lead (x [, offset [, default]])`: x's type and bounds, or the default's.
    Shift,
    /// `first_value`, `last_value`: x's type and bounds.
    Value,
    /// `nth_value(x, n)`: x's type and bounds.
    NthValue,
    /// `count(*)`, `count(x)`: bigint in `[0, ∞)`.
    Count,
    /// `min`, `max`: x's type and bounds.
    Extreme,
    /// `sum`: unbounded unless x's bounds have one sign.
    Sum,
    /// `avg`: numeric in x's bounds.
    Avg,
}

fn window_function(name: &str) -> Option<WindowFunction> {
    use WindowFunction as W;
    Some(match name {
        "row_number" | "rank" | "dense_rank" => W::Rank,
        "percent_rank" | "cume_dist" => W::Fraction,
        "ntile" => W::Ntile,
        "lag" | "lead" => W::Shift,
        "first_value" | "last_value" => W::Value,
        "nth_value" => W::NthValue,
        "count" => W::Count,
        "min" | "max" => W::Extreme,
        "sum" => W::Sum,
        "avg" => W::Avg,
        _ => return None,
    })
}

/// Whether pgdp answers `name` as a window function partitioned by the privacy unit (emitted
/// `pg_catalog`-qualified).
pub fn is_window_function(name: &str) -> bool {
    window_function(name).is_some()
}

/// A plain unsigned integer literal in `lower ..= upper`, or a refusal naming `what`.
fn literal_count(e: &Expr, what: &str, lower: u64, upper: u64) -> Result<u64> {
    let value = match e {
        Expr::Value(v) => match &v.value {
            Value::Number(n, _) => n.parse::<u64>().ok(),
            _ => None,
        },
        _ => None,
    };
    value.filter(|v| (lower..=upper).contains(v)).ok_or_else(|| {
        Error::unsupported(
            format!("{what} {e}"),
            format!("{what} must be an integer literal from {lower} to {upper} (a value PostgreSQL refuses fails only when a row reaches it)."),
        )
    })
}

/// The order of a frame bound: unbounded preceding, preceding, current row, following,
/// unbounded following.
fn bound_order(b: &ast::WindowFrameBound) -> u8 {
    match b {
        ast::WindowFrameBound::Preceding(None) => 0,
        ast::WindowFrameBound::Preceding(Some(_)) => 1,
        ast::WindowFrameBound::CurrentRow => 2,
        ast::WindowFrameBound::Following(Some(_)) => 3,
        ast::WindowFrameBound::Following(None) => 4,
    }
}

/// PostgreSQL's declared result type of `sum` / `avg` over a value of declared type `declared`.
fn aggregate_declared(function: WindowFunction, ty: ColumnType, declared: &str) -> String {
    use crate::output::CellType as T;
    let cell = T::of_declared(declared);
    let name = match (function, cell, ty) {
        (WindowFunction::Sum, Some(T::Int2 | T::Int4), _) => "bigint",
        (WindowFunction::Sum, Some(T::Int8), _) => "numeric",
        (WindowFunction::Sum, None, ColumnType::Integer) => "bigint",
        _ => "numeric",
    };
    name.to_string()
}

impl<'a> Analyzer<'a> {
    /// Whether `text` (canonical) is the privacy unit of a private table of FROM that is never
    /// NULL-extended.
    fn is_unit_of_inner_table(&self, text: &str) -> bool {
        self.tables.iter().any(|(r, t, _)| {
            !r.nullable
                && t.private()
                    .and_then(|p| p.privacy_unit.as_deref())
                    .is_some_and(|u| canonical(&r.alias, u).to_string() == text)
        })
    }

    /// A window function call in the select list of a row-level view (module docs).
    pub(super) fn unit_window(&mut self, f: &mut ast::Function, name: &str) -> Result<Info> {
        let function = window_function(name).ok_or_else(|| {
            Error::unsupported(
                format!("the window function {name}"),
                "pgdp allows row_number, rank, dense_rank, percent_rank, cume_dist, ntile, lag, lead, first_value, last_value, nth_value, and count, sum, avg, min, max over a window partitioned by the privacy unit.",
            )
        })?;
        if f.filter.is_some() || !f.within_group.is_empty() || f.null_treatment.is_some() {
            return Err(Error::unsupported(
                "FILTER, WITHIN GROUP or IGNORE NULLS in a window function",
                "Filter the rows in the subquery's WHERE, or use CASE inside the function.",
            ));
        }
        // Windows never nest (PostgreSQL refuses it), so the arguments are analysed without one.
        let allowed = std::mem::replace(&mut self.windows_allowed, false);
        let result = self.unit_window_call(f, name, function);
        self.windows_allowed = allowed;
        result
    }

    fn unit_window_call(
        &mut self,
        f: &mut ast::Function,
        name: &str,
        function: WindowFunction,
    ) -> Result<Info> {
        let Some(ast::WindowType::WindowSpec(spec)) = &mut f.over else {
            return Err(Error::unsupported(
                "named windows",
                "Write the window inline: OVER (PARTITION BY person_id ORDER BY …).",
            ));
        };
        if spec.window_name.is_some() {
            return Err(Error::unsupported(
                "named windows",
                "Write the window inline: OVER (PARTITION BY person_id ORDER BY …).",
            ));
        }
        self.window_spec(spec, name)?;
        let infos = self.window_arguments(f, name, function)?;
        let info = window_result(function, name, &infos)?;
        f.name = ObjectName::from(vec![Ident::new("pg_catalog"), Ident::new(name)]);
        Ok(info)
    }

    /// A window's PARTITION BY (the privacy unit of an inner-joined table), ORDER BY and frame.
    fn window_spec(&mut self, spec: &mut ast::WindowSpec, name: &str) -> Result<()> {
        let mut partitioned_by_unit = false;
        for p in &mut spec.partition_by {
            let info = self.expr(p, Role::Argument)?;
            let text = p.to_string();
            partitioned_by_unit |= info.uses_unit && self.is_unit_of_inner_table(&text);
        }
        if !partitioned_by_unit {
            return Err(Error::forbidden(
                format!("a window not partitioned by the privacy unit ({name} … OVER (…))"),
                "Each row's window value may depend on its own unit's rows only: write OVER (PARTITION BY person_id …) with the privacy unit of an inner-joined table.",
            ));
        }
        for o in &mut spec.order_by {
            if o.with_fill.is_some() || matches!(o.options.sort, Some(ast::OrderBySort::Using(_))) {
                return Err(Error::unsupported(
                    "ORDER BY … USING or WITH FILL in a window",
                    "Use ASC / DESC and NULLS FIRST / LAST.",
                ));
            }
            self.expr(&mut o.expr, Role::Argument)?;
        }
        check_frame(spec)
    }

    /// A window function's arguments: their number, and the literal ones within their limits.
    fn window_arguments(
        &mut self,
        f: &mut ast::Function,
        name: &str,
        function: WindowFunction,
    ) -> Result<Vec<Info>> {
        use WindowFunction as W;
        let (args, star) = match &mut f.args {
            FunctionArguments::None => (Vec::new(), false),
            FunctionArguments::Subquery(_) => {
                return Err(Error::unsupported(
                    "subqueries in a window function",
                    "Compute the value in a CTE first and apply the window to its column, e.g. WITH v AS (SELECT person_id, visit_date FROM demo.visits) SELECT … ROW_NUMBER() OVER (PARTITION BY person_id ORDER BY visit_date) … FROM v.",
                ))
            }
            FunctionArguments::List(list) => {
                if !list.clauses.is_empty()
                    || matches!(
                        list.duplicate_treatment,
                        Some(ast::DuplicateTreatment::Distinct)
                    )
                {
                    return Err(Error::unsupported(
                        "DISTINCT, ORDER BY or other clauses inside a window function",
                        "Order the window with OVER (PARTITION BY person_id ORDER BY …).",
                    ));
                }
                let mut exprs = Vec::new();
                let mut star = false;
                for a in &mut list.args {
                    match a {
                        FunctionArg::Unnamed(FunctionArgExpr::Expr(e)) => exprs.push(e),
                        FunctionArg::Unnamed(FunctionArgExpr::Wildcard) if function == W::Count => {
                            star = true
                        }
                        _ => {
                            return Err(Error::unsupported(
                                "named or wildcard arguments of a window function",
                                "Pass the window function's arguments by position, e.g. LAG(visit_date, 1) OVER (PARTITION BY person_id ORDER BY visit_date); COUNT(*) is the one wildcard.",
                            ))
                        }
                    }
                }
                (exprs, star)
            }
        };
        let arity_ok = match function {
            W::Rank | W::Fraction => args.is_empty() && !star,
            W::Ntile => args.len() == 1,
            W::Shift => (1..=3).contains(&args.len()),
            W::NthValue => args.len() == 2,
            W::Count => (star && args.is_empty()) || (!star && args.len() == 1),
            W::Value | W::Extreme | W::Sum | W::Avg => args.len() == 1,
        };
        if !arity_ok {
            return Err(Error::UnknownFunction {
                name: format!("{name} with {} argument(s)", args.len() + star as usize),
                hint: String::new(),
            });
        }
        let mut infos = Vec::with_capacity(args.len());
        for (i, e) in args.into_iter().enumerate() {
            let literal = matches!(
                (function, i),
                (W::Ntile, 0) | (W::Shift, 1) | (W::NthValue, 1)
            );
            if literal {
                let (what, lower, upper) = match function {
                    W::Ntile => ("the number of ntile buckets", 1, limits::NTILE_BUCKETS_MAX),
                    W::NthValue => (
                        "the position of nth_value",
                        1,
                        limits::WINDOW_FRAME_OFFSET_MAX,
                    ),
                    _ => (
                        "the offset of lag / lead",
                        0,
                        limits::WINDOW_FRAME_OFFSET_MAX,
                    ),
                };
                let n = literal_count(e, what, lower, upper)?;
                infos.push(Info::constant(Some(ColumnType::Integer), Some(n as f64)));
                continue;
            }
            let info = self.expr(e, Role::Argument)?;
            infos.push(info);
        }
        Ok(infos)
    }
}

/// A window frame PostgreSQL accepts, with offsets only on ROWS frames, each a literal within
/// its limit: PostgreSQL would refuse the others at plan time, after the charge.
fn check_frame(spec: &ast::WindowSpec) -> Result<()> {
    if let Some(frame) = &spec.window_frame {
        let end = frame
            .end_bound
            .clone()
            .unwrap_or(ast::WindowFrameBound::CurrentRow);
        for b in [&frame.start_bound, &end] {
            if let ast::WindowFrameBound::Preceding(Some(n))
            | ast::WindowFrameBound::Following(Some(n)) = b
            {
                if frame.units != ast::WindowFrameUnits::Rows {
                    return Err(Error::unsupported(
                        "RANGE or GROUPS frames with an offset",
                        "Use ROWS BETWEEN n PRECEDING AND m FOLLOWING, or UNBOUNDED / CURRENT ROW.",
                    ));
                }
                literal_count(n, "a frame offset", 0, limits::WINDOW_FRAME_OFFSET_MAX)?;
            }
        }
        // PostgreSQL refuses a frame that starts after it ends, starts at UNBOUNDED
        // FOLLOWING or ends at UNBOUNDED PRECEDING (at plan time, but after the charge).
        let (s, e) = (bound_order(&frame.start_bound), bound_order(&end));
        let groups_unordered =
            frame.units == ast::WindowFrameUnits::Groups && spec.order_by.is_empty();
        if s == 4 || e == 0 || s > e || groups_unordered {
            return Err(Error::Syntax {
                message: "this window frame is invalid: it must not start after it ends, start at UNBOUNDED FOLLOWING or end at UNBOUNDED PRECEDING, and GROUPS needs ORDER BY".into(),
            });
        }
    }

    Ok(())
}

/// The type, bounds and declared type of a window function's value.
fn window_result(function: WindowFunction, name: &str, infos: &[Info]) -> Result<Info> {
    use WindowFunction as W;
    let inf = f64::INFINITY;
    let x = infos.first().cloned();
    Ok(match (function, x) {
        (W::Rank, _) => ranked(ColumnType::Integer, "bigint", (1.0, inf)),
        (W::Fraction, _) => ranked(ColumnType::Float, "double precision", (0.0, 1.0)),
        (W::Ntile, Some(n)) => {
            let (_, upper) = n.bounds.unwrap_or((1.0, 1.0));
            ranked(ColumnType::Integer, "integer", (1.0, upper))
        }
        (W::Count, _) => ranked(ColumnType::Integer, "bigint", (0.0, inf)),
        (W::Shift | W::Value | W::NthValue | W::Extreme, Some(x)) => {
            let mut bounds = x.bounds;
            let mut declared = x.declared.clone();
            if function == W::Shift {
                if let Some(default) = infos.get(2) {
                    declared = shift_declared(name, &x, default)?;
                    bounds = match (bounds, default.bounds) {
                        (Some((l, u)), Some((dl, du))) => Some((l.min(dl), u.max(du))),
                        _ => None,
                    };
                }
            }
            Info {
                ty: x.ty,
                bounds,
                upper_ceiling: None,
                groupable: x.groupable && !x.uses_unit,
                constant: false,
                public: PublicKeys::No,
                column: None,
                declared,
                uses_unit: x.uses_unit,
                integer: x.integer,
            }
        }
        (W::Sum | W::Avg, Some(x)) => {
            if !x.ty.is_none_or(|t| t.is_numeric()) {
                return Err(Error::Syntax {
                    message: format!("function {name} needs a numeric argument"),
                });
            }
            if x.ty == Some(ColumnType::Float) {
                return Err(Error::unsupported(
                    format!("{name} of floating-point values over a window"),
                    "Cast the value to numeric (CAST(x AS numeric)): floating-point sums fail on overflow, which would depend on the data.",
                ));
            }
            let ty = x.ty.unwrap_or(ColumnType::Numeric);
            let declared_x = x.declared.clone().unwrap_or_else(|| ty.name().to_string());
            let (lo, hi) = x.bounds.unwrap_or((-inf, inf));
            let (ty, bounds) = if function == W::Sum {
                let b = (
                    if lo >= 0.0 { 0.0 } else { -inf },
                    if hi <= 0.0 { 0.0 } else { inf },
                );
                (ty, b)
            } else {
                (ColumnType::Numeric, (lo, hi))
            };
            let declared = aggregate_declared(function, ty, &declared_x);
            let ty = if declared == "bigint" {
                ColumnType::Integer
            } else {
                ColumnType::Numeric
            };
            Info {
                ty: Some(ty),
                bounds: Some(bounds),
                upper_ceiling: None,
                groupable: x.groupable && !x.uses_unit,
                constant: false,
                public: PublicKeys::No,
                column: None,
                declared: Some(declared),
                uses_unit: false,
                integer: ty == ColumnType::Integer,
            }
        }
        _ => return Err(Error::internal("a window function without its argument")),
    })
}

/// The description of a rank-like window value.
fn ranked(ty: ColumnType, declared: &str, bounds: (f64, f64)) -> Info {
    Info {
        ty: Some(ty),
        bounds: Some(bounds),
        upper_ceiling: None,
        groupable: true,
        constant: false,
        public: PublicKeys::No,
        column: None,
        declared: Some(declared.to_string()),
        uses_unit: false,
        integer: ty == ColumnType::Integer,
    }
}

/// The declared result type of `lag` / `lead (x, offset, default)`: PostgreSQL resolves x and the
/// default to a common type. pgdp answers when that type is x's own, or an integer type widened
/// by an integer literal (a smallint with `0` is an integer, an integer with a literal beyond
/// int4 a bigint); a default of a wider category (a numeric default for an integer x) is refused.
fn shift_declared(name: &str, x: &Info, default: &Info) -> Result<Option<String>> {
    use crate::output::CellType as T;
    let rank = |t: ColumnType| match t {
        ColumnType::Integer => Some(0),
        ColumnType::Numeric => Some(1),
        ColumnType::Float => Some(2),
        _ => None,
    };
    let (Some(xt), Some(dt)) = (x.ty, default.ty) else {
        // An untyped literal (a string or NULL) takes x's type.
        return Ok(x.declared.clone());
    };
    let widening = match (rank(xt), rank(dt)) {
        (Some(a), Some(b)) => b > a,
        _ => xt != dt,
    };
    if widening {
        return Err(Error::unsupported(
            format!("a default of another type than the value in {name}"),
            "Give lag / lead a default of the value's own type, e.g. lag(cost, 1, 0.0) for a numeric cost, lag(n, 1, 0) for an integer n.",
        ));
    }
    if xt != ColumnType::Integer || dt != ColumnType::Integer {
        return Ok(x.declared.clone());
    }
    let x_cell = x.declared.as_deref().and_then(T::of_declared);
    let default_cell = match (&default.declared, default.bounds) {
        (Some(d), _) => T::of_declared(d),
        (None, Some((l, u))) if l >= i32::MIN as f64 && u <= i32::MAX as f64 => Some(T::Int4),
        _ => Some(T::Int8),
    };
    let width = |c: Option<T>| match c {
        Some(T::Int2) => 2,
        Some(T::Int4) | None => 4,
        _ => 8,
    };
    let declared = match width(x_cell).max(width(default_cell)) {
        2 => "smallint",
        4 => "integer",
        _ => "bigint",
    };
    Ok(Some(declared.to_string()))
}
