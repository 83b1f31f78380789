//! Post flags: every fence mode and the solicited bit are accepted by the NIC on every
//! opcode, and change nothing of what is moved or reported.

use crate::common;

use blueflame::*;
use common::*;

#[test]
fn every_fence_mode_and_solicited_on_every_opcode() {
    let mut s = Setup::pair(QpCaps::default());
    let m = s.mr(8192, ALL);
    let q = s.a.qpn();
    let rq = s.resp_qpn();
    let mut cookie = 0u64;
    for fence in Fence::ALL {
        for solicited in [false, true] {
            let mut flags = PostFlags::SIGNALED.fence(fence);
            if solicited {
                flags = flags.solicited();
            }
            assert_eq!(flags.fence, fence);
            assert_eq!(flags.solicited, solicited);
            let data = pattern(32, cookie);
            s.resp()
                .post_recv(&[m.sge(6000, 64).unwrap()], cookie)
                .unwrap();
            s.resp().post_recv(&[], cookie + 1).unwrap();
            m.write(7000, &9u64.to_ne_bytes()).unwrap();
            let base = cookie;
            s.a.write_inline(&data, m.remote(0).unwrap(), base, flags)
                .unwrap();
            s.a.read(
                &[m.sge(100, 32).unwrap()],
                m.remote(0).unwrap(),
                base + 1,
                flags,
            )
            .unwrap();
            s.a.send(Payload::Inline(&data), base + 2, flags).unwrap();
            s.a.write_imm(
                Payload::Inline(&data[..4]),
                m.remote(200).unwrap(),
                77,
                base + 3,
                flags,
            )
            .unwrap();
            s.a.compare_swap(
                m.remote(7000).unwrap(),
                9,
                10,
                m.sge(7008, 8).unwrap(),
                base + 4,
                flags,
            )
            .unwrap();
            s.a.post(&Request::Nop, base + 5, flags).unwrap();
            cookie += 6;
            let (c, r) = s.run_expect(6, 2);
            let ops = [
                (WcOpcode::RdmaWrite, 0),
                (WcOpcode::RdmaRead, 32),
                (WcOpcode::Send, 0),
                (WcOpcode::RdmaWrite, 0),
                (WcOpcode::CompSwap, 8),
                (WcOpcode::Nop, 0),
            ];
            for (k, (c, (op, len))) in c.iter().zip(ops).enumerate() {
                assert_ok(c, base + k as u64, op, len, q);
            }
            assert_ok(&r[0], base, WcOpcode::Recv, 32, rq);
            assert_ok(&r[1], base + 1, WcOpcode::RecvRdmaWithImm, 4, rq);
            assert_eq!(r[1].imm, Some(77));
            assert_eq!(bytes(&m, 0, 32), data);
            assert_eq!(bytes(&m, 100, 32), data);
            assert_eq!(bytes(&m, 6000, 32), data);
            assert_eq!(bytes(&m, 200, 4), &data[..4]);
            assert_eq!(m.read_u64(7000).unwrap(), 10);
            assert_eq!(m.read_u64(7008).unwrap(), 9);
        }
    }
    let st = nic(&s.dev).qp_stats(q).unwrap();
    assert_eq!(st.wqes, cookie);
    assert_eq!((st.bf_mismatches, st.bf_violations), (0, 0));
}

#[test]
fn default_flags_are_signaled() {
    assert_eq!(PostFlags::default(), PostFlags::SIGNALED);
    assert_ne!(PostFlags::SIGNALED, PostFlags::UNSIGNALED);
    let mut s = Setup::loopback(QpCaps::default());
    s.a.post(&Request::Nop, 5, PostFlags::default()).unwrap();
    let (c, _) = s.run_expect(1, 0);
    assert_ok(&c[0], 5, WcOpcode::Nop, 0, s.a.qpn());
}
