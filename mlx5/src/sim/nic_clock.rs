//! The software NIC's device clock as a driver reads it: the counter
//! (`ibv_query_rt_values_ex`), the clock-info page (`mlx5dv_get_clock_info`), and the
//! clock's settings.

use super::nic::NicView;
use super::HwClock;
use crate::clock::ClockInfo;

impl NicView {
    /// The device clock CQEs are stamped with.
    pub fn hw_clock(&self) -> HwClock {
        self.st().hw_clock
    }

    /// Sets the device clock (before the QPs whose CQEs should carry it run: a driver reads
    /// the frequency and the format once).
    pub fn set_hw_clock(&self, clock: HwClock) {
        let mut st = self.st();
        st.hw_clock = clock;
        st.publish_clock();
    }

    /// Publishes the clock through `hook` from now on (a kernel model's pages), told at
    /// once; None stops it.
    pub fn set_clock_hook(&self, hook: Option<super::ClockHook>) {
        let mut st = self.st();
        st.clock_hook = hook;
        st.publish_clock();
    }

    /// The free-running counter now (`hca_core_clock` read through `ibv_query_rt_values_ex`);
    /// None when the NIC has no clock.
    pub fn read_hw_clock(&self) -> Option<u64> {
        let st = self.st();
        (st.hw_clock.khz != 0).then(|| st.hw_clock.cycles_at(st.clock.now()))
    }

    /// The kernel's clock-info page now (`mlx5dv_get_clock_info`): moved on once per
    /// overflow period, as the kernel's overflow work does. None without a clock.
    pub fn clock_info(&self) -> Option<ClockInfo> {
        let st = self.st();
        st.hw_clock.clock_info_at(st.clock.now())
    }

    /// The counter and its nanoseconds now, read together (None without a clock): the
    /// nanoseconds of the kernel's timecounter (free-running stamps), or real time.
    pub fn hw_time(&self) -> Option<(u64, u64)> {
        let st = self.st();
        let (c, now) = (st.hw_clock, st.clock.now());
        let cycles = (c.khz != 0).then(|| c.cycles_at(now))?;
        let ns = match c.format {
            crate::clock::TimestampFormat::FreeRunning => c.clock_info_at(now)?.ts_to_ns(cycles),
            crate::clock::TimestampFormat::RealTime => c.epoch_ns.wrapping_add(now),
        };
        Some((cycles, ns))
    }

    /// Stepped mode: moves virtual time `ns` on (as if the NIC sat idle that long); no
    /// effect in thread mode, where time follows the wall clock.
    pub fn advance_time(&self, ns: u64) {
        let mut st = self.st();
        let t = st.clock.now().saturating_add(ns);
        st.clock.advance_to(t);
        st.publish_clock();
    }
}
