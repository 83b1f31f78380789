//! Scatter-to-CQE end to end on the software NIC with its default (rdma-core's) settings: a
//! received send small enough for the CQE (32 bytes with 64-byte CQEs, 64 with 128-byte
//! ones) arrives inside it and the NIC leaves the receive buffers alone, as a ConnectX does;
//! the direct-path poller must copy it into the receive's scatter list.

use crate::common;

use blueflame::*;
use common::*;

/// A pair whose CQs have entries of `cqe_size` bytes.
fn pair(cqe_size: u32, caps: QpCaps) -> Setup {
    let dev = Device::sim_stepped();
    let pd = dev.alloc_pd().unwrap();
    let cq_a = dev
        .create_cq_with(&CqOptions::new(256).cqe_size(cqe_size))
        .unwrap();
    let cq_b = dev
        .create_cq_with(&CqOptions::new(256).cqe_size(cqe_size))
        .unwrap();
    let mut a = pd.create_qp(&cq_a, &cq_a, caps).unwrap();
    let mut b = pd.create_qp(&cq_b, &cq_b, caps).unwrap();
    a.connect(&b.endpoint().unwrap()).unwrap();
    b.connect(&a.endpoint().unwrap()).unwrap();
    Setup {
        dev,
        pd,
        cq_a,
        cq_b: Some(cq_b),
        a,
        b: Some(b),
    }
}

/// Sends `len` pattern bytes (inline or gathered) into a receive of three entries (7 bytes,
/// an empty one, 100 bytes) and checks the completion and every byte of both buffers.
fn send_into_split_receive(s: &mut Setup, len: usize, inline: bool, seed: u64) {
    let src = s.mr(4096, ALL);
    let dst = s.mr(4096, ALL);
    fill(&dst, 0xa5);
    let data = pattern(len, seed);
    src.write(0, &data).unwrap();
    let list = [
        dst.sge(10, 7).unwrap(),
        dst.sge(50, 0).unwrap(),
        dst.sge(1000, 100).unwrap(),
    ];
    let qpn = s.resp_qpn();
    s.resp().post_recv(&list, 500 + seed).unwrap();
    let payload = if inline {
        Payload::Inline(&data)
    } else {
        Payload::Sgl(&[src.sge(0, len as u32).unwrap()])
    };
    s.a.send(payload, 7, PostFlags::SIGNALED).unwrap();
    let (sends, recvs) = s.run_expect(1, 1);
    assert_ok(&sends[0], 7, WcOpcode::Send, 0, s.a.qpn());
    assert_ok(&recvs[0], 500 + seed, WcOpcode::Recv, len as u32, qpn);
    let first = len.min(7);
    let mut want_a = vec![0xa5; 7];
    want_a[..first].copy_from_slice(&data[..first]);
    let mut want_b = vec![0xa5; 100];
    want_b[..len - first].copy_from_slice(&data[first..]);
    assert_eq!(bytes(&dst, 10, 7), want_a, "first entry, {len} bytes");
    assert_eq!(bytes(&dst, 1000, 100), want_b, "third entry, {len} bytes");
    // Nothing else written: the bytes around the entries keep their fill.
    assert!(bytes(&dst, 0, 10).iter().all(|&b| b == 0xa5));
    assert!(bytes(&dst, 17, 983).iter().all(|&b| b == 0xa5));
    assert!(bytes(&dst, 1100, 2996).iter().all(|&b| b == 0xa5));
}

#[test]
fn small_sends_reach_the_receive_buffers_with_64_byte_cqes() {
    let mut s = pair(64, QpCaps::default());
    for (i, len) in [0, 1, 6, 7, 8, 16, 31, 32, 33, 64, 100]
        .into_iter()
        .enumerate()
    {
        send_into_split_receive(&mut s, len, i % 2 == 0, i as u64);
        send_into_split_receive(&mut s, len, i % 2 == 1, 100 + i as u64);
    }
}

#[test]
fn sends_up_to_64_bytes_reach_the_receive_buffers_with_128_byte_cqes() {
    let mut s = pair(128, QpCaps::default());
    for (i, len) in [0, 1, 31, 32, 33, 48, 63, 64, 65, 107]
        .into_iter()
        .enumerate()
    {
        send_into_split_receive(&mut s, len, i % 2 == 0, i as u64);
        send_into_split_receive(&mut s, len, i % 2 == 1, 100 + i as u64);
    }
}

#[test]
fn many_small_receives_wrap_the_rings() {
    // More receives than the receive ring and the CQ hold: the scatter lists kept per entry
    // must follow the ring around.
    let caps = QpCaps {
        rq_entries: 16,
        ..QpCaps::default()
    };
    let mut s = pair(64, caps);
    let dst = s.mr(4096, ALL);
    for round in 0..40u64 {
        let off = (round as usize % 8) * 64;
        s.resp()
            .post_recv(&[dst.sge(off, 32).unwrap()], round)
            .unwrap();
        let data = pattern(1 + round as usize % 32, round);
        s.a.send(Payload::Inline(&data), 1000 + round, PostFlags::SIGNALED)
            .unwrap();
        let (_, recvs) = s.run_expect(1, 1);
        assert_eq!(
            (recvs[0].cookie, recvs[0].status),
            (round, WcStatus::Success)
        );
        assert_eq!(recvs[0].byte_len as usize, data.len());
        assert_eq!(bytes(&dst, off, data.len()), data, "round {round}");
    }
}

#[test]
fn send_with_immediate_and_with_invalidate_land_too() {
    let mut s = pair(64, QpCaps::default());
    let dst = s.mr(4096, ALL);
    s.resp().post_recv(&[dst.sge(0, 64).unwrap()], 1).unwrap();
    s.a.post(
        &Request::SendImm {
            data: Payload::Inline(b"immediate!"),
            imm: 0x0a0b_0c0d,
        },
        2,
        PostFlags::SIGNALED,
    )
    .unwrap();
    let (_, r) = s.run_expect(1, 1);
    assert_ok(&{ r[0] }, 1, WcOpcode::Recv, 10, s.resp_qpn());
    assert_eq!(r[0].imm, Some(0x0a0b_0c0d));
    assert_eq!(bytes(&dst, 0, 10), b"immediate!");

    // A send with invalidate of a type-2 window bound by the responder.
    let target =
        s.pd.alloc_mr(4096, Access(ALL.0 | Access::MW_BIND.0))
            .unwrap();
    let mut mw = s.pd.alloc_mw(MwType::Two).unwrap();
    let rkey = s
        .resp()
        .bind_mw(
            &mut mw,
            &target,
            0,
            64,
            Access::REMOTE_WRITE,
            3,
            PostFlags::SIGNALED,
        )
        .unwrap();
    let (bound, _) = s.run_expect(1, 0);
    assert_eq!((bound[0].cookie, bound[0].status), (3, WcStatus::Success));
    s.resp().post_recv(&[dst.sge(100, 64).unwrap()], 4).unwrap();
    s.a.post(
        &Request::SendInv {
            data: Payload::Inline(b"and invalidate"),
            rkey,
        },
        5,
        PostFlags::SIGNALED,
    )
    .unwrap();
    let (_, r) = s.run_expect(1, 1);
    let r = &r[0];
    assert_eq!(
        (r.status, r.opcode, r.byte_len, r.imm),
        (WcStatus::Success, WcOpcode::RecvWithInv, 14, Some(rkey))
    );
    assert_eq!(bytes(&dst, 100, 14), b"and invalidate");
}

#[test]
fn a_send_longer_than_the_receive_fails_and_writes_nothing() {
    // The NIC still checks the length against the receive (the InfiniBand responder NAKs
    // it), even when the data would fit in the CQE.
    let mut s = pair(64, QpCaps::default());
    let dst = s.mr(4096, ALL);
    fill(&dst, 0x5a);
    s.resp()
        .post_recv(&[dst.sge(0, 4).unwrap(), dst.sge(8, 4).unwrap()], 9)
        .unwrap();
    s.a.send(Payload::Inline(&pattern(9, 1)), 10, PostFlags::SIGNALED)
        .unwrap();
    let (sends, recvs) = s.run_expect(1, 1);
    assert_eq!(
        (sends[0].cookie, sends[0].status),
        (10, WcStatus::RemInvReqErr)
    );
    assert_eq!((recvs[0].cookie, recvs[0].status), (9, WcStatus::LocLenErr));
    assert!(bytes(&dst, 0, 64).iter().all(|&b| b == 0x5a));
}

#[test]
fn a_receive_outside_its_region_is_never_written_by_the_poller() {
    // The NIC does not look at the receive's keys when the data go into the CQE; the poller
    // writes with the CPU, so it copies only into entries checked against the registered
    // regions when posted. This one ends past its region: a local protection error, as the
    // NIC reports when it writes the buffers itself, and no byte written.
    let mut s = pair(64, QpCaps::default());
    let dst = s.mr(64, ALL);
    let spare = s.mr(4096, ALL);
    fill(&dst, 0x11);
    let past = Sge {
        addr: dst.addr() + 32,
        len: 64,
        lkey: dst.lkey(),
    };
    s.resp().post_recv(&[past], 21).unwrap();
    // A key of no region, and a region without local write.
    let ro = s.mr(64, Access::REMOTE_READ);
    let bogus = Sge {
        addr: spare.addr(),
        len: 64,
        lkey: 0xdead_0000,
    };
    s.resp().post_recv(&[bogus], 22).unwrap();
    s.resp().post_recv(&[ro.sge(0, 64).unwrap()], 23).unwrap();
    for i in 0..3 {
        s.a.send(Payload::Inline(&[0xee; 16]), 30 + i, PostFlags::SIGNALED)
            .unwrap();
    }
    let (_, recvs) = s.run_expect(3, 3);
    for (r, cookie) in recvs.iter().zip(21..) {
        assert_eq!(
            (r.cookie, r.status),
            (cookie, WcStatus::LocProtErr),
            "{r:?}"
        );
    }
    assert!(bytes(&dst, 0, 64).iter().all(|&b| b == 0x11));
    assert!(bytes(&spare, 0, 64).iter().all(|&b| b == 0));
    assert!(bytes(&ro, 0, 64).iter().all(|&b| b == 0));
}

#[test]
fn without_scatter_to_cqe_the_nic_writes_the_buffers() {
    // The per-QP switch (MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE on a ConnectX).
    let caps = QpCaps {
        scatter_to_cqe: false,
        ..QpCaps::default()
    };
    let mut s = pair(64, caps);
    for (i, len) in [0, 1, 32, 33].into_iter().enumerate() {
        send_into_split_receive(&mut s, len, i % 2 == 0, i as u64);
    }
}

/// Posts a receive, sends `len` bytes, runs the NIC; returns whether the NIC itself wrote
/// the buffer, and checks that the data are there once the completion was polled.
fn nic_wrote_the_buffer(s: &mut Setup, len: usize) -> bool {
    let dst = s.mr(256, ALL);
    let data = pattern(len, 77);
    s.resp().post_recv(&[dst.sge(0, 128).unwrap()], 1).unwrap();
    s.a.send(Payload::Inline(&data), 2, PostFlags::SIGNALED)
        .unwrap();
    s.dev.process();
    let wrote = bytes(&dst, 0, len) == data;
    let (_, r) = s.run_expect(1, 1);
    assert_eq!(
        (r[0].status, r[0].byte_len as usize),
        (WcStatus::Success, len)
    );
    assert_eq!(bytes(&dst, 0, len), data);
    wrote
}

#[test]
fn the_nic_delivers_small_sends_inside_the_cqe_by_default() {
    // As a ConnectX with rdma-core's defaults: up to 32 bytes with 64-byte CQEs, up to 64
    // with 128-byte CQEs, stay in the CQE until the poller copies them.
    let mut s = pair(64, QpCaps::default());
    assert!(!nic_wrote_the_buffer(&mut s, 1));
    assert!(!nic_wrote_the_buffer(&mut s, 32));
    assert!(nic_wrote_the_buffer(&mut s, 33));
    let mut s = pair(128, QpCaps::default());
    assert!(!nic_wrote_the_buffer(&mut s, 33));
    assert!(!nic_wrote_the_buffer(&mut s, 64));
    assert!(nic_wrote_the_buffer(&mut s, 65));
    // The per-QP switch turns it off.
    let off = QpCaps {
        scatter_to_cqe: false,
        ..QpCaps::default()
    };
    let mut s = pair(128, off);
    assert!(nic_wrote_the_buffer(&mut s, 1));
}

/// A message that came inside the CQE (format INLINE_SCATTER_32: its bytes fill the CQE's
/// first 32, where `flags_rqpn` lies at 24..28) is not read back as its sender: an RC
/// receive reports no source QP and no GRH (`Completion::src_qp`: "0 otherwise"; `grh`
/// says the receive buffer starts with a GRH). The poller read `flags_rqpn` whatever the
/// format, so the payload's bytes 24..28 became `src_qp` and the GRH bit.
#[test]
fn a_message_inside_the_cqe_is_not_read_as_its_sender() {
    let mut s = pair(64, QpCaps::default());
    let dst = s.mr(4096, ALL);
    s.resp().post_recv(&[dst.sge(0, 64).unwrap()], 1).unwrap();
    s.a.send(Payload::Inline(&[0xff; 32]), 7, PostFlags::SIGNALED)
        .unwrap();
    let (_, recvs) = s.run_expect(1, 1);
    assert_eq!(bytes(&dst, 0, 32), [0xff; 32]);
    assert_eq!(
        (recvs[0].src_qp, recvs[0].grh),
        (0, false),
        "payload bytes read as flags_rqpn: {:?}",
        recvs[0]
    );
}
