//! Queues whose memory the driver allocated: what a kernel hands the device when rdma-core's
//! provider creates a CQ or QP (`mlx5_ib` `create_cq_user` / `create_user_qp` pin the
//! user's buffer and doorbell record with `ib_umem_get` and give the device their
//! addresses). The NIC then runs the rings in place, where the provider put them, instead
//! of allocating its own.

/// The memory of a CQ the driver allocated: its ring, doorbell record and the UAR page it
/// arms through (the CQ doorbell is at `uar + CQ_DOORBELL`).
#[derive(Copy, Clone, Debug)]
pub struct HostCq {
    /// `cqe_cnt * cqe_size` bytes, page-aligned (rdma-core `mlx5_alloc_cq_buf`).
    pub buf: *mut u8,
    /// The 8-byte doorbell record (rdma-core `mlx5_alloc_dbrec`).
    pub dbrec: *mut u32,
    /// The UAR page the CQ is armed through (rdma-core `ctx->cq_uar_reg`); other CQs may
    /// share it.
    pub uar: *mut u8,
}

/// The memory of a QP the driver allocated (rdma-core `mlx5_alloc_qp_buf`: one buffer, the
/// receive ring at offset 0 and the send ring after it).
#[derive(Copy, Clone, Debug)]
pub struct HostQp {
    /// The send ring: `sq_blocks` 64-byte blocks.
    pub sq: *mut u8,
    /// The receive ring: `rq_entries` entries of `16 * max_recv_sge` bytes (null without).
    pub rq: *mut u8,
    /// The doorbell record (receive counter, send counter).
    pub dbrec: *mut u32,
    /// The BlueFlame register the provider chose for the QP (its bfreg).
    pub bf_reg: *mut u8,
}

/// The memory of an SRQ the driver allocated (rdma-core `mlx5_alloc_srq_buf`: the ring with
/// its next-WQE links already written, and its doorbell record).
#[derive(Copy, Clone, Debug)]
pub struct HostSrq {
    /// The ring: as many entries of as many bytes as [`SrqCaps`](super::SrqCaps) make.
    pub buf: *mut u8,
    /// The doorbell record (the receive counter).
    pub dbrec: *mut u32,
}
