//! The receive queue of the direct path.

use super::barrier;
use super::placement;
use crate::error::{Error, Result};
use crate::queue::checks::check_recv_list;
use crate::queue::cq_share::{recv_room_end, CqShare, CqSlots, Leaving};
use crate::queue::regions::{RegionCheck, Regions};
use crate::queue::scatter::ScatterTable;
use crate::queue::shadow::Shadow;
use core::sync::atomic::{AtomicU32, Ordering};
use mlx5::doorbell::RCV_DBR;
use mlx5::recv::{encode_recv, encode_recv_one};
use mlx5::request::Sge;

/// The largest receive WQE stride a queue takes: 1024 bytes, the software NIC's (64 scatter
/// entries; a ConnectX's is 512, 32 entries): a receive's entry count fits the byte the
/// scatter table keeps it in.
const MAX_RQ_STRIDE: u32 = 1024;
use mlx5::RawQp;
use std::sync::Arc;

/// The receive side of a QP on the direct path.
pub struct RecvQueue {
    buf: *mut u8,
    cnt: u32,
    stride: usize,
    max_sge: usize,
    dbrec: *mut u32,
    /// Receive WQEs posted (16 bits).
    head: u16,
    /// Where the queue may post up to without checking its room again (its free entries
    /// and its CQ's allowance, as of the last check: `recv_room_end`).
    room_end: u16,
    /// The longest entry [`RecvQueue::post_one`] takes: `MAX_SGE_BYTES`, or 0 when the
    /// queue takes no entry at all (the general path refuses such receives).
    one_max: u32,
    pub(crate) shadow: Arc<Shadow<u64>>,
    /// The scatter list of every posted receive, for data the device delivers inside the
    /// CQE (scatter-to-CQE).
    pub(crate) scatter: Arc<ScatterTable>,
    /// The protection domain's regions, to check receive buffers against (None: the
    /// caller of [`RecvQueue::new`] vouches for them).
    /// (Boxed: the list's `Vec` would otherwise lend `Qp`'s data-path enum a niche that
    /// costs the post fast path an instruction.)
    regions: Option<Box<RegionCheck>>,
    /// The entries of the CQ this queue holds (None: not accounted).
    cq_share: Option<CqShare>,
}

// SAFETY: the pointers are to the QP's receive ring and record, which this queue alone
// writes (constructor contract).
unsafe impl Send for RecvQueue {}

impl core::fmt::Debug for RecvQueue {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("RecvQueue")
            .field("entries", &self.cnt)
            .field("head", &self.head)
            .finish()
    }
}

impl RecvQueue {
    /// A receive queue over the ring of `raw`, or `None` when the QP has none.
    ///
    /// The device may deliver a small received message inside its CQE (scatter-to-CQE, the
    /// rdma-core default on a ConnectX); the poller then copies it into the receive's
    /// buffers with the CPU.
    ///
    /// # Safety
    /// As [`SendQueue::new`](super::SendQueue::new), for the receive ring; and every
    /// receive posted must name memory that stays valid for writes until its completion has
    /// been polled.
    ///
    /// # Errors
    /// [`Error::InvalidParameter`] for a ring size or stride the hardware never gives, and
    /// for a null or misaligned ring or doorbell record. None when the QP has no receive
    /// ring (`rq_wqe_cnt` 0).
    pub unsafe fn new(raw: &RawQp) -> Result<Option<RecvQueue>> {
        if raw.rq_wqe_cnt == 0 {
            return Ok(None);
        }
        if !raw.rq_wqe_cnt.is_power_of_two()
            || raw.rq_stride < 16
            || raw.rq_stride > MAX_RQ_STRIDE
            || !raw.rq_stride.is_power_of_two()
        {
            return Err(Error::InvalidParameter {
                what: "receive ring",
                value: raw.rq_wqe_cnt as u64,
            });
        }
        // As the send queue: null or misaligned for the queue's own stores (8-byte words
        // in the ring, 4-byte ones in the record) is refused.
        placement::check(&[
            (
                "receive ring address (8-byte aligned)",
                raw.rq_buf as usize,
                8,
            ),
            (
                "doorbell record address (4-byte aligned)",
                raw.dbrec as usize,
                4,
            ),
        ])?;
        let max_sge = (raw.max_recv_sge as usize).min(raw.rq_stride as usize / 16);
        Ok(Some(RecvQueue {
            buf: raw.rq_buf,
            cnt: raw.rq_wqe_cnt,
            stride: raw.rq_stride as usize,
            max_sge,
            dbrec: raw.dbrec,
            head: 0,
            room_end: 0,
            one_max: if max_sge == 0 {
                0
            } else {
                mlx5::wqe::MAX_SGE_BYTES
            },
            shadow: Arc::new(Shadow::new(raw.rq_wqe_cnt)),
            scatter: Arc::new(ScatterTable::new(raw.rq_wqe_cnt, max_sge)),
            regions: None,
            cq_share: None,
        }))
    }

    /// Checks every receive posted from now on against these regions: the poller copies
    /// data that arrived inside a CQE only into entries that lie in a live, locally
    /// writable region under their lkey (the others complete with a local protection
    /// error, as the device reports when it writes the buffers itself).
    pub(crate) fn check_against(&mut self, regions: Arc<Regions>) {
        self.regions = Some(Box::new(RegionCheck::new(regions)));
    }

    /// Entries of the ring (the receive depth).
    pub fn capacity(&self) -> u32 {
        self.cnt
    }

    /// Accounts this queue's receives against the entries of the CQ they complete on.
    pub(crate) fn attach_cq(&mut self, slots: Arc<CqSlots>) {
        self.cq_share = Some(CqShare::new(slots, self.shadow.clone(), self.head));
        self.room_end = self.head;
    }

    /// Receives posted and not yet completed.
    pub(crate) fn outstanding(&self) -> u32 {
        self.head.wrapping_sub(self.shadow.retired()) as u32
    }

    /// The queue goes away: its charge on the CQ, given back when the result drops (after
    /// the device QP is destroyed: [`Leaving`]).
    pub(crate) fn leave_cq(&mut self) -> Option<Leaving> {
        let pos = self.head;
        self.cq_share.take().map(|s| s.leave(pos))
    }

    /// Entries free for new receives.
    #[inline]
    pub fn free(&self) -> u32 {
        self.cnt - self.outstanding()
    }

    /// Writes one receive (not announced: [`RecvQueue::ring`] does that).
    fn write(&mut self, sgl: &[Sge], cookie: u64) -> Result<()> {
        if self.head == self.room_end {
            self.refill_room()?;
        }
        let n = check_recv_list(sgl, self.max_sge)?;
        // SAFETY: the entry at `head` is free (within the room just checked).
        let entry = unsafe { self.entry() };
        encode_recv(sgl, entry).ok_or(Error::TooManySge {
            n,
            max: self.max_sge,
        })?;
        // Nothing can fail from here on: the entry's regions are pinned until it completes.
        let regions = self.regions.as_deref_mut();
        match sgl {
            [s] if s.len != 0 => self.scatter.record_one(self.head, s, regions),
            _ => self.scatter.record(self.head, sgl, regions),
        };
        self.advance(cookie);
        Ok(())
    }

    /// The usual receive, one non-empty entry `s` in the region the last receive landed in,
    /// while the room checked last lasts: written, recorded and announced, and true; else
    /// nothing done and false (the general path takes it, with every check and the search
    /// of the whole list of regions).
    #[inline(always)]
    pub(crate) fn post_one(&mut self, s: &Sge, cookie: u64) -> bool {
        // Lengths 1 to `one_max` in one compare.
        if self.head == self.room_end || s.len.wrapping_sub(1) >= self.one_max {
            return false;
        }
        // Pinned now, before anything is written. With the list's generation read and the
        // search of the whole list called from here (its frame keeping three more values
        // across the call), the receive cost 134.0 instructions instead of 127.1
        // (`cargo xtask icount`).
        let landing = match self.regions.as_deref() {
            Some(c) => match c.land_cached(s) {
                Some(l) => Some(l),
                None => return false,
            },
            None => None,
        };
        // SAFETY: the entry at `head` is free (`head` is short of `room_end`).
        let entry = unsafe { self.entry() };
        // One entry of 1 to `MAX_SGE_BYTES` bytes, into an entry of 16 bytes or more
        // (checked at creation).
        encode_recv_one(s, entry);
        self.scatter.record_landed(self.head, s, landing);
        self.advance(cookie);
        self.ring();
        true
    }

    /// The entry at `head`, to write a receive into.
    ///
    /// # Safety
    /// The entry is free: `head` is short of `room_end` (the poller retired it, or it was
    /// never posted), so the device does not read it until the record announces it.
    #[inline(always)]
    unsafe fn entry(&mut self) -> &mut [u8] {
        let idx = (self.head as u32 & (self.cnt - 1)) as usize;
        // SAFETY: the caller's contract; the entry lies inside the ring.
        unsafe { core::slice::from_raw_parts_mut(self.buf.add(idx * self.stride), self.stride) }
    }

    /// The receive just written at `head`, of `cookie`, is the queue's: recorded, and
    /// `head` moves on (the record does not say so yet).
    #[inline(always)]
    fn advance(&mut self, cookie: u64) {
        self.shadow.set(self.head, cookie);
        self.head = self.head.wrapping_add(1);
        self.shadow.mark_posted(self.head);
    }

    /// The cold path of the room check: the free entries and the CQ's allowance read again.
    #[cold]
    #[inline(never)]
    fn refill_room(&mut self) -> Result<()> {
        self.room_end = recv_room_end(self.free(), self.cq_share.as_mut(), self.head, self.cnt)?;
        Ok(())
    }

    fn ring(&mut self) {
        // The entries and cookies are written before the record announces them.
        barrier::to_device();
        // SAFETY: `dbrec` is the QP's live, aligned doorbell record (constructor contract).
        unsafe {
            (*(self.dbrec.add(RCV_DBR) as *const AtomicU32))
                .store((self.head as u32).to_be(), Ordering::Release)
        };
    }

    /// Posts one receive buffer list with its cookie.
    ///
    /// # Errors
    /// [`Error::QueueFull`], [`Error::TooManySge`]; nothing is posted then.
    #[inline]
    pub fn post(&mut self, sgl: &[Sge], cookie: u64) -> Result<()> {
        if let [s] = sgl {
            if self.post_one(s, cookie) {
                return Ok(());
            }
        }
        self.post_general(sgl, cookie)
    }

    /// [`RecvQueue::post`] of any receive, out of line, with every check (what
    /// [`RecvQueue::post_one`] did not take).
    #[inline(never)]
    pub(crate) fn post_general(&mut self, sgl: &[Sge], cookie: u64) -> Result<()> {
        self.write(sgl, cookie)?;
        self.ring();
        Ok(())
    }

    /// Posts several receives with one doorbell-record update. Stops at the first error,
    /// having posted the ones before it.
    ///
    /// # Errors
    /// As [`RecvQueue::post`], with how many were posted.
    pub fn post_many<'s>(
        &mut self,
        recvs: impl IntoIterator<Item = (&'s [Sge], u64)>,
    ) -> Result<usize, (usize, Error)> {
        post_each(self, recvs, Self::write, Self::ring)
    }
}

/// Writes receives into `queue` one by one with `write` and announces all those written
/// with one `ring` (none when nothing was written). Stops at the first error, having
/// announced the ones before it: `Err((posted, error))`. The `post_many` of a receive
/// queue and of an SRQ.
pub(crate) fn post_each<'s, Q>(
    queue: &mut Q,
    recvs: impl IntoIterator<Item = (&'s [Sge], u64)>,
    write: impl Fn(&mut Q, &[Sge], u64) -> Result<()>,
    ring: impl Fn(&mut Q),
) -> Result<usize, (usize, Error)> {
    let mut n = 0;
    for (sgl, cookie) in recvs {
        if let Err(e) = write(queue, sgl, cookie) {
            if n > 0 {
                ring(queue);
            }
            return Err((n, e));
        }
        n += 1;
    }
    if n > 0 {
        ring(queue);
    }
    Ok(n)
}
