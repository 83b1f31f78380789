//! The software NIC's ordering mode: later requests of a QP overtake earlier reads, atomics
//! and key operations wherever the InfiniBand rules allow, and only fences stop them. So a
//! missing fence, in a user's program or in the crate (the initiator small fence armed
//! after a bind or local invalidate), fails here as it would on a ConnectX.
//!
//! Each check runs on stepped NICs over many seeds; a failure names its seed, and
//! `BLUEFLAME_SIM_ORDER=<seed>` replays it in any test.

use crate::spec;

use blueflame::*;
use spec::scenarios::{self, Pair};
use std::panic::{catch_unwind, AssertUnwindSafe};

const SEEDS: u64 = 32;
const REGION: Access = Access(1 | 2 | 4 | 8 | 16); // local write, remote write/read/atomic, bind
const RW: Access = Access(Access::REMOTE_READ.0 | Access::REMOTE_WRITE.0);

/// A stepped software NIC reordering with `seed`.
fn nic(seed: u64) -> Device {
    let dev = Device::sim_stepped();
    dev.nic().unwrap().set_order(OrderMode::Relaxed { seed });
    dev
}

fn pair(dev: &Device) -> Pair {
    Pair::new(dev, REGION, scenarios::caps(), &Timing::default())
}

/// How many of the seeds make `check` panic.
fn failing_seeds(check: impl Fn(&Device)) -> Vec<u64> {
    (0..SEEDS)
        .filter(|&seed| catch_unwind(AssertUnwindSafe(|| check(&nic(seed)))).is_err())
        .collect()
}

#[test]
fn barrier_fence_fails_without_a_fence_that_waits_for_reads() {
    // The specification check as written (small-and-fence, rdma-core's IBV_SEND_FENCE),
    // the kernel's IBV_SEND_FENCE (fence) and strong ordering hold the write back.
    for fence in [Fence::SmallAndFence, Fence::Fence, Fence::StrongOrdering] {
        let bad = failing_seeds(|d| spec::barrier_fence_with(d, fence));
        assert!(bad.is_empty(), "{fence:?}: seeds {bad:?} failed");
    }
    // Without it (or with the initiator small fence, which waits for key operations only)
    // the write lands before the read has read "before".
    for fence in [Fence::None, Fence::InitiatorSmall] {
        let bad = failing_seeds(|d| spec::barrier_fence_with(d, fence));
        println!(
            "barrier_fence with {fence:?}: {} of {SEEDS} seeds fail",
            bad.len()
        );
        assert!(
            !bad.is_empty(),
            "{fence:?}: the read never saw the later write on {SEEDS} seeds"
        );
    }
    // In order (what the software NIC did before the ordering mode) the missing fence
    // goes unnoticed.
    let strict = Device::sim_stepped();
    strict.nic().unwrap().set_order(OrderMode::Strict);
    spec::barrier_fence_with(&strict, Fence::None);
}

/// An atomic followed by an unfenced write to the same word: the atomic may find the
/// written value; with a fence, never.
fn atomic_then_write(dev: &Device, fence: Fence) -> u64 {
    let mut p = pair(dev);
    p.mr_b.write(0, &5u64.to_ne_bytes()).unwrap();
    p.a.fetch_add(
        p.mr_b.remote(0).unwrap(),
        1,
        p.mr_a.sge(0, 8).unwrap(),
        1,
        PostFlags::SIGNALED,
    )
    .unwrap();
    p.a.write_inline(
        &100u64.to_ne_bytes(),
        p.mr_b.remote(0).unwrap(),
        2,
        PostFlags::SIGNALED.fence(fence),
    )
    .unwrap();
    let got = p.wait(false, 2);
    assert_eq!((got[0].0, got[1].0), (1, 2), "completions in order");
    assert!(got.iter().all(|c| c.1 == WcStatus::Success), "{got:?}");
    let mut reply = [0u8; 8];
    p.mr_a.read(0, &mut reply).unwrap();
    p.a.atomic_result(&reply).unwrap()
}

#[test]
fn an_atomic_is_overtaken_by_an_unfenced_write() {
    let olds: Vec<u64> = (0..SEEDS)
        .map(|s| atomic_then_write(&nic(s), Fence::None))
        .collect();
    assert!(olds.iter().all(|&v| v == 5 || v == 100), "{olds:?}");
    assert!(olds.contains(&100), "never overtaken: {olds:?}");
    assert!(olds.contains(&5), "always overtaken: {olds:?}");
    for s in 0..SEEDS {
        assert_eq!(atomic_then_write(&nic(s), Fence::Fence), 5, "seed {s}");
    }
}

#[test]
fn a_read_after_a_write_always_sees_it_and_completions_stay_in_order() {
    for seed in 0..SEEDS {
        let dev = nic(seed);
        let mut p = pair(&dev);
        p.mr_b.write(0, b"old").unwrap();
        p.a.write_inline(b"new", p.mr_b.remote(0).unwrap(), 1, PostFlags::SIGNALED)
            .unwrap();
        p.a.read(
            &[p.mr_a.sge(0, 3).unwrap()],
            p.mr_b.remote(0).unwrap(),
            2,
            PostFlags::SIGNALED,
        )
        .unwrap();
        // Reads in a row, unfenced writes between them: the completions still come in
        // the order posted.
        for i in 3..10u64 {
            if i % 2 == 0 {
                p.a.read(
                    &[p.mr_a.sge(64 * i as usize, 8).unwrap()],
                    p.mr_b.remote(1024).unwrap(),
                    i,
                    PostFlags::SIGNALED,
                )
                .unwrap();
            } else {
                p.a.write_inline(b"x", p.mr_b.remote(2048).unwrap(), i, PostFlags::SIGNALED)
                    .unwrap();
            }
        }
        let got = p.wait(false, 9);
        let cookies: Vec<u64> = got.iter().map(|c| c.0).collect();
        assert_eq!(cookies, (1..10).collect::<Vec<_>>(), "seed {seed}");
        assert!(got.iter().all(|c| c.1 == WcStatus::Success), "seed {seed}");
        assert_eq!(Pair::bytes(&p.mr_a, 0, 3), b"new", "seed {seed}");
    }
}

/// Steps the NIC one pass at a time (a peer acts as soon as it sees a completion, before the
/// NIC has idled) until `cq` gives one completion.
fn step_until_one(dev: &Device, cq: &mut Cq) -> Completion {
    let mut out = [Completion::default(); 1];
    for _ in 0..1000 {
        dev.nic().unwrap().process();
        if cq.poll(&mut out) == 1 {
            return out[0];
        }
    }
    panic!("no completion after 1000 passes");
}

/// B binds a window and sends its key; A writes through it as soon as the send arrives.
/// The send after the bind carries the initiator small fence the crate arms (rdma-core's
/// `next_fence`), so the window is bound before the peer can know the key.
fn bind_then_use(dev: &Device, mw_type: MwType) {
    let mut p = pair(dev);
    let mut mw = p.b.pd().alloc_mw(mw_type).unwrap();
    p.a.post_recv(&[p.mr_a.sge(1024, 16).unwrap()], 30).unwrap();
    let rkey =
        p.b.bind_mw(&mut mw, &p.mr_b, 512, 128, RW, 1, PostFlags::UNSIGNALED)
            .unwrap();
    p.b.send(
        Payload::Inline(&rkey.to_ne_bytes()),
        2,
        PostFlags::UNSIGNALED,
    )
    .unwrap();
    let r = step_until_one(dev, &mut p.cq_a);
    assert_eq!((r.cookie, r.status), (30, WcStatus::Success));
    let advertised = u32::from_ne_bytes(Pair::bytes(&p.mr_a, 1024, 4).try_into().unwrap());
    let addr = p.mr_b.addr() + 512;
    p.a.write_inline(
        b"via window",
        Remote {
            addr,
            rkey: advertised,
        },
        3,
        PostFlags::SIGNALED,
    )
    .unwrap();
    let c = step_until_one(dev, &mut p.cq_a);
    assert_eq!((c.cookie, c.status), (3, WcStatus::Success), "{c:?}");
    assert_eq!(Pair::bytes(&p.mr_b, 512, 10), b"via window");
}

#[test]
fn the_fence_after_a_bind_keeps_the_key_from_arriving_first() {
    for mw_type in [MwType::One, MwType::Two] {
        let bad = failing_seeds(|d| bind_then_use(d, mw_type));
        assert!(bad.is_empty(), "{mw_type:?}: seeds {bad:?} failed");
    }
}

/// B invalidates its type-2 window and tells A so; A's write through the old key, posted as
/// soon as the message arrives, must fail. The crate's fence after the local invalidate
/// keeps the message from overtaking it.
fn invalidate_then_tell(dev: &Device) {
    let mut p = pair(dev);
    let mut mw = p.b.pd().alloc_mw(MwType::Two).unwrap();
    let rkey =
        p.b.bind_mw(&mut mw, &p.mr_b, 0, 256, RW, 1, PostFlags::SIGNALED)
            .unwrap();
    assert_eq!(p.wait(true, 1)[0].1, WcStatus::Success);
    let addr = p.mr_b.addr();
    p.a.post_recv(&[p.mr_a.sge(1024, 16).unwrap()], 40).unwrap();
    p.b.unbind_mw(&mut mw, 2, PostFlags::UNSIGNALED).unwrap();
    p.b.send(Payload::Inline(b"gone"), 3, PostFlags::UNSIGNALED)
        .unwrap();
    let r = step_until_one(dev, &mut p.cq_a);
    assert_eq!((r.cookie, r.status), (40, WcStatus::Success));
    p.a.write_inline(b"stale", Remote { addr, rkey }, 4, PostFlags::SIGNALED)
        .unwrap();
    let c = step_until_one(dev, &mut p.cq_a);
    assert_eq!((c.cookie, c.status), (4, WcStatus::RemAccessErr), "{c:?}");
    assert_eq!(Pair::bytes(&p.mr_b, 0, 5), [0; 5], "nothing written");
}

#[test]
fn the_fence_after_a_local_invalidate_keeps_the_news_from_arriving_first() {
    let bad = failing_seeds(invalidate_then_tell);
    assert!(bad.is_empty(), "seeds {bad:?} failed");
}

#[test]
fn requests_are_held_back_on_some_seeds_and_never_in_strict_mode() {
    let held = |dev: &Device| {
        let mut p = pair(dev);
        for i in 0..8u64 {
            p.a.read(
                &[p.mr_a.sge(0, 8).unwrap()],
                p.mr_b.remote(0).unwrap(),
                i,
                PostFlags::UNSIGNALED,
            )
            .unwrap();
            p.a.write_inline(b"w", p.mr_b.remote(64).unwrap(), i, PostFlags::UNSIGNALED)
                .unwrap();
        }
        p.a.write_inline(b"end", p.mr_b.remote(128).unwrap(), 99, PostFlags::SIGNALED)
            .unwrap();
        assert_eq!(p.wait(false, 1)[0].0, 99);
        dev.nic().unwrap().qp_stats(p.a.qpn()).unwrap().held_back
    };
    assert!(held(&nic(1)) > 0);
    let strict = Device::sim_stepped();
    strict.nic().unwrap().set_order(OrderMode::Strict);
    assert_eq!(held(&strict), 0);
    // Reproducible: the same seed holds back the same requests.
    assert_eq!(held(&nic(3)), held(&nic(3)));
}

#[test]
fn the_scenarios_give_the_same_results_in_order_and_reordered() {
    // What the differential test compares with rxe must not depend on the seed.
    let strict = Device::sim_stepped();
    strict.nic().unwrap().set_order(OrderMode::Strict);
    let want = scenarios::run_all(&strict);
    for seed in 0..4 {
        let got = scenarios::run_all(&nic(seed));
        let d = scenarios::diff("in order", &want, &format!("seed {seed}"), &got);
        assert!(d.is_empty(), "{d}");
    }
}
