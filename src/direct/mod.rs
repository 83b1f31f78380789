//! The direct mlx5 data path: WQEs written into the send ring, doorbell and BlueFlame
//! writes, CQEs polled from the completion ring. No verbs call, allocation, lock or system
//! call between the user and the rings.
//!
//! Everything here is built from [`RawQp`](mlx5::RawQp) / [`RawCq`](mlx5::RawCq): it does
//! not know whether a ConnectX or the software NIC owns the memory.

mod arm;
mod barrier;
mod cq;
pub(crate) mod dc;
mod doorbell;
#[cfg(test)]
mod fast_vs_general;
mod inline_write;
mod one_block;
mod placement;
mod register;
mod rq;
mod sq;
pub(crate) mod srq;
mod ud;

#[cfg(feature = "internals")]
pub use cq::harness;
pub use cq::CompletionQueue;
pub(crate) use cq::Stamped;
pub use register::DoorbellMode;
pub use rq::RecvQueue;
pub use sq::{Batch, SendQueue, FAST_INLINE_MAX};
pub use srq::SrqRing;

pub(crate) use sq::Transport;
