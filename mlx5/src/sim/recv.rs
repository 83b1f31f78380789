//! Receives for incoming messages: a QP takes them from its own receive queue or from the
//! SRQ it is attached to, and flushes its own when it goes to error.

use super::cq::err_cqe;
use super::error::SimError;
use super::event::AsyncEvent;
use super::qp_attr::QpState;
use super::state::State;
use crate::cqe::CqeOpcode;
use crate::request::Sge;
use crate::syndrome::Syndrome;

/// A receive WQE taken for an incoming message.
pub(crate) struct Taken {
    /// Its index (the CQE's `wqe_counter`).
    pub(crate) idx: u16,
    /// Scatter entries in the caller's array.
    pub(crate) n: usize,
    /// The SRQ it came from (0: the QP's own receive queue): the CQE's `srqn_uidx`.
    pub(crate) srqn: u32,
}

impl State {
    /// Attaches `receiver` (a QP or DCT number) to SRQ `srqn`: it takes its receives from
    /// it from now on. The receiver's own bookkeeping (which SRQ it names) is its
    /// creator's; this counts it as a user, so the SRQ outlives it.
    ///
    /// # Errors
    /// [`SimError::NoSrq`].
    pub(crate) fn attach_srq(&mut self, srqn: u32) -> Result<(), SimError> {
        let s = self.srqs.get_mut(&srqn).ok_or(SimError::NoSrq(srqn))?;
        s.users += 1;
        Ok(())
    }

    /// Makes receiving object `qpn` (an RC QP, or a DCT, both in the QP map) take its
    /// receives from SRQ `srqn` from now on: the one call any receiver's creation makes
    /// (`srq` in `ibv_qp_init_attr`, or in the DCT's `mlx5dv_create_qp` attributes). Its
    /// own receive queue, if it has one, is no longer used.
    ///
    /// # Errors
    /// [`SimError::NoQp`], [`SimError::NoSrq`].
    pub(crate) fn attach_receiver(&mut self, qpn: u32, srqn: u32) -> Result<(), SimError> {
        if !self.qps.contains_key(&qpn) {
            return Err(SimError::NoQp(qpn));
        }
        self.attach_srq(srqn)?;
        let q = self.qps.get_mut(&qpn).expect("checked");
        if let Some(old) = q.srq.replace(srqn) {
            self.detach_srq(old);
        }
        Ok(())
    }

    /// The receiver using SRQ `srqn` is gone.
    pub(crate) fn detach_srq(&mut self, srqn: u32) {
        if let Some(s) = self.srqs.get_mut(&srqn) {
            s.users = s.users.saturating_sub(1);
        }
    }

    /// Receive WQEs available to QP `qpn` (its own, or its SRQ's).
    pub(crate) fn recv_pending(&self, qpn: u32) -> u32 {
        let Some(q) = self.qps.get(&qpn) else {
            return 0;
        };
        match q.srq {
            Some(srqn) => self.srqs.get(&srqn).map_or(0, |s| s.pending()),
            None => q.rq_pending(),
        }
    }

    /// Takes the next receive WQE of QP `qpn` (its own, or its SRQ's), if one is posted.
    pub(crate) fn take_recv(&mut self, qpn: u32, out: &mut [Sge; 64]) -> Option<Taken> {
        let q = self.qps.get_mut(&qpn)?;
        match q.srq {
            Some(srqn) => {
                let (idx, n) = self.take_srq_wqe(srqn, out)?;
                Some(Taken { idx, n, srqn })
            }
            None => {
                if q.rq_pending() == 0 {
                    return None;
                }
                let n = q.peek_recv(out);
                let idx = q.rq_ci as u16;
                q.rq_ci = q.rq_ci.wrapping_add(1);
                Some(Taken { idx, n, srqn: 0 })
            }
        }
    }

    /// Takes the WQE at the head of SRQ `srqn` for any receiver attached to it, if one is
    /// posted; raises the limit event when fewer than the armed limit remain.
    pub(crate) fn take_srq_wqe(&mut self, srqn: u32, out: &mut [Sge; 64]) -> Option<(u16, usize)> {
        let s = self.srqs.get_mut(&srqn)?;
        if s.pending() == 0 {
            return None;
        }
        let got = s.take(out);
        if s.limit != 0 && s.pending() < s.limit {
            s.limit = 0;
            s.stats.limit_events += 1;
            self.events.push_back(AsyncEvent::SrqLimitReached { srqn });
        }
        Some(got)
    }

    /// A QP with an SRQ that is in error: its receives are not flushed (the SRQ's WQEs stay
    /// for the others) but for the one it holds for a message still arriving, which
    /// completes with a flush error first; then the last-WQE-reached event, once (IBA
    /// 10.3.1: no WQE of the SRQ is used by the QP after it).
    pub(crate) fn last_wqe_if_error(&mut self, qpn: u32) {
        let Some(q) = self.qps.get_mut(&qpn) else {
            return;
        };
        if q.srq.is_none() || q.state != QpState::Error || q.last_wqe_reached {
            return;
        }
        q.last_wqe_reached = true;
        let rcq = q.recv_cq;
        if let Some(h) = q.partial.take() {
            let mut e = err_cqe(Syndrome::WrFlush.to_u8(), qpn, h.idx);
            e.srqn = crate::be::Be32::new(h.srqn);
            if let Some(cq) = self.cqs.get_mut(&rcq) {
                cq.push_err(e, CqeOpcode::RespErr);
            }
        }
        self.events.push_back(AsyncEvent::QpLastWqeReached { qpn });
    }

    /// Flushes every posted receive of a QP in error. Returns how many.
    pub(crate) fn flush_recvs_if_error(&mut self, qpn: u32) -> usize {
        // A QP with an SRQ flushes none of its WQEs: they stay for the others.
        self.last_wqe_if_error(qpn);
        let Some(qp) = self.qps.get_mut(&qpn) else {
            return 0;
        };
        if qp.state != QpState::Error {
            return 0;
        }
        let mut n = 0;
        while qp.rq_pending() > 0 {
            let idx = qp.rq_ci as u16;
            qp.rq_ci = qp.rq_ci.wrapping_add(1);
            qp.stats.recvs += 1;
            let e = err_cqe(Syndrome::WrFlush.to_u8(), qpn, idx);
            if let Some(cq) = self.cqs.get_mut(&qp.recv_cq) {
                cq.push_err(e, CqeOpcode::RespErr);
            }
            n += 1;
        }
        n
    }
}
