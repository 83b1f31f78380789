//! The kernel behind the device node: `ib_uverbs` and `mlx5_ib` as rdma-core's provider
//! meets them, in front of one software NIC (thread mode: it watches the doorbell records
//! of the rings the provider allocated).
//!
//! Each decision the crate depends on follows the kernel function named at its place
//! (`drivers/infiniband/hw/mlx5/`). What the model does not have it refuses as the kernel
//! refuses a missing feature (`EOPNOTSUPP`), never by pretending.
//!
//! The files from the ground up: `limits` (what the device offers), `objects` (what a file
//! holds), `state` (the NIC and the files, the event thread), then one file per kind of
//! command: `files` (open, mmap, close), `clock` (the device clock's pages), `device`,
//! `memory`, `cq`, `srq`, `qp`, `modify`;
//! this file dispatches the commands and answers [`crate::inspect`].

mod clock;
mod cq;
mod device;
mod files;
mod limits;
mod memory;
mod modify;
mod objects;
mod qp;
mod srq;
mod state;

pub(crate) use files::{close_channel, close_file, mmap, open_file};
pub(crate) use modify::fail_next_modify;

use crate::abi::*;
use crate::cmd::Call;
use libc::c_int;
use objects::Obj;
use state::{kernel, Kernel};

/// Runs one command of file `fd`.
pub(crate) fn command(fd: c_int, mut call: Call<'_>) -> Result<(), c_int> {
    let mut k = kernel();
    let Kernel { nic, files } = &mut *k;
    let f = files.get_mut(&fd).ok_or(libc::EBADF)?;
    if !f.has_context() && (call.op != IB_USER_VERBS_CMD_GET_CONTEXT || call.ex) {
        return Err(libc::EINVAL);
    }
    let c = &mut call;
    // SAFETY: every handler reads and writes bindgen's structs of the ABI; the response
    // pointers are the caller's, as write(2) on uverbs promises.
    unsafe {
        match (c.ex, c.op) {
            (false, IB_USER_VERBS_CMD_GET_CONTEXT) => device::get_context(nic, f, c),
            (false, IB_USER_VERBS_CMD_QUERY_DEVICE) => device::query_device(nic, c),
            (true, IB_USER_VERBS_EX_CMD_QUERY_DEVICE) => device::query_device_ex(nic, c),
            (false, IB_USER_VERBS_CMD_QUERY_PORT) => device::query_port(nic, c),
            (false, IB_USER_VERBS_CMD_ALLOC_PD) => memory::alloc_pd(nic, f, c),
            (false, IB_USER_VERBS_CMD_DEALLOC_PD) => memory::dealloc_pd(nic, f, c),
            (false, IB_USER_VERBS_CMD_REG_MR) => memory::reg_mr(nic, f, c),
            (false, IB_USER_VERBS_CMD_DEREG_MR) => memory::dereg_mr(nic, f, c),
            (false, IB_USER_VERBS_CMD_ALLOC_MW) => memory::alloc_mw(nic, f, c),
            (false, IB_USER_VERBS_CMD_DEALLOC_MW) => memory::dealloc_mw(nic, f, c),
            (false, IB_USER_VERBS_CMD_CREATE_COMP_CHANNEL) => cq::create_comp_channel(f, c),
            (_, IB_USER_VERBS_CMD_CREATE_CQ) => cq::create_cq(nic, f, c),
            (false, IB_USER_VERBS_CMD_DESTROY_CQ) => cq::destroy_cq(nic, f, c),
            (false, IB_USER_VERBS_CMD_CREATE_SRQ) => srq::create_srq(nic, f, c),
            (false, IB_USER_VERBS_CMD_MODIFY_SRQ) => srq::modify_srq(nic, f, c),
            (false, IB_USER_VERBS_CMD_QUERY_SRQ) => srq::query_srq(nic, f, c),
            (false, IB_USER_VERBS_CMD_DESTROY_SRQ) => srq::destroy_srq(nic, f, c),
            (_, IB_USER_VERBS_CMD_CREATE_QP) => qp::create_qp(nic, f, c),
            (_, IB_USER_VERBS_CMD_MODIFY_QP) => modify::modify_qp(nic, f, c),
            (false, IB_USER_VERBS_CMD_DESTROY_QP) => qp::destroy_qp(nic, f, c),
            (false, IB_USER_VERBS_CMD_ATTACH_MCAST) => qp::mcast(nic, f, c, true),
            (false, IB_USER_VERBS_CMD_DETACH_MCAST) => qp::mcast(nic, f, c, false),
            _ => Err(libc::EOPNOTSUPP),
        }
    }
}

/// What the model decided for QP `qpn`: its bfreg (dynamic, index) and responder
/// scatter-to-CQE; None for a QP no file has.
pub(crate) fn qp_view(qpn: u32) -> Option<((bool, u32), bool)> {
    let k = kernel();
    k.files.values().find_map(|f| {
        f.objs.values().find_map(|o| match o {
            Obj::Qp(q) if q.qpn == qpn => Some((q.bfreg, q.scatter)),
            _ => None,
        })
    })
}

/// The verbs state (`IB_QPS_*`: 0 RESET .. 3 RTS, 6 ERR) of QP `qpn`; None for a QP no file
/// has.
pub(crate) fn qp_state(qpn: u32) -> Option<i32> {
    let k = kernel();
    k.files.values().find_map(|f| {
        f.objs.values().find_map(|o| match o {
            Obj::Qp(q) if q.qpn == qpn => Some(q.state as i32),
            _ => None,
        })
    })
}

/// The requester and responder depths (`max_rd_atomic`, `max_dest_rd_atomic`) QP `qpn`
/// was last given (0 for none yet); None for a QP no file has.
pub(crate) fn qp_depths(qpn: u32) -> Option<(u8, u8)> {
    let k = kernel();
    k.files.values().find_map(|f| {
        f.objs.values().find_map(|o| match o {
            Obj::Qp(q) if q.qpn == qpn => Some((q.req_depth, q.resp_depth)),
            _ => None,
        })
    })
}

/// The mini-CQE format CQ `cqn` compresses with (its bit), 0 without compression; None for
/// a CQ the NIC does not have.
pub(crate) fn cq_view(cqn: u32) -> Option<u32> {
    let k = kernel();
    k.nic.cq_arm_stats(cqn)?;
    Some(k.nic.cq_compression(cqn).map_or(0, |f| f.bit()))
}

/// Unmaps the on-demand region of `lkey` as the kernel's MMU notifier does when its pages
/// move (`mlx5_ib_invalidate_range`): false for a key of no on-demand region.
pub(crate) fn invalidate_odp(lkey: u32) -> bool {
    kernel().nic.invalidate_odp(lkey)
}

/// Raises `e` on the NIC, as the hardware raises it (forwarded to the files' event
/// descriptors as every event is).
pub(crate) fn raise_event(e: mlx5::sim::AsyncEvent) {
    kernel().nic.raise_event(e);
}

/// Makes the NIC stamp completions in real time (`on`: a ConnectX whose clock runs in
/// real-time mode, `MLX5_IB_ALLOC_UCONTEXT_RESP_MASK_REAL_TIME_TS`) or with its free-running
/// counter again; seen by contexts opened after the call.
pub(crate) fn set_real_time(on: bool) {
    let k = kernel();
    let mut c = k.nic.hw_clock();
    c.format = if on {
        mlx5::clock::TimestampFormat::RealTime
    } else {
        mlx5::clock::TimestampFormat::FreeRunning
    };
    k.nic.set_hw_clock(c);
}

/// The NIC's atomics: `mode` 1 its own; 0 a ConnectX the kernel reports
/// `IBV_ATOMIC_NONE` for (`get_atomic_caps`) because its 8-byte atomics answer big-endian
/// (`atomic_req_8B_endianness_mode` 0), the usual reason: its QPs still take remote atomic
/// rights (`get_atomic_mode` succeeds); 2 none at all (`get_atomic_mode` fails: remote
/// atomic rights are refused). Seen by devices opened after the call.
pub(crate) fn set_atomics(mode: i32) {
    use std::sync::OnceLock;
    static OWN: OnceLock<mlx5::AtomicCaps> = OnceLock::new();
    let k = kernel();
    let own = *OWN.get_or_init(|| k.nic.atomic_caps());
    k.nic.set_atomic_caps(match mode {
        1 => own,
        0 => mlx5::AtomicCaps {
            reply8_be: true,
            ..own
        },
        _ => mlx5::AtomicCaps::NONE,
    });
}

/// Runs the NIC from the caller's thread until a pass finds nothing to do: every WQE rung
/// so far has run, its completions written (a ConnectX that keeps up). The NIC's own thread
/// keeps running beside it; the kernel's lock is not held while the NIC runs (its event
/// sinks take it).
pub(crate) fn drain() {
    let nic = kernel().nic.clone();
    while nic.process() != 0 {}
}

/// Compressed sessions written to CQ `cqn` (None for a CQ the NIC does not have).
pub(crate) fn cq_sessions(cqn: u32) -> Option<u64> {
    let k = kernel();
    k.nic.cq_arm_stats(cqn)?;
    Some(k.nic.cq_sessions(cqn).0)
}

/// Live objects of kind `kind` (0 PD, 1 MR, 2 MW, 3 completion channel, 4 CQ, 5 QP, 6 SRQ)
/// over every open device file: what a program left in the kernel.
pub(crate) fn live_objects(kind: u32) -> usize {
    let k = kernel();
    let n = k
        .files
        .values()
        .flat_map(|f| f.objs.values())
        .filter(|o| {
            kind == match o {
                Obj::Pd(_) => 0,
                Obj::Mr(_) => 1,
                Obj::Mw(_) => 2,
                Obj::Channel(_) => 3,
                Obj::Cq(_) => 4,
                Obj::Qp(_) => 5,
                Obj::Srq(_) => 6,
            }
        })
        .count();
    n
}
