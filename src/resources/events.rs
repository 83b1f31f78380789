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
//! NIC raises the same events through the same code.

use super::device::Backend;
use crate::verbs::device::RawAsync;
use std::sync::Mutex;

/// An asynchronous event of the device, as `ibv_get_async_event` reports them
/// (`IBV_EVENT_CQ_ERR`, `IBV_EVENT_QP_FATAL`, `IBV_EVENT_QP_ACCESS_ERR`,
/// `IBV_EVENT_PORT_ERR`, `IBV_EVENT_DEVICE_FATAL`): what
/// [`Error::AsyncEvent`](crate::Error::AsyncEvent) carries.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AsyncEvent {
    /// A CQ overran (or its memory failed): it is in error, writes nothing more. The CQ
    /// number is 0 on the verbs path (rdma-core names the CQ by its `ibv_cq`).
    CqError {
        /// The CQ.
        cqn: u32,
    },
    /// A QP went to error for a reason no completion reports (its completion did not fit
    /// in an overrun CQ).
    QpFatal {
        /// The QP.
        qpn: u32,
    },
    /// A responder QP went to error on an incoming request it refused (a class-C error:
    /// remote access or invalid request).
    QpAccessError {
        /// The QP.
        qpn: u32,
    },
    /// The port went down.
    PortError {
        /// The port.
        port: u8,
    },
    /// The device failed; nothing runs any more.
    DeviceFatal,
    /// An SRQ's limit was reached: fewer receives than the limit set with
    /// [`Srq::set_limit`](crate::Srq::set_limit) remain posted
    /// (`IBV_EVENT_SRQ_LIMIT_REACHED`); the limit is disarmed. Not an error: read it with
    /// [`Srq::limit_reached`](crate::Srq::limit_reached). The SRQ number is 0 on the verbs
    /// path (rdma-core names the SRQ by its `ibv_srq`).
    SrqLimitReached {
        /// The SRQ.
        srqn: u32,
    },
    /// A QP with an SRQ went to error and takes no more receives from it
    /// (`IBV_EVENT_QP_LAST_WQE_REACHED`): its receive completions are all written. Not an
    /// error: read it with [`Qp::last_wqe_reached`](crate::Qp::last_wqe_reached).
    QpLastWqeReached {
        /// The QP.
        qpn: u32,
    },
}

#[cfg(feature = "sim")]
impl From<mlx5::sim::AsyncEvent> for AsyncEvent {
    fn from(e: mlx5::sim::AsyncEvent) -> Self {
        use mlx5::sim::AsyncEvent as S;
        match e {
            S::CqError { cqn } => AsyncEvent::CqError { cqn },
            S::QpFatal { qpn } => AsyncEvent::QpFatal { qpn },
            S::QpAccessError { qpn } => AsyncEvent::QpAccessError { qpn },
            S::PortError { port } => AsyncEvent::PortError { port },
            S::DeviceFatal => AsyncEvent::DeviceFatal,
            S::SrqLimitReached { srqn } => AsyncEvent::SrqLimitReached { srqn },
            S::QpLastWqeReached { qpn } => AsyncEvent::QpLastWqeReached { qpn },
            // The software NIC's enum is non-exhaustive: an event this crate does not know
            // yet stops everything rather than go unreported.
            _ => AsyncEvent::DeviceFatal,
        }
    }
}

#[cfg(feature = "sim")]
impl From<AsyncEvent> for mlx5::sim::AsyncEvent {
    fn from(e: AsyncEvent) -> Self {
        use mlx5::sim::AsyncEvent as S;
        match e {
            AsyncEvent::CqError { cqn } => S::CqError { cqn },
            AsyncEvent::QpFatal { qpn } => S::QpFatal { qpn },
            AsyncEvent::QpAccessError { qpn } => S::QpAccessError { qpn },
            AsyncEvent::PortError { port } => S::PortError { port },
            AsyncEvent::DeviceFatal => S::DeviceFatal,
            AsyncEvent::SrqLimitReached { srqn } => S::SrqLimitReached { srqn },
            AsyncEvent::QpLastWqeReached { qpn } => S::QpLastWqeReached { qpn },
        }
    }
}

/// A refused post explained: a queue or CQ that does not drain may be the sign of an
/// asynchronous event (a CQ in error writes no completions, a failed device runs nothing),
/// so for [`crate::Error::QueueFull`] and [`crate::Error::CqFull`] the events `check` reads
/// are reported instead when it finds one; every other error stands.
#[cold]
pub(crate) fn explain_refusal(
    e: crate::Error,
    check: impl FnOnce() -> crate::Result<()>,
) -> crate::Error {
    match e {
        crate::Error::QueueFull { .. } | crate::Error::CqFull { .. } => match check() {
            Err(event) => event,
            Ok(()) => e,
        },
        e => e,
    }
}

/// What an event is about.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Subject {
    /// A software-NIC CQ by number.
    #[cfg(feature = "sim")]
    Cq(u32),
    /// A verbs CQ by its `ibv_cq` address.
    VerbsCq(usize),
    /// A QP by number.
    Qp(u32),
    /// The informational events of an SRQ (its limit): a software-NIC SRQ by number, a
    /// verbs SRQ by its `ibv_srq` address.
    Srq(u64),
    /// The last-WQE-reached event of a QP by number (informational).
    LastWqe(u32),
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
            #[cfg(feature = "sim")]
            Backend::Sim(nic) => {
                while let Some(e) = nic.take_async_event() {
                    let e = AsyncEvent::from(e);
                    let subject = match e {
                        AsyncEvent::CqError { cqn } => Subject::Cq(cqn),
                        AsyncEvent::QpFatal { qpn } | AsyncEvent::QpAccessError { qpn } => {
                            Subject::Qp(qpn)
                        }
                        AsyncEvent::SrqLimitReached { srqn } => Subject::Srq(srqn as u64),
                        AsyncEvent::QpLastWqeReached { qpn } => Subject::LastWqe(qpn),
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
                        RawAsync::SrqLimitReached(srq) => (
                            Subject::Srq(srq as u64),
                            AsyncEvent::SrqLimitReached { srqn: 0 },
                        ),
                        RawAsync::QpLastWqeReached(qpn) => {
                            (Subject::LastWqe(qpn), AsyncEvent::QpLastWqeReached { qpn })
                        }
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

    /// Reads the pending events and takes (forgets) the informational one about `subject`
    /// (an SRQ's limit): whether there was one.
    pub(crate) fn take(&self, backend: &Backend, subject: Subject) -> bool {
        self.pump(backend);
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let before = seen.len();
        seen.retain(|(s, _)| *s != subject);
        seen.len() != before
    }

    /// Reads the pending events and says whether one about exactly `subject` was read.
    pub(crate) fn has(&self, backend: &Backend, subject: Subject) -> bool {
        self.pump(backend);
        let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        seen.iter().any(|(s, _)| *s == subject)
    }

    /// Forgets the events of a QP or CQ that goes away (its number may be reused).
    pub(crate) fn forget(&self, subject: Subject) {
        self.seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|(s, _)| *s != subject);
    }
}

#[cfg(all(test, feature = "sim"))]
mod tests {
    use super::AsyncEvent;

    #[test]
    fn events_cross_the_software_nic_boundary_unchanged() {
        for e in [
            AsyncEvent::CqError { cqn: 0x12 },
            AsyncEvent::QpFatal { qpn: 0x34 },
            AsyncEvent::QpAccessError { qpn: 0x56 },
            AsyncEvent::PortError { port: 2 },
            AsyncEvent::DeviceFatal,
            AsyncEvent::SrqLimitReached { srqn: 0x78 },
            AsyncEvent::QpLastWqeReached { qpn: 0x9a },
        ] {
            let s = mlx5::sim::AsyncEvent::from(e);
            assert_eq!(AsyncEvent::from(s), e);
            assert_eq!(format!("{e:?}"), format!("{s:?}"));
        }
    }
}
