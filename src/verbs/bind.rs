//! Memory-window binds and unbinds on the verbs path: a type-2 bind as a queued
//! `IBV_WR_BIND_MW`, a type-1 bind or unbind through `ibv_bind_mw`, the window's current key
//! set in its `ibv_mw` first (rdma-core reads it from there; rxe checks it against the
//! kernel's).

use super::path::VerbsSendQueue;
use crate::error::Result;
use crate::queue::flags::PostFlags;
use mlx5::request::{Access, MwType};
use rdma_sys as ffi;

/// One bind (or, with no region and length 0, a type-1 unbind) of a window.
pub(crate) struct WindowBind {
    /// rdma-core's window.
    pub(crate) mw: *mut ffi::ibv_mw,
    pub(crate) mw_type: MwType,
    /// The key the window has now.
    pub(crate) rkey: u32,
    /// The key a type-2 bind gives it (a type-1 bind takes rdma-core's).
    pub(crate) new_rkey: u32,
    /// rdma-core's region, None for an unbind.
    pub(crate) mr: Option<*mut ffi::ibv_mr>,
    pub(crate) addr: u64,
    pub(crate) len: u64,
    pub(crate) access: Access,
}

impl VerbsSendQueue {
    /// Posts `b`; returns the window's key after it.
    ///
    /// # Safety
    /// `b.mw` and `b.mr` must be live objects of this QP's protection domain until the
    /// request completes.
    ///
    /// # Errors
    /// As [`VerbsSendQueue::push_bind`], [`VerbsSendQueue::bind_type1`] and
    /// [`VerbsSendQueue::ring`].
    pub(crate) unsafe fn bind_window(
        &mut self,
        b: &WindowBind,
        cookie: u64,
        flags: PostFlags,
    ) -> Result<u32> {
        // SAFETY: `mw` is live (caller contract); nothing else reads it during the call.
        unsafe { (*b.mw).rkey = b.rkey };
        let access = b.access.0;
        match (b.mw_type, b.mr) {
            (MwType::Two, Some(mr)) => {
                // SAFETY: the caller's contract.
                unsafe {
                    self.push_bind(b.mw, mr, b.new_rkey, b.addr, b.len, access, cookie, flags)?
                };
                self.ring()?;
                Ok(b.new_rkey)
            }
            // SAFETY: the caller's contract.
            (_, Some(mr)) => unsafe {
                self.bind_type1(b.mw, mr, b.addr, b.len, access, cookie, flags)
            },
            (_, None) => {
                // A zero-length bind needs no region, but providers read the region struct
                // all the same (rxe's `convert_send_wr` reads `mr->lkey`, which the kernel
                // ignores for length 0; others compare `mr->pd`): a placeholder of the
                // window's domain, alive across the call.
                // SAFETY: `ibv_mr` is plain data; all-zero is a valid value.
                let mut none: ffi::ibv_mr = unsafe { core::mem::zeroed() };
                // SAFETY: `mw` is live.
                (none.context, none.pd) = unsafe { ((*b.mw).context, (*b.mw).pd) };
                // SAFETY: `mw` is live; `none` outlives the call, which posts a zero-length
                // bind that refers to no memory.
                unsafe { self.bind_type1(b.mw, &mut none, 0, 0, 0, cookie, flags) }
            }
        }
    }
}
