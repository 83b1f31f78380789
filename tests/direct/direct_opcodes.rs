//! Every opcode end to end on the stepped software NIC, on a loopback QP and on two
//! connected QPs: bytes moved, cookies, opcodes, byte counts, immediates and QPNs.

use crate::common;

use blueflame::*;
use common::*;

/// Runs a scenario once on a loopback QP and once on a connected pair.
macro_rules! both {
    ($scenario:ident: $lb:ident, $pair:ident) => {
        #[test]
        fn $lb() {
            $scenario(Setup::loopback(QpCaps::default()));
        }
        #[test]
        fn $pair() {
            $scenario(Setup::pair(QpCaps::default()));
        }
    };
}

both!(write_sgl: write_sgl_loopback, write_sgl_pair);
both!(write_inline: write_inline_loopback, write_inline_pair);
both!(write_imm: write_imm_loopback, write_imm_pair);
both!(write_imm_zero_length: write_imm_zero_length_loopback, write_imm_zero_length_pair);
both!(read_scatter: read_scatter_loopback, read_scatter_pair);
both!(send_recv: send_recv_loopback, send_recv_pair);
both!(compare_swap: compare_swap_loopback, compare_swap_pair);
both!(fetch_add: fetch_add_loopback, fetch_add_pair);
both!(masked_atomics: masked_atomics_loopback, masked_atomics_pair);
both!(nop: nop_loopback, nop_pair);
both!(mixed_batch: mixed_batch_loopback, mixed_batch_pair);

fn write_sgl(mut s: Setup) {
    let src = s.mr(4096, Access::LOCAL_WRITE);
    let data = pattern(4096, 1);
    src.write(0, &data).unwrap();
    let dst = s.mr(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    fill(&dst, 0xee);
    let sgl = [
        src.sge(0, 10).unwrap(),
        src.sge(100, 1).unwrap(),
        src.sge(1000, 300).unwrap(),
        src.sge(2000, 0).unwrap(), // zero-length entries are skipped
        src.sge(3000, 77).unwrap(),
    ];
    let mut want = Vec::new();
    for (off, len) in [(0, 10), (100, 1), (1000, 300), (3000, 77)] {
        want.extend_from_slice(&data[off..off + len]);
    }
    assert_eq!(want.len(), 388);
    let free = free_send(&mut s.a);
    s.a.write(&sgl, dst.remote(50).unwrap(), 0xabc, PostFlags::SIGNALED)
        .unwrap();
    // ctrl + raddr + 4 data segments = 6 DS = 2 blocks.
    assert_eq!(free_send(&mut s.a), free - 2);
    let (c, r) = s.run_expect(1, 0);
    assert!(r.is_empty());
    assert_ok(&c[0], 0xabc, WcOpcode::RdmaWrite, 0, s.a.qpn());
    assert_eq!(c[0].imm, None);
    assert_eq!(bytes(&dst, 50, 388), want);
    assert_eq!(bytes(&dst, 0, 50), vec![0xee; 50]);
    assert_eq!(bytes(&dst, 438, 4096 - 438), vec![0xee; 4096 - 438]);
    assert_eq!(free_send(&mut s.a), free);
    let st = nic(&s.dev).qp_stats(s.a.qpn()).unwrap();
    assert_eq!(st.wqes, 1);
}

fn write_inline(mut s: Setup) {
    let dst = s.mr(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let data = pattern(100, 2);
    s.a.write_inline(
        &data,
        dst.remote(4096 - 100).unwrap(),
        7,
        PostFlags::SIGNALED,
    )
    .unwrap();
    s.a.write_inline(b"x", dst.remote(0).unwrap(), 8, PostFlags::SIGNALED)
        .unwrap();
    let (c, _) = s.run_expect(2, 0);
    assert_ok(&c[0], 7, WcOpcode::RdmaWrite, 0, s.a.qpn());
    assert_ok(&c[1], 8, WcOpcode::RdmaWrite, 0, s.a.qpn());
    assert_eq!(bytes(&dst, 4096 - 100, 100), data);
    assert_eq!(bytes(&dst, 0, 2), b"x\0");
}

fn write_imm(mut s: Setup) {
    let src = s.mr(1024, Access::LOCAL_WRITE);
    let data = pattern(1024, 3);
    src.write(0, &data).unwrap();
    let dst = s.mr(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let rbuf = s.mr(256, Access::LOCAL_WRITE);
    fill(&rbuf, 0x5a);
    let rq = s.resp_qpn();
    s.resp()
        .post_recv(&[rbuf.sge(0, 256).unwrap()], 500)
        .unwrap();
    s.resp()
        .post_recv(&[rbuf.sge(0, 256).unwrap()], 501)
        .unwrap();
    let sgl = [src.sge(10, 20).unwrap(), src.sge(500, 30).unwrap()];
    s.a.write_imm(
        Payload::Sgl(&sgl),
        dst.remote(8).unwrap(),
        0xdead_beef,
        1,
        PostFlags::SIGNALED,
    )
    .unwrap();
    let inl = pattern(33, 4);
    s.a.write_imm(
        Payload::Inline(&inl),
        dst.remote(1000).unwrap(),
        0x0102_0304,
        2,
        PostFlags::SIGNALED,
    )
    .unwrap();
    let (c, r) = s.run_expect(2, 2);
    assert_ok(&c[0], 1, WcOpcode::RdmaWrite, 0, s.a.qpn());
    assert_ok(&c[1], 2, WcOpcode::RdmaWrite, 0, s.a.qpn());
    assert_eq!(c[0].imm, None);
    // The receiver sees the immediate and the bytes written, in its receive completion.
    assert_ok(&r[0], 500, WcOpcode::RecvRdmaWithImm, 50, rq);
    assert_eq!(r[0].imm, Some(0xdead_beef));
    assert_ok(&r[1], 501, WcOpcode::RecvRdmaWithImm, 33, rq);
    assert_eq!(r[1].imm, Some(0x0102_0304));
    let mut want = data[10..30].to_vec();
    want.extend_from_slice(&data[500..530]);
    assert_eq!(bytes(&dst, 8, 50), want);
    assert_eq!(bytes(&dst, 1000, 33), inl);
    // The receive buffer itself is not touched by a write with immediate.
    assert_eq!(bytes(&rbuf, 0, 256), vec![0x5a; 256]);
    assert_eq!(free_recv(s.resp()), 256);
}

fn write_imm_zero_length(mut s: Setup) {
    let dst = s.mr(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    fill(&dst, 0x11);
    let rq = s.resp_qpn();
    for k in 0..3 {
        s.resp().post_recv(&[], 900 + k).unwrap();
    }
    s.a.write_imm(
        Payload::Inline(&[]),
        dst.remote(0).unwrap(),
        0,
        10,
        PostFlags::SIGNALED,
    )
    .unwrap();
    s.a.write_imm(
        Payload::Sgl(&[]),
        dst.remote(0).unwrap(),
        u32::MAX,
        11,
        PostFlags::SIGNALED,
    )
    .unwrap();
    // A zero-length write needs no valid remote key.
    s.a.write_imm(
        Payload::Inline(&[]),
        Remote { addr: 0, rkey: 0 },
        77,
        12,
        PostFlags::SIGNALED,
    )
    .unwrap();
    let (c, r) = s.run_expect(3, 3);
    for (i, (c, r)) in c.iter().zip(&r).enumerate() {
        assert_ok(c, 10 + i as u64, WcOpcode::RdmaWrite, 0, s.a.qpn());
        assert_ok(r, 900 + i as u64, WcOpcode::RecvRdmaWithImm, 0, rq);
    }
    assert_eq!(r[0].imm, Some(0));
    assert_eq!(r[1].imm, Some(u32::MAX));
    assert_eq!(r[2].imm, Some(77));
    assert_eq!(bytes(&dst, 0, 64), vec![0x11; 64]);
}

fn read_scatter(mut s: Setup) {
    let src = s.mr(4096, Access::LOCAL_WRITE | Access::REMOTE_READ);
    let data = pattern(4096, 5);
    src.write(0, &data).unwrap();
    let dst = s.mr(4096, Access::LOCAL_WRITE);
    fill(&dst, 0xcc);
    let sgl = [
        dst.sge(0, 5).unwrap(),
        dst.sge(64, 64).unwrap(),
        dst.sge(1000, 131).unwrap(),
    ];
    let free = free_send(&mut s.a);
    s.a.read(&sgl, src.remote(300).unwrap(), 0x77, PostFlags::SIGNALED)
        .unwrap();
    assert_eq!(free_send(&mut s.a), free - 2); // 2 + 3 DS
    let (c, _) = s.run_expect(1, 0);
    assert_ok(&c[0], 0x77, WcOpcode::RdmaRead, 200, s.a.qpn());
    assert_eq!(bytes(&dst, 0, 5), &data[300..305]);
    assert_eq!(bytes(&dst, 64, 64), &data[305..369]);
    assert_eq!(bytes(&dst, 1000, 131), &data[369..500]);
    assert_eq!(bytes(&dst, 5, 59), vec![0xcc; 59]);
    assert_eq!(bytes(&dst, 128, 1000 - 128), vec![0xcc; 872]);
    assert_eq!(bytes(&dst, 1131, 4096 - 1131), vec![0xcc; 4096 - 1131]);
    // The source is unchanged.
    assert_eq!(bytes(&src, 0, 4096), data);
    // A one-byte read reports one byte.
    s.a.read(
        &[dst.sge(4095, 1).unwrap()],
        src.remote(4095).unwrap(),
        0x78,
        PostFlags::SIGNALED,
    )
    .unwrap();
    let (c, _) = s.run_expect(1, 0);
    assert_ok(&c[0], 0x78, WcOpcode::RdmaRead, 1, s.a.qpn());
    assert_eq!(bytes(&dst, 4095, 1), [data[4095]]);
}

fn send_recv(mut s: Setup) {
    let src = s.mr(1024, Access::LOCAL_WRITE);
    let data = pattern(1024, 6);
    src.write(0, &data).unwrap();
    let rbuf = s.mr(4096, Access::LOCAL_WRITE);
    fill(&rbuf, 0xaa);
    let rq = s.resp_qpn();
    // Receive 1 scatters over two buffers; receive 2 is one buffer; receive 3 is for an
    // empty send.
    s.resp()
        .post_recv(&[rbuf.sge(0, 16).unwrap(), rbuf.sge(100, 100).unwrap()], 11)
        .unwrap();
    s.resp()
        .post_recv(&[rbuf.sge(1000, 64).unwrap()], 12)
        .unwrap();
    s.resp()
        .post_recv(&[rbuf.sge(2000, 64).unwrap()], 13)
        .unwrap();
    s.resp()
        .post_recv(&[rbuf.sge(3000, 64).unwrap()], 14)
        .unwrap();
    let sgl = [src.sge(0, 20).unwrap(), src.sge(200, 30).unwrap()];
    s.a.send(Payload::Sgl(&sgl), 1, PostFlags::SIGNALED)
        .unwrap();
    let inl = pattern(20, 7);
    s.a.post(
        &Request::SendImm {
            data: Payload::Inline(&inl),
            imm: 0x1234_5678,
        },
        2,
        PostFlags::SIGNALED,
    )
    .unwrap();
    s.a.send(Payload::Inline(&[]), 3, PostFlags::SIGNALED)
        .unwrap();
    s.a.post(
        &Request::SendImm {
            data: Payload::Sgl(&[src.sge(512, 64).unwrap()]),
            imm: 9,
        },
        4,
        PostFlags::SIGNALED,
    )
    .unwrap();
    let (c, r) = s.run_expect(4, 4);
    for (i, c) in c.iter().enumerate() {
        assert_ok(c, 1 + i as u64, WcOpcode::Send, 0, s.a.qpn());
        assert_eq!(c.imm, None);
    }
    assert_ok(&r[0], 11, WcOpcode::Recv, 50, rq);
    assert_eq!(r[0].imm, None);
    assert_ok(&r[1], 12, WcOpcode::Recv, 20, rq);
    assert_eq!(r[1].imm, Some(0x1234_5678));
    assert_ok(&r[2], 13, WcOpcode::Recv, 0, rq);
    assert_eq!(r[2].imm, None);
    assert_ok(&r[3], 14, WcOpcode::Recv, 64, rq);
    assert_eq!(r[3].imm, Some(9));
    // 50 bytes: 16 into the first buffer, 34 into the second.
    let mut msg = data[0..20].to_vec();
    msg.extend_from_slice(&data[200..230]);
    assert_eq!(bytes(&rbuf, 0, 16), &msg[..16]);
    assert_eq!(bytes(&rbuf, 16, 84), vec![0xaa; 84]);
    assert_eq!(bytes(&rbuf, 100, 34), &msg[16..]);
    assert_eq!(bytes(&rbuf, 134, 66), vec![0xaa; 66]);
    assert_eq!(bytes(&rbuf, 1000, 20), inl);
    assert_eq!(bytes(&rbuf, 1020, 44), vec![0xaa; 44]);
    assert_eq!(bytes(&rbuf, 2000, 64), vec![0xaa; 64]);
    assert_eq!(bytes(&rbuf, 3000, 64), &data[512..576]);
    assert_eq!(free_recv(s.resp()), 256);
    let st = nic(&s.dev).qp_stats(rq).unwrap();
    assert_eq!(st.recvs, 4);
}

fn compare_swap(mut s: Setup) {
    let target = s.mr(64, ALL);
    let local = s.mr(64, Access::LOCAL_WRITE);
    fill(&local, 0xff);
    target.write(8, &0x1111u64.to_ne_bytes()).unwrap();
    // Success: the old value comes back, the target changes.
    s.a.compare_swap(
        target.remote(8).unwrap(),
        0x1111,
        0x2222,
        local.sge(0, 8).unwrap(),
        1,
        PostFlags::SIGNALED,
    )
    .unwrap();
    let (c, _) = s.run_expect(1, 0);
    assert_ok(&c[0], 1, WcOpcode::CompSwap, 8, s.a.qpn());
    assert_eq!(local.read_u64(0).unwrap(), 0x1111);
    assert_eq!(target.read_u64(8).unwrap(), 0x2222);
    // Failed compare: the old value still comes back, the target stays.
    s.a.compare_swap(
        target.remote(8).unwrap(),
        0x1111,
        0x3333,
        local.sge(8, 8).unwrap(),
        2,
        PostFlags::SIGNALED,
    )
    .unwrap();
    let (c, _) = s.run_expect(1, 0);
    assert_ok(&c[0], 2, WcOpcode::CompSwap, 8, s.a.qpn());
    assert_eq!(c[0].status, WcStatus::Success);
    assert_eq!(local.read_u64(8).unwrap(), 0x2222);
    assert_eq!(target.read_u64(8).unwrap(), 0x2222);
    // Full 64-bit values; neighbours untouched.
    target.write(16, &u64::MAX.to_ne_bytes()).unwrap();
    s.a.compare_swap(
        target.remote(16).unwrap(),
        u64::MAX,
        0x8000_0000_0000_0001,
        local.sge(16, 8).unwrap(),
        3,
        PostFlags::SIGNALED,
    )
    .unwrap();
    let (c, _) = s.run_expect(1, 0);
    assert_ok(&c[0], 3, WcOpcode::CompSwap, 8, s.a.qpn());
    assert_eq!(local.read_u64(16).unwrap(), u64::MAX);
    assert_eq!(target.read_u64(16).unwrap(), 0x8000_0000_0000_0001);
    assert_eq!(target.read_u64(0).unwrap(), 0);
    assert_eq!(target.read_u64(24).unwrap(), 0);
    assert_eq!(bytes(&local, 24, 40), vec![0xff; 40]);
}

fn fetch_add(mut s: Setup) {
    let target = s.mr(64, ALL);
    let local = s.mr(64, Access::LOCAL_WRITE);
    target.write(0, &100u64.to_ne_bytes()).unwrap();
    for k in 0..10u64 {
        s.a.fetch_add(
            target.remote(0).unwrap(),
            k + 1,
            local.sge(8 * (k as usize % 8), 8).unwrap(),
            k,
            PostFlags::SIGNALED,
        )
        .unwrap();
        let (c, _) = s.run_expect(1, 0);
        assert_ok(&c[0], k, WcOpcode::FetchAdd, 8, s.a.qpn());
        let before = 100 + (1..=k).sum::<u64>();
        assert_eq!(local.read_u64(8 * (k as usize % 8)).unwrap(), before);
        assert_eq!(target.read_u64(0).unwrap(), before + k + 1);
    }
    // Wraps modulo 2^64.
    target.write(32, &(u64::MAX - 1).to_ne_bytes()).unwrap();
    s.a.fetch_add(
        target.remote(32).unwrap(),
        5,
        local.sge(0, 8).unwrap(),
        99,
        PostFlags::SIGNALED,
    )
    .unwrap();
    let (c, _) = s.run_expect(1, 0);
    assert_ok(&c[0], 99, WcOpcode::FetchAdd, 8, s.a.qpn());
    assert_eq!(local.read_u64(0).unwrap(), u64::MAX - 1);
    assert_eq!(target.read_u64(32).unwrap(), 3);
}

fn read_u32(mr: &MemoryRegion, off: usize) -> u32 {
    let mut b = [0u8; 4];
    mr.read(off, &mut b).unwrap();
    u32::from_ne_bytes(b)
}

fn masked_atomics(mut s: Setup) {
    let target = s.mr(64, ALL);
    let local = s.mr(64, Access::LOCAL_WRITE);
    fill(&target, 0x77);
    fill(&local, 0x99);
    let q = s.a.qpn();
    let post = |s: &mut Setup, off: usize, op: MaskedAtomic, loc: usize, cookie: u64| {
        let local_sge = local.sge(loc, op.size()).unwrap();
        s.a.post(
            &Request::Masked {
                remote: target.remote(off).unwrap(),
                op,
                local: local_sge,
            },
            cookie,
            PostFlags::SIGNALED,
        )
        .unwrap();
    };

    // 32-bit masked compare-swap at a 4-aligned (not 8-aligned) address: compare the low
    // half, swap the high half.
    target.write(12, &0xaabb_ccddu32.to_ne_bytes()).unwrap();
    let cs32 = MaskedAtomic::Cs32 {
        swap: 0x1122_3344,
        compare: 0x0000_ccdd,
        swap_mask: 0xffff_0000,
        compare_mask: 0x0000_ffff,
    };
    post(&mut s, 12, cs32, 0, 1);
    let (c, _) = s.run_expect(1, 0);
    assert_ok(&c[0], 1, WcOpcode::MaskedCompSwap, 4, q);
    assert_eq!(read_u32(&target, 12), 0x1122_ccdd);
    // 4-byte replies are big-endian on a ConnectX: read through Qp::atomic_result.
    assert_eq!(
        s.a.atomic_result(&bytes(&local, 0, 4)).unwrap(),
        0xaabb_ccdd
    );
    assert_eq!(bytes(&local, 4, 4), [0x99; 4]); // 4 bytes only
    assert_eq!(bytes(&target, 8, 4), [0x77; 4]);
    assert_eq!(bytes(&target, 16, 4), [0x77; 4]);

    // The same compare now fails on the compared bits: nothing changes.
    let cs32 = MaskedAtomic::Cs32 {
        swap: 0xffff_ffff,
        compare: 0x0000_0000,
        swap_mask: 0xffff_ffff,
        compare_mask: 0x0000_ffff,
    };
    post(&mut s, 12, cs32, 8, 2);
    let (c, _) = s.run_expect(1, 0);
    assert_ok(&c[0], 2, WcOpcode::MaskedCompSwap, 4, q);
    assert_eq!(read_u32(&target, 12), 0x1122_ccdd);
    assert_eq!(
        s.a.atomic_result(&bytes(&local, 8, 4)).unwrap(),
        0x1122_ccdd
    );

    // 32-bit masked fetch-add with two 16-bit fields: no carry between them.
    target.write(20, &0x0001_ffffu32.to_ne_bytes()).unwrap();
    let fa32 = MaskedAtomic::Fa32 {
        add: 0x0001_0001,
        field_boundary: 0x8000_8000,
    };
    post(&mut s, 20, fa32, 16, 3);
    let (c, _) = s.run_expect(1, 0);
    assert_ok(&c[0], 3, WcOpcode::MaskedFetchAdd, 4, q);
    assert_eq!(read_u32(&target, 20), 0x0002_0000);
    assert_eq!(
        s.a.atomic_result(&bytes(&local, 16, 4)).unwrap(),
        0x0001_ffff
    );

    // 64-bit masked compare-swap.
    target.write(24, &0x1234u64.to_ne_bytes()).unwrap();
    let cs64 = MaskedAtomic::Cs64 {
        swap: 0xff00,
        compare: 0x34,
        swap_mask: 0xff00,
        compare_mask: 0xff,
    };
    post(&mut s, 24, cs64, 24, 4);
    let (c, _) = s.run_expect(1, 0);
    assert_ok(&c[0], 4, WcOpcode::MaskedCompSwap, 8, q);
    assert_eq!(target.read_u64(24).unwrap(), 0xff34);
    assert_eq!(local.read_u64(24).unwrap(), 0x1234);
    // ... and a failing one.
    let cs64 = MaskedAtomic::Cs64 {
        swap: u64::MAX,
        compare: 0x35,
        swap_mask: u64::MAX,
        compare_mask: 0xff,
    };
    post(&mut s, 24, cs64, 32, 5);
    let (c, _) = s.run_expect(1, 0);
    assert_ok(&c[0], 5, WcOpcode::MaskedCompSwap, 8, q);
    assert_eq!(target.read_u64(24).unwrap(), 0xff34);
    assert_eq!(local.read_u64(32).unwrap(), 0xff34);

    // 64-bit masked fetch-add with two 32-bit fields.
    target
        .write(40, &0x0000_0000_ffff_ffffu64.to_ne_bytes())
        .unwrap();
    let fa64 = MaskedAtomic::Fa64 {
        add: 0x0000_0001_0000_0001,
        field_boundary: 0x8000_0000_8000_0000,
    };
    post(&mut s, 40, fa64, 40, 6);
    let (c, _) = s.run_expect(1, 0);
    assert_ok(&c[0], 6, WcOpcode::MaskedFetchAdd, 8, q);
    assert_eq!(target.read_u64(40).unwrap(), 0x0000_0001_0000_0000);
    assert_eq!(local.read_u64(40).unwrap(), 0x0000_0000_ffff_ffff);
    // Without boundaries it is a plain add.
    let fa64 = MaskedAtomic::Fa64 {
        add: 1,
        field_boundary: 0,
    };
    post(&mut s, 40, fa64, 48, 7);
    let (c, _) = s.run_expect(1, 0);
    assert_ok(&c[0], 7, WcOpcode::MaskedFetchAdd, 8, q);
    assert_eq!(target.read_u64(40).unwrap(), 0x0000_0001_0000_0001);
    assert_eq!(local.read_u64(48).unwrap(), 0x0000_0001_0000_0000);
}

fn nop(mut s: Setup) {
    let free = free_send(&mut s.a);
    s.a.post(&Request::Nop, 0x4e4f50, PostFlags::SIGNALED)
        .unwrap();
    assert_eq!(free_send(&mut s.a), free - 1);
    s.a.post(&Request::Nop, 1, PostFlags::UNSIGNALED).unwrap();
    s.a.post(&Request::Nop, 2, PostFlags::SIGNALED).unwrap();
    let (c, _) = s.run_expect(2, 0);
    assert_ok(&c[0], 0x4e4f50, WcOpcode::Nop, 0, s.a.qpn());
    assert_ok(&c[1], 2, WcOpcode::Nop, 0, s.a.qpn());
    assert_eq!(free_send(&mut s.a), free);
    assert_eq!(nic(&s.dev).qp_stats(s.a.qpn()).unwrap().wqes, 3);
}

/// Every opcode in one batch, completing in posting order.
fn mixed_batch(mut s: Setup) {
    let m = s.mr(8192, ALL);
    let data = pattern(1024, 8);
    m.write(0, &data).unwrap();
    m.write(4096, &5u64.to_ne_bytes()).unwrap();
    let rq = s.resp_qpn();
    s.resp()
        .post_recv(&[m.sge(6000, 100).unwrap()], 70)
        .unwrap();
    s.resp()
        .post_recv(&[m.sge(6200, 100).unwrap()], 71)
        .unwrap();
    let sgl = [m.sge(0, 40).unwrap()];
    let rd = [m.sge(7000, 40).unwrap()];
    let reqs = [
        Request::Write {
            remote: m.remote(2000).unwrap(),
            data: Payload::Sgl(&sgl),
        },
        Request::Write {
            remote: m.remote(2100).unwrap(),
            data: Payload::Inline(b"inline!"),
        },
        Request::WriteImm {
            remote: m.remote(2200).unwrap(),
            data: Payload::Inline(b"imm"),
            imm: 42,
        },
        Request::Read {
            remote: m.remote(100).unwrap(),
            sgl: &rd,
        },
        Request::Send {
            data: Payload::Inline(b"hello"),
        },
        Request::CompareSwap {
            remote: m.remote(4096).unwrap(),
            compare: 5,
            swap: 6,
            local: m.sge(5000, 8).unwrap(),
        },
        Request::FetchAdd {
            remote: m.remote(4096).unwrap(),
            add: 10,
            local: m.sge(5008, 8).unwrap(),
        },
        Request::Nop,
    ];
    let ops = [
        (WcOpcode::RdmaWrite, 0),
        (WcOpcode::RdmaWrite, 0),
        (WcOpcode::RdmaWrite, 0),
        (WcOpcode::RdmaRead, 40),
        (WcOpcode::Send, 0),
        (WcOpcode::CompSwap, 8),
        (WcOpcode::FetchAdd, 8),
        (WcOpcode::Nop, 0),
    ];
    let mut b = s.a.batch();
    for (i, r) in reqs.iter().enumerate() {
        b.push(r, 100 + i as u64, PostFlags::SIGNALED).unwrap();
    }
    assert_eq!(b.len(), reqs.len());
    b.ring().rung();
    let (c, r) = s.run_expect(reqs.len(), 2);
    for (i, (c, (op, len))) in c.iter().zip(ops).enumerate() {
        assert_ok(c, 100 + i as u64, op, len, s.a.qpn());
    }
    assert_ok(&r[0], 70, WcOpcode::RecvRdmaWithImm, 3, rq);
    assert_eq!(r[0].imm, Some(42));
    assert_ok(&r[1], 71, WcOpcode::Recv, 5, rq);
    assert_eq!(bytes(&m, 2000, 40), &data[..40]);
    assert_eq!(bytes(&m, 2100, 7), b"inline!");
    assert_eq!(bytes(&m, 2200, 3), b"imm");
    assert_eq!(bytes(&m, 7000, 40), &data[100..140]);
    assert_eq!(bytes(&m, 6200, 5), b"hello");
    assert_eq!(m.read_u64(5000).unwrap(), 5);
    assert_eq!(m.read_u64(5008).unwrap(), 6);
    assert_eq!(m.read_u64(4096).unwrap(), 16);
}
