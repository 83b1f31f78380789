//! Thread domains: a BlueFlame register of a QP's own (`ibv_alloc_td`, joined to a PD by
//! `ibv_alloc_parent_domain`), and the PD a QP is created on.

use super::pd::Pd;
use crate::verbs::ex::{alloc_parent_domain, alloc_td, dealloc_td};
use crate::verbs::{last, VerbsError};
use rdma_sys as ffi;
use std::sync::Arc;

/// A thread domain and the parent domain that joins it to a PD. A QP created on the parent
/// domain rings the thread domain's BlueFlame register, which rdma-core gives no other QP
/// (mlx5 `mlx5_alloc_td` -> `mlx5_attach_dedicated_uar`; `create_qp` takes `mtd->bf` for a
/// QP on a parent domain with a thread domain). UCX does the same per worker
/// (`uct_ib_mlx5_res_domain_init`).
///
/// Drop order: the QP first (it holds the parent domain), then the parent domain, then the
/// thread domain (rdma-core refuses to free a domain still referenced: `EBUSY`).
pub struct ThreadDomain {
    parent: *mut ffi::ibv_pd,
    td: *mut ffi::ibv_td,
    _pd: Arc<Pd>,
}

// SAFETY: as for Pd: the wrapper only holds the pointers; rdma-core's calls on them are
// thread-safe.
unsafe impl Send for ThreadDomain {}
// SAFETY: as above.
unsafe impl Sync for ThreadDomain {}

impl ThreadDomain {
    /// A thread domain on `pd`'s context and its parent domain over `pd`.
    ///
    /// # Errors
    /// The `ibv_alloc_td` error (`EOPNOTSUPP` on providers without thread domains, `ENOMEM`
    /// when the device has no register left) or the `ibv_alloc_parent_domain` error.
    pub fn new(pd: Arc<Pd>) -> Result<ThreadDomain, VerbsError> {
        let mut td_attr = ffi::ibv_td_init_attr { comp_mask: 0 };
        // SAFETY: live context; a valid init attribute (no optional fields).
        let td = unsafe { alloc_td(pd.ctx.ctx, &mut td_attr) };
        if td.is_null() {
            return Err(last("ibv_alloc_td"));
        }
        // SAFETY: a zeroed init attribute is valid (no allocators, no optional fields).
        let mut attr: ffi::ibv_parent_domain_init_attr = unsafe { std::mem::zeroed() };
        attr.pd = pd.pd;
        attr.td = td;
        // SAFETY: live context, PD and thread domain.
        let parent = unsafe { alloc_parent_domain(pd.ctx.ctx, &mut attr) };
        if parent.is_null() {
            let e = last("ibv_alloc_parent_domain");
            // SAFETY: allocated above, used by nothing.
            unsafe { dealloc_td(td) };
            return Err(e);
        }
        Ok(ThreadDomain {
            parent,
            td,
            _pd: pd,
        })
    }
}

impl Drop for ThreadDomain {
    fn drop(&mut self) {
        // SAFETY: allocated in `new`; the QP created on the parent domain is destroyed first
        // (it owns this value and drops it after `ibv_destroy_qp`).
        unsafe {
            ffi::ibv_dealloc_pd(self.parent);
            dealloc_td(self.td);
        }
    }
}

/// A thread domain for a new QP when `want`, or None when the device has none to give
/// (then the QP gets rdma-core's shared registers, as UCX falls back to the plain PD).
pub(crate) fn thread_domain(pd: &Arc<Pd>, want: bool) -> Option<ThreadDomain> {
    if want {
        ThreadDomain::new(pd.clone()).ok()
    } else {
        None
    }
}

/// The PD a QP is created on: the thread domain's parent domain, else the PD.
pub(crate) fn qp_pd(pd: &Pd, td: &Option<ThreadDomain>) -> *mut ffi::ibv_pd {
    td.as_ref().map_or(pd.pd, |t| t.parent)
}
