//! Plain descriptions of a QP's and a CQ's rings: the fields `mlx5dv_init_obj` returns.
//!
//! The direct data path is built from these and never asks where the memory came from: on a
//! ConnectX they describe the rings rdma-core allocated and the UAR page the kernel mapped; on
//! the software NIC they describe memory the NIC owns.

/// The rings and registers of one QP.
#[derive(Copy, Clone, Debug)]
pub struct RawQp {
    /// QP number.
    pub qpn: u32,
    /// Send ring: `sq_wqe_cnt` basic blocks of `sq_stride` (64) bytes.
    pub sq_buf: *mut u8,
    /// Blocks in the send ring (a power of two).
    pub sq_wqe_cnt: u32,
    /// Bytes per send block (64).
    pub sq_stride: u32,
    /// Receive ring: `rq_wqe_cnt` entries of `rq_stride` bytes.
    pub rq_buf: *mut u8,
    /// Entries in the receive ring (a power of two; 0 when the QP has an SRQ or no RQ).
    pub rq_wqe_cnt: u32,
    /// Bytes per receive entry (16 × a power of two).
    pub rq_stride: u32,
    /// Doorbell record: `[RCV_DBR]` receive counter, `[SND_DBR]` send counter, big-endian.
    pub dbrec: *mut u32,
    /// BlueFlame / doorbell register (two halves of `bf_size` bytes when BlueFlame is present).
    pub bf_reg: *mut u8,
    /// Bytes of one BlueFlame half; 0 means doorbell writes only.
    pub bf_size: u32,
    /// Most inline bytes one WQE may carry (from the QP's creation attributes).
    pub max_inline: u32,
    /// Most gather entries in one send WQE.
    pub max_send_sge: u32,
    /// Most scatter entries in one receive WQE.
    pub max_recv_sge: u32,
}

/// The ring and doorbell record of one CQ.
#[derive(Copy, Clone, Debug)]
pub struct RawCq {
    /// CQ number.
    pub cqn: u32,
    /// The ring: `cqe_cnt` entries of `cqe_size` bytes.
    pub buf: *mut u8,
    /// Entries (a power of two).
    pub cqe_cnt: u32,
    /// Bytes per entry: 64 or 128 (with 128 the 64-byte CQE is the second half).
    pub cqe_size: u32,
    /// Doorbell record: `[CQ_SET_CI]` consumer index, `[CQ_ARM_DB]` arm word, big-endian.
    pub dbrec: *mut u32,
    /// The CQ's UAR page (arming writes to `cq_uar + CQ_DOORBELL`); may be null when the CQ is
    /// only polled.
    pub cq_uar: *mut u8,
}
