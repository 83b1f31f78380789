//! Ownership of regions while work is outstanding: reference counts, not lifetimes.
//!
//! A request carries plain keys (an lkey in a gather entry, an rkey in a peer's write), so the
//! borrow checker cannot tie it to the region it names, and tying every post to a borrow
//! would forbid the fire-and-forget posting that RDMA programs rely on. Instead:
//! - a [`Qp`](crate::Qp) holds reference counts of its CQs, so a CQ is destroyed only after
//!   every QP on it (and its poller) is gone;
//! - a [`MemoryRegion`](crate::MemoryRegion) dropped while a send queue of its protection
//!   domain still has work outstanding, or while a posted receive pins it, is not
//!   deregistered at once: the registration is parked in the protection domain until every
//!   request posted to a send queue before the drop has completed and every receive that
//!   pinned it has completed (it is reclaimed on later region drops and allocations, QP
//!   drops, [`Pd::reclaim`](crate::Pd::reclaim), and at the latest when the protection
//!   domain goes; a region a CQ's poller may still copy a received message into, its
//!   receive's pins held, outlives its domain until the poller lets them go, and goes when
//!   the poller has let go of them or its CQ goes, or at the latest with the next reclaim
//!   or domain drop of any domain).
//!
//! Receives are tracked per region (`crate::queue::pin`): a receive pins each region it
//! lands in, in one atomic step against the drop's close, so that a receive posted on one
//! thread while the region is dropped on another either keeps it registered or finds it
//! gone; a receive queue that always holds receives keeps no other region registered.
//! Send queues are tracked as a whole: the device checks every key of a send when it runs
//! it, so a send racing the drop of its region at worst completes with a protection error;
//! the CPU touches no region memory for a send.

use crate::queue::pin::Pins;
use crate::queue::shadow::Shadow;
use std::sync::{Arc, Mutex, Weak};

/// How far a queue has posted and retired.
pub(crate) trait Progress: Send + Sync {
    fn posted(&self) -> u64;
    fn done_up_to(&self, mark: u64) -> bool;
}

impl<T: Copy + Default + Send> Progress for Shadow<T> {
    fn posted(&self) -> u64 {
        Shadow::posted_wide(self)
    }
    fn done_up_to(&self, mark: u64) -> bool {
        Shadow::done_up_to_wide(self, mark)
    }
}

/// A registration (a region's, or a window's allocation). The device may refuse to
/// deregister it (rxe refuses `ibv_dereg_mr` while a memory window is bound to the region; a
/// ConnectX and the software NIC do not, so the crate never asks while a window holds a pin
/// on the region): its memory is freed only once it is deregistered, never under a live
/// registration.
pub(crate) trait Deregister: Send {
    /// Deregisters, then frees the memory it owns; false when the device refused (the
    /// registration and its memory stay as they are: try again later).
    fn deregister(&mut self) -> bool;
}

/// A registration on its way out.
pub(crate) type Registration = Box<dyn Deregister>;

struct Parked {
    reg: Registration,
    marks: Vec<(Weak<dyn Progress>, u64)>,
    /// The region's pins (closed): none may be held when it is deregistered.
    pins: Option<Arc<Pins>>,
}

impl Parked {
    fn done(&self) -> bool {
        self.pins.as_ref().map_or(true, |p| p.released())
            && self
                .marks
                .iter()
                .all(|(q, mark)| q.upgrade().map_or(true, |q| q.done_up_to(*mark)))
    }
}

/// The regions whose domain went away while a scatter table still held pins in them
/// ([`Lifetimes::clear`]): a CQ's poller may still be copying a message that arrived inside
/// its CQE into one (scatter-to-CQE) until it lets the pins go, so each stays registered,
/// its memory alive, until then. Swept ([`sweep_held`]) where the poller lets go of a
/// dropped queue's receives (its refresh of the queue list, its pass of a tombstone, an
/// empty poll that destroys kept SRQ QPs), when a CQ goes ([`SweepHeld`]), a kept SRQ QP
/// is destroyed or a QP's drop has buried it (which drops the tombstones the pollers
/// passed), and at every reclaim and `clear` (of any domain). Kept reachable, not
/// leaked (the AddressSanitizer stage's leak check found the counters leaked when an SRQ's
/// receives outlived their domain in a CQ's tombstone).
///
/// Never swept where a lock is held (not from a scatter table's drop, which a CQ's
/// queue-list lock may be held around: `Registry::bury`), and nothing is deregistered or
/// dropped while this list is locked: a registration's drop can drop a caller's buffer
/// ([`crate::RegionBuffer`]), whose own drop may drop a QP, which takes its CQs' locks (a
/// review found the deadlock).
static HELD: Mutex<Vec<Held>> = Mutex::new(Vec::new());

/// A region of [`HELD`]: its pins, and its registration until they are released.
struct Held {
    pins: Arc<Pins>,
    reg: Registration,
}

/// Takes the regions of [`HELD`] whose pins were let go out of `held`: the caller
/// deregisters them once the list is unlocked ([`deregister_all`]).
fn sweep(held: &mut Vec<Held>) -> Vec<Registration> {
    // In place, allocating only for what goes: a sweep runs at every QP drop and queue-list
    // refresh, mostly over an empty or unchanged list (a partition into two new lists cost
    // the production route's poll 0.3 instructions, `cargo xtask icount`).
    let mut gone = Vec::new();
    let mut i = 0;
    while i < held.len() {
        if held[i].pins.released() {
            gone.push(held.swap_remove(i).reg);
        } else {
            i += 1;
        }
    }
    gone
}

/// Deregisters `regs` (each, or leaks it: [`deregister_or_leak`]).
fn deregister_all(regs: Vec<Registration>) {
    for r in regs {
        deregister_or_leak(r);
    }
}

/// Deregisters the regions of gone domains whose pins were let go ([`HELD`]): called where
/// the poller or a drop may have let such pins go, with no lock held, so that such a
/// region goes then rather than at the next reclaim of some other domain of the process.
pub(crate) fn sweep_held() {
    let gone = sweep(&mut HELD.lock().unwrap_or_else(|e| e.into_inner()));
    deregister_all(gone);
}

/// Sweeps [`HELD`] when dropped: the last field of a CQ, after its poller (and the scatter
/// tables it held) went.
#[derive(Default)]
pub(crate) struct SweepHeld;

impl Drop for SweepHeld {
    fn drop(&mut self) {
        sweep_held();
    }
}

/// Deregisters `reg`, or leaks it with its memory when the device refuses: freeing it
/// under a live registration would let the device write freed heap.
fn deregister_or_leak(mut reg: Registration) {
    if !reg.deregister() {
        std::mem::forget(reg);
    }
}

/// The queues of a protection domain and the registrations waiting for them.
#[derive(Default)]
pub(crate) struct Lifetimes {
    queues: Mutex<Vec<Weak<dyn Progress>>>,
    parked: Mutex<Vec<Parked>>,
}

impl Lifetimes {
    /// A send queue whose outstanding work may name regions of this domain (held weakly:
    /// the queue's owner keeps it). Receive queues pin the regions instead.
    pub(crate) fn track<Q: Progress + 'static>(&self, q: &Arc<Q>) {
        let q: Weak<dyn Progress> = Arc::downgrade(q) as _;
        let mut qs = self.queues.lock().unwrap_or_else(|e| e.into_inner());
        qs.retain(|q| q.strong_count() > 0);
        qs.push(q);
    }

    /// Deregisters now when nothing is outstanding and the device agrees; otherwise parks
    /// the registration until the work posted so far has completed, no receive pins the
    /// region (`pins`, closed here first: no receive pins it from now on) and the device
    /// agrees (its windows are unbound or freed).
    pub(crate) fn release(&self, mut reg: Registration, pins: Option<Arc<Pins>>) {
        let unpinned = pins.as_ref().map_or(true, |p| p.close());
        let marks: Vec<(Weak<dyn Progress>, u64)> = self
            .queues
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter_map(|w| {
                let q = w.upgrade()?;
                let mark = q.posted();
                // Outstanding work: the queue has not retired everything it posted.
                (!q.done_up_to(mark)).then(|| (w.clone(), mark))
            })
            .collect();
        if !(unpinned && marks.is_empty() && reg.deregister()) {
            self.parked
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(Parked { reg, marks, pins });
        }
        self.reclaim();
    }

    /// Deregisters every parked region whose work has completed, if the device agrees (and
    /// the regions of gone domains whose pins were let go since, [`HELD`]). Returns how
    /// many of this domain's remain.
    pub(crate) fn reclaim(&self) -> usize {
        sweep_held();
        // Dropped once the list is unlocked: a registration's drop can drop a caller's
        // buffer ([`crate::RegionBuffer`]), whose own drop may drop a region, window or QP
        // of this domain, which releases or reclaims here again (with the list still locked
        // that thread hung: a review found it).
        let mut gone = Vec::new();
        let left = {
            let mut p = self.parked.lock().unwrap_or_else(|e| e.into_inner());
            // A window's deallocation gives back its pins on regions parked before it: again
            // until a pass lets nothing go.
            loop {
                let before = p.len();
                let mut i = 0;
                while i < p.len() {
                    let x = &mut p[i];
                    if x.done() && x.reg.deregister() {
                        gone.push(p.remove(i));
                    } else {
                        i += 1;
                    }
                }
                if p.len() == before {
                    break p.len();
                }
            }
        };
        drop(gone);
        left
    }

    /// The domain is going away (no QP or window is left on it): deregisters everything.
    /// A registration the device still refuses to deregister keeps its memory for the rest
    /// of the process (leaked: freeing it under a live registration would let the device
    /// write freed heap).
    ///
    /// Every QP of the domain is destroyed by now, so the device writes no receive any
    /// more; but pins may still be held by the scatter table of a destroyed QP or SRQ that
    /// a CQ's poller has not let go of yet (it gives them back when it passes their entries,
    /// or when the CQ goes), and until then the poller may be copying a message from a CQE
    /// into the region: such a region stays registered in [`HELD`], its memory alive, and is
    /// deregistered once its pins are released (at the next [`sweep_held`]: where the poller
    /// lets go of them, when the CQ goes, or at a later reclaim or `clear`). Deregistered at once, a
    /// copy that had checked the queue list just before the QP's destroy wrote freed memory
    /// (a review's finding).
    pub(crate) fn clear(&self) {
        let mut parked =
            std::mem::take(&mut *self.parked.lock().unwrap_or_else(|e| e.into_inner()));
        // Windows first (no pins of their own): their deallocation gives back their pins on
        // the regions after them.
        parked.sort_by_key(|p| p.pins.is_some());
        let mut keep = Vec::new();
        for mut p in parked {
            match p.pins.take().filter(|p| !p.released()) {
                Some(pins) => keep.push(Held { pins, reg: p.reg }),
                None => deregister_or_leak(p.reg),
            }
        }
        // Swept after they are in: a scatter table that let their pins go since the check
        // above swept before they were there.
        let gone = {
            let mut held = HELD.lock().unwrap_or_else(|e| e.into_inner());
            held.extend(keep);
            sweep(&mut held)
        };
        deregister_all(gone);
    }
}
