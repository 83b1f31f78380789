//! Protection domains, regions and windows (`mlx5_ib_alloc_pd`, `mlx5_ib_reg_user_mr`,
//! `mlx5_ib_alloc_mw` and their releases).

use super::objects::{File, Obj};
use crate::abi::{self, *};
use crate::cmd::Call;
use libc::c_int;
use mlx5::request::{Access, MwType};
use mlx5::sim::Nic;

/// `ALLOC_PD`: a domain and its number (`mlx5_ib_alloc_pd_resp.pdn`).
///
/// # Safety
/// As [`super::command`]'s calls.
pub(super) unsafe fn alloc_pd(nic: &Nic, f: &mut File, call: &mut Call<'_>) -> Result<(), c_int> {
    // SAFETY: the caller's contract.
    let _ = unsafe { call.request::<ib_uverbs_alloc_pd>() };
    let pdn = nic.alloc_pd();
    let h = f.add(Obj::Pd(pdn));
    let resp = ib_uverbs_alloc_pd_resp {
        pd_handle: h,
        ..Default::default()
    };
    // SAFETY: the caller's contract.
    unsafe { call.respond(&resp, Some(&mlx5_ib_alloc_pd_resp { pdn })) }
}

/// `DEALLOC_PD` (`EBUSY` while objects use it).
///
/// # Safety
/// As [`super::command`]'s calls.
pub(super) unsafe fn dealloc_pd(nic: &Nic, f: &mut File, call: &mut Call<'_>) -> Result<(), c_int> {
    // SAFETY: the caller's contract.
    let (c, _) = unsafe { call.request::<ib_uverbs_dealloc_pd>() };
    let pdn = f.pd(c.pd_handle)?;
    nic.dealloc_pd(pdn).map_err(|_| libc::EBUSY)?;
    f.objs.remove(&c.pd_handle);
    Ok(())
}

/// `REG_MR`: the user's memory, registered where it is (`mlx5_ib_reg_user_mr`; the model
/// needs iova = address, what `ibv_reg_mr` asks).
///
/// # Safety
/// As [`super::command`]'s calls.
pub(super) unsafe fn reg_mr(nic: &Nic, f: &mut File, call: &mut Call<'_>) -> Result<(), c_int> {
    use abi::*;
    // SAFETY: the caller's contract.
    let (c, _) = unsafe { call.request::<ib_uverbs_reg_mr>() };
    let pdn = f.pd(c.pd_handle)?;
    if c.hca_va != c.start {
        return Err(libc::EOPNOTSUPP);
    }
    // IBV_ACCESS_ON_DEMAND (0x40) is `Access::ON_DEMAND`: the NIC refuses it without
    // on-demand paging, and faults on such a region after `invalidate_odp`.
    let access = Access(c.access_flags);
    let len = usize::try_from(c.length).map_err(|_| libc::EINVAL)?;
    // SAFETY: the user's memory: the kernel pins it (`ib_umem_get`); here the process keeps
    // it mapped until it deregisters the region, as `ibv_reg_mr`'s contract asks.
    let mr = unsafe { nic.reg_mr(pdn, c.start as *mut u8, len, access) }.map_err(|e| match e {
        mlx5::sim::SimError::NoCapability(_) => libc::EOPNOTSUPP,
        _ => libc::EINVAL,
    })?;
    let h = f.add(Obj::Mr(mr.lkey));
    let resp = ib_uverbs_reg_mr_resp {
        mr_handle: h,
        lkey: mr.lkey,
        rkey: mr.rkey,
        ..Default::default()
    };
    // SAFETY: the caller's contract.
    unsafe { call.respond::<_, ()>(&resp, None) }
}

/// `DEREG_MR` (`EBUSY` while a window is bound to it).
///
/// # Safety
/// As [`super::command`]'s calls.
pub(super) unsafe fn dereg_mr(nic: &Nic, f: &mut File, call: &mut Call<'_>) -> Result<(), c_int> {
    // SAFETY: the caller's contract.
    let (c, _) = unsafe { call.request::<ib_uverbs_dereg_mr>() };
    let Some(Obj::Mr(lkey)) = f.objs.get(&c.mr_handle) else {
        return Err(libc::EINVAL);
    };
    nic.dereg_mr(*lkey).map_err(|_| libc::EBUSY)?;
    f.objs.remove(&c.mr_handle);
    Ok(())
}

/// `ALLOC_MW`: a window of type 1 or 2 and its rkey.
///
/// # Safety
/// As [`super::command`]'s calls.
pub(super) unsafe fn alloc_mw(nic: &Nic, f: &mut File, call: &mut Call<'_>) -> Result<(), c_int> {
    // SAFETY: the caller's contract.
    let (c, _) = unsafe { call.request::<ib_uverbs_alloc_mw>() };
    let pdn = f.pd(c.pd_handle)?;
    let kind = match c.mw_type {
        1 => MwType::One,
        2 => MwType::Two,
        _ => return Err(libc::EINVAL),
    };
    let rkey = nic.alloc_mw(pdn, kind).map_err(|_| libc::ENOMEM)?;
    let h = f.add(Obj::Mw(rkey));
    let resp = ib_uverbs_alloc_mw_resp {
        mw_handle: h,
        rkey,
        ..Default::default()
    };
    // SAFETY: the caller's contract.
    unsafe { call.respond::<_, ()>(&resp, None) }
}

/// `DEALLOC_MW`.
///
/// # Safety
/// As [`super::command`]'s calls.
pub(super) unsafe fn dealloc_mw(nic: &Nic, f: &mut File, call: &mut Call<'_>) -> Result<(), c_int> {
    // SAFETY: the caller's contract.
    let (c, _) = unsafe { call.request::<ib_uverbs_dealloc_mw>() };
    let Some(Obj::Mw(rkey)) = f.objs.get(&c.mw_handle) else {
        return Err(libc::EINVAL);
    };
    nic.dealloc_mw(*rkey).map_err(|_| libc::EBUSY)?;
    f.objs.remove(&c.mw_handle);
    Ok(())
}
