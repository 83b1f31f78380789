//! CQ overrun: more completions than a small CQ holds, without polling, is detected by the
//! NIC; polling in time avoids it.

mod common;

use blueflame::*;
use common::*;
use mlx5::sim::QpState;

fn small_cq_qp(cq_entries: u32) -> (Device, Pd, Cq, Qp, MemoryRegion) {
    let dev = Device::sim_stepped();
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(cq_entries).unwrap();
    let mut qp = pd.create_qp(&cq, &cq, QpCaps::default()).unwrap();
    let q = qp.qpn();
    qp.connect(q).unwrap();
    let mr = pd
        .alloc_mr(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    (dev, pd, cq, qp, mr)
}

#[test]
fn overrun_when_more_signaled_wqes_than_entries() {
    let (dev, _pd, mut cq, mut qp, mr) = small_cq_qp(4);
    assert_eq!(cq.capacity(), 4);
    let cqn = cq.cqn();
    for i in 0..6u64 {
        qp.write_inline(
            &[i as u8],
            mr.remote(i as usize).unwrap(),
            i,
            PostFlags::SIGNALED,
        )
        .unwrap();
    }
    assert!(!nic(&dev).cq_overrun(cqn));
    dev.process();
    assert!(nic(&dev).cq_overrun(cqn));
    // The overrun puts the QP whose completion did not fit in error.
    assert_eq!(nic(&dev).qp_state(qp.qpn()), Some(QpState::Error));
    // The four entries that fit are there, in order.
    let mut out = [Completion::default(); 8];
    let n = cq.poll(&mut out);
    assert_eq!(n, 4, "{:?}", &out[..n]);
    for (i, c) in out[..4].iter().enumerate() {
        assert_ok(c, i as u64, WcOpcode::RdmaWrite, 0, qp.qpn());
    }
    // The fifth write ran (its completion was lost); the sixth was flushed.
    assert_eq!(bytes(&mr, 0, 6), [0, 1, 2, 3, 4, 0]);
    // The CQ stays in error: later completions are dropped too.
    dev.process();
    assert!(nic(&dev).cq_overrun(cqn));
    assert_eq!(cq.poll(&mut out), 0);
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
fn unsignaled_wqes_take_no_cq_entries() {
    // 100 unsignaled and 4 signaled writes on a 4-entry CQ: no overrun (moderation stays
    // below half the 256-block ring, so the driver adds no completion of its own).
    let (dev, _pd, mut cq, mut qp, mr) = small_cq_qp(4);
    for i in 0..104u64 {
        let flags = if i % 26 == 25 {
            PostFlags::SIGNALED
        } else {
            PostFlags::UNSIGNALED
        };
        qp.write_inline(&[1], mr.remote(i as usize).unwrap(), i, flags)
            .unwrap();
    }
    dev.process();
    assert!(!nic(&dev).cq_overrun(cq.cqn()));
    let mut out = [Completion::default(); 8];
    assert_eq!(cq.poll(&mut out), 4);
    let cookies: Vec<u64> = out[..4].iter().map(|c| c.cookie).collect();
    assert_eq!(cookies, [25, 51, 77, 103]);
    assert_eq!(bytes(&mr, 0, 104), vec![1; 104]);
}

#[test]
fn receive_completions_overrun_the_receive_cq() {
    // Sends on a pair whose responder's CQ holds 2 entries.
    let dev = Device::sim_stepped();
    let pd = dev.alloc_pd().unwrap();
    let cq_a = dev.create_cq(64).unwrap();
    let mut cq_b = dev.create_cq(2).unwrap();
    let mut a = pd.create_qp(&cq_a, &cq_a, QpCaps::default()).unwrap();
    let mut b = pd.create_qp(&cq_b, &cq_b, QpCaps::default()).unwrap();
    a.connect(b.qpn()).unwrap();
    let rbuf = pd.alloc_mr(256, Access::LOCAL_WRITE).unwrap();
    for j in 0..3u64 {
        b.post_recv(&[rbuf.sge(j as usize * 64, 64).unwrap()], j)
            .unwrap();
    }
    for i in 0..3u64 {
        a.send(Payload::Inline(&[i as u8 + 1]), i, PostFlags::SIGNALED)
            .unwrap();
    }
    dev.process();
    assert!(nic(&dev).cq_overrun(cq_b.cqn()));
    assert!(!nic(&dev).cq_overrun(cq_a.cqn()));
    assert_eq!(nic(&dev).qp_state(b.qpn()), Some(QpState::Error));
    let mut out = [Completion::default(); 4];
    assert_eq!(cq_b.poll(&mut out), 2);
    assert_eq!((out[0].cookie, out[1].cookie), (0, 1));
    drop(b);
}
