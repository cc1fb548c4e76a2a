//! Expressions: every construct on the whitelist, its type, bounds and public domain.

use super::*;

impl<'a> Analyzer<'a> {
    /// Validates an expression in place (canonicalising column references) and describes it.
    pub(super) fn expr(&mut self, e: &mut Expr, role: Role) -> Result<Info> {
        if let Some((idx, col)) = self.column_ref(e)? {
            let info = self.column_info(idx, &col, role)?;
            *e = canonical(&self.tables[idx].0.alias, &col);
            return Ok(info);
        }
        match e {
            Expr::Value(v) => self.literal(v, role),
            Expr::TypedString(ts) => typed_literal(ts),
            Expr::Nested(inner) => self.expr(inner, role),
            Expr::UnaryOp { op, expr } => self.unary(op, expr, role),
            Expr::BinaryOp { left, op, right } => {
                let op = op.clone();
                let (info, replaced) = self.binary(left, op, right, role)?;
                if let Some(replaced) = replaced {
                    *e = replaced;
                }
                Ok(info)
            }
            Expr::IsNull(inner) | Expr::IsNotNull(inner) | Expr::IsTrue(inner) | Expr::IsFalse(inner) | Expr::IsNotTrue(inner) | Expr::IsNotFalse(inner) => {
                let i = self.expr(inner, role)?;
                Ok(Info::derived(Some(ColumnType::Boolean), &[&i], None))
            }
            Expr::InList { expr, list, .. } => self.in_list(expr, list, role),
            // `x = ANY (ARRAY[a, b])` is `x IN (a, b)` and `x <> ALL (ARRAY[a, b])` is
            // `x NOT IN (a, b)`, NULLs included (SQL defines IN so); psycopg 2 writes a Python
            // list so. Other arrays (a column, a parameter) stay refused.
            Expr::AnyOp { left, compare_op: BinaryOperator::Eq, right, .. }
            | Expr::AllOp { left, compare_op: BinaryOperator::NotEq, right }
                if array_elements(right).is_some_and(|elements| !elements.is_empty()) =>
            {
                let mut list = Expr::InList {
                    expr: left.clone(),
                    list: array_elements(right).unwrap_or_default(),
                    negated: matches!(e, Expr::AllOp { .. }),
                };
                let info = self.expr(&mut list, role)?;
                *e = list;
                Ok(info)
            }
            Expr::Between { expr, low, high, .. } => {
                let i = self.expr(expr, role)?;
                let lo = self.expr(low, role)?;
                let hi = self.expr(high, role)?;
                self.infer_parameter(low, &i);
                self.infer_parameter(high, &i);
                check_literal_of_type(low, i.ty)?;
                check_literal_of_type(high, i.ty)?;
                Ok(Info::derived(Some(ColumnType::Boolean), &[&i, &lo, &hi], None))
            }
            Expr::Like { expr, pattern, escape_char, any, .. } | Expr::ILike { expr, pattern, escape_char, any, .. } => {
                if *any || escape_char.is_some() {
                    return Err(unsupported_here("LIKE ANY / ESCAPE"));
                }
                self.like(expr, pattern, role)
            }
            Expr::Case { operand, conditions, else_result, .. } => self.case(operand, conditions, else_result, role),
            Expr::Cast { expr, data_type, format, .. } => {
                if format.is_some() {
                    return Err(unsupported_here("CAST … FORMAT"));
                }
                self.cast(expr, data_type, role)
            }
            Expr::Extract { field, expr, .. } => self.extract(field, expr, role),
            Expr::AtTimeZone { timestamp, time_zone } => {
                self.at_time_zone(timestamp, time_zone, role)
            }
            Expr::Function(f) => self.function(f, role),
            // sqlparser reads FLOOR(x) and CEIL(x) as special syntax (for `CEIL(x TO DAY)`);
            // the plain one-argument forms are the total functions and go through the same
            // checks as any other function call. `FLOOR(x, n)` and `… TO field` are not
            // PostgreSQL and stay refused.
            Expr::Floor { expr, field } | Expr::Ceil { expr, field }
                if *field
                    == ast::CeilFloorKind::DateTimeField(ast::DateTimeField::NoDateTime) =>
            {
                let argument = expr.as_ref().clone();
                let name = if matches!(e, Expr::Floor { .. }) {
                    "floor"
                } else {
                    "ceil"
                };
                let mut call = function_call(name, vec![argument]);
                let info = self.function(&mut call, role)?;
                *e = Expr::Function(call);
                Ok(info)
            }
            Expr::Floor { .. } | Expr::Ceil { .. } => Err(Error::unsupported(
                "FLOOR / CEIL with a scale or a TO field",
                "Use floor(x) or ceil(x) with one argument, round(x, n) for decimal places, or date_trunc for dates.",
            )),
            Expr::Subquery(_) | Expr::Exists { .. } | Expr::InSubquery { .. } => Err(Error::unsupported(
                "subqueries in expressions",
                "A scalar subquery that reads only its own tables, one aggregate without GROUP BY such as (SELECT AVG(cost) FROM demo.visits), is released first, charged on its own, and its noisy value used as a constant; one that reads the outer query's columns (correlated) is not supported. A semijoin on the privacy unit is answered as a condition of the query's WHERE on its own (ANDed with the others): person_id IN (SELECT person_id FROM demo.visits WHERE …) or [NOT] EXISTS (SELECT 1 FROM demo.visits v WHERE v.person_id = p.person_id AND …). Other subqueries over private data are not supported; use a join on the privacy unit or a public table.",
            )),
            other => Err(unsupported_here(&format!("the expression {other}"))),
        }
    }

    /// A column of the FROM list: its type, declared bounds, public domain and whether it is
    /// the privacy unit.
    fn column_info(&self, idx: usize, col: &str, role: Role) -> Result<Info> {
        let (r, table, _) = &self.tables[idx];
        let column = table.column(col).ok_or_else(|| Error::UnknownColumn {
            name: col.to_string(),
        })?;
        let unit = table.private().and_then(|p| p.privacy_unit.as_deref()) == Some(col);
        if role == Role::UnitAggregate && !unit {
            return Err(Error::unsupported(
                format!("the column {col} outside an aggregate in a subquery grouped by the privacy unit"),
                "Aggregate it per unit (e.g. MAX(age), LEAST(COUNT(*), 20)), or join the table in the outer query on the privacy unit.",
            ));
        }
        let public = if r.nullable {
            // NULL where a LEFT JOIN found no match: not among the declared values.
            PublicKeys::No
        } else if let Some(values) = &column.public_values {
            PublicKeys::Listed {
                values: values.iter().cloned().map(Some).collect(),
                exhaustive: column.exhaustive,
            }
        } else if !r.private {
            PublicKeys::Table {
                table: r.table.clone(),
                alias: r.alias.clone(),
                column: col.to_string(),
            }
        } else {
            PublicKeys::No
        };
        Ok(Info {
            ty: Some(column.ty),
            // A timestamp's bounds are epoch seconds and serve only its quantiles
            // (`dates.rs` reads them from the column): no expression inherits them, so none
            // mixes them with a date's day numbers or a number's bounds.
            bounds: column
                .bounds
                .filter(|_| column.ty != ColumnType::Timestamp)
                .map(|b| (b.lower, b.upper)),
            upper_ceiling: column.upper_ceiling,
            groupable: (column.groupable || !r.private) && !unit,
            constant: false,
            public,
            column: Some(format!("{}.{}", r.table, col)),
            declared: Some(column.declared_type.clone()),
            uses_unit: unit,
            integer: column.ty == ColumnType::Integer,
        })
    }

    /// A literal or a parameter (`$n`, in WHERE only).
    fn literal(&mut self, v: &ast::ValueWithSpan, role: Role) -> Result<Info> {
        let (ty, value) = match &v.value {
            Value::Number(n, _) => {
                let f: f64 = n.parse().map_err(|_| Error::Syntax {
                    message: format!("invalid number {n}"),
                })?;
                // Huge literals make numeric arithmetic overflow on some rows and not
                // others (an error that depends on the data).
                if !f.is_finite() || f.abs() > limits::COLUMN_BOUND_ABS_MAX {
                    return Err(Error::forbidden(
                        format!("the literal {n} is too large"),
                        format!(
                            "Numeric literals must lie within ±{}.",
                            limits::COLUMN_BOUND_ABS_MAX
                        ),
                    ));
                }
                let ty = if n.contains(['.', 'e', 'E']) {
                    ColumnType::Numeric
                } else {
                    ColumnType::Integer
                };
                (Some(ty), Some(f))
            }
            Value::SingleQuotedString(_)
            | Value::EscapedStringLiteral(_)
            | Value::NationalStringLiteral(_)
            | Value::DollarQuotedString(_) => (None, None),
            Value::Boolean(_) => (Some(ColumnType::Boolean), None),
            Value::Null => (None, None),
            Value::Placeholder(p) => {
                if role != Role::Filter {
                    return Err(Error::unsupported(
                        "parameters outside WHERE",
                        "Parameters ($1, …) may stand for literals in WHERE only.",
                    ));
                }
                let index: usize = p
                    .strip_prefix('$')
                    .and_then(|n| n.parse().ok())
                    .filter(|n| *n >= 1 && *n <= limits::PARAMETERS_PER_STATEMENT_MAX)
                    .ok_or_else(|| Error::unsupported("this parameter syntax", "Use $1, $2, …"))?;
                self.parameters
                    .entry(index)
                    .or_insert((ColumnType::Text, None));
                return Ok(Info::constant(None, None));
            }
            _ => return Err(unsupported_here(&format!("the literal {v}"))),
        };
        Ok(Info::constant(ty, value))
    }

    /// `NOT x`, `-x`, `+x`.
    fn unary(&mut self, op: &UnaryOperator, expr: &mut Box<Expr>, role: Role) -> Result<Info> {
        let info = self.expr(expr, role)?;
        // `- -1` must not print as `--1`, which starts a comment.
        if expr.to_string().starts_with(['-', '+']) {
            **expr = Expr::Nested(expr.clone());
        }
        match op {
            UnaryOperator::Not => Ok(Info::derived(Some(ColumnType::Boolean), &[&info], None)),
            UnaryOperator::Minus => {
                if !info.ty.is_none_or(|t| t.is_numeric()) {
                    return Err(unsupported_here("unary minus on non-numeric values"));
                }
                // -(-2147483648) overflows an integer: negate columns in numeric
                // (literals stay as written, e.g. round(x, -1)).
                if !info.constant {
                    **expr = as_numeric(expr.as_ref().clone(), &info);
                }
                let b = info.bounds.map(|(l, u)| (-u, -l));
                let ty = info.ty.map(|t| {
                    if t == ColumnType::Integer {
                        ColumnType::Numeric
                    } else {
                        t
                    }
                });
                Ok(Info {
                    integer: info.integer,
                    ..Info::derived(ty, &[&info], b)
                })
            }
            UnaryOperator::Plus => Ok(info),
            _ => Err(unsupported_here(&format!("the operator {op}"))),
        }
    }

    /// A binary operator, and the expression that replaces the whole operation where pgdp
    /// rewrites it (a guarded date difference, an integer division).
    fn binary(
        &mut self,
        left: &mut Box<Expr>,
        op: BinaryOperator,
        right: &mut Box<Expr>,
        role: Role,
    ) -> Result<(Info, Option<Expr>)> {
        let l = self.expr(left, role)?;
        let r = self.expr(right, role)?;
        self.infer_parameter(left, &r);
        self.infer_parameter(right, &l);
        use BinaryOperator as B;
        match op {
            B::And | B::Or => Ok((
                Info::derived(Some(ColumnType::Boolean), &[&l, &r], None),
                None,
            )),
            B::Eq | B::NotEq | B::Lt | B::LtEq | B::Gt | B::GtEq => {
                check_comparable(&l, &r)?;
                // 'YYYY-MM-DD' compared with a date is read as a date by the upstream:
                // a malformed one would fail there, after the charge.
                check_literal_of_type(left, r.ty)?;
                check_literal_of_type(right, l.ty)?;
                Ok((
                    Info::derived(Some(ColumnType::Boolean), &[&l, &r], None),
                    None,
                ))
            }
            B::Minus if l.ty == Some(ColumnType::Date) && r.ty == Some(ColumnType::Date) => {
                // date - date: the days between them, an integer (see the guard).
                check_literal_of_type(left, r.ty)?;
                check_literal_of_type(right, l.ty)?;
                let guarded = date_difference_guard(left.as_ref().clone(), right.as_ref().clone());
                let declared = Some("integer".to_string());
                // Day numbers (bounds of dates) subtract like numbers.
                let bounds = match (l.bounds, r.bounds) {
                    (Some((a, b)), Some((c, d))) => Some((a - d, b - c)),
                    _ => None,
                };
                let info = Info {
                    declared,
                    ..Info::derived(Some(ColumnType::Integer), &[&l, &r], bounds)
                };
                Ok((info, Some(Expr::Nested(Box::new(guarded)))))
            }
            B::Plus | B::Minus | B::Multiply => {
                let numeric = |i: &Info| i.ty.is_none_or(|t| t.is_numeric());
                if !(numeric(&l) && numeric(&r)) {
                    if matches!(op, B::Plus | B::Minus)
                        && (l.ty == Some(ColumnType::Date) || r.ty == Some(ColumnType::Date))
                    {
                        return Err(unsupported_here("date arithmetic"));
                    }
                    return Err(unsupported_here(&format!(
                        "the operator {op} on non-numeric values"
                    )));
                }
                let finite =
                    |b: Option<(f64, f64)>| b.filter(|(x, y)| x.is_finite() && y.is_finite());
                let bounds = match (finite(l.bounds), finite(r.bounds)) {
                    (Some((a, b)), Some((c, d))) => Some(match op {
                        B::Plus => (a + c, b + d),
                        B::Minus => (a - d, b - c),
                        _ => {
                            let p = [a * c, a * d, b * c, b * d];
                            (
                                p.iter().cloned().fold(f64::INFINITY, f64::min),
                                p.iter().cloned().fold(f64::NEG_INFINITY, f64::max),
                            )
                        }
                    }),
                    _ => None,
                };
                // Integer arithmetic can overflow (a data-dependent error): compute in numeric.
                **left = as_numeric(left.as_ref().clone(), &l);
                **right = as_numeric(right.as_ref().clone(), &r);
                let integer = l.integer && r.integer;
                Ok((
                    Info {
                        integer,
                        ..Info::derived(Some(ColumnType::Numeric), &[&l, &r], bounds)
                    },
                    None,
                ))
            }
            B::Divide => Ok(divide(left, right, &l, &r)),
            B::StringConcat => Ok((Info::derived(Some(ColumnType::Text), &[&l, &r], None), None)),
            other => Err(unsupported_here(&format!("the operator {other}"))),
        }
    }

    /// `x IN (literal, …)`.
    fn in_list(&mut self, expr: &mut Expr, list: &mut [Expr], role: Role) -> Result<Info> {
        let i = self.expr(expr, role)?;
        if list.len() > limits::IN_LIST_VALUES_MAX {
            return Err(Error::LimitExceeded {
                what: "the length of an IN list".into(),
                limit: limits::IN_LIST_VALUES_MAX as u64,
            });
        }
        let mut parts = vec![i.clone()];
        for item in list.iter_mut() {
            let li = self.expr(item, role)?;
            if !li.constant {
                return Err(unsupported_here("IN lists of non-literals"));
            }
            self.infer_parameter(item, &i);
            check_literal_of_type(item, i.ty)?;
            parts.push(li);
        }
        let refs: Vec<&Info> = parts.iter().collect();
        Ok(Info::derived(Some(ColumnType::Boolean), &refs, None))
    }

    /// `x [I]LIKE 'pattern'` (no ANY, no ESCAPE: checked by the caller).
    fn like(&mut self, expr: &mut Expr, pattern: &mut Expr, role: Role) -> Result<Info> {
        let i = self.expr(expr, role)?;
        let p = self.expr(pattern, role)?;
        if !p.constant {
            // A pattern read from the data can be malformed (an error that depends on it).
            return Err(unsupported_here("LIKE with a non-literal pattern"));
        }
        // The pattern must be one string literal; an odd number of trailing backslashes
        // is an error in PostgreSQL, so it is refused here, before any charge.
        let text = match pattern {
            Expr::Value(v) => crate::literal::string_value(&v.value).map(str::to_string),
            _ => None,
        };
        let Some(text) = text else {
            return Err(unsupported_here(
                "LIKE with a pattern that is not a single string literal",
            ));
        };
        let trailing = text.chars().rev().take_while(|c| *c == '\\').count();
        if trailing % 2 == 1 {
            return Err(Error::Syntax {
                message: "LIKE pattern must not end with escape character".into(),
            });
        }
        Ok(Info::derived(Some(ColumnType::Boolean), &[&i, &p], None))
    }

    /// `CASE [operand] WHEN … THEN … [ELSE …] END`: bounds from its results, and a public,
    /// exhaustive domain when every result is a literal.
    fn case(
        &mut self,
        operand: &mut Option<Box<Expr>>,
        conditions: &mut [ast::CaseWhen],
        else_result: &mut Option<Box<Expr>>,
        role: Role,
    ) -> Result<Info> {
        let mut parts = Vec::new();
        if let Some(op) = operand {
            parts.push(self.expr(op, role)?);
        }
        let mut bounds: Option<(f64, f64)> = None;
        let mut all_bounded = true;
        let mut ty = None;
        let merge = |b: Option<(f64, f64)>, bounds: &mut Option<(f64, f64)>, all: &mut bool| match b
        {
            Some((l, u)) => *bounds = Some(bounds.map_or((l, u), |(a, c)| (a.min(l), c.max(u)))),
            None => *all = false,
        };
        for cw in conditions.iter_mut() {
            parts.push(self.expr(&mut cw.condition, role)?);
            let r = self.expr(&mut cw.result, role)?;
            merge(r.bounds, &mut bounds, &mut all_bounded);
            ty = ty.or(r.ty);
            parts.push(r);
        }
        if let Some(er) = else_result {
            let r = self.expr(er, role)?;
            if matches!(er.as_ref(), Expr::Value(v) if v.value == Value::Null) {
                // ELSE NULL contributes nothing to sums.
            } else {
                merge(r.bounds, &mut bounds, &mut all_bounded);
            }
            ty = ty.or(r.ty);
            parts.push(r);
        }
        let refs: Vec<&Info> = parts.iter().collect();
        let mut info = Info::derived(ty, &refs, if all_bounded { bounds } else { None });
        // Results that are all literals form a public domain: the group keys are the
        // THEN / ELSE values whatever the data, and NULL when a row can match no
        // branch (no ELSE) or a result is NULL, as PostgreSQL groups it.
        let mut results: Vec<&Expr> = conditions.iter().map(|cw| &cw.result).collect();
        if let Some(er) = else_result.as_deref() {
            results.push(er);
        }
        if let Some(mut domain) = literal_domain(&results)? {
            if else_result.is_none() && !domain.contains(&None) {
                domain.push(None);
            }
            // Every row gets one of the results: the domain is exhaustive.
            info.public = PublicKeys::Listed {
                values: domain,
                exhaustive: true,
            };
            // Public domain: as safe as one filtered query per literal, except that a
            // CASE on the privacy unit stays refused as a key (policy intent).
            info.groupable = !info.uses_unit;
        }
        Ok(info)
    }

    /// `CAST(x AS type)` and `x::type` (no FORMAT: checked by the caller): only casts that
    /// cannot fail on any value.
    fn cast(
        &mut self,
        expr: &mut Box<Expr>,
        data_type: &ast::DataType,
        role: Role,
    ) -> Result<Info> {
        let i = self.expr(expr, role)?;
        let target = type_of_data_type(data_type)
            .ok_or_else(|| unsupported_here(&format!("casts to {data_type}")))?;
        check_literal_of_type(expr, Some(target))?;
        // Casts of literals are constant (they fail or not regardless of the data);
        // casts of columns must be total.
        // Only casts that cannot fail: to text, and to the widest type of a family
        // (bigint, unconstrained numeric, double precision); never narrowing.
        use ast::DataType as D;
        let widest = match data_type {
            D::BigInt(_) | D::Int8(_) => Some(ColumnType::Integer),
            D::Numeric(ast::ExactNumberInfo::None) | D::Decimal(ast::ExactNumberInfo::None) => {
                Some(ColumnType::Numeric)
            }
            D::Float8 | D::DoublePrecision | D::Double(_) => Some(ColumnType::Float),
            // FLOAT and FLOAT(25) … FLOAT(53) are double precision (SQLAlchemy's Float).
            D::Float(ast::ExactNumberInfo::None) => Some(ColumnType::Float),
            D::Float(ast::ExactNumberInfo::Precision(p)) if (25..=53).contains(p) => {
                Some(ColumnType::Float)
            }
            D::Date => Some(ColumnType::Date),
            D::Boolean | D::Bool => Some(ColumnType::Boolean),
            _ => None,
        };
        // A timestamp (or timestamptz, e.g. from date_trunc) to date cannot fail either:
        // every timestamp, ±infinity included, has a date. Numbers to narrower integers
        // are not total even within bounds: numeric NaN and ±Infinity (EXTRACT of an
        // infinite date) fail to convert.
        // A date to `timestamp` (without time zone) fails only after 294276 AD, which
        // the guard sends to 'infinity' (PostgreSQL's value beyond every bound), so the
        // cast is total and exact everywhere PostgreSQL answers.
        let date_to_timestamp = !i.constant
            && i.ty == Some(ColumnType::Date)
            && matches!(
                data_type,
                D::Timestamp(
                    None,
                    ast::TimezoneInfo::None | ast::TimezoneInfo::WithoutTimeZone
                )
            );
        if date_to_timestamp {
            **expr = date_to_timestamp_guard(expr.as_ref().clone());
        }
        let total = i.constant
            || date_to_timestamp
            || target == ColumnType::Text
            || (i.ty == Some(target) && widest == Some(target))
            || (i.ty == Some(ColumnType::Integer)
                && matches!(widest, Some(ColumnType::Numeric | ColumnType::Float)))
            // Every integer has a nearest real (float4 reaches 3.4e38).
            || (i.ty == Some(ColumnType::Integer) && single_precision(data_type))
            || (i.ty == Some(ColumnType::Timestamp) && widest == Some(ColumnType::Date));
        if !total {
            return Err(cast_can_fail(expr, &i, data_type));
        }
        let bounds = if target.is_numeric() { i.bounds } else { None };
        Ok(Info {
            ty: Some(target),
            bounds,
            upper_ceiling: None,
            groupable: i.groupable,
            constant: i.constant,
            public: PublicKeys::No,
            column: None,
            declared: None,
            uses_unit: i.uses_unit,
            integer: target == ColumnType::Integer,
        })
    }

    /// `EXTRACT(field FROM date or timestamp)`, with the field's bounds where it has them.
    fn extract(&mut self, field: &ast::DateTimeField, expr: &mut Expr, role: Role) -> Result<Info> {
        let i = self.expr(expr, role)?;
        if !matches!(i.ty, Some(ColumnType::Date | ColumnType::Timestamp) | None) {
            return Err(unsupported_here("EXTRACT from a non-date value"));
        }
        let field_name = field.to_string().to_ascii_lowercase();
        // A date has no time of day: PostgreSQL fails on EXTRACT(hour FROM d) for a date
        // d, but only when a row reaches it, which would reveal that one exists.
        if matches!(field_name.as_str(), "hour" | "minute" | "second")
            && i.ty != Some(ColumnType::Timestamp)
        {
            return Err(Error::unsupported(
                format!("EXTRACT({field_name} …) of a date"),
                "A date has no time of day. Extract it from a timestamp column, or use a field of the date such as day, dow or doy.",
            ));
        }
        let bounds = match field_name.as_str() {
            "month" => Some((1.0, 12.0)),
            "day" => Some((1.0, 31.0)),
            "dow" => Some((0.0, 6.0)),
            "isodow" => Some((1.0, 7.0)),
            "quarter" => Some((1.0, 4.0)),
            "hour" => Some((0.0, 23.0)),
            "doy" => Some((1.0, 366.0)),
            "week" => Some((1.0, 53.0)),
            "year" | "isoyear" | "minute" | "second" | "epoch" | "decade" | "century" => None,
            _ => return Err(unsupported_here(&format!("EXTRACT({field_name} …)"))),
        };
        Ok(Info::derived(Some(ColumnType::Numeric), &[&i], bounds))
    }

    /// `ts AT TIME ZONE 'UTC'` (Django's TruncMonth, `__date`, ExtractHour … of a DateTimeField
    /// with USE_TZ): a timestamptz as UTC wall-clock time, or a timestamp read as UTC. With UTC
    /// the value keeps its place in PostgreSQL's range (no offset moves it past an end, which
    /// would fail on that row), and ±infinity stays ±infinity: total, and independent of the
    /// session's time zone. Other zones are refused: an offset can fail near the ends of the
    /// range, and an unknown zone fails only once a row reaches it, telling that one did. A
    /// parameter (`AT TIME ZONE $1`, Django with server-side binding) is checked once bound.
    fn at_time_zone(&mut self, ts: &mut Expr, zone: &Expr, role: Role) -> Result<Info> {
        let i = self.expr(ts, role)?;
        if i.ty != Some(ColumnType::Timestamp) {
            return Err(Error::unsupported(
                "AT TIME ZONE of anything but a timestamp",
                "Apply AT TIME ZONE to a timestamp or timestamptz column; a date has no time of day to convert.",
            ));
        }
        let utc = match zone {
            Expr::Value(v) if matches!(v.value, Value::Placeholder(_)) => true,
            Expr::Value(v) => crate::literal::string_value(&v.value)
                .is_some_and(|z| UTC_ZONES.contains(&z.to_ascii_lowercase().as_str())),
            _ => false,
        };
        if !utc {
            return Err(Error::unsupported(
                format!("AT TIME ZONE {zone}"),
                "pgdp converts timestamps AT TIME ZONE 'UTC' only. For local days or months, SET TimeZone to the zone and group by date_trunc of the timestamptz column (it truncates in the session's zone); in Django, set TIME_ZONE = 'UTC'.",
            ));
        }
        Ok(Info::derived(Some(ColumnType::Timestamp), &[&i], None))
    }

    /// A parameter compared with a typed expression takes that type.
    pub(super) fn infer_parameter(&mut self, e: &Expr, other: &Info) {
        if let (Expr::Value(v), Some(ty)) = (e, other.ty) {
            if let Value::Placeholder(p) = &v.value {
                if let Some(i) = p.strip_prefix('$').and_then(|n| n.parse::<usize>().ok()) {
                    self.parameters.insert(i, (ty, other.declared.clone()));
                }
            }
        }
    }

    pub(super) fn function(&mut self, f: &mut ast::Function, role: Role) -> Result<Info> {
        if f.over.is_some() {
            if self.windows_allowed {
                let name = function_name(&f.name)?;
                return self.unit_window(f, &name);
            }
            return Err(window_refusal());
        }
        let name = function_name(&f.name)?;
        if !f.within_group.is_empty() {
            // An ordered-set aggregate other than the percentiles (mode(), rank(…) WITHIN GROUP).
            return Err(Error::unsupported(
                format!("{name}() WITHIN GROUP"),
                "pgdp answers PERCENTILE_CONT(p) and PERCENTILE_DISC(p) WITHIN GROUP (ORDER BY x) and MEDIAN(x) of a bounded column. A most frequent value is the key with the largest count: SELECT x, COUNT(*) FROM … GROUP BY x ORDER BY 2 DESC LIMIT 1.",
            ));
        }
        if f.filter.is_some() || f.null_treatment.is_some() {
            return Err(Error::unsupported(
                "FILTER / WITHIN GROUP",
                "Move the condition into WHERE.",
            ));
        }
        if aggregate_kind(&name).is_some() && role == Role::UnitAggregate {
            return self.unit_aggregate(f, &name);
        }
        if aggregate_kind(&name).is_some() {
            return Err(Error::unsupported(
                "aggregates inside expressions",
                "Aggregates may appear only at the top of a select item, in HAVING or in ORDER BY.",
            ));
        }
        if name == "date_bin" {
            return self.date_bin(f, role);
        }
        if name == "width_bucket" {
            return self.width_bucket(f, role);
        }

        let Some(spec) = total_function(&name) else {
            return Err(Error::UnknownFunction {
                name: f.name.to_string(),
                hint: "pgdp allows only functions that never fail and do not depend on time or randomness: lower, upper, length, abs, round, floor, ceil, coalesce, nullif, greatest, least, date_trunc, date_part, to_char of dates, trim.".into(),
            });
        };
        let infos = self.function_arguments(f, &name, &spec, role)?;
        let refs: Vec<&Info> = infos.iter().collect();
        let ty = match spec.result {
            Result_::Same(i) => infos.get(i).and_then(|x| x.ty),
            Result_::Fixed(t) => Some(t),
        };
        let bounds = function_bounds(&name, &infos);
        f.name = pg_catalog_name(&name);
        Ok(Info::derived(ty, &refs, bounds))
    }

    /// The arguments of a total function: their number, their kinds (literals where the
    /// function needs them), and the guards that keep the call from failing on any value.
    fn function_arguments(
        &mut self,
        f: &mut ast::Function,
        name: &str,
        spec: &FunctionSpec,
        role: Role,
    ) -> Result<Vec<Info>> {
        let args = match &mut f.args {
            FunctionArguments::List(list) => {
                if list.duplicate_treatment.is_some() || !list.clauses.is_empty() {
                    return Err(Error::unsupported(
                        "DISTINCT or clauses in function arguments",
                        "Call the function on plain arguments, e.g. round(cost, 0); for distinct values use COUNT(DISTINCT col).",
                    ));
                }
                &mut list.args
            }
            FunctionArguments::None => {
                return Err(Error::UnknownFunction {
                    name: name.to_string(),
                    hint: String::new(),
                })
            }
            FunctionArguments::Subquery(_) => return Err(Error::unsupported(
                    "subqueries as function arguments",
                    "Compute the value in a CTE or a subquery in FROM and pass its column, e.g. WITH v AS (SELECT person_id, cost FROM demo.visits WHERE …) SELECT SUM(cost) FROM v.",
                )),
        };
        if args.len() < spec.min_args || args.len() > spec.max_args {
            return Err(Error::UnknownFunction {
                name: format!("{name} with {} argument(s)", args.len()),
                hint: String::new(),
            });
        }
        let mut infos = Vec::new();
        for (i, a) in args.iter_mut().enumerate() {
            let FunctionArg::Unnamed(FunctionArgExpr::Expr(e)) = a else {
                return Err(Error::unsupported(
                    "named or wildcard function arguments",
                    "Pass the arguments by position, e.g. round(cost, 0).",
                ));
            };
            let info = self.expr(e, role)?;
            if spec.literal_args.contains(&i) && !info.constant {
                return Err(Error::unsupported(
                    format!("a non-literal argument {} to {name}", i + 1),
                    "This argument must be a literal (a value from the data could make it fail).",
                ));
            }
            if i == 0 && matches!(name, "date_trunc" | "date_part") {
                check_date_unit(name, e)?;
            }
            if name == "round" && i == 1 {
                // round(x, n) with a huge n is slow and can fail; keep it to sane digits.
                if info.bounds.is_none_or(|(l, u)| l < -20.0 || u > 20.0) {
                    return Err(Error::unsupported(
                        "round() to more than 20 digits",
                        "Use round(x, n) with -20 ≤ n ≤ 20.",
                    ));
                }
            }
            infos.push(info);
        }
        if name == "abs" {
            // abs(-2147483648) overflows an integer: compute in numeric.
            if let (Some(FunctionArg::Unnamed(FunctionArgExpr::Expr(e))), Some(info)) =
                (args.first_mut(), infos.first())
            {
                *e = as_numeric(e.clone(), info);
            }
        }
        if name == "to_char" {
            if let (Some(x), Some(FunctionArg::Unnamed(FunctionArgExpr::Expr(format)))) =
                (infos.first(), args.get(1))
            {
                check_to_char(x, format)?;
            }
            if let (Some(x), Some(FunctionArg::Unnamed(FunctionArgExpr::Expr(e)))) =
                (infos.first(), args.get_mut(0))
            {
                if !x.constant {
                    *e = datetime_range_guard("", e.clone());
                }
            }
        }
        if matches!(name, "date_trunc" | "date_part") {
            // Near the ends of the date and timestamp ranges both fail on some values: the
            // argument is made total (see `datetime_range_guard`).
            // date_part's field truncates nothing: only its conversion of a date can fail.
            let unit = match args.first() {
                _ if name == "date_part" => Some(String::new()),
                Some(FunctionArg::Unnamed(FunctionArgExpr::Expr(Expr::Value(v)))) => {
                    crate::literal::string_value(&v.value).map(|s| s.to_ascii_lowercase())
                }
                _ => None,
            };
            let temporal = infos.get(1).is_some_and(|i| {
                !i.constant && matches!(i.ty, Some(ColumnType::Date | ColumnType::Timestamp))
            });
            if let (Some(unit), true, Some(FunctionArg::Unnamed(FunctionArgExpr::Expr(x)))) =
                (unit, temporal, args.get_mut(1))
            {
                *x = datetime_range_guard(&unit, x.clone());
            }
        }
        Ok(infos)
    }
}

/// The bounds of a total function's result from its arguments' bounds, where it has them.
fn function_bounds(name: &str, infos: &[Info]) -> Option<(f64, f64)> {
    match name {
        "abs" => infos[0].bounds.map(|(l, u)| {
            if l >= 0.0 {
                (l, u)
            } else if u <= 0.0 {
                (-u, -l)
            } else {
                (0.0, u.max(-l))
            }
        }),
        "round" | "floor" | "ceil" | "ceiling" | "trunc" => {
            infos[0].bounds.map(|(l, u)| (l.floor(), u.ceil()))
        }
        "greatest" | "least" | "coalesce" => {
            // An argument without bounds ranges over everything; GREATEST / LEAST ignore
            // NULLs, so the result lies between the extreme bounds of the arguments, and
            // LEAST(x, k) ≤ k, GREATEST(x, k) ≥ k whatever x is.
            let v: Vec<(f64, f64)> = infos
                .iter()
                .map(|i| i.bounds.unwrap_or((f64::NEG_INFINITY, f64::INFINITY)))
                .collect();
            let min_lo = v.iter().map(|b| b.0).fold(f64::INFINITY, f64::min);
            let max_lo = v.iter().map(|b| b.0).fold(f64::NEG_INFINITY, f64::max);
            let min_hi = v.iter().map(|b| b.1).fold(f64::INFINITY, f64::min);
            let max_hi = v.iter().map(|b| b.1).fold(f64::NEG_INFINITY, f64::max);
            let b = match name {
                "least" => (min_lo, min_hi),
                "greatest" => (max_lo, max_hi),
                _ => (min_lo, max_hi),
            };
            (!b.0.is_nan() && !b.1.is_nan()).then_some(b)
        }
        "nullif" => infos[0].bounds,
        "date_part" => Some((f64::MIN / 4.0, f64::MAX / 4.0)).filter(|_| false),
        _ => None,
    }
}

/// A total function's name qualified as pg_catalog, so a search_path can never substitute
/// another function; the SQL constructs that look like functions (COALESCE, NULLIF, GREATEST,
/// LEAST) cannot be qualified and cannot be shadowed. Names that sqlparser reads as special
/// syntax even after `pg_catalog.` (FLOOR, CEIL) are quoted, so the rewrite re-parses.
fn pg_catalog_name(name: &str) -> ObjectName {
    if matches!(name, "coalesce" | "nullif" | "greatest" | "least") {
        ObjectName::from(vec![Ident::new(name.to_ascii_uppercase())])
    } else if matches!(name, "floor" | "ceil" | "ceiling") {
        ObjectName::from(vec![Ident::new("pg_catalog"), Ident::with_quote('"', name)])
    } else {
        ObjectName::from(vec![Ident::new("pg_catalog"), Ident::new(name)])
    }
}

/// The refusal of a construct outside the whitelist, with the whitelist as its hint.
/// The elements of an `ARRAY[…]` constructor (in parentheses or not).
fn array_elements(e: &Expr) -> Option<Vec<Expr>> {
    match e {
        Expr::Nested(inner) => array_elements(inner),
        Expr::Array(array) => Some(array.elem.clone()),
        _ => None,
    }
}

/// PostgreSQL's names of Coordinated Universal Time (lower case; zone names are read
/// case-insensitively), the zones `AT TIME ZONE` is answered in.
const UTC_ZONES: [&str; 10] = [
    "utc",
    "etc/utc",
    "gmt",
    "etc/gmt",
    "uct",
    "etc/uct",
    "universal",
    "etc/universal",
    "zulu",
    "etc/zulu",
];

fn unsupported_here(what: &str) -> Error {
    Error::unsupported(
        what.to_string(),
        "pgdp allows comparisons, AND/OR/NOT, + - * /, IN lists, BETWEEN, LIKE with a literal pattern, IS NULL, CASE and a few total functions.",
    )
}

/// `DATE '…'`, `TIMESTAMP '…'`, …: checked here, as a malformed one would fail upstream after
/// the charge.
fn typed_literal(ts: &ast::TypedString) -> Result<Info> {
    let ty =
        type_of_data_type(&ts.data_type).ok_or_else(|| unsupported_here("this typed literal"))?;
    let text = crate::literal::string_value(&ts.value.value).unwrap_or_default();
    check_text_of_type(text, ty)?;
    // A date's value is its day number, the unit of date columns' bounds.
    let day = match ty {
        ColumnType::Date => {
            crate::datetime::Date::parse(text.trim()).map(|d| d.days_since_2000() as f64)
        }
        _ => None,
    };
    Ok(Info::constant(Some(ty), day))
}

/// `x / y`, divided by `NULLIF(y, 0)` (division by zero would raise an error that depends on
/// the data), and the integer division PostgreSQL does when both are integers.
fn divide(left: &mut Box<Expr>, right: &mut Box<Expr>, l: &Info, r: &Info) -> (Info, Option<Expr>) {
    let divisor_literal = r.constant && r.bounds.is_some_and(|(v, _)| v != 0.0);
    let bounds = match (
        l.bounds.filter(|(x, y)| x.is_finite() && y.is_finite()),
        r.bounds,
    ) {
        (Some((a, b)), Some((c, d))) if divisor_literal && c == d => {
            let (x, y) = (a / c, b / c);
            Some((x.min(y), x.max(y)))
        }
        _ => None,
    };
    let divisor = as_numeric(right.as_ref().clone(), r);
    **left = as_numeric(left.as_ref().clone(), l);
    **right = nullif_zero(divisor);
    if l.integer && r.integer {
        // Integer division truncates toward zero (7 / 2 = 3, -7 / 2 = -3):
        // div() of the numerics is that quotient, exact, with no overflow.
        let bounds = bounds.map(|(x, y): (f64, f64)| (x.trunc(), y.trunc()));
        let quotient = integer_division(left.as_ref().clone(), right.as_ref().clone());
        return (
            Info {
                integer: true,
                ..Info::derived(Some(ColumnType::Numeric), &[l, r], bounds)
            },
            Some(quotient),
        );
    }
    (
        Info::derived(Some(ColumnType::Numeric), &[l, r], bounds),
        None,
    )
}

/// The refusal of a cast that can fail on some values, with the form that works.
/// Whether `data_type` is PostgreSQL's `real` (float4): REAL, FLOAT4, FLOAT(1) … FLOAT(24).
fn single_precision(data_type: &ast::DataType) -> bool {
    use ast::DataType as D;
    match data_type {
        D::Real | D::Float4 => true,
        D::Float(ast::ExactNumberInfo::Precision(p)) => (1..=24).contains(p),
        _ => false,
    }
}

fn cast_can_fail(expr: &Expr, i: &Info, data_type: &ast::DataType) -> Error {
    // EXTRACT / date_part of an infinite date or timestamp is ±Infinity, which no
    // integer cast accepts, and a policy declares no bounds for dates that would
    // exclude infinity: the cast stays refused, the hint shows the form that works.
    let of_date_field = match expr {
        Expr::Extract { .. } => true,
        Expr::Function(f) => function_name(&f.name).is_ok_and(|n| n == "date_part"),
        _ => false,
    };
    let hint = if of_date_field {
        "EXTRACT and date_part give ±Infinity for infinite dates, which the cast refuses (an error that would reveal data). As a GROUP BY key the cast is allowed (GROUP BY EXTRACT(YEAR FROM visit_date)::int): pgdp groups by the EXTRACT and casts the released keys. Elsewhere compare EXTRACT(YEAR FROM visit_date) without the cast."
    } else {
        "Casts that can fail would reveal data through errors; compare with a literal of the column's own type instead."
    };
    Error::forbidden(
        format!(
            "the cast of {} to {data_type} can fail on some values",
            i.column.as_deref().unwrap_or("this expression")
        ),
        hint,
    )
}
