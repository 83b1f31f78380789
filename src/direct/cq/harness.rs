//! The poller over memory the caller writes, as a device would (feature `internals`: the
//! `cqe` fuzz target writes arbitrary CQEs and compressed sessions into it).
//!
//! Four QPs (numbers 1 to 4) are attached, each with a send queue whose every entry is
//! posted and reported; QPs 1 to 3 have a receive queue each and QP 4 takes its receives
//! from an SRQ ([`SRQ_QPN`]), every entry posted, with scatter lists into buffers the
//! harness owns (one or two 16-byte entries per receive, guard bytes around each), so that a CQE
//! with data (scatter-to-CQE) copies into them. A page fault reported for the SRQ gives
//! its slot back (no ring writer: as when the SRQ is being destroyed). [`PollHarness::cookie`] says
//! which cookie each entry carries; [`PollHarness::guards_intact`] whether any copy went
//! outside the lists; [`PollHarness::recv_bytes`] what the buffers hold (the entries a
//! pattern unlike the guards' until a copy lands) and [`PollHarness::ring`] the ring's
//! bytes, so that a caller can tell what a copy should have written.

use super::CompletionQueue;
use crate::completion::{Completion, WcOpcode};
use crate::error::Result;
use crate::queue::registry::Attached;
use crate::queue::scatter::ScatterTable;
use crate::queue::shadow::{SendEntry, Shadow};
use crate::queue::srq_shared::SrqShared;
use core::cell::UnsafeCell;
use mlx5::{RawCq, Sge};
use std::sync::Arc;

/// The QPs attached to the harness's CQ.
pub const QPNS: [u32; 4] = [1, 2, 3, SRQ_QPN];
/// The QP that takes its receives from an SRQ (its cookies as [`PollHarness::cookie`] says,
/// by the SRQ slot).
pub const SRQ_QPN: u32 = 4;
/// Entries of each send and receive queue.
pub const DEPTH: u32 = 64;
/// Bytes of each of a receive's two scatter entries.
pub const SCATTER_LEN: usize = 16;
/// Guard bytes before and after each scatter entry, and their value.
const GUARD: usize = 16;
const GUARD_BYTE: u8 = 0xA5;
/// One receive's buffer: guard, entry, guard, entry, guard.
const RECV_BYTES: usize = 3 * GUARD + 2 * SCATTER_LEN;

/// A CQ poller over a ring, doorbell record and queues owned by this value.
pub struct PollHarness {
    // Dropped first: it points into the fields below.
    cq: CompletionQueue,
    // Written through pointers (the poller's, the harness's, the scatter lists'): cells.
    ring: Box<[UnsafeCell<u64>]>,
    dbrec: Box<[UnsafeCell<u32>; 2]>,
    recv_bufs: Box<[UnsafeCell<u8>]>,
    /// Where the receive buffers start in `recv_bufs` (8-byte aligned).
    pad: usize,
    size: u32,
    cnt: u32,
    _queues: Vec<Attached>,
}

impl PollHarness {
    /// A poller over a ring of `cnt` entries of `size` bytes (64 or 128), compressing when
    /// `compressed`, with the QPs of [`QPNS`] attached.
    ///
    /// # Errors
    /// The poller's refusal of the ring's shape.
    pub fn new(cnt: u32, size: u32, compressed: bool) -> Result<PollHarness> {
        if !cnt.is_power_of_two() || cnt > 4096 || !(size == 64 || size == 128) {
            return Err(crate::Error::InvalidParameter {
                what: "harness CQ shape",
                value: cnt as u64,
            });
        }
        let ring: Box<[UnsafeCell<u64>]> =
            (0..cnt * size / 8).map(|_| UnsafeCell::new(0)).collect();
        let dbrec = Box::new([UnsafeCell::new(0u32), UnsafeCell::new(0)]);
        let raw = RawCq {
            cqn: 7,
            buf: UnsafeCell::raw_get(ring.as_ptr()).cast(),
            cqe_cnt: cnt,
            cqe_size: size,
            dbrec: UnsafeCell::raw_get(dbrec.as_ptr()),
            cq_uar: core::ptr::null_mut(),
        };
        // SAFETY: the ring and record are boxed (they do not move with the harness) and are
        // dropped after the poller (field order); the harness alone polls them, and nothing
        // wrote an entry yet.
        let mut cq = unsafe { CompletionQueue::new(&raw) }?;
        if compressed {
            cq.set_compressed();
        }
        let per_qp = DEPTH as usize * RECV_BYTES;
        // 8 bytes more, so that the buffers can start 8-byte aligned (`pad`), as a receive
        // buffer usually does (the poller's whole-word copies).
        let mut recv_bufs: Box<[UnsafeCell<u8>]> = (0..QPNS.len() * per_qp + 8)
            .map(|_| UnsafeCell::new(GUARD_BYTE))
            .collect();
        let pad = (recv_bufs.as_ptr() as usize).wrapping_neg() % 8;
        // The entries hold a pattern of their own (by receive, entry and byte), not the
        // guards' byte: a copy of the wrong bytes, or of too many, changes it.
        for k in 0..QPNS.len() * DEPTH as usize {
            for e in 0..2 {
                let at = pad + k * RECV_BYTES + GUARD + e * (GUARD + SCATTER_LEN);
                for (j, b) in recv_bufs[at..at + SCATTER_LEN].iter_mut().enumerate() {
                    *b.get_mut() = entry_fill(k, e, j);
                }
            }
        }
        let mut queues = Vec::new();
        for (k, &qpn) in QPNS.iter().enumerate() {
            let sq = Arc::new(Shadow::<SendEntry>::new(DEPTH));
            let rq = Arc::new(Shadow::<u64>::new(DEPTH));
            let srq = (qpn == SRQ_QPN).then(|| Arc::new(SrqShared::new(0x40, DEPTH, 2)));
            let scatter = match &srq {
                Some(_) => None,
                None => Some(Arc::new(ScatterTable::new(DEPTH, 2))),
            };
            for i in 0..DEPTH as u16 {
                // Every kind of report: reads take the CQE's byte count, the rest the
                // shadow's.
                let opcode = match i % 4 {
                    0 => WcOpcode::RdmaWrite,
                    1 => WcOpcode::RdmaRead,
                    2 => WcOpcode::Send,
                    _ => WcOpcode::CompSwap,
                };
                sq.set(
                    i,
                    SendEntry {
                        cookie: Self::cookie(qpn, false, i),
                        byte_len: if opcode == WcOpcode::CompSwap { 8 } else { 0 },
                        bbs: 1,
                        opcode,
                        report: true,
                    },
                );
                rq.set(i, Self::cookie(qpn, true, i));
                if let Some(srq) = &srq {
                    srq.cookies.set(i, Self::cookie(qpn, true, i));
                }
                let at = k * per_qp + i as usize * RECV_BYTES;
                let sge = |off: usize| Sge {
                    addr: recv_bufs[pad + at + off].get() as u64,
                    len: SCATTER_LEN as u32,
                    lkey: 0,
                };
                let two = [sge(GUARD), sge(2 * GUARD + SCATTER_LEN)];
                // Every other receive has one entry (the usual receive: the poller's
                // one-entry copies, `copy_quick` and `copy_done`'s first case), the rest two.
                let sgl = &two[..Self::entries(i)];
                match (&scatter, &srq) {
                    (Some(t), _) => t.record(i, sgl, None),
                    (None, Some(srq)) => srq.scatter.record(i, sgl, None),
                    (None, None) => None,
                };
            }
            if let Some(srq) = &srq {
                srq.cookies.mark_posted(DEPTH as u16);
            }
            let a = Attached {
                qpn,
                sq: Some(sq),
                rq: srq.is_none().then_some(rq),
                scatter,
                srq,
                invalidations: None,
            };
            cq.registry.attach(a.clone());
            queues.push(a);
        }
        Ok(PollHarness {
            cq,
            ring,
            dbrec,
            recv_bufs,
            pad,
            size,
            cnt,
            _queues: queues,
        })
    }

    /// The cookie of entry `i` of QP `qpn`'s receive (`recv`) or send queue.
    pub fn cookie(qpn: u32, recv: bool, i: u16) -> u64 {
        (qpn as u64) << 32 | (recv as u64) << 16 | i as u64
    }

    /// How many scatter entries receive `i` of every QP has ([`SCATTER_LEN`] bytes each):
    /// one for an even `i` (the usual receive), two for an odd one.
    pub fn entries(i: u16) -> usize {
        1 + (i % 2) as usize
    }

    /// Where scatter entry `e` ([`SCATTER_LEN`] bytes) of receive `i` (modulo [`DEPTH`];
    /// for [`SRQ_QPN`], the SRQ's slot) of QP `qpn` starts in
    /// [`PollHarness::recv_bytes`]; None for a QP not in [`QPNS`] or an entry the receive
    /// does not have ([`PollHarness::entries`]).
    pub fn entry_offset(qpn: u32, i: u16, e: usize) -> Option<usize> {
        let k = QPNS.iter().position(|&q| q == qpn)?;
        let i = (u32::from(i) % DEPTH) as usize;
        (e < Self::entries(i as u16))
            .then(|| (k * DEPTH as usize + i) * RECV_BYTES + GUARD + e * (GUARD + SCATTER_LEN))
    }

    /// Every receive's buffer as it is now (guards and entries: receive `i` of `QPNS[k]` at
    /// `(k * DEPTH + i) * RECV_BYTES`, its entries where [`PollHarness::entry_offset`]
    /// says).
    pub fn recv_bytes(&self) -> &[u8] {
        // SAFETY: the poller copies into the buffers only while it polls, which it cannot
        // while the returned borrow of `self` lives (`poll` takes `&mut self`); the cells
        // are bytes, and `pad + QPNS.len() * DEPTH * RECV_BYTES` is at most their count
        // (`new`: 8 more than the receives', `pad` < 8).
        unsafe {
            core::slice::from_raw_parts(
                UnsafeCell::raw_get(self.recv_bufs.as_ptr().add(self.pad)).cast_const(),
                QPNS.len() * DEPTH as usize * RECV_BYTES,
            )
        }
    }

    /// The ring's bytes as they are now: slot `k` (modulo the ring) at `k * size`, its
    /// 64-byte CQE in its last 64 bytes (the first 64 of a 128-byte slot are where
    /// `INLINE_SCATTER_64` data lies). What the caller wrote, and the owner bytes the poller
    /// set at creation and wrote over a compressed session's slots once it was read.
    pub fn ring(&self) -> &[u8] {
        // SAFETY: the poller touches the ring only while it polls, which it cannot while
        // the returned borrow of `self` lives; the cells are whole `u64`s, read as bytes.
        unsafe {
            core::slice::from_raw_parts(
                UnsafeCell::raw_get(self.ring.as_ptr())
                    .cast::<u8>()
                    .cast_const(),
                self.ring.len() * 8,
            )
        }
    }

    /// Writes the 64-byte CQE of slot `slot` (modulo the ring), as the device writes it.
    pub fn write(&mut self, slot: u32, cqe: &[u8; 64]) {
        let at = ((slot & (self.cnt - 1)) * self.size + self.size - 64) as usize;
        self.write_at(at, cqe);
    }

    fn write_at(&mut self, at: usize, bytes: &[u8; 64]) {
        debug_assert!(at + 64 <= self.ring.len() * 8);
        // SAFETY: `at .. at + 64` lies in the ring (a slot's bytes), whose cells the poller
        // reads only while it polls, which it does not now (`&mut self`).
        unsafe {
            core::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                UnsafeCell::raw_get(self.ring.as_ptr()).cast::<u8>().add(at),
                64,
            )
        };
    }

    /// Writes the first 64 bytes of a 128-byte slot (where `INLINE_SCATTER_64` data lies);
    /// nothing on a ring of 64-byte entries.
    pub fn write_front(&mut self, slot: u32, bytes64: &[u8; 64]) {
        if self.size == 128 {
            let at = ((slot & (self.cnt - 1)) * self.size) as usize;
            self.write_at(at, bytes64);
        }
    }

    /// Polls into `out`.
    pub fn poll(&mut self, out: &mut [Completion]) -> usize {
        self.cq.poll(out)
    }

    /// Polls as a timed poll does (`Cq::poll_timed`): at most as many as the shorter slice
    /// holds, each completion's raw CQE timestamp beside it (None for an error CQE's and a
    /// mini-CQE's).
    pub fn poll_timed(&mut self, out: &mut [Completion], times: &mut [Option<u64>]) -> usize {
        let room = out.len().min(times.len());
        self.cq.poll_into(&mut super::Stamped {
            out: &mut out[..room],
            times: &mut times[..room],
        })
    }

    /// The consumer index the poller published (the doorbell record).
    pub fn published(&self) -> u32 {
        // SAFETY: the poller writes the record only while it polls, which it does not now.
        u32::from_be(unsafe { *self.dbrec[mlx5::doorbell::CQ_SET_CI].get() })
    }

    /// Whether every guard byte around the receive buffers is as written.
    pub fn guards_intact(&self) -> bool {
        // SAFETY: the poller copies into the buffers only while it polls, which it does not
        // now; the cells are bytes.
        let b = unsafe {
            core::slice::from_raw_parts(
                UnsafeCell::raw_get(self.recv_bufs.as_ptr()).cast_const(),
                self.recv_bufs.len(),
            )
        };
        let (head, b) = b.split_at(self.pad);
        let b = &b[..b.len() - (8 - self.pad)];
        if head.iter().any(|&x| x != GUARD_BYTE) {
            return false;
        }
        b.chunks(RECV_BYTES).all(|b| {
            let guard = |r: core::ops::Range<usize>| b[r].iter().all(|&x| x == GUARD_BYTE);
            guard(0..GUARD)
                && guard(GUARD + SCATTER_LEN..2 * GUARD + SCATTER_LEN)
                && guard(2 * GUARD + 2 * SCATTER_LEN..RECV_BYTES)
        })
    }
}

/// What byte `j` of scatter entry `e` of the `k`-th receive (over the QPs in order) holds
/// until a copy lands there: never the guards' byte.
fn entry_fill(k: usize, e: usize, j: usize) -> u8 {
    let x = (k * 2 + e) as u8 ^ (j as u8).wrapping_mul(16);
    if x == GUARD_BYTE {
        0x5A
    } else {
        x
    }
}
