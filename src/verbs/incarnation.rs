//! Which queue a verbs-path completion is of: every send and receive queue of the verbs
//! path has an incarnation, a number no other queue of the process has, carried in bits
//! 16 to 61 of each of its requests' `wr_id` (the low 16 are the request's position, bits
//! 62 and 63 the receive tags of [`super::rq`]; an SRQ's receives carry the SRQ's). The
//! poller attributes the usual completion (a successful send of its list's first queue) by
//! the incarnation alone, any other by its QP number and then checks the incarnation
//! against the queue it found (one without the side the completion names is not its
//! queue either): a QP number the kernel handed to a new QP after the old one was dropped
//! names two queues, and only the incarnation tells the old one's completions from the new
//! one's, whichever of them the poller's list holds when it reads them (`super::cq`; but
//! for two receivers of one SRQ, whose receives carry the SRQ's).

use core::sync::atomic::{AtomicU64, Ordering};

/// The bits of a `wr_id` that carry its queue's incarnation.
pub(crate) const MASK: u64 = ((1 << 62) - 1) & !0xffff;

/// The incarnation of the next queue, counted from 1.
static NEXT: AtomicU64 = AtomicU64::new(1);

/// A new queue's incarnation, already in place (`wr_id & MASK`): never 0 (the
/// incarnation of no queue, [`NONE`]), and no other queue's until 2^46 queues were made
/// (the counter wraps there: at a million queues a second, after two years).
pub(crate) fn next() -> u64 {
    loop {
        let n = NEXT.fetch_add(1, Ordering::Relaxed).wrapping_shl(16) & MASK;
        if n != NONE {
            return n;
        }
    }
}

/// No queue's incarnation (a shadow made without one: the direct path's queues' and
/// SRQs', the verbs poller's `no_sq`).
pub(crate) const NONE: u64 = 0;

#[cfg(test)]
mod tests {
    use super::*;

    /// Incarnations are distinct, never [`NONE`], and clear of the position's bits and of
    /// the receive tags.
    #[test]
    fn incarnations_are_distinct_and_clear_of_the_other_bits() {
        let tags = super::super::rq::RECV_TAG | super::super::rq::UD_TAG;
        let got: Vec<u64> = (0..1000).map(|_| next()).collect();
        for (i, &t) in got.iter().enumerate() {
            assert_ne!(t, NONE);
            assert_eq!(t & (0xffff | tags), 0, "{t:#x}");
            assert_eq!(t & MASK, t);
            assert!(!got[..i].contains(&t), "{t:#x} twice");
        }
    }
}
