//! Queue pairs: one user API over the direct path (software NIC, and mlx5 once the mlx5dv
//! binding is wired) and the verbs path (any rdma-core device).

use super::cq::CqHandle;
use super::events::Subject;
use super::{Cq, Pd, QpCaps};
use crate::backend::{self, QpKind, QpRings, QpSpec};
use crate::direct::{self, RecvQueue, SendQueue};
use crate::error::{Error, Result};
use crate::mlx5_env::Mlx5Env;
use crate::queue::flags::PostFlags;
use crate::queue::registry::Attached;
use crate::verbs;
use crate::verbs::ex::VerbsApi;
use crate::verbs::objects::{PathInfo, Timing};
use crate::verbs::rq::VerbsRecvQueue;
use crate::verbs::sq::WindowBind;
use crate::verbs::sq::{VerbsBatch, VerbsSendQueue};
use crate::{DataPath, Payload, Remote, Request, Sge};
use std::sync::Arc;

/// What a peer needs to connect to a QP: exchange it out of band (see [`crate::connect`]).
pub type Endpoint = PathInfo;

impl From<u32> for Endpoint {
    /// The endpoint of a QP of the same software NIC (only its number matters there).
    fn from(qpn: u32) -> Endpoint {
        PathInfo {
            qpn,
            ..PathInfo::default()
        }
    }
}

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
/// use blueflame::{Access, Completion, Device, Payload, PostFlags, QpCaps, WcOpcode};
/// let dev = Device::sim_stepped();
/// let pd = dev.alloc_pd()?;
/// let (mut cq_a, mut cq_b) = (dev.create_cq(64)?, dev.create_cq(64)?);
/// let mut a = pd.create_qp(&cq_a, &cq_a, QpCaps::default())?;
/// let mut b = pd.create_qp(&cq_b, &cq_b, QpCaps::default())?;
/// let (ea, eb) = (a.endpoint()?, b.endpoint()?);
/// a.connect(eb)?;
/// b.connect(ea)?;
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
    /// What the device's atomics can do and how it writes their replies.
    atomics: mlx5::AtomicCaps,
    /// `QpCaps::rnr_retry`: the most RNR retries `connect` programs.
    rnr_retry_cap: u8,
    pd: Pd,
    cqs: [Arc<CqHandle>; 2],
    /// The backend's QP: destroyed in Drop, before the queues go (`None` after).
    obj: Option<backend::Qp>,
    /// The SRQ the QP takes its receives from (destroyed after the QP).
    srq: Option<Arc<super::srq::SrqHandle>>,
    /// The rdma_cm id of a QP connected by librdmacm: dropped after the QP.
    _cm: Option<Arc<verbs::cm::CmId>>,
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

impl Pd {
    /// Creates an RC QP whose sends complete on `send_cq` and receives on `recv_cq` (they
    /// may be the same CQ).
    ///
    /// # Errors
    /// [`Error::InvalidHandle`] when a CQ belongs to another device (another software NIC
    /// or verbs context); [`Error::Verbs`] (`Error::Sim` on the software NIC) for
    /// capabilities the device refuses.
    pub fn create_qp(&self, send_cq: &Cq, recv_cq: &Cq, caps: QpCaps) -> Result<Qp> {
        self.create_qp_with(send_cq, recv_cq, caps, None)
    }

    /// As [`Pd::create_qp`]; with `cm`, the QP is created through librdmacm on that id.
    pub(crate) fn create_qp_with(
        &self,
        send_cq: &Cq,
        recv_cq: &Cq,
        caps: QpCaps,
        cm: Option<Arc<verbs::cm::CmId>>,
    ) -> Result<Qp> {
        let recv = RecvSide::cq(recv_cq);
        self.create_qp_on(send_cq, recv, caps, cm)
    }

    /// Creates an RC QP whose sends complete on `send_cq` and that takes its receives from
    /// `srq` (`srq` in `ibv_qp_init_attr`): they complete on the SRQ's CQ, and
    /// [`Qp::post_recv`] is refused ([`Error::SrqQp`]); `caps.rq_entries` and
    /// `caps.max_recv_sge` are not used. The QP keeps the SRQ alive.
    ///
    /// # Errors
    /// [`Error::InvalidHandle`] for a send CQ of another device or an SRQ of another
    /// protection domain; as [`Pd::create_qp`].
    pub fn create_qp_with_srq(&self, send_cq: &Cq, srq: &super::Srq, caps: QpCaps) -> Result<Qp> {
        let h = &srq.handle;
        if !Arc::ptr_eq(&h.pd.inner, &self.inner) {
            return Err(Error::InvalidHandle {
                what: "SRQ of another protection domain (SRQ number)",
                value: h.srqn as u64,
            });
        }
        let recv = RecvSide {
            handle: &h.cq,
            cqn: h.cqn,
            dev: &h.pd.inner.dev,
            srq: Some(h),
        };
        let caps = QpCaps {
            rq_entries: 0,
            ..caps
        };
        self.create_qp_on(send_cq, recv, caps, None)
    }

    fn create_qp_on(
        &self,
        send_cq: &Cq,
        recv: RecvSide<'_>,
        caps: QpCaps,
        cm: Option<Arc<verbs::cm::CmId>>,
    ) -> Result<Qp> {
        if caps.rnr_retry > 7 {
            return Err(Error::InvalidParameter {
                what: "rnr_retry (at most 7: a 3-bit field, 7 retries for ever)",
                value: caps.rnr_retry as u64,
            });
        }
        self.check_cqs(send_cq, recv.dev, recv.cqn)?;
        // rdma-core's MLX5_* switches, read once for this QP (rdma-core reads them when it
        // creates the QP).
        let env = Mlx5Env::current();
        let srq = recv.srq.map(|s| s.obj()).transpose()?;
        let spec = QpSpec {
            caps,
            send_cq: &send_cq.handle.kind,
            kind: QpKind::Rc {
                recv_cq: &recv.handle.kind,
                srq,
                cm: cm.as_ref(),
            },
            env: &env,
        };
        let made = self.inner.pd.create_qp(&spec)?;
        self.assemble(made, send_cq, recv, &env, caps.rnr_retry, cm)
    }

    /// Refuses CQs of another device: CQ and QP numbers are per device, so a foreign CQ
    /// would get this device's completions for its own CQ of that number, and its poller
    /// would take them for its own QP of the same number.
    pub(crate) fn check_cqs(
        &self,
        send_cq: &Cq,
        recv_dev: &super::Device,
        recv_cqn: u32,
    ) -> Result<()> {
        for (dev, cqn, what) in [
            (
                &send_cq.dev,
                send_cq.cqn(),
                "send CQ of another device (CQ number)",
            ),
            (
                recv_dev,
                recv_cqn,
                "receive CQ of another device (CQ number)",
            ),
        ] {
            if !dev.same(&self.inner.dev) {
                return Err(Error::InvalidHandle {
                    what,
                    value: cqn as u64,
                });
            }
        }
        Ok(())
    }

    /// A QP the backend made, with its queues: the send and receive queues of its data
    /// path over its rings (or rdma-core's QP), attached to their CQs (registries and CQ
    /// accounting), their regions and window bookkeeping, the post flags of the device.
    pub(crate) fn assemble(
        &self,
        (obj, rings, qpn): (backend::Qp, QpRings, u32),
        send_cq: &Cq,
        recv: RecvSide<'_>,
        env: &Mlx5Env,
        rnr_retry: u8,
        cm: Option<Arc<verbs::cm::CmId>>,
    ) -> Result<Qp> {
        let mut path = match rings {
            QpRings::Direct { raw, dedicated } => {
                // SAFETY: the rings belong to the QP `obj` owns, which this Qp alone posts
                // to (rdma-core is never asked to) and destroys in its drop, before the
                // queues go, which then touch the rings no more; with `dedicated`, its
                // register is this QP's alone (a thread domain of its own).
                let sq = unsafe {
                    if dedicated {
                        SendQueue::new_dedicated(&raw)?
                    } else {
                        SendQueue::new(&raw)?
                    }
                };
                // SAFETY: as above, for the receive ring.
                let rq = unsafe { RecvQueue::new(&raw)? };
                QpPath::Direct { sq, rq }
            }
            QpRings::Verbs { qp, legacy_gather } => {
                let mut sq = VerbsSendQueue::new(qp.clone());
                sq.set_gather_lists_legacy(legacy_gather);
                let rq = recv.srq.is_none().then(|| VerbsRecvQueue::new(qp));
                QpPath::Verbs { sq, rq }
            }
            QpRings::None => return Err(Error::Unsupported("a QP without queues")),
        };
        // Every receive pins the regions it lands in until it completes.
        match &mut path {
            QpPath::Direct { rq: Some(rq), .. } => rq.check_against(self.inner.regions.clone()),
            QpPath::Verbs { rq: Some(rq), .. } => rq.check_against(
                self.inner.regions.clone(),
                self.inner.dev.provider_copies_receives(),
            ),
            _ => {}
        }
        let (sq_shadow, rq_shadow, scatter) = match &path {
            QpPath::Direct { sq, rq, .. } => (
                sq.shadow.clone(),
                rq.as_ref().map(|r| r.shadow.clone()),
                rq.as_ref().map(|r| r.scatter.clone()),
            ),
            QpPath::Verbs { sq, rq, .. } => (
                sq.shadow.clone(),
                rq.as_ref().map(|r| r.shadow.clone()),
                rq.as_ref().map(|r| r.scatter.clone()),
            ),
        };
        self.inner.lifetimes.track(&sq_shadow);
        send_cq.handle.registry.attach(Attached {
            qpn,
            sq: Some(sq_shadow),
            rq: None,
            scatter: None,
            srq: None,
        });
        let srq = match recv.srq {
            // The QP's receive completions come from the SRQ's table.
            Some(s) => Some(s.attach_receiver(recv.handle, recv.cqn, qpn)?),
            None => {
                recv.handle.registry.attach(Attached {
                    qpn,
                    sq: None,
                    rq: rq_shadow,
                    scatter,
                    srq: None,
                });
                None
            }
        };
        let psn = backend::initial_psn(qpn);
        // The device's atomics, read once here: what it lacks is refused before posting.
        let atomics = self.inner.dev.atomic_caps();
        // CQ accounting: each queue holds entries of the CQ it completes on.
        let (sslots, rslots) = (&send_cq.handle.registry.slots, &recv.handle.registry.slots);
        match &mut path {
            QpPath::Direct { sq, rq, .. } => {
                // An RC QP's queue (a UD QP's is marked by `Qp::mark_ud`).
                sq.set_transport(crate::direct::Transport::Rc);
                sq.set_atomic_caps(atomics);
                // The driver side of rdma-core's MLX5_POST_SEND_PREFER_BF.
                env.configure(sq);
                // Until `connect`, every post goes through `check_state`.
                sq.enable_fast_path(false);
                sq.attach_cq(sslots.clone());
                if let Some(rq) = rq {
                    rq.attach_cq(rslots.clone());
                }
            }
            QpPath::Verbs { sq, rq, .. } => {
                sq.set_atomic_caps(atomics);
                sq.attach_cq(sslots.clone());
                if let Some(rq) = rq {
                    rq.attach_cq(rslots.clone());
                }
            }
        }
        Ok(Qp {
            path,
            qpn,
            psn,
            connected: false,
            errored: false,
            atomics,
            rnr_retry_cap: rnr_retry,
            pd: self.clone(),
            cqs: [send_cq.handle.clone(), recv.handle.clone()],
            obj: Some(obj),
            srq,
            _cm: cm,
        })
    }
}

/// The receive side of a new QP: its CQ, and the SRQ it takes receives from.
pub(crate) struct RecvSide<'a> {
    handle: &'a Arc<CqHandle>,
    cqn: u32,
    dev: &'a super::Device,
    srq: Option<&'a Arc<super::srq::SrqHandle>>,
}

impl<'a> RecvSide<'a> {
    /// Receives from the QP's own queue, completing on `cq`.
    pub(crate) fn cq(cq: &'a Cq) -> Self {
        RecvSide {
            handle: &cq.handle,
            cqn: cq.cqn(),
            dev: &cq.dev,
            srq: None,
        }
    }
}

/// rdma-core's window of `mw` (a window of this QP's domain, checked by the caller: the
/// verbs path runs only on rdma-core devices).
fn verbs_window(mw: &crate::MemoryWindow) -> Result<*mut rdma_sys::ibv_mw> {
    mw.verbs_mw()
        .ok_or_else(|| crate::backend::other_device("window of another device (rkey)"))
}

/// The window key after `rkey`: same index, next variant byte (rdma-core `ibv_inc_rkey`).
fn next_variant(rkey: u32) -> u32 {
    (rkey & !0xff) | (rkey.wrapping_add(1) & 0xff)
}

/// Requests written together and posted with one doorbell (direct path) or one
/// `ibv_post_send` of a linked list (verbs path). Dropped without [`Batch::ring`], it posts
/// nothing.
///
/// Unsignaled requests complete silently; the signaled one after them reports that they
/// are all done (and an error of any of them is reported whatever its flag).
///
/// ```
/// # #[cfg(feature = "sim")] fn main() -> blueflame::Result<()> {
/// use blueflame::{Access, Completion, Device, Payload, PostFlags, QpCaps, Request};
/// let dev = Device::sim_stepped();
/// let pd = dev.alloc_pd()?;
/// let mut cq = dev.create_cq(64)?;
/// let mut qp = pd.create_qp(&cq, &cq, QpCaps::default())?;
/// qp.connect(qp.endpoint()?)?;
/// let mr = pd.alloc_mr(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE)?;
/// let mut batch = qp.batch();
/// for i in 0..8u64 {
///     let flags = if i == 7 { PostFlags::SIGNALED } else { PostFlags::UNSIGNALED };
///     let bytes = i.to_le_bytes();
///     let remote = mr.remote(8 * i as usize)?;
///     let req = Request::Write { remote, data: Payload::Inline(&bytes) };
///     batch.push(&req, i, flags)?;
/// }
/// assert_eq!(batch.len(), 8);
/// batch.ring()?;                                  // one doorbell for the eight writes
/// dev.process();
/// let mut out = [Completion::default(); 8];
/// assert_eq!(cq.poll(&mut out), 1);               // only the signaled one
/// assert_eq!(out[0].cookie, 7);
/// assert_eq!(mr.read_u64(56)?, 7);
/// # Ok(()) }
/// # #[cfg(not(feature = "sim"))] fn main() {}
/// ```
#[must_use = "a batch posts nothing until rung"]
pub enum Batch<'a> {
    /// Direct path.
    Direct(direct::Batch<'a>),
    /// Verbs path.
    Verbs(VerbsBatch<'a>),
    /// The QP is not connected: every push fails with [`Error::InvalidState`].
    NotConnected(&'static str),
}

impl Batch<'_> {
    /// Adds one request.
    ///
    /// # Errors
    /// As [`Qp::post`]; the requests pushed before stay in the batch.
    #[inline(always)]
    pub fn push(&mut self, req: &Request<'_>, cookie: u64, flags: PostFlags) -> Result<()> {
        match self {
            Batch::Direct(b) => b.push(req, cookie, flags),
            // By value: the direct path's request can then stay in registers.
            _ => self.push_other(*req, cookie, flags),
        }
    }

    /// [`Batch::push`] on the verbs path, or before `connect`.
    #[inline(never)]
    fn push_other(&mut self, req: Request<'_>, cookie: u64, flags: PostFlags) -> Result<()> {
        match self {
            Batch::Direct(b) => b.push(&req, cookie, flags),
            Batch::Verbs(b) => b.push(&req, cookie, flags),
            Batch::NotConnected(state) => Err(Error::InvalidState { state }),
        }
    }

    /// Requests in the batch.
    pub fn len(&self) -> usize {
        match self {
            Batch::Direct(b) => b.len(),
            Batch::Verbs(b) => b.len(),
            Batch::NotConnected(_) => 0,
        }
    }

    /// Whether the batch is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Posts the whole batch.
    ///
    /// # Errors
    /// On the verbs path, the `ibv_post_send` error (the direct path cannot fail here).
    #[inline(always)]
    pub fn ring(self) -> Result<()> {
        match self {
            Batch::Direct(b) => {
                b.ring();
                Ok(())
            }
            Batch::Verbs(b) => b.ring(),
            Batch::NotConnected(_) => Ok(()),
        }
    }
}

impl Qp {
    /// How the direct path rings this QP's doorbell (None on the verbs path): a BlueFlame
    /// register of its own, a shared one under its lock, or 8-byte doorbells only.
    pub fn doorbell_mode(&self) -> Option<crate::DoorbellMode> {
        match &self.path {
            QpPath::Direct { sq, .. } => Some(sq.doorbell_mode()),
            QpPath::Verbs { .. } => None,
        }
    }

    /// The QP number.
    pub fn qpn(&self) -> u32 {
        self.qpn
    }

    /// The protection domain.
    pub fn pd(&self) -> &Pd {
        &self.pd
    }

    /// Which data path this QP runs.
    pub fn data_path(&self) -> DataPath {
        match self.path {
            QpPath::Direct { .. } => DataPath::Direct,
            QpPath::Verbs { .. } => DataPath::Verbs,
        }
    }

    /// The rdma-core API this QP posts with on the verbs path: extended (`ibv_wr_start` /
    /// `ibv_wr_*` / `ibv_wr_complete`) where the provider has it, else `ibv_post_send`
    /// (`BLUEFLAME_VERBS_API=auto|extended|legacy` overrides, read when the QP is created);
    /// None on the direct path.
    pub fn verbs_api(&self) -> Option<VerbsApi> {
        match &self.path {
            QpPath::Direct { .. } => None,
            QpPath::Verbs { sq, .. } => Some(sq.api()),
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

    /// Connects this QP to `remote` (RESET -> INIT -> RTR -> RTS on rdma-core devices) with
    /// default timeouts and retries. On the software NIC, a QP number is enough:
    /// `qp.connect(other.qpn())`, or `qp.connect(qp.qpn())` for a loopback.
    ///
    /// # Errors
    /// [`Error::Verbs`] (`Error::Sim` on the software NIC) when the transition is refused.
    pub fn connect(&mut self, remote: impl Into<Endpoint>) -> Result<()> {
        self.connect_with(&remote.into(), &Timing::default())
    }

    /// As [`Qp::connect`], with explicit timeouts and retries.
    ///
    /// # Errors
    /// As [`Qp::connect`].
    ///
    /// The RNR retry count programmed is the smaller of `timing.rnr_retry` and the QP's
    /// [`QpCaps::rnr_retry`] (7, retry for ever, being the largest). On the software NIC the
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
                state: "in error: a QP connects only from RESET (create a new one)",
            });
        }
        if self.connected {
            return Err(Error::InvalidState {
                state: "connected: a QP connects only from RESET (create a new one)",
            });
        }
        self.obj()?.connect(remote, self.psn, timing)?;
        self.set_connected();
        Ok(())
    }

    /// Moves the QP to the error state: outstanding and later work is flushed, each request
    /// completing once with [`WcStatus::WrFlushErr`](crate::WcStatus::WrFlushErr).
    ///
    /// # Errors
    /// [`Error::Verbs`] (`Error::Sim` on the software NIC).
    pub fn set_error(&mut self) -> Result<()> {
        self.errored = true;
        self.obj()?.set_error()
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

    /// Not known to be connected by this handle: on the software NIC the peer's `connect`
    /// may have connected both; ask it (slow path, taken only until connected).
    #[cold]
    fn refresh_connected(&mut self) -> Result<()> {
        if self.obj.as_ref().is_some_and(backend::Qp::left_reset) {
            self.set_connected();
            return Ok(());
        }
        Err(Error::InvalidState {
            state: "not connected (RESET)",
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

    /// The send depth: how many requests of the largest kind this QP's limits allow fit in
    /// its send queue at once (smaller ones may fit more on the direct path, where a request
    /// takes 1 to 16 blocks of [`Qp::send_ring_blocks`]). At least what was asked: the
    /// device rounds up. The CQ may allow fewer at a time (see [`Error::CqFull`]).
    pub fn send_depth(&self) -> u32 {
        match &self.path {
            QpPath::Direct { sq, .. } => {
                sq.ring_blocks() / mlx5::wqe::max_wqe_bbs(&sq.limits()) as u32
            }
            QpPath::Verbs { sq, .. } => sq.capacity(),
        }
    }

    /// Blocks of the direct path's send ring (None on the verbs path, which counts work
    /// requests).
    pub fn send_ring_blocks(&self) -> Option<u32> {
        match &self.path {
            QpPath::Direct { sq, .. } => Some(sq.ring_blocks()),
            QpPath::Verbs { .. } => None,
        }
    }

    /// The receive depth: receives that may be posted at once.
    pub fn recv_depth(&self) -> u32 {
        match &self.path {
            QpPath::Direct { rq, .. } => rq.as_ref().map_or(0, |r| r.capacity()),
            QpPath::Verbs { rq, .. } => rq.as_ref().map_or(0, |r| r.capacity()),
        }
    }

    /// Send-queue room: blocks on the direct path, work requests on the verbs path.
    pub fn free_send(&self) -> u32 {
        match &self.path {
            QpPath::Direct { sq, .. } => sq.free_blocks(),
            QpPath::Verbs { sq, .. } => sq.free(),
        }
    }

    /// Receive-queue room (entries).
    pub fn free_recv(&self) -> u32 {
        match &self.path {
            QpPath::Direct { rq, .. } => rq.as_ref().map_or(0, |r| r.free()),
            QpPath::Verbs { rq, .. } => rq.as_ref().map_or(0, |r| r.free()),
        }
    }

    /// Posts one request.
    ///
    /// # Errors
    /// [`Error::QueueFull`], [`Error::TooManySge`], [`Error::InlineTooLong`],
    /// [`Error::WqeTooLarge`], [`Error::Misaligned`], ...; [`Error::InvalidParameter`] for
    /// a write, send or read whose entries add up to more than 2^31 bytes (the sum in the
    /// error); [`Error::Unsupported`] for [`Request::BindMw`] and
    /// [`Request::LocalInvalidate`], which only [`Qp::bind_mw`] and [`Qp::unbind_mw`] post
    /// (they check the range, the rights and the window's type and state, and keep the
    /// window's key in step). Nothing is posted on error.
    #[inline(always)]
    pub fn post(&mut self, req: &Request<'_>, cookie: u64, flags: PostFlags) -> Result<()> {
        self.check_state()?;
        let r = match &mut self.path {
            QpPath::Direct { sq, .. } => sq.post(req, cookie, flags),
            QpPath::Verbs { sq, .. } => sq.post_one(req, cookie, flags),
        };
        match r {
            Ok(()) => Ok(()),
            Err(e) => Err(self.explain(e)),
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

    /// What this QP's event subjects are: itself and its CQs.
    fn subjects(&self) -> [Subject; 3] {
        [
            Subject::Qp(self.qpn),
            self.cqs[0].subject(),
            self.cqs[1].subject(),
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

    /// Reads the device's asynchronous events (never blocks) and reports one about this QP,
    /// its CQs, its port or the device: the way to learn why completions stopped coming.
    ///
    /// # Errors
    /// [`Error::AsyncEvent`].
    pub fn check(&self) -> Result<()> {
        let dev = &self.pd.inner.dev;
        dev.events.check(&dev.backend, &self.subjects())
    }

    /// Starts a batch (one doorbell for many requests).
    pub fn batch(&mut self) -> Batch<'_> {
        if let Err(Error::InvalidState { state }) = self.check_state() {
            return Batch::NotConnected(state);
        }
        match &mut self.path {
            QpPath::Direct { sq, .. } => Batch::Direct(sq.batch()),
            QpPath::Verbs { sq, .. } => Batch::Verbs(VerbsBatch::new(sq)),
        }
    }

    /// RDMA write of a gather list.
    ///
    /// # Errors
    /// See [`Qp::post`].
    #[inline(always)]
    pub fn write(
        &mut self,
        sgl: &[Sge],
        remote: Remote,
        cookie: u64,
        flags: PostFlags,
    ) -> Result<()> {
        self.post(
            &Request::Write {
                remote,
                data: Payload::Sgl(sgl),
            },
            cookie,
            flags,
        )
    }

    /// RDMA write of bytes carried in the WQE (no registration needed).
    ///
    /// # Errors
    /// See [`Qp::post`].
    #[inline(always)]
    pub fn write_inline(
        &mut self,
        data: &[u8],
        remote: Remote,
        cookie: u64,
        flags: PostFlags,
    ) -> Result<()> {
        if let QpPath::Direct { sq, .. } = &mut self.path {
            // The direct path's fast path for small inline writes (off until connected).
            if sq.try_write_inline(data, remote, cookie, flags) {
                return Ok(());
            }
        }
        let req = Request::Write {
            remote,
            data: Payload::Inline(data),
        };
        self.write_inline_cold(&req, cookie, flags)
    }

    /// [`Qp::write_inline`] (`req`, an inline write) when the direct path's fast path did
    /// not take it: on the verbs path, the send queue's own inline write; else
    /// [`Qp::post`]. Out of line, the request built only on the way here: the direct path's
    /// fast path keeps its arguments where they arrived (passed in registers instead, the
    /// compiler moved them into this call's registers before that path's first compare).
    /// [`Qp::post`] is called out of line ([`Qp::post_out_of_line`]): inlined here, its
    /// match of every request kind shared this function's registers and stack with the
    /// verbs path (4 instructions per verbs inline write, `cargo xtask rxe-icount`).
    #[cold]
    #[inline(never)]
    fn write_inline_cold(
        &mut self,
        req: &Request<'_>,
        cookie: u64,
        flags: PostFlags,
    ) -> Result<()> {
        if let (
            QpPath::Verbs { sq, .. },
            true,
            &Request::Write {
                remote,
                data: Payload::Inline(data),
            },
        ) = (&mut self.path, self.connected, req)
        {
            return match sq.write_inline(data, remote, cookie, flags) {
                Ok(()) => Ok(()),
                Err(e) => Err(self.explain(e)),
            };
        }
        self.post_out_of_line(req, cookie, flags)
    }

    /// [`Qp::post`], not inlined (see [`Qp::write_inline_cold`]).
    #[inline(never)]
    fn post_out_of_line(&mut self, req: &Request<'_>, cookie: u64, flags: PostFlags) -> Result<()> {
        self.post(req, cookie, flags)
    }

    /// RDMA write with immediate.
    ///
    /// # Errors
    /// See [`Qp::post`].
    #[inline(always)]
    pub fn write_imm(
        &mut self,
        data: Payload<'_>,
        remote: Remote,
        imm: u32,
        cookie: u64,
        flags: PostFlags,
    ) -> Result<()> {
        self.post(&Request::WriteImm { remote, data, imm }, cookie, flags)
    }

    /// RDMA read into a scatter list.
    ///
    /// # Errors
    /// See [`Qp::post`].
    #[inline(always)]
    pub fn read(
        &mut self,
        sgl: &[Sge],
        remote: Remote,
        cookie: u64,
        flags: PostFlags,
    ) -> Result<()> {
        self.post(&Request::Read { remote, sgl }, cookie, flags)
    }

    /// Send.
    ///
    /// # Errors
    /// See [`Qp::post`].
    #[inline(always)]
    pub fn send(&mut self, data: Payload<'_>, cookie: u64, flags: PostFlags) -> Result<()> {
        self.post(&Request::Send { data }, cookie, flags)
    }

    /// Atomic compare-and-swap of the 8 bytes at `remote`; the old value lands in `local`.
    ///
    /// # Errors
    /// See [`Qp::post`]; [`Error::Misaligned`] for a remote address not 8-byte aligned;
    /// [`Error::AtomicLength`] for a local entry that is not 8 bytes; [`Error::Unsupported`]
    /// on a device without atomics (`atomic_cap` `IBV_ATOMIC_NONE`). Read the old value with
    /// [`Qp::atomic_result`].
    #[inline(always)]
    pub fn compare_swap(
        &mut self,
        remote: Remote,
        compare: u64,
        swap: u64,
        local: Sge,
        cookie: u64,
        flags: PostFlags,
    ) -> Result<()> {
        self.post(
            &Request::CompareSwap {
                remote,
                compare,
                swap,
                local,
            },
            cookie,
            flags,
        )
    }

    /// Atomic fetch-and-add on the 8 bytes at `remote`; the old value lands in `local`.
    ///
    /// # Errors
    /// See [`Qp::compare_swap`].
    #[inline(always)]
    pub fn fetch_add(
        &mut self,
        remote: Remote,
        add: u64,
        local: Sge,
        cookie: u64,
        flags: PostFlags,
    ) -> Result<()> {
        self.post(&Request::FetchAdd { remote, add, local }, cookie, flags)
    }

    /// The old value an atomic of this QP returned, in host order on every device: `reply`
    /// is the local buffer of a completed compare-swap, fetch-add or 64-bit masked atomic (8
    /// bytes) or of a 32-bit masked atomic (4 bytes), as the device wrote it.
    ///
    /// Devices write replies in different byte orders: a ConnectX writes 4-byte masked
    /// replies big-endian always, and 8-byte ones big-endian in
    /// `atomic_req_8B_endianness_mode` 0 (host order in mode 1, which Linux selects); rxe
    /// and the other verbs devices write host order. Read atomic results through this call
    /// (or [`AtomicCaps::reply_value`](mlx5::AtomicCaps::reply_value) with
    /// [`Device::atomic_caps`](crate::Device::atomic_caps)), never as raw memory.
    ///
    /// ```
    /// # #[cfg(feature = "sim")] fn main() -> blueflame::Result<()> {
    /// use blueflame::{Access, AtomicCaps, Completion, Device, PostFlags, QpCaps};
    ///
    /// let dev = Device::sim_stepped();
    /// // A ConnectX in 8-byte endianness mode 0: every reply big-endian.
    /// dev.nic().unwrap().set_atomic_caps(AtomicCaps::CONNECTX_BIG_ENDIAN);
    /// let pd = dev.alloc_pd()?;
    /// let mut cq = dev.create_cq(16)?;
    /// let mut qp = pd.create_qp(&cq, &cq, QpCaps::default())?;
    /// let me = qp.qpn();
    /// qp.connect(me)?;
    /// let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_ATOMIC;
    /// let mr = pd.alloc_mr(64, all)?;
    /// mr.write(0, &41u64.to_ne_bytes())?;
    /// qp.fetch_add(mr.remote(0)?, 1, mr.sge(8, 8)?, 1, PostFlags::SIGNALED)?;
    /// dev.process();
    /// assert_eq!(cq.poll(&mut [Completion::default(); 1]), 1);
    /// let mut reply = [0u8; 8];
    /// mr.read(8, &mut reply)?;
    /// assert_eq!(reply, 41u64.to_be_bytes());       // as the device wrote it
    /// assert_eq!(qp.atomic_result(&reply)?, 41);    // the old value, host order
    /// assert_eq!(mr.read_u64(0)?, 42);
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sim"))] fn main() {}
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidParameter`] when `reply` is neither 8 nor 4 bytes long.
    #[inline]
    pub fn atomic_result(&self, reply: &[u8]) -> Result<u64> {
        self.atomics
            .reply_value(reply)
            .ok_or(Error::InvalidParameter {
                what: "atomic reply length (8 bytes, or 4 for a 32-bit masked atomic)",
                value: reply.len() as u64,
            })
    }

    /// What this QP's device can do with atomics (read when the QP was created).
    pub fn atomic_caps(&self) -> mlx5::AtomicCaps {
        self.atomics
    }

    /// Binds `mw` to `len` bytes at offset `off` of `mr` with `rights` (remote read / write /
    /// atomic, optionally zero-based) and returns the window's new rkey (a new key variant on
    /// every bind; the old rkey fails with a remote access error from then on). `len == 0`
    /// unbinds (see [`Qp::unbind_mw`]). The request after the bind waits for it (an initiator
    /// small fence, as rdma-core arms), and a peer may use the new rkey as soon as it learns it
    /// from a send posted after the bind. Type-1 windows may be bound by any QP and re-bound
    /// while bound (the new binding replaces the old); type-2 windows are tied to this QP (a
    /// peer must come in through it) and must be unbound before they are bound again (a
    /// ConnectX checks a type-2 window is free, rxe too): this is refused before posting.
    ///
    /// The window's key advances only when the bind succeeds: until its completion (or a
    /// later one of this QP) has been polled, the bind is in flight; if it fails, the window
    /// keeps the key and binding it had.
    ///
    /// # Errors
    /// Before anything is posted: [`Error::InvalidState`] before `connect`;
    /// [`Error::Privileges`] when `rights` are not a subset of the region's rights or the
    /// region lacks [`Access::MW_BIND`](crate::Access::MW_BIND);
    /// [`Error::InvalidParameter`] for a range outside the region or other rights;
    /// [`Error::InvalidHandle`] when window, region and QP are in different protection domains;
    /// [`Error::InvalidParameter`] for a type-1 window with `ZERO_BASED` rights or on a
    /// zero-based region (rdma-core's `mlx5_bind_mw` refuses both);
    /// [`Error::WindowState`] for a bound type-2 window or a bind of this window in flight on
    /// another QP; [`Error::QueueFull`].
    #[allow(clippy::too_many_arguments)]
    pub fn bind_mw(
        &mut self,
        mw: &mut crate::MemoryWindow,
        mr: &crate::MemoryRegion,
        off: usize,
        len: usize,
        rights: crate::Access,
        cookie: u64,
        flags: PostFlags,
    ) -> Result<u32> {
        self.check_state()?;
        super::mw::check_bind(mr.access(), mr.len() as u64, rights, off as u64, len as u64)?;
        super::mw::check_type1(mw.mw_type, mr.access(), rights)?;
        if !Arc::ptr_eq(&mw.pd.inner, &self.pd.inner)
            || !Arc::ptr_eq(&mr.pd().inner, &self.pd.inner)
        {
            let (what, value) = if Arc::ptr_eq(&mw.pd.inner, &self.pd.inner) {
                ("region of another protection domain (lkey)", mr.lkey())
            } else {
                ("window of another protection domain (rkey)", mw.rkey())
            };
            return Err(Error::InvalidHandle {
                what,
                value: value as u64,
            });
        }
        if len == 0 {
            return self.unbind_mw(mw, cookie, flags);
        }
        mw.settle();
        mw.check_flight(self.qpn)?;
        let (old, bound) = mw.effective();
        if mw.mw_type == crate::MwType::Two && bound.is_some() {
            return Err(Error::WindowState {
                rkey: old,
                state: "bound (a type-2 window is unbound with Qp::unbind_mw before a new bind)",
            });
        }
        let addr = mr.addr() + off as u64;
        let new_rkey = next_variant(old);
        let access = rights;
        let new_rkey = match &mut self.path {
            QpPath::Direct { sq, .. } => {
                let b = crate::BindMw {
                    mw_rkey: old,
                    new_rkey,
                    mw_type: mw.mw_type,
                    mr_lkey: mr.lkey(),
                    addr,
                    len: len as u64,
                    access,
                };
                sq.post_window(&Request::BindMw(b), cookie, flags)?;
                new_rkey
            }
            QpPath::Verbs { sq, .. } => {
                let b = WindowBind {
                    mw: verbs_window(mw)?,
                    mw_type: mw.mw_type,
                    rkey: old,
                    new_rkey,
                    mr: Some(mr.verbs_mr().ok_or_else(|| {
                        crate::backend::other_device("region of another device (lkey)")
                    })?),
                    addr,
                    len: len as u64,
                    access,
                };
                // SAFETY: window and region are live objects of this QP's domain (checked
                // above), the window for as long as it is bound (`&mut` while binding, freed
                // only once no bind is in flight), the region while a window is bound to it
                // (its deregistration waits).
                unsafe { sq.bind_window(&b, cookie, flags)? }
            }
        };
        self.record_window_step(mw, new_rkey, Some(self.qpn));
        Ok(new_rkey)
    }

    /// Unbinds `mw`: its key grants nothing from then on. A type-2 window is unbound by a
    /// local invalidate of its key (the key stays; the next bind gives a new one), which
    /// must come through the QP it is bound to; a type-1 window by a zero-length bind (a new
    /// key variant). The same on every device: a zero-length type-2 bind is an unbind on a
    /// ConnectX but refused by rxe, and a local invalidate of a type-1 window is refused by
    /// both. Returns the window's key after the unbind.
    ///
    /// # Errors
    /// Before anything is posted: [`Error::InvalidState`] before `connect`;
    /// [`Error::InvalidHandle`] for a window of another protection domain;
    /// [`Error::WindowState`] for a type-2 window that is not bound, or bound through
    /// another QP, or a request of this window in flight on another QP;
    /// [`Error::QueueFull`].
    pub fn unbind_mw(
        &mut self,
        mw: &mut crate::MemoryWindow,
        cookie: u64,
        flags: PostFlags,
    ) -> Result<u32> {
        self.check_state()?;
        if !Arc::ptr_eq(&mw.pd.inner, &self.pd.inner) {
            return Err(Error::InvalidHandle {
                what: "window of another protection domain (rkey)",
                value: mw.rkey() as u64,
            });
        }
        mw.settle();
        mw.check_flight(self.qpn)?;
        let (old, bound) = mw.effective();
        let new_rkey = match mw.mw_type {
            crate::MwType::Two => {
                match bound {
                    Some(q) if q == self.qpn => {}
                    Some(_) => {
                        return Err(Error::WindowState {
                            rkey: old,
                            state: "bound through another QP (unbind it there)",
                        })
                    }
                    None => {
                        return Err(Error::WindowState {
                            rkey: old,
                            state: "not bound",
                        })
                    }
                }
                self.check_state()?;
                let inval = Request::LocalInvalidate { rkey: old };
                match &mut self.path {
                    QpPath::Direct { sq, .. } => sq.post_window(&inval, cookie, flags),
                    QpPath::Verbs { sq, .. } => sq.post_invalidate(old, cookie, flags),
                }
                .map_err(|e| self.explain(e))?;
                old
            }
            crate::MwType::One => match &mut self.path {
                QpPath::Direct { sq, .. } => {
                    let new_rkey = next_variant(old);
                    let b = crate::BindMw {
                        mw_rkey: old,
                        new_rkey,
                        mw_type: crate::MwType::One,
                        mr_lkey: 0,
                        addr: 0,
                        len: 0,
                        access: crate::Access::NONE,
                    };
                    sq.post_window(&Request::BindMw(b), cookie, flags)?;
                    new_rkey
                }
                QpPath::Verbs { sq, .. } => {
                    let b = WindowBind {
                        mw: verbs_window(mw)?,
                        mw_type: crate::MwType::One,
                        rkey: old,
                        new_rkey: old,
                        mr: None,
                        addr: 0,
                        len: 0,
                        access: crate::Access::NONE,
                    };
                    // SAFETY: the window is a live object of this QP's domain (checked
                    // above); an unbind names no memory.
                    unsafe { sq.bind_window(&b, cookie, flags)? }
                }
            },
        };
        self.record_window_step(mw, new_rkey, None);
        Ok(new_rkey)
    }

    /// Records the bind or unbind of `mw` this QP just posted as in flight.
    fn record_window_step(&self, mw: &mut crate::MemoryWindow, rkey: u32, bound: Option<u32>) {
        let (shadow, start, end) = match &self.path {
            QpPath::Direct { sq, .. } => {
                let (start, end) = sq.last_wqe();
                (&sq.shadow, start, end)
            }
            QpPath::Verbs { sq, .. } => {
                let end = sq.position();
                (&sq.shadow, end.wrapping_sub(1), end)
            }
        };
        let step = super::mw::Step {
            rkey,
            bound,
            start: shadow.widen_posted(start),
            end: shadow.widen_posted(end),
        };
        mw.push_step(self.qpn, shadow, step);
    }

    /// Posts a receive buffer list.
    ///
    /// # Errors
    /// [`Error::SrqQp`] when the QP takes its receives from an SRQ;
    /// [`Error::Unsupported`] when the QP has no receive queue; [`Error::QueueFull`],
    /// [`Error::TooManySge`].
    #[inline]
    pub fn post_recv(&mut self, sgl: &[Sge], cookie: u64) -> Result<()> {
        if let QpPath::Verbs { .. } = self.path {
            // A call of the same signature: a jump.
            return self.post_recv_verbs(sgl, cookie);
        }
        let r = match &mut self.path {
            QpPath::Direct { rq: Some(rq), .. } if self.srq.is_none() => rq.post(sgl, cookie),
            _ => return Err(self.no_receive_queue()),
        };
        r.map_err(|e| self.explain(e))
    }

    /// [`Qp::post_recv`] on the verbs path, out of line: inlined, it shared the direct
    /// path's registers, and the receive paid their saves and restores (rxe-icount).
    /// One buffer while the queue's cached room lasts is posted straight; everything else
    /// takes [`Qp::post_recv_verbs_general`] (a jump), as does nothing on this path.
    #[inline(never)]
    fn post_recv_verbs(&mut self, sgl: &[Sge], cookie: u64) -> Result<()> {
        if let (QpPath::Verbs { rq: Some(rq), .. }, [s]) = (&mut self.path, sgl) {
            match rq.post_one(s, cookie) {
                Some(0) => return Ok(()),
                Some(rc) => return Err(self.recv_refused(rc)),
                None => {}
            }
        }
        self.post_recv_verbs_general(sgl, cookie)
    }

    /// [`Qp::post_recv`] on the verbs path, every case.
    #[inline(never)]
    fn post_recv_verbs_general(&mut self, sgl: &[Sge], cookie: u64) -> Result<()> {
        match &mut self.path {
            QpPath::Verbs { rq: Some(rq), .. } => rq.post(sgl, cookie).map_err(|e| self.explain(e)),
            // A verbs QP on an SRQ has no receive queue (`rq` is None).
            _ => Err(self.no_receive_queue()),
        }
    }

    /// `ibv_post_recv` refused the receive [`Qp::post_recv_verbs`] posted, with `rc`.
    #[cold]
    #[inline(never)]
    fn recv_refused(&mut self, rc: i32) -> Error {
        let e = match &mut self.path {
            QpPath::Verbs { rq: Some(rq), .. } => rq.unpost(rc),
            _ => unreachable!("only after a verbs receive"),
        };
        self.explain(e)
    }

    /// Why this QP takes no receive of its own: its SRQ, or no receive queue at all.
    #[cold]
    fn no_receive_queue(&self) -> Error {
        match &self.srq {
            Some(s) => Error::SrqQp {
                qpn: self.qpn,
                srqn: s.srqn,
            },
            None => Error::Unsupported("QP has no receive queue"),
        }
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        // Its number may come back with another QP.
        self.pd.inner.dev.events.forget(Subject::Qp(self.qpn));
        self.pd.inner.dev.events.forget(Subject::LastWqe(self.qpn));
        self.pd.inner.lifetimes.reclaim();
        match &mut self.path {
            QpPath::Direct { sq, rq, .. } => {
                sq.release_cq();
                // The register claim goes before the QP: once the QP and its thread domain are
                // freed, the device may give that register to another QP, which then claims
                // it as its own.
                sq.release_register();
                if let Some(rq) = rq {
                    rq.release_cq();
                }
            }
            QpPath::Verbs { sq, rq, .. } => {
                sq.release_cq();
                if let Some(rq) = rq {
                    rq.release_cq();
                }
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
        super::cq::destroy_and_bury(&self.cqs, self.qpn, || drop(obj.take()));
    }
}
