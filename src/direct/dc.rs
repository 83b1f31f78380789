//! DCI send WQEs on the direct path: control segment, DC address segment (the destination
//! DCT's address vector, number and key: [`mlx5::dc`]), then the request's segments, with
//! every guarantee of the RC send queue (checks before a byte is written, queue and CQ room,
//! completion moderation, the shadow table, the same doorbell and BlueFlame rules). The RC
//! post path is not touched: a DCI posts through these functions only.

use super::sq::{wc_opcode, Batch, SendQueue, Transport};
use crate::error::{Error, Result};
use crate::queue::checks::{check_atomic_kind, MASKED_ATOMICS, STANDARD_ATOMICS};
use crate::queue::flags::PostFlags;
use mlx5::dc::{dc_wqe_ds, encode_dc, DcAddr, MAX_DCTN};
use mlx5::request::{Payload, Request};

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
    /// atomic the device lacks, and on the queue of one of the crate's QPs that is not a
    /// DCI (an RC or UD QP's); [`Error::InvalidParameter`] for a
    /// DCT number past 24 bits or a message of more than 2^31 bytes; otherwise as
    /// [`SendQueue::push`].
    pub(crate) fn push_dc(
        &mut self,
        dest: &DcAddr,
        req: &Request<'_>,
        cookie: u64,
        flags: PostFlags,
    ) -> Result<()> {
        self.check_transport(Transport::Dci)?;
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
            } => {
                crate::queue::checks::message_len(sgl)?;
            }
            _ => {}
        }
        let ds = dc_wqe_ds(req, &self.limits())?;
        // Room, moderation, fence and the shadow entry as for every transport but RC's
        // inlined path (one block for UD and DC).
        self.push_encoded(ds, cookie, flags, wc_opcode(req), |span, pi, qpn, fm| {
            encode_dc(req, ds, pi, qpn, fm, dest, span);
        })
    }

    /// Posts one DCI WQE for `dest` and rings at once.
    ///
    /// # Errors
    /// As [`SendQueue::push_dc`].
    pub(crate) fn post_dc(
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
    pub(crate) fn push_dc(
        &mut self,
        dest: &DcAddr,
        req: &Request<'_>,
        cookie: u64,
        flags: PostFlags,
    ) -> Result<()> {
        self.sq.push_dc(dest, req, cookie, flags)
    }
}
