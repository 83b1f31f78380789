//! The shared receive queue of the direct path: a linked list of WQEs in the SRQ's ring
//! (`mlx5::srq`), posted at the driver's head, given back at the tail.
//!
//! Followed: rdma-core `providers/mlx5/srq.c` (`mlx5_post_srq_recv`: the WQE at `head`,
//! `head = next_wqe_index`, the invalid-lkey terminator, `counter += n` then the barrier
//! and `*db = htobe32(counter)`; `mlx5_free_srq_wqe` as it was before the bitmap: the
//! freed index linked after the tail), `cq.c` (a receive CQE of a QP with an SRQ takes its
//! `wr_id` from `srq->wrid[wqe_counter]` and frees that WQE; `mlx5_copy_to_recv_srq` for
//! data that came inside the CQE), UCX `uct_rc_mlx5_iface_srq_post_recv` (linked-list
//! topology).
//!
//! Two parties, no lock: the poster ([`SrqRing`], `&mut`) alone writes the ring (WQEs and
//! links); the poller of the SRQ's CQ gives completed WQEs back through [`SrqShared`]: it
//! writes the index into the `freed` ring, then bumps the freed counter (Release); the
//! poster links those indices after its tail when it needs room (Acquire). A completed WQE
//! is never in the list, and the tail is never posted, so the device never reads a link the
//! poster changes.

use super::barrier;
use crate::error::{Error, Result};
use crate::queue::cq_share::{CqShare, CqSlots};
use crate::queue::regions::{RegionCheck, Regions};
use crate::queue::srq_shared::SrqShared;
use core::sync::atomic::{AtomicU32, Ordering};
use mlx5::request::Sge;
use mlx5::srq::{encode_srq_recv, next_index, set_next_index, RawSrq};
use std::sync::Arc;

/// The poster's side of an SRQ on the direct path.
pub struct SrqRing {
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
    pub(crate) shared: Arc<SrqShared>,
    /// The protection domain's regions, to check receive buffers against (scatter-to-CQE).
    regions: Option<Box<RegionCheck>>,
    /// The entries of the CQ the SRQ's receives complete on.
    cq_share: Option<CqShare>,
}

// SAFETY: the pointers are to the SRQ's ring and doorbell record, which this poster alone
// writes (constructor contract); the poller only touches `shared`.
unsafe impl Send for SrqRing {}

impl core::fmt::Debug for SrqRing {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("SrqRing")
            .field("srqn", &self.shared.srqn)
            .field("entries", &self.cnt)
            .field("head", &self.head)
            .field("tail", &self.tail)
            .field("counter", &self.counter)
            .finish()
    }
}

impl SrqRing {
    /// A poster over the ring of `raw`.
    ///
    /// # Safety
    /// `raw` must describe a live SRQ whose ring is linked from `head` to `tail` as a fresh
    /// SRQ's (`mlx5dv_init_obj` right after `ibv_create_srq`), that stays alive while the
    /// poster and every completion of its receives exist, and that nobody else posts to;
    /// every receive posted must name memory that stays valid for writes until its
    /// completion has been polled.
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
        Ok(SrqRing {
            buf: raw.buf,
            cnt: raw.wqe_cnt,
            stride: raw.stride as usize,
            max_sge,
            dbrec: raw.dbrec,
            head: raw.head as u16,
            tail: raw.tail as u16,
            counter: 0,
            reclaimed: 0,
            shared: Arc::new(SrqShared::new(raw.srqn, raw.wqe_cnt, max_sge)),
            regions: None,
            cq_share: None,
        })
    }

    /// Checks every receive posted from now on against these regions (see
    /// [`RecvQueue`](super::RecvQueue)'s `check_against`).
    pub(crate) fn check_against(&mut self, regions: Arc<Regions>) {
        self.regions = Some(Box::new(RegionCheck::new(regions)));
    }

    /// Accounts the SRQ's receives against the entries of the CQ they complete on.
    pub(crate) fn attach_cq(&mut self, slots: Arc<CqSlots>) {
        self.cq_share = Some(CqShare::new(slots, self.shared.clone(), self.counter));
    }

    /// Gives the CQ share away (with the position it was released at) for the end of the
    /// SRQ: its receives may still complete after the poster is gone.
    pub(crate) fn take_cq_share(&mut self) -> Option<(CqShare, u16)> {
        self.cq_share.take().map(|s| (s, self.counter))
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

    /// The WQE at `idx`.
    fn entry(&mut self, idx: u16) -> &mut [u8] {
        let i = (idx as u32 & (self.cnt - 1)) as usize;
        // SAFETY: entry `i` lies inside the ring; the callers touch only WQEs in the list
        // (not posted, so the device does not read them) or the tail's link.
        unsafe { core::slice::from_raw_parts_mut(self.buf.add(i * self.stride), self.stride) }
    }

    fn write(&mut self, sgl: &[Sge], cookie: u64) -> Result<()> {
        let n = crate::queue::checks::check_recv(self.free(), sgl, self.max_sge)?;
        if let Some(lkey) = self.regions.as_mut().and_then(|r| r.on_demand(sgl)) {
            // A ConnectX that meets a page fault in an SRQ WQE has already moved past it:
            // it completes the WQE with REMOTE_ABORTED and vendor syndrome 0x93, and
            // rdma-core (`cq.c` `is_odp_pfault_err`, `srq.c` `mlx5_complete_odp_fault`)
            // swallows that CQE and reposts the WQE's data at the head. Only the poller sees
            // that CQE and only the poster writes the ring, so the direct path does not
            // repost: it refuses the receive rather than report a spurious error for it.
            return Err(Error::InvalidParameter {
                what: "SRQ receive in an on-demand region (lkey; the direct path cannot repost a page-faulted SRQ WQE)",
                value: lkey as u64,
            });
        }
        if let Some(share) = &mut self.cq_share {
            share.check_one(self.counter, self.cnt)?;
        }
        if self.head == self.tail {
            // Room for one more: link the oldest index the poller gave back after the
            // tail (rdma-core's free, done here by the only writer of the ring). `free > 0`
            // means one is there: the ring's entries are the list (the tail alone now), the
            // outstanding receives and the given-back indices not linked yet.
            let k = self.reclaimed;
            debug_assert_ne!(k, self.shared.cookies.retired());
            let idx = self.shared.freed_at(k);
            let tail = self.tail;
            set_next_index(self.entry(tail), idx);
            self.tail = idx;
            self.reclaimed = k.wrapping_add(1);
        }
        let head = self.head;
        let max = self.max_sge;
        let e = self.entry(head);
        encode_srq_recv(sgl, e).ok_or(Error::TooManySge { n, max })?;
        let next = next_index(e);
        // Nothing can fail from here on: the entry's regions are pinned until it completes.
        self.shared
            .scatter
            .record(head, sgl, self.regions.as_deref_mut());
        self.shared.cookies.set(head, cookie);
        self.head = next & (self.cnt - 1) as u16;
        self.counter = self.counter.wrapping_add(1);
        self.shared.cookies.mark_posted(self.counter);
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

    /// Posts one receive buffer list with its cookie.
    ///
    /// # Errors
    /// [`Error::QueueFull`], [`Error::TooManySge`], [`Error::CqFull`];
    /// [`Error::InvalidParameter`] for an entry of an on-demand region of the domain (its
    /// page faults would need a repost by the poller); nothing is posted then.
    pub fn post(&mut self, sgl: &[Sge], cookie: u64) -> Result<()> {
        self.write(sgl, cookie)?;
        self.ring();
        Ok(())
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
        super::rq::post_each(self, recvs, Self::write, Self::ring)
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
