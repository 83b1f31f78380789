//! Unreliable datagram on the software NIC: UD QPs, their sends by address vector, their
//! receives with the 40-byte GRH area, Q_Keys and multicast.
//!
//! The NIC has one InfiniBand port ([`PortAttr`](super::PortAttr): a LID of its own, its
//! GID [`port_gid`](super::port_gid), an active MTU of [`DEFAULT_PORT_MTU`](super::DEFAULT_PORT_MTU) unless
//! [`NicView::set_port_mtu`](super::NicView::set_port_mtu) says otherwise). What it does, as a
//! ConnectX does:
//! - A UD QP goes RESET -> INIT (Q_Key) -> RTR -> RTS as verbs asks;
//!   [`Nic::make_ud`](super::Nic::make_ud) does it in one step. A Q_Key with the high bit set
//!   needs privilege (the kernel refuses it with `EPERM` without `CAP_NET_RAW`): the driver
//!   refuses it before it gets here.
//! - A send WQE carries the address vector ([`crate::av`]): the datagram goes to the QP
//!   `dqp` of the port the AV names (this port: `rlid` the port's LID, and with a GRH
//!   `rgid` the port's GID; any other destination is unreachable and the datagram is lost), or
//!   to every QP attached to the multicast group the AV names ([`super::mcast`]). A Q_Key
//!   in the WQE with the high bit set means "the sending QP's own Q_Key" (IBA 10.2.4).
//! - The sender completes its send successfully once the datagram left, whatever became of
//!   it: UD has no acknowledgement. A payload longer than the port's MTU fails at the sender
//!   with a local length error (`LOCAL_LENGTH`, verbs' `IBV_WC_LOC_LEN_ERR`: "a message
//!   that is greater than the maximum message size supported by the port", ibv_poll_cq(3)).
//!   A failed send moves a UD QP to the send-queue-error state ([`QpState::SqError`], IBA
//!   10.3.1 SQEr; a ConnectX's `MLX5_QP_STATE_SQER`), not to error: later sends are
//!   flushed, receives go on.
//! - At a receiver, a datagram is dropped silently (no completion, counted in
//!   [`super::QpStats::ud_drops`]) when the Q_Key differs from the QP's, when no receive is
//!   posted (UD has no RNR), or when the QP is not ready to receive. Otherwise it takes
//!   the next receive: the first 40 bytes of the buffers get the GRH (when the packet has
//!   one: the AV had the GRH bit) and the payload follows; the completion's byte count is
//!   payload + 40, `flags_rqpn` holds the source QP, SL and the GRH bit, `slid` the sender's
//!   LID. A receive shorter than payload + 40 completes with a local length error and
//!   the receiving QP goes to error.
//! - Multicast loopback: a datagram to a group the sending QP is attached to reaches the
//!   sending QP too, unless the QP was created without it (verbs
//!   `IBV_QP_CREATE_BLOCK_SELF_MCAST_LB`): mlx5's default is loopback on.

use super::dma;
use super::progress::Outcome;
use super::qp_attr::QpState;
use super::state::State;
use crate::av::Av;
use crate::be::Be32;
use crate::cqe::{Cqe64, CqeOpcode};
use crate::grh::{Grh, GRH_BYTES};
use crate::request::Sge;
use crate::syndrome::Syndrome;
use crate::wqe::decode_ud;
use zerocopy::IntoBytes;

/// Where a datagram came from, as the receiver's CQE and GRH report it.
struct Source {
    qpn: u32,
    sl: u8,
    grh: Option<Grh>,
}

impl State {
    /// Runs one UD send WQE of `qpn` (a linear copy of its blocks).
    pub(crate) fn exec_ud(&mut self, qpn: u32, wqe: &[u8]) -> Outcome {
        let mut sges = [Sge::default(); 64];
        let Some(d) = decode_ud(wqe, &mut sges) else {
            return Outcome::Failed(Syndrome::LocalQpOp);
        };
        if !d.send.dgram.av.extended() {
            // Without `MLX5_EXTENDED_UD_AV` a ConnectX reads a 16-byte compact address
            // vector and the payload at another offset (UCX sizes the segment by this bit,
            // `uct_ib_mlx5_wqe_av_size`): nothing this NIC could run as written.
            return Outcome::Failed(Syndrome::LocalQpOp);
        }
        let (pd, ctx) = match self.qps.get(&qpn) {
            Some(q) if d.qpn == qpn => match q.ud {
                Some(ctx) => (q.pd, ctx),
                None => return Outcome::Failed(Syndrome::LocalQpOp),
            },
            _ => return Outcome::Failed(Syndrome::LocalQpOp),
        };
        if d.send.data.len() > u64::from(self.port.mtu) {
            // One packet per datagram: the requester refuses a message above the MTU (and
            // so any above the port's largest, 2^31), before a byte is gathered.
            return Outcome::Failed(Syndrome::LocalLength);
        }
        let bytes = match self.mem.gather(pd, &d.send.data) {
            Ok(b) => b,
            Err(s) => return Outcome::Failed(s),
        };
        let av: Av = d.send.dgram.av;
        let qkey = if av.qkey() & 0x8000_0000 != 0 {
            ctx.qkey
        } else {
            av.qkey()
        };
        let dlid = av.rlid.get();
        let grh = av.grh_bit().then(|| {
            Grh::ud(
                av.tclass,
                av.flow_label(),
                av.hop_limit,
                self.port.gid,
                av.rgid,
                bytes.len() as u32,
                d.send.imm.is_some(),
            )
        });
        let receivers: Vec<u32> = if av.is_multicast(false) {
            self.port
                .groups
                .receivers(grh.as_ref().map(|g| &g.dgid), dlid)
                .into_iter()
                .filter(|&q| q != qpn || ctx.mcast_loopback)
                .collect()
        } else if dlid == self.port.lid && grh.as_ref().map_or(true, |g| g.dgid == self.port.gid) {
            vec![av.dqp()]
        } else {
            Vec::new() // no such port on this fabric: the datagram is lost
        };
        let src = Source {
            qpn,
            sl: av.sl(false),
            grh,
        };
        let (op, imm) = match d.send.imm {
            Some(i) => (CqeOpcode::RespSendImm, i),
            None => (CqeOpcode::RespSend, 0),
        };
        for r in receivers {
            self.ud_deliver(r, &src, &bytes, op, imm, qkey, d.flags.solicited);
        }
        Outcome::Done(bytes.len() as u32)
    }

    /// Delivers one datagram to `dst`, or drops it.
    #[allow(clippy::too_many_arguments)]
    fn ud_deliver(
        &mut self,
        dst: u32,
        src: &Source,
        data: &[u8],
        op: CqeOpcode,
        imm: u32,
        qkey: u32,
        solicited: bool,
    ) {
        let Some(p) = self.qps.get_mut(&dst) else {
            return;
        };
        let Some(ctx) = p.ud else {
            return; // not a UD QP: the packet is discarded
        };
        let ready = matches!(p.state, QpState::Rts | QpState::SqError);
        if !ready || ctx.qkey != qkey || p.rq_pending() == 0 {
            // Not ready, a Q_Key violation, or no receive (UD has no RNR): silently dropped.
            p.stats.ud_drops += 1;
            return;
        }
        let mut sges = [Sge::default(); 64];
        let n = p.peek_recv(&mut sges);
        let idx = p.rq_ci as u16;
        p.rq_ci = p.rq_ci.wrapping_add(1);
        p.stats.recvs += 1;
        let (pd, rcq) = (p.pd, p.recv_cq);
        let cap: u64 = sges[..n].iter().map(|s| s.len as u64).sum();
        let total = GRH_BYTES + data.len();
        let resp_err = |st: &mut State, s: Syndrome| {
            let e = super::cq::err_cqe(s.to_u8(), dst, idx);
            if let Some(cq) = st.cqs.get_mut(&rcq) {
                cq.push_err(e, CqeOpcode::RespErr);
            }
            st.set_error(dst);
        };
        if total as u64 > cap {
            resp_err(self, Syndrome::LocalLength);
            return;
        }
        // Always into the buffers: a ConnectX never delivers a UD receive inside the CQE
        // (the kernel sets the responder's scatter-to-CQE, `cs_res`, for RC and UC QPs
        // only: mlx5_ib `create_qp_common`), whatever the CQE size.
        let mut msg = vec![0u8; total];
        msg[GRH_BYTES..].copy_from_slice(data);
        let ptrs = match self.mem.scatter_ptrs(pd, &sges[..n]) {
            Ok(p) => p,
            Err(_) => {
                resp_err(self, Syndrome::LocalProt);
                return;
            }
        };
        match &src.grh {
            Some(g) => msg[..GRH_BYTES].copy_from_slice(g.as_bytes()),
            // No GRH: its 40 bytes are left as they were (read back, written unchanged).
            None => dma::gather_ptrs(&ptrs, &mut msg[..GRH_BYTES]),
        }
        dma::scatter(&ptrs, &msg);
        let mut c = Cqe64 {
            byte_cnt: Be32::new(total as u32),
            imm_inval_pkey: Be32::new(imm),
            sop_drop_qpn: Be32::new(dst),
            wqe_counter: crate::be::Be16::new(idx),
            timestamp: self.stamp(),
            ..Cqe64::default()
        };
        // The port has LMC 0 and one LID: the sender's source path bits (its AV's
        // `fl_mlid`) leave its SLID the port's LID, and a datagram that reached this port
        // came to the port's LID, whose path bits (`ml_path`, verbs' `dlid_path_bits`)
        // are none.
        c.set_ud_fields(src.qpn, src.sl, src.grh.is_some(), self.port.lid, 0);
        if !self
            .cqs
            .get_mut(&rcq)
            .is_some_and(|cq| cq.push_scattered(c, op, solicited, None))
        {
            self.fatal(dst);
        }
    }
}
