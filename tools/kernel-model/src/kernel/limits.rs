//! What the modelled ConnectX offers: page and register geometry, queue limits.

/// Pages of the model's UARs (the kernel maps 4 KiB device pages).
pub(super) const PAGE: usize = 4096;
/// Where the BlueFlame registers start in a UAR page (`MLX5_BF_OFFSET`).
pub(super) const BF_OFFSET: usize = 0x800;
/// Bytes of one BlueFlame register (`1 << log_bf_reg_size`, 512 on ConnectX): two halves.
pub(super) const BF_REG_SIZE: u32 = 512;
/// bfregs per UAR page without 4K UARs (`MLX5_NON_FP_BFREGS_PER_UAR`).
pub(super) const BFREGS_PER_PAGE: u32 = 2;
/// The largest send WQE (`max_wqe_sz_sq`): 16 basic blocks.
pub(super) const MAX_SQ_DESC: u16 = 1024;
/// The largest receive WQE (`max_wqe_sz_rq`): 32 scatter entries.
pub(super) const MAX_RQ_DESC: u16 = 512;
/// bfregs for thread domains beyond the static ones (`num_dyn_bfregs`: 32 UAR pages).
pub(super) const DYN_BFREGS: u32 = 64;
/// Work requests per queue (`1 << log_max_qp_sz`).
pub(super) const MAX_WR: u32 = 1 << 15;
/// Gather / scatter entries per WQE the device reports.
pub(super) const MAX_SGE: u32 = 30;
