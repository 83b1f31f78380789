//! `AsyncCq` (feature `tokio`) on the software NIC in thread mode: completions awaited on a
//! current-thread and on a multi-thread runtime, completions racing the arm, a flush waking
//! the task, the refusals, and no allocation per completion (a counting global allocator,
//! as `tests/no_alloc/direct_zero_alloc.rs`).

mod alloc_count;

use alloc_count::allocs;
use blueflame::*;
use std::future::poll_fn;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const RIGHTS: Access =
    Access(Access::LOCAL_WRITE.0 | Access::REMOTE_WRITE.0 | Access::REMOTE_READ.0);

/// A sender `a` (its CQ polled) and a receiver `b` whose CQ has a channel of its own.
struct Pair {
    dev: Device,
    a: Qp,
    b: Qp,
    cq_a: Cq,
    cq_b: Option<Cq>,
    mr: MemoryRegion,
}

fn pair() -> Pair {
    pair_on(Device::sim())
}

/// `pair` on `dev`.
fn pair_on(dev: Device) -> Pair {
    let pd = dev.alloc_pd().unwrap();
    let ch = dev.create_channel().unwrap();
    let cq_a = dev.create_cq(256).unwrap();
    let cq_b = dev
        .create_cq_with(&CqOptions::new(256).channel(&ch))
        .unwrap();
    let mut a = pd.create_qp(&cq_a, &cq_a, QpCaps::default()).unwrap();
    let mut b = pd.create_qp(&cq_b, &cq_b, QpCaps::default()).unwrap();
    let (ea, eb) = (a.endpoint().unwrap(), b.endpoint().unwrap());
    a.connect(&eb).unwrap();
    b.connect(&ea).unwrap();
    let mr = pd.alloc_mr(4096, RIGHTS).unwrap();
    Pair {
        dev,
        a,
        b,
        cq_a,
        cq_b: Some(cq_b),
        mr,
    }
}

impl Pair {
    fn recv(&mut self, cookie: u64) {
        let sge = self.mr.sge(0, 64).unwrap();
        self.b.post_recv(&[sge], cookie).unwrap();
    }

    /// An unsignaled 8-byte send; A's CQ drained of nothing (unsignaled sends retire on
    /// the next signaled one, every 32).
    fn send(&mut self, i: u64) {
        let flags = if i % 32 == 31 {
            PostFlags::SIGNALED
        } else {
            PostFlags::UNSIGNALED
        };
        self.a
            .send(Payload::Inline(&i.to_le_bytes()), i, flags)
            .unwrap();
        let mut out = [Completion::default(); 4];
        let n = self.cq_a.poll(&mut out);
        assert!(out[..n].iter().all(|c| c.is_ok()), "{:?}", &out[..n]);
    }

    fn async_cq(&mut self) -> AsyncCq {
        AsyncCq::new(self.cq_b.take().unwrap()).unwrap()
    }
}

fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .unwrap()
}

/// Awaits with a deadline: a lost wake-up fails the test instead of hanging it. The time
/// is checked too: at its deadline tokio's timeout polls the future once more before it
/// says "elapsed", and that poll finds a completion whose event never came.
async fn next_within(cq: &mut AsyncCq) -> Completion {
    within(cq.next()).await.unwrap()
}

/// `f` within 20 s, woken before the deadline (see [`next_within`]).
async fn within<T>(f: impl std::future::Future<Output = T>) -> T {
    let t = Instant::now();
    let r = tokio::time::timeout(Duration::from_secs(20), f).await;
    assert!(
        r.is_ok() && t.elapsed() < Duration::from_secs(20),
        "no wake-up within 20 s (a wake-up was lost), after {:?}",
        t.elapsed()
    );
    r.unwrap()
}

#[test]
fn current_thread_runtime_sees_every_receive_in_order() {
    let mut p = pair();
    for i in 0..64 {
        p.recv(1000 + i);
    }
    let rt = current_thread();
    rt.block_on(async {
        let mut cq = p.async_cq();
        // One at a time (the task sleeps for each), then bursts of 16 (several come from
        // one wake-up).
        for i in 0..32u64 {
            p.send(i);
            let c = next_within(&mut cq).await;
            assert_eq!(
                (c.cookie, c.opcode, c.byte_len),
                (1000 + i, WcOpcode::Recv, 8)
            );
            p.recv(1064 + i);
        }
        for burst in 0..4u64 {
            for k in 0..16 {
                p.send(32 + burst * 16 + k);
            }
            for k in 0..16 {
                let c = next_within(&mut cq).await;
                assert!(c.is_ok(), "{c:?}");
                assert_eq!(c.cookie, 1032 + burst * 16 + k);
            }
        }
    });
}

#[test]
fn multi_thread_runtime_task_races_a_sender_thread() {
    race(pair());
}

#[test]
fn the_race_with_arms_that_count_only_later_completions() {
    // rxe's arm (and the IB specification's minimum): a completion written before the arm
    // raises no event, so only the poll after the arm finds it.
    let dev = Device::sim();
    dev.nic().unwrap().set_arm_next_only(true);
    race(pair_on(dev));
}

/// The task awaits on a worker thread while this thread sends with gaps of every size:
/// completions land before, during and after the task's poll / arm / poll / sleep (first
/// streaming, then one message at a time).
fn race(mut p: Pair) {
    const N: u64 = 2000;
    for i in 0..128 {
        p.recv(i);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_io()
        .enable_time()
        .build()
        .unwrap();
    let cq = rt.block_on(async { p.async_cq() });
    let seen = Arc::new(AtomicU64::new(0));
    let seen2 = seen.clone();
    let task = rt.spawn(async move {
        let mut cq = cq;
        for i in 0..N {
            // Through futures_core::Stream, as a stream combinator would call it.
            let c = within(poll_fn(|cx| {
                futures_core::Stream::poll_next(Pin::new(&mut cq), cx)
            }))
            .await
            .expect("the stream never ends")
            .unwrap();
            assert_eq!(c.cookie, i);
            seen2.store(i + 1, Ordering::Release);
        }
    });
    let mut posted = 128;
    for i in 0..N {
        // At most 128 receives outstanding (the CQ's room), and one for message i; 60 s
        // for each message.
        let t = Instant::now();
        loop {
            while posted < N && posted - seen.load(Ordering::Acquire) < 128 {
                p.recv(posted);
                posted += 1;
            }
            // The second half is a strict ping-pong: message i goes once the task has
            // taken message i - 1, so a wake-up lost between its poll and its arm is never
            // rescued by a later message.
            if posted > i && (i < N / 2 || seen.load(Ordering::Acquire) >= i) {
                break;
            }
            assert!(
                t.elapsed() < Duration::from_secs(60),
                "the task stopped at {i}"
            );
            std::thread::yield_now();
        }
        for _ in 0..(i * 7919 % 3000) {
            std::hint::spin_loop();
        }
        if i % 64 == 63 {
            std::thread::sleep(Duration::from_micros(300));
        }
        p.send(i);
    }
    rt.block_on(task).unwrap();
}

#[test]
fn flush_after_an_error_wakes_the_task() {
    let mut p = pair();
    for i in 0..3 {
        p.recv(i);
    }
    let rt = current_thread();
    let mut cq = rt.block_on(async { p.async_cq() });
    let mut b = p.b;
    // Another thread moves B to error once the task is (most likely) asleep on the channel.
    let failer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        b.set_error().unwrap();
        b
    });
    let got = rt.block_on(async {
        let mut got = Vec::new();
        for _ in 0..3 {
            let c = next_within(&mut cq).await;
            got.push((c.cookie, c.status));
        }
        got
    });
    failer.join().unwrap();
    assert_eq!(
        got,
        vec![
            (0, WcStatus::WrFlushErr),
            (1, WcStatus::WrFlushErr),
            (2, WcStatus::WrFlushErr)
        ]
    );
}

#[test]
fn refusals_are_typed_errors() {
    let mut p = pair();
    // Outside a runtime.
    let cq = p.cq_b.take().unwrap();
    let e = AsyncCq::new(cq).unwrap_err();
    assert!(matches!(e, Error::Unsupported(_)), "{e}");
    let rt = current_thread();
    rt.block_on(async {
        // A CQ without a channel.
        let e = AsyncCq::new(p.dev.create_cq(8).unwrap()).unwrap_err();
        assert!(matches!(e, Error::NoChannel { .. }), "{e}");
        // A channel shared by two CQs: its readiness would not say whose event came.
        let ch = p.dev.create_channel().unwrap();
        let opts = CqOptions::new(8).channel(&ch);
        let two = p.dev.create_cq_with(&opts).unwrap();
        let e = AsyncCq::new(p.dev.create_cq_with(&opts).unwrap()).unwrap_err();
        assert!(matches!(e, Error::InvalidParameter { value: 2, .. }), "{e}");
        // Once the other CQ is gone the channel serves one CQ: accepted.
        drop(two);
        let one = AsyncCq::new(p.dev.create_cq_with(&opts).unwrap()).unwrap();
        let (cq, rest) = one.into_inner();
        assert!(rest.is_empty());
        assert!(cq.channel().is_some());
    });
}

#[test]
fn a_cq_created_on_the_channel_an_async_cq_holds_is_refused() {
    // The stream reads every event of its channel: a CQ created on it afterwards would have
    // its events swallowed, and a waiter on it would never wake.
    let mut p = pair();
    let ch = p.cq_b.as_ref().unwrap().channel().unwrap().clone();
    let cqn = p.cq_b.as_ref().unwrap().cqn();
    let opts = CqOptions::new(8).channel(&ch);
    let rt = current_thread();
    rt.block_on(async {
        let cq = p.async_cq();
        let e = p
            .dev
            .create_cq_with(&opts)
            .expect_err("a CQ on the channel an AsyncCq holds");
        assert!(
            matches!(e, Error::ChannelTaken { cqn: c } if c == cqn),
            "{e}"
        );
        // The refused CQ left nothing behind: the stream still works.
        let mut cq = cq;
        p.recv(7);
        p.send(0);
        assert_eq!(next_within(&mut cq).await.cookie, 7);
        // Given back, the channel takes CQs again (and then AsyncCq::new refuses it).
        let (cq, rest) = cq.into_inner();
        assert!(rest.is_empty());
        let other = p.dev.create_cq_with(&opts).unwrap();
        let e = AsyncCq::new(cq).unwrap_err();
        assert!(matches!(e, Error::InvalidParameter { value: 2, .. }), "{e}");
        drop(other);
        // Dropped, too.
        let ch2 = p.dev.create_channel().unwrap();
        let opts2 = CqOptions::new(8).channel(&ch2);
        drop(AsyncCq::new(p.dev.create_cq_with(&opts2).unwrap()).unwrap());
        p.dev.create_cq_with(&opts2).unwrap();
    });
}

#[test]
fn an_event_read_through_another_handle_of_the_channel_does_not_strand_the_task() {
    // The program kept its handle of the channel (as every example does: `ch` made first,
    // the CQ on it, then `AsyncCq::new(cq)`). A wait or try_event through it while the
    // stream lives took the stream's event: the stream believed its arm outstanding, the
    // device had spent it, and the next completion raised no event; the task slept for good.
    let mut p = pair();
    let ch = p.cq_b.as_ref().unwrap().channel().unwrap().clone();
    for i in 0..4 {
        p.recv(1000 + i);
    }
    let rt = current_thread();
    rt.block_on(async {
        let mut cq = p.async_cq();
        // Nothing yet: the task arms the CQ and sleeps.
        let idle = tokio::time::timeout(Duration::from_millis(50), cq.next()).await;
        assert!(idle.is_err(), "{idle:?}");
        p.send(0);
        // Another part of the program waits on its handle of the channel meanwhile.
        let stolen = ch.wait(Some(Duration::from_millis(500))).unwrap();
        assert_eq!(next_within(&mut cq).await.cookie, 1000);
        // The next message comes while the task sleeps.
        // (tokio's timeout polls the future once more at its deadline, where the ring poll
        // finds the message: the time it took says whether the task was woken.)
        let t = Instant::now();
        let mut next = std::pin::pin!(tokio::time::timeout(Duration::from_secs(3), cq.next()));
        let mut sender = std::pin::pin!(async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            p.send(1);
        });
        let mut sent = false;
        let c = poll_fn(|cx| {
            if !sent {
                sent = std::future::Future::poll(sender.as_mut(), cx).is_ready();
            }
            std::future::Future::poll(next.as_mut(), cx)
        })
        .await;
        let took = t.elapsed();
        assert!(
            took < Duration::from_secs(2),
            "the task slept {took:?}: the second message raised no event (the channel's other \
             handle took {stolen:?}), only the timeout's last poll found it ({c:?})"
        );
        assert_eq!(c.unwrap().unwrap().cookie, 1001);
    });
}

#[test]
fn async_cq_new_racing_a_cq_creation_on_its_channel_never_lets_both_through() {
    // The check "the channel serves this CQ alone" and the taking of the channel are one
    // step, as are the check "not taken" and the joining of a new CQ: whichever comes
    // first, the other is refused.
    let dev = Device::sim();
    let rt = current_thread();
    let _in_rt = rt.enter();
    let (mut taken, mut counted) = (0, 0);
    for round in 0..300 {
        let ch = dev.create_channel().unwrap();
        let opts = CqOptions::new(8).channel(&ch);
        let cq = dev.create_cq_with(&opts).unwrap();
        let go = Arc::new(std::sync::Barrier::new(2));
        let (d, o, g) = (dev.clone(), opts.clone(), go.clone());
        let creator = std::thread::spawn(move || {
            g.wait();
            d.create_cq_with(&o)
        });
        go.wait();
        let stream = AsyncCq::new(cq);
        let created = creator.join().unwrap();
        match (&stream, &created) {
            (Ok(_), Err(Error::ChannelTaken { .. })) => taken += 1,
            (Err(Error::InvalidParameter { value: 2, .. }), Ok(_)) => counted += 1,
            (s, c) => panic!("round {round}: AsyncCq::new {s:?}, the other CQ {c:?}"),
        }
    }
    println!("the stream first {taken} times, the other CQ first {counted} times");
}

#[test]
fn a_runtime_without_io_is_refused_with_a_typed_error() {
    // Both flavours, built without `enable_io`: no reactor to register the channel with.
    let current = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let multi = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .build()
        .unwrap();
    for rt in [current, multi] {
        let dev = Device::sim();
        let ch = dev.create_channel().unwrap();
        let opts = CqOptions::new(8).channel(&ch);
        let cq = dev.create_cq_with(&opts).unwrap();
        let e = rt.block_on(async { AsyncCq::new(cq) }).unwrap_err();
        assert!(matches!(e, Error::Unsupported(_)), "{e}");
        // Nothing kept: the channel takes CQs again, and serves them.
        let mut cq = dev.create_cq_with(&opts).unwrap();
        cq.arm(Notify::Any).unwrap();
        assert_eq!(ch.try_event().unwrap(), None);
    }
}

#[test]
fn no_allocation_per_completion() {
    // The counter works.
    let before = allocs();
    drop(std::hint::black_box(vec![1u8; 10]));
    assert_eq!(allocs() - before, 1);

    const N: u64 = 2000;
    let mut p = pair();
    for i in 0..64 {
        p.recv(i);
    }
    let rt = current_thread();
    let slept = rt.block_on(async {
        let mut cq = p.async_cq();
        let mut total = 0u64;
        let mut slept = 0u64;
        for i in 0..N + 100 {
            let before = allocs();
            p.send(i);
            // Await the completion: most of the time the task arms and sleeps.
            let c = poll_fn(|cx| {
                let r = futures_core::Stream::poll_next(Pin::new(&mut cq), cx);
                if r.is_pending() {
                    slept += 1;
                }
                r.map(|c| c.expect("a completion stream never ends"))
            })
            .await
            .unwrap();
            p.recv(i + 64);
            if i >= 100 {
                // The first 100 are the warm-up (the poller learns its QPs).
                total += allocs() - before;
            }
            assert_eq!(c.cookie, i);
        }
        assert_eq!(total, 0, "allocations in {N} sends and awaited receives");
        slept
    });
    // The measured path really slept (the NIC runs in its own thread, so not every time).
    println!(
        "the task slept on the channel {slept} times in {} completions",
        N + 100
    );
    assert!(slept > 0);
}
