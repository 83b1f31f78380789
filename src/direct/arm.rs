//! Arming a CQ for one completion event on the direct path, as rdma-core's `mlx5_arm_cq`
//! (`providers/mlx5/cq.c`) and UCX's `uct_ib_mlx5dv_arm_cq` do it. A cold path: the poll
//! never looks at events.

use super::barrier;
use super::CompletionQueue;
use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use mlx5::doorbell::{CqArm, CQ_ARM_DB, CQ_DOORBELL};

impl CompletionQueue {
    /// Arms the CQ: its device raises one event for the next entry past the consumer index
    /// (the next solicited or error one when `solicited`). `sn` is the arm sequence number:
    /// the count of events read for this CQ, modulo 4 (an arm with an older number is
    /// dropped by the device).
    ///
    /// In order: the arm word `sn << 28 | cmd | ci` to the doorbell record's arm slot, the
    /// write-combining barrier (the record is in memory before the register write leaves),
    /// one 64-bit big-endian store of `word << 32 | cqn` to `cq_uar + 0x20`, the flush. Both
    /// stores are atomic, of the size the software NIC's thread loads them with.
    ///
    /// # Safety
    /// `cq_uar` must be the CQ's UAR page (`mlx5dv_cq.cq_uar`), mapped while the CQ lives.
    #[cold]
    pub(crate) unsafe fn arm(&self, cq_uar: *mut u8, sn: u32, solicited: bool) {
        let arm = CqArm {
            sn: sn & 3,
            solicited,
            ci: self.consumer_index() & 0xff_ffff,
        };
        // SAFETY: the record is the CQ's live, aligned doorbell record (constructor
        // contract); the device reads it, hence the atomic store (the software NIC loads it
        // as an AtomicU32 too).
        unsafe {
            (*(self.dbrec().add(CQ_ARM_DB) as *const AtomicU32))
                .store(arm.word().to_be(), Ordering::Relaxed)
        };
        barrier::wc_start();
        // SAFETY: `cq_uar + 0x20` is the CQ doorbell register of the live UAR page (caller
        // contract), 8-byte aligned; AtomicU64 has u64's layout. One 64-bit store, as
        // rdma-core's `mmio_write64_be`, and an atomic one: on the software NIC the register
        // is ordinary memory whose thread loads and swaps it as an AtomicU64 meanwhile
        // (`mlx5::sim` `ArmState::take_doorbell`), and a plain or volatile store would race
        // with that in Rust's memory model. Release orders the record store above before it
        // for that thread, which reads the record after taking the doorbell. On a ConnectX
        // the page is device memory no Rust thread reads, where what counts is one aligned
        // 8-byte store after the barrier: this is one (`mov` on x86_64, `stlr` on aarch64),
        // as the volatile store was. The send doorbell (`super::doorbell`) does the same
        // for its 8-byte doorbell and writes BlueFlame copies in assembly: the stepped
        // software NIC reads its registers in `Device::process`, on any thread.
        unsafe {
            (*(cq_uar.add(CQ_DOORBELL) as *const AtomicU64))
                .store(arm.doorbell(self.cqn()).to_be(), Ordering::Release)
        };
        barrier::wc_flush();
    }
}
