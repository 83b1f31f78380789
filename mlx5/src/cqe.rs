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
    /// The title of a compressed session ([`CqeFormat::Compressed`]): how many completions
    /// the session holds (its `byte_cnt`, DPDK's `zip->cqe_cnt`), which is also how many
    /// ring slots it takes, title included.
    #[inline]
    pub fn session_len(&self) -> u32 {
        self.byte_cnt.get()
    }
    /// View this entry as an error CQE.
    #[inline]
    pub fn as_err(&self) -> &ErrCqe {
        zerocopy::transmute_ref!(self)
    }
    /// Responder CQE of a UD (or DC) receive: `flags_rqpn` (bytes 24..28 of the leading
    /// union), `sl << 24 | grh << 28 | source qpn` on InfiniBand (rdma-core `cq.c`
    /// `handle_responder`).
    #[inline]
    pub fn flags_rqpn(&self) -> u32 {
        let b = &self.rsvd0[FLAGS_RQPN_OFFSET..FLAGS_RQPN_OFFSET + 4];
        u32::from_be_bytes([b[0], b[1], b[2], b[3]])
    }
    /// A responder CQE's sender: its QP number ([`Cqe64::src_qpn`]) and whether a GRH came
    /// ([`Cqe64::grh_present`]); `(0, false)` where the CQE's first 32 bytes hold the
    /// message ([`CqeFormat::InlineScatter32`]: bytes 24..28 are payload there, not
    /// `flags_rqpn`; a UD receive, whose count includes the GRH's 40 bytes, never comes
    /// so).
    #[inline(always)]
    pub fn sender(&self) -> (u32, bool) {
        if (self.op_own >> 2) & 3 == CqeFormat::InlineScatter32 as u8 {
            return (0, false);
        }
        let f = self.flags_rqpn();
        (f & 0xff_ffff, (f >> 28) & 3 != 0)
    }
    /// The source QP number of a UD receive (`flags_rqpn & 0xffffff`).
    #[inline]
    pub fn src_qpn(&self) -> u32 {
        self.flags_rqpn() & 0xff_ffff
    }
    /// Whether the received packet carried a GRH (`(flags_rqpn >> 28) & 3` non-zero; its
    /// 40 bytes are then at the start of the receive buffer).
    #[inline]
    pub fn grh_present(&self) -> bool {
        (self.flags_rqpn() >> 28) & 3 != 0
    }
    /// The sender's service level (`(flags_rqpn >> 24) & 0xf`, InfiniBand).
    #[inline]
    pub fn sl(&self) -> u8 {
        ((self.flags_rqpn() >> 24) & 0xf) as u8
    }
    /// The source LID (`slid`).
    #[inline]
    pub fn slid(&self) -> u16 {
        u16::from_be_bytes([self.rsvd0[SLID_OFFSET], self.rsvd0[SLID_OFFSET + 1]])
    }
    /// The destination LID path bits (`ml_path & 0x7f`).
    #[inline]
    pub fn dlid_path_bits(&self) -> u8 {
        self.rsvd0[ML_PATH_OFFSET] & 0x7f
    }
    /// Writes the UD responder fields: `flags_rqpn = sl << 24 | grh << 28 | src_qpn`,
    /// `slid`, `ml_path` (as a NIC writes them).
    #[inline]
    pub fn set_ud_fields(&mut self, src_qpn: u32, sl: u8, grh: bool, slid: u16, path_bits: u8) {
        let f = (u32::from(grh) << 28) | (u32::from(sl & 0xf) << 24) | (src_qpn & 0xff_ffff);
        self.rsvd0[FLAGS_RQPN_OFFSET..FLAGS_RQPN_OFFSET + 4].copy_from_slice(&f.to_be_bytes());
        self.rsvd0[SLID_OFFSET..SLID_OFFSET + 2].copy_from_slice(&slid.to_be_bytes());
        self.rsvd0[ML_PATH_OFFSET] = path_bits & 0x7f;
    }
}

/// Offset of `ml_path` in `struct mlx5_cqe64` (inside the leading union).
pub const ML_PATH_OFFSET: usize = 17;
/// Offset of `slid` in `struct mlx5_cqe64`.
pub const SLID_OFFSET: usize = 22;
/// Offset of `flags_rqpn` in `struct mlx5_cqe64`.
pub const FLAGS_RQPN_OFFSET: usize = 24;

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
    /// Whether this is a page fault in an SRQ WQE of on-demand memory (rdma-core `cq.c`
    /// `is_odp_pfault_err`): REMOTE_ABORTED with vendor syndrome
    /// [`VENDOR_ODP_PAGE_FAULT`]. Not an error of the receive: the device moved past the
    /// WQE and the driver posts it again (`srq.c` `mlx5_complete_odp_fault`).
    #[inline]
    pub fn is_odp_page_fault(&self) -> bool {
        self.syndrome == Syndrome::RemoteAborted.to_u8()
            && self.vendor_err_synd == VENDOR_ODP_PAGE_FAULT
    }
}

/// The vendor syndrome of a page fault in an SRQ WQE (rdma-core
/// `MLX5_CQE_VENDOR_SYNDROME_ODP_PFAULT`).
pub const VENDOR_ODP_PAGE_FAULT: u8 = 0x93;

/// `struct mlx5_mini_cqe8` (kernel `include/linux/mlx5/device.h`, DPDK `mlx5_prm.h`; UCX
/// reads the requester view): one 8-byte entry of a mini-CQE array, 8 entries per 64-byte
/// CQE slot. rdma-core 44's `mlx5dv.h` does not declare it.
///
/// The first 4 bytes depend on the side: a requester's carry the completed WQE's counter and
/// send opcode; a responder's carry what the CQ's [`MiniCqeFormat`] names (RSS hash result,
/// checksum or stride index), never the WQE counter (receives of a session are consecutive:
/// the title's counter plus the mini-CQE's index).
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
    /// Requester: WQE counter; responder: checksum, stride index or the first half of the
    /// hash.
    pub wqe_counter_or_csum: Be16,
    /// Requester: send-WQE opcode; responder: part of the hash.
    pub s_wqe_opcode: u8,
    /// Reserved (responder: last byte of the hash).
    pub reserved: u8,
    /// Bytes transferred.
    pub byte_cnt: Be32,
}

impl MiniCqe8 {
    /// Responder, [`MiniCqeFormat::Hash`]: the RSS hash result (first 4 bytes).
    #[inline]
    pub fn rx_hash_result(&self) -> u32 {
        (self.wqe_counter_or_csum.get() as u32) << 16
            | (self.s_wqe_opcode as u32) << 8
            | self.reserved as u32
    }
}

/// Mini-CQEs in one 64-byte compressed block (`MLX5_MINI_ARR_SIZE` in rdma-core's
/// `mlx5.h`, DPDK's arrays of 8).
pub const MINI_CQES_PER_BLOCK: usize = 8;

/// `enum mlx5dv_cqe_comp_res_format`: what a responder's mini-CQE carries besides the byte
/// count (`mlx5dv_cq_init_attr.cqe_comp_res_format`). Requester mini-CQEs always carry the
/// WQE counter and send opcode.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum MiniCqeFormat {
    /// `MLX5DV_CQE_RES_FORMAT_HASH`: the RSS hash result.
    Hash = 1 << 0,
    /// `MLX5DV_CQE_RES_FORMAT_CSUM`: the receive checksum.
    Csum = 1 << 1,
    /// `MLX5DV_CQE_RES_FORMAT_CSUM_STRIDX`: the checksum and stride index.
    CsumStridx = 1 << 2,
}

impl MiniCqeFormat {
    /// Every format.
    pub const ALL: [MiniCqeFormat; 3] = [
        MiniCqeFormat::Hash,
        MiniCqeFormat::Csum,
        MiniCqeFormat::CsumStridx,
    ];

    /// The `mlx5dv_cqe_comp_res_format` bit.
    #[inline]
    pub const fn bit(self) -> u32 {
        self as u32
    }

    /// rdma-core's name of the format.
    pub const fn name(self) -> &'static str {
        match self {
            MiniCqeFormat::Hash => "MLX5DV_CQE_RES_FORMAT_HASH",
            MiniCqeFormat::Csum => "MLX5DV_CQE_RES_FORMAT_CSUM",
            MiniCqeFormat::CsumStridx => "MLX5DV_CQE_RES_FORMAT_CSUM_STRIDX",
        }
    }
}

impl core::fmt::Display for MiniCqeFormat {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.name())
    }
}

/// `MLX5DV_CQ_INIT_ATTR_MASK_COMPRESSED_CQE`: `mlx5dv_cq_init_attr.comp_mask` bit that asks
/// `mlx5dv_create_cq` for a compressing CQ.
pub const CQ_INIT_ATTR_MASK_COMPRESSED_CQE: u64 = 1 << 0;
/// `MLX5DV_CONTEXT_MASK_CQE_COMPRESION` (sic): `mlx5dv_context.comp_mask` bit asking
/// `mlx5dv_query_device` for `cqe_comp_caps`.
pub const CONTEXT_MASK_CQE_COMPRESSION: u64 = 1 << 0;
/// `MLX5DV_CONTEXT_FLAGS_CQE_128B_COMP`: `mlx5dv_context.flags` bit, the device compresses
/// 128-byte CQEs too.
pub const CONTEXT_FLAGS_CQE_128B_COMP: u64 = 1 << 4;

/// `struct mlx5dv_cqe_comp_caps`: what `mlx5dv_query_device` reports of CQE compression.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct CqeCompCaps {
    /// The most CQEs the device puts in one compressed session (0: no compression).
    pub max_num: u32,
    /// The [`MiniCqeFormat`] bits it supports.
    pub supported_format: u32,
    /// Whether it compresses 128-byte CQEs ([`CONTEXT_FLAGS_CQE_128B_COMP`]).
    pub cqe_128: bool,
}

impl CqeCompCaps {
    /// Whether a CQ of `cqe_size`-byte entries compressing with `format` can be created:
    /// rdma-core's `create_cq` test (`max_num` not 0 and the format bit supported), and for
    /// 128-byte entries the 128-byte flag.
    pub const fn supports(&self, format: MiniCqeFormat, cqe_size: u32) -> bool {
        self.max_num != 0
            && self.supported_format & format.bit() != 0
            && (cqe_size != 128 || self.cqe_128)
    }
}

/// The slot (counted from the title's) of the mini-CQE array that holds mini-CQE `j` of a
/// compressed session: the first array follows the title, the next ones start every 8 slots
/// from the title (DPDK `mlx5_rx_poll_len`: "the second one is located 7 CQEs after the
/// initial CQE instead of 8 for subsequent ones"). The slots in between are holes the device
/// leaves alone.
#[inline]
pub const fn mini_array_slot(j: u32) -> u32 {
    if j < MINI_CQES_PER_BLOCK as u32 {
        1
    } else {
        j & !(MINI_CQES_PER_BLOCK as u32 - 1)
    }
}

/// The `op_own` a poller writes into each slot of a consumed session after the title (DPDK
/// `MLX5_CQE_INVALIDATE`: opcode INVALID), with the owner bit of the slot's current pass, so
/// that the slot looks like the device's on the next pass until the device writes it: the
/// device writes nothing into holes, and an array's `op_own` byte is mini-CQE data.
#[inline]
pub const fn invalidated_op_own(ci: u32, cqe_cnt: u32) -> u8 {
    ((CqeOpcode::Invalid as u8) << 4) | sw_owner(ci, cqe_cnt)
}

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
    fn mini_arrays_follow_the_title_then_every_8_slots() {
        let slots: Vec<u32> = (0..25).map(mini_array_slot).collect();
        assert_eq!(&slots[..8], &[1; 8]);
        assert_eq!(&slots[8..16], &[8; 8]);
        assert_eq!(&slots[16..24], &[16; 8]);
        assert_eq!(slots[24], 24);
        // Every array lies inside its session (a session of n takes n slots).
        for n in 2..200u32 {
            assert!((0..n).all(|j| mini_array_slot(j) < n), "n = {n}");
        }
        // Invalidation: opcode INVALID, and the device's owner bit on the next pass.
        let cnt = 16;
        for ci in [0u32, 5, 16, 21, 33] {
            let b = invalidated_op_own(ci, cnt);
            assert_eq!(b >> 4, CqeOpcode::Invalid as u8);
            assert!(!is_sw_owned(b, ci + cnt, cnt), "ci = {ci}");
            assert_eq!(b & 1, sw_owner(ci, cnt));
        }
    }

    #[test]
    fn compression_caps_follow_rdma_core() {
        let caps = CqeCompCaps {
            max_num: 64,
            supported_format: MiniCqeFormat::Hash.bit() | MiniCqeFormat::Csum.bit(),
            cqe_128: false,
        };
        assert!(caps.supports(MiniCqeFormat::Hash, 64));
        assert!(caps.supports(MiniCqeFormat::Csum, 64));
        assert!(!caps.supports(MiniCqeFormat::CsumStridx, 64));
        assert!(!caps.supports(MiniCqeFormat::Hash, 128));
        let none = CqeCompCaps { max_num: 0, ..caps };
        assert!(!none.supports(MiniCqeFormat::Hash, 64));
        let m = MiniCqe8 {
            wqe_counter_or_csum: Be16::new(0x1234),
            s_wqe_opcode: 0x56,
            reserved: 0x78,
            byte_cnt: Be32::new(9),
        };
        assert_eq!(m.rx_hash_result(), 0x1234_5678);
        assert_eq!(
            MiniCqeFormat::CsumStridx.to_string(),
            "MLX5DV_CQE_RES_FORMAT_CSUM_STRIDX"
        );
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
