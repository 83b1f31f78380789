//! How the software NIC's objects go to error, and the asynchronous events that report it.

use super::cq::err_cqe;
use super::event::AsyncEvent;
use super::progress::Outcome;
use super::qp_attr::QpState;
use super::state::State;
use crate::cqe::CqeOpcode;
use crate::syndrome::Syndrome;

impl State {
    /// Raises [`AsyncEvent::CqError`] once for every CQ that went to error.
    pub(crate) fn note_cq_errors(&mut self) {
        let mut cqns: Vec<u32> = self
            .cqs
            .values_mut()
            .filter(|c| c.overrun && !c.error_reported)
            .map(|c| {
                c.error_reported = true;
                c.cqn
            })
            .collect();
        cqns.sort_unstable();
        self.events
            .extend(cqns.into_iter().map(|cqn| AsyncEvent::CqError { cqn }));
    }

    /// Writes a requester error CQE and moves the QP to error (a UD QP's send queue only:
    /// [`QpState::SqError`]).
    pub(crate) fn req_error(&mut self, qpn: u32, pi: u16, opcode: u8, s: Syndrome) {
        let Some(qp) = self.qps.get_mut(&qpn) else {
            return;
        };
        qp.state = match qp.state {
            QpState::Rts | QpState::SqError if qp.ud.is_some() => QpState::SqError,
            _ => QpState::Error,
        };
        let cq = qp.send_cq;
        let e = err_cqe(s.to_u8(), (opcode as u32) << 24 | qpn, pi);
        if let Some(cq) = self.cqs.get_mut(&cq) {
            cq.push_err(e, CqeOpcode::ReqErr);
        }
    }

    /// Moves a QP to error (its WQEs and receives are flushed from now on).
    pub(crate) fn set_error(&mut self, qpn: u32) {
        // A DCT serves every initiator: one initiator's fault does not stop it.
        if self.is_dct(qpn) {
            return;
        }
        if let Some(qp) = self.qps.get_mut(&qpn) {
            qp.state = QpState::Error;
        }
        // A QP on an SRQ flushes the WQE it holds for a message still arriving and raises
        // the last-WQE-reached event at once, as a ConnectX does after the modify to error
        // (the kernel's `__ib_drain_srq` only waits for the event): nothing else need run.
        self.last_wqe_if_error(qpn);
    }

    /// A class-C responder error: the responder QP goes to error too.
    pub(crate) fn remote_fault(&mut self, peer: u32, s: Syndrome) -> Outcome {
        // A DCT stays ready and raises nothing: the kernel's mlx5 `qpc.c` lets only
        // DCT_DRAINED through for a DCT (`dct_allowed_event_types`).
        if !self.is_dct(peer) {
            self.error_with(peer, AsyncEvent::QpAccessError { qpn: peer });
        }
        Outcome::Failed(s)
    }

    /// A QP whose completion did not fit in its CQ goes to error with a QP-fatal event.
    pub(crate) fn fatal(&mut self, qpn: u32) {
        self.error_with(qpn, AsyncEvent::QpFatal { qpn });
    }

    /// Moves `qpn` to error, raising `event` when it was not in error already.
    fn error_with(&mut self, qpn: u32, event: AsyncEvent) {
        if self
            .qps
            .get(&qpn)
            .is_some_and(|q| q.state != QpState::Error)
        {
            self.events.push_back(event);
        }
        self.set_error(qpn);
    }
}
