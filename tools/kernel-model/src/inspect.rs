//! What a test may ask the model about the objects rdma-core created, by their numbers: the
//! decisions the kernel made from the provider's flags, which the crate cannot see from its
//! side (a ConnectX keeps them in its QP and CQ contexts). Looked up by tests with
//! `dlsym(RTLD_DEFAULT, ...)`, so nothing links against this library.

use libc::c_int;

/// The model's view of QP `qpn`: `*bfreg` its bfreg index (bit 31 set for a dynamic one, a
/// thread domain's), `*scatter` 1 when responder scatter-to-CQE is on. 0, or -1 when no
/// file has the QP.
///
/// # Safety
/// `bfreg` and `scatter` are valid for writing.
#[no_mangle]
pub unsafe extern "C" fn blueflame_kernel_model_qp(
    qpn: u32,
    bfreg: *mut u32,
    scatter: *mut u32,
) -> c_int {
    match crate::kernel::qp_view(qpn) {
        Some(((dynamic, b), s)) => {
            // SAFETY: the caller's contract.
            unsafe {
                bfreg.write(b | u32::from(dynamic) << 31);
                scatter.write(u32::from(s));
            }
            0
        }
        None => -1,
    }
}

/// The verbs state of QP `qpn` (`IB_QPS_*`: 0 RESET, 1 INIT, 2 RTR, 3 RTS, 6 ERR), or -1
/// when no file has the QP.
#[no_mangle]
pub extern "C" fn blueflame_kernel_model_qp_state(qpn: u32) -> c_int {
    crate::kernel::qp_state(qpn).unwrap_or(-1)
}

/// The reads and atomics QP `qpn` was programmed to have in flight: its requester's
/// (`max_rd_atomic`, RTS) in bits 0..8, its responder's (`max_dest_rd_atomic`, RTR) in bits
/// 8..16 (0 for one not given yet); -1 when no file has the QP.
#[no_mangle]
pub extern "C" fn blueflame_kernel_model_qp_depths(qpn: u32) -> c_int {
    crate::kernel::qp_depths(qpn)
        .map_or(-1, |(req, resp)| c_int::from(req) | c_int::from(resp) << 8)
}

/// The mini-CQE format bit CQ `cqn` compresses with (0: no compression), or -1 when the NIC
/// has no such CQ.
#[no_mangle]
pub extern "C" fn blueflame_kernel_model_cq_compression(cqn: u32) -> i64 {
    crate::kernel::cq_view(cqn).map_or(-1, i64::from)
}

/// Compressed sessions the NIC wrote to CQ `cqn` so far, or -1 when it has no such CQ.
#[no_mangle]
pub extern "C" fn blueflame_kernel_model_cq_sessions(cqn: u32) -> i64 {
    crate::kernel::cq_sessions(cqn).map_or(-1, |n| n as i64)
}

/// Unmaps the on-demand region of `lkey` (the kernel's MMU-notifier invalidation): the
/// NIC's next receive into an SRQ WQE over it faults. 0, or -1 for a key of no on-demand
/// region.
#[no_mangle]
pub extern "C" fn blueflame_kernel_model_invalidate_odp(lkey: u32) -> c_int {
    if crate::kernel::invalidate_odp(lkey) {
        0
    } else {
        -1
    }
}

/// The NIC's atomics, for contexts opened from then on: `mode` 1 its own, 0 8-byte replies
/// big-endian (the device reports `IBV_ATOMIC_NONE`, its QPs take remote atomic rights),
/// 2 none at all (remote atomic rights refused, as `get_atomic_mode` refuses them).
#[no_mangle]
pub extern "C" fn blueflame_kernel_model_set_atomics(mode: c_int) {
    crate::kernel::set_atomics(mode);
}

/// Raises an asynchronous event on the NIC as its hardware would: `kind` is the
/// `ib_event_type` (0 CQ error, 1 QP fatal, 3 QP access error, 8 device fatal, 9 port
/// active, 10 port error, 14 SRQ error), `num` the CQ, QP or SRQ number (the port for 9 and
/// 10). 0, or -1 for another kind.
#[no_mangle]
pub extern "C" fn blueflame_kernel_model_raise_event(kind: c_int, num: u32) -> c_int {
    use mlx5::sim::AsyncEvent as E;
    let e = match kind {
        0 => E::CqError { cqn: num },
        1 => E::QpFatal { qpn: num },
        3 => E::QpAccessError { qpn: num },
        8 => E::DeviceFatal,
        9 => E::PortActive { port: num as u8 },
        10 => E::PortError { port: num as u8 },
        14 => E::SrqError { srqn: num },
        _ => return -1,
    };
    crate::kernel::raise_event(e);
    0
}

/// Makes the next `ibv_modify_qp` of any QP to `state` (verbs numbering: 2 RTR, 3 RTS)
/// fail with `errno`, as a device's firmware may refuse a transition the verbs state
/// machine allows.
#[no_mangle]
pub extern "C" fn blueflame_kernel_model_fail_next_modify(state: c_int, errno: c_int) {
    crate::kernel::fail_next_modify(state as u8, errno as u16);
}

/// With `on` 1, the NIC stamps completions in real time and the context says so to
/// contexts opened from then on; with 0, its free-running counter again.
#[no_mangle]
pub extern "C" fn blueflame_kernel_model_set_real_time(on: c_int) {
    crate::kernel::set_real_time(on != 0);
}

/// Runs the NIC until every WQE rung so far has run and completed (for probes that count
/// the instructions of a poll that finds its completion: a poll made before the NIC's thread
/// got to the WQE would find nothing and count as a cheaper poll).
#[no_mangle]
pub extern "C" fn blueflame_kernel_model_drain() {
    crate::kernel::drain();
}

/// Live objects of kind `kind` (0 PD, 1 MR, 2 MW, 3 completion channel, 4 CQ, 5 QP, 6 SRQ)
/// over every open device file.
#[no_mangle]
pub extern "C" fn blueflame_kernel_model_live_objects(kind: u32) -> i64 {
    crate::kernel::live_objects(kind) as i64
}
