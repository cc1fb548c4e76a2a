//! FROM and JOIN: adding tables, unit paths, and the joins that keep one privacy unit per row.

use super::*;

impl<'a> Analyzer<'a> {
    pub(super) fn add_table(&mut self, factor: &TableFactor) -> Result<usize> {
        match factor {
            TableFactor::Table {
                name,
                alias,
                args,
                with_hints,
                version,
                partitions,
                sample,
                index_hints,
                ..
            } => {
                if args.is_some() {
                    return Err(Error::unsupported(
                        "table functions",
                        "Read the tables the policy lists by name: functions in FROM (generate_series, unnest, …) are not available over data; for a series of dates or numbers, group by a key such as date_trunc('month', visit_date).",
                    ));
                }
                if let Some(added) = self.add_cte(name, alias.as_ref()) {
                    return added;
                }
                if !with_hints.is_empty()
                    || version.is_some()
                    || !partitions.is_empty()
                    || sample.is_some()
                    || !index_hints.is_empty()
                {
                    return Err(Error::unsupported(
                        "table hints, samples and versions",
                        "Name the table alone (FROM demo.visits): pgdp reads every row under the policy's caps, so TABLESAMPLE, index hints, partitions and versions have no place.",
                    ));
                }
                self.add_policy_table(name, alias.as_ref())
            }
            TableFactor::Derived {
                lateral,
                subquery,
                alias,
                sample,
            } => {
                if *lateral || sample.is_some() {
                    return Err(Error::unsupported(
                        "LATERAL or sampled subqueries",
                        "Use a plain subquery in FROM that filters, projects or joins rows, or aggregates per privacy unit.",
                    ));
                }
                let visible = match alias {
                    Some(a) if !a.columns.is_empty() => {
                        return Err(Error::unsupported(
                            "column aliases on subqueries",
                            "Name the columns inside the subquery with AS.",
                        ))
                    }
                    Some(a) => ident_lower(&a.name),
                    None => {
                        return Err(Error::Syntax {
                            message: "subquery in FROM must have an alias".into(),
                        })
                    }
                };
                self.view(subquery, visible)
            }
            _ => Err(Error::unsupported(
                "this FROM item",
                "Use plain table names joined with JOIN … USING / ON.",
            )),
        }
    }

    /// A CTE named in FROM, read as a view; `None` when `name` is no CTE in scope.
    fn add_cte(
        &mut self,
        name: &ObjectName,
        alias: Option<&ast::TableAlias>,
    ) -> Option<Result<usize>> {
        let [part] = name.0.as_slice() else {
            return None;
        };
        let cte_name = part
            .as_ident()
            .map(ident_lower)
            .unwrap_or_else(|| part.to_string().to_ascii_lowercase());
        // Inside its own body a CTE's name means the table of that name (PostgreSQL without
        // RECURSIVE), so only CTEs not being expanded are looked up.
        if self.expanding.contains(&cte_name) {
            return None;
        }
        let q = self
            .ctes
            .iter()
            .find(|(n, _)| *n == cte_name)
            .map(|(_, q)| q.clone())?;
        let visible = match alias {
            Some(a) if !a.columns.is_empty() => {
                return Some(Err(Error::unsupported(
                    "column aliases on tables",
                    COLUMN_ALIASES_HINT,
                )))
            }
            Some(a) => ident_lower(&a.name),
            None => cte_name.clone(),
        };
        self.expanding.push(cte_name);
        let r = self.view(&q, visible);
        self.expanding.pop();
        Some(r)
    }

    /// A table of the policy named in FROM (a private table with a unit path read as a view).
    fn add_policy_table(
        &mut self,
        name: &ObjectName,
        alias: Option<&ast::TableAlias>,
    ) -> Result<usize> {
        let table = self.find_table(name)?;
        if self.tables.len() >= JOINED_TABLES_MAX {
            return Err(Error::LimitExceeded {
                what: "the number of joined tables".into(),
                limit: JOINED_TABLES_MAX as u64,
            });
        }
        let visible = match alias {
            Some(a) => {
                if !a.columns.is_empty() {
                    return Err(Error::unsupported(
                        "column aliases on tables",
                        COLUMN_ALIASES_HINT,
                    ));
                }
                ident_lower(&a.name)
            }
            None => table.name.clone(),
        };
        if visible.starts_with(RESERVED_PREFIX) {
            return Err(reserved_refusal());
        }
        if self.tables.iter().any(|t| t.2 == visible) {
            return Err(Error::Syntax {
                message: format!("table name \"{visible}\" specified more than once"),
            });
        }
        if let Some(path) = table.private().and_then(|p| p.unit_path.as_ref()) {
            let (query, owned) = self.key_path_view(table, path)?;
            let r = TableRef {
                table: table.qualified_name(),
                alias: self.fresh_alias(),
                private: true,
                source: Some(Box::new(query)),
                nullable: false,
            };
            self.tables.push((r, Cow::Owned(owned), visible));
            return Ok(self.tables.len() - 1);
        }
        let r = TableRef {
            table: table.qualified_name(),
            alias: self.fresh_alias(),
            private: matches!(table.kind, TableKind::Private(_)),
            source: None,
            nullable: false,
        };
        self.tables.push((r, Cow::Borrowed(table), visible));
        Ok(self.tables.len() - 1)
    }

    /// A table whose rows reach their privacy unit through a unit path is read as a subquery
    /// that follows the path with inner joins and carries the unit under its own name
    /// (docs/privacy.md, "Tables with a unit path"):
    /// `SELECT t0.*, tN.unit FROM t t0 JOIN r1 t1 ON t0.c1 = t1.k1 … JOIN rN tN ON …`.
    /// Each key is unique upstream (recorded in [`Plan::unique_keys`] and verified before the
    /// plan runs), so each row meets at most one row of each referenced table and has at most
    /// one unit; a row whose chain is broken meets none and is not read. The subquery is then a
    /// private table with a privacy unit column like any other, with the table's own caps.
    pub(super) fn key_path_view(
        &mut self,
        table: &Table,
        path: &UnitPath,
    ) -> Result<(ast::Query, Table)> {
        // Fresh aliases, distinct from every other table of the query.
        let aliases: Vec<String> = (0..=path.steps.len()).map(|_| self.fresh_alias()).collect();
        let alias = |i: usize| aliases[i].clone();
        let mut items: Vec<String> = table
            .columns
            .iter()
            .map(|c| format!("{} AS \"{}\"", canonical(&alias(0), &c.name), c.name))
            .collect();
        items.push(format!(
            "{} AS \"{}\"",
            canonical(&alias(path.steps.len()), &path.unit),
            path.unit
        ));
        let mut from = format!(
            "\"{}\".\"{}\" AS \"{}\"",
            table.schema,
            table.name,
            alias(0)
        );
        for (i, step) in path.steps.iter().enumerate() {
            let (schema, name) = step
                .references
                .split_once('.')
                .ok_or_else(|| Error::internal("unqualified table in a unit path"))?;
            from.push_str(&format!(
                " JOIN \"{schema}\".\"{name}\" AS \"{}\" ON {} = {}",
                alias(i + 1),
                canonical(&alias(i), &step.column),
                canonical(&alias(i + 1), &step.key)
            ));
            let key = (step.references.clone(), step.key.clone());
            if !self.unique_keys.contains(&key) {
                self.unique_keys.push(key);
            }
        }
        let sql = format!("SELECT {} FROM {from}", items.join(", "));
        let dialect = sqlparser::dialect::PostgreSqlDialect {};
        let statements = sqlparser::parser::Parser::parse_sql(&dialect, &sql)
            .map_err(|e| Error::internal(format!("unit path SQL does not parse: {e}")))?;
        let query = match statements.into_iter().next() {
            Some(ast::Statement::Query(q)) => *q,
            _ => return Err(Error::internal("unit path SQL is not a query")),
        };
        let caps = table
            .private()
            .ok_or_else(|| Error::internal("unit path on a public table"))?;
        let mut owned = table.clone();
        owned.columns.push(Column {
            name: path.unit.clone(),
            ty: ColumnType::parse(&path.unit_type).unwrap_or(ColumnType::Integer),
            declared_type: path.unit_type.clone(),
            bounds: None,
            upper_ceiling: None,
            groupable: false,
            public_values: None,
            exhaustive: false,
        });
        owned.kind = TableKind::Private(PrivateTable {
            privacy_unit: Some(path.unit.clone()),
            unit_path: Some(path.clone()),
            max_groups_per_unit: caps.max_groups_per_unit,
            max_rows_per_unit: caps.max_rows_per_unit,
            groups_ceiling: caps.groups_ceiling,
            rows_ceiling: caps.rows_ceiling,
            unique_keys: caps.unique_keys.clone(),
        });
        Ok((query, owned))
    }

    /// Whether `a.ac = b.bc` is the first step of table `a`'s unit path, with `b` the policy
    /// table it references: then each row of `a` meets exactly its own parent row, which has the
    /// same privacy unit.
    pub(super) fn is_path_step(&self, a: usize, ac: &str, b: usize, bc: &str) -> bool {
        let Some(step) = self.tables[a]
            .1
            .private()
            .and_then(|p| p.unit_path.as_ref())
            .and_then(|path| path.steps.first())
        else {
            return false;
        };
        let (bref, btable, _) = &self.tables[b];
        // A subquery is never the referenced table, whatever its alias: only the policy table
        // (or its own unit-path reading) has the unique key.
        let policy_table = bref.source.is_none()
            || btable
                .private()
                .is_some_and(|p| p.unit_path.is_some() && p.privacy_unit.is_some());
        step.column == ac
            && step.key == bc
            && bref.private
            && bref.table == step.references
            && policy_table
    }

    /// Resolves FROM and returns one canonical join condition per joined table.
    pub(super) fn resolve_from(&mut self, from: &[ast::TableWithJoins]) -> Result<Vec<JoinOn>> {
        let [twj] = from else {
            return Err(if from.is_empty() {
                Error::unsupported(
                    "queries without FROM over data",
                    "Aggregate in the query's own FROM, e.g. SELECT COUNT(*) FROM demo.people instead of SELECT (SELECT COUNT(*) FROM demo.people); instead of SELECT EXISTS (…), count the rows (SELECT COUNT(*) FROM … WHERE …) and compare the noisy count.",
                )
            } else {
                Error::unsupported(
                    "comma-separated FROM lists",
                    "Write the join explicitly: FROM a JOIN b USING (person_id).",
                )
            });
        };
        self.add_table(&twj.relation)?;
        let mut conditions = Vec::new();
        for join in &twj.joins {
            let (constraint, mut left) = match &join.join_operator {
                JoinOperator::Join(c) | JoinOperator::Inner(c) => (c, false),
                JoinOperator::Left(c) | JoinOperator::LeftOuter(c) => (c, true),
                _ => {
                    return Err(Error::unsupported(
                        "right, full, cross, semi and anti joins",
                        "Use an inner JOIN on the privacy unit, or an inner or LEFT JOIN of a public table.",
                    ))
                }
            };
            let right = self.add_table(&join.relation)?;
            if left {
                // The optional side is a public policy table, or a private policy table with a
                // privacy unit column joined on the unit (check_join below): each joined row
                // is then the left row of one unit with at most that unit's own right rows,
                // exactly as in the inner join, and a left row without a match keeps its own
                // unit (the plan's unit is the first private table's). A subquery's rows are
                // not known to be either.
                let (r, table, visible) = &self.tables[right];
                let unit_keyed = r.private
                    && table
                        .private()
                        .is_some_and(|p| p.privacy_unit.is_some() && p.unit_path.is_none());
                if r.source.is_some() || (r.private && !unit_keyed) {
                    return Err(Error::unsupported(
                        format!("a LEFT JOIN of {visible}"),
                        "LEFT JOIN a public table (FROM demo.people p LEFT JOIN demo.regions r ON r.region = p.region), or a private table with a privacy unit column on that unit (FROM demo.visits v LEFT JOIN demo.people p ON p.person_id = v.person_id).",
                    ));
                }
                if r.private && !(0..right).any(|i| self.tables[i].0.private) {
                    // Public rows kept, private rows joined to them: every public row is a group
                    // (the keys' public domain), so the rows that reach an aggregate are those
                    // of the inner join; what differs (the NULL-extended rows) is refused after
                    // the select list is read (`check_public_rows_kept`).
                    self.public_rows_kept = Some(visible.clone());
                    left = false;
                } else {
                    self.tables[right].0.nullable = true;
                }
            }
            let condition = match constraint {
                JoinConstraint::Using(names) => {
                    let mut parts = Vec::new();
                    for n in names {
                        let col =
                            n.0.last()
                                .and_then(|p| p.as_ident())
                                .map(ident_lower)
                                .unwrap_or_default();
                        let left = (0..right)
                            .find(|&i| self.tables[i].1.column(&col).is_some())
                            .ok_or_else(|| Error::UnknownColumn { name: col.clone() })?;
                        if self.tables[right].1.column(&col).is_none() {
                            return Err(Error::UnknownColumn { name: col.clone() });
                        }
                        parts.push((left, col.clone(), right, col));
                    }
                    parts
                }
                JoinConstraint::On(e) => self.equi_join(e, right)?,
                JoinConstraint::Natural => {
                    return Err(Error::unsupported(
                        "NATURAL JOIN",
                        "Use JOIN … USING (column).",
                    ))
                }
                JoinConstraint::None => {
                    return Err(Error::unsupported(
                        "joins without a condition",
                        "Use JOIN … USING (column).",
                    ))
                }
            };
            let mut condition = condition;
            self.check_join(&mut condition, right)?;
            let on = condition
                .iter()
                .map(|(l, lc, r, rc)| {
                    (
                        ColumnRef::new(&self.tables[*l].0.alias, lc),
                        ColumnRef::new(&self.tables[*r].0.alias, rc),
                    )
                })
                .collect();
            conditions.push(JoinOn { on, left });
        }
        Ok(conditions)
    }

    /// `a.x = b.y [AND …]` between the new table and earlier ones.
    pub(super) fn equi_join(
        &self,
        e: &Expr,
        right: usize,
    ) -> Result<Vec<(usize, String, usize, String)>> {
        let bad = || {
            Error::unsupported(
                "join conditions other than column equalities",
                "Join with ON a.col = b.col (AND …) or USING (col).",
            )
        };
        match e {
            Expr::Nested(inner) => self.equi_join(inner, right),
            Expr::BinaryOp {
                left,
                op: BinaryOperator::And,
                right: r,
            } => {
                let mut v = self.equi_join(left, right)?;
                v.extend(self.equi_join(r, right)?);
                Ok(v)
            }
            Expr::BinaryOp {
                left,
                op: BinaryOperator::Eq,
                right: r,
            } => {
                let (lt, lc) = self.column_ref(left)?.ok_or_else(bad)?;
                let (rt, rc) = self.column_ref(r)?.ok_or_else(bad)?;
                match (lt == right, rt == right) {
                    (false, true) => Ok(vec![(lt, lc, rt, rc)]),
                    (true, false) => Ok(vec![(rt, rc, lt, lc)]),
                    _ => Err(bad()),
                }
            }
            _ => Err(bad()),
        }
    }

    /// Private tables join only on their privacy units; public tables join on anything. A table
    /// with a unit path also joins the table its path starts with on that first step (e.g.
    /// `prescriptions JOIN visits USING (visit_id)`): the rows joined have the same unit, and the
    /// equality of the units is added to the condition so the plan has the usual shape.
    pub(super) fn check_join(
        &self,
        condition: &mut Vec<(usize, String, usize, String)>,
        right: usize,
    ) -> Result<()> {
        let (rref, rtable, _) = &self.tables[right];
        if !rref.private {
            return Ok(());
        }
        let unit_of = |t: &Table| t.private().and_then(|p| p.privacy_unit.clone());
        let Some(runit) = unit_of(rtable) else {
            return Err(Error::unsupported(
                "joins with a row-level private table",
                "Query a row-level table on its own, or join it only with public tables.",
            ));
        };
        let earlier_private = (0..right).filter(|&i| self.tables[i].0.private).count();
        if earlier_private == 0 {
            return Ok(());
        }
        let path_join = condition.iter().find_map(|(l, lc, r, rc)| {
            (self.is_path_step(*l, lc, *r, rc) || self.is_path_step(*r, rc, *l, lc)).then_some(*l)
        });
        if let Some(l) = path_join {
            if let Some(lunit) = unit_of(&self.tables[l].1) {
                condition.push((l, lunit, right, runit.clone()));
            }
        }
        let path_step = (0..=right).find_map(|i| {
            self.tables[i]
                .1
                .private()
                .and_then(|p| p.unit_path.as_ref())
                .and_then(|p| p.steps.first())
                .map(|s| (self.tables[i].0.table.clone(), s.clone()))
        });
        let ok = condition.iter().any(|(l, lc, _, rc)| {
            let lt: &Table = &self.tables[*l].1;
            self.tables[*l].0.private && unit_of(lt).as_deref() == Some(lc.as_str()) && rc == &runit
        });
        if ok {
            Ok(())
        } else {
            Err(Error::forbidden(
                "two private tables may be joined only on their privacy unit",
                match path_step {
                    Some((t, step)) => format!(
                        "Join on the privacy unit, e.g. JOIN {} USING ({runit}), or join {t} with {} ON {t}.{} = {}.{} (the first step of its unit path).",
                        rref.table, step.references, step.column, step.references, step.key
                    ),
                    None => format!(
                        "Join on the privacy unit, e.g. JOIN {} USING ({runit}).",
                        rref.table
                    ),
                },
            ))
        }
    }

    /// A bare or qualified column reference: (table index, column name).
    pub(super) fn column_ref(&self, e: &Expr) -> Result<Option<(usize, String)>> {
        match e {
            // Prisma writes its relation joins `ON ("j0"."person_id") = ("t"."person_id")`.
            Expr::Nested(inner) => self.column_ref(inner),
            Expr::Identifier(id) => {
                let col = ident_lower(id);
                let hits: Vec<usize> = (0..self.tables.len())
                    .filter(|&i| self.tables[i].1.column(&col).is_some())
                    .collect();
                match hits.as_slice() {
                    [] => Err(Error::UnknownColumn {
                        name: id.value.clone(),
                    }),
                    [i] => Ok(Some((*i, col))),
                    [i, ..] => {
                        // Columns equated by a join (e.g. USING (person_id)) are the same value:
                        // the first table's is taken. Others are ambiguous.
                        let is_unit = hits.iter().all(|&h| {
                            self.tables[h]
                                .1
                                .private()
                                .and_then(|p| p.privacy_unit.as_deref())
                                == Some(col.as_str())
                        });
                        if is_unit {
                            Ok(Some((*i, col)))
                        } else {
                            Err(Error::Syntax {
                                message: format!("column reference \"{col}\" is ambiguous"),
                            })
                        }
                    }
                }
            }
            Expr::CompoundIdentifier(parts) => {
                let names: Vec<String> = parts.iter().map(ident_lower).collect();
                let (qualifier, col) = match names.as_slice() {
                    [t, c] => (t.clone(), c.clone()),
                    [s, t, c] => (format!("{s}.{t}"), c.clone()),
                    _ => {
                        return Err(Error::UnknownColumn {
                            name: e.to_string(),
                        })
                    }
                };
                let idx = self
                    .tables
                    .iter()
                    .position(|(r, t, visible)| {
                        visible == &qualifier
                            || r.table == qualifier
                            || (qualifier == t.name && visible == &t.name)
                    })
                    .ok_or_else(|| Error::UnknownTable {
                        name: qualifier.clone(),
                    })?;
                if col.starts_with(RESERVED_PREFIX) {
                    return Err(reserved_refusal());
                }
                if matches!(
                    col.as_str(),
                    "ctid" | "xmin" | "xmax" | "cmin" | "cmax" | "tableoid"
                ) {
                    return Err(Error::forbidden(
                        "system columns are not available through pgdp",
                        "",
                    ));
                }
                if self.tables[idx].1.column(&col).is_none() {
                    return Err(Error::UnknownColumn { name: col });
                }
                Ok(Some((idx, col)))
            }
            _ => Ok(None),
        }
    }

    pub(super) fn unit(&self) -> Result<Unit> {
        let private: Vec<&(TableRef, Cow<Table>, String)> =
            self.tables.iter().filter(|t| t.0.private).collect();
        let first = private
            .first()
            .ok_or_else(|| Error::internal("no private table"))?;
        match first.1.private().and_then(|p| p.privacy_unit.clone()) {
            Some(u) => Ok(Unit::Column(ColumnRef::new(&first.0.alias, &u))),
            None => {
                if private.len() > 1 {
                    return Err(Error::unsupported(
                        "joins of row-level private tables",
                        "Query each row-level private table on its own, joined to public tables only; a join of private tables needs a privacy unit column in both (privacy_unit in the policy).",
                    ));
                }
                Ok(Unit::Row {
                    alias: first.0.alias.clone(),
                })
            }
        }
    }
}

/// The refusal of `SELECT [NOT] EXISTS (SELECT … FROM … WHERE …)` over data: whether any row
/// matches is a fact about the people whose rows match (one person decides it), which no noise
/// makes private, and a noisy count compared with 0 answers it no better than the count. The
/// hint shows the count of the same rows, built from the subquery's own FROM and WHERE, so
/// its rewrite asks the same question; `None` for a statement of another shape.
pub(super) fn exists_without_from(select: &ast::Select) -> Option<Error> {
    if !select.from.is_empty() {
        return None;
    }
    let subquery = select.projection.iter().find_map(|item| {
        let e = match item {
            SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. } => e,
            _ => return None,
        };
        let mut e = e;
        while let Expr::Nested(inner) | Expr::UnaryOp { expr: inner, .. } = e {
            e = inner.as_ref();
        }
        match e {
            Expr::Exists { subquery, .. } => Some(subquery),
            _ => None,
        }
    })?;
    // The same rows counted: the subquery's FROM and WHERE under COUNT(*), when it is a plain
    // SELECT (a correlated, grouped or combined one has no such one-line count).
    let count = match subquery.body.as_ref() {
        SetExpr::Select(inner)
            if subquery.with.is_none()
                && !inner.from.is_empty()
                && inner.having.is_none()
                && matches!(&inner.group_by, GroupByExpr::Expressions(e, m) if e.is_empty() && m.is_empty()) =>
        {
            let from: Vec<String> = inner.from.iter().map(ToString::to_string).collect();
            let mut count = format!("SELECT COUNT(*) FROM {}", from.join(", "));
            if let Some(w) = &inner.selection {
                count.push_str(&format!(" WHERE {w}"));
            }
            count
        }
        _ => "SELECT COUNT(*) FROM … WHERE …".to_string(),
    };
    // Literals as the analyst wrote them (classification dollar-quotes them).
    let count = crate::literal::for_display(&count);
    Some(Error::forbidden(
        "EXISTS over data: whether any row matches can hinge on one person, and is not released",
        format!("Count the rows instead and read the noisy count (a count near 0 means few or none): {count}"),
    ))
}
