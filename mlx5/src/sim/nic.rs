//! The software NIC's handle ([`Nic`]): one NIC's state behind its lock, shared by every
//! clone of the handle.

use super::error::SimError;
use super::state::{Limits, State};
use super::uar::UarConfig;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

/// What every handle of one NIC shares, and what anyone may do with the NIC: look at it and
/// step it. Nothing here frees a resource (the destroying calls are [`Nic`]'s alone), so a
/// crate that hands out `&NicView` of a NIC whose rings its own objects still use stays
/// sound. A [`Nic`] derefs to its view.
pub struct NicView {
    pub(crate) state: Mutex<State>,
    /// The doorbell thread runs.
    pub(crate) running: AtomicBool,
    /// The doorbell thread, to join when it stops.
    pub(crate) thread: Mutex<Option<JoinHandle<()>>>,
}

/// A software mlx5 NIC. Cloning gives another handle to the same NIC.
#[derive(Clone)]
pub struct Nic {
    pub(crate) inner: Arc<NicView>,
}

impl core::ops::Deref for Nic {
    type Target = NicView;
    fn deref(&self) -> &NicView {
        &self.inner
    }
}

impl NicView {
    /// The NIC's state, locked.
    pub(crate) fn st(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock is a bug in the NIC itself; keep going with its state.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl core::fmt::Debug for NicView {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("NicView")
            .field("threaded", &self.running.load(Ordering::Relaxed))
            .finish()
    }
}

impl Default for Nic {
    fn default() -> Self {
        Nic::new()
    }
}

impl core::fmt::Debug for Nic {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Nic")
            .field("threaded", &self.inner.running.load(Ordering::Relaxed))
            .finish()
    }
}

impl Nic {
    /// A NIC with no resources, in synchronous mode, with rdma-core's default register
    /// counts ([`UarConfig::default`]).
    pub fn new() -> Nic {
        Nic::with_limits(Limits::default())
    }

    /// A NIC with these BlueFlame register counts, in synchronous mode.
    pub fn with_uars(uars: UarConfig) -> Nic {
        Nic::with_limits_and_uars(Limits::default(), uars)
    }

    /// As [`Nic::new`], holding at most `limits` objects of each kind (each clamped to the
    /// hardware's 24-bit space, at least one).
    pub fn with_limits(limits: Limits) -> Nic {
        Nic::with_limits_and_uars(limits, UarConfig::default())
    }

    /// A NIC holding at most `limits` objects of each kind, with these BlueFlame register
    /// counts, in synchronous mode.
    pub fn with_limits_and_uars(limits: Limits, uars: UarConfig) -> Nic {
        Nic {
            inner: Arc::new(NicView {
                state: Mutex::new(State::new(limits, uars)),
                running: AtomicBool::new(false),
                thread: Mutex::new(None),
            }),
        }
    }

    /// Whether `pd` is a live protection domain.
    ///
    /// # Errors
    /// [`SimError::NoPd`].
    pub(crate) fn check_pd(st: &State, pd: u32) -> Result<(), SimError> {
        match st.mem.pds.get(pd as usize) {
            Some(true) => Ok(()),
            _ => Err(SimError::NoPd(pd)),
        }
    }

    /// Whether `other` is a handle to this same NIC (resources of one NIC never work with
    /// another's: their CQ and QP numbers overlap).
    pub fn same(&self, other: &Nic) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}
