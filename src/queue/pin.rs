//! The pin count of a registered region: how many posted receives may still have bytes
//! written into it, and whether the region is closed to new ones.
//!
//! A receive names its buffers by plain keys, so nothing ties it to the `MemoryRegion` it
//! lands in; the region's owner may drop it (or turn it back into its buffer) on another
//! thread while a receive is being posted. The rule that keeps the bytes alive:
//!
//! - a receive **pins** every region its entries lie in, each with one atomic step that
//!   fails when the region is closed ([`Pins::pin`]): the check "is the region live" and
//!   the mark "a receive may write it" cannot be separated by a concurrent drop;
//! - the receive's completion **unpins** them once nothing more is written for it (the
//!   poller, after it copied data that came inside the CQE: [`Pins::unpin`], Release);
//! - dropping the region **closes** it ([`Pins::close`]): from then on no receive pins it,
//!   and it is deregistered (and its memory freed) only once the count is zero
//!   ([`Pins::released`], Acquire: every write made before the last unpin happens before).
//!
//! The count and the closed bit share one word, so the order of the steps on it is total:
//! a pin either comes before the close (and the close sees it) or after (and fails). The
//! protocol is model-checked with loom (`tests/loom_pins.rs`, which compiles this file
//! against loom's atomics through `super::sync`).

use super::sync::{AtomicU32, Ordering};

/// Set once the region is closed to new pins.
const CLOSED: u32 = 1 << 31;

/// The pin count and closed bit of one region.
#[derive(Debug)]
pub(crate) struct Pins(AtomicU32);

impl Pins {
    /// An open region with no pin.
    pub(crate) fn new() -> Pins {
        Pins(AtomicU32::new(0))
    }

    /// Takes one pin unless the region is closed: true when taken. One atomic step (a
    /// compare-and-swap on the word [`Pins::close`] sets), so a pin and a close cannot both
    /// miss each other. Refused too (false) at `2^31 - 1` pins, a count no set of receive
    /// rings reaches, rather than overflow into the closed bit.
    #[inline]
    pub(crate) fn pin(&self) -> bool {
        let mut cur = self.0.load(Ordering::Relaxed);
        loop {
            if cur >= CLOSED - 1 {
                return false;
            }
            // Relaxed: what matters is the order of the steps on this one word (its
            // modification order), which every atomic access sees the same.
            match self
                .0
                .compare_exchange_weak(cur, cur + 1, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return true,
                Err(now) => cur = now,
            }
        }
    }

    /// Gives back one pin taken by [`Pins::pin`], after every write made for it (Release:
    /// the writes happen before a [`Pins::released`] that sees the count drop).
    #[inline]
    pub(crate) fn unpin(&self) {
        self.0.fetch_sub(1, Ordering::Release);
    }

    /// Closes the region to new pins; returns [`Pins::released`] as of that step.
    pub(crate) fn close(&self) -> bool {
        self.0.fetch_or(CLOSED, Ordering::Acquire) & !CLOSED == 0
    }

    /// Whether the region is closed and no pin is held: no receive can write it any more.
    pub(crate) fn released(&self) -> bool {
        self.0.load(Ordering::Acquire) == CLOSED
    }
}
