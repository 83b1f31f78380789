//! Posting to a queue pair: RDMA write, read, send, atomics and receives, each checked
//! before anything is written and refused whole (nothing half-posted).

use super::{Qp, QpPath};
use crate::error::{Error, Result};
use crate::queue::flags::PostFlags;
use crate::{Payload, Remote, Request, Sge};

impl Qp {
    /// Posts one request.
    ///
    /// # Errors
    /// [`Error::QueueFull`], [`Error::TooManySge`], [`Error::InlineTooLong`],
    /// [`Error::WqeTooLarge`], [`Error::Misaligned`], ...; [`Error::InvalidParameter`] for
    /// a write, send or read whose entries add up to more than 2^31 bytes (the sum in the
    /// error); [`Error::Unsupported`] for [`Request::BindMw`] and
    /// [`Request::LocalInvalidate`], which only [`Qp::bind_mw`] and [`Qp::unbind_mw`] post
    /// (they check the range, the rights and the window's type and state, and keep the
    /// window's key in step). Nothing is posted on error.
    #[inline(always)]
    pub fn post(&mut self, req: &Request<'_>, cookie: u64, flags: PostFlags) -> Result<()> {
        self.check_state()?;
        let r = match &mut self.path {
            QpPath::Direct { sq, .. } => sq.post(req, cookie, flags),
            QpPath::Verbs { sq, .. } => sq.post_one(req, cookie, flags),
        };
        match r {
            Ok(()) => Ok(()),
            Err(e) => Err(self.explain(e)),
        }
    }

    /// RDMA write of a gather list.
    ///
    /// # Errors
    /// See [`Qp::post`].
    #[inline(always)]
    pub fn write(
        &mut self,
        sgl: &[Sge],
        remote: Remote,
        cookie: u64,
        flags: PostFlags,
    ) -> Result<()> {
        self.post(
            &Request::Write {
                remote,
                data: Payload::Sgl(sgl),
            },
            cookie,
            flags,
        )
    }

    /// RDMA write of bytes carried in the WQE (no registration needed).
    ///
    /// # Errors
    /// See [`Qp::post`].
    #[inline(always)]
    pub fn write_inline(
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
        }
        let req = Request::Write {
            remote,
            data: Payload::Inline(data),
        };
        self.write_inline_cold(&req, cookie, flags)
    }

    /// [`Qp::write_inline`] (`req`, an inline write) when the direct path's fast path did
    /// not take it: on the verbs path, the send queue's own inline write; else
    /// [`Qp::post`]. Out of line, the request built only on the way here: the direct path's
    /// fast path keeps its arguments where they arrived (passed in registers instead, the
    /// compiler moved them into this call's registers before that path's first compare).
    /// [`Qp::post`] is called out of line ([`Qp::post_out_of_line`]): inlined here, its
    /// match of every request kind shared this function's registers and stack with the
    /// verbs path (4 instructions per verbs inline write, `cargo xtask rxe-icount`).
    #[cold]
    #[inline(never)]
    fn write_inline_cold(
        &mut self,
        req: &Request<'_>,
        cookie: u64,
        flags: PostFlags,
    ) -> Result<()> {
        if let (
            QpPath::Verbs { sq, .. },
            true,
            &Request::Write {
                remote,
                data: Payload::Inline(data),
            },
        ) = (&mut self.path, self.connected, req)
        {
            return match sq.write_inline(data, remote, cookie, flags) {
                Ok(()) => Ok(()),
                Err(e) => Err(self.explain(e)),
            };
        }
        self.post_out_of_line(req, cookie, flags)
    }

    /// [`Qp::post`], not inlined (see [`Qp::write_inline_cold`]).
    #[inline(never)]
    fn post_out_of_line(&mut self, req: &Request<'_>, cookie: u64, flags: PostFlags) -> Result<()> {
        self.post(req, cookie, flags)
    }

    /// RDMA write with immediate.
    ///
    /// # Errors
    /// See [`Qp::post`].
    #[inline(always)]
    pub fn write_imm(
        &mut self,
        data: Payload<'_>,
        remote: Remote,
        imm: u32,
        cookie: u64,
        flags: PostFlags,
    ) -> Result<()> {
        self.post(&Request::WriteImm { remote, data, imm }, cookie, flags)
    }

    /// RDMA read into a scatter list.
    ///
    /// # Errors
    /// See [`Qp::post`].
    #[inline(always)]
    pub fn read(
        &mut self,
        sgl: &[Sge],
        remote: Remote,
        cookie: u64,
        flags: PostFlags,
    ) -> Result<()> {
        self.post(&Request::Read { remote, sgl }, cookie, flags)
    }

    /// Send.
    ///
    /// # Errors
    /// See [`Qp::post`].
    #[inline(always)]
    pub fn send(&mut self, data: Payload<'_>, cookie: u64, flags: PostFlags) -> Result<()> {
        self.post(&Request::Send { data }, cookie, flags)
    }

    /// Atomic compare-and-swap of the 8 bytes at `remote`; the old value lands in `local`.
    ///
    /// # Errors
    /// See [`Qp::post`]; [`Error::Misaligned`] for a remote address not 8-byte aligned;
    /// [`Error::AtomicLength`] for a local entry that is not 8 bytes; [`Error::Unsupported`]
    /// on a device without atomics (`atomic_cap` `IBV_ATOMIC_NONE`). Read the old value with
    /// [`Qp::atomic_result`].
    #[inline(always)]
    pub fn compare_swap(
        &mut self,
        remote: Remote,
        compare: u64,
        swap: u64,
        local: Sge,
        cookie: u64,
        flags: PostFlags,
    ) -> Result<()> {
        self.post(
            &Request::CompareSwap {
                remote,
                compare,
                swap,
                local,
            },
            cookie,
            flags,
        )
    }

    /// Atomic fetch-and-add on the 8 bytes at `remote`; the old value lands in `local`.
    ///
    /// # Errors
    /// See [`Qp::compare_swap`].
    #[inline(always)]
    pub fn fetch_add(
        &mut self,
        remote: Remote,
        add: u64,
        local: Sge,
        cookie: u64,
        flags: PostFlags,
    ) -> Result<()> {
        self.post(&Request::FetchAdd { remote, add, local }, cookie, flags)
    }

    /// The old value an atomic of this QP returned, in host order on every device: `reply`
    /// is the local buffer of a completed compare-swap, fetch-add or 64-bit masked atomic (8
    /// bytes) or of a 32-bit masked atomic (4 bytes), as the device wrote it.
    ///
    /// Devices write replies in different byte orders: a ConnectX writes 4-byte masked
    /// replies big-endian always, and 8-byte ones big-endian in
    /// `atomic_req_8B_endianness_mode` 0 (host order in mode 1, which Linux selects); rxe
    /// and the other verbs devices write host order. Read atomic results through this call
    /// (or [`AtomicCaps::reply_value`](mlx5::AtomicCaps::reply_value) with
    /// [`Device::atomic_caps`](crate::Device::atomic_caps)), never as raw memory.
    ///
    /// ```
    /// # #[cfg(feature = "sim")] fn main() -> blueflame::Result<()> {
    /// use blueflame::{Access, AtomicCaps, Completion, Device, PostFlags, QpCaps};
    ///
    /// let dev = Device::sim_stepped();
    /// // A ConnectX in 8-byte endianness mode 0: every reply big-endian.
    /// dev.nic().unwrap().set_atomic_caps(AtomicCaps::CONNECTX_BIG_ENDIAN);
    /// let pd = dev.alloc_pd()?;
    /// let mut cq = dev.create_cq(16)?;
    /// let mut qp = pd.create_qp(&cq, &cq, QpCaps::default())?;
    /// let me = qp.qpn();
    /// qp.connect(me)?;
    /// let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_ATOMIC;
    /// let mr = pd.alloc_mr(64, all)?;
    /// mr.write(0, &41u64.to_ne_bytes())?;
    /// qp.fetch_add(mr.remote(0)?, 1, mr.sge(8, 8)?, 1, PostFlags::SIGNALED)?;
    /// dev.process();
    /// assert_eq!(cq.poll(&mut [Completion::default(); 1]), 1);
    /// let mut reply = [0u8; 8];
    /// mr.read(8, &mut reply)?;
    /// assert_eq!(reply, 41u64.to_be_bytes());       // as the device wrote it
    /// assert_eq!(qp.atomic_result(&reply)?, 41);    // the old value, host order
    /// assert_eq!(mr.read_u64(0)?, 42);
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sim"))] fn main() {}
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidParameter`] when `reply` is neither 8 nor 4 bytes long.
    #[inline]
    pub fn atomic_result(&self, reply: &[u8]) -> Result<u64> {
        self.atomics
            .reply_value(reply)
            .ok_or(Error::InvalidParameter {
                what: "atomic reply length (8 bytes, or 4 for a 32-bit masked atomic)",
                value: reply.len() as u64,
            })
    }

    /// What this QP's device can do with atomics (read when the QP was created).
    pub fn atomic_caps(&self) -> mlx5::AtomicCaps {
        self.atomics
    }

    /// Posts a receive buffer list.
    ///
    /// # Errors
    /// [`Error::SrqQp`] when the QP takes its receives from an SRQ;
    /// [`Error::Unsupported`] when the QP has no receive queue; [`Error::QueueFull`],
    /// [`Error::TooManySge`].
    #[inline]
    pub fn post_recv(&mut self, sgl: &[Sge], cookie: u64) -> Result<()> {
        if let QpPath::Verbs { .. } = self.path {
            // A call of the same signature: a jump.
            return self.post_recv_verbs(sgl, cookie);
        }
        let r = match &mut self.path {
            QpPath::Direct { rq: Some(rq), .. } if self.srq.is_none() => rq.post(sgl, cookie),
            _ => return Err(self.no_receive_queue()),
        };
        r.map_err(|e| self.explain(e))
    }

    /// [`Qp::post_recv`] on the verbs path, out of line: inlined, it shared the direct
    /// path's registers, and the receive paid their saves and restores (rxe-icount).
    /// One buffer while the queue's cached room lasts is posted straight; everything else
    /// takes [`Qp::post_recv_verbs_general`] (a jump), as does nothing on this path.
    #[inline(never)]
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
