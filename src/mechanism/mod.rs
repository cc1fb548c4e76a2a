//! Noise mechanisms: exact samplers (RNG injected) and the OS-seeded generator production uses.
//!
//! Invariants:
//! - Pure: no I/O, no global state, no clock. Randomness is a parameter
//!   `R: rand::Rng + rand::CryptoRng + ?Sized`; production passes [`secure_rng`]'s OS-seeded
//!   ChaCha20, tests a seeded one. [`secure_rng`] is the only function that touches the OS.
//! - No noise is ever computed in floating point (Mironov 2012): the samplers work on exact
//!   rationals and return integers.
//!
//! Timing. The samplers run in time that depends on the random draws: the geometric loop inside
//! the discrete Laplace runs about `|noise|/scale` times, rejection loops repeat a random number
//! of times, and big-integer operations grow with the size of the numbers. So the time to release
//! a value carries information about the noise actually added, and since the released value is
//! exact + noise, information about the noise is information about the exact value (Jin,
//! McMurtry, Rubinstein & Ohrimenko, "Are We There Yet? Timing and Floating-Point Attacks on
//! Differential Privacy Systems", IEEE S&P 2022). The running time never depends on the data
//! directly. This module does nothing against the channel; a later hardening step should draw
//! noise ahead of time (a pool per scale, refilled off the request path) or pad the release step
//! to a fixed duration. Parsing `numeric` text takes time linear in its length, which depends on
//! the data; the upstream's own query time already reveals more, and is the session's concern.

mod sample;
#[cfg(test)]
mod testing;

use rand::rngs::{ChaCha20Rng, SysRng};
use rand::SeedableRng;

use crate::{Error, Result};

pub use sample::{
    bernoulli, bernoulli_exp, sample_discrete_gaussian, sample_discrete_laplace, sample_geometric,
    uniform_below,
};

/// A ChaCha20 generator seeded with 256 bits from the operating system's random source.
///
/// This is the generator production code passes to every sampler; create one per connection (or
/// per query), never share a seeded one across analysts.
///
/// # Errors
/// [`Error::Internal`] if the operating system cannot provide randomness.
pub fn secure_rng() -> Result<ChaCha20Rng> {
    ChaCha20Rng::try_from_rng(&mut SysRng)
        .map_err(|e| Error::internal(format!("the operating system's random source failed: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::Rng;

    #[test]
    fn secure_rng_draws() {
        let mut a = secure_rng().expect("the OS has randomness");
        let mut b = secure_rng().expect("the OS has randomness");
        // Two OS-seeded generators agreeing on 128 bits would mean a broken seed.
        assert_ne!((a.next_u64(), a.next_u64()), (b.next_u64(), b.next_u64()));
    }
}
