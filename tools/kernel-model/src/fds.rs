//! The descriptors this model answers for, as lock-free sets: `write`, `read`, `mmap` and
//! the rest are interposed for every descriptor of the process, and most are not ours.

use std::sync::atomic::{AtomicU64, Ordering};

/// Descriptors below this are tracked (a test process opens a few hundred at most).
const MAX: usize = 4096;

/// A set of descriptors.
pub(crate) struct FdSet([AtomicU64; MAX / 64]);

/// The device files (`open("/dev/infiniband/uverbs0")`).
pub(crate) static DEVICES: FdSet = FdSet::new();
/// The event files (completion channels, the asynchronous event descriptor).
pub(crate) static EVENTS: FdSet = FdSet::new();

impl FdSet {
    const fn new() -> FdSet {
        FdSet([const { AtomicU64::new(0) }; MAX / 64])
    }

    /// Whether `fd` is in the set.
    pub(crate) fn has(&self, fd: i32) -> bool {
        usize::try_from(fd)
            .ok()
            .filter(|&f| f < MAX)
            .is_some_and(|f| self.0[f / 64].load(Ordering::Acquire) & 1 << (f % 64) != 0)
    }

    /// Adds `fd` (false when it is past the tracked range).
    pub(crate) fn add(&self, fd: i32) -> bool {
        match usize::try_from(fd).ok().filter(|&f| f < MAX) {
            Some(f) => {
                self.0[f / 64].fetch_or(1 << (f % 64), Ordering::AcqRel);
                true
            }
            None => false,
        }
    }

    /// Forgets `fd` (before the descriptor is closed and its number reused).
    pub(crate) fn remove(&self, fd: i32) {
        if let Some(f) = usize::try_from(fd).ok().filter(|&f| f < MAX) {
            self.0[f / 64].fetch_and(!(1 << (f % 64)), Ordering::AcqRel);
        }
    }
}
