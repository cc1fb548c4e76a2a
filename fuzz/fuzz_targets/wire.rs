//! Arbitrary frontend message streams against an in-process pgdp (see `src/wire.rs`). Needs the
//! PostgreSQL the integration tests use (docs/fuzzing.md).
#![no_main]

use std::sync::OnceLock;

use pgdp_fuzz::wire;

/// The runtime and server, started on the first input and kept for the whole run.
struct Fixture {
    runtime: tokio::runtime::Runtime,
    target: wire::Target,
    inputs: std::sync::atomic::AtomicU64,
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a tokio runtime");
        let target = runtime.block_on(wire::start());
        Fixture {
            runtime,
            target,
            inputs: std::sync::atomic::AtomicU64::new(0),
        }
    })
}

/// Every this many inputs, check that pgdp still accepts connections and answers.
const ALIVE_EVERY: u64 = 256;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let f = fixture();
    let addr = f.target.addr;
    if let Err(e) = f.runtime.block_on(wire::exchange(addr, data)) {
        panic!("wire invariant broken: {e}");
    }
    let n = f.inputs.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    if n % ALIVE_EVERY == 0 {
        if let Err(e) = f.runtime.block_on(wire::alive(addr)) {
            panic!("pgdp stopped answering: {e}");
        }
    }
});
