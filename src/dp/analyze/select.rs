//! The parts of one SELECT: the checks of its clauses, its GROUP BY keys, its outputs, its
//! parameters and the contribution caps of the tables it reads.

use super::*;

/// The statement's parameters (`$n`), each with the type its use gave it.
pub(super) fn parameters(found: &BTreeMap<usize, (ColumnType, Option<String>)>) -> Vec<Parameter> {
    found
        .iter()
        .map(|(&index, (ty, declared))| Parameter {
            index,
            ty: *ty,
            declared: declared.clone(),
        })
        .collect()
}

/// The one SELECT of a query pgdp can analyse, with the clauses it refuses checked.
pub(super) fn single_select(query: &ast::Query) -> Result<&ast::Select> {
    if !query.locks.is_empty() {
        return Err(Error::forbidden(
            "FOR UPDATE / FOR SHARE is not allowed through pgdp",
            "",
        ));
    }
    if query.fetch.is_some() {
        return Err(Error::unsupported("FETCH FIRST", "Use LIMIT instead."));
    }
    let select = match query.body.as_ref() {
        SetExpr::Select(s) => s,
        SetExpr::SetOperation { left, .. } => {
            return Err(Error::unsupported(
                "set operations (UNION, INTERSECT, EXCEPT) inside a subquery or CTE",
                set_operation_hint(left),
            ))
        }
        _ => {
            return Err(Error::unsupported(
                "this kind of query",
                "Use SELECT … FROM … GROUP BY …",
            ))
        }
    };
    if select.distinct.is_some() {
        return Err(Error::unsupported(
            "SELECT DISTINCT",
            "Use GROUP BY with COUNT(*): distinct values are released only through DP partition selection.",
        ));
    }
    if select.into.is_some() {
        return Err(Error::forbidden(
            "SELECT INTO is not allowed through pgdp",
            "",
        ));
    }
    if select.qualify.is_some() || !select.named_window.is_empty() {
        return Err(window_refusal());
    }
    if select.top.is_some() || select.prewhere.is_some() || !select.lateral_views.is_empty() {
        return Err(Error::unsupported(
            "TOP, PREWHERE and LATERAL VIEW",
            "Write PostgreSQL SQL: LIMIT n instead of TOP n, WHERE instead of PREWHERE, a join instead of LATERAL VIEW.",
        ));
    }
    Ok(select)
}

impl<'a> Analyzer<'a> {
    /// An analyser with no table in scope yet.
    pub(super) fn new(ctx: &'a Context, ctes: Vec<(String, ast::Query)>) -> Analyzer<'a> {
        Analyzer {
            ctx,
            tables: Vec::new(),
            parameters: BTreeMap::new(),
            ctes,
            expanding: Vec::new(),
            next_alias: 0,
            view_hints: BTreeMap::new(),
            unique_keys: Vec::new(),
            unit_caps: Vec::new(),
            windows_allowed: false,
            public_rows_kept: None,
        }
    }

    /// The GROUP BY keys (each once), the analyst's expression of each, and the key each
    /// element of GROUP BY resolved to.
    pub(super) fn group_keys(
        &mut self,
        select: &ast::Select,
        group_exprs: &[Expr],
    ) -> Result<(Vec<GroupKey>, Vec<Expr>, Vec<usize>)> {
        let mut keys: Vec<GroupKey> = Vec::new();
        // The analyst's expression of each key (for the statement that types released values).
        let mut key_originals: Vec<Expr> = Vec::new();
        // The key each element of GROUP BY resolved to.
        let mut element_key: Vec<usize> = Vec::new();
        for g in group_exprs {
            // PostgreSQL reads an ambiguous GROUP BY name as the input column, not the output
            // alias (`CASE WHEN GROUPING(region) = 1 THEN 'all' ELSE region END AS region … GROUP BY
            // ROLLUP (region)` groups by the column).
            let input_column = matches!(g, Expr::Identifier(_))
                && !matches!(
                    self.expr(&mut g.clone(), Role::Key),
                    Err(Error::UnknownColumn { .. })
                );
            let resolved = |g: &Expr| -> Result<Expr> {
                if input_column {
                    Ok(g.clone())
                } else {
                    resolve_group_reference(g, &select.projection)
                }
            };
            // `EXTRACT(…)::int`: grouped by the EXTRACT, cast after the release (same groups).
            let written = resolved(g)?;
            let original = fields::integer_cast_of_whole_field(&written).unwrap_or(written);
            let mut e = original.clone();
            let info = self.expr(&mut e, Role::Key)?;
            if !info.groupable {
                return Err(Error::forbidden(
                    format!("grouping by {} is not allowed", g),
                    "Group only by columns declared groupable in the policy (and simple functions of them); never by the privacy unit.",
                ));
            }
            let text = Canonical::of(&e);
            if let Some(i) = keys.iter().position(|k| k.expr == text) {
                element_key.push(i);
                continue;
            }
            element_key.push(keys.len());
            key_originals.push(original);
            keys.push(GroupKey {
                expr: text,
                ty: info.ty.unwrap_or(ColumnType::Text),
                declared: info
                    .declared
                    .as_deref()
                    .and_then(crate::output::CellType::of_declared),
                public: info.public,
            });
        }
        Ok((keys, key_originals, element_key))
    }

    /// The select list, HAVING, ORDER BY, LIMIT and OFFSET: evaluated by pgdp when they are
    /// bare aggregates and keys, by PostgreSQL over the released values
    /// ([`post::PostProcessing`]) otherwise.
    pub(super) fn outputs(
        &mut self,
        query: &ast::Query,
        select: &ast::Select,
        keys: &[GroupKey],
        key_originals: &[Expr],
        sets: Option<&[Vec<usize>]>,
        post_processed: bool,
    ) -> Result<Outputs> {
        let (limit, offset) = limit_offset(query)?;
        let staged = post_processed
            || select.projection.iter().any(|item| match item {
                SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. } => {
                    post::needs_post_processing(e)
                }
                _ => false,
            });
        let shaped = if staged {
            Shaped::Staged(self.post_processing(query, select, keys, key_originals, sets)?)
        } else {
            match self.plain_outputs(query, select, keys, sets.is_some()) {
                Ok(p) => Shaped::Plain(p),
                // What pgdp's own evaluator cannot do, PostgreSQL may, over the released values.
                Err(refusal) => {
                    match self.post_processing(query, select, keys, key_originals, sets) {
                        Ok(s) => Shaped::Staged(s),
                        Err(_) => return Err(refusal),
                    }
                }
            }
        };
        let (aggregates, outputs, having, order_by, limit, offset, post) = match shaped {
            Shaped::Plain((aggregates, outputs, having, order_by)) => {
                (aggregates, outputs, having, order_by, limit, offset, None)
            }
            Shaped::Staged((aggregates, outputs, post)) => {
                (aggregates, outputs, None, Vec::new(), None, 0, Some(post))
            }
        };
        Ok((aggregates, outputs, having, order_by, limit, offset, post))
    }

    /// A public table's rows kept by a join must not be counted as if private (see
    /// [`check_public_rows_kept`]).
    pub(super) fn check_public_rows_kept(
        &self,
        keys: &[GroupKey],
        aggregates: &[Aggregate],
    ) -> Result<()> {
        let Some(table) = &self.public_rows_kept else {
            return Ok(());
        };
        let private: BTreeSet<String> = self
            .tables
            .iter()
            .filter(|t| t.0.private)
            .map(|t| t.0.alias.clone())
            .collect();
        check_public_rows_kept(table, &private, keys, aggregates)
    }

    /// Contribution bounds (caps and ceilings of groups and rows per unit): the loosest of the
    /// private tables joined (all share the unit).
    pub(super) fn contribution_caps(&self) -> (u64, u64, u64, u64) {
        // Contribution bounds: the loosest of the private tables joined (all share the unit).
        let policy_tables: Vec<&Table> = self
            .tables
            .iter()
            .filter(|t| t.0.private)
            .map(|t| &*t.1)
            .collect();
        let loosest = |f: fn(&crate::policy::PrivateTable) -> u64| -> u64 {
            policy_tables
                .iter()
                .filter_map(|t| t.private().map(f))
                .max()
                .unwrap_or(1)
        };
        let max_groups_per_unit = loosest(|p| p.max_groups_per_unit);
        let max_rows_per_unit = loosest(|p| p.max_rows_per_unit);
        let groups_ceiling = loosest(|p| p.groups_ceiling);
        let rows_ceiling = loosest(|p| p.rows_ceiling);
        (
            max_groups_per_unit,
            max_rows_per_unit,
            groups_ceiling,
            rows_ceiling,
        )
    }
}
