//! Dynamically connected transport (DC): the address segment a DC initiator (DCI) puts in
//! every send WQE, and whole DCI WQEs.
//!
//! A DCI has no fixed peer: each WQE names its destination, a DC target (DCT), right after
//! the control segment, in the 48-byte datagram segment (`struct mlx5_wqe_datagram_seg`,
//! which is one `struct mlx5_wqe_av`). rdma-core's `mlx5_send_wr_set_dc_addr`
//! (`providers/mlx5/qp.c`, what `mlx5dv_wr_set_dc_addr` calls) builds it by copying the
//! address handle's address vector, OR-ing `dctn | MLX5_EXTENDED_UD_AV` into `dqp_dct`, and
//! storing the DC access key big-endian in the first 8 bytes (`av.key.dc_key`). The
//! request's own segments follow (remote address, atomic, data or inline), as on RC:
//! `_common_wqe_init` and the `_mlx5_send_wr_*` builders of a DCI put them after
//! `sizeof(ctrl) + sizeof(datagram_seg)`.
//!
//! ```
//! use mlx5::dc::{DcAddr, AV_BYTES, EXTENDED_UD_AV};
//! let addr = DcAddr { av: [0; AV_BYTES], dctn: 0x1234, dc_key: 0x0102_0304_0506_0708 };
//! let seg = addr.segment();
//! assert_eq!(seg[..8], 0x0102_0304_0506_0708u64.to_be_bytes());
//! assert_eq!(seg[8..12], (0x1234 | EXTENDED_UD_AV).to_be_bytes());
//! assert_eq!(DcAddr::from_segment(&seg), Some(addr));
//! ```

use crate::ctrl::{CtrlSeg, FmCeSe, MAX_DS};
use crate::doorbell::MAX_WQE_BBS;
use crate::request::Request;
use crate::seg::DS_BYTES;
use crate::wqe::{
    decode, ds_to_bbs, encode_at, wqe_ds, DecodeError, Decoded, EncodeError, Limits, Span,
    MAX_WQE_BYTES,
};
use zerocopy::{FromBytes, IntoBytes};

/// `MLX5_EXTENDED_UD_AV` and `sizeof(struct mlx5_wqe_av)`, as [`crate::av`] has them.
pub use crate::av::{AV_BYTES, EXTENDED_UD_AV};
/// DS units of the DC address segment.
pub const ADDR_DS: usize = crate::av::DATAGRAM_SEG_DS;
/// `offsetof(struct mlx5_wqe_av, key.dc_key)`: the DC access key, 8 bytes big-endian.
pub const DC_KEY_OFFSET: usize = 0;
/// `offsetof(struct mlx5_wqe_av, dqp_dct)`: the destination DCT number (24 bits) with
/// [`EXTENDED_UD_AV`], big-endian.
pub const DQP_DCT_OFFSET: usize = 8;
/// The largest DCT number (24 bits: the rest of `dqp_dct` holds flags).
pub const MAX_DCTN: u32 = 0xff_ffff;
/// Where a DCI WQE's request segments start: after the control and address segments.
pub const BODY_OFFSET: usize = DS_BYTES + AV_BYTES;

/// The destination of one DCI WQE: the address vector of the address handle (as
/// `mlx5dv_init_obj` gives it for an `ibv_ah`, 48 bytes), the DCT number and its access key.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct DcAddr {
    /// The address handle's address vector (`struct mlx5_wqe_av`), as the AH holds it: its
    /// key is overwritten with `dc_key`, and `dqp_dct` is OR-ed with the DCT number (as
    /// rdma-core's `mlx5_send_wr_set_dc_addr` does), so it must be zero there, as an address
    /// handle's is; other bits would name another DCT.
    pub av: [u8; AV_BYTES],
    /// The DCT number (at most [`MAX_DCTN`]).
    pub dctn: u32,
    /// The DC access key the DCT was created with.
    pub dc_key: u64,
}

/// Writes the datagram segment of a DCI WQE into `seg` from plain values, exactly as
/// rdma-core's `mlx5_send_wr_set_dc_addr`: copy `av`, OR `dctn | MLX5_EXTENDED_UD_AV` into
/// `dqp_dct` (big-endian), store `dc_key` big-endian in `key.dc_key`. Bits of `dctn` past
/// 24 are dropped (they would land on the flag bits).
pub fn set_dc_addr(seg: &mut [u8; AV_BYTES], av: &[u8; AV_BYTES], dctn: u32, dc_key: u64) {
    seg.copy_from_slice(av);
    let d = DQP_DCT_OFFSET;
    let old = u32::from_be_bytes([seg[d], seg[d + 1], seg[d + 2], seg[d + 3]]);
    let dqp = old | (dctn & MAX_DCTN) | EXTENDED_UD_AV;
    seg[d..d + 4].copy_from_slice(&dqp.to_be_bytes());
    seg[DC_KEY_OFFSET..DC_KEY_OFFSET + 8].copy_from_slice(&dc_key.to_be_bytes());
}

impl DcAddr {
    /// The destination of an address handle's address vector (as `mlx5dv_init_obj` gives
    /// it, or [`Av::from_attr`](crate::av::Av::from_attr) builds it).
    pub fn from_av(av: &crate::av::Av, dctn: u32, dc_key: u64) -> DcAddr {
        let mut bytes = [0u8; AV_BYTES];
        bytes.copy_from_slice(av.as_bytes());
        DcAddr {
            av: bytes,
            dctn,
            dc_key,
        }
    }

    /// The 48-byte datagram segment of this destination ([`set_dc_addr`]).
    #[inline]
    pub fn segment(&self) -> [u8; AV_BYTES] {
        let mut seg = [0u8; AV_BYTES];
        set_dc_addr(&mut seg, &self.av, self.dctn, self.dc_key);
        seg
    }

    /// Reads a datagram segment back: None when `dqp_dct` lacks [`EXTENDED_UD_AV`] (not a
    /// segment rdma-core writes for a DCI) or `seg` is shorter than 48 bytes. The returned
    /// `av` has the key and the DCT number cleared, so `segment()` gives `seg` back.
    pub fn from_segment(seg: &[u8]) -> Option<DcAddr> {
        let seg: &[u8; AV_BYTES] = seg.get(..AV_BYTES)?.try_into().ok()?;
        let d = DQP_DCT_OFFSET;
        let dqp = u32::from_be_bytes([seg[d], seg[d + 1], seg[d + 2], seg[d + 3]]);
        if dqp & EXTENDED_UD_AV == 0 {
            return None;
        }
        let mut key = [0u8; 8];
        key.copy_from_slice(&seg[DC_KEY_OFFSET..DC_KEY_OFFSET + 8]);
        let mut av = *seg;
        av[DC_KEY_OFFSET..DC_KEY_OFFSET + 8].fill(0);
        av[d..d + 4].copy_from_slice(&(dqp & !(MAX_DCTN | EXTENDED_UD_AV)).to_be_bytes());
        Some(DcAddr {
            av,
            dctn: dqp & MAX_DCTN,
            dc_key: u64::from_be_bytes(key),
        })
    }
}

/// The size in DS of `req` posted on a DCI: its RC size plus the three DS of the address
/// segment. Nothing is written.
///
/// # Errors
/// As [`wqe_ds`]; [`EncodeError::TooLarge`] when the address segment makes the WQE exceed 63
/// DS or 16 blocks.
#[inline]
pub fn dc_wqe_ds(req: &Request<'_>, lim: &Limits) -> Result<usize, EncodeError> {
    let ds = wqe_ds(req, lim)? + ADDR_DS;
    if ds > MAX_DS as usize || ds_to_bbs(ds) > MAX_WQE_BBS {
        return Err(EncodeError::TooLarge { ds });
    }
    Ok(ds)
}

/// Blocks of the largest DCI WQE these limits allow: control, address and remote-address
/// segments and the longer payload (atomics take 5 DS at most after the control segment;
/// a DCI posts no memory-window binds), at most 16.
pub fn max_dc_wqe_bbs(lim: &Limits) -> usize {
    let inline = if lim.max_inline == 0 {
        0
    } else {
        crate::seg::inline_ds(lim.max_inline)
    };
    let ds = (2 + inline.max(lim.max_sge)).max(5) + ADDR_DS;
    ds_to_bbs(ds).min(MAX_WQE_BBS)
}

/// Writes a whole DCI WQE into `span`: control segment (the DCI's number, `ds` from
/// [`dc_wqe_ds`]), the address segment of `addr`, then `req`'s segments. Returns the blocks
/// it takes.
///
/// # Panics
/// If `span` is shorter than the WQE (never, when sized from [`dc_wqe_ds`]).
#[inline]
pub fn encode_dc(
    req: &Request<'_>,
    ds: usize,
    pi: u16,
    qpn: u32,
    flags: FmCeSe,
    addr: &DcAddr,
    span: &mut Span<'_>,
) -> usize {
    span.put(DS_BYTES, &addr.segment());
    encode_at(req, ds, pi, qpn, flags, span, BODY_OFFSET)
}

/// [`encode_dc`] into a linear buffer, sized and checked first: the WQE as plain bytes from
/// plain values (for comparing with rdma-core's provider). Returns the WQE's length in bytes
/// (`ds * 16`); the rest of `out` is left as it was.
///
/// # Errors
/// As [`dc_wqe_ds`]; [`EncodeError::TooLarge`] when `out` is shorter than the WQE's blocks.
pub fn encode_dc_bytes(
    req: &Request<'_>,
    lim: &Limits,
    pi: u16,
    qpn: u32,
    flags: FmCeSe,
    addr: &DcAddr,
    out: &mut [u8],
) -> Result<usize, EncodeError> {
    let ds = dc_wqe_ds(req, lim)?;
    let bytes = ds_to_bbs(ds) * crate::doorbell::SEND_WQE_BB;
    let Some(buf) = out.get_mut(..bytes) else {
        return Err(EncodeError::TooLarge { ds });
    };
    let mut span = Span { a: buf, b: &mut [] };
    encode_dc(req, ds, pi, qpn, flags, addr, &mut span);
    Ok(ds * DS_BYTES)
}

/// Why bytes are not a DCI WQE.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DcDecodeError {
    /// Fewer than four DS (control and address segments), or fewer bytes than the DS count.
    Short {
        /// The DS count found.
        ds: u8,
    },
    /// The address segment's `dqp_dct` lacks [`EXTENDED_UD_AV`].
    NotExtended {
        /// The `dqp_dct` word found.
        dqp_dct: u32,
    },
    /// The request after the address segment is not one this crate builds.
    Wqe(DecodeError),
}

impl core::fmt::Display for DcDecodeError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match *self {
            DcDecodeError::Short { ds } => {
                write!(f, "DCI WQE of {ds} DS: control + address segments need 4")
            }
            DcDecodeError::NotExtended { dqp_dct } => {
                write!(
                    f,
                    "DC address segment without MLX5_EXTENDED_UD_AV ({dqp_dct:#x})"
                )
            }
            DcDecodeError::Wqe(e) => write!(f, "DCI WQE: {e}"),
        }
    }
}

/// Reads a DCI WQE (linear bytes from its control segment): its destination and its request.
/// The request is decoded from `body`, where the control segment (with the address
/// segment's three DS taken off its count) and the request's segments are copied; inline
/// payload and gather lists borrow from `body` and `sges`. The returned `ds` is the whole
/// WQE's.
///
/// # Errors
/// [`DcDecodeError`].
pub fn decode_dc<'a>(
    wqe: &[u8],
    body: &'a mut [u8; MAX_WQE_BYTES],
    sges: &'a mut [crate::request::Sge; 64],
) -> Result<(DcAddr, Decoded<'a>), DcDecodeError> {
    let ctrl = CtrlSeg::read_from_prefix(wqe)
        .map(|(c, _)| c)
        .map_err(|_| DcDecodeError::Short { ds: 0 })?;
    let ds = ctrl.ds();
    let len = ds as usize * DS_BYTES;
    if (ds as usize) < 1 + ADDR_DS || wqe.len() < len || len > MAX_WQE_BYTES {
        return Err(DcDecodeError::Short { ds });
    }
    let d = DS_BYTES + DQP_DCT_OFFSET;
    let dqp_dct = u32::from_be_bytes([wqe[d], wqe[d + 1], wqe[d + 2], wqe[d + 3]]);
    let addr = DcAddr::from_segment(&wqe[DS_BYTES..BODY_OFFSET])
        .ok_or(DcDecodeError::NotExtended { dqp_dct })?;
    let mut c = ctrl;
    c.qpn_ds = crate::be::Be32::new((ctrl.qpn() << 8) | (ds as u32 - ADDR_DS as u32));
    body[..DS_BYTES].copy_from_slice(c.as_bytes());
    let rest = len - BODY_OFFSET;
    body[DS_BYTES..DS_BYTES + rest].copy_from_slice(&wqe[BODY_OFFSET..len]);
    let body: &'a [u8] = body;
    let mut dec = decode(&body[..DS_BYTES + rest], sges).map_err(DcDecodeError::Wqe)?;
    dec.ds = ds;
    Ok((addr, dec))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ctrl::{CompletionMode, Fence};
    use crate::request::{Payload, Remote, Sge};

    const LIM: Limits = Limits {
        max_sge: 4,
        max_inline: 64,
    };

    fn flags() -> FmCeSe {
        FmCeSe {
            fence: Fence::None,
            completion: CompletionMode::Always,
            solicited: false,
        }
    }

    fn addr() -> DcAddr {
        let mut av = [0u8; AV_BYTES];
        av[12] = 0x35; // stat_rate_sl
        av[14..16].copy_from_slice(&0x0007u16.to_be_bytes()); // rlid
        av[32..48].copy_from_slice(&[0xfe; 16]); // rgid
        DcAddr {
            av,
            dctn: 0xab_cdef,
            dc_key: 0x1122_3344_5566_7788,
        }
    }

    #[test]
    fn the_segment_ors_the_dct_into_the_av_and_stores_the_key() {
        let mut a = addr();
        // An AV whose dqp_dct already has bits (rdma-core ORs, it does not overwrite).
        a.av[8..12].copy_from_slice(&0x4000_0000u32.to_be_bytes());
        let seg = a.segment();
        assert_eq!(seg[0..8], 0x1122_3344_5566_7788u64.to_be_bytes());
        assert_eq!(seg[8..12], (0xc0ab_cdefu32).to_be_bytes());
        assert_eq!(seg[12..], a.av[12..]);
        // Bits past 24 of the DCT number never reach the flags.
        let mut seg2 = [0u8; AV_BYTES];
        set_dc_addr(&mut seg2, &[0; AV_BYTES], 0xff00_0001, 0);
        assert_eq!(seg2[8..12], (EXTENDED_UD_AV | 1).to_be_bytes());
    }

    #[test]
    fn the_segment_is_the_datagram_segment_of_an_address_handle() {
        // rdma-core's AHs leave dqp_dct zero: OR-ing the DCT in (mlx5_send_wr_set_dc_addr)
        // and storing it (DatagramSeg::dc) give the same bytes.
        let attr = crate::av::AvAttr {
            link: crate::av::AvLink::Ib {
                dlid: 7,
                src_path_bits: 0,
                grh: None,
            },
            sl: 3,
            static_rate: 0,
        };
        let av = crate::av::Av::from_attr(&attr);
        let a = DcAddr::from_av(&av, 0x1234, 0xdead_beef);
        let seg = crate::av::DatagramSeg::dc(&av, 0x1234, 0xdead_beef);
        assert_eq!(a.segment()[..], *seg.as_bytes());
    }

    #[test]
    fn a_segment_without_the_extended_bit_is_not_a_dc_address() {
        let mut seg = addr().segment();
        seg[8] &= 0x7f;
        assert_eq!(DcAddr::from_segment(&seg), None);
        assert_eq!(DcAddr::from_segment(&seg[..47]), None);
    }

    #[test]
    fn every_dci_request_round_trips() {
        let sg = [Sge {
            addr: 0x1000,
            len: 64,
            lkey: 0x55,
        }];
        let remote = Remote {
            addr: 0x2000,
            rkey: 0x66,
        };
        let reply = Sge { len: 8, ..sg[0] };
        let reqs = [
            Request::Write {
                remote,
                data: Payload::Sgl(&sg),
            },
            Request::Write {
                remote,
                data: Payload::Inline(b"0123456789abcdef0123"),
            },
            Request::WriteImm {
                remote,
                data: Payload::Inline(b"x"),
                imm: 7,
            },
            Request::Read { remote, sgl: &sg },
            Request::Send {
                data: Payload::Sgl(&sg),
            },
            Request::SendImm {
                data: Payload::Inline(b"hello"),
                imm: 9,
            },
            Request::CompareSwap {
                remote,
                compare: 1,
                swap: 2,
                local: reply,
            },
            Request::FetchAdd {
                remote,
                add: 3,
                local: reply,
            },
        ];
        let a = addr();
        for req in reqs {
            let mut out = [0u8; MAX_WQE_BYTES];
            let n = encode_dc_bytes(&req, &LIM, 0x1234, 0x4321, flags(), &a, &mut out).unwrap();
            let ds = dc_wqe_ds(&req, &LIM).unwrap();
            assert_eq!(n, ds * 16);
            assert_eq!(ds, wqe_ds(&req, &LIM).unwrap() + 3);
            assert_eq!(out[16..64], a.segment());
            let ctrl = CtrlSeg::read_from_prefix(&out[..]).unwrap().0;
            assert_eq!(
                (ctrl.qpn(), ctrl.ds() as usize, ctrl.pi()),
                (0x4321, ds, 0x1234)
            );
            let mut body = [0u8; MAX_WQE_BYTES];
            let mut sges = [Sge::default(); 64];
            let (back, d) = decode_dc(&out[..n], &mut body, &mut sges).unwrap();
            assert_eq!(back.segment(), a.segment());
            assert_eq!((back.dctn, back.dc_key), (a.dctn, a.dc_key));
            assert_eq!(d.request, req);
            assert_eq!(d.ds as usize, ds);
            // The body is the RC WQE's, byte for byte, after the address segment.
            let mut rc = [0u8; MAX_WQE_BYTES];
            let mut span = Span {
                a: &mut rc[..],
                b: &mut [],
            };
            crate::wqe::encode(&req, ds - 3, 0x1234, 0x4321, flags(), &mut span);
            assert_eq!(out[64..n], rc[16..(ds - 3) * 16]);
        }
    }

    #[test]
    fn the_address_segment_counts_against_the_wqe_size() {
        let lim = Limits {
            max_sge: 60,
            max_inline: 1000,
        };
        // A send of 1 + 61 DS of inline data is 62 DS on RC; 3 more do not fit in 63.
        let big = [0u8; 61 * 16 - 4];
        let req = Request::Send {
            data: Payload::Inline(&big),
        };
        assert!(wqe_ds(&req, &lim).is_ok());
        assert!(matches!(
            dc_wqe_ds(&req, &lim),
            Err(EncodeError::TooLarge { .. })
        ));
        let mut out = [0u8; 64];
        let small = Request::Send {
            data: Payload::Inline(b"abc"),
        };
        let e = encode_dc_bytes(&small, &LIM, 0, 1, flags(), &addr(), &mut out);
        assert!(matches!(e, Err(EncodeError::TooLarge { ds: 5 })));
        // 64 inline bytes: 5 DS, + remote address + control + address = 10 DS, 3 blocks.
        assert_eq!(max_dc_wqe_bbs(&LIM), 3);
        assert_eq!(max_dc_wqe_bbs(&lim), 16);
    }

    #[test]
    fn short_or_non_extended_wqes_are_refused() {
        let mut out = [0u8; MAX_WQE_BYTES];
        let req = Request::Send {
            data: Payload::Inline(b"abc"),
        };
        let n = encode_dc_bytes(&req, &LIM, 0, 1, flags(), &addr(), &mut out).unwrap();
        let mut body = [0u8; MAX_WQE_BYTES];
        let mut sges = [Sge::default(); 64];
        let mut bad = out;
        bad[24] = 0; // dqp_dct's top byte: no extended bit
        assert!(matches!(
            decode_dc(&bad[..n], &mut body, &mut sges),
            Err(DcDecodeError::NotExtended { .. })
        ));
        assert!(matches!(
            decode_dc(&out[..n - 16], &mut body, &mut sges),
            Err(DcDecodeError::Short { .. })
        ));
        let mut three = out;
        three[7] = (three[7] & !0x3f) | 3;
        assert!(matches!(
            decode_dc(&three[..n], &mut body, &mut sges),
            Err(DcDecodeError::Short { ds: 3 })
        ));
    }
}
