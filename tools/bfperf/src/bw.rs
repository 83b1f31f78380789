//! Bandwidth and message-rate tests, as perftest's `ib_*_bw`: `tx-depth` requests in
//! flight, `post-list` requests per doorbell (the last one signaled), for `iters` requests.

use crate::opts::{Atomic, Opts};
use crate::perftest::{Report, Test};
use crate::setup::{sync, PerftestLink, Setup, Side};
use crate::window::Window;
use blueflame::{Payload, Remote, Request, Result, Sge};
use std::io::{Read, Write};
use std::net::TcpStream;
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
    /// perftest's peak: the message size over the least time per request between a post
    /// and a later completion ([`peak_delta`]), in perftest's MB/s (2^20 bytes,
    /// [`PERFTEST_MB`]); 0 when not measured (a timed run, or more than [`PEAK_ITERS`]
    /// iterations per QP, as perftest's `noPeak`).
    pub peak: f64,
    /// Bandwidth over the measured run (from its first post to its last completion in a
    /// counted run), perftest's MB/s.
    pub avg: f64,
    /// Messages per second, millions.
    pub mpps: f64,
    /// The requests measured: `--iters`, or those completed in the measured part of a
    /// `-D` run.
    pub iters: u64,
    /// A `-b` run: this side's result and the peer's, whose sum the others are (perftest's
    /// `--report-both` prints them).
    pub sides: Option<[Figures; 2]>,
}

/// One side's figures of a bidirectional run.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct Figures {
    pub peak: f64,
    pub avg: f64,
    pub mpps: f64,
    pub iters: u64,
}

impl BwResult {
    /// The figures alone (no sides).
    fn figures(&self) -> Figures {
        Figures {
            peak: self.peak,
            avg: self.avg,
            mpps: self.mpps,
            iters: self.iters,
        }
    }

    /// No peak, and `iters` requests of `size` bytes in `secs` seconds: the average in
    /// perftest's MB/sec and the rate in Mpps (a timed run's figures; a counted run adds its
    /// peak).
    fn over(iters: u64, secs: f64, size: usize) -> BwResult {
        BwResult {
            peak: 0.0,
            avg: iters as f64 * size as f64 / secs / PERFTEST_MB,
            mpps: iters as f64 / secs / 1e6,
            iters,
            sides: None,
        }
    }
}

/// What every request of a bandwidth test on one QP of a side is made of: its local entry,
/// its inline data (writes and sends that fit), the peer's buffer, and how many may be in
/// flight (`tx-depth`, or fewer when the queue holds fewer: never a refused post, the
/// queue's depth is what the device gave). QP `lane` uses the `lane`-th slice of the side's
/// buffer and of the peer's (`Side::stride`).
struct Traffic {
    kind: Bw,
    lane: usize,
    sge: [Sge; 1],
    inline: Option<Vec<u8>>,
    remote: Remote,
    in_flight: u64,
}

impl Traffic {
    fn new(s: &mut Side, o: &Opts, kind: Bw, size: usize, lane: usize) -> Traffic {
        let fits =
            matches!(kind, Bw::Write | Bw::Send) && size <= o.inline as usize && size <= 1024;
        let at = (lane * s.stride()) as u64;
        Traffic {
            kind,
            lane,
            sge: [Sge {
                addr: s.mr.addr() + at + size as u64,
                len: size as u32,
                lkey: s.mr.lkey(),
            }],
            inline: fits.then(|| vec![0x5au8; size]),
            remote: Remote {
                addr: s.peer.addr + at,
                rkey: s.peer.rkey,
            },
            in_flight: (o.tx_depth as u64).min(s.qp_at(lane).send_depth() as u64),
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

    /// Posts `n` requests on the QP `qp` under one doorbell, the last one signaled; the
    /// cookie of the signaled one says how many requests its completion retires (the low 32
    /// bits) and on which QP of the side (the high 32: `lane`).
    fn post(&self, qp: &mut crate::setup::Sq, n: u64) -> Result<()> {
        qp.post_n(&self.request(), n, n | (self.lane as u64) << 32)
    }
}

/// Ends the program on a failed completion (a bandwidth figure over failed requests would
/// be a lie).
pub(crate) fn check(c: &blueflame::Completion) {
    if !c.is_ok() {
        eprintln!("bfperf: completion failed: {c:?}");
        std::process::exit(1);
    }
}

/// One side's sending in a bandwidth run, as perftest's `run_iter_bw` over its
/// `num_of_qps`: each QP `warmup + iters` requests (or until told to stop, in a timed run)
/// with its own `tx-depth` in flight, all completing on the side's CQ; the completions
/// counted over all its QPs. The warm-up is drained (every warm-up request of every QP
/// completed) before the first measured request is posted, so the measured requests are
/// stamped ([`Stamps`]) from their own posts to their own completions.
struct Sender {
    lanes: Vec<Traffic>,
    posted: Vec<u64>,
    done: Vec<u64>,
    /// Requests per QP, warm-up included (`u64::MAX` in a timed run).
    per_lane: u64,
    /// Warm-up requests per QP.
    warmup_lane: u64,
    batch: u64,
    /// Warm-up requests of all QPs.
    warmup: u64,
    posted_all: u64,
    done_all: u64,
    /// Nothing more is posted (the end of a timed run).
    closed: bool,
    stamps: Stamps,
}

impl Sender {
    fn new(s: &mut Side, o: &Opts, kind: Bw, size: usize) -> Sender {
        let n = s.lanes();
        let timed = crate::opts::duration(o).is_some();
        Sender {
            lanes: (0..n).map(|i| Traffic::new(s, o, kind, size, i)).collect(),
            posted: vec![0; n],
            done: vec![0; n],
            per_lane: if timed {
                u64::MAX
            } else {
                (o.warmup + o.iters) as u64
            },
            warmup_lane: if timed { 0 } else { o.warmup as u64 },
            batch: o.post_list as u64,
            warmup: if timed { 0 } else { (o.warmup * n) as u64 },
            posted_all: 0,
            done_all: 0,
            closed: false,
            stamps: Stamps::new((o.iters as u64).saturating_mul(n as u64), measures_peak(o)),
        }
    }

    /// Requests of all QPs (warm-up included).
    fn total(&self) -> u64 {
        self.per_lane.saturating_mul(self.lanes.len() as u64)
    }

    /// Posts on each QP, in turn, what its depth lets in (batches of `post_list`, the last
    /// one shorter if the count says so): the warm-up's requests, then, once all of them
    /// completed, the measured ones (no batch holds both), each measured batch stamped as
    /// it is posted.
    fn post(&mut self, s: &mut Side) -> Result<()> {
        if self.closed {
            return Ok(());
        }
        let limit = if self.done_all < self.warmup {
            self.warmup_lane
        } else {
            self.per_lane
        };
        for (i, t) in self.lanes.iter().enumerate() {
            loop {
                let n = self.batch.min(limit.saturating_sub(self.posted[i]));
                if n == 0 || self.posted[i] - self.done[i] + n > t.in_flight {
                    break;
                }
                if self.posted_all >= self.warmup {
                    self.stamps.posting(n);
                }
                t.post(s.qp_at(i), n)?;
                self.posted[i] += n;
                self.posted_all += n;
            }
        }
        Ok(())
    }

    /// Counts a send-side completion (see [`Traffic::post`] for its cookie), stamped if
    /// it retires measured requests (the warm-up drained before any was posted).
    fn take(&mut self, c: &blueflame::Completion) {
        let (lane, n) = ((c.cookie >> 32) as usize, c.cookie & 0xffff_ffff);
        if let Some(d) = self.done.get_mut(lane) {
            *d += n;
        }
        if self.done_all >= self.warmup {
            self.stamps.completed(n);
        }
        self.done_all += n;
    }

    fn finished(&self) -> bool {
        self.done_all >= self.total()
    }

    /// The result of a counted run: the requests of all QPs past the warm-up (perftest's
    /// `iters * num_of_qps`), perftest's figures of their stamps (one completion per
    /// `post_list` batch: bfperf's `cq_mod` is its `post_list`).
    fn result(&self, size: usize) -> BwResult {
        let iters = self.total().saturating_sub(self.warmup);
        self.stamps.result(iters, size, self.batch, self.batch)
    }
}

/// A side's receives in a send test: kept posted on each of its QPs (or, with `--srq`, on
/// its SRQ for all of them) until `per_lane` messages per QP are in.
struct Rx {
    /// QP numbers of the side's QPs, to repost on the one a message came in on.
    qpns: Vec<u32>,
    /// Receives posted per pool (a QP each, or the one SRQ).
    posted: Vec<u64>,
    limit: u64,
    got: u64,
    size: usize,
    stride: usize,
}

impl Rx {
    fn new(s: &mut Side, size: usize, per_lane: u64) -> Result<Rx> {
        let n = s.lanes();
        let pools = if s.srq.is_some() { 1 } else { n };
        let per_pool = (n / pools) as u64;
        let limit = per_lane.saturating_mul(per_pool);
        let depth = (256 * per_pool).min(limit);
        let qpns = (0..n).map(|i| s.qp_at(i).qpn()).collect();
        let stride = s.stride();
        for p in 0..pools {
            for k in 0..depth {
                let sge = s.mr.sge(p * stride, size as u32)?;
                s.post_recv_at(p, &[sge], k)?;
            }
        }
        Ok(Rx {
            qpns,
            posted: vec![depth; pools],
            limit,
            got: 0,
            size,
            stride,
        })
    }

    /// Takes a receive completion and posts the next receive where it came from.
    fn take(&mut self, s: &mut Side, c: &blueflame::Completion) -> Result<()> {
        self.got += 1;
        let pool = if self.posted.len() == 1 {
            0
        } else {
            self.qpns.iter().position(|&q| q == c.qpn).unwrap_or(0)
        };
        if self.posted[pool] < self.limit {
            let sge = s.mr.sge(pool * self.stride, self.size as u32)?;
            s.post_recv_at(pool, &[sge], self.posted[pool])?;
            self.posted[pool] += 1;
        }
        Ok(())
    }

    fn finished(&self) -> bool {
        self.got >= self.limit.saturating_mul(self.posted.len() as u64)
    }
}

/// One side in a driven loop: its sending (if it sends) and its receives (send tests).
struct Party<'a> {
    side: &'a mut Side,
    tx: Option<Sender>,
    rx: Option<Rx>,
}

/// Whether a completion is a receive's (else the side's own request completed).
fn is_receive(c: &blueflame::Completion) -> bool {
    c.opcode.is_receive()
}

/// Runs the parties' loops interleaved in this thread until every sender and receiver is
/// done (perftest's loop over its QPs: post what fits on each, then poll): one side's QPs
/// (`-q`), both sides of a one-process run on the software NIC (whose thread needs the
/// other core), or both directions (`-b`). A timed run (`-D`, one sender) ends as
/// [`Window`] says, and its result is returned; a counted run's results are its senders'.
fn drive(ps: &mut [Party<'_>], o: &Opts, size: usize, each: Each<'_>) -> Result<Option<BwResult>> {
    let t0 = Instant::now();
    let mut window = crate::opts::duration(o).map(|d| {
        let m = if o.run_infinitely {
            0
        } else {
            crate::opts::margin(o).unwrap_or(0)
        };
        (Window::new(t0, d, m), d)
    });
    // --run_infinitely: a result every `duration` seconds, for ever (perftest's
    // print_bw_infinite_mode: the requests completed since the last one, over that time).
    let mut period = (t0, 0u64);
    let mut out = [blueflame::Completion::default(); 16];
    loop {
        if let Some((w, d)) = window.as_mut() {
            let Some(tx) = ps.iter_mut().find_map(|p| p.tx.as_mut()) else {
                break;
            };
            let now = Instant::now();
            if !o.run_infinitely && w.note(now, tx.done_all) {
                tx.closed = true;
                if tx.done_all == tx.posted_all {
                    break;
                }
            }
            if o.run_infinitely && now - period.0 >= Duration::from_secs(*d) {
                each(&BwResult::over(
                    tx.done_all - period.1,
                    (now - period.0).as_secs_f64(),
                    size,
                ))?;
                period = (now, tx.done_all);
            }
        } else if ps.iter().all(|p| {
            p.tx.as_ref().is_none_or(Sender::finished) && p.rx.as_ref().is_none_or(Rx::finished)
        }) {
            break;
        }
        for p in ps.iter_mut() {
            if let Some(tx) = p.tx.as_mut() {
                tx.post(p.side)?;
            }
            p.side.dev.process();
            let k = p.side.cq.poll(&mut out);
            for c in &out[..k] {
                check(c);
                if is_receive(c) {
                    if let Some(rx) = p.rx.as_mut() {
                        rx.take(p.side, c)?;
                    }
                } else if let Some(tx) = p.tx.as_mut() {
                    tx.take(c);
                }
            }
        }
    }
    Ok(window.map(|(w, _)| {
        let (iters, secs) = w.measured();
        BwResult::over(iters, secs, size)
    }))
}

/// One side sending alone (its QPs, no receives driven here), after `ready`.
fn initiate(
    s: &mut Side,
    o: &Opts,
    kind: Bw,
    size: usize,
    ready: &Barrier,
    each: Each<'_>,
) -> Result<BwResult> {
    let tx = Sender::new(s, o, kind, size);
    ready.wait();
    let mut ps = [Party {
        side: s,
        tx: Some(tx),
        rx: None,
    }];
    let timed = drive(&mut ps, o, size, each)?;
    let tx = ps[0].tx.as_ref().map(|t| t.result(size));
    Ok(timed.or(tx).unwrap_or(BwResult::over(0, 1.0, size)))
}

/// perftest's "MB" of its bandwidth columns: 2^20 bytes (`MEGA` in perftest's
/// `perftest_parameters.h`, the `format_factor` of `print_report_bw` without
/// `--report_gbits`).
pub(crate) const PERFTEST_MB: f64 = 1_048_576.0;

/// What one MB/s (of [`PERFTEST_MB`]) is in the table's unit: 1, or in Gb/s with
/// `--report_gbits` (bits per second over 10^9: perftest's `format_factor` 125000000).
pub(crate) fn table_unit(o: &Opts) -> f64 {
    if o.gbits {
        PERFTEST_MB * 8.0 / 1e9
    } else {
        1.0
    }
}

/// Above this many iterations a counted run measures no peak (perftest's default
/// `noPeak`: "peak up to iters=20000"; its peak's search is quadratic in the requests).
pub(crate) const PEAK_ITERS: usize = 20_000;

/// Whether a run with `o`'s options measures a peak: not asked off (`-N`), a counted run of at most
/// [`PEAK_ITERS`] iterations per QP (perftest turns its peak off above them, and in a
/// timed run), and of at most as many requests over all its QPs: the search is quadratic
/// in the side's requests, and bfperf signals every `post_list` requests where perftest
/// signals every 100 (its `cq_mod`), so `-q 8 -n 20000` would search for minutes.
pub(crate) fn measures_peak(o: &Opts) -> bool {
    !o.no_peak
        && crate::opts::duration(o).is_none()
        && o.iters <= PEAK_ITERS
        && o.iters.saturating_mul(o.qps.max(1)) <= PEAK_ITERS
}

/// The clock of a counted bandwidth run's measured requests, as perftest's `run_iter_bw`
/// keeps it: `tposted[i]`, when measured request `i` was posted (the post of its
/// `post_list` batch), and `tcompleted[j]`, when the completion that retired request `j`
/// was polled (a signaled request's completion retires every request up to it, so every
/// request of its batch gets the stamp, as perftest's `tcompleted[totccnt - 1]` for its
/// `cq_mod` batch); requests are numbered over all the side's QPs in the order they were
/// posted and retired (perftest's `totscnt` / `totccnt`). Nanoseconds since `origin`.
/// Without a peak only the first post and the last completion are kept.
pub(crate) struct Stamps {
    origin: Instant,
    peak: bool,
    posted: Vec<u64>,
    completed: Vec<u64>,
    first: Option<u64>,
    last: Option<u64>,
}

impl Stamps {
    /// For `requests` measured requests (over all QPs); `peak`: keep every stamp.
    pub(crate) fn new(requests: u64, peak: bool) -> Stamps {
        let cap = if peak {
            requests.min(1 << 24) as usize
        } else {
            0
        };
        Stamps {
            origin: Instant::now(),
            peak,
            posted: Vec::with_capacity(cap),
            completed: Vec::with_capacity(cap),
            first: None,
            last: None,
        }
    }

    fn now(&self) -> u64 {
        self.origin.elapsed().as_nanos() as u64
    }

    /// `n` measured requests are about to be posted (one doorbell): stamped now.
    pub(crate) fn posting(&mut self, n: u64) {
        let t = self.now();
        self.first.get_or_insert(t);
        if self.peak {
            self.posted.extend((0..n).map(|_| t));
        }
    }

    /// A completion retiring `n` measured requests was polled: stamped now.
    pub(crate) fn completed(&mut self, n: u64) {
        let t = self.now();
        self.last = Some(t);
        if self.peak {
            self.completed.extend((0..n).map(|_| t));
        }
    }

    /// The result of `iters` measured requests (over all QPs) of `size` bytes, posted in
    /// batches of `post_list`, one completion per `cq_mod`: perftest's `print_report_bw`.
    /// The average over the time from the first measured post to the last completion; the
    /// peak [`peak_delta`]'s (0 when not measured, as perftest's); both in perftest's
    /// MB/sec ([`PERFTEST_MB`] bytes per second); the message rate in millions per second.
    pub(crate) fn result(&self, iters: u64, size: usize, post_list: u64, cq_mod: u64) -> BwResult {
        let secs = match (self.first, self.last) {
            (Some(a), Some(b)) => b.saturating_sub(a) as f64 / 1e9,
            _ => 0.0,
        }
        .max(1e-9);
        let peak = if self.peak {
            let delta = peak_delta(&self.posted, &self.completed, post_list, cq_mod);
            delta.map_or(0.0, |ns| size as f64 / (ns.max(1.0) / 1e9) / PERFTEST_MB)
        } else {
            0.0
        };
        let r = BwResult::over(iters, secs, size);
        BwResult {
            // The whole run is one of the peak's windows (first post to last completion),
            // so the peak is at least the average; where that window is the best the two,
            // computed in different orders, differed in the last bit (a test caught it:
            // 19.20191790599429 against 19.201917905994293).
            peak: if peak > 0.0 { peak.max(r.avg) } else { 0.0 },
            ..r
        }
    }
}

/// perftest's `opt_delta` (`print_report_bw`, perftest 4.5): the least time per request,
/// over every post `i` (a step of `post_list`) and every completion `j` after it (from
/// `ROUND_UP(i + 1, cq_mod) - 1` in steps of `cq_mod`, and the last request when the count
/// is not a multiple of `cq_mod`), of `(tcompleted[j] - tposted[i]) / (j - i + 1)`,
/// starting from `tcompleted[0] - tposted[0]`. In the stamps' unit, as a fraction (perftest
/// divides its cycles as integers); None without stamps.
pub(crate) fn peak_delta(
    posted: &[u64],
    completed: &[u64],
    post_list: u64,
    cq_mod: u64,
) -> Option<f64> {
    let n = posted.len().min(completed.len());
    if n == 0 {
        return None;
    }
    let (step, m) = (post_list.max(1) as usize, cq_mod.max(1) as usize);
    let t = |i: usize, j: usize| completed[j].saturating_sub(posted[i]) as f64 / (j - i + 1) as f64;
    let mut opt = t(0, 0);
    for i in (0..n).step_by(step) {
        let mut j = (i + 1).div_ceil(m) * m - 1;
        while j < n {
            opt = opt.min(t(i, j));
            j += m;
        }
        if !n.is_multiple_of(m) {
            opt = opt.min(t(i, n - 1));
        }
    }
    Some(opt)
}

/// The receiver of a send test: keeps receives posted on each of the side's QPs until
/// `total` messages per QP arrived, or (a `-D` run) until `stop` is set: the sender sets it
/// once every send it posted has completed, so every message has arrived.
fn receive(
    mut s: Side,
    size: usize,
    total: u64,
    ready: impl FnOnce() -> Result<()>,
    stop: &AtomicBool,
) -> Result<Option<(Instant, Instant)>> {
    let mut rx = Rx::new(&mut s, size, total)?;
    ready()?;
    let mut out = [blueflame::Completion::default(); 16];
    // When the first and the last message arrived (perftest's server times from its first).
    let mut first = None;
    while !rx.finished() && !stop.load(Ordering::Acquire) {
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
            rx.take(&mut s, c)?;
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
        let r = initiate(&mut s, &o, kind, size, &Barrier::new(1), each)?;
        if link.test.reports() {
            link.wire
                .reports(&mine, &to_wire(&r, size, &o))
                .map_err(failed)?;
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
        Some(from_wire(&theirs, &o))
    };
    if link.test.closes() {
        link.wire.close(&mine).map_err(failed)?;
    }
    Ok(r)
}

/// The report a client sends its perftest server: in the table's unit, as perftest's
/// client computes it (`format_factor`) and its server prints it as it comes (in MB/s, an
/// `--report_gbits` server showed figures 8.39 times too large: a review's finding).
fn to_wire(r: &BwResult, size: usize, o: &Opts) -> Report {
    let unit = table_unit(o);
    Report {
        size: size as u64,
        iters: r.iters,
        bw_peak: r.peak * unit,
        bw_avg: r.avg * unit,
        msg_rate: r.mpps,
    }
}

/// A client's report, in the table's unit, as a result (in MB/s, as every result).
fn from_wire(theirs: &Report, o: &Opts) -> BwResult {
    let unit = table_unit(o);
    BwResult {
        peak: theirs.bw_peak / unit,
        avg: theirs.bw_avg / unit,
        mpps: theirs.msg_rate,
        iters: theirs.iters,
        sides: None,
    }
}

/// Two sides' results summed as perftest prints a bidirectional run
/// (`print_full_bw_report` with the peer's report): the peaks, the averages and the
/// message rates added, the iterations this side's (`mine`).
pub(crate) fn both(mine: &BwResult, theirs: &BwResult) -> BwResult {
    BwResult {
        peak: mine.peak + theirs.peak,
        avg: mine.avg + theirs.avg,
        mpps: mine.mpps + theirs.mpps,
        iters: mine.iters,
        sides: Some([mine.figures(), theirs.figures()]),
    }
}

/// Sends this side's result and reads the peer's on `s` (perftest's `xchg_bw_reports` of a
/// `-b` run): four big-endian 8-byte words each way, the peak, average and rate as `f64`
/// bits and the iterations.
fn swap_results(s: &mut TcpStream, mine: &BwResult) -> Result<BwResult> {
    let io = blueflame::Error::Io;
    let mut b = Vec::with_capacity(32);
    for w in [
        mine.peak.to_bits(),
        mine.avg.to_bits(),
        mine.mpps.to_bits(),
        mine.iters,
    ] {
        b.extend_from_slice(&w.to_be_bytes());
    }
    s.write_all(&b).map_err(io)?;
    let mut r = [0u8; 32];
    s.read_exact(&mut r).map_err(io)?;
    let w = |i: usize| {
        let mut x = [0u8; 8];
        x.copy_from_slice(&r[8 * i..8 * i + 8]);
        u64::from_be_bytes(x)
    };
    Ok(BwResult {
        peak: f64::from_bits(w(0)),
        avg: f64::from_bits(w(1)),
        mpps: f64::from_bits(w(2)),
        iters: w(3),
        sides: None,
    })
}

/// One side of a test across two processes: it sends (the client; both with `-b`) and/or
/// receives (send tests: the server; both with `-b`). With `-b` both sides post their
/// receives, meet on `stream`, run at once, swap their results and print the sum, as
/// perftest's sides do; without it, the server only receives (a write or read server
/// does nothing) and the client measures.
fn one_side(
    mut s: Side,
    stream: &mut TcpStream,
    o: &Opts,
    kind: Bw,
    size: usize,
    total: u64,
    each: Each<'_>,
) -> Result<Option<BwResult>> {
    crate::pin(o.pin);
    let sends = o.bidirectional || !o.server;
    if !o.bidirectional && !sends {
        if kind == Bw::Send {
            receive(s, size, total, || Ok(()), &AtomicBool::new(false))?;
        }
        sync(stream)?;
        return Ok(None);
    }
    if !o.bidirectional {
        let r = initiate(&mut s, o, kind, size, &Barrier::new(1), each)?;
        sync(stream)?;
        return Ok(Some(r));
    }
    let rx = match kind {
        Bw::Send => Some(Rx::new(&mut s, size, total)?),
        _ => None,
    };
    let tx = Sender::new(&mut s, o, kind, size);
    // Both sides' receives are posted before either sends (perftest's hand shake before
    // its run_iter).
    sync(stream)?;
    let mut ps = [Party {
        side: &mut s,
        tx: Some(tx),
        rx,
    }];
    drive(&mut ps, o, size, each)?;
    let mine = ps[0]
        .tx
        .as_ref()
        .map_or(BwResult::over(0, 1.0, size), |t| t.result(size));
    let theirs = swap_results(stream, &mine)?;
    sync(stream)?;
    Ok(Some(both(&mine, &theirs)))
}

/// Both sides in this process, in one loop: `a` sends (`b` too with `-b`), the receives of
/// a send test taken in it (the software NIC's thread needs the other core); the result is
/// `a`'s, or with `-b` the sum of both sides' (as perftest's two processes print it).
fn local(
    a: &mut Side,
    b: &mut Side,
    o: &Opts,
    kind: Bw,
    size: usize,
    total: u64,
    each: Each<'_>,
) -> Result<BwResult> {
    let (send, bi) = (kind == Bw::Send, o.bidirectional);
    let ra = match send && bi {
        true => Some(Rx::new(a, size, total)?),
        false => None,
    };
    let rb = match send {
        true => Some(Rx::new(b, size, total)?),
        false => None,
    };
    let ta = Sender::new(a, o, kind, size);
    let tb = bi.then(|| Sender::new(b, o, kind, size));
    let mut ps = [
        Party {
            side: a,
            tx: Some(ta),
            rx: ra,
        },
        Party {
            side: b,
            tx: tb,
            rx: rb,
        },
    ];
    let timed = drive(&mut ps, o, size, each)?;
    let [ra, rb] = [&ps[0], &ps[1]].map(|p| p.tx.as_ref().map(|t| t.result(size)));
    let mine = timed.or(ra).unwrap_or(BwResult::over(0, 1.0, size));
    Ok(match rb {
        Some(theirs) => both(&mine, &theirs),
        None => mine,
    })
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
    let send = kind == Bw::Send;
    match setup {
        Setup::Local(mut a, b) if send && !o.bidirectional && a.dev.nic().is_none() => {
            // A device of its own: the receiver in a thread, as perftest's other process.
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
            let r = initiate(&mut a, o, kind, size, &ready, each);
            stop.store(true, Ordering::Release);
            t.join()
                .map_err(|_| blueflame::Error::Unsupported("the receiver thread panicked"))??;
            r.map(Some)
        }
        Setup::Local(mut a, mut b) => {
            crate::pin(o.pin);
            local(&mut a, &mut b, o, kind, size, total, each).map(Some)
        }
        Setup::Server(s, mut stream) | Setup::Client(s, mut stream) => {
            one_side(s, &mut stream, o, kind, size, total, each)
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

    /// The report a perftest server prints as it comes is in its table's unit: Gb/s with
    /// `--report_gbits` (1000 MB/s of 2^20 bytes are 8.388608 Gb/s), read back as MB/s.
    #[test]
    fn reports_to_a_perftest_server_are_in_the_tables_unit() {
        let r = BwResult {
            peak: 2000.0,
            avg: 1000.0,
            mpps: 0.5,
            iters: 10,
            sides: None,
        };
        for (gbits, avg) in [(false, 1000.0), (true, 8.388608)] {
            let o = Opts {
                gbits,
                ..Opts::default()
            };
            let w = super::to_wire(&r, 4096, &o);
            assert!((w.bw_avg - avg).abs() < 1e-9, "{gbits}: {}", w.bw_avg);
            assert!((w.bw_peak - 2.0 * avg).abs() < 1e-9);
            let back = super::from_wire(&w, &o);
            assert!((back.avg - 1000.0).abs() < 1e-9 && back.iters == 10);
        }
    }

    /// Stamps of a counted run as given (ns): `posted[i]` and `completed[i]` of each
    /// measured request.
    fn stamps(posted: Vec<u64>, completed: Vec<u64>) -> Stamps {
        Stamps {
            origin: Instant::now(),
            peak: true,
            first: posted.first().copied(),
            last: completed.last().copied(),
            posted,
            completed,
        }
    }

    /// perftest's unit: 1000 messages of 1 MiB in one second are 1000 MB/sec (2^20-byte
    /// MB), not 1048.576; the message rate is in millions per second. One message a
    /// millisecond, each completed a millisecond after its post: the peak is the average.
    #[test]
    fn bandwidth_is_in_perftests_mb_and_the_rate_in_mpps() {
        let posted: Vec<u64> = (0..1000).map(|i| i * 1_000_000).collect();
        let completed = posted.iter().map(|t| t + 1_000_000).collect();
        let r = stamps(posted, completed).result(1000, 1 << 20, 1, 1);
        assert!((r.avg - 1000.0).abs() < 1e-9, "{}", r.avg);
        assert!((r.peak - 1000.0).abs() < 1e-9, "{}", r.peak);
        assert!((r.mpps - 0.001).abs() < 1e-12, "{}", r.mpps);
    }

    /// Bursty completions (perftest's peak, not the best stretch between completions):
    /// 100 requests posted 10 ns apart, signaled every 10 (cq_mod 10), the completions of
    /// two batches polled 1 ns apart every 2 us (batch k at 2000 + 2000 * (k / 2) + k % 2).
    /// The least time per request is from the first post to the last completion, 10001 ns
    /// over 100 requests: a peak of 10^9 / 100.01 MB/s for 1 MiB messages (the old "best
    /// tenth of the completions" said 10 requests in 1 ns: 10^10 MB/s), about the average.
    #[test]
    fn the_peak_is_perftests_least_time_per_request() {
        let posted: Vec<u64> = (0..100).map(|i| i * 10).collect();
        let completed = (0..100u64)
            .map(|i| i / 10)
            .map(|k| 2000 + 2000 * (k / 2) + k % 2)
            .collect();
        let r = stamps(posted, completed).result(100, 1 << 20, 1, 10);
        let want = 1e9 / 100.01;
        assert!((r.peak / want - 1.0).abs() < 1e-9, "{} {want}", r.peak);
        assert!((r.avg / want - 1.0).abs() < 1e-9, "{}", r.avg);
    }

    /// perftest's search: posts in steps of `post_list` (4), completions from the first
    /// `cq_mod` boundary at or past the post, and the last request when the count (10) is
    /// not a multiple of `cq_mod` (4). Batches posted at 0, 100, 200 ns, completed at 1000,
    /// 1100, 1150: t(0,3) = 250, t(0,7) = 137.5, t(0,9) = 115 (the last request's only),
    /// t(4,7) = 250, t(4,9) = 175, t(8,9) = 475; the least 115.
    #[test]
    fn the_peak_counts_the_last_short_batch() {
        let batch = |i: u64| (i / 4).min(2);
        let posted: Vec<u64> = (0..10).map(|i| 100 * batch(i)).collect();
        let completed: Vec<u64> = (0..10)
            .map(|i| [1000, 1100, 1150][batch(i) as usize])
            .collect();
        assert_eq!(peak_delta(&posted, &completed, 4, 4), Some(115.0));
        assert_eq!(peak_delta(&[], &[], 4, 4), None);
        // No peak measured: 0, as perftest's (its noPeak), the average still there.
        let mut s = stamps(posted, completed);
        s.peak = false;
        let r = s.result(10, 1 << 20, 4, 4);
        assert_eq!(r.peak, 0.0);
        assert!((r.avg - 10.0 * 1e9 / 1150.0).abs() < 1e-6, "{}", r.avg);
    }

    /// perftest's noPeak: above 20000 iterations (per QP, and over all QPs) a counted run
    /// has no peak, and a timed run none.
    #[test]
    fn no_peak_above_twenty_thousand_iterations() {
        let o = |iters| Opts {
            iters,
            ..Opts::default()
        };
        assert!(measures_peak(&o(20_000)));
        assert!(!measures_peak(&o(20_001)));
        // Nor above as many requests over all the side's QPs (the search is quadratic).
        let q = |iters, qps| Opts {
            iters,
            qps,
            ..Opts::default()
        };
        assert!(measures_peak(&q(5_000, 4)));
        assert!(!measures_peak(&q(20_000, 2)));
    }

    /// A short counted run: the average is over the measured requests only, from the first
    /// one's post to the last completion. The old clock restarted once the warm-up's
    /// completions were counted, with measured requests already in flight or done: one
    /// batch of `-l 32` holding the warm-up's request and all 20 measured ones restarted it
    /// at its own completion (290 GB/s, 4.6 Mpps on the software NIC); perftest's
    /// `-n 20 -q 2 -b` with a warm-up far longer than the run. The software NIC copies 64
    /// KiB messages at a few GB/s at most.
    #[test]
    fn a_short_run_is_timed_from_its_first_measured_post() {
        for (bidirectional, qps, post_list, warmup) in [(false, 1, 32, 1), (true, 2, 1, 200)] {
            let o = Opts {
                bidirectional,
                qps,
                post_list,
                iters: 20,
                warmup,
                ..Opts::default()
            };
            let size = 64 << 10;
            let (mut a, mut b) = pair(&o, size);
            let total = (warmup + 20) as u64;
            let r = local(&mut a, &mut b, &o, Bw::Write, size, total, &mut |_| Ok(()));
            let r = r.expect("run");
            assert_eq!(r.iters, 20 * qps as u64, "{o:?}");
            let sides = r.sides.map_or(vec![r.figures()], |s| s.to_vec());
            assert_eq!(sides.len(), if bidirectional { 2 } else { 1 });
            for f in sides {
                // 100 GB/s, a message every 0.6 us: far above what the NIC can do here.
                assert!(f.avg < 100_000.0, "{o:?} {f:?}");
                assert!(f.mpps < 1.6, "{o:?} {f:?}");
                assert!(f.peak >= f.avg * (1.0 - 1e-9), "{o:?} {f:?}");
            }
        }
    }

    /// Both sides on the software NIC, with `o`'s options, for messages of `size`.
    fn pair(o: &Opts, size: usize) -> (Side, Side) {
        let dev = blueflame::Device::sim();
        match crate::setup::setup(o, &dev, "write_bw", size).expect("setup") {
            Setup::Local(a, b) => (a, b),
            _ => panic!("not a local pair"),
        }
    }

    /// perftest's `-q`: every QP of the side carries `warmup + iters` requests of its own
    /// (perftest's `run_iter_bw`: `iters` per QP), each into its own slice of the peer's
    /// buffer, and the result counts all QPs' measured requests (`iters * num_of_qps`).
    #[test]
    fn several_qps_each_carry_their_share() {
        for kind in [Bw::Write, Bw::Send] {
            let o = Opts {
                qps: 3,
                iters: 200,
                warmup: 10,
                ..Opts::default()
            };
            let (mut a, mut b) = pair(&o, 64);
            assert_eq!((a.lanes(), b.lanes()), (3, 3));
            let r = local(&mut a, &mut b, &o, kind, 64, 210, &mut |_| Ok(())).expect("run");
            assert_eq!(r.iters, 600, "{kind:?}");
            // Each QP's messages (inline 0x5a bytes) landed in its own slice.
            for lane in 0..3 {
                let at = lane * b.stride();
                assert_eq!(b.mr.read_volatile_u8(at).unwrap(), 0x5a, "{kind:?} {lane}");
                assert_eq!(b.mr.read_volatile_u8(at + 63).unwrap(), 0x5a, "{kind:?}");
                // and not in a's: one direction only.
                assert_eq!(a.mr.read_volatile_u8(at).unwrap(), 0, "{kind:?} {lane}");
            }
        }
    }

    /// `--use_dmabuf` on the software NIC: the same run as with plain buffers (the same
    /// iterations counted), and the bytes are seen where they must be through the
    /// exporters, the regions having no CPU view: a write or a send carries the sender's
    /// source area (set through its exporter) into the receiver's dma-buf, a read the
    /// responder's area into the reader's. A plain buffer in the place of either dma-buf
    /// would leave the exporter's bytes as they were set. Sizes 8 (a send small enough for
    /// scatter-to-CQE, off here) and 4096, with -q 2 and -b.
    #[test]
    fn dmabuf_buffers_carry_the_same_run_and_their_bytes_land_in_the_dmabuf() {
        use crate::setup::{dmabuf_dest, DMABUF_SOURCE};
        let exporter = |s: &Side, at: usize, len: usize| {
            let mut got = vec![0u8; len];
            let buf = s.mr.dmabuf.as_ref().expect("a dma-buf side");
            buf.read(at, &mut got).expect("read through the exporter");
            got
        };
        for kind in [Bw::Write, Bw::Send, Bw::Read] {
            for (size, bidirectional) in [(8, false), (4096, false), (64, true)] {
                let plain = Opts {
                    qps: 2,
                    iters: 100,
                    warmup: 10,
                    bidirectional,
                    ..Opts::default()
                };
                let o = Opts {
                    dmabuf: true,
                    inline: 0,
                    ..plain.clone()
                };
                let (mut pa, mut pb) = pair(&plain, size);
                let want = local(&mut pa, &mut pb, &plain, kind, size, 110, &mut |_| Ok(()))
                    .expect("plain run");
                let (mut a, mut b) = pair(&o, size);
                assert!(a.mr.read_volatile_u8(0).is_err(), "a CPU view of a dma-buf");
                let r = local(&mut a, &mut b, &o, kind, size, 110, &mut |_| Ok(())).expect("run");
                let what = format!("{kind:?} {size} bytes, -b {bidirectional}");
                assert_eq!(r.iters, want.iters, "{what}");
                let directions: &[(&Side, &Side, u64)] = if bidirectional {
                    &[(&a, &b, 1), (&b, &a, 0)]
                } else {
                    &[(&a, &b, 1)]
                };
                for &(from, to, to_which) in directions {
                    for lane in 0..2 {
                        let at = lane * to.stride();
                        if kind == Bw::Read {
                            // The reader's source area holds the responder's area.
                            let got = exporter(from, at + size, size);
                            assert_eq!(got, vec![dmabuf_dest(to_which); size], "{what}");
                        } else {
                            let got = exporter(to, at, size);
                            assert_eq!(got, vec![DMABUF_SOURCE; size], "{what} lane {lane}");
                        }
                    }
                }
            }
        }
    }

    /// A sender's counts, QP by QP: each QP posts and completes its own share.
    #[test]
    fn a_sender_counts_each_qp() {
        let o = Opts {
            qps: 4,
            iters: 50,
            warmup: 0,
            post_list: 4,
            ..Opts::default()
        };
        let (mut a, mut b) = pair(&o, 8);
        let tx = Sender::new(&mut a, &o, Bw::Write, 8);
        let mut ps = [
            Party {
                side: &mut a,
                tx: Some(tx),
                rx: None,
            },
            Party {
                side: &mut b,
                tx: None,
                rx: None,
            },
        ];
        drive(&mut ps, &o, 8, &mut |_| Ok(())).expect("run");
        let tx = ps[0].tx.as_ref().unwrap();
        assert_eq!(tx.done, vec![50; 4]);
        assert_eq!(tx.posted, vec![50; 4]);
        assert_eq!(tx.done_all, 200);
    }

    /// perftest's `-b`: both sides send at once (each side's buffer receives the other's
    /// messages), and the row is the sum of both sides' results, the iterations one side's.
    #[test]
    fn bidirectional_runs_both_directions_and_sums_them() {
        for kind in [Bw::Write, Bw::Read, Bw::Send] {
            let o = Opts {
                bidirectional: true,
                qps: 2,
                iters: 200,
                warmup: 10,
                ..Opts::default()
            };
            let (mut a, mut b) = pair(&o, 64);
            let r = local(&mut a, &mut b, &o, kind, 64, 210, &mut |_| Ok(())).expect("run");
            assert_eq!(r.iters, 400, "{kind:?}");
            if kind != Bw::Read {
                for s in [&a, &b] {
                    for lane in 0..2 {
                        let at = lane * s.stride();
                        assert_eq!(s.mr.read_volatile_u8(at).unwrap(), 0x5a, "{kind:?}");
                    }
                }
            }
        }
        let (x, y) = (
            BwResult::over(100, 1.0, 1 << 20),
            BwResult::over(300, 1.0, 1 << 20),
        );
        let s = both(&x, &y);
        assert!((s.avg - 400.0).abs() < 1e-9 && s.iters == 100, "{s:?}");
        assert!((s.mpps - 0.0004).abs() < 1e-12, "{s:?}");
        assert_eq!(s.sides, Some([x.figures(), y.figures()]));
    }

    /// The two sides of a `-b` run across two processes swap their results on the TCP
    /// stream, each reading the other's exactly.
    #[test]
    fn results_are_swapped_whole() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let theirs = BwResult {
            peak: 12.5,
            avg: 10.25,
            mpps: 0.75,
            iters: 1234,
            sides: None,
        };
        let t = std::thread::spawn(move || {
            let mut s = TcpStream::connect(addr).unwrap();
            swap_results(&mut s, &theirs).unwrap()
        });
        let (mut s, _) = l.accept().unwrap();
        let mine = BwResult::over(5, 1.0, 8);
        assert_eq!(swap_results(&mut s, &mine).unwrap(), theirs);
        assert_eq!(t.join().unwrap(), mine);
    }
}
