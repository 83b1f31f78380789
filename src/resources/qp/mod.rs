//! Reliable-connected queue pairs ([`Qp`]): their state, connection and teardown; creation,
//! posting, memory windows and batches live in the files beside this one.

use super::cq::CqHandle;
use super::events::Subject;
use super::{Pd, QueuePair};
use crate::backend::{self};
use crate::data_path::DataPath;
use crate::direct::{RecvQueue, SendQueue};
use crate::error::{Error, Result};
use crate::queue::cq_share::Leaving;
use crate::verbs;
use crate::verbs::ex::VerbsApi;
use crate::verbs::objects::{Endpoint, Timing};
use crate::verbs::rq::VerbsRecvQueue;
use crate::verbs::sq::{VerbsBatch, VerbsSendQueue};
use std::sync::Arc;

mod batch;
mod create;
mod post;
mod windows;

pub use batch::Batch;
pub(crate) use create::RecvSide;

/// The data path a QP's queues run (which backend made it is [`backend::Qp`]'s business).
enum QpPath {
    Direct {
        sq: SendQueue,
        rq: Option<RecvQueue>,
    },
    /// `rq`: None when the QP takes its receives from an SRQ.
    Verbs {
        sq: VerbsSendQueue,
        rq: Option<VerbsRecvQueue>,
    },
}

/// A reliable-connected queue pair.
///
/// Created by [`Pd::create_qp`], connected once ([`Qp::connect`] with the peer's
/// [`Qp::endpoint`], exchanged out of band: [`crate::connect`]), then posted to through
/// `&mut self`: RDMA write (gather list, inline, with immediate), read, send, atomics,
/// memory-window binds, receives.
///
/// ```
/// # #[cfg(feature = "sim")] fn main() -> blueflame::Result<()> {
/// use blueflame::{Access, Completion, Device, Payload, PostFlags, PostSend, QpCaps, WcOpcode};
/// let dev = Device::sim_stepped();
/// let pd = dev.alloc_pd()?;
/// let (mut cq_a, mut cq_b) = (dev.create_cq(64)?, dev.create_cq(64)?);
/// let mut a = pd.create_qp(&cq_a, &cq_a, QpCaps::default())?;
/// let mut b = pd.create_qp(&cq_b, &cq_b, QpCaps::default())?;
/// let (ea, eb) = (a.endpoint()?, b.endpoint()?);
/// a.connect(&eb)?;
/// b.connect(&ea)?;
/// let mr = pd.alloc_mr(4096, Access::LOCAL_WRITE | Access::REMOTE_READ)?;
/// // B waits for a message; A sends one, then reads 8 bytes of B's region.
/// b.post_recv(&[mr.sge(0, 64)?], 10)?;
/// a.send(Payload::Inline(b"ping"), 1, PostFlags::SIGNALED)?;
/// mr.write(512, &42u64.to_le_bytes())?;
/// a.read(&[mr.sge(1024, 8)?], mr.remote(512)?, 2, PostFlags::SIGNALED)?;
/// dev.process();
/// let mut out = [Completion::default(); 4];
/// assert_eq!(cq_a.poll(&mut out), 2);
/// assert_eq!((out[0].cookie, out[1].cookie, out[1].opcode), (1, 2, WcOpcode::RdmaRead));
/// assert_eq!(cq_b.poll(&mut out), 1);
/// assert_eq!((out[0].cookie, out[0].opcode, out[0].byte_len), (10, WcOpcode::Recv, 4));
/// assert_eq!(mr.read_u64(1024)?, 42u64.to_le());
/// # Ok(()) }
/// # #[cfg(not(feature = "sim"))] fn main() {}
/// ```
pub struct Qp {
    // Field order: the queues go before the handles that keep their rings alive.
    path: QpPath,
    qpn: u32,
    psn: u32,
    /// Set by `connect`: posting before it is an invalid-state error.
    connected: bool,
    /// Set by `set_error`: the QP cannot be connected again.
    errored: bool,
    /// Set by a `connect` that left the QP in RTR and failed (then moved to error): like
    /// a connected QP, it may hold an SRQ's WQEs.
    reached_rtr: bool,
    /// What the device's atomics can do and how it writes their replies.
    atomics: mlx5::AtomicCaps,
    /// `QpCaps::rnr_retry`: the most RNR retries `connect` programs.
    rnr_retry_cap: u8,
    pd: Pd,
    cqs: [Arc<CqHandle>; 2],
    /// The backend's QP: destroyed in Drop, before the queues go (`None` after).
    obj: Option<backend::Qp>,
    /// The queues' charges on their CQs, taken off them in Drop and given back when this
    /// drops: after `path` and `obj`, so after the device QP is destroyed on either path
    /// (the verbs path's QP goes with the last of its queues).
    leaving: [Option<Leaving>; 2],
    /// Forgets the QP's events once it is destroyed (after `path` and `obj`): its number
    /// may come back with another QP.
    _forget: super::events::Forget,
    /// The SRQ the QP takes its receives from (destroyed after the QP).
    srq: Option<Arc<super::srq::SrqHandle>>,
    /// The rdma_cm id of a QP connected by librdmacm: dropped after the QP.
    _cm: Option<Arc<verbs::cm::CmId>>,
    /// The error of an inline write the verbs path refused, from the frame that posted it
    /// to its caller's (`Qp::write_inline_verbs`, `Qp::take_refusal`); None otherwise.
    refusal: Option<Error>,
    /// The keys peers invalidated through this QP, as its receive completions reported them
    /// (shared with its receive CQ's poller and the windows bound through it).
    invalidations: Arc<crate::queue::invalidations::Invalidations>,
}

impl core::fmt::Debug for Qp {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Qp")
            .field("qpn", &self.qpn)
            .field("path", &self.data_path())
            .field("verbs_api", &self.verbs_api())
            .finish()
    }
}

impl Qp {
    /// The verbs path's send queue (a test's handle on its provider semantics).
    #[cfg(test)]
    pub(crate) fn verbs_send_queue(&mut self) -> Option<&mut verbs::sq::VerbsSendQueue> {
        match &mut self.path {
            QpPath::Verbs { sq, .. } => Some(sq),
            _ => None,
        }
    }

    /// How the direct path rings this QP's doorbell (None on the verbs path): a BlueFlame
    /// register of its own, a shared one under its lock, or 8-byte doorbells only.
    pub fn doorbell_mode(&self) -> Option<crate::direct::DoorbellMode> {
        match &self.path {
            QpPath::Direct { sq, .. } => Some(sq.doorbell_mode()),
            QpPath::Verbs { .. } => None,
        }
    }

    /// What a peer needs to connect to this QP.
    ///
    /// # Errors
    /// [`Error::Verbs`] when the port or GID cannot be queried.
    pub fn endpoint(&self) -> Result<Endpoint> {
        self.obj()?.endpoint(self.qpn, self.psn)
    }

    /// The backend's QP (there until the drop).
    fn obj(&self) -> Result<&backend::Qp> {
        self.obj
            .as_ref()
            .ok_or(Error::InvalidState { state: "destroyed" })
    }

    /// Connects this QP to `remote`, the peer's [`Qp::endpoint`] (INIT -> RTR -> RTS: a QP
    /// is created in INIT, where it already takes receives, [`Qp::post_recv`]) with default
    /// timeouts and retries: `a.connect(&b.endpoint()?)?` and `b.connect(&a.endpoint()?)?`, or `let me = qp.endpoint()?; qp.connect(&me)?` for a
    /// loopback. Every device, the software NIC too, needs the whole endpoint: a QP number
    /// alone names no port, and on the software NIC as on a ConnectX a LID that is not the
    /// peer's, or a PSN other than the peer's first, gives a connection whose requests
    /// end in [`WcStatus::RetryExcErr`](crate::WcStatus::RetryExcErr).
    ///
    /// # Errors
    /// [`Error::Verbs`] (`Error::Sim` on the software NIC) when the transition is refused;
    /// [`Error::InvalidParameter`] for an endpoint without an address (no LID on
    /// InfiniBand, the software NIC's port included; no GID on RoCE or a global path), the
    /// QP left in INIT (its receives kept; connectable again).
    /// A refusal of the last step (RTR -> RTS) would leave the QP taking the peer's
    /// messages though it cannot send: it is moved to error (its receives flush), and a
    /// second `connect` is refused ([`Error::InvalidState`]); create a new QP.
    pub fn connect(&mut self, remote: &Endpoint) -> Result<()> {
        self.connect_with(remote, &Timing::default())
    }

    /// As [`Qp::connect`], with explicit timeouts and retries.
    ///
    /// # Errors
    /// As [`Qp::connect`].
    ///
    /// The RNR retry count programmed is the smaller of `timing.rnr_retry` and the QP's
    /// [`QpCaps::rnr_retry`](crate::QpCaps::rnr_retry) (7, retry for ever, being the largest). On the software NIC the
    /// four attributes drive its transport timers as on a ConnectX: a request with no answer
    /// is sent again every `4.096 us * 2^timeout` until `retry_cnt` retransmissions are spent
    /// (then `RetryExcErr`), and a send that meets no receive waits the peer's
    /// `min_rnr_timer` before each of `rnr_retry` retries (then `RnrRetryExcErr`).
    pub fn connect_with(&mut self, remote: &Endpoint, timing: &Timing) -> Result<()> {
        timing.check()?;
        let timing = &Timing {
            rnr_retry: timing.rnr_retry.min(self.rnr_retry_cap),
            ..*timing
        };
        if self.errored {
            return Err(Error::InvalidState {
                state: "in error: a QP connects only from INIT (create a new one)",
            });
        }
        if self.connected {
            return Err(Error::InvalidState {
                state: "connected: a QP connects only from INIT (create a new one)",
            });
        }
        // A peer's number (out of band, perhaps corrupt) is checked here as `UdQp::send_to`
        // and `DcPeer::new` check theirs: rdma-core hands it to the kernel as it is.
        if remote.qpn > 0xff_ffff {
            return Err(Error::InvalidParameter {
                what: "remote QP number (24 bits)",
                value: remote.qpn as u64,
            });
        }
        if let Err((e, receiving)) = self.obj()?.connect(remote, self.psn, timing) {
            if receiving {
                // Left in RTR (the move to RTS refused): it cannot send nor be connected
                // again, yet it takes the peer's messages (an SRQ's WQEs for them). To
                // error, so that its receives flush; its drop then leaves an SRQ as a
                // connected QP's does (`leave_the_srq`).
                self.reached_rtr = true;
                let _ = self.set_error();
            }
            return Err(e);
        }
        self.set_connected();
        Ok(())
    }

    /// Gather entries a send of this QP takes.
    pub(crate) fn max_send_sge(&self) -> usize {
        match &self.path {
            QpPath::Direct { sq, .. } => sq.limits().max_sge,
            QpPath::Verbs { sq, .. } => sq.max_sge(),
        }
    }

    /// The backend's QP, for a UD QP's multicast groups.
    pub(crate) fn backend_qp(&self) -> Option<&backend::Qp> {
        self.obj.as_ref()
    }

    /// Records that librdmacm connected the QP.
    pub(crate) fn mark_connected(&mut self) {
        self.set_connected();
    }

    /// Records that the QP is a UD QP ([`crate::UdQp`]'s, on the direct path): its send
    /// queue takes UD sends only.
    pub(crate) fn mark_ud(&mut self) {
        if let QpPath::Direct { sq, .. } = &mut self.path {
            sq.set_transport(crate::direct::Transport::Ud);
        }
    }

    fn set_connected(&mut self) {
        self.connected = true;
        if let QpPath::Direct { sq, .. } = &mut self.path {
            sq.enable_fast_path(true);
        }
    }

    /// Posting needs a connected QP (a QP in error is fine: its requests are flushed).
    #[inline(always)]
    fn check_state(&mut self) -> Result<()> {
        if self.connected {
            return Ok(());
        }
        self.refresh_connected()
    }

    /// A post before `connect` (slow path): refused, as on every backend (a QP is
    /// connected by its own `connect` only, as a ConnectX's RTR writes only its own
    /// context; one moved to error before it is in error, not connected).
    #[cold]
    fn refresh_connected(&mut self) -> Result<()> {
        Err(Error::InvalidState {
            state: if self.errored {
                "in error, never connected"
            } else {
                "not connected (INIT)"
            },
        })
    }

    /// The direct-path send queue of a connected QP (the crate's UD QPs post through it).
    /// Never handed out: a `&mut SendQueue` of a user's could be swapped with another QP's,
    /// which would then post into this QP's rings after they are freed (issue 25).
    ///
    /// ```compile_fail
    /// fn swap(a: &mut blueflame::Qp, b: &mut blueflame::Qp) {
    ///     core::mem::swap(a.direct_sq().unwrap(), b.direct_sq().unwrap());
    /// }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidState`] before `connect` (a request posted then would never run);
    /// [`Error::Unsupported`] on the verbs path.
    pub(crate) fn direct_sq(&mut self) -> Result<&mut SendQueue> {
        self.check_state()?;
        match &mut self.path {
            QpPath::Direct { sq, .. } => Ok(sq),
            QpPath::Verbs { .. } => {
                Err(Error::Unsupported("a direct send queue on the verbs path"))
            }
        }
    }

    /// A refused post: a queue or CQ that does not drain may be the sign of an
    /// asynchronous event (a CQ in error writes no completions, a failed device runs
    /// nothing): the device's events are read, and one about this QP, its CQs or the device
    /// is reported instead.
    #[cold]
    #[inline(never)]
    fn explain(&self, e: Error) -> Error {
        super::events::explain_refusal(e, || self.check())
    }

    /// What this QP's event subjects are: itself, its CQs, and the SRQ it receives from
    /// (its error: the QP's receives complete no more).
    fn subjects(&self) -> [Subject; 4] {
        [
            Subject::Qp(self.qpn),
            self.cqs[0].subject(),
            self.cqs[1].subject(),
            match &self.srq {
                Some(s) => s.error_subject(),
                None => Subject::Qp(self.qpn),
            },
        ]
    }

    /// The SRQ this QP takes its receives from (None: its own receive queue).
    pub fn srqn(&self) -> Option<u32> {
        self.srq.as_ref().map(|s| s.srqn)
    }

    /// Whether the device reported that this QP, which takes its receives from an SRQ and
    /// went to error, will take no more of them (`IBV_EVENT_QP_LAST_WQE_REACHED`): its
    /// receive completions are all written. Reads the device's events without blocking.
    pub fn last_wqe_reached(&self) -> bool {
        let dev = &self.pd.inner.dev;
        dev.events.has(&dev.backend, Subject::LastWqe(self.qpn))
    }

    /// Starts a batch (one doorbell for many requests).
    pub fn batch(&mut self) -> Batch<'_> {
        if let Err(Error::InvalidState { state }) = self.check_state() {
            return Batch::new(batch::Path::NotConnected(state));
        }
        match &mut self.path {
            QpPath::Direct { sq, .. } => Batch::new(batch::Path::Direct(sq.batch())),
            QpPath::Verbs { sq, .. } => Batch::new(batch::Path::Verbs(VerbsBatch::new(sq))),
        }
    }
}

impl QueuePair for Qp {
    fn qpn(&self) -> u32 {
        self.qpn
    }

    fn pd(&self) -> &Pd {
        &self.pd
    }

    fn data_path(&self) -> DataPath {
        match self.path {
            QpPath::Direct { .. } => DataPath::Direct,
            QpPath::Verbs { .. } => DataPath::Verbs,
        }
    }

    fn verbs_api(&self) -> Option<VerbsApi> {
        match &self.path {
            QpPath::Direct { .. } => None,
            QpPath::Verbs { sq, .. } => Some(sq.api()),
        }
    }

    fn free_send(&self) -> u32 {
        match &self.path {
            QpPath::Direct { sq, .. } => sq.free_blocks(),
            QpPath::Verbs { sq, .. } => sq.free(),
        }
    }

    fn send_depth(&self) -> u32 {
        match &self.path {
            QpPath::Direct { sq, .. } => sq.depth(),
            QpPath::Verbs { sq, .. } => sq.capacity(),
        }
    }

    fn free_recv(&self) -> u32 {
        match &self.path {
            QpPath::Direct { rq, .. } => rq.as_ref().map_or(0, |r| r.free()),
            QpPath::Verbs { rq, .. } => rq.as_ref().map_or(0, |r| r.free()),
        }
    }

    fn recv_depth(&self) -> u32 {
        match &self.path {
            QpPath::Direct { rq, .. } => rq.as_ref().map_or(0, |r| r.capacity()),
            QpPath::Verbs { rq, .. } => rq.as_ref().map_or(0, |r| r.capacity()),
        }
    }

    fn set_error(&mut self) -> Result<()> {
        self.errored = true;
        self.obj()?.set_error()
    }

    fn check(&self) -> Result<()> {
        let dev = &self.pd.inner.dev;
        dev.events.check(&dev.backend, &self.subjects())
    }
    fn atomic_caps(&self) -> mlx5::AtomicCaps {
        self.atomics
    }
}

impl Qp {
    /// How long a dropped QP on an SRQ waits for the device to say it will take no more of
    /// the SRQ's WQEs (a ConnectX answers in microseconds).
    const LAST_WQE_WAIT: std::time::Duration = std::time::Duration::from_millis(200);

    /// A connected QP on an SRQ leaves it as IBA 10.3.1 and the kernel's `ib_drain_qp`
    /// (`__ib_drain_srq`) do before it is destroyed: to error, then a wait (bounded) for
    /// `IBV_EVENT_QP_LAST_WQE_REACHED`. A receive WQE the QP took for a message still
    /// arriving then completes (a flush) instead of vanishing with the QP: destroyed at once,
    /// it would never come back to the SRQ, one slot lost for good per QP dropped
    /// mid-message. On the direct path the flush is discarded with the QP's other entries
    /// and its WQE given back to the SRQ (the CQ's tombstone, `Cq::poll`). On the verbs path
    /// rdma-core's mlx5 provider would remove the destroyed QP's entries from its CQs and
    /// give their WQEs back to its own SRQ list (`__mlx5_cq_clean`, `mlx5_free_srq_wqe`),
    /// where the crate's count of the SRQ's free entries (`Srq::free`) would never see them
    /// come back: the device QP is kept by its receive CQ until the poller has taken its
    /// completions through its dead entry, then destroyed (`Registry::defer`, in `Drop`).
    #[cold]
    fn leave_the_srq(&mut self) {
        if self.srq.is_none() || !(self.connected || self.reached_rtr) {
            return;
        }
        let dev = self.pd.inner.dev.clone();
        if !dev.backend.raises_last_wqe() {
            let _ = self.set_error();
            return;
        }
        if self.set_error().is_err() {
            return;
        }
        // The device raises the event on its own (the software NIC at the modify itself):
        // nothing is run here, so a stepped NIC's other queues do not move.
        let start = std::time::Instant::now();
        while !self.last_wqe_reached() && start.elapsed() < Self::LAST_WQE_WAIT {
            std::thread::yield_now();
        }
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        self.leave_the_srq();
        self.pd.inner.lifetimes.reclaim();
        // The queues' CQ charges stay whole until the device QP is gone (`leaving`'s field
        // order): the QP may complete into the CQs until then.
        self.leaving = match &mut self.path {
            QpPath::Direct { sq, rq, .. } => {
                // The register claim goes before the QP: once the QP and its thread domain are
                // freed, the device may give that register to another QP, which then claims
                // it as its own.
                sq.release_register();
                [sq.leave_cq(), rq.as_mut().and_then(RecvQueue::leave_cq)]
            }
            QpPath::Verbs { sq, rq, .. } => [
                sq.leave_cq(),
                rq.as_mut().and_then(VerbsRecvQueue::leave_cq),
            ],
        };
        // A QP that never left INIT (not connected, not moved to error, not connected by
        // librdmacm) completes nothing: its receives, never taken, are not flushed by the
        // destroy (to RESET), so their entries of the CQ go back with the QP (the verbs
        // path, which reads no ring, freed them only at the CQ's next empty poll).
        if !(self.connected || self.errored || self.reached_rtr || self._cm.is_some()) {
            for l in self.leaving.iter_mut().flatten() {
                l.completes_nothing();
            }
        }
        // rdma-core cleans a CQ of a destroyed QP's entries (`__mlx5_cq_clean`), but not a
        // CQ it handed to us: the direct path's CQs are ours. With the CQs' lists locked
        // (no QP can attach, so none can reuse this number yet), destroy the QP, after which
        // the device writes no entry for it, then leave a tombstone over the entries it may
        // still have in each CQ (`direct::teardown`).
        // On the direct path the backend's QP is the last owner of the device QP: it goes
        // now (the queues, dropped after, do not touch the rings again); on the verbs path
        // the queues hold rdma-core's QP too, destroyed when they drop (its CQs are
        // rdma-core's).
        let obj = &mut self.obj;
        let cqs = self.cqs.each_ref().map(|c| &**c);
        super::cq::destroy_and_bury(cqs, self.qpn, || drop(obj.take()));
        // A verbs-path QP on an SRQ: libmlx5's destroy would clean the receive completions
        // still in the CQ out of it (`__mlx5_cq_clean`) and the SRQ's slots they hold would
        // never come back; its device QP (with the charges and the events' forget that go
        // after it) is kept by the receive CQ until its poller has taken them (the QP is in
        // error and said it takes no more WQEs: `leave_the_srq`).
        // The SRQ's shared state (its receives' pins) is kept with it: a receive this QP
        // consumed may complete with its message in a CQE libmlx5 copies into the buffer
        // until the QP is destroyed.
        if let (QpPath::Verbs { sq, .. }, Some(srq)) = (&self.path, &self.srq) {
            let remains = Box::new(VerbsRemains {
                qp: sq.device_qp(),
                _leaving: core::mem::take(&mut self.leaving),
                _forget: self._forget.take(),
            });
            self.cqs[1].registry.defer(remains, srq.shared.clone());
        }
    }
}

/// A dropped verbs-path QP on an SRQ, kept by its receive CQ ([`crate::queue::registry::Remains`]).
/// Field order: the device QP is destroyed first, then its charges go back and its events
/// are forgotten.
struct VerbsRemains {
    qp: Arc<verbs::objects::Qp>,
    _leaving: [Option<Leaving>; 2],
    _forget: super::events::Forget,
}

impl crate::queue::registry::Remains for VerbsRemains {
    fn alone(&self) -> bool {
        Arc::strong_count(&self.qp) == 1
    }
}
