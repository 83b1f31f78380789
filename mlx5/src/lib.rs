//! # mlx5: the ConnectX hardware contract
//!
//! Byte-exact formats of what an mlx5 NIC (NVIDIA/Mellanox ConnectX-4 and later, BlueField)
//! reads and writes in host memory, with no OS calls:
//!
//! - send WQE segments ([`ctrl`], [`seg`], [`umr`], the UD/DC address vector [`av`]) and the opcodes that go in them
//!   ([`opcode`]); the DC address segment and whole DCI WQEs ([`dc`]);
//! - receive WQE entries ([`recv`]) and shared-receive-queue WQEs with their linked list
//!   ([`srq`]);
//! - completion entries: the 64-byte CQE, the error CQE, mini-CQEs ([`cqe`]) and the error
//!   syndromes with their mapping to verbs work-completion statuses ([`syndrome`]);
//! - the NIC's clock: what a CQE's timestamp holds and how it becomes nanoseconds
//!   ([`clock`]);
//! - doorbell-record slots and BlueFlame rules ([`doorbell`]);
//! - what a ConnectX takes when a QP is created, as rdma-core sizes its queues
//!   ([`qp_size`]);
//! - an encoder that writes one whole WQE for one [`Request`] into ring blocks, wrapping past
//!   the end of the ring, and a decoder that reads it back ([`wqe`]).
//!
//! Every struct and constant mirrored here is checked against rdma-core's installed
//! `infiniband/mlx5dv.h` by the `mlx5-hdrcheck` crate of this workspace.
//!
//! With the `sim` feature, the module `sim` is a software mlx5 NIC that owns rings laid out as the
//! hardware's and executes the WQEs it finds there: the way the direct data path of
//! `blueflame` is tested end to end on machines without a ConnectX.
#![cfg_attr(not(any(feature = "std", test)), no_std)]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![deny(unsafe_code)]

pub mod atomic;
pub mod av;
pub mod be;
pub mod clock;
pub mod cqe;
pub mod ctrl;
pub mod dc;
pub mod doorbell;
pub mod grh;
pub mod opcode;
pub mod qp_size;
pub mod raw;
pub mod recv;
pub mod request;
pub mod seg;
#[allow(unsafe_code)] // region bytes shared with the device: atomics through raw pointers
pub mod shared;
pub mod srq;
pub mod syndrome;
pub mod umr;
pub mod wqe;

#[cfg(feature = "sim")]
#[cfg_attr(docsrs, doc(cfg(feature = "sim")))]
#[allow(unsafe_code)] // the NIC moves bytes through raw pointers, like DMA
pub mod sim;

pub use atomic::AtomicCaps;
pub use be::{Be16, Be32, Be64};
pub use cqe::{CqeCompCaps, MiniCqeFormat};
pub use ctrl::{CompletionMode, CtrlSeg, Fence, FmCeSe};
pub use opcode::Opcode;
pub use raw::{RawCq, RawQp};
pub use request::{Access, BindMw, MaskedAtomic, Payload, Remote, Request, Sge, WqeFlags};
pub use srq::RawSrq;
pub use syndrome::{Syndrome, WcStatus};
