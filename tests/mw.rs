//! Memory windows on the software NIC (direct path): bind (type 1 and 2) through UMR WQEs,
//! new rkey on every bind, old keys refused, invalidation (local and by send with
//! invalidate), zero-length unbind, rights and range of the window, privileges errors
//! before posting, and the fence after a bind.

mod scenarios;

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
    p.b.invalidate(rkey, 2, PostFlags::SIGNALED).unwrap();
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
        (50, WcStatus::Success, WcOpcode::Recv, 4, Some(rkey))
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

/// `Request::BindMw` through a generic post skips every check `Qp::bind_mw` makes (the
/// range inside the region, the region's rights, the window's state) and the window's own
/// record of its key: every generic entry refuses it before posting and names the typed
/// methods, so a bind over the region's end cannot fail at the NIC (MwBindErr) and kill the
/// QP. The QP and the window go on working: `Qp::bind_mw` binds it next.
#[test]
fn a_bind_through_a_generic_post_is_refused_and_names_bind_mw() {
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
    let req = Request::BindMw(bind);
    let flags = PostFlags::SIGNALED;
    let mut refused = vec![p.b.post(&req, 1, flags)];
    let mut batch = p.b.batch();
    refused.push(batch.push(&req, 2, flags));
    batch.ring().unwrap();
    let sq = p.b.direct_sq().unwrap();
    refused.push(sq.post(&req, 3, flags));
    refused.push(sq.push(&req, 4, flags));
    sq.ring();
    let mut batch = sq.batch();
    refused.push(batch.push(&req, 5, flags));
    batch.ring();
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
}
