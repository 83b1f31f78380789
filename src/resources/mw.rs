//! Memory windows: remote access to a sub-range of a region, with their own rkey and rights,
//! re-bound (new rkey) or invalidated without re-registering memory (uDAPL `dat_rmr_bind`).

use super::Pd;
use crate::backend;
use crate::error::{Error, Result};
use crate::queue::invalidations::Invalidations;
use crate::queue::lifetime::Deregister;
use crate::queue::pin::Pins;
use crate::queue::shadow::{SendEntry, Shadow};
use mlx5::request::Access;
use mlx5::request::MwType;
use std::sync::Arc;

/// A memory window. Its rkey changes with every bind ([`MemoryWindow::rkey`] is the current
/// one); an unbound or invalidated window grants nothing.
///
/// The window knows which key the NIC holds: a bind or unbind posted through
/// [`Qp::bind_mw`](crate::Qp::bind_mw) / [`Qp::unbind_mw`](crate::Qp::unbind_mw) is *in
/// flight* until the poller has seen it (or a later request of its QP) complete; it is
/// committed when it succeeded and forgotten when it failed or was flushed, so the key and
/// binding never run ahead of the NIC. A window dropped with a bind or unbind in flight is
/// deallocated only once that work has completed (see its `Drop`): the bind completes as
/// posted, and its QP lives on.
///
/// A window bound to a region keeps the region registered: a bind **pins** the region (as a
/// posted receive does, `crate::queue::pin`) from the moment it is posted, and the pin goes
/// when the window no longer names the region as far as the NIC is concerned (an unbind or
/// another bind committed, a peer's invalidation recorded with
/// [`MemoryWindow::invalidated`], the bind failed, or the window deallocated). A dropped
/// region is deregistered only then: a ConnectX deregisters a region under a bound window
/// (the kernel's `mlx5_ib_dereg_mr` does not look for windows) and hands its key to the next
/// registration, which the window's translation would then reach.
///
/// Granting a peer 256 bytes of a region, then revoking it:
///
/// ```
/// # #[cfg(feature = "sim")] fn main() -> blueflame::Result<()> {
/// use blueflame::{Access, Completion, Device, MwType, PostFlags, PostSend, QpCaps, Remote, WcStatus};
/// let dev = Device::sim_stepped();
/// let pd = dev.alloc_pd()?;
/// let (mut cq_a, mut cq_b) = (dev.create_cq(64)?, dev.create_cq(64)?);
/// let mut a = pd.create_qp(&cq_a, &cq_a, QpCaps::default())?;   // the peer
/// let mut b = pd.create_qp(&cq_b, &cq_b, QpCaps::default())?;   // the owner
/// let (ea, eb) = (a.endpoint()?, b.endpoint()?);
/// a.connect(&eb)?;
/// b.connect(&ea)?;
/// let rights = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::MW_BIND;
/// let mr = pd.alloc_mr(4096, rights)?;
/// let mut mw = pd.alloc_mw(MwType::Two)?;
/// let rkey = b.bind_mw(&mut mw, &mr, 1024, 256, Access::REMOTE_WRITE, 1, PostFlags::SIGNALED)?;
/// dev.process();
/// let mut out = [Completion::default(); 4];
/// assert_eq!(cq_b.poll(&mut out), 1);
/// // The peer writes through the window's key (sent to it, e.g. in an Exchange).
/// let at = Remote { addr: mr.addr() + 1024, rkey };
/// a.write_inline(b"granted", at, 2, PostFlags::SIGNALED)?;
/// dev.process();
/// assert_eq!((cq_a.poll(&mut out), out[0].status), (1, WcStatus::Success));
/// // Revoked: the same key now fails with a remote access error.
/// b.unbind_mw(&mut mw, 3, PostFlags::SIGNALED)?;
/// dev.process();
/// assert_eq!(cq_b.poll(&mut out), 1);
/// assert!(!mw.is_bound());
/// a.write_inline(b"late", at, 4, PostFlags::SIGNALED)?;
/// dev.process();
/// assert_eq!((cq_a.poll(&mut out), out[0].status), (1, WcStatus::RemAccessErr));
/// # Ok(()) }
/// # #[cfg(not(feature = "sim"))] fn main() {}
/// ```
pub struct MemoryWindow {
    /// The backend's window (`None` only once dropped).
    pub(crate) kind: Option<backend::Mw>,
    /// The key the NIC holds as far as known (the last committed bind).
    pub(crate) rkey: u32,
    /// The QP a type-2 window is bound through (`Some` for a bound type-1 window too, with
    /// the QP that bound it), as of the last committed bind or unbind.
    pub(crate) bound: Option<u32>,
    pub(crate) mw_type: MwType,
    pub(crate) pd: Pd,
    /// Binds and unbinds posted and not known to be complete, all on one QP, in order.
    pub(crate) flight: Option<InFlight>,
    /// The pin on the region the window is bound to, as of the last committed bind.
    pub(crate) region: Option<Pinned>,
    /// The keys peers invalidated through the QP of the last committed bind (None when
    /// unbound): what [`MemoryWindow::invalidated`] checks a caller's word against.
    pub(crate) invalidations: Option<Arc<Invalidations>>,
    /// The key variant a type-2 window's next bind goes on from: the last variant posted
    /// for it (by a bind that failed too), else that of a dropped type-2 window of this
    /// domain that had the same index (see [`Pd::alloc_mw`]). None for type-1 windows,
    /// whose keys a peer cannot invalidate (and whose verbs-path keys rdma-core picks).
    pub(crate) after: Option<u8>,
}

/// One pin on a region, given back when dropped.
#[derive(Debug)]
pub(crate) struct Pinned(Arc<Pins>);

impl Pinned {
    /// Pins `pins`' region; None at the pin count's limit (`2^31 - 1` pins) or for a closed
    /// region (which a caller holding the region never sees).
    pub(crate) fn new(pins: &Arc<Pins>) -> Option<Pinned> {
        pins.pin().then(|| Pinned(pins.clone()))
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        self.0.unpin();
    }
}

/// What one bind or unbind will make of the window if it succeeds.
#[derive(Debug)]
pub(crate) struct Step {
    pub(crate) rkey: u32,
    pub(crate) bound: Option<u32>,
    /// A bind's pin on its region (None for an unbind): the window's once the bind is
    /// committed, dropped if it fails.
    pub(crate) region: Option<Pinned>,
    /// A bind's QP's record of invalidated keys (None for an unbind): the window's once the
    /// bind is committed.
    pub(crate) invalidations: Option<Arc<Invalidations>>,
    /// Its positions in the send queue, as 64-bit counts ([`Shadow::widen_posted`]): exact
    /// however long the window stays unsettled.
    pub(crate) start: u64,
    pub(crate) end: u64,
}

/// The window's requests in flight on one QP (up to [`MAX_IN_FLIGHT`]).
pub(crate) struct InFlight {
    /// The QP's send queue (the queue names the QP: a QP that got the number of a dropped
    /// one is another QP).
    pub(crate) shadow: Arc<Shadow<SendEntry>>,
    pub(crate) steps: [Option<Step>; MAX_IN_FLIGHT],
}

/// Binds and unbinds of one window that may be in flight at once (on its QP).
pub(crate) const MAX_IN_FLIGHT: usize = 4;

impl core::fmt::Debug for MemoryWindow {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("MemoryWindow")
            .field("rkey", &format_args!("{:#x}", self.rkey))
            .field("type", &self.mw_type)
            .finish()
    }
}

impl MemoryWindow {
    /// rdma-core's window (the verbs path binds it by pointer).
    pub(crate) fn verbs_mw(&self) -> Option<*mut rdma_sys::ibv_mw> {
        self.kind.as_ref().and_then(backend::Mw::verbs_mw)
    }
}

impl Pd {
    /// Allocates a memory window of `mw_type`.
    ///
    /// # Errors
    /// [`Error::Verbs`] (`EOPNOTSUPP` when the device has no windows).
    pub fn alloc_mw(&self, mw_type: MwType) -> Result<MemoryWindow> {
        let (kind, rkey) = self.inner.pd.alloc_mw(mw_type)?;
        // A window dropped with this index may have left a peer's invalidation of its key
        // unread in a CQ: this one's keys go on from that key's variant, so that no record
        // of it is taken for one of this window's (until its variants wrap, 256 binds on).
        // The device may hand the index back with the same variant at once (the mlx5
        // driver's variant counter is device-wide).
        // A type-1 window leaves the entry to the next type-2 window with the index.
        let after = (mw_type == MwType::Two)
            .then(|| {
                self.inner
                    .window_keys
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&(rkey >> 8))
            })
            .flatten();
        Ok(MemoryWindow {
            kind: Some(kind),
            rkey,
            bound: None,
            mw_type,
            pd: self.clone(),
            flight: None,
            region: None,
            invalidations: None,
            after,
        })
    }
}

impl MemoryWindow {
    /// The current rkey: what a peer uses after the last bind (the key of a bind still in
    /// flight, which is valid once it completes; after a failed bind, the key from before it).
    pub fn rkey(&self) -> u32 {
        self.current().0
    }

    /// Whether the window is bound, as of its last bind or unbind (in flight included).
    /// A window a peer invalidated with its send with invalidate stays "bound" here until
    /// [`MemoryWindow::invalidated`] records it.
    pub fn is_bound(&self) -> bool {
        self.current().1.is_some()
    }

    /// The key and binding: committed, then every request in flight that has not failed.
    fn current(&self) -> (u32, Option<u32>) {
        let mut now = (self.rkey, self.bound);
        if let Some(f) = &self.flight {
            for s in f.steps.iter().flatten() {
                if f.shadow.outcome(s.start, s.end) == Some(false) {
                    break;
                }
                now = (s.rkey, s.bound);
            }
        }
        now
    }

    /// Records that a peer invalidated the window's key `rkey` with its send with
    /// invalidate: the window is unbound from then on, and the region it was bound to may
    /// be deregistered. Call it after polling the receive completion that says so
    /// ([`WcOpcode::RecvWithInv`](crate::WcOpcode::RecvWithInv), the key in
    /// [`Completion::imm`](crate::Completion::imm)).
    ///
    /// The crate does not take the caller's word for it: the poller records every key a
    /// receive completion of the window's QP reported invalidated, and this takes that
    /// record. A false claim would let the region be deregistered while the NIC still
    /// holds the window, whose translation could then reach the next registration. A QP
    /// keeps the last 16 such keys; one not claimed before 16 more arrived on that QP is
    /// refused, and the window keeps its region until it is dropped. A window given the
    /// key index of a dropped one binds on from that one's last key, so that a peer's
    /// invalidation of it still unread is not taken for this window's (see
    /// `docs/architecture.md`, "Memory windows: the rules").
    ///
    /// # Errors
    /// [`Error::WindowState`], nothing changed: a bind or unbind of the window is still in
    /// flight; a type-1 window (a peer cannot invalidate one); the window is not bound, or
    /// bound with another key; no receive completion polled on its QP reported `rkey`
    /// invalidated (or its record was already taken, or overwritten).
    pub fn invalidated(&mut self, rkey: u32) -> Result<()> {
        self.settle();
        let refuse = |state| Err(Error::WindowState { rkey, state });
        if self.flight.is_some() {
            return refuse("a bind or unbind of the window is in flight (poll it first)");
        }
        if self.mw_type == MwType::One {
            return refuse("a type-1 window, which a peer cannot invalidate");
        }
        if self.bound.is_none() {
            return refuse("the window is not bound");
        }
        if rkey != self.rkey {
            return refuse("not the window's key");
        }
        match &self.invalidations {
            Some(log) if log.take(rkey) => {}
            _ => {
                return refuse(
                    "no receive completion of the window's QP reported this key invalidated \
                     (poll it first; a QP keeps the last 16)",
                )
            }
        }
        self.bound = None;
        self.invalidations = None;
        if self.region.take().is_some() {
            // The region it was bound to may go now.
            self.pd.inner.lifetimes.reclaim();
        }
        Ok(())
    }

    /// Commits the requests in flight that are known to have succeeded and forgets those
    /// known to have failed (cold path: binds, unbinds and key queries only).
    /// A committed bind's pin replaces the window's (an unbind's: none), and a failed one's
    /// is dropped; a region no longer pinned may be deregistered at once (a reclaim).
    pub(crate) fn settle(&mut self) {
        let Some(f) = &mut self.flight else { return };
        let mut unpinned = false;
        for i in 0..MAX_IN_FLIGHT {
            let Some(step) = &mut f.steps[i] else { break };
            match f.shadow.outcome(step.start, step.end) {
                Some(true) => {
                    self.rkey = step.rkey;
                    self.bound = step.bound;
                    let pin = step.region.take();
                    unpinned |= core::mem::replace(&mut self.region, pin).is_some();
                    self.invalidations = step.invalidations.take();
                    f.steps[i] = None;
                }
                Some(false) => {
                    // In order on one QP: everything after it was flushed too; their pins go.
                    for s in f.steps.iter_mut() {
                        unpinned |= s.take().is_some_and(|s| s.region.is_some());
                    }
                    break;
                }
                None => break,
            }
        }
        let done = f.steps.iter().take_while(|s| s.is_none()).count();
        f.steps.rotate_left(done);
        if f.steps[0].is_none() {
            self.flight = None;
        }
        if unpinned {
            self.pd.inner.lifetimes.reclaim();
        }
    }

    /// The key and binding after everything posted (in flight included) succeeds.
    pub(crate) fn effective(&self) -> (u32, Option<u32>) {
        let last = self
            .flight
            .as_ref()
            .and_then(|f| f.steps.iter().rev().find_map(|s| s.as_ref()));
        match last {
            Some(s) => (s.rkey, s.bound),
            None => (self.rkey, self.bound),
        }
    }

    /// Whether a bind or unbind may be posted now through the QP whose send queue keeps
    /// `shadow`. The queue decides, not the number: a QP that got the number of a dropped
    /// one is another QP.
    pub(crate) fn check_flight(&self, shadow: &Arc<Shadow<SendEntry>>) -> Result<()> {
        match &self.flight {
            Some(f) if !Arc::ptr_eq(&f.shadow, shadow) => Err(Error::WindowState {
                rkey: self.effective().0,
                state: "a bind or unbind of it is in flight on another QP (poll its completion; \
                        if that QP was dropped first, the window's state is unknown: drop it)",
            }),
            Some(f) if f.steps[MAX_IN_FLIGHT - 1].is_some() => Err(Error::WindowState {
                rkey: self.effective().0,
                state: "four binds or unbinds of it are in flight (poll their completions)",
            }),
            _ => Ok(()),
        }
    }

    /// Records a bind or unbind just posted through the QP whose send queue keeps `shadow`
    /// (after `check_flight`).
    pub(crate) fn push_step(&mut self, shadow: &Arc<Shadow<SendEntry>>, step: Step) {
        let f = self.flight.get_or_insert_with(|| InFlight {
            shadow: shadow.clone(),
            steps: [const { None }; MAX_IN_FLIGHT],
        });
        if let Some(slot) = f.steps.iter_mut().find(|s| s.is_none()) {
            *slot = Some(step);
        }
    }
}

impl Drop for MemoryWindow {
    /// Deallocates the window, at once unless a bind or unbind of it is still in flight:
    /// then once the work posted so far on its domain's QPs has completed (or was flushed),
    /// or those QPs are gone, at the domain's next reclaim (a region drop or allocation, a
    /// QP drop, [`Pd::reclaim`](super::Pd::reclaim)), at the latest with the domain. The
    /// bind completes meanwhile, as posted, and its key grants access until then.
    fn drop(&mut self) {
        self.settle();
        // The index may come back to another window of this domain, which binds on from
        // this window's last key (see `Pd::alloc_mw`).
        // A type-1 window leaves nothing (no peer invalidates its keys) and takes nothing
        // (`Pd::alloc_mw`): a dropped type-2 window's variant waits for the next type-2
        // window with the index.
        if self.mw_type == MwType::Two {
            let (last, _) = self.effective();
            let variant = self.after.unwrap_or(last as u8);
            self.pd
                .inner
                .window_keys
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(last >> 8, variant);
        }
        // Not kept: the window's hold on its QP's queue would keep that queue counted as
        // live once the QP is gone. Its binds' pins stay until the window is deallocated:
        // the NIC may bind it yet.
        let flight = self.flight.take();
        let in_flight = flight.is_some();
        let mut pins: Vec<Pinned> = self.region.take().into_iter().collect();
        if let Some(f) = flight {
            pins.extend(f.steps.into_iter().flatten().filter_map(|s| s.region));
        }
        let Some(mw) = self.kind.take() else {
            return;
        };
        let mut dealloc = Dealloc { mw, pins };
        let lifetimes = &self.pd.inner.lifetimes;
        if in_flight || !dealloc.deregister() {
            // Deallocated (and its regions let go) once the work posted so far has
            // completed, or, refused by the device now, tried again at each reclaim.
            lifetimes.release(Box::new(dealloc), None);
        } else {
            // A region this window was bound to may go now.
            lifetimes.reclaim();
        }
    }
}

/// A window on its way out, with its pins on the regions it is or may be bound to: given
/// back once the device has deallocated it.
struct Dealloc {
    mw: backend::Mw,
    pins: Vec<Pinned>,
}

impl Deregister for Dealloc {
    fn deregister(&mut self) -> bool {
        if !self.mw.deregister() {
            return false;
        }
        self.pins.clear();
        true
    }
}

/// The rights a window may grant.
pub(crate) const WINDOW_RIGHTS: Access = Access(
    Access::REMOTE_READ.0 | Access::REMOTE_WRITE.0 | Access::REMOTE_ATOMIC.0 | Access::ZERO_BASED.0,
);

/// Refuses a zero-based type-1 bind, or a type-1 bind to a zero-based region, as rdma-core's
/// `mlx5_bind_mw` does (EINVAL) before anything is posted.
pub(crate) fn check_type1(mw_type: MwType, region: Access, rights: Access) -> Result<()> {
    if mw_type == MwType::One
        && (rights.contains(Access::ZERO_BASED) || region.contains(Access::ZERO_BASED))
    {
        return Err(Error::InvalidParameter {
            what: "ZERO_BASED with a type-1 memory window (window rights | region rights)",
            value: (rights.0 | region.0) as u64,
        });
    }
    Ok(())
}

/// Checks a bind request before anything is posted: the rights a window may have, the
/// region's bind right and rights, and the range.
pub(crate) fn check_bind(
    region: Access,
    region_len: u64,
    rights: Access,
    off: u64,
    len: u64,
) -> Result<()> {
    if rights.0 & !WINDOW_RIGHTS.0 != 0 {
        return Err(Error::InvalidParameter {
            what: "window rights (remote read/write/atomic, zero-based)",
            value: rights.0 as u64,
        });
    }
    let remote = Access(rights.0 & !Access::ZERO_BASED.0);
    let needs_local_write =
        remote.contains(Access::REMOTE_WRITE) || remote.contains(Access::REMOTE_ATOMIC);
    let allowed = Access(
        region.0 & (Access::REMOTE_READ.0 | Access::REMOTE_WRITE.0 | Access::REMOTE_ATOMIC.0),
    );
    if !region.contains(Access::MW_BIND)
        || !allowed.contains(remote)
        || (needs_local_write && !region.contains(Access::LOCAL_WRITE))
    {
        return Err(Error::Privileges {
            requested: rights,
            allowed: Access(region.0 & (WINDOW_RIGHTS.0 | Access::MW_BIND.0)),
        });
    }
    match off.checked_add(len) {
        Some(end) if end <= region_len => {}
        _ => {
            return Err(Error::InvalidParameter {
                what: "window range (offset + length) in the region",
                value: off.saturating_add(len),
            })
        }
    }
    if len > mlx5::umr::MAX_KLM_BYTES {
        return Err(Error::BindTooLong { len });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const REGION: Access = Access(
        Access::LOCAL_WRITE.0 | Access::REMOTE_READ.0 | Access::REMOTE_WRITE.0 | Access::MW_BIND.0,
    );

    #[test]
    fn rights_must_be_a_subset_of_the_region() {
        assert!(check_bind(
            REGION,
            4096,
            Access::REMOTE_READ | Access::REMOTE_WRITE,
            0,
            4096
        )
        .is_ok());
        assert!(matches!(
            check_bind(REGION, 4096, Access::REMOTE_ATOMIC, 0, 8),
            Err(Error::Privileges { .. })
        ));
        let no_bind = Access(REGION.0 & !Access::MW_BIND.0);
        assert!(matches!(
            check_bind(no_bind, 4096, Access::REMOTE_READ, 0, 8),
            Err(Error::Privileges { .. })
        ));
        let no_lw = Access(Access::REMOTE_WRITE.0 | Access::MW_BIND.0);
        assert!(matches!(
            check_bind(no_lw, 4096, Access::REMOTE_WRITE, 0, 8),
            Err(Error::Privileges { .. })
        ));
        assert!(matches!(
            check_bind(REGION, 4096, Access::LOCAL_WRITE, 0, 8),
            Err(Error::InvalidParameter { .. })
        ));
    }

    #[test]
    fn range_and_size() {
        assert!(check_bind(REGION, 4096, Access::REMOTE_READ, 4000, 96).is_ok());
        assert!(matches!(
            check_bind(REGION, 4096, Access::REMOTE_READ, 4000, 97),
            Err(Error::InvalidParameter { value: 4097, .. })
        ));
        assert!(matches!(
            check_bind(REGION, u64::MAX, Access::REMOTE_READ, 0, (1 << 31) + 1),
            Err(Error::BindTooLong { .. })
        ));
        assert!(
            check_bind(REGION, 4096, Access::REMOTE_READ, 0, 0).is_ok(),
            "zero length unbinds"
        );
    }
}
