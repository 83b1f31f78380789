//! Two threads ping-pong through RDMA writes with the software NIC in thread mode: each
//! writes a counter into the other's buffer and spins on its own buffer for the answer.

use crate::common;

use blueflame::*;
use common::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const ROUNDS: u64 = 2000;
const TIMEOUT: Duration = Duration::from_secs(60);

/// How long a side waits before it calls the run failed: [`TIMEOUT`], times
/// `BLUEFLAME_TIMEOUT_SCALE` when set (the aarch64 stage runs under qemu-user, on a shared
/// machine: many times slower; a safety net against hangs, not a timing assertion).
fn timeout() -> Duration {
    let scale = std::env::var("BLUEFLAME_TIMEOUT_SCALE")
        .ok()
        .and_then(|v| v.parse::<u32>().ok())
        .unwrap_or(1)
        .max(1);
    TIMEOUT * scale
}

/// One side: its QP, CQ, the buffer the peer writes, and the peer's buffer.
struct Side {
    qp: Qp,
    cq: Cq,
    mine: MemoryRegion,
    peer: Remote,
}

/// Everything a side needs to fail fast instead of hanging.
struct Guard {
    abort: Arc<AtomicBool>,
    deadline: Instant,
}

impl Guard {
    fn check(&self, what: &str) {
        if self.abort.load(Ordering::Relaxed) {
            panic!("{what}: the other side failed");
        }
        if Instant::now() > self.deadline {
            self.abort.store(true, Ordering::Relaxed);
            panic!("{what}: timed out after {:?}", timeout());
        }
    }
}

/// Polls the side's CQ: every completion must be the next write, successful.
fn reap(side: &mut Side, next: &mut u64, out: &mut [Completion]) {
    let n = side.cq.poll(out);
    for c in &out[..n] {
        assert_eq!(c.status, WcStatus::Success, "{c:?}");
        assert_eq!(c.opcode, WcOpcode::RdmaWrite);
        assert_eq!(c.qpn, side.qp.qpn());
        assert_eq!(c.cookie, *next, "{c:?}");
        *next += 1;
    }
}

/// Spins until the side's buffer holds `want` (reaping completions meanwhile).
fn wait_for(side: &mut Side, want: u64, next: &mut u64, out: &mut [Completion], g: &Guard) {
    let mut spins = 0u64;
    loop {
        // The flag byte is read with a volatile load; the value after it.
        if side.mine.read_volatile_u8(8).unwrap() == (want & 0xff) as u8 {
            let v = side.mine.read_u64(0).unwrap();
            if v == want {
                return;
            }
        }
        reap(side, next, out);
        spins += 1;
        if spins % 1024 == 0 {
            g.check("waiting for the peer's write");
            std::thread::yield_now();
        }
    }
}

fn send(side: &mut Side, v: u64, g: &Guard) {
    let mut msg = [0u8; 9];
    msg[..8].copy_from_slice(&v.to_ne_bytes());
    msg[8] = (v & 0xff) as u8;
    let mut spins = 0u64;
    loop {
        match side
            .qp
            .write_inline(&msg, side.peer, v, PostFlags::SIGNALED)
        {
            Ok(()) => return,
            Err(Error::QueueFull { .. }) => {
                spins += 1;
                if spins % 1024 == 0 {
                    g.check("waiting for send-queue room");
                }
                std::hint::spin_loop();
            }
            Err(e) => panic!("post {v}: {e:?}"),
        }
    }
}

fn drain(side: &mut Side, next: &mut u64, upto: u64, out: &mut [Completion], g: &Guard) {
    while *next <= upto {
        reap(side, next, out);
        g.check("waiting for the last completions");
        std::hint::spin_loop();
    }
}

#[test]
fn two_threads_ping_pong_2000_round_trips() {
    let dev = Device::sim();
    assert_eq!(dev.process(), 0); // thread mode: the NIC runs by itself
    let pd = dev.alloc_pd().unwrap();
    let cq_a = dev.create_cq(256).unwrap();
    let cq_b = dev.create_cq(256).unwrap();
    let mut qp_a = pd.create_qp(&cq_a, &cq_a, QpCaps::default()).unwrap();
    let mut qp_b = pd.create_qp(&cq_b, &cq_b, QpCaps::default()).unwrap();
    qp_a.connect(&qp_b.endpoint().unwrap()).unwrap();
    qp_b.connect(&qp_a.endpoint().unwrap()).unwrap();
    let acc = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
    let buf_a = pd.alloc_mr(64, acc).unwrap();
    let buf_b = pd.alloc_mr(64, acc).unwrap();
    let (ra, rb) = (buf_a.remote(0).unwrap(), buf_b.remote(0).unwrap());
    let mut a = Side {
        qp: qp_a,
        cq: cq_a,
        mine: buf_a,
        peer: rb,
    };
    let mut b = Side {
        qp: qp_b,
        cq: cq_b,
        mine: buf_b,
        peer: ra,
    };
    let abort = Arc::new(AtomicBool::new(false));
    let deadline = Instant::now() + timeout();

    let g = Guard {
        abort: abort.clone(),
        deadline,
    };
    let pong = std::thread::spawn(move || {
        let mut out = [Completion::default(); 16];
        let mut next = 1;
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            for i in 1..=ROUNDS {
                wait_for(&mut b, i, &mut next, &mut out, &g);
                send(&mut b, i, &g);
            }
            drain(&mut b, &mut next, ROUNDS, &mut out, &g);
        }));
        if r.is_err() {
            g.abort.store(true, Ordering::Relaxed);
        }
        r.map(|_| (b, next))
    });

    let g = Guard {
        abort: abort.clone(),
        deadline,
    };
    let ping = std::thread::spawn(move || {
        let mut out = [Completion::default(); 16];
        let mut next = 1;
        let start = Instant::now();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            for i in 1..=ROUNDS {
                send(&mut a, i, &g);
                wait_for(&mut a, i, &mut next, &mut out, &g);
            }
            drain(&mut a, &mut next, ROUNDS, &mut out, &g);
        }));
        if r.is_err() {
            g.abort.store(true, Ordering::Relaxed);
        }
        r.map(|_| (a, next, start.elapsed()))
    });

    let pinged = ping.join().expect("ping thread");
    let ponged = pong.join().expect("pong thread");
    let (a, next_a, took) = pinged.unwrap_or_else(|e| std::panic::resume_unwind(e));
    let (b, next_b) = ponged.unwrap_or_else(|e| std::panic::resume_unwind(e));
    // Every write completed exactly once, in order, on both sides.
    assert_eq!(next_a, ROUNDS + 1);
    assert_eq!(next_b, ROUNDS + 1);
    // The last values stayed where they were written.
    assert_eq!(a.mine.read_u64(0).unwrap(), ROUNDS);
    assert_eq!(b.mine.read_u64(0).unwrap(), ROUNDS);
    let sa = nic(&dev).qp_stats(a.qp.qpn()).unwrap();
    let sb = nic(&dev).qp_stats(b.qp.qpn()).unwrap();
    assert_eq!((sa.wqes, sb.wqes), (ROUNDS, ROUNDS));
    eprintln!(
        "{ROUNDS} round trips in {took:?} ({:?} each)",
        took / ROUNDS as u32
    );
    drop((a, b));
}

/// The NIC thread reads the ring while the poster writes new WQEs into the blocks the poller
/// just freed: 30 000 writes (signaled and unsignaled, 1 to 4 blocks) on a 64-block ring,
/// every signaled cookie once and in order, every byte in place.
#[test]
fn threaded_nic_stream_of_writes() {
    let dev = Device::sim();
    let pd = dev.alloc_pd().unwrap();
    let mut cq = dev.create_cq(64).unwrap();
    let caps = QpCaps {
        sq_blocks: 64,
        ..QpCaps::default()
    };
    let mut qp = pd.create_qp(&cq, &cq, caps).unwrap();
    let q = qp.endpoint().unwrap();
    qp.connect(&q).unwrap();
    let dst = pd
        .alloc_mr(64 * 256, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    let deadline = Instant::now() + timeout();
    const N: u64 = 30_000;
    let sizes = [8usize, 200, 40, 100, 1, 60];
    let mut out = [Completion::default(); 16];
    let mut next_done = 0u64; // next signaled cookie expected
    let mut posted = 0u64;
    let mut buf = [0u8; 200];
    let signaled = |i: u64| i % 4 == 0 || i == N - 1;
    while next_done < N {
        if posted < N {
            let len = sizes[posted as usize % sizes.len()];
            let mut msg = [0u8; 200];
            for (k, b) in msg[..len].iter_mut().enumerate() {
                *b = (posted as u8).wrapping_mul(31) ^ k as u8;
            }
            let slot = posted as usize % 64;
            let flags = if signaled(posted) {
                PostFlags::SIGNALED
            } else {
                PostFlags::UNSIGNALED
            };
            match qp.write_inline(&msg[..len], dst.remote(slot * 256).unwrap(), posted, flags) {
                Ok(()) => posted += 1,
                Err(Error::QueueFull { .. }) => {}
                Err(e) => panic!("post {posted}: {e:?}"),
            }
        }
        let n = cq.poll(&mut out);
        for c in &out[..n] {
            assert_eq!(c.status, WcStatus::Success, "{c:?}");
            while !signaled(next_done) {
                next_done += 1;
            }
            assert_eq!(c.cookie, next_done, "{c:?}");
            // Everything up to this write has landed; check this one (its slot is not
            // rewritten before 64 more posts, and at most 64 blocks are in flight).
            let len = sizes[next_done as usize % sizes.len()];
            dst.read((next_done as usize % 64) * 256, &mut buf[..len])
                .unwrap();
            for (k, b) in buf[..len].iter().enumerate() {
                assert_eq!(*b, (next_done as u8).wrapping_mul(31) ^ k as u8);
            }
            next_done += 1;
        }
        if n == 0 && Instant::now() > deadline {
            panic!("timed out: {posted} posted, {next_done} done");
        }
    }
    assert_eq!(posted, N);
    assert_eq!(free_send(&mut qp), 64);
    assert_eq!(nic(&dev).qp_stats(q.qpn).unwrap().wqes, N);
}
