//! How the software NIC runs: passes over every QP, made from the caller's thread or from the
//! NIC's own doorbell thread, in virtual time.

use super::nic::{Nic, NicView};
use super::state::State;
use std::sync::atomic::Ordering;
use std::sync::Arc;

impl State {
    /// One pass over every QP at the clock's now.
    fn pass(&mut self) -> usize {
        // Arm doorbells first: an arm written before the WQEs' doorbells sees their entries.
        let next_only = self.arm_next_only;
        for cq in self.cqs.values_mut() {
            cq.look_at_arm(next_only);
        }
        let qpns: Vec<u32> = self.qps.keys().copied().collect();
        let n = qpns.into_iter().map(|q| self.run_qp(q)).sum();
        // The end of a pass stands for a ConnectX's compression timeout; then the arm
        // doorbells again: an arm written while the WQEs ran is not left for the next pass.
        for cq in self.cqs.values_mut() {
            cq.close_session();
            cq.look_at_arm(next_only);
        }
        self.note_cq_errors();
        if !self.threaded {
            self.end_pass();
        }
        self.publish_clock();
        n
    }

    /// Judges the rings of one stepped pass per register (misses, alternation).
    fn end_pass(&mut self) {
        let mut verdicts = Vec::new();
        for r in self.uars.regs.iter_mut() {
            if !r.pass.is_empty() {
                verdicts.extend(r.end_pass());
            }
        }
        for (qpn, missed, out_of_turn) in verdicts {
            if let Some(q) = self.qps.get_mut(&qpn) {
                q.stats.doorbell_misses += missed as u64;
                q.stats.bf_out_of_turn += out_of_turn as u64;
            }
        }
    }
}

impl Nic {
    /// The thread-mode time scale.
    pub fn time_scale(&self) -> f64 {
        self.st().clock.scale()
    }

    /// Starts the thread that watches doorbell records. Idempotent.
    pub fn start(&self) {
        if self.inner.running.swap(true, Ordering::AcqRel) {
            return;
        }
        {
            let mut st = self.st();
            st.threaded = true;
            st.clock.follow_wall(true);
        }
        let me = Arc::downgrade(&self.inner);
        let handle = std::thread::Builder::new()
            .name("mlx5-sim".into())
            .spawn(move || {
                let mut idle = 0u32;
                loop {
                    let Some(inner) = me.upgrade() else { return };
                    if !inner.running.load(Ordering::Acquire) {
                        return;
                    }
                    let nic = Nic { inner };
                    if nic.process() == 0 {
                        idle = idle.saturating_add(1);
                        if idle > 64 {
                            std::thread::yield_now();
                        } else {
                            std::hint::spin_loop();
                        }
                    } else {
                        idle = 0;
                    }
                }
            })
            .expect("spawn the NIC thread");
        *self.inner.thread.lock().unwrap_or_else(|e| e.into_inner()) = Some(handle);
    }

    /// Stops the doorbell thread (back to synchronous mode).
    pub fn stop(&self) {
        self.inner.running.store(false, Ordering::Release);
        let h = self
            .inner
            .thread
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(h) = h {
            if h.thread().id() != std::thread::current().id() {
                let _ = h.join();
            }
        }
        let mut st = self.st();
        st.threaded = false;
        st.clock.follow_wall(false);
        for q in st.qps.values_mut() {
            q.skip_doorbell_check();
        }
    }
}

impl NicView {
    /// One pass over every QP at the current virtual time: runs the WQEs and flushes up to
    /// each doorbell record, the timers and held-back requests that are due. In stepped mode,
    /// a pass that finds nothing to do moves the clock to the next timer or held-back request
    /// and runs again. Returns how many WQEs and receives it handled (a retransmission counts,
    /// an RNR retry that meets another RNR NAK does not). Call it until it returns 0 to drain.
    pub fn process(&self) -> usize {
        let mut st = self.st();
        let mut n = st.pass();
        if n == 0 && !st.threaded {
            if let Some(t) = st.qps.values().filter_map(|q| q.next_due()).min() {
                st.clock.advance_to(t);
                n = st.pass();
            }
        }
        let events: Vec<_> = st
            .cqs
            .values_mut()
            .filter_map(|c| c.arm.take_undelivered().map(|(s, k)| (s, c.cqn, k)))
            .collect();
        drop(st);
        // The sinks run without the NIC's lock: they may call back into the NIC.
        for (sink, cqn, k) in events {
            for _ in 0..k {
                sink.cq_event(cqn);
            }
        }
        n
    }

    /// Passes until nothing is left to do (an RNR wait counts as nothing to do; a local ACK
    /// timeout does not: the retransmissions run, in virtual time, until the retry count is
    /// spent).
    pub fn drain(&self) -> usize {
        let mut total = 0;
        loop {
            let n = self.process();
            if n == 0 {
                return total;
            }
            total += n;
        }
    }

    /// Whether the doorbell thread runs.
    pub fn is_threaded(&self) -> bool {
        self.running.load(Ordering::Acquire)
    }

    /// The NIC's virtual time in nanoseconds (see [`NicView::process`] and
    /// [`NicView::set_time_scale`]).
    pub fn now_ns(&self) -> u64 {
        self.st().clock.now()
    }

    /// How fast virtual time runs in thread mode: `scale` virtual nanoseconds per wall-clock
    /// nanosecond (1 by default, as slow as a ConnectX; 1000 makes a 67 ms ACK timeout take
    /// 67 us). Values that are not finite and positive mean 1.
    pub fn set_time_scale(&self, scale: f64) {
        self.st().clock.set_scale(scale);
    }
}
