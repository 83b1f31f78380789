//! Smoke test: one inline write through the direct path on the software NIC.
use blueflame::*;

#[test]
fn inline_write_loopback() {
    let dev = Device::sim_stepped();
    let pd = dev.alloc_pd().unwrap();
    let mut cq = dev.create_cq(64).unwrap();
    let mut qp = pd.create_qp(&cq, &cq, QpCaps::default()).unwrap();
    let q = qp.endpoint().unwrap();
    qp.connect(&q).unwrap();
    let mr = pd
        .alloc_mr(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    qp.write_inline(
        b"hello, rdma",
        mr.remote(100).unwrap(),
        42,
        PostFlags::SIGNALED,
    )
    .unwrap();
    let mut out = [Completion::default(); 4];
    assert_eq!(cq.poll(&mut out), 0);
    assert_eq!(dev.process(), 1);
    assert_eq!(cq.poll(&mut out), 1);
    assert_eq!(out[0].cookie, 42);
    assert_eq!(out[0].status, WcStatus::Success);
    let mut b = [0u8; 11];
    mr.read(100, &mut b).unwrap();
    assert_eq!(&b, b"hello, rdma");
    let st = dev.nic().unwrap().qp_stats(q.qpn).unwrap();
    assert_eq!(
        (
            st.doorbells,
            st.bf_copies,
            st.bf_mismatches,
            st.doorbell_misses
        ),
        (1, 1, 0, 0)
    );
}
