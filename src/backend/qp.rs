//! Queue pairs of each backend, every transport: RC (through `ibv_modify_qp` or rdma_cm
//! on rdma-core), UD, and DC initiators and targets (mlx5 only). A QP comes out as the
//! backend's object (state changes, multicast, destruction) and what its queues are posted
//! with: its raw rings for the direct path, rdma-core's QP for the verbs path.

use super::limits;
#[cfg(feature = "sim")]
use super::sim;
use super::spec::{QpRings, UdPort};
use super::{rdma, Cq, Pd, Srq};
use crate::caps::QpCaps;
use crate::error::Result;
use crate::mlx5_env::Mlx5Env;
use crate::verbs;
use crate::verbs::objects::{Endpoint, Timing};
use mlx5::qp_size::Transport;
use mlx5::request::Access;
use std::sync::Arc;

/// The first send PSN of QP `qpn` (a hash of its number, as perftest spreads them).
pub(crate) fn initial_psn(qpn: u32) -> u32 {
    qpn.wrapping_mul(0x9e37_79b9) >> 8
}

/// Refuses, before the QP leaves INIT, a peer's endpoint that names no address: no LID
/// on an InfiniBand port, or no GID where the path is global (RoCE, or a GID index given);
/// on every backend, the software NIC's InfiniBand port too. The kernel takes such an
/// address vector (`mlx5_set_path` writes `rlid` 0 as it is) and the QP sends to LID 0,
/// InfiniBand's reserved LID: connected, it is dead.
/// The rule is [`crate::address::check_destination`], shared with UD address handles and
/// DC peers.
pub(crate) fn check_remote_address(ethernet: bool, global: bool, remote: &Endpoint) -> Result<()> {
    crate::address::check_destination(
        ethernet,
        global,
        remote.lid,
        &remote.gid,
        "remote endpoint without an address (LID 0 on an InfiniBand port, or an empty GID \
         on a global path; a QP number alone is not enough on any device): exchange the \
         peer's Qp::endpoint (blueflame::connect)",
        u64::from(remote.qpn),
    )
}

/// What a new QP is.
pub(crate) struct QpSpec<'a> {
    pub(crate) caps: QpCaps,
    pub(crate) send_cq: &'a Cq,
    pub(crate) kind: QpKind<'a>,
    /// rdma-core's `MLX5_*` switches, read once for this QP.
    pub(crate) env: &'a Mlx5Env,
}

/// The transport of a new QP, with what it needs.
pub(crate) enum QpKind<'a> {
    /// Reliable connection; receives from its own queue on `recv_cq`, or from `srq`; created
    /// through rdma_cm on `cm` when given (connected by librdmacm).
    Rc {
        recv_cq: &'a Cq,
        srq: Option<&'a Srq>,
        cm: Option<&'a Arc<verbs::cm::CmId>>,
    },
    /// Unreliable datagram with Q_Key `qkey`, ready to send and receive once created.
    Ud {
        recv_cq: &'a Cq,
        qkey: u32,
        mcast_loopback: bool,
    },
    /// A DC initiator, ready to post once created (its RTS attributes from `timing`).
    Dci { timing: &'a Timing },
    /// A DC target receiving into `srq` on `send_cq` (its only CQ), with its key and rights.
    Dct {
        srq: &'a Srq,
        dc_key: u64,
        access: Access,
    },
}

impl QpKind<'_> {
    /// The transport of the QP, and whether it has a receive queue of its own; none for a
    /// DC target (no send queue; its receives come from its SRQ).
    pub(crate) fn shape(&self) -> Option<(Transport, bool)> {
        match self {
            QpKind::Rc { srq, .. } => Some((Transport::Rc, srq.is_none())),
            QpKind::Ud { .. } => Some((Transport::Ud, true)),
            QpKind::Dci { .. } => Some((Transport::Dci, false)),
            QpKind::Dct { .. } => None,
        }
    }
}

impl QpSpec<'_> {
    /// [`limits::connectx`] for this QP: refused as a ConnectX would refuse it, else how
    /// many send work requests to ask rdma-core for (none for a DC target).
    pub(crate) fn connectx(&self, direct: bool, signature: bool) -> Result<Option<u32>> {
        limits::connectx(&self.caps, self.kind.shape(), direct, signature)
    }
}

/// A QP of a backend: state changes and multicast, destroyed on drop (on the verbs path,
/// once its queues, which hold rdma-core's QP too, are gone).
pub(crate) enum Qp {
    #[cfg(feature = "sim")]
    Sim(sim::Qp),
    Rdma(rdma::Qp),
}

impl Pd {
    /// A QP as `spec` says: the QP, how it is posted to, and its number.
    ///
    /// # Errors
    /// [`crate::Error::NoDc`] for DC on a device without it; the device's refusal;
    /// [`crate::Error::Unsupported`] for what the backend does not do.
    pub(crate) fn create_qp(&self, spec: &QpSpec<'_>) -> Result<(Qp, QpRings, u32)> {
        match self {
            #[cfg(feature = "sim")]
            Pd::Sim(p) => {
                // The software NIC takes what a ConnectX takes, no more.
                spec.connectx(true, false)?;
                sim::create_qp(p, spec).map(|(q, r, n)| (Qp::Sim(q), r, n))
            }
            Pd::Rdma(p) => rdma::create_qp(p, spec).map(|(q, r, n)| (Qp::Rdma(q), r, n)),
        }
    }
}

impl Qp {
    /// What a peer needs to connect to QP `qpn` whose first send PSN is `psn`.
    ///
    /// # Errors
    /// [`crate::Error::Verbs`] when the port or GID cannot be queried.
    pub(crate) fn endpoint(&self, qpn: u32, psn: u32) -> Result<Endpoint> {
        match self {
            #[cfg(feature = "sim")]
            Qp::Sim(q) => Ok(q.endpoint(qpn, psn)),
            Qp::Rdma(q) => q.endpoint(qpn, psn),
        }
    }

    /// Connects the RC QP to `remote` (INIT, where it was created, -> RTR -> RTS), with
    /// first send PSN `psn` and `timing` (its RNR retries already capped by the QP's).
    ///
    /// # Errors
    /// [`crate::Error::InvalidState`] for a QP the device says is not in INIT; the
    /// device's refusal of a transition, with whether the QP was left past RTR (it then
    /// takes the peer's messages, and an SRQ's WQEs for them, though it cannot send).
    pub(crate) fn connect(
        &self,
        remote: &Endpoint,
        psn: u32,
        timing: &Timing,
    ) -> std::result::Result<(), (crate::error::Error, bool)> {
        // The same check on every backend: an endpoint without an address is refused
        // before the QP leaves INIT (connectable again).
        let (ethernet, global) = match self {
            #[cfg(feature = "sim")]
            Qp::Sim(_) => (false, false), // one InfiniBand port, local paths
            Qp::Rdma(q) => q.link().map_err(|e| (e, false))?,
        };
        check_remote_address(ethernet, global, remote).map_err(|e| (e, false))?;
        match self {
            // One step on the software NIC: refused whole, or connected.
            #[cfg(feature = "sim")]
            Qp::Sim(q) => q.connect(remote, psn, timing).map_err(|e| (e, false)),
            Qp::Rdma(q) => q.connect(remote, psn, timing),
        }
    }

    /// Moves the QP to the error state.
    ///
    /// # Errors
    /// The device's refusal.
    pub(crate) fn set_error(&self) -> Result<()> {
        match self {
            #[cfg(feature = "sim")]
            Qp::Sim(q) => q.set_error(),
            Qp::Rdma(q) => q.set_error(),
        }
    }

    /// Attaches the UD QP to the multicast group `gid` / `lid`.
    ///
    /// # Errors
    /// The device's refusal.
    pub(crate) fn attach_mcast(&self, gid: [u8; 16], lid: u16) -> Result<()> {
        match self {
            #[cfg(feature = "sim")]
            Qp::Sim(q) => q.attach_mcast(gid, lid),
            Qp::Rdma(q) => q.attach_mcast(gid, lid),
        }
    }

    /// Detaches the UD QP from the multicast group `gid` / `lid`.
    ///
    /// # Errors
    /// The device's refusal (not attached).
    pub(crate) fn detach_mcast(&self, gid: [u8; 16], lid: u16) -> Result<()> {
        match self {
            #[cfg(feature = "sim")]
            Qp::Sim(q) => q.detach_mcast(gid, lid),
            Qp::Rdma(q) => q.detach_mcast(gid, lid),
        }
    }

    /// The UD QP's port: its MTU, LID and source GID.
    ///
    /// # Errors
    /// [`crate::Error::Verbs`] when the port or GID cannot be queried.
    pub(crate) fn ud_port(&self) -> Result<UdPort> {
        match self {
            #[cfg(feature = "sim")]
            Qp::Sim(q) => Ok(q.ud_port()),
            Qp::Rdma(q) => q.ud_port(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::check_remote_address;
    use crate::verbs::objects::Endpoint;

    /// A bare QP number has no address on either link layer; a real endpoint passes.
    #[test]
    fn an_endpoint_without_an_address_is_refused() {
        let bare = Endpoint {
            qpn: 0x12,
            ..Endpoint::default()
        };
        let ib = Endpoint { lid: 7, ..bare };
        let roce = Endpoint {
            gid: [1; 16],
            ..bare
        };
        for (ethernet, global) in [(false, false), (false, true), (true, true)] {
            assert!(check_remote_address(ethernet, global, &bare).is_err());
        }
        assert!(check_remote_address(false, false, &ib).is_ok());
        assert!(
            check_remote_address(false, true, &ib).is_err(),
            "global, no GID"
        );
        assert!(check_remote_address(false, true, &Endpoint { gid: [1; 16], ..ib }).is_ok());
        assert!(
            check_remote_address(true, true, &roce).is_ok(),
            "RoCE: no LID"
        );
    }
}
