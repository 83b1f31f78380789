//! Memory regions: memory registered with `ibv_reg_mr` (allocated by the region, or the
//! caller's) or `ibv_reg_dmabuf_mr`, prefetched with `ibv_advise_mr`; deregistered before
//! the memory is freed.

use super::pd::Pd;
use crate::verbs::ex::advise_mr;
use crate::verbs::{code, last, VerbsError};
use mlx5::request::Access;
use rdma_sys as ffi;
use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::sync::Arc;

struct PageBuf {
    ptr: *mut u8,
    layout: Layout,
}

impl Drop for PageBuf {
    fn drop(&mut self) {
        // SAFETY: allocated with this layout in `Mr::alloc`, freed once, after deregistration.
        unsafe { dealloc(self.ptr, self.layout) }
    }
}

/// `IBV_ADVISE_MR_FLAG_FLUSH` (`verbs_api.h`: `IB_UVERBS_ADVISE_MR_FLAG_FLUSH`, `1 << 0`):
/// declared here because rdma-sys has no binding for it; the header test checks the value.
pub const IBV_ADVISE_MR_FLAG_FLUSH: u32 = 1;

/// A registered memory region.
pub struct Mr {
    pub(crate) mr: *mut ffi::ibv_mr,
    // Field order: the registration goes before the memory (see Drop), the PD last.
    buf: Option<PageBuf>,
    _pd: Arc<Pd>,
}

// SAFETY: as for Pd.
unsafe impl Send for Mr {}
// SAFETY: as for Pd.
unsafe impl Sync for Mr {}

fn ibv_access(a: Access) -> i32 {
    // blueflame's Access has the values of IBV_ACCESS_* (checked by the header tests).
    a.0 as i32
}

impl Mr {
    /// Allocates `len` zeroed page-aligned bytes and registers them.
    ///
    /// # Errors
    /// The `ibv_reg_mr` error.
    pub fn alloc(pd: Arc<Pd>, len: usize, access: Access) -> Result<Mr, VerbsError> {
        let layout = Layout::from_size_align(len.max(1), 4096).map_err(|_| VerbsError {
            call: "alloc",
            source: std::io::ErrorKind::InvalidInput.into(),
        })?;
        // SAFETY: non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        if ptr.is_null() {
            // The size comes from the user: an error, never an abort.
            return Err(VerbsError {
                call: "alloc",
                source: std::io::ErrorKind::OutOfMemory.into(),
            });
        }
        let buf = PageBuf { ptr, layout };
        // SAFETY: the buffer lives as long as the registration (freed after it in Drop).
        let mr = unsafe { ffi::ibv_reg_mr(pd.pd, ptr.cast(), len, ibv_access(access)) };
        if mr.is_null() {
            return Err(last("ibv_reg_mr"));
        }
        Ok(Mr {
            mr,
            buf: Some(buf),
            _pd: pd,
        })
    }

    /// Registers memory the caller owns.
    ///
    /// # Safety
    /// `addr .. addr + len` must stay valid until the region is dropped.
    ///
    /// # Errors
    /// The `ibv_reg_mr` error.
    pub unsafe fn register(
        pd: Arc<Pd>,
        addr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<Mr, VerbsError> {
        // SAFETY: the caller keeps the memory valid while registered.
        let mr = unsafe { ffi::ibv_reg_mr(pd.pd, addr.cast(), len, ibv_access(access)) };
        if mr.is_null() {
            return Err(last("ibv_reg_mr"));
        }
        Ok(Mr {
            mr,
            buf: None,
            _pd: pd,
        })
    }

    /// Registers `len` bytes at `offset` of the dma-buf `fd` at device address `iova`
    /// (`ibv_reg_dmabuf_mr`). The kernel takes its own reference to the dma-buf: `fd` may be
    /// closed afterwards. No CPU mapping comes with it.
    ///
    /// # Errors
    /// The `ibv_reg_dmabuf_mr` error (`EOPNOTSUPP` from providers without it).
    pub fn register_dmabuf(
        pd: Arc<Pd>,
        offset: u64,
        len: usize,
        iova: u64,
        fd: std::os::fd::BorrowedFd<'_>,
        access: Access,
    ) -> Result<Mr, VerbsError> {
        use std::os::fd::AsRawFd;
        // SAFETY: live PD; the device reaches only the exporter's memory through the fd.
        let mr = unsafe {
            ffi::ibv_reg_dmabuf_mr(pd.pd, offset, len, iova, fd.as_raw_fd(), ibv_access(access))
        };
        if mr.is_null() {
            return Err(last("ibv_reg_dmabuf_mr"));
        }
        Ok(Mr {
            mr,
            buf: None,
            _pd: pd,
        })
    }

    /// Prefetches on-demand pages of regions of `pd` (`ibv_advise_mr`,
    /// `IBV_ADVISE_MR_ADVICE_PREFETCH` or `_PREFETCH_WRITE`; `flush` waits for the pages,
    /// `IBV_ADVISE_MR_FLAG_FLUSH`).
    ///
    /// # Errors
    /// The `ibv_advise_mr` error (`EOPNOTSUPP` without the provider call).
    pub fn advise(
        pd: &Pd,
        write: bool,
        flush: bool,
        sgl: &[mlx5::request::Sge],
    ) -> Result<(), VerbsError> {
        use ffi::ib_uverbs_advise_mr_advice as adv;
        let mut list: Vec<ffi::ibv_sge> = sgl
            .iter()
            .map(|s| ffi::ibv_sge {
                addr: s.addr,
                length: s.len,
                lkey: s.lkey,
            })
            .collect();
        let advice = if write {
            adv::IB_UVERBS_ADVISE_MR_ADVICE_PREFETCH_WRITE
        } else {
            adv::IB_UVERBS_ADVISE_MR_ADVICE_PREFETCH
        };
        let flags = if flush { IBV_ADVISE_MR_FLAG_FLUSH } else { 0 };
        // SAFETY: live PD; `list` holds `list.len()` entries for the call's duration.
        let rc = unsafe { advise_mr(pd.pd, advice, flags, list.as_mut_ptr(), list.len() as u32) };
        if rc != 0 {
            return Err(code("ibv_advise_mr", rc));
        }
        Ok(())
    }

    /// (address, length, lkey, rkey).
    pub fn info(&self) -> (u64, u64, u32, u32) {
        // SAFETY: `mr` is live while self is.
        let m = unsafe { &*self.mr };
        (m.addr as u64, m.length as u64, m.lkey, m.rkey)
    }
}

impl Mr {
    /// Deregisters the region, then frees its memory. False when rdma-core refuses (rxe
    /// refuses while a memory window is bound to the region): the registration and the
    /// memory stay; call again later.
    pub fn deregister(&mut self) -> bool {
        if self.mr.is_null() {
            return true;
        }
        // SAFETY: registered in `alloc`/`register` and not deregistered yet (null after).
        if unsafe { ffi::ibv_dereg_mr(self.mr) } != 0 {
            return false;
        }
        self.mr = std::ptr::null_mut();
        self.buf.take();
        true
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        // Never free memory under a live registration: when the device still refuses to
        // deregister, the memory is leaked.
        if !self.deregister() {
            if let Some(b) = self.buf.take() {
                std::mem::forget(b);
            }
        }
    }
}
