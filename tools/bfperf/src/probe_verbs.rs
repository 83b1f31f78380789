//! `bfperf icount-verbs N`: the verbs path on a real device (rxe in the VM of
//! `cargo xtask rxe-icount`), each operation in its own `#[inline(never)]` function for
//! callgrind (`--toggle-collect`): the crate's post of an 8-byte inline RDMA write, of an
//! 8-byte inline send and of an 8-byte RDMA read into one buffer (what bfperf's write-lat,
//! send-lat and read-lat post), its poll of one completion, its post of one receive and its
//! poll of one receive, beside the same operations as plain rdma-core calls
//! ([`blueflame::internals::Plain`]).
//!
//! The device runs between the measured calls: each poll is made after the completion had
//! time to arrive (the write's bytes are seen at the peer, then a pause); a poll that still
//! finds nothing is retried and counted as a miss, and every measured function's number of
//! calls is printed (`calls NAME N`) for the report to divide by.

use blueflame::internals::Plain;
use blueflame::{Completion, Cq, Device, Payload, PostFlags, Qp, QpCaps, Remote, Sge};
use blueflame::{PostSend, QueuePair};
use std::collections::BTreeMap;
use std::time::Duration;

#[inline(never)]
fn measured_verbs_post(qp: &mut Qp, data: &[u8; 8], remote: Remote, cookie: u64) {
    qp.write_inline(data, remote, cookie, PostFlags::SIGNALED)
        .expect("post");
}

/// An 8-byte inline RDMA write with immediate (the usual "this buffer is written" signal of
/// RPC and HPC code); the peer's receive and both completions are not measured.
#[inline(never)]
fn measured_verbs_post_write_imm(qp: &mut Qp, data: &[u8; 8], remote: Remote, cookie: u64) {
    let imm = cookie as u32;
    qp.write_imm(
        Payload::Inline(data),
        remote,
        imm,
        cookie,
        PostFlags::SIGNALED,
    )
    .expect("write with immediate");
}

#[inline(never)]
fn measured_verbs_poll_hit(cq: &mut Cq, out: &mut [Completion; 1]) -> usize {
    // An empty barrier (no instruction) so that this function's body differs from
    // `probe::measured_poll_hit`'s: LLVM merged the two identical functions, and the direct
    // path's row of `cargo xtask icount` found no `measured_poll_hit` to count (0.0).
    std::hint::black_box(());
    cq.poll(out)
}

#[inline(never)]
fn measured_verbs_post_send(qp: &mut Qp, data: &[u8; 8], cookie: u64) {
    qp.send(Payload::Inline(data), cookie, PostFlags::SIGNALED)
        .expect("send");
}

#[inline(never)]
fn measured_verbs_post_read(qp: &mut Qp, sge: &[Sge; 1], remote: Remote, cookie: u64) {
    qp.read(sge, remote, cookie, PostFlags::SIGNALED)
        .expect("read");
}

#[inline(never)]
fn measured_verbs_post_recv(qp: &mut Qp, sge: &[Sge; 1], cookie: u64) {
    qp.post_recv(sge, cookie).expect("post_recv");
}

#[inline(never)]
fn measured_verbs_poll_recv(cq: &mut Cq, out: &mut [Completion; 2]) -> usize {
    cq.poll(out)
}

#[inline(never)]
fn measured_plain_post_send(p: &mut Plain, wr_id: u64) -> i32 {
    p.post_send(wr_id)
}

#[inline(never)]
fn measured_plain_post_wr(p: &mut Plain, wr_id: u64) -> i32 {
    p.post_wr(wr_id).expect("ibv_wr_*")
}

#[inline(never)]
fn measured_plain_post_send_inline(p: &mut Plain, wr_id: u64) -> i32 {
    p.post_send_inline(wr_id)
}

#[inline(never)]
fn measured_plain_post_wr_send(p: &mut Plain, wr_id: u64) -> i32 {
    p.post_wr_send(wr_id).expect("ibv_wr_send")
}

#[inline(never)]
fn measured_plain_post_read(p: &mut Plain, wr_id: u64) -> i32 {
    p.post_read(wr_id)
}

#[inline(never)]
fn measured_plain_post_wr_read(p: &mut Plain, wr_id: u64) -> i32 {
    p.post_wr_read(wr_id).expect("ibv_wr_rdma_read")
}

#[inline(never)]
fn measured_plain_poll_cq(p: &mut Plain) -> Option<(u64, u32)> {
    p.poll_cq()
}

#[inline(never)]
fn measured_plain_start_poll(p: &mut Plain) -> Option<(u64, u32)> {
    p.start_poll()
}

#[inline(never)]
fn measured_plain_post_recv(p: &mut Plain, wr_id: u64) -> i32 {
    p.post_recv(wr_id)
}

/// Calls of each measured function.
#[derive(Default)]
struct Calls(BTreeMap<&'static str, u64>);

impl Calls {
    fn one(&mut self, name: &'static str) {
        *self.0.entry(name).or_default() += 1;
    }
}

/// Lets the device finish what was posted (the measured polls then find it).
fn settle() {
    match model_drain() {
        // SAFETY: the kernel model's `extern "C" fn()` (tools/kernel-model/src/inspect.rs).
        Some(drain) => unsafe { drain() },
        None => std::thread::sleep(Duration::from_micros(300)),
    }
}

/// The kernel model's `blueflame_kernel_model_drain` when the model is preloaded
/// (`cargo xtask icount`'s production route): the NIC runs every WQE rung so far before the
/// probe polls, so no measured poll finds nothing. Elsewhere (rxe) None.
fn model_drain() -> Option<unsafe extern "C" fn()> {
    static DRAIN: std::sync::OnceLock<Option<unsafe extern "C" fn()>> = std::sync::OnceLock::new();
    *DRAIN.get_or_init(|| {
        // SAFETY: dlsym with a NUL-terminated name; the symbol, when present, is the model's
        // `extern "C" fn()`, which lives as long as the process (the model is preloaded).
        unsafe {
            let p = libc::dlsym(libc::RTLD_DEFAULT, c"blueflame_kernel_model_drain".as_ptr());
            (!p.is_null())
                .then(|| std::mem::transmute::<*mut libc::c_void, unsafe extern "C" fn()>(p))
        }
    })
}

/// Polls with `poll` (measured, counted in `calls` under `name`) until it finds one; the
/// empty polls are counted as misses.
fn poll_until<T>(
    calls: &mut Calls,
    name: &'static str,
    misses: &mut u64,
    mut poll: impl FnMut() -> Option<T>,
) -> T {
    for _ in 0..100_000 {
        settle();
        calls.one(name);
        if let Some(v) = poll() {
            return v;
        }
        *misses += 1;
    }
    eprintln!("bfperf: {name}: no completion");
    std::process::exit(1);
}

/// Polls the plain pair until `a`'s completion (and `b`'s, when `recv`) of request `i`.
fn plain_wait(plain: &mut Plain, i: u64, recv: bool) {
    let (mut recv_seen, mut send_seen) = (!recv, false);
    for _ in 0..1_000_000 {
        if recv && !recv_seen {
            recv_seen = plain.poll_b().is_some();
        }
        if !send_seen {
            if let Some((id, st)) = plain.poll_cq() {
                assert_eq!((id, st), (i, 0), "plain completion");
                send_seen = true;
            }
        }
        if recv_seen && send_seen {
            return;
        }
        settle();
    }
    eprintln!("bfperf: the plain pair's request {i}: no completion");
    std::process::exit(1);
}

/// One plain inline send into a receive posted first (`ibv_post_send`, or `ibv_wr_*`
/// when `ex`).
fn plain_send(
    plain: &mut Plain,
    calls: &mut Calls,
    i: u64,
    ex: bool,
) -> Result<(), blueflame::Error> {
    if plain.post_recv(i) != 0 {
        return Err(blueflame::Error::Unsupported(
            "the plain pair's ibv_post_recv",
        ));
    }
    let rc = if ex {
        calls.one("measured_plain_post_wr_send");
        measured_plain_post_wr_send(plain, i)
    } else {
        calls.one("measured_plain_post_send_inline");
        measured_plain_post_send_inline(plain, i)
    };
    assert_eq!(rc, 0, "plain send");
    plain_wait(plain, i, true);
    Ok(())
}

/// One plain 8-byte read (`ibv_post_send`, or `ibv_wr_*` when `ex`).
fn plain_read(plain: &mut Plain, calls: &mut Calls, i: u64, ex: bool) {
    let rc = if ex {
        calls.one("measured_plain_post_wr_read");
        measured_plain_post_wr_read(plain, i)
    } else {
        calls.one("measured_plain_post_read");
        measured_plain_post_read(plain, i)
    };
    assert_eq!(rc, 0, "plain read");
    plain_wait(plain, i, false);
}

/// Runs the probe on `BLUEFLAME_DEVICE` (GID index `BLUEFLAME_GID_INDEX`).
pub fn run(n: usize) -> Result<(), blueflame::Error> {
    let dev = Device::open_default()?;
    let name = std::env::var("BLUEFLAME_DEVICE").unwrap_or_default();
    let gid = std::env::var("BLUEFLAME_GID_INDEX")
        .ok()
        .and_then(|v| v.parse().ok());
    let pd = dev.alloc_pd()?;
    let (mut cq_a, mut cq_b) = (dev.create_cq(64)?, dev.create_cq(64)?);
    // One scatter entry per receive, as the plain pair's QPs (`verbs::probe::Plain`): with
    // the default 4, libmlx5 ends each one-entry receive WQE with an invalid entry, 5
    // instructions the plain call did not pay (receive post 204.8 -> 199.8).
    let caps = QpCaps {
        sq_blocks: 256,
        rq_entries: 64,
        max_inline: 64,
        max_recv_sge: 1,
        ..QpCaps::default()
    };
    let mut a = pd.create_qp(&cq_a, &cq_a, caps)?;
    let mut b = pd.create_qp(&cq_b, &cq_b, caps)?;
    let (ea, eb) = (a.endpoint()?, b.endpoint()?);
    a.connect(&eb)?;
    b.connect(&ea)?;
    // A pair of its own for the write with immediate: on `a` it would shift which of the
    // other rows' posts pays the amortised room refills (the write's row 428 -> 449).
    let (mut cq_c, mut cq_d) = (dev.create_cq(64)?, dev.create_cq(64)?);
    let mut qc = pd.create_qp(&cq_c, &cq_c, caps)?;
    let mut qd = pd.create_qp(&cq_d, &cq_d, caps)?;
    let (ec, ed) = (qc.endpoint()?, qd.endpoint()?);
    qc.connect(&ed)?;
    qd.connect(&ec)?;
    let rights = blueflame::Access::LOCAL_WRITE
        | blueflame::Access::REMOTE_WRITE
        | blueflame::Access::REMOTE_READ;
    let mr = pd.alloc_mr(4096, rights)?;
    let mut plain = Plain::new(&name, gid)?;
    eprintln!(
        "bfperf: icount-verbs on {}: QP {:?} (doorbell {:?}), CQ {:?}; plain pair extended: {}",
        dev,
        a.verbs_api(),
        a.doorbell_mode(),
        cq_a.verbs_api(),
        plain.has_extended()
    );
    let mut calls = Calls::default();
    let mut misses = 0u64;
    let mut out = [Completion::default(); 1];
    let mut rout = [Completion::default(); 2];
    let rsge = [mr.sge(512, 64)?];
    let read_sge = [mr.sge(1024, 8)?];
    for i in 0..n as u64 {
        let tag = (i % 250) as u8 + 1;
        // The crate: write + poll hit.
        let data = [tag; 8];
        calls.one("measured_verbs_post");
        measured_verbs_post(&mut a, &data, mr.remote(0)?, i);
        let c = poll_until(&mut calls, "measured_verbs_poll_hit", &mut misses, || {
            (measured_verbs_poll_hit(&mut cq_a, &mut out) == 1).then_some(out[0])
        });
        assert!(c.is_ok() && c.cookie == i, "{c:?}");
        // The crate: receive post + receive poll (the send is not measured).
        calls.one("measured_verbs_post_recv");
        measured_verbs_post_recv(&mut b, &rsge, i);
        calls.one("measured_verbs_post_send");
        measured_verbs_post_send(&mut a, &data, i);
        let c = poll_until(&mut calls, "measured_verbs_poll_recv", &mut misses, || {
            (measured_verbs_poll_recv(&mut cq_b, &mut rout) == 1).then_some(rout[0])
        });
        assert!(c.is_ok() && c.cookie == i && c.byte_len == 8, "{c:?}");
        let mut spins = 0;
        while cq_a.poll(&mut out) == 0 {
            spins += 1;
            assert!(spins < 1_000_000, "send completion");
            settle();
        }
        // The crate: an 8-byte read of what the write put at 0 (its poll is not measured).
        calls.one("measured_verbs_post_read");
        measured_verbs_post_read(&mut a, &read_sge, mr.remote(0)?, i);
        let mut spins = 0;
        while cq_a.poll(&mut out) == 0 {
            spins += 1;
            assert!(spins < 1_000_000, "read completion");
            settle();
        }
        assert!(
            out[0].is_ok() && out[0].cookie == i && out[0].byte_len == 8,
            "{:?}",
            out[0]
        );
        // The crate: an 8-byte inline write with immediate into a posted receive (the
        // receive, its poll and the write's poll are not measured).
        qd.post_recv(&rsge, i)?;
        calls.one("measured_verbs_post_write_imm");
        measured_verbs_post_write_imm(&mut qc, &data, mr.remote(8)?, i);
        let mut spins = 0;
        while cq_d.poll(&mut rout[..1]) == 0 {
            spins += 1;
            assert!(spins < 1_000_000, "write-with-immediate receive");
            settle();
        }
        assert!(
            rout[0].is_ok() && rout[0].cookie == i && rout[0].imm == Some(i as u32),
            "{:?}",
            rout[0]
        );
        let mut spins = 0;
        while cq_c.poll(&mut out) == 0 {
            spins += 1;
            assert!(spins < 1_000_000, "write-with-immediate completion");
            settle();
        }
        assert!(out[0].is_ok() && out[0].cookie == i, "{:?}", out[0]);
        // Plain rdma-core: ibv_post_send + ibv_poll_cq.
        plain.set_tag(tag);
        calls.one("measured_plain_post_send");
        assert_eq!(measured_plain_post_send(&mut plain, i), 0);
        let (id, st) = poll_until(&mut calls, "measured_plain_poll_cq", &mut misses, || {
            measured_plain_poll_cq(&mut plain)
        });
        assert_eq!((id, st), (i, 0));
        // Plain rdma-core: ibv_wr_* + ibv_start_poll (where the provider has them).
        if plain.has_extended() {
            calls.one("measured_plain_post_wr");
            assert_eq!(measured_plain_post_wr(&mut plain, i), 0);
            let (id, st) = poll_until(&mut calls, "measured_plain_start_poll", &mut misses, || {
                measured_plain_start_poll(&mut plain)
            });
            assert_eq!((id, st), (i, 0));
        }
        // Plain rdma-core: ibv_post_recv (the send and both polls are not measured).
        calls.one("measured_plain_post_recv");
        assert_eq!(measured_plain_post_recv(&mut plain, i), 0);
        plain.send(i)?;
        let (mut recv_seen, mut send_seen) = (false, false);
        for _ in 0..1_000_000 {
            recv_seen |= plain.poll_b().is_some();
            send_seen |= plain.poll_cq().is_some();
            if recv_seen && send_seen {
                break;
            }
            settle();
        }
        assert!(recv_seen && send_seen, "plain send");
        // Plain rdma-core: the inline send and the read as the crate's rows post them,
        // through each API (the receives and the polls are not measured).
        plain_send(&mut plain, &mut calls, i, false)?;
        plain_read(&mut plain, &mut calls, i, false);
        if plain.has_extended() {
            plain_send(&mut plain, &mut calls, i, true)?;
            plain_read(&mut plain, &mut calls, i, true);
        }
    }
    for (name, n) in &calls.0 {
        println!("calls {name} {n}");
    }
    println!("misses {misses}");
    Ok(())
}
