//! The NIC side of a completion queue: writes CQEs with the right owner bit, detects
//! overrun, and compresses runs of completions into sessions when the CQ was created so.
//!
//! CQE compression (the basic layout a CQ from `mlx5dv_create_cq` with
//! `MLX5DV_CQ_INIT_ATTR_MASK_COMPRESSED_CQE` gets; DPDK `mlx5_rx_poll_len` /
//! `rxq_cq_decompress_v` read it): consecutive completions of one QP and one CQE opcode
//! whose shared fields agree become one *session* of `n` slots: a title CQE (format
//! COMPRESSED, `byte_cnt` = n, the owner bit of its slot, the fields the completions share),
//! then arrays of 8 mini-CQEs, the first in the slot after the title, the next ones every 8
//! slots from the title ([`mini_array_slot`]); the slots in between are holes the NIC never
//! writes. An array's last byte (the `op_own` position) is mini-CQE data, and the unused
//! entries of the last array hold a filler that looks like a valid entry of the next pass:
//! a poller that does not invalidate a consumed session (DPDK's `MLX5_CQE_INVALIDATE`)
//! reads stale entries on the next pass, as it would on a ConnectX. Receives carry no WQE
//! counter in their mini-CQE (their counters are consecutive from the title's); the
//! responder's first 4 bytes are what the CQ's [`MiniCqeFormat`] names.
//!
//! When: the NIC gathers the completions of one pass ([`NicView::process`](super::NicView::process),
//! the stand-in for a ConnectX's compression timeout) and closes a session when the next
//! completion does not match it, when it reaches the CQ's `max_num`, before any CQE that is
//! never compressed (errors, data inside the CQE) and at the end of the pass. A session of
//! one is written as a plain CQE, so a consumer that keeps up sees no compression. The title
//! is written last (its owner byte with Release ordering), after the arrays.

use super::dma::{self, DmaBuf};
use crate::cqe::{
    mini_array_slot, op_own, sw_owner, Cqe64, CqeFormat, CqeOpcode, ErrCqe, MiniCqe8,
    MiniCqeFormat, MINI_CQES_PER_BLOCK,
};
use crate::doorbell::{CQ_ARM_DB, CQ_SET_CI};
use crate::raw::RawCq;
use zerocopy::IntoBytes;

/// An error CQE with its syndrome, `opcode << 24 | qpn` and WQE counter.
pub(crate) fn err_cqe(syndrome: u8, opcode_qpn: u32, wqe_counter: u16) -> ErrCqe {
    ErrCqe {
        syndrome,
        s_wqe_opcode_qpn: crate::be::Be32::new(opcode_qpn),
        wqe_counter: crate::be::Be16::new(wqe_counter),
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
    /// The user index of each QP completing here that has one (CQE version 1: rdma-core's
    /// libmlx5 names a QP by the index it gave the kernel at creation, `mlx5_store_uidx`):
    /// written into `srqn_uidx` of every entry of that QP, as a ConnectX writes the QP
    /// context's `user_index`. A QP without one (the software NIC's own creation path) gets
    /// version 0's field: the SRQ's number on a receive from an SRQ, else 0.
    pub(crate) uidx: std::collections::HashMap<u32, u32>,
    /// Whether the CQ's error was raised as an asynchronous event.
    pub(crate) error_reported: bool,
    /// Whether its UAR page is the driver's, shared with other CQs.
    shared: bool,
    /// Arm requests and completion events.
    pub(crate) arm: super::arm::ArmState,
    /// CQE compression: the mini-CQE format and the longest session.
    zip: Option<(MiniCqeFormat, u32)>,
    /// The session being gathered (not written yet).
    open: Option<Session>,
    /// Compressed sessions written, and the completions in them.
    pub(crate) zip_stats: (u64, u64),
}

/// A session being gathered: its first CQE (the title to be) and the mini-CQE of each
/// completion.
struct Session {
    title: Cqe64,
    opcode: CqeOpcode,
    solicited: bool,
    minis: Vec<MiniCqe8>,
}

impl Session {
    /// Whether a completion of `cqe` and `opcode` joins this session: same QP and CQE
    /// opcode; a receive also needs the next receive counter and the same immediate and
    /// solicited bit (its mini-CQE carries neither).
    fn takes(&self, cqe: &Cqe64, opcode: CqeOpcode, solicited: bool) -> bool {
        let t = &self.title;
        // The leading union carries a UD receive's source QP, SL and GRH bit, which
        // mini-CQEs do not: only equal ones share a session.
        if opcode != self.opcode || cqe.qpn() != t.qpn() || cqe.rsvd0 != t.rsvd0 {
            return false;
        }
        opcode == CqeOpcode::Req
            || (solicited == self.solicited
                && cqe.imm_inval_pkey == t.imm_inval_pkey
                && cqe.wqe_counter.get()
                    == t.wqe_counter.get().wrapping_add(self.minis.len() as u16))
    }
}

/// The mini-CQE of a completion: a requester's carries its WQE counter and send opcode, a
/// responder's what `format` names. A software NIC has no RSS hash or packet checksum for
/// RC traffic: it writes a value derived from the QP and receive counter there, never the
/// counter itself, so a poller that takes it for one fails.
fn mini(cqe: &Cqe64, opcode: CqeOpcode, format: MiniCqeFormat) -> MiniCqe8 {
    if opcode == CqeOpcode::Req {
        return MiniCqe8 {
            wqe_counter_or_csum: cqe.wqe_counter,
            s_wqe_opcode: cqe.wqe_opcode(),
            reserved: 0,
            byte_cnt: cqe.byte_cnt,
        };
    }
    let mix = (cqe.qpn() ^ (cqe.wqe_counter.get() as u32) << 8).wrapping_mul(0x9e37_79b9) | 1;
    let first = match format {
        MiniCqeFormat::Hash => mix,
        // Checksum, then a reserved half (or the stride index, 0 for a plain receive queue).
        MiniCqeFormat::Csum | MiniCqeFormat::CsumStridx => mix & 0xffff_0000 | 0x8000,
    };
    MiniCqe8 {
        wqe_counter_or_csum: crate::be::Be16::new((first >> 16) as u16),
        s_wqe_opcode: (first >> 8) as u8,
        reserved: first as u8,
        byte_cnt: cqe.byte_cnt,
    }
}

impl SimCq {
    #[cfg(test)]
    pub(crate) fn new(cqn: u32, cqe_cnt: u32, cqe_size: u32) -> SimCq {
        SimCq::in_memory(cqn, cqe_cnt, cqe_size, None)
    }

    /// A CQ whose ring, record and UAR page are the driver's (`host`) or the NIC's own.
    /// The driver's memory must hold `cqe_cnt * cqe_size` bytes (the caller's promise).
    pub(crate) fn in_memory(
        cqn: u32,
        cqe_cnt: u32,
        cqe_size: u32,
        host: Option<super::host::HostCq>,
    ) -> SimCq {
        let own = host.is_none();
        let shared = !own;
        let (buf, dbrec, arm) = match host {
            None => (
                DmaBuf::new(cqe_cnt as usize * cqe_size as usize),
                DmaBuf::new(64),
                super::arm::ArmState::new(),
            ),
            Some(h) => {
                // The register is shared with the context's other CQs: arm requests are read
                // from the record, kept at UNARMED between them (`ArmState::look_shared`).
                // SAFETY: the caller's promise: the record is live; word CQ_ARM_DB is aligned
                // and the driver does not arm a CQ it has not created yet.
                unsafe {
                    (*(h.dbrec.add(CQ_ARM_DB) as *const core::sync::atomic::AtomicU32)).store(
                        super::arm::UNARMED.to_be(),
                        core::sync::atomic::Ordering::Release,
                    )
                };
                (
                    DmaBuf::host(h.buf),
                    DmaBuf::host(h.dbrec.cast()),
                    super::arm::ArmState::on(DmaBuf::host(h.uar)),
                )
            }
        };
        // Every entry starts as "invalid, owner 0", as rdma-core initialises its CQs (the
        // driver's own ring it initialised itself: `mlx5_alloc_cq_buf`).
        for i in (0..cqe_cnt as usize).filter(|_| own) {
            let at = i * cqe_size as usize + crate::cqe::cqe64_offset(cqe_size as usize) + 63;
            // SAFETY: `at` is inside the freshly allocated ring of cqe_cnt * cqe_size bytes.
            unsafe { buf.ptr().add(at).write((CqeOpcode::Invalid as u8) << 4) };
        }
        SimCq {
            cqn,
            buf,
            cqe_cnt,
            cqe_size,
            dbrec,
            pi: 0,
            overrun: false,
            error_reported: false,
            uidx: std::collections::HashMap::new(),
            shared,
            arm,
            zip: None,
            open: None,
            zip_stats: (0, 0),
        }
    }

    /// Turns CQE compression on (at creation): mini-CQEs of `format`, sessions of at most
    /// `max_num` completions (at least 2).
    pub(crate) fn compress(&mut self, format: MiniCqeFormat, max_num: u32) {
        self.zip = Some((format, max_num.max(2)));
    }

    /// The mini-CQE format, if the CQ compresses.
    pub(crate) fn zip_format(&self) -> Option<MiniCqeFormat> {
        self.zip.map(|z| z.0)
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
        if self.shared {
            // SAFETY: the record is live while the CQ is (the creator's promise); slot
            // CQ_ARM_DB is aligned.
            unsafe {
                self.arm.look_shared(
                    self.cqn,
                    rec.add(CQ_ARM_DB),
                    (self.pi, self.cqe_cnt),
                    next_only,
                )
            };
            return;
        }
        // SAFETY: the doorbell record is a live 64-byte DmaBuf (owned by `self`, which the
        // closure does not outlive); slot CQ_ARM_DB is aligned.
        let record = || unsafe { dma::load_be32(rec.add(CQ_ARM_DB)) };
        self.arm
            .look(self.cqn, record, (self.pi, self.cqe_cnt), next_only);
    }

    /// Entries written or gathered into a session, and not yet consumed.
    pub(crate) fn outstanding(&self) -> u32 {
        let gathered = self.open.as_ref().map_or(0, |s| s.minis.len() as u32);
        (self.pi.wrapping_sub(self.ci()) & 0xff_ffff) + gathered
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
        // The QP number sits in the same bits of a good and an error CQE.
        if let Some(&u) = self.uidx.get(&cqe.qpn()) {
            cqe.srqn_uidx = crate::be::Be32::new(u);
        }
        if self.overrun || self.outstanding() >= self.cqe_cnt {
            self.overrun = true;
            self.open = None;
            return false;
        }
        if let Some((format, max)) = self.zip {
            let compressible = data.is_none()
                && matches!(
                    opcode,
                    CqeOpcode::Req
                        | CqeOpcode::RespSend
                        | CqeOpcode::RespSendImm
                        | CqeOpcode::RespWrImm
                        | CqeOpcode::RespSendInv
                );
            if compressible {
                if let Some(s) = self
                    .open
                    .as_mut()
                    .filter(|s| s.takes(&cqe, opcode, solicited))
                {
                    s.minis.push(mini(&cqe, opcode, format));
                    if s.minis.len() as u32 >= max {
                        self.close_session();
                    }
                } else {
                    self.close_session();
                    self.open = Some(Session {
                        minis: vec![mini(&cqe, opcode, format)],
                        title: cqe,
                        opcode,
                        solicited,
                    });
                }
                return true;
            }
            // Never compressed: the session before it is written first.
            self.close_session();
        }
        self.write_slot(cqe, opcode, solicited, data);
        true
    }

    /// Writes the session being gathered, if any: compressed from two completions on, a
    /// plain CQE for one.
    pub(crate) fn close_session(&mut self) {
        let Some(s) = self.open.take() else {
            return;
        };
        if self.overrun {
            return;
        }
        let n = s.minis.len() as u32;
        if n == 1 {
            self.write_slot(s.title, s.opcode, s.solicited, None);
            return;
        }
        let cnt = self.cqe_cnt;
        let at = |abs: u32| {
            let slot = (abs & (cnt - 1)) as usize * self.cqe_size as usize;
            slot + crate::cqe::cqe64_offset(self.cqe_size as usize)
        };
        // The arrays first: array k holds mini-CQEs 8k .. 8k+7.
        for (k, chunk) in s.minis.chunks(MINI_CQES_PER_BLOCK).enumerate() {
            let abs = self
                .pi
                .wrapping_add(mini_array_slot((k * MINI_CQES_PER_BLOCK) as u32));
            // Unused entries: a filler whose last byte reads as a valid plain requester CQE
            // of this slot's next pass.
            let mut bytes = [sw_owner(abs.wrapping_add(cnt), cnt); 64];
            for (i, m) in chunk.iter().enumerate() {
                bytes[i * 8..i * 8 + 8].copy_from_slice(m.as_bytes());
            }
            // SAFETY: `at` is a 64-byte CQE inside the ring; the slot is the NIC's (the
            // session's room was checked as each completion joined it).
            unsafe { dma::write(self.buf.ptr().add(at(abs)), &bytes) };
        }
        // Then the title, its owner byte last.
        let mut title = s.title;
        title.byte_cnt = crate::be::Be32::new(n);
        title.op_own = op_own(
            s.opcode,
            CqeFormat::Compressed,
            s.solicited,
            self.pi & cnt != 0,
        );
        let mut bytes = [0u8; 64];
        bytes.copy_from_slice(title.as_bytes());
        // SAFETY: as above.
        unsafe { dma::publish_cqe(self.buf.ptr().add(at(self.pi)), &bytes) };
        // Completion events: as for the session's last entry (they share the solicited bit).
        self.arm.on_entry(self.pi.wrapping_add(n - 1), s.solicited);
        self.pi = self.pi.wrapping_add(n);
        self.zip_stats.0 += 1;
        self.zip_stats.1 += n as u64;
    }

    /// Writes one uncompressed CQE at the producer index (room checked by the caller).
    fn write_slot(
        &mut self,
        mut cqe: Cqe64,
        opcode: CqeOpcode,
        solicited: bool,
        data: Option<&[u8]>,
    ) {
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
