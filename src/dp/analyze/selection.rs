//! `SELECT COUNT(*) FROM (SELECT <columns> FROM t WHERE p) AS s` as `SELECT COUNT(*) FROM t
//! WHERE p`: how ORMs count the rows of a filtered selection (SQLAlchemy's `Query.count()`,
//! Prisma's `count()`, which adds `OFFSET 0`), and `COUNT(s.c)` of one of its columns as
//! `COUNT(<c as the subquery lists it>)` (Prisma's `count({ select: { c: true } })`).
//!
//! The two statements count the same rows on every database: the subquery returns one row per
//! row of `t` that passes `p` (its select list is plain columns of `t`: no aggregate, no
//! set-returning function, no DISTINCT, no LIMIT; an OFFSET of 0 and an ORDER BY choose no
//! rows), and the outer query reads nothing but their number, or the number of them whose
//! column `c` is not NULL, which is the value of the column of `t` the subquery lists as `c`.
//! So the flattened statement means what the analyst's SQL means, and it is analysed like any
//! count (a synopsis may answer it).
//!
//! `SELECT COUNT(*) FROM (SELECT DISTINCT k1, … FROM … WHERE p) AS s` and `SELECT COUNT(*) FROM
//! (SELECT k1, …, <aggregates> FROM … WHERE p GROUP BY k1, …) AS s` as `SELECT COUNT(DISTINCT
//! ROW(k1, …)) FROM … WHERE p`: how ORMs count groups (SQLAlchemy's `query(k).distinct().count()`
//! and `query(k).group_by(k).count()`, Django's `values(k).distinct().count()` and
//! `values(k).annotate(…).count()`). Both count the distinct key tuples of the rows `p` keeps,
//! NULL included: a GROUP BY and a DISTINCT make one group of the rows whose key is NULL, and
//! `ROW(k)` is a value that is never NULL itself whose equality treats NULL fields as equal, so
//! `COUNT(DISTINCT ROW(…))` counts that group too (a plain `COUNT(DISTINCT k)` would not). The
//! subquery's other select items are aggregates, or keys again, which make no group of their
//! own; a HAVING, a grouping set, a DISTINCT ON, a LIMIT or a set-returning item would change
//! the groups and leaves the statement as it is.
//!
//! Invariant: a statement is flattened only in that exact shape, and only when each column the
//! subquery lists is a declared column of the policy table it reads (so a statement PostgreSQL
//! would refuse for an unknown column is refused as before, by the ordinary analysis), and
//! each `c` the outer query counts names exactly one column of the subquery (a name PostgreSQL
//! would call ambiguous or unknown is left to the ordinary analysis). Anything else is left as
//! it is.

use super::aggregate::row_constructor;
use super::*;

/// The flattened statement, if `query` has the shape above.
pub(super) fn count_over_selection(query: &ast::Query, ctx: &Context) -> Option<ast::Query> {
    let (outer, subquery, alias) = outer_count(query)?;
    let inner = plain_selection(subquery, ctx)?;
    let derived = alias.as_ref().map(|a| ident_lower(&a.name));
    let projection = counts(outer, |count| match count_argument(count)? {
        None => Some(count.clone()),
        Some(column) => {
            let listed = listed_column(column, derived.as_deref(), inner, ctx)?;
            let mut count = count.clone();
            set_count_argument(&mut count, listed);
            Some(count)
        }
    })?;
    flattened(query, projection, inner)
}

/// The flattened count of groups, if `query` has the second shape above.
pub(super) fn count_of_groups(query: &ast::Query) -> Option<ast::Query> {
    let (outer, subquery, _) = outer_count(query)?;
    if subquery.with.is_some()
        || !subquery.locks.is_empty()
        || subquery.fetch.is_some()
        || !selects_every_row(subquery)
    {
        return None;
    }
    let SetExpr::Select(inner) = subquery.body.as_ref() else {
        return None;
    };
    if inner.from.is_empty() || inner.having.is_some() || !plain_select_shape(inner) {
        return None;
    }
    let row = row_constructor(group_keys(inner)?);
    let projection = counts(outer, |count| {
        let None = count_argument(count)? else {
            return None;
        };
        let mut count = count.clone();
        if let Expr::Function(f) = &mut count {
            f.args = FunctionArguments::List(ast::FunctionArgumentList {
                duplicate_treatment: Some(ast::DuplicateTreatment::Distinct),
                args: vec![FunctionArg::Unnamed(FunctionArgExpr::Expr(row.clone()))],
                clauses: Vec::new(),
            });
        }
        Some(count)
    })?;
    flattened(query, projection, inner)
}

/// The outer query of both shapes: `SELECT <counts> FROM (<subquery>) [AS s]`, with no WITH,
/// lock, WHERE, GROUP BY, HAVING or DISTINCT and no column aliases on the subquery: its
/// select, the subquery and its alias.
fn outer_count(
    query: &ast::Query,
) -> Option<(&ast::Select, &ast::Query, &Option<ast::TableAlias>)> {
    if query.with.is_some() || !query.locks.is_empty() {
        return None;
    }
    let SetExpr::Select(outer) = query.body.as_ref() else {
        return None;
    };
    let (subquery, alias) = super::outer::one_derived_table(outer)?;
    if outer.projection.is_empty()
        || outer.selection.is_some()
        || !ungrouped(outer)
        || outer.having.is_some()
        || outer.distinct.is_some()
        || !plain_select_shape(outer)
        || alias.as_ref().is_some_and(|a| !a.columns.is_empty())
    {
        return None;
    }
    Some((outer, subquery, alias))
}

/// The outer select list with each count rewritten by `count` (its aliases kept); `None` when
/// an item is not a count it rewrites.
fn counts(outer: &ast::Select, count: impl Fn(&Expr) -> Option<Expr>) -> Option<Vec<SelectItem>> {
    outer
        .projection
        .iter()
        .map(|item| match item {
            SelectItem::UnnamedExpr(e) => Some(SelectItem::UnnamedExpr(count(e)?)),
            SelectItem::ExprWithAlias { expr, alias } => Some(SelectItem::ExprWithAlias {
                expr: count(expr)?,
                alias: alias.clone(),
            }),
            _ => None,
        })
        .collect()
}

/// `query` with the counts of `projection` over the FROM and WHERE of `inner`.
fn flattened(
    query: &ast::Query,
    projection: Vec<SelectItem>,
    inner: &ast::Select,
) -> Option<ast::Query> {
    let mut flattened = query.clone();
    let SetExpr::Select(target) = flattened.body.as_mut() else {
        return None;
    };
    target.projection = projection;
    target.from = inner.from.clone();
    target.selection = inner.selection.clone();
    Some(flattened)
}

/// Whether `select` has no GROUP BY.
fn ungrouped(select: &ast::Select) -> bool {
    matches!(&select.group_by, GroupByExpr::Expressions(e, m) if e.is_empty() && m.is_empty())
}

/// The keys whose distinct tuples are the rows of `inner`: its select list under `SELECT
/// DISTINCT` (no aggregate, no window), or its GROUP BY list (positions read as the select
/// items they number; no grouping set) when every select item is a key again or an aggregate.
fn group_keys(inner: &ast::Select) -> Option<Vec<Expr>> {
    let items: Vec<&Expr> = inner
        .projection
        .iter()
        .map(|item| match item {
            SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. } => Some(e),
            _ => None,
        })
        .collect::<Option<_>>()?;
    if items.is_empty() || items.iter().any(|e| contains_window(e)) {
        return None;
    }
    match (&inner.distinct, &inner.group_by) {
        (Some(ast::Distinct::Distinct), _) if ungrouped(inner) => {
            if items.iter().any(|e| contains_aggregate(e)) {
                return None;
            }
            Some(items.into_iter().cloned().collect())
        }
        (None, GroupByExpr::Expressions(listed, modifiers))
            if !listed.is_empty() && modifiers.is_empty() =>
        {
            let aliases: Vec<(String, &Expr)> = inner
                .projection
                .iter()
                .filter_map(|item| match item {
                    SelectItem::ExprWithAlias { expr, alias } => Some((ident_lower(alias), expr)),
                    _ => None,
                })
                .collect();
            let mut keys: Vec<Expr> = Vec::with_capacity(listed.len());
            for key in listed {
                let key = match key {
                    Expr::Value(v) => {
                        let ast::Value::Number(n, _) = &v.value else {
                            return None;
                        };
                        let position: usize = n.parse().ok()?;
                        (*items.get(position.checked_sub(1)?)?).clone()
                    }
                    // A name that is also an output alias of something else: PostgreSQL
                    // would group by the input column if there is one, else by the alias.
                    Expr::Identifier(name)
                        if aliases.iter().any(|(a, e)| {
                            *a == ident_lower(name) && e.to_string() != key.to_string()
                        }) =>
                    {
                        return None
                    }
                    Expr::Rollup(_) | Expr::Cube(_) | Expr::GroupingSets(_) | Expr::Tuple(_) => {
                        return None
                    }
                    Expr::Function(f)
                        if function_name(&f.name).is_ok_and(|n| {
                            matches!(n.as_str(), "rollup" | "cube" | "grouping")
                        }) =>
                    {
                        return None
                    }
                    other => other.clone(),
                };
                if contains_aggregate(&key) || contains_window(&key) {
                    return None;
                }
                keys.push(key);
            }
            let printed: Vec<String> = keys.iter().map(|k| k.to_string()).collect();
            let only_keys_and_aggregates = items
                .iter()
                .all(|e| printed.contains(&e.to_string()) || aggregate_call(e));
            only_keys_and_aggregates.then_some(keys)
        }
        _ => None,
    }
}

/// Whether `e` is one call of an aggregate (not over a window): one value per group.
fn aggregate_call(e: &Expr) -> bool {
    matches!(e, Expr::Function(f) if f.over.is_none()
        && function_name(&f.name).is_ok_and(|n| aggregate_kind(&n).is_some()))
}

/// `COUNT(*)` (`Some(None)`) or `COUNT(x)` (`Some(Some(x))`): no DISTINCT, FILTER, OVER or
/// WITHIN GROUP.
fn count_argument(e: &Expr) -> Option<Option<&Expr>> {
    let Expr::Function(f) = e else {
        return None;
    };
    let FunctionArguments::List(list) = &f.args else {
        return None;
    };
    let plain = f.name.to_string().eq_ignore_ascii_case("count")
        && f.filter.is_none()
        && f.over.is_none()
        && f.within_group.is_empty()
        && f.null_treatment.is_none()
        && list.duplicate_treatment.is_none()
        && list.clauses.is_empty();
    if !plain {
        return None;
    }
    match list.args.as_slice() {
        [FunctionArg::Unnamed(FunctionArgExpr::Wildcard)] => Some(None),
        [FunctionArg::Unnamed(FunctionArgExpr::Expr(x))] => Some(Some(x)),
        _ => None,
    }
}

/// Replaces the argument of a `COUNT(x)` that [`count_argument`] accepted.
fn set_count_argument(count: &mut Expr, argument: Expr) {
    if let Expr::Function(f) = count {
        if let FunctionArguments::List(list) = &mut f.args {
            list.args = vec![FunctionArg::Unnamed(FunctionArgExpr::Expr(argument))];
        }
    }
}

/// The expression the subquery `inner` lists as the column `column` of the outer query names
/// (`c` or `<derived>.c`), when exactly one of its select items has that name; a `*` lists
/// every declared column of its table, by its name.
fn listed_column(
    column: &Expr,
    derived: Option<&str>,
    inner: &ast::Select,
    ctx: &Context,
) -> Option<Expr> {
    let name = match column {
        Expr::Identifier(c) => ident_lower(c),
        Expr::CompoundIdentifier(parts) => match parts.as_slice() {
            [q, c] if derived == Some(ident_lower(q).as_str()) => ident_lower(c),
            _ => return None,
        },
        _ => return None,
    };
    let mut found = Vec::new();
    for item in &inner.projection {
        match item {
            SelectItem::ExprWithAlias { expr, alias } if ident_lower(alias) == name => {
                found.push(expr.clone());
            }
            SelectItem::UnnamedExpr(e @ Expr::Identifier(c)) if ident_lower(c) == name => {
                found.push(e.clone());
            }
            SelectItem::UnnamedExpr(e @ Expr::CompoundIdentifier(parts))
                if parts.last().is_some_and(|c| ident_lower(c) == name) =>
            {
                found.push(e.clone());
            }
            SelectItem::Wildcard(_) => {
                let [from] = inner.from.as_slice() else {
                    return None;
                };
                let TableFactor::Table { name: table, .. } = &from.relation else {
                    return None;
                };
                let table = Analyzer::new(ctx, Vec::new()).find_table(table).ok()?;
                if table.column(&name).is_some() {
                    found.push(Expr::Identifier(Ident::with_quote('"', name.clone())));
                }
            }
            _ => {}
        }
    }
    match found.as_slice() {
        [one] => Some(one.clone()),
        _ => None,
    }
}

/// No clause beyond SELECT, FROM, WHERE, GROUP BY, HAVING and DISTINCT (checked by the callers).
fn plain_select_shape(select: &ast::Select) -> bool {
    select.into.is_none()
        && select.qualify.is_none()
        && select.named_window.is_empty()
        && select.top.is_none()
        && select.prewhere.is_none()
        && select.lateral_views.is_empty()
}

/// The subquery's SELECT if it lists plain declared columns of one policy table, with at most a
/// WHERE, and selects every row it finds.
fn plain_selection<'q>(q: &'q ast::Query, ctx: &Context) -> Option<&'q ast::Select> {
    if q.with.is_some() || !q.locks.is_empty() || q.fetch.is_some() || !selects_every_row(q) {
        return None;
    }
    let SetExpr::Select(select) = q.body.as_ref() else {
        return None;
    };
    let ungrouped =
        matches!(&select.group_by, GroupByExpr::Expressions(e, m) if e.is_empty() && m.is_empty());
    let [from] = select.from.as_slice() else {
        return None;
    };
    let TableFactor::Table {
        name, alias, args, ..
    } = &from.relation
    else {
        return None;
    };
    if !ungrouped
        || select.having.is_some()
        || select.distinct.is_some()
        || !plain_select_shape(select)
        || !from.joins.is_empty()
        || args.is_some()
        || alias.as_ref().is_some_and(|a| !a.columns.is_empty())
    {
        return None;
    }
    let table = Analyzer::new(ctx, Vec::new()).find_table(name).ok()?;
    // The names a column may be qualified with: the alias, or the table's name as written.
    let qualifier: Vec<String> = match alias {
        Some(a) => vec![ident_lower(&a.name)],
        None => name
            .0
            .iter()
            .map(|p| p.as_ident().map(ident_lower))
            .collect::<Option<Vec<String>>>()?,
    };
    let declared = |column: &Ident| table.column(&ident_lower(column)).is_some();
    let qualified = |parts: &[Ident]| {
        let parts: Vec<String> = parts.iter().map(ident_lower).collect();
        !parts.is_empty() && qualifier.ends_with(&parts)
    };
    let listed = select.projection.iter().all(|item| match item {
        SelectItem::Wildcard(_) => true,
        SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. } => match e {
            Expr::Identifier(column) => declared(column),
            Expr::CompoundIdentifier(parts) => match parts.split_last() {
                Some((column, qualifiers)) => declared(column) && qualified(qualifiers),
                None => false,
            },
            _ => false,
        },
        _ => false,
    });
    listed.then_some(select.as_ref())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `sql` as pgdp's parser prints it (string literals dollar-quoted).
    fn printed(sql: &str) -> String {
        crate::session::classify::classify(sql)
            .expect("parses")
            .pop()
            .map(|s| match s {
                crate::session::classify::Statement::Query(q) => q.to_string(),
                _ => panic!("not a query"),
            })
            .expect("one statement")
    }

    fn flattened(sql: &str) -> Option<String> {
        let policy = crate::policy::parse(include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/policies/demo.yaml"
        )))
        .expect("policy");
        let ctx = Context {
            policy: &policy,
            search_path: vec!["demo".to_string()],
        };
        let query = match crate::session::classify::classify(sql)
            .expect("parses")
            .pop()
        {
            Some(crate::session::classify::Statement::Query(q)) => q,
            _ => panic!("not a query"),
        };
        count_over_selection(&query, &ctx).map(|q| q.to_string())
    }

    fn grouped(sql: &str) -> Option<String> {
        let query = match crate::session::classify::classify(sql)
            .expect("parses")
            .pop()
        {
            Some(crate::session::classify::Statement::Query(q)) => q,
            _ => panic!("not a query"),
        };
        count_of_groups(&query).map(|q| q.to_string())
    }

    #[test]
    fn an_orms_count_of_groups_is_the_count_of_distinct_key_tuples_null_included() {
        // SQLAlchemy's query(k).distinct().count() and query(k).group_by(k).count().
        assert_eq!(
            grouped("SELECT count(*) AS count_1 FROM (SELECT DISTINCT demo.visits.clinic AS demo_visits_clinic FROM demo.visits WHERE demo.visits.cost > 10) AS anon_1"),
            Some(printed("SELECT count(DISTINCT ROW(demo.visits.clinic)) AS count_1 FROM demo.visits WHERE demo.visits.cost > 10"))
        );
        assert_eq!(
            grouped("SELECT count(*) AS count_1 FROM (SELECT demo.visits.clinic AS demo_visits_clinic, demo.visits.diagnosis AS d FROM demo.visits GROUP BY demo.visits.clinic, demo.visits.diagnosis) AS anon_1"),
            Some(printed("SELECT count(DISTINCT ROW(demo.visits.clinic, demo.visits.diagnosis)) AS count_1 FROM demo.visits"))
        );
        // Django's values(k).annotate(n=Count(…)).count(): positions, an aggregate item.
        assert_eq!(
            grouped(
                r#"SELECT COUNT(*) FROM (SELECT "visits"."clinic" AS "col1", COUNT("visits"."visit_id") AS "n" FROM "demo"."visits" GROUP BY 1) subquery"#
            ),
            Some(printed(
                r#"SELECT COUNT(DISTINCT ROW("visits"."clinic")) FROM "demo"."visits""#
            ))
        );
        // A join and an expression key.
        assert_eq!(
            grouped("SELECT COUNT(*) FROM (SELECT DISTINCT p.region, date_trunc('month', v.visit_date) FROM demo.visits v JOIN demo.people p ON p.person_id = v.person_id) s"),
            Some(printed("SELECT COUNT(DISTINCT ROW(p.region, date_trunc('month', v.visit_date))) FROM demo.visits v JOIN demo.people p ON p.person_id = v.person_id"))
        );
    }

    #[test]
    fn anything_that_changes_the_groups_counted_is_left_as_it_is() {
        for sql in [
            // Groups filtered, cut or multiplied.
            "SELECT COUNT(*) FROM (SELECT clinic FROM demo.visits GROUP BY clinic HAVING COUNT(*) > 5) s",
            "SELECT COUNT(*) FROM (SELECT DISTINCT clinic FROM demo.visits LIMIT 3) s",
            "SELECT COUNT(*) FROM (SELECT DISTINCT clinic FROM demo.visits OFFSET 1) s",
            "SELECT COUNT(*) FROM (SELECT DISTINCT ON (clinic) clinic, cost FROM demo.visits) s",
            "SELECT COUNT(*) FROM (SELECT clinic FROM demo.visits GROUP BY ROLLUP (clinic)) s",
            "SELECT COUNT(*) FROM (SELECT clinic FROM demo.visits GROUP BY GROUPING SETS ((clinic), ())) s",
            "SELECT COUNT(*) FROM (SELECT clinic FROM demo.visits GROUP BY ()) s",
            "SELECT COUNT(*) FROM (SELECT clinic, generate_series(1, 3) FROM demo.visits GROUP BY clinic) s",
            "SELECT COUNT(*) FROM (SELECT DISTINCT clinic FROM demo.visits UNION SELECT 'x') s",
            "WITH w AS (SELECT 1) SELECT COUNT(*) FROM (SELECT DISTINCT clinic FROM demo.visits) s",
            "SELECT COUNT(*) FROM (WITH w AS (SELECT 1) SELECT DISTINCT clinic FROM demo.visits) s",
            // Not the count of groups, or more than it.
            "SELECT COUNT(s.clinic) FROM (SELECT DISTINCT clinic FROM demo.visits) s",
            "SELECT COUNT(DISTINCT s.clinic) FROM (SELECT DISTINCT clinic FROM demo.visits) s",
            "SELECT COUNT(*), s.clinic FROM (SELECT DISTINCT clinic FROM demo.visits) s",
            "SELECT COUNT(*) FROM (SELECT DISTINCT clinic FROM demo.visits) s WHERE s.clinic = 'a'",
            "SELECT s.clinic, COUNT(*) FROM (SELECT DISTINCT clinic, cost FROM demo.visits) s GROUP BY s.clinic",
            // An item neither a key nor an aggregate; a position past the list; an alias that
            // names something else; an aggregate or window under DISTINCT.
            "SELECT COUNT(*) FROM (SELECT clinic, cost FROM demo.visits GROUP BY clinic) s",
            "SELECT COUNT(*) FROM (SELECT clinic FROM demo.visits GROUP BY 2) s",
            "SELECT COUNT(*) FROM (SELECT diagnosis AS clinic FROM demo.visits GROUP BY clinic) s",
            "SELECT COUNT(*) FROM (SELECT clinic, COUNT(*) + 1 FROM demo.visits GROUP BY clinic) s",
            "SELECT COUNT(*) FROM (SELECT DISTINCT COUNT(*) FROM demo.visits) s",
            "SELECT COUNT(*) FROM (SELECT DISTINCT ROW_NUMBER() OVER () FROM demo.visits) s",
            "SELECT COUNT(*) FROM (SELECT DISTINCT * FROM demo.visits) s",
            // Not grouped at all: the other flattening's (a count of rows).
            "SELECT COUNT(*) FROM (SELECT clinic FROM demo.visits) s",
        ] {
            assert_eq!(grouped(sql), None, "{sql}");
        }
    }

    #[test]
    fn an_orms_count_of_a_selection_is_the_count_of_its_rows() {
        // Prisma's count(), with its OFFSET bound to 0.
        assert_eq!(
            flattened(
                r#"SELECT COUNT(*) AS "_count._all" FROM (SELECT "demo"."people"."person_id" FROM "demo"."people" WHERE "demo"."people"."sex" = 'F' OFFSET 0) AS "sub""#
            ),
            Some(printed(
                r#"SELECT COUNT(*) AS "_count._all" FROM "demo"."people" WHERE "demo"."people"."sex" = 'F'"#
            ))
        );
        // SQLAlchemy's Query.count().
        assert_eq!(
            flattened("SELECT count(*) AS count_1 FROM (SELECT demo.people.person_id AS demo_people_person_id, demo.people.sex AS demo_people_sex FROM demo.people WHERE demo.people.sex = 'F') AS anon_1"),
            Some(printed("SELECT count(*) AS count_1 FROM demo.people WHERE demo.people.sex = 'F'"))
        );
        assert_eq!(
            flattened("SELECT COUNT(*) FROM (SELECT * FROM demo.visits v WHERE v.cost > 10 ORDER BY v.cost) s"),
            Some(printed("SELECT COUNT(*) FROM demo.visits v WHERE v.cost > 10"))
        );
    }

    #[test]
    fn a_count_of_a_column_of_the_selection_is_the_count_of_the_column_it_lists() {
        // Prisma's count({ select: { _all: true, region: true } }).
        assert_eq!(
            flattened(
                r#"SELECT COUNT(*) AS "_count._all", COUNT("sub"."region") AS "_count.region" FROM (SELECT "demo"."people"."region" FROM "demo"."people" WHERE 1=1 OFFSET 0) AS "sub""#
            ),
            Some(printed(
                r#"SELECT COUNT(*) AS "_count._all", COUNT("demo"."people"."region") AS "_count.region" FROM "demo"."people" WHERE 1=1"#
            ))
        );
        // An alias of the subquery, an unqualified name, and a `*`.
        assert_eq!(
            flattened("SELECT count(anon_1.r), count(r) FROM (SELECT p.region AS r FROM demo.people p WHERE p.sex = 'F') AS anon_1"),
            Some(printed("SELECT count(p.region), count(p.region) FROM demo.people p WHERE p.sex = 'F'"))
        );
        assert_eq!(
            flattened("SELECT COUNT(s.cost) FROM (SELECT * FROM demo.visits WHERE cost > 10) s"),
            Some(printed(
                r#"SELECT COUNT("cost") FROM demo.visits WHERE cost > 10"#
            ))
        );
    }

    #[test]
    fn a_count_of_a_name_the_selection_does_not_list_once_is_left_as_it_is() {
        for sql in [
            // Not listed, listed twice, or qualified by another name.
            "SELECT COUNT(s.sex) FROM (SELECT region FROM demo.people) s",
            "SELECT COUNT(s.region) FROM (SELECT region, region FROM demo.people) s",
            "SELECT COUNT(s.region) FROM (SELECT *, region FROM demo.people) s",
            "SELECT COUNT(t.region) FROM (SELECT region FROM demo.people) s",
            "SELECT COUNT(s.region) FROM (SELECT region FROM demo.people) s(r)",
            // Not a plain count of it.
            "SELECT COUNT(s.region || 'x') FROM (SELECT region FROM demo.people) s",
            "SELECT COUNT(DISTINCT s.region) FROM (SELECT region FROM demo.people) s",
            "SELECT COUNT(s.region) FILTER (WHERE s.region = 'CE') FROM (SELECT region FROM demo.people) s",
            "SELECT COUNT(*), s.region FROM (SELECT region FROM demo.people) s",
        ] {
            assert_eq!(flattened(sql), None, "{sql}");
        }
    }

    #[test]
    fn anything_that_could_change_the_rows_counted_is_left_as_it_is() {
        for sql in [
            // Not the count of rows, or more than it.
            "SELECT COUNT(DISTINCT person_id) FROM (SELECT person_id FROM demo.visits) s",
            "SELECT COUNT(*), SUM(cost) FROM (SELECT cost FROM demo.visits) s",
            "SELECT COUNT(*) FROM (SELECT cost FROM demo.visits) s WHERE s.cost > 1",
            "SELECT clinic, COUNT(*) FROM (SELECT clinic FROM demo.visits) s GROUP BY clinic",
            // Rows chosen, merged or multiplied by the subquery.
            "SELECT COUNT(*) FROM (SELECT cost FROM demo.visits LIMIT 10) s",
            "SELECT COUNT(*) FROM (SELECT cost FROM demo.visits OFFSET 5) s",
            "SELECT COUNT(*) FROM (SELECT DISTINCT clinic FROM demo.visits) s",
            "SELECT COUNT(*) FROM (SELECT person_id FROM demo.visits GROUP BY person_id) s",
            "SELECT COUNT(*) FROM (SELECT generate_series(1, 3) FROM demo.visits) s",
            "SELECT COUNT(*) FROM (SELECT cost + 1 AS c FROM demo.visits) s",
            "SELECT COUNT(*) FROM (SELECT v.cost FROM demo.visits v JOIN demo.people p ON p.person_id = v.person_id) s",
            "SELECT COUNT(*) FROM (SELECT cost FROM demo.visits UNION ALL SELECT cost FROM demo.visits) s",
            // Unknown columns and tables: refused by the ordinary analysis, as PostgreSQL would.
            "SELECT COUNT(*) FROM (SELECT no_such_column FROM demo.visits) s",
            "SELECT COUNT(*) FROM (SELECT p.cost FROM demo.visits v) s",
            "SELECT COUNT(*) FROM (SELECT cost FROM demo.nowhere) s",
        ] {
            assert_eq!(flattened(sql), None, "{sql}");
        }
    }
}
