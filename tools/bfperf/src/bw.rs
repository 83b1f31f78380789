//! Bandwidth and message-rate tests, as perftest's `ib_*_bw`: `tx-depth` requests in
//! flight, `post-list` requests per doorbell (the last one signaled), for `iters` requests.

use crate::opts::{Atomic, Opts};
use crate::perftest::{Report, Test};
use crate::setup::{sync, PerftestLink, Setup, Side};
use blueflame::QueuePair;
use blueflame::{Payload, PostFlags, Remote, Request, Result, Sge};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

/// Which bandwidth test.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Bw {
    /// RDMA write.
    Write,
    /// RDMA read.
    Read,
    /// Send into posted receives.
    Send,
    /// 8-byte atomics on one remote word (perftest's `ib_atomic_bw`).
    Atomic(Atomic),
}

/// What a `--run_infinitely` run does with each period's result (prints it).
pub type Each<'a> = &'a mut dyn FnMut(&BwResult) -> Result<()>;

/// Result of one bandwidth test.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct BwResult {
    /// Best bandwidth over a tenth of the run, MB/s (10^6 bytes).
    pub peak: f64,
    /// Bandwidth over the whole run, MB/s.
    pub avg: f64,
    /// Messages per second, millions.
    pub mpps: f64,
    /// The requests measured: `--iters`, or those completed in the measured part of a
    /// `-D` run.
    pub iters: u64,
}

impl BwResult {
    /// No peak, and `iters` requests of `size` bytes in `secs` seconds: the average in
    /// perftest's MB/sec and the rate in Mpps (a timed run's figures; a counted run adds its
    /// peak).
    fn over(iters: u64, secs: f64, size: usize) -> BwResult {
        BwResult {
            peak: 0.0,
            avg: iters as f64 * size as f64 / secs / PERFTEST_MB,
            mpps: iters as f64 / secs / 1e6,
            iters,
        }
    }
}

/// What every request of a bandwidth test on one side is made of: its local entry, its
/// inline data (writes and sends that fit), the peer's buffer, and how many may be in
/// flight (`tx-depth`, or fewer when the queue holds fewer: never a refused post, the
/// queue's depth is what the device gave).
struct Traffic {
    kind: Bw,
    sge: [Sge; 1],
    inline: Option<Vec<u8>>,
    remote: Remote,
    in_flight: u64,
}

impl Traffic {
    fn new(s: &Side, o: &Opts, kind: Bw, size: usize) -> Traffic {
        let fits =
            matches!(kind, Bw::Write | Bw::Send) && size <= o.inline as usize && size <= 1024;
        Traffic {
            kind,
            sge: [Sge {
                addr: s.mr.addr() + size as u64,
                len: size as u32,
                lkey: s.mr.lkey(),
            }],
            inline: fits.then(|| vec![0x5au8; size]),
            remote: Remote {
                addr: s.peer.addr,
                rkey: s.peer.rkey,
            },
            in_flight: (o.tx_depth as u64).min(s.qp.send_depth() as u64),
        }
    }

    /// The request.
    fn request(&self) -> Request<'_> {
        let (remote, sge) = (self.remote, &self.sge);
        let data = match &self.inline {
            Some(b) => Payload::Inline(b),
            None => Payload::Sgl(sge),
        };
        match self.kind {
            Bw::Write => Request::Write { remote, data },
            Bw::Read => Request::Read { remote, sgl: sge },
            Bw::Send => Request::Send { data },
            // The local entry is the 8 bytes the old value comes back into.
            Bw::Atomic(Atomic::FetchAdd) => Request::FetchAdd {
                remote,
                add: 1,
                local: sge[0],
            },
            Bw::Atomic(Atomic::CompareSwap) => Request::CompareSwap {
                remote,
                compare: 0,
                swap: 1,
                local: sge[0],
            },
        }
    }

    /// Posts `n` requests under one doorbell, the last one signaled; the cookie of the
    /// signaled one is how many requests its completion retires (`tally` counts by it).
    fn post(&self, s: &mut Side, n: u64) -> Result<()> {
        let req = self.request();
        let mut b = s.qp.batch();
        for k in 0..n {
            let last = k + 1 == n;
            let flags = if last {
                PostFlags::SIGNALED
            } else {
                PostFlags::UNSIGNALED
            };
            b.push(&req, if last { n } else { 0 }, flags)?;
        }
        b.ring()
    }
}

/// One turn of a sender's loop after it posted: the software NIC runs, the receiver driven
/// from this loop (if any) takes its messages, and the completions are polled into `out`.
fn turn<'a>(
    s: &mut Side,
    rx: Option<&mut Rx>,
    out: &'a mut [blueflame::Completion; 16],
) -> Result<&'a [blueflame::Completion]> {
    s.dev.process();
    if let Some(rx) = rx {
        rx.step()?;
    }
    let k = s.cq.poll(out);
    Ok(&out[..k])
}

/// Ends the program on a failed completion (a bandwidth figure over failed requests would
/// be a lie).
fn check(c: &blueflame::Completion) {
    if !c.is_ok() {
        eprintln!("bfperf: completion failed: {c:?}");
        std::process::exit(1);
    }
}

/// A receiver driven from the sender's loop (the software NIC's thread needs the other core).
struct Rx {
    side: Side,
    got: u64,
    posted: u64,
    total: u64,
    size: usize,
}

impl Rx {
    fn new(mut side: Side, size: usize, total: u64) -> Result<Rx> {
        let depth = 256.min(total);
        for i in 0..depth {
            side.post_recv(&[side.mr.sge(0, size as u32)?], i)?;
        }
        Ok(Rx {
            side,
            got: 0,
            posted: depth,
            total,
            size,
        })
    }

    /// Takes the receives that arrived and posts new ones.
    fn step(&mut self) -> Result<()> {
        let mut out = [blueflame::Completion::default(); 16];
        let k = self.side.cq.poll(&mut out);
        for c in &out[..k] {
            if !c.is_ok() {
                eprintln!("bfperf: receive failed: {c:?}");
                std::process::exit(1);
            }
            self.got += 1;
            if self.posted < self.total {
                self.side
                    .post_recv(&[self.side.mr.sge(0, self.size as u32)?], self.posted)?;
                self.posted += 1;
            }
        }
        Ok(())
    }
}

fn initiate(
    s: &mut Side,
    o: &Opts,
    kind: Bw,
    size: usize,
    ready: &Barrier,
    mut rx: Option<&mut Rx>,
    each: Each<'_>,
) -> Result<BwResult> {
    if crate::opts::duration(o).is_some() {
        return timed(s, o, kind, size, ready, rx, each);
    }
    let total = (o.warmup + o.iters) as u64;
    let t = Traffic::new(s, o, kind, size);
    let (mut posted, mut done) = (0u64, 0u64);
    let mut out = [blueflame::Completion::default(); 16];
    let mut stamps: Vec<(Instant, u64)> = Vec::with_capacity(1024);
    ready.wait();
    let mut start = Instant::now();
    while done < total {
        while posted < total
            && posted - done + (o.post_list as u64).min(total - posted) <= t.in_flight
        {
            let n = (o.post_list as u64).min(total - posted);
            t.post(s, n)?;
            posted += n;
        }
        tally(
            turn(s, rx.as_deref_mut(), &mut out)?,
            o.warmup as u64,
            &mut done,
            &mut start,
            &mut stamps,
        );
    }
    let secs = start.elapsed().as_secs_f64().max(1e-9);
    Ok(result(total, o.warmup as u64, size, secs, &stamps))
}

/// A `-D` run (perftest's duration mode, `catch_alarm`'s states): `margin` seconds of
/// traffic not measured, `duration - 2 * margin` measured (the completions that arrive in
/// it, over its length), `margin` more not measured; then nothing more is posted and what is
/// in flight completes. No peak is measured (perftest: "BW peak won't be measured").
fn timed(
    s: &mut Side,
    o: &Opts,
    kind: Bw,
    size: usize,
    ready: &Barrier,
    mut rx: Option<&mut Rx>,
    each: Each<'_>,
) -> Result<BwResult> {
    let duration = crate::opts::duration(o).unwrap_or(5);
    let margin = crate::opts::margin(o).unwrap_or(0);
    let t = Traffic::new(s, o, kind, size);
    let batch = o.post_list as u64;
    let mut out = [blueflame::Completion::default(); 16];
    ready.wait();
    let mut window = Window::new(Instant::now(), duration, margin);
    // --run_infinitely: a result every `duration` seconds, for ever (perftest's
    // print_bw_infinite_mode: the requests completed since the last one, over that time).
    let mut period = (Instant::now(), 0u64);
    let (mut posted, mut done) = (0u64, 0u64);
    loop {
        let now = Instant::now();
        let ending = !o.run_infinitely && window.note(now, done);
        if ending && done == posted {
            break;
        }
        if o.run_infinitely && now - period.0 >= Duration::from_secs(duration) {
            each(&BwResult::over(
                done - period.1,
                (now - period.0).as_secs_f64(),
                size,
            ))?;
            period = (now, done);
        }
        while !ending && posted - done + batch <= t.in_flight {
            t.post(s, batch)?;
            posted += batch;
        }
        for c in turn(s, rx.as_deref_mut(), &mut out)? {
            check(c);
            done += c.cookie;
        }
    }
    let (iters, secs) = window.measured();
    Ok(BwResult::over(iters, secs, size))
}

/// The phases of a `-D` run (perftest's `catch_alarm`: START for `margin` seconds, SAMPLE
/// for `duration - 2 * margin`, STOP_SAMPLE for `margin`, then END), and the completion
/// count when the measured phase began and ended.
struct Window {
    sample: Instant,
    stop: Instant,
    end: Instant,
    first: Option<(Instant, u64)>,
    last: Option<(Instant, u64)>,
}

impl Window {
    /// A run of `duration` seconds from `t0` with `margin` seconds unmeasured at each end
    /// (`duration > 2 * margin`, checked by the options).
    fn new(t0: Instant, duration: u64, margin: u64) -> Window {
        let sample = t0 + Duration::from_secs(margin);
        Window {
            sample,
            stop: sample + Duration::from_secs(duration - 2 * margin),
            end: t0 + Duration::from_secs(duration),
            first: None,
            last: None,
        }
    }

    /// At `now`, `done` requests have completed; true once the run is over (post no more).
    fn note(&mut self, now: Instant, done: u64) -> bool {
        if self.first.is_none() && now >= self.sample {
            self.first = Some((now, done));
        }
        if self.last.is_none() && now >= self.stop {
            self.last = Some((now, done));
        }
        now >= self.end
    }

    /// The requests completed in the measured phase and its length in seconds (as it was
    /// seen: from the first note in it to the first note past it).
    fn measured(&self) -> (u64, f64) {
        match (self.first, self.last) {
            (Some((t1, d1)), Some((t2, d2))) => (d2 - d1, (t2 - t1).as_secs_f64().max(1e-9)),
            _ => (0, 1e-9),
        }
    }
}

/// Counts the completions `cs` of a bandwidth run (each retires `cookie` requests) into
/// `done`, stamping when each arrived; when the count crosses `warmup`, the clock (`start`)
/// restarts and the stamps so far are dropped. A failed completion ends the program.
pub(crate) fn tally(
    cs: &[blueflame::Completion],
    warmup: u64,
    done: &mut u64,
    start: &mut Instant,
    stamps: &mut Vec<(Instant, u64)>,
) {
    for c in cs {
        check(c);
        let before = *done;
        *done += c.cookie;
        if before < warmup && *done >= warmup {
            *start = Instant::now();
            stamps.clear();
        }
        stamps.push((Instant::now(), *done));
    }
}

/// perftest's "MB" of its bandwidth columns: 2^20 bytes (`MEGA` in perftest's
/// `perftest_parameters.h`, the `format_factor` of `print_report_bw` without
/// `--report_gbits`).
pub(crate) const PERFTEST_MB: f64 = 1_048_576.0;

/// The result of a bandwidth run of `total` requests of `size` bytes whose measured part
/// (past `warmup`) took `secs`: the average, and the peak over a tenth of the `stamps`, in
/// perftest's MB/sec ([`PERFTEST_MB`] bytes per second); the message rate in millions per
/// second (perftest's Mpps).
pub(crate) fn result(
    total: u64,
    warmup: u64,
    size: usize,
    secs: f64,
    stamps: &[(Instant, u64)],
) -> BwResult {
    let iters = total - warmup.min(total);
    let base = BwResult::over(iters.max(1), secs, size);
    let window = (stamps.len() / 10).max(1);
    let mut peak = base.avg;
    for w in stamps.windows(window + 1) {
        let (t0, n0) = w[0];
        let (t1, n1) = w[window];
        let dt = (t1 - t0).as_secs_f64();
        if dt > 0.0 {
            peak = peak.max((n1 - n0) as f64 * size as f64 / dt / PERFTEST_MB);
        }
    }
    BwResult {
        peak,
        iters,
        ..base
    }
}

/// The receiver of a send test: keeps receives posted until `total` messages arrived, or
/// (a `-D` run) until `stop` is set: the sender sets it once every send it posted has
/// completed, so every message has arrived.
fn receive(
    mut s: Side,
    size: usize,
    total: u64,
    ready: impl FnOnce() -> Result<()>,
    stop: &AtomicBool,
) -> Result<Option<(Instant, Instant)>> {
    let depth = 256.min(total);
    for i in 0..depth {
        s.post_recv(&[s.mr.sge(0, size as u32)?], i)?;
    }
    ready()?;
    let (mut got, mut posted) = (0u64, depth);
    let mut out = [blueflame::Completion::default(); 16];
    // When the first and the last message arrived (perftest's server times from its first).
    let mut first = None;
    while got < total && !stop.load(Ordering::Acquire) {
        s.dev.process();
        let k = s.cq.poll(&mut out);
        if k > 0 && first.is_none() {
            first = Some(Instant::now());
        }
        for c in &out[..k] {
            if !c.is_ok() {
                eprintln!("bfperf: receive failed: {c:?}");
                std::process::exit(1);
            }
            got += 1;
            if posted < total {
                s.post_recv(&[s.mr.sge(0, size as u32)?], posted)?;
                posted += 1;
            }
        }
    }
    Ok(first.map(|f| (f, Instant::now())))
}

/// A bandwidth test against perftest's program (`Setup::Perftest`), as its `ib_*_bw` runs
/// it: `-n` requests (perftest's send test has no warm-up, and the server counts them), the
/// last address exchange once this side is ready (the server's receives posted); then the
/// client's report to a write or read server, which prints it (so does bfperf's server);
/// the send server measures from its first message to its last; perftest's close.
fn against_perftest(
    mut s: Side,
    mut link: PerftestLink,
    o: &Opts,
    kind: Bw,
    size: usize,
    each: Each<'_>,
) -> Result<Option<BwResult>> {
    let failed = crate::setup::peer_failed;
    let o = Opts {
        warmup: 0,
        ..o.clone()
    };
    let mine = link.mine;
    let total = o.iters as u64;
    let r = if link.client {
        link.wire.hand_shake(&mine).map_err(failed)?;
        let r = initiate(&mut s, &o, kind, size, &Barrier::new(1), None, each)?;
        if link.test.reports() {
            let mine_r = Report {
                size: size as u64,
                iters: r.iters,
                bw_peak: r.peak,
                bw_avg: r.avg,
                msg_rate: r.mpps,
            };
            link.wire.reports(&mine, &mine_r).map_err(failed)?;
        }
        Some(r)
    } else if link.test == Test::SendBw {
        let wire = &mut link.wire;
        let ready = move || wire.hand_shake(&mine).map(|_| ()).map_err(failed);
        let span = receive(s, size, total, ready, &AtomicBool::new(false))?;
        span.map(|(a, b)| BwResult::over(total, (b - a).as_secs_f64().max(1e-9), size))
    } else {
        link.wire.hand_shake(&mine).map_err(failed)?;
        let theirs = link
            .wire
            .reports(&mine, &Report::default())
            .map_err(failed)?;
        Some(BwResult {
            peak: theirs.bw_peak,
            avg: theirs.bw_avg,
            mpps: theirs.msg_rate,
            iters: theirs.iters,
        })
    };
    if link.test.closes() {
        link.wire.close(&mine).map_err(failed)?;
    }
    Ok(r)
}

/// Runs one bandwidth test of `size` bytes; the result on the side that measures.
pub fn run(
    o: &Opts,
    kind: Bw,
    setup: Setup,
    size: usize,
    each: Each<'_>,
) -> Result<Option<BwResult>> {
    // A -D run's receiver keeps receives posted until told to stop.
    let total = if crate::opts::duration(o).is_some() {
        u64::MAX
    } else {
        (o.warmup + o.iters) as u64
    };
    match setup {
        Setup::Local(mut a, b) => {
            if kind != Bw::Send {
                let r = initiate(&mut a, o, kind, size, &Barrier::new(1), None, each)?;
                drop(b);
                return Ok(Some(r));
            }
            if a.dev.nic().is_some() {
                let mut rx = Rx::new(b, size, total)?;
                crate::pin(o.pin);
                let r = initiate(&mut a, o, kind, size, &Barrier::new(1), Some(&mut rx), each)?;
                while crate::opts::duration(o).is_none() && rx.got < total {
                    a.dev.process();
                    rx.step()?;
                }
                return Ok(Some(r));
            }
            let ready = Arc::new(Barrier::new(2));
            let r2 = ready.clone();
            let stop = Arc::new(AtomicBool::new(false));
            let s2 = stop.clone();
            let t = std::thread::spawn(move || {
                let ready = || {
                    r2.wait();
                    Ok(())
                };
                receive(b, size, total, ready, &s2).map(|_| ())
            });
            crate::pin(o.pin);
            let r = initiate(&mut a, o, kind, size, &ready, None, each);
            stop.store(true, Ordering::Release);
            t.join()
                .map_err(|_| blueflame::Error::Unsupported("the receiver thread panicked"))??;
            r.map(Some)
        }
        Setup::Server(s, mut stream) => {
            crate::pin(o.pin);
            if kind == Bw::Send {
                receive(s, size, total, || Ok(()), &AtomicBool::new(false))?;
            }
            sync(&mut stream)?;
            Ok(None)
        }
        Setup::Client(mut s, mut stream) => {
            crate::pin(o.pin);
            let r = initiate(&mut s, o, kind, size, &Barrier::new(1), None, each)?;
            sync(&mut stream)?;
            Ok(Some(r))
        }
        Setup::Perftest(s, link) => {
            crate::pin(o.pin);
            against_perftest(s, link, o, kind, size, each)
        }
        // `setup` refuses an `ibv_rc_pingpong` peer for anything but send-lat.
        Setup::RcPingpong(..) => Err(blueflame::Error::Unsupported(
            "a bandwidth test against ibv_rc_pingpong",
        )),
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

    /// perftest's unit: 1000 messages of 1 MiB in one second are 1000 MB/sec (2^20-byte
    /// MB), not 1048.576; the message rate is in millions per second.
    #[test]
    fn bandwidth_is_in_perftests_mb_and_the_rate_in_mpps() {
        let r = result(1000, 0, 1 << 20, 1.0, &[]);
        assert!((r.avg - 1000.0).abs() < 1e-9, "{}", r.avg);
        assert!((r.peak - 1000.0).abs() < 1e-9, "{}", r.peak);
        assert!((r.mpps - 0.001).abs() < 1e-12, "{}", r.mpps);
    }
}
