//! The protection domain (`ibv_alloc_pd`, `ibv_dealloc_pd`).

use crate::verbs::device::Context;
use crate::verbs::{last, VerbsError};
use rdma_sys as ffi;
use std::sync::Arc;

/// A protection domain.
pub struct Pd {
    pub(crate) pd: *mut ffi::ibv_pd,
    pub(crate) ctx: Arc<Context>,
}

// SAFETY: verbs objects are thread-safe in rdma-core; the wrapper only holds the pointer.
unsafe impl Send for Pd {}
// SAFETY: as above.
unsafe impl Sync for Pd {}

impl Pd {
    /// Allocates a protection domain.
    ///
    /// # Errors
    /// The `ibv_alloc_pd` error.
    pub fn new(ctx: Arc<Context>) -> Result<Pd, VerbsError> {
        // SAFETY: live context.
        let pd = unsafe { ffi::ibv_alloc_pd(ctx.ctx) };
        if pd.is_null() {
            return Err(last("ibv_alloc_pd"));
        }
        Ok(Pd { pd, ctx })
    }
}

impl Drop for Pd {
    fn drop(&mut self) {
        // SAFETY: allocated in `new`; regions and QPs hold an Arc of this PD, so none is left.
        unsafe { ffi::ibv_dealloc_pd(self.pd) };
    }
}
