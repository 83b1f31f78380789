//! Dynamically connected transport (DC): DC initiators ([`Dci`]) that reach any DC target
//! ([`Dct`]) named in each request, without a connection per peer.
//!
//! DC is an mlx5 transport (`mlx5dv_create_qp` with the DC init attributes): it runs on the
//! direct path, on the software NIC; devices without it (rxe, siw and every other verbs
//! device) refuse [`Pd::create_dci`] and [`Pd::create_dct`] with [`Error::NoDc`].

use super::cq::CqHandle;
#[cfg(feature = "sim")]
use super::device::PdKind;
use super::device::{Backend, VerbsDev};
use super::events::Subject;
use super::{Cq, Pd, QpCaps};
use crate::direct::{Attached, SendQueue};
use crate::error::{Error, Result};
use crate::verbs::objects::Timing;
use crate::{Access, Payload, PostFlags, Remote, Request, Sge};
use mlx5::dc::{DcAddr, AV_BYTES, MAX_DCTN};
use std::sync::Arc;

/// Where a DCI request goes: a DCT's address vector (the 48-byte `struct mlx5_wqe_av` of an
/// address handle of its port), its number and its DC access key.
///
/// On one device (the software NIC) [`Dct::peer`] gives it; across machines, exchange
/// [`Dct::dctn`] and the key out of band and build it with [`DcPeer::new`] from the address
/// vector of an address handle to the target's port.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct DcPeer {
    addr: DcAddr,
}

impl DcPeer {
    /// A destination from its parts.
    ///
    /// # Errors
    /// [`Error::InvalidParameter`] for a DCT number past 24 bits.
    pub fn new(av: [u8; AV_BYTES], dctn: u32, dc_key: u64) -> Result<DcPeer> {
        if dctn > MAX_DCTN {
            return Err(Error::InvalidParameter {
                what: "DCT number (24 bits)",
                value: dctn as u64,
            });
        }
        Ok(DcPeer {
            addr: DcAddr { av, dctn, dc_key },
        })
    }

    /// The same destination with another DC key (a request with a key that is not the
    /// DCT's is dropped by the target: see [`Dci`]).
    pub fn with_key(mut self, dc_key: u64) -> DcPeer {
        self.addr.dc_key = dc_key;
        self
    }

    /// The DCT number.
    pub fn dctn(&self) -> u32 {
        self.addr.dctn
    }

    /// The DC access key.
    pub fn dc_key(&self) -> u64 {
        self.addr.dc_key
    }

    /// The address segment every request to this peer carries (`mlx5dv_wr_set_dc_addr`'s).
    pub fn segment(&self) -> [u8; AV_BYTES] {
        self.addr.segment()
    }
}

/// A DC target: a responder any [`Dci`] that knows its number and key can reach, with the
/// rights it was created with (remote write, read, atomic). Sends and writes with immediate
/// to it take the receives of its shared receive queue ([`Srq`](crate::Srq)); their
/// completions name the DCT in [`Completion::qpn`](crate::Completion) and carry the SRQ
/// receive's cookie. It keeps the SRQ alive.
pub struct Dct {
    dctn: u32,
    dc_key: u64,
    access: Access,
    pd: Pd,
    cq: Arc<CqHandle>,
    srq: Arc<super::srq::SrqHandle>,
}

impl core::fmt::Debug for Dct {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Dct")
            .field("dctn", &self.dctn)
            .field("access", &self.access)
            .finish()
    }
}

impl Dct {
    /// The DCT number (from the QP number space).
    pub fn dctn(&self) -> u32 {
        self.dctn
    }

    /// The DC access key initiators must present.
    pub fn dc_key(&self) -> u64 {
        self.dc_key
    }

    /// The rights it grants initiators.
    pub fn access(&self) -> Access {
        self.access
    }

    /// The SRQ it receives into.
    pub fn srqn(&self) -> u32 {
        self.srq.srqn
    }

    /// The destination a DCI of the same device uses to reach it.
    ///
    /// # Errors
    /// [`Error::Unsupported`] on a verbs device (build the peer from an address handle with
    /// [`DcPeer::new`]).
    pub fn peer(&self) -> Result<DcPeer> {
        match &self.pd.inner.dev.backend {
            // The software NIC routes by number: the address vector is not looked at.
            #[cfg(feature = "sim")]
            Backend::Sim(_) => DcPeer::new([0; AV_BYTES], self.dctn, self.dc_key),
            Backend::Verbs(_) => Err(Error::Unsupported(
                "a DC peer without an address handle on a verbs device (DcPeer::new)",
            )),
        }
    }
}

impl Drop for Dct {
    fn drop(&mut self) {
        self.pd.inner.dev.events.forget(Subject::Qp(self.dctn));
        // As a QP's drop: with the CQ's list locked, destroy the DCT, then leave a tombstone
        // over the receive completions it may still have in the CQ.
        let mut g = self.cq.registry.lock();
        match &self.pd.inner.dev.backend {
            #[cfg(feature = "sim")]
            Backend::Sim(n) => {
                let _ = n.destroy_dct(self.dctn);
            }
            Backend::Verbs(_) => {}
        }
        self.cq.registry.bury(&mut g, self.dctn);
    }
}

/// A DC initiator: a send queue whose every request names its destination ([`DcPeer`]).
///
/// It is ready to post once created (RESET -> INIT -> RTR -> RTS with no remote QP, as
/// UCX's `uct_dc_mlx5_iface_dci_connect`). Requests: RDMA write (gather list, inline, with
/// immediate), read, send (with immediate), atomics; binds, local invalidates and sends
/// with invalidate are refused before posting. A DCI serves one destination at a time, in
/// order: a request to another DCT starts once the ones before it have completed (the
/// hardware reconnects an idle DCI); completions come in posting order on its CQ.
///
/// Errors are the hardware's: a request to a DCT number that does not exist, or with a key
/// that is not the DCT's, is dropped by the target, so the DCI retransmits until its retry
/// count is spent and completes it with [`WcStatus::RetryExcErr`](crate::WcStatus) (after
/// `retry_cnt + 1` local ACK timeouts of [`Timing`]); an operation the DCT's rights do not
/// allow completes with `RemInvReqErr`, a bad remote key or range with `RemAccessErr`. The
/// DCI then goes to error and flushes what follows, as an RC requester; the target keeps
/// serving the others.
///
/// ```
/// # #[cfg(feature = "sim")] fn main() -> blueflame::Result<()> {
/// use blueflame::{Access, Completion, Device, Payload, PostFlags, QpCaps, SrqCaps, WcOpcode};
/// let dev = Device::sim_stepped();
/// let pd = dev.alloc_pd()?;
/// let mut cq = dev.create_cq(64)?;
/// // The target: a DCT receiving into an SRQ, both completing on `target_cq`.
/// let mut target_cq = dev.create_cq(64)?;
/// let mut srq = pd.create_srq(&target_cq, SrqCaps::default())?;
/// let rights = Access::REMOTE_WRITE | Access::REMOTE_READ;
/// let dct = pd.create_dct(&target_cq, &srq, 0xc0ffee, rights)?;
/// let mr = pd.alloc_mr(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ)?;
/// srq.post_recv(&[mr.sge(1024, 64)?], 77)?;
/// // The initiator: ready at once, no connection; each request names its DCT.
/// let mut dci = pd.create_dci(&cq, QpCaps::default())?;
/// let peer = dct.peer()?;
/// dci.write_inline(&peer, b"hello", mr.remote(0)?, 1, PostFlags::SIGNALED)?;
/// dci.read(&peer, &[mr.sge(64, 5)?], mr.remote(0)?, 2, PostFlags::SIGNALED)?;
/// dci.send(&peer, Payload::Inline(b"ping"), 3, PostFlags::SIGNALED)?;
/// dev.process();
/// let mut out = [Completion::default(); 4];
/// assert_eq!(cq.poll(&mut out), 3);
/// assert_eq!((out[0].cookie, out[1].cookie, out[2].cookie), (1, 2, 3));
/// assert_eq!(target_cq.poll(&mut out), 1);
/// assert_eq!((out[0].cookie, out[0].opcode, out[0].qpn), (77, WcOpcode::Recv, dct.dctn()));
/// let mut back = [0u8; 5];
/// mr.read(64, &mut back)?;
/// assert_eq!(&back, b"hello");
/// # Ok(()) }
/// # #[cfg(not(feature = "sim"))] fn main() {}
/// ```
pub struct Dci {
    // Field order: the queue goes before the handles that keep its ring alive.
    sq: SendQueue,
    qpn: u32,
    errored: bool,
    atomics: mlx5::AtomicCaps,
    pd: Pd,
    cq: Arc<CqHandle>,
    #[cfg(feature = "sim")]
    sim_td: Option<u32>,
}

impl core::fmt::Debug for Dci {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Dci").field("qpn", &self.qpn).finish()
    }
}

/// The rights a DCT may grant.
const DCT_RIGHTS: Access =
    Access(Access::REMOTE_WRITE.0 | Access::REMOTE_READ.0 | Access::REMOTE_ATOMIC.0);

/// The typed refusal of a verbs device: DC is an mlx5 transport.
fn no_dc(pd: &Pd, v: &VerbsDev) -> Error {
    let why = if v.path != crate::DataPath::Direct {
        "DC is an mlx5 transport (mlx5dv_create_qp with MLX5DV_QP_INIT_ATTR_MASK_DC); \
         this device's provider has none"
    } else {
        "DC on ConnectX hardware is not wired in this version (the software NIC runs it)"
    };
    Error::NoDc {
        device: pd.inner.dev.describe(),
        why,
    }
}

impl Pd {
    /// Creates a DC initiator whose completions go to `send_cq`, ready to post, with the
    /// default [`Timing`] (ACK timeout 14, 7 retries). `caps.rq_entries`, `max_recv_sge` and
    /// `scatter_to_cqe` do not apply (a DCI has no receive queue).
    ///
    /// # Errors
    /// [`Error::NoDc`] on a device without DC (every verbs device but mlx5);
    /// [`Error::InvalidHandle`] for a CQ of another device; the device's refusal of `caps`.
    pub fn create_dci(&self, send_cq: &Cq, caps: QpCaps) -> Result<Dci> {
        self.create_dci_with(send_cq, caps, &Timing::default())
    }

    /// As [`Pd::create_dci`] with explicit transport timers and retry counts (its RTS
    /// attributes: `timeout`, `retry_cnt`, `rnr_retry`).
    ///
    /// # Errors
    /// As [`Pd::create_dci`]; [`Error::InvalidParameter`] for a timing past its encoding.
    pub fn create_dci_with(&self, send_cq: &Cq, caps: QpCaps, timing: &Timing) -> Result<Dci> {
        timing.check()?;
        if caps.rnr_retry > 7 {
            return Err(Error::InvalidParameter {
                what: "rnr_retry (at most 7: a 3-bit field, 7 retries for ever)",
                value: caps.rnr_retry as u64,
            });
        }
        if !send_cq.dev.same(&self.inner.dev) {
            return Err(Error::InvalidHandle {
                what: "send CQ of another device (CQ number)",
                value: send_cq.cqn() as u64,
            });
        }
        match (&self.inner.dev.backend, &self.inner.kind) {
            #[cfg(feature = "sim")]
            (Backend::Sim(nic), PdKind::Sim(pd)) => {
                let caps = mlx5::sim::QpCaps::from(caps);
                let td = nic.alloc_td().ok();
                let raw = match td {
                    Some(td) => nic.create_dci_on_td(*pd, td, send_cq.cqn(), caps),
                    None => nic.create_dci(*pd, send_cq.cqn(), caps),
                };
                let raw = match raw {
                    Ok(raw) => raw,
                    Err(e) => {
                        if let Some(td) = td {
                            let _ = nic.dealloc_td(td);
                        }
                        return Err(e.into());
                    }
                };
                let undo = |e: Error| {
                    let _ = nic.destroy_qp(raw.qpn);
                    if let Some(td) = td {
                        let _ = nic.dealloc_td(td);
                    }
                    e
                };
                // SAFETY: the ring belongs to the DCI just created, which this Dci alone posts
                // to and destroys on drop, after the queue (field order); with a thread
                // domain, its register is this DCI's alone.
                let sq = unsafe {
                    if td.is_some() {
                        SendQueue::new_dedicated(&raw)
                    } else {
                        SendQueue::new(&raw)
                    }
                }
                .map_err(undo)?;
                let t = mlx5::sim::QpTiming {
                    timeout: timing.timeout,
                    retry_cnt: timing.retry_cnt,
                    rnr_retry: timing.rnr_retry.min(caps.rnr_retry),
                    min_rnr_timer: timing.min_rnr_timer,
                };
                nic.dci_ready(raw.qpn, t).map_err(|e| undo(e.into()))?;
                Ok(self.finish_dci(sq, raw.qpn, send_cq, td))
            }
            (Backend::Verbs(v), _) => Err(no_dc(self, v)),
            #[cfg(feature = "sim")]
            _ => Err(Error::Unsupported("PD and device backends differ")),
        }
    }

    /// The accounting every DCI gets: its shadow tracked by the domain, its queue attached
    /// to the CQ's list and charged to the CQ's entries.
    #[cfg_attr(not(feature = "sim"), allow(dead_code))]
    fn finish_dci(
        &self,
        mut sq: SendQueue,
        qpn: u32,
        send_cq: &Cq,
        #[cfg_attr(not(feature = "sim"), allow(unused_variables))] td: Option<u32>,
    ) -> Dci {
        let shadow = sq.shadow.clone();
        let weak: std::sync::Weak<dyn super::lifetime::Progress> = Arc::downgrade(&shadow) as _;
        self.inner.lifetimes.track(weak);
        send_cq.handle.registry.attach(Attached {
            qpn,
            sq: Some(shadow),
            rq: None,
            scatter: None,
            srq: None,
        });
        let atomics = self.inner.dev.atomic_caps();
        sq.set_atomic_caps(atomics);
        // A DCI posts through `post_dc` only: the RC inline-write fast path stays off.
        sq.enable_fast_path(false);
        sq.attach_cq(send_cq.handle.registry.slots.clone());
        Dci {
            sq,
            qpn,
            errored: false,
            atomics,
            pd: self.clone(),
            cq: send_cq.handle.clone(),
            #[cfg(feature = "sim")]
            sim_td: td,
        }
    }

    /// Creates a DC target of this domain: initiators that present `dc_key` may write, read
    /// and run atomics on this domain's regions as `access` allows (a subset of
    /// [`Access::REMOTE_WRITE`], [`Access::REMOTE_READ`], [`Access::REMOTE_ATOMIC`]).
    /// Ready at once (INIT -> RTR, as UCX's `uct_dc_mlx5_iface_create_dct`). Sends and
    /// writes with immediate take the receives of `srq`, whose CQ `recv_cq` must be; a send
    /// that finds the SRQ empty meets RNR NAKs, as on RC.
    ///
    /// # Errors
    /// [`Error::NoDc`] on a device without DC; [`Error::InvalidParameter`] for other
    /// rights; [`Error::InvalidHandle`] for a CQ of another device or an SRQ of another
    /// protection domain; [`Error::SrqCq`] when `recv_cq` is not the SRQ's CQ.
    pub fn create_dct(
        &self,
        recv_cq: &Cq,
        srq: &crate::Srq,
        dc_key: u64,
        access: Access,
    ) -> Result<Dct> {
        if !DCT_RIGHTS.contains(access) {
            return Err(Error::InvalidParameter {
                what: "DCT rights (REMOTE_WRITE | REMOTE_READ | REMOTE_ATOMIC only)",
                value: access.0 as u64,
            });
        }
        if !recv_cq.dev.same(&self.inner.dev) {
            return Err(Error::InvalidHandle {
                what: "receive CQ of another device (CQ number)",
                value: recv_cq.cqn() as u64,
            });
        }
        let h = &srq.handle;
        if !Arc::ptr_eq(&h.pd.inner, &self.inner) {
            return Err(Error::InvalidHandle {
                what: "SRQ of another protection domain (SRQ number)",
                value: h.srqn as u64,
            });
        }
        srq.check_cq(recv_cq)?;
        let dctn = self.new_dct(recv_cq, h.srqn, dc_key, access)?;
        // The DCT's receive completions: cookies from the SRQ, by the CQE's WQE index.
        recv_cq.handle.registry.attach(Attached {
            qpn: dctn,
            sq: None,
            rq: None,
            scatter: None,
            srq: Some(h.shared.clone()),
        });
        Ok(Dct {
            dctn,
            dc_key,
            access,
            pd: self.clone(),
            cq: recv_cq.handle.clone(),
            srq: h.clone(),
        })
    }
}

impl Pd {
    /// The device's DCT number for a new target.
    fn new_dct(
        &self,
        #[cfg_attr(not(feature = "sim"), allow(unused_variables))] recv_cq: &Cq,
        #[cfg_attr(not(feature = "sim"), allow(unused_variables))] srqn: u32,
        #[cfg_attr(not(feature = "sim"), allow(unused_variables))] dc_key: u64,
        #[cfg_attr(not(feature = "sim"), allow(unused_variables))] access: Access,
    ) -> Result<u32> {
        match (&self.inner.dev.backend, &self.inner.kind) {
            #[cfg(feature = "sim")]
            (Backend::Sim(nic), PdKind::Sim(pd)) => {
                Ok(nic.create_dct(*pd, recv_cq.cqn(), Some(srqn), dc_key, access)?)
            }
            (Backend::Verbs(v), _) => Err(no_dc(self, v)),
            #[cfg(feature = "sim")]
            _ => Err(Error::Unsupported("PD and device backends differ")),
        }
    }
}

impl Dci {
    /// The DCI's QP number (completions name it in [`Completion::qpn`](crate::Completion)).
    pub fn qpn(&self) -> u32 {
        self.qpn
    }

    /// The protection domain.
    pub fn pd(&self) -> &Pd {
        &self.pd
    }

    /// Send-queue room in blocks.
    pub fn free_send(&self) -> u32 {
        self.sq.free_blocks()
    }

    /// How many requests of the largest kind this DCI's limits allow fit in its send queue
    /// at once (each carries the 48-byte address segment).
    pub fn send_depth(&self) -> u32 {
        self.sq.ring_blocks() / mlx5::dc::max_dc_wqe_bbs(&self.sq.limits()) as u32
    }

    /// What this DCI's device can do with atomics (read when it was created).
    pub fn atomic_caps(&self) -> mlx5::AtomicCaps {
        self.atomics
    }

    /// The old value an atomic of this DCI returned, in host order (see
    /// [`Qp::atomic_result`](crate::Qp::atomic_result)).
    ///
    /// # Errors
    /// [`Error::InvalidParameter`] when `reply` is neither 8 nor 4 bytes long.
    pub fn atomic_result(&self, reply: &[u8]) -> Result<u64> {
        self.atomics
            .reply_value(reply)
            .ok_or(Error::InvalidParameter {
                what: "atomic reply length (8 bytes, or 4 for a 32-bit masked atomic)",
                value: reply.len() as u64,
            })
    }

    /// Posts one request to `peer`.
    ///
    /// # Errors
    /// Before anything is posted: [`Error::Unsupported`] for a bind, local invalidate,
    /// send with invalidate or NOP, or an atomic the device lacks; [`Error::QueueFull`],
    /// [`Error::CqFull`], [`Error::TooManySge`], [`Error::InlineTooLong`],
    /// [`Error::WqeTooLarge`], [`Error::Misaligned`], [`Error::AtomicLength`],
    /// [`Error::InvalidParameter`] (a read longer than 2^31 bytes).
    pub fn post(
        &mut self,
        peer: &DcPeer,
        req: &Request<'_>,
        cookie: u64,
        flags: PostFlags,
    ) -> Result<()> {
        match self.sq.post_dc(&peer.addr, req, cookie, flags) {
            Ok(()) => Ok(()),
            Err(e) => Err(self.explain(e)),
        }
    }

    /// A refused post: a queue or CQ that does not drain may be the sign of an asynchronous
    /// event about this DCI or its CQ, reported instead (as [`Qp::post`](crate::Qp::post)).
    #[cold]
    fn explain(&self, e: Error) -> Error {
        match e {
            Error::QueueFull { .. } | Error::CqFull { .. } => match self.check() {
                Err(event) => event,
                Ok(()) => e,
            },
            e => e,
        }
    }

    /// Reads the device's asynchronous events (never blocks) and reports one about this DCI,
    /// its CQ, its port or the device.
    ///
    /// # Errors
    /// [`Error::AsyncEvent`].
    pub fn check(&self) -> Result<()> {
        let dev = &self.pd.inner.dev;
        dev.events
            .check(&dev.backend, &[Subject::Qp(self.qpn), self.cq.subject()])
    }

    /// RDMA write of a gather list to `peer`'s memory.
    ///
    /// # Errors
    /// See [`Dci::post`].
    pub fn write(
        &mut self,
        peer: &DcPeer,
        sgl: &[Sge],
        remote: Remote,
        cookie: u64,
        flags: PostFlags,
    ) -> Result<()> {
        let data = Payload::Sgl(sgl);
        self.post(peer, &Request::Write { remote, data }, cookie, flags)
    }

    /// RDMA write of bytes carried in the WQE.
    ///
    /// # Errors
    /// See [`Dci::post`].
    pub fn write_inline(
        &mut self,
        peer: &DcPeer,
        data: &[u8],
        remote: Remote,
        cookie: u64,
        flags: PostFlags,
    ) -> Result<()> {
        let data = Payload::Inline(data);
        self.post(peer, &Request::Write { remote, data }, cookie, flags)
    }

    /// RDMA write with immediate (consumes a receive of the target).
    ///
    /// # Errors
    /// See [`Dci::post`].
    pub fn write_imm(
        &mut self,
        peer: &DcPeer,
        data: Payload<'_>,
        remote: Remote,
        imm: u32,
        cookie: u64,
        flags: PostFlags,
    ) -> Result<()> {
        self.post(
            peer,
            &Request::WriteImm { remote, data, imm },
            cookie,
            flags,
        )
    }

    /// RDMA read from `peer`'s memory into a scatter list.
    ///
    /// # Errors
    /// See [`Dci::post`].
    pub fn read(
        &mut self,
        peer: &DcPeer,
        sgl: &[Sge],
        remote: Remote,
        cookie: u64,
        flags: PostFlags,
    ) -> Result<()> {
        self.post(peer, &Request::Read { remote, sgl }, cookie, flags)
    }

    /// Send (lands in a receive of the target).
    ///
    /// # Errors
    /// See [`Dci::post`].
    pub fn send(
        &mut self,
        peer: &DcPeer,
        data: Payload<'_>,
        cookie: u64,
        flags: PostFlags,
    ) -> Result<()> {
        self.post(peer, &Request::Send { data }, cookie, flags)
    }

    /// Atomic compare-and-swap of the 8 bytes at `remote`; the old value lands in `local`
    /// (read it with [`Dci::atomic_result`]).
    ///
    /// # Errors
    /// See [`Dci::post`].
    #[allow(clippy::too_many_arguments)]
    pub fn compare_swap(
        &mut self,
        peer: &DcPeer,
        remote: Remote,
        compare: u64,
        swap: u64,
        local: Sge,
        cookie: u64,
        flags: PostFlags,
    ) -> Result<()> {
        let req = Request::CompareSwap {
            remote,
            compare,
            swap,
            local,
        };
        self.post(peer, &req, cookie, flags)
    }

    /// Atomic fetch-and-add on the 8 bytes at `remote`; the old value lands in `local`.
    ///
    /// # Errors
    /// See [`Dci::post`].
    pub fn fetch_add(
        &mut self,
        peer: &DcPeer,
        remote: Remote,
        add: u64,
        local: Sge,
        cookie: u64,
        flags: PostFlags,
    ) -> Result<()> {
        self.post(
            peer,
            &Request::FetchAdd { remote, add, local },
            cookie,
            flags,
        )
    }

    /// Moves the DCI to error: outstanding and later requests are flushed, each signaled
    /// one completing with [`WcStatus::WrFlushErr`](crate::WcStatus::WrFlushErr).
    ///
    /// # Errors
    /// `Error::Sim` on the software NIC when the DCI is gone.
    pub fn set_error(&mut self) -> Result<()> {
        self.errored = true;
        match &self.pd.inner.dev.backend {
            #[cfg(feature = "sim")]
            Backend::Sim(n) => Ok(n.set_error(self.qpn)?),
            Backend::Verbs(_) => Err(Error::Unsupported("DC on a verbs device")),
        }
    }
}

impl Drop for Dci {
    fn drop(&mut self) {
        self.pd.inner.dev.events.forget(Subject::Qp(self.qpn));
        self.pd.inner.lifetimes.reclaim();
        self.sq.release_cq();
        // The register claim goes before the QP (see `Qp`'s drop).
        self.sq.release_register();
        // With the CQ's list locked (no QP can take this number meanwhile), destroy the DCI,
        // then leave a tombstone over the entries it may still have in the CQ.
        let mut g = self.cq.registry.lock();
        match &self.pd.inner.dev.backend {
            #[cfg(feature = "sim")]
            Backend::Sim(n) => {
                let _ = n.destroy_qp(self.qpn);
                if let Some(td) = self.sim_td {
                    let _ = n.dealloc_td(td);
                }
            }
            Backend::Verbs(_) => {}
        }
        self.cq.registry.bury(&mut g, self.qpn);
    }
}
