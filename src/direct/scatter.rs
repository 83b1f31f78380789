//! Scatter-to-CQE on the receive side: the scatter list of every posted receive, kept by the
//! receive queue (never read back from the ring), and the copy of data that arrived inside a
//! CQE into it.
//!
//! A ConnectX QP created by rdma-core scatters received sends of up to 32 bytes (64 with
//! 128-byte CQEs) into the CQE and leaves the receive buffers untouched (rdma-core `verbs.c`
//! `use_scatter_to_cqe`; the kernel's `create_user_qp`). rdma-core's poller copies them with
//! `mlx5_copy_to_recv_wqe`, reading the scatter list back from the receive ring; UCX hands
//! the CQE bytes up directly. Here the poller copies, from a copy of the scatter list kept
//! per receive entry, so the ring stays write-only.
//!
//! Soundness: the poller writes with the CPU where the device would have written, so every
//! entry must lie in registered, writable memory that stays alive until the receive
//! completes. The queue checks each entry against its protection domain's regions when the
//! receive is posted ([`Regions`]); a receive that names anything else is marked and its
//! inline data are never copied (the completion reports a local protection error, as the
//! device does for such a receive when it writes the buffers itself). Regions dropped while
//! a receive is outstanding stay registered until it completes (`resources::lifetime`), and
//! the poller copies before it retires the entry.

use crate::completion::WcStatus;
use core::cell::UnsafeCell;
use core::sync::atomic::{AtomicU32, Ordering};
use mlx5::request::Sge;
use mlx5::shared::Words;
use std::sync::Mutex;

/// One registered region, as a posted receive may name it.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) struct Region {
    pub(crate) lkey: u32,
    pub(crate) addr: u64,
    pub(crate) len: u64,
    /// Local write allowed (a receive may land in it).
    pub(crate) writable: bool,
    /// Registered on demand (`IBV_ACCESS_ON_DEMAND`): its pages may fault on the device.
    pub(crate) on_demand: bool,
}

/// The live regions of a protection domain. Changing the list bumps a generation that a
/// receive queue compares with one load before it uses its own copy of the list.
#[derive(Default)]
pub(crate) struct Regions {
    gen: AtomicU32,
    list: Mutex<Vec<Region>>,
}

impl Regions {
    pub(crate) fn insert(&self, r: Region) {
        self.list.lock().unwrap_or_else(|e| e.into_inner()).push(r);
        self.gen.fetch_add(1, Ordering::Release);
    }

    /// Forgets a region (its `MemoryRegion` was dropped: later receives may not name it).
    pub(crate) fn remove(&self, lkey: u32) {
        self.list
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|r| r.lkey != lkey);
        self.gen.fetch_add(1, Ordering::Release);
    }

    /// Copies the list into `cache` when it changed since `seen`.
    #[cold]
    fn refresh(&self, cache: &mut Vec<Region>, seen: &mut u32) {
        let gen = self.gen.load(Ordering::Acquire);
        if gen != *seen {
            cache.clear();
            cache.extend_from_slice(&self.list.lock().unwrap_or_else(|e| e.into_inner()));
            *seen = gen;
        }
    }
}

/// A receive queue's view of its domain's regions.
pub(crate) struct RegionCheck {
    regions: std::sync::Arc<Regions>,
    cache: Vec<Region>,
    seen: u32,
}

impl RegionCheck {
    pub(crate) fn new(regions: std::sync::Arc<Regions>) -> RegionCheck {
        RegionCheck {
            regions,
            cache: Vec::new(),
            seen: u32::MAX,
        }
    }

    /// The whole words of the region `s` lies in, as found by the last
    /// [`RegionCheck::writable`] (the entry's own range if none: such an entry is never
    /// written).
    pub(crate) fn words_of(&self, s: &Sge) -> Words {
        self.cache
            .iter()
            .find(|r| {
                r.lkey == s.lkey && s.addr >= r.addr && s.addr - r.addr <= r.len && r.writable
            })
            .map_or(Words::of(s.addr, s.len as u64), |r| {
                Words::of(r.addr, r.len)
            })
    }

    /// The lkey of the first non-empty entry that names an on-demand region, if any.
    pub(crate) fn on_demand(&mut self, sgl: &[Sge]) -> Option<u32> {
        if self.regions.gen.load(Ordering::Acquire) != self.seen {
            self.regions.refresh(&mut self.cache, &mut self.seen);
        }
        sgl.iter()
            .filter(|s| s.len != 0)
            .find(|s| self.cache.iter().any(|r| r.lkey == s.lkey && r.on_demand))
            .map(|s| s.lkey)
    }

    /// Whether every non-empty entry lies inside one live, locally writable region under
    /// its lkey.
    pub(crate) fn writable(&mut self, sgl: &[Sge]) -> bool {
        if self.regions.gen.load(Ordering::Acquire) != self.seen {
            self.regions.refresh(&mut self.cache, &mut self.seen);
        }
        sgl.iter().filter(|s| s.len != 0).all(|s| {
            self.cache.iter().any(|r| {
                r.lkey == s.lkey
                    && r.writable
                    && s.addr >= r.addr
                    && s.addr - r.addr <= r.len
                    && s.len as u64 <= r.len - (s.addr - r.addr)
            })
        })
    }
}

/// What a receive entry's scatter list allows.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub(crate) enum Target {
    /// Nothing posted here yet.
    #[default]
    None,
    /// `n` entries, each checked against the registered regions.
    Checked(u8),
    /// Entries that name no live writable region: never written by the poller.
    Unchecked,
}

/// One scatter entry: where and how many bytes, and the whole words of its region (the
/// access sizes every party uses for those bytes: `mlx5::shared`).
#[derive(Copy, Clone, Debug, Default)]
struct Slot {
    addr: u64,
    len: u32,
    words: Words,
}

/// The scatter lists of a receive ring, `max` entries per receive.
pub(crate) struct ScatterTable {
    mask: u32,
    max: usize,
    targets: Box<[UnsafeCell<Target>]>,
    slots: Box<[UnsafeCell<Slot>]>,
}

// SAFETY: the same protocol as `Shadow`: entry `i` is written only by the single poster (it
// holds `&mut` of its receive queue) before the doorbell record announces the receive
// (Release), and read only by the single poller after the device completed that receive
// (the Acquire load of the CQE's owner byte), before the poller retires it (Release), after
// which the poster (Acquire load of the retired mark) may write it again.
unsafe impl Sync for ScatterTable {}
// SAFETY: plain data, as above.
unsafe impl Send for ScatterTable {}

impl ScatterTable {
    pub(crate) fn new(cnt: u32, max: usize) -> ScatterTable {
        ScatterTable {
            mask: cnt - 1,
            max,
            targets: (0..cnt).map(|_| UnsafeCell::new(Target::None)).collect(),
            slots: (0..cnt as usize * max)
                .map(|_| UnsafeCell::new(Slot::default()))
                .collect(),
        }
    }

    /// Records the scatter list of the receive at `pos` (poster only, before the doorbell
    /// record; at most `max` non-empty entries, checked by the caller), with the whole words
    /// of each entry's region.
    pub(crate) fn set(&self, pos: u16, sgl: &[Sge], checked: bool, words: impl Fn(&Sge) -> Words) {
        let i = (pos as u32 & self.mask) as usize;
        let mut n = 0;
        for s in sgl.iter().filter(|s| s.len != 0).take(self.max) {
            // SAFETY: `i * max + n` < cnt * max; only the poster writes, and only entries of
            // receives not yet announced (see the `Sync` impl).
            unsafe {
                *self.slots[i * self.max + n].get() = Slot {
                    addr: s.addr,
                    len: s.len,
                    words: words(s),
                }
            };
            n += 1;
        }
        let t = if checked {
            Target::Checked(n as u8)
        } else {
            Target::Unchecked
        };
        // SAFETY: as above.
        unsafe { *self.targets[i].get() = t };
    }

    /// Copies `data` (what a CQE carried) into the scatter list of the receive at `pos`,
    /// as rdma-core's `copy_to_scat`: entry after entry, until the data run out. Returns
    /// the status of the receive: a local length error when the list is shorter than the
    /// data (nothing is written then), a local protection error when the list was not
    /// checked.
    ///
    /// # Safety
    /// Poller only, after the CQE of the receive at `pos` was seen and before the entry is
    /// retired; `data` (at most 64 bytes) must not overlap the receive buffers.
    #[inline(always)]
    pub(crate) unsafe fn copy(&self, pos: u16, data: &[u8]) -> WcStatus {
        let i = (pos as u32 & self.mask) as usize;
        // SAFETY: `i` is masked by `cnt - 1` (`targets` has `cnt` entries); read after the
        // device completed the receive (caller contract, `Sync`).
        let target = unsafe { *self.targets.get_unchecked(i).get() };
        if let Target::Checked(1..) = target {
            // SAFETY: entry `i` has `max >= 1` slots from `i * max`, written with its
            // target (as above).
            let first = unsafe { *self.slots.get_unchecked(i * self.max).get() };
            // The usual case: the first entry holds it all.
            if data.len() <= first.len as usize {
                // SAFETY: the entry lies inside a live, locally writable registered region
                // (checked when posted, `Target::Checked`), which stays registered until
                // this receive retires (the caller has not retired it yet).
                unsafe { copy_small(data, first.addr as *mut u8, first.words) };
                return WcStatus::Success;
            }
        }
        // SAFETY: the caller's contract.
        unsafe { self.copy_list(i, target, data) }
    }

    /// [`ScatterTable::copy`] over several entries, or an error.
    ///
    /// # Safety
    /// As [`ScatterTable::copy`], for entry `i` (masked) whose target is `target`.
    #[cold]
    #[inline(never)]
    unsafe fn copy_list(&self, i: usize, target: Target, data: &[u8]) -> WcStatus {
        let n = match target {
            _ if data.is_empty() => return WcStatus::Success,
            Target::Checked(n) => n as usize,
            Target::Unchecked => return WcStatus::LocProtErr,
            Target::None => return WcStatus::GeneralErr,
        };
        let slots: Vec<Slot> = (0..n)
            // SAFETY: entry `i` has `max >= n` slots from `i * max`, written with its target.
            .map(|k| unsafe { *self.slots[i * self.max + k].get() })
            .collect();
        if slots.iter().map(|s| s.len as u64).sum::<u64>() < data.len() as u64 {
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
    use super::*;

    fn sge(addr: u64, len: u32, lkey: u32) -> Sge {
        Sge { addr, len, lkey }
    }

    #[test]
    fn region_check_needs_a_live_writable_region_under_the_key() {
        let regions = std::sync::Arc::new(Regions::default());
        let mut check = RegionCheck::new(regions.clone());
        assert!(!check.writable(&[sge(0x1000, 8, 7)]), "no region yet");
        assert!(
            check.writable(&[sge(0x1000, 0, 7)]),
            "empty entries name nothing"
        );
        regions.insert(Region {
            lkey: 7,
            addr: 0x1000,
            len: 0x100,
            writable: true,
            on_demand: false,
        });
        regions.insert(Region {
            lkey: 8,
            addr: 0x4000,
            len: 0x100,
            writable: false,
            on_demand: false,
        });
        assert!(check.writable(&[sge(0x1000, 0x100, 7)]));
        assert!(check.writable(&[sge(0x10f0, 0x10, 7), sge(0x1000, 1, 7)]));
        assert!(!check.writable(&[sge(0x10f0, 0x11, 7)]), "one byte past");
        assert!(!check.writable(&[sge(0xff0, 0x20, 7)]), "starts before");
        assert!(!check.writable(&[sge(0x1000, 8, 9)]), "wrong key");
        assert!(!check.writable(&[sge(0x4000, 8, 8)]), "no local write");
        assert!(
            !check.writable(&[sge(u64::MAX, u32::MAX, 7)]),
            "no overflow"
        );
        // The words of an entry are its region's, wherever in it the entry lies.
        assert!(check.writable(&[sge(0x1003, 4, 7)]));
        assert_eq!(check.words_of(&sge(0x1003, 4, 7)), Words::of(0x1000, 0x100));
        regions.remove(7);
        assert!(!check.writable(&[sge(0x1000, 8, 7)]), "dropped");
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
        let own = |s: &Sge| Words::of(s.addr, s.len as u64);
        t.set(5, &list, true, own);
        let data: Vec<u8> = (1..=10).collect();
        // SAFETY: the buffers outlive the copies; single thread.
        assert_eq!(unsafe { t.copy(5, &data) }, WcStatus::Success);
        assert_eq!((a, b), ([1, 2, 3, 4], [5, 6, 7, 8, 9, 10, 0, 0]));
        // SAFETY: as above.
        assert_eq!(unsafe { t.copy(5, &[0xee; 13]) }, WcStatus::LocLenErr);
        assert_eq!(
            (a, b),
            ([1, 2, 3, 4], [5, 6, 7, 8, 9, 10, 0, 0]),
            "untouched"
        );
        // SAFETY: as above.
        assert_eq!(unsafe { t.copy(5, &[]) }, WcStatus::Success);
        t.set(6, &list, false, own);
        // SAFETY: as above.
        assert_eq!(unsafe { t.copy(6, &[1]) }, WcStatus::LocProtErr);
        assert_eq!(a[0], 1, "an unchecked list is never written");
    }
}
