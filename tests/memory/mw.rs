//! Memory windows on the software NIC (direct path): bind (type 1 and 2) through UMR WQEs,
//! new rkey on every bind, old keys refused, invalidation (local and by send with
//! invalidate), zero-length unbind, rights and range of the window, privileges errors
//! before posting, and the fence after a bind.

use crate::scenarios;

use blueflame::*;
use scenarios::Pair;

const REGION: Access = Access(
    Access::LOCAL_WRITE.0
        | Access::REMOTE_WRITE.0
        | Access::REMOTE_READ.0
        | Access::REMOTE_ATOMIC.0
        | Access::MW_BIND.0,
);
const RW: Access = Access(Access::REMOTE_READ.0 | Access::REMOTE_WRITE.0);

fn pair() -> Pair {
    Pair::new(
        &Device::sim_stepped(),
        REGION,
        scenarios::caps(),
        &Timing::default(),
    )
}

/// A's write of `data` to `rkey` at offset `off` of B's region; returns its status.
fn write(p: &mut Pair, data: &[u8], off: u64, rkey: u32, cookie: u64) -> WcStatus {
    let addr = p.mr_b.addr() + off;
    p.a.write_inline(data, Remote { addr, rkey }, cookie, PostFlags::SIGNALED)
        .unwrap();
    let c = p.wait(false, 1)[0];
    assert_eq!(c.0, cookie);
    c.1
}

#[test]
fn type2_bind_write_read_and_new_rkeys() {
    let mut p = pair();
    let mut mw = p.b.pd().alloc_mw(MwType::Two).unwrap();
    let before = mw.rkey();
    let rkey =
        p.b.bind_mw(&mut mw, &p.mr_b, 1024, 256, RW, 1, PostFlags::SIGNALED)
            .unwrap();
    assert_eq!(rkey, mw.rkey());
    assert_eq!(rkey & !0xff, before & !0xff, "same window index");
    assert_ne!(rkey, before, "a new key variant");
    assert_eq!(
        p.wait(true, 1)[0],
        (1, WcStatus::Success, WcOpcode::BindMw, 0, None)
    );
    let base = p.mr_b.addr() + 1024;
    assert_eq!(
        write(&mut p, b"through window", 1040, rkey, 2),
        WcStatus::Success
    );
    assert_eq!(Pair::bytes(&p.mr_b, 1040, 14), b"through window");
    // A read through the window.
    p.a.read(
        &[p.mr_a.sge(0, 14).unwrap()],
        Remote {
            addr: base + 16,
            rkey,
        },
        3,
        PostFlags::SIGNALED,
    )
    .unwrap();
    assert_eq!(p.wait(false, 1)[0].1, WcStatus::Success);
    assert_eq!(Pair::bytes(&p.mr_a, 0, 14), b"through window");
    // The window's pre-bind key grants nothing.
    assert_eq!(write(&mut p, b"x", 1024, before, 4), WcStatus::RemAccessErr);
}

#[test]
fn outside_the_window_or_its_rights_fails() {
    let mut p = pair();
    let mut mw = p.b.pd().alloc_mw(MwType::Two).unwrap();
    let rkey =
        p.b.bind_mw(
            &mut mw,
            &p.mr_b,
            0,
            64,
            Access::REMOTE_READ,
            1,
            PostFlags::SIGNALED,
        )
        .unwrap();
    p.wait(true, 1);
    // A write through a read-only window.
    assert_eq!(write(&mut p, b"no", 0, rkey, 2), WcStatus::RemAccessErr);
    // A fresh pair for the range check (the error above moved both QPs to error).
    let mut p = pair();
    let mut mw = p.b.pd().alloc_mw(MwType::Two).unwrap();
    let rkey =
        p.b.bind_mw(&mut mw, &p.mr_b, 0, 64, RW, 1, PostFlags::SIGNALED)
            .unwrap();
    p.wait(true, 1);
    assert_eq!(write(&mut p, &[1; 8], 56, rkey, 3), WcStatus::Success);
    assert_eq!(write(&mut p, &[1; 8], 60, rkey, 4), WcStatus::RemAccessErr);
}

#[test]
fn type1_rebind_and_zero_length_unbind() {
    let mut p = pair();
    let mut mw = p.b.pd().alloc_mw(MwType::One).unwrap();
    let k1 =
        p.b.bind_mw(&mut mw, &p.mr_b, 0, 128, RW, 1, PostFlags::SIGNALED)
            .unwrap();
    let k2 =
        p.b.bind_mw(&mut mw, &p.mr_b, 128, 128, RW, 2, PostFlags::SIGNALED)
            .unwrap();
    assert_ne!(k1, k2);
    assert_eq!(
        p.wait(true, 2)
            .iter()
            .map(|c| (c.0, c.1))
            .collect::<Vec<_>>(),
        vec![(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    // The new binding starts at offset 128 and uses k2.
    assert_eq!(write(&mut p, b"k2", 130, k2, 3), WcStatus::Success);
    assert_eq!(Pair::bytes(&p.mr_b, 130, 2), b"k2");
    // Zero length unbinds: k3 grants nothing.
    let k3 =
        p.b.bind_mw(&mut mw, &p.mr_b, 0, 0, RW, 4, PostFlags::SIGNALED)
            .unwrap();
    assert_eq!(p.wait(true, 1)[0].1, WcStatus::Success);
    assert_eq!(write(&mut p, b"k3", 130, k3, 5), WcStatus::RemAccessErr);
    let mut p = pair();
    let mut mw = p.b.pd().alloc_mw(MwType::One).unwrap();
    let k1 =
        p.b.bind_mw(&mut mw, &p.mr_b, 0, 128, RW, 1, PostFlags::SIGNALED)
            .unwrap();
    let _k2 =
        p.b.bind_mw(&mut mw, &p.mr_b, 0, 128, RW, 2, PostFlags::SIGNALED)
            .unwrap();
    p.wait(true, 2);
    // After a rebind the old rkey fails.
    assert_eq!(write(&mut p, b"old", 0, k1, 6), WcStatus::RemAccessErr);
}

#[test]
fn local_invalidate_and_send_with_invalidate() {
    let mut p = pair();
    let mut mw = p.b.pd().alloc_mw(MwType::Two).unwrap();
    let rkey =
        p.b.bind_mw(&mut mw, &p.mr_b, 0, 256, RW, 1, PostFlags::SIGNALED)
            .unwrap();
    assert_eq!(
        p.b.unbind_mw(&mut mw, 2, PostFlags::SIGNALED).unwrap(),
        rkey,
        "a type-2 unbind is a local invalidate of its key"
    );
    let done: Vec<_> = p.wait(true, 2).iter().map(|c| (c.0, c.1, c.2)).collect();
    assert_eq!(
        done,
        vec![
            (1, WcStatus::Success, WcOpcode::BindMw),
            (2, WcStatus::Success, WcOpcode::LocalInv)
        ]
    );
    assert_eq!(write(&mut p, b"x", 0, rkey, 3), WcStatus::RemAccessErr);

    // The peer invalidates the window with its send; B's receive reports the key.
    let mut p = pair();
    let mut mw = p.b.pd().alloc_mw(MwType::Two).unwrap();
    let rkey =
        p.b.bind_mw(&mut mw, &p.mr_b, 0, 256, RW, 1, PostFlags::SIGNALED)
            .unwrap();
    p.wait(true, 1);
    assert_eq!(write(&mut p, b"ok", 0, rkey, 2), WcStatus::Success);
    p.b.post_recv(&[p.mr_b.sge(2048, 64).unwrap()], 50).unwrap();
    p.a.post(
        &Request::SendInv {
            data: Payload::Inline(b"done"),
            rkey,
        },
        3,
        PostFlags::SIGNALED,
    )
    .unwrap();
    assert_eq!(p.wait(false, 1)[0].1, WcStatus::Success);
    assert_eq!(
        p.wait(true, 1)[0],
        (50, WcStatus::Success, WcOpcode::RecvWithInv, 4, Some(rkey))
    );
    assert_eq!(write(&mut p, b"no", 0, rkey, 4), WcStatus::RemAccessErr);
}

#[test]
fn privileges_and_parameters_are_checked_before_posting() {
    let dev = Device::sim_stepped();
    let mut p = Pair::new(
        &dev,
        Access::LOCAL_WRITE | Access::REMOTE_READ | Access::MW_BIND,
        scenarios::caps(),
        &Timing::default(),
    );
    let mut mw = p.b.pd().alloc_mw(MwType::Two).unwrap();
    let free = p.b.free_send();
    let rkey = mw.rkey();
    // Remote write is not among the region's rights.
    let e =
        p.b.bind_mw(&mut mw, &p.mr_b, 0, 64, RW, 1, PostFlags::SIGNALED)
            .unwrap_err();
    assert!(
        matches!(e, Error::Privileges { requested, .. } if requested == RW),
        "{e}"
    );
    // Outside the region.
    let e =
        p.b.bind_mw(
            &mut mw,
            &p.mr_b,
            4000,
            200,
            Access::REMOTE_READ,
            2,
            PostFlags::SIGNALED,
        )
        .unwrap_err();
    assert!(
        matches!(e, Error::InvalidParameter { value: 4200, .. }),
        "{e}"
    );
    // Not a window right.
    let e =
        p.b.bind_mw(
            &mut mw,
            &p.mr_b,
            0,
            8,
            Access::MW_BIND,
            3,
            PostFlags::SIGNALED,
        )
        .unwrap_err();
    assert!(matches!(e, Error::InvalidParameter { .. }), "{e}");
    // A region without the bind right.
    let plain =
        p.b.pd()
            .alloc_mr(64, Access::LOCAL_WRITE | Access::REMOTE_READ)
            .unwrap();
    let e =
        p.b.bind_mw(
            &mut mw,
            &plain,
            0,
            8,
            Access::REMOTE_READ,
            4,
            PostFlags::SIGNALED,
        )
        .unwrap_err();
    assert!(matches!(e, Error::Privileges { .. }), "{e}");
    assert_eq!(
        (p.b.free_send(), mw.rkey()),
        (free, rkey),
        "nothing posted, key unchanged"
    );
    assert!(p.nothing_more());
}

#[test]
fn a_window_of_another_protection_domain_is_refused() {
    let mut p = pair();
    let other = p.dev.alloc_pd().unwrap();
    let mut mw = other.alloc_mw(MwType::Two).unwrap();
    let e =
        p.b.bind_mw(
            &mut mw,
            &p.mr_b,
            0,
            8,
            Access::REMOTE_READ,
            1,
            PostFlags::SIGNALED,
        )
        .unwrap_err();
    assert!(matches!(e, Error::InvalidHandle { .. }), "{e}");
}

/// Drives the NIC and polls both CQs until nothing more happens; returns B's completion
/// statuses.
fn drain(p: &mut Pair) -> Vec<WcStatus> {
    let mut out = [Completion::default(); 64];
    let mut seen = Vec::new();
    loop {
        let ran = p.dev.process();
        let n = p.cq_b.poll(&mut out);
        seen.extend(out[..n].iter().map(|c| c.status));
        let m = p.cq_a.poll(&mut out);
        if ran + n + m == 0 {
            return seen;
        }
    }
}

/// B posts `n` one-block inline writes to A's region with `rkey`, unsignaled but every 32nd
/// and the last, running the NIC and polling (into `seen`) whenever B is short of room.
fn b_writes(p: &mut Pair, n: u64, rkey: u32, seen: &mut Vec<WcStatus>) {
    let at = Remote {
        addr: p.mr_a.addr(),
        rkey,
    };
    for i in 0..n {
        let flags = if i % 32 == 31 || i + 1 == n {
            PostFlags::SIGNALED
        } else {
            PostFlags::UNSIGNALED
        };
        loop {
            let free = p.b.free_send();
            match p.b.write_inline(&[7; 8], at, 100 + i, flags) {
                Ok(()) => {
                    assert_eq!(free - p.b.free_send(), 1, "one send-ring block");
                    break;
                }
                Err(Error::QueueFull { .. } | Error::CqFull { .. }) => seen.extend(drain(p)),
                Err(e) => panic!("{e}"),
            }
        }
    }
}

/// Unbinds the type-1 window `mw` through a fresh pair of QPs of B's domain, and shows that
/// the NIC held `key` before (the peer's write through it succeeds) and nothing after (the
/// same write fails).
fn unbind_revokes(p: &Pair, mw: &mut MemoryWindow, key: u32) {
    let pd = p.b.pd().clone();
    let (mut cq_c, mut cq_d) = (p.dev.create_cq(64).unwrap(), p.dev.create_cq(64).unwrap());
    let mut c = pd.create_qp(&cq_c, &cq_c, scenarios::caps()).unwrap();
    let mut d = pd.create_qp(&cq_d, &cq_d, scenarios::caps()).unwrap();
    let (ec, ed) = (c.endpoint().unwrap(), d.endpoint().unwrap());
    c.connect(&ed).unwrap();
    d.connect(&ec).unwrap();
    let at = Remote {
        addr: p.mr_b.addr(),
        rkey: key,
    };
    d.write_inline(b"before", at, 1, PostFlags::SIGNALED)
        .unwrap();
    let status = scenarios::wait_on(&p.dev, &mut cq_d, 1)[0].status;
    assert_eq!(status, WcStatus::Success, "the NIC holds the key");
    c.unbind_mw(mw, 2, PostFlags::SIGNALED).unwrap();
    let status = scenarios::wait_on(&p.dev, &mut cq_c, 1)[0].status;
    assert_eq!(status, WcStatus::Success, "the unbind names the NIC's key");
    assert!(!mw.is_bound());
    d.write_inline(b"after", at, 3, PostFlags::SIGNALED)
        .unwrap();
    let status = scenarios::wait_on(&p.dev, &mut cq_d, 1)[0].status;
    assert_eq!(status, WcStatus::RemAccessErr, "revoked");
}

/// A key no region or window of the pair has.
const BAD_RKEY: u32 = 0x00ff_ff00;

#[test]
fn a_completed_bind_stays_committed_when_its_qp_fails_two_position_wraps_later() {
    let mut p = pair();
    let good = p.mr_a.rkey();
    let mut mw = p.b.pd().alloc_mw(MwType::One).unwrap();
    let free = p.b.free_send();
    let k1 =
        p.b.bind_mw(&mut mw, &p.mr_b, 0, 256, RW, 1, PostFlags::SIGNALED)
            .unwrap();
    let bind_bbs = (free - p.b.free_send()) as u64;
    assert_eq!(p.wait(true, 1)[0].1, WcStatus::Success);
    // 70,000 send positions of other work, polled: the window is as it was.
    let mut seen = Vec::new();
    b_writes(&mut p, 70_000, good, &mut seen);
    seen.extend(drain(&mut p));
    assert!(seen.iter().all(|s| *s == WcStatus::Success), "{seen:?}");
    assert_eq!((mw.rkey(), mw.is_bound()), (k1, true));
    // Then B fails 2 * 65,536 - 3 positions after the bind started (a write with a bad key),
    // and the five requests after it are flushed: the 16-bit positions of the bind and of
    // the error are then 3 apart the wrong way round.
    let mut seen = Vec::new();
    b_writes(&mut p, 2 * 65_536 - 3 - bind_bbs - 70_000, good, &mut seen);
    b_writes(&mut p, 1, BAD_RKEY, &mut seen);
    b_writes(&mut p, 5, good, &mut seen);
    seen.extend(drain(&mut p));
    let failed: Vec<_> = seen.iter().filter(|s| **s != WcStatus::Success).collect();
    assert_eq!(failed[0], &WcStatus::RemAccessErr, "{failed:?}");
    assert!(failed[1..].iter().all(|s| **s == WcStatus::WrFlushErr));
    assert_eq!(
        (mw.rkey(), mw.is_bound()),
        (k1, true),
        "the bind completed long before the error"
    );
    unbind_revokes(&p, &mut mw, k1);
}

#[test]
fn a_bind_flushed_after_an_error_is_forgotten_across_a_position_wrap() {
    let mut p = pair();
    let good = p.mr_a.rkey();
    let mut mw = p.b.pd().alloc_mw(MwType::One).unwrap();
    let free = p.b.free_send();
    let k1 =
        p.b.bind_mw(&mut mw, &p.mr_b, 0, 256, RW, 1, PostFlags::SIGNALED)
            .unwrap();
    let bind_bbs = (free - p.b.free_send()) as u64;
    assert!(bind_bbs < 8);
    assert_eq!(p.wait(true, 1)[0].1, WcStatus::Success);
    // B fails at once (a write with a bad key); every later request is flushed, a rebind
    // 65,536 - 8 positions after the error among them, with 10 writes after it.
    let mut seen = Vec::new();
    b_writes(&mut p, 1, BAD_RKEY, &mut seen);
    b_writes(&mut p, 65_536 - 8 - 1, good, &mut seen);
    let k2 =
        p.b.bind_mw(&mut mw, &p.mr_b, 0, 128, RW, 2, PostFlags::SIGNALED)
            .unwrap();
    assert_ne!(k2, k1);
    b_writes(&mut p, 10, good, &mut seen);
    seen.extend(drain(&mut p));
    assert_eq!(seen[0], WcStatus::RemAccessErr, "{:?}", &seen[..4]);
    assert!(seen[1..].iter().all(|s| *s == WcStatus::WrFlushErr));
    assert_eq!(
        (mw.rkey(), mw.is_bound()),
        (k1, true),
        "the rebind was flushed: the first bind holds"
    );
    unbind_revokes(&p, &mut mw, k1);
}

#[test]
fn a_window_dropped_with_its_bind_in_flight_is_deallocated_once_the_bind_completed() {
    let mut p = pair();
    let mut mw = p.b.pd().alloc_mw(MwType::Two).unwrap();
    let k =
        p.b.bind_mw(&mut mw, &p.mr_b, 0, 256, RW, 1, PostFlags::SIGNALED)
            .unwrap();
    // Dropped before the NIC ran the bind (stepped: nothing runs until `process`).
    drop(mw);
    assert!(p.dev.nic().unwrap().mw_state(k).is_some(), "kept");
    assert_eq!(
        p.wait(true, 1)[0],
        (1, WcStatus::Success, WcOpcode::BindMw, 0, None)
    );
    // The QP lives on: its next request succeeds.
    let at = Remote {
        addr: p.mr_a.addr(),
        rkey: p.mr_a.rkey(),
    };
    p.b.write_inline(b"alive", at, 2, PostFlags::SIGNALED)
        .unwrap();
    assert_eq!(p.wait(true, 1)[0].1, WcStatus::Success);
    // Deallocated at the next reclaim point: the key grants nothing.
    assert_eq!(p.b.pd().reclaim(), 0);
    assert_eq!(p.dev.nic().unwrap().mw_state(k), None, "deallocated");
    assert_eq!(write(&mut p, b"x", 0, k, 3), WcStatus::RemAccessErr);

    // The binding QP dropped before the NIC ran the bind: deallocated at the next reclaim.
    let mut p = pair();
    let mut mw = p.b.pd().alloc_mw(MwType::Two).unwrap();
    let k =
        p.b.bind_mw(&mut mw, &p.mr_b, 0, 256, RW, 1, PostFlags::SIGNALED)
            .unwrap();
    drop(mw);
    assert_eq!(p.b.pd().reclaim(), 1, "kept while the bind is in flight");
    let Pair { dev, a, b, .. } = p;
    drop(b);
    assert_eq!(a.pd().reclaim(), 0);
    assert_eq!(dev.nic().unwrap().mw_state(k), None, "deallocated");
}

/// `Request::BindMw` through a generic post skips every check `Qp::bind_mw` makes (the
/// range inside the region, the region's rights, the window's state) and the window's own
/// record of its key, and so does `Request::LocalInvalidate` for `Qp::unbind_mw`'s (a
/// type-2 window bound through this QP): every generic entry refuses both before posting
/// and names the typed methods, so a bind over the region's end or an invalidate of a key
/// that is no bound window cannot fail at the NIC and kill the QP. The QP and the window go
/// on working: `Qp::bind_mw` binds it next, `Qp::unbind_mw` unbinds it.
#[test]
fn window_requests_through_a_generic_post_are_refused_and_name_bind_mw() {
    let mut p = pair();
    let mut mw = p.b.pd().alloc_mw(MwType::Two).unwrap();
    let (rkey, free) = (mw.rkey(), p.b.free_send());
    // Past the region's end (4000 + 200 > 4096): a ConnectX fails the bind (MwBindErr).
    let bind = BindMw {
        mw_rkey: rkey,
        new_rkey: (rkey & !0xff) | (rkey.wrapping_add(1) & 0xff),
        mw_type: MwType::Two,
        mr_lkey: p.mr_b.lkey(),
        addr: p.mr_b.addr() + 4000,
        len: 200,
        access: RW,
    };
    let flags = PostFlags::SIGNALED;
    let mut refused = Vec::new();
    // An unbound window's key: a ConnectX fails the invalidate (the QP dies).
    for req in [Request::BindMw(bind), Request::LocalInvalidate { rkey }] {
        refused.push(p.b.post(&req, 1, flags));
        let mut batch = p.b.batch();
        refused.push(batch.push(&req, 2, flags));
        batch.ring().unwrap();
    }

    for (i, r) in refused.into_iter().enumerate() {
        assert!(
            matches!(&r, Err(Error::Unsupported(why)) if why.contains("Qp::bind_mw") && why.contains("Qp::unbind_mw")),
            "entry {i}: {r:?}"
        );
    }
    assert_eq!(
        (p.b.free_send(), mw.rkey()),
        (free, rkey),
        "nothing posted, key unchanged"
    );
    assert!(p.nothing_more());
    let k = p.b.bind_mw(&mut mw, &p.mr_b, 0, 64, RW, 6, flags).unwrap();
    assert_eq!(
        p.wait(true, 1)[0],
        (6, WcStatus::Success, WcOpcode::BindMw, 0, None)
    );
    assert_eq!(write(&mut p, b"bound", 0, k, 7), WcStatus::Success);
    assert_eq!(p.b.unbind_mw(&mut mw, 8, flags).unwrap(), k);
    assert_eq!(
        p.wait(true, 1)[0],
        (8, WcStatus::Success, WcOpcode::LocalInv, 0, None)
    );
    assert_eq!(write(&mut p, b"gone", 0, k, 9), WcStatus::RemAccessErr);
}

/// A type-2 bind in flight on a QP that is dropped before the NIC ran it
/// leaves the window's state unknown; `unbind_mw` through another QP is refused for that
/// reason ("in flight on another QP ... drop it"). A new QP that got the dropped QP's
/// number is another QP too: its `unbind_mw` must be refused the same way, not posted
/// as a local invalidate of a key the NIC never gave the window (which fails, MwBindErr,
/// and kills the new QP).
#[test]
fn a_bind_in_flight_on_a_dropped_qp_is_not_settled_through_the_qp_that_reuses_its_number() {
    let lim = mlx5::sim::Limits {
        keys: 0xff_ffff,
        qps: 1,
        cqs: 64,
    };
    let dev = Device::sim_with(lim, UarConfig::default(), false);
    let pd = dev.alloc_pd().unwrap();
    let mut cq = dev.create_cq(64).unwrap();
    let mr = pd.alloc_mr(4096, REGION).unwrap();
    let mut mw = pd.alloc_mw(MwType::Two).unwrap();
    let k0 = mw.rkey();
    let mut a = pd.create_qp(&cq, &cq, QpCaps::default()).unwrap();
    let qpn = a.qpn();
    a.connect(&a.endpoint().unwrap()).unwrap();
    a.bind_mw(&mut mw, &mr, 0, 256, RW, 1, PostFlags::SIGNALED)
        .unwrap();
    // Dropped before the NIC ran the bind (stepped: nothing runs until `process`).
    drop(a);
    let mut b = pd.create_qp(&cq, &cq, QpCaps::default()).unwrap();
    assert_eq!(b.qpn(), qpn, "the number came back");
    b.connect(&b.endpoint().unwrap()).unwrap();
    dev.process();
    let nic = dev.nic().unwrap();
    assert_eq!(
        nic.mw_state(k0),
        Some((k0, false)),
        "the NIC never bound the window"
    );
    let r = b.unbind_mw(&mut mw, 2, PostFlags::SIGNALED);
    let mut out = [Completion::default(); 4];
    dev.process();
    let n = cq.poll(&mut out);
    let seen: Vec<_> = out[..n].iter().map(|c| (c.cookie, c.status)).collect();
    assert!(
        matches!(r, Err(Error::WindowState { .. })),
        "unbind through the QP that reuses the number: {r:?}; completions {seen:?}; \
         QP state {:?}",
        nic.qp_state(qpn)
    );
}

/// A window a peer invalidated with its send with invalidate, the receive completion that
/// says so polled, is not unbound again with a local invalidate: the NIC's window is free
/// already, and that invalidate would fail (the software NIC, as a ConnectX with
/// `CHECK_QPN` on a free key) and take the QP to the error state with all its work, or, on
/// rxe, run `rxe_do_invalidate_mw` on a window without QP or region (`rxe_invalidate_mw`
/// refuses only an INVALID window, not a FREE one). The crate has the key in the QP's record
/// of invalidated keys: the unbind is refused, naming `MemoryWindow::invalidated`, and the
/// QP goes on.
#[test]
fn unbinding_a_window_a_peer_invalidated_is_refused_and_the_qp_goes_on() {
    let mut p = pair();
    let mut mw = p.b.pd().alloc_mw(MwType::Two).unwrap();
    let rkey =
        p.b.bind_mw(&mut mw, &p.mr_b, 0, 256, RW, 1, PostFlags::SIGNALED)
            .unwrap();
    p.wait(true, 1);
    p.b.post_recv(&[p.mr_b.sge(2048, 64).unwrap()], 50).unwrap();
    p.a.post(
        &Request::SendInv {
            data: Payload::Inline(b"done"),
            rkey,
        },
        2,
        PostFlags::SIGNALED,
    )
    .unwrap();
    assert_eq!(p.wait(false, 1)[0].1, WcStatus::Success);
    assert_eq!(p.wait(true, 1)[0].2, WcOpcode::RecvWithInv);
    let e = p.b.unbind_mw(&mut mw, 3, PostFlags::SIGNALED);
    assert!(
        matches!(e, Err(Error::WindowState { rkey: k, .. }) if k == rkey),
        "{e:?}"
    );
    // Nothing was posted: B's QP still works, and the window is unbound by the record.
    p.b.write_inline(b"still", p.mr_a.remote(0).unwrap(), 4, PostFlags::SIGNALED)
        .unwrap();
    assert_eq!(p.wait(true, 1)[0].1, WcStatus::Success);
    mw.invalidated(rkey).unwrap();
    assert!(!mw.is_bound());
    let again =
        p.b.bind_mw(&mut mw, &p.mr_b, 0, 256, RW, 5, PostFlags::SIGNALED)
            .unwrap();
    assert_eq!(p.wait(true, 1)[0].1, WcStatus::Success);
    assert_eq!(write(&mut p, b"ok", 0, again, 6), WcStatus::Success);
}
