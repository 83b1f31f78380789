//! The receive queue of the verbs path (`ibv_post_recv`): each receive's cookie in a shadow
//! table under a sequence number its `wr_id` carries with the receive tag, its buffers pinned
//! until its completion is polled.

use super::calls::PostRecv;
use super::code;
use super::objects::Qp;
use crate::error::{Error, Result};
use crate::queue::cq_share::{recv_room_end, CqShare, CqSlots, Leaving};
use crate::queue::regions::{Hot, RegionCheck, Regions};
use crate::queue::scatter::{PinnedPlaces, ScatterTable};
use crate::queue::shadow::Shadow;
use mlx5::request::Sge;
use rdma_sys as ffi;
use std::sync::Arc;

/// Marks a receive's `wr_id` (its sequence number is in the low 16 bits, its queue's
/// incarnation above them: `super::incarnation`): completions in error have no valid
/// opcode, and this is how they are attributed to the right queue.
pub(crate) const RECV_TAG: u64 = 1 << 63;

/// Marks a UD QP's receive's `wr_id` (with [`RECV_TAG`]): its completion carries the
/// sender's QP number and whether a GRH was received, read only for these.
pub(super) const UD_TAG: u64 = 1 << 62;

/// The receive side of a QP on the verbs path.
pub struct VerbsRecvQueue {
    /// The QP, kept alive while `post_recv` points to it.
    _qp: Arc<Qp>,
    /// `ibv_post_recv` on `qp` (its pointer and provider operation, read at creation).
    post_recv: PostRecv,
    cap: u32,
    /// As [`VerbsSendQueue::room_end`](super::sq::VerbsSendQueue::room_end), for receives.
    room_end: u16,
    pub(crate) shadow: Arc<Shadow<u64>>,
    /// `shadow`'s cookies ([`Shadow::slots`]), indexed as [`PinnedPlaces::index`] says.
    cookies: *mut u64,
    seq: u16,
    /// The scatter list (its length: the QP's most entries per receive).
    sges: Box<[ffi::ibv_sge]>,
    /// The receive request, prepared once (`next` null); each post sets its list: `sges`,
    /// or the caller's one entry ([`VerbsRecvQueue::post_one`]). Its `num_sge` is 1
    /// between posts (the usual receive's: [`VerbsRecvQueue::post`] puts it back).
    wr: ffi::ibv_recv_wr,
    /// [`RECV_TAG`] (with [`UD_TAG`] on a UD QP) and this queue's incarnation
    /// (`super::incarnation`): each receive's `wr_id` is its position and this, `shadow`'s
    /// tag.
    tag: u64,
    /// The CQ entries this queue holds (None: not accounted).
    cq_share: Option<CqShare>,
    /// The scatter list of every posted receive: the regions each pins until its
    /// completion is polled (the QP holds it too, until it is destroyed).
    pub(crate) scatter: Arc<ScatterTable>,
    /// Where [`VerbsRecvQueue::post_one`] records its receive in `scatter`.
    places: PinnedPlaces,
    /// The protection domain's regions, the receives' entries are pinned in (None: not
    /// checked, the caller vouches for them).
    regions: Option<Box<RegionCheck>>,
    /// `regions`' hot region as of its last use ([`Hot::follow`]), where the usual
    /// receive reads it with no pointer to follow ([`Hot::NONE`] without `regions`).
    hot: Hot,
    /// The provider copies small received messages into the buffers with the CPU
    /// (rdma-core's mlx5 scatter-to-CQE, `mlx5_copy_to_recv_wqe`, which checks no key):
    /// a receive with an entry the CPU may not write is refused.
    provider_copies: bool,
}

// SAFETY: as for VerbsSendQueue (`wr`'s list is set at each post and read only during it;
// `post_recv` holds the pointer of the QP in `qp`, thread-safe in rdma-core; `cookies` and
// `places` point into `shadow` and `scatter`, which this queue holds and writes only as
// their poster).
unsafe impl Send for VerbsRecvQueue {}

impl std::fmt::Debug for VerbsRecvQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsRecvQueue")
            .field("seq", &self.seq)
            .finish()
    }
}

// An `Sge` is an `ibv_sge`: [`VerbsRecvQueue::post_one`] hands the caller's entry to the
// provider as the request's list.
const _: () = {
    use core::mem::{align_of, offset_of, size_of};
    assert!(size_of::<Sge>() == size_of::<ffi::ibv_sge>());
    assert!(align_of::<Sge>() == align_of::<ffi::ibv_sge>());
    assert!(offset_of!(Sge, addr) == offset_of!(ffi::ibv_sge, addr));
    assert!(offset_of!(Sge, len) == offset_of!(ffi::ibv_sge, length));
    assert!(offset_of!(Sge, lkey) == offset_of!(ffi::ibv_sge, lkey));
};

/// A receive request prepared once for lists of up to `max_sge` entries: its scatter list
/// (`sg_list` points into it; the boxed slice does not move when the box does), `next`
/// null. SRQs vary only `wr_id` and `num_sge`; a receive queue keeps the request in place
/// and sets its list at each post too (the caller's one entry, or this one).
pub(crate) fn prepared_recv(max_sge: usize) -> (Box<[ffi::ibv_sge]>, Box<ffi::ibv_recv_wr>) {
    // SAFETY: an all-zero ibv_sge is valid.
    let mut sges: Box<[ffi::ibv_sge]> = (0..max_sge)
        .map(|_| unsafe { std::mem::zeroed() })
        .collect();
    // SAFETY: an all-zero ibv_recv_wr is valid (no next request).
    let mut wr: Box<ffi::ibv_recv_wr> = Box::new(unsafe { std::mem::zeroed() });
    wr.sg_list = sges.as_mut_ptr();
    (sges, wr)
}

/// Copies the non-empty entries of `sgl` into `sges` (as many as it holds); returns how
/// many. Only the request posted after it publishes them, so an error leaves nothing
/// behind.
///
/// An entry longer than [`MAX_SGE_BYTES`](mlx5::wqe::MAX_SGE_BYTES) (2^31 - 1) is refused
/// as the direct path refuses it (`check_recv_list`): `ibv_sge.length` is a u32 that the
/// providers take as it is (rdma-core's mlx5 `mlx5_post_recv` writes it into the WQE's
/// 32-bit `byte_count`, whose bit 31 is no length; rxe's `rxe_post_one_recv` sums the
/// lengths into an int), and no message is that long.
///
/// # Errors
/// [`Error::InvalidParameter`] with an entry's length, [`Error::TooManySge`] with the
/// non-empty entries and `sges.len()`: the direct path's errors, in its order.
#[inline]
pub(crate) fn fill_recv_sges(sges: &mut [ffi::ibv_sge], sgl: &[Sge]) -> Result<usize> {
    let mut n = 0;
    for s in sgl {
        if s.len == 0 {
            continue;
        }
        if n == sges.len() || s.len > mlx5::wqe::MAX_SGE_BYTES {
            return Err(refuse_recv_list(sgl, sges.len()));
        }
        sges[n] = ffi::ibv_sge {
            addr: s.addr,
            length: s.len,
            lkey: s.lkey,
        };
        n += 1;
    }
    Ok(n)
}

/// [`fill_recv_sges`]' refusal of `sgl` (an entry too long, or more than `max` entries):
/// the direct path's error for it.
#[cold]
#[inline(never)]
fn refuse_recv_list(sgl: &[Sge], max: usize) -> Error {
    match crate::queue::checks::check_recv_list(sgl, max) {
        Err(e) => e,
        // Not reached: the list has an entry too long or too many entries.
        Ok(n) => Error::TooManySge { n, max },
    }
}

impl VerbsRecvQueue {
    /// The receive queue of `qp`.
    pub fn new(qp: Arc<Qp>) -> VerbsRecvQueue {
        VerbsRecvQueue::marked(qp, RECV_TAG)
    }

    /// The receive queue of `qp` whose receives' `wr_id`s carry `tags` ([`RECV_TAG`], with
    /// [`UD_TAG`] on a UD QP) and the queue's incarnation.
    fn marked(qp: Arc<Qp>, tags: u64) -> VerbsRecvQueue {
        let caps = qp.caps;
        let max_sge = caps.max_recv_sge.max(1) as usize;
        let (sges, wr) = prepared_recv(max_sge);
        let cnt = caps.max_recv_wr.max(16).next_power_of_two();
        let scatter = Arc::new(ScatterTable::new(cnt, max_sge));
        // Kept by the QP until it is destroyed (a QP has one receive queue).
        let _ = qp.recv_targets.set(scatter.clone());
        // What each receive's `wr_id` carries above its position: the tags and this
        // queue's incarnation (the shadow's tag, by which the poller checks it).
        let tag = tags | super::incarnation::next();
        let shadow = Arc::new(Shadow::new(cnt).with_tag(tag));
        VerbsRecvQueue {
            // SAFETY: `qp` is live while this queue holds it (`qp` below), and the call is
            // made only through this queue.
            post_recv: unsafe { PostRecv::of(qp.qp) },
            cap: caps.max_recv_wr,
            room_end: 0,
            cookies: shadow.slots(),
            shadow,
            seq: 0,
            sges,
            wr: ffi::ibv_recv_wr { num_sge: 1, ..*wr },
            tag,
            cq_share: None,
            places: scatter.pinned_places(),
            scatter,
            regions: None,
            hot: Hot::NONE,
            provider_copies: false,
            _qp: qp,
        }
    }

    /// Pins the region of every entry of every receive posted from now on in `regions`
    /// (until its completion is polled); with `provider_copies` (rdma-core's mlx5
    /// provider, which copies small messages into the buffers itself), refuses a receive
    /// with an entry outside every CPU-writable region.
    pub(crate) fn check_against(&mut self, regions: Arc<Regions>, provider_copies: bool) {
        self.regions = Some(Box::new(RegionCheck::new(regions)));
        self.provider_copies = provider_copies;
    }

    /// The receive queue of the UD QP `qp`: its completions carry the sender's QP number
    /// and the GRH flag.
    pub fn new_ud(qp: Arc<Qp>) -> VerbsRecvQueue {
        VerbsRecvQueue::marked(qp, RECV_TAG | UD_TAG)
    }

    /// Accounts this queue's receives against the entries of the CQ they complete on.
    pub(crate) fn attach_cq(&mut self, slots: Arc<CqSlots>) {
        self.cq_share = Some(CqShare::new(slots, self.shadow.clone(), self.seq));
        self.room_end = self.seq;
    }

    /// Receives the queue was created for.
    pub fn capacity(&self) -> u32 {
        self.cap
    }

    /// The queue goes away: its charge on the CQ, given back when the result drops (after
    /// the device QP is destroyed: [`Leaving`]).
    pub(crate) fn leave_cq(&mut self) -> Option<Leaving> {
        let pos = self.seq;
        self.cq_share.take().map(|s| s.leave(pos))
    }

    /// The cold path of the room check of [`VerbsRecvQueue::post`] (as
    /// [`VerbsSendQueue::check_room`](super::sq::VerbsSendQueue::check_room)'s).
    #[cold]
    #[inline(never)]
    fn refill_room(&mut self) -> Result<()> {
        self.room_end = recv_room_end(self.free(), self.cq_share.as_mut(), self.seq, self.cap)?;
        Ok(())
    }

    /// Entries free for new receives.
    pub fn free(&self) -> u32 {
        self.cap
            .saturating_sub(self.seq.wrapping_sub(self.shadow.retired()) as u32)
    }

    /// Posts one receive.
    ///
    /// # Errors
    /// [`Error::QueueFull`], [`Error::TooManySge`], or the `ibv_post_recv` error;
    /// [`Error::InvalidParameter`] with the length of an entry of 2^31 bytes or more, or
    /// with the lkey of an entry outside every CPU-writable
    /// region of the domain, on a device whose provider copies small messages with the
    /// CPU (mlx5).
    pub fn post(&mut self, sgl: &[Sge], cookie: u64) -> Result<()> {
        if self.seq == self.room_end {
            self.refill_room()?;
        }
        // One pass: the non-empty entries into the scatter list (published only by the
        // call below, so an error leaves nothing behind).
        let n = fill_recv_sges(&mut self.sges, sgl)?;
        self.land(sgl)?;
        let (seq, list) = (self.seq, self.sges.as_mut_ptr());
        self.wr.num_sge = n as i32;
        let rc = self.submit(seq, self.places.index(seq), list, cookie);
        // The usual receive's count again (the call copied the request).
        self.wr.num_sge = 1;
        match rc {
            0 => Ok(()),
            rc => Err(self.unpost(rc)),
        }
    }

    /// Records the receive about to be posted at `seq` in the scatter table, pinning its
    /// regions; refuses it (nothing kept) when the provider would copy into memory the CPU
    /// may not write.
    #[inline]
    fn land(&mut self, sgl: &[Sge]) -> Result<()> {
        let refused = self
            .scatter
            .record(self.seq, sgl, self.regions.as_deref_mut());
        if let Some(r) = self.regions.as_deref() {
            self.hot.follow(r.hot());
        }
        match refused {
            Some(lkey) if self.provider_copies => Err(self.refuse_landing(lkey)),
            _ => Ok(()),
        }
    }

    /// [`VerbsRecvQueue::land`]'s refusal: the pins go back.
    #[cold]
    #[inline(never)]
    fn refuse_landing(&mut self, lkey: u32) -> Error {
        self.scatter.done(self.seq);
        crate::queue::scatter::not_cpu_writable(lkey)
    }

    /// The usual receive, one non-empty buffer `s` in the region the last receive found
    /// (see [`Hot::pin`]), posted straight: `Some(0)` posted, `Some(rc)`
    /// refused by `ibv_post_recv` (then [`VerbsRecvQueue::unpost`] must follow), None when
    /// it is not that case (nothing done: [`VerbsRecvQueue::post`] takes it, with every
    /// check). The cached room is renewed out of line when spent. Only a receive into a
    /// CPU-writable region comes here, so a provider that copies with the CPU refuses none
    /// of them; an empty buffer or one past `MAX_SGE_BYTES`, a queue that checks no region,
    /// any other region or a changed list of regions takes the general path.
    #[inline(always)]
    pub(crate) fn post_one(&mut self, s: &Sge, cookie: u64) -> Option<i32> {
        // Lengths 1 to `MAX_SGE_BYTES` in one compare (the general path refuses a longer
        // entry, as the direct path's usual receive leaves it to its general path).
        if s.len.wrapping_sub(1) >= mlx5::wqe::MAX_SGE_BYTES
            || self.seq == self.room_end && !self.renew_room()
        {
            return None;
        }
        // Read once: the stores below go through pointers the compiler cannot tell from
        // this queue, and would have it load `seq` again after each.
        let seq = self.seq;
        let pins = self.hot.pin(s)?;
        // Nothing can fail from here on but the call (then `unpost`).
        let i = self.places.index(seq);
        // SAFETY: `places` are of `scatter`, which this queue holds; it is their poster and
        // the receive at `seq` is not posted yet.
        unsafe { self.places.record(i, pins) };
        // The caller's entry is the request's list: an `Sge` is an `ibv_sge` (below), read
        // by the call only.
        Some(self.submit(seq, i, (s as *const Sge).cast_mut().cast(), cookie))
    }

    /// [`VerbsRecvQueue::post_one`]'s room spent: [`VerbsRecvQueue::refill_room`], true when
    /// there is room again (else the general path refuses the receive with the reason).
    #[cold]
    #[inline(never)]
    fn renew_room(&mut self) -> bool {
        self.refill_room().is_ok()
    }

    /// Posts the prepared request with the scatter entries at `list` (as many as its
    /// `num_sge`, for the call) as the receive at `seq` (this queue's position, index `i`:
    /// [`PinnedPlaces::index`]), of `cookie`: 0, or `ibv_post_recv`'s error (then
    /// [`VerbsRecvQueue::unpost`] must follow).
    ///
    /// The queue moves first and is put back on a refusal, so that nothing but the call's
    /// result is live across it (no registers to save for the rest). A `posted` mark one
    /// ahead for the length of the call only delays a deferred deregistration's check
    /// (`Shadow::done_up_to_wide`); no completion of `seq` can come before it is posted.
    #[inline(always)]
    fn submit(&mut self, seq: u16, i: usize, list: *mut ffi::ibv_sge, cookie: u64) -> i32 {
        debug_assert_eq!(seq, self.seq);
        // The prepared request; only these two fields vary (and `num_sge`, set by `post`).
        let wr = &mut self.wr;
        wr.wr_id = seq as u64 | self.tag;
        wr.sg_list = list;
        debug_assert_eq!(i, self.places.index(seq));
        // SAFETY: `i` is `seq`'s index (< cnt) in the shadow this queue holds, which it
        // writes as its poster (as `Shadow::set`: the receive at `seq` is not posted yet).
        unsafe { *self.cookies.add(i) = cookie };
        let next = seq.wrapping_add(1);
        self.seq = next;
        self.shadow.mark_posted(next);
        // SAFETY: the QP is live (held by this queue); `wr` (in this queue) and its scatter
        // list (the caller's) live across the call, which copies them.
        unsafe { self.post_recv.call(wr) }
    }

    /// `ibv_post_recv` refused the last receive with `rc`: the queue goes back to before it
    /// (nothing was posted); the error.
    #[cold]
    #[inline(never)]
    pub(crate) fn unpost(&mut self, rc: i32) -> Error {
        self.seq = self.seq.wrapping_sub(1);
        self.shadow.mark_posted(self.seq);
        self.scatter.done(self.seq);
        Error::Verbs(code("ibv_post_recv", rc))
    }
}
