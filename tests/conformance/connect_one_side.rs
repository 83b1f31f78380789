//! A QP connects one side, as `ibv_modify_qp` to RTR and RTS does on a ConnectX: it writes
//! the QP's own context (`remote_qpn`) and looks at nothing else. A QP in RESET connects to
//! any number, whatever the peer's state; its requests reach the peer once the peer is
//! connected too, and fail with `RetryExcErr` after its retries when the peer never answers
//! (in RESET, in error, or no QP at all). The software NIC used to connect both ends at
//! once: it refused a fresh QP whose peer was not in RESET, and a QP the peer connected
//! took posts its own handle had never connected.

use crate::scenarios;
use blueflame::*;

/// A QP on its own CQ, its write to `mr`, and the first completion on that CQ.
fn first_completion(
    dev: &Device,
    pd: &Pd,
    mr: &MemoryRegion,
    peer: u32,
) -> Result<Completion, Error> {
    let mut cq = dev.create_cq(64)?;
    let mut a = pd.create_qp(&cq, &cq, scenarios::caps())?;
    let quick = Timing {
        timeout: 1,
        retry_cnt: 1,
        ..Timing::default()
    };
    let at = Endpoint {
        qpn: peer,
        ..a.endpoint()?
    };
    a.connect_with(&at, &quick)?;
    a.write_inline(b"x", mr.remote(0)?, 1, PostFlags::SIGNALED)?;
    let mut out = [Completion::default(); 1];
    assert_eq!(cq.poll_n(&mut out, 1, 1 << 34), 1, "no completion");
    Ok(out[0])
}

#[test]
fn a_fresh_qp_connects_whatever_its_peer_and_fails_its_requests_when_nobody_answers() {
    let dev = Device::sim_stepped();
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(64).unwrap();
    let mr = pd.alloc_mr(4096, scenarios::RIGHTS).unwrap();
    let in_reset = pd.create_qp(&cq, &cq, scenarios::caps()).unwrap();
    let mut in_error = pd.create_qp(&cq, &cq, scenarios::caps()).unwrap();
    in_error.set_error().unwrap();
    for (what, peer) in [
        ("a peer in RESET", in_reset.qpn()),
        ("a peer in error", in_error.qpn()),
        ("a number no QP has", 0x00ab_cdef),
    ] {
        let c = first_completion(&dev, &pd, &mr, peer).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(c.status, WcStatus::RetryExcErr, "{what}");
    }
    assert_eq!(mr.read_u64(0).unwrap(), 0, "nothing written");
}

#[test]
fn either_side_may_connect_first_and_a_peer_connected_elsewhere_does_not_stop_it() {
    let dev = Device::sim_stepped();
    let pd = dev.alloc_pd().unwrap();
    let mut cq = dev.create_cq(64).unwrap();
    let mr = pd.alloc_mr(4096, scenarios::RIGHTS).unwrap();
    let mut a = pd.create_qp(&cq, &cq, scenarios::caps()).unwrap();
    let mut b = pd.create_qp(&cq, &cq, scenarios::caps()).unwrap();
    let mut c = pd.create_qp(&cq, &cq, scenarios::caps()).unwrap();
    // b first, then a; c to b, which is connected to a.
    b.connect(a.qpn()).unwrap();
    assert!(
        matches!(
            a.write_inline(b"x", mr.remote(0).unwrap(), 1, PostFlags::SIGNALED),
            Err(Error::InvalidState { .. })
        ),
        "a is not connected by b's connect"
    );
    a.connect(b.qpn()).unwrap();
    c.connect(b.qpn()).unwrap();
    a.write_inline(&[7; 8], mr.remote(0).unwrap(), 2, PostFlags::SIGNALED)
        .unwrap();
    let mut out = [Completion::default(); 1];
    assert_eq!(cq.poll_n(&mut out, 1, 1 << 34), 1);
    assert_eq!((out[0].cookie, out[0].status), (2, WcStatus::Success));
    assert_eq!(mr.read_u64(0).unwrap(), u64::from_ne_bytes([7; 8]));
}

/// A QP moved to error before it was connected is in error, not connected: its posts are
/// refused on the software NIC as on rdma-core's backend (the software NIC took them, its
/// QP being out of RESET, and flushed them).
#[test]
fn a_qp_set_to_error_before_connect_refuses_posts() {
    let dev = Device::sim_stepped();
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(64).unwrap();
    let mr = pd.alloc_mr(4096, scenarios::RIGHTS).unwrap();
    let mut a = pd.create_qp(&cq, &cq, scenarios::caps()).unwrap();
    a.set_error().unwrap();
    let r = a.write_inline(b"x", mr.remote(0).unwrap(), 1, PostFlags::SIGNALED);
    assert!(
        matches!(r, Err(Error::InvalidState { state }) if state.contains("error")),
        "{r:?}"
    );
    let mut b = a.batch();
    assert!(matches!(
        b.push(&Request::Nop, 2, PostFlags::SIGNALED),
        Err(Error::InvalidState { .. })
    ));
}

/// An RC QP connected (one side) to the number of a QP of another transport: a DCT or a
/// UD QP. A ConnectX drops an RC packet at a QP of another service type (the DCT takes DC
/// packets, checked against its DC key; a UD QP datagrams, checked against its Q_Key):
/// the requester's retries run out, nothing is written, nothing is received.
#[test]
fn an_rc_qp_connected_to_a_dct_reaches_nothing() {
    let dev = Device::sim_stepped();
    let pd = dev.alloc_pd().unwrap();
    let tcq = dev.create_cq(64).unwrap();
    let srq = pd.create_srq(&tcq, SrqCaps::default()).unwrap();
    let mr = pd.alloc_mr(4096, scenarios::RIGHTS).unwrap();
    let dct = pd
        .create_dct(&tcq, &srq, 0xc0ffee, Access::REMOTE_WRITE)
        .unwrap();
    let c = first_completion(&dev, &pd, &mr, dct.dctn()).unwrap();
    assert_eq!(
        (c.status, mr.read_u64(0).unwrap()),
        (WcStatus::RetryExcErr, 0),
        "an RC write to a DCT's number, no DC key: {c:?}"
    );
}

/// As above, at a UD QP's number.
#[test]
fn an_rc_qp_connected_to_a_ud_qp_reaches_nothing() {
    let dev = Device::sim_stepped();
    let pd = dev.alloc_pd().unwrap();
    let mr = pd.alloc_mr(4096, scenarios::RIGHTS).unwrap();
    let ucq = dev.create_cq(64).unwrap();
    let ud = pd.create_ud_qp(&ucq, &ucq, QpCaps::default(), 5).unwrap();
    let c = first_completion(&dev, &pd, &mr, ud.endpoint().qpn).unwrap();
    assert_eq!(
        (c.status, mr.read_u64(0).unwrap()),
        (WcStatus::RetryExcErr, 0),
        "an RC write to a UD QP's number: {c:?}"
    );
}
