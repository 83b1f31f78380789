//! The shared receive queue of the direct path: a linked list of WQEs in the SRQ's ring
//! (`mlx5::srq`), posted at the driver's head, given back at the tail.
//!
//! Followed: rdma-core `providers/mlx5/srq.c` (`mlx5_post_srq_recv`: the WQE at `head`,
//! `head = next_wqe_index`, the invalid-lkey terminator, `counter += n` then the barrier
//! and `*db = htobe32(counter)`, all under `srq->lock`; `mlx5_free_srq_wqe` as it was
//! before the bitmap: the freed index linked after the tail; `mlx5_complete_odp_fault` and
//! `srq_repost`: a page-faulted WQE's data segments copied to the head and posted again),
//! `cq.c` (a receive CQE of a QP with an SRQ takes its `wr_id` from
//! `srq->wrid[wqe_counter]` and frees that WQE; `is_odp_pfault_err`;
//! `mlx5_copy_to_recv_srq` for data that came inside the CQE), UCX
//! `uct_rc_mlx5_iface_srq_post_recv` (linked-list topology).
//!
//! Who writes the ring: its [`Writer`] (WQEs, links, the doorbell record), behind the SRQ's
//! spin lock as rdma-core's `srq->lock`: the poster ([`SrqRing`]) takes it for each post,
//! the poller of the SRQ's CQ only to post a page-faulted WQE again (see below). The
//! poller gives completed WQEs back through [`SrqShared`] without the lock: it writes the
//! index into the `freed` ring, then bumps the freed counter (Release); the writer links
//! those indices after its tail when it needs room (Acquire). A completed WQE is never in
//! the list, and the tail is never posted, so the device never reads a link the writer
//! changes.
//!
//! Page faults: a ConnectX that meets a page fault in an SRQ WQE's buffers (on-demand
//! memory, or a dma-buf whose exporter moved it) does not stall the SRQ's head; it completes
//! the WQE with REMOTE_ABORTED and vendor syndrome 0x93 and the requester sends the message
//! again. That CQE is no completion of the user's: the poller publishes its consumer index
//! past it, then the writer copies the WQE's data segments to the head, moves its cookie and
//! pins there, rings, and gives the faulted index back. The freed ring hands indices out
//! oldest first, so the faulted WQE (which the device may still be reading) is the last to
//! be written again: rdma-core's wait queue (`srq_cooldown_wqe`) does the same.

use super::barrier;
use crate::error::{Error, Result};
use crate::queue::cq_share::{CqShare, CqSlots};
use crate::queue::regions::{RegionCheck, Regions};
use crate::queue::spin::Spin;
use crate::queue::srq_shared::{Repost, SrqShared};
use core::sync::atomic::{AtomicU32, Ordering};
use mlx5::request::Sge;
use mlx5::srq::{copy_srq_data, encode_srq_recv, next_index, set_next_index, RawSrq};
use std::sync::Arc;

/// What writes the SRQ's ring: its place, the list's ends and the doorbell count.
struct Writer {
    buf: *mut u8,
    cnt: u32,
    stride: usize,
    max_sge: usize,
    dbrec: *mut u32,
    /// The WQE the next receive goes into.
    head: u16,
    /// The last WQE of the list (never posted).
    tail: u16,
    /// Receives posted (the doorbell record's counter).
    counter: u16,
    /// Freed indices linked back into the list so far.
    reclaimed: u16,
    /// The protection domain's regions, to check receive buffers against (scatter-to-CQE).
    regions: Option<Box<RegionCheck>>,
    /// The device pages SRQ receives in (`OdpCaps::srq_recv`): entries in on-demand or
    /// dma-buf regions are allowed (their page faults come back as reposts).
    pageable: bool,
    /// The entries of the CQ the SRQ's receives complete on.
    cq_share: Option<CqShare>,
}

// SAFETY: the pointers are to the SRQ's ring and doorbell record, which the writer alone
// writes (constructor contract) and which live as long as the SRQ; the writer is reached
// only under its lock (`RingWriter`).
unsafe impl Send for Writer {}

/// The writer behind the SRQ's lock; `None` once the SRQ is about to be destroyed.
pub(crate) struct RingWriter(Spin<Option<Writer>>);

impl Writer {
    /// The WQE at `idx`.
    fn entry(&mut self, idx: u16) -> &mut [u8] {
        let i = (idx as u32 & (self.cnt - 1)) as usize;
        // SAFETY: entry `i` lies inside the ring; the callers touch only WQEs in the list
        // (not posted, so the device does not read them), the tail's link, or a WQE the
        // device completed and the writer was handed (a page fault's).
        unsafe { core::slice::from_raw_parts_mut(self.buf.add(i * self.stride), self.stride) }
    }

    /// Receives that may be posted now.
    fn free(&self, shared: &SrqShared) -> u32 {
        (self.cnt - 1).saturating_sub(shared.outstanding())
    }

    /// Makes the head a WQE that may be posted: when the list is the tail alone, links the
    /// oldest index given back (and not linked yet) after the tail (rdma-core's free, done
    /// here by the ring's only writer). The caller knows one is there: `freed` holds it
    /// below `retired` (loaded by `free`, or written by the caller itself).
    fn make_head(&mut self, shared: &SrqShared) {
        if self.head == self.tail {
            let k = self.reclaimed;
            let idx = shared.freed_at(k);
            let tail = self.tail;
            set_next_index(self.entry(tail), idx);
            self.tail = idx;
            self.reclaimed = k.wrapping_add(1);
        }
    }

    /// The head WQE is written: moves the head on and counts it posted.
    fn advance(&mut self, shared: &SrqShared) {
        let head = self.head;
        let next = next_index(self.entry(head));
        self.head = next & (self.cnt - 1) as u16;
        self.counter = self.counter.wrapping_add(1);
        shared.cookies.mark_posted(self.counter);
    }

    fn write(&mut self, shared: &SrqShared, sgl: &[Sge], cookie: u64) -> Result<()> {
        let n = crate::queue::checks::check_recv(self.free(shared), sgl, self.max_sge)?;
        if !self.pageable {
            if let Some(lkey) = self.regions.as_mut().and_then(|r| r.on_demand(sgl)) {
                return Err(Error::InvalidParameter {
                    what: "SRQ receive in an on-demand or dma-buf region (lkey) on a device \
                           whose on-demand paging has no SRQ receive (IBV_ODP_SUPPORT_SRQ_RECV)",
                    value: lkey as u64,
                });
            }
        }
        if let Some(share) = &mut self.cq_share {
            share.check_one(self.counter, self.cnt)?;
        }
        self.make_head(shared);
        let head = self.head;
        let max = self.max_sge;
        encode_srq_recv(sgl, self.entry(head)).ok_or(Error::TooManySge { n, max })?;
        // Nothing can fail from here on: the entry's regions are pinned until it completes.
        shared
            .scatter
            .record(head, sgl, self.regions.as_deref_mut());
        shared.cookies.set(head, cookie);
        self.advance(shared);
        Ok(())
    }

    fn ring(&mut self) {
        // The WQEs and cookies are written before the record announces them.
        barrier::to_device();
        // SAFETY: `dbrec` is the SRQ's live, aligned doorbell record (constructor contract).
        unsafe {
            (*(self.dbrec as *const AtomicU32))
                .store((self.counter as u32).to_be(), Ordering::Release)
        };
    }

    /// Posts the receive of the page-faulted WQE `idx` again (rdma-core `srq_repost`), then
    /// gives `idx` back. The poller has consumed and published the fault's CQE.
    fn repost(&mut self, shared: &SrqShared, idx: u16) {
        // The faulted index goes into the free ring first (its pins move with the receive,
        // below): in a full ring it is the only room, and is then linked as the new tail,
        // which is never posted; its data segments stay as they are until it is written
        // again (rdma-core without a wait queue).
        let k = shared.give_back(idx);
        self.make_head(shared);
        let head = self.head;
        let from = idx & (self.cnt - 1) as u16;
        debug_assert_ne!(
            from, head,
            "the head is in the list, the faulted WQE was posted"
        );
        let i = (from as usize) * self.stride;
        let j = (head as usize) * self.stride;
        // SAFETY: two distinct entries of the ring (`from` was posted and completed, `head`
        // is in the list): the device reads neither now.
        let (src, dst) = unsafe {
            (
                core::slice::from_raw_parts(self.buf.add(i), self.stride),
                core::slice::from_raw_parts_mut(self.buf.add(j), self.stride),
            )
        };
        copy_srq_data(src, dst);
        shared.cookies.set(head, shared.cookies.get(from));
        shared.scatter.move_entry(from, head);
        if let Some(share) = &mut self.cq_share {
            share.carry_one(self.counter);
        }
        self.advance(shared);
        self.ring();
        // Release: the index and the cookie moved before the count that hands `idx` over.
        shared.cookies.retire(k);
    }
}

impl Repost for RingWriter {
    fn repost(&self, shared: &SrqShared, idx: u16) -> bool {
        let mut g = self.0.lock();
        let Some(w) = g.as_mut() else { return false };
        w.repost(shared, idx);
        true
    }

    fn close(&self) -> Option<(CqShare, u16)> {
        let w = self.0.lock().take()?;
        let pos = w.counter;
        w.cq_share.map(|s| (s, pos))
    }
}

/// The poster's side of an SRQ on the direct path.
pub struct SrqRing {
    pub(crate) shared: Arc<SrqShared>,
    pub(crate) writer: Arc<RingWriter>,
    srqn: u32,
    cnt: u32,
    max_sge: usize,
}

impl core::fmt::Debug for SrqRing {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("SrqRing")
            .field("srqn", &self.srqn)
            .field("entries", &self.cnt)
            .field("outstanding", &self.shared.outstanding())
            .finish()
    }
}

impl SrqRing {
    /// A poster over the ring of `raw`.
    ///
    /// # Safety
    /// `raw` must describe a live SRQ whose ring is linked from `head` to `tail` as a fresh
    /// SRQ's (`mlx5dv_init_obj` right after `ibv_create_srq`), that stays alive while the
    /// poster and every completion of its receives exist (a page-faulted receive is posted
    /// again by the poller of its CQ), and that nobody else posts to; every receive posted must name memory that stays
    /// valid for writes until its completion has been polled.
    pub unsafe fn new(raw: &RawSrq) -> Result<SrqRing> {
        if !raw.wqe_cnt.is_power_of_two()
            || raw.wqe_cnt < 2
            || raw.wqe_cnt > 1 << 15
            || raw.stride < 32
            || !raw.stride.is_power_of_two()
            || raw.head >= raw.wqe_cnt
            || raw.tail >= raw.wqe_cnt
        {
            return Err(Error::InvalidParameter {
                what: "SRQ ring (entries)",
                value: raw.wqe_cnt as u64,
            });
        }
        let max_sge = (raw.max_sge as usize).min(mlx5::srq::srq_max_sge(raw.stride) as usize);
        let writer = Arc::new(RingWriter(Spin::new(Some(Writer {
            buf: raw.buf,
            cnt: raw.wqe_cnt,
            stride: raw.stride as usize,
            max_sge,
            dbrec: raw.dbrec,
            head: raw.head as u16,
            tail: raw.tail as u16,
            counter: 0,
            reclaimed: 0,
            regions: None,
            pageable: true,
            cq_share: None,
        }))));
        let shared = SrqShared::new(raw.srqn, raw.wqe_cnt, max_sge).with_repost(writer.clone());
        Ok(SrqRing {
            shared: Arc::new(shared),
            writer,
            srqn: raw.srqn,
            cnt: raw.wqe_cnt,
            max_sge,
        })
    }

    /// Runs `f` on the writer (present until the SRQ is closed, `RingWriter::close`).
    fn with<T>(&mut self, f: impl FnOnce(&mut Writer, &SrqShared) -> Result<T>) -> Result<T> {
        let mut g = self.writer.0.lock();
        let w = g.as_mut().ok_or(Error::InvalidState {
            state: "SRQ closed",
        })?;
        f(w, &self.shared)
    }

    /// Checks every receive posted from now on against these regions (see
    /// [`RecvQueue`](super::RecvQueue)'s `check_against`); `pageable`: the device pages
    /// SRQ receives in (else entries in on-demand or dma-buf regions are refused).
    pub(crate) fn check_against(&mut self, regions: Arc<Regions>, pageable: bool) {
        let _ = self.with(|w, _| {
            w.regions = Some(Box::new(RegionCheck::new(regions)));
            w.pageable = pageable;
            Ok(())
        });
    }

    /// Accounts the SRQ's receives against the entries of the CQ they complete on.
    pub(crate) fn attach_cq(&mut self, slots: Arc<CqSlots>) {
        let shared = self.shared.clone();
        let _ = self.with(|w, _| {
            w.cq_share = Some(CqShare::new(slots, shared, w.counter));
            Ok(())
        });
    }

    /// Receives the SRQ holds at once (its entries less the tail).
    pub fn capacity(&self) -> u32 {
        self.cnt - 1
    }

    /// Most scatter entries per receive.
    pub(crate) fn max_sge(&self) -> usize {
        self.max_sge
    }

    /// Receives that may be posted now.
    pub fn free(&self) -> u32 {
        self.capacity().saturating_sub(self.shared.outstanding())
    }

    /// Posts one receive buffer list with its cookie.
    ///
    /// # Errors
    /// [`Error::QueueFull`], [`Error::TooManySge`], [`Error::CqFull`];
    /// [`Error::InvalidState`] once the SRQ is being destroyed; nothing is posted then.
    pub fn post(&mut self, sgl: &[Sge], cookie: u64) -> Result<()> {
        self.with(|w, shared| {
            w.write(shared, sgl, cookie)?;
            w.ring();
            Ok(())
        })
    }

    /// Posts several receives with one doorbell-record update. Stops at the first error,
    /// having posted the ones before it.
    ///
    /// # Errors
    /// As [`SrqRing::post`], with how many were posted.
    pub fn post_many<'s>(
        &mut self,
        recvs: impl IntoIterator<Item = (&'s [Sge], u64)>,
    ) -> Result<usize, (usize, Error)> {
        let shared = self.shared.clone();
        let mut g = self.writer.0.lock();
        let Some(w) = g.as_mut() else {
            return Err((
                0,
                Error::InvalidState {
                    state: "SRQ closed",
                },
            ));
        };
        super::rq::post_each(
            w,
            recvs,
            |w, sgl, cookie| w.write(&shared, sgl, cookie),
            Writer::ring,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ring in host memory linked as a fresh SRQ's, and a device stand-in that takes
    /// WQEs by following the links.
    struct Fake {
        ring: Vec<u8>,
        db: Box<[u32; 16]>,
        head: u16,
        taken: u16,
    }

    impl Fake {
        fn new(cnt: u32, stride: u32) -> Fake {
            let mut ring = vec![0u8; (cnt * stride) as usize];
            mlx5::srq::init_links(&mut ring, stride as usize);
            Fake {
                ring,
                db: Box::new([0; 16]),
                head: 0,
                taken: 0,
            }
        }

        fn raw(&mut self, cnt: u32, stride: u32) -> RawSrq {
            RawSrq {
                srqn: 7,
                buf: self.ring.as_mut_ptr(),
                wqe_cnt: cnt,
                stride,
                dbrec: self.db.as_mut_ptr(),
                head: 0,
                tail: cnt - 1,
                max_sge: mlx5::srq::srq_max_sge(stride),
            }
        }

        /// Takes the next posted WQE: its index and first entry's address.
        fn take(&mut self, stride: usize) -> Option<(u16, u64)> {
            let posted = u32::from_be(self.db[0]) as u16;
            if posted == self.taken {
                return None;
            }
            let at = self.head as usize * stride;
            let mut out = [Sge::default(); 4];
            let (next, n) = mlx5::srq::decode_srq_recv(&self.ring[at..at + stride], &mut out);
            assert!(n >= 1);
            let idx = self.head;
            self.head = next;
            self.taken = self.taken.wrapping_add(1);
            Some((idx, out[0].addr))
        }
    }

    fn sge(addr: u64) -> [Sge; 1] {
        [Sge {
            addr,
            len: 8,
            lkey: 1,
        }]
    }

    /// Completions in any order: every freed WQE is posted again, the device follows the
    /// links to exactly the receives posted, in posting order, and never more than the
    /// ring less its tail are outstanding.
    #[test]
    fn out_of_order_frees_relink_the_list() {
        let (cnt, stride) = (8u32, 32u32);
        let mut dev = Fake::new(cnt, stride);
        let raw = dev.raw(cnt, stride);
        // SAFETY: the fake ring and record outlive the poster, which alone posts to them.
        let mut srq = unsafe { SrqRing::new(&raw) }.unwrap();
        assert_eq!(srq.capacity(), 7);
        let mut next_addr = 0x1000u64;
        let mut posted = std::collections::VecDeque::new();
        let mut held = Vec::new();
        for round in 0..200u64 {
            while srq.free() > 0 {
                srq.post(&sge(next_addr), next_addr).unwrap();
                posted.push_back(next_addr);
                next_addr += 8;
            }
            assert!(matches!(
                srq.post(&sge(1), 1),
                Err(Error::QueueFull { free: 0, .. })
            ));
            // The device takes a few, in posting order.
            for _ in 0..(round % 4 + 1) {
                let (idx, addr) = dev.take(stride as usize).unwrap();
                assert_eq!(Some(addr), posted.pop_front());
                assert_eq!(srq.shared.cookies.get(idx), addr, "cookie by index");
                held.push(idx);
            }
            // The poller gives some back, newest first.
            while held.len() > (round % 3) as usize {
                let idx = held.pop().unwrap();
                srq.shared.free(idx);
            }
        }
    }

    /// A WQE the device faulted on is posted again, with its cookie and buffers, after
    /// everything posted before the fault (at the head, as rdma-core's `srq_repost`),
    /// whether the ring has free entries or is full (then the faulted entry itself becomes
    /// the tail); nothing is lost, and the ring keeps its capacity.
    #[test]
    fn a_page_faulted_wqe_is_posted_again_with_its_cookie_and_buffers() {
        let (cnt, stride) = (8u32, 32u32);
        let mut dev = Fake::new(cnt, stride);
        let raw = dev.raw(cnt, stride);
        // SAFETY: the fake ring and record outlive the poster, which alone posts to them.
        let mut srq = unsafe { SrqRing::new(&raw) }.unwrap();
        let mut next_addr = 0x1000u64;
        let mut order = std::collections::VecDeque::new();
        let mut faults = 0;
        for round in 0..300u64 {
            // Refill, but not always to the brim: faults meet full and partial rings.
            while srq.free() > (round % 3) as u32 {
                srq.post(&sge(next_addr), next_addr).unwrap();
                order.push_back(next_addr);
                next_addr += 8;
            }
            let (idx, addr) = dev.take(stride as usize).unwrap();
            assert_eq!(Some(addr), order.pop_front(), "the device follows the list");
            assert_eq!(srq.shared.cookies.get(idx), addr, "cookie by index");
            let free = srq.free();
            if round % 2 == 0 {
                srq.shared.page_fault(idx);
                faults += 1;
                // Posted again behind everything else; still outstanding.
                order.push_back(addr);
                assert_eq!(srq.free(), free);
                assert_eq!(u32::from_be(dev.db[0]) as u16, srq.shared.cookies.posted());
            } else {
                srq.shared.free(idx);
                assert_eq!(srq.free(), free + 1);
            }
        }
        assert_eq!(faults, 150);
        // Drain: every receive still owed comes out, in order, once.
        while let Some((idx, addr)) = dev.take(stride as usize) {
            assert_eq!(Some(addr), order.pop_front());
            srq.shared.free(idx);
        }
        assert!(order.is_empty());
        assert_eq!(srq.free(), srq.capacity());
    }

    /// `post_many` writes until the first refusal and rings once for those written: the
    /// record counts exactly them, and the device finds them in order.
    #[test]
    fn post_many_rings_once_for_what_it_wrote() {
        let (cnt, stride) = (8u32, 32u32);
        let mut dev = Fake::new(cnt, stride);
        let raw = dev.raw(cnt, stride);
        // SAFETY: the fake ring and record outlive the poster, which alone posts to them.
        let mut srq = unsafe { SrqRing::new(&raw) }.unwrap();
        assert!(matches!(srq.post_many(core::iter::empty()), Ok(0)));
        assert_eq!(dev.db[0], 0, "nothing written, no doorbell");
        let lists: Vec<[Sge; 1]> = (0..10u64).map(|i| sge(0x1000 + 8 * i)).collect();
        let r = srq.post_many(lists.iter().map(|l| (&l[..], l[0].addr)));
        assert!(
            matches!(r, Err((7, Error::QueueFull { free: 0, .. }))),
            "{r:?}"
        );
        assert_eq!(u32::from_be(dev.db[0]), 7);
        for i in 0..7u64 {
            let (idx, addr) = dev.take(stride as usize).unwrap();
            assert_eq!(addr, 0x1000 + 8 * i);
            assert_eq!(srq.shared.cookies.get(idx), addr);
        }
        assert_eq!(dev.take(stride as usize), None);
    }
}
