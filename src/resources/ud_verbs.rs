//! The verbs path of a UD QP ([`crate::UdQp`] on rdma-core devices): the verbs UD QP
//! (`crate::verbs::ud`), its send and receive queues with the crate's cookies, completion
//! moderation and CQ accounting, attached to the CQs' registries as an RC QP's queues are,
//! and the same teardown.

use super::cq::CqHandle;
use super::device::{Backend, PdKind};
use super::events::Subject;
use super::{Cq, Pd, QpCaps};
use crate::error::{Error, Result};
use crate::queue::flags::PostFlags;
use crate::queue::registry::Attached;
use crate::verbs;
use crate::verbs::ex::{ApiChoice, VerbsApi};
use crate::verbs::rq::VerbsRecvQueue;
use crate::verbs::ud::VerbsUdSendQueue;
use crate::{Payload, Sge};
use std::sync::Arc;

/// A UD QP on the verbs path, ready to send and receive.
pub(crate) struct VerbsUd {
    // Field order: the queues go before the handles that keep their QP alive.
    sq: VerbsUdSendQueue,
    rq: VerbsRecvQueue,
    qp: Arc<verbs::objects::Qp>,
    qpn: u32,
    /// The port's LID and the GID of the index in use (zeros without one).
    pub(crate) lid: u16,
    pub(crate) gid: [u8; 16],
    /// Whether the port's link layer is Ethernet (RoCE: every address is global, a
    /// multicast group has no LID).
    pub(crate) ethernet: bool,
    /// The multicast groups the QP is attached to: detached before the QP is destroyed
    /// (the kernel refuses to destroy a QP with attachments, `EBUSY`, and the QP and its
    /// CQs would stay allocated).
    groups: Vec<([u8; 16], u16)>,
    pd: Pd,
    cqs: [Arc<CqHandle>; 2],
}

/// Refuses a UD QP on a RoCE port whose GID in use is empty: every RoCE datagram is
/// addressed by GID, so its endpoint would name no address. The kernel fills a RoCE port's
/// GID table from a work queue (after the device is added, or an IP address), and an index
/// read before then, or whose address was removed, is all zero.
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

fn verbs_cq(cq: &Cq) -> Result<Arc<verbs::objects::Cq>> {
    match &cq.handle.kind {
        super::cq::CqKind::Verbs(c) => Ok(c.clone()),
        #[cfg(feature = "sim")]
        super::cq::CqKind::Sim { .. } => {
            Err(Error::Unsupported("a software-NIC CQ with a verbs QP"))
        }
    }
}

impl VerbsUd {
    /// Creates the verbs UD QP on `pd` (a verbs protection domain) and brings it to RTS
    /// with `qkey` (`ibv_create_qp_ex` with `IBV_QPT_UD`, INIT / RTR / RTS). Sizes as an RC
    /// QP's on the verbs path: `caps.sq_blocks / max_wqe_bbs` work requests.
    ///
    /// # Errors
    /// [`Error::InvalidHandle`] for a CQ of another device; [`Error::Verbs`];
    /// [`Error::Unsupported`] for a PD that is not a verbs one.
    pub(crate) fn create(
        pd: &Pd,
        send_cq: &Cq,
        recv_cq: &Cq,
        caps: QpCaps,
        qkey: u32,
    ) -> Result<VerbsUd> {
        for (cq, what) in [
            (send_cq, "send CQ of another device (CQ number)"),
            (recv_cq, "receive CQ of another device (CQ number)"),
        ] {
            if !cq.dev.same(&pd.inner.dev) {
                return Err(Error::InvalidHandle {
                    what,
                    value: cq.cqn() as u64,
                });
            }
        }
        let (vdev, vpd) = match (&pd.inner.dev.backend, &pd.inner.kind) {
            (Backend::Verbs(vdev), PdKind::Verbs(vpd)) => (vdev, vpd),
            #[cfg(feature = "sim")]
            _ => return Err(Error::Unsupported("a verbs UD QP on another backend")),
        };
        if vdev.path == crate::DataPath::Direct {
            // The device's CQs are polled by the direct path, which attributes completions
            // by the rings' WQE counters: a verbs QP's completions on them would be
            // misread.
            return Err(Error::Unsupported(
                "a verbs-path UD QP on a device whose CQs the direct path polls \
                 (UdQp runs mlx5's direct path there)",
            ));
        }
        let vcaps = caps.verbs();
        let (scq, rcq) = (verbs_cq(send_cq)?, verbs_cq(recv_cq)?);
        // The address peers are told before anything is created: on RoCE an endpoint
        // without its GID cannot be reached.
        let port = vdev.ctx.port(vdev.port)?;
        let gid = match vdev.gid_index {
            Some(i) => vdev.ctx.gid(vdev.port, i)?,
            None => [0; 16],
        };
        check_source_gid(port.ethernet, vdev.gid_index, &gid)?;
        // `BLUEFLAME_VERBS_API`, read when the QP is created, as for RC.
        let api = ApiChoice::current()?;
        let qp = Arc::new(verbs::objects::Qp::new_ud(
            vpd.clone(),
            scq,
            rcq,
            vcaps,
            api,
            false,
        )?);
        let qpn = qp.qpn();
        qp.ud_ready(vdev.port, qkey, qpn.wrapping_mul(0x9e37_79b9) >> 8)?;
        let mut sq = VerbsUdSendQueue::new(qp.clone(), verbs::ud::mtu_bytes(port.active_mtu));
        // rxe's `wr_set_sge_list` miscounts gather lists before rdma-core 64.
        sq.queue().set_gather_lists_legacy(vdev.attrs.rxe);
        let mut rq = VerbsRecvQueue::new_ud(qp.clone());
        rq.check_against(pd.inner.regions.clone(), vdev.mlx5);
        let (sq_shadow, rq_shadow) = (sq.shadow(), rq.shadow.clone());
        pd.inner.lifetimes.track(&sq_shadow);
        send_cq.handle.registry.attach(Attached {
            qpn,
            sq: Some(sq_shadow),
            rq: None,
            scatter: None,
            srq: None,
        });
        recv_cq.handle.registry.attach(Attached {
            qpn,
            sq: None,
            rq: Some(rq_shadow),
            scatter: Some(rq.scatter.clone()),
            srq: None,
        });
        sq.queue().attach_cq(send_cq.handle.registry.slots.clone());
        rq.attach_cq(recv_cq.handle.registry.slots.clone());
        Ok(VerbsUd {
            sq,
            rq,
            qp,
            qpn,
            lid: port.lid,
            gid,
            ethernet: port.ethernet,
            groups: Vec::new(),
            pd: pd.clone(),
            cqs: [send_cq.handle.clone(), recv_cq.handle.clone()],
        })
    }

    /// The QP number.
    pub(crate) fn qpn(&self) -> u32 {
        self.qpn
    }

    /// The protection domain.
    pub(crate) fn pd(&self) -> &Pd {
        &self.pd
    }

    /// The largest payload of one send (the port's active MTU).
    pub(crate) fn mtu(&self) -> u32 {
        self.sq.mtu()
    }

    /// The rdma-core API the sends are posted with.
    pub(crate) fn api(&self) -> VerbsApi {
        self.qp.api()
    }

    /// Send-queue room and depth, receive-queue room and depth.
    pub(crate) fn room(&self) -> (u32, u32, u32, u32) {
        (
            self.sq.free(),
            self.sq.capacity(),
            self.rq.free(),
            self.rq.capacity(),
        )
    }

    /// Posts one send to `remote_qpn` / `remote_qkey` behind `ah` (checked by the caller
    /// to be of this QP's protection domain).
    ///
    /// # Errors
    /// As [`VerbsUdSendQueue::push`] and [`VerbsUdSendQueue::ring`]; an asynchronous event
    /// about this QP instead of a queue or CQ that does not drain.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn send(
        &mut self,
        ah: &Arc<verbs::ud::Ah>,
        remote_qpn: u32,
        remote_qkey: u32,
        data: &Payload<'_>,
        imm: Option<u32>,
        cookie: u64,
        flags: PostFlags,
    ) -> Result<()> {
        // The queue keeps `ah` until the send completed (the provider may look it up after
        // the post returned: rxe's requester does, by number).
        let r = self
            .sq
            .post(ah, remote_qpn, remote_qkey, data, imm, cookie, flags);
        r.map_err(|e| self.explain(e))
    }

    /// Posts a receive.
    ///
    /// # Errors
    /// As [`VerbsRecvQueue::post`].
    pub(crate) fn post_recv(&mut self, sgl: &[Sge], cookie: u64) -> Result<()> {
        let r = self.rq.post(sgl, cookie);
        r.map_err(|e| self.explain(e))
    }

    /// `ibv_attach_mcast`; the group is remembered for the drop.
    ///
    /// # Errors
    /// [`Error::Verbs`].
    pub(crate) fn attach_mcast(&mut self, gid: &[u8; 16], lid: u16) -> Result<()> {
        self.qp.attach_mcast(gid, lid)?;
        if !self.groups.contains(&(*gid, lid)) {
            self.groups.push((*gid, lid));
        }
        Ok(())
    }

    /// `ibv_detach_mcast`.
    ///
    /// # Errors
    /// [`Error::Verbs`].
    pub(crate) fn detach_mcast(&mut self, gid: &[u8; 16], lid: u16) -> Result<()> {
        self.qp.detach_mcast(gid, lid)?;
        self.groups.retain(|g| *g != (*gid, lid));
        Ok(())
    }

    /// Any state -> ERROR: posted and later work is flushed.
    ///
    /// # Errors
    /// [`Error::Verbs`].
    pub(crate) fn set_error(&self) -> Result<()> {
        Ok(self.qp.to_error()?)
    }

    /// Reads the device's asynchronous events and reports one about this QP or its CQs.
    ///
    /// # Errors
    /// [`Error::AsyncEvent`].
    pub(crate) fn check(&self) -> Result<()> {
        let dev = &self.pd.inner.dev;
        let subjects = [
            Subject::Qp(self.qpn),
            self.cqs[0].subject(),
            self.cqs[1].subject(),
        ];
        dev.events.check(&dev.backend, &subjects)
    }

    #[cold]
    fn explain(&self, e: Error) -> Error {
        super::events::explain_refusal(e, || self.check())
    }
}

impl Drop for VerbsUd {
    fn drop(&mut self) {
        // Groups first: `ibv_destroy_qp` (when the queues drop the last reference) fails
        // with EBUSY while the QP is attached to one (`uverbs_free_qp`).
        for (gid, lid) in std::mem::take(&mut self.groups) {
            let _ = self.qp.detach_mcast(&gid, lid);
        }
        self.pd.inner.dev.events.forget(Subject::Qp(self.qpn));
        self.pd.inner.lifetimes.reclaim();
        self.sq.queue().release_cq();
        self.rq.release_cq();
        // As an RC QP's drop: with the CQs' lists locked, a tombstone for the number (the
        // verbs QP itself is destroyed when its last Arc, held by the queues, drops).
        super::cq::destroy_and_bury(&self.cqs, self.qpn, || {});
    }
}

/// Whether `gid` is a multicast GID as the kernel's `rdma_is_multicast_addr` says (what
/// `ibv_attach_mcast` accepts on RoCE): `ff00::/8`, or an IPv4-mapped multicast address
/// (`::ffff:224.0.0.0/4`, how RoCE v2 over IPv4 and rdma_cm name IPv4 groups).
pub(crate) fn is_roce_multicast(gid: &[u8; 16]) -> bool {
    gid[0] == 0xff || (gid[..10] == [0; 10] && gid[10..12] == [0xff, 0xff] && gid[12] >> 4 == 0xe)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roce_multicast_gids() {
        let mut g = [0u8; 16];
        assert!(!is_roce_multicast(&g));
        g[0] = 0xff;
        g[1] = 0x0e;
        assert!(is_roce_multicast(&g), "IPv6 / IB multicast");
        let v4 = |a: u8| {
            let mut g = [0u8; 16];
            g[10] = 0xff;
            g[11] = 0xff;
            g[12..].copy_from_slice(&[a, 1, 2, 3]);
            g
        };
        assert!(is_roce_multicast(&v4(239)), "::ffff:239.1.2.3");
        assert!(is_roce_multicast(&v4(224)));
        assert!(!is_roce_multicast(&v4(10)), "::ffff:10.1.2.3 is unicast");
        assert!(!is_roce_multicast(&v4(240)));
    }

    #[test]
    fn a_roce_port_without_its_gid_gives_no_ud_endpoint() {
        let v4 = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 77, 0, 1];
        assert!(check_source_gid(true, Some(1), &v4).is_ok());
        assert!(matches!(
            check_source_gid(true, Some(1), &[0; 16]),
            Err(Error::InvalidParameter { value: 1, .. })
        ));
        // InfiniBand: LIDs route, a GID is optional.
        assert!(check_source_gid(false, None, &[0; 16]).is_ok());
    }
}
