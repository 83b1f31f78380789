//! Giving a buffer back: a region turned into its buffer is parked like a dropped one
//! (`lifetime.rs`); once the device has deregistered it, the buffer lands in a slot that
//! [`PendingBuffer::try_take`] empties.

use super::buffer::{Owned, RegionBuffer};
use super::Pd;
use crate::queue::lifetime::{Deregister, Registration};
use std::marker::PhantomData;
use std::sync::{Arc, Mutex};

/// Where a parked registration puts its buffer once it is deregistered.
pub(crate) type Slot = Arc<Mutex<Option<Owned>>>;

/// A registration that holds the user's buffer: deregisters, then drops the buffer (or puts
/// it in the slot of a [`PendingBuffer`]). When the device refuses, both stay as they are;
/// leaked together if the domain goes while it still refuses.
pub(crate) struct WithBuffer {
    pub(crate) reg: Registration,
    pub(crate) buf: Option<Owned>,
    pub(crate) slot: Option<Slot>,
}

impl Deregister for WithBuffer {
    fn deregister(&mut self) -> bool {
        if !self.reg.deregister() {
            return false;
        }
        // The buffer is not dropped here (nor is a slot nobody else holds any more, with the
        // buffer in it), but with this registration: the caller may hold a lock now
        // (`Lifetimes::reclaim` drops what it deregistered once its list is unlocked).
        if let Some(slot) = &self.slot {
            if let Some(b) = self.buf.take() {
                *slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(b);
            }
        }
        true
    }
}

/// A buffer on its way back from a region ([`MemoryRegion::into_buffer`](super::MemoryRegion::into_buffer)):
/// the region is gone for new requests; the buffer comes back once every request posted
/// before on the protection domain's QPs has completed and the device has deregistered it.
///
/// Dropping a `PendingBuffer` lets the buffer be dropped (freed) at that point instead.
#[must_use = "the buffer comes back only through try_take"]
pub struct PendingBuffer<B: RegionBuffer> {
    slot: Slot,
    pd: Pd,
    _buf: PhantomData<fn() -> B>,
}

impl<B: RegionBuffer> core::fmt::Debug for PendingBuffer<B> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("PendingBuffer")
            .field("buffer", &core::any::type_name::<B>())
            .field(
                "back",
                &self
                    .slot
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .is_some(),
            )
            .finish()
    }
}

impl<B: RegionBuffer> PendingBuffer<B> {
    pub(crate) fn new(slot: Slot, pd: Pd) -> PendingBuffer<B> {
        PendingBuffer {
            slot,
            pd,
            _buf: PhantomData,
        }
    }

    /// The buffer, once the device no longer uses it (reclaims the protection domain's
    /// parked registrations first); `None` while requests posted before
    /// [`into_buffer`](super::MemoryRegion::into_buffer) are outstanding (poll their CQs) or
    /// a memory window is still bound to the region, and after the buffer was taken.
    pub fn try_take(&mut self) -> Option<B> {
        self.pd.reclaim();
        let owned = self.slot.lock().unwrap_or_else(|e| e.into_inner()).take()?;
        // SAFETY: the slot is filled only after the device deregistered the bytes
        // (`WithBuffer::deregister`). `into_buffer` checked the type before parking, so
        // `Err` cannot happen (dropping the buffer then would be sound anyway).
        unsafe { owned.into::<B>() }.ok()
    }
}
