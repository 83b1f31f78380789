//! What safe code may do with the software NIC behind a [`Device`](super::Device): look and
//! step, never destroy.
//!
//! The NIC's own handle ([`mlx5::sim::Nic`]) also destroys QPs and CQs, deregisters regions
//! and frees windows and domains: calls that free the rings, doorbell records and buffers a
//! live [`Qp`](super::Qp), [`Cq`](super::Cq) or [`MemoryRegion`](super::MemoryRegion) still
//! uses. Only those objects' own drops call them; [`Device::nic`](super::Device::nic) hands
//! out this view instead.

use mlx5::sim::{Nic, OrderMode, QpState, QpStats, QpTiming};

/// Read-only queries and stepping of the software NIC behind a device.
///
/// ```
/// let dev = blueflame::Device::sim_stepped();
/// let cq = dev.create_cq(8).unwrap();
/// assert!(!dev.nic().unwrap().cq_overrun(cq.cqn()));
/// ```
/// Nothing here frees what a live object uses:
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
#[derive(Copy, Clone, Debug)]
pub struct SimNic<'a> {
    nic: &'a Nic,
}

impl<'a> SimNic<'a> {
    pub(crate) fn new(nic: &'a Nic) -> SimNic<'a> {
        SimNic { nic }
    }

    /// What the NIC's memory registration does (on-demand paging).
    pub fn memory_caps(&self) -> mlx5::sim::MemoryCaps {
        self.nic.memory_caps()
    }

    /// Changes what the NIC's registration does (a NIC without on-demand paging, to see
    /// the capability errors); regions registered already stay as they are.
    pub fn set_memory_caps(&self, caps: mlx5::sim::MemoryCaps) {
        self.nic.set_memory_caps(caps)
    }

    /// What the NIC saw of a QP's doorbells and WQEs (None for an unknown QPN).
    pub fn qp_stats(&self, qpn: u32) -> Option<QpStats> {
        self.nic.qp_stats(qpn)
    }

    /// The state of a QP (None for an unknown QPN).
    pub fn qp_state(&self, qpn: u32) -> Option<QpState> {
        self.nic.qp_state(qpn)
    }

    /// Whether the NIC found a CQ full when it had a CQE to write.
    pub fn cq_overrun(&self, cqn: u32) -> bool {
        self.nic.cq_overrun(cqn)
    }

    /// What the NIC saw of a CQ's arm requests and completion events (None for an unknown
    /// CQ): arms taken, stale ones dropped, records that disagreed with the doorbell.
    pub fn cq_arm_stats(&self, cqn: u32) -> Option<mlx5::sim::ArmStats> {
        self.nic.cq_arm_stats(cqn)
    }

    /// Arms count only entries written after them, as the IB specification (and rxe) allow,
    /// instead of a ConnectX's entries past the armed consumer index (see
    /// [`Nic::set_arm_next_only`]; it frees nothing).
    pub fn set_arm_next_only(&self, next_only: bool) {
        self.nic.set_arm_next_only(next_only)
    }

    /// Puts a CQ in error as an overrun or a ring the device cannot write does, with the
    /// asynchronous event (fault injection: blueflame's accounting never overruns a CQ).
    ///
    /// # Errors
    /// [`mlx5::sim::SimError::NoCq`].
    pub fn fail_cq(&self, cqn: u32) -> Result<(), mlx5::sim::SimError> {
        self.nic.fail_cq(cqn)
    }

    /// Raises an asynchronous event (fault injection: a port down, a failed device).
    pub fn raise_event(&self, e: crate::AsyncEvent) {
        self.nic.raise_event(e.into())
    }

    /// What the NIC saw of an SRQ (None for an unknown SRQ).
    pub fn srq_stats(&self, srqn: u32) -> Option<mlx5::sim::SrqStats> {
        self.nic.srq_stats(srqn)
    }

    /// Receives posted to an SRQ that the NIC has not taken yet (None for an unknown SRQ).
    pub fn srq_pending(&self, srqn: u32) -> Option<u32> {
        self.nic.srq_pending(srqn)
    }

    /// An SRQ's armed limit (0: disarmed; None for an unknown SRQ).
    pub fn srq_limit(&self, srqn: u32) -> Option<u32> {
        self.nic.srq_limit(srqn)
    }

    /// A window's current rkey and whether it is bound, by any of its rkeys.
    pub fn mw_state(&self, rkey: u32) -> Option<(u32, bool)> {
        self.nic.mw_state(rkey)
    }

    /// One pass over every QP (see [`Nic::process`]); in thread mode the NIC's thread runs
    /// the same passes concurrently.
    pub fn process(&self) -> usize {
        self.nic.process()
    }

    /// Passes until nothing is left to do (see [`Nic::drain`]).
    pub fn drain(&self) -> usize {
        self.nic.drain()
    }

    /// What a DC target saw (key violations; None when `dctn` is not a DCT).
    pub fn dct_stats(&self, dctn: u32) -> Option<mlx5::sim::DctStats> {
        self.nic.dct_stats(dctn)
    }

    /// The NIC's atomic capabilities (see [`Nic::atomic_caps`]).
    pub fn atomic_caps(&self) -> mlx5::atomic::AtomicCaps {
        self.nic.atomic_caps()
    }

    /// Changes the NIC's atomic capabilities, as a different device would have (see
    /// [`Nic::set_atomic_caps`]; it frees nothing).
    pub fn set_atomic_caps(&self, caps: mlx5::atomic::AtomicCaps) {
        self.nic.set_atomic_caps(caps)
    }

    /// What the NIC reports of CQE compression (see [`Nic::cqe_comp_caps`]).
    pub fn cqe_comp_caps(&self) -> mlx5::CqeCompCaps {
        self.nic.cqe_comp_caps()
    }

    /// Changes what the NIC reports of CQE compression, as a different device would (for
    /// CQs created afterwards; see [`Nic::set_cqe_comp_caps`]).
    pub fn set_cqe_comp_caps(&self, caps: mlx5::CqeCompCaps) {
        self.nic.set_cqe_comp_caps(caps)
    }

    /// How many compressed sessions the NIC wrote into a CQ and how many completions they
    /// held (see [`Nic::cq_sessions`]).
    pub fn cq_sessions(&self, cqn: u32) -> (u64, u64) {
        self.nic.cq_sessions(cqn)
    }

    /// The kind of BlueFlame register a QP rings and how many QPs ring it (see
    /// [`Nic::qp_register`]).
    pub fn qp_register(&self, qpn: u32) -> Option<(mlx5::sim::RegKind, u32)> {
        self.nic.qp_register(qpn)
    }

    /// Checks every register at a quiescent point (see [`Nic::check_registers`]).
    pub fn check_registers(&self) -> mlx5::sim::RegisterCheck {
        self.nic.check_registers()
    }

    /// Whether the NIC runs its own thread ([`Device::sim`](super::Device::sim)).
    pub fn is_threaded(&self) -> bool {
        self.nic.is_threaded()
    }

    /// The NIC's virtual time in nanoseconds: in stepped mode it moves only when a pass
    /// finds nothing to do and a timer is pending (it jumps to that timer); in thread mode it
    /// follows the wall clock times the time scale.
    pub fn now_ns(&self) -> u64 {
        self.nic.now_ns()
    }

    /// Makes virtual time run `scale` times faster than the wall clock in thread mode (1 by
    /// default: a 67 ms local ACK timeout takes 67 ms; tests of timeouts on a threaded NIC
    /// use 1000 or more).
    pub fn set_time_scale(&self, scale: f64) {
        self.nic.set_time_scale(scale)
    }

    /// The ordering mode (see [`Device::sim`](super::Device::sim)).
    pub fn order(&self) -> OrderMode {
        self.nic.order()
    }

    /// Changes the ordering mode (QPs created afterwards draw their choices from the new
    /// seed; [`OrderMode::Strict`] holds nothing back from now on).
    pub fn set_order(&self, order: OrderMode) {
        self.nic.set_order(order)
    }

    /// Sets the port's active MTU (256 to 4096 bytes; see [`Nic::set_port_mtu`]). UD QPs
    /// created before keep the MTU they read (fault injection: their datagrams above the
    /// new MTU then fail at the NIC, as on a port whose MTU changed under them).
    ///
    /// # Errors
    /// [`mlx5::sim::SimError::Caps`] for another value.
    pub fn set_port_mtu(&self, mtu: u32) -> Result<(), mlx5::sim::SimError> {
        self.nic.set_port_mtu(mtu)
    }

    /// The multicast groups (GID, LID) a QP is attached to.
    pub fn mcast_groups(&self, qpn: u32) -> Vec<([u8; 16], u16)> {
        self.nic.mcast_groups(qpn)
    }

    /// A QP's transport attributes as the NIC runs them (programmed by `connect_with`).
    pub fn qp_timing(&self, qpn: u32) -> Option<QpTiming> {
        self.nic.qp_timing(qpn)
    }
}
