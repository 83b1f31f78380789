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
pub(crate) mod scatter;
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

/// The most bytes one message moves (InfiniBand's 2^31; a CQE counts them in 32 bits).
pub(crate) const MAX_MESSAGE: u64 = 1 << 31;

/// The length of a read into `sgl`, refused past [`MAX_MESSAGE`] before anything is posted.
pub(crate) fn read_len(sgl: &[mlx5::request::Sge]) -> crate::Result<u32> {
    let total: u64 = sgl.iter().map(|s| s.len as u64).sum();
    if total > MAX_MESSAGE {
        return Err(crate::Error::InvalidParameter {
            what: "message length (the sum of the entries; at most 2^31 bytes)",
            value: total,
        });
    }
    Ok(total as u32)
}
