//! Request -> WQE bytes.

use super::span::Span;
use super::{ds_to_bbs, DS_PER_BB};
use crate::be::{Be16, Be32, Be64};
use crate::ctrl::{CtrlSeg, FmCeSe, MAX_DS};
use crate::doorbell::MAX_WQE_BBS;
use crate::opcode::masked_atomic_opmod;
use crate::request::{Access, BindMw, MaskedAtomic, MwType, Payload, Remote, Request, Sge};
use crate::seg::*;
use crate::umr::*;
use zerocopy::IntoBytes;

/// The longest data segment: bit 31 of `byte_count` is [`INLINE_SEG`].
pub const MAX_SGE_BYTES: u32 = 0x7fff_ffff;

/// The longest message (the sum of a WQE's data segments): 2^31 bytes, InfiniBand's
/// largest. A port may take fewer: its `max_msg_sz` (the kernel's mlx5_ib reports
/// `1 << log_max_msg`, 30 on a ConnectX-6). A longer one completes with a local length
/// error. The encoder writes such WQEs all the same (the format can describe them):
/// refusing them is the driver's job.
pub const MAX_MESSAGE_BYTES: u64 = 1 << 31;

/// The limits of one send queue, as the QP was created.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Most gather/scatter entries in one WQE.
    pub max_sge: usize,
    /// Most inline bytes in one WQE.
    pub max_inline: usize,
}

/// Why a request cannot be encoded. Nothing was written.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum EncodeError {
    /// More (non-empty) entries than the QP's `max_sge`.
    TooManySge {
        /// Entries given.
        n: usize,
        /// The QP's limit.
        max: usize,
    },
    /// More inline bytes than the QP's `max_inline`.
    InlineTooLong {
        /// Bytes given.
        len: usize,
        /// The QP's limit.
        max: usize,
    },
    /// The WQE would need more than 63 DS or 16 blocks.
    TooLarge {
        /// DS units needed.
        ds: usize,
    },
    /// A gather/scatter entry of 2 GiB or more: bit 31 of a data segment's length is the
    /// inline flag, so such an entry cannot be described.
    SgeTooLong {
        /// The entry's length.
        len: u32,
    },
    /// A memory-window bind over more than 2 GiB (one KLM cannot describe it).
    BindTooLong {
        /// Requested length.
        len: u64,
    },
    /// A bind's new rkey must keep the window's index (upper 24 bits).
    BindKeyIndex {
        /// The window's current rkey.
        mw_rkey: u32,
        /// The requested new rkey.
        new_rkey: u32,
    },
}

impl core::fmt::Display for EncodeError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match *self {
            EncodeError::TooManySge { n, max } => {
                write!(f, "{n} scatter/gather entries, the QP takes at most {max}")
            }
            EncodeError::InlineTooLong { len, max } => {
                write!(f, "{len} inline bytes, the QP takes at most {max}")
            }
            EncodeError::TooLarge { ds } => {
                write!(f, "WQE of {ds} DS exceeds 63 DS / 16 blocks")
            }
            EncodeError::SgeTooLong { len } => {
                write!(
                    f,
                    "scatter/gather entry of {len:#x} bytes: at most 0x7fffffff"
                )
            }
            EncodeError::BindTooLong { len } => {
                write!(f, "memory-window bind of {len} bytes exceeds 2 GiB")
            }
            EncodeError::BindKeyIndex { mw_rkey, new_rkey } => write!(
                f,
                "new rkey {new_rkey:#x} does not keep the index of window rkey {mw_rkey:#x}"
            ),
        }
    }
}

#[inline(always)]
pub(super) fn payload_ds(p: &Payload<'_>, lim: &Limits) -> Result<usize, EncodeError> {
    match p {
        Payload::Inline(b) => {
            if b.len() > lim.max_inline {
                return Err(EncodeError::InlineTooLong {
                    len: b.len(),
                    max: lim.max_inline,
                });
            }
            Ok(if b.is_empty() { 0 } else { inline_ds(b.len()) })
        }
        Payload::Sgl(s) => sgl_ds(s, lim),
    }
}

#[inline(always)]
fn sgl_ds(s: &[Sge], lim: &Limits) -> Result<usize, EncodeError> {
    let mut n = 0;
    for e in s {
        if e.len > MAX_SGE_BYTES {
            return Err(EncodeError::SgeTooLong { len: e.len });
        }
        n += (e.len != 0) as usize;
    }
    if n > lim.max_sge {
        return Err(EncodeError::TooManySge {
            n,
            max: lim.max_sge,
        });
    }
    Ok(n)
}

/// Validates `req` against the QP's limits and returns its size in DS units (control segment
/// included). Nothing is written.
///
/// # Errors
/// [`EncodeError`] when the request does not fit the QP or the WQE format.
#[inline(always)]
pub fn wqe_ds(req: &Request<'_>, lim: &Limits) -> Result<usize, EncodeError> {
    let ds = match req {
        Request::Nop => 1,
        Request::Write { data, .. } | Request::WriteImm { data, .. } => 2 + payload_ds(data, lim)?,
        Request::Read { sgl, .. } => 2 + sgl_ds(sgl, lim)?,
        Request::Send { data } | Request::SendImm { data, .. } | Request::SendInv { data, .. } => {
            1 + payload_ds(data, lim)?
        }
        Request::CompareSwap { .. } | Request::FetchAdd { .. } => 4,
        Request::Masked { op, .. } => match op {
            MaskedAtomic::Cs64 { .. } => 5,
            _ => 4,
        },
        Request::LocalInvalidate { .. } => 8,
        Request::BindMw(b) => {
            if b.len > MAX_KLM_BYTES {
                return Err(EncodeError::BindTooLong { len: b.len });
            }
            if b.len != 0 && (b.mw_rkey ^ b.new_rkey) & !0xff != 0 {
                return Err(EncodeError::BindKeyIndex {
                    mw_rkey: b.mw_rkey,
                    new_rkey: b.new_rkey,
                });
            }
            if b.len == 0 {
                8
            } else {
                12
            }
        }
    };
    if ds > MAX_DS as usize || ds_to_bbs(ds) > MAX_WQE_BBS {
        return Err(EncodeError::TooLarge { ds });
    }
    Ok(ds)
}

/// Blocks of the largest WQE a QP with these limits may be asked to write (the encoder's
/// counterpart of rdma-core's `mlx5_calc_send_wqe`, without its transport overhead for
/// segments this encoder never writes): a ring of `n * max_wqe_bbs` blocks always holds `n`
/// requests of any kind the limits allow.
pub fn max_wqe_bbs(lim: &Limits) -> usize {
    let inline = if lim.max_inline == 0 {
        0
    } else {
        inline_ds(lim.max_inline)
    };
    // Control + remote address + the longer payload; atomics 5 DS at most; a bind 12 DS.
    let ds = (2 + inline.max(lim.max_sge)).max(12);
    ds_to_bbs(ds).min(crate::doorbell::MAX_WQE_BBS)
}

#[inline(always)]
fn raddr(r: &Remote) -> RaddrSeg {
    RaddrSeg {
        raddr: Be64::new(r.addr),
        rkey: Be32::new(r.rkey),
        reserved: Be32::ZERO,
    }
}

#[inline(always)]
fn dseg(s: &Sge) -> DataSeg {
    DataSeg {
        byte_count: Be32::new(s.len),
        lkey: Be32::new(s.lkey),
        addr: Be64::new(s.addr),
    }
}

/// Writes the gather list from byte `off`; returns the offset after it.
#[inline(always)]
fn put_sgl(span: &mut Span<'_>, mut off: usize, sgl: &[Sge]) -> usize {
    for s in sgl.iter().filter(|s| s.len != 0) {
        span.put(off, dseg(s).as_bytes());
        off += DS_BYTES;
    }
    off
}

/// Writes the payload from byte `off`; returns the offset after it.
#[inline(always)]
pub(super) fn put_payload(span: &mut Span<'_>, off: usize, p: &Payload<'_>) -> usize {
    match p {
        Payload::Sgl(s) => put_sgl(span, off, s),
        Payload::Inline([]) => off,
        Payload::Inline(b) => {
            let hdr = InlineHeader {
                byte_count: Be32::new(b.len() as u32 | INLINE_SEG),
            };
            span.put(off, hdr.as_bytes());
            span.put(off + INLINE_HEADER_BYTES, b);
            // The tail of the last DS is padding the NIC ignores (rdma-core leaves it as is).
            off + inline_ds(b.len()) * DS_BYTES
        }
    }
}

fn mkey_access(a: Access) -> u8 {
    let mut f = 0;
    if a.contains(Access::LOCAL_WRITE) {
        f |= MKEY_ACCESS_LOCAL_WRITE;
    }
    if a.contains(Access::REMOTE_WRITE) {
        f |= MKEY_ACCESS_REMOTE_WRITE;
    }
    if a.contains(Access::REMOTE_READ) {
        f |= MKEY_ACCESS_REMOTE_READ;
    }
    if a.contains(Access::REMOTE_ATOMIC) {
        f |= MKEY_ACCESS_ATOMIC;
    }
    f
}

/// The UMR segments of a bind / unbind / local invalidate, as rdma-core's `set_bind_wr`.
fn put_umr(span: &mut Span<'_>, off: usize, b: &BindMw, qpn: u32) -> usize {
    let type2 = b.mw_type == MwType::Two;
    let mut flags = UMR_CTRL_FLAG_TRANSLATION_OFFSET | UMR_CTRL_FLAG_INLINE;
    let mut mask = MKEY_MASK_FREE | MKEY_MASK_MKEY;
    if type2 {
        mask |= MKEY_MASK_QPN;
    }
    let klm_octowords;
    if b.len != 0 {
        klm_octowords = BIND_KLM_OCTOWORDS;
        if type2 {
            flags |= UMR_CTRL_FLAG_CHECK_FREE;
        }
        mask |= MKEY_MASK_LEN
            | MKEY_MASK_START_ADDR
            | MKEY_MASK_ACCESS_LOCAL_WRITE
            | MKEY_MASK_ACCESS_REMOTE_READ
            | MKEY_MASK_ACCESS_REMOTE_WRITE
            | MKEY_MASK_ACCESS_ATOMIC;
    } else {
        klm_octowords = 0;
        if type2 {
            flags |= UMR_CTRL_FLAG_CHECK_QPN;
        }
    }
    let ctrl = UmrCtrlSeg {
        flags,
        klm_octowords: Be16::new(klm_octowords),
        mkey_mask: Be64::new(mask),
        ..Default::default()
    };
    span.put(off, ctrl.as_bytes());
    let off = off + core::mem::size_of::<UmrCtrlSeg>();

    let variant = b.new_rkey & 0xff;
    let mut mkey = MkeyContextSeg {
        qpn_mkey: Be32::new(
            variant
                | if !type2 || b.len == 0 {
                    0xffff_ff00
                } else {
                    qpn << 8
                },
        ),
        ..Default::default()
    };
    if b.len != 0 {
        mkey.access_flags = mkey_access(b.access);
        let zero_based = b.access.contains(Access::ZERO_BASED);
        mkey.start_addr = Be64::new(if zero_based { 0 } else { b.addr });
        mkey.len = Be64::new(b.len);
    } else {
        mkey.free = MKEY_CONTEXT_FREE;
    }
    span.put(off, mkey.as_bytes());
    let off = off + core::mem::size_of::<MkeyContextSeg>();
    if b.len == 0 {
        return off;
    }
    let klm = KlmSeg {
        byte_count: Be32::new(b.len as u32),
        mkey: Be32::new(b.mr_lkey),
        address: Be64::new(b.addr),
    };
    span.put(off, klm.as_bytes());
    span.zero(off + 16, 48);
    off + 64
}

/// Writes the whole WQE of `req` into `span` and returns the number of blocks it takes.
///
/// `ds` must be what [`wqe_ds`] returned for `req` (the caller sizes `span` from it: at least
/// `ds_to_bbs(ds)` blocks). `pi` is the producer index of the WQE's first block (wrapping at
/// 0xffff), `qpn` the QP number, `flags` the fence/completion/solicited byte.
///
/// # Panics
/// If `span` is shorter than the WQE (never, when sized from [`wqe_ds`]).
#[inline(always)]
pub fn encode(
    req: &Request<'_>,
    ds: usize,
    pi: u16,
    qpn: u32,
    flags: FmCeSe,
    span: &mut Span<'_>,
) -> usize {
    // The segments start right after the control segment.
    encode_at(req, ds, pi, qpn, flags, span, DS_BYTES)
}

/// [`encode`] with the request's segments from byte `c` of the WQE: after the control
/// segment (16) on RC, after the control and DC address segments (64) on a DCI. The bytes
/// `16 .. c` are the caller's.
#[inline(always)]
pub(crate) fn encode_at(
    req: &Request<'_>,
    ds: usize,
    pi: u16,
    qpn: u32,
    flags: FmCeSe,
    span: &mut Span<'_>,
    c: usize,
) -> usize {
    let mut opmod = 0;
    let mut imm = Be32::ZERO;
    let end = match req {
        Request::Nop => c,
        Request::Write { remote, data } => {
            span.put(c, raddr(remote).as_bytes());
            put_payload(span, c + DS_BYTES, data)
        }
        Request::WriteImm {
            remote,
            data,
            imm: i,
        } => {
            imm = Be32::new(*i);
            span.put(c, raddr(remote).as_bytes());
            put_payload(span, c + DS_BYTES, data)
        }
        Request::Read { remote, sgl } => {
            span.put(c, raddr(remote).as_bytes());
            put_sgl(span, c + DS_BYTES, sgl)
        }
        Request::Send { data } => put_payload(span, c, data),
        Request::SendImm { data, imm: i } => {
            imm = Be32::new(*i);
            put_payload(span, c, data)
        }
        Request::SendInv { data, rkey } => {
            imm = Be32::new(*rkey);
            put_payload(span, c, data)
        }
        Request::CompareSwap {
            remote,
            compare,
            swap,
            local,
        } => {
            span.put(c, raddr(remote).as_bytes());
            let a = AtomicSeg {
                swap_add: Be64::new(*swap),
                compare: Be64::new(*compare),
            };
            span.put(c + 16, a.as_bytes());
            span.put(c + 32, dseg(&Sge { len: 8, ..*local }).as_bytes());
            c + 48
        }
        Request::FetchAdd { remote, add, local } => {
            span.put(c, raddr(remote).as_bytes());
            let a = AtomicSeg {
                swap_add: Be64::new(*add),
                compare: Be64::ZERO,
            };
            span.put(c + 16, a.as_bytes());
            span.put(c + 32, dseg(&Sge { len: 8, ..*local }).as_bytes());
            c + 48
        }
        Request::Masked { remote, op, local } => {
            opmod = masked_atomic_opmod(op.size());
            span.put(c, raddr(remote).as_bytes());
            let mut off = c + 16;
            match *op {
                MaskedAtomic::Cs32 {
                    swap,
                    compare,
                    swap_mask,
                    compare_mask,
                } => {
                    let s = MaskedCs32Seg {
                        swap: Be32::new(swap),
                        compare: Be32::new(compare),
                        swap_mask: Be32::new(swap_mask),
                        compare_mask: Be32::new(compare_mask),
                    };
                    span.put(off, s.as_bytes());
                }
                MaskedAtomic::Fa32 {
                    add,
                    field_boundary,
                } => {
                    let s = MaskedFa32Seg {
                        add: Be32::new(add),
                        field_boundary: Be32::new(field_boundary),
                        reserved: [Be32::ZERO; 2],
                    };
                    span.put(off, s.as_bytes());
                }
                MaskedAtomic::Cs64 {
                    swap,
                    compare,
                    swap_mask,
                    compare_mask,
                } => {
                    let s = MaskedCs64Seg {
                        swap: Be64::new(swap),
                        compare: Be64::new(compare),
                    };
                    span.put(off, s.as_bytes());
                    off += 16;
                    let m = MaskedCs64MaskSeg {
                        swap_mask: Be64::new(swap_mask),
                        compare_mask: Be64::new(compare_mask),
                    };
                    span.put(off, m.as_bytes());
                }
                MaskedAtomic::Fa64 {
                    add,
                    field_boundary,
                } => {
                    let s = MaskedFa64Seg {
                        add: Be64::new(add),
                        field_boundary: Be64::new(field_boundary),
                    };
                    span.put(off, s.as_bytes());
                }
            }
            off += 16;
            span.put(
                off,
                dseg(&Sge {
                    len: op.size(),
                    ..*local
                })
                .as_bytes(),
            );
            off + 16
        }
        Request::LocalInvalidate { rkey } => {
            imm = Be32::new(*rkey);
            let b = BindMw {
                mw_rkey: *rkey,
                new_rkey: 0,
                mw_type: MwType::Two,
                mr_lkey: 0,
                addr: 0,
                len: 0,
                access: Access::NONE,
            };
            put_umr(span, c, &b, qpn)
        }
        Request::BindMw(b) => {
            imm = Be32::new(b.mw_rkey);
            put_umr(span, c, b, qpn)
        }
    };
    debug_assert_eq!(end, ds * DS_BYTES, "wqe_ds and encode disagree for {req:?}");
    let ctrl = CtrlSeg::new(
        req.opcode() as u8,
        opmod,
        pi,
        qpn,
        ds as u8,
        flags.to_u8(),
        imm,
    );
    span.put(0, ctrl.as_bytes());
    // The unused tail of the last block is left as it was: the NIC reads `ds` units only.
    ds.div_ceil(DS_PER_BB)
}
