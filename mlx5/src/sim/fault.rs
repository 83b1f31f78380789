//! How the software NIC's objects go to error, and the asynchronous events that report it.

use super::event::AsyncEvent;
use super::state::State;

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
}
