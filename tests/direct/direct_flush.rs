//! Flush accounting: after `set_error`, every outstanding request (signaled or not) and
//! every posted receive comes back exactly once with its cookie, flushed, and the queues are
//! free again.

use crate::common;

use blueflame::*;
use common::*;
use mlx5::sim::QpState;

const WR_FLUSH: u8 = 0x05;

/// Posts `k` requests of every kind, signaled and unsignaled mixed; returns the cookies and
/// opcodes in posting order.
fn post_mix(s: &mut Setup, m: &MemoryRegion, k: u64, base: u64) -> Vec<(u64, WcOpcode)> {
    let mut v = Vec::new();
    for i in 0..k {
        let cookie = base + i;
        let flags = if i % 3 == 0 {
            PostFlags::SIGNALED
        } else {
            PostFlags::UNSIGNALED
        };
        let op = match i % 6 {
            0 => {
                s.a.write_inline(
                    &cookie.to_le_bytes(),
                    m.remote(8 * (i as usize % 64)).unwrap(),
                    cookie,
                    flags,
                )
                .unwrap();
                WcOpcode::RdmaWrite
            }
            1 => {
                s.a.read(
                    &[m.sge(1024, 16).unwrap()],
                    m.remote(0).unwrap(),
                    cookie,
                    flags,
                )
                .unwrap();
                WcOpcode::RdmaRead
            }
            2 => {
                s.a.fetch_add(
                    m.remote(2048).unwrap(),
                    1,
                    m.sge(2056, 8).unwrap(),
                    cookie,
                    flags,
                )
                .unwrap();
                WcOpcode::FetchAdd
            }
            3 => {
                s.a.send(Payload::Inline(&[1, 2, 3]), cookie, flags)
                    .unwrap();
                WcOpcode::Send
            }
            4 => {
                s.a.post(&Request::Nop, cookie, flags).unwrap();
                WcOpcode::Nop
            }
            _ => {
                s.a.write(
                    &[m.sge(3000, 100).unwrap()],
                    m.remote(3500).unwrap(),
                    cookie,
                    flags,
                )
                .unwrap();
                WcOpcode::RdmaWrite
            }
        };
        v.push((cookie, op));
    }
    v
}

fn flush_everything(loopback: bool) {
    let mut s = Setup::new(loopback, QpCaps::default(), QpCaps::default());
    let m = s.mr(4096, ALL);
    let q = s.a.qpn();
    const K: u64 = 60;
    let posted = post_mix(&mut s, &m, K, 1000);
    // Receives on the QP that goes to error.
    for j in 0..7u64 {
        s.a.post_recv(&[m.sge(3800, 32).unwrap()], 5000 + j)
            .unwrap();
    }
    let used = 256 - free_send(&mut s.a);
    assert!(used >= K as u32);
    s.a.set_error().unwrap();
    assert_eq!(nic(&s.dev).qp_state(q), Some(QpState::Error));
    let (c, r) = s.run();
    // Every request, signaled or not, exactly once, in order, flushed.
    assert_eq!(c.len(), K as usize, "{c:?}");
    for (c, (cookie, op)) in c.iter().zip(&posted) {
        assert_err(c, *cookie, WcStatus::WrFlushErr, WR_FLUSH, q);
        assert_eq!(c.opcode, *op, "{c:?}");
    }
    // Every receive of the QP, flushed.
    let mine: Vec<_> = r.iter().filter(|r| r.qpn == q).collect();
    assert_eq!(mine.len(), 7, "{r:?}");
    for (j, r) in mine.iter().enumerate() {
        assert_err(r, 5000 + j as u64, WcStatus::WrFlushErr, WR_FLUSH, q);
        assert_eq!(r.opcode, WcOpcode::Recv);
    }
    // No byte moved.
    assert_eq!(bytes(&m, 0, 4096), vec![0; 4096]);
    // The queues are free again.
    assert_eq!(free_send(&mut s.a), 256);
    assert_eq!(free_recv(&mut s.a), 256);
    let st = nic(&s.dev).qp_stats(q).unwrap();
    assert_eq!(st.wqes, K);
    assert_eq!(st.recvs, 7);
    // Nothing more comes.
    s.run_expect(0, 0);
    // The responder of a pair is not in error (only `a` was moved there).
    if !loopback {
        assert_eq!(nic(&s.dev).qp_state(s.resp_qpn()), Some(QpState::Rts));
    }
}

#[test]
fn flush_everything_loopback() {
    flush_everything(true);
}

#[test]
fn flush_everything_pair() {
    flush_everything(false);
}

#[test]
fn flush_after_partial_progress() {
    // The first half runs; the second half is posted, then the QP goes to error: only the
    // second half is flushed, and the first half's unsignaled requests are never reported.
    let mut s = Setup::pair(QpCaps::default());
    let m = s.mr(4096, ALL);
    let q = s.a.qpn();
    for j in 0..10u64 {
        s.resp()
            .post_recv(&[m.sge(3900, 16).unwrap()], 7000 + j)
            .unwrap();
    }
    let first = post_mix(&mut s, &m, 30, 0);
    let (c, r) = s.run();
    let signaled: Vec<u64> = first.iter().map(|p| p.0).filter(|c| c % 3 == 0).collect();
    let got: Vec<u64> = c.iter().map(|c| c.cookie).collect();
    assert_eq!(got, signaled);
    assert!(c.iter().all(|c| c.is_ok()), "{c:?}");
    assert_eq!(r.len(), 5); // sends are every sixth request
    assert_eq!(m.read_u64(2048).unwrap(), 5); // five fetch-adds
                                              // Unsignaled WQEs after the last signaled one are not retired yet.
    let outstanding = 256 - free_send(&mut s.a);
    assert!(outstanding > 0);
    let second = post_mix(&mut s, &m, 30, 100);
    s.a.set_error().unwrap();
    let (c, _) = s.run();
    assert_eq!(c.len(), 30, "{c:?}");
    for (c, (cookie, op)) in c.iter().zip(&second) {
        assert_err(c, *cookie, WcStatus::WrFlushErr, WR_FLUSH, q);
        assert_eq!(c.opcode, *op);
    }
    assert_eq!(m.read_u64(2048).unwrap(), 5);
    assert_eq!(free_send(&mut s.a), 256);
    // The responder still holds its 5 unused receives; moving it to error flushes them.
    let rq = s.resp_qpn();
    assert_eq!(free_recv(s.resp()), 256 - 5);
    s.resp().set_error().unwrap();
    let (c, r) = s.run();
    assert!(c.is_empty());
    assert_eq!(r.len(), 5, "{r:?}");
    for (j, r) in r.iter().enumerate() {
        assert_err(r, 7005 + j as u64, WcStatus::WrFlushErr, WR_FLUSH, rq);
    }
    assert_eq!(free_recv(s.resp()), 256);
}

#[test]
fn flush_with_the_ring_full_and_wrapped() {
    // A 16-block ring filled across its end, then flushed: every cookie once.
    let caps = QpCaps {
        sq_blocks: 16,
        rq_entries: 16,
        ..QpCaps::default()
    };
    let mut s = Setup::loopback(caps);
    let m = s.mr(4096, ALL);
    let q = s.a.qpn();
    // Move the producer index to 13 first.
    for i in 0..13u64 {
        s.a.post(&Request::Nop, i, PostFlags::SIGNALED).unwrap();
    }
    s.run_expect(13, 0);
    let mut posted = Vec::new();
    let mut cookie = 100;
    loop {
        let flags = if cookie % 2 == 0 {
            PostFlags::SIGNALED
        } else {
            PostFlags::UNSIGNALED
        };
        match s
            .a
            .write_inline(&[7u8; 100], m.remote(0).unwrap(), cookie, flags)
        {
            Ok(()) => posted.push(cookie),
            Err(Error::QueueFull {
                needed: 3, free, ..
            }) => {
                assert!(free < 3);
                break;
            }
            Err(e) => panic!("{e:?}"),
        }
        cookie += 1;
    }
    assert_eq!(posted.len(), 5); // 5 x 3 blocks of 16
    for j in 0..16u64 {
        s.a.post_recv(&[m.sge(2000, 8).unwrap()], 900 + j).unwrap();
    }
    assert_eq!(free_recv(&mut s.a), 0);
    s.a.set_error().unwrap();
    let (c, r) = s.run();
    let got: Vec<u64> = c.iter().map(|c| c.cookie).collect();
    assert_eq!(got, posted);
    for c in &c {
        assert_err(c, c.cookie, WcStatus::WrFlushErr, WR_FLUSH, q);
    }
    let got: Vec<u64> = r.iter().map(|c| c.cookie).collect();
    assert_eq!(got, (900..916).collect::<Vec<_>>());
    assert_eq!(free_send(&mut s.a), 16);
    assert_eq!(free_recv(&mut s.a), 16);
    assert_eq!(bytes(&m, 0, 100), vec![0; 100]);
}

#[test]
fn set_error_before_anything_is_posted() {
    let mut s = Setup::pair(QpCaps::default());
    let m = s.mr(64, ALL);
    let q = s.a.qpn();
    s.a.set_error().unwrap();
    s.run_expect(0, 0);
    s.a.write_inline(b"x", m.remote(0).unwrap(), 1, PostFlags::UNSIGNALED)
        .unwrap();
    s.a.post_recv(&[m.sge(0, 8).unwrap()], 2).unwrap();
    let (c, r) = s.run_expect(1, 1);
    assert_err(&c[0], 1, WcStatus::WrFlushErr, WR_FLUSH, q);
    assert_err(&r[0], 2, WcStatus::WrFlushErr, WR_FLUSH, q);
    assert_eq!(bytes(&m, 0, 1), [0]);
}
