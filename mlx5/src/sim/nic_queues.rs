//! Creating and destroying the software NIC's queues: CQs, QPs, SRQs, and the thread domains
//! whose BlueFlame registers QPs ring.

use super::cq::SimCq;
use super::error::SimError;
use super::event::AsyncEvent;
use super::nic::Nic;
use super::order::OrderMode;
use super::qp::SimQp;
use super::qp_attr::{QpCaps, QpState};
use super::srq::{SimSrq, SrqCaps};
use super::uar::{RegKind, SimReg};
use crate::raw::{RawCq, RawQp};
use crate::srq::RawSrq;

impl Nic {
    /// Creates a CQ of `cqe_cnt` entries (a power of two) of `cqe_size` bytes (64 or 128).
    ///
    /// # Errors
    /// [`SimError::CqSize`].
    pub fn create_cq(&self, cqe_cnt: u32, cqe_size: u32) -> Result<RawCq, SimError> {
        self.create_cq_in(cqe_cnt, cqe_size, None)
    }

    /// Creates a CQ as [`Nic::create_cq`] over the driver's memory (`mem`: the ring rdma-core's
    /// provider allocated, its doorbell record and the UAR page it arms through), run in
    /// place: what `mlx5_ib` `create_cq_user` hands the device.
    ///
    /// # Safety
    /// `mem.buf` must be valid for reads and writes of `cqe_cnt * cqe_size` bytes,
    /// `mem.dbrec` of 8 bytes and `mem.uar` of 64 bytes, all until [`Nic::destroy_cq`] of
    /// this CQ returns (the kernel pins such memory: here its creator keeps it alive).
    ///
    /// # Errors
    /// As [`Nic::create_cq`].
    pub unsafe fn create_cq_at(
        &self,
        cqe_cnt: u32,
        cqe_size: u32,
        mem: super::host::HostCq,
    ) -> Result<RawCq, SimError> {
        self.create_cq_in(cqe_cnt, cqe_size, Some(mem))
    }

    fn create_cq_in(
        &self,
        cqe_cnt: u32,
        cqe_size: u32,
        mem: Option<super::host::HostCq>,
    ) -> Result<RawCq, SimError> {
        let size_ok = cqe_size == 64 || cqe_size == 128;
        if !cqe_cnt.is_power_of_two() || !(2..=1 << 22).contains(&cqe_cnt) || !size_ok {
            return Err(SimError::CqSize { cqe_cnt, cqe_size });
        }
        let mut st = self.st();
        let cqn = st.cqns.alloc().ok_or(SimError::Exhausted("CQ number"))?;
        let cq = SimCq::in_memory(cqn, cqe_cnt, cqe_size, mem);
        let raw = cq.raw();
        st.cqs.insert(cqn, cq);
        Ok(raw)
    }

    /// Turns CQE compression on for a CQ just created (`mlx5dv_create_cq` with
    /// `MLX5DV_CQ_INIT_ATTR_MASK_COMPRESSED_CQE`, as [`Nic::create_cq_compressed`]).
    ///
    /// # Errors
    /// [`SimError::CqeCompression`]; [`SimError::NoCq`].
    pub fn compress_cq(&self, cqn: u32, format: crate::cqe::MiniCqeFormat) -> Result<(), SimError> {
        let size = self.st().cqs.get(&cqn).map(|c| c.cqe_size);
        let max_num = self.compression_allowed(format, size.ok_or(SimError::NoCq(cqn))?)?;
        let mut st = self.st();
        st.cqs
            .get_mut(&cqn)
            .ok_or(SimError::NoCq(cqn))?
            .compress(format, max_num);
        Ok(())
    }

    /// The longest session a CQ of `cqe_size`-byte entries compressing with `format` gets,
    /// or the refusal when [`NicView::cqe_comp_caps`](super::NicView::cqe_comp_caps) does
    /// not allow it (rdma-core's test in `create_cq`).
    fn compression_allowed(
        &self,
        format: crate::cqe::MiniCqeFormat,
        cqe_size: u32,
    ) -> Result<u32, SimError> {
        let caps = self.cqe_comp_caps();
        if !caps.supports(format, cqe_size) {
            return Err(SimError::CqeCompression {
                format,
                cqe_size,
                caps,
            });
        }
        Ok(caps.max_num)
    }

    /// Creates a CQ as [`Nic::create_cq`] that compresses runs of completions into
    /// sessions of mini-CQEs of `format` (`mlx5dv_create_cq` with
    /// `MLX5DV_CQ_INIT_ATTR_MASK_COMPRESSED_CQE`; the module `cq` describes the sessions).
    ///
    /// # Errors
    /// [`SimError::CqeCompression`] when [`NicView::cqe_comp_caps`](super::NicView::cqe_comp_caps) does not allow it (rdma-core's
    /// test); as [`Nic::create_cq`].
    pub fn create_cq_compressed(
        &self,
        cqe_cnt: u32,
        cqe_size: u32,
        format: crate::cqe::MiniCqeFormat,
    ) -> Result<RawCq, SimError> {
        // Refused before a CQ exists.
        let max_num = self.compression_allowed(format, cqe_size)?;
        let raw = self.create_cq(cqe_cnt, cqe_size)?;
        if let Some(cq) = self.st().cqs.get_mut(&raw.cqn) {
            cq.compress(format, max_num);
        }
        Ok(raw)
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
        // As the kernel's destroy (`ib_uverbs_release_uevent`): its unread events go with
        // it, so a later CQ with its number never reads them.
        st.events
            .retain(|e| !matches!(*e, AsyncEvent::CqError { cqn: n } if n == cqn));
        Ok(())
    }

    /// Creates an RC QP in RESET. Its BlueFlame register is rdma-core's choice for a QP
    /// without a thread domain (`mlx5_get_qp_uar`): dedicated for the first ones, then shared.
    ///
    /// # Errors
    /// [`SimError::NoPd`], [`SimError::NoCq`]; [`SimError::Limit`] for a capability out of
    /// range (naming it and the value); [`SimError::Caps`] for a BlueFlame size other than
    /// its thread domain's register's.
    pub fn create_qp(
        &self,
        pd: u32,
        send_cq: u32,
        recv_cq: u32,
        caps: QpCaps,
    ) -> Result<RawQp, SimError> {
        self.create_qp_in(pd, None, send_cq, recv_cq, caps, None)
    }

    /// Creates an RC QP in RESET as [`Nic::create_qp`] over the driver's memory (`mem`: the
    /// rings rdma-core's provider allocated, its doorbell record and the BlueFlame register
    /// it chose), run in place: what `mlx5_ib` `create_user_qp` hands the device. `caps`
    /// sizes the rings as the provider sized them: `sq_blocks` blocks (any power of two: the
    /// provider sized the ring for its requests), `rq_entries` entries of
    /// `16 * max_recv_sge` bytes.
    ///
    /// # Safety
    /// The rings must be valid for reads and writes of those sizes, the record of 8 bytes
    /// and the register of `2 * bf_size + 64` bytes, until [`Nic::destroy_qp`] of this QP
    /// returns.
    ///
    /// # Errors
    /// As [`Nic::create_qp`].
    pub unsafe fn create_qp_at(
        &self,
        pd: u32,
        send_cq: u32,
        recv_cq: u32,
        caps: QpCaps,
        mem: super::host::HostQp,
    ) -> Result<RawQp, SimError> {
        self.create_qp_in(pd, None, send_cq, recv_cq, caps, Some(mem))
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
        self.create_qp_in(pd, Some(td), send_cq, recv_cq, caps, None)
    }

    fn create_qp_in(
        &self,
        pd: u32,
        td: Option<u32>,
        send_cq: u32,
        recv_cq: u32,
        caps: QpCaps,
        host: Option<super::host::HostQp>,
    ) -> Result<RawQp, SimError> {
        let least = if host.is_some() {
            1
        } else {
            crate::doorbell::MAX_WQE_BBS as u32
        };
        // The NIC's own rings hold the largest WQE; the driver's are as the driver sized them.
        let checks: [(bool, &'static str, u32); 7] = [
            (
                caps.bf_size % 64 != 0 || caps.bf_size > 4096,
                "bf_size (0 or a multiple of 64 up to 4096)",
                caps.bf_size,
            ),
            (
                caps.sq_blocks < least || caps.sq_blocks > 1 << 15,
                if host.is_some() {
                    "sq_blocks (1 ..= 32768)"
                } else {
                    "sq_blocks (16 ..= 32768)"
                },
                caps.sq_blocks,
            ),
            (
                caps.rq_entries > 1 << 15,
                "rq_entries (<= 32768)",
                caps.rq_entries,
            ),
            (
                caps.max_recv_sge > 64,
                "max_recv_sge (<= 64)",
                caps.max_recv_sge,
            ),
            (
                caps.max_send_sge > 60,
                "max_send_sge (<= 60)",
                caps.max_send_sge,
            ),
            (
                caps.rnr_retry > 7,
                "rnr_retry (<= 7: a 3-bit field; 7 retries for ever)",
                caps.rnr_retry as u32,
            ),
            (
                caps.max_inline > 960,
                "max_inline (<= 960: a WQE is at most 16 blocks)",
                caps.max_inline,
            ),
        ];
        if let Some(&(_, what, value)) = checks.iter().find(|c| c.0) {
            return Err(SimError::Limit {
                what,
                value: value as u64,
            });
        }
        let mut st = self.st();
        Self::check_pd(&st, pd)?;
        for cq in [send_cq, recv_cq] {
            if !st.cqs.contains_key(&cq) {
                return Err(SimError::NoCq(cq));
            }
        }
        let bf_size = caps.bf_size as usize;
        let reg = match (td, host) {
            (_, Some(h)) => st.uars.host(h.bf_reg, bf_size),
            (None, None) => st.uars.for_qp(bf_size),
            (Some(td), None) => {
                let i = *st.uars.tds.get(&td).ok_or(SimError::NoTd(td))?;
                let r = &mut st.uars.regs[i];
                if r.users == 0 && r.bf_size != bf_size {
                    // The domain's register takes the size of its first QP's BlueFlame.
                    *r = SimReg::new(RegKind::ThreadDomain, bf_size);
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
        let qp = SimQp::new(qpn, pd, (send_cq, recv_cq), caps, (reg, bf), seed, host);
        let raw = qp.raw();
        st.qps.insert(qpn, qp);
        Ok(raw)
    }

    /// Destroys a QP (its rings are freed: the driver must not touch them afterwards).
    ///
    /// # Errors
    /// [`SimError::NoQp`].
    pub fn destroy_qp(&self, qpn: u32) -> Result<(), SimError> {
        let mut st = self.st();
        let q = st.qps.remove(&qpn).ok_or(SimError::NoQp(qpn))?;
        st.qpns.free(qpn);
        for cqn in [q.send_cq, q.recv_cq] {
            if let Some(cq) = st.cqs.get_mut(&cqn) {
                cq.uidx.remove(&qpn);
            }
        }
        // Its unread events go with it (see `destroy_cq`).
        st.events.retain(|e| {
            !matches!(*e,
                AsyncEvent::QpFatal { qpn: n }
                | AsyncEvent::QpAccessError { qpn: n }
                | AsyncEvent::QpLastWqeReached { qpn: n } if n == qpn)
        });
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

    /// Gives QP (or DCT) `qpn` the user index `uidx` a driver of CQE version 1 names it by
    /// (`mlx5_ib_create_qp.uidx`, the QP context's `user_index`): every CQE of the QP carries
    /// it in `srqn_uidx` from then on, as a ConnectX writes it.
    ///
    /// # Errors
    /// [`SimError::NoQp`].
    pub fn set_user_index(&self, qpn: u32, uidx: u32) -> Result<(), SimError> {
        let mut st = self.st();
        let q = st.qps.get(&qpn).ok_or(SimError::NoQp(qpn))?;
        for cqn in [q.send_cq, q.recv_cq] {
            if let Some(cq) = st.cqs.get_mut(&cqn) {
                cq.uidx.insert(qpn, uidx & 0xff_ffff);
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

    /// Creates an SRQ in protection domain `pd` (`ibv_create_srq`): its ring linked as
    /// rdma-core links it, head 0, tail the last entry.
    ///
    /// # Errors
    /// [`SimError::NoPd`], [`SimError::Limit`] (more than 32767 receives or 31 entries),
    /// [`SimError::Exhausted`].
    pub fn create_srq(&self, pd: u32, caps: SrqCaps) -> Result<RawSrq, SimError> {
        self.create_srq_in(pd, caps, None)
    }

    /// Creates an SRQ as [`Nic::create_srq`] over the driver's memory (`mem`: the ring
    /// rdma-core's provider allocated and linked, and its doorbell record), run in place:
    /// what `mlx5_ib` `create_srq_user` hands the device.
    ///
    /// # Safety
    /// The ring must be valid for reads and writes of the entries and stride `caps` make
    /// (`max_wr + 1` rounded up to a power of two, `16 + 16 * max_sge` rounded up to a power
    /// of two and at least 32), the record of 4 bytes, until [`Nic::destroy_srq`] of this SRQ
    /// returns.
    ///
    /// # Errors
    /// As [`Nic::create_srq`].
    pub unsafe fn create_srq_at(
        &self,
        pd: u32,
        caps: SrqCaps,
        mem: super::host::HostSrq,
    ) -> Result<RawSrq, SimError> {
        self.create_srq_in(pd, caps, Some(mem))
    }

    fn create_srq_in(
        &self,
        pd: u32,
        caps: SrqCaps,
        host: Option<super::host::HostSrq>,
    ) -> Result<RawSrq, SimError> {
        if caps.max_wr == 0 || caps.max_wr >= 1 << 15 {
            return Err(SimError::Limit {
                what: "SRQ max_wr (1 ..= 32767)",
                value: caps.max_wr as u64,
            });
        }
        if caps.max_sge > 31 {
            return Err(SimError::Limit {
                what: "SRQ max_sge (<= 31)",
                value: caps.max_sge as u64,
            });
        }
        let mut st = self.st();
        Self::check_pd(&st, pd)?;
        let srqn = st.srqns.alloc().ok_or(SimError::Exhausted("SRQ number"))?;
        let s = SimSrq::new(srqn, pd, caps, host);
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
        // Its unread events go with it (see `destroy_cq`).
        st.events
            .retain(|e| !matches!(*e, AsyncEvent::SrqLimitReached { srqn: n } if n == srqn));
        Ok(())
    }
}
