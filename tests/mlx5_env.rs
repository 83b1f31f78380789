//! rdma-core's `MLX5_SHUT_UP_BF`: set, the driver never BlueFlame-copies (rdma-core maps the
//! register uncached), and the direct path rings only 8-byte doorbells, on the software NIC
//! as on mlx5. Its own test binary: the variable is process-wide.

mod common;

use blueflame::*;
use common::*;

#[test]
fn shut_up_bf_rings_only_doorbells() {
    std::env::set_var("MLX5_SHUT_UP_BF", "1");
    let mut s = Setup::pair(QpCaps::default());
    let dst = s.mr(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let q = s.a.qpn();
    assert_eq!(s.a.direct_sq().unwrap().bf_size(), 0);
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
    let mut s = Setup::pair(QpCaps::default());
    assert_eq!(s.a.direct_sq().unwrap().bf_size(), 256);
}
