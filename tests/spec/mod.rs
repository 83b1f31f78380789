//! The promises of the four RDMA-write specifications (uDAPL `dat_ep_post_rdma_write` and
//! `dat_rmr_bind`, librdmacm `rdma_post_writev`, librpma `rpma_write_with_imm`), one check
//! per line of the README's table, runnable on any device: the software NIC (direct path)
//! and rxe (verbs path). A binary that includes it includes `tests/scenarios` as
//! `scenarios` too (`tests/conformance`, `tests/rxe`).
#![allow(dead_code)]

pub(crate) use crate::scenarios;

use blueflame::connect::RemoteBuf;
use blueflame::*;
use scenarios::Pair;

const REGION: Access = Access(1 | 2 | 4 | 8 | 16); // local write, remote write/read/atomic, bind
const RW: Access = Access(Access::REMOTE_READ.0 | Access::REMOTE_WRITE.0);

fn pair(dev: &Device) -> Pair {
    Pair::new(dev, REGION, scenarios::caps(), &Timing::default())
}

fn buf(mr: &MemoryRegion) -> RemoteBuf {
    RemoteBuf {
        addr: mr.addr(),
        rkey: mr.rkey(),
        len: mr.len() as u64,
    }
}

/// uDAPL `dat_ep_post_rdma_write` / librdmacm `rdma_post_writev`: an I/O vector of local
/// segments (from two regions) lands concatenated in one remote buffer; the cookie comes back.
pub fn gather_write_iov(dev: &Device) {
    let mut p = pair(dev);
    let other = p.a.pd().alloc_mr(256, REGION).unwrap();
    p.mr_a.write(0, b"hello, ").unwrap();
    other.write(100, b"gathered ").unwrap();
    p.mr_a.write(50, b"world").unwrap();
    let iov = [
        LocalSeg {
            mr: &p.mr_a,
            off: 0,
            len: 7,
        },
        LocalSeg {
            mr: &other,
            off: 100,
            len: 9,
        },
        LocalSeg {
            mr: &p.mr_a,
            off: 50,
            len: 5,
        },
    ];
    p.a.write_iov(&iov, &buf(&p.mr_b), 64, 0xc0ff_ee00, PostFlags::SIGNALED)
        .unwrap();
    assert_eq!(
        p.wait(false, 1),
        vec![(0xc0ff_ee00, WcStatus::Success, WcOpcode::RdmaWrite, 0, None)]
    );
    assert_eq!(Pair::bytes(&p.mr_b, 64, 21), b"hello, gathered world");
}

/// DAT_INVALID_PARAMETER: a segment outside its region, refused before posting.
pub fn segment_outside_region(dev: &Device) {
    let mut p = pair(dev);
    let free = p.a.free_send();
    let iov = [LocalSeg {
        mr: &p.mr_a,
        off: 4000,
        len: 200,
    }];
    let e =
        p.a.write_iov(&iov, &buf(&p.mr_b), 0, 1, PostFlags::SIGNALED)
            .unwrap_err();
    assert!(
        matches!(e, Error::InvalidParameter { value: 4200, .. }),
        "{e}"
    );
    assert!(
        e.to_string().contains("0x1068"),
        "the message names the value: {e}"
    );
    assert_eq!(p.a.free_send(), free);
    assert!(p.nothing_more());
}

/// DAT_LENGTH_ERROR: the remote buffer is shorter than the data.
pub fn remote_buffer_too_short(dev: &Device) {
    let mut p = pair(dev);
    let iov = [LocalSeg {
        mr: &p.mr_a,
        off: 0,
        len: 100,
    }];
    let short = RemoteBuf {
        len: 150,
        ..buf(&p.mr_b)
    };
    let e =
        p.a.write_iov(&iov, &short, 100, 1, PostFlags::SIGNALED)
            .unwrap_err();
    assert!(
        matches!(
            e,
            Error::LengthError {
                needed: 100,
                available: 50
            }
        ),
        "{e}"
    );
    assert!(p.nothing_more());
}

/// DAT_PROTECTION_VIOLATION: a segment whose region is in another protection domain.
pub fn segment_of_another_pd(dev: &Device) {
    let mut p = pair(dev);
    let foreign = p.dev.alloc_pd().unwrap().alloc_mr(64, REGION).unwrap();
    let iov = [LocalSeg {
        mr: &foreign,
        off: 0,
        len: 8,
    }];
    let e =
        p.a.write_iov(&iov, &buf(&p.mr_b), 0, 1, PostFlags::SIGNALED)
            .unwrap_err();
    assert!(
        matches!(e, Error::Protection { lkey } if lkey == foreign.lkey()),
        "{e}"
    );
}

/// DAT_INVALID_STATE: posting before the endpoint is connected.
pub fn not_connected(dev: &Device) {
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(16).unwrap();
    let mut qp = pd.create_qp(&cq, &cq, scenarios::caps()).unwrap();
    let mr = pd.alloc_mr(64, REGION).unwrap();
    let e = qp
        .write_inline(b"early", mr.remote(0).unwrap(), 1, PostFlags::SIGNALED)
        .unwrap_err();
    assert!(matches!(e, Error::InvalidState { .. }), "{e}");
    let mut b = qp.batch();
    assert!(matches!(
        b.push(&Request::Nop, 2, PostFlags::SIGNALED),
        Err(Error::InvalidState { .. })
    ));
}

/// DAT_INSUFFICIENT_RESOURCES: the send queue is full (or its CQ could overflow first: a
/// ConnectX's send queue, as rdma-core's provider sizes it, may hold more requests than the
/// CQ has room for their completions); nothing is overwritten.
pub fn queue_full(dev: &Device) {
    let mut p = pair(dev);
    let mut posted = 0u64;
    let e = loop {
        match p
            .a
            .write_inline(b"x", p.mr_b.remote(0).unwrap(), posted, PostFlags::SIGNALED)
        {
            Ok(()) => posted += 1,
            Err(e) => break e,
        }
        assert!(posted < 10_000, "the queue never filled");
    };
    // A CQ refusal names the CQ as `Cq::cqn` does (the verbs path's named "CQ 0x0").
    assert!(
        matches!(e, Error::QueueFull { .. })
            || matches!(e, Error::CqFull { cqn, .. } if cqn == p.cq_a.cqn()),
        "{e} (CQ {:#x})",
        p.cq_a.cqn()
    );
    let got = p.wait(false, posted as usize);
    assert!(got
        .iter()
        .enumerate()
        .all(|(i, c)| c.0 == i as u64 && c.1 == WcStatus::Success));
}

/// A request posted on a disconnected (error) endpoint is flushed with its cookie, not
/// refused.
pub fn disconnected_is_flushed(dev: &Device) {
    let mut p = pair(dev);
    p.a.set_error().unwrap();
    p.a.write_inline(b"late", p.mr_b.remote(0).unwrap(), 77, PostFlags::SIGNALED)
        .unwrap();
    p.a.write_inline(
        b"late",
        p.mr_b.remote(0).unwrap(),
        78,
        PostFlags::UNSIGNALED,
    )
    .unwrap();
    let got: Vec<(u64, WcStatus)> = p.wait(false, 2).iter().map(|c| (c.0, c.1)).collect();
    assert_eq!(
        got,
        vec![(77, WcStatus::WrFlushErr), (78, WcStatus::WrFlushErr)]
    );
}

/// DAT_COMPLETION_SUPPRESS_FLAG / completion "on error only": no completion on success, the
/// error one still arrives.
pub fn suppress_success_completions(dev: &Device) {
    let mut p = pair(dev);
    p.a.write_inline(
        b"quiet",
        p.mr_b.remote(0).unwrap(),
        1,
        PostFlags::UNSIGNALED,
    )
    .unwrap();
    assert!(p.nothing_more());
    assert_eq!(Pair::bytes(&p.mr_b, 0, 5), b"quiet");
    let bad = Remote {
        rkey: p.mr_b.rkey() ^ 0x3300_0000,
        ..p.mr_b.remote(0).unwrap()
    };
    p.a.write_inline(b"loud", bad, 2, PostFlags::UNSIGNALED)
        .unwrap();
    let got = p.wait(false, 1)[0];
    assert_eq!(
        (got.0, got.1),
        (2, WcStatus::RemAccessErr),
        "the error still arrives"
    );
}

/// DAT_COMPLETION_SOLICITED_WAIT_FLAG: the solicited bit is accepted on a send and a write
/// with immediate; both complete on both sides.
pub fn solicited(dev: &Device) {
    let mut p = pair(dev);
    p.b.post_recv(&[p.mr_b.sge(0, 64).unwrap()], 10).unwrap();
    p.b.post_recv(&[p.mr_b.sge(64, 64).unwrap()], 11).unwrap();
    p.a.send(Payload::Inline(b"wake"), 1, PostFlags::SIGNALED.solicited())
        .unwrap();
    p.a.write_imm(
        Payload::Inline(b"up"),
        p.mr_b.remote(200).unwrap(),
        5,
        2,
        PostFlags::SIGNALED.solicited(),
    )
    .unwrap();
    assert!(p.wait(false, 2).iter().all(|c| c.1 == WcStatus::Success));
    let r = p.wait(true, 2);
    assert_eq!(
        (r[0].0, r[0].2, r[1].0, r[1].2),
        (10, WcOpcode::Recv, 11, WcOpcode::RecvRdmaWithImm)
    );
}

/// DAT_COMPLETION_BARRIER_FENCE_FLAG: a fenced write waits for the read before it; the read
/// sees the old bytes, the write's bytes land after.
pub fn barrier_fence(dev: &Device) {
    barrier_fence_with(dev, Fence::SmallAndFence)
}

/// [`barrier_fence`] with the write's fence mode `fence`: without one that waits for reads
/// (`Fence::None`, `Fence::InitiatorSmall`) a NIC that reorders as the rules allow may land
/// the write before the read has read its data (the software NIC's ordering mode does).
pub fn barrier_fence_with(dev: &Device, fence: Fence) {
    let mut p = pair(dev);
    p.mr_b.write(0, b"before").unwrap();
    p.a.read(
        &[p.mr_a.sge(0, 6).unwrap()],
        p.mr_b.remote(0).unwrap(),
        1,
        PostFlags::SIGNALED,
    )
    .unwrap();
    p.a.write_inline(
        b"after!",
        p.mr_b.remote(0).unwrap(),
        2,
        PostFlags::SIGNALED.fence(fence),
    )
    .unwrap();
    let got = p.wait(false, 2);
    assert_eq!((got[0].0, got[1].0), (1, 2));
    assert_eq!(Pair::bytes(&p.mr_a, 0, 6), b"before");
    assert_eq!(Pair::bytes(&p.mr_b, 0, 6), b"after!");
}

/// librdmacm / uDAPL: inline data needs no registration (a stack buffer).
pub fn inline_needs_no_registration(dev: &Device) {
    let mut p = pair(dev);
    let on_stack = [0xabu8; 48];
    p.a.write_inline(&on_stack, p.mr_b.remote(8).unwrap(), 3, PostFlags::SIGNALED)
        .unwrap();
    assert_eq!(p.wait(false, 1)[0].1, WcStatus::Success);
    assert_eq!(Pair::bytes(&p.mr_b, 8, 48), on_stack);
}

/// librpma `rpma_write_with_imm`: the immediate reaches the peer's receive completion;
/// a zero-byte write with immediate is legal.
pub fn write_with_imm_and_zero_bytes(dev: &Device) {
    let mut p = pair(dev);
    p.b.post_recv(&[p.mr_b.sge(0, 8).unwrap()], 20).unwrap();
    p.b.post_recv(&[p.mr_b.sge(8, 8).unwrap()], 21).unwrap();
    let iov = [LocalSeg {
        mr: &p.mr_a,
        off: 0,
        len: 32,
    }];
    p.a.write_iov_imm(
        &iov,
        &buf(&p.mr_b),
        100,
        0x1234_5678,
        1,
        PostFlags::SIGNALED,
    )
    .unwrap();
    p.a.write_iov_imm(&[], &buf(&p.mr_b), 0, 0xfeed, 2, PostFlags::SIGNALED)
        .unwrap();
    assert!(p.wait(false, 2).iter().all(|c| c.1 == WcStatus::Success));
    let r = p.wait(true, 2);
    assert_eq!(
        r[0],
        (
            20,
            WcStatus::Success,
            WcOpcode::RecvRdmaWithImm,
            32,
            Some(0x1234_5678)
        )
    );
    assert_eq!(
        r[1],
        (
            21,
            WcStatus::Success,
            WcOpcode::RecvRdmaWithImm,
            0,
            Some(0xfeed)
        )
    );
}

/// `dat_rmr_bind`: a window over part of a region with remote rights, a new rkey, the peer
/// uses it as soon as it learns it from a send posted after the bind.
pub fn bind_then_advertise(dev: &Device, mw_type: MwType) {
    let mut p = pair(dev);
    let mut mw = p.b.pd().alloc_mw(mw_type).unwrap();
    let old = mw.rkey();
    p.a.post_recv(&[p.mr_a.sge(1024, 16).unwrap()], 30).unwrap();
    let rkey =
        p.b.bind_mw(&mut mw, &p.mr_b, 512, 128, RW, 1, PostFlags::SIGNALED)
            .unwrap();
    assert_ne!(rkey, old, "a new rkey");
    // The bind fences the send after it, so the peer never sees a key before it is valid.
    p.b.send(Payload::Inline(&rkey.to_ne_bytes()), 2, PostFlags::SIGNALED)
        .unwrap();
    assert!(p.wait(true, 2).iter().all(|c| c.1 == WcStatus::Success));
    let r = p.wait(false, 1)[0];
    assert_eq!((r.0, r.1), (30, WcStatus::Success));
    let advertised = u32::from_ne_bytes(Pair::bytes(&p.mr_a, 1024, 4).try_into().unwrap());
    assert_eq!(advertised, rkey);
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
    assert_eq!(p.wait(false, 1)[0].1, WcStatus::Success);
    assert_eq!(Pair::bytes(&p.mr_b, 512, 10), b"via window");
}

/// `dat_rmr_bind`: after a rebind (type 1) or an invalidate (type 2) the old rkey fails with
/// a remote access error; a zero-length bind unbinds.
pub fn old_rkey_fails(dev: &Device, mw_type: MwType) {
    let mut p = pair(dev);
    let mut mw = p.b.pd().alloc_mw(mw_type).unwrap();
    let first =
        p.b.bind_mw(&mut mw, &p.mr_b, 0, 256, RW, 1, PostFlags::SIGNALED)
            .unwrap();
    match mw_type {
        MwType::One => {
            let _ =
                p.b.bind_mw(&mut mw, &p.mr_b, 0, 0, RW, 2, PostFlags::SIGNALED)
                    .unwrap();
        }
        MwType::Two => {
            let _ = p.b.unbind_mw(&mut mw, 2, PostFlags::SIGNALED).unwrap();
        }
    }
    assert!(p.wait(true, 2).iter().all(|c| c.1 == WcStatus::Success));
    let addr = p.mr_b.addr();
    p.a.write_inline(
        b"stale",
        Remote { addr, rkey: first },
        3,
        PostFlags::SIGNALED,
    )
    .unwrap();
    assert_eq!(p.wait(false, 1)[0].1, WcStatus::RemAccessErr);
}

/// A peer invalidates a type-2 window with its send (send with invalidate): the receiver's
/// completion reports the key, and the key fails from then on. The window is unbound on the
/// NIC's word only: the caller's claim (`MemoryWindow::invalidated`) is refused until a
/// receive completion of the window's QP reported the key, then taken once; the window may
/// be bound again.
pub fn send_with_invalidate(dev: &Device) {
    let mut p = pair(dev);
    let mut mw = p.b.pd().alloc_mw(MwType::Two).unwrap();
    let rkey =
        p.b.bind_mw(&mut mw, &p.mr_b, 0, 256, RW, 1, PostFlags::SIGNALED)
            .unwrap();
    assert_eq!(p.wait(true, 1)[0].1, WcStatus::Success);
    let refused = |e: Result<()>| matches!(e, Err(Error::WindowState { .. }));
    // A false claim: refused, and the window (and its key) stay.
    assert!(refused(mw.invalidated(rkey)));
    assert!(mw.is_bound());
    let addr = p.mr_b.addr();
    p.a.write_inline(b"valid", Remote { addr, rkey }, 2, PostFlags::SIGNALED)
        .unwrap();
    assert_eq!(p.wait(false, 1)[0].1, WcStatus::Success);
    p.b.post_recv(&[p.mr_b.sge(1024, 64).unwrap()], 40).unwrap();
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
    // Invalidated on the NIC, but its completion not polled yet: still refused.
    assert!(refused(mw.invalidated(rkey)));
    // On rxe too, whose kernel driver says "with invalidate" by another flag (the crate's
    // `WITH_INV_ANY`).
    let got = p.wait(true, 1)[0];
    assert_eq!(
        got,
        (40, WcStatus::Success, WcOpcode::RecvWithInv, 4, Some(rkey))
    );
    assert!(refused(mw.invalidated(rkey ^ 1)), "not the window's key");
    mw.invalidated(rkey).unwrap();
    assert!(!mw.is_bound());
    assert!(refused(mw.invalidated(rkey)), "taken once");
    // Unbound: it may be bound again, with a new key that works; the old one fails.
    let again =
        p.b.bind_mw(&mut mw, &p.mr_b, 0, 256, RW, 4, PostFlags::SIGNALED)
            .unwrap();
    assert_ne!(again, rkey);
    assert_eq!(p.wait(true, 1)[0].1, WcStatus::Success);
    let new = Remote { addr, rkey: again };
    p.a.write_inline(b"again", new, 5, PostFlags::SIGNALED)
        .unwrap();
    assert_eq!(p.wait(false, 1)[0].1, WcStatus::Success);
    p.a.write_inline(b"stale", Remote { addr, rkey }, 6, PostFlags::SIGNALED)
        .unwrap();
    assert_eq!(p.wait(false, 1)[0].1, WcStatus::RemAccessErr);
}

/// DAT_PRIVILEGES_VIOLATION: window rights beyond the region's, refused before posting.
pub fn privileges_violation(dev: &Device) {
    let mut p = Pair::new(
        dev,
        Access::LOCAL_WRITE | Access::REMOTE_READ | Access::MW_BIND,
        scenarios::caps(),
        &Timing::default(),
    );
    let mut mw = p.b.pd().alloc_mw(MwType::Two).unwrap();
    let e =
        p.b.bind_mw(&mut mw, &p.mr_b, 0, 64, RW, 1, PostFlags::SIGNALED)
            .unwrap_err();
    assert!(matches!(e, Error::Privileges { .. }), "{e}");
    assert!(p.nothing_more());
}

/// DAT_INVALID_HANDLE: a window of another protection domain.
pub fn invalid_handle(dev: &Device) {
    let mut p = pair(dev);
    let mut foreign = p.dev.alloc_pd().unwrap().alloc_mw(MwType::Two).unwrap();
    let e =
        p.b.bind_mw(&mut foreign, &p.mr_b, 0, 64, RW, 1, PostFlags::SIGNALED)
            .unwrap_err();
    assert!(matches!(e, Error::InvalidHandle { .. }), "{e}");
}

/// One promise's check.
pub type Check = fn(&Device);

/// Every check, by name: one per line of the README's table.
pub const ALL: &[(&str, Check)] = &[
    ("gather_write_iov", gather_write_iov),
    ("segment_outside_region", segment_outside_region),
    ("remote_buffer_too_short", remote_buffer_too_short),
    ("segment_of_another_pd", segment_of_another_pd),
    ("not_connected", not_connected),
    ("queue_full", queue_full),
    ("disconnected_is_flushed", disconnected_is_flushed),
    ("suppress_success_completions", suppress_success_completions),
    ("solicited", solicited),
    ("barrier_fence", barrier_fence),
    ("inline_needs_no_registration", inline_needs_no_registration),
    (
        "write_with_imm_and_zero_bytes",
        write_with_imm_and_zero_bytes,
    ),
    ("bind_type1_then_advertise", |d| {
        bind_then_advertise(d, MwType::One)
    }),
    ("bind_type2_then_advertise", |d| {
        bind_then_advertise(d, MwType::Two)
    }),
    ("old_rkey_fails_type1", |d| old_rkey_fails(d, MwType::One)),
    ("old_rkey_fails_type2", |d| old_rkey_fails(d, MwType::Two)),
    ("send_with_invalidate", send_with_invalidate),
    ("privileges_violation", privileges_violation),
    ("invalid_handle", invalid_handle),
];
