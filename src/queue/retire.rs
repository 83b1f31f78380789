//! A retirement made later than the completion that earns it: a queue may have its room
//! back only once the device has been told that the CQE is consumed (the consumer index
//! published: CQ accounting, `cq_share`). The direct path's general poller publishes after
//! it has read an entry, and the verbs path's extended poller learns it at
//! `ibv_end_poll`; both note the retirement here and make it then.

use super::shadow::{SendEntry, Shadow};

/// A queue to retire up to a position, or nothing.
#[derive(Copy, Clone, Default)]
pub(crate) enum Retire {
    /// Nothing to retire.
    #[default]
    Nothing,
    /// A send queue, up to the position.
    Send(*const Shadow<SendEntry>, u16),
    /// A receive queue, or an SRQ's cookie table (its freed count), up to the position.
    Recv(*const Shadow<u64>, u16),
}

impl Retire {
    /// Makes the retirement.
    ///
    /// # Safety
    /// The queue it points to is alive (held by the poller since the retirement was noted).
    #[inline(always)]
    pub(crate) unsafe fn apply(self) {
        // SAFETY: the caller's contract.
        unsafe {
            match self {
                Retire::Nothing => {}
                Retire::Send(q, end) => (*q).retire(end),
                Retire::Recv(q, end) => (*q).retire(end),
            }
        }
    }
}
