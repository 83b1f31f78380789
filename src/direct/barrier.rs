//! The memory barriers of the direct path, per architecture, as rdma-core's
//! `util/udma_barrier.h` defines them. Each says which stores or loads it orders.

use core::sync::atomic::{compiler_fence, Ordering};

/// Orders the WQE stores (and the shadow-table stores) before the doorbell-record store
/// that tells the device they are there (`udma_to_device_barrier`).
///
/// x86_64 keeps stores to write-back memory in order: a compiler barrier suffices.
/// aarch64: `dmb oshst` orders stores for observers in the outer-shareable domain (the NIC).
#[inline(always)]
pub fn to_device() {
    #[cfg(target_arch = "aarch64")]
    // SAFETY: a barrier instruction; it touches no memory the compiler tracks.
    unsafe {
        core::arch::asm!("dmb oshst", options(nostack, preserves_flags))
    };
    compiler_fence(Ordering::SeqCst);
}

/// Orders the doorbell-record store before the stores to the write-combining BlueFlame
/// register (`mmio_wc_start`).
///
/// x86_64: `sfence` (write-combining stores may pass earlier write-back stores otherwise).
/// aarch64: `dsb st`.
#[inline(always)]
pub fn wc_start() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `sfence` only orders stores.
    unsafe {
        core::arch::x86_64::_mm_sfence()
    };
    #[cfg(target_arch = "aarch64")]
    // SAFETY: a barrier instruction.
    unsafe {
        core::arch::asm!("dsb st", options(nostack, preserves_flags))
    };
    compiler_fence(Ordering::SeqCst);
}

/// Flushes the write-combining buffer so the BlueFlame / doorbell write leaves the core now,
/// before the next ring can overtake it (`mmio_flush_writes`).
///
/// x86_64: `sfence`. aarch64: `dsb st`.
#[inline(always)]
pub fn wc_flush() {
    wc_start()
}

/// Orders the load of a CQE's owner byte before the loads of its other fields
/// (`udma_from_device_barrier`).
///
/// x86_64 never reorders loads with older loads, and the device writes CQEs to coherent
/// write-back memory: a compiler barrier suffices (as in UCX; rdma-core uses `lfence`).
/// aarch64: `dmb oshld`.
#[inline(always)]
pub fn from_device() {
    #[cfg(target_arch = "aarch64")]
    // SAFETY: a barrier instruction.
    unsafe {
        core::arch::asm!("dmb oshld", options(nostack, preserves_flags))
    };
    compiler_fence(Ordering::SeqCst);
}
