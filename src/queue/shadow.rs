//! The state the send (receive) queue shares with its completion queue: cookies indexed by
//! WQE position and how far the ring has retired. The ring itself is never read back.
//!
//! Synchronisation: an entry is written by the poster before the doorbell record is stored
//! (Release); the device reads the record, runs the WQE and publishes its CQE (Release on the
//! owner byte); the poller's Acquire load of that byte therefore happens after the entry was
//! written. The poller then stores how far the ring has retired (Release), and the poster
//! loads it (Acquire) before reusing those blocks.
//!
//! Positions are 16-bit and wrap. Window bookkeeping needs to compare positions any distance
//! apart, so the poster also keeps, on its cold path, the retired position it last read as a
//! 64-bit count ([`Shadow::note_retired`]); every position still in the ring lies less than a
//! ring from it, which widens it exactly ([`Shadow::widen_posted`], [`Shadow::outcome`]).

use crate::completion::{Completion, WcOpcode, WcStatus};
use core::cell::UnsafeCell;
use core::sync::atomic::{fence, AtomicU16, AtomicU64, Ordering};

/// What the poller needs to know about one posted send WQE. 16 bytes: the cookie, the byte
/// count, and 4 bytes a poster stores as one word ([`SendEntry::tail`]). The first 13 bytes
/// (cookie, byte count, opcode) lie where a [`Completion`](crate::Completion) has the same
/// fields, and its bytes 13..16 are padding: a poller copies the 16 bytes in one move
/// ([`SendEntry::head_to`]).
#[derive(Copy, Clone, Debug, Default)]
#[repr(C)]
pub(crate) struct SendEntry {
    /// The user's cookie.
    pub(crate) cookie: u64,
    /// Bytes a successful completion reports (reads: length, atomics: operand size).
    pub(crate) byte_len: u32,
    /// What to report.
    pub(crate) opcode: WcOpcode,
    /// False for a WQE the driver signaled only to reclaim ring space: its success is not
    /// reported to the user.
    pub(crate) report: bool,
    /// Positions the WQE takes (send-ring blocks; 1 on the verbs path): when it completes,
    /// everything before its position plus `bbs` is done.
    pub(crate) bbs: u16,
}

/// The `byte_len` of the entry of a request the crate posts only to be flushed (a DCI's
/// `SendQueue::close_unsignaled_tail`): no request of a user's
/// has it with opcode `Nop` (a NOP's byte count is 0).
pub(crate) const FLUSH_MARK: u32 = u32::MAX;

impl SendEntry {
    /// Whether this is the entry of a request the crate posted only to be flushed: its
    /// completion (a flush) is never reported, only retired.
    #[cold]
    pub(crate) fn is_flush_mark(&self) -> bool {
        !self.report && self.opcode == WcOpcode::Nop && self.byte_len == FLUSH_MARK
    }

    /// The entry's bytes 12..16 (`opcode`, `report`, `bbs`, in that order) as one word in
    /// the machine's byte order: a poster stores it with one store, where the three
    /// fields written one by one took three (and a flag). `byte_len` (bytes 8..12) is
    /// stored apart: a constant for most requests, the length of a read.
    #[inline(always)]
    pub(crate) fn tail(bbs: u16, opcode: WcOpcode, report: bool) -> u32 {
        let b = bbs.to_ne_bytes();
        u32::from_ne_bytes([opcode as u8, report as u8, b[0], b[1]])
    }

    /// Makes `c` the successful completion of this entry on QP `qpn`, as both data paths'
    /// pollers report a send: the entry's head copied in one move ([`SendEntry::head_to`]),
    /// the rest what `Completion { cookie, byte_len, opcode, qpn, ..Completion::default() }`
    /// holds.
    #[inline(always)]
    pub(crate) fn completion_into(&self, qpn: u32, c: &mut Completion) {
        self.head_to(c);
        c.qpn = qpn;
        c.status = WcStatus::Success;
        c.src_qp = 0;
        c.imm = None;
        c.grh = false;
        c.syndrome = None;
    }

    /// Writes this entry's cookie, byte count and opcode into `c` with one 16-byte move (its
    /// other fields unchanged): what a poller of a send completion copies, where three
    /// loads and three stores took six instructions (icount poll hit 63.1 -> 59.1 with the
    /// zero fields of [`Completion`] written together).
    #[inline(always)]
    fn head_to(&self, c: &mut Completion) {
        // SAFETY: both are 16 bytes or more and 8-aligned (checked below); the 16 bytes
        // cover, in `c`, `cookie` (any bits), `byte_len` (any bits), `opcode` (a valid
        // `WcOpcode`: the entry's own) and three bytes of padding (any bits), each at the
        // same offset as in the entry (checked below). `self` and `c` do not overlap (a
        // shared and an exclusive reference).
        unsafe {
            core::ptr::copy_nonoverlapping(
                self as *const SendEntry as *const u8,
                c as *mut Completion as *mut u8,
                16,
            )
        }
    }
}

// `SendEntry::tail` writes these bytes; `SendEntry::head_to` copies the first 16 onto a
// `Completion`'s, whose bytes 13..16 are padding (its next field 4-aligned at 16).
const _: () = {
    use core::mem::{align_of, offset_of, size_of};
    assert!(size_of::<SendEntry>() == 16);
    assert!(align_of::<SendEntry>() == 8);
    assert!(offset_of!(SendEntry, byte_len) == 8);
    assert!(offset_of!(SendEntry, opcode) == 12);
    assert!(offset_of!(SendEntry, report) == 13);
    assert!(offset_of!(SendEntry, bbs) == 14);
    assert!(offset_of!(Completion, cookie) == 0);
    assert!(offset_of!(Completion, byte_len) == 8);
    assert!(offset_of!(Completion, opcode) == 12);
    assert!(offset_of!(Completion, qpn) == 16);
    assert!(align_of::<Completion>() == 8);
    assert!(size_of::<Completion>() >= 16);
    assert!(core::mem::size_of::<WcOpcode>() == 1);
};

/// Cookies of a ring, indexed by position (send: first block of the WQE; receive: entry).
pub(crate) struct Shadow<T> {
    mask: u32,
    entries: Box<[UnsafeCell<T>]>,
    /// Producer index up to which the ring is free again.
    retired: AtomicU16,
    /// Producer index after the last request posted (for deferred deregistration).
    posted: AtomicU16,
    /// Position (64-bit, see `base`) of the first request that completed in error
    /// ([`NO_ERROR`] until then): written once by the poller on its error path, read by
    /// window bookkeeping.
    first_error: AtomicU64,
    /// The retired position the poster read on its cold path last, counted from the ring's
    /// creation (64 bits; its low 16 bits are that position). Written by the poster only
    /// (Release), at least once every ring of positions: it reads the retired position again
    /// before it posts past the room it computed from the last one (`SendQueue::make_room`,
    /// `VerbsSendQueue::refill_room`), so every position posted since lies within a ring of
    /// this one, and so does the retired position and the first error.
    base: AtomicU64,
    /// Which queue this is, as its poster marks its requests (the verbs path's
    /// `wr_id`s, `crate::verbs::incarnation`); 0 when it does not.
    tag: u64,
}

/// Where a [`Shadow`]'s entries are and its index mask ([`Shadow::ring`]): a poller that
/// keeps them beside its `Arc` of the shadow reads an entry with one load less (the
/// shadow's address) than [`Shadow::entry`].
#[derive(Copy, Clone)]
pub(crate) struct Ring<T> {
    /// The shadow's `entries`.
    entries: *const UnsafeCell<T>,
    /// The shadow's `mask`.
    mask: u32,
}

impl<T> Ring<T> {
    /// [`Shadow::entry`] of the shadow this ring was taken from.
    ///
    /// # Safety
    /// As [`Shadow::entry`]; that shadow is alive while the reference is.
    #[inline(always)]
    pub(crate) unsafe fn entry<'a>(self, pos: u16) -> &'a T {
        let i = (pos as u32 & self.mask) as usize;
        // SAFETY: `i` is masked by `cnt - 1` and the live shadow's `entries` has `cnt`
        // elements; the rest as in `Shadow::entry`.
        unsafe { &*(*self.entries.add(i)).get() }
    }
}

/// `first_error` before any error.
const NO_ERROR: u64 = u64::MAX;

// SAFETY: entries are written only by the single poster (it holds `&mut` of its queue, or
// for a direct-path SRQ the ring writer's lock, which the poller takes to post a
// page-faulted receive again) for positions the device has not been told about, and read by
// the single poller only after the device completed them; the orderings described in the
// module docs (and the lock's Acquire / Release) make those accesses happen-before each
// other. `retired` is atomic.
unsafe impl<T: Send> Sync for Shadow<T> {}
// SAFETY: as above; the entries are plain data.
unsafe impl<T: Send> Send for Shadow<T> {}

impl<T: Copy + Default> Shadow<T> {
    pub(crate) fn new(cnt: u32) -> Shadow<T> {
        Shadow {
            tag: 0,
            mask: cnt - 1,
            entries: (0..cnt).map(|_| UnsafeCell::new(T::default())).collect(),
            retired: AtomicU16::new(0),
            posted: AtomicU16::new(0),
            first_error: AtomicU64::new(NO_ERROR),
            base: AtomicU64::new(0),
        }
    }

    /// The same shadow, whose poster marks its requests with `tag` ([`Shadow::tag`]).
    pub(crate) fn with_tag(mut self, tag: u64) -> Shadow<T> {
        self.tag = tag;
        self
    }

    /// Which queue this is, as its poster marks its requests (0 when it does not).
    #[inline(always)]
    pub(crate) fn tag(&self) -> u64 {
        self.tag
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

    /// The entry at `pos`, in place (poller only, after its CQE was seen).
    ///
    /// # Safety
    /// The reference must be dropped before the position is retired and can be reused:
    /// the poster writes it again then.
    #[inline(always)]
    pub(crate) unsafe fn entry(&self, pos: u16) -> &T {
        debug_assert!(((pos as u32 & self.mask) as usize) < self.entries.len());
        // SAFETY: the ring is this shadow's, alive while `self` is borrowed; the caller
        // keeps the reference only while the position is not free (the contract).
        unsafe { self.ring().entry(pos) }
    }

    /// Where the entries are and the index mask ([`Ring`]).
    #[inline(always)]
    pub(crate) fn ring(&self) -> Ring<T> {
        Ring {
            entries: self.entries.as_ptr(),
            mask: self.mask,
        }
    }

    /// Marks everything before `end` as free (poller, after it published its consumer
    /// index: see `cq_share`).
    #[inline(always)]
    pub(crate) fn retire(&self, end: u16) {
        self.retired.store(end, Ordering::Release);
    }

    /// Records how far the poster has posted (poster; one relaxed store).
    #[inline(always)]
    pub(crate) fn mark_posted(&self, end: u16) {
        self.posted.store(end, Ordering::Relaxed);
    }

    /// How far the poster has posted.
    pub(crate) fn posted(&self) -> u16 {
        self.posted.load(Ordering::Relaxed)
    }

    /// [`Shadow::posted`] as a 64-bit count (see `base`); any thread.
    pub(crate) fn posted_wide(&self) -> u64 {
        loop {
            let base = self.base.load(Ordering::Acquire);
            let posted = self.posted();
            // `posted` lies at or after `base` and less than a ring past it (as in
            // `outcome`); read again if the poster moved `base` meanwhile (the fence keeps
            // the load of `posted` before the second load of `base`, as a seqlock's
            // reader).
            fence(Ordering::Acquire);
            if self.base.load(Ordering::Relaxed) == base {
                return widen(base, posted);
            }
        }
    }

    /// Whether everything posted before the 64-bit count `mark` (from
    /// [`Shadow::posted_wide`]) has completed: exact however far the queue has gone since.
    pub(crate) fn done_up_to_wide(&self, mark: u64) -> bool {
        loop {
            let base = self.base.load(Ordering::Acquire);
            let retired = self.retired();
            let posted = self.posted();
            // As in `posted_wide`.
            fence(Ordering::Acquire);
            if self.base.load(Ordering::Relaxed) != base {
                continue;
            }
            return retired == posted || widen(base, retired) >= mark;
        }
    }

    /// The position up to which the ring is free (poster).
    #[inline(always)]
    pub(crate) fn retired(&self) -> u16 {
        self.retired.load(Ordering::Acquire)
    }

    /// Whether a request of the queue completed in error as far as the poller has seen: the
    /// QP is in error (every later request is flushed).
    pub(crate) fn failed(&self) -> bool {
        self.first_error.load(Ordering::Relaxed) != NO_ERROR
    }

    /// Records that the request at `pos` completed in error (poller, error path only, before
    /// it retires the request). Only the first one counts: the QP is in error from there on
    /// and every later request is flushed.
    #[cold]
    pub(crate) fn note_error(&self, pos: u16) {
        // The request is not retired yet, so the poster's `base` (a retired position it read)
        // is at or before it; and it was posted after the `base` the poster last stored
        // before posting it, which the device's completion makes visible here, and less than
        // a ring after that one. So it is within 65,535 positions after any `base` read now.
        let base = self.base.load(Ordering::Acquire);
        let _ = self.first_error.compare_exchange(
            NO_ERROR,
            widen(base, pos),
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
    }

    /// Records the retired position the poster has just read on its cold path, before it
    /// computes how far it may post from it (poster only; one load and one store, not on
    /// the fast path).
    pub(crate) fn note_retired(&self, retired: u16) {
        let base = self.base.load(Ordering::Relaxed);
        // Retired positions only grow, and the poster posted less than a ring past the last
        // `base` (the room it computed from it), so the new one is less than a ring ahead.
        self.base.store(widen(base, retired), Ordering::Release);
    }

    /// The 64-bit count of position `pos`, one the poster has just posted (poster only).
    pub(crate) fn widen_posted(&self, pos: u16) -> u64 {
        // `pos` was posted after the poster read the retired position `base` holds, and
        // before its room from there (at most a ring) ran out.
        widen(self.base.load(Ordering::Relaxed), pos)
    }

    /// How the request occupying positions `start .. end` (64-bit counts from
    /// [`Shadow::widen_posted`]) ended, as far as the poller knows: `Some(true)` succeeded,
    /// `Some(false)` failed or was flushed, `None` not known yet. Exact however many
    /// positions have been posted since (cold path: window bookkeeping).
    ///
    /// Requests run in order and the first failure moves the QP to error, so a request
    /// succeeded if it retired before any error, or if the first error came after it.
    pub(crate) fn outcome(&self, start: u64, end: u64) -> Option<bool> {
        loop {
            let base = self.base.load(Ordering::Acquire);
            // Acquire on `retired` orders the error mark (written before the retire) before
            // the loads below.
            let retired = self.retired();
            let err = self.first_error.load(Ordering::Relaxed);
            // The retired position is at or after `base` (a value of it the poster read, and
            // the Acquire above orders that read before ours). If the poster has not moved
            // `base` since, it has posted less than a ring past it, and the retired position
            // is no further: one 16-bit distance from `base` says where it is. If it has
            // (a position retired beyond the ring was posted after a newer `base`, which the
            // retire's Release then makes visible here), read again; the fence keeps the
            // loads above before this one, as a seqlock's reader.
            fence(Ordering::Acquire);
            if self.base.load(Ordering::Relaxed) != base {
                continue;
            }
            if err != NO_ERROR {
                // At or before `start` means this one failed.
                return Some(err > start);
            }
            return (widen(base, retired) >= end).then_some(true);
        }
    }
}

/// The 64-bit count of the 16-bit position `pos`, given that it lies at or after the count
/// `base` and less than 65,536 positions from it.
fn widen(base: u64, pos: u16) -> u64 {
    base + pos.wrapping_sub(base as u16) as u64
}

/// How far a queue's positions are retired (for the CQ accounting, which does not care
/// what the entries hold).
pub(crate) trait Retired: Send + Sync {
    /// The position up to which the poller has retired the queue.
    fn retired(&self) -> u16;
}

impl<T: Copy + Default + Send> Retired for Shadow<T> {
    fn retired(&self) -> u16 {
        Shadow::retired(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `SendEntry::tail` is the entry's bytes 12..16 as its fields lay them out, for every
    /// opcode and both report flags.
    #[test]
    fn the_tail_word_is_the_entrys_last_four_bytes() {
        use WcOpcode::*;
        for opcode in [
            Send, RdmaWrite, RdmaRead, CompSwap, FetchAdd, BindMw, LocalInv, Nop,
        ] {
            for report in [false, true] {
                let e = SendEntry {
                    cookie: 0x0102_0304_0506_0708,
                    byte_len: 0xa1b2_c3d4,
                    bbs: 0x1e2f,
                    opcode,
                    report,
                };
                // SAFETY: 16 bytes of initialised fields, no padding (checked above).
                let bytes: [u8; 16] = unsafe { core::mem::transmute(e) };
                let tail = SendEntry::tail(e.bbs, opcode, report);
                assert_eq!(tail.to_ne_bytes(), bytes[12..], "{opcode:?} {report}");
                assert_eq!(e.byte_len.to_ne_bytes(), bytes[8..12]);
            }
        }
    }
}
