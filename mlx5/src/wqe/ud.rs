//! UD send WQEs: control segment, datagram segment (the address vector with the destination
//! QP and Q_Key), then the payload (one inline segment or a gather list), as rdma-core's
//! `_mlx5_post_send` builds them for `IBV_QPT_UD` (`set_datagram_seg` right after the control
//! segment) and UCX's `uct_ud_mlx5` does.

use super::decode::{payload, read};
use super::ds_to_bbs;
use super::encode::{payload_ds, put_payload, EncodeError, Limits};
use super::span::Span;
use crate::av::{DatagramSeg, DATAGRAM_SEG_DS};
use crate::be::Be32;
use crate::ctrl::{CtrlSeg, FmCeSe, MAX_DS};
use crate::doorbell::MAX_WQE_BBS;
use crate::opcode::Opcode;
use crate::request::{Payload, Sge};
use crate::seg::DS_BYTES;
use zerocopy::IntoBytes;

/// DS units before the payload of a UD WQE: control (1) and datagram (3) segments.
pub const UD_HEADER_DS: usize = 1 + DATAGRAM_SEG_DS;

/// One UD send: where to (the datagram segment), what, and the immediate if any.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct UdSend<'a> {
    /// The datagram segment ([`DatagramSeg::ud`] of the address handle's AV).
    pub dgram: DatagramSeg,
    /// The message.
    pub data: Payload<'a>,
    /// Send with immediate (`MLX5_OPCODE_SEND_IMM`) when set.
    pub imm: Option<u32>,
}

/// Validates a UD send against the QP's limits and returns its size in DS units. Nothing is
/// written.
///
/// # Errors
/// As [`super::wqe_ds`] for the payload.
#[inline]
pub fn ud_wqe_ds(data: &Payload<'_>, lim: &Limits) -> Result<usize, EncodeError> {
    let ds = UD_HEADER_DS + payload_ds(data, lim)?;
    if ds > MAX_DS as usize || ds_to_bbs(ds) > MAX_WQE_BBS {
        return Err(EncodeError::TooLarge { ds });
    }
    Ok(ds)
}

/// The blocks of the longest UD send these limits allow: the control and datagram
/// segments, then the longer of the inline payload and the gather list (a UD WQE has no
/// remote address, atomic or bind). A ring of `n * max_ud_wqe_bbs` blocks always holds `n`
/// sends.
pub fn max_ud_wqe_bbs(lim: &Limits) -> usize {
    let inline = if lim.max_inline == 0 {
        0
    } else {
        crate::seg::inline_ds(lim.max_inline)
    };
    ds_to_bbs(UD_HEADER_DS + inline.max(lim.max_sge)).min(MAX_WQE_BBS)
}

/// Writes the whole UD WQE into `span`; `ds` is what [`ud_wqe_ds`] returned.
///
/// # Panics
/// If `span` is shorter than the WQE (never, when sized from [`ud_wqe_ds`]).
#[inline]
pub fn encode_ud(
    send: &UdSend<'_>,
    ds: usize,
    pi: u16,
    qpn: u32,
    flags: FmCeSe,
    span: &mut Span<'_>,
) {
    let (opcode, imm) = match send.imm {
        Some(i) => (Opcode::SendImm, Be32::new(i)),
        None => (Opcode::Send, Be32::ZERO),
    };
    let ctrl = CtrlSeg::new(opcode as u8, 0, pi, qpn, ds as u8, flags.to_u8(), imm);
    span.put(0, ctrl.as_bytes());
    span.put(DS_BYTES, send.dgram.as_bytes());
    put_payload(span, UD_HEADER_DS * DS_BYTES, &send.data);
}

/// A UD WQE read back (the software NIC's view).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct DecodedUd<'a> {
    /// QP number from the control segment.
    pub qpn: u32,
    /// Fence, completion and solicited flags.
    pub flags: FmCeSe,
    /// The send.
    pub send: UdSend<'a>,
}

/// Reads a linear copy of a UD WQE; `None` when it is not a send / send with immediate with a
/// datagram segment and a well-formed payload (the NIC answers with a local QP operation
/// error).
pub fn decode_ud<'a>(b: &'a [u8], sges: &'a mut [Sge; 64]) -> Option<DecodedUd<'a>> {
    let ctrl: CtrlSeg = read(b, 0);
    let ds = ctrl.ds() as usize;
    if ds < UD_HEADER_DS || ds * DS_BYTES > b.len() {
        return None;
    }
    let imm = match ctrl.opcode()? {
        Opcode::Send => None,
        Opcode::SendImm => Some(ctrl.imm.get()),
        _ => return None,
    };
    let flags = FmCeSe::from_u8(ctrl.fm_ce_se)?;
    let dgram: DatagramSeg = read(b, DS_BYTES);
    let data = payload(b, UD_HEADER_DS, ds, sges).ok()?;
    Some(DecodedUd {
        qpn: ctrl.qpn(),
        flags,
        send: UdSend { dgram, data, imm },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::av::{Av, AvAttr, AvLink};
    use crate::ctrl::{CompletionMode, Fence};

    fn av() -> Av {
        Av::from_attr(&AvAttr {
            link: AvLink::Ib {
                dlid: 7,
                src_path_bits: 0,
                grh: None,
            },
            sl: 3,
            static_rate: 0,
        })
    }

    #[test]
    fn round_trip_inline_and_gather_across_the_ring_end() {
        let lim = Limits {
            max_sge: 4,
            max_inline: 64,
        };
        let flags = FmCeSe {
            fence: Fence::None,
            completion: CompletionMode::Always,
            solicited: true,
        };
        let sgl = [
            Sge {
                addr: 0x1000,
                len: 9,
                lkey: 5,
            },
            Sge {
                addr: 0x2000,
                len: 3,
                lkey: 6,
            },
        ];
        for (data, imm) in [
            (Payload::Inline(b"hello, datagram"), None),
            (Payload::Sgl(&sgl), Some(0xdead_beef)),
            (Payload::Inline(&[]), None),
        ] {
            let send = UdSend {
                dgram: DatagramSeg::ud(&av(), 0x42, 0x1111),
                data,
                imm,
            };
            let ds = ud_wqe_ds(&send.data, &lim).unwrap();
            let bbs = ds_to_bbs(ds);
            // a ring of 4 blocks, the WQE starting in the last one: it wraps
            let mut ring = [0u8; 256];
            let mut span = Span::of_ring(&mut ring, 3, bbs);
            encode_ud(&send, ds, 3, 0x99, flags, &mut span);
            let mut lin = [0u8; 256];
            super::super::linearize(&ring, 3, bbs, &mut lin);
            let mut sges = [Sge::default(); 64];
            let d = decode_ud(&lin[..bbs * 64], &mut sges).unwrap();
            assert_eq!(d.qpn, 0x99);
            assert_eq!(d.flags, flags);
            assert_eq!(d.send, send);
            let ctrl: CtrlSeg = read(&lin, 0);
            assert_eq!(ctrl.ds() as usize, ds);
            assert_eq!(ctrl.pi(), 3);
        }
    }

    #[test]
    fn limits_and_bad_wqes() {
        let lim = Limits {
            max_sge: 1,
            max_inline: 8,
        };
        assert!(matches!(
            ud_wqe_ds(&Payload::Inline(&[0; 9]), &lim),
            Err(EncodeError::InlineTooLong { len: 9, max: 8 })
        ));
        assert_eq!(ud_wqe_ds(&Payload::Inline(&[0; 8]), &lim), Ok(5));
        // an RDMA write is not a UD opcode
        let mut b = [0u8; 128];
        let ctrl = CtrlSeg::new(Opcode::RdmaWrite as u8, 0, 0, 1, 5, 0, Be32::ZERO);
        b[..16].copy_from_slice(ctrl.as_bytes());
        let mut sges = [Sge::default(); 64];
        assert!(decode_ud(&b, &mut sges).is_none());
        // a send too short for the datagram segment
        let ctrl = CtrlSeg::new(Opcode::Send as u8, 0, 0, 1, 2, 0, Be32::ZERO);
        b[..16].copy_from_slice(ctrl.as_bytes());
        assert!(decode_ud(&b, &mut sges).is_none());
    }
}
