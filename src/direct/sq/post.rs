//! The posts of the direct path's send queue: any request checked, encoded into the ring
//! and recorded (`push`, `post`, the crate's window requests), and the WQEs the other
//! transports encode (`push_encoded`).

use super::SendQueue;
use crate::completion::WcOpcode;
use crate::error::{Error, Result};
use crate::queue::flags::PostFlags;
use crate::queue::kind;
use mlx5::ctrl::{CompletionMode, Fence, FmCeSe};
use mlx5::doorbell::SEND_WQE_BB;
use mlx5::opcode::Opcode;
use mlx5::request::{Access, MwType, Payload, Request};
use mlx5::wqe::{ds_to_bbs, encode, wqe_ds, Span};

impl SendQueue {
    /// Writes one WQE without ringing (the crate's batches ring once for many). Checks
    /// everything first: on an error nothing is written.
    ///
    /// # Errors
    /// As [`SendQueue::post`].
    #[inline(always)]
    pub(crate) fn push(&mut self, req: &Request<'_>, cookie: u64, flags: PostFlags) -> Result<()> {
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
            self.push_inline_write(data, *remote, None, cookie, flags);
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
        let r = self.push_checked::<true>(req, cookie, flags);
        self.ring();
        r
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
            _ => kind::check(req, self.atomics, self.max_msg)?,
        }
        let ds = wqe_ds(req, &self.limits)?;
        let bbs = ds_to_bbs(ds);
        let (signal, report) = self.claim(bbs, flags)?;
        let fence = flags.fence.after(self.next_fence);
        let next_fence = if kind::fences_next(req) {
            Fence::InitiatorSmall
        } else {
            Fence::None
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
        let (opcode, byte_len) = kind::completion(req);
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
    pub(in crate::direct) fn push_encoded(
        &mut self,
        ds: usize,
        cookie: u64,
        flags: PostFlags,
        (opcode, byte_len): (WcOpcode, u32),
        write: impl FnOnce(&mut Span<'_>, u16, u32, FmCeSe),
    ) -> Result<()> {
        let bbs = ds_to_bbs(ds);
        let (signal, report) = self.claim(bbs, flags)?;
        let fence = flags.fence.after(self.next_fence);
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

    /// Room for a WQE of `bbs` blocks (in the ring and on the CQ) and its completion
    /// moderation: an unsignaled run longer than half the ring gets one WQE signaled, so the
    /// ring can be reclaimed; its success is not reported. Returns (signal, report).
    #[inline(always)]
    fn claim(&mut self, bbs: usize, flags: PostFlags) -> Result<(bool, bool)> {
        if bbs as u32 > self.limit.wrapping_sub(self.pi) as u32 {
            self.make_room(bbs as u32)?;
        }
        let signal = flags.signaled || bbs as u32 > self.credit;
        if signal {
            self.credit = self.half;
        } else {
            self.credit -= bbs as u32;
        }
        Ok((signal, flags.signaled && signal))
    }

    /// Posts one request and rings at once. Checks everything first: on an error nothing
    /// is written.
    ///
    /// # Errors
    /// [`Error::QueueFull`], [`Error::TooManySge`], [`Error::InlineTooLong`],
    /// [`Error::WqeTooLarge`], [`Error::Misaligned`], [`Error::BindTooLong`];
    /// [`Error::InvalidParameter`] for a write, send or read longer than the port's largest message (the
    /// sum of its entries, in the error); for atomics [`Error::Unsupported`] (the device
    /// lacks them) and [`Error::AtomicLength`]. On the queue of one of the crate's QPs,
    /// [`Error::Unsupported`] for [`Request::BindMw`] (bind with
    /// [`Qp::bind_mw`](crate::Qp::bind_mw), unbind with
    /// [`Qp::unbind_mw`](crate::Qp::unbind_mw)) and on a UD QP's or DCI's queue.
    #[inline(always)]
    pub fn post(&mut self, req: &Request<'_>, cookie: u64, flags: PostFlags) -> Result<()> {
        // The usual one-block requests: their fast paths (`one_block`, then the inline
        // write's in `inline_write_or_general`).
        if self.try_one_block(req, cookie, flags) {
            return Ok(());
        }
        self.inline_write_or_general(req, cookie, flags)
    }

    /// What [`SendQueue::post`] does once `try_one_block` did not take `req`: an inline
    /// write through its own fast path ([`SendQueue::write_inline`]), any other request
    /// through the general path.
    #[inline(always)]
    fn inline_write_or_general(
        &mut self,
        req: &Request<'_>,
        cookie: u64,
        flags: PostFlags,
    ) -> Result<()> {
        if let Request::Write {
            remote,
            data: Payload::Inline(data),
        } = *req
        {
            return self.write_inline(data, remote, cookie, flags);
        }
        self.post_general_outlined(req, cookie, flags)
    }

    /// The fast paths of `one_block` (an inline send; a read, a write or a send of one
    /// buffer), as [`SendQueue::post`] tries them: true when one of them posted `req`.
    #[inline(always)]
    pub(crate) fn try_one_block(
        &mut self,
        req: &Request<'_>,
        cookie: u64,
        flags: PostFlags,
    ) -> bool {
        match *req {
            Request::Send {
                data: Payload::Inline(data),
            } => self.try_send_inline(data, None, cookie, flags),
            Request::Read { remote, sgl } => self.try_read(remote, sgl, cookie, flags),
            // A write or a send of one registered buffer.
            Request::Write {
                remote,
                data: Payload::Sgl(sgl),
            } => {
                let kind = (Opcode::RdmaWrite, WcOpcode::RdmaWrite, 0);
                self.try_one_entry(kind, Some(remote), sgl, cookie, flags)
            }
            Request::Send {
                data: Payload::Sgl(sgl),
            } => {
                let kind = (Opcode::Send, WcOpcode::Send, 0);
                self.try_one_entry(kind, None, sgl, cookie, flags)
            }
            // The same with an immediate: inline, or of one registered buffer.
            Request::WriteImm {
                remote,
                data: Payload::Inline(data),
                imm,
            } => self.try_write_imm_inline(remote, data, imm, cookie, flags),
            Request::WriteImm {
                remote,
                data: Payload::Sgl(sgl),
                imm,
            } => {
                let kind = (Opcode::RdmaWriteImm, WcOpcode::RdmaWrite, imm);
                self.try_one_entry(kind, Some(remote), sgl, cookie, flags)
            }
            Request::SendImm {
                data: Payload::Inline(data),
                imm,
            } => self.try_send_inline(data, Some(imm), cookie, flags),
            Request::SendImm {
                data: Payload::Sgl(sgl),
                imm,
            } => {
                let kind = (Opcode::SendImm, WcOpcode::Send, imm);
                self.try_one_entry(kind, None, sgl, cookie, flags)
            }
            _ => false,
        }
    }

    /// [`SendQueue::post_general`] out of line: the fast paths of [`SendQueue::post`] keep
    /// no register for the general path's encoder. When their cached room was spent, it
    /// takes more and tries them again first.
    #[inline(never)]
    fn post_general_outlined(
        &mut self,
        req: &Request<'_>,
        cookie: u64,
        flags: PostFlags,
    ) -> Result<()> {
        if self.refill_room() && self.try_one_block(req, cookie, flags) {
            return Ok(());
        }
        self.post_general(req, cookie, flags)
    }

    /// [`SendQueue::post`] out of line, for [`Qp::post`](crate::Qp) and `Qp::read` once
    /// they tried [`SendQueue::try_one_block`] inline (so it is not tried again here; the
    /// general path tries it once more only after taking more room). Whose other arm is
    /// the verbs path: inlined there, the general path's request-kind matches cost the verbs
    /// path's posts about 30 instructions of frame and spills (`cargo xtask rxe-icount`: an
    /// inline send 254 -> 291, a read 251 -> 283 on the extended API).
    ///
    /// The request by value (a copy the caller makes in the block that calls this): by
    /// reference, its address taken, the caller wrote the request out before its first
    /// check, four or five stores on every post of `Qp::post`'s fast paths (`cargo xtask
    /// icount`: the inline send 78.7 -> 74.8, the write with immediate 80.8 -> 73.8, the
    /// write of one buffer 83.5 -> 77.5; the verbs path's `push_and_ring` the same way).
    #[inline(never)]
    pub(crate) fn post_out_of_line(
        &mut self,
        req: Request<'_>,
        cookie: u64,
        flags: PostFlags,
    ) -> Result<()> {
        self.inline_write_or_general(&req, cookie, flags)
    }

    /// [`SendQueue::post`] without the inline-write fast path.
    #[inline(always)]
    pub(in crate::direct) fn post_general(
        &mut self,
        req: &Request<'_>,
        cookie: u64,
        flags: PostFlags,
    ) -> Result<()> {
        // A refusal rings too: WQEs of a forgotten batch still pending would otherwise
        // never be rung, and the refusal (for want of room they hold) never end.
        let r = self.push_general(req, cookie, flags);
        self.ring();
        r
    }
}
