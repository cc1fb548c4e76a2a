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
//! - Every relation a catalog query reads is on [`ALLOWED_RELATIONS`] (or is a table of the
//!   policy, which is empty in the shadow), and every function is on [`ALLOWED_FUNCTIONS`].
//! - Classification does no I/O.

use std::collections::BTreeSet;
use std::ops::ControlFlow;

use sqlparser::ast::{self, Expr, ObjectName};

use crate::error::{Error, Result};
use crate::policy::Policy;

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

/// Whether a query is a catalog query: it reads at least one catalog relation.
pub fn is_catalog_query(query: &ast::Query) -> bool {
    let mut found = false;
    let _ = ast::visit_relations(query, |name| {
        let parts = lower_parts(name);
        let catalog = match parts.as_slice() {
            [schema, _] => is_catalog_schema(schema),
            [table] => {
                table.starts_with("pg_")
                    || ALLOWED_RELATIONS.contains(&table.as_str())
                        && table != "columns"
                        && table != "tables"
            }
            _ => false,
        };
        found |= catalog;
        ControlFlow::<()>::Continue(())
    });
    found
}

/// A catalog query that [`check`] admitted, with its parameters bound, as the text to run on the
/// shadow catalog ([`super::Shadow`]): the only SQL the shadow runs for an analyst.
///
/// ```compile_fail
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
pub fn check(query: &ast::Query, policy: &Policy, params: &[Option<String>]) -> Result<CatalogSql> {
    admit(query, policy)?;
    let mut bound = query.clone();
    bind_parameters(&mut bound, params);
    Ok(CatalogSql(bound.to_string()))
}

/// Whether every relation and function of `query` is on the allow-lists.
fn admit(query: &ast::Query, policy: &Policy) -> Result<()> {
    let ctes: BTreeSet<String> = query
        .with
        .iter()
        .flat_map(|w| {
            w.cte_tables
                .iter()
                .map(|c| c.alias.name.value.to_ascii_lowercase())
        })
        .collect();
    let mut refusal: Option<Error> = None;
    let _ = ast::visit_relations(query, |name| {
        let parts = lower_parts(name);
        let ok = match parts.as_slice() {
            [schema, table] if is_catalog_schema(schema) => {
                ALLOWED_RELATIONS.contains(&table.as_str())
            }
            [schema, table] => policy.table(&format!("{schema}.{table}")).is_some(),
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

    fn policy() -> Policy {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("policies/demo.yaml");
        crate::policy::load(&path).expect("demo policy")
    }

    fn verdict(sql: &str) -> String {
        let q = query(sql);
        if !is_catalog_query(&q) {
            return "not catalog".into();
        }
        match admit(&q, &policy()) {
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

    #[test]
    fn data_queries_are_not_catalog_queries() {
        assert_eq!(verdict("SELECT COUNT(*) FROM demo.people"), "not catalog");
    }
}
