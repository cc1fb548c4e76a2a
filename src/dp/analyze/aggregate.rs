//! Aggregates (counts, sums, averages, variances, distinct counts, quantiles), per-unit
//! aggregates of subqueries grouped by the unit, bounds checks, and post-processing expressions.

use super::*;
use crate::output::{Aggregation, CellType};

impl<'a> Analyzer<'a> {
    /// An aggregate select item, or None if the expression is not an aggregate.
    pub(super) fn aggregate(&mut self, expr: &Expr) -> Result<Option<Aggregate>> {
        let e = match expr {
            Expr::Nested(inner) => inner.as_ref(),
            other => other,
        };
        let Expr::Function(f) = e else {
            if contains_aggregate(e) {
                return Err(Error::unsupported(
                    "expressions over aggregates in the select list",
                    "Select the aggregates themselves (e.g. SUM(x), COUNT(*)) and combine them in your client.",
                ));
            }
            return Ok(None);
        };
        let name = function_name(&f.name)?;
        let Some(kind) = aggregate_kind(&name) else {
            if contains_aggregate(e) {
                return Err(Error::unsupported(
                    "functions of aggregates in the select list",
                    "Select the aggregate itself and round or transform it in your client.",
                ));
            }
            return Ok(None);
        };
        if f.over.is_some() {
            return Err(window_refusal());
        }
        if kind == AggregateKind::Detected {
            return self.detected_aggregate(f).map(Some);
        }
        if let (Some(condition), false) =
            (&f.filter, matches!(kind, AggregateKind::Quantile { .. }))
        {
            return self.aggregate(&filter_as_case(f, condition)?);
        }
        if let AggregateKind::Quantile { .. } = kind {
            return self.quantile_aggregate(f, &name).map(Some);
        }
        if f.filter.is_some() || !f.within_group.is_empty() {
            return Err(Error::unsupported(
                "FILTER / WITHIN GROUP",
                "Move the condition into WHERE, or use CASE inside the aggregate.",
            ));
        }
        let FunctionArguments::List(list) = &f.args else {
            return Err(Error::Syntax {
                message: format!("{name} needs an argument"),
            });
        };
        if !list.clauses.is_empty() {
            return Err(Error::unsupported(
                "ORDER BY / LIMIT inside aggregates",
                AGGREGATE_ORDER_HINT,
            ));
        }
        let distinct = matches!(
            list.duplicate_treatment,
            Some(ast::DuplicateTreatment::Distinct)
        );
        let [arg] = list.args.as_slice() else {
            return Err(Error::Syntax {
                message: format!("{name} takes exactly one argument"),
            });
        };
        let arg_expr = match arg {
            FunctionArg::Unnamed(FunctionArgExpr::Wildcard) => {
                if kind != AggregateKind::CountRows || distinct {
                    return Err(Error::Syntax {
                        message: format!("{name}(*) is not valid"),
                    });
                }
                return Ok(Some(count_aggregate(
                    AggregateKind::CountRows,
                    None,
                    "count(*)".into(),
                )));
            }
            FunctionArg::Unnamed(FunctionArgExpr::Expr(e)) => e.clone(),
            _ => {
                return Err(Error::unsupported(
                    "named aggregate arguments",
                    "Pass the argument by position, e.g. SUM(cost).",
                ))
            }
        };
        self.aggregate_of(kind, &name, distinct, arg_expr).map(Some)
    }

    /// The aggregate `name` (of `kind`, DISTINCT or not) of one argument: its bounds, text and
    /// result type.
    fn aggregate_of(
        &mut self,
        kind: AggregateKind,
        name: &str,
        distinct: bool,
        mut arg_expr: Expr,
    ) -> Result<Aggregate> {
        if distinct && kind == AggregateKind::CountRows {
            if let Some(fields) = row_fields(&arg_expr) {
                return self.count_distinct_rows(fields);
            }
        }
        let written = arg_expr.to_string();
        let info = self.expr(&mut arg_expr, Role::Argument)?;
        let canonical_argument = Canonical::of(&arg_expr);
        let text = canonical_argument.to_string();
        if distinct {
            let unit = self.unit()?;
            let is_unit = matches!(&unit, Unit::Column(u) if u.to_string() == text)
                || self.is_unit_of_any_table(&text);
            if kind == AggregateKind::CountRows && is_unit {
                return Ok(count_aggregate(
                    AggregateKind::CountUnits,
                    None,
                    "count(distinct unit)".into(),
                ));
            }
            if kind == AggregateKind::CountRows {
                // Each unit's distinct values per group are capped at max_rows_per_unit.
                return Ok(count_aggregate(
                    AggregateKind::CountDistinct,
                    Some(canonical_argument.clone()),
                    format!("count(distinct {text})"),
                ));
            }
            return Err(Error::unsupported(
                format!("{name}(DISTINCT …)"),
                "Use COUNT(DISTINCT col), or aggregate per privacy unit in a subquery first.",
            ));
        }
        if kind == AggregateKind::CountRows {
            return Ok(count_aggregate(
                AggregateKind::CountValues,
                Some(canonical_argument.clone()),
                format!("count({text})"),
            ));
        }
        if !info.ty.is_none_or(|t| t.is_numeric()) {
            return Err(Error::Syntax {
                message: format!("function {name} needs a numeric argument"),
            });
        }
        let bounds = self.checked_bounds(&info, &text, &written, name)?;
        let family = if kind == AggregateKind::Sum {
            Aggregation::Sum
        } else {
            Aggregation::Moment
        };
        Ok(Aggregate {
            kind,
            argument: Some(canonical_argument.clone()),
            bounds: Some(bounds),
            // Only sums and averages choose an upper bound (a variance's noise grows with its
            // square, which the choice does not weigh).
            upper_ceiling: info.upper_ceiling.filter(|_| {
                bounds.lower >= 0.0 && matches!(kind, AggregateKind::Sum | AggregateKind::Avg)
            }),
            text: format!("{}({text})", kind.sql_name()),
            result: CellType::of_aggregate(family, argument_type(&info)),
            integral: kind == AggregateKind::Sum
                && matches!(
                    argument_type(&info),
                    Some(CellType::Int2 | CellType::Int4 | CellType::Int8)
                ),
        })
    }

    /// `COUNT(DISTINCT ROW(a, b))` or `COUNT(DISTINCT (a, b))`: the number of distinct tuples,
    /// a tuple with NULL fields included (a row value is never NULL itself, and its equality
    /// treats NULL fields as equal), as PostgreSQL counts them; released like any distinct count
    /// (each unit keeps at most `max_rows_per_unit` distinct tuples per group).
    fn count_distinct_rows(&mut self, mut fields: Vec<Expr>) -> Result<Aggregate> {
        if fields.len() > limits::GROUP_KEYS_PER_QUERY_MAX {
            return Err(Error::LimitExceeded {
                what: "the fields of a row counted with COUNT(DISTINCT …)".into(),
                limit: limits::GROUP_KEYS_PER_QUERY_MAX as u64,
            });
        }
        for field in &mut fields {
            self.expr(field, Role::Argument)?;
        }
        let row = row_constructor(fields);
        let canonical = Canonical::of(&row);
        let text = canonical.to_string();
        Ok(count_aggregate(
            AggregateKind::CountDistinct,
            Some(canonical),
            format!("count(distinct {text})"),
        ))
    }

    /// An aggregate of one unit's rows inside a subquery grouped by the privacy unit. Its bounds
    /// follow from the argument's (`±∞` where the data could make it grow without limit, e.g.
    /// `COUNT(*)`); the analyst states finite ones with LEAST / GREATEST / CASE.
    pub(super) fn unit_aggregate(&mut self, f: &mut ast::Function, name: &str) -> Result<Info> {
        let hint = "Use COUNT, SUM, AVG, MIN or MAX of the unit's rows inside a subquery grouped by the privacy unit.";
        if !matches!(name, "count" | "sum" | "avg" | "min" | "max") {
            return Err(Error::unsupported(format!("{name} per privacy unit"), hint));
        }
        let FunctionArguments::List(list) = &mut f.args else {
            return Err(Error::Syntax {
                message: format!("{name} needs an argument"),
            });
        };
        if !list.clauses.is_empty() {
            return Err(Error::unsupported(
                "ORDER BY / LIMIT inside aggregates",
                AGGREGATE_ORDER_HINT,
            ));
        }
        let distinct = match list.duplicate_treatment {
            None | Some(ast::DuplicateTreatment::All) => false,
            Some(ast::DuplicateTreatment::Distinct) if name == "count" => true,
            Some(ast::DuplicateTreatment::Distinct) => {
                return Err(Error::unsupported(
                    format!("{name}(DISTINCT …) per unit"),
                    hint,
                ))
            }
        };
        let _ = distinct;
        let [arg] = list.args.as_mut_slice() else {
            return Err(Error::Syntax {
                message: format!("{name} takes exactly one argument"),
            });
        };
        let arg_info = match arg {
            FunctionArg::Unnamed(FunctionArgExpr::Wildcard) if name == "count" => None,
            FunctionArg::Unnamed(FunctionArgExpr::Expr(e)) => Some(self.expr(e, Role::Argument)?),
            _ => return Err(Error::unsupported("this aggregate argument", hint)),
        };
        let inf = f64::INFINITY;
        let (ty, bounds) = match (name, &arg_info) {
            // Every group of a subquery grouped by the unit has a row, so `COUNT(*)` is at
            // least 1 (a domain holding 0 would release a group PostgreSQL never returns).
            // `COUNT(x)` and `COUNT(DISTINCT x)` are 0 for a unit whose every `x` is NULL,
            // unless `x` is a column the policy declares `exhaustive` (never NULL), read from
            // a table that is not on the nullable side of an outer join.
            ("count", None) => (ColumnType::Integer, (1.0, inf)),
            ("count", Some(i)) if never_null(i) => (ColumnType::Integer, (1.0, inf)),
            ("count", Some(_)) => (ColumnType::Integer, (0.0, inf)),
            (_, None) => {
                return Err(Error::Syntax {
                    message: format!("{name}(*) is not valid"),
                })
            }
            (_, Some(i)) => {
                if !i.ty.is_none_or(|t| t.is_numeric()) && name != "min" && name != "max" {
                    return Err(Error::Syntax {
                        message: format!("function {name} needs a numeric argument"),
                    });
                }
                let (lo, hi) = i.bounds.unwrap_or((-inf, inf));
                match name {
                    "sum" => {
                        let b = (
                            if lo >= 0.0 { 0.0 } else { -inf },
                            if hi <= 0.0 { 0.0 } else { inf },
                        );
                        let ty = if i.ty == Some(ColumnType::Integer) {
                            ColumnType::Integer
                        } else {
                            ColumnType::Numeric
                        };
                        (ty, b)
                    }
                    "avg" => (ColumnType::Numeric, (lo, hi)),
                    _ => (i.ty.unwrap_or(ColumnType::Numeric), (lo, hi)),
                }
            }
        };
        f.name = ObjectName::from(vec![Ident::new("pg_catalog"), Ident::new(name)]);
        Ok(Info {
            ty: Some(ty),
            bounds: Some(bounds),
            upper_ceiling: None,
            groupable: true,
            constant: false,
            public: PublicKeys::No,
            column: None,
            declared: None,
            uses_unit: false,
            integer: ty == ColumnType::Integer,
        })
    }

    /// A quantile aggregate: `MIN`, `MAX`, `MEDIAN(x)`, `PERCENTILE_CONT(p) / PERCENTILE_DISC(p)
    /// WITHIN GROUP (ORDER BY x)` of a bounded argument.
    pub(super) fn quantile_aggregate(
        &mut self,
        f: &ast::Function,
        name: &str,
    ) -> Result<Aggregate> {
        if f.filter.is_some() {
            return Err(Error::unsupported(
                "FILTER",
                "Move the condition into WHERE, or use CASE inside the aggregate.",
            ));
        }
        let FunctionArguments::List(list) = &f.args else {
            return Err(Error::Syntax {
                message: format!("{name} needs an argument"),
            });
        };
        if list.duplicate_treatment.is_some() || !list.clauses.is_empty() {
            return Err(Error::unsupported(
                format!("DISTINCT or ORDER BY inside {name}"),
                "A quantile's argument goes alone in the parentheses: MEDIAN(cost), MIN(age), or PERCENTILE_CONT(0.9) WITHIN GROUP (ORDER BY cost).",
            ));
        }
        let one_arg = || match list.args.as_slice() {
            [FunctionArg::Unnamed(FunctionArgExpr::Expr(e))] => Ok(e.clone()),
            _ => Err(Error::Syntax {
                message: format!("{name} takes exactly one argument"),
            }),
        };
        let (arg, permille) = match name {
            "min" | "max" | "median" => {
                if !f.within_group.is_empty() {
                    return Err(Error::Syntax {
                        message: format!("{name} does not take WITHIN GROUP"),
                    });
                }
                let permille = match name {
                    "min" => crate::dp::mechanism::MIN_PERMILLE,
                    "max" => crate::dp::mechanism::MAX_PERMILLE,
                    _ => 500,
                };
                (one_arg()?, permille)
            }
            _ => {
                let p = one_arg()?;
                let fraction = match &p {
                    Expr::Value(v) => match &v.value {
                        Value::Number(n, _) => n.parse::<f64>().ok(),
                        _ => None,
                    },
                    _ => None,
                }
                .filter(|x| (0.0..=1.0).contains(x))
                .ok_or_else(|| Error::InvalidParameter {
                    name: format!("the fraction of {name}"),
                    reason: "is not a literal between 0 and 1".into(),
                    hint: "Write e.g. PERCENTILE_CONT(0.9) WITHIN GROUP (ORDER BY cost).".into(),
                })?;
                let [ob] = f.within_group.as_slice() else {
                    return Err(Error::Syntax {
                        message: format!("{name} needs WITHIN GROUP (ORDER BY x)"),
                    });
                };
                let permille = (fraction * 1000.0).round() as u16;
                let permille = match &ob.options.sort {
                    Some(ast::OrderBySort::Desc) => 1000 - permille,
                    None | Some(ast::OrderBySort::Asc) => permille,
                    Some(ast::OrderBySort::Using(_)) => {
                        return Err(Error::unsupported("ORDER BY … USING", "Use ASC or DESC."))
                    }
                };
                (ob.expr.clone(), permille)
            }
        };
        let written = arg.to_string();
        let mut arg = arg;
        let info = self.expr(&mut arg, Role::Argument)?;
        let canonical_argument = Canonical::of(&arg);
        let text = canonical_argument.to_string();
        if !info.ty.is_none_or(|t| t.is_numeric()) {
            return Err(Error::unsupported(
                format!("{name} of a non-numeric value"),
                "DP quantiles are computed over numeric columns with declared bounds; for dates, aggregate EXTRACT(year FROM d) or similar.",
            ));
        }
        let bounds = self.checked_bounds(&info, &text, &written, name)?;
        let family = if matches!(name, "min" | "max" | "percentile_disc") {
            Aggregation::Discrete
        } else {
            Aggregation::Continuous
        };
        Ok(Aggregate {
            kind: AggregateKind::Quantile { permille },
            argument: Some(canonical_argument.clone()),
            bounds: Some(bounds),
            upper_ceiling: None,
            text: format!("quantile_{permille}({text})"),
            result: CellType::of_aggregate(family, argument_type(&info)),
            integral: false,
        })
    }

    /// The finite bounds of an aggregate argument, or a refusal that says how to get them;
    /// messages name a column as `shown` (qualified by the analyst's table name) and any other
    /// argument as the analyst wrote it (its analysed form may carry guards).
    pub(super) fn checked_bounds(
        &self,
        info: &Info,
        text: &str,
        written: &str,
        name: &str,
    ) -> Result<Bounds> {
        let written = if info.column.is_some() {
            self.shown(text)
        } else {
            crate::literal::for_display(written)
        };
        let finite = info.bounds.filter(|(l, u)| l.is_finite() && u.is_finite());
        let Some((lower, upper)) = finite else {
            let hint = match &info.column {
                Some(c) => match self.view_hints.get(c) {
                    Some(h) => h.clone(),
                    None => format!("Declare bounds for column {c} in the policy (lower and upper)."),
                },
                None => format!("Clamp the expression with stated bounds, e.g. {name}(LEAST(GREATEST({written}, 0), 100)), or use columns with declared bounds (lower/upper in the policy) and arithmetic of them with literals."),
            };
            return Err(Error::forbidden(
                format!("the bounds of {written} are not known, so {name} cannot be released"),
                hint,
            ));
        };
        if lower.abs().max(upper.abs()) > limits::COLUMN_BOUND_ABS_MAX {
            return Err(Error::forbidden(
                format!("the derived bounds of {} are too large", written),
                format!(
                    "Derived bounds must lie within ±{}.",
                    limits::COLUMN_BOUND_ABS_MAX
                ),
            ));
        }
        Ok(if lower == upper {
            Bounds {
                lower: lower - 0.5,
                upper: upper + 0.5,
            }
        } else {
            Bounds { lower, upper }
        })
    }

    pub(super) fn is_unit_of_any_table(&self, text: &str) -> bool {
        self.tables.iter().any(|(r, t, _)| {
            t.private()
                .and_then(|p| p.privacy_unit.as_deref())
                .is_some_and(|u| canonical(&r.alias, u).to_string() == text)
        })
    }

    /// A HAVING / ORDER BY expression over released values.
    pub(super) fn post(
        &mut self,
        e: &Expr,
        keys: &[GroupKey],
        aggregates: &mut Vec<Aggregate>,
        outputs: &[Output],
        allow_position: bool,
    ) -> Result<Post> {
        let by_output = |name: &str| {
            outputs
                .iter()
                .find(|o| o.name.eq_ignore_ascii_case(name))
                .and_then(|o| match o.source {
                    OutputSource::Key(i) => Some(Post::Key(i)),
                    OutputSource::Aggregate(i) => Some(Post::Aggregate(i)),
                    OutputSource::Computed(_) | OutputSource::Grouping(_) => None,
                })
        };
        match e {
            Expr::Nested(inner) => self.post(inner, keys, aggregates, outputs, allow_position),
            Expr::Value(v) => post_literal(v, outputs, allow_position),
            Expr::Identifier(id) if by_output(&id.value).is_some() => {
                by_output(&id.value).ok_or_else(|| Error::internal("output vanished"))
            }
            Expr::UnaryOp {
                op: UnaryOperator::Not,
                expr,
            } => Ok(Post::Not(Box::new(
                self.post(expr, keys, aggregates, outputs, false)?,
            ))),
            Expr::UnaryOp {
                op: UnaryOperator::Minus,
                expr,
            } => Ok(Post::Negate(Box::new(
                self.post(expr, keys, aggregates, outputs, false)?,
            ))),
            Expr::IsNull(inner) => Ok(Post::IsNull(
                Box::new(self.post(inner, keys, aggregates, outputs, false)?),
                true,
            )),
            Expr::IsNotNull(inner) => Ok(Post::IsNull(
                Box::new(self.post(inner, keys, aggregates, outputs, false)?),
                false,
            )),
            Expr::BinaryOp { left, op, right } => {
                let op = post_operator(op)?;
                let l = self.post(left, keys, aggregates, outputs, false)?;
                let r = self.post(right, keys, aggregates, outputs, false)?;
                Ok(Post::Binary(Box::new(l), op, Box::new(r)))
            }
            _ => {
                if let Some(agg) = self.aggregate(e)? {
                    // An aggregate not in the select list is released (and paid for) too.
                    let i = push_aggregate(aggregates, agg);
                    return Ok(Post::Aggregate(i));
                }
                let mut c = e.clone();
                self.expr(&mut c, Role::Key)?;
                let text = c.to_string();
                keys.iter().position(|k| k.expr == text).map(Post::Key).ok_or_else(|| {
                    Error::forbidden(
                        format!("{e} in HAVING / ORDER BY must be a group key, an output column or an aggregate"),
                        "HAVING and ORDER BY are applied by pgdp to the released (noisy) rows.",
                    )
                })
            }
        }
    }
}

/// A literal in HAVING / ORDER BY: a number (an output's position in ORDER BY), a string or
/// NULL.
fn post_literal(v: &ast::ValueWithSpan, outputs: &[Output], allow_position: bool) -> Result<Post> {
    match &v.value {
        Value::Number(n, _) => {
            if allow_position {
                let i: usize = n.parse().map_err(|_| Error::Syntax {
                    message: format!("invalid ORDER BY position {n}"),
                })?;
                let o = outputs
                    .get(i.wrapping_sub(1))
                    .ok_or_else(|| Error::Syntax {
                        message: format!("ORDER BY position {i} is not in select list"),
                    })?;
                return match o.source {
                    OutputSource::Key(k) => Ok(Post::Key(k)),
                    OutputSource::Aggregate(a) => Ok(Post::Aggregate(a)),
                    OutputSource::Computed(_) => {
                        Err(Error::internal("a computed output in pgdp's evaluator"))
                    }
                    // Sorted by PostgreSQL over the released rows instead.
                    OutputSource::Grouping(_) => Err(Error::unsupported(
                        "ORDER BY a GROUPING(…) column in pgdp's own evaluator",
                        "Sort by the GROUPING(…) expression itself, e.g. ORDER BY GROUPING(region), region.",
                    )),
                };
            }
            Ok(Post::Number(n.parse().map_err(|_| Error::Syntax {
                message: format!("invalid number {n}"),
            })?))
        }
        Value::SingleQuotedString(s) => Ok(Post::Text(s.clone())),
        Value::DollarQuotedString(d) => Ok(Post::Text(d.value.clone())),
        Value::Null => Ok(Post::Null),
        _ => Err(Error::unsupported(
            format!("the literal {v} in HAVING / ORDER BY"),
            "Use numbers, quoted strings or NULL, e.g. HAVING COUNT(*) > 100.",
        )),
    }
}

/// The operator of pgdp's evaluator for a binary operator of HAVING / ORDER BY.
fn post_operator(op: &BinaryOperator) -> Result<PostOp> {
    use BinaryOperator as B;
    Ok(match op {
        B::Eq => PostOp::Eq,
        B::NotEq => PostOp::NotEq,
        B::Lt => PostOp::Lt,
        B::LtEq => PostOp::LtEq,
        B::Gt => PostOp::Gt,
        B::GtEq => PostOp::GtEq,
        B::And => PostOp::And,
        B::Or => PostOp::Or,
        B::Plus => PostOp::Plus,
        B::Minus => PostOp::Minus,
        B::Multiply => PostOp::Multiply,
        B::Divide => PostOp::Divide,
        other => {
            return Err(Error::unsupported(
                format!("the operator {other} in HAVING / ORDER BY"),
                "Use + - * / with comparisons, AND, OR and NOT, e.g. HAVING SUM(cost) / COUNT(*) > 100, or wrap the query: SELECT * FROM (<query>) s WHERE …",
            ))
        }
    })
}

/// The PostgreSQL type of an aggregate's argument as far as analysis knows it: a column's
/// declared type, else `int4`, `numeric` or `float8` for integer, numeric and real expressions
/// (the common widths; the shadow catalog's description, when there is one, decides).
fn argument_type(info: &Info) -> Option<CellType> {
    if let Some(t) = info.declared.as_deref().and_then(CellType::of_declared) {
        return Some(t);
    }
    match info.ty? {
        ColumnType::Integer => Some(CellType::Int4),
        ColumnType::Numeric => Some(CellType::Numeric),
        ColumnType::Float => Some(CellType::Float8),
        _ => None,
    }
}

/// `agg(x) FILTER (WHERE c)` as `agg(CASE WHEN c THEN x END)`, and `COUNT(*) FILTER (WHERE c)`
/// as `COUNT(CASE WHEN c THEN 1 END)`, `DISTINCT` kept: the same value in PostgreSQL, since
/// FILTER only removes rows from the aggregate's input and these aggregates skip NULLs (an
/// empty input gives 0 for COUNT and NULL for the others either way). The CASE is then analysed
/// like any other aggregate argument. Not for quantiles (refused by their own path).
fn filter_as_case(f: &ast::Function, condition: &Expr) -> Result<Expr> {
    let FunctionArguments::List(list) = &f.args else {
        return Err(Error::Syntax {
            message: format!("{} needs an argument", f.name),
        });
    };
    let [arg] = list.args.as_slice() else {
        return Err(Error::Syntax {
            message: format!("{} takes exactly one argument", f.name),
        });
    };
    let value = match arg {
        FunctionArg::Unnamed(FunctionArgExpr::Wildcard) => "1".to_string(),
        FunctionArg::Unnamed(FunctionArgExpr::Expr(e)) => e.to_string(),
        _ => {
            return Err(Error::unsupported(
                "named aggregate arguments",
                "Pass the argument by position, e.g. SUM(cost).",
            ))
        }
    };
    if !list.clauses.is_empty() || !f.within_group.is_empty() || f.over.is_some() {
        return Err(Error::unsupported(
            "FILTER with ORDER BY, WITHIN GROUP or OVER",
            "Use CASE inside the aggregate.",
        ));
    }
    let distinct = match list.duplicate_treatment {
        Some(ast::DuplicateTreatment::Distinct) => "DISTINCT ",
        _ => "",
    };
    let text = format!(
        "{}({distinct}CASE WHEN {condition} THEN {value} END)",
        f.name
    );
    let dialect = sqlparser::dialect::PostgreSqlDialect {};
    sqlparser::parser::Parser::new(&dialect)
        .with_recursion_limit(limits::PARSER_DEPTH_MAX)
        .try_with_sql(&text)
        .and_then(|mut p| p.parse_expr())
        .map_err(|e| Error::Syntax {
            message: format!("aggregate FILTER: {e}"),
        })
}

/// The fields of a row value, `ROW(a, …)` (one field or more) or `(a, b, …)` (two or more).
fn row_fields(e: &Expr) -> Option<Vec<Expr>> {
    match e {
        Expr::Nested(inner) => row_fields(inner),
        Expr::Tuple(fields) if fields.len() >= 2 => Some(fields.clone()),
        Expr::Function(f)
            if f.name.0.len() == 1
                && f.name.to_string().eq_ignore_ascii_case("row")
                && f.filter.is_none()
                && f.over.is_none()
                && f.within_group.is_empty()
                && f.null_treatment.is_none() =>
        {
            let FunctionArguments::List(list) = &f.args else {
                return None;
            };
            if list.duplicate_treatment.is_some() || !list.clauses.is_empty() {
                return None;
            }
            let fields: Option<Vec<Expr>> = list
                .args
                .iter()
                .map(|a| match a {
                    FunctionArg::Unnamed(FunctionArgExpr::Expr(x)) => Some(x.clone()),
                    _ => None,
                })
                .collect();
            fields.filter(|f| !f.is_empty())
        }
        _ => None,
    }
}

/// Whether an aggregate argument is never NULL: a bare column of a table that is not on the
/// nullable side of an outer join, which the policy declares `exhaustive` (every row holds one
/// of its public values, and none is NULL).
/// `ROW(f1, …)`, the row value of `fields` (never NULL itself; equal to another when each
/// field is, NULL fields included, under DISTINCT).
pub(super) fn row_constructor(fields: Vec<Expr>) -> Expr {
    Expr::Function(ast::Function {
        name: ObjectName::from(vec![Ident::new("ROW")]),
        uses_odbc_syntax: false,
        parameters: FunctionArguments::None,
        args: FunctionArguments::List(ast::FunctionArgumentList {
            duplicate_treatment: None,
            args: fields
                .into_iter()
                .map(|f| FunctionArg::Unnamed(FunctionArgExpr::Expr(f)))
                .collect(),
            clauses: Vec::new(),
        }),
        filter: None,
        null_treatment: None,
        over: None,
        within_group: Vec::new(),
    })
}

fn never_null(info: &Info) -> bool {
    matches!(&info.public, PublicKeys::Listed { values, exhaustive: true } if !values.contains(&None))
}

/// A count (of rows, units, values or distinct values): a bigint, with no bounds of its own.
fn count_aggregate(kind: AggregateKind, argument: Option<Canonical>, text: String) -> Aggregate {
    Aggregate {
        kind,
        argument,
        bounds: None,
        upper_ceiling: None,
        text,
        result: CellType::Int8,
        integral: true,
    }
}
