//! The 16-byte segments that follow the control segment: remote address, data (scatter /
//! gather entry), inline header, atomics and masked atomics.

use crate::be::{Be32, Be64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// The size of one data segment ("DS", octoword): the unit of a WQE's size.
pub const DS_BYTES: usize = 16;

/// `struct mlx5_wqe_raddr_seg`: the remote buffer of a write, read or atomic.
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
pub struct RaddrSeg {
    /// Remote virtual address.
    pub raddr: Be64,
    /// Remote key.
    pub rkey: Be32,
    /// Reserved, zero.
    pub reserved: Be32,
}

/// `struct mlx5_wqe_data_seg`: one gather (send) or scatter (receive) entry.
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
pub struct DataSeg {
    /// Length in bytes (0 means 2 GiB on the hardware; this crate never posts 0 on send).
    pub byte_count: Be32,
    /// Local key of the region holding the buffer.
    pub lkey: Be32,
    /// Virtual address.
    pub addr: Be64,
}

/// `struct mlx5_wqe_inl_data_seg`: the 4-byte header before inline payload.
///
/// The header declares the field as a plain `uint32_t` but rdma-core stores
/// `htobe32(len | MLX5_INLINE_SEG)` in it: big-endian on the wire.
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
pub struct InlineHeader {
    /// `len | MLX5_INLINE_SEG`.
    pub byte_count: Be32,
}

/// The flag that marks a segment as inline data (`MLX5_INLINE_SEG`).
pub const INLINE_SEG: u32 = 0x8000_0000;

/// Bytes of inline header.
pub const INLINE_HEADER_BYTES: usize = 4;

/// DS units taken by `len` bytes of inline data with its header: `ceil((len + 4) / 16)`.
#[inline(always)]
pub const fn inline_ds(len: usize) -> usize {
    (len + INLINE_HEADER_BYTES).div_ceil(DS_BYTES)
}

/// `struct mlx5_wqe_atomic_seg`: operands of compare-swap and fetch-add.
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
pub struct AtomicSeg {
    /// The value to swap in (compare-swap) or to add (fetch-add).
    pub swap_add: Be64,
    /// The value to compare with (compare-swap); zero for fetch-add.
    pub compare: Be64,
}

/// Masked compare-swap on 32-bit operands: one 16-byte segment (UCX
/// `uct_ib_mlx5_atomic_masked_cswap32_seg_t`).
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
pub struct MaskedCs32Seg {
    /// Value to swap in, under `swap_mask`.
    pub swap: Be32,
    /// Value to compare with, under `compare_mask`.
    pub compare: Be32,
    /// Bits of `swap` that are written.
    pub swap_mask: Be32,
    /// Bits that take part in the comparison.
    pub compare_mask: Be32,
}

/// Masked fetch-add on 32-bit operands (UCX `uct_ib_mlx5_atomic_masked_fadd32_seg_t`).
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
pub struct MaskedFa32Seg {
    /// The addend.
    pub add: Be32,
    /// Field boundaries: a set bit stops the carry out of that bit.
    pub field_boundary: Be32,
    /// Reserved, zero.
    pub reserved: [Be32; 2],
}

/// First half of a 64-bit masked compare-swap: the operands (the second half is
/// [`MaskedCs64MaskSeg`]).
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
pub struct MaskedCs64Seg {
    /// Value to swap in, under the swap mask.
    pub swap: Be64,
    /// Value to compare with, under the compare mask.
    pub compare: Be64,
}

/// Second half of a 64-bit masked compare-swap: the masks.
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
pub struct MaskedCs64MaskSeg {
    /// Bits of `swap` that are written.
    pub swap_mask: Be64,
    /// Bits that take part in the comparison.
    pub compare_mask: Be64,
}

/// Masked fetch-add on 64-bit operands (UCX `uct_ib_mlx5_atomic_masked_fadd64_seg_t`).
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
pub struct MaskedFa64Seg {
    /// The addend.
    pub add: Be64,
    /// Field boundaries: a set bit stops the carry out of that bit.
    pub field_boundary: Be64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::size_of;

    #[test]
    fn every_segment_is_one_ds() {
        assert_eq!(size_of::<RaddrSeg>(), DS_BYTES);
        assert_eq!(size_of::<DataSeg>(), DS_BYTES);
        assert_eq!(size_of::<AtomicSeg>(), DS_BYTES);
        assert_eq!(size_of::<MaskedCs32Seg>(), DS_BYTES);
        assert_eq!(size_of::<MaskedFa32Seg>(), DS_BYTES);
        assert_eq!(size_of::<MaskedCs64Seg>(), DS_BYTES);
        assert_eq!(size_of::<MaskedCs64MaskSeg>(), DS_BYTES);
        assert_eq!(size_of::<MaskedFa64Seg>(), DS_BYTES);
    }

    #[test]
    fn inline_ds_counts_the_header() {
        assert_eq!(inline_ds(0), 1);
        assert_eq!(inline_ds(12), 1);
        assert_eq!(inline_ds(13), 2);
        assert_eq!(inline_ds(28), 2);
        assert_eq!(inline_ds(29), 3);
    }
}
