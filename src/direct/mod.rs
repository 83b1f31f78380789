//! The direct mlx5 data path: WQEs written into the send ring, doorbell and BlueFlame
//! writes, CQEs polled from the completion ring. No verbs call, allocation, lock or system
//! call between the user and the rings.
//!
//! Everything here is built from [`RawQp`](mlx5::RawQp) / [`RawCq`](mlx5::RawCq): it does
//! not know whether a ConnectX or the software NIC owns the memory.

mod arm;
mod barrier;
mod cq;
pub(crate) mod cq_share;
pub(crate) mod dc;
mod doorbell;
mod inline_write;
mod register;
mod rq;
pub(crate) mod shadow;
mod sq;
pub(crate) mod srq;
mod teardown;
mod ud;

pub use cq::CompletionQueue;
pub use inline_write::FAST_INLINE_MAX;
pub use register::DoorbellMode;
pub use rq::RecvQueue;
pub use sq::{Batch, PostFlags, SendQueue};
pub use srq::SrqRing;

pub(crate) use cq::{Attached, Registry};
pub(crate) use sq::{check_atomic, Transport};

/// The most bytes one message moves (InfiniBand's 2^31; a CQE counts them in 32 bits):
/// [`mlx5::wqe::MAX_MESSAGE_BYTES`].
pub(crate) const MAX_MESSAGE: u64 = mlx5::wqe::MAX_MESSAGE_BYTES;

/// The length of a message gathered from (or scattered into) `sgl`, refused past
/// [`MAX_MESSAGE`] before anything is posted, with the sum of the entries in the error (a
/// ConnectX would fail it with a local length error and move the QP to error). The lengths
/// are summed in u64, saturating: no sum overflows.
#[inline]
pub(crate) fn message_len(sgl: &[mlx5::request::Sge]) -> crate::Result<u32> {
    let total = sgl.iter().fold(0u64, |t, s| t.saturating_add(s.len as u64));
    if total > MAX_MESSAGE {
        return Err(too_long(total));
    }
    Ok(total as u32)
}

/// The refusal of a message of `total` bytes.
#[cold]
#[inline(never)]
fn too_long(total: u64) -> crate::Error {
    crate::Error::InvalidParameter {
        what: "message length (the sum of the entries; at most 2^31 bytes)",
        value: total,
    }
}
