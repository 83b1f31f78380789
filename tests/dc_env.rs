//! rdma-core's `MLX5_*` switches apply to DC QPs as to RC ones: `MLX5_SHUT_UP_BF` makes a
//! DCI ring 8-byte doorbells only, and `MLX5_SCATTER_TO_CQE=0` turns a DCT's responder
//! scatter-to-CQE off (`create_dct` keeps `MLX5_QP_FLAG_SCATTER_CQE` otherwise). A DCT
//! scatters into 128-byte CQEs only, 64 bytes at most (the kernel's
//! `configure_responder_scat_cqe`: `cs_res` SCAT_DATA64 for a 128-byte receive CQE, nothing
//! for a 64-byte one). Its own test binary, one test: the variables are process-wide.

use blueflame::*;

const ALL: Access = Access(
    Access::LOCAL_WRITE.0
        | Access::REMOTE_WRITE.0
        | Access::REMOTE_READ.0
        | Access::REMOTE_ATOMIC.0,
);

/// A DCI writes to and sends to a DCT whose CQ has `cqe_size`-byte entries; returns the DCI's
/// doorbell statistics and whether the send's bytes were in the receive buffer before the
/// poller ran (no scatter-to-CQE).
fn run(cqe_size: u32) -> (mlx5::sim::QpStats, bool) {
    let dev = Device::sim_stepped();
    let pd = dev.alloc_pd().unwrap();
    let mut tcq = dev
        .create_cq_with(&CqOptions::new(16).cqe_size(cqe_size))
        .unwrap();
    let mut srq = pd.create_srq(&tcq, SrqCaps::default()).unwrap();
    let dct = pd.create_dct(&tcq, &srq, 3, Access::REMOTE_WRITE).unwrap();
    let mr = pd.alloc_mr(4096, ALL).unwrap();
    srq.post_recv(&[mr.sge(1024, 64).unwrap()], 1).unwrap();
    let mut cq = dev.create_cq(16).unwrap();
    let mut dci = pd.create_dci(&cq, QpCaps::default()).unwrap();
    let peer = dct.peer().unwrap();
    dci.to(&peer)
        .write_inline(b"abcdefgh", mr.remote(0).unwrap(), 1, PostFlags::SIGNALED)
        .unwrap();
    // One pass per ring: the NIC checks the register against the last WQE of each pass.
    dev.process();
    dci.to(&peer)
        .send(Payload::Inline(b"small"), 2, PostFlags::SIGNALED)
        .unwrap();
    dev.process();
    let mut b = [0u8; 5];
    mr.read(1024, &mut b).unwrap();
    let in_memory = &b == b"small";
    let mut out = [Completion::default(); 4];
    assert_eq!(cq.poll(&mut out), 2);
    assert_eq!(tcq.poll(&mut out), 1);
    mr.read(1024, &mut b).unwrap();
    assert_eq!(
        &b, b"small",
        "after the poll, the bytes are there either way"
    );
    (dev.nic().unwrap().qp_stats(dci.qpn()).unwrap(), in_memory)
}

#[test]
fn rdma_core_switches_apply_to_dcis_and_dcts() {
    std::env::remove_var("MLX5_SHUT_UP_BF");
    std::env::remove_var("MLX5_SCATTER_TO_CQE");
    let (st, in_memory) = run(128);
    assert_eq!(
        (st.doorbells, st.bf_copies, st.db_writes),
        (2, 2, 0),
        "{st:?}"
    );
    assert!(!in_memory, "scatter-to-CQE: the send arrived in its CQE");
    let (_, in_memory) = run(64);
    assert!(
        in_memory,
        "a DCT does not scatter into 64-byte CQEs: the NIC wrote the receive buffer"
    );

    std::env::set_var("MLX5_SHUT_UP_BF", "1");
    std::env::set_var("MLX5_SCATTER_TO_CQE", "0");
    let (st, in_memory) = run(128);
    assert_eq!(
        (st.doorbells, st.bf_copies, st.db_writes),
        (2, 0, 2),
        "{st:?}"
    );
    assert_eq!(st.bf_violations, 0);
    assert!(
        in_memory,
        "no scatter-to-CQE: the NIC wrote the receive buffer"
    );
    std::env::remove_var("MLX5_SHUT_UP_BF");
    std::env::remove_var("MLX5_SCATTER_TO_CQE");
}
