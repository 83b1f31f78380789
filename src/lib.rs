//! # blueflame
//!
//! The shortest RDMA data path on Linux. On mlx5 NICs (NVIDIA/Mellanox ConnectX) it writes
//! work-queue entries straight into the send ring, rings the doorbell through the BlueFlame
//! register and polls completions straight from the completion ring: no `ibv_post_send`, no
//! `ibv_poll_cq`, no allocation, lock or system call in between. On every other RDMA device
//! (rxe, siw, irdma, ...) the same API runs over the standard verbs calls, and with the `sim`
//! feature (on by default) over a software mlx5 NIC whose rings have the hardware's layout.
//!
//! This page is the manual of the library; [`readme`] is the project's README (install,
//! the two commands, what runs where, measured figures), shown here whole. The longer
//! guides are in the repository's `docs/` (`guide.md`, `architecture.md`, `testing.md`,
//! `benchmarks.md`).
//!
//! ## Quick start
//!
//! ```toml
//! [dependencies]
//! blueflame = "0.1"                                            # with the software NIC
//! # blueflame = { version = "0.1", default-features = false } # production: no simulator
//! ```
//!
//! Building needs rdma-core's headers and libraries (`libibverbs-dev`, `librdmacm-dev`) and
//! `clang`/`libclang-dev` with `pkg-config` (the `rdma-sys` bindings are generated at build
//! time); running on hardware needs the provider (`ibverbs-providers`). One RDMA write on the
//! software NIC, from posting to its completion:
//!
//! ```
//! # #[cfg(feature = "sim")] fn main() -> blueflame::Result<()> {
//! use blueflame::{Access, Completion, Device, PostFlags, PostSend, QpCaps, WcStatus};
//!
//! let dev = Device::sim();            // or Device::open("mlx5_0", None)?, Device::open_default()?
//! let pd = dev.alloc_pd()?;
//! let mut cq = dev.create_cq(64)?;
//! let mut qp = pd.create_qp(&cq, &cq, QpCaps::default())?;
//! let me = qp.endpoint()?;            // what a peer needs (exchange it: `connect`)
//! qp.connect(&me)?;                    // here: a loopback QP
//! let mr = pd.alloc_mr(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE)?;
//!
//! qp.write_inline(b"tick", mr.remote(64)?, 7, PostFlags::SIGNALED)?;
//! let mut done = [Completion::default(); 4];
//! assert_eq!(cq.poll_n(&mut done, 1, 1 << 32), 1);
//! assert_eq!((done[0].cookie, done[0].status), (7, WcStatus::Success));
//! let mut got = [0u8; 4];
//! mr.read(64, &mut got)?;
//! assert_eq!(&got, b"tick");
//! # Ok(()) }
//! # #[cfg(not(feature = "sim"))] fn main() {}
//! ```
//!
//! The main types, each with an example: [`Device`] (open a device, or the software NIC),
//! [`Pd`] (protection domain), [`MemoryRegion`] (registered memory and its keys), [`Cq`]
//! (completion queue and its poller), [`Qp`] (reliable-connected queue pair: RDMA write,
//! read, send, atomics, memory-window binds), [`Batch`] (many requests, one doorbell),
//! [`MemoryWindow`] (grant a peer part of a region, revoke it), [`connect`] (out-of-band
//! exchange over TCP, as perftest) and [`cm`] (librdmacm).
//!
//! ## Backends: what runs where
//!
//! | device | resources from | data path |
//! |---|---|---|
//! | mlx5 (ConnectX-4 and later, BlueField) | rdma-core, rings from `mlx5dv_init_obj` | direct: WQEs, BlueFlame, CQEs polled from the ring |
//! | rxe, siw, irdma, ... | rdma-core | verbs: `ibv_wr_*` / `ibv_start_poll` where the provider has them, else `ibv_post_send` / `ibv_poll_cq` (`BLUEFLAME_VERBS_API`) |
//! | the software NIC (feature `sim`) | `Device::sim`, `Device::sim_stepped` | direct, over rings the software NIC owns |
//!
//! [`Device::open_default`] takes the device named by `BLUEFLAME_DEVICE` (GID index from
//! `BLUEFLAME_GID_INDEX`), else the first rdma-core device, else (feature `sim`) the
//! software NIC. `BLUEFLAME_PATH=direct|verbs|auto` overrides the data path on rdma-core
//! devices (`direct` is refused on a device that is not mlx5); [`Qp::data_path`] tells which
//! one a QP runs. The API, its errors and its completions are the same on every backend;
//! [`Qp::send_depth`] is the same for the same [`QpCaps`] on mlx5 and the software NIC,
//! and at least the same on the verbs path (the provider may round it up).
//!
//! ## Feature flags
//!
//! | feature | default | what it adds |
//! |---|---|---|
//! | `sim` | yes | the software mlx5 NIC (`mlx5/sim`): `Device::sim`, `Device::sim_stepped`, `Device::sim_with`, `Device::nic` and its `mlx5::sim::NicView` (queries, stepping, fault injection), `SimDmaBuf` (a dma-buf exporter that can move its buffer), the `UarConfig` and `OrderMode` re-exports, `Error::Sim`, and [`Device::open_default`]'s fallback when there is no RDMA device |
//! | `tokio` | no | `AsyncCq`: completions as an async stream (tokio `AsyncFd` over the completion channel's descriptor, also a `futures_core::Stream`) |
//!
//! Without `sim` (`default-features = false`) the crate carries no simulator: `mlx5` is
//! built without it, no symbol of `mlx5::sim` is linked (`cargo xtask crate` checks both), and
//! [`Device::open_default`] without an rdma-core device is [`Error::Unsupported`]. Every other
//! item is the same. The tools of the workspace (`bfperf`, `xtask`) keep the software NIC:
//! `bfperf -d sim` and the demo run on it when there is no device.
//!
//! ## Thread safety
//!
//! | type | `Send` | `Sync` | why |
//! |---|---|---|---|
//! | [`Device`], [`Pd`] | yes | yes | reference-counted handles; rdma-core's context and PD calls are thread-safe, the software NIC locks its tables |
//! | [`MemoryRegion`] | yes | yes | its bytes are read and written with relaxed atomics of one size per byte (8-byte words inside the region, single bytes at its unaligned edges: [`MemoryRegion::read`], [`MemoryRegion::write`]): threads and the NIC may race on the contents, never into undefined behaviour |
//! | [`Qp`], [`Cq`], [`Batch`], [`MemoryWindow`] | yes | no | posting, polling and binding take `&mut self`: one thread at a time per queue, which is why the hot path needs no lock. Move a QP or CQ to the thread that uses it |
//! | [`cm::CmListener`], [`cm::CmRequest`] | yes | yes | librdmacm ids: rdma-core's calls on them are thread-safe |
//!
//! Any number of QPs may be posted to from any number of threads (each QP by one at a time):
//! each direct-path QP gets a thread domain, so a BlueFlame register of its own that it rings
//! without a lock ([`DoorbellMode::Dedicated`]); when the device has none left, the QP rings a
//! shared register under that register's lock ([`DoorbellMode::SharedLocked`]), as rdma-core
//! does. A send queue and the poller of its CQ may run on different threads.
//!
//! ```
//! fn send_sync<T: Send + Sync>() {}
//! fn send<T: Send>() {}
//! send_sync::<blueflame::Device>();
//! send_sync::<blueflame::Pd>();
//! send_sync::<blueflame::MemoryRegion>();
//! send::<blueflame::Qp>();
//! send::<blueflame::Cq>();
//! send::<blueflame::MemoryWindow>();
//! ```
//! ```compile_fail
//! fn sync<T: Sync>() {}
//! sync::<blueflame::Qp>(); // post from one thread at a time: move the Qp, do not share it
//! ```
//!
//! ## Cleanup order
//!
//! Objects hold what they need (reference counts, not lifetimes, because requests carry plain
//! keys and fire-and-forget posting must stay possible), so they may be dropped in any order:
//!
//! - a [`Qp`] keeps its protection domain and its CQs alive: a [`Cq`] dropped first loses its
//!   poller at once, and the CQ itself is destroyed after the last QP on it;
//! - a [`Qp`] dropped with work in flight is destroyed at once (`ibv_destroy_qp`): its
//!   requests produce no more completions, and the entries it already left in its CQs are
//!   discarded by the poller, never reported for a later QP that gets the same number. To see
//!   every request complete, call [`Qp::set_error`] and poll until the flushed completions
//!   ([`WcStatus::WrFlushErr`]) have arrived, then drop it;
//! - a [`MemoryRegion`] dropped while a QP of its domain has work outstanding stays
//!   registered, memory included, while that work may still touch it (until it has
//!   completed, or its QP is gone); it is deregistered at the next reclaim point: a region
//!   allocated or dropped, a QP or window dropped, [`Pd::reclaim`], or the domain's end. A
//!   region a memory window is bound to stays registered until the window lets go (an
//!   unbind or rebind committed, a failed bind, a recorded invalidation, the window's drop):
//!   a bind pins it, since a ConnectX would deregister it under the window;
//! - a [`MemoryWindow`] is deallocated on drop, which invalidates its keys;
//! - the [`Pd`] and the [`Device`] go when the last object using them has gone.
//!
//! Every signaled request posted completes exactly once, flushes included, as long as its QP
//! lives.
//!
//! ## rdma-core environment variables
//!
//! rdma-core's mlx5 provider reads `MLX5_*` variables. The verbs path follows all of them
//! (rdma-core runs it); the direct path, which bypasses rdma-core's post and poll, follows
//! the ones that change what the hardware does: read when the device is opened, as rdma-core
//! reads them when it opens its context, `MLX5_SHUT_UP_BF` (8-byte doorbells only) and
//! `MLX5_POST_SEND_PREFER_BF=0` (BlueFlame only for inline WQEs); read when a QP is created,
//! `MLX5_SCATTER_TO_CQE=0` (no small receives inside the CQE) and `MLX5_QP_SIGNATURE` (set
//! when the device is opened, the device runs the verbs path; set later, an RC, UD or DC QP
//! of a direct-path device is refused with [`Error::Unsupported`]); `MLX5_CQE_SIZE` (64 or
//! 128 bytes, both polled). The full table, with what each of the others means here, is in
//! `docs/architecture.md` ("rdma-core's mlx5 environment variables"). blueflame's own
//! variables are `BLUEFLAME_DEVICE`, `BLUEFLAME_GID_INDEX` and `BLUEFLAME_PATH` (above),
//! `BLUEFLAME_VERBS_API` (`auto`, `extended` or `legacy`: which rdma-core API the verbs path
//! posts and polls with, read when a QP or CQ is created) and `BLUEFLAME_SIM_ORDER` (the
//! software NIC's reordering seed, or `strict`).
//!
//! ## Errors
//!
//! Every failure is a typed [`Error`] that names the value that was wrong; bad input never
//! panics. A request the API can know will fail (a full queue or CQ, a gather entry outside
//! its region, rights a region does not have, a QP not yet connected) is refused before
//! anything is written, rather than killing the QP. What the device reports afterwards comes
//! back as the completion's [`WcStatus`] and, for asynchronous events, as
//! [`Error::AsyncEvent`] on the next cold path of the QP or CQ concerned.
#![deny(unsafe_op_in_unsafe_fn, missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

// The README's example runs as a doc test (on the software NIC).
#[doc = include_str!("../README.md")]
#[cfg(all(doctest, feature = "sim"))]
pub struct ReadmeDoctests;

// The examples of docs/guide.md and docs/architecture.md run as doc tests too.
#[doc = include_str!("../docs/guide.md")]
#[cfg(all(doctest, feature = "sim"))]
pub struct GuideDoctests;

#[doc = include_str!("../docs/architecture.md")]
#[cfg(all(doctest, feature = "sim"))]
pub struct ArchitectureDoctests;

/// The project's README, the user's manual (its example runs as a doc test with the `sim`
/// feature; the longer manual is in `docs/`).
///
/// ---
///
#[doc = include_str!("../README.md")]
#[cfg(not(doctest))]
pub mod readme {}

mod address;
#[cfg(feature = "tokio")]
mod async_cq;
mod async_event;
mod backend;
mod caps;
mod clock;
pub mod cm;
mod completion;
pub mod connect;
mod data_path;
mod direct;
mod dv;
mod error;
pub mod mapping;
mod mlx5_env;
#[cfg(test)]
mod model_cases;
mod queue;
pub mod raw;
/// What the workspace's own checks reach inside the crate (feature `internals`: not part of
/// the crate's API): the mlx5dv declarations checked against `mlx5dv.h` (`mlx5/hdrcheck`),
/// and the plain rdma-core calls `bfperf icount-verbs` counts the verbs path against.
#[cfg(feature = "internals")]
#[doc(hidden)]
pub mod internals {
    pub use crate::verbs::objects::IBV_ADVISE_MR_FLAG_FLUSH;
    pub use crate::verbs::probe::Plain;
    /// The mlx5dv declarations.
    pub mod dv {
        pub use crate::dv::ffi;
    }
    /// The direct path's poller over memory a fuzz target writes (`fuzz/`, target `cqe`).
    pub use crate::direct::harness as poll_harness;
    /// The rdma_cm private data blueflame sends and reads (`fuzz/`, target `exchange`).
    pub mod cm_private_data {
        use crate::connect::RemoteBuf;
        /// The private data of a connection request or reply offering `b`.
        pub fn encode(b: Option<RemoteBuf>) -> Vec<u8> {
            crate::cm::encode(b)
        }
        /// The buffer a peer's private data offers (None: none, or not blueflame's).
        pub fn decode(p: &[u8]) -> Option<RemoteBuf> {
            crate::cm::decode(p)
        }
    }
}
mod resources;
mod verbs;

#[cfg(feature = "tokio")]
#[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
pub use async_cq::AsyncCq;
pub use clock::{NicTime, TimestampFormat};
pub use completion::{Completion, WcOpcode, WcStatus};
pub use direct::DoorbellMode;
pub use error::{Capability, Error, QueueUnit, Refused, Result, VerbsError};
pub use mlx5::ctrl::Fence;
pub use mlx5::grh::Grh;
pub use mlx5::request::{Access, BindMw, MaskedAtomic, MwType, Payload, Remote, Request, Sge};
#[cfg(feature = "sim")]
#[cfg_attr(docsrs, doc(cfg(feature = "sim")))]
pub use mlx5::sim::{OrderMode, UarConfig};
pub use mlx5::RawSrq;
pub use mlx5::{AtomicCaps, CqeCompCaps, MiniCqeFormat, RawCq, RawQp};
pub use queue::flags::PostFlags;
#[cfg(feature = "sim")]
pub use resources::SimDmaBuf;
pub use resources::{
    AsyncEvent, Batch, CompletionChannel, Cq, CqEvent, CqOptions, DataPath, DcPeer, DcSend, Dci,
    DciBatch, Dct, Device, Endpoint, LocalSeg, MemoryRegion, MemoryWindow, Notify, Pd,
    PendingBuffer, PostSend, Qp, QpCaps, QueuePair, RawBuffer, RawParts, RegionBuffer, Spin,
};
pub use resources::{Srq, SrqCaps, MAX_IOV};
// UD (issue #15): unreliable datagram, address handles, multicast.
pub use resources::{
    AddressHandle, AhAttr, GlobalRoute, McastGroup, UdEndpoint, UdOptions, UdQp, DEFAULT_HOP_LIMIT,
    MULTICAST_QPN, QKEY_PRIVILEGED, RDMA_UDP_QKEY,
};
pub use verbs::device::{ClockCaps, OdpCaps};
pub use verbs::ex::VerbsApi;
pub use verbs::objects::Timing;
