//! A spin lock with rdma-core's `mlx5_spinlock` semantics (a test-and-set on one flag, the
//! waiter spinning on plain loads): for critical sections of a few stores that two parties
//! rarely contend for, where a mutex would cost more than the work. Used by a BlueFlame
//! register shared by queues (`crate::direct::register`, rdma-core `bf->lock`) and by the
//! writer of an SRQ's ring (`crate::direct::srq`, rdma-core `srq->lock`).

use core::cell::UnsafeCell;
use core::ops::{Deref, DerefMut};
use core::sync::atomic::{AtomicBool, Ordering};

/// A value guarded by a spin lock.
pub(crate) struct Spin<T> {
    locked: AtomicBool,
    value: UnsafeCell<T>,
}

// SAFETY: the value is reached only through a `SpinGuard`, and one exists at a time (the
// flag's Acquire swap / Release store); the value moves between threads with the lock, so
// it must be `Send`.
unsafe impl<T: Send> Sync for Spin<T> {}
// SAFETY: owning the lock owns the value.
unsafe impl<T: Send> Send for Spin<T> {}

impl<T> Spin<T> {
    pub(crate) const fn new(value: T) -> Spin<T> {
        Spin {
            locked: AtomicBool::new(false),
            value: UnsafeCell::new(value),
        }
    }

    /// Takes the lock.
    #[inline]
    pub(crate) fn lock(&self) -> SpinGuard<'_, T> {
        while self
            .locked
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            while self.locked.load(Ordering::Relaxed) {
                core::hint::spin_loop();
            }
        }
        SpinGuard {
            lock: self,
            _shares_as: core::marker::PhantomData,
        }
    }
}

/// The lock, held.
///
/// Shared between threads only where `T` is `Sync` (as `MutexGuard`): it derefs to `&T`,
/// and through `&Spin<T>` alone it would be `Sync` for any `T: Send`, handing a `Cell` to
/// two threads at once (a review's note; no code shares a guard).
pub(crate) struct SpinGuard<'a, T> {
    lock: &'a Spin<T>,
    _shares_as: core::marker::PhantomData<&'a mut T>,
}

impl<T> Deref for SpinGuard<'_, T> {
    type Target = T;
    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: the lock is held: nobody else reaches the value.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> DerefMut for SpinGuard<'_, T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as above, and the guard is borrowed mutably.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T> Drop for SpinGuard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        // Release: everything written under the lock before the next holder's Acquire.
        self.lock.locked.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::Spin;
    use std::sync::Arc;

    /// Two threads incrementing through the lock lose no increment (a plain read-modify-
    /// write without it would).
    #[test]
    fn excludes() {
        let s = Arc::new(Spin::new(0u64));
        let ts: Vec<_> = (0..2)
            .map(|_| {
                let s = s.clone();
                std::thread::spawn(move || {
                    for _ in 0..20_000 {
                        let mut g = s.lock();
                        let v = *g;
                        *g = v + 1;
                    }
                })
            })
            .collect();
        for t in ts {
            t.join().unwrap();
        }
        assert_eq!(*s.lock(), 40_000);
    }
}
