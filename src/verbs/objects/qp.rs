//! Queue pairs over rdma-core, RC and UD: creation (`ibv_create_qp_ex`, or `rdma_create_qp_ex`
//! through rdma_cm), with the extended send operations when the provider has them, on a
//! thread domain when asked; the state transitions (`ibv_modify_qp`); a UD QP's multicast
//! groups (`ibv_attach_mcast` / `ibv_detach_mcast`).

use super::attrs::{Caps, ConnLimits, Endpoint, Timing};
use super::cq::Cq;
use super::pd::Pd;
use super::srq::Srq;
use super::td::{qp_pd, thread_domain, ThreadDomain};
use crate::error::{Error, Result};
use crate::verbs::ex::{
    create_qp_ex, send_ops_flags, ud_send_ops_flags, ApiChoice, SendOps, UdSendOps, VerbsApi,
};
use crate::verbs::{code, last, VerbsError};
use mlx5::request::Access;
use rdma_sys as ffi;
use std::sync::Arc;

/// An RC queue pair.
pub struct Qp {
    pub(crate) qp: *mut ffi::ibv_qp,
    pub(crate) caps: Caps,
    /// The extended send operations (`ibv_wr_*`), when the QP was created with them.
    pub(crate) send_ops: Option<SendOps>,
    /// The extended send operations of a UD QP (`ibv_wr_send` + `ibv_wr_set_ud_addr`),
    /// when it was created with them (see [`Qp::new_ud`]); None for an RC QP.
    pub(crate) ud_ops: Option<UdSendOps>,
    /// The rdma_cm id that created the QP (it is destroyed through it).
    pub(super) cm_id: Option<*mut ffi::rdma_cm_id>,
    /// The QP's thread domain, when it was created on one: freed after the QP (Drop).
    pub(super) td: Option<ThreadDomain>,
    /// Keeps the domain alive until the QP is destroyed.
    pub(super) _pd: Arc<Pd>,
    pub(super) _cqs: [Arc<Cq>; 2],
    /// The SRQ the QP takes its receives from (destroyed after the QP).
    pub(super) _srq: Option<Arc<Srq>>,
    /// The scatter lists of the QP's receive queue (set by its
    /// [`VerbsRecvQueue`](crate::verbs::rq::VerbsRecvQueue)): dropped only after the QP is
    /// destroyed (Drop below), so the regions its outstanding receives pin stay registered
    /// while the device may still write them, whoever holds the QP last.
    pub(crate) recv_targets: std::sync::OnceLock<Arc<crate::queue::scatter::ScatterTable>>,
}

// SAFETY: as for Pd; posting is serialised by the owner (`&mut`).
unsafe impl Send for Qp {}
// SAFETY: as for Pd.
unsafe impl Sync for Qp {}

/// The creation attributes every QP starts from: its CQs, type, sizes and PD (signaled
/// requests only as asked, `sq_sig_all` 0).
pub(super) fn base_init_attr(
    send_cq: &Cq,
    recv_cq: &Cq,
    caps: &Caps,
    pd: *mut ffi::ibv_pd,
    qp_type: ffi::ibv_qp_type::Type,
) -> ffi::ibv_qp_init_attr_ex {
    // SAFETY: a zeroed init attr is valid; the fields that matter are set below.
    let mut attr: ffi::ibv_qp_init_attr_ex = unsafe { std::mem::zeroed() };
    attr.send_cq = send_cq.cq;
    attr.recv_cq = recv_cq.cq;
    attr.qp_type = qp_type;
    attr.sq_sig_all = 0;
    attr.cap.max_send_wr = caps.max_send_wr;
    attr.cap.max_recv_wr = caps.max_recv_wr;
    attr.cap.max_send_sge = caps.max_send_sge;
    attr.cap.max_recv_sge = caps.max_recv_sge;
    attr.cap.max_inline_data = caps.max_inline;
    attr.comp_mask = ffi::ibv_qp_init_attr_mask::IBV_QP_INIT_ATTR_PD.0;
    attr.pd = pd;
    attr
}

/// The creation attributes of an RC QP on these CQs with these sizes, on `pd` (a PD or a
/// thread domain's parent domain); with `extended`, asking for the `ibv_wr_*` opcodes the
/// verbs path posts (`IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`), the atomic ones where `pd`'s
/// device has atomics ([`send_ops_flags`]).
fn init_attr_ex(
    send_cq: &Cq,
    recv_cq: &Cq,
    caps: &Caps,
    (pd, atomics): (*mut ffi::ibv_pd, bool),
    extended: bool,
    srq: Option<&Srq>,
) -> ffi::ibv_qp_init_attr_ex {
    let mut attr = base_init_attr(send_cq, recv_cq, caps, pd, ffi::ibv_qp_type::IBV_QPT_RC);
    if let Some(srq) = srq {
        // Receives come from the SRQ: the QP has no receive queue.
        attr.srq = srq.srq;
        attr.cap.max_recv_wr = 0;
        attr.cap.max_recv_sge = 0;
    }
    if extended {
        attr.comp_mask |= ffi::ibv_qp_init_attr_mask::IBV_QP_INIT_ATTR_SEND_OPS_FLAGS.0;
        attr.send_ops_flags = send_ops_flags(atomics);
    }
    attr
}

/// The sizes the device really gave (written back into the attributes).
fn caps_of(attr: &ffi::ibv_qp_init_attr_ex) -> Caps {
    Caps {
        max_send_wr: attr.cap.max_send_wr,
        max_recv_wr: attr.cap.max_recv_wr,
        max_send_sge: attr.cap.max_send_sge,
        max_recv_sge: attr.cap.max_recv_sge,
        max_inline: attr.cap.max_inline_data,
    }
}

/// The call that makes an RC or UD QP from its creation attributes.
#[derive(Clone, Copy)]
pub(crate) enum Creator<'a> {
    /// `ibv_create_qp_ex`.
    Verbs,
    /// The provider's own call with the same attributes, given by the backend: on mlx5
    /// `mlx5dv_create_qp` with creation flags (a QP without scatter-to-CQE).
    Vendor(&'a dyn Fn(&mut ffi::ibv_qp_init_attr_ex) -> Result<*mut ffi::ibv_qp>),
}

impl Creator<'_> {
    /// Creates the QP of `attr` on `ctx`'s device.
    ///
    /// # Safety
    /// `attr`'s PD (or parent domain), CQs and SRQ must be live objects of `ctx`.
    unsafe fn create(
        self,
        ctx: *mut ffi::ibv_context,
        attr: &mut ffi::ibv_qp_init_attr_ex,
    ) -> Result<*mut ffi::ibv_qp> {
        match self {
            Creator::Verbs => {
                // SAFETY: live context and objects (caller contract); `attr` is a valid
                // in/out parameter.
                let qp = unsafe { create_qp_ex(ctx, attr) };
                if qp.is_null() {
                    return Err(Error::Verbs(last("ibv_create_qp_ex")));
                }
                Ok(qp)
            }
            Creator::Vendor(f) => f(attr),
        }
    }
}

/// Creates a QP with `create`: with the extended send operations first when `api` wants
/// them, then, when the provider refuses them (or leaves a pointer unset) and `api` allows
/// it, without. Returns the QP, its real sizes and its extended operations.
fn create_with(
    api: ApiChoice,
    attr_of: impl Fn(bool) -> ffi::ibv_qp_init_attr_ex,
    create: impl Fn(&mut ffi::ibv_qp_init_attr_ex) -> Result<*mut ffi::ibv_qp>,
    destroy: impl Fn(*mut ffi::ibv_qp),
) -> Result<(*mut ffi::ibv_qp, Caps, Option<SendOps>)> {
    if api.wants_extended() {
        let mut attr = attr_of(true);
        if let Ok(qp) = create(&mut attr) {
            // SAFETY: the QP was just created, and lives while the result is used.
            if let Some(ops) = unsafe { SendOps::of(qp) } {
                return Ok((qp, caps_of(&attr), Some(ops)));
            }
            destroy(qp);
        }
        api.unavailable(
            "BLUEFLAME_VERBS_API=extended: the provider refused the extended send operations",
        )?;
    }
    let mut attr = attr_of(false);
    let qp = create(&mut attr)?;
    Ok((qp, caps_of(&attr), None))
}

impl Qp {
    /// Creates an RC QP in RESET; with `thread_domain`, on a thread domain of its own (when
    /// the device gives one), so that its BlueFlame register is its own. With the extended
    /// send operations (`ibv_wr_*`) when `api` wants them and the provider has them.
    ///
    /// # Errors
    /// The `ibv_create_qp_ex` error (e.g. `EINVAL` for an inline size the device refuses);
    /// [`crate::Error::Unsupported`] when `api` requires the extended operations and the
    /// provider refuses them.
    /// (Only `internals`' plain calls make RC QPs this way; the backends take `with_srq`.)
    #[cfg(feature = "internals")]
    pub fn new(
        pd: Arc<Pd>,
        send_cq: Arc<Cq>,
        recv_cq: Arc<Cq>,
        caps: Caps,
        thread_domain: bool,
        api: ApiChoice,
    ) -> crate::error::Result<Qp> {
        Qp::with_srq(
            pd,
            send_cq,
            recv_cq,
            caps,
            thread_domain,
            api,
            None,
            Creator::Verbs,
        )
    }

    /// As [`Qp::new`]; with `srq`, the QP takes its receives from it (`srq` in the
    /// creation attributes: no receive queue of its own); made by `creator`.
    ///
    /// # Errors
    /// As [`Qp::new`]; the vendor call's error.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn with_srq(
        pd: Arc<Pd>,
        send_cq: Arc<Cq>,
        recv_cq: Arc<Cq>,
        caps: Caps,
        thread_domain: bool,
        api: ApiChoice,
        srq: Option<Arc<Srq>>,
        creator: Creator<'_>,
    ) -> crate::error::Result<Qp> {
        let td = self::thread_domain(&pd, thread_domain);
        let on = qp_pd(&pd, &td);
        let atomics = pd.ctx.has_atomics();
        let (qp, real, send_ops) = create_with(
            api,
            |ex| init_attr_ex(&send_cq, &recv_cq, &caps, (on, atomics), ex, srq.as_deref()),
            // SAFETY: live context, (parent) PD, CQs and SRQ of it.
            |attr| unsafe { creator.create(pd.ctx.ctx, attr) },
            // SAFETY: created just before, used by nothing.
            |qp| unsafe {
                ffi::ibv_destroy_qp(qp);
            },
        )?;
        Ok(Qp {
            qp,
            caps: real,
            send_ops,
            ud_ops: None,
            cm_id: None,
            td,
            _pd: pd,
            _cqs: [send_cq, recv_cq],
            _srq: srq,
            recv_targets: Default::default(),
        })
    }

    /// Creates an RC QP through librdmacm on `id` (connected by rdma_cm, not by
    /// `ibv_modify_qp`) with `rdma_create_qp_ex`; with `thread_domain` and `api` as in
    /// [`Qp::new`].
    ///
    /// # Safety
    /// `id` must be a live rdma_cm id on the PD's context that outlives the QP.
    ///
    /// # Errors
    /// The `rdma_create_qp_ex` error; as [`Qp::new`] for `api`.
    pub unsafe fn on_cm(
        id: *mut ffi::rdma_cm_id,
        pd: Arc<Pd>,
        send_cq: Arc<Cq>,
        recv_cq: Arc<Cq>,
        caps: Caps,
        thread_domain: bool,
        api: ApiChoice,
    ) -> crate::error::Result<Qp> {
        let td = self::thread_domain(&pd, thread_domain);
        let on = qp_pd(&pd, &td);
        let atomics = pd.ctx.has_atomics();
        let (qp, real, send_ops) = create_with(
            api,
            |ex| init_attr_ex(&send_cq, &recv_cq, &caps, (on, atomics), ex, None),
            |attr| {
                // SAFETY: the caller's contract; `attr` is a valid in/out parameter; the
                // parent domain is on the id's context.
                if unsafe { ffi::rdma_create_qp_ex(id, attr) } != 0 {
                    return Err(Error::Verbs(last("rdma_create_qp_ex")));
                }
                // SAFETY: rdma_create_qp_ex succeeded: `id->qp` is the new QP.
                Ok(unsafe { (*id).qp })
            },
            // SAFETY: created just before on this id, used by nothing; the id can take
            // another QP afterwards (rdma_destroy_qp clears `id->qp`).
            |_| unsafe { ffi::rdma_destroy_qp(id) },
        )?;
        Ok(Qp {
            qp,
            caps: real,
            send_ops,
            ud_ops: None,
            cm_id: Some(id),
            td,
            _pd: pd,
            _cqs: [send_cq, recv_cq],
            _srq: None,
            recv_targets: Default::default(),
        })
    }

    /// The API the verbs data path posts to this QP with.
    pub fn api(&self) -> VerbsApi {
        if self.send_ops.is_some() || self.ud_ops.is_some() {
            VerbsApi::Extended
        } else {
            VerbsApi::Legacy
        }
    }

    /// Whether the QP was created on a thread domain of its own: its BlueFlame register is
    /// rung by this QP only.
    pub fn has_thread_domain(&self) -> bool {
        self.td.is_some()
    }

    /// The QP number.
    pub fn qpn(&self) -> u32 {
        // SAFETY: live QP.
        unsafe { (*self.qp).qp_num }
    }

    pub(super) fn modify(&self, attr: &mut ffi::ibv_qp_attr, mask: u32) -> Result<(), VerbsError> {
        // SAFETY: live QP; `attr` is a valid attribute block for `mask`.
        let rc = unsafe { ffi::ibv_modify_qp(self.qp, attr, mask as i32) };
        if rc != 0 {
            return Err(code("ibv_modify_qp", rc));
        }
        Ok(())
    }

    /// RESET -> INIT with remote read/write/atomic access.
    ///
    /// # Errors
    /// The `ibv_modify_qp` error.
    pub fn to_init(&self, port: u8) -> Result<(), VerbsError> {
        use ffi::ibv_qp_attr_mask as M;
        // SAFETY: zeroed attributes are valid; the masked ones are set.
        let mut a: ffi::ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ffi::ibv_qp_state::IBV_QPS_INIT;
        a.pkey_index = 0;
        a.port_num = port;
        a.qp_access_flags = (Access::LOCAL_WRITE
            | Access::REMOTE_WRITE
            | Access::REMOTE_READ
            | Access::REMOTE_ATOMIC)
            .0;
        self.modify(
            &mut a,
            M::IBV_QP_STATE.0
                | M::IBV_QP_PKEY_INDEX.0
                | M::IBV_QP_PORT.0
                | M::IBV_QP_ACCESS_FLAGS.0,
        )
    }

    /// INIT -> RTR towards `remote`, through `port` and source GID `gid_index` (RoCE), with
    /// the path MTU and responder depth within `lim`.
    ///
    /// # Errors
    /// The `ibv_modify_qp` error.
    pub fn to_rtr(
        &self,
        remote: &Endpoint,
        port: u8,
        gid_index: Option<i32>,
        t: &Timing,
        lim: &ConnLimits,
    ) -> Result<(), VerbsError> {
        use ffi::ibv_qp_attr_mask as M;
        let attr = || {
            // SAFETY: as in to_init.
            let mut a: ffi::ibv_qp_attr = unsafe { std::mem::zeroed() };
            a.qp_state = ffi::ibv_qp_state::IBV_QPS_RTR;
            a.path_mtu = lim.path_mtu(remote.mtu);
            a.dest_qp_num = remote.qpn;
            a.rq_psn = remote.psn & 0xff_ffff;
            a.max_dest_rd_atomic = lim.max_dest_rd_atomic();
            a.min_rnr_timer = t.min_rnr_timer;
            a.ah_attr.dlid = remote.lid;
            a.ah_attr.port_num = port;
            if let Some(idx) = gid_index {
                a.ah_attr.is_global = 1;
                a.ah_attr.grh.dgid.raw = remote.gid;
                a.ah_attr.grh.sgid_index = idx as u8;
                a.ah_attr.grh.hop_limit = 64;
            }
            a
        };
        let mask = M::IBV_QP_STATE.0
            | M::IBV_QP_AV.0
            | M::IBV_QP_PATH_MTU.0
            | M::IBV_QP_DEST_QPN.0
            | M::IBV_QP_RQ_PSN.0
            | M::IBV_QP_MAX_DEST_RD_ATOMIC.0
            | M::IBV_QP_MIN_RNR_TIMER.0;
        match self.modify(&mut attr(), mask) {
            // A device without atomic operations refuses the remote atomic right `to_init`
            // gave (mlx5_ib's `set_qpc_atomic_flags` at the first modify with a responder
            // depth: `get_atomic_mode`, EOPNOTSUPP), as UCX's QPs ask it too: the QP goes
            // to RTR without it (the access flags are an optional attribute of INIT ->
            // RTR); peers' atomics then fail at this responder as on a device without them.
            Err(e) if e.source.raw_os_error() == Some(libc::EOPNOTSUPP) => {
                let mut a = attr();
                a.qp_access_flags =
                    (Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ).0;
                self.modify(&mut a, mask | M::IBV_QP_ACCESS_FLAGS.0)
                    .map_err(|_| e)
            }
            r => r,
        }
    }

    /// RTR -> RTS with send PSN `psn`.
    ///
    /// # Errors
    /// The `ibv_modify_qp` error.
    pub fn to_rts(&self, psn: u32, t: &Timing, lim: &ConnLimits) -> Result<(), VerbsError> {
        use ffi::ibv_qp_attr_mask as M;
        // SAFETY: as in to_init.
        let mut a: ffi::ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ffi::ibv_qp_state::IBV_QPS_RTS;
        a.sq_psn = psn & 0xff_ffff;
        a.timeout = t.timeout;
        a.retry_cnt = t.retry_cnt;
        a.rnr_retry = t.rnr_retry;
        a.max_rd_atomic = lim.max_rd_atomic();
        let mask = M::IBV_QP_STATE.0
            | M::IBV_QP_SQ_PSN.0
            | M::IBV_QP_TIMEOUT.0
            | M::IBV_QP_RETRY_CNT.0
            | M::IBV_QP_RNR_RETRY.0
            | M::IBV_QP_MAX_QP_RD_ATOMIC.0;
        self.modify(&mut a, mask)
    }

    /// Any state -> ERROR: outstanding work is flushed.
    ///
    /// # Errors
    /// The `ibv_modify_qp` error.
    pub fn to_error(&self) -> Result<(), VerbsError> {
        // SAFETY: as in to_init.
        let mut a: ffi::ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ffi::ibv_qp_state::IBV_QPS_ERR;
        self.modify(&mut a, ffi::ibv_qp_attr_mask::IBV_QP_STATE.0)
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        match self.cm_id {
            // SAFETY: created by rdma_create_qp on this id, which outlives it (the connection
            // holds the id and drops it after the QP).
            Some(id) => unsafe { ffi::rdma_destroy_qp(id) },
            None => {
                // SAFETY: created in `new`, destroyed once; its CQs and PD are kept alive.
                let rc = unsafe { ffi::ibv_destroy_qp(self.qp) };
                if rc != 0 {
                    // The QP lives on in the kernel and may still write its posted receives:
                    // their regions stay pinned (and so registered, their memory allocated)
                    // for good, as a region whose deregistration is refused keeps its memory.
                    if let Some(t) = self.recv_targets.take() {
                        std::mem::forget(t);
                    }
                }
            }
        }
    }
}

/// The creation attributes of a UD QP; with `extended`, the UD `ibv_wr_*` opcodes.
fn ud_init_attr(
    send_cq: &Cq,
    recv_cq: &Cq,
    caps: &Caps,
    pd: *mut ffi::ibv_pd,
    extended: bool,
) -> ffi::ibv_qp_init_attr_ex {
    let mut attr = base_init_attr(send_cq, recv_cq, caps, pd, ffi::ibv_qp_type::IBV_QPT_UD);
    if extended {
        attr.comp_mask |= ffi::ibv_qp_init_attr_mask::IBV_QP_INIT_ATTR_SEND_OPS_FLAGS.0;
        attr.send_ops_flags = ud_send_ops_flags();
    }
    attr
}

impl Qp {
    /// Creates a UD QP in RESET on `pd` (then [`Qp::ud_ready`]); with the extended UD send
    /// operations when `api` wants them and the provider has them, else `ibv_post_send`;
    /// with `thread_domain`, on a thread domain of its own when the device gives one (its
    /// BlueFlame register is its own: mlx5's direct path, as for RC).
    ///
    /// # Errors
    /// The `ibv_create_qp_ex` error; [`Error::Unsupported`] when `api` requires the
    /// extended operations and the provider refuses them.
    pub(crate) fn new_ud(
        pd: Arc<Pd>,
        send_cq: Arc<Cq>,
        recv_cq: Arc<Cq>,
        caps: Caps,
        api: ApiChoice,
        thread_domain: bool,
        creator: Creator<'_>,
    ) -> Result<Qp> {
        let td = self::thread_domain(&pd, thread_domain);
        let on = qp_pd(&pd, &td);
        let create = |ex: bool| {
            let mut attr = ud_init_attr(&send_cq, &recv_cq, &caps, on, ex);
            // SAFETY: live context, (parent) PD and CQs of it.
            let qp = unsafe { creator.create(pd.ctx.ctx, &mut attr) };
            (qp, attr)
        };
        let mut made = None;
        if api.wants_extended() {
            if let (Ok(qp), attr) = create(true) {
                // SAFETY: created just above; the ops are used while the Qp lives.
                match unsafe { UdSendOps::of(qp) } {
                    Some(ops) => made = Some((qp, caps_of(&attr), Some(ops))),
                    // SAFETY: created above, used by nothing.
                    None => unsafe {
                        ffi::ibv_destroy_qp(qp);
                    },
                }
            }
            if made.is_none() {
                api.unavailable(
                    "BLUEFLAME_VERBS_API=extended: the provider refused the extended UD send operations",
                )?;
            }
        }
        let (qp, real, ud_ops) = match made {
            Some(m) => m,
            None => {
                let (qp, attr) = create(false);
                (qp?, caps_of(&attr), None)
            }
        };
        Ok(Qp {
            qp,
            caps: real,
            send_ops: None,
            ud_ops,
            cm_id: None,
            td,
            _pd: pd,
            _cqs: [send_cq, recv_cq],
            _srq: None,
            recv_targets: Default::default(),
        })
    }

    /// RESET -> INIT (P_Key index 0, `port`, Q_Key `qkey`) -> RTR -> RTS (send PSN `psn`):
    /// the UD transitions (no address, no path MTU: each send names its own address
    /// handle).
    ///
    /// # Errors
    /// The `ibv_modify_qp` error.
    pub fn ud_ready(&self, port: u8, qkey: u32, psn: u32) -> std::result::Result<(), VerbsError> {
        use ffi::ibv_qp_attr_mask as M;
        // SAFETY: zeroed attributes are valid; the masked ones are set.
        let mut a: ffi::ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ffi::ibv_qp_state::IBV_QPS_INIT;
        a.pkey_index = 0;
        a.port_num = port;
        a.qkey = qkey;
        self.modify(
            &mut a,
            M::IBV_QP_STATE.0 | M::IBV_QP_PKEY_INDEX.0 | M::IBV_QP_PORT.0 | M::IBV_QP_QKEY.0,
        )?;
        // SAFETY: as above.
        let mut a: ffi::ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ffi::ibv_qp_state::IBV_QPS_RTR;
        self.modify(&mut a, M::IBV_QP_STATE.0)?;
        // SAFETY: as above.
        let mut a: ffi::ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ffi::ibv_qp_state::IBV_QPS_RTS;
        a.sq_psn = psn & 0xff_ffff;
        self.modify(&mut a, M::IBV_QP_STATE.0 | M::IBV_QP_SQ_PSN.0)
    }

    /// Joins the multicast group `gid` / `lid` (`ibv_attach_mcast`; `lid` is 0 on RoCE).
    ///
    /// # Errors
    /// The `ibv_attach_mcast` error (`EINVAL` for a GID that is not multicast, or a QP that
    /// is not UD).
    pub fn attach_mcast(&self, gid: &[u8; 16], lid: u16) -> std::result::Result<(), VerbsError> {
        let g = ffi::ibv_gid { raw: *gid };
        // SAFETY: live QP; `g` is valid for the call, which copies it.
        let rc = unsafe { ffi::ibv_attach_mcast(self.qp, &g, lid) };
        if rc != 0 {
            return Err(code("ibv_attach_mcast", rc));
        }
        Ok(())
    }

    /// Leaves the multicast group `gid` / `lid` (`ibv_detach_mcast`).
    ///
    /// # Errors
    /// The `ibv_detach_mcast` error (`EINVAL` when the QP is not attached to it).
    pub fn detach_mcast(&self, gid: &[u8; 16], lid: u16) -> std::result::Result<(), VerbsError> {
        let g = ffi::ibv_gid { raw: *gid };
        // SAFETY: as in `attach_mcast`.
        let rc = unsafe { ffi::ibv_detach_mcast(self.qp, &g, lid) };
        if rc != 0 {
            return Err(code("ibv_detach_mcast", rc));
        }
        Ok(())
    }
}
