//! The software NIC's device clock: the free-running counter it stamps CQEs with (or real
//! time), over its virtual time, and the clock-info page the kernel would publish for it.

use crate::clock::{ns_to_real_time, ClockInfo, TimestampFormat};

/// Who publishes the NIC's clock to drivers the way a kernel does (its counter page, which
/// `ibv_query_rt_values_ex` reads, and its clock-info page, which `mlx5dv_get_clock_info`
/// reads): called with the counter and the page after each pass of the NIC and each change
/// of its time or clock ([`NicView::set_clock_hook`](super::NicView::set_clock_hook)).
pub type ClockHook = Box<dyn Fn(u64, Option<ClockInfo>) + Send>;

/// The NIC's device clock ([`NicView::set_hw_clock`](super::NicView::set_hw_clock)).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct HwClock {
    /// The free-running counter's frequency in kHz (`hca_core_clock`); 0: the NIC has no
    /// clock and writes no timestamps (a device such as rxe).
    pub khz: u32,
    /// The counter's value at virtual time 0 (a test starts it just before a wrap).
    pub start_cycles: u64,
    /// Real time, in nanoseconds since the epoch, at virtual time 0: where the kernel's
    /// timecounter starts and what a real-time stamp says then.
    pub epoch_ns: u64,
    /// What the CQEs carry.
    pub format: TimestampFormat,
}

impl Default for HwClock {
    /// A 1 GHz free-running counter (ConnectX-6 Dx and later) from 0, the kernel's
    /// timecounter started at 2026-11-01 00:00:00 UTC.
    fn default() -> Self {
        HwClock {
            khz: 1_000_000,
            start_cycles: 0,
            epoch_ns: 1_793_491_200_000_000_000,
            format: TimestampFormat::FreeRunning,
        }
    }
}

impl HwClock {
    /// The free-running counter at virtual time `now_ns`.
    pub fn cycles_at(&self, now_ns: u64) -> u64 {
        let ticks = now_ns as u128 * self.khz as u128 / 1_000_000;
        self.start_cycles.wrapping_add(ticks as u64)
    }

    /// What a CQE written at virtual time `now_ns` carries (0 without a clock).
    pub fn stamp_at(&self, now_ns: u64) -> u64 {
        match self.format {
            _ if self.khz == 0 => 0,
            TimestampFormat::FreeRunning => self.cycles_at(now_ns),
            TimestampFormat::RealTime => ns_to_real_time(self.epoch_ns.wrapping_add(now_ns)),
        }
    }

    /// The clock-info page at virtual time `now_ns`, as the kernel's overflow work leaves
    /// it: moved on once per overflow period since the counter started (None without a
    /// clock).
    pub fn clock_info_at(&self, now_ns: u64) -> Option<ClockInfo> {
        let base = ClockInfo::for_frequency(self.khz, self.start_cycles, self.epoch_ns)?;
        let period = base.overflow_cycles().max(1) as u128;
        let ran = now_ns as u128 * self.khz as u128 / 1_000_000;
        let cycles = ran / period * period;
        // As `ClockInfo::moved_to` once per period: the fraction carries over.
        let ns = cycles * base.mult as u128;
        Some(ClockInfo {
            nsec: self.epoch_ns.wrapping_add((ns >> base.shift) as u64),
            last_cycles: self.start_cycles.wrapping_add(cycles as u64) & base.mask,
            frac: (ns & ((1u128 << base.shift) - 1)) as u64,
            ..base
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_converts_every_stamp_of_its_period() {
        let c = HwClock {
            khz: 156_250,
            start_cycles: crate::clock::CYCLES_MASK - 1_000,
            ..HwClock::default()
        };
        let period_ns = {
            let i = c.clock_info_at(0).unwrap();
            i.overflow_cycles() * 64 / 10
        };
        for now in [0, 6_400, period_ns - 7, period_ns + 7, 5 * period_ns + 123] {
            let page = c.clock_info_at(now).unwrap();
            let ns = page.ts_to_ns(c.stamp_at(now));
            assert!(ns.abs_diff(c.epoch_ns + now) <= 8, "{now}: {ns}");
        }
        // The first page still converts a stamp five periods on: the conversion's product
        // is 128 bits wide (rdma-core's 64-bit one wraps past one period).
        let stale = c.clock_info_at(0).unwrap();
        let now = 5 * period_ns + 123;
        assert!(stale.ts_to_ns(c.stamp_at(now)).abs_diff(c.epoch_ns + now) <= 8);
    }

    #[test]
    fn real_time_and_no_clock() {
        let c = HwClock {
            format: TimestampFormat::RealTime,
            ..HwClock::default()
        };
        assert_eq!(
            crate::clock::real_time_to_ns(c.stamp_at(1_500)),
            c.epoch_ns + 1_500
        );
        let none = HwClock {
            khz: 0,
            ..HwClock::default()
        };
        assert_eq!((none.stamp_at(5), none.clock_info_at(5)), (0, None));
    }
}
