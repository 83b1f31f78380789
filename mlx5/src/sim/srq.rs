//! The NIC side of a shared receive queue: its ring of linked WQEs, taken as a ConnectX
//! takes them.
//!
//! - The ring is a linked list of WQEs ([`crate::srq`]): the NIC takes the WQE at its head
//!   and moves to that WQE's `next_wqe_index`; it never looks at the driver's head or tail.
//!   How many WQEs it may take is the doorbell record's counter (16 bits) minus what it took.
//! - Any receiving object attached to the SRQ
//!   ([`State::attach_srq`](super::state::State::attach_srq): an RC QP now; the same call
//!   serves a DCT) takes its receives from it; the CQE names the receiving QP
//!   (`sop_drop_qpn`), the SRQ (`srqn_uidx`, as with CQE version 0; a QP given a user index, `Nic::set_user_index`, has that there instead, as with version 1) and the WQE's index
//!   (`wqe_counter`), which the driver gives back to its free list.
//! - A QP that goes to error does not flush the SRQ's WQEs (they stay for the others): it
//!   raises [`AsyncEvent::QpLastWqeReached`](super::AsyncEvent::QpLastWqeReached) once
//!   instead.
//! - The limit ("LWM"): armed by [`Nic::arm_srq_limit`](super::Nic::arm_srq_limit); when the
//!   NIC takes a WQE and fewer than the limit remain posted, it raises
//!   [`AsyncEvent::SrqLimitReached`](super::AsyncEvent::SrqLimitReached) once and disarms
//!   (the kernel's `mlx5_ib_modify_srq` refuses a limit not below the ring's size).
//! - No WQE posted: an RC sender gets RNR NAKs, as with a QP's own receive queue.

use super::dma::{self, DmaBuf};
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
    pub(crate) cnt: u32,
    stride: u32,
    max_sge: u32,
    dbrec: DmaBuf,
    /// The index of the next WQE the NIC takes.
    head: u16,
    /// WQEs taken (16 bits, compared with the doorbell record's counter).
    taken: u16,
    /// The armed limit (0: disarmed).
    pub(crate) limit: u32,
    /// Receiving objects attached (QPs, DCTs): the SRQ cannot be destroyed while any is.
    pub(crate) users: u32,
    pub(crate) stats: SrqStats,
}

impl SimSrq {
    /// An SRQ over its own ring, or over the driver's (`host`, its links written by the
    /// driver: rdma-core `mlx5_alloc_srq_buf`).
    pub(crate) fn new(
        srqn: u32,
        pd: u32,
        caps: SrqCaps,
        host: Option<super::host::HostSrq>,
    ) -> SimSrq {
        let stride = srq_stride(caps.max_sge.max(1)).unwrap_or(512);
        let cnt = srq_entries(caps.max_wr.max(1));
        let (buf, dbrec) = match host {
            Some(h) => (DmaBuf::host(h.buf), DmaBuf::host(h.dbrec.cast())),
            None => {
                let buf = DmaBuf::new((cnt * stride) as usize);
                let mut ring = vec![0u8; (cnt * stride) as usize];
                init_links(&mut ring, stride as usize);
                // SAFETY: the ring was just allocated with exactly these bytes; the driver
                // has no pointer to it yet.
                unsafe { dma::write(buf.ptr(), &ring) };
                (buf, DmaBuf::new(64))
            }
        };
        SimSrq {
            srqn,
            pd,
            buf,
            cnt,
            stride,
            max_sge: srq_max_sge(stride),
            dbrec,
            head: 0,
            taken: 0,
            limit: 0,
            users: 0,
            stats: SrqStats::default(),
        }
    }

    pub(crate) fn raw(&self) -> RawSrq {
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
    /// entries. Raises nothing (see [`State::take_srq_wqe`](super::state::State::take_srq_wqe)).
    pub(crate) fn take(&mut self, out: &mut [Sge; 64]) -> (u16, usize) {
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
