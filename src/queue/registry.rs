//! The queues whose completions arrive on one CQ, by QP number: what a CQ's poller looks a
//! completion's QP up in, shared between the CQ and the QPs that use it (both data paths).

use super::cq_share::{CqSlots, RingView};
use super::invalidations::Invalidations;
use super::scatter::ScatterTable;
use super::shadow::{SendEntry, Shadow};
use super::srq_shared::SrqShared;
use super::teardown::Tombstone;
use core::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// The queues whose completions arrive on one CQ, by QP number.
#[derive(Clone)]
pub(crate) struct Attached {
    pub(crate) qpn: u32,
    pub(crate) sq: Option<Arc<Shadow<SendEntry>>>,
    pub(crate) rq: Option<Arc<Shadow<u64>>>,
    /// The receive queue's scatter lists (direct path: scatter-to-CQE).
    pub(crate) scatter: Option<Arc<ScatterTable>>,
    /// The SRQ the QP (or DCT) takes its receives from, when it has no receive queue of
    /// its own: a receive completion's cookie is the SRQ's, by the CQE's WQE index.
    pub(crate) srq: Option<Arc<SrqShared>>,
    /// Where the QP's receive completions with invalidate record the key (an RC QP's, and
    /// a direct-path UD QP's, unused; None for DCTs, verbs UD QPs and dead entries, through
    /// which no window is bound).
    pub(crate) invalidations: Option<Arc<Invalidations>>,
}

impl Attached {
    /// Records that a receive completion of this QP reported `rkey` invalidated by a peer
    /// (before the completion reaches the caller).
    #[inline(always)]
    pub(crate) fn invalidated(&self, rkey: u32) {
        if let Some(log) = &self.invalidations {
            log.record(rkey);
        }
    }

    /// A QP's send queue alone, on its send CQ (its receives complete elsewhere, or it has
    /// none).
    pub(crate) fn send(qpn: u32, sq: Arc<Shadow<SendEntry>>) -> Attached {
        Attached {
            qpn,
            sq: Some(sq),
            rq: None,
            scatter: None,
            srq: None,
            invalidations: None,
        }
    }
}

/// Marks the QP number of a dead entry (a verbs-path QP with an SRQ, destroyed: see
/// [`Registry::bury`]): above the 24 bits of a QP number, so a completion's number never
/// finds it but the search made for it once nothing else matched.
pub(crate) const DEAD: u32 = 1 << 31;

/// The dead entries a verbs-path CQ keeps, oldest dropped first: a receive of a QP dropped
/// more than this many SRQ-QP drops ago whose completion was still not polled keeps its SRQ
/// slot (`Srq::free` one lower) until the SRQ goes.
pub(crate) const MAX_DEAD: usize = 64;

/// What a dropped verbs-path QP on an SRQ leaves to its receive CQ: its device QP (and what
/// must go only after it), destroyed once the CQ's poller has taken every completion the QP
/// left there. libmlx5 destroys a QP by cleaning its entries out of its CQs and giving their
/// SRQ WQEs back to its own SRQ (`mlx5_destroy_qp` -> `__mlx5_cq_clean` ->
/// `mlx5_free_srq_wqe`), so a receive completion still in the CQ then would never reach the
/// poller, and the crate's SRQ slot (with the region pins of its scatter list) would never
/// come back: `Srq::free` one lower for good per such receive.
pub(crate) trait Remains: Send {
    /// Whether nothing else holds the device QP any more (its queues have gone), so that
    /// dropping these remains destroys it.
    fn alone(&self) -> bool;
}

/// A dropped verbs-path QP on an SRQ, kept by its receive CQ ([`Registry::defer`]): its
/// device QP, and the SRQ's shared state, whose scatter table holds the region pins of the
/// receives the QP consumed. Until the device QP is destroyed, a completion of one of them
/// may be in the CQ with its message inside the CQE, which libmlx5 copies into the SRQ
/// WQE's buffer when it is polled (`mlx5_copy_to_recv_srq`); the destroy cleans the CQ of
/// them (`__mlx5_cq_clean`, under the CQ's lock, so after a poll that was copying). The
/// QP's dead entry holds the state too, but may be dropped first (at most [`MAX_DEAD`] are
/// kept: `bury` drops the oldest): then the pins went, and the region with its memory,
/// while the device QP could still be polled into it (a review's finding).
/// Field order: the device QP is destroyed first, then the state goes.
struct Kept {
    /// The orphan epoch it was kept at.
    epoch: u64,
    device: Box<dyn Remains>,
    _srq: Arc<SrqShared>,
}

/// The list of attached queues, shared between a CQ and the QPs that use it. Changing it
/// bumps a generation the poller checks with one load; it re-reads the list (under the lock)
/// only then, never on the hot path. It also carries the CQ's entries that the queues share
/// out (see `cq_share`), and the [`Tombstone`]s of QPs destroyed while entries of theirs
/// may still be in the ring (direct-path CQs, `super::teardown`).
pub(crate) struct Registry {
    pub(crate) gen: AtomicU32,
    pub(crate) list: Mutex<Vec<Attached>>,
    pub(crate) slots: Arc<CqSlots>,
    tombs: Mutex<Vec<Arc<Tombstone>>>,
    /// What verbs-path QPs dropped from this (receive) CQ left to destroy
    /// ([`Registry::defer`]).
    remains: Mutex<Vec<Kept>>,
    /// The ring of a direct-path CQ (None on the verbs path).
    ring: Option<RingView>,
}

impl Registry {
    /// The registry of CQ `cqn`, whose device guarantees `capacity` entries; `ring` when
    /// the crate polls the ring itself.
    pub(crate) fn new(cqn: u32, capacity: u32, ring: Option<RingView>) -> Registry {
        Registry {
            gen: AtomicU32::new(0),
            list: Mutex::new(Vec::new()),
            slots: Arc::new(CqSlots::new(cqn, capacity, ring)),
            tombs: Mutex::new(Vec::new()),
            remains: Mutex::new(Vec::new()),
            ring,
        }
    }

    pub(crate) fn attach(&self, a: Attached) {
        let mut l = self.list.lock().unwrap_or_else(|e| e.into_inner());
        // A QP that got a dead one's number: the dead entry goes (the verbs poller tells
        // the dead one's completions from the new one's by their `wr_id`'s incarnation,
        // `crate::verbs::incarnation`, but not a receive of the same SRQ, which it takes
        // for the new QP's; rdma-core's CQ had them all consumed or cleaned by now in
        // practice: the number came back after the old QP was destroyed, `defer`).
        l.retain(|x| x.qpn != a.qpn | DEAD);
        match l.iter_mut().find(|x| x.qpn == a.qpn) {
            Some(x) => {
                x.sq = x.sq.take().or(a.sq);
                x.rq = x.rq.take().or(a.rq);
                x.scatter = x.scatter.take().or(a.scatter);
                x.srq = x.srq.take().or(a.srq);
                x.invalidations = x.invalidations.take().or(a.invalidations);
            }
            None => l.push(a),
        }
        self.gen.fetch_add(1, Ordering::Release);
    }

    /// The current list, and the generation it belongs to, if it changed since `seen`.
    #[cold]
    pub(crate) fn snapshot_if_changed(&self, seen: u32) -> Option<(Vec<Attached>, u32)> {
        let gen = self.gen.load(Ordering::Acquire);
        if gen == seen {
            return None;
        }
        Some((
            self.list.lock().unwrap_or_else(|e| e.into_inner()).clone(),
            gen,
        ))
    }

    /// Locks the list of attached queues: while held, no QP can attach (a QP that got a
    /// reused number waits until the old one's entries are accounted for).
    pub(crate) fn lock(&self) -> MutexGuard<'_, Vec<Attached>> {
        self.list.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Detaches QP `qpn`, whose QP the device no longer runs (destroyed), through the held
    /// `list`: on a direct-path CQ, leaves a tombstone over the entries it may have left in
    /// the ring, from the consumer index the poller published to the device's current end;
    /// on the verbs path, a QP that took its receives from an SRQ leaves a dead entry
    /// ([`DEAD`]) through which the poller gives the SRQ back the receives the QP consumed
    /// and never completed to anyone (rxe leaves their completions in the CQ; libmlx5 would
    /// clean them at the destroy, `__mlx5_cq_clean`, so a verbs-path QP on an SRQ is
    /// destroyed only once the poller has taken them: [`Registry::defer`]).
    pub(crate) fn bury(&self, list: &mut Vec<Attached>, qpn: u32) {
        let srq = list
            .iter()
            .find(|x| x.qpn == qpn)
            .and_then(|x| x.srq.clone());
        match (&self.ring, srq) {
            (Some(ring), srq) => {
                let t = Tombstone::new(qpn, super::teardown::device_end(ring)).with_srq(srq);
                let mut tombs = self.tombs.lock().unwrap_or_else(|e| e.into_inner());
                tombs.retain(|t| !t.is_done());
                if !t.is_done() {
                    tombs.push(Arc::new(t));
                }
            }
            (None, Some(srq)) => {
                if list.iter().filter(|x| x.qpn & DEAD != 0).count() >= MAX_DEAD {
                    if let Some(i) = list.iter().position(|x| x.qpn & DEAD != 0) {
                        list.remove(i);
                    }
                }
                list.retain(|x| x.qpn != qpn | DEAD);
                list.push(Attached {
                    qpn: qpn | DEAD,
                    sq: None,
                    rq: None,
                    scatter: None,
                    srq: Some(srq),
                    invalidations: None,
                });
            }
            (None, None) => {}
        }
        // After the tombstone: a poller that no longer finds the QP finds its tombstone.
        list.retain(|x| x.qpn != qpn);
        self.gen.fetch_add(1, Ordering::Release);
    }

    /// Keeps `r` (a buried QP's device QP), and after it `srq`, the shared state of the
    /// SRQ it took its receives from ([`Kept`]), until the poller has seen the CQ empty
    /// after this: by then the QP's completions (the QP went to error and its last-WQE event was
    /// waited for before, `Qp::drop`) were all taken through its dead entry.
    /// At most [`MAX_DEAD`] are kept (as many as dead entries): past that the oldest whose
    /// queues are gone is destroyed at once (its unpolled receives' slots lost, as before).
    pub(crate) fn defer(&self, r: Box<dyn Remains>, srq: Arc<SrqShared>) {
        let oldest = {
            let mut remains = self.remains.lock().unwrap_or_else(|e| e.into_inner());
            remains.push(Kept {
                epoch: self.slots.mark(),
                device: r,
                _srq: srq,
            });
            if remains.len() > MAX_DEAD {
                remains
                    .iter()
                    .position(|k| k.device.alone())
                    .map(|i| remains.remove(i))
            } else {
                None
            }
        };
        // Destroyed outside the lock; the SRQ state it kept may have held the last pins on a
        // region whose domain went.
        if let Some(k) = oldest {
            drop(k);
            crate::queue::lifetime::sweep_held();
        }
    }

    /// The poller saw the CQ empty after [`CqSlots::orphan_mark`] returned `mark` (verbs
    /// path; outside any `ibv_start_poll` session): the orphans' entries are free
    /// ([`CqSlots::drained`]) and the remains kept at or before `mark` whose queues are gone
    /// are destroyed; those still held are kept, the mark set again for them.
    #[cold]
    #[inline(never)]
    pub(crate) fn drained(&self, mark: u64) {
        self.slots.drained(mark);
        let (gone, left) = {
            let mut remains = self.remains.lock().unwrap_or_else(|e| e.into_inner());
            if remains.is_empty() {
                return;
            }
            let (gone, keep): (Vec<_>, Vec<_>) = remains
                .drain(..)
                .partition(|k| k.epoch <= mark && k.device.alone());
            *remains = keep;
            (gone, !remains.is_empty())
        };
        // Destroyed outside the lock (their charges go back to the CQs' ledgers); the SRQ
        // states they kept may have held the last pins on a region whose domain went.
        if !gone.is_empty() {
            drop(gone);
            crate::queue::lifetime::sweep_held();
        }
        if left {
            // The poller comes back at its next empty poll.
            self.slots.mark();
        }
    }

    /// The live tombstones (read after the list, see `bury`).
    #[cold]
    pub(crate) fn tombstones(&self) -> Vec<Arc<Tombstone>> {
        let tombs = self.tombs.lock().unwrap_or_else(|e| e.into_inner());
        tombs.iter().filter(|t| !t.is_done()).cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_srq(qpn: u32, srq: &Arc<SrqShared>) -> Attached {
        Attached {
            qpn,
            sq: None,
            rq: None,
            scatter: None,
            srq: Some(srq.clone()),
            invalidations: None,
        }
    }

    /// On a verbs-path CQ a buried QP with an SRQ leaves a dead entry (its number marked),
    /// one without leaves nothing; a QP that gets the number back removes the dead one; at
    /// most [`MAX_DEAD`] are kept, the oldest dropped first.
    #[test]
    fn buried_srq_qps_leave_dead_entries_on_a_verbs_cq() {
        let r = Registry::new(1, 64, None);
        let srq = Arc::new(SrqShared::new(9, 8, 1));
        r.attach(with_srq(5, &srq));
        r.attach(Attached::send(6, Arc::new(Shadow::new(8))));
        let mut l = r.lock();
        r.bury(&mut l, 5);
        r.bury(&mut l, 6);
        let qpns: Vec<u32> = l.iter().map(|a| a.qpn).collect();
        assert_eq!(qpns, [5 | DEAD]);
        drop(l);
        // The number comes back: the dead entry goes, the new QP is attached whole.
        r.attach(with_srq(5, &srq));
        assert_eq!(r.lock().iter().map(|a| a.qpn).collect::<Vec<_>>(), [5]);
        // More drops than kept: the oldest go.
        for qpn in 10..10 + MAX_DEAD as u32 + 3 {
            r.attach(with_srq(qpn, &srq));
            let mut l = r.lock();
            r.bury(&mut l, qpn);
        }
        let l = r.lock();
        let dead: Vec<u32> = l
            .iter()
            .filter(|a| a.qpn & DEAD != 0)
            .map(|a| a.qpn & !DEAD)
            .collect();
        assert_eq!(dead.len(), MAX_DEAD);
        assert_eq!(dead[0], 13, "the three oldest dropped");
        assert!(l.iter().any(|a| a.qpn == 5), "the live QP stays");
    }

    /// Remains of a dropped SRQ QP (its device QP): set when they are destroyed, with
    /// whether the pins `watch` names were still held then (the device QP could copy a
    /// polled message into their region until its destroy).
    struct FakeRemains {
        destroyed: Arc<core::sync::atomic::AtomicU8>,
        watch: Option<Arc<super::super::pin::Pins>>,
    }
    const HELD_AT_DESTROY: u8 = 1;
    const RELEASED_AT_DESTROY: u8 = 2;
    impl Remains for FakeRemains {
        fn alone(&self) -> bool {
            true
        }
    }
    impl Drop for FakeRemains {
        fn drop(&mut self) {
            let released = self.watch.as_ref().is_some_and(|p| p.released());
            let v = if released {
                RELEASED_AT_DESTROY
            } else {
                HELD_AT_DESTROY
            };
            self.destroyed.store(v, Ordering::SeqCst);
        }
    }

    /// A dropped verbs-path QP on an SRQ whose receive CQE (with data scattered to the CQE,
    /// which libmlx5 copies into the SRQ WQE's buffer when it is polled) is still in the
    /// CQ: its device QP is kept (`defer`), and so are the pins of the receive's region,
    /// until the device QP is destroyed. The 64th later SRQ-QP drop evicts the dead entry
    /// in `bury` (under the list's lock) but destroys the device QP only in `defer`, after
    /// the lock is released: when only the dead entry kept the SRQ's shared state, a poller
    /// that refreshed in between dropped its last reference, its scatter table gave the
    /// region's pin back (the region could be deregistered and freed), and its next poll
    /// still found the CQE of the live device QP (libmlx5 cleans the CQ only when the QP is
    /// destroyed). A review's finding, this test its demonstration.
    #[test]
    fn a_dead_entry_outlives_its_device_qp() {
        use super::super::regions::{one_writable_region, RegionCheck};
        use core::sync::atomic::AtomicU8;
        let r = Registry::new(1, 64, None);
        // SRQ S, one receive posted in slot 0 into a region pinned by it.
        let (regions, pins) = one_writable_region(7, 0x1000);
        let s = Arc::new(SrqShared::new(9, 8, 1));
        let sge = mlx5::request::Sge {
            addr: 0x1000,
            len: 64,
            lkey: 7,
        };
        assert_eq!(
            s.scatter
                .record(0, &[sge], Some(&mut RegionCheck::new(regions.clone()))),
            None
        );
        // The user drops the region: parked until its pin goes.
        regions.remove(7);
        assert!(!pins.close());
        // QP 5 on S took that receive (its CQE unpolled) and is dropped.
        r.attach(with_srq(5, &s));
        {
            let mut l = r.lock();
            r.bury(&mut l, 5);
        }
        let a_destroyed = Arc::new(AtomicU8::new(0));
        r.defer(
            Box::new(FakeRemains {
                destroyed: a_destroyed.clone(),
                watch: Some(pins.clone()),
            }),
            s.clone(),
        );
        // The SRQ and every QP on it are gone: the dead entry holds S's state.
        drop(s);
        // 64 QPs on another SRQ are dropped (the CQ is not polled meanwhile).
        let s2 = Arc::new(SrqShared::new(10, 8, 1));
        for qpn in 100..100 + MAX_DEAD as u32 {
            r.attach(with_srq(qpn, &s2));
            {
                let mut l = r.lock();
                r.bury(&mut l, qpn);
            }
            // Between `destroy_and_bury` and `defer` in `Qp::drop`: the poller refreshes
            // (a snapshot of the list replaces its cache, the old one is dropped).
            let (snapshot, _) = r.snapshot_if_changed(u32::MAX).unwrap();
            drop(snapshot);
            assert!(
                !pins.released() || a_destroyed.load(Ordering::SeqCst) != 0,
                "QP {qpn}'s drop: the receive's region pin was given back while QP 5's \
                 device QP (its CQE still in the CQ) is alive"
            );
            let other = FakeRemains {
                destroyed: Arc::new(AtomicU8::new(0)),
                watch: None,
            };
            r.defer(Box::new(other), s2.clone());
        }
        // The 64th drop destroyed QP 5's device QP, with the pin still held, and let the
        // pin go after.
        assert_eq!(a_destroyed.load(Ordering::SeqCst), HELD_AT_DESTROY);
        assert!(pins.released(), "given back once the device QP is gone");
    }
}
