//! Copies in and out of region bytes that the device and other threads share.
//!
//! Region bytes are written at any time by the device and by every thread that holds the
//! region, so every access from Rust is atomic (no data race). Atomic accesses of different
//! sizes to the same bytes may not race when one of them writes (Rust's memory model), so
//! every party uses the same access size for a given byte, fixed by the region alone: the
//! whole 8-byte words inside the region ([`Words`]) are accessed as `AtomicU64` (a part of a
//! word with a load of the word, or a compare-and-swap that changes only that part), the
//! unaligned bytes at its two edges as `AtomicU8`. blueflame's `MemoryRegion::read`/`write`,
//! its poller's copy of data that arrived inside a CQE, and the software NIC's DMA all copy
//! through these functions with the bounds of the region the bytes belong to.
//!
//! A real device's DMA is outside Rust's memory model; for it the same rules hold as verbs
//! gives: bytes the device wrote for a request are all visible once its completion was seen.

use core::sync::atomic::{AtomicU64, AtomicU8, Ordering};

/// The whole 8-byte-aligned words of a region: `[lo, hi)`, both multiples of 8 (empty when
/// the region holds no whole word).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Words {
    /// First byte of the first whole word.
    pub lo: u64,
    /// End of the last whole word.
    pub hi: u64,
}

impl Words {
    /// The whole words of the `len` bytes at `base`.
    #[inline]
    pub const fn of(base: u64, len: u64) -> Words {
        let end = base.saturating_add(len) & !7;
        let lo = match base.checked_add(7) {
            Some(b) => b & !7,
            None => return Words { lo: 0, hi: 0 },
        };
        if lo >= end {
            Words { lo: 0, hi: 0 }
        } else {
            Words { lo, hi: end }
        }
    }

    /// Whether the word at the 8-aligned address `word` is accessed whole.
    #[inline(always)]
    fn whole(self, word: u64) -> bool {
        word >= self.lo && word < self.hi
    }
}

/// Copies `out.len()` bytes at `src` out of a region whose whole words are `w`, with
/// relaxed atomic loads: the unaligned head and tail a word (or byte) at a time, the
/// aligned middle one 8-byte load per word.
///
/// # Safety
/// `src .. src + out.len()` lies inside the region, which is live memory (readable), and
/// `w` is [`Words::of`] that region.
#[inline(always)]
pub unsafe fn copy_out(w: Words, src: *const u8, out: &mut [u8]) {
    let n = out.len();
    let mut i = 0;
    // The unaligned head, up to the first word boundary.
    while i < n && (src as u64).wrapping_add(i as u64) & 7 != 0 {
        // SAFETY: `i < n`: inside the caller's range.
        i += unsafe { part_out(w, src.add(i), &mut out[i..]) };
    }
    // The aligned middle: one 8-byte load per whole word.
    let at = (src as u64).wrapping_add(i as u64);
    if i < n && at >= w.lo && at < w.hi {
        let k = ((n - i) as u64).min(w.hi - at) as usize & !7;
        for (c, o) in out[i..i + k].chunks_exact_mut(8).enumerate() {
            // SAFETY: a whole word of the region at an 8-aligned address inside the
            // caller's range; every access to it is an 8-byte atomic.
            let v = unsafe { AtomicU64::from_ptr(src.add(i + 8 * c).cast::<u64>().cast_mut()) }
                .load(Ordering::Relaxed);
            o.copy_from_slice(&v.to_ne_bytes());
        }
        i += k;
    }
    // The tail.
    while i < n {
        // SAFETY: `i < n`.
        i += unsafe { part_out(w, src.add(i), &mut out[i..]) };
    }
}

/// Copies the bytes at `p` up to the end of its word (or one byte outside whole words);
/// returns how many.
///
/// # Safety
/// As [`copy_out`], for `p .. p + out.len()` (`out` not empty).
#[inline(never)]
unsafe fn part_out(w: Words, p: *const u8, out: &mut [u8]) -> usize {
    let off = (p as u64 & 7) as usize;
    if w.whole(p as u64 - off as u64) {
        let take = (8 - off).min(out.len());
        // SAFETY: the word starts `off` bytes before `p`, inside the region (a whole word of
        // it), 8-aligned; every access to it is an 8-byte atomic.
        let v = unsafe { AtomicU64::from_ptr(p.sub(off).cast::<u64>().cast_mut()) }
            .load(Ordering::Relaxed)
            .to_ne_bytes();
        out[..take].copy_from_slice(&v[off..off + take]);
        take
    } else {
        // SAFETY: inside the region, an edge byte: every access to it is a 1-byte atomic.
        out[0] = unsafe { AtomicU8::from_ptr(p.cast_mut()) }.load(Ordering::Relaxed);
        1
    }
}

/// Copies `data` to `dst` in a region whose whole words are `w`, with relaxed atomic stores:
/// the aligned middle one 8-byte store per word, a part of a word by compare-and-swap (the
/// rest of the word is left as it is), edge bytes one at a time.
///
/// # Safety
/// `dst .. dst + data.len()` lies inside the region, which is live, writable memory, `w` is
/// [`Words::of`] that region, and `data` does not overlap it.
#[inline(always)]
pub unsafe fn copy_in(w: Words, dst: *mut u8, data: &[u8]) {
    let n = data.len();
    let d = dst as u64;
    // Whole words only (the usual receive buffer): one store per word, nothing else.
    if (d | n as u64) & 7 == 0 && d >= w.lo && d.wrapping_add(n as u64) <= w.hi {
        // SAFETY: just checked: whole words of the region, inside the caller's range.
        unsafe { copy_in_words(dst, data.as_ptr(), n) };
        return;
    }
    // SAFETY: the caller's contract.
    unsafe { copy_in_edges(w, dst, data) }
}

/// [`copy_in`] of whole words: `n` bytes (a multiple of 8) from `src` to the 8-byte-aligned
/// `dst`, one relaxed atomic 8-byte store per word.
///
/// # Safety
/// `dst .. dst + n` must be whole words of a live, writable region (inside `[w.lo, w.hi)`
/// of its [`Words::of`]), `dst` 8-byte aligned, `n` a multiple of 8, and `src .. src + n`
/// readable and not overlapping it.
#[inline(always)]
pub unsafe fn copy_in_words(dst: *mut u8, src: *const u8, n: usize) {
    debug_assert!((dst as usize | n) & 7 == 0);
    let mut j = 0;
    while j < n {
        // SAFETY: `j + 8 <= n` (`n` is a multiple of 8): inside `src`; the target is a
        // whole word of the region inside the caller's range (as in `copy_out`).
        unsafe {
            let v = core::ptr::read_unaligned(src.add(j).cast::<u64>());
            AtomicU64::from_ptr(dst.add(j).cast::<u64>()).store(v, Ordering::Relaxed);
        }
        j += 8;
    }
}

/// [`copy_in_words`] of at most four words (`n` a multiple of 8, at most 32): the words
/// one after another, with no loop (the small receive's copy from its CQE: a loop cost
/// the usual 8 bytes 9 instructions, this 6).
///
/// # Safety
/// As [`copy_in_words`], with `n <= 32`.
#[inline(always)]
pub unsafe fn copy_in_few_words(dst: *mut u8, src: *const u8, n: usize) {
    debug_assert!((dst as usize | n) & 7 == 0 && n <= 32);
    /// Copies word `j` (byte offset `8 * j`).
    ///
    /// # Safety
    /// `8 * j + 8 <= n`, under the outer function's contract.
    #[inline(always)]
    unsafe fn word(dst: *mut u8, src: *const u8, j: usize) {
        // SAFETY: the word lies inside `src` and inside the caller's whole-word target
        // range (as in `copy_in_words`).
        unsafe {
            let v = core::ptr::read_unaligned(src.add(8 * j).cast::<u64>());
            AtomicU64::from_ptr(dst.add(8 * j).cast::<u64>()).store(v, Ordering::Relaxed);
        }
    }
    // SAFETY: each word is copied only when `n` covers it.
    unsafe {
        if n >= 8 {
            word(dst, src, 0);
            if n >= 16 {
                word(dst, src, 1);
                if n >= 24 {
                    word(dst, src, 2);
                    if n >= 32 {
                        word(dst, src, 3);
                    }
                }
            }
        }
    }
}

/// [`copy_in`] of a range with unaligned or partial words.
///
/// # Safety
/// As [`copy_in`].
#[inline(never)]
unsafe fn copy_in_edges(w: Words, dst: *mut u8, data: &[u8]) {
    let n = data.len();
    let mut i = 0;
    // The unaligned head, up to the first word boundary.
    while i < n && (dst as u64).wrapping_add(i as u64) & 7 != 0 {
        // SAFETY: `i < n`: inside the caller's range.
        i += unsafe { part_in(w, dst.add(i), &data[i..]) };
    }
    // The aligned middle: one 8-byte store per whole word.
    let at = (dst as u64).wrapping_add(i as u64);
    if i < n && at >= w.lo && at < w.hi {
        let k = ((n - i) as u64).min(w.hi - at) as usize & !7;
        for (c, d) in data[i..i + k].chunks_exact(8).enumerate() {
            let mut b = [0u8; 8];
            b.copy_from_slice(d);
            // SAFETY: as in `copy_out`.
            unsafe { AtomicU64::from_ptr(dst.add(i + 8 * c).cast::<u64>()) }
                .store(u64::from_ne_bytes(b), Ordering::Relaxed);
        }
        i += k;
    }
    // The tail.
    while i < n {
        // SAFETY: `i < n`.
        i += unsafe { part_in(w, dst.add(i), &data[i..]) };
    }
}

/// Stores the bytes at `p` up to the end of its word (compare-and-swap of the word) or one
/// byte outside whole words; returns how many.
///
/// # Safety
/// As [`copy_in`], for `p .. p + data.len()` (`data` not empty).
#[inline(never)]
unsafe fn part_in(w: Words, p: *mut u8, data: &[u8]) -> usize {
    let off = (p as u64 & 7) as usize;
    if w.whole(p as u64 - off as u64) {
        let take = (8 - off).min(data.len());
        // SAFETY: as in `part_out`.
        let a = unsafe { AtomicU64::from_ptr(p.sub(off).cast::<u64>()) };
        let mut cur = a.load(Ordering::Relaxed);
        loop {
            let mut b = cur.to_ne_bytes();
            b[off..off + take].copy_from_slice(&data[..take]);
            match a.compare_exchange_weak(
                cur,
                u64::from_ne_bytes(b),
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return take,
                Err(now) => cur = now,
            }
        }
    } else {
        // SAFETY: as in `part_out`.
        unsafe { AtomicU8::from_ptr(p) }.store(data[0], Ordering::Relaxed);
        1
    }
}

/// One byte at `p` of a region whose whole words are `w`, loaded with `order` (`Relaxed`,
/// `Acquire` or `SeqCst`).
///
/// # Safety
/// `p` lies inside the region, which is live memory, and `w` is [`Words::of`] that region.
#[inline]
pub unsafe fn load_u8(w: Words, p: *const u8, order: Ordering) -> u8 {
    let off = (p as u64 & 7) as usize;
    if w.whole(p as u64 - off as u64) {
        // SAFETY: as in `copy_out`.
        unsafe { AtomicU64::from_ptr(p.sub(off).cast::<u64>().cast_mut()) }
            .load(order)
            .to_ne_bytes()[off]
    } else {
        // SAFETY: as in `copy_out`.
        unsafe { AtomicU8::from_ptr(p.cast_mut()) }.load(order)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_few_words_are_copied_exactly() {
        let src: Vec<u8> = (1..=40).collect();
        for n in (0..=32).step_by(8) {
            let mut dst = [0u64; 5];
            // SAFETY: `dst` has 40 aligned writable bytes, `src` 40 readable ones.
            unsafe { copy_in_few_words(dst.as_mut_ptr().cast(), src.as_ptr(), n) };
            let got: Vec<u8> = dst.iter().flat_map(|w| w.to_ne_bytes()).collect();
            assert_eq!(&got[..n], &src[..n], "{n} bytes");
            assert!(
                got[n..].iter().all(|&b| b == 0),
                "{n} bytes: nothing beyond"
            );
        }
    }

    #[test]
    fn words_of_a_region() {
        assert_eq!(
            Words::of(0x1000, 0x10),
            Words {
                lo: 0x1000,
                hi: 0x1010
            }
        );
        assert_eq!(
            Words::of(0x1003, 0x10),
            Words {
                lo: 0x1008,
                hi: 0x1010
            }
        );
        assert_eq!(Words::of(0x1003, 4), Words::default(), "no whole word");
        assert_eq!(Words::of(u64::MAX - 3, 3), Words::default());
        assert_eq!(Words::of(0, u64::MAX), Words { lo: 0, hi: !7 });
    }

    /// Every offset and length of a region at every alignment, in and out, against a plain
    /// copy (a model of the bytes).
    #[test]
    fn copies_match_a_plain_copy_at_every_offset_and_alignment() {
        let mut backing = [0u64; 8]; // 64 aligned bytes
        let base_ptr = backing.as_mut_ptr().cast::<u8>();
        for shift in 0..8usize {
            for region_len in [1usize, 7, 8, 9, 17, 40] {
                // SAFETY: shift + region_len <= 48 < 64: inside `backing`.
                let base = unsafe { base_ptr.add(shift) };
                let w = Words::of(base as u64, region_len as u64);
                let mut model = [0u8; 40];
                let model = &mut model[..region_len];
                // SAFETY: as above; nothing else touches `backing` meanwhile.
                unsafe { copy_in(w, base, model) };
                for off in 0..region_len {
                    for len in 0..=region_len - off {
                        let mut data = [0u8; 40];
                        for (k, d) in data[..len].iter_mut().enumerate() {
                            *d = (off * 31 + k * 7 + shift) as u8;
                        }
                        // SAFETY: inside the region.
                        unsafe { copy_in(w, base.add(off), &data[..len]) };
                        model[off..off + len].copy_from_slice(&data[..len]);
                        let mut out = [0u8; 40];
                        // SAFETY: the whole region.
                        unsafe { copy_out(w, base, &mut out[..region_len]) };
                        assert_eq!(
                            &out[..region_len],
                            &model[..],
                            "shift {shift} len {region_len} at {off}+{len}"
                        );
                        for (k, &m) in model.iter().enumerate() {
                            // SAFETY: inside the region.
                            let b = unsafe { load_u8(w, base.add(k), Ordering::Acquire) };
                            assert_eq!(b, m);
                        }
                    }
                }
            }
        }
    }
}
