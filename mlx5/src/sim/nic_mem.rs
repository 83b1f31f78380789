//! Memory registration on the software NIC: protection domains, memory regions and windows,
//! and on-demand prefetch.

use super::dma::DmaBuf;
use super::error::SimError;
use super::mem::{MemoryCaps, Mr, Mw};
use super::nic::{Nic, NicView};
use crate::request::{Access, MwType};

/// A registered memory region.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct MrInfo {
    /// Start address.
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// Local key.
    pub lkey: u32,
    /// Remote key (equal to the lkey on mlx5).
    pub rkey: u32,
}

impl Nic {
    /// A new protection domain.
    pub fn alloc_pd(&self) -> u32 {
        let mut st = self.st();
        // A freed number is handed out again (the firmware's PD numbers are a pool too): the
        // table holds as many entries as domains were ever live at once, not one per
        // domain ever made.
        if let Some(i) = st.mem.pds.iter().position(|live| !live) {
            st.mem.pds[i] = true;
            return i as u32;
        }
        st.mem.pds.push(true);
        st.mem.pds.len() as u32 - 1
    }

    /// Frees a protection domain.
    ///
    /// # Errors
    /// [`SimError::Busy`] while regions, windows, QPs or SRQs use it.
    pub fn dealloc_pd(&self, pd: u32) -> Result<(), SimError> {
        let mut st = self.st();
        Self::check_pd(&st, pd)?;
        if st.mem.mrs.values().any(|m| m.pd == pd)
            || st.mem.mws.values().any(|m| m.pd == pd)
            || st.qps.values().any(|q| q.pd == pd)
            || st.srqs.values().any(|s| s.pd == pd)
        {
            return Err(SimError::Busy);
        }
        st.mem.pds[pd as usize] = false;
        Ok(())
    }

    /// Allocates `len` zeroed, page-aligned bytes owned by the NIC and registers them.
    ///
    /// # Errors
    /// [`SimError::NoPd`], [`SimError::BadRegion`] for `len == 0`, [`SimError::Rights`],
    /// [`SimError::NoMemory`] when `len` bytes cannot be allocated, [`SimError::Exhausted`].
    pub fn alloc_mr(&self, pd: u32, len: usize, access: Access) -> Result<MrInfo, SimError> {
        if len == 0 {
            return Err(SimError::BadRegion);
        }
        if access.region_error().is_some() {
            return Err(SimError::Rights(access));
        }
        let buf = DmaBuf::try_new(len).ok_or(SimError::NoMemory(len as u64))?;
        let addr = buf.ptr() as u64;
        self.insert_mr(pd, addr, len as u64, access, Some(buf))
    }

    /// Registers memory the caller owns.
    ///
    /// # Safety
    /// `addr .. addr + len` must stay valid for reads and writes until the region is
    /// deregistered (or the NIC dropped): the NIC writes it from its own thread.
    ///
    /// # Errors
    /// [`SimError::NoPd`], [`SimError::BadRegion`] for a null address, zero length or a range
    /// past the end of the address space, [`SimError::Rights`], [`SimError::Exhausted`].
    pub unsafe fn reg_mr(
        &self,
        pd: u32,
        addr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<MrInfo, SimError> {
        if addr.is_null() || len == 0 || (addr as u64).checked_add(len as u64).is_none() {
            return Err(SimError::BadRegion);
        }
        if access.region_error().is_some() {
            return Err(SimError::Rights(access));
        }
        self.insert_mr(pd, addr as u64, len as u64, access, None)
    }

    /// A prefetch of on-demand pages (`ibv_advise_mr` with `IBV_ADVISE_MR_ADVICE_PREFETCH`,
    /// or `_PREFETCH_WRITE` when `write`): each entry must name an on-demand region of `pd`
    /// by its lkey, lie inside it, and for a write prefetch the region must allow local
    /// write (the kernel's `get_prefetchable_mr`). The NIC's memory is resident, so nothing
    /// more happens.
    ///
    /// # Errors
    /// [`SimError::NoPd`]; [`SimError::NoCapability`] without on-demand paging;
    /// [`SimError::Prefetch`] with the first refused lkey.
    pub fn advise_mr(
        &self,
        pd: u32,
        write: bool,
        sgl: &[crate::request::Sge],
    ) -> Result<(), SimError> {
        let st = self.st();
        Self::check_pd(&st, pd)?;
        if !st.memory_caps.odp {
            return Err(SimError::NoCapability("on-demand paging"));
        }
        for s in sgl {
            let ok = st
                .mem
                .mrs
                .get(&(s.lkey >> 8))
                .filter(|m| m.key == s.lkey && m.access.contains(Access::ON_DEMAND))
                .is_some_and(|_| {
                    st.mem
                        .local(pd, s.lkey, s.addr, s.len as u64, write)
                        .is_ok()
                });
            if !ok {
                return Err(SimError::Prefetch(s.lkey));
            }
        }
        Ok(())
    }

    fn insert_mr(
        &self,
        pd: u32,
        addr: u64,
        len: u64,
        access: Access,
        owned: Option<DmaBuf>,
    ) -> Result<MrInfo, SimError> {
        let mut st = self.st();
        Self::check_pd(&st, pd)?;
        if access.contains(Access::ON_DEMAND) && !st.memory_caps.odp {
            return Err(SimError::NoCapability("on-demand paging"));
        }
        let key = st.mem.alloc_key().ok_or(SimError::Exhausted("key index"))?;
        let mut mr = Mr::new(pd, addr, len, access, key);
        mr._owned = owned;
        st.mem.mrs.insert(key >> 8, mr);
        Ok(MrInfo {
            addr,
            len,
            lkey: key,
            rkey: key,
        })
    }

    /// Deregisters a region (freeing its memory when the NIC allocated it), as a ConnectX
    /// does even while a window is bound to it (the kernel's `mlx5_ib_dereg_mr` does not
    /// look for windows; rxe refuses): the window stays bound and reaches nothing (its
    /// accesses fail as the region's key does).
    ///
    /// # Errors
    /// [`SimError::NoMr`].
    pub fn dereg_mr(&self, lkey: u32) -> Result<(), SimError> {
        let mut st = self.st();
        match st.mem.mrs.get(&(lkey >> 8)) {
            Some(m) if m.key == lkey => {}
            _ => return Err(SimError::NoMr(lkey)),
        }
        if let Some(Mr {
            dmabuf: Some(x), ..
        }) = st.mem.mrs.remove(&(lkey >> 8))
        {
            st.mem.exports.release(x.handle);
        }
        st.mem.free_key(lkey);
        Ok(())
    }

    /// Allocates a memory window; returns its rkey.
    ///
    /// # Errors
    /// [`SimError::NoPd`].
    pub fn alloc_mw(&self, pd: u32, mw_type: MwType) -> Result<u32, SimError> {
        let mut st = self.st();
        Self::check_pd(&st, pd)?;
        let rkey = st.mem.alloc_key().ok_or(SimError::Exhausted("key index"))?;
        st.mem.mws.insert(
            rkey >> 8,
            Mw {
                pd,
                mw_type,
                rkey,
                bound: None,
            },
        );
        Ok(rkey)
    }

    /// Frees a memory window.
    ///
    /// # Errors
    /// [`SimError::NoMw`].
    pub fn dealloc_mw(&self, rkey: u32) -> Result<(), SimError> {
        let mut st = self.st();
        let w = st
            .mem
            .mws
            .remove(&(rkey >> 8))
            .ok_or(SimError::NoMw(rkey))?;
        st.mem.free_key(w.rkey);
        Ok(())
    }
}

impl NicView {
    /// What registration on this NIC can do.
    pub fn memory_caps(&self) -> MemoryCaps {
        self.st().memory_caps
    }

    /// Changes what registration can do (a NIC without on-demand paging, for the
    /// capability errors); registered regions stay as they are.
    pub fn set_memory_caps(&self, caps: MemoryCaps) {
        self.st().memory_caps = caps;
    }

    /// Protection domains allocated and not freed (for tests: that a driver frees its
    /// domains, and when).
    pub fn pds_live(&self) -> usize {
        self.st().mem.pds.iter().filter(|live| **live).count()
    }

    /// Whether a region of this key is registered (for tests: when a driver deregisters).
    pub fn mr_registered(&self, key: u32) -> bool {
        self.st()
            .mem
            .mrs
            .get(&(key >> 8))
            .is_some_and(|m| m.key == key)
    }

    /// The current rkey of a window and whether it is bound (for tests and the driver's
    /// bookkeeping).
    pub fn mw_state(&self, rkey_index: u32) -> Option<(u32, bool)> {
        self.st()
            .mem
            .mws
            .get(&(rkey_index >> 8))
            .map(|w| (w.rkey, w.bound.is_some()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Protection domain numbers come back once freed: the table does not grow by one entry
    /// per domain ever allocated (it did, and the numbers climbed past the hardware's 24
    /// bits in a long run; a review's finding).
    #[test]
    fn protection_domain_numbers_come_back() {
        let nic = Nic::new();
        let kept = nic.alloc_pd();
        for _ in 0..10_000 {
            let pd = nic.alloc_pd();
            assert_ne!(pd, kept);
            nic.dealloc_pd(pd).unwrap();
        }
        let pd = nic.alloc_pd();
        assert_eq!((kept, pd), (0, 1));
        assert_eq!(nic.st().mem.pds.len(), 2);
        // A number in use is never handed out twice.
        assert_eq!(nic.alloc_pd(), 2);
    }

    /// The kernel refuses to free a domain an SRQ uses (`uverbs_free_pd`:
    /// `ib_destroy_usecnt(&pd->usecnt)`, which `ib_create_srq_user` raised). The NIC freed
    /// it, and with numbers handed out again, a new domain got the stale number and a QP
    /// of that new domain took its receives from the old domain's SRQ (a review of the
    /// commit that reuses the numbers).
    #[test]
    fn a_domain_an_srq_uses_is_not_freed() {
        use crate::sim::{QpCaps, SrqCaps};
        let nic = Nic::new();
        let a = nic.alloc_pd();
        let srq = nic
            .create_srq(
                a,
                SrqCaps {
                    max_wr: 4,
                    max_sge: 1,
                },
            )
            .unwrap();
        let freed = nic.dealloc_pd(a);
        let b = nic.alloc_pd();
        let cq = nic.create_cq(8, 64).unwrap();
        let qp = nic
            .create_qp(
                b,
                cq.cqn,
                cq.cqn,
                QpCaps {
                    rq_entries: 0,
                    ..QpCaps::default()
                },
            )
            .unwrap();
        let attached = nic.attach_qp_srq(qp.qpn, srq.srqn);
        assert!(
            matches!(freed, Err(SimError::Busy)),
            "dealloc_pd of a domain with a live SRQ: {freed:?}; new domain {b} (old {a}); \
             a QP of the new domain attached to the old domain's SRQ: {attached:?}"
        );
    }
}
