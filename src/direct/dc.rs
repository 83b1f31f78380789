//! DCI send WQEs on the direct path: control segment, DC address segment (the destination
//! DCT's address vector, number and key: [`mlx5::dc`]), then the request's segments, with
//! every guarantee of the RC send queue (checks before a byte is written, queue and CQ room,
//! completion moderation, the shadow table, the same doorbell and BlueFlame rules). The RC
//! post path is not touched: a DCI posts through these functions only.

use super::sq::{Batch, SendQueue, Transport};
use crate::completion::WcOpcode;
use crate::error::{Error, Result};
use crate::queue::flags::PostFlags;
use crate::queue::kind;
use crate::queue::shadow::FLUSH_MARK;
use mlx5::dc::{dc_wqe_ds, encode_dc, DcAddr, AV_BYTES, MAX_DCTN};
use mlx5::request::{Payload, Remote, Request};

/// Refuses a request a DCI does not post ([`kind::on_dc`]), before posting.
pub(crate) fn dci_request_ok(req: &Request<'_>) -> Result<()> {
    if kind::on_dc(req) {
        return Ok(());
    }
    Err(Error::Unsupported(
        "on a DCI: binds, local invalidates, sends with invalidate and NOPs \
         (RDMA write, read, send and atomics only)",
    ))
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
    /// DCT number past 24 bits or a message longer than the port's largest; otherwise as
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
        kind::check(req, self.atomic_caps(), self.max_message())?;
        let ds = dc_wqe_ds(req, &self.limits())?;
        // Room, moderation, fence and the shadow entry as for every transport but RC's
        // inlined path (one block for UD and DC).
        self.push_encoded(
            ds,
            cookie,
            flags,
            kind::completion(req),
            |span, pi, qpn, fm| {
                encode_dc(req, ds, pi, qpn, fm, dest, span);
            },
        )
    }

    /// After the DCI was moved to error ([`crate::QueuePair::set_error`]): when the last
    /// request posted was unsignaled, posts one signaled WQE behind it, whose flush retires
    /// the requests before it and is not reported ([`FLUSH_MARK`]), and rings. Unsignaled
    /// requests that ran before the modify complete with no CQE at all (a ConnectX flushes
    /// only the WQEs it has not run), so without it they held the ring for good and the
    /// DCI could never be recovered ([`crate::Dci::recover`] waits for the ring to come
    /// back). Nothing is posted when the last request was signaled (its completion, or its
    /// flush, retires the rest) or nothing is outstanding. The WQE is a zero-length write
    /// to no address: a QP in error flushes it without running it.
    ///
    /// # Errors
    /// As [`SendQueue::push_dc`] ([`Error::QueueFull`], [`Error::CqFull`]); nothing is
    /// written then.
    #[cold]
    pub(crate) fn close_unsignaled_tail(&mut self) -> Result<()> {
        // WQEs of a forgotten batch first: they are flushed like the others.
        self.ring();
        if self.free_blocks() == self.ring_blocks() || self.credit == self.half() {
            return Ok(());
        }
        let req = Request::Write {
            remote: Remote { addr: 0, rkey: 0 },
            data: Payload::Inline(&[]),
        };
        let dest = DcAddr {
            av: [0; AV_BYTES],
            dctn: 0,
            dc_key: 0,
        };
        let ds = dc_wqe_ds(&req, &self.limits())?;
        // Signaled (a request past the unsignaled run's credit is), not reported.
        let credit = core::mem::replace(&mut self.credit, 0);
        let r = self.push_encoded(
            ds,
            0,
            PostFlags::UNSIGNALED,
            (WcOpcode::Nop, FLUSH_MARK),
            |span, pi, qpn, fm| {
                encode_dc(&req, ds, pi, qpn, fm, &dest, span);
            },
        );
        if r.is_err() {
            self.credit = credit;
        }
        self.ring();
        r
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
        // A refusal rings too: WQEs of a forgotten batch (`mem::forget` is safe) would
        // otherwise never be rung, and a refusal for want of the room they hold never end.
        let r = self.push_dc(dest, req, cookie, flags);
        self.ring();
        r
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
