//! WQE bytes -> request.

use crate::ctrl::{CtrlSeg, FmCeSe};
use crate::opcode::{masked_atomic_size, Opcode};
use crate::request::{Access, BindMw, MaskedAtomic, MwType, Payload, Remote, Request, Sge};
use crate::seg::*;
use crate::umr::*;
use zerocopy::FromBytes;

/// A WQE read back.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Decoded<'a> {
    /// Producer index of the first block.
    pub pi: u16,
    /// QP number from the control segment.
    pub qpn: u32,
    /// Size in DS units.
    pub ds: u8,
    /// Opcode modifier.
    pub opmod: u8,
    /// Fence, completion and solicited flags.
    pub flags: FmCeSe,
    /// The request.
    pub request: Request<'a>,
}

impl Decoded<'_> {
    /// Blocks the WQE occupies.
    pub fn bbs(&self) -> usize {
        super::ds_to_bbs(self.ds as usize)
    }
}

/// Why bytes are not a WQE this crate understands (the software NIC answers with a local
/// QP operation error).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DecodeError {
    /// Unknown or unsupported opcode.
    Opcode(u8),
    /// Reserved fence mode in `fm_ce_se`.
    FmCeSe(u8),
    /// DS count that does not fit the opcode (or zero).
    Ds {
        /// The DS count found.
        ds: u8,
        /// The opcode.
        opcode: u8,
    },
    /// Fewer bytes than the DS count says.
    Truncated {
        /// Bytes needed.
        need: usize,
        /// Bytes given.
        have: usize,
    },
    /// An inline segment whose length runs past the WQE, or a pointer segment where inline
    /// was required.
    Inline {
        /// Byte count field found.
        byte_count: u32,
    },
    /// An opcode modifier that the opcode does not accept.
    Opmod(u8),
    /// A UMR WQE that is not a memory-window bind/invalidate as rdma-core builds it.
    Umr,
}

impl core::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match *self {
            DecodeError::Opcode(o) => write!(f, "unknown WQE opcode {o:#04x}"),
            DecodeError::FmCeSe(v) => write!(f, "reserved fence mode in fm_ce_se {v:#04x}"),
            DecodeError::Ds { ds, opcode } => {
                write!(f, "DS count {ds} is wrong for opcode {opcode:#04x}")
            }
            DecodeError::Truncated { need, have } => {
                write!(f, "WQE needs {need} bytes, {have} given")
            }
            DecodeError::Inline { byte_count } => {
                write!(f, "bad inline segment (byte_count {byte_count:#x})")
            }
            DecodeError::Opmod(m) => write!(f, "opcode modifier {m:#04x} not valid here"),
            DecodeError::Umr => f.write_str("UMR WQE is not a memory-window bind or invalidate"),
        }
    }
}

pub(super) fn read<T: FromBytes + zerocopy::KnownLayout + zerocopy::Immutable>(
    b: &[u8],
    off: usize,
) -> T {
    T::read_from_prefix(&b[off..])
        .map(|(t, _)| t)
        .unwrap_or_else(|_| T::new_zeroed())
}

fn remote(b: &[u8], off: usize) -> Remote {
    let r: RaddrSeg = read(b, off);
    Remote {
        addr: r.raddr.get(),
        rkey: r.rkey.get(),
    }
}

fn sge(b: &[u8], off: usize) -> Sge {
    let d: DataSeg = read(b, off);
    Sge {
        addr: d.addr.get(),
        len: d.byte_count.get(),
        lkey: d.lkey.get(),
    }
}

/// Reads the payload in DS units `from .. ds`: one inline segment or a list of data segments.
pub(super) fn payload<'a>(
    b: &'a [u8],
    from: usize,
    ds: usize,
    sges: &'a mut [Sge],
) -> Result<Payload<'a>, DecodeError> {
    if from == ds {
        return Ok(Payload::Inline(&[]));
    }
    let hdr: InlineHeader = read(b, from * DS_BYTES);
    let bc = hdr.byte_count.get();
    if bc & INLINE_SEG != 0 {
        let len = (bc & !INLINE_SEG) as usize;
        if from + inline_ds(len) != ds {
            return Err(DecodeError::Inline { byte_count: bc });
        }
        let start = from * DS_BYTES + INLINE_HEADER_BYTES;
        return Ok(Payload::Inline(&b[start..start + len]));
    }
    Ok(Payload::Sgl(sgl(b, from, ds, sges)?))
}

fn sgl<'a>(
    b: &[u8],
    from: usize,
    ds: usize,
    sges: &'a mut [Sge],
) -> Result<&'a [Sge], DecodeError> {
    let n = ds - from;
    for (i, out) in sges[..n].iter_mut().enumerate() {
        let s = sge(b, (from + i) * DS_BYTES);
        if s.len & INLINE_SEG != 0 {
            return Err(DecodeError::Inline { byte_count: s.len });
        }
        *out = s;
    }
    Ok(&sges[..n])
}

fn umr(b: &[u8], ds: usize, imm: u32, qpn: u32) -> Result<Request<'static>, DecodeError> {
    if ds != 8 && ds != 12 {
        return Err(DecodeError::Umr);
    }
    let ctrl: UmrCtrlSeg = read(b, DS_BYTES);
    let mkey: MkeyContextSeg = read(b, 4 * DS_BYTES);
    let mask = ctrl.mkey_mask.get();
    if ctrl.flags & UMR_CTRL_FLAG_INLINE == 0 || mask & (MKEY_MASK_FREE | MKEY_MASK_MKEY) == 0 {
        return Err(DecodeError::Umr);
    }
    let type2 = mask & MKEY_MASK_QPN != 0;
    let mw_type = if type2 { MwType::Two } else { MwType::One };
    let qpn_mkey = mkey.qpn_mkey.get();
    let variant = qpn_mkey & 0xff;
    if ds == 8 {
        // Unbind or invalidate: the key is freed.
        if mkey.free & MKEY_CONTEXT_FREE == 0 || qpn_mkey & !0xff != 0xffff_ff00 {
            return Err(DecodeError::Umr);
        }
        if type2 && ctrl.flags & UMR_CTRL_FLAG_CHECK_QPN != 0 && variant == 0 {
            return Ok(Request::LocalInvalidate { rkey: imm });
        }
        return Ok(Request::BindMw(BindMw {
            mw_rkey: imm,
            new_rkey: (imm & !0xff) | variant,
            mw_type,
            mr_lkey: 0,
            addr: 0,
            len: 0,
            access: Access::NONE,
        }));
    }
    if mkey.free & MKEY_CONTEXT_FREE != 0 || (type2 && qpn_mkey >> 8 != qpn) {
        return Err(DecodeError::Umr);
    }
    let klm: KlmSeg = read(b, 8 * DS_BYTES);
    let af = mkey.access_flags;
    let mut access = Access::NONE;
    for (bit, a) in [
        (MKEY_ACCESS_LOCAL_WRITE, Access::LOCAL_WRITE),
        (MKEY_ACCESS_REMOTE_WRITE, Access::REMOTE_WRITE),
        (MKEY_ACCESS_REMOTE_READ, Access::REMOTE_READ),
        (MKEY_ACCESS_ATOMIC, Access::REMOTE_ATOMIC),
    ] {
        if af & bit != 0 {
            access = access | a;
        }
    }
    let addr = klm.address.get();
    if mkey.start_addr.get() == 0 && addr != 0 {
        access = access | Access::ZERO_BASED;
    }
    Ok(Request::BindMw(BindMw {
        mw_rkey: imm,
        new_rkey: (imm & !0xff) | variant,
        mw_type,
        mr_lkey: klm.mkey.get(),
        addr,
        len: mkey.len.get(),
        access,
    }))
}

/// Reads one WQE from its linear bytes (`wqe` starts at its control segment; a WQE that
/// wrapped the ring must be copied out first, e.g. with [`linearize`](super::linearize)).
/// Gather/scatter entries are stored in `sges`, inline payload is borrowed from `wqe`.
///
/// # Errors
/// [`DecodeError`] for bytes that are not a WQE this crate builds.
pub fn decode<'a>(wqe: &'a [u8], sges: &'a mut [Sge; 64]) -> Result<Decoded<'a>, DecodeError> {
    let ctrl: CtrlSeg = read(wqe, 0);
    let ds = ctrl.ds() as usize;
    let op = ctrl.opcode_raw();
    let need = ds * DS_BYTES;
    if wqe.len() < need.max(DS_BYTES) {
        return Err(DecodeError::Truncated {
            need: need.max(DS_BYTES),
            have: wqe.len(),
        });
    }
    let bad_ds = DecodeError::Ds {
        ds: ds as u8,
        opcode: op,
    };
    if ds == 0 {
        return Err(bad_ds);
    }
    let flags = FmCeSe::from_u8(ctrl.fm_ce_se).ok_or(DecodeError::FmCeSe(ctrl.fm_ce_se))?;
    let opcode = ctrl.opcode().ok_or(DecodeError::Opcode(op))?;
    let imm = ctrl.imm.get();
    let opmod = ctrl.opmod();
    if opmod != 0 && !matches!(opcode, Opcode::AtomicMaskedCs | Opcode::AtomicMaskedFa) {
        return Err(DecodeError::Opmod(opmod));
    }
    let b = &wqe[..need];
    let atomic_local = |b: &[u8], off: usize, size: u32| -> Result<Sge, DecodeError> {
        let l = sge(b, off);
        if l.len != size {
            return Err(DecodeError::Ds {
                ds: ds as u8,
                opcode: op,
            });
        }
        Ok(l)
    };
    let request = match opcode {
        Opcode::Nop => {
            if ds != 1 {
                return Err(bad_ds);
            }
            Request::Nop
        }
        Opcode::RdmaWrite | Opcode::RdmaWriteImm => {
            if ds < 2 {
                return Err(bad_ds);
            }
            let remote = remote(b, DS_BYTES);
            let data = payload(b, 2, ds, sges)?;
            if opcode == Opcode::RdmaWrite {
                Request::Write { remote, data }
            } else {
                Request::WriteImm { remote, data, imm }
            }
        }
        Opcode::RdmaRead => {
            if ds < 2 {
                return Err(bad_ds);
            }
            Request::Read {
                remote: remote(b, DS_BYTES),
                sgl: sgl(b, 2, ds, sges)?,
            }
        }
        Opcode::Send => Request::Send {
            data: payload(b, 1, ds, sges)?,
        },
        Opcode::SendImm => Request::SendImm {
            data: payload(b, 1, ds, sges)?,
            imm,
        },
        Opcode::SendInval => Request::SendInv {
            data: payload(b, 1, ds, sges)?,
            rkey: imm,
        },
        Opcode::AtomicCs | Opcode::AtomicFa => {
            if ds != 4 {
                return Err(bad_ds);
            }
            let remote = remote(b, DS_BYTES);
            let a: AtomicSeg = read(b, 2 * DS_BYTES);
            let local = atomic_local(b, 3 * DS_BYTES, 8)?;
            if opcode == Opcode::AtomicCs {
                Request::CompareSwap {
                    remote,
                    compare: a.compare.get(),
                    swap: a.swap_add.get(),
                    local,
                }
            } else {
                Request::FetchAdd {
                    remote,
                    add: a.swap_add.get(),
                    local,
                }
            }
        }
        Opcode::AtomicMaskedCs | Opcode::AtomicMaskedFa => {
            let size = masked_atomic_size(opmod).ok_or(DecodeError::Opmod(opmod))?;
            let cs = opcode == Opcode::AtomicMaskedCs;
            let want = if cs && size == 8 { 5 } else { 4 };
            if ds != want {
                return Err(bad_ds);
            }
            let remote = remote(b, DS_BYTES);
            let o = 2 * DS_BYTES;
            let op = match (cs, size) {
                (true, 4) => {
                    let s: MaskedCs32Seg = read(b, o);
                    MaskedAtomic::Cs32 {
                        swap: s.swap.get(),
                        compare: s.compare.get(),
                        swap_mask: s.swap_mask.get(),
                        compare_mask: s.compare_mask.get(),
                    }
                }
                (false, 4) => {
                    let s: MaskedFa32Seg = read(b, o);
                    MaskedAtomic::Fa32 {
                        add: s.add.get(),
                        field_boundary: s.field_boundary.get(),
                    }
                }
                (true, _) => {
                    let s: MaskedCs64Seg = read(b, o);
                    let m: MaskedCs64MaskSeg = read(b, o + DS_BYTES);
                    MaskedAtomic::Cs64 {
                        swap: s.swap.get(),
                        compare: s.compare.get(),
                        swap_mask: m.swap_mask.get(),
                        compare_mask: m.compare_mask.get(),
                    }
                }
                (false, _) => {
                    let s: MaskedFa64Seg = read(b, o);
                    MaskedAtomic::Fa64 {
                        add: s.add.get(),
                        field_boundary: s.field_boundary.get(),
                    }
                }
            };
            let local = atomic_local(b, (ds - 1) * DS_BYTES, size)?;
            Request::Masked { remote, op, local }
        }
        Opcode::Umr => umr(b, ds, imm, ctrl.qpn())?,
        Opcode::LocalInval => return Err(DecodeError::Opcode(op)),
    };
    Ok(Decoded {
        pi: ctrl.pi(),
        qpn: ctrl.qpn(),
        ds: ds as u8,
        opmod,
        flags,
        request,
    })
}
