//! `GROUP BY ROLLUP (…)`, `CUBE (…)`, `GROUPING SETS (…)`, `()` and their mixes with plain keys,
//! expanded into the list of grouping sets PostgreSQL computes; and `GROUPING(…)` over them.
//!
//! Invariants:
//! - The expansion is PostgreSQL's (docs: "GROUPING SETS, CUBE, and ROLLUP"): `ROLLUP (e1, …, en)`
//!   is the n + 1 prefixes from the longest to `()`; `CUBE (e1, …, en)` is every subset, in the
//!   order of the documentation's equivalent `GROUPING SETS` list (the first element as the
//!   highest bit, from all to none); several items of GROUP BY are their cross product, in the
//!   order written; duplicate sets are kept (PostgreSQL returns their rows twice), and each is a
//!   release of its own, charged as such.
//! - Nested grouping constructs (`GROUPING SETS (ROLLUP (…))`) and more than
//!   [`limits::GROUPING_SETS_PER_QUERY_MAX`] sets are refused before any key is resolved.
//! - Nothing here reads data: the sets depend on the query's text alone.

use super::*;

/// A GROUP BY clause: its distinct elements (the expressions as written, before resolution), and
/// when it uses grouping-set syntax, the sets as indices into the elements.
pub(super) struct GroupBy {
    /// Each element once, in order of first appearance.
    pub(super) elements: Vec<Expr>,
    /// The grouping sets, `None` for a plain GROUP BY list.
    pub(super) sets: Option<Vec<Vec<usize>>>,
}

/// The hint of a refused grouping construct.
const GROUPING_HINT: &str = "Write GROUP BY ROLLUP (a, b), CUBE (a, b), GROUPING SETS ((a, b), (a), ()) or a mix of them with plain keys (GROUP BY a, ROLLUP (b, c)); each grouping set is released and charged on its own.";

fn is_grouping_construct(e: &Expr) -> bool {
    match e {
        Expr::Rollup(_) | Expr::Cube(_) | Expr::GroupingSets(_) => true,
        Expr::Tuple(t) => t.is_empty(),
        Expr::Function(f) => function_name(&f.name)
            .map(|n| matches!(n.as_str(), "rollup" | "cube" | "grouping"))
            .unwrap_or(false),
        _ => false,
    }
}

/// The elements of one set of a construct, each checked to be a plain expression.
fn plain_elements(list: &[Expr]) -> Result<Vec<Expr>> {
    for e in list {
        if is_grouping_construct(e) {
            return Err(Error::unsupported(
                "nested ROLLUP / CUBE / GROUPING SETS",
                GROUPING_HINT,
            ));
        }
    }
    Ok(list.to_vec())
}

fn too_many() -> Error {
    Error::LimitExceeded {
        what: "the number of grouping sets".into(),
        limit: limits::GROUPING_SETS_PER_QUERY_MAX as u64,
    }
}

/// The grouping sets of one item of GROUP BY, as lists of expressions.
fn item_sets(item: &Expr) -> Result<Vec<Vec<Expr>>> {
    Ok(match item {
        Expr::Tuple(t) if t.is_empty() => vec![Vec::new()],
        Expr::Rollup(lists) => {
            let lists: Vec<Vec<Expr>> = lists
                .iter()
                .map(|l| plain_elements(l))
                .collect::<Result<_>>()?;
            if lists.len() >= limits::GROUPING_SETS_PER_QUERY_MAX {
                return Err(too_many());
            }
            (0..=lists.len())
                .rev()
                .map(|n| lists[..n].concat())
                .collect()
        }
        Expr::Cube(lists) => {
            let lists: Vec<Vec<Expr>> = lists
                .iter()
                .map(|l| plain_elements(l))
                .collect::<Result<_>>()?;
            let n = lists.len();
            if n >= usize::BITS as usize || (1usize << n) > limits::GROUPING_SETS_PER_QUERY_MAX {
                return Err(too_many());
            }
            (0..1usize << n)
                .rev()
                .map(|mask| {
                    (0..n)
                        .filter(|i| mask & (1 << (n - 1 - i)) != 0)
                        .flat_map(|i| lists[i].iter().cloned())
                        .collect()
                })
                .collect()
        }
        Expr::GroupingSets(lists) => lists
            .iter()
            .map(|l| plain_elements(l))
            .collect::<Result<_>>()?,
        Expr::Function(_) if is_grouping_construct(item) => {
            return Err(Error::unsupported(
                "this form of grouping in GROUP BY",
                GROUPING_HINT,
            ))
        }
        other => vec![vec![other.clone()]],
    })
}

/// Expands a GROUP BY clause into its elements and, with grouping-set syntax, its sets.
pub(super) fn group_by(group_by: &GroupByExpr) -> Result<GroupBy> {
    let items = match group_by {
        GroupByExpr::Expressions(exprs, modifiers) => {
            if !modifiers.is_empty() {
                return Err(Error::unsupported(
                    "GROUP BY … WITH ROLLUP / WITH CUBE / WITH TOTALS",
                    GROUPING_HINT,
                ));
            }
            exprs
        }
        GroupByExpr::All(_) => return Err(Error::unsupported("GROUP BY ALL", "List the keys.")),
    };
    let mut elements: Vec<Expr> = Vec::new();
    let mut index = |e: &Expr| -> usize {
        match elements.iter().position(|x| x == e) {
            Some(i) => i,
            None => {
                elements.push(e.clone());
                elements.len() - 1
            }
        }
    };
    if !items.iter().any(is_grouping_construct) {
        for e in items {
            index(e);
        }
        return Ok(GroupBy {
            elements,
            sets: None,
        });
    }
    // The cross product of the items' sets, in the order written.
    let mut sets: Vec<Vec<usize>> = vec![Vec::new()];
    for item in items {
        let mut next = Vec::new();
        for tail in item_sets(item)? {
            let tail: Vec<usize> = tail.iter().map(&mut index).collect();
            for head in &sets {
                next.push((head.clone(), tail.clone()));
            }
        }
        // Keep PostgreSQL's nesting: for each set so far, the item's sets in their order.
        next.sort_by_key(|(head, _)| sets.iter().position(|s| s == head));
        sets = next
            .into_iter()
            .map(|(mut head, tail)| {
                head.extend(tail);
                head
            })
            .collect();
        if sets.len() > limits::GROUPING_SETS_PER_QUERY_MAX {
            return Err(too_many());
        }
    }
    Ok(GroupBy {
        elements,
        sets: Some(sets),
    })
}

/// The grouping sets as sorted, duplicate-free lists of key indices, given the key of each
/// element (elements that resolve to the same key are one key).
pub(super) fn key_sets(sets: &[Vec<usize>], element_key: &[usize]) -> Vec<Vec<usize>> {
    sets.iter()
        .map(|set| {
            let keys: std::collections::BTreeSet<usize> =
                set.iter().map(|&e| element_key[e]).collect();
            keys.into_iter().collect()
        })
        .collect()
}

/// The `GROUPING SETS` clause equivalent to the analyst's GROUP BY, over the keys' own
/// expressions (for the statement that types the released relation).
pub(super) fn grouping_sets_expr(sets: &[Vec<usize>], keys: &[Expr]) -> Expr {
    Expr::GroupingSets(
        sets.iter()
            .map(|set| set.iter().map(|&k| keys[k].clone()).collect())
            .collect(),
    )
}

/// The refusal of `GROUPING(…)` in a query without grouping sets (where PostgreSQL gives 0).
pub(super) fn grouping_without_sets() -> Error {
    Error::unsupported(
        "GROUPING(…) without ROLLUP, CUBE or GROUPING SETS",
        "Without grouping sets GROUPING(…) is always 0: write 0, or group by ROLLUP (…).",
    )
}

/// Whether `e` is a call of `GROUPING(…)`.
pub(super) fn is_grouping_call(e: &Expr) -> bool {
    matches!(e, Expr::Function(f) if f.over.is_none()
        && function_name(&f.name).is_ok_and(|n| n == "grouping"))
}

impl Analyzer<'_> {
    /// The keys `GROUPING(…)` names, in its argument order. PostgreSQL's rule: each argument is
    /// one of the query's grouping expressions, and GROUPING needs GROUP BY.
    pub(super) fn grouping_arguments(&mut self, e: &Expr, keys: &[GroupKey]) -> Result<Vec<usize>> {
        let Expr::Function(f) = e else {
            return Err(Error::internal("not a GROUPING call"));
        };
        let args = match &f.args {
            FunctionArguments::List(list)
                if list.duplicate_treatment.is_none() && list.clauses.is_empty() =>
            {
                &list.args
            }
            _ => {
                return Err(Error::unsupported(
                    "this form of GROUPING",
                    "Write GROUPING(a, b) over keys of GROUP BY.",
                ))
            }
        };
        if f.filter.is_some() || !f.within_group.is_empty() || args.is_empty() {
            return Err(Error::unsupported(
                "this form of GROUPING",
                "Write GROUPING(a, b) over keys of GROUP BY.",
            ));
        }
        if args.len() > limits::GROUPING_ARGUMENTS_MAX {
            return Err(Error::LimitExceeded {
                what: "the number of arguments of GROUPING".into(),
                limit: limits::GROUPING_ARGUMENTS_MAX as u64,
            });
        }
        let mut out = Vec::new();
        for a in args {
            let FunctionArg::Unnamed(FunctionArgExpr::Expr(x)) = a else {
                return Err(Error::unsupported(
                    "this form of GROUPING",
                    "Write GROUPING(a, b) over keys of GROUP BY.",
                ));
            };
            let mut c = x.clone();
            let text = match self.expr(&mut c, Role::Key) {
                Ok(_) => c.to_string(),
                Err(_) => String::new(),
            };
            match keys.iter().position(|k| k.expr == text) {
                Some(i) => out.push(i),
                None => {
                    return Err(Error::forbidden(
                        format!("arguments to GROUPING must be grouping expressions of the query: {x} is not one"),
                        "Name keys of GROUP BY in GROUPING(…), written as in GROUP BY.",
                    ))
                }
            }
        }
        Ok(out)
    }
}

/// `GROUPING(…)` over the released relation: the columns `g<i>` (1 where key `i` is not in the
/// row's grouping set), each weighted by its bit, the first argument the highest, as int4.
pub(super) fn released_grouping(args: &[usize]) -> Expr {
    let n = args.len();
    let mut total: Option<Expr> = None;
    for (p, &k) in args.iter().enumerate() {
        let column = post::released_column('g', k);
        let weight = 1u32 << (n - 1 - p);
        let term = if weight == 1 {
            column
        } else {
            Expr::BinaryOp {
                left: Box::new(column),
                op: BinaryOperator::Multiply,
                right: Box::new(Expr::value(Value::Number(weight.to_string(), false))),
            }
        };
        total = Some(match total {
            None => term,
            Some(t) => Expr::BinaryOp {
                left: Box::new(t),
                op: BinaryOperator::Plus,
                right: Box::new(term),
            },
        });
    }
    Expr::Nested(Box::new(
        total.unwrap_or(Expr::value(Value::Number("0".into(), false))),
    ))
}
