//! Arming a CQ for one completion event on the direct path, as rdma-core's `mlx5_arm_cq`
//! (`providers/mlx5/cq.c`) and UCX's `uct_ib_mlx5dv_arm_cq` do it. A cold path: the poll
//! never looks at events.

use super::barrier;
use super::CompletionQueue;
use core::sync::atomic::{AtomicU32, Ordering};
use mlx5::doorbell::{CqArm, CQ_ARM_DB, CQ_DOORBELL};

impl CompletionQueue {
    /// Arms the CQ: its device raises one event for the next entry past the consumer index
    /// (the next solicited or error one when `solicited`). `sn` is the arm sequence number:
    /// the count of events read for this CQ, modulo 4 (an arm with an older number is
    /// dropped by the device).
    ///
    /// In order: the arm word `sn << 28 | cmd | ci` to the doorbell record's arm slot, the
    /// write-combining barrier (the record is in memory before the register write leaves),
    /// one 64-bit big-endian store of `word << 32 | cqn` to `cq_uar + 0x20`, the flush.
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
        // contract); the device reads it, hence the atomic store.
        unsafe {
            (*(self.dbrec().add(CQ_ARM_DB) as *const AtomicU32))
                .store(arm.word().to_be(), Ordering::Relaxed)
        };
        barrier::wc_start();
        // SAFETY: `cq_uar + 0x20` is the CQ doorbell register of the live UAR page (caller
        // contract), 8-byte aligned; one 64-bit store, as `mmio_write64_be`.
        unsafe {
            (cq_uar.add(CQ_DOORBELL) as *mut u64).write_volatile(arm.doorbell(self.cqn()).to_be())
        };
        barrier::wc_flush();
    }
}
