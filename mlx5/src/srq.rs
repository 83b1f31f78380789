//! Shared receive queues (SRQ): the receive WQE of an SRQ and the ring that links them.
//!
//! An SRQ WQE is a 16-byte "next" segment (`struct mlx5_wqe_srq_next_seg`: the index of the
//! WQE after it, a signature byte) followed by data segments, terminated by an invalid-lkey
//! entry when shorter than the stride, as a plain receive WQE (rdma-core `srq.c`
//! `mlx5_post_srq_recv`). The WQEs form a linked list through `next_wqe_index`: the device
//! takes the WQE at its head, then moves to that WQE's `next_wqe_index`; the driver fills
//! the WQE at its own head and moves the same way, and gives a completed WQE back by
//! linking it after the list's tail (rdma-core `mlx5_free_srq_wqe` in the versions before
//! the bitmap, UCX `uct_rc_mlx5_iface_srq_post_recv` "linked list" topology). The tail is
//! never posted: an SRQ of `n` entries holds at most `n - 1` receives (rdma-core allocates
//! `max_wr + 1`). The doorbell record holds the number of WQEs posted so far (16 bits).

use crate::be::Be16;
use crate::recv::{decode_recv, encode_recv};
use crate::request::Sge;
use crate::seg::DS_BYTES;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// `struct mlx5_wqe_srq_next_seg`: the head of every SRQ WQE.
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
pub struct SrqNextSeg {
    /// Reserved.
    pub rsvd0: [u8; 2],
    /// The index of the WQE after this one in the list.
    pub next_wqe_index: Be16,
    /// WQE signature (0: signatures are off).
    pub signature: u8,
    /// Reserved.
    pub rsvd1: [u8; 11],
}

/// Bytes of the next segment at the start of every SRQ WQE.
pub const NEXT_SEG_BYTES: usize = 16;

/// The stride of an SRQ whose WQEs hold `max_sge` scatter entries: the next segment and
/// the entries, at least 32 bytes, rounded up to a power of two (rdma-core
/// `mlx5_alloc_srq_buf`). `None` when it would pass 512 bytes (31 entries).
pub const fn srq_stride(max_sge: u32) -> Option<u32> {
    if max_sge > 31 {
        return None;
    }
    let size = NEXT_SEG_BYTES as u32 + max_sge * DS_BYTES as u32;
    let size = if size < 32 { 32 } else { size };
    Some(size.next_power_of_two())
}

/// The scatter entries a WQE of `stride` bytes holds (rdma-core recomputes `max_gs` from the
/// rounded stride).
pub const fn srq_max_sge(stride: u32) -> u32 {
    (stride - NEXT_SEG_BYTES as u32) / DS_BYTES as u32
}

/// The SRQ ring's entries for `max_wr` receives: one more (the tail is never posted),
/// rounded up to a power of two (rdma-core `mlx5_alloc_srq_buf` without its wait queue).
pub const fn srq_entries(max_wr: u32) -> u32 {
    (max_wr + 1).next_power_of_two()
}

/// The `next_wqe_index` of the WQE in `entry`.
pub fn next_index(entry: &[u8]) -> u16 {
    u16::from_be_bytes([entry[2], entry[3]])
}

/// Sets the `next_wqe_index` of the WQE in `entry` (the rest of it unchanged).
pub fn set_next_index(entry: &mut [u8], next: u16) {
    entry[2..4].copy_from_slice(Be16::new(next).as_bytes());
}

/// Links every WQE of a fresh ring of `stride`-byte entries to the one after it (the last
/// to index `cnt`, which is never reached: the tail is never posted), as rdma-core's
/// `set_srq_buf_ll`.
pub fn init_links(ring: &mut [u8], stride: usize) {
    for (i, entry) in ring.chunks_exact_mut(stride).enumerate() {
        let next = SrqNextSeg {
            next_wqe_index: Be16::new((i + 1) as u16),
            ..SrqNextSeg::default()
        };
        entry[..NEXT_SEG_BYTES].copy_from_slice(next.as_bytes());
    }
}

/// Writes the scatter list of one SRQ WQE (`sgl`, zero-length entries skipped) after the
/// next segment of `entry` (the stride bytes), which it leaves as it is. Returns the number
/// of entries written, or `None` if they do not fit.
#[inline]
pub fn encode_srq_recv(sgl: &[Sge], entry: &mut [u8]) -> Option<usize> {
    encode_recv(sgl, entry.get_mut(NEXT_SEG_BYTES..)?)
}

/// Copies the scatter entries of SRQ WQE `src` into `dst` (both `stride` bytes), leaving
/// `dst`'s next segment as it is: a page-faulted WQE posted again at the head (rdma-core
/// `srq.c` `srq_repost`, which copies up to the invalid-lkey terminator; the rest of the
/// stride is never read).
pub fn copy_srq_data(src: &[u8], dst: &mut [u8]) {
    let n = src.len().min(dst.len());
    if n > NEXT_SEG_BYTES {
        dst[NEXT_SEG_BYTES..n].copy_from_slice(&src[NEXT_SEG_BYTES..n]);
    }
}

/// Reads one SRQ WQE: its `next_wqe_index`, and its entries into `out` (how many).
pub fn decode_srq_recv(entry: &[u8], out: &mut [Sge]) -> (u16, usize) {
    let n = entry
        .get(NEXT_SEG_BYTES..)
        .map_or(0, |rest| decode_recv(rest, out));
    (next_index(entry), n)
}

/// The rings and registers of one SRQ: the fields `mlx5dv_init_obj(MLX5DV_OBJ_SRQ)`
/// returns (`struct mlx5dv_srq`), with the entry count and scatter limit from the SRQ's
/// creation.
#[derive(Copy, Clone, Debug)]
pub struct RawSrq {
    /// SRQ number.
    pub srqn: u32,
    /// The ring: `wqe_cnt` WQEs of `stride` bytes; those from `head` to `tail` linked as
    /// [`init_links`] does (the list), the rest, past `tail`, spare (rdma-core's wait queue).
    pub buf: *mut u8,
    /// WQEs in the ring (a power of two; the list's, or more with spares).
    pub wqe_cnt: u32,
    /// Bytes per WQE (a power of two, at least 32).
    pub stride: u32,
    /// The doorbell record: WQEs posted so far (16 bits, big-endian).
    pub dbrec: *mut u32,
    /// The index of the first WQE the device will take.
    pub head: u32,
    /// The index of the last WQE of the list (never posted): with `head` 0, the list holds
    /// `tail + 1` WQEs and the receives posted at once are `tail`.
    pub tail: u32,
    /// Most scatter entries in one WQE.
    pub max_sge: u32,
}

#[cfg(test)]
mod tests {
    use super::*;
    use zerocopy::IntoBytes;

    #[test]
    fn strides_follow_rdma_core() {
        assert_eq!(srq_stride(0), Some(32));
        assert_eq!(srq_stride(1), Some(32));
        assert_eq!(srq_stride(2), Some(64));
        assert_eq!(srq_stride(3), Some(64));
        assert_eq!(srq_stride(4), Some(128));
        assert_eq!(srq_stride(31), Some(512));
        assert_eq!(srq_stride(32), None);
        assert_eq!(srq_max_sge(32), 1);
        assert_eq!(srq_max_sge(128), 7);
        assert_eq!(srq_entries(1), 2);
        assert_eq!(srq_entries(255), 256);
        assert_eq!(srq_entries(256), 512);
    }

    #[test]
    fn wqe_round_trip_keeps_the_link() {
        let mut ring = [0xaau8; 4 * 64];
        init_links(&mut ring, 64);
        for i in 0..4 {
            assert_eq!(next_index(&ring[i * 64..]), i as u16 + 1);
            assert_eq!(ring[i * 64 + 4], 0, "signature 0");
        }
        let sgl = [Sge {
            addr: 0x1000,
            len: 24,
            lkey: 9,
        }];
        let e = &mut ring[64..128];
        assert_eq!(encode_srq_recv(&sgl, e), Some(1));
        let d = crate::seg::DataSeg {
            byte_count: crate::be::Be32::new(24),
            lkey: crate::be::Be32::new(9),
            addr: crate::be::Be64::new(0x1000),
        };
        assert_eq!(&e[16..32], d.as_bytes());
        // Terminated: one entry of three.
        assert_eq!(&e[36..40], &crate::recv::INVALID_LKEY.to_be_bytes());
        set_next_index(e, 3);
        let mut out = [Sge::default(); 4];
        assert_eq!(decode_srq_recv(e, &mut out), (3, 1));
        assert_eq!(out[0], sgl[0]);
        assert_eq!(encode_srq_recv(&[sgl[0]; 4], e), None, "three fit");
    }
}
