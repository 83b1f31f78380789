//! The software NIC's QPs of every transport: each on a thread domain of its own when the
//! NIC has one left (its BlueFlame register is then the QP's alone, as UCX gives each
//! worker one), with rdma-core's `MLX5_*` switches applied as on a ConnectX.

use super::{Nic, Pd};
use crate::backend::qp::{QpKind, QpSpec};
use crate::backend::spec::{QpRings, UdPort};
use crate::caps::QpCaps;
use crate::error::{Capability, Error, Result};
use crate::verbs::objects::{ConnLimits, Endpoint, Timing};
use mlx5::sim::{QpState, QpTiming, RcPath, SimError};

/// What a QP of the NIC is: destroyed as such.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Role {
    /// RC, UD or a DC initiator: a QP, on a thread domain when `td`.
    Qp { td: Option<u32> },
    /// A DC target.
    Dct,
}

/// A QP of the NIC (destroyed on drop, then its thread domain freed).
pub(crate) struct Qp {
    nic: Nic,
    qpn: u32,
    role: Role,
}

impl Drop for Qp {
    fn drop(&mut self) {
        match self.role {
            Role::Qp { td } => destroy_with_td(&self.nic, self.qpn, td),
            Role::Dct => {
                let _ = self.nic.destroy_dct(self.qpn);
            }
        }
    }
}

/// Creates a QP with `create`, on a thread domain of its own when the NIC has one left
/// (`create` gets None otherwise: rdma-core's shared registers, rung under their lock).
/// Returns the QP with its domain; when `create` fails, the domain is freed again.
fn create_on_own_td<T>(
    nic: &Nic,
    create: impl FnOnce(Option<u32>) -> core::result::Result<T, SimError>,
) -> core::result::Result<(T, Option<u32>), SimError> {
    let td = nic.alloc_td().ok();
    match create(td) {
        Ok(qp) => Ok((qp, td)),
        Err(e) => {
            if let Some(td) = td {
                let _ = nic.dealloc_td(td);
            }
            Err(e)
        }
    }
}

/// Destroys QP `qpn`, then frees its thread domain `td`.
fn destroy_with_td(nic: &Nic, qpn: u32, td: Option<u32>) {
    let _ = nic.destroy_qp(qpn);
    if let Some(td) = td {
        let _ = nic.dealloc_td(td);
    }
}

/// The NIC's timers of `timing`, RNR retries capped at `cap`.
fn sim_timing(timing: &Timing, cap: u8) -> QpTiming {
    QpTiming {
        timeout: timing.timeout,
        retry_cnt: timing.retry_cnt,
        rnr_retry: timing.rnr_retry.min(cap),
        min_rnr_timer: timing.min_rnr_timer,
    }
}

/// A QP of `p` as `spec` says.
pub(crate) fn create_qp(p: &Pd, spec: &QpSpec<'_>) -> Result<(Qp, QpRings, u32)> {
    let (nic, env) = (&p.nic, spec.env);
    let send_cq = spec.send_cq.sim()?;
    // rdma-core's switches for this QP, as on mlx5: the device side (MLX5_SCATTER_TO_CQE,
    // `use_scatter_to_cqe`; MLX5_SHUT_UP_BF: every QP rings the register without BlueFlame,
    // `mlx5_get_qp_uar` returns `ctx->nc_uar`).
    let caps = mlx5::sim::QpCaps::from(QpCaps {
        scatter_to_cqe: spec.caps.scatter_to_cqe && !env.scatter_to_cqe_off,
        bf_size: if env.shut_up_bf { 0 } else { spec.caps.bf_size },
        ..spec.caps
    });
    let (mut raw, td) = match &spec.kind {
        QpKind::Rc { recv_cq, srq, cm } => {
            if cm.is_some() {
                return Err(Error::Unsupported("rdma_cm on the software NIC"));
            }
            let recv_cq = recv_cq.sim()?;
            let srqn = srq.map(|s| s.sim()).transpose()?;
            create_on_own_td(nic, |td| {
                let raw = match td {
                    Some(td) => nic.create_qp_on_td(p.pd, td, send_cq, recv_cq, caps),
                    None => nic.create_qp(p.pd, send_cq, recv_cq, caps),
                }?;
                // Receives from the SRQ (`ibv_qp_init_attr.srq`); then RESET -> INIT, as on
                // rdma-core devices (`rdma::create_qp`): receives are taken from creation.
                let ready = match srqn {
                    Some(s) => nic.attach_qp_srq(raw.qpn, s),
                    None => Ok(()),
                }
                .and_then(|()| nic.init_qp(raw.qpn));
                if let Err(e) = ready {
                    let _ = nic.destroy_qp(raw.qpn);
                    return Err(e);
                }
                Ok(raw)
            })?
        }
        QpKind::Ud {
            recv_cq,
            qkey,
            mcast_loopback,
        } => {
            let recv_cq = recv_cq.sim()?;
            let (raw, td) = create_on_own_td(nic, |td| match td {
                Some(td) => nic.create_qp_on_td(p.pd, td, send_cq, recv_cq, caps),
                None => nic.create_qp(p.pd, send_cq, recv_cq, caps),
            })?;
            if let Err(e) = nic.make_ud(raw.qpn, *qkey, *mcast_loopback) {
                destroy_with_td(nic, raw.qpn, td);
                return Err(e.into());
            }
            (raw, td)
        }
        QpKind::Dci { timing } => {
            let (raw, td) = create_on_own_td(nic, |td| match td {
                Some(td) => nic.create_dci_on_td(p.pd, td, send_cq, caps),
                None => nic.create_dci(p.pd, send_cq, caps),
            })?;
            if let Err(e) = nic.dci_ready(raw.qpn, sim_timing(timing, caps.rnr_retry)) {
                destroy_with_td(nic, raw.qpn, td);
                return Err(e.into());
            }
            (raw, td)
        }
        QpKind::Dct {
            srq,
            dc_key,
            access,
        } => {
            let n = nic
                .create_dct(p.pd, send_cq, Some(srq.sim()?), *dc_key, *access)
                .map_err(|e| match e {
                    SimError::NoCapability(_) => Error::Capability(Capability::RemoteAtomics),
                    e => e.into(),
                })?;
            let qp = Qp {
                nic: nic.clone(),
                qpn: n,
                role: Role::Dct,
            };
            // rdma-core's create_dct keeps MLX5_QP_FLAG_SCATTER_CQE unless
            // MLX5_SCATTER_TO_CQE=0 (`use_scatter_to_cqe`).
            if env.scatter_to_cqe_off {
                nic.set_dct_scatter_to_cqe(n, false)?;
            }
            return Ok((qp, QpRings::None, n));
        }
    };
    env.apply(&mut raw);
    let qp = Qp {
        nic: nic.clone(),
        qpn: raw.qpn,
        role: Role::Qp { td },
    };
    let rings = QpRings::Direct {
        raw,
        dedicated: td.is_some(),
    };
    Ok((qp, rings, raw.qpn))
}

impl Qp {
    /// The port's address with QP `qpn` and its first send PSN `psn`, as an rdma-core
    /// device gives it: LID, GID and active MTU.
    pub(crate) fn endpoint(&self, qpn: u32, psn: u32) -> Endpoint {
        let port = self.nic.port_attr();
        Endpoint {
            qpn,
            psn,
            gid: port.gid,
            lid: port.lid,
            mtu: u32::from(port.mtu_enum()),
            // Its responder takes any number of reads in flight; the crate's 16, as a
            // ConnectX's QP connected by rdma-core (and the software NIC behind it, whose
            // device says `max_qp_rd_atom` 16) is programmed with.
            max_dest_rd_atomic: ConnLimits::RD_ATOMIC,
        }
    }

    /// Connects the QP to `remote` with first send PSN `psn`: the NIC's requests reach
    /// only the QP the LID and number name, and only if the PSNs agree (see
    /// [`mlx5::sim::Nic::connect`]).
    pub(crate) fn connect(&self, remote: &Endpoint, psn: u32, timing: &Timing) -> Result<()> {
        // The path MTU as rdma-core's path takes it: the smaller of the two ports'.
        let local = u32::from(self.nic.port_attr().mtu_enum());
        let lim = ConnLimits {
            local_mtu: local,
            max_qp_rd_atom: ConnLimits::RD_ATOMIC,
            max_qp_init_rd_atom: ConnLimits::RD_ATOMIC,
            remote_dest_rd_atomic: remote.max_dest_rd_atomic,
        };
        let mtu = crate::verbs::ud::mtu_bytes(lim.path_mtu(remote.mtu));
        // RTR and RTS attributes first (this side's timers; the peer's are its own
        // connect's), so that the connection is the one step that can fail after them.
        self.nic.set_timing(self.qpn, sim_timing(timing, u8::MAX))?;
        let path = RcPath {
            dest_qpn: remote.qpn,
            dlid: remote.lid,
            rq_psn: remote.psn,
            sq_psn: psn,
            mtu,
        };
        self.nic.connect(self.qpn, path).map_err(|e| match e {
            SimError::QpState { state, .. } => Error::InvalidState {
                state: match state {
                    QpState::Error => "in error: a QP connects only from INIT (create a new one)",
                    _ => "connected to another QP: a QP connects only from INIT",
                },
            },
            e => e.into(),
        })?;
        Ok(())
    }

    pub(crate) fn set_error(&self) -> Result<()> {
        Ok(self.nic.set_error(self.qpn)?)
    }

    pub(crate) fn attach_mcast(&self, gid: [u8; 16], lid: u16) -> Result<()> {
        Ok(self.nic.attach_mcast(self.qpn, gid, lid)?)
    }

    pub(crate) fn detach_mcast(&self, gid: [u8; 16], lid: u16) -> Result<()> {
        Ok(self.nic.detach_mcast(self.qpn, gid, lid)?)
    }

    pub(crate) fn ud_port(&self) -> UdPort {
        let port = self.nic.port_attr();
        UdPort {
            mtu: port.mtu,
            lid: port.lid,
            gid: port.gid,
            ethernet: false,
        }
    }
}
