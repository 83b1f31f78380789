//! What the poster of a shared receive queue shares with the poller of its CQ, on both
//! data paths: the cookies by WQE index (slot), the ring of indices the poller gives back,
//! and the scatter lists of the posted receives.
//!
//! Two parties: the poster alone takes slots (on the direct path, whoever holds the SRQ
//! ring's writer lock: the poster, or the poller posting a page-faulted receive again,
//! [`SrqShared::page_fault`]); the poller of the SRQ's CQ gives completed ones back without
//! a lock: it writes the index into the `freed` ring, then bumps the freed count (Release);
//! the poster takes those indices when it needs room (Acquire). The direct path links them
//! back into the SRQ's ring (`crate::direct::srq`), the verbs path hands them to
//! `ibv_post_srq_recv` again (`crate::verbs::srq`).

use super::cq_share::CqShare;
use super::scatter::ScatterTable;
use super::shadow::{Retired, Shadow};
use core::sync::atomic::{AtomicU16, Ordering};
use std::sync::Arc;

/// What the poster of an SRQ shares with the poller of its CQ.
pub(crate) struct SrqShared {
    pub(crate) srqn: u32,
    mask: u16,
    /// Cookies by WQE index (slot); its posted / retired marks count receives posted and
    /// given back.
    pub(crate) cookies: Shadow<u64>,
    /// Indices given back by the poller, in order: entry `k & mask` is the k-th.
    freed: Box<[AtomicU16]>,
    /// The scatter lists by WQE index: the regions each receive pins, and (direct path)
    /// where data that came inside the CQE is copied.
    pub(crate) scatter: ScatterTable,
    /// Who posts a page-faulted receive again (the direct path's ring writer; the verbs
    /// path has none: rdma-core reposts inside `ibv_poll_cq`).
    repost: Option<Arc<dyn Repost>>,
}

/// The writer of an SRQ's ring, as the poller reaches it to post a page-faulted receive
/// again.
pub(crate) trait Repost: Send + Sync {
    /// Posts the receive in slot `idx` again at the ring's head and retires `idx` (the
    /// caller is the poller, its consumer index published past the fault). False when the
    /// ring is gone: nothing was done.
    fn repost(&self, shared: &SrqShared, idx: u16) -> bool;

    /// The SRQ is about to be destroyed: nothing writes its ring from now on. Returns the
    /// writer's CQ share with the position it ends at, to release once the SRQ is gone.
    fn close(&self) -> Option<(CqShare, u16)>;
}

impl core::fmt::Debug for SrqShared {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("SrqShared")
            .field("srqn", &self.srqn)
            .field("slots", &(self.mask as u32 + 1))
            .finish()
    }
}

impl SrqShared {
    /// The shared state of SRQ `srqn` of `cnt` slots (a power of two up to 32768), with
    /// scatter lists of `max_sge` entries.
    pub(crate) fn new(srqn: u32, cnt: u32, max_sge: usize) -> SrqShared {
        SrqShared {
            srqn,
            mask: (cnt - 1) as u16,
            cookies: Shadow::new(cnt),
            freed: (0..cnt).map(|_| AtomicU16::new(0)).collect(),
            scatter: ScatterTable::new(cnt, max_sge),
            repost: None,
        }
    }

    /// The same, whose poster marks its receives with `tag` (the verbs path's incarnation:
    /// [`Shadow::tag`] of `cookies`).
    pub(crate) fn with_tag(mut self, tag: u64) -> SrqShared {
        self.cookies = self.cookies.with_tag(tag);
        self
    }

    /// The same, whose page-faulted receives `writer` posts again.
    pub(crate) fn with_repost(mut self, writer: Arc<dyn Repost>) -> SrqShared {
        self.repost = Some(writer);
        self
    }

    /// The slot a completion names (the CQE's `wqe_counter`, a verbs `wr_id`).
    #[inline]
    pub(crate) fn slot(&self, wqe: u16) -> u16 {
        wqe & self.mask
    }

    /// Gives slot `idx` back to the poster (poller only, after it read what it needed of
    /// the slot and, on the direct path, published its consumer index).
    #[inline]
    pub(crate) fn free(&self, idx: u16) {
        // Release: the index (and everything the poller read of the slot) before the count.
        self.cookies.retire(self.stage_free(idx));
    }

    /// The first half of [`SrqShared::free`]: gives back the regions the receive in slot
    /// `idx` pinned (after any copy into them: the caller has made it), writes `idx` into
    /// the free ring and returns the freed count that hands it over, for the poller to
    /// store (`cookies.retire`) once its consumer index is published. The poster reads the
    /// ring only below the count it loaded, so the index is not seen before. Poller only,
    /// one slot at a time.
    #[inline]
    pub(crate) fn stage_free(&self, idx: u16) -> u16 {
        self.scatter.done(idx);
        self.give_back(idx)
    }

    /// [`SrqShared::stage_free`] without the pins (they moved with a reposted receive).
    #[inline]
    pub(crate) fn give_back(&self, idx: u16) -> u16 {
        let k = self.cookies.retired();
        self.freed[(k & self.mask) as usize].store(idx & self.mask, Ordering::Relaxed);
        k.wrapping_add(1)
    }

    /// Closes the ring's writer (direct path; see [`Repost::close`]).
    pub(crate) fn close_writer(&self) -> Option<(CqShare, u16)> {
        self.repost.as_ref().and_then(|r| r.close())
    }

    /// The device completed the receive in slot `idx` with a page fault (an SRQ WQE in
    /// on-demand or dma-buf memory whose pages had moved; `Cqe64::is_odp_page_fault`): it
    /// is no completion for the user. It is posted again, cookie and buffers unchanged
    /// (rdma-core `srq.c` `mlx5_complete_odp_fault`), by the SRQ ring's writer; where there
    /// is none any more (the SRQ is being destroyed), the slot is given back. Poller only,
    /// after its consumer index is published.
    #[cold]
    pub(crate) fn page_fault(&self, idx: u16) {
        if !self.repost.as_ref().is_some_and(|r| r.repost(self, idx)) {
            self.free(idx);
        }
    }

    /// Receives posted and not given back.
    pub(crate) fn outstanding(&self) -> u32 {
        self.cookies.posted().wrapping_sub(self.cookies.retired()) as u32
    }

    /// The `k`-th index given back (poster, for `k` below the freed count it loaded).
    pub(crate) fn freed_at(&self, k: u16) -> u16 {
        self.freed[(k & self.mask) as usize].load(Ordering::Relaxed)
    }
}

impl Retired for SrqShared {
    fn retired(&self) -> u16 {
        self.cookies.retired()
    }
}
