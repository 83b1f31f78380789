//! The ring blocks one WQE occupies, as at most two byte slices.

use crate::doorbell::SEND_WQE_BB;

/// The bytes of the blocks of one WQE: `a` runs from its first block towards the end of the
/// ring; `b` is the part that wrapped to block 0 (empty when it did not wrap).
///
/// Holding only these blocks (not the whole ring) lets a producer write a WQE while the NIC
/// reads other, already posted, blocks.
#[derive(Debug)]
pub struct Span<'a> {
    /// From the first block to the ring end (or the WQE end).
    pub a: &'a mut [u8],
    /// The wrapped rest, from the ring start.
    pub b: &'a mut [u8],
}

impl<'a> Span<'a> {
    /// The blocks `start .. start + nbbs` (modulo the ring) of a whole ring held as bytes.
    ///
    /// # Panics
    /// If the ring is not a whole number of blocks or `nbbs` exceeds it.
    pub fn of_ring(ring: &'a mut [u8], start: usize, nbbs: usize) -> Span<'a> {
        let cnt = ring.len() / SEND_WQE_BB;
        assert!(ring.len() % SEND_WQE_BB == 0 && nbbs <= cnt && cnt > 0);
        let start = start % cnt;
        let first = nbbs.min(cnt - start);
        let (head, tail) = ring.split_at_mut(start * SEND_WQE_BB);
        Span {
            a: &mut tail[..first * SEND_WQE_BB],
            b: &mut head[..(nbbs - first) * SEND_WQE_BB],
        }
    }

    /// Total bytes.
    #[inline(always)]
    pub fn len(&self) -> usize {
        self.a.len() + self.b.len()
    }

    /// Whether the span is empty.
    #[inline(always)]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Writes `src` at byte `off` of the WQE, splitting it at the ring end.
    ///
    /// # Panics
    /// If `off + src.len()` exceeds the span (the encoder sizes spans first, so it never does).
    #[inline(always)]
    pub fn put(&mut self, off: usize, src: &[u8]) {
        let n = self.a.len();
        let end = off + src.len();
        if end <= n {
            self.a[off..end].copy_from_slice(src);
        } else if off >= n {
            self.b[off - n..end - n].copy_from_slice(src);
        } else {
            let (x, y) = src.split_at(n - off);
            self.a[off..].copy_from_slice(x);
            self.b[..y.len()].copy_from_slice(y);
        }
    }

    /// Zeroes `len` bytes at `off`.
    #[inline]
    pub fn zero(&mut self, off: usize, len: usize) {
        const Z: [u8; 64] = [0; 64];
        let mut done = 0;
        while done < len {
            let k = (len - done).min(64);
            self.put(off + done, &Z[..k]);
            done += k;
        }
    }

    /// Copies the span into `out` (which must be at least [`Span::len`] long).
    pub fn copy_to(&self, out: &mut [u8]) {
        out[..self.a.len()].copy_from_slice(self.a);
        out[self.a.len()..self.a.len() + self.b.len()].copy_from_slice(self.b);
    }
}

/// Copies `nbbs` blocks starting at block `start` of a ring (wrapping) into `out`.
///
/// # Panics
/// If `out` is shorter than `nbbs` blocks or `nbbs` exceeds the ring.
pub fn linearize(ring: &[u8], start: usize, nbbs: usize, out: &mut [u8]) {
    let cnt = ring.len() / SEND_WQE_BB;
    assert!(nbbs <= cnt);
    for i in 0..nbbs {
        let src = ((start + i) % cnt) * SEND_WQE_BB;
        out[i * SEND_WQE_BB..(i + 1) * SEND_WQE_BB].copy_from_slice(&ring[src..src + SEND_WQE_BB]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn put_splits_at_the_ring_end() {
        let mut ring = [0u8; 4 * 64];
        let mut s = Span::of_ring(&mut ring, 3, 2);
        assert_eq!((s.a.len(), s.b.len()), (64, 64));
        let src: [u8; 20] = core::array::from_fn(|i| i as u8 + 1);
        s.put(54, &src);
        assert_eq!(&ring[3 * 64 + 54..], &src[..10]);
        assert_eq!(&ring[..10], &src[10..]);
        let mut lin = [0u8; 128];
        linearize(&ring, 3, 2, &mut lin);
        assert_eq!(&lin[54..74], &src);
    }

    #[test]
    fn no_wrap_has_empty_tail() {
        let mut ring = [0u8; 4 * 64];
        let s = Span::of_ring(&mut ring, 1, 2);
        assert_eq!((s.a.len(), s.b.len()), (128, 0));
    }
}
