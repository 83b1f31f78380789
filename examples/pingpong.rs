//! RDMA-write ping-pong, connected with an out-of-band exchange over TCP (as perftest does).
//!
//! ```sh
//! cargo run --example pingpong                      # both sides in this process (two threads)
//! cargo run --example pingpong -- --server          # one side: waits for a client on TCP 18516
//! cargo run --example pingpong -- --client HOST     # the other side, on another host
//! # options: --port N  --iters N  --size N (bytes per message, 1 to 4096)
//! ```
//!
//! The device is `Device::open_default()`: the one named by `BLUEFLAME_DEVICE` (`mlx5_0`,
//! `rxe0`, ...), else the first rdma-core device, else the software mlx5 NIC. The software
//! NIC lives inside one process, so `--server` / `--client` need a real device; the default
//! mode runs the server and the client as two threads of this process, still talking TCP.
//!
//! Each side registers a buffer, sends the peer its QP's endpoint and the buffer's descriptor
//! (`blueflame::connect::Exchange`), connects its QP to the peer's endpoint, then:
//! the client writes a message into the server's buffer; the server sees the message's last
//! byte change and writes it back into the client's buffer; and so on, `--iters` times.

use blueflame::connect::{self, Exchange, RemoteBuf};
use blueflame::PostSend;
use blueflame::{Access, Completion, Cq, Device, MemoryRegion, PostFlags, Qp, QpCaps, Remote};
use std::net::TcpListener;
use std::time::{Duration, Instant};

/// Any error, with a message for the user.
type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// How long a side waits for its peer before giving up (a lost peer must not hang us).
const PATIENCE: Duration = Duration::from_secs(30);

const USAGE: &str = "usage: pingpong [--server | --client HOST] [--port N] [--iters N] [--size N]";

/// Which side(s) this process plays.
#[derive(Clone, Debug, PartialEq)]
enum Role {
    /// Server and client as two threads of this process.
    Both,
    /// Waits for a client on `--port`.
    Server,
    /// Connects to the server on this host.
    Client(String),
}

#[derive(Clone, Debug)]
struct Args {
    role: Role,
    port: u16,
    iters: u32,
    size: usize,
}

fn parse_args() -> Res<Args> {
    let mut a = Args {
        role: Role::Both,
        port: 18516,
        iters: 1000,
        size: 64,
    };
    let mut it = std::env::args().skip(1);
    while let Some(opt) = it.next() {
        let mut value = || it.next().ok_or(format!("{opt} needs a value\n{USAGE}"));
        match opt.as_str() {
            "--server" => a.role = Role::Server,
            "--client" => a.role = Role::Client(value()?),
            "--port" => a.port = value()?.parse()?,
            "--iters" => a.iters = value()?.parse()?,
            "--size" => a.size = value()?.parse()?,
            _ => return Err(format!("unknown option '{opt}'\n{USAGE}").into()),
        }
    }
    if !(1..=4096).contains(&a.size) || a.iters == 0 {
        return Err(format!("--size must be 1 to 4096 and --iters at least 1\n{USAGE}").into());
    }
    Ok(a)
}

/// Whether `dev` is the software NIC (which only works inside this process).
fn is_software_nic(dev: &Device) -> bool {
    #[cfg(feature = "sim")]
    return dev.nic().is_some();
    #[cfg(not(feature = "sim"))]
    {
        let _ = dev;
        false
    }
}

/// One side's resources: a QP with its CQ, and a registered buffer of `2 * size` bytes.
/// The peer writes into `[0, size)`; messages are sent from `[size, 2 * size)`.
struct Side {
    qp: Qp,
    cq: Cq,
    mr: MemoryRegion,
    size: usize,
}

impl Side {
    fn new(dev: &Device, size: usize) -> Res<Side> {
        let pd = dev.alloc_pd()?;
        // One CQ for sends and receives. Every request not yet retired holds an entry (see
        // "Sizing queues and CQs" in the README): 64 entries cover our one write in flight.
        let cq = dev.create_cq(64)?;
        let qp = pd.create_qp(&cq, &cq, QpCaps::default())?;
        // The peer writes here, so the region needs REMOTE_WRITE (and LOCAL_WRITE with it).
        let mr = pd.alloc_mr(2 * size, Access::LOCAL_WRITE | Access::REMOTE_WRITE)?;
        Ok(Side { qp, cq, mr, size })
    }

    /// What the peer needs from us: our QP's endpoint and where it may write.
    fn offer(&self) -> Res<Exchange> {
        Ok(Exchange {
            endpoint: self.qp.endpoint()?,
            buffers: vec![self.mr.remote_buf()],
        })
    }

    /// Writes a message whose last byte is `tag` into the peer's buffer and waits for the
    /// write's completion.
    fn write(&mut self, peer: &RemoteBuf, tag: u8) -> Res<()> {
        // The message sits in the second half of our buffer; only its last byte changes.
        self.mr.write(2 * self.size - 1, &[tag])?;
        let source = self.mr.sge(self.size, self.size as u32)?;
        let remote = Remote {
            addr: peer.addr,
            rkey: peer.rkey,
        };
        // SIGNALED: a completion tells us the NIC is done with the request (the data is in
        // the peer's memory). The cookie (here the tag) comes back in the completion.
        self.qp
            .write(&[source], remote, tag as u64, PostFlags::SIGNALED)?;
        let mut done = [Completion::default(); 1];
        let deadline = Instant::now() + PATIENCE;
        let mut spins = 0u32;
        while self.cq.poll(&mut done) == 0 {
            spins = spins.wrapping_add(1);
            if spins % 256 == 0 {
                if Instant::now() > deadline {
                    self.cq.check()?; // an asynchronous event (CQ or QP error) says why
                    return Err("no completion for our write within 30 s".into());
                }
                std::thread::yield_now(); // be kind to a shared machine
            }
            std::hint::spin_loop();
        }
        if !done[0].is_ok() {
            return Err(format!("the write failed: {:?}", done[0]).into());
        }
        Ok(())
    }

    /// Waits until the last byte of the peer's message is `tag`. A NIC writes a message's
    /// bytes in order, so the last byte arriving means the whole message has (perftest's
    /// latency tests rely on the same).
    fn wait_for(&self, tag: u8) -> Res<()> {
        let deadline = Instant::now() + PATIENCE;
        let mut spins = 0u32;
        while self.mr.read_volatile_u8(self.size - 1)? != tag {
            spins = spins.wrapping_add(1);
            if spins % 256 == 0 {
                if Instant::now() > deadline {
                    return Err(format!("no message from the peer within 30 s (tag {tag})").into());
                }
                std::thread::yield_now(); // be kind to a shared machine
            }
            std::hint::spin_loop();
        }
        Ok(())
    }
}

/// Connects `side` to the peer that sent `theirs` and plays the ping-pong; the client
/// (`initiator`) starts each round. Returns the time of all rounds.
fn play(mut side: Side, theirs: Exchange, initiator: bool, iters: u32) -> Res<Duration> {
    let peer = *theirs.buffers.first().ok_or("the peer offered no buffer")?;
    if peer.len < side.size as u64 {
        return Err(format!(
            "the peer's buffer has {} bytes, we write {}",
            peer.len, side.size
        )
        .into());
    }
    // INIT (where the QP was created) -> RTR -> RTS towards the peer's QP.
    side.qp.connect(&theirs.endpoint)?;
    let start = Instant::now();
    for i in 0..iters {
        let tag = (i % 255) as u8 + 1; // never 0, the buffer's initial value
        if initiator {
            side.write(&peer, tag)?;
            side.wait_for(tag)?;
        } else {
            side.wait_for(tag)?;
            side.write(&peer, tag)?;
        }
    }
    Ok(start.elapsed())
}

fn report(dev: &Device, a: &Args, took: Duration) {
    let rtt = took.as_secs_f64() * 1e6 / a.iters as f64;
    println!(
        "pingpong: {} round trips of {} bytes on {}: {:.2} us per round trip, {:.2} us one way",
        a.iters,
        a.size,
        dev,
        rtt,
        rtt / 2.0
    );
}

fn run() -> Res<()> {
    let a = parse_args()?;
    let dev = Device::open_default()?;
    println!("pingpong: device {}", dev);
    match &a.role {
        Role::Server | Role::Client(_) if is_software_nic(&dev) => Err(
            "the software NIC lives inside one process: run without --server/--client, or \
             name a device with BLUEFLAME_DEVICE"
                .into(),
        ),
        Role::Server => {
            let side = Side::new(&dev, a.size)?;
            let listener = TcpListener::bind(("0.0.0.0", a.port))?;
            println!("pingpong: waiting for a client on TCP port {}", a.port);
            let theirs = connect::accept(&listener, &side.offer()?)?;
            let took = play(side, theirs, false, a.iters)?;
            report(&dev, &a, took);
            Ok(())
        }
        Role::Client(host) => {
            let side = Side::new(&dev, a.size)?;
            let theirs = connect::dial((host.as_str(), a.port), &side.offer()?)?;
            let took = play(side, theirs, true, a.iters)?;
            report(&dev, &a, took);
            Ok(())
        }
        Role::Both => {
            // The server thread listens on a free port of the loopback interface; the client
            // dials it. Everything else is what two hosts would do.
            let listener = TcpListener::bind(("127.0.0.1", 0))?;
            let port = listener.local_addr()?.port();
            let server_side = Side::new(&dev, a.size)?;
            let iters = a.iters;
            let server = std::thread::spawn(move || -> Res<Duration> {
                let theirs = connect::accept(&listener, &server_side.offer()?)?;
                play(server_side, theirs, false, iters)
            });
            let client_side = Side::new(&dev, a.size)?;
            let client = connect::dial(("127.0.0.1", port), &client_side.offer()?)
                .map_err(Into::into)
                .and_then(|theirs| play(client_side, theirs, true, iters));
            // A failed client returns at once (the server thread may be stuck in accept).
            let took = client?;
            server.join().map_err(|_| "the server thread panicked")??;
            report(&dev, &a, took);
            Ok(())
        }
    }
}

fn main() {
    if let Err(e) = run() {
        eprintln!("pingpong: {e}");
        std::process::exit(1);
    }
}
