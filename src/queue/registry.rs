//! The queues whose completions arrive on one CQ, by QP number: what a CQ's poller looks a
//! completion's QP up in, shared between the CQ and the QPs that use it (both data paths).

use super::cq_share::{CqSlots, RingView};
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
}

impl Attached {
    /// A QP's send queue alone, on its send CQ (its receives complete elsewhere, or it has
    /// none).
    pub(crate) fn send(qpn: u32, sq: Arc<Shadow<SendEntry>>) -> Attached {
        Attached {
            qpn,
            sq: Some(sq),
            rq: None,
            scatter: None,
            srq: None,
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
    /// What verbs-path QPs dropped from this (receive) CQ left to destroy, each with the
    /// orphan epoch it was kept at ([`Registry::defer`]).
    remains: Mutex<Vec<(u64, Box<dyn Remains>)>>,
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
                });
            }
            (None, None) => {}
        }
        // After the tombstone: a poller that no longer finds the QP finds its tombstone.
        list.retain(|x| x.qpn != qpn);
        self.gen.fetch_add(1, Ordering::Release);
    }

    /// Keeps `r` (a buried QP's device QP) until the poller has seen the CQ empty after
    /// this: by then the QP's completions (the QP went to error and its last-WQE event was
    /// waited for before, `Qp::drop`) were all taken through its dead entry.
    /// At most [`MAX_DEAD`] are kept (as many as dead entries): past that the oldest whose
    /// queues are gone is destroyed at once (its unpolled receives' slots lost, as before).
    pub(crate) fn defer(&self, r: Box<dyn Remains>) {
        let oldest = {
            let mut remains = self.remains.lock().unwrap_or_else(|e| e.into_inner());
            remains.push((self.slots.mark(), r));
            if remains.len() > MAX_DEAD {
                remains
                    .iter()
                    .position(|(_, r)| r.alone())
                    .map(|i| remains.remove(i))
            } else {
                None
            }
        };
        // Destroyed outside the lock.
        drop(oldest);
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
                .partition(|(epoch, r)| *epoch <= mark && r.alone());
            *remains = keep;
            (gone, !remains.is_empty())
        };
        // Destroyed outside the lock (their charges go back to the CQs' ledgers).
        drop(gone);
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
}
