//! Every error path to its completion status and syndrome: remote keys, bounds and rights,
//! local keys and rights, receive too small, RNR, misaligned atomics, regions dropped while
//! work is outstanding; and after an error, the QP is in error and later work is flushed.

use crate::common;

use blueflame::*;
use common::*;
use mlx5::sim::QpState;

const LOC_LEN: u8 = 0x01;
const LOC_PROT: u8 = 0x04;
const WR_FLUSH: u8 = 0x05;
const REM_INV_REQ: u8 = 0x12;
const REM_ACCESS: u8 = 0x13;
const REM_OP: u8 = 0x14;
const RNR_RETRY: u8 = 0x16;

/// Runs a scenario on a loopback QP and on a connected pair.
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

/// After an error: the requester is in error, a later request and a posted receive are
/// flushed with their cookies, and the send queue is free again.
#[track_caller]
fn assert_flushes_after(s: &mut Setup) {
    let q = s.a.qpn();
    assert_eq!(nic(&s.dev).qp_state(q), Some(QpState::Error));
    let m = s.mr(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    s.a.write_inline(b"later", m.remote(0).unwrap(), 0xf1, PostFlags::SIGNALED)
        .unwrap();
    s.a.write_inline(b"later", m.remote(0).unwrap(), 0xf2, PostFlags::UNSIGNALED)
        .unwrap();
    s.a.post_recv(&[m.sge(0, 64).unwrap()], 0xf3).unwrap();
    let (c, r) = s.run();
    let mine: Vec<_> = r.iter().filter(|c| c.qpn == q).collect();
    assert_eq!(c.len(), 2, "{c:?}");
    assert_err(&c[0], 0xf1, WcStatus::WrFlushErr, WR_FLUSH, q);
    assert_err(&c[1], 0xf2, WcStatus::WrFlushErr, WR_FLUSH, q);
    assert_eq!(c[0].opcode, WcOpcode::RdmaWrite);
    assert_eq!(mine.len(), 1, "{r:?}");
    assert_err(mine[0], 0xf3, WcStatus::WrFlushErr, WR_FLUSH, q);
    assert_eq!(mine[0].opcode, WcOpcode::Recv);
    assert_eq!(bytes(&m, 0, 5), [0; 5]);
    assert_eq!(free_send(&mut s.a), 256);
}

fn bad_rkey(mut s: Setup) {
    let dst = s.mr(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let q = s.a.qpn();
    let bad = Remote {
        addr: dst.addr(),
        rkey: dst.rkey() ^ 0x01, // same index, other variant: a stale key
    };
    s.a.write_inline(b"nope", bad, 1, PostFlags::SIGNALED)
        .unwrap();
    let (c, _) = s.run_expect(1, 0);
    assert_err(&c[0], 1, WcStatus::RemAccessErr, REM_ACCESS, q);
    assert_eq!(c[0].opcode, WcOpcode::RdmaWrite);
    assert_eq!(bytes(&dst, 0, 4), [0; 4]);
    // A class-C error: the responder goes to error too.
    assert_eq!(nic(&s.dev).qp_state(s.resp_qpn()), Some(QpState::Error));
    assert_flushes_after(&mut s);
}
both!(bad_rkey: bad_rkey_loopback, bad_rkey_pair);

fn unknown_rkey_read(mut s: Setup) {
    let local = s.mr(64, Access::LOCAL_WRITE);
    fill(&local, 0x42);
    let q = s.a.qpn();
    let bad = Remote {
        addr: local.addr(),
        rkey: 0x00ab_cd00,
    };
    s.a.read(&[local.sge(0, 8).unwrap()], bad, 2, PostFlags::SIGNALED)
        .unwrap();
    let (c, _) = s.run_expect(1, 0);
    assert_err(&c[0], 2, WcStatus::RemAccessErr, REM_ACCESS, q);
    assert_eq!(c[0].opcode, WcOpcode::RdmaRead);
    assert_eq!(bytes(&local, 0, 64), vec![0x42; 64]);
    assert_flushes_after(&mut s);
}
both!(unknown_rkey_read: unknown_rkey_read_loopback, unknown_rkey_read_pair);

fn atomic_bad_rkey(mut s: Setup) {
    let local = s.mr(64, Access::LOCAL_WRITE);
    fill(&local, 0x42);
    let target = s.mr(64, ALL);
    let q = s.a.qpn();
    let bad = Remote {
        addr: target.addr(),
        rkey: target.rkey() ^ 0x80,
    };
    s.a.fetch_add(bad, 1, local.sge(0, 8).unwrap(), 3, PostFlags::SIGNALED)
        .unwrap();
    let (c, _) = s.run_expect(1, 0);
    assert_err(&c[0], 3, WcStatus::RemAccessErr, REM_ACCESS, q);
    assert_eq!(c[0].opcode, WcOpcode::FetchAdd);
    assert_eq!(bytes(&local, 0, 8), [0x42; 8]);
    assert_eq!(target.read_u64(0).unwrap(), 0);
    assert_flushes_after(&mut s);
}
both!(atomic_bad_rkey: atomic_bad_rkey_loopback, atomic_bad_rkey_pair);

fn out_of_bounds(mut s: Setup) {
    let dst = s.mr(4096, ALL);
    let q = s.a.qpn();
    // One byte past the end.
    s.a.write_inline(
        &[7u8; 10],
        dst.remote(4087).unwrap(),
        1,
        PostFlags::SIGNALED,
    )
    .unwrap();
    let (c, _) = s.run_expect(1, 0);
    assert_err(&c[0], 1, WcStatus::RemAccessErr, REM_ACCESS, q);
    assert_eq!(bytes(&dst, 4080, 16), [0; 16]);
    assert_flushes_after(&mut s);
}
both!(out_of_bounds: out_of_bounds_loopback, out_of_bounds_pair);

#[test]
fn out_of_bounds_every_way() {
    // (what, opcode, request builder), each on a fresh pair.
    type Case = fn(&mut Setup, &MemoryRegion, &MemoryRegion);
    let cases: [(&str, WcOpcode, Case); 5] = [
        ("write before start", WcOpcode::RdmaWrite, |s, dst, _| {
            let r = Remote {
                addr: dst.addr() - 1,
                rkey: dst.rkey(),
            };
            s.a.write_inline(b"ab", r, 1, PostFlags::SIGNALED).unwrap();
        }),
        ("sgl write past end", WcOpcode::RdmaWrite, |s, dst, src| {
            let sgl = [src.sge(0, 100).unwrap(), src.sge(200, 100).unwrap()];
            s.a.write(
                &sgl,
                dst.remote(4096 - 199).unwrap(),
                1,
                PostFlags::SIGNALED,
            )
            .unwrap();
        }),
        ("read past end", WcOpcode::RdmaRead, |s, dst, src| {
            s.a.read(
                &[src.sge(0, 2).unwrap()],
                dst.remote(4095).unwrap(),
                1,
                PostFlags::SIGNALED,
            )
            .unwrap();
        }),
        ("atomic past end", WcOpcode::CompSwap, |s, dst, src| {
            s.a.compare_swap(
                dst.remote(4096).unwrap(),
                0,
                1,
                src.sge(0, 8).unwrap(),
                1,
                PostFlags::SIGNALED,
            )
            .unwrap();
        }),
        ("address wraps", WcOpcode::RdmaWrite, |s, dst, _| {
            let r = Remote {
                addr: u64::MAX - 1,
                rkey: dst.rkey(),
            };
            s.a.write_inline(b"abcd", r, 1, PostFlags::SIGNALED)
                .unwrap();
        }),
    ];
    for (what, op, case) in cases {
        let mut s = Setup::pair(QpCaps::default());
        let dst = s.mr(4096, ALL);
        let src = s.mr(4096, Access::LOCAL_WRITE);
        fill(&src, 0x66);
        case(&mut s, &dst, &src);
        let (c, _) = s.run_expect(1, 0);
        assert_err(&c[0], 1, WcStatus::RemAccessErr, REM_ACCESS, s.a.qpn());
        assert_eq!(c[0].opcode, op, "{what}");
        assert_eq!(bytes(&dst, 0, 4096), vec![0; 4096], "{what}");
        assert_eq!(bytes(&src, 0, 4096), vec![0x66; 4096], "{what}");
        assert_flushes_after(&mut s);
    }
}

fn missing_remote_rights(loopback: bool) {
    let everything_but = |r: Access| Access(ALL.0 & !r.0);
    // Write into a region without REMOTE_WRITE.
    let mut s = Setup::new(loopback, QpCaps::default(), QpCaps::default());
    let m = s.mr(64, everything_but(Access::REMOTE_WRITE));
    s.a.write_inline(b"w", m.remote(0).unwrap(), 1, PostFlags::SIGNALED)
        .unwrap();
    let (c, _) = s.run_expect(1, 0);
    assert_err(&c[0], 1, WcStatus::RemAccessErr, REM_ACCESS, s.a.qpn());
    assert_eq!(bytes(&m, 0, 1), [0]);
    assert_flushes_after(&mut s);
    // Write with immediate: refused, and the receive is not consumed as a success.
    let mut s = Setup::new(loopback, QpCaps::default(), QpCaps::default());
    let m = s.mr(64, everything_but(Access::REMOTE_WRITE));
    s.resp().post_recv(&[], 50).unwrap();
    s.a.write_imm(
        Payload::Inline(b"wi"),
        m.remote(0).unwrap(),
        5,
        2,
        PostFlags::SIGNALED,
    )
    .unwrap();
    let (c, r) = s.run();
    assert_eq!(c.len(), 1, "{c:?}");
    assert_err(&c[0], 2, WcStatus::RemAccessErr, REM_ACCESS, s.a.qpn());
    // The responder went to error: its receive is flushed, not completed.
    assert_eq!(r.len(), 1, "{r:?}");
    assert_err(&r[0], 50, WcStatus::WrFlushErr, WR_FLUSH, s.resp_qpn());
    assert_eq!(bytes(&m, 0, 2), [0, 0]);
    // Read from a region without REMOTE_READ.
    let mut s = Setup::new(loopback, QpCaps::default(), QpCaps::default());
    let m = s.mr(64, everything_but(Access::REMOTE_READ));
    m.write(0, b"secret").unwrap();
    let local = s.mr(64, Access::LOCAL_WRITE);
    s.a.read(
        &[local.sge(0, 6).unwrap()],
        m.remote(0).unwrap(),
        3,
        PostFlags::SIGNALED,
    )
    .unwrap();
    let (c, _) = s.run_expect(1, 0);
    assert_err(&c[0], 3, WcStatus::RemAccessErr, REM_ACCESS, s.a.qpn());
    assert_eq!(bytes(&local, 0, 6), [0; 6]);
    assert_flushes_after(&mut s);
    // Atomics on a region without REMOTE_ATOMIC.
    for masked in [false, true] {
        let mut s = Setup::new(loopback, QpCaps::default(), QpCaps::default());
        let m = s.mr(64, everything_but(Access::REMOTE_ATOMIC));
        m.write(0, &5u64.to_ne_bytes()).unwrap();
        let local = s.mr(64, Access::LOCAL_WRITE);
        fill(&local, 0x42);
        if masked {
            s.a.post(
                &Request::Masked {
                    remote: m.remote(0).unwrap(),
                    op: MaskedAtomic::Fa32 {
                        add: 1,
                        field_boundary: 0,
                    },
                    local: local.sge(0, 4).unwrap(),
                },
                4,
                PostFlags::SIGNALED,
            )
            .unwrap();
        } else {
            s.a.compare_swap(
                m.remote(0).unwrap(),
                5,
                6,
                local.sge(0, 8).unwrap(),
                4,
                PostFlags::SIGNALED,
            )
            .unwrap();
        }
        let (c, _) = s.run_expect(1, 0);
        assert_err(&c[0], 4, WcStatus::RemAccessErr, REM_ACCESS, s.a.qpn());
        assert_eq!(m.read_u64(0).unwrap(), 5);
        assert_eq!(bytes(&local, 0, 8), [0x42; 8]);
        assert_flushes_after(&mut s);
    }
}

#[test]
fn missing_remote_rights_loopback() {
    missing_remote_rights(true);
}

#[test]
fn missing_remote_rights_pair() {
    missing_remote_rights(false);
}

fn bad_lkey_in_gather_list(mut s: Setup) {
    let src = s.mr(4096, Access::LOCAL_WRITE);
    src.write(0, &pattern(4096, 1)).unwrap();
    let dst = s.mr(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let q = s.a.qpn();
    let good = src.sge(0, 100).unwrap();
    let bad = Sge {
        lkey: src.lkey() ^ 0x02,
        ..src.sge(100, 100).unwrap()
    };
    s.a.write(&[good, bad], dst.remote(0).unwrap(), 1, PostFlags::SIGNALED)
        .unwrap();
    let (c, _) = s.run_expect(1, 0);
    assert_err(&c[0], 1, WcStatus::LocProtErr, LOC_PROT, q);
    assert_eq!(c[0].opcode, WcOpcode::RdmaWrite);
    // Nothing of the good entry went out either.
    assert_eq!(bytes(&dst, 0, 200), vec![0; 200]);
    // A local error: the responder is untouched.
    if !s.is_loopback() {
        assert_eq!(nic(&s.dev).qp_state(s.resp_qpn()), Some(QpState::Rts));
    }
    assert_flushes_after(&mut s);
}
both!(bad_lkey_in_gather_list: bad_lkey_loopback, bad_lkey_pair);

fn gather_entry_outside_its_region(mut s: Setup) {
    let src = s.mr(64, Access::LOCAL_WRITE);
    let dst = s.mr(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let q = s.a.qpn();
    let past = Sge {
        addr: src.addr() + 60,
        len: 8,
        lkey: src.lkey(),
    };
    s.a.write(&[past], dst.remote(0).unwrap(), 1, PostFlags::SIGNALED)
        .unwrap();
    let (c, _) = s.run_expect(1, 0);
    assert_err(&c[0], 1, WcStatus::LocProtErr, LOC_PROT, q);
    assert_eq!(bytes(&dst, 0, 8), [0; 8]);
    assert_flushes_after(&mut s);
}
both!(gather_entry_outside_its_region: gather_outside_loopback, gather_outside_pair);

fn bad_lkey_in_send(mut s: Setup) {
    let src = s.mr(64, Access::LOCAL_WRITE);
    let rbuf = s.mr(64, Access::LOCAL_WRITE);
    let q = s.a.qpn();
    s.resp().post_recv(&[rbuf.sge(0, 64).unwrap()], 9).unwrap();
    let bad = Sge {
        lkey: 0x00dd_ee00,
        ..src.sge(0, 8).unwrap()
    };
    s.a.send(Payload::Sgl(&[bad]), 1, PostFlags::SIGNALED)
        .unwrap();
    let (c, r) = s.run();
    assert_eq!(c.len(), 1);
    assert_err(&c[0], 1, WcStatus::LocProtErr, LOC_PROT, q);
    assert_eq!(c[0].opcode, WcOpcode::Send);
    assert_eq!(bytes(&rbuf, 0, 64), [0; 64]);
    if !s.is_loopback() {
        // The receive was not consumed: the responder is fine and it is still posted.
        assert!(r.is_empty(), "{r:?}");
        assert_eq!(free_recv(s.resp()), 255);
    } else {
        // Loopback: the QP itself is in error, so its receive is flushed.
        assert_eq!(r.len(), 1);
        assert_err(&r[0], 9, WcStatus::WrFlushErr, WR_FLUSH, q);
    }
}
both!(bad_lkey_in_send: bad_lkey_in_send_loopback, bad_lkey_in_send_pair);

fn read_into_region_without_local_write(mut s: Setup) {
    let src = s.mr(64, Access::LOCAL_WRITE | Access::REMOTE_READ);
    src.write(0, b"readable").unwrap();
    let local = s.mr(64, Access::REMOTE_READ); // no LOCAL_WRITE (verbs refuses remote write without it)
    fill(&local, 0x42);
    let q = s.a.qpn();
    s.a.read(
        &[local.sge(0, 8).unwrap()],
        src.remote(0).unwrap(),
        1,
        PostFlags::SIGNALED,
    )
    .unwrap();
    let (c, _) = s.run_expect(1, 0);
    assert_err(&c[0], 1, WcStatus::LocProtErr, LOC_PROT, q);
    assert_eq!(c[0].opcode, WcOpcode::RdmaRead);
    assert_eq!(bytes(&local, 0, 8), [0x42; 8]);
    assert_flushes_after(&mut s);
}
both!(read_into_region_without_local_write: read_no_local_write_loopback, read_no_local_write_pair);

fn atomic_result_without_local_write(mut s: Setup) {
    let target = s.mr(64, ALL);
    target.write(0, &10u64.to_ne_bytes()).unwrap();
    let local = s.mr(64, Access::NONE);
    let q = s.a.qpn();
    s.a.fetch_add(
        target.remote(0).unwrap(),
        1,
        local.sge(0, 8).unwrap(),
        1,
        PostFlags::SIGNALED,
    )
    .unwrap();
    let (c, _) = s.run_expect(1, 0);
    assert_err(&c[0], 1, WcStatus::LocProtErr, LOC_PROT, q);
    assert_eq!(c[0].opcode, WcOpcode::FetchAdd);
    // Refused before the target was touched.
    assert_eq!(target.read_u64(0).unwrap(), 10);
    assert_eq!(local.read_u64(0).unwrap(), 0);
    assert_flushes_after(&mut s);
}
both!(atomic_result_without_local_write: atomic_no_local_write_loopback, atomic_no_local_write_pair);

fn receive_too_small(mut s: Setup) {
    let rbuf = s.mr(64, Access::LOCAL_WRITE);
    fill(&rbuf, 0x11);
    let rq = s.resp_qpn();
    let q = s.a.qpn();
    s.resp()
        .post_recv(&[rbuf.sge(0, 8).unwrap(), rbuf.sge(32, 8).unwrap()], 77)
        .unwrap();
    s.a.send(Payload::Inline(&[9u8; 17]), 1, PostFlags::SIGNALED)
        .unwrap();
    let (c, r) = s.run();
    assert_eq!(c.len(), 1, "{c:?}");
    assert_err(&c[0], 1, WcStatus::RemInvReqErr, REM_INV_REQ, q);
    assert_eq!(c[0].opcode, WcOpcode::Send);
    assert_eq!(r.len(), 1, "{r:?}");
    assert_err(&r[0], 77, WcStatus::LocLenErr, LOC_LEN, rq);
    assert_eq!(r[0].opcode, WcOpcode::Recv);
    assert_eq!(nic(&s.dev).qp_state(rq), Some(QpState::Error));
    assert_eq!(nic(&s.dev).qp_state(q), Some(QpState::Error));
    // 16 bytes would have fit; nothing was scattered.
    assert_eq!(bytes(&rbuf, 0, 64), vec![0x11; 64]);
    assert_flushes_after(&mut s);
}
both!(receive_too_small: receive_too_small_loopback, receive_too_small_pair);

fn receive_with_bad_lkey(mut s: Setup) {
    let rbuf = s.mr(64, Access::LOCAL_WRITE);
    let rq = s.resp_qpn();
    let q = s.a.qpn();
    let bad = Sge {
        lkey: rbuf.lkey() ^ 0x10,
        ..rbuf.sge(0, 64).unwrap()
    };
    s.resp().post_recv(&[bad], 78).unwrap();
    // 40 bytes: too long for a 64-byte CQE, so the NIC writes the buffer itself and finds
    // the key bad.
    s.a.send(Payload::Inline(&[7; 40]), 1, PostFlags::SIGNALED)
        .unwrap();
    let (c, r) = s.run();
    assert_eq!(c.len(), 1, "{c:?}");
    assert_err(&c[0], 1, WcStatus::RemOpErr, REM_OP, q);
    assert_eq!(r.len(), 1, "{r:?}");
    assert_err(&r[0], 78, WcStatus::LocProtErr, LOC_PROT, rq);
    assert_eq!(bytes(&rbuf, 0, 40), [0; 40]);
}
both!(receive_with_bad_lkey: receive_bad_lkey_loopback, receive_bad_lkey_pair);

/// A message small enough for the CQE (scatter-to-CQE): the NIC does not look at the
/// receive's keys, the requester succeeds, and the poller, which would write with the CPU,
/// refuses the unchecked buffer with a local protection error (no hardware syndrome).
fn receive_with_bad_lkey_in_cqe(mut s: Setup) {
    let rbuf = s.mr(64, Access::LOCAL_WRITE);
    let rq = s.resp_qpn();
    let q = s.a.qpn();
    let bad = Sge {
        lkey: rbuf.lkey() ^ 0x10,
        ..rbuf.sge(0, 64).unwrap()
    };
    s.resp().post_recv(&[bad], 78).unwrap();
    s.a.send(Payload::Inline(b"hi"), 1, PostFlags::SIGNALED)
        .unwrap();
    let (c, r) = s.run();
    assert_eq!(c.len(), 1, "{c:?}");
    assert_ok(&c[0], 1, WcOpcode::Send, 0, q);
    assert_eq!(r.len(), 1, "{r:?}");
    assert_eq!(
        (r[0].cookie, r[0].status),
        (78, WcStatus::LocProtErr),
        "{r:?}"
    );
    assert_eq!((r[0].qpn, r[0].syndrome), (rq, None), "{r:?}");
    assert_eq!(bytes(&rbuf, 0, 2), [0, 0]);
}
both!(receive_with_bad_lkey_in_cqe: receive_bad_lkey_in_cqe_loopback, receive_bad_lkey_in_cqe_pair);

#[test]
fn no_receive_rnr_retry_exceeded() {
    for retry in [0u8, 3] {
        let caps = QpCaps {
            rnr_retry: retry,
            ..QpCaps::default()
        };
        let mut s = Setup::pair(caps);
        let rq = s.resp_qpn();
        let q = s.a.qpn();
        s.a.send(Payload::Inline(b"anyone?"), 1, PostFlags::SIGNALED)
            .unwrap();
        // Each NIC pass is one attempt; drain() stops at an RNR wait, so pass until done.
        let mut c = Vec::new();
        for _ in 0..10 {
            let (x, r) = s.run();
            assert!(r.is_empty());
            c.extend(x);
            if !c.is_empty() {
                break;
            }
        }
        assert_eq!(c.len(), 1, "{c:?}");
        assert_err(&c[0], 1, WcStatus::RnrRetryExcErr, RNR_RETRY, q);
        assert_eq!(c[0].opcode, WcOpcode::Send);
        assert_eq!(nic(&s.dev).qp_stats(rq).unwrap().rnr_naks, retry as u64 + 1);
        // The responder did nothing wrong.
        assert_eq!(nic(&s.dev).qp_state(rq), Some(QpState::Rts));
        assert_flushes_after(&mut s);
    }
}

#[test]
fn write_imm_without_receive_rnr_and_no_bytes_move() {
    let caps = QpCaps {
        rnr_retry: 0,
        ..QpCaps::default()
    };
    let mut s = Setup::pair(caps);
    let dst = s.mr(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let q = s.a.qpn();
    s.a.write_imm(
        Payload::Inline(b"data"),
        dst.remote(0).unwrap(),
        1,
        1,
        PostFlags::SIGNALED,
    )
    .unwrap();
    let (c, r) = s.run_expect(1, 0);
    assert!(r.is_empty());
    assert_err(&c[0], 1, WcStatus::RnrRetryExcErr, RNR_RETRY, q);
    assert_eq!(bytes(&dst, 0, 4), [0; 4]);
    assert_flushes_after(&mut s);
}

#[test]
fn rnr_with_infinite_retry_waits_for_a_receive() {
    let mut s = Setup::pair(QpCaps::default()); // rnr_retry 7: for ever
    let rbuf = s.mr(64, Access::LOCAL_WRITE);
    let rq = s.resp_qpn();
    let q = s.a.qpn();
    s.a.send(Payload::Inline(b"patience"), 1, PostFlags::SIGNALED)
        .unwrap();
    s.a.write_inline(b"behind", rbuf.remote(32).unwrap(), 2, PostFlags::SIGNALED)
        .unwrap(); // rbuf has no REMOTE_WRITE: this one fails, but only after the send
    for _ in 0..5 {
        s.run_expect(0, 0);
    }
    assert!(nic(&s.dev).qp_stats(rq).unwrap().rnr_naks >= 5);
    assert_eq!(nic(&s.dev).qp_state(q), Some(QpState::Rts));
    // Later WQEs wait behind the send (in order).
    assert_eq!(bytes(&rbuf, 32, 6), [0; 6]);
    s.resp().post_recv(&[rbuf.sge(0, 32).unwrap()], 5).unwrap();
    let (c, r) = s.run();
    assert_eq!(r.len(), 1);
    assert_ok(&r[0], 5, WcOpcode::Recv, 8, rq);
    assert_eq!(bytes(&rbuf, 0, 8), b"patience");
    assert_eq!(c.len(), 2, "{c:?}");
    assert_ok(&c[0], 1, WcOpcode::Send, 0, q);
    assert_err(&c[1], 2, WcStatus::RemAccessErr, REM_ACCESS, q);
}

#[test]
fn misaligned_atomics_are_refused_at_post_time() {
    let mut s = Setup::pair(QpCaps::default());
    let target = s.mr(64, ALL);
    let local = s.mr(64, Access::LOCAL_WRITE);
    let free = free_send(&mut s.a);
    for off in [1usize, 2, 4, 7] {
        let e =
            s.a.compare_swap(
                target.remote(off).unwrap(),
                0,
                1,
                local.sge(0, 8).unwrap(),
                1,
                PostFlags::SIGNALED,
            )
            .unwrap_err();
        assert!(
            matches!(e, Error::Misaligned { addr, align: 8 } if addr == target.addr() + off as u64),
            "{e:?}"
        );
        let e =
            s.a.fetch_add(
                target.remote(off).unwrap(),
                1,
                local.sge(0, 8).unwrap(),
                1,
                PostFlags::SIGNALED,
            )
            .unwrap_err();
        assert!(matches!(e, Error::Misaligned { align: 8, .. }), "{e:?}");
        let e =
            s.a.post(
                &Request::Masked {
                    remote: target.remote(off).unwrap(),
                    op: MaskedAtomic::Fa64 {
                        add: 1,
                        field_boundary: 0,
                    },
                    local: local.sge(0, 8).unwrap(),
                },
                1,
                PostFlags::SIGNALED,
            )
            .unwrap_err();
        assert!(matches!(e, Error::Misaligned { align: 8, .. }), "{e:?}");
    }
    // 32-bit masked atomics need 4-byte alignment only.
    for off in [1usize, 2, 6] {
        let e =
            s.a.post(
                &Request::Masked {
                    remote: target.remote(off).unwrap(),
                    op: MaskedAtomic::Cs32 {
                        swap: 1,
                        compare: 0,
                        swap_mask: !0,
                        compare_mask: !0,
                    },
                    local: local.sge(0, 4).unwrap(),
                },
                1,
                PostFlags::SIGNALED,
            )
            .unwrap_err();
        assert!(
            matches!(e, Error::Misaligned { addr, align: 4 } if addr == target.addr() + off as u64),
            "{e:?}"
        );
    }
    // Nothing was posted.
    assert_eq!(free_send(&mut s.a), free);
    assert_eq!(s.dev.process(), 0);
    s.run_expect(0, 0);
    assert_eq!(bytes(&target, 0, 64), vec![0; 64]);
    assert_eq!(nic(&s.dev).qp_stats(s.a.qpn()).unwrap().wqes, 0);
    // And the QP is still fine: an aligned one at 4 works for 32 bits.
    s.a.post(
        &Request::Masked {
            remote: target.remote(4).unwrap(),
            op: MaskedAtomic::Fa32 {
                add: 3,
                field_boundary: 0,
            },
            local: local.sge(0, 4).unwrap(),
        },
        2,
        PostFlags::SIGNALED,
    )
    .unwrap();
    let (c, _) = s.run_expect(1, 0);
    assert_ok(&c[0], 2, WcOpcode::MaskedFetchAdd, 4, s.a.qpn());
    assert_eq!(bytes(&target, 4, 4), 3u32.to_ne_bytes());
}

/// A region dropped with work outstanding stays registered until the work completes (the
/// crate's ownership rule): the work succeeds, then the key is gone.
fn local_region_dropped_while_outstanding(mut s: Setup) {
    let src = s.mr(64, Access::LOCAL_WRITE);
    src.write(0, b"kept").unwrap();
    let dst = s.mr(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let q = s.a.qpn();
    let stale = src.sge(0, 4).unwrap();
    s.a.write(&[stale], dst.remote(0).unwrap(), 1, PostFlags::SIGNALED)
        .unwrap();
    drop(src);
    assert_eq!(s.pd.reclaim(), 1, "parked while the write is outstanding");
    let (c, _) = s.run_expect(1, 0);
    assert_ok(&c[0], 1, WcOpcode::RdmaWrite, 0, q);
    assert_eq!(bytes(&dst, 0, 4), *b"kept");
    // Deregistered at the next reclaim point once the work is done: the old lkey is refused.
    assert_eq!(s.pd.reclaim(), 0);
    s.a.write(&[stale], dst.remote(8).unwrap(), 2, PostFlags::SIGNALED)
        .unwrap();
    let (c, _) = s.run_expect(1, 0);
    assert_err(&c[0], 2, WcStatus::LocProtErr, LOC_PROT, q);
    assert_flushes_after(&mut s);
}
both!(local_region_dropped_while_outstanding: local_mr_dropped_loopback, local_mr_dropped_pair);

fn read_target_dropped_while_outstanding(mut s: Setup) {
    let local = s.mr(64, Access::LOCAL_WRITE);
    let remote = s.mr(64, ALL);
    remote.write(0, b"readable").unwrap();
    let q = s.a.qpn();
    let target = remote.remote(0).unwrap();
    s.a.read(&[local.sge(0, 8).unwrap()], target, 1, PostFlags::SIGNALED)
        .unwrap();
    drop(remote);
    let (c, _) = s.run_expect(1, 0);
    assert_ok(&c[0], 1, WcOpcode::RdmaRead, 8, q);
    assert_eq!(bytes(&local, 0, 8), *b"readable");
    // Then, at the next reclaim point, the rkey is gone.
    assert_eq!(s.pd.reclaim(), 0);
    s.a.read(&[local.sge(0, 8).unwrap()], target, 2, PostFlags::SIGNALED)
        .unwrap();
    let (c, _) = s.run_expect(1, 0);
    assert_err(&c[0], 2, WcStatus::RemAccessErr, REM_ACCESS, q);
    assert_flushes_after(&mut s);
}
both!(read_target_dropped_while_outstanding: remote_mr_dropped_loopback, remote_mr_dropped_pair);

fn receive_region_dropped_while_posted(mut s: Setup) {
    let rbuf = s.mr(64, Access::LOCAL_WRITE);
    let probe = rbuf.as_ptr();
    s.resp().post_recv(&[rbuf.sge(0, 64).unwrap()], 40).unwrap();
    drop(rbuf);
    s.a.send(Payload::Inline(b"still lands"), 1, PostFlags::SIGNALED)
        .unwrap();
    let (c, r) = s.run();
    assert_eq!((c.len(), r.len()), (1, 1), "{c:?} {r:?}");
    assert_eq!((c[0].cookie, c[0].status), (1, WcStatus::Success));
    assert_eq!(
        (r[0].cookie, r[0].status, r[0].byte_len),
        (40, WcStatus::Success, 11)
    );
    let _ = probe; // the memory belonged to the NIC and is freed with the registration
}
both!(receive_region_dropped_while_posted: recv_mr_dropped_loopback, recv_mr_dropped_pair);

#[test]
fn error_mid_batch_flushes_the_rest_in_order() {
    let mut s = Setup::pair(QpCaps::default());
    let dst = s.mr(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let q = s.a.qpn();
    let bad = Remote {
        addr: dst.addr(),
        rkey: 0x0012_3400,
    };
    {
        let mut b = s.a.batch();
        for i in 0..10u64 {
            let r = if i == 4 {
                bad
            } else {
                dst.remote(i as usize * 8).unwrap()
            };
            let flags = if i % 2 == 0 {
                PostFlags::SIGNALED
            } else {
                PostFlags::UNSIGNALED
            };
            b.push(
                &Request::Write {
                    remote: r,
                    data: Payload::Inline(&i.to_le_bytes()),
                },
                i,
                flags,
            )
            .unwrap();
        }
        b.ring().rung();
    }
    let (c, _) = s.run();
    // 0 and 2 succeed (1 and 3 are unsignaled); 4 fails; 5..10 are flushed, signaled or not.
    let cookies: Vec<u64> = c.iter().map(|c| c.cookie).collect();
    assert_eq!(cookies, [0, 2, 4, 5, 6, 7, 8, 9]);
    assert_ok(&c[0], 0, WcOpcode::RdmaWrite, 0, q);
    assert_ok(&c[1], 2, WcOpcode::RdmaWrite, 0, q);
    assert_err(&c[2], 4, WcStatus::RemAccessErr, REM_ACCESS, q);
    for c in &c[3..] {
        assert_err(c, c.cookie, WcStatus::WrFlushErr, WR_FLUSH, q);
    }
    for i in 0..4u64 {
        assert_eq!(dst.read_u64(i as usize * 8).unwrap(), i.to_le());
    }
    for i in 5..10usize {
        assert_eq!(dst.read_u64(i * 8).unwrap(), 0);
    }
    assert_eq!(free_send(&mut s.a), 256);
}

#[test]
fn connecting_to_a_peer_in_error_fails_the_requester() {
    // The peer is in error (answers nothing): the requester's retries run out.
    let mut s = Setup::pair(QpCaps::default());
    let dst = s.mr(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let q = s.a.qpn();
    s.resp().set_error().unwrap();
    s.a.write_inline(b"x", dst.remote(0).unwrap(), 1, PostFlags::SIGNALED)
        .unwrap();
    let (c, _) = s.run_expect(1, 0);
    assert_err(&c[0], 1, WcStatus::RetryExcErr, 0x15, q);
    assert_eq!(bytes(&dst, 0, 1), [0]);
    assert_flushes_after(&mut s);
}
