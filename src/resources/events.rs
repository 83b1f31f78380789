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

pub use crate::async_event::AsyncEvent;
pub(crate) use crate::async_event::Subject;
use crate::backend::Dev;
use std::sync::{Arc, Mutex};

/// A refused post explained: a queue or CQ that does not drain may be the sign of an
/// asynchronous event (a CQ in error writes no completions, a failed device runs nothing),
/// so for [`crate::Error::QueueFull`] and [`crate::Error::CqFull`] the events `check` reads
/// are reported instead when it finds one; every other error stands.
#[cold]
pub(crate) fn explain_refusal(
    e: crate::error::Error,
    check: impl FnOnce() -> crate::error::Result<()>,
) -> crate::error::Error {
    match e {
        crate::error::Error::QueueFull { .. } | crate::error::Error::CqFull { .. } => match check()
        {
            Err(event) => event,
            Ok(()) => e,
        },
        e => e,
    }
}

/// The events read so far.
#[derive(Debug, Default)]
pub(crate) struct Events {
    seen: Mutex<Vec<(Subject, AsyncEvent)>>,
}

impl Events {
    /// Reads every pending event of the device (never blocks).
    ///
    /// Taking the events from the device and recording them are one step against
    /// [`Events::forget`]: with the record unlocked in between, an object destroyed there
    /// (its unread events dropped by the device, its record forgotten) got the event taken
    /// before recorded after, and the next object given its number reported it (a review's
    /// finding: a fresh QP's `check` said `QpFatal`). The lock order is this record, then
    /// the device's, which never calls back here.
    #[cold]
    pub(crate) fn pump(&self, dev: &Dev) {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let mut new = Vec::new();
        dev.read_events(&mut new);
        for x in new {
            if let (Subject::Port(p), AsyncEvent::PortActive { .. }) = x {
                // The port is up again: its error is over (a port error kept for good made
                // every QP and CQ on it, later ones too, report it for the rest of the
                // process).
                seen.retain(|(s, _)| *s != Subject::Port(p));
            } else if !seen.contains(&x) {
                seen.push(x);
            }
        }
    }

    /// The first event read that concerns one of `subjects`, the port `port` or the whole
    /// device.
    fn about(&self, subjects: &[Subject], port: Subject) -> Option<AsyncEvent> {
        let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        seen.iter()
            .find(|(s, _)| *s == Subject::All || *s == port || subjects.contains(s))
            .map(|&(_, e)| e)
    }

    /// Reads the pending events ([`Events::pump`]) and reports the first one about
    /// `subjects`, the device's port or the whole device as
    /// [`Error::AsyncEvent`](crate::Error::AsyncEvent).
    pub(crate) fn check(&self, backend: &Dev, subjects: &[Subject]) -> crate::error::Result<()> {
        self.pump(backend);
        match self.about(subjects, Subject::Port(backend.port())) {
            Some(e) => Err(crate::error::Error::AsyncEvent(e)),
            None => Ok(()),
        }
    }

    /// Reads the pending events and takes (forgets) the informational one about `subject`
    /// (an SRQ's limit): whether there was one.
    pub(crate) fn take(&self, backend: &Dev, subject: Subject) -> bool {
        self.pump(backend);
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let before = seen.len();
        seen.retain(|(s, _)| *s != subject);
        seen.len() != before
    }

    /// Reads the pending events and says whether one about exactly `subject` was read.
    pub(crate) fn has(&self, backend: &Dev, subject: Subject) -> bool {
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

/// Forgets the events of an object that goes away when it drops: a field of the object's
/// handle after the device object's own, so after the object is destroyed. Forgotten
/// before, an event another thread read between the forget and the destroy outlived the
/// object, and the next object with its number was blamed for it (a review's finding); the
/// kernel drops a destroyed object's unread events itself (`ib_uverbs_release_uevent`), as
/// the software NIC does.
#[derive(Debug)]
pub(crate) struct Forget {
    events: Arc<Events>,
    subjects: [Option<Subject>; 2],
}

impl Forget {
    /// Forgets `subjects` of `events` when dropped.
    pub(crate) fn new(events: &Arc<Events>, subjects: [Option<Subject>; 2]) -> Forget {
        Forget {
            events: events.clone(),
            subjects,
        }
    }

    /// The subjects handed over to a new `Forget` (the QP's device object outlives its
    /// handle: `Qp::drop` on the verbs path); this one then forgets nothing.
    pub(crate) fn take(&mut self) -> Forget {
        Forget {
            events: self.events.clone(),
            subjects: core::mem::take(&mut self.subjects),
        }
    }
}

impl Drop for Forget {
    fn drop(&mut self) {
        for s in self.subjects.into_iter().flatten() {
            self.events.forget(s);
        }
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
            AsyncEvent::PortActive { port: 2 },
            AsyncEvent::DeviceFatal,
            AsyncEvent::SrqLimitReached { srqn: 0x78 },
            AsyncEvent::QpLastWqeReached { qpn: 0x9a },
            AsyncEvent::SrqError { srqn: 0xbc },
        ] {
            let s = mlx5::sim::AsyncEvent::from(e);
            assert_eq!(AsyncEvent::from(s), e);
            assert_eq!(format!("{e:?}"), format!("{s:?}"));
        }
    }
}
