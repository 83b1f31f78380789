//! Send WQEs as the software NIC reads them: whatever bytes are in a send ring.
//!
//! Two connected RC QPs on the software NIC (stepped mode), or two UD QPs (the input's first
//! byte says which), receives posted on both, and into QP A's send ring: WQEs encoded by `mlx5::wqe::encode` from requests the input
//! chooses (every opcode, keys of the right region, of a region without rights, of another
//! protection domain, of a window, or none; addresses in, across and past the regions;
//! inline data; on UD, sends whose datagram segment is the peer's or any 48 bytes), then
//! bytes of it changed, or blocks of raw bytes; the doorbell rung with any producer index
//! the ring can hold.
//!
//! Promised: the NIC never panics and always ends (`drain` returns); it touches no memory
//! outside the regions it may access (AddressSanitizer; and the bytes of a region without
//! rights and of a region of another protection domain, and of a buffer never registered,
//! stay as written); every CQE it writes names one of the two QPs with an opcode a device
//! writes, at most one per send block or receive; a QP that had an error CQE is in the
//! error state (a UD QP, or its send queue only: SQE).
#![no_main]

use blueflame_fuzz::Input;
use libfuzzer_sys::fuzz_target;
use mlx5::av::DatagramSeg;
use mlx5::cqe::{Cqe64, CqeOpcode};
use mlx5::ctrl::{CompletionMode, Fence, FmCeSe};
use mlx5::doorbell::{RCV_DBR, SEND_WQE_BB, SND_DBR};
use mlx5::request::{Access, BindMw, MaskedAtomic, MwType, Payload, Remote, Request, Sge};
use mlx5::sim::{Nic, QpCaps, QpState};
use mlx5::wqe::{encode, encode_ud, ud_wqe_ds, wqe_ds, Limits, Span, UdSend};
use zerocopy::FromBytes;

/// Blocks of QP A's send ring, receives of each QP, CQ entries (never overrun: at most one
/// CQE per block and per receive).
const SQ_BLOCKS: u32 = 64;
const RQ: u32 = 16;
const CQ: u32 = 256;

fuzz_target!(|data: &[u8]| {
    let mut r = Input::new(data);
    let nic = Nic::new();
    let (pd, pd2) = (nic.alloc_pd(), nic.alloc_pd());
    let cq = nic.create_cq(CQ, 64).expect("a CQ");
    // SAFETY: the CQ's ring (CQ entries of 64 bytes) is live until the NIC is dropped; no
    // QP uses it yet. Every entry starts INVALID, owner bit set (as rdma-core sets it).
    unsafe {
        for i in 0..CQ as usize {
            cq.buf.add(i * 64 + 63).write(0xf1);
        }
    }
    let caps = QpCaps {
        sq_blocks: SQ_BLOCKS,
        rq_entries: RQ,
        ..QpCaps::default()
    };
    let a = nic.create_qp(pd, cq.cqn, cq.cqn, caps).expect("QP A");
    let b = nic.create_qp(pd, cq.cqn, cq.cqn, caps).expect("QP B");
    let ud = r.u8() & 1 == 1;
    const QKEY: u32 = 0x1111_1111;
    if ud {
        for q in [&a, &b] {
            nic.make_ud(q.qpn, QKEY, false).expect("a UD QP");
        }
    } else {
        nic.init_qp(a.qpn).expect("INIT");
        nic.init_qp(b.qpn).expect("INIT");
        nic.connect(a.qpn, nic.path_to(b.qpn)).expect("connect");
        nic.connect(b.qpn, nic.path_to(a.qpn)).expect("connect");
    }
    let all = Access::LOCAL_WRITE
        | Access::REMOTE_WRITE
        | Access::REMOTE_READ
        | Access::REMOTE_ATOMIC
        | Access::MW_BIND;
    let open = nic.alloc_mr(pd, 4096, all).expect("a region");
    let closed = nic
        .alloc_mr(pd, 256, Access::NONE)
        .expect("a region without rights");
    let foreign = nic.alloc_mr(pd2, 512, all).expect("a region of another PD");
    let mw = nic.alloc_mw(pd, MwType::Two).expect("a window");
    let never = vec![0x5au8; 256];
    // The bytes that must not change.
    let snap = |addr: u64, len: u64| {
        // SAFETY: a region the NIC allocated and keeps while registered (none is
        // deregistered here); the NIC runs only inside `process`/`drain`, not now.
        unsafe { std::slice::from_raw_parts(addr as *const u8, len as usize) }.to_vec()
    };
    for (m, fill) in [(&closed, 0x11u8), (&foreign, 0x22), (&open, 0x33)] {
        // SAFETY: as above.
        unsafe { std::ptr::write_bytes(m.addr as *mut u8, fill, m.len as usize) };
    }
    let (closed0, foreign0) = (
        snap(closed.addr, closed.len),
        snap(foreign.addr, foreign.len),
    );
    // Receives on both QPs, into the open region.
    let mut recvs = 0u32;
    for q in [&a, &b] {
        for i in 0..RQ {
            let sge = Sge {
                addr: open.addr + u64::from(i) * 128,
                len: 128,
                lkey: open.lkey,
            };
            // SAFETY: entry i (< rq_wqe_cnt) of the QP's receive ring, not posted yet.
            let entry = unsafe {
                std::slice::from_raw_parts_mut(
                    q.rq_buf.add((i * q.rq_stride) as usize),
                    q.rq_stride as usize,
                )
            };
            mlx5::recv::encode_recv(&[sge], entry).expect("one entry fits");
            recvs += 1;
        }
        // SAFETY: the QP's doorbell record; nothing else writes it.
        unsafe { q.dbrec.add(RCV_DBR).write_volatile(RQ.to_be()) };
    }
    let keys = [open.lkey, closed.lkey, foreign.lkey, mw, 0, 0x100, r.u32()];
    let lim = Limits {
        max_sge: a.max_send_sge as usize,
        max_inline: a.max_inline as usize,
    };
    // SAFETY: A's send ring (SQ_BLOCKS blocks of 64 bytes), live while the NIC is; the NIC
    // reads it only inside `process`/`drain`.
    let ring =
        unsafe { std::slice::from_raw_parts_mut(a.sq_buf, SQ_BLOCKS as usize * SEND_WQE_BB) };
    let mut pi = 0u32;
    let mut wqes = 0u32;
    let mut inline = [0u8; 300];
    // Blocks the NIC was given before the last drain (the ring may be reused past them,
    // up to three passes: the CQ holds a CQE per block and per receive).
    let mut base = 0u32;
    while !r.is_empty() {
        let op = r.u8();
        if pi - base == SQ_BLOCKS && pi < 3 * SQ_BLOCKS {
            ring_doorbell(&nic, &a, pi, &mut r);
            nic.drain();
            base = pi;
        }
        let free = SQ_BLOCKS - (pi - base);
        if op % 8 == 7 {
            ring_doorbell(&nic, &a, pi, &mut r);
            continue;
        }
        if op % 8 == 6 && op & 0x80 != 0 {
            // A receive entry of A or B (posted or not) rewritten: scatter entries of any
            // key, address and length (or raw bytes), as the NIC will read them.
            let q = if op & 0x40 != 0 { &b } else { &a };
            let i = r.below(RQ as usize) as u32;
            let stride = q.rq_stride as usize;
            // SAFETY: entry i (< RQ) of the QP's receive ring; the NIC reads it only inside
            // `process`/`drain`, not now.
            let entry = unsafe {
                std::slice::from_raw_parts_mut(q.rq_buf.add(i as usize * stride), stride)
            };
            for seg in entry.chunks_exact_mut(16) {
                if r.u8() & 1 == 0 {
                    let addr = match r.u8() % 4 {
                        0 => open.addr,
                        1 => closed.addr,
                        2 => foreign.addr,
                        _ => never.as_ptr() as u64,
                    }
                    .wrapping_add(u64::from(r.u16()) % 4200);
                    let len = match r.u8() % 4 {
                        0 => 0,
                        1 => r.u32(),
                        _ => u32::from(r.u16()) % 5000,
                    };
                    let lkey = keys[r.below(keys.len())];
                    seg[..4].copy_from_slice(&len.to_be_bytes());
                    seg[4..8].copy_from_slice(&lkey.to_be_bytes());
                    seg[8..].copy_from_slice(&addr.to_be_bytes());
                } else {
                    seg.copy_from_slice(&r.array::<16>());
                }
            }
            continue;
        }
        if op % 8 == 6 {
            // Raw blocks.
            let bbs = (1 + r.below(4) as u32).min(free);
            for k in 0..bbs {
                let blk: [u8; 64] = r.array();
                let at = ((pi + k) % SQ_BLOCKS) as usize * SEND_WQE_BB;
                ring[at..at + 64].copy_from_slice(&blk);
            }
            pi += bbs;
            wqes += bbs;
            if free == bbs && pi >= 3 * SQ_BLOCKS {
                break;
            }
            continue;
        }
        if ud && op % 8 < 3 {
            // A UD send: to B (its number and Q_Key) or wherever 48 bytes say.
            let mut dgram = DatagramSeg::read_from_bytes(&r.array::<48>()).expect("48 bytes");
            if op & 0x20 == 0 {
                dgram = DatagramSeg::ud(&dgram.av, b.qpn, QKEY);
            }
            let n = r.below(inline.len());
            inline[..n].fill(r.u8());
            let lkey = keys[r.below(keys.len())];
            let sge = [Sge {
                addr: open.addr.wrapping_add(u64::from(r.u16()) % 4200),
                len: u32::from(r.u16()) % 5000,
                lkey,
            }];
            let send = UdSend {
                dgram,
                data: if op & 0x80 != 0 {
                    Payload::Inline(&inline[..n])
                } else {
                    Payload::Sgl(&sge)
                },
                imm: (op & 0x40 != 0).then(|| r.u32()),
            };
            let Ok(ds) = ud_wqe_ds(&send.data, &lim) else {
                continue;
            };
            let bbs = (ds * 16).div_ceil(SEND_WQE_BB) as u32;
            if bbs > free {
                if pi >= 2 * SQ_BLOCKS {
                    break;
                }
                ring_doorbell(&nic, &a, pi, &mut r);
                nic.drain();
                base = pi;
            }
            let flags = FmCeSe {
                fence: Fence::None,
                completion: CompletionMode::Always,
                solicited: false,
            };
            span_at(ring, pi, bbs, |span| {
                encode_ud(&send, ds, pi as u16, a.qpn, flags, span)
            });
            pi += bbs;
            wqes += 1;
            continue;
        }
        // A request, encoded as the driver encodes it.
        let pick_key = |r: &mut Input<'_>| keys[r.below(keys.len())];
        let pick_addr = |r: &mut Input<'_>| {
            let base = match r.u8() % 4 {
                0 => open.addr,
                1 => closed.addr,
                2 => foreign.addr,
                _ => never.as_ptr() as u64,
            };
            base.wrapping_add(u64::from(r.u16()) % 4200)
                .wrapping_sub(u64::from(r.u8() % 2) * 8)
        };
        let sge = |r: &mut Input<'_>| Sge {
            addr: pick_addr(r),
            len: u32::from(r.u16()) % 5000,
            lkey: pick_key(r),
        };
        let remote = |r: &mut Input<'_>| Remote {
            addr: pick_addr(r),
            rkey: pick_key(r),
        };
        let sgl: Vec<Sge> = (0..1 + r.below(3)).map(|_| sge(&mut r)).collect();
        let n_inline = r.below(inline.len());
        inline[..n_inline].fill(r.u8());
        let data = if op & 0x80 != 0 {
            Payload::Inline(&inline[..n_inline])
        } else {
            Payload::Sgl(&sgl)
        };
        let req = match (op >> 3) % 13 {
            0 => Request::Nop,
            1 => Request::Write {
                remote: remote(&mut r),
                data,
            },
            2 => Request::WriteImm {
                remote: remote(&mut r),
                data,
                imm: r.u32(),
            },
            3 => Request::Read {
                remote: remote(&mut r),
                sgl: &sgl,
            },
            4 => Request::Send { data },
            5 => Request::SendImm { data, imm: r.u32() },
            6 => Request::SendInv {
                data,
                rkey: pick_key(&mut r),
            },
            7 => Request::CompareSwap {
                remote: remote(&mut r),
                compare: r.u64(),
                swap: r.u64(),
                local: sge(&mut r),
            },
            8 => Request::FetchAdd {
                remote: remote(&mut r),
                add: r.u64(),
                local: sge(&mut r),
            },
            9 => Request::Masked {
                remote: remote(&mut r),
                op: MaskedAtomic::Cs32 {
                    swap: r.u32(),
                    compare: r.u32(),
                    swap_mask: r.u32(),
                    compare_mask: r.u32(),
                },
                local: sge(&mut r),
            },
            10 => Request::LocalInvalidate {
                rkey: pick_key(&mut r),
            },
            _ => Request::BindMw(BindMw {
                mw_rkey: mw,
                new_rkey: mw & !0xff | u32::from(r.u8()),
                mw_type: MwType::Two,
                mr_lkey: pick_key(&mut r),
                addr: pick_addr(&mut r),
                len: u64::from(r.u16()),
                access: Access(u32::from(r.u8()) & 0x2f),
            }),
        };
        let Ok(ds) = wqe_ds(&req, &lim) else { continue };
        let bbs = (ds * 16).div_ceil(SEND_WQE_BB) as u32;
        if bbs > free {
            if pi >= 2 * SQ_BLOCKS {
                break;
            }
            ring_doorbell(&nic, &a, pi, &mut r);
            nic.drain();
            base = pi;
        }
        let flags = FmCeSe {
            fence: match r.u8() % 4 {
                0 => Fence::None,
                1 => Fence::InitiatorSmall,
                2 => Fence::Fence,
                _ => Fence::StrongOrdering,
            },
            completion: match r.u8() % 3 {
                0 => CompletionMode::OnError,
                1 => CompletionMode::FirstError,
                _ => CompletionMode::Always,
            },
            solicited: op & 0x40 != 0,
        };
        let (start, len) = span_at(ring, pi, bbs, |span| {
            encode(&req, ds, pi as u16, a.qpn, flags, span);
        });
        // Then bytes of it changed.
        for _ in 0..r.u8() % 4 {
            let at = (start + r.below(len)) % ring.len();
            ring[at] ^= r.u8();
        }
        pi += bbs;
        wqes += 1;
    }
    ring_doorbell(&nic, &a, pi, &mut r);
    nic.drain();
    // The CQEs: each names A or B with an opcode a device writes; no more than WQEs and
    // receives.
    let mut cqes = 0u32;
    let mut errors = [false; 2];
    for i in 0..CQ as usize {
        // SAFETY: entry i of the live CQ ring; the NIC is idle (drained).
        let bytes = unsafe { std::slice::from_raw_parts(cq.buf.add(i * 64), 64) };
        let cqe = Cqe64::read_from_bytes(bytes).expect("64 bytes");
        let op = CqeOpcode::from_bits(cqe.op_own >> 4);
        if op == Some(CqeOpcode::Invalid) && cqe.op_own & 1 == 1 {
            break; // not written
        }
        cqes += 1;
        let qpn = match op {
            Some(CqeOpcode::ReqErr | CqeOpcode::RespErr) => cqe.as_err().qpn(),
            _ => cqe.qpn(),
        };
        assert!(
            qpn == a.qpn || qpn == b.qpn,
            "CQE {i} of QP {qpn:#x}: {cqe:?}"
        );
        assert!(
            matches!(
                op,
                Some(
                    CqeOpcode::Req
                        | CqeOpcode::RespSend
                        | CqeOpcode::RespSendImm
                        | CqeOpcode::RespSendInv
                        | CqeOpcode::RespWrImm
                        | CqeOpcode::ReqErr
                        | CqeOpcode::RespErr
                )
            ),
            "CQE {i}: {cqe:?}"
        );
        if matches!(op, Some(CqeOpcode::ReqErr | CqeOpcode::RespErr)) {
            errors[(qpn == b.qpn) as usize] = true;
        }
    }
    // (A WQE whose size field was changed is several WQEs to the NIC: blocks bound them.)
    assert!(
        cqes <= pi + recvs,
        "{cqes} CQEs of {pi} blocks ({wqes} WQEs written) and {recvs} receives"
    );
    for (q, e) in [(&a, errors[0]), (&b, errors[1])] {
        if e {
            // RC: Error. UD: a send error stops only the send queue (SQE, IBA 10.3.1), a
            // receive error the QP.
            let state = nic.qp_state(q.qpn);
            assert!(
                state == Some(QpState::Error) || (ud && state == Some(QpState::SqError)),
                "QP {:#x} after an error CQE: {state:?}",
                q.qpn
            );
        }
    }
    assert_eq!(
        snap(closed.addr, closed.len),
        closed0,
        "a region without rights changed"
    );
    assert_eq!(
        snap(foreign.addr, foreign.len),
        foreign0,
        "another PD's region changed"
    );
    assert!(
        never.iter().all(|&x| x == 0x5a),
        "memory never registered changed"
    );
});

/// Runs `write` on the span of `bbs` blocks at producer index `pi` of `ring` (wrapping at
/// its end, as a driver's WQE does); returns where it starts and its length in bytes.
fn span_at(
    ring: &mut [u8],
    pi: u32,
    bbs: u32,
    write: impl FnOnce(&mut Span<'_>),
) -> (usize, usize) {
    let start = (pi % SQ_BLOCKS) as usize * SEND_WQE_BB;
    let len = bbs as usize * SEND_WQE_BB;
    let (head, tail) = ring.split_at_mut(start);
    let first = tail.len().min(len);
    write(&mut Span {
        a: &mut tail[..first],
        b: &mut head[..len - first],
    });
    (start, len)
}

/// Rings A's doorbell for producer index `pi`, as the driver does (record, then the 8-byte
/// doorbell or a BlueFlame copy), and lets the NIC run a few passes.
fn ring_doorbell(nic: &Nic, a: &mlx5::RawQp, pi: u32, r: &mut Input<'_>) {
    let last = (pi.wrapping_sub(1) % SQ_BLOCKS) as usize * SEND_WQE_BB;
    // SAFETY: A's doorbell record and register and block `last` of its ring: live while the
    // NIC is, written by nobody else.
    unsafe {
        a.dbrec.add(SND_DBR).write_volatile((pi & 0xffff).to_be());
        core::ptr::copy_nonoverlapping(a.sq_buf.add(last), a.bf_reg, 8);
    }
    for _ in 0..1 + r.u8() % 3 {
        nic.process();
    }
}
