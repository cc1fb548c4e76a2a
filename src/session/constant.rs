//! FROM-less SELECTs of constants and session lookups (`SELECT 1`, `version()`,
//! `current_setting('…')`), evaluated by pgdp with the column types PostgreSQL would give them.
//! Nothing here reads the upstream or the ledger.

use sqlparser::ast::{self, Expr, SelectItem};

use crate::error::{Error, Result};
use crate::output::{Cell, CellType, OutColumn};

use super::classify::Statement;
use super::route::SetConfig;
use super::{ClientRows, Session, Shared};

impl Session {
    /// `SELECT set_config(name, value, is_local)`: the SET (or, for a NULL value, the RESET) it
    /// means, answered as PostgreSQL does with the setting's new value. `is_local` is taken as
    /// `SET LOCAL` is: pgdp keeps transaction-scoped settings as session settings.
    pub(super) async fn set_config(
        &mut self,
        shared: &Shared,
        call: &SetConfig<'_>,
        params: &[Option<String>],
    ) -> Result<ClientRows> {
        let statement = set_config_statement(call, params)?;
        self.session_statement_checked(shared, &statement).await?;
        let name = match &statement {
            Statement::Set { name, .. } | Statement::Reset { name } => name.as_str(),
            _ => return Err(Error::internal("set_config: not a SET")),
        };
        let (_, value) = self.settings.show(name, &self.server_version)?;
        Ok(ClientRows::computed(
            vec![OutColumn::new(call.column, CellType::Text)],
            vec![vec![Cell::Text(value)]],
        ))
    }

    /// The columns and one row of a SELECT of constants.
    pub(super) fn constants(&self, shared: &Shared, items: &[SelectItem]) -> Result<ClientRows> {
        let mut columns = Vec::new();
        let mut row = Vec::new();
        for item in items {
            let (name, cell, ty) = self.evaluate_constant(shared, item)?;
            columns.push(OutColumn::new(name, ty));
            row.push(cell);
        }
        Ok(ClientRows::computed(columns, vec![row]))
    }

    /// Evaluates one item of a FROM-less SELECT of constants and harmless session lookups, with
    /// the column type PostgreSQL would give it.
    pub(super) fn evaluate_constant(
        &self,
        shared: &Shared,
        item: &SelectItem,
    ) -> Result<(String, Cell, CellType)> {
        let (expr, alias) = match item {
            SelectItem::UnnamedExpr(e) => (e, None),
            SelectItem::ExprWithAlias { expr, alias } => (expr, Some(alias.value.clone())),
            _ => {
                return Err(Error::unsupported(
                    "* without FROM",
                    "List the expressions, e.g. SELECT 1 AS one, now() AS at.",
                ))
            }
        };
        let (default_name, cell) = self.constant_value(shared, expr)?;
        let ty = constant_type(expr, &cell);
        Ok((alias.unwrap_or(default_name), cell, ty))
    }

    fn constant_value(&self, shared: &Shared, expr: &Expr) -> Result<(String, Cell)> {
        match expr {
            Expr::Value(v) => {
                let cell = match &v.value {
                    ast::Value::Number(n, _) => match n.parse::<i64>() {
                        Ok(i) => Cell::Int(i),
                        Err(_) => n
                            .parse::<f64>()
                            .map(Cell::Float)
                            .map_err(|_| not_constant())?,
                    },
                    ast::Value::SingleQuotedString(s) => Cell::Text(s.clone()),
                    ast::Value::DollarQuotedString(d) => Cell::Text(d.value.clone()),
                    ast::Value::Boolean(b) => Cell::Bool(*b),
                    ast::Value::Null => Cell::Null,
                    _ => return Err(not_constant()),
                };
                Ok(("?column?".into(), cell))
            }
            Expr::Nested(inner) => self.constant_value(shared, inner),
            Expr::Cast {
                expr, data_type, ..
            } => {
                let (_, cell) = self.constant_value(shared, expr)?;
                let ty = data_type.to_string().to_ascii_lowercase();
                let name = ty.split('(').next().unwrap_or("").trim().to_string();
                let cast = cast_constant(&name, cell).ok_or_else(not_constant)?;
                Ok((name, cast))
            }
            Expr::Function(f) => {
                let name = f
                    .name
                    .0
                    .last()
                    .map(|p| p.to_string().to_ascii_lowercase())
                    .unwrap_or_default();
                let qualifier_ok = f.name.0.len() == 1
                    || (f.name.0.len() == 2
                        && f.name.0[0].to_string().eq_ignore_ascii_case("pg_catalog"));
                if !qualifier_ok {
                    return Err(not_constant());
                }
                let args: Vec<&Expr> = match &f.args {
                    ast::FunctionArguments::None => Vec::new(),
                    ast::FunctionArguments::List(list) => list
                        .args
                        .iter()
                        .map(|a| match a {
                            ast::FunctionArg::Unnamed(ast::FunctionArgExpr::Expr(e)) => Ok(e),
                            _ => Err(not_constant()),
                        })
                        .collect::<Result<Vec<_>>>()?,
                    ast::FunctionArguments::Subquery(_) => return Err(not_constant()),
                };
                let cell = match (name.as_str(), args.len()) {
                    ("version", 0) => Cell::Text(format!(
                        "PostgreSQL {} (pgdp {}, differentially private proxy)",
                        self.server_version,
                        env!("CARGO_PKG_VERSION")
                    )),
                    ("current_database", 0) => Cell::Text(shared.policy.database.clone()),
                    ("current_schema", 0) => Cell::Text(self.current_schema(shared)),
                    ("current_user" | "session_user" | "user", 0) => Cell::Text(self.analyst.name.clone()),
                    ("pg_backend_pid", 0) => Cell::Int(i64::from(self.backend_pid)),
                    ("current_schemas", 1) => {
                        let mut schemas = vec!["pg_catalog".to_string()];
                        schemas.push(self.current_schema(shared));
                        Cell::Text(format!("{{{}}}", schemas.join(",")))
                    }
                    ("current_setting", 1 | 2) => {
                        let (_, arg) = self.constant_value(shared, args[0])?;
                        let Cell::Text(setting) = arg else { return Err(not_constant()) };
                        Cell::Text(self.settings.show(&setting, &self.server_version)?.1)
                    }
                    _ => {
                        return Err(Error::UnknownFunction {
                            name: f.name.to_string(),
                            hint: "Without FROM, pgdp answers only literals and lookups such as version(), current_schema() and current_setting('…').".into(),
                        })
                    }
                };
                Ok((name, cell))
            }
            Expr::Identifier(id) => {
                let n = id.value.to_ascii_lowercase();
                match n.as_str() {
                    "current_user" | "session_user" | "user" | "current_role" => {
                        Ok((n, Cell::Text(self.analyst.name.clone())))
                    }
                    "current_schema" => Ok((n, Cell::Text(self.current_schema(shared)))),
                    "current_catalog" => Ok((n, Cell::Text(shared.policy.database.clone()))),
                    _ => Err(Error::UnknownColumn {
                        name: id.value.clone(),
                    }),
                }
            }
            _ => Err(not_constant()),
        }
    }

    pub(super) fn current_schema(&self, shared: &Shared) -> String {
        let schemas = shared.policy.schemas();
        self.settings
            .search_path
            .split(',')
            .map(|s| s.trim().trim_matches('"').to_ascii_lowercase())
            .find(|s| schemas.contains(s))
            .unwrap_or_else(|| "public".into())
    }
}

/// The refusal of an expression without FROM that pgdp does not answer.
fn not_constant() -> Error {
    Error::unsupported(
        "this expression without FROM",
        "Without FROM, pgdp answers only literals and lookups such as version(), current_schema() and current_setting('…').",
    )
}

/// A constant cast to the type named `name`; `None` for a cast pgdp does not evaluate.
fn cast_constant(name: &str, cell: Cell) -> Option<Cell> {
    Some(match (name, cell) {
        ("text" | "varchar" | "name" | "character varying", c) => Cell::Text(cell_text(&c)),
        ("int" | "integer" | "int4" | "bigint" | "int8" | "smallint" | "int2", Cell::Int(i)) => {
            Cell::Int(i)
        }
        ("int" | "integer" | "int4" | "bigint" | "int8" | "smallint" | "int2", Cell::Text(t)) => {
            Cell::Int(t.trim().parse().ok()?)
        }
        ("float8" | "double precision" | "float" | "numeric" | "real", Cell::Int(i)) => {
            Cell::Float(i as f64)
        }
        ("float8" | "double precision" | "float" | "numeric" | "real", Cell::Float(f)) => {
            Cell::Float(f)
        }
        ("bool" | "boolean", Cell::Bool(b)) => Cell::Bool(b),
        ("regclass" | "regtype" | "oid", _) => return None,
        (_, Cell::Null) => Cell::Null,
        _ => return None,
    })
}

/// The type PostgreSQL gives a FROM-less constant: an integer literal is `integer` when it fits
/// in 32 bits and `bigint` otherwise (so `SELECT 1` is `int4`, as clients expect), and an
/// explicit cast decides.
fn constant_type(expr: &Expr, cell: &Cell) -> CellType {
    match expr {
        Expr::Nested(inner) => constant_type(inner, cell),
        Expr::Cast { data_type, .. } => {
            let ty = data_type.to_string().to_ascii_lowercase();
            match ty.split('(').next().unwrap_or("").trim() {
                "int" | "integer" | "int4" | "smallint" | "int2" => CellType::Int4,
                "bigint" | "int8" => CellType::Int8,
                _ => cell_type_of(cell),
            }
        }
        _ => cell_type_of(cell),
    }
}

fn cell_type_of(cell: &Cell) -> CellType {
    match cell {
        Cell::Int(i) if i32::try_from(*i).is_ok() => CellType::Int4,
        Cell::Int(_) => CellType::Int8,
        Cell::Float(_) => CellType::Float8,
        Cell::Bool(_) => CellType::Bool,
        Cell::Null | Cell::Text(_) => CellType::Text,
    }
}

fn cell_text(cell: &Cell) -> String {
    match cell {
        Cell::Null => String::new(),
        Cell::Int(i) => i.to_string(),
        Cell::Float(f) => f.to_string(),
        Cell::Text(t) => t.clone(),
        Cell::Bool(b) => {
            if *b {
                "t".into()
            } else {
                "f".into()
            }
        }
    }
}

/// The SET or RESET a `set_config(name, value, is_local)` call means, its arguments literals
/// (possibly cast) or bound parameters.
pub(super) fn set_config_statement(
    call: &SetConfig<'_>,
    params: &[Option<String>],
) -> Result<Statement> {
    let name = set_config_argument(call.name, params)?.ok_or_else(|| {
        Error::unsupported(
            "set_config with a NULL setting name",
            "Name the setting: SELECT set_config('TimeZone', 'UTC', false).",
        )
    })?;
    let local = set_config_argument(call.local, params)?;
    if !matches!(
        local.as_deref().map(str::to_ascii_lowercase).as_deref(),
        Some("true" | "false" | "t" | "f" | "on" | "off")
    ) {
        return Err(Error::unsupported(
            "set_config without a literal is_local",
            "Pass true or false as the third argument.",
        ));
    }
    let name = name.to_ascii_lowercase();
    Ok(match set_config_argument(call.value, params)? {
        Some(value) => Statement::Set { name, value },
        None => Statement::Reset { name },
    })
}

/// A literal or bound argument of set_config as text (`None` for NULL).
fn set_config_argument(expr: &Expr, params: &[Option<String>]) -> Result<Option<String>> {
    let refuse = || {
        Error::unsupported(
            "set_config with computed arguments",
            "Pass literals or parameters: SELECT set_config('TimeZone', 'UTC', false).",
        )
    };
    match expr {
        Expr::Nested(inner) | Expr::Cast { expr: inner, .. } => set_config_argument(inner, params),
        Expr::Value(v) => match &v.value {
            ast::Value::SingleQuotedString(s) => Ok(Some(s.clone())),
            ast::Value::DollarQuotedString(d) => Ok(Some(d.value.clone())),
            ast::Value::Boolean(b) => Ok(Some(b.to_string())),
            ast::Value::Null => Ok(None),
            ast::Value::Placeholder(p) => {
                let index: usize = p
                    .strip_prefix('$')
                    .and_then(|n| n.parse().ok())
                    .ok_or_else(refuse)?;
                index
                    .checked_sub(1)
                    .and_then(|i| params.get(i))
                    .cloned()
                    .ok_or_else(|| {
                        Error::unsupported(
                            format!("set_config with the unbound parameter {p}"),
                            "Bind a value to every parameter.",
                        )
                    })
            }
            _ => Err(refuse()),
        },
        _ => Err(refuse()),
    }
}
