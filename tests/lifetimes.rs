//! Ownership while work is outstanding: a region dropped with work in flight stays
//! registered until that work completes; a CQ lives as long as a QP on it.

use blueflame::*;

const RIGHTS: Access = Access(1 | 2 | 4);

#[test]
fn a_region_dropped_with_work_in_flight_stays_registered_until_it_completes() {
    let dev = Device::sim_stepped();
    let pd = dev.alloc_pd().unwrap();
    let mut cq = dev.create_cq(64).unwrap();
    let mut qp = pd.create_qp(&cq, &cq, QpCaps::default()).unwrap();
    let me = qp.qpn();
    qp.connect(me).unwrap();
    let src = pd.alloc_mr(4096, RIGHTS).unwrap();
    let dst = pd.alloc_mr(4096, RIGHTS).unwrap();
    src.write(0, b"still here").unwrap();
    qp.write(
        &[src.sge(0, 10).unwrap()],
        dst.remote(0).unwrap(),
        1,
        PostFlags::SIGNALED,
    )
    .unwrap();
    let lkey = src.lkey();
    drop(src); // the NIC has not run the write yet
    assert_eq!(pd.reclaim(), 1, "parked while the write is outstanding");
    dev.process();
    let mut out = [Completion::default(); 2];
    assert_eq!(cq.poll(&mut out), 1);
    assert_eq!(
        (out[0].cookie, out[0].status),
        (1, WcStatus::Success),
        "the write read live memory"
    );
    let mut got = [0u8; 10];
    dst.read(0, &mut got).unwrap();
    assert_eq!(&got, b"still here");
    assert_eq!(pd.reclaim(), 0, "deregistered once the work completed");
    // The old key is gone now.
    let stale = Sge {
        addr: dst.addr(),
        len: 4,
        lkey,
    };
    qp.write(&[stale], dst.remote(100).unwrap(), 2, PostFlags::SIGNALED)
        .unwrap();
    dev.process();
    assert_eq!(cq.poll(&mut out), 1);
    assert_eq!((out[0].cookie, out[0].status), (2, WcStatus::LocProtErr));
}

#[test]
fn a_region_dropped_when_idle_is_deregistered_at_once() {
    let dev = Device::sim_stepped();
    let pd = dev.alloc_pd().unwrap();
    let mut cq = dev.create_cq(64).unwrap();
    let mut qp = pd.create_qp(&cq, &cq, QpCaps::default()).unwrap();
    let me = qp.qpn();
    qp.connect(me).unwrap();
    let dst = pd.alloc_mr(64, RIGHTS).unwrap();
    let victim = pd.alloc_mr(64, RIGHTS).unwrap();
    let remote = victim.remote(0).unwrap();
    drop(victim);
    assert_eq!(pd.reclaim(), 0);
    qp.write(&[dst.sge(0, 8).unwrap()], remote, 3, PostFlags::SIGNALED)
        .unwrap();
    dev.process();
    let mut out = [Completion::default(); 1];
    assert_eq!(cq.poll(&mut out), 1);
    assert_eq!(
        out[0].status,
        WcStatus::RemAccessErr,
        "its rkey no longer works"
    );
}

#[test]
fn a_cq_lives_as_long_as_its_qps() {
    let dev = Device::sim_stepped();
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(64).unwrap();
    let mut qp = pd.create_qp(&cq, &cq, QpCaps::default()).unwrap();
    let me = qp.qpn();
    qp.connect(me).unwrap();
    let mr = pd.alloc_mr(64, RIGHTS).unwrap();
    drop(cq); // the poller goes; the CQ's ring stays while the QP uses it
    qp.write_inline(
        b"into a live ring",
        mr.remote(0).unwrap(),
        4,
        PostFlags::SIGNALED,
    )
    .unwrap();
    assert_eq!(dev.process(), 1);
    assert!(!dev.nic().unwrap().cq_overrun(0x80));
    let mut got = [0u8; 16];
    mr.read(0, &mut got).unwrap();
    assert_eq!(&got, b"into a live ring");
    drop(qp); // now the CQ is destroyed too
}
