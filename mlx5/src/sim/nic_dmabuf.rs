//! The calls of a dma-buf exporter beside the software NIC and the registration of its
//! buffers (`ibv_reg_dmabuf_mr`); the model is described in `dmabuf.rs`.

use super::dma::DmaBuf;
use super::dmabuf::{Export, Exported, Exports};
use super::error::SimError;
use super::mem::Mr;
use super::nic::{Nic, NicView};
use super::nic_mem::MrInfo;
use crate::request::Access;

fn bad(handle: u64, why: &'static str) -> SimError {
    SimError::DmaBuf { handle, why }
}

impl Nic {
    /// A new export of `len` zeroed bytes under `handle` (its exporter's identity for the
    /// dma-buf file, e.g. the file's inode number).
    ///
    /// # Errors
    /// [`SimError::DmaBuf`] for `len == 0` or a handle in use; [`SimError::NoMemory`].
    pub fn dmabuf_export(&self, handle: u64, len: usize) -> Result<(), SimError> {
        if len == 0 {
            return Err(bad(handle, "zero length"));
        }
        let buf = DmaBuf::try_new(len).ok_or(SimError::NoMemory(len as u64))?;
        let mut st = self.st();
        if st.mem.exports.map.contains_key(&handle) {
            return Err(bad(handle, "handle in use"));
        }
        st.mem.exports.map.insert(
            handle,
            Export {
                buf,
                len,
                open: true,
                users: 0,
                moves: 0,
            },
        );
        Ok(())
    }

    /// The exporter lets go of `handle` (its file is closed): the export lives on while
    /// regions use it.
    pub fn dmabuf_close(&self, handle: u64) {
        let mut st = self.st();
        let map = &mut st.mem.exports.map;
        if let Some(e) = map.get_mut(&handle) {
            e.open = false;
            if e.users == 0 {
                map.remove(&handle);
            }
        }
    }

    /// The exporter moves the buffer (its bytes copied to a new place, the old one freed):
    /// every region on it is unmapped until the NIC's next access faults it in.
    ///
    /// # Errors
    /// [`SimError::DmaBuf`] for an unknown or closed handle; [`SimError::NoMemory`].
    pub fn dmabuf_move(&self, handle: u64) -> Result<(), SimError> {
        let mut st = self.st();
        let e = st
            .mem
            .exports
            .map
            .get_mut(&handle)
            .filter(|e| e.open)
            .ok_or(bad(handle, "no such export"))?;
        let fresh = DmaBuf::try_new(e.len).ok_or(SimError::NoMemory(e.len as u64))?;
        // SAFETY: both buffers hold `len` bytes and are distinct allocations; the NIC's own
        // accesses hold the state lock, held here.
        unsafe { core::ptr::copy_nonoverlapping(e.buf.ptr(), fresh.ptr(), e.len) };
        // The old allocation is freed here: a translation that survived the move would be a
        // use after free (valgrind and the sanitizer see it).
        e.buf = fresh;
        e.moves += 1;
        for m in st.mem.mrs.values_mut() {
            if m.dmabuf.is_some_and(|d| d.handle == handle) {
                m.unmapped = true;
            }
        }
        Ok(())
    }

    /// Moves the exporter has made of `handle`.
    pub fn dmabuf_moves(&self, handle: u64) -> Option<u64> {
        self.st().mem.exports.get(handle).map(|e| e.moves)
    }

    /// The exporter writes `data` at `offset` of its buffer (its own engine or CPU view).
    ///
    /// # Errors
    /// [`SimError::DmaBuf`] for an unknown handle or a range outside the buffer.
    pub fn dmabuf_write(&self, handle: u64, offset: usize, data: &[u8]) -> Result<(), SimError> {
        let st = self.st();
        let p = Self::dmabuf_range(&st.mem.exports, handle, offset, data.len())?;
        // SAFETY: the range lies inside the live export; the NIC's accesses hold the lock.
        unsafe { core::ptr::copy_nonoverlapping(data.as_ptr(), p, data.len()) };
        Ok(())
    }

    /// The exporter reads `out.len()` bytes at `offset` of its buffer.
    ///
    /// # Errors
    /// As [`Nic::dmabuf_write`].
    pub fn dmabuf_read(&self, handle: u64, offset: usize, out: &mut [u8]) -> Result<(), SimError> {
        let st = self.st();
        let p = Self::dmabuf_range(&st.mem.exports, handle, offset, out.len())?;
        // SAFETY: as in `dmabuf_write`.
        unsafe { core::ptr::copy_nonoverlapping(p, out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    fn dmabuf_range(
        exports: &Exports,
        handle: u64,
        offset: usize,
        len: usize,
    ) -> Result<*mut u8, SimError> {
        let e = exports.get(handle).ok_or(bad(handle, "no such export"))?;
        if offset.checked_add(len).map_or(true, |end| end > e.len) {
            return Err(bad(handle, "range outside the buffer"));
        }
        Ok(e.buf.ptr().wrapping_add(offset))
    }

    /// Registers `len` bytes at `offset` of export `handle` at device address `iova`
    /// (`ibv_reg_dmabuf_mr`): requests name addresses from `iova`.
    ///
    /// # Errors
    /// [`SimError::NoCapability`] without on-demand paging (the kernel registers dma-bufs
    /// through it); [`SimError::BadRegion`] for a zero length or `iova + len` past the end
    /// of the address space; [`SimError::DmaBuf`] for an unknown handle or a range outside
    /// the buffer; [`SimError::Rights`]; [`SimError::NoPd`]; [`SimError::Exhausted`].
    pub fn reg_dmabuf_mr(
        &self,
        pd: u32,
        handle: u64,
        offset: u64,
        len: u64,
        iova: u64,
        access: Access,
    ) -> Result<MrInfo, SimError> {
        if len == 0 || iova.checked_add(len).is_none() {
            return Err(SimError::BadRegion);
        }
        if access.region_error().is_some() {
            return Err(SimError::Rights(access));
        }
        let mut st = self.st();
        if !st.memory_caps.odp {
            return Err(SimError::NoCapability("dma-buf (on-demand paging)"));
        }
        Self::check_pd(&st, pd)?;
        let e = st
            .mem
            .exports
            .map
            .get_mut(&handle)
            .ok_or(bad(handle, "no such export"))?;
        if offset
            .checked_add(len)
            .map_or(true, |end| end > e.len as u64)
        {
            return Err(bad(handle, "range outside the buffer"));
        }
        let key = st.mem.alloc_key().ok_or(SimError::Exhausted("key index"))?;
        let e = st.mem.exports.map.get_mut(&handle).expect("checked above");
        e.users += 1;
        let mut mr = Mr::new(pd, iova, len, access, key);
        mr.dmabuf = Some(Exported { handle, offset });
        st.mem.mrs.insert(key >> 8, mr);
        Ok(MrInfo {
            addr: iova,
            len,
            lkey: key,
            rkey: key,
        })
    }
}

impl NicView {
    /// Unmaps an on-demand region (`Access::ON_DEMAND`) as the kernel's MMU notifier does
    /// when the pages move (`mlx5_ib_invalidate_range`): the NIC's next access faults them
    /// in. False for a key that names no on-demand region.
    pub fn invalidate_odp(&self, lkey: u32) -> bool {
        let mut st = self.st();
        match st.mem.mrs.get_mut(&(lkey >> 8)) {
            Some(m) if m.key == lkey && m.access.contains(Access::ON_DEMAND) => {
                m.unmapped = true;
                true
            }
            _ => false,
        }
    }
}
