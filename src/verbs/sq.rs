//! The send queue of the verbs path: requests checked and staged into work requests, gather
//! lists and inline buffers preallocated at creation (posting allocates nothing), posted with
//! `ibv_post_send` or between `ibv_wr_start` and `ibv_wr_complete`.
//!
//! Cookies go through the same shadow tables as on the direct path, indexed by a per-queue
//! sequence number carried in `wr_id`, so moderation completions (the driver signals one
//! request in half a queue of unsignaled ones) stay hidden and every status is the verbs one.

use super::code;
use super::ex::{SendOps, VerbsApi};
use super::objects::Qp;
use crate::completion::WcOpcode;
use crate::error::{Error, QueueUnit, Result};
use crate::queue::cq_share::{CqShare, CqSlots, Leaving};
use crate::queue::flags::PostFlags;
use crate::queue::kind::{self, VerbsOp};
use crate::queue::shadow::{SendEntry, Shadow};
use mlx5::ctrl::Fence;
use mlx5::request::Payload;
use mlx5::request::Request;
use mlx5::request::Sge;
use rdma_sys as ffi;
use std::sync::Arc;

mod single;
mod window;

pub(crate) use window::WindowBind;

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
    /// This queue's incarnation (`shadow`'s tag): every request's `wr_id` is its position
    /// and this ([`VerbsSendQueue::wr_id`]).
    tag: u64,
    unsignaled: u32,
    /// `unsignaled` before the last request posted straight (`post_single_now`): what
    /// `unpost` puts back when rdma-core refuses it.
    unsignaled_before: u32,
    /// Set after a bind or local invalidate: the next request is fenced (as rdma-core arms an
    /// initiator small fence on mlx5). Always set on an iWARP device (`fence_all`).
    fence_next: bool,
    /// Every request is fenced: the device is iWARP (siw, irdma in iWARP mode), which
    /// completes an RDMA read at its response but a send or write posted after it as soon
    /// as it is handed to the wire (siw: `siw_qp_sq_process` completes them, the read waits
    /// in the ORQ for `siw_rdmap_complete`), while this queue retires everything before a
    /// completed position. A fence (siw's `SIW_WQE_READ_FENCE`) holds a request until the
    /// reads before it completed, so completions come in posting order; it costs nothing
    /// when no read is outstanding. Such a queue never posts straight (`straight`: a fence
    /// is always pending).
    fence_all: bool,
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
    /// The port's largest message (`max_msg_sz`; 2^31 until told).
    pub(super) max_msg: u32,
    /// The longest single gather entry a straight post takes: the port's largest message,
    /// and at most `MAX_SGE_BYTES`.
    pub(super) one_max: u32,
    /// The CQ entries this queue holds (None: not accounted, for tests).
    cq_share: Option<CqShare>,
    /// A batch with a gather list of more than one entry goes through `ibv_post_send` even
    /// on an extended QP (see [`VerbsSendQueue::set_rxe`]).
    gather_lists_legacy: bool,
    /// The provider publishes requests before it rings: `ibv_wr_complete`'s error other
    /// than `ENOSPC` comes after they are posted, and `ibv_bind_mw` cannot say which
    /// happened, so type-1 binds go through `ibv_post_send` (see
    /// [`VerbsSendQueue::set_rxe`]).
    publishes_first: bool,
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
        // SAFETY: a live QP of a live context (`qp` holds both); `device` is the ibv_device
        // the context was opened on.
        let fence_all = unsafe { (*(*(*qp.qp).context).device).transport_type }
            == ffi::ibv_transport_type::IBV_TRANSPORT_IWARP;
        let entries = caps.max_send_wr.max(1).next_power_of_two();
        let max_sge = caps.max_send_sge.max(1) as usize;
        let tag = super::incarnation::next();
        VerbsSendQueue {
            send_ops: qp.send_ops,
            cap: caps.max_send_wr,
            room_end: 0,
            max_sge,
            max_inline: caps.max_inline as usize,
            shadow: Arc::new(Shadow::new(entries.max(16)).with_tag(tag)),
            seq: 0,
            tag,
            unsignaled: 0,
            unsignaled_before: 0,
            fence_next: fence_all,
            fence_all,
            moderation: vec![(0, false); MAX_BATCH].into_boxed_slice(),
            wrs: (0..MAX_BATCH).map(|_| zeroed_wr()).collect(),
            // SAFETY: an all-zero ibv_sge is valid.
            sges: (0..MAX_BATCH * max_sge)
                .map(|_| unsafe { std::mem::zeroed() })
                .collect(),
            inline: vec![0u8; MAX_BATCH * caps.max_inline as usize].into_boxed_slice(),
            pending: 0,
            atomics: mlx5::AtomicCaps::HOST_ORDER,
            max_msg: crate::queue::checks::MAX_MESSAGE,
            one_max: mlx5::wqe::MAX_SGE_BYTES,
            cq_share: None,
            gather_lists_legacy: false,
            publishes_first: false,
            qp,
        }
    }

    /// The QP is rxe's (rdma-core `providers/rxe/rxe.c`), whose extended API differs from
    /// libmlx5's in two ways the queue takes into account:
    /// - Batches with a gather list of more than one entry are posted with `ibv_post_send`
    ///   even when the QP has the extended operations. Before rdma-core 64 rxe's
    ///   `wr_set_sge_list` sums the first entry's length `num_sge` times (fixed by commit
    ///   406cd2ad0, "rxe: Fix dma.length computation in wr_set_sge_list"), and the kernel
    ///   then fails the request with a local protection error or moves the wrong bytes; its
    ///   `ibv_post_send` sums them right. A batch is posted whole by one API, so the order
    ///   of the requests and the error semantics of [`VerbsSendQueue::ring`] are kept.
    /// - An `ibv_wr_complete` error other than `ENOSPC` leaves the requests posted. rxe's
    ///   `wr_complete` returns a builder's refusal (`qp->err`, only `ENOSPC`: the ring or
    ///   the inline limit) with nothing published; otherwise it stores the producer index,
    ///   which hands the requests to the kernel, and then returns its doorbell's error
    ///   (`post_send_db`: the kernel refuses it while the QP is below RTS). libmlx5's
    ///   `mlx5_send_wr_complete` posts nothing on any error.
    /// - A type-1 bind goes through `ibv_post_send` as the `IBV_WR_BIND_MW` request rxe's
    ///   `rxe_bind_mw` makes of it (the window's key advanced by `ibv_inc_rkey`, stored in
    ///   the `ibv_mw` once posted): `rxe_bind_mw` posts through `rxe_post_send`, which puts
    ///   the request in the ring and then returns its doorbell's error, the same as a
    ///   refusal's to its caller; `ibv_post_send`'s `bad_wr` tells the two apart
    ///   ([`first_unposted`]).
    pub fn set_rxe(&mut self, on: bool) {
        self.gather_lists_legacy = on;
        self.publishes_first = on;
    }

    /// What `ibv_wr_complete`'s result `rc` says of the requests it ended: 0 when they are
    /// posted (on rxe, also after its doorbell failed: [`VerbsSendQueue::set_rxe`]), else
    /// the error, none of them posted.
    #[inline(always)]
    pub(super) fn completed(&self, rc: i32) -> i32 {
        if rc != 0 && self.publishes_first && rc != libc::ENOSPC {
            return 0;
        }
        rc
    }

    /// Sets what the device's atomics can do: atomics it lacks are refused before posting
    /// (rdma-core's mlx5 returns EOPNOTSUPP without `atomic_cap`; other providers post them
    /// and fail the request).
    pub fn set_atomic_caps(&mut self, caps: mlx5::AtomicCaps) {
        self.atomics = caps;
    }

    /// Sets the port's largest message (`max_msg_sz`, [`crate::Device::max_message`]; 2^31
    /// until set, and never more): a write, read or send whose entries sum to more is
    /// refused before posting, where the device would fail it and move the QP to error.
    pub fn set_max_message(&mut self, max: u32) {
        (self.max_msg, self.one_max) = crate::queue::checks::message_limits(max);
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

    /// rdma-core's QP this queue posts to (and holds).
    pub(crate) fn device_qp(&self) -> Arc<Qp> {
        self.qp.clone()
    }

    /// The queue goes away: its charge on the CQ, given back when the result drops (after
    /// the device QP is destroyed: [`Leaving`]).
    pub(crate) fn leave_cq(&mut self) -> Option<Leaving> {
        let pos = self.seq;
        self.cq_share.take().map(|s| s.leave(pos))
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
    /// (checked, and refused past the port's largest message in all as on the direct path), inline bytes
    /// into its staging buffer (`IBV_SEND_INLINE` added to `flags`). Returns the number of
    /// gather entries; nothing is published on an error.
    pub(super) fn stage(&mut self, slot: usize, p: &Payload<'_>, flags: &mut u32) -> Result<usize> {
        match p {
            Payload::Sgl(sgl) => {
                crate::queue::checks::message_len(sgl, self.max_msg)?;
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
    /// write, send or read longer than the port's largest message; [`Error::Unsupported`] for requests
    /// the verbs path does not carry (masked atomics, NOP) and memory-window requests
    /// (bind with [`Qp::bind_mw`](crate::Qp::bind_mw), unbind with
    /// [`Qp::unbind_mw`](crate::Qp::unbind_mw)).
    pub fn push(&mut self, req: &Request<'_>, cookie: u64, flags: PostFlags) -> Result<()> {
        if let Request::LocalInvalidate { .. } | Request::BindMw(_) = req {
            return Err(Error::window_request());
        }
        self.push_any(req, cookie, flags)
    }

    /// [`VerbsSendQueue::push`] for any request.
    fn push_any(&mut self, req: &Request<'_>, cookie: u64, flags: PostFlags) -> Result<()> {
        if self.pending == MAX_BATCH {
            return Err(Error::QueueFull {
                needed: 1,
                free: 0,
                unit: QueueUnit::VerbsBatch,
            });
        }
        self.check_room()?;
        let slot = self.pending;
        let Some(op) = kind::verbs_op(req) else {
            return Err(kind::not_on_verbs());
        };
        let mut wr = zeroed_wr();
        let mut send_flags = 0u32;
        let payload = Self::stage;
        // The request's own fields; what it is (its opcode, what it completes as, its
        // checks) is `kind`'s.
        let nsge = match *req {
            Request::Write { remote, ref data }
            | Request::WriteImm {
                remote, ref data, ..
            } => {
                wr.wr.rdma = ffi::rdma_t {
                    remote_addr: remote.addr,
                    rkey: remote.rkey,
                };
                payload(self, slot, data, &mut send_flags)?
            }
            Request::Read { remote, sgl } => {
                crate::queue::checks::message_len(sgl, self.max_msg)?;
                wr.wr.rdma = ffi::rdma_t {
                    remote_addr: remote.addr,
                    rkey: remote.rkey,
                };
                self.fill_sgl(slot, sgl)?
            }
            Request::Send { ref data }
            | Request::SendImm { ref data, .. }
            | Request::SendInv { ref data, .. } => payload(self, slot, data, &mut send_flags)?,
            Request::CompareSwap {
                remote,
                local,
                compare,
                swap,
            } => {
                kind::check(req, self.atomics, self.max_msg)?;
                wr.wr.atomic = ffi::atomic_t {
                    remote_addr: remote.addr,
                    compare_add: compare,
                    swap,
                    rkey: remote.rkey,
                };
                self.fill_sgl(slot, &[local])?
            }
            Request::FetchAdd { remote, local, add } => {
                kind::check(req, self.atomics, self.max_msg)?;
                wr.wr.atomic = ffi::atomic_t {
                    remote_addr: remote.addr,
                    compare_add: add,
                    swap: 0,
                    rkey: remote.rkey,
                };
                self.fill_sgl(slot, &[local])?
            }
            _ => 0,
        };
        match *req {
            Request::WriteImm { imm, .. } | Request::SendImm { imm, .. } => {
                wr.imm_data_invalidated_rkey_union.imm_data = imm.to_be();
            }
            Request::SendInv { rkey, .. } | Request::LocalInvalidate { rkey } => {
                wr.imm_data_invalidated_rkey_union.invalidated_rkey = rkey;
            }
            _ => {}
        }
        let opcode = ibv_opcode(op);
        let (wc, byte_len) = kind::completion(req);
        self.enqueue(wr, opcode, (wc, byte_len), nsge, send_flags, cookie, flags);
        Ok(())
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
            self.fence_all
                || matches!(
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
        let wr_id = self.wr_id(self.seq);
        let w = &mut self.wrs[slot];
        w.wr_id = wr_id;
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

    /// Posts the queued requests: with one `ibv_wr_start` ... `ibv_wr_complete` on a QP
    /// created with the extended send operations, else with one `ibv_post_send`.
    ///
    /// # Errors
    /// The `ibv_wr_complete` error (none of the requests is posted) or the `ibv_post_send`
    /// error (the requests from the refused one on are not posted); their space is given
    /// back. A doorbell that failed after the provider took the requests is no error here:
    /// they are posted, and this returns `Ok` (an `ibv_post_send` error that names no
    /// request, [`first_unposted`]; rxe's `ibv_wr_complete`, [`VerbsSendQueue::set_rxe`]).
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
                let rc = self.completed(unsafe { ops.post(&self.wrs[..n]) });
                (rc, 0, "ibv_wr_complete")
            }
            (Some(ops), None) => {
                // SAFETY: the QP is live; the gather lists and inline staging the requests
                // name are in this queue's buffers and stay untouched during the call
                // (inline data is copied by it); `&mut self` serialises posting.
                let rc = self.completed(unsafe { ops.post(&self.wrs[..n]) });
                (rc, 0, "ibv_wr_complete")
            }
            (None, None) => {
                self.wrs[n - 1].next = std::ptr::null_mut();
                let mut bad: *mut ffi::ibv_send_wr = std::ptr::null_mut();
                // SAFETY: as above; the list links only entries of `wrs`.
                let rc = unsafe { ffi::ibv_post_send(self.qp.qp, self.wrs.as_mut_ptr(), &mut bad) };
                match first_unposted(rc, bad, self.wrs.as_ptr(), n) {
                    None => (0, n, "ibv_post_send"),
                    Some((first_bad, rc)) => (rc, first_bad, "ibv_post_send"),
                }
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

    /// Gather entries a request takes.
    pub(crate) fn max_sge(&self) -> usize {
        self.max_sge
    }

    /// The rdma-core API this queue posts with.
    pub fn api(&self) -> VerbsApi {
        self.qp.api()
    }

    /// The sequence number the next request gets (the last one's plus one).
    pub(crate) fn position(&self) -> u16 {
        self.seq
    }

    /// The `wr_id` of the request at position `seq`: the position, and this queue's
    /// incarnation (`super::incarnation`), by which the poller tells its completions from
    /// those of a queue that had its QP number before.
    #[inline(always)]
    pub(super) fn wr_id(&self, seq: u16) -> u64 {
        seq as u64 | self.tag
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
}

/// Requests queued on a verbs send queue and posted together; rewound when dropped unrung.
#[must_use = "a batch posts nothing until rung"]
pub struct VerbsBatch<'a> {
    q: &'a mut VerbsSendQueue,
    rung: bool,
}

impl<'a> VerbsBatch<'a> {
    /// A batch on `q`. Requests a forgotten batch (`mem::forget`) left queued go with this
    /// one's: posted when it is rung, dropped when it is dropped unrung.
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

/// The verbs opcode of a request kind (`enum ibv_wr_opcode`).
#[inline(always)]
fn ibv_opcode(op: VerbsOp) -> ffi::ibv_wr_opcode::Type {
    use ffi::ibv_wr_opcode as O;
    match op {
        VerbsOp::RdmaWrite => O::IBV_WR_RDMA_WRITE,
        VerbsOp::RdmaWriteImm => O::IBV_WR_RDMA_WRITE_WITH_IMM,
        VerbsOp::RdmaRead => O::IBV_WR_RDMA_READ,
        VerbsOp::Send => O::IBV_WR_SEND,
        VerbsOp::SendImm => O::IBV_WR_SEND_WITH_IMM,
        VerbsOp::SendInv => O::IBV_WR_SEND_WITH_INV,
        VerbsOp::CompSwap => O::IBV_WR_ATOMIC_CMP_AND_SWP,
        VerbsOp::FetchAdd => O::IBV_WR_ATOMIC_FETCH_AND_ADD,
        VerbsOp::LocalInv => O::IBV_WR_LOCAL_INV,
    }
}

/// What `ibv_post_send` took of the list of `n` requests at `list` it returned `rc` and
/// `bad` for: None when it took every one, or the first it did not take and the error.
///
/// A provider names the first request it did not post in `bad`, also when it returns 0:
/// siw's `siw_post_send` sets `*bad_wr` at a refused request and then returns the
/// doorbell's result (siw returns errnos negated; refused without one, the error is
/// EINVAL, siw's refusal). An error with no request named is a doorbell that failed after
/// the provider had put every request in its ring: siw's `siw_db` and rxe's
/// `post_send_db` (rdma-core `providers/siw/siw.c`, `providers/rxe/rxe.c`) write to the
/// kernel only after the requests are in the ring the kernel reads (siw's kernel refuses
/// the doorbell with `ENOTCONN` while another thread changes the QP's state, as when its
/// connection closes; rxe's while the QP is below RTS). Those requests are posted: the
/// kernel runs them at a later doorbell, or flushes them, each signaled one completing,
/// when the QP goes to the error state. (libsiw rings only when the request before the new
/// ones is done, so on a QP that stays in RTS the queue can stall until then: siw's, which
/// the crate cannot mend.) Taken back, their positions went to the next requests and their
/// completions were reported under the next requests' cookies.
pub(super) fn first_unposted(
    rc: i32,
    bad: *const ffi::ibv_send_wr,
    list: *const ffi::ibv_send_wr,
    n: usize,
) -> Option<(usize, i32)> {
    if bad.is_null() {
        return None;
    }
    let first =
        (bad as usize).wrapping_sub(list as usize) / std::mem::size_of::<ffi::ibv_send_wr>();
    Some((first.min(n), if rc == 0 { libc::EINVAL } else { rc }))
}
