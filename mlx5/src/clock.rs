//! The NIC's clock: what a CQE's 64-bit `timestamp` holds and how it becomes nanoseconds.
//!
//! A ConnectX stamps every completion with one of two clocks (the QP context's
//! `ts_format`):
//!
//! - **free-running**: the HCA core clock, a counter at the device frequency
//!   (`hca_core_clock`, in kHz). The kernel (`mlx5_timecounter_init`, `clock.c`) keeps a
//!   timecounter over its low 41 bits and publishes its state in a page each process can
//!   map (`struct mlx5_ib_clock_info`, read by `mlx5dv_get_clock_info`); rdma-core's
//!   `mlx5dv_ts_to_ns` turns a stamp into nanoseconds of that timecounter with it
//!   ([`ClockInfo::ts_to_ns`]). The kernel moves the page on (its overflow work) at least
//!   once per [`ClockInfo::overflow_cycles`], so a reader refreshes its copy at least that
//!   often: rdma-core reads it again at each `ibv_start_poll` of a CQ that reports
//!   wall-clock times.
//! - **real-time** (devices with the real-time capability, when the kernel runs them so):
//!   seconds in the upper 32 bits, nanoseconds in the lower ([`real_time_to_ns`]); no page
//!   is needed.
//!
//! Error CQEs have no timestamp: their bytes 48 to 55 hold the syndromes.

/// The mask of the kernel's timecounter over the free-running counter: 41 bits
/// (`CLOCKSOURCE_MASK(41)` in `mlx5_timecounter_init`).
pub const CYCLES_MASK: u64 = (1 << 41) - 1;

/// Which clock a device stamps CQEs with.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum TimestampFormat {
    /// The free-running HCA core clock, converted with a [`ClockInfo`].
    FreeRunning,
    /// Real time: seconds above, nanoseconds below ([`real_time_to_ns`]).
    RealTime,
}

/// The kernel's conversion of the free-running counter to nanoseconds, as its clock-info
/// page publishes it (`struct mlx5_ib_clock_info`, `struct mlx5dv_clock_info`): at counter
/// value `last_cycles` the time was `nsec` (plus `frac` / 2^`shift`), and each cycle is
/// `mult` / 2^`shift` nanoseconds, over the counter's `mask` bits. Laid out as
/// `struct mlx5dv_clock_info`, which `mlx5dv_get_clock_info` fills.
#[repr(C)]
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default)]
pub struct ClockInfo {
    /// Nanoseconds at `last_cycles`.
    pub nsec: u64,
    /// The counter value the page was last moved on at.
    pub last_cycles: u64,
    /// The fraction of a nanosecond at `last_cycles`, in 2^-`shift` units.
    pub frac: u64,
    /// Nanoseconds per cycle, times 2^`shift`.
    pub mult: u32,
    /// See `mult`.
    pub shift: u32,
    /// The counter bits the conversion uses.
    pub mask: u64,
}

impl ClockInfo {
    /// The kernel's timecounter for a counter of `khz` kHz (`mlx5_timecounter_init`: the
    /// shift of `mlx5_ptp_shift_constant`, the multiplier of `clocksource_khz2mult`, 41
    /// bits), started at counter value `cycles` and time `nsec`. None for 0 kHz.
    pub fn for_frequency(khz: u32, cycles: u64, nsec: u64) -> Option<ClockInfo> {
        if khz == 0 {
            return None;
        }
        let khz64 = khz as u64;
        // The largest shift whose multiplier stays below 2^32 (nanoseconds per millisecond
        // of cycles), at most the one that makes a correction of 1 scaled ppm.
        let shift = (khz.ilog2() + 16).min(((u32::MAX as u64 / 1_000_000) * khz64).ilog2());
        let mult = ((1_000_000u128 << shift) + khz64 as u128 / 2) / khz64 as u128;
        Some(ClockInfo {
            nsec,
            last_cycles: cycles & CYCLES_MASK,
            frac: 0,
            mult: mult.min(u32::MAX as u128) as u32,
            shift,
            mask: CYCLES_MASK,
        })
    }

    /// rdma-core's `mlx5dv_ts_to_ns`: the nanoseconds of a free-running stamp, taken as
    /// after `last_cycles` when less than half the mask ahead of it, else as before it. The
    /// same arithmetic, in 128 bits: rdma-core's 64-bit product overflows for a stamp more
    /// than 2^64 / `mult` cycles from `last_cycles` (8.6 s at 1 GHz), and a completion
    /// polled that long after it was stamped, with a page read since, came out 2^33 ns late
    /// (a review's finding); here it is exact within half the mask (18 minutes at 1 GHz).
    /// Where rdma-core does not overflow the result is its own, to the nanosecond.
    pub fn ts_to_ns(&self, ts: u64) -> u64 {
        let mult = self.mult as u128;
        let shift = self.shift.min(63);
        let delta = ts.wrapping_sub(self.last_cycles) & self.mask;
        if delta > self.mask / 2 {
            let back = (self.last_cycles.wrapping_sub(ts) & self.mask) as u128;
            let ns = (back * mult).saturating_sub(self.frac as u128) >> shift;
            self.nsec.wrapping_sub(ns as u64)
        } else {
            let ns = (delta as u128 * mult + self.frac as u128) >> shift;
            self.nsec.wrapping_add(ns as u64)
        }
    }

    /// The most cycles a conversion may be away from `last_cycles` and stay exact: the kernel's
    /// overflow period (`mlx5_timecounter_init`: the fewer of 2^63 / `mult` and a third of
    /// the mask). The kernel moves its page on at least this often.
    pub fn overflow_cycles(&self) -> u64 {
        ((u64::MAX >> 1) / (self.mult.max(1) as u64)).min(self.mask / 3)
    }

    /// The page as the kernel's overflow work leaves it at counter value `now`
    /// (`timecounter_read`: the time moves on by the cycles since `last_cycles`, the fraction
    /// kept). `now` must be within [`ClockInfo::overflow_cycles`] ahead of `last_cycles`.
    pub fn moved_to(&self, now: u64) -> ClockInfo {
        let shift = self.shift.min(63);
        let delta = now.wrapping_sub(self.last_cycles) & self.mask;
        let ns = (delta as u128 * self.mult as u128) + self.frac as u128;
        ClockInfo {
            nsec: self.nsec.wrapping_add((ns >> shift) as u64),
            last_cycles: now & self.mask,
            frac: (ns & ((1u128 << shift) - 1)) as u64,
            ..*self
        }
    }
}

/// The nanoseconds of a real-time stamp: `(ts >> 32) * 10^9 + (ts & 0xffff_ffff)`
/// (rdma-core's `mlx5_real_time_ts_to_ns`).
pub fn real_time_to_ns(ts: u64) -> u64 {
    (ts >> 32)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts & 0xffff_ffff)
}

/// The real-time stamp of `ns` nanoseconds (what a device in real-time mode writes).
pub fn ns_to_real_time(ns: u64) -> u64 {
    ((ns / 1_000_000_000) << 32) | (ns % 1_000_000_000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernel_multiplier_of_common_frequencies() {
        // 1 GHz: 1 ns per cycle, shift 31.
        let c = ClockInfo::for_frequency(1_000_000, 0, 0).unwrap();
        assert_eq!((c.mult, c.shift), (1 << 31, 31));
        // 156.25 MHz (ConnectX-4): 6.4 ns per cycle, shift 29.
        let c = ClockInfo::for_frequency(156_250, 0, 0).unwrap();
        assert_eq!(c.shift, 29);
        assert_eq!(c.mult, 3_435_973_837); // 6.4 * 2^29, rounded
        assert_eq!(c.ts_to_ns(1_000), 6_400);
        assert_eq!(ClockInfo::for_frequency(0, 0, 0), None);
    }

    #[test]
    fn stamps_before_and_after_the_page_and_across_the_mask() {
        let c = ClockInfo::for_frequency(1_000_000, CYCLES_MASK - 10, 5_000).unwrap();
        assert_eq!(c.ts_to_ns(CYCLES_MASK - 10), 5_000);
        assert_eq!(c.ts_to_ns(CYCLES_MASK - 20), 4_990);
        // The counter wraps its 41 bits (and its 64): still 1 ns per cycle.
        assert_eq!(c.ts_to_ns(CYCLES_MASK + 1), 5_011);
        assert_eq!(c.ts_to_ns(u64::MAX), 5_010);
        assert_eq!(c.ts_to_ns(100), 5_111);
    }

    #[test]
    fn moving_the_page_keeps_every_conversion() {
        let c = ClockInfo::for_frequency(156_250, 7, 1 << 40).unwrap();
        let later = c.moved_to(7 + 1_000_003);
        for ts in [7 + 1_000_003, 7 + 2_000_000, 7 + 1_500_001] {
            assert_eq!(later.ts_to_ns(ts), c.ts_to_ns(ts), "{ts}");
        }
        // Far past the overflow period the moved page is right, and so is the stale one
        // (rdma-core's 64-bit product would have wrapped: `rdma_core` below).
        let far = 7 + 3 * c.overflow_cycles();
        let mut p = c;
        while p.last_cycles < far - c.overflow_cycles() {
            p = p.moved_to(p.last_cycles + c.overflow_cycles());
        }
        let exact = (1u64 << 40) + (((far - 7) as u128 * c.mult as u128) >> c.shift) as u64;
        assert!(p.ts_to_ns(far).abs_diff(exact) <= 1);
        assert_eq!(c.ts_to_ns(far), exact);
        assert_ne!(rdma_core(&c, far), exact, "rdma-core's product wraps there");
    }

    /// rdma-core's `mlx5dv_ts_to_ns` as it is written, in 64 bits.
    fn rdma_core(c: &ClockInfo, ts: u64) -> u64 {
        let mult = c.mult as u64;
        let delta = ts.wrapping_sub(c.last_cycles) & c.mask;
        if delta > c.mask / 2 {
            let back = c.last_cycles.wrapping_sub(ts) & c.mask;
            c.nsec
                .wrapping_sub(back.wrapping_mul(mult).wrapping_sub(c.frac) >> c.shift)
        } else {
            c.nsec
                .wrapping_add(delta.wrapping_mul(mult).wrapping_add(c.frac) >> c.shift)
        }
    }

    /// Within rdma-core's range the conversion is rdma-core's to the nanosecond, before and
    /// after the page and with a fraction; a stamp 13 s before a page read since (past
    /// 2^64 / `mult` cycles at 1 GHz) is exact, where rdma-core's came out 2^33 ns late.
    #[test]
    fn conversions_are_rdma_cores_and_exact_past_its_range() {
        for khz in [156_250, 1_000_000, 1_234_567] {
            let c = ClockInfo::for_frequency(khz, 1 << 30, 1 << 50).unwrap();
            let c = c.moved_to((1 << 30) + 12_345_677); // a fraction
            let r = c.overflow_cycles();
            for ts in [0, 1, r / 3, r - 1, r] {
                for t in [
                    c.last_cycles.wrapping_add(ts),
                    c.last_cycles.wrapping_sub(ts),
                ] {
                    assert_eq!(c.ts_to_ns(t), rdma_core(&c, t), "{khz} kHz, {t}");
                }
            }
        }
        let c = ClockInfo::for_frequency(1_000_000, 20_000_000_000, 1 << 60).unwrap();
        let back = 13_000_000_000u64;
        let stamp = c.last_cycles - back;
        assert_eq!(c.ts_to_ns(stamp), (1 << 60) - back, "1 ns per cycle");
        assert_eq!(
            rdma_core(&c, stamp) - c.ts_to_ns(stamp),
            1 << 33,
            "rdma-core's wraps"
        );
    }

    #[test]
    fn real_time_stamps() {
        let ns = 1_790_000_000_123_456_789;
        assert_eq!(ns_to_real_time(ns) >> 32, 1_790_000_000);
        assert_eq!(ns_to_real_time(ns) & 0xffff_ffff, 123_456_789);
        assert_eq!(real_time_to_ns(ns_to_real_time(ns)), ns);
    }
}
