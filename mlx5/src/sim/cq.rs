//! The NIC side of a completion queue: writes CQEs with the right owner bit and detects
//! overrun.

use super::dma::{self, DmaBuf};
use crate::cqe::{op_own, Cqe64, CqeFormat, CqeOpcode, ErrCqe};
use crate::doorbell::{CQ_ARM_DB, CQ_SET_CI};
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
    /// Whether the CQ's error was raised as an asynchronous event.
    pub(crate) error_reported: bool,
    /// Arm requests and completion events.
    pub(crate) arm: super::arm::ArmState,
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
            error_reported: false,
            arm: super::arm::ArmState::new(),
        }
    }

    pub(crate) fn raw(&self) -> RawCq {
        RawCq {
            cqn: self.cqn,
            buf: self.buf.ptr(),
            cqe_cnt: self.cqe_cnt,
            cqe_size: self.cqe_size,
            dbrec: self.dbrec.ptr() as *mut u32,
            cq_uar: self.arm.uar(),
        }
    }

    /// The consumer index the driver last published.
    pub(crate) fn ci(&self) -> u32 {
        // SAFETY: the doorbell record is a live 64-byte DmaBuf; slot CQ_SET_CI is aligned.
        unsafe { dma::load_be32((self.dbrec.ptr() as *const u32).add(CQ_SET_CI)) }
    }

    /// Reads an arm doorbell the driver wrote since the last look, if any.
    pub(crate) fn look_at_arm(&mut self, next_only: bool) {
        let rec = self.dbrec.ptr() as *const u32;
        // SAFETY: the doorbell record is a live 64-byte DmaBuf (owned by `self`, which the
        // closure does not outlive); slot CQ_ARM_DB is aligned.
        let record = || unsafe { dma::load_be32(rec.add(CQ_ARM_DB)) };
        self.arm
            .look(self.cqn, record, (self.pi, self.cqe_cnt), next_only);
    }

    /// Entries written and not yet consumed.
    pub(crate) fn outstanding(&self) -> u32 {
        self.pi.wrapping_sub(self.ci()) & 0xff_ffff
    }

    /// Writes one CQE (its `op_own` opcode set by the caller, the owner bit set here).
    /// Returns false on overrun (the entry is dropped and the CQ marked in error).
    pub(crate) fn push(&mut self, cqe: Cqe64, opcode: CqeOpcode, solicited: bool) -> bool {
        self.push_scattered(cqe, opcode, solicited, None)
    }

    /// The most data a CQE of this CQ carries (scatter-to-CQE): 32 bytes in a 64-byte CQE,
    /// 64 in a 128-byte one.
    pub(crate) fn inline_max(&self) -> usize {
        if self.cqe_size == 128 {
            64
        } else {
            32
        }
    }

    /// As [`SimCq::push`]; with `data` (at most [`SimCq::inline_max`] bytes), the data go
    /// inside the entry as a ConnectX scatters to the CQE: up to 32 bytes in the first 32
    /// bytes of the 64-byte CQE (format INLINE_SCATTER_32), more in the 64 bytes before it
    /// (format INLINE_SCATTER_64, 128-byte CQEs only).
    pub(crate) fn push_scattered(
        &mut self,
        mut cqe: Cqe64,
        opcode: CqeOpcode,
        solicited: bool,
        data: Option<&[u8]>,
    ) -> bool {
        if self.overrun || self.outstanding() >= self.cqe_cnt {
            self.overrun = true;
            return false;
        }
        let owner = self.pi & self.cqe_cnt != 0;
        let idx = (self.pi & (self.cqe_cnt - 1)) as usize;
        let slot = idx * self.cqe_size as usize;
        let off = slot + crate::cqe::cqe64_offset(self.cqe_size as usize);
        let format = match data {
            None => CqeFormat::Plain,
            Some(d) if d.len() <= 32 => {
                cqe.rsvd0[..d.len()].copy_from_slice(d);
                CqeFormat::InlineScatter32
            }
            Some(d) => {
                assert!(
                    d.len() <= self.inline_max(),
                    "inline data longer than the CQE"
                );
                // SAFETY: a 128-byte slot (inline_max 64): its first half lies inside the
                // ring; the entry is the NIC's until its owner byte is published below.
                unsafe { dma::write(self.buf.ptr().add(slot), d) };
                CqeFormat::InlineScatter64
            }
        };
        cqe.op_own = op_own(opcode, format, solicited, owner);
        let mut bytes = [0u8; 64];
        bytes.copy_from_slice(cqe.as_bytes());
        // SAFETY: `off + 64` lies within the ring of cqe_cnt * cqe_size bytes.
        unsafe { dma::publish_cqe(self.buf.ptr().add(off), &bytes) };
        let error = matches!(opcode, CqeOpcode::ReqErr | CqeOpcode::RespErr);
        self.arm.on_entry(self.pi, solicited || error);
        self.pi = self.pi.wrapping_add(1);
        true
    }

    /// Writes an error CQE.
    pub(crate) fn push_err(&mut self, e: ErrCqe, opcode: CqeOpcode) -> bool {
        let c: Cqe64 = zerocopy::transmute!(e);
        self.push(c, opcode, false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zerocopy::FromBytes;

    fn slot(cq: &SimCq, i: usize) -> Vec<u8> {
        let mut v = vec![0u8; cq.cqe_size as usize];
        // SAFETY: slot `i` lies inside the ring.
        unsafe { dma::read(cq.buf.ptr().add(i * cq.cqe_size as usize), &mut v) };
        v
    }

    #[test]
    fn scattered_data_sit_where_rdma_core_reads_them() {
        // 64-byte CQEs: up to 32 bytes at the start of the CQE, format INLINE_SCATTER_32.
        let mut cq = SimCq::new(1, 4, 64);
        assert_eq!(cq.inline_max(), 32);
        let data: Vec<u8> = (1..=32).collect();
        assert!(cq.push_scattered(Cqe64::default(), CqeOpcode::RespSend, false, Some(&data)));
        let e = Cqe64::read_from_bytes(&slot(&cq, 0)).unwrap();
        assert_eq!(e.format(), CqeFormat::InlineScatter32);
        assert_eq!(&e.rsvd0[..], &data[..]);
        // 128-byte CQEs: up to 32 bytes as above, more in the 64 bytes before the CQE.
        let mut cq = SimCq::new(2, 4, 128);
        assert_eq!(cq.inline_max(), 64);
        assert!(cq.push_scattered(
            Cqe64::default(),
            CqeOpcode::RespSend,
            false,
            Some(&data[..5])
        ));
        let s = slot(&cq, 0);
        let e = Cqe64::read_from_bytes(&s[64..]).unwrap();
        assert_eq!(e.format(), CqeFormat::InlineScatter32);
        assert_eq!(&e.rsvd0[..5], &data[..5]);
        let long: Vec<u8> = (100..164).collect();
        assert!(cq.push_scattered(Cqe64::default(), CqeOpcode::RespSendImm, true, Some(&long)));
        let s = slot(&cq, 1);
        let e = Cqe64::read_from_bytes(&s[64..]).unwrap();
        assert_eq!(e.format(), CqeFormat::InlineScatter64);
        assert_eq!(e.opcode(), Some(CqeOpcode::RespSendImm));
        assert_eq!(&s[..64], &long[..]);
        assert!(cq.push(Cqe64::default(), CqeOpcode::Req, false));
        let e = Cqe64::read_from_bytes(&slot(&cq, 2)[64..]).unwrap();
        assert_eq!(e.format(), CqeFormat::Plain);
    }
}
