//! Creating queue pairs: [`Pd::create_qp`] and its SRQ and UD variants, each backend's
//! queues taken over behind one [`backend::Qp`].

use super::{Qp, QpPath};
use crate::backend::{self, QpKind, QpRings, QpSpec};
use crate::direct::{RecvQueue, SendQueue};
use crate::error::{Error, Result};
use crate::mlx5_env::Mlx5Env;
use crate::queue::invalidations::Invalidations;
use crate::queue::registry::Attached;
use crate::resources::cq::CqHandle;
use crate::resources::events::{Forget, Subject};
use crate::resources::{Cq, Pd, QpCaps};
use crate::verbs;
use crate::verbs::rq::VerbsRecvQueue;
use crate::verbs::sq::VerbsSendQueue;
use std::sync::Arc;

impl Pd {
    /// Creates an RC QP whose sends complete on `send_cq` and receives on `recv_cq` (they
    /// may be the same CQ).
    ///
    /// # Errors
    /// [`Error::InvalidHandle`] when a CQ belongs to another device (another software NIC
    /// or verbs context); [`Error::InvalidParameter`] naming the field and its value for
    /// caps a ConnectX would refuse (see [`QpCaps`]; on mlx5 devices and the software NIC)
    /// or `rnr_retry` above 7; [`Error::Timestamps`] for a send and a receive CQ that stamp
    /// in different formats; [`Error::Verbs`] (`Error::Sim` on the software NIC) for other
    /// capabilities the device refuses; [`Error::Unsupported`] on mlx5's direct path when
    /// `MLX5_QP_SIGNATURE` was set after the device was opened; on the verbs path,
    /// [`Error::Environment`] for a `BLUEFLAME_VERBS_API` other than `auto`, `extended`,
    /// `legacy`, and [`Error::Unsupported`] for `extended` where the provider lacks the API.
    pub fn create_qp(&self, send_cq: &Cq, recv_cq: &Cq, caps: QpCaps) -> Result<Qp> {
        self.create_qp_with(send_cq, recv_cq, caps, None)
    }

    /// As [`Pd::create_qp`]; with `cm`, the QP is created through librdmacm on that id.
    pub(crate) fn create_qp_with(
        &self,
        send_cq: &Cq,
        recv_cq: &Cq,
        caps: QpCaps,
        cm: Option<Arc<verbs::cm::CmId>>,
    ) -> Result<Qp> {
        let recv = RecvSide::cq(recv_cq);
        self.create_qp_on(send_cq, recv, caps, cm)
    }

    /// Creates an RC QP whose sends complete on `send_cq` and that takes its receives from
    /// `srq` (`srq` in `ibv_qp_init_attr`): they complete on the SRQ's CQ, and
    /// [`Qp::post_recv`] is refused ([`Error::SrqQp`]); `caps.rq_entries` and
    /// `caps.max_recv_sge` are not used. The QP keeps the SRQ alive.
    ///
    /// # Errors
    /// [`Error::InvalidHandle`] for a send CQ of another device or an SRQ of another
    /// protection domain; as [`Pd::create_qp`].
    pub fn create_qp_with_srq(
        &self,
        send_cq: &Cq,
        srq: &crate::resources::Srq,
        caps: QpCaps,
    ) -> Result<Qp> {
        let h = &srq.handle;
        if !Arc::ptr_eq(&h.pd.inner, &self.inner) {
            return Err(Error::InvalidHandle {
                what: "SRQ of another protection domain (SRQ number)",
                value: h.srqn as u64,
            });
        }
        let recv = RecvSide {
            handle: &h.cq,
            cqn: h.cqn,
            dev: &h.pd.inner.dev,
            srq: Some(h),
        };
        let caps = QpCaps {
            rq_entries: 0,
            ..caps
        };
        self.create_qp_on(send_cq, recv, caps, None)
    }

    fn create_qp_on(
        &self,
        send_cq: &Cq,
        recv: RecvSide<'_>,
        caps: QpCaps,
        cm: Option<Arc<verbs::cm::CmId>>,
    ) -> Result<Qp> {
        if caps.rnr_retry > 7 {
            return Err(Error::InvalidParameter {
                what: "rnr_retry (at most 7: a 3-bit field, 7 retries for ever)",
                value: caps.rnr_retry as u64,
            });
        }
        self.check_cqs(send_cq, recv.handle, recv.dev, recv.cqn)?;
        // rdma-core's MLX5_* switches for this QP, read as rdma-core reads them (at its
        // creation, or when the device was opened: `Dev::qp_env`).
        let env = self.inner.dev.backend.qp_env();
        let srq = recv.srq.map(|s| s.obj()).transpose()?;
        let spec = QpSpec {
            caps,
            send_cq: &send_cq.handle.kind,
            kind: QpKind::Rc {
                recv_cq: &recv.handle.kind,
                srq,
                cm: cm.as_ref(),
            },
            env: &env,
        };
        let made = self.inner.pd.create_qp(&spec)?;
        self.assemble(made, send_cq, recv, &env, caps.rnr_retry, cm)
    }

    /// Refuses CQs of another device (CQ and QP numbers are per device, so a foreign CQ
    /// would get this device's completions for its own CQ of that number, and its poller
    /// would take them for its own QP of the same number), and two CQs whose timestamp
    /// formats differ ([`CqHandle::check_ts_formats`]).
    pub(crate) fn check_cqs(
        &self,
        send_cq: &Cq,
        recv: &CqHandle,
        recv_dev: &crate::resources::Device,
        recv_cqn: u32,
    ) -> Result<()> {
        for (dev, cqn, what) in [
            (
                &send_cq.dev,
                send_cq.cqn(),
                "send CQ of another device (CQ number)",
            ),
            (
                recv_dev,
                recv_cqn,
                "receive CQ of another device (CQ number)",
            ),
        ] {
            if !dev.same(&self.inner.dev) {
                return Err(Error::InvalidHandle {
                    what,
                    value: cqn as u64,
                });
            }
        }
        CqHandle::check_ts_formats(&send_cq.handle, recv)
    }

    /// A QP the backend made, with its queues: the send and receive queues of its data
    /// path over its rings (or rdma-core's QP), attached to their CQs (registries and CQ
    /// accounting), their regions and window bookkeeping, the post flags of the device.
    pub(crate) fn assemble(
        &self,
        (obj, rings, qpn): (backend::Qp, QpRings, u32),
        send_cq: &Cq,
        recv: RecvSide<'_>,
        env: &Mlx5Env,
        rnr_retry: u8,
        cm: Option<Arc<verbs::cm::CmId>>,
    ) -> Result<Qp> {
        // Where the QP's receives record the keys peers invalidate (windows bound through it
        // read them there).
        let rxe = matches!(rings, QpRings::Verbs { rxe: true, .. });
        let invalidations = Arc::new(Invalidations::new(verbs::cq::with_inv_flag(rxe)));
        let mut path = match rings {
            QpRings::Direct { raw, dedicated } => {
                // SAFETY: the rings belong to the QP `obj` owns, which this Qp alone posts
                // to (rdma-core is never asked to) and destroys in its drop, before the
                // queues go, which then touch the rings no more; with `dedicated`, its
                // register is this QP's alone (a thread domain of its own).
                let sq = unsafe {
                    if dedicated {
                        SendQueue::new_dedicated(&raw)?
                    } else {
                        SendQueue::new(&raw)?
                    }
                };
                // SAFETY: as above, for the receive ring.
                let rq = unsafe { RecvQueue::new(&raw)? };
                QpPath::Direct { sq, rq }
            }
            QpRings::Verbs {
                qp,
                rxe,
                provider_copies,
            } => {
                let mut sq = VerbsSendQueue::new(qp.clone());
                sq.set_rxe(rxe);
                let mut rq = recv.srq.is_none().then(|| VerbsRecvQueue::new(qp));
                // Every receive pins the regions it lands in until it completes.
                if let Some(rq) = &mut rq {
                    rq.check_against(self.inner.regions.clone(), provider_copies);
                }
                QpPath::Verbs { sq, rq }
            }
            QpRings::None => return Err(Error::Unsupported("a QP without queues")),
        };
        if let QpPath::Direct { rq: Some(rq), .. } = &mut path {
            rq.check_against(self.inner.regions.clone());
        }
        let (sq_shadow, rq_shadow, scatter) = match &path {
            QpPath::Direct { sq, rq, .. } => (
                sq.shadow.clone(),
                rq.as_ref().map(|r| r.shadow.clone()),
                rq.as_ref().map(|r| r.scatter.clone()),
            ),
            QpPath::Verbs { sq, rq, .. } => (
                sq.shadow.clone(),
                rq.as_ref().map(|r| r.shadow.clone()),
                rq.as_ref().map(|r| r.scatter.clone()),
            ),
        };
        self.inner.lifetimes.track(&sq_shadow);
        send_cq
            .handle
            .registry
            .attach(Attached::send(qpn, sq_shadow));
        let srq = match recv.srq {
            // The QP's receive completions come from the SRQ's table.
            Some(s) => {
                Some(s.attach_receiver(recv.handle, recv.cqn, qpn, Some(invalidations.clone()))?)
            }
            None => {
                recv.handle.registry.attach(Attached {
                    qpn,
                    sq: None,
                    rq: rq_shadow,
                    scatter,
                    srq: None,
                    invalidations: Some(invalidations.clone()),
                });
                None
            }
        };
        let psn = backend::initial_psn(qpn);
        // The device's atomics and its port's largest message, read once here: what it
        // lacks is refused before posting.
        let (atomics, max_msg) = (self.inner.dev.atomic_caps(), self.inner.dev.max_message());
        // CQ accounting: each queue holds entries of the CQ it completes on.
        let (sslots, rslots) = (&send_cq.handle.registry.slots, &recv.handle.registry.slots);
        match &mut path {
            QpPath::Direct { sq, rq, .. } => {
                // An RC QP's queue (a UD QP's is marked by `Qp::mark_ud`).
                sq.set_transport(crate::direct::Transport::Rc);
                sq.set_atomic_caps(atomics);
                sq.set_max_message(max_msg);
                // The driver side of rdma-core's MLX5_POST_SEND_PREFER_BF.
                env.configure(sq);
                // Until `connect`, every post goes through `check_state`.
                sq.enable_fast_path(false);
                sq.attach_cq(sslots.clone());
                if let Some(rq) = rq {
                    rq.attach_cq(rslots.clone());
                }
            }
            QpPath::Verbs { sq, rq, .. } => {
                sq.set_atomic_caps(atomics);
                sq.set_max_message(max_msg);
                sq.attach_cq(sslots.clone());
                if let Some(rq) = rq {
                    rq.attach_cq(rslots.clone());
                }
            }
        }
        Ok(Qp {
            path,
            qpn,
            psn,
            connected: false,
            reached_rtr: false,
            errored: false,
            atomics,
            rnr_retry_cap: rnr_retry,
            pd: self.clone(),
            cqs: [send_cq.handle.clone(), recv.handle.clone()],
            obj: Some(obj),
            srq,
            leaving: [None, None],
            _forget: Forget::new(
                &self.inner.dev.events,
                [Some(Subject::Qp(qpn)), Some(Subject::LastWqe(qpn))],
            ),
            _cm: cm,
            refusal: None,
            invalidations,
        })
    }
}

/// The receive side of a new QP: its CQ, and the SRQ it takes receives from.
pub(crate) struct RecvSide<'a> {
    handle: &'a Arc<CqHandle>,
    cqn: u32,
    dev: &'a crate::resources::Device,
    srq: Option<&'a Arc<crate::resources::srq::SrqHandle>>,
}

impl<'a> RecvSide<'a> {
    /// Receives from the QP's own queue, completing on `cq`.
    pub(crate) fn cq(cq: &'a Cq) -> Self {
        RecvSide {
            handle: &cq.handle,
            cqn: cq.cqn(),
            dev: &cq.dev,
            srq: None,
        }
    }
}
