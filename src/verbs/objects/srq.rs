//! Shared receive queues over rdma-core: `ibv_create_srq`, `ibv_modify_srq` (the limit),
//! `ibv_destroy_srq`.

use super::pd::Pd;
use crate::verbs::{code, last, VerbsError};
use rdma_sys as ffi;
use std::sync::Arc;

/// An rdma-core SRQ.
pub struct Srq {
    pub(crate) srq: *mut ffi::ibv_srq,
    /// Receives the device gave room for (`max_wr` as written back).
    pub(crate) max_wr: u32,
    /// Scatter entries per receive (as written back).
    pub(crate) max_sge: u32,
    _pd: Arc<Pd>,
}

// SAFETY: verbs objects are thread-safe in rdma-core; posting is serialised by the owner
// of the poster (`&mut`).
unsafe impl Send for Srq {}
// SAFETY: as above.
unsafe impl Sync for Srq {}

impl Srq {
    /// `ibv_create_srq` on `pd` for `max_wr` receives of `max_sge` entries.
    ///
    /// # Errors
    /// The `ibv_create_srq` error (`EINVAL` beyond the device's `max_srq_wr` /
    /// `max_srq_sge`).
    pub fn new(pd: Arc<Pd>, max_wr: u32, max_sge: u32) -> Result<Srq, VerbsError> {
        // SAFETY: an all-zero init attr is valid (no context, no limit).
        let mut attr: ffi::ibv_srq_init_attr = unsafe { std::mem::zeroed() };
        attr.attr.max_wr = max_wr;
        attr.attr.max_sge = max_sge;
        // SAFETY: live PD; `attr` is a valid in/out parameter.
        let srq = unsafe { ffi::ibv_create_srq(pd.pd, &mut attr) };
        if srq.is_null() {
            return Err(last("ibv_create_srq"));
        }
        Ok(Srq {
            srq,
            max_wr: attr.attr.max_wr,
            max_sge: attr.attr.max_sge,
            _pd: pd,
        })
    }

    /// The receives the device's SRQ holds (`ibv_query_srq`'s `max_wr`: on mlx5 the kernel's
    /// `msrq.max - 1`, the whole ring the provider allocated, its wait queue included).
    ///
    /// # Errors
    /// The `ibv_query_srq` error.
    pub fn device_max_wr(&self) -> Result<u32, VerbsError> {
        let mut attr = ffi::ibv_srq_attr {
            max_wr: 0,
            max_sge: 0,
            srq_limit: 0,
        };
        // SAFETY: live SRQ; `attr` outlives the call.
        let rc = unsafe { ffi::ibv_query_srq(self.srq, &mut attr) };
        if rc != 0 {
            return Err(code("ibv_query_srq", rc));
        }
        Ok(attr.max_wr)
    }

    /// Arms the limit (`ibv_modify_srq` with `IBV_SRQ_LIMIT`; 0 disarms).
    ///
    /// # Errors
    /// The `ibv_modify_srq` error (`EINVAL` for a limit the device refuses).
    pub fn set_limit(&self, limit: u32) -> Result<(), VerbsError> {
        let mut attr = ffi::ibv_srq_attr {
            max_wr: 0,
            max_sge: 0,
            srq_limit: limit,
        };
        // SAFETY: live SRQ; `attr` outlives the call.
        let rc = unsafe {
            ffi::ibv_modify_srq(
                self.srq,
                &mut attr,
                ffi::ibv_srq_attr_mask::IBV_SRQ_LIMIT.0 as i32,
            )
        };
        if rc != 0 {
            return Err(code("ibv_modify_srq", rc));
        }
        Ok(())
    }
}

impl Drop for Srq {
    fn drop(&mut self) {
        // SAFETY: created in `new`; every QP on it holds an Arc of this SRQ, so none is left.
        unsafe { ffi::ibv_destroy_srq(self.srq) };
    }
}
