//! DC on a ConnectX: `mlx5dv_create_qp` with the DC init attributes, and the state
//! transitions as UCX makes them.
//!
//! Followed: rdma-core `providers/mlx5/verbs.c` (`mlx5dv_create_qp` -> `create_qp`: a DC QP
//! is `IBV_QPT_DRIVER` with `MLX5DV_QP_INIT_ATTR_MASK_DC`; `MLX5DV_DCTYPE_DCT` goes to
//! `create_dct`, which takes `dct_access_key` and refuses every vendor mask but DC and create
//! flags; `MLX5DV_DCTYPE_DCI` is a send queue with `MLX5_QP_FLAG_TYPE_DCI`), `mlx5dv.h`
//! (`struct mlx5dv_dc_init_attr`, `struct mlx5dv_qp_init_attr`), UCX `dc_mlx5.c`
//! (`uct_dc_mlx5_iface_create_qp`, `uct_dc_mlx5_iface_dci_connect`,
//! `uct_dc_mlx5_iface_create_dct`): a DCI goes INIT (pkey, port) -> RTR (path MTU) -> RTS
//! (timeout, retry counts, `max_rd_atomic`) with no remote QP; a DCT goes INIT (pkey, port,
//! access flags) -> RTR (path MTU, RNR timer, address vector with the port and GID index)
//! only, and its send CQ is its receive CQ.
//!
//! The attribute builders are pure functions (tested by the structs they fill); the calls
//! are [`super::create_qp`] and [`modify`].

use super::ffi;
use crate::error::Result;
use rdma_sys as ffi_v;

/// Which end of DC a QP is.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum DcType {
    /// An initiator.
    Dci,
    /// A target answering requests that carry this key.
    Dct {
        /// The DC access key.
        key: u64,
    },
}

/// The vendor attributes of `mlx5dv_create_qp` for a DCI or DCT.
pub fn dv_attr(t: DcType) -> ffi::mlx5dv_qp_init_attr {
    let (dc_type, dct_access_key) = match t {
        DcType::Dci => (ffi::MLX5DV_DCTYPE_DCI, 0),
        DcType::Dct { key } => (ffi::MLX5DV_DCTYPE_DCT, key),
    };
    ffi::mlx5dv_qp_init_attr {
        comp_mask: ffi::MLX5DV_QP_INIT_ATTR_MASK_DC,
        dc_init_attr: ffi::mlx5dv_dc_init_attr {
            dc_type,
            dct_access_key,
        },
        ..Default::default()
    }
}

/// The verbs attributes of a DC QP: `IBV_QPT_DRIVER` on `pd`. A DCI: `cq` for both
/// directions (it receives nothing: no receive WRs or SGEs), `cap` its send limits. A DCT:
/// `cq` as send and receive CQ (it sends nothing, but the send CQ must be valid, as UCX
/// notes), `srq` its receive queue, no send WRs.
pub fn init_attr(
    t: DcType,
    pd: *mut ffi_v::ibv_pd,
    cq: *mut ffi_v::ibv_cq,
    srq: *mut ffi_v::ibv_srq,
    cap: ffi_v::ibv_qp_cap,
) -> ffi_v::ibv_qp_init_attr_ex {
    // SAFETY: a plain C struct of integers and raw pointers: all-zero is valid.
    let mut a: ffi_v::ibv_qp_init_attr_ex = unsafe { std::mem::zeroed() };
    a.qp_type = ffi::IBV_QPT_DRIVER;
    a.comp_mask = ffi::IBV_QP_INIT_ATTR_PD;
    a.pd = pd;
    a.send_cq = cq;
    a.recv_cq = cq;
    match t {
        DcType::Dci => {
            a.cap = ffi_v::ibv_qp_cap {
                max_recv_wr: 0,
                max_recv_sge: 0,
                ..cap
            };
        }
        DcType::Dct { .. } => {
            a.srq = srq;
            a.cap = ffi_v::ibv_qp_cap {
                max_send_wr: 0,
                max_send_sge: 0,
                max_recv_wr: 0,
                max_recv_sge: 0,
                ..cap
            };
        }
    }
    a
}

/// What the transitions need of the port.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct PortAttrs {
    /// The port number.
    pub port: u8,
    /// Its active MTU (verbs encoding).
    pub mtu: u32,
    /// The GID index (RoCE), None on InfiniBand.
    pub gid_index: Option<u8>,
}

/// One transition: the attributes and their mask.
pub type Step = (ffi_v::ibv_qp_attr, u32);

fn zeroed_attr() -> ffi_v::ibv_qp_attr {
    // SAFETY: a plain C struct of integers: all-zero is valid.
    unsafe { std::mem::zeroed() }
}

/// The transitions of a DCI to RTS (UCX `uct_dc_mlx5_iface_dci_connect`): INIT with the
/// pkey index and port; RTR with the path MTU and an address vector (no remote QP: each
/// WQE names its DCT) that carries the port (the kernel's `ib_modify_qp` wants a valid
/// `ah_attr.port_num` whenever `IBV_QP_AV` is set), SL 0 and, on RoCE, the global bit with
/// the GID index; RTS with the ACK timeout, retry counts, `max_rd_atomic` and the send PSN.
pub fn dci_steps(p: &PortAttrs, t: &crate::verbs::objects::Timing, max_rd_atomic: u8) -> [Step; 3] {
    use ffi_v::ibv_qp_attr_mask as m;
    let mut init = zeroed_attr();
    init.qp_state = ffi_v::ibv_qp_state::IBV_QPS_INIT;
    init.pkey_index = 0;
    init.port_num = p.port;
    let init_mask = m::IBV_QP_STATE.0 | m::IBV_QP_PKEY_INDEX.0 | m::IBV_QP_PORT.0;
    let mut rtr = zeroed_attr();
    rtr.qp_state = ffi_v::ibv_qp_state::IBV_QPS_RTR;
    rtr.path_mtu = p.mtu;
    rtr.ah_attr.port_num = p.port;
    rtr.ah_attr.sl = 0;
    // UCX sets `is_global` to its force_global_addr (on for RoCE).
    if let Some(g) = p.gid_index {
        rtr.ah_attr.is_global = 1;
        rtr.ah_attr.grh.sgid_index = g;
        rtr.ah_attr.grh.hop_limit = DCT_HOP_LIMIT;
    }
    let rtr_mask = m::IBV_QP_STATE.0 | m::IBV_QP_PATH_MTU.0 | m::IBV_QP_AV.0;
    let mut rts = zeroed_attr();
    rts.qp_state = ffi_v::ibv_qp_state::IBV_QPS_RTS;
    rts.timeout = t.timeout;
    rts.retry_cnt = t.retry_cnt;
    rts.rnr_retry = t.rnr_retry;
    rts.max_rd_atomic = max_rd_atomic;
    rts.sq_psn = 0;
    let rts_mask = m::IBV_QP_STATE.0
        | m::IBV_QP_SQ_PSN.0
        | m::IBV_QP_TIMEOUT.0
        | m::IBV_QP_RETRY_CNT.0
        | m::IBV_QP_RNR_RETRY.0
        | m::IBV_QP_MAX_QP_RD_ATOMIC.0;
    [(init, init_mask), (rtr, rtr_mask), (rts, rts_mask)]
}

/// The hop limit of a DCT's answers and of a DCI's address vector on RoCE (UCX's
/// `UCX_IB_HOP_LIMIT` default).
pub const DCT_HOP_LIMIT: u8 = 255;

/// The transitions of a DCT to RTR, where it stays (UCX `uct_dc_mlx5_iface_create_dct`):
/// INIT with the pkey index, port and access flags; RTR with the path MTU, the RNR timer
/// and the address vector (port; on RoCE global, with the GID index and hop limit).
pub fn dct_steps(p: &PortAttrs, access: u32, min_rnr_timer: u8) -> [Step; 2] {
    use ffi_v::ibv_qp_attr_mask as m;
    let mut init = zeroed_attr();
    init.qp_state = ffi_v::ibv_qp_state::IBV_QPS_INIT;
    init.pkey_index = 0;
    init.port_num = p.port;
    init.qp_access_flags = access;
    let init_mask =
        m::IBV_QP_STATE.0 | m::IBV_QP_PKEY_INDEX.0 | m::IBV_QP_PORT.0 | m::IBV_QP_ACCESS_FLAGS.0;
    let mut rtr = zeroed_attr();
    rtr.qp_state = ffi_v::ibv_qp_state::IBV_QPS_RTR;
    rtr.path_mtu = p.mtu;
    rtr.min_rnr_timer = min_rnr_timer;
    rtr.ah_attr.port_num = p.port;
    // The kernel (mlx5_ib_modify_dct) copies the GRH's hop limit into the DCT context
    // whatever `is_global` says: it is the hop limit (RoCEv2 TTL) of every answer the DCT
    // sends. UCX sets UCX_IB_HOP_LIMIT, 255 by default; 1 would not cross a router.
    rtr.ah_attr.grh.hop_limit = DCT_HOP_LIMIT;
    if let Some(g) = p.gid_index {
        rtr.ah_attr.is_global = 1;
        rtr.ah_attr.grh.sgid_index = g;
    }
    let rtr_mask =
        m::IBV_QP_STATE.0 | m::IBV_QP_MIN_RNR_TIMER.0 | m::IBV_QP_AV.0 | m::IBV_QP_PATH_MTU.0;
    [(init, init_mask), (rtr, rtr_mask)]
}

/// Runs the transitions on `qp`.
///
/// # Safety
/// `qp` must be a live QP.
///
/// # Errors
/// The first `ibv_modify_qp` error.
pub unsafe fn modify(qp: *mut ffi_v::ibv_qp, steps: &mut [Step]) -> Result<()> {
    for (attr, mask) in steps.iter_mut() {
        // SAFETY: live QP (caller contract); `attr` is initialised and outlives the call.
        let rc = unsafe { ffi_v::ibv_modify_qp(qp, attr, *mask as i32) };
        if rc != 0 {
            return Err(crate::verbs::last("ibv_modify_qp (DC)").into());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ffi_v::ibv_qp_attr_mask as m;

    fn port(gid: Option<u8>) -> PortAttrs {
        PortAttrs {
            port: 1,
            mtu: ffi_v::ibv_mtu::IBV_MTU_4096,
            gid_index: gid,
        }
    }

    #[test]
    fn the_vendor_attributes_name_the_dc_type_and_the_key() {
        let dct = dv_attr(DcType::Dct { key: 0xfeed });
        assert_eq!(dct.comp_mask, ffi::MLX5DV_QP_INIT_ATTR_MASK_DC);
        assert_eq!(dct.dc_init_attr.dc_type, ffi::MLX5DV_DCTYPE_DCT);
        assert_eq!(dct.dc_init_attr.dct_access_key, 0xfeed);
        // create_dct refuses create flags other than scatter-to-CQE, and send ops flags.
        assert_eq!((dct.create_flags, dct.send_ops_flags), (0, 0));
        let dci = dv_attr(DcType::Dci);
        assert_eq!(dci.dc_init_attr.dc_type, ffi::MLX5DV_DCTYPE_DCI);
        assert_eq!(dci.comp_mask, ffi::MLX5DV_QP_INIT_ATTR_MASK_DC);
    }

    #[test]
    fn a_dci_has_no_receive_side_and_a_dct_no_send_side() {
        let (pd, cq, srq) = (8 as *mut _, 16 as *mut _, 24 as *mut _);
        let cap = ffi_v::ibv_qp_cap {
            max_send_wr: 64,
            max_recv_wr: 64,
            max_send_sge: 4,
            max_recv_sge: 4,
            max_inline_data: 128,
        };
        let a = init_attr(DcType::Dci, pd, cq, srq, cap);
        assert_eq!((a.qp_type, a.comp_mask), (0xff, 1));
        assert_eq!((a.pd, a.send_cq, a.recv_cq), (pd, cq, cq));
        assert!(a.srq.is_null());
        assert_eq!((a.cap.max_send_wr, a.cap.max_send_sge), (64, 4));
        assert_eq!((a.cap.max_recv_wr, a.cap.max_recv_sge), (0, 0));
        let t = init_attr(DcType::Dct { key: 1 }, pd, cq, srq, cap);
        assert_eq!((t.srq, t.send_cq, t.recv_cq), (srq, cq, cq));
        assert_eq!((t.cap.max_send_wr, t.cap.max_recv_wr), (0, 0));
        assert_eq!(t.cap.max_inline_data, 128);
    }

    #[test]
    fn a_dci_reaches_rts_without_a_remote_qp() {
        let timing = crate::verbs::objects::Timing {
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
        };
        let [(init, im), (rtr, rm), (rts, sm)] = dci_steps(&port(None), &timing, 16);
        assert_eq!(init.qp_state, ffi_v::ibv_qp_state::IBV_QPS_INIT);
        assert_eq!(init.port_num, 1);
        assert_eq!(
            im,
            m::IBV_QP_STATE.0 | m::IBV_QP_PKEY_INDEX.0 | m::IBV_QP_PORT.0
        );
        assert_eq!(rtr.qp_state, ffi_v::ibv_qp_state::IBV_QPS_RTR);
        assert_eq!(rtr.path_mtu, ffi_v::ibv_mtu::IBV_MTU_4096);
        // No destination QP, no receive PSN; an address vector with the port, as UCX's.
        assert_eq!(
            rm,
            m::IBV_QP_STATE.0 | m::IBV_QP_PATH_MTU.0 | m::IBV_QP_AV.0
        );
        assert_eq!(rm & (m::IBV_QP_DEST_QPN.0 | m::IBV_QP_RQ_PSN.0), 0);
        assert_eq!((rtr.ah_attr.port_num, rtr.ah_attr.sl), (1, 0));
        assert_eq!(rtr.ah_attr.is_global, 0, "InfiniBand: no GRH");
        let [_, (rtr, _), _] = dci_steps(&port(Some(3)), &timing, 16);
        assert_eq!(
            (rtr.ah_attr.is_global, rtr.ah_attr.grh.sgid_index),
            (1, 3),
            "RoCE: global, with the GID index"
        );
        assert_eq!(rts.qp_state, ffi_v::ibv_qp_state::IBV_QPS_RTS);
        assert_eq!(
            (rts.timeout, rts.retry_cnt, rts.rnr_retry, rts.max_rd_atomic),
            (14, 7, 7, 16)
        );
        assert_eq!(
            sm,
            m::IBV_QP_STATE.0
                | m::IBV_QP_SQ_PSN.0
                | m::IBV_QP_TIMEOUT.0
                | m::IBV_QP_RETRY_CNT.0
                | m::IBV_QP_RNR_RETRY.0
                | m::IBV_QP_MAX_QP_RD_ATOMIC.0
        );
    }

    #[test]
    fn a_dct_stops_at_rtr_with_its_rights_and_address() {
        let rights = ffi_v::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0
            | ffi_v::ibv_access_flags::IBV_ACCESS_REMOTE_READ.0;
        let steps = dct_steps(&port(Some(3)), rights, 12);
        assert_eq!(steps.len(), 2, "INIT -> RTR only");
        let [(init, im), (rtr, rm)] = steps;
        assert_eq!(init.qp_access_flags, rights);
        assert_eq!(im & m::IBV_QP_ACCESS_FLAGS.0, m::IBV_QP_ACCESS_FLAGS.0);
        assert_eq!(rtr.qp_state, ffi_v::ibv_qp_state::IBV_QPS_RTR);
        assert_eq!(rtr.min_rnr_timer, 12);
        assert_eq!(
            (
                rtr.ah_attr.port_num,
                rtr.ah_attr.is_global,
                rtr.ah_attr.grh.sgid_index
            ),
            (1, 1, 3)
        );
        assert_eq!(
            rm,
            m::IBV_QP_STATE.0 | m::IBV_QP_MIN_RNR_TIMER.0 | m::IBV_QP_AV.0 | m::IBV_QP_PATH_MTU.0
        );
        let [_, (ib, _)] = dct_steps(&port(None), rights, 12);
        assert_eq!(ib.ah_attr.is_global, 0, "InfiniBand: no GRH");
    }

    #[test]
    fn a_dct_answers_with_ucx_s_hop_limit_on_roce_and_infiniband() {
        // mlx5_ib_modify_dct: MLX5_SET(dctc, dctc, hop_limit, attr->ah_attr.grh.hop_limit),
        // read whether or not the AV is global; UCX's uct_dc_mlx5_iface_create_dct sets
        // config.hop_limit (UCX_IB_HOP_LIMIT, 255).
        for gid in [Some(3), None] {
            let [_, (rtr, _)] = dct_steps(&port(gid), 0, 12);
            assert_eq!(rtr.ah_attr.grh.hop_limit, 255, "gid index {gid:?}");
        }
    }
}
