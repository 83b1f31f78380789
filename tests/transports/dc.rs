//! Dynamically connected transport on the software NIC through the direct path: one DCI
//! talking to several DCTs in turn, many DCIs to one DCT, and what a ConnectX gives the
//! initiator for a wrong DC key, a missing DCT, an operation the target's rights refuse,
//! a bad remote key; flushes; one destination at a time under the relaxed ordering mode.

use blueflame::*;

const ALL: Access = Access(
    Access::LOCAL_WRITE.0
        | Access::REMOTE_WRITE.0
        | Access::REMOTE_READ.0
        | Access::REMOTE_ATOMIC.0,
);
const DCT_ALL: Access =
    Access(Access::REMOTE_WRITE.0 | Access::REMOTE_READ.0 | Access::REMOTE_ATOMIC.0);

/// Polls `cq` until `n` completions arrived (draining the stepped NIC between polls).
pub(crate) fn wait(dev: &Device, cq: &mut Cq, n: usize) -> Vec<Completion> {
    let mut got = Vec::new();
    let mut out = [Completion::default(); 16];
    for _ in 0..10_000 {
        let k = cq.poll(&mut out);
        got.extend_from_slice(&out[..k]);
        if got.len() >= n {
            break;
        }
        if k == 0 && dev.process() == 0 {
            dev.nic().unwrap().drain();
        }
    }
    got
}

/// Nothing more arrives on `cq` once the NIC has drained.
fn quiet(dev: &Device, cq: &mut Cq) {
    dev.nic().unwrap().drain();
    let mut out = [Completion::default(); 4];
    assert_eq!(cq.poll(&mut out), 0, "unexpected {:?}", &out[..1]);
}

#[test]
fn one_dci_writes_reads_and_runs_atomics_on_several_dcts_in_turn() {
    let dev = Device::sim_stepped();
    // Each target in its own protection domain, with its own region.
    let targets: Vec<(Pd, Dct, MemoryRegion, Cq)> = (0..3u64)
        .map(|i| {
            let pd = dev.alloc_pd().unwrap();
            let cq = dev.create_cq(16).unwrap();
            let srq = pd.create_srq(&cq, SrqCaps::default()).unwrap();
            let dct = pd.create_dct(&cq, &srq, 0x1000 + i, DCT_ALL).unwrap();
            let mr = pd.alloc_mr(4096, ALL).unwrap();
            mr.write(512, &(100 * i).to_ne_bytes()).unwrap();
            (pd, dct, mr, cq)
        })
        .collect();
    let pd = dev.alloc_pd().unwrap();
    let mut cq = dev.create_cq(64).unwrap();
    let mut dci = pd.create_dci(&cq, QpCaps::default()).unwrap();
    let local = pd.alloc_mr(4096, ALL).unwrap();
    local.write(0, b"0123456789abcdef").unwrap();
    let mut cookie = 0;
    // Round robin: every request goes to the next DCT.
    for round in 0..2u64 {
        for (i, (_, dct, mr, _)) in targets.iter().enumerate() {
            let peer = dct.peer().unwrap();
            let off = 64 * round as usize;
            let fl = PostFlags::SIGNALED;
            dci.to(&peer)
                .write(
                    &[local.sge(0, 16).unwrap()],
                    mr.remote(off).unwrap(),
                    cookie,
                    fl,
                )
                .unwrap();
            cookie += 1;
            dci.to(&peer)
                .write_inline(&[i as u8; 8], mr.remote(off + 16).unwrap(), cookie, fl)
                .unwrap();
            cookie += 1;
            let into = local.sge(1024 + 64 * (3 * round as usize + i), 24).unwrap();
            dci.to(&peer)
                .read(&[into], mr.remote(off).unwrap(), cookie, fl)
                .unwrap();
            cookie += 1;
            let reply = local.sge(2048 + 8 * (3 * round as usize + i), 8).unwrap();
            dci.to(&peer)
                .fetch_add(mr.remote(512).unwrap(), 1, reply, cookie, fl)
                .unwrap();
            cookie += 1;
        }
    }
    let got = wait(&dev, &mut cq, cookie as usize);
    assert_eq!(got.len(), cookie as usize);
    for (i, c) in got.iter().enumerate() {
        assert_eq!(
            (c.cookie, c.status, c.qpn),
            (i as u64, WcStatus::Success, dci.qpn()),
            "{c:?}"
        );
        let want = [
            WcOpcode::RdmaWrite,
            WcOpcode::RdmaWrite,
            WcOpcode::RdmaRead,
            WcOpcode::FetchAdd,
        ][i % 4];
        assert_eq!(c.opcode, want);
    }
    for round in 0..2usize {
        for (i, (_, _, mr, _)) in targets.iter().enumerate() {
            let mut b = [0u8; 24];
            mr.read(64 * round, &mut b).unwrap();
            assert_eq!(&b[..16], b"0123456789abcdef");
            assert_eq!(b[16..], [i as u8; 8]);
            // The read saw the writes posted before it (same DCI, in order).
            local.read(1024 + 64 * (3 * round + i), &mut b).unwrap();
            assert_eq!(&b[..16], b"0123456789abcdef", "read of target {i}");
            let mut r = [0u8; 8];
            local.read(2048 + 8 * (3 * round + i), &mut r).unwrap();
            assert_eq!(
                dci.atomic_result(&r).unwrap(),
                100 * i as u64 + round as u64
            );
        }
    }
    let mut targets = targets;
    for (i, (_, _, mr, tcq)) in targets.iter_mut().enumerate() {
        assert_eq!(mr.read_u64(512).unwrap(), 100 * i as u64 + 2);
        // Writes, reads and atomics consume no receive: the targets' CQs stay empty.
        quiet(&dev, tcq);
    }
    quiet(&dev, &mut cq);
}

#[test]
fn many_dcis_share_one_dct() {
    let dev = Device::sim_stepped();
    let pd = dev.alloc_pd().unwrap();
    let tcq = dev.create_cq(16).unwrap();
    let tsrq = pd.create_srq(&tcq, SrqCaps::default()).unwrap();
    let dct = pd.create_dct(&tcq, &tsrq, 7, DCT_ALL).unwrap();
    let mr = pd.alloc_mr(4096, ALL).unwrap();
    let peer = dct.peer().unwrap();
    let mut cq = dev.create_cq(256).unwrap();
    let mut dcis: Vec<Dci> = (0..8)
        .map(|_| pd.create_dci(&cq, QpCaps::default()).unwrap())
        .collect();
    let qpns: Vec<u32> = dcis.iter().map(|d| d.qpn()).collect();
    let mut uniq = qpns.clone();
    uniq.sort_unstable();
    uniq.dedup();
    assert_eq!(uniq.len(), 8);
    assert!(!qpns.contains(&dct.dctn()), "one number space");
    for k in 0..4u64 {
        for (i, d) in dcis.iter_mut().enumerate() {
            let reply = mr.sge(1024 + 8 * (4 * i + k as usize), 8).unwrap();
            d.to(&peer)
                .fetch_add(mr.remote(0).unwrap(), 1, reply, k, PostFlags::SIGNALED)
                .unwrap();
        }
    }
    let got = wait(&dev, &mut cq, 32);
    assert_eq!(got.len(), 32);
    assert!(got.iter().all(|c| c.status == WcStatus::Success));
    for q in &qpns {
        let mine: Vec<u64> = got
            .iter()
            .filter(|c| c.qpn == *q)
            .map(|c| c.cookie)
            .collect();
        assert_eq!(mine, [0, 1, 2, 3], "each DCI's completions in order");
    }
    assert_eq!(mr.read_u64(0).unwrap(), 32);
    // Every old value from 0 to 31 came back exactly once.
    let mut olds: Vec<u64> = (0..32)
        .map(|j| {
            let mut r = [0u8; 8];
            mr.read(1024 + 8 * j, &mut r).unwrap();
            dcis[0].atomic_result(&r).unwrap()
        })
        .collect();
    olds.sort_unstable();
    assert_eq!(olds, (0..32).collect::<Vec<_>>());
}

#[test]
fn a_wrong_dc_key_is_dropped_the_dci_exhausts_its_retries_and_flushes() {
    let dev = Device::sim_stepped();
    let pd = dev.alloc_pd().unwrap();
    let tcq = dev.create_cq(16).unwrap();
    let tsrq = pd.create_srq(&tcq, SrqCaps::default()).unwrap();
    let dct = pd.create_dct(&tcq, &tsrq, 0xabcd, DCT_ALL).unwrap();
    let mr = pd.alloc_mr(4096, ALL).unwrap();
    let mut cq = dev.create_cq(64).unwrap();
    let timing = Timing {
        timeout: 10,
        retry_cnt: 3,
        ..Timing::default()
    };
    let mut dci = pd.create_dci_with(&cq, QpCaps::default(), &timing).unwrap();
    let bad = dct.peer().unwrap().with_key(0xabce);
    let t0 = dev.nic().unwrap().now_ns();
    dci.to(&bad)
        .write_inline(b"nope", mr.remote(0).unwrap(), 1, PostFlags::SIGNALED)
        .unwrap();
    dci.to(&dct.peer().unwrap())
        .write_inline(b"late", mr.remote(8).unwrap(), 2, PostFlags::UNSIGNALED)
        .unwrap();
    dci.to(&dct.peer().unwrap())
        .write_inline(b"later", mr.remote(16).unwrap(), 3, PostFlags::SIGNALED)
        .unwrap();
    let got = wait(&dev, &mut cq, 3);
    let st: Vec<(u64, WcStatus)> = got.iter().map(|c| (c.cookie, c.status)).collect();
    assert_eq!(
        st,
        [
            (1, WcStatus::RetryExcErr),
            (2, WcStatus::WrFlushErr),
            (3, WcStatus::WrFlushErr)
        ]
    );
    assert_eq!(
        got[0].syndrome.map(|s| s.0),
        Some(0x15),
        "TRANSPORT_RETRY_EXC"
    );
    // Sent once and retransmitted retry_cnt times, each after a local ACK timeout.
    let nic = dev.nic().unwrap();
    assert_eq!(nic.dct_stats(dct.dctn()).unwrap().key_violations, 4);
    assert!(nic.now_ns() - t0 >= 4 * mlx5::sim::ack_timeout_ns(10).unwrap());
    assert_eq!(nic.qp_state(dci.qpn()), Some(mlx5::sim::QpState::Error));
    // Nothing landed; the target still serves a DCI that knows its key.
    assert_eq!(mr.read_u64(0).unwrap(), 0);
    assert_eq!(mr.read_u64(8).unwrap(), 0);
    let mut other = pd.create_dci(&cq, QpCaps::default()).unwrap();
    other
        .to(&dct.peer().unwrap())
        .write_inline(b"ok", mr.remote(0).unwrap(), 4, PostFlags::SIGNALED)
        .unwrap();
    let got = wait(&dev, &mut cq, 1);
    assert_eq!((got[0].cookie, got[0].status), (4, WcStatus::Success));
    assert_eq!(&mr.read_u64(0).unwrap().to_ne_bytes()[..2], b"ok");
    quiet(&dev, &mut cq);
}

/// A target side (CQ, SRQ), a region, and a DCI whose retries run out fast (one retry,
/// ACK timeout 8) on a CQ of its own.
struct ShortRetries {
    dev: Device,
    pd: Pd,
    tcq: Cq,
    tsrq: Srq,
    mr: MemoryRegion,
    cq: Cq,
    timing: Timing,
    dci: Dci,
}

fn short_retries() -> ShortRetries {
    let dev = Device::sim_stepped();
    let pd = dev.alloc_pd().unwrap();
    let tcq = dev.create_cq(16).unwrap();
    let tsrq = pd.create_srq(&tcq, SrqCaps::default()).unwrap();
    let mr = pd.alloc_mr(4096, ALL).unwrap();
    let cq = dev.create_cq(64).unwrap();
    let timing = Timing {
        timeout: 8,
        retry_cnt: 1,
        ..Timing::default()
    };
    let dci = pd.create_dci_with(&cq, QpCaps::default(), &timing).unwrap();
    ShortRetries {
        dev,
        pd,
        tcq,
        tsrq,
        mr,
        cq,
        timing,
        dci,
    }
}

#[test]
fn a_missing_dct_gives_the_initiator_a_transport_retry_error() {
    let ShortRetries {
        dev,
        pd,
        tcq,
        tsrq,
        mr,
        mut cq,
        timing,
        mut dci,
    } = short_retries();
    let dct = pd.create_dct(&tcq, &tsrq, 1, DCT_ALL).unwrap();
    let peer = dct.peer().unwrap();
    drop(dct);
    let reply = mr.sge(64, 8).unwrap();
    dci.to(&peer)
        .compare_swap(mr.remote(0).unwrap(), 0, 1, reply, 9, PostFlags::SIGNALED)
        .unwrap();
    let got = wait(&dev, &mut cq, 1);
    assert_eq!((got[0].cookie, got[0].status), (9, WcStatus::RetryExcErr));
    assert_eq!(
        dev.nic()
            .unwrap()
            .qp_stats(dci.qpn())
            .unwrap()
            .transport_retries,
        1
    );
    assert_eq!(mr.read_u64(0).unwrap(), 0, "nothing ran");
    // A number that never was a DCT, and an RC QP's number: nobody answers either.
    // (The RC QP lives to the end of the test; it was once forgotten, which the
    // AddressSanitizer stage's leak check reported.)
    // Addressed to this port (an address vector with no LID names no port: refused).
    let rc = pd.create_qp(&tcq, &tcq, QpCaps::default()).unwrap();
    let here = pd
        .create_ah(AhAttr {
            dlid: dev.nic().unwrap().port_attr().lid,
            ..AhAttr::default()
        })
        .unwrap();
    for target in [0x00ff_fff0, rc.qpn()] {
        let mut d = pd.create_dci_with(&cq, QpCaps::default(), &timing).unwrap();
        let p = DcPeer::from_ah(&here, target, 1).unwrap();
        d.to(&p)
            .write_inline(b"x", mr.remote(0).unwrap(), 10, PostFlags::SIGNALED)
            .unwrap();
        let got = wait(&dev, &mut cq, 1);
        assert_eq!(
            (got[0].cookie, got[0].status),
            (10, WcStatus::RetryExcErr),
            "{target:#x}"
        );
    }
    quiet(&dev, &mut cq);
}

#[test]
fn the_targets_rights_and_remote_keys_are_checked_as_an_rc_responder() {
    let dev = Device::sim_stepped();
    let pd = dev.alloc_pd().unwrap();
    let tcq = dev.create_cq(16).unwrap();
    let tsrq = pd.create_srq(&tcq, SrqCaps::default()).unwrap();
    let read_only = pd.create_dct(&tcq, &tsrq, 5, Access::REMOTE_READ).unwrap();
    let mr = pd.alloc_mr(4096, ALL).unwrap();
    mr.write(0, &77u64.to_ne_bytes()).unwrap();
    let mut cq = dev.create_cq(64).unwrap();
    let peer = read_only.peer().unwrap();
    // A write, an atomic, a write with immediate: not allowed by the target.
    type Post<'a> = &'a dyn Fn(&mut Dci) -> Result<()>;
    let reqs: [Post<'_>; 3] = [
        &|d| {
            d.to(&peer)
                .write_inline(b"w", mr.remote(0)?, 1, PostFlags::SIGNALED)
        },
        &|d| {
            d.to(&peer)
                .fetch_add(mr.remote(0)?, 1, mr.sge(64, 8)?, 1, PostFlags::SIGNALED)
        },
        &|d| {
            d.to(&peer).write_imm(
                Payload::Inline(b"i"),
                mr.remote(0)?,
                3,
                1,
                PostFlags::SIGNALED,
            )
        },
    ];
    for post in reqs {
        let mut dci = pd.create_dci(&cq, QpCaps::default()).unwrap();
        post(&mut dci).unwrap();
        let got = wait(&dev, &mut cq, 1);
        assert_eq!((got[0].cookie, got[0].status), (1, WcStatus::RemInvReqErr));
    }
    assert_eq!(mr.read_u64(0).unwrap(), 77);
    // A read is allowed; a read with a bad rkey fails with a remote access error; the
    // target keeps serving (a DCT does not go to error for one initiator's fault).
    let mut dci = pd.create_dci(&cq, QpCaps::default()).unwrap();
    let bad = Remote {
        addr: mr.remote(0).unwrap().addr,
        rkey: mr.remote(0).unwrap().rkey ^ 0x100,
    };
    dci.to(&peer)
        .read(&[mr.sge(128, 8).unwrap()], bad, 2, PostFlags::SIGNALED)
        .unwrap();
    let got = wait(&dev, &mut cq, 1);
    assert_eq!((got[0].cookie, got[0].status), (2, WcStatus::RemAccessErr));
    let nic = dev.nic().unwrap();
    assert_eq!(
        nic.qp_state(read_only.dctn()),
        Some(mlx5::sim::QpState::Rts)
    );
    let mut dci = pd.create_dci(&cq, QpCaps::default()).unwrap();
    dci.to(&peer)
        .read(
            &[mr.sge(128, 8).unwrap()],
            mr.remote(0).unwrap(),
            3,
            PostFlags::SIGNALED,
        )
        .unwrap();
    let got = wait(&dev, &mut cq, 1);
    assert_eq!((got[0].cookie, got[0].status), (3, WcStatus::Success));
    assert_eq!(mr.read_u64(128).unwrap(), 77);
    // Rights a DCT cannot have are refused at creation.
    assert!(matches!(
        pd.create_dct(&tcq, &tsrq, 1, Access::LOCAL_WRITE | Access::REMOTE_READ),
        Err(Error::InvalidParameter { .. })
    ));
    quiet(&dev, &mut cq);
}

#[test]
fn a_dci_in_error_flushes_each_request_once() {
    let dev = Device::sim_stepped();
    let pd = dev.alloc_pd().unwrap();
    let tcq = dev.create_cq(16).unwrap();
    let tsrq = pd.create_srq(&tcq, SrqCaps::default()).unwrap();
    let dct = pd.create_dct(&tcq, &tsrq, 5, DCT_ALL).unwrap();
    let mr = pd.alloc_mr(4096, ALL).unwrap();
    let mut cq = dev.create_cq(64).unwrap();
    let mut dci = pd.create_dci(&cq, QpCaps::default()).unwrap();
    let peer = dct.peer().unwrap();
    dci.to(&peer)
        .write_inline(b"a", mr.remote(0).unwrap(), 1, PostFlags::SIGNALED)
        .unwrap();
    dci.to(&peer)
        .write_inline(b"b", mr.remote(8).unwrap(), 2, PostFlags::UNSIGNALED)
        .unwrap();
    dci.set_error().unwrap();
    dci.to(&peer)
        .write_inline(b"c", mr.remote(16).unwrap(), 3, PostFlags::SIGNALED)
        .unwrap();
    let got = wait(&dev, &mut cq, 3);
    let st: Vec<(u64, WcStatus)> = got.iter().map(|c| (c.cookie, c.status)).collect();
    assert_eq!(
        st,
        [
            (1, WcStatus::WrFlushErr),
            (2, WcStatus::WrFlushErr),
            (3, WcStatus::WrFlushErr)
        ]
    );
    assert_eq!(mr.read_u64(0).unwrap(), 0);
    quiet(&dev, &mut cq);
}

#[test]
fn a_send_to_a_dct_whose_srq_is_empty_meets_rnr_naks() {
    let dev = Device::sim_stepped();
    let pd = dev.alloc_pd().unwrap();
    let tcq = dev.create_cq(16).unwrap();
    let tsrq = pd.create_srq(&tcq, SrqCaps::default()).unwrap();
    let dct = pd.create_dct(&tcq, &tsrq, 5, DCT_ALL).unwrap();
    let mut cq = dev.create_cq(64).unwrap();
    let timing = Timing {
        rnr_retry: 2,
        ..Timing::default()
    };
    let mut dci = pd.create_dci_with(&cq, QpCaps::default(), &timing).unwrap();
    dci.to(&dct.peer().unwrap())
        .send(Payload::Inline(b"hi"), 1, PostFlags::SIGNALED)
        .unwrap();
    let got = wait(&dev, &mut cq, 1);
    assert_eq!(
        (got[0].cookie, got[0].status),
        (1, WcStatus::RnrRetryExcErr)
    );
    // With a receive posted, the next DCI's send lands.
    let mr = pd.alloc_mr(64, ALL).unwrap();
    let mut tsrq = tsrq;
    tsrq.post_recv(&[mr.sge(0, 64).unwrap()], 9).unwrap();
    let mut dci = pd.create_dci_with(&cq, QpCaps::default(), &timing).unwrap();
    dci.to(&dct.peer().unwrap())
        .send(Payload::Inline(b"hi"), 2, PostFlags::SIGNALED)
        .unwrap();
    let got = wait(&dev, &mut cq, 1);
    assert_eq!((got[0].cookie, got[0].status), (2, WcStatus::Success));
    let mut tcq = tcq;
    let got = wait(&dev, &mut tcq, 1);
    assert_eq!(
        (got[0].cookie, got[0].qpn, got[0].byte_len),
        (9, dct.dctn(), 2)
    );
    assert_eq!(dev.nic().unwrap().qp_stats(dct.dctn()).unwrap().rnr_naks, 3);
}

/// A signaled read of `mr`'s word 0 into its byte 64 through `first` (cookie `cookie`),
/// then a signaled inline write of 2 into word 0 through `second` (cookie `cookie + 1`).
fn read_then_write(dci: &mut Dci, first: &Dct, second: &Dct, mr: &MemoryRegion, cookie: u64) {
    let into = mr.sge(64, 8).unwrap();
    dci.to(&first.peer().unwrap())
        .read(&[into], mr.remote(0).unwrap(), cookie, PostFlags::SIGNALED)
        .unwrap();
    dci.to(&second.peer().unwrap())
        .write_inline(
            &2u64.to_ne_bytes(),
            mr.remote(0).unwrap(),
            cookie + 1,
            PostFlags::SIGNALED,
        )
        .unwrap();
}

#[test]
fn a_dci_serves_one_destination_at_a_time_under_relaxed_ordering() {
    // A read through DCT A, then a write to the same bytes through DCT B (same domain):
    // the write starts only after the read completed, so the read never sees it. (The
    // relaxed ordering mode may let a read see a later write of the same RC QP.)
    let mut reordered_rc = false;
    for seed in 0..48 {
        let dev = Device::sim_stepped();
        dev.nic().unwrap().set_order(OrderMode::Relaxed { seed });
        let pd = dev.alloc_pd().unwrap();
        let tcq = dev.create_cq(16).unwrap();
        let tsrq = pd.create_srq(&tcq, SrqCaps::default()).unwrap();
        let a = pd.create_dct(&tcq, &tsrq, 1, DCT_ALL).unwrap();
        let b = pd.create_dct(&tcq, &tsrq, 2, DCT_ALL).unwrap();
        let mr = pd.alloc_mr(4096, ALL).unwrap();
        mr.write(0, &1u64.to_ne_bytes()).unwrap();
        let mut cq = dev.create_cq(64).unwrap();
        let mut dci = pd.create_dci(&cq, QpCaps::default()).unwrap();
        read_then_write(&mut dci, &a, &b, &mr, 1);
        let got = wait(&dev, &mut cq, 2);
        assert!(got.iter().all(|c| c.status == WcStatus::Success));
        assert_eq!(
            mr.read_u64(64).unwrap(),
            1,
            "seed {seed}: the read saw the later write"
        );
        assert_eq!(mr.read_u64(0).unwrap(), 2);
        // The same two requests to one DCT: the NIC may run the read late (no fence).
        mr.write(0, &1u64.to_ne_bytes()).unwrap();
        read_then_write(&mut dci, &a, &a, &mr, 3);
        wait(&dev, &mut cq, 2);
        reordered_rc |= mr.read_u64(64).unwrap() == 2;
    }
    assert!(
        reordered_rc,
        "the relaxed mode never held a read back: the test proves nothing"
    );
}

#[test]
fn requests_a_dci_cannot_carry_are_refused_before_posting() {
    let dev = Device::sim_stepped();
    let pd = dev.alloc_pd().unwrap();
    let tcq = dev.create_cq(16).unwrap();
    let tsrq = pd.create_srq(&tcq, SrqCaps::default()).unwrap();
    let dct = pd.create_dct(&tcq, &tsrq, 5, DCT_ALL).unwrap();
    let mr = pd.alloc_mr(4096, ALL).unwrap();
    let cq = dev.create_cq(64).unwrap();
    let mut dci = pd.create_dci(&cq, QpCaps::default()).unwrap();
    let peer = dct.peer().unwrap();
    let free = dci.free_send();
    for req in [
        Request::Nop,
        Request::LocalInvalidate { rkey: 1 },
        Request::SendInv {
            data: Payload::Inline(b"x"),
            rkey: 1,
        },
    ] {
        assert!(matches!(
            dci.to(&peer).post(&req, 1, PostFlags::SIGNALED),
            Err(Error::Unsupported(_))
        ));
    }
    let reply = mr.sge(8, 8).unwrap();
    let unaligned = Remote {
        addr: mr.remote(0).unwrap().addr + 4,
        rkey: mr.lkey(),
    };
    assert!(matches!(
        dci.to(&peer)
            .fetch_add(unaligned, 1, reply, 1, PostFlags::SIGNALED),
        Err(Error::Misaligned { .. })
    ));
    let big = vec![0u8; 2048];
    assert!(matches!(
        dci.to(&peer)
            .write_inline(&big, mr.remote(0).unwrap(), 1, PostFlags::SIGNALED),
        Err(Error::InlineTooLong { .. })
    ));
    assert!(matches!(
        DcPeer::new([0; 48], 0x100_0000, 1),
        Err(Error::InvalidParameter { .. })
    ));
    assert_eq!(dci.free_send(), free, "nothing was written");
    // A DCI's depth counts the address segment: 256 blocks of 64-byte WQEs with 256 inline
    // bytes (2 + 17 DS + 3) hold 42 of the largest requests.
    assert_eq!(dci.send_depth(), 256 / 6);
}

#[test]
fn sends_land_in_the_dcts_srq_and_name_the_dct() {
    let dev = Device::sim_stepped();
    let pd = dev.alloc_pd().unwrap();
    let mut tcq = dev.create_cq(64).unwrap();
    let mut srq = pd.create_srq(&tcq, SrqCaps::default()).unwrap();
    // Two DCTs share the SRQ (as UCX's DC iface: one SRQ for its DCT and RC QPs).
    let a = pd.create_dct(&tcq, &srq, 11, DCT_ALL).unwrap();
    let b = pd.create_dct(&tcq, &srq, 22, DCT_ALL).unwrap();
    assert_eq!((a.srqn(), b.srqn()), (srq.srqn(), srq.srqn()));
    let mr = pd.alloc_mr(8192, ALL).unwrap();
    for i in 0..6 {
        srq.post_recv(&[mr.sge(4096 + 128 * i, 128).unwrap()], 100 + i as u64)
            .unwrap();
    }
    let mut cq = dev.create_cq(64).unwrap();
    let mut d1 = pd.create_dci(&cq, QpCaps::default()).unwrap();
    let mut d2 = pd.create_dci(&cq, QpCaps::default()).unwrap();
    let (pa, pb) = (a.peer().unwrap(), b.peer().unwrap());
    let big = [7u8; 100];
    d1.to(&pa)
        .send(Payload::Inline(b"to a"), 1, PostFlags::SIGNALED)
        .unwrap();
    d1.to(&pb)
        .send(Payload::Inline(&big), 2, PostFlags::SIGNALED)
        .unwrap();
    d2.to(&pa)
        .write_imm(
            Payload::Inline(b"imm"),
            mr.remote(0).unwrap(),
            0xbeef,
            3,
            PostFlags::SIGNALED,
        )
        .unwrap();
    d2.to(&pb)
        .post(
            &Request::SendImm {
                data: Payload::Sgl(&[mr.sge(0, 3).unwrap()]),
                imm: 5,
            },
            4,
            PostFlags::SIGNALED,
        )
        .unwrap();
    let sent = wait(&dev, &mut cq, 4);
    assert!(
        sent.iter().all(|c| c.status == WcStatus::Success),
        "{sent:?}"
    );
    let got = wait(&dev, &mut tcq, 4);
    assert_eq!(got.len(), 4);
    let mut by_dct: Vec<(u32, WcOpcode, u32, Option<u32>)> = got
        .iter()
        .map(|c| (c.qpn, c.opcode, c.byte_len, c.imm))
        .collect();
    by_dct.sort_unstable_by_key(|x| (x.0, x.2));
    let mut want = vec![
        (a.dctn(), WcOpcode::Recv, 4, None),
        (b.dctn(), WcOpcode::Recv, 100, None),
        (a.dctn(), WcOpcode::RecvRdmaWithImm, 3, Some(0xbeef)),
        (b.dctn(), WcOpcode::Recv, 3, Some(5)),
    ];
    want.sort_unstable_by_key(|x| (x.0, x.2));
    assert_eq!(by_dct, want);
    // Each receive's cookie is the SRQ entry's, and the bytes are where that entry points.
    for c in &got {
        let i = (c.cookie - 100) as usize;
        assert!(i < 4, "the first four receives are used in order: {c:?}");
        let mut b = vec![0u8; c.byte_len as usize];
        if c.opcode == WcOpcode::Recv {
            mr.read(4096 + 128 * i, &mut b).unwrap();
            let expect: &[u8] = match c.byte_len {
                4 => b"to a",
                100 => &big,
                _ => b"imm",
            };
            assert_eq!(b, expect, "{c:?}");
        }
    }
    assert_eq!(&mr.read_u64(0).unwrap().to_ne_bytes()[..3], b"imm");
    assert_eq!(srq.free(), srq.capacity() - 2);
    quiet(&dev, &mut tcq);
}

#[test]
fn a_dct_takes_the_srqs_cq_and_domain() {
    let dev = Device::sim_stepped();
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(16).unwrap();
    let other_cq = dev.create_cq(16).unwrap();
    let srq = pd.create_srq(&cq, SrqCaps::default()).unwrap();
    assert!(matches!(
        pd.create_dct(&other_cq, &srq, 1, DCT_ALL),
        Err(Error::SrqCq { .. })
    ));
    let pd2 = dev.alloc_pd().unwrap();
    assert!(matches!(
        pd2.create_dct(&cq, &srq, 1, DCT_ALL),
        Err(Error::InvalidHandle { .. })
    ));
    let other_dev = Device::sim_stepped();
    let pd3 = other_dev.alloc_pd().unwrap();
    let cq3 = other_dev.create_cq(16).unwrap();
    assert!(matches!(
        pd3.create_dci(&cq, QpCaps::default()),
        Err(Error::InvalidHandle { .. })
    ));
    let srq3 = pd3.create_srq(&cq3, SrqCaps::default()).unwrap();
    assert!(pd3.create_dct(&cq3, &srq3, 1, DCT_ALL).is_ok());
}

#[test]
fn a_dci_batch_rings_once_and_a_dropped_one_posts_nothing() {
    let dev = Device::sim_stepped();
    let pd = dev.alloc_pd().unwrap();
    let tcq = dev.create_cq(16).unwrap();
    let tsrq = pd.create_srq(&tcq, SrqCaps::default()).unwrap();
    let a = pd.create_dct(&tcq, &tsrq, 1, DCT_ALL).unwrap();
    let b = pd.create_dct(&tcq, &tsrq, 2, DCT_ALL).unwrap();
    let mr = pd.alloc_mr(4096, ALL).unwrap();
    let mut cq = dev.create_cq(64).unwrap();
    let mut dci = pd.create_dci(&cq, QpCaps::default()).unwrap();
    let free = dci.free_send();
    {
        let mut batch = dci.batch();
        let req = Request::Write {
            remote: mr.remote(0).unwrap(),
            data: Payload::Inline(b"never"),
        };
        batch
            .push(&a.peer().unwrap(), &req, 1, PostFlags::SIGNALED)
            .unwrap();
        assert_eq!(batch.len(), 1);
        // Dropped without ringing.
    }
    assert_eq!(
        dci.free_send(),
        free,
        "the dropped batch gave its blocks back"
    );
    quiet(&dev, &mut cq);
    assert_eq!(mr.read_u64(0).unwrap(), 0);
    let mut batch = dci.batch();
    for i in 0..6u64 {
        let peer = if i % 2 == 0 { a.peer() } else { b.peer() }.unwrap();
        let bytes = (i + 1).to_ne_bytes();
        let req = Request::Write {
            remote: mr.remote(8 * i as usize).unwrap(),
            data: Payload::Inline(&bytes),
        };
        let fl = if i == 5 {
            PostFlags::SIGNALED
        } else {
            PostFlags::UNSIGNALED
        };
        batch.push(&peer, &req, 10 + i, fl).unwrap();
    }
    // A request a DCI cannot carry is refused; the batch keeps what it has.
    assert!(matches!(
        batch.push(&a.peer().unwrap(), &Request::Nop, 0, PostFlags::SIGNALED),
        Err(Error::Unsupported(_))
    ));
    assert_eq!(batch.len(), 6);
    batch.ring();
    let got = wait(&dev, &mut cq, 1);
    assert_eq!((got[0].cookie, got[0].status), (15, WcStatus::Success));
    for i in 0..6u64 {
        assert_eq!(mr.read_u64(8 * i as usize).unwrap(), i + 1);
    }
    let s = dev.nic().unwrap().qp_stats(dci.qpn()).unwrap();
    assert_eq!(s.wqes, 6);
    assert_eq!(
        (s.doorbells, s.doorbell_misses),
        (1, 0),
        "one doorbell for the batch"
    );
    quiet(&dev, &mut cq);
}

#[test]
fn a_request_after_a_failed_switch_is_flushed_not_run() {
    // A read to DCT A held back by the relaxed mode, A destroyed, then a write to DCT B:
    // switching destinations completes the read first (it fails: nobody answers), so the
    // DCI is in error and the write is flushed; it never reaches B's memory.
    let mut tried = 0;
    for seed in 0..64 {
        let dev = Device::sim_stepped();
        dev.nic().unwrap().set_order(OrderMode::Relaxed { seed });
        let pd = dev.alloc_pd().unwrap();
        let tcq = dev.create_cq(16).unwrap();
        let tsrq = pd.create_srq(&tcq, SrqCaps::default()).unwrap();
        let a = pd.create_dct(&tcq, &tsrq, 1, DCT_ALL).unwrap();
        let b = pd.create_dct(&tcq, &tsrq, 2, DCT_ALL).unwrap();
        let mr = pd.alloc_mr(4096, ALL).unwrap();
        let mut cq = dev.create_cq(64).unwrap();
        let mut dci = pd.create_dci(&cq, QpCaps::default()).unwrap();
        let pa = a.peer().unwrap();
        dci.to(&pa)
            .read(
                &[mr.sge(64, 8).unwrap()],
                mr.remote(0).unwrap(),
                1,
                PostFlags::SIGNALED,
            )
            .unwrap();
        // One pass (Device::process drains: the held read would run before the drop).
        let nic = dev.nic().unwrap();
        nic.process();
        if nic.qp_stats(dci.qpn()).unwrap().held_back == 0 {
            continue; // this seed ran the read at once
        }
        tried += 1;
        drop(a);
        let pb = b.peer().unwrap();
        dci.to(&pb)
            .write_inline(
                &9u64.to_ne_bytes(),
                mr.remote(128).unwrap(),
                2,
                PostFlags::SIGNALED,
            )
            .unwrap();
        nic.process();
        let got = wait(&dev, &mut cq, 2);
        let st: Vec<(u64, WcStatus)> = got.iter().map(|c| (c.cookie, c.status)).collect();
        assert_eq!(
            st,
            [(1, WcStatus::RetryExcErr), (2, WcStatus::WrFlushErr)],
            "seed {seed}"
        );
        assert_eq!(
            mr.read_u64(128).unwrap(),
            0,
            "seed {seed}: the flushed write ran"
        );
    }
    assert!(
        tried > 0,
        "no seed held the read back: the test proves nothing"
    );
}

#[test]
fn a_peer_from_an_address_handle_carries_its_av() {
    let dev = Device::sim_stepped();
    let pd = dev.alloc_pd().unwrap();
    let tcq = dev.create_cq(16).unwrap();
    let tsrq = pd.create_srq(&tcq, SrqCaps::default()).unwrap();
    let dct = pd.create_dct(&tcq, &tsrq, 0x77, DCT_ALL).unwrap();
    let ah = pd
        .create_ah(AhAttr {
            dlid: dev.nic().unwrap().port_attr().lid,
            sl: 2,
            ..AhAttr::default()
        })
        .unwrap();
    let peer = DcPeer::from_ah(&ah, dct.dctn(), 0x77).unwrap();
    // The AV names the software NIC's port (its own LID): the request lands.
    let mr = pd.alloc_mr(64, ALL).unwrap();
    let mut cq = dev.create_cq(16).unwrap();
    let mut dci = pd.create_dci(&cq, QpCaps::default()).unwrap();
    dci.to(&peer)
        .write_inline(b"via ah", mr.remote(0).unwrap(), 1, PostFlags::SIGNALED)
        .unwrap();
    let got = wait(&dev, &mut cq, 1);
    assert_eq!((got[0].cookie, got[0].status), (1, WcStatus::Success));
    let mut b = [0u8; 6];
    mr.read(0, &mut b).unwrap();
    assert_eq!(&b, b"via ah");
}

#[test]
fn a_dropped_dcis_completions_are_not_given_to_the_next_one() {
    // Two QP numbers: the DCT's and one for the DCIs, so every new DCI reuses the number
    // of the one dropped before it.
    let dev = Device::sim_with(
        mlx5::sim::Limits {
            qps: 2,
            ..mlx5::sim::Limits::default()
        },
        blueflame::UarConfig::default(),
        false,
    );
    let pd = dev.alloc_pd().unwrap();
    let tcq = dev.create_cq(16).unwrap();
    let tsrq = pd.create_srq(&tcq, SrqCaps::default()).unwrap();
    let dct = pd.create_dct(&tcq, &tsrq, 5, DCT_ALL).unwrap();
    let mr = pd.alloc_mr(4096, ALL).unwrap();
    let peer = dct.peer().unwrap();
    let mut cq = dev.create_cq(64).unwrap();
    let mut seen = std::collections::HashSet::new();
    for round in 0..4u64 {
        let mut dci = pd.create_dci(&cq, QpCaps::default()).unwrap();
        seen.insert(dci.qpn());
        for i in 0..3 {
            dci.to(&peer)
                .write_inline(
                    b"x",
                    mr.remote(0).unwrap(),
                    100 * round + i,
                    PostFlags::SIGNALED,
                )
                .unwrap();
        }
        dev.process();
        // Dropped with three completions in the CQ, unpolled.
        drop(dci);
    }
    let mut fresh = pd.create_dci(&cq, QpCaps::default()).unwrap();
    fresh
        .to(&peer)
        .write_inline(b"y", mr.remote(8).unwrap(), 7, PostFlags::SIGNALED)
        .unwrap();
    let got = wait(&dev, &mut cq, 1);
    assert_eq!(got.len(), 1, "only the live DCI's completion: {got:?}");
    assert_eq!((got[0].cookie, got[0].qpn), (7, fresh.qpn()));
    quiet(&dev, &mut cq);
    assert_eq!(seen.len(), 1, "the number came back: {seen:?}");
    assert!(seen.contains(&fresh.qpn()));
}

/// One DCI, two DCTs; DCT `a` goes away (its process exited) while the DCI writes to it:
/// the DCI's retries run out (`RetryExcErr`) and the write to `b` after it is flushed.
/// Returns the DCI in error with both completions polled, and what the recovery needs.
struct Stranded {
    dev: Device,
    cq: Cq,
    dci: Dci,
    b: Dct,
    mr: MemoryRegion,
    _keep: (Cq, Srq),
}

fn stranded() -> Stranded {
    let ShortRetries {
        dev,
        pd,
        tcq,
        tsrq,
        mr,
        mut cq,
        mut dci,
        ..
    } = short_retries();
    let a = pd.create_dct(&tcq, &tsrq, 1, DCT_ALL).unwrap();
    let b = pd.create_dct(&tcq, &tsrq, 2, DCT_ALL).unwrap();
    let (pa, pb) = (a.peer().unwrap(), b.peer().unwrap());
    dci.to(&pa)
        .write_inline(b"a", mr.remote(0).unwrap(), 1, PostFlags::SIGNALED)
        .unwrap();
    assert_eq!(wait(&dev, &mut cq, 1)[0].status, WcStatus::Success);
    assert!(!dci.in_error());
    drop(a);
    dci.to(&pa)
        .write_inline(b"a", mr.remote(8).unwrap(), 2, PostFlags::SIGNALED)
        .unwrap();
    dci.to(&pb)
        .write_inline(b"b", mr.remote(16).unwrap(), 3, PostFlags::SIGNALED)
        .unwrap();
    let got = wait(&dev, &mut cq, 2);
    let got: Vec<_> = got.iter().map(|c| (c.cookie, c.status)).collect();
    assert_eq!(
        got,
        [(2, WcStatus::RetryExcErr), (3, WcStatus::WrFlushErr)],
        "one target gone stops the DCI for every target"
    );
    assert!(dci.in_error());
    Stranded {
        dev,
        cq,
        dci,
        b,
        mr,
        _keep: (tcq, tsrq),
    }
}

impl Stranded {
    /// Writes `byte` at `off` of the region through the DCI to DCT `b`.
    fn write_b(&mut self, byte: u8, off: usize, cookie: u64) -> Result<()> {
        let pb = self.b.peer().unwrap();
        let remote = self.mr.remote(off).unwrap();
        self.dci
            .to(&pb)
            .write_inline(&[byte], remote, cookie, PostFlags::SIGNALED)
    }

    /// The next completion: (cookie, status).
    fn next(&mut self) -> (u64, WcStatus) {
        let c = wait(&self.dev, &mut self.cq, 1)[0];
        (c.cookie, c.status)
    }

    /// The byte at `off` of the region.
    fn byte(&self, off: usize) -> u8 {
        self.mr.read_u64(off).unwrap() as u8
    }
}

#[test]
fn a_dci_stranded_by_a_vanished_dct_recovers_and_serves_the_others() {
    let mut s = stranded();
    // Still in error: a request to `b` is flushed.
    s.write_b(b'b', 16, 4).unwrap();
    // Refused while that request is outstanding: its completion must come first.
    let e = s.dci.recover().unwrap_err();
    assert!(
        matches!(e, Error::InvalidState { .. })
            && e.to_string()
                .starts_with("invalid state: the QP is a DCI with requests outstanding"),
        "outstanding requests: {e}"
    );
    assert_eq!(s.next(), (4, WcStatus::WrFlushErr));
    let old = s.dci.qpn();
    s.dci.recover().unwrap();
    assert!(!s.dci.in_error());
    assert_ne!(s.dci.qpn(), old, "a new DCI");
    s.write_b(b'B', 16, 5).unwrap();
    assert_eq!(s.next(), (5, WcStatus::Success));
    assert_eq!(s.byte(16), b'B');
    quiet(&s.dev, &mut s.cq);
}

#[test]
fn an_auto_recovering_dci_refuses_posts_until_its_flushes_are_polled_then_goes_on() {
    let mut s = stranded();
    s.dci.set_auto_recover(true);
    // Nothing outstanding: the post recovers the DCI and goes out.
    s.write_b(b'C', 24, 6).unwrap();
    assert!(!s.dci.in_error());
    assert_eq!(s.next(), (6, WcStatus::Success));
    assert_eq!(s.byte(24), b'C');
    // In error again with a request outstanding (it will be flushed): the next post is
    // refused until that completion is polled; nothing is lost.
    s.write_b(b'D', 32, 7).unwrap();
    s.dci.set_error().unwrap();
    let e = s.write_b(b'E', 40, 8);
    assert!(matches!(e, Err(Error::InvalidState { .. })), "{e:?}");
    assert_eq!(s.next(), (7, WcStatus::WrFlushErr));
    s.write_b(b'E', 40, 8).unwrap();
    assert_eq!(s.next(), (8, WcStatus::Success));
    assert_eq!(s.byte(40), b'E');
    quiet(&s.dev, &mut s.cq);
}

/// On a device whose DC on-demand paging lacks the operations (`dc_odp_caps` 0, while RC has
/// them), a DCI request with a local entry in an on-demand region is refused before posting,
/// naming the region's lkey, in a post and in a batch; a pinned region's goes. With DC
/// on-demand paging (a ConnectX-6's default), the same request posts and completes.
#[test]
fn a_dci_refuses_on_demand_regions_its_device_cannot_page() {
    for dc_odp in [false, true] {
        let dev = Device::sim_stepped();
        dev.nic().unwrap().set_memory_caps(mlx5::sim::MemoryCaps {
            odp: true,
            dc_odp,
            ..Default::default()
        });
        assert_eq!(dev.odp_caps().dc != 0, dc_odp);
        let pd = dev.alloc_pd().unwrap();
        let tcq = dev.create_cq(16).unwrap();
        let srq = pd.create_srq(&tcq, SrqCaps::default()).unwrap();
        let dct = pd.create_dct(&tcq, &srq, 7, DCT_ALL).unwrap();
        let target = pd.alloc_mr(4096, ALL).unwrap();
        let mut cq = dev.create_cq(16).unwrap();
        let mut dci = pd.create_dci(&cq, QpCaps::default()).unwrap();
        let odp = pd
            .register(vec![5u8; 4096], Access::LOCAL_WRITE | Access::ON_DEMAND)
            .unwrap();
        let pinned = pd.alloc_mr(4096, ALL).unwrap();
        let peer = dct.peer().unwrap();
        let fl = PostFlags::SIGNALED;
        let from_odp = [odp.sge(0, 16).unwrap()];
        let r = dci
            .to(&peer)
            .write(&from_odp, target.remote(0).unwrap(), 1, fl);
        let mut batch = dci.batch();
        let b = batch.push(
            &peer,
            &Request::Write {
                remote: target.remote(0).unwrap(),
                data: Payload::Sgl(&from_odp),
            },
            2,
            fl,
        );
        drop(batch);
        if dc_odp {
            r.unwrap();
            b.unwrap();
        } else {
            for e in [r.unwrap_err(), b.unwrap_err()] {
                assert!(
                    matches!(e, Error::InvalidParameter { value, .. } if value == odp.lkey() as u64),
                    "{e:?}"
                );
            }
        }
        dci.to(&peer)
            .write(
                &[pinned.sge(0, 16).unwrap()],
                target.remote(64).unwrap(),
                3,
                fl,
            )
            .unwrap();
        let got = wait(&dev, &mut cq, if dc_odp { 2 } else { 1 });
        assert!(got.iter().all(|c| c.is_ok()), "{got:?}");
    }
}

/// The same on a DCI with auto recovery: a forgotten batch's write, then the DCI is moved
/// to error. The next post rings the write before it is refused (`InvalidState`: "poll
/// its failed and flushed completions"), so the write is flushed and polled and the DCI
/// recovers. Refused before it rang, the write never completed and the DCI never
/// recovered (a review's finding).
#[test]
fn a_forgotten_dci_batch_blocks_auto_recovery_for_ever() {
    let dev = Device::sim_stepped();
    let pd = dev.alloc_pd().unwrap();
    let tcq = dev.create_cq(64).unwrap();
    let srq = pd.create_srq(&tcq, SrqCaps::default()).unwrap();
    let dct = pd.create_dct(&tcq, &srq, 7, Access::REMOTE_WRITE).unwrap();
    let peer = dct.peer().unwrap();
    let mr = pd.alloc_mr(4096, ALL).unwrap();
    let mut cq = dev.create_cq(64).unwrap();
    let mut dci = pd.create_dci(&cq, QpCaps::default()).unwrap();
    dci.set_auto_recover(true);
    let req = Request::Write {
        remote: mr.remote(0).unwrap(),
        data: Payload::Inline(b"x"),
    };
    let mut b = dci.batch();
    b.push(&peer, &req, 1, PostFlags::SIGNALED).unwrap();
    core::mem::forget(b);
    dci.set_error().unwrap();
    let mut got = Vec::new();
    let mut posted = false;
    for _ in 0..20 {
        match dci
            .to(&peer)
            .write_inline(b"y", mr.remote(8).unwrap(), 2, PostFlags::SIGNALED)
        {
            Ok(()) => {
                posted = true;
                break;
            }
            Err(Error::InvalidState { .. }) => {
                dev.process();
                got.extend(drain(&mut cq));
            }
            Err(e) => panic!("{e}"),
        }
    }
    dev.process();
    got.extend(drain(&mut cq));
    assert!(
        got.iter().any(|c| c.cookie == 1),
        "the forgotten batch's write never completed: {got:?}"
    );
    assert!(posted, "the DCI never recovered");
}

fn drain(cq: &mut Cq) -> Vec<Completion> {
    let mut out = [Completion::default(); 32];
    let n = cq.poll(&mut out);
    out[..n].to_vec()
}

/// A DCT's receive names the DCI that sent it: libmlx5's `handle_responder` (`cq.c`)
/// reports `flags_rqpn & 0xffffff` as `wc.src_qp` for every responder CQE, SRQ or not, and
/// a DC target has no other way to tell its initiators apart (UCX keys its multi-packet
/// receive contexts by the CQE's `flags_rqpn` and `slid`). The crate's SRQ completion
/// (`CompletionQueue::complete_srq`) left it 0, while its own-receive-queue path reads it.
#[test]
fn a_dct_receive_names_the_sending_dci() {
    let dev = Device::sim_stepped();
    let pd = dev.alloc_pd().unwrap();
    let mut tcq = dev.create_cq(16).unwrap();
    let mut srq = pd.create_srq(&tcq, SrqCaps::default()).unwrap();
    let dct = pd.create_dct(&tcq, &srq, 9, DCT_ALL).unwrap();
    let mr = pd.alloc_mr(4096, ALL).unwrap();
    for i in 0..3usize {
        srq.post_recv(&[mr.sge(1024 + 128 * i, 128).unwrap()], 10 + i as u64)
            .unwrap();
    }
    let mut cq = dev.create_cq(16).unwrap();
    let mut d1 = pd.create_dci(&cq, QpCaps::default()).unwrap();
    let mut d2 = pd.create_dci(&cq, QpCaps::default()).unwrap();
    let peer = dct.peer().unwrap();
    let fl = PostFlags::SIGNALED;
    d1.to(&peer)
        .send(Payload::Inline(&[1u8; 40]), 1, fl)
        .unwrap();
    d2.to(&peer)
        .post(
            &Request::SendImm {
                data: Payload::Inline(&[2u8; 40]),
                imm: 7,
            },
            2,
            fl,
        )
        .unwrap();
    d2.to(&peer)
        .write_imm(Payload::Inline(b"w"), mr.remote(0).unwrap(), 8, 3, fl)
        .unwrap();
    let sent = wait(&dev, &mut cq, 3);
    assert!(sent.iter().all(|c| c.is_ok()), "{sent:?}");
    let mut got: Vec<(u32, u32)> = wait(&dev, &mut tcq, 3)
        .iter()
        .map(|c| (c.imm.unwrap_or(0), c.src_qp))
        .collect();
    got.sort_unstable();
    assert_eq!(got, [(0, d1.qpn()), (7, d2.qpn()), (8, d2.qpn())]);
}

/// A DCI moved to error by `set_error` after unsignaled writes that already ran: nothing of
/// them is left to complete (a ConnectX writes no CQE for an unsignaled request that
/// succeeded, nor a flush for one that ran before the modify), yet they held the ring. Once
/// what the DCI has to report is polled, `recover` (and an auto-recovering post) goes on;
/// it was refused for good (`Error::InvalidState`, "poll its completions": there were none).
#[test]
fn a_dci_moved_to_error_after_unsignaled_writes_recovers_once_polled() {
    for auto in [false, true] {
        let mut s = stranded();
        s.dci.set_auto_recover(auto);
        s.dci.recover().unwrap();
        let full = s.dci.free_send();
        let pb = s.b.peer().unwrap();
        for (k, off) in [(10u64, 32usize), (11, 40)] {
            let remote = s.mr.remote(off).unwrap();
            s.dci
                .to(&pb)
                .write_inline(b"u", remote, k, PostFlags::UNSIGNALED)
                .unwrap();
        }
        s.dev.nic().unwrap().drain();
        assert_eq!((s.byte(32), s.byte(40)), (b'u', b'u'));
        s.dci.set_error().unwrap();
        assert!(s.dci.in_error());
        // Nothing to report: both writes ran, unsignaled.
        quiet(&s.dev, &mut s.cq);
        assert_eq!(s.dci.free_send(), full, "auto {auto}: the ring is back");
        if auto {
            s.write_b(b'E', 48, 12).unwrap();
        } else {
            s.dci.recover().unwrap();
            s.write_b(b'E', 48, 12).unwrap();
        }
        assert!(!s.dci.in_error());
        assert_eq!(s.next(), (12, WcStatus::Success));
        assert_eq!(s.byte(48), b'E');
        quiet(&s.dev, &mut s.cq);
    }
}
