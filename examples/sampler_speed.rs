//! Time per sample of the exact samplers, for `BENCHMARKS.md`-style checks by hand:
//! `cargo run --release --example sampler_speed`. Not a test: timings are never asserted.

use std::time::Instant;

use num_bigint::BigInt;
use num_rational::BigRational;
use pgdp::dp::mechanism::{
    sample_discrete_gaussian, sample_discrete_laplace, sample_rounded_gaussian, secure_rng,
};

const DRAWS: u32 = 100_000;

fn main() {
    let mut rng = secure_rng().expect("the OS has randomness");
    let scales = [
        ("1", BigRational::from_integer(BigInt::from(1))),
        (
            "1/0.3 (f64)",
            BigRational::from_float(1.0 / 0.3).expect("finite"),
        ),
        ("1000", BigRational::from_integer(BigInt::from(1000))),
        (
            "2^41 (real grid)",
            BigRational::from_integer(BigInt::from(1u64 << 41)),
        ),
    ];
    for (name, scale) in &scales {
        let started = Instant::now();
        let mut sink = BigInt::from(0);
        for _ in 0..DRAWS {
            sink += sample_discrete_laplace(&mut rng, scale);
        }
        let laplace = started.elapsed() / DRAWS;
        let started = Instant::now();
        for _ in 0..DRAWS {
            sink += sample_discrete_gaussian(&mut rng, scale);
        }
        let gaussian = started.elapsed() / DRAWS;
        let started = Instant::now();
        for _ in 0..DRAWS {
            sink += sample_rounded_gaussian(&mut rng, scale);
        }
        let rounded = started.elapsed() / DRAWS;
        println!(
            "scale {name:>18}: discrete laplace {laplace:>9.2?}  discrete gaussian {gaussian:>9.2?}  \
             rounded gaussian {rounded:>9.2?}  ({})",
            sink.bits()
        );
    }
}
