//! Number allocation for the NIC's tables (key indices, QP numbers, CQ numbers): only free
//! numbers are handed out, never one that names a live object, and allocation fails when
//! every number is in use.
//!
//! The hardware's numbers are 24 bits wide, so a long-running program reuses them. Like a
//! ConnectX's firmware, the pool goes round: the next number is the first free one after the
//! last handed out, so a number just freed comes back as late as possible (a stale key or a
//! late CQE of a destroyed QP then rarely names a new object; the driver must not rely on
//! it, only on numbers never naming two live objects).

/// A round-robin pool of the numbers `lo ..= hi`.
pub(crate) struct Ids {
    lo: u32,
    hi: u32,
    /// One bit per number from `lo`, set while in use; grown as the cursor first reaches it.
    used: Vec<u64>,
    /// Where the search for the next free number starts (an offset from `lo`).
    cursor: u32,
    live: u32,
}

impl Ids {
    /// A pool of `lo ..= hi` (`lo <= hi`).
    pub(crate) fn new(lo: u32, hi: u32) -> Ids {
        assert!(lo <= hi, "empty number range");
        Ids {
            lo,
            hi,
            used: Vec::new(),
            cursor: 0,
            live: 0,
        }
    }

    fn span(&self) -> u32 {
        self.hi - self.lo + 1
    }

    fn is_used(&self, off: u32) -> bool {
        self.used
            .get(off as usize / 64)
            .is_some_and(|w| w & (1 << (off % 64)) != 0)
    }

    /// The next free number, or None when all are in use.
    pub(crate) fn alloc(&mut self) -> Option<u32> {
        let span = self.span();
        if self.live == span {
            return None;
        }
        let mut off = self.cursor;
        loop {
            let word = off as usize / 64;
            match self.used.get(word) {
                // Never reached before: free.
                None => break,
                Some(&w) => {
                    // The first free bit at or after `off` in this word.
                    let free = !w & (u64::MAX << (off % 64));
                    if free != 0 {
                        let o = word as u32 * 64 + free.trailing_zeros();
                        if o < span {
                            off = o;
                            break;
                        }
                    }
                }
            }
            off = (word as u32 + 1) * 64;
            if off >= span {
                off = 0;
            }
        }
        let word = off as usize / 64;
        if self.used.len() <= word {
            self.used.resize(word + 1, 0);
        }
        self.used[word] |= 1 << (off % 64);
        self.live += 1;
        self.cursor = if off + 1 >= span { 0 } else { off + 1 };
        Some(self.lo + off)
    }

    /// Returns `n` to the pool. Returns false when it was not in use.
    pub(crate) fn free(&mut self, n: u32) -> bool {
        if n < self.lo || n > self.hi || !self.is_used(n - self.lo) {
            return false;
        }
        let off = n - self.lo;
        self.used[off as usize / 64] &= !(1 << (off % 64));
        self.live -= 1;
        true
    }

    /// Numbers in use.
    #[cfg(test)]
    pub(crate) fn live(&self) -> u32 {
        self.live
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_robin_never_reuses_a_live_number() {
        let mut ids = Ids::new(10, 13);
        assert_eq!(ids.alloc(), Some(10));
        assert_eq!(ids.alloc(), Some(11));
        assert!(ids.free(10));
        assert!(!ids.free(10), "double free refused");
        // 10 is free, but the pool goes round first.
        assert_eq!(ids.alloc(), Some(12));
        assert_eq!(ids.alloc(), Some(13));
        assert_eq!(ids.alloc(), Some(10));
        assert_eq!(ids.alloc(), None, "exhausted");
        assert!(ids.free(12));
        assert_eq!(ids.alloc(), Some(12));
        assert_eq!(ids.live(), 4);
        assert!(!ids.free(9) && !ids.free(14));
    }

    #[test]
    fn wraps_across_words() {
        let mut ids = Ids::new(0, 199);
        let all: Vec<u32> = (0..200).map(|_| ids.alloc().unwrap()).collect();
        assert_eq!(all, (0..200).collect::<Vec<_>>());
        assert_eq!(ids.alloc(), None);
        for n in [3, 64, 130, 199] {
            assert!(ids.free(n));
        }
        assert_eq!(ids.alloc(), Some(3));
        assert_eq!(ids.alloc(), Some(64));
        assert_eq!(ids.alloc(), Some(130));
        assert_eq!(ids.alloc(), Some(199));
        assert_eq!(ids.alloc(), None);
    }
}
