//! The clock of a timed run (perftest's `-D`), shared by the bandwidth and the latency
//! tests: its phases, and what completed in the measured one.

use std::time::{Duration, Instant};

/// The phases of a `-D` run (perftest's `catch_alarm`: START for `margin` seconds, SAMPLE
/// for `duration - 2 * margin`, STOP_SAMPLE for `margin`, then END), and the completion
/// count when the measured phase began and ended.
pub struct Window {
    sample: Instant,
    stop: Instant,
    end: Instant,
    first: Option<(Instant, u64)>,
    last: Option<(Instant, u64)>,
}

impl Window {
    /// A run of `duration` seconds from `t0` with `margin` seconds unmeasured at each end
    /// (`duration > 2 * margin`, checked by the options).
    pub fn new(t0: Instant, duration: u64, margin: u64) -> Window {
        let sample = t0 + Duration::from_secs(margin);
        Window {
            sample,
            stop: sample + Duration::from_secs(duration.saturating_sub(2 * margin)),
            end: t0 + Duration::from_secs(duration),
            first: None,
            last: None,
        }
    }

    /// At `now`, `done` requests have completed; true once the run is over (post no more).
    pub fn note(&mut self, now: Instant, done: u64) -> bool {
        if self.first.is_none() && now >= self.sample {
            self.first = Some((now, done));
        }
        if self.last.is_none() && now >= self.stop {
            self.last = Some((now, done));
        }
        now >= self.end
    }

    /// When the run is over (perftest's END_STATE): a side waiting for its peer gives up
    /// then.
    pub fn end(&self) -> Instant {
        self.end
    }

    /// The requests completed in the measured phase and its length in seconds (as it was
    /// seen: from the first note in it to the first note past it).
    pub fn measured(&self) -> (u64, f64) {
        match (self.first, self.last) {
            (Some((t1, d1)), Some((t2, d2))) => (d2 - d1, (t2 - t1).as_secs_f64().max(1e-9)),
            _ => (0, 1e-9),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A -D 10 -f 2 run: what completed before second 2 and after second 8 is not
    /// counted, the rate is over the 6 s between.
    #[test]
    fn a_timed_run_counts_only_its_middle() {
        let t0 = Instant::now();
        let at = |s: f64| t0 + Duration::from_secs_f64(s);
        let mut w = Window::new(t0, 10, 2);
        assert_eq!(w.end(), at(10.0));
        for (t, done, over) in [
            (0.0, 0, false),
            (1.9, 500, false),
            (2.0, 600, false),
            (5.0, 2000, false),
            (8.0, 4200, false),
            (9.5, 5000, false),
            (10.0, 5100, true),
        ] {
            assert_eq!(w.note(at(t), done), over, "at {t} s");
        }
        let (iters, secs) = w.measured();
        assert_eq!(iters, 4200 - 600);
        assert!((secs - 6.0).abs() < 1e-6, "{secs}");
        // No margin: everything from the start.
        let mut w = Window::new(t0, 2, 0);
        assert!(!w.note(at(0.0), 0));
        assert!(w.note(at(2.0), 900));
        assert_eq!(w.measured().0, 900);
    }
}
