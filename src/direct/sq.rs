//! The send queue of the direct path: WQEs written straight into the ring, cookies into the
//! shadow table, one doorbell per post or per batch.

use super::doorbell::Doorbell;
use super::inline_write::FAST_INLINE_MAX;
use super::register::{self, DoorbellMode};
use crate::completion::WcOpcode;
use crate::error::{Error, QueueUnit, Result};
use crate::queue::checks::{check_atomic, check_atomic_kind, MASKED_ATOMICS};
use crate::queue::cq_share::{CqShare, CqSlots};
use crate::queue::flags::PostFlags;
use crate::queue::shadow::{SendEntry, Shadow};
use mlx5::ctrl::{CompletionMode, Fence, FmCeSe};
use mlx5::doorbell::SEND_WQE_BB;
use mlx5::request::{Access, MwType, Payload, Request};
use mlx5::wqe::{ds_to_bbs, encode, wqe_ds, Limits, Span};
use mlx5::{AtomicCaps, RawQp};
use std::sync::Arc;

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
    /// moderation: half the ring after each signaled WQE).
    pub(super) credit: u32,
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
    /// ([`DoorbellMode::Dedicated`]) of at least one block, a fence armed for the next WQE, or the owner has not enabled it (a QP before
    /// `connect`). One compare checks all of it.
    pub(super) fast_limit: usize,
    bf_ok: bool,
    enabled: bool,
    /// What the device's atomics can do (read once when the QP is created).
    atomics: AtomicCaps,
    /// BlueFlame copies only for WQEs with inline data (`MLX5_POST_SEND_PREFER_BF=0`).
    bf_inline_only: bool,
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

pub(super) fn wc_opcode(req: &Request<'_>) -> (WcOpcode, u32) {
    match req {
        Request::Nop => (WcOpcode::Nop, 0),
        Request::Write { .. } | Request::WriteImm { .. } => (WcOpcode::RdmaWrite, 0),
        // Checked by `message_len` before anything is written: the sum fits.
        Request::Read { sgl, .. } => (
            WcOpcode::RdmaRead,
            sgl.iter().fold(0u32, |t, s| t.wrapping_add(s.len)),
        ),
        Request::Send { .. } | Request::SendImm { .. } | Request::SendInv { .. } => {
            (WcOpcode::Send, 0)
        }
        Request::CompareSwap { .. } => (WcOpcode::CompSwap, 8),
        Request::FetchAdd { .. } => (WcOpcode::FetchAdd, 8),
        Request::Masked { op, .. } => (
            if op.is_cs() {
                WcOpcode::MaskedCompSwap
            } else {
                WcOpcode::MaskedFetchAdd
            },
            op.size(),
        ),
        Request::LocalInvalidate { .. } => (WcOpcode::LocalInv, 0),
        Request::BindMw(_) => (WcOpcode::BindMw, 0),
        _ => (WcOpcode::Unknown, 0),
    }
}

impl SendQueue {
    /// A send queue over the rings of `raw`.
    ///
    /// # Safety
    /// `raw` must describe a live QP (send ring of `sq_wqe_cnt` 64-byte blocks, doorbell record,
    /// BlueFlame register of `2 * bf_size` bytes) that stays alive while the queue exists and
    /// that nothing else posts to.
    ///
    /// The register is taken as one other queues may ring too
    /// ([`DoorbellMode::SharedLocked`]: every ring takes the register's lock), or
    /// [`DoorbellMode::DoorbellOnly`] without BlueFlame.
    ///
    /// A queue made here does not know its QP's transport nor the memory windows the
    /// crate's [`MemoryWindow`](crate::MemoryWindow)s track: it takes every post function
    /// ([`SendQueue::post`] / [`SendQueue::push`], [`SendQueue::post_ud`],
    /// [`SendQueue::post_dc`]) and [`Request::BindMw`] through [`SendQueue::post`], and a
    /// request the QP's transport does not carry, or a bind the NIC refuses, fails there
    /// (a local QP operation or memory-window bind error) and moves the QP to error. The
    /// queues of the crate's QPs know both and refuse them
    /// before posting.
    ///
    /// # Errors
    /// [`Error::InvalidParameter`] for ring sizes or a BlueFlame size the hardware never
    /// gives; [`Error::RegisterInUse`] when the register is claimed as dedicated by a live queue.
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
        let claim = register::claim(raw.bf_reg, raw.bf_size as usize, dedicated).map_err(|e| {
            Error::RegisterInUse {
                addr: e.addr as u64,
            }
        })?;
        let shadow = Arc::new(Shadow::new(cnt));
        // The fast path rings through `ring_bf_block`, which has no lock: only on a register
        // of the queue's own (a shared one goes through `ring`, which takes the lock).
        let bf_ok = raw.bf_size as usize >= SEND_WQE_BB && claim.mode == DoorbellMode::Dedicated;
        Ok(SendQueue {
            buf: raw.sq_buf,
            cnt,
            mask: cnt - 1,
            qpn: raw.qpn,
            limits: Limits {
                max_sge: raw.max_send_sge as usize,
                max_inline: raw.max_inline as usize,
            },
            pi: 0,
            limit: cnt as u16,
            in_batch: false,
            cq_share: None,
            // SAFETY: the caller guarantees a live record and register for our lifetime; the
            // claim is this register's, dedicated only under `new_dedicated`'s contract.
            db: unsafe { Doorbell::new(raw.dbrec, raw.bf_reg, raw.bf_size as usize, claim) },
            slots: shadow.slots(),
            shadow,
            credit: cnt / 2,
            half: cnt / 2,
            next_fence: Fence::None,
            pending: 0,
            last_start: 0,
            qpn_ds: [0, 1, 2, 3, 4].map(|ds| (raw.qpn << 8 | ds).to_be()),
            fast_limit: if bf_ok {
                FAST_INLINE_MAX.min(raw.max_inline as usize) + 1
            } else {
                0
            },
            bf_ok,
            enabled: true,
            atomics: AtomicCaps::CONNECTX,
            bf_inline_only: false,
            transport: None,
            not_rc: false,
        })
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
    pub fn ring_blocks(&self) -> u32 {
        self.cnt
    }

    /// Accounts this queue's WQEs against the entries of the CQ it completes on: from now
    /// on it never posts beyond its charge on the CQ (see `cq_share`).
    pub(crate) fn attach_cq(&mut self, slots: Arc<CqSlots>) {
        self.cq_share = Some(CqShare::new(slots, self.shadow.clone(), self.pi));
        // No allowance yet: the next post takes some on the cold path.
        self.limit = self.pi;
    }

    /// The queue goes away: its allowance on the CQ is free at once, its outstanding
    /// requests once their completions are consumed.
    pub(crate) fn release_cq(&mut self) {
        if let Some(s) = &mut self.cq_share {
            s.release(self.pi);
        }
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
        let on = self.bf_ok && self.enabled && self.next_fence == Fence::None && !self.not_rc;
        self.fast_limit = if on {
            FAST_INLINE_MAX.min(self.limits.max_inline) + 1
        } else {
            0
        };
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
        // SAFETY: `slots` has `cnt` entries (kept alive by `shadow`) and `i < cnt`; only the
        // poster writes, and only positions the device has not been told about (see
        // `Shadow`'s `Sync` impl).
        unsafe {
            self.slots.add(i).write(SendEntry {
                cookie,
                bbs,
                opcode,
                byte_len,
                report,
            })
        };
    }

    /// The limits the QP was created with.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Bytes of one BlueFlame write (0: doorbell only).
    pub fn bf_size(&self) -> usize {
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

    /// Writes one WQE without ringing (see [`SendQueue::ring`]). Checks everything first: on
    /// an error nothing is written.
    ///
    /// # Errors
    /// [`Error::QueueFull`], [`Error::TooManySge`], [`Error::InlineTooLong`],
    /// [`Error::WqeTooLarge`], [`Error::Misaligned`], [`Error::BindTooLong`];
    /// [`Error::InvalidParameter`] for a write, send or read of more than 2^31 bytes (the
    /// sum of its entries, in the error); for atomics [`Error::Unsupported`] (the device
    /// lacks them) and [`Error::AtomicLength`]. On the queue of one of the crate's QPs,
    /// [`Error::Unsupported`] for [`Request::BindMw`] (bind with
    /// [`Qp::bind_mw`](crate::Qp::bind_mw), unbind with
    /// [`Qp::unbind_mw`](crate::Qp::unbind_mw)) and on a UD QP's or DCI's queue.
    #[inline(always)]
    pub fn push(&mut self, req: &Request<'_>, cookie: u64, flags: PostFlags) -> Result<()> {
        if let Request::Write {
            remote,
            data: Payload::Inline(data),
        } = req
        {
            // Small inline writes: the fast path, or the general one out of line.
            if !self.fast_inline_applies(data.len(), flags) {
                return self.push_outlined(*req, cookie, flags);
            }
            self.last_start = self.pi;
            self.push_inline_write(data, *remote, cookie, flags);
            self.pending += 1;
            return Ok(());
        }
        self.push_general(req, cookie, flags)
    }

    /// [`SendQueue::push_general`], not inlined; the request by value, so that the inlined
    /// fast path need not keep it in memory.
    #[inline(never)]
    fn push_outlined(&mut self, req: Request<'_>, cookie: u64, flags: PostFlags) -> Result<()> {
        self.push_general(&req, cookie, flags)
    }

    /// Every request of the generic post: [`SendQueue::push_checked`] with the public
    /// entries' refusals.
    #[inline(always)]
    fn push_general(&mut self, req: &Request<'_>, cookie: u64, flags: PostFlags) -> Result<()> {
        self.push_checked::<false>(req, cookie, flags)
    }

    /// Posts a memory-window request (a bind, or the local invalidate that unbinds a type-2
    /// window) and rings: the crate's entry for [`Qp::bind_mw`](crate::Qp::bind_mw) and
    /// [`Qp::unbind_mw`](crate::Qp::unbind_mw), which made their checks and track the
    /// window. Everything else as [`SendQueue::post`].
    pub(crate) fn post_window(
        &mut self,
        req: &Request<'_>,
        cookie: u64,
        flags: PostFlags,
    ) -> Result<()> {
        self.push_checked::<true>(req, cookie, flags)?;
        self.ring();
        Ok(())
    }

    /// Every request: checks, encodes, records. The queue of one of the crate's QPs that
    /// is not RC's refuses every request, and an RC QP's refuses window requests unless
    /// `BIND` (the caller is the crate's entry, [`SendQueue::post_window`]).
    #[inline(always)]
    fn push_checked<const BIND: bool>(
        &mut self,
        req: &Request<'_>,
        cookie: u64,
        flags: PostFlags,
    ) -> Result<()> {
        if self.not_rc {
            return Err(self.refuse_rc());
        }
        match req {
            Request::CompareSwap { remote, local, .. }
            | Request::FetchAdd { remote, local, .. } => {
                check_atomic(self.atomics.standard, remote.addr, local.len, 8)?;
            }
            Request::Masked { remote, op, local } => {
                let masked = self.atomics.masked;
                check_atomic_kind(masked, MASKED_ATOMICS, remote.addr, local.len, op.size())?;
            }
            Request::LocalInvalidate { .. } if !BIND && self.transport.is_some() => {
                return Err(Error::window_request());
            }
            Request::BindMw(b) => {
                // Only the crate's own binds, which checked the window, the region and the
                // rights and track the window's key; a raw queue's are its caller's.
                if !BIND && self.transport.is_some() {
                    return Err(Error::window_request());
                }
                // rdma-core's mlx5_bind_mw: a type-1 window is never zero-based (EINVAL).
                if b.mw_type == MwType::One && b.access.contains(Access::ZERO_BASED) {
                    return Err(Error::InvalidParameter {
                        what: "ZERO_BASED with a type-1 memory window (window rights)",
                        value: b.access.0 as u64,
                    });
                }
            }
            Request::Read { sgl, .. } => {
                crate::queue::checks::message_len(sgl)?;
            }
            Request::Write {
                data: Payload::Sgl(sgl),
                ..
            }
            | Request::WriteImm {
                data: Payload::Sgl(sgl),
                ..
            }
            | Request::Send {
                data: Payload::Sgl(sgl),
            }
            | Request::SendImm {
                data: Payload::Sgl(sgl),
                ..
            }
            | Request::SendInv {
                data: Payload::Sgl(sgl),
                ..
            } => {
                crate::queue::checks::message_len(sgl)?;
            }
            _ => {}
        }
        let ds = wqe_ds(req, &self.limits)?;
        let bbs = ds_to_bbs(ds);
        if bbs as u32 > self.limit.wrapping_sub(self.pi) as u32 {
            self.make_room(bbs as u32)?;
        }
        // Completion moderation: an unsignaled run longer than half the ring gets one WQE
        // signaled, so the ring can be reclaimed; its success is not reported.
        let mut report = flags.signaled;
        let signal = flags.signaled || bbs as u32 > self.credit;
        if signal {
            self.credit = self.half;
        } else {
            self.credit -= bbs as u32;
            report = false;
        }
        let fence = if flags.fence != Fence::None {
            flags.fence
        } else {
            self.next_fence
        };
        let next_fence = match req {
            Request::BindMw(_) | Request::LocalInvalidate { .. } => Fence::InitiatorSmall,
            _ => Fence::None,
        };
        if next_fence != self.next_fence {
            self.set_next_fence(next_fence);
        }
        let fm = FmCeSe {
            fence,
            completion: if signal {
                CompletionMode::Always
            } else {
                CompletionMode::OnError
            },
            solicited: flags.solicited,
        };
        let pi = self.pi;
        let first = ((self.cnt - (pi as u32 & (self.cnt - 1))) as usize).min(bbs);
        // SAFETY: blocks pi .. pi + bbs are free (retired by the poller, or never used) and not
        // yet announced to the device, so nobody reads or writes them; `a` runs from block pi
        // to at most the ring end, `b` from the ring start: disjoint, inside the ring.
        let mut span = unsafe {
            Span {
                a: core::slice::from_raw_parts_mut(self.block(pi), first * SEND_WQE_BB),
                b: core::slice::from_raw_parts_mut(self.buf, (bbs - first) * SEND_WQE_BB),
            }
        };
        encode(req, ds, pi, self.qpn, fm, &mut span);
        let (opcode, byte_len) = wc_opcode(req);
        let end = pi.wrapping_add(bbs as u16);
        self.record(pi, cookie, bbs as u16, opcode, byte_len, report);
        self.pi = end;
        self.pending += 1;
        self.last_start = pi;
        Ok(())
    }

    /// Writes one WQE of `ds` DS that another transport's encoder builds (UD and DC:
    /// `write(span, pi, qpn, fm)`), with everything [`SendQueue::push_general`] does around
    /// the encoding: room in the ring and on the CQ, completion moderation, the fence armed
    /// by an earlier bind, the shadow entry. Kept apart from `push_general` so that the RC
    /// post path stays as it is (`cargo xtask icount`). Nothing is written on an error.
    #[inline]
    pub(super) fn push_encoded(
        &mut self,
        ds: usize,
        cookie: u64,
        flags: PostFlags,
        (opcode, byte_len): (WcOpcode, u32),
        write: impl FnOnce(&mut Span<'_>, u16, u32, FmCeSe),
    ) -> Result<()> {
        let bbs = ds_to_bbs(ds);
        if bbs as u32 > self.limit.wrapping_sub(self.pi) as u32 {
            self.make_room(bbs as u32)?;
        }
        let mut report = flags.signaled;
        let signal = flags.signaled || bbs as u32 > self.credit;
        if signal {
            self.credit = self.half;
        } else {
            self.credit -= bbs as u32;
            report = false;
        }
        let fence = if flags.fence != Fence::None {
            flags.fence
        } else {
            self.next_fence
        };
        if self.next_fence != Fence::None {
            self.set_next_fence(Fence::None);
        }
        let fm = FmCeSe {
            fence,
            completion: if signal {
                CompletionMode::Always
            } else {
                CompletionMode::OnError
            },
            solicited: flags.solicited,
        };
        let pi = self.pi;
        let first = ((self.cnt - (pi as u32 & (self.cnt - 1))) as usize).min(bbs);
        // SAFETY: as in `push_general`: blocks pi .. pi + bbs are free and not yet announced
        // to the device; `a` runs from block pi to at most the ring end, `b` from the ring
        // start: disjoint, inside the ring.
        let mut span = unsafe {
            Span {
                a: core::slice::from_raw_parts_mut(self.block(pi), first * SEND_WQE_BB),
                b: core::slice::from_raw_parts_mut(self.buf, (bbs - first) * SEND_WQE_BB),
            }
        };
        write(&mut span, pi, self.qpn, fm);
        self.record(pi, cookie, bbs as u16, opcode, byte_len, report);
        self.pi = pi.wrapping_add(bbs as u16);
        self.pending += 1;
        self.last_start = pi;
        Ok(())
    }

    /// Rings the doorbell for every WQE pushed since the last ring: BlueFlame copy when it is
    /// exactly one WQE that fits, else the 8-byte doorbell.
    #[inline(always)]
    pub fn ring(&mut self) {
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
    }

    /// Whether the WQE at `start` (of `ds` DS) carries inline data: a write or send whose
    /// first data segment has the inline flag (rdma-core's `inl`).
    #[cold]
    fn last_is_inline(&self, start: u16, ds: u8) -> bool {
        let b = self.block(start);
        // SAFETY: the block at `start` holds the WQE just written, inside the ring; the bytes
        // read are within its first 64.
        let opcode = unsafe { *b.add(3) };
        let at = match opcode {
            0x08 | 0x09 => 32,        // RDMA write (with immediate): control, remote address
            0x0a | 0x0b | 0x01 => 16, // send (with immediate / invalidate): control
            _ => return false,
        };
        // SAFETY: as above (at < 64).
        ds as usize * 16 > at && unsafe { *b.add(at) } & 0x80 != 0
    }

    /// rdma-core's `MLX5_POST_SEND_PREFER_BF=0`: BlueFlame copies only for WQEs with inline
    /// data (off by default, as in rdma-core).
    pub fn set_blueflame_inline_only(&mut self, on: bool) {
        self.bf_inline_only = on;
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

    /// Posts one request and rings at once.
    ///
    /// # Errors
    /// As [`SendQueue::push`].
    #[inline(always)]
    pub fn post(&mut self, req: &Request<'_>, cookie: u64, flags: PostFlags) -> Result<()> {
        if let Request::Write {
            remote,
            data: Payload::Inline(data),
        } = req
        {
            return self.write_inline(data, *remote, cookie, flags);
        }
        self.post_general(req, cookie, flags)
    }

    /// [`SendQueue::post`] without the inline-write fast path.
    #[inline(always)]
    pub(super) fn post_general(
        &mut self,
        req: &Request<'_>,
        cookie: u64,
        flags: PostFlags,
    ) -> Result<()> {
        self.push_general(req, cookie, flags)?;
        self.ring();
        Ok(())
    }

    /// Starts a batch: requests are written as they are pushed and rung once by
    /// [`Batch::ring`]. A batch dropped without ringing is rewound: nothing is posted.
    pub fn batch(&mut self) -> Batch<'_> {
        self.ring();
        // Until the batch rings, a region dropped meanwhile must wait for everything the
        // batch may write (up to the cached limit, which `make_room` moves on): mark that
        // far as posted.
        self.in_batch = true;
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
    /// As [`SendQueue::push`]; the requests pushed before stay in the batch.
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
        self.sq.in_batch = false;
        self.sq.shadow.mark_posted(self.sq.pi);
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
        self.sq.set_next_fence(fence);
        self.sq.pending = 0;
        self.sq.in_batch = false;
        self.sq.shadow.mark_posted(self.sq.pi);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlx5::request::{Access, BindMw, MwType};
    use mlx5::wqe::{decode, linearize};

    /// A send queue over plain memory (no NIC): the ring's bytes can be read back.
    #[repr(C, align(64))]
    struct Bf([u8; 512]);

    struct Mem {
        ring: Vec<u8>,
        dbrec: [u32; 2],
        bf: Box<Bf>,
    }

    fn queue(m: &mut Mem) -> SendQueue {
        let raw = RawQp {
            qpn: 0x42,
            sq_buf: m.ring.as_mut_ptr(),
            sq_wqe_cnt: (m.ring.len() / 64) as u32,
            sq_stride: 64,
            rq_buf: core::ptr::null_mut(),
            rq_wqe_cnt: 0,
            rq_stride: 0,
            dbrec: m.dbrec.as_mut_ptr(),
            bf_reg: m.bf.0.as_mut_ptr(),
            bf_size: 256,
            max_inline: 64,
            max_send_sge: 4,
            max_recv_sge: 0,
        };
        // SAFETY: the ring, record and register live in `m`, longer than the queue.
        unsafe { SendQueue::new(&raw) }.unwrap()
    }

    fn mem() -> Mem {
        Mem {
            ring: vec![0; 16 * 64],
            dbrec: [0; 2],
            bf: Box::new(Bf([0; 512])),
        }
    }

    #[test]
    fn a_bind_fences_the_next_request() {
        let mut m = mem();
        let mut sq = queue(&mut m);
        let bind = BindMw {
            mw_rkey: 0x100,
            new_rkey: 0x101,
            mw_type: MwType::Two,
            mr_lkey: 7,
            addr: 0x1000,
            len: 64,
            access: Access::REMOTE_READ,
        };
        sq.post(&Request::BindMw(bind), 1, PostFlags::SIGNALED)
            .unwrap();
        sq.post(&Request::Nop, 2, PostFlags::SIGNALED).unwrap();
        sq.post(&Request::Nop, 3, PostFlags::SIGNALED).unwrap();
        drop(sq);
        let mut sges = [mlx5::Sge::default(); 64];
        let mut lin = [0u8; 1024];
        linearize(&m.ring, 0, 3, &mut lin);
        assert_eq!(decode(&lin, &mut sges).unwrap().flags.fence, Fence::None);
        linearize(&m.ring, 3, 1, &mut lin);
        let nop = decode(&lin[..64], &mut sges).unwrap();
        assert_eq!(
            (nop.request, nop.flags.fence),
            (Request::Nop, Fence::InitiatorSmall)
        );
        linearize(&m.ring, 4, 1, &mut lin);
        assert_eq!(
            decode(&lin[..64], &mut sges).unwrap().flags.fence,
            Fence::None,
            "only the next one"
        );
        // The doorbell record holds the producer index of the last ring.
        assert_eq!(u32::from_be(m.dbrec[1]), 5);
    }

    #[test]
    fn an_explicit_fence_wins_and_errors_write_nothing() {
        let mut m = mem();
        let mut sq = queue(&mut m);
        let flags = PostFlags::SIGNALED.fence(Fence::SmallAndFence);
        sq.post(
            &Request::LocalInvalidate { rkey: 0x200 },
            1,
            PostFlags::SIGNALED,
        )
        .unwrap();
        sq.post(&Request::Nop, 2, flags).unwrap();
        let before = sq.free_blocks();
        let big = [0u8; 65];
        let remote = mlx5::Remote { addr: 0, rkey: 1 };
        let e = sq.post(
            &Request::Write {
                remote,
                data: mlx5::Payload::Inline(&big),
            },
            3,
            PostFlags::SIGNALED,
        );
        assert!(matches!(e, Err(Error::InlineTooLong { len: 65, max: 64 })));
        assert_eq!(sq.free_blocks(), before);
        drop(sq);
        let mut sges = [mlx5::Sge::default(); 64];
        let mut lin = [0u8; 64];
        linearize(&m.ring, 2, 1, &mut lin);
        assert_eq!(
            decode(&lin, &mut sges).unwrap().flags.fence,
            Fence::SmallAndFence
        );
        assert!(
            m.ring[3 * 64..].iter().all(|&b| b == 0),
            "nothing written after the error"
        );
    }

    /// Every kind that gathers, through every post function of the direct path (RC post,
    /// push and batch; UD; DC post and push), is refused past 2^31 bytes in all with the sum
    /// in the error, and nothing is written; exactly 2^31 is a message.
    #[test]
    fn gathers_past_2_pow_31_are_refused_by_every_post_function() {
        let mut m = mem();
        let mut sq = queue(&mut m);
        let e = |len| mlx5::Sge {
            addr: 0x1000,
            len,
            lkey: 7,
        };
        let remote = mlx5::Remote { addr: 0, rkey: 1 };
        let dest = mlx5::dc::DcAddr {
            av: [0; mlx5::dc::AV_BYTES],
            dctn: 5,
            dc_key: 6,
        };
        let f = PostFlags::SIGNALED;
        for sgl in [[e(0x7fff_ffff), e(2)], [e(0x7fff_ffff), e(0x7fff_ffff)]] {
            let total = sgl.iter().map(|s| s.len as u64).sum::<u64>();
            let data = Payload::Sgl(&sgl);
            let reqs = [
                Request::Write { remote, data },
                Request::WriteImm {
                    remote,
                    data,
                    imm: 1,
                },
                Request::Send { data },
                Request::SendImm { data, imm: 1 },
                Request::SendInv { data, rkey: 1 },
            ];
            let ud = mlx5::wqe::UdSend {
                dgram: mlx5::av::DatagramSeg::ud(&mlx5::av::Av::default(), 1, 2),
                data,
                imm: None,
            };
            let mut refused = vec![sq.post_ud(&ud, 0, f)];
            for req in &reqs {
                refused.push(sq.post(req, 0, f));
                refused.push(sq.push(req, 0, f));
                refused.push(sq.batch().push(req, 0, f));
                if !matches!(req, Request::SendInv { .. }) {
                    refused.push(sq.post_dc(&dest, req, 0, f));
                    refused.push(sq.push_dc(&dest, req, 0, f));
                }
            }
            for (i, r) in refused.into_iter().enumerate() {
                assert!(
                    matches!(r, Err(Error::InvalidParameter { value, .. }) if value == total),
                    "{i}: {r:?}"
                );
            }
            assert_eq!(sq.free_blocks(), 16);
        }
        assert!(m.ring.iter().all(|&b| b == 0), "nothing written");
        // 2^31 exactly: a message (it fails at the NIC only for the keys given here).
        let sgl = [e(0x7fff_ffff), e(1)];
        let data = Payload::Sgl(&sgl);
        sq.post(&Request::Write { remote, data }, 1, f).unwrap();
    }

    /// The queue of one of the crate's UD QPs or DCIs refuses RC requests (and the RC
    /// queue UD and DC requests) before anything is written, whatever the entry; the RC
    /// queue refuses a raw bind but the crate's bind entry posts it.
    #[test]
    fn a_crate_queue_refuses_other_transports_and_raw_binds() {
        let mut m = mem();
        let mut sq = queue(&mut m);
        let f = PostFlags::SIGNALED;
        let remote = mlx5::Remote { addr: 0, rkey: 1 };
        let write = Request::Write {
            remote,
            data: Payload::Inline(b"x"),
        };
        let ud = mlx5::wqe::UdSend {
            dgram: mlx5::av::DatagramSeg::ud(&mlx5::av::Av::default(), 1, 2),
            data: Payload::Inline(b"x"),
            imm: None,
        };
        let dest = mlx5::dc::DcAddr {
            av: [0; mlx5::dc::AV_BYTES],
            dctn: 5,
            dc_key: 6,
        };
        for t in [Transport::Ud, Transport::Dci] {
            sq.set_transport(t);
            for r in [
                sq.post(&write, 1, f),
                sq.push(&write, 1, f),
                sq.write_inline(b"x", remote, 1, f),
                sq.batch().push(&Request::Nop, 1, f),
            ] {
                assert!(matches!(r, Err(Error::Unsupported(_))), "{t:?}: {r:?}");
            }
            let other = match t {
                Transport::Ud => sq.post_dc(&dest, &write, 1, f),
                _ => sq.post_ud(&ud, 1, f),
            };
            assert!(matches!(other, Err(Error::Unsupported(_))), "{other:?}");
        }
        sq.set_transport(Transport::Rc);
        assert!(matches!(sq.post_ud(&ud, 1, f), Err(Error::Unsupported(_))));
        let bind = BindMw {
            mw_rkey: 0x100,
            new_rkey: 0x101,
            mw_type: MwType::Two,
            mr_lkey: 7,
            addr: 0x1000,
            len: 64,
            access: Access::REMOTE_READ,
        };
        let r = sq.post(&Request::BindMw(bind), 1, f);
        assert!(matches!(r, Err(Error::Unsupported(_))), "{r:?}");
        assert_eq!(sq.free_blocks(), 16);
        assert!(m.ring.iter().all(|&b| b == 0), "nothing written");
        sq.post_window(&Request::BindMw(bind), 2, f).unwrap();
        // A type-1 zero-based bind stays refused (rdma-core's mlx5_bind_mw).
        let zb = BindMw {
            mw_type: MwType::One,
            access: Access::REMOTE_READ | Access::ZERO_BASED,
            ..bind
        };
        let r = sq.post_window(&Request::BindMw(zb), 3, f);
        assert!(matches!(r, Err(Error::InvalidParameter { .. })), "{r:?}");
    }
}
