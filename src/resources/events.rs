//! The device's asynchronous events (`ibv_get_async_event`: CQ error, QP fatal or access
//! error, port down, device fatal), turned into errors of the QPs and CQs they concern.
//!
//! Nothing watches in the background and the post and poll paths never look: the events
//! are read, without blocking, on the cold paths that a stalled queue reaches anyway (a post
//! refused for a full queue or CQ, [`Qp::check`](super::Qp::check),
//! [`Cq::check`](super::Cq::check), [`Cq::poll_n`](super::Cq::poll_n) when it gives up), and
//! kept: from then on every such path of the QP or CQ concerned reports
//! [`Error::AsyncEvent`](crate::Error::AsyncEvent). On rdma-core devices the event
//! descriptor is made non-blocking and read with `ibv_get_async_event` (UCX's
//! `uct_ib_async_event_handler` reads it the same way from its async thread); the software
//! NIC raises the same events ([`mlx5::sim::AsyncEvent`]) through the same code.

use super::device::Backend;
use crate::verbs::device::RawAsync;
pub use mlx5::sim::AsyncEvent;
use std::sync::Mutex;

/// What an event is about.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Subject {
    /// A CQ by number (direct path).
    Cq(u32),
    /// A verbs CQ by its `ibv_cq` address.
    VerbsCq(usize),
    /// A QP by number.
    Qp(u32),
    /// Everything (port down, device fatal).
    All,
}

/// The events read so far.
#[derive(Debug, Default)]
pub(crate) struct Events {
    seen: Mutex<Vec<(Subject, AsyncEvent)>>,
}

impl Events {
    /// Reads every pending event of the device (never blocks).
    #[cold]
    pub(crate) fn pump(&self, backend: &Backend) {
        let mut new = Vec::new();
        match backend {
            Backend::Sim(nic) => {
                while let Some(e) = nic.take_async_event() {
                    let subject = match e {
                        AsyncEvent::CqError { cqn } => Subject::Cq(cqn),
                        AsyncEvent::QpFatal { qpn } | AsyncEvent::QpAccessError { qpn } => {
                            Subject::Qp(qpn)
                        }
                        _ => Subject::All,
                    };
                    new.push((subject, e));
                }
            }
            Backend::Verbs(v) => {
                while let Some(e) = v.ctx.next_async_event() {
                    new.push(match e {
                        RawAsync::CqError(cq) => {
                            (Subject::VerbsCq(cq), AsyncEvent::CqError { cqn: 0 })
                        }
                        RawAsync::QpFatal(qpn) => (Subject::Qp(qpn), AsyncEvent::QpFatal { qpn }),
                        RawAsync::QpAccessError(qpn) => {
                            (Subject::Qp(qpn), AsyncEvent::QpAccessError { qpn })
                        }
                        RawAsync::PortError(port) if port == v.port => {
                            (Subject::All, AsyncEvent::PortError { port })
                        }
                        RawAsync::DeviceFatal => (Subject::All, AsyncEvent::DeviceFatal),
                        _ => continue,
                    });
                }
            }
        }
        if new.is_empty() {
            return;
        }
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        for x in new {
            if !seen.contains(&x) {
                seen.push(x);
            }
        }
    }

    /// The first event read that concerns one of `subjects` (or the whole device).
    pub(crate) fn about(&self, subjects: &[Subject]) -> Option<AsyncEvent> {
        let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        seen.iter()
            .find(|(s, _)| *s == Subject::All || subjects.contains(s))
            .map(|&(_, e)| e)
    }

    /// Reads the pending events ([`Events::pump`]) and reports the first one about
    /// `subjects` (or the whole device) as [`Error::AsyncEvent`](crate::Error::AsyncEvent).
    pub(crate) fn check(&self, backend: &Backend, subjects: &[Subject]) -> crate::Result<()> {
        self.pump(backend);
        match self.about(subjects) {
            Some(e) => Err(crate::Error::AsyncEvent(e)),
            None => Ok(()),
        }
    }

    /// Forgets the events of a QP or CQ that goes away (its number may be reused).
    pub(crate) fn forget(&self, subject: Subject) {
        self.seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|(s, _)| *s != subject);
    }
}
