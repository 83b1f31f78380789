//! What the NIC does for each WQE: checks, byte moves, atomics, window binds, completions.

use super::clock::{ack_timeout_ns, rnr_timer_ns};
use super::cq::err_cqe;
use super::dma::Dma;
use super::event::AsyncEvent;
use super::mem::{Binding, Denied};
use super::order::{Kind, OrderMode, MAX_HOLD_NS};
use super::progress::{Outcome, Progress, Started, Wait, WaitFor};
use super::qp_attr::QpState;
use super::state::State;
use crate::cqe::{Cqe64, CqeOpcode};
use crate::request::{Access, BindMw, MaskedAtomic, MwType, Payload, Remote, Request, Sge};
use crate::syndrome::Syndrome;
use crate::wqe::{Decoded, MAX_MESSAGE_BYTES, MAX_WQE_BYTES};
use crate::Be32;

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
    /// Runs the WQEs of `qpn` up to its doorbell record, and its timers and held-back WQEs
    /// that are due. Returns how many WQEs and receives were handled.
    pub(crate) fn run_qp(&mut self, qpn: u32) -> usize {
        let mut n = self.flush_recvs_if_error(qpn);
        let Some(qp) = self.qps.get_mut(&qpn) else {
            return n;
        };
        if qp.state == QpState::Reset {
            return n;
        }
        let db = qp.sq_db();
        if self.threaded {
            qp.skip_doorbell_check();
        } else {
            let reg = &mut self.uars.regs[qp.reg];
            qp.check_doorbell(db, reg);
        }
        let now = self.clock.now();
        n += self.settle(qpn, |due, _| due <= now);
        loop {
            let qp = self.qps.get_mut(&qpn).expect("qp");
            let mut give_up = false;
            if qp.state == QpState::Error {
                qp.wait = None; // a QP in error waits for nothing: its WQEs are flushed
            }
            if let Some(w) = qp.wait {
                if now < w.until {
                    break;
                }
                qp.wait = None;
                if w.kind == WaitFor::Ack {
                    if qp.ack_tries >= qp.timing.retry_cnt as u32 {
                        give_up = true;
                    } else {
                        qp.ack_tries += 1;
                        qp.stats.transport_retries += 1;
                    }
                }
            }
            let pi = qp.sq_ci;
            if pi & 0xffff == db {
                break;
            }
            let (ctrl, bbs) = match qp.peek(pi, db) {
                Ok(x) => x,
                Err(ctrl) => {
                    // Not a WQE: its size is unknown, so nothing after it can be walked.
                    qp.sq_ci = (pi & !0xffff) | db;
                    qp.stats.wqes += 1;
                    n += self.settle(qpn, |_, _| true);
                    self.req_error(qpn, pi as u16, ctrl.opcode_raw(), Syndrome::LocalQpOp);
                    n += 1;
                    break;
                }
            };
            let mut buf = [0u8; MAX_WQE_BYTES];
            qp.read_blocks(pi, bbs, &mut buf);
            let state = qp.state;
            let fm = crate::ctrl::FmCeSe::from_u8(ctrl.fm_ce_se).unwrap_or_default();
            let mut sges = [Sge::default(); 64];
            let mut held = None;
            let outcome = if matches!(state, QpState::Error | QpState::SqError) {
                Outcome::Failed(Syndrome::WrFlush)
            } else if give_up {
                Outcome::Failed(Syndrome::TransportRetryExc)
            } else if qp.ud.is_some() {
                // Datagrams: no responder state, no ordering choices (sim/ud.rs).
                self.exec_ud(qpn, &buf[..bbs * 64])
            } else {
                let mut body = [0u8; MAX_WQE_BYTES];
                let wqe = &buf[..bbs * 64];
                match self.decode_wqe(qpn, wqe, &mut body, &mut sges, Some(&mut n)) {
                    Ok(d) if d.qpn == qpn => {
                        let kind = Kind::of(&d.request);
                        let fence = d.flags.fence;
                        if self.qps[&qpn].must_settle(kind, fence) {
                            n += self.settle(qpn, |_, k| kind.waits_for(fence, k));
                        }
                        if self.hold(qpn, kind, &d) {
                            held = Some(kind);
                            Outcome::Done(0)
                        } else {
                            self.exec(qpn, &d)
                        }
                    }
                    _ => Outcome::Failed(Syndrome::LocalQpOp),
                }
            };
            let qp = self.qps.get_mut(&qpn).expect("qp");
            let progress = match (outcome, held) {
                (_, Some(kind)) => {
                    qp.stats.held_back += 1;
                    let due = now.saturating_add(1 + qp.rng.next() % MAX_HOLD_NS);
                    let mut wqe = Box::new([0u8; MAX_WQE_BYTES]);
                    wqe[..bbs * 64].copy_from_slice(&buf[..bbs * 64]);
                    Progress::Held {
                        wqe,
                        len: bbs * 64,
                        kind,
                        due,
                    }
                }
                (Outcome::Retry, None) => break,
                (Outcome::Failed(Syndrome::TransportRetryExc), None) if !give_up => {
                    // No answer: send again when the local ACK timeout expires (timeout 0:
                    // never; the requester waits for ever).
                    let until = ack_timeout_ns(qp.timing.timeout)
                        .map_or(u64::MAX, |t| now.saturating_add(t));
                    qp.wait = Some(Wait {
                        until,
                        kind: WaitFor::Ack,
                    });
                    n += 1;
                    break;
                }
                (Outcome::Done(bytes), None) => Progress::Done(bytes),
                (Outcome::Failed(s), None) => Progress::Failed(s),
            };
            qp.rnr_tries = 0;
            qp.ack_tries = 0;
            qp.sq_ci = pi.wrapping_add(bbs as u32);
            qp.stats.wqes += 1;
            if matches!(progress, Progress::Failed(_)) {
                // The WQEs before a failed one complete first (held-back ones run now).
                n += self.settle(qpn, |_, _| true);
            }
            self.record(
                qpn,
                Started {
                    pi,
                    opcode: ctrl.opcode_raw(),
                    signaled: fm.completion.signals_success(),
                    progress,
                },
            );
            n += 1;
        }
        n
    }

    /// Whether the ordering mode holds this WQE back (a read or atomic the responder
    /// accepts, a key operation that will succeed; on a coin of the QP's generator).
    fn hold(&mut self, qpn: u32, kind: Kind, d: &Decoded<'_>) -> bool {
        if !matches!(self.order, OrderMode::Relaxed { .. }) {
            return false;
        }
        let ok = match kind {
            Kind::ReadLike => self.read_like_ok(qpn, d),
            Kind::KeyOp => self.key_op_ok(qpn, d),
            Kind::Other => false,
        };
        ok && self.qps.get_mut(&qpn).expect("qp").rng.next() & 1 == 1
    }

    /// Whether a read or atomic passes every check of its turn (responder state, local and
    /// remote keys, bounds, rights, alignment): only its data are read late.
    fn read_like_ok(&self, qpn: u32, d: &Decoded<'_>) -> bool {
        if self.dc_refusal(qpn, &d.request).is_some() {
            return false;
        }
        let pd = self.qps[&qpn].pd;
        let Ok((ppd, peer)) = self.responder(qpn) else {
            return false;
        };
        match d.request {
            Request::Read { remote, sgl } => {
                let total: u64 = sgl.iter().map(|s| s.len as u64).sum();
                total <= MAX_MESSAGE_BYTES
                    && self.scatter_ptrs(pd, sgl).is_ok()
                    && self
                        .remote_buf(ppd, peer, &remote, total, Access::REMOTE_READ)
                        .is_ok()
            }
            Request::CompareSwap { remote, local, .. }
            | Request::FetchAdd { remote, local, .. }
            | Request::Masked { remote, local, .. } => {
                let (size, supported) = match d.request {
                    Request::Masked { op, .. } => (op.size() as u64, self.atomics.masked),
                    _ => (8, self.atomics.standard),
                };
                supported
                    && remote.addr % size == 0
                    && self
                        .mem
                        .local(pd, local.lkey, local.addr, size, true)
                        .is_ok()
                    && self
                        .mem
                        .remote(
                            ppd,
                            peer,
                            remote.rkey,
                            remote.addr,
                            size,
                            Access::REMOTE_ATOMIC,
                        )
                        .is_ok()
            }
            _ => false,
        }
    }

    /// Whether a bind or local invalidate would succeed now.
    fn key_op_ok(&self, qpn: u32, d: &Decoded<'_>) -> bool {
        let pd = self.qps[&qpn].pd;
        match d.request {
            Request::BindMw(b) => self.bind_check(qpn, pd, &b).is_ok(),
            Request::LocalInvalidate { rkey } => self.local_invalidate_check(qpn, pd, rkey),
            _ => false,
        }
    }

    /// Runs the held-back WQEs of `qpn` that `pick(due, kind)` selects (every one when the
    /// QP is in error: they are flushed), in order, then writes the completions that are
    /// no longer behind a held-back WQE. Returns how many ran.
    pub(crate) fn settle(&mut self, qpn: u32, pick: impl Fn(u64, Kind) -> bool) -> usize {
        let Some(qp) = self.qps.get(&qpn) else {
            return 0;
        };
        let in_error = qp.state == QpState::Error;
        let picks: Vec<usize> = qp
            .started
            .iter()
            .enumerate()
            .filter_map(|(i, s)| match &s.progress {
                Progress::Held { due, kind, .. } if in_error || pick(*due, *kind) => Some(i),
                _ => None,
            })
            .collect();
        for &i in &picks {
            let qp = self.qps.get_mut(&qpn).expect("qp");
            // After a failure every later WQE is flushed.
            let flush = qp.state == QpState::Error
                || qp
                    .started
                    .iter()
                    .take(i)
                    .any(|s| matches!(s.progress, Progress::Failed(_)));
            let Progress::Held { wqe, len, .. } =
                std::mem::replace(&mut qp.started[i].progress, Progress::Done(0))
            else {
                continue;
            };
            let progress = if flush {
                Progress::Failed(Syndrome::WrFlush)
            } else {
                let mut sges = [Sge::default(); 64];
                let mut body = [0u8; MAX_WQE_BYTES];
                match self.decode_wqe(qpn, &wqe[..len], &mut body, &mut sges, None) {
                    Ok(d) => {
                        self.replay = true;
                        let o = self.exec(qpn, &d);
                        self.replay = false;
                        match o {
                            Outcome::Done(b) => Progress::Done(b),
                            Outcome::Failed(s) => Progress::Failed(s),
                            Outcome::Retry => Progress::Failed(Syndrome::RnrRetryExc),
                        }
                    }
                    Err(_) => Progress::Failed(Syndrome::LocalQpOp),
                }
            };
            if let Some(qp) = self.qps.get_mut(&qpn) {
                qp.started[i].progress = progress;
            }
        }
        self.write_out(qpn);
        picks.len()
    }

    /// Records a started WQE: its completion is written now, or queued behind a held-back
    /// WQE before it (completions go in order).
    fn record(&mut self, qpn: u32, s: Started) {
        let qp = self.qps.get_mut(&qpn).expect("qp");
        if qp.started.is_empty() && !matches!(s.progress, Progress::Held { .. }) {
            self.complete(qpn, s, false);
        } else {
            qp.started.push_back(s);
            self.write_out(qpn);
        }
    }

    /// Writes the completions at the head of the started queue up to the first held-back WQE.
    fn write_out(&mut self, qpn: u32) {
        loop {
            let Some(qp) = self.qps.get_mut(&qpn) else {
                return;
            };
            match qp.started.front() {
                Some(s) if !matches!(s.progress, Progress::Held { .. }) => {}
                _ => return,
            }
            let s = qp.started.pop_front().expect("front");
            self.complete(qpn, s, true);
        }
    }

    /// Writes the completion of a WQE that ran (a flush instead of a success when
    /// `flush_if_error` and the QP went to error meanwhile).
    fn complete(&mut self, qpn: u32, s: Started, flush_if_error: bool) {
        let Some(qp) = self.qps.get_mut(&qpn) else {
            return;
        };
        let pi = s.pi;
        match s.progress {
            Progress::Done(_) if flush_if_error && qp.state == QpState::Error => {
                self.req_error(qpn, pi as u16, s.opcode, Syndrome::WrFlush);
            }
            Progress::Done(bytes) => {
                if s.signaled {
                    let c = Cqe64 {
                        sop_drop_qpn: Be32::new((s.opcode as u32) << 24 | qpn),
                        wqe_counter: crate::Be16::new(pi as u16),
                        byte_cnt: Be32::new(bytes),
                        ..Cqe64::default()
                    };
                    let cq = qp.send_cq;
                    if !self
                        .cqs
                        .get_mut(&cq)
                        .is_some_and(|cq| cq.push(c, CqeOpcode::Req, false))
                    {
                        self.fatal(qpn);
                    }
                }
            }
            Progress::Failed(syn) => self.req_error(qpn, pi as u16, s.opcode, syn),
            Progress::Held { .. } => {}
        }
    }

    /// Writes a requester error CQE and moves the QP to error (a UD QP's send queue only:
    /// [`QpState::SqError`]).
    fn req_error(&mut self, qpn: u32, pi: u16, opcode: u8, s: Syndrome) {
        let Some(qp) = self.qps.get_mut(&qpn) else {
            return;
        };
        qp.state = match qp.state {
            QpState::Rts | QpState::SqError if qp.ud.is_some() => QpState::SqError,
            _ => QpState::Error,
        };
        let cq = qp.send_cq;
        let e = err_cqe(s.to_u8(), (opcode as u32) << 24 | qpn, pi);
        if let Some(cq) = self.cqs.get_mut(&cq) {
            cq.push_err(e, CqeOpcode::ReqErr);
        }
    }

    /// Moves a QP to error (its WQEs and receives are flushed from now on).
    pub(crate) fn set_error(&mut self, qpn: u32) {
        // A DCT serves every initiator: one initiator's fault does not stop it.
        if self.is_dct(qpn) {
            return;
        }
        if let Some(qp) = self.qps.get_mut(&qpn) {
            qp.state = QpState::Error;
        }
    }

    /// Gathers the bytes of a payload from local memory.
    pub(super) fn gather(&self, pd: u32, p: &Payload<'_>) -> Result<Vec<u8>, Syndrome> {
        match p {
            Payload::Inline(b) => Ok(b.to_vec()),
            Payload::Sgl(sgl) => {
                let mut out = Vec::new();
                for s in sgl.iter() {
                    let src = self
                        .mem
                        .local(pd, s.lkey, s.addr, s.len as u64, false)
                        .map_err(|_| Syndrome::LocalProt)?;
                    let at = out.len();
                    out.resize(at + s.len as usize, 0);
                    // SAFETY: `src .. src + len` was checked to lie inside a registered region.
                    unsafe { super::dma::read_region(src, &mut out[at..]) };
                }
                Ok(out)
            }
        }
    }

    /// Checks a scatter list for local writes; returns host pointers.
    pub(super) fn scatter_ptrs(&self, pd: u32, sgl: &[Sge]) -> Result<Vec<(Dma, usize)>, Denied> {
        sgl.iter()
            .map(|s| {
                self.mem
                    .local(pd, s.lkey, s.addr, s.len as u64, true)
                    .map(|p| (p, s.len as usize))
            })
            .collect()
    }

    pub(super) fn scatter(ptrs: &[(Dma, usize)], mut data: &[u8]) {
        for &(p, len) in ptrs {
            let k = len.min(data.len());
            // SAFETY: every pointer was checked by `scatter_ptrs` for `len` writable bytes.
            unsafe { super::dma::write_region(p, &data[..k]) };
            data = &data[k..];
        }
    }

    /// The responder's PD and QPN, or a transport error when the QP is not connected.
    fn responder(&self, qpn: u32) -> Result<(u32, u32), Syndrome> {
        if let Some(dc) = self.dc_responder(qpn) {
            return dc;
        }
        let peer = self
            .qps
            .get(&qpn)
            .and_then(|q| q.peer)
            .ok_or(Syndrome::TransportRetryExc)?;
        let p = self.qps.get(&peer).ok_or(Syndrome::TransportRetryExc)?;
        if p.state != QpState::Rts && !self.replay {
            // A peer in error answers nothing: the requester's retries run out.
            return Err(Syndrome::TransportRetryExc);
        }
        Ok((p.pd, peer))
    }

    /// A class-C responder error: the responder QP goes to error too.
    fn remote_fault(&mut self, peer: u32, s: Syndrome) -> Outcome {
        self.error_with(peer, AsyncEvent::QpAccessError { qpn: peer });
        Outcome::Failed(s)
    }

    /// A QP whose completion did not fit in its CQ goes to error with a QP-fatal event.
    pub(super) fn fatal(&mut self, qpn: u32) {
        self.error_with(qpn, AsyncEvent::QpFatal { qpn });
    }

    /// Moves `qpn` to error, raising `event` when it was not in error already.
    fn error_with(&mut self, qpn: u32, event: AsyncEvent) {
        if self
            .qps
            .get(&qpn)
            .is_some_and(|q| q.state != QpState::Error)
        {
            self.events.push_back(event);
        }
        self.set_error(qpn);
    }

    fn remote_buf(
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
        // Its own receive queue, or its SRQ's next WQE (`srq`).
        let Some(taken) = self.take_recv(peer, &mut sges) else {
            return Err(self.rnr(qpn, peer));
        };
        let (idx, n, srqn) = (taken.idx, taken.n, taken.srqn);
        let cap: u64 = sges[..n].iter().map(|s| s.len as u64).sum();
        let p = self.qps.get_mut(&peer).expect("peer");
        p.stats.recvs += 1;
        let rcq = p.recv_cq;
        let resp_err = |st: &mut State, s: Syndrome| {
            let mut e = err_cqe(s.to_u8(), peer, idx);
            e.srqn = Be32::new(srqn);
            if let Some(cq) = st.cqs.get_mut(&rcq) {
                cq.push_err(e, CqeOpcode::RespErr);
            }
            st.set_error(peer);
        };
        if (data.len() as u64) > cap {
            resp_err(self, Syndrome::LocalLength);
            return Err(Outcome::Failed(Syndrome::RemoteInvalReq));
        }
        // Scatter-to-CQE: a send small enough for the CQE arrives inside it; the receive
        // buffers are neither written nor translated (their keys are not looked at). The
        // length check above still holds: the responder NAKs a message longer than the
        // receive, as the InfiniBand rules require.
        let in_cqe = op != CqeOpcode::RespWrImm
            && self.qps[&peer].caps.scatter_to_cqe
            && self
                .cqs
                .get(&rcq)
                .is_some_and(|cq| data.len() <= cq.inline_max());
        if !in_cqe {
            let ptrs = match self.scatter_ptrs(ppd, &sges[..n]) {
                Ok(p) => p,
                Err(_) => {
                    resp_err(self, Syndrome::LocalProt);
                    return Err(Outcome::Failed(Syndrome::RemoteOp));
                }
            };
            Self::scatter(&ptrs, data);
        }
        let c = Cqe64 {
            byte_cnt: Be32::new(byte_cnt),
            imm_inval_pkey: Be32::new(imm),
            sop_drop_qpn: Be32::new(peer),
            srqn_uidx: Be32::new(srqn),
            wqe_counter: crate::Be16::new(idx),
            ..Cqe64::default()
        };
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

    /// Runs one decoded WQE of `qpn`.
    pub(crate) fn exec(&mut self, qpn: u32, d: &Decoded<'_>) -> Outcome {
        // A message longer than the port's largest (a ConnectX's `max_msg_sz`, 2^31) fails
        // at the requester with a local length error before a byte is gathered, sent or
        // read (IBV_WC_LOC_LEN_ERR): nothing of it is allocated here either.
        if message_bytes(&d.request) > MAX_MESSAGE_BYTES {
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
                let (ppd, peer) = match self.responder(qpn) {
                    Ok(x) => x,
                    Err(s) => return Outcome::Failed(s),
                };
                let bytes = match self.gather(pd, &data) {
                    Ok(b) => b,
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
                    unsafe { super::dma::write_region(dst, &bytes) };
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
                let ptrs = match self.scatter_ptrs(pd, sgl) {
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
                    unsafe { super::dma::read_region(src, &mut bytes) };
                }
                Self::scatter(&ptrs, &bytes);
                Outcome::Done(total as u32)
            }
            Request::Send { data }
            | Request::SendImm { data, .. }
            | Request::SendInv { data, .. } => {
                let peer = match self.responder(qpn) {
                    Ok((_, p)) => p,
                    Err(s) => return Outcome::Failed(s),
                };
                let bytes = match self.gather(pd, &data) {
                    Ok(b) => b,
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

    fn atomic(
        &mut self,
        qpn: u32,
        pd: u32,
        req: &Request<'_>,
        remote: Remote,
        local: Sge,
    ) -> Outcome {
        let (size, supported) = match req {
            Request::Masked { op, .. } => (op.size() as usize, self.atomics.masked),
            _ => (8, self.atomics.standard),
        };
        if !supported {
            // The device cannot run this opcode: the requester fails it locally.
            return Outcome::Failed(Syndrome::LocalQpOp);
        }
        let (ppd, peer) = match self.responder(qpn) {
            Ok(x) => x,
            Err(s) => return Outcome::Failed(s),
        };
        let dst = match self
            .mem
            .local(pd, local.lkey, local.addr, size as u64, true)
        {
            Ok(p) => p,
            Err(_) => return Outcome::Failed(Syndrome::LocalProt),
        };
        if remote.addr % size as u64 != 0 {
            return self.remote_fault(peer, Syndrome::RemoteInvalReq);
        }
        let target = match self.mem.remote(
            ppd,
            peer,
            remote.rkey,
            remote.addr,
            size as u64,
            Access::REMOTE_ATOMIC,
        ) {
            Ok(p) => p,
            Err(_) => return self.remote_fault(peer, Syndrome::RemoteAccess),
        };
        let mut old = [0u8; 8];
        // SAFETY: `target` was checked for `size` bytes with atomic rights.
        unsafe { super::dma::read_region(target, &mut old[..size]) };
        let new: Option<[u8; 8]> = match *req {
            Request::CompareSwap { compare, swap, .. } => {
                (u64::from_ne_bytes(old) == compare).then(|| swap.to_ne_bytes())
            }
            Request::FetchAdd { add, .. } => {
                Some(u64::from_ne_bytes(old).wrapping_add(add).to_ne_bytes())
            }
            Request::Masked { op, .. } => masked(op, old),
            _ => None,
        };
        if let Some(new) = new {
            // SAFETY: as above.
            unsafe { super::dma::write_region(target, &new[..size]) };
        }
        // The reply in the device's byte order (big-endian for 4 bytes, and for 8 in
        // `atomic_req_8B_endianness_mode` 0); the target memory is operated on in host order.
        let value = if size == 4 {
            u32::from_ne_bytes([old[0], old[1], old[2], old[3]]) as u64
        } else {
            u64::from_ne_bytes(old)
        };
        let reply = self.atomics.reply_bytes(value, size);
        // SAFETY: `dst` was checked for `size` locally writable bytes.
        unsafe { super::dma::write_region(dst, &reply[..size]) };
        Outcome::Done(size as u32)
    }

    /// Invalidates a type-2 window of the responder by a send with invalidate.
    /// Whether it may (`doit` false), or does (`doit` true).
    fn invalidate_remote(&mut self, peer: u32, rkey: u32, doit: bool) -> bool {
        let pd = self.qps[&peer].pd;
        match self.mem.mws.get_mut(&(rkey >> 8)) {
            Some(w) if w.rkey == rkey && w.pd == pd && w.mw_type == MwType::Two => {
                w.bound.as_ref().is_some_and(|b| b.qpn == peer) && {
                    if doit {
                        w.bound = None;
                    }
                    true
                }
            }
            _ => false,
        }
    }

    /// Whether a local invalidate of `rkey` by `qpn` may run: a type-2 window of this PD
    /// bound through this QP.
    fn local_invalidate_check(&self, qpn: u32, pd: u32, rkey: u32) -> bool {
        self.mem.mws.get(&(rkey >> 8)).is_some_and(|w| {
            w.rkey == rkey
                && w.pd == pd
                && w.mw_type == MwType::Two
                && w.bound.as_ref().is_some_and(|b| b.qpn == qpn)
        })
    }

    fn local_invalidate(&mut self, qpn: u32, pd: u32, rkey: u32) -> Outcome {
        if !self.local_invalidate_check(qpn, pd, rkey) {
            return Outcome::Failed(Syndrome::MwBind);
        }
        if let Some(w) = self.mem.mws.get_mut(&(rkey >> 8)) {
            w.bound = None;
        }
        Outcome::Done(0)
    }

    /// The checks of a bind: the region's key for a bind, None for an unbind; Err when the
    /// bind fails (`MW_BIND`).
    fn bind_check(&self, qpn: u32, pd: u32, b: &BindMw) -> Result<Option<u32>, ()> {
        let w = self.mem.mws.get(&(b.mw_rkey >> 8)).ok_or(())?;
        if w.rkey != b.mw_rkey || w.pd != pd || w.mw_type != b.mw_type {
            return Err(());
        }
        if b.len == 0 {
            // An unbind. Type 2 carries CHECK_QPN (rdma-core `set_umr_control_seg`): the
            // window must be bound, and through this QP.
            if w.mw_type == MwType::Two && !w.bound.as_ref().is_some_and(|x| x.qpn == qpn) {
                return Err(());
            }
            return Ok(None);
        }
        if w.mw_type == MwType::Two && w.bound.is_some() {
            return Err(()); // CHECK_FREE: a bound type-2 window must be invalidated first
        }
        if w.mw_type == MwType::One && b.access.contains(Access::ZERO_BASED) {
            return Err(()); // type-1 windows are never zero-based (rdma-core mlx5_bind_mw: EINVAL)
        }
        let mr = self
            .mem
            .mrs
            .get(&(b.mr_lkey >> 8))
            .filter(|m| m.key == b.mr_lkey)
            .ok_or(())?;
        let rights = b.access;
        let needs_lw =
            rights.contains(Access::REMOTE_WRITE) || rights.contains(Access::REMOTE_ATOMIC);
        if mr.pd != pd
            || !mr.access.contains(Access::MW_BIND)
            || (needs_lw && !mr.access.contains(Access::LOCAL_WRITE))
            || b.addr < mr.addr
            || b.addr.saturating_add(b.len) > mr.addr + mr.len
        {
            return Err(());
        }
        Ok(Some(mr.key))
    }

    fn bind(&mut self, qpn: u32, pd: u32, b: &BindMw) -> Outcome {
        let Ok(mr_key) = self.bind_check(qpn, pd, b) else {
            return Outcome::Failed(Syndrome::MwBind);
        };
        let w = self.mem.mws.get_mut(&(b.mw_rkey >> 8)).expect("checked");
        w.rkey = b.new_rkey;
        w.bound = mr_key.map(|mr_key| Binding {
            mr_key,
            addr: b.addr,
            len: b.len,
            access: b.access,
            zero_based: b.access.contains(Access::ZERO_BASED),
            qpn,
        });
        Outcome::Done(0)
    }
}

/// New value of a masked atomic on `old` (host order), or None when a compare fails.
fn masked(op: MaskedAtomic, old: [u8; 8]) -> Option<[u8; 8]> {
    let o32 = u32::from_ne_bytes([old[0], old[1], old[2], old[3]]);
    let o64 = u64::from_ne_bytes(old);
    let w32 = |v: u32| {
        let mut b = [0u8; 8];
        b[..4].copy_from_slice(&v.to_ne_bytes());
        b
    };
    match op {
        MaskedAtomic::Cs32 {
            swap,
            compare,
            swap_mask,
            compare_mask,
        } => ((o32 & compare_mask) == (compare & compare_mask))
            .then(|| w32((o32 & !swap_mask) | (swap & swap_mask))),
        MaskedAtomic::Cs64 {
            swap,
            compare,
            swap_mask,
            compare_mask,
        } => ((o64 & compare_mask) == (compare & compare_mask))
            .then(|| ((o64 & !swap_mask) | (swap & swap_mask)).to_ne_bytes()),
        MaskedAtomic::Fa32 {
            add,
            field_boundary,
        } => Some(w32(
            field_add(o32 as u64, add as u64, field_boundary as u64, 32) as u32,
        )),
        MaskedAtomic::Fa64 {
            add,
            field_boundary,
        } => Some(field_add(o64, add, field_boundary, 64).to_ne_bytes()),
    }
}

/// Adds field by field: a set bit in `boundary` ends a field (no carry out of that bit).
pub(crate) fn field_add(a: u64, b: u64, boundary: u64, bits: u32) -> u64 {
    let mut out = 0u64;
    let mut carry = 0u64;
    for i in 0..bits {
        let s = ((a >> i) & 1) + ((b >> i) & 1) + carry;
        out |= (s & 1) << i;
        carry = if (boundary >> i) & 1 == 1 { 0 } else { s >> 1 };
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_add_stops_carries_at_boundaries() {
        assert_eq!(field_add(0xff, 1, 0, 64), 0x100);
        assert_eq!(field_add(0xff, 1, 0x80, 64), 0x00);
        assert_eq!(
            field_add(0x00ff_00ff, 0x0001_0001, 0x0080_0080, 32),
            0x0000_0000
        );
        assert_eq!(field_add(u64::MAX, 1, 0, 64), 0);
    }

    #[test]
    fn masked_compare_swap() {
        let old = 0x1234u64.to_ne_bytes();
        let op = MaskedAtomic::Cs64 {
            swap: 0xff00,
            compare: 0x34,
            swap_mask: 0xff00,
            compare_mask: 0xff,
        };
        assert_eq!(masked(op, old), Some(0xff34u64.to_ne_bytes()));
        let op = MaskedAtomic::Cs64 {
            swap: 0xff00,
            compare: 0x35,
            swap_mask: 0xff00,
            compare_mask: 0xff,
        };
        assert_eq!(masked(op, old), None);
    }
}
