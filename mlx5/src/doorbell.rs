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

/// One arm request of a CQ, as the arm word carries it: `sn << 28 | cmd | ci` (rdma-core
/// `mlx5_arm_cq`, UCX `uct_ib_mlx5dv_arm_cq`). The driver writes the word to
/// `dbrec[CQ_ARM_DB]`, then `cq_arm_doorbell(word, cqn)` as one big-endian 64-bit store to
/// `cq_uar + CQ_DOORBELL`.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct CqArm {
    /// Arm sequence number (2 bits): how many events the CQ has raised, modulo 4.
    pub sn: u32,
    /// Only a solicited (or error) completion raises the event (`MLX5_CQ_DB_REQ_NOT_SOL`).
    pub solicited: bool,
    /// The consumer index (24 bits): entries from here on count for the event.
    pub ci: u32,
}

impl CqArm {
    /// The arm word.
    #[inline]
    pub const fn word(self) -> u32 {
        let cmd = if self.solicited {
            CQ_DB_REQ_NOT_SOL
        } else {
            CQ_DB_REQ_NOT
        };
        cq_arm(self.sn, cmd, self.ci)
    }

    /// Reads an arm word (the command bits other than `MLX5_CQ_DB_REQ_NOT_SOL` are ignored).
    #[inline]
    pub const fn from_word(word: u32) -> CqArm {
        CqArm {
            sn: (word >> 28) & 3,
            solicited: word & CQ_DB_REQ_NOT_SOL != 0,
            ci: word & 0xff_ffff,
        }
    }

    /// The 64-bit doorbell value for CQ `cqn` (stored big-endian).
    #[inline]
    pub const fn doorbell(self, cqn: u32) -> u64 {
        cq_arm_doorbell(self.word(), cqn)
    }
}

/// Splits a CQ doorbell value (host order) into its arm word and CQ number.
#[inline]
pub const fn split_cq_doorbell(db: u64) -> (u32, u32) {
    ((db >> 32) as u32, db as u32 & 0xff_ffff)
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

    #[test]
    fn arm_words_round_trip() {
        let a = CqArm {
            sn: 2,
            solicited: true,
            ci: 0x12_3456,
        };
        assert_eq!(a.word(), 0x2000_0000 | CQ_DB_REQ_NOT_SOL | 0x12_3456);
        assert_eq!(CqArm::from_word(a.word()), a);
        let any = CqArm {
            sn: 3,
            solicited: false,
            ci: 7,
        };
        assert_eq!(any.word(), 0x3000_0007);
        assert_eq!(split_cq_doorbell(any.doorbell(0x81)), (0x3000_0007, 0x81));
        // The sequence number keeps two bits, the consumer index 24.
        assert_eq!(cq_arm(5, CQ_DB_REQ_NOT, 0x1ff_ffff), 0x10ff_ffff);
    }
}
