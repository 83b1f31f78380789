//! Ringing a send queue: doorbell record, then BlueFlame copy or 8-byte doorbell
//! (rdma-core `post_send_db`).

use super::barrier;
use core::sync::atomic::{AtomicU32, Ordering};
use mlx5::doorbell::{SEND_WQE_BB, SND_DBR};

/// The doorbell side of a send queue: record, register and the BlueFlame half in use.
#[derive(Debug)]
pub(crate) struct Doorbell {
    dbrec: *mut u32,
    bf_reg: *mut u8,
    bf_size: usize,
    bf_offset: usize,
}

impl Doorbell {
    /// # Safety
    /// `dbrec` must point to a live doorbell record (2 aligned words) and `bf_reg` to a live
    /// register of `2 * bf_size` bytes (8 bytes when `bf_size == 0`), both for as long as the
    /// value is used, and nobody else may ring through this register half pair.
    pub(crate) unsafe fn new(dbrec: *mut u32, bf_reg: *mut u8, bf_size: usize) -> Doorbell {
        Doorbell {
            dbrec,
            bf_reg,
            bf_size,
            bf_offset: 0,
        }
    }

    /// Bytes one BlueFlame write may carry (0: doorbell only).
    #[inline(always)]
    pub(crate) fn bf_size(&self) -> usize {
        self.bf_size
    }

    /// Publishes producer index `pi` and rings. `last` is the last WQE written, `last_bbs` its
    /// blocks; `single` says the ring covers exactly that one WQE. The WQE's blocks are
    /// read wrapping through `block(i)`.
    ///
    /// # Safety
    /// `block(i)` must return a pointer to 64 readable bytes for `i < last_bbs`: the WQE's
    /// blocks in the send ring.
    #[inline(always)]
    pub(crate) unsafe fn ring(
        &mut self,
        pi: u16,
        single: bool,
        last_bbs: usize,
        block: impl Fn(usize) -> *const u8,
    ) {
        // 1. The WQEs and the shadow entries are written before the record says so.
        barrier::to_device();
        // 2. The doorbell record: the device's fallback copy of the producer index.
        // SAFETY: `dbrec` is a live aligned record (constructor contract); AtomicU32 has the
        // layout of u32. Release pairs with whoever reads it as memory (the software NIC).
        unsafe {
            (*(self.dbrec.add(SND_DBR) as *const AtomicU32))
                .store((pi as u32).to_be(), Ordering::Release)
        };
        // 3. The record store is ordered before the write-combining stores below.
        barrier::wc_start();
        let dst = self.bf_reg.wrapping_add(self.bf_offset) as *mut u64;
        if single && self.bf_size != 0 && last_bbs * SEND_WQE_BB <= self.bf_size {
            // 4a. BlueFlame: the whole WQE, 64 bytes at a time, ascending, source wrapping.
            for i in 0..last_bbs {
                // SAFETY: `block(i)` has 64 readable bytes (caller contract); the destination
                // block lies within this BlueFlame half (last_bbs * 64 <= bf_size) and is
                // 64-byte aligned (the register and bf_size are).
                unsafe { copy_block(dst.add(i * 8).cast(), block(i)) };
            }
        } else {
            // 4b. The 8-byte doorbell: the first 8 bytes of the last WQE's control segment.
            // SAFETY: as above; one aligned 64-bit store to the register.
            unsafe { dst.write_volatile((block(0) as *const u64).read()) };
        }
        // 5. Push the write-combining buffer out before the next ring can overtake it.
        barrier::wc_flush();
        // 6. Alternate halves.
        self.bf_offset ^= self.bf_size;
    }
}

impl Doorbell {
    /// Publishes producer index `pi` and copies the one-block WQE at `wqe` through
    /// BlueFlame: [`Doorbell::ring`] for the case the fast path knows statically.
    ///
    /// # Safety
    /// `wqe` must point to the 64 readable bytes of the WQE just written, and `bf_size`
    /// must be at least 64.
    #[inline(always)]
    pub(crate) unsafe fn ring_bf_block(&mut self, pi: u16, wqe: *const u8) {
        debug_assert!(self.bf_size >= SEND_WQE_BB);
        barrier::to_device();
        // SAFETY: as in `ring`.
        unsafe {
            (*(self.dbrec.add(SND_DBR) as *const AtomicU32))
                .store((pi as u32).to_be(), Ordering::Release)
        };
        barrier::wc_start();
        // SAFETY: `wqe` has 64 readable bytes (caller contract); the destination is the first
        // block of the current BlueFlame half (bf_size >= 64), 64-byte aligned.
        unsafe { copy_block(self.bf_reg.wrapping_add(self.bf_offset), wqe) };
        barrier::wc_flush();
        self.bf_offset ^= self.bf_size;
    }
}

/// Copies one 64-byte block to the BlueFlame register as wide, ascending, volatile stores:
/// four 16-byte SSE stores on x86_64 (as rdma-core's `mmio_memcpy_x64`), eight 8-byte ones
/// elsewhere.
///
/// # Safety
/// `src` must have 64 readable bytes; `dst` must be 16-byte aligned with 64 writable bytes.
#[inline(always)]
unsafe fn copy_block(dst: *mut u8, src: *const u8) {
    #[cfg(target_arch = "x86_64")]
    {
        use core::arch::x86_64::{__m128i, _mm_loadu_si128};
        let (d, s) = (dst as *mut __m128i, src as *const __m128i);
        for w in 0..4 {
            // SAFETY: the caller's contract: 64 readable source bytes (loaded unaligned) and
            // an aligned 64-byte destination; SSE2 is part of x86_64.
            unsafe { d.add(w).write_volatile(_mm_loadu_si128(s.add(w))) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let (d, s) = (dst as *mut u64, src as *const u64);
        for w in 0..8 {
            // SAFETY: the caller's contract (blocks are 64-byte aligned, so 8-byte loads are).
            unsafe { d.add(w).write_volatile(s.add(w).read()) };
        }
    }
}
