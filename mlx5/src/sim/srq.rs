//! The NIC side of a shared receive queue, as a ConnectX runs one.
//!
//! - The ring is a linked list of WQEs ([`crate::srq`]): the NIC takes the WQE at its head
//!   and moves to that WQE's `next_wqe_index`; it never looks at the driver's head or tail.
//!   How many WQEs it may take is the doorbell record's counter (16 bits) minus what it took.
//! - Any receiving object attached to the SRQ ([`State::attach_srq`]: an RC QP now; the
//!   same call serves a DCT) takes its receives from it; the CQE names the receiving QP
//!   (`sop_drop_qpn`), the SRQ (`srqn_uidx`, as with CQE version 0) and the WQE's index
//!   (`wqe_counter`), which the driver gives back to its free list.
//! - A QP that goes to error does not flush the SRQ's WQEs (they stay for the others): it
//!   raises [`AsyncEvent::QpLastWqeReached`] once instead.
//! - The limit ("LWM"): armed by [`Nic::arm_srq_limit`]; when the NIC takes a WQE and fewer
//!   than the limit remain posted, it raises [`AsyncEvent::SrqLimitReached`] once and
//!   disarms (the kernel's `mlx5_ib_modify_srq` refuses a limit not below the ring's size).
//! - No WQE posted: an RC sender gets RNR NAKs, as with a QP's own receive queue.

use super::dma::{self, DmaBuf};
use super::{AsyncEvent, Nic, SimError, State};
use crate::request::Sge;
use crate::srq::{decode_srq_recv, init_links, srq_entries, srq_max_sge, srq_stride, RawSrq};

/// Creation limits of a software SRQ.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct SrqCaps {
    /// Receives the SRQ must hold at once (the ring gets one more entry, rounded up to a
    /// power of two; at most 32767).
    pub max_wr: u32,
    /// Scatter entries per receive (at most 31).
    pub max_sge: u32,
}

impl Default for SrqCaps {
    fn default() -> Self {
        SrqCaps {
            max_wr: 255,
            max_sge: 4,
        }
    }
}

/// What the NIC saw of one SRQ.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct SrqStats {
    /// WQEs taken by receiving QPs.
    pub taken: u64,
    /// Limit events raised.
    pub limit_events: u64,
}

pub(crate) struct SimSrq {
    pub(crate) srqn: u32,
    pub(crate) pd: u32,
    buf: DmaBuf,
    cnt: u32,
    stride: u32,
    max_sge: u32,
    dbrec: DmaBuf,
    /// The index of the next WQE the NIC takes.
    head: u16,
    /// WQEs taken (16 bits, compared with the doorbell record's counter).
    taken: u16,
    /// The armed limit (0: disarmed).
    limit: u32,
    /// Receiving objects attached (QPs, DCTs): the SRQ cannot be destroyed while any is.
    pub(crate) users: u32,
    pub(crate) stats: SrqStats,
}

impl SimSrq {
    fn new(srqn: u32, pd: u32, caps: SrqCaps) -> SimSrq {
        let stride = srq_stride(caps.max_sge.max(1)).unwrap_or(512);
        let cnt = srq_entries(caps.max_wr.max(1));
        let buf = DmaBuf::new((cnt * stride) as usize);
        let mut ring = vec![0u8; (cnt * stride) as usize];
        init_links(&mut ring, stride as usize);
        // SAFETY: the ring was just allocated with exactly these bytes; the driver has no
        // pointer to it yet.
        unsafe { dma::write(buf.ptr(), &ring) };
        SimSrq {
            srqn,
            pd,
            buf,
            cnt,
            stride,
            max_sge: srq_max_sge(stride),
            dbrec: DmaBuf::new(64),
            head: 0,
            taken: 0,
            limit: 0,
            users: 0,
            stats: SrqStats::default(),
        }
    }

    fn raw(&self) -> RawSrq {
        RawSrq {
            srqn: self.srqn,
            buf: self.buf.ptr(),
            wqe_cnt: self.cnt,
            stride: self.stride,
            dbrec: self.dbrec.ptr() as *mut u32,
            head: 0,
            tail: self.cnt - 1,
            max_sge: self.max_sge,
        }
    }

    /// WQEs posted and not taken.
    pub(crate) fn pending(&self) -> u32 {
        // SAFETY: the doorbell record is a live 64-byte DmaBuf; word 0 is aligned.
        let db = unsafe { dma::load_be32(self.dbrec.ptr() as *const u32) };
        (db.wrapping_sub(self.taken as u32)) & 0xffff
    }

    /// Takes the WQE at the head (the caller checked [`SimSrq::pending`]): its index and
    /// entries. Raises nothing (see [`State::take_srq_wqe`]).
    fn take(&mut self, out: &mut [Sge; 64]) -> (u16, usize) {
        let idx = self.head;
        let stride = self.stride as usize;
        let mut entry = [0u8; 512];
        let at = (idx as u32 & (self.cnt - 1)) as usize * stride;
        // SAFETY: entry `idx` (masked) of `stride` <= 512 bytes lies inside the ring.
        unsafe { dma::read(self.buf.ptr().add(at), &mut entry[..stride]) };
        let (next, n) = decode_srq_recv(&entry[..stride], out);
        self.head = next;
        self.taken = self.taken.wrapping_add(1);
        self.stats.taken += 1;
        (idx & (self.cnt - 1) as u16, n)
    }
}

/// A receive WQE taken for an incoming message.
pub(crate) struct Taken {
    /// Its index (the CQE's `wqe_counter`).
    pub(crate) idx: u16,
    /// Scatter entries in the caller's array.
    pub(crate) n: usize,
    /// The SRQ it came from (0: the QP's own receive queue): the CQE's `srqn_uidx`.
    pub(crate) srqn: u32,
}

impl State {
    /// Attaches `receiver` (a QP or DCT number) to SRQ `srqn`: it takes its receives from
    /// it from now on. The receiver's own bookkeeping (which SRQ it names) is its
    /// creator's; this counts it as a user, so the SRQ outlives it.
    ///
    /// # Errors
    /// [`SimError::NoSrq`].
    pub(crate) fn attach_srq(&mut self, srqn: u32) -> Result<(), SimError> {
        let s = self.srqs.get_mut(&srqn).ok_or(SimError::NoSrq(srqn))?;
        s.users += 1;
        Ok(())
    }

    /// Makes receiving object `qpn` (an RC QP, or a DCT, both in the QP map) take its
    /// receives from SRQ `srqn` from now on: the one call any receiver's creation makes
    /// (`srq` in `ibv_qp_init_attr`, or in the DCT's `mlx5dv_create_qp` attributes). Its
    /// own receive queue, if it has one, is no longer used.
    ///
    /// # Errors
    /// [`SimError::NoQp`], [`SimError::NoSrq`].
    pub(crate) fn attach_receiver(&mut self, qpn: u32, srqn: u32) -> Result<(), SimError> {
        if !self.qps.contains_key(&qpn) {
            return Err(SimError::NoQp(qpn));
        }
        self.attach_srq(srqn)?;
        let q = self.qps.get_mut(&qpn).expect("checked");
        if let Some(old) = q.srq.replace(srqn) {
            self.detach_srq(old);
        }
        Ok(())
    }

    /// The receiver using SRQ `srqn` is gone.
    pub(crate) fn detach_srq(&mut self, srqn: u32) {
        if let Some(s) = self.srqs.get_mut(&srqn) {
            s.users = s.users.saturating_sub(1);
        }
    }

    /// Receive WQEs available to QP `qpn` (its own, or its SRQ's).
    pub(crate) fn recv_pending(&self, qpn: u32) -> u32 {
        let Some(q) = self.qps.get(&qpn) else {
            return 0;
        };
        match q.srq {
            Some(srqn) => self.srqs.get(&srqn).map_or(0, |s| s.pending()),
            None => q.rq_pending(),
        }
    }

    /// Takes the next receive WQE of QP `qpn` (its own, or its SRQ's), if one is posted.
    pub(crate) fn take_recv(&mut self, qpn: u32, out: &mut [Sge; 64]) -> Option<Taken> {
        let q = self.qps.get_mut(&qpn)?;
        match q.srq {
            Some(srqn) => {
                let (idx, n) = self.take_srq_wqe(srqn, out)?;
                Some(Taken { idx, n, srqn })
            }
            None => {
                if q.rq_pending() == 0 {
                    return None;
                }
                let n = q.peek_recv(out);
                let idx = q.rq_ci as u16;
                q.rq_ci = q.rq_ci.wrapping_add(1);
                Some(Taken { idx, n, srqn: 0 })
            }
        }
    }

    /// Takes the WQE at the head of SRQ `srqn` for any receiver attached to it, if one is
    /// posted; raises the limit event when fewer than the armed limit remain.
    pub(crate) fn take_srq_wqe(&mut self, srqn: u32, out: &mut [Sge; 64]) -> Option<(u16, usize)> {
        let s = self.srqs.get_mut(&srqn)?;
        if s.pending() == 0 {
            return None;
        }
        let got = s.take(out);
        if s.limit != 0 && s.pending() < s.limit {
            s.limit = 0;
            s.stats.limit_events += 1;
            self.events.push_back(AsyncEvent::SrqLimitReached { srqn });
        }
        Some(got)
    }

    /// A QP with an SRQ that is in error: its receives are not flushed (the SRQ's WQEs stay
    /// for the others); the last-WQE-reached event, once.
    pub(crate) fn last_wqe_if_error(&mut self, qpn: u32) {
        if let Some(q) = self.qps.get_mut(&qpn) {
            if q.srq.is_some() && q.state == super::qp_attr::QpState::Error && !q.last_wqe_reached {
                q.last_wqe_reached = true;
                self.events.push_back(AsyncEvent::QpLastWqeReached { qpn });
            }
        }
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
