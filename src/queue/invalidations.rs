//! The keys peers invalidated through one QP: what its receive completions with invalidate
//! (a peer's send with invalidate: `MLX5_CQE_RESP_SEND_INV`, `IBV_WC_WITH_INV`) reported,
//! recorded by the poller before it returns the completion, and taken by
//! [`MemoryWindow::invalidated`](crate::MemoryWindow::invalidated), which lets a window's
//! region go only on a key the NIC said it invalidated, never on the caller's word alone.
//!
//! A fixed ring of [`SLOTS`] keys, without lock or allocation (the poller's side is one
//! load and two stores): a key not taken before `SLOTS` later invalidations on the same QP
//! is overwritten, and its window then keeps its region until it is unbound or dropped
//! (kept registered, never let go early).

use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// The keys one QP keeps.
pub(crate) const SLOTS: usize = 16;

/// A slot holding a key (the key in the low 32 bits): an empty slot is 0.
const LIVE: u64 = 1 << 32;

/// One QP's invalidated keys (shared by its receive CQ's poller and the windows bound
/// through it).
#[derive(Debug)]
pub(crate) struct Invalidations {
    slots: [AtomicU64; SLOTS],
    /// The next slot to write. Only the QP's receive CQ's poller writes (one poller at a
    /// time: polling takes the CQ by `&mut`); two writers could only overwrite each other's
    /// key, which keeps a region registered, never frees one.
    next: AtomicU32,
    /// The verbs path: the `wc_flags` bit by which the QP's provider says "with
    /// invalidate" (`IBV_WC_WITH_INV`; rxe's is another, `crate::verbs::cq::WITH_INV_ANY`).
    pub(crate) verbs_flag: u32,
}

impl Invalidations {
    /// An empty record, for a QP whose provider's receive completions say "with
    /// invalidate" by `verbs_flag` (the verbs path; unused on the direct path).
    pub(crate) fn new(verbs_flag: u32) -> Invalidations {
        Invalidations {
            slots: Default::default(),
            next: AtomicU32::new(0),
            verbs_flag,
        }
    }

    /// Records that a receive completion of this QP reported `rkey` invalidated.
    #[cold]
    pub(crate) fn record(&self, rkey: u32) {
        let i = self.next.load(Ordering::Relaxed);
        self.next.store(i.wrapping_add(1), Ordering::Relaxed);
        self.slots[i as usize % SLOTS].store(LIVE | rkey as u64, Ordering::Release);
    }

    /// Takes one record of `rkey`: whether a receive reported it (and it was not taken yet).
    pub(crate) fn take(&self, rkey: u32) -> bool {
        let want = LIVE | rkey as u64;
        self.slots.iter().any(|s| {
            s.compare_exchange(want, 0, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        })
    }

    /// Whether a receive reported `rkey` invalidated and the record was not taken yet
    /// (nothing is taken).
    pub(crate) fn holds(&self, rkey: u32) -> bool {
        let want = LIVE | rkey as u64;
        self.slots.iter().any(|s| s.load(Ordering::Acquire) == want)
    }

    /// Forgets every record of `rkey` (a window bound afresh with that key: a record left
    /// from its last binding with the same key, 256 binds ago, must not unbind this one).
    pub(crate) fn forget(&self, rkey: u32) {
        while self.take(rkey) {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_taken_once_and_only_if_recorded() {
        let log = Invalidations::new(0);
        assert!(!log.take(7), "nothing recorded");
        log.record(7);
        log.record(0);
        assert!(!log.take(8));
        assert!(log.holds(7) && log.holds(7), "looking takes nothing");
        assert!(log.take(7));
        assert!(!log.take(7), "taken once");
        assert!(!log.holds(7));
        assert!(log.take(0), "key 0 is a key like another");
    }

    #[test]
    fn the_oldest_key_goes_after_slots_more() {
        let log = Invalidations::new(0);
        log.record(1);
        for k in 100..100 + SLOTS as u32 - 1 {
            log.record(k);
        }
        assert!(log.take(1), "still there after SLOTS - 1 more");
        log.record(1);
        for k in 200..200 + SLOTS as u32 {
            log.record(k);
        }
        assert!(!log.take(1), "overwritten after SLOTS more");
    }

    #[test]
    fn forget_drops_every_record_of_a_key() {
        let log = Invalidations::new(0);
        log.record(5);
        log.record(5);
        log.record(6);
        log.forget(5);
        assert!(!log.take(5));
        assert!(log.take(6));
    }
}
