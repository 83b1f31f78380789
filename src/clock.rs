//! The NIC's clock: when it wrote each completion ([`Cq::poll_timed`](crate::Cq::poll_timed))
//! and what time it is on it now ([`Device::clock`](crate::Device::clock)).

pub use mlx5::clock::TimestampFormat;

/// The NIC's time, read with [`Device::clock`](crate::Device::clock).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct NicTime {
    /// The free-running counter (`hca_core_clock` cycles, `ibv_query_rt_values_ex`'s raw
    /// clock).
    pub cycles: u64,
    /// Nanoseconds on the clock a timed poll reports in: the kernel's timecounter over the
    /// free-running counter (`mlx5dv_ts_to_ns` with the clock-info page), or real time.
    pub ns: u64,
    /// Which of the two `ns` is (and which the CQEs carry).
    pub format: TimestampFormat,
}
