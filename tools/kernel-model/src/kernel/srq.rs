//! Shared receive queues (`mlx5_ib_create_srq` -> `create_srq_user`, `mlx5_ib_modify_srq`).

use super::objects::{File, Obj, Srq};
use crate::abi::{self, *};
use crate::cmd::Call;
use crate::events::{self, Subject};
use libc::c_int;
use mlx5::sim::{HostSrq, Nic, SrqCaps};

/// `CREATE_SRQ`: `mlx5_ib_create_srq` -> `create_srq_user`: the provider's ring and
/// record, `max = roundup_pow_of_two(max_wr + 1)` entries of
/// `roundup_pow_of_two(16 + 16 * max_sge)` bytes (at least 32), as the provider sized them.
///
/// # Safety
/// As [`super::command`]'s calls.
pub(super) unsafe fn create_srq(nic: &Nic, f: &mut File, call: &mut Call<'_>) -> Result<(), c_int> {
    use abi::*;
    // SAFETY: the caller's contract.
    let (c, udata) = unsafe { call.request::<ib_uverbs_create_srq>() };
    // SAFETY: a plain ABI struct.
    let u: mlx5_ib_create_srq = unsafe { crate::cmd::read(udata) };
    if udata.len() < core::mem::size_of::<mlx5_ib_create_srq>() || u.flags != 0 {
        return Err(libc::EINVAL);
    }
    let pdn = f.pd(c.pd_handle)?;
    let caps = SrqCaps {
        max_wr: c.max_wr,
        max_sge: c.max_sge,
    };
    let mem = HostSrq {
        buf: u.buf_addr as *mut u8,
        dbrec: u.db_addr as *mut u32,
    };
    // SAFETY: the provider's ring and record, freed only after DESTROY_SRQ.
    let raw = unsafe { nic.create_srq_at(pdn, caps, mem) }.map_err(|_| libc::EINVAL)?;
    if c.srq_limit != 0 && nic.arm_srq_limit(raw.srqn, c.srq_limit).is_err() {
        let _ = nic.destroy_srq(raw.srqn);
        return Err(libc::EINVAL);
    }
    let h = f.add(Obj::Srq(Srq {
        srqn: raw.srqn,
        user: c.user_handle,
        max_wr: raw.wqe_cnt - 1,
        max_sge: raw.max_sge,
    }));
    let resp = ib_uverbs_create_srq_resp {
        srq_handle: h,
        max_wr: raw.wqe_cnt - 1,
        max_sge: raw.max_sge,
        srqn: raw.srqn,
        ..Default::default()
    };
    let drv = mlx5_ib_create_srq_resp {
        srqn: raw.srqn,
        reserved: 0,
    };
    // SAFETY: the caller's contract.
    unsafe { call.respond(&resp, Some(&drv)) }
}

/// `MODIFY_SRQ`: the limit only (`mlx5_ib_modify_srq` refuses resizing: `EINVAL`).
///
/// # Safety
/// As [`super::command`]'s calls.
pub(super) unsafe fn modify_srq(nic: &Nic, f: &mut File, call: &mut Call<'_>) -> Result<(), c_int> {
    // SAFETY: the caller's contract.
    let (c, _) = unsafe { call.request::<ib_uverbs_modify_srq>() };
    let Some(Obj::Srq(s)) = f.objs.get(&c.srq_handle) else {
        return Err(libc::EINVAL);
    };
    // IB_SRQ_LIMIT
    if c.attr_mask != 1 << 1 {
        return Err(libc::EINVAL);
    }
    nic.arm_srq_limit(s.srqn, c.srq_limit)
        .map_err(|_| libc::EINVAL)
}

/// `QUERY_SRQ` (`mlx5_ib_query_srq`): `max_wr = msrq.max - 1`, the whole ring the provider
/// allocated (its wait queue included: rdma-core's `mlx5_query_srq` passes it through),
/// the scatter entries and the armed limit.
///
/// # Safety
/// As [`super::command`]'s calls.
pub(super) unsafe fn query_srq(nic: &Nic, f: &mut File, call: &mut Call<'_>) -> Result<(), c_int> {
    // SAFETY: the caller's contract.
    let (c, _) = unsafe { call.request::<ib_uverbs_query_srq>() };
    let Some(Obj::Srq(s)) = f.objs.get(&c.srq_handle) else {
        return Err(libc::EINVAL);
    };
    let resp = ib_uverbs_query_srq_resp {
        max_wr: s.max_wr,
        max_sge: s.max_sge,
        srq_limit: nic.srq_limit(s.srqn).unwrap_or(0),
        reserved: 0,
    };
    // SAFETY: the caller's contract.
    unsafe { call.respond::<_, ()>(&resp, None) }
}

/// `DESTROY_SRQ` (`EBUSY` while a QP or DCT uses it), with the events the user read of it.
///
/// # Safety
/// As [`super::command`]'s calls.
pub(super) unsafe fn destroy_srq(
    nic: &Nic,
    f: &mut File,
    call: &mut Call<'_>,
) -> Result<(), c_int> {
    // SAFETY: the caller's contract.
    let (c, _) = unsafe { call.request::<ib_uverbs_destroy_srq>() };
    let Some(Obj::Srq(s)) = f.objs.get(&c.srq_handle) else {
        return Err(libc::EINVAL);
    };
    let srqn = s.srqn;
    nic.destroy_srq(srqn).map_err(|_| libc::EBUSY)?;
    f.objs.remove(&c.srq_handle);
    let resp = ib_uverbs_destroy_srq_resp {
        events_reported: f
            .async_fd
            .map_or(0, |fd| events::reported(fd, Subject::Srq(srqn))),
    };
    // SAFETY: the caller's contract.
    unsafe { call.respond::<_, ()>(&resp, None) }
}
