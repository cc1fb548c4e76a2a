//! The noisy measures of a release: the groups it released (public domains or partition
//! selection) and, for each, the noisy value of every measure, before anything is derived from
//! them. Everything the analyst receives ([`super::finish`]: AVG from noisy parts, clamping,
//! HAVING, ORDER BY, OFFSET, LIMIT, expressions evaluated by PostgreSQL) is a function of these
//! values alone, so answering a later query from a stored [`NoisyMeasures`] is post-processing
//! and costs nothing (docs/privacy.md, "The replay cache and reuse of noisy measures").
//!
//! Invariants (each enforced by the types):
//! - A [`NoisyMeasures`] is made only by [`super::measure`], which draws the noise, by
//!   [`super::derive`], which adds up the cells of one [`super::measure`] drew (then it carries a
//!   [`Derivation`]: how many cells each group adds and the error bounds of those sums), or read
//!   back by [`NoisyMeasures::from_payload`] from a payload [`NoisyMeasures::payload`] wrote for
//!   an earlier release of the same analyst, as the ledger returns it ([`Stored`], which only
//!   the ledger makes). Its fields are private to [`crate::dp::release`].
//! - Measures derived from an earlier, finer release are stored only under a
//!   [`derived_key`], never under a [`measures_key`] (the session checks
//!   [`NoisyMeasures::derived_from`] on both paths).
//! - It holds only released groups: a candidate group that partition selection dropped has no
//!   entry (the noisy count that decided against it was never released, so it is never stored).
//! - [`measures_key`] covers everything the noisy values depend on (the upstream SQL with its
//!   tables, filters, keys, clamping bounds and caps; the bound parameters; the measures; every
//!   noise scale and grid; the ε split, δ and the family; partition selection; the public
//!   domain), and nothing they do not (HAVING, ORDER BY, LIMIT, aliases, expressions over the
//!   aggregates, the text's spelling).
//!
//! Outside the release, noisy measures come only from a payload the release wrote, as the
//! ledger stored it:
//!
//! ```
//! # use pgdp::budget::Stored;
//! # use pgdp::dp::{plan::Plan, release::NoisyMeasures, rewrite::Rewrite};
//! fn read(stored: &Stored, plan: &Plan, rewrite: &Rewrite) -> Option<NoisyMeasures> {
//!     NoisyMeasures::from_payload(stored, plan, rewrite)
//! }
//! ```
//!
//! never from bytes a caller made:
//!
//! ```compile_fail,E0308
//! # use pgdp::dp::{plan::Plan, release::NoisyMeasures, rewrite::Rewrite};
//! fn forge(bytes: &[u8], plan: &Plan, rewrite: &Rewrite) -> Option<NoisyMeasures> {
//!     NoisyMeasures::from_payload(bytes, plan, rewrite)
//! }
//! ```
//!
//! and cannot be made up: every field given, of its type, does not compile (they are private):
//!
//! ```compile_fail,E0451
//! let forged = pgdp::dp::release::NoisyMeasures {
//!     keys: 0,
//!     measures: 1,
//!     groups: vec![(Vec::<Option<String>>::new(), vec![42.0])],
//!     derivation: None,
//! };
//! ```

use crate::budget::Stored;
use crate::dp::plan::Plan;
use crate::dp::rewrite::domain::{Part, Source};
use crate::dp::rewrite::Rewrite;
use crate::limits;

use super::Mechanisms;

/// The groups a release released, each with its key texts (PostgreSQL's text of the upstream's
/// or the public domain's values) and the noisy value of each of the rewrite's measures.
#[derive(Debug, Clone, PartialEq)]
pub struct NoisyMeasures {
    /// Keys per group.
    pub(super) keys: usize,
    /// Measures per group.
    pub(super) measures: usize,
    /// Released groups, in key order: key texts, noisy measure values.
    pub(super) groups: Vec<(Vec<Option<String>>, Vec<f64>)>,
    /// Set when these measures were not drawn for their grouping but added up from the cells
    /// of a finer release ([`super::derive`]).
    pub(super) derivation: Option<Derivation>,
}

/// One group's count from a synopsis: its keys, the count, and its 95 % and 97.5 % error bounds.
pub type SynopsisCount = (Vec<Option<String>>, f64, (f64, f64));

/// How derived noisy measures were computed from a finer release: each group is the sum of
/// some of its cells, so each value's noise is the sum of that many independent noises.
#[derive(Debug, Clone, PartialEq)]
pub struct Derivation {
    /// The finer release's group keys, as the analyst wrote them (for the NOTICE), when it was
    /// an earlier query's; `None` when the finer grouping is a grouping set of the same query,
    /// measured in the same release ([`super::grouping`]).
    pub(super) from: Option<String>,
    /// Per group (in the order of [`NoisyMeasures::groups`]): how many finer cells it adds.
    pub(super) cells: Vec<u64>,
    /// Per group: the 95 % and the 97.5 % error bound of each measure, those of a sum of
    /// `cells` of the finer release's noises ([`crate::dp::mechanism::Noise::sum_error_bound`]).
    pub(super) bounds: Vec<(Vec<f64>, Vec<f64>)>,
}

/// First bytes of a payload of noisy measures (and its format's version).
const MAGIC: &[u8] = b"pgdp-noisy-measures-1";

/// First bytes of a payload of derived noisy measures (and its format's version): the finer
/// grouping's text, then a payload of noisy measures, then each group's cells and bounds.
const MAGIC_DERIVED: &[u8] = b"pgdp-derived-measures-1";

impl NoisyMeasures {
    /// The counts a synopsis answered ([`crate::dp::mechanism::pmw`]), one measure per group:
    /// each group's keys, its count (rounded to a whole number of rows, at least 0: both
    /// post-processing) and its 95 % and 97.5 % error bounds, stated per group (an estimate's
    /// bound and an update's differ).
    pub fn from_synopsis(keys: usize, groups: Vec<SynopsisCount>) -> NoisyMeasures {
        let bounds = groups
            .iter()
            .map(|(_, _, (b95, b975))| (vec![*b95], vec![*b975]))
            .collect();
        let cells = vec![1; groups.len()];
        NoisyMeasures {
            keys,
            measures: 1,
            groups: groups
                .into_iter()
                .map(|(k, v, _)| (k, vec![v.round().max(0.0)]))
                .collect(),
            derivation: Some(Derivation {
                from: None,
                cells,
                bounds,
            }),
        }
    }

    /// How many groups were released.
    pub fn len(&self) -> usize {
        self.groups.len()
    }

    /// Whether no group was released.
    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }

    /// The finer grouping (its keys as the analyst wrote them) these measures were added up
    /// from, when they were derived.
    pub fn derived_from(&self) -> Option<&str> {
        self.derivation.as_ref().and_then(|d| d.from.as_deref())
    }

    /// The most finer cells one derived group adds (1 when not derived).
    pub fn cells_max(&self) -> u64 {
        self.derivation
            .as_ref()
            .and_then(|d| d.cells.iter().copied().max())
            .unwrap_or(1)
    }

    /// Whether the ledger keeps these measures for reuse: at most
    /// [`limits::MEASURES_STORED_GROUPS_MAX`] groups (a larger release is answered, not kept, and
    /// a query that could have reused it is charged).
    pub fn storable(&self) -> bool {
        self.groups.len() <= limits::MEASURES_STORED_GROUPS_MAX
    }

    /// The measures as a payload for the ledger (a tagged, length-prefixed format; the values
    /// as the bits of their `f64`, so they read back exactly).
    pub fn payload(&self) -> Vec<u8> {
        let plain = self.plain_payload();
        let Some(d) = &self.derivation else {
            return plain;
        };
        let mut out = Vec::from(MAGIC_DERIVED);
        match &d.from {
            None => out.push(b'N'),
            Some(from) => {
                out.push(b'T');
                out.extend_from_slice(&(from.len() as u64).to_be_bytes());
                out.extend_from_slice(from.as_bytes());
            }
        }
        out.extend_from_slice(&(plain.len() as u64).to_be_bytes());
        out.extend_from_slice(&plain);
        for (cells, (b95, b975)) in d.cells.iter().zip(&d.bounds) {
            out.extend_from_slice(&cells.to_be_bytes());
            for value in b95.iter().chain(b975) {
                out.extend_from_slice(&value.to_bits().to_be_bytes());
            }
        }
        out
    }

    /// The payload of the groups and values alone (format [`MAGIC`]).
    fn plain_payload(&self) -> Vec<u8> {
        let mut out = Vec::from(MAGIC);
        for n in [self.keys, self.measures, self.groups.len()] {
            out.extend_from_slice(&(n as u64).to_be_bytes());
        }
        for (keys, values) in &self.groups {
            for key in keys {
                match key {
                    None => out.push(b'N'),
                    Some(text) => {
                        out.push(b'T');
                        out.extend_from_slice(&(text.len() as u64).to_be_bytes());
                        out.extend_from_slice(text.as_bytes());
                    }
                }
            }
            for value in values {
                out.extend_from_slice(&value.to_bits().to_be_bytes());
            }
        }
        out
    }

    /// Measures an earlier release of the same analyst stored for `plan` and `rewrite`'s measures
    /// ([`NoisyMeasures::payload`], found under the same [`measures_key`]). `None` for a payload
    /// it did not write, or one of another shape (keys or measures per group), which is then
    /// not reused.
    pub fn from_payload(stored: &Stored, plan: &Plan, rewrite: &Rewrite) -> Option<NoisyMeasures> {
        let measures = decode(stored.bytes())?;
        // With grouping sets each group also carries its set's index, as a last key text.
        let keys = plan.keys.len() + usize::from(plan.grouping_sets.is_some());
        (measures.keys == keys && measures.measures == rewrite.measures.len()).then_some(measures)
    }
}

fn u64_of(b: &mut &[u8]) -> Option<u64> {
    let (head, rest) = b.split_at_checked(8)?;
    *b = rest;
    Some(u64::from_be_bytes(head.try_into().ok()?))
}

/// The inverse of [`NoisyMeasures::payload`]; `None` for a payload it did not write.
fn decode(payload: &[u8]) -> Option<NoisyMeasures> {
    let Some(mut b) = payload.strip_prefix(MAGIC_DERIVED) else {
        return decode_plain(payload);
    };
    let (tag, rest) = b.split_first()?;
    b = rest;
    let from = match tag {
        b'N' => None,
        b'T' => {
            let len = usize::try_from(u64_of(&mut b)?).ok()?;
            let (from, rest) = b.split_at_checked(len)?;
            b = rest;
            Some(String::from_utf8(from.to_vec()).ok()?)
        }
        _ => return None,
    };
    let len = usize::try_from(u64_of(&mut b)?).ok()?;
    let (plain, rest) = b.split_at_checked(len)?;
    b = rest;
    let mut measures = decode_plain(plain)?;
    let n = measures.groups.len();
    let mut cells = Vec::with_capacity(n);
    let mut bounds = Vec::with_capacity(n);
    for _ in 0..n {
        cells.push(u64_of(&mut b)?);
        let mut values = Vec::with_capacity(2 * measures.measures);
        for _ in 0..2 * measures.measures {
            values.push(f64::from_bits(u64_of(&mut b)?));
        }
        let b975 = values.split_off(measures.measures);
        bounds.push((values, b975));
    }
    if !b.is_empty() {
        return None;
    }
    measures.derivation = Some(Derivation {
        from,
        cells,
        bounds,
    });
    Some(measures)
}

/// [`decode`] of a payload of format [`MAGIC`].
fn decode_plain(payload: &[u8]) -> Option<NoisyMeasures> {
    let mut b = payload.strip_prefix(MAGIC)?;
    let keys = usize::try_from(u64_of(&mut b)?).ok()?;
    let measures = usize::try_from(u64_of(&mut b)?).ok()?;
    let n = usize::try_from(u64_of(&mut b)?).ok()?;
    // Widths within what a plan can have (three measures at most per aggregate), so that a
    // damaged payload cannot ask for a huge allocation.
    if keys > limits::GROUP_KEYS_PER_QUERY_MAX + 1
        || measures > 3 * limits::AGGREGATES_PER_QUERY_MAX
    {
        return None;
    }
    let mut groups = Vec::with_capacity(n.min(limits::MEASURES_STORED_GROUPS_MAX));
    for _ in 0..n {
        let mut key_texts = Vec::with_capacity(keys);
        for _ in 0..keys {
            let (tag, rest) = b.split_first()?;
            b = rest;
            key_texts.push(match tag {
                b'N' => None,
                b'T' => {
                    let len = usize::try_from(u64_of(&mut b)?).ok()?;
                    let (text, rest) = b.split_at_checked(len)?;
                    b = rest;
                    Some(String::from_utf8(text.to_vec()).ok()?)
                }
                _ => return None,
            });
        }
        let mut values = Vec::with_capacity(measures);
        for _ in 0..measures {
            let value = f64::from_bits(u64_of(&mut b)?);
            if !value.is_finite() {
                return None;
            }
            values.push(value);
        }
        groups.push((key_texts, values));
    }
    b.is_empty().then_some(NoisyMeasures {
        keys,
        measures,
        groups,
        derivation: None,
    })
}

/// The ledger key under which measures derived for a query's grouping from a finer release
/// are kept ([`super::derive`]): its [`measures_key`] in a namespace of its own, so a derived
/// entry never stands for drawn measures.
pub fn derived_key(measures_key: &str) -> String {
    format!(
        "derived:{}",
        measures_key
            .strip_prefix("measures:")
            .unwrap_or(measures_key)
    )
}

/// The ledger key of the noisy measures a query's release draws: a fingerprint of everything
/// they depend on, and of nothing that is post-processing (module docs). Two queries with the
/// same key ask for the same measures of the same groups with the same mechanisms, so the
/// noisy values one released answer the other. `parameters` are the bound parameters (already
/// part of the upstream SQL, which inlines them; kept for clarity), `domain` the public domain's
/// parts ([`crate::dp::rewrite::domain::public_domain`]; empty with partition selection).
pub fn measures_key(
    plan: &Plan,
    rewrite: &Rewrite,
    mechanisms: &Mechanisms,
    parameters: &[Option<String>],
    domain: &[Part],
) -> String {
    let mut key = crate::budget::Fingerprint::default();
    key.part("pgdp noisy measures v1");
    key.part(rewrite.sql.as_str());
    key.printed(format_args!(
        "keys {} public {}",
        plan.keys.len(),
        plan.keys_public()
    ));
    key.printed(format_args!("parameters {}", parameters.len()));
    for p in parameters {
        match p {
            Some(v) => key.printed(format_args!("v{v}")),
            None => key.part("null"),
        }
    }
    for a in &rewrite.arguments {
        key.printed(format_args!(
            "argument {} bounds {:?}",
            a.text.as_str(),
            a.bounds
        ));
    }
    key.printed(format_args!("measures {}", rewrite.measures.len()));
    for (j, m) in rewrite.measures.iter().enumerate() {
        key.printed(format_args!(
            "{} integer {} sensitivity {:e}",
            m.label(&rewrite.arguments),
            m.is_integer(),
            mechanisms.sensitivities.get(j).copied().unwrap_or(f64::NAN)
        ));
    }
    for n in &mechanisms.noises {
        key.printed(format_args!(
            "noise {:?} scale {:e} grid {:?}",
            n.kind(),
            n.scale(),
            n.grid_exponent()
        ));
    }
    let b = mechanisms.budget;
    key.printed(format_args!(
        "epsilon {:e} delta {:e} mechanism {} shares {} per share {:e}",
        b.epsilon,
        b.delta,
        b.mechanism.name(),
        mechanisms.shares,
        mechanisms.epsilon_per_measure
    ));
    match &mechanisms.selection {
        Some(s) => key.printed(format_args!(
            "selection {:?}{} scale {:e} threshold {} delta {:e} groups {} by measure {:?}",
            s.kind(),
            if s.is_optimal_rule() { " optimal" } else { "" },
            s.scale(),
            s.threshold(),
            s.delta(),
            s.max_groups_per_unit(),
            mechanisms.selection_measure
        )),
        None => key.part("no selection"),
    }
    // With grouping sets, each set's own mechanisms (the fields above are the first set's).
    key.printed(format_args!("grouping sets {:?}", plan.grouping_sets));
    for (s, m) in mechanisms.sets.iter().enumerate() {
        set_key(&mut key, s, m);
    }
    key.printed(format_args!("domain {}", domain.len()));
    for part in domain {
        key.printed(format_args!("part {:?}", part.keys));
        match &part.source {
            Source::Values(combinations) => {
                key.part("values");
                for row in combinations {
                    key.part(&texts(row));
                }
            }
            Source::Query(sql) => {
                key.part("query");
                key.part(sql.as_str());
            }
            Source::Filtered { sql, values } => {
                key.part("filtered");
                key.part(sql.as_str());
                key.part(&texts(values));
            }
        }
    }
    format!("measures:{}", key.finish())
}

/// The parts of [`measures_key`] for grouping set `s` with mechanisms `m`.
fn set_key(key: &mut crate::budget::Fingerprint, s: usize, m: &Mechanisms) {
    key.printed(format_args!(
        "set {s} epsilon {:e} delta {:e} shares {} per share {:e}",
        m.budget.epsilon, m.budget.delta, m.shares, m.epsilon_per_measure
    ));
    for (j, n) in m.noises.iter().enumerate() {
        key.printed(format_args!(
            "set {s} noise {:?} scale {:e} grid {:?} sensitivity {:e}",
            n.kind(),
            n.scale(),
            n.grid_exponent(),
            m.sensitivities.get(j).copied().unwrap_or(f64::NAN)
        ));
    }
    match &m.selection {
        Some(sel) => {
            key.printed(format_args!(
            "set {s} selection {:?}{} scale {:e} threshold {} delta {:e} groups {} by measure {:?}",
            sel.kind(),
            if sel.is_optimal_rule() { " optimal" } else { "" },
            sel.scale(),
            sel.threshold(),
            sel.delta(),
            sel.max_groups_per_unit(),
            m.selection_measure
        ))
        }
        None => key.printed(format_args!("set {s} no selection")),
    }
}

/// Key texts as one unambiguous string (each length-prefixed, NULL apart).
fn texts(row: &[Option<String>]) -> String {
    row.iter()
        .map(|t| match t {
            Some(t) => format!("{}:{t}", t.len()),
            None => "-".into(),
        })
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> NoisyMeasures {
        NoisyMeasures {
            keys: 2,
            measures: 3,
            groups: vec![
                (vec![Some("CE".into()), None], vec![12.0, -0.1, 1.5e300]),
                (
                    vec![Some("a'b\u{e9}".into()), Some(String::new())],
                    vec![0.0, -0.0, 7.25],
                ),
            ],
            derivation: None,
        }
    }

    #[test]
    fn noisy_measures_round_trip_bit_for_bit() {
        let m = sample();
        let back = decode(&m.payload()).expect("decodes");
        assert_eq!(back, m);
        for ((_, a), (_, b)) in back.groups.iter().zip(&m.groups) {
            let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(a), bits(b), "the values read back exactly");
        }
        let empty = NoisyMeasures {
            keys: 0,
            measures: 1,
            groups: Vec::new(),
            derivation: None,
        };
        assert_eq!(decode(&empty.payload()), Some(empty));
        let mut derived = sample();
        derived.derivation = Some(Derivation {
            from: Some("sex, region".into()),
            cells: vec![10, 3],
            bounds: vec![
                (vec![1.0, 2.0, 3.0], vec![1.5, 2.5, 3.5]),
                (vec![4.0, 5.0, 6.0], vec![4.5, 5.5, 6.5]),
            ],
        });
        let back = decode(&derived.payload()).expect("decodes");
        assert_eq!(back, derived);
        assert_eq!(back.derived_from(), Some("sex, region"));
        assert_eq!(back.cells_max(), 10);
        let payload = derived.payload();
        assert_eq!(decode(&payload[..payload.len() - 1]), None);
    }

    #[test]
    fn a_payload_not_written_for_measures_is_refused() {
        let payload = sample().payload();
        assert_eq!(decode(b"garbage"), None);
        // A replay payload (released rows) is not a payload of measures.
        assert_eq!(decode(&payload[MAGIC.len()..]), None);
        // Truncated, or with bytes after the end.
        assert_eq!(decode(&payload[..payload.len() - 1]), None);
        let mut longer = payload.clone();
        longer.push(0);
        assert_eq!(decode(&longer), None);
        // A value that is not finite is never released, so it is never read back.
        let mut nan = sample();
        nan.groups[0].1[0] = f64::NAN;
        assert_eq!(decode(&nan.payload()), None);
    }

    #[test]
    fn key_texts_are_unambiguous() {
        assert_ne!(
            texts(&[Some("a,b".into())]),
            texts(&[Some("a".into()), Some("b".into())])
        );
        assert_ne!(texts(&[None]), texts(&[Some("-".into())]));
    }
}
