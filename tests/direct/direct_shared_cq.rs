//! Completions of several QPs on one CQ, split send and receive CQs, QPs created after the
//! CQ was first polled, and QPs dropped while their completions wait: every completion is
//! attributed to its QP and cookie.

use crate::common;

use blueflame::*;
use common::*;

#[test]
fn three_qps_on_one_cq() {
    let dev = Device::sim_stepped();
    let pd = dev.alloc_pd().unwrap();
    let mut cq = dev.create_cq(1024).unwrap();
    let mut a = pd.create_qp(&cq, &cq, QpCaps::default()).unwrap();
    let mut b = pd.create_qp(&cq, &cq, QpCaps::default()).unwrap();
    let mut c = pd.create_qp(&cq, &cq, QpCaps::default()).unwrap();
    a.connect(&b.endpoint().unwrap()).unwrap();
    b.connect(&a.endpoint().unwrap()).unwrap();
    let cq_ = c.endpoint().unwrap();
    c.connect(&cq_).unwrap();
    let m = pd.alloc_mr(8192, common::ALL).unwrap();
    let mut expect = std::collections::HashMap::<u32, Vec<(u64, WcOpcode)>>::new();
    for i in 0..300u64 {
        match i % 5 {
            0 => {
                a.write_inline(
                    &i.to_le_bytes(),
                    m.remote(8 * (i as usize % 128)).unwrap(),
                    i,
                    PostFlags::SIGNALED,
                )
                .unwrap();
                expect
                    .entry(a.qpn())
                    .or_default()
                    .push((i, WcOpcode::RdmaWrite));
            }
            1 => {
                b.write_inline(
                    &i.to_le_bytes(),
                    m.remote(1024 + 8 * (i as usize % 128)).unwrap(),
                    i,
                    PostFlags::SIGNALED,
                )
                .unwrap();
                expect
                    .entry(b.qpn())
                    .or_default()
                    .push((i, WcOpcode::RdmaWrite));
            }
            2 => {
                c.fetch_add(
                    m.remote(4096).unwrap(),
                    1,
                    m.sge(4104, 8).unwrap(),
                    i,
                    PostFlags::SIGNALED,
                )
                .unwrap();
                expect
                    .entry(c.qpn())
                    .or_default()
                    .push((i, WcOpcode::FetchAdd));
            }
            3 => {
                // a sends to b: b's receive completes on the same CQ.
                b.post_recv(&[m.sge(5000, 16).unwrap()], 10_000 + i)
                    .unwrap();
                a.send(Payload::Inline(&i.to_le_bytes()), i, PostFlags::SIGNALED)
                    .unwrap();
                expect.entry(a.qpn()).or_default().push((i, WcOpcode::Send));
                expect
                    .entry(b.qpn())
                    .or_default()
                    .push((10_000 + i, WcOpcode::Recv));
            }
            _ => {
                c.post(&Request::Nop, i, PostFlags::SIGNALED).unwrap();
                expect.entry(c.qpn()).or_default().push((i, WcOpcode::Nop));
            }
        }
        if i % 37 == 36 {
            dev.process();
        }
    }
    dev.process();
    let all = poll_all(&mut cq);
    assert_eq!(all.len(), 300 + 60);
    for (qpn, want) in &expect {
        // Per QP, the requester side and the receive side are each in order (the NIC runs
        // QP by QP, so the two sides interleave differently from the posting order).
        let got: Vec<(u64, WcOpcode)> = all
            .iter()
            .filter(|c| c.qpn == *qpn && !is_recv(c))
            .map(|c| {
                assert!(c.is_ok(), "{c:?}");
                (c.cookie, c.opcode)
            })
            .collect();
        let got_recv: Vec<(u64, WcOpcode)> = all
            .iter()
            .filter(|c| c.qpn == *qpn && is_recv(c))
            .map(|c| (c.cookie, c.opcode))
            .collect();
        let (want_recv, want_send): (Vec<_>, Vec<_>) =
            want.iter().partition(|w| w.1 == WcOpcode::Recv);
        assert_eq!(got, want_send, "QP {qpn:#x}");
        assert_eq!(got_recv, want_recv, "QP {qpn:#x}");
    }
    assert_eq!(m.read_u64(4096).unwrap(), 60);
    assert_eq!(free_send(&mut a), 256);
    assert_eq!(free_send(&mut b), 256);
    assert_eq!(free_send(&mut c), 256);
    assert_eq!(free_recv(&mut b), 256);
}

#[test]
fn separate_send_and_receive_cqs() {
    let dev = Device::sim_stepped();
    let pd = dev.alloc_pd().unwrap();
    let mut scq = dev.create_cq(64).unwrap();
    let mut rcq = dev.create_cq(64).unwrap();
    let mut a = pd.create_qp(&scq, &rcq, QpCaps::default()).unwrap();
    let q = a.endpoint().unwrap();
    a.connect(&q).unwrap();
    let m = pd.alloc_mr(4096, common::ALL).unwrap();
    for i in 0..10u64 {
        a.post_recv(&[m.sge(i as usize * 64, 64).unwrap()], 100 + i)
            .unwrap();
    }
    for i in 0..10u64 {
        a.send(Payload::Inline(&[i as u8; 10]), i, PostFlags::SIGNALED)
            .unwrap();
        a.write_imm(
            Payload::Inline(&[]),
            m.remote(0).unwrap(),
            i as u32,
            50 + i,
            PostFlags::UNSIGNALED,
        )
        .unwrap();
    }
    // 20 messages need 20 receives: post 10 more before the NIC runs.
    for i in 10..20u64 {
        a.post_recv(
            &[m.sge(1024 + (i as usize - 10) * 64, 64).unwrap()],
            100 + i,
        )
        .unwrap();
    }
    dev.process();
    let s = poll_all(&mut scq);
    let r = poll_all(&mut rcq);
    let sc: Vec<u64> = s.iter().map(|c| c.cookie).collect();
    assert_eq!(sc, (0..10).collect::<Vec<_>>());
    assert!(s.iter().all(|c| c.opcode == WcOpcode::Send && c.is_ok()));
    assert_eq!(r.len(), 20);
    for (k, c) in r.iter().enumerate() {
        assert_eq!(c.cookie, 100 + k as u64);
        assert!(c.is_ok());
        assert_eq!(c.qpn, q.qpn);
        if k % 2 == 0 {
            assert_eq!((c.opcode, c.byte_len, c.imm), (WcOpcode::Recv, 10, None));
        } else {
            assert_eq!(
                (c.opcode, c.byte_len, c.imm),
                (WcOpcode::RecvRdmaWithImm, 0, Some(k as u32 / 2))
            );
        }
    }
    for i in 0..5usize {
        assert_eq!(bytes(&m, 2 * i * 64, 10), vec![i as u8; 10]);
    }
    // The last WQE (an unsignaled write) has no signaled WQE after it: its block stays in use.
    assert_eq!(free_send(&mut a), 255);
    assert_eq!(free_recv(&mut a), 256);
}

#[test]
fn qp_created_after_the_cq_was_polled() {
    let dev = Device::sim_stepped();
    let pd = dev.alloc_pd().unwrap();
    let mut cq = dev.create_cq(64).unwrap();
    let m = pd.alloc_mr(64, common::ALL).unwrap();
    let mut out = [Completion::default(); 8];
    let mut qps = Vec::new();
    for k in 0..5u64 {
        // The poller has seen every earlier QP; this one is new to it.
        let mut qp = pd.create_qp(&cq, &cq, QpCaps::default()).unwrap();
        let q = qp.endpoint().unwrap();
        qp.connect(&q).unwrap();
        qp.write_inline(
            &[k as u8],
            m.remote(k as usize).unwrap(),
            k,
            PostFlags::SIGNALED,
        )
        .unwrap();
        dev.process();
        assert_eq!(cq.poll(&mut out), 1, "QP {k}");
        assert_ok(&out[0], k, WcOpcode::RdmaWrite, 0, q.qpn);
        qps.push(qp);
    }
    assert_eq!(bytes(&m, 0, 5), [0, 1, 2, 3, 4]);
}

#[test]
fn dropping_a_qp_leaves_the_others_completions_intact() {
    let dev = Device::sim_stepped();
    let pd = dev.alloc_pd().unwrap();
    let mut cq = dev.create_cq(256).unwrap();
    let m = pd.alloc_mr(4096, common::ALL).unwrap();
    let mut keep = pd.create_qp(&cq, &cq, QpCaps::default()).unwrap();
    let mut gone = pd.create_qp(&cq, &cq, QpCaps::default()).unwrap();
    let (k, g) = (keep.endpoint().unwrap(), gone.endpoint().unwrap());
    keep.connect(&k).unwrap();
    gone.connect(&g).unwrap();
    for i in 0..20u64 {
        keep.write_inline(b"k", m.remote(0).unwrap(), i, PostFlags::SIGNALED)
            .unwrap();
        gone.write_inline(b"g", m.remote(1).unwrap(), 100 + i, PostFlags::SIGNALED)
            .unwrap();
    }
    dev.process();
    drop(gone);
    let all = poll_all(&mut cq);
    // The dropped QP's completions are not reported (nothing to attribute them to);
    // the other QP's all are, in order.
    assert!(all.iter().all(|c| c.qpn == k.qpn), "{all:?}");
    let cookies: Vec<u64> = all.iter().map(|c| c.cookie).collect();
    assert_eq!(cookies, (0..20).collect::<Vec<_>>());
    assert_eq!(free_send(&mut keep), 256);
    // The CQ keeps working.
    keep.write_inline(b"K", m.remote(0).unwrap(), 99, PostFlags::SIGNALED)
        .unwrap();
    dev.process();
    let all = poll_all(&mut cq);
    assert_eq!(all.len(), 1);
    assert_ok(&all[0], 99, WcOpcode::RdmaWrite, 0, k.qpn);
    assert_eq!(bytes(&m, 0, 2), b"Kg");
}

#[test]
fn poll_n_runs_the_stepped_nic() {
    let mut s = Setup::loopback(QpCaps::default());
    let m = s.mr(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    for i in 0..10u64 {
        s.a.write_inline(
            &[i as u8],
            m.remote(i as usize).unwrap(),
            i,
            PostFlags::SIGNALED,
        )
        .unwrap();
    }
    let mut out = [Completion::default(); 16];
    assert_eq!(s.cq_a.poll_n(&mut out, 10, 100), 10);
    for (i, c) in out[..10].iter().enumerate() {
        assert_ok(c, i as u64, WcOpcode::RdmaWrite, 0, s.a.qpn());
    }
    // Nothing more: gives up after the spins.
    assert_eq!(s.cq_a.poll_n(&mut out, 1, 10), 0);
}

#[test]
fn poll_into_a_short_array_keeps_the_rest() {
    let mut s = Setup::loopback(QpCaps::default());
    for i in 0..10u64 {
        s.a.post(&Request::Nop, i, PostFlags::SIGNALED).unwrap();
    }
    s.dev.process();
    let mut out = [Completion::default(); 3];
    assert_eq!(s.cq_a.poll(&mut out[..0]), 0);
    let mut got = Vec::new();
    loop {
        let n = s.cq_a.poll(&mut out);
        if n == 0 {
            break;
        }
        assert!(n <= 3);
        got.extend(out[..n].iter().map(|c| c.cookie));
    }
    assert_eq!(got, (0..10).collect::<Vec<_>>());
}
