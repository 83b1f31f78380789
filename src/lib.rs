//! # blueflame
//!
//! The shortest RDMA data path on Linux. On mlx5 NICs (NVIDIA/Mellanox ConnectX) it writes
//! work-queue entries straight into the send ring, rings the doorbell through the BlueFlame
//! register and polls completions straight from the completion ring: no `ibv_post_send`, no
//! `ibv_poll_cq`, no allocation, lock or system call in between.
//!
//! On machines without a ConnectX the same data path runs against [`mlx5::sim`], a software
//! mlx5 NIC whose rings have the hardware layout; tests, benches and the demo use it.
#![deny(unsafe_op_in_unsafe_fn, missing_docs)]

// The README's example runs as a doc test (on the software NIC).
#[doc = include_str!("../README.md")]
#[cfg(all(doctest, feature = "sim"))]
pub struct ReadmeDoctests;

#[cfg(feature = "tokio")]
mod async_cq;
pub mod cm;
pub mod completion;
pub mod connect;
pub mod direct;
pub mod dv;
pub mod error;
pub mod mapping;
pub mod mlx5_env;
pub mod resources;
pub mod verbs;

#[cfg(feature = "tokio")]
pub use async_cq::AsyncCq;
pub use completion::{Completion, WcOpcode, WcStatus};
pub use direct::{DoorbellMode, PostFlags};
pub use error::{Capability, Error, QueueUnit, Refused, Result};
pub use mlx5::ctrl::Fence;
pub use mlx5::request::{Access, BindMw, MaskedAtomic, MwType, Payload, Remote, Request, Sge};
#[cfg(feature = "sim")]
#[cfg_attr(docsrs, doc(cfg(feature = "sim")))]
pub use mlx5::sim::UarConfig;
pub use mlx5::{AtomicCaps, RawCq, RawQp};
#[cfg(feature = "sim")]
#[cfg_attr(docsrs, doc(cfg(feature = "sim")))]
pub use resources::SimNic;
pub use resources::{
    AsyncEvent, Batch, CompletionChannel, Cq, CqEvent, CqOptions, DataPath, Device, Endpoint,
    LocalSeg, MemoryRegion, MemoryWindow, Notify, Pd, PendingBuffer, Qp, QpCaps, RawBuffer,
    RawParts, RegionBuffer, Spin,
};
pub use verbs::device::OdpCaps;
pub use verbs::ex::VerbsApi;
pub use verbs::objects::Timing;
