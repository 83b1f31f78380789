//! User-mode memory registration (UMR) segments: how a memory window is bound or invalidated
//! by a WQE (rdma-core `qp.c` `set_bind_wr`).
//!
//! A bind WQE is: control segment (opcode UMR, `imm` = the window's new rkey) -> [`UmrCtrlSeg`]
//! (48 B) -> [`MkeyContextSeg`] (64 B) -> one [`KlmSeg`] padded to 64 B.

use crate::be::{Be16, Be32, Be64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// `struct mlx5_wqe_umr_ctrl_seg` (48 bytes).
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
pub struct UmrCtrlSeg {
    /// `UMR_CTRL_FLAG_*`.
    pub flags: u8,
    /// Reserved.
    pub rsvd0: [u8; 3],
    /// Size of the translation entries (KLMs) in 16-byte units, rounded up to 64 bytes.
    pub klm_octowords: Be16,
    /// Translation offset (or BSF octowords).
    pub translation_offset: Be16,
    /// Which mkey-context fields this UMR changes (`MKEY_MASK_*`).
    pub mkey_mask: Be64,
    /// Reserved.
    pub rsvd1: [u8; 32],
}

/// UMR flag: translations are inline in the WQE.
pub const UMR_CTRL_FLAG_INLINE: u8 = 1 << 7;
/// UMR flag: the mkey must be free (type-2 bind).
pub const UMR_CTRL_FLAG_CHECK_FREE: u8 = 1 << 5;
/// UMR flag: use the translation offset (spelt `TRNSLATION` in rdma-core).
pub const UMR_CTRL_FLAG_TRANSLATION_OFFSET: u8 = 1 << 4;
/// UMR flag: the mkey must belong to this QP (type-2 invalidate).
pub const UMR_CTRL_FLAG_CHECK_QPN: u8 = 1 << 3;

/// Mkey-mask bit: length.
pub const MKEY_MASK_LEN: u64 = 1 << 0;
/// Mkey-mask bit: start address.
pub const MKEY_MASK_START_ADDR: u64 = 1 << 6;
/// Mkey-mask bit: signature error.
pub const MKEY_MASK_SIG_ERR: u64 = 1 << 9;
/// Mkey-mask bit: BSF enable.
pub const MKEY_MASK_BSF_ENABLE: u64 = 1 << 12;
/// Mkey-mask bit: the key's variant byte.
pub const MKEY_MASK_MKEY: u64 = 1 << 13;
/// Mkey-mask bit: the owning QP (type-2 windows).
pub const MKEY_MASK_QPN: u64 = 1 << 14;
/// Mkey-mask bit: local-write access.
pub const MKEY_MASK_ACCESS_LOCAL_WRITE: u64 = 1 << 18;
/// Mkey-mask bit: remote-read access.
pub const MKEY_MASK_ACCESS_REMOTE_READ: u64 = 1 << 19;
/// Mkey-mask bit: remote-write access.
pub const MKEY_MASK_ACCESS_REMOTE_WRITE: u64 = 1 << 20;
/// Mkey-mask bit: atomic access.
pub const MKEY_MASK_ACCESS_ATOMIC: u64 = 1 << 21;
/// Mkey-mask bit: the free state.
pub const MKEY_MASK_FREE: u64 = 1 << 29;

/// `struct mlx5_wqe_mkey_context_seg` (64 bytes).
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
pub struct MkeyContextSeg {
    /// [`MKEY_CONTEXT_FREE`] when invalidating.
    pub free: u8,
    /// Reserved.
    pub reserved1: u8,
    /// `MKEY_ACCESS_*`.
    pub access_flags: u8,
    /// Reserved (sf).
    pub sf: u8,
    /// `qpn << 8 | key variant byte` (type 2) or `0xffffff00 | variant` (type 1, invalidate).
    pub qpn_mkey: Be32,
    /// Reserved.
    pub reserved2: Be32,
    /// Flags and protection domain.
    pub flags_pd: Be32,
    /// Start address (0 for a zero-based window).
    pub start_addr: Be64,
    /// Length in bytes.
    pub len: Be64,
    /// BSF size.
    pub bsf_octword_size: Be32,
    /// Reserved.
    pub reserved3: [Be32; 4],
    /// Size of translations in octowords.
    pub translations_octword_size: Be32,
    /// Reserved.
    pub reserved4: [u8; 3],
    /// Log2 of the page size.
    pub log_page_size: u8,
    /// Reserved.
    pub reserved: Be32,
}

/// Mkey context: the key is free (invalidated).
pub const MKEY_CONTEXT_FREE: u8 = 1 << 6;
/// Mkey access: atomic.
pub const MKEY_ACCESS_ATOMIC: u8 = 1 << 6;
/// Mkey access: remote write.
pub const MKEY_ACCESS_REMOTE_WRITE: u8 = 1 << 5;
/// Mkey access: remote read.
pub const MKEY_ACCESS_REMOTE_READ: u8 = 1 << 4;
/// Mkey access: local write.
pub const MKEY_ACCESS_LOCAL_WRITE: u8 = 1 << 3;
/// Mkey access: local read.
pub const MKEY_ACCESS_LOCAL_READ: u8 = 1 << 2;

/// `struct mlx5_wqe_umr_klm_seg` (16 bytes): one translation entry.
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
pub struct KlmSeg {
    /// Length in bytes (up to 2 GiB).
    pub byte_count: Be32,
    /// The memory region's lkey.
    pub mkey: Be32,
    /// Start virtual address within the region.
    pub address: Be64,
}

/// KLM octowords of a bind with one KLM: the 16-byte entry padded to 64 bytes.
pub const BIND_KLM_OCTOWORDS: u16 = 4;

/// The largest range one KLM can describe (rdma-core refuses larger binds).
pub const MAX_KLM_BYTES: u64 = 1 << 31;

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::size_of;

    #[test]
    fn sizes() {
        assert_eq!(size_of::<UmrCtrlSeg>(), 48);
        assert_eq!(size_of::<MkeyContextSeg>(), 64);
        assert_eq!(size_of::<KlmSeg>(), 16);
    }
}
