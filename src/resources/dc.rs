//! Dynamically connected transport (DC): DC initiators ([`Dci`]) that reach any DC target
//! ([`Dct`]) named in each request, without a connection per peer.
//!
//! DC is an mlx5 transport: on a ConnectX the QPs are created by `mlx5dv_create_qp` with the
//! DC init attributes (`crate::dv::dc`) and posted to on the direct path; the software NIC
//! models both ends. Devices without it (rxe, siw and every other verbs device, and an mlx5
//! device run on the verbs path) refuse [`Pd::create_dci`] and [`Pd::create_dct`] with
//! [`Error::NoDc`].

use super::cq::CqHandle;
use super::events::Subject;
use super::{Cq, DataPath, Pd, PostSend, QpCaps, QueuePair};
use crate::backend::{self, QpKind, QpRings, QpSpec};
use crate::direct::SendQueue;
use crate::error::{Error, Result};
use crate::mlx5_env::Mlx5Env;
use crate::queue::flags::PostFlags;
use crate::queue::regions::RegionCheck;
use crate::queue::registry::Attached;
use crate::verbs::device::OdpCaps;
use crate::verbs::ex::VerbsApi;
use crate::verbs::objects::Timing;
use mlx5::dc::{DcAddr, AV_BYTES, MAX_DCTN};
use mlx5::request::Access;
use mlx5::request::{Payload, Request, Sge};
use std::sync::Arc;

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
    /// A destination from its parts. The address vector must name a port, as an address
    /// handle's does ([`Pd::create_ah`](crate::Pd::create_ah)): a LID on InfiniBand, a
    /// GID with the GRH bit or on RoCE (an AV with a next hop's MAC). Checked once here: a
    /// DCI request to the peer checks nothing of it.
    ///
    /// # Errors
    /// [`Error::InvalidParameter`] for a DCT number past 24 bits, and with the DCT number
    /// for an address vector that names no port (`rlid` 0 without a MAC, or an empty
    /// `rgid` with the GRH bit or a MAC): a ConnectX would send every request to LID 0,
    /// and the DCI would end in `RetryExcErr`.
    pub fn new(av: [u8; AV_BYTES], dctn: u32, dc_key: u64) -> Result<DcPeer> {
        if dctn > MAX_DCTN {
            return Err(Error::InvalidParameter {
                what: "DCT number (24 bits)",
                value: dctn as u64,
            });
        }
        // The AV's link layer is its own: a RoCE AV carries the next hop's MAC and no GRH
        // bit (rdma-core's `mlx5_create_ah`), an InfiniBand one no MAC.
        let a = mlx5::av::Av::from_bytes(&av);
        let ethernet = a.rmac != [0; 6];
        crate::address::check_destination(
            ethernet,
            ethernet || a.grh_bit(),
            a.rlid.get(),
            &a.rgid,
            "DC peer whose address vector names no port (rlid 0 without a MAC, or an empty \
             rgid with the GRH bit or a MAC): make it of an address handle to the target's \
             port (DcPeer::from_ah; DCT number given)",
            u64::from(dctn),
        )?;
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
    pub(crate) fn from_av(av: &mlx5::av::Av, dctn: u32, dc_key: u64) -> Result<DcPeer> {
        let a = DcAddr::from_av(av, dctn, dc_key);
        DcPeer::new(a.av, dctn, dc_key)
    }

    /// A destination reached through an address handle (`mlx5dv_wr_set_dc_addr`'s `ah`):
    /// its AV, the DCT number and key the target's owner gave out of band.
    ///
    /// # Errors
    /// As [`DcPeer::new`]; [`Error::InvalidHandle`] with the destination LID for an address
    /// handle of a device on the verbs path ([`DataPath::Verbs`]):
    /// it is rdma-core's `ibv_ah` alone, with no mlx5 address vector the crate read
    /// (`mlx5dv_init_obj` runs on the direct path only), so no DCI request could reach the
    /// DCT through it.
    pub fn from_ah(ah: &crate::resources::AddressHandle, dctn: u32, dc_key: u64) -> Result<DcPeer> {
        if ah.pd().device().data_path() == DataPath::Verbs {
            return Err(Error::InvalidHandle {
                what: "address handle of a device on the verbs path (no mlx5 address vector; \
                       its destination LID)",
                value: ah.attr().dlid as u64,
            });
        }
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

    /// The address segment every request to this peer carries (`mlx5dv_wr_set_dc_addr`'s).
    #[cfg(test)]
    fn segment(&self) -> [u8; AV_BYTES] {
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
    /// The backend's DCT: destroyed in Drop (`None` after).
    obj: Option<backend::Qp>,
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

    /// The DC access key an initiator must present (with [`Dct::dctn`], what a peer needs
    /// for [`DcPeer::new`] / [`DcPeer::from_ah`]).
    pub fn dc_key(&self) -> u64 {
        self.dc_key
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
        // The software NIC has one port, whose LID is known: an address vector to it, as an
        // address handle to the port gives (the NIC routes a DCI request by it, as a
        // ConnectX does).
        #[cfg(feature = "sim")]
        if let Some(nic) = self.pd.inner.dev.backend.sim_nic() {
            let (av, _) = self.pd.inner.pd.create_ah(&crate::address::AhAttr {
                dlid: nic.port_attr().lid,
                ..crate::address::AhAttr::default()
            })?;
            return DcPeer::from_av(&av, self.dctn, self.dc_key);
        }
        Err(Error::Unsupported(
            "a DC peer without an address handle on a verbs device (DcPeer::new)",
        ))
    }
}

impl Drop for Dct {
    fn drop(&mut self) {
        // As a QP's drop: with the CQ's list locked, destroy the DCT, then leave a tombstone
        // over the receive completions it may still have in the CQ.
        let obj = &mut self.obj;
        super::cq::destroy_and_bury([&self.cq, &self.cq], self.dctn, || drop(obj.take()));
        // Its events once it is destroyed (see `events::Forget`): its number comes back.
        self.pd.inner.dev.events.forget(Subject::Qp(self.dctn));
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
/// use blueflame::{Access, Completion, Device, Payload, PostFlags, PostSend, QpCaps, SrqCaps, WcOpcode};
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
/// let mut to_dct = dci.to(&peer);
/// to_dct.write_inline(b"hello", mr.remote(0)?, 1, PostFlags::SIGNALED)?;
/// to_dct.read(&[mr.sge(64, 5)?], mr.remote(0)?, 2, PostFlags::SIGNALED)?;
/// to_dct.send(Payload::Inline(b"ping"), 3, PostFlags::SIGNALED)?;
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
    /// The backend's DCI: destroyed in Drop, after the queue's claims (`None` after).
    obj: Option<backend::Qp>,
    qpn: u32,
    errored: bool,
    atomics: mlx5::AtomicCaps,
    pd: Pd,
    cq: Arc<CqHandle>,
    /// What it was created with, for [`Dci::recover`].
    caps: QpCaps,
    timing: Timing,
    /// A post that finds the DCI in error recovers it first ([`Dci::set_auto_recover`]).
    auto_recover: bool,
    /// On a device whose DC on-demand paging lacks an operation (`dc_odp_caps`): its caps
    /// and the domain's regions, to refuse requests with local entries in on-demand or
    /// dma-buf regions before posting.
    odp_refusal: Option<Box<(OdpCaps, RegionCheck)>>,
}

/// Refuses `req` when one of its local entries (gather list, read scatter list, atomic
/// reply) is in an on-demand or dma-buf region and the device's DC on-demand paging
/// (`odp`) lacks the request's operation: a ConnectX would fail it with a local protection
/// error (the kernel's `mlx5_ib_internal_fill_odp_caps` reports `dc_odp_caps` per operation).
fn dc_odp_refusal(odp: &OdpCaps, regions: &mut RegionCheck, req: &Request<'_>) -> Result<()> {
    fn sgl_of<'a>(p: &Payload<'a>) -> &'a [Sge] {
        match *p {
            Payload::Sgl(s) => s,
            Payload::Inline(_) => &[],
        }
    }
    let (need, sgl): (u32, &[Sge]) = match req {
        Request::Send { data } | Request::SendImm { data, .. } | Request::SendInv { data, .. } => {
            (OdpCaps::SEND, sgl_of(data))
        }
        Request::Write { data, .. } | Request::WriteImm { data, .. } => {
            (OdpCaps::WRITE, sgl_of(data))
        }
        Request::Read { sgl, .. } => (OdpCaps::READ, sgl),
        Request::CompareSwap { local, .. }
        | Request::FetchAdd { local, .. }
        | Request::Masked { local, .. } => (OdpCaps::RC_ATOMIC, core::slice::from_ref(local)),
        _ => return Ok(()),
    };
    if odp.dc(need) {
        return Ok(());
    }
    match regions.on_demand(sgl) {
        Some(lkey) => Err(Error::InvalidParameter {
            what: "DCI request with a local entry in an on-demand or dma-buf region (lkey): \
                   the device's DC on-demand paging (dc_odp_caps) lacks this operation",
            value: lkey as u64,
        }),
        None => Ok(()),
    }
}

impl core::fmt::Debug for Dci {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Dci").field("qpn", &self.qpn).finish()
    }
}

/// The rights a DCT may grant.
const DCT_RIGHTS: Access =
    Access(Access::REMOTE_WRITE.0 | Access::REMOTE_READ.0 | Access::REMOTE_ATOMIC.0);

impl Pd {
    /// Creates a DC initiator whose completions go to `send_cq`, ready to post, with the
    /// default [`Timing`] (ACK timeout 14, 7 retries). `caps.rq_entries`, `max_recv_sge` and
    /// `scatter_to_cqe` do not apply (a DCI has no receive queue).
    ///
    /// # Errors
    /// [`Error::NoDc`] on a device without DC (every verbs device but mlx5);
    /// [`Error::InvalidHandle`] for a CQ of another device; [`Error::InvalidParameter`] for
    /// `rnr_retry` above 7; [`Error::Unsupported`] on mlx5 with `MLX5_QP_SIGNATURE` set after
    /// the device was opened; the device's refusal of `caps`.
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
        self.create_dci_on(&send_cq.handle, caps, timing)
    }

    /// A DCI on the CQ of `cq` (checked by the caller: this device's).
    fn create_dci_on(&self, cq: &Arc<CqHandle>, caps: QpCaps, timing: &Timing) -> Result<Dci> {
        // rdma-core's switches, read as for an RC QP.
        let env = self.inner.dev.backend.qp_env();
        let spec = QpSpec {
            caps,
            send_cq: &cq.kind,
            kind: QpKind::Dci { timing },
            env: &env,
        };
        let (obj, rings, qpn) = self.inner.pd.create_qp(&spec)?;
        let QpRings::Direct { raw, dedicated } = rings else {
            return Err(Error::Unsupported("a DCI without its ring"));
        };
        // SAFETY: the ring belongs to the DCI `obj` owns, which this Dci alone posts to
        // (rdma-core is never asked to) and destroys in its drop, after which the queue
        // touches the ring no more; with `dedicated`, its register is this DCI's alone.
        let sq = unsafe {
            if dedicated {
                SendQueue::new_dedicated(&raw)?
            } else {
                SendQueue::new(&raw)?
            }
        };
        let mut dci = self.finish_dci(sq, obj, qpn, cq, &env);
        (dci.caps, dci.timing) = (caps, *timing);
        Ok(dci)
    }

    /// The accounting every DCI gets: its shadow tracked by the domain, its queue attached
    /// to the CQ's list and charged to the CQ's entries.
    fn finish_dci(
        &self,
        mut sq: SendQueue,
        obj: backend::Qp,
        qpn: u32,
        send_cq: &Arc<CqHandle>,
        env: &Mlx5Env,
    ) -> Dci {
        let shadow = sq.shadow.clone();
        self.inner.lifetimes.track(&shadow);
        send_cq.registry.attach(Attached::send(qpn, shadow));
        let atomics = self.inner.dev.atomic_caps();
        sq.set_atomic_caps(atomics);
        sq.set_max_message(self.inner.dev.max_message());
        // A DCI posts through `post_dc` only: the RC inline-write fast path stays off.
        sq.set_transport(crate::direct::Transport::Dci);
        sq.enable_fast_path(false);
        // The driver side of MLX5_POST_SEND_PREFER_BF, as for an RC QP.
        env.configure(&mut sq);
        sq.attach_cq(send_cq.registry.slots.clone());
        Dci {
            sq,
            obj: Some(obj),
            qpn,
            errored: false,
            atomics,
            pd: self.clone(),
            cq: send_cq.clone(),
            caps: QpCaps::default(),
            timing: Timing::default(),
            auto_recover: false,
            odp_refusal: {
                let odp = self.inner.dev.odp_caps();
                let all = OdpCaps::SEND | OdpCaps::WRITE | OdpCaps::READ | OdpCaps::RC_ATOMIC;
                (!odp.dc(all))
                    .then(|| Box::new((odp, RegionCheck::new(self.inner.regions.clone()))))
            },
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
    /// rights; [`Error::Capability`] ([`Capability::RemoteAtomics`](crate::Capability::RemoteAtomics))
    /// for [`Access::REMOTE_ATOMIC`] on a device without atomics;
    /// [`Error::InvalidHandle`] for a CQ of another device or an SRQ of another
    /// protection domain; [`Error::SrqCq`] when `recv_cq` is not the SRQ's CQ.
    pub fn create_dct(
        &self,
        recv_cq: &Cq,
        srq: &crate::resources::Srq,
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
        let spec = QpSpec {
            caps: QpCaps::default(),
            send_cq: &recv_cq.handle.kind,
            kind: QpKind::Dct {
                srq: h.obj()?,
                dc_key,
                access,
            },
            env: &self.inner.dev.backend.qp_env(),
        };
        let (obj, _, dctn) = self.inner.pd.create_qp(&spec)?;
        // The DCT's receive completions: cookies from the SRQ, by the CQE's WQE index (the
        // hook every receiver of an SRQ goes through; the CQ was checked above).
        let srq_handle = h.attach_receiver(&recv_cq.handle, recv_cq.cqn(), dctn, None)?;
        Ok(Dct {
            dctn,
            dc_key,
            access,
            pd: self.clone(),
            cq: recv_cq.handle.clone(),
            obj: Some(obj),
            srq: srq_handle,
        })
    }
}

impl Dci {
    /// Posts one request to `peer` (what [`DcSend`]'s [`PostSend::post`] runs).
    #[inline(always)]
    fn post_to(
        &mut self,
        peer: &DcPeer,
        req: &Request<'_>,
        cookie: u64,
        flags: PostFlags,
    ) -> Result<()> {
        if self.auto_recover && self.in_error() {
            self.recover_before_post()?;
        }
        if let Some(r) = self.odp_refusal.as_deref_mut() {
            dc_odp_refusal(&r.0, &mut r.1, req)?;
        }
        match self.sq.post_dc(&peer.addr, req, cookie, flags) {
            Ok(()) => Ok(()),
            Err(e) => Err(self.explain(e)),
        }
    }

    /// Whether the DCI is in error: one of its requests failed (as far as its CQ has been
    /// polled) or [`QueuePair::set_error`] moved it there. A DCI in error flushes every
    /// request after the failed one, to every target; [`Dci::recover`] brings it back.
    pub fn in_error(&self) -> bool {
        self.errored || self.sq.shadow.failed()
    }

    /// Brings a DCI in error back to a ready one, as UCX does when one target went away
    /// and the DCI's retries ran out (`uct_dc_mlx5_iface_reset_dci`, then
    /// `uct_dc_mlx5_iface_dci_connect`): UCX moves it to RESET, cleans its entries from the
    /// CQ and posts from index 0 again; here the DCI is replaced by a new one with the same
    /// capabilities, timers and CQ (`mlx5dv_create_qp` and the transitions to RTS; the old
    /// one destroyed as a dropped DCI is), so the ring starts at 0 and the CQ can hold
    /// nothing of it. Its number ([`QueuePair::qpn`]) changes: no target knows it.
    ///
    /// Every request posted before must have completed first (with the failure and the
    /// flushes: poll them): nothing is lost or reported twice. In error, every request gets
    /// a completion of its own, but for unsignaled ones that ran before
    /// [`QueuePair::set_error`] (no CQE comes for those: a ConnectX flushes only what it
    /// has not run), which `set_error` retires with one signaled request it posts behind
    /// them, flushed and not reported; a DCI that is not in error is replaced too, once its last
    /// request was signaled and polled (unsignaled requests are retired only by a later
    /// signaled one). The new DCI is created before the old one goes, so that a failure
    /// leaves the DCI as it was: on a device whose dedicated BlueFlame registers are all
    /// taken it may get a shared one ([`crate::DoorbellMode::SharedLocked`]).
    ///
    /// # Errors
    /// [`Error::InvalidState`] while requests are outstanding; the creation's errors
    /// ([`Pd::create_dci`]), in which case the DCI is as it was.
    pub fn recover(&mut self) -> Result<()> {
        if !self.settled() {
            return Err(Error::InvalidState {
                state: "a DCI with requests outstanding: poll its completions (the failed \
                        and flushed ones too), then recover",
            });
        }
        self.replace()
    }

    /// Whether every request posted has completed (the ring is whole again), once the WQEs
    /// of a forgotten batch are rung (they complete, flushed, like the others) and, in
    /// error, `set_error`'s closing WQE is posted if it was refused there
    /// (`SendQueue::close_unsignaled_tail`).
    fn settled(&mut self) -> bool {
        self.sq.ring();
        if self.errored {
            let _ = self.sq.close_unsignaled_tail();
        }
        self.sq.free_blocks() == self.sq.ring_blocks()
    }

    /// [`Dci::recover`] once [`Dci::settled`]: a new DCI in this one's place, this one
    /// destroyed after (a failed creation leaves this one as it was).
    fn replace(&mut self) -> Result<()> {
        let mut fresh = self.pd.create_dci_on(&self.cq, self.caps, &self.timing)?;
        fresh.auto_recover = self.auto_recover;
        drop(std::mem::replace(self, fresh));
        Ok(())
    }

    /// With `on`, a post that finds the DCI in error ([`Dci::in_error`]) recovers it first
    /// ([`Dci::recover`]): once the failed and flushed completions are polled the next post
    /// goes out on a fresh DCI; until then a post is refused with [`Error::InvalidState`]
    /// (it would only be flushed). Off by default. Posts through [`Dci::batch`] do not
    /// recover.
    pub fn set_auto_recover(&mut self, on: bool) {
        self.auto_recover = on;
    }

    /// [`Dci::set_auto_recover`]'s recovery at a post.
    #[cold]
    #[inline(never)]
    fn recover_before_post(&mut self) -> Result<()> {
        if !self.settled() {
            return Err(Error::InvalidState {
                state: "a DCI in error: poll its failed and flushed completions, then post \
                        again (it recovers then)",
            });
        }
        self.replace()
    }

    /// This DCI aimed at one DC target: post to it with the [`PostSend`] methods.
    ///
    /// ```
    /// # #[cfg(feature = "sim")] fn main() -> blueflame::Result<()> {
    /// use blueflame::{Access, Completion, Device, PostFlags, PostSend, QpCaps, SrqCaps};
    /// let dev = Device::sim_stepped();
    /// let pd = dev.alloc_pd()?;
    /// let tcq = dev.create_cq(16)?;
    /// let srq = pd.create_srq(&tcq, SrqCaps::default())?;
    /// let dct = pd.create_dct(&tcq, &srq, 7, Access::REMOTE_WRITE)?;
    /// let mr = pd.alloc_mr(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE)?;
    /// let mut cq = dev.create_cq(16)?;
    /// let mut dci = pd.create_dci(&cq, QpCaps::default())?;
    /// dci.to(&dct.peer()?).write_inline(b"hello", mr.remote(0)?, 1, PostFlags::SIGNALED)?;
    /// dev.process();
    /// assert_eq!(cq.poll(&mut [Completion::default(); 1]), 1);
    /// let mut got = [0u8; 5];
    /// mr.read(0, &mut got)?;
    /// assert_eq!(&got, b"hello");
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sim"))] fn main() {}
    /// ```
    pub fn to<'a>(&'a mut self, peer: &'a DcPeer) -> DcSend<'a> {
        DcSend { dci: self, peer }
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
            odp_refusal: self.odp_refusal.as_deref_mut(),
        }
    }

    /// A refused post: a queue or CQ that does not drain may be the sign of an asynchronous
    /// event about this DCI or its CQ, reported instead (as [`PostSend::post`](crate::PostSend::post)).
    #[cold]
    fn explain(&self, e: Error) -> Error {
        super::events::explain_refusal(e, || self.check())
    }
}

impl QueuePair for Dci {
    fn qpn(&self) -> u32 {
        self.qpn
    }

    fn pd(&self) -> &Pd {
        &self.pd
    }

    fn free_send(&self) -> u32 {
        self.sq.free_blocks()
    }

    fn send_depth(&self) -> u32 {
        self.sq.depth()
    }

    fn set_error(&mut self) -> Result<()> {
        self.errored = true;
        match &self.obj {
            Some(q) => q.set_error()?,
            None => return Err(Error::InvalidState { state: "destroyed" }),
        }
        // An unsignaled tail that ran before the modify completes with nothing: a signaled
        // WQE behind it, flushed, retires it (refused for want of room: `recover` tries
        // again).
        let _ = self.sq.close_unsignaled_tail();
        Ok(())
    }

    fn check(&self) -> Result<()> {
        let dev = &self.pd.inner.dev;
        dev.events
            .check(&dev.backend, &[Subject::Qp(self.qpn), self.cq.subject()])
    }

    fn atomic_caps(&self) -> mlx5::AtomicCaps {
        self.atomics
    }

    /// Always the direct path: DC runs only there.
    fn data_path(&self) -> DataPath {
        DataPath::Direct
    }

    /// None: DC runs only on the direct path.
    fn verbs_api(&self) -> Option<VerbsApi> {
        None
    }

    /// 0: a DCI has no receive queue.
    fn free_recv(&self) -> u32 {
        0
    }

    /// 0: a DCI has no receive queue.
    fn recv_depth(&self) -> u32 {
        0
    }
}

/// A [`Dci`] aimed at one DC target ([`Dci::to`]): the [`PostSend`] methods post to it.
/// Each request carries the target's address, DCT number and DC key; the DCI may aim at
/// another target with the next request.
#[derive(Debug)]
pub struct DcSend<'a> {
    dci: &'a mut Dci,
    peer: &'a DcPeer,
}

impl PostSend for DcSend<'_> {
    /// Posts one request to the target.
    ///
    /// # Errors
    /// Before anything is posted: [`Error::Unsupported`] for a bind, local invalidate,
    /// send with invalidate or NOP, or an atomic the device lacks; [`Error::QueueFull`],
    /// [`Error::CqFull`], [`Error::TooManySge`], [`Error::InlineTooLong`],
    /// [`Error::WqeTooLarge`], [`Error::Misaligned`], [`Error::AtomicLength`],
    /// [`Error::InvalidParameter`] (a read, write or send of more than the port's largest
    /// message, [`Device::max_message`](crate::Device::max_message)).
    #[inline(always)]
    fn post(&mut self, req: &Request<'_>, cookie: u64, flags: PostFlags) -> Result<()> {
        self.dci.post_to(self.peer, req, cookie, flags)
    }
}

impl Drop for Dci {
    fn drop(&mut self) {
        self.pd.inner.lifetimes.reclaim();
        // The queue's CQ charge stays whole until the DCI is destroyed (see `Qp`'s drop).
        let leaving = self.sq.leave_cq();
        // The register claim goes before the QP (see `Qp`'s drop).
        self.sq.release_register();
        // With the CQ's list locked (no QP can take this number meanwhile), destroy the DCI
        // (the queue does not touch the ring again), then leave a tombstone over the entries
        // it may still have in the CQ.
        let obj = &mut self.obj;
        super::cq::destroy_and_bury([&self.cq, &self.cq], self.qpn, || drop(obj.take()));
        drop(leaving);
        // Its events once it is destroyed (see `events::Forget`).
        self.pd.inner.dev.events.forget(Subject::Qp(self.qpn));
    }
}

/// DCI requests written together and posted with one doorbell ([`Dci::batch`]). Dropped
/// without [`DciBatch::ring`], it posts nothing (the ring space and completion moderation
/// are given back).
#[must_use = "a batch posts nothing until rung"]
pub struct DciBatch<'a> {
    inner: crate::direct::Batch<'a>,
    odp_refusal: Option<&'a mut (OdpCaps, RegionCheck)>,
}

impl DciBatch<'_> {
    /// Adds one request to `peer`.
    ///
    /// # Errors
    /// As [`PostSend::post`]; the requests pushed before stay in the batch.
    pub fn push(
        &mut self,
        peer: &DcPeer,
        req: &Request<'_>,
        cookie: u64,
        flags: PostFlags,
    ) -> Result<()> {
        if let Some(r) = self.odp_refusal.as_deref_mut() {
            dc_odp_refusal(&r.0, &mut r.1, req)?;
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The address segment carries the DCT number with MLX5_EXTENDED_UD_AV and the key
    /// big-endian, as rdma-core's `mlx5dv_wr_set_dc_addr` writes it.
    #[test]
    fn the_dc_address_segment_is_what_rdma_core_writes() {
        let mut av = [0; 48];
        av[15] = 9; // rlid
        let peer = DcPeer::new(av, 0x12_3456, 0x0102_0304_0506_0708).unwrap();
        let seg = peer.segment();
        assert_eq!(seg[0..8], [1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(seg[8..12], [0x80, 0x12, 0x34, 0x56]);
        assert_eq!(seg[12..], av[12..]);
    }

    /// A peer reached through an address handle carries the handle's AV.
    #[cfg(feature = "sim")]
    #[test]
    fn a_peer_from_an_address_handle_carries_its_av() {
        let dev = crate::resources::Device::sim_stepped();
        let pd = dev.alloc_pd().unwrap();
        let ah = pd
            .create_ah(crate::address::AhAttr {
                dlid: 9,
                sl: 2,
                ..crate::address::AhAttr::default()
            })
            .unwrap();
        let peer = DcPeer::from_ah(&ah, 0x42, 0x77).unwrap();
        let want = mlx5::av::DatagramSeg::dc(ah.av(), 0x42, 0x77);
        assert_eq!(peer.segment()[..], *zerocopy::IntoBytes::as_bytes(&want));
    }
}
