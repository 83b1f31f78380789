//! CQE and compressed-session decoding by the direct path's poller, over rings this target
//! writes as a device would (`blueflame::internals::poll_harness`: four QPs, one of them
//! taking its receives from an SRQ).
//!
//! Two modes, by the first byte:
//! - **raw**: arbitrary 64-byte CQEs (and, on 128-byte rings, the 64 bytes before them,
//!   where `INLINE_SCATTER_64` data lies), on plain and compressing CQs, polled into arrays
//!   of any size between writes. Promised: no panic and no access outside the ring and the
//!   receive buffers (AddressSanitizer); never more completions than `out` holds; a success
//!   is a posted entry of the QP the completion names (its cookie: that QP, the queue its
//!   opcode says, an entry of that queue); data carried in a CQE lands in its receive's
//!   scatter list and nowhere else (the guard bytes around every list stay as written),
//!   and is the CQE's ([`Expect`], worked out from the ring's bytes alone): a receive's
//!   success from an entry of format `INLINE_SCATTER_32` leaves the first `byte_len` bytes
//!   of the 64-byte CQE in its entries, in order across them, one of `INLINE_SCATTER_64`
//!   the first `byte_len` of the 64 bytes before it (128-byte rings only), and the rest
//!   of the entries as they were; a success never carries more than its list holds (a
//!   local length error, as rdma-core's `copy_to_scat` reports) nor more than its format
//!   does; no other receive's entries change; the consumer index only moves forward, one
//!   entry per completion at most, never past what a session's title claims; a timed poll
//!   (`Cq::poll_timed`'s sink) stamps every success of a plain CQ and writes nothing past
//!   its completions.
//! - **sessions**: completions written once as compressed sessions (title, mini-CQE arrays
//!   at `mini_array_slot`) and once as the same entries uncompressed, into two CQs:
//!   promised, the same completions in the same order, and the same consumer index; no
//!   receive's buffers written (no entry carries data).
#![no_main]

use blueflame::internals::poll_harness::{PollHarness, DEPTH, QPNS, SCATTER_LEN};
use blueflame::{Completion, WcOpcode, WcStatus};
use blueflame_fuzz::Input;
use libfuzzer_sys::fuzz_target;
use mlx5::cqe::{mini_array_slot, op_own, Cqe64, CqeFormat, CqeOpcode, MiniCqe8};
use mlx5::{Be16, Be32};
use zerocopy::IntoBytes;

fuzz_target!(|data: &[u8]| {
    let mut r = Input::new(data);
    if r.u8() & 1 == 0 {
        raw(&mut r);
    } else {
        sessions(&mut r);
    }
});

/// The owner bit of absolute slot `k` when the device writes it.
fn owner(k: u32, cnt: u32) -> bool {
    k & cnt != 0
}

/// What every completion of the harness must be.
fn check(c: &Completion) {
    assert!(
        QPNS.contains(&c.qpn) || c.status != WcStatus::Success,
        "{c:?}"
    );
    if c.status != WcStatus::Success {
        return;
    }
    let (qpn, recv, i) = (
        (c.cookie >> 32) as u32,
        c.cookie >> 16 & 1 == 1,
        (c.cookie & 0xffff) as u32,
    );
    assert_eq!(qpn, c.qpn, "a success with another QP's cookie: {c:?}");
    assert!(i < DEPTH, "a cookie nobody posted: {c:?}");
    let is_recv = c.opcode.is_receive();
    assert_eq!(recv, is_recv, "a success from the wrong queue: {c:?}");
    if !recv {
        let opcode = match i % 4 {
            0 => WcOpcode::RdmaWrite,
            1 => WcOpcode::RdmaRead,
            2 => WcOpcode::Send,
            _ => WcOpcode::CompSwap,
        };
        assert_eq!(c.opcode, opcode, "{c:?}");
        match opcode {
            WcOpcode::RdmaWrite | WcOpcode::Send => assert_eq!(c.byte_len, 0, "{c:?}"),
            WcOpcode::CompSwap => assert_eq!(c.byte_len, 8, "{c:?}"),
            _ => {}
        }
    }
}

fn raw(r: &mut Input<'_>) {
    let flags = r.u8();
    let size = if flags & 1 == 0 { 64 } else { 128 };
    let compressed = flags & 2 != 0;
    let cnt = 1u32 << (1 + (flags >> 2) % 5);
    let mut h = PollHarness::new(cnt, size, compressed).expect("a valid shape");
    let mut out = [Completion::default(); 9];
    // Slots written so far (absolute), completions seen, the index last published.
    let (mut written, mut seen, mut ci) = (0u32, 0u64, 0u32);
    let mut times = [None; 9];
    // What the receives' buffers must hold (`Expect`).
    let mut model = h.recv_bytes().to_vec();
    let mut poll = |h: &mut PollHarness, room: usize, timed: bool, seen: &mut u64, ci: &mut u32| {
        // The ring the poller will read, before it runs.
        let expect = Expect::before(h, size, cnt, compressed);
        let n = if timed {
            // A timed poll (`Cq::poll_timed`): the same completions, and a stamp beside each
            // but an error's (and a mini-CQE's); nothing past them written.
            times = [Some(u64::MAX); 9];
            let n = h.poll_timed(&mut out[..room], &mut times[..room]);
            assert!(times[n..].iter().all(|t| *t == Some(u64::MAX)));
            for (c, t) in out[..n].iter().zip(&times[..n]) {
                assert!(
                    compressed || t.is_some() || !c.is_ok(),
                    "a success without its stamp: {c:?}"
                );
            }
            n
        } else {
            h.poll(&mut out[..room])
        };
        assert!(n <= room);
        for c in &out[..n] {
            check(c);
        }
        *seen += n as u64;
        let now = h.published();
        assert!(
            now.wrapping_sub(*ci) <= 2 * cnt,
            "the index jumped: {ci} -> {now}"
        );
        *ci = now;
        assert!(
            h.guards_intact(),
            "a CQE's data landed outside its receive's buffers"
        );
        expect.after(h, &out[..n], &mut model);
        n
    };
    while !r.is_empty() {
        let op = r.u8();
        if op & 3 == 0 {
            poll(
                &mut h,
                1 + op as usize % 9,
                op & 0x40 != 0,
                &mut seen,
                &mut ci,
            );
            continue;
        }
        // The device writes no further than a ring ahead of the published index.
        written = written.max(ci);
        if written.wrapping_sub(ci) >= cnt {
            poll(&mut h, 9, false, &mut seen, &mut ci);
            continue;
        }
        let mut cqe: [u8; 64] = r.array();
        if op & 4 != 0 {
            // One of the attached QPs (the WQE opcode byte above it kept).
            let qpn = QPNS[(op >> 3) as usize % QPNS.len()].to_be_bytes();
            cqe[57..60].copy_from_slice(&qpn[1..]);
            // Errors carry it at the same place (`s_wqe_opcode_qpn`).
        }
        if op & 0x40 == 0 {
            // The owner bit of its pass (else whatever the input says: a stale entry).
            cqe[63] = cqe[63] & !1 | owner(written, cnt) as u8;
        }
        if op & 0x80 != 0 {
            let front: [u8; 64] = r.array();
            h.write_front(written, &front);
        }
        h.write(written, &cqe);
        written = written.wrapping_add(1);
    }
    // Drain: polls until nothing comes twice.
    let mut idle = 0;
    for _ in 0..4 * cnt + 8 {
        if poll(&mut h, 9, seen % 2 == 1, &mut seen, &mut ci) == 0 {
            idle += 1;
            if idle == 2 {
                break;
            }
        }
    }
    // One completion per consumed slot at most, plus a session read in part.
    assert!(
        seen <= u64::from(ci) + u64::from(cnt),
        "{seen} completions, index {ci}"
    );
}

/// The content check of one poll of the raw mode: what the receives' buffers must hold
/// after it, worked out from the bytes of the CQEs it consumed alone (rdma-core
/// `handle_responder` and `mlx5_copy_to_recv_wqe`, not the crate's copy), against what
/// they held before it.
///
/// The entries a poll consumed are the slots from the published consumer index before it
/// to the one after. A receive's success maps to the one such entry that names the receive
/// (a responder opcode, format not compressed, its QP and WQE counter); where that is not
/// one entry for one success (the same receive named twice in a poll, or a compressed
/// session of its QP read, whose mini-CQEs carry no data but do complete receives), that
/// receive's entries are taken as they are (their guards are still checked).
struct Expect {
    /// The ring before the poll.
    ring: Vec<u8>,
    from: u32,
    size: usize,
    cnt: u32,
    compressed: bool,
}

/// A slot's 64-byte CQE, from its bytes.
struct Seen<'a> {
    cqe: &'a [u8],
    slot: &'a [u8],
}

impl Seen<'_> {
    fn op_own(&self) -> u8 {
        self.cqe[63]
    }
    /// Bits 3:2 of `op_own`: 0 plain, 1 `INLINE_SCATTER_32`, 2 `INLINE_SCATTER_64`, 3
    /// compressed.
    fn format(&self) -> u8 {
        self.op_own() >> 2 & 3
    }
    fn qpn(&self) -> u32 {
        u32::from_be_bytes([0, self.cqe[57], self.cqe[58], self.cqe[59]])
    }
    fn byte_cnt(&self) -> u32 {
        u32::from_be_bytes([self.cqe[44], self.cqe[45], self.cqe[46], self.cqe[47]])
    }
    /// A responder's completion of receive `i` of `qpn` (RDMA write with immediate, send,
    /// send with immediate, send with invalidate), not a session's title.
    fn names_receive(&self, qpn: u32, i: u32) -> bool {
        let wqe = u16::from_be_bytes([self.cqe[60], self.cqe[61]]);
        (1..=4).contains(&(self.op_own() >> 4))
            && self.format() != 3
            && self.qpn() == qpn
            && u32::from(wqe) % DEPTH == i
    }
}

impl Expect {
    fn before(h: &PollHarness, size: u32, cnt: u32, compressed: bool) -> Expect {
        Expect {
            ring: h.ring().to_vec(),
            from: h.published(),
            size: size as usize,
            cnt,
            compressed,
        }
    }

    /// The entry at absolute slot `k`, as it was before the poll.
    fn seen(&self, k: u32) -> Seen<'_> {
        let slot = &self.ring[(k & (self.cnt - 1)) as usize * self.size..][..self.size];
        Seen {
            cqe: &slot[self.size - 64..],
            slot,
        }
    }

    /// Checks the receives' buffers after the poll that returned `done`; `model` holds
    /// what they held before it, and is brought up to what they must hold now.
    fn after(&self, h: &PollHarness, done: &[Completion], model: &mut [u8]) {
        let to = h.published();
        let span = to.wrapping_sub(self.from) & 0xff_ffff;
        let consumed = || (0..span).map(|d| self.seen(self.from.wrapping_add(d)));
        // A compressed session of `qpn` the poll may have read: a title in the span, or at
        // the index after it (a session read in part keeps the index on its title).
        let session_of = |qpn: u32| {
            self.compressed
                && (0..=span)
                    .map(|d| self.seen(self.from.wrapping_add(d)))
                    .any(|s| s.format() == 3 && s.qpn() == qpn)
        };
        let now = h.recv_bytes();
        for (n, c) in done.iter().enumerate() {
            let won = |d: &Completion| d.status == WcStatus::Success && d.cookie == c.cookie;
            if !won(c) || c.cookie >> 16 & 1 == 0 || done[..n].iter().any(won) {
                // Not a receive's success, or its receive seen already.
                continue;
            }
            let (qpn, i) = (c.qpn, (c.cookie & 0xffff) as u32);
            let entries: Vec<usize> = (0..PollHarness::entries(i as u16))
                .map(|e| PollHarness::entry_offset(qpn, i as u16, e).expect("an entry"))
                .collect();
            let mut named = consumed().filter(|s| s.names_receive(qpn, i));
            let (first, more) = (named.next(), named.next().is_some());
            if more || session_of(qpn) || done.iter().filter(|d| won(d)).count() > 1 {
                // Not one entry for one success: which one copied is not known here.
                for &at in &entries {
                    model[at..at + SCATTER_LEN].copy_from_slice(&now[at..at + SCATTER_LEN]);
                }
                continue;
            }
            let Some(cqe) = first else {
                panic!("a receive's success that no entry the poll consumed names: {c:?}")
            };
            assert_eq!(
                c.byte_len,
                cqe.byte_cnt(),
                "a receive's byte count is not its CQE's: {c:?}"
            );
            let len = c.byte_len as usize;
            // Where the data lies (rdma-core `handle_responder`: `INLINE_SCATTER_32` at the
            // CQE, `INLINE_SCATTER_64` at `cqe - 1`, the 64 bytes before it).
            let data: &[u8] = match cqe.format() {
                0 => &[],
                1 => {
                    assert!(len <= 32, "a success of {len} bytes inline in 32: {c:?}");
                    &cqe.cqe[..len]
                }
                _ => {
                    assert!(
                        self.size == 128 && len <= 64,
                        "a success of {len} bytes inline in 64 on a ring of {}-byte \
                         entries: {c:?}",
                        self.size
                    );
                    &cqe.slot[..len]
                }
            };
            // As rdma-core's `copy_to_scat`: entry after entry; more than the list holds is
            // a local length error, never a success.
            let room = entries.len() * SCATTER_LEN;
            assert!(
                data.len() <= room,
                "a success of {len} bytes into a list of {room}: {c:?}"
            );
            for (&at, part) in entries.iter().zip(data.chunks(SCATTER_LEN)) {
                model[at..at + part.len()].copy_from_slice(part);
            }
        }
        if now != model {
            // Which receive, for the report.
            for (q, &qpn) in QPNS.iter().enumerate() {
                for i in 0..DEPTH as u16 {
                    let list = |b: &[u8]| {
                        (0..PollHarness::entries(i))
                            .filter_map(|e| PollHarness::entry_offset(qpn, i, e))
                            .flat_map(|at| b[at..at + SCATTER_LEN].to_vec())
                            .collect::<Vec<u8>>()
                    };
                    let (is, want) = (list(now), list(model));
                    assert!(
                        is == want,
                        "receive {i} of QP {qpn} (QPNS[{q}]) holds {is:02x?}, not \
                         {want:02x?} (what it held, with the data of its CQE if the poll \
                         reported its success): {done:?}"
                    );
                }
            }
            panic!("a receive's buffers changed outside its entries");
        }
    }
}

/// One completion of a session: its mini-CQE's WQE counter and byte count.
#[derive(Clone, Copy)]
struct Mini {
    wqe: u16,
    bytes: u32,
}

/// The WQE opcode (the byte above the QP number) a requester CQE carries for entry `wqe`
/// of the harness's send queues.
fn wqe_opcode(wqe: u16) -> u8 {
    match u32::from(wqe) % DEPTH % 4 {
        0 => 0x08, // RDMA write
        1 => 0x10, // RDMA read
        2 => 0x0a, // send
        _ => 0x11, // compare and swap
    }
}

fn sessions(r: &mut Input<'_>) {
    let flags = r.u8();
    let size = if flags & 1 == 0 { 64 } else { 128 };
    let cnt = 1u32 << (2 + (flags >> 1) % 4);
    let mut zip = PollHarness::new(cnt, size, true).expect("a valid shape");
    let mut plain = PollHarness::new(cnt, size, false).expect("a valid shape");
    let mut slot = 0u32;
    let (mut got_zip, mut got_plain) = (Vec::new(), Vec::new());
    // No entry of either carries data: the receives' buffers never change.
    let fresh = plain.recv_bytes().to_vec();
    let mut out = [Completion::default(); 7];
    while !r.is_empty() {
        // A batch that fits the ring, then both CQs drained.
        let mut room = cnt;
        while room > 0 && !r.is_empty() {
            let kind = r.u8();
            let opcode = match kind % 5 {
                0 => CqeOpcode::Req,
                1 => CqeOpcode::RespSend,
                2 => CqeOpcode::RespSendImm,
                3 => CqeOpcode::RespWrImm,
                _ => CqeOpcode::RespSendInv,
            };
            // An SRQ never serves a compressing CQ (refused at creation): its QP's sends
            // only.
            let qps = if opcode == CqeOpcode::Req {
                &QPNS[..]
            } else {
                &QPNS[..3]
            };
            let qpn = qps[(kind / 5) as usize % qps.len()];
            let len = if room >= 2 {
                2 + r.below((room - 1).min(24) as usize) as u32
            } else {
                1
            };
            let mut title = Cqe64 {
                sop_drop_qpn: Be32::new(qpn),
                wqe_counter: Be16::new(r.u16()),
                imm_inval_pkey: Be32::new(r.u32()),
                ..Cqe64::default()
            };
            let ud = r.u32();
            title.set_ud_fields(ud & 0xff_ffff, 0, ud >> 31 == 1, 0, 0);
            let minis: Vec<Mini> = (0..len)
                .map(|_| Mini {
                    wqe: r.u16(),
                    bytes: r.u32(),
                })
                .collect();
            // Uncompressed: one CQE per completion.
            for (j, m) in minis.iter().enumerate() {
                let k = slot + j as u32;
                let mut c = title;
                c.byte_cnt = Be32::new(m.bytes);
                if opcode == CqeOpcode::Req {
                    c.wqe_counter = Be16::new(m.wqe);
                    c.sop_drop_qpn = Be32::new(u32::from(wqe_opcode(m.wqe)) << 24 | qpn);
                } else {
                    c.wqe_counter = Be16::new(title.wqe_counter.get().wrapping_add(j as u16));
                }
                c.op_own = op_own(opcode, CqeFormat::Plain, false, owner(k, cnt));
                plain.write(k, as_array(c.as_bytes()));
            }
            if len == 1 {
                // No session of one: the same plain CQE on both.
                let mut c = title;
                c.byte_cnt = Be32::new(minis[0].bytes);
                if opcode == CqeOpcode::Req {
                    c.wqe_counter = Be16::new(minis[0].wqe);
                    c.sop_drop_qpn = Be32::new(u32::from(wqe_opcode(minis[0].wqe)) << 24 | qpn);
                }
                c.op_own = op_own(opcode, CqeFormat::Plain, false, owner(slot, cnt));
                zip.write(slot, as_array(c.as_bytes()));
            } else {
                // Compressed: the title, then the arrays; holes never written.
                for block in 0..len.div_ceil(8) {
                    let mut arr = [MiniCqe8::default(); 8];
                    for (e, m) in arr.iter_mut().zip(&minis[(block * 8) as usize..]) {
                        *e = MiniCqe8 {
                            wqe_counter_or_csum: Be16::new(if opcode == CqeOpcode::Req {
                                m.wqe
                            } else {
                                0
                            }),
                            s_wqe_opcode: if opcode == CqeOpcode::Req {
                                wqe_opcode(m.wqe)
                            } else {
                                0
                            },
                            reserved: 0,
                            byte_cnt: Be32::new(m.bytes),
                        };
                    }
                    zip.write(slot + mini_array_slot(block * 8), as_array(arr.as_bytes()));
                }
                let mut t = title;
                t.byte_cnt = Be32::new(len);
                t.op_own = op_own(opcode, CqeFormat::Compressed, false, owner(slot, cnt));
                zip.write(slot, as_array(t.as_bytes()));
            }
            slot += len;
            room -= len;
        }
        for (h, got) in [(&mut zip, &mut got_zip), (&mut plain, &mut got_plain)] {
            let mut k = 0;
            loop {
                let room = 1 + (k * 3 + got.len()) % 7;
                let n = h.poll(&mut out[..room]);
                got.extend_from_slice(&out[..n]);
                k += 1;
                if n == 0 {
                    break;
                }
            }
            assert_eq!(h.published(), slot, "the consumer index after the batch");
            assert!(
                h.recv_bytes() == fresh.as_slice(),
                "a receive's buffers written without data in a CQE"
            );
        }
        assert_eq!(
            got_zip, got_plain,
            "a compressed session decodes differently"
        );
    }
}

fn as_array(b: &[u8]) -> &[u8; 64] {
    b.try_into().expect("64 bytes")
}
