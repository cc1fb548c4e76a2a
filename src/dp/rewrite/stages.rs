//! Stages 2 and 4 of a rewrite ([`Stages`]: what each unit's row of `__dp_per_unit` holds and
//! each measure's stage-4 expression) and the CTEs of the value-level measures ([`ValueStage`]:
//! distinct counts and quantile histograms), as the SQL builder's fragments; assembled into one
//! statement by [`super::rewrite_shaped`]. The module's invariants are [`super`]'s: every value
//! clamped to its bounds, every unit's contribution capped.

use crate::dp::sql::{sql, Name, Number, Sql};
use crate::error::{Error, Result};
use crate::policy::Bounds;

use super::{present, scaled, Argument, Measure};

/// Stages 2 and 4 of a rewrite: what each unit's row of `__dp_per_unit` holds, and, per
/// measure, the stage-4 expression over those rows (a placeholder for the value-level measures,
/// which [`super::rewrite_shaped`] fills in).
pub(super) struct Stages<'a> {
    pub(super) keys: &'a [Sql],
    pub(super) measures: &'a [Measure],
    pub(super) arguments: &'a [Argument],
    pub(super) rows_cap: u64,
    /// Whether the per-unit stage also sums each summed, clamped argument's distance from its
    /// clamped value (`__dp_e{i}`, for the clamp histograms of [`super::contributions`]).
    pub(super) excess: bool,
    /// Whether stage 3 ranks each unit's groups: the per-unit stage then also counts each
    /// group's rows as `__dp_w`, the ranking's first key.
    pub(super) weighted: bool,
    /// Whether stage 3 gives each kept group an allowance of rows out of a total cap
    /// (`__dp_allow`, at most `rows_cap`), which stage 4 caps at instead of `rows_cap`.
    pub(super) allowance: bool,
}

impl Stages<'_> {
    pub(super) fn bounds(&self, i: usize) -> Result<Bounds> {
        self.arguments[i]
            .bounds
            .ok_or_else(|| Error::internal("sum without bounds"))
    }

    /// `COUNT` of argument `i`'s values in [`super::Shape::Fast`]: over the argument as written
    /// (`__dp_x{i}`) when it is clamped, since the clamp is NULL exactly when the argument is;
    /// over `__dp_a{i}`, the argument itself, when it has no bounds.
    pub(super) fn count_values(&self, i: usize) -> Sql {
        match self.arguments[i].bounds {
            Some(_) => sql!("COUNT({})", Name("x", i)),
            None => sql!("COUNT({})", Name("a", i)),
        }
    }

    /// The cap stage 4 puts on a unit's rows and values in a group: `rows_cap`, or the group's
    /// allowance under a total cap.
    pub(super) fn cap(&self) -> Sql {
        if self.allowance {
            Sql::text("__dp_allow")
        } else {
            sql!("{}", self.rows_cap)
        }
    }

    /// The range a unit's capped sum of measure `m` is clamped to: `[lo, hi]`, for `cap`
    /// values: the range of one value times the cap ([`Stages::cap`]).
    pub(super) fn sum_range(&self, m: &Measure) -> Result<(Sql, Sql)> {
        let (lo, hi) = self.value_range(m)?;
        Ok(if self.allowance {
            (
                sql!("__dp_allow * {}", Number(lo)),
                sql!("__dp_allow * {}", Number(hi)),
            )
        } else {
            let cap = self.rows_cap as f64;
            (sql!("{}", Number(lo * cap)), sql!("{}", Number(hi * cap)))
        })
    }

    /// The range of what one value adds to measure `m`'s sum, 0 included.
    pub(super) fn value_range(&self, m: &Measure) -> Result<(f64, f64)> {
        Ok(match m {
            Measure::Sum(i) => {
                let b = self.bounds(*i)?;
                (b.lower.min(0.0), b.upper.max(0.0))
            }
            Measure::SumCentered(i) => {
                let h = self.arguments[*i].center().1;
                (-h, h)
            }
            Measure::SumSquaresCentered(i) => {
                let h = self.arguments[*i].center().1;
                (0.0, h * h)
            }
            _ => return Err(Error::internal("not a sum")),
        })
    }

    /// [`super::Shape::Reference`]: the per-unit stage (each measure as the aggregate over the unit's
    /// rows, or as the value it takes over one row when every row is its own unit), and stage 4.
    pub(super) fn reference(&self, flat: bool) -> Result<(Option<Sql>, Vec<Sql>)> {
        let mut per_unit = vec![Sql::text("__dp_unit")];
        per_unit.extend(self.keys.iter().cloned());
        let mut one_row = per_unit.clone();
        if self.weighted {
            per_unit.push(Sql::text("COUNT(*) AS __dp_w"));
        }
        let mut outer = Vec::new();
        let cap = self.cap();
        for (j, m) in self.measures.iter().enumerate() {
            let (expr, single) = match m {
                Measure::Rows => (Sql::text("COUNT(*)"), Sql::text("1")),
                Measure::Units | Measure::Distinct(_) | Measure::Quantile(..) => {
                    (Sql::text("1"), Sql::text("1"))
                }
                Measure::Values(i) => (sql!("COUNT({})", Name("a", *i)), present(*i)),
                Measure::Sum(i) => (sql!("SUM({})", Name("a", *i)), sql!("{}", Name("a", *i))),
                Measure::SumCentered(i) => {
                    let x = sql!(
                        "{} - {}",
                        Name("a", *i),
                        Number(self.arguments[*i].center().0)
                    );
                    (sql!("SUM({})", x), sql!("({})", x))
                }
                Measure::SumSquaresCentered(i) => {
                    let (a, mid) = (Name("a", *i), Number(self.arguments[*i].center().0));
                    let x = sql!("({} - {}) * ({} - {})", a, mid, a, mid);
                    (sql!("SUM({})", x), sql!("({})", x))
                }
            };
            per_unit.push(sql!("{} AS {}", expr, Name("m", j)));
            one_row.push(sql!("{} AS {}", single, Name("m", j)));
            outer.push(match m {
                Measure::Rows | Measure::Values(_) => {
                    sql!("SUM(LEAST({}, {}))", Name("m", j), cap.clone())
                }
                Measure::Units | Measure::Distinct(_) | Measure::Quantile(..) => {
                    Sql::text("COUNT(*)")
                }
                Measure::Sum(i) | Measure::SumCentered(i) | Measure::SumSquaresCentered(i) => {
                    // A unit with n values contributes sum · min(1, C/n): the sum of at most C
                    // values at its own mean, within the range of C values. A unit with no
                    // value (n = 0) contributes nothing: its sum is NULL, which the clamp alone
                    // would turn into the lower end (GREATEST ignores NULLs).
                    let (lo, hi) = self.sum_range(m)?;
                    sql!(
                        "SUM(CASE WHEN {} > 0 THEN LEAST(GREATEST({}, {}), {}) END)",
                        Name("n", *i),
                        scaled(j, *i, cap.clone()),
                        lo,
                        hi
                    )
                }
            });
        }
        // Each unit's number of values of each argument, to scale its sums to at most
        // max_rows_per_unit values (keeping its mean) before clamping.
        for i in 0..self.arguments.len() {
            per_unit.push(sql!("COUNT({}) AS {}", Name("a", i), Name("n", i)));
            one_row.push(sql!("{} AS {}", present(i), Name("n", i)));
        }
        let mut group_unit = vec![Sql::text("__dp_unit")];
        group_unit.extend(self.keys.iter().cloned());
        let per_unit_sql = if flat {
            sql!("SELECT {} FROM __dp_rows", Sql::join(one_row, ", "))
        } else {
            sql!(
                "SELECT {} FROM __dp_rows GROUP BY {}",
                Sql::join(per_unit, ", "),
                Sql::join(group_unit, ", ")
            )
        };
        Ok((Some(per_unit_sql), outer))
    }

    /// [`super::Shape::Fast`] when every row is its own unit: stage 4 over the rows themselves. A unit
    /// has one row, so its count is 1 ≤ `max_rows_per_unit`, its clamped value lies within
    /// the range of its sum, and the scaling factor min(1, C/n) is 1: the capped statistics are
    /// the plain aggregates of the clamped rows.
    pub(super) fn fast_flat(&self) -> Vec<Sql> {
        self.measures
            .iter()
            .map(|m| match m {
                Measure::Rows | Measure::Units | Measure::Distinct(_) | Measure::Quantile(..) => {
                    Sql::text("COUNT(*)")
                }
                Measure::Values(i) => self.count_values(*i),
                Measure::Sum(i) => sql!("SUM({})", Name("a", *i)),
                // Σ(a − mid) = Σa − mid·n, exactly in `numeric`, with one subtraction per group
                // instead of one per row (PostgreSQL computes the COUNT once when the count is
                // also released); NULL when the group has no value, as the sum of no rows.
                Measure::SumCentered(i) => sql!(
                    "(SUM({}) - {} * {})",
                    Name("a", *i),
                    Number(self.arguments[*i].center().0),
                    self.count_values(*i)
                ),
                Measure::SumSquaresCentered(i) => {
                    let (a, mid) = (Name("a", *i), Number(self.arguments[*i].center().0));
                    sql!("SUM(({} - {}) * ({} - {}))", a, mid, a, mid)
                }
            })
            .collect()
    }

    /// [`super::Shape::Fast`] in general: per unit and group `__dp_r0` (rows, when counted) and per
    /// argument `__dp_n{i}` (its values), `__dp_s{i}` (their sum, when a sum or mean needs it)
    /// and `__dp_q{i}` (their centred sum of squares, when a variance needs it); one scan
    /// computes them all. Stage 4 derives the centred sum `s − mid·n` (exact in `numeric`, equal
    /// to the sum of `a − mid`) and scales a unit's sum by C/n and clamps it only when n > C:
    /// with n ≤ C the factor min(1, C/n) is 1 and a sum of n clamped values lies within the
    /// range of C of them, so both are the identity there.
    ///
    /// With a `ranking` hash (stage 3 follows), each row also carries it as `__dp_h`, and the
    /// stage groups by (unit, hash, keys): the same groups, since the hash is a function of the
    /// unit and the keys, in the order the ranking reads them.
    pub(super) fn fast(&self, ranking: Option<&Sql>) -> Result<(Sql, Vec<Sql>)> {
        let cap = self.cap();
        let mut per_unit = vec![Sql::text("__dp_unit")];
        let mut group_unit = vec![Sql::text("__dp_unit")];
        if let Some(hash) = ranking {
            per_unit.push(sql!("{} AS __dp_h", hash));
            group_unit.push(hash.clone());
        }
        per_unit.extend(self.keys.iter().cloned());
        group_unit.extend(self.keys.iter().cloned());
        if self.measures.contains(&Measure::Rows) {
            per_unit.push(Sql::text("COUNT(*) AS __dp_r0"));
        }
        if self.weighted {
            per_unit.push(Sql::text("COUNT(*) AS __dp_w"));
        }
        for i in 0..self.arguments.len() {
            per_unit.push(sql!("{} AS {}", self.count_values(i), Name("n", i)));
            let summed = self
                .measures
                .iter()
                .any(|m| *m == Measure::Sum(i) || *m == Measure::SumCentered(i));
            if summed {
                per_unit.push(sql!("SUM({}) AS {}", Name("a", i), Name("s", i)));
                if self.excess && self.arguments[i].bounds.is_some() {
                    per_unit.push(sql!(
                        "SUM(ABS({} - {})) AS {}",
                        Name("x", i),
                        Name("a", i),
                        Name("e", i)
                    ));
                }
            }
            if self.measures.contains(&Measure::SumSquaresCentered(i)) {
                let (a, mid) = (Name("a", i), Number(self.arguments[i].center().0));
                per_unit.push(sql!(
                    "SUM(({} - {}) * ({} - {})) AS {}",
                    a,
                    mid,
                    a,
                    mid,
                    Name("q", i)
                ));
            }
        }
        let mut outer = Vec::new();
        for m in self.measures {
            outer.push(match m {
                Measure::Rows => sql!("SUM(LEAST(__dp_r0, {}))", cap.clone()),
                Measure::Values(i) => sql!("SUM(LEAST({}, {}))", Name("n", *i), cap.clone()),
                Measure::Units | Measure::Distinct(_) | Measure::Quantile(..) => {
                    Sql::text("COUNT(*)")
                }
                Measure::Sum(i) | Measure::SumCentered(i) | Measure::SumSquaresCentered(i) => {
                    let x = match m {
                        Measure::Sum(_) => sql!("{}", Name("s", *i)),
                        Measure::SumCentered(_) => sql!(
                            "({} - {} * {})",
                            Name("s", *i),
                            Number(self.arguments[*i].center().0),
                            Name("n", *i)
                        ),
                        _ => sql!("{}", Name("q", *i)),
                    };
                    let (lo, hi) = self.sum_range(m)?;
                    let n = Name("n", *i);
                    sql!(
                        "SUM(CASE WHEN {} <= {} THEN {} ELSE LEAST(GREATEST({} * (CAST({} AS NUMERIC) / {}), {}), {}) END)",
                        n,
                        cap.clone(),
                        x.clone(),
                        x,
                        cap.clone(),
                        n,
                        lo,
                        hi
                    )
                }
            });
        }
        let per_unit_sql = sql!(
            "SELECT {} FROM __dp_rows GROUP BY {}",
            Sql::join(per_unit, ", "),
            Sql::join(group_unit, ", ")
        );
        Ok((per_unit_sql, outer))
    }
}

/// The CTEs of a value-level measure `j` on argument `i` (a distinct count, or a quantile's
/// histogram when [`ValueStage::sql`] is given the bounds): `__dp_v{j}` keeps, per unit and
/// group, at most `rows_cap` values (distinct values for a distinct count, rows for a histogram)
/// chosen by `hashtextextended(unit || value, seed)`, in the groups the unit kept in
/// `__dp_ranked`; `__dp_d{j}` has one row per group with the statistic, columns `__dp_dk0…` for
/// the keys.
pub(super) struct ValueStage {
    pub(super) j: usize,
    pub(super) i: usize,
    pub(super) keys: usize,
    pub(super) seed: i64,
    pub(super) rows_cap: u64,
    pub(super) groups_cap: u64,
    /// Whether the argument is a row value (`COUNT(DISTINCT ROW(…))`): present unless the row
    /// itself is NULL, whatever its fields.
    pub(super) row: bool,
}

impl ValueStage {
    pub(super) fn sql(&self, histogram: Option<Bounds>) -> Sql {
        let (j, n) = (self.j, self.keys);
        let a = Name("a", self.i);
        let names = |stem: &'static str| (0..n).map(move |k| Name(stem, k));
        let key_list = Sql::join(names("k").map(|k| sql!(", {}", k)), "");
        let present = if self.row {
            "IS DISTINCT FROM NULL"
        } else {
            "IS NOT NULL"
        };
        let source = match histogram {
            None => sql!(
                "(SELECT DISTINCT __dp_unit{}, {} FROM __dp_rows WHERE {} {}) AS {}",
                key_list,
                a,
                a,
                Sql::text(present),
                Name("distinct", j)
            ),
            Some(_) => sql!("__dp_rows WHERE {} IS NOT NULL", a),
        };
        let value = match histogram {
            None => sql!("{}", a),
            Some(b) => {
                let buckets = crate::dp::mechanism::QUANTILE_BUCKETS;
                sql!(
                    "LEAST(GREATEST(pg_catalog.trunc(({} - {}) * {} / {}), 0), {})",
                    a,
                    Number(b.lower),
                    buckets,
                    Number(b.upper - b.lower),
                    buckets - 1
                )
            }
        };
        let kept_group = if n == 0 {
            Sql::text("")
        } else {
            let parts =
                (0..n).map(|k| sql!("{} IS NOT DISTINCT FROM {}", Name("k", k), Name("vk", k)));
            sql!(
                " AND EXISTS (SELECT 1 FROM __dp_ranked WHERE __dp_unit = __dp_vu AND {} AND __dp_rank <= {})",
                Sql::join(parts, " AND "),
                self.groups_cap
            )
        };
        let vk_list = Sql::join(
            (0..n).map(|k| sql!(", {} AS {}", Name("k", k), Name("vk", k))),
            "",
        );
        let values = sql!(
            "{} AS (SELECT __dp_unit AS __dp_vu{}, {} AS __dp_v, ROW_NUMBER() OVER (PARTITION BY __dp_unit{} ORDER BY hashtextextended(CAST(__dp_unit AS TEXT) || '|' || CAST({} AS TEXT), {})) AS __dp_vrank FROM {})",
            Name("v", j),
            vk_list,
            value,
            key_list,
            a,
            self.seed,
            source
        );
        let vk_as_dk = Sql::join(
            (0..n).map(|k| sql!(", {} AS {}", Name("vk", k), Name("dk", k))),
            "",
        );
        let group_by = if n == 0 {
            Sql::text("")
        } else {
            sql!(
                " GROUP BY {}",
                Sql::join(names("dk").map(|d| sql!("{}", d)), ", ")
            )
        };
        let per_group = match histogram {
            None => sql!(
                "{} AS (SELECT COUNT(DISTINCT __dp_v) AS __dp_c{} FROM {} WHERE __dp_vrank <= {}{}{})",
                Name("d", j),
                vk_as_dk,
                Name("v", j),
                self.rows_cap,
                kept_group,
                group_by
            ),
            Some(_) => {
                let bucket_group = Sql::join(
                    names("vk")
                        .map(|v| sql!("{}", v))
                        .chain(std::iter::once(Sql::text("__dp_v"))),
                    ", ",
                );
                sql!(
                    "{} AS (SELECT string_agg(CAST(__dp_v AS TEXT) || ':' || CAST(__dp_n AS TEXT), ',') AS __dp_h{} FROM (SELECT __dp_v, COUNT(*) AS __dp_n{} FROM {} WHERE __dp_vrank <= {}{} GROUP BY {}) AS {}{})",
                    Name("d", j),
                    Sql::join(names("dk").map(|d| sql!(", {}", d)), ""),
                    vk_as_dk,
                    Name("v", j),
                    self.rows_cap,
                    kept_group,
                    bucket_group,
                    Name("buckets", j),
                    group_by
                )
            }
        };
        sql!(", {}, {}", values, per_group)
    }
}
