//! Doorbell records, the send-ring basic block and BlueFlame rules.
//!
//! Ringing a send doorbell (rdma-core `post_send_db`): barrier, `dbrec[SND_DBR] =
//! be32(pi & 0xffff)`, write-combining start, then either the whole WQE copied to
//! `bf_reg + offset` in 64-byte chunks (one WQE, at most `bf_size` bytes) or the first 8 bytes
//! of its control segment as one 64-bit store; flush; `offset ^= bf_size`.

/// Index of the receive counter in a QP's doorbell record (`MLX5_RCV_DBR`).
pub const RCV_DBR: usize = 0;
/// Index of the send counter in a QP's doorbell record (`MLX5_SND_DBR`).
pub const SND_DBR: usize = 1;

/// Index of the consumer index in a CQ's doorbell record.
pub const CQ_SET_CI: usize = 0;
/// Index of the arm word in a CQ's doorbell record.
pub const CQ_ARM_DB: usize = 1;
/// Offset of the CQ doorbell register in the CQ's UAR page (`MLX5_CQ_DOORBELL`).
pub const CQ_DOORBELL: usize = 0x20;
/// Arm command: next completion (`MLX5_CQ_DB_REQ_NOT`).
pub const CQ_DB_REQ_NOT: u32 = 0;
/// Arm command: next solicited completion (`MLX5_CQ_DB_REQ_NOT_SOL`).
pub const CQ_DB_REQ_NOT_SOL: u32 = 1 << 24;

/// Bytes of one send-ring basic block (`MLX5_SEND_WQE_BB`).
pub const SEND_WQE_BB: usize = 64;
/// Log2 of [`SEND_WQE_BB`] (`MLX5_SEND_WQE_SHIFT`).
pub const SEND_WQE_SHIFT: u32 = 6;
/// The most blocks one send WQE may take (rdma-core and the kernel cap WQEs at 16 blocks).
pub const MAX_WQE_BBS: usize = 16;
/// Bytes of one receive-WQE entry (one data segment).
pub const RECV_DS_BYTES: usize = 16;

/// The value written to the send slot of the doorbell record for producer index `pi`.
#[inline(always)]
pub const fn send_dbrec(pi: u32) -> u32 {
    pi & 0xffff
}

/// The value written to the consumer-index slot of a CQ doorbell record.
#[inline(always)]
pub const fn cq_set_ci(ci: u32) -> u32 {
    ci & 0xff_ffff
}

/// The arm word (`dbrec[CQ_ARM_DB]`) for arm sequence `sn`, command `cmd` and consumer index.
#[inline(always)]
pub const fn cq_arm(sn: u32, cmd: u32, ci: u32) -> u32 {
    ((sn & 3) << 28) | cmd | (ci & 0xff_ffff)
}

/// The 64-bit value written to `cq_uar + CQ_DOORBELL` to arm a CQ.
#[inline(always)]
pub const fn cq_arm_doorbell(arm: u32, cqn: u32) -> u64 {
    ((arm as u64) << 32) | cqn as u64
}

/// The BlueFlame offset after a ring: alternates between the two halves of the register.
#[inline(always)]
pub const fn next_bf_offset(offset: usize, bf_size: usize) -> usize {
    offset ^ bf_size
}

/// Whether a WQE of `bytes` may go through BlueFlame: one WQE, BlueFlame present, fits.
#[inline(always)]
pub const fn use_blueflame(nreq: usize, bytes: usize, bf_size: usize) -> bool {
    nreq == 1 && bf_size != 0 && bytes <= bf_size
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doorbell_values() {
        assert_eq!(send_dbrec(0x1_2345), 0x2345);
        assert_eq!(cq_set_ci(0x1ff_ffff), 0xff_ffff);
        assert_eq!(cq_arm(1, CQ_DB_REQ_NOT_SOL, 5), 0x1100_0005);
        assert_eq!(cq_arm_doorbell(0x1000_0005, 0x42), 0x1000_0005_0000_0042);
        assert_eq!(next_bf_offset(0, 256), 256);
        assert_eq!(next_bf_offset(256, 256), 0);
        assert!(use_blueflame(1, 64, 256));
        assert!(!use_blueflame(2, 64, 256));
        assert!(!use_blueflame(1, 320, 256));
        assert!(!use_blueflame(1, 64, 0));
    }
}
