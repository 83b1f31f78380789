//! Queue pairs.

use super::cq::CqHandle;
use super::{Cq, Pd};
use crate::direct::{Attached, Batch, PostFlags, RecvQueue, SendQueue};
use crate::error::{Error, Result};
use crate::{Payload, Remote, Request, Sge};
use std::sync::Arc;

pub use mlx5::sim::QpCaps;

/// A reliable-connected queue pair on the direct data path.
pub struct Qp {
    // Field order: the queues go before the handles that keep their rings alive.
    sq: SendQueue,
    rq: Option<RecvQueue>,
    qpn: u32,
    pd: Pd,
    cqs: [Arc<CqHandle>; 2],
}

impl core::fmt::Debug for Qp {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Qp")
            .field("qpn", &self.qpn)
            .field("sq", &self.sq)
            .finish()
    }
}

impl Pd {
    /// Creates an RC QP whose sends complete on `send_cq` and receives on `recv_cq` (they
    /// may be the same CQ).
    ///
    /// # Errors
    /// [`Error::Sim`](crate::Error::Sim) for capabilities the NIC refuses.
    pub fn create_qp(&self, send_cq: &Cq, recv_cq: &Cq, caps: QpCaps) -> Result<Qp> {
        let dev = &self.inner.dev;
        let raw = dev
            .nic
            .create_qp(self.inner.pd, send_cq.cqn(), recv_cq.cqn(), caps)?;
        // SAFETY: the rings belong to the QP just created, which this Qp alone posts to and
        // destroys on drop, after the queues (field order).
        let sq = unsafe { SendQueue::new(&raw) };
        // SAFETY: as above, for the receive ring.
        let rq = unsafe { RecvQueue::new(&raw) };
        let (sq, rq) = match (sq, rq) {
            (Ok(s), Ok(r)) => (s, r),
            (Err(e), _) | (_, Err(e)) => {
                let _ = dev.nic.destroy_qp(raw.qpn);
                return Err(e);
            }
        };
        send_cq.handle.registry.attach(Attached {
            qpn: raw.qpn,
            sq: Some(sq.shadow.clone()),
            rq: None,
        });
        recv_cq.handle.registry.attach(Attached {
            qpn: raw.qpn,
            sq: None,
            rq: rq.as_ref().map(|r| r.shadow.clone()),
        });
        Ok(Qp {
            sq,
            rq,
            qpn: raw.qpn,
            pd: self.clone(),
            cqs: [send_cq.handle.clone(), recv_cq.handle.clone()],
        })
    }
}

impl Qp {
    /// The QP number.
    pub fn qpn(&self) -> u32 {
        self.qpn
    }

    /// The protection domain.
    pub fn pd(&self) -> &Pd {
        &self.pd
    }

    /// Connects this QP to the QP `remote_qpn` of the same software NIC (itself for a
    /// loopback) and moves both to RTS.
    ///
    /// # Errors
    /// [`Error::Sim`](crate::Error::Sim) when there is no such QP.
    pub fn connect(&mut self, remote_qpn: u32) -> Result<()> {
        self.pd.inner.dev.nic.connect(self.qpn, remote_qpn)?;
        Ok(())
    }

    /// Moves the QP to the error state: outstanding and later work is flushed, each
    /// request completing once with [`WcStatus::WrFlushErr`](crate::WcStatus::WrFlushErr).
    ///
    /// # Errors
    /// [`Error::Sim`](crate::Error::Sim) when the QP is gone.
    pub fn set_error(&mut self) -> Result<()> {
        self.pd.inner.dev.nic.set_error(self.qpn)?;
        Ok(())
    }

    /// The send queue (the direct path itself).
    pub fn sq(&mut self) -> &mut SendQueue {
        &mut self.sq
    }

    /// Posts one request and rings the doorbell.
    ///
    /// # Errors
    /// See [`SendQueue::push`]; nothing is posted on error.
    #[inline(always)]
    pub fn post(&mut self, req: &Request<'_>, cookie: u64, flags: PostFlags) -> Result<()> {
        self.sq.post(req, cookie, flags)
    }

    /// Starts a doorbell batch.
    pub fn batch(&mut self) -> Batch<'_> {
        self.sq.batch()
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
        self.post(
            &Request::Write {
                remote,
                data: Payload::Inline(data),
            },
            cookie,
            flags,
        )
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
    /// See [`Qp::post`]; [`Error::Misaligned`] for a remote address not 8-byte aligned.
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

    /// Posts a receive buffer list.
    ///
    /// # Errors
    /// [`Error::Unsupported`] when the QP has no receive queue; see [`RecvQueue::post`].
    #[inline]
    pub fn post_recv(&mut self, sgl: &[Sge], cookie: u64) -> Result<()> {
        self.rq
            .as_mut()
            .ok_or(Error::Unsupported("QP has no receive queue"))?
            .post(sgl, cookie)
    }

    /// The receive queue, if the QP has one.
    pub fn rq(&mut self) -> Option<&mut RecvQueue> {
        self.rq.as_mut()
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        for cq in &self.cqs {
            cq.registry.detach(self.qpn);
        }
        let _ = self.pd.inner.dev.nic.destroy_qp(self.qpn);
    }
}
