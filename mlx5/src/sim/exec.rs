//! What the NIC does for one RC or DC request, from the requester's checks to the
//! responder's memory and receive: writes, reads and sends (atomics and memory-window
//! operations have files of their own).

use super::clock::rnr_timer_ns;
use super::cq::err_cqe;
use super::dma::{self, Dma};
use super::mem::Denied;
use super::port::PORT_MAX_MSG;
use super::progress::{Outcome, Wait, WaitFor};
use super::qp::Partial;
use super::qp_attr::{DcRole, QpState};
use super::state::State;
use crate::be::Be32;
use crate::cqe::{Cqe64, CqeOpcode};
use crate::request::{Access, Remote, Request, Sge};
use crate::syndrome::Syndrome;
use crate::wqe::Decoded;

/// The bytes `req` moves: the sum of its gather or scatter list (or its inline bytes); 0
/// for the requests that move no message. At most 63 entries of 32 bits fit in a WQE: the
/// sum does not overflow.
fn message_bytes(req: &Request<'_>) -> u64 {
    match req {
        Request::Write { data, .. }
        | Request::WriteImm { data, .. }
        | Request::Send { data }
        | Request::SendImm { data, .. }
        | Request::SendInv { data, .. } => data.len(),
        Request::Read { sgl, .. } => sgl.iter().map(|s| s.len as u64).sum(),
        _ => 0,
    }
}

impl State {
    /// Runs one decoded WQE of `qpn`.
    pub(crate) fn exec(&mut self, qpn: u32, d: &Decoded<'_>) -> Outcome {
        // A message longer than the port's largest (its `max_msg_sz`, a ConnectX-6's 2^30)
        // fails at the requester with a local length error before a byte is gathered, sent
        // or read (IBV_WC_LOC_LEN_ERR): nothing of it is allocated here either.
        if message_bytes(&d.request) > u64::from(PORT_MAX_MSG) {
            return Outcome::Failed(Syndrome::LocalLength);
        }
        if let Some(refused) = self.dc_admit(qpn, &d.request) {
            return refused;
        }
        let pd = self.qps[&qpn].pd;
        let solicited = d.flags.solicited;
        match d.request {
            Request::Nop => Outcome::Done(0),
            Request::Write { remote, data } | Request::WriteImm { remote, data, .. } => {
                // The requester gathers before a packet leaves: a bad local key fails here
                // whatever the responder's state.
                let bytes = match self.mem.gather(pd, &data) {
                    Ok(b) => b,
                    Err(s) => return Outcome::Failed(s),
                };
                let (ppd, peer) = match self.responder(qpn) {
                    Ok(x) => x,
                    Err(s) => return Outcome::Failed(s),
                };
                let imm = match d.request {
                    Request::WriteImm { imm, .. } => Some(imm),
                    _ => None,
                };
                if imm.is_some() && self.recv_pending(peer) == 0 {
                    // Checked before any byte moves: the responder NAKs the first packet.
                    return self.rnr(qpn, peer);
                }
                let dst = match self.remote_buf(
                    ppd,
                    peer,
                    &remote,
                    bytes.len() as u64,
                    Access::REMOTE_WRITE,
                ) {
                    Ok(p) => p,
                    Err(_) => return self.remote_fault(peer, Syndrome::RemoteAccess),
                };
                if !bytes.is_empty() {
                    // SAFETY: `dst` was checked for `bytes.len()` writable bytes at the responder.
                    unsafe { dma::write_region(dst, &bytes) };
                }
                if let Some(imm) = imm {
                    // The data went to the remote buffer; the receive only gets the immediate.
                    let len = bytes.len() as u32;
                    if let Err(o) =
                        self.deliver(qpn, peer, &[], len, CqeOpcode::RespWrImm, imm, solicited)
                    {
                        return o;
                    }
                }
                Outcome::Done(bytes.len() as u32)
            }
            Request::Read { remote, sgl } => {
                let (ppd, peer) = match self.responder(qpn) {
                    Ok(x) => x,
                    Err(s) => return Outcome::Failed(s),
                };
                let ptrs = match self.mem.scatter_ptrs(pd, sgl) {
                    Ok(p) => p,
                    Err(_) => return Outcome::Failed(Syndrome::LocalProt),
                };
                let total: u64 = sgl.iter().map(|s| s.len as u64).sum();
                let src = match self.remote_buf(ppd, peer, &remote, total, Access::REMOTE_READ) {
                    Ok(p) => p,
                    Err(_) => return self.remote_fault(peer, Syndrome::RemoteAccess),
                };
                let mut bytes = vec![0u8; total as usize];
                if total > 0 {
                    // SAFETY: `src` was checked for `total` readable bytes at the responder.
                    unsafe { dma::read_region(src, &mut bytes) };
                }
                dma::scatter(&ptrs, &bytes);
                Outcome::Done(total as u32)
            }
            Request::Send { data }
            | Request::SendImm { data, .. }
            | Request::SendInv { data, .. } => {
                let bytes = match self.mem.gather(pd, &data) {
                    Ok(b) => b,
                    Err(s) => return Outcome::Failed(s),
                };
                let peer = match self.responder(qpn) {
                    Ok((_, p)) => p,
                    Err(s) => return Outcome::Failed(s),
                };
                let (op, imm) = match d.request {
                    Request::SendImm { imm, .. } => (CqeOpcode::RespSendImm, imm),
                    Request::SendInv { rkey, .. } => {
                        if !self.invalidate_remote(peer, rkey, false) {
                            return self.remote_fault(peer, Syndrome::RemoteInvalReq);
                        }
                        (CqeOpcode::RespSendInv, rkey)
                    }
                    _ => (CqeOpcode::RespSend, 0),
                };
                let len = bytes.len() as u32;
                match self.deliver(qpn, peer, &bytes, len, op, imm, solicited) {
                    Ok(()) => {
                        // The window goes only with a send the responder accepted (not one
                        // that met an RNR NAK and will be retried).
                        if let Request::SendInv { rkey, .. } = d.request {
                            self.invalidate_remote(peer, rkey, true);
                        }
                        Outcome::Done(bytes.len() as u32)
                    }
                    Err(o) => o,
                }
            }
            Request::CompareSwap { remote, local, .. }
            | Request::FetchAdd { remote, local, .. }
            | Request::Masked { remote, local, .. } => {
                self.atomic(qpn, pd, &d.request, remote, local)
            }
            Request::LocalInvalidate { rkey } => self.local_invalidate(qpn, pd, rkey),
            Request::BindMw(b) => self.bind(qpn, pd, &b),
        }
    }

    /// The responder's PD and QPN, or a transport error when the QP is not connected.
    pub(crate) fn responder(&self, qpn: u32) -> Result<(u32, u32), Syndrome> {
        if let Some(dc) = self.dc_responder(qpn) {
            return dc;
        }
        let peer = self
            .qps
            .get(&qpn)
            .and_then(|q| q.peer)
            .ok_or(Syndrome::TransportRetryExc)?;
        let q = &self.qps[&qpn];
        if q.path.dlid != self.port.lid {
            // Sent to another port (another NIC's LID, or one no port holds): this NIC
            // runs only its own QPs, so nothing ever answers.
            return Err(Syndrome::TransportRetryExc);
        }
        let p = self.qps.get(&peer).ok_or(Syndrome::TransportRetryExc)?;
        if p.path.rq_psn != q.path.sq_psn {
            // The peer expects another first PSN: a ConnectX drops (or NAKs as out of
            // sequence) every request of this QP, none ever in sequence; the requester's
            // retries run out.
            return Err(Syndrome::TransportRetryExc);
        }
        if p.state != QpState::Rts && !self.replay {
            // A peer in error answers nothing: the requester's retries run out.
            return Err(Syndrome::TransportRetryExc);
        }
        if p.dc.is_some() || p.ud.is_some() {
            // A QP of another service type (a DCT, a DCI, a UD QP) drops an RC packet
            // silently: nothing answers (the DC key and Q_Key are never checked).
            return Err(Syndrome::TransportRetryExc);
        }
        Ok((p.pd, peer))
    }

    pub(crate) fn remote_buf(
        &self,
        pd: u32,
        peer: u32,
        r: &Remote,
        len: u64,
        right: Access,
    ) -> Result<Dma, Denied> {
        if len == 0 {
            return Ok(Dma::none()); // zero-length: no key check, no access
        }
        self.mem.remote(pd, peer, r.rkey, r.addr, len, right)
    }

    /// The responder has no receive WQE: an RNR NAK. The requester retries on a later pass,
    /// up to its `rnr_retry` (7: for ever).
    fn rnr(&mut self, qpn: u32, peer: u32) -> Outcome {
        let now = self.clock.now();
        let p = self.qps.get_mut(&peer).expect("peer");
        p.stats.rnr_naks += 1;
        // The NAK carries the responder's RNR timer (its min_rnr_timer).
        let backoff = rnr_timer_ns(p.timing.min_rnr_timer);
        let me = self.qps.get_mut(&qpn).expect("qp");
        me.rnr_tries += 1;
        let limit = me.timing.rnr_retry;
        if limit != 7 && me.rnr_tries > limit as u32 {
            return Outcome::Failed(Syndrome::RnrRetryExc);
        }
        me.wait = Some(Wait {
            until: now.saturating_add(backoff),
            kind: WaitFor::Rnr,
        });
        Outcome::Retry
    }

    /// Consumes the responder's next receive for a message of `data`, writes its CQE.
    /// `Err(outcome)` is what the requester gets.
    /// `byte_cnt` is what the CQE reports: the message length (for a write with immediate,
    /// the bytes written to memory, while `data` is empty).
    #[allow(clippy::too_many_arguments)]
    fn deliver(
        &mut self,
        qpn: u32,
        peer: u32,
        data: &[u8],
        byte_cnt: u32,
        op: CqeOpcode,
        imm: u32,
        solicited: bool,
    ) -> Result<(), Outcome> {
        let ppd = self.qps[&peer].pd;
        let mut sges = [Sge::default(); 64];
        // The rest of a message whose first packets took an SRQ WQE on an earlier pass.
        let held = match self.qps.get_mut(&peer).and_then(|p| p.partial.take()) {
            Some(mut h) if h.from == qpn => {
                if h.left > 1 {
                    h.left -= 1;
                    self.qps.get_mut(&peer).expect("peer").partial = Some(h);
                    return Err(Outcome::Partial);
                }
                sges = h.sges;
                Some((h.idx, h.n, h.srqn))
            }
            other => {
                // Another requester's message keeps its WQE (one message at a time per
                // responder: this one waits as for an RNR NAK).
                if other.is_some() {
                    self.qps.get_mut(&peer).expect("peer").partial = other;
                    return Err(self.rnr(qpn, peer));
                }
                None
            }
        };
        let (idx, n, srqn) = match held {
            Some(h) => h,
            None => {
                // Its own receive queue, or its SRQ's next WQE (`srq`).
                let Some(taken) = self.take_recv(peer, &mut sges) else {
                    return Err(self.rnr(qpn, peer));
                };
                let p = self.qps.get_mut(&peer).expect("peer");
                p.stats.recvs += 1;
                (taken.idx, taken.n, taken.srqn)
            }
        };
        let cap: u64 = sges[..n].iter().map(|s| s.len as u64).sum();
        let rcq = self.qps[&peer].recv_cq;
        let resp_err = |st: &mut State, s: Syndrome| {
            let mut e = err_cqe(s.to_u8(), peer, idx);
            e.srqn = Be32::new(srqn);
            if let Some(cq) = st.cqs.get_mut(&rcq) {
                cq.push_err(e, CqeOpcode::RespErr);
            }
            st.set_error(peer);
        };
        // Scatter-to-CQE: a send small enough for the CQE arrives inside it; the receive
        // buffers are neither written nor translated (their keys are not looked at). The
        // length check below still holds: the responder NAKs a message longer than the
        // receive, as the InfiniBand rules require. A DCT scatters only into 128-byte CQEs
        // (the kernel's `configure_responder_scat_cqe` sets `cs_res` of a DCT to
        // SCAT_DATA64 with 128-byte receive CQEs, and leaves it off otherwise).
        let dct = matches!(self.qps[&peer].dc, Some(DcRole::Dct { .. }));
        let in_cqe = op != CqeOpcode::RespWrImm
            && self.qps[&peer].caps.scatter_to_cqe
            && self
                .cqs
                .get(&rcq)
                .is_some_and(|cq| data.len() <= cq.inline_max() && (!dct || cq.cqe_size == 128));
        if !in_cqe && srqn != 0 && self.mem.fault_in(&sges[..n]) {
            // A page fault in an SRQ WQE's buffers (a dma-buf whose exporter moved it, an
            // on-demand region whose pages were invalidated), met as the NIC starts on them
            // (at a message's first packet, before the length check; again at its last if
            // the pages moved in between): a ConnectX does not wait on the SRQ's head for
            // the kernel; it completes the WQE with REMOTE_ABORTED and
            // vendor syndrome 0x93 for the driver to post again (rdma-core `cq.c`
            // `is_odp_pfault_err`), maps the pages, and the requester sends the message
            // again after an RNR NAK. The QP stays as it is.
            let mut e = err_cqe(Syndrome::RemoteAborted.to_u8(), peer, idx);
            e.vendor_err_synd = crate::cqe::VENDOR_ODP_PAGE_FAULT;
            e.srqn = Be32::new(srqn);
            if let Some(cq) = self.cqs.get_mut(&rcq) {
                cq.push_err(e, CqeOpcode::RespErr);
            }
            self.qps.get_mut(&peer).expect("peer").stats.page_faults += 1;
            return Err(self.rnr(qpn, peer));
        }
        if (data.len() as u64) > cap {
            resp_err(self, Syndrome::LocalLength);
            return Err(Outcome::Failed(Syndrome::RemoteInvalReq));
        }
        // A send longer than the path MTU into an SRQ WQE arrives in MTU-sized packets, one
        // per pass: the WQE is held from the first to the last (`Partial`).
        let packets = (byte_cnt as u64)
            .div_ceil(self.port.mtu.max(1) as u64)
            .max(1);
        // (RC QPs: a DCT reassembles the messages of many initiators at once.)
        let rc = self.qps[&peer].dc.is_none();
        if held.is_none() && rc && srqn != 0 && op != CqeOpcode::RespWrImm && packets > 1 {
            self.qps.get_mut(&peer).expect("peer").partial = Some(Box::new(Partial {
                from: qpn,
                idx,
                srqn,
                sges,
                n,
                left: packets as u32 - 1,
            }));
            return Err(Outcome::Partial);
        }
        if !in_cqe {
            let ptrs = match self.mem.scatter_ptrs(ppd, &sges[..n]) {
                Ok(p) => p,
                Err(_) => {
                    resp_err(self, Syndrome::LocalProt);
                    return Err(Outcome::Failed(Syndrome::RemoteOp));
                }
            };
            dma::scatter(&ptrs, data);
        }
        let mut c = Cqe64 {
            byte_cnt: Be32::new(byte_cnt),
            imm_inval_pkey: Be32::new(imm),
            sop_drop_qpn: Be32::new(peer),
            srqn_uidx: Be32::new(srqn),
            wqe_counter: crate::be::Be16::new(idx),
            timestamp: self.stamp(),
            ..Cqe64::default()
        };
        if dct {
            // A DCT's receive names its initiator: the DCI's number in `flags_rqpn` (what
            // libmlx5's `handle_responder` reports as `wc.src_qp`), this port's LID in
            // `slid`. (RC receives keep them zero here.)
            c.set_ud_fields(qpn, 0, false, self.port.lid, 0);
        }
        let inline = in_cqe.then_some(data);
        if !self
            .cqs
            .get_mut(&rcq)
            .is_some_and(|cq| cq.push_scattered(c, op, solicited, inline))
        {
            self.fatal(peer);
        }
        Ok(())
    }
}
