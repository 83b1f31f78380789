//! Safe code cannot reach freed or unregistered memory, nor a data race (issue 12, "undefined
//! behaviour reachable from safe code"): key and number allocation on the software NIC,
//! region bytes shared with the NIC, and registrations whose deregistration must wait.

use blueflame::*;

const RIGHTS: Access = Access(1 | 2 | 4 | 16);

fn loopback(dev: &Device, pd: &Pd) -> (Cq, Qp) {
    let cq = dev.create_cq(64).unwrap();
    let mut qp = pd.create_qp(&cq, &cq, QpCaps::default()).unwrap();
    let me = qp.endpoint().unwrap();
    qp.connect(&me).unwrap();
    (cq, qp)
}

fn write_ok(dev: &Device, cq: &mut Cq, qp: &mut Qp, src: &MemoryRegion, dst: &MemoryRegion) {
    qp.write(
        &[src.sge(0, 16).unwrap()],
        dst.remote(0).unwrap(),
        9,
        PostFlags::SIGNALED,
    )
    .unwrap();
    dev.process();
    let mut out = [Completion::default(); 1];
    assert_eq!(cq.poll(&mut out), 1);
    assert_eq!((out[0].cookie, out[0].status), (9, WcStatus::Success));
}

/// Windows allocated and dropped until the key index space has wrapped twice. A new region
/// must never get the key index of a live one (the old NIC overwrote the live region's table
/// entry and freed its buffer). A NIC of 4,096 key indices wraps as one of a ConnectX's 2^24
/// does (the same allocator, its bound a parameter), in 8,192 allocations instead of 2^24
/// (43 s of the test run).
#[test]
fn key_indices_that_wrap_never_name_a_live_region() {
    const KEYS: u32 = 1 << 12;
    let limits = mlx5::sim::Limits {
        keys: KEYS,
        ..Default::default()
    };
    let dev = Device::sim_with(limits, UarConfig::default(), false);
    let pd = dev.alloc_pd().unwrap();
    let (mut cq, mut qp) = loopback(&dev, &pd);
    let first = pd.alloc_mr(4096, RIGHTS).unwrap();
    let src = pd.alloc_mr(4096, RIGHTS).unwrap();
    src.write(0, b"sixteen bytes!!!").unwrap();
    let live = [first.lkey() >> 8, src.lkey() >> 8];
    for i in 0..2 * KEYS {
        let mw = pd.alloc_mw(MwType::Two).unwrap();
        assert!(
            !live.contains(&(mw.rkey() >> 8)),
            "window {i} got a live key index"
        );
    }
    let second = pd.alloc_mr(4096, RIGHTS).unwrap();
    assert_ne!(
        second.lkey() >> 8,
        first.lkey() >> 8,
        "a live key index reused"
    );
    assert_ne!(
        second.lkey() >> 8,
        src.lkey() >> 8,
        "a live key index reused"
    );
    // Both regions still work through their own keys.
    write_ok(&dev, &mut cq, &mut qp, &src, &first);
    write_ok(&dev, &mut cq, &mut qp, &src, &second);
    let mut got = [0u8; 16];
    first.read(0, &mut got).unwrap();
    assert_eq!(&got, b"sixteen bytes!!!");
}

/// QP numbers are 24 bits: past the last one the NIC reuses free numbers (round robin, so a
/// number just freed comes back last), never a live one, and refuses when all are in use.
/// (The old NIC counted on past 0xffffff: a QP with a 25-bit number that never ran.)
#[test]
fn qp_numbers_are_reused_round_robin_and_refused_when_exhausted() {
    use mlx5::sim::{Limits, Nic, QpCaps, SimError};
    let nic = Nic::with_limits(Limits {
        qps: 4,
        ..Limits::default()
    });
    let pd = nic.alloc_pd();
    let cq = nic.create_cq(64, 64).unwrap();
    let caps = QpCaps {
        sq_blocks: 16,
        rq_entries: 0,
        ..QpCaps::default()
    };
    let qpns: Vec<u32> = (0..4)
        .map(|_| nic.create_qp(pd, cq.cqn, cq.cqn, caps).unwrap().qpn)
        .collect();
    assert_eq!(qpns, [0x100, 0x101, 0x102, 0x103]);
    assert_eq!(
        nic.create_qp(pd, cq.cqn, cq.cqn, caps).map(|r| r.qpn),
        Err(SimError::Exhausted("QP number"))
    );
    nic.destroy_qp(0x101).unwrap();
    nic.destroy_qp(0x102).unwrap();
    // 0x101 was freed first and comes back first; no live number is handed out.
    let q = nic.create_qp(pd, cq.cqn, cq.cqn, caps).unwrap().qpn;
    assert_eq!(q, 0x101);
    let q = nic.create_qp(pd, cq.cqn, cq.cqn, caps).unwrap().qpn;
    assert_eq!(q, 0x102);
    nic.init_qp(q).unwrap();
    nic.connect(q, nic.path_to(q)).unwrap();
    assert_eq!(nic.qp_state(q), Some(mlx5::sim::QpState::Rts));
}

/// The same for CQ numbers and for key indices (regions and windows share them).
#[test]
fn cq_numbers_and_keys_are_refused_when_exhausted() {
    use mlx5::request::Access;
    use mlx5::sim::{Limits, Nic, SimError};
    let nic = Nic::with_limits(Limits {
        cqs: 2,
        keys: 3,
        ..Limits::default()
    });
    let a = nic.create_cq(8, 64).unwrap().cqn;
    let b = nic.create_cq(8, 64).unwrap().cqn;
    assert_eq!(
        nic.create_cq(8, 64).map(|c| c.cqn),
        Err(SimError::Exhausted("CQ number"))
    );
    nic.destroy_cq(a).unwrap();
    assert_eq!(nic.create_cq(8, 64).unwrap().cqn, a);
    assert_ne!(a, b);
    let pd = nic.alloc_pd();
    let mr = nic.alloc_mr(pd, 64, Access::LOCAL_WRITE).unwrap();
    let w1 = nic.alloc_mw(pd, MwType::Two).unwrap();
    let w2 = nic.alloc_mw(pd, MwType::One).unwrap();
    assert_eq!(
        nic.alloc_mw(pd, MwType::Two),
        Err(SimError::Exhausted("key index"))
    );
    assert_eq!(
        nic.alloc_mr(pd, 64, Access::LOCAL_WRITE),
        Err(SimError::Exhausted("key index"))
    );
    nic.dealloc_mw(w1).unwrap();
    let w3 = nic.alloc_mw(pd, MwType::Two).unwrap();
    assert_eq!(w3 >> 8, w1 >> 8, "the only free index");
    assert_ne!(w3, w1, "a new key variant: the stale key stays dead");
    assert_eq!(nic.mw_state(w1), Some((w3, false)));
    let live = [mr.lkey >> 8, w2 >> 8, w3 >> 8];
    assert_eq!(
        live.iter().collect::<std::collections::BTreeSet<_>>().len(),
        3
    );
}

/// Region bytes are shared: two threads write the same bytes while a third reads them and
/// the NIC (its own thread) writes them too. Every access is an atomic byte access (no data
/// race: the old plain copies were undefined behaviour here, which a race detector such as
/// ThreadSanitizer or Miri reports); each byte read is one some writer wrote.
#[test]
fn region_bytes_written_by_threads_and_the_nic_at_once_stay_defined() {
    let dev = Device::sim();
    let pd = dev.alloc_pd().unwrap();
    let mut cq = dev.create_cq(64).unwrap();
    let mut qp = pd.create_qp(&cq, &cq, QpCaps::default()).unwrap();
    let me = qp.endpoint().unwrap();
    qp.connect(&me).unwrap();
    let mr = pd.alloc_mr(4096, RIGHTS).unwrap();
    mr.write(1024, &[0xcc; 64]).unwrap();
    std::thread::scope(|s| {
        for b in [0xaa, 0xbb] {
            let mr = &mr;
            s.spawn(move || {
                for _ in 0..200 {
                    mr.write(0, &[b; 64]).unwrap();
                }
            });
        }
        let mr = &mr;
        s.spawn(move || {
            let mut got = [0u8; 64];
            for _ in 0..200 {
                mr.read(0, &mut got).unwrap();
                assert!(got.iter().all(|b| [0, 0xaa, 0xbb, 0xcc].contains(b)));
            }
        });
        // The NIC copies region bytes onto the same range meanwhile.
        for i in 0..50 {
            qp.write(
                &[mr.sge(1024, 64).unwrap()],
                mr.remote(0).unwrap(),
                i,
                PostFlags::SIGNALED,
            )
            .unwrap();
            let mut out = [Completion::default(); 1];
            assert_eq!(cq.poll_n(&mut out, 1, u64::MAX), 1);
            assert_eq!(out[0].status, WcStatus::Success);
        }
    });
    // Once every writer is done, the last write wins and the completion orders it.
    qp.write(
        &[mr.sge(1024, 64).unwrap()],
        mr.remote(0).unwrap(),
        99,
        PostFlags::SIGNALED,
    )
    .unwrap();
    let mut out = [Completion::default(); 1];
    assert_eq!(cq.poll_n(&mut out, 1, u64::MAX), 1);
    let mut got = [0u8; 64];
    mr.read(0, &mut got).unwrap();
    assert_eq!(got, [0xcc; 64]);
}

/// A region with a window bound to it is not deregistered while the window is bound: a
/// ConnectX (and the software NIC) would deregister it (the kernel's `mlx5_ib_dereg_mr` does
/// not look for windows) and give its key to the next registration, which the window would
/// then reach; rxe refuses. Dropped then, it is parked, its memory kept (the window holds a
/// pin on it), and it is deregistered once the window is gone. (Before, the crate relied on
/// the device's refusal: on a ConnectX the region went at once under the bound window.)
#[test]
fn a_region_with_a_bound_window_is_parked_until_the_window_goes() {
    let dev = Device::sim_stepped();
    let pd = dev.alloc_pd().unwrap();
    let (mut cq, mut qp) = loopback(&dev, &pd);
    let region = pd.alloc_mr(4096, RIGHTS).unwrap();
    let src = pd.alloc_mr(4096, RIGHTS).unwrap();
    src.write(0, b"sixteen bytes!!!").unwrap();
    let mut mw = pd.alloc_mw(MwType::Two).unwrap();
    let mut out = [Completion::default(); 1];
    let rkey = qp
        .bind_mw(
            &mut mw,
            &region,
            0,
            4096,
            Access::REMOTE_WRITE,
            1,
            PostFlags::SIGNALED,
        )
        .unwrap();
    assert_eq!(cq.poll_n(&mut out, 1, 100), 1);
    assert_eq!(out[0].status, WcStatus::Success);
    let region_rkey = region.rkey();
    let region_addr = region.addr();
    drop(region); // nothing in flight, but the window is bound to it
    assert_eq!(pd.reclaim(), 1, "parked: the window is bound to it");
    assert!(dev.nic().unwrap().mr_registered(region_rkey));
    // Still registered: the window (and the region's key) reach live memory.
    let through = |qp: &mut Qp, cq: &mut Cq, rkey: u32, cookie: u64| {
        qp.write(
            &[src.sge(0, 16).unwrap()],
            Remote {
                addr: region_addr,
                rkey,
            },
            cookie,
            PostFlags::SIGNALED,
        )
        .unwrap();
        let mut out = [Completion::default(); 1];
        assert_eq!(cq.poll_n(&mut out, 1, 100), 1);
        out[0].status
    };
    assert_eq!(through(&mut qp, &mut cq, rkey, 2), WcStatus::Success);
    drop(mw);
    assert_eq!(pd.reclaim(), 0, "deregistered once the window is gone");
    // The region's key is dead now (the QP goes to error with it).
    assert_eq!(
        through(&mut qp, &mut cq, region_rkey, 3),
        WcStatus::RemAccessErr
    );
}

/// A window's pin on its region goes when the window no longer names it: a dropped region
/// under a type-2 window that is then unbound is deregistered once the window has seen the
/// unbind complete (at its next bind, here to another region, which keeps that one).
#[test]
fn an_unbound_window_lets_its_dropped_region_go() {
    let dev = Device::sim_stepped();
    let pd = dev.alloc_pd().unwrap();
    let (mut cq, mut qp) = loopback(&dev, &pd);
    let (first, second) = (
        pd.alloc_mr(4096, RIGHTS).unwrap(),
        pd.alloc_mr(4096, RIGHTS).unwrap(),
    );
    let mut mw = pd.alloc_mw(MwType::Two).unwrap();
    let mut out = [Completion::default(); 1];
    let mut done = |cq: &mut Cq| {
        assert_eq!(cq.poll_n(&mut out, 1, 100), 1);
        assert_eq!(out[0].status, WcStatus::Success);
    };
    let w = Access::REMOTE_WRITE;
    qp.bind_mw(&mut mw, &first, 0, 64, w, 1, PostFlags::SIGNALED)
        .unwrap();
    done(&mut cq);
    let first_key = first.rkey();
    drop(first);
    assert_eq!(pd.reclaim(), 1, "parked under the bound window");
    qp.unbind_mw(&mut mw, 2, PostFlags::SIGNALED).unwrap();
    done(&mut cq);
    let nic = dev.nic().unwrap();
    assert!(
        nic.mr_registered(first_key),
        "the window has not seen its unbind complete yet"
    );
    qp.bind_mw(&mut mw, &second, 0, 64, w, 3, PostFlags::SIGNALED)
        .unwrap();
    assert!(!nic.mr_registered(first_key), "let go at the next bind");
    done(&mut cq);
    let second_key = second.rkey();
    drop(second);
    assert!(
        nic.mr_registered(second_key),
        "the new binding's region stays"
    );
    drop(mw);
    assert!(!nic.mr_registered(second_key), "and goes with the window");
}

/// A region dropped after a batch wrote a request naming it, before the batch rang, stays
/// registered until that request completes (before, it was deregistered at once: the
/// request then failed, or used whatever region got the key next).
#[test]
fn a_region_dropped_between_batch_push_and_ring_is_parked() {
    let dev = Device::sim_stepped();
    let pd = dev.alloc_pd().unwrap();
    let (mut cq, mut qp) = loopback(&dev, &pd);
    let src = pd.alloc_mr(4096, RIGHTS).unwrap();
    let dst = pd.alloc_mr(4096, RIGHTS).unwrap();
    src.write(0, b"batched and gone").unwrap();
    let sge = src.sge(0, 16).unwrap();
    let mut b = qp.batch();
    b.push(
        &Request::Write {
            remote: dst.remote(0).unwrap(),
            data: Payload::Sgl(&[sge]),
        },
        5,
        PostFlags::SIGNALED,
    )
    .unwrap();
    drop(src);
    assert_eq!(pd.reclaim(), 1, "parked while the batch is open");
    b.ring().unwrap();
    let mut out = [Completion::default(); 1];
    assert_eq!(cq.poll_n(&mut out, 1, 100), 1);
    assert_eq!((out[0].cookie, out[0].status), (5, WcStatus::Success));
    let mut got = [0u8; 16];
    dst.read(0, &mut got).unwrap();
    assert_eq!(&got, b"batched and gone");
    assert_eq!(pd.reclaim(), 0, "deregistered once it completed");
    // A batch dropped without ringing posts nothing and keeps nothing parked.
    let gone = pd.alloc_mr(64, RIGHTS).unwrap();
    let sge = gone.sge(0, 8).unwrap();
    let mut b = qp.batch();
    b.push(
        &Request::Write {
            remote: dst.remote(0).unwrap(),
            data: Payload::Sgl(&[sge]),
        },
        6,
        PostFlags::SIGNALED,
    )
    .unwrap();
    drop(b);
    drop(gone);
    assert_eq!(pd.reclaim(), 0);
}

/// How long each post-versus-release race runs: `BLUEFLAME_RACE_SECS` (the memcheck stage
/// shortens it), 10 seconds by default.
fn race_time() -> std::time::Duration {
    let secs = std::env::var("BLUEFLAME_RACE_SECS")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .unwrap_or(10.0);
    std::time::Duration::from_secs_f64(secs)
}

/// Where the receives of [`race_receive_against_release`] are posted.
#[derive(Copy, Clone, Debug)]
enum RecvOn {
    Queue,
    Srq,
}

/// How the region of [`race_receive_against_release`] goes.
#[derive(Copy, Clone, Debug, PartialEq)]
enum Release {
    /// `into_buffer`: the buffer comes back and is checked.
    IntoBuffer,
    /// Dropped: its memory is freed (a write after that is an invalid write under
    /// valgrind's memcheck, which `cargo xtask test` runs this under).
    Drop,
}

/// One thread posts a receive into a region while another turns that region back into its
/// buffer, round after round, on the threaded software NIC; a peer then sends 8 bytes, which
/// arrive inside the CQE (scatter-to-CQE: the poller copies them with the CPU, no key
/// check). Whichever step wins, the buffer handed back must never be written afterwards:
/// the receive either pinned the region first (the buffer comes back only after its
/// completion) or found it gone (a local protection error, nothing written). The old
/// check-then-mark let the release slip between the two and hand the buffer back with the
/// receive still posted: the peer's bytes landed in the returned buffer (or in freed
/// memory, had it been dropped).
fn race_receive_against_release(on: RecvOn, release: Release) {
    let dev = Device::sim();
    let pd = dev.alloc_pd().unwrap();
    let mut cq_a = dev.create_cq(64).unwrap();
    let mut cq_b = dev.create_cq(64).unwrap();
    let mut a = pd.create_qp(&cq_a, &cq_a, QpCaps::default()).unwrap();
    let srq = match on {
        RecvOn::Srq => Some(pd.create_srq(&cq_b, SrqCaps::default()).unwrap()),
        RecvOn::Queue => None,
    };
    let mut b = match &srq {
        Some(s) => pd.create_qp_with_srq(&cq_b, s, QpCaps::default()).unwrap(),
        None => pd.create_qp(&cq_b, &cq_b, QpCaps::default()).unwrap(),
    };
    let (ea, eb) = (a.endpoint().unwrap(), b.endpoint().unwrap());
    a.connect(&eb).unwrap();
    b.connect(&ea).unwrap();
    let mut srq = srq;
    let deadline = std::time::Instant::now() + race_time();
    let (mut rounds, mut pinned, mut refused) = (0u64, 0u64, 0u64);
    while std::time::Instant::now() < deadline {
        let mr = pd.register(vec![0u8; 64], Access::LOCAL_WRITE).unwrap();
        let sge = mr.sge(0, 64).unwrap();
        let (give, take) = std::sync::mpsc::channel::<MemoryRegion>();
        let (polled, wait_polled) = std::sync::mpsc::channel::<()>();
        let releaser = std::thread::spawn(move || {
            let mr = take.recv().unwrap();
            if release == Release::Drop {
                drop(mr);
                wait_polled.recv().unwrap();
                return;
            }
            let mut pending = mr.into_buffer::<Vec<u8>>().unwrap();
            let mut buf = loop {
                if let Some(b) = pending.try_take() {
                    break b;
                }
                std::hint::spin_loop();
            };
            // Ours again: nothing may write it from here on.
            buf.fill(0xaa);
            wait_polled.recv().unwrap();
            assert!(
                buf.iter().all(|&x| x == 0xaa),
                "the buffer was written after it was handed back: {buf:?}"
            );
        });
        give.send(mr).unwrap();
        match &mut srq {
            Some(s) => s.post_recv(&[sge], rounds).unwrap(),
            None => b.post_recv(&[sge], rounds).unwrap(),
        }
        a.send(Payload::Inline(b"8 bytes!"), rounds, PostFlags::SIGNALED)
            .unwrap();
        let mut out = [Completion::default(); 1];
        assert_eq!(cq_a.poll_n(&mut out, 1, u64::MAX), 1);
        assert_eq!(out[0].status, WcStatus::Success, "{out:?}");
        assert_eq!(cq_b.poll_n(&mut out, 1, u64::MAX), 1);
        assert_eq!(out[0].cookie, rounds);
        match out[0].status {
            WcStatus::Success => pinned += 1,
            WcStatus::LocProtErr => refused += 1,
            s => panic!("round {rounds}: {s:?}"),
        }
        polled.send(()).unwrap();
        releaser.join().unwrap();
        rounds += 1;
    }
    eprintln!(
        "{on:?}, {release:?}: {rounds} rounds, {pinned} receives pinned the region, \
         {refused} found it gone"
    );
    assert!(rounds > 0);
}

#[test]
fn a_receive_racing_the_release_of_its_region_never_writes_the_returned_buffer() {
    race_receive_against_release(RecvOn::Queue, Release::IntoBuffer);
}

#[test]
fn an_srq_receive_racing_the_release_of_its_region_never_writes_the_returned_buffer() {
    race_receive_against_release(RecvOn::Srq, Release::IntoBuffer);
}

#[test]
fn a_receive_racing_the_drop_of_its_region_never_writes_freed_memory() {
    race_receive_against_release(RecvOn::Queue, Release::Drop);
}

/// The direct path's usual receive lands in the region the queue's last receive landed in,
/// from its copy of the domain's list, without looking whether the list changed: a region
/// turned back into its buffer since (closed, out of the list) must not be landed in from
/// that copy. A receive posted afterwards with the old entry completes with a local
/// protection error (its message inside the CQE, which the poller would copy with the
/// CPU), and the buffer, the caller's again, is never written.
#[test]
fn a_receive_into_the_last_region_after_it_was_handed_back_never_writes_the_buffer() {
    let dev = Device::sim_stepped();
    let pd = dev.alloc_pd().unwrap();
    let (mut cq, mut qp) = loopback(&dev, &pd);
    let mr = pd.register(vec![0u8; 64], Access::LOCAL_WRITE).unwrap();
    let sge = mr.sge(0, 64).unwrap();
    let mut out = [Completion::default(); 2];
    let mut round = |qp: &mut Qp, cookie: u64| -> WcStatus {
        qp.post_recv(&[sge], cookie).unwrap();
        qp.send(
            Payload::Inline(b"8 bytes!"),
            100 + cookie,
            PostFlags::SIGNALED,
        )
        .unwrap();
        dev.process();
        assert_eq!(cq.poll(&mut out), 2, "{out:?}");
        let recv = out.iter().find(|c| c.cookie == cookie).unwrap();
        let send = out.iter().find(|c| c.cookie == 100 + cookie).unwrap();
        assert_eq!(send.status, WcStatus::Success, "{out:?}");
        recv.status
    };
    // The first receive finds the region in the whole list, the second lands in it as the
    // last one's.
    assert_eq!(round(&mut qp, 1), WcStatus::Success);
    assert_eq!(round(&mut qp, 2), WcStatus::Success);
    let mut pending = mr.into_buffer::<Vec<u8>>().unwrap();
    let mut buf = pending.try_take().expect("nothing pins the region");
    buf.fill(0xaa);
    assert_eq!(round(&mut qp, 3), WcStatus::LocProtErr);
    assert!(
        buf.iter().all(|&b| b == 0xaa),
        "the buffer was written after it was handed back: {buf:?}"
    );
}

/// A loopback QP of `pd`, a region and a type-2 window with a bind of the region's first
/// 64 bytes posted (not run: the stepped NIC runs it at `process`); the bind's new rkey.
fn bound_window(dev: &Device, pd: &Pd) -> (Cq, Qp, MemoryRegion, MemoryWindow, u32) {
    let (cq, mut qp) = loopback(dev, pd);
    let mr = pd.alloc_mr(4096, RIGHTS).unwrap();
    let mut mw = pd.alloc_mw(MwType::Two).unwrap();
    let w = Access::REMOTE_WRITE;
    let rkey = qp
        .bind_mw(&mut mw, &mr, 0, 64, w, 1, PostFlags::SIGNALED)
        .unwrap();
    (cq, qp, mr, mw, rkey)
}

/// A region dropped under a bound window, then the window dropped with an unbind in
/// flight (its deallocation parked after the region). Once the unbind completed,
/// nothing holds the region: one `Pd::reclaim` deregisters it and says nothing waits
/// (before, the region was checked before the window's deallocation let it go).
#[test]
fn a_region_parked_before_its_windows_dealloc_goes_at_the_same_reclaim() {
    let dev = Device::sim_stepped();
    let pd = dev.alloc_pd().unwrap();
    let (mut cq, mut qp, mr, mut mw, _) = bound_window(&dev, &pd);
    let mut out = [Completion::default(); 1];
    dev.process();
    assert_eq!(cq.poll(&mut out), 1);
    let key = mr.rkey();
    drop(mr); // parked: the window's pin
    qp.unbind_mw(&mut mw, 2, PostFlags::SIGNALED).unwrap();
    drop(mw); // in flight: its deallocation parked after the region
    dev.process();
    assert_eq!(cq.poll(&mut out), 1);
    assert_eq!(out[0].status, WcStatus::Success);
    let left = pd.reclaim();
    let nic = dev.nic().unwrap();
    assert!(
        left == 0 && !nic.mr_registered(key),
        "everything completed, nothing holds the region: reclaim left {left}, registered {}",
        nic.mr_registered(key)
    );
}

/// As above, the domain dropped with the window's deallocation still parked (its unbind
/// never ran): the window goes first, and the region with the domain (before, the region
/// went to the process-wide list of regions held by pins, `HELD`, although its only pin was
/// the window's, given back a moment later in the same `clear`: it stayed registered after
/// its domain was gone, and the domain could not be deallocated).
#[test]
fn a_region_pinned_by_a_parked_window_goes_with_its_domain() {
    let dev = Device::sim_stepped();
    let key;
    {
        let pd = dev.alloc_pd().unwrap();
        let (mut cq, mut qp, mr, mut mw, _) = bound_window(&dev, &pd);
        let mut out = [Completion::default(); 1];
        dev.process();
        assert_eq!(cq.poll(&mut out), 1);
        key = mr.rkey();
        drop(mr);
        qp.unbind_mw(&mut mw, 2, PostFlags::SIGNALED).unwrap();
        drop(mw);
        // Nothing processed: the unbind is in flight when everything goes.
        drop(qp);
        drop(cq);
        drop(pd);
    }
    let nic = dev.nic().unwrap();
    assert!(
        !nic.mr_registered(key),
        "the domain is gone, the window deallocated: its region is still registered"
    );
}

/// A window dropped with its bind still in flight keeps the bind's region
/// registered until the window is deallocated (the NIC may run the bind yet).
#[test]
fn a_window_dropped_with_its_bind_in_flight_keeps_the_region() {
    let dev = Device::sim_stepped();
    let pd = dev.alloc_pd().unwrap();
    let (mut cq, _qp, mr, mw, _) = bound_window(&dev, &pd);
    let key = mr.rkey();
    drop(mw); // the bind in flight: deallocated later
    drop(mr);
    let nic = dev.nic().unwrap();
    assert!(nic.mr_registered(key), "the bind in flight names it");
    dev.process();
    let mut out = [Completion::default(); 1];
    assert_eq!(cq.poll(&mut out), 1);
    assert_eq!(out[0].status, WcStatus::Success);
    pd.reclaim();
    pd.reclaim();
    assert!(!nic.mr_registered(key), "gone with the window");
}

/// A bind that fails (flushed) gives its pin back: the region, dropped
/// afterwards, is deregistered at once.
#[test]
fn a_failed_bind_lets_its_region_go() {
    let dev = Device::sim_stepped();
    let pd = dev.alloc_pd().unwrap();
    let (mut cq, mut qp, mr, mut mw, _) = bound_window(&dev, &pd);
    qp.set_error().unwrap();
    dev.process();
    let mut out = [Completion::default(); 1];
    assert_eq!(cq.poll_n(&mut out, 1, 100), 1);
    assert_eq!(out[0].status, WcStatus::WrFlushErr);
    assert!(mw.invalidated(0).is_err()); // settles: the bind failed
    assert!(!mw.is_bound());
    let key = mr.rkey();
    drop(mr);
    assert!(
        !dev.nic().unwrap().mr_registered(key),
        "the failed bind's pin was given back"
    );
}

/// A peer's invalidation, recorded with `MemoryWindow::invalidated`, gives the
/// window's pin back: its region, dropped, goes at once.
#[test]
fn an_invalidated_window_lets_its_region_go() {
    let dev = Device::sim_stepped();
    let pd = dev.alloc_pd().unwrap();
    let (mut cq, mut qp, mr, mut mw, rkey) = bound_window(&dev, &pd);
    let scratch = pd.alloc_mr(4096, RIGHTS).unwrap();
    let mut out = [Completion::default(); 4];
    dev.process();
    assert_eq!(cq.poll(&mut out), 1);
    qp.post_recv(&[scratch.sge(0, 64).unwrap()], 2).unwrap();
    qp.post(
        &Request::SendInv {
            data: Payload::Inline(b"done"),
            rkey,
        },
        3,
        PostFlags::SIGNALED,
    )
    .unwrap();
    dev.process();
    assert_eq!(cq.poll_n(&mut out, 2, 100), 2);
    assert!(
        out[..2].iter().all(|c| c.status == WcStatus::Success),
        "{out:?}"
    );
    mw.invalidated(rkey).unwrap();
    let key = mr.rkey();
    drop(mr);
    assert!(
        !dev.nic().unwrap().mr_registered(key),
        "the pin went with the key"
    );
}

/// A claim that a peer invalidated the window, with no receive completion of its QP
/// saying so, is refused: the window keeps its region registered (the NIC still holds the
/// window, whose translation would reach the next registration with the region's key).
/// A key another QP's receive reported is not this window's either.
#[test]
fn a_false_invalidation_claim_keeps_the_region() {
    let dev = Device::sim_stepped();
    let pd = dev.alloc_pd().unwrap();
    let (mut cq, _qp, mr, mut mw, rkey) = bound_window(&dev, &pd);
    let (mut other_cq, mut other) = loopback(&dev, &pd);
    let scratch = pd.alloc_mr(4096, RIGHTS).unwrap();
    let mut out = [Completion::default(); 4];
    dev.process();
    assert_eq!(cq.poll(&mut out), 1);
    // Another QP's receive reports the window's key invalidated (the NIC refused it there:
    // the window is not bound through that QP, so the send fails; its receive never
    // completes). Then a claim on the caller's word alone.
    other.post_recv(&[scratch.sge(0, 64).unwrap()], 2).unwrap();
    other
        .post(
            &Request::SendInv {
                data: Payload::Inline(b"not yours"),
                rkey,
            },
            3,
            PostFlags::SIGNALED,
        )
        .unwrap();
    dev.process();
    let n = other_cq.poll_n(&mut out, 2, 100);
    assert!(
        out[..n].iter().all(|c| c.opcode != WcOpcode::RecvWithInv),
        "{out:?}"
    );
    let e = mw.invalidated(rkey).unwrap_err();
    assert!(matches!(e, Error::WindowState { .. }), "{e}");
    assert!(mw.is_bound());
    let key = mr.rkey();
    drop(mr);
    assert!(
        dev.nic().unwrap().mr_registered(key),
        "a false claim let the window's region go"
    );
}

/// W1 bound through a loopback QP X with key K, a peer's send with invalidate of K run on
/// the NIC and its receive completion not polled yet, W1 dropped (the crate still counts it
/// bound: nothing said otherwise), and W1's key index given to a new window W2 of the same
/// domain (a small key space here; any device that reuses a freed mkey index), at the
/// variant that makes W2's next plain bind K again (other registrations came and went: the
/// mlx5 driver's variant counter is device-wide).
struct StaleInvalidation {
    dev: Device,
    cq: Cq,
    qp: Qp,
    mr: MemoryRegion,
    scratch: MemoryRegion,
    w2: MemoryWindow,
    k: u32,
}

fn stale_invalidation_of_a_dropped_window() -> (StaleInvalidation, Pd) {
    let limits = mlx5::sim::Limits {
        keys: 3,
        ..Default::default()
    };
    let dev = Device::sim_with(limits, UarConfig::default(), false);
    let pd = dev.alloc_pd().unwrap();
    let (mut cq, mut qp) = loopback(&dev, &pd);
    let mr = pd.alloc_mr(4096, RIGHTS).unwrap();
    let scratch = pd.alloc_mr(4096, RIGHTS).unwrap();
    let mut w1 = pd.alloc_mw(MwType::Two).unwrap();
    let k = qp
        .bind_mw(
            &mut w1,
            &mr,
            0,
            64,
            Access::REMOTE_WRITE,
            1,
            PostFlags::SIGNALED,
        )
        .unwrap();
    dev.process();
    let mut out = [Completion::default(); 1];
    assert_eq!(cq.poll(&mut out), 1);
    // The peer (here the QP itself) invalidates K; nothing polled.
    qp.post_recv(&[scratch.sge(0, 64).unwrap()], 2).unwrap();
    qp.post(
        &Request::SendInv {
            data: Payload::Inline(b"bye"),
            rkey: k,
        },
        3,
        PostFlags::SIGNALED,
    )
    .unwrap();
    dev.process();
    drop(w1);
    // In another domain: this one's region drops wait for its QP's work, not polled.
    let other = dev.alloc_pd().unwrap();
    for _ in 0..255 {
        drop(other.alloc_mr(64, RIGHTS).unwrap());
    }
    let w2 = pd.alloc_mw(MwType::Two).unwrap();
    assert_eq!(
        w2.rkey() & !0xff,
        k & !0xff,
        "the set-up: W2 has W1's key index"
    );
    let s = StaleInvalidation {
        dev,
        cq,
        qp,
        mr,
        scratch,
        w2,
        k,
    };
    (s, pd)
}

impl StaleInvalidation {
    /// W2, bound through X with `k2`, is not unbound by W1's stale invalidation once it is
    /// polled: a claim of `k2` is refused and the region stays registered.
    fn w2_keeps_its_region(mut self, k2: u32) {
        assert_ne!(k2, self.k, "W2's bind took the key W1 was dropped with");
        self.dev.process();
        let mut out = [Completion::default(); 8];
        let n = self.cq.poll_n(&mut out, 3, 100);
        assert!(
            out[..n].iter().any(|c| c.opcode == WcOpcode::RecvWithInv),
            "{out:?}"
        );
        let nic = self.dev.nic().unwrap();
        assert_eq!(nic.mw_state(k2), Some((k2, true)), "W2 is bound on the NIC");
        let claimed = self.w2.invalidated(k2);
        assert!(claimed.is_err(), "{claimed:?}");
        assert!(self.w2.invalidated(self.k).is_err(), "W1's key is not W2's");
        let key = self.mr.rkey();
        drop(self.mr);
        assert!(
            nic.mr_registered(key),
            "W1's stale invalidation unbound W2 ({claimed:?}): its region was deregistered \
             while the NIC holds W2 bound"
        );
    }
}

/// A stale invalidation of another window with the same key is not this window's: W2's
/// bind through X got K, its bind forgot the records of K on X, but the stale completion
/// was polled only after it, and its record was taken for W2, whose region could then go
/// while the NIC held W2 bound. Now W1's drop leaves its last key's variant to its domain,
/// and W2's keys go on from it.
#[test]
fn a_stale_invalidation_of_a_reused_key_keeps_the_new_windows_region() {
    let (mut s, _pd) = stale_invalidation_of_a_dropped_window();
    let w = Access::REMOTE_WRITE;
    let k2 =
        s.qp.bind_mw(&mut s.w2, &s.mr, 0, 64, w, 4, PostFlags::SIGNALED)
            .unwrap();
    assert_eq!(k2 & 0xff, (s.k + 1) & 0xff, "W2's keys go on from W1's");
    s.w2_keeps_its_region(k2);
}

/// As above, but W2's first bind fails (flushed on another QP Z of the domain, whose write
/// before it failed): the continuation of W1's variants must survive it. It was cleared
/// once the bind was posted, so W2's next bind, through X, went on from W2's own allocated
/// key and got K again; the stale invalidation of K was then taken for W2.
#[test]
fn a_failed_first_bind_keeps_the_continuation_of_the_dropped_windows_keys() {
    let (mut s, pd) = stale_invalidation_of_a_dropped_window();
    let (mut zcq, mut z) = loopback(&s.dev, &pd);
    let w = Access::REMOTE_WRITE;
    // W2's first bind, through Z, is flushed: the write before it fails.
    let bad = Remote {
        addr: s.scratch.addr(),
        rkey: s.scratch.rkey() ^ 0x80,
    };
    z.write(
        &[s.scratch.sge(0, 16).unwrap()],
        bad,
        10,
        PostFlags::SIGNALED,
    )
    .unwrap();
    z.bind_mw(&mut s.w2, &s.mr, 0, 64, w, 11, PostFlags::SIGNALED)
        .unwrap();
    s.dev.process();
    let mut out = [Completion::default(); 2];
    assert_eq!(zcq.poll_n(&mut out, 2, 100), 2, "{out:?}");
    assert_ne!(
        out[1].status,
        WcStatus::Success,
        "the set-up: the bind failed"
    );
    assert!(!s.w2.is_bound());
    let k2 =
        s.qp.bind_mw(&mut s.w2, &s.mr, 0, 64, w, 4, PostFlags::SIGNALED)
            .unwrap();
    s.w2_keeps_its_region(k2);
}

/// A buffer of the caller's own type whose drop drops a region of the same protection
/// domain (here the second region is kept in the buffer's value; a buffer whose drop drops
/// a QP of the domain, or calls `Pd::reclaim`, is the same case).
struct KeepsARegion(Box<(Vec<u8>, Option<MemoryRegion>)>);

// SAFETY: the bytes are the Vec's heap block, which nothing but the region touches between
// `into_raw` and `from_raw`; the box (the Vec's header and the kept region) is taken apart
// into `extra` and rebuilt once.
unsafe impl RegionBuffer for KeepsARegion {
    fn into_raw(self) -> RawParts {
        let mut b = self.0;
        let ptr = core::ptr::NonNull::new(b.0.as_mut_ptr()).unwrap();
        let len = b.0.len();
        RawParts {
            ptr,
            len,
            extra: Box::into_raw(b) as usize,
            writable: true,
        }
    }
    unsafe fn from_raw(p: RawParts) -> Self {
        // SAFETY: `extra` is the box `into_raw` gave up, taken back once.
        KeepsARegion(unsafe { Box::from_raw(p.extra as *mut (Vec<u8>, Option<MemoryRegion>)) })
    }
}

/// How the region holding a [`KeepsARegion`] goes.
#[derive(Copy, Clone, Debug)]
enum Gone {
    /// Dropped: its buffer is dropped once the region is deregistered.
    Dropped,
    /// Turned into its buffer, whose `PendingBuffer` is dropped before it comes back.
    PendingDropped,
}

/// A region parked behind a write in flight goes at a later reclaim; its buffer's drop then
/// drops another region of the domain, which takes the domain's lifetimes. The buffer
/// must be dropped outside the domain's lock (before, `Lifetimes::reclaim` deregistered
/// and dropped it with the list of parked registrations locked, and the inner region's
/// release locked it again: the thread hung).
fn buffer_dropping_a_region_at_reclaim(how: Gone) {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let dev = Device::sim_stepped();
        let pd = dev.alloc_pd().unwrap();
        let (mut cq, mut qp) = loopback(&dev, &pd);
        let dst = pd.alloc_mr(4096, RIGHTS).unwrap();
        let inner = pd.alloc_mr(64, RIGHTS).unwrap();
        let buf = KeepsARegion(Box::new((vec![7u8; 64], Some(inner))));
        let mr = pd.register(buf, Access::LOCAL_WRITE).unwrap();
        qp.write(
            &[mr.sge(0, 16).unwrap()],
            dst.remote(0).unwrap(),
            1,
            PostFlags::SIGNALED,
        )
        .unwrap();
        match how {
            Gone::Dropped => drop(mr),
            Gone::PendingDropped => drop(mr.into_buffer::<KeepsARegion>().unwrap()),
        }
        assert_eq!(pd.reclaim(), 1, "parked behind the write");
        dev.process();
        let mut out = [Completion::default(); 1];
        assert_eq!(cq.poll(&mut out), 1);
        assert_eq!(out[0].status, WcStatus::Success);
        // Deregisters the region and drops its buffer, which drops `inner`.
        assert_eq!(pd.reclaim(), 0);
        tx.send(()).unwrap();
    });
    rx.recv_timeout(std::time::Duration::from_secs(20))
        .expect("the reclaim hung (or the thread panicked)");
}

#[test]
fn a_dropped_regions_buffer_may_drop_another_region_of_its_domain() {
    buffer_dropping_a_region_at_reclaim(Gone::Dropped);
}

#[test]
fn a_given_up_buffer_may_drop_another_region_of_its_domain() {
    buffer_dropping_a_region_at_reclaim(Gone::PendingDropped);
}
