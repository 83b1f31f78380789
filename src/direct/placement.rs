//! Where a raw queue's memory lies: the check that its ring, doorbell record and register
//! are neither null nor misaligned for the queue's own stores, made once when a queue is
//! built over them ([`SendQueue::new`](super::SendQueue::new),
//! [`RecvQueue::new`](super::RecvQueue::new)).

use crate::error::{Error, Result};

/// Refuses the first of `places` (what it is, its address, the alignment the queue's
/// stores to it need) that is null or misaligned, with its address.
pub(super) fn check(places: &[(&'static str, usize, usize)]) -> Result<()> {
    match places
        .iter()
        .find(|&&(_, addr, align)| addr == 0 || addr % align != 0)
    {
        Some(&(what, addr, _)) => Err(Error::InvalidParameter {
            what,
            value: addr as u64,
        }),
        None => Ok(()),
    }
}
