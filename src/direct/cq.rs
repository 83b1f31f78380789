//! The completion queue of the direct path: owner bit, read barrier, decode, cookie from the
//! shadow table, consumer index.

use super::barrier;
use super::shadow::{SendEntry, Shadow};
use crate::completion::{Completion, WcOpcode};
use crate::error::{Error, Result};
use core::sync::atomic::{AtomicU32, AtomicU8, Ordering};
use mlx5::cqe::{cqe64_offset, is_sw_owned, Cqe64, CqeOpcode};
use mlx5::doorbell::CQ_SET_CI;
use mlx5::{RawCq, WcStatus};
use std::sync::{Arc, Mutex};

/// The queues whose completions arrive on one CQ, by QP number.
#[derive(Clone)]
pub(crate) struct Attached {
    pub(crate) qpn: u32,
    pub(crate) sq: Option<Arc<Shadow<SendEntry>>>,
    pub(crate) rq: Option<Arc<Shadow<u64>>>,
}

/// The list of attached queues, shared between a CQ and the QPs that use it. Changing it
/// bumps a generation the poller checks with one load; it re-reads the list (under the lock)
/// only then, never on the hot path.
#[derive(Default)]
pub(crate) struct Registry {
    pub(crate) gen: AtomicU32,
    pub(crate) list: Mutex<Vec<Attached>>,
}

impl Registry {
    pub(crate) fn attach(&self, a: Attached) {
        let mut l = self.list.lock().unwrap_or_else(|e| e.into_inner());
        match l.iter_mut().find(|x| x.qpn == a.qpn) {
            Some(x) => {
                x.sq = x.sq.take().or(a.sq);
                x.rq = x.rq.take().or(a.rq);
            }
            None => l.push(a),
        }
        self.gen.fetch_add(1, Ordering::Release);
    }

    /// The current list, and the generation it belongs to, if it changed since `seen`.
    #[cold]
    pub(crate) fn snapshot_if_changed(&self, seen: u32) -> Option<(Vec<Attached>, u32)> {
        let gen = self.gen.load(Ordering::Acquire);
        if gen == seen {
            return None;
        }
        Some((
            self.list.lock().unwrap_or_else(|e| e.into_inner()).clone(),
            gen,
        ))
    }

    pub(crate) fn detach(&self, qpn: u32) {
        self.list
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|x| x.qpn != qpn);
        self.gen.fetch_add(1, Ordering::Release);
    }
}

/// A completion queue on the direct path.
pub struct CompletionQueue {
    buf: *const u8,
    cnt: u32,
    /// log2 of the entry size (6 or 7).
    shift: u32,
    off64: usize,
    dbrec: *mut u32,
    ci: u32,
    cqn: u32,
    pub(crate) registry: Arc<Registry>,
    cache: Vec<Attached>,
    gen: u32,
}

// SAFETY: the pointers are to the CQ's ring and record, which this poller alone reads and
// updates (constructor contract).
unsafe impl Send for CompletionQueue {}

impl core::fmt::Debug for CompletionQueue {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("CompletionQueue")
            .field("cqn", &self.cqn)
            .field("entries", &self.cnt)
            .field("ci", &self.ci)
            .finish()
    }
}

impl CompletionQueue {
    /// A poller over the ring of `raw`.
    ///
    /// # Safety
    /// `raw` must describe a live CQ (ring of `cqe_cnt` entries of `cqe_size` bytes, doorbell
    /// record) that stays alive while the poller exists and that nobody else polls.
    pub unsafe fn new(raw: &RawCq) -> Result<CompletionQueue> {
        if !raw.cqe_cnt.is_power_of_two() || !(raw.cqe_size == 64 || raw.cqe_size == 128) {
            return Err(Error::InvalidParameter {
                what: "CQ size",
                value: raw.cqe_cnt as u64,
            });
        }
        Ok(CompletionQueue {
            buf: raw.buf,
            cnt: raw.cqe_cnt,
            shift: raw.cqe_size.trailing_zeros(),
            off64: cqe64_offset(raw.cqe_size as usize),
            dbrec: raw.dbrec,
            ci: 0,
            cqn: raw.cqn,
            registry: Arc::new(Registry::default()),
            cache: Vec::new(),
            gen: u32::MAX,
        })
    }

    /// The CQ number.
    pub fn cqn(&self) -> u32 {
        self.cqn
    }

    /// Entries in the ring.
    pub fn capacity(&self) -> u32 {
        self.cnt
    }

    #[cold]
    fn refresh(&mut self) {
        if let Some((list, gen)) = self.registry.snapshot_if_changed(self.gen) {
            (self.cache, self.gen) = (list, gen);
        }
    }

    #[inline(always)]
    fn find(&self, qpn: u32) -> Option<&Attached> {
        self.cache.iter().find(|a| a.qpn == qpn)
    }

    /// The 64-byte CQE at the consumer index.
    #[inline(always)]
    fn slot(&self) -> *const u8 {
        self.buf
            .wrapping_add((((self.ci & (self.cnt - 1)) as usize) << self.shift) + self.off64)
    }

    /// The owner byte of the CQE at the consumer index.
    #[inline(always)]
    fn op_own(&self) -> u8 {
        // SAFETY: `slot()` is a 64-byte entry inside the live ring (constructor contract); its
        // last byte is read atomically because the device writes it concurrently.
        unsafe { (*(self.slot().add(63) as *const AtomicU8)).load(Ordering::Acquire) }
    }

    /// Polls up to `out.len()` completions into `out`; returns how many. Never blocks.
    ///
    /// The empty case is a handful of instructions inlined at the call site: one load of the
    /// next entry's owner byte.
    #[inline(always)]
    pub fn poll(&mut self, out: &mut [Completion]) -> usize {
        if !is_sw_owned(self.op_own(), self.ci, self.cnt) {
            return 0;
        }
        self.poll_some(out)
    }

    /// The rest of [`CompletionQueue::poll`], once an entry is there.
    fn poll_some(&mut self, out: &mut [Completion]) -> usize {
        if self.registry.gen.load(Ordering::Acquire) != self.gen {
            self.refresh();
        }
        let mut n = 0;
        let mut consumed = false;
        while n < out.len() {
            let slot = self.slot();
            let op_own = self.op_own();
            if !is_sw_owned(op_own, self.ci, self.cnt) {
                break;
            }
            // The owner byte is read before the rest of the entry.
            barrier::from_device();
            // SAFETY: the entry is software's now: the device does not write it again until
            // the consumer index passes it, so a shared view is sound; Cqe64 has alignment 1.
            let cqe = unsafe { &*(slot as *const Cqe64) };
            self.ci = self.ci.wrapping_add(1);
            consumed = true;
            if let Some(c) = self.complete(cqe, op_own >> 4) {
                out[n] = c;
                n += 1;
            }
        }
        if consumed {
            // SAFETY: `dbrec` is the CQ's live aligned record (constructor contract).
            unsafe {
                (*(self.dbrec.add(CQ_SET_CI) as *const AtomicU32))
                    .store((self.ci & 0xff_ffff).to_be(), Ordering::Release)
            };
        }
        n
    }

    /// Turns one CQE into a completion (None: a moderation CQE the user did not ask for).
    #[inline(always)]
    fn complete(&self, cqe: &Cqe64, opcode: u8) -> Option<Completion> {
        let qpn = cqe.qpn();
        let wqe = cqe.wqe_counter.get();
        let q = self.find(qpn);
        if opcode == CqeOpcode::Req as u8 {
            let sq = q?.sq.as_ref()?;
            let e = sq.get(wqe);
            sq.retire(e.end);
            if !e.report {
                return None;
            }
            return Some(Completion {
                cookie: e.cookie,
                opcode: e.opcode,
                byte_len: e.byte_len,
                qpn,
                ..Completion::default()
            });
        }
        self.complete_other(cqe, opcode, q, qpn, wqe)
    }

    #[inline]
    fn complete_other(
        &self,
        cqe: &Cqe64,
        opcode: u8,
        q: Option<&Attached>,
        qpn: u32,
        wqe: u16,
    ) -> Option<Completion> {
        let mut c = Completion {
            qpn,
            ..Completion::default()
        };
        match CqeOpcode::from_bits(opcode) {
            Some(
                op @ (CqeOpcode::RespSend
                | CqeOpcode::RespSendImm
                | CqeOpcode::RespWrImm
                | CqeOpcode::RespSendInv),
            ) => {
                let rq = q?.rq.as_ref()?;
                c.cookie = rq.get(wqe);
                rq.retire(wqe.wrapping_add(1));
                c.byte_len = cqe.byte_cnt.get();
                c.opcode = if op == CqeOpcode::RespWrImm {
                    WcOpcode::RecvRdmaWithImm
                } else {
                    WcOpcode::Recv
                };
                if op != CqeOpcode::RespSend {
                    c.imm = Some(cqe.imm_inval_pkey.get());
                }
            }
            Some(CqeOpcode::ReqErr) => {
                let e = cqe.as_err();
                let sq = q?.sq.as_ref()?;
                let s = sq.get(e.wqe_counter.get());
                sq.retire(s.end);
                c.qpn = e.qpn();
                c.cookie = s.cookie;
                c.opcode = s.opcode;
                c.status = e.syndrome().wc_status();
                c.syndrome = Some((e.syndrome, e.vendor_err_synd));
            }
            Some(CqeOpcode::RespErr) => {
                let e = cqe.as_err();
                c.qpn = e.qpn();
                let rq = q?.rq.as_ref()?;
                let w = e.wqe_counter.get();
                c.cookie = rq.get(w);
                rq.retire(w.wrapping_add(1));
                c.opcode = WcOpcode::Recv;
                c.status = e.syndrome().wc_status();
                c.syndrome = Some((e.syndrome, e.vendor_err_synd));
            }
            _ => {
                // Resize, signature errors or a compressed CQE: this driver never enables
                // them; report rather than drop.
                c.status = WcStatus::GeneralErr;
            }
        }
        Some(c)
    }
}
