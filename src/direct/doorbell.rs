//! Ringing a send queue: doorbell record, then BlueFlame copy or 8-byte doorbell
//! (rdma-core `post_send_db`), on a register of the queue's own or under the lock of a
//! shared one ([`super::register`]).

use super::barrier;
use super::register::{Claim, DoorbellMode, SharedReg};
use core::sync::atomic::{AtomicU32, Ordering};
use mlx5::doorbell::{SEND_WQE_BB, SND_DBR};
use std::sync::Arc;

/// The doorbell side of a send queue: record, register and the BlueFlame half in use.
pub(crate) struct Doorbell {
    dbrec: *mut u32,
    bf_reg: *mut u8,
    bf_size: usize,
    /// The half the next ring uses, when the register is the queue's own (or has no
    /// BlueFlame: then it stays `bf_reg`): an address, not an offset from `bf_reg`, so that
    /// a ring loads it once instead of adding two fields (one instruction of every post).
    /// An address rather than a pointer so that it flips with one XOR (`map_addr` is newer
    /// than the crate's minimum Rust); `bf_reg`'s address, exposed by the cast that made it.
    bf_cur: usize,
    /// The two halves' addresses XORed (0 without BlueFlame): `bf_cur ^ bf_flip` is the
    /// other half, whatever the register's alignment.
    bf_flip: usize,
    /// Set when other queues may ring the register: every ring takes its lock and uses its
    /// offset. Checked first on every ring (one load and branch on the fast path).
    shared: Option<Arc<SharedReg>>,
    mode: DoorbellMode,
    /// Keeps the register's claim (see [`super::register::claim`]) while the queue lives.
    _claim: Option<Arc<SharedReg>>,
}

impl core::fmt::Debug for Doorbell {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Doorbell")
            .field("bf_reg", &self.bf_reg)
            .field("bf_size", &self.bf_size)
            .field("mode", &self.mode)
            .finish()
    }
}

impl Doorbell {
    /// # Safety
    /// `dbrec` must point to a live doorbell record (2 aligned words) and `bf_reg` to a live
    /// register of `2 * bf_size` bytes (8 bytes when `bf_size == 0`), both for as long as the
    /// value is used. `claim` must come from [`super::register::claim`] for this register:
    /// in [`DoorbellMode::Dedicated`], no other queue rings it.
    pub(crate) unsafe fn new(
        dbrec: *mut u32,
        bf_reg: *mut u8,
        bf_size: usize,
        claim: Claim,
    ) -> Doorbell {
        let shared = match claim.mode {
            DoorbellMode::SharedLocked => claim.reg.clone(),
            _ => None,
        };
        Doorbell {
            dbrec,
            bf_reg,
            bf_size,
            bf_cur: bf_reg as usize,
            bf_flip: bf_reg as usize ^ bf_reg.wrapping_add(bf_size) as usize,
            shared,
            mode: claim.mode,
            _claim: claim.reg,
        }
    }

    /// Bytes one BlueFlame write may carry (0: doorbell only).
    #[inline(always)]
    #[cfg(test)]
    pub(crate) fn bf_size(&self) -> usize {
        self.bf_size
    }

    /// The other half for the next ring (rdma-core `bf->offset ^= bf->buf_size`).
    #[inline(always)]
    fn flip(&mut self) {
        self.bf_cur ^= self.bf_flip;
    }

    /// Drops the register claim (the queue never rings again: its QP is being destroyed).
    pub(crate) fn release(&mut self) {
        self.shared = None;
        self._claim = None;
    }

    /// How this queue rings.
    pub(crate) fn mode(&self) -> DoorbellMode {
        self.mode
    }

    /// Step 2 of a ring: the doorbell record, the device's fallback copy of the producer index.
    #[inline(always)]
    fn record(&self, pi: u16) {
        // SAFETY: `dbrec` is a live aligned record (constructor contract); AtomicU32 has the
        // layout of u32. Release pairs with whoever reads it as memory (the software NIC).
        unsafe {
            (*(self.dbrec.add(SND_DBR) as *const AtomicU32))
                .store((pi as u32).to_be(), Ordering::Release)
        };
    }

    /// Step 4 of a ring, into the half at `half`: the whole WQE through BlueFlame when
    /// `single` and it fits, else its first 8 bytes as the doorbell.
    ///
    /// # Safety
    /// As [`Doorbell::ring`]; `half` is `bf_reg` or `bf_reg + bf_size`.
    #[inline(always)]
    unsafe fn write_register(
        &self,
        half: *mut u8,
        single: bool,
        last_bbs: usize,
        block: &impl Fn(usize) -> *const u8,
    ) {
        let dst = half as *mut u64;
        if single && self.bf_size != 0 && last_bbs * SEND_WQE_BB <= self.bf_size {
            // 4a. BlueFlame: the whole WQE, 64 bytes at a time, ascending, source wrapping.
            for i in 0..last_bbs {
                // SAFETY: `block(i)` has 64 readable bytes (caller contract); the destination
                // block lies within this BlueFlame half (last_bbs * 64 <= bf_size) and is
                // 64-byte aligned (the register and bf_size are).
                unsafe { copy_block(dst.add(i * 8).cast(), block(i)) };
            }
        } else {
            // 4b. The 8-byte doorbell: the first 8 bytes of the last WQE's control segment,
            // one 64-bit store, atomic as the software NIC's reads of its register are (see
            // `copy_block`): `mov` on x86_64, as rdma-core's `mmio_write64_be`.
            // SAFETY: as above; the register is 8-byte aligned, AtomicU64 has u64's layout.
            unsafe {
                (*(dst as *const core::sync::atomic::AtomicU64))
                    .store((block(0) as *const u64).read(), Ordering::Relaxed)
            };
        }
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
        if self.shared.is_some() {
            // SAFETY: the caller's contract.
            return unsafe { self.ring_locked(pi, single, last_bbs, &block) };
        }
        // 1. The WQEs and the shadow entries are written before the record says so.
        barrier::to_device();
        // 2. The doorbell record.
        self.record(pi);
        // 3. The record store is ordered before the write-combining stores below.
        barrier::wc_start();
        // 4. BlueFlame copy or 8-byte doorbell.
        // SAFETY: the caller's contract; `bf_cur` is one of the two halves.
        unsafe { self.write_register(self.bf_cur as *mut u8, single, last_bbs, &block) };
        // 5. Push the write-combining buffer out before the next ring can overtake it.
        barrier::wc_flush();
        // 6. Alternate halves.
        self.flip();
    }

    /// [`Doorbell::ring`] on a shared register: steps 3 to 6 under the register's lock, with
    /// the register's offset (rdma-core `post_send_db` with `bf->need_lock`: the flush is
    /// inside the lock, so no other core's ring can overtake this one in the write-combining
    /// buffers).
    ///
    /// # Safety
    /// As [`Doorbell::ring`].
    #[cold]
    #[inline(never)]
    unsafe fn ring_locked(
        &self,
        pi: u16,
        single: bool,
        last_bbs: usize,
        block: &impl Fn(usize) -> *const u8,
    ) {
        // SAFETY: the caller's contract (as `ring`'s).
        unsafe {
            self.under_lock(pi, |offset| {
                self.write_register(self.bf_reg.wrapping_add(offset), single, last_bbs, block)
            })
        }
    }

    /// The shared register's ring around `write` (which writes the register at the offset
    /// it is given): the record, then under the register's lock the write and the offset
    /// flipped for the next ring (rdma-core `post_send_db` with `bf->need_lock`).
    ///
    /// # Safety
    /// `write`'s register stores are valid for the offset it gets (within the register).
    #[inline(always)]
    unsafe fn under_lock(&self, pi: u16, write: impl FnOnce(usize)) {
        let Some(reg) = &self.shared else { return };
        barrier::to_device();
        self.record(pi);
        let mut held = reg.lock();
        barrier::wc_start();
        let offset = *held;
        write(offset);
        barrier::wc_flush();
        *held = offset ^ self.bf_size;
        drop(held);
    }
}

impl Doorbell {
    /// Publishes producer index `pi` and copies the one-block WQE at `wqe` through
    /// BlueFlame: [`Doorbell::ring`] for the case the fast path knows statically.
    ///
    /// # Safety
    /// `wqe` must point to the 64 readable bytes of the WQE just written, `bf_size` must be
    /// at least 64, and the register the queue's own ([`DoorbellMode::Dedicated`]: no lock
    /// here; the send queue enables its fast path only then).
    #[inline(always)]
    pub(crate) unsafe fn ring_bf_block(&mut self, pi: u16, wqe: *const u8) {
        debug_assert!(self.bf_size >= SEND_WQE_BB);
        debug_assert!(self.mode == DoorbellMode::Dedicated && self.shared.is_none());
        barrier::to_device();
        self.record(pi);
        barrier::wc_start();
        // SAFETY: `wqe` has 64 readable bytes (caller contract); the destination is the first
        // block of the current BlueFlame half (bf_size >= 64), 64-byte aligned.
        unsafe { copy_block(self.bf_cur as *mut u8, wqe) };
        barrier::wc_flush();
        self.flip();
    }

    /// [`Doorbell::ring_bf_block`] on a register other queues ring too: the record, then,
    /// under the register's lock, the block to the half the register's offset names and the
    /// offset flipped (rdma-core `post_send_db` with `bf->need_lock`), as
    /// [`Doorbell::ring`] does for any WQE.
    ///
    /// # Safety
    /// As [`Doorbell::ring_bf_block`]; the register is shared
    /// ([`DoorbellMode::SharedLocked`]).
    #[inline(always)]
    pub(crate) unsafe fn ring_bf_block_locked(&self, pi: u16, wqe: *const u8) {
        debug_assert!(self.bf_size >= SEND_WQE_BB);
        // SAFETY: the caller's contract: `wqe` has 64 readable bytes; the destination is the
        // first block of the register's current half (bf_size >= 64), 64-byte aligned.
        unsafe {
            self.under_lock(pi, |offset| {
                copy_block(self.bf_reg.wrapping_add(offset), wqe)
            })
        }
    }
}

/// Copies one 64-byte block to the BlueFlame register as wide, ascending stores the compiler
/// may neither merge, split nor drop, as rdma-core's `mmio_memcpy_x64`: four 16-byte SSE
/// stores on x86_64; on aarch64 one NEON `st1` of four 16-byte registers (rdma-core:
/// `vst4q_u64(dest, vld4q_u64(src))`, the same 64 bytes in one instruction; `st64b` where
/// FEAT_LS64 exists is not used: it needs a run-time check and is not in stable Rust);
/// eight 8-byte stores elsewhere.
///
/// # Safety
/// `src` must have 64 readable bytes; `dst` must be 16-byte aligned with 64 writable bytes.
#[inline(always)]
unsafe fn copy_block(dst: *mut u8, src: *const u8) {
    #[cfg(target_arch = "x86_64")]
    {
        use core::arch::x86_64::{__m128i, _mm_loadu_si128};
        let s = src as *const __m128i;
        // SAFETY: the caller's contract: 64 readable source bytes, loaded unaligned; SSE2 is
        // part of x86_64.
        let w = unsafe { [0, 1, 2, 3].map(|i| _mm_loadu_si128(s.add(i))) };
        // The stores in assembly, as rdma-core's are in C: the register is the device's, and
        // on the software NIC memory another thread's pass reads (`Device::process`) with
        // atomics; a Rust store there, volatile or not, raced those reads (a review's
        // finding, ThreadSanitizer). Not `nomem`: kept in program order with the barriers
        // around it, as a volatile access.
        // SAFETY: the caller's contract: an aligned 64-byte destination.
        unsafe {
            core::arch::asm!(
                "movaps xmmword ptr [{dst}], {a}",
                "movaps xmmword ptr [{dst} + 16], {b}",
                "movaps xmmword ptr [{dst} + 32], {c}",
                "movaps xmmword ptr [{dst} + 48], {d}",
                dst = in(reg) dst,
                a = in(xmm_reg) w[0],
                b = in(xmm_reg) w[1],
                c = in(xmm_reg) w[2],
                d = in(xmm_reg) w[3],
                options(nostack, preserves_flags),
            )
        };
    }
    #[cfg(target_arch = "aarch64")]
    // SAFETY: the caller's contract: 64 readable bytes at `src`, 64 writable 16-byte-aligned
    // bytes at `dst`. NEON is part of aarch64. The block is not marked `nomem`, so the
    // compiler keeps it in program order with the barriers around it, as a volatile access.
    unsafe {
        core::arch::asm!(
            "ld1 {{v0.2d, v1.2d, v2.2d, v3.2d}}, [{src}]",
            "st1 {{v0.2d, v1.2d, v2.2d, v3.2d}}, [{dst}]",
            src = in(reg) src,
            dst = in(reg) dst,
            out("v0") _,
            out("v1") _,
            out("v2") _,
            out("v3") _,
            options(nostack, preserves_flags),
        )
    };
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        let (d, s) = (
            dst as *const core::sync::atomic::AtomicU64,
            src as *const u64,
        );
        for w in 0..8 {
            // SAFETY: the caller's contract (blocks are 64-byte aligned, so 8-byte loads and
            // stores are); atomic, as on x86_64.
            unsafe { (*d.add(w)).store(s.add(w).read(), Ordering::Relaxed) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::copy_block;

    #[test]
    fn copy_block_copies_64_bytes_in_place() {
        #[repr(align(64))]
        struct Line([u8; 128]);
        let src: Vec<u8> = (0..64u8).map(|b| b.wrapping_mul(37) ^ 0x5a).collect();
        let mut dst = Line([0xee; 128]);
        // SAFETY: 64 readable bytes; a 64-byte-aligned destination of 128 bytes.
        unsafe { copy_block(dst.0.as_mut_ptr(), src.as_ptr()) };
        assert_eq!(&dst.0[..64], &src[..]);
        assert!(
            dst.0[64..].iter().all(|&b| b == 0xee),
            "wrote past the block"
        );
    }
}
