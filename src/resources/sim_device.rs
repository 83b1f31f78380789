//! The software NIC as a device (feature `sim`): [`Device::sim`], [`Device::sim_stepped`],
//! [`Device::sim_with`] and the view of the NIC behind a device ([`Device::nic`]).

use super::Device;
use crate::backend::Dev;
use mlx5::sim::{Nic, UarConfig};
use std::sync::Arc;

impl Device {
    /// A device over the software NIC `nic`, its doorbell thread started when `threaded`,
    /// in the ordering mode `BLUEFLAME_SIM_ORDER` asks for ([`sim_order_from_env`]).
    fn from_nic(nic: Nic, threaded: bool) -> Device {
        nic.set_order(sim_order_from_env());
        if threaded {
            nic.start();
        }
        Device {
            events: Arc::default(),
            backend: Dev::sim(nic),
        }
    }

    /// The software mlx5 NIC, running in its own thread (it watches doorbell records as
    /// hardware does): code reads the same as on a ConnectX.
    ///
    /// Like every software-NIC device, it runs requests as freely as the InfiniBand
    /// ordering rules allow ([`OrderMode::Relaxed`](crate::OrderMode): a read or atomic
    /// may read its data after later unfenced writes and sends landed, a bind or local
    /// invalidate may take effect after later requests without the initiator small fence)
    /// and runs the transport timers of [`Timing`](crate::Timing) in virtual time (as slow as
    /// a ConnectX in thread mode; see [`NicView::set_time_scale`](mlx5::sim::NicView::set_time_scale)).
    /// `BLUEFLAME_SIM_ORDER=strict` runs every request in order; `BLUEFLAME_SIM_ORDER=N`
    /// seeds the choices with N (default 0).
    #[cfg_attr(docsrs, doc(cfg(feature = "sim")))]
    pub fn sim() -> Device {
        Device::from_nic(Nic::new(), true)
    }

    /// The software mlx5 NIC in stepped mode: nothing runs until [`Device::process`] is
    /// called (deterministic tests; BlueFlame writes are checked against the ring).
    #[cfg_attr(docsrs, doc(cfg(feature = "sim")))]
    pub fn sim_stepped() -> Device {
        Device::from_nic(Nic::new(), false)
    }

    /// A software mlx5 NIC of its own size: `limits` objects of each kind at most (a small
    /// QP-number space makes the NIC reuse a dropped QP's number at once), `uars` BlueFlame
    /// registers (rdma-core's counts by default: [`UarConfig::default`]), in thread mode
    /// ([`Device::sim`]) or stepped ([`Device::sim_stepped`]).
    ///
    /// ```
    /// use blueflame::{Device, DoorbellMode, QpCaps, UarConfig};
    /// // A device with no register left for thread domains: QPs share registers, locked.
    /// let uars = UarConfig { thread_domains: 0, ..UarConfig::default() };
    /// let dev = Device::sim_with(Default::default(), uars, false);
    /// let pd = dev.alloc_pd().unwrap();
    /// let cq = dev.create_cq(64).unwrap();
    /// let qp = pd.create_qp(&cq, &cq, QpCaps::default()).unwrap();
    /// assert_eq!(qp.doorbell_mode(), Some(DoorbellMode::SharedLocked));
    /// ```
    #[cfg_attr(docsrs, doc(cfg(feature = "sim")))]
    pub fn sim_with(limits: mlx5::sim::Limits, uars: UarConfig, threaded: bool) -> Device {
        Device::from_nic(Nic::with_limits_and_uars(limits, uars), threaded)
    }

    /// The software NIC behind this device, if it is one: its queries (QP state and doorbell
    /// statistics, CQ overrun, window state), stepping and fault injection
    /// ([`NicView`](mlx5::sim::NicView)). Destroying or deregistering its objects is left to
    /// the drops of the [`Qp`](super::Qp), [`Cq`](super::Cq) and [`MemoryRegion`](super::MemoryRegion) that use them: the view
    /// has no call that frees anything.
    ///
    /// ```
    /// let dev = blueflame::Device::sim_stepped();
    /// let cq = dev.create_cq(8).unwrap();
    /// assert!(!dev.nic().unwrap().cq_overrun(cq.cqn()));
    /// ```
    /// ```compile_fail
    /// let dev = blueflame::Device::sim_stepped();
    /// let cq = dev.create_cq(8).unwrap();
    /// dev.nic().unwrap().destroy_cq(cq.cqn()).unwrap(); // only the Cq's drop destroys it
    /// ```
    /// ```compile_fail
    /// let dev = blueflame::Device::sim_stepped();
    /// let pd = dev.alloc_pd().unwrap();
    /// let mr = pd.alloc_mr(64, blueflame::Access::LOCAL_WRITE).unwrap();
    /// dev.nic().unwrap().dereg_mr(mr.lkey()).unwrap(); // only the region's drop does
    /// ```
    #[cfg_attr(docsrs, doc(cfg(feature = "sim")))]
    pub fn nic(&self) -> Option<&mlx5::sim::NicView> {
        self.sim_nic().map(|nic| &**nic)
    }

    /// The whole software NIC (destructive calls included), for this crate's own objects.
    pub(crate) fn sim_nic(&self) -> Option<&Nic> {
        self.backend.sim_nic()
    }
}

/// The ordering mode of new software NICs: `BLUEFLAME_SIM_ORDER=strict` (every request in
/// order), a number (reordering with that seed), or unset (reordering with seed 0).
/// Anything else is the default too, said once on stderr (a seed meant to replay a failure
/// must not silently become another).
pub(crate) fn sim_order_from_env() -> mlx5::sim::OrderMode {
    match std::env::var("BLUEFLAME_SIM_ORDER") {
        Ok(v) if v.trim() == "strict" => mlx5::sim::OrderMode::Strict,
        Ok(v) => mlx5::sim::OrderMode::Relaxed {
            seed: v.trim().parse().unwrap_or_else(|_| {
                static SAID: std::sync::Once = std::sync::Once::new();
                SAID.call_once(|| {
                    eprintln!(
                        "blueflame: BLUEFLAME_SIM_ORDER={v:?} is neither `strict` nor a seed \
                         (u64): reordering with seed 0"
                    )
                });
                0
            }),
        },
        Err(_) => mlx5::sim::OrderMode::default(),
    }
}
