//! Column references and the analyst's expressions as the plan holds them: [`ColumnRef`],
//! [`Canonical`] (an expression's text, made only from a parsed `Expr`) and [`JoinOn`].

use std::collections::BTreeSet;
use std::ops::ControlFlow;

use sqlparser::ast::{self, Expr};
use sqlparser::dialect::PostgreSqlDialect;
use sqlparser::parser::Parser;

/// A column of a table in FROM, named through the table's generated alias: printed as the
/// canonical `"__dp_tN"."column"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ColumnRef {
    /// The alias `__dp_tN` of the table in FROM.
    pub alias: String,
    /// The declared column.
    pub column: String,
}

impl ColumnRef {
    /// The column `column` of the table aliased `alias`.
    pub fn new(alias: &str, column: &str) -> ColumnRef {
        ColumnRef {
            alias: alias.to_string(),
            column: column.to_string(),
        }
    }

    /// The column whose canonical expression ([`ColumnRef::expr`]) is `text`, if it is one.
    pub fn of_canonical(text: &Canonical) -> Option<ColumnRef> {
        let (alias, column) = text.as_str().strip_prefix('"')?.split_once("\".\"")?;
        let column = column.strip_suffix('"')?.replace("\"\"", "\"");
        let candidate = ColumnRef::new(alias, &column);
        (Canonical::of(&candidate.expr()) == *text).then_some(candidate)
    }

    /// The canonical expression `"alias"."column"`.
    pub fn expr(&self) -> Expr {
        Expr::CompoundIdentifier(vec![
            ast::Ident::with_quote('"', self.alias.as_str()),
            ast::Ident::with_quote('"', self.column.as_str()),
        ])
    }
}

impl std::fmt::Display for ColumnRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.expr())
    }
}

/// The canonical SQL text of an expression that analysis parsed and checked: sqlparser's printing
/// of the AST, with columns named `"__dp_tN"."column"`. Made only from an [`Expr`] (or a
/// [`ColumnRef`]), never from text, so the rewrite can splice it into upstream SQL as a typed
/// fragment; equal texts mean equal expressions (HAVING and ORDER BY match aggregates by it).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Canonical(String);

impl Canonical {
    /// The printing of `expr`.
    pub fn of(expr: &Expr) -> Canonical {
        Canonical(expr.to_string())
    }

    /// The text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether the expression is a literal other than NULL (a number, a string, a boolean).
    pub fn is_non_null_literal(&self) -> bool {
        let parsed = Parser::new(&PostgreSqlDialect {})
            .try_with_sql(&self.0)
            .and_then(|mut p| p.parse_expr());
        matches!(parsed, Ok(Expr::Value(v)) if !matches!(v.value, ast::Value::Null | ast::Value::Placeholder(_)))
    }

    /// Whether the expression is a row value `ROW(…)`: a value never NULL itself, whose `IS
    /// NOT NULL` is true only when every field is non-NULL (so its presence is tested with `IS
    /// DISTINCT FROM NULL`).
    pub fn is_row(&self) -> bool {
        let parsed = Parser::new(&PostgreSqlDialect {})
            .try_with_sql(&self.0)
            .and_then(|mut p| p.parse_expr());
        matches!(parsed, Ok(Expr::Function(f)) if f.name.0.len() == 1 && f.name.to_string().eq_ignore_ascii_case("row"))
    }

    /// The aliases `__dp_tN` of the tables the expression reads (see [`aliases`]).
    pub fn aliases(&self) -> Option<BTreeSet<String>> {
        let expr = Parser::new(&PostgreSqlDialect {})
            .try_with_sql(&self.0)
            .and_then(|mut p| p.parse_expr())
            .ok()?;
        aliases(&expr)
    }
}

/// The aliases of the tables an expression reads, when every column in it is named
/// `"alias"."column"` and it has no subquery; `None` otherwise (the expression is then placed
/// nowhere: callers keep the form that does not need to know).
pub fn aliases(e: &Expr) -> Option<BTreeSet<String>> {
    let mut found = BTreeSet::new();
    let flow = ast::visit_expressions(e, |e| match e {
        Expr::CompoundIdentifier(parts) => match parts.as_slice() {
            [alias, _] => {
                found.insert(alias.value.clone());
                ControlFlow::Continue(())
            }
            _ => ControlFlow::Break(()),
        },
        Expr::Identifier(_)
        | Expr::CompoundFieldAccess { .. }
        | Expr::Subquery(_)
        | Expr::Exists { .. }
        | Expr::InSubquery { .. }
        | Expr::Wildcard(_)
        | Expr::QualifiedWildcard(..) => ControlFlow::Break(()),
        Expr::Function(f) if matches!(f.args, ast::FunctionArguments::Subquery(_)) => {
            ControlFlow::Break(())
        }
        _ => ControlFlow::Continue(()),
    });
    flow.is_continue().then_some(found)
}

impl std::fmt::Display for Canonical {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl PartialEq<str> for Canonical {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

impl PartialEq<String> for Canonical {
    fn eq(&self, other: &String) -> bool {
        &self.0 == other
    }
}

/// A join's condition: equalities between columns of the tables before it and of the joined
/// table (`ON a.x = b.y AND …`, `USING (…)`, a unit path's key), and whether it is a
/// `LEFT JOIN` (only of a public table: every row before it is kept, so each privacy unit's
/// rows are what they are without the join, and the caps bound them as for an inner join).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinOn {
    /// The equalities, ANDed.
    pub on: Vec<(ColumnRef, ColumnRef)>,
    /// `LEFT JOIN` rather than `JOIN`.
    pub left: bool,
}

impl std::fmt::Display for JoinOn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, (l, r)) in self.on.iter().enumerate() {
            if i > 0 {
                f.write_str(" AND ")?;
            }
            write!(f, "{l} = {r}")?;
        }
        Ok(())
    }
}
