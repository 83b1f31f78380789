//! Completion events, the same cases on any device: a real verbs device (rxe in the VM:
//! `ibv_req_notify_cq`, `ibv_get_cq_event`, `ibv_ack_cq_events` on a completion channel,
//! `tests/rxe/rxe_events.rs`), the software NIC in thread mode (the arm doorbell and its
//! event descriptor) and rdma-core's provider in front of it (`tests/provider`: arms
//! through the provider's UAR page, events from its completion channel):
//! solicited-only arming, timeouts, many CQs on one channel, a flush after a QP error waking
//! a sleeping waiter, completions racing the arm, and a CQ dropped after events were read
//! (rdma-core's `ibv_destroy_cq` waits until every event read was acknowledged).

#![allow(dead_code)]

use crate::scenarios;

use blueflame::*;
use scenarios::*;
use std::time::{Duration, Instant};

/// Long enough for anything rxe does under emulation; a hang fails instead of stalling CI.
const PATIENCE: Duration = Duration::from_secs(20);

/// A requester `a` and a responder `b` whose CQ completes on `ch`.
struct Evt {
    dev: Device,
    ch: CompletionChannel,
    a: Qp,
    b: Qp,
    cq_a: Cq,
    /// Taken by the tests that wait in another thread.
    cq_b: Option<Cq>,
    mr_b: MemoryRegion,
}

impl Evt {
    fn new(dev: &Device, ch: &CompletionChannel) -> Evt {
        let pd = dev.alloc_pd().expect("pd");
        let cq_a = dev.create_cq(64).expect("cq a");
        let cq_b = dev
            .create_cq_with(&CqOptions::new(64).channel(ch))
            .expect("cq b on the channel");
        let mut a = pd.create_qp(&cq_a, &cq_a, caps()).expect("qp a");
        let mut b = pd.create_qp(&cq_b, &cq_b, caps()).expect("qp b");
        let (ea, eb) = (a.endpoint().expect("ep a"), b.endpoint().expect("ep b"));
        a.connect_with(&eb, &Timing::default()).expect("connect a");
        b.connect_with(&ea, &Timing::default()).expect("connect b");
        let mr_b = pd.alloc_mr(4096, RIGHTS).expect("mr b");
        Evt {
            dev: dev.clone(),
            ch: ch.clone(),
            a,
            b,
            cq_a,
            cq_b: Some(cq_b),
            mr_b,
        }
    }

    fn cq_b(&mut self) -> &mut Cq {
        self.cq_b.as_mut().expect("B's CQ")
    }

    fn post_recvs(&mut self, n: u64) {
        for i in 0..n {
            let sge = self.mr_b.sge(64 * (i as usize % 32), 64).expect("sge");
            self.b.post_recv(&[sge], 100 + i).expect("post_recv");
        }
    }

    /// A sends an 8-byte message (signaled, so A's CQ is drained as it goes).
    fn send(&mut self, cookie: u64, solicited: bool) {
        let flags = if solicited {
            PostFlags::SIGNALED.solicited()
        } else {
            PostFlags::SIGNALED
        };
        self.a
            .send(Payload::Inline(&cookie.to_le_bytes()), cookie, flags)
            .expect("send");
        self.reap_a(1);
    }

    /// Polls A's CQ until `n` successful completions came.
    fn reap_a(&mut self, n: usize) {
        let mut out = [Completion::default(); 16];
        let (mut got, t) = (0, Instant::now());
        while got < n {
            assert!(t.elapsed() < PATIENCE, "A: {got} of {n} completions");
            self.dev.process();
            let k = self.cq_a.poll(&mut out[..(n - got).min(16)]);
            assert!(out[..k].iter().all(|c| c.is_ok()), "{:?}", &out[..k]);
            got += k;
        }
    }

    /// Polls B's CQ (never waiting on the channel) until one completion came.
    fn poll_b(&mut self) -> Completion {
        let mut out = [Completion::default(); 1];
        let t = Instant::now();
        loop {
            assert!(t.elapsed() < PATIENCE, "no completion on B");
            self.dev.process();
            if self.cq_b().poll(&mut out) == 1 {
                return out[0];
            }
        }
    }
}

/// Solicited-only arming: a plain send that arrives after the arm raises no event (an
/// `Any` arm does, the control), a solicited one does.
pub fn solicited_filtering(dev: &Device) {
    let ch = dev.create_channel().expect("channel");
    let mut e = Evt::new(dev, &ch);
    e.post_recvs(4);
    // The control: an Any arm and a plain send raise an event.
    e.cq_b().arm(Notify::Any).expect("arm any");
    e.send(1, false);
    assert_eq!(e.poll_b().cookie, 100);
    let ev =
        e.ch.wait(Some(PATIENCE))
            .expect("wait")
            .expect("event after Any");
    assert_eq!(ev.cqn, e.cq_b().cqn());
    // Solicited only: the plain send is there (polled), and no event came for it.
    e.cq_b().arm(Notify::Solicited).expect("arm solicited");
    e.send(2, false);
    assert_eq!(e.poll_b().cookie, 101);
    assert!(
        e.ch.wait(Some(Duration::from_millis(300)))
            .expect("wait")
            .is_none(),
        "{}: an unsolicited send raised an event under a solicited-only arm",
        dev
    );
    // Still armed: a solicited send raises it.
    e.send(3, true);
    let ev =
        e.ch.wait(Some(PATIENCE))
            .expect("wait")
            .expect("solicited event");
    assert_eq!(ev.cqn, e.cq_b().cqn());
    let c = e.poll_b();
    assert_eq!((c.cookie, c.status), (102, WcStatus::Success));
    // One event per arm: nothing more until the next arm.
    e.send(4, true);
    assert_eq!(e.poll_b().cookie, 103);
    assert!(e.ch.try_event().expect("try_event").is_none());
}

/// Waits with a timeout come back empty after it, on the channel and on the CQ.
pub fn timeouts(dev: &Device) {
    let ch = dev.create_channel().expect("channel");
    let mut e = Evt::new(dev, &ch);
    let mut out = [Completion::default(); 4];
    let t = Instant::now();
    assert_eq!(
        e.cq_b()
            .wait(&mut out, Some(Duration::from_millis(150)))
            .expect("wait"),
        0
    );
    assert!(
        t.elapsed() >= Duration::from_millis(150),
        "{:?}",
        t.elapsed()
    );
    let t = Instant::now();
    assert!(e
        .ch
        .wait(Some(Duration::from_millis(100)))
        .expect("channel wait")
        .is_none());
    assert!(
        t.elapsed() >= Duration::from_millis(100),
        "{:?}",
        t.elapsed()
    );
    let t = Instant::now();
    let n = e
        .cq_b()
        .wait_spin(
            &mut out,
            Spin::Polls(1000),
            Some(Duration::from_millis(100)),
        )
        .expect("wait_spin");
    assert_eq!(n, 0);
    assert!(
        t.elapsed() >= Duration::from_millis(100),
        "{:?}",
        t.elapsed()
    );
    // A zero timeout polls once (the CQ was armed by the waits above; still nothing).
    assert_eq!(
        e.cq_b().wait(&mut out, Some(Duration::ZERO)).expect("poll"),
        0
    );
    // And the waits did arm: a send now comes back through the next wait.
    e.post_recvs(1);
    e.send(9, false);
    let n = e.cq_b().wait(&mut out, Some(PATIENCE)).expect("wait");
    assert_eq!((n, out[0].cookie), (1, 100));
}

/// Four CQs on one channel: each event names its CQ; every CQ gets exactly one per arm.
pub fn many_cqs_on_one_channel(dev: &Device) {
    let ch = dev.create_channel().expect("channel");
    let mut pairs: Vec<Evt> = (0..4).map(|_| Evt::new(dev, &ch)).collect();
    let cqns: Vec<u32> = pairs.iter_mut().map(|p| p.cq_b().cqn()).collect();
    for p in &mut pairs {
        p.post_recvs(2);
        p.cq_b().arm(Notify::Any).expect("arm");
    }
    // In an order other than creation.
    for i in [2usize, 0, 3, 1] {
        pairs[i].send(i as u64, false);
    }
    let mut seen = Vec::new();
    let t = Instant::now();
    while seen.len() < 4 {
        assert!(t.elapsed() < PATIENCE, "events seen: {seen:?}");
        if let Some(ev) = ch.wait(Some(PATIENCE)).expect("wait") {
            seen.push(ev.cqn);
        }
    }
    let (mut a, mut b) = (seen.clone(), cqns.clone());
    a.sort_unstable();
    b.sort_unstable();
    assert_eq!(a, b, "one event per CQ: {seen:?} for CQs {cqns:?}");
    // No second event without a new arm, although every CQ gets another completion.
    for p in &mut pairs {
        p.send(7, false);
    }
    for p in &mut pairs {
        assert_eq!(p.poll_b().cookie, 100);
        assert_eq!(p.poll_b().cookie, 101);
    }
    assert!(ch
        .wait(Some(Duration::from_millis(200)))
        .expect("wait")
        .is_none());
}

/// A thread asleep in `Cq::wait` is woken by the flushes of a QP moved to error.
pub fn flush_wakes_the_waiter(dev: &Device) {
    let ch = dev.create_channel().expect("channel");
    let mut e = Evt::new(dev, &ch);
    e.post_recvs(3);
    let mut cq_b = e.cq_b.take().expect("B's CQ");
    let waiter = std::thread::spawn(move || {
        let mut got = Vec::new();
        let mut out = [Completion::default(); 4];
        let t = Instant::now();
        while got.len() < 3 && t.elapsed() < PATIENCE {
            let n = cq_b.wait(&mut out, Some(PATIENCE)).expect("wait");
            got.extend(out[..n].iter().map(|c| (c.cookie, c.status)));
        }
        (got, t.elapsed())
    });
    // Let it fall asleep first (nothing in this test depends on it having done so).
    std::thread::sleep(Duration::from_millis(200));
    e.b.set_error().expect("b to error");
    let (got, took) = waiter.join().expect("waiter");
    println!("{}: woken by flushes after {took:?}", dev);
    assert_eq!(
        got,
        (100..103)
            .map(|c| (c, WcStatus::WrFlushErr))
            .collect::<Vec<_>>()
    );
}

/// Completions arriving at any moment of the waiter's poll / arm / poll / sleep: every one is
/// seen, in order, and none strands the waiter (whose waits alternate plain and
/// spin-then-sleep with varying budgets); first streaming, then one message at a time.
pub fn completions_race_the_arm(dev: &Device, n: u64) {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    let ch = dev.create_channel().expect("channel");
    let mut e = Evt::new(dev, &ch);
    let seen = Arc::new(AtomicU64::new(0));
    let mut cq_b = e.cq_b.take().expect("B's CQ");
    let seen2 = seen.clone();
    let waiter = std::thread::spawn(move || {
        let mut cookies = Vec::new();
        let mut out = [Completion::default(); 8];
        let mut round = 0u32;
        while (cookies.len() as u64) < n {
            round += 1;
            let got = if round % 2 == 0 {
                cq_b.wait(&mut out, Some(PATIENCE))
            } else {
                cq_b.wait_spin(&mut out, Spin::Polls(round % 64), Some(PATIENCE))
            }
            .expect("wait");
            assert!(got > 0, "stranded after {} completions", cookies.len());
            for c in &out[..got] {
                assert!(c.is_ok(), "{c:?}");
                cookies.push(c.cookie);
            }
            seen2.store(cookies.len() as u64, Ordering::Release);
        }
        cookies
    });
    let mut posted = 0u64;
    for i in 0..n {
        // Keep at most 32 receives outstanding (the receive queue's size), and one for
        // message i. PATIENCE for each message, not for the loop (rxe under emulation on a
        // loaded machine takes milliseconds per wake-up).
        let t = Instant::now();
        loop {
            while posted < n && posted - seen.load(Ordering::Acquire) < 32 {
                let sge = e.mr_b.sge(0, 64).expect("sge");
                e.b.post_recv(&[sge], 100 + posted).expect("post_recv");
                posted += 1;
            }
            // The second half is a strict ping-pong (message i once the waiter has taken
            // message i - 1): a wake-up lost between its poll and its arm is never rescued
            // by a later message.
            if posted > i && (i < n / 2 || seen.load(Ordering::Acquire) >= i) {
                break;
            }
            assert!(t.elapsed() < PATIENCE, "the waiter stopped at {i}");
            std::thread::yield_now();
        }
        // Vary the gap so sends land before, between and after the waiter's steps.
        for _ in 0..(i * 7919 % 2000) {
            std::hint::spin_loop();
        }
        if i % 16 == 15 {
            std::thread::sleep(Duration::from_micros(200));
        }
        e.send(i, false);
    }
    let cookies = waiter.join().expect("waiter");
    assert_eq!(cookies, (100..100 + n).collect::<Vec<_>>());
}

/// A CQ dropped after its events were read (acknowledgements batched and not yet given)
/// is destroyed without hanging.
pub fn drop_after_events(dev: &Device) {
    let ch = dev.create_channel().expect("channel");
    let mut e = Evt::new(dev, &ch);
    e.post_recvs(2);
    e.cq_b().arm(Notify::Any).expect("arm");
    e.send(1, false);
    assert!(e.ch.wait(Some(PATIENCE)).expect("wait").is_some());
    let done = std::sync::mpsc::channel();
    let Evt {
        a, b, cq_a, cq_b, ..
    } = e;
    let tx = done.0;
    std::thread::spawn(move || {
        drop((a, b, cq_a, cq_b));
        let _ = tx.send(());
    });
    done.1
        .recv_timeout(PATIENCE)
        .expect("dropping a CQ whose event was read hung");
}

/// Every case, in order.
pub fn check_all(dev: &Device) {
    solicited_filtering(dev);
    timeouts(dev);
    many_cqs_on_one_channel(dev);
    flush_wakes_the_waiter(dev);
    completions_race_the_arm(dev, 300);
    drop_after_events(dev);
}
