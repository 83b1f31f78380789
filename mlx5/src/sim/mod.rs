//! A software mlx5 NIC.
//!
//! It owns CQs and QPs whose rings have exactly the hardware layout, hands them out as
//! [`RawQp`] / [`RawCq`], and plays the device: once a QP's doorbell record moves it reads the
//! WQEs from the send ring, checks keys, bounds, rights and protection domains against its
//! tables, moves the bytes between registered regions, runs atomics and memory-window binds,
//! and writes CQEs (owner bits, byte counts, immediates, WQE counters, error syndromes).
//! A failed WQE moves its QP to error and every later WQE and receive is flushed.
//!
//! It is as permissive as the InfiniBand ordering rules and as slow as the transport
//! timers, not kinder: by default ([`OrderMode::Relaxed`], seed 0) an RDMA read or atomic may
//! read its data after later unfenced writes and sends of its QP have landed, and a bind or
//! local invalidate may take effect after later requests without the initiator small fence
//! (completions still in order; [`OrderMode::Strict`] runs everything in order); a request
//! the responder never answers is sent again after each local ACK timeout until its retry
//! count runs out, and an RNR NAK costs the responder's RNR timer ([`QpTiming`],
//! [`Nic::set_timing`]). Time is virtual ([`Nic::now_ns`]): in stepped mode it jumps to the
//! next timer when a pass finds nothing to do; in thread mode it follows the wall clock
//! times [`Nic::set_time_scale`].
//!
//! Two ways to run it:
//! - [`Nic::process`]: one synchronous pass over every QP (deterministic tests). In this mode
//!   the NIC also checks each ring's doorbell in the BlueFlame register: the 8-byte doorbell or
//!   the BlueFlame copy must match the WQE in the ring ([`QpStats`]).
//! - [`Nic::start`]: a thread that watches the doorbell records, as hardware does (latency
//!   runs). BlueFlame contents are not compared in this mode: the driver writes the record
//!   before the register, and only the synchronous mode sees both complete.
//!
//! ```
//! use mlx5::sim::{Nic, QpCaps};
//! use mlx5::request::Access;
//! let nic = Nic::new();
//! let pd = nic.alloc_pd();
//! let cq = nic.create_cq(64, 64).unwrap();
//! let qp = nic.create_qp(pd, cq.cqn, cq.cqn, QpCaps::default()).unwrap();
//! nic.connect(qp.qpn, qp.qpn).unwrap();
//! let mr = nic.alloc_mr(pd, 4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE).unwrap();
//! assert_eq!(mr.len, 4096);
//! assert_eq!(nic.process(), 0); // nothing posted yet
//! ```

mod arm;
mod clock;
mod cq;
mod dc;
mod dma;
mod error;
mod event;
mod exec;
mod ids;
mod mcast;
mod mem;
mod order;
mod port;
mod progress;
mod qp;
mod qp_attr;
mod recv;
mod srq;
mod state;
mod uar;
mod ud;

pub use arm::{ArmStats, CqEventSink};
pub use clock::{ack_timeout_ns, rnr_timer_ns, QpTiming};
pub use error::SimError;
pub use event::AsyncEvent;
pub use mem::MemoryCaps;
pub use order::OrderMode;
pub use port::{PortAttr, DEFAULT_PORT_MTU, PORT_GID, PORT_LID};
pub use qp_attr::{DctStats, QpCaps, QpState, QpStats};
pub use srq::{SrqCaps, SrqStats};
pub use state::{Limits, DEFAULT_CQE_COMP_MAX_NUM};
pub use uar::{RegKind, RegisterCheck, UarConfig};

use crate::request::{Access, MwType};
use crate::srq::RawSrq;
use crate::{wqe, RawCq, RawQp};
use mem::{Mr, Mw};
use srq::SimSrq;
use state::State;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

/// A registered memory region.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct MrInfo {
    /// Start address.
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// Local key.
    pub lkey: u32,
    /// Remote key (equal to the lkey on mlx5).
    pub rkey: u32,
}

struct Inner {
    state: Mutex<State>,
    running: AtomicBool,
    thread: Mutex<Option<JoinHandle<()>>>,
}

/// A software mlx5 NIC. Cloning gives another handle to the same NIC.
#[derive(Clone)]
pub struct Nic {
    inner: Arc<Inner>,
}

impl Default for Nic {
    fn default() -> Self {
        Nic::new()
    }
}

impl core::fmt::Debug for Nic {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Nic")
            .field("threaded", &self.inner.running.load(Ordering::Relaxed))
            .finish()
    }
}

impl State {
    /// Raises [`AsyncEvent::CqError`] once for every CQ that went to error.
    pub(crate) fn note_cq_errors(&mut self) {
        let mut cqns: Vec<u32> = self
            .cqs
            .values_mut()
            .filter(|c| c.overrun && !c.error_reported)
            .map(|c| {
                c.error_reported = true;
                c.cqn
            })
            .collect();
        cqns.sort_unstable();
        self.events
            .extend(cqns.into_iter().map(|cqn| AsyncEvent::CqError { cqn }));
    }

    /// One pass over every QP at the clock's now.
    fn pass(&mut self) -> usize {
        // Arm doorbells first: an arm written before the WQEs' doorbells sees their entries.
        let next_only = self.arm_next_only;
        for cq in self.cqs.values_mut() {
            cq.look_at_arm(next_only);
        }
        let qpns: Vec<u32> = self.qps.keys().copied().collect();
        let n = qpns.into_iter().map(|q| self.run_qp(q)).sum();
        // The end of a pass stands for a ConnectX's compression timeout; then the arm
        // doorbells again: an arm written while the WQEs ran is not left for the next pass.
        for cq in self.cqs.values_mut() {
            cq.close_session();
            cq.look_at_arm(next_only);
        }
        self.note_cq_errors();
        if !self.threaded {
            self.end_pass();
        }
        n
    }

    /// Judges the rings of one stepped pass per register (misses, alternation).
    fn end_pass(&mut self) {
        let mut verdicts = Vec::new();
        for r in self.uars.regs.iter_mut() {
            if !r.pass.is_empty() {
                verdicts.extend(r.end_pass());
            }
        }
        for (qpn, missed, out_of_turn) in verdicts {
            if let Some(q) = self.qps.get_mut(&qpn) {
                q.stats.doorbell_misses += missed as u64;
                q.stats.bf_out_of_turn += out_of_turn as u64;
            }
        }
    }
}

impl Nic {
    /// A NIC with no resources, in synchronous mode, with rdma-core's default register
    /// counts ([`UarConfig::default`]).
    pub fn new() -> Nic {
        Nic::with_limits(Limits::default())
    }

    /// A NIC with these BlueFlame register counts, in synchronous mode.
    pub fn with_uars(uars: UarConfig) -> Nic {
        Nic::with_limits_and_uars(Limits::default(), uars)
    }

    /// As [`Nic::new`], holding at most `limits` objects of each kind (each clamped to the
    /// hardware's 24-bit space, at least one).
    pub fn with_limits(limits: Limits) -> Nic {
        Nic::with_limits_and_uars(limits, UarConfig::default())
    }

    fn with_limits_and_uars(limits: Limits, uars: UarConfig) -> Nic {
        Nic {
            inner: Arc::new(Inner {
                state: Mutex::new(State::new(limits, uars)),
                running: AtomicBool::new(false),
                thread: Mutex::new(None),
            }),
        }
    }

    fn st(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock is a bug in the NIC itself; keep going with its state.
        self.inner.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new protection domain.
    pub fn alloc_pd(&self) -> u32 {
        let mut st = self.st();
        st.mem.pds.push(true);
        st.mem.pds.len() as u32 - 1
    }

    fn check_pd(st: &State, pd: u32) -> Result<(), SimError> {
        match st.mem.pds.get(pd as usize) {
            Some(true) => Ok(()),
            _ => Err(SimError::NoPd(pd)),
        }
    }

    /// Frees a protection domain.
    ///
    /// # Errors
    /// [`SimError::Busy`] while regions, windows or QPs use it.
    pub fn dealloc_pd(&self, pd: u32) -> Result<(), SimError> {
        let mut st = self.st();
        Self::check_pd(&st, pd)?;
        if st.mem.mrs.values().any(|m| m.pd == pd)
            || st.mem.mws.values().any(|m| m.pd == pd)
            || st.qps.values().any(|q| q.pd == pd)
        {
            return Err(SimError::Busy);
        }
        st.mem.pds[pd as usize] = false;
        Ok(())
    }

    /// Allocates `len` zeroed, page-aligned bytes owned by the NIC and registers them.
    ///
    /// # Errors
    /// [`SimError::NoPd`], [`SimError::BadRegion`] for `len == 0`, [`SimError::Rights`],
    /// [`SimError::NoMemory`] when `len` bytes cannot be allocated, [`SimError::Exhausted`].
    pub fn alloc_mr(&self, pd: u32, len: usize, access: Access) -> Result<MrInfo, SimError> {
        if len == 0 {
            return Err(SimError::BadRegion);
        }
        if access.region_error().is_some() {
            return Err(SimError::Rights(access));
        }
        let buf = dma::DmaBuf::try_new(len).ok_or(SimError::NoMemory(len as u64))?;
        let addr = buf.ptr() as u64;
        self.insert_mr(pd, addr, len as u64, access, Some(buf))
    }

    /// Registers memory the caller owns.
    ///
    /// # Safety
    /// `addr .. addr + len` must stay valid for reads and writes until the region is
    /// deregistered (or the NIC dropped): the NIC writes it from its own thread.
    ///
    /// # Errors
    /// [`SimError::NoPd`], [`SimError::BadRegion`] for a null address, zero length or a range
    /// past the end of the address space, [`SimError::Rights`], [`SimError::Exhausted`].
    pub unsafe fn reg_mr(
        &self,
        pd: u32,
        addr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<MrInfo, SimError> {
        if addr.is_null() || len == 0 || (addr as u64).checked_add(len as u64).is_none() {
            return Err(SimError::BadRegion);
        }
        if access.region_error().is_some() {
            return Err(SimError::Rights(access));
        }
        self.insert_mr(pd, addr as u64, len as u64, access, None)
    }

    /// What registration on this NIC can do.
    pub fn memory_caps(&self) -> MemoryCaps {
        self.st().memory_caps
    }

    /// Changes what registration can do (a NIC without on-demand paging, for the
    /// capability errors); registered regions stay as they are.
    pub fn set_memory_caps(&self, caps: MemoryCaps) {
        self.st().memory_caps = caps;
    }

    /// A prefetch of on-demand pages (`ibv_advise_mr` with `IBV_ADVISE_MR_ADVICE_PREFETCH`,
    /// or `_PREFETCH_WRITE` when `write`): each entry must name an on-demand region of `pd`
    /// by its lkey, lie inside it, and for a write prefetch the region must allow local
    /// write (the kernel's `get_prefetchable_mr`). The NIC's memory is resident, so nothing
    /// more happens.
    ///
    /// # Errors
    /// [`SimError::NoPd`]; [`SimError::NoCapability`] without on-demand paging;
    /// [`SimError::Prefetch`] with the first refused lkey.
    pub fn advise_mr(
        &self,
        pd: u32,
        write: bool,
        sgl: &[crate::request::Sge],
    ) -> Result<(), SimError> {
        let st = self.st();
        Self::check_pd(&st, pd)?;
        if !st.memory_caps.odp {
            return Err(SimError::NoCapability("on-demand paging"));
        }
        for s in sgl {
            let ok = st
                .mem
                .mrs
                .get(&(s.lkey >> 8))
                .filter(|m| m.key == s.lkey && m.access.contains(Access::ON_DEMAND))
                .is_some_and(|_| {
                    st.mem
                        .local(pd, s.lkey, s.addr, s.len as u64, write)
                        .is_ok()
                });
            if !ok {
                return Err(SimError::Prefetch(s.lkey));
            }
        }
        Ok(())
    }

    fn insert_mr(
        &self,
        pd: u32,
        addr: u64,
        len: u64,
        access: Access,
        owned: Option<dma::DmaBuf>,
    ) -> Result<MrInfo, SimError> {
        let mut st = self.st();
        Self::check_pd(&st, pd)?;
        if access.contains(Access::ON_DEMAND) && !st.memory_caps.odp {
            return Err(SimError::NoCapability("on-demand paging"));
        }
        let key = st.mem.alloc_key().ok_or(SimError::Exhausted("key index"))?;
        st.mem.mrs.insert(
            key >> 8,
            Mr {
                pd,
                addr,
                len,
                access,
                key,
                _owned: owned,
            },
        );
        Ok(MrInfo {
            addr,
            len,
            lkey: key,
            rkey: key,
        })
    }

    /// Deregisters a region (freeing its memory when the NIC allocated it).
    ///
    /// # Errors
    /// [`SimError::NoMr`]; [`SimError::Busy`] while a window is bound to it.
    pub fn dereg_mr(&self, lkey: u32) -> Result<(), SimError> {
        let mut st = self.st();
        match st.mem.mrs.get(&(lkey >> 8)) {
            Some(m) if m.key == lkey => {}
            _ => return Err(SimError::NoMr(lkey)),
        }
        if st
            .mem
            .mws
            .values()
            .any(|w| w.bound.as_ref().is_some_and(|b| b.mr_key == lkey))
        {
            return Err(SimError::Busy);
        }
        st.mem.mrs.remove(&(lkey >> 8));
        st.mem.free_key(lkey);
        Ok(())
    }

    /// Allocates a memory window; returns its rkey.
    ///
    /// # Errors
    /// [`SimError::NoPd`].
    pub fn alloc_mw(&self, pd: u32, mw_type: MwType) -> Result<u32, SimError> {
        let mut st = self.st();
        Self::check_pd(&st, pd)?;
        let rkey = st.mem.alloc_key().ok_or(SimError::Exhausted("key index"))?;
        st.mem.mws.insert(
            rkey >> 8,
            Mw {
                pd,
                mw_type,
                rkey,
                bound: None,
            },
        );
        Ok(rkey)
    }

    /// Frees a memory window.
    ///
    /// # Errors
    /// [`SimError::NoMw`].
    pub fn dealloc_mw(&self, rkey: u32) -> Result<(), SimError> {
        let mut st = self.st();
        let w = st
            .mem
            .mws
            .remove(&(rkey >> 8))
            .ok_or(SimError::NoMw(rkey))?;
        st.mem.free_key(w.rkey);
        Ok(())
    }

    /// The current rkey of a window and whether it is bound (for tests and the driver's
    /// bookkeeping).
    pub fn mw_state(&self, rkey_index: u32) -> Option<(u32, bool)> {
        self.st()
            .mem
            .mws
            .get(&(rkey_index >> 8))
            .map(|w| (w.rkey, w.bound.is_some()))
    }

    /// Creates a CQ of `cqe_cnt` entries (a power of two) of `cqe_size` bytes (64 or 128).
    ///
    /// # Errors
    /// [`SimError::CqSize`].
    pub fn create_cq(&self, cqe_cnt: u32, cqe_size: u32) -> Result<RawCq, SimError> {
        let size_ok = cqe_size == 64 || cqe_size == 128;
        if !cqe_cnt.is_power_of_two() || !(2..=1 << 22).contains(&cqe_cnt) || !size_ok {
            return Err(SimError::CqSize { cqe_cnt, cqe_size });
        }
        let mut st = self.st();
        let cqn = st.cqns.alloc().ok_or(SimError::Exhausted("CQ number"))?;
        let cq = cq::SimCq::new(cqn, cqe_cnt, cqe_size);
        let raw = cq.raw();
        st.cqs.insert(cqn, cq);
        Ok(raw)
    }

    /// What the NIC reports of CQE compression (`mlx5dv_query_device`'s `cqe_comp_caps`):
    /// by default every mini-CQE format, sessions of up to
    /// [`DEFAULT_CQE_COMP_MAX_NUM`], 64- and 128-byte CQEs.
    pub fn cqe_comp_caps(&self) -> crate::cqe::CqeCompCaps {
        self.st().cqe_comp
    }

    /// Changes what the NIC reports of CQE compression (for CQs created afterwards).
    pub fn set_cqe_comp_caps(&self, caps: crate::cqe::CqeCompCaps) {
        self.st().cqe_comp = caps;
    }

    /// Creates a CQ as [`Nic::create_cq`] that compresses runs of completions into
    /// sessions of mini-CQEs of `format` (`mlx5dv_create_cq` with
    /// `MLX5DV_CQ_INIT_ATTR_MASK_COMPRESSED_CQE`; the module `cq` describes the sessions).
    ///
    /// # Errors
    /// [`SimError::CqeCompression`] when [`Nic::cqe_comp_caps`] does not allow it (rdma-core's
    /// test); as [`Nic::create_cq`].
    pub fn create_cq_compressed(
        &self,
        cqe_cnt: u32,
        cqe_size: u32,
        format: crate::cqe::MiniCqeFormat,
    ) -> Result<RawCq, SimError> {
        let caps = self.cqe_comp_caps();
        if !caps.supports(format, cqe_size) {
            return Err(SimError::CqeCompression {
                format,
                cqe_size,
                caps,
            });
        }
        let raw = self.create_cq(cqe_cnt, cqe_size)?;
        if let Some(cq) = self.st().cqs.get_mut(&raw.cqn) {
            cq.compress(format, caps.max_num);
        }
        Ok(raw)
    }

    /// A compressing CQ's mini-CQE format (None: not compressing, or no such CQ).
    pub fn cq_compression(&self, cqn: u32) -> Option<crate::cqe::MiniCqeFormat> {
        self.st().cqs.get(&cqn).and_then(|c| c.zip_format())
    }

    /// How many compressed sessions the NIC wrote into a CQ, and how many completions they
    /// held (sessions of one are written plain and not counted).
    pub fn cq_sessions(&self, cqn: u32) -> (u64, u64) {
        self.st().cqs.get(&cqn).map_or((0, 0), |c| c.zip_stats)
    }

    /// Destroys a CQ.
    ///
    /// # Errors
    /// [`SimError::NoCq`]; [`SimError::Busy`] while a QP uses it.
    pub fn destroy_cq(&self, cqn: u32) -> Result<(), SimError> {
        let mut st = self.st();
        if !st.cqs.contains_key(&cqn) {
            return Err(SimError::NoCq(cqn));
        }
        if st
            .qps
            .values()
            .any(|q| q.send_cq == cqn || q.recv_cq == cqn)
        {
            return Err(SimError::Busy);
        }
        st.cqs.remove(&cqn);
        st.cqns.free(cqn);
        Ok(())
    }

    /// Whether the NIC found a CQ full when it had a CQE to write (the CQ is then in error and
    /// its QPs too).
    pub fn cq_overrun(&self, cqn: u32) -> bool {
        self.st().cqs.get(&cqn).is_some_and(|c| c.overrun)
    }

    /// Creates an RC QP in RESET. Its BlueFlame register is rdma-core's choice for a QP
    /// without a thread domain (`mlx5_get_qp_uar`): dedicated for the first ones, then shared.
    ///
    /// # Errors
    /// [`SimError::NoPd`], [`SimError::NoCq`], [`SimError::Caps`].
    pub fn create_qp(
        &self,
        pd: u32,
        send_cq: u32,
        recv_cq: u32,
        caps: QpCaps,
    ) -> Result<RawQp, SimError> {
        self.create_qp_in(pd, None, send_cq, recv_cq, caps)
    }

    /// Creates an RC QP in RESET on thread domain `td` (the QP created on a parent domain
    /// holding the thread domain): it rings the domain's own register.
    ///
    /// # Errors
    /// As [`Nic::create_qp`]; [`SimError::NoTd`].
    pub fn create_qp_on_td(
        &self,
        pd: u32,
        td: u32,
        send_cq: u32,
        recv_cq: u32,
        caps: QpCaps,
    ) -> Result<RawQp, SimError> {
        self.create_qp_in(pd, Some(td), send_cq, recv_cq, caps)
    }

    fn create_qp_in(
        &self,
        pd: u32,
        td: Option<u32>,
        send_cq: u32,
        recv_cq: u32,
        caps: QpCaps,
    ) -> Result<RawQp, SimError> {
        if caps.bf_size % 64 != 0 || caps.bf_size > 4096 {
            return Err(SimError::Caps(
                "bf_size must be 0 or a multiple of 64 up to 4096",
            ));
        }
        if caps.sq_blocks < crate::doorbell::MAX_WQE_BBS as u32 || caps.sq_blocks > 1 << 15 {
            return Err(SimError::Caps("sq_blocks must be 16 ..= 32768"));
        }
        if caps.rq_entries > 1 << 15 || caps.max_recv_sge > 64 || caps.max_send_sge > 60 {
            return Err(SimError::Caps(
                "rq_entries <= 32768, max_recv_sge <= 64, max_send_sge <= 60",
            ));
        }
        if caps.rnr_retry > 7 {
            return Err(SimError::Caps(
                "rnr_retry <= 7 (a 3-bit field; 7 retries for ever)",
            ));
        }
        if caps.max_inline > 960 {
            return Err(SimError::Caps(
                "max_inline <= 960 (a WQE is at most 16 blocks)",
            ));
        }
        let mut st = self.st();
        Self::check_pd(&st, pd)?;
        for cq in [send_cq, recv_cq] {
            if !st.cqs.contains_key(&cq) {
                return Err(SimError::NoCq(cq));
            }
        }
        let bf_size = caps.bf_size as usize;
        let reg = match td {
            None => st.uars.for_qp(bf_size),
            Some(td) => {
                let i = *st.uars.tds.get(&td).ok_or(SimError::NoTd(td))?;
                let r = &mut st.uars.regs[i];
                if r.users == 0 && r.bf_size != bf_size {
                    // The domain's register takes the size of its first QP's BlueFlame.
                    *r = uar::SimReg::new(uar::RegKind::ThreadDomain, bf_size);
                    r.td = Some(td);
                } else if r.bf_size != bf_size {
                    return Err(SimError::Caps(
                        "bf_size differs from the thread domain's register",
                    ));
                }
                r.users += 1;
                i
            }
        };
        let qpn = match st.qpns.alloc() {
            Some(q) => q,
            None => {
                st.uars.release(reg);
                return Err(SimError::Exhausted("QP number"));
            }
        };
        let bf = st.uars.regs[reg].ptr();
        let seed = match st.order {
            OrderMode::Relaxed { seed } => seed,
            OrderMode::Strict => 0,
        };
        let qp = qp::SimQp::new(qpn, pd, (send_cq, recv_cq), caps, (reg, bf), seed);
        let raw = qp.raw();
        st.qps.insert(qpn, qp);
        Ok(raw)
    }

    /// A thread domain with a register of its own (`ibv_alloc_td` on mlx5).
    ///
    /// # Errors
    /// [`SimError::NoRegister`] when every register for thread domains is taken.
    pub fn alloc_td(&self) -> Result<u32, SimError> {
        self.st()
            .uars
            .alloc_td(QpCaps::default().bf_size as usize)
            .ok_or(SimError::NoRegister)
    }

    /// Frees a thread domain.
    ///
    /// # Errors
    /// [`SimError::NoTd`]; [`SimError::Busy`] while QPs use it.
    pub fn dealloc_td(&self, td: u32) -> Result<(), SimError> {
        self.st().uars.dealloc_td(td).map_err(|busy| {
            if busy {
                SimError::Busy
            } else {
                SimError::NoTd(td)
            }
        })
    }

    /// The kind of the register a QP rings and how many QPs ring it.
    pub fn qp_register(&self, qpn: u32) -> Option<(RegKind, u32)> {
        let st = self.st();
        let q = st.qps.get(&qpn)?;
        let r = &st.uars.regs[q.reg];
        Some((r.kind, r.users))
    }

    /// Checks every register at a quiescent point (no ring in progress: the posting threads
    /// wait): a half holding a BlueFlame copy holds one whole WQE still in its ring, never
    /// pieces of two; a register rung at least twice since the last check has both halves
    /// written. Then clears the registers for the next check.
    pub fn check_registers(&self) -> RegisterCheck {
        let mut st = self.st();
        let mut out = RegisterCheck::default();
        let mut rung = vec![0u64; st.uars.regs.len()];
        for q in st.qps.values_mut() {
            let db = q.sq_db();
            rung[q.reg] += q.rings_since_mark(db);
        }
        for (i, r) in st.uars.regs.iter().enumerate() {
            if r.users == 0 {
                continue;
            }
            out.registers += 1;
            let bf = r.bf_size;
            if bf == 0 {
                r.clear();
                continue;
            }
            let mut written = 0;
            for half in [0, bf] {
                let mut bytes = [0u8; wqe::MAX_WQE_BYTES];
                let n = bf.min(wqe::MAX_WQE_BYTES);
                r.read(half, &mut bytes[..n]);
                let mut ring = [0u8; wqe::MAX_WQE_BYTES];
                let live = st
                    .qps
                    .values()
                    .filter(|q| q.reg == i)
                    .any(|q| q.wqe_matching(&bytes[..8], &mut ring));
                match uar::classify(&bytes[..n], live.then_some(&ring[..])) {
                    uar::HalfContent::Empty => {}
                    uar::HalfContent::Doorbell => written += 1,
                    uar::HalfContent::Copy => {
                        written += 1;
                        out.copies += 1;
                    }
                    uar::HalfContent::Torn => {
                        written += 1;
                        out.torn += 1;
                    }
                }
            }
            if rung[i] >= 2 && written < 2 {
                out.out_of_turn += 1;
            }
            r.clear();
        }
        out
    }

    /// Destroys a QP (its rings are freed: the driver must not touch them afterwards).
    ///
    /// # Errors
    /// [`SimError::NoQp`].
    pub fn destroy_qp(&self, qpn: u32) -> Result<(), SimError> {
        let mut st = self.st();
        let q = st.qps.remove(&qpn).ok_or(SimError::NoQp(qpn))?;
        st.qpns.free(qpn);
        if let Some(srqn) = q.srq {
            st.detach_srq(srqn);
        }
        st.uars.release(q.reg);
        st.port.groups.forget(qpn);
        for q in st.qps.values_mut() {
            if q.peer == Some(qpn) {
                q.peer = None;
            }
        }
        Ok(())
    }

    /// Makes QP `qpn` take its receives from SRQ `srqn` (`srq` in `ibv_qp_init_attr`): a
    /// QP in RESET of the SRQ's protection domain, created without a receive queue
    /// (`rq_entries` 0).
    ///
    /// # Errors
    /// [`SimError::NoQp`], [`SimError::NoSrq`]; [`SimError::QpState`] unless in RESET;
    /// [`SimError::Caps`] for a QP with a receive queue, another SRQ, or another domain.
    pub fn attach_qp_srq(&self, qpn: u32, srqn: u32) -> Result<(), SimError> {
        let mut st = self.st();
        let q = st.qps.get(&qpn).ok_or(SimError::NoQp(qpn))?;
        let s = st.srqs.get(&srqn).ok_or(SimError::NoSrq(srqn))?;
        if q.state != QpState::Reset {
            return Err(SimError::QpState {
                qpn,
                state: q.state,
            });
        }
        if q.rq_cnt != 0 || q.srq.is_some() || q.pd != s.pd {
            return Err(SimError::Caps(
                "an SRQ QP has no receive queue, one SRQ, and the SRQ's domain",
            ));
        }
        st.attach_receiver(qpn, srqn)
    }

    /// Connects two QPs (or a QP to itself) and moves both to RTS.
    ///
    /// # Errors
    /// [`SimError::NoQp`]; [`SimError::QpState`] when either QP is not in RESET (unless the
    /// two are already connected to each other).
    pub fn connect(&self, a: u32, b: u32) -> Result<(), SimError> {
        let mut st = self.st();
        for (x, y) in [(a, b), (b, a)] {
            let q = st.qps.get(&x).ok_or(SimError::NoQp(x))?;
            if q.dc.is_some() {
                return Err(SimError::Dc {
                    qpn: x,
                    why: "a DC QP has no peer (a DCI is made ready with dci_ready, a DCT at creation)",
                });
            }
            // Verbs moves a QP to RTR only from INIT, which only RESET reaches: a QP
            // connects once (connecting the same pair again is the other side's connect,
            // which this NIC already did).
            match q.state {
                QpState::Reset => {}
                QpState::Rts if q.peer == Some(y) => {}
                state => return Err(SimError::QpState { qpn: x, state }),
            }
        }
        for (x, y) in [(a, b), (b, a)] {
            let q = st.qps.get_mut(&x).expect("checked");
            q.peer = Some(y);
            q.state = QpState::Rts;
        }
        Ok(())
    }

    /// Moves a QP to error: its outstanding and future WQEs and receives are flushed.
    ///
    /// # Errors
    /// [`SimError::NoQp`].
    pub fn set_error(&self, qpn: u32) -> Result<(), SimError> {
        let mut st = self.st();
        if !st.qps.contains_key(&qpn) {
            return Err(SimError::NoQp(qpn));
        }
        st.set_error(qpn);
        Ok(())
    }

    /// The state of a QP.
    pub fn qp_state(&self, qpn: u32) -> Option<QpState> {
        self.st().qps.get(&qpn).map(|q| q.state)
    }

    /// The NIC's atomic capabilities: by default a ConnectX's under a current Linux driver
    /// ([`AtomicCaps::CONNECTX`](crate::atomic::AtomicCaps::CONNECTX): every atomic, 8-byte
    /// replies in host order, 4-byte masked replies big-endian).
    pub fn atomic_caps(&self) -> crate::atomic::AtomicCaps {
        self.st().atomics
    }

    /// Changes the NIC's atomic capabilities (before creating the QPs that should see them:
    /// a driver reads them once). Atomics the NIC lacks fail with a local QP operation
    /// error; replies are written in the byte order `caps` says.
    pub fn set_atomic_caps(&self, caps: crate::atomic::AtomicCaps) {
        self.st().atomics = caps;
    }

    /// What the NIC saw of a QP.
    pub fn qp_stats(&self, qpn: u32) -> Option<QpStats> {
        self.st().qps.get(&qpn).map(|q| q.stats)
    }

    /// The next asynchronous event, if any (as `ibv_get_async_event` on a non-blocking
    /// event file descriptor).
    pub fn take_async_event(&self) -> Option<AsyncEvent> {
        self.st().events.pop_front()
    }

    /// Gives a CQ the sink its completion events go to (None: events are counted but go
    /// nowhere, as for a CQ created without a completion channel).
    ///
    /// # Errors
    /// [`SimError::NoCq`].
    pub fn set_cq_event_sink(
        &self,
        cqn: u32,
        sink: Option<Arc<dyn CqEventSink>>,
    ) -> Result<(), SimError> {
        let mut st = self.st();
        st.cqs
            .get_mut(&cqn)
            .ok_or(SimError::NoCq(cqn))?
            .arm
            .set_sink(sink);
        Ok(())
    }

    /// Whether an arm counts only the entries written after the NIC reads it (the IB
    /// specification's minimum, what rxe does) instead of every entry past the armed
    /// consumer index, as a ConnectX does (the default). A driver must poll once more after
    /// arming to be right on both; this mode catches one that does not.
    pub fn set_arm_next_only(&self, next_only: bool) {
        self.st().arm_next_only = next_only;
    }

    /// What the NIC saw of a CQ's arm requests and events (None for an unknown CQ).
    pub fn cq_arm_stats(&self, cqn: u32) -> Option<ArmStats> {
        self.st().cqs.get(&cqn).map(|c| c.arm.stats)
    }

    /// Puts a CQ in error as the hardware does when it overruns or cannot write its ring:
    /// it writes nothing more, and raises [`AsyncEvent::CqError`] (a fault injection for
    /// tests: blueflame's own accounting never overruns a CQ).
    ///
    /// # Errors
    /// [`SimError::NoCq`].
    pub fn fail_cq(&self, cqn: u32) -> Result<(), SimError> {
        let mut st = self.st();
        let cq = st.cqs.get_mut(&cqn).ok_or(SimError::NoCq(cqn))?;
        cq.overrun = true;
        st.note_cq_errors();
        Ok(())
    }

    /// Raises an event the way the device would (port down, device fatal: fault injection
    /// for tests). A fatal device stops running WQEs.
    pub fn raise_event(&self, e: AsyncEvent) {
        self.st().events.push_back(e);
    }

    /// One pass over every QP at the current virtual time: runs the WQEs and flushes up to
    /// each doorbell record, the timers and held-back requests that are due. In stepped mode,
    /// a pass that finds nothing to do moves the clock to the next timer or held-back request
    /// and runs again. Returns how many WQEs and receives it handled (a retransmission counts,
    /// an RNR retry that meets another RNR NAK does not). Call it until it returns 0 to drain.
    pub fn process(&self) -> usize {
        let mut st = self.st();
        let mut n = st.pass();
        if n == 0 && !st.threaded {
            if let Some(t) = st.qps.values().filter_map(|q| q.next_due()).min() {
                st.clock.advance_to(t);
                n = st.pass();
            }
        }
        let events: Vec<_> = st
            .cqs
            .values_mut()
            .filter_map(|c| c.arm.take_undelivered().map(|(s, k)| (s, c.cqn, k)))
            .collect();
        drop(st);
        // The sinks run without the NIC's lock: they may call back into the NIC.
        for (sink, cqn, k) in events {
            for _ in 0..k {
                sink.cq_event(cqn);
            }
        }
        n
    }

    /// Passes until nothing is left to do (an RNR wait counts as nothing to do; a local ACK
    /// timeout does not: the retransmissions run, in virtual time, until the retry count is
    /// spent).
    pub fn drain(&self) -> usize {
        let mut total = 0;
        loop {
            let n = self.process();
            if n == 0 {
                return total;
            }
            total += n;
        }
    }

    /// The NIC's virtual time in nanoseconds (see [`Nic::process`] and
    /// [`Nic::set_time_scale`]).
    pub fn now_ns(&self) -> u64 {
        self.st().clock.now()
    }

    /// How fast virtual time runs in thread mode: `scale` virtual nanoseconds per wall-clock
    /// nanosecond (1 by default, as slow as a ConnectX; 1000 makes a 67 ms ACK timeout take
    /// 67 us). Values that are not finite and positive mean 1.
    pub fn set_time_scale(&self, scale: f64) {
        self.st().clock.set_scale(scale);
    }

    /// The thread-mode time scale.
    pub fn time_scale(&self) -> f64 {
        self.st().clock.scale()
    }

    /// The ordering mode (by default [`OrderMode::Relaxed`] with seed 0).
    pub fn order(&self) -> OrderMode {
        self.st().order
    }

    /// Sets the ordering mode. QPs created from now on draw their choices from the new seed;
    /// [`OrderMode::Strict`] holds nothing back from now on, on every QP.
    pub fn set_order(&self, order: OrderMode) {
        self.st().order = order;
    }

    /// Programs a QP's transport attributes (`ibv_modify_qp` at RTR/RTS): its local ACK
    /// timeout and retry count, its RNR retry count and the RNR timer it asks of its
    /// requesters.
    ///
    /// # Errors
    /// [`SimError::NoQp`]; [`SimError::Caps`] for a value past its encoding.
    pub fn set_timing(&self, qpn: u32, timing: QpTiming) -> Result<(), SimError> {
        if !timing.is_valid() {
            return Err(SimError::Caps(
                "timing: retry_cnt and rnr_retry <= 7, timeout and min_rnr_timer <= 31",
            ));
        }
        let mut st = self.st();
        let q = st.qps.get_mut(&qpn).ok_or(SimError::NoQp(qpn))?;
        q.timing = timing;
        Ok(())
    }

    /// A QP's transport attributes.
    pub fn qp_timing(&self, qpn: u32) -> Option<QpTiming> {
        self.st().qps.get(&qpn).map(|q| q.timing)
    }

    /// Starts the thread that watches doorbell records. Idempotent.
    pub fn start(&self) {
        if self.inner.running.swap(true, Ordering::AcqRel) {
            return;
        }
        {
            let mut st = self.st();
            st.threaded = true;
            st.clock.follow_wall(true);
        }
        let me = Arc::downgrade(&self.inner);
        let handle = std::thread::Builder::new()
            .name("mlx5-sim".into())
            .spawn(move || {
                let mut idle = 0u32;
                loop {
                    let Some(inner) = me.upgrade() else { return };
                    if !inner.running.load(Ordering::Acquire) {
                        return;
                    }
                    let nic = Nic { inner };
                    if nic.process() == 0 {
                        idle = idle.saturating_add(1);
                        if idle > 64 {
                            std::thread::yield_now();
                        } else {
                            std::hint::spin_loop();
                        }
                    } else {
                        idle = 0;
                    }
                }
            })
            .expect("spawn the NIC thread");
        *self.inner.thread.lock().unwrap_or_else(|e| e.into_inner()) = Some(handle);
    }

    /// Stops the doorbell thread (back to synchronous mode).
    pub fn stop(&self) {
        self.inner.running.store(false, Ordering::Release);
        let h = self
            .inner
            .thread
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(h) = h {
            if h.thread().id() != std::thread::current().id() {
                let _ = h.join();
            }
        }
        let mut st = self.st();
        st.threaded = false;
        st.clock.follow_wall(false);
        for q in st.qps.values_mut() {
            q.skip_doorbell_check();
        }
    }

    /// Whether `other` is a handle to this same NIC (resources of one NIC never work with
    /// another's: their CQ and QP numbers overlap).
    pub fn same(&self, other: &Nic) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// Whether the doorbell thread runs.
    pub fn is_threaded(&self) -> bool {
        self.inner.running.load(Ordering::Acquire)
    }
}

impl Nic {
    /// Creates an SRQ in protection domain `pd` (`ibv_create_srq`): its ring linked as
    /// rdma-core links it, head 0, tail the last entry.
    ///
    /// # Errors
    /// [`SimError::NoPd`], [`SimError::Caps`] (more than 32767 receives or 31 entries),
    /// [`SimError::Exhausted`].
    pub fn create_srq(&self, pd: u32, caps: SrqCaps) -> Result<RawSrq, SimError> {
        if caps.max_wr == 0 || caps.max_wr >= 1 << 15 || caps.max_sge > 31 {
            return Err(SimError::Caps("SRQ: 1 <= max_wr <= 32767, max_sge <= 31"));
        }
        let mut st = self.st();
        Self::check_pd(&st, pd)?;
        let srqn = st.srqns.alloc().ok_or(SimError::Exhausted("SRQ number"))?;
        let s = SimSrq::new(srqn, pd, caps);
        let raw = s.raw();
        st.srqs.insert(srqn, s);
        Ok(raw)
    }

    /// Destroys an SRQ (its ring is freed: the driver must not touch it afterwards).
    ///
    /// # Errors
    /// [`SimError::NoSrq`]; [`SimError::Busy`] while a QP uses it (`ibv_destroy_srq`:
    /// `EBUSY`).
    pub fn destroy_srq(&self, srqn: u32) -> Result<(), SimError> {
        let mut st = self.st();
        let s = st.srqs.get(&srqn).ok_or(SimError::NoSrq(srqn))?;
        if s.users != 0 {
            return Err(SimError::Busy);
        }
        st.srqs.remove(&srqn);
        st.srqns.free(srqn);
        Ok(())
    }

    /// Arms the SRQ's limit (`ibv_modify_srq` with `IBV_SRQ_LIMIT`): one
    /// [`AsyncEvent::SrqLimitReached`] when a WQE is taken and fewer than `limit` remain
    /// posted; 0 disarms.
    ///
    /// # Errors
    /// [`SimError::NoSrq`]; [`SimError::Caps`] for a limit not below the ring's entries
    /// (the kernel's `mlx5_ib_modify_srq`: `EINVAL`).
    pub fn arm_srq_limit(&self, srqn: u32, limit: u32) -> Result<(), SimError> {
        let mut st = self.st();
        let s = st.srqs.get_mut(&srqn).ok_or(SimError::NoSrq(srqn))?;
        if limit >= s.cnt {
            return Err(SimError::Caps("SRQ limit must be below the SRQ's entries"));
        }
        s.limit = limit;
        Ok(())
    }

    /// The SRQ's armed limit (0: disarmed), None for an unknown SRQ.
    pub fn srq_limit(&self, srqn: u32) -> Option<u32> {
        self.st().srqs.get(&srqn).map(|s| s.limit)
    }

    /// WQEs posted to the SRQ and not taken yet (None for an unknown SRQ).
    pub fn srq_pending(&self, srqn: u32) -> Option<u32> {
        self.st().srqs.get(&srqn).map(|s| s.pending())
    }

    /// What the NIC saw of an SRQ.
    pub fn srq_stats(&self, srqn: u32) -> Option<SrqStats> {
        self.st().srqs.get(&srqn).map(|s| s.stats)
    }
}
