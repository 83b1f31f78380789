//! The poller's fast paths (`poll_some`, `poll_burst`, `poll_recv`) against its general path (forced), over the
//! same CQE sequences: sends, reads, internal (unreported) completions, receives of every
//! scatter-to-CQE size into one-entry lists, errors, two QPs interleaved, ring wraps and
//! polls of every room.

use super::*;
use crate::queue::scatter::ScatterTable;
use zerocopy::IntoBytes;

#[derive(Clone, Copy, Debug)]
enum Kind {
    Write,
    Read(u32),
    /// A receive: data length, delivered in the CQE (32-byte scatter) or in the buffer.
    Recv(u32, bool),
    RecvImm(u32),
    ReqErr,
}

struct Side {
    ring: Vec<u8>,
    dbrec: Box<[u32; 2]>,
    cq: CompletionQueue,
    sqs: Vec<Arc<Shadow<SendEntry>>>,
    rqs: Vec<Arc<Shadow<u64>>>,
    /// Boxed: the scatter tables hold the buffers' addresses while the list grows.
    #[allow(clippy::vec_box)]
    bufs: Vec<Box<[u64; 64 * 4]>>,
}

const CNT: u32 = 16;
const DEPTH: u32 = 64;

fn side(reports: &[bool], buf_len: u32) -> Side {
    let mut ring = vec![0u8; (CNT * 64) as usize];
    let mut dbrec = Box::new([0u32; 2]);
    let raw = RawCq {
        cqn: 5,
        buf: ring.as_mut_ptr(),
        cqe_cnt: CNT,
        cqe_size: 64,
        dbrec: dbrec.as_mut_ptr(),
        cq_uar: core::ptr::null_mut(),
    };
    // SAFETY: the ring and record are heap memory kept in `Side` with the poller.
    let cq = unsafe { CompletionQueue::new(&raw) }.unwrap();
    let mut s = Side {
        ring,
        dbrec,
        cq,
        sqs: vec![],
        rqs: vec![],
        bufs: vec![],
    };
    for qpn in [1u32, 2] {
        let sq = Arc::new(Shadow::<SendEntry>::new(DEPTH));
        let rq = Arc::new(Shadow::<u64>::new(DEPTH));
        let t = Arc::new(ScatterTable::new(DEPTH, 1));
        let mut buf = Box::new([0u64; 64 * 4]);
        for i in 0..DEPTH as u16 {
            let read = i % 3 == 1;
            sq.set(
                i,
                SendEntry {
                    cookie: (qpn as u64) << 32 | i as u64,
                    bbs: 1,
                    opcode: if read {
                        WcOpcode::RdmaRead
                    } else {
                        WcOpcode::RdmaWrite
                    },
                    byte_len: if read { 99 } else { 0 },
                    report: reports[i as usize],
                },
            );
            rq.set(i, (qpn as u64) << 40 | i as u64);
            let sge = mlx5::Sge {
                addr: buf[i as usize * 4..].as_mut_ptr() as u64,
                len: buf_len,
                lkey: 1,
            };
            t.record_one(i, &sge, None);
        }
        s.cq.registry.attach(Attached {
            qpn,
            sq: Some(sq.clone()),
            rq: Some(rq.clone()),
            scatter: Some(t),
            srq: None,
            invalidations: None,
        });
        s.sqs.push(sq);
        s.rqs.push(rq);
        s.bufs.push(buf);
    }
    s
}

fn cqe(k: u32, qpn: u32, kind: Kind, send_i: u16, recv_i: u16) -> [u8; 64] {
    let owner = k & CNT != 0;
    let mut c = Cqe64::default();
    match kind {
        Kind::Write | Kind::Read(_) => {
            let (op, n) = match kind {
                Kind::Read(n) => (0x10u32, n),
                _ => (0x08, 0),
            };
            c.sop_drop_qpn = mlx5::Be32::new(op << 24 | qpn);
            c.wqe_counter = mlx5::Be16::new(send_i);
            c.byte_cnt = mlx5::Be32::new(n);
            c.op_own = op_own(CqeOpcode::Req, CqeFormat::Plain, false, owner);
        }
        Kind::Recv(n, _) | Kind::RecvImm(n) => {
            let inl = matches!(kind, Kind::Recv(_, true));
            let imm = matches!(kind, Kind::RecvImm(_));
            c.sop_drop_qpn = mlx5::Be32::new(qpn);
            c.wqe_counter = mlx5::Be16::new(recv_i);
            c.byte_cnt = mlx5::Be32::new(n);
            c.imm_inval_pkey = mlx5::Be32::new(0xabcd);
            if inl {
                for b in 0..32u8 {
                    c.rsvd0[b as usize] = b ^ (k as u8);
                }
            }
            let op = if imm {
                CqeOpcode::RespSendImm
            } else {
                CqeOpcode::RespSend
            };
            let fmt = if inl {
                CqeFormat::InlineScatter32
            } else {
                CqeFormat::Plain
            };
            c.op_own = op_own(op, fmt, false, owner);
        }
        _ => {
            let e = mlx5::cqe::ErrCqe {
                syndrome: 0x05,
                s_wqe_opcode_qpn: mlx5::Be32::new(0x08 << 24 | qpn),
                wqe_counter: mlx5::Be16::new(send_i),
                op_own: op_own(CqeOpcode::ReqErr, CqeFormat::Plain, false, owner),
                ..Default::default()
            };
            let mut b = [0u8; 64];
            b.copy_from_slice(e.as_bytes());
            return b;
        }
    }
    let mut b = [0u8; 64];
    b.copy_from_slice(c.as_bytes());
    b
}

fn kind() -> impl proptest::strategy::Strategy<Value = Kind> {
    use proptest::prelude::*;
    prop_oneof![
        4 => Just(Kind::Write),
        1 => (0u32..64).prop_map(Kind::Read),
        3 => (prop_oneof![Just(0u32), Just(8), Just(13), Just(16), Just(24), Just(32), Just(33)], any::<bool>())
            .prop_map(|(n, inl)| Kind::Recv(if inl { n.min(32) } else { n }, inl)),
        1 => (0u32..=32).prop_map(Kind::RecvImm),
        1 => Just(Kind::ReqErr),
    ]
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(1000))]
    #[test]
    fn fast_and_general_polls_agree(
        reports in proptest::collection::vec(proptest::prelude::any::<bool>(), DEPTH as usize),
        buf_len in proptest::prop_oneof![proptest::strategy::Just(32u32), proptest::strategy::Just(24), proptest::strategy::Just(40)],
        events in proptest::collection::vec(
            (1u32..=2, kind(), 0usize..6), 1..120)
    ) {
        let mut a = side(&reports, buf_len);
        let mut b = side(&reports, buf_len);
        let (mut send_i, mut recv_i) = ([0u16; 2], [0u16; 2]);
        let mut written = 0u32;
        for (e, (qpn, kind, poll)) in events.iter().enumerate() {
            // Write one CQE if the ring has room (as the device would), then maybe poll.
            let consumed = u32::from_be(a.dbrec[CQ_SET_CI]);
            if written.wrapping_sub(consumed) < CNT {
                let q = (*qpn - 1) as usize;
                // A send's CQE follows its WQE: a read's carries opcode 0x10 and its length.
                let kind = match *kind {
                    Kind::Write | Kind::Read(_) if send_i[q] % 3 == 1 => Kind::Read(7 + send_i[q] as u32),
                    Kind::Write | Kind::Read(_) => Kind::Write,
                    k => k,
                };
                let kind = &kind;
                let bytes = cqe(written, *qpn, *kind, send_i[q], recv_i[q]);
                match kind {
                    Kind::Recv(..) | Kind::RecvImm(_) => recv_i[q] = recv_i[q].wrapping_add(1) % DEPTH as u16,
                    _ => send_i[q] = send_i[q].wrapping_add(1) % DEPTH as u16,
                }
                let at = ((written % CNT) * 64) as usize;
                a.ring[at..at + 64].copy_from_slice(&bytes);
                b.ring[at..at + 64].copy_from_slice(&bytes);
                written += 1;
            }
            if *poll > 0 {
                let (mut oa, mut ob) = (vec![Completion::default(); *poll], vec![Completion::default(); *poll]);
                let na = a.cq.poll(&mut oa);
                FORCE_GENERAL.with(|f| f.set(true));
                let nb = b.cq.poll(&mut ob);
                FORCE_GENERAL.with(|f| f.set(false));
                proptest::prop_assert_eq!(format!("{:?}", &oa[..na]), format!("{:?}", &ob[..nb]), "event {}", e);
                proptest::prop_assert_eq!(a.dbrec[CQ_SET_CI], b.dbrec[CQ_SET_CI], "event {}", e);
                for q in 0..2 {
                    proptest::prop_assert_eq!(a.sqs[q].retired(), b.sqs[q].retired(), "event {} sq {}", e, q);
                    proptest::prop_assert_eq!(a.rqs[q].retired(), b.rqs[q].retired(), "event {} rq {}", e, q);
                    proptest::prop_assert_eq!(&a.bufs[q][..], &b.bufs[q][..], "event {} bufs {}", e, q);
                }
            }
        }
    }
}
