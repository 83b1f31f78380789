//! `-R` (perftest's `--rdma_cm`): the test QPs created and connected through librdmacm
//! (`blueflame::cm`), bfperf against bfperf across two processes.
//!
//! The server listens on rdma_cm port `--port` + 1 (on iWARP rdma_cm ports are the kernel's
//! TCP ports: `--port` itself is bfperf's TCP connection) before it accepts the TCP
//! connection. The client resolves the server's address first (librdmacm picks the device
//! from it: the client's CQ and buffer go there), then swaps over TCP what every bfperf pair
//! swaps (its buffer, and the parameter line, which carries `rdma_cm=true`: a side without
//! `-R` is refused there), then connects its `-q` QPs one by one, each request offering its
//! buffer in the private data; the server takes each request only when it offers the buffer
//! the client announced on TCP (anything else, a perftest `-R` client or another rdma_cm
//! program, is refused, typed) and accepts it offering its own. Every QP of a side shares
//! its one CQ, domain and buffer (`cm::resolve_on`, `CmListener::next_request_on`), as
//! without `-R`. The sync and the results stay on TCP.
//!
//! perftest's `-R` client connects through rdma_cm to `--port` itself: the server listens
//! there too until its TCP client comes, and refuses such a request. While it waits for the
//! client's requests it watches the TCP connection: a client that failed (and closed it) ends
//! the wait at once, instead of after [`PATIENCE`].

use super::exchange::dial_stream;
use super::{caps, classify, first_buffer, params, region, side_cq, swap, Peer};
use super::{Setup, Side, Sq};
use crate::opts::Opts;
use blueflame::cm::{self, CmRequest};
use blueflame::connect::{Exchange, RemoteBuf};
use blueflame::{Device, Endpoint, Error, Qp, Result};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::Duration;

/// How long a side waits for the peer's rdma_cm step (a request, an accept): as long as
/// for a step of the TCP exchange.
const PATIENCE: Duration = Duration::from_secs(60);

/// How long the client's address and route resolution may take.
const RESOLVE: Duration = Duration::from_secs(10);

/// The rdma_cm port of a run: `--port` + 1.
///
/// # Errors
/// [`Error::InvalidParameter`] for `--port` 65535 (`check_for` refuses it before).
pub fn port(o: &Opts) -> Result<u16> {
    o.port.checked_add(1).ok_or(Error::InvalidParameter {
        what: "-R: the rdma_cm port is --port + 1, and --port 65535 leaves none",
        value: o.port as u64,
    })
}

/// Says what failed on stderr (the typed error follows from `main`), and passes it on.
fn said(what: String) -> impl FnOnce(Error) -> Error {
    move |e| {
        eprintln!("bfperf: -R: {what}");
        e
    }
}

/// The name of an rdma-core device as its description says it
/// (`rdma-core device NAME (port ...)`).
fn device_name(d: &Device) -> String {
    let s = d.to_string();
    s.strip_prefix("rdma-core device ")
        .and_then(|r| r.split(' ').next())
        .unwrap_or(&s)
        .to_string()
}

/// Refuses a connection librdmacm put on another device than the one bfperf opened (`-d`,
/// which the header names): the address decides the device with rdma_cm.
fn same_device(opened: &Device, theirs: &Device, addr: &str) -> Result<()> {
    let (a, b) = (device_name(opened), device_name(theirs));
    if a != b {
        eprintln!(
            "bfperf: -R: rdma_cm runs this connection ({addr}) on {b}, but -d opened {a}: give -d {b} (librdmacm picks the device from the address)"
        );
        return Err(Error::InvalidParameter {
            what: "-R: the device rdma_cm picked from the address is not -d's (said above)",
            value: 0,
        });
    }
    Ok(())
}

/// Builds this side for messages of `size` with its QPs connected through rdma_cm.
pub fn setup(o: &Opts, dev: &Device, test: &str, size: usize) -> Result<Setup> {
    if dev.nic().is_some() {
        return Err(Error::Unsupported(
            "-R with the software NIC: it has no rdma_cm (a library in one process, not a kernel RDMA device)",
        ));
    }
    let port = port(o)?;
    match &o.client {
        Some(host) => client(o, dev, test, size, host, port),
        None => server(o, dev, test, size, port),
    }
}

/// The server: rdma_cm listener on `port`, TCP on `--port`, then one request per QP.
fn server(o: &Opts, dev: &Device, test: &str, size: usize, port: u16) -> Result<Setup> {
    let tcp = TcpListener::bind(("0.0.0.0", o.port))
        .map_err(Error::Io)
        .map_err(said(format!("TCP port {} (bfperf's connection)", o.port)))?;
    // Listening before the client can hear of us on TCP: its requests find the listener.
    let listener = cm::listen(SocketAddr::from(([0, 0, 0, 0], port))).map_err(said(format!(
        "cannot listen on rdma_cm port {port} (--port + 1)"
    )))?;
    // perftest's -R client asks rdma_cm on --port itself: listen there too, to refuse it
    // rather than leave it rejected unseen while this side waits on. Where rdma_cm ports
    // are the kernel's TCP ports (iWARP) the TCP listener holds the port and this fails:
    // such a client's connection then reaches the TCP listener and is told by its bytes.
    let decoy = cm::listen(SocketAddr::from(([0, 0, 0, 0], o.port))).ok();
    let stream = accept_client(&tcp, decoy.as_ref())?;
    drop(decoy);
    match classify(&stream)? {
        Peer::Bfperf => {}
        Peer::Perftest => {
            return Err(Error::Unsupported(
                "-R on this server and a perftest client: bfperf's -R keeps its exchange on TCP and connects its QPs through rdma_cm on --port + 1, perftest's -R speaks over rdma_cm only; they do not speak to each other (drop -R on this server to take a perftest client without -R)",
            ))
        }
        Peer::RcPingpong => {
            return Err(Error::Unsupported(
                "-R on this server and an ibv_rc_pingpong client: it connects over TCP, not rdma_cm (drop -R)",
            ))
        }
    }
    // The server's buffer is not made yet (its device is the first request's): it travels
    // in the accepts' private data. The client's travels on TCP too, to know its requests.
    let ours = Exchange {
        endpoint: Endpoint::default(),
        buffers: Vec::new(),
    };
    let (theirs, _, stream) = swap(stream, &ours, &[], &params(test, o, size))?;
    let len = super::buf_len(size) * o.qps;
    let client_buf = first_buffer(&theirs, len)?;
    let first = next_request(&listener, None, client_buf, port, &stream)?;
    same_device(dev, first.device(), &format!("port {port}"))?;
    let (cdev, pd) = (first.device().clone(), first.pd().clone());
    let cq = side_cq(&cdev, o)?;
    let mr = region(&pd, o, size, 0)?;
    let offer = Some(mr.remote_buf());
    let qa = accept(first, &cq, o, offer, 0)?;
    let mut more = Vec::with_capacity(o.qps - 1);
    for i in 1..o.qps {
        let req = next_request(&listener, Some(&pd), client_buf, port, &stream)?;
        more.push(Sq::Rc(accept(req, &cq, o, offer, i)?));
    }
    let mut s = Side::new(&cdev, o, (qa, cq, mr, None), client_buf);
    s.more = more;
    Ok(Setup::Server(s, stream))
}

/// The step of the server's waits for a request, between looks at the TCP connection.
const STEP: Duration = Duration::from_millis(50);

/// Whether a wait for an rdma_cm event ended for want of one.
fn timed_out<T>(r: &Result<T>) -> bool {
    matches!(r, Err(Error::Verbs(v)) if v.source.kind() == std::io::ErrorKind::TimedOut)
}

/// Whether the peer closed (or reset) `stream`; nothing is read from it.
fn closed(stream: &TcpStream) -> Result<bool> {
    stream.set_nonblocking(true).map_err(Error::Io)?;
    let r = stream.peek(&mut [0u8; 1]);
    stream.set_nonblocking(false).map_err(Error::Io)?;
    Ok(match r {
        Ok(n) => n == 0,
        Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
    })
}

/// The bfperf client's TCP connection on `tcp`; with `decoy` (an rdma_cm listener on the
/// same port), an rdma_cm request there first is refused, typed.
fn accept_client(tcp: &TcpListener, decoy: Option<&cm::CmListener>) -> Result<TcpStream> {
    let Some(decoy) = decoy else {
        return tcp.accept().map(|(s, _)| s).map_err(Error::Io);
    };
    tcp.set_nonblocking(true).map_err(Error::Io)?;
    loop {
        match tcp.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false).map_err(Error::Io)?;
                return Ok(s);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(Error::Io(e)),
        }
        // A request (dropped here, which destroys its id: the requester is rejected).
        if !timed_out(&decoy.next_request(STEP)) {
            return Err(Error::Unsupported(
                "-R on this server and an rdma_cm connect request on --port itself, where perftest's -R client connects: bfperf's -R keeps its exchange on TCP --port and connects its QPs through rdma_cm on --port + 1, perftest's -R speaks over rdma_cm only; they do not speak to each other (run bfperf -R on both sides, or perftest on both)",
            ));
        }
    }
}

/// The next connect request on `listener` (on `pd`'s device and domain, after the first),
/// which must offer `client_buf`, the buffer the client announced on TCP.
///
/// Waits in steps of [`STEP`], and gives up when the client closes the TCP connection (it
/// failed, and says why) or after [`PATIENCE`].
fn next_request(
    listener: &cm::CmListener,
    pd: Option<&blueflame::Pd>,
    client_buf: RemoteBuf,
    port: u16,
    stream: &TcpStream,
) -> Result<CmRequest> {
    let deadline = std::time::Instant::now() + PATIENCE;
    let req = loop {
        let got = match pd {
            None => listener.next_request(STEP),
            Some(pd) => listener.next_request_on(pd, STEP),
        };
        if !timed_out(&got) {
            break got.map_err(said(format!("the rdma_cm connect request on port {port}")))?;
        }
        let gone = |why: &str| {
            Error::Io(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("-R: no rdma_cm connect request on port {port}: {why}"),
            ))
        };
        if closed(stream)? {
            return Err(gone(
                "the client closed bfperf's TCP connection (it failed: its output says why)",
            ));
        }
        if std::time::Instant::now() >= deadline {
            return Err(gone(&format!("none within {} s", PATIENCE.as_secs())));
        }
    };
    if req.peer() != Some(client_buf) {
        let offers = req.peer().map_or_else(
            || "no buffer (its private data is not a blueflame program's)".to_string(),
            |b| format!("{b:?}"),
        );
        eprintln!(
            "bfperf: -R: an rdma_cm connect request on port {port} that is not this bfperf client's: it offers {offers}, the client announced {client_buf:?} on TCP (a perftest -R client or another rdma_cm program?); refused"
        );
        // Dropping the request destroys its id: the requester is rejected.
        return Err(Error::InvalidParameter {
            what: "-R: an rdma_cm connect request that is not this bfperf client's (said above)",
            value: 0,
        });
    }
    Ok(req)
}

/// Accepts `req`, its QP on `cq`, offering `offer`: QP `i` of the side.
fn accept(
    req: CmRequest,
    cq: &blueflame::Cq,
    o: &Opts,
    offer: Option<RemoteBuf>,
    i: usize,
) -> Result<Qp> {
    let c = req
        .accept(cq, caps(o), offer)
        .map_err(said(format!("accepting the connection of QP {i}")))?;
    Ok(c.qp)
}

/// The server's address for rdma_cm: `host` (a name or an address) on `port`, an IPv4
/// address first (rxe's and RoCE's usual GID), else any.
fn address(host: &str, port: u16) -> Result<SocketAddr> {
    let all: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(Error::Io)
        .map_err(said(format!("cannot resolve {host}")))?
        .collect();
    all.iter()
        .find(|a| a.is_ipv4())
        .or(all.first())
        .copied()
        .ok_or(Error::InvalidParameter {
            what: "-R: the server's host name has no address",
            value: 0,
        })
}

/// The client: resolve, then TCP, then one connection per QP.
fn client(o: &Opts, dev: &Device, test: &str, size: usize, host: &str, port: u16) -> Result<Setup> {
    let addr = address(host, port)?;
    let resolve = |pd: Option<&blueflame::Pd>| {
        let what = format!(
            "cannot resolve {addr} to an RDMA device and route (is {host} the address of the server's RDMA device?)"
        );
        match pd {
            None => cm::resolve(addr, RESOLVE),
            Some(pd) => cm::resolve_on(pd, addr, RESOLVE),
        }
        .map_err(said(what))
    };
    let first = resolve(None)?;
    same_device(dev, first.device(), &addr.to_string())?;
    let (cdev, pd) = (first.device().clone(), first.pd().clone());
    let cq = side_cq(&cdev, o)?;
    let mr = region(&pd, o, size, 0)?;
    let stream = dial_stream(host, o.port)
        .map_err(said(format!("bfperf's TCP connection to {host}:{} (-R keeps it for the parameters, sync and results: a perftest -R server has none)", o.port)))?;
    let ours = Exchange {
        endpoint: Endpoint::default(),
        buffers: vec![mr.remote_buf()],
    };
    let (_, _, stream) = swap(stream, &ours, &[], &params(test, o, size))?;
    let offer = Some(mr.remote_buf());
    let mut server_buf = None;
    let mut qps = Vec::with_capacity(o.qps);
    let mut next = Some(first);
    for i in 0..o.qps {
        let req = match next.take() {
            Some(r) => r,
            None => resolve(Some(&pd))?,
        };
        let c = req.connect(&cq, caps(o), offer).map_err(said(format!(
            "connecting QP {i} to {addr} (the server refused or did not answer)"
        )))?;
        // Every accept offers the server's one buffer, as long as ours (the same -s, -a
        // and -q): else it is not a bfperf -R server of this test.
        let theirs = match (c.peer, server_buf) {
            (Some(b), None) if b.len == mr.len() as u64 => super::exchange::in_address_space(b)?,
            (Some(b), Some(first)) if b == first => b,
            (got, _) => {
                eprintln!(
                    "bfperf: -R: the rdma_cm server at {addr} accepted QP {i} offering {got:?}, not a buffer of {} bytes{}: not a bfperf -R server of this test",
                    mr.len(),
                    server_buf.map_or(String::new(), |b| format!(" (its first offered {b:?})"))
                );
                return Err(Error::InvalidParameter {
                    what: "-R: the server's rdma_cm reply does not offer its buffer (said above)",
                    value: 0,
                });
            }
        };
        server_buf = Some(theirs);
        qps.push(c.qp);
    }
    let mut qps = qps.into_iter();
    let (Some(qa), Some(peer)) = (qps.next(), server_buf) else {
        return Err(Error::InvalidParameter {
            what: "-q: no QP",
            value: 0,
        });
    };
    let mut s = Side::new(&cdev, o, (qa, cq, mr, None), peer);
    s.more = qps.map(Sq::Rc).collect();
    Ok(Setup::Client(s, stream))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rdma_cm_port_follows_the_tcp_port() {
        let o = |port| Opts {
            port,
            rdma_cm: true,
            ..Opts::default()
        };
        assert_eq!(port(&o(18515)).unwrap(), 18516);
        assert!(matches!(
            port(&o(u16::MAX)),
            Err(Error::InvalidParameter { .. })
        ));
    }

    #[test]
    fn the_server_address_is_resolved_ipv4_first() {
        let a = address("127.0.0.1", 18516).unwrap();
        assert_eq!(a, SocketAddr::from(([127, 0, 0, 1], 18516)));
        assert!(address("localhost", 1).unwrap().is_ipv4());
        assert!(address("no-such-host.invalid", 1).is_err());
    }

    /// Only a wait that ended for want of an event is a timeout: any other error (or a
    /// request) is something that arrived.
    #[test]
    fn only_a_timed_out_wait_is_a_timeout() {
        let v = |kind: std::io::ErrorKind| {
            Err::<(), _>(Error::Verbs(blueflame::VerbsError {
                call: "rdma_get_cm_event",
                source: kind.into(),
            }))
        };
        assert!(timed_out(&v(std::io::ErrorKind::TimedOut)));
        assert!(!timed_out(&v(std::io::ErrorKind::Other)));
        assert!(!timed_out(&Ok(())));
        assert!(!timed_out::<()>(&Err(Error::Io(
            std::io::ErrorKind::TimedOut.into()
        ))));
    }

    /// The server's look at the TCP connection while it waits for requests: open and quiet
    /// is not closed (and nothing is taken from it), closed by the peer is.
    #[test]
    fn a_closed_connection_is_seen_without_reading_it() {
        use std::io::{Read, Write};
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut s, _) = l.accept().unwrap();
        assert!(!closed(&s).unwrap());
        c.write_all(b"x").unwrap();
        std::thread::sleep(Duration::from_millis(50));
        assert!(!closed(&s).unwrap());
        let mut b = [0u8; 1];
        s.read_exact(&mut b).unwrap();
        assert_eq!(&b, b"x");
        drop(c);
        std::thread::sleep(Duration::from_millis(50));
        assert!(closed(&s).unwrap());
    }
}
