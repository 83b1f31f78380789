//! A stateful random-operation test on the software NIC: seeded sequences of creating and
//! dropping CQs, QPs, regions and windows in any order, every kind of post with valid and
//! invalid arguments (bad keys, ranges past the end, misaligned atomics, too many entries,
//! oversized inline data), binds, unbinds, invalidates, `set_error`, connects and reconnects
//! (refused unless to the same peer) and polls.
//! After every step: no panic, every completion is of a request that was accepted, at most
//! once, on the CQ its QP was created with, from that QP, and a success only for a signaled
//! request. At the end every QP goes to error and everything drains: every accepted signaled
//! request (and every receive) of a live QP has completed exactly once, the send and receive
//! queues are back to their full size, and every window's key is the one the NIC holds.
//!
//! `BLUEFLAME_RANDOM_SEEDS=N` runs N seeds (default: a budget of a few seconds in CI);
//! `BLUEFLAME_RANDOM_SEED=S` replays one seed with its operation log printed.

mod world;

use world::{Rng, World};

fn run(seed: u64, steps: usize, verbose: bool) {
    let mut w = World::new(verbose);
    let mut r = Rng::new(seed);
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        for _ in 0..steps {
            w.step(&mut r);
        }
        w.finish();
    }));
    if let Err(e) = outcome {
        eprintln!("seed {seed} failed; last operations:");
        for l in &w.log {
            eprintln!("  {l}");
        }
        eprintln!(
            "replay: BLUEFLAME_RANDOM_SEED={seed} cargo test --test conformance random_ops::"
        );
        std::panic::resume_unwind(e);
    }
}

#[test]
fn random_operations_keep_every_promise() {
    if let Some(seed) = std::env::var("BLUEFLAME_RANDOM_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        return run(seed, 400, true);
    }
    let seeds: u64 = std::env::var("BLUEFLAME_RANDOM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(150);
    for seed in 0..seeds {
        run(seed, 400, false);
    }
}
