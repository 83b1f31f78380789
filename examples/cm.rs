//! Connecting through librdmacm (`rdma_cm`), as `rdma_server` / `rdma_client` do: the
//! server listens on an IP address of an RDMA device, the client resolves it; each side
//! offers a buffer in the connection's private data. Then the client writes a message into
//! the server's buffer and sends a short note; the server, on receiving the note, reads the
//! message and writes a reply into the client's buffer.
//!
//! ```sh
//! cargo run --example cm -- --addr 10.77.0.1            # both sides in this process
//! cargo run --example cm -- --addr 10.77.0.1 --server   # one side per host
//! cargo run --example cm -- --addr 10.77.0.1 --client
//! cargo run --example cm                                # software NIC: see below
//! ```
//!
//! `--addr IP[:PORT]` (port 7471 by default) is the server's address: an address of the
//! network interface of an RDMA device (an rxe device's netdev, a ConnectX's port);
//! `BLUEFLAME_SERVER_ADDR` gives it too. librdmacm picks the device from the address, so
//! `BLUEFLAME_DEVICE` plays no part here.
//!
//! **The software NIC has no rdma_cm**: librdmacm talks to the kernel's RDMA stack, and the
//! software NIC is a library inside this process. Without an address, the example says so
//! and falls back to what works everywhere: the same exchange of buffers, but over the
//! out-of-band TCP exchange (`blueflame::connect`, see the `pingpong` example) on
//! `Device::open_default()`, both sides in this process.

use blueflame::connect::{self, Exchange, RemoteBuf};
use blueflame::PostSend;
use blueflame::{
    cm, Access, Completion, Cq, Device, MemoryRegion, Payload, PostFlags, Qp, QpCaps, Remote,
    WcOpcode,
};
use std::net::{SocketAddr, TcpListener};
use std::time::{Duration, Instant};

/// Any error, with a message for the user.
type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

const USAGE: &str = "usage: cm [--addr IP[:PORT]] [--server | --client]";
const MESSAGE: &[u8] = b"hello over RDMA";
const REPLY: &[u8] = b"pong";
/// How long each step waits for the peer.
const PATIENCE: Duration = Duration::from_secs(30);

/// A connected QP, its CQ, our registered buffer and the peer's.
struct Conn {
    qp: Qp,
    cq: Cq,
    mr: MemoryRegion,
    peer: RemoteBuf,
}

/// The rights of both sides' buffers: the peer writes into them.
fn rights() -> Access {
    Access::LOCAL_WRITE | Access::REMOTE_WRITE
}

/// Waits for the next completion and requires a success.
fn next_success(cq: &mut Cq) -> Res<Completion> {
    let mut out = [Completion::default(); 1];
    let deadline = Instant::now() + PATIENCE;
    while cq.poll(&mut out) == 0 {
        if Instant::now() > deadline {
            cq.check()?;
            return Err("no completion within 30 s".into());
        }
        std::thread::yield_now();
    }
    if !out[0].is_ok() {
        return Err(format!("request {} failed: {:?}", out[0].cookie, out[0]).into());
    }
    Ok(out[0])
}

/// The server's part once connected: wait for the client's note, check its message, reply.
fn serve(mut c: Conn) -> Res<()> {
    // The note arrives as a send, into a receive buffer posted here (bytes 1024..1088).
    // On rdma_cm the QP exists only after accept, so a client that sends first is held off
    // by receiver-not-ready retries until this receive is posted.
    c.qp.post_recv(&[c.mr.sge(1024, 64)?], 1)?;
    let note = next_success(&mut c.cq)?;
    if note.opcode != WcOpcode::Recv {
        return Err(format!("expected the client's note, got {note:?}").into());
    }
    // A send is delivered after the writes posted before it: the message is in place.
    let mut got = vec![0u8; MESSAGE.len()];
    c.mr.read(0, &mut got)?;
    println!(
        "cm server: the client wrote {:?}",
        String::from_utf8_lossy(&got)
    );
    if got != MESSAGE {
        return Err("the client's message is not in our buffer".into());
    }
    let peer = Remote {
        addr: c.peer.addr,
        rkey: c.peer.rkey,
    };
    c.qp.write_inline(REPLY, peer, 2, PostFlags::SIGNALED)?;
    next_success(&mut c.cq)?;
    Ok(())
}

/// The client's part once connected: write the message, send the note, wait for the reply.
fn client(mut c: Conn) -> Res<()> {
    let peer = Remote {
        addr: c.peer.addr,
        rkey: c.peer.rkey,
    };
    if c.peer.len < MESSAGE.len() as u64 {
        return Err("the server's buffer is too small".into());
    }
    c.qp.write_inline(MESSAGE, peer, 1, PostFlags::SIGNALED)?;
    c.qp.send(Payload::Inline(b"done"), 2, PostFlags::SIGNALED)?;
    next_success(&mut c.cq)?;
    next_success(&mut c.cq)?;
    let deadline = Instant::now() + PATIENCE;
    let mut got = [0u8; 4];
    loop {
        c.mr.read(0, &mut got)?;
        if got == REPLY {
            break;
        }
        if Instant::now() > deadline {
            return Err("no reply from the server within 30 s".into());
        }
        std::thread::yield_now();
    }
    println!(
        "cm client: the server replied {:?}",
        String::from_utf8_lossy(&got)
    );
    Ok(())
}

/// Server over rdma_cm: listen, take one connect request, accept it offering our buffer.
fn cm_server(listener: cm::CmListener) -> Res<Conn> {
    let req = listener.next_request(PATIENCE)?;
    // The request knows its device: regions and CQ go there, before the QP exists.
    let mr = req.pd().alloc_mr(4096, rights())?;
    let cq = req.device().create_cq(16)?;
    let peer = req.peer().ok_or("the client offered no buffer")?;
    println!("cm server: connect request on {}", req.device());
    let conn = req.accept(&cq, QpCaps::default(), Some(mr.remote_buf()))?;
    Ok(Conn {
        qp: conn.qp,
        cq,
        mr,
        peer,
    })
}

/// Client over rdma_cm: resolve the server's address and route, connect offering our buffer.
fn cm_client(addr: SocketAddr) -> Res<Conn> {
    let req = cm::resolve(addr, Duration::from_secs(10))?;
    let mr = req.pd().alloc_mr(4096, rights())?;
    let cq = req.device().create_cq(16)?;
    let conn = req.connect(&cq, QpCaps::default(), Some(mr.remote_buf()))?;
    let peer = conn.peer.ok_or("the server offered no buffer")?;
    Ok(Conn {
        qp: conn.qp,
        cq,
        mr,
        peer,
    })
}

/// The fallback's set-up of one side: a QP on `dev`, the out-of-band exchange (`server`
/// accepts on `listener`, the client dials `port`), connect.
fn tcp_side(dev: &Device, server: Option<TcpListener>, port: u16) -> Res<Conn> {
    let pd = dev.alloc_pd()?;
    let cq = dev.create_cq(16)?;
    let mut qp = pd.create_qp(&cq, &cq, QpCaps::default())?;
    let mr = pd.alloc_mr(4096, rights())?;
    let ours = Exchange {
        endpoint: qp.endpoint()?,
        buffers: vec![mr.remote_buf()],
    };
    let theirs = match server {
        Some(l) => connect::accept(&l, &ours)?,
        None => connect::dial(("127.0.0.1", port), &ours)?,
    };
    qp.connect(&theirs.endpoint)?;
    let peer = *theirs.buffers.first().ok_or("the peer offered no buffer")?;
    Ok(Conn { qp, cq, mr, peer })
}

/// Both sides in this process over the TCP exchange (the software NIC's way).
fn fallback() -> Res<()> {
    let dev = Device::open_default()?;
    println!(
        "cm: no server address (--addr or BLUEFLAME_SERVER_ADDR). rdma_cm needs a kernel RDMA \
         device with an IP address, and the software NIC has no rdma_cm: falling back to the \
         out-of-band TCP exchange on {}",
        dev
    );
    let listener = TcpListener::bind(("127.0.0.1", 0))?;
    let port = listener.local_addr()?.port();
    let server_dev = dev.clone();
    let server =
        std::thread::spawn(move || tcp_side(&server_dev, Some(listener), port).and_then(serve));
    tcp_side(&dev, None, port).and_then(client)?;
    server.join().map_err(|_| "the server thread panicked")??;
    println!("cm: done (fallback: TCP exchange instead of rdma_cm)");
    Ok(())
}

fn run() -> Res<()> {
    let (mut addr, mut server, mut client_only) = (None, false, false);
    let mut args = std::env::args().skip(1);
    while let Some(opt) = args.next() {
        match opt.as_str() {
            "--addr" => {
                addr = Some(
                    args.next()
                        .ok_or(format!("--addr needs a value\n{USAGE}"))?,
                )
            }
            "--server" => server = true,
            "--client" => client_only = true,
            _ => return Err(format!("unknown option '{opt}'\n{USAGE}").into()),
        }
    }
    let Some(addr) = addr.or_else(|| std::env::var("BLUEFLAME_SERVER_ADDR").ok()) else {
        if server || client_only {
            return Err(format!("--server and --client need the server's address\n{USAGE}").into());
        }
        return fallback();
    };
    // IP:PORT ([IPv6]:PORT), or an IP alone (IPv4 or IPv6) on port 7471.
    let addr: SocketAddr = match addr.parse::<std::net::IpAddr>() {
        Ok(ip) => SocketAddr::new(ip, 7471),
        Err(_) => addr
            .parse()
            .map_err(|e| format!("--addr {addr:?}: {e} (IP or IP:PORT)\n{USAGE}"))?,
    };
    if server {
        println!("cm server: listening on {addr}");
        return serve(cm_server(cm::listen(addr)?)?);
    }
    if client_only {
        // The server may still be starting: retry the resolution for a while.
        let deadline = Instant::now() + PATIENCE;
        let conn = loop {
            match cm_client(addr) {
                Ok(c) => break c,
                Err(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(200))
                }
                Err(e) => return Err(e),
            }
        };
        return client(conn);
    }
    // Both sides here: listen first, so the client's request finds the listener.
    let listener = cm::listen(addr)?;
    println!("cm: server and client in this process, on {addr}");
    let server = std::thread::spawn(move || cm_server(listener).and_then(serve));
    cm_client(addr).and_then(client)?;
    server.join().map_err(|_| "the server thread panicked")??;
    println!("cm: done over rdma_cm");
    Ok(())
}

fn main() {
    if let Err(e) = run() {
        eprintln!("cm: {e}");
        std::process::exit(1);
    }
}
