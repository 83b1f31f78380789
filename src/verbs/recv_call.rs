//! `ibv_post_recv` with its target read once: the QP pointer and the provider's
//! `post_recv` operation are looked up when the receive queue is created, not on each post.
//!
//! verbs.h's `ibv_post_recv` is `qp->context->ops.post_recv(qp, wr, bad_wr)`: three
//! dependent loads and, through `rdma-sys`, an unwrap of the operation, on every receive.
//! The context's operations are set once when the device is opened (`verbs_set_ops`, with
//! rdma-core's stubs for what a provider leaves out) and never change, so the operation read
//! at creation is the one every later call would read.

use rdma_sys as ffi;
use std::os::raw::c_int;

/// A provider's `post_recv` operation.
type PostRecvFn = unsafe extern "C" fn(
    *mut ffi::ibv_qp,
    *mut ffi::ibv_recv_wr,
    *mut *mut ffi::ibv_recv_wr,
) -> c_int;

/// The operation of a context without one (rdma-core fills every operation, so never
/// expected): refuses the receive with `EOPNOTSUPP` instead of panicking in the unwrap
/// `rdma-sys`'s `ibv_post_recv` would do.
unsafe extern "C" fn unsupported(
    _: *mut ffi::ibv_qp,
    _: *mut ffi::ibv_recv_wr,
    _: *mut *mut ffi::ibv_recv_wr,
) -> c_int {
    // EOPNOTSUPP on Linux.
    95
}

/// `ibv_post_recv` on one QP, its operation resolved.
#[derive(Copy, Clone)]
pub(crate) struct PostRecv {
    qp: *mut ffi::ibv_qp,
    op: PostRecvFn,
}

impl PostRecv {
    /// The call for `qp`.
    ///
    /// # Safety
    /// `qp` must be a live QP; the result is used only while it lives.
    pub(crate) unsafe fn of(qp: *mut ffi::ibv_qp) -> PostRecv {
        // SAFETY: a live QP points to its live context, whose operations table the provider
        // filled when the device was opened.
        let op = unsafe { (*(*qp).context).ops.post_recv };
        PostRecv {
            qp,
            op: op.unwrap_or(unsupported),
        }
    }

    /// `ibv_post_recv(qp, wr, &bad)`: 0, or the provider's error number.
    ///
    /// # Safety
    /// The QP is live (see [`PostRecv::of`]); `wr` is a valid request list whose scatter
    /// lists are valid for the call.
    #[inline(always)]
    pub(crate) unsafe fn call(&self, wr: *mut ffi::ibv_recv_wr) -> c_int {
        let mut bad = std::ptr::null_mut();
        // SAFETY: the caller's contract; `bad` outlives the call.
        unsafe { (self.op)(self.qp, wr, &mut bad) }
    }
}
