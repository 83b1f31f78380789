//! A software mlx5 NIC.
//!
//! It owns CQs and QPs whose rings have exactly the hardware layout, hands them out as
//! [`RawQp`](crate::raw::RawQp) / [`RawCq`](crate::raw::RawCq), and plays the device: once a QP's
//! doorbell record moves it reads the WQEs from the send ring, checks keys, bounds, rights and
//! protection domains against its tables, moves the bytes between registered regions, runs
//! atomics and memory-window binds, and writes CQEs (owner bits, byte counts, immediates, WQE
//! counters, error syndromes).
//! A failed WQE moves its QP to error and every later WQE and receive is flushed.
//!
//! It is as permissive as the InfiniBand ordering rules and as slow as the transport
//! timers, not kinder: by default ([`OrderMode::Relaxed`], seed 0) an RDMA read or atomic may
//! read its data after later unfenced writes and sends of its QP have landed, and a bind or
//! local invalidate may take effect after later requests without the initiator small fence
//! (completions still in order; [`OrderMode::Strict`] runs everything in order); a request
//! the responder never answers is sent again after each local ACK timeout until its retry
//! count runs out, and an RNR NAK costs the responder's RNR timer ([`QpTiming`],
//! [`Nic::set_timing`]). Time is virtual ([`NicView::now_ns`]): in stepped mode it jumps to the
//! next timer when a pass finds nothing to do; in thread mode it follows the wall clock
//! times [`NicView::set_time_scale`].
//!
//! Each NIC is one InfiniBand port of a fabric with an address of its own
//! ([`NicView::port_attr`]): a unicast LID no other NIC of the process holds and the GID
//! [`port_gid`] of it. An RC QP is connected by the path a driver programs at RTR and RTS
//! ([`RcPath`], [`Nic::connect`]), and reaches only what it names: its requests go to the
//! LID of the path, and a LID not this NIC's (another NIC's, or no one's) reaches no QP, since
//! a NIC runs only its own; a responder takes a requester's packets only when the PSN it was
//! told to expect (`rq_psn`) is the requester's first send PSN (`sq_psn`). The PSN model is
//! kept simple but strict: the sequence is not followed packet by packet; a pair whose first
//! PSNs disagree never exchanges a packet (a ConnectX drops or NAKs every one as out of
//! sequence). Both end, as an unanswered request, in
//! [`Syndrome::TransportRetryExc`](crate::syndrome::Syndrome::TransportRetryExc) once the
//! requester's retries are spent.
//!
//! Two ways to run it:
//! - [`NicView::process`]: one synchronous pass over every QP (deterministic tests). In this mode
//!   the NIC also checks each ring's doorbell in the BlueFlame register: the 8-byte doorbell or
//!   the BlueFlame copy must match the WQE in the ring ([`QpStats`]).
//! - [`Nic::start`]: a thread that watches the doorbell records, as hardware does (latency
//!   runs). BlueFlame contents are not compared in this mode: the driver writes the record
//!   before the register, and only the synchronous mode sees both complete.
//!
//! ```
//! use mlx5::sim::{Nic, QpCaps, RcPath};
//! use mlx5::request::Access;
//! let nic = Nic::new();
//! let pd = nic.alloc_pd();
//! let cq = nic.create_cq(64, 64).unwrap();
//! let qp = nic.create_qp(pd, cq.cqn, cq.cqn, QpCaps::default()).unwrap();
//! nic.init_qp(qp.qpn).unwrap();
//! // Connected to itself: its own LID and PSN (`nic.path_to(qp.qpn)` says the same).
//! let port = nic.port_attr();
//! let path = RcPath { dest_qpn: qp.qpn, dlid: port.lid, rq_psn: 7, sq_psn: 7, mtu: port.mtu };
//! nic.connect(qp.qpn, path).unwrap();
//! let mr = nic.alloc_mr(pd, 4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE).unwrap();
//! assert_eq!(mr.len, 4096);
//! assert_eq!(nic.process(), 0); // nothing posted yet
//! ```

// The files from the ground up: each imports only from its own group and the groups before
// it, never from this file.
//
// Small shared types and primitives:
mod clock;
mod dma;
mod dmabuf;
mod error;
mod event;
mod hw_clock;
mod ids;
mod mcast;
mod order;
mod progress;
mod qp_attr;

// The device's objects and tables:
mod arm;
mod cq;
mod host;
mod mem;
mod port;
mod qp;
mod srq;
mod uar;

// Everything the NIC holds, under one lock:
mod state;

// What the NIC does (methods of the state):
mod atomic;
mod dc;
mod exec;
mod fault;
mod mw;
mod recv;
mod sq;
mod ud;

// The handle and its API:
mod nic;
mod nic_clock;
mod nic_control;
mod nic_dc;
mod nic_dmabuf;
mod nic_mem;
mod nic_queues;
mod nic_run;
mod nic_ud;

pub use arm::{ArmStats, CqEventSink};
pub use clock::{ack_timeout_ns, rnr_timer_ns, QpTiming};
pub use error::SimError;
pub use event::AsyncEvent;
pub use host::{HostCq, HostQp, HostSrq};
pub use hw_clock::{ClockHook, HwClock};
pub use mem::MemoryCaps;
pub use nic::{Nic, NicView};
pub use nic_mem::MrInfo;
pub use order::OrderMode;
pub use port::{port_gid, PortAttr, DEFAULT_PORT_MTU, MAX_UNICAST_LID, PORT_MAX_MSG};
pub use qp_attr::{DctStats, QpCaps, QpState, QpStats, RcPath};
pub use srq::{SrqCaps, SrqStats};
pub use state::{Limits, DEFAULT_CQE_COMP_MAX_NUM};
pub use uar::{RegKind, RegisterCheck, UarConfig};
