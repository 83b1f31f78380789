//! rdma-core's `MLX5_SHUT_UP_BF`: set, the driver never BlueFlame-copies (rdma-core maps the
//! register uncached), and the direct path rings only 8-byte doorbells, on the software NIC
//! as on mlx5; `MLX5_POST_SEND_PREFER_BF=0`: copies only for WQEs with inline data. Its own
//! test binary, one test: the variables are process-wide.

mod common;

use blueflame::*;
use common::*;

#[test]
fn shut_up_bf_rings_only_doorbells() {
    std::env::set_var("MLX5_SHUT_UP_BF", "1");
    let mut s = Setup::pair(QpCaps::default());
    let dst = s.mr(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let q = s.a.qpn();
    assert_eq!(s.a.doorbell_mode(), Some(DoorbellMode::DoorbellOnly));
    for i in 0..20u64 {
        let msg = pattern(8 + i as usize * 10, i);
        s.a.write_inline(&msg, dst.remote(0).unwrap(), i, PostFlags::SIGNALED)
            .unwrap();
        let (c, _) = s.run_expect(1, 0);
        assert_ok(&c[0], i, WcOpcode::RdmaWrite, 0, q);
        assert_eq!(bytes(&dst, 0, msg.len()), msg);
    }
    let st = nic(&s.dev).qp_stats(q).unwrap();
    assert_eq!(
        (st.doorbells, st.db_writes, st.bf_copies, st.bf_violations),
        (20, 20, 0, 0),
        "{st:?}"
    );
    // "0" is rdma-core's way to say no.
    std::env::set_var("MLX5_SHUT_UP_BF", "0");
    let s = Setup::pair(QpCaps::default());
    assert_eq!(s.a.doorbell_mode(), Some(DoorbellMode::Dedicated));

    // MLX5_POST_SEND_PREFER_BF=0 (same test: the variables are process-wide): rdma-core
    // copies only WQEs with inline data (`inl || prefer_bf`); so does the direct path.
    for prefer in ["0", "1"] {
        std::env::set_var("MLX5_POST_SEND_PREFER_BF", prefer);
        let mut s = Setup::pair(QpCaps::default());
        let dst = s.mr(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
        let src = s.mr(4096, Access::LOCAL_WRITE);
        let buf = s.mr(64, Access::LOCAL_WRITE);
        let q = s.a.qpn();
        let msg = pattern(40, 1);
        s.a.write_inline(&msg, dst.remote(0).unwrap(), 1, PostFlags::SIGNALED)
            .unwrap();
        s.run_expect(1, 0);
        let sgl = [src.sge(0, 100).unwrap()];
        s.a.write(&sgl, dst.remote(100).unwrap(), 2, PostFlags::SIGNALED)
            .unwrap();
        s.run_expect(1, 0);
        s.resp().post_recv(&[buf.sge(0, 64).unwrap()], 3).unwrap();
        s.a.send(Payload::Inline(&msg[..8]), 4, PostFlags::SIGNALED)
            .unwrap();
        s.run_expect(1, 1);
        let st = nic(&s.dev).qp_stats(q).unwrap();
        let want = if prefer == "0" { (2, 1) } else { (3, 0) };
        assert_eq!(
            (st.bf_copies, st.db_writes, st.bf_violations),
            (want.0, want.1, 0),
            "MLX5_POST_SEND_PREFER_BF={prefer}: {st:?}"
        );
    }
}
