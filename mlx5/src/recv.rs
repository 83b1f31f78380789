//! Receive WQEs: a row of data segments, terminated by an invalid-lkey entry when shorter than
//! the ring's stride.

use crate::be::{Be32, Be64};
use crate::request::Sge;
use crate::seg::{DataSeg, DS_BYTES};
use zerocopy::{FromBytes, IntoBytes};

/// The lkey that ends a receive WQE shorter than the stride (`MLX5_INVALID_LKEY`).
pub const INVALID_LKEY: u32 = 0x100;

/// Writes one receive WQE (`sgl`, zero-length entries skipped) into `entry` (the stride
/// bytes). Returns the number of entries written, or `None` if they do not fit.
#[inline]
pub fn encode_recv(sgl: &[Sge], entry: &mut [u8]) -> Option<usize> {
    let max = entry.len() / DS_BYTES;
    let n = sgl.iter().filter(|s| s.len != 0).count();
    if n > max || sgl.iter().any(|s| s.len > crate::wqe::MAX_SGE_BYTES) {
        return None;
    }
    let mut i = 0;
    for s in sgl.iter().filter(|s| s.len != 0) {
        entry[i * DS_BYTES..(i + 1) * DS_BYTES].copy_from_slice(data_seg(s).as_bytes());
        i += 1;
    }
    if i < max {
        entry[i * DS_BYTES..(i + 1) * DS_BYTES].copy_from_slice(TERMINATOR.as_bytes());
    }
    Some(n)
}

/// [`encode_recv`] of a list of one entry `s`, non-empty and at most
/// [`MAX_SGE_BYTES`](crate::wqe::MAX_SGE_BYTES) long (the usual receive): its data
/// segment, and the terminator when `entry` has room for another.
///
/// # Panics
/// When `entry` is shorter than one data segment (a ring's stride is at least one).
#[inline(always)]
pub fn encode_recv_one(s: &Sge, entry: &mut [u8]) {
    debug_assert!(s.len != 0 && s.len <= crate::wqe::MAX_SGE_BYTES);
    entry[..DS_BYTES].copy_from_slice(data_seg(s).as_bytes());
    if let Some(t) = entry.get_mut(DS_BYTES..2 * DS_BYTES) {
        t.copy_from_slice(TERMINATOR.as_bytes());
    }
}

/// The data segment of entry `s`.
#[inline(always)]
fn data_seg(s: &Sge) -> DataSeg {
    DataSeg {
        byte_count: Be32::new(s.len),
        lkey: Be32::new(s.lkey),
        addr: Be64::new(s.addr),
    }
}

/// The entry that ends a receive WQE shorter than the stride.
const TERMINATOR: DataSeg = DataSeg {
    byte_count: Be32::ZERO,
    lkey: Be32::new(INVALID_LKEY),
    addr: Be64::ZERO,
};

/// Reads the entries of one receive WQE into `out`, up to the terminator or the stride.
/// Returns how many there are.
pub fn decode_recv(entry: &[u8], out: &mut [Sge]) -> usize {
    let mut n = 0;
    for chunk in entry.chunks_exact(DS_BYTES) {
        let Ok(d) = DataSeg::read_from_bytes(chunk) else {
            break;
        };
        if d.lkey.get() == INVALID_LKEY || n == out.len() {
            break;
        }
        out[n] = Sge {
            addr: d.addr.get(),
            len: d.byte_count.get(),
            lkey: d.lkey.get(),
        };
        n += 1;
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The one-entry encoder writes what the general one writes for a list of one entry,
    /// into entries of one, two and four segments, over whatever the ring held before.
    #[test]
    fn one_entry_as_the_general_encoder() {
        let s = Sge {
            addr: 0x1122_3344_5566_7788,
            len: 100,
            lkey: 0xabcd,
        };
        for size in [16, 32, 64] {
            let (mut a, mut b) = ([0xaau8; 64], [0xaau8; 64]);
            encode_recv(&[s], &mut a[..size]);
            encode_recv_one(&s, &mut b[..size]);
            assert_eq!(a, b, "an entry of {size} bytes");
        }
    }

    #[test]
    fn round_trip_with_terminator() {
        let mut entry = [0xaau8; 64];
        let sgl = [
            Sge {
                addr: 0x1000,
                len: 10,
                lkey: 7,
            },
            Sge {
                addr: 0x2000,
                len: 0,
                lkey: 7,
            },
        ];
        assert_eq!(encode_recv(&sgl, &mut entry), Some(1));
        let mut out = [Sge::default(); 4];
        assert_eq!(decode_recv(&entry, &mut out), 1);
        assert_eq!(out[0], sgl[0]);
        assert_eq!(&entry[20..24], &INVALID_LKEY.to_be_bytes());
    }

    #[test]
    fn full_stride_has_no_terminator() {
        let mut entry = [0u8; 32];
        let sgl = [
            Sge {
                addr: 1,
                len: 1,
                lkey: 1,
            },
            Sge {
                addr: 2,
                len: 2,
                lkey: 2,
            },
        ];
        assert_eq!(encode_recv(&sgl, &mut entry), Some(2));
        let mut out = [Sge::default(); 4];
        assert_eq!(decode_recv(&entry, &mut out), 2);
        assert_eq!(encode_recv(&[sgl[0]; 3], &mut entry), None);
    }
}
