//! Completion-queue entries: the 64-byte CQE, the error CQE, mini-CQEs, and ownership.

use crate::be::{Be16, Be32, Be64};
use crate::syndrome::Syndrome;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// `struct mlx5_cqe64` (64 bytes). Only the fields an RC data path reads are named; the
/// first 32 bytes (Ethernet/tag-matching details) stay raw.
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Copy, Clone, Debug, PartialEq, Eq,
)]
pub struct Cqe64 {
    /// Ethernet, tag-matching and UD fields this crate does not use.
    pub rsvd0: [u8; 32],
    /// SRQ number / user index.
    pub srqn_uidx: Be32,
    /// Immediate data (as it came on the wire), invalidated rkey, or pkey.
    pub imm_inval_pkey: Be32,
    /// Application fields.
    pub app: u8,
    /// Application opcode.
    pub app_op: u8,
    /// Application information.
    pub app_info: Be16,
    /// Bytes transferred (responder: received; requester: read length).
    pub byte_cnt: Be32,
    /// Completion timestamp.
    pub timestamp: Be64,
    /// Requester: `wqe opcode << 24 | qpn`; responder: `qpn`.
    pub sop_drop_qpn: Be32,
    /// Requester: the first block (producer index) of the completed WQE; responder: the
    /// receive-WQE index.
    pub wqe_counter: Be16,
    /// Signature.
    pub signature: u8,
    /// `opcode << 4 | format << 2 | solicited << 1 | owner`.
    pub op_own: u8,
}

/// `struct mlx5_err_cqe` (64 bytes): the same slot as a [`Cqe64`] when the opcode is
/// [`CqeOpcode::ReqErr`] or [`CqeOpcode::RespErr`].
#[repr(C)]
#[derive(
    FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Copy, Clone, Debug, PartialEq, Eq,
)]
pub struct ErrCqe {
    /// Reserved.
    pub rsvd0: [u8; 32],
    /// SRQ number.
    pub srqn: Be32,
    /// Reserved (rdma-core's header keeps all 18 bytes reserved).
    pub rsvd1: [u8; 16],
    /// Hardware syndrome (kernel `include/linux/mlx5/device.h`; reserved in `mlx5dv.h`).
    pub hw_err_synd: u8,
    /// Hardware syndrome type (kernel header; reserved in `mlx5dv.h`).
    pub hw_synd_type: u8,
    /// Vendor syndrome: a device-specific detail of the error.
    pub vendor_err_synd: u8,
    /// The IB syndrome ([`Syndrome`]).
    pub syndrome: u8,
    /// `send-WQE opcode << 24 | qpn`.
    pub s_wqe_opcode_qpn: Be32,
    /// The first block of the failed WQE.
    pub wqe_counter: Be16,
    /// Signature.
    pub signature: u8,
    /// As in [`Cqe64::op_own`].
    pub op_own: u8,
}

impl Default for Cqe64 {
    fn default() -> Self {
        <Cqe64 as zerocopy::FromZeros>::new_zeroed()
    }
}
impl Default for ErrCqe {
    fn default() -> Self {
        <ErrCqe as zerocopy::FromZeros>::new_zeroed()
    }
}

/// CQE opcode: bits 7:4 of `op_own`.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
#[non_exhaustive]
pub enum CqeOpcode {
    /// A send WQE completed.
    Req = 0,
    /// A write with immediate arrived (consumed a receive WQE).
    RespWrImm = 1,
    /// A send arrived.
    RespSend = 2,
    /// A send with immediate arrived.
    RespSendImm = 3,
    /// A send with invalidate arrived.
    RespSendInv = 4,
    /// The CQ was resized.
    ResizeCq = 5,
    /// Signature error.
    SigErr = 12,
    /// A send WQE failed (or was flushed).
    ReqErr = 13,
    /// A receive WQE failed (or was flushed).
    RespErr = 14,
    /// Not written by hardware yet (the initial state of every CQE).
    Invalid = 15,
}

impl CqeOpcode {
    /// The opcode of this 4-bit value, if defined.
    pub const fn from_bits(v: u8) -> Option<CqeOpcode> {
        Some(match v {
            0 => CqeOpcode::Req,
            1 => CqeOpcode::RespWrImm,
            2 => CqeOpcode::RespSend,
            3 => CqeOpcode::RespSendImm,
            4 => CqeOpcode::RespSendInv,
            5 => CqeOpcode::ResizeCq,
            12 => CqeOpcode::SigErr,
            13 => CqeOpcode::ReqErr,
            14 => CqeOpcode::RespErr,
            15 => CqeOpcode::Invalid,
            _ => return None,
        })
    }
}

/// CQE format: bits 3:2 of `op_own`.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum CqeFormat {
    /// No inline data.
    Plain = 0,
    /// Up to 32 bytes of received data inline in the CQE.
    InlineScatter32 = 1,
    /// Up to 64 bytes of received data inline in the (128-byte) CQE.
    InlineScatter64 = 2,
    /// A compressed block of mini-CQEs.
    Compressed = 3,
}

/// `op_own` owner bit.
pub const OWNER_MASK: u8 = 1;
/// `op_own` solicited bit.
pub const SOLICITED_MASK: u8 = 1 << 1;

/// Builds an `op_own` byte.
#[inline(always)]
pub const fn op_own(opcode: CqeOpcode, format: CqeFormat, solicited: bool, owner: bool) -> u8 {
    ((opcode as u8) << 4) | ((format as u8) << 2) | ((solicited as u8) << 1) | owner as u8
}

/// The owner bit that marks a CQE as software's on pass `ci / cqe_cnt`: it flips every
/// time the consumer index wraps the ring (`cqe_cnt` is a power of two).
#[inline(always)]
pub const fn sw_owner(ci: u32, cqe_cnt: u32) -> u8 {
    (ci & cqe_cnt != 0) as u8
}

/// Whether the CQE with this `op_own` at consumer index `ci` belongs to software: its
/// opcode is not [`CqeOpcode::Invalid`] and its owner bit matches the pass.
#[inline(always)]
pub const fn is_sw_owned(op_own: u8, ci: u32, cqe_cnt: u32) -> bool {
    (op_own >> 4) != CqeOpcode::Invalid as u8 && (op_own & OWNER_MASK) == sw_owner(ci, cqe_cnt)
}

/// The offset of the 64-byte CQE inside a CQ slot: with 128-byte CQEs it is the second half.
#[inline(always)]
pub const fn cqe64_offset(cqe_size: usize) -> usize {
    cqe_size - 64
}

impl Cqe64 {
    /// The CQE opcode, if defined.
    #[inline(always)]
    pub fn opcode(&self) -> Option<CqeOpcode> {
        CqeOpcode::from_bits(self.op_own >> 4)
    }
    /// The CQE format.
    #[inline]
    pub fn format(&self) -> CqeFormat {
        match (self.op_own >> 2) & 3 {
            0 => CqeFormat::Plain,
            1 => CqeFormat::InlineScatter32,
            2 => CqeFormat::InlineScatter64,
            _ => CqeFormat::Compressed,
        }
    }
    /// The owner bit.
    #[inline(always)]
    pub fn owner(&self) -> u8 {
        self.op_own & OWNER_MASK
    }
    /// The solicited-event bit.
    #[inline]
    pub fn solicited(&self) -> bool {
        self.op_own & SOLICITED_MASK != 0
    }
    /// The QP number.
    #[inline(always)]
    pub fn qpn(&self) -> u32 {
        self.sop_drop_qpn.get() & 0xff_ffff
    }
    /// Requester CQE: the send-WQE opcode of the completed WQE.
    #[inline(always)]
    pub fn wqe_opcode(&self) -> u8 {
        (self.sop_drop_qpn.get() >> 24) as u8
    }
    /// View this entry as an error CQE.
    #[inline]
    pub fn as_err(&self) -> &ErrCqe {
        zerocopy::transmute_ref!(self)
    }
}

impl ErrCqe {
    /// The syndrome, decoded.
    #[inline]
    pub fn syndrome(&self) -> Syndrome {
        Syndrome::from_u8(self.syndrome)
    }
    /// The QP number.
    #[inline]
    pub fn qpn(&self) -> u32 {
        self.s_wqe_opcode_qpn.get() & 0xff_ffff
    }
    /// The send-WQE opcode of the failed WQE.
    #[inline]
    pub fn wqe_opcode(&self) -> u8 {
        (self.s_wqe_opcode_qpn.get() >> 24) as u8
    }
}

/// `struct mlx5_mini_cqe8` (kernel `include/linux/mlx5/device.h`; UCX unzips the same
/// layout): one 8-byte entry of a compressed CQE block, 8 entries per 64-byte block.
///
/// blueflame never enables CQE compression (it is opt-in at CQ creation); the format is here
/// so that a compressed CQE is recognised and reported, not misread.
#[repr(C)]
#[derive(
    FromBytes,
    IntoBytes,
    KnownLayout,
    Immutable,
    Unaligned,
    Copy,
    Clone,
    Debug,
    Default,
    PartialEq,
    Eq,
)]
pub struct MiniCqe8 {
    /// Requester: WQE counter; responder: checksum or hash (first half).
    pub wqe_counter_or_csum: Be16,
    /// Requester: send-WQE opcode; responder: rest of the hash / stride index.
    pub s_wqe_opcode: u8,
    /// Reserved.
    pub reserved: u8,
    /// Bytes transferred.
    pub byte_cnt: Be32,
}

/// Mini-CQEs in one 64-byte compressed block.
pub const MINI_CQES_PER_BLOCK: usize = 8;

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::size_of;

    #[test]
    fn sizes() {
        assert_eq!(size_of::<Cqe64>(), 64);
        assert_eq!(size_of::<ErrCqe>(), 64);
        assert_eq!(size_of::<MiniCqe8>(), 8);
    }

    #[test]
    fn ownership_flips_each_pass() {
        let cnt = 8;
        let mine_first_pass = op_own(CqeOpcode::Req, CqeFormat::Plain, false, false);
        assert!(is_sw_owned(mine_first_pass, 3, cnt));
        assert!(!is_sw_owned(mine_first_pass, 3 + cnt, cnt));
        let mine_second_pass = mine_first_pass | 1;
        assert!(is_sw_owned(mine_second_pass, 9, cnt));
        // A never-written CQE (opcode INVALID) is never software's, whatever the owner bit.
        assert!(!is_sw_owned(0xf0, 0, cnt));
        assert!(!is_sw_owned(0xf1, 8, cnt));
    }

    #[test]
    fn op_own_fields() {
        let mut c = Cqe64 {
            op_own: op_own(
                CqeOpcode::RespSendImm,
                CqeFormat::InlineScatter32,
                true,
                true,
            ),
            ..Cqe64::default()
        };
        assert_eq!(c.opcode(), Some(CqeOpcode::RespSendImm));
        assert_eq!(c.format(), CqeFormat::InlineScatter32);
        assert!(c.solicited());
        assert_eq!(c.owner(), 1);
        c.sop_drop_qpn = Be32::new(0x0812_3456);
        assert_eq!((c.wqe_opcode(), c.qpn()), (0x08, 0x12_3456));
        assert_eq!(cqe64_offset(128), 64);
    }
}
