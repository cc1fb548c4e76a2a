//! A small process-wide memo for pure functions that every DP query calls with one of a handful
//! of arguments: the Gaussian ρ of an (ε, δ) and the per-order Rényi budgets of a limit
//! (`budget::accountant`), the Gaussian scale of a (sensitivity, ρ), the noise of a (mechanism,
//! sensitivity, budget, cells) and the Laplace error bound of a sum of cells (`dp::mechanism`).
//! Each costs hundreds of exact decimal or rational operations, most of a small query's CPU in
//! pgdp, while a policy asks for the same few arguments query after query.
//!
//! Invariants: a memo returns only what the function returned for an equal key, so a memoised
//! function gives the same answers, bit for bit, as without the memo; an error is never
//! remembered; a full memo forgets its oldest entry, and a poisoned lock only costs a
//! recomputation. No I/O.

use std::sync::Mutex;

/// Up to `capacity` (key, value) pairs, oldest first; a linear search, for small capacities.
pub struct Memo<K, V> {
    entries: Mutex<Vec<(K, V)>>,
    capacity: usize,
}

impl<K: PartialEq, V: Clone> Memo<K, V> {
    /// An empty memo of at most `capacity` entries (a bound of `limits`).
    pub const fn new(capacity: usize) -> Memo<K, V> {
        Memo {
            entries: Mutex::new(Vec::new()),
            capacity,
        }
    }

    /// The value remembered for `key`, else `compute()`, remembered when it succeeds.
    pub fn get_or_try<E>(&self, key: K, compute: impl FnOnce() -> Result<V, E>) -> Result<V, E> {
        let found = self.entries.lock().ok().and_then(|entries| {
            entries
                .iter()
                .find(|(k, _)| *k == key)
                .map(|(_, v)| v.clone())
        });
        if let Some(value) = found {
            return Ok(value);
        }
        let value = compute()?;
        if let Ok(mut entries) = self.entries.lock() {
            if entries.len() >= self.capacity {
                entries.remove(0);
            }
            entries.push((key, value.clone()));
        }
        Ok(value)
    }

    /// [`Memo::get_or_try`] of a function that cannot fail.
    pub fn get_or(&self, key: K, compute: impl FnOnce() -> V) -> V {
        match self.get_or_try(key, || Ok::<V, std::convert::Infallible>(compute())) {
            Ok(value) => value,
            Err(never) => match never {},
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Memo;

    #[test]
    fn remembers_answers_not_errors_and_forgets_the_oldest() {
        let memo: Memo<u32, u32> = Memo::new(2);
        let mut calls = 0;
        let mut square = |x: u32| {
            calls += 1;
            x * x
        };
        assert_eq!(memo.get_or(3, || square(3)), 9);
        assert_eq!(memo.get_or(3, || unreachable!("remembered")), 9);
        assert_eq!(memo.get_or(4, || square(4)), 16);
        // A third key pushes out the oldest (3), which is computed again.
        assert_eq!(memo.get_or(5, || square(5)), 25);
        assert_eq!(memo.get_or(3, || square(3)), 9);
        assert_eq!(calls, 4);
        // An error is returned and not remembered.
        assert_eq!(memo.get_or_try(7, || Err::<u32, &str>("no")), Err("no"));
        assert_eq!(memo.get_or_try(7, || Ok::<u32, &str>(49)), Ok(49));
    }
}
