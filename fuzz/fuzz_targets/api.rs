//! The public API on the software NIC driven by the fuzzer: the random-operation test of
//! `tests/conformance/random_ops` (its model, `world.rs`, included here as it is), each of
//! its choices read from the input instead of a seeded generator, so that the fuzzer's
//! coverage steers them.
//!
//! Steps: creating and dropping CQs, QPs, regions and windows in any order; every kind of
//! post with valid and invalid arguments (bad keys, ranges past the end, misaligned atomics,
//! too many entries, oversized inline data); binds, unbinds, invalidates; `set_error`;
//! connects and reconnects; polls. Promised after every step (the model's checks): no
//! panic; every completion is of a request that was accepted, at most once, on the CQ its
//! QP was created with, from that QP, and a success only for a signaled request. At the end
//! every QP goes to error and everything drains: every accepted signaled request (and every
//! receive) of a live QP has completed exactly once, the queues are back to their full
//! size, and every window's key is the one the NIC holds.
#![no_main]

#[allow(dead_code, unreachable_pub)]
#[path = "../../tests/conformance/random_ops/world.rs"]
mod world;

use libfuzzer_sys::fuzz_target;

/// Steps of one run at most (the seeded test's length).
const STEPS: usize = 400;

fuzz_target!(|data: &[u8]| {
    let mut r = world::Rng::from_bytes(data);
    // BLUEFLAME_FUZZ_VERBOSE=1 (replaying an input) prints every operation as it goes.
    let verbose = std::env::var_os("BLUEFLAME_FUZZ_VERBOSE").is_some();
    let mut w = world::World::new(verbose);
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut steps = 0;
        while !r.exhausted() && steps < STEPS {
            w.step(&mut r);
            steps += 1;
        }
        w.finish();
    }));
    if let Err(e) = outcome {
        eprintln!("the last operations:");
        for l in &w.log {
            eprintln!("  {l}");
        }
        std::panic::resume_unwind(e);
    }
});
