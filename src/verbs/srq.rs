//! The verbs path's poster of a shared receive queue (`ibv_post_srq_recv`); the SRQ itself
//! is an rdma-core object ([`super::objects::Srq`], re-exported here).
//!
//! Receives of an SRQ complete in any order (whichever QP a message arrives on takes the
//! next one). The poster gives each posted receive a slot of the SRQ's cookie table and
//! carries the slot in `wr_id` (with the receive tag); the poller takes the cookie from the
//! slot and gives the slot back through the same shared free ring as the direct path
//! (`crate::queue::srq_shared::SrqShared`).

use super::code;
use crate::error::{Error, QueueUnit, Result};
use crate::queue::cq_share::{CqShare, CqSlots};
use crate::queue::regions::{RegionCheck, Regions};
use crate::queue::srq_shared::SrqShared;
use mlx5::request::Sge;
use rdma_sys as ffi;
use std::sync::Arc;

pub use super::objects::Srq;

/// Marks an SRQ receive's `wr_id` (as a QP's receives: its slot is in the low 16 bits, the
/// SRQ's incarnation above them: `super::incarnation`).
pub(crate) const SRQ_RECV_TAG: u64 = super::rq::RECV_TAG;

/// The verbs path's poster of an SRQ.
pub struct VerbsSrq {
    srq: Arc<Srq>,
    cap: u32,
    max_sge: usize,
    pub(crate) shared: Arc<SrqShared>,
    /// Slots never used yet (the first `fresh` of the table have been handed out).
    fresh: u32,
    /// Slots given back and taken again so far.
    reclaimed: u16,
    /// Receives posted.
    counter: u16,
    sges: Box<[ffi::ibv_sge]>,
    /// The receive request, prepared once: `sg_list` points into `sges`, `next` is null.
    wr: Box<ffi::ibv_recv_wr>,
    cq_share: Option<CqShare>,
    /// The protection domain's regions, each receive's entries are pinned in (as
    /// [`VerbsRecvQueue`](super::rq::VerbsRecvQueue)'s).
    regions: Option<Box<RegionCheck>>,
    /// As [`VerbsRecvQueue`](super::rq::VerbsRecvQueue)'s: the provider copies small
    /// messages with the CPU (mlx5's `mlx5_copy_to_recv_srq`).
    provider_copies: bool,
}

// SAFETY: `wr` points into this poster's own `sges`; the SRQ is thread-safe in rdma-core.
unsafe impl Send for VerbsSrq {}

impl std::fmt::Debug for VerbsSrq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsSrq")
            .field("capacity", &self.cap)
            .field("counter", &self.counter)
            .finish()
    }
}

impl VerbsSrq {
    /// The poster of `srq`, whose completions name it as `srqn` (the crate's number).
    pub fn new(srq: Arc<Srq>, srqn: u32) -> VerbsSrq {
        let cap = srq.max_wr.clamp(1, 1 << 15);
        let max_sge = srq.max_sge.max(1) as usize;
        let (sges, wr) = super::rq::prepared_recv(max_sge);
        VerbsSrq {
            shared: Arc::new(
                SrqShared::new(srqn, cap.next_power_of_two(), max_sge)
                    .with_tag(SRQ_RECV_TAG | super::incarnation::next()),
            ),
            srq,
            cap,
            max_sge,
            fresh: 0,
            reclaimed: 0,
            counter: 0,
            sges,
            wr,
            cq_share: None,
            regions: None,
            provider_copies: false,
        }
    }

    /// As [`VerbsRecvQueue::check_against`](super::rq::VerbsRecvQueue::check_against).
    pub(crate) fn check_against(&mut self, regions: Arc<Regions>, provider_copies: bool) {
        self.regions = Some(Box::new(RegionCheck::new(regions)));
        self.provider_copies = provider_copies;
    }

    /// Accounts the SRQ's receives against the entries of the CQ they complete on.
    pub(crate) fn attach_cq(&mut self, slots: Arc<CqSlots>) {
        self.cq_share = Some(CqShare::new(slots, self.shared.clone(), self.counter));
    }

    /// Gives the CQ share away for the end of the SRQ (see the direct path's).
    pub(crate) fn take_cq_share(&mut self) -> Option<(CqShare, u16)> {
        self.cq_share.take().map(|s| (s, self.counter))
    }

    /// Receives the SRQ holds at once.
    pub fn capacity(&self) -> u32 {
        self.cap
    }

    /// Most scatter entries per receive.
    pub fn max_sge(&self) -> usize {
        self.max_sge
    }

    /// Receives that may be posted now.
    pub fn free(&self) -> u32 {
        self.cap.saturating_sub(self.shared.outstanding())
    }

    /// Posts one receive.
    ///
    /// # Errors
    /// [`Error::QueueFull`], [`Error::TooManySge`], [`Error::CqFull`], or the
    /// `ibv_post_srq_recv` error; [`Error::InvalidParameter`] with the length of an entry
    /// of 2^31 bytes or more, or with the lkey of an entry
    /// outside every CPU-writable region of the domain on a device whose provider copies
    /// small messages with the CPU (mlx5); nothing is posted then.
    pub fn post(&mut self, sgl: &[Sge], cookie: u64) -> Result<()> {
        if self.free() == 0 {
            return Err(Error::QueueFull {
                needed: 1,
                free: 0,
                unit: QueueUnit::Receives,
            });
        }
        let n = super::rq::fill_recv_sges(&mut self.sges, sgl)?;
        if let Some(share) = &mut self.cq_share {
            share.check_one(self.counter, self.cap)?;
        }
        // A slot: a fresh one while there are, else the oldest given back (`free() > 0`
        // means one of the two is there).
        let slot = if self.fresh < self.cap {
            self.fresh as u16
        } else {
            self.shared.freed_at(self.reclaimed)
        };
        let scatter = &self.shared.scatter;
        if let Some(lkey) = scatter.record(slot, sgl, self.regions.as_deref_mut()) {
            if self.provider_copies {
                scatter.done(slot);
                return Err(crate::queue::scatter::not_cpu_writable(lkey));
            }
        }
        // The tag and the SRQ's incarnation (the cookies' tag: `super::incarnation`).
        self.wr.wr_id = slot as u64 | self.shared.cookies.tag();
        self.wr.num_sge = n as i32;
        self.shared.cookies.set(slot, cookie);
        let mut bad = std::ptr::null_mut();
        // SAFETY: live SRQ; `wr` and its scatter list (in this poster's boxes) live across
        // the call, which copies them.
        let rc = unsafe { ffi::ibv_post_srq_recv(self.srq.srq, &mut *self.wr, &mut bad) };
        if rc != 0 {
            self.shared.scatter.done(slot);
            return Err(Error::Verbs(code("ibv_post_srq_recv", rc)));
        }
        if self.fresh < self.cap {
            self.fresh += 1;
        } else {
            self.reclaimed = self.reclaimed.wrapping_add(1);
        }
        self.counter = self.counter.wrapping_add(1);
        self.shared.cookies.mark_posted(self.counter);
        Ok(())
    }
}
