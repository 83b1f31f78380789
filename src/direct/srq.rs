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
//! Who writes the ring: its [`Writer`] (WQEs, links, the doorbell record, and the entries
//! of not yet announced receives in the shared cookie and scatter tables), behind the
//! SRQ's spin lock as rdma-core's `srq->lock`: the poster ([`SrqRing`]) takes it for each
//! post, the poller of the SRQ's CQ only to post a page-faulted WQE again (see below). The
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
//! pins there and rings. The kernel may still be reading the faulted WQE (its page-fault
//! handler reads the data segments from the ring), so it is not written again soon: it
//! joins the back of a wait queue of spare WQEs, and the oldest spare takes its place in
//! circulation (rdma-core `srq_cooldown_wqe`). The spares are the ring's WQEs past the
//! list: rdma-core allocates `2 * max_wr + 1` of them rounded up and links only the first
//! `max_wr + 1` (`mlx5_alloc_srq_buf`); the kernel's SRQ is the whole ring, which
//! `ibv_query_srq` reports. Without spares (an older rdma-core) the faulted WQE goes into
//! circulation again, as rdma-core then does.

use super::barrier;
use crate::error::{Error, Result};
use crate::queue::cq_share::{CqShare, CqSlots};
use crate::queue::regions::{RegionCheck, Regions};
use crate::queue::spin::Spin;
use crate::queue::srq_shared::{Repost, SrqShared};
use core::sync::atomic::{AtomicU32, Ordering};
use mlx5::request::Sge;
use mlx5::srq::{copy_srq_data, encode_srq_recv, next_index, set_next_index, RawSrq};
use std::collections::VecDeque;
use std::sync::Arc;

/// The largest SRQ WQE stride a ring takes: 512 bytes, a ConnectX's and the software NIC's
/// (31 scatter entries, `mlx5::srq::srq_stride`); a receive's entry count is kept in a byte.
const MAX_SRQ_STRIDE: u32 = 512;

/// What writes the SRQ's ring: its place, the list's ends and the doorbell count.
struct Writer {
    buf: *mut u8,
    /// WQEs in the ring (the list's and the spares).
    cnt: u32,
    /// Receives that may be outstanding at once (the list's WQEs less its tail).
    cap: u32,
    /// WQEs out of circulation, oldest first: the ring's spares at first (rdma-core's wait
    /// queue), then page-faulted WQEs cooling down (`srq_cooldown_wqe`).
    waitq: VecDeque<u16>,
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
        self.cap.saturating_sub(shared.outstanding())
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
            share.check_one(self.counter, self.cap)?;
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
    /// takes `idx` out of circulation for as long as it can. The poller has consumed and
    /// published the fault's CQE.
    fn repost(&mut self, shared: &SrqShared, idx: u16) {
        let from = idx & (self.cnt - 1) as u16;
        // The kernel may still read the faulted WQE (its page-fault handler reads the
        // data segments back from the ring, `mlx5_ib_mr_wqe_pfault_handler`): it cools
        // down at the back of the wait queue, and the oldest spare goes into circulation
        // in its place (rdma-core `srq_cooldown_wqe`). Without spares the faulted index
        // itself goes into the free ring: in a full ring it is the only room, and is then
        // linked as the new tail (rdma-core without a wait queue). Either way through the
        // free ring (its pins move with the receive, below).
        let back = match self.waitq.pop_front() {
            Some(spare) => {
                self.waitq.push_back(from);
                spare
            }
            None => from,
        };
        let k = shared.give_back(back);
        self.make_head(shared);
        let head = self.head;
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
    /// Receives outstanding at once, at most.
    cap: u32,
    max_sge: usize,
}

impl core::fmt::Debug for SrqRing {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("SrqRing")
            .field("srqn", &self.srqn)
            .field("capacity", &self.cap)
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
            || raw.wqe_cnt > 1 << 16
            || raw.stride < 32
            || raw.stride > MAX_SRQ_STRIDE
            || !raw.stride.is_power_of_two()
            || raw.head >= raw.wqe_cnt
            || raw.tail >= raw.wqe_cnt
            || (raw.head == 0 && raw.tail == 0)
        {
            return Err(Error::InvalidParameter {
                what: "SRQ ring (entries)",
                value: raw.wqe_cnt as u64,
            });
        }
        // A fresh list from 0 to `tail`, the spares past it; a list that starts elsewhere
        // is taken to be the whole ring.
        let (cap, spares) = if raw.head == 0 {
            (raw.tail, raw.tail + 1..raw.wqe_cnt)
        } else {
            (raw.wqe_cnt - 1, 0..0)
        };
        let max_sge = (raw.max_sge as usize).min(mlx5::srq::srq_max_sge(raw.stride) as usize);
        let writer = Arc::new(RingWriter(Spin::new(Some(Writer {
            buf: raw.buf,
            cnt: raw.wqe_cnt,
            cap,
            waitq: spares.map(|i| i as u16).collect(),
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
            cap,
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

    /// Receives the SRQ holds at once (its list's entries less the tail).
    pub fn capacity(&self) -> u32 {
        self.cap
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
    /// having posted the ones before it. `recvs` is consumed under the SRQ's writer lock
    /// (a spin lock, held for the one update): the iterator must not poll the CQ the SRQ's
    /// receives complete on, whose poller reposts a page-faulted receive under that lock
    /// and would wait for ever.
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

    /// A stride no device gives (above 512 bytes: more entries than a receive's count
    /// holds) is refused.
    #[test]
    fn a_stride_past_the_largest_is_refused() {
        let (cnt, stride) = (4u32, 8192u32);
        let mut dev = Fake::new(cnt, stride);
        let raw = dev.raw(cnt, stride);
        // SAFETY: refused before any use of the memory.
        let r = unsafe { SrqRing::new(&raw) };
        assert!(
            matches!(r, Err(Error::InvalidParameter { what, .. }) if what.starts_with("SRQ ring")),
            "{:?}",
            r.err()
        );
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
        // A list of 8 in a ring of 8 (no spares), and in a ring of 16 (8 spares).
        for ring in [8u32, 16] {
            faults_on(ring, 8);
        }
    }

    fn faults_on(ring: u32, list: u32) {
        let stride = 32u32;
        let mut dev = Fake::new(ring, stride);
        let mut raw = dev.raw(ring, stride);
        raw.tail = list - 1;
        let spares = (ring - list) as u64;
        // SAFETY: the fake ring and record outlive the poster, which alone posts to them.
        let mut srq = unsafe { SrqRing::new(&raw) }.unwrap();
        assert_eq!(srq.capacity(), list - 1);
        let mut next_addr = 0x1000u64;
        let mut order = std::collections::VecDeque::new();
        let mut faults = 0u64;
        // The fault count when each index last faulted.
        let mut faulted_at = std::collections::HashMap::new();
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
            if let Some(&f) = faulted_at.get(&idx) {
                // A faulted WQE waits behind every spare before it is written again.
                assert!(
                    spares == 0 || faults - f > spares,
                    "WQE {idx} reused {} faults after its own (ring {ring})",
                    faults - f
                );
            }
            let free = srq.free();
            if round % 2 == 0 {
                faulted_at.insert(idx, faults);
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
