//! Latency tests, as perftest's `ib_*_lat`: write, write with immediate and send are
//! ping-pongs (half the round trip is reported), read and atomic time one request until its
//! completion is polled. A write is seen by the change of its last byte; a write with
//! immediate and a send by a receive completion (which event mode sleeps for).

use crate::hwts::{Split, Summary};
use crate::opts::{Atomic, Opts};
use crate::perftest::Test;
use crate::setup::{sync, PerftestLink, Pingpong, Setup, Side};
use crate::stats::{Clock, Timed};
use crate::window::Window;
use blueflame::PostSend;
use blueflame::{Payload, PostFlags, Remote, Request, Result, Sge};
use std::sync::{Arc, Barrier};
use std::time::Instant;

/// Which latency test.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Lat {
    /// RDMA write ping-pong.
    Write,
    /// RDMA write with immediate ping-pong (each message consumes a receive).
    WriteImm,
    /// RDMA read.
    Read,
    /// Send / receive ping-pong.
    Send,
    /// Fetch-add or compare-swap.
    Atomic(Atomic),
}

impl Lat {
    /// Whether each message consumes a receive at the peer (and completes there).
    fn receives(self) -> bool {
        matches!(self, Lat::Send | Lat::WriteImm)
    }
}

fn tag_of(i: usize) -> u8 {
    (i % 255) as u8 + 1
}

/// The ping-pong message of `kind` carrying `data` (a write with immediate carries `tag` as
/// its immediate too).
fn message<'a>(kind: Lat, remote: Remote, data: Payload<'a>, tag: u8) -> Request<'a> {
    match kind {
        Lat::Send => Request::Send { data },
        Lat::WriteImm => Request::WriteImm {
            remote,
            data,
            imm: tag as u32,
        },
        _ => Request::Write { remote, data },
    }
}

/// Posts this side's message of `size` bytes whose last byte is `tag`.
fn post_msg(s: &mut Side, o: &Opts, size: usize, tag: u8, kind: Lat, cookie: u64) -> Result<()> {
    post_msg_with(s, o, size, tag, kind, cookie, PostFlags::UNSIGNALED)
}

/// [`post_msg`] with `flags` (perftest's write ping-pong signals every write).
fn post_msg_with(
    s: &mut Side,
    o: &Opts,
    size: usize,
    tag: u8,
    kind: Lat,
    cookie: u64,
    flags: PostFlags,
) -> Result<()> {
    // A write ping-pong polls only to reclaim the send queue (its writes are unsignaled; the
    // moderation completion of half a queue ago frees it): when the queue is full, poll until
    // it has room. A fixed drain period is not enough: on rxe the verbs QP of the default
    // sizes holds 63 requests (51 asked, rounded up), fewer than the 64 between drains, and
    // the 64th post failed while the peer's thread spun for ever on the byte it waited for.
    while s.qp.free_send() == 0 {
        s.dev.process();
        s.drain_errors();
    }
    let peer = Remote {
        addr: s.peer.addr,
        rkey: s.peer.rkey,
    };
    if size <= o.inline as usize && size <= s.msg.len() {
        s.msg[size - 1] = tag;
        let req = message(kind, peer, Payload::Inline(&s.msg[..size]), tag);
        s.qp.post(&req, cookie, flags)
    } else {
        // The tag in the message's last byte is what a plain write's peer watches for. A
        // dma-buf has no CPU view (and --use_dmabuf runs no plain write-lat): its messages
        // are the exporter's bytes, the receiver learns of them from a completion.
        if s.mr.dmabuf.is_none() {
            s.mr.write(2 * size - 1, &[tag])?;
        }
        let sge = [Sge {
            addr: s.mr.addr() + size as u64,
            len: size as u32,
            lkey: s.mr.lkey(),
        }];
        let req = message(kind, peer, Payload::Sgl(&sge), tag);
        s.qp.post(&req, cookie, flags)
    }
}

fn post_recv(s: &mut Side, size: usize, cookie: u64) -> Result<()> {
    let sge = [s.mr.sge(0, size as u32)?];
    s.post_recv(&sge, cookie)
}

/// Waits for the next receive (a send, or a write with immediate carrying `tag`); send
/// completions (moderation) are skipped by the poller. Returns the NIC's time of the
/// receive (`--hw-timestamps`; None otherwise).
fn wait_recv(s: &mut Side, tag: u8) -> Result<Option<u64>> {
    use blueflame::WcOpcode;
    loop {
        let (c, at) = s.next_completion_at()?;
        match c.opcode {
            WcOpcode::Recv => return Ok(at),
            WcOpcode::RecvRdmaWithImm if c.imm == Some(tag as u32) => return Ok(at),
            WcOpcode::RecvRdmaWithImm => {
                eprintln!("bfperf: immediate {:?}, expected {tag}", c.imm);
                std::process::exit(1);
            }
            _ => {}
        }
    }
}

/// The responder of a ping-pong: echoes every message.
fn respond(
    mut s: Side,
    o: &Opts,
    kind: Lat,
    size: usize,
    total: usize,
    ready: &Barrier,
) -> Result<()> {
    if kind.receives() {
        for i in 0..64.min(total) {
            post_recv(&mut s, size, i as u64)?;
        }
    }
    ready.wait();
    for i in 0..total {
        let tag = tag_of(i);
        match kind {
            Lat::Write => s.wait_byte(size - 1, tag)?,
            Lat::Send | Lat::WriteImm => {
                wait_recv(&mut s, tag)?;
            }
            _ => return Ok(()),
        }
        post_msg(&mut s, o, size, tag, kind, i as u64)?;
        // The receive is replenished after the reply is posted, while it is on the wire:
        // 64 receives are posted ahead, so the next message always finds one.
        if kind.receives() && i + 64 < total {
            post_recv(&mut s, size, (i + 64) as u64)?;
        }
        if kind == Lat::Write && i % 64 == 63 {
            // Only a write test may drain here: a send test's CQ also carries the next receive.
            s.drain_errors();
        }
    }
    Ok(())
}

/// What the measuring side of a latency test returns: one sample per measured iteration
/// (ns; cycles with `-C`), and the split of `--hw-timestamps`.
pub type LatResult = (Vec<f64>, Option<Summary>);

/// The initiator: returns one sample per measured iteration but the last (perftest's
/// `measure_cnt = iters - 1`: n stamps, n - 1 differences), in nanoseconds (cycles with
/// `-C`), and the `--hw-timestamps` split of the measured ones.
///
/// Timed as perftest times (`tposted[scnt] = get_cycles()` before each post, the samples
/// the differences of consecutive stamps, halved for a ping-pong): one TSC read per
/// iteration into a buffer allocated before the loop, the conversion after it. The loop
/// holds what perftest's `run_iter_lat_write` / `run_iter_lat_send` / `run_iter_lat` hold
/// (post, wait for the echo or the completion) and, for sends, the replenished receive,
/// posted while the message travels (perftest posts it between the receive and its
/// reply).
fn initiate(s: &mut Side, o: &Opts, kind: Lat, size: usize, ready: &Barrier) -> Result<LatResult> {
    let total = o.warmup + o.iters;
    // One stamp per iteration, taken before its post (perftest's `tposted`).
    let mut stamps: Vec<u64> =
        crate::stats::room_for(total, "--iters plus --warmup (no memory for a stamp each)")?;
    let clock = Clock::for_samples(o.cycles);
    let mut split = match o.hw_ts {
        true => Some(Split::new(&s.dev, clock, o.iters)?),
        false => None,
    };
    if kind.receives() {
        for i in 0..64.min(total) {
            post_recv(s, size, i as u64)?;
        }
    }
    ready.wait();
    let peer = Remote {
        addr: s.peer.addr,
        rkey: s.peer.rkey,
    };
    // The read's and the atomics' local buffer, checked once.
    let read_sge = [s.mr.sge(size, size as u32)?];
    let atomic_sge = s.mr.sge(size, 8)?;
    for i in 0..total {
        let tag = tag_of(i);
        let posted = clock.now();
        stamps.push(posted);
        // When the post returned (`--hw-timestamps` only), and the NIC's time of the
        // completion that ends the iteration.
        let mut rung = 0;
        let mut ring = |split: &Option<Split>| {
            if split.is_some() {
                rung = clock.now();
            }
        };
        let at = match kind {
            Lat::Write => {
                post_msg(s, o, size, tag, kind, i as u64)?;
                s.wait_byte(size - 1, tag)?;
                if i % 64 == 63 {
                    s.drain_errors();
                }
                None
            }
            Lat::Send | Lat::WriteImm => {
                post_msg(s, o, size, tag, kind, i as u64)?;
                ring(&split);
                // Replenished while the message travels (64 receives are posted ahead).
                if i + 64 < total {
                    post_recv(s, size, (i + 64) as u64)?;
                }
                wait_recv(s, tag)?
            }
            Lat::Read => {
                s.qp.read(&read_sge, peer, i as u64, PostFlags::SIGNALED)?;
                ring(&split);
                s.next_completion_at()?.1
            }
            Lat::Atomic(a) => {
                match a {
                    Atomic::FetchAdd => {
                        s.qp.fetch_add(peer, 1, atomic_sge, i as u64, PostFlags::SIGNALED)?
                    }
                    Atomic::CompareSwap => s.qp.compare_swap(
                        peer,
                        i as u64,
                        i as u64 + 1,
                        atomic_sge,
                        i as u64,
                        PostFlags::SIGNALED,
                    )?,
                }
                ring(&split);
                s.next_completion_at()?.1
            }
        };
        if let Some(sp) = split.as_mut().filter(|_| i >= o.warmup) {
            sp.add(posted, rung, at, clock.now());
        }
    }
    let half = !matches!(kind, Lat::Read | Lat::Atomic(_));
    let split = split.map(|sp| sp.finish(&s.dev)).transpose()?;
    Ok((samples_of(&stamps, o.warmup, clock, half), split))
}

/// The samples (ns, or cycles with `-C`: [`Clock::sample`]) of per-iteration stamps
/// (`stamps[i]` at the start of iteration `i`): the iterations from `warmup` on, halved for
/// a ping-pong (perftest's `rtt_factor`, in cycles too).
fn samples_of(stamps: &[u64], warmup: usize, clock: Clock, half: bool) -> Vec<f64> {
    let div = if half { 2.0 } else { 1.0 };
    stamps
        .windows(2)
        .skip(warmup)
        .map(|w| clock.sample(w[0], w[1]) / div)
        .collect()
}

/// Waits until side `x` received message `i` (tag `tag`), re-posting its receive; the
/// NIC's time of the receive (`--hw-timestamps`).
fn arrive(
    x: &mut Side,
    kind: Lat,
    size: usize,
    tag: u8,
    i: usize,
    total: usize,
) -> Result<Option<u64>> {
    if kind.receives() {
        let at = wait_recv(x, tag)?;
        if i + 64 < total {
            post_recv(x, size, (i + 64) as u64)?;
        }
        Ok(at)
    } else {
        x.wait_byte(size - 1, tag).map(|()| None)
    }
}

/// Both roles of a ping-pong in one thread (the software NIC needs the other core for its
/// own thread): A sends, B echoes, A sees the echo.
fn pingpong_one_thread(
    a: &mut Side,
    b: &mut Side,
    o: &Opts,
    kind: Lat,
    size: usize,
) -> Result<LatResult> {
    let total = o.warmup + o.iters;
    if kind.receives() {
        for i in 0..64.min(total) {
            post_recv(a, size, i as u64)?;
            post_recv(b, size, i as u64)?;
        }
    }
    let mut samples = crate::stats::room_for(o.iters, "--iters (no memory for a sample each)")?;
    let clock = Clock::for_samples(o.cycles);
    let mut split = match o.hw_ts {
        true => Some(Split::new(&a.dev, clock, o.iters)?),
        false => None,
    };
    for i in 0..total {
        let tag = tag_of(i);
        let t0 = clock.now();
        post_msg(a, o, size, tag, kind, i as u64)?;
        let rung = if split.is_some() { clock.now() } else { 0 };
        arrive(b, kind, size, tag, i, total)?;
        post_msg(b, o, size, tag, kind, i as u64)?;
        let at = arrive(a, kind, size, tag, i, total)?;
        let done = clock.now();
        a.drain_errors();
        b.drain_errors();
        // The measured iterations but the last: as many samples as perftest keeps (n
        // stamps, n - 1 differences), here each one iteration's own round trip.
        if i >= o.warmup && i + 1 < total {
            samples.push(clock.sample(t0, done) / 2.0);
            if let Some(sp) = split.as_mut() {
                sp.add(t0, rung, at, done);
            }
        }
    }
    let split = split.map(|sp| sp.finish(&a.dev)).transpose()?;
    Ok((samples, split))
}

/// Runs one latency test of `size` bytes; the samples (ns; cycles with `-C`) on the side
/// that measures.
pub fn run(o: &Opts, kind: Lat, setup: Setup, size: usize) -> Result<Option<LatResult>> {
    place::<Counted>(o, kind, setup, size)
}

/// One latency test: its options, kind and message size.
#[derive(Clone, Copy)]
struct Case<'a> {
    o: &'a Opts,
    kind: Lat,
    size: usize,
}

/// The loops of one latency mode, for [`place`] to run on each side of a test: counted
/// (`-n`, [`Counted`]) or timed (`-D`, [`TimedLoops`]).
trait Loops {
    /// What the measuring side measured.
    type Out;
    /// The side that starts each iteration (and measures).
    fn initiate(s: &mut Side, t: Case<'_>, ready: &Barrier) -> Result<Self::Out>;
    /// The side that echoes a ping-pong.
    fn respond(s: Side, t: Case<'_>, ready: &Barrier) -> Result<()>;
    /// Both roles of a ping-pong in one thread (the software NIC's).
    fn one_thread(a: &mut Side, b: &mut Side, t: Case<'_>) -> Result<Self::Out>;
    /// Against perftest's program.
    fn perftest(s: Side, link: PerftestLink, t: Case<'_>) -> Result<Option<Self::Out>>;
    /// Against `ibv_rc_pingpong` (this side its client or not, the run's size and count;
    /// pins the thread itself).
    fn rc_pingpong(s: Side, run: Pingpong, t: Case<'_>) -> Result<Option<Self::Out>>;
}

/// `-n` iterations after the warm-up ([`run`]).
struct Counted;

impl Loops for Counted {
    type Out = LatResult;
    fn initiate(s: &mut Side, t: Case<'_>, ready: &Barrier) -> Result<LatResult> {
        initiate(s, t.o, t.kind, t.size, ready)
    }
    fn respond(s: Side, t: Case<'_>, ready: &Barrier) -> Result<()> {
        respond(s, t.o, t.kind, t.size, t.o.warmup + t.o.iters, ready)
    }
    fn one_thread(a: &mut Side, b: &mut Side, t: Case<'_>) -> Result<LatResult> {
        pingpong_one_thread(a, b, t.o, t.kind, t.size)
    }
    fn perftest(s: Side, link: PerftestLink, t: Case<'_>) -> Result<Option<LatResult>> {
        against_perftest(s, link, t.o, t.kind, t.size)
    }
    fn rc_pingpong(mut s: Side, run: Pingpong, t: Case<'_>) -> Result<Option<LatResult>> {
        // `ibv_rc_pingpong`'s loop: the client sends first, each side `-n` messages
        // (no warm-up); its server posted its receives before the exchange.
        crate::pin(t.o.pin);
        let o = Opts {
            warmup: 0,
            iters: run.iters,
            ..t.o.clone()
        };
        if run.client {
            initiate(&mut s, &o, t.kind, run.size, &Barrier::new(1)).map(Some)
        } else {
            respond(s, &o, t.kind, run.size, o.iters, &Barrier::new(1))?;
            eprintln!("bfperf: the peer is ibv_rc_pingpong");
            Ok(None)
        }
    }
}

/// Until the run's end (`-D`, [`run_timed`]).
struct TimedLoops;

impl Loops for TimedLoops {
    type Out = Timed;
    fn initiate(s: &mut Side, t: Case<'_>, ready: &Barrier) -> Result<Timed> {
        initiate_timed(s, t.o, t.kind, t.size, ready)
    }
    fn respond(s: Side, t: Case<'_>, ready: &Barrier) -> Result<()> {
        respond_timed(s, t.o, t.kind, t.size, ready)
    }
    fn one_thread(a: &mut Side, b: &mut Side, t: Case<'_>) -> Result<Timed> {
        pingpong_one_thread_timed(a, b, t.o, t.kind, t.size)
    }
    fn perftest(s: Side, link: PerftestLink, t: Case<'_>) -> Result<Option<Timed>> {
        against_perftest_timed(s, link, t.o, t.kind, t.size)
    }
    fn rc_pingpong(_: Side, _: Pingpong, _: Case<'_>) -> Result<Option<Timed>> {
        Err(blueflame::Error::Unsupported(
            "-D with an ibv_rc_pingpong peer: it counts -n messages and has no timed mode (run without -D)",
        ))
    }
}

/// Runs one latency test of `size` bytes in the loops of `L` on the sides `setup` holds:
/// both here (one thread on the software NIC, two otherwise; a read or atomic needs no
/// responder), a server or client of another bfperf, or a peer that is perftest's or
/// `ibv_rc_pingpong`. What the measuring side measured (None on the other).
fn place<L: Loops>(o: &Opts, kind: Lat, setup: Setup, size: usize) -> Result<Option<L::Out>>
where
    L::Out: Send + 'static,
{
    let passive = matches!(kind, Lat::Read | Lat::Atomic(_));
    let t = Case { o, kind, size };
    match setup {
        Setup::Local(mut a, b) => {
            if passive {
                let r = L::initiate(&mut a, t, &Barrier::new(1))?;
                drop(b);
                return Ok(Some(r));
            }
            if a.dev.nic().is_some() {
                crate::pin(o.pin);
                let mut b = b;
                return L::one_thread(&mut a, &mut b, t).map(Some);
            }
            let ready = Arc::new(Barrier::new(2));
            let (r2, o2) = (ready.clone(), o.clone());
            let responder = std::thread::spawn(move || {
                let t = Case { o: &o2, kind, size };
                L::respond(b, t, &r2)
            });
            crate::pin(o.pin);
            let r = L::initiate(&mut a, t, &ready);
            let resp = responder
                .join()
                .map_err(|_| blueflame::Error::Unsupported("the responder thread panicked"))?;
            resp?;
            r.map(Some)
        }
        Setup::Server(s, mut stream) => {
            crate::pin(o.pin);
            if !passive {
                L::respond(s, t, &Barrier::new(1))?;
            }
            sync(&mut stream)?;
            Ok(None)
        }
        Setup::Client(mut s, mut stream) => {
            crate::pin(o.pin);
            let r = L::initiate(&mut s, t, &Barrier::new(1))?;
            sync(&mut stream)?;
            Ok(Some(r))
        }
        Setup::Perftest(s, link) => {
            crate::pin(o.pin);
            L::perftest(s, link, t)
        }
        Setup::RcPingpong(s, run) => L::rc_pingpong(s, run, t),
    }
}

/// The phases of a timed run (`-D`, `-f`) from now.
fn window(o: &Opts) -> Window {
    let d = crate::opts::duration(o).unwrap_or(0);
    Window::new(Instant::now(), d, crate::opts::margin(o).unwrap_or(0))
}

/// What a timed run measured (`Window::measured`), as perftest's report takes it: half a
/// round trip in a ping-pong, a whole request in read and atomic tests.
///
/// # Errors
/// No iteration completed in the measured time (the peer answered none before this side's
/// end): perftest would print a t_avg of infinity.
fn timed(kind: Lat, (iters, secs): (u64, f64)) -> Result<Timed> {
    if iters == 0 {
        eprintln!(
            "bfperf: -D: no iteration completed in the measured time (the peer answered none before this side's end)"
        );
        return Err(blueflame::Error::InvalidParameter {
            what: "-D run (see the line above): iterations measured",
            value: 0,
        });
    }
    let rtt = if kind.receives() || kind == Lat::Write {
        2
    } else {
        1
    };
    Ok(Timed { iters, secs, rtt })
}

/// [`wait_recv`] in a timed run: false once `end` is past with no receive.
///
/// # Errors
/// A write with immediate whose immediate is not the message's tag (typed: the peer's
/// input), or the device's.
fn wait_recv_until(s: &mut Side, tag: u8, end: Instant) -> Result<bool> {
    use blueflame::WcOpcode;
    loop {
        let Some(c) = s.next_completion_until(end)? else {
            return Ok(false);
        };
        match c.opcode {
            WcOpcode::Recv => return Ok(true),
            WcOpcode::RecvRdmaWithImm if c.imm == Some(tag as u32) => return Ok(true),
            WcOpcode::RecvRdmaWithImm => {
                return Err(blueflame::Error::InvalidParameter {
                    what: "immediate of the peer's write (the message's tag expected)",
                    value: c.imm.map_or(u64::MAX, u64::from),
                })
            }
            _ => {}
        }
    }
}

/// [`arrive`] in a timed run: false once `end` is past with the message not there.
fn arrive_until(
    x: &mut Side,
    kind: Lat,
    size: usize,
    tag: u8,
    i: usize,
    end: Instant,
) -> Result<bool> {
    if kind.receives() {
        if !wait_recv_until(x, tag, end)? {
            return Ok(false);
        }
        post_recv(x, size, (i + 64) as u64)?;
        Ok(true)
    } else {
        x.wait_byte_until(size - 1, tag, end)
    }
}

/// The responder of a timed ping-pong (`-D`): echoes every message until its own end
/// (perftest's END_STATE), and stops there whether or not a message is on its way (the
/// initiator's end comes within a moment of it, and in the margin after the measured time).
fn respond_timed(mut s: Side, o: &Opts, kind: Lat, size: usize, ready: &Barrier) -> Result<()> {
    if kind.receives() {
        for i in 0..64 {
            post_recv(&mut s, size, i)?;
        }
    }
    ready.wait();
    let end = window(o).end();
    for i in 0usize.. {
        let tag = tag_of(i);
        let came = match kind {
            Lat::Write => s.wait_byte_until(size - 1, tag, end)?,
            Lat::Send | Lat::WriteImm => wait_recv_until(&mut s, tag, end)?,
            _ => return Ok(()),
        };
        if !came {
            break;
        }
        post_msg(&mut s, o, size, tag, kind, i as u64)?;
        if kind.receives() {
            post_recv(&mut s, size, (i + 64) as u64)?;
        }
        if kind == Lat::Write && i % 64 == 63 {
            s.drain_errors();
        }
    }
    Ok(())
}

/// The initiator of a timed run (`-D`), as perftest's `run_iter_lat*` in duration mode:
/// iterations (a round trip, or a read's or atomic's completion) until the run's end, those
/// completed in its middle counted, over the middle's length ([`Window`]). A wait for the
/// peer gives up at the end (the peer may have stopped on its own clock).
fn initiate_timed(
    s: &mut Side,
    o: &Opts,
    kind: Lat,
    size: usize,
    ready: &Barrier,
) -> Result<Timed> {
    if kind.receives() {
        for i in 0..64 {
            post_recv(s, size, i)?;
        }
    }
    ready.wait();
    let peer = Remote {
        addr: s.peer.addr,
        rkey: s.peer.rkey,
    };
    let read_sge = [s.mr.sge(size, size as u32)?];
    let atomic_sge = s.mr.sge(size, 8)?;
    let mut w = window(o);
    let end = w.end();
    let mut done = 0u64;
    while !w.note(Instant::now(), done) {
        let i = done as usize;
        let tag = tag_of(i);
        let came = match kind {
            Lat::Write => {
                post_msg(s, o, size, tag, kind, done)?;
                let came = s.wait_byte_until(size - 1, tag, end)?;
                if i % 64 == 63 {
                    s.drain_errors();
                }
                came
            }
            Lat::Send | Lat::WriteImm => {
                post_msg(s, o, size, tag, kind, done)?;
                post_recv(s, size, done + 64)?;
                wait_recv_until(s, tag, end)?
            }
            Lat::Read => {
                s.qp.read(&read_sge, peer, done, PostFlags::SIGNALED)?;
                s.next_completion_until(end)?.is_some()
            }
            Lat::Atomic(a) => {
                match a {
                    Atomic::FetchAdd => {
                        s.qp.fetch_add(peer, 1, atomic_sge, done, PostFlags::SIGNALED)?
                    }
                    Atomic::CompareSwap => s.qp.compare_swap(
                        peer,
                        done,
                        done + 1,
                        atomic_sge,
                        done,
                        PostFlags::SIGNALED,
                    )?,
                }
                s.next_completion_until(end)?.is_some()
            }
        };
        if !came {
            break;
        }
        done += 1;
    }
    w.note(Instant::now(), done);
    timed(kind, w.measured())
}

/// Both roles of a timed ping-pong in one thread (the software NIC's), as
/// [`pingpong_one_thread`].
fn pingpong_one_thread_timed(
    a: &mut Side,
    b: &mut Side,
    o: &Opts,
    kind: Lat,
    size: usize,
) -> Result<Timed> {
    if kind.receives() {
        for i in 0..64 {
            post_recv(a, size, i)?;
            post_recv(b, size, i)?;
        }
    }
    let mut w = window(o);
    let end = w.end();
    let mut done = 0u64;
    while !w.note(Instant::now(), done) {
        let i = done as usize;
        let tag = tag_of(i);
        post_msg(a, o, size, tag, kind, done)?;
        if !arrive_until(b, kind, size, tag, i, end)? {
            break;
        }
        post_msg(b, o, size, tag, kind, done)?;
        if !arrive_until(a, kind, size, tag, i, end)? {
            break;
        }
        a.drain_errors();
        b.drain_errors();
        done += 1;
    }
    w.note(Instant::now(), done);
    timed(kind, w.measured())
}

/// Runs one timed latency test (`-D`) of `size` bytes, as [`run`] places its sides; what
/// the measuring side measured.
///
/// # Errors
/// An `ibv_rc_pingpong` peer (typed, before any message: it has no timed mode), no
/// iteration measured, or the device's.
pub fn run_timed(o: &Opts, kind: Lat, setup: Setup, size: usize) -> Result<Option<Timed>> {
    place::<TimedLoops>(o, kind, setup, size)
}

/// A timed latency test (`-D`) against perftest's program, in perftest's loops of duration
/// mode: `ib_read_lat`'s client reads until its end (its server only waits for the close,
/// timed or not); `ib_write_lat` and `ib_send_lat` ping-pong until each side's own end
/// ([`pingpong_perftest_timed`]). The perftest side must be given `-D` too (perftest's
/// exchange does not carry it).
fn against_perftest_timed(
    s: Side,
    link: PerftestLink,
    o: &Opts,
    kind: Lat,
    size: usize,
) -> Result<Option<Timed>> {
    with_perftest(
        s,
        link,
        |s| initiate_timed(s, o, kind, size, &Barrier::new(1)),
        |s, client, ready| pingpong_perftest_timed(s, o, kind, size, client, ready),
    )
}

/// [`pingpong_perftest`] in duration mode (perftest's `run_iter_lat_write` and
/// `run_iter_lat_send` with `-D`): the same messages, counts and first mover, for as long
/// as this side's run lasts; each wait for the peer (its message, and a write's own
/// completion) gives up at this side's end, as perftest's `state != END_STATE`; the
/// iterations completed in the middle counted ([`Window`]).
fn pingpong_perftest_timed(
    s: &mut Side,
    o: &Opts,
    kind: Lat,
    size: usize,
    client: bool,
    ready: impl FnOnce() -> Result<()>,
) -> Result<Timed> {
    let recv = kind.receives();
    if recv {
        for i in 0..64 {
            post_recv(s, size, i)?;
        }
    }
    ready()?;
    let count = |n: u64| n as u8;
    let first = if kind == Lat::Write { !client } else { client };
    let mut w = window(o);
    let end = w.end();
    let (mut waits, mut done) = (0u64, 0u64);
    while !w.note(Instant::now(), done) {
        if done > 0 || !first {
            waits += 1;
            let came = if recv {
                let came = wait_recv_until(s, count(waits), end)?;
                if came {
                    post_recv(s, size, waits + 63)?;
                }
                came
            } else {
                s.wait_byte_until(size - 1, count(waits), end)?
            };
            if !came {
                break;
            }
        }
        if kind == Lat::Write {
            post_msg_with(s, o, size, count(done + 1), kind, done, PostFlags::SIGNALED)?;
            if s.next_completion_until(end)?.is_none() {
                break;
            }
        } else {
            post_msg(s, o, size, count(done + 1), kind, done)?;
        }
        done += 1;
    }
    w.note(Instant::now(), done);
    timed(kind, w.measured())
}

/// A latency test against perftest's program (`Setup::Perftest`), in perftest's loop:
/// `-n` iterations in all (perftest has no warm-up), each side timing as perftest's
/// `run_iter_lat_*` times (a stamp before each post; the samples the differences of
/// consecutive stamps, halved for a ping-pong).
fn against_perftest(
    s: Side,
    link: PerftestLink,
    o: &Opts,
    kind: Lat,
    size: usize,
) -> Result<Option<LatResult>> {
    let o = Opts {
        warmup: 0,
        ..o.clone()
    };
    with_perftest(
        s,
        link,
        |s| initiate(s, &o, kind, size, &Barrier::new(1)),
        |s, client, ready| Ok((pingpong_perftest(s, &o, kind, size, client, ready)?, None)),
    )
}

/// What a latency test against perftest's program does around its loop, counted or timed:
/// the last address exchange once this side is ready (its receives posted), `read` on
/// `ib_read_lat`'s client (its server measures nothing and only waits for the close),
/// `pingpong` for `ib_write_lat` and `ib_send_lat` (given the exchange to make when ready),
/// and perftest's close where its test has one. None where this side measures nothing.
fn with_perftest<R>(
    mut s: Side,
    mut link: PerftestLink,
    read: impl FnOnce(&mut Side) -> Result<R>,
    pingpong: impl FnOnce(&mut Side, bool, Box<dyn FnOnce() -> Result<()> + '_>) -> Result<R>,
) -> Result<Option<R>> {
    let failed = crate::setup::peer_failed;
    let mine = link.mine;
    let r = match link.test {
        Test::Read => {
            link.wire.hand_shake(&mine).map_err(failed)?;
            match link.client {
                true => Some(read(&mut s)?),
                false => None,
            }
        }
        Test::WriteBw | Test::ReadBw | Test::SendBw => {
            return Err(blueflame::Error::Unsupported(
                "a bandwidth test's perftest exchange in a latency test",
            ))
        }
        Test::Write | Test::Send => {
            let wire = &mut link.wire;
            let ready = Box::new(move || wire.hand_shake(&mine).map(|_| ()).map_err(failed));
            Some(pingpong(&mut s, link.client, ready)?)
        }
    };
    if link.test.closes() {
        link.wire.close(&mine).map_err(failed)?;
    }
    if !link.client || r.is_none() {
        eprintln!("bfperf: the peer is perftest {}", link.version);
    }
    Ok(r)
}

/// perftest's ping-pong of writes (`run_iter_lat_write`: each write signaled and its
/// completion polled, its last byte the message count, the server first) or of sends
/// (`run_iter_lat_send`: into posted receives, the client first), `o.iters` messages each
/// way; `ready` once the receives are posted. The samples: perftest's, `iters - 1` of them.
fn pingpong_perftest(
    s: &mut Side,
    o: &Opts,
    kind: Lat,
    size: usize,
    client: bool,
    ready: impl FnOnce() -> Result<()>,
) -> Result<Vec<f64>> {
    let iters = o.iters;
    let recv = kind.receives();
    if recv {
        for i in 0..64.min(iters) {
            post_recv(s, size, i as u64)?;
        }
    }
    let clock = Clock::for_samples(o.cycles);
    ready()?;
    // perftest's count of messages, as its `(char)` cast keeps it: 1, 2, ..., 255, 0, 1 ...
    let count = |n: usize| n as u8;
    let first = if kind == Lat::Write { !client } else { client };
    let mut waits = 0usize;
    let wait = |s: &mut Side, waits: &mut usize| -> Result<()> {
        *waits += 1;
        if recv {
            wait_recv(s, count(*waits))?;
            if *waits + 64 <= iters {
                post_recv(s, size, (*waits + 63) as u64)?;
            }
            Ok(())
        } else {
            s.wait_byte(size - 1, count(*waits))
        }
    };
    let mut stamps = crate::stats::room_for(iters, "--iters (no memory for a stamp each)")?;
    for i in 0..iters {
        if i > 0 || !first {
            wait(s, &mut waits)?;
        }
        stamps.push(clock.now());
        if kind == Lat::Write {
            post_msg_with(
                s,
                o,
                size,
                count(i + 1),
                kind,
                i as u64,
                PostFlags::SIGNALED,
            )?;
            s.next_completion()?;
        } else {
            post_msg(s, o, size, count(i + 1), kind, i as u64)?;
        }
    }
    if first {
        // The echo of the last message.
        wait(s, &mut waits)?;
    }
    Ok(stamps
        .windows(2)
        .map(|w| clock.sample(w[0], w[1]) / 2.0)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--use_dmabuf` latency tests on the software NIC: a send ping-pong and a write with
    /// immediate ping-pong run on dma-buf regions (no CPU view: no tag written, the echo a
    /// completion), and the messages land in the dma-bufs, seen through the exporters.
    #[test]
    fn dmabuf_ping_pongs_land_in_the_dmabufs() {
        use crate::setup::{dmabuf_dest, Setup, DMABUF_SOURCE};
        for (kind, test) in [(Lat::Send, "send_lat"), (Lat::WriteImm, "write_imm_lat")] {
            for size in [8, 4096] {
                let o = Opts {
                    dmabuf: true,
                    inline: 0,
                    iters: 50,
                    warmup: 5,
                    write_imm: kind == Lat::WriteImm,
                    ..Opts::default()
                };
                let dev = blueflame::Device::sim();
                let Setup::Local(mut a, mut b) =
                    crate::setup::setup(&o, &dev, test, size).expect("setup")
                else {
                    panic!("not a local pair");
                };
                let area = |s: &Side| {
                    let mut got = vec![0u8; size];
                    let buf = s.mr.dmabuf.as_ref().expect("dma-buf");
                    buf.read(0, &mut got).expect("exporter");
                    got
                };
                // Before: each side's destination area holds its own byte.
                assert_eq!(area(&a), vec![dmabuf_dest(0); size]);
                assert_eq!(area(&b), vec![dmabuf_dest(1); size]);
                let (samples, _) =
                    pingpong_one_thread(&mut a, &mut b, &o, kind, size).expect("ping-pong");
                assert_eq!(samples.len(), 49, "{kind:?} {size}: iters - 1, as perftest");
                // After: the peer's source area, carried by the NIC.
                for s in [&a, &b] {
                    assert_eq!(area(s), vec![DMABUF_SOURCE; size], "{kind:?} {size}");
                }
            }
        }
    }

    /// perftest's way: each sample is the time from one iteration's stamp to the next's,
    /// halved for a ping-pong; the warm-up iterations are dropped.
    #[test]
    fn samples_are_the_differences_of_consecutive_stamps() {
        let clock = Clock::new();
        let stamps = [100u64, 110, 130, 160];
        let half = samples_of(&stamps, 1, clock, true);
        assert_eq!(
            half,
            vec![clock.ns(110, 130) / 2.0, clock.ns(130, 160) / 2.0]
        );
        let whole = samples_of(&stamps, 0, clock, false);
        assert_eq!(whole.len(), 3);
        assert_eq!(whole[2], clock.ns(130, 160));
        assert!(samples_of(&stamps, 3, clock, false).is_empty());
        // -C: the raw differences of the stamps, halved for a ping-pong (perftest's
        // `delta / (1 * rtt_factor)`), whatever the clock's calibration.
        let cycles = Clock::for_samples(true);
        assert_eq!(samples_of(&stamps, 0, cycles, true), vec![5.0, 10.0, 15.0]);
        assert_eq!(samples_of(&stamps, 1, cycles, false), vec![20.0, 30.0]);
    }
}
