//! The send queue of the direct path: WQEs written straight into the ring, cookies into the
//! shadow table, one doorbell per post or per batch.

use super::doorbell::Doorbell;
use super::placement;
use super::register::{self, DoorbellMode};
use crate::completion::WcOpcode;
use crate::error::{Error, QueueUnit, Result};
use crate::queue::cq_share::{CqShare, CqSlots, Leaving};
use crate::queue::flags::PostFlags;
use crate::queue::shadow::{SendEntry, Shadow};
use mlx5::ctrl::Fence;
use mlx5::doorbell::SEND_WQE_BB;
use mlx5::request::Request;
use mlx5::wqe::Limits;
use mlx5::{AtomicCaps, RawQp};
use std::sync::Arc;

mod post;

/// The transport of the QP a send queue belongs to, as the crate made it: which post
/// functions the queue takes. A queue of one of the crate's QPs knows it and refuses the
/// post functions of the others before anything is written (a ConnectX fails such a WQE
/// with a local QP operation error and moves the QP to error); a queue made over raw rings
/// ([`SendQueue::new`]) does not, and leaves it to its caller.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Transport {
    /// Reliable connection ([`crate::Qp`]): [`SendQueue::post`], [`SendQueue::push`],
    /// [`Batch::push`].
    Rc,
    /// Unreliable datagram ([`crate::UdQp`]): [`SendQueue::post_ud`].
    Ud,
    /// DC initiator ([`crate::Dci`]): [`SendQueue::post_dc`], [`SendQueue::push_dc`],
    /// [`Batch::push_dc`].
    Dci,
}

/// The refusal of a post function of transport `asked` on a queue of transport `queue`.
#[cold]
#[inline(never)]
pub(super) fn other_transport(queue: Transport, asked: Transport) -> Error {
    use Transport::{Dci, Rc, Ud};
    Error::Unsupported(match (asked, queue) {
        (Ud, Dci) => "a UD send (SendQueue::post_ud) on a DCI's send queue",
        (Ud, _) => "a UD send (SendQueue::post_ud) on an RC QP's send queue",
        (Dci, Ud) => "a DC request (SendQueue::post_dc / push_dc) on a UD QP's send queue",
        (Dci, _) => "a DC request (SendQueue::post_dc / push_dc) on an RC QP's send queue",
        (Rc, Ud) => "an RC request (SendQueue::post / push) on a UD QP's send queue",
        (Rc, _) => "an RC request (SendQueue::post / push) on a DCI's send queue",
    })
}

/// Blocks of the longest WQE a queue with `lim` can build, on any transport (a UD or DC
/// address takes one block more than an RC remote address at most).
fn tail_bbs(lim: &Limits) -> u32 {
    (mlx5::wqe::max_wqe_bbs(lim) + 1).min(mlx5::doorbell::MAX_WQE_BBS) as u32
}

/// The longest payload of the inline-write fast path (`super::inline_write`): 64 bytes minus
/// control (16), remote address (16) and inline header (4).
pub const FAST_INLINE_MAX: usize = 28;

/// The send side of a QP on the direct path.
pub struct SendQueue {
    buf: *mut u8,
    cnt: u32,
    /// `cnt - 1`.
    mask: u32,
    qpn: u32,
    limits: Limits,
    /// Producer index (blocks, 16 bits) of the next WQE.
    pub(super) pi: u16,
    /// The producer index the queue may post up to: the retired index (as last read) plus
    /// the ring size or the CQ entries the queue holds, whichever is smaller. `pi == limit`
    /// sends the fast path to the general one, which reads the retired index again and
    /// takes more CQ entries when it can (`make_room`).
    pub(super) limit: u16,
    /// This queue's charge on the CQ it completes on (None: not accounted, a queue over
    /// plain memory in unit tests).
    cq_share: Option<CqShare>,
    /// A [`Batch`] is open: the shadow's posted mark is kept at `limit` (everything the
    /// batch may write), so a region dropped before it rings waits for those WQEs too.
    in_batch: bool,
    pub(super) db: Doorbell,
    pub(crate) shadow: Arc<Shadow<SendEntry>>,
    /// The shadow table's entries (kept alive by `shadow`).
    slots: *mut SendEntry,
    /// Blocks that may still be posted unsignaled before one must be signaled (completion
    /// moderation: `half` after each signaled WQE).
    pub(super) credit: u32,
    /// The longest unsignaled run: half the ring, and never so much that the longest WQE
    /// the queue can build ([`tail_bbs`]) no longer fits beside it (on a ring of 16 blocks
    /// whose WQEs reach 9 or more blocks, a run of 8 left a large request refused for good,
    /// with nothing signaled that could free the ring).
    half: u32,
    /// Fence armed by a bind or invalidate for the next WQE.
    pub(super) next_fence: Fence,
    /// WQEs written since the last ring, and where the last one starts.
    pub(super) pending: u16,
    pub(super) last_start: u16,
    /// `(qpn << 8 | ds).to_be()` for ds 0..=4: the control segment's second word of a
    /// one-block WQE, ready made.
    pub(super) qpn_ds: [u32; 5],
    /// One more than the longest payload the inline-write fast path takes (its own limit
    /// and the QP's), or 0 when the fast path is off: no BlueFlame register of its own
    /// ([`DoorbellMode::Dedicated`]) of at least one block, a fence armed for the next WQE,
    /// a batch open (or forgotten), or the owner has not enabled it (a QP before
    /// `connect`). One compare checks all of it.
    pub(super) fast_limit: usize,
    /// The same limit for the inline-write encoder of a push, which rings nothing (a
    /// batch's, or the general path's): as `fast_limit`, but on while a batch is open.
    pub(super) push_limit: usize,
    /// `fast_limit`, `shared_fast_limit` and `fast_entry` as they are outside a batch,
    /// kept while one is open (they are 0 then), put back when it is rung.
    parked: (usize, usize, bool),
    /// The same limit for a queue on a shared BlueFlame register
    /// ([`DoorbellMode::SharedLocked`]): its fast path rings under the register's lock
    /// ([`SendQueue::try_write_inline_shared`]); 0 on a register of its own.
    pub(super) shared_fast_limit: usize,
    /// The fast path of one scatter/gather entry applies to the queue
    /// ([`SendQueue::try_one_entry`]): a fast path is on (as for `fast_limit` or
    /// `shared_fast_limit`), the QP takes a scatter entry, and BlueFlame copies are not kept
    /// for inline WQEs alone.
    pub(super) fast_entry: bool,
    bf_ok: bool,
    /// A shared BlueFlame register of at least one block.
    shared_bf_ok: bool,
    enabled: bool,
    /// What the device's atomics can do (read once when the QP is created).
    atomics: AtomicCaps,
    /// The port's largest message (`max_msg_sz`; 2^31 until told).
    max_msg: u32,
    /// The longest single entry the one-block fast paths take: the port's largest message,
    /// and at most `MAX_SGE_BYTES`.
    pub(super) one_max: u32,
    /// BlueFlame copies only for WQEs with inline data (`MLX5_POST_SEND_PREFER_BF=0`).
    pub(super) bf_inline_only: bool,
    /// The transport of the crate's QP this queue belongs to (None: made over raw rings by
    /// [`SendQueue::new`], unchecked).
    transport: Option<Transport>,
    /// `transport` is UD's or DCI's: the RC post functions are refused (one test on the
    /// general path).
    not_rc: bool,
}

// SAFETY: the raw pointers are to the QP's rings and doorbell record, which this queue alone
// writes (the constructor's contract), and to its BlueFlame register, which is either its own
// (`Dedicated`: the constructor's contract, and the register table refuses a second claim),
// or rung by every queue only under the register's lock with the register's offset
// (`SharedLocked`: `Doorbell::ring_locked`; the fast path is off), or written only with
// single-copy-atomic 8-byte stores at one fixed offset (`DoorbellOnly`). So queues on
// different threads never race on a register; moving the queue moves its exclusive rights.
// It is not Sync: posting takes `&mut self`.
unsafe impl Send for SendQueue {}

impl core::fmt::Debug for SendQueue {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("SendQueue")
            .field("qpn", &self.qpn)
            .field("blocks", &self.cnt)
            .field("pi", &self.pi)
            .finish()
    }
}

impl SendQueue {
    /// A send queue over the rings of `raw`.
    ///
    /// # Safety
    /// `raw` must describe a live QP (send ring of `sq_wqe_cnt` 64-byte blocks, doorbell record,
    /// BlueFlame register of `2 * bf_size` bytes) that stays alive while the queue exists and
    /// that nothing else posts to. `bf_reg` is the register's start, its first half, as
    /// `mlx5dv_get_qp` reports it (`qp_out->bf.reg = mqp->bf->reg`): the queue writes both
    /// halves from there, so the second half's address would have it write the next
    /// register's first half. The ring and a register of BlueFlame halves are 64-byte
    /// aligned, as the hardware gives them (rdma-core's rings are page-aligned; a register
    /// is at an offset of its UAR page that is a multiple of `2 * bf_size`); addresses that
    /// would make the queue's own stores misaligned are refused (below).
    ///
    /// The register is taken as one other queues may ring too
    /// ([`DoorbellMode::SharedLocked`]: every ring takes the register's lock), or
    /// [`DoorbellMode::DoorbellOnly`] without BlueFlame.
    ///
    /// A queue made here does not know its QP's transport nor the memory windows the
    /// crate's [`MemoryWindow`](crate::MemoryWindow)s track: it takes every post function
    /// ([`SendQueue::post`], [`Batch::push`], [`SendQueue::post_ud`]) and
    /// [`Request::BindMw`] through [`SendQueue::post`], and a
    /// request the QP's transport does not carry, or a bind the NIC refuses, fails there
    /// (a local QP operation or memory-window bind error) and moves the QP to error. The
    /// queues of the crate's QPs know both and refuse them
    /// before posting.
    ///
    /// # Errors
    /// [`Error::InvalidParameter`] for ring sizes or a BlueFlame size the hardware never
    /// gives, and for a null or misaligned ring, doorbell record or register (the queue
    /// stores 8-byte words to the ring, 4-byte ones to the record, 16-byte ones to a
    /// register of BlueFlame halves and an 8-byte doorbell to one without);
    /// [`Error::RegisterInUse`] when the register is claimed as dedicated by a live queue,
    /// or overlaps one a live queue rings with halves of another size.
    pub unsafe fn new(raw: &RawQp) -> Result<SendQueue> {
        // SAFETY: the caller's contract.
        unsafe { Self::with_register(raw, false) }
    }

    /// As [`SendQueue::new`], on a register no other queue rings: [`DoorbellMode::Dedicated`]
    /// (no lock), or [`DoorbellMode::DoorbellOnly`] without BlueFlame.
    ///
    /// # Safety
    /// As [`SendQueue::new`]; and no QP but this one rings `raw.bf_reg` while the queue lives
    /// (rdma-core gives each thread domain a register of its own: one thread domain per QP).
    ///
    /// # Errors
    /// As [`SendQueue::new`]; [`Error::RegisterInUse`] when another live queue rings the
    /// register.
    pub unsafe fn new_dedicated(raw: &RawQp) -> Result<SendQueue> {
        // SAFETY: the caller's contract.
        unsafe { Self::with_register(raw, true) }
    }

    /// # Safety
    /// As [`SendQueue::new_dedicated`] when `dedicated`, else as [`SendQueue::new`].
    unsafe fn with_register(raw: &RawQp, dedicated: bool) -> Result<SendQueue> {
        let cnt = raw.sq_wqe_cnt;
        let stride_ok = raw.sq_stride as usize == SEND_WQE_BB;
        if !cnt.is_power_of_two() || !(16..=1 << 15).contains(&cnt) || !stride_ok {
            return Err(Error::InvalidParameter {
                what: "send ring size",
                value: cnt as u64,
            });
        }
        if raw.bf_size as usize % SEND_WQE_BB != 0 {
            return Err(Error::InvalidParameter {
                what: "BlueFlame size",
                value: raw.bf_size as u64,
            });
        }
        // Every ring writes to the register (the 8-byte doorbell when `bf_size == 0`), so a
        // null register is refused whatever its size, and so is a null doorbell record.
        if raw.bf_reg.is_null() {
            return Err(Error::InvalidParameter {
                what: "BlueFlame register (null) of BlueFlame size",
                value: raw.bf_size as u64,
            });
        }
        if raw.dbrec.is_null() || raw.sq_buf.is_null() {
            return Err(Error::InvalidParameter {
                what: "doorbell record or send ring (null)",
                value: 0,
            });
        }
        // The alignment the queue's own stores need (the hardware's is larger): 8-byte
        // words in the ring, 4-byte ones in the record, 16-byte stores into BlueFlame
        // halves, the 8-byte doorbell otherwise.
        let bf_align = if raw.bf_size == 0 { 8 } else { 16 };
        placement::check(&[
            ("send ring address (8-byte aligned)", raw.sq_buf as usize, 8),
            (
                "doorbell record address (4-byte aligned)",
                raw.dbrec as usize,
                4,
            ),
            (
                "BlueFlame register address (16-byte aligned, 8 without BlueFlame)",
                raw.bf_reg as usize,
                bf_align,
            ),
        ])?;
        let claim = register::claim(raw.bf_reg, raw.bf_size as usize, dedicated).map_err(|e| {
            Error::RegisterInUse {
                addr: e.addr as u64,
            }
        })?;
        let shadow = Arc::new(Shadow::new(cnt));
        let limits = Limits {
            max_sge: raw.max_send_sge as usize,
            max_inline: raw.max_inline as usize,
        };
        let half = (cnt / 2).min(cnt.saturating_sub(tail_bbs(&limits)));
        // The fast path rings through `ring_bf_block`, which has no lock: only on a register
        // of the queue's own; on a shared one it rings through `ring_bf_block_shared`, under
        // the register's lock.
        let bf_ok = raw.bf_size as usize >= SEND_WQE_BB && claim.mode == DoorbellMode::Dedicated;
        let shared_bf_ok =
            raw.bf_size as usize >= SEND_WQE_BB && claim.mode == DoorbellMode::SharedLocked;
        let mut sq = SendQueue {
            buf: raw.sq_buf,
            cnt,
            mask: cnt - 1,
            qpn: raw.qpn,
            limits,
            pi: 0,
            limit: cnt as u16,
            in_batch: false,
            cq_share: None,
            // SAFETY: the caller guarantees a live record and register for our lifetime; the
            // claim is this register's, dedicated only under `new_dedicated`'s contract.
            db: unsafe { Doorbell::new(raw.dbrec, raw.bf_reg, raw.bf_size as usize, claim) },
            slots: shadow.slots(),
            shadow,
            credit: half,
            half,
            next_fence: Fence::None,
            pending: 0,
            last_start: 0,
            qpn_ds: [0, 1, 2, 3, 4].map(|ds| (raw.qpn << 8 | ds).to_be()),
            // Set below from the rest (`update_fast_limit`).
            fast_limit: 0,
            push_limit: 0,
            parked: (0, 0, false),
            shared_fast_limit: 0,
            fast_entry: false,
            bf_ok,
            shared_bf_ok,
            enabled: true,
            atomics: AtomicCaps::CONNECTX,
            max_msg: crate::queue::checks::MAX_MESSAGE,
            one_max: mlx5::wqe::MAX_SGE_BYTES,
            bf_inline_only: false,
            transport: None,
            not_rc: false,
        };
        sq.update_fast_limit();
        Ok(sq)
    }

    /// The QP number.
    #[inline]
    pub fn qpn(&self) -> u32 {
        self.qpn
    }

    /// Makes this the queue of one of the crate's QPs of `transport`: from now on it refuses
    /// the post functions of other transports and [`Request::BindMw`] through the generic
    /// post ([`SendQueue::post_window`] is the crate's way), and a queue that is not RC's takes
    /// no inline-write fast path.
    pub(crate) fn set_transport(&mut self, transport: Transport) {
        self.transport = Some(transport);
        self.not_rc = transport != Transport::Rc;
        self.update_fast_limit();
    }

    /// The refusal of an RC post function on a UD QP's or DCI's queue (`not_rc`).
    #[cold]
    #[inline(never)]
    fn refuse_rc(&self) -> Error {
        let queue = match self.transport {
            Some(Transport::Ud) => Transport::Ud,
            _ => Transport::Dci,
        };
        other_transport(queue, Transport::Rc)
    }

    /// Refuses a post function of `asked` on the queue of one of the crate's QPs of
    /// another transport.
    #[inline(always)]
    pub(super) fn check_transport(&self, asked: Transport) -> Result<()> {
        match self.transport {
            Some(t) if t != asked => Err(other_transport(t, asked)),
            _ => Ok(()),
        }
    }

    /// Sets what the device's atomics can do (a ConnectX's by default): atomics it lacks are
    /// refused before posting.
    pub fn set_atomic_caps(&mut self, caps: AtomicCaps) {
        self.atomics = caps;
    }

    /// What the device's atomics can do, as this queue checks them.
    pub fn atomic_caps(&self) -> AtomicCaps {
        self.atomics
    }

    /// Sets the port's largest message (`max_msg_sz`, [`crate::Device::max_message`]; 2^31
    /// until set, and never more): a write, read or send whose entries sum to more is
    /// refused before posting, where the device would fail it and move the QP to error.
    pub fn set_max_message(&mut self, max: u32) {
        (self.max_msg, self.one_max) = crate::queue::checks::message_limits(max);
    }

    /// The largest message this queue posts.
    pub(crate) fn max_message(&self) -> u32 {
        self.max_msg
    }

    /// Half the ring: the longest unsignaled run.
    #[inline(always)]
    pub(super) fn half(&self) -> u32 {
        self.half
    }

    /// Blocks free for new WQEs.
    #[inline(always)]
    pub fn free_blocks(&self) -> u32 {
        self.cnt - (self.pi.wrapping_sub(self.shadow.retired()) as u32)
    }

    /// Blocks of the ring (the send depth in blocks).
    #[inline]
    pub(crate) fn ring_blocks(&self) -> u32 {
        self.cnt
    }

    /// The send depth: requests of the largest kind this queue's limits allow, of its
    /// transport (a UD WQE carries a datagram segment and a DCI's an address segment, an
    /// RC one a remote address or a bind's UMR), that fit in its ring at once.
    pub(crate) fn depth(&self) -> u32 {
        use mlx5::qp_size::Transport as T;
        let t = match self.transport {
            Some(Transport::Ud) => T::Ud,
            Some(Transport::Dci) => T::Dci,
            Some(Transport::Rc) | None => T::Rc,
        };
        self.cnt / t.max_wqe_bbs(&self.limits) as u32
    }

    /// Accounts this queue's WQEs against the entries of the CQ it completes on: from now
    /// on it never posts beyond its charge on the CQ (see `cq_share`).
    pub(crate) fn attach_cq(&mut self, slots: Arc<CqSlots>) {
        self.cq_share = Some(CqShare::new(slots, self.shadow.clone(), self.pi));
        // No allowance yet: the next post takes some on the cold path.
        self.limit = self.pi;
    }

    /// The queue goes away: its charge on the CQ, given back when the result drops (after
    /// the device QP is destroyed: [`Leaving`]).
    pub(crate) fn leave_cq(&mut self) -> Option<Leaving> {
        let pos = self.pi;
        self.cq_share.take().map(|s| s.leave(pos))
    }

    /// The cold path of a full cached limit: reads how far the poller has retired the ring,
    /// tops up the CQ allowance for `bbs` more blocks, caches the new limit for the fast
    /// path, and says which one is short when the request does not fit.
    ///
    /// It also bounds the unsignaled run by the CQ allowance (the ring's half bounds it
    /// otherwise): a refusal for want of CQ entries must never come while every outstanding
    /// request is unsignaled, since then nothing the user can poll would ever free them.
    /// The cached limit stops `tail` blocks (the longest WQE the queue can build) short of
    /// the allowance's end, so the queue comes back here while the last request still fits;
    /// when no more than that is left, each request is signaled (the credit is zeroed) and
    /// comes back here alone. So a CQ refusal follows a signaled WQE, which completes (or
    /// has completed, and everything before it retired). UCX keeps the same rule with its
    /// TX moderation (`uct_rc_iface_tx_moderation`, a signaled WQE every
    /// `config.tx_moderation`, and `uct_rc_iface_have_tx_cqe_avail` on `tx.cq_available`);
    /// here the interval is computed where the allowance changes, so the post path pays
    /// nothing for it.
    #[cold]
    #[inline(never)]
    pub(super) fn make_room(&mut self, bbs: u32) -> Result<()> {
        let retired = self.shadow.retired();
        self.shadow.note_retired(retired);
        let ring_free = self.cnt - (self.pi.wrapping_sub(retired) as u32);
        let mut room = ring_free;
        if let Some(s) = &mut self.cq_share {
            let tail = tail_bbs(&self.limits);
            let have = s.top_up(self.pi, bbs + tail, self.cnt + tail);
            room = if have >= bbs + tail {
                ring_free.min(have - tail)
            } else if have >= bbs {
                // The last requests the allowance takes: one at a time, signaled.
                self.credit = 0;
                bbs.min(ring_free)
            } else {
                // Refused: the next request comes back here too.
                0
            };
        }
        self.limit = self.pi.wrapping_add(room as u16);
        if self.in_batch {
            self.shadow.mark_posted(self.limit);
        }
        if bbs > ring_free {
            return Err(Error::QueueFull {
                needed: bbs,
                free: ring_free,
                unit: QueueUnit::SendBlocks,
            });
        }
        match &self.cq_share {
            Some(s) if bbs > room => Err(s.full(self.pi, bbs)),
            _ => Ok(()),
        }
    }

    /// When the fast paths' cached room is spent (`pi == limit`), takes more as the general
    /// path's `claim` would ([`SendQueue::make_room`] for one block): true when a block is
    /// free now (the fast paths may be tried again), false when the room was not spent or
    /// none could be had (the general path then says why).
    #[inline(always)]
    pub(super) fn refill_room(&mut self) -> bool {
        self.pi == self.limit && self.make_room(1).is_ok()
    }

    /// Arms (or clears) the fence of the next WQE; the fast path applies only without one.
    #[inline(always)]
    pub(super) fn set_next_fence(&mut self, fence: Fence) {
        self.next_fence = fence;
        self.update_fast_limit();
    }

    /// The first block of the last WQE written and the producer index after it.
    pub(crate) fn last_wqe(&self) -> (u16, u16) {
        (self.last_start, self.pi)
    }

    /// Turns the inline-write fast path on or off (on by default). A QP turns it off until
    /// it is connected, so that its own checks run first; crate-private so that no safe
    /// caller can turn that check off.
    pub(crate) fn enable_fast_path(&mut self, on: bool) {
        self.enabled = on;
        self.update_fast_limit();
    }

    fn update_fast_limit(&mut self) {
        let on = self.enabled && self.next_fence == Fence::None && !self.not_rc;
        let limit = FAST_INLINE_MAX.min(self.limits.max_inline) + 1;
        let fast = (
            if on && self.bf_ok { limit } else { 0 },
            if on && self.shared_bf_ok { limit } else { 0 },
            // rdma-core's `post_send_db` copies a WQE without inline data with BlueFlame
            // only when `prefer_bf` (`MLX5_POST_SEND_PREFER_BF`, 1 unless set to 0).
            on && (self.bf_ok || self.shared_bf_ok)
                && self.limits.max_sge >= 1
                && !self.bf_inline_only,
        );
        // A push rings nothing: its encoder is on whether a batch is open or not.
        self.push_limit = fast.0;
        // Off while a batch is open, and so after one that was forgotten (`mem::forget`,
        // which is safe) until a ring: a fast path rings its own block alone, and the
        // batch's WQEs, written but not rung, would be left behind it (and rung later from
        // their stale start, an index that went backwards).
        if self.in_batch {
            self.parked = fast;
        } else {
            (self.fast_limit, self.shared_fast_limit, self.fast_entry) = fast;
        }
    }

    /// Records the WQE at `pi` in the shadow table.
    #[inline(always)]
    pub(super) fn record(
        &mut self,
        pi: u16,
        cookie: u64,
        bbs: u16,
        opcode: WcOpcode,
        byte_len: u32,
        report: bool,
    ) {
        let i = (pi as u32 & self.mask) as usize;
        // The entry's last 4 bytes as one word (`SendEntry::tail`).
        let tail = SendEntry::tail(bbs, opcode, report);
        // SAFETY: `slots` has `cnt` entries (kept alive by `shadow`) and `i < cnt`; only the
        // poster writes, and only positions the device has not been told about (see
        // `Shadow`'s `Sync` impl). An entry is 16 bytes, 8-aligned: the cookie, the byte
        // count, then `tail`, whose bytes are those of valid fields.
        unsafe {
            let e = self.slots.add(i);
            (e as *mut u64).write(cookie);
            let words = e as *mut u32;
            words.add(2).write(byte_len);
            words.add(3).write(tail);
        };
    }

    /// The limits the QP was created with.
    pub(crate) fn limits(&self) -> Limits {
        self.limits
    }

    /// Bytes of one BlueFlame write (0: doorbell only).
    #[cfg(test)]
    pub(crate) fn bf_size(&self) -> usize {
        self.db.bf_size()
    }

    /// Gives up the queue's claim on its BlueFlame register (its QP is being destroyed: the
    /// queue never rings again).
    pub(crate) fn release_register(&mut self) {
        self.db.release();
    }

    /// How this queue rings its doorbell (chosen at creation).
    pub fn doorbell_mode(&self) -> DoorbellMode {
        self.db.mode()
    }

    #[inline(always)]
    pub(super) fn block(&self, pos: u16) -> *mut u8 {
        self.buf
            .wrapping_add(((pos as u32) & self.mask) as usize * SEND_WQE_BB)
    }

    /// Rings the doorbell for every WQE pushed since the last ring: BlueFlame copy when it is
    /// exactly one WQE that fits, else the 8-byte doorbell.
    #[inline(always)]
    pub(crate) fn ring(&mut self) {
        if self.pending == 0 {
            return;
        }
        let start = self.last_start;
        let bbs = self.pi.wrapping_sub(start);
        // rdma-core `post_send_db`: a BlueFlame copy only for one WQE of more than one DS
        // (a one-DS WQE, such as a NOP or a send of 0 bytes, gets the 8-byte doorbell). The
        // DS count is the low 6 bits of the control segment's byte 7, just written.
        // SAFETY: the block at `start` holds the last WQE's control segment, inside the ring.
        let ds = unsafe { *self.block(start).add(7) } & 0x3f;
        let mut single = self.pending == 1 && ds > 1;
        if self.bf_inline_only && single {
            single = self.last_is_inline(start, ds);
        }
        self.pending = 0;
        self.shadow.mark_posted(self.pi);
        let (buf, mask) = (self.buf, self.cnt - 1);
        let block = |i: usize| {
            let pos = start.wrapping_add(i as u16) as u32 & mask;
            buf.wrapping_add(pos as usize * SEND_WQE_BB) as *const u8
        };
        // SAFETY: blocks start .. start + bbs hold the WQE just written, inside the ring.
        unsafe { self.db.ring(self.pi, single, bbs as usize, block) };
        if self.in_batch {
            // A batch's WQEs are rung: by `Batch::ring`, or, for a batch that was
            // forgotten, by the next post or batch.
            self.end_batch();
        }
    }

    /// The open batch is over (rung, or rung after it was forgotten): the fast paths are on
    /// again, and a dropped region no longer waits for positions the batch might write.
    #[cold]
    fn end_batch(&mut self) {
        self.in_batch = false;
        (self.fast_limit, self.shared_fast_limit, self.fast_entry) = self.parked;
        self.shadow.mark_posted(self.pi);
    }

    /// Whether the WQE at `start` (of `ds` DS) carries inline data: a write or send whose
    /// first data segment has the inline flag (rdma-core's `inl`). On a UD QP's or a DCI's
    /// queue the datagram segment (48 bytes) comes before it, as in `_mlx5_post_send`.
    #[cold]
    fn last_is_inline(&self, start: u16, ds: u8) -> bool {
        // SAFETY: the block at `start` holds the WQE just written, inside the ring.
        let opcode = unsafe { *self.block(start).add(3) };
        let dgram = if self.not_rc { 48 } else { 0 };
        let at = dgram
            + match opcode {
                0x08 | 0x09 => 32,        // RDMA write (with immediate): control, remote address
                0x0a | 0x0b | 0x01 => 16, // send (with immediate / invalidate): control
                _ => return false,
            };
        if ds as usize * 16 <= at {
            return false;
        }
        // SAFETY: `at` lies inside the WQE (`ds` DS), whose blocks follow `start` around the
        // ring: block `at / 64` of it, byte `at % 64`.
        let b = unsafe {
            *self
                .block(start.wrapping_add((at / 64) as u16))
                .add(at % 64)
        };
        b & 0x80 != 0
    }

    /// rdma-core's `MLX5_POST_SEND_PREFER_BF=0`: BlueFlame copies only for WQEs with inline
    /// data (off by default, as in rdma-core).
    pub(crate) fn set_blueflame_inline_only(&mut self, on: bool) {
        self.bf_inline_only = on;
        self.update_fast_limit();
    }

    /// Rings for the one-block WQE at `block`, just written at `pi - 1`, with BlueFlame.
    ///
    /// # Safety
    /// `block` must be that WQE's block in the ring, and the register's halves must hold at
    /// least one block.
    #[inline(always)]
    pub(super) unsafe fn ring_bf_block(&mut self, block: *const u8) {
        self.shadow.mark_posted(self.pi);
        // SAFETY: the caller's contract.
        unsafe { self.db.ring_bf_block(self.pi, block) };
    }

    /// [`SendQueue::ring_bf_block`] on a shared register, under its lock.
    ///
    /// # Safety
    /// As [`SendQueue::ring_bf_block`]; the queue's register is shared
    /// ([`DoorbellMode::SharedLocked`]) with BlueFlame halves of at least 64 bytes.
    #[inline(always)]
    pub(super) unsafe fn ring_bf_block_shared(&mut self, block: *const u8) {
        self.shadow.mark_posted(self.pi);
        // SAFETY: the caller's contract.
        unsafe { self.db.ring_bf_block_locked(self.pi, block) };
    }

    /// Marks everything posted as completed, as a poller does when the last request's
    /// completion arrives: for the oracle's test of this queue against rdma-core's post
    /// (`mlx5/oracle/tests/direct_queue.rs`), which has no CQ. Not part of the API.
    #[cfg(feature = "internals")]
    #[doc(hidden)]
    pub fn retire_all(&mut self) {
        self.shadow.retire(self.pi);
    }

    /// Starts a batch: requests are written as they are pushed and rung once by
    /// [`Batch::ring`]. A batch dropped without ringing is rewound: nothing is posted.
    pub fn batch(&mut self) -> Batch<'_> {
        self.ring();
        // Until the batch rings, a region dropped meanwhile must wait for everything the
        // batch may write (up to the cached limit, which `make_room` moves on): mark that
        // far as posted.
        // (Still open after the ring only when a forgotten batch wrote nothing: its fast
        // paths are parked already.)
        if !self.in_batch {
            self.in_batch = true;
            self.parked = (self.fast_limit, self.shared_fast_limit, self.fast_entry);
            (self.fast_limit, self.shared_fast_limit, self.fast_entry) = (0, 0, false);
        }
        self.shadow.mark_posted(self.limit);
        let start = (self.pi, self.credit, self.next_fence);
        Batch { sq: self, start }
    }
}

/// Requests written to the ring and rung together (doorbell batching).
#[must_use = "a batch posts nothing until rung"]
pub struct Batch<'a> {
    pub(super) sq: &'a mut SendQueue,
    start: (u16, u32, Fence),
}

impl Batch<'_> {
    /// Writes one more request.
    ///
    /// # Errors
    /// As [`SendQueue::post`]; the requests pushed before stay in the batch.
    #[inline(always)]
    pub fn push(&mut self, req: &Request<'_>, cookie: u64, flags: PostFlags) -> Result<()> {
        self.sq.push(req, cookie, flags)
    }

    /// Requests in the batch.
    pub fn len(&self) -> usize {
        self.sq.pending as usize
    }

    /// Whether the batch is empty.
    pub fn is_empty(&self) -> bool {
        self.sq.pending == 0
    }

    /// Rings once for the whole batch.
    #[inline(always)]
    pub fn ring(self) {
        self.sq.ring();
        // An empty batch: `ring` had nothing to ring.
        if self.sq.in_batch {
            self.sq.end_batch();
        }
        core::mem::forget(self);
    }
}

impl Drop for Batch<'_> {
    fn drop(&mut self) {
        // Never announced to the device: give the blocks back.
        let fence;
        (self.sq.pi, self.sq.credit, fence) = self.start;
        // The cached limit was computed for the rewound requests' positions: the next post
        // computes it again (`make_room`), with the unsignaled run it bounds.
        self.sq.limit = self.sq.pi;
        self.sq.pending = 0;
        self.sq.in_batch = false;
        self.sq.set_next_fence(fence);
        self.sq.shadow.mark_posted(self.sq.pi);
    }
}

#[cfg(test)]
mod tests;
