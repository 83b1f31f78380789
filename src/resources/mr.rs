//! Memory regions.

use super::buffer::{Owned, RegionBuffer};
use super::pending::{PendingBuffer, Slot, WithBuffer};
use super::Pd;
use crate::backend::{MrInfo, Reg};
use crate::error::{Error, Refused, Result};
use crate::queue::pin::Pins;
use crate::queue::regions::Region;
use core::sync::atomic::Ordering;
use mlx5::request::Access;
use mlx5::request::Remote;
use mlx5::request::Sge;
use std::sync::Arc;

/// Registered memory: the NIC may read and write it under its keys.
///
/// The bytes are shared with the NIC, which writes them at any time, and with every thread
/// that holds the region (it is `Sync`). [`MemoryRegion::read`] and [`MemoryRegion::write`]
/// copy them with relaxed atomics, 8 bytes at a time over the region's whole aligned words
/// and one byte at a time over its unaligned edges, the same sizes the software NIC's DMA
/// and the poller use for these bytes ([`mlx5::shared`]), so two threads writing, or a
/// thread reading while the NIC writes, get some mix of old and new bytes (whole 8-byte
/// words at worst torn between two copies), never undefined behaviour. Order comes from completions: bytes the NIC wrote
/// for a request are all visible once its completion was polled (the poller's acquire of the
/// CQE pairs with the NIC's release), and bytes written before a post are what the NIC
/// reads. A real NIC's DMA is outside Rust's memory model; the same rules are what verbs
/// promises for it. Through [`MemoryRegion::as_ptr`] the same care as for any DMA buffer is
/// the caller's (never form a `&`/`&mut` to bytes the NIC may write).
///
/// ```
/// # #[cfg(feature = "sim")] fn main() -> blueflame::Result<()> {
/// use blueflame::{Access, Device, Error, PostSend};
/// let pd = Device::sim_stepped().alloc_pd()?;
/// let mr = pd.alloc_mr(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE)?;
/// mr.write(100, b"hello")?;
/// let mut b = [0u8; 5];
/// mr.read(100, &mut b)?;
/// assert_eq!(&b, b"hello");
/// let local = mr.sge(100, 5)?;          // a gather/scatter entry (address, length, lkey)
/// let remote = mr.remote(0)?;           // what a peer writes to (address, rkey)
/// assert_eq!((local.lkey, remote.rkey), (mr.lkey(), mr.rkey()));
/// // Out of bounds is an error, never a panic.
/// assert!(matches!(mr.sge(4000, 200), Err(Error::InvalidParameter { .. })));
/// # Ok(()) }
/// # #[cfg(not(feature = "sim"))] fn main() {}
/// ```
pub struct MemoryRegion {
    /// The backend's registration (`None` only once parked).
    kind: Option<Reg>,
    addr: u64,
    len: u64,
    lkey: u32,
    rkey: u32,
    access: Access,
    /// What the CPU copies may do with the bytes.
    cpu: Cpu,
    /// The user's buffer, when the region was made from one (given back or dropped only
    /// after the registration is gone).
    owned: Option<Owned>,
    /// How many posted receives may still write the region (`crate::queue::pin`):
    /// closed when the region is dropped, deregistered once none is left.
    pins: Arc<Pins>,
    pd: Pd,
}

/// What [`MemoryRegion::read`] / [`MemoryRegion::write`] may do.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Cpu {
    ReadWrite,
    /// Read-only memory (`&'static [u8]`, a read-only file mapping).
    ReadOnly,
    /// No CPU mapping at the region's addresses (dma-buf, implicit on-demand paging).
    Unmapped,
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

/// What the domain's region list keeps of a registration: its range and key, whether the
/// device may write it, whether the poller may (scatter-to-CQE copies, with the CPU), and
/// whether the device may meet a page fault in it. That last is true of every region with
/// [`Access::ON_DEMAND`] and of every dma-buf region: the kernel registers those through
/// its on-demand paging machinery (`ib_umem_dmabuf_get`, `mlx5_ib_reg_user_mr_dmabuf`), so
/// after the exporter moves the buffer the device faults on it as on an ODP page, and a
/// faulted SRQ WQE completes with REMOTE_ABORTED (vendor syndrome 0x93) for the driver to
/// post again (rdma-core `cq.c` `is_odp_pfault_err`, `srq.c` `mlx5_complete_odp_fault`).
fn record(lkey: u32, addr: u64, len: u64, access: Access, cpu: Cpu) -> Region {
    Region {
        local_write: access.contains(Access::LOCAL_WRITE),
        // The poller writes receive buffers with the CPU (scatter-to-CQE).
        cpu_writable: access.contains(Access::LOCAL_WRITE) && cpu == Cpu::ReadWrite,
        on_demand: access.contains(Access::ON_DEMAND) || cpu == Cpu::Unmapped,
        ..Region::new(lkey, addr, len)
    }
}

impl MemoryRegion {
    pub(crate) fn alloc(pd: Pd, len: usize, access: Access) -> Result<MemoryRegion> {
        let made = pd.inner.pd.alloc_mr(len, access)?;
        Ok(MemoryRegion::made(pd, made, access, Cpu::ReadWrite, None))
    }

    /// A live registration becomes a region: listed in its domain from now until drop.
    fn made(
        pd: Pd,
        (kind, (addr, len, lkey, rkey)): (Reg, MrInfo),
        access: Access,
        cpu: Cpu,
        owned: Option<Owned>,
    ) -> MemoryRegion {
        let region = record(lkey, addr, len, access, cpu);
        let pins = region.pins.clone();
        pd.inner.regions.insert(region);
        MemoryRegion {
            kind: Some(kind),
            addr,
            len,
            lkey,
            rkey,
            access,
            cpu,
            owned,
            pins,
            pd,
        }
    }

    /// Registers the bytes of a user's buffer (checked by `Pd::register`).
    pub(crate) fn register<B: RegionBuffer>(
        pd: Pd,
        buf: B,
        access: Access,
    ) -> core::result::Result<MemoryRegion, Refused<B>> {
        let owned = Owned::new(buf);
        let refuse = |owned: Owned, error: Error| Refused {
            // SAFETY: never registered. The type is B: `into` cannot fail.
            value: match unsafe { owned.into::<B>() } {
                Ok(b) => b,
                Err(_) => unreachable!("an Owned made from B is a B"),
            },
            error,
        };
        let p = owned.parts();
        let (ptr, len, writable) = (p.ptr.as_ptr(), p.len, p.writable);
        if let Err(e) = pd.check_registration(len, access, writable) {
            return Err(refuse(owned, e));
        }
        // SAFETY: the bytes stay allocated at this address until `from_raw`, which runs
        // only after the registration is gone (`Owned`, `WithBuffer`).
        let made = unsafe { pd.inner.pd.register(ptr, len, access) };
        match made {
            Ok(m) => {
                let cpu = if writable {
                    Cpu::ReadWrite
                } else {
                    Cpu::ReadOnly
                };
                Ok(MemoryRegion::made(pd, m, access, cpu, Some(owned)))
            }
            Err(e) => Err(refuse(owned, e)),
        }
    }

    /// Implicit on-demand registration of the whole address space (checked by the caller).
    ///
    /// # Safety
    /// As [`Pd::register_implicit_odp`].
    pub(crate) unsafe fn register_implicit(pd: Pd, access: Access) -> Result<MemoryRegion> {
        // SAFETY: the caller's contract.
        let made = unsafe { pd.inner.pd.register_implicit(access) }?;
        Ok(MemoryRegion::made(pd, made, access, Cpu::Unmapped, None))
    }

    /// A dma-buf registration (checked by the caller).
    pub(crate) fn register_dmabuf(
        pd: Pd,
        fd: std::os::fd::BorrowedFd<'_>,
        offset: u64,
        len: usize,
        iova: u64,
        access: Access,
    ) -> Result<MemoryRegion> {
        let made = pd.inner.pd.register_dmabuf(fd, offset, len, iova, access)?;
        Ok(MemoryRegion::made(pd, made, access, Cpu::Unmapped, None))
    }

    /// The rdma-core region, on a verbs device.
    pub(crate) fn verbs_mr(&self) -> Option<*mut rdma_sys::ibv_mr> {
        self.kind.as_ref().and_then(Reg::verbs_mr)
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

    /// The whole 8-byte words of the region: accessed as 8-byte atomics by every party.
    #[inline]
    fn words(&self) -> mlx5::shared::Words {
        mlx5::shared::Words::of(self.addr, self.len)
    }

    fn cpu_reads(&self) -> Result<()> {
        match self.cpu {
            Cpu::Unmapped => Err(Error::NoCpuMapping),
            _ => Ok(()),
        }
    }

    /// Whether the region holds a buffer of type `B` (made by
    /// [`Pd::register`](super::Pd::register) from one).
    pub(crate) fn holds<B: RegionBuffer>(&self) -> bool {
        self.owned.as_ref().is_some_and(|o| o.is::<B>())
    }

    /// Turns the region back into its buffer: from now on no request may name it (as after
    /// a drop), and the buffer comes back through [`PendingBuffer::try_take`] once every
    /// request posted before on the protection domain's QPs has completed and the device
    /// has deregistered it (a bound memory window keeps it registered until it is unbound
    /// or dropped).
    ///
    /// ```
    /// # #[cfg(feature = "sim")] fn main() {
    /// use blueflame::{Access, Device, PostSend};
    /// let dev = Device::sim_stepped();
    /// let pd = dev.alloc_pd().unwrap();
    /// let mr = pd.register(vec![7u8; 4096], Access::LOCAL_WRITE).unwrap();
    /// mr.write(0, b"hello").unwrap();
    /// let mut pending = mr.into_buffer::<Vec<u8>>().unwrap();
    /// let buf = pending.try_take().expect("nothing was in flight");
    /// assert_eq!(&buf[..6], b"hello\x07");
    /// # }
    /// # #[cfg(not(feature = "sim"))] fn main() {}
    /// ```
    ///
    /// # Errors
    /// [`Error::BufferType`] (with the region back, untouched) when the region does not
    /// hold a `B`: it was allocated by [`Pd::alloc_mr`](super::Pd::alloc_mr) or registered
    /// from another type.
    // A cold call that hands the whole region back on error: its size is no cost.
    #[allow(clippy::result_large_err)]
    pub fn into_buffer<B: RegionBuffer>(
        mut self,
    ) -> core::result::Result<PendingBuffer<B>, Refused<MemoryRegion>> {
        if !self.holds::<B>() {
            let holds = self
                .owned
                .as_ref()
                .map_or("memory of Pd::alloc_mr", |o| o.type_name());
            return Err(Refused {
                value: self,
                error: Error::BufferType {
                    wanted: core::any::type_name::<B>(),
                    holds,
                },
            });
        }
        let slot = Slot::default();
        self.park(Some(slot.clone()));
        Ok(PendingBuffer::new(slot, self.pd.clone()))
    }

    /// Prefetches the pages of `len` bytes at offset `off` of an on-demand region
    /// (`ibv_advise_mr`, `IBV_ADVISE_MR_ADVICE_PREFETCH`, or `_PREFETCH_WRITE` when
    /// `write`), waiting for them (`IBV_ADVISE_MR_FLAG_FLUSH`) when `flush`. See
    /// [`Pd::prefetch`](super::Pd::prefetch).
    ///
    /// # Errors
    /// [`Error::InvalidParameter`] when the range leaves the region or `len` is 0; as
    /// [`Pd::prefetch`](super::Pd::prefetch).
    pub fn prefetch(&self, off: usize, len: u32, write: bool, flush: bool) -> Result<()> {
        if len == 0 {
            return Err(Error::InvalidParameter {
                what: "prefetch length",
                value: 0,
            });
        }
        let sge = self.sge(off, len)?;
        self.pd.prefetch(&[sge], write, flush)
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

    /// Copies bytes out of the region with relaxed atomic loads, 8 bytes at a time (see
    /// [`MemoryRegion`] on sharing the bytes with the NIC and other threads).
    ///
    /// # Errors
    /// [`Error::InvalidParameter`] when the range leaves the region;
    /// [`Error::NoCpuMapping`] for a dma-buf or implicit on-demand region.
    pub fn read(&self, off: usize, out: &mut [u8]) -> Result<()> {
        self.check(off, out.len())?;
        self.cpu_reads()?;
        // SAFETY: the range is inside the registered region, which stays allocated while
        // `self` lives (and longer while the NIC may still use it: `lifetime.rs`); the words
        // are this region's.
        unsafe { mlx5::shared::copy_out(self.words(), self.as_ptr().add(off), out) };
        Ok(())
    }

    /// Copies bytes into the region with relaxed atomic stores, 8 bytes at a time (a part of
    /// a word by compare-and-swap; see [`MemoryRegion`]).
    ///
    /// # Errors
    /// [`Error::InvalidParameter`] when the range leaves the region;
    /// [`Error::ReadOnlyBuffer`] for read-only memory; [`Error::NoCpuMapping`] for a dma-buf
    /// or implicit on-demand region.
    pub fn write(&self, off: usize, data: &[u8]) -> Result<()> {
        self.check(off, data.len())?;
        match self.cpu {
            Cpu::ReadWrite => {}
            Cpu::ReadOnly => {
                return Err(Error::ReadOnlyBuffer {
                    access: self.access,
                })
            }
            Cpu::Unmapped => return Err(Error::NoCpuMapping),
        }
        // SAFETY: as for `read`; `data` is a Rust slice, so it cannot be these shared bytes
        // (no reference to them is ever formed).
        unsafe { mlx5::shared::copy_in(self.words(), self.as_ptr().add(off), data) };
        Ok(())
    }

    /// Reads one byte with an acquire load (for polling a flag the peer writes: what the
    /// region holds before the flag's write is visible after it, on the software NIC; on a
    /// real NIC only in the order the device's writes reach memory).
    ///
    /// # Errors
    /// [`Error::InvalidParameter`] when `off` is outside the region;
    /// [`Error::NoCpuMapping`] for a dma-buf or implicit on-demand region.
    #[inline]
    pub fn read_volatile_u8(&self, off: usize) -> Result<u8> {
        self.check(off, 1)?;
        self.cpu_reads()?;
        // SAFETY: inside the region, as for `read`.
        Ok(unsafe {
            mlx5::shared::load_u8(self.words(), self.as_ptr().add(off), Ordering::Acquire)
        })
    }

    /// Reads a native-endian `u64` (e.g. an atomic's target or result).
    ///
    /// # Errors
    /// As [`MemoryRegion::read`].
    pub fn read_u64(&self, off: usize) -> Result<u64> {
        let mut b = [0u8; 8];
        self.read(off, &mut b)?;
        Ok(u64::from_ne_bytes(b))
    }
}

impl MemoryRegion {
    /// The region's pin count: what a memory window bound to it holds too (see
    /// `MemoryWindow`).
    pub(crate) fn pins(&self) -> &Arc<Pins> {
        &self.pins
    }

    /// Deregistered now, or once the work outstanding on its domain's QPs has completed
    /// and no receive pins it any more; its buffer (if any) is dropped after that, or put
    /// in `slot`. Receives posted from now on cannot pin it (those that pinned it before
    /// keep it registered until they complete).
    fn park(&mut self, slot: Option<Slot>) {
        let Some(kind) = self.kind.take() else {
            return;
        };
        self.pd.inner.regions.remove(self.lkey);
        let reg: crate::queue::lifetime::Registration = Box::new(kind);
        let reg: crate::queue::lifetime::Registration = match self.owned.take() {
            None => reg,
            buf => Box::new(WithBuffer { reg, buf, slot }),
        };
        self.pd
            .inner
            .lifetimes
            .release(reg, Some(self.pins.clone()));
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        self.park(None);
    }
}

#[cfg(test)]
mod record_tests {
    use super::{record, Cpu};
    use mlx5::request::Access;

    /// A dma-buf region (no CPU view, no ON_DEMAND flag) may fault on the device as an
    /// on-demand one: the direct path treats SRQ receives into it as into ODP regions
    /// (refused without `OdpCaps::srq_recv`, posted again after a fault); the poller never
    /// writes it.
    #[test]
    fn dma_buf_regions_fault_as_on_demand_ones() {
        let w = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
        let dmabuf = record(1, 0x1000, 4096, w, Cpu::Unmapped);
        assert!(dmabuf.on_demand && dmabuf.local_write && !dmabuf.cpu_writable);
        let odp = record(2, 0x1000, 4096, w | Access::ON_DEMAND, Cpu::ReadWrite);
        assert!(odp.on_demand && odp.cpu_writable);
        let pinned = record(3, 0x1000, 4096, w, Cpu::ReadWrite);
        assert!(!pinned.on_demand && pinned.cpu_writable);
        let read_only = record(4, 0x1000, 4096, Access::NONE, Cpu::ReadOnly);
        assert!(!read_only.on_demand && !read_only.local_write);
    }
}
