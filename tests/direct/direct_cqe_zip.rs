//! CQE compression on the direct path: the software NIC writes runs of completions of one
//! QP as compressed sessions (a title CQE and arrays of 8 mini-CQEs, holes between them,
//! sessions that wrap the ring), and the poller reads them in place with exactly the
//! completions an uncompressed CQ gives.

use crate::common;

use blueflame::*;
use common::*;
use proptest::prelude::*;

/// A requester `a` and a responder `b` on one stepped software NIC, with their CQs.
struct Rig {
    dev: Device,
    a: Qp,
    b: Qp,
    cq_a: Cq,
    cq_b: Option<Cq>,
    dst: MemoryRegion,
    src: MemoryRegion,
    rbuf: MemoryRegion,
    next_recv: u64,
}

/// CQs compressing with `zip` (None: plain), of `entries`; `shared`: one CQ for both QPs.
fn rig(zip: Option<MiniCqeFormat>, entries: u32, shared: bool) -> Rig {
    let dev = Device::sim_stepped();
    let pd = dev.alloc_pd().unwrap();
    let mk = |n| match zip {
        Some(f) => zip_cq(&dev, n, f),
        None => dev.create_cq(n).unwrap(),
    };
    let cq_a = mk(entries);
    let cq_b = (!shared).then(|| mk(entries));
    let caps = QpCaps {
        scatter_to_cqe: true,
        ..QpCaps::default()
    };
    let mut a = pd.create_qp(&cq_a, &cq_a, caps).unwrap();
    let rcq = cq_b.as_ref().unwrap_or(&cq_a);
    let mut b = pd.create_qp(rcq, rcq, caps).unwrap();
    a.connect(&b.endpoint().unwrap()).unwrap();
    b.connect(&a.endpoint().unwrap()).unwrap();
    let dst = pd.alloc_mr(1 << 16, ALL).unwrap();
    let src = pd.alloc_mr(1 << 16, ALL).unwrap();
    fill(&src, 0x5a);
    let rbuf = pd.alloc_mr(1 << 16, ALL).unwrap();
    Rig {
        dev,
        a,
        b,
        cq_a,
        cq_b,
        dst,
        src,
        rbuf,
        next_recv: 0,
    }
}

/// One operation of the generated sequences.
#[derive(Copy, Clone, Debug)]
enum Op {
    /// Inline RDMA write from `a`; signaled or not.
    Write(bool),
    /// RDMA write of `len` registered bytes from `a`.
    WriteSgl(u32),
    /// RDMA read of `len` bytes by `a`.
    Read(u32),
    /// Fetch-and-add by `a`.
    FetchAdd,
    /// Send of `len` bytes from `a` into a receive posted on `b` (up to 32 bytes arrive
    /// inside the CQE: never compressed).
    Send(u32),
    /// Write with immediate `imm` from `a`, consuming a receive of `b`.
    WriteImm(u32),
    /// Inline RDMA write from `b` to `a` (interleaves QPs on a shared CQ).
    WriteFromB,
}

impl Rig {
    /// Posts `op` with cookie `k`; a post refused for want of room (the CQ's or a
    /// queue's: the same on both rigs, which poll everything at the end of each round) is
    /// skipped.
    fn post(&mut self, op: Op, k: u64) {
        match self.try_post(op, k) {
            Ok(()) | Err(Error::CqFull { .. } | Error::QueueFull { .. }) => {}
            Err(e) => panic!("{op:?}: {e}"),
        }
    }

    fn try_post(&mut self, op: Op, k: u64) -> Result<()> {
        let r = |rig: &Rig, off: usize| rig.dst.remote(off % 60_000).unwrap();
        match op {
            Op::Write(signaled) => {
                let f = if signaled {
                    PostFlags::SIGNALED
                } else {
                    PostFlags::UNSIGNALED
                };
                self.a
                    .write_inline(&k.to_le_bytes(), r(self, k as usize * 8), k, f)
            }
            Op::WriteSgl(len) => {
                let sge = self.src.sge(0, len).unwrap();
                self.a.write(&[sge], r(self, 1000), k, PostFlags::SIGNALED)
            }
            Op::Read(len) => {
                let sge = self.src.sge(4096, len).unwrap();
                self.a.read(&[sge], r(self, 2000), k, PostFlags::SIGNALED)
            }
            Op::FetchAdd => {
                let sge = self.src.sge(8192 + (k as usize % 64) * 8, 8).unwrap();
                let remote = self.dst.remote(60_000 + (k as usize % 8) * 8).unwrap();
                self.a.fetch_add(remote, 1, sge, k, PostFlags::SIGNALED)
            }
            Op::Send(len) => {
                self.recv()?;
                let sge = self.src.sge(0, len).unwrap();
                self.a.send(Payload::Sgl(&[sge]), k, PostFlags::SIGNALED)
            }
            Op::WriteImm(imm) => {
                self.recv()?;
                self.a.write_imm(
                    Payload::Inline(b"imm"),
                    r(self, 3000),
                    imm,
                    k,
                    PostFlags::SIGNALED,
                )
            }
            Op::WriteFromB => {
                let remote = self.dst.remote(5000).unwrap();
                self.b
                    .write_inline(&k.to_le_bytes(), remote, k, PostFlags::SIGNALED)
            }
        }
    }

    /// Posts a receive of 256 bytes on `b` (cookie from 1_000_000 up).
    fn recv(&mut self) -> Result<()> {
        let i = self.next_recv;
        let sge = self.rbuf.sge((i as usize % 200) * 256, 256).unwrap();
        self.b.post_recv(&[sge], 1_000_000 + i)?;
        self.next_recv += 1;
        Ok(())
    }

    /// Polls every CQ empty, `chunk` completions at most per call.
    fn poll(&mut self, chunk: usize) -> Vec<Completion> {
        let mut v = Vec::new();
        let mut out = vec![Completion::default(); chunk.max(1)];
        for cq in std::iter::once(&mut self.cq_a).chain(self.cq_b.as_mut()) {
            loop {
                let n = cq.poll(&mut out);
                if n == 0 {
                    break;
                }
                v.extend_from_slice(&out[..n]);
            }
        }
        v
    }

    /// Compressed sessions written so far (both CQs), and the completions in them.
    fn sessions(&self) -> (u64, u64) {
        let nic = nic(&self.dev);
        let (mut s, mut c) = nic.cq_sessions(self.cq_a.cqn());
        if let Some(cq) = &self.cq_b {
            let (s2, c2) = nic.cq_sessions(cq.cqn());
            (s, c) = (s + s2, c + c2);
        }
        (s, c)
    }
}

/// Runs `rounds` (each: operations posted, one NIC pass, CQs polled `chunk` at a time, or
/// not at all for 0) on a rig; returns every completion in order.
fn run(rig: &mut Rig, rounds: &[(Vec<Op>, usize)]) -> Vec<Completion> {
    let mut all = Vec::new();
    let mut k = 0;
    for (ops, chunk) in rounds {
        for &op in ops {
            rig.post(op, k);
            k += 1;
        }
        rig.dev.process();
        if *chunk > 0 {
            all.extend(rig.poll(*chunk));
        }
    }
    all.extend(rig.poll(5));
    all
}

/// The same rounds on an uncompressed and a compressed rig: the same completions. Returns
/// the compressed rig's session counts.
#[track_caller]
fn same_as_plain(
    format: MiniCqeFormat,
    entries: u32,
    shared: bool,
    rounds: &[(Vec<Op>, usize)],
) -> (u64, u64) {
    let mut plain = rig(None, entries, shared);
    let want = run(&mut plain, rounds);
    assert_eq!(plain.sessions(), (0, 0));
    let mut zip = rig(Some(format), entries, shared);
    let got = run(&mut zip, rounds);
    assert_eq!(got.len(), want.len(), "completion count");
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g, w, "completion {i}");
    }
    // Nothing more comes, on the next passes either (stale slots of old sessions).
    zip.dev.process();
    assert!(zip.poll(8).is_empty(), "nothing after the last completion");
    zip.sessions()
}

#[test]
fn sessions_of_every_length_give_the_uncompressed_completions() {
    // 1 (written plain) to 70: up to 9 mini-CQE arrays, past the NIC's 64 per session.
    for n in 1..=70usize {
        let rounds = vec![(vec![Op::Write(true); n], 64)];
        let (sessions, zipped) = same_as_plain(MiniCqeFormat::Hash, 256, false, &rounds);
        let want = match n {
            1 => (0, 0),
            2..=64 => (1, n as u64),
            65 => (1, 64), // 64 in a session, the last one plain
            _ => (2, n as u64),
        };
        assert_eq!((sessions, zipped), want, "n = {n}");
    }
}

#[test]
fn sessions_wrap_the_ring_over_many_passes() {
    // A CQ of 16 entries, sessions of 5 to 16 completions: their titles, arrays and holes
    // fall on every slot and wrap the ring, pass after pass.
    let rounds: Vec<(Vec<Op>, usize)> = (0..120)
        .map(|i| (vec![Op::Write(true); 5 + (i * 7) % 12], 1 + i % 5))
        .collect();
    for format in MiniCqeFormat::ALL {
        let (sessions, zipped) = same_as_plain(format, 16, false, &rounds);
        assert_eq!(sessions, 120, "{format}");
        assert!(zipped > 1000, "{zipped}");
    }
}

#[test]
fn a_session_polled_one_at_a_time_gives_its_entries_back_at_its_end() {
    // CQ of 8: eight signaled writes fill it and come as one session. While it is read one
    // completion per poll, the consumer index stays on the title (publishing a position
    // inside the session would let the NIC overwrite the title and arrays being read), so
    // the entries come back, and the QP may post again, only after the last one.
    let mut r = rig(Some(MiniCqeFormat::Hash), 8, false);
    let cap = r.cq_a.capacity();
    for k in 0..u64::from(cap) {
        r.post(Op::Write(true), k);
    }
    let full =
        r.a.write_inline(b"x", r.dst.remote(0).unwrap(), 99, PostFlags::SIGNALED);
    assert!(matches!(full, Err(Error::CqFull { .. })), "{full:?}");
    r.dev.process();
    assert_eq!(r.sessions(), (1, u64::from(cap)));
    let mut out = [Completion::default(); 1];
    for k in 0..u64::from(cap) {
        assert_eq!(r.cq_a.poll(&mut out), 1);
        assert_ok(&out[0], k, WcOpcode::RdmaWrite, 0, r.a.qpn());
        if k + 1 < u64::from(cap) {
            let e =
                r.a.write_inline(b"x", r.dst.remote(0).unwrap(), 99, PostFlags::SIGNALED);
            assert!(matches!(e, Err(Error::CqFull { .. })), "after {k}: {e:?}");
        }
    }
    assert_eq!(r.cq_a.poll(&mut out), 0);
    r.a.write_inline(b"x", r.dst.remote(0).unwrap(), 99, PostFlags::SIGNALED)
        .unwrap();
    r.dev.process();
    assert_eq!(r.cq_a.poll(&mut out), 1);
    assert_ok(&out[0], 99, WcOpcode::RdmaWrite, 0, r.a.qpn());
    assert!(!nic(&r.dev).cq_overrun(r.cq_a.cqn()));
}

#[test]
fn interleaved_qps_on_one_cq() {
    // Runs of each QP break the sessions where the QP changes; a run of one is plain.
    let pattern = [3usize, 1, 5, 2, 9, 1, 1, 4, 12, 2];
    let mut ops: Vec<Vec<Op>> = Vec::new();
    for (i, &n) in pattern.iter().enumerate() {
        let op = if i % 2 == 0 {
            Op::Write(true)
        } else {
            Op::WriteFromB
        };
        ops.push(vec![op; n]);
    }
    // One NIC pass per run (the NIC runs each QP's work in turn within a pass), polled
    // only now and then: the ring holds sessions and plain entries of both QPs.
    let mut rounds = Vec::new();
    for chunk in [7, 3] {
        for (i, run) in ops.iter().enumerate() {
            rounds.push((run.clone(), if i % 4 == 3 { chunk } else { 0 }));
        }
    }
    let (sessions, zipped) = same_as_plain(MiniCqeFormat::Hash, 128, true, &rounds);
    // Runs of 2 or more: 3, 5, 2, 9, 4, 12, 2 per round.
    assert_eq!((sessions, zipped), (14, 74));
}

#[test]
fn receive_sessions_take_their_counters_from_the_title() {
    // Sends longer than 32 bytes land in the buffer (a CQE carrying data is never
    // compressed); writes with the same immediate compress, a new immediate starts a new
    // session (the mini-CQE has no room for it).
    let mut ops = vec![Op::Send(100); 20];
    ops.extend([Op::Send(8); 3]); // inside the CQE: plain
    ops.extend(vec![Op::Send(64); 10]);
    ops.extend(vec![Op::WriteImm(7); 6]);
    ops.extend(vec![Op::WriteImm(8); 6]);
    ops.push(Op::WriteImm(9));
    for format in MiniCqeFormat::ALL {
        let rounds = vec![(ops.clone(), 5), (ops.clone(), 64)];
        let (sessions, zipped) = same_as_plain(format, 256, false, &rounds);
        // Per round: the requester's 66 completions in two sessions (20 and the 46 after
        // the three scattered sends... as long as no other CQE breaks them), and the
        // receiver's 20, 10, 6, 6.
        assert!(sessions >= 8, "{format}: {sessions}");
        assert!(zipped >= 2 * (20 + 10 + 6 + 6), "{format}: {zipped}");
    }
}

#[test]
fn reads_and_atomics_report_their_mini_cqe_byte_counts() {
    let ops: Vec<Op> = (0..40)
        .map(|i| match i % 4 {
            0 => Op::Read(8 + i),
            1 => Op::FetchAdd,
            2 => Op::WriteSgl(100 + i),
            _ => Op::Write(i % 8 != 3),
        })
        .collect();
    let (sessions, _) = same_as_plain(
        MiniCqeFormat::Csum,
        64,
        false,
        &[(ops.clone(), 16), (ops, 1)],
    );
    assert!(sessions >= 2);
}

#[test]
fn errors_are_never_compressed_and_flushes_match() {
    // Good writes, then a write with a bad key: the QP goes to error, the writes after it
    // are flushed; the session before the error is closed by it.
    let go = |zip: Option<MiniCqeFormat>| {
        let mut r = rig(zip, 64, false);
        for k in 0..10u64 {
            r.post(Op::Write(true), k);
        }
        let mut bad = r.dst.remote(0).unwrap();
        bad.rkey ^= 0x55_5500;
        r.a.write_inline(b"bad", bad, 10, PostFlags::SIGNALED)
            .unwrap();
        for k in 11..20u64 {
            r.post(Op::Write(k % 2 == 0), k);
        }
        r.dev.process();
        let c = r.poll(3);
        (c, r.sessions())
    };
    let (want, plain) = go(None);
    let (got, zipped) = go(Some(MiniCqeFormat::Hash));
    assert_eq!(plain, (0, 0));
    assert_eq!(got, want);
    assert_eq!(
        zipped,
        (1, 10),
        "the writes before the error, nothing after"
    );
    assert_eq!(got[10].status, WcStatus::RemAccessErr);
    assert!(got[11..].iter().all(|c| c.status == WcStatus::WrFlushErr));
}

#[test]
fn compression_the_device_lacks_is_refused_with_its_caps() {
    let dev = Device::sim_stepped();
    let caps = dev.cqe_compression_caps().unwrap();
    assert_eq!(caps.max_num, 64);
    let no_stridx = CqeCompCaps {
        supported_format: MiniCqeFormat::Hash.bit() | MiniCqeFormat::Csum.bit(),
        ..caps
    };
    nic(&dev).set_cqe_comp_caps(no_stridx);
    match dev.create_cq_with(&CqOptions::new(16).compression(MiniCqeFormat::CsumStridx)) {
        Err(Error::CqeCompression {
            format: MiniCqeFormat::CsumStridx,
            cqe_size: 64,
            caps: Some(c),
        }) => assert_eq!(c, no_stridx),
        other => panic!("{other:?}"),
    }
    let e = dev
        .create_cq_with(&CqOptions::new(16).compression(MiniCqeFormat::CsumStridx))
        .unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("MLX5DV_CQE_RES_FORMAT_CSUM_STRIDX") && msg.contains("0x3"),
        "{msg}"
    );
    assert!(dev
        .create_cq_with(&CqOptions::new(16).compression(MiniCqeFormat::Csum))
        .is_ok());
    nic(&dev).set_cqe_comp_caps(CqeCompCaps { max_num: 0, ..caps });
    assert!(matches!(
        dev.create_cq_with(&CqOptions::new(16).compression(MiniCqeFormat::Hash)),
        Err(Error::CqeCompression { .. })
    ));
}

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => any::<bool>().prop_map(Op::Write),
        1 => (1u32..300).prop_map(Op::WriteSgl),
        1 => (1u32..300).prop_map(Op::Read),
        1 => Just(Op::FetchAdd),
        2 => (1u32..200).prop_map(Op::Send),
        1 => (0u32..3).prop_map(Op::WriteImm),
        2 => Just(Op::WriteFromB),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Random sequences of requests, rounds and poll sizes, on CQs of 16 to 64 entries,
    /// shared or not: the compressed CQ gives exactly the uncompressed one's completions.
    #[test]
    fn random_sequences_give_the_same_completions(
        rounds in prop::collection::vec(
            (prop::collection::vec(op_strategy(), 0..14), 1usize..20),
            1..24,
        ).prop_map(|mut r| {
            // Polled now and then only (0: not this round).
            for (i, x) in r.iter_mut().enumerate() {
                if i % 3 == 1 {
                    x.1 = 0;
                }
            }
            r
        }),
        entries in prop_oneof![Just(16u32), Just(32), Just(64)],
        shared in any::<bool>(),
        format in prop_oneof![
            Just(MiniCqeFormat::Hash),
            Just(MiniCqeFormat::Csum),
            Just(MiniCqeFormat::CsumStridx),
        ],
    ) {
        same_as_plain(format, entries, shared, &rounds);
    }
}

/// A stepped software NIC with one QP number (the next QP gets a dropped one's), a
/// compressing CQ and a region.
struct OneQpNumber {
    dev: Device,
    pd: Pd,
    cq: Cq,
    mr: MemoryRegion,
}

fn one_qp_number() -> OneQpNumber {
    let dev = Device::sim_with(
        mlx5::sim::Limits {
            keys: 0xff_ffff,
            qps: 1,
            cqs: 64,
        },
        blueflame::UarConfig::default(),
        false,
    );
    let pd = dev.alloc_pd().unwrap();
    let cq = zip_cq(&dev, 64, MiniCqeFormat::Hash);
    let mr = pd.alloc_mr(4096, ALL).unwrap();
    OneQpNumber { dev, pd, cq, mr }
}

/// A QP on `cq` connected to itself.
fn loopback(pd: &Pd, cq: &Cq) -> Qp {
    let mut qp = pd.create_qp(cq, cq, QpCaps::default()).unwrap();
    let q = qp.endpoint().unwrap();
    qp.connect(&q).unwrap();
    qp
}

/// B's ten signaled writes (cookies 100..110), run.
fn ten_new_writes(dev: &Device, b: &mut Qp, mr: &MemoryRegion) {
    for i in 0..10u64 {
        b.write_inline(
            b"new",
            mr.remote(600).unwrap(),
            100 + i,
            PostFlags::SIGNALED,
        )
        .unwrap();
    }
    dev.process();
}

/// Everything left in `cq` is B's ten writes (`ten_new_writes`), successful, on `qpn`.
fn only_the_new_writes(cq: &mut Cq, qpn: u32) {
    let got = poll_all(cq);
    let cookies: Vec<u64> = got.iter().map(|c| c.cookie).collect();
    assert_eq!(cookies, (100..110).collect::<Vec<_>>(), "only B's: {got:?}");
    assert!(got.iter().all(|c| c.is_ok() && c.qpn == qpn));
}

#[test]
fn a_dropped_qps_sessions_are_discarded_and_its_number_reused() {
    // One QP number: the next QP gets the dropped one's. QP A leaves sessions and plain
    // entries in the CQ (unpolled) and is dropped; the teardown scan must step over A's
    // sessions (a title's length, not its owner bits, says where the next entry is), and
    // the poller discards them whole.
    let OneQpNumber {
        dev,
        pd,
        mut cq,
        mr,
    } = one_qp_number();
    let mut a = loopback(&pd, &cq);
    let qpn = a.qpn();
    for round in 0..3u64 {
        for i in 0..(5 + round * 4) {
            a.write_inline(b"old", mr.remote(512).unwrap(), i, PostFlags::SIGNALED)
                .unwrap();
        }
        a.post_recv(&[mr.sge(0, 64).unwrap()], 900 + round).unwrap();
        a.send(Payload::Inline(b"me"), 50 + round, PostFlags::SIGNALED)
            .unwrap();
        dev.process();
    }
    assert_eq!(nic(&dev).cq_sessions(cq.cqn()), (3, 5 + 9 + 13));
    drop(a);

    let mut b = loopback(&pd, &cq);
    assert_eq!(b.qpn(), qpn, "the software NIC reuses the number");
    ten_new_writes(&dev, &mut b, &mr);
    assert_eq!(nic(&dev).cq_sessions(cq.cqn()), (4, 5 + 9 + 13 + 10));
    only_the_new_writes(&mut cq, qpn);
}

#[test]
fn a_half_read_session_of_a_dropped_qp_is_not_given_to_its_successor() {
    // QP A's session is read in part (the consumer index stays on its title), then A is
    // dropped and B takes its number: the rest of A's session must be discarded, not
    // reported as B's completions with cookies from B's queue.
    let OneQpNumber {
        dev,
        pd,
        mut cq,
        mr,
    } = one_qp_number();
    let mut a = loopback(&pd, &cq);
    let qpn = a.qpn();
    for i in 0..10u64 {
        a.write_inline(b"old", mr.remote(512).unwrap(), i, PostFlags::SIGNALED)
            .unwrap();
    }
    dev.process();
    assert_eq!(nic(&dev).cq_sessions(cq.cqn()), (1, 10));
    let mut first = [Completion::default(); 3];
    assert_eq!(cq.poll(&mut first), 3);
    assert_eq!(first.map(|c| c.cookie), [0, 1, 2]);
    drop(a);

    let mut b = loopback(&pd, &cq);
    assert_eq!(b.qpn(), qpn, "the software NIC reuses the number");
    ten_new_writes(&dev, &mut b, &mr);
    only_the_new_writes(&mut cq, qpn);
}

#[test]
fn completion_events_fire_for_sessions_and_for_a_session_left_half_read() {
    let dev = Device::sim_stepped();
    let pd = dev.alloc_pd().unwrap();
    let ch = dev.create_channel().unwrap();
    let mut cq = dev
        .create_cq_with(
            &CqOptions::new(64)
                .channel(&ch)
                .compression(MiniCqeFormat::Hash),
        )
        .unwrap();
    let mut qp = pd.create_qp(&cq, &cq, QpCaps::default()).unwrap();
    let q = qp.endpoint().unwrap();
    qp.connect(&q).unwrap();
    let mr = pd.alloc_mr(64, ALL).unwrap();
    let cqn = cq.cqn();
    let mut write = |k: u64| {
        qp.write_inline(b"zip", mr.remote(0).unwrap(), k, PostFlags::SIGNALED)
            .unwrap()
    };
    // One arm, a session of 10: one event.
    cq.arm(Notify::Any).unwrap();
    for k in 0..10 {
        write(k);
    }
    dev.process();
    assert_eq!(nic(&dev).cq_sessions(cqn), (1, 10));
    assert_eq!(ch.try_event().unwrap(), Some(CqEvent { cqn }));
    assert_eq!(ch.try_event().unwrap(), None);
    // Three read, the rest of the session still there: the consumer index the device sees
    // is the title's, so an arm now fires at once (entries past it), as on a ConnectX.
    let mut out = [Completion::default(); 3];
    assert_eq!(cq.poll(&mut out), 3);
    cq.arm(Notify::Any).unwrap();
    dev.process();
    assert_eq!(ch.try_event().unwrap(), Some(CqEvent { cqn }));
    let mut rest = [Completion::default(); 16];
    assert_eq!(cq.poll(&mut rest), 7);
    assert_eq!(rest[6].cookie, 9);
    // Cq::wait over a second session.
    for k in 10..15 {
        write(k);
    }
    dev.process();
    let n = cq
        .wait(&mut rest, Some(std::time::Duration::from_secs(5)))
        .unwrap();
    assert_eq!(n, 5);
    assert_eq!(
        rest[..5].iter().map(|c| c.cookie).collect::<Vec<_>>(),
        (10..15).collect::<Vec<_>>()
    );
    assert_eq!(nic(&dev).cq_sessions(cqn), (2, 15));
}

/// Receive sessions whose receive counters (title's + j, 16 bits) cross
/// 0xffff inside a session, and requester sessions whose WQE counters cross it: 72,000
/// writes with immediate (each a receive of `b`) and as many writes, the same completions
/// as an uncompressed CQ.
#[test]
fn receive_counters_cross_0xffff_inside_sessions() {
    let rounds: Vec<(Vec<Op>, usize)> = (0..1200)
        .map(|i| {
            let mut v = vec![Op::WriteImm(7); 60];
            v.extend(vec![Op::Write(i % 3 == 0); 60]);
            (v, 16)
        })
        .collect();
    let (sessions, zipped) = same_as_plain(MiniCqeFormat::Hash, 256, false, &rounds);
    assert!(zipped > 100_000, "{sessions} {zipped}");
}
