//! `--hw-timestamps`: each measured round trip of a latency test split by the NIC's own
//! clock. The CQ is created with completion timestamps (`CqOptions::timestamps`), the
//! completion that ends an iteration (the echo's receive, the read's or the atomic's own)
//! is polled with `Cq::poll_timed`, and the NIC's clock is tied to the host's TSC before
//! the loop and after it (each time the `Device::clock` read between two TSC reads that
//! are closest together); a host time maps onto the NIC's clock along the line through the
//! two ties, so that neither the TSC's calibration nor the clocks' drift add up over a
//! run. Per iteration:
//!
//! - **post**: host, from the post call to its return (the doorbell rung);
//! - **NIC+wire**: from the doorbell to the NIC's stamp of the completion that ends the
//!   iteration: the NIC, the wire, and for a ping-pong the peer's whole turn;
//! - **poll**: host, from that stamp to the poll that returns it.
//!
//! The three add up to the round trip (not halved).

use crate::stats::Clock;
use blueflame::{Device, Result};

/// One point where the two clocks were read together.
#[derive(Copy, Clone, Debug)]
struct Tie {
    /// TSC at the middle of the host reads.
    host: u64,
    /// The NIC's nanoseconds then.
    nic: u64,
    /// How long the NIC's clock read took (the tie's uncertainty).
    window_ns: f64,
}

/// The closest of 32 reads of the NIC's clock between two TSC reads.
fn tie(dev: &Device, clock: &Clock) -> Result<Tie> {
    let mut best: Option<Tie> = None;
    for _ in 0..32 {
        let h0 = clock.now();
        let t = dev.clock()?;
        let h1 = clock.now();
        let w = clock.ns(h0, h1);
        if !matches!(best, Some(b) if b.window_ns <= w) {
            best = Some(Tie {
                host: h0 + (h1 - h0) / 2,
                nic: t.ns,
                window_ns: w,
            });
        }
    }
    Ok(best.expect("32 reads"))
}

/// One iteration as measured: TSC when posted, when the post returned, when the poll
/// returned the completion that ended it, and the NIC's stamp of that completion.
#[derive(Copy, Clone, Debug)]
struct Sample {
    posted: u64,
    rung: u64,
    done: u64,
    stamp: u64,
}

/// The split of a run's round trips.
pub struct Split {
    clock: Clock,
    start: Tie,
    samples: Vec<Sample>,
}

/// What a run's split came to (medians and averages, nanoseconds).
#[derive(Clone, Debug, PartialEq)]
pub struct Summary {
    /// Round trips split.
    pub iterations: usize,
    /// Median and average of each part: post, NIC+wire, poll.
    pub post: (f64, f64),
    pub wire: (f64, f64),
    pub poll: (f64, f64),
    /// How well the clocks were tied (the longer of the two reads), in nanoseconds, and
    /// how far the NIC's clock ran from the host's as timed (parts per million: the TSC's
    /// calibration and the clocks' drift, taken out by the line through the ties).
    pub window_ns: f64,
    pub drift_ppm: f64,
}

impl Split {
    /// Ties the NIC's clock of `dev` to the host's, for a run of `iters` measured iterations.
    pub fn new(dev: &Device, clock: Clock, iters: usize) -> Result<Split> {
        let start = tie(dev, &clock)?;
        Ok(Split {
            clock,
            start,
            samples: crate::stats::room_for(iters, "--iters (no memory for a split each)")?,
        })
    }

    /// One iteration: posted at TSC `posted`, the post returned at `rung`, the NIC stamped
    /// the completion that ended it at `stamp` (its nanoseconds), the poll returned it at
    /// `done`. A completion without a time (an error) is not counted.
    pub fn add(&mut self, posted: u64, rung: u64, stamp: Option<u64>, done: u64) {
        if let Some(stamp) = stamp {
            self.samples.push(Sample {
                posted,
                rung,
                done,
                stamp,
            });
        }
    }

    /// The split, the clocks tied again to measure their drift.
    pub fn finish(self, dev: &Device) -> Result<Summary> {
        let end = tie(dev, &self.clock)?;
        Ok(self.split(end))
    }

    /// The split with the clocks tied at the start and at `end`.
    fn split(self, end: Tie) -> Summary {
        let start = self.start;
        let host = self.clock.ns(start.host, end.host);
        // In integers first: nanoseconds since the epoch do not fit an f64's 53 bits.
        let nic = end.nic.wrapping_sub(start.nic) as i64 as f64;
        let rate = if host > 0.0 { nic / host } else { 1.0 };
        // A host time on the NIC's clock, in nanoseconds after the start tie.
        let at = |tsc: u64| self.clock.ns(start.host, tsc) * rate;
        let (mut post, mut wire, mut poll) = (Vec::new(), Vec::new(), Vec::new());
        for s in &self.samples {
            let stamp = s.stamp.wrapping_sub(start.nic) as i64 as f64;
            post.push(self.clock.ns(s.posted, s.rung) * rate);
            wire.push(stamp - at(s.rung));
            poll.push(at(s.done) - stamp);
        }
        let mid_avg = |v: &mut Vec<f64>| {
            if v.is_empty() {
                return (f64::NAN, f64::NAN);
            }
            v.sort_by(f64::total_cmp);
            (v[v.len() / 2], v.iter().sum::<f64>() / v.len() as f64)
        };
        Summary {
            iterations: self.samples.len(),
            post: mid_avg(&mut post),
            wire: mid_avg(&mut wire),
            poll: mid_avg(&mut poll),
            window_ns: start.window_ns.max(end.window_ns),
            drift_ppm: (rate - 1.0) * 1e6,
        }
    }
}

impl Summary {
    /// The table's line, after the row.
    pub fn line(&self) -> String {
        format!(
            " hw timestamps  : post {:.0} | NIC+wire {:.0} | poll {:.0} ns (medians of {} round \
             trips; averages {:.0} | {:.0} | {:.0}; clocks tied within {:.0} ns, NIC clock {:+.1} ppm)",
            self.post.0,
            self.wire.0,
            self.poll.0,
            self.iterations,
            self.post.1,
            self.wire.1,
            self.poll.1,
            self.window_ns,
            self.drift_ppm
        )
    }

    /// The JSON object (one line), after the result's.
    pub fn json(&self, test: &str, bytes: usize) -> String {
        format!(
            "{{\"test\":\"{test}\",\"bytes\":{bytes},\"hw_timestamps\":{{\"iterations\":{},\
             \"post_ns\":{:.1},\"nic_wire_ns\":{:.1},\"poll_ns\":{:.1},\"post_avg_ns\":{:.1},\
             \"nic_wire_avg_ns\":{:.1},\"poll_avg_ns\":{:.1},\"tie_window_ns\":{:.1},\
             \"drift_ppm\":{:.3}}}}}",
            self.iterations,
            self.post.0,
            self.wire.0,
            self.poll.0,
            self.post.1,
            self.wire.1,
            self.poll.1,
            self.window_ns,
            self.drift_ppm
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_three_parts_add_up_to_the_round_trip() {
        let clock = Clock::new();
        let dev = Device::sim();
        let mut s = Split::new(&dev, clock, 4).unwrap();
        let ns = |tsc: u64| s.clock.ns(s.start.host, tsc);
        // A post of some ticks, the NIC's stamp 5 us after the tie, the poll a little later.
        let posted = s.start.host + 100;
        let rung = posted + 400;
        let stamp = s.start.nic + 5_000;
        let done = s.start.host + 20_000;
        let round = s.clock.ns(posted, done);
        let (p, w, q) = (
            s.clock.ns(posted, rung),
            5_000.0 - ns(rung),
            ns(done) - 5_000.0,
        );
        s.add(posted, rung, Some(stamp), done);
        s.add(posted, rung, None, done);
        // The NIC's clock as fast as the host's: an end tie 1 ms on on both.
        let end = Tie {
            host: s.start.host + (1e6 / s.clock.ns(0, 1_000_000) * 1e6) as u64,
            nic: s.start.nic + 1_000_000,
            window_ns: 0.0,
        };
        let sum = s.split(end);
        assert!(sum.drift_ppm.abs() < 1.0, "{sum:?}");
        assert_eq!(sum.iterations, 1, "an error completion is not counted");
        assert!((sum.post.0 + sum.wire.0 + sum.poll.0 - round).abs() < 1e-3 * round);
        for (got, want) in [(sum.post.0, p), (sum.wire.0, w), (sum.poll.0, q)] {
            assert!(
                (got - want).abs() < 1e-3 * want.abs().max(1.0),
                "{got} vs {want}"
            );
        }
        assert!(sum.line().contains("NIC+wire"));
        assert!(sum.json("send_lat", 8).contains("\"nic_wire_ns\""));
    }
}
