//! The keys peers invalidated through one QP: what its receive completions with invalidate
//! (a peer's send with invalidate: `MLX5_CQE_RESP_SEND_INV`, `IBV_WC_WITH_INV`) reported,
//! recorded by the poller before it returns the completion, and taken by
//! [`MemoryWindow::invalidated`](crate::MemoryWindow::invalidated), which lets a window's
//! region go only on a key the NIC said it invalidated, never on the caller's word alone.
//!
//! A fixed ring of [`SLOTS`] keys, without lock or allocation: a key not taken before
//! `SLOTS` later invalidations on the same QP is overwritten, and its window then keeps its
//! region until it is unbound or dropped (kept registered, never let go early).
//!
//! A key is not a window for ever: a window deallocated while the crate counts it bound
//! (a peer may have invalidated it, its receive completion not polled yet) gives its key
//! index back to the device, which may hand it, with the same variant byte, to the next
//! window (the mlx5 driver's variant counter is device-wide). That stale completion must
//! not unbind the new window. So the dropped window's key is *retired* on its QP
//! ([`Invalidations::retire`]): the QP's binds skip it ([`Invalidations::is_retired`]), and
//! its one invalidation, when it comes, is dropped rather than recorded. The key is free
//! again then, or once every receive posted to the QP before the window was deallocated has
//! completed ([`Invalidations::seal`]): the invalidation consumed one of those (it ran while
//! the window existed). A QP retires at most [`RETIRED`] keys at once; past that, a dropped
//! window stays allocated (so its key cannot come back) until a key is free again or its QP
//! is gone ([`Invalidations::close`]). A QP on an SRQ frees keys only by their
//! invalidations (its receives are the SRQ's, completed in no order).

use crate::queue::shadow::Shadow;
use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// The keys one QP keeps.
pub(crate) const SLOTS: usize = 16;

/// The keys of dropped windows one QP retires at once.
pub(crate) const RETIRED: usize = 64;

/// A slot holding a key (the key in the low 32 bits): an empty slot is 0.
const LIVE: u64 = 1 << 32;

/// A retired key's mark before its window is deallocated: never reached.
const UNSEALED: u64 = u64::MAX;

/// One QP's invalidated keys (shared by its receive CQ's poller and the windows bound
/// through it).
pub(crate) struct Invalidations {
    slots: [AtomicU64; SLOTS],
    /// The next slot to write. Only the QP's receive CQ's poller writes (one poller at a
    /// time: polling takes the CQ by `&mut`); two writers could only overwrite each other's
    /// key, which keeps a region registered, never frees one.
    next: AtomicU32,
    /// The verbs path: the `wc_flags` bit by which the QP's provider says "with
    /// invalidate" (`IBV_WC_WITH_INV`; rxe's is another, `crate::verbs::cq::WITH_INV_ANY`).
    pub(crate) verbs_flag: u32,
    /// Keys of windows deallocated while bound through this QP whose invalidation may still
    /// come (0: empty). The poller empties a slot (its key's invalidation came); windows'
    /// drops fill and empty slots under `marks`' lock.
    retired: [AtomicU64; RETIRED],
    /// Per retired slot, the receive queue's posted count once its window was deallocated
    /// ([`UNSEALED`] before): the slot frees when everything posted before it completed.
    marks: Mutex<[u64; RETIRED]>,
    /// The QP's own receive queue (None on an SRQ).
    rq: Option<Arc<Shadow<u64>>>,
    /// Set once the QP is destroyed: nothing is recorded here or bound through it again.
    closed: AtomicBool,
}

impl core::fmt::Debug for Invalidations {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Invalidations")
            .field("closed", &self.is_closed())
            .finish_non_exhaustive()
    }
}

impl Invalidations {
    /// An empty record, for a QP whose provider's receive completions say "with
    /// invalidate" by `verbs_flag` (the verbs path; unused on the direct path) and whose
    /// own receive queue is `rq` (None on an SRQ).
    pub(crate) fn new(verbs_flag: u32, rq: Option<Arc<Shadow<u64>>>) -> Invalidations {
        Invalidations {
            slots: Default::default(),
            next: AtomicU32::new(0),
            verbs_flag,
            retired: [const { AtomicU64::new(0) }; RETIRED],
            marks: Mutex::new([UNSEALED; RETIRED]),
            rq,
            closed: AtomicBool::new(false),
        }
    }

    /// Records that a receive completion of this QP reported `rkey` invalidated: a retired
    /// key's invalidation (its window dropped) is dropped instead, and the key is free again.
    #[cold]
    pub(crate) fn record(&self, rkey: u32) {
        let key = LIVE | rkey as u64;
        // SeqCst with `retire`: of a record and a retirement of one key made at once, at
        // least one sees the other (a record both miss stays, its key retired: harmless,
        // as no bind through this QP takes a retired key).
        if self.retired.iter().any(|s| {
            s.compare_exchange(key, 0, Ordering::SeqCst, Ordering::Relaxed)
                .is_ok()
        }) {
            return;
        }
        let i = self.next.load(Ordering::Relaxed);
        self.next.store(i.wrapping_add(1), Ordering::Relaxed);
        self.slots[i as usize % SLOTS].store(key, Ordering::SeqCst);
    }

    /// A window bound through this QP with `rkey` is about to be deallocated while it may
    /// be bound: its invalidation, recorded already, is taken now; otherwise the key is
    /// retired until it comes or [`Invalidations::seal`]'s mark is passed. False when
    /// [`RETIRED`] keys are retired already: then the window must stay allocated (try
    /// again later; it may go once the QP is closed).
    pub(crate) fn retire(&self, rkey: u32) -> bool {
        if self.take(rkey) {
            return true;
        }
        let key = LIVE | rkey as u64;
        let mut marks = self.marks.lock().unwrap_or_else(|e| e.into_inner());
        let free = |i: usize, marks: &[u64; RETIRED]| {
            // A sealed slot whose receives before the mark all completed: its window's
            // invalidation, if it ran, was read (and emptied the slot).
            marks[i] != UNSEALED
                && self
                    .rq
                    .as_ref()
                    .is_some_and(|rq| rq.done_up_to_wide(marks[i]))
        };
        for i in 0..RETIRED {
            let now = self.retired[i].load(Ordering::SeqCst);
            if now != 0 && !free(i, &marks) {
                continue;
            }
            if self.retired[i]
                .compare_exchange(now, key, Ordering::SeqCst, Ordering::Relaxed)
                .is_err()
            {
                // Emptied by the poller meanwhile: the next one.
                continue;
            }
            marks[i] = UNSEALED;
            drop(marks);
            if self.take(rkey) {
                // Recorded meanwhile: that was the dropped window's invalidation.
                let _ =
                    self.retired[i].compare_exchange(key, 0, Ordering::SeqCst, Ordering::Relaxed);
            }
            return true;
        }
        false
    }

    /// The window whose key `rkey` was retired is deallocated: the key frees once every
    /// receive posted to the QP by now has completed.
    pub(crate) fn seal(&self, rkey: u32) {
        let key = LIVE | rkey as u64;
        let mut marks = self.marks.lock().unwrap_or_else(|e| e.into_inner());
        let mark = self.rq.as_ref().map_or(UNSEALED, |rq| rq.posted_wide());
        for i in 0..RETIRED {
            if marks[i] == UNSEALED && self.retired[i].load(Ordering::SeqCst) == key {
                marks[i] = mark;
            }
        }
    }

    /// Whether `rkey` is retired: a bind through this QP must not give it to a window.
    pub(crate) fn is_retired(&self, rkey: u32) -> bool {
        let key = LIVE | rkey as u64;
        self.retired.iter().any(|s| s.load(Ordering::SeqCst) == key)
    }

    /// The QP is destroyed: windows kept for it may go.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
    }

    /// Whether the QP is destroyed ([`Invalidations::close`]).
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Takes one record of `rkey`: whether a receive reported it (and it was not taken yet).
    pub(crate) fn take(&self, rkey: u32) -> bool {
        let want = LIVE | rkey as u64;
        self.slots.iter().any(|s| {
            s.compare_exchange(want, 0, Ordering::SeqCst, Ordering::Relaxed)
                .is_ok()
        })
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
        let log = Invalidations::new(0, None);
        assert!(!log.take(7), "nothing recorded");
        log.record(7);
        log.record(0);
        assert!(!log.take(8));
        assert!(log.take(7));
        assert!(!log.take(7), "taken once");
        assert!(log.take(0), "key 0 is a key like another");
    }

    #[test]
    fn the_oldest_key_goes_after_slots_more() {
        let log = Invalidations::new(0, None);
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
    fn a_retired_keys_invalidation_is_dropped_and_frees_the_key() {
        let log = Invalidations::new(0, None);
        assert!(log.retire(9));
        assert!(log.is_retired(9));
        log.record(9);
        assert!(!log.take(9), "the dropped window's invalidation recorded");
        assert!(!log.is_retired(9), "freed by its invalidation");
        log.record(9);
        assert!(log.take(9), "a later window's is recorded");
    }

    #[test]
    fn retiring_a_recorded_key_takes_the_record() {
        let log = Invalidations::new(0, None);
        log.record(4);
        assert!(log.retire(4));
        assert!(!log.is_retired(4), "nothing more to come");
        assert!(!log.take(4));
    }

    #[test]
    fn past_retired_keys_a_retirement_is_refused() {
        let log = Invalidations::new(0, None);
        for k in 0..RETIRED as u32 {
            assert!(log.retire(1000 + k));
        }
        assert!(!log.retire(7), "the window must stay allocated");
        log.record(1000);
        assert!(log.retire(7), "a slot came free");
    }

    #[test]
    fn forget_drops_every_record_of_a_key() {
        let log = Invalidations::new(0, None);
        log.record(5);
        log.record(5);
        log.record(6);
        log.forget(5);
        assert!(!log.take(5));
        assert!(log.take(6));
    }
}
