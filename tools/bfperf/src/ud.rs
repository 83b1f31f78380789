//! UD send latency and bandwidth (`-c ud`), as perftest's `ib_send_lat -c UD` and
//! `ib_send_bw -c UD`: two UD QPs with an address handle to each other (from the peer's
//! endpoint: GID, QP number, Q_Key), messages of at most the path MTU, receives 40 bytes
//! larger than the message for the GRH (perftest's `UD_ADDITION`).
//!
//! Latency: a ping-pong of sends, half the round trip reported. Bandwidth: `tx-depth` sends
//! in flight, every `min(tx-depth / 2, 64)`th signaled, measured at the sender from its
//! completions; the receiver keeps 256 receives posted and the sender never runs more than
//! that ahead of what arrived (a datagram that finds no receive is dropped, and a perftest
//! receiver that lost one waits for ever), so every message is received.
//!
//! Both sides run in this process (`--server` / `--client` are refused with `-c ud`): on an
//! rdma-core device the responder or receiver has its own thread, on the software NIC one
//! thread plays both sides (the NIC's own thread needs the other core).

use crate::bw::BwResult;
use crate::opts::Opts;
use crate::stats::Clock;
use blueflame::QueuePair;
use blueflame::{
    AddressHandle, Completion, Cq, CqOptions, Device, Error, MemoryRegion, Payload, PostFlags,
    QpCaps, Result, UdQp,
};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

/// perftest's `DEF_QKEY`.
const QKEY: u32 = 0x1111_1111;

/// Bytes in front of every UD receive's payload: the GRH area (perftest's `UD_ADDITION`).
const GRH_BYTES: u32 = 40;

/// Receives kept posted by a receiver.
const RX_DEPTH: u64 = 256;

/// One side: its UD QP, CQ, buffer and the address handle to the other side.
pub struct UdSide {
    dev: Device,
    qp: UdQp,
    cq: Cq,
    mr: MemoryRegion,
    ah: Option<AddressHandle>,
    peer_qpn: u32,
    pause: bool,
    events: bool,
}

fn caps(o: &Opts) -> QpCaps {
    let depth = (o.tx_depth as u32 * 2).next_power_of_two().max(256);
    QpCaps {
        sq_blocks: (depth * 8).min(crate::setup::MAX_SQ_BLOCKS),
        rq_entries: depth.max(2 * RX_DEPTH as u32),
        max_inline: o.inline,
        max_send_sge: 1,
        max_recv_sge: 1,
        ..QpCaps::default()
    }
}

/// Bytes of a side's buffer for messages of `size`: the receive area (GRH + message) at 0,
/// the source at `size + 40` rounded to 64.
fn src_off(size: usize) -> usize {
    (size + GRH_BYTES as usize).next_multiple_of(64)
}

fn side(dev: &Device, o: &Opts, pd: &blueflame::Pd, size: usize) -> Result<UdSide> {
    let caps = caps(o);
    let mut opts = CqOptions::new(caps.sq_blocks + caps.rq_entries);
    if o.events {
        opts = opts.channel(&dev.create_channel()?);
    }
    let cq = dev.create_cq_with(&opts)?;
    let qp = pd.create_ud_qp(&cq, &cq, caps, QKEY)?;
    let mr = pd.alloc_mr(src_off(size) + size.max(8), blueflame::Access::LOCAL_WRITE)?;
    Ok(UdSide {
        dev: dev.clone(),
        qp,
        cq,
        mr,
        ah: None,
        peer_qpn: 0,
        pause: dev.nic().is_some(),
        events: o.events,
    })
}

/// The largest UD message on `dev`: its path MTU (a UD QP is created to ask).
///
/// # Errors
/// As `Pd::create_ud_qp`.
pub fn mtu(dev: &Device, o: &Opts) -> Result<u32> {
    let pd = dev.alloc_pd()?;
    Ok(side(dev, o, &pd, 8)?.qp.mtu())
}

/// The sizes of a run that fit in one datagram (`-a` stops at the MTU, as perftest's);
/// a default size above it is the MTU (perftest's: `send-bw`'s 65536), an explicit
/// `--size` above it an error that says so.
///
/// # Errors
/// [`Error::MessageTooLong`] for an explicit size above `mtu`.
pub fn sizes(o: &Opts, mtu: u32) -> Result<Vec<usize>> {
    if !o.all && o.size > mtu as usize {
        if !o.size_given {
            return Ok(vec![mtu as usize]);
        }
        return Err(Error::MessageTooLong {
            len: o.size as u64,
            mtu,
        });
    }
    Ok(crate::opts::sizes(o)
        .into_iter()
        .filter(|&s| s <= mtu as usize)
        .collect())
}

/// Two sides in this process with address handles to each other.
pub fn pair(dev: &Device, o: &Opts, size: usize) -> Result<(UdSide, UdSide)> {
    let pd = dev.alloc_pd()?;
    let (mut a, mut b) = (side(dev, o, &pd, size)?, side(dev, o, &pd, size)?);
    let (ea, eb) = (a.qp.endpoint(), b.qp.endpoint());
    a.ah = Some(pd.create_ah(eb)?);
    a.peer_qpn = eb.qpn;
    b.ah = Some(pd.create_ah(ea)?);
    b.peer_qpn = ea.qpn;
    Ok((a, b))
}

impl UdSide {
    fn post_recv(&mut self, size: usize, cookie: u64) -> Result<()> {
        let sge = [self.mr.sge(0, size as u32 + GRH_BYTES)?];
        self.qp.post_recv(&sge, cookie)
    }

    /// Sends the `size`-byte message (inline when it fits), `signaled` or not.
    fn send(&mut self, o: &Opts, size: usize, cookie: u64, signaled: bool) -> Result<()> {
        while self.qp.free_send() == 0 {
            self.dev.process();
            self.drain_sends()?;
        }
        let flags = if signaled {
            PostFlags::SIGNALED
        } else {
            PostFlags::UNSIGNALED
        };
        let ah = self.ah.as_ref().ok_or(Error::InvalidState {
            state: "without an address handle to its peer",
        })?;
        let off = src_off(size);
        if size <= o.inline as usize && size <= 1024 {
            let mut msg = [0u8; 1024];
            let n = size;
            msg[n - 1] = cookie as u8;
            self.qp.send_to(
                ah,
                self.peer_qpn,
                QKEY,
                Payload::Inline(&msg[..n]),
                cookie,
                flags,
            )
        } else {
            let sge = [self.mr.sge(off, size as u32)?];
            self.qp
                .send_to(ah, self.peer_qpn, QKEY, Payload::Sgl(&sge), cookie, flags)
        }
    }

    /// Reclaims send-queue room (moderation completions are not reported); a reported
    /// completion here is an error.
    fn drain_sends(&mut self) -> Result<()> {
        let mut out = [Completion::default(); 8];
        let n = self.cq.poll(&mut out);
        if let Some(c) = out[..n].iter().find(|c| !c.is_ok()) {
            eprintln!("bfperf: completion failed: {c:?}");
            std::process::exit(1);
        }
        Ok(())
    }

    /// Waits for the next receive completion (send completions are skipped).
    fn wait_recv(&mut self) -> Result<Completion> {
        let mut out = [Completion::default(); 1];
        loop {
            let n = if self.events {
                self.cq.wait(&mut out, None)?
            } else {
                self.dev.process();
                self.cq.poll(&mut out)
            };
            if n == 1 {
                let c = out[0];
                if !c.is_ok() {
                    eprintln!("bfperf: completion failed: {c:?}");
                    std::process::exit(1);
                }
                if c.opcode == blueflame::WcOpcode::Recv {
                    return Ok(c);
                }
            } else if self.pause {
                std::hint::spin_loop();
            }
        }
    }
}

/// The responder of the ping-pong: echoes every message.
fn respond(mut s: UdSide, o: &Opts, size: usize, total: usize, ready: &Barrier) -> Result<()> {
    for i in 0..64.min(total) {
        s.post_recv(size, i as u64)?;
    }
    ready.wait();
    for i in 0..total {
        s.wait_recv()?;
        s.send(o, size, i as u64, false)?;
        if i + 64 < total {
            s.post_recv(size, (i + 64) as u64)?;
        }
    }
    Ok(())
}

/// UD send latency: one sample (ns, or cycles with `-C`; half a round trip) per measured iteration.
pub fn latency(o: &Opts, dev: &Device, size: usize) -> Result<Vec<f64>> {
    let (mut a, b) = pair(dev, o, size)?;
    let total = o.warmup + o.iters;
    for i in 0..64.min(total) {
        a.post_recv(size, i as u64)?;
    }
    let one_thread = dev.nic().is_some();
    let ready = Arc::new(Barrier::new(if one_thread { 1 } else { 2 }));
    let mut b_here = None;
    let t = if one_thread {
        b_here = Some(b);
        if let Some(b) = b_here.as_mut() {
            for i in 0..64.min(total) {
                b.post_recv(size, i as u64)?;
            }
        }
        None
    } else {
        let (r2, o2) = (ready.clone(), o.clone());
        Some(std::thread::spawn(move || {
            respond(b, &o2, size, total, &r2)
        }))
    };
    crate::pin(o.pin);
    ready.wait();
    let clock = Clock::for_samples(o.cycles);
    let mut samples = crate::stats::room_for(o.iters, "--iters (no memory for a sample each)")?;
    for i in 0..total {
        let t0 = clock.now();
        a.send(o, size, i as u64, false)?;
        if i + 64 < total {
            a.post_recv(size, (i + 64) as u64)?;
        }
        if let Some(b) = b_here.as_mut() {
            b.wait_recv()?;
            b.send(o, size, i as u64, false)?;
            if i + 64 < total {
                b.post_recv(size, (i + 64) as u64)?;
            }
        }
        a.wait_recv()?;
        // The measured iterations but the last: perftest's count (n stamps, n - 1
        // differences).
        if i >= o.warmup && i + 1 < total {
            samples.push(clock.sample(t0, clock.now()) / 2.0);
        }
    }
    if let Some(t) = t {
        t.join()
            .map_err(|_| Error::Unsupported("the responder thread panicked"))??;
    }
    Ok(samples)
}

/// The receiver of the bandwidth test: keeps [`RX_DEPTH`] receives posted and counts what
/// arrived. Stepped from its own thread on an rdma-core device, from the sender's loop on
/// the software NIC (whose own thread needs the other core).
struct UdRx {
    side: UdSide,
    size: usize,
    total: u64,
    got: u64,
    posted: u64,
}

impl UdRx {
    fn new(mut side: UdSide, size: usize, total: u64) -> Result<UdRx> {
        let depth = RX_DEPTH.min(total);
        for i in 0..depth {
            side.post_recv(size, i)?;
        }
        Ok(UdRx {
            side,
            size,
            total,
            got: 0,
            posted: depth,
        })
    }

    /// Takes the receives that arrived and posts their replacements; how many arrived.
    fn step(&mut self) -> Result<usize> {
        let mut out = [Completion::default(); 16];
        let k = self.side.cq.poll(&mut out);
        for c in &out[..k] {
            if !c.is_ok() {
                eprintln!("bfperf: receive failed: {c:?}");
                std::process::exit(1);
            }
            self.got += 1;
            if self.posted < self.total {
                self.side.post_recv(self.size, self.posted)?;
                self.posted += 1;
            }
        }
        Ok(k)
    }
}

/// The receiver's thread: publishes how many arrived (after the receive that replaces each
/// one is posted), stops when all arrived or, once the sender is done, after 2 s without
/// one. Returns how many arrived.
fn receive(
    mut rx: UdRx,
    got: &AtomicU64,
    sender_done: &AtomicBool,
    ready: &Barrier,
) -> Result<u64> {
    ready.wait();
    let mut idle = Instant::now();
    while rx.got < rx.total {
        if rx.step()? > 0 {
            got.store(rx.got, Ordering::Release);
            idle = Instant::now();
        } else if sender_done.load(Ordering::Acquire) && idle.elapsed() > Duration::from_secs(2) {
            break;
        }
    }
    Ok(rx.got)
}

/// UD send bandwidth, measured at the sender.
pub fn bandwidth(o: &Opts, dev: &Device, size: usize) -> Result<BwResult> {
    let (mut a, b) = pair(dev, o, size)?;
    let total = (o.warmup + o.iters) as u64;
    let got = Arc::new(AtomicU64::new(0));
    let done_flag = Arc::new(AtomicBool::new(false));
    let rx = UdRx::new(b, size, total)?;
    // The software NIC: the receiver is stepped from this loop (its thread needs the other
    // core); an rdma-core device: the receiver has its own thread, as perftest's process.
    let (mut inline_rx, t, ready) = if dev.nic().is_some() {
        (Some(rx), None, Arc::new(Barrier::new(1)))
    } else {
        let ready = Arc::new(Barrier::new(2));
        let (got, done_flag, r2) = (got.clone(), done_flag.clone(), ready.clone());
        let t = std::thread::spawn(move || receive(rx, &got, &done_flag, &r2));
        (None, Some(t), ready)
    };
    crate::pin(o.pin);
    let in_flight = (o.tx_depth as u64).min(a.qp.send_depth() as u64).max(1);
    let every = (in_flight / 2).clamp(1, 64);
    let (mut posted, mut done) = (0u64, 0u64);
    let mut out = [Completion::default(); 16];
    let warmup = o.warmup as u64;
    let mut stamps = crate::bw::Stamps::new(o.iters as u64, crate::bw::measures_peak(o));
    // The last signaled send.
    let mut signaled_at = 0u64;
    ready.wait();
    while done < total {
        // The warm-up drained before the first measured send (perftest's clock starts at it).
        let limit = if done < warmup { warmup } else { total };
        while posted < limit
            && posted - done < in_flight
            && posted < got.load(Ordering::Acquire) + RX_DEPTH
        {
            if posted >= warmup {
                stamps.posting(1);
            }
            posted += 1;
            let signaled = posted % every == 0 || posted == limit;
            // The cookie of a signaled send is how many it retires.
            let cookie = if signaled {
                posted - std::mem::replace(&mut signaled_at, posted)
            } else {
                0
            };
            a.send(o, size, cookie, signaled)?;
        }
        a.dev.process();
        if let Some(rx) = inline_rx.as_mut() {
            rx.step()?;
            got.store(rx.got, Ordering::Release);
        }
        let k = a.cq.poll(&mut out);
        for c in &out[..k] {
            crate::bw::check(c);
            if done >= warmup {
                stamps.completed(c.cookie);
            }
            done += c.cookie;
        }
    }
    done_flag.store(true, Ordering::Release);
    let arrived = match (t, inline_rx) {
        (Some(t), _) => t
            .join()
            .map_err(|_| Error::Unsupported("the receiver thread panicked"))??,
        (None, Some(mut rx)) => {
            let idle = Instant::now();
            while rx.got < total && idle.elapsed() < Duration::from_secs(2) {
                a.dev.process();
                rx.step()?;
            }
            rx.got
        }
        (None, None) => 0,
    };
    if arrived < total {
        eprintln!("bfperf: {} of {total} datagrams were lost", total - arrived);
    }
    // One send in a doorbell, a completion every `every` (perftest's cq_mod).
    Ok(stamps.result(o.iters as u64, size, 1, every))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(s: &str) -> Opts {
        let args: Vec<String> = s.split_whitespace().map(String::from).collect();
        crate::opts::parse(&args).expect("options")
    }

    /// An explicit size above the MTU is refused with the MTU named; `-a` stops at it.
    #[test]
    fn sizes_stop_at_the_mtu() {
        let e = sizes(&opts("-c ud -s 4097"), 4096).unwrap_err();
        assert!(matches!(
            e,
            Error::MessageTooLong {
                len: 4097,
                mtu: 4096
            }
        ));
        assert_eq!(sizes(&opts("-c ud -s 4096"), 4096).unwrap(), [4096]);
        let all = sizes(&opts("-c ud -a"), 1024).unwrap();
        assert_eq!((all[0], *all.last().unwrap(), all.len()), (2, 1024, 10));
        // The default of send-bw (perftest's 65536) becomes the MTU, as perftest's.
        let mut o = opts("-c ud");
        o.size = crate::opts::size_for("send-bw", &o);
        assert_eq!(o.size, 65536);
        assert_eq!(sizes(&o, 1024).unwrap(), [1024]);
        o.size = crate::opts::size_for("send-lat", &o);
        assert_eq!(sizes(&o, 1024).unwrap(), [2]);
    }

    /// Both tests run whole on the software NIC (stepped: this thread runs the NIC): one
    /// latency sample per measured iteration but the last (perftest's count), every datagram of the bandwidth test sent and
    /// counted (a lost one would leave `done` short and the loop would not end).
    #[test]
    fn latency_and_bandwidth_on_the_software_nic() {
        let o = opts("-c ud -d sim-stepped -n 40 --warmup 5 -t 16");
        let dev = Device::sim_stepped();
        let samples = latency(&o, &dev, 100).expect("latency");
        assert_eq!(samples.len(), 39);
        assert!(samples.iter().all(|&ns| ns > 0.0));
        let r = bandwidth(&o, &dev, 512).expect("bandwidth");
        assert!(r.mpps > 0.0 && r.avg > 0.0 && r.peak >= r.avg);
        assert!(matches!(
            latency(&o, &dev, 4097),
            Err(Error::MessageTooLong {
                len: 4097,
                mtu: 4096
            })
        ));
    }
}
