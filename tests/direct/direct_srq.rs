//! Shared receive queues on the software NIC through the direct path: many QPs receiving
//! into one SRQ, the limit event, a QP in error that leaves the SRQ's WQEs to the others,
//! scatter-to-CQE into SRQ buffers, teardown, and the typed refusals.

use crate::common;

use blueflame::*;
use common::*;
use std::collections::{HashMap, HashSet};

/// `n` client QPs, each connected to a server QP that takes its receives from `srq`.
struct Fan {
    dev: Device,
    pd: Pd,
    scq: Cq,
    rcq: Cq,
    srq: Srq,
    servers: Vec<Qp>,
    clients: Vec<Qp>,
}

/// A server QP taking its receives from `srq` and a client QP, both completing on `cq`,
/// connected to each other.
fn pair_on_srq(pd: &Pd, cq: &Cq, srq: &Srq) -> (Qp, Qp) {
    let mut s = pd.create_qp_with_srq(cq, srq, QpCaps::default()).unwrap();
    let mut c = pd.create_qp(cq, cq, QpCaps::default()).unwrap();
    let (es, ec) = (s.endpoint().unwrap(), c.endpoint().unwrap());
    s.connect(&ec).unwrap();
    c.connect(&es).unwrap();
    (s, c)
}

fn fan(n: usize, entries: u32, rcq_entries: u32, cqe_size: u32) -> Fan {
    let dev = Device::sim_stepped();
    let pd = dev.alloc_pd().unwrap();
    let scq = dev.create_cq(4096).unwrap();
    let rcq = dev
        .create_cq_with(&CqOptions::new(rcq_entries).cqe_size(cqe_size))
        .unwrap();
    let srq = pd
        .create_srq(
            &rcq,
            SrqCaps {
                entries,
                max_sge: 3,
            },
        )
        .unwrap();
    let mut servers = Vec::new();
    let mut clients = Vec::new();
    for _ in 0..n {
        let (s, c) = pair_on_srq(&pd, &scq, &srq);
        assert_eq!(s.srqn(), Some(srq.srqn()));
        servers.push(s);
        clients.push(c);
    }
    Fan {
        dev,
        pd,
        scq,
        rcq,
        srq,
        servers,
        clients,
    }
}

/// A thread that polls `rcq` until `n` completions came, each a success, handing each
/// with its rank to `each`; 120 s at most (a deadlock guard). Returns the CQ.
fn poll_thread(
    rcq: Cq,
    n: u64,
    mut each: impl FnMut(&Completion, u64) + Send + 'static,
) -> std::thread::JoinHandle<Cq> {
    std::thread::spawn(move || {
        let mut rcq = rcq;
        let mut out = [Completion::default(); 16];
        let mut seen = 0u64;
        let start = std::time::Instant::now();
        while seen < n {
            assert!(start.elapsed().as_secs() < 120, "stalled at {seen}");
            let k = rcq.poll(&mut out);
            for c in &out[..k] {
                assert!(c.is_ok(), "{c:?}");
                each(c, seen);
                seen += 1;
            }
        }
        rcq
    })
}

const SLOT: usize = 256;

/// Posts `n` receives of 64 bytes (slot `i` of a fresh region, cookie `base + i`) to the
/// SRQ; returns the region.
fn post_slots(f: &mut Fan, n: u64, base: u64) -> MemoryRegion {
    let mr = f.pd.alloc_mr(4096, ALL).unwrap();
    for i in 0..n {
        f.srq
            .post_recv(&[mr.sge(i as usize * 64, 64).unwrap()], base + i)
            .unwrap();
    }
    mr
}

/// Sixteen QPs receive into one SRQ of 32 while it is refilled: every message lands once,
/// in the receive the completion names (cookie), on the QP it was sent to (qpn), with its
/// bytes (small ones inside the CQE, copied by the poller), and no completion is lost.
#[test]
fn sixteen_qps_share_one_srq_refilled_while_traffic_runs() {
    let mut f = fan(16, 31, 1024, 64);
    let rbuf = f.pd.alloc_mr(64 * SLOT, ALL).unwrap();
    let sbuf = f.pd.alloc_mr(16 * SLOT, ALL).unwrap();
    // Receive buffer b (cookie b) is at b * SLOT; 64 buffers for 31 receives: a completed
    // one is posted again with a new cookie only after it was checked.
    let mut idle: Vec<u64> = (0..64).collect();
    let mut posted = HashSet::new();
    let refill = |srq: &mut Srq, idle: &mut Vec<u64>, posted: &mut HashSet<u64>| {
        while srq.free() > 0 {
            let Some(b) = idle.pop() else { break };
            srq.post_recv(&[rbuf.sge(b as usize * SLOT, SLOT as u32).unwrap()], b)
                .unwrap();
            posted.insert(b);
        }
    };
    refill(&mut f.srq, &mut idle, &mut posted);
    assert_eq!(f.srq.free(), 0);
    assert_eq!(f.srq.capacity(), 31, "a ring of 32 less its tail");
    let server_of: HashMap<u32, usize> = f
        .servers
        .iter()
        .enumerate()
        .map(|(i, s)| (s.qpn(), i))
        .collect();
    let mut seq = [0u32; 16];
    let mut got: HashMap<usize, Vec<u32>> = HashMap::new();
    let mut sent = 0usize;
    let mut received = 0usize;
    let mut out = [Completion::default(); 64];
    for round in 0..40u32 {
        // A few clients send one message each: length 1..=200, header = client, seq.
        for k in 0..6usize {
            let c = (round as usize * 7 + k * 5) % 16;
            let len = 8 + ((round as usize * 31 + k * 17) % 193);
            let mut msg = pattern(len, (c as u64) << 32 | seq[c] as u64);
            msg[..4].copy_from_slice(&(c as u32).to_le_bytes());
            msg[4..8].copy_from_slice(&seq[c].to_le_bytes());
            sbuf.write(c * SLOT, &msg).unwrap();
            let sge = sbuf.sge(c * SLOT, len as u32).unwrap();
            f.clients[c]
                .send(Payload::Sgl(&[sge]), seq[c] as u64, PostFlags::SIGNALED)
                .unwrap();
            seq[c] += 1;
            sent += 1;
            // The NIC runs now and then, not after every post.
            if k % 2 == 1 {
                f.dev.process();
            }
        }
        f.dev.process();
        loop {
            let n = f.rcq.poll(&mut out);
            if n == 0 {
                break;
            }
            for c in &out[..n] {
                assert_eq!(c.status, WcStatus::Success, "{c:?}");
                assert_eq!(c.opcode, WcOpcode::Recv);
                assert!(
                    posted.remove(&c.cookie),
                    "cookie {} completed twice",
                    c.cookie
                );
                let b = c.cookie as usize;
                let data = bytes(&rbuf, b * SLOT, c.byte_len as usize);
                let client = u32::from_le_bytes(data[..4].try_into().unwrap()) as usize;
                let s = u32::from_le_bytes(data[4..8].try_into().unwrap());
                let mut want = pattern(c.byte_len as usize, (client as u64) << 32 | s as u64);
                want[..8].copy_from_slice(&data[..8]);
                assert_eq!(data, want, "bytes of client {client} message {s}");
                assert_eq!(server_of[&c.qpn], client, "arrived on the client's server");
                got.entry(client).or_default().push(s);
                idle.insert(0, c.cookie);
                received += 1;
            }
        }
        assert!(poll_all(&mut f.scq).iter().all(|c| c.is_ok()));
        refill(&mut f.srq, &mut idle, &mut posted);
    }
    // Drain: whatever is still in flight (RNR-waiting senders) lands once refilled.
    for _ in 0..50 {
        if received == sent {
            break;
        }
        f.dev.process();
        for c in poll_all(&mut f.rcq) {
            assert!(c.is_ok());
            assert!(posted.remove(&c.cookie));
            let b = c.cookie as usize;
            let data = bytes(&rbuf, b * SLOT, 8);
            let client = u32::from_le_bytes(data[..4].try_into().unwrap()) as usize;
            got.entry(client)
                .or_default()
                .push(u32::from_le_bytes(data[4..8].try_into().unwrap()));
            idle.insert(0, c.cookie);
            received += 1;
        }
        refill(&mut f.srq, &mut idle, &mut posted);
    }
    assert_eq!(received, sent, "no completion lost");
    for (client, seqs) in got {
        let want: Vec<u32> = (0..seq[client]).collect();
        assert_eq!(seqs, want, "client {client}: each message once, in order");
    }
    let st = nic(&f.dev).srq_stats(f.srq.srqn()).unwrap();
    assert_eq!(st.taken, sent as u64);
}

/// The limit: armed, one event once fewer receives than the limit remain, then disarmed.
#[test]
fn limit_event_fires_once_when_the_srq_runs_low() {
    let mut f = fan(2, 15, 256, 64);
    let _mr = post_slots(&mut f, 8, 0); // the receives land in it
    f.srq.set_limit(4).unwrap();
    assert_eq!(nic(&f.dev).srq_limit(f.srq.srqn()), Some(4));
    let send = |f: &mut Fan, i: usize| {
        f.clients[i % 2]
            .send(Payload::Inline(b"x"), 0, PostFlags::SIGNALED)
            .unwrap();
        f.dev.process();
    };
    for i in 0..4 {
        send(&mut f, i);
        assert!(!f.srq.limit_reached(), "{} left, limit 4", 7 - i);
    }
    // The fifth leaves 3: below the limit.
    send(&mut f, 4);
    assert!(f.srq.limit_reached());
    assert!(!f.srq.limit_reached(), "one event");
    assert_eq!(nic(&f.dev).srq_limit(f.srq.srqn()), Some(0), "disarmed");
    send(&mut f, 5);
    assert!(!f.srq.limit_reached(), "disarmed: no second event");
    assert_eq!(poll_all(&mut f.rcq).len(), 6);
    assert_eq!(nic(&f.dev).srq_stats(f.srq.srqn()).unwrap().limit_events, 1);
    // Armed again: fires again.
    f.srq.set_limit(3).unwrap();
    send(&mut f, 6);
    assert!(f.srq.limit_reached());
    // A limit above the SRQ's capacity is refused before the device sees it.
    assert!(matches!(
        f.srq.set_limit(16),
        Err(Error::InvalidParameter { value: 16, .. })
    ));
    f.srq.set_limit(15).unwrap();
    f.srq.set_limit(0).unwrap();
    assert_eq!(nic(&f.dev).srq_limit(f.srq.srqn()), Some(0));
}

/// A QP that goes to error leaves the SRQ's receives to the others (no flush completion)
/// and reports the last WQE reached.
#[test]
fn qp_error_leaves_srq_receives_and_reports_last_wqe() {
    let mut f = fan(2, 15, 256, 64);
    let mr = post_slots(&mut f, 4, 10);
    assert!(!f.servers[0].last_wqe_reached());
    f.servers[0].set_error().unwrap();
    f.dev.process();
    assert_eq!(poll_all(&mut f.rcq), vec![], "nothing flushed from the SRQ");
    assert_eq!(nic(&f.dev).srq_pending(f.srq.srqn()), Some(4));
    assert!(f.servers[0].last_wqe_reached());
    assert!(!f.servers[1].last_wqe_reached());
    // The other QP still receives, in the order the receives were posted.
    for k in 0..4u64 {
        f.clients[1]
            .send(Payload::Inline(&[k as u8; 3]), k, PostFlags::SIGNALED)
            .unwrap();
    }
    f.dev.process();
    let r = poll_all(&mut f.rcq);
    let q1 = f.servers[1].qpn();
    assert_eq!(
        r.iter().map(|c| (c.cookie, c.qpn)).collect::<Vec<_>>(),
        vec![(10, q1), (11, q1), (12, q1), (13, q1)]
    );
    for k in 0..4 {
        assert_eq!(bytes(&mr, k * 64, 3), vec![k as u8; 3]);
    }
    // The QP's own errors are not the SRQ's: its check reports no event.
    assert!(f.servers[1].check().is_ok());
}

/// Data inside the CQE (scatter-to-CQE: up to 32 bytes with 64-byte CQEs, 64 with 128)
/// lands in the SRQ receive's buffers, across entries; longer messages are written by the
/// NIC; a receive too short fails with a length error and its WQE goes back to the SRQ.
#[test]
fn scatter_to_cqe_lands_in_srq_buffers() {
    for cqe_size in [64u32, 128] {
        let mut f = fan(1, 7, 256, cqe_size);
        let mr = f.pd.alloc_mr(8192, ALL).unwrap();
        for len in [1usize, 7, 8, 31, 32, 33, 63, 64, 65, 100] {
            fill(&mr, 0xa5);
            // Three entries: 7 bytes, an empty one, 100 bytes.
            let list = [
                mr.sge(10, 7).unwrap(),
                mr.sge(50, 0).unwrap(),
                mr.sge(1000, 100).unwrap(),
            ];
            f.srq.post_recv(&list, 500 + len as u64).unwrap();
            let data = pattern(len, len as u64);
            f.clients[0]
                .send(Payload::Inline(&data), 1, PostFlags::SIGNALED)
                .unwrap();
            f.dev.process();
            let r = poll_all(&mut f.rcq);
            assert_eq!(r.len(), 1);
            assert_ok(
                &r[0],
                500 + len as u64,
                WcOpcode::Recv,
                len as u32,
                f.servers[0].qpn(),
            );
            let first = len.min(7);
            let mut want_a = vec![0xa5; 7];
            want_a[..first].copy_from_slice(&data[..first]);
            let mut want_b = vec![0xa5; 100];
            want_b[..len - first].copy_from_slice(&data[first..]);
            assert_eq!(
                bytes(&mr, 10, 7),
                want_a,
                "{cqe_size}: first entry, {len} bytes"
            );
            assert_eq!(
                bytes(&mr, 1000, 100),
                want_b,
                "{cqe_size}: third entry, {len} bytes"
            );
            assert!(poll_all(&mut f.scq).iter().all(|c| c.is_ok()));
        }
        assert_eq!(f.srq.free(), 7, "every WQE given back");
        // A receive of 4 bytes for 5: a local length error at the responder.
        f.srq.post_recv(&[mr.sge(0, 4).unwrap()], 77).unwrap();
        f.clients[0]
            .send(Payload::Inline(b"12345"), 2, PostFlags::SIGNALED)
            .unwrap();
        f.dev.process();
        let r = poll_all(&mut f.rcq);
        assert_eq!(r.len(), 1);
        assert_eq!((r[0].cookie, r[0].status), (77, WcStatus::LocLenErr));
        assert_eq!(r[0].qpn, f.servers[0].qpn());
        assert_eq!(f.srq.free(), 7, "the failed receive's WQE went back too");
    }
}

/// Dropping the SRQ handle keeps it alive for its QPs (receives posted before still land);
/// dropping a QP whose receive completions were not polled gives their WQEs back.
#[test]
fn teardown_keeps_the_srq_for_its_qps_and_recovers_buried_wqes() {
    let mut f = fan(2, 15, 256, 64);
    let mr = post_slots(&mut f, 6, 0);
    // Two messages to server 0, not polled; then server 0 goes.
    for _ in 0..2 {
        f.clients[0]
            .send(Payload::Inline(b"gone"), 0, PostFlags::SIGNALED)
            .unwrap();
    }
    f.dev.process();
    assert_eq!(f.srq.free(), 15 - 6);
    let s0 = f.servers.remove(0);
    drop(s0);
    assert_eq!(
        poll_all(&mut f.rcq),
        vec![],
        "the dropped QP's completions are discarded"
    );
    assert_eq!(f.srq.free(), 15 - 4, "their WQEs went back to the SRQ");
    // The SRQ's owner goes; server 1 still receives into what was posted.
    let srqn = f.srq.srqn();
    drop(std::mem::replace(
        &mut f.srq,
        f.pd.create_srq(&f.rcq, SrqCaps::default()).unwrap(),
    ));
    assert_eq!(nic(&f.dev).srq_pending(srqn), Some(4), "still there");
    f.clients[1]
        .send(Payload::Inline(b"late"), 0, PostFlags::SIGNALED)
        .unwrap();
    f.dev.process();
    let r = poll_all(&mut f.rcq);
    assert_eq!((r.len(), r[0].cookie, r[0].qpn), (1, 2, f.servers[0].qpn()));
    assert_eq!(bytes(&mr, 2 * 64, 4), b"late");
    // The last QP of the old SRQ goes: so does the SRQ.
    f.servers.clear();
    assert_eq!(
        nic(&f.dev).srq_pending(srqn),
        None,
        "destroyed with its last QP"
    );
}

/// A send of three MTUs (the software NIC's port: 4096 bytes) into an SRQ WQE: the
/// responder takes the WQE at the first packet and completes it after the last, a pass
/// later each (a ConnectX holds it the same way across the message's packets).
fn three_mtu_send(f: &mut Fan) -> (MemoryRegion, MemoryRegion) {
    const LEN: usize = 3 * 4096;
    let dst = f.pd.alloc_mr(LEN, ALL).unwrap();
    f.srq
        .post_recv(&[dst.sge(0, LEN as u32).unwrap()], 7)
        .unwrap();
    let src = f.pd.alloc_mr(LEN, ALL).unwrap();
    src.write(0, &vec![0x5a; LEN]).unwrap();
    f.clients[0]
        .send(
            Payload::Sgl(&[src.sge(0, LEN as u32).unwrap()]),
            1,
            PostFlags::SIGNALED,
        )
        .unwrap();
    (dst, src)
}

#[test]
fn a_message_of_many_packets_holds_its_srq_wqe_until_the_last() {
    let mut f = fan(1, 15, 256, 64);
    let (dst, _src) = three_mtu_send(&mut f);
    // First packet, then the second: the WQE is taken, nothing completes yet.
    nic(&f.dev).process();
    nic(&f.dev).process();
    assert!(
        poll_all(&mut f.rcq).is_empty(),
        "not before the last packet"
    );
    f.dev.process();
    let r = poll_all(&mut f.rcq);
    assert_eq!(
        (r.len(), r[0].cookie, r[0].status, r[0].byte_len),
        (1, 7, WcStatus::Success, 3 * 4096)
    );
    assert_eq!(bytes(&dst, 4096 * 3 - 8, 8), vec![0x5a; 8]);
    assert_eq!(f.srq.free(), 15);
}

/// A server QP dropped while a message into one of its SRQ WQEs is still arriving: the
/// drop moves it to error and waits for the last-WQE-reached event (IBA 10.3.1, the
/// kernel's `ib_drain_qp`), so the WQE is flushed and comes back to the SRQ; destroyed at
/// once, the WQE vanished with the QP and the SRQ was one entry short for good.
#[test]
fn a_qp_dropped_mid_message_gives_its_srq_wqe_back() {
    let mut f = fan(2, 15, 256, 64);
    let (_dst, _src) = three_mtu_send(&mut f);
    nic(&f.dev).process();
    assert_eq!(f.srq.free(), 14);
    assert_eq!(
        nic(&f.dev).srq_pending(f.srq.srqn()),
        Some(0),
        "the first packet took the WQE"
    );
    let s0 = f.servers.remove(0);
    drop(s0);
    // The event came with the modify to error: the drop ran no pass of the stepped NIC
    // (the client's half-sent message is where it was, nothing completed).
    assert_eq!(poll_all(&mut f.scq), vec![], "no NIC pass in the drop");
    assert_eq!(
        poll_all(&mut f.rcq),
        vec![],
        "the flush is discarded with the QP"
    );
    assert_eq!(f.srq.free(), 15, "the WQE came back to the SRQ");
    // The SRQ still serves: the other server receives into every entry.
    let mr = post_slots(&mut f, 15, 100);
    for i in 0..15u64 {
        f.clients[1]
            .send(Payload::Inline(&i.to_le_bytes()), i, PostFlags::SIGNALED)
            .unwrap();
    }
    f.dev.process();
    let r = poll_all(&mut f.rcq);
    assert_eq!(r.len(), 15);
    assert!(r.iter().all(|c| c.status == WcStatus::Success));
    assert_eq!(bytes(&mr, 14 * 64, 8), 14u64.to_le_bytes());
}

/// What the API refuses, before the device sees it.
#[test]
fn refusals_are_typed() {
    let mut f = fan(1, 3, 256, 64);
    let mr = f.pd.alloc_mr(4096, ALL).unwrap();
    // Receives go to the SRQ, not to a QP that has one.
    assert!(matches!(
        f.servers[0].post_recv(&[mr.sge(0, 8).unwrap()], 1),
        Err(Error::SrqQp { qpn, srqn }) if qpn == f.servers[0].qpn() && srqn == f.srq.srqn()
    ));
    assert_eq!(f.servers[0].recv_depth(), 0);
    // Too many scatter entries (3 asked, the stride of 64 holds 3).
    let four = [mr.sge(0, 8).unwrap(); 4];
    assert!(matches!(
        f.srq.post_recv(&four, 1),
        Err(Error::TooManySge { n: 4, max: 3 })
    ));
    // Full: three receives fit (a ring of 4 less its tail).
    for i in 0..3 {
        f.srq.post_recv(&[mr.sge(0, 8).unwrap()], i).unwrap();
    }
    assert!(matches!(
        f.srq.post_recv(&[mr.sge(0, 8).unwrap()], 9),
        Err(Error::QueueFull {
            free: 0,
            unit: QueueUnit::Receives,
            ..
        })
    ));
    // Sizes.
    for (entries, max_sge) in [(0, 1), (1 << 15, 1), (4, 32)] {
        assert!(matches!(
            f.pd.create_srq(&f.rcq, SrqCaps { entries, max_sge }),
            Err(Error::InvalidParameter { .. })
        ));
    }
    // Another domain's SRQ; another CQ than the SRQ's.
    let pd2 = f.dev.alloc_pd().unwrap();
    assert!(matches!(
        pd2.create_qp_with_srq(&f.scq, &f.srq, QpCaps::default()),
        Err(Error::InvalidHandle { .. })
    ));
    // A DCT completes its receives on its SRQ's CQ.
    assert!(matches!(
        f.pd.create_dct(&f.scq, &f.srq, 1, Access::REMOTE_WRITE),
        Err(Error::SrqCq { srq_cq, cq, .. }) if srq_cq == f.rcq.cqn() && cq == f.scq.cqn()
    ));
    assert!(f
        .pd
        .create_dct(&f.rcq, &f.srq, 1, Access::REMOTE_WRITE)
        .is_ok());
    // Another device's CQ.
    let other = Device::sim_stepped();
    let ocq = other.create_cq(16).unwrap();
    assert!(matches!(
        f.pd.create_srq(&ocq, SrqCaps::default()),
        Err(Error::InvalidHandle { .. })
    ));
    // A compressing CQ.
    let zcq = zip_cq(&f.dev, 64, MiniCqeFormat::Hash);
    assert!(matches!(
        f.pd.create_srq(&zcq, SrqCaps::default()),
        Err(Error::Unsupported(_))
    ));
}

/// The SRQ's receives are charged to its CQ: a CQ smaller than the SRQ refuses the
/// receives it could not hold completions for, and takes them again as they complete.
#[test]
fn srq_receives_are_charged_to_its_cq() {
    let dev = Device::sim_stepped();
    let pd = dev.alloc_pd().unwrap();
    let mut rcq = dev.create_cq(8).unwrap();
    let scq = dev.create_cq(64).unwrap();
    let mut srq = pd.create_srq(&rcq, SrqCaps::default()).unwrap();
    let mr = pd.alloc_mr(4096, ALL).unwrap();
    let cap = rcq.guaranteed();
    let mut n = 0;
    let err = loop {
        match srq.post_recv(&[mr.sge(0, 8).unwrap()], n) {
            Ok(()) => n += 1,
            Err(e) => break e,
        }
    };
    assert!(matches!(err, Error::CqFull { .. }), "{err:?}");
    assert_eq!(
        n as u32, cap,
        "as many receives as the CQ guarantees entries"
    );
    let (_s, mut c) = pair_on_srq(&pd, &scq, &srq);
    c.send(Payload::Inline(b"a"), 0, PostFlags::SIGNALED)
        .unwrap();
    dev.process();
    assert_eq!(poll_all(&mut rcq).len(), 1);
    srq.post_recv(&[mr.sge(0, 8).unwrap()], 99).unwrap();
    assert!(nic(&dev).srq_pending(srq.srqn()).is_some());
    assert!(!nic(&dev).cq_overrun(rcq.cqn()));
}

/// The SRQ's poster and the poller of its CQ on two threads, the software NIC on its own
/// (thread mode): the free ring hands completed WQEs back while receives are posted, and
/// every message still lands once, in the receive its completion names.
#[test]
fn poster_and_poller_on_two_threads() {
    fn is_send<T: Send>(_: &T) {}
    let dev = Device::sim();
    let pd = dev.alloc_pd().unwrap();
    let mut scq = dev.create_cq(1024).unwrap();
    let rcq = dev.create_cq(1024).unwrap();
    let mut srq = pd
        .create_srq(
            &rcq,
            SrqCaps {
                entries: 15,
                max_sge: 1,
            },
        )
        .unwrap();
    is_send(&srq);
    let mut servers = Vec::new();
    let mut clients = Vec::new();
    for _ in 0..4 {
        let (s, c) = pair_on_srq(&pd, &scq, &srq);
        servers.push(s);
        clients.push(c);
    }
    const N: u64 = 2000;
    let rbuf = pd.alloc_mr(64 * 16, ALL).unwrap();
    let slot = |k: u64| rbuf.sge((k % 16) as usize * 64, 64).unwrap();
    // Cookie k: buffer k % 16; at most 15 posted, so a buffer is reused only after its
    // completion was read.
    let (done_tx, done_rx) = std::sync::mpsc::channel::<u64>();
    let poster = {
        let slots: Vec<Sge> = (0..16).map(slot).collect();
        std::thread::spawn(move || {
            let mut next = 0u64;
            let mut completed = 0u64;
            while next < N {
                // Post while there is room and the buffer is free.
                while next < N && srq.free() > 0 && next < completed + 15 {
                    srq.post_recv(&[slots[(next % 16) as usize]], next).unwrap();
                    next += 1;
                }
                match done_rx.recv_timeout(std::time::Duration::from_secs(20)) {
                    Ok(_) => completed += 1,
                    Err(e) => panic!("poller silent: {e} (posted {next})"),
                }
            }
            srq
        })
    };
    let poller = poll_thread(rcq, N, move |c, seen| {
        assert_eq!(c.cookie, seen, "receives are taken in posting order");
        let _ = done_tx.send(c.cookie);
    });
    // Senders on this thread: message m from client m % 4, 8 bytes (inside the CQE).
    let mut sent = 0u64;
    let start = std::time::Instant::now();
    let mut out = [Completion::default(); 64];
    let mut inflight = 0u64;
    while sent < N {
        assert!(start.elapsed().as_secs() < 60, "sender stalled at {sent}");
        if inflight < 32 {
            let c = (sent % 4) as usize;
            clients[c]
                .send(
                    Payload::Inline(&sent.to_le_bytes()),
                    sent,
                    PostFlags::SIGNALED,
                )
                .unwrap();
            sent += 1;
            inflight += 1;
        }
        let n = scq.poll(&mut out);
        assert!(out[..n].iter().all(|c| c.is_ok()));
        inflight -= n as u64;
    }
    let srq = poster.join().unwrap();
    let _rcq = poller.join().unwrap();
    assert_eq!(srq.free(), 15, "every WQE came back");
    drop(servers);
}

/// Receive memory that can page-fault on the NIC: a dma-buf whose exporter moves it, or an
/// on-demand region whose pages the kernel invalidates.
enum Faulting {
    DmaBuf(SimDmaBuf, MemoryRegion),
    OnDemand(MemoryRegion),
}

impl Faulting {
    fn new(f: &Fan, dmabuf: bool) -> Faulting {
        let w = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
        if dmabuf {
            let gpu = SimDmaBuf::new(&f.dev, 4096).unwrap();
            let mr =
                f.pd.register_dmabuf(gpu.fd(), 0, 4096, 0x7000_0000, w)
                    .unwrap();
            Faulting::DmaBuf(gpu, mr)
        } else {
            Faulting::OnDemand(
                f.pd.register(vec![0u8; 4096], w | Access::ON_DEMAND)
                    .unwrap(),
            )
        }
    }

    fn mr(&self) -> &MemoryRegion {
        match self {
            Faulting::DmaBuf(_, mr) | Faulting::OnDemand(mr) => mr,
        }
    }

    /// The pages move: the NIC's next receive into an SRQ WQE over them faults.
    fn unmap(&self, dev: &Device) {
        match self {
            Faulting::DmaBuf(gpu, _) => gpu.move_buffer().unwrap(),
            Faulting::OnDemand(mr) => assert!(nic(dev).invalidate_odp(mr.lkey())),
        }
    }

    fn read(&self, off: usize, len: usize) -> Vec<u8> {
        match self {
            Faulting::DmaBuf(gpu, _) => {
                let mut v = vec![0u8; len];
                gpu.read(off, &mut v).unwrap();
                v
            }
            Faulting::OnDemand(mr) => bytes(mr, off, len),
        }
    }
}

/// Sends `len` bytes of `fill` from client 0 (larger than the CQE: the NIC writes the
/// receive buffers itself) and runs the NIC.
fn send_fill(f: &mut Fan, src: &MemoryRegion, fill: u8, len: usize) {
    src.write(0, &vec![fill; len]).unwrap();
    f.clients[0]
        .send(
            Payload::Sgl(&[src.sge(0, len as u32).unwrap()]),
            fill as u64,
            PostFlags::SIGNALED,
        )
        .unwrap();
    f.dev.process();
}

/// Issue 27, item 4: a ConnectX that meets a page fault in an SRQ WQE's buffers (a dma-buf
/// whose exporter moved it, an on-demand region whose pages were invalidated) completes the
/// WQE with REMOTE_ABORTED and vendor syndrome 0x93 and the requester sends the message
/// again after an RNR NAK; rdma-core swallows that CQE and posts the WQE again (`cq.c`
/// `is_odp_pfault_err`, `srq.c` `mlx5_complete_odp_fault`). The direct path does the same:
/// no completion for the fault, the message lands in the next receive, and the faulted
/// receive (its cookie, its buffer) takes a later message. Without the repost the second
/// message would find no receive (RNR for ever); without the swallow the user would see
/// `RemAbortErr` for a receive that is still posted.
#[test]
fn a_page_faulted_srq_receive_is_posted_again_not_reported() {
    for dmabuf in [true, false] {
        let mut f = fan(1, 7, 256, 64);
        let src = f.pd.alloc_mr(4096, ALL).unwrap();
        let mem = Faulting::new(&f, dmabuf);
        f.srq
            .post_recv(&[mem.mr().sge(0, 256).unwrap()], 10)
            .unwrap();
        f.srq
            .post_recv(&[mem.mr().sge(256, 256).unwrap()], 11)
            .unwrap();
        mem.unmap(&f.dev);
        send_fill(&mut f, &src, 0xa1, 200);
        let server = f.servers[0].qpn();
        assert_eq!(nic(&f.dev).qp_stats(server).unwrap().page_faults, 1);
        let r = poll_all(&mut f.rcq);
        assert_eq!(r.len(), 1, "dma-buf {dmabuf}: {r:?}");
        assert_eq!(
            (r[0].cookie, r[0].status, r[0].byte_len),
            (11, WcStatus::Success, 200)
        );
        assert_eq!(mem.read(256, 200), vec![0xa1; 200]);
        assert_eq!(
            mem.read(0, 200),
            vec![0; 200],
            "the faulted receive is untouched"
        );
        assert_eq!(f.srq.free(), 6, "the faulted receive is still posted");
        send_fill(&mut f, &src, 0xb2, 120);
        let r = poll_all(&mut f.rcq);
        assert_eq!(r.len(), 1, "dma-buf {dmabuf}: {r:?}");
        assert_eq!(
            (r[0].cookie, r[0].status, r[0].byte_len),
            (10, WcStatus::Success, 120)
        );
        assert_eq!(mem.read(0, 120), vec![0xb2; 120]);
        assert_eq!(f.srq.free(), 7);
        assert_eq!(poll_all(&mut f.scq).len(), 2, "both sends completed once");
    }
}

/// The same with the SRQ full: the faulted WQE is the only room, so it becomes the ring's
/// tail and its receive moves to the head (rdma-core without a wait queue). Seven
/// receives, a move, seven messages: each lands once, in the receive its completion names,
/// the faulted one last; then the ring works on as before.
#[test]
fn a_page_fault_in_a_full_srq_moves_the_receive_to_the_back() {
    let mut f = fan(1, 7, 256, 64);
    let src = f.pd.alloc_mr(4096, ALL).unwrap();
    let mem = Faulting::new(&f, true);
    let post_all = |f: &mut Fan| {
        for i in 0..7u64 {
            let sge = mem.mr().sge(i as usize * 512, 512).unwrap();
            f.srq.post_recv(&[sge], i).unwrap();
        }
        assert_eq!(f.srq.free(), 0);
    };
    post_all(&mut f);
    mem.unmap(&f.dev);
    let mut cookies = Vec::new();
    for m in 0..14u8 {
        if m == 7 {
            post_all(&mut f);
        }
        send_fill(&mut f, &src, 0x40 + m, 300);
        let r = poll_all(&mut f.rcq);
        assert_eq!(r.len(), 1, "message {m}: {r:?}");
        assert!(r[0].is_ok(), "{:?}", r[0]);
        assert_eq!(
            mem.read(r[0].cookie as usize * 512, 300),
            vec![0x40 + m; 300]
        );
        cookies.push(r[0].cookie);
    }
    assert_eq!(cookies[..7], [1, 2, 3, 4, 5, 6, 0]);
    let mut second = cookies[7..].to_vec();
    second.sort_unstable();
    assert_eq!(second, [0, 1, 2, 3, 4, 5, 6]);
    assert_eq!(f.srq.free(), 7);
}

/// The faulted receive's scatter list and pins move with it (`ScatterTable::move_entry`):
/// a message small enough for the CQE lands in the reposted receive through the poller's
/// copy, into the buffer the receive was posted with; and a region dropped while the
/// reposted receive holds it stays registered until that receive completes (`Pd::reclaim`).
#[test]
fn a_page_fault_moves_the_receives_buffers_and_pins_with_it() {
    for drop_region in [false, true] {
        let mut f = fan(1, 7, 256, 64);
        let src = f.pd.alloc_mr(4096, ALL).unwrap();
        let odp =
            f.pd.register(vec![0u8; 4096], Access::LOCAL_WRITE | Access::ON_DEMAND)
                .unwrap();
        f.srq.post_recv(&[odp.sge(0, 256).unwrap()], 10).unwrap();
        f.srq.post_recv(&[odp.sge(256, 256).unwrap()], 11).unwrap();
        assert!(nic(&f.dev).invalidate_odp(odp.lkey()));
        send_fill(&mut f, &src, 0xa1, 200);
        let r = poll_all(&mut f.rcq);
        assert_eq!((r.len(), r[0].cookie), (1, 11), "{r:?}");
        // The send's completion too: only a receive's pin can hold the region now.
        assert_eq!(poll_all(&mut f.scq).len(), 1);
        let mut odp = Some(odp);
        if drop_region {
            drop(odp.take());
            assert_eq!(f.pd.reclaim(), 1, "parked: the reposted receive pins it");
        }
        // 20 bytes: inside the CQE, copied by the poller into receive 10's buffer.
        send_fill(&mut f, &src, 0xc3, 20);
        let r = poll_all(&mut f.rcq);
        assert_eq!(r.len(), 1, "{r:?}");
        assert_eq!(
            (r[0].cookie, r[0].status, r[0].byte_len),
            (10, WcStatus::Success, 20)
        );
        assert_eq!(poll_all(&mut f.scq).len(), 1);
        match &odp {
            Some(odp) => assert_eq!(bytes(odp, 0, 24), [&[0xc3; 20][..], &[0; 4]].concat()),
            None => assert_eq!(f.pd.reclaim(), 0, "deregistered once it completed"),
        }
    }
}

/// A fault reported for a QP dropped before its CQE was polled: the QP's entries are
/// discarded (the tombstone), but the faulted receive is the SRQ's, not the QP's: it is
/// posted again and another QP on the SRQ receives into it. When the SRQ itself is gone by
/// then, the receive is given back and nothing is written (the memcheck stage runs this:
/// the software NIC frees the SRQ's ring at its destruction).
#[test]
fn a_page_fault_of_a_dropped_qp_goes_back_to_the_srq_or_nowhere() {
    for srq_too in [false, true] {
        let mut f = fan(2, 7, 256, 64);
        let src = f.pd.alloc_mr(4096, ALL).unwrap();
        let odp =
            f.pd.register(vec![0u8; 4096], Access::LOCAL_WRITE | Access::ON_DEMAND)
                .unwrap();
        let pinned = f.pd.alloc_mr(4096, ALL).unwrap();
        f.srq.post_recv(&[odp.sge(0, 256).unwrap()], 10).unwrap();
        f.srq.post_recv(&[pinned.sge(0, 256).unwrap()], 11).unwrap();
        assert!(nic(&f.dev).invalidate_odp(odp.lkey()));
        // Server 0 takes the fault, then the message in receive 11; nothing polled.
        send_fill(&mut f, &src, 0xa1, 200);
        let (s0, c0) = (f.servers.remove(0), f.clients.remove(0));
        drop((s0, c0));
        if srq_too {
            let rest = std::mem::take(&mut f.servers);
            drop(rest);
            let srqn = f.srq.srqn();
            let old = std::mem::replace(
                &mut f.srq,
                f.pd.create_srq(&f.rcq, SrqCaps::default()).unwrap(),
            );
            drop(old);
            assert_eq!(nic(&f.dev).srq_pending(srqn), None, "the SRQ is gone");
            assert_eq!(poll_all(&mut f.rcq), vec![]);
            continue;
        }
        assert_eq!(
            poll_all(&mut f.rcq),
            vec![],
            "the dropped QP's entries are discarded"
        );
        assert_eq!(f.srq.free(), 6, "receive 10 is posted again, 11 came back");
        src.write(0, &[0xb2; 120]).unwrap();
        f.clients[0]
            .send(
                Payload::Sgl(&[src.sge(0, 120).unwrap()]),
                1,
                PostFlags::SIGNALED,
            )
            .unwrap();
        f.dev.process();
        let r = poll_all(&mut f.rcq);
        assert_eq!(r.len(), 1, "{r:?}");
        assert_eq!(
            (r[0].cookie, r[0].qpn, r[0].byte_len),
            (10, f.servers[0].qpn(), 120)
        );
        assert_eq!(bytes(&odp, 0, 120), vec![0xb2; 120]);
    }
}

/// A device whose on-demand paging does not serve SRQ receives (no
/// `IBV_ODP_SUPPORT_SRQ_RECV` in its RC bits, a ConnectX-4's firmware): a receive with an
/// entry in an on-demand or dma-buf region is refused before posting, with its lkey;
/// nothing is posted; pinned regions and empty entries pass.
#[test]
fn srq_receives_into_pageable_memory_need_the_devices_srq_bit() {
    let dev = Device::sim_stepped();
    dev.nic().unwrap().set_memory_caps(mlx5::sim::MemoryCaps {
        srq_odp: false,
        ..Default::default()
    });
    assert!(!dev.odp_caps().srq_recv() && dev.odp_caps().rc(true));
    let pd = dev.alloc_pd().unwrap();
    let rcq = dev.create_cq(64).unwrap();
    let mut srq = pd.create_srq(&rcq, SrqCaps::default()).unwrap();
    let mr = pd.alloc_mr(4096, ALL).unwrap();
    let odp = pd
        .register(vec![0u8; 4096], Access::LOCAL_WRITE | Access::ON_DEMAND)
        .unwrap();
    let gpu = SimDmaBuf::new(&dev, 4096).unwrap();
    let dmabuf = pd
        .register_dmabuf(gpu.fd(), 0, 4096, 0x7000_0000, Access::LOCAL_WRITE)
        .unwrap();
    let free = srq.free();
    for (sgl, lkey) in [
        (vec![odp.sge(0, 64).unwrap()], odp.lkey()),
        (
            vec![mr.sge(0, 64).unwrap(), dmabuf.sge(64, 64).unwrap()],
            dmabuf.lkey(),
        ),
    ] {
        match srq.post_recv(&sgl, 5) {
            Err(Error::InvalidParameter { value, .. }) => assert_eq!(value, lkey as u64),
            r => panic!("a pageable receive buffer was accepted: {r:?}"),
        }
        assert_eq!(srq.free(), free, "nothing posted");
        assert_eq!(nic(&dev).srq_pending(srq.srqn()), Some(0));
    }
    srq.post_recv(&[odp.sge(0, 0).unwrap(), mr.sge(0, 64).unwrap()], 6)
        .unwrap();
    assert_eq!(nic(&dev).srq_pending(srq.srqn()), Some(1));
}

/// Thread mode, the poster and the poller on two threads and the exporter moving its
/// buffer under them: the poller's reposts and the poster's receives share the ring's
/// writer (rdma-core's `srq->lock`). Every message is received once, into the buffer where
/// the exporter has it now (the poller clears each slot before it is posted again), and
/// every completion is a success.
#[test]
fn page_faults_while_poster_and_poller_run_on_two_threads() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    const N: u64 = 200;
    const SLOTS: usize = 15;
    let dev = Device::sim();
    let pd = dev.alloc_pd().unwrap();
    let mut scq = dev.create_cq(256).unwrap();
    let rcq = dev.create_cq(256).unwrap();
    let srq = pd
        .create_srq(
            &rcq,
            SrqCaps {
                entries: SLOTS as u32,
                max_sge: 1,
            },
        )
        .unwrap();
    let (server, mut client) = pair_on_srq(&pd, &scq, &srq);
    let gpu = Arc::new(SimDmaBuf::new(&dev, SLOTS * 64).unwrap());
    let w = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
    let mr = pd
        .register_dmabuf(gpu.fd(), 0, SLOTS * 64, 0x9000_0000, w)
        .unwrap();
    let sges: Vec<Sge> = (0..SLOTS).map(|i| mr.sge(i * 64, 64).unwrap()).collect();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<u64>();
    let poster = {
        let mut srq = srq;
        std::thread::spawn(move || {
            for (i, s) in sges.iter().enumerate() {
                srq.post_recv(std::slice::from_ref(s), i as u64).unwrap();
            }
            for got in 0..N {
                match done_rx.recv_timeout(std::time::Duration::from_secs(60)) {
                    Ok(slot) if got + (SLOTS as u64) < N => {
                        let s = &sges[slot as usize];
                        srq.post_recv(std::slice::from_ref(s), slot).unwrap();
                    }
                    Ok(_) => {}
                    Err(e) => panic!("poller silent: {e} (got {got})"),
                }
            }
            srq
        })
    };
    let stop = Arc::new(AtomicBool::new(false));
    let mover = {
        let (gpu, stop) = (gpu.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                gpu.move_buffer().unwrap();
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        })
    };
    let poller = {
        let gpu = gpu.clone();
        poll_thread(rcq, N, move |c, seen| {
            assert_eq!(c.byte_len, 40);
            let at = c.cookie as usize * 64;
            let mut got = [0u8; 40];
            gpu.read(at, &mut got).unwrap();
            assert_eq!(got, [0x5a; 40], "message {seen} in slot {}", c.cookie);
            gpu.write(at, &[0; 40]).unwrap();
            let _ = done_tx.send(c.cookie);
        })
    };
    let src = pd.alloc_mr(4096, ALL).unwrap();
    src.write(0, &[0x5a; 40]).unwrap();
    let mut out = [Completion::default(); 64];
    let (mut sent, mut inflight) = (0u64, 0u64);
    let start = std::time::Instant::now();
    while sent < N || inflight > 0 {
        // A deadlock guard, generous for a loaded machine (a run takes seconds).
        assert!(start.elapsed().as_secs() < 120, "sender stalled at {sent}");
        if sent < N && inflight < 8 {
            let sgl = [src.sge(0, 40).unwrap()];
            client
                .send(Payload::Sgl(&sgl), sent, PostFlags::SIGNALED)
                .unwrap();
            sent += 1;
            inflight += 1;
        }
        let n = scq.poll(&mut out);
        assert!(out[..n].iter().all(|c| c.is_ok()), "{:?}", &out[..n]);
        inflight -= n as u64;
    }
    stop.store(true, Ordering::Relaxed);
    mover.join().unwrap();
    let srq = poster.join().unwrap();
    let _rcq = poller.join().unwrap();
    let faults = nic(&dev).qp_stats(server.qpn()).unwrap().page_faults;
    assert!(faults > 0, "the exporter's moves met no receive");
    assert_eq!(srq.free(), SLOTS as u32, "every receive came back");
    drop(server);
}

/// The README's lifetime rule: a region dropped while the SRQ holds a receive into it stays
/// registered (the device may still write it) until that receive has completed; then
/// [`Pd::reclaim`] deregisters it, while the SRQ still holds other receives (issue 25: it
/// used to wait until the SRQ had none outstanding, which a busy server never reaches).
#[test]
fn a_region_dropped_under_an_srq_receive_stays_registered_until_that_receive_completes() {
    let mut f = fan(1, 7, 256, 64);
    let keep = f.pd.alloc_mr(4096, ALL).unwrap();
    let victim = f.pd.alloc_mr(4096, ALL).unwrap();
    f.srq.post_recv(&[victim.sge(0, 64).unwrap()], 1).unwrap();
    f.srq.post_recv(&[keep.sge(0, 64).unwrap()], 2).unwrap();
    drop(victim);
    assert_eq!(f.pd.reclaim(), 1, "parked: the SRQ holds a receive into it");
    // Larger than the CQE, so the NIC writes the (dropped) region itself.
    let src = f.pd.alloc_mr(4096, ALL).unwrap();
    src.write(0, &[7u8; 64]).unwrap();
    let mut statuses = Vec::new();
    for (i, (want_cookie, parked)) in [(1, 0), (2, 0)].into_iter().enumerate() {
        f.clients[0]
            .send(
                Payload::Sgl(&[src.sge(0, 64).unwrap()]),
                i as u64,
                PostFlags::SIGNALED,
            )
            .unwrap();
        f.dev.process();
        let r = poll_all(&mut f.rcq);
        assert_eq!(r.len(), 1);
        statuses.push((r[0].cookie, r[0].status));
        assert_eq!(r[0].cookie, want_cookie);
        assert_eq!(
            f.pd.reclaim(),
            parked,
            "after the receive of cookie {want_cookie}"
        );
    }
    assert_eq!(
        statuses,
        vec![(1, WcStatus::Success), (2, WcStatus::Success)],
        "the receive into the dropped region found it registered"
    );
    assert_eq!(bytes(&keep, 0, 64), vec![7u8; 64]);
    assert!(poll_all(&mut f.scq).iter().all(|c| c.is_ok()));
}

/// The other half of the lifetime rule: once the SRQ is gone (destroyed with its last QP),
/// its receives can never complete, and a region dropped under them is deregistered.
#[test]
fn a_region_dropped_under_an_srq_receive_is_deregistered_once_the_srq_is_gone() {
    let mut f = fan(1, 7, 256, 64);
    let victim = f.pd.alloc_mr(4096, ALL).unwrap();
    f.srq.post_recv(&[victim.sge(0, 64).unwrap()], 1).unwrap();
    drop(victim);
    assert_eq!(f.pd.reclaim(), 1, "parked: the SRQ holds a receive into it");
    let srqn = f.srq.srqn();
    let Fan {
        pd,
        srq,
        servers,
        dev,
        ..
    } = f;
    drop(srq);
    drop(servers);
    assert_eq!(nic(&dev).srq_pending(srqn), None, "the SRQ is destroyed");
    assert_eq!(pd.reclaim(), 0, "nothing can write the region any more");
}
