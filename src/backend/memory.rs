//! Protection domains, region registrations and memory windows of each backend.

use super::rdma;
#[cfg(feature = "sim")]
use super::sim;
use super::spec::MrInfo;
use crate::error::Result;
use crate::queue::lifetime::Deregister;
use mlx5::request::{Access, MwType};

/// A protection domain of a backend (freed on drop).
pub(crate) enum Pd {
    #[cfg(feature = "sim")]
    Sim(sim::Pd),
    Rdma(rdma::Pd),
}

/// A live registration of a region: deregistered by [`Deregister::deregister`] (the
/// device may refuse while a window is bound to it), or on drop.
pub(crate) enum Reg {
    #[cfg(feature = "sim")]
    Sim(sim::Reg),
    Rdma(rdma::Mr),
}

/// A memory window of a backend. Not freed on drop: its owner frees it with
/// [`Deregister::deregister`], at once or once the binds in flight have run.
pub(crate) enum Mw {
    #[cfg(feature = "sim")]
    Sim(sim::Mw),
    Rdma(rdma::Mw),
}

impl Pd {
    /// Allocates `len` zeroed page-aligned bytes and registers them with `access`.
    ///
    /// # Errors
    /// The device's refusal; out of memory as an error.
    pub(crate) fn alloc_mr(&self, len: usize, access: Access) -> Result<(Reg, MrInfo)> {
        match self {
            #[cfg(feature = "sim")]
            Pd::Sim(p) => p.alloc_mr(len, access).map(|(r, i)| (Reg::Sim(r), i)),
            Pd::Rdma(p) => p.alloc_mr(len, access).map(|(r, i)| (Reg::Rdma(r), i)),
        }
    }

    /// Registers `len` bytes at `ptr` with `access`.
    ///
    /// # Safety
    /// The bytes stay allocated at this address until the registration is gone.
    ///
    /// # Errors
    /// The device's refusal.
    pub(crate) unsafe fn register(
        &self,
        ptr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<(Reg, MrInfo)> {
        // SAFETY: the caller's contract.
        unsafe {
            match self {
                #[cfg(feature = "sim")]
                Pd::Sim(p) => p.register(ptr, len, access).map(|(r, i)| (Reg::Sim(r), i)),
                Pd::Rdma(p) => p.register(ptr, len, access).map(|(r, i)| (Reg::Rdma(r), i)),
            }
        }
    }

    /// Registers the whole address space on demand (implicit ODP).
    ///
    /// # Safety
    /// As [`Pd::register_implicit_odp`](crate::Pd::register_implicit_odp).
    ///
    /// # Errors
    /// [`crate::Capability::ImplicitOnDemandPaging`] where the backend has none; the
    /// registration error.
    pub(crate) unsafe fn register_implicit(&self, access: Access) -> Result<(Reg, MrInfo)> {
        match self {
            #[cfg(feature = "sim")]
            Pd::Sim(_) => Err(crate::error::Error::Capability(
                crate::error::Capability::ImplicitOnDemandPaging,
            )),
            // SAFETY: the caller's contract.
            Pd::Rdma(p) => unsafe { p.register_implicit(access) }.map(|(r, i)| (Reg::Rdma(r), i)),
        }
    }

    /// Registers `len` bytes at `offset` of the dma-buf `fd` at `iova`.
    ///
    /// # Errors
    /// [`crate::Capability::DmaBuf`] where the device has none; the registration error.
    pub(crate) fn register_dmabuf(
        &self,
        fd: std::os::fd::BorrowedFd<'_>,
        offset: u64,
        len: usize,
        iova: u64,
        access: Access,
    ) -> Result<(Reg, MrInfo)> {
        match self {
            #[cfg(feature = "sim")]
            Pd::Sim(p) => p
                .register_dmabuf(fd, offset, len, iova, access)
                .map(|(r, i)| (Reg::Sim(r), i)),
            Pd::Rdma(p) => p
                .register_dmabuf(fd, offset, len, iova, access)
                .map(|(r, i)| (Reg::Rdma(r), i)),
        }
    }

    /// Prefetches on-demand pages of the regions `sgl` names.
    ///
    /// # Errors
    /// As [`Pd::prefetch`](crate::Pd::prefetch).
    pub(crate) fn prefetch(
        &self,
        sgl: &[mlx5::request::Sge],
        write: bool,
        flush: bool,
    ) -> Result<()> {
        match self {
            #[cfg(feature = "sim")]
            Pd::Sim(p) => p.prefetch(sgl, write),
            Pd::Rdma(p) => p.prefetch(sgl, write, flush),
        }
    }

    /// Allocates a memory window of `mw_type`; returns it with its key.
    ///
    /// # Errors
    /// The device's refusal (`EOPNOTSUPP` without windows).
    pub(crate) fn alloc_mw(&self, mw_type: MwType) -> Result<(Mw, u32)> {
        match self {
            #[cfg(feature = "sim")]
            Pd::Sim(p) => p.alloc_mw(mw_type).map(|(w, k)| (Mw::Sim(w), k)),
            Pd::Rdma(p) => p.alloc_mw(mw_type).map(|(w, k)| (Mw::Rdma(w), k)),
        }
    }

    /// An address handle to `attr`: the mlx5 address vector the direct path copies into
    /// UD WQEs, and rdma-core's handle the verbs path sends with (None on the direct path).
    /// An address that names no port is refused here, on every backend
    /// ([`AhAttr::check_destination`](crate::address::AhAttr::check_destination)).
    ///
    /// # Errors
    /// As [`Pd::create_ah`](crate::Pd::create_ah).
    pub(crate) fn create_ah(
        &self,
        attr: &crate::address::AhAttr,
    ) -> Result<(mlx5::av::Av, Option<std::sync::Arc<crate::verbs::ud::Ah>>)> {
        match self {
            #[cfg(feature = "sim")]
            Pd::Sim(_) => {
                let av = sim::ib_av(attr)?;
                attr.check_destination(false)?; // one InfiniBand port
                Ok((av, None))
            }
            Pd::Rdma(p) => p.create_ah(attr),
        }
    }
}

impl Reg {
    /// The rdma-core region (the verbs path's binds name it).
    pub(crate) fn verbs_mr(&self) -> Option<*mut rdma_sys::ibv_mr> {
        match self {
            #[cfg(feature = "sim")]
            Reg::Sim(_) => None,
            Reg::Rdma(m) => Some(m.mr),
        }
    }
}

impl Deregister for Reg {
    fn deregister(&mut self) -> bool {
        match self {
            #[cfg(feature = "sim")]
            Reg::Sim(r) => r.deregister(),
            Reg::Rdma(m) => m.deregister(),
        }
    }
}

impl Mw {
    /// rdma-core's window (the verbs path's binds name it).
    pub(crate) fn verbs_mw(&self) -> Option<*mut rdma_sys::ibv_mw> {
        match self {
            #[cfg(feature = "sim")]
            Mw::Sim(_) => None,
            Mw::Rdma(w) => Some(w.0),
        }
    }
}

impl Deregister for Mw {
    /// Frees the window: false when the device refuses (rdma-core's `mlx5_dealloc_mw`
    /// keeps the window then, so it may be tried again).
    fn deregister(&mut self) -> bool {
        match self {
            #[cfg(feature = "sim")]
            Mw::Sim(w) => w.dealloc(),
            Mw::Rdma(w) => w.dealloc(),
        }
    }
}
