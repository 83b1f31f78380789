//! DC on a ConnectX: initiators and targets created by `mlx5dv_create_qp` with the DC
//! attributes (`crate::dv::dc`), brought to RTS (DCI) or RTR (DCT) with UCX's transitions;
//! a DCI's ring taken over with `mlx5dv_init_obj`. Devices without DC refuse with
//! [`Error::NoDc`].

use super::{Pd, RdmaDev};
use crate::backend::qp::QpSpec;
use crate::backend::spec::QpRings;
use crate::backend::Srq;
use crate::data_path::DataPath;
use crate::error::{Error, Result};
use crate::verbs;
use crate::verbs::objects::{qp_pd, thread_domain, ThreadDomain, Timing};
use mlx5::request::Access;

/// A DC QP rdma-core created on a ConnectX (`mlx5dv_create_qp`), destroyed on drop; a DCI
/// on a thread domain of its own when the device gives one (freed after the QP).
pub(crate) struct HwDc {
    qp: *mut rdma_sys::ibv_qp,
    _td: Option<ThreadDomain>,
}

// SAFETY: the QP pointer is passed to `ibv_modify_qp` by its owner and to `ibv_destroy_qp`
// once, on drop; rdma-core's QP objects may be used and destroyed from any thread (the
// thread domain is Send and Sync itself).
unsafe impl Send for HwDc {}
// SAFETY: as above: rdma-core serialises modifications of a QP itself.
unsafe impl Sync for HwDc {}

impl Drop for HwDc {
    fn drop(&mut self) {
        // SAFETY: a live QP created by `mlx5dv_create_qp`, destroyed once.
        unsafe { rdma_sys::ibv_destroy_qp(self.qp) };
    }
}

impl HwDc {
    /// `mlx5dv_create_qp` with the DC attributes, on `td`'s parent domain when there is
    /// one (else on `pd`), then the transitions.
    ///
    /// # Safety
    /// `ctx`, `pd`, `cq` and `srq` (when not null) must be live objects of one mlx5 device,
    /// `td` a thread domain over `pd`.
    unsafe fn create(
        ctx: *mut rdma_sys::ibv_context,
        t: crate::dv::dc::DcType,
        (pd, td, cq, srq): (
            &verbs::objects::Pd,
            Option<ThreadDomain>,
            *mut rdma_sys::ibv_cq,
            *mut rdma_sys::ibv_srq,
        ),
        cap: rdma_sys::ibv_qp_cap,
        steps: &mut [crate::dv::dc::Step],
    ) -> Result<HwDc> {
        let on = qp_pd(pd, &td);
        let mut attr = crate::dv::dc::init_attr(t, on, cq, srq, cap);
        let mut dv = crate::dv::dc::dv_attr(t);
        // SAFETY: live objects of the context (caller contract).
        let qp = unsafe { crate::dv::create_qp(ctx.cast(), &mut attr, &mut dv)? };
        let hw = HwDc { qp, _td: td };
        // SAFETY: the QP just created.
        unsafe { crate::dv::dc::modify(qp, steps)? };
        Ok(hw)
    }

    /// Moves the QP to the error state (`ibv_modify_qp`).
    pub(super) fn set_error(&self) -> Result<()> {
        // SAFETY: a zeroed ibv_qp_attr is valid.
        let mut attr: rdma_sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
        attr.qp_state = rdma_sys::ibv_qp_state::IBV_QPS_ERR;
        let mask = rdma_sys::ibv_qp_attr_mask::IBV_QP_STATE.0;
        // SAFETY: the live QP.
        unsafe { crate::dv::dc::modify(self.qp, &mut [(attr, mask)]) }
    }
}

/// What the transitions need of the device's port.
fn port_attrs(d: &RdmaDev) -> Result<crate::dv::dc::PortAttrs> {
    let port = d.ctx.port(d.port)?;
    Ok(crate::dv::dc::PortAttrs {
        port: d.port,
        mtu: port.active_mtu,
        gid_index: d.gid_index.map(|g| g as u8),
    })
}

/// The typed refusal of a device without DC (DC is an mlx5 transport, on the direct path).
fn no_dc(d: &RdmaDev) -> Error {
    let why = if d.mlx5 {
        "an mlx5 device on the verbs path (BLUEFLAME_PATH=verbs or MLX5_QP_SIGNATURE): \
         DC runs on the direct path only"
    } else {
        "DC is an mlx5 transport (mlx5dv_create_qp with MLX5DV_QP_INIT_ATTR_MASK_DC); \
         this device's provider has none"
    };
    Error::NoDc {
        device: d.describe(),
        why,
    }
}

/// A DCI on a ConnectX: `mlx5dv_create_qp` (`MLX5DV_DCTYPE_DCI`), UCX's transitions to RTS,
/// the ring from `mlx5dv_init_obj`.
pub(super) fn create_dci(
    p: &Pd,
    spec: &QpSpec<'_>,
    timing: &Timing,
) -> Result<(HwDc, QpRings, u32)> {
    let d = &p.dev;
    if d.path != DataPath::Direct {
        return Err(no_dc(d));
    }
    // MLX5_QP_SIGNATURE set since the device was opened: refused by `create_qp`.
    let caps = spec.caps;
    let cq = spec.send_cq.rdma()?;
    // As many requests as fill a ring of `sq_blocks` with rdma-core's DCI WQE size, after
    // the refusals rdma-core would answer with `EINVAL` (`QpSpec::connectx`).
    let wrs = spec.connectx(true, false)?.unwrap_or(1);
    let cap = rdma_sys::ibv_qp_cap {
        max_send_wr: wrs,
        max_recv_wr: 0,
        max_send_sge: caps.max_send_sge,
        max_recv_sge: 0,
        max_inline_data: caps.max_inline,
    };
    let timing = Timing {
        rnr_retry: timing.rnr_retry.min(caps.rnr_retry),
        ..*timing
    };
    let mut steps = crate::dv::dc::dci_steps(&port_attrs(d)?, &timing, d.attrs.max_qp_init_rd_atom);
    // A BlueFlame register of its own, as an RC QP's: UCX puts its DCIs on the worker's
    // thread domain (`uct_dc_mlx5_iface_create_qp` through `uct_ib_mlx5_iface_fill_attr`),
    // and rdma-core's `create_qp` takes the register of a parent domain's thread domain
    // for any QP type.
    let td = thread_domain(&p.pd, true);
    let dedicated = td.is_some();
    // SAFETY: the context, PD and CQ are live objects of this mlx5 device (the PD and CQ
    // are this domain's and the device's, kept alive by the DCI's owner); the thread
    // domain is over this PD.
    let hw = unsafe {
        HwDc::create(
            d.ctx.ctx,
            crate::dv::dc::DcType::Dci,
            (&p.pd, td, cq.cq, std::ptr::null_mut()),
            cap,
            &mut steps,
        )?
    };
    // SAFETY: a live QP of an mlx5 device.
    let dv = unsafe { crate::dv::init_qp(hw.qp.cast())? };
    // SAFETY: `hw.qp` is live; rdma-core filled the QP number.
    let qpn = unsafe { (*hw.qp).qp_num };
    let mut raw = crate::dv::raw_qp(
        &dv,
        &crate::dv::QpLimits {
            qpn,
            max_inline: caps.max_inline,
            max_send_sge: caps.max_send_sge,
            max_recv_sge: 0,
        },
    )?;
    spec.env.apply(&mut raw);
    // With a thread domain its register is its own (`mlx5_attach_dedicated_uar`);
    // without one it may be shared with other QPs of the context: the locked mode.
    let rings = QpRings::Direct { raw, dedicated };
    Ok((hw, rings, qpn))
}

/// A DCT on a ConnectX: `mlx5dv_create_qp` (`MLX5DV_DCTYPE_DCT`) on `srq`, UCX's
/// transitions to RTR.
pub(super) fn create_dct(
    p: &Pd,
    spec: &QpSpec<'_>,
    srq: &Srq,
    dc_key: u64,
    access: Access,
) -> Result<(HwDc, QpRings, u32)> {
    let d = &p.dev;
    if d.path != DataPath::Direct {
        return Err(no_dc(d));
    }
    let cq = spec.send_cq.rdma()?;
    let vsrq = srq.rdma()?.srq;
    // SAFETY: a zeroed ibv_qp_cap is valid; a DCT sends nothing.
    let cap: rdma_sys::ibv_qp_cap = unsafe { std::mem::zeroed() };
    let mut steps = crate::dv::dc::dct_steps(&port_attrs(d)?, access.0, 12);
    let t = crate::dv::dc::DcType::Dct { key: dc_key };
    // SAFETY: the context, PD, CQ and SRQ are live objects of this mlx5 device, kept alive
    // by the DCT's owner (its domain, CQ and SRQ handles).
    let hw = unsafe { HwDc::create(d.ctx.ctx, t, (&p.pd, None, cq.cq, vsrq), cap, &mut steps) }
        .map_err(|e| match e {
            // mlx5_ib_modify_dct at INIT: remote atomic rights need `get_atomic_mode`.
            Error::Verbs(v)
                if v.source.raw_os_error() == Some(libc::EOPNOTSUPP)
                    && access.contains(Access::REMOTE_ATOMIC) =>
            {
                Error::Capability(crate::error::Capability::RemoteAtomics)
            }
            e => e,
        })?;
    // SAFETY: `hw.qp` is live; rdma-core filled the QP number (the DCT number).
    let n = unsafe { (*hw.qp).qp_num };
    Ok((hw, QpRings::None, n))
}
