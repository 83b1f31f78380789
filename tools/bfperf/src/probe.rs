//! `bfperf icount-probe N`: runs N posts and polls through functions that callgrind can
//! measure one by one (`--toggle-collect=bfperf::probe::measured_*`): the post of an 8-byte
//! inline RDMA write with BlueFlame, a poll that finds one CQE, an empty poll, a batch of
//! 32 inline writes with one doorbell, an 8-byte inline send, an 8-byte RDMA read and a
//! 64-byte RDMA write from one buffer; and the same post on a QP whose BlueFlame register is
//! shared (rung under the register's lock). Every [`BURST_EVERY`]th iteration it also polls
//! bursts of 16 and 64 completions (one QP's signaled writes of one NIC pass) from a plain
//! CQ and from a compressed one (one session each). The NIC runs outside the measured
//! functions.

use blueflame::PostSend;
use blueflame::{
    Access, Completion, Cq, CqOptions, Device, DoorbellMode, MiniCqeFormat, PostFlags, Qp, QpCaps,
    Remote, UarConfig,
};

/// The burst probes run on one iteration in this many (`cargo xtask icount` divides by it).
pub const BURST_EVERY: usize = 8;

#[inline(never)]
fn measured_post(qp: &mut Qp, data: &[u8; 8], remote: Remote, cookie: u64) {
    qp.write_inline(data, remote, cookie, PostFlags::SIGNALED)
        .expect("post");
}

/// The post of `measured_post` on a shared register (a separate function: callgrind counts
/// it on its own).
#[inline(never)]
fn measured_post_shared(qp: &mut Qp, data: &[u8; 8], remote: Remote, cookie: u64) {
    qp.write_inline(data, remote, cookie, PostFlags::SIGNALED)
        .expect("post");
}

/// Posts an 8-byte inline send (bfperf's send latency test posts these).
#[inline(never)]
fn measured_post_send(qp: &mut Qp, data: &[u8; 8], cookie: u64) {
    qp.send(
        blueflame::Payload::Inline(data),
        cookie,
        PostFlags::SIGNALED,
    )
    .expect("send");
}

/// Posts an 8-byte inline RDMA write with immediate (the usual notification of a written
/// buffer), its immediate the cookie's low 32 bits.
#[inline(never)]
fn measured_post_write_imm(qp: &mut Qp, data: &[u8; 8], remote: Remote, cookie: u64) {
    let data = blueflame::Payload::Inline(data);
    qp.write_imm(data, remote, cookie as u32, cookie, PostFlags::SIGNALED)
        .expect("write with immediate");
}

/// Posts an 8-byte RDMA read into one buffer (bfperf's read latency test posts these).
#[inline(never)]
fn measured_post_read(qp: &mut Qp, sge: &[blueflame::Sge; 1], remote: Remote, cookie: u64) {
    qp.read(sge, remote, cookie, PostFlags::SIGNALED)
        .expect("read");
}

/// Posts a 64-byte RDMA write from one registered buffer (a message over the inline limit).
#[inline(never)]
fn measured_post_write_sge(qp: &mut Qp, sge: &[blueflame::Sge; 1], remote: Remote, cookie: u64) {
    qp.write(sge, remote, cookie, PostFlags::SIGNALED)
        .expect("write");
}

#[inline(never)]
fn measured_poll_hit(cq: &mut Cq, out: &mut [Completion; 1]) -> usize {
    cq.poll(out)
}

/// Polls with room for 16 (a typical batch; a different length from `measured_poll_hit`
/// also keeps the compiler from merging the two identical functions).
#[inline(never)]
fn measured_poll_empty(cq: &mut Cq, out: &mut [Completion; 16]) -> usize {
    cq.poll(out)
}

/// Posts one receive of one 64-byte buffer (the region pinned for it: its lookup and the
/// pin are part of the post).
#[inline(never)]
fn measured_post_recv(qp: &mut Qp, sge: &[blueflame::Sge; 1], cookie: u64) {
    qp.post_recv(sge, cookie).expect("post_recv");
}

/// Polls one receive completion of an 8-byte send: with scatter-to-CQE (the default, as on
/// a ConnectX) it includes the copy from the CQE into the receive buffer; run with
/// `MLX5_SCATTER_TO_CQE=0` to count the same poll when the NIC wrote the buffer.
#[inline(never)]
fn measured_poll_recv(cq: &mut Cq, out: &mut [Completion; 4]) -> usize {
    cq.poll(out)
}

/// A plain CQ and room for bursts of 16 and 64 completions.
struct PlainBurst {
    b16: [Completion; 16],
    b64: [Completion; 64],
    cq: Cq,
}

/// A compressed CQ and the same room, in another field order: the measured functions of
/// the two differ in their offsets, so LLVM never merges them (nor with
/// `measured_poll_empty`, whose array has room for 16 too).
struct ZipBurst {
    cq: Cq,
    b64: [Completion; 64],
    b16: [Completion; 16],
}

/// A burst of 16 completions from a plain CQ, in one poll.
#[inline(never)]
fn measured_poll_burst16(p: &mut PlainBurst) -> usize {
    p.cq.poll(&mut p.b16)
}

/// A burst of 64 completions from a plain CQ, in one poll.
#[inline(never)]
fn measured_poll_burst64(p: &mut PlainBurst) -> usize {
    p.cq.poll(&mut p.b64)
}

/// A compressed session of 16 completions, in one poll.
#[inline(never)]
fn measured_poll_zip16(z: &mut ZipBurst) -> usize {
    z.cq.poll(&mut z.b16)
}

/// A compressed session of 64 completions, in one poll.
#[inline(never)]
fn measured_poll_zip64(z: &mut ZipBurst) -> usize {
    z.cq.poll(&mut z.b64)
}

/// Posts `n` signaled 8-byte inline writes with one doorbell, runs the NIC once (one pass:
/// one compressed session on a compressing CQ), and checks what `poll` gets in one call.
fn burst(
    dev: &Device,
    qp: &mut Qp,
    remote: Remote,
    n: usize,
    poll: impl FnOnce() -> usize,
) -> Result<(), blueflame::Error> {
    let mut b = qp.batch();
    for i in 0..n as u64 {
        b.push(
            &blueflame::Request::Write {
                remote,
                data: blueflame::Payload::Inline(b"burst..."),
            },
            i,
            PostFlags::SIGNALED,
        )?;
    }
    b.ring()?;
    dev.process();
    assert_eq!(poll(), n, "a burst of {n} in one poll");
    Ok(())
}

#[inline(never)]
fn measured_batch32(qp: &mut Qp, data: &[u8; 8], remote: Remote, cookie: u64) {
    let mut b = qp.batch();
    for i in 0..32 {
        let flags = if i == 31 {
            PostFlags::SIGNALED
        } else {
            PostFlags::UNSIGNALED
        };
        b.push(
            &blueflame::Request::Write {
                remote,
                data: blueflame::Payload::Inline(data),
            },
            cookie + i,
            flags,
        )
        .expect("push");
    }
    b.ring().expect("ring");
}

/// Runs the probe.
pub fn run(n: usize) -> Result<(), blueflame::Error> {
    let dev = Device::sim_stepped();
    let pd = dev.alloc_pd()?;
    let mut cq = dev.create_cq(1024)?;
    let caps = QpCaps {
        sq_blocks: 1024,
        ..QpCaps::default()
    };
    let mut qp = pd.create_qp(&cq, &cq, caps)?;
    let q = qp.endpoint()?;
    qp.connect(&q)?;
    assert_eq!(qp.doorbell_mode(), Some(DoorbellMode::Dedicated));
    // A device with no register for thread domains: its QPs ring shared registers, locked.
    let uars = UarConfig {
        thread_domains: 0,
        ..UarConfig::default()
    };
    let shared_dev = Device::sim_with(Default::default(), uars, false);
    let shared_pd = shared_dev.alloc_pd()?;
    let mut shared_cq = shared_dev.create_cq(1024)?;
    let mut shared = shared_pd.create_qp(&shared_cq, &shared_cq, caps)?;
    let sq = shared.endpoint()?;
    shared.connect(&sq)?;
    assert_eq!(shared.doorbell_mode(), Some(DoorbellMode::SharedLocked));
    let shared_mr = shared_pd.alloc_mr(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE)?;
    let mr = pd.alloc_mr(
        4096,
        Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
    )?;
    let data = *b"12345678";
    let read_sge = [mr.sge(1024, 8)?];
    let write_sge = [mr.sge(1536, 64)?];
    let mut out = [Completion::default(); 1];
    let mut empty = [Completion::default(); 16];
    // Receives: a second loopback QP with CQs of its own (the first QP stays the last one
    // seen by `cq`, as in a latency loop).
    let mut rcq = dev.create_cq(1024)?;
    let mut rscq = dev.create_cq(1024)?;
    let mut rqp = pd.create_qp(&rscq, &rcq, caps)?;
    let r = rqp.endpoint()?;
    rqp.connect(&r)?;
    let mut rout = [Completion::default(); 4];
    // Bursts: a QP on a plain CQ and one on a compressed CQ, on a device of their own.
    let bdev = Device::sim_stepped();
    let bpd = bdev.alloc_pd()?;
    let bmr = bpd.alloc_mr(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE)?;
    let mut pb = Box::new(PlainBurst {
        b16: [Completion::default(); 16],
        b64: [Completion::default(); 64],
        cq: bdev.create_cq(1024)?,
    });
    let mut zb = Box::new(ZipBurst {
        cq: bdev.create_cq_with(&CqOptions::new(1024).compression(MiniCqeFormat::Hash))?,
        b64: [Completion::default(); 64],
        b16: [Completion::default(); 16],
    });
    let mut pqp = bpd.create_qp(&pb.cq, &pb.cq, caps)?;
    let mut zqp = bpd.create_qp(&zb.cq, &zb.cq, caps)?;
    let (pq, zq) = (pqp.endpoint()?, zqp.endpoint()?);
    pqp.connect(&pq)?;
    zqp.connect(&zq)?;
    let broom = bmr.remote(0)?;
    for i in 0..n as u64 {
        if (i as usize).is_multiple_of(BURST_EVERY) {
            burst(&bdev, &mut pqp, broom, 16, || {
                measured_poll_burst16(&mut pb)
            })?;
            burst(&bdev, &mut pqp, broom, 64, || {
                measured_poll_burst64(&mut pb)
            })?;
            burst(&bdev, &mut zqp, broom, 16, || measured_poll_zip16(&mut zb))?;
            burst(&bdev, &mut zqp, broom, 64, || measured_poll_zip64(&mut zb))?;
        }
        measured_post_recv(&mut rqp, &[mr.sge(512, 64)?], i);
        measured_post_send(&mut rqp, &data, i);
        dev.process();
        assert_eq!(measured_poll_recv(&mut rcq, &mut rout), 1);
        assert_eq!((rout[0].cookie, rout[0].byte_len), (i, 8));
        assert_eq!(rscq.poll(&mut out), 1);
        // The same QP's write with immediate to itself takes a receive (posted unmeasured).
        rqp.post_recv(&[mr.sge(512, 64)?], i)?;
        measured_post_write_imm(&mut rqp, &data, mr.remote(8)?, i);
        dev.process();
        assert_eq!(rcq.poll(&mut rout), 1);
        assert_eq!((rout[0].cookie, rout[0].imm), (i, Some(i as u32)));
        assert_eq!(rscq.poll(&mut out), 1);
        assert_eq!(
            (out[0].cookie, out[0].status),
            (i, blueflame::WcStatus::Success)
        );
        measured_post(&mut qp, &data, mr.remote(0)?, i);
        dev.process();
        let got = measured_poll_hit(&mut cq, &mut out);
        assert_eq!((got, out[0].cookie), (1, i));
        assert_eq!(measured_poll_empty(&mut cq, &mut empty), 0);
        // An 8-byte read of what the write put at 0 (its completion polled unmeasured).
        measured_post_read(&mut qp, &read_sge, mr.remote(0)?, i);
        dev.process();
        assert_eq!(cq.poll(&mut out), 1);
        assert_eq!((out[0].cookie, out[0].byte_len), (i, 8));
        // A 64-byte write from the region to itself (its completion polled unmeasured).
        measured_post_write_sge(&mut qp, &write_sge, mr.remote(2048)?, i);
        dev.process();
        assert_eq!(cq.poll(&mut out), 1);
        assert_eq!(
            (out[0].cookie, out[0].status),
            (i, blueflame::WcStatus::Success)
        );
        measured_batch32(&mut qp, &data, mr.remote(0)?, i);
        dev.process();
        assert_eq!(measured_poll_hit(&mut cq, &mut out), 1);
        measured_post_shared(&mut shared, &data, shared_mr.remote(0)?, i);
        shared_dev.process();
        assert_eq!(shared_cq.poll(&mut out), 1);
    }
    // Wall-clock cost of a post (no NIC in between: 256 posts of 1 block, then drain).
    let mut best = f64::MAX;
    for round in 0..200u64 {
        let t = std::time::Instant::now();
        for i in 0..256u64 {
            let flags = if i == 255 {
                PostFlags::SIGNALED
            } else {
                PostFlags::UNSIGNALED
            };
            qp.write_inline(&data, mr.remote(0)?, round * 256 + i, flags)?;
        }
        best = best.min(t.elapsed().as_nanos() as f64 / 256.0);
        dev.process();
        while cq.poll(&mut out) > 0 {}
    }
    eprintln!("post of an 8-byte inline write: {best:.1} ns (best of 200 rounds of 256)");
    let nic = bdev.nic().expect("software NIC");
    let (sessions, zipped) = nic.cq_sessions(zb.cq.cqn());
    assert_eq!(nic.cq_sessions(pb.cq.cqn()), (0, 0));
    assert_eq!(zipped, sessions / 2 * 80, "every burst was one session");
    eprintln!("compressed bursts: {sessions} sessions, {zipped} completions");
    Ok(())
}
