//! DCI send WQEs on the direct path: control segment, DC address segment (the destination
//! DCT's address vector, number and key: [`mlx5::dc`]), then the request's segments, with
//! every guarantee of the RC send queue (checks before a byte is written, queue and CQ room,
//! completion moderation, the shadow table, the same doorbell and BlueFlame rules). The RC
//! post path is not touched: a DCI posts through these functions only.

use super::sq::{check_atomic_kind, wc_opcode, Batch, SendQueue, MASKED_ATOMICS, STANDARD_ATOMICS};
use crate::error::{Error, Result};
use crate::PostFlags;
use mlx5::ctrl::{CompletionMode, Fence, FmCeSe};
use mlx5::dc::{dc_wqe_ds, encode_dc, DcAddr, MAX_DCTN};
use mlx5::doorbell::SEND_WQE_BB;
use mlx5::request::Request;
use mlx5::wqe::{ds_to_bbs, Span};

/// Whether a DCI posts this request: RDMA write (with immediate), read, send (with
/// immediate), atomics. Memory-window binds and local invalidates (a window bound through a
/// DCI has no connection to check against) and sends with invalidate (a DCT has no window
/// bound through it) are refused here, before posting; so is a NOP.
pub(crate) fn dci_request_ok(req: &Request<'_>) -> Result<()> {
    match req {
        Request::Write { .. }
        | Request::WriteImm { .. }
        | Request::Read { .. }
        | Request::Send { .. }
        | Request::SendImm { .. }
        | Request::CompareSwap { .. }
        | Request::FetchAdd { .. }
        | Request::Masked { .. } => Ok(()),
        _ => Err(Error::Unsupported(
            "on a DCI: binds, local invalidates, sends with invalidate and NOPs \
             (RDMA write, read, send and atomics only)",
        )),
    }
}

impl SendQueue {
    /// Writes one DCI WQE for `dest` without ringing (see [`SendQueue::ring`]). Checks
    /// everything first: on an error nothing is written.
    ///
    /// # Errors
    /// [`Error::Unsupported`] for a request a DCI does not post (binds, local invalidates,
    /// sends with invalidate, NOPs) or an
    /// atomic the device lacks; [`Error::InvalidParameter`] for a DCT number past 24 bits;
    /// otherwise as [`SendQueue::push`].
    pub fn push_dc(
        &mut self,
        dest: &DcAddr,
        req: &Request<'_>,
        cookie: u64,
        flags: PostFlags,
    ) -> Result<()> {
        dci_request_ok(req)?;
        if dest.dctn > MAX_DCTN {
            return Err(Error::InvalidParameter {
                what: "DCT number (24 bits)",
                value: dest.dctn as u64,
            });
        }
        let atomics = self.atomic_caps();
        match req {
            Request::CompareSwap { remote, local, .. }
            | Request::FetchAdd { remote, local, .. } => {
                check_atomic_kind(
                    atomics.standard,
                    STANDARD_ATOMICS,
                    remote.addr,
                    local.len,
                    8,
                )?;
            }
            Request::Masked { remote, op, local } => {
                let m = atomics.masked;
                check_atomic_kind(m, MASKED_ATOMICS, remote.addr, local.len, op.size())?;
            }
            Request::Read { sgl, .. } => {
                super::read_len(sgl)?;
            }
            _ => {}
        }
        let ds = dc_wqe_ds(req, &self.limits())?;
        let bbs = ds_to_bbs(ds);
        if bbs as u32 > self.limit.wrapping_sub(self.pi) as u32 {
            self.make_room(bbs as u32)?;
        }
        // Completion moderation, as on RC: a run of unsignaled WQEs longer than half the
        // ring gets one signaled (its success not reported).
        let mut report = flags.signaled;
        let signal = flags.signaled || bbs as u32 > self.credit;
        if signal {
            self.credit = self.half();
        } else {
            self.credit -= bbs as u32;
            report = false;
        }
        let fence = if flags.fence != Fence::None {
            flags.fence
        } else {
            self.next_fence
        };
        if self.next_fence != Fence::None {
            self.set_next_fence(Fence::None);
        }
        let fm = FmCeSe {
            fence,
            completion: if signal {
                CompletionMode::Always
            } else {
                CompletionMode::OnError
            },
            solicited: flags.solicited,
        };
        let pi = self.pi;
        let cnt = self.ring_blocks();
        let first = ((cnt - (pi as u32 & (cnt - 1))) as usize).min(bbs);
        // SAFETY: blocks pi .. pi + bbs are free (retired by the poller, or never used) and
        // not yet announced to the device; `a` runs from block pi to at most the ring end,
        // `b` from the ring start (`block(0)`): disjoint, inside the ring.
        let mut span = unsafe {
            Span {
                a: core::slice::from_raw_parts_mut(self.block(pi), first * SEND_WQE_BB),
                b: core::slice::from_raw_parts_mut(self.block(0), (bbs - first) * SEND_WQE_BB),
            }
        };
        encode_dc(req, ds, pi, self.qpn(), fm, dest, &mut span);
        let (opcode, byte_len) = wc_opcode(req);
        self.record(pi, cookie, bbs as u16, opcode, byte_len, report);
        self.pi = pi.wrapping_add(bbs as u16);
        self.pending += 1;
        self.last_start = pi;
        Ok(())
    }

    /// Posts one DCI WQE for `dest` and rings at once.
    ///
    /// # Errors
    /// As [`SendQueue::push_dc`].
    pub fn post_dc(
        &mut self,
        dest: &DcAddr,
        req: &Request<'_>,
        cookie: u64,
        flags: PostFlags,
    ) -> Result<()> {
        self.push_dc(dest, req, cookie, flags)?;
        self.ring();
        Ok(())
    }
}

impl Batch<'_> {
    /// Writes one more DCI WQE for `dest` into the batch (rung with the others by
    /// [`Batch::ring`]; dropped unrung, nothing is posted).
    ///
    /// # Errors
    /// As [`SendQueue::push_dc`]; the requests pushed before stay in the batch.
    pub fn push_dc(
        &mut self,
        dest: &DcAddr,
        req: &Request<'_>,
        cookie: u64,
        flags: PostFlags,
    ) -> Result<()> {
        self.sq.push_dc(dest, req, cookie, flags)
    }
}
