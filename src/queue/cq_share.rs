//! CQ accounting: the crate never lets the requests that may still complete on a CQ
//! outnumber its entries, so it can never overrun one.
//!
//! Why every outstanding request counts, signaled or not: after an error the device
//! completes every outstanding send WQE and every posted receive with its own flush CQE
//! (the QP's error state; UCX `uct_rc_txqp_posted`: "reserve cq credits for every posted
//! operation, in case it would complete with error"), and a signaled one completes with one
//! CQE anyway. An unsignaled WQE retires with the next CQE of its queue, so each outstanding
//! WQE or receive yields at most one CQE. On the direct path a WQE of k blocks counts k (the
//! ring's positions, as UCX counts building blocks): an upper bound on its WQEs that costs
//! nothing to keep.
//!
//! Each queue that completes on a CQ has a *charge*: the position `end` up to which it may
//! post (its producer index plus an allowance), minus the position the poller has retired
//! it up to. The charge covers every outstanding request (posted, not retired) and the
//! allowance not yet spent, and it shrinks by itself as the poller retires requests: the
//! poller does nothing more than it did (the post and poll paths pay nothing). A queue moves
//! its `end` only on its cold path (for the direct send queue: when its cached ring limit,
//! which never passes `end`, is reached), under the CQ's lock, and only by what
//! `capacity - sum of charges` leaves free. So the device can never hold more CQEs than the
//! CQ has entries. The poller publishes its consumer index before it retires: a queue can
//! never reuse an entry the device still counts as unconsumed.
//!
//! A refusal must have a completion on its way: a queue makes the last request its allowance
//! takes signaled (the direct send queue keeps its longest WQE's blocks of the allowance
//! back for it, `SendQueue::make_room`; the verbs send queue signals the allowance's last
//! request, `verbs::sq`), so a queue refused for want of entries never waits on
//! unsignaled requests only (UCX `uct_rc_iface_tx_moderation` under `tx.cq_available`).
//!
//! A queue takes some headroom beyond its need (half its fair share of the CQ) so that it
//! comes back once every so many posts and not after each; an idle queue holds that and
//! the longest WQE's blocks the direct send queue keeps back, and nothing takes them from
//! it until it posts again (the post path reads no shared counter): with more idle queues
//! than the CQ's entries over that, the last may be refused on an empty CQ (the guide's
//! "Sizing queues and CQs"). A dropped queue gives its allowance back at once and keeps its
//! outstanding requests charged until its device QP is destroyed ([`Leaving`]); then they
//! stay counted until the CQ is seen drained after that (by the poller, or by a queue short
//! of entries that reads the ring: the device writes nothing for a destroyed QP, so by then
//! every completion it may have written was consumed).

use super::shadow::Retired;
use crate::error::Error;
use core::sync::atomic::{AtomicU16, AtomicU32, AtomicU64, AtomicU8, Ordering};
use mlx5::cqe::is_sw_owned;
use mlx5::doorbell::CQ_SET_CI;
use std::sync::{Arc, Mutex, MutexGuard};

/// A read-only view of a direct-path CQ ring: whether the device has written entries the
/// poller has not consumed (as far as the poller published).
#[derive(Copy, Clone, Debug)]
pub(crate) struct RingView {
    /// The owner byte of entry 0.
    pub(crate) first_own: *const u8,
    pub(crate) stride: usize,
    pub(crate) cnt: u32,
    pub(crate) dbrec: *const u32,
}

// SAFETY: the view only loads (atomically) from the CQ's ring and doorbell record, which
// live as long as the CQ; the CQ outlives every queue that completes on it (a QP holds the
// CQ's handle and drops it after its queues), and only queues consult the view.
unsafe impl Send for RingView {}
// SAFETY: as above: atomic loads only.
unsafe impl Sync for RingView {}

impl RingView {
    /// Whether every entry the device has written is consumed and published by the poller.
    fn drained(&self) -> bool {
        // SAFETY: the record and the ring are live (see the `Send` impl); the loads are
        // atomic because the poller and the device write them concurrently.
        unsafe {
            let rec = &*(self.dbrec.add(CQ_SET_CI) as *const AtomicU32);
            let ci = u32::from_be(rec.load(Ordering::Acquire)) & 0xff_ffff;
            let i = (ci & (self.cnt - 1)) as usize;
            let own = &*(self.first_own.add(i * self.stride) as *const AtomicU8);
            !is_sw_owned(own.load(Ordering::Acquire), ci, self.cnt)
        }
    }
}

/// One queue's charge on a CQ: `end - retired`.
struct Charge {
    /// The position the queue may post up to (changed under the CQ's lock only).
    end: AtomicU16,
    /// How far the poller has retired the queue.
    queue: Arc<dyn Retired>,
}

impl Charge {
    fn get(&self) -> u32 {
        self.end
            .load(Ordering::Relaxed)
            .wrapping_sub(self.queue.retired()) as u32
    }
}

struct Ledger {
    charges: Vec<Arc<Charge>>,
    /// Entries of requests left outstanding by dropped queues.
    orphans: u32,
    /// Bumped each time a queue is dropped with requests outstanding.
    epoch: u64,
}

/// The entries of one CQ and the charges of the queues that complete on it.
pub(crate) struct CqSlots {
    cqn: u32,
    capacity: u32,
    ledger: Mutex<Ledger>,
    /// The ledger's epoch while it has orphans, else 0 (read by the poller without the lock).
    orphan_mark: AtomicU64,
    ring: Option<RingView>,
}

impl core::fmt::Debug for CqSlots {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("CqSlots")
            .field("cqn", &self.cqn)
            .field("capacity", &self.capacity)
            .finish()
    }
}

impl CqSlots {
    /// The entries of a CQ of `capacity` entries that the device guarantees; `ring` when
    /// the crate polls its ring itself.
    pub(crate) fn new(cqn: u32, capacity: u32, ring: Option<RingView>) -> CqSlots {
        CqSlots {
            cqn,
            capacity,
            ledger: Mutex::new(Ledger {
                charges: Vec::new(),
                orphans: 0,
                epoch: 0,
            }),
            orphan_mark: AtomicU64::new(0),
            ring,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Ledger> {
        self.ledger.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Entries of the CQ.
    pub(crate) fn capacity(&self) -> u32 {
        self.capacity
    }

    /// Entries no queue may use now (as far as the poller has retired).
    #[cfg(test)]
    pub(crate) fn free(&self) -> u32 {
        let l = self.lock();
        self.free_in(&l)
    }

    fn free_in(&self, l: &Ledger) -> u32 {
        let used: u32 = l.charges.iter().map(|c| c.get()).sum::<u32>() + l.orphans;
        self.capacity.saturating_sub(used)
    }

    /// Whether queues were dropped with requests outstanding: a mark to pass to
    /// [`CqSlots::drained`] once the CQ is seen empty (0: none; one load).
    #[inline]
    pub(crate) fn orphan_mark(&self) -> u64 {
        self.orphan_mark.load(Ordering::Acquire)
    }

    /// The poller saw the CQ empty after [`CqSlots::orphan_mark`] returned `mark`: every
    /// completion of the queues dropped before was consumed (the device writes none for a
    /// destroyed QP), so their entries are free.
    #[cold]
    pub(crate) fn drained(&self, mark: u64) {
        if mark == 0 {
            return;
        }
        let mut l = self.lock();
        if l.epoch == mark {
            l.orphans = 0;
            self.orphan_mark.store(0, Ordering::Release);
        }
    }

    /// A new epoch, as a queue dropped with requests outstanding sets it: the poller passes
    /// it to [`CqSlots::drained`] once it sees the CQ empty after reading it.
    pub(crate) fn mark(&self) -> u64 {
        self.new_epoch(&mut self.lock())
    }

    /// Moves the orphan epoch on (under the ledger's lock) and publishes it.
    fn new_epoch(&self, l: &mut Ledger) -> u64 {
        l.epoch += 1;
        self.orphan_mark.store(l.epoch, Ordering::Release);
        l.epoch
    }

    /// An equal share of the CQ for each queue on it.
    fn share(&self, l: &Ledger) -> u32 {
        self.capacity / (l.charges.len() as u32).max(1)
    }
}

/// A queue's charge on the CQ it completes on.
pub(crate) struct CqShare {
    slots: Arc<CqSlots>,
    charge: Arc<Charge>,
    /// `charge.end`, as this queue (its only writer) last set it.
    end: u16,
}

impl core::fmt::Debug for CqShare {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("CqShare")
            .field("cqn", &self.slots.cqn)
            .field("end", &self.end)
            .finish()
    }
}

/// Where a receive queue at position `pos`, with `free` entries free, may post up to
/// without checking again: as far as its free entries and, when it is accounted on a CQ
/// (`share`), the CQ's allowance reach (topped up when spent; `cap`: the queue's depth).
/// The receive queues' cached room (direct and verbs).
///
/// # Errors
/// [`Error::QueueFull`] with no entry free; [`Error::CqFull`].
pub(crate) fn recv_room_end(
    free: u32,
    share: Option<&mut CqShare>,
    pos: u16,
    cap: u32,
) -> Result<u16, Error> {
    super::checks::check_recv_room(free)?;
    let room = match share {
        Some(s) => {
            s.check_one(pos, cap)?;
            free.min(s.allowance(pos))
        }
        None => free,
    };
    // A room of 65536 or more would read as none: the queue checks again sooner.
    Ok(pos.wrapping_add(room.min(u16::MAX as u32) as u16))
}

impl CqShare {
    /// A queue whose positions `queue` retires, now at position `pos`, that completes on
    /// the CQ of `slots`; it may post nothing yet.
    pub(crate) fn new(slots: Arc<CqSlots>, queue: Arc<dyn Retired>, pos: u16) -> CqShare {
        let charge = Arc::new(Charge {
            end: AtomicU16::new(pos),
            queue,
        });
        slots.lock().charges.push(charge.clone());
        CqShare {
            slots,
            charge,
            end: pos,
        }
    }

    /// Positions the queue may still post from `pos`.
    #[inline(always)]
    pub(crate) fn allowance(&self, pos: u16) -> u32 {
        self.end.wrapping_sub(pos) as u32
    }

    /// Makes the allowance from `pos` at least `need` when the CQ has the entries, with
    /// some headroom, never letting the charge pass `cap` (the ring: more could never be
    /// outstanding). Returns the allowance.
    #[cold]
    #[inline(never)]
    pub(crate) fn top_up(&mut self, pos: u16, need: u32, cap: u32) -> u32 {
        let have = self.allowance(pos);
        if have >= need {
            return have;
        }
        let mut l = self.slots.lock();
        let mut free = self.slots.free_in(&l);
        if free < need - have
            && l.orphans != 0
            && self.slots.ring.as_ref().is_some_and(|r| r.drained())
        {
            // Every completion the device wrote is consumed: the dropped queues' requests
            // will never complete.
            l.orphans = 0;
            self.slots.orphan_mark.store(0, Ordering::Release);
            free = self.slots.free_in(&l);
        }
        let charge = self.charge.get();
        let headroom = (self.slots.share(&l) / 2).max(1);
        let want = (need + headroom)
            .min(cap.saturating_sub(charge - have).max(need))
            .saturating_sub(have);
        self.end = self.end.wrapping_add(want.min(free) as u16);
        self.charge.end.store(self.end, Ordering::Relaxed);
        drop(l);
        self.allowance(pos)
    }

    /// The error for a request that needs `need` entries, the queue being at `pos`.
    #[cold]
    pub(crate) fn full(&self, pos: u16, need: u32) -> Error {
        Error::CqFull {
            cqn: self.slots.cqn,
            needed: need,
            available: self.allowance(pos),
            capacity: self.slots.capacity,
        }
    }

    /// Room for one request at `pos` (receive queues and the verbs path; `cap`: the
    /// queue's depth).
    ///
    /// # Errors
    /// [`Error::CqFull`].
    #[inline]
    pub(crate) fn check_one(&mut self, pos: u16, cap: u32) -> Result<(), Error> {
        if self.allowance(pos) == 0 && self.top_up(pos, 1, cap) == 0 {
            return Err(self.full(pos, 1));
        }
        Ok(())
    }

    /// A request posted again at `pos` in place of one the poller retires with it (an SRQ
    /// WQE the device completed with a page fault): it needs no new entry of the CQ, since
    /// the completion of the one it replaces was consumed, so when the allowance is spent
    /// the end moves on by one without asking the CQ. The caller retires the replaced
    /// request after it moved the position.
    #[cold]
    pub(crate) fn carry_one(&mut self, pos: u16) {
        if self.allowance(pos) == 0 {
            let _l = self.slots.lock();
            self.end = self.end.wrapping_add(1);
            self.charge.end.store(self.end, Ordering::Relaxed);
        }
    }

    /// The queue goes away at position `pos`: its allowance is free at once, its
    /// outstanding requests when their completions are consumed.
    pub(crate) fn release(&mut self, pos: u16) {
        let mut l = self.slots.lock();
        let outstanding = pos.wrapping_sub(self.charge.queue.retired()) as u32;
        l.charges.retain(|c| !Arc::ptr_eq(c, &self.charge));
        if outstanding != 0 {
            l.orphans += outstanding;
            self.slots.new_epoch(&mut l);
        }
        self.end = pos;
    }
}

/// A queue's charge, taken off the queue as the queue goes away ([`CqShare::leave`]) and
/// given back ([`CqShare::release`]) when this drops, which its holder arranges to come
/// after the device QP is destroyed. Given back before, the count of the queue's
/// outstanding requests (its orphans) could be cleared by a poller that saw the CQ empty
/// while the still live QP went on completing into it: other queues could then post past
/// the CQ's entries and overrun it. rdma-core cleans a CQ of a QP's entries only after
/// destroying it too (`mlx5_destroy_qp`, then `__mlx5_cq_clean`).
#[derive(Debug)]
pub(crate) struct Leaving {
    share: CqShare,
    pos: u16,
    /// Set by [`Leaving::completes_nothing`]: no request of the queue can complete.
    quiet: bool,
}

impl Leaving {
    /// The queue's device QP never left INIT: nothing it posted can complete (a responder
    /// below RTR takes no receive, a QP sends nothing before RTS, and the destroy, a move
    /// to RESET, flushes nothing: the kernel's `destroy_qp_common`), so its outstanding
    /// requests go back with the charge instead of staying counted until a poller sees the
    /// CQ empty (on the verbs path, which reads no ring, only a poll frees those).
    pub(crate) fn completes_nothing(&mut self) {
        self.quiet = true;
    }
}

impl Drop for Leaving {
    fn drop(&mut self) {
        let pos = if self.quiet {
            self.share.charge.queue.retired()
        } else {
            self.pos
        };
        self.share.release(pos);
    }
}

impl CqShare {
    /// The queue, at position `pos`, goes away: its outstanding requests stay charged until
    /// the returned value drops; its allowance past `pos` goes back at once (nothing is
    /// ever posted there, so the device can complete nothing there, and a verbs-path QP on
    /// an SRQ may keep the `Leaving` until another CQ is polled: `Registry::defer`).
    pub(crate) fn leave(mut self, pos: u16) -> Leaving {
        let l = self.slots.lock();
        self.end = pos;
        self.charge.end.store(pos, Ordering::Relaxed);
        drop(l);
        Leaving {
            share: self,
            pos,
            quiet: false,
        }
    }
}

impl Drop for CqShare {
    fn drop(&mut self) {
        // Without `release` (a queue that never posted, or dropped with its CQ): everything
        // goes back.
        self.slots
            .lock()
            .charges
            .retain(|c| !Arc::ptr_eq(c, &self.charge));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::shadow::Shadow;

    /// A repost (an SRQ WQE posted again after a page fault) takes over the entry of the
    /// completion it replaces: with the allowance spent it moves the end by one without
    /// asking the CQ, and once the replaced one is retired the CQ is exactly as full.
    #[test]
    fn a_repost_carries_its_charge_over() {
        let slots = Arc::new(CqSlots::new(1, 4, None));
        let q = Arc::new(Shadow::<u64>::new(8));
        let mut a = CqShare::new(slots.clone(), q.clone(), 0);
        assert_eq!(a.top_up(0, 4, 8), 4);
        // Four receives posted: nothing left, the CQ full.
        assert_eq!((a.allowance(4), slots.free()), (0, 0));
        // The fault's completion was consumed; the repost moves the position to 5.
        a.carry_one(4);
        assert_eq!(a.allowance(4), 1);
        q.retire(1);
        assert_eq!(
            (a.allowance(5), slots.free()),
            (0, 0),
            "the same four outstanding"
        );
        // With allowance left, a repost spends it as any post.
        q.retire(2);
        assert_eq!(a.top_up(5, 1, 8), 1);
        a.carry_one(5);
        assert_eq!(a.allowance(5), 1);
    }

    /// A leaving queue's charge stays whole until the [`Leaving`] drops (its holder drops it
    /// after destroying the QP): a poller that sees the CQ empty meanwhile frees nothing of
    /// it, and a mark read before the drop frees nothing after it either.
    #[test]
    fn a_leaving_queue_keeps_its_charge_until_its_qp_is_gone() {
        let slots = Arc::new(CqSlots::new(1, 64, None));
        let (qa, qb) = (
            Arc::new(Shadow::<u64>::new(256)),
            Arc::new(Shadow::<u64>::new(256)),
        );
        let mut a = CqShare::new(slots.clone(), qa.clone(), 0);
        let mut b = CqShare::new(slots.clone(), qb, 0);
        assert_eq!(a.top_up(0, 10, 256), 26);
        assert_eq!(b.top_up(0, 1, 256), 17);
        // A posted 10 and goes away, its QP not destroyed yet.
        let leaving = a.leave(10);
        let before = slots.orphan_mark();
        assert_eq!(slots.free(), 64 - 10 - 17, "the outstanding requests kept");
        // The poller sees the CQ empty while the QP lives: nothing of A's is freed.
        slots.drained(slots.orphan_mark());
        assert_eq!(slots.free(), 64 - 10 - 17);
        // The QP is destroyed: the 10 outstanding stay counted (orphans).
        drop(leaving);
        assert_eq!(slots.free(), 64 - 10 - 17);
        assert_ne!(slots.orphan_mark(), before, "a new mark");
        // A mark read before the destroy frees nothing: the CQ was seen empty too early.
        slots.drained(before);
        assert_eq!(slots.free(), 64 - 10 - 17);
        // Seen empty after the destroy: every completion of A's was consumed.
        slots.drained(slots.orphan_mark());
        assert_eq!(slots.free(), 64 - 17);
        // What the poller retires before the destroy is not counted: C posts 10, leaves,
        // 4 of them complete and are consumed, then its QP is destroyed: 6 stay counted.
        let qc = Arc::new(Shadow::<u64>::new(256));
        let mut c = CqShare::new(slots.clone(), qc.clone(), 0);
        assert_eq!(c.top_up(0, 10, 256), 26);
        let leaving = c.leave(10);
        qc.retire(4);
        drop(leaving);
        assert_eq!(slots.free(), 64 - 17 - 6);
    }

    /// A leaving queue whose QP never left INIT gives its outstanding requests back with
    /// its charge: no orphans, no poll needed.
    #[test]
    fn a_queue_that_completes_nothing_leaves_no_orphans() {
        let slots = Arc::new(CqSlots::new(1, 64, None));
        let q = Arc::new(Shadow::<u64>::new(256));
        let mut a = CqShare::new(slots.clone(), q.clone(), 0);
        assert_eq!(a.top_up(0, 64, 256), 64);
        let mut leaving = a.leave(64);
        assert_eq!(slots.free(), 0, "kept whole until the QP is destroyed");
        leaving.completes_nothing();
        drop(leaving);
        assert_eq!((slots.free(), slots.orphan_mark()), (64, 0));
    }

    #[test]
    fn charges_shrink_as_the_poller_retires() {
        let slots = Arc::new(CqSlots::new(1, 64, None));
        let qa = Arc::new(Shadow::<u64>::new(256));
        let qb = Arc::new(Shadow::<u64>::new(256));
        let mut a = CqShare::new(slots.clone(), qa.clone(), 0);
        let mut b = CqShare::new(slots.clone(), qb.clone(), 0);
        // Two queues: a share of 32, a headroom of 16.
        assert_eq!(a.top_up(0, 1, 256), 17);
        assert_eq!(slots.free(), 47);
        // Never beyond the ring.
        assert_eq!(b.top_up(0, 1, 4), 4);
        // A posts its 17; B wants 60 and gets what is free.
        assert_eq!(b.top_up(4, 60, 256), 43);
        assert_eq!(slots.free(), 0);
        assert!(matches!(
            b.full(4, 60),
            Error::CqFull {
                needed: 60,
                available: 43,
                capacity: 64,
                ..
            }
        ));
        // The poller retires 5 of A's: free again without A doing anything.
        qa.retire(5);
        assert_eq!(slots.free(), 5);
        assert!(b.check_one(47, 256).is_ok());
        // B goes away at 48 with 48 outstanding: they stay counted until completed.
        b.release(48);
        assert_eq!(slots.free(), 64 - 12 - 48);
        let mark = slots.orphan_mark();
        // A queue dropped after the mark was read: its orphans stay.
        let qc = Arc::new(Shadow::<u64>::new(256));
        let mut c = CqShare::new(slots.clone(), qc, 0);
        assert_eq!(c.top_up(0, 1, 256), 4);
        c.release(2);
        slots.drained(mark);
        assert_eq!(slots.free(), 64 - 12 - 48 - 2);
        slots.drained(slots.orphan_mark());
        assert_eq!(slots.free(), 64 - 12);
    }
}
