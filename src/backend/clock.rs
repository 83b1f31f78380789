//! The NIC's clock in each backend: the clock-info page a timed poll converts free-running
//! stamps with (read again at each timed poll that returns completions, as rdma-core reads
//! it at each `ibv_start_poll`), and the device's time now.

use super::Dev;
use crate::clock::{NicTime, TimestampFormat};
use crate::error::{Error, Result};
use mlx5::clock::ClockInfo;

/// The refusal of a device that stamps no completion.
#[cold]
fn no_clock() -> Error {
    Error::Timestamps {
        why: "the device has no completion clock (completion_timestamp_mask or hca_core_clock 0)",
    }
}

impl Dev {
    /// The kernel's clock-info page now (the software NIC's model of it); None where there
    /// is none (a device that is not mlx5, a kernel without the page).
    pub(crate) fn clock_info(&self) -> Option<ClockInfo> {
        match self {
            #[cfg(feature = "sim")]
            Dev::Sim(n) => n.clock_info(),
            // SAFETY: a live context of an mlx5 device.
            Dev::Rdma(r) if r.mlx5 => unsafe { crate::dv::clock_info(r.ctx.ctx.cast()) },
            Dev::Rdma(_) => None,
        }
    }

    /// The device's completion clock.
    pub(crate) fn clock_caps(&self) -> crate::verbs::device::ClockCaps {
        match self {
            #[cfg(feature = "sim")]
            Dev::Sim(n) => {
                let khz = n.hw_clock().khz as u64;
                crate::verbs::device::ClockCaps {
                    khz,
                    mask: if khz != 0 { u64::MAX >> 1 } else { 0 },
                }
            }
            Dev::Rdma(r) => r.attrs.clock,
        }
    }

    /// The device's clock now.
    ///
    /// # Errors
    /// As [`Device::clock`](crate::Device::clock).
    pub(crate) fn clock(&self) -> Result<NicTime> {
        match self {
            #[cfg(feature = "sim")]
            Dev::Sim(n) => {
                let (cycles, ns) = n.hw_time().ok_or_else(no_clock)?;
                Ok(NicTime {
                    cycles,
                    ns,
                    format: n.hw_clock().format,
                })
            }
            Dev::Rdma(r) => {
                if !r.attrs.clock.present() {
                    return Err(no_clock());
                }
                // SAFETY: a live context.
                let cycles = unsafe { crate::verbs::ex::query_raw_clock(r.ctx.ctx) }
                    .map_err(|rc| Error::Verbs(crate::verbs::code("ibv_query_rt_values_ex", rc)))?;
                if r.real_time_ts {
                    return Err(Error::Timestamps {
                        why: "the device stamps in real time: its clock is its PTP hardware \
                              clock (/dev/ptp*), which blueflame does not read",
                    });
                }
                let info = self.clock_info().ok_or(Error::Timestamps {
                    why: "no clock-info page to convert the free-running clock (mlx5 only)",
                })?;
                Ok(NicTime {
                    cycles,
                    ns: info.ts_to_ns(cycles),
                    format: TimestampFormat::FreeRunning,
                })
            }
        }
    }
}
