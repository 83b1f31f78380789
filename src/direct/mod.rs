//! The direct mlx5 data path: WQEs written into the send ring, doorbell and BlueFlame
//! writes, CQEs polled from the completion ring. No verbs call, allocation, lock or system
//! call between the user and the rings.
//!
//! Everything here is built from [`RawQp`](mlx5::RawQp) / [`RawCq`](mlx5::RawCq): it does
//! not know whether a ConnectX or the software NIC owns the memory.

mod barrier;
mod cq;
mod doorbell;
mod inline_write;
mod rq;
pub(crate) mod scatter;
pub(crate) mod shadow;
mod sq;

pub use cq::CompletionQueue;
pub use inline_write::FAST_INLINE_MAX;
pub use rq::RecvQueue;
pub use sq::{Batch, PostFlags, SendQueue};

pub(crate) use cq::{Attached, Registry};
pub(crate) use sq::check_atomic;
