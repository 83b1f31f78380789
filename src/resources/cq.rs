//! Completion queues.

use super::Device;
use crate::direct::{CompletionQueue, Registry};
use crate::error::Result;
use crate::Completion;
use std::sync::Arc;

/// Keeps a CQ's rings alive; the last owner (the poller or a QP) destroys it.
pub(crate) struct CqHandle {
    pub(crate) dev: Device,
    pub(crate) cqn: u32,
    pub(crate) registry: Arc<Registry>,
}

impl Drop for CqHandle {
    fn drop(&mut self) {
        let _ = self.dev.nic.destroy_cq(self.cqn);
    }
}

/// A completion queue and its poller.
pub struct Cq {
    // Field order: the poller goes before the handle that frees its ring.
    poller: CompletionQueue,
    pub(crate) handle: Arc<CqHandle>,
}

impl core::fmt::Debug for Cq {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        self.poller.fmt(f)
    }
}

impl Cq {
    pub(crate) fn new(dev: &Device, entries: u32) -> Result<Cq> {
        let raw = dev.nic.create_cq(entries.max(2).next_power_of_two(), 64)?;
        // SAFETY: the ring and record belong to the CQ just created; `handle` keeps it alive
        // at least as long as the poller (field order), and this poller is its only one.
        let poller = unsafe { CompletionQueue::new(&raw)? };
        let handle = Arc::new(CqHandle {
            dev: dev.clone(),
            cqn: raw.cqn,
            registry: poller.registry.clone(),
        });
        Ok(Cq { poller, handle })
    }

    /// The CQ number.
    pub fn cqn(&self) -> u32 {
        self.poller.cqn()
    }

    /// Entries in the ring.
    pub fn capacity(&self) -> u32 {
        self.poller.capacity()
    }

    /// Polls up to `out.len()` completions; returns how many. Never blocks, never allocates.
    #[inline]
    pub fn poll(&mut self, out: &mut [Completion]) -> usize {
        self.poller.poll(out)
    }

    /// Polls until `n` completions have arrived or `spins` empty polls in a row; returns
    /// them in `out` (which must hold `n`). With the stepped software NIC, runs it between
    /// polls.
    pub fn poll_n(&mut self, out: &mut [Completion], n: usize, spins: u64) -> usize {
        let mut got = 0;
        let mut idle = 0;
        while got < n && idle < spins {
            self.handle.dev.process();
            let k = self.poller.poll(&mut out[got..n]);
            got += k;
            idle = if k == 0 { idle + 1 } else { 0 };
            if k == 0 {
                std::hint::spin_loop();
            }
        }
        got
    }

    /// The direct-path poller.
    pub fn poller(&mut self) -> &mut CompletionQueue {
        &mut self.poller
    }
}
