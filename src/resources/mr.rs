//! Memory regions.

#[cfg(feature = "sim")]
use super::device::Backend;
use super::device::PdKind;
use super::Pd;
use crate::error::{Error, Result};
use crate::{verbs, Access, Remote, Sge};

/// Copies in and out of bytes shared with the NIC and other threads.
mod shared_bytes {
    use core::sync::atomic::{AtomicU8, Ordering};

    /// Copies `out.len()` bytes from `src`, one relaxed atomic load each.
    ///
    /// # Safety
    /// `src .. src + out.len()` must be live memory.
    pub(super) unsafe fn copy_out(src: *const u8, out: &mut [u8]) {
        for (i, o) in out.iter_mut().enumerate() {
            // SAFETY: inside the caller's live range; AtomicU8 has u8's size and alignment,
            // and every access to these bytes from Rust is atomic (no data race).
            *o = unsafe { AtomicU8::from_ptr(src.add(i).cast_mut()) }.load(Ordering::Relaxed);
        }
    }

    /// Copies `data` to `dst`, one relaxed atomic store each.
    ///
    /// # Safety
    /// `dst .. dst + data.len()` must be live memory, not overlapping `data`.
    pub(super) unsafe fn copy_in(dst: *mut u8, data: &[u8]) {
        for (i, &b) in data.iter().enumerate() {
            // SAFETY: as in `copy_out`.
            unsafe { AtomicU8::from_ptr(dst.add(i)) }.store(b, Ordering::Relaxed);
        }
    }

    /// One byte, with acquire ordering.
    ///
    /// # Safety
    /// `p` must be live memory.
    pub(super) unsafe fn load_acquire(p: *const u8) -> u8 {
        // SAFETY: as in `copy_out`.
        unsafe { AtomicU8::from_ptr(p.cast_mut()) }.load(Ordering::Acquire)
    }
}

enum MrKind {
    #[cfg(feature = "sim")]
    Sim(SimReg),
    /// Held for its Drop: deregisters, then frees the memory.
    Verbs(verbs::objects::Mr),
}

/// A software-NIC registration (the NIC owns the memory and frees it when deregistered).
#[cfg(feature = "sim")]
struct SimReg {
    nic: mlx5::sim::Nic,
    lkey: u32,
}

#[cfg(feature = "sim")]
impl super::lifetime::Deregister for SimReg {
    fn deregister(&mut self) -> bool {
        // Busy while a window is bound to the region; anything else means it is gone.
        self.nic.dereg_mr(self.lkey) != Err(mlx5::sim::SimError::Busy)
    }
}

impl super::lifetime::Deregister for verbs::objects::Mr {
    fn deregister(&mut self) -> bool {
        verbs::objects::Mr::deregister(self)
    }
}

/// Registered memory: the NIC may read and write it under its keys.
///
/// The bytes are shared with the NIC, which writes them at any time, and with every thread
/// that holds the region (it is `Sync`). [`MemoryRegion::read`] and [`MemoryRegion::write`]
/// copy them one relaxed atomic byte access at a time, as the software NIC's DMA does, so
/// two threads writing, or a thread reading while the NIC writes, get some mix of old and
/// new bytes, never undefined behaviour. Order comes from completions: bytes the NIC wrote
/// for a request are all visible once its completion was polled (the poller's acquire of the
/// CQE pairs with the NIC's release), and bytes written before a post are what the NIC
/// reads. A real NIC's DMA is outside Rust's memory model; the same rules are what verbs
/// promises for it. Through [`MemoryRegion::as_ptr`] the same care as for any DMA buffer is
/// the caller's (never form a `&`/`&mut` to bytes the NIC may write).
pub struct MemoryRegion {
    /// `None` only while being dropped.
    kind: Option<MrKind>,
    addr: u64,
    len: u64,
    lkey: u32,
    rkey: u32,
    access: Access,
    pd: Pd,
}

impl core::fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("addr", &format_args!("{:#x}", self.addr))
            .field("len", &self.len)
            .field("lkey", &format_args!("{:#x}", self.lkey))
            .finish()
    }
}

impl MemoryRegion {
    pub(crate) fn alloc(pd: Pd, len: usize, access: Access) -> Result<MemoryRegion> {
        let (kind, addr, len, lkey, rkey) = match (&pd.inner.dev.backend, &pd.inner.kind) {
            #[cfg(feature = "sim")]
            (Backend::Sim(n), PdKind::Sim(p)) => {
                let i = n.alloc_mr(*p, len, access)?;
                (
                    MrKind::Sim(SimReg {
                        nic: n.clone(),
                        lkey: i.lkey,
                    }),
                    i.addr,
                    i.len,
                    i.lkey,
                    i.rkey,
                )
            }
            (_, PdKind::Verbs(p)) => {
                let mr = verbs::objects::Mr::alloc(p.clone(), len, access)?;
                let (a, l, lk, rk) = mr.info();
                (MrKind::Verbs(mr), a, l, lk, rk)
            }
            #[cfg(feature = "sim")]
            _ => return Err(Error::Unsupported("PD and device backends differ")),
        };
        pd.inner.regions.insert(crate::direct::scatter::Region {
            lkey,
            addr,
            len,
            writable: access.contains(Access::LOCAL_WRITE),
        });
        Ok(MemoryRegion {
            kind: Some(kind),
            addr,
            len,
            lkey,
            rkey,
            access,
            pd,
        })
    }

    /// The rdma-core region, on a verbs device.
    pub(crate) fn verbs_mr(&self) -> Option<*mut rdma_sys::ibv_mr> {
        match &self.kind {
            Some(MrKind::Verbs(mr)) => Some(mr.mr),
            _ => None,
        }
    }

    /// Start address.
    pub fn addr(&self) -> u64 {
        self.addr
    }
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len as usize
    }
    /// Whether the region is empty (never: regions have at least one byte).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Local key.
    pub fn lkey(&self) -> u32 {
        self.lkey
    }
    /// Remote key.
    pub fn rkey(&self) -> u32 {
        self.rkey
    }
    /// Access rights.
    pub fn access(&self) -> Access {
        self.access
    }
    /// The protection domain.
    pub fn pd(&self) -> &Pd {
        &self.pd
    }
    /// Raw pointer to the first byte.
    pub fn as_ptr(&self) -> *mut u8 {
        self.addr as *mut u8
    }

    fn check(&self, off: usize, len: usize) -> Result<()> {
        match off.checked_add(len) {
            Some(end) if end <= self.len() => Ok(()),
            _ => Err(Error::InvalidParameter {
                what: "region offset + length",
                value: (off as u64).saturating_add(len as u64),
            }),
        }
    }

    /// A gather/scatter entry for `len` bytes at offset `off`.
    ///
    /// # Errors
    /// [`Error::InvalidParameter`] when the range leaves the region.
    pub fn sge(&self, off: usize, len: u32) -> Result<Sge> {
        self.check(off, len as usize)?;
        Ok(Sge {
            addr: self.addr + off as u64,
            len,
            lkey: self.lkey,
        })
    }

    /// The whole region as a remote buffer descriptor (to offer to a peer).
    pub fn remote_buf(&self) -> crate::connect::RemoteBuf {
        crate::connect::RemoteBuf {
            addr: self.addr,
            rkey: self.rkey,
            len: self.len,
        }
    }

    /// The remote descriptor of offset `off` (what a peer needs to write or read here);
    /// `off == len()` is the end of the region (for zero-byte requests).
    ///
    /// # Errors
    /// [`Error::InvalidParameter`] when `off` is beyond the region.
    pub fn remote(&self, off: usize) -> Result<Remote> {
        self.check(off, 0)?;
        Ok(Remote {
            addr: self.addr + off as u64,
            rkey: self.rkey,
        })
    }

    /// Copies bytes out of the region, one relaxed atomic byte load each (see
    /// [`MemoryRegion`] on sharing the bytes with the NIC and other threads).
    ///
    /// # Errors
    /// [`Error::InvalidParameter`] when the range leaves the region.
    pub fn read(&self, off: usize, out: &mut [u8]) -> Result<()> {
        self.check(off, out.len())?;
        // SAFETY: the range is inside the registered region, which stays allocated while
        // `self` lives (and longer while the NIC may still use it: `lifetime.rs`).
        unsafe { shared_bytes::copy_out(self.as_ptr().add(off), out) };
        Ok(())
    }

    /// Copies bytes into the region, one relaxed atomic byte store each (see
    /// [`MemoryRegion`]).
    ///
    /// # Errors
    /// [`Error::InvalidParameter`] when the range leaves the region.
    pub fn write(&self, off: usize, data: &[u8]) -> Result<()> {
        self.check(off, data.len())?;
        // SAFETY: as for `read`; `data` is a Rust slice, so it cannot be these shared bytes
        // (no reference to them is ever formed).
        unsafe { shared_bytes::copy_in(self.as_ptr().add(off), data) };
        Ok(())
    }

    /// Reads one byte with an acquire load (for polling a flag the peer writes: what the
    /// region holds before the flag's write is visible after it, on the software NIC; on a
    /// real NIC only in the order the device's writes reach memory).
    ///
    /// # Errors
    /// [`Error::InvalidParameter`] when `off` is outside the region.
    #[inline]
    pub fn read_volatile_u8(&self, off: usize) -> Result<u8> {
        self.check(off, 1)?;
        // SAFETY: inside the region, as for `read`.
        Ok(unsafe { shared_bytes::load_acquire(self.as_ptr().add(off)) })
    }

    /// Reads a native-endian `u64` (e.g. an atomic's target or result).
    ///
    /// # Errors
    /// [`Error::InvalidParameter`] when the range leaves the region.
    pub fn read_u64(&self, off: usize) -> Result<u64> {
        let mut b = [0u8; 8];
        self.read(off, &mut b)?;
        Ok(u64::from_ne_bytes(b))
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        // Deregistered now, or once the work outstanding on its domain's QPs has completed.
        // Receives posted from now on may not name it (those posted before keep it
        // registered until they complete: below).
        self.pd.inner.regions.remove(self.lkey);
        if let Some(kind) = self.kind.take() {
            let reg: super::lifetime::Registration = match kind {
                #[cfg(feature = "sim")]
                MrKind::Sim(r) => Box::new(r),
                MrKind::Verbs(m) => Box::new(m),
            };
            self.pd.inner.lifetimes.release(reg);
        }
    }
}
