//! What every queue pair answers ([`QueuePair`]): its number, domain, data path, room,
//! events and state, for [`Qp`](crate::Qp), [`UdQp`](crate::UdQp) and
//! [`Dci`](crate::Dci) alike.

use crate::error::{Error, Result};
use crate::resources::{DataPath, Pd};
use crate::verbs::ex::VerbsApi;

/// What every queue pair answers, whatever its transport: one interface for code that
/// watches or tears down QPs of any kind. Bring it into scope to call the methods: `use
/// blueflame::QueuePair;` (or `use blueflame::*`).
pub trait QueuePair {
    /// The QP number (completions name it in [`Completion::qpn`](crate::Completion)).
    fn qpn(&self) -> u32;

    /// The protection domain.
    fn pd(&self) -> &Pd;

    /// Which data path this QP runs.
    fn data_path(&self) -> DataPath;

    /// The rdma-core API this QP posts with on the verbs path: extended (`ibv_wr_start` /
    /// `ibv_wr_*` / `ibv_wr_complete`) where the provider has it, else `ibv_post_send`
    /// (`BLUEFLAME_VERBS_API=auto|extended|legacy` overrides, read when the QP is created);
    /// None on the direct path.
    fn verbs_api(&self) -> Option<VerbsApi>;

    /// Send-queue room: blocks on the direct path (a request takes 1 to 16), work requests
    /// on the verbs path.
    fn free_send(&self) -> u32;

    /// The send depth: how many requests of the largest kind this QP's limits allow fit in
    /// its send queue at once (smaller ones may fit more on the direct path). At least what
    /// was asked: the device rounds up. The CQ may allow fewer at a time (see
    /// [`Error::CqFull`]).
    fn send_depth(&self) -> u32;

    /// Receive-queue room (entries; 0 for a QP without a receive queue: a DCI, or a QP that
    /// takes its receives from an SRQ).
    fn free_recv(&self) -> u32;

    /// The receive depth: receives that may be posted at once (0 without a receive queue).
    fn recv_depth(&self) -> u32;

    /// Moves the QP to the error state: outstanding and later work is flushed, each
    /// signaled request completing once with
    /// [`WcStatus::WrFlushErr`](crate::WcStatus::WrFlushErr).
    ///
    /// # Errors
    /// [`Error::Verbs`] (`Error::Sim` on the software NIC) when the device refuses;
    /// [`Error::InvalidState`] for a QP already destroyed.
    fn set_error(&mut self) -> Result<()>;

    /// Reads the device's asynchronous events (never blocks) and reports one about this QP,
    /// its CQs, the SRQ it takes its receives from, its port or the device: the way to learn
    /// why completions stopped coming.
    ///
    /// # Errors
    /// [`Error::AsyncEvent`].
    fn check(&self) -> Result<()>;

    /// What this QP's device can do with atomics and how it writes their replies (read
    /// when the QP was created).
    fn atomic_caps(&self) -> mlx5::AtomicCaps;

    /// The old value an atomic of this QP returned, in host order on every device: `reply`
    /// is the local buffer of a completed compare-swap, fetch-add or 64-bit masked atomic (8
    /// bytes) or of a 32-bit masked atomic (4 bytes), as the device wrote it.
    ///
    /// Devices write replies in different byte orders: a ConnectX writes 4-byte masked
    /// replies big-endian always, and 8-byte ones big-endian in
    /// `atomic_req_8B_endianness_mode` 0 (host order in mode 1, which Linux selects); rxe
    /// and the other verbs devices write host order. Read atomic results through this call
    /// (or [`AtomicCaps::reply_value`](mlx5::AtomicCaps::reply_value) with
    /// [`Device::atomic_caps`](crate::Device::atomic_caps)), never as raw memory.
    ///
    /// ```
    /// # #[cfg(feature = "sim")] fn main() -> blueflame::Result<()> {
    /// use blueflame::{Access, AtomicCaps, Completion, Device, PostFlags, PostSend, QpCaps, QueuePair};
    ///
    /// let dev = Device::sim_stepped();
    /// // A ConnectX in 8-byte endianness mode 0: every reply big-endian.
    /// dev.nic().unwrap().set_atomic_caps(AtomicCaps::CONNECTX_BIG_ENDIAN);
    /// let pd = dev.alloc_pd()?;
    /// let mut cq = dev.create_cq(16)?;
    /// let mut qp = pd.create_qp(&cq, &cq, QpCaps::default())?;
    /// let me = qp.endpoint()?;
    /// qp.connect(&me)?;
    /// let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_ATOMIC;
    /// let mr = pd.alloc_mr(64, all)?;
    /// mr.write(0, &41u64.to_ne_bytes())?;
    /// qp.fetch_add(mr.remote(0)?, 1, mr.sge(8, 8)?, 1, PostFlags::SIGNALED)?;
    /// dev.process();
    /// assert_eq!(cq.poll(&mut [Completion::default(); 1]), 1);
    /// let mut reply = [0u8; 8];
    /// mr.read(8, &mut reply)?;
    /// assert_eq!(reply, 41u64.to_be_bytes());       // as the device wrote it
    /// assert_eq!(qp.atomic_result(&reply)?, 41);    // the old value, host order
    /// assert_eq!(mr.read_u64(0)?, 42);
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sim"))] fn main() {}
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidParameter`] when `reply` is neither 8 nor 4 bytes long.
    #[inline]
    fn atomic_result(&self, reply: &[u8]) -> Result<u64> {
        self.atomic_caps()
            .reply_value(reply)
            .ok_or(Error::InvalidParameter {
                what: "atomic reply length (8 bytes, or 4 for a 32-bit masked atomic)",
                value: reply.len() as u64,
            })
    }
}
