//! `pgdp suggest`: which contribution caps and value bounds would cost a data team how much
//! accuracy, read from DP histograms of their own data.
//!
//! For each private table of a policy it runs, on the upstream, the contribution histograms a
//! query that chooses its caps would run ([`crate::dp::release::bounds::ChoicePlan`]): for
//! `SELECT COUNT(*)` of the table, for `SELECT <key>, COUNT(*) … GROUP BY <key>` of each
//! groupable column, and for `SELECT SUM(<column>)` of each column with bounds. It noises every
//! bucket as such a query does ([`ContributionProfile`]) and prints, for every candidate cap,
//! the estimated share of rows the cap removes, the caps a query would choose at the policy's
//! default ε with the noise they bring, and the share of a bounded column's sum that clamping
//! removes.
//!
//! # Privacy
//! Every number printed is post-processing of histograms with Laplace noise on every bucket,
//! present or not, at the ε a query's choice spends on them ([`BoundsChoice`]): each statement
//! is ε_s-DP for its privacy units, the report the sum of the ε_s (sequential composition),
//! which it states at the end. The report may be shared where the data may not; it is not
//! charged to any analyst (its reader is the data team, who run it with the upstream's
//! credentials). Keys a unit path relies on are checked unique on the upstream first, as the
//! proxy does, since the histograms' sensitivity rests on them.

use std::fmt::Write as _;

use rand::{CryptoRng, Rng, RngExt};
use tokio_postgres::{Client, SimpleQueryMessage};

use crate::dp::analyze;
use crate::dp::plan::Context;
use crate::dp::release::bounds::{percent, ChoicePlan, ContributionProfile};
use crate::dp::release::{self, Budget, PrivateRows};
use crate::dp::rewrite;
use crate::error::{Error, Result};
use crate::policy::{ColumnType, Policy, Table};
use crate::session::classify::{self, Statement};
use crate::upstream::catalog_facts::UNIQUE_KEY_SQL;

/// The report and the ε its histograms spent in all.
#[derive(Debug, Clone)]
pub struct Report {
    /// Plain text, one section per private table.
    pub text: String,
    /// Total ε of the histograms (pure DP).
    pub epsilon: f64,
}

/// Builds the report for every private table of `policy` from the upstream `client` (a
/// connection to the database the policy describes), for queries at ε `query_epsilon`.
///
/// # Errors
/// A statement the analyzer refuses (a policy pgdp cannot plan), an upstream failure, or a
/// unit path whose key is not unique upstream.
pub async fn report<R: Rng + CryptoRng + ?Sized>(
    policy: &Policy,
    client: &Client,
    query_epsilon: f64,
    rng: &mut R,
) -> Result<Report> {
    let budget = Budget {
        epsilon: query_epsilon,
        delta: policy.defaults.delta,
        mechanism: policy.defaults.mechanism,
    };
    // A fresh ranking secret: which groups a unit past the ceiling on groups keeps changes
    // what the histograms see only at the margin, and this secret is never shown.
    let secret: String = (0..32)
        .map(|_| format!("{:02x}", rng.random::<u8>()))
        .collect();
    let mut text = format!(
        "pgdp suggest: contribution caps and value bounds, read from DP histograms of the data as a query that chooses its caps at epsilon {} sees them\n",
        fmt_number(query_epsilon)
    );
    let mut epsilon = 0.0;
    for table in policy.tables.values() {
        let Some(private) = table.private() else {
            continue;
        };
        let name = table.qualified_name();
        let _ = write!(
            text,
            "\n{name} (privacy unit {}): caps {} row(s) in each of {} group(s); ceilings {} in {}\n",
            private.unit_description(),
            private.max_rows_per_unit,
            private.max_groups_per_unit,
            private.rows_ceiling,
            private.groups_ceiling
        );
        let mut any = false;
        for (sql, public_values) in statements(table) {
            let Some(section) =
                statement(policy, client, &sql, public_values, budget, &secret, rng).await?
            else {
                continue;
            };
            any = true;
            epsilon += section.epsilon;
            text.push_str(&section.text);
        }
        if !any {
            text.push_str(
                "  nothing to choose: no query of this table chooses its caps (one row in one group per unit, or ceilings equal to caps of 1)\n",
            );
        }
    }
    let _ = write!(
        text,
        "\nepsilon spent on this report: {} (pure DP: Laplace noise on every bucket of every histogram above, composed sequentially). Every number above is post-processing of those histograms: the report may be shared where the data may not.\n",
        fmt_number(epsilon)
    );
    Ok(Report { text, epsilon })
}

/// The statements profiled for `table`, with the size of each key's public domain.
fn statements(table: &Table) -> Vec<(String, Option<u64>)> {
    let name = format!(
        "{}.{}",
        quote_ident(&table.schema),
        quote_ident(&table.name)
    );
    let mut out = vec![(format!("SELECT COUNT(*) FROM {name}"), None)];
    for c in table
        .columns
        .iter()
        .filter(|c| c.groupable || c.public_values.is_some())
    {
        // A timestamp is grouped by the day, as analysts group it (a raw timestamp is nearly a
        // key of its own per row).
        let column = match c.ty {
            crate::policy::ColumnType::Timestamp => {
                format!("date_trunc('day', {})", quote_ident(&c.name))
            }
            _ => quote_ident(&c.name),
        };
        out.push((
            format!("SELECT {column}, COUNT(*) FROM {name} GROUP BY {column}"),
            c.public_values.as_ref().map(|v| v.len() as u64),
        ));
    }
    for c in table
        .columns
        .iter()
        .filter(|c| c.bounds.is_some() && matches!(c.ty, ColumnType::Integer | ColumnType::Numeric))
    {
        out.push((
            format!("SELECT SUM({}) FROM {name}", quote_ident(&c.name)),
            None,
        ));
    }
    out
}

/// One statement's section and the ε its histograms spent; `None` when it does not choose.
struct Section {
    text: String,
    epsilon: f64,
}

async fn statement<R: Rng + CryptoRng + ?Sized>(
    policy: &Policy,
    client: &Client,
    sql: &str,
    cells: Option<u64>,
    budget: Budget,
    secret: &str,
    rng: &mut R,
) -> Result<Option<Section>> {
    let statements = classify::classify(sql)?;
    let [Statement::Query(query)] = statements.as_slice() else {
        return Err(Error::internal("a suggest statement is not one query"));
    };
    let ctx = Context {
        policy,
        search_path: Vec::new(),
    };
    let plan = analyze::analyze(query, &ctx)?;
    let rw = rewrite::rewrite(&plan, &[], secret)?;
    let mechanisms = release::mechanisms(&plan, &rw, budget)?;
    let Some(choice) = ChoicePlan::new(&plan, &rw, &mechanisms, &[], secret, cells)? else {
        return Ok(None);
    };
    for (table, column) in plan.unique_keys() {
        verify_unique(client, table, column).await?;
    }
    let rows = simple_rows(client, choice.sql.as_str()).await?;
    let profile = ContributionProfile::new(&choice.choice, &PrivateRows::new(rows), rng)?;
    let noise_per_row = choice.noise_per_row();
    let chosen = profile.chosen(noise_per_row);
    let c = &choice.choice;
    let mut text = format!(
        "  {sql}\n    histograms at epsilon {} ({} rows seen)\n",
        fmt_number(c.epsilon()),
        fmt_count(profile.rows())
    );
    let rows_line = |g: u64| -> String {
        c.candidates()
            .iter()
            .map(|&cap| format!("{:>7}", percent(profile.removed_share(g, cap))))
            .collect()
    };
    let header: String = c
        .candidates()
        .iter()
        .map(|cap| format!("{cap:>7}"))
        .collect();
    let groups = c.group_candidates();
    if groups.len() > 1 {
        let _ = writeln!(
            text,
            "    rows removed, by the cap on groups per unit (lines) and on rows per group (columns):\n    {:>10}{header}",
            "groups"
        );
        for &g in groups {
            let _ = writeln!(text, "    {g:>10}{}", rows_line(g));
        }
    } else {
        let g = groups.last().copied().unwrap_or(1);
        let _ = writeln!(
            text,
            "    {:>14}{header}\n    {:>14}{}",
            "rows per unit",
            "rows removed",
            rows_line(g)
        );
    }
    let totals = c.totals();
    if let Some((_, below)) = totals.split_last() {
        // Up to the first total that removes nothing (larger ones only add noise).
        let mut shares = Vec::new();
        for &t in below {
            let share = profile.total_removed_share(t).unwrap_or(0.0);
            shares.push(format!(" {t}: {}", percent(share)));
            if share <= 0.0 {
                break;
            }
        }
        let line = shares.join(",");
        let _ = writeln!(
            text,
            "    rows removed by a cap on each unit's rows over all its groups (at {} row(s) in each of {} group(s)):{line}",
            c.ceiling(),
            c.groups_ceiling()
        );
    }
    let (g, cap) = (chosen.groups_per_unit(), chosen.rows_per_unit());
    let (caps, removed) = match chosen.rows_total() {
        Some(t) => (
            format!("at most {t} row(s) per unit in all, {cap} in each of at most {g} group(s)"),
            chosen.rows_removed_share(),
        ),
        None if groups.len() > 1 => (
            format!("{cap} row(s) in each of at most {g} group(s)"),
            profile.removed_share(g, cap),
        ),
        None => (format!("{cap} row(s)"), profile.removed_share(g, cap)),
    };
    let _ = writeln!(
        text,
        "    a query at epsilon {} would choose {caps}: removes about {} of the rows, with noise within ±{} (95%) in each released value of its noisiest aggregate",
        fmt_number(budget.epsilon),
        percent(removed),
        fmt_count(c.noise_with_total(noise_per_row, g, cap, chosen.rows_total()))
    );
    if let Some(clamp) = profile.clamp(&chosen) {
        if let Some((upper, ceiling)) = clamp.chosen_upper().filter(|_| !clamp.detected()) {
            let _ = writeln!(
                text,
                "    upper bound chosen ({}, the policy allows up to {ceiling}): no unit's largest value above {upper} detected (buckets of {} units or fewer read as empty)",
                clamp.label(),
                fmt_count(clamp.floor().ceil())
            );
        } else if let Some((upper, ceiling)) = clamp.chosen_upper() {
            let _ = writeln!(
                text,
                "    upper bound chosen ({}, the policy allows up to {ceiling}): about {} unit(s) have values above {upper}; clamping removes at least about {} of the sum of absolute values (one value per unit counted; buckets of {} units or fewer read as empty)",
                clamp.label(),
                fmt_count(clamp.units_outside()),
                percent(clamp.share()),
                fmt_count(clamp.floor().ceil())
            );
        } else if clamp.detected() {
            let _ = writeln!(
                text,
                "    values outside the bounds ({}): about {} unit(s) have some; clamping removes about {} of the sum of absolute values (buckets of {} units or fewer read as empty)",
                clamp.label(),
                fmt_count(clamp.units_outside()),
                percent(clamp.share()),
                fmt_count(clamp.floor().ceil())
            );
        } else {
            let _ = writeln!(
                text,
                "    values outside the bounds ({}): none detected (buckets of {} units or fewer read as empty: a few units far outside may still carry much of the sum)",
                clamp.label(),
                fmt_count(clamp.floor().ceil())
            );
        }
    }
    Ok(Some(Section {
        text,
        epsilon: c.epsilon(),
    }))
}

/// Refuses a unit path whose key is not a single-column unique key upstream.
async fn verify_unique(client: &Client, table: &str, column: &str) -> Result<()> {
    let qualified = table
        .split('.')
        .map(quote_ident)
        .collect::<Vec<_>>()
        .join(".");
    let row = client
        .query_one(UNIQUE_KEY_SQL, &[&qualified, &column])
        .await
        .map_err(|e| Error::internal(format!("checking that {table}.{column} is unique: {e}")))?;
    if row.get::<_, bool>(0) {
        Ok(())
    } else {
        Err(Error::internal(format!(
            "{table}.{column} is not a single-column unique key upstream: the unit path relies on it (the proxy refuses such tables too)"
        )))
    }
}

async fn simple_rows(client: &Client, sql: &str) -> Result<release::TextRows> {
    let messages = client
        .simple_query(sql)
        .await
        .map_err(|e| Error::internal(format!("the contribution histograms: {e}")))?;
    Ok(messages
        .iter()
        .filter_map(|m| match m {
            SimpleQueryMessage::Row(r) => {
                Some((0..r.len()).map(|i| r.get(i).map(str::to_string)).collect())
            }
            _ => None,
        })
        .collect())
}

fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

fn fmt_number(x: f64) -> String {
    let text = format!("{x:.6}");
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// A noisy count rounded, with thousands separated: `1,003,637`.
fn fmt_count(x: f64) -> String {
    let n = x.round().max(0.0) as u64;
    let digits = n.to_string();
    let mut out = String::new();
    for (i, ch) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_print_with_thousands_separated() {
        assert_eq!(fmt_count(1_003_637.4), "1,003,637");
        assert_eq!(fmt_count(999.0), "999");
        assert_eq!(fmt_count(-3.0), "0");
    }

    #[test]
    fn every_private_table_gets_its_count_keys_and_sums() {
        let policy = crate::policy::parse(include_str!("../../policies/demo.yaml")).unwrap();
        let visits = policy.table("demo.visits").unwrap();
        let sqls: Vec<String> = statements(visits).into_iter().map(|(s, _)| s).collect();
        assert_eq!(sqls[0], "SELECT COUNT(*) FROM \"demo\".\"visits\"");
        assert!(sqls.contains(
            &"SELECT \"clinic\", COUNT(*) FROM \"demo\".\"visits\" GROUP BY \"clinic\"".to_string()
        ));
        assert!(sqls.contains(&"SELECT SUM(\"cost\") FROM \"demo\".\"visits\"".to_string()));
        let people = policy.table("demo.people").unwrap();
        let region = statements(people)
            .into_iter()
            .find(|(s, _)| s.contains("\"region\""))
            .unwrap();
        assert_eq!(region.1, Some(10), "the public domain's size");
    }
}
