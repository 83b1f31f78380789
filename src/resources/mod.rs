//! Resources: device, protection domain, memory region, completion queue, queue pair.
//!
//! They are backed by rdma-core (verbs, with the mlx5dv binding that feeds the direct path on
//! a ConnectX) or, with the `sim` feature, by the software NIC; the same types whatever the
//! backend (see the crate documentation's "Backends").
//!
//! Ownership (reference counts, see `crate::queue::lifetime`): a [`Qp`] keeps its CQs alive, so a CQ is
//! destroyed only when its poller and every QP on it are gone; a [`MemoryRegion`] dropped while
//! QPs of its protection domain have work outstanding stays registered (its memory too) until
//! that work has completed, and is deregistered at the next reclaim point (another region
//! dropped or allocated, a QP dropped, [`Pd::reclaim`], or the domain's end).

mod ah;
pub(crate) mod buffer;

pub(crate) mod channel;
mod cq;
mod cq_options;
mod dc;
pub(crate) mod device;
pub(crate) mod events;
mod iov;
mod mr;
mod mw;
mod pending;
mod post_send;
mod qp;
mod queue_pair;
#[cfg(feature = "sim")]
mod sim_device;
#[cfg(feature = "sim")]
mod sim_dmabuf;
mod spin_wait;
mod srq;
mod ud;
mod ud_verbs;

pub use crate::caps::QpCaps;
pub use crate::data_path::DataPath;
pub use crate::verbs::objects::Endpoint;
pub use ah::{AddressHandle, AhAttr, GlobalRoute, UdEndpoint, DEFAULT_HOP_LIMIT};
pub use buffer::{RawBuffer, RawParts, RegionBuffer};
pub use channel::{CompletionChannel, CqEvent, Notify};
pub use cq::Cq;
pub use cq_options::CqOptions;
pub use dc::{DcPeer, DcSend, Dci, DciBatch, Dct};
pub use device::{Device, Pd};
pub use events::AsyncEvent;
pub use iov::{LocalSeg, MAX_IOV};
pub use mr::MemoryRegion;
pub use mw::MemoryWindow;
pub use pending::PendingBuffer;
pub use post_send::PostSend;
pub use qp::{Batch, Qp};
pub use queue_pair::QueuePair;
#[cfg(feature = "sim")]
pub use sim_dmabuf::SimDmaBuf;
pub use spin_wait::Spin;
pub use srq::{Srq, SrqCaps};
pub use ud::{McastGroup, UdOptions, UdQp, MULTICAST_QPN, QKEY_PRIVILEGED, RDMA_UDP_QKEY};
