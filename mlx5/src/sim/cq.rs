//! The NIC side of a completion queue: writes CQEs with the right owner bit and detects
//! overrun.

use super::dma::{self, DmaBuf};
use crate::cqe::{op_own, Cqe64, CqeFormat, CqeOpcode, ErrCqe};
use crate::doorbell::CQ_SET_CI;
use crate::RawCq;
use zerocopy::IntoBytes;

/// An error CQE with its syndrome, `opcode << 24 | qpn` and WQE counter.
pub(crate) fn err_cqe(syndrome: u8, opcode_qpn: u32, wqe_counter: u16) -> ErrCqe {
    ErrCqe {
        syndrome,
        s_wqe_opcode_qpn: crate::Be32::new(opcode_qpn),
        wqe_counter: crate::Be16::new(wqe_counter),
        ..ErrCqe::default()
    }
}

pub(crate) struct SimCq {
    pub(crate) cqn: u32,
    buf: DmaBuf,
    pub(crate) cqe_cnt: u32,
    pub(crate) cqe_size: u32,
    dbrec: DmaBuf,
    /// CQEs written so far.
    pub(crate) pi: u32,
    /// Set when the NIC found no free entry: the CQ is in error from then on.
    pub(crate) overrun: bool,
}

impl SimCq {
    pub(crate) fn new(cqn: u32, cqe_cnt: u32, cqe_size: u32) -> SimCq {
        let buf = DmaBuf::new(cqe_cnt as usize * cqe_size as usize);
        // Every entry starts as "invalid, owner 0", as rdma-core initialises its CQs.
        for i in 0..cqe_cnt as usize {
            let at = i * cqe_size as usize + crate::cqe::cqe64_offset(cqe_size as usize) + 63;
            // SAFETY: `at` is inside the freshly allocated ring of cqe_cnt * cqe_size bytes.
            unsafe { buf.ptr().add(at).write((CqeOpcode::Invalid as u8) << 4) };
        }
        SimCq {
            cqn,
            buf,
            cqe_cnt,
            cqe_size,
            dbrec: DmaBuf::new(64),
            pi: 0,
            overrun: false,
        }
    }

    pub(crate) fn raw(&self) -> RawCq {
        RawCq {
            cqn: self.cqn,
            buf: self.buf.ptr(),
            cqe_cnt: self.cqe_cnt,
            cqe_size: self.cqe_size,
            dbrec: self.dbrec.ptr() as *mut u32,
            cq_uar: std::ptr::null_mut(),
        }
    }

    /// The consumer index the driver last published.
    pub(crate) fn ci(&self) -> u32 {
        // SAFETY: the doorbell record is a live 64-byte DmaBuf; slot CQ_SET_CI is aligned.
        unsafe { dma::load_be32((self.dbrec.ptr() as *const u32).add(CQ_SET_CI)) }
    }

    /// Entries written and not yet consumed.
    pub(crate) fn outstanding(&self) -> u32 {
        self.pi.wrapping_sub(self.ci()) & 0xff_ffff
    }

    /// Writes one CQE (its `op_own` opcode set by the caller, the owner bit set here).
    /// Returns false on overrun (the entry is dropped and the CQ marked in error).
    pub(crate) fn push(&mut self, mut cqe: Cqe64, opcode: CqeOpcode, solicited: bool) -> bool {
        if self.overrun || self.outstanding() >= self.cqe_cnt {
            self.overrun = true;
            return false;
        }
        let owner = self.pi & self.cqe_cnt != 0;
        cqe.op_own = op_own(opcode, CqeFormat::Plain, solicited, owner);
        let idx = (self.pi & (self.cqe_cnt - 1)) as usize;
        let off = idx * self.cqe_size as usize + crate::cqe::cqe64_offset(self.cqe_size as usize);
        let mut bytes = [0u8; 64];
        bytes.copy_from_slice(cqe.as_bytes());
        // SAFETY: `off + 64` lies within the ring of cqe_cnt * cqe_size bytes.
        unsafe { dma::publish_cqe(self.buf.ptr().add(off), &bytes) };
        self.pi = self.pi.wrapping_add(1);
        true
    }

    /// Writes an error CQE.
    pub(crate) fn push_err(&mut self, e: ErrCqe, opcode: CqeOpcode) -> bool {
        let c: Cqe64 = zerocopy::transmute!(e);
        self.push(c, opcode, false)
    }
}
