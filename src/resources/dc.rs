//! Dynamically connected transport (DC): DC initiators ([`Dci`]) that reach any DC target
//! ([`Dct`]) named in each request, without a connection per peer.
//!
//! DC is an mlx5 transport: on a ConnectX the QPs are created by `mlx5dv_create_qp` with the
//! DC init attributes (`crate::dv::dc`) and posted to on the direct path; the software NIC
//! models both ends. Devices without it (rxe, siw and every other verbs device, and an mlx5
//! device run on the verbs path) refuse [`Pd::create_dci`] and [`Pd::create_dct`] with
//! [`Error::NoDc`].

use super::cq::CqHandle;
use super::device::{Backend, PdKind, VerbsDev};
use super::events::Subject;
use super::{Cq, Pd, QpCaps};
use crate::direct::SendQueue;
use crate::error::{Error, Result};
use crate::queue::registry::Attached;
use crate::verbs::objects::Timing;
use crate::{Access, Payload, PostFlags, Remote, Request, Sge};
use mlx5::dc::{DcAddr, AV_BYTES, MAX_DCTN};
use std::sync::Arc;

/// A DC QP rdma-core created on a ConnectX (`mlx5dv_create_qp`), destroyed with the owner
/// after its queue.
struct HwDc(*mut rdma_sys::ibv_qp);

// SAFETY: the QP pointer is only passed to `ibv_destroy_qp` once, on drop; rdma-core's QP
// objects may be destroyed from any thread.
unsafe impl Send for HwDc {}
// SAFETY: shared references never use the pointer: the only uses are `Dci::set_error` and
// `Drop`, both through `&mut`.
unsafe impl Sync for HwDc {}

impl Drop for HwDc {
    fn drop(&mut self) {
        // SAFETY: a live QP created by `create_dc_qp`, destroyed once.
        unsafe { rdma_sys::ibv_destroy_qp(self.0) };
    }
}

impl HwDc {
    /// `mlx5dv_create_qp` with the DC attributes, then the transitions.
    ///
    /// # Safety
    /// `ctx`, `pd`, `cq` and `srq` (when not null) must be live objects of one mlx5 device.
    unsafe fn create(
        ctx: *mut rdma_sys::ibv_context,
        t: crate::dv::dc::DcType,
        (pd, cq, srq): (
            *mut rdma_sys::ibv_pd,
            *mut rdma_sys::ibv_cq,
            *mut rdma_sys::ibv_srq,
        ),
        cap: rdma_sys::ibv_qp_cap,
        steps: &mut [crate::dv::dc::Step],
    ) -> Result<HwDc> {
        let mut attr = crate::dv::dc::init_attr(t, pd, cq, srq, cap);
        let mut dv = crate::dv::dc::dv_attr(t);
        // SAFETY: live objects of the context (caller contract).
        let qp = unsafe { crate::dv::dc::create_dc_qp(ctx.cast(), &mut attr, &mut dv)? };
        let hw = HwDc(qp);
        // SAFETY: the QP just created.
        unsafe { crate::dv::dc::modify(qp, steps)? };
        Ok(hw)
    }
}

/// The verbs objects behind a CQ and a PD of a ConnectX.
fn verbs_objects(pd: &Pd, cq: &Cq) -> Result<(*mut rdma_sys::ibv_pd, *mut rdma_sys::ibv_cq)> {
    let vpd = match &pd.inner.kind {
        PdKind::Verbs(p) => p.pd,
        #[cfg(feature = "sim")]
        PdKind::Sim(_) => return Err(Error::Unsupported("a software-NIC PD on a verbs device")),
    };
    match &cq.handle.kind {
        super::cq::CqKind::Verbs(c) => Ok((vpd, c.cq)),
        #[cfg(feature = "sim")]
        super::cq::CqKind::Sim { .. } => Err(Error::Unsupported("a software-NIC CQ with a DC QP")),
    }
}

/// What the transitions need of the device's port.
fn port_attrs(v: &VerbsDev) -> Result<crate::dv::dc::PortAttrs> {
    let port = v.ctx.port(v.port)?;
    Ok(crate::dv::dc::PortAttrs {
        port: v.port,
        mtu: port.active_mtu,
        gid_index: v.gid_index.map(|g| g as u8),
    })
}

/// Where a DCI request goes: a DCT's address vector (the 48-byte `struct mlx5_wqe_av` of an
/// address handle of its port), its number and its DC access key.
///
/// On one device (the software NIC) [`Dct::peer`] gives it; across machines, exchange
/// [`Dct::dctn`] and the key out of band and build it with [`DcPeer::from_ah`] from an
/// address handle to the target's port ([`Pd::create_ah`](crate::Pd::create_ah)).
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

    /// A destination reached through an address handle's address vector: on a ConnectX,
    /// the AV `mlx5dv_init_obj` gives for the `ibv_ah` to the target's port, or the one
    /// [`Av::from_attr`](mlx5::av::Av::from_attr) builds as `mlx5_create_ah` does.
    ///
    /// # Errors
    /// As [`DcPeer::new`].
    pub fn from_av(av: &mlx5::av::Av, dctn: u32, dc_key: u64) -> Result<DcPeer> {
        let a = DcAddr::from_av(av, dctn, dc_key);
        DcPeer::new(a.av, dctn, dc_key)
    }

    /// A destination reached through an address handle (`mlx5dv_wr_set_dc_addr`'s `ah`):
    /// its AV, the DCT number and key the target's owner gave out of band.
    ///
    /// # Errors
    /// As [`DcPeer::new`].
    pub fn from_ah(ah: &crate::AddressHandle, dctn: u32, dc_key: u64) -> Result<DcPeer> {
        DcPeer::from_av(ah.av(), dctn, dc_key)
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
    /// The rdma-core DCT on a ConnectX (None on the software NIC).
    hw: Option<HwDc>,
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
            Backend::Verbs(_) => drop(self.hw.take()),
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
    /// The rdma-core DCI on a ConnectX (None on the software NIC).
    hw: Option<HwDc>,
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
    // SAFETY: the context is live (the device holds it); `device` is the ibv_device it was
    // opened on.
    let mlx5 = unsafe { crate::dv::is_mlx5((*v.ctx.ctx).device.cast()) };
    let why = if mlx5 {
        "an mlx5 device on the verbs path (BLUEFLAME_PATH=verbs or MLX5_QP_SIGNATURE): \
         DC runs on the direct path only"
    } else {
        "DC is an mlx5 transport (mlx5dv_create_qp with MLX5DV_QP_INIT_ATTR_MASK_DC); \
         this device's provider has none"
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
                // rdma-core's switches, read when the QP is created, as for an RC QP:
                // MLX5_SHUT_UP_BF (the register is rung without BlueFlame).
                let env = crate::mlx5_env::Mlx5Env::current();
                let caps = mlx5::sim::QpCaps::from(QpCaps {
                    bf_size: if env.shut_up_bf { 0 } else { caps.bf_size },
                    ..caps
                });
                let (mut raw, td) = super::sim_td::create_on_own_td(nic, |td| match td {
                    Some(td) => nic.create_dci_on_td(*pd, td, send_cq.cqn(), caps),
                    None => nic.create_dci(*pd, send_cq.cqn(), caps),
                })?;
                env.apply(&mut raw);
                let undo = |e: Error| {
                    super::sim_td::destroy_with_td(nic, raw.qpn, td);
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
                Ok(self.finish_dci(sq, None, raw.qpn, send_cq, td))
            }
            (Backend::Verbs(v), _) if v.path != crate::DataPath::Direct => Err(no_dc(self, v)),
            (Backend::Verbs(v), _) => self.hw_dci(v, send_cq, caps, timing),
            #[cfg(feature = "sim")]
            _ => Err(Error::Unsupported("PD and device backends differ")),
        }
    }

    /// A DCI on a ConnectX: `mlx5dv_create_qp` (`MLX5DV_DCTYPE_DCI`), UCX's transitions to
    /// RTS, the rings from `mlx5dv_init_obj`.
    fn hw_dci(&self, v: &VerbsDev, send_cq: &Cq, caps: QpCaps, timing: &Timing) -> Result<Dci> {
        let (pd, cq) = verbs_objects(self, send_cq)?;
        let lim = mlx5::wqe::Limits {
            max_sge: caps.max_send_sge as usize,
            max_inline: caps.max_inline as usize,
        };
        let wrs = caps.sq_blocks / mlx5::dc::max_dc_wqe_bbs(&lim) as u32;
        let cap = rdma_sys::ibv_qp_cap {
            max_send_wr: wrs.max(1),
            max_recv_wr: 0,
            max_send_sge: caps.max_send_sge,
            max_recv_sge: 0,
            max_inline_data: caps.max_inline,
        };
        let timing = Timing {
            rnr_retry: timing.rnr_retry.min(caps.rnr_retry),
            ..*timing
        };
        let mut steps =
            crate::dv::dc::dci_steps(&port_attrs(v)?, &timing, v.attrs.max_qp_init_rd_atom);
        let t = crate::dv::dc::DcType::Dci;
        // SAFETY: the context, PD and CQ are live objects of this mlx5 device (the PD and
        // CQ are this domain's and the CQ's, checked above, kept alive by the Dci).
        let hw = unsafe {
            HwDc::create(
                v.ctx.ctx,
                t,
                (pd, cq, std::ptr::null_mut()),
                cap,
                &mut steps,
            )?
        };
        // SAFETY: a live QP of an mlx5 device.
        let dv = unsafe { crate::dv::init_qp(hw.0.cast())? };
        // SAFETY: `hw.0` is live; rdma-core filled the QP number.
        let qpn = unsafe { (*hw.0).qp_num };
        let mut raw = crate::dv::raw_qp(
            &dv,
            &crate::dv::QpLimits {
                qpn,
                max_inline: caps.max_inline,
                max_send_sge: caps.max_send_sge,
                max_recv_sge: 0,
            },
        )?;
        crate::mlx5_env::Mlx5Env::current().apply(&mut raw);
        // SAFETY: the rings belong to the DCI just created, which rdma-core is never asked
        // to post to and which the Dci destroys after the queue; its register may be shared
        // with other QPs of the context (no thread domain): the locked mode.
        let sq = unsafe { SendQueue::new(&raw)? };
        Ok(self.finish_dci(sq, Some(hw), qpn, send_cq, None))
    }

    /// The accounting every DCI gets: its shadow tracked by the domain, its queue attached
    /// to the CQ's list and charged to the CQ's entries.
    #[cfg_attr(not(feature = "sim"), allow(dead_code))]
    fn finish_dci(
        &self,
        mut sq: SendQueue,
        hw: Option<HwDc>,
        qpn: u32,
        send_cq: &Cq,
        #[cfg_attr(not(feature = "sim"), allow(unused_variables))] td: Option<u32>,
    ) -> Dci {
        let shadow = sq.shadow.clone();
        self.inner.lifetimes.track(&shadow);
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
        sq.set_transport(crate::direct::Transport::Dci);
        sq.enable_fast_path(false);
        // The driver side of MLX5_POST_SEND_PREFER_BF, as for an RC QP.
        crate::mlx5_env::Mlx5Env::current().configure(&mut sq);
        sq.attach_cq(send_cq.handle.registry.slots.clone());
        Dci {
            sq,
            hw,
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
        let (dctn, hw) = self.new_dct(recv_cq, h, dc_key, access)?;
        // The DCT's receive completions: cookies from the SRQ, by the CQE's WQE index (the
        // hook every receiver of an SRQ goes through; the CQ was checked above).
        let srq_handle = h.attach_receiver(&recv_cq.handle, recv_cq.cqn(), dctn)?;
        Ok(Dct {
            dctn,
            dc_key,
            access,
            pd: self.clone(),
            cq: recv_cq.handle.clone(),
            hw,
            srq: srq_handle,
        })
    }
}

impl Pd {
    /// A new target: its number, and on a ConnectX the rdma-core DCT.
    fn new_dct(
        &self,
        recv_cq: &Cq,
        srq: &super::srq::SrqHandle,
        dc_key: u64,
        access: Access,
    ) -> Result<(u32, Option<HwDc>)> {
        match (&self.inner.dev.backend, &self.inner.kind) {
            #[cfg(feature = "sim")]
            (Backend::Sim(nic), PdKind::Sim(pd)) => {
                // rdma-core's create_dct keeps MLX5_QP_FLAG_SCATTER_CQE unless
                // MLX5_SCATTER_TO_CQE=0 (`use_scatter_to_cqe`).
                let scatter = !crate::mlx5_env::Mlx5Env::current().scatter_to_cqe_off;
                let n = nic.create_dct(*pd, recv_cq.cqn(), Some(srq.srqn), dc_key, access)?;
                if !scatter {
                    nic.set_dct_scatter_to_cqe(n, false)?;
                }
                Ok((n, None))
            }
            (Backend::Verbs(v), _) if v.path != crate::DataPath::Direct => Err(no_dc(self, v)),
            (Backend::Verbs(v), _) => {
                let (pd, cq) = verbs_objects(self, recv_cq)?;
                let vsrq = srq
                    .verbs
                    .as_ref()
                    .ok_or(Error::Unsupported("a software-NIC SRQ with a DCT"))?
                    .srq;
                // SAFETY: a zeroed ibv_qp_cap is valid; a DCT sends nothing.
                let cap: rdma_sys::ibv_qp_cap = unsafe { std::mem::zeroed() };
                let mut steps = crate::dv::dc::dct_steps(&port_attrs(v)?, access.0, 12);
                let t = crate::dv::dc::DcType::Dct { key: dc_key };
                // SAFETY: the context, PD, CQ and SRQ are live objects of this mlx5 device,
                // kept alive by the Dct (its domain, CQ and SRQ handles).
                let hw = unsafe { HwDc::create(v.ctx.ctx, t, (pd, cq, vsrq), cap, &mut steps)? };
                // SAFETY: `hw.0` is live; rdma-core filled the QP number (the DCT number).
                let n = unsafe { (*hw.0).qp_num };
                Ok((n, Some(hw)))
            }
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
    /// [`Error::InvalidParameter`] (a read, write or send of more than 2^31 bytes).
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

    /// Starts a batch: requests to any DCTs, written as they are pushed and posted with one
    /// doorbell by [`DciBatch::ring`]; dropped without ringing, nothing is posted.
    ///
    /// ```
    /// # #[cfg(feature = "sim")] fn main() -> blueflame::Result<()> {
    /// use blueflame::{Access, Completion, Device, PostFlags, QpCaps, Request, Payload, SrqCaps};
    /// let dev = Device::sim_stepped();
    /// let pd = dev.alloc_pd()?;
    /// let tcq = dev.create_cq(16)?;
    /// let srq = pd.create_srq(&tcq, SrqCaps::default())?;
    /// let (a, b) = (
    ///     pd.create_dct(&tcq, &srq, 1, Access::REMOTE_WRITE)?,
    ///     pd.create_dct(&tcq, &srq, 2, Access::REMOTE_WRITE)?,
    /// );
    /// let mr = pd.alloc_mr(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE)?;
    /// let mut cq = dev.create_cq(16)?;
    /// let mut dci = pd.create_dci(&cq, QpCaps::default())?;
    /// let mut batch = dci.batch();
    /// for (i, dct) in [&a, &b, &a].into_iter().enumerate() {
    ///     let req = Request::Write { remote: mr.remote(8 * i)?, data: Payload::Inline(b"x") };
    ///     let last = i == 2;
    ///     let flags = if last { PostFlags::SIGNALED } else { PostFlags::UNSIGNALED };
    ///     batch.push(&dct.peer()?, &req, i as u64, flags)?;
    /// }
    /// batch.ring();                                     // one doorbell for the three
    /// dev.process();
    /// let mut out = [Completion::default(); 4];
    /// assert_eq!(cq.poll(&mut out), 1);
    /// assert_eq!(out[0].cookie, 2);
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sim"))] fn main() {}
    /// ```
    pub fn batch(&mut self) -> DciBatch<'_> {
        DciBatch {
            inner: self.sq.batch(),
        }
    }

    /// A refused post: a queue or CQ that does not drain may be the sign of an asynchronous
    /// event about this DCI or its CQ, reported instead (as [`Qp::post`](crate::Qp::post)).
    #[cold]
    fn explain(&self, e: Error) -> Error {
        super::events::explain_refusal(e, || self.check())
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
    /// `Error::Sim` on the software NIC when the DCI is gone; [`Error::Verbs`] when
    /// `ibv_modify_qp` refuses.
    pub fn set_error(&mut self) -> Result<()> {
        self.errored = true;
        match (&self.pd.inner.dev.backend, &self.hw) {
            #[cfg(feature = "sim")]
            (Backend::Sim(n), _) => Ok(n.set_error(self.qpn)?),
            (Backend::Verbs(_), Some(hw)) => {
                // SAFETY: a zeroed ibv_qp_attr is valid.
                let mut attr: rdma_sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
                attr.qp_state = rdma_sys::ibv_qp_state::IBV_QPS_ERR;
                let mask = rdma_sys::ibv_qp_attr_mask::IBV_QP_STATE.0;
                // SAFETY: the DCI's live QP.
                unsafe { crate::dv::dc::modify(hw.0, &mut [(attr, mask)]) }
            }
            (Backend::Verbs(_), None) => Err(Error::Unsupported("a DCI without its QP")),
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
            Backend::Sim(n) => super::sim_td::destroy_with_td(n, self.qpn, self.sim_td),
            // `ibv_destroy_qp` now; the queue does not touch the ring again.
            Backend::Verbs(_) => drop(self.hw.take()),
        }
        self.cq.registry.bury(&mut g, self.qpn);
    }
}

/// DCI requests written together and posted with one doorbell ([`Dci::batch`]). Dropped
/// without [`DciBatch::ring`], it posts nothing (the ring space and completion moderation
/// are given back).
#[must_use = "a batch posts nothing until rung"]
pub struct DciBatch<'a> {
    inner: crate::direct::Batch<'a>,
}

impl DciBatch<'_> {
    /// Adds one request to `peer`.
    ///
    /// # Errors
    /// As [`Dci::post`]; the requests pushed before stay in the batch.
    pub fn push(
        &mut self,
        peer: &DcPeer,
        req: &Request<'_>,
        cookie: u64,
        flags: PostFlags,
    ) -> Result<()> {
        self.inner.push_dc(&peer.addr, req, cookie, flags)
    }

    /// Requests in the batch.
    pub fn len(&self) -> usize {
        self.inner.len()
    }

    /// Whether the batch is empty.
    pub fn is_empty(&self) -> bool {
        self.inner.is_empty()
    }

    /// Posts the whole batch with one doorbell.
    pub fn ring(self) {
        self.inner.ring();
    }
}
