//! The software NIC's clock and the transport timers of a QP (InfiniBand's encodings).
//!
//! Time is virtual, in nanoseconds. In stepped mode it stands still while there is work
//! and jumps to the next timer when a pass finds nothing to do ([`super::NicView::process`]), so
//! a test sees a 537 ms retry sequence end at once, with the elapsed time exact. In thread
//! mode it follows the wall clock, multiplied by the NIC's time scale (1 by default: as slow
//! as a ConnectX).

use std::time::Instant;

/// The transport attributes of an RC QP that drive its timers (`ibv_modify_qp`: `timeout`,
/// `retry_cnt` and `rnr_retry` at RTS, `min_rnr_timer` at RTR).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct QpTiming {
    /// Local ACK timeout exponent: a request with no answer is sent again after
    /// 4.096 us * 2^timeout (0: never, the requester waits for ever). At most 31.
    pub timeout: u8,
    /// Retransmissions after the first attempt before `TRANSPORT_RETRY_EXC` (at most 7).
    pub retry_cnt: u8,
    /// RNR retries after the first RNR NAK before `RNR_RETRY_EXC`; 7 retries for ever.
    pub rnr_retry: u8,
    /// The RNR NAK timer this QP asks of its requesters when it has no receive (as a
    /// responder), in the InfiniBand encoding ([`rnr_timer_ns`]). At most 31.
    pub min_rnr_timer: u8,
}

impl Default for QpTiming {
    /// What blueflame's `Timing::default()` programs: timeout 14 (67 ms), 7 retries, RNR
    /// retries for ever, RNR timer 12 (0.64 ms).
    fn default() -> Self {
        QpTiming {
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
        }
    }
}

impl QpTiming {
    /// Whether every field fits its InfiniBand encoding (3 bits for the counts, 5 for the
    /// timers).
    pub fn is_valid(&self) -> bool {
        self.retry_cnt <= 7 && self.rnr_retry <= 7 && self.timeout <= 31 && self.min_rnr_timer <= 31
    }
}

/// The local ACK timeout in nanoseconds: 4.096 us * 2^`timeout`; None for 0 (no timeout).
pub fn ack_timeout_ns(timeout: u8) -> Option<u64> {
    (timeout != 0).then(|| 4096u64 << timeout.min(31))
}

/// The RNR NAK timer of the InfiniBand encoding (IBTA vol. 1, 9.7.5.2.8; the `min_rnr_timer`
/// table of `ibv_modify_qp(3)`), in nanoseconds: 0 is 655.36 ms, 1 is 0.01 ms, ..., 12 is
/// 0.64 ms, ..., 31 is 491.52 ms.
pub fn rnr_timer_ns(code: u8) -> u64 {
    const US: [u64; 32] = [
        655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1_280, 1_920, 2_560,
        3_840, 5_120, 7_680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880,
        163_840, 245_760, 327_680, 491_520,
    ];
    US[(code & 31) as usize] * 1_000
}

/// The NIC's virtual clock.
pub(crate) struct Clock {
    /// Virtual now while stepped; the virtual time at `wall.0` while threaded.
    virt: u64,
    /// Thread mode: when the wall clock was last tied to `virt`.
    wall: Option<Instant>,
    /// Virtual nanoseconds per wall nanosecond in thread mode.
    scale: f64,
}

impl Clock {
    pub(crate) fn new() -> Clock {
        Clock {
            virt: 0,
            wall: None,
            scale: 1.0,
        }
    }

    /// Virtual now.
    pub(crate) fn now(&self) -> u64 {
        match self.wall {
            None => self.virt,
            Some(t) => {
                let real = t.elapsed().as_nanos() as f64 * self.scale;
                self.virt.saturating_add(real.min(u64::MAX as f64) as u64)
            }
        }
    }

    /// Stepped mode: moves virtual time forward to `t` (thread mode: time passes by itself).
    pub(crate) fn advance_to(&mut self, t: u64) {
        if self.wall.is_none() && t > self.virt {
            self.virt = t;
        }
    }

    /// Thread mode on (time follows the wall clock from now) or off (time stands still).
    pub(crate) fn follow_wall(&mut self, on: bool) {
        self.virt = self.now();
        self.wall = on.then(Instant::now);
    }

    /// Sets the thread-mode scale (virtual per wall nanosecond), keeping `now` continuous.
    pub(crate) fn set_scale(&mut self, scale: f64) {
        let threaded = self.wall.is_some();
        self.follow_wall(threaded);
        self.scale = if scale.is_finite() && scale > 0.0 {
            scale
        } else {
            1.0
        };
    }

    pub(crate) fn scale(&self) -> f64 {
        self.scale
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodings() {
        assert_eq!(ack_timeout_ns(0), None);
        assert_eq!(ack_timeout_ns(1), Some(8_192));
        assert_eq!(ack_timeout_ns(14), Some(67_108_864));
        assert_eq!(ack_timeout_ns(31), Some(4096 << 31));
        assert_eq!(rnr_timer_ns(0), 655_360_000);
        assert_eq!(rnr_timer_ns(1), 10_000);
        assert_eq!(rnr_timer_ns(12), 640_000);
        assert_eq!(rnr_timer_ns(31), 491_520_000);
    }

    #[test]
    fn stepped_time_moves_only_forward_and_only_when_told() {
        let mut c = Clock::new();
        assert_eq!(c.now(), 0);
        c.advance_to(500);
        c.advance_to(100);
        assert_eq!(c.now(), 500);
        c.follow_wall(true);
        c.advance_to(10_000_000_000); // ignored: the wall clock drives time now
        assert!(c.now() < 10_000_000_000);
        c.follow_wall(false);
        let t = c.now();
        assert!(t >= 500);
        assert_eq!(c.now(), t);
    }
}
