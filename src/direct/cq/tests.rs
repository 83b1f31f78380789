//! Tests of the direct path's poller over plain memory: passes over the ring, a read's byte
//! count, the general path, and the CQEs it reports as errors (impossible compressed titles,
//! requester CQEs with data).

use super::*;
use zerocopy::IntoBytes;

/// A device stand-in: writes CQE number `k` (k counts from 0) with the owner bit of its
/// pass, as the hardware does.
fn write_cqe(ring: &mut [u8], cnt: u32, size: u32, k: u32, qpn: u32, opcode: CqeOpcode) {
    let cqe = Cqe64 {
        sop_drop_qpn: mlx5::Be32::new(qpn),
        wqe_counter: mlx5::Be16::new(k as u16),
        op_own: op_own(opcode, CqeFormat::Plain, false, k & cnt != 0),
        ..Cqe64::default()
    };
    let at = ((k % cnt) * size + size - 64) as usize;
    ring[at..at + 64].copy_from_slice(cqe.as_bytes());
}

/// A poller (CQ number 5) over `ring`, entries of `size` bytes, and `dbrec`.
///
/// # Safety
/// `ring` and `dbrec` must outlive the poller, which alone polls them.
unsafe fn poller(ring: &mut [u8], size: u32, dbrec: &mut [u32; 2]) -> CompletionQueue {
    let raw = RawCq {
        cqn: 5,
        buf: ring.as_mut_ptr(),
        cqe_cnt: ring.len() as u32 / size,
        cqe_size: size,
        dbrec: dbrec.as_mut_ptr(),
        cq_uar: core::ptr::null_mut(),
    };
    // SAFETY: the caller's contract.
    unsafe { CompletionQueue::new(&raw) }.unwrap()
}

/// The send queues (shadow tables of `depth` entries) of QPs 1 and 2, attached to `cq`.
fn two_send_queues(
    cq: &CompletionQueue,
    depth: u32,
) -> (Arc<Shadow<SendEntry>>, Arc<Shadow<SendEntry>>) {
    let (a, b) = (
        Arc::new(Shadow::<SendEntry>::new(depth)),
        Arc::new(Shadow::<SendEntry>::new(depth)),
    );
    for (qpn, sq) in [(1, &a), (2, &b)] {
        cq.registry.attach(Attached {
            qpn,
            sq: Some(sq.clone()),
            rq: None,
            scatter: None,
            srq: None,
            invalidations: None,
        });
    }
    (a, b)
}

/// Three passes over a ring of 64- or 128-byte entries: every completion once, in
/// order, unreported ones skipped, nothing seen before the device wrote it, the
/// consumer index published.
fn passes(size: u32) {
    let cnt = 8u32;
    let mut ring = vec![0u8; (cnt * size) as usize];
    let mut dbrec = [0u32; 2];
    // SAFETY: the ring and record outlive the poller, which alone polls them.
    let mut cq = unsafe { poller(&mut ring, size, &mut dbrec) };
    for i in 0..cnt {
        let own = ring[(i * size + size - 1) as usize];
        assert_eq!(own, op_own_initial(), "entry {i} preset");
    }
    let sq = Arc::new(Shadow::<SendEntry>::new(64));
    cq.registry.attach(Attached {
        qpn: 0x77,
        sq: Some(sq.clone()),
        rq: None,
        scatter: None,
        srq: None,
        invalidations: None,
    });
    let mut out = [Completion::default(); 4];
    assert_eq!(cq.poll(&mut out), 0, "nothing written yet");
    let mut expected = Vec::new();
    let mut got = Vec::new();
    for k in 0..3 * cnt {
        let report = k % 3 != 2;
        sq.set(
            k as u16,
            SendEntry {
                cookie: 1000 + k as u64,
                bbs: 1,
                opcode: WcOpcode::RdmaWrite,
                byte_len: 0,
                report,
            },
        );
        if report {
            expected.push(1000 + k as u64);
        }
        write_cqe(&mut ring, cnt, size, k, 0x77, CqeOpcode::Req);
        // Poll every other CQE, so that polls see one or two entries.
        if k % 2 == 1 {
            let n = cq.poll(&mut out);
            got.extend(out[..n].iter().map(|c| {
                assert_eq!(
                    (c.qpn, c.status, c.opcode),
                    (0x77, WcStatus::Success, WcOpcode::RdmaWrite)
                );
                c.cookie
            }));
            assert_eq!(cq.poll(&mut out), 0, "empty after k = {k}");
            assert_eq!(u32::from_be(dbrec[CQ_SET_CI]), k + 1);
            assert_eq!(sq.retired(), k as u16 + 1);
        }
    }
    assert_eq!(got, expected);
}

/// Bursts on the fast path (issue 29): several send completions of the QP seen last in
/// one poll, unreported ones among them, cut by the room in `out` and by another QP's
/// entry (which goes on in the general path): every completion once, in order; the
/// consumer index and each queue's retirement published up to exactly what was consumed.
#[test]
fn bursts_publish_and_retire_once_for_what_they_consumed() {
    let cnt = 32u32;
    let mut ring = vec![0u8; (cnt * 64) as usize];
    let mut dbrec = [0u32; 2];
    // SAFETY: the ring and record outlive the poller, which alone polls them.
    let mut cq = unsafe { poller(&mut ring, 64, &mut dbrec) };
    let (a, b) = two_send_queues(&cq, 64);
    // Entry k: QP 2 for k == 6, else QP 1; QP 1's WQE k-th of its own, every third
    // unreported.
    let mut wqe_a = 0u16;
    let mut expected = Vec::new();
    for k in 0..12u32 {
        let (qpn, sq, w) = if k == 6 { (2, &b, 0) } else { (1, &a, wqe_a) };
        let report = k % 3 != 1;
        sq.set(
            w,
            SendEntry {
                cookie: 100 + k as u64,
                bbs: 1,
                opcode: WcOpcode::Send,
                byte_len: 0,
                report,
            },
        );
        if report {
            expected.push(100 + k as u64);
        }
        let cqe = Cqe64 {
            sop_drop_qpn: mlx5::Be32::new(qpn),
            wqe_counter: mlx5::Be16::new(w),
            op_own: op_own(CqeOpcode::Req, CqeFormat::Plain, false, false),
            ..Cqe64::default()
        };
        ring[(k * 64) as usize..(k * 64 + 64) as usize].copy_from_slice(cqe.as_bytes());
        if qpn == 1 {
            wqe_a += 1;
        }
    }
    let mut got = Vec::new();
    // The first poll finds QP 1 through the general path (not seen yet): one at a time.
    let mut one = [Completion::default(); 1];
    assert_eq!(cq.poll(&mut one), 1);
    got.push(one[0].cookie);
    assert_eq!((u32::from_be(dbrec[CQ_SET_CI]), a.retired()), (1, 1));
    // Now a burst: room for 2 reports, entries 1 (unreported), 2, 3: three consumed.
    let mut out = [Completion::default(); 2];
    assert_eq!(cq.poll(&mut out), 2);
    got.extend(out.iter().map(|c| c.cookie));
    assert_eq!((u32::from_be(dbrec[CQ_SET_CI]), a.retired()), (4, 4));
    // Room for 8: entries 4, 5 (a burst), then QP 2's entry 6 and the rest through the
    // general path.
    let mut out = [Completion::default(); 8];
    let n = cq.poll(&mut out);
    got.extend(out[..n].iter().map(|c| c.cookie));
    assert_eq!(got, expected);
    assert_eq!(u32::from_be(dbrec[CQ_SET_CI]), 12);
    assert_eq!((a.retired(), b.retired()), (11, 1));
    assert_eq!(cq.poll(&mut out), 0);
}

/// An RDMA read's completion reports the CQE's byte count (rdma-core `handle_good_req`),
/// not what the driver posted, on the fast path (the QP seen last) and the general one
/// (another QP); other kinds report the driver's figure.
#[test]
fn read_completions_report_the_cqe_byte_count() {
    let cnt = 16u32;
    let mut ring = vec![0u8; (cnt * 64) as usize];
    let mut dbrec = [0u32; 2];
    // SAFETY: the ring and record outlive the poller, which alone polls them.
    let mut cq = unsafe { poller(&mut ring, 64, &mut dbrec) };
    let (a, b) = two_send_queues(&cq, 16);
    // (k, QP, WQE opcode, opcode, driver's byte count, CQE byte count, expected); the
    // device puts the WQE opcode in the top byte of `sop_drop_qpn`.
    let cases = [
        (0u32, 1u32, 0x08, WcOpcode::RdmaWrite, 0, 77, 0),
        (1, 1, 0x10, WcOpcode::RdmaRead, 64, 48, 48), // after a write of the same QP
        (2, 1, 0x10, WcOpcode::RdmaRead, 64, 40, 40),
        (3, 2, 0x10, WcOpcode::RdmaRead, 64, 24, 24), // another QP
        (4, 2, 0x12, WcOpcode::FetchAdd, 8, 99, 8),
        (5, 2, 0x08, WcOpcode::RdmaWrite, 0, 77, 0), // the fast path
    ];
    for (k, qpn, wqe_op, opcode, shadow, cqe_bytes, want) in cases {
        let sq = if qpn == 1 { &a } else { &b };
        sq.set(
            k as u16,
            SendEntry {
                cookie: k as u64,
                bbs: 1,
                opcode,
                byte_len: shadow,
                report: true,
            },
        );
        let cqe = Cqe64 {
            sop_drop_qpn: mlx5::Be32::new(wqe_op << 24 | qpn),
            wqe_counter: mlx5::Be16::new(k as u16),
            byte_cnt: mlx5::Be32::new(cqe_bytes),
            op_own: op_own(CqeOpcode::Req, CqeFormat::Plain, false, false),
            ..Cqe64::default()
        };
        let at = (k * 64) as usize;
        ring[at..at + 64].copy_from_slice(cqe.as_bytes());
        let mut out = [Completion::default(); 1];
        assert_eq!(cq.poll(&mut out), 1, "k = {k}");
        assert_eq!(
            (out[0].cookie, out[0].opcode, out[0].byte_len),
            (k as u64, opcode, want),
            "k = {k}"
        );
    }
}

#[test]
fn passes_over_64_byte_entries() {
    passes(64);
}

#[test]
fn passes_over_128_byte_entries() {
    passes(128);
}

#[test]
fn other_kinds_and_unknown_qps_take_the_general_path() {
    let cnt = 16u32;
    let mut ring = vec![0u8; (cnt * 64) as usize];
    let mut dbrec = [0u32; 2];
    // SAFETY: the ring and record outlive the poller, which alone polls them.
    let mut cq = unsafe { poller(&mut ring, 64, &mut dbrec) };
    let (a, b) = (
        Arc::new(Shadow::<SendEntry>::new(16)),
        Arc::new(Shadow::<SendEntry>::new(16)),
    );
    let rq = Arc::new(Shadow::<u64>::new(16));
    for (qpn, sq) in [(1, &a), (2, &b)] {
        cq.registry.attach(Attached {
            qpn,
            sq: Some(sq.clone()),
            rq: Some(rq.clone()),
            scatter: None,
            srq: None,
            invalidations: None,
        });
    }
    for k in 0..4u16 {
        let e = |c| SendEntry {
            cookie: c,
            bbs: 1,
            opcode: WcOpcode::Send,
            byte_len: 0,
            report: true,
        };
        a.set(k, e(100 + k as u64));
        b.set(k, e(200 + k as u64));
        rq.set(k, 300 + k as u64);
    }
    // QP 1, QP 2, QP 1 (the last-QP memory switches), a receive, an unknown QP.
    write_cqe(&mut ring, cnt, 64, 0, 1, CqeOpcode::Req);
    write_cqe(&mut ring, cnt, 64, 1, 2, CqeOpcode::Req);
    write_cqe(&mut ring, cnt, 64, 2, 1, CqeOpcode::Req);
    write_cqe(&mut ring, cnt, 64, 3, 2, CqeOpcode::RespSend);
    let mut out = [Completion::default(); 1];
    let mut seen = Vec::new();
    while cq.poll(&mut out) == 1 {
        seen.push((out[0].qpn, out[0].cookie, out[0].opcode));
    }
    assert_eq!(
        seen,
        [
            (1, 100, WcOpcode::Send),
            (2, 201, WcOpcode::Send),
            (1, 102, WcOpcode::Send),
            (2, 303, WcOpcode::Recv),
        ]
    );
    assert_eq!(u32::from_be(dbrec[CQ_SET_CI]), 4);
    // A QP the CQ does not know: consumed, not reported.
    write_cqe(&mut ring, cnt, 64, 4, 9, CqeOpcode::Req);
    assert_eq!(cq.poll(&mut out), 0);
    assert_eq!(u32::from_be(dbrec[CQ_SET_CI]), 5);
}

/// A title no device writes (a session shorter than 2 or longer than the ring) is one
/// entry reported as an error, never a read past the ring; a title on a CQ not created
/// compressed is an error too.
#[test]
fn impossible_titles_are_errors() {
    let cnt = 8u32;
    let mut ring = vec![0u8; (cnt * 64) as usize];
    let mut dbrec = [0u32; 2];
    // SAFETY: the ring and record outlive the poller, which alone polls them.
    let mut cq = unsafe { poller(&mut ring, 64, &mut dbrec) };
    cq.set_compressed();
    let sq = Arc::new(Shadow::<SendEntry>::new(16));
    cq.registry.attach(Attached {
        qpn: 3,
        sq: Some(sq.clone()),
        rq: None,
        scatter: None,
        srq: None,
        invalidations: None,
    });
    let title = |len: u32, owner: bool| Cqe64 {
        sop_drop_qpn: mlx5::Be32::new(3),
        byte_cnt: mlx5::Be32::new(len),
        op_own: op_own(CqeOpcode::Req, CqeFormat::Compressed, false, owner),
        ..Cqe64::default()
    };
    let mut out = [Completion::default(); 4];
    for (k, len) in [0u32, 1, 9, u32::MAX].into_iter().enumerate() {
        let at = k * 64;
        ring[at..at + 64].copy_from_slice(title(len, false).as_bytes());
        assert_eq!(cq.poll(&mut out), 1, "len {len}");
        assert_eq!((out[0].qpn, out[0].status), (3, WcStatus::GeneralErr));
        assert_eq!(u32::from_be(dbrec[CQ_SET_CI]), k as u32 + 1);
    }
    assert_eq!(sq.retired(), 0, "nothing retired");
    // Not created compressed: a valid-looking title is still not a success.
    let mut ring2 = vec![0u8; (cnt * 64) as usize];
    let mut dbrec2 = [0u32; 2];
    // SAFETY: as above.
    let mut plain = unsafe { poller(&mut ring2, 64, &mut dbrec2) };
    plain.registry.attach(Attached {
        qpn: 3,
        sq: Some(sq.clone()),
        rq: None,
        scatter: None,
        srq: None,
        invalidations: None,
    });
    ring2[..64].copy_from_slice(title(2, false).as_bytes());
    assert_eq!(plain.poll(&mut out), 1);
    assert_eq!(out[0].status, WcStatus::GeneralErr);
}

/// Requester CQEs that carry data (requester scatter-to-CQE, which blueflame never
/// enables) are never reported as a success, on the fast path or the general one;
/// receive CQEs with a format their ring cannot hold are errors too.
#[test]
fn cqes_with_data_the_poller_cannot_place_are_errors() {
    let cnt = 8u32;
    let mut ring = vec![0u8; (cnt * 64) as usize];
    let mut dbrec = [0u32; 2];
    // SAFETY: the ring and record outlive the poller, which alone polls them.
    let mut cq = unsafe { poller(&mut ring, 64, &mut dbrec) };
    let sq = Arc::new(Shadow::<SendEntry>::new(16));
    let rq = Arc::new(Shadow::<u64>::new(16));
    let table = Arc::new(ScatterTable::new(16, 1));
    let mut buf = [0u8; 8];
    table.record(
        0,
        &[mlx5::Sge {
            addr: buf.as_mut_ptr() as u64,
            len: 8,
            lkey: 1,
        }],
        None,
    );
    rq.set(0, 42);
    cq.registry.attach(Attached {
        qpn: 3,
        sq: Some(sq.clone()),
        rq: Some(rq.clone()),
        scatter: Some(table),
        srq: None,
        invalidations: None,
    });
    for k in 0..3u16 {
        sq.set(
            k,
            SendEntry {
                cookie: 10 + k as u64,
                bbs: 1,
                opcode: WcOpcode::RdmaRead,
                byte_len: 8,
                report: true,
            },
        );
    }
    let put = |ring: &mut [u8], k: u32, op: CqeOpcode, fmt: CqeFormat, wqe: u16| {
        let cqe = Cqe64 {
            sop_drop_qpn: mlx5::Be32::new(3),
            wqe_counter: mlx5::Be16::new(wqe),
            byte_cnt: mlx5::Be32::new(8),
            op_own: op_own(op, fmt, false, false),
            ..Cqe64::default()
        };
        ring[(k * 64) as usize..(k * 64 + 64) as usize].copy_from_slice(cqe.as_bytes());
    };
    let mut out = [Completion::default(); 1];
    // A plain one first, so that QP 3 is the fast path's last QP.
    put(&mut ring, 0, CqeOpcode::Req, CqeFormat::Plain, 0);
    assert_eq!(cq.poll(&mut out), 1);
    assert_eq!((out[0].cookie, out[0].status), (10, WcStatus::Success));
    put(&mut ring, 1, CqeOpcode::Req, CqeFormat::InlineScatter32, 1);
    assert_eq!(cq.poll(&mut out), 1);
    assert_eq!((out[0].cookie, out[0].status), (11, WcStatus::GeneralErr));
    put(&mut ring, 2, CqeOpcode::Req, CqeFormat::InlineScatter64, 2);
    assert_eq!(cq.poll(&mut out), 1);
    assert_eq!((out[0].cookie, out[0].status), (12, WcStatus::GeneralErr));
    assert_eq!(sq.retired(), 3, "the blocks retire all the same");
    // Format 64 on a ring of 64-byte entries: the bytes before it are another entry.
    put(
        &mut ring,
        3,
        CqeOpcode::RespSend,
        CqeFormat::InlineScatter64,
        0,
    );
    assert_eq!(cq.poll(&mut out), 1);
    assert_eq!((out[0].cookie, out[0].status), (42, WcStatus::GeneralErr));
    assert_eq!(buf, [0; 8], "nothing copied");
}
