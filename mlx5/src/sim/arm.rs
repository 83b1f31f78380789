//! The event side of a CQ, as a ConnectX runs it: arm requests read from the CQ doorbell
//! written to the UAR (checked against the arm word of the doorbell record), one event per
//! arm, solicited-only filtering, an event at once for entries already past the armed
//! consumer index, and arm requests with a stale sequence number ignored.
//!
//! The driver's side is rdma-core's `mlx5_arm_cq` (`providers/mlx5/cq.c`): `dbrec[1] =
//! be32(sn << 28 | cmd | ci)`, `mmio_wc_start`, a 64-bit big-endian store of
//! `(that << 32) | cqn` to `cq_uar + MLX5_CQ_DOORBELL`, `mmio_flush_writes`; after each event
//! it reads, `mlx5_cq_event` advances `arm_sn` (UCX: `uct_ib_mlx5dv_arm_cq`, `cq_sn++` per
//! event). The device advances its own sequence number when it raises an event, so an arm
//! request made before the driver saw that event carries the old number and is dropped: a
//! driver that never advances its number gets one event, then none.
//!
//! Solicited-only: an entry raises the event when its message was sent with the solicited
//! flag, or when it is an error entry (requester or responder error, flushes included): the
//! IB specification asks that unsuccessful completions notify under solicited-only arming,
//! and ConnectX does so.
//!
//! The NIC makes no OS call: it reports each event to the [`CqEventSink`] the driver gave the
//! CQ ([`Nic::set_cq_event_sink`](super::Nic::set_cq_event_sink)), outside its own lock.

use super::dma::DmaBuf;
use crate::doorbell::{split_cq_doorbell, CqArm, CQ_DOORBELL};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// The arm word the NIC keeps in the doorbell record of a CQ on a shared register between
/// arm requests ([`ArmState::look_shared`]): command 0xf, which no driver writes.
pub(crate) const UNARMED: u32 = 0x0f00_0000;
use std::sync::Arc;

/// Where a CQ's completion events go (the driver's completion channel: an eventfd, a
/// `ibv_comp_channel`...). Called from whichever thread runs the NIC, never with the NIC's
/// lock held: it may call back into the NIC, but must not block for long.
pub trait CqEventSink: Send + Sync {
    /// The CQ `cqn` raised a completion event.
    fn cq_event(&self, cqn: u32);
}

/// What the NIC saw of a CQ's arm requests and events.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct ArmStats {
    /// Arm doorbells read from the UAR for this CQ.
    pub arms: u64,
    /// Arm doorbells dropped because their sequence number was not the device's (the
    /// driver did not advance it after an event, or armed again before reading it).
    pub stale_arms: u64,
    /// Arm doorbells whose arm word differed from the doorbell record's (the record must be
    /// written first, as rdma-core does).
    pub record_mismatches: u64,
    /// Doorbells written to this CQ's register that named another CQ.
    pub wrong_cqn: u64,
    /// Events raised.
    pub events: u64,
}

/// The CQ's arm state.
#[derive(Copy, Clone, Debug)]
struct Armed {
    solicited: bool,
}

pub(crate) struct ArmState {
    /// The CQ's doorbell register (its own UAR page, or the driver's; `CQ_DOORBELL` is at
    /// 0x20).
    uar: DmaBuf,
    /// The device's sequence number (2 bits), advanced by each event.
    sn: u32,
    armed: Option<Armed>,
    /// The index of the last solicited or error entry written (for an arm that comes after it).
    last_solicited: Option<u32>,
    /// The entries written when the NIC last looked at the register.
    pi_seen: u32,
    sink: Option<Arc<dyn CqEventSink>>,
    /// Events raised and not yet handed to the sink.
    undelivered: u32,
    pub(crate) stats: ArmStats,
}

impl ArmState {
    pub(crate) fn new() -> ArmState {
        ArmState::on(DmaBuf::new(64))
    }

    /// An arm state reading its doorbells from `uar` (the driver's UAR page).
    pub(crate) fn on(uar: DmaBuf) -> ArmState {
        ArmState {
            uar,
            sn: 0,
            armed: None,
            last_solicited: None,
            pi_seen: 0,
            sink: None,
            undelivered: 0,
            stats: ArmStats::default(),
        }
    }

    /// The UAR page the driver arms through (`mlx5dv_cq.cq_uar`).
    pub(crate) fn uar(&self) -> *mut u8 {
        self.uar.ptr()
    }

    pub(crate) fn set_sink(&mut self, sink: Option<Arc<dyn CqEventSink>>) {
        self.sink = sink;
    }

    /// Takes the doorbell the driver wrote to the register since the last look (each write
    /// is taken once; the register reads 0 afterwards: a CQ number is never 0 here).
    fn take_doorbell(&self) -> Option<u64> {
        // SAFETY: the register is a live 64-byte, 64-aligned DmaBuf; offset 0x20 is 8-aligned.
        // The driver writes it with one 64-bit atomic store (Release: its arm word is in the
        // record before), the NIC loads and swaps it as the same AtomicU64: every access of
        // both threads is atomic and of one size, no write is lost or torn.
        let reg = unsafe { &*(self.uar.ptr().add(CQ_DOORBELL) as *const AtomicU64) };
        if reg.load(Ordering::Relaxed) == 0 {
            return None;
        }
        Some(u64::from_be(reg.swap(0, Ordering::Acquire)))
    }

    /// Whether a doorbell waits in the register.
    fn doorbell_pending(&self) -> bool {
        // SAFETY: as in `take_doorbell`.
        let reg = unsafe { &*(self.uar.ptr().add(CQ_DOORBELL) as *const AtomicU64) };
        reg.load(Ordering::Relaxed) != 0
    }

    /// Reads an arm doorbell, if one was written: `record` reads the arm word of the
    /// doorbell record (after the doorbell: the driver writes the record first), `pi` the
    /// entries written so far, `cnt` the ring size.
    /// `next_only`: entries written before the doorbell do not count (the IB specification's
    /// minimum, what rxe does), instead of a ConnectX's "entries past the armed consumer
    /// index". The NIC knows only that the doorbell came after its previous look (the
    /// register was empty then): entries written since that look count, the older ones not.
    pub(crate) fn look(
        &mut self,
        cqn: u32,
        record: impl Fn() -> u32,
        (pi, cnt): (u32, u32),
        next_only: bool,
    ) {
        let since = std::mem::replace(&mut self.pi_seen, pi);
        let Some(db) = self.take_doorbell() else {
            return;
        };
        let record = record();
        let (word, target) = split_cq_doorbell(db);
        if target != cqn {
            self.stats.wrong_cqn += 1;
            return;
        }
        // A record newer than this doorbell belongs to the next one, already in the register.
        if record != word && !self.doorbell_pending() {
            self.stats.record_mismatches += 1;
        }
        self.request(word, (pi, cnt), since, next_only);
    }

    /// Reads an arm request of a CQ whose UAR page other CQs share (rdma-core's provider
    /// arms every CQ of a context through one register, `ctx->cq_uar_reg`). A ConnectX sees
    /// each doorbell written there; this NIC sees only the last one since it looked, so a
    /// doorbell another CQ wrote over would be lost. The request is therefore taken from the
    /// CQ's doorbell record, which the driver writes before the register: the NIC keeps the
    /// record's arm word at [`UNARMED`] (an invalid command no driver writes) between
    /// requests, and a word there is a request. Its doorbell, if still in the register, is
    /// cleared. The driver never reads the arm word back (rdma-core `mlx5_arm_cq`,
    /// blueflame's arm), so the NIC's marker is invisible to it.
    ///
    /// # Safety
    /// `record` points to the live, 4-byte-aligned arm word of the CQ's doorbell record.
    pub(crate) unsafe fn look_shared(
        &mut self,
        cqn: u32,
        record: *const u32,
        (pi, cnt): (u32, u32),
        next_only: bool,
    ) {
        let since = std::mem::replace(&mut self.pi_seen, pi);
        // SAFETY: as in `take_doorbell`: the register is a live aligned 8-byte word that every
        // party accesses atomically.
        let reg = unsafe { &*(self.uar.ptr().add(CQ_DOORBELL) as *const AtomicU64) };
        let db = reg.load(Ordering::Acquire);
        if db != 0 && split_cq_doorbell(u64::from_be(db)).1 == cqn {
            // Only this CQ's doorbell: another CQ's waits for its own look.
            let _ = reg.compare_exchange(db, 0, Ordering::AcqRel, Ordering::Relaxed);
        }
        // SAFETY: the caller's contract; the driver stores the word atomically (Release), as
        // it stores the rest of the record.
        let rec = unsafe { &*(record as *const AtomicU32) };
        let word = u32::from_be(rec.load(Ordering::Acquire));
        if word == UNARMED {
            return;
        }
        // Take it, unless the driver wrote a newer request meanwhile (the next look takes
        // that one).
        if rec
            .compare_exchange(
                word.to_be(),
                UNARMED.to_be(),
                Ordering::AcqRel,
                Ordering::Relaxed,
            )
            .is_err()
        {
            return;
        }
        self.request(word, (pi, cnt), since, next_only);
    }

    /// An arm request of `word` (after the checks of its doorbell): arms the CQ, or raises
    /// the event at once for entries already past its consumer index.
    fn request(&mut self, word: u32, (pi, cnt): (u32, u32), since: u32, next_only: bool) {
        self.stats.arms += 1;
        let arm = CqArm::from_word(word);
        if arm.sn != self.sn {
            self.stats.stale_arms += 1;
            return;
        }
        self.armed = Some(Armed {
            solicited: arm.solicited,
        });
        // Entries already past the armed consumer index raise the event at once (in
        // `next_only` mode, those written since the previous look).
        let mut from = arm.ci;
        let past = pi.wrapping_sub(from) & 0xff_ffff;
        if past > cnt {
            return;
        }
        if next_only && since.wrapping_sub(from) & 0xff_ffff <= past {
            from = since;
        }
        let past = pi.wrapping_sub(from) & 0xff_ffff;
        if past == 0 {
            return;
        }
        let fire = !arm.solicited
            || self
                .last_solicited
                .is_some_and(|s| s.wrapping_sub(from) & 0xff_ffff < past);
        if fire {
            self.fire();
        }
    }

    /// An entry was written at index `idx`; `solicited`: a solicited or error entry.
    pub(crate) fn on_entry(&mut self, idx: u32, solicited: bool) {
        if solicited {
            self.last_solicited = Some(idx);
        }
        if let Some(a) = self.armed {
            if !a.solicited || solicited {
                self.fire();
            }
        }
    }

    /// Raises the event: disarmed until the next arm, sequence number advanced.
    fn fire(&mut self) {
        self.armed = None;
        self.sn = (self.sn + 1) & 3;
        self.stats.events += 1;
        self.undelivered += 1;
    }

    /// The events to hand to the sink (after the NIC's lock is released).
    pub(crate) fn take_undelivered(&mut self) -> Option<(Arc<dyn CqEventSink>, u32)> {
        let n = std::mem::take(&mut self.undelivered);
        match &self.sink {
            Some(s) if n > 0 => Some((s.clone(), n)),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doorbell::{cq_arm, CQ_DB_REQ_NOT};

    /// The driver's side of an arm doorbell: one 64-bit atomic store, as blueflame's.
    fn ring(a: &ArmState, word: u32, cqn: u32) {
        let reg = a.uar().wrapping_add(CQ_DOORBELL) as *const AtomicU64;
        // SAFETY: inside the live register page, aligned; AtomicU64 has u64's layout.
        unsafe {
            (*reg).store(
                crate::doorbell::cq_arm_doorbell(word, cqn).to_be(),
                Ordering::Release,
            )
        };
    }

    #[test]
    fn one_event_per_arm_and_stale_numbers_dropped() {
        let mut a = ArmState::new();
        let w = CqArm {
            sn: 0,
            solicited: false,
            ci: 0,
        }
        .word();
        ring(&a, w, 0x80);
        a.look(0x80, || w, (0, 8), false);
        assert_eq!(a.stats.arms, 1);
        a.on_entry(0, false);
        a.on_entry(1, false);
        assert_eq!(a.stats.events, 1, "one event per arm");
        // The same sequence number again: stale, dropped.
        ring(&a, w, 0x80);
        a.look(0x80, || w, (2, 8), false);
        a.on_entry(2, false);
        assert_eq!((a.stats.stale_arms, a.stats.events), (1, 1));
        // Advanced: armed; entries past ci 2 exist, so the event comes at once.
        let w = cq_arm(1, CQ_DB_REQ_NOT, 2);
        ring(&a, w, 0x80);
        a.look(0x80, || w, (3, 8), false);
        assert_eq!(a.stats.events, 2);
        assert!(a.take_undelivered().is_none(), "no sink");
    }

    #[test]
    fn next_only_arms_count_entries_since_the_previous_look() {
        let mut a = ArmState::new();
        // Two entries written, the NIC looks (no doorbell), one more entry, then the arm
        // doorbell with ci 0: only the entry written since the look counts, and fires.
        a.look(0x80, || 0, (2, 8), true);
        let w = CqArm {
            sn: 0,
            solicited: true,
            ci: 0,
        }
        .word();
        a.on_entry(2, false);
        ring(&a, w, 0x80);
        a.look(0x80, || w, (3, 8), true);
        assert_eq!(
            a.stats.events, 0,
            "entry 2 is not solicited, 0 and 1 came before"
        );
        // The same with a solicited entry before the look: it does not count.
        let mut a = ArmState::new();
        a.on_entry(0, true);
        a.look(0x80, || 0, (1, 8), true);
        ring(&a, w, 0x80);
        a.look(0x80, || w, (1, 8), true);
        assert_eq!(a.stats.events, 0);
        // In ConnectX mode it does.
        let mut a = ArmState::new();
        a.on_entry(0, true);
        a.look(0x80, || 0, (1, 8), false);
        ring(&a, w, 0x80);
        a.look(0x80, || w, (1, 8), false);
        assert_eq!(a.stats.events, 1);
        // Any entry since the previous look fires a next-only arm.
        let mut a = ArmState::new();
        a.look(0x80, || 0, (1, 8), true);
        a.on_entry(1, false);
        let any = cq_arm(0, CQ_DB_REQ_NOT, 0);
        ring(&a, any, 0x80);
        a.look(0x80, || any, (2, 8), true);
        assert_eq!(a.stats.events, 1);
    }

    #[test]
    fn solicited_arm_skips_plain_entries_and_checks_the_record() {
        let mut a = ArmState::new();
        let w = CqArm {
            sn: 0,
            solicited: true,
            ci: 0,
        }
        .word();
        ring(&a, w, 0x81);
        a.look(0x81, || 0, (0, 8), false);
        assert_eq!(a.stats.record_mismatches, 1);
        a.on_entry(0, false);
        assert_eq!(a.stats.events, 0);
        a.on_entry(1, true);
        assert_eq!(a.stats.events, 1);
        // A doorbell naming another CQ is not an arm of this one.
        ring(&a, cq_arm(1, 0, 2), 0x99);
        a.look(0x81, || cq_arm(1, 0, 2), (2, 8), false);
        assert_eq!(a.stats.wrong_cqn, 1);
        // A solicited arm after a solicited entry already written past ci fires at once;
        // one before ci does not.
        let w = CqArm {
            sn: 1,
            solicited: true,
            ci: 2,
        }
        .word();
        ring(&a, w, 0x81);
        a.look(0x81, || w, (2, 8), false);
        assert_eq!(a.stats.events, 1);
        a.on_entry(2, false);
        let w = CqArm {
            sn: 1,
            solicited: true,
            ci: 0,
        }
        .word();
        ring(&a, w, 0x81);
        a.look(0x81, || w, (3, 8), false);
        assert_eq!(a.stats.events, 2, "entry 1 is solicited and past ci 0");
    }
}
