//! QP teardown on a direct-path CQ: entries a dropped QP left in its CQs are never taken for
//! those of a later QP that gets the same QP number (a software NIC with room for one QP
//! number hands the dropped QP's number to the next QP at once).

use crate::common;

use blueflame::*;
use common::*;
use mlx5::sim::Limits;

/// One QP number: every new QP gets the number of the one dropped before it.
const ONE_QPN: Limits = Limits {
    keys: 0xff_ffff,
    qps: 1,
    cqs: 64,
};

/// A loopback QP on `cq` (sends and receives), connected.
fn loopback(pd: &Pd, cq: &Cq, caps: QpCaps) -> Qp {
    let mut qp = pd.create_qp(cq, cq, caps).unwrap();
    let q = qp.endpoint().unwrap();
    qp.connect(&q).unwrap();
    qp
}

fn all_polled(dev: &Device, cq: &mut Cq) -> Vec<Completion> {
    dev.process();
    poll_all(cq)
}

#[test]
fn a_reused_qp_number_sees_only_its_own_completions() {
    let dev = Device::sim_with(ONE_QPN, blueflame::UarConfig::default(), false);
    let pd = dev.alloc_pd().unwrap();
    let mut cq = dev.create_cq(256).unwrap();
    let mr = pd.alloc_mr(4096, ALL).unwrap();
    let caps = QpCaps::default();

    // QP A: signaled writes, a send into its own receive, and a receive left over; the NIC
    // runs them all (their CQEs are in the CQ), then A is dropped before any is polled.
    let mut a = loopback(&pd, &cq, caps);
    let qpn = a.qpn();
    a.post_recv(&[mr.sge(0, 64).unwrap()], 900).unwrap();
    a.post_recv(&[mr.sge(64, 64).unwrap()], 901).unwrap();
    for i in 0..6u64 {
        a.write_inline(b"old", mr.remote(512).unwrap(), 10 + i, PostFlags::SIGNALED)
            .unwrap();
    }
    a.send(Payload::Inline(b"to myself"), 16, PostFlags::SIGNALED)
        .unwrap();
    dev.process();
    drop(a);

    // QP B gets the same number, posts on the same CQ.
    let mut b = loopback(&pd, &cq, caps);
    assert_eq!(b.qpn(), qpn, "the software NIC reuses the number");
    let full = b.free_send();
    b.post_recv(&[mr.sge(128, 64).unwrap()], 950).unwrap();
    for i in 0..3u64 {
        b.write_inline(
            b"new",
            mr.remote(600).unwrap(),
            100 + i,
            PostFlags::SIGNALED,
        )
        .unwrap();
    }
    b.send(Payload::Inline(b"hello B"), 103, PostFlags::SIGNALED)
        .unwrap();
    let got = all_polled(&dev, &mut cq);
    let cookies: Vec<(u64, WcStatus)> = got.iter().map(|c| (c.cookie, c.status)).collect();
    assert_eq!(
        cookies,
        [
            (100, WcStatus::Success),
            (101, WcStatus::Success),
            (102, WcStatus::Success),
            (950, WcStatus::Success),
            (103, WcStatus::Success),
        ],
        "exactly B's completions: {got:?}"
    );
    assert!(got.iter().all(|c| c.qpn == qpn));
    assert_eq!(bytes(&mr, 128, 7), b"hello B");
    assert_eq!(
        b.free_send(),
        full,
        "B's blocks retire with B's completions only"
    );

    // B keeps working, on the fast path too, around the ring.
    for round in 0..300u64 {
        b.write_inline(
            b"x",
            mr.remote(700).unwrap(),
            1000 + round,
            PostFlags::SIGNALED,
        )
        .unwrap();
        let got = all_polled(&dev, &mut cq);
        assert_eq!(got.len(), 1, "round {round}: {got:?}");
        assert_eq!(
            (got[0].cookie, got[0].status),
            (1000 + round, WcStatus::Success)
        );
    }
    assert_eq!(b.free_send(), full);
}

#[test]
fn a_reused_qp_number_is_not_taken_for_the_receive_fast_paths_last_qp() {
    // The poller's receive fast path remembers the QP whose receive completed last; after
    // that QP is dropped and its number handed to another, an entry the old QP left (a
    // receive of 8 bytes, scatter-to-CQE: the quick copy) must not be taken for it.
    let dev = Device::sim_with(ONE_QPN, blueflame::UarConfig::default(), false);
    let pd = dev.alloc_pd().unwrap();
    let mut cq = dev.create_cq(256).unwrap();
    let mr = pd.alloc_mr(4096, ALL).unwrap();
    let caps = QpCaps::default();

    let mut a = loopback(&pd, &cq, caps);
    let qpn = a.qpn();
    for k in 0..2u64 {
        a.post_recv(&[mr.sge(64 * k as usize, 64).unwrap()], 900 + k)
            .unwrap();
        a.send(Payload::Inline(b"8 bytes!"), 10 + k, PostFlags::UNSIGNALED)
            .unwrap();
    }
    dev.process();
    // A's first receive, polled: the fast path now knows A.
    let mut one = [Completion::default(); 1];
    assert_eq!(cq.poll(&mut one), 1);
    assert_eq!((one[0].cookie, one[0].opcode), (900, WcOpcode::Recv));
    // A's second receive is still in the CQ when A goes.
    drop(a);
    fill(&mr, 0);

    let mut b = loopback(&pd, &cq, caps);
    assert_eq!(b.qpn(), qpn, "the software NIC reuses the number");
    b.post_recv(&[mr.sge(256, 64).unwrap()], 950).unwrap();
    b.send(Payload::Inline(b"B's 8 b."), 20, PostFlags::UNSIGNALED)
        .unwrap();
    let got = all_polled(&dev, &mut cq);
    let cookies: Vec<u64> = got.iter().map(|c| c.cookie).collect();
    assert_eq!(cookies, [950], "only B's receive: {got:?}");
    assert_eq!(bytes(&mr, 256, 8), b"B's 8 b.");
    assert_eq!(
        bytes(&mr, 64, 8),
        [0; 8],
        "nothing copied for A's dropped receive"
    );
}

#[test]
fn separate_send_and_receive_cqs_are_both_cleaned() {
    let dev = Device::sim_with(ONE_QPN, blueflame::UarConfig::default(), false);
    let pd = dev.alloc_pd().unwrap();
    let mut scq = dev.create_cq(64).unwrap();
    let mut rcq = dev.create_cq(64).unwrap();
    let mr = pd.alloc_mr(4096, ALL).unwrap();
    let caps = QpCaps::default();
    let mk = || {
        let mut qp = pd.create_qp(&scq, &rcq, caps).unwrap();
        let q = qp.endpoint().unwrap();
        qp.connect(&q).unwrap();
        qp
    };
    let mut a = mk();
    let qpn = a.qpn();
    for i in 0..4u64 {
        a.post_recv(&[mr.sge(0, 64).unwrap()], 500 + i).unwrap();
        a.send(Payload::Inline(b"a"), i, PostFlags::SIGNALED)
            .unwrap();
    }
    // One more receive, flushed when A goes to error before it is dropped.
    a.post_recv(&[mr.sge(0, 64).unwrap()], 599).unwrap();
    dev.process();
    a.set_error().unwrap();
    dev.process();
    drop(a);
    let mut b = mk();
    assert_eq!(b.qpn(), qpn);
    b.post_recv(&[mr.sge(256, 64).unwrap()], 700).unwrap();
    b.send(Payload::Inline(b"b"), 70, PostFlags::SIGNALED)
        .unwrap();
    dev.process();
    let sends = poll_all(&mut scq);
    let recvs = poll_all(&mut rcq);
    assert_eq!(
        sends
            .iter()
            .map(|c| (c.cookie, c.status))
            .collect::<Vec<_>>(),
        [(70, WcStatus::Success)],
        "{sends:?}"
    );
    assert_eq!(
        recvs
            .iter()
            .map(|c| (c.cookie, c.status))
            .collect::<Vec<_>>(),
        [(700, WcStatus::Success)],
        "{recvs:?}"
    );
    assert_eq!(bytes(&mr, 256, 1), b"b");
    assert_eq!(b.free_recv(), QpCaps::default().rq_entries);
}

#[test]
fn a_qp_dropped_after_its_completions_were_polled_leaves_nothing_behind() {
    // The tombstone covers nothing: later QPs of that number run the fast path at once.
    let dev = Device::sim_with(ONE_QPN, blueflame::UarConfig::default(), false);
    let pd = dev.alloc_pd().unwrap();
    let mut cq = dev.create_cq(16).unwrap();
    let mr = pd.alloc_mr(4096, ALL).unwrap();
    for gen in 0..40u64 {
        let mut qp = loopback(&pd, &cq, QpCaps::default());
        for i in 0..3 {
            qp.write_inline(
                b"z",
                mr.remote(0).unwrap(),
                gen * 10 + i,
                PostFlags::SIGNALED,
            )
            .unwrap();
        }
        // Drop some with their completions unpolled, some after polling them.
        if gen % 2 == 0 {
            let got = all_polled(&dev, &mut cq);
            let cookies: Vec<u64> = got.iter().map(|c| c.cookie).collect();
            assert_eq!(cookies, [gen * 10, gen * 10 + 1, gen * 10 + 2], "gen {gen}");
        } else {
            dev.process();
        }
        drop(qp);
        assert!(all_polled(&dev, &mut cq).is_empty(), "gen {gen}");
    }
}

#[test]
fn teardown_while_the_nic_thread_runs() {
    // The NIC writes CQEs from its own thread while the QP is dropped: whatever A's WQEs
    // produced before the destroy is discarded, B's completions all arrive, once each.
    let dev = Device::sim_with(ONE_QPN, blueflame::UarConfig::default(), true);
    let pd = dev.alloc_pd().unwrap();
    let mut cq = dev.create_cq(1024).unwrap();
    let mr = pd.alloc_mr(4096, ALL).unwrap();
    for round in 0..20u64 {
        let mut a = loopback(&pd, &cq, QpCaps::default());
        let qpn = a.qpn();
        for i in 0..50u64 {
            a.write_inline(b"a", mr.remote(0).unwrap(), i, PostFlags::SIGNALED)
                .unwrap();
        }
        drop(a);
        let mut b = loopback(&pd, &cq, QpCaps::default());
        assert_eq!(b.qpn(), qpn);
        let base = 1_000_000 * (round + 1);
        for i in 0..10u64 {
            b.write_inline(b"b", mr.remote(8).unwrap(), base + i, PostFlags::SIGNALED)
                .unwrap();
        }
        let mut got = Vec::new();
        let mut out = [Completion::default(); 16];
        let start = std::time::Instant::now();
        while got.len() < 10 && start.elapsed() < std::time::Duration::from_secs(20) {
            let n = cq.poll(&mut out);
            got.extend(out[..n].iter().map(|c| (c.cookie, c.status)));
        }
        let want: Vec<(u64, WcStatus)> = (0..10).map(|i| (base + i, WcStatus::Success)).collect();
        assert_eq!(got, want, "round {round}");
        drop(b);
        assert_eq!(cq.poll(&mut out), 0, "round {round}: nothing else");
    }
}
