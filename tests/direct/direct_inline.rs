//! Inline payloads of every size across DS and block boundaries, up to the QP's
//! `max_inline`, for writes, writes with immediate and sends; one byte more is refused
//! with nothing posted.

use crate::common;

use blueflame::*;
use common::*;

const SENTINEL: u8 = 0xe5;

/// Posts an inline write, write-with-immediate and send of every length `0..=max` and checks
/// the bytes, the completions and the blocks each WQE took.
fn every_size(caps: QpCaps, loopback: bool) {
    let max = caps.max_inline as usize;
    let mut s = Setup::new(loopback, caps, caps);
    let dst = s.mr(2 * max + 64, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let rbuf = s.mr(max + 64, Access::LOCAL_WRITE);
    let rq = s.resp_qpn();
    let q = s.a.qpn();
    let mut cookie = 0u64;
    for len in 0..=max {
        let data = pattern(len, len as u64);
        fill(&dst, SENTINEL);
        fill(&rbuf, SENTINEL);
        // Start at an odd offset so the bytes do not line up with anything.
        let off = 1 + (len % 7);

        // RDMA write: ctrl + raddr + inline.
        let free = free_send(&mut s.a);
        cookie += 1;
        s.a.write_inline(&data, dst.remote(off).unwrap(), cookie, PostFlags::SIGNALED)
            .unwrap();
        assert_eq!(
            free - free_send(&mut s.a),
            bbs(2 + inline_ds(len)),
            "write of {len} inline bytes"
        );
        let (c, _) = s.run_expect(1, 0);
        assert_ok(&c[0], cookie, WcOpcode::RdmaWrite, 0, q);
        assert_eq!(bytes(&dst, off, len), data, "write of {len} inline bytes");
        assert_eq!(bytes(&dst, 0, off), vec![SENTINEL; off]);
        assert_eq!(bytes(&dst, off + len, 16), vec![SENTINEL; 16], "len {len}");

        // RDMA write with immediate, to the second half.
        let off2 = max + 32;
        s.resp().post_recv(&[], cookie).unwrap();
        cookie += 1;
        s.a.write_imm(
            Payload::Inline(&data),
            dst.remote(off2).unwrap(),
            len as u32,
            cookie,
            PostFlags::SIGNALED,
        )
        .unwrap();
        let (c, r) = s.run_expect(1, 1);
        assert_ok(&c[0], cookie, WcOpcode::RdmaWrite, 0, q);
        assert_ok(&r[0], cookie - 1, WcOpcode::RecvRdmaWithImm, len as u32, rq);
        assert_eq!(r[0].imm, Some(len as u32));
        assert_eq!(
            bytes(&dst, off2, len),
            data,
            "write-imm of {len} inline bytes"
        );
        assert_eq!(bytes(&dst, off2 + len, 16), vec![SENTINEL; 16]);

        // Send: ctrl + inline (one DS less than a write: other block boundaries).
        s.resp()
            .post_recv(&[rbuf.sge(3, (max + 8) as u32).unwrap()], cookie)
            .unwrap();
        let free = free_send(&mut s.a);
        cookie += 1;
        s.a.send(Payload::Inline(&data), cookie, PostFlags::SIGNALED)
            .unwrap();
        assert_eq!(
            free - free_send(&mut s.a),
            bbs(1 + inline_ds(len)),
            "send of {len} inline bytes"
        );
        let (c, r) = s.run_expect(1, 1);
        assert_ok(&c[0], cookie, WcOpcode::Send, 0, q);
        assert_ok(&r[0], cookie - 1, WcOpcode::Recv, len as u32, rq);
        assert_eq!(bytes(&rbuf, 3, len), data, "send of {len} inline bytes");
        assert_eq!(bytes(&rbuf, 3 + len, 16), vec![SENTINEL; 16]);
        assert_eq!(bytes(&rbuf, 0, 3), vec![SENTINEL; 3]);
    }
    let st = nic(&s.dev).qp_stats(q).unwrap();
    assert_eq!(st.bf_mismatches, 0);
    assert_eq!(st.bf_violations, 0);
    assert_eq!(st.doorbell_misses, 0);
    assert_eq!(st.doorbells, 3 * (max as u64 + 1));

    // One byte over the limit: refused before anything is written or rung.
    let too_long = vec![1u8; max + 1];
    let free = free_send(&mut s.a);
    let wqes = nic(&s.dev).qp_stats(q).unwrap().wqes;
    let e =
        s.a.write_inline(&too_long, dst.remote(0).unwrap(), 1, PostFlags::SIGNALED)
            .unwrap_err();
    assert!(
        matches!(e, Error::InlineTooLong { len, max: m } if len == max + 1 && m == max),
        "{e:?}"
    );
    let e =
        s.a.send(Payload::Inline(&too_long), 2, PostFlags::SIGNALED)
            .unwrap_err();
    assert!(
        matches!(e, Error::InlineTooLong { len, .. } if len == max + 1),
        "{e:?}"
    );
    let e =
        s.a.write_imm(
            Payload::Inline(&too_long),
            dst.remote(0).unwrap(),
            0,
            3,
            PostFlags::SIGNALED,
        )
        .unwrap_err();
    assert!(matches!(e, Error::InlineTooLong { .. }), "{e:?}");
    assert_eq!(free_send(&mut s.a), free);
    assert_eq!(s.dev.process(), 0);
    assert_eq!(nic(&s.dev).qp_stats(q).unwrap().wqes, wqes);
    s.run_expect(0, 0);
    // The queue still works after the refusals.
    s.a.write_inline(b"ok", dst.remote(0).unwrap(), 77, PostFlags::SIGNALED)
        .unwrap();
    let (c, _) = s.run_expect(1, 0);
    assert_ok(&c[0], 77, WcOpcode::RdmaWrite, 0, q);
    assert_eq!(bytes(&dst, 0, 2), b"ok");
}

#[test]
fn every_size_up_to_default_max_loopback() {
    assert_eq!(QpCaps::default().max_inline, 256);
    every_size(QpCaps::default(), true);
}

#[test]
fn every_size_up_to_default_max_pair() {
    every_size(QpCaps::default(), false);
}

#[test]
fn every_size_up_to_512() {
    every_size(
        QpCaps {
            max_inline: 512,
            ..QpCaps::default()
        },
        false,
    );
}

#[test]
fn every_size_up_to_828_the_rc_limit() {
    // 828 inline bytes: 2 + 52 = 54 DS = 14 blocks, the largest RC WQE a ConnectX QP can
    // have (rdma-core sizes RC WQEs for a bind's 192 bytes of UMR beside the payload, in at
    // most 1024 bytes: `mlx5_calc_send_wqe`).
    every_size(
        QpCaps {
            max_inline: 828,
            bf_size: 1024,
            ..QpCaps::default()
        },
        true,
    );
}

#[test]
fn an_rc_qp_a_connectx_would_refuse_is_refused_with_its_field() {
    // rdma-core answers these with EINVAL; the software NIC, as every backend, names the
    // field and its value.
    for (caps, field, value) in [
        (
            QpCaps {
                max_inline: 829,
                ..QpCaps::default()
            },
            "max_inline",
            829,
        ),
        (
            QpCaps {
                max_send_sge: 53,
                ..QpCaps::default()
            },
            "max_send_sge",
            53,
        ),
        (
            QpCaps {
                max_recv_sge: 33,
                ..QpCaps::default()
            },
            "max_recv_sge",
            33,
        ),
    ] {
        let dev = Device::sim_stepped();
        let pd = dev.alloc_pd().unwrap();
        let cq = dev.create_cq(64).unwrap();
        match pd.create_qp(&cq, &cq, caps) {
            Err(e @ Error::InvalidParameter { what, value: v }) => {
                assert!(what.starts_with(field), "{e}");
                assert_eq!(v, value, "{e}");
            }
            other => panic!("{caps:?}: {other:?}"),
        }
    }
}

#[test]
fn every_size_on_a_small_ring_without_blueflame() {
    // 16 blocks: a WQE of up to 5 blocks lands anywhere, wrapping the ring end.
    every_size(
        QpCaps {
            sq_blocks: 16,
            bf_size: 0,
            ..QpCaps::default()
        },
        false,
    );
}

#[test]
fn largest_inline_on_smallest_ring() {
    // A 14-block WQE (RC's longest on a ConnectX: 828 inline bytes) on a 16-block ring:
    // after a one-block write and one such WQE there is no room for another until the ring
    // drains.
    let caps = QpCaps {
        sq_blocks: 16,
        max_inline: 828,
        ..QpCaps::default()
    };
    let mut s = Setup::pair(caps);
    let dst = s.mr(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let q = s.a.qpn();
    let big = pattern(828, 828);
    s.a.write_inline(b"a", dst.remote(0).unwrap(), 1, PostFlags::SIGNALED)
        .unwrap();
    s.a.write_inline(&big, dst.remote(100).unwrap(), 2, PostFlags::SIGNALED)
        .unwrap();
    let e =
        s.a.write_inline(&big, dst.remote(100).unwrap(), 3, PostFlags::SIGNALED)
            .unwrap_err();
    assert!(
        matches!(
            e,
            Error::QueueFull {
                needed: 14,
                free: 1,
                ..
            }
        ),
        "{e:?}"
    );
    let (c, _) = s.run_expect(2, 0);
    assert_ok(&c[0], 1, WcOpcode::RdmaWrite, 0, q);
    assert_ok(&c[1], 2, WcOpcode::RdmaWrite, 0, q);
    for k in 0..8u64 {
        s.a.write_inline(&big, dst.remote(100).unwrap(), 10 + k, PostFlags::SIGNALED)
            .unwrap();
        assert_eq!(free_send(&mut s.a), 2);
        let (c, _) = s.run_expect(1, 0);
        assert_ok(&c[0], 10 + k, WcOpcode::RdmaWrite, 0, q);
        assert_eq!(bytes(&dst, 100, 828), big);
        assert_eq!(free_send(&mut s.a), 16);
    }
}
