//! The live regions of a protection domain, as a receive finds the region each of its
//! entries lies in: the key, the range, what the device and the CPU may write, and the
//! region's pin count ([`Pins`]).

use super::pin::Pins;
use core::sync::atomic::{AtomicU64, Ordering};
use mlx5::request::Sge;
use mlx5::shared::Words;
use std::sync::{Arc, Mutex};

/// One registered region, as a posted receive may name it.
#[derive(Clone, Debug)]
pub(crate) struct Region {
    pub(crate) lkey: u32,
    pub(crate) addr: u64,
    pub(crate) len: u64,
    /// The region's whole words (`Words::of(addr, len)`).
    pub(crate) words: Words,
    /// Local write allowed: the device may place a receive in it.
    pub(crate) local_write: bool,
    /// Its bytes are mapped read-write for the CPU: the poller may copy a receive's data
    /// that came inside the CQE into it (not for read-only, dma-buf or implicit on-demand
    /// memory).
    pub(crate) cpu_writable: bool,
    /// Registered on demand (`IBV_ACCESS_ON_DEMAND`): its pages may fault on the device.
    pub(crate) on_demand: bool,
    /// How many posted receives may still write it; closed when the region is dropped.
    pub(crate) pins: Arc<Pins>,
}

impl Region {
    /// The region of `len` bytes at `addr` under `lkey`, open, with no pin.
    pub(crate) fn new(lkey: u32, addr: u64, len: u64) -> Region {
        Region {
            lkey,
            addr,
            len,
            words: Words::of(addr, len),
            local_write: false,
            cpu_writable: false,
            on_demand: false,
            pins: Arc::new(Pins::new()),
        }
    }

    /// Where an entry of this region lands (pinned by the caller).
    #[inline]
    fn landing(&self) -> Landing {
        Landing {
            pins: Some(Arc::as_ptr(&self.pins)),
            words: self.words,
            cpu_writable: self.cpu_writable,
        }
    }
}

impl Region {
    /// Whether the non-empty entry `s` lies inside this region under its key.
    #[inline]
    fn holds(&self, s: &Sge) -> bool {
        self.lkey == s.lkey
            && s.addr >= self.addr
            && s.addr - self.addr <= self.len
            && s.len as u64 <= self.len - (s.addr - self.addr)
    }
}

/// The live regions of a protection domain. Changing the list bumps a generation that a
/// receive queue compares with one load before it uses its own copy of the list.
#[derive(Default)]
pub(crate) struct Regions {
    /// 64 bits: it never comes round to a value a check saw (or starts from) again.
    gen: AtomicU64,
    list: Mutex<Vec<Region>>,
}

impl Regions {
    pub(crate) fn insert(&self, r: Region) {
        self.list.lock().unwrap_or_else(|e| e.into_inner()).push(r);
        self.gen.fetch_add(1, Ordering::Release);
    }

    /// Forgets a region (its `MemoryRegion` was dropped: later receives may not name it).
    /// Receives that pinned it keep it registered; its pins are closed by the caller.
    pub(crate) fn remove(&self, lkey: u32) {
        self.list
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|r| r.lkey != lkey);
        self.gen.fetch_add(1, Ordering::Release);
    }

    /// Copies the list into `cache` when it changed since `seen`.
    #[cold]
    fn refresh(&self, cache: &mut Vec<Region>, seen: &mut u64) {
        let gen = self.gen.load(Ordering::Acquire);
        if gen != *seen {
            cache.clear();
            cache.extend_from_slice(&self.list.lock().unwrap_or_else(|e| e.into_inner()));
            *seen = gen;
        }
    }
}

/// Where one receive entry landed: the region it pinned (None: it lies in no live region
/// the device may write, so nothing is held and the device will refuse it), the whole
/// words of the bytes the CPU may write, and whether it may.
#[derive(Copy, Clone, Debug)]
pub(crate) struct Landing {
    pub(crate) pins: Option<*const Pins>,
    pub(crate) words: Words,
    pub(crate) cpu_writable: bool,
}

/// The region a verbs receive queue's last entries landed in, as its usual receive checks
/// it ([`Hot::pin`]): a region of the list as last copied, with local write and
/// CPU-writable memory, its range as a start and a length, and its pins (kept alive by
/// `_keep`). A length of 0 holds nothing: no entry lies in it, and `pins` is not read. The
/// queue keeps a copy of its check's ([`RegionCheck::hot`], [`Hot::follow`]) beside the
/// rest of what its post reads.
#[derive(Clone)]
pub(crate) struct Hot {
    addr: u64,
    len: u64,
    pins: *const Pins,
    lkey: u32,
    /// The `Arc` `pins` points into: Some while `len` is not 0.
    _keep: Option<Arc<Pins>>,
}

// SAFETY: `pins` points to the `Pins` (`Sync`: atomics only) that `_keep`, moved or shared
// with it, keeps alive while it is read (`len` not 0).
unsafe impl Send for Hot {}
// SAFETY: as above; `&Hot` only reads the pointer and the `Pins`' atomics.
unsafe impl Sync for Hot {}

impl Hot {
    /// No region: nothing is pinned.
    pub(crate) const NONE: Hot = Hot {
        addr: 0,
        len: 0,
        pins: core::ptr::null(),
        lkey: 0,
        _keep: None,
    };

    /// Region `r` (CPU-writable, local write, ending at or below `2^64`).
    fn of(r: &Region) -> Hot {
        Hot {
            addr: r.addr,
            len: r.len,
            pins: Arc::as_ptr(&r.pins),
            lkey: r.lkey,
            _keep: Some(r.pins.clone()),
        }
    }

    /// Becomes `other` when it names another region (or none).
    #[inline]
    pub(crate) fn follow(&mut self, other: &Hot) {
        if self.pins != other.pins {
            *self = other.clone();
        }
    }

    /// The usual receive of the verbs path: when the non-empty entry `s` lies, under its
    /// key, in this region (local write, CPU-writable), pins it ([`Pins::pin`], one step
    /// against its close) and returns its pins; else None, nothing done (the caller takes
    /// [`RegionCheck::land`] through its general path). An empty entry is None. The caller
    /// owes an unpin for the pins it gets.
    ///
    /// The list's generation is not looked at: the pin itself is the check. A region is
    /// closed ([`Pins::close`]) before it is deregistered, so a pin that succeeds is one the
    /// region's release waits for, whatever the list says now; one dropped meanwhile
    /// refuses the pin, and the general path copies the list again. Regions registered
    /// since change nothing for an entry of this one.
    #[inline(always)]
    pub(crate) fn pin(&self, s: &Sge) -> Option<*const Pins> {
        // Inside `addr .. addr + len` and 1 byte or more: the offset of the entry's last
        // byte, `off + s.len - 1`, computed without a carry and below `len`. An empty entry
        // adds `2^64 - 1`: a carry, or (at `off` 0) a last byte past any region. An entry
        // that starts below `addr` has `off = s.addr - addr + 2^64`: a sum that does not
        // carry is `s.addr + s.len - 1 - addr + 2^64`, at least `2^64 - addr`, which no
        // hot region's `len` reaches (it ends at or below `2^64`: `land_search`).
        let off = s.addr.wrapping_sub(self.addr);
        let (last, carry) = off.overflowing_add((s.len as u64).wrapping_sub(1));
        if s.lkey != self.lkey || carry || last >= self.len {
            return None;
        }
        // SAFETY: `len` is not 0, so `pins` are those `_keep` holds alive.
        let pinned = unsafe { (*self.pins).pin() };
        pinned.then_some(self.pins)
    }
}

/// A receive queue's view of its domain's regions.
pub(crate) struct RegionCheck {
    /// The region the verbs path's usual receive tries ([`RegionCheck::hot`]).
    hot: Hot,
    seen: u64,
    regions: Arc<Regions>,
    cache: Vec<Region>,
    /// The index in `cache` of the region the last entry landed in, looked at first: a
    /// queue posts into the same region again and again.
    last: usize,
    /// `cache` holds an on-demand region ([`RegionCheck::on_demand`] has nothing to look
    /// for otherwise).
    odp: bool,
}

impl RegionCheck {
    pub(crate) fn new(regions: Arc<Regions>) -> RegionCheck {
        RegionCheck {
            hot: Hot::NONE,
            regions,
            cache: Vec::new(),
            seen: u64::MAX,
            last: 0,
            odp: false,
        }
    }

    #[inline(always)]
    fn fresh(&mut self) {
        if self.regions.gen.load(Ordering::Acquire) != self.seen {
            self.renew();
        }
    }

    /// [`RegionCheck::fresh`] when the list changed: copies it again. The hot region and
    /// the last index name entries of the old copy: both are forgotten (the next entry is
    /// looked for in the whole list, [`RegionCheck::land_search`], which sets them again).
    #[cold]
    #[inline(never)]
    fn renew(&mut self) {
        self.hot = Hot::NONE;
        self.last = usize::MAX;
        self.regions.refresh(&mut self.cache, &mut self.seen);
        self.odp = self.cache.iter().any(|r| r.on_demand);
    }

    /// The region the last entry found in the whole list landed in, when it is
    /// CPU-writable (else [`Hot::NONE`]): what the verbs path's usual receive tries first.
    pub(crate) fn hot(&self) -> &Hot {
        &self.hot
    }

    /// Finds the region the non-empty entry `s` lies in under its key, with local write,
    /// and pins it (one step against the region's close: [`Pins::pin`]). The caller owes an
    /// unpin for every `Landing::pins` it gets.
    #[inline(always)]
    pub(crate) fn land(&mut self, s: &Sge) -> Landing {
        self.fresh();
        match self.land_cached(s) {
            Some(l) => l,
            None => self.land_search(s),
        }
    }

    /// [`RegionCheck::land`] when the non-empty entry `s` lies in the region the last
    /// entry found in the whole list landed in (the direct path's usual receive; `land` after
    /// `fresh`); else
    /// None, nothing done (the caller takes the general path, which looks in the whole
    /// list). As [`Hot::pin`], the list's generation is not looked at: a region is closed
    /// before it is deregistered, so a pin that succeeds holds a region that is still
    /// registered, and a registered region never changes (its range, key and rights are
    /// those of the copy).
    #[inline(always)]
    pub(crate) fn land_cached(&self, s: &Sge) -> Option<Landing> {
        match self.cache.get(self.last) {
            // A region closed since the list was copied refuses the pin: as if not found.
            Some(r) if r.local_write && r.holds(s) && r.pins.pin() => Some(r.landing()),
            _ => None,
        }
    }

    /// [`RegionCheck::land`] in every region of the list.
    #[inline(never)]
    fn land_search(&mut self, s: &Sge) -> Landing {
        let found = self
            .cache
            .iter()
            .position(|r| r.local_write && r.holds(s) && r.pins.pin());
        match found {
            Some(i) => {
                self.last = i;
                let r = &self.cache[i];
                // A hot region ends at or below `2^64` (`Hot::pin`'s bound; every registered
                // region does).
                if r.cpu_writable && r.addr.checked_add(r.len).is_some() {
                    self.hot = Hot::of(r);
                }
                r.landing()
            }
            None => Landing {
                pins: None,
                words: Words::of(s.addr, s.len as u64),
                cpu_writable: false,
            },
        }
    }

    /// The lkey of the first non-empty entry that names an on-demand region, if any.
    pub(crate) fn on_demand(&mut self, sgl: &[Sge]) -> Option<u32> {
        self.fresh();
        if !self.odp {
            return None;
        }
        sgl.iter()
            .filter(|s| s.len != 0)
            .find(|s| self.cache.iter().any(|r| r.lkey == s.lkey && r.on_demand))
            .map(|s| s.lkey)
    }
}

/// A list of one locally and CPU-writable region, `lkey` over the 0x100 bytes at `addr`,
/// and its pins (tests of the queues that pin regions).
#[cfg(test)]
pub(crate) fn one_writable_region(lkey: u32, addr: u64) -> (Arc<Regions>, Arc<Pins>) {
    let regions = Arc::new(Regions::default());
    let pins = Arc::new(Pins::new());
    regions.insert(Region {
        local_write: true,
        cpu_writable: true,
        pins: pins.clone(),
        ..Region::new(lkey, addr, 0x100)
    });
    (regions, pins)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sge(addr: u64, len: u32, lkey: u32) -> Sge {
        Sge { addr, len, lkey }
    }

    fn region(lkey: u32, addr: u64, local_write: bool, cpu_writable: bool) -> Region {
        Region {
            local_write,
            cpu_writable,
            ..Region::new(lkey, addr, 0x100)
        }
    }

    /// Lands and gives the pin back; (pinned, CPU-writable).
    fn try_land(check: &mut RegionCheck, s: Sge) -> (bool, bool) {
        let l = check.land(&s);
        if let Some(p) = l.pins {
            // SAFETY: pinned just now: the pins are alive (the region list holds them).
            unsafe { (*p).unpin() };
        }
        (l.pins.is_some(), l.cpu_writable)
    }

    #[test]
    fn an_entry_lands_in_a_live_region_under_its_key_with_local_write() {
        let regions = Arc::new(Regions::default());
        let mut check = RegionCheck::new(regions.clone());
        assert_eq!(try_land(&mut check, sge(0x1000, 8, 7)), (false, false));
        regions.insert(region(7, 0x1000, true, true));
        regions.insert(region(8, 0x4000, false, true));
        regions.insert(region(9, 0x8000, true, false));
        assert_eq!(try_land(&mut check, sge(0x1000, 0x100, 7)), (true, true));
        assert_eq!(try_land(&mut check, sge(0x10f0, 0x10, 7)), (true, true));
        assert_eq!(
            try_land(&mut check, sge(0x10f0, 0x11, 7)),
            (false, false),
            "one byte past"
        );
        assert_eq!(
            try_land(&mut check, sge(0xff0, 0x20, 7)),
            (false, false),
            "starts before"
        );
        assert_eq!(
            try_land(&mut check, sge(0x1000, 8, 10)),
            (false, false),
            "wrong key"
        );
        assert_eq!(
            try_land(&mut check, sge(0x4000, 8, 8)),
            (false, false),
            "no local write"
        );
        assert_eq!(
            try_land(&mut check, sge(0x8000, 8, 9)),
            (true, false),
            "the device may write it, the CPU may not"
        );
        assert_eq!(
            try_land(&mut check, sge(u64::MAX, u32::MAX, 7)),
            (false, false),
            "no overflow"
        );
        // The words of an entry are its region's, wherever in it the entry lies.
        let l = check.land(&sge(0x1003, 4, 7));
        assert_eq!(l.words, Words::of(0x1000, 0x100));
        // SAFETY: pinned just now.
        unsafe { (*l.pins.unwrap()).unpin() };
        regions.remove(7);
        assert_eq!(
            try_land(&mut check, sge(0x1000, 8, 7)),
            (false, false),
            "dropped"
        );
    }

    /// The verbs receive's hot region: set by a search that lands in a CPU-writable
    /// region, it pins entries inside it under its key (nothing else: not past its end,
    /// not empty, not another key), refuses once the region is closed, and is forgotten
    /// when the list is copied again.
    #[test]
    fn the_hot_region_pins_only_entries_inside_it_while_it_is_open() {
        let pin_hot = |check: &mut RegionCheck, s: Sge| match check.hot().pin(&s) {
            Some(p) => {
                // SAFETY: pinned just now: the pins are alive (the check's copy holds them).
                unsafe { (*p).unpin() };
                true
            }
            None => false,
        };
        let regions = Arc::new(Regions::default());
        let mut check = RegionCheck::new(regions.clone());
        let r = region(7, 0x1000, true, true);
        let pins = r.pins.clone();
        regions.insert(r);
        regions.insert(region(9, 0x8000, true, false));
        assert!(
            !pin_hot(&mut check, sge(0x1000, 8, 7)),
            "nothing searched yet"
        );
        assert_eq!(try_land(&mut check, sge(0x8000, 8, 9)), (true, false));
        assert!(!pin_hot(&mut check, sge(0x8000, 8, 9)), "not CPU-writable");
        assert_eq!(try_land(&mut check, sge(0x1000, 8, 7)), (true, true));
        assert!(pin_hot(&mut check, sge(0x1000, 8, 7)));
        assert!(
            pin_hot(&mut check, sge(0x10f0, 0x10, 7)),
            "up to the last byte"
        );
        assert!(!pin_hot(&mut check, sge(0x10f0, 0x11, 7)), "one byte past");
        assert!(!pin_hot(&mut check, sge(0xff0, 0x20, 7)), "starts before");
        assert!(!pin_hot(&mut check, sge(0x1100, 1, 7)), "starts at the end");
        assert!(!pin_hot(&mut check, sge(0x1000, 0, 7)), "empty");
        assert!(!pin_hot(&mut check, sge(0x1000, 8, 8)), "another key");
        assert!(
            !pin_hot(&mut check, sge(u64::MAX, u32::MAX, 7)),
            "no overflow"
        );
        // Another region registered: the hot one still pins, until the list is copied.
        regions.insert(region(10, 0x4000, true, true));
        assert!(pin_hot(&mut check, sge(0x1000, 8, 7)));
        check.fresh();
        assert!(
            !pin_hot(&mut check, sge(0x1000, 8, 7)),
            "forgotten with the copy"
        );
        assert_eq!(try_land(&mut check, sge(0x1000, 8, 7)), (true, true));
        assert!(pin_hot(&mut check, sge(0x1000, 8, 7)));
        // Closed (its memory region dropped), still in the list and hot: no pin.
        assert!(pins.close());
        assert!(!pin_hot(&mut check, sge(0x1000, 8, 7)));
        assert!(pins.released());
    }

    /// A receive queue's copy of the hot region follows its check's and holds the region's
    /// pins itself: once the region is dropped (closed, then out of the list the check
    /// copied again) the copy, the only holder left, refuses the pin.
    #[test]
    fn a_copy_of_the_hot_region_follows_the_check_and_outlives_its_list() {
        let regions = Arc::new(Regions::default());
        let mut check = RegionCheck::new(regions.clone());
        let r = region(7, 0x1000, true, true);
        let pins = r.pins.clone();
        regions.insert(r);
        let mut copy = Hot::NONE;
        copy.follow(check.hot());
        assert!(
            copy.pin(&sge(0x1000, 8, 7)).is_none(),
            "nothing searched yet"
        );
        assert_eq!(try_land(&mut check, sge(0x1000, 8, 7)), (true, true));
        copy.follow(check.hot());
        let p = copy
            .pin(&sge(0x1000, 8, 7))
            .expect("the check's hot region");
        // SAFETY: pinned just now: the copy holds the pins alive.
        unsafe { (*p).unpin() };
        assert!(pins.close());
        regions.remove(7);
        check.fresh();
        drop(pins);
        assert!(copy.pin(&sge(0x1000, 8, 7)).is_none(), "closed");
        copy.follow(check.hot());
        assert!(copy.pin(&sge(0x1000, 8, 7)).is_none(), "forgotten");
    }

    /// A region closed while the queue's copy of the list still has it is not pinned.
    #[test]
    fn a_closed_region_is_never_pinned_even_from_a_stale_list() {
        let regions = Arc::new(Regions::default());
        let mut check = RegionCheck::new(regions.clone());
        let r = region(7, 0x1000, true, true);
        let pins = r.pins.clone();
        regions.insert(r);
        assert_eq!(try_land(&mut check, sge(0x1000, 8, 7)), (true, true));
        // Closed, but not yet removed from the list the check copied.
        assert!(pins.close());
        assert_eq!(try_land(&mut check, sge(0x1000, 8, 7)), (false, false));
        assert!(pins.released());
    }

    /// The domain's generation was 32 bits and a new check starts at
    /// `u32::MAX`: a receive queue made once the domain's regions changed 2^32 - 1 times
    /// (2^31 regions registered and dropped) never copies the list, and finds no region.
    #[test]
    fn a_check_made_at_generation_u32_max_sees_the_regions() {
        let regions = Arc::new(Regions::default());
        // The state after 2^32 - 2 inserts and removes (each bumps the generation by one).
        regions.gen.store(u32::MAX as u64 - 1, Ordering::Relaxed);
        regions.insert(region(7, 0x1000, true, true));
        let mut check = RegionCheck::new(regions.clone());
        assert_eq!(
            try_land(&mut check, sge(0x1000, 8, 7)),
            (true, true),
            "live region, its key"
        );
    }

    /// A check that last looked at generation g and is asked again exactly
    /// 2^32 changes later takes its stale copy for the current list.
    #[test]
    fn a_check_2_pow_32_changes_later_sees_the_new_region() {
        let regions = Arc::new(Regions::default());
        let mut check = RegionCheck::new(regions.clone());
        assert_eq!(try_land(&mut check, sge(0x1000, 8, 7)), (false, false));
        regions.insert(region(7, 0x1000, true, true));
        // 2^32 - 1 more changes elsewhere in the domain (as many registrations and drops).
        regions.gen.fetch_add(u32::MAX as u64, Ordering::Relaxed);
        assert_eq!(
            try_land(&mut check, sge(0x1000, 8, 7)),
            (true, true),
            "live region, its key"
        );
    }
}
