//! Safe code cannot reach freed or unregistered memory, nor a data race (issue 12, "undefined
//! behaviour reachable from safe code"): key and number allocation on the software NIC,
//! region bytes shared with the NIC, and registrations whose deregistration must wait.

use blueflame::*;

const RIGHTS: Access = Access(1 | 2 | 4 | 16);

fn loopback(dev: &Device, pd: &Pd) -> (Cq, Qp) {
    let cq = dev.create_cq(64).unwrap();
    let mut qp = pd.create_qp(&cq, &cq, QpCaps::default()).unwrap();
    let me = qp.qpn();
    qp.connect(me).unwrap();
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

/// 2^24 windows allocated and dropped: the key index space wraps. A new region must never
/// get the key index of a live one (the old NIC overwrote the live region's table entry and
/// freed its buffer).
#[test]
fn key_indices_that_wrap_never_name_a_live_region() {
    let dev = Device::sim_stepped();
    let pd = dev.alloc_pd().unwrap();
    let (mut cq, mut qp) = loopback(&dev, &pd);
    let first = pd.alloc_mr(4096, RIGHTS).unwrap();
    let src = pd.alloc_mr(4096, RIGHTS).unwrap();
    src.write(0, b"sixteen bytes!!!").unwrap();
    let live = [first.lkey() >> 8, src.lkey() >> 8];
    for i in 0..(1u32 << 24) {
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
    nic.connect(q, q).unwrap();
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
