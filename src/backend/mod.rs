//! The backends, and the one place that tells them apart: the software mlx5 NIC (feature
//! `sim`) and rdma-core (an mlx5 device on the direct path through mlx5dv, any device on
//! the verbs path).
//!
//! Every object the crate's façade makes (protection domains, regions, windows, CQs, QPs,
//! SRQs, address handles, DC targets) comes from here as an opaque value of this module:
//! an enum with one variant per backend, matched only in `backend/`. Each backend lives in
//! its own files (`sim/`, `rdma/`), as virtio-drivers keeps each transport in its own file
//! and matches its `SomeTransport` in one. What differs between backends at creation
//! (thread domains, scatter-to-CQE, CQE compression, the rdma-core switches) is decided
//! there; the façade (`crate::resources`) sees only what the data paths need: raw rings for
//! the direct path, rdma-core objects for the verbs path.
//!
//! Objects of two devices never work together: the façade checks that once
//! ([`Dev::same`]), and the backends answer a pair of objects of different backends with
//! [`other_device`].

mod clock;
pub(crate) mod cq;
mod limits;
mod memory;
pub(crate) mod qp;
pub(crate) mod rdma;
#[cfg(feature = "sim")]
mod sim;
pub(crate) mod spec;
pub(crate) mod srq;

pub(crate) use cq::Cq;
pub(crate) use memory::{Mw, Pd, Reg};
pub(crate) use qp::{initial_psn, Qp, QpKind, QpSpec};
pub(crate) use rdma::RdmaDev;

/// A port's membership in a multicast group (`UdQp::join_multicast`), held for its drop,
/// which ends it.
#[derive(Debug)]
pub(crate) enum Membership {
    /// The software NIC's subnet manager record.
    #[cfg(feature = "sim")]
    Sim { _held: sim::Membership },
    /// rdma_cm's id of the join.
    Rdma { _held: rdma::Membership },
}

/// Refuses a join of `group` from `local` unless `group` is an IP multicast address of
/// `local`'s family.
///
/// # Errors
/// [`Error::InvalidParameter`] with the group's leading bits.
pub(crate) fn check_group(local: std::net::IpAddr, group: std::net::IpAddr) -> Result<()> {
    if local.is_ipv4() != group.is_ipv4() || !group.is_multicast() {
        return Err(Error::InvalidParameter {
            what:
                "multicast group (an IPv4 or IPv6 multicast address of the local address's family)",
            value: match group {
                std::net::IpAddr::V4(a) => u32::from(a) as u64,
                std::net::IpAddr::V6(a) => (u128::from(a) >> 64) as u64,
            },
        });
    }
    Ok(())
}
pub(crate) use spec::{
    ChannelSource, CqRings, CqSpec, EventSink, MrInfo, QpRings, SrqRings, Stamps,
};
pub(crate) use srq::Srq;

use crate::async_event::{AsyncEvent, Subject};
use crate::error::{Error, Result};
use std::sync::Arc;

/// Where a device's objects come from.
#[derive(Clone, Debug)]
pub(crate) enum Dev {
    /// The software mlx5 NIC.
    #[cfg(feature = "sim")]
    Sim(mlx5::sim::Nic),
    /// rdma-core: a real device (or rxe, siw).
    Rdma(Arc<RdmaDev>),
}

/// The refusal of a pair of objects of two devices (of two backends, or two instances of
/// one): the façade checks devices before it pairs objects, so the backends meet this only
/// through that check.
#[cold]
pub(crate) fn other_device(what: &'static str) -> Error {
    Error::InvalidHandle { what, value: 0 }
}

impl Dev {
    /// The software NIC `nic` as a device.
    #[cfg(feature = "sim")]
    pub(crate) fn sim(nic: mlx5::sim::Nic) -> Dev {
        Dev::Sim(nic)
    }

    /// The rdma-core device `name` on port `port`, with `gid_index` (None: the first RoCE
    /// v2 IPv4 GID of an Ethernet port).
    ///
    /// # Errors
    /// As [`RdmaDev::open`].
    pub(crate) fn open(name: &str, port: u8, gid_index: Option<i32>) -> Result<Dev> {
        Ok(Dev::Rdma(Arc::new(RdmaDev::open(name, port, gid_index)?)))
    }

    /// The device of rdma_cm's context `ctx` on `port`.
    ///
    /// # Errors
    /// As [`RdmaDev::new`].
    pub(crate) fn of_context(ctx: Arc<crate::verbs::device::Context>, port: u8) -> Result<Dev> {
        Ok(Dev::Rdma(Arc::new(RdmaDev::new(ctx, port, None)?)))
    }

    /// A short description of the device.
    pub(crate) fn describe(&self) -> String {
        match self {
            #[cfg(feature = "sim")]
            Dev::Sim(n) => sim::describe(n),
            Dev::Rdma(r) => r.describe(),
        }
    }

    /// The software NIC, if this is one.
    #[cfg(feature = "sim")]
    pub(crate) fn sim_nic(&self) -> Option<&mlx5::sim::Nic> {
        match self {
            Dev::Sim(n) => Some(n),
            Dev::Rdma(_) => None,
        }
    }

    /// rdma-core's `MLX5_*` switches for a QP created now (see [`Mlx5Env::for_qp`]); the
    /// software NIC reads them all at each creation.
    ///
    /// [`Mlx5Env::for_qp`]: crate::mlx5_env::Mlx5Env::for_qp
    pub(crate) fn qp_env(&self) -> crate::mlx5_env::Mlx5Env {
        match self {
            #[cfg(feature = "sim")]
            Dev::Sim(_) => crate::mlx5_env::Mlx5Env::current(),
            Dev::Rdma(d) => crate::mlx5_env::Mlx5Env::for_qp(&d.opened_env),
        }
    }

    /// The port this device was opened on (the software NIC has one, port 1).
    pub(crate) fn port(&self) -> u8 {
        match self {
            #[cfg(feature = "sim")]
            Dev::Sim(_) => 1,
            Dev::Rdma(d) => d.port,
        }
    }

    /// Whether `other` is this same device instance (the same software NIC, or the same
    /// rdma-core context): only then can their objects work together.
    pub(crate) fn same(&self, other: &Dev) -> bool {
        match (self, other) {
            #[cfg(feature = "sim")]
            (Dev::Sim(a), Dev::Sim(b)) => a.same(b),
            (Dev::Rdma(a), Dev::Rdma(b)) => Arc::ptr_eq(&a.ctx, &b.ctx),
            #[cfg(feature = "sim")]
            _ => false,
        }
    }

    /// The data path the device's QPs run.
    pub(crate) fn data_path(&self) -> crate::data_path::DataPath {
        match self {
            #[cfg(feature = "sim")]
            Dev::Sim(_) => crate::data_path::DataPath::Direct,
            Dev::Rdma(r) => r.path,
        }
    }

    /// Whether the device raises `IBV_EVENT_QP_LAST_WQE_REACHED` for a QP on an SRQ that
    /// went to error (a ConnectX and the software NIC do; rxe does not).
    pub(crate) fn raises_last_wqe(&self) -> bool {
        match self {
            #[cfg(feature = "sim")]
            Dev::Sim(_) => true,
            Dev::Rdma(r) => !r.attrs.rxe,
        }
    }

    /// Whether rdma-core's provider may copy small received messages into receive buffers
    /// with the CPU, checking no key (mlx5's scatter-to-CQE on the verbs path).
    pub(crate) fn provider_copies_receives(&self) -> bool {
        match self {
            #[cfg(feature = "sim")]
            Dev::Sim(_) => false,
            Dev::Rdma(r) => r.mlx5,
        }
    }

    /// The port's largest message (`max_msg_sz`, at most 2^31).
    pub(crate) fn max_message(&self) -> u32 {
        match self {
            #[cfg(feature = "sim")]
            Dev::Sim(n) => n.port_attr().max_msg,
            Dev::Rdma(r) => r.max_msg,
        }
    }

    /// What the device's atomics do and the byte order of their replies.
    pub(crate) fn atomic_caps(&self) -> mlx5::AtomicCaps {
        match self {
            #[cfg(feature = "sim")]
            Dev::Sim(n) => n.atomic_caps(),
            Dev::Rdma(r) => r.atomics,
        }
    }

    /// The device's on-demand paging.
    pub(crate) fn odp_caps(&self) -> crate::verbs::device::OdpCaps {
        match self {
            #[cfg(feature = "sim")]
            Dev::Sim(n) => sim::odp_caps(n),
            Dev::Rdma(r) => r.attrs.odp,
        }
    }

    /// What the device reports of CQE compression, where compressed CQEs can be used.
    pub(crate) fn cqe_compression_caps(&self) -> Option<mlx5::CqeCompCaps> {
        match self {
            #[cfg(feature = "sim")]
            Dev::Sim(n) => Some(n.cqe_comp_caps()),
            Dev::Rdma(r) if r.path == crate::data_path::DataPath::Direct => r.cqe_comp,
            Dev::Rdma(_) => None,
        }
    }

    /// Runs a stepped software NIC until it is idle; the work it did (0 elsewhere).
    pub(crate) fn process(&self) -> usize {
        match self {
            #[cfg(feature = "sim")]
            Dev::Sim(n) if !n.is_threaded() => n.drain(),
            _ => 0,
        }
    }

    /// Joins multicast group `group` through the connection manager from `local` (the
    /// address of this device's port): the membership (kept while it lives), the group's
    /// address and its Q_Key.
    ///
    /// # Errors
    /// [`Error::Unsupported`] on the software NIC (no connection manager, no fabric: its
    /// groups need only [`crate::UdQp::attach_mcast`]); as [`RdmaDev::join_multicast`].
    pub(crate) fn join_multicast(
        &self,
        local: std::net::IpAddr,
        group: std::net::IpAddr,
    ) -> Result<(Membership, crate::address::AhAttr, u32)> {
        match self {
            #[cfg(feature = "sim")]
            Dev::Sim(n) => sim::join_multicast(n, local, group)
                .map(|(m, ah, qkey)| (Membership::Sim { _held: m }, ah, qkey)),
            Dev::Rdma(r) => r
                .join_multicast(local, group)
                .map(|(m, ah, qkey)| (Membership::Rdma { _held: m }, ah, qkey)),
        }
    }

    /// A protection domain.
    ///
    /// # Errors
    /// [`Error::Verbs`] from `ibv_alloc_pd`.
    pub(crate) fn alloc_pd(&self) -> Result<Pd> {
        Ok(match self {
            #[cfg(feature = "sim")]
            Dev::Sim(n) => Pd::Sim(sim::Pd::new(n)),
            Dev::Rdma(r) => Pd::Rdma(rdma::Pd::new(r)?),
        })
    }

    /// Reads the device's asynchronous events without blocking, each with what it is about.
    pub(crate) fn read_events(&self, out: &mut Vec<(Subject, AsyncEvent)>) {
        match self {
            #[cfg(feature = "sim")]
            Dev::Sim(n) => sim::read_events(n, out),
            Dev::Rdma(r) => r.read_events(out),
        }
    }
}
