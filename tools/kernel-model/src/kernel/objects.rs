//! The objects of a uverbs file, by handle: what the kernel keeps of each (its number on
//! the NIC, the user's handle events name, the verbs state of a QP).

use libc::c_int;
use mlx5::sim::QpTiming;
use std::collections::HashMap;

/// `enum ib_uverbs_qp_state` (`IB_QPS_*`).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(super) enum QpState {
    Reset,
    Init,
    Rtr,
    Rts,
    Sqd,
    Sqe,
    Error,
}

impl QpState {
    pub(super) fn from_abi(v: u8) -> Option<QpState> {
        Some(match v {
            0 => QpState::Reset,
            1 => QpState::Init,
            2 => QpState::Rtr,
            3 => QpState::Rts,
            4 => QpState::Sqd,
            5 => QpState::Sqe,
            6 => QpState::Error,
            _ => return None,
        })
    }
}

/// `IB_QP_*` attribute mask bits the model reads.
pub(super) mod mask {
    pub(crate) const STATE: u32 = 1 << 0;
    pub(crate) const QKEY: u32 = 1 << 6;
    pub(crate) const ACCESS_FLAGS: u32 = 1 << 3;
    pub(crate) const DEST_QPN: u32 = 1 << 20;
    pub(crate) const AV: u32 = 1 << 7;
    pub(crate) const PATH_MTU: u32 = 1 << 8;
    pub(crate) const RQ_PSN: u32 = 1 << 12;
    pub(crate) const SQ_PSN: u32 = 1 << 16;
    pub(crate) const TIMEOUT: u32 = 1 << 9;
    pub(crate) const RETRY_CNT: u32 = 1 << 10;
    pub(crate) const RNR_RETRY: u32 = 1 << 11;
    pub(crate) const MIN_RNR_TIMER: u32 = 1 << 15;
    pub(crate) const MAX_QP_RD_ATOMIC: u32 = 1 << 13;
    pub(crate) const MAX_DEST_RD_ATOMIC: u32 = 1 << 17;
}

/// One object of a file, by its uverbs handle.
pub(super) enum Obj {
    Pd(u32),
    Mr(u32),
    Mw(u32),
    /// A completion channel (its descriptor is the user's: the user closes it).
    Channel(c_int),
    Cq(Cq),
    Qp(Box<Qp>),
    Srq(Srq),
}

/// A CQ: its number, the user's handle events name, its completion channel.
pub(super) struct Cq {
    pub(super) cqn: u32,
    pub(super) user: u64,
    pub(super) channel: Option<c_int>,
    /// Created with `MLX5_IB_CREATE_CQ_FLAGS_REAL_TIME_TS` (its timestamp format real
    /// time; any other CQ's free-running: `get_ts_format`).
    pub(super) real_time: bool,
}

/// An SRQ: its number, the user's handle, and its size as created (`QUERY_SRQ`).
pub(super) struct Srq {
    pub(super) srqn: u32,
    pub(super) user: u64,
    /// `msrq.max - 1` (the ring's entries less one) and the scatter entries per WQE.
    pub(super) max_wr: u32,
    pub(super) max_sge: u32,
}

/// A QP as the kernel sees it: the verbs state machine in front of the NIC's QP.
pub(super) struct Qp {
    pub(super) qpn: u32,
    pub(super) user: u64,
    pub(super) state: QpState,
    pub(super) dest: Option<u32>,
    pub(super) timing: QpTiming,
    /// The responder's rights and depth as last given (`trans_qp.atomic_rd_en`,
    /// `trans_qp.resp_depth`).
    pub(super) access: u32,
    pub(super) resp_depth: u8,
    /// The requester's depth as last given (`max_rd_atomic`, the QP context's `log_sra_max`).
    pub(super) req_depth: u8,
    /// The bfreg it rings: (dynamic, index); a static one is counted in the file's classes.
    pub(super) bfreg: (bool, u32),
    /// Responder scatter-to-CQE, as `configure_responder_scat_cqe` decided.
    pub(super) scatter: bool,
    /// A UD QP: its Q_Key (set at INIT) and whether it receives its own multicast.
    pub(super) ud: Option<Ud>,
    /// A DC QP: an initiator, or a target the NIC creates at RTR.
    pub(super) dc: Option<Dc>,
}

/// The DC role of a QP (`mlx5_ib_create_qp` with `MLX5_QP_FLAG_TYPE_DCI` / `_DCT`).
#[derive(Copy, Clone)]
pub(super) enum Dc {
    Initiator,
    /// A target as created (`mlx5_ib_create_dct` keeps the attributes; the device object
    /// is made at RTR, `mlx5_ib_modify_dct`, which returns its number).
    Target {
        pd: u32,
        cq: u32,
        srq: Option<u32>,
        key: u64,
        scatter: bool,
        access: u32,
        /// The user index libmlx5 gave it (`mlx5_ib_create_qp.uidx`, CQE version 1).
        uidx: u32,
        /// Made on the NIC (its number is the QP's).
        made: bool,
    },
}

/// What a UD QP is given before it runs.
#[derive(Copy, Clone)]
pub(super) struct Ud {
    pub(super) qkey: Option<u32>,
    pub(super) mcast_loopback: bool,
}

/// An open `/dev/infiniband/uverbs0`: a ucontext once `GET_CONTEXT` ran.
#[derive(Default)]
pub(super) struct File {
    /// The asynchronous event file (`async_fd`), made by `GET_CONTEXT`.
    pub(super) async_fd: Option<c_int>,
    pub(super) next_handle: u32,
    pub(super) objs: HashMap<u32, Obj>,
    /// UAR pages mapped: (dynamic, index) -> address. Static pages hold the context's
    /// bfregs (`MLX5_IB_MMAP_REGULAR_PAGE` and kin, by index); dynamic ones the bfregs of
    /// thread domains (`MLX5_IB_MMAP_ALLOC_WC`, by extended index).
    pub(super) pages: HashMap<(bool, u32), usize>,
    /// bfregs of the static allocation (`mlx5_ib_alloc_ucontext`): total, low latency, and
    /// the QPs on each (`bfregi->count`).
    pub(super) tot_bfregs: u32,
    pub(super) low_lat: u32,
    pub(super) bfreg_count: Vec<u32>,
}

impl File {
    /// Whether `GET_CONTEXT` ran (it makes the event file).
    pub(super) fn has_context(&self) -> bool {
        self.async_fd.is_some()
    }

    /// The PD number behind `handle` (`EINVAL` when the handle names no PD).
    pub(super) fn pd(&self, handle: u32) -> Result<u32, c_int> {
        match self.objs.get(&handle) {
            Some(Obj::Pd(pdn)) => Ok(*pdn),
            _ => Err(libc::EINVAL),
        }
    }

    /// Adds an object: its new handle.
    pub(super) fn add(&mut self, o: Obj) -> u32 {
        let h = self.next_handle;
        self.next_handle += 1;
        self.objs.insert(h, o);
        h
    }
}
