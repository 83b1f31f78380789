//! The completion queue of the direct path: owner bit, read barrier, decode, cookie from the
//! shadow table, consumer index.

use super::barrier;
use crate::completion::{Completion, WcOpcode};
use crate::error::{Error, Result};
use crate::queue::cq_share::RingView;
use crate::queue::registry::{Attached, Registry};
use crate::queue::retire::Retire;
use crate::queue::scatter::ScatterTable;
use crate::queue::shadow::{SendEntry, Shadow};
use crate::queue::srq_shared::SrqShared;
use crate::queue::teardown::Tombstone;
use core::cell::Cell;
use core::sync::atomic::{AtomicU32, AtomicU8, Ordering};
use mlx5::cqe::{cqe64_offset, op_own, sw_owner, Cqe64, CqeFormat, CqeOpcode, OWNER_MASK};
use mlx5::doorbell::CQ_SET_CI;
use mlx5::{RawCq, WcStatus};
use std::sync::Arc;

#[cfg(feature = "internals")]
pub mod harness;
mod sink;
mod unzip;

pub(crate) use sink::{Sink, Stamped};

/// A completion queue on the direct path.
///
/// The poller keeps a pointer to the owner byte of the entry at the consumer index and the
/// owner-bit value that means "software's" on the current pass, so the empty poll is one load
/// and one compare. This works because the constructor sets the owner bit of every entry
/// (as UCX does): an entry the device has not written yet then looks like the device's on the
/// first pass, and the INVALID opcode need not be checked on the hot path.
pub struct CompletionQueue {
    /// The owner byte (`op_own`) of the CQE at the consumer index.
    own: *const u8,
    /// The owner bit that marks an entry as software's on this pass over the ring.
    sw_owner: u8,
    /// The QP whose send completion came last and its shadow table (an `Arc` held by
    /// `cache`): one compare instead of a search when a CQ serves one QP's sends.
    last_qpn: u32,
    last_sq: *const Shadow<SendEntry>,
    /// The QP whose receive (a plain send) completed last through the general path, its
    /// receive queue's cookies and scatter lists (`Arc`s held by `cache`): the fast path's
    /// receive.
    last_rqpn: u32,
    last_rq: *const Shadow<u64>,
    last_scatter: *const ScatterTable,
    /// Consumer index (counts every entry consumed).
    ci: u32,
    /// The owner bytes of the first entry and one past the last entry.
    first: *const u8,
    end: *const u8,
    stride: usize,
    dbrec: *mut u32,
    cnt: u32,
    cqn: u32,
    pub(crate) registry: Arc<Registry>,
    cache: Vec<Attached>,
    /// Destroyed QPs whose entries may still come (`super::teardown`).
    tombs: Vec<Arc<Tombstone>>,
    /// Whether the device may write compressed sessions (created so).
    compressed: bool,
    /// `compressed` or tombstones live: the general path's one test before the rare cases
    /// of an entry (a session's title, a destroyed QP's entry), so that a CQ with neither
    /// pays one branch for both.
    rare: bool,
    /// The registry generation `cache` and `tombs` belong to.
    gen: u32,
    /// What the fast path compares the registry's generation with: `gen`, or a value it
    /// never equals while tombstones are live, so that every poll takes the general path
    /// (which checks them) until the consumer index has passed them all.
    fast_gen: u32,
    /// The retirement of the entry being completed on the general path, made once the
    /// consumer index is published.
    later: Cell<Retire>,
    /// The compressed session whose title is at the consumer index (`super::unzip`): the
    /// next mini-CQE to read (0: none read yet).
    zip_at: u32,
    /// The retirement of the mini-CQEs read so far, made once the whole session is
    /// consumed and the consumer index published past it.
    zip_retire: ZipRetire,
}

/// A session's retirement. It may wait over several polls, between which the queue list
/// may change: it holds the queue.
#[derive(Default)]
pub(super) enum ZipRetire {
    #[default]
    Nothing,
    Send(Arc<Shadow<SendEntry>>, u16),
    Recv(Arc<Shadow<u64>>, u16),
}

impl ZipRetire {
    fn apply(self) {
        match self {
            ZipRetire::Nothing => {}
            ZipRetire::Send(q, end) => q.retire(end),
            ZipRetire::Recv(q, end) => q.retire(end),
        }
    }
}

/// What the constructor writes into every owner byte: opcode INVALID, owner bit set.
const fn op_own_initial() -> u8 {
    op_own(CqeOpcode::Invalid, CqeFormat::Plain, false, true)
}

/// The format bits (3:2) of `op_own`.
pub(super) const FORMAT_MASK: u8 = 0b1100;

/// The solicited-event bit (1) of `op_own`, beside the owner bit (0).
const SE_BIT: u8 = 0b10;

/// No QP has this number (they have 24 bits).
const NO_QPN: u32 = u32::MAX;

// SAFETY: the pointers are to the CQ's ring and record, which this poller alone reads and
// updates (constructor contract), and to shadow tables kept alive by `cache`.
unsafe impl Send for CompletionQueue {}

impl core::fmt::Debug for CompletionQueue {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("CompletionQueue")
            .field("cqn", &self.cqn)
            .field("entries", &self.cnt)
            .field("ci", &self.ci)
            .finish()
    }
}

impl CompletionQueue {
    /// A poller over the ring of `raw`. Sets the owner bit of every entry (see the type's
    /// documentation).
    ///
    /// # Safety
    /// `raw` must describe a live CQ (ring of `cqe_cnt` entries of `cqe_size` bytes, doorbell
    /// record) that stays alive while the poller exists and that nobody else polls. The device
    /// must not have written any entry yet (no QP uses the CQ before this call).
    pub unsafe fn new(raw: &RawCq) -> Result<CompletionQueue> {
        if !raw.cqe_cnt.is_power_of_two() || !(raw.cqe_size == 64 || raw.cqe_size == 128) {
            return Err(Error::InvalidParameter {
                what: "CQ size",
                value: raw.cqe_cnt as u64,
            });
        }
        let stride = raw.cqe_size as usize;
        let first = raw.buf.wrapping_add(cqe64_offset(stride) + 63);
        for i in 0..raw.cqe_cnt as usize {
            // SAFETY: entry i's owner byte lies inside the live ring (caller contract); the
            // device writes no entry before a QP uses the CQ, so nothing races this store.
            unsafe { first.add(i * stride).write(op_own_initial()) };
        }
        let view = |cnt| RingView {
            first_own: first,
            stride,
            cnt,
            dbrec: raw.dbrec,
        };
        let registry = Arc::new(Registry::new(raw.cqn, raw.cqe_cnt, Some(view(raw.cqe_cnt))));
        Ok(CompletionQueue {
            own: first,
            sw_owner: 0,
            last_qpn: NO_QPN,
            last_sq: core::ptr::null(),
            last_rqpn: NO_QPN,
            last_rq: core::ptr::null(),
            last_scatter: core::ptr::null(),
            ci: 0,
            first,
            end: first.wrapping_add(raw.cqe_cnt as usize * stride),
            stride,
            dbrec: raw.dbrec,
            cnt: raw.cqe_cnt,
            cqn: raw.cqn,
            registry,
            cache: Vec::new(),
            tombs: Vec::new(),
            compressed: false,
            rare: false,
            gen: u32::MAX,
            fast_gen: u32::MAX,
            later: Cell::new(Retire::Nothing),
            zip_at: 0,
            zip_retire: ZipRetire::Nothing,
        })
    }

    /// Tells the poller that the device may write compressed sessions (a CQ created so),
    /// before any QP uses the CQ. Without it a session's title is reported as an error.
    pub(crate) fn set_compressed(&mut self) {
        self.compressed = true;
        self.rare = true;
    }

    /// Whether the device may write compressed sessions.
    pub(crate) fn is_compressed(&self) -> bool {
        self.compressed
    }

    /// Shares out only `capacity` entries among the queues (a device that guarantees fewer
    /// than its ring holds, as rdma-core reports `ncqe - 1`). Before any QP uses the CQ.
    pub(crate) fn guarantee(&mut self, capacity: u32) {
        let view = RingView {
            first_own: self.first,
            stride: self.stride,
            cnt: self.cnt,
            dbrec: self.dbrec,
        };
        self.registry = Arc::new(Registry::new(self.cqn, capacity.min(self.cnt), Some(view)));
    }

    /// The CQ number.
    pub fn cqn(&self) -> u32 {
        self.cqn
    }

    /// Entries in the ring.
    pub fn capacity(&self) -> u32 {
        self.cnt
    }

    /// The consumer index: entries consumed so far (the arm request carries it).
    #[cold]
    pub(crate) fn consumer_index(&self) -> u32 {
        self.ci
    }

    /// The CQ's doorbell record.
    #[cold]
    pub(crate) fn dbrec(&self) -> *mut u32 {
        self.dbrec
    }

    #[cold]
    fn refresh(&mut self) {
        if let Some((list, gen)) = self.registry.snapshot_if_changed(self.gen) {
            (self.cache, self.gen) = (list, gen);
            // After the list (see `Registry::bury`).
            self.tombs = self.registry.tombstones();
            self.rare = self.compressed || !self.tombs.is_empty();
            self.fast_gen = if self.tombs.is_empty() {
                gen
            } else {
                gen ^ 0x8000_0000
            };
            // `last_sq` and `last_rq` pointed into the old list.
            (self.last_qpn, self.last_sq) = (NO_QPN, core::ptr::null());
            self.last_rqpn = NO_QPN;
            // The old list's scatter tables may have been the last holders of pins on
            // regions whose domain went.
            crate::queue::lifetime::sweep_held();
        }
    }

    #[inline(always)]
    fn find(&self, qpn: u32) -> Option<&Attached> {
        self.cache.iter().find(|a| a.qpn == qpn)
    }

    /// The send shadow table of QP `qpn`, remembered for the next completion.
    #[cold]
    fn find_sq(&mut self, qpn: u32) -> Option<*const Shadow<SendEntry>> {
        let sq: *const Shadow<SendEntry> = &**self.find(qpn)?.sq.as_ref()?;
        // Not while an older QP of this number may still have entries: those must meet the
        // tombstone on the general path, never the fast path.
        if !self.tombs.iter().any(|t| t.qpn == qpn) {
            (self.last_qpn, self.last_sq) = (qpn, sq);
        }
        Some(sq)
    }

    /// Remembers QP `qpn`'s receive queue (its cookies `rq` and scatter lists `t`, held by
    /// `cache`) for the fast path, unless an older QP of its number may still have entries.
    #[cold]
    #[inline(never)]
    fn note_rq(&mut self, qpn: u32, rq: *const Shadow<u64>, t: *const ScatterTable) {
        if !self.tombs.iter().any(|t| t.qpn == qpn) {
            (self.last_rqpn, self.last_rq, self.last_scatter) = (qpn, rq, t);
        }
    }

    /// Whether the entry at consumer index `ci`, which takes `span` slots (a compressed
    /// session's length, else 1), belongs to a destroyed QP (discarded); drops the
    /// tombstones the consumer index has passed.
    #[cold]
    #[inline(never)]
    pub(super) fn buried(&mut self, cqe: &Cqe64, ci: u32, span: u32) -> bool {
        let qpn = cqe.qpn();
        let hit = self
            .tombs
            .iter()
            .any(|t| t.qpn == qpn && t.covers(ci & 0xff_ffff));
        let next = ci.wrapping_add(span);
        let before = self.tombs.len();
        self.tombs.retain(|t| t.still_ahead(next));
        if self.tombs.len() != before {
            // A tombstone let go may have held the last pins on a region whose domain went.
            crate::queue::lifetime::sweep_held();
        }
        self.rare = self.compressed || !self.tombs.is_empty();
        if self.tombs.is_empty() {
            // The fast path again.
            self.fast_gen = self.gen;
        }
        hit
    }

    /// The SRQ WQE of a receive entry (at the consumer index) that a tombstone covers: it
    /// goes back to its SRQ when the entry is discarded.
    #[cold]
    fn srq_wqe_of_buried(&self, cqe: &Cqe64) -> Option<(Arc<SrqShared>, u16)> {
        let qpn = cqe.qpn();
        let t = self
            .tombs
            .iter()
            .find(|t| t.qpn == qpn && t.covers(self.ci & 0xff_ffff))?;
        let srq = t.srq.as_ref()?;
        let wqe = match CqeOpcode::from_bits(cqe.op_own >> 4)? {
            CqeOpcode::RespSend
            | CqeOpcode::RespSendImm
            | CqeOpcode::RespWrImm
            | CqeOpcode::RespSendInv => cqe.wqe_counter.get(),
            CqeOpcode::RespErr => cqe.as_err().wqe_counter.get(),
            _ => return None,
        };
        Some((srq.clone(), srq.slot(wqe)))
    }

    /// The owner byte of the entry at the consumer index.
    #[inline(always)]
    fn op_own(&self) -> u8 {
        // SAFETY: `own` is the owner byte of an entry inside the live ring (constructor
        // contract); it is read atomically because the device writes it concurrently.
        unsafe { (*(self.own as *const AtomicU8)).load(Ordering::Acquire) }
    }

    /// Whether an entry with this owner byte, at the consumer index, is software's.
    #[inline(always)]
    fn is_mine(&self, op_own: u8) -> bool {
        (op_own ^ self.sw_owner) & OWNER_MASK == 0
    }

    /// Polls up to `out.len()` completions into `out`; returns how many. Never blocks.
    ///
    /// The empty case is a handful of instructions inlined at the call site: one load of the
    /// next entry's owner byte.
    #[inline(always)]
    pub fn poll(&mut self, out: &mut [Completion]) -> usize {
        self.poll_into(out)
    }

    /// [`CompletionQueue::poll`] into any [`Sink`] (a timed poll's keeps the CQEs'
    /// timestamps too).
    #[inline(always)]
    pub(crate) fn poll_into<S: Sink + ?Sized>(&mut self, out: &mut S) -> usize {
        if !self.is_mine(self.op_own()) || out.room() == 0 {
            return 0;
        }
        #[cfg(test)]
        if FORCE_GENERAL.with(|f| f.get()) {
            return self.poll_general(out, 0);
        }
        self.poll_some(out)
    }

    /// The rest of [`CompletionQueue::poll`], once an entry is there: a send completion of
    /// the QP seen last, straight through, and more of them in a row in
    /// [`CompletionQueue::poll_burst`]; anything else goes to
    /// [`CompletionQueue::poll_recv`], and from there what is not its receive to
    /// [`CompletionQueue::poll_general`] (tail calls, so this function needs no stack
    /// frame).
    #[inline(never)]
    fn poll_some<S: Sink + ?Sized>(&mut self, out: &mut S) -> usize {
        // SAFETY: the entry at the consumer index is software's (checked by `poll`); it is
        // read before `publish_ci` (here or in `poll_general`).
        let cqe = unsafe { self.entry() };
        // Not a plain requester entry: first, before this function saves a register.
        if cqe.op_own >> 2 != (CqeOpcode::Req as u8) << 2 {
            return self.poll_recv(out);
        }
        if self.registry.gen.load(Ordering::Acquire) != self.fast_gen {
            return self.poll_general(out, 0);
        }
        // The QP seen last, and not a read or an atomic (`READ_ATOMIC_QPN_MASK`).
        let qpn = cqe.sop_drop_qpn.get() & READ_ATOMIC_QPN_MASK;
        if qpn != self.last_qpn {
            return self.poll_general(out, 0);
        }
        // SAFETY: `last_sq` points into an `Arc` held by `cache`, which is replaced only by
        // `refresh`, which resets `last_qpn`.
        let sq = unsafe { &*self.last_sq };
        let mut n = 0;
        let end = self.take_send(sq, cqe, qpn, out, &mut n);
        self.advance();
        if n < out.room() && self.is_mine(self.op_own()) {
            return self.poll_burst(out, n, end);
        }
        // The device learns that the entry is consumed before the queue may reuse what it
        // held (CQ accounting, `cq_share`).
        self.publish_ci();
        // `last_sq` read again, and volatile so that the compiler does not keep `sq` in a
        // register from the top: one load instead of a saved register's push and pop (the
        // completion's fields take every other register; icount poll hit 64.1 -> 63.1).
        // SAFETY: as above (`last_sq` has not changed since).
        unsafe { &*core::ptr::read_volatile(&self.last_sq) }.retire(end);
        n
    }

    /// [`CompletionQueue::poll_some`] for an entry that is not a send completion of the QP
    /// seen last: a receive of the QP whose receive completed last (a plain send, not a
    /// compressed session) gets what the general path does for it (`complete_other`)
    /// without the search; anything else, and the entries after it, go to
    /// [`CompletionQueue::poll_general`].
    ///
    /// The usual small receive (its data at the start of the CQE, copied in whole words)
    /// is finished here; any other receive of that QP goes on in
    /// [`CompletionQueue::poll_recv_other`]. Every call left here is a tail call, so no
    /// value is kept across one and the path needs few registers of its own to save
    /// (with the other receives' status computed here, it saved six).
    #[inline(never)]
    fn poll_recv<S: Sink + ?Sized>(&mut self, out: &mut S) -> usize {
        // SAFETY: the entry at the consumer index is software's (checked by `poll`); it is
        // read before `publish_ci` (here or in `poll_general`).
        let cqe = unsafe { self.entry() };
        // The queue list may have changed (a QP destroyed, its number given to a new QP):
        // `last_rqpn` would name the old one; the general path refreshes first.
        if self.registry.gen.load(Ordering::Acquire) != self.fast_gen {
            return self.poll_general(out, 0);
        }
        // Opcode RESP_SEND and a format other than compressed (3), in one compare: the
        // opcode and format bits, less RESP_SEND's with format 0, are at most format 2's.
        let kind =
            (cqe.op_own & !(SE_BIT | OWNER_MASK)).wrapping_sub((CqeOpcode::RespSend as u8) << 4);
        let qpn = cqe.qpn();
        if kind > (CqeFormat::InlineScatter64 as u8) << 2 || qpn != self.last_rqpn {
            return self.poll_general(out, 0);
        }
        // SAFETY: `last_scatter` points into an `Arc` held by `cache`, which is replaced
        // only by `refresh`, which resets `last_rqpn`.
        let t = unsafe { &*self.last_scatter };
        let wqe = cqe.wqe_counter.get();
        let byte_len = cqe.byte_cnt.get();
        // The usual small receive: data at the start of the CQE, copied in whole words into
        // the receive's one entry, then the receive's pins go.
        if kind == (CqeFormat::InlineScatter32 as u8) << 2
            // SAFETY: the poller, after the receive's CQE and before retiring it (its entry
            // is software's until `publish_ci` in `recv_done`); the first `QUICK_MAX` of the
            // CQE's 64 bytes are readable; the CQ ring never overlaps registered receive
            // buffers.
            && unsafe { t.copy_quick(wqe, cqe as *const Cqe64 as *const u8, byte_len) }
        {
            return self.recv_done(out, cqe, qpn, WcStatus::Success);
        }
        self.poll_recv_other(out)
    }

    /// [`CompletionQueue::poll_recv`] for a receive of the QP whose receive completed last
    /// that is not the usual small copy (the caller checked the queue list, the QP and the
    /// format): its data in the buffers (format plain: the pins go) or elsewhere in the CQE
    /// ([`Self::scatter_from_cqe`]).
    #[inline(never)]
    fn poll_recv_other<S: Sink + ?Sized>(&mut self, out: &mut S) -> usize {
        // SAFETY: as in `poll_recv`, which found this entry software's and has not
        // consumed it.
        let cqe = unsafe { self.entry() };
        // SAFETY: as in `poll_recv` (`last_rqpn` has not changed since its check).
        let t = unsafe { &*self.last_scatter };
        let (wqe, byte_len) = (cqe.wqe_counter.get(), cqe.byte_cnt.get());
        let status = if cqe.op_own & FORMAT_MASK != 0 {
            self.scatter_from_cqe(cqe, t, wqe, byte_len)
        } else {
            t.done(wqe);
            WcStatus::Success
        };
        self.recv_done(out, cqe, cqe.qpn(), status)
    }

    /// The end of a receive of the QP whose receive completed last, its data in place and
    /// its pins given back: its completion into `out[0]`, the entry consumed, the receive
    /// retired; then the entries after it, if any, in [`CompletionQueue::poll_general`].
    #[inline(always)]
    fn recv_done<S: Sink + ?Sized>(
        &mut self,
        out: &mut S,
        cqe: &Cqe64,
        qpn: u32,
        status: WcStatus,
    ) -> usize {
        // SAFETY: `last_rq` points into an `Arc` held by `cache`, which is replaced only by
        // `refresh`, which resets `last_rqpn` (checked by the caller).
        let rq = unsafe { &*self.last_rq };
        let (wqe, byte_len) = (cqe.wqe_counter.get(), cqe.byte_cnt.get());
        let (src_qp, grh) = cqe.sender();
        out.put(
            0,
            Completion {
                cookie: rq.get(wqe),
                opcode: WcOpcode::Recv,
                byte_len,
                qpn,
                status,
                // UD: the sender's QP and the GRH bit (not where the message fills the
                // CQE's first 32 bytes).
                src_qp,
                grh,
                ..Completion::default()
            },
            S::stamp(cqe),
        );
        self.advance();
        // The device learns that the entry is consumed before the queue may reuse what it
        // held (CQ accounting, `cq_share`).
        self.publish_ci();
        rq.retire(wqe.wrapping_add(1));
        if out.room() > 1 && self.is_mine(self.op_own()) {
            return self.poll_general(out, 1);
        }
        1
    }

    /// [`CompletionQueue::poll_some`] once a send completion of the QP seen last is in
    /// `out[..n]` (its queue done up to `end`, not retired yet) and another entry is there:
    /// more of the same in a row, then one consumer-index store and one retirement for all
    /// (the last covers the ones before it: one send queue, completing in order); anything
    /// else goes on in [`CompletionQueue::poll_general`].
    #[inline(never)]
    fn poll_burst<S: Sink + ?Sized>(&mut self, out: &mut S, mut n: usize, mut end: u16) -> usize {
        // SAFETY: as in `poll_some`: `last_qpn` and `last_sq` do not change here.
        let sq = unsafe { &*self.last_sq };
        // The registry's generation, held in a register for the loop: the registry is an
        // `Arc` this poller holds, not replaced here.
        let gen: *const AtomicU32 = &self.registry.gen;
        let fast_gen = self.fast_gen;
        let mut other = false;
        while n < out.room() {
            // One load of the owner byte for two questions, as in `poll_into`: software's,
            // and a plain requester entry (every bit but the solicited-event bit zero).
            let x = self.op_own() ^ self.sw_owner;
            if x & !SE_BIT != 0 {
                // Software's but another kind: the general path; else the ring is empty.
                other = x & OWNER_MASK == 0;
                break;
            }
            // The queue list may have changed since the poll began (a QP destroyed, its
            // number given to a new QP whose entry this may be): loaded after the entry's
            // owner byte, the generation says so, and the general path refreshes first.
            // SAFETY: `gen` points into `self.registry` (above), alive for the whole call.
            if unsafe { (*gen).load(Ordering::Acquire) } != fast_gen {
                other = true;
                break;
            }
            // SAFETY: the entry at the consumer index is software's (just checked); it is
            // read before `publish_ci`.
            let cqe = unsafe { self.entry() };
            // The QP seen last, and not a read or an atomic (`READ_ATOMIC_QPN_MASK`).
            let qpn = cqe.sop_drop_qpn.get() & READ_ATOMIC_QPN_MASK;
            if qpn != self.last_qpn {
                other = true;
                break;
            }
            end = self.take_send(sq, cqe, qpn, out, &mut n);
            self.advance();
        }
        self.publish_ci();
        sq.retire(end);
        if other {
            return self.poll_general(out, n);
        }
        n
    }

    /// The completion of the send WQE `cqe` names (into `out[*n]` if it reports one);
    /// returns the position the send queue is done up to once the entry is consumed.
    #[inline(always)]
    fn take_send<S: Sink + ?Sized>(
        &self,
        sq: &Shadow<SendEntry>,
        cqe: &Cqe64,
        qpn: u32,
        out: &mut S,
        n: &mut usize,
    ) -> u16 {
        let wqe = cqe.wqe_counter.get();
        // SAFETY: the poller reads the entry of a WQE whose completion it holds; retired
        // (a release store) only after it was read: the poster may reuse it from then on.
        let e = unsafe { sq.entry(wqe) };
        if e.report {
            out.put_send(*n, e, qpn, S::stamp(cqe));
            *n += 1;
        }
        wqe.wrapping_add(e.bbs)
    }

    /// Every kind of entry, from the one at the consumer index (which is software's) on;
    /// `n` completions are already in `out`.
    #[inline(never)]
    fn poll_general<S: Sink + ?Sized>(&mut self, out: &mut S, mut n: usize) -> usize {
        // Entries of dropped QPs: free again once the ring is seen empty after this read.
        let orphans = self.registry.slots.orphan_mark();
        while n < out.room() {
            if !self.is_mine(self.op_own()) {
                if orphans != 0 {
                    self.registry.slots.drained(orphans);
                }
                break;
            }
            // An entry seen after the queue list changed (loaded after its owner byte) may
            // be a new QP's: the list and the tombstones are read again first. The previous
            // entry's retirement is made, so nothing points into the old list.
            if self.registry.gen.load(Ordering::Acquire) != self.gen {
                self.refresh();
            }
            // SAFETY: just checked; not used after `publish_ci` below.
            let cqe = unsafe { self.entry() };
            if self.rare {
                if unzip::is_title(cqe.op_own) {
                    n = self.unzip(cqe, out, n);
                    continue;
                }
                if !self.tombs.is_empty() {
                    let give_back = self.srq_wqe_of_buried(cqe);
                    let fault = is_page_fault(cqe);
                    if self.buried(cqe, self.ci, 1) {
                        self.advance();
                        self.publish_ci();
                        // The QP is gone, the SRQ is not: a receive the device faulted
                        // on (and so never used) goes back to the SRQ's ring.
                        match give_back {
                            Some((srq, idx)) if fault => srq.page_fault(idx),
                            Some((srq, idx)) => srq.free(idx),
                            None => {}
                        }
                        continue;
                    }
                }
            }
            // Read while the entry is software's (nothing for a plain poll): before
            // `complete`, which for an SRQ page fault hands the entry back to the device
            // (its consumer index published) before it returns (a review's note: the stamp
            // was read after, from an entry the device may be writing).
            let stamp = S::stamp(cqe);
            self.advance();
            let c = self.complete(cqe, cqe.op_own >> 4);
            // The device learns that the entry is consumed before the queue may reuse what
            // it held (CQ accounting, `cq_share`): the retirement comes after.
            self.publish_ci();
            // SAFETY: the queue it names is held by `cache`, not replaced since.
            unsafe { self.later.take().apply() };
            if let Some(c) = c {
                out.put(n, c, stamp);
                n += 1;
            }
        }
        // Every caller leaves an entry and room for it: the loop ran and published.
        n
    }

    /// The entry at the consumer index, its owner byte read before the rest of it. The
    /// reference is not tied to `self` so that the consumer index can move on while it is
    /// read.
    ///
    /// # Safety
    /// The entry must be software's ([`CompletionQueue::is_mine`]), and the reference must
    /// not be used after the next [`CompletionQueue::publish_ci`] (the device may then
    /// write the entry again).
    #[inline(always)]
    unsafe fn entry<'a>(&self) -> &'a Cqe64 {
        barrier::from_device();
        // SAFETY: the entry is software's (caller contract): the device does not write it
        // again until the consumer index passes it and the doorbell record says so, so a
        // shared view is sound until then (the poller never keeps it longer); Cqe64 has
        // alignment 1 and the entry's 64 bytes end at its owner byte.
        unsafe { &*(self.own.wrapping_sub(63) as *const Cqe64) }
    }

    /// Tells the device how far the ring is consumed.
    #[inline(always)]
    fn publish_ci(&self) {
        // SAFETY: `dbrec` is the CQ's live aligned record (constructor contract).
        unsafe {
            (*(self.dbrec.add(CQ_SET_CI) as *const AtomicU32))
                .store((self.ci & 0xff_ffff).to_be(), Ordering::Release)
        };
    }

    /// Moves the consumer index `k` entries on (past a compressed session).
    pub(super) fn advance_by(&mut self, k: u32) {
        self.ci = self.ci.wrapping_add(k);
        let i = (self.ci & (self.cnt - 1)) as usize;
        self.own = self.first.wrapping_add(i * self.stride);
        self.sw_owner = sw_owner(self.ci, self.cnt);
    }

    /// Moves to the next entry, flipping the expected owner bit at the end of the ring.
    #[inline(always)]
    fn advance(&mut self) {
        self.ci = self.ci.wrapping_add(1);
        self.own = self.own.wrapping_add(self.stride);
        if self.own == self.end {
            self.own = self.first;
            self.sw_owner ^= OWNER_MASK;
        }
    }

    /// Turns one CQE into a completion (None: a moderation CQE the user did not ask for).
    #[inline(never)]
    fn complete(&mut self, cqe: &Cqe64, opcode: u8) -> Option<Completion> {
        let qpn = cqe.qpn();
        let wqe = cqe.wqe_counter.get();
        if opcode == CqeOpcode::Req as u8 {
            let sq = if qpn == self.last_qpn {
                self.last_sq
            } else {
                self.find_sq(qpn)?
            };
            // SAFETY: `last_sq` (and what `find_sq` returns) points into an `Arc` held by
            // `cache`, which is replaced only by `refresh`, which resets it.
            let sq = unsafe { &*sq };
            let e = sq.get(wqe);
            self.later.set(Retire::Send(sq, wqe.wrapping_add(e.bbs)));
            let status = match cqe.format() {
                CqeFormat::Plain => WcStatus::Success,
                // The result of a read or atomic inside the CQE (requester scatter-to-CQE):
                // the device enables it only for QPs created with
                // MLX5DV_QP_CREATE_ALLOW_SCATTER_TO_CQE or sq_sig_all, which blueflame
                // never creates. Its bytes are not in the local buffer: never a success.
                _ => WcStatus::GeneralErr,
            };
            if !e.report && status == WcStatus::Success {
                return None;
            }
            return Some(Completion {
                cookie: e.cookie,
                opcode: e.opcode,
                byte_len: req_byte_len(e.opcode, e.byte_len, cqe),
                qpn,
                status,
                ..Completion::default()
            });
        }
        let q = self.find(qpn);
        // A QP's own receive queue with scatter lists (not an SRQ's): for the fast path.
        let rq = q
            .filter(|_| opcode == CqeOpcode::RespSend as u8 && qpn != self.last_rqpn)
            .and_then(|a| {
                Some((
                    &**a.rq.as_ref()? as *const _,
                    &**a.scatter.as_ref()? as *const _,
                ))
            });
        let c = self.complete_other(cqe, opcode, q, qpn, wqe);
        if let Some((rq, t)) = rq {
            self.note_rq(qpn, rq, t);
        }
        c
    }

    /// Copies the data a receive CQE carries (scatter-to-CQE) into the receive's buffers,
    /// then gives the receive's pins back (`ScatterTable::done`, whatever the outcome);
    /// returns the receive's status. rdma-core `handle_responder` /
    /// `mlx5_copy_to_recv_wqe`: format INLINE_SCATTER_32 has the data at the start of the
    /// 64-byte CQE, INLINE_SCATTER_64 in the 64 bytes before it (128-byte CQEs only).
    #[inline(never)]
    fn scatter_from_cqe(&self, cqe: &Cqe64, table: &ScatterTable, wqe: u16, len: u32) -> WcStatus {
        let data = if let Some(data) = data_at_start(cqe, len) {
            data
        } else if cqe.op_own & FORMAT_MASK == (CqeFormat::InlineScatter64 as u8) << 2
            && self.stride == 128
            && len <= 64
        {
            // SAFETY: the entry is software's (the poller holds it until `publish_ci`), and
            // the `len` bytes in the 64 before its 64-byte CQE lie inside its 128-byte slot;
            // they were written before the owner byte, read after it (barrier in `entry`).
            unsafe {
                core::slice::from_raw_parts(
                    (cqe as *const Cqe64 as *const u8).wrapping_sub(64),
                    len as usize,
                )
            }
        } else {
            table.done(wqe);
            return WcStatus::GeneralErr;
        };
        // SAFETY: the poller, after the receive's CQE and before retiring it; the CQ ring
        // never overlaps registered receive buffers.
        unsafe { table.copy_done(wqe, data) }
    }

    /// A receive completion (or a receive error) of a QP that takes its receives
    /// from an SRQ: the cookie by the CQE's WQE index (rdma-core `cq.c`:
    /// `srq->wrid[wqe_counter]`), data that came inside the CQE copied into that WQE's
    /// buffers (`mlx5_copy_to_recv_srq`), and the WQE given back to the SRQ once the
    /// consumer index is published (`mlx5_free_srq_wqe`). The QP is found by the CQE's QP
    /// number, which every CQE version carries (with CQE version 1 `srqn_uidx` holds the
    /// QP's user index, not the SRQ number: rdma-core `get_resp_ctx_v1`).
    #[cold]
    #[inline(never)]
    fn complete_srq(&self, cqe: &Cqe64, q: &Attached) -> Option<Completion> {
        let op = match CqeOpcode::from_bits(cqe.op_own >> 4)? {
            CqeOpcode::RespErr => None,
            op => Some(op),
        };
        let (qpn, wqe) = match op {
            Some(_) => (cqe.qpn(), cqe.wqe_counter.get()),
            None => {
                let e = cqe.as_err();
                (e.qpn(), e.wqe_counter.get())
            }
        };
        let srq = q.srq.as_ref()?;
        let idx = srq.slot(wqe);
        if is_page_fault(cqe) {
            // No completion of the user's: the WQE goes back to the head of the SRQ once
            // the consumer index is published past the fault (rdma-core `cq.c`
            // `is_odp_pfault_err`, then `mlx5_complete_odp_fault`). The index is past it
            // already (`advance` came first); the caller publishes it again, the same.
            // `cqe` is not read from here on.
            self.publish_ci();
            srq.page_fault(idx);
            return None;
        }
        let mut c = Completion {
            qpn,
            cookie: srq.cookies.get(idx),
            opcode: WcOpcode::Recv,
            ..Completion::default()
        };
        match op {
            None => {
                let e = cqe.as_err();
                c.status = e.syndrome().wc_status();
                c.syndrome = Some((e.syndrome, e.vendor_err_synd));
            }
            Some(op) => {
                c.byte_len = cqe.byte_cnt.get();
                // The sender's QP (a DCT's receive: the initiating DCI), as libmlx5's
                // `handle_responder` reports `flags_rqpn` for every responder CQE; not where
                // the CQE's first 32 bytes hold the message (INLINE_SCATTER_32).
                c.src_qp = cqe.sender().0;
                if cqe.op_own & FORMAT_MASK != 0 {
                    // Before the WQE is given back (which gives back its pins too).
                    c.status = self.scatter_from_cqe(cqe, &srq.scatter, idx, c.byte_len);
                }
                if op != CqeOpcode::RespSend {
                    c.imm = Some(received(op, cqe, q, &mut c.opcode));
                }
            }
        }
        // After the copy: the WQE's regions are given back and its index goes into the
        // SRQ's free ring now; the count that hands it to the poster is stored with the
        // other retirements, after the consumer index (an SRQ's freed count is its cookie
        // table's retired mark).
        self.later
            .set(Retire::Recv(&srq.cookies, srq.stage_free(idx)));
        Some(c)
    }

    #[inline]
    fn complete_other(
        &self,
        cqe: &Cqe64,
        opcode: u8,
        q: Option<&Attached>,
        qpn: u32,
        wqe: u16,
    ) -> Option<Completion> {
        let mut c = Completion {
            qpn,
            ..Completion::default()
        };
        match CqeOpcode::from_bits(opcode) {
            Some(
                op @ (CqeOpcode::RespSend
                | CqeOpcode::RespSendImm
                | CqeOpcode::RespWrImm
                | CqeOpcode::RespSendInv),
            ) => {
                let q = q?;
                let Some(rq) = q.rq.as_ref() else {
                    return self.complete_srq(cqe, q);
                };
                c.cookie = rq.get(wqe);
                c.byte_len = cqe.byte_cnt.get();
                if let Some(t) = q.scatter.as_deref() {
                    if cqe.op_own & FORMAT_MASK != 0 {
                        // The copy, then the receive's pins go.
                        c.status = self.scatter_from_cqe(cqe, t, wqe, c.byte_len);
                    } else {
                        t.done(wqe);
                    }
                } else if cqe.op_own & FORMAT_MASK != 0 {
                    // A queue without a table cannot happen; never report lost data.
                    c.status = WcStatus::GeneralErr;
                }
                self.later.set(Retire::Recv(&**rq, wqe.wrapping_add(1)));
                // UD: the sender's QP and the GRH bit (rdma-core `handle_responder`; not
                // where the message fills the CQE's first 32 bytes).
                (c.src_qp, c.grh) = cqe.sender();
                c.opcode = WcOpcode::Recv;
                if op != CqeOpcode::RespSend {
                    c.imm = Some(received(op, cqe, q, &mut c.opcode));
                }
            }
            Some(CqeOpcode::ReqErr) => {
                let e = cqe.as_err();
                let sq = q?.sq.as_ref()?;
                let w = e.wqe_counter.get();
                let s = sq.get(w);
                sq.note_error(w);
                self.later.set(Retire::Send(&**sq, w.wrapping_add(s.bbs)));
                if s.is_flush_mark() {
                    // Posted by the crate only to close an unsignaled tail: retired, not
                    // reported.
                    return None;
                }
                c.qpn = e.qpn();
                c.cookie = s.cookie;
                c.opcode = s.opcode;
                c.status = e.syndrome().wc_status();
                c.syndrome = Some((e.syndrome, e.vendor_err_synd));
            }
            Some(CqeOpcode::RespErr) => {
                let e = cqe.as_err();
                c.qpn = e.qpn();
                let q = q?;
                let Some(rq) = q.rq.as_ref() else {
                    return self.complete_srq(cqe, q);
                };
                let w = e.wqe_counter.get();
                c.cookie = rq.get(w);
                if let Some(t) = q.scatter.as_deref() {
                    t.done(w);
                }
                self.later.set(Retire::Recv(&**rq, w.wrapping_add(1)));
                c.opcode = WcOpcode::Recv;
                c.status = e.syndrome().wc_status();
                c.syndrome = Some((e.syndrome, e.vendor_err_synd));
            }
            _ => {
                // Resize, signature errors or a compressed CQE: this driver never enables
                // them; report rather than drop.
                c.status = WcStatus::GeneralErr;
            }
        }
        Some(c)
    }
}

/// A receive CQE's immediate or invalidated key (`op` is not a plain send's) and the
/// completion's opcode; a key a peer invalidated is recorded for the QP's windows first.
#[inline(always)]
pub(super) fn received(op: CqeOpcode, cqe: &Cqe64, q: &Attached, opcode: &mut WcOpcode) -> u32 {
    let imm = cqe.imm_inval_pkey.get();
    match op {
        CqeOpcode::RespWrImm => *opcode = WcOpcode::RecvRdmaWithImm,
        CqeOpcode::RespSendInv => {
            *opcode = WcOpcode::RecvWithInv;
            q.invalidated(imm);
        }
        _ => {}
    }
    imm
}

/// The data of a receive CQE of format INLINE_SCATTER_32 (`len` at most 32 bytes, at the
/// start of the CQE: rdma-core `handle_responder`), else None.
#[inline(always)]
fn data_at_start(cqe: &Cqe64, len: u32) -> Option<&[u8]> {
    (cqe.op_own & FORMAT_MASK == (CqeFormat::InlineScatter32 as u8) << 2 && len <= 32).then(|| {
        // SAFETY: the caller holds the entry (software's until `publish_ci`); its first
        // `len` (<= 32) of 64 bytes are the data, written before the owner byte and read
        // after it (barrier in `CompletionQueue::entry`).
        unsafe { core::slice::from_raw_parts(cqe as *const Cqe64 as *const u8, len as usize) }
    })
}

/// Whether `cqe` is a responder's page fault in an SRQ WQE (`ErrCqe::is_odp_page_fault`).
fn is_page_fault(cqe: &Cqe64) -> bool {
    cqe.op_own >> 4 == CqeOpcode::RespErr as u8 && cqe.as_err().is_odp_page_fault()
}

/// `sop_drop_qpn` mask of the fast path: the QP number and bit 4 of the WQE opcode, set for
/// RDMA read (0x10) and every atomic (0x11, 0x12, 0x14, 0x15), clear for the other opcodes:
/// compared with the QP seen last, reads and atomics differ and take the general path,
/// which reports a read's byte count from the CQE; writes, sends and the rest pass with no
/// extra instruction.
const READ_ATOMIC_QPN_MASK: u32 = 0x10 << 24 | 0xff_ffff;

/// The byte count of a successful requester completion: an RDMA read reports the CQE's
/// byte count (rdma-core `cq.c` `handle_good_req`: `be32toh(cqe->byte_cnt)`), atomics their
/// operand size, the rest 0 (both from the shadow entry).
#[inline(always)]
fn req_byte_len(opcode: WcOpcode, shadow: u32, cqe: &Cqe64) -> u32 {
    if opcode == WcOpcode::RdmaRead {
        cqe.byte_cnt.get()
    } else {
        shadow
    }
}

#[cfg(test)]
mod fast_vs_general;
#[cfg(test)]
mod tests;

#[cfg(test)]
thread_local! {
    /// Tests only (`fast_vs_general`): every poll of this thread takes the general path, the
    /// fast paths forced off.
    pub(crate) static FORCE_GENERAL: core::cell::Cell<bool> = const { core::cell::Cell::new(false) };
}
