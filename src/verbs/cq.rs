//! The CQ poller of the verbs path (`ibv_poll_cq`, or `ibv_start_poll` / `ibv_end_poll`):
//! each completion attributed to its queue by QP number and `wr_id`, moderation completions
//! hidden, the cookies and statuses as on the direct path.

use super::calls::PollCq;
use super::ex::{LateWc, PollOps, VerbsApi, WcRead, EMPTY};
use super::incarnation;
use super::rq::{RECV_TAG, UD_TAG};
use crate::completion::WcStatus;
use crate::completion::{Completion, WcOpcode};
use crate::queue::cq_share::CqSlots;
use crate::queue::registry::{Attached, Registry};
use crate::queue::retire::Retire;
use crate::queue::shadow::{Ring, SendEntry, Shadow};
use rdma_sys as ffi;
use std::cell::Cell;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Never a QP number (rdma-core's are 24 bits): [`VerbsCompletionQueue::first_qpn`] when
/// the first queue has no send queue.
const NO_QPN: u32 = u32::MAX;

/// A CQ poller on the verbs path.
pub struct VerbsCompletionQueue {
    cq: Arc<super::objects::Cq>,
    /// `ibv_poll_cq` on `cq` (its pointer and provider operation, read at creation).
    poll_cq: PollCq,
    /// The CQ's extended polling operations (a copy of `cq.poll_ops`, read where the
    /// poller's other fields are); never changed after creation.
    ops: Option<PollOps>,
    /// The one-completion poll of the poller's API, chosen at creation:
    /// [`VerbsCompletionQueue::poll_one_ex`] when `ops` is Some (its contract), else
    /// [`VerbsCompletionQueue::poll_one_legacy`]. [`VerbsCompletionQueue::poll_one`] jumps
    /// through it: no test of `ops` per poll, and where the poll of one is inlined
    /// (`Cq::poll`) no direct jump before it (the probe's poll reached the poller in 7
    /// instructions, now 5: `cmpb`, `jne`, `mov`, `add`, `jmp *`).
    one: unsafe fn(&mut VerbsCompletionQueue, &mut Completion) -> usize,
    /// The attribute `ibv_start_poll` is given (all zero; the providers only read it): kept
    /// here, not made afresh on the stack at each poll.
    attr: ffi::ibv_poll_cq_attr,
    pub(crate) registry: Arc<Registry>,
    /// `registry.slots` (one load less per poll for the orphan mark).
    slots: Arc<CqSlots>,
    cache: Vec<Attached>,
    gen: u32,
    /// `cache[0]`'s QP number when it has a send queue, else [`NO_QPN`]: the usual
    /// completion's QP number, written into it.
    first_qpn: u32,
    /// `first_sq`'s incarnation ([`incarnation::NONE`] with no send queue): the usual
    /// completion (a successful send of a CQ's one QP) is attributed by its `wr_id` alone,
    /// with one compare (the bits above its position equal this: a send, not a receive,
    /// of this very queue), not the QP number read (a call into the provider) and the
    /// list's length, its first entry's number and its send queue read and tested.
    first_tag: u64,
    /// The tag of `cache[0]`'s receive queue when it has one of its own (the receive tags
    /// and its incarnation: what its receives' `wr_id`s carry above their positions), else
    /// [`incarnation::NONE`]: its receives (a ping-pong's) attributed by `wr_id` alone
    /// ([`VerbsCompletionQueue::complete`]).
    first_rq_tag: u64,
    /// `cache[0]`'s send queue when it has one (else [`VerbsCompletionQueue::no_sq`], never
    /// used: no completion carries its incarnation, [`incarnation::NONE`]).
    first_sq: Arc<Shadow<SendEntry>>,
    /// `first_sq`'s [`Ring`], set with it: the usual completion's entry read with one load
    /// less (`first_sq`'s address).
    first_ring: Ring<SendEntry>,
    /// An empty shadow, `first_sq` when `cache[0]` has no send queue: kept so that
    /// `refresh` lets go of a dropped QP's send queue without allocating (held on, it kept
    /// that queue's unretired requests outstanding for `Lifetimes`, and a region dropped
    /// later parked until a QP with a send queue came first in the list again).
    no_sq: Arc<Shadow<SendEntry>>,
    wcs: Box<[ffi::ibv_wc; 32]>,
    /// A completion read between `ibv_start_poll` and `ibv_end_poll` of a QP this poller's
    /// list does not have (attached after the poll read the list's generation, or dropped),
    /// copied to be finished once `ibv_end_poll` released the CQ's lock
    /// ([`VerbsCompletionQueue::take_late`]); None between polls.
    late: Cell<Option<LateWc>>,
    /// The retirement of the request a completion read between `ibv_start_poll` and
    /// `ibv_end_poll` finished, made once `ibv_end_poll` published the CQ's consumer index
    /// ([`Retire`]); Nothing between polls.
    later: Cell<Retire>,
}

/// Retires as `r` says: at once when the completion `W` was read from an `ibv_wc`
/// (`ibv_poll_cq` publishes the consumer index before it returns), else after
/// `ibv_end_poll` (`later`): the provider publishes it there (libmlx5 `mlx5_end_poll` ->
/// `update_cons_index`, rxe `cq_end_poll`), not at `ibv_start_poll`. A queue given its
/// room back before could post into it and have its CQE written while the device still
/// counts the polled one as unconsumed: one CQE more than the CQ accounting (`cq_share`)
/// lets the CQ hold, an overrun on rxe, whose CQ has no spare entry. `r` points into a
/// queue held by the poller's `cache` (or `first_sq`), which does not change in between.
#[inline(always)]
fn retire<W: WcRead + ?Sized>(later: &Cell<Retire>, r: Retire) {
    if W::IN_POLL {
        later.set(r);
    } else {
        // SAFETY: the queue `r` points into is borrowed by the caller.
        unsafe { r.apply() }
    }
}

// SAFETY: polling is serialised by `&mut self`; the CQ is thread-safe in rdma-core.
unsafe impl Send for VerbsCompletionQueue {}

impl std::fmt::Debug for VerbsCompletionQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsCompletionQueue").finish()
    }
}

impl VerbsCompletionQueue {
    /// A poller of `cq`, named `cqn` in its errors (the crate's own number for it:
    /// rdma-core does not expose the device's).
    pub fn new(cq: Arc<super::objects::Cq>, cqn: u32) -> VerbsCompletionQueue {
        let capacity = cq.capacity();
        let registry = Arc::new(Registry::new(cqn, capacity, None));
        let no_sq = Arc::new(Shadow::new(1));
        let one: unsafe fn(&mut VerbsCompletionQueue, &mut Completion) -> usize = match cq.poll_ops
        {
            Some(_) => VerbsCompletionQueue::poll_one_ex,
            None => VerbsCompletionQueue::poll_one_legacy,
        };
        VerbsCompletionQueue {
            ops: cq.poll_ops,
            one,
            attr: ffi::ibv_poll_cq_attr { comp_mask: 0 },
            // SAFETY: `cq` is live while this poller holds it (`cq` below), and polled only
            // through this poller.
            poll_cq: unsafe { PollCq::of(cq.cq) },
            cq,
            slots: registry.slots.clone(),
            registry,
            cache: Vec::new(),
            gen: u32::MAX,
            first_qpn: NO_QPN,
            first_tag: incarnation::NONE,
            first_rq_tag: incarnation::NONE,
            first_sq: no_sq.clone(),
            first_ring: no_sq.ring(),
            no_sq,
            // SAFETY: an all-zero ibv_wc is valid.
            wcs: Box::new(unsafe { std::mem::zeroed() }),
            late: Cell::new(None),
            later: Cell::new(Retire::Nothing),
        }
    }

    /// Takes the queues' list as current without reading it again: what a poll sees when
    /// a QP is attached (and its work completes) between the poll's check of the list's
    /// generation and its `ibv_start_poll` / `ibv_poll_cq`, which tests cannot time.
    #[cfg(test)]
    pub(crate) fn skip_refresh(&mut self) {
        self.gen = self.registry.gen.load(Ordering::Acquire);
    }

    /// Renames QP `old` to `new` in the poller's list (and as its first queue's number):
    /// what a list read before a QP was dropped looks like once the kernel has handed the
    /// dropped QP's number to a new QP (libmlx5's and rxe's numbers come back cyclically,
    /// after 2^24 creations, which no test can run; the kernel model's too).
    #[cfg(test)]
    pub(crate) fn renumber(&mut self, old: u32, new: u32) {
        for a in self.cache.iter_mut().filter(|a| a.qpn == old) {
            a.qpn = new;
        }
        if self.first_qpn == old {
            self.first_qpn = new;
        }
    }

    /// The rdma-core API this poller polls with.
    pub fn api(&self) -> VerbsApi {
        self.cq.api()
    }

    /// Polls up to `out.len()` completions.
    ///
    /// Into an `out` of one (a latency loop's poll) with the queues' list current, one
    /// completion is read straight (`poll_one_ex`, or `poll_one_legacy`: `ibv_poll_cq` of
    /// one entry, not of up to 32 into the poller's array); everything else, and a first
    /// completion that reports nothing, takes `poll_general`.
    ///
    /// Each of the three is a function of its own, reached by a tail call: all three inlined
    /// into one, the one-completion poll paid the general path's spills and set-up (148 / 152
    /// instructions on rdma-core's extended / classic API in the rxe VM, 134 / 136 apart;
    /// `cargo xtask rxe-icount`); `poll_one_ex` inlined here, its frame was set up before the
    /// checks, and paid by the other two (the classic API's hit 10 instructions more on
    /// rdma-core's mlx5, `verbs_icount`).
    #[inline(always)]
    pub fn poll(&mut self, out: &mut [Completion]) -> usize {
        if let [first] = out {
            return self.poll_one(first);
        }
        self.poll_general(out)
    }

    /// [`VerbsCompletionQueue::poll`] into one slot.
    #[inline(always)]
    pub fn poll_one(&mut self, c: &mut Completion) -> usize {
        if self.registry.gen.load(Ordering::Acquire) == self.gen {
            let one = self.one;
            // SAFETY: `one` is `poll_one_ex` only with the operations there (`new`; `ops` is
            // never changed), as its contract asks.
            return unsafe { one(self, c) };
        }
        self.poll_general(core::slice::from_mut(c))
    }

    /// [`VerbsCompletionQueue::poll`] of one completion with `ibv_start_poll` /
    /// `ibv_end_poll` (the caller saw the list current): 0 when the CQ is empty, 1 when `c`
    /// holds a completion; after a completion that reports nothing (a moderation
    /// completion) the general path polls on.
    ///
    /// The orphan mark is read only when the CQ is seen empty, and then the general path
    /// polls again (its own read of the mark, then `ibv_start_poll`): a completion pays
    /// no load for it, nor a register kept across the calls.
    ///
    /// # Safety
    /// The poller has the extended operations (`ops` is Some: `one` is this function only
    /// then; this function does not check again).
    #[inline(never)]
    unsafe fn poll_one_ex(&mut self, c: &mut Completion) -> usize {
        let Some(ops) = &self.ops else {
            // SAFETY: the caller's contract.
            unsafe { core::hint::unreachable_unchecked() }
        };
        // SAFETY: live CQ, polled only through this poller (`&mut self`); `attr` is the
        // poller's all-zero attribute.
        let rc = unsafe { ops.start_with(&mut self.attr) };
        if rc != 0 {
            return self.empty_one(c, rc == EMPTY);
        }
        // SAFETY: a completion is current until `end`.
        let wc = unsafe { ops.current() };
        // The usual completion by its status and `wr_id` (fields of the `ibv_cq_ex`), its
        // QP number not read (a call into the provider); any other in a function of its
        // own: inlined, the receive's reads (calls into the provider) kept six registers
        // saved for all.
        let Some(seq) = self.first_send(&wc) else {
            // SAFETY: the completion is current; the operations are there.
            return unsafe { self.poll_one_ex_not_first(c) };
        };
        // SAFETY: `first_ring` is held `first_sq`'s; the reference is dropped in
        // `send_completion`, before the send is retired.
        let keep = send_completion(unsafe { self.first_ring.entry(seq) }, self.first_qpn, c);
        // SAFETY: start succeeded; ended once.
        unsafe { ops.end() };
        // The consumer index is published (`Retire`): the queue may have its room back.
        // Its end is the one value kept across the call, in the register the frame's
        // alignment pushed anyway; the queue is read again (`later` cost the usual
        // completion 10 instructions on rdma-core's mlx5, this 2: `verbs_icount`).
        self.first_sq.retire(seq.wrapping_add(1));
        if keep {
            return 1;
        }
        // A moderation completion (no late one: that is another QP's): the next one.
        self.poll_general(core::slice::from_mut(c))
    }

    /// [`VerbsCompletionQueue::poll_one_ex`] of a completion that is not the usual one
    /// ([`VerbsCompletionQueue::poll_one_ex_other`]), the general path polling on after one
    /// that reports nothing.
    ///
    /// # Safety
    /// Between a successful `ibv_start_poll` of this poller and its `ibv_end_poll` (which
    /// this function calls); the operations are there.
    #[inline(always)]
    unsafe fn poll_one_ex_not_first(&mut self, c: &mut Completion) -> usize {
        // SAFETY: the caller's contract.
        let wc = unsafe { self.ops.as_ref().unwrap_unchecked().current() };
        if self.poll_one_ex_other(&wc, c) {
            return 1;
        }
        self.poll_general(core::slice::from_mut(c))
    }

    /// [`VerbsCompletionQueue::poll_one_ex`] of a completion that is not the usual one,
    /// read between `ibv_start_poll` and `ibv_end_poll` (`wc`): `ibv_end_poll` is called
    /// here, then its retirement made ([`Retire`]) and a late completion finished; whether
    /// `c` holds a completion. Cold and out of line, as [`Self::complete_other`] (it
    /// inlines [`Self::complete`]): `keep`, kept across `ibv_end_poll` here, would have
    /// cost the usual completion a saved register.
    #[cold]
    #[inline(never)]
    fn poll_one_ex_other(&self, wc: &impl WcRead, c: &mut Completion) -> bool {
        let keep = self.complete(wc, c);
        // SAFETY: `poll_one_ex` started a poll that found a completion (`wc`, not read
        // from here on); ended once; the operations are there (its contract).
        unsafe { self.ops.as_ref().unwrap_unchecked().end() };
        // SAFETY: the queue it names is held by the poller (see `retire`).
        unsafe { self.later.take().apply() };
        keep || self.take_late(c)
    }

    /// A one-completion poll that found no completion: 0, unless the CQ was seen `empty`
    /// (not a provider's failure, after which it is not known to be) and the queues of
    /// dropped QPs have entries to give back (the orphan mark is set), which the general
    /// path does once it has seen the CQ empty after reading the mark (it polls again).
    #[inline(always)]
    fn empty_one(&mut self, c: &mut Completion, empty: bool) -> usize {
        if empty && self.slots.orphan_mark() != 0 {
            return self.poll_general(core::slice::from_mut(c));
        }
        0
    }

    /// [`VerbsCompletionQueue::complete_qp`] out of line (what
    /// [`VerbsCompletionQueue::first_send`] did not take). Cold: the usual
    /// completion's path is laid out straight, its `ibv_end_poll` reached without a jump.
    #[cold]
    #[inline(never)]
    fn complete_other(&self, wc: &impl WcRead, qp_num: u32, c: &mut Completion) -> bool {
        self.complete_qp(wc, qp_num, c)
    }

    /// [`VerbsCompletionQueue::poll_one_ex`] with `ibv_poll_cq` of one entry.
    #[inline(never)]
    fn poll_one_legacy(&mut self, c: &mut Completion) -> usize {
        let wc: *mut ffi::ibv_wc = &mut self.wcs[0];
        // SAFETY: live CQ, polled only through this poller; room for one entry.
        let got = unsafe { self.poll_cq.call(1, wc) };
        if got <= 0 {
            return self.empty_one(c, got == 0);
        }
        let wc = &self.wcs[0];
        // `ibv_poll_cq` has published the consumer index: retired at once.
        let keep = match self.first_send(wc) {
            Some(seq) => {
                complete_send::<ffi::ibv_wc>(&self.later, &self.first_sq, seq, self.first_qpn, c)
            }
            None => self.complete_other(wc, wc.qp_num, c),
        };
        if keep {
            return 1;
        }
        self.poll_general(core::slice::from_mut(c))
    }

    /// [`VerbsCompletionQueue::poll`]: the queues' list refreshed when it changed, then up
    /// to `out.len()` completions. Its loops inlined: out of line, their call and second
    /// prologue cost a receive poll into an `out` of two 20 instructions (callgrind in the
    /// rxe VM).
    #[inline(never)]
    fn poll_general(&mut self, out: &mut [Completion]) -> usize {
        if self.registry.gen.load(Ordering::Acquire) != self.gen {
            self.refresh();
        }
        // Entries of dropped QPs: free again once the CQ is seen empty after this read.
        let orphans = self.slots.orphan_mark();
        match &self.ops {
            Some(ops) => self.poll_ex(ops, out, orphans),
            None => self.poll_legacy(out, orphans),
        }
    }

    /// [`VerbsCompletionQueue::poll`] with `ibv_poll_cq`: as many entries as `out` has room
    /// for (up to `wcs`' length) per call, until a call returns fewer than asked (the CQ
    /// is empty) or `out` is full. The first call is made straight, its completions
    /// written, and only a full answer that left room (`out` longer than `wcs`, or
    /// moderation completions among them) goes on in
    /// [`VerbsCompletionQueue::poll_legacy_more`]: a loop here kept its invariants in
    /// stack slots and cost the usual poll, which one call answers, about twenty
    /// instructions.
    #[inline(always)]
    fn poll_legacy(&mut self, out: &mut [Completion], orphans: u64) -> usize {
        let (n, more) = self.poll_legacy_once(out, orphans);
        if more {
            return self.poll_legacy_more(out, n, orphans);
        }
        n
    }

    /// One `ibv_poll_cq` into `out` (nothing when it is empty): the completions written,
    /// and whether the call returned all it was asked with `out` not full (then the CQ may
    /// hold more).
    #[inline(always)]
    fn poll_legacy_once(&mut self, out: &mut [Completion], orphans: u64) -> (usize, bool) {
        let want = out.len().min(self.wcs.len());
        if want == 0 {
            return (0, false);
        }
        // SAFETY: live CQ, polled only through this poller; `wcs` holds `want` entries.
        let got = unsafe { self.poll_cq.call(want as i32, self.wcs.as_mut_ptr()) };
        // Fewer than asked, and not an error (a negative count): the CQ was seen empty.
        if (0..want as i32).contains(&got) && orphans != 0 {
            self.registry.drained(orphans);
        }
        // A provider's count is trusted no further than asked (and an error is none).
        let got = (got.max(0) as usize).min(want);
        let mut n = 0;
        for wc in &self.wcs[..got] {
            // `n < want <= out.len()`: at most `got` completions are kept.
            if self.complete(wc, &mut out[n]) {
                n += 1;
            }
        }
        (n, got == want && n < out.len())
    }

    /// [`VerbsCompletionQueue::poll_legacy`] after a full first answer: polls on into
    /// `out[n..]` until a call returns fewer than asked or `out` is full.
    #[inline(never)]
    fn poll_legacy_more(&mut self, out: &mut [Completion], mut n: usize, orphans: u64) -> usize {
        loop {
            let (k, more) = self.poll_legacy_once(&mut out[n..], orphans);
            n += k;
            if !more {
                return n;
            }
        }
    }

    /// [`VerbsCompletionQueue::poll`] with `ibv_start_poll` / `ibv_end_poll`: completions
    /// are read in place through the `ibv_wc_read_*` accessors (no copy into an `ibv_wc`),
    /// only the fields each one needs. Into an `out` of one (a latency loop's poll) the
    /// completion is read straight (no loop: the compiler would copy every operation's
    /// pointer to the stack before one); larger `out`s, and a first completion that reports
    /// nothing, take the loop of [`VerbsCompletionQueue::poll_ex_rest`].
    ///
    /// One completion per `ibv_start_poll` / `ibv_end_poll` pair, never `ibv_next_poll`:
    /// rxe before rdma-core 55 (commit b78b414e0, "rxe: fix completion queue consumer index
    /// overrun"; Debian 12 ships 44) releases the CQ's lock and publishes the consumer index
    /// when `ibv_next_poll` finds nothing, after which the `ibv_end_poll` that the man page
    /// requires advances the index past the producer (a stale completion read again, the
    /// CQ's entries miscounted) and unlocks a second time. A start/end pair is right on
    /// every version, and a latency loop polls one completion at a time anyway.
    #[inline(always)]
    fn poll_ex(&self, ops: &PollOps, out: &mut [Completion], orphans: u64) -> usize {
        let [first] = out else {
            return self.poll_ex_rest(ops, 0, out, orphans);
        };
        // SAFETY: live CQ, polled only through this poller (`&mut self`).
        let rc = unsafe { ops.start() };
        if rc != 0 {
            // Only an empty CQ frees the entries of dropped QPs' queues, not a failure.
            if rc == EMPTY && orphans != 0 {
                self.registry.drained(orphans);
            }
            return 0;
        }
        // SAFETY: a completion is current until `end`.
        let keep = self.complete(&unsafe { ops.current() }, first);
        // SAFETY: start succeeded; ended once.
        unsafe { ops.end() };
        // SAFETY: the queue it names is held by the poller (see `retire`).
        unsafe { self.later.take().apply() };
        if keep || self.take_late(first) {
            return 1;
        }
        // A moderation completion: the next one.
        self.poll_ex_rest(ops, 0, out, orphans)
    }

    /// [`VerbsCompletionQueue::poll_ex`] from `out[n]` on: one completion per start / end
    /// pair until `out` is full or the CQ empty.
    #[inline(always)]
    fn poll_ex_rest(
        &self,
        ops: &PollOps,
        mut n: usize,
        out: &mut [Completion],
        orphans: u64,
    ) -> usize {
        while n < out.len() {
            // SAFETY: as in `poll_ex`.
            let rc = unsafe { ops.start() };
            if rc != 0 {
                // As in `poll_ex`.
                if rc == EMPTY && orphans != 0 {
                    self.registry.drained(orphans);
                }
                break;
            }
            // SAFETY: as in `poll_ex`.
            let keep = self.complete(&unsafe { ops.current() }, &mut out[n]);
            // SAFETY: as in `poll_ex`.
            unsafe { ops.end() };
            // SAFETY: the queue it names is held by the poller (see `retire`).
            unsafe { self.later.take().apply() };
            n += (keep || self.take_late(&mut out[n])) as usize;
        }
        n
    }

    /// A timed poll: up to `out.len()` completions (`times` as long), one per
    /// `ibv_start_poll` / `ibv_end_poll` pair, each success's time read with
    /// `ibv_wc_read_completion_wallclock_ns` (rdma-core converts it: the clock-info page it
    /// read at `ibv_start_poll`, or real time); None for an error completion. 0 on a CQ
    /// without the extended operations (creation refuses timestamps there).
    pub(crate) fn poll_timed(
        &mut self,
        out: &mut [Completion],
        times: &mut [Option<u64>],
    ) -> usize {
        if self.registry.gen.load(Ordering::Acquire) != self.gen {
            self.refresh();
        }
        let orphans = self.slots.orphan_mark();
        let Some(ops) = self.ops else {
            return 0;
        };
        let mut n = 0;
        while n < out.len().min(times.len()) {
            // SAFETY: live CQ, polled only through this poller (`&mut self`).
            let rc = unsafe { ops.start() };
            if rc != 0 {
                // As in `poll_ex`.
                if rc == EMPTY && orphans != 0 {
                    self.registry.drained(orphans);
                }
                break;
            }
            // SAFETY: a completion is current until `end`.
            let keep = self.complete(&unsafe { ops.current() }, &mut out[n]);
            if keep {
                // SAFETY: as above; the CQ was created with the wall-clock flag.
                times[n] = out[n]
                    .is_ok()
                    .then(|| unsafe { ops.wallclock_ns() })
                    .flatten();
            }
            // SAFETY: start succeeded; ended once.
            unsafe { ops.end() };
            // SAFETY: the queue it names is held by the poller (see `retire`).
            unsafe { self.later.take().apply() };
            // A late completion's time is not read (None): the provider's accessors are
            // valid only before `ibv_end_poll`.
            let late = !keep && self.take_late(&mut out[n]);
            if late {
                times[n] = None;
            }
            n += (keep || late) as usize;
        }
        n
    }

    #[cold]
    fn refresh(&mut self) {
        if let Some((list, gen)) = self.registry.snapshot_if_changed(self.gen) {
            (self.cache, self.gen) = (list, gen);
            match self
                .cache
                .first()
                .and_then(|a| Some((a.qpn, a.sq.clone()?)))
            {
                Some((qpn, sq)) => (self.first_qpn, self.first_sq) = (qpn, sq),
                // The old queue let go (not kept alive here once the list dropped it).
                None => (self.first_qpn, self.first_sq) = (NO_QPN, self.no_sq.clone()),
            }
            // `no_sq`'s is `incarnation::NONE`, which no request's `wr_id` carries.
            self.first_tag = self.first_sq.tag();
            self.first_rq_tag = self
                .cache
                .first()
                .and_then(|a| a.rq.as_ref())
                .map_or(incarnation::NONE, |rq| rq.tag());
            self.first_ring = self.first_sq.ring();
            // The old list's scatter tables may have been the last holders of pins on
            // regions whose domain went.
            crate::queue::lifetime::sweep_held();
        }
    }

    /// Writes the completion of one work completion `wc` into `c`, attributed by its
    /// `wr_id` (a receive carries [`RECV_TAG`]) and QP number; false (`c` holds nothing to
    /// report) for a moderation completion, which only retires the unsignaled requests
    /// before it, or one of a QP no longer attached. Successes take this straight path,
    /// errors [`complete_error`].
    #[inline(always)]
    fn complete<W: WcRead>(&self, wc: &W, c: &mut Completion) -> bool {
        // On the extended API, the first queue's successful sends and receives by their
        // `wr_id` alone (its incarnation, and the receive tags: no other queue's requests
        // carry them), as the one-completion poll's usual completion: the QP number not
        // read (a call into the provider), the list not searched. Not from an `ibv_wc`
        // (the classic API's, whose QP number is a field): there the two compares cost
        // the receive poll more than they saved (rxe: 227.1 -> 233.2).
        if W::IN_POLL {
            if let Some(wr_id) = success_wr_id(wc) {
                if let Some(seq) = self.first_send_of(wr_id) {
                    return complete_send::<W>(&self.later, &self.first_sq, seq, self.first_qpn, c);
                }
                if wr_id & !0xffff == self.first_rq_tag {
                    if let Some(q) = self.cache.first() {
                        return complete_recv(&self.later, q, wc, wr_id, q.qpn, c);
                    }
                }
            }
        }
        self.complete_qp(wc, wc.qp_num(), c)
    }

    /// [`VerbsCompletionQueue::complete`] of a completion of QP `qp_num`.
    #[inline(always)]
    fn complete_qp(&self, wc: &impl WcRead, qp_num: u32, c: &mut Completion) -> bool {
        // The first queue at once (a CQ of one QP, the latency case), the others searched.
        let q = match self.cache.first() {
            Some(a) if a.qpn == qp_num => a,
            _ => match self.cache.iter().find(|a| a.qpn == qp_num) {
                Some(a) => a,
                None => return self.complete_unknown(wc, qp_num, c),
            },
        };
        match complete_attached(&self.later, q, wc, qp_num, c) {
            Some(keep) => keep,
            // Another incarnation of the number: a QP dropped after the poll read the
            // list, its number given to a new QP whose completion this is, or a dropped
            // QP's completion left in the CQ (rxe keeps them) read once the list has the
            // new one.
            None => self.complete_unknown(wc, qp_num, c),
        }
    }

    /// A completion of QP `qp_num`, which this poller's list does not have (not that
    /// incarnation of the number: [`owns`]): a QP attached after the poll read the list's
    /// generation (its completion written into `c` as any other; also when it took the
    /// number of a QP dropped after that read), or one no longer attached (nothing
    /// reported, also when a new QP has its number now; when it is a receive of a
    /// dropped QP that took its receives from an SRQ, a dead entry
    /// ([`crate::queue::registry::DEAD`]), the SRQ's slot is given back, and the regions
    /// it pinned). Both are looked up in the registry under its lock, never while the
    /// provider holds the CQ's: read between `ibv_start_poll` and `ibv_end_poll`
    /// ([`WcRead::IN_POLL`]), the completion is copied ([`LateWc`]) and finished after
    /// `ibv_end_poll` ([`VerbsCompletionQueue::take_late`]; a QP's destruction takes the
    /// CQ's lock under the registry's: `mlx5_destroy_qp`'s `mlx5_lock_cqs`).
    #[cold]
    #[inline(never)]
    fn complete_unknown<W: WcRead>(&self, wc: &W, qp_num: u32, c: &mut Completion) -> bool {
        if W::IN_POLL {
            self.late.set(Some(LateWc::of(wc, RECV_TAG, UD_TAG)));
            return false;
        }
        let dead = qp_num | crate::queue::registry::DEAD;
        let wr_id = wc.wr_id();
        let list = self.registry.lock();
        if let Some(q) = list.iter().find(|a| a.qpn == qp_num && owns(a, wr_id)) {
            // Attached after this poll read the list's generation (`owns`: never None).
            // Before a dead entry this poller's list may still hold under the number: a
            // receive of the same SRQ is the live QP's (a QP on an SRQ is destroyed, and
            // its number freed, only once the poller has taken its completions:
            // `Registry::defer`), not given back unreported.
            return complete_attached(&self.later, q, wc, qp_num, c).unwrap_or(false);
        }
        // Of a dead entry in this poller's list, or buried after the poll read it.
        let q = self.cache.iter().chain(list.iter());
        if let Some(q) = q.filter(|a| a.qpn == dead).find(|a| owns(a, wr_id)) {
            if wr_id & RECV_TAG != 0 {
                take_recv::<W>(&self.later, q, wr_id as u16);
            }
        }
        false
    }

    /// Finishes the completion [`VerbsCompletionQueue::complete_unknown`] kept, if any,
    /// into `c` (after `ibv_end_poll`): whether `c` holds a completion. Called after every
    /// `ibv_end_poll` whose completion reported nothing, so that none is kept past a poll.
    #[cold]
    #[inline(never)]
    fn take_late(&self, c: &mut Completion) -> bool {
        match self.late.take() {
            Some(wc) => self.complete_unknown(&wc, wc.qp_num, c),
            None => false,
        }
    }

    /// Whether `wc` is the usual completion, a successful send of the first queue (a CQ of
    /// one QP, the latency case): Some(its send's position in `first_sq`), for
    /// [`complete_send`] or [`send_completion`]; None for any other. By its `wr_id`
    /// alone: the bits above the position are `first_sq`'s incarnation, which no other
    /// queue's requests carry (nor a receive's: [`RECV_TAG`] is not among them), so the
    /// QP number is not read.
    #[inline(always)]
    fn first_send(&self, wc: &impl WcRead) -> Option<u16> {
        self.first_send_of(success_wr_id(wc)?)
    }

    /// [`VerbsCompletionQueue::first_send`] of a successful completion's `wr_id`.
    #[inline(always)]
    fn first_send_of(&self, wr_id: u64) -> Option<u16> {
        (wr_id & !0xffff == self.first_tag).then_some(wr_id as u16)
    }
}

/// The `wr_id` of `wc` when it is a success (the fields of an error completion but its
/// `wr_id` and status are undefined; its bits above the position say only which queue).
#[inline(always)]
fn success_wr_id(wc: &impl WcRead) -> Option<u64> {
    (wc.status() == ffi::ibv_wc_status::IBV_WC_SUCCESS).then(|| wc.wr_id())
}

/// Whether the completion whose `wr_id` is `wr_id` is of the queues of `q` (found by its
/// QP number), not of another incarnation of the number: the bits of `wr_id` above its
/// position (the receive tags and the queue's incarnation, `incarnation`) are the tag of
/// the side they name, the send queue or the receive queue or SRQ. Never when `q` lacks
/// that side: a QP's queues are all attached before it can complete, so the completion is
/// of another incarnation of the number, whose queue the registry has (the poller's list,
/// read before a QP that completed here by its other side only was dropped, or with the
/// dead entry of one that took its receives from an SRQ, [`crate::queue::registry::DEAD`],
/// holds it under the number another QP took, whose completion this is): reported as
/// nothing, that QP's signaled request would never complete.
#[inline(always)]
fn owns(q: &Attached, wr_id: u64) -> bool {
    if wr_id & RECV_TAG != 0 {
        return receives(q, wr_id);
    }
    match &q.sq {
        Some(sq) => wr_id & !0xffff == sq.tag(),
        None => false,
    }
}

/// [`owns`] of a receive's completion (`wr_id` carries [`RECV_TAG`]).
#[inline(always)]
fn receives(q: &Attached, wr_id: u64) -> bool {
    let side = match (&q.rq, &q.srq) {
        (Some(rq), _) => rq.tag(),
        (None, Some(srq)) => srq.cookies.tag(),
        (None, None) => return false,
    };
    wr_id & !0xffff == side
}

/// [`VerbsCompletionQueue::complete_qp`] of a completion of attached queue `q` (QP
/// `qp_num`): whether `c` holds a completion, or None (nothing done) when the completion
/// is of another incarnation of the number ([`owns`]), checked where the side it names is
/// read anyway.
#[inline(always)]
fn complete_attached<W: WcRead>(
    later: &Cell<Retire>,
    q: &Attached,
    wc: &W,
    qp_num: u32,
    c: &mut Completion,
) -> Option<bool> {
    let status = wc.status();
    let wr_id = wc.wr_id();
    let seq = wr_id as u16;
    if status != ffi::ibv_wc_status::IBV_WC_SUCCESS {
        if !owns(q, wr_id) {
            return None;
        }
        let vendor_err = wc.vendor_err();
        return Some(complete_error::<W>(later, q, wr_id, status, vendor_err, c));
    }
    if wr_id & RECV_TAG != 0 {
        if !receives(q, wr_id) {
            return None;
        }
        return Some(complete_recv(later, q, wc, wr_id, qp_num, c));
    }
    // Without a send queue, not `q`'s either ([`owns`]).
    let sq = q.sq.as_ref()?;
    if wr_id & !0xffff != sq.tag() {
        return None;
    }
    Some(complete_send::<W>(later, sq, seq, qp_num, c))
}

/// Writes the completion of the successful send `seq` of send queue `sq` (QP `qp_num`)
/// into `c`, and retires it with the unsignaled requests before it (after `ibv_end_poll`
/// for a completion read inside the pair, `W`: [`retire`]); false (`c` holds nothing
/// to report) for a moderation completion.
#[inline(always)]
fn complete_send<W: WcRead>(
    later: &Cell<Retire>,
    sq: &Shadow<SendEntry>,
    seq: u16,
    qp_num: u32,
    c: &mut Completion,
) -> bool {
    // The entry is read before the retirement frees it.
    // SAFETY: the reference is dropped in `send_completion`, before the retirement.
    let keep = send_completion(unsafe { sq.entry(seq) }, qp_num, c);
    retire::<W>(later, Retire::Send(sq, seq.wrapping_add(1)));
    keep
}

/// [`complete_send`] without the retirement: the completion of a successful send, its
/// shadow entry `e` (in place: [`Shadow::entry`] or [`Ring::entry`]), of QP `qp_num`,
/// written into `c`; false for a moderation completion. The caller drops `e` and then
/// retires the send (`seq + 1`: a verbs-path request takes one position).
#[inline(always)]
fn send_completion(e: &SendEntry, qp_num: u32, c: &mut Completion) -> bool {
    // In place, not a copy (`Shadow::get`): from a copy the compiler wrote the fields to
    // `c` one by one (five loads and five stores, not `completion_into`'s one move): poll
    // 229.3 / 243.2 against 222.3 / 236.2 in place (`verbs_icount`, extended / classic).
    // A verbs-path request takes one position (`bbs` 1, as the send queues write it): the
    // constant spares the load.
    debug_assert_eq!(e.bbs, 1);
    if !e.report {
        return false;
    }
    e.completion_into(qp_num, c);
    true
}

/// Writes the completion of the successful receive `wc` (its `wr_id` carries
/// [`RECV_TAG`]) of attached queue `q` (QP `qp_num`) into `c`, and retires the receive
/// ([`take_recv`]); false when `q` has no receive queue or SRQ.
///
/// The opcode is read only for a receive that carries an immediate: a receive consumed
/// by an RDMA write with immediate always carries one (`IBV_WC_WITH_IMM`; the IB
/// specification's RDMA Write with Immediate delivers its immediate in the receive's
/// completion), so without the flag the receive is a send's (`IBV_WC_RECV`). On the
/// extended API each field is a call into the provider (`ibv_wc_read_opcode`): the usual
/// receive makes one call less.
#[inline(always)]
fn complete_recv<W: WcRead>(
    later: &Cell<Retire>,
    q: &Attached,
    wc: &W,
    wr_id: u64,
    qp_num: u32,
    c: &mut Completion,
) -> bool {
    let Some(cookie) = take_recv::<W>(later, q, wr_id as u16) else {
        return false;
    };
    let flags = wc.wc_flags();
    let byte_len = wc.byte_len();
    let (opcode, imm) = if flags & ffi::ibv_wc_flags::IBV_WC_WITH_IMM.0 != 0 {
        let opcode = if wc.opcode() == ffi::ibv_wc_opcode::IBV_WC_RECV_RDMA_WITH_IMM {
            WcOpcode::RecvRdmaWithImm
        } else {
            WcOpcode::Recv
        };
        (opcode, Some(u32::from_be(wc.imm_or_rkey())))
    } else if flags & WITH_INV_ANY != 0 {
        with_inv(q, flags, wc.imm_or_rkey())
    } else {
        (WcOpcode::Recv, None)
    };
    // A UD receive: the sender's QP number and whether a GRH came (read for these only).
    let (src_qp, grh) = if wr_id & UD_TAG != 0 {
        (wc.src_qp(), flags & ffi::ibv_wc_flags::IBV_WC_GRH.0 != 0)
    } else {
        (0, false)
    };
    *c = Completion {
        cookie,
        status: WcStatus::Success,
        opcode,
        byte_len,
        imm,
        qpn: qp_num,
        src_qp,
        grh,
        ..Completion::default()
    };
    true
}

/// The `wc_flags` bits that may say "with invalidate": `IBV_WC_WITH_INV`, and on rxe
/// `IBV_WC_IP_CSUM_OK`. rxe's kernel driver writes the kernel's `IB_WC_WITH_INVALIDATE`
/// (`1 << 2`) into the flags user space reads, where bit 2 is `IBV_WC_IP_CSUM_OK`
/// (`rxe_resp.c` `do_complete`; rdma-core's rxe passes the flags on as they are), and it
/// never reports a checksum.
pub(crate) const WITH_INV_ANY: u32 =
    ffi::ibv_wc_flags::IBV_WC_WITH_INV.0 | ffi::ibv_wc_flags::IBV_WC_IP_CSUM_OK.0;

/// The bit of [`WITH_INV_ANY`] by which a QP's provider says "with invalidate" (rxe's, or
/// everyone else's).
pub(crate) fn with_inv_flag(rxe: bool) -> u32 {
    if rxe {
        ffi::ibv_wc_flags::IBV_WC_IP_CSUM_OK.0
    } else {
        ffi::ibv_wc_flags::IBV_WC_WITH_INV.0
    }
}

/// A successful receive whose flags have a bit of [`WITH_INV_ANY`]: a receive with
/// invalidate when the bit is the one QP `q`'s provider uses for it (its key recorded for
/// the QP's windows before the completion is returned), else a plain receive (a
/// checksum's bit).
#[cold]
#[inline(never)]
fn with_inv(q: &Attached, flags: u32, rkey: u32) -> (WcOpcode, Option<u32>) {
    match &q.invalidations {
        Some(log) if flags & log.verbs_flag != 0 => {
            log.record(rkey);
            (WcOpcode::RecvWithInv, Some(rkey))
        }
        _ => (WcOpcode::Recv, None),
    }
}

/// The completion of a work completion in error (status `status`, `vendor_err`) of
/// attached queue `q`, written into `c`: the request `wr_id` names is retired (as
/// [`retire`] says when; a send's first error is noted) and always reported, its opcode from the shadow entry (a receive:
/// `Recv`), as on an error the work completion's opcode, byte count and flags are
/// undefined. False when `q` has no queue of that kind.
#[cold]
#[inline(never)]
fn complete_error<W: WcRead>(
    later: &Cell<Retire>,
    q: &Attached,
    wr_id: u64,
    status: u32,
    vendor_err: u32,
    c: &mut Completion,
) -> bool {
    let seq = wr_id as u16;
    let mut out = Completion {
        status: WcStatus::from_u32(status),
        qpn: q.qpn,
        syndrome: Some((0, vendor_err as u8)),
        ..Completion::default()
    };
    if wr_id & RECV_TAG != 0 {
        let Some(cookie) = take_recv::<W>(later, q, seq) else {
            return false;
        };
        out.cookie = cookie;
        out.opcode = WcOpcode::Recv;
    } else {
        let Some(sq) = q.sq.as_ref() else {
            return false;
        };
        let e = sq.get(seq);
        sq.note_error(seq);
        retire::<W>(later, Retire::Send(&**sq, seq.wrapping_add(e.bbs)));
        out.cookie = e.cookie;
        out.opcode = e.opcode;
    }
    *c = out;
    true
}

/// The cookie of the receive `seq` names on attached queue `q`, which is retired (as
/// [`retire`] says when): its own receive queue's entry, or, for a QP with an SRQ
/// (`seq` is the SRQ's slot), the SRQ's, whose slot is given back. None when `q` has
/// neither. The regions the receive pinned go back at once: rdma-core copied what came
/// inside the CQE when it read it (`ibv_poll_cq`, `ibv_start_poll`), and they are not the
/// CQ's room.
#[inline(always)]
fn take_recv<W: WcRead + ?Sized>(later: &Cell<Retire>, q: &Attached, seq: u16) -> Option<u64> {
    match (&q.rq, &q.srq) {
        (Some(rq), _) => {
            let cookie = rq.get(seq);
            // rdma-core has copied whatever it copies: the regions go back first.
            if let Some(t) = &q.scatter {
                t.done(seq);
            }
            retire::<W>(later, Retire::Recv(&**rq, seq.wrapping_add(1)));
            Some(cookie)
        }
        (None, Some(srq)) => {
            let slot = srq.slot(seq);
            let cookie = srq.cookies.get(slot);
            // The slot goes into the SRQ's free ring now; the freed count that hands it to
            // the poster is its cookie table's retired mark (`SrqShared::free`).
            let k = srq.stage_free(slot);
            retire::<W>(later, Retire::Recv(&srq.cookies, k));
            Some(cookie)
        }
        (None, None) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::invalidations::Invalidations;
    use crate::queue::shadow::Shadow;
    use std::cell::Cell;

    /// A successful receive's work completion, counting the reads of its opcode.
    struct FakeWc {
        flags: u32,
        opcode: u32,
        imm: u32,
        opcode_reads: Cell<u32>,
    }

    impl WcRead for FakeWc {
        fn wr_id(&self) -> u64 {
            unreachable!("passed to complete_recv")
        }
        fn status(&self) -> u32 {
            ffi::ibv_wc_status::IBV_WC_SUCCESS
        }
        fn qp_num(&self) -> u32 {
            unreachable!("passed to complete_recv")
        }
        fn opcode(&self) -> u32 {
            self.opcode_reads.set(self.opcode_reads.get() + 1);
            self.opcode
        }
        fn vendor_err(&self) -> u32 {
            0
        }
        fn byte_len(&self) -> u32 {
            8
        }
        fn wc_flags(&self) -> u32 {
            self.flags
        }
        fn imm_or_rkey(&self) -> u32 {
            self.imm
        }
        fn src_qp(&self) -> u32 {
            77
        }
    }

    /// Completes receive 3 (cookie 99) of a queue on QP 5 from `wc`; also checks that it
    /// retired the receive.
    fn receive(wc: &FakeWc) -> Completion {
        receive_recording(wc, None)
    }

    /// [`receive`] on a QP whose invalidated keys go to `log`.
    fn receive_recording(wc: &FakeWc, log: Option<Arc<Invalidations>>) -> Completion {
        let rq = Arc::new(Shadow::<u64>::new(16));
        rq.set(3, 99);
        let q = Attached {
            qpn: 5,
            sq: None,
            rq: Some(rq.clone()),
            scatter: None,
            srq: None,
            invalidations: log,
        };
        let mut c = Completion::default();
        let later = Cell::new(Retire::Nothing);
        assert!(complete_recv(&later, &q, wc, RECV_TAG | 3, 5, &mut c));
        assert_eq!(rq.retired(), 4);
        assert_eq!((c.cookie, c.qpn, c.byte_len, c.src_qp), (99, 5, 8, 0));
        c
    }

    /// A receive without an immediate is a send's: its opcode is not read (on the
    /// extended API, one provider call less per receive); with one, the opcode tells an
    /// RDMA write's from a send's.
    #[test]
    fn a_receive_reads_its_opcode_only_with_an_immediate() {
        use ffi::ibv_wc_flags as F;
        use ffi::ibv_wc_opcode as O;
        let wc = |flags, opcode, imm| FakeWc {
            flags,
            opcode,
            imm,
            opcode_reads: Cell::new(0),
        };
        // A plain send's receive (the opcode a provider would report, never read).
        let plain = wc(0, O::IBV_WC_RECV, 0);
        let c = receive(&plain);
        assert_eq!((c.opcode, c.imm), (WcOpcode::Recv, None));
        assert_eq!(
            plain.opcode_reads.get(),
            0,
            "a plain receive read its opcode"
        );
        // A send with invalidate: the rkey, recorded for the QP's windows; no opcode read.
        let log = Arc::new(Invalidations::new(with_inv_flag(false)));
        let inv = wc(F::IBV_WC_WITH_INV.0, O::IBV_WC_RECV, 0x1234);
        let c = receive_recording(&inv, Some(log.clone()));
        assert_eq!((c.opcode, c.imm), (WcOpcode::RecvWithInv, Some(0x1234)));
        assert_eq!(inv.opcode_reads.get(), 0);
        assert!(log.take(0x1234), "the key was recorded");
        // rxe says it with IBV_WC_IP_CSUM_OK's bit; elsewhere that bit is a checksum's.
        let rxe = Arc::new(Invalidations::new(with_inv_flag(true)));
        let csum = wc(F::IBV_WC_IP_CSUM_OK.0, O::IBV_WC_RECV, 0x99);
        let c = receive_recording(&csum, Some(rxe.clone()));
        assert_eq!((c.opcode, c.imm), (WcOpcode::RecvWithInv, Some(0x99)));
        assert!(rxe.take(0x99));
        let c = receive_recording(&csum, Some(log.clone()));
        assert_eq!((c.opcode, c.imm), (WcOpcode::Recv, None));
        assert!(!log.take(0x99), "a checksum's bit recorded a key");
        // An RDMA write with immediate: the immediate in host order.
        let write = wc(
            F::IBV_WC_WITH_IMM.0,
            O::IBV_WC_RECV_RDMA_WITH_IMM,
            7u32.to_be(),
        );
        let c = receive(&write);
        assert_eq!((c.opcode, c.imm), (WcOpcode::RecvRdmaWithImm, Some(7)));
        assert_eq!(write.opcode_reads.get(), 1);
        // A send with immediate.
        let send = wc(F::IBV_WC_WITH_IMM.0, O::IBV_WC_RECV, 9u32.to_be());
        let c = receive(&send);
        assert_eq!((c.opcode, c.imm), (WcOpcode::Recv, Some(9)));
        assert_eq!(send.opcode_reads.get(), 1);
    }

    /// A UD receive reports the sender's QP number and the GRH flag; an RC one neither.
    #[test]
    fn a_ud_receive_reports_its_sender() {
        let rq = Arc::new(Shadow::<u64>::new(16));
        rq.set(0, 1);
        let q = Attached {
            qpn: 5,
            sq: None,
            rq: Some(rq),
            scatter: None,
            srq: None,
            invalidations: None,
        };
        let wc = FakeWc {
            flags: ffi::ibv_wc_flags::IBV_WC_GRH.0,
            opcode: ffi::ibv_wc_opcode::IBV_WC_RECV,
            imm: 0,
            opcode_reads: Cell::new(0),
        };
        let mut c = Completion::default();
        let later = Cell::new(Retire::Nothing);
        assert!(complete_recv(&later, &q, &wc, RECV_TAG | UD_TAG, 5, &mut c));
        assert_eq!((c.src_qp, c.grh, c.cookie), (77, true, 1));
        let none = Attached {
            qpn: 6,
            sq: None,
            rq: None,
            scatter: None,
            srq: None,
            invalidations: None,
        };
        assert!(!complete_recv(&later, &none, &wc, RECV_TAG, 6, &mut c));
    }

    /// An entry without the side a completion names does not own it ([`owns`]): the
    /// completion of a QP that took the number of a dropped QP that completed here by its
    /// other side only is not reported as nothing (`complete_attached` says None, and the
    /// poller looks it up in the registry). A successful send, a receive and an error of
    /// each, on an entry with the other side only; with the side, its own.
    #[test]
    fn a_completion_of_a_side_the_entry_lacks_is_not_its() {
        let sq = Arc::new(Shadow::<SendEntry>::new(16).with_tag(incarnation::next()));
        let rq = Arc::new(Shadow::<u64>::new(16).with_tag(RECV_TAG | incarnation::next()));
        sq.set(
            0,
            SendEntry {
                bbs: 1,
                ..SendEntry::default()
            },
        );
        let entry = |sq: Option<&Arc<Shadow<SendEntry>>>, rq: Option<&Arc<Shadow<u64>>>| Attached {
            qpn: 5,
            sq: sq.cloned(),
            rq: rq.cloned(),
            scatter: None,
            srq: None,
            invalidations: None,
        };
        let (send_only, recv_only) = (entry(Some(&sq), None), entry(None, Some(&rq)));
        let wc = |wr_id, status| LateWc {
            wr_id,
            status,
            qp_num: 5,
            ..LateWc::default()
        };
        let ok = ffi::ibv_wc_status::IBV_WC_SUCCESS;
        let err = ffi::ibv_wc_status::IBV_WC_REM_ACCESS_ERR;
        let later = Cell::new(Retire::Nothing);
        let mut c = Completion::default();
        for (what, q, wc) in [
            (
                "a send on a receive-only entry",
                &recv_only,
                wc(sq.tag(), ok),
            ),
            (
                "a send error on a receive-only entry",
                &recv_only,
                wc(sq.tag(), err),
            ),
            (
                "a receive on a send-only entry",
                &send_only,
                wc(rq.tag(), ok),
            ),
            (
                "a receive error on a send-only entry",
                &send_only,
                wc(rq.tag(), err),
            ),
        ] {
            assert_eq!(complete_attached(&later, q, &wc, 5, &mut c), None, "{what}");
        }
        assert_eq!((sq.retired(), rq.retired()), (0, 0));
        // Its own side: its own (a moderation completion of the send; the receive).
        let both = entry(Some(&sq), Some(&rq));
        assert_eq!(
            complete_attached(&later, &both, &wc(sq.tag(), ok), 5, &mut c),
            Some(false)
        );
        assert_eq!(
            complete_attached(&later, &both, &wc(rq.tag(), ok), 5, &mut c),
            Some(true)
        );
    }
}
