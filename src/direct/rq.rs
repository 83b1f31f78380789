//! The receive queue of the direct path.

use super::barrier;
use crate::error::{Error, Result};
use crate::queue::checks::check_recv;
use crate::queue::cq_share::{CqShare, CqSlots};
use crate::queue::regions::{RegionCheck, Regions};
use crate::queue::scatter::ScatterTable;
use crate::queue::shadow::Shadow;
use core::sync::atomic::{AtomicU32, Ordering};
use mlx5::doorbell::RCV_DBR;
use mlx5::recv::encode_recv;
use mlx5::request::Sge;
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
    pub unsafe fn new(raw: &RawQp) -> Result<Option<RecvQueue>> {
        if raw.rq_wqe_cnt == 0 {
            return Ok(None);
        }
        if !raw.rq_wqe_cnt.is_power_of_two()
            || raw.rq_stride < 16
            || !raw.rq_stride.is_power_of_two()
        {
            return Err(Error::InvalidParameter {
                what: "receive ring",
                value: raw.rq_wqe_cnt as u64,
            });
        }
        let max_sge = (raw.max_recv_sge as usize).min(raw.rq_stride as usize / 16);
        Ok(Some(RecvQueue {
            buf: raw.rq_buf,
            cnt: raw.rq_wqe_cnt,
            stride: raw.rq_stride as usize,
            max_sge,
            dbrec: raw.dbrec,
            head: 0,
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
    }

    /// Receives posted and not yet completed.
    pub(crate) fn outstanding(&self) -> u32 {
        self.head.wrapping_sub(self.shadow.retired()) as u32
    }

    /// The queue goes away: its allowance on the CQ is free at once, its posted receives
    /// once their completions are consumed.
    pub(crate) fn release_cq(&mut self) {
        if let Some(s) = &mut self.cq_share {
            s.release(self.head);
        }
    }

    /// Entries free for new receives.
    #[inline]
    pub fn free(&self) -> u32 {
        self.cnt - self.head.wrapping_sub(self.shadow.retired()) as u32
    }

    fn write(&mut self, sgl: &[Sge], cookie: u64) -> Result<()> {
        let n = check_recv(self.cnt - self.outstanding(), sgl, self.max_sge)?;
        let idx = (self.head as u32 & (self.cnt - 1)) as usize;
        // SAFETY: entry `idx` is free (retired by the poller, or never posted) and not yet
        // announced through the record, so the device does not read it; it lies inside the ring.
        let entry = unsafe {
            core::slice::from_raw_parts_mut(self.buf.add(idx * self.stride), self.stride)
        };
        encode_recv(sgl, entry).ok_or(Error::TooManySge {
            n,
            max: self.max_sge,
        })?;
        // The CQ last (the entry written above is not announced until `head` moves).
        if let Some(share) = &mut self.cq_share {
            share.check_one(self.head, self.cnt)?;
        }
        // Nothing can fail from here on: the entry's regions are pinned until it completes.
        let regions = self.regions.as_deref_mut();
        match sgl {
            [s] if s.len != 0 => self.scatter.record_one(self.head, s, regions),
            _ => self.scatter.record(self.head, sgl, regions),
        };
        self.shadow.set(self.head, cookie);
        self.head = self.head.wrapping_add(1);
        self.shadow.mark_posted(self.head);
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
