//! `ibv_post_recv` and `ibv_poll_cq` with their target read once: the object's pointer and
//! the provider's operation are looked up when the queue or poller is created, not on each
//! call.
//!
//! verbs.h's `ibv_post_recv` is `qp->context->ops.post_recv(qp, wr, bad_wr)` (and
//! `ibv_poll_cq` `cq->context->ops.poll_cq(cq, n, wc)`): dependent loads and, through
//! `rdma-sys`, an unwrap of the operation, on every call. The context's operations are set
//! once when the device is opened (`verbs_set_ops`, with rdma-core's stubs for what a
//! provider leaves out) and never change, so the operation read at creation is the one every
//! later call would read.

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
pub(crate) struct PostRecv {
    qp: *mut ffi::ibv_qp,
    op: PostRecvFn,
    /// Where the provider writes the request it refused (`bad_wr`), never read: kept here
    /// so that a call does not clear a word on its stack first.
    bad: *mut ffi::ibv_recv_wr,
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
            bad: std::ptr::null_mut(),
        }
    }

    /// `ibv_post_recv(qp, wr, &bad)`: 0, or the provider's error number.
    ///
    /// # Safety
    /// The QP is live (see [`PostRecv::of`]); `wr` is a valid request list whose scatter
    /// lists are valid for the call.
    #[inline(always)]
    pub(crate) unsafe fn call(&mut self, wr: *mut ffi::ibv_recv_wr) -> c_int {
        // SAFETY: the caller's contract; `bad` outlives the call.
        unsafe { (self.op)(self.qp, wr, &mut self.bad) }
    }
}

/// A provider's `poll_cq` operation.
type PollCqFn = unsafe extern "C" fn(*mut ffi::ibv_cq, c_int, *mut ffi::ibv_wc) -> c_int;

/// The operation of a context without one (never expected, as for [`unsupported`]): a
/// failed poll (negative, as `ibv_poll_cq`'s errors).
unsafe extern "C" fn no_poll_cq(_: *mut ffi::ibv_cq, _: c_int, _: *mut ffi::ibv_wc) -> c_int {
    -95
}

/// `ibv_poll_cq` on one CQ, its operation resolved.
#[derive(Copy, Clone)]
pub(crate) struct PollCq {
    cq: *mut ffi::ibv_cq,
    op: PollCqFn,
}

impl PollCq {
    /// The call for `cq`.
    ///
    /// # Safety
    /// `cq` must be a live CQ; the result is used only while it lives.
    pub(crate) unsafe fn of(cq: *mut ffi::ibv_cq) -> PollCq {
        // SAFETY: a live CQ points to its live context (see `PostRecv::of`).
        let op = unsafe { (*(*cq).context).ops.poll_cq };
        PollCq {
            cq,
            op: op.unwrap_or(no_poll_cq),
        }
    }

    /// `ibv_poll_cq(cq, n, wc)`: the completions written, or a negative error.
    ///
    /// # Safety
    /// The CQ is live (see [`PollCq::of`]) and polled by this caller only; `wc` has room for
    /// `n` entries.
    #[inline(always)]
    pub(crate) unsafe fn call(&self, n: c_int, wc: *mut ffi::ibv_wc) -> c_int {
        // SAFETY: the caller's contract.
        unsafe { (self.op)(self.cq, n, wc) }
    }
}
