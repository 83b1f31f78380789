//! The verbs path of a UD QP ([`crate::UdQp`] on rdma-core devices): the verbs UD QP
//! (`crate::verbs::ud`), its send and receive queues with the crate's cookies, completion
//! moderation and CQ accounting, attached to the CQs' registries as an RC QP's queues are,
//! and the same teardown.

use super::cq::CqHandle;
use super::events::Subject;
use super::{Cq, Pd};
use crate::backend;
use crate::error::{Error, Result};
use crate::queue::cq_share::Leaving;
use crate::queue::flags::PostFlags;
use crate::queue::registry::Attached;
use crate::verbs;
use crate::verbs::ex::VerbsApi;
use crate::verbs::rq::VerbsRecvQueue;
use crate::verbs::ud::VerbsUdSendQueue;
use mlx5::request::Payload;
use mlx5::request::Sge;
use std::sync::Arc;

/// A UD QP on the verbs path, ready to send and receive.
pub(crate) struct VerbsUd {
    // Field order: the queues go before the QP they hold (destroyed with the last of them).
    sq: VerbsUdSendQueue,
    rq: VerbsRecvQueue,
    obj: backend::Qp,
    qpn: u32,
    /// The rdma-core API the QP posts with.
    api: VerbsApi,
    pd: Pd,
    cqs: [Arc<CqHandle>; 2],
    /// The queues' CQ charges, taken off them in Drop and given back when this drops,
    /// after the queues (with the last of which the QP is destroyed): see `Qp`'s.
    leaving: [Option<Leaving>; 2],
    /// Forgets the QP's events once it is destroyed (after the queues and `obj`).
    _forget: super::events::Forget,
}

impl VerbsUd {
    /// The verbs path's queues over rdma-core's UD QP `qp` (`obj`, number `qpn`, ready:
    /// INIT / RTR / RTS with its Q_Key), attached to the CQs' registries as an RC QP's are,
    /// datagrams of at most `mtu` bytes; `provider_copies` as in
    /// [`QpRings::Verbs`](crate::backend::spec::QpRings).
    pub(crate) fn assemble(
        pd: &Pd,
        (obj, qp, rxe, provider_copies, qpn): (
            backend::Qp,
            Arc<verbs::objects::Qp>,
            bool,
            bool,
            u32,
        ),
        send_cq: &Cq,
        recv_cq: &Cq,
        mtu: u32,
    ) -> VerbsUd {
        let api = qp.api();
        let mut sq = VerbsUdSendQueue::new(qp.clone(), mtu);
        // rxe's extended API: its gather lists and its `wr_complete`'s errors.
        sq.queue().set_rxe(rxe);
        let mut rq = VerbsRecvQueue::new_ud(qp);
        rq.check_against(pd.inner.regions.clone(), provider_copies);
        let (sq_shadow, rq_shadow) = (sq.shadow(), rq.shadow.clone());
        pd.inner.lifetimes.track(&sq_shadow);
        send_cq
            .handle
            .registry
            .attach(Attached::send(qpn, sq_shadow));
        recv_cq.handle.registry.attach(Attached {
            qpn,
            sq: None,
            rq: Some(rq_shadow),
            scatter: Some(rq.scatter.clone()),
            srq: None,
            invalidations: None,
        });
        sq.queue().attach_cq(send_cq.handle.registry.slots.clone());
        rq.attach_cq(recv_cq.handle.registry.slots.clone());
        VerbsUd {
            sq,
            rq,
            obj,
            qpn,
            api,
            pd: pd.clone(),
            cqs: [send_cq.handle.clone(), recv_cq.handle.clone()],
            leaving: [None, None],
            _forget: super::events::Forget::new(
                &pd.inner.dev.events,
                [Some(Subject::Qp(qpn)), None],
            ),
        }
    }

    /// The backend's QP (multicast groups).
    pub(crate) fn backend_qp(&self) -> &backend::Qp {
        &self.obj
    }

    pub(crate) fn qpn(&self) -> u32 {
        self.qpn
    }

    /// The protection domain.
    pub(crate) fn pd(&self) -> &Pd {
        &self.pd
    }

    /// The rdma-core API the sends are posted with.
    pub(crate) fn api(&self) -> VerbsApi {
        self.api
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

    /// Moves the QP to the error state (its requests flushed).
    ///
    /// # Errors
    /// [`Error::Verbs`].
    pub(crate) fn set_error(&self) -> Result<()> {
        self.obj.set_error()
    }

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
        self.pd.inner.lifetimes.reclaim();
        self.leaving = [self.sq.queue().leave_cq(), self.rq.leave_cq()];
        // As an RC QP's drop: with the CQs' lists locked, a tombstone for the number (the
        // verbs QP itself is destroyed when its last Arc, held by the queues, drops).
        super::cq::destroy_and_bury(self.cqs.each_ref().map(|c| &**c), self.qpn, || {});
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
        use crate::backend::rdma::check_source_gid;
        assert!(check_source_gid(true, Some(1), &v4).is_ok());
        assert!(matches!(
            check_source_gid(true, Some(1), &[0; 16]),
            Err(Error::InvalidParameter { value: 1, .. })
        ));
        // InfiniBand: LIDs route, a GID is optional.
        assert!(check_source_gid(false, None, &[0; 16]).is_ok());
    }
}
