//! Out-of-band connection set-up over TCP, as perftest does: each side sends what the other
//! needs to connect its QP (QPN, PSN, GID, LID, MTU, the reads and atomics its responder
//! accepts) and, optionally, remote buffer descriptors (address, rkey, length) for
//! one-sided operations.
//!
//! Wire format (big-endian): `b"BFX2"`, qpn u32, psn u32, lid u16, mtu u32, gid [u8; 16],
//! max_dest_rd_atomic u8, buffer count u16, then per buffer addr u64, rkey u32, len u64.
//! A `b"BFX1"` message (an older peer's: no `max_dest_rd_atomic`) is still read, its
//! depth 0 (not given, taken as 16); only `BFX2` is written.
//!
//! ```
//! use blueflame::connect::{Exchange, RemoteBuf};
//! use blueflame::Endpoint;
//! let ours = Exchange { endpoint: Endpoint { qpn: 0x11, psn: 7, ..Endpoint::default() },
//!                       buffers: vec![RemoteBuf { addr: 0x1000, rkey: 0x42, len: 64 }] };
//! let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
//! let addr = listener.local_addr().unwrap();
//! let server = std::thread::spawn(move || blueflame::connect::accept(&listener, &Exchange::default()));
//! let theirs = blueflame::connect::dial(addr, &ours).unwrap();
//! assert_eq!(theirs, Exchange::default());
//! assert_eq!(server.join().unwrap().unwrap(), ours);
//! ```

use crate::error::{Error, Result};
use crate::verbs::objects::Endpoint;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// A remote buffer a peer may write, read or run atomics on.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct RemoteBuf {
    /// Address (or offset, for zero-based keys).
    pub addr: u64,
    /// Remote key.
    pub rkey: u32,
    /// Length in bytes.
    pub len: u64,
}

/// What one side sends the other.
///
/// Two QPs connected over a TCP exchange, each offering a buffer, then an RDMA write into
/// the buffer the other side offered (on two machines, each side runs its half with its own
/// device):
///
/// ```
/// # #[cfg(feature = "sim")] fn main() -> blueflame::Result<()> {
/// use blueflame::connect::{accept, dial, Exchange};
/// use blueflame::{Access, Completion, Device, Error, PostFlags, PostSend, QpCaps, Remote};
/// use std::net::TcpListener;
///
/// let dev = Device::sim();
/// let pd = dev.alloc_pd()?;
/// let rights = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
/// let (mut cq, cq_s) = (dev.create_cq(64)?, dev.create_cq(64)?);
/// let mut qp = pd.create_qp(&cq, &cq, QpCaps::default())?;
/// let mut qp_s = pd.create_qp(&cq_s, &cq_s, QpCaps::default())?;
/// let (mr, mr_s) = (pd.alloc_mr(4096, rights)?, pd.alloc_mr(4096, rights)?);
///
/// let listener = TcpListener::bind("127.0.0.1:0").map_err(Error::Io)?;
/// let addr = listener.local_addr().map_err(Error::Io)?;
/// let offer = Exchange { endpoint: qp_s.endpoint()?, buffers: vec![mr_s.remote_buf()] };
/// let server = std::thread::spawn(move || -> blueflame::Result<_> {
///     let client = accept(&listener, &offer)?;   // the server's half
///     qp_s.connect(&client.endpoint)?;
///     Ok((qp_s, mr_s, cq_s))
/// });
/// let ours = Exchange { endpoint: qp.endpoint()?, buffers: vec![mr.remote_buf()] };
/// let theirs = dial(addr, &ours)?;              // the client's half
/// qp.connect(&theirs.endpoint)?;
/// let (_qp_s, mr_s, _cq_s) = server.join().unwrap()?;
///
/// let buf = theirs.buffers[0];
/// let at = Remote { addr: buf.addr + 16, rkey: buf.rkey };
/// qp.write_inline(b"over the wire", at, 1, PostFlags::SIGNALED)?;
/// let mut out = [Completion::default(); 1];
/// assert_eq!(cq.poll_n(&mut out, 1, 1 << 32), 1);
/// let mut got = [0u8; 13];
/// mr_s.read(16, &mut got)?;
/// assert_eq!(&got, b"over the wire");
/// # Ok(()) }
/// # #[cfg(not(feature = "sim"))] fn main() {}
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Exchange {
    /// The QP's connection attributes.
    pub endpoint: Endpoint,
    /// Buffers offered to the peer.
    pub buffers: Vec<RemoteBuf>,
}

const MAGIC: &[u8; 4] = b"BFX2";
/// The first version: no responder depth.
const MAGIC_V1: &[u8; 4] = b"BFX1";
const MAX_BUFFERS: usize = 1024;

impl Exchange {
    /// The bytes on the wire.
    ///
    /// # Errors
    /// [`Error::InvalidParameter`] for more buffers than a peer's [`Exchange::read_from`]
    /// takes (1024; the wire's count has 16 bits).
    pub fn encode(&self) -> Result<Vec<u8>> {
        if self.buffers.len() > MAX_BUFFERS {
            return Err(Error::InvalidParameter {
                what: "exchange buffer count (at most 1024)",
                value: self.buffers.len() as u64,
            });
        }
        let e = &self.endpoint;
        let mut v = Vec::with_capacity(37 + 20 * self.buffers.len());
        v.extend_from_slice(MAGIC);
        v.extend_from_slice(&e.qpn.to_be_bytes());
        v.extend_from_slice(&e.psn.to_be_bytes());
        v.extend_from_slice(&e.lid.to_be_bytes());
        v.extend_from_slice(&e.mtu.to_be_bytes());
        v.extend_from_slice(&e.gid);
        v.push(e.max_dest_rd_atomic);
        v.extend_from_slice(&(self.buffers.len() as u16).to_be_bytes());
        for b in &self.buffers {
            v.extend_from_slice(&b.addr.to_be_bytes());
            v.extend_from_slice(&b.rkey.to_be_bytes());
            v.extend_from_slice(&b.len.to_be_bytes());
        }
        Ok(v)
    }

    /// Reads one exchange from `r` (`BFX2`, or `BFX1` without the responder depth).
    ///
    /// # Errors
    /// [`Error::Io`] on a read error or short message; [`Error::InvalidParameter`] for a bad
    /// magic or an absurd buffer count.
    pub fn read_from(r: &mut impl Read) -> Result<Exchange> {
        let mut h = [0u8; 34];
        r.read_exact(&mut h).map_err(Error::Io)?;
        let magic = &h[..4];
        if magic != MAGIC && magic != MAGIC_V1 {
            let m = u32::from_be_bytes([h[0], h[1], h[2], h[3]]);
            return Err(Error::InvalidParameter {
                what: "exchange magic",
                value: m as u64,
            });
        }
        // The responder depth (BFX2), then the buffer count.
        let mut t = [0u8; 3];
        let tail = if magic == MAGIC {
            &mut t[..]
        } else {
            &mut t[1..]
        };
        r.read_exact(tail).map_err(Error::Io)?;
        let u32at = |i: usize| u32::from_be_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]);
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&h[18..34]);
        let endpoint = Endpoint {
            qpn: u32at(4),
            psn: u32at(8),
            lid: u16::from_be_bytes([h[12], h[13]]),
            mtu: u32at(14),
            gid,
            max_dest_rd_atomic: t[0],
        };
        let n = u16::from_be_bytes([t[1], t[2]]) as usize;
        if n > MAX_BUFFERS {
            return Err(Error::InvalidParameter {
                what: "exchange buffer count",
                value: n as u64,
            });
        }
        let mut buffers = Vec::with_capacity(n);
        for _ in 0..n {
            let mut b = [0u8; 20];
            r.read_exact(&mut b).map_err(Error::Io)?;
            buffers.push(RemoteBuf {
                addr: u64::from_be_bytes(b[..8].try_into().expect("8 bytes")),
                rkey: u32::from_be_bytes(b[8..12].try_into().expect("4 bytes")),
                len: u64::from_be_bytes(b[12..].try_into().expect("8 bytes")),
            });
        }
        Ok(Exchange { endpoint, buffers })
    }
}

/// How long one exchange may take, the peer's message read whole and ours written.
const EXCHANGE_TIME: Duration = Duration::from_secs(60);

/// A stream whose reads and writes all end by one deadline: each call's timeout is what is
/// left of it. A timeout per call let a peer that sent one byte every 59 s hold `accept`
/// through its 1,025 reads for hours (a review's finding).
struct ByDeadline<'a> {
    s: &'a mut TcpStream,
    end: Instant,
}

/// The error of an exchange past its deadline.
fn past_deadline() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        "the connection exchange took longer than its deadline",
    )
}

/// `TimedOut` for a socket call whose timeout ran out (Unix says `WouldBlock`, `EAGAIN`).
fn timed_out<T>(r: std::io::Result<T>) -> std::io::Result<T> {
    match r {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Err(past_deadline()),
        r => r,
    }
}

impl ByDeadline<'_> {
    /// What is left of the deadline.
    fn left(&self) -> std::io::Result<Duration> {
        let left = self.end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(past_deadline());
        }
        Ok(left)
    }
}

impl Read for ByDeadline<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.s.set_read_timeout(Some(self.left()?))?;
        timed_out(self.s.read(buf))
    }
}

impl Write for ByDeadline<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.s.set_write_timeout(Some(self.left()?))?;
        timed_out(self.s.write(buf))
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.s.flush()
    }
}

fn swap(s: &mut TcpStream, ours: &Exchange) -> Result<Exchange> {
    swap_within(s, ours, EXCHANGE_TIME)
}

/// [`swap`] that ends within `time` whatever the peer does.
fn swap_within(s: &mut TcpStream, ours: &Exchange, time: Duration) -> Result<Exchange> {
    s.set_nodelay(true).map_err(Error::Io)?;
    let mut s = ByDeadline {
        s,
        end: Instant::now() + time,
    };
    s.write_all(&ours.encode()?).map_err(Error::Io)?;
    Exchange::read_from(&mut s)
}

/// Server side: accepts one connection on `listener` and swaps exchanges, within 60 s of
/// the connection (a peer that sends its message slowly, or reads ours slowly, is refused
/// then).
///
/// # Errors
/// [`Error::Io`] for socket errors (`TimedOut` past the 60 s),
/// [`Error::InvalidParameter`] for a malformed message.
pub fn accept(listener: &TcpListener, ours: &Exchange) -> Result<Exchange> {
    let (mut s, _) = listener.accept().map_err(Error::Io)?;
    swap(&mut s, ours)
}

/// Client side: connects to `addr` (retrying for up to 10 s while the server starts: a
/// refused, reset or timed-out connection) and swaps exchanges.
///
/// # Errors
/// [`Error::Io`] for socket errors (at once for an address that resolves to none, or an
/// error no retry can mend), [`Error::InvalidParameter`] for a malformed message.
pub fn dial(addr: impl ToSocketAddrs, ours: &Exchange) -> Result<Exchange> {
    use std::io::ErrorKind as K;
    let addrs: Vec<_> = addr.to_socket_addrs().map_err(Error::Io)?.collect();
    if addrs.is_empty() {
        return Err(Error::Io(std::io::Error::new(
            K::InvalidInput,
            "the address resolves to no socket address",
        )));
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        match TcpStream::connect(&addrs[..]) {
            Ok(mut s) => return swap(&mut s, ours),
            // The server may not listen yet.
            Err(e)
                if matches!(
                    e.kind(),
                    K::ConnectionRefused | K::ConnectionReset | K::ConnectionAborted | K::TimedOut
                ) && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => return Err(Error::Io(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An address that resolves to nothing fails at once, not after the 10 s of retries
    /// meant for a server that is starting (a review's finding).
    #[test]
    fn dialling_no_address_fails_at_once() {
        let t = std::time::Instant::now();
        let none: &[std::net::SocketAddr] = &[];
        assert!(matches!(
            dial(none, &Exchange::default()),
            Err(Error::Io(_))
        ));
        assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    }

    /// A peer that announces many buffers and then sends its message one byte a second is
    /// cut off when the exchange's time is up, not after one timeout per read.
    #[test]
    fn a_dripping_peer_is_cut_off_at_the_exchanges_deadline() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let t = Instant::now();
            let r = swap_within(&mut s, &Exchange::default(), Duration::from_secs(2));
            (r, t.elapsed())
        });
        let mut c = TcpStream::connect(addr).unwrap();
        let mut head = Exchange::default().encode().unwrap();
        let n = head.len();
        head[n - 2..].copy_from_slice(&1024u16.to_be_bytes());
        c.write_all(&head).unwrap();
        let mut theirs = [0u8; 36];
        c.read_exact(&mut theirs).unwrap();
        let dripper = std::thread::spawn(move || {
            for _ in 0..8 {
                if c.write_all(&[0]).is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(500));
            }
        });
        let (r, took) = server.join().unwrap();
        dripper.join().unwrap();
        match r {
            Err(Error::Io(e)) => assert_eq!(e.kind(), std::io::ErrorKind::TimedOut, "{e}"),
            other => panic!("{other:?}"),
        }
        assert!(took < Duration::from_secs(3), "{took:?}");
    }

    #[test]
    fn round_trip_and_bad_magic() {
        let x = Exchange {
            endpoint: Endpoint {
                qpn: 0xabcdef,
                psn: 0x123456,
                gid: [7; 16],
                lid: 9,
                mtu: 3,
                max_dest_rd_atomic: 4,
            },
            buffers: vec![
                RemoteBuf {
                    addr: u64::MAX,
                    rkey: 1,
                    len: 2,
                },
                RemoteBuf::default(),
            ],
        };
        let bytes = x.encode().unwrap();
        assert_eq!(Exchange::read_from(&mut &bytes[..]).unwrap(), x);
        let mut bad = bytes.clone();
        bad[0] = b'X';
        assert!(matches!(
            Exchange::read_from(&mut &bad[..]),
            Err(Error::InvalidParameter {
                what: "exchange magic",
                ..
            })
        ));
        assert!(matches!(
            Exchange::read_from(&mut &bytes[..20]),
            Err(Error::Io(_))
        ));
        // Cut before the buffers: short, whatever the version.
        assert!(matches!(
            Exchange::read_from(&mut &bytes[..36]),
            Err(Error::Io(_))
        ));
    }

    /// A QP's endpoint says what its responder accepts: what its `connect` programs
    /// (`max_dest_rd_atomic`; the software NIC's, which takes any number of reads in flight,
    /// is the crate's 16 as on a ConnectX), so that a peer's requester stays within it.
    #[cfg(feature = "sim")]
    #[test]
    fn a_qps_endpoint_advertises_its_responder_depth() {
        let dev = crate::Device::sim_stepped();
        let pd = dev.alloc_pd().unwrap();
        let cq = dev.create_cq(4).unwrap();
        let qp = pd.create_qp(&cq, &cq, crate::QpCaps::default()).unwrap();
        let depth = qp.endpoint().unwrap().max_dest_rd_atomic;
        assert_eq!(depth, crate::verbs::objects::ConnLimits::RD_ATOMIC);
    }

    /// A peer's responder depth crosses the wire (`BFX2`): a peer of depth 4 is read as 4,
    /// where the depth was dropped and its QP then programmed for 16 reads in flight, which
    /// the peer's responder refuses. A `BFX1` message (an older peer) is still read: its
    /// depth is not given (0).
    #[test]
    fn the_responder_depth_crosses_the_wire_and_bfx1_is_still_read() {
        let x = Exchange {
            endpoint: Endpoint {
                qpn: 0x11,
                max_dest_rd_atomic: 4,
                ..Endpoint::default()
            },
            buffers: vec![RemoteBuf {
                addr: 0x1000,
                rkey: 0x42,
                len: 64,
            }],
        };
        let bytes = x.encode().unwrap();
        assert_eq!(&bytes[..4], b"BFX2");
        assert_eq!(bytes.len(), 37 + 20);
        assert_eq!(bytes[34], 4, "the depth after the GID");
        let got = Exchange::read_from(&mut &bytes[..]).unwrap();
        assert_eq!(got.endpoint.max_dest_rd_atomic, 4);
        assert_eq!(got, x);
        // BFX1: magic, qpn, psn, lid, mtu, gid, count, buffers.
        let mut v1 = b"BFX1".to_vec();
        v1.extend_from_slice(&0x11u32.to_be_bytes());
        v1.extend_from_slice(&7u32.to_be_bytes());
        v1.extend_from_slice(&9u16.to_be_bytes());
        v1.extend_from_slice(&3u32.to_be_bytes());
        v1.extend_from_slice(&[5; 16]);
        v1.extend_from_slice(&1u16.to_be_bytes());
        v1.extend_from_slice(&0x1000u64.to_be_bytes());
        v1.extend_from_slice(&0x42u32.to_be_bytes());
        v1.extend_from_slice(&64u64.to_be_bytes());
        let mut r = &v1[..];
        let old = Exchange::read_from(&mut r).unwrap();
        assert!(r.is_empty(), "a BFX1 message read whole");
        assert_eq!(
            old,
            Exchange {
                endpoint: Endpoint {
                    qpn: 0x11,
                    psn: 7,
                    lid: 9,
                    mtu: 3,
                    gid: [5; 16],
                    max_dest_rd_atomic: 0,
                },
                buffers: x.buffers.clone(),
            }
        );
    }
}
