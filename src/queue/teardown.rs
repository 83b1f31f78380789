//! QP teardown on a direct-path CQ: the entries a destroyed QP left in the CQ must never be
//! taken for those of a later QP that gets the same number.
//!
//! rdma-core cleans a CQ when a QP is destroyed (`mlx5_destroy_qp` -> `__mlx5_cq_clean`:
//! find the producer end from the consumer index, then compact the ring over the QP's
//! entries under the CQ lock), but not a CQ that `mlx5dv_init_obj` handed to the application
//! (`MLX5_CQ_FLAGS_DV_OWNED`): that one is ours. Compacting the ring would race with the
//! poller, which takes no lock. Instead, once the QP is destroyed (after which the device
//! writes no entry for it), [`device_end`] finds where the device's entries end,
//! scanning the owner bits from the consumer index the poller last published, and the CQ's
//! registry keeps a [`Tombstone`]: the poller's general path discards entries of that QP
//! number until its consumer index reaches that end, then drops the tombstone. The send
//! fast path never sees them: while the poller holds a live tombstone, every poll takes the
//! general path (the fast path's one generation compare fails), which costs nothing once
//! the tombstones are gone, typically after the next poll.

use super::cq_share::RingView;
use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU8, Ordering};
use mlx5::cqe::is_sw_owned;

/// The format bits of `op_own`; both set: a compressed session's title.
const FORMAT_MASK: u8 = 0b1100;
use mlx5::doorbell::CQ_SET_CI;

/// `(start, end)` of `ring`: the consumer index the poller last published, and the index of
/// the first entry the device has not written yet (24-bit consumer-index space). Every entry
/// the device wrote before this call and the poller has not consumed lies in between.
pub(crate) fn device_end(ring: &RingView) -> (u32, u32) {
    // SAFETY: the record is live (see `RingView`'s `Send` impl) and aligned; the poller
    // stores it atomically.
    let ci = u32::from_be(unsafe {
        (*(ring.dbrec.add(CQ_SET_CI) as *const AtomicU32)).load(Ordering::Acquire)
    }) & 0xff_ffff;
    let mut end = ci;
    let mut seen = 0;
    while seen < ring.cnt {
        let i = (end & (ring.cnt - 1)) as usize;
        let at = ring.first_own.wrapping_add(i * ring.stride);
        // SAFETY: entry `i` < cnt lies inside the live ring; the device writes its owner byte
        // concurrently, hence the atomic load.
        let own = unsafe { (*(at as *const AtomicU8)).load(Ordering::Acquire) };
        if !is_sw_owned(own, end, ring.cnt) {
            break;
        }
        // A compressed session's title: the session takes `byte_cnt` slots (the rest of
        // them have no owner byte).
        let span = if own & FORMAT_MASK == FORMAT_MASK {
            let mut b = [0u8; 4];
            for (k, v) in b.iter_mut().enumerate() {
                // SAFETY: `byte_cnt` (bytes 44..48 of the 64-byte CQE ending at the owner
                // byte) lies in the same live slot, written before its owner byte (Acquire).
                *v = unsafe {
                    (*(at.wrapping_sub(19 - k) as *const AtomicU8)).load(Ordering::Relaxed)
                };
            }
            u32::from_be_bytes(b).clamp(1, ring.cnt - seen)
        } else {
            1
        };
        seen += span;
        end = end.wrapping_add(span) & 0xff_ffff;
    }
    (ci, end)
}

/// Entries of a destroyed QP still in a CQ: those at consumer indices `start .. end`
/// (24 bits, wrapping) with QP number `qpn`.
#[derive(Debug)]
pub(crate) struct Tombstone {
    pub(crate) qpn: u32,
    start: u32,
    end: u32,
    /// Set by the poller once its consumer index has passed `end`.
    done: AtomicBool,
    /// The SRQ the QP took its receives from: the WQEs of its discarded receive entries go
    /// back to it (rdma-core `__mlx5_cq_clean` frees them with `mlx5_free_srq_wqe`).
    pub(crate) srq: Option<std::sync::Arc<super::srq_shared::SrqShared>>,
}

impl Tombstone {
    pub(crate) fn new(qpn: u32, (start, end): (u32, u32)) -> Tombstone {
        Tombstone {
            qpn,
            start,
            end,
            done: AtomicBool::new(start == end),
            srq: None,
        }
    }

    /// The same, for a QP that took its receives from `srq`.
    pub(crate) fn with_srq(
        mut self,
        srq: Option<std::sync::Arc<super::srq_shared::SrqShared>>,
    ) -> Self {
        self.srq = srq;
        self
    }

    /// Whether the poller has passed it.
    pub(crate) fn is_done(&self) -> bool {
        self.done.load(Ordering::Acquire)
    }

    /// Whether the entry at consumer index `ci` lies in the window.
    #[inline]
    pub(crate) fn covers(&self, ci: u32) -> bool {
        (ci.wrapping_sub(self.start) & 0xff_ffff) < (self.end.wrapping_sub(self.start) & 0xff_ffff)
    }

    /// Called by the poller with its consumer index: marks the tombstone done once the
    /// index has left the window (it never comes back: the window is at most one ring).
    /// Returns whether it is still active.
    #[inline]
    pub(crate) fn still_ahead(&self, ci: u32) -> bool {
        let active = self.covers(ci & 0xff_ffff);
        if !active {
            self.done.store(true, Ordering::Release);
        }
        active
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_wrap_with_the_24_bit_index() {
        let t = Tombstone::new(5, (0xff_fffe, 2));
        assert!(!t.is_done());
        assert!(!t.covers(0xff_fffd));
        for ci in [0xff_fffe, 0xff_ffff, 0, 1] {
            assert!(t.covers(ci), "{ci:#x}");
        }
        assert!(!t.covers(2));
        assert!(
            t.still_ahead(0x0100_0001),
            "the poller's index counts past 24 bits"
        );
        assert!(!t.still_ahead(2));
        assert!(t.is_done());
        assert!(
            Tombstone::new(5, (7, 7)).is_done(),
            "nothing left: done at once"
        );
    }

    #[test]
    fn the_device_end_follows_the_owner_bits() {
        let cnt = 4u32;
        let mut ring = vec![0xf1u8; 64 * cnt as usize]; // never written: INVALID, owner 1
        let mut dbrec = [0u32; 2];
        let (buf, rec) = (ring.as_mut_ptr(), dbrec.as_mut_ptr());
        // The ring and record outlive the view; written below only through the same raw
        // pointers, on this thread.
        let v = RingView {
            first_own: buf.wrapping_add(63),
            stride: 64,
            cnt,
            dbrec: rec,
        };
        // SAFETY: entry `i` < cnt lies inside the ring (as above).
        let own = |i: usize, b: u8| unsafe { buf.add(i * 64 + 63).write(b) };
        // SAFETY: the record's consumer-index word (as above).
        let ci = |c: u32| unsafe { rec.add(CQ_SET_CI).write(c.to_be()) };
        assert_eq!(device_end(&v), (0, 0));
        own(0, 0x00); // written on pass 0 (owner 0)
        own(1, 0x00);
        assert_eq!(device_end(&v), (0, 2));
        ci(1);
        assert_eq!(device_end(&v), (1, 2));
        own(2, 0x00);
        own(3, 0x00);
        ci(0);
        assert_eq!(
            device_end(&v),
            (0, 4),
            "a full ring: the scan stops after one ring"
        );
        ci(4);
        assert_eq!(device_end(&v), (4, 4), "pass 1 wants owner 1");
        own(0, 0x01);
        assert_eq!(device_end(&v), (4, 5));
    }
}
