//! The verbs data path: the same requests, cookies and completion semantics as the direct
//! path, over `ibv_post_send`, `ibv_post_recv` and `ibv_poll_cq`.
//!
//! Cookies go through the same shadow tables as on the direct path, indexed by a per-queue
//! sequence number carried in `wr_id`, so moderation completions (the driver signals one
//! request in half a queue of unsignaled ones) stay hidden and every status is the verbs one.
//! Work requests, gather lists and inline staging are preallocated: posting allocates nothing.

use super::calls::{PollCq, PostRecv};
use super::code;
use super::ex::{PollOps, SendOps, VerbsApi, WcRead};
use super::objects::Qp;
use crate::completion::{Completion, WcOpcode};
use crate::error::{Error, QueueUnit, Result};
use crate::queue::cq_share::{CqShare, CqSlots};
use crate::queue::flags::PostFlags;
use crate::queue::regions::{RegionCheck, Regions};
use crate::queue::registry::{Attached, Registry};
use crate::queue::scatter::ScatterTable;
use crate::queue::shadow::{SendEntry, Shadow};
use crate::{Fence, Payload, Request, Sge, WcStatus};
use rdma_sys as ffi;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Marks a receive's `wr_id` (its sequence number is in the low 16 bits): completions in
/// error have no valid opcode, and this is how they are attributed to the right queue.
pub(crate) const RECV_TAG: u64 = 1 << 63;

/// Marks a UD QP's receive's `wr_id` (with [`RECV_TAG`]): its completion carries the
/// sender's QP number and whether a GRH was received, read only for these.
const UD_TAG: u64 = 1 << 62;

/// Most requests in one verbs batch (one `ibv_post_send` of a linked list).
pub const MAX_BATCH: usize = 64;

/// The send side of a QP on the verbs path.
pub struct VerbsSendQueue {
    qp: Arc<Qp>,
    /// The QP's extended send operations (a copy of `qp.send_ops`: one load less per post).
    send_ops: Option<SendOps>,
    cap: u32,
    /// The position up to which requests may be posted without looking at the queue's
    /// retired position or its CQ entries: never past the queue's room (`retired + cap`)
    /// nor the CQ allowance (`CqShare`'s end) when it was computed, both of which only
    /// grow while the queue posts. At it, [`VerbsSendQueue::check_room`] takes its cold
    /// path and computes both again.
    room_end: u16,
    max_sge: usize,
    max_inline: usize,
    pub(crate) shadow: Arc<Shadow<SendEntry>>,
    seq: u16,
    unsignaled: u32,
    /// Set after a bind or local invalidate: the next request is fenced (as rdma-core arms an
    /// initiator small fence on mlx5).
    fence_next: bool,
    /// `(unsignaled, fence_next)` before each queued request: what a rewind, or a ring whose
    /// requests were refused from one on, puts back (else a refused forced-signal request
    /// would leave no signaled one outstanding and the queue full for good, and a refused
    /// request would take the fence after a bind with it).
    moderation: Box<[(u32, bool)]>,
    wrs: Box<[ffi::ibv_send_wr]>,
    sges: Box<[ffi::ibv_sge]>,
    inline: Box<[u8]>,
    pub(super) pending: usize,
    /// What the device's atomics can do (read once when the device was opened).
    atomics: mlx5::AtomicCaps,
    /// The CQ entries this queue holds (None: not accounted, for tests).
    cq_share: Option<CqShare>,
    /// A batch with a gather list of more than one entry goes through `ibv_post_send` even
    /// on an extended QP (see [`VerbsSendQueue::set_gather_lists_legacy`]).
    gather_lists_legacy: bool,
}

// SAFETY: the work-request arrays point only into this queue's own boxed buffers; the QP is
// thread-safe in rdma-core and posting is serialised by `&mut self`.
unsafe impl Send for VerbsSendQueue {}

impl std::fmt::Debug for VerbsSendQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsSendQueue")
            .field("qpn", &self.qp.qpn())
            .field("seq", &self.seq)
            .finish()
    }
}

fn zeroed_wr() -> ffi::ibv_send_wr {
    // SAFETY: an all-zero ibv_send_wr (null pointers, zero counts) is a valid value.
    unsafe { std::mem::zeroed() }
}

impl VerbsSendQueue {
    /// The send queue of `qp`.
    pub fn new(qp: Arc<Qp>) -> VerbsSendQueue {
        let caps = qp.caps;
        let entries = caps.max_send_wr.max(1).next_power_of_two();
        let max_sge = caps.max_send_sge.max(1) as usize;
        VerbsSendQueue {
            send_ops: qp.send_ops,
            cap: caps.max_send_wr,
            room_end: 0,
            max_sge,
            max_inline: caps.max_inline as usize,
            shadow: Arc::new(Shadow::new(entries.max(16))),
            seq: 0,
            unsignaled: 0,
            fence_next: false,
            moderation: vec![(0, false); MAX_BATCH].into_boxed_slice(),
            wrs: (0..MAX_BATCH).map(|_| zeroed_wr()).collect(),
            // SAFETY: an all-zero ibv_sge is valid.
            sges: (0..MAX_BATCH * max_sge)
                .map(|_| unsafe { std::mem::zeroed() })
                .collect(),
            inline: vec![0u8; MAX_BATCH * caps.max_inline as usize].into_boxed_slice(),
            pending: 0,
            atomics: mlx5::AtomicCaps::HOST_ORDER,
            cq_share: None,
            gather_lists_legacy: false,
            qp,
        }
    }

    /// Posts batches with a gather list of more than one entry with `ibv_post_send` even
    /// when the QP has the extended operations. For rxe before rdma-core 64: its
    /// `wr_set_sge_list` sums the first entry's length `num_sge` times (fixed by commit
    /// 406cd2ad0, "rxe: Fix dma.length computation in wr_set_sge_list"), and the kernel then
    /// fails the request with a local protection error or moves the wrong bytes; its
    /// `ibv_post_send` sums them right. A batch is posted whole by one API, so the order of
    /// the requests and the error semantics of [`VerbsSendQueue::ring`] are kept.
    pub fn set_gather_lists_legacy(&mut self, on: bool) {
        self.gather_lists_legacy = on;
    }

    /// The QP number.
    pub fn qpn(&self) -> u32 {
        self.qp.qpn()
    }

    /// Sets what the device's atomics can do: atomics it lacks are refused before posting
    /// (rdma-core's mlx5 returns EOPNOTSUPP without `atomic_cap`; other providers post them
    /// and fail the request).
    pub fn set_atomic_caps(&mut self, caps: mlx5::AtomicCaps) {
        self.atomics = caps;
    }

    /// Requests that can be posted now.
    #[inline]
    pub fn free(&self) -> u32 {
        self.cap
            .saturating_sub(self.seq.wrapping_sub(self.shadow.retired()) as u32)
    }

    /// Requests the queue was created for (rdma-core's `max_send_wr` after creation).
    pub fn capacity(&self) -> u32 {
        self.cap
    }

    /// Accounts this queue's requests against the entries of the CQ it completes on.
    pub(crate) fn attach_cq(&mut self, slots: Arc<CqSlots>) {
        self.cq_share = Some(CqShare::new(slots, self.shadow.clone(), self.seq));
        // No allowance yet: the next post takes the cold path.
        self.room_end = self.seq;
    }

    /// The queue goes away: gives its CQ entries back, those of requests not completed
    /// yet as the poller consumes their completions.
    pub(crate) fn release_cq(&mut self) {
        if let Some(s) = &mut self.cq_share {
            s.release(self.seq);
        }
        self.room_end = self.seq;
    }

    /// Room for one more request in the queue and in its CQ: one compare while the cached
    /// room lasts ([`VerbsSendQueue::room_end`]).
    #[inline(always)]
    pub(super) fn check_room(&mut self) -> Result<()> {
        if self.seq != self.room_end {
            return Ok(());
        }
        self.refill_room()
    }

    /// The cold path of [`VerbsSendQueue::check_room`]: the queue's free requests (from the
    /// position the poller retired) and the CQ allowance (topped up when spent), the new
    /// cached room, or the error that says which of them is full.
    #[cold]
    #[inline(never)]
    fn refill_room(&mut self) -> Result<()> {
        // `free`, from one read of the retired position, which the window bookkeeping
        // widens from (`Shadow::note_retired`).
        let retired = self.shadow.retired();
        self.shadow.note_retired(retired);
        let free = self
            .cap
            .saturating_sub(self.seq.wrapping_sub(retired) as u32);
        if free == 0 {
            return Err(Error::QueueFull {
                needed: 1,
                free: 0,
                unit: QueueUnit::SendRequests,
            });
        }
        // The unsignaled run is bounded by the CQ allowance too (the half queue bounds it
        // otherwise): the cached room stops one request short of the allowance's end, and
        // the allowance's last request is signaled and taken alone, so that a refusal of
        // the next one (CqFull) has a completion on its way that polling consumes. Else
        // every outstanding request could be unsignaled and the queue would wait for ever
        // (UCX's `uct_rc_iface_tx_moderation` signals every `config.tx_moderation`
        // requests, below what `tx.cq_available` holds).
        let room = match &mut self.cq_share {
            Some(s) => {
                let have = s.top_up(self.seq, 2, self.cap + 1);
                if have >= 2 {
                    free.min(have - 1)
                } else if have == 1 {
                    self.unsignaled = self.cap / 2;
                    1
                } else {
                    self.room_end = self.seq;
                    return Err(s.full(self.seq, 1));
                }
            }
            None => free,
        };
        self.room_end = self.seq.wrapping_add(room as u16);
        Ok(())
    }

    /// Copies the non-empty entries of `sgl` into the gather list of `slot`, checking them
    /// in the same pass (the slot is published only by `enqueue`, so an error leaves
    /// nothing behind). Returns the number of entries.
    fn fill_sgl(&mut self, slot: usize, sgl: &[Sge]) -> Result<usize> {
        let base = slot * self.max_sge;
        let mut n = 0;
        for s in sgl.iter().filter(|s| s.len != 0) {
            if s.len > mlx5::wqe::MAX_SGE_BYTES {
                return Err(Error::InvalidParameter {
                    what: "scatter/gather entry length",
                    value: s.len as u64,
                });
            }
            if n == self.max_sge {
                return Err(Error::TooManySge {
                    n: sgl.iter().filter(|s| s.len != 0).count(),
                    max: self.max_sge,
                });
            }
            self.sges[base + n] = ffi::ibv_sge {
                addr: s.addr,
                length: s.len,
                lkey: s.lkey,
            };
            n += 1;
        }
        Ok(n)
    }

    /// Stages the payload `p` of the request in `slot`: a gather list into its entries
    /// (checked, and refused past 2^31 bytes in all as on the direct path), inline bytes
    /// into its staging buffer (`IBV_SEND_INLINE` added to `flags`). Returns the number of
    /// gather entries; nothing is published on an error.
    pub(super) fn stage(&mut self, slot: usize, p: &Payload<'_>, flags: &mut u32) -> Result<usize> {
        match p {
            Payload::Sgl(sgl) => {
                crate::queue::checks::message_len(sgl)?;
                self.fill_sgl(slot, sgl)
            }
            Payload::Inline([]) => Ok(0),
            Payload::Inline(b) => {
                if b.len() > self.max_inline {
                    return Err(Error::InlineTooLong {
                        len: b.len(),
                        max: self.max_inline,
                    });
                }
                let at = slot * self.max_inline;
                self.inline[at..at + b.len()].copy_from_slice(b);
                let addr = self.inline[at..].as_ptr() as u64;
                self.sges[slot * self.max_sge] = ffi::ibv_sge {
                    addr,
                    length: b.len() as u32,
                    lkey: 0,
                };
                *flags |= ffi::ibv_send_flags::IBV_SEND_INLINE.0;
                Ok(1)
            }
        }
    }

    /// Queues one request for the next [`VerbsSendQueue::ring`]; checks everything first.
    ///
    /// # Errors
    /// As the direct path: [`Error::QueueFull`], [`Error::TooManySge`],
    /// [`Error::InlineTooLong`], [`Error::Misaligned`], [`Error::InvalidParameter`] for a
    /// write, send or read of more than 2^31 bytes; [`Error::Unsupported`] for requests
    /// the verbs path does not carry (masked atomics, NOP) and memory-window requests
    /// (bind with [`Qp::bind_mw`](crate::Qp::bind_mw), unbind with
    /// [`Qp::unbind_mw`](crate::Qp::unbind_mw)).
    pub fn push(&mut self, req: &Request<'_>, cookie: u64, flags: PostFlags) -> Result<()> {
        if let Request::LocalInvalidate { .. } | Request::BindMw(_) = req {
            return Err(Error::window_request());
        }
        self.push_any(req, cookie, flags)
    }

    /// Posts the local invalidate that unbinds a type-2 window through this QP: the
    /// crate's entry for [`Qp::unbind_mw`](crate::Qp::unbind_mw), which checked the
    /// window's state and tracks its key.
    ///
    /// # Errors
    /// As [`VerbsSendQueue::push`] and [`VerbsSendQueue::ring`].
    pub(crate) fn post_invalidate(
        &mut self,
        rkey: u32,
        cookie: u64,
        flags: PostFlags,
    ) -> Result<()> {
        self.push_any(&Request::LocalInvalidate { rkey }, cookie, flags)?;
        self.ring()
    }

    /// [`VerbsSendQueue::push`] for any request.
    fn push_any(&mut self, req: &Request<'_>, cookie: u64, flags: PostFlags) -> Result<()> {
        if self.pending == MAX_BATCH {
            return Err(Error::QueueFull {
                needed: 1,
                free: 0,
                unit: QueueUnit::SendRequests,
            });
        }
        self.check_room()?;
        let slot = self.pending;
        use ffi::ibv_wr_opcode as O;
        let mut wr = zeroed_wr();
        let mut send_flags = 0u32;
        let payload = Self::stage;
        let (opcode, wc, byte_len, nsge) = match *req {
            Request::Write { remote, ref data }
            | Request::WriteImm {
                remote, ref data, ..
            } => {
                let n = payload(self, slot, data, &mut send_flags)?;
                wr.wr.rdma = ffi::rdma_t {
                    remote_addr: remote.addr,
                    rkey: remote.rkey,
                };
                let op = if let Request::WriteImm { imm, .. } = *req {
                    wr.imm_data_invalidated_rkey_union.imm_data = imm.to_be();
                    O::IBV_WR_RDMA_WRITE_WITH_IMM
                } else {
                    O::IBV_WR_RDMA_WRITE
                };
                (op, WcOpcode::RdmaWrite, 0, n)
            }
            Request::Read { remote, sgl } => {
                let len = crate::queue::checks::message_len(sgl)?;
                let n = self.fill_sgl(slot, sgl)?;
                wr.wr.rdma = ffi::rdma_t {
                    remote_addr: remote.addr,
                    rkey: remote.rkey,
                };
                (O::IBV_WR_RDMA_READ, WcOpcode::RdmaRead, len, n)
            }
            Request::Send { ref data } => (
                O::IBV_WR_SEND,
                WcOpcode::Send,
                0,
                payload(self, slot, data, &mut send_flags)?,
            ),
            Request::SendImm { ref data, imm } => {
                let n = payload(self, slot, data, &mut send_flags)?;
                wr.imm_data_invalidated_rkey_union.imm_data = imm.to_be();
                (O::IBV_WR_SEND_WITH_IMM, WcOpcode::Send, 0, n)
            }
            Request::SendInv { ref data, rkey } => {
                let n = payload(self, slot, data, &mut send_flags)?;
                wr.imm_data_invalidated_rkey_union.invalidated_rkey = rkey;
                (O::IBV_WR_SEND_WITH_INV, WcOpcode::Send, 0, n)
            }
            Request::CompareSwap { remote, local, .. }
            | Request::FetchAdd { remote, local, .. } => {
                crate::queue::checks::check_atomic(self.atomics.standard, remote.addr, local.len, 8)?;
                let (cs, compare, swap) = match *req {
                    Request::CompareSwap { compare, swap, .. } => (true, compare, swap),
                    Request::FetchAdd { add, .. } => (false, add, 0),
                    _ => unreachable!("matched above"),
                };
                let n = self.fill_sgl(slot, &[local])?;
                wr.wr.atomic = ffi::atomic_t {
                    remote_addr: remote.addr,
                    compare_add: compare,
                    swap: if cs { swap } else { 0 },
                    rkey: remote.rkey,
                };
                if cs {
                    (O::IBV_WR_ATOMIC_CMP_AND_SWP, WcOpcode::CompSwap, 8, n)
                } else {
                    (O::IBV_WR_ATOMIC_FETCH_AND_ADD, WcOpcode::FetchAdd, 8, n)
                }
            }
            Request::LocalInvalidate { rkey } => {
                wr.imm_data_invalidated_rkey_union.invalidated_rkey = rkey;
                (O::IBV_WR_LOCAL_INV, WcOpcode::LocalInv, 0, 0)
            }
            _ => {
                return Err(Error::Unsupported(
                    "this request on the verbs path (masked atomics, NOP; bind windows with Qp::bind_mw)",
                ))
            }
        };
        self.enqueue(wr, opcode, (wc, byte_len), nsge, send_flags, cookie, flags);
        Ok(())
    }

    /// Posts one request now ([`crate::Qp::post`]). A small inline RDMA write or send, or a
    /// read into one buffer, with nothing queued, no fence and no fence pending, goes to
    /// rdma-core directly (`post_single`): the same checks, moderation,
    /// flags and shadow entry as [`VerbsSendQueue::push`] + [`VerbsSendQueue::ring`],
    /// without building a queued work request or staging the inline bytes (rdma-core copies
    /// them during the call). Any other request takes push + ring.
    ///
    /// # Errors
    /// As [`VerbsSendQueue::push`] and [`VerbsSendQueue::ring`]; on an error nothing is
    /// posted.
    #[inline(always)]
    pub fn post_one(&mut self, req: &Request<'_>, cookie: u64, flags: PostFlags) -> Result<()> {
        if self.pending == 0 && !self.fence_next && flags.fence == Fence::None {
            if let Some(one) = Single::of(req, self.max_inline) {
                return self.post_single(&one, cookie, flags);
            }
        }
        self.push_and_ring(req, cookie, flags)
    }

    /// An inline RDMA write ([`crate::Qp::write_inline`] on the verbs path): what
    /// [`VerbsSendQueue::post_one`] does with it, in a function of its own (the request's
    /// kind is known here: none is built or matched unless it has to be queued).
    ///
    /// # Errors
    /// As [`VerbsSendQueue::post_one`].
    #[inline(always)]
    pub fn write_inline(
        &mut self,
        data: &[u8],
        remote: crate::Remote,
        cookie: u64,
        flags: PostFlags,
    ) -> Result<()> {
        if self.pending == 0
            && !self.fence_next
            && flags.fence == Fence::None
            && !data.is_empty()
            && data.len() <= self.max_inline
        {
            let one = Single {
                opcode: ffi::ibv_wr_opcode::IBV_WR_RDMA_WRITE,
                wc: WcOpcode::RdmaWrite,
                byte_len: 0,
                remote,
                buf: ffi::ibv_sge {
                    addr: data.as_ptr() as u64,
                    length: data.len() as u32,
                    lkey: 0,
                },
                inline_flag: ffi::ibv_send_flags::IBV_SEND_INLINE.0,
            };
            return self.post_single(&one, cookie, flags);
        }
        let req = Request::Write {
            remote,
            data: Payload::Inline(data),
        };
        self.push_and_ring(&req, cookie, flags)
    }

    /// [`VerbsSendQueue::push`] then [`VerbsSendQueue::ring`], out of line (the requests
    /// [`VerbsSendQueue::post_single`] does not take).
    #[inline(never)]
    fn push_and_ring(&mut self, req: &Request<'_>, cookie: u64, flags: PostFlags) -> Result<()> {
        self.push(req, cookie, flags)?;
        self.ring()
    }

    /// Posts `one` with nothing queued, no fence and none pending (see
    /// [`VerbsSendQueue::post_one`]): the room check (one compare while the cached room
    /// lasts), moderation, the shadow entry, rdma-core's calls; the queue's state changes
    /// only once rdma-core took the request.
    #[inline(always)]
    fn post_single(&mut self, one: &Single, cookie: u64, flags: PostFlags) -> Result<()> {
        self.check_room()?;
        // Completion moderation and flags, as `enqueue`.
        let unsignaled = self.unsignaled;
        let signal = flags.signaled || unsignaled >= self.cap / 2;
        let mut send_flags = one.inline_flag;
        if signal {
            send_flags |= ffi::ibv_send_flags::IBV_SEND_SIGNALED.0;
        }
        if flags.solicited {
            send_flags |= ffi::ibv_send_flags::IBV_SEND_SOLICITED.0;
        }
        let seq = self.seq;
        self.shadow.set(
            seq,
            SendEntry {
                cookie,
                bbs: 1,
                opcode: one.wc,
                byte_len: one.byte_len,
                report: flags.signaled,
            },
        );
        // The queue's state moves before the calls (fewer values live across them) and
        // back if rdma-core refuses the request ([`VerbsSendQueue::post_refused`]).
        self.unsignaled = if signal { 0 } else { unsignaled + 1 };
        self.seq = seq.wrapping_add(1);
        self.shadow.mark_posted(self.seq);
        let rc = match &self.send_ops {
            // SAFETY: live QP (`self.qp` holds it); `one.buf` names the caller's inline
            // bytes (copied by the call) or a buffer of a registered region; `&mut self`
            // serialises posting.
            Some(ops) => unsafe {
                ops.post_one(
                    seq as u64,
                    send_flags,
                    one.opcode,
                    one.remote.rkey,
                    one.remote.addr,
                    &one.buf,
                    one.inline_flag != 0,
                )
            },
            None => self.post_single_legacy(one, seq, send_flags),
        };
        if rc != 0 {
            return Err(self.post_refused(rc, seq, unsignaled));
        }
        Ok(())
    }

    /// [`VerbsSendQueue::post_single`] with `ibv_post_send`.
    #[inline(always)]
    fn post_single_legacy(&mut self, one: &Single, seq: u16, send_flags: u32) -> i32 {
        let mut buf = one.buf;
        // Nothing is queued: the first work request is free. The fields the opcode reads
        // are set; the others are not read for it.
        let w = &mut self.wrs[0];
        w.wr_id = seq as u64;
        w.next = std::ptr::null_mut();
        w.sg_list = &mut buf;
        w.num_sge = 1;
        w.opcode = one.opcode;
        w.send_flags = send_flags;
        w.wr.rdma = ffi::rdma_t {
            remote_addr: one.remote.addr,
            rkey: one.remote.rkey,
        };
        let mut bad = std::ptr::null_mut();
        // SAFETY: live QP; the request and its one gather entry (on this stack) live across
        // the call, which copies them (and the inline bytes).
        unsafe { ffi::ibv_post_send(self.qp.qp, w, &mut bad) }
    }

    /// A single request rdma-core refused with `rc`: the queue's position and moderation go
    /// back to what they were before it (`seq`, `unsignaled`; nothing was posted), and the
    /// error names the API it was posted with.
    #[cold]
    #[inline(never)]
    fn post_refused(&mut self, rc: i32, seq: u16, unsignaled: u32) -> Error {
        self.seq = seq;
        self.unsignaled = unsignaled;
        self.shadow.mark_posted(seq);
        let call = if self.send_ops.is_some() {
            "ibv_wr_complete"
        } else {
            "ibv_post_send"
        };
        Error::Verbs(code(call, rc))
    }

    /// Adds a built work request to the pending list with moderation, flags and its shadow
    /// entry.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn enqueue(
        &mut self,
        wr: ffi::ibv_send_wr,
        opcode: ffi::ibv_wr_opcode::Type,
        (wc, byte_len): (WcOpcode, u32),
        nsge: usize,
        mut send_flags: u32,
        cookie: u64,
        flags: PostFlags,
    ) {
        let slot = self.pending;
        self.moderation[slot] = (self.unsignaled, self.fence_next);
        // Completion moderation, as on the direct path.
        let mut report = flags.signaled;
        let signal = flags.signaled || self.unsignaled + 1 > self.cap / 2;
        if signal {
            self.unsignaled = 0;
            send_flags |= ffi::ibv_send_flags::IBV_SEND_SIGNALED.0;
        } else {
            self.unsignaled += 1;
            report = false;
        }
        if flags.solicited {
            send_flags |= ffi::ibv_send_flags::IBV_SEND_SOLICITED.0;
        }
        let fence_after_bind = std::mem::replace(
            &mut self.fence_next,
            matches!(
                opcode,
                ffi::ibv_wr_opcode::IBV_WR_BIND_MW | ffi::ibv_wr_opcode::IBV_WR_LOCAL_INV
            ),
        );
        if flags.fence != Fence::None || fence_after_bind {
            send_flags |= ffi::ibv_send_flags::IBV_SEND_FENCE.0;
        }
        // Field by field into the slot: the unions a request does not use (XRC; bind and
        // TSO but for a bind) are not read for its opcode.
        let sg_list = self.sges[slot * self.max_sge..].as_mut_ptr();
        let w = &mut self.wrs[slot];
        w.wr_id = self.seq as u64;
        w.next = std::ptr::null_mut();
        w.sg_list = sg_list;
        w.num_sge = nsge as i32;
        w.opcode = opcode;
        w.send_flags = send_flags;
        w.imm_data_invalidated_rkey_union = wr.imm_data_invalidated_rkey_union;
        w.wr = wr.wr;
        if opcode == ffi::ibv_wr_opcode::IBV_WR_BIND_MW {
            w.bind_mw_tso_union = wr.bind_mw_tso_union;
        }
        if slot > 0 {
            let next: *mut ffi::ibv_send_wr = &mut self.wrs[slot];
            self.wrs[slot - 1].next = next;
        }
        let end = self.seq.wrapping_add(1);
        self.shadow.set(
            self.seq,
            SendEntry {
                cookie,
                bbs: 1,
                opcode: wc,
                byte_len,
                report,
            },
        );
        self.shadow.mark_posted(end);
        self.seq = end;
        self.pending += 1;
    }

    /// Queues a type-2 memory-window bind (`IBV_WR_BIND_MW`) of `mw` to `addr .. addr + len`
    /// of `mr` with new rkey `new_rkey` and `access` (`IBV_ACCESS_*` values).
    ///
    /// # Safety
    /// `mw` and `mr` must be live objects of this QP's protection domain until the request
    /// completes.
    ///
    /// # Errors
    /// [`Error::QueueFull`].
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn push_bind(
        &mut self,
        mw: *mut ffi::ibv_mw,
        mr: *mut ffi::ibv_mr,
        new_rkey: u32,
        addr: u64,
        len: u64,
        access: u32,
        cookie: u64,
        flags: PostFlags,
    ) -> Result<()> {
        if self.pending == MAX_BATCH {
            return Err(Error::QueueFull {
                needed: 1,
                free: 0,
                unit: QueueUnit::SendRequests,
            });
        }
        self.check_room()?;
        let mut wr = zeroed_wr();
        wr.bind_mw_tso_union.bind_mw = ffi::bind_mw_t {
            mw,
            rkey: new_rkey,
            bind_info: ffi::ibv_mw_bind_info {
                mr,
                addr,
                length: len,
                mw_access_flags: access,
            },
        };
        self.enqueue(
            wr,
            ffi::ibv_wr_opcode::IBV_WR_BIND_MW,
            (WcOpcode::BindMw, 0),
            0,
            0,
            cookie,
            flags,
        );
        Ok(())
    }

    /// Binds a type-1 window with `ibv_bind_mw` (which posts its own work request); returns
    /// the window's new rkey. Anything queued is posted first.
    ///
    /// # Safety
    /// As [`VerbsSendQueue::push_bind`].
    ///
    /// # Errors
    /// [`Error::QueueFull`]; the `ibv_bind_mw` error.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn bind_type1(
        &mut self,
        mw: *mut ffi::ibv_mw,
        mr: *mut ffi::ibv_mr,
        addr: u64,
        len: u64,
        access: u32,
        cookie: u64,
        flags: PostFlags,
    ) -> Result<u32> {
        self.ring()?;
        self.check_room()?;
        let signal = flags.signaled || self.unsignaled + 1 > self.cap / 2;
        let mut send_flags = 0;
        // Taken only once the bind is posted (a refused one changes nothing).
        let unsignaled = if signal {
            send_flags |= ffi::ibv_send_flags::IBV_SEND_SIGNALED.0;
            0
        } else {
            self.unsignaled + 1
        };
        let mut bind = ffi::ibv_mw_bind {
            wr_id: self.seq as u64,
            send_flags,
            bind_info: ffi::ibv_mw_bind_info {
                mr,
                addr,
                length: len,
                mw_access_flags: access,
            },
        };
        let end = self.seq.wrapping_add(1);
        let entry = SendEntry {
            cookie,
            bbs: 1,
            opcode: WcOpcode::BindMw,
            byte_len: 0,
            report: flags.signaled,
        };
        self.shadow.set(self.seq, entry);
        // SAFETY: the caller guarantees live objects; `bind` lives across the call.
        let rc = unsafe { ffi::ibv_bind_mw(self.qp.qp, mw, &mut bind) };
        if rc != 0 {
            return Err(Error::Verbs(code("ibv_bind_mw", rc)));
        }
        self.unsignaled = unsignaled;
        self.seq = end;
        self.shadow.mark_posted(end);
        self.fence_next = true;
        // SAFETY: `mw` is live; the provider stored the new rkey in it.
        Ok(unsafe { (*mw).rkey })
    }

    /// Posts the queued requests: with one `ibv_wr_start` ... `ibv_wr_complete` on a QP
    /// created with the extended send operations, else with one `ibv_post_send`.
    ///
    /// # Errors
    /// The `ibv_wr_complete` error (none of the requests is posted) or the `ibv_post_send`
    /// error (the requests from the refused one on are not posted); their space is given
    /// back.
    pub fn ring(&mut self) -> Result<()> {
        if self.pending == 0 {
            return Ok(());
        }
        let n = self.pending;
        self.pending = 0;
        let ex = match &self.send_ops {
            Some(_) if self.gather_lists_legacy && self.wrs[..n].iter().any(|w| w.num_sge > 1) => {
                None
            }
            ops => ops.as_ref(),
        };
        let ud = match &self.qp.ud_ops {
            Some(_) if self.gather_lists_legacy && self.wrs[..n].iter().any(|w| w.num_sge > 1) => {
                None
            }
            ops => ops.as_ref(),
        };
        let (rc, first_bad, call) = match (ex, ud) {
            (_, Some(ops)) => {
                // SAFETY: as below; the address handles the sends name are live (the UD
                // queue's `push` contract).
                let rc = unsafe { ops.post(&self.wrs[..n]) };
                (rc, 0, "ibv_wr_complete")
            }
            (Some(ops), None) => {
                // SAFETY: the QP is live; the gather lists and inline staging the requests
                // name are in this queue's buffers and stay untouched during the call
                // (inline data is copied by it); `&mut self` serialises posting.
                let rc = unsafe { ops.post(&self.wrs[..n]) };
                (rc, 0, "ibv_wr_complete")
            }
            (None, None) => {
                self.wrs[n - 1].next = std::ptr::null_mut();
                let mut bad: *mut ffi::ibv_send_wr = std::ptr::null_mut();
                // SAFETY: as above; the list links only entries of `wrs`.
                let rc = unsafe { ffi::ibv_post_send(self.qp.qp, self.wrs.as_mut_ptr(), &mut bad) };
                let first_bad = if bad.is_null() {
                    0
                } else {
                    (bad as usize - self.wrs.as_ptr() as usize)
                        / std::mem::size_of::<ffi::ibv_send_wr>()
                };
                (rc, first_bad, "ibv_post_send")
            }
        };
        if rc != 0 {
            self.seq = self.seq.wrapping_sub((n - first_bad) as u16);
            self.shadow.mark_posted(self.seq);
            (self.unsignaled, self.fence_next) = self.moderation[first_bad];
            // The cached room was computed for the refused requests' positions.
            self.room_end = self.seq;
            return Err(Error::Verbs(code(call, rc)));
        }
        Ok(())
    }

    /// The rdma-core API this queue posts with.
    pub fn api(&self) -> VerbsApi {
        self.qp.api()
    }

    /// The sequence number the next request gets (the last one's plus one).
    pub(crate) fn position(&self) -> u16 {
        self.seq
    }

    /// Drops the queued requests (a batch that was not rung).
    pub fn rewind(&mut self) {
        if self.pending > 0 {
            (self.unsignaled, self.fence_next) = self.moderation[0];
        }
        self.seq = self.seq.wrapping_sub(self.pending as u16);
        // The cached room was computed for the dropped requests' positions.
        self.room_end = self.seq;
        self.pending = 0;
        self.shadow.mark_posted(self.seq);
    }

    /// Requests queued and not yet rung.
    pub fn pending(&self) -> usize {
        self.pending
    }
}

/// A request [`VerbsSendQueue::post_single`] posts without a queued work request: an
/// inline RDMA write or send of 1 to `max_inline` bytes, or an RDMA read into one buffer.
struct Single {
    opcode: ffi::ibv_wr_opcode::Type,
    wc: WcOpcode,
    /// Bytes a successful completion reports (a read's length).
    byte_len: u32,
    remote: crate::Remote,
    /// The inline bytes (lkey 0) or the read's buffer.
    buf: ffi::ibv_sge,
    /// `IBV_SEND_INLINE` or 0.
    inline_flag: u32,
}

impl Single {
    /// `req` as a [`Single`], when it is one.
    #[inline(always)]
    fn of(req: &Request<'_>, max_inline: usize) -> Option<Single> {
        use ffi::ibv_wr_opcode as O;
        let inline = |opcode, wc, remote, b: &[u8]| {
            (!b.is_empty() && b.len() <= max_inline).then_some(Single {
                opcode,
                wc,
                byte_len: 0,
                remote,
                buf: ffi::ibv_sge {
                    addr: b.as_ptr() as u64,
                    length: b.len() as u32,
                    lkey: 0,
                },
                inline_flag: ffi::ibv_send_flags::IBV_SEND_INLINE.0,
            })
        };
        match *req {
            Request::Write {
                remote,
                data: Payload::Inline(b),
            } => inline(O::IBV_WR_RDMA_WRITE, WcOpcode::RdmaWrite, remote, b),
            Request::Send {
                data: Payload::Inline(b),
            } => {
                let none = crate::Remote { addr: 0, rkey: 0 };
                inline(O::IBV_WR_SEND, WcOpcode::Send, none, b)
            }
            Request::Read { remote, sgl: [s] }
                if s.len != 0 && s.len <= mlx5::wqe::MAX_SGE_BYTES =>
            {
                Some(Single {
                    opcode: O::IBV_WR_RDMA_READ,
                    wc: WcOpcode::RdmaRead,
                    byte_len: s.len,
                    remote,
                    buf: ffi::ibv_sge {
                        addr: s.addr,
                        length: s.len,
                        lkey: s.lkey,
                    },
                    inline_flag: 0,
                })
            }
            _ => None,
        }
    }
}

/// Requests queued on a verbs send queue and posted together; rewound when dropped unrung.
#[must_use = "a batch posts nothing until rung"]
pub struct VerbsBatch<'a> {
    q: &'a mut VerbsSendQueue,
    rung: bool,
}

impl<'a> VerbsBatch<'a> {
    /// A batch on `q` (anything queued before is posted first).
    ///
    /// # Errors
    /// The `ibv_post_send` error of what was queued before.
    pub fn new(q: &'a mut VerbsSendQueue) -> VerbsBatch<'a> {
        VerbsBatch { q, rung: false }
    }
    /// Queues one request.
    ///
    /// # Errors
    /// As [`VerbsSendQueue::push`].
    pub fn push(&mut self, req: &Request<'_>, cookie: u64, flags: PostFlags) -> Result<()> {
        self.q.push(req, cookie, flags)
    }
    /// Requests queued.
    pub fn len(&self) -> usize {
        self.q.pending
    }
    /// Whether nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.q.pending == 0
    }
    /// Posts the batch.
    ///
    /// # Errors
    /// As [`VerbsSendQueue::ring`].
    pub fn ring(mut self) -> Result<()> {
        self.rung = true;
        self.q.ring()
    }
}

impl Drop for VerbsBatch<'_> {
    fn drop(&mut self) {
        if !self.rung {
            self.q.rewind();
        }
    }
}

/// The receive side of a QP on the verbs path.
pub struct VerbsRecvQueue {
    /// The QP, kept alive while `post_recv` points to it.
    _qp: Arc<Qp>,
    /// `ibv_post_recv` on `qp` (its pointer and provider operation, read at creation).
    post_recv: PostRecv,
    cap: u32,
    /// As [`VerbsSendQueue::room_end`], for receives.
    room_end: u16,
    pub(crate) shadow: Arc<Shadow<u64>>,
    seq: u16,
    /// The scatter list (its length: the QP's most entries per receive).
    sges: Box<[ffi::ibv_sge]>,
    /// The receive request, prepared once: `sg_list` points into `sges`, `next` is null.
    wr: Box<ffi::ibv_recv_wr>,
    /// [`RECV_TAG`], with [`UD_TAG`] on a UD QP.
    tag: u64,
    /// The CQ entries this queue holds (None: not accounted).
    cq_share: Option<CqShare>,
    /// The scatter list of every posted receive: the regions each pins until its
    /// completion is polled (the QP holds it too, until it is destroyed).
    pub(crate) scatter: Arc<ScatterTable>,
    /// The protection domain's regions, the receives' entries are pinned in (None: not
    /// checked, the caller vouches for them).
    regions: Option<Box<RegionCheck>>,
    /// The provider copies small received messages into the buffers with the CPU
    /// (rdma-core's mlx5 scatter-to-CQE, `mlx5_copy_to_recv_wqe`, which checks no key):
    /// a receive with an entry the CPU may not write is refused.
    provider_copies: bool,
}

// SAFETY: as for VerbsSendQueue (`wr` points into this queue's own `sges`; `post_recv`
// holds the pointer of the QP in `qp`, thread-safe in rdma-core).
unsafe impl Send for VerbsRecvQueue {}

impl std::fmt::Debug for VerbsRecvQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsRecvQueue")
            .field("seq", &self.seq)
            .finish()
    }
}

/// A receive request prepared once for lists of up to `max_sge` entries: its scatter list
/// (`sg_list` points into it; the boxed slice does not move when the box does), `next`
/// null. Receive queues and SRQs vary only `wr_id` and `num_sge`.
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
/// # Errors
/// [`Error::TooManySge`] with the non-empty entries and `sges.len()`.
#[inline]
pub(crate) fn fill_recv_sges(sges: &mut [ffi::ibv_sge], sgl: &[Sge]) -> Result<usize> {
    let mut n = 0;
    for s in sgl {
        if s.len == 0 {
            continue;
        }
        if n == sges.len() {
            return Err(Error::TooManySge {
                n: sgl.iter().filter(|s| s.len != 0).count(),
                max: sges.len(),
            });
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

impl VerbsRecvQueue {
    /// The receive queue of `qp`.
    pub fn new(qp: Arc<Qp>) -> VerbsRecvQueue {
        let caps = qp.caps;
        let max_sge = caps.max_recv_sge.max(1) as usize;
        let (sges, wr) = prepared_recv(max_sge);
        let cnt = caps.max_recv_wr.max(16).next_power_of_two();
        let scatter = Arc::new(ScatterTable::new(cnt, max_sge));
        // Kept by the QP until it is destroyed (a QP has one receive queue).
        let _ = qp.recv_targets.set(scatter.clone());
        VerbsRecvQueue {
            // SAFETY: `qp` is live while this queue holds it (`qp` below), and the call is
            // made only through this queue.
            post_recv: unsafe { PostRecv::of(qp.qp) },
            cap: caps.max_recv_wr,
            room_end: 0,
            shadow: Arc::new(Shadow::new(cnt)),
            seq: 0,
            sges,
            wr,
            tag: RECV_TAG,
            cq_share: None,
            scatter,
            regions: None,
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
        let mut q = VerbsRecvQueue::new(qp);
        q.tag = RECV_TAG | UD_TAG;
        q
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

    /// The queue goes away: gives its CQ entries back, those of receives not completed yet
    /// as the poller consumes their completions.
    pub(crate) fn release_cq(&mut self) {
        if let Some(s) = &mut self.cq_share {
            s.release(self.seq);
        }
        self.room_end = self.seq;
    }

    /// The cold path of the room check of [`VerbsRecvQueue::post`] (as
    /// [`VerbsSendQueue::check_room`]'s).
    #[cold]
    #[inline(never)]
    fn refill_room(&mut self) -> Result<()> {
        let free = self.free();
        if free == 0 {
            return Err(Error::QueueFull {
                needed: 1,
                free: 0,
                unit: QueueUnit::Receives,
            });
        }
        let room = match &mut self.cq_share {
            Some(s) => {
                s.check_one(self.seq, self.cap)?;
                free.min(s.allowance(self.seq))
            }
            None => free,
        };
        self.room_end = self.seq.wrapping_add(room as u16);
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
    /// [`Error::InvalidParameter`] with the lkey of an entry outside every CPU-writable
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
        match self.submit(n, cookie) {
            0 => Ok(()),
            rc => Err(self.unpost(rc)),
        }
    }

    /// Records the receive about to be posted at `seq` in the scatter table, pinning its
    /// regions; refuses it (nothing kept) when the provider would copy into memory the CPU
    /// may not write.
    #[inline]
    fn land(&mut self, sgl: &[Sge]) -> Result<()> {
        match self
            .scatter
            .record(self.seq, sgl, self.regions.as_deref_mut())
        {
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

    /// The usual receive, one non-empty buffer `s` while the cached room lasts, posted
    /// straight: `Some(0)` posted, `Some(rc)` refused by `ibv_post_recv` (then
    /// [`VerbsRecvQueue::unpost`] must follow), None when it is not that case (nothing
    /// done: [`VerbsRecvQueue::post`] takes it, with every check).
    #[inline(always)]
    pub(crate) fn post_one(&mut self, s: &Sge, cookie: u64) -> Option<i32> {
        if self.seq == self.room_end || s.len == 0 {
            return None;
        }
        *self.sges.first_mut()? = ffi::ibv_sge {
            addr: s.addr,
            length: s.len,
            lkey: s.lkey,
        };
        if self
            .scatter
            .record(
                self.seq,
                core::slice::from_ref(s),
                self.regions.as_deref_mut(),
            )
            .is_some()
            && self.provider_copies
        {
            // Refused by the general path (which records it again).
            self.scatter.done(self.seq);
            return None;
        }
        Some(self.submit(1, cookie))
    }

    /// Posts the prepared request with its first `n` scatter entries as the receive at
    /// `seq`, of `cookie`: 0, or `ibv_post_recv`'s error (then [`VerbsRecvQueue::unpost`]
    /// must follow).
    ///
    /// The queue moves first and is put back on a refusal, so that nothing but the call's
    /// result is live across it (no registers to save for the rest). A `posted` mark one
    /// ahead for the length of the call only delays a deferred deregistration's check
    /// (`Shadow::done_up_to`); no completion of `seq` can come before it is posted.
    #[inline(always)]
    fn submit(&mut self, n: usize, cookie: u64) -> i32 {
        let seq = self.seq;
        // The prepared request (its list points into `sges`); only these two fields vary.
        let wr = &mut *self.wr;
        wr.wr_id = seq as u64 | self.tag;
        wr.num_sge = n as i32;
        self.shadow.set(seq, cookie);
        let next = seq.wrapping_add(1);
        self.seq = next;
        self.shadow.mark_posted(next);
        // SAFETY: the QP is live (held by this queue); `wr` and its scatter list (in this
        // queue's boxes) live across the call, which copies them.
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

/// A CQ poller on the verbs path.
pub struct VerbsCompletionQueue {
    cq: Arc<super::objects::Cq>,
    /// `ibv_poll_cq` on `cq` (its pointer and provider operation, read at creation).
    poll_cq: PollCq,
    /// The CQ's extended polling operations (a copy of `cq.poll_ops`, read where the
    /// poller's other fields are).
    ops: Option<PollOps>,
    pub(crate) registry: Arc<Registry>,
    /// `registry.slots` (one load less per poll for the orphan mark).
    slots: Arc<CqSlots>,
    cache: Vec<Attached>,
    gen: u32,
    wcs: Box<[ffi::ibv_wc]>,
}

// SAFETY: polling is serialised by `&mut self`; the CQ is thread-safe in rdma-core.
unsafe impl Send for VerbsCompletionQueue {}

impl std::fmt::Debug for VerbsCompletionQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsCompletionQueue").finish()
    }
}

impl VerbsCompletionQueue {
    /// A poller of `cq`.
    pub fn new(cq: Arc<super::objects::Cq>) -> VerbsCompletionQueue {
        let capacity = cq.capacity();
        let registry = Arc::new(Registry::new(0, capacity, None));
        VerbsCompletionQueue {
            ops: cq.poll_ops,
            // SAFETY: `cq` is live while this poller holds it (`cq` below), and polled only
            // through this poller.
            poll_cq: unsafe { PollCq::of(cq.cq) },
            cq,
            slots: registry.slots.clone(),
            registry,
            cache: Vec::new(),
            gen: u32::MAX,
            // SAFETY: an all-zero ibv_wc is valid.
            wcs: (0..32).map(|_| unsafe { std::mem::zeroed() }).collect(),
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
    #[inline(always)]
    pub fn poll(&mut self, out: &mut [Completion]) -> usize {
        if let [first] = out {
            if self.registry.gen.load(Ordering::Acquire) == self.gen {
                if let Some(n) = match &self.ops {
                    Some(ops) => self.poll_one_ex(ops, first),
                    None => self.poll_one_legacy(first),
                } {
                    return n;
                }
            }
        }
        self.poll_general(out)
    }

    /// [`VerbsCompletionQueue::poll`] of one completion with `ibv_start_poll` /
    /// `ibv_end_poll`: 0 when the CQ is empty, 1 when `c` holds a completion, None after a
    /// completion that reports nothing (a moderation completion: the caller polls on).
    #[inline(always)]
    fn poll_one_ex(&self, ops: &PollOps, c: &mut Completion) -> Option<usize> {
        // Entries of dropped QPs: free again once the CQ is seen empty after this read.
        let orphans = self.slots.orphan_mark();
        // SAFETY: live CQ, polled only through this poller (`&mut self`).
        if !unsafe { ops.start() } {
            if orphans != 0 {
                self.slots.drained(orphans);
            }
            return Some(0);
        }
        // SAFETY: a completion is current until `end`.
        let keep = self.complete(&unsafe { ops.current() }, c);
        // SAFETY: start succeeded; ended once.
        unsafe { ops.end() };
        keep.then_some(1)
    }

    /// [`VerbsCompletionQueue::poll_one_ex`] with `ibv_poll_cq` of one entry.
    #[inline(always)]
    fn poll_one_legacy(&mut self, c: &mut Completion) -> Option<usize> {
        let orphans = self.slots.orphan_mark();
        let wc = &mut self.wcs[0];
        // SAFETY: live CQ, polled only through this poller; room for one entry.
        let got = unsafe { self.poll_cq.call(1, wc as *mut ffi::ibv_wc) };
        if got <= 0 {
            if orphans != 0 {
                self.slots.drained(orphans);
            }
            return Some(0);
        }
        self.complete(&self.wcs[0], c).then_some(1)
    }

    /// [`VerbsCompletionQueue::poll`]: the queues' list refreshed when it changed, then up
    /// to `out.len()` completions. Inlined: out of line, its call and second prologue cost a
    /// receive poll into an `out` of two 20 instructions (callgrind in the rxe VM).
    #[inline(always)]
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
        if got < want as i32 && orphans != 0 {
            self.slots.drained(orphans);
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
        if !unsafe { ops.start() } {
            if orphans != 0 {
                self.slots.drained(orphans);
            }
            return 0;
        }
        // SAFETY: a completion is current until `end`.
        let keep = self.complete(&unsafe { ops.current() }, first);
        // SAFETY: start succeeded; ended once.
        unsafe { ops.end() };
        if keep {
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
            if !unsafe { ops.start() } {
                if orphans != 0 {
                    self.slots.drained(orphans);
                }
                break;
            }
            // SAFETY: as in `poll_ex`.
            let keep = self.complete(&unsafe { ops.current() }, &mut out[n]);
            // SAFETY: as in `poll_ex`.
            unsafe { ops.end() };
            n += keep as usize;
        }
        n
    }

    #[cold]
    fn refresh(&mut self) {
        if let Some((list, gen)) = self.registry.snapshot_if_changed(self.gen) {
            (self.cache, self.gen) = (list, gen);
        }
    }

    /// Writes the completion of one work completion `wc` into `c`, attributed by its
    /// `wr_id` (a receive carries [`RECV_TAG`]) and QP number; false (`c` holds nothing to
    /// report) for a moderation completion, which only retires the unsignaled requests
    /// before it, or one of a QP no longer attached. Successes take this straight path,
    /// errors [`complete_error`].
    #[inline(always)]
    fn complete(&self, wc: &impl WcRead, c: &mut Completion) -> bool {
        let qp_num = wc.qp_num();
        let Some(q) = self.cache.iter().find(|a| a.qpn == qp_num) else {
            return false;
        };
        let status = wc.status();
        let wr_id = wc.wr_id();
        let seq = wr_id as u16;
        if status != ffi::ibv_wc_status::IBV_WC_SUCCESS {
            let vendor_err = wc.vendor_err();
            return complete_error(q, wr_id, status, vendor_err, c);
        }
        if wr_id & RECV_TAG != 0 {
            return complete_recv(q, wc, wr_id, qp_num, c);
        }
        let Some(sq) = q.sq.as_ref() else {
            return false;
        };
        let e = sq.get(seq);
        sq.retire(seq.wrapping_add(e.bbs));
        if !e.report {
            return false;
        }
        *c = Completion {
            cookie: e.cookie,
            status: WcStatus::Success,
            opcode: e.opcode,
            byte_len: e.byte_len,
            qpn: qp_num,
            ..Completion::default()
        };
        true
    }
}

/// Writes the completion of the successful receive `wc` (its `wr_id` carries
/// [`RECV_TAG`]) of attached queue `q` (QP `qp_num`) into `c`, and retires the receive;
/// false when `q` has no receive queue or SRQ.
///
/// The opcode is read only for a receive that carries an immediate: a receive consumed
/// by an RDMA write with immediate always carries one (`IBV_WC_WITH_IMM`; the IB
/// specification's RDMA Write with Immediate delivers its immediate in the receive's
/// completion), so without the flag the receive is a send's (`IBV_WC_RECV`). On the
/// extended API each field is a call into the provider (`ibv_wc_read_opcode`): the usual
/// receive makes one call less.
#[inline(always)]
fn complete_recv(
    q: &Attached,
    wc: &impl WcRead,
    wr_id: u64,
    qp_num: u32,
    c: &mut Completion,
) -> bool {
    let Some(cookie) = take_recv(q, wr_id as u16) else {
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
    } else if flags & ffi::ibv_wc_flags::IBV_WC_WITH_INV.0 != 0 {
        (WcOpcode::Recv, Some(wc.imm_or_rkey()))
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

/// The completion of a work completion in error (status `status`, `vendor_err`) of
/// attached queue `q`, written into `c`: the request `wr_id` names is retired (a send's
/// first error is noted) and always reported, its opcode from the shadow entry (a receive:
/// `Recv`), as on an error the work completion's opcode, byte count and flags are
/// undefined. False when `q` has no queue of that kind.
#[cold]
#[inline(never)]
fn complete_error(
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
        let Some(cookie) = take_recv(q, seq) else {
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
        sq.retire(seq.wrapping_add(e.bbs));
        out.cookie = e.cookie;
        out.opcode = e.opcode;
    }
    *c = out;
    true
}

/// The cookie of the receive `seq` names on attached queue `q`, which is retired: its own
/// receive queue's entry, or, for a QP with an SRQ (`seq` is the SRQ's slot), the SRQ's,
/// whose slot is given back. None when `q` has neither.
#[inline(always)]
fn take_recv(q: &Attached, seq: u16) -> Option<u64> {
    match (&q.rq, &q.srq) {
        (Some(rq), _) => {
            let cookie = rq.get(seq);
            // rdma-core has copied whatever it copies: the regions go back first.
            if let Some(t) = &q.scatter {
                t.done(seq);
            }
            rq.retire(seq.wrapping_add(1));
            Some(cookie)
        }
        (None, Some(srq)) => {
            let slot = srq.slot(seq);
            let cookie = srq.cookies.get(slot);
            srq.free(slot);
            Some(cookie)
        }
        (None, None) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Remote;
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
        let rq = Arc::new(Shadow::<u64>::new(16));
        rq.set(3, 99);
        let q = Attached {
            qpn: 5,
            sq: None,
            rq: Some(rq.clone()),
            scatter: None,
            srq: None,
        };
        let mut c = Completion::default();
        assert!(complete_recv(&q, wc, RECV_TAG | 3, 5, &mut c));
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
        // A send with invalidate: the rkey, no opcode read.
        let inv = wc(F::IBV_WC_WITH_INV.0, O::IBV_WC_RECV, 0x1234);
        let c = receive(&inv);
        assert_eq!((c.opcode, c.imm), (WcOpcode::Recv, Some(0x1234)));
        assert_eq!(inv.opcode_reads.get(), 0);
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
        };
        let wc = FakeWc {
            flags: ffi::ibv_wc_flags::IBV_WC_GRH.0,
            opcode: ffi::ibv_wc_opcode::IBV_WC_RECV,
            imm: 0,
            opcode_reads: Cell::new(0),
        };
        let mut c = Completion::default();
        assert!(complete_recv(&q, &wc, RECV_TAG | UD_TAG, 5, &mut c));
        assert_eq!((c.src_qp, c.grh, c.cookie), (77, true, 1));
        let none = Attached {
            qpn: 6,
            sq: None,
            rq: None,
            scatter: None,
            srq: None,
        };
        assert!(!complete_recv(&none, &wc, RECV_TAG, 6, &mut c));
    }

    /// The requests `post_one` posts without a queued work request: an inline write or send
    /// of 1 to `max_inline` bytes, a read into one non-empty buffer; nothing else (those take
    /// push + ring, whose checks refuse what must be refused).
    #[test]
    fn single_requests_are_small_inline_writes_and_sends_and_one_buffer_reads() {
        let remote = Remote { addr: 64, rkey: 7 };
        let bytes = [1u8; 16];
        let write = |n: usize| Request::Write {
            remote,
            data: Payload::Inline(&bytes[..n]),
        };
        let w = Single::of(&write(8), 8).expect("an inline write of max_inline bytes");
        assert_eq!(
            (w.opcode, w.wc, w.byte_len, w.inline_flag),
            (
                ffi::ibv_wr_opcode::IBV_WR_RDMA_WRITE,
                WcOpcode::RdmaWrite,
                0,
                ffi::ibv_send_flags::IBV_SEND_INLINE.0
            )
        );
        assert_eq!((w.buf.length, w.buf.lkey, w.remote.rkey), (8, 0, 7));
        assert!(Single::of(&write(9), 8).is_none(), "longer than max_inline");
        assert!(Single::of(&write(0), 8).is_none(), "empty");
        let send = Request::Send {
            data: Payload::Inline(&bytes[..4]),
        };
        let s = Single::of(&send, 8).expect("an inline send");
        assert_eq!(
            (s.opcode, s.wc),
            (ffi::ibv_wr_opcode::IBV_WR_SEND, WcOpcode::Send)
        );
        let sge = |len| Sge {
            addr: 4096,
            len,
            lkey: 3,
        };
        let one = [sge(32)];
        let r = Single::of(&Request::Read { remote, sgl: &one }, 8).expect("a read");
        assert_eq!(
            (r.opcode, r.wc, r.byte_len, r.inline_flag, r.buf.lkey),
            (
                ffi::ibv_wr_opcode::IBV_WR_RDMA_READ,
                WcOpcode::RdmaRead,
                32,
                0,
                3
            )
        );
        let two = [sge(32), sge(32)];
        assert!(Single::of(&Request::Read { remote, sgl: &two }, 8).is_none());
        let empty = [sge(0)];
        assert!(Single::of(
            &Request::Read {
                remote,
                sgl: &empty
            },
            8
        )
        .is_none());
        let gathered = [sge(8)];
        let gather_write = Request::Write {
            remote,
            data: Payload::Sgl(&gathered),
        };
        assert!(Single::of(&gather_write, 8).is_none(), "a gathered write");
        let imm = Request::WriteImm {
            remote,
            data: Payload::Inline(&bytes[..4]),
            imm: 1,
        };
        assert!(Single::of(&imm, 8).is_none(), "a write with immediate");
    }
}
