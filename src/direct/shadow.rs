//! The state the send (receive) queue shares with its completion queue: cookies indexed by
//! WQE position and how far the ring has retired. The ring itself is never read back.
//!
//! Synchronisation: an entry is written by the poster before the doorbell record is stored
//! (Release); the device reads the record, runs the WQE and publishes its CQE (Release on the
//! owner byte); the poller's Acquire load of that byte therefore happens after the entry was
//! written. The poller then stores how far the ring has retired (Release), and the poster
//! loads it (Acquire) before reusing those blocks.

use crate::completion::WcOpcode;
use core::cell::UnsafeCell;
use core::sync::atomic::{AtomicU32, Ordering};

/// What the poller needs to know about one posted send WQE.
#[derive(Copy, Clone, Debug, Default)]
pub(crate) struct SendEntry {
    /// The user's cookie.
    pub(crate) cookie: u64,
    /// Producer index (16 bits) just after this WQE: everything before it is done when it
    /// completes.
    pub(crate) end: u16,
    /// What to report.
    pub(crate) opcode: WcOpcode,
    /// Bytes a successful completion reports (reads: length, atomics: operand size).
    pub(crate) byte_len: u32,
    /// False for a WQE the driver signaled only to reclaim ring space: its success is not
    /// reported to the user.
    pub(crate) report: bool,
}

/// Cookies of a ring, indexed by position (send: first block of the WQE; receive: entry).
pub(crate) struct Shadow<T> {
    mask: u32,
    entries: Box<[UnsafeCell<T>]>,
    /// Producer index (16 bits) up to which the ring is free again.
    retired: AtomicU32,
    /// Producer index (16 bits) after the last request posted (for deferred deregistration).
    posted: AtomicU32,
}

// SAFETY: entries are written only by the single poster (it holds `&mut` of its queue) for
// positions the device has not been told about, and read by the single poller only after the
// device completed them; the orderings described in the module docs make those accesses
// happen-before each other. `retired` is atomic.
unsafe impl<T: Send> Sync for Shadow<T> {}
// SAFETY: as above; the entries are plain data.
unsafe impl<T: Send> Send for Shadow<T> {}

impl<T: Copy + Default> Shadow<T> {
    pub(crate) fn new(cnt: u32) -> Shadow<T> {
        Shadow {
            mask: cnt - 1,
            entries: (0..cnt).map(|_| UnsafeCell::new(T::default())).collect(),
            retired: AtomicU32::new(0),
            posted: AtomicU32::new(0),
        }
    }

    /// The entries as a raw array of `cnt` (for a poster that indexes them itself; the
    /// rules of [`Shadow::set`] apply to its writes).
    pub(crate) fn slots(&self) -> *mut T {
        UnsafeCell::raw_get(self.entries.as_ptr())
    }

    /// Records the entry at position `pos` (poster only, before the doorbell record).
    #[inline(always)]
    pub(crate) fn set(&self, pos: u16, v: T) {
        let i = (pos as u32 & self.mask) as usize;
        debug_assert!(i < self.entries.len());
        // SAFETY: `i` is masked by `cnt - 1` and `entries` has `cnt` elements; see the `Sync`
        // impl: only the poster writes, and only free positions.
        unsafe { *self.entries.get_unchecked(i).get() = v }
    }

    /// The entry at `pos` (poller only, after its CQE was seen).
    #[inline(always)]
    pub(crate) fn get(&self, pos: u16) -> T {
        let i = (pos as u32 & self.mask) as usize;
        debug_assert!(i < self.entries.len());
        // SAFETY: as in `set`, for the index; see the `Sync` impl: read after the entry was
        // published through the device.
        unsafe { *self.entries.get_unchecked(i).get() }
    }

    /// Marks everything before `end` as free (poller).
    #[inline(always)]
    pub(crate) fn retire(&self, end: u16) {
        self.retired.store(end as u32, Ordering::Release);
    }

    /// Records how far the poster has posted (poster; one relaxed store).
    #[inline(always)]
    pub(crate) fn mark_posted(&self, end: u16) {
        self.posted.store(end as u32, Ordering::Relaxed);
    }

    /// How far the poster has posted.
    pub(crate) fn posted(&self) -> u16 {
        self.posted.load(Ordering::Relaxed) as u16
    }

    /// Whether everything posted before `mark` has completed (or retired past it).
    pub(crate) fn done_up_to(&self, mark: u16) -> bool {
        let retired = self.retired();
        retired == self.posted() || (retired.wrapping_sub(mark) as i16) >= 0
    }

    /// The position up to which the ring is free (poster).
    #[inline(always)]
    pub(crate) fn retired(&self) -> u16 {
        self.retired.load(Ordering::Acquire) as u16
    }
}
