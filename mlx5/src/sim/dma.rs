//! DMA of the software NIC: the memory it owns (rings, doorbell records, BlueFlame registers,
//! allocated regions), the addresses it checked in registered regions, and the raw copies.
//!
//! Everything the driver shares with the NIC is touched here through raw pointers, never
//! through references: the driver writes these bytes from another thread at the same time,
//! exactly as it would with a real device.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::sync::atomic::{AtomicU32, AtomicU8, Ordering};

/// A zeroed, page-aligned allocation that lives until dropped, or memory the driver
/// allocated and handed to the NIC at creation ([`DmaBuf::host`]), which the NIC never frees.
pub(crate) struct DmaBuf {
    ptr: *mut u8,
    layout: Layout,
    /// Allocated here (freed on drop); false for the driver's memory.
    owned: bool,
}

// SAFETY: DmaBuf is a plain owned allocation; all access goes through raw pointers whose
// synchronisation is the NIC protocol (doorbell records, owner bits), not Rust references.
unsafe impl Send for DmaBuf {}
// SAFETY: as above: `&DmaBuf` only hands out the pointer.
unsafe impl Sync for DmaBuf {}

impl DmaBuf {
    /// `len` zeroed bytes (at least one page-aligned byte).
    pub(crate) fn new(len: usize) -> DmaBuf {
        let layout = Layout::from_size_align(len.max(1), 4096).expect("DMA buffer layout");
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        DmaBuf {
            ptr,
            layout,
            owned: true,
        }
    }
    /// The driver's memory at `ptr` (a ring rdma-core's provider allocated, a UAR page it
    /// mapped), used in place and never freed here: the kernel's `ib_umem_get` pins such
    /// memory; whoever creates the NIC object over it keeps it alive until the object is
    /// destroyed (see [`super::Nic::create_cq_at`]).
    pub(crate) fn host(ptr: *mut u8) -> DmaBuf {
        DmaBuf {
            ptr,
            layout: Layout::new::<u8>(),
            owned: false,
        }
    }
    /// `len` zeroed bytes, or None when they cannot be allocated (a region's size comes
    /// from the user: never abort on it).
    pub(crate) fn try_new(len: usize) -> Option<DmaBuf> {
        let layout = Layout::from_size_align(len.max(1), 4096).ok()?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        // `then`, not `then_some`: a `DmaBuf` of the null pointer must never exist, since
        // dropping it would free a pointer the allocator never gave (found by the
        // AddressSanitizer stage, `cargo xtask asan`, on a region larger than memory).
        (!ptr.is_null()).then(|| DmaBuf {
            ptr,
            layout,
            owned: true,
        })
    }
    pub(crate) fn ptr(&self) -> *mut u8 {
        self.ptr
    }
}

impl Drop for DmaBuf {
    fn drop(&mut self) {
        if self.owned {
            // SAFETY: allocated in `new` with this very layout, freed once.
            unsafe { dealloc(self.ptr, self.layout) }
        }
    }
}

/// Where the NIC moves bytes: an address checked against a region, and the region's whole
/// words (the access sizes every party uses for its bytes: [`crate::shared`]).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) struct Dma {
    pub(crate) ptr: *mut u8,
    pub(crate) words: crate::shared::Words,
}

impl Dma {
    /// No bytes (a zero-length access).
    pub(crate) fn none() -> Dma {
        Dma {
            ptr: core::ptr::null_mut(),
            words: Default::default(),
        }
    }
}

/// Reads a big-endian doorbell-record word the driver updates from another thread.
///
/// # Safety
/// `p` must point to a live, 4-byte-aligned word.
pub(crate) unsafe fn load_be32(p: *const u32) -> u32 {
    // SAFETY: the caller guarantees a live aligned word; AtomicU32 has u32's layout, and the
    // driver stores it atomically (Release), so this Acquire load pairs with it.
    u32::from_be(unsafe { (*(p as *const AtomicU32)).load(Ordering::Acquire) })
}

/// Reads `out.len()` bytes of a ring the NIC owns at `src`, one relaxed atomic byte load
/// each (the driver writes them from its own thread). Region bytes go through
/// [`read_region`].
///
/// # Safety
/// `src .. src + out.len()` must be live memory of a ring.
pub(crate) unsafe fn read(src: *const u8, out: &mut [u8]) {
    for (i, o) in out.iter_mut().enumerate() {
        // SAFETY: inside the caller's live range; AtomicU8 has u8's size and alignment.
        *o = unsafe { AtomicU8::from_ptr(src.add(i).cast_mut()) }.load(Ordering::Relaxed);
    }
}

/// Writes `data` into a ring the NIC owns at `dst`, one relaxed atomic byte store each (see
/// [`read`]).
///
/// # Safety
/// `dst .. dst + data.len()` must be live memory of a ring, not overlapping `data`.
pub(crate) unsafe fn write(dst: *mut u8, data: &[u8]) {
    for (i, &b) in data.iter().enumerate() {
        // SAFETY: as in `read`.
        unsafe { AtomicU8::from_ptr(dst.add(i)) }.store(b, Ordering::Relaxed);
    }
}

/// Reads `out.len()` bytes of a registered region (DMA from host memory) with the access
/// sizes every party uses for them ([`crate::shared`]).
///
/// # Safety
/// `at.ptr .. at.ptr + out.len()` was checked against the region table (live memory of the
/// region `at.words` describes).
pub(crate) unsafe fn read_region(at: Dma, out: &mut [u8]) {
    // SAFETY: the caller's contract is `copy_out`'s.
    unsafe { crate::shared::copy_out(at.words, at.ptr, out) }
}

/// Writes `data` into a registered region (DMA to host memory), as [`read_region`].
///
/// # Safety
/// As [`read_region`], for writable memory not overlapping `data`.
pub(crate) unsafe fn write_region(at: Dma, data: &[u8]) {
    // SAFETY: the caller's contract is `copy_in`'s.
    unsafe { crate::shared::copy_in(at.words, at.ptr, data) }
}

/// Writes `data` across a checked scatter list, piece after piece (what does not fit is
/// left out).
pub(crate) fn scatter(ptrs: &[(Dma, usize)], mut data: &[u8]) {
    for &(p, len) in ptrs {
        let k = len.min(data.len());
        // SAFETY: every pointer was checked by `scatter_ptrs` for `len` writable bytes.
        unsafe { write_region(p, &data[..k]) };
        data = &data[k..];
    }
}

/// Reads the first `out.len()` bytes of a checked scatter list.
pub(crate) fn gather_ptrs(ptrs: &[(Dma, usize)], out: &mut [u8]) {
    let mut at = 0;
    for &(p, len) in ptrs {
        let k = len.min(out.len() - at);
        if k == 0 {
            break;
        }
        // SAFETY: every pointer was checked by `scatter_ptrs` for `len` bytes of the
        // region (writable, hence readable by the device).
        unsafe { read_region(p, &mut out[at..at + k]) };
        at += k;
    }
}

/// Publishes a CQE: writes its first 63 bytes, then the `op_own` byte with Release ordering
/// so a poller that sees the new owner bit (Acquire or read barrier) sees the whole entry.
///
/// # Safety
/// `dst` must point to a live 64-byte CQE slot of a CQ the NIC owns.
pub(crate) unsafe fn publish_cqe(dst: *mut u8, cqe: &[u8; 64]) {
    // SAFETY: the caller guarantees a live 64-byte slot.
    unsafe {
        std::ptr::copy_nonoverlapping(cqe.as_ptr(), dst, 63);
        (*(dst.add(63) as *const AtomicU8)).store(cqe[63], Ordering::Release);
    }
}
