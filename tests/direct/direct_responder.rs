//! The software NIC's requester and responder where a ConnectX does something else than the
//! obvious: a DCT that refuses a request raises no event, and a requester fails a bad local
//! key at once whatever its responder's state.

use crate::common;

use blueflame::*;
use common::*;
use mlx5::sim::QpState;

/// A DCT never raises a QP access error on a ConnectX: the kernel's mlx5 `qpc.c`
/// (`dct_allowed_event_types` = DCT_DRAINED only; `rsc_event_notifier` drops anything else
/// on a DCT) never hands one to user space. The DCT keeps serving, its CQ is fine.
#[test]
fn a_dct_refusing_a_request_raises_no_event() {
    let dev = Device::sim_stepped();
    let pd = dev.alloc_pd().unwrap();
    let tcq = dev.create_cq(16).unwrap();
    let tsrq = pd.create_srq(&tcq, SrqCaps::default()).unwrap();
    let dct = pd.create_dct(&tcq, &tsrq, 5, Access::REMOTE_READ).unwrap();
    let mr = pd.alloc_mr(4096, common::ALL).unwrap();
    let mut cq = dev.create_cq(64).unwrap();
    let peer = dct.peer().unwrap();
    let mut dci = pd.create_dci(&cq, QpCaps::default()).unwrap();
    let bad = Remote {
        addr: mr.remote(0).unwrap().addr,
        rkey: mr.remote(0).unwrap().rkey ^ 0x100,
    };
    dci.to(&peer)
        .read(&[mr.sge(128, 8).unwrap()], bad, 2, PostFlags::SIGNALED)
        .unwrap();
    dev.nic().unwrap().drain();
    let got = poll_all(&mut cq);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].status, WcStatus::RemAccessErr);
    assert_eq!(nic(&dev).qp_state(dct.dctn()), Some(QpState::Rts));
    // On a ConnectX: Ok (no event reaches user space for a DCT).
    assert!(tcq.check().is_ok(), "DCT's CQ: {:?}", tcq.check());
}

/// A requester gathers its data before a packet leaves: a bad lkey is a local protection
/// error whatever the responder's state (a responder in error only drops packets that are
/// sent).
#[test]
fn a_bad_lkey_fails_locally_even_when_the_responder_is_in_error() {
    let mut s = Setup::pair(QpCaps::default());
    let src = s.mr(64, Access::LOCAL_WRITE);
    let dst = s.mr(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    // The responder goes to error by a local error of its own (a bad lkey in its write).
    let bad = Sge {
        lkey: src.lkey() ^ 0x02,
        ..src.sge(0, 8).unwrap()
    };
    s.resp()
        .write(&[bad], dst.remote(0).unwrap(), 9, PostFlags::SIGNALED)
        .unwrap();
    s.run();
    assert_eq!(nic(&s.dev).qp_state(s.resp_qpn()), Some(QpState::Error));
    assert_eq!(nic(&s.dev).qp_state(s.a.qpn()), Some(QpState::Rts));
    s.a.write(&[bad], dst.remote(0).unwrap(), 1, PostFlags::SIGNALED)
        .unwrap();
    let t0 = nic(&s.dev).now_ns();
    nic(&s.dev).drain();
    let (c, _) = s.run();
    assert_eq!(c.len(), 1, "{c:?}");
    let waited = nic(&s.dev).now_ns() - t0;
    assert_eq!(
        (c[0].status, waited),
        (WcStatus::LocProtErr, 0),
        "a ConnectX fails the gather at once: {:?}",
        c[0]
    );
}
