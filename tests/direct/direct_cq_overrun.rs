//! CQ overrun. The software NIC overruns a CQ exactly as a ConnectX does (CQ in error, the
//! QP whose completion did not fit in error, everything after lost) when a driver posts
//! more than the CQ holds; the crate's CQ accounting refuses such a post before anything is
//! written ([`Error::CqFull`]), on every path, so a QP can never stall that way.

use crate::common;

use blueflame::raw::{CompletionQueue, SendQueue};
use blueflame::*;
use common::*;
use mlx5::sim::{Nic, QpState};

fn small_cq_qp(cq_entries: u32) -> (Device, Pd, Cq, Qp, MemoryRegion) {
    let dev = Device::sim_stepped();
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(cq_entries).unwrap();
    let mut qp = pd.create_qp(&cq, &cq, QpCaps::default()).unwrap();
    let q = qp.endpoint().unwrap();
    qp.connect(&q).unwrap();
    let mr = pd
        .alloc_mr(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    (dev, pd, cq, qp, mr)
}

/// A driver without CQ accounting: raw queues over the software NIC's rings.
struct Raw {
    nic: Nic,
    sq: SendQueue,
    _cq: CompletionQueue,
    cqn: u32,
    qpn: u32,
    mr: mlx5::sim::MrInfo,
}

fn raw(cq_entries: u32) -> Raw {
    let nic = Nic::new();
    let pd = nic.alloc_pd();
    let rcq = nic.create_cq(cq_entries, 64).unwrap();
    let rqp = nic
        .create_qp(pd, rcq.cqn, rcq.cqn, mlx5::sim::QpCaps::default())
        .unwrap();
    nic.init_qp(rqp.qpn).unwrap();
    nic.connect(rqp.qpn, nic.path_to(rqp.qpn)).unwrap();
    let mr = nic
        .alloc_mr(pd, 4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    // SAFETY: the rings belong to the NIC's QP and CQ, which live as long as `nic` (in the
    // same struct, dropped after the queues) and which nothing else posts to or polls.
    let (sq, cq) = unsafe {
        (
            SendQueue::new(&rqp).unwrap(),
            CompletionQueue::new(&rcq).unwrap(),
        )
    };
    Raw {
        nic,
        sq,
        _cq: cq,
        cqn: rcq.cqn,
        qpn: rqp.qpn,
        mr,
    }
}

fn raw_bytes(mr: &mlx5::sim::MrInfo, n: usize) -> Vec<u8> {
    // SAFETY: the region is `mr.len` bytes owned by the NIC, alive, and the NIC is idle.
    unsafe { std::slice::from_raw_parts(mr.addr as *const u8, n) }.to_vec()
}

#[test]
fn the_nic_overruns_a_cq_as_a_connectx_when_a_driver_does_not_account() {
    let mut r = raw(4);
    let remote = |i: u64| Remote {
        addr: r.mr.addr + i,
        rkey: r.mr.rkey,
    };
    for i in 0..6u64 {
        let rm = remote(i);
        r.sq.write_inline(&[i as u8], rm, i, PostFlags::SIGNALED)
            .unwrap();
    }
    assert!(!r.nic.cq_overrun(r.cqn));
    r.nic.process();
    assert!(r.nic.cq_overrun(r.cqn));
    // The overrun puts the QP whose completion did not fit in error.
    assert_eq!(r.nic.qp_state(r.qpn), Some(QpState::Error));
    // The fifth write ran (its completion was lost); the sixth was flushed.
    assert_eq!(raw_bytes(&r.mr, 6), [0, 1, 2, 3, 4, 0]);
}

#[test]
fn a_post_that_could_overrun_the_cq_is_refused_before_anything_is_written() {
    // The case: a 64-entry CQ, default caps, 100 signaled writes without polling.
    // Before: 100 posts accepted, 36 completions lost, the QP in error, later posts never
    // completed.
    let (dev, _pd, mut cq, mut qp, mr) = small_cq_qp(64);
    let cqn = cq.cqn();
    let mut accepted = 0u64;
    let refused = loop {
        match qp.write_inline(
            &[1],
            mr.remote(accepted as usize).unwrap(),
            accepted,
            PostFlags::SIGNALED,
        ) {
            Ok(()) => accepted += 1,
            Err(e) => break e,
        }
        assert!(accepted <= 100);
    };
    assert_eq!(accepted, 64);
    assert!(
        matches!(
            refused,
            Error::CqFull {
                cqn: c,
                needed: 1,
                available: 0,
                capacity: 64,
            } if c == cqn
        ),
        "{refused}"
    );
    // Nothing of the refused request reached the ring.
    assert_eq!(free_send(&mut qp), 256 - 64);
    dev.process();
    assert!(!nic(&dev).cq_overrun(cqn));
    assert_eq!(nic(&dev).qp_stats(qp.qpn()).unwrap().wqes, 64);
    assert_eq!(bytes(&mr, 64, 1), [0]);
    let mut out = vec![Completion::default(); 128];
    assert_eq!(cq.poll(&mut out), 64);
    // The entries are back: the other 36 go through.
    for i in 64..100u64 {
        qp.write_inline(&[1], mr.remote(i as usize).unwrap(), i, PostFlags::SIGNALED)
            .unwrap();
    }
    dev.process();
    assert_eq!(cq.poll(&mut out[64..]), 36);
    for (i, c) in out[..100].iter().enumerate() {
        assert_ok(c, i as u64, WcOpcode::RdmaWrite, 0, qp.qpn());
    }
    assert_eq!(bytes(&mr, 0, 100), vec![1; 100]);
    assert!(!nic(&dev).cq_overrun(cqn));
    assert_eq!(nic(&dev).qp_state(qp.qpn()), Some(QpState::Rts));
}

#[test]
fn exactly_full_is_not_an_overrun() {
    let (dev, _pd, mut cq, mut qp, mr) = small_cq_qp(4);
    let cqn = cq.cqn();
    let mut out = [Completion::default(); 8];
    for round in 0..50u64 {
        for i in 0..4u64 {
            let cookie = round * 4 + i;
            qp.write_inline(
                &cookie.to_le_bytes(),
                mr.remote(0).unwrap(),
                cookie,
                PostFlags::SIGNALED,
            )
            .unwrap();
        }
        dev.process();
        assert!(!nic(&dev).cq_overrun(cqn), "round {round}");
        assert_eq!(cq.poll(&mut out), 4);
        for (i, c) in out[..4].iter().enumerate() {
            assert_ok(c, round * 4 + i as u64, WcOpcode::RdmaWrite, 0, qp.qpn());
        }
        assert_eq!(mr.read_u64(0).unwrap(), (round * 4 + 3).to_le());
    }
    assert_eq!(nic(&dev).qp_state(qp.qpn()), Some(QpState::Rts));
}

#[test]
fn unsignaled_requests_hold_entries_because_a_flush_completes_each_one() {
    // Four unsignaled writes fill a 4-entry CQ's accounting: after an error each of them
    // completes with its own flush entry, as on a ConnectX. Before: the fifth and later were
    // accepted, and the flush overran the CQ.
    let (dev, _pd, mut cq, mut qp, mr) = small_cq_qp(4);
    for i in 0..4u64 {
        qp.write_inline(
            &[1],
            mr.remote(i as usize).unwrap(),
            i,
            PostFlags::UNSIGNALED,
        )
        .unwrap();
    }
    let e = qp
        .write_inline(&[1], mr.remote(4).unwrap(), 4, PostFlags::UNSIGNALED)
        .unwrap_err();
    assert!(matches!(e, Error::CqFull { needed: 1, .. }), "{e}");
    qp.set_error().unwrap();
    dev.process();
    assert!(!nic(&dev).cq_overrun(cq.cqn()));
    let mut out = [Completion::default(); 8];
    assert_eq!(cq.poll(&mut out), 4);
    for (i, c) in out[..4].iter().enumerate() {
        assert_eq!((c.cookie, c.status), (i as u64, WcStatus::WrFlushErr));
    }
    assert_eq!(bytes(&mr, 0, 5), [0; 5]);
}

#[test]
fn an_unsignaled_stream_on_a_small_cq_progresses_by_polling() {
    // 104 writes, one in 4 signaled, on a 4-entry CQ: the poster meets CqFull and polls.
    let (dev, _pd, mut cq, mut qp, mr) = small_cq_qp(4);
    let mut out = [Completion::default(); 8];
    let mut seen = Vec::new();
    let mut i = 0u64;
    while i < 104 {
        let flags = if i % 4 == 3 {
            PostFlags::SIGNALED
        } else {
            PostFlags::UNSIGNALED
        };
        match qp.write_inline(&[1], mr.remote(i as usize).unwrap(), i, flags) {
            Ok(()) => i += 1,
            Err(Error::CqFull { .. }) => {
                dev.process();
                let n = cq.poll(&mut out);
                assert!(n > 0, "refused at {i} with nothing to poll");
                seen.extend(out[..n].iter().map(|c| c.cookie));
            }
            Err(e) => panic!("{e}"),
        }
    }
    dev.process();
    let n = cq.poll(&mut out);
    seen.extend(out[..n].iter().map(|c| c.cookie));
    assert_eq!(seen, (0..26).map(|k| 4 * k + 3).collect::<Vec<_>>());
    assert_eq!(bytes(&mr, 0, 104), vec![1; 104]);
    assert!(!nic(&dev).cq_overrun(cq.cqn()));
}

#[test]
fn receives_hold_entries_of_the_receive_cq() {
    // A responder whose CQ holds 2 entries cannot post a third receive. Before: accepted,
    // and the third send overran the CQ and put the responder in error.
    let dev = Device::sim_stepped();
    let pd = dev.alloc_pd().unwrap();
    let cq_a = dev.create_cq(64).unwrap();
    let mut cq_b = dev.create_cq(2).unwrap();
    let mut a = pd.create_qp(&cq_a, &cq_a, QpCaps::default()).unwrap();
    let mut b = pd.create_qp(&cq_b, &cq_b, QpCaps::default()).unwrap();
    a.connect(&b.endpoint().unwrap()).unwrap();
    b.connect(&a.endpoint().unwrap()).unwrap();
    let rbuf = pd.alloc_mr(256, Access::LOCAL_WRITE).unwrap();
    for j in 0..2u64 {
        b.post_recv(&[rbuf.sge(j as usize * 64, 64).unwrap()], j)
            .unwrap();
    }
    let e = b.post_recv(&[rbuf.sge(128, 64).unwrap()], 2).unwrap_err();
    assert!(
        matches!(
            e,
            Error::CqFull {
                needed: 1,
                capacity: 2,
                ..
            }
        ),
        "{e}"
    );
    for i in 0..2u64 {
        a.send(Payload::Inline(&[i as u8 + 1]), i, PostFlags::SIGNALED)
            .unwrap();
    }
    dev.process();
    assert!(!nic(&dev).cq_overrun(cq_b.cqn()));
    assert_eq!(nic(&dev).qp_state(b.qpn()), Some(QpState::Rts));
    let mut out = [Completion::default(); 4];
    assert_eq!(cq_b.poll(&mut out), 2);
    assert_eq!((out[0].cookie, out[1].cookie), (0, 1));
    // Polled: the third receive fits now.
    b.post_recv(&[rbuf.sge(128, 64).unwrap()], 2).unwrap();
}

#[test]
fn qps_sharing_a_cq_never_overrun_it() {
    let dev = Device::sim_stepped();
    let pd = dev.alloc_pd().unwrap();
    let mut cq = dev.create_cq(16).unwrap();
    let mr = pd.alloc_mr(4096, common::ALL).unwrap();
    let mut qps: Vec<Qp> = (0..3)
        .map(|_| {
            let mut qp = pd.create_qp(&cq, &cq, QpCaps::default()).unwrap();
            let q = qp.endpoint().unwrap();
            qp.connect(&q).unwrap();
            qp
        })
        .collect();
    let mut out = [Completion::default(); 32];
    for round in 0..5u64 {
        // Round robin until every QP is refused.
        let mut accepted = 0;
        let mut refused = [false; 3];
        while !refused.iter().all(|&r| r) {
            for (k, qp) in qps.iter_mut().enumerate() {
                if refused[k] {
                    continue;
                }
                match qp.write_inline(&[1], mr.remote(k).unwrap(), round, PostFlags::SIGNALED) {
                    Ok(()) => accepted += 1,
                    Err(Error::CqFull { capacity: 16, .. }) => refused[k] = true,
                    Err(e) => panic!("{e}"),
                }
            }
        }
        assert_eq!(accepted, 16, "round {round}");
        dev.process();
        assert!(!nic(&dev).cq_overrun(cq.cqn()), "round {round}");
        assert_eq!(cq.poll(&mut out), 16);
        assert!(out[..16].iter().all(|c| c.is_ok() && c.cookie == round));
    }
}

#[test]
fn the_entries_of_a_dropped_qp_come_back() {
    // A QP dropped with 8 requests outstanding on an 8-entry CQ: once the CQ is seen
    // drained (a destroyed QP's requests produce no completion), another QP gets them.
    let dev = Device::sim_stepped();
    let pd = dev.alloc_pd().unwrap();
    let mut cq = dev.create_cq(8).unwrap();
    let mr = pd.alloc_mr(4096, common::ALL).unwrap();
    let mut a = pd.create_qp(&cq, &cq, QpCaps::default()).unwrap();
    let q = a.endpoint().unwrap();
    a.connect(&q).unwrap();
    for i in 0..8u64 {
        a.write_inline(&[1], mr.remote(0).unwrap(), i, PostFlags::SIGNALED)
            .unwrap();
    }
    drop(a);
    let mut b = pd.create_qp(&cq, &cq, QpCaps::default()).unwrap();
    let q = b.endpoint().unwrap();
    b.connect(&q).unwrap();
    for i in 0..8u64 {
        b.write_inline(&[2], mr.remote(1).unwrap(), 100 + i, PostFlags::SIGNALED)
            .unwrap();
    }
    dev.process();
    let mut out = [Completion::default(); 16];
    assert_eq!(cq.poll(&mut out), 8);
    assert!(out[..8].iter().all(|c| c.is_ok() && c.qpn == q.qpn));
    assert!(!nic(&dev).cq_overrun(cq.cqn()));
}
