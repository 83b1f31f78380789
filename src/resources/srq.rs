//! Shared receive queues: one pool of receives for many QPs (and DCTs).
//!
//! An [`Srq`] is bound to one receive CQ when it is created (as UCX binds its SRQ to the
//! interface's receive CQ): every receive posted to it is charged to that CQ, so the crate's
//! CQ accounting stays exact, and every QP that takes its receives from it completes them
//! there ([`Pd::create_qp_with_srq`]). A receive completion names the QP the message
//! arrived on ([`Completion::qpn`](crate::Completion::qpn)) and carries the SRQ receive's
//! cookie.

use super::cq::CqHandle;
use super::events::Subject;
use super::{Cq, Pd};
use crate::backend::{self, SrqRings};
use crate::direct::SrqRing;
use crate::error::{Error, Result};
use crate::queue::cq_share::CqShare;
use crate::queue::srq_shared::SrqShared;
use crate::verbs::srq::VerbsSrq;
use mlx5::request::Sge;
use std::sync::{Arc, Mutex};

/// The limits of a shared receive queue.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct SrqCaps {
    /// Receives the SRQ holds at once (the device may give more; at most 32767).
    pub entries: u32,
    /// Scatter entries per receive (at most 31).
    pub max_sge: u32,
}

impl Default for SrqCaps {
    /// 255 receives of up to 4 entries (a ring of 256 WQEs of 128 bytes on mlx5).
    fn default() -> Self {
        SrqCaps {
            entries: 255,
            max_sge: 4,
        }
    }
}

enum SrqPath {
    Direct(SrqRing),
    Verbs(VerbsSrq),
}

/// The device SRQ, kept alive by the [`Srq`] and every QP that takes receives from it.
pub(crate) struct SrqHandle {
    pub(crate) srqn: u32,
    pub(crate) shared: Arc<SrqShared>,
    /// The backend's SRQ (`None` only once destroyed).
    pub(crate) obj: Option<backend::Srq>,
    pub(crate) pd: Pd,
    /// The CQ the SRQ's receives complete on.
    pub(crate) cq: Arc<CqHandle>,
    pub(crate) cqn: u32,
    /// The SRQ's CQ entries, handed over by the verbs poster when it is dropped (the direct
    /// path's ring writer keeps its own): given back when the SRQ is destroyed (receives
    /// posted before may complete until then).
    share: Mutex<Option<(CqShare, u16)>>,
}

impl SrqHandle {
    /// Makes receiver `qpn` (a QP or DCT just created on the device with this SRQ, whose
    /// receives complete on `cq`) take its receive completions from this SRQ on the
    /// poller's side: checks the CQ, lists the receiver on it with the SRQ's cookie table
    /// (and, for an RC QP, where its receives record the keys peers invalidate).
    /// Returns the handle the receiver must hold (the SRQ outlives it). Every receiver of an
    /// SRQ goes through here (`Pd::create_qp_with_srq` for RC QPs); on the software NIC the
    /// device side is `State::attach_receiver` (`mlx5/src/sim/srq.rs`).
    ///
    /// # Errors
    /// [`Error::SrqCq`].
    pub(crate) fn attach_receiver(
        self: &Arc<Self>,
        cq: &Arc<CqHandle>,
        cqn: u32,
        qpn: u32,
        invalidations: Option<Arc<crate::queue::invalidations::Invalidations>>,
    ) -> Result<Arc<SrqHandle>> {
        if !Arc::ptr_eq(cq, &self.cq) {
            return Err(Error::SrqCq {
                srqn: self.srqn,
                srq_cq: self.cqn,
                cq: cqn,
            });
        }
        cq.registry.attach(crate::queue::registry::Attached {
            qpn,
            sq: None,
            rq: None,
            scatter: None,
            srq: Some(self.shared.clone()),
            invalidations,
        });
        Ok(self.clone())
    }

    /// What the device's events call this SRQ.
    fn subject(&self) -> Subject {
        match &self.obj {
            Some(s) => s.subject(),
            None => Subject::Srq(self.srqn as u64),
        }
    }

    /// What the device's events call this SRQ's error (`IBV_EVENT_SRQ_ERR`): kept, unlike
    /// its limit, and reported by its receivers' checks too.
    pub(crate) fn error_subject(&self) -> Subject {
        match self.subject() {
            Subject::Srq(id) => Subject::SrqError(id),
            other => other,
        }
    }

    /// Reads the device's events: an error of this SRQ, or of the whole device, as
    /// [`Error::AsyncEvent`].
    fn check(&self) -> Result<()> {
        let dev = &self.pd.inner.dev;
        dev.events.check(&dev.backend, &[self.error_subject()])
    }

    /// The backend's SRQ, for a receiver created on it.
    pub(crate) fn obj(&self) -> Result<&backend::Srq> {
        self.obj.as_ref().ok_or(Error::InvalidState {
            state: "SRQ destroyed",
        })
    }
}

impl Drop for SrqHandle {
    fn drop(&mut self) {
        // No QP takes receives from it any more (each holds this handle): nothing writes
        // its ring from now on (a page fault polled later gives its WQE back), then destroy
        // it, after which nothing completes on its behalf.
        let writer = self.shared.close_writer();
        // What the device's events call it, taken while the object is there: without it
        // the subject fell back to the SRQ number, which is not what rdma-core devices
        // name it by (the `ibv_srq`'s address), so its events were never forgotten and a
        // later SRQ at that address reported its limit reached (a review's finding).
        let subjects = [self.subject(), self.error_subject()];
        drop(self.obj.take());
        let poster = self.share.lock().unwrap_or_else(|e| e.into_inner()).take();
        for (mut s, pos) in writer.into_iter().chain(poster) {
            s.release(pos);
        }
        // Its events once it is destroyed (see `events::Forget`).
        for s in subjects {
            self.pd.inner.dev.events.forget(s);
        }
    }
}

/// A shared receive queue.
///
/// Created by [`Pd::create_srq`] on one receive CQ; QPs created with
/// [`Pd::create_qp_with_srq`] take their receives from it, whichever QP a message arrives
/// on. [`Srq::set_limit`] arms the limit event ([`Srq::limit_reached`]): the moment to post
/// more. The SRQ lives on while a QP uses it (dropping it stops posting, not the QPs).
///
/// ```
/// # #[cfg(feature = "sim")] fn main() -> blueflame::Result<()> {
/// use blueflame::{Access, Completion, Device, Payload, PostFlags, PostSend, QpCaps, QueuePair, SrqCaps, WcOpcode};
/// let dev = Device::sim_stepped();
/// let pd = dev.alloc_pd()?;
/// let (mut rcq, mut scq) = (dev.create_cq(64)?, dev.create_cq(64)?);
/// let mut srq = pd.create_srq(&rcq, SrqCaps { entries: 15, ..SrqCaps::default() })?;
/// let mr = pd.alloc_mr(1024, Access::LOCAL_WRITE)?;
/// for i in 0..4u64 {
///     srq.post_recv(&[mr.sge(64 * i as usize, 64)?], 100 + i)?;
/// }
/// // Two servers on the SRQ, each connected to a client.
/// let mut servers = Vec::new();
/// let mut clients = Vec::new();
/// for _ in 0..2 {
///     let mut s = pd.create_qp_with_srq(&scq, &srq, QpCaps::default())?;
///     let mut c = pd.create_qp(&scq, &scq, QpCaps::default())?;
///     let (es, ec) = (s.endpoint()?, c.endpoint()?);
///     s.connect(&ec)?;
///     c.connect(&es)?;
///     servers.push(s);
///     clients.push(c);
/// }
/// let mut out = [Completion::default(); 4];
/// clients[1].send(Payload::Inline(b"from 1"), 1, PostFlags::SIGNALED)?;
/// dev.process();
/// // The oldest receive takes the message, whichever QP it arrived on.
/// assert_eq!(rcq.poll(&mut out), 1);
/// assert_eq!((out[0].cookie, out[0].qpn, out[0].opcode), (100, servers[1].qpn(), WcOpcode::Recv));
/// clients[0].send(Payload::Inline(b"from 0"), 0, PostFlags::SIGNALED)?;
/// dev.process();
/// assert_eq!(rcq.poll(&mut out), 1);
/// assert_eq!((out[0].cookie, out[0].qpn), (101, servers[0].qpn()));
/// let mut got = [0u8; 6];
/// mr.read(0, &mut got)?;
/// assert_eq!(&got, b"from 1");
/// assert_eq!(scq.poll(&mut out), 2);
/// # Ok(()) }
/// # #[cfg(not(feature = "sim"))] fn main() {}
/// ```
pub struct Srq {
    // Field order: the poster goes before the handle that keeps its ring alive.
    path: SrqPath,
    pub(crate) handle: Arc<SrqHandle>,
}

impl core::fmt::Debug for Srq {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Srq")
            .field("srqn", &self.handle.srqn)
            .field("cqn", &self.handle.cqn)
            .field("capacity", &self.capacity())
            .finish()
    }
}

impl Pd {
    /// Creates a shared receive queue whose receives complete on `recv_cq`
    /// (`ibv_create_srq`; on mlx5 its ring from `mlx5dv_init_obj`).
    ///
    /// # Errors
    /// [`Error::InvalidHandle`] for a CQ of another device; [`Error::InvalidParameter`] for
    /// 0 or more than 32767 entries, or more than 31 scatter entries;
    /// [`Error::Unsupported`] on a CQ that compresses its entries (an SRQ's completions
    /// are attributed one by one), and on mlx5's direct path with `MLX5_SRQ_SIGNATURE` set
    /// (rdma-core would create it with WQE signatures the direct path does not write); the
    /// device's refusal ([`Error::Verbs`], `Error::Sim`).
    pub fn create_srq(&self, recv_cq: &Cq, caps: SrqCaps) -> Result<Srq> {
        if !recv_cq.dev.same(&self.inner.dev) {
            return Err(Error::InvalidHandle {
                what: "receive CQ of another device (CQ number)",
                value: recv_cq.cqn() as u64,
            });
        }
        if caps.entries == 0 || caps.entries >= 1 << 15 {
            return Err(Error::InvalidParameter {
                what: "SRQ entries (1 ..= 32767)",
                value: caps.entries as u64,
            });
        }
        if caps.max_sge > 31 {
            return Err(Error::InvalidParameter {
                what: "SRQ scatter entries (at most 31)",
                value: caps.max_sge as u64,
            });
        }
        if recv_cq.compressed() {
            return Err(Error::Unsupported(
                "an SRQ on a CQ that compresses its entries",
            ));
        }
        let slots = recv_cq.handle.registry.slots.clone();
        let (obj, rings, srqn) = self
            .inner
            .pd
            .create_srq(caps.entries, caps.max_sge.max(1))?;
        let mut path = match rings {
            // SAFETY: the ring belongs to the SRQ just created, fresh; this Srq alone posts to
            // it (rdma-core is never asked to), and the handle destroys it only after every
            // QP on it.
            SrqRings::Direct(raw) => SrqPath::Direct(unsafe { SrqRing::new(&raw)? }),
            SrqRings::Verbs(s) => SrqPath::Verbs(VerbsSrq::new(s, srqn)),
        };
        let shared = match &mut path {
            SrqPath::Direct(r) => {
                r.check_against(
                    self.inner.regions.clone(),
                    self.inner.dev.odp_caps().srq_recv(),
                );
                r.attach_cq(slots);
                r.shared.clone()
            }
            SrqPath::Verbs(v) => {
                v.check_against(
                    self.inner.regions.clone(),
                    self.inner.dev.provider_copies_receives(),
                );
                v.attach_cq(slots);
                v.shared.clone()
            }
        };
        Ok(Srq {
            path,
            handle: Arc::new(SrqHandle {
                srqn,
                shared,
                obj: Some(obj),
                pd: self.clone(),
                cq: recv_cq.handle.clone(),
                cqn: recv_cq.cqn(),
                share: Mutex::new(None),
            }),
        })
    }
}

impl Srq {
    /// The SRQ number (on the verbs path of a device other than mlx5, a number of the
    /// crate's own with bit 31 set: rdma-core does not report it).
    pub fn srqn(&self) -> u32 {
        self.handle.srqn
    }

    /// The number of the CQ the SRQ's receives complete on.
    pub fn cqn(&self) -> u32 {
        self.handle.cqn
    }

    /// Receives the SRQ holds at once (at least what was asked: the device rounds up).
    pub fn capacity(&self) -> u32 {
        match &self.path {
            SrqPath::Direct(r) => r.capacity(),
            SrqPath::Verbs(v) => v.capacity(),
        }
    }

    /// Most scatter entries per receive.
    pub fn max_sge(&self) -> usize {
        match &self.path {
            SrqPath::Direct(r) => r.max_sge(),
            SrqPath::Verbs(v) => v.max_sge(),
        }
    }

    /// Receives that may be posted now.
    pub fn free(&self) -> u32 {
        match &self.path {
            SrqPath::Direct(r) => r.free(),
            SrqPath::Verbs(v) => v.free(),
        }
    }

    /// Posts a receive buffer list with its cookie: the next message that arrives on any
    /// QP of the SRQ (when this is the oldest receive posted) lands in it.
    ///
    /// # Errors
    /// [`Error::QueueFull`] when the SRQ is full; [`Error::TooManySge`];
    /// [`Error::CqFull`] when the SRQ's CQ has no entry for it;
    /// [`Error::InvalidParameter`] with the length of an entry of 2^31 bytes or more; on
    /// the direct path (mlx5
    /// and the software NIC), [`Error::InvalidParameter`] with the lkey for an entry in an
    /// on-demand or dma-buf region when the device does not page SRQ receives
    /// ([`OdpCaps::srq_recv`](crate::OdpCaps::srq_recv)); nothing is posted then.
    ///
    /// Receives into on-demand and dma-buf memory may meet a page fault on the device (the
    /// exporter moved the buffer, the kernel invalidated the pages): a ConnectX then
    /// completes the WQE with REMOTE_ABORTED, vendor syndrome 0x93, and the sender sends
    /// again. That is no completion of yours: the poller posts the receive again (cookie and
    /// buffers unchanged), as rdma-core's `mlx5_complete_odp_fault` does, and it completes
    /// with a later message.
    pub fn post_recv(&mut self, sgl: &[Sge], cookie: u64) -> Result<()> {
        match &mut self.path {
            SrqPath::Direct(r) => r.post(sgl, cookie),
            SrqPath::Verbs(v) => v.post(sgl, cookie),
        }
        .map_err(|e| self.explain(e))
    }

    /// A refused post: an SRQ that stays full may have failed; its error (or the
    /// device's) is reported instead, as [`Qp`](crate::Qp)'s refusals do.
    #[cold]
    #[inline(never)]
    fn explain(&self, e: Error) -> Error {
        super::events::explain_refusal(e, || self.handle.check())
    }

    /// Reads the device's asynchronous events without blocking and reports the SRQ's
    /// failure (`IBV_EVENT_SRQ_ERR`: its receives complete no more) or the device's.
    ///
    /// # Errors
    /// [`Error::AsyncEvent`] with [`AsyncEvent::SrqError`](crate::AsyncEvent::SrqError),
    /// [`AsyncEvent::PortError`](crate::AsyncEvent::PortError) or
    /// [`AsyncEvent::DeviceFatal`](crate::AsyncEvent::DeviceFatal).
    pub fn check(&self) -> Result<()> {
        self.handle.check()
    }

    /// Arms the limit: once fewer than `limit` receives remain posted, the device raises
    /// one event ([`Srq::limit_reached`] says true once) and disarms it
    /// (`ibv_modify_srq` with `IBV_SRQ_LIMIT`). 0 disarms.
    ///
    /// # Errors
    /// [`Error::InvalidParameter`] for a limit above the SRQ's capacity; the device's
    /// refusal (rxe refuses a limit above the receives posted at the time).
    pub fn set_limit(&mut self, limit: u32) -> Result<()> {
        if limit > self.capacity() {
            return Err(Error::InvalidParameter {
                what: "SRQ limit (at most the SRQ's capacity)",
                value: limit as u64,
            });
        }
        // A new arming: an event of the previous one is forgotten.
        let dev = &self.handle.pd.inner.dev;
        dev.events.take(&dev.backend, self.handle.subject());
        self.handle.obj()?.set_limit(limit)
    }

    /// Whether the limit armed by [`Srq::set_limit`] was reached since (reads the device's
    /// events without blocking; true once per arming).
    pub fn limit_reached(&self) -> bool {
        let dev = &self.handle.pd.inner.dev;
        dev.events.take(&dev.backend, self.handle.subject())
    }

    /// Checks that `cq` is this SRQ's CQ, as every receiver of the SRQ's must complete its
    /// receives there.
    ///
    /// # Errors
    /// [`Error::SrqCq`].
    pub(crate) fn check_cq(&self, cq: &Cq) -> Result<()> {
        if !Arc::ptr_eq(&cq.handle, &self.handle.cq) {
            return Err(Error::SrqCq {
                srqn: self.handle.srqn,
                srq_cq: self.handle.cqn,
                cq: cq.cqn(),
            });
        }
        Ok(())
    }
}

impl Drop for Srq {
    fn drop(&mut self) {
        let share = match &mut self.path {
            // The ring's writer keeps its share: it may post a page-faulted receive again
            // until the SRQ is destroyed (`SrqHandle::drop`).
            SrqPath::Direct(_) => None,
            SrqPath::Verbs(v) => v.take_cq_share(),
        };
        *self.handle.share.lock().unwrap_or_else(|e| e.into_inner()) = share;
        self.handle.pd.inner.lifetimes.reclaim();
    }
}
