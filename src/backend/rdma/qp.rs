//! rdma-core QPs: RC and UD, on mlx5's direct path (a thread domain of their own, their
//! rings from `mlx5dv_init_obj`, never posted to by rdma-core) or on the verbs path; DC
//! initiators and targets live beside (`super::dc`).

use super::dc::HwDc;
use super::{Pd, RdmaDev};
use crate::backend::qp::{initial_psn, QpKind, QpSpec};
use crate::backend::spec::{QpRings, UdPort};
use crate::data_path::DataPath;
use crate::error::{Error, Result};
use crate::verbs;
use crate::verbs::ex::ApiChoice;
use crate::verbs::objects::{ConnLimits, Creator, Endpoint, Timing};
use std::sync::Arc;

/// What an rdma-core QP is.
enum Hw {
    /// An RC or UD QP (on the verbs path its queues hold it too).
    Verbs(Arc<verbs::objects::Qp>),
    /// A DC initiator or target (`mlx5dv_create_qp`).
    Dc(HwDc),
}

/// An rdma-core QP with its device.
pub(crate) struct Qp {
    dev: Arc<RdmaDev>,
    hw: Hw,
}

/// The port's address of `d`: (port attributes, source GID).
fn port_gid(d: &RdmaDev) -> Result<(verbs::device::PortInfo, [u8; 16])> {
    let port = d.ctx.port(d.port)?;
    let gid = match d.gid_index {
        Some(i) => d.ctx.gid(d.port, i)?,
        None => [0; 16],
    };
    Ok((port, gid))
}

/// Refuses a UD endpoint without a source GID on a RoCE port: peers cannot reach it.
pub(crate) fn check_source_gid(ethernet: bool, index: Option<i32>, gid: &[u8; 16]) -> Result<()> {
    if ethernet && *gid == [0; 16] {
        return Err(Error::InvalidParameter {
            what: "GID index of a RoCE port for UD: its GID is empty (not filled in yet, or \
                   its address removed; BLUEFLAME_GID_INDEX or Device::open choose another)",
            value: index.map_or(u64::MAX, |i| i as u64),
        });
    }
    Ok(())
}

/// A QP of `p` as `spec` says.
pub(crate) fn create_qp(p: &Pd, spec: &QpSpec<'_>) -> Result<(Qp, QpRings, u32)> {
    let d = &p.dev;
    let (env, caps) = (spec.env, spec.caps);
    let scq = spec.send_cq.rdma()?;
    // rdma-core reads MLX5_QP_SIGNATURE when it creates a QP (`create_qp`, `qp_sig_enabled`,
    // for every QP but a DCT): set when the device was opened, the device runs the verbs
    // path; set since, a QP would carry WQE signatures the direct path does not write (and,
    // RC or UD, run the verbs path over CQs the direct poller reads: a completion lost).
    if d.path == DataPath::Direct && env.qp_signature && !matches!(spec.kind, QpKind::Dct { .. }) {
        return Err(Error::Unsupported(
            "QPs on mlx5's direct path with MLX5_QP_SIGNATURE set after Device::open (set it \
             before, or BLUEFLAME_PATH=verbs)",
        ));
    }
    // The direct path wants a thread domain per QP: a BlueFlame register of its own (the
    // verbs path locks inside rdma-core anyway).
    let direct = d.path == DataPath::Direct;
    // On an mlx5 device, what rdma-core would refuse is refused here with its field, and the
    // direct path asks for the ring the caps name (`QpSpec::connectx`).
    let mut verbs_caps = caps.verbs();
    if d.mlx5 {
        if let Some(wrs) = spec.connectx(direct, env.qp_signature)? {
            verbs_caps.max_send_wr = wrs;
        }
    }
    // rdma-core creates every RC and UD QP of a ConnectX with responder scatter-to-CQE
    // unless MLX5_SCATTER_TO_CQE=0 (`verbs.c` `create_qp`, `use_scatter_to_cqe`, read by
    // rdma-core itself); a QP asked without it needs the vendor call and its creation flag.
    // With the variable set, rdma-core already leaves it off: the plain call does (and
    // rdma_cm QPs, which only the variable can ask it of, are not refused).
    let vendor = if d.mlx5 && !env.scatter_to_cqe_off {
        crate::dv::rc_ud_vendor_attr(caps.scatter_to_cqe)
    } else {
        None
    };
    let vendor_create = |attr: &mut rdma_sys::ibv_qp_init_attr_ex| {
        let mut dv = vendor.unwrap_or_default();
        // SAFETY: called only through `Creator::create`, whose callers pass the attributes
        // of live objects of this device's context (an mlx5 device: `d.mlx5`).
        unsafe { crate::dv::create_qp(d.ctx.ctx.cast(), attr, &mut dv) }
    };
    let creator = match vendor {
        Some(_) => Creator::Vendor(&vendor_create),
        None => Creator::Verbs,
    };
    // rdma-core's poller copies a small received message into the receive's buffers with
    // the CPU (`mlx5_copy_to_recv_wqe`) on the verbs path of a QP that scatters to the CQE.
    let provider_copies = d.mlx5 && caps.scatter_to_cqe && !env.scatter_to_cqe_off;
    let qp = match &spec.kind {
        QpKind::Dci { timing } => {
            let (hw, rings, qpn) = super::dc::create_dci(p, spec, timing)?;
            return Ok((Qp::dc(d, hw), rings, qpn));
        }
        QpKind::Dct {
            srq,
            dc_key,
            access,
            ..
        } => {
            let (hw, rings, n) = super::dc::create_dct(p, spec, srq, *dc_key, *access)?;
            return Ok((Qp::dc(d, hw), rings, n));
        }
        QpKind::Ud {
            recv_cq,
            qkey,
            mcast_loopback,
        } => {
            if !mcast_loopback {
                // rxe loops every group's datagrams back (it cannot block them), and neither
                // path asks for IBV_QP_CREATE_BLOCK_SELF_MCAST_LB.
                return Err(Error::Unsupported(
                    "UdOptions::mcast_loopback = false on an rdma-core device",
                ));
            }
            // The address peers are told before anything is created: on RoCE an endpoint
            // without its GID cannot be reached.
            let (port, gid) = port_gid(d)?;
            check_source_gid(port.ethernet, d.gid_index, &gid)?;
            // On mlx5's direct path (rdma-core's `mlx5_create_qp` with `IBV_QPT_UD` sizes
            // each WQE for the datagram segment too, `mlx5_calc_send_wqe`), with a
            // BlueFlame register of its own as for RC (UCX's iface QPs are on the worker's
            // thread domain); on the verbs path with `BLUEFLAME_VERBS_API`.
            let api = if direct {
                ApiChoice::Legacy
            } else {
                ApiChoice::current()?
            };
            let mut qp = verbs::objects::Qp::new_ud(
                p.pd.clone(),
                scq,
                recv_cq.rdma()?,
                verbs_caps,
                api,
                direct,
                creator,
            )?;
            if d.mlx5 {
                // libmlx5 reports up to 956 inline bytes, then writes a WQE of 64 DS for
                // more than 940 (`qp_size::UD_MAX_INLINE`): both paths stop at 940.
                qp.caps.max_inline = qp.caps.max_inline.min(mlx5::qp_size::UD_MAX_INLINE);
            }
            qp.ud_ready(d.port, *qkey, initial_psn(qp.qpn()))?;
            qp
        }
        QpKind::Rc { recv_cq, srq, cm } => {
            let rcq = recv_cq.rdma()?;
            // `BLUEFLAME_VERBS_API`, read when the QP is created: the verbs path posts with
            // `ibv_wr_*` where the provider has them; the direct path never asks rdma-core
            // to post.
            let api = if direct {
                ApiChoice::Legacy
            } else {
                ApiChoice::current()?
            };
            if cm.is_some() && vendor.is_some() {
                // rdma_create_qp_ex takes no vendor attributes (and rdma_cm must create the
                // QP it connects).
                return Err(Error::Unsupported(
                    "QpCaps::scatter_to_cqe = false on a QP connected through rdma_cm on an \
                     mlx5 device: rdma_create_qp_ex cannot ask for it (MLX5_SCATTER_TO_CQE=0 \
                     turns it off for every QP of the process)",
                ));
            }
            if cm.is_some() && caps.rnr_retry != 7 {
                // librdmacm programs the QP's RNR retry count from the peer's
                // `rdma_conn_param.rnr_retry_count` (the kernel's `cm_init_qp_rts_attr` takes
                // it from the REQ or REP), and `CmId::conn_param` sends 7 both ways.
                return Err(Error::Unsupported(
                    "QpCaps::rnr_retry below 7 on a QP connected through rdma_cm: its RNR retry \
                     count is what the peer's rdma_conn_param.rnr_retry_count says (7)",
                ));
            }
            match cm {
                // SAFETY: the id is live and on this PD's context (the PD was allocated on
                // the id's context); the QP's owner keeps the id and drops it after the QP.
                Some(id) => unsafe {
                    verbs::objects::Qp::on_cm(
                        id.id,
                        p.pd.clone(),
                        scq,
                        rcq,
                        verbs_caps,
                        direct,
                        api,
                    )?
                },
                None => {
                    let qp = verbs::objects::Qp::with_srq(
                        p.pd.clone(),
                        scq,
                        rcq,
                        verbs_caps,
                        direct,
                        api,
                        srq.map(|s| s.rdma().cloned()).transpose()?,
                        creator,
                    )?;
                    // RESET -> INIT now (port, P_Key index, access rights), as perftest's
                    // `ctx_modify_qp_to_init` and UCX's `uct_rc_iface_qp_init` do at
                    // creation: verbs take receives from INIT (IBA C10-97.2.1; libmlx5's
                    // `qp_state_max_gs` is -1 in RESET), so receives posted before
                    // `connect` are taken on the verbs path as on the direct one.
                    // (librdmacm's `rdma_create_qp_ex` moves its QPs to INIT itself.)
                    qp.to_init(d.port)?;
                    qp
                }
            }
        }
    };
    let qp = Arc::new(qp);
    let qpn = qp.qpn();
    let rings = if direct {
        // SAFETY: a live QP of an mlx5 device (the path is Direct only on mlx5).
        let dv = unsafe { crate::dv::init_qp(qp.qp.cast())? };
        let c = qp.caps;
        let lim = crate::dv::QpLimits {
            qpn,
            // rdma-core reports the inline room of the WQE size it chose, which may pass
            // what was asked (316 bytes for 256 on RC): the direct path takes what was
            // asked, as the software NIC does, so a payload one of them refuses the other
            // refuses too.
            max_inline: c.max_inline.min(caps.max_inline),
            max_send_sge: c.max_send_sge,
            max_recv_sge: c.max_recv_sge,
        };
        let mut raw = crate::dv::raw_qp(&dv, &lim)?;
        env.apply(&mut raw);
        // With a thread domain (one per QP), rdma-core gives the register to no other QP
        // (`mlx5_attach_dedicated_uar`).
        QpRings::Direct {
            raw,
            dedicated: qp.has_thread_domain(),
        }
    } else {
        QpRings::Verbs {
            qp: qp.clone(),
            rxe: d.attrs.rxe,
            provider_copies,
        }
    };
    let obj = Qp {
        dev: d.clone(),
        hw: Hw::Verbs(qp),
    };
    Ok((obj, rings, qpn))
}

impl Qp {
    /// A DC QP of `dev`.
    fn dc(dev: &Arc<RdmaDev>, hw: HwDc) -> Qp {
        Qp {
            dev: dev.clone(),
            hw: Hw::Dc(hw),
        }
    }

    fn verbs(&self) -> Result<&Arc<verbs::objects::Qp>> {
        match &self.hw {
            Hw::Verbs(q) => Ok(q),
            Hw::Dc(_) => Err(Error::Unsupported("this request on a DC QP")),
        }
    }

    pub(crate) fn endpoint(&self, qpn: u32, psn: u32) -> Result<Endpoint> {
        let (port, gid) = port_gid(&self.dev)?;
        Ok(Endpoint {
            qpn,
            psn,
            gid,
            lid: port.lid,
            mtu: port.active_mtu,
            // The responder depth `connect` programs (`to_rtr`).
            max_dest_rd_atomic: ConnLimits::dest_rd_atomic_of(self.dev.attrs.max_qp_rd_atom),
        })
    }

    /// The port's link layer and whether the QP's path is global: (Ethernet, a GID index
    /// given).
    pub(crate) fn link(&self) -> Result<(bool, bool)> {
        let d = &self.dev;
        Ok((d.ctx.port(d.port)?.ethernet, d.gid_index.is_some()))
    }

    /// INIT (where `create_qp` left it) -> RTR -> RTS. A failure says whether the QP was
    /// left in RTR (the move to RTS refused), where it takes the peer's messages; before
    /// RTR it is left in INIT, connectable again.
    pub(crate) fn connect(
        &self,
        remote: &Endpoint,
        psn: u32,
        timing: &Timing,
    ) -> std::result::Result<(), (Error, bool)> {
        let before_rtr = |e: Error| (e, false);
        let (d, qp) = (&self.dev, self.verbs().map_err(before_rtr)?);
        let port = d.ctx.port(d.port).map_err(|e| before_rtr(e.into()))?;
        let lim = ConnLimits {
            local_mtu: port.active_mtu,
            max_qp_rd_atom: d.attrs.max_qp_rd_atom,
            max_qp_init_rd_atom: d.attrs.max_qp_init_rd_atom,
            remote_dest_rd_atomic: remote.max_dest_rd_atomic,
        };
        let timing = &Timing {
            retry_cnt: d.attrs.retry_cnt_for(timing.retry_cnt),
            ..*timing
        };
        qp.to_rtr(remote, d.port, d.gid_index, timing, &lim)
            .map_err(|e| before_rtr(e.into()))?;
        qp.to_rts(psn, timing, &lim).map_err(|e| (e.into(), true))
    }

    pub(crate) fn set_error(&self) -> Result<()> {
        match &self.hw {
            Hw::Verbs(q) => Ok(q.to_error()?),
            Hw::Dc(h) => h.set_error(),
        }
    }

    pub(crate) fn attach_mcast(&self, gid: [u8; 16], lid: u16) -> Result<()> {
        Ok(self.verbs()?.attach_mcast(&gid, lid)?)
    }

    pub(crate) fn detach_mcast(&self, gid: [u8; 16], lid: u16) -> Result<()> {
        Ok(self.verbs()?.detach_mcast(&gid, lid)?)
    }

    pub(crate) fn ud_port(&self) -> Result<UdPort> {
        let (port, gid) = port_gid(&self.dev)?;
        Ok(UdPort {
            mtu: verbs::ud::mtu_bytes(port.active_mtu),
            lid: port.lid,
            gid,
            ethernet: port.ethernet,
        })
    }
}
