//! Compressed sessions, read in place (the poller's general path; the fast path never sees
//! them: a title's format bits send it here).
//!
//! Layout (the basic layout of a CQ from `mlx5dv_create_cq` with
//! `MLX5DV_CQ_INIT_ATTR_MASK_COMPRESSED_CQE`, as DPDK's `mlx5_rx_poll_len` reads it): a
//! session of `n` completions takes `n` slots. The title at the consumer index is a CQE of
//! format COMPRESSED whose `byte_cnt` is `n` and whose other fields the completions share
//! (QP number, CQE opcode, immediate, solicited bit, and for receives the first receive
//! counter); mini-CQE `j` sits in the array at slot `mini_array_slot(j)` from the title,
//! entry `j % 8`, and carries the byte count and, for a requester, the WQE counter.
//!
//! Rules kept here (DPDK `mlx5_rx_poll_len`, UCX `uct_ib_mlx5_iface_cqe_unzip`):
//! - the owner bit is that of the title; the array slots have no owner byte (their last
//!   byte is mini-CQE data) and the holes are never written, so after the session every slot
//!   but the title is *invalidated* (opcode INVALID, owner bit of its pass: the device's on
//!   the next pass) before the consumer index moves past them;
//! - the consumer index stays on the title until the whole session is read, then moves by
//!   `n` and is published: publishing a position inside the session would let the device
//!   write the title's and arrays' slots while they are still read;
//! - the queues retire the session's requests after that publication (the CQ accounting
//!   of `cq_share` counts on it), so a session read over several polls gives its entries back
//!   at its end;
//! - a receive's counter is the title's plus `j` (its mini-CQE holds a hash or checksum);
//!   an error is never compressed.
//!
//! Nothing is expanded into a copy: each mini-CQE is read where it lies.

use super::{received, CompletionQueue, Sink, ZipRetire, FORMAT_MASK};
use crate::completion::{Completion, WcOpcode};
use crate::queue::shadow::{SendEntry, Shadow};
use core::sync::atomic::{AtomicU8, Ordering};
use mlx5::cqe::{
    invalidated_op_own, mini_array_slot, Cqe64, CqeOpcode, MiniCqe8, MINI_CQES_PER_BLOCK,
    OWNER_MASK,
};
use mlx5::WcStatus;

impl CompletionQueue {
    /// Reads the session whose title `title` is at the consumer index into `out` from
    /// `n` on, as far as `out` has room; returns the new count. The title must be
    /// software's and read after its owner byte (`CompletionQueue::entry`).
    #[cold]
    #[inline(never)]
    pub(super) fn unzip<S: Sink + ?Sized>(
        &mut self,
        title: &Cqe64,
        out: &mut S,
        mut n: usize,
    ) -> usize {
        let len = title.session_len();
        if !(2..=self.cnt).contains(&len) {
            // No device writes such a title (a session takes at least the title and one
            // array, and fits the ring): one entry, reported, never a success.
            self.advance();
            self.publish_ci();
            let c = Completion {
                qpn: title.qpn(),
                status: WcStatus::GeneralErr,
                ..Completion::default()
            };
            out.put(n, c, S::unstamped());
            return n + 1;
        }
        // Also for a session read in part: its QP may have been dropped meanwhile and its
        // number given to another, whose queue must not receive the rest.
        if !self.tombs.is_empty() && self.buried(title, self.ci, len) {
            self.end_session(len);
            return n;
        }
        let qpn = title.qpn();
        let opcode = title.op_own >> 4;
        let (src_qp, grh) = (title.src_qpn(), title.grh_present());
        let mut j = self.zip_at;
        let mut retire = core::mem::take(&mut self.zip_retire);
        let q = self.find(qpn);
        // A requester session of a known send queue, the usual one (a burst of sends or
        // writes): its own loop, with nothing decided again per mini-CQE.
        if let (true, Some(held)) = (
            opcode == CqeOpcode::Req as u8,
            q.and_then(|q| q.sq.as_ref()),
        ) {
            let sq: &Shadow<SendEntry> = held;
            let mut end = None;
            // The mini-CQE at `j`, found again only at the start of each block of 8.
            let mut at = self.mini(j);
            while j < len && n < out.room() {
                // SAFETY: as below.
                let m = unsafe { &*at };
                let wqe = m.wqe_counter_or_csum.get();
                let e = sq.get(wqe);
                end = Some(wqe.wrapping_add(e.bbs));
                if e.report {
                    let c = Completion {
                        cookie: e.cookie,
                        opcode: e.opcode,
                        // rdma-core `handle_good_req`: a read reports the CQE's byte count.
                        byte_len: if e.opcode == WcOpcode::RdmaRead {
                            m.byte_cnt.get()
                        } else {
                            e.byte_len
                        },
                        qpn,
                        ..Completion::default()
                    };
                    out.put(n, c, S::unstamped());
                    n += 1;
                }
                j += 1;
                at = if j as usize % MINI_CQES_PER_BLOCK == 0 {
                    self.mini(j)
                } else {
                    at.wrapping_add(1)
                };
            }
            if let Some(end) = end {
                match &mut retire {
                    ZipRetire::Send(_, at) => *at = end,
                    r => *r = ZipRetire::Send(held.clone(), end),
                }
            }
            (self.zip_retire, self.zip_at) = (retire, j);
            if j == len {
                self.end_session(len);
            }
            return n;
        }
        while j < len && n < out.room() {
            // SAFETY: the title is software's and `j < len`: the mini-CQE lies in a slot of
            // the session, written before the title's owner byte, which was read first; the
            // consumer index is not published past it before the session ends.
            let m = unsafe { &*self.mini(j) };
            // Each arm writes its completion straight into `out[n]` and says whether it
            // counts (a 40-byte `Option<Completion>` moved around costs more than the fields).
            let counted = if opcode == CqeOpcode::Req as u8 {
                // A requester session of a known send queue took the loop above: this QP has
                // none (no longer known), and its entries report nothing.
                false
            } else if let Some(
                op @ (CqeOpcode::RespSend
                | CqeOpcode::RespSendImm
                | CqeOpcode::RespWrImm
                | CqeOpcode::RespSendInv),
            ) = CqeOpcode::from_bits(opcode)
            {
                match q.and_then(|q| q.rq.as_ref()) {
                    Some(rq) => {
                        let wqe = title.wqe_counter.get().wrapping_add(j as u16);
                        // A mini-CQE carries no data: nothing to copy, the receive is done.
                        if let Some(t) = q.and_then(|q| q.scatter.as_deref()) {
                            t.done(wqe);
                        }
                        match &mut retire {
                            ZipRetire::Recv(_, at) => *at = wqe.wrapping_add(1),
                            r => *r = ZipRetire::Recv(rq.clone(), wqe.wrapping_add(1)),
                        }
                        let mut opcode = WcOpcode::Recv;
                        let imm = q
                            .filter(|_| op != CqeOpcode::RespSend)
                            .map(|q| received(op, title, q, &mut opcode));
                        let c = Completion {
                            cookie: rq.get(wqe),
                            opcode,
                            byte_len: m.byte_cnt.get(),
                            imm,
                            qpn,
                            // UD: a session holds receives from one source only (the
                            // title's).
                            src_qp,
                            grh,
                            ..Completion::default()
                        };
                        out.put(n, c, S::unstamped());
                        true
                    }
                    None => false,
                }
            } else {
                // Errors are never compressed, nor is anything else: report, never drop.
                let c = Completion {
                    qpn,
                    status: WcStatus::GeneralErr,
                    ..Completion::default()
                };
                out.put(n, c, S::unstamped());
                true
            };
            j += 1;
            n += counted as usize;
        }
        (self.zip_retire, self.zip_at) = (retire, j);
        if j == len {
            self.end_session(len);
        }
        n
    }

    /// Mini-CQE `j` of the session whose title is at the consumer index.
    fn mini(&self, j: u32) -> *const MiniCqe8 {
        let slot = (self.ci.wrapping_add(mini_array_slot(j)) & (self.cnt - 1)) as usize;
        let own = self.first.wrapping_add(slot * self.stride);
        own.wrapping_sub(63)
            .wrapping_add((j as usize % MINI_CQES_PER_BLOCK) * 8)
            .cast()
    }

    /// The session of `len` slots at the consumer index is read: invalidates its slots
    /// after the title, moves the consumer index past it, publishes it, then retires.
    fn end_session(&mut self, len: u32) {
        // The slots after the title in ring order, in two runs: up to the end of the ring,
        // then from its start, where the pass, and so the owner bit, changes
        // (`invalidated_op_own` of each slot's index, without computing it per slot).
        let title = (self.ci & (self.cnt - 1)) as usize;
        let before_end = (len as usize - 1).min(self.cnt as usize - 1 - title);
        let op_own = invalidated_op_own(self.ci, self.cnt);
        let runs = [
            (self.own.wrapping_add(self.stride), before_end, op_own),
            (
                self.first,
                len as usize - 1 - before_end,
                op_own ^ OWNER_MASK,
            ),
        ];
        for (from, slots, op_own) in runs {
            for k in 0..slots {
                let own = from.wrapping_add(k * self.stride);
                // SAFETY: the owner byte of a slot of the live ring (`k` slots from `from`,
                // within the run that ends at the ring's end or at the session's); the
                // device writes it again only after the consumer index published below
                // passes it (Release: this store is seen before).
                unsafe { (*(own as *const AtomicU8)).store(op_own, Ordering::Relaxed) };
            }
        }
        self.zip_at = 0;
        self.advance_by(len);
        self.publish_ci();
        core::mem::take(&mut self.zip_retire).apply();
    }
}

/// Whether an `op_own` is a compressed session's title.
#[inline(always)]
pub(super) fn is_title(op_own: u8) -> bool {
    op_own & FORMAT_MASK == FORMAT_MASK
}
