//! Send-WQE opcodes (`MLX5_OPCODE_*`) and opcode modifiers.

/// The opcode in the low byte of a control segment's `opmod_idx_opcode`.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
#[non_exhaustive]
pub enum Opcode {
    /// No operation: consumes ring space, may still request a completion.
    Nop = 0x00,
    /// Send with invalidate: the responder invalidates the rkey in `imm`.
    SendInval = 0x01,
    /// RDMA write.
    RdmaWrite = 0x08,
    /// RDMA write with 32-bit immediate.
    RdmaWriteImm = 0x09,
    /// Send.
    Send = 0x0a,
    /// Send with 32-bit immediate.
    SendImm = 0x0b,
    /// RDMA read.
    RdmaRead = 0x10,
    /// 64-bit atomic compare-and-swap.
    AtomicCs = 0x11,
    /// 64-bit atomic fetch-and-add.
    AtomicFa = 0x12,
    /// Masked (extended) compare-and-swap, 32 or 64 bits.
    AtomicMaskedCs = 0x14,
    /// Masked (extended) fetch-and-add, 32 or 64 bits.
    AtomicMaskedFa = 0x15,
    /// Local invalidate of an mkey.
    LocalInval = 0x1b,
    /// User-mode memory registration: memory-window bind and invalidate.
    Umr = 0x25,
}

impl Opcode {
    /// Every opcode this crate encodes, for tables and tests.
    pub const ALL: [Opcode; 13] = [
        Opcode::Nop,
        Opcode::SendInval,
        Opcode::RdmaWrite,
        Opcode::RdmaWriteImm,
        Opcode::Send,
        Opcode::SendImm,
        Opcode::RdmaRead,
        Opcode::AtomicCs,
        Opcode::AtomicFa,
        Opcode::AtomicMaskedCs,
        Opcode::AtomicMaskedFa,
        Opcode::LocalInval,
        Opcode::Umr,
    ];

    /// The opcode with this hardware value, if this crate knows it.
    pub const fn from_u8(v: u8) -> Option<Opcode> {
        Some(match v {
            0x00 => Opcode::Nop,
            0x01 => Opcode::SendInval,
            0x08 => Opcode::RdmaWrite,
            0x09 => Opcode::RdmaWriteImm,
            0x0a => Opcode::Send,
            0x0b => Opcode::SendImm,
            0x10 => Opcode::RdmaRead,
            0x11 => Opcode::AtomicCs,
            0x12 => Opcode::AtomicFa,
            0x14 => Opcode::AtomicMaskedCs,
            0x15 => Opcode::AtomicMaskedFa,
            0x1b => Opcode::LocalInval,
            0x25 => Opcode::Umr,
            _ => return None,
        })
    }
}

/// Opcode modifier of a masked atomic: `0x08 | (log2(operand bytes) - 2)` (UCX
/// `UCT_IB_MLX5_OPMOD_EXT_ATOMIC`): 0x08 for 32-bit operands, 0x09 for 64-bit.
pub const fn masked_atomic_opmod(operand_bytes: u32) -> u8 {
    0x08 | (operand_bytes.trailing_zeros() as u8 - 2)
}

/// The operand size in bytes of a masked atomic with this opcode modifier, if valid.
pub const fn masked_atomic_size(opmod: u8) -> Option<u32> {
    match opmod {
        0x08 => Some(4),
        0x09 => Some(8),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn from_u8_inverts_every_opcode() {
        for op in Opcode::ALL {
            assert_eq!(Opcode::from_u8(op as u8), Some(op));
        }
        assert_eq!(Opcode::from_u8(0x0e), None);
    }

    #[test]
    fn masked_opmods() {
        assert_eq!(masked_atomic_opmod(4), 0x08);
        assert_eq!(masked_atomic_opmod(8), 0x09);
        assert_eq!(masked_atomic_size(0x09), Some(8));
        assert_eq!(masked_atomic_size(0x0a), None);
    }
}
