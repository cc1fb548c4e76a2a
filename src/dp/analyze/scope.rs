//! Tables in scope: resolving names against the policy, CTEs and derived tables as views, and
//! the columns each table exposes.

use super::*;

/// A view's select items: each one's SQL and name.
type NamedItems = Vec<(String, String)>;

/// The hint of a refused subquery that aggregates without grouping by the privacy unit alone.
const PER_UNIT_HINT: &str = "Aggregate per privacy unit, e.g. (SELECT person_id, LEAST(COUNT(*), 20) AS n FROM demo.visits GROUP BY person_id), and aggregate n in the outer query.";

impl<'a> Analyzer<'a> {
    pub(super) fn find_table(&self, name: &ObjectName) -> Result<&'a Table> {
        let parts: Vec<String> = name
            .0
            .iter()
            .map(|p| {
                p.as_ident()
                    .map(ident_lower)
                    .unwrap_or_else(|| p.to_string().to_ascii_lowercase())
            })
            .collect();
        let policy = self.ctx.policy;
        let found = match parts.as_slice() {
            [schema, table] => policy.table(&format!("{schema}.{table}")),
            [table] => self
                .ctx
                .search_path
                .iter()
                .find_map(|s| policy.table(&format!("{s}.{table}"))),
            [_db, schema, table] => policy.table(&format!("{schema}.{table}")),
            _ => None,
        };
        if let Some(first) = parts.first() {
            if parts.len() >= 2 && (first == "pg_catalog" || first == "information_schema") {
                return Err(Error::unsupported(
                    format!("reading the catalog relation {name} in a query of the policy's tables"),
                    "Query the catalog on its own (it is answered from a catalog with no data) and the policy's tables on their own (answered under DP).",
                ));
            }
        }
        found.ok_or_else(|| Error::UnknownTable {
            name: name.to_string(),
        })
    }

    pub(super) fn fresh_alias(&mut self) -> String {
        let a = format!("{RESERVED_PREFIX}t{}", self.next_alias);
        self.next_alias += 1;
        a
    }

    /// A subquery in FROM (a derived table or a reference to a CTE) becomes a table pgdp builds,
    /// with its own SQL and contribution bounds (docs/privacy.md, "Subqueries in FROM"):
    /// - row-level (WHERE, projection of row expressions, joins under the join rules): each of
    ///   its rows is a row of one privacy unit, so it keeps the unit and the bounds of the
    ///   private tables it reads;
    /// - per unit (`GROUP BY <privacy unit>` with aggregates): one row per unit, so each unit
    ///   contributes one row to one group of the outer query; its values are aggregates of the
    ///   unit's own rows, with bounds derived from the query (LEAST / GREATEST / CASE) or the
    ///   policy, and are clamped again by the outer aggregate like any argument.
    pub(super) fn view(&mut self, q: &ast::Query, visible: String) -> Result<usize> {
        if visible.starts_with(RESERVED_PREFIX) {
            return Err(reserved_refusal());
        }
        if self.tables.iter().any(|t| t.2 == visible) {
            return Err(Error::Syntax {
                message: format!("table name \"{visible}\" specified more than once"),
            });
        }
        if self.tables.len() >= JOINED_TABLES_MAX || self.next_alias >= VIEW_TABLES_MAX {
            return Err(Error::LimitExceeded {
                what: "the number of joined tables".into(),
                limit: JOINED_TABLES_MAX as u64,
            });
        }
        if q.with.is_some() {
            return Err(Error::unsupported(
                "WITH inside a subquery",
                "Move the CTEs to the top of the query.",
            ));
        }
        if !selects_every_row(q) || q.fetch.is_some() {
            return Err(Error::unsupported(
                "LIMIT / OFFSET inside a subquery in FROM",
                "They would pick rows by their values; filter with WHERE instead, and put LIMIT / OFFSET on the outer query.",
            ));
        }
        // An ORDER BY without LIMIT / OFFSET does not choose rows: the outer aggregate reads the
        // same rows in any order, so it is dropped (never sent upstream).
        if !q.locks.is_empty() {
            return Err(Error::forbidden(
                "FOR UPDATE / FOR SHARE is not allowed through pgdp",
                "",
            ));
        }
        let SetExpr::Select(select) = q.body.as_ref() else {
            return Err(Error::unsupported(
                "set operations or nested parentheses in a subquery",
                "Use one SELECT … FROM … [WHERE …] [GROUP BY <privacy unit>] per subquery.",
            ));
        };
        if select.distinct.is_some() {
            let what = if matches!(select.distinct, Some(ast::Distinct::On(_))) {
                "SELECT DISTINCT ON in a subquery"
            } else {
                "SELECT DISTINCT in a subquery other than under a count of its rows"
            };
            return Err(Error::unsupported(
                what,
                "Count groups with SELECT COUNT(*) FROM (SELECT DISTINCT k FROM …) s or COUNT(DISTINCT k), or aggregate per privacy unit (GROUP BY person_id) in the subquery.",
            ));
        }
        if select.into.is_some()
            || select.qualify.is_some()
            || !select.named_window.is_empty()
            || select.top.is_some()
            || select.prewhere.is_some()
            || !select.lateral_views.is_empty()
        {
            return Err(Error::unsupported(
                "INTO, QUALIFY, WINDOW, TOP, PREWHERE or LATERAL VIEW in a subquery",
                "Write the subquery as SELECT … FROM … WHERE … [GROUP BY the privacy unit [HAVING …]]; for a window, write OVER (PARTITION BY the privacy unit …) in the select list.",
            ));
        }
        let saved = std::mem::take(&mut self.tables);
        let built = self.view_body(select, &visible);
        self.tables = saved;
        let (query, table) = built?;
        let r = TableRef {
            table: visible.clone(),
            alias: self.fresh_alias(),
            private: true,
            source: Some(Box::new(query)),
            nullable: false,
        };
        self.tables.push((r, Cow::Owned(table), visible));
        Ok(self.tables.len() - 1)
    }

    /// The SQL and the table of a subquery, analysed with `self.tables` holding its own FROM.
    pub(super) fn view_body(
        &mut self,
        select: &ast::Select,
        visible: &str,
    ) -> Result<(ast::Query, Table)> {
        let joins = self.resolve_from(&select.from)?;
        if !self.tables.iter().any(|t| t.0.private) {
            return Err(Error::unsupported(
                "subqueries over public tables only",
                "Join the public table directly in the outer query.",
            ));
        }
        let unit = match self.unit()? {
            Unit::Column(c) => c.to_string(),
            Unit::Row { .. } => {
                return Err(Error::unsupported(
                    "subqueries over row-level private tables",
                    "Query the row-level table directly.",
                ))
            }
        };
        let filter = self.view_filter(select)?;
        let per_unit = self.view_per_unit(select, &unit)?;
        let (items, columns, unit_name) = self.view_columns(select, visible, &unit, per_unit)?;
        let having = match &select.having {
            Some(h) => {
                let mut h = h.clone();
                self.expr(&mut h, Role::UnitAggregate)?;
                Some(h.to_string())
            }
            None => None,
        };
        let ((max_groups_per_unit, groups_ceiling), (max_rows_per_unit, rows_ceiling)) =
            self.view_caps(per_unit);
        let query = self.view_query(&joins, &items, filter, &unit, per_unit, having)?;
        let table = Table {
            schema: String::new(),
            name: visible.to_string(),
            kind: TableKind::Private(PrivateTable {
                privacy_unit: Some(unit_name),
                unit_path: None,
                max_groups_per_unit,
                max_rows_per_unit,
                groups_ceiling,
                rows_ceiling,
                unique_keys: Vec::new(),
            }),
            columns,
        };
        Ok((query, table))
    }

    /// A subquery's WHERE, analysed, as text.
    fn view_filter(&mut self, select: &ast::Select) -> Result<Option<String>> {
        Ok(match &select.selection {
            Some(e) => {
                let mut e = e.clone();
                let info = self.expr(&mut e, Role::Filter)?;
                if info.ty.is_some_and(|t| t != ColumnType::Boolean) {
                    return Err(Error::Syntax {
                        message: "argument of WHERE must be type boolean".into(),
                    });
                }
                Some(e.to_string())
            }
            None => None,
        })
    }

    /// Whether a subquery aggregates per unit (it must then GROUP BY the privacy unit alone).
    fn view_per_unit(&mut self, select: &ast::Select, unit: &str) -> Result<bool> {
        let group_exprs = match &select.group_by {
            GroupByExpr::Expressions(exprs, modifiers) if modifiers.is_empty() => exprs.clone(),
            _ => {
                return Err(Error::unsupported(
                    "ROLLUP / CUBE / GROUPING SETS / GROUP BY ALL in a subquery",
                    "GROUP BY the privacy unit alone.",
                ))
            }
        };
        let per_unit = !group_exprs.is_empty()
            || select.having.is_some()
            || select.projection.iter().any(|item| match item {
                SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. } => {
                    contains_plain_aggregate(e)
                }
                _ => false,
            });
        if per_unit {
            let ok = match group_exprs.as_slice() {
                [g] => {
                    let mut g = resolve_group_reference(g, &select.projection)?;
                    self.expr(&mut g, Role::Filter)?;
                    let text = g.to_string();
                    text == unit || self.is_unit_of_any_table(&text)
                }
                _ => false,
            };
            if !ok {
                return Err(Error::forbidden(
                    "a subquery in FROM that aggregates must GROUP BY the privacy unit alone",
                    PER_UNIT_HINT,
                ));
            }
        }
        Ok(per_unit)
    }

    /// A subquery's select list: each item's SQL and name, its column of the view, and the
    /// name under which the view carries the privacy unit (a hidden column when no item is
    /// the unit itself).
    fn view_columns(
        &mut self,
        select: &ast::Select,
        visible: &str,
        unit: &str,
        per_unit: bool,
    ) -> Result<(NamedItems, Vec<Column>, String)> {
        let role = if per_unit {
            Role::UnitAggregate
        } else {
            Role::Argument
        };
        let mut items: Vec<(String, String)> = Vec::new();
        let mut columns: Vec<Column> = Vec::new();
        let mut unit_name: Option<String> = None;
        for item in &select.projection {
            let (expr, alias) = match item {
                SelectItem::UnnamedExpr(e) => (e, None),
                SelectItem::ExprWithAlias { expr, alias } => (expr, Some(ident_lower(alias))),
                SelectItem::Wildcard(_) | SelectItem::QualifiedWildcard(..) if per_unit => {
                    return Err(Error::unsupported(
                        "* in a subquery grouped by the privacy unit",
                        PER_UNIT_HINT,
                    ))
                }
                SelectItem::Wildcard(_) => {
                    if self.tables.len() != 1 {
                        return Err(Error::unsupported(
                            "SELECT * over a join in a subquery",
                            "List the columns, or select t.* of one table.",
                        ));
                    }
                    self.table_columns(0, &mut items, &mut columns, &mut unit_name);
                    continue;
                }
                SelectItem::QualifiedWildcard(kind, _) => {
                    let idx = self.wildcard_table(kind)?;
                    self.table_columns(idx, &mut items, &mut columns, &mut unit_name);
                    continue;
                }
                SelectItem::ExprWithAliases { .. } => {
                    return Err(Error::unsupported(
                        "multiple aliases for one select item",
                        "Give the item one alias: expr AS name.",
                    ))
                }
            };
            let name = alias.unwrap_or_else(|| default_name(expr));
            if name.starts_with(RESERVED_PREFIX) {
                return Err(reserved_refusal());
            }
            // The unit itself (bare, possibly qualified) names the view's privacy unit.
            if let Some((idx, col)) = self.column_ref(expr)? {
                let alias_of = self.tables[idx].0.alias.clone();
                let text = canonical(&alias_of, &col).to_string();
                if text == unit || self.is_unit_of_any_table(&text) {
                    let ty = self.tables[idx]
                        .1
                        .column(&col)
                        .map(|c| (c.ty, c.declared_type.clone()))
                        .unwrap_or((ColumnType::Integer, "bigint".into()));
                    unit_name.get_or_insert(name.clone());
                    columns.push(Column {
                        name: name.clone(),
                        ty: ty.0,
                        declared_type: ty.1,
                        bounds: None,
                        upper_ceiling: None,
                        groupable: false,
                        public_values: None,
                        exhaustive: false,
                    });
                    items.push((text, name));
                    continue;
                }
            }
            let (item, column) = self.view_item(expr, &name, visible, per_unit, role)?;
            columns.push(column);
            items.push((item, name));
        }
        let unit_name = match unit_name {
            Some(u) => u,
            None => {
                let hidden = format!("{RESERVED_PREFIX}unit");
                items.push((unit.to_string(), hidden.clone()));
                columns.push(Column {
                    name: hidden.clone(),
                    ty: ColumnType::Integer,
                    declared_type: "bigint".into(),
                    bounds: None,
                    upper_ceiling: None,
                    groupable: false,
                    public_values: None,
                    exhaustive: false,
                });
                hidden
            }
        };
        let mut names: Vec<&str> = items.iter().map(|i| i.1.as_str()).collect();
        names.sort_unstable();
        if names.windows(2).any(|w| w[0] == w[1]) {
            return Err(Error::unsupported(
                "two columns of the same name in a subquery",
                "Give the columns distinct aliases with AS.",
            ));
        }
        Ok((items, columns, unit_name))
    }

    /// The table in scope that `t.*` names.
    fn wildcard_table(&self, kind: &ast::SelectItemQualifiedWildcardKind) -> Result<usize> {
        let ast::SelectItemQualifiedWildcardKind::ObjectName(name) = kind else {
            return Err(Error::unsupported("this wildcard", "List the columns."));
        };
        let qualifier = name
            .0
            .iter()
            .map(|p| {
                p.as_ident()
                    .map(ident_lower)
                    .unwrap_or_else(|| p.to_string().to_ascii_lowercase())
            })
            .collect::<Vec<_>>()
            .join(".");
        self.tables
            .iter()
            .position(|(r, _, v)| *v == qualifier || r.table == qualifier)
            .ok_or(Error::UnknownTable { name: qualifier })
    }

    /// One select item of a subquery that is not the privacy unit: its SQL and its column
    /// (type, bounds, public domain), or a hint kept for when the outer query aggregates it.
    fn view_item(
        &mut self,
        expr: &Expr,
        name: &str,
        visible: &str,
        per_unit: bool,
        role: Role,
    ) -> Result<(String, Column)> {
        let mut e = expr.clone();
        // A window partitioned by the unit keeps each row a row of one unit (`window`).
        self.windows_allowed = !per_unit;
        let info = self.expr(&mut e, role);
        self.windows_allowed = false;
        let mut info = info?;
        if per_unit {
            if let Some(capped) = self.row_capped(expr, &e, &info)? {
                self.unit_caps
                    .push(format!("{visible}.{name} = {}", capped.shown));
                e = capped.item;
                info.bounds = Some(capped.bounds);
            }
        }
        let bounds = info
            .bounds
            .filter(|(l, u)| l.is_finite() && u.is_finite())
            .map(|(lower, upper)| Bounds { lower, upper });
        let ty = info.ty.unwrap_or(ColumnType::Text);
        if bounds.is_none() && ty.is_numeric() && per_unit {
            self.view_hints.insert(
                format!("{visible}.{name}"),
                "Clamp the per-unit value with stated bounds in the subquery, e.g. LEAST(COUNT(*), 20) or LEAST(GREATEST(SUM(cost), 0), 5000).".into(),
            );
        } else if bounds.is_none()
            && ty.is_numeric()
            && info.column.is_none()
            && !contains_window(expr)
        {
            self.view_hints.insert(
                format!("{visible}.{name}"),
                format!("Clamp the value with stated bounds in the subquery, e.g. LEAST(GREATEST(<expression>, 0), 100) AS {name}."),
            );
        } else if bounds.is_none() && ty.is_numeric() && contains_window(expr) {
            self.view_hints.insert(
                format!("{visible}.{name}"),
                "Clamp the window value with stated bounds in the subquery, e.g. LEAST(ROW_NUMBER() OVER (PARTITION BY person_id ORDER BY visit_date), 10), LEAST(GREATEST(visit_date - MIN(visit_date) OVER (PARTITION BY person_id), 0), 3650) or LEAST(SUM(cost) OVER (PARTITION BY person_id), 5000).".into(),
            );
        }
        let (public_values, exhaustive) = match &info.public {
            // A column of a derived table keeps the non-NULL values (a NULL group of the
            // outer query is then not released, so the column is exhaustive only when NULL
            // was not among them).
            PublicKeys::Listed { values, exhaustive } => (
                Some(values.iter().flatten().cloned().collect()),
                *exhaustive && !values.contains(&None),
            ),
            // Rows beyond a declared bound fall outside the domain.
            _ if per_unit => (integer_domain(ty, bounds), false),
            _ => (None, false),
        };
        let column = Column {
            name: name.to_string(),
            ty,
            // An expression has no declared type; PostgreSQL's type of a per-unit
            // aggregate of integers (COUNT, SUM, LEAST(COUNT(*), 20)) is bigint.
            declared_type: info.declared.clone().unwrap_or_else(|| {
                if per_unit && ty == ColumnType::Integer {
                    "bigint".to_string()
                } else {
                    ty.name().to_string()
                }
            }),
            bounds,
            // A column passed through keeps its ceiling; a per-unit value has none.
            upper_ceiling: if per_unit { None } else { info.upper_ceiling },
            groupable: info.groupable || per_unit,
            public_values,
            exhaustive,
        };
        Ok((e.to_string(), column))
    }

    /// (caps, ceilings) of groups and of rows per unit of a view: the loosest of the tables
    /// joined; one group and one row per unit when it aggregates per unit.
    fn view_caps(&self, per_unit: bool) -> ((u64, u64), (u64, u64)) {
        if per_unit {
            ((1, 1), (1, 1))
        } else {
            let caps: Vec<&PrivateTable> =
                self.tables.iter().filter_map(|t| t.1.private()).collect();
            let loosest = |f: fn(&PrivateTable) -> u64| -> u64 {
                caps.iter().map(|p| f(p)).max().unwrap_or(1)
            };
            (
                (
                    loosest(|p| p.max_groups_per_unit),
                    loosest(|p| p.groups_ceiling),
                ),
                (
                    loosest(|p| p.max_rows_per_unit),
                    loosest(|p| p.rows_ceiling),
                ),
            )
        }
    }

    /// The view's SQL, printed and parsed back.
    fn view_query(
        &self,
        joins: &[JoinOn],
        items: &[(String, String)],
        filter: Option<String>,
        unit: &str,
        per_unit: bool,
        having: Option<String>,
    ) -> Result<ast::Query> {
        let refs: Vec<TableRef> = self.tables.iter().map(|t| t.0.clone()).collect();
        let from = from_clause(&refs, joins, |q| Ok(sql!("{}", q)))?.into_string();
        let select_list: Vec<String> = items
            .iter()
            .map(|(e, n)| format!("{e} AS \"{n}\""))
            .collect();
        let mut sql = format!("SELECT {} FROM {from}", select_list.join(", "));
        if let Some(f) = filter {
            sql.push_str(&format!(" WHERE {f}"));
        }
        if per_unit {
            sql.push_str(&format!(" GROUP BY {unit}"));
        }
        if let Some(h) = having {
            sql.push_str(&format!(" HAVING {h}"));
        }
        let dialect = sqlparser::dialect::PostgreSqlDialect {};
        let statements = sqlparser::parser::Parser::parse_sql(&dialect, &sql)
            .map_err(|e| Error::internal(format!("subquery SQL does not parse: {e}")))?;
        let query = match statements.into_iter().next() {
            Some(ast::Statement::Query(q)) => *q,
            _ => return Err(Error::internal("subquery SQL is not a query")),
        };
        Ok(query)
    }

    /// A select item of a subquery grouped by the privacy unit that is a whole `COUNT(…)`, or
    /// `SUM(x)` of a bounded `x`, with no stated upper bound: bounded by the policy's row cap `C`
    /// (the most rows of a unit a plain aggregate over these tables counts in a group, the
    /// largest `max_rows_per_unit` of the private tables in the subquery's FROM), and clamped
    /// to it in the SQL: `LEAST(COUNT(*), C)`, `LEAST(GREATEST(SUM(x), C·min(lo, 0)),
    /// C·max(hi, 0))` (the range of a sum of at most `C` values in `[lo, hi]`, so a unit with
    /// at most `C` rows keeps its exact sum). The clamp, not the data, makes the bound hold, so
    /// the outer aggregate's sensitivity follows from it as from the analyst's own `LEAST`; the
    /// answer's NOTICE names each clamp ([`Plan::unit_caps`]). `None` for anything else (whose
    /// missing bound is refused with a hint that shows the clamp).
    fn row_capped(
        &mut self,
        written: &Expr,
        analysed: &Expr,
        info: &Info,
    ) -> Result<Option<RowCapped>> {
        if info
            .bounds
            .is_some_and(|(l, u)| l.is_finite() && u.is_finite())
        {
            return Ok(None);
        }
        let Expr::Function(f) = written else {
            return Ok(None);
        };
        let name = function_name(&f.name)?;
        if f.over.is_some() || !matches!(name.as_str(), "count" | "sum") {
            return Ok(None);
        }
        let rows_max = self
            .tables
            .iter()
            .filter_map(|t| t.1.private())
            .map(|p| p.max_rows_per_unit)
            .max()
            .unwrap_or(1) as f64;
        let ty = info.ty;
        let e = analysed;
        let (lo, hi) = if name == "count" {
            // 1 for `COUNT(*)` ([`Analyzer::unit_aggregate`]): the clamp keeps it.
            (info.bounds.map_or(0.0, |b| b.0.clamp(0.0, 1.0)), rows_max)
        } else {
            let FunctionArguments::List(list) = &f.args else {
                return Ok(None);
            };
            let [FunctionArg::Unnamed(FunctionArgExpr::Expr(arg))] = list.args.as_slice() else {
                return Ok(None);
            };
            // The argument as written, analysed again on its own for its bounds (the item's
            // analysis gave the sum's, which are unbounded).
            let mut arg = arg.clone();
            let Some((l, u)) = self.expr(&mut arg, Role::Argument)?.bounds else {
                return Ok(None);
            };
            if !(l.is_finite() && u.is_finite()) {
                return Ok(None);
            }
            let (l, u) = (rows_max * l.min(0.0), rows_max * u.max(0.0));
            // A sum of integers is an integer: clamping into the integers of the range is the
            // same clamp, and keeps the column's integer type.
            if ty == Some(ColumnType::Integer) {
                (l.ceil(), u.floor())
            } else {
                (l, u)
            }
        };
        let literal = |v: f64| {
            if v.fract() == 0.0 && v.abs() < 1e15 {
                format!("{}", v as i64)
            } else {
                format!("{v}")
            }
        };
        // The SQL clamps the analysed item; the NOTICE shows the clamp of the item as written.
        let clamp = |item: &Expr| {
            if name == "count" {
                format!("LEAST({item}, {})", literal(hi))
            } else {
                format!("LEAST(GREATEST({item}, {}), {})", literal(lo), literal(hi))
            }
        };
        // GREATEST and LEAST ignore NULL: a unit whose values are all NULL keeps its NULL sum
        // (PostgreSQL's SUM), instead of taking the lower end of the range.
        let text = if name == "count" {
            clamp(e)
        } else {
            format!("CASE WHEN {e} IS NULL THEN NULL ELSE {} END", clamp(e))
        };
        let dialect = sqlparser::dialect::PostgreSqlDialect {};
        let capped = sqlparser::parser::Parser::new(&dialect)
            .try_with_sql(&text)
            .and_then(|mut p| p.parse_expr())
            .map_err(|e| Error::internal(format!("row-capped item does not parse: {e}")))?;
        Ok(Some(RowCapped {
            item: capped,
            bounds: (lo, hi),
            shown: clamp(written),
        }))
    }

    /// The declared columns of FROM table `idx`, as columns of a row-level subquery.
    pub(super) fn table_columns(
        &self,
        idx: usize,
        items: &mut Vec<(String, String)>,
        columns: &mut Vec<Column>,
        unit_name: &mut Option<String>,
    ) {
        let (r, table, _) = &self.tables[idx];
        let unit = table.private().and_then(|p| p.privacy_unit.clone());
        for c in &table.columns {
            let mut c = c.clone();
            if unit.as_deref() == Some(c.name.as_str()) {
                unit_name.get_or_insert(c.name.clone());
                c.groupable = false;
            }
            items.push((canonical(&r.alias, &c.name).to_string(), c.name.clone()));
            columns.push(c);
        }
    }
}

/// A per-unit item bounded by the policy's row cap ([`Analyzer::row_capped`]).
struct RowCapped {
    /// The clamped item, sent upstream.
    item: Expr,
    /// Its bounds.
    bounds: (f64, f64),
    /// The clamp of the item as the analyst wrote it, for the NOTICE.
    shown: String,
}
