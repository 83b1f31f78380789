//! What each request kind is, in one place (io-uring keeps each opcode in one place; here
//! each [`Request`] variant): what it completes as and with which `byte_len`, the checks
//! every path makes before posting it, whether it fences the request after it, whether a DCI
//! carries it, and the verbs opcode that posts it. The data paths ask here; they match on a
//! request only to write its own fields (the WQE through [`mlx5::wqe`], the verbs work
//! request's union).
//!
//! Adding a request kind: its variant in `mlx5/src/request.rs`, its WQE bytes in
//! `mlx5/src/wqe/encode.rs` (and `decode.rs`, which the software NIC reads them with), and
//! its answers here. The verbs path's legacy work request takes the fields of
//! [`VerbsOp`]'s kinds as they are; a kind with fields of its own adds them there.

use crate::completion::WcOpcode;
use crate::error::{Error, Result};
use crate::queue::checks::{check_atomic_kind, message_len, MASKED_ATOMICS, STANDARD_ATOMICS};
use mlx5::request::{Payload, Request};
use mlx5::AtomicCaps;

/// What `req` completes as, and the `byte_len` its completion reports: the bytes read for
/// a read, the reply's size for an atomic, 0 otherwise (a ConnectX reports no length for
/// sends and writes). Call after [`check`]: a read's entries then sum to the port's largest message (at most 2^31).
#[inline(always)]
pub(crate) fn completion(req: &Request<'_>) -> (WcOpcode, u32) {
    match req {
        Request::Nop => (WcOpcode::Nop, 0),
        Request::Write { .. } | Request::WriteImm { .. } => (WcOpcode::RdmaWrite, 0),
        Request::Read { sgl, .. } => (
            WcOpcode::RdmaRead,
            sgl.iter().fold(0u32, |t, s| t.wrapping_add(s.len)),
        ),
        Request::Send { .. } | Request::SendImm { .. } | Request::SendInv { .. } => {
            (WcOpcode::Send, 0)
        }
        Request::CompareSwap { .. } => (WcOpcode::CompSwap, 8),
        Request::FetchAdd { .. } => (WcOpcode::FetchAdd, 8),
        Request::Masked { op, .. } => (
            if op.is_cs() {
                WcOpcode::MaskedCompSwap
            } else {
                WcOpcode::MaskedFetchAdd
            },
            op.size(),
        ),
        Request::LocalInvalidate { .. } => (WcOpcode::LocalInv, 0),
        Request::BindMw(_) => (WcOpcode::BindMw, 0),
        _ => (WcOpcode::Unknown, 0),
    }
}

/// The checks every path makes before a byte of `req` is written, on a device whose atomics
/// are `atomics`: an atomic the device runs, at an address aligned to its operand, with a
/// local entry of exactly the operand's size (rdma-core's `_mlx5_post_send` order); a
/// message of at most 2^31 bytes. Window requests are checked by their own entry.
///
/// # Errors
/// [`Error::Unsupported`] (an atomic the device lacks), [`Error::Misaligned`],
/// [`Error::AtomicLength`], [`Error::InvalidParameter`] (the message's length).
#[inline(always)]
pub(crate) fn check(req: &Request<'_>, atomics: AtomicCaps, max_msg: u32) -> Result<()> {
    match req {
        Request::CompareSwap { remote, local, .. } | Request::FetchAdd { remote, local, .. } => {
            let ok = atomics.standard;
            check_atomic_kind(ok, STANDARD_ATOMICS, remote.addr, local.len, 8)
        }
        Request::Masked { remote, op, local } => {
            let ok = atomics.masked;
            check_atomic_kind(ok, MASKED_ATOMICS, remote.addr, local.len, op.size())
        }
        Request::Read { sgl, .. }
        | Request::Write {
            data: Payload::Sgl(sgl),
            ..
        }
        | Request::WriteImm {
            data: Payload::Sgl(sgl),
            ..
        }
        | Request::Send {
            data: Payload::Sgl(sgl),
        }
        | Request::SendImm {
            data: Payload::Sgl(sgl),
            ..
        }
        | Request::SendInv {
            data: Payload::Sgl(sgl),
            ..
        } => message_len(sgl, max_msg).map(drop),
        _ => Ok(()),
    }
}

/// Whether `req` orders the request after it (the initiator small fence): a bind or local
/// invalidate changes a key that later requests may use, and a ConnectX runs the next
/// request only once it is done (rdma-core's `mlx5_bind_mw` and `IBV_WR_LOCAL_INV` set
/// `MLX5_WQE_CTRL_INITIATOR_SMALL_FENCE` on what follows).
#[inline(always)]
pub(crate) fn fences_next(req: &Request<'_>) -> bool {
    matches!(req, Request::BindMw(_) | Request::LocalInvalidate { .. })
}

/// Whether a DCI carries `req`: RDMA write (with immediate), read, send (with immediate),
/// atomics. Not memory-window binds and local invalidates (a window bound through a DCI has
/// no connection to check against), sends with invalidate (a DCT has no window bound
/// through it), nor NOPs.
#[inline(always)]
pub(crate) fn on_dc(req: &Request<'_>) -> bool {
    matches!(
        req,
        Request::Write { .. }
            | Request::WriteImm { .. }
            | Request::Read { .. }
            | Request::Send { .. }
            | Request::SendImm { .. }
            | Request::CompareSwap { .. }
            | Request::FetchAdd { .. }
            | Request::Masked { .. }
    )
}

/// The verbs work-request opcodes (`enum ibv_wr_opcode`) the verbs path posts requests with.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum VerbsOp {
    /// `IBV_WR_RDMA_WRITE`.
    RdmaWrite,
    /// `IBV_WR_RDMA_WRITE_WITH_IMM`.
    RdmaWriteImm,
    /// `IBV_WR_RDMA_READ`.
    RdmaRead,
    /// `IBV_WR_SEND`.
    Send,
    /// `IBV_WR_SEND_WITH_IMM`.
    SendImm,
    /// `IBV_WR_SEND_WITH_INV`.
    SendInv,
    /// `IBV_WR_ATOMIC_CMP_AND_SWP`.
    CompSwap,
    /// `IBV_WR_ATOMIC_FETCH_AND_ADD`.
    FetchAdd,
    /// `IBV_WR_LOCAL_INV`.
    LocalInv,
}

/// The verbs opcode that posts `req`; None where the verbs path does not carry it (masked
/// atomics: `ibv_send_wr` has no masked opcode; NOPs; binds, which go through
/// `ibv_bind_mw` / `ibv_wr_bind_mw`).
#[inline(always)]
pub(crate) fn verbs_op(req: &Request<'_>) -> Option<VerbsOp> {
    Some(match req {
        Request::Write { .. } => VerbsOp::RdmaWrite,
        Request::WriteImm { .. } => VerbsOp::RdmaWriteImm,
        Request::Read { .. } => VerbsOp::RdmaRead,
        Request::Send { .. } => VerbsOp::Send,
        Request::SendImm { .. } => VerbsOp::SendImm,
        Request::SendInv { .. } => VerbsOp::SendInv,
        Request::CompareSwap { .. } => VerbsOp::CompSwap,
        Request::FetchAdd { .. } => VerbsOp::FetchAdd,
        Request::LocalInvalidate { .. } => VerbsOp::LocalInv,
        _ => return None,
    })
}

/// The refusal of a request the verbs path does not carry.
#[cold]
pub(crate) fn not_on_verbs() -> Error {
    Error::Unsupported(
        "this request on the verbs path (masked atomics, NOP; bind windows with Qp::bind_mw)",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlx5::request::{Remote, Sge};

    /// Every kind the verbs path carries completes as the opcode its verbs opcode reports
    /// (`ibv_wc_opcode` of an `ibv_wr_opcode`), and a DCI carries no window request.
    #[test]
    fn each_kind_answers_once_and_agrees_with_itself() {
        let remote = Remote { addr: 8, rkey: 1 };
        let local = Sge {
            addr: 0,
            len: 8,
            lkey: 2,
        };
        let data = Payload::Inline(b"x");
        let sgl = [local];
        let reqs = [
            Request::Write { remote, data },
            Request::WriteImm {
                remote,
                data,
                imm: 1,
            },
            Request::Read { remote, sgl: &sgl },
            Request::Send { data },
            Request::SendImm { data, imm: 1 },
            Request::SendInv { data, rkey: 3 },
            Request::CompareSwap {
                remote,
                compare: 1,
                swap: 2,
                local,
            },
            Request::FetchAdd {
                remote,
                add: 1,
                local,
            },
            Request::LocalInvalidate { rkey: 3 },
            Request::Nop,
        ];
        for r in &reqs {
            let (wc, len) = completion(r);
            let want = match verbs_op(r) {
                Some(VerbsOp::RdmaWrite | VerbsOp::RdmaWriteImm) => WcOpcode::RdmaWrite,
                Some(VerbsOp::RdmaRead) => WcOpcode::RdmaRead,
                Some(VerbsOp::Send | VerbsOp::SendImm | VerbsOp::SendInv) => WcOpcode::Send,
                Some(VerbsOp::CompSwap) => WcOpcode::CompSwap,
                Some(VerbsOp::FetchAdd) => WcOpcode::FetchAdd,
                Some(VerbsOp::LocalInv) => WcOpcode::LocalInv,
                None => WcOpcode::Nop,
            };
            assert_eq!(wc, want, "{r:?}");
            let reads = matches!(r, Request::Read { .. });
            let atomic = matches!(r, Request::CompareSwap { .. } | Request::FetchAdd { .. });
            assert_eq!(len, if reads || atomic { 8 } else { 0 }, "{r:?}");
            assert_eq!(fences_next(r), matches!(r, Request::LocalInvalidate { .. }));
            let dc = !matches!(
                r,
                Request::SendInv { .. } | Request::LocalInvalidate { .. } | Request::Nop
            );
            assert_eq!(on_dc(r), dc, "{r:?}");
        }
    }

    /// The checks refuse what a ConnectX would fail, before posting.
    #[test]
    fn the_checks_refuse_what_the_device_would_fail() {
        let remote = Remote { addr: 4, rkey: 1 };
        let local = Sge {
            addr: 0,
            len: 8,
            lkey: 2,
        };
        let fa = Request::FetchAdd {
            remote,
            add: 1,
            local,
        };
        let all = AtomicCaps::CONNECTX;
        let most = crate::queue::checks::MAX_MESSAGE;
        assert!(matches!(
            check(&fa, all, most),
            Err(Error::Misaligned { .. })
        ));
        assert!(matches!(
            check(&fa, AtomicCaps::NONE, most),
            Err(Error::Unsupported(_))
        ));
        let big = [Sge {
            addr: 0,
            len: 1 << 31,
            lkey: 2,
        }; 2];
        let read = Request::Read { remote, sgl: &big };
        assert!(matches!(
            check(&read, all, most),
            Err(Error::InvalidParameter { value, .. }) if value == 1 << 32
        ));
        // The port's largest message, not InfiniBand's, where it is smaller.
        let one = [Sge {
            addr: 0,
            len: (1 << 30) + 1,
            lkey: 2,
        }];
        let read = Request::Read { remote, sgl: &one };
        assert!(check(&read, all, most).is_ok());
        assert!(matches!(
            check(&read, all, 1 << 30),
            Err(Error::InvalidParameter { value, .. }) if value == (1 << 30) + 1
        ));
    }
}
