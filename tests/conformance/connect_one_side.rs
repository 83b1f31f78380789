//! A QP connects one side, as `ibv_modify_qp` to RTR and RTS does on a ConnectX: it writes
//! the QP's own context (`remote_qpn`) and looks at nothing else. A QP in INIT (where it is
//! created) connects to any number, whatever the peer's state; its requests reach the peer
//! once the peer is connected too, and fail with `RetryExcErr` after its retries when the
//! peer never answers (not connected yet, in error, or no QP at all). The software NIC used to connect both ends at
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
    b.connect(&a.endpoint().unwrap()).unwrap();
    assert!(
        matches!(
            a.write_inline(b"x", mr.remote(0).unwrap(), 1, PostFlags::SIGNALED),
            Err(Error::InvalidState { .. })
        ),
        "a is not connected by b's connect"
    );
    a.connect(&b.endpoint().unwrap()).unwrap();
    c.connect(&b.endpoint().unwrap()).unwrap();
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

/// Timers short enough that a request nobody answers fails quickly.
const QUICK: Timing = Timing {
    timeout: 1,
    retry_cnt: 1,
    rnr_retry: 7,
    min_rnr_timer: 12,
};

/// A bare QP number (`Endpoint { qpn, ..Endpoint::default() }`: no LID, no GID, PSN 0)
/// names no port: the software NIC refuses it as an rdma-core device does (the kernel's
/// `mlx5_set_path` would program `rlid` 0, InfiniBand's reserved LID: a dead QP), with
/// `InvalidParameter`, the QP left in INIT. It then connects with the real endpoint and
/// carries a write.
#[test]
fn a_bare_qp_number_is_refused_and_the_qp_connects_after() {
    let dev = Device::sim_stepped();
    let pd = dev.alloc_pd().unwrap();
    let mut cq = dev.create_cq(64).unwrap();
    let mr = pd.alloc_mr(4096, scenarios::RIGHTS).unwrap();
    let mut a = pd.create_qp(&cq, &cq, scenarios::caps()).unwrap();
    let mut b = pd.create_qp(&cq, &cq, scenarios::caps()).unwrap();
    let bare = Endpoint {
        qpn: b.qpn(),
        ..Endpoint::default()
    };
    let r = a.connect_with(&bare, &Timing::default());
    assert!(
        matches!(r, Err(Error::InvalidParameter { what, value }) if what.contains("address") && value == u64::from(b.qpn())),
        "a connect to a bare QP number: {r:?}"
    );
    let (ea, eb) = (a.endpoint().unwrap(), b.endpoint().unwrap());
    a.connect_with(&eb, &Timing::default()).unwrap();
    b.connect_with(&ea, &Timing::default()).unwrap();
    a.write_inline(&[5; 8], mr.remote(0).unwrap(), 1, PostFlags::SIGNALED)
        .unwrap();
    let mut out = [Completion::default(); 1];
    assert_eq!(cq.poll_n(&mut out, 1, 1 << 34), 1);
    assert_eq!((out[0].cookie, out[0].status), (1, WcStatus::Success));
    assert_eq!(mr.read_u64(0).unwrap(), u64::from_ne_bytes([5; 8]));
}

/// `a` connected to `b` by `to` (b connected to a by `back`), then a signaled write of
/// a's into `mr`: its completion.
fn write_over(
    dev: &Device,
    pd: &Pd,
    mr: &MemoryRegion,
    to: impl Fn(Endpoint) -> Endpoint,
    back: impl Fn(Endpoint) -> Endpoint,
) -> Completion {
    let mut cq = dev.create_cq(64).unwrap();
    let mut a = pd.create_qp(&cq, &cq, scenarios::caps()).unwrap();
    let mut b = pd.create_qp(&cq, &cq, scenarios::caps()).unwrap();
    let (ea, eb) = (a.endpoint().unwrap(), b.endpoint().unwrap());
    a.connect_with(&to(eb), &QUICK).unwrap();
    b.connect_with(&back(ea), &QUICK).unwrap();
    a.write_inline(&[9; 8], mr.remote(0).unwrap(), 1, PostFlags::SIGNALED)
        .unwrap();
    let mut out = [Completion::default(); 1];
    assert_eq!(cq.poll_n(&mut out, 1, 1 << 34), 1, "no completion");
    out[0]
}

/// The software NIC connects only to what the address names, as a ConnectX: an endpoint
/// whose LID is another software NIC's sends to that port, which runs none of this NIC's
/// QPs, so nothing answers and the requests end in `RetryExcErr`; and a responder told a
/// first PSN other than the requester's (its `rq_psn`) takes none of the requester's
/// packets (out of sequence), with the same end. Nothing lands in the peer's memory.
#[test]
fn a_wrong_lid_or_psn_in_the_endpoint_reaches_no_one() {
    let dev = Device::sim_stepped();
    let pd = dev.alloc_pd().unwrap();
    let mr = pd.alloc_mr(4096, scenarios::RIGHTS).unwrap();
    let other = Device::sim_stepped();
    let other_lid = {
        let opd = other.alloc_pd().unwrap();
        let ocq = other.create_cq(16).unwrap();
        let oqp = opd.create_qp(&ocq, &ocq, scenarios::caps()).unwrap();
        oqp.endpoint().unwrap().lid
    };
    let c = write_over(
        &dev,
        &pd,
        &mr,
        |e| Endpoint {
            lid: other_lid,
            ..e
        },
        |e| e,
    );
    assert_eq!(
        (c.status, mr.read_u64(0).unwrap()),
        (WcStatus::RetryExcErr, 0),
        "a write to another software NIC's LID ({other_lid:#x}): {c:?}"
    );
    let c = write_over(
        &dev,
        &pd,
        &mr,
        |e| e,
        |e| Endpoint {
            psn: e.psn ^ 1,
            ..e
        },
    );
    assert_eq!(
        (c.status, mr.read_u64(0).unwrap()),
        (WcStatus::RetryExcErr, 0),
        "a write to a responder expecting another PSN: {c:?}"
    );
    let c = write_over(&dev, &pd, &mr, |e| e, |e| e);
    assert_eq!(
        (c.status, mr.read_u64(0).unwrap()),
        (WcStatus::Success, u64::from_ne_bytes([9; 8])),
        "the same pair with the endpoints as they are"
    );
}

/// Every software NIC of a process is a port of its own: two have different addresses
/// (LID and GID), each a unicast LID and a GID, and the active MTU (verbs enum).
#[test]
fn two_software_nics_have_different_endpoints() {
    let ends: Vec<Endpoint> = (0..2)
        .map(|_| {
            let dev = Device::sim_stepped();
            let pd = dev.alloc_pd().unwrap();
            let cq = dev.create_cq(16).unwrap();
            let qp = pd.create_qp(&cq, &cq, scenarios::caps()).unwrap();
            qp.endpoint().unwrap()
        })
        .collect();
    for e in &ends {
        assert!((1..0xc000).contains(&e.lid), "a unicast LID: {e:?}");
        assert_ne!(e.gid, [0; 16], "a GID: {e:?}");
        assert_eq!(
            e.mtu, 5,
            "the port's active MTU, 4096 (IBV_MTU_4096): {e:?}"
        );
    }
    assert_ne!(ends[0].lid, ends[1].lid, "{ends:?}");
    assert_ne!(ends[0].gid, ends[1].gid, "{ends:?}");
}

/// A receive posted before `connect` (the usual way to have one ready for the peer's first
/// send): an RC QP is created in INIT, as perftest's `ctx_modify_qp_to_init` and UCX's
/// `uct_rc_iface_qp_init` leave theirs, where verbs take receives (in RESET they refuse
/// them: IBA C10-97.2.1, libmlx5's `qp_state_max_gs`). The receive waits there: a message
/// arriving before the QP is connected finds no responder (a ConnectX answers nothing
/// below RTR) and leaves it posted; once connected, the QP's next message lands in it.
#[test]
fn a_receive_posted_before_connect_waits_for_the_connection() {
    let dev = Device::sim_stepped();
    let pd = dev.alloc_pd().unwrap();
    let mut cq = dev.create_cq(64).unwrap();
    let mr = pd.alloc_mr(4096, scenarios::RIGHTS).unwrap();
    let mut b = pd.create_qp(&cq, &cq, scenarios::caps()).unwrap();
    let state = dev.nic().unwrap().qp_state(b.qpn());
    assert_eq!(state, Some(mlx5::sim::QpState::Init), "a new RC QP");
    b.post_recv(&[mr.sge(256, 64).unwrap()], 1).unwrap();
    // A send to b before b is connected: nobody answers, the receive stays posted.
    let mut early_cq = dev.create_cq(64).unwrap();
    let mut early = pd
        .create_qp(&early_cq, &early_cq, scenarios::caps())
        .unwrap();
    let quick = Timing {
        timeout: 1,
        retry_cnt: 1,
        ..Timing::default()
    };
    early.connect_with(&b.endpoint().unwrap(), &quick).unwrap();
    early
        .send(Payload::Inline(b"too early"), 2, PostFlags::SIGNALED)
        .unwrap();
    let mut out = [Completion::default(); 2];
    assert_eq!(early_cq.poll_n(&mut out, 1, 1 << 34), 1);
    assert_eq!((out[0].cookie, out[0].status), (2, WcStatus::RetryExcErr));
    assert_eq!(cq.poll(&mut out), 0, "b's receive is still posted");
    // Connected, b takes a's message into it.
    let mut a = pd.create_qp(&cq, &cq, scenarios::caps()).unwrap();
    let (ea, eb) = (a.endpoint().unwrap(), b.endpoint().unwrap());
    a.connect_with(&eb, &Timing::default()).unwrap();
    b.connect_with(&ea, &Timing::default()).unwrap();
    a.send(Payload::Inline(b"on time"), 3, PostFlags::SIGNALED)
        .unwrap();
    assert_eq!(cq.poll_n(&mut out, 2, 1 << 34), 2);
    let mut got: Vec<_> = out.iter().map(|c| (c.cookie, c.status)).collect();
    got.sort_by_key(|g| g.0);
    assert_eq!(got, [(1, WcStatus::Success), (3, WcStatus::Success)]);
    let recv = out.iter().find(|c| c.cookie == 1).unwrap();
    assert_eq!((recv.opcode, recv.byte_len), (WcOpcode::Recv, 7));
    let mut bytes = [0u8; 7];
    mr.read(256, &mut bytes).unwrap();
    assert_eq!(&bytes, b"on time");
}
