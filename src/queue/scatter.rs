//! The scatter list of every posted receive, kept beside the receive ring (never read back
//! from it): where the poller copies data that arrived inside a CQE, and which regions the
//! receive pins until it completes.
//!
//! Scatter-to-CQE: a ConnectX QP created by rdma-core scatters received sends of up to 32
//! bytes (64 with 128-byte CQEs) into the CQE and leaves the receive buffers untouched
//! (rdma-core `verbs.c` `use_scatter_to_cqe`; the kernel's `create_user_qp`). rdma-core's
//! poller copies them with `mlx5_copy_to_recv_wqe`, reading the scatter list back from the
//! receive ring; UCX hands the CQE bytes up directly. The direct path's poller copies, from
//! the copy of the scatter list kept here, so the ring stays write-only.
//!
//! Soundness: the poller writes with the CPU where the device would have written, so every
//! entry it writes must lie in registered, CPU-writable memory that stays alive until the
//! receive completes. When a receive is posted, each entry is looked up in its protection
//! domain's regions and the region is pinned in the same step ([`RegionCheck::land`],
//! `super::pin`); a receive with an entry outside every such region is marked and its
//! inline data are never copied (the completion reports a local protection error, as the
//! device does for such a receive when it writes the buffers itself). The pins are given
//! back when the receive completes ([`ScatterTable::done`]: the poller, after any copy and
//! before it retires the entry), or when the table goes (its queue's QP is destroyed, so
//! the device writes nothing more): a region dropped meanwhile stays registered until then.
//! Both data paths keep the table: the verbs path for the pins (rdma-core's mlx5 provider
//! copies with the CPU too; other devices write the buffers themselves).

use super::pin::Pins;
use super::regions::{Landing, RegionCheck};
use crate::completion::WcStatus;
use core::cell::UnsafeCell;
use mlx5::request::Sge;
use mlx5::shared::Words;

/// One scatter entry: where and how many bytes, the whole words of its region (the access
/// sizes every party uses for those bytes: `mlx5::shared`), and the region it pins (null:
/// none).
#[derive(Copy, Clone, Debug)]
struct Slot {
    addr: u64,
    len: u32,
    words: Words,
    pins: *const Pins,
}

impl Default for Slot {
    fn default() -> Slot {
        Slot {
            addr: 0,
            len: 0,
            words: Words::default(),
            pins: core::ptr::null(),
        }
    }
}

/// What one receive recorded: its `n` non-empty entries (slots), and whether the poller
/// may copy into them (every one lies in a CPU-writable region it pinned, or the queue's
/// owner vouched for them).
#[derive(Copy, Clone, Debug, Default)]
#[repr(C, align(2))]
struct Entry {
    n: u8,
    copy: bool,
}

impl Entry {
    /// One entry the poller may copy into, as one 16-bit word (the quick copy's compare).
    const ONE_TO_COPY: u16 = u16::from_ne_bytes([1, 1]);

    /// The entry as one 16-bit word.
    #[inline(always)]
    fn bits(&self) -> u16 {
        u16::from_ne_bytes([self.n, self.copy as u8])
    }
}

/// The longest quick copy ([`ScatterTable::copy_quick`]): the data a 64-byte CQE carries
/// (scatter-to-CQE, format INLINE_SCATTER_32).
pub(crate) const QUICK_MAX: u32 = 32;

// `copy_quick` copies with `copy_in_few_words`, which takes at most 32 bytes.
const _: () = assert!(QUICK_MAX <= 32);

/// The scatter lists of a receive ring, `max` entries per receive.
pub(crate) struct ScatterTable {
    mask: u32,
    max: usize,
    entries: Box<[UnsafeCell<Entry>]>,
    slots: Box<[UnsafeCell<Slot>]>,
}

// SAFETY: the same protocol as `Shadow`: receive `i`'s entry and slots are written only by
// the single poster (it holds `&mut` of its receive queue, or a direct-path SRQ's writer
// lock; `move_entry` is that holder moving a completed receive it was handed by the
// poller, on the poller's thread, into an entry not announced yet) before the doorbell record
// announces the receive (Release), and read and cleared only by the single poller after the
// device completed that receive (the Acquire load of the CQE's owner byte, or rdma-core's
// poll on the verbs path), before the poller retires it (Release), after which the poster
// (Acquire load of the retired mark) may write it again. A poster that records a receive
// and then does not post it clears it itself before anything is announced. The `Pins` the
// slots point to are kept alive by their regions while pinned (`super::pin`).
unsafe impl Sync for ScatterTable {}
// SAFETY: plain data and pointers to `Pins`, which are `Sync`; as above.
unsafe impl Send for ScatterTable {}

/// A receive of one entry whose region the verbs path pinned, recorded in a
/// [`ScatterTable`] straight from its post ([`ScatterTable::pinned_places`]): the entry and
/// its pin only. On the verbs path rdma-core copies what came inside a CQE itself and the
/// table only gives the pins back ([`ScatterTable::done`]), so the slot's other fields are
/// not written and the entry says the poller may not copy into it (none does on that path).
/// The table's own pointers and shape, read once when the queue is made, so that a post
/// stores two words where it loaded four more through the table first.
#[derive(Copy, Clone, Debug)]
pub(crate) struct PinnedPlaces {
    entries: *mut Entry,
    /// The `pins` field of the table's first slot.
    pins: *mut *const Pins,
    /// Bytes from one receive's first slot to the next's (`max` slots).
    stride: usize,
    mask: u32,
}

impl PinnedPlaces {
    /// The table's index of position `pos` (the shadow's too: both have the ring's `cnt`).
    #[inline(always)]
    pub(crate) fn index(&self, pos: u16) -> usize {
        (pos as u32 & self.mask) as usize
    }

    /// Records the receive at index `i` ([`PinnedPlaces::index`]) as one entry pinning
    /// `pins` (from [`Hot::pin`](super::regions::Hot::pin); given back by [`ScatterTable::done`]).
    ///
    /// # Safety
    /// The table these places were read from is alive; the caller is its poster and the
    /// receive at `i` is not announced (see the `Sync` impl of [`ScatterTable`]).
    #[inline(always)]
    pub(crate) unsafe fn record(&self, i: usize, pins: *const Pins) {
        debug_assert!(i <= self.mask as usize);
        // SAFETY: `i` < cnt (masked): entry `i` and the `pins` of its first slot (`i * max`
        // slots, `i * stride` bytes, on; `max >= 1` per entry) lie in the live table; only the poster writes
        // them, for receives not yet announced (the caller's contract).
        unsafe {
            *self
                .pins
                .cast::<u8>()
                .add(i * self.stride)
                .cast::<*const Pins>() = pins;
            *self.entries.add(i) = Entry { n: 1, copy: false };
        }
    }
}

impl ScatterTable {
    pub(crate) fn new(cnt: u32, max: usize) -> ScatterTable {
        ScatterTable {
            mask: cnt - 1,
            max,
            entries: (0..cnt)
                .map(|_| UnsafeCell::new(Entry::default()))
                .collect(),
            slots: (0..cnt as usize * max)
                .map(|_| UnsafeCell::new(Slot::default()))
                .collect(),
        }
    }

    /// Records the scatter list of the receive at `pos` (poster only, before the doorbell
    /// record; at most `max` non-empty entries, checked by the caller). With `check`, each
    /// entry pins the region it lies in ([`RegionCheck::land`]) and the poller may copy only
    /// if every one is CPU-writable; without (a raw queue whose owner vouches for the
    /// memory), the entries' own ranges, pinning nothing. Returns the lkey of the first
    /// entry the poller may not copy into (None: it may copy). The pins are given back by
    /// [`ScatterTable::done`].
    #[inline]
    pub(crate) fn record(
        &self,
        pos: u16,
        sgl: &[Sge],
        mut check: Option<&mut RegionCheck>,
    ) -> Option<u32> {
        let i = (pos as u32 & self.mask) as usize;
        let base = i * self.max;
        let mut n = 0;
        let mut refused = None;
        for s in sgl {
            if s.len == 0 {
                continue;
            }
            if n == self.max {
                break;
            }
            let (words, pins) = match check.as_deref_mut() {
                Some(c) => {
                    let l = c.land(s);
                    if !l.cpu_writable && refused.is_none() {
                        refused = Some(s.lkey);
                    }
                    (l.words, l.pins.unwrap_or(core::ptr::null()))
                }
                None => (Words::of(s.addr, s.len as u64), core::ptr::null()),
            };
            // SAFETY: `base + n` < cnt * max; only the poster writes, and only entries of
            // receives not yet announced (see the `Sync` impl).
            unsafe {
                *self.slots.get_unchecked(base + n).get() = Slot {
                    addr: s.addr,
                    len: s.len,
                    words,
                    pins,
                }
            };
            n += 1;
        }
        let copy = refused.is_none();
        // SAFETY: as above (`i` < cnt).
        unsafe { *self.entries.get_unchecked(i).get() = Entry { n: n as u8, copy } };
        refused
    }

    /// [`ScatterTable::record`] of a receive of one non-empty entry `s`, the usual receive,
    /// straight through (inlined where it is posted).
    #[inline(always)]
    pub(crate) fn record_one(
        &self,
        pos: u16,
        s: &Sge,
        check: Option<&mut RegionCheck>,
    ) -> Option<u32> {
        self.record_landed(pos, s, check.map(|c| c.land(s)))
    }

    /// [`ScatterTable::record_one`] of the receive `s` landed in `landing` already (None:
    /// its queue checks no region, the caller vouches for it).
    #[inline(always)]
    pub(crate) fn record_landed(&self, pos: u16, s: &Sge, landing: Option<Landing>) -> Option<u32> {
        let i = (pos as u32 & self.mask) as usize;
        let (words, pins, copy) = match landing {
            Some(l) => (l.words, l.pins.unwrap_or(core::ptr::null()), l.cpu_writable),
            None => (Words::of(s.addr, s.len as u64), core::ptr::null(), true),
        };
        // SAFETY: entry `i` (< cnt) has `max >= 1` slots from `i * max`; only the poster
        // writes, and only entries of receives not yet announced (see the `Sync` impl).
        unsafe {
            *self.slots.get_unchecked(i * self.max).get() = Slot {
                addr: s.addr,
                len: s.len,
                words,
                pins,
            };
            *self.entries.get_unchecked(i).get() = Entry { n: 1, copy };
        }
        (!copy).then_some(s.lkey)
    }

    /// Where the verbs path records a receive of one entry whose region it pinned
    /// ([`Hot::pin`](super::regions::Hot::pin)) itself, by the index its post computed already
    /// ([`PinnedPlaces::record`]). Valid while this table lives.
    pub(crate) fn pinned_places(&self) -> PinnedPlaces {
        PinnedPlaces {
            entries: UnsafeCell::raw_get(self.entries.as_ptr()),
            // The `pins` of the first slot; the next receive's first slot is `max` on.
            pins: UnsafeCell::raw_get(self.slots.as_ptr())
                .cast::<u8>()
                .wrapping_add(core::mem::offset_of!(Slot, pins))
                .cast(),
            stride: self.max * core::mem::size_of::<Slot>(),
            mask: self.mask,
        }
    }

    /// The receive at `pos` is over: gives back the pins it holds (the poller, once its
    /// completion was consumed and any copy made, before the entry is retired; or the
    /// poster, for a receive it recorded and did not post). Its regions may be deregistered
    /// from then on.
    #[inline(always)]
    pub(crate) fn done(&self, pos: u16) {
        let i = (pos as u32 & self.mask) as usize;
        // SAFETY: `i` < cnt; the caller holds the entry (see the `Sync` impl).
        let e = unsafe { &mut *self.entries.get_unchecked(i).get() };
        let n = e.n as usize;
        // The slots' pins count only while `n` covers them: cleared in one store.
        e.n = 0;
        for k in 0..n {
            // SAFETY: entry `i` has `max >= n` slots from `i * max`.
            let pins = unsafe { (*self.slots.get_unchecked(i * self.max + k).get()).pins };
            if !pins.is_null() {
                // SAFETY: pinned by `record` and not given back since (`n` covered it):
                // the region keeps its pins alive while pinned.
                unsafe { (*pins).unpin() };
            }
        }
    }

    /// The receive recorded at `from` is posted again at `to` (an SRQ WQE the device
    /// completed with a page fault, `crate::direct::srq`): its list and its pins move, and
    /// `from` holds nothing any more.
    ///
    /// Both parties at once: the caller holds the SRQ ring's writer, so it is the poster of
    /// `to` (not announced yet), and it is the poller of `from` (completed, not retired).
    pub(crate) fn move_entry(&self, from: u16, to: u16) {
        let (f, t) = (
            (from as u32 & self.mask) as usize,
            (to as u32 & self.mask) as usize,
        );
        if f == t {
            return;
        }
        // SAFETY: both indices are masked (< cnt); the caller holds both entries (above),
        // which are distinct.
        unsafe {
            let e = &mut *self.entries.get_unchecked(f).get();
            for k in 0..e.n as usize {
                *self.slots.get_unchecked(t * self.max + k).get() =
                    *self.slots.get_unchecked(f * self.max + k).get();
            }
            *self.entries.get_unchecked(t).get() = *e;
            // The pins now count under `to` only.
            e.n = 0;
        }
    }

    /// The usual small receive's copy: when the receive at `pos` has one entry the poller
    /// may copy into, 8-byte aligned and at least `len` bytes long, and `len` is a multiple
    /// of 8 up to [`QUICK_MAX`], stores the `len` bytes at `data` there as whole words,
    /// gives the receive's pins back and returns true; else does nothing and returns false
    /// (the caller goes on to [`ScatterTable::copy_done`] or [`ScatterTable::done`]).
    ///
    /// # Safety
    /// As [`ScatterTable::copy_done`]; `data .. data + len` readable when `len` is at most
    /// [`QUICK_MAX`].
    #[inline(always)]
    pub(crate) unsafe fn copy_quick(&self, pos: u16, data: *const u8, len: u32) -> bool {
        // SAFETY: the caller's contract.
        let Some((e, first)) = (unsafe { self.one_to_copy(pos) }) else {
            return false;
        };
        if len > first.len || len > QUICK_MAX || (len as u64 | first.addr) & 7 != 0 {
            return false;
        }
        debug_assert!(
            first.addr >= first.words.lo && first.addr + len as u64 <= first.words.hi,
            "an aligned entry's whole words are its region's"
        );
        // SAFETY: `len` bytes (a multiple of 8) from the slot's aligned address, within its
        // `len`: whole words of its region (the slot lies in the region, `copy`, so
        // `addr + len` rounded down to 8 is at most the end of the region's last whole
        // word), a region pinned when posted (or vouched for by the queue's owner) and
        // registered until the pin goes, below; `data` has `len <= QUICK_MAX` readable
        // bytes outside every registered buffer (caller contract).
        unsafe { mlx5::shared::copy_in_few_words(first.addr as *mut u8, data, len as usize) };
        // SAFETY: the copy is made; the caller's contract.
        unsafe { release_one(e, first) };
        true
    }

    /// The entry of the receive at `pos` and its first slot, when that is its one slot
    /// and the poller may copy into it (the usual receive); else None.
    ///
    /// # Safety
    /// Poller only, after the CQE of the receive at `pos` was seen and before the entry is
    /// retired (see the `Sync` impl); neither reference is kept past that.
    #[inline(always)]
    #[allow(clippy::mut_from_ref)] // the entry is in an `UnsafeCell`: see the `Sync` impl
    unsafe fn one_to_copy(&self, pos: u16) -> Option<(&mut Entry, &Slot)> {
        let i = (pos as u32 & self.mask) as usize;
        // SAFETY: `i` is masked by `cnt - 1` (`entries` has `cnt` elements); the caller
        // holds the entry (its contract, `Sync`).
        let e = unsafe { &mut *self.entries.get_unchecked(i).get() };
        if e.bits() != Entry::ONE_TO_COPY {
            return None;
        }
        // SAFETY: entry `i` has `max >= 1` slots from `i * max`, written with it.
        let first = unsafe { &*self.slots.get_unchecked(i * self.max).get() };
        Some((e, first))
    }

    /// Copies `data` (what a CQE carried) into the scatter list of the receive at `pos`,
    /// as rdma-core's `copy_to_scat`: entry after entry, until the data run out, then
    /// gives the receive's pins back ([`ScatterTable::done`]). Returns the status of the
    /// receive: a local length error when the list is shorter than the data (nothing is
    /// written then), a local protection error when the list may not be written by the
    /// CPU.
    ///
    /// # Safety
    /// Poller only, after the CQE of the receive at `pos` was seen and before the entry is
    /// retired; `data` (at most 64 bytes) must not overlap the receive buffers.
    #[inline(always)]
    pub(crate) unsafe fn copy_done(&self, pos: u16, data: &[u8]) -> WcStatus {
        // SAFETY: the caller's contract.
        if let Some((e, first)) = unsafe { self.one_to_copy(pos) } {
            // The usual case: one entry holds it all.
            if data.len() <= first.len as usize {
                // SAFETY: the entry lies inside a live, CPU-writable registered region
                // (checked and pinned when posted, `copy`), which stays registered until
                // its pin goes, below.
                unsafe { copy_small(data, first.addr as *mut u8, first.words) };
                // SAFETY: the copy is made; the caller's contract.
                unsafe { release_one(e, first) };
                return WcStatus::Success;
            }
        }
        let i = (pos as u32 & self.mask) as usize;
        // SAFETY: `i` is masked by `cnt - 1` (`entries` has `cnt` elements); read after the
        // device completed the receive (caller contract, `Sync`).
        let e = unsafe { *self.entries.get_unchecked(i).get() };
        // SAFETY: the caller's contract.
        let status = unsafe { self.copy_list(i, e, data) };
        self.done(pos);
        status
    }

    /// [`ScatterTable::copy_done`]'s copy over several entries, or an error.
    ///
    /// # Safety
    /// As [`ScatterTable::copy_done`], for entry `i` (masked) holding `e`.
    #[cold]
    #[inline(never)]
    unsafe fn copy_list(&self, i: usize, e: Entry, data: &[u8]) -> WcStatus {
        if data.is_empty() {
            return WcStatus::Success;
        }
        if !e.copy {
            return WcStatus::LocProtErr;
        }
        // Read twice (length, then copy) rather than collected: no allocation in a poll.
        let slots = (0..e.n as usize)
            // SAFETY: entry `i` has `max >= n` slots from `i * max`, written with it.
            .map(|k| unsafe { *self.slots[i * self.max + k].get() });
        if slots.clone().map(|s| s.len as u64).sum::<u64>() < data.len() as u64 {
            return WcStatus::LocLenErr;
        }
        let mut rest = data;
        for s in slots {
            let m = rest.len().min(s.len as usize);
            // SAFETY: as in `copy`, for `m <= len` bytes of this entry.
            unsafe { copy_small(&rest[..m], s.addr as *mut u8, s.words) };
            rest = &rest[m..];
        }
        WcStatus::Success
    }
}

impl Drop for ScatterTable {
    /// The last holder of the table is gone: its queue's QP was destroyed before (the
    /// queue holds the table, and its owner destroys the QP before dropping the queue;
    /// the poller's copy goes after), so the device writes none of its receives any more:
    /// the pins of those never completed are given back.
    fn drop(&mut self) {
        for pos in 0..=self.mask {
            self.done(pos as u16);
        }
    }
}

/// The refusal of a receive with the entry of `lkey` outside every CPU-writable region of
/// its domain, on a device whose provider copies small messages into the buffers with the
/// CPU and checks no key (rdma-core's mlx5 `mlx5_copy_to_recv_wqe`): posted, it would let a
/// peer's bytes land wherever the entry points.
#[cold]
pub(crate) fn not_cpu_writable(lkey: u32) -> crate::error::Error {
    crate::error::Error::InvalidParameter {
        what: "receive entry outside every CPU-writable registered region of the protection \
               domain (lkey; rdma-core's mlx5 provider copies small messages into receive \
               buffers with the CPU)",
        value: lkey as u64,
    }
}

/// A receive of one slot `first` (its entry `e`) is over: its pins go back, as
/// [`ScatterTable::done`] gives them back for any receive.
///
/// # Safety
/// As [`ScatterTable::done`]: the poller holds the entry, its copy is made.
#[inline(always)]
unsafe fn release_one(e: &mut Entry, first: &Slot) {
    // The pins count only while `n` covers them: cleared in one store.
    e.n = 0;
    if !first.pins.is_null() {
        // SAFETY: pinned by `record` and not given back since (`n` covered it): the
        // region keeps its pins alive while pinned.
        unsafe { (*first.pins).unpin() };
    }
}

/// Copies at most 64 bytes (what a CQE carries) into region memory with relaxed atomic
/// stores of the sizes the region's bytes always get (`mlx5::shared`): the same accesses as
/// the software NIC's DMA and `MemoryRegion::read`/`write`, so a thread reading the region
/// meanwhile races with nothing.
///
/// # Safety
/// `dst .. dst + src.len()` must lie in the region whose whole words are `words`, be valid
/// for writes and not overlap `src`.
#[inline(always)]
unsafe fn copy_small(src: &[u8], dst: *mut u8, words: Words) {
    // SAFETY: the caller's contract is `copy_in`'s.
    unsafe { mlx5::shared::copy_in(words, dst, src) }
}

#[cfg(test)]
mod tests {
    use super::super::regions::{one_writable_region, Regions};
    use super::*;
    use std::sync::Arc;

    fn sge(addr: u64, len: u32, lkey: u32) -> Sge {
        Sge { addr, len, lkey }
    }

    #[test]
    fn copy_follows_the_list_and_its_bounds() {
        let mut a = [0u8; 4];
        let mut b = [0u8; 8];
        let t = ScatterTable::new(4, 3);
        let list = [
            sge(a.as_mut_ptr() as u64, 4, 1),
            sge(0, 0, 1), // skipped, as the receive WQE skips it
            sge(b.as_mut_ptr() as u64, 8, 1),
        ];
        assert_eq!(t.record(5, &list, None), None);
        let data: Vec<u8> = (1..=10).collect();
        // SAFETY: the buffers outlive the copies; single thread.
        assert_eq!(unsafe { t.copy_done(5, &data) }, WcStatus::Success);
        assert_eq!((a, b), ([1, 2, 3, 4], [5, 6, 7, 8, 9, 10, 0, 0]));
        // SAFETY: as above.
        assert_eq!(unsafe { t.copy_done(5, &[0xee; 13]) }, WcStatus::LocLenErr);
        assert_eq!(
            (a, b),
            ([1, 2, 3, 4], [5, 6, 7, 8, 9, 10, 0, 0]),
            "untouched"
        );
        // SAFETY: as above.
        assert_eq!(unsafe { t.copy_done(5, &[]) }, WcStatus::Success);
        // An entry outside every registered region: never written.
        let regions = Arc::new(Regions::default());
        let mut check = RegionCheck::new(regions);
        assert_eq!(t.record(6, &list, Some(&mut check)), Some(1));
        // SAFETY: as above.
        assert_eq!(unsafe { t.copy_done(6, &[1]) }, WcStatus::LocProtErr);
        assert_eq!(a[0], 1, "an unchecked list is never written");
    }

    /// The verbs path's receive recorded through the table's places: its pin is the one
    /// `done` gives back, at the receive's own index (3 entries a receive here, so a pin
    /// written a slot, not a receive, on would be missed).
    #[test]
    fn a_receive_recorded_by_its_places_gives_its_pin_back_when_done() {
        let pins = Pins::new();
        assert!(pins.pin() && pins.pin());
        let t = ScatterTable::new(4, 3);
        let places = t.pinned_places();
        assert_eq!(places.index(6), 2, "positions wrap on the ring");
        // SAFETY: `t` is alive; nothing else posts or polls it.
        unsafe {
            places.record(places.index(6), &pins);
            places.record(places.index(1), &pins);
        }
        assert!(!pins.close(), "two pins held");
        t.done(6);
        assert!(!pins.released(), "receive 1 still holds it");
        t.done(1);
        assert!(pins.released(), "both given back");
    }

    /// A receive pins each region it lands in until it is done; the table gives back the
    /// pins of receives never completed when it goes.
    #[test]
    fn a_receive_holds_its_regions_until_done_or_the_table_goes() {
        let (regions, pins) = one_writable_region(7, 0x1000);
        let mut check = RegionCheck::new(regions.clone());
        let t = ScatterTable::new(4, 2);
        let two = [sge(0x1000, 8, 7), sge(0x1080, 8, 7)];
        assert_eq!(t.record(0, &two, Some(&mut check)), None);
        assert_eq!(t.record(1, &two[..1], Some(&mut check)), None);
        regions.remove(7);
        assert!(!pins.close(), "three pins held");
        t.done(0);
        assert!(!pins.released(), "receive 1 still holds it");
        t.done(0);
        assert!(!pins.released(), "done twice gives back nothing more");
        drop(t);
        assert!(pins.released(), "the table gave back receive 1's pin");
    }
}
