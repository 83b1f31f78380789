//! How the NIC runs a QP's send queue: WQE by WQE up to the doorbell record, with the
//! transport timers, the requests the ordering mode holds back, and completions in order.

use super::clock::ack_timeout_ns;
use super::order::{Kind, OrderMode, MAX_HOLD_NS};
use super::progress::{Outcome, Progress, Started, Wait, WaitFor};
use super::qp_attr::QpState;
use super::state::State;
use crate::be::Be32;
use crate::cqe::{Cqe64, CqeOpcode};
use crate::request::{Access, Request, Sge};
use crate::syndrome::Syndrome;
use crate::wqe::{Decoded, MAX_WQE_BYTES};

impl State {
    /// Runs the WQEs of `qpn` up to its doorbell record, and its timers and held-back WQEs
    /// that are due. Returns how many WQEs and receives were handled.
    pub(crate) fn run_qp(&mut self, qpn: u32) -> usize {
        let mut n = self.flush_recvs_if_error(qpn);
        let Some(qp) = self.qps.get_mut(&qpn) else {
            return n;
        };
        if matches!(qp.state, QpState::Reset | QpState::Init) {
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
                (Outcome::Partial, None) => {
                    // Work was done (a packet went): the pass counts it, and the WQE goes on
                    // from the head of the queue on the next pass.
                    n += 1;
                    break;
                }
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
                total <= u64::from(super::port::PORT_MAX_MSG)
                    && self.mem.scatter_ptrs(pd, sgl).is_ok()
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
                            // Only reads, atomics and key operations are held back; a send's
                            // packets never replay here.
                            Outcome::Partial => Progress::Failed(Syndrome::LocalQpOp),
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
        let timestamp = self.stamp();
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
                        wqe_counter: crate::be::Be16::new(pi as u16),
                        byte_cnt: Be32::new(bytes),
                        timestamp,
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
}
