//! The direct path's own types, for driving rings by hand: the send queue, receive queue,
//! SRQ poster and CQ poller over raw rings ([`RawQp`], [`RawCq`], [`RawSrq`]: the fields
//! `mlx5dv_init_obj` returns), as [`Qp`](crate::Qp) and [`Cq`](crate::Cq) use them.
//!
//! Their constructors are `unsafe`: the caller vouches that the rings stay alive and are
//! posted to (or polled) by nobody else, and for receives that the buffers stay valid until
//! their completions are polled. A queue made here knows nothing of the QP's transport or
//! of memory windows: it posts what it is given (a ConnectX fails a request the QP's
//! transport does not carry, and moves the QP to error).

pub use crate::direct::FAST_INLINE_MAX;
pub use crate::direct::{Batch, CompletionQueue, DoorbellMode, RecvQueue, SendQueue, SrqRing};
pub use mlx5::{RawCq, RawQp, RawSrq};
