//! Memory windows: remote access to a sub-range of a region, with their own rkey and rights,
//! re-bound (new rkey) or invalidated without re-registering memory (uDAPL `dat_rmr_bind`).

use super::device::{Backend, PdKind};
use super::Pd;
use crate::error::{Error, Result};
use crate::{Access, MwType};
use rdma_sys as ffi;

pub(crate) enum MwKind {
    Sim,
    Verbs(*mut ffi::ibv_mw),
}

/// A memory window. Its rkey changes with every bind ([`MemoryWindow::rkey`] is the current
/// one); an unbound or invalidated window grants nothing.
pub struct MemoryWindow {
    pub(crate) kind: MwKind,
    pub(crate) rkey: u32,
    pub(crate) mw_type: MwType,
    pub(crate) pd: Pd,
}

// SAFETY: the verbs pointer is only used by the owner (`&mut` for binds) and freed in Drop;
// rdma-core windows are thread-safe.
unsafe impl Send for MemoryWindow {}

impl core::fmt::Debug for MemoryWindow {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("MemoryWindow")
            .field("rkey", &format_args!("{:#x}", self.rkey))
            .field("type", &self.mw_type)
            .finish()
    }
}

impl Pd {
    /// Allocates a memory window of `mw_type`.
    ///
    /// # Errors
    /// [`Error::Verbs`] (`EOPNOTSUPP` when the device has no windows).
    pub fn alloc_mw(&self, mw_type: MwType) -> Result<MemoryWindow> {
        let (kind, rkey) = match (&self.inner.dev.backend, &self.inner.kind) {
            (Backend::Sim(n), PdKind::Sim(pd)) => (MwKind::Sim, n.alloc_mw(*pd, mw_type)?),
            (_, PdKind::Verbs(pd)) => {
                let t = match mw_type {
                    MwType::One => ffi::ibv_mw_type::IBV_MW_TYPE_1,
                    MwType::Two => ffi::ibv_mw_type::IBV_MW_TYPE_2,
                };
                // SAFETY: live PD; the returned window is freed in Drop.
                let mw = unsafe { ffi::ibv_alloc_mw(pd.pd, t) };
                let mw = match mw {
                    Some(p) if !p.is_null() => p,
                    _ => return Err(crate::verbs::last("ibv_alloc_mw").into()),
                };
                // SAFETY: just allocated.
                (MwKind::Verbs(mw), unsafe { (*mw).rkey })
            }
            _ => return Err(Error::Unsupported("PD and device backends differ")),
        };
        Ok(MemoryWindow {
            kind,
            rkey,
            mw_type,
            pd: self.clone(),
        })
    }
}

impl MemoryWindow {
    /// The current rkey (what a peer uses after the last bind).
    pub fn rkey(&self) -> u32 {
        self.rkey
    }
    /// The window type.
    pub fn mw_type(&self) -> MwType {
        self.mw_type
    }
}

impl Drop for MemoryWindow {
    fn drop(&mut self) {
        match (&self.kind, &self.pd.inner.dev.backend) {
            (MwKind::Sim, Backend::Sim(n)) => {
                let _ = n.dealloc_mw(self.rkey);
            }
            (MwKind::Verbs(mw), _) => {
                // SAFETY: allocated in alloc_mw, freed once.
                unsafe { ffi::ibv_dealloc_mw(*mw) };
            }
            _ => {}
        }
    }
}

/// The rights a window may grant.
pub(crate) const WINDOW_RIGHTS: Access = Access(
    Access::REMOTE_READ.0 | Access::REMOTE_WRITE.0 | Access::REMOTE_ATOMIC.0 | Access::ZERO_BASED.0,
);

/// Refuses a zero-based type-1 bind, or a type-1 bind to a zero-based region, as rdma-core's
/// `mlx5_bind_mw` does (EINVAL) before anything is posted.
pub(crate) fn check_type1(mw_type: MwType, region: Access, rights: Access) -> Result<()> {
    if mw_type == MwType::One
        && (rights.contains(Access::ZERO_BASED) || region.contains(Access::ZERO_BASED))
    {
        return Err(Error::InvalidParameter {
            what: "ZERO_BASED with a type-1 memory window (window rights | region rights)",
            value: (rights.0 | region.0) as u64,
        });
    }
    Ok(())
}

/// Checks a bind request before anything is posted: the rights a window may have, the
/// region's bind right and rights, and the range.
pub(crate) fn check_bind(
    region: Access,
    region_len: u64,
    rights: Access,
    off: u64,
    len: u64,
) -> Result<()> {
    if rights.0 & !WINDOW_RIGHTS.0 != 0 {
        return Err(Error::InvalidParameter {
            what: "window rights (remote read/write/atomic, zero-based)",
            value: rights.0 as u64,
        });
    }
    let remote = Access(rights.0 & !Access::ZERO_BASED.0);
    let needs_local_write =
        remote.contains(Access::REMOTE_WRITE) || remote.contains(Access::REMOTE_ATOMIC);
    let allowed = Access(
        region.0 & (Access::REMOTE_READ.0 | Access::REMOTE_WRITE.0 | Access::REMOTE_ATOMIC.0),
    );
    if !region.contains(Access::MW_BIND)
        || !allowed.contains(remote)
        || (needs_local_write && !region.contains(Access::LOCAL_WRITE))
    {
        return Err(Error::Privileges {
            requested: rights,
            allowed: Access(region.0 & (WINDOW_RIGHTS.0 | Access::MW_BIND.0)),
        });
    }
    match off.checked_add(len) {
        Some(end) if end <= region_len => {}
        _ => {
            return Err(Error::InvalidParameter {
                what: "window range (offset + length) in the region",
                value: off.saturating_add(len),
            })
        }
    }
    if len > mlx5::umr::MAX_KLM_BYTES {
        return Err(Error::BindTooLong { len });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const REGION: Access = Access(
        Access::LOCAL_WRITE.0 | Access::REMOTE_READ.0 | Access::REMOTE_WRITE.0 | Access::MW_BIND.0,
    );

    #[test]
    fn rights_must_be_a_subset_of_the_region() {
        assert!(check_bind(
            REGION,
            4096,
            Access::REMOTE_READ | Access::REMOTE_WRITE,
            0,
            4096
        )
        .is_ok());
        assert!(matches!(
            check_bind(REGION, 4096, Access::REMOTE_ATOMIC, 0, 8),
            Err(Error::Privileges { .. })
        ));
        let no_bind = Access(REGION.0 & !Access::MW_BIND.0);
        assert!(matches!(
            check_bind(no_bind, 4096, Access::REMOTE_READ, 0, 8),
            Err(Error::Privileges { .. })
        ));
        let no_lw = Access(Access::REMOTE_WRITE.0 | Access::MW_BIND.0);
        assert!(matches!(
            check_bind(no_lw, 4096, Access::REMOTE_WRITE, 0, 8),
            Err(Error::Privileges { .. })
        ));
        assert!(matches!(
            check_bind(REGION, 4096, Access::LOCAL_WRITE, 0, 8),
            Err(Error::InvalidParameter { .. })
        ));
    }

    #[test]
    fn range_and_size() {
        assert!(check_bind(REGION, 4096, Access::REMOTE_READ, 4000, 96).is_ok());
        assert!(matches!(
            check_bind(REGION, 4096, Access::REMOTE_READ, 4000, 97),
            Err(Error::InvalidParameter { value: 4097, .. })
        ));
        assert!(matches!(
            check_bind(REGION, u64::MAX, Access::REMOTE_READ, 0, (1 << 31) + 1),
            Err(Error::BindTooLong { .. })
        ));
        assert!(
            check_bind(REGION, 4096, Access::REMOTE_READ, 0, 0).is_ok(),
            "zero length unbinds"
        );
    }
}
