//! Catalog queries: introspection by clients and BI tools (`\d` in psql, JDBC's
//! `DatabaseMetaData`, SQLAlchemy's `inspect`), answered from a **shadow catalog**: a schema-only
//! database that pgdp builds from the policy and the upstream's column types, holding no rows.
//!
//! Because the shadow database is empty, per-database catalog data (tables, columns, types,
//! row estimates, sizes, per-table statistics) reveals nothing about the private data. What
//! remains dangerous is cluster-wide state visible from any database: other sessions and their
//! SQL (`pg_stat_activity`), database sizes, server files and settings, and timing functions.
//! [`check`] therefore admits only relations and functions on the allow-lists below.
//!
//! Invariants:
//! - A catalog query never runs on the upstream database; it runs on the shadow catalog, in a
//!   read-only transaction with a short timeout.
//! - Every relation a catalog query reads is on [`ALLOWED_RELATIONS`] or is one of its CTEs, and
//!   every function is on [`ALLOWED_FUNCTIONS`]. A statement that reads a table of the policy is
//!   never a catalog query ([`is_catalog_query`]): the shadow's copies of those tables are empty,
//!   and an answer from them would be a made-up number.
//! - Classification does no I/O.

use std::collections::BTreeSet;
use std::ops::ControlFlow;

use sqlparser::ast::{self, Expr, ObjectName};

use crate::dp::rewrite::public::cte_names;
use crate::error::{Error, Result};

/// Catalog relations (in `pg_catalog` or `information_schema`) a query may read.
pub const ALLOWED_RELATIONS: &[&str] = &[
    // pg_catalog, per database
    "pg_class",
    "pg_namespace",
    "pg_attribute",
    "pg_type",
    "pg_index",
    "pg_constraint",
    "pg_description",
    "pg_attrdef",
    "pg_am",
    "pg_amop",
    "pg_amproc",
    "pg_opclass",
    "pg_opfamily",
    "pg_collation",
    "pg_inherits",
    "pg_proc",
    "pg_enum",
    "pg_range",
    "pg_extension",
    "pg_partitioned_table",
    "pg_sequence",
    "pg_trigger",
    "pg_rewrite",
    "pg_views",
    "pg_tables",
    "pg_matviews",
    "pg_indexes",
    "pg_policy",
    "pg_policies",
    "pg_operator",
    "pg_cast",
    "pg_language",
    "pg_depend",
    "pg_foreign_table",
    "pg_foreign_server",
    "pg_foreign_data_wrapper",
    "pg_event_trigger",
    "pg_publication",
    "pg_publication_rel",
    "pg_publication_tables",
    "pg_publication_namespace",
    "pg_aggregate",
    "pg_conversion",
    "pg_ts_config",
    "pg_ts_dict",
    "pg_ts_parser",
    "pg_ts_template",
    "pg_transform",
    "pg_statistic_ext",
    "pg_sequences",
    "pg_seclabels",
    "pg_init_privs",
    "pg_default_acl",
    "pg_largeobject_metadata",
    // pg_catalog, shared but harmless for analysts
    "pg_database",
    "pg_roles",
    "pg_user",
    "pg_tablespace",
    "pg_auth_members",
    "pg_shdescription",
    "pg_timezone_names",
    "pg_timezone_abbrevs",
    // per-database statistics views: all zero in the empty shadow database
    "pg_stat_user_tables",
    "pg_stat_all_tables",
    "pg_statio_user_tables",
    // Sequelize's describeTable joins it for the table's oid
    "pg_statio_all_tables",
    "pg_stat_user_indexes",
    // information_schema
    "tables",
    "columns",
    "schemata",
    "views",
    "table_constraints",
    "key_column_usage",
    "referential_constraints",
    "constraint_column_usage",
    "constraint_table_usage",
    "routines",
    "parameters",
    "sequences",
    "character_sets",
    "element_types",
    "domains",
    "triggers",
    "check_constraints",
    "column_privileges",
    "table_privileges",
    "enabled_roles",
    "applicable_roles",
    "collations",
    "attributes",
    "user_defined_types",
    "_pg_expandarray",
    // set-returning functions used in FROM by drivers (bounded by the shadow's statement timeout)
    "generate_series",
    "unnest",
    "pg_get_keywords",
    "generate_subscripts",
    // A one-row function in FROM: Grafana's table and column pickers split the search_path
    // with it (`FROM generate_series(…) AS i, string_to_array(current_setting('search_path'),
    // ',') s`).
    "string_to_array",
];

/// Functions a catalog query may call: catalog formatting and visibility, privilege checks on
/// the shadow's own objects, and ordinary scalar and aggregate functions (the shadow has no
/// data). Excluded: anything reading other sessions, sizes of real databases, files, settings,
/// or time (`pg_sleep`).
pub const ALLOWED_FUNCTIONS: &[&str] = &[
    "format_type",
    "pg_get_expr",
    "pg_get_indexdef",
    "pg_get_constraintdef",
    "pg_get_userbyid",
    "pg_get_viewdef",
    "pg_get_triggerdef",
    "pg_get_partkeydef",
    "pg_get_function_arguments",
    "pg_get_function_result",
    "pg_get_function_identity_arguments",
    "pg_get_serial_sequence",
    "pg_get_keywords",
    "pg_get_ruledef",
    "pg_get_statisticsobjdef_columns",
    "pg_table_is_visible",
    "pg_type_is_visible",
    "pg_function_is_visible",
    "pg_opclass_is_visible",
    "pg_collation_is_visible",
    "pg_is_other_temp_schema",
    "pg_my_temp_schema",
    "pg_relation_is_publishable",
    "pg_relation_size",
    "pg_total_relation_size",
    "pg_table_size",
    "pg_indexes_size",
    "pg_size_pretty",
    "obj_description",
    "col_description",
    "shobj_description",
    "pg_encoding_to_char",
    "pg_char_to_encoding",
    "current_schema",
    "current_schemas",
    "current_database",
    "current_user",
    "session_user",
    "user",
    "version",
    "has_table_privilege",
    "has_schema_privilege",
    "has_database_privilege",
    "has_column_privilege",
    // Metabase's table-privileges sync; like the other privilege checks it reads only the
    // shadow's own grants.
    "has_any_column_privilege",
    "has_function_privilege",
    "has_sequence_privilege",
    "has_type_privilege",
    "pg_has_role",
    "array_to_string",
    "array_agg",
    "string_agg",
    "unnest",
    "array_upper",
    "array_lower",
    "array_length",
    "array_position",
    "cardinality",
    "coalesce",
    "nullif",
    "lower",
    "upper",
    "length",
    "char_length",
    "substring",
    "substr",
    "replace",
    "position",
    "strpos",
    "quote_ident",
    "quote_literal",
    "concat",
    "concat_ws",
    "format",
    "trim",
    "btrim",
    "ltrim",
    "rtrim",
    "split_part",
    "left",
    "right",
    "regexp_replace",
    "regexp_match",
    "textlen",
    "count",
    "max",
    "min",
    "sum",
    "bool_and",
    "bool_or",
    "row_number",
    "rank",
    "greatest",
    "least",
    "abs",
    "int4",
    "int8",
    "text",
    "oid",
    "regclass",
    "regtype",
    "to_regclass",
    "to_regtype",
    "to_regproc",
    "pg_typeof",
    "translate",
    "encode",
    "decode",
    "md5",
    "generate_subscripts",
    "_pg_expandarray",
    "_pg_char_max_length",
    "_pg_numeric_precision",
    "_pg_numeric_scale",
    "_pg_datetime_precision",
    "_pg_truetypid",
    "_pg_truetypmod",
    "_pg_index_position",
    "_pg_interval_type",
    "_pg_keysequal",
    "_pg_char_octet_length",
    "_pg_numeric_precision_radix",
    "pg_get_function_sqlbody",
    "array_remove",
    "any",
    "exists",
    "array",
    "generate_series",
    "pg_get_statisticsobjdef",
    "pg_get_publication_tables",
    "pg_partition_root",
    "pg_get_indexdef",
    "string_to_array",
    "parse_ident",
    "pg_column_is_updatable",
    "pg_relation_is_updatable",
    // Pure JSON constructors: SQLAlchemy's `get_columns` builds identity and collation details
    // with them (from the shadow's pg_sequence and pg_collation rows).
    "json_build_object",
    "jsonb_build_object",
    "json_build_array",
    "json_agg",
];

/// Names of catalog schemas.
fn is_catalog_schema(name: &str) -> bool {
    name == "pg_catalog" || name == "information_schema"
}

fn lower_parts(name: &ObjectName) -> Vec<String> {
    name.0
        .iter()
        .map(|p| match p.as_ident() {
            Some(i) if i.quote_style.is_some() => i.value.clone(),
            Some(i) => i.value.to_ascii_lowercase(),
            None => p.to_string().to_ascii_lowercase(),
        })
        .collect()
}

/// Whether a query is a catalog query: it reads at least one catalog relation, and no relation
/// but catalog relations and its own CTEs. A statement that also reads anything else (a table of
/// the policy above all) is not one: it goes to DP analysis, which refuses what it cannot bound,
/// so the shadow catalog, whose tables are empty, never answers for the data.
pub fn is_catalog_query(query: &ast::Query) -> bool {
    // The CTE names are read only when an unqualified name needs them, and the walk stops at
    // the first relation that is not the catalog's (most DP statements: their first table).
    let mut ctes: Option<BTreeSet<String>> = None;
    let mut catalog = false;
    let mut other = false;
    let _ = ast::visit_relations(query, |name| {
        let parts = lower_parts(name);
        match parts.as_slice() {
            [schema, _] if is_catalog_schema(schema) => catalog = true,
            [table] if ctes.get_or_insert_with(|| cte_names(query)).contains(table) => {}
            [table] if table.starts_with("pg_") || ALLOWED_RELATIONS.contains(&table.as_str()) => {
                // `columns` and `tables` unqualified are as likely the analyst's own tables.
                if table == "columns" || table == "tables" {
                    other = true;
                } else {
                    catalog = true;
                }
            }
            _ => other = true,
        }
        if other {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    });
    catalog && !other
}

/// A catalog query that [`check`] admitted, with its parameters bound, as the text to run on the
/// shadow catalog ([`super::Shadow`]): the only SQL the shadow runs for an analyst.
///
/// ```compile_fail,E0423
/// let sql = pgdp::upstream::catalog::CatalogSql("SELECT * FROM pg_stat_activity".into());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CatalogSql(String);

impl CatalogSql {
    /// The SQL text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Admits a catalog query if every relation and function it uses is on the allow-lists, and
/// prints it with `params` bound ([`bind_parameters`]) for the shadow catalog.
///
/// `current_setting('name')` with a literal name is replaced by the value `setting` gives (the
/// session's value, or pgdp's fixed answer for a harmless server parameter), so the shadow's own
/// configuration is never read; an unknown name fails as PostgreSQL does (42704), or is NULL
/// with `missing_ok`.
pub fn check(
    query: &ast::Query,
    params: &[Option<String>],
    setting: &dyn Fn(&str) -> Result<String>,
) -> Result<CatalogSql> {
    let mut bound = query.clone();
    bind_parameters(&mut bound, params);
    bind_settings(&mut bound, setting)?;
    admit(&bound)?;
    served_databases(&mut bound);
    Ok(CatalogSql(bound.to_string()))
}

/// The schema of the shadow catalog's views that stand for cluster-wide catalogs.
pub const SHADOW_VIEWS_SCHEMA: &str = "pgdp_catalog";

/// Reads `pg_database` through the shadow catalog's view of it (`pgdp_catalog.pg_database`,
/// built with the shadow): one row, the database pgdp serves, under the policy's name. The
/// cluster's other databases (the upstream's, the ledger's) are not the analyst's to see, and
/// pgdp serves only the one (`\l`, Superset's and DBeaver's database lists).
fn served_databases(query: &mut ast::Query) {
    let ctes = cte_names(query);
    let _ = ast::visit_relations_mut(query, |name| {
        let parts = lower_parts(name);
        let catalog = match parts.as_slice() {
            [table] => table == "pg_database" && !ctes.contains(table),
            [schema, table] => schema == "pg_catalog" && table == "pg_database",
            _ => false,
        };
        if catalog {
            *name = ObjectName::from(vec![
                ast::Ident::new(SHADOW_VIEWS_SCHEMA),
                ast::Ident::new("pg_database"),
            ]);
        }
        ControlFlow::<()>::Continue(())
    });
}

/// Replaces each `current_setting('name' [, missing_ok])` whose arguments are literals by the
/// value of the setting as a text literal.
fn bind_settings(query: &mut ast::Query, setting: &dyn Fn(&str) -> Result<String>) -> Result<()> {
    let mut failure = None;
    let _ = ast::visit_expressions_mut(query, |e| {
        let Expr::Function(f) = e else {
            return ControlFlow::Continue(());
        };
        let parts = lower_parts(&f.name);
        let named = match parts.as_slice() {
            [n] => n == "current_setting",
            [schema, n] => schema == "pg_catalog" && n == "current_setting",
            _ => false,
        };
        if !named {
            return ControlFlow::Continue(());
        }
        let ast::FunctionArguments::List(list) = &f.args else {
            return ControlFlow::Continue(());
        };
        // A literal, or a literal cast to a string type (`'name'::VARCHAR`, as SQLAlchemy binds).
        let literal = |a: &ast::FunctionArg| {
            let ast::FunctionArg::Unnamed(ast::FunctionArgExpr::Expr(e)) = a else {
                return None;
            };
            let e = match e {
                Expr::Cast {
                    expr,
                    data_type:
                        ast::DataType::Text
                        | ast::DataType::Varchar(None)
                        | ast::DataType::CharacterVarying(None),
                    ..
                } => expr.as_ref(),
                e => e,
            };
            match e {
                Expr::Value(v) => Some(v.value.clone()),
                _ => None,
            }
        };
        let args: Vec<Option<ast::Value>> = list.args.iter().map(literal).collect();
        let (name, missing_ok) = match args.as_slice() {
            // current_setting is strict: a NULL name (also a parameter not bound yet, when a
            // statement is described) gives NULL.
            [Some(ast::Value::Null)] | [Some(ast::Value::Null), _] => {
                *e = Expr::Cast {
                    kind: ast::CastKind::Cast,
                    expr: Box::new(Expr::value(ast::Value::Null)),
                    data_type: ast::DataType::Text,
                    format: None,
                };
                return ControlFlow::Continue(());
            }
            [Some(n)] => (n, false),
            [Some(n), Some(ast::Value::Boolean(ok))] => (n, *ok),
            // Anything else stays a call, which the allow-list refuses.
            _ => return ControlFlow::Continue(()),
        };
        let Some(name) = crate::literal::string_value(name).map(str::to_string) else {
            return ControlFlow::Continue(());
        };
        let value = match setting(&name) {
            Ok(v) => ast::Value::SingleQuotedString(v),
            Err(_) if missing_ok => ast::Value::Null,
            Err(err) => {
                failure = Some(err);
                return ControlFlow::Break(());
            }
        };
        *e = Expr::Cast {
            kind: ast::CastKind::Cast,
            expr: Box::new(Expr::value(value)),
            data_type: ast::DataType::Text,
            format: None,
        };
        ControlFlow::Continue(())
    });
    failure.map_or(Ok(()), Err)
}

/// Whether every relation and function of `query` is on the allow-lists.
fn admit(query: &ast::Query) -> Result<()> {
    let ctes = cte_names(query);
    let mut refusal: Option<Error> = None;
    let _ = ast::visit_relations(query, |name| {
        let parts = lower_parts(name);
        let ok = match parts.as_slice() {
            [schema, table] if is_catalog_schema(schema) => {
                ALLOWED_RELATIONS.contains(&table.as_str())
            }
            [table] => ALLOWED_RELATIONS.contains(&table.as_str()) || ctes.contains(table),
            _ => false,
        };
        if !ok {
            refusal = Some(Error::forbidden(
                format!("the catalog relation {name} is not available through pgdp"),
                "Statistics, activity, sizes and settings of the server are hidden; pgdp answers introspection from a catalog with no data.",
            ));
            return ControlFlow::Break(());
        }
        ControlFlow::Continue(())
    });
    if let Some(e) = refusal {
        return Err(e);
    }
    let _ = ast::visit_expressions(query, |e| {
        if let Expr::Function(f) = e {
            let parts = lower_parts(&f.name);
            let (schema_ok, name) = match parts.as_slice() {
                [n] => (true, n.clone()),
                [s, n] => (is_catalog_schema(s), n.clone()),
                _ => (false, String::new()),
            };
            if !schema_ok || !ALLOWED_FUNCTIONS.contains(&name.as_str()) {
                refusal = Some(Error::UnknownFunction {
                    name: f.name.to_string(),
                    hint: "Catalog queries through pgdp may call only catalog formatting, visibility and ordinary scalar functions.".into(),
                });
                return ControlFlow::Break(());
            }
        }
        ControlFlow::Continue(())
    });
    match refusal {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Replaces `$n` placeholders by string literals of the bound values (NULL when unbound), so the
/// shadow database infers their types as PostgreSQL does for untyped literals.
fn bind_parameters(query: &mut ast::Query, params: &[Option<String>]) {
    let _ = ast::visit_expressions_mut(query, |e| {
        if let Expr::Value(v) = e {
            if let ast::Value::Placeholder(p) = &v.value {
                let index = p
                    .strip_prefix('$')
                    .and_then(|n| n.parse::<usize>().ok())
                    .unwrap_or(0);
                *e = match params.get(index.wrapping_sub(1)) {
                    Some(Some(text)) => Expr::value(crate::literal::dollar_quoted(text)),
                    _ => Expr::value(ast::Value::Null),
                };
            }
        }
        ControlFlow::<()>::Continue(())
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::classify::{classify, Statement};

    fn query(sql: &str) -> Box<ast::Query> {
        match classify(sql).expect("parses").pop() {
            Some(Statement::Query(q)) => q,
            other => panic!("not a query: {other:?}"),
        }
    }

    fn verdict(sql: &str) -> String {
        let q = query(sql);
        if !is_catalog_query(&q) {
            return "not catalog".into();
        }
        match admit(&q) {
            Ok(()) => "ok".into(),
            Err(e) => e.sqlstate().code().into(),
        }
    }

    #[test]
    fn psql_describe_queries_are_admitted() {
        assert_eq!(verdict("SELECT n.nspname, c.relname FROM pg_catalog.pg_class c LEFT JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE pg_catalog.pg_table_is_visible(c.oid) AND c.relname OPERATOR(pg_catalog.~) '^(people)$' COLLATE pg_catalog.default"), "ok");
        assert_eq!(verdict("SELECT a.attname, pg_catalog.format_type(a.atttypid, a.atttypmod) FROM pg_catalog.pg_attribute a WHERE a.attrelid = '16385' AND a.attnum > 0"), "ok");
        assert_eq!(
            verdict("SELECT table_name FROM information_schema.tables WHERE table_schema = 'demo'"),
            "ok"
        );
    }

    #[test]
    fn client_introspection_queries_are_admitted() {
        // SQLAlchemy 2 `Inspector.get_columns` (abridged to the functions it calls).
        assert_eq!(verdict("SELECT pg_catalog.pg_attribute.attname, CASE WHEN (pg_catalog.pg_attribute.attidentity != '') THEN (SELECT json_build_object('always', pg_catalog.pg_attribute.attidentity = 'a', 'start', pg_catalog.pg_sequence.seqstart) FROM pg_catalog.pg_sequence WHERE pg_catalog.pg_sequence.seqrelid = CAST(CAST(pg_catalog.pg_get_serial_sequence(CAST(CAST(pg_catalog.pg_attribute.attrelid AS REGCLASS) AS TEXT), pg_catalog.pg_attribute.attname) AS REGCLASS) AS OID)) ELSE NULL END AS identity_options FROM pg_catalog.pg_class LEFT OUTER JOIN pg_catalog.pg_attribute ON pg_catalog.pg_class.oid = pg_catalog.pg_attribute.attrelid"), "ok");
        // Metabase's table-privileges sync (abridged).
        assert_eq!(verdict("SELECT pg_catalog.has_any_column_privilege(current_user, '\"demo\".\"people\"', 'select') FROM pg_catalog.pg_tables t WHERE pg_catalog.has_schema_privilege(current_user, t.schemaname, 'usage')"), "ok");
        // Grafana's column picker (public/app/plugins/datasource/grafana-postgresql-datasource/
        // postgresMetaQuery.ts, getSchema with its search_path constraint), settings bound.
        let grafana = query("SELECT quote_ident(column_name) AS \"column\", data_type AS \"type\" FROM information_schema.columns WHERE CASE WHEN array_length(parse_ident('demo.visits'),1) = 2 THEN quote_ident(table_schema) = (parse_ident('demo.visits'))[1] AND quote_ident(table_name) = (parse_ident('demo.visits'))[2] ELSE quote_ident(table_name) = 'demo.visits' AND quote_ident(table_schema) IN (SELECT CASE WHEN trim(s[i]) = '\"$user\"' THEN user ELSE trim(s[i]) END FROM generate_series(array_lower(string_to_array(current_setting('search_path'),','),1), array_upper(string_to_array(current_setting('search_path'),','),1)) as i, string_to_array(current_setting('search_path'),',') s) END");
        assert!(is_catalog_query(&grafana));
        check(&grafana, &[], &|_| Ok("\"$user\", public".into())).expect("Grafana's getSchema");
    }

    #[test]
    fn activity_statistics_and_sizes_are_refused() {
        assert_eq!(verdict("SELECT query FROM pg_stat_activity"), "42501");
        assert_eq!(verdict("SELECT * FROM pg_catalog.pg_statistic"), "42501");
        assert_eq!(verdict("SELECT * FROM pg_stats"), "42501");
        assert_eq!(verdict("SELECT * FROM pg_settings"), "42501");
        assert_eq!(
            verdict("SELECT pg_database_size('pgdp_demo') FROM pg_database"),
            "42883"
        );
        assert_eq!(verdict("SELECT pg_sleep(1) FROM pg_class"), "42883");
        assert_eq!(
            verdict("SELECT pg_read_file('/etc/passwd') FROM pg_class"),
            "42883"
        );
    }

    fn checked(sql: &str) -> std::result::Result<String, String> {
        let setting = |name: &str| match name {
            "default_table_access_method" => Ok("heap".to_string()),
            _ => Err(Error::UnknownParameter { name: name.into() }),
        };
        check(&query(sql), &[], &setting)
            .map(|s| s.as_str().to_string())
            .map_err(|e| e.sqlstate().code().to_string())
    }

    #[test]
    fn current_setting_is_answered_by_pgdp() {
        // SQLAlchemy 2's reflection (abridged).
        assert_eq!(
            checked("SELECT c.relname FROM pg_catalog.pg_class c JOIN pg_catalog.pg_am am ON am.oid = c.relam WHERE am.amname = current_setting('default_table_access_method')").as_deref(),
            Ok("SELECT c.relname FROM pg_catalog.pg_class c JOIN pg_catalog.pg_am am ON am.oid = c.relam WHERE am.amname = CAST('heap' AS TEXT)")
        );
        assert_eq!(
            checked("SELECT relname FROM pg_class WHERE pg_catalog.current_setting('nope', true) IS NULL").as_deref(),
            Ok("SELECT relname FROM pg_class WHERE CAST(NULL AS TEXT) IS NULL")
        );
        assert_eq!(
            checked("SELECT relname FROM pg_class WHERE current_setting('nope'::VARCHAR) = ''"),
            Err("42704".to_string())
        );
        // A parameter (bound, or NULL while the statement is only described).
        let bound = |sql: &str, params: &[Option<String>]| {
            let setting = |name: &str| match name {
                "default_table_access_method" => Ok("heap".to_string()),
                _ => Err(Error::UnknownParameter { name: name.into() }),
            };
            check(&query(sql), params, &setting)
                .map(|s| s.as_str().to_string())
                .map_err(|e| e.sqlstate().code().to_string())
        };
        let sql = "SELECT relname FROM pg_class WHERE current_setting($1::VARCHAR) = 'heap'";
        let with = bound(sql, &[Some("default_table_access_method".into())]).unwrap();
        assert!(
            with.starts_with("SELECT relname FROM pg_class WHERE CAST('heap' AS TEXT) = "),
            "{with}"
        );
        let described = bound(sql, &[]).unwrap();
        assert!(
            described.starts_with("SELECT relname FROM pg_class WHERE CAST(NULL AS TEXT) = "),
            "{described}"
        );
        // A name that is not a literal stays a call, which the allow-list refuses.
        assert_eq!(
            checked("SELECT current_setting(relname) FROM pg_class"),
            Err("42883".to_string())
        );
    }

    #[test]
    fn data_queries_are_not_catalog_queries() {
        assert_eq!(verdict("SELECT COUNT(*) FROM demo.people"), "not catalog");
        // A policy table read together with a catalog relation or function is not answered from
        // the shadow (whose copy is empty: a made-up 0); DP analysis refuses it.
        assert_eq!(
            verdict("SELECT COUNT(*) FROM demo.people, generate_series(1, 3) g"),
            "not catalog"
        );
        assert_eq!(
            verdict("SELECT COUNT(*) FROM demo.people p JOIN pg_catalog.pg_class c ON true"),
            "not catalog"
        );
        assert_eq!(
            verdict("WITH x AS (SELECT * FROM demo.visits) SELECT relname FROM pg_class, x"),
            "not catalog"
        );
        assert_eq!(
            verdict("SELECT relname FROM pg_class WHERE relname IN (SELECT 'people' FROM people)"),
            "not catalog"
        );
        // Its own CTEs, also nested ones, keep a catalog query a catalog query.
        assert_eq!(
            verdict("WITH r AS (SELECT oid, relname FROM pg_class) SELECT relname FROM r"),
            "ok"
        );
        assert_eq!(
            verdict(
                "SELECT n FROM (WITH r AS (SELECT relname AS n FROM pg_class) SELECT n FROM r) s"
            ),
            "ok"
        );
    }
}
