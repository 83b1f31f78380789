//! `MODIFY_QP`: the verbs state machine in front of the NIC's QPs (`ib_modify_qp_is_ok`,
//! `mlx5_ib_modify_qp`, `mlx5_ib_modify_dct`).

use super::objects::{mask, Dc, File, Obj, QpState};
use crate::abi::{self, *};
use crate::cmd::Call;
use libc::c_int;
use mlx5::request::Access;
use mlx5::sim::Nic;
use std::sync::atomic::{AtomicU32, Ordering};

/// `MODIFY_QP` and `EX_MODIFY_QP` (whose response carries a DCT's number, made at RTR).
///
/// # Safety
/// As [`super::command`]'s calls.
pub(super) unsafe fn modify_qp(nic: &Nic, f: &mut File, call: &mut Call<'_>) -> Result<(), c_int> {
    // SAFETY: the caller's contract.
    unsafe {
        if !call.ex {
            let (c, _) = call.request::<ib_uverbs_modify_qp>();
            return modify_qp_with(nic, f, &c).map(drop);
        }
        let (c, _) = call.request::<ib_uverbs_ex_modify_qp>();
        let dctn = modify_qp_with(nic, f, &c.base)?;
        let resp = ib_uverbs_ex_modify_qp_resp {
            response_length: core::mem::size_of::<ib_uverbs_ex_modify_qp_resp>() as u32,
            ..Default::default()
        };
        let drv = mlx5_ib_modify_qp_resp {
            response_length: core::mem::size_of::<mlx5_ib_modify_qp_resp>() as u32,
            dctn: dctn.unwrap_or(0),
            ..Default::default()
        };
        call.respond(&resp, Some(&drv))
    }
}

/// A failure to inject: the state (verbs numbering) in bits 16..24 plus one, the errno in
/// bits 0..16; 0 for none.
static FAIL_NEXT: AtomicU32 = AtomicU32::new(0);

/// Makes the next `MODIFY_QP` to `state` (verbs numbering: 3 RTS) fail with `errno` (a
/// device refusing a transition the verbs state machine allows: a firmware error).
pub(crate) fn fail_next_modify(state: u8, errno: u16) {
    FAIL_NEXT.store(
        (u32::from(state) + 1) << 16 | u32::from(errno),
        Ordering::Relaxed,
    );
}

/// Whether a modify to `state` (with `mask`) is the one to fail.
fn fail_injected(state: u32, mask: u32) -> bool {
    let f = FAIL_NEXT.load(Ordering::Relaxed);
    f != 0 && mask & mask::STATE != 0 && (f >> 16) == state + 1
}

/// `MODIFY_QP`: the verbs state machine (`ib_modify_qp_is_ok`), the transport timers at
/// RTR/RTS, and the connection: at RTR an RC QP is connected to the peer it names, one side
/// (as a ConnectX writes the QP context's `remote_qpn`).
pub(super) fn modify_qp_with(
    nic: &Nic,
    f: &mut File,
    c: &abi::ib_uverbs_modify_qp,
) -> Result<Option<u32>, c_int> {
    let Some(Obj::Qp(q)) = f.objs.get_mut(&c.qp_handle) else {
        return Err(libc::EINVAL);
    };
    let m = c.attr_mask;
    let to = if m & mask::STATE != 0 {
        QpState::from_abi(c.qp_state).ok_or(libc::EINVAL)?
    } else {
        q.state
    };
    if fail_injected(u32::from(c.qp_state), m) {
        return Err(FAIL_NEXT.swap(0, Ordering::Relaxed) as c_int & 0xffff);
    }
    use QpState::*;
    let ok = matches!(
        (q.state, to),
        (_, Reset | Error)
            | (Reset, Init)
            | (Init, Init | Rtr)
            | (Rtr, Rts)
            | (Rts, Rts | Sqd)
            | (Sqd, Sqd | Rts)
            | (Sqe, Rts)
    );
    if !ok {
        return Err(libc::EINVAL);
    }
    if m & mask::TIMEOUT != 0 {
        q.timing.timeout = c.timeout;
    }
    if m & mask::RETRY_CNT != 0 {
        q.timing.retry_cnt = c.retry_cnt;
    }
    if m & mask::RNR_RETRY != 0 {
        q.timing.rnr_retry = c.rnr_retry;
    }
    if m & mask::MIN_RNR_TIMER != 0 {
        q.timing.min_rnr_timer = c.min_rnr_timer;
    }
    if m & mask::MAX_QP_RD_ATOMIC != 0 {
        q.req_depth = c.max_rd_atomic;
    }
    // `set_qpc_atomic_flags` (RC, at any modify naming the rights or the responder depth)
    // and `mlx5_ib_modify_dct` (at INIT): remote atomic rights need `get_atomic_mode`,
    // which fails (EOPNOTSUPP) on a device without atomics; a responder of depth 0 keeps
    // only remote write.
    let atomics = {
        let a = nic.atomic_caps();
        a.standard || a.masked
    };
    if q.ud.is_none() && m & (mask::ACCESS_FLAGS | mask::MAX_DEST_RD_ATOMIC) != 0 {
        let access = if m & mask::ACCESS_FLAGS != 0 {
            c.qp_access_flags
        } else {
            q.access
        };
        let depth = if m & mask::MAX_DEST_RD_ATOMIC != 0 {
            c.max_dest_rd_atomic
        } else {
            q.resp_depth
        };
        let dct = matches!(q.dc, Some(Dc::Target { .. }));
        let effective = if depth == 0 && !dct {
            access & Access::REMOTE_WRITE.0
        } else {
            access
        };
        if effective & Access::REMOTE_ATOMIC.0 != 0 && !atomics {
            return Err(libc::EOPNOTSUPP);
        }
        if m & mask::ACCESS_FLAGS != 0 {
            q.access = c.qp_access_flags;
        }
        if m & mask::MAX_DEST_RD_ATOMIC != 0 {
            q.resp_depth = c.max_dest_rd_atomic;
        }
    }
    if let Some(dc) = &mut q.dc {
        // DC: no destination; a target's rights at INIT, the target made at RTR, an
        // initiator ready at RTS (`mlx5_ib_modify_dct`, `modify_qp` of a DCI).
        if let Dc::Target { access, .. } = dc {
            if m & mask::ACCESS_FLAGS != 0 {
                *access = c.qp_access_flags;
            }
        }
        let from = std::mem::replace(&mut q.state, to);
        return match (*dc, from, to) {
            (
                Dc::Target {
                    pd,
                    cq,
                    srq,
                    key,
                    scatter,
                    access,
                    uidx,
                    made: false,
                },
                Init,
                Rtr,
            ) => {
                let made = nic.create_dct(pd, cq, srq, key, Access(access));
                let dctn = made.map_err(|_| {
                    q.state = from;
                    libc::EINVAL
                })?;
                let _ = nic.set_dct_scatter_to_cqe(dctn, scatter);
                let _ = nic.set_user_index(dctn, uidx);
                q.qpn = dctn;
                if let Some(Dc::Target { made, .. }) = &mut q.dc {
                    *made = true;
                }
                Ok(Some(dctn))
            }
            (Dc::Initiator, Rtr, Rts) => {
                nic.dci_ready(q.qpn, q.timing).map_err(|_| {
                    q.state = from;
                    libc::EINVAL
                })?;
                Ok(None)
            }
            (_, _, Error) if q.qpn != 0 => {
                nic.set_error(q.qpn).map_err(|_| libc::EINVAL)?;
                Ok(None)
            }
            _ => Ok(None),
        };
    }
    if let Some(ud) = &mut q.ud {
        // UD: the Q_Key at INIT (or later), no destination (`ib_modify_qp_is_ok`'s
        // attribute table for IB_QPT_UD).
        if m & mask::QKEY != 0 {
            ud.qkey = Some(c.qkey);
        }
        if to == Init && ud.qkey.is_none() {
            return Err(libc::EINVAL);
        }
    } else if to == Rtr {
        if m & mask::DEST_QPN == 0 {
            return Err(libc::EINVAL);
        }
        q.dest = Some(c.dest_qp_num & 0xff_ffff);
    }
    let (qpn, dest, timing, ud) = (q.qpn, q.dest, q.timing, q.ud);
    match to {
        Error => nic.set_error(qpn).map_err(|_| libc::EINVAL)?,
        Reset if q.state != Reset => return Err(libc::EOPNOTSUPP),
        Rtr | Rts => {
            nic.set_timing(qpn, timing).map_err(|_| libc::EINVAL)?;
        }
        _ => {}
    }
    let from = std::mem::replace(&mut q.state, to);
    if let Some(ud) = ud {
        // The NIC runs a UD QP from RTR on (it receives there; its sends wait for RTS in
        // the provider, whose send path is an error stub until then).
        if to == Rtr && from == Init {
            let qkey = ud.qkey.ok_or(libc::EINVAL)?;
            nic.make_ud(qpn, qkey, ud.mcast_loopback)
                .map_err(|_| libc::EINVAL)?;
        }
        return Ok(None);
    }
    if to == Init && from == Reset {
        // RST2INIT: the NIC's QP takes receives from here on (they wait until it is
        // connected) and answers nothing yet.
        if nic.init_qp(qpn).is_err() {
            q.state = from;
            return Err(libc::EINVAL);
        }
    }
    if to == Rtr {
        // One side: the QP's context names its peer (a ConnectX's RTR writes `remote_qpn`,
        // the address vector's `rlid`, `next_rcv_psn` and the path MTU); its requests reach
        // the peer once that is ready too, if the LID is this port's and the PSNs agree.
        // The first send PSN comes at RTS.
        let path = mlx5::sim::RcPath {
            dest_qpn: dest.expect("set above"),
            dlid: if m & mask::AV != 0 { c.dest.dlid } else { 0 },
            rq_psn: if m & mask::RQ_PSN != 0 { c.rq_psn } else { 0 },
            sq_psn: 0,
            mtu: if m & mask::PATH_MTU != 0 {
                // `mlx5_ib_modify_qp`: a path MTU outside IB_MTU_256 ..= IB_MTU_4096 is
                // EINVAL (the NIC refuses what is not a size).
                128u32.checked_shl(u32::from(c.path_mtu)).unwrap_or(0)
            } else {
                nic.port_attr().mtu
            },
        };
        nic.connect(qpn, path).map_err(|_| libc::EINVAL)?;
    }
    if to == Rts && m & mask::SQ_PSN != 0 {
        nic.set_sq_psn(qpn, c.sq_psn).map_err(|_| libc::EINVAL)?;
    }
    Ok(None)
}
