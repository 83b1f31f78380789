//! Posting to a queue pair: RDMA write, read, send, atomics and receives, each checked
//! before anything is written and refused whole (nothing half-posted).

use super::{Qp, QpPath};
use crate::error::{Error, Result};
use crate::queue::flags::PostFlags;
use crate::resources::PostSend;
use mlx5::request::Payload;
use mlx5::request::Remote;
use mlx5::request::Request;
use mlx5::request::Sge;

impl PostSend for Qp {
    /// On the verbs path the read goes to rdma-core from its parts (the verbs send queue's
    /// `read`), each arm building the request it needs; otherwise as [`PostSend::post`].
    #[inline(always)]
    fn read(&mut self, sgl: &[Sge], remote: Remote, cookie: u64, flags: PostFlags) -> Result<()> {
        self.check_state()?;
        let r = match &mut self.path {
            // The direct path's read of one buffer inline (`SendQueue::try_read`), any
            // other out of line.
            QpPath::Direct { sq, .. } => match sq.try_read(remote, sgl, cookie, flags) {
                true => Ok(()),
                false => sq.post_out_of_line(Request::Read { remote, sgl }, cookie, flags),
            },
            QpPath::Verbs { sq, .. } => sq.read(sgl, remote, cookie, flags),
        };
        match r {
            Ok(()) => Ok(()),
            Err(e) => Err(self.explain(e)),
        }
    }

    #[inline(always)]
    fn post(&mut self, req: &Request<'_>, cookie: u64, flags: PostFlags) -> Result<()> {
        self.check_state()?;
        let r = match &mut self.path {
            // The direct path's one-block fast paths inline (`SendQueue::try_one_block`:
            // an inline send; a read, write or send of one buffer), any other request out
            // of line.
            QpPath::Direct { sq, .. } => match sq.try_one_block(req, cookie, flags) {
                true => Ok(()),
                false => sq.post_out_of_line(*req, cookie, flags),
            },
            QpPath::Verbs { sq, .. } => sq.post_one(req, cookie, flags),
        };
        match r {
            Ok(()) => Ok(()),
            Err(e) => Err(self.explain(e)),
        }
    }

    /// The direct path's fast path for small inline writes: a request that fits is written
    /// straight into the ring without building a [`Request`].
    #[inline(always)]
    fn write_inline(
        &mut self,
        data: &[u8],
        remote: Remote,
        cookie: u64,
        flags: PostFlags,
    ) -> Result<()> {
        if let QpPath::Direct { sq, .. } = &mut self.path {
            // The direct path's fast path for small inline writes (off until connected).
            if sq.try_write_inline(data, remote, cookie, flags) {
                return Ok(());
            }
            // A queue on a shared BlueFlame register: the same WQE, rung under the
            // register's spin lock (rdma-core takes `bf->lock` for every post on a shared
            // register, nothing more). Inlined whole: as a call (here, or in the cold
            // function) it cost the dedicated path 11 instructions of register saves, or
            // itself a frame (158 and 179 instructions a post, against 77).
            if sq.try_write_inline_shared(data, remote, cookie, flags) {
                return Ok(());
            }
        }
        // The verbs path's usual write with the flags as constants (a caller's flags are
        // constants as a rule: folded here, the frame below computes no moderation from
        // them, 15 instructions of its post); any other flags, the general path. The
        // outcome comes back in a register and a refusal's error by way of the QP
        // (`Qp::take_refusal`): the frame needs no result in memory, and its arguments
        // arrive where the caller has them.
        let refused = match flags {
            PostFlags::SIGNALED => self.write_inline_verbs::<true>(data, remote, cookie),
            PostFlags::UNSIGNALED => self.write_inline_verbs::<false>(data, remote, cookie),
            _ => return self.write_inline_rest(&InlineWrite { data, remote }, cookie, flags),
        };
        match refused {
            None => Ok(()),
            Some(qp) => Err(qp.take_refusal()),
        }
    }
}

/// An inline write's payload and destination, handed to [`Qp::write_inline_rest`] by
/// reference (four stores in the caller; a [`Request`] took six, and the callee matched its
/// two tags again).
struct InlineWrite<'a> {
    data: &'a [u8],
    remote: Remote,
}

impl Qp {
    /// [`Qp::write_inline`] when the direct path's fast paths did not take it: on the
    /// verbs path, the send queue's usual inline write
    /// ([`VerbsSendQueue::write_inline_straight`]), in a frame of its own (through the
    /// cold function, which keeps every request kind's registers, it cost 70 instructions
    /// more than a send; inlined in `write_inline`, it cost the direct path's fast path
    /// 15); anything else, [`Qp::write_inline_rest`] (with the send queue's general inline
    /// write inlined here, this frame saved six registers and spilled three values across
    /// rdma-core's calls). None when posted; when refused, the QP itself, its error kept
    /// for [`Qp::take_refusal`].
    ///
    /// Its arguments are the caller's own and its outcome a register: with a `Result` in
    /// memory and the payload behind a reference (stores in the caller, loads here), the
    /// post cost 17 instructions more on libmlx5 (383.0 -> 365.9, `cargo xtask icount`'s
    /// verbs table). The QP coming back for a refusal, the caller keeps nothing across the
    /// call: a `bool` had it keep `self` in a saved register, which cost the direct path's
    /// write one instruction (62.7 -> 61.7) and this post two. (A stop before found the
    /// direct path paying two saved registers for an outcome in a register; with the
    /// arguments in registers too, it pays nothing.)
    ///
    /// One instance per flags [`Qp::write_inline`] tells apart ([`PostFlags::SIGNALED`]
    /// when `SIGNALED`, else [`PostFlags::UNSIGNALED`]).
    ///
    /// [`VerbsSendQueue::write_inline_straight`]: crate::verbs::sq::VerbsSendQueue::write_inline_straight
    #[inline(never)]
    fn write_inline_verbs<const SIGNALED: bool>(
        &mut self,
        data: &[u8],
        remote: Remote,
        cookie: u64,
    ) -> Option<&mut Qp> {
        let flags = match SIGNALED {
            true => PostFlags::SIGNALED,
            false => PostFlags::UNSIGNALED,
        };
        if let (QpPath::Verbs { sq, .. }, true) = (&mut self.path, self.connected) {
            match sq.write_inline_straight(data, remote, cookie, flags) {
                Some(0) => return None,
                Some(rc) => {
                    let e = self.write_refused(rc);
                    return self.park_refusal(e);
                }
                None => {}
            }
        }
        match self.write_inline_rest(&InlineWrite { data, remote }, cookie, flags) {
            Ok(()) => None,
            Err(e) => self.park_refusal(e),
        }
    }

    /// Keeps `e`, the error of a post refused in [`Qp::write_inline_verbs`]' frame, for its
    /// caller ([`Qp::take_refusal`]); the QP, [`Qp::write_inline_verbs`]' refusal.
    #[cold]
    #[inline(never)]
    fn park_refusal(&mut self, e: Error) -> Option<&mut Qp> {
        self.refusal = Some(e);
        Some(self)
    }

    /// The error [`Qp::park_refusal`] kept, taken (the next refusal keeps its own).
    #[cold]
    #[inline(never)]
    fn take_refusal(&mut self) -> Error {
        // Always Some after `write_inline_verbs` returned the QP, its only caller's case.
        self.refusal.take().unwrap_or(Error::InvalidState {
            state: "a refused inline write whose error was not kept",
        })
    }

    /// rdma-core refused the inline write [`Qp::write_inline_verbs`] posted straight, with
    /// `rc` (nothing posted, the queue as before it): the error.
    #[cold]
    #[inline(never)]
    fn write_refused(&self, rc: i32) -> Error {
        let e = match &self.path {
            QpPath::Verbs { sq, .. } => sq.refused(rc),
            _ => unreachable!("only after a verbs post"),
        };
        self.explain(e)
    }

    /// [`Qp::write_inline_verbs`] when the usual case did not take it: on the verbs path,
    /// the send queue's own inline write; on the direct path, the send queue's general
    /// inline write (its fast paths again once it took more room); on a QP not known to be
    /// connected, [`Qp::write_inline_cold`].
    #[inline(never)]
    fn write_inline_rest(
        &mut self,
        w: &InlineWrite<'_>,
        cookie: u64,
        flags: PostFlags,
    ) -> Result<()> {
        let r = match (&mut self.path, self.connected) {
            (QpPath::Verbs { sq, .. }, true) => sq.write_inline(w.data, w.remote, cookie, flags),
            // The direct path's fast paths did not take it (its cached room spent, a longer
            // payload, a fence): the queue's own general path, which takes more room and
            // tries them again first.
            (QpPath::Direct { sq, .. }, true) => {
                sq.write_inline_general(w.data, w.remote, cookie, flags)
            }
            _ => {
                let req = Request::Write {
                    remote: w.remote,
                    data: Payload::Inline(w.data),
                };
                return self.write_inline_cold(&req, cookie, flags);
            }
        };
        match r {
            Ok(()) => Ok(()),
            Err(e) => Err(self.explain(e)),
        }
    }

    /// [`Qp::write_inline`] (`req`, an inline write) on a QP not connected yet:
    /// [`Qp::post`], which refuses it. Out of line, the
    /// request built only on the way here: the direct path's fast path keeps its arguments
    /// where they arrived.
    #[cold]
    #[inline(never)]
    fn write_inline_cold(
        &mut self,
        req: &Request<'_>,
        cookie: u64,
        flags: PostFlags,
    ) -> Result<()> {
        self.post(req, cookie, flags)
    }

    /// Posts a receive buffer list. Before [`Qp::connect`] too (the QP is created in INIT,
    /// as verbs require of a receive: IBA C10-97.2.1), the usual way to have receives ready
    /// for the peer's first send: they wait, consumed by nothing, until the QP is
    /// connected (a message reaching it before is not answered).
    ///
    /// # Errors
    /// [`Error::SrqQp`] when the QP takes its receives from an SRQ;
    /// [`Error::Unsupported`] when the QP has no receive queue; [`Error::QueueFull`];
    /// [`Error::CqFull`] when the receive CQ has no room left for the completion;
    /// [`Error::TooManySge`]; [`Error::InvalidParameter`] with the length of an entry of
    /// 2^31 bytes or more (on every path: nothing is posted), and on the verbs path of mlx5
    /// for an lkey outside every CPU-writable region of the domain; on the verbs path, the
    /// `ibv_post_recv` error ([`Error::Verbs`]). A full queue or CQ is reported as the
    /// [`Error::AsyncEvent`] that explains it, when the device reported one.
    #[inline(always)]
    pub fn post_recv(&mut self, sgl: &[Sge], cookie: u64) -> Result<()> {
        // Each path's usual receive inlined, the rest a call: with the direct path's
        // general one inlined too, this function was too large to inline and the verbs
        // path paid its frame (rxe-icount: 274 -> 286); with the direct path a call of its
        // own, the direct receive cost 157 instructions instead of 131.5 (icount).
        if let QpPath::Verbs { .. } = self.path {
            return self.post_recv_verbs(sgl, cookie);
        }
        // The direct path's usual receive, one entry while the queue's room lasts.
        if let (QpPath::Direct { rq: Some(rq), .. }, None, [s]) = (&mut self.path, &self.srq, sgl) {
            if rq.post_one(s, cookie) {
                return Ok(());
            }
        }
        self.post_recv_direct(sgl, cookie)
    }

    /// [`Qp::post_recv`] on the direct path when the usual receive did not take it, out of
    /// line: the queue's general path (not `post`, whose fast path was tried already).
    #[inline(never)]
    fn post_recv_direct(&mut self, sgl: &[Sge], cookie: u64) -> Result<()> {
        let r = match &mut self.path {
            QpPath::Direct { rq: Some(rq), .. } if self.srq.is_none() => {
                rq.post_general(sgl, cookie)
            }
            _ => return Err(self.no_receive_queue()),
        };
        r.map_err(|e| self.explain(e))
    }

    /// [`Qp::post_recv`] on the verbs path, inlined beside the direct path's usual receive:
    /// the caller saves its registers once for both (out of line, this function saved them
    /// again, and the receive cost 274 instructions on rxe instead of 252.5; rxe-icount).
    /// One buffer while the queue's cached room lasts is posted straight; everything else
    /// takes [`Qp::post_recv_verbs_general`], as does nothing on this path.
    #[inline(always)]
    fn post_recv_verbs(&mut self, sgl: &[Sge], cookie: u64) -> Result<()> {
        if let (QpPath::Verbs { rq: Some(rq), .. }, [s]) = (&mut self.path, sgl) {
            match rq.post_one(s, cookie) {
                Some(0) => return Ok(()),
                Some(rc) => return Err(self.recv_refused(rc)),
                None => {}
            }
        }
        self.post_recv_verbs_general(sgl, cookie)
    }

    /// [`Qp::post_recv`] on the verbs path, every case.
    #[inline(never)]
    fn post_recv_verbs_general(&mut self, sgl: &[Sge], cookie: u64) -> Result<()> {
        match &mut self.path {
            QpPath::Verbs { rq: Some(rq), .. } => rq.post(sgl, cookie).map_err(|e| self.explain(e)),
            // A verbs QP on an SRQ has no receive queue (`rq` is None).
            _ => Err(self.no_receive_queue()),
        }
    }

    /// `ibv_post_recv` refused the receive [`Qp::post_recv_verbs`] posted, with `rc`.
    #[cold]
    #[inline(never)]
    fn recv_refused(&mut self, rc: i32) -> Error {
        let e = match &mut self.path {
            QpPath::Verbs { rq: Some(rq), .. } => rq.unpost(rc),
            _ => unreachable!("only after a verbs receive"),
        };
        self.explain(e)
    }

    /// Why this QP takes no receive of its own: its SRQ, or no receive queue at all.
    #[cold]
    fn no_receive_queue(&self) -> Error {
        match &self.srq {
            Some(s) => Error::SrqQp {
                qpn: self.qpn,
                srqn: s.srqn,
            },
            None => Error::Unsupported("QP has no receive queue"),
        }
    }
}
