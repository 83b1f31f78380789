//! Creating and destroying QPs (`mlx5_ib_create_qp` -> `create_user_qp`, `mlx5_ib_create_dct`),
//! their bfregs, and multicast attachment.

use super::limits::{BFREGS_PER_PAGE, BF_OFFSET, BF_REG_SIZE, DYN_BFREGS, MAX_WR};
use super::objects::{Dc, File, Obj, Qp, QpState, Ud};
use crate::abi::{self, *};
use crate::cmd::Call;
use crate::events::{self, Subject};
use libc::c_int;
use mlx5::sim::{HostQp, Nic, QpCaps, QpTiming};

/// `enum ib_qp_type` values rdma-core sends.
const QPT_RC: u8 = 2;
/// `IB_QPT_UD`.
const QPT_UD: u8 = 4;
/// `IB_QPT_DRIVER`: a DC QP (`MLX5_QP_FLAG_TYPE_DCI` / `_DCT` in the driver data).
const QPT_DRIVER: u8 = 0xff;
/// `IB_UVERBS_QP_CREATE_BLOCK_MULTICAST_LOOPBACK` (verbs' `IBV_QP_CREATE_BLOCK_SELF_MCAST_LB`).
const BLOCK_MCAST_LOOPBACK: u32 = 1 << 1;

/// `CREATE_QP` and `EX_CREATE_QP` (extended: only `IB_UVERBS_QP_CREATE_BLOCK_MULTICAST_LOOPBACK`).
///
/// # Safety
/// As [`super::command`]'s calls.
pub(super) unsafe fn create_qp(nic: &Nic, f: &mut File, call: &mut Call<'_>) -> Result<(), c_int> {
    // SAFETY: the caller's contract.
    unsafe {
        if call.ex {
            let (c, udata) = call.request::<ib_uverbs_ex_create_qp>();
            if c.create_flags & !BLOCK_MCAST_LOOPBACK != 0 || c.comp_mask != 0 {
                return Err(libc::EOPNOTSUPP);
            }
            create_qp_with(nic, f, call, qp_spec!(c, c.create_flags), udata)
        } else {
            let (c, udata) = call.request::<ib_uverbs_create_qp>();
            create_qp_with(nic, f, call, qp_spec!(c, 0), udata)
        }
    }
}

/// The [`QpSpec`] of a `CREATE_QP` or `EX_CREATE_QP` command struct (their fields share
/// names), with `create_flags`.
macro_rules! qp_spec {
    ($c:expr, $flags:expr) => {
        QpSpec {
            create_flags: $flags,
            user: $c.user_handle,
            pd: $c.pd_handle,
            send_cq: $c.send_cq_handle,
            recv_cq: $c.recv_cq_handle,
            srq: ($c.is_srq != 0).then_some($c.srq_handle),
            max_send_sge: $c.max_send_sge,
            max_inline: $c.max_inline_data,
            qp_type: $c.qp_type,
        }
    };
}
use qp_spec;

/// What `CREATE_QP` and its extended form share.
struct QpSpec {
    create_flags: u32,
    user: u64,
    pd: u32,
    send_cq: u32,
    recv_cq: u32,
    srq: Option<u32>,
    max_send_sge: u32,
    max_inline: u32,
    qp_type: u8,
}

/// `CREATE_QP`: `mlx5_ib_create_qp` -> `create_user_qp`: the provider's buffer (receive
/// ring at 0, send ring after `rq_wqe_count << rq_wqe_shift` bytes), its record, a bfreg
/// from the context's classes (`alloc_bfreg`: a free low-latency one, else the least used
/// medium one; bfreg 0 has no BlueFlame), and responder scatter-to-CQE when the provider
/// asks (`MLX5_QP_FLAG_SCATTER_CQE`; `configure_responder_scat_cqe`: RC only here).
///
/// # Safety
/// As [`super::command`]'s calls.
unsafe fn create_qp_with(
    nic: &Nic,
    f: &mut File,
    call: &Call<'_>,
    s: QpSpec,
    udata: &[u8],
) -> Result<(), c_int> {
    use abi::*;
    if ![QPT_RC, QPT_UD, QPT_DRIVER].contains(&s.qp_type) {
        return Err(libc::EOPNOTSUPP);
    }
    let ud = (s.qp_type == QPT_UD).then_some(Ud {
        qkey: None,
        mcast_loopback: s.create_flags & BLOCK_MCAST_LOOPBACK == 0,
    });
    // SAFETY: a plain ABI struct.
    let u: mlx5_ib_create_qp = unsafe { crate::cmd::read(udata) };
    if udata.len() < 48 {
        return Err(libc::EINVAL);
    }
    let dc_flags = MLX5_QP_FLAG_TYPE_DCI | MLX5_QP_FLAG_TYPE_DCT;
    let known = MLX5_QP_FLAG_SCATTER_CQE | MLX5_QP_FLAG_BFREG_INDEX | dc_flags;
    if u.flags & !known != 0 || (s.qp_type == QPT_DRIVER) != (u.flags & dc_flags != 0) {
        return Err(libc::EOPNOTSUPP);
    }
    if u.flags & MLX5_QP_FLAG_TYPE_DCT != 0 {
        // SAFETY: the caller's contract.
        return unsafe { create_dct(f, call, &s, &u) };
    }
    let dci = u.flags & MLX5_QP_FLAG_TYPE_DCI != 0;
    let pow2 = |n: u32| n == 0 || n.is_power_of_two();
    if !pow2(u.sq_wqe_count)
        || !pow2(u.rq_wqe_count)
        || u.sq_wqe_count == 0
        || u.sq_wqe_count > MAX_WR
        || u.rq_wqe_count > MAX_WR
        || (u.rq_wqe_count != 0 && !(4..=9).contains(&u.rq_wqe_shift))
    {
        return Err(libc::EINVAL);
    }
    let pd = f.pd(s.pd)?;
    let (Some(Obj::Cq(scq)), Some(Obj::Cq(rcq))) = (f.objs.get(&s.send_cq), f.objs.get(&s.recv_cq))
    else {
        return Err(libc::EINVAL);
    };
    // `get_qp_ts_format`: the send and receive CQs' timestamp formats must agree (a
    // real-time CQ beside a free-running one: "The send ts_format does not match the
    // receive ts_format", EOPNOTSUPP).
    if scq.real_time != rcq.real_time {
        return Err(libc::EOPNOTSUPP);
    }
    let (scq, rcq) = (scq.cqn, rcq.cqn);
    let srqn = match s.srq.map(|h| f.objs.get(&h)) {
        None => None,
        Some(Some(Obj::Srq(q))) if u.rq_wqe_count == 0 => Some(q.srqn),
        Some(_) => return Err(libc::EINVAL),
    };
    // The QP's bfreg: the provider's dynamic one (a thread domain's: `bfregn_to_uar_index`
    // with `dyn_bfreg`), else one of the context's (`alloc_bfreg`).
    let (dynamic, bfreg) = if u.flags & MLX5_QP_FLAG_BFREG_INDEX != 0 {
        if u.bfreg_index >= DYN_BFREGS {
            return Err(libc::EINVAL);
        }
        (true, u.bfreg_index)
    } else {
        (false, alloc_bfreg(f))
    };
    let release = |f: &mut File| {
        if !dynamic {
            f.bfreg_count[bfreg as usize] -= 1;
        }
    };
    let Some(page) = f.pages.get(&(dynamic, bfreg / BFREGS_PER_PAGE)).copied() else {
        release(f);
        return Err(libc::EINVAL);
    };
    let bf_reg = page + BF_OFFSET + (bfreg % BFREGS_PER_PAGE) as usize * BF_REG_SIZE as usize;
    let caps = QpCaps {
        sq_blocks: u.sq_wqe_count,
        rq_entries: u.rq_wqe_count,
        max_send_sge: s.max_send_sge.min(60),
        max_recv_sge: if u.rq_wqe_count == 0 {
            0
        } else {
            (1 << u.rq_wqe_shift) / 16
        },
        max_inline: s.max_inline.min(960),
        bf_size: if !dynamic && bfreg == 0 {
            0
        } else {
            BF_REG_SIZE / 2
        },
        // `configure_responder_scat_cqe`: RC only (UD receives carry a GRH).
        scatter_to_cqe: ud.is_none() && u.flags & MLX5_QP_FLAG_SCATTER_CQE != 0,
        ..QpCaps::default()
    };
    let rq_bytes = if u.rq_wqe_count == 0 {
        0
    } else {
        (u.rq_wqe_count as usize) << u.rq_wqe_shift
    };
    let mem = HostQp {
        sq: (u.buf_addr as usize + rq_bytes) as *mut u8,
        rq: u.buf_addr as *mut u8,
        dbrec: u.db_addr as *mut u32,
        bf_reg: bf_reg as *mut u8,
    };
    // SAFETY: the provider's buffer of both rings and its record, freed only after
    // DESTROY_QP; the register lies in a UAR page mapped for the file's life.
    let made = unsafe {
        if dci {
            nic.create_dci_at(pd, scq, caps, mem)
        } else {
            nic.create_qp_at(pd, scq, rcq, caps, mem)
        }
    };
    let raw = match made {
        Ok(r) => r,
        Err(_) => {
            release(f);
            return Err(libc::EINVAL);
        }
    };
    if let Some(srqn) = srqn {
        if nic.attach_qp_srq(raw.qpn, srqn).is_err() {
            let _ = nic.destroy_qp(raw.qpn);
            release(f);
            return Err(libc::EINVAL);
        }
    }
    // CQE version 1: the QP context's `user_index`, which the NIC writes into every CQE of
    // the QP (`srqn_uidx`) and libmlx5 finds the QP by (`mlx5_find_uidx`).
    let _ = nic.set_user_index(raw.qpn, u.uidx);
    let h = f.add(Obj::Qp(Box::new(Qp {
        qpn: raw.qpn,
        user: s.user,
        state: QpState::Reset,
        dest: None,
        timing: QpTiming::default(),
        access: 0,
        resp_depth: 0,
        req_depth: 0,
        bfreg: (dynamic, bfreg),
        scatter: caps.scatter_to_cqe && !dci,
        ud,
        dc: dci.then_some(Dc::Initiator),
    })));
    let resp = ib_uverbs_create_qp_resp {
        qp_handle: h,
        qpn: raw.qpn,
        max_send_wr: u.sq_wqe_count,
        max_recv_wr: u.rq_wqe_count,
        max_send_sge: s.max_send_sge,
        max_recv_sge: caps.max_recv_sge,
        max_inline_data: s.max_inline,
        ..Default::default()
    };
    // `_create_user_qp`: a static bfreg's index as the provider numbers its registers
    // (`adjust_bfregn`: four per UAR page, the two regular ones first), so that libmlx5's
    // `ctx->bfs[bfreg_index]` is the register the NIC watches (the raw index named another
    // page's from 2 on); a dynamic one's is not read (the thread domain has its own).
    let drv = mlx5_ib_create_qp_resp {
        bfreg_index: if dynamic {
            bfreg
        } else {
            bfreg / BFREGS_PER_PAGE * 4 + bfreg % BFREGS_PER_PAGE
        },
        ..Default::default()
    };
    // SAFETY: the caller's contract.
    unsafe { call.respond(&resp, Some(&drv)) }
}

/// `CREATE_QP` of a DC target (`mlx5_ib_create_dct`): nothing on the device yet, its
/// attributes kept for RTR; no rings (the provider allocates none), number 0 until then.
///
/// # Safety
/// As [`super::command`]'s calls.
unsafe fn create_dct(
    f: &mut File,
    call: &Call<'_>,
    s: &QpSpec,
    u: &abi::mlx5_ib_create_qp,
) -> Result<(), c_int> {
    use abi::*;
    let pd = f.pd(s.pd)?;
    let Some(Obj::Cq(cq)) = f.objs.get(&s.recv_cq) else {
        return Err(libc::EINVAL);
    };
    let srq = match s.srq.map(|h| f.objs.get(&h)) {
        None => None,
        Some(Some(Obj::Srq(q))) => Some(q.srqn),
        Some(_) => return Err(libc::EINVAL),
    };
    // SAFETY: `access_key` is the union's member for a DCT.
    let key = unsafe { u.__bindgen_anon_1.access_key };
    let dc = Dc::Target {
        pd,
        cq: cq.cqn,
        srq,
        key,
        scatter: u.flags & MLX5_QP_FLAG_SCATTER_CQE != 0,
        access: 0,
        uidx: u.uidx,
        made: false,
    };
    let h = f.add(Obj::Qp(Box::new(Qp {
        qpn: 0,
        user: s.user,
        state: QpState::Reset,
        dest: None,
        timing: QpTiming::default(),
        access: 0,
        resp_depth: 0,
        req_depth: 0,
        bfreg: (true, u32::MAX),
        scatter: false,
        ud: None,
        dc: Some(dc),
    })));
    let resp = ib_uverbs_create_qp_resp {
        qp_handle: h,
        ..Default::default()
    };
    // SAFETY: the caller's contract.
    unsafe { call.respond(&resp, Some(&mlx5_ib_create_qp_resp::default())) }
}

/// `alloc_bfreg` (`qp.c`): a free low-latency bfreg (the last `low_lat` of the non-zero
/// ones, one QP each), else the least used medium one (bfregs 1 .. first low-latency),
/// else bfreg 0.
fn alloc_bfreg(f: &mut File) -> u32 {
    let tot = f.tot_bfregs;
    let first_hi = tot - f.low_lat;
    let hi = (first_hi..tot).find(|&i| f.bfreg_count[i as usize] == 0);
    let med = || (1..first_hi).min_by_key(|&i| f.bfreg_count[i as usize]);
    let b = hi.or_else(med).unwrap_or(0);
    f.bfreg_count[b as usize] += 1;
    b
}

/// `DESTROY_QP`, with the events the user read of it (a DCT never made at RTR has nothing
/// on the NIC).
///
/// # Safety
/// As [`super::command`]'s calls.
pub(super) unsafe fn destroy_qp(nic: &Nic, f: &mut File, call: &mut Call<'_>) -> Result<(), c_int> {
    // SAFETY: the caller's contract.
    let (c, _) = unsafe { call.request::<ib_uverbs_destroy_qp>() };
    let Some(Obj::Qp(q)) = f.objs.get(&c.qp_handle) else {
        return Err(libc::EINVAL);
    };
    let (qpn, bfreg) = (q.qpn, q.bfreg);
    if crate::cmd::trace() {
        eprintln!(
            "kernel-model: destroying QP {qpn:#x} ({:?}, peer {:?}): {:?} {:?}",
            q.state,
            q.dest,
            nic.qp_state(qpn),
            nic.qp_stats(qpn)
        );
    }
    let unmade = matches!(q.dc, Some(Dc::Target { made: false, .. }));
    if !unmade {
        nic.destroy_qp(qpn).map_err(|_| libc::EINVAL)?;
    }
    if let (false, b) = bfreg {
        f.bfreg_count[b as usize] -= 1;
    }
    let qpn = if unmade { u32::MAX } else { qpn };
    f.objs.remove(&c.qp_handle);
    let resp = ib_uverbs_destroy_qp_resp {
        events_reported: f
            .async_fd
            .map_or(0, |fd| events::reported(fd, Subject::Qp(qpn))),
    };
    // SAFETY: the caller's contract.
    unsafe { call.respond::<_, ()>(&resp, None) }
}

/// `ATTACH_MCAST` / `DETACH_MCAST` (`attach`): a UD QP joins or leaves a group on the NIC.
///
/// # Safety
/// As [`super::command`]'s calls.
pub(super) unsafe fn mcast(
    nic: &Nic,
    f: &mut File,
    call: &mut Call<'_>,
    attach: bool,
) -> Result<(), c_int> {
    // SAFETY: the caller's contract; detach's struct has the same layout.
    let (c, _) = unsafe { call.request::<ib_uverbs_attach_mcast>() };
    let Some(Obj::Qp(q)) = f.objs.get(&c.qp_handle) else {
        return Err(libc::EINVAL);
    };
    let r = if attach {
        nic.attach_mcast(q.qpn, c.gid, c.mlid)
    } else {
        nic.detach_mcast(q.qpn, c.gid, c.mlid)
    };
    r.map_err(|_| libc::EINVAL)
}
