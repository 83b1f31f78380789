//! Counters past 16 bits on the queues other tests drive only a short way: an SRQ's, a UD
//! QP's and a DCI's rings through 70,000 requests, and a parked region's mark against a
//! send queue's positions however far it ran.

use blueflame::*;

const N: u64 = 70_000;

fn drain(dev: &Device, cq: &mut Cq, want: usize) -> Vec<Completion> {
    let mut got = Vec::new();
    let mut out = [Completion::default(); 32];
    for _ in 0..1_000_000 {
        let k = cq.poll(&mut out);
        got.extend_from_slice(&out[..k]);
        if got.len() >= want {
            break;
        }
        if k == 0 {
            dev.process();
        }
    }
    got
}

/// An SRQ of 16 entries: 70,000 sends received through it (the doorbell counter, the
/// freed count and the reclaimed count all pass 0xffff), every cookie in order.
#[test]
fn srq_counters_wrap() {
    let dev = Device::sim_stepped();
    let pd = dev.alloc_pd().unwrap();
    let mut rcq = dev.create_cq(64).unwrap();
    let mut scq = dev.create_cq(64).unwrap();
    let mut srq = pd
        .create_srq(
            &rcq,
            SrqCaps {
                entries: 15,
                max_sge: 1,
            },
        )
        .unwrap();
    let mut s = pd
        .create_qp_with_srq(&scq, &srq, QpCaps::default())
        .unwrap();
    let mut c = pd.create_qp(&scq, &scq, QpCaps::default()).unwrap();
    let (es, ec) = (s.endpoint().unwrap(), c.endpoint().unwrap());
    s.connect(&ec).unwrap();
    c.connect(&es).unwrap();
    let mr = pd.alloc_mr(4096, Access::LOCAL_WRITE).unwrap();
    let mut next_recv = 0u64;
    let mut next_done = 0u64;
    let mut sent = 0u64;
    while next_done < N {
        while srq
            .post_recv(
                &[mr.sge((next_recv as usize % 16) * 64, 64).unwrap()],
                next_recv,
            )
            .is_ok()
        {
            next_recv += 1;
        }
        let mut k = 0;
        while k < 8 && sent < next_recv {
            let data = (sent as u32).to_le_bytes();
            match c.send(Payload::Inline(&data[..]), sent, PostFlags::UNSIGNALED) {
                Ok(()) => {
                    sent += 1;
                    k += 1;
                }
                Err(Error::CqFull { .. } | Error::QueueFull { .. }) => break,
                Err(e) => panic!("{e}"),
            }
        }
        dev.process();
        let mut out = [Completion::default(); 32];
        while scq.poll(&mut out) > 0 {}
        let n = rcq.poll(&mut out);
        for cpl in &out[..n] {
            assert_eq!(cpl.status, WcStatus::Success, "{cpl:?}");
            assert_eq!(cpl.cookie, next_done, "{cpl:?}");
            next_done += 1;
        }
    }
    let _ = (&mut s, drain(&dev, &mut scq, 0));
}

/// UD: 70,000 datagrams, each received, sender and receiver rings past 0xffff.
#[test]
fn ud_counters_wrap() {
    let dev = Device::sim_stepped();
    let pd = dev.alloc_pd().unwrap();
    let mut cq_a = dev.create_cq(64).unwrap();
    let mut cq_b = dev.create_cq(64).unwrap();
    let caps = QpCaps {
        sq_blocks: 16,
        rq_entries: 16,
        ..QpCaps::default()
    };
    let mut a = pd.create_ud_qp(&cq_a, &cq_a, caps, 1).unwrap();
    let mut b = pd.create_ud_qp(&cq_b, &cq_b, caps, 1).unwrap();
    let eb = b.endpoint();
    let ah = pd.create_ah(eb).unwrap();
    let mr = pd.alloc_mr(1 << 14, Access::LOCAL_WRITE).unwrap();
    let (mut posted_r, mut got, mut sent) = (0u64, 0u64, 0u64);
    let mut out = [Completion::default(); 32];
    while got < N {
        while b
            .post_recv(
                &[mr.sge((posted_r as usize % 16) * 128, 128).unwrap()],
                posted_r,
            )
            .is_ok()
        {
            posted_r += 1;
        }
        while sent < posted_r {
            let f = if sent % 5 == 0 {
                PostFlags::SIGNALED
            } else {
                PostFlags::UNSIGNALED
            };
            match a.send_to(
                &ah,
                eb.qpn,
                eb.qkey,
                Payload::Inline(&sent.to_le_bytes()),
                sent,
                f,
            ) {
                Ok(()) => sent += 1,
                Err(Error::CqFull { .. } | Error::QueueFull { .. }) => break,
                Err(e) => panic!("{e}"),
            }
        }
        dev.process();
        while cq_a.poll(&mut out) > 0 {
            assert!(out
                .iter()
                .all(|c| c.status == WcStatus::Success || c.cookie == 0));
        }
        let n = cq_b.poll(&mut out);
        for c in &out[..n] {
            assert_eq!((c.status, c.cookie), (WcStatus::Success, got), "{c:?}");
            got += 1;
        }
    }
}

/// DC: 70,000 writes from one DCI, its ring past 0xffff.
#[test]
fn dci_counters_wrap() {
    let dev = Device::sim_stepped();
    let pd = dev.alloc_pd().unwrap();
    let tcq = dev.create_cq(16).unwrap();
    let srq = pd.create_srq(&tcq, SrqCaps::default()).unwrap();
    let dct = pd
        .create_dct(&tcq, &srq, 0x1000, Access(Access::REMOTE_WRITE.0))
        .unwrap();
    let mr = pd
        .alloc_mr(4096, Access(Access::LOCAL_WRITE.0 | Access::REMOTE_WRITE.0))
        .unwrap();
    let mut cq = dev.create_cq(64).unwrap();
    let mut dci = pd
        .create_dci(
            &cq,
            QpCaps {
                sq_blocks: 16,
                ..QpCaps::default()
            },
        )
        .unwrap();
    let peer = dct.peer().unwrap();
    let (mut sent, mut done) = (0u64, 0u64);
    let mut out = [Completion::default(); 32];
    while done < N {
        loop {
            match dci.to(&peer).write_inline(
                &sent.to_le_bytes(),
                mr.remote(0).unwrap(),
                sent,
                PostFlags::SIGNALED,
            ) {
                Ok(()) => sent += 1,
                Err(Error::CqFull { .. } | Error::QueueFull { .. }) => break,
                Err(e) => panic!("{e}"),
            }
        }
        dev.process();
        let n = cq.poll(&mut out);
        for c in &out[..n] {
            assert_eq!((c.status, c.cookie), (WcStatus::Success, done), "{c:?}");
            done += 1;
        }
    }
}

/// A region dropped while its domain's send queue had work outstanding waits (parked) for
/// that work; once it completed, `Pd::reclaim` deregisters it. Here the work completed,
/// then the queue ran `n` more positions and stopped with three unsignaled writes not yet
/// retired (nothing signaled after them): every request posted before the drop is long
/// done, so the region goes. With the mark compared in 16 bits (as a signed distance) it
/// stayed parked from 32,768 positions on, for as long as the queue stayed so.
fn parked_region_after(n: u64) {
    let dev = Device::sim_stepped();
    let pd = dev.alloc_pd().unwrap();
    let mut cq = dev.create_cq(256).unwrap();
    let mut qp = pd.create_qp(&cq, &cq, QpCaps::default()).unwrap();
    qp.connect(&qp.endpoint().unwrap()).unwrap();
    let rw = Access(Access::LOCAL_WRITE.0 | Access::REMOTE_WRITE.0);
    let dst = pd.alloc_mr(4096, rw).unwrap();
    let dropped = pd.alloc_mr(1 << 20, rw).unwrap();
    qp.write_inline(b"x", dst.remote(0).unwrap(), 0, PostFlags::SIGNALED)
        .unwrap();
    drop(dropped);
    assert_eq!(pd.reclaim(), 1, "parked: a write is outstanding");
    assert_eq!(drain(&dev, &mut cq, 1).len(), 1);
    // The queue goes on: n positions, all polled.
    for k in 1..=n {
        qp.write_inline(b"y", dst.remote(8).unwrap(), k, PostFlags::SIGNALED)
            .unwrap();
        if k % 64 == 0 {
            assert_eq!(drain(&dev, &mut cq, 64).len(), 64);
        }
    }
    assert_eq!(
        drain(&dev, &mut cq, (n % 64) as usize).len(),
        (n % 64) as usize
    );
    for k in 0..3u64 {
        qp.write_inline(
            b"z",
            dst.remote(16).unwrap(),
            100_000 + k,
            PostFlags::UNSIGNALED,
        )
        .unwrap();
    }
    dev.process();
    assert_eq!(
        pd.reclaim(),
        0,
        "after {n} positions: everything posted before the drop completed"
    );
}

#[test]
fn a_parked_region_is_reclaimed_however_far_its_queue_ran() {
    for n in [20_000, 40_000, 70_000] {
        parked_region_after(n);
    }
}
