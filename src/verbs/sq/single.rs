//! One request posted straight ([`VerbsSendQueue::post_one`],
//! [`VerbsSendQueue::write_inline`]): an RDMA write or send, with or without an immediate,
//! of a few inline bytes or one buffer, or a read into one buffer, handed to rdma-core
//! without a queued work request.

use super::VerbsSendQueue;
use crate::completion::WcOpcode;
use crate::error::{Error, Result};
use crate::queue::flags::PostFlags;
use crate::queue::shadow::SendEntry;
use crate::verbs::code;
use mlx5::ctrl::Fence;
use mlx5::request::Payload;
use mlx5::request::Request;
use rdma_sys as ffi;

/// A request [`VerbsSendQueue::post_single`] posts without a queued work request: an RDMA
/// write or a send, with or without an immediate, of 1 to `max_inline` inline bytes or of
/// one registered buffer (a write or send with immediate also of no bytes at all, the usual
/// notification); or an RDMA read into one buffer.
struct Single {
    opcode: ffi::ibv_wr_opcode::Type,
    wc: WcOpcode,
    /// Bytes a successful completion reports (a read's length).
    byte_len: u32,
    remote: mlx5::request::Remote,
    /// The inline bytes (lkey 0), the one buffer, or (length 0) no data.
    buf: ffi::ibv_sge,
    /// `IBV_SEND_INLINE` or 0.
    inline_flag: u32,
    /// The immediate as the work request carries it (`imm_data`, big-endian); 0 without.
    imm: u32,
}

impl Single {
    /// An RDMA write of the inline bytes `data` (1 to `max_inline`, checked by the caller)
    /// to `remote`.
    #[inline(always)]
    fn inline_write(data: &[u8], remote: mlx5::request::Remote) -> Single {
        Single {
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
            imm: 0,
        }
    }

    /// `req` as a [`Single`], when it is one (a gather entry of at most `one_max` bytes:
    /// the port's largest message).
    #[inline(always)]
    fn of(req: &Request<'_>, max_inline: usize, one_max: u32) -> Option<Single> {
        use ffi::ibv_wr_opcode as O;
        let none = mlx5::request::Remote { addr: 0, rkey: 0 };
        let (opcode, wc, remote, data, imm) = match *req {
            Request::Write { remote, data } => (
                O::IBV_WR_RDMA_WRITE,
                WcOpcode::RdmaWrite,
                remote,
                data,
                None,
            ),
            Request::WriteImm { remote, data, imm } => (
                O::IBV_WR_RDMA_WRITE_WITH_IMM,
                WcOpcode::RdmaWrite,
                remote,
                data,
                Some(imm),
            ),
            Request::Send { data } => (O::IBV_WR_SEND, WcOpcode::Send, none, data, None),
            Request::SendImm { data, imm } => (
                O::IBV_WR_SEND_WITH_IMM,
                WcOpcode::Send,
                none,
                data,
                Some(imm),
            ),
            Request::Read { remote, sgl } => return Single::read(remote, sgl, one_max),
            _ => return None,
        };
        let (buf, inline_flag) = match data {
            // Inline bytes, or none with an immediate (nothing to copy: no inline flag, as
            // the queued path stages an empty payload).
            Payload::Inline(b) if b.len() <= max_inline && (!b.is_empty() || imm.is_some()) => {
                let flag = match b.is_empty() {
                    true => 0,
                    false => ffi::ibv_send_flags::IBV_SEND_INLINE.0,
                };
                let buf = ffi::ibv_sge {
                    addr: b.as_ptr() as u64,
                    length: b.len() as u32,
                    lkey: 0,
                };
                (buf, flag)
            }
            Payload::Sgl(sgl) => (one_buffer(sgl, one_max)?, 0),
            _ => return None,
        };
        Some(Single {
            opcode,
            wc,
            byte_len: 0,
            remote,
            buf,
            inline_flag,
            imm: imm.map_or(0, u32::to_be),
        })
    }

    /// An RDMA read of `remote` into `sgl`, when it is one non-empty buffer.
    #[inline(always)]
    fn read(
        remote: mlx5::request::Remote,
        sgl: &[mlx5::request::Sge],
        one_max: u32,
    ) -> Option<Single> {
        let buf = one_buffer(sgl, one_max)?;
        Some(Single {
            opcode: ffi::ibv_wr_opcode::IBV_WR_RDMA_READ,
            wc: WcOpcode::RdmaRead,
            byte_len: buf.length,
            remote,
            buf,
            inline_flag: 0,
            imm: 0,
        })
    }
}

/// `sgl` as the one gather entry of a straight post, when it is one non-empty buffer the
/// queued path would take as it is (at most `one_max` bytes: `MAX_SGE_BYTES` and the
/// port's largest message; the queued path refuses a longer one).
#[inline(always)]
fn one_buffer(sgl: &[mlx5::request::Sge], one_max: u32) -> Option<ffi::ibv_sge> {
    match *sgl {
        [s] if s.len != 0 && s.len <= one_max => Some(ffi::ibv_sge {
            addr: s.addr,
            length: s.len,
            lkey: s.lkey,
        }),
        _ => None,
    }
}

impl VerbsSendQueue {
    /// Posts one request now ([`crate::Qp::post`]). A [`Single`] request (an RDMA write
    /// or send, with or without an immediate, of a few inline bytes or one buffer; a read
    /// into one buffer), with nothing queued, no fence and no fence pending, goes to
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
        if self.straight(flags) {
            if let Some(one) = Single::of(req, self.max_inline, self.one_max) {
                // An inline write or send and a read here; the other forms in a frame of
                // their own: inlined beside the direct path's in `Qp::post`, they cost its
                // write of one buffer and its inline write with immediate three
                // instructions each (`cargo xtask icount`: 90.6 -> 93.6, 88.8 -> 91.8),
                // and the frame costs the verbs path's inline write with immediate about 65
                // (391.5 -> 458.3 on libmlx5; queued, it cost 756).
                return match req {
                    Request::Write {
                        data: Payload::Inline(_),
                        ..
                    }
                    | Request::Send {
                        data: Payload::Inline(_),
                    }
                    | Request::Read { .. } => self.post_single(&one, cookie, flags),
                    _ => self.post_single_apart(&one, cookie, flags),
                };
            }
        }
        self.push_and_ring(*req, cookie, flags)
    }

    /// [`VerbsSendQueue::post_single`] out of line (see [`VerbsSendQueue::post_one`]).
    #[inline(never)]
    fn post_single_apart(&mut self, one: &Single, cookie: u64, flags: PostFlags) -> Result<()> {
        self.post_single(one, cookie, flags)
    }

    /// Whether a request with `flags` may go to rdma-core straight (`post_single`):
    /// nothing queued, no fence asked for and none pending.
    #[inline(always)]
    fn straight(&self, flags: PostFlags) -> bool {
        self.pending == 0 && !self.fence_next && flags.fence == Fence::None
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
        remote: mlx5::request::Remote,
        cookie: u64,
        flags: PostFlags,
    ) -> Result<()> {
        if self.straight(flags) && !data.is_empty() && data.len() <= self.max_inline {
            let one = Single::inline_write(data, remote);
            return self.post_single(&one, cookie, flags);
        }
        let req = Request::Write {
            remote,
            data: Payload::Inline(data),
        };
        self.push_and_ring(req, cookie, flags)
    }

    /// [`VerbsSendQueue::write_inline`]'s usual case, posted straight, in the caller's
    /// frame: `Some(0)` posted, `Some(rc)` refused by rdma-core (nothing posted, the queue
    /// as before it: the caller reports [`VerbsSendQueue::refused`]), None when it is not
    /// that case (nothing done: [`VerbsSendQueue::write_inline`] takes it, with every
    /// check and the error that refuses it). The cached room is renewed out of line when
    /// spent.
    #[inline(always)]
    pub(crate) fn write_inline_straight(
        &mut self,
        data: &[u8],
        remote: mlx5::request::Remote,
        cookie: u64,
        flags: PostFlags,
    ) -> Option<i32> {
        if !(self.straight(flags) && !data.is_empty() && data.len() <= self.max_inline) {
            return None;
        }
        if self.seq == self.room_end && !self.renew_room() {
            return None;
        }
        let one = Single::inline_write(data, remote);
        Some(self.post_single_now(&one, cookie, flags))
    }

    /// [`VerbsSendQueue::write_inline_straight`]'s room spent: the cold path of
    /// [`VerbsSendQueue::check_room`], true when there is room again (else the general
    /// path refuses the request with the reason).
    #[cold]
    #[inline(never)]
    fn renew_room(&mut self) -> bool {
        self.refill_room().is_ok()
    }

    /// An RDMA read ([`crate::Qp::read`] on the verbs path): what
    /// [`VerbsSendQueue::post_one`] does with it, from its parts (no request is built unless
    /// it has to be queued: built by the caller, its five stores came before the first
    /// check).
    ///
    /// # Errors
    /// As [`VerbsSendQueue::post_one`].
    #[inline(always)]
    pub fn read(
        &mut self,
        sgl: &[mlx5::request::Sge],
        remote: mlx5::request::Remote,
        cookie: u64,
        flags: PostFlags,
    ) -> Result<()> {
        if self.straight(flags) {
            if let Some(one) = Single::read(remote, sgl, self.one_max) {
                return self.post_single(&one, cookie, flags);
            }
        }
        self.read_queued(sgl, remote, cookie, flags)
    }

    /// [`VerbsSendQueue::read`]'s request queued (push + ring), out of line.
    #[cold]
    #[inline(never)]
    fn read_queued(
        &mut self,
        sgl: &[mlx5::request::Sge],
        remote: mlx5::request::Remote,
        cookie: u64,
        flags: PostFlags,
    ) -> Result<()> {
        self.push_and_ring(Request::Read { remote, sgl }, cookie, flags)
    }

    /// [`VerbsSendQueue::push`] then [`VerbsSendQueue::ring`], out of line (the requests
    /// [`VerbsSendQueue::post_single`] does not take). A refused request rings too: the
    /// requests a forgotten batch (`mem::forget` is safe) left queued would otherwise stay
    /// so, and a refusal for want of the room they hold never end (as on the direct path).
    /// The request by value, as [`SendQueue::post_out_of_line`]'s: the caller builds it in
    /// the block that calls this, not before its first check.
    ///
    /// [`SendQueue::post_out_of_line`]: crate::direct::SendQueue::post_out_of_line
    #[inline(never)]
    fn push_and_ring(&mut self, req: Request<'_>, cookie: u64, flags: PostFlags) -> Result<()> {
        let pushed = self.push(&req, cookie, flags);
        let rung = self.ring();
        pushed.and(rung)
    }

    /// Posts `one` with nothing queued, no fence and none pending (see
    /// [`VerbsSendQueue::post_one`]): the room check (one compare while the cached room
    /// lasts), moderation, the shadow entry, rdma-core's calls; the queue's state changes
    /// only once rdma-core took the request.
    #[inline(always)]
    fn post_single(&mut self, one: &Single, cookie: u64, flags: PostFlags) -> Result<()> {
        self.check_room()?;
        match self.post_single_now(one, cookie, flags) {
            0 => Ok(()),
            rc => Err(self.refused(rc)),
        }
    }

    /// [`VerbsSendQueue::post_single`] once the room is checked: moderation, the shadow
    /// entry, rdma-core's calls; 0, or rdma-core's refusal, after which the queue is as it
    /// was before ([`VerbsSendQueue::unpost`]).
    #[inline(always)]
    fn post_single_now(&mut self, one: &Single, cookie: u64, flags: PostFlags) -> i32 {
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
        // back if rdma-core refuses the request ([`VerbsSendQueue::unpost`], from the
        // position before this one and `unsignaled_before`, kept in the queue rather than
        // across the calls).
        self.unsignaled_before = unsignaled;
        self.unsignaled = if signal { 0 } else { unsignaled + 1 };
        self.seq = seq.wrapping_add(1);
        self.shadow.mark_posted(self.seq);
        let rc = match &self.send_ops {
            // SAFETY: live QP (`self.qp` holds it); `one.buf` names the caller's inline
            // bytes (copied by the call) or a buffer of a registered region; `&mut self`
            // serialises posting.
            Some(ops) => self.completed(unsafe {
                ops.post_one(
                    self.wr_id(seq),
                    send_flags,
                    one.opcode,
                    one.remote.rkey,
                    one.remote.addr,
                    one.imm,
                    &one.buf,
                    one.inline_flag != 0,
                )
            }),
            None => self.post_single_legacy(one, seq, send_flags),
        };
        if rc != 0 {
            self.unpost();
        }
        rc
    }

    /// [`VerbsSendQueue::post_single`] with `ibv_post_send`.
    #[inline(always)]
    fn post_single_legacy(&mut self, one: &Single, seq: u16, send_flags: u32) -> i32 {
        let mut buf = one.buf;
        // Nothing is queued: the first work request is free. The fields the opcode reads
        // are set; the others are not read for it.
        let wr_id = self.wr_id(seq);
        let w = &mut self.wrs[0];
        w.wr_id = wr_id;
        w.next = std::ptr::null_mut();
        w.sg_list = &mut buf;
        // No gather entry for no bytes (a write or send with immediate only).
        w.num_sge = (buf.length != 0) as i32;
        w.opcode = one.opcode;
        w.send_flags = send_flags;
        w.imm_data_invalidated_rkey_union.imm_data = one.imm;
        w.wr.rdma = ffi::rdma_t {
            remote_addr: one.remote.addr,
            rkey: one.remote.rkey,
        };
        let list: *const ffi::ibv_send_wr = w;
        let mut bad = std::ptr::null_mut();
        // SAFETY: live QP; the request and its one gather entry (on this stack) live across
        // the call, which copies them (and the inline bytes).
        let rc = unsafe { ffi::ibv_post_send(self.qp.qp, w, &mut bad) };
        // Posted unless the provider named it (an error without: a failed doorbell).
        super::first_unposted(rc, bad, list, 1).map_or(0, |(_, rc)| rc)
    }

    /// A single request rdma-core refused: the queue's position and moderation go back to
    /// what they were before it (the position before it, `unsignaled_before`; nothing was
    /// posted).
    #[cold]
    #[inline(never)]
    fn unpost(&mut self) {
        self.seq = self.seq.wrapping_sub(1);
        self.unsignaled = self.unsignaled_before;
        self.shadow.mark_posted(self.seq);
    }

    /// The error for a single request rdma-core refused with `rc`, naming the API it was
    /// posted with.
    #[cold]
    #[inline(never)]
    pub(crate) fn refused(&self, rc: i32) -> Error {
        let call = if self.send_ops.is_some() {
            "ibv_wr_complete"
        } else {
            "ibv_post_send"
        };
        Error::Verbs(code(call, rc))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlx5::request::Remote;
    use mlx5::request::Sge;

    /// The requests `post_one` posts without a queued work request: a write or send, with or
    /// without an immediate, of 1 to `max_inline` inline bytes or one non-empty buffer (with
    /// an immediate also of no bytes), a read into one non-empty buffer; nothing else (those
    /// take push + ring, whose checks refuse what must be refused).
    #[test]
    fn single_requests_are_writes_and_sends_of_one_buffer_or_inline_bytes_and_one_buffer_reads() {
        let remote = Remote { addr: 64, rkey: 7 };
        let bytes = [1u8; 16];
        let write = |n: usize| Request::Write {
            remote,
            data: Payload::Inline(&bytes[..n]),
        };
        let w = Single::of(&write(8), 8, mlx5::wqe::MAX_SGE_BYTES)
            .expect("an inline write of max_inline bytes");
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
        assert!(
            Single::of(&write(9), 8, mlx5::wqe::MAX_SGE_BYTES).is_none(),
            "longer than max_inline"
        );
        assert!(
            Single::of(&write(0), 8, mlx5::wqe::MAX_SGE_BYTES).is_none(),
            "empty"
        );
        let send = Request::Send {
            data: Payload::Inline(&bytes[..4]),
        };
        let s = Single::of(&send, 8, mlx5::wqe::MAX_SGE_BYTES).expect("an inline send");
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
        let r = Single::of(
            &Request::Read { remote, sgl: &one },
            8,
            mlx5::wqe::MAX_SGE_BYTES,
        )
        .expect("a read");
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
        // The straight posts name their kind's constants: the same as `kind` says.
        let read = Request::Read { remote, sgl: &one };
        for (req, single) in [(write(8), w), (send, s), (read, r)] {
            let op = crate::queue::kind::verbs_op(&req).expect("a verbs request");
            assert_eq!(single.opcode, super::super::ibv_opcode(op), "{req:?}");
            assert_eq!(
                (single.wc, single.byte_len),
                crate::queue::kind::completion(&req),
                "{req:?}"
            );
        }
        let two = [sge(32), sge(32)];
        assert!(Single::of(
            &Request::Read { remote, sgl: &two },
            8,
            mlx5::wqe::MAX_SGE_BYTES
        )
        .is_none());
        let empty = [sge(0)];
        assert!(Single::of(
            &Request::Read {
                remote,
                sgl: &empty
            },
            8,
            mlx5::wqe::MAX_SGE_BYTES
        )
        .is_none());
        // One registered buffer, written or sent, with or without an immediate; the
        // immediate big-endian, as `imm_data`.
        let buffer = [sge(8)];
        let data = Payload::Sgl(&buffer);
        let w = Single::of(
            &Request::Write { remote, data },
            8,
            mlx5::wqe::MAX_SGE_BYTES,
        )
        .expect("a one-buffer write");
        assert_eq!(
            (w.inline_flag, w.buf.lkey, w.buf.length, w.imm),
            (0, 3, 8, 0)
        );
        let wi = Request::WriteImm {
            remote,
            data,
            imm: 0x0102_0304,
        };
        let wi = Single::of(&wi, 8, mlx5::wqe::MAX_SGE_BYTES)
            .expect("a one-buffer write with immediate");
        assert_eq!(
            (wi.opcode, wi.imm, wi.remote.rkey),
            (
                ffi::ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM,
                0x0102_0304u32.to_be(),
                7
            )
        );
        let si = Request::SendImm {
            data: Payload::Inline(&bytes[..4]),
            imm: 9,
        };
        let si =
            Single::of(&si, 8, mlx5::wqe::MAX_SGE_BYTES).expect("an inline send with immediate");
        assert_eq!(
            (si.opcode, si.inline_flag, si.imm, si.buf.length),
            (
                ffi::ibv_wr_opcode::IBV_WR_SEND_WITH_IMM,
                ffi::ibv_send_flags::IBV_SEND_INLINE.0,
                9u32.to_be(),
                4
            )
        );
        // No bytes: only with an immediate, and then no inline flag (nothing to copy).
        for req in [
            Request::WriteImm {
                remote,
                data: Payload::Inline(&[]),
                imm: 1,
            },
            Request::SendImm {
                data: Payload::Inline(&[]),
                imm: 1,
            },
        ] {
            let n = Single::of(&req, 8, mlx5::wqe::MAX_SGE_BYTES).expect("an immediate alone");
            assert_eq!((n.inline_flag, n.buf.length), (0, 0), "{req:?}");
        }
        let empty_send = Request::Send {
            data: Payload::Inline(&[]),
        };
        assert!(
            Single::of(&empty_send, 8, mlx5::wqe::MAX_SGE_BYTES).is_none(),
            "a send of nothing"
        );
        // Every kind names its constants as `kind` says.
        let imm_reqs = [
            Request::WriteImm {
                remote,
                data: Payload::Inline(&bytes[..4]),
                imm: 1,
            },
            Request::SendImm {
                data: Payload::Sgl(&buffer),
                imm: 1,
            },
            Request::Send {
                data: Payload::Sgl(&buffer),
            },
        ];
        for req in imm_reqs {
            let single = Single::of(&req, 8, mlx5::wqe::MAX_SGE_BYTES).expect("a single request");
            let op = crate::queue::kind::verbs_op(&req).expect("a verbs request");
            assert_eq!(single.opcode, super::super::ibv_opcode(op), "{req:?}");
            assert_eq!(
                (single.wc, single.byte_len),
                crate::queue::kind::completion(&req),
                "{req:?}"
            );
        }
        // What takes the queued path: two buffers, an empty buffer, too many inline bytes.
        for data in [
            Payload::Sgl(&two),
            Payload::Sgl(&empty),
            Payload::Sgl(&[]),
            Payload::Inline(&bytes[..9]),
        ] {
            let imm = Request::WriteImm {
                remote,
                data,
                imm: 1,
            };
            assert!(
                Single::of(&imm, 8, mlx5::wqe::MAX_SGE_BYTES).is_none(),
                "{imm:?}"
            );
            assert!(
                Single::of(&Request::Send { data }, 8, mlx5::wqe::MAX_SGE_BYTES).is_none(),
                "{data:?}"
            );
        }
    }
}
