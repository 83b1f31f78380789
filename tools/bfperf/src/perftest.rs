//! perftest's side of the wire (`perftest_communication.c` of perftest 4.5, whose programs
//! call themselves version 6.06, over TCP without rdma_cm): what bfperf says to an
//! unmodified `ib_write_lat`, `ib_read_lat`, `ib_send_lat`, `ib_write_bw`, `ib_read_bw` or
//! `ib_send_bw` and what it reads back, so that either program can be the client of the
//! other.
//!
//! Every exchange is symmetric (`ctx_xchg_data_ethernet`, `ctx_hand_shake`): the client
//! (the side that was given a host) writes its part, then reads the peer's; the server
//! reads, then writes. In order:
//!
//! 1. the version, 16 bytes of text (`exchange_versions`); perftest refuses a peer below
//!    5.70 (`check_version_compatibility`), and so does bfperf;
//! 2. the cycle buffer and the cache-line size, a big-endian 32-bit integer each
//!    (`check_sys_data`);
//! 3. the port's MTU, its verbs enum as decimal text in 2 bytes (`check_mtu`); the path
//!    MTU is the smaller;
//! 4. the QP's address, `KEY_PRINT_FMT_GID` (108 bytes, with the GID) on a port with GIDs,
//!    else `KEY_PRINT_FMT` (59 bytes): LID, outstanding reads, QP number, PSN, rkey, the
//!    buffer the peer writes or reads, (GID,) SRQ number; several times (the count of each
//!    program, [`Test::hand_shakes`]), the last ones after both QPs are ready;
//! 5. the test; then, for `ib_write_bw` and `ib_read_bw` (whose server only waits), one
//!    more address exchange and the client's report (`xchg_bw_reports`: size, iterations,
//!    peak and average bandwidth, message rate, each big-endian), which the server prints;
//!    for the tests that close (`ctx_close_connection`), one more address exchange and
//!    "done".

use std::io::{Read, Write};
use std::net::TcpStream;

/// The version bfperf gives (perftest 4.5's own).
pub const VERSION: &str = "6.06";

/// The oldest version perftest 4.5 talks to, and so bfperf.
const OLDEST: f64 = 5.70;

/// perftest's cycle buffer: a page (`sysconf(_SC_PAGESIZE)`), as it sends it.
pub fn cycle_buffer() -> u32 {
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u32::try_from(page).ok().filter(|&p| p > 0).unwrap_or(4096)
}

/// perftest's cache line, as it sends it.
const CACHE_LINE: u32 = 64;

/// Which perftest program is on the other side.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Test {
    /// `ib_write_lat`: each side writes its counter into the other's buffer; the server
    /// writes first.
    Write,
    /// `ib_read_lat`: the client reads the server's buffer; the server only waits.
    Read,
    /// `ib_send_lat`: sends into posted receives; the client sends first.
    Send,
    /// `ib_write_bw`: the client writes; the server waits, then prints the client's report.
    WriteBw,
    /// `ib_read_bw`: the client reads; the server waits, then prints the client's report.
    ReadBw,
    /// `ib_send_bw`: the client sends, the server receives; each reports its side.
    SendBw,
}

impl Test {
    /// The test of a bfperf test name (`write-lat` or `write_lat`), if perftest has it on
    /// the wire.
    pub fn of(name: &str, write_imm: bool) -> Option<Test> {
        match name.replace('_', "-").as_str() {
            "write-lat" if !write_imm => Some(Test::Write),
            "read-lat" => Some(Test::Read),
            "send-lat" => Some(Test::Send),
            "write-bw" => Some(Test::WriteBw),
            "read-bw" => Some(Test::ReadBw),
            "send-bw" => Some(Test::SendBw),
            _ => None,
        }
    }

    /// Address exchanges before the QPs connect, and after (perftest's `main` of each:
    /// `ctx_hand_shake` calls around `ctx_connect`, one QP).
    pub fn hand_shakes(self) -> (usize, usize) {
        match self {
            Test::Write | Test::Read => (2, 2),
            // One after the connect, one to print the remote QP, one once the receives
            // are posted (`ctx_set_recv_wqes`).
            Test::Send | Test::SendBw => (1, 3),
            Test::WriteBw | Test::ReadBw => (1, 2),
        }
    }

    /// Whether the test ends with `ctx_close_connection` (one more exchange, then "done").
    pub fn closes(self) -> bool {
        !matches!(self, Test::Write)
    }

    /// Whether the client hands its report to the server after the test (one more
    /// exchange, then `xchg_bw_reports`).
    pub fn reports(self) -> bool {
        matches!(self, Test::WriteBw | Test::ReadBw)
    }
}

/// A QP's address as perftest exchanges it (`struct pingpong_dest`).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Dest {
    pub lid: u16,
    pub out_reads: u32,
    pub qpn: u32,
    pub psn: u32,
    pub rkey: u32,
    pub vaddr: u64,
    /// Present on a port with GIDs (RoCE, or InfiniBand with `-x`).
    pub gid: Option<[u8; 16]>,
    pub srqn: u32,
}

impl Dest {
    /// The reads and atomics the peer's responder accepts in flight: its `out_reads`
    /// (`ctx_set_out_reads`: `-o`, at most its device's `max_qp_rd_atom`), which it programs
    /// as its `max_dest_rd_atomic` and as this side's limit (`max_rd_atomic =
    /// dest->out_reads`); a value past a byte is taken as 255 (the QP's own limit is lower).
    pub fn responder_depth(&self) -> u8 {
        u8::try_from(self.out_reads).unwrap_or(u8::MAX)
    }
}

/// `KEY_MSG_SIZE` and `KEY_MSG_SIZE_GID`: the text and its NUL.
const KEY: usize = 59;
const KEY_GID: usize = 108;

impl Dest {
    /// The message of `ethernet_write_keys`.
    pub fn encode(&self) -> Vec<u8> {
        let mut s = format!(
            "{:04x}:{:04x}:{:06x}:{:06x}:{:08x}:{:016x}",
            self.lid, self.out_reads, self.qpn, self.psn, self.rkey, self.vaddr
        );
        let size = match &self.gid {
            Some(g) => {
                for b in g {
                    s += &format!(":{b:02x}");
                }
                s += &format!(":{:08x}:", self.srqn);
                KEY_GID
            }
            None => {
                s += &format!(":{:08x}", self.srqn);
                KEY
            }
        };
        let mut v = s.into_bytes();
        v.resize(size, 0);
        v
    }

    /// Reads `ethernet_read_keys`' message (with the GID when `gid`).
    pub fn decode(msg: &[u8], gid: bool) -> Result<Dest, String> {
        let text = msg.split(|b| *b == 0).next().unwrap_or_default();
        let text = std::str::from_utf8(text).map_err(|_| "an address that is not text")?;
        let f: Vec<&str> = text.split(':').collect();
        let want = if gid { 23 } else { 7 };
        if f.len() < want {
            return Err(format!(
                "the peer's address {text:?}: {} fields, not {want}",
                f.len()
            ));
        }
        let hex =
            |i: usize| u64::from_str_radix(f[i], 16).map_err(|_| format!("field {i} of {text:?}"));
        let mut g = [0u8; 16];
        if gid {
            for (k, b) in g.iter_mut().enumerate() {
                *b = hex(6 + k)? as u8;
            }
        }
        Ok(Dest {
            lid: hex(0)? as u16,
            out_reads: hex(1)? as u32,
            qpn: hex(2)? as u32,
            psn: hex(3)? as u32,
            rkey: hex(4)? as u32,
            vaddr: hex(5)?,
            gid: gid.then_some(g),
            srqn: hex(if gid { 22 } else { 6 })? as u32,
        })
    }
}

/// A bandwidth report as perftest exchanges it (`struct bw_report_data`, for a peer of
/// version 5.33 or later): bandwidths in the unit of the client's table (MB/s of 2^20 bytes,
/// or Gb/s with `--report_gbits`), the rate in millions of messages per second.
#[derive(Copy, Clone, Debug, Default, PartialEq)]
pub struct Report {
    pub size: u64,
    pub iters: u64,
    pub bw_peak: f64,
    pub bw_avg: f64,
    pub msg_rate: f64,
}

/// The TCP connection to a perftest peer.
pub struct Wire {
    s: TcpStream,
    /// This side was given a host: it writes first.
    client: bool,
}

fn io(what: &str) -> impl Fn(std::io::Error) -> String + '_ {
    move |e| format!("perftest exchange, {what}: {e}")
}

impl Wire {
    /// The connection `s`, this side its client or its server; a peer that stops answering
    /// during the set-up is an error after a minute (the exchanges after the test wait).
    pub fn new(s: TcpStream, client: bool) -> Result<Wire, String> {
        s.set_read_timeout(Some(std::time::Duration::from_secs(60)))
            .map_err(io("timeout"))?;
        Ok(Wire { s, client })
    }

    /// The exchanges after the test wait for as long as the peer's test takes (`-n`
    /// iterations or `-D` seconds), as perftest's blocking `read` does: the set-up's
    /// timeout ([`Wire::new`]) is lifted (as bfperf's own exchange lifts it once set up).
    fn after_test(&mut self) -> Result<(), String> {
        self.s.set_read_timeout(None).map_err(io("timeout"))
    }

    /// One symmetric exchange of `mine` for as many bytes of the peer's.
    fn xchg(&mut self, what: &str, mine: &[u8]) -> Result<Vec<u8>, String> {
        let mut theirs = vec![0u8; mine.len()];
        if self.client {
            self.s.write_all(mine).map_err(io(what))?;
            self.s.read_exact(&mut theirs).map_err(io(what))?;
        } else {
            self.s.read_exact(&mut theirs).map_err(io(what))?;
            self.s.write_all(mine).map_err(io(what))?;
        }
        Ok(theirs)
    }

    /// Steps 1 to 3: the versions, the system data, the MTU. Returns the peer's version, the
    /// path MTU (verbs enum) for a port whose MTU is `mtu`, and the cycle buffer both sides
    /// use: the larger of the two (perftest's `ctx_xchg_data` keeps the larger), through
    /// which a perftest peer's bandwidth tests step the remote address.
    pub fn preamble(&mut self, mtu: u32) -> Result<(String, u32, u32), String> {
        let mut v = [0u8; 16];
        v[..VERSION.len()].copy_from_slice(VERSION.as_bytes());
        let theirs = self.xchg("version", &v)?;
        let version: String = theirs
            .iter()
            .take_while(|b| **b != 0)
            .map(|b| *b as char)
            .collect();
        match version.parse::<f64>() {
            Ok(x) if x >= OLDEST => {}
            _ => {
                return Err(format!(
                    "the peer says version {version:?}: bfperf speaks perftest's exchange of \
                     version {OLDEST:.2} and later (perftest 4.5 is {VERSION}); is it perftest?"
                ))
            }
        }
        let ours = cycle_buffer();
        let c = self.xchg("cycle buffer", &ours.to_be_bytes())?;
        let theirs = u32::from_be_bytes(c.try_into().unwrap_or_default());
        let cycle = ours.max(theirs);
        self.xchg("cache line", &CACHE_LINE.to_be_bytes())?;
        let m = self.xchg("MTU", &[b'0' + mtu.min(9) as u8, 0])?;
        let rem = (m[0] as char).to_digit(10).unwrap_or(0);
        // perftest: the peer's if it is valid and smaller.
        let path = if (1..=5).contains(&rem) && rem < mtu {
            rem
        } else {
            mtu
        };
        Ok((version, path, cycle))
    }

    /// Step 4: one address exchange.
    pub fn hand_shake(&mut self, mine: &Dest) -> Result<Dest, String> {
        let theirs = self.xchg("address", &mine.encode())?;
        Dest::decode(&theirs, mine.gid.is_some())
    }

    /// `xchg_bw_reports` after one more address exchange: this side's report for the
    /// peer's (the server sends zeros: perftest's server has measured nothing). The server
    /// waits here while the client's test runs: [`Wire::after_test`].
    pub fn reports(&mut self, mine: &Dest, r: &Report) -> Result<Report, String> {
        self.after_test()?;
        self.hand_shake(mine)?;
        let mut x = |what: &str, v: [u8; 8]| -> Result<[u8; 8], String> {
            let t = self.xchg(what, &v)?;
            Ok(t.try_into().unwrap_or_default())
        };
        Ok(Report {
            size: u64::from_be_bytes(x("report size", r.size.to_be_bytes())?),
            iters: u64::from_be_bytes(x("report iterations", r.iters.to_be_bytes())?),
            bw_peak: f64::from_be_bytes(x("report peak", r.bw_peak.to_be_bytes())?),
            bw_avg: f64::from_be_bytes(x("report average", r.bw_avg.to_be_bytes())?),
            msg_rate: f64::from_be_bytes(x("report rate", r.msg_rate.to_be_bytes())?),
        })
    }

    /// `ctx_close_connection`: one more exchange, then "done" (never read by the peer). A
    /// side that measures nothing (`ib_read_lat`'s server) waits here while the peer's test
    /// runs: [`Wire::after_test`].
    pub fn close(mut self, mine: &Dest) -> Result<(), String> {
        self.after_test()?;
        self.hand_shake(mine)?;
        self.s.write_all(b"done\0").map_err(io("done"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dest(gid: bool) -> Dest {
        Dest {
            lid: 0,
            out_reads: 0x10,
            qpn: 0x11,
            psn: 0xabcdef,
            rkey: 0x1234,
            vaddr: 0x5555_0000_1000,
            gid: gid.then_some([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 77, 0, 1]),
            srqn: 0,
        }
    }

    /// A peer run with `-o 4` (or on a device whose `max_qp_rd_atom` is 4) says 4 in its
    /// address: its responder's depth, which bounds this side's `max_rd_atomic`; bfperf
    /// used to drop it and send 16 reads at once, which that responder NAKs.
    #[test]
    fn the_peers_outstanding_reads_are_its_responder_depth() {
        let m = Dest {
            out_reads: 4,
            ..dest(true)
        }
        .encode();
        assert_eq!(&m[5..9], b"0004");
        assert_eq!(Dest::decode(&m, true).unwrap().responder_depth(), 4);
        let big = Dest {
            out_reads: 0x1ff,
            ..dest(false)
        };
        assert_eq!(big.responder_depth(), 255);
    }

    /// The bytes perftest's `sprintf(msg, KEY_PRINT_FMT_GID, ...)` writes, and back.
    #[test]
    fn addresses_as_perftest_prints_them() {
        let m = dest(true).encode();
        assert_eq!(m.len(), 108);
        let text = std::str::from_utf8(&m[..107]).unwrap();
        assert_eq!(
            text,
            "0000:0010:000011:abcdef:00001234:0000555500001000:00:00:00:00:00:00:00:00:00:00:\
             ff:ff:0a:4d:00:01:00000000:"
        );
        assert_eq!(m[107], 0);
        assert_eq!(Dest::decode(&m, true).unwrap(), dest(true));
        let m = dest(false).encode();
        assert_eq!(m.len(), 59);
        assert_eq!(
            std::str::from_utf8(&m[..58]).unwrap(),
            "0000:0010:000011:abcdef:00001234:0000555500001000:00000000"
        );
        assert_eq!(Dest::decode(&m, false).unwrap(), dest(false));
        assert!(Dest::decode(b"0000:0010\0", true).is_err());
    }

    /// The whole preamble and a hand shake against a peer that plays perftest's server
    /// byte for byte, and a peer of an old version refused.
    #[test]
    fn client_and_server_orders() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let t = std::thread::spawn(move || {
            let (s, _) = l.accept().unwrap();
            let mut w = Wire::new(s, false).unwrap();
            let r = w.preamble(3).unwrap();
            let d = w.hand_shake(&dest(true)).unwrap();
            (r, d)
        });
        let mut c = Wire::new(TcpStream::connect(("127.0.0.1", port)).unwrap(), true).unwrap();
        let (v, mtu, cycle) = c.preamble(5).unwrap();
        assert_eq!((v.as_str(), mtu, cycle), (VERSION, 3, cycle_buffer()));
        let d = c.hand_shake(&dest(true)).unwrap();
        assert_eq!(d, dest(true));
        let ((v2, mtu2, _), d2) = t.join().unwrap();
        assert_eq!((v2.as_str(), mtu2, d2), (VERSION, 3, dest(true)));

        let (mut c, t) = client_of(|mut s| {
            let mut v = [0u8; 16];
            s.read_exact(&mut v).unwrap();
            s.write_all(b"5.60\0\0\0\0\0\0\0\0\0\0\0\0").unwrap();
        });
        let e = c.preamble(5).unwrap_err();
        assert!(e.contains("\"5.60\""), "{e}");
        t.join().unwrap();
    }

    /// A client wire to a peer that `peer` plays on the other end of the connection.
    fn client_of(
        peer: impl FnOnce(TcpStream) + Send + 'static,
    ) -> (Wire, std::thread::JoinHandle<()>) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let t = std::thread::spawn(move || peer(l.accept().unwrap().0));
        let c = Wire::new(TcpStream::connect(("127.0.0.1", port)).unwrap(), true).unwrap();
        (c, t)
    }

    /// The cycle buffer both sides use is the larger page: a perftest peer of 64 KiB pages
    /// (aarch64, ppc64le) steps through 64 KiB of this side's buffer (bfperf sent 4096 and
    /// dropped the peer's value: a review's finding).
    #[test]
    fn the_cycle_buffer_is_the_larger_of_the_two() {
        let (mut c, t) = client_of(|mut s| {
            // Reads the client's `n` bytes, answers `reply` (its own bytes back for none).
            let mut swap = |n: usize, reply: Option<&[u8]>| {
                let mut got = vec![0u8; n];
                s.read_exact(&mut got).unwrap();
                s.write_all(reply.unwrap_or(&got)).unwrap();
                got
            };
            swap(16, None);
            let c = swap(4, Some(&65536u32.to_be_bytes()));
            assert_eq!(c, cycle_buffer().to_be_bytes(), "this host's page");
            swap(4, None);
            swap(2, None);
        });
        let (_, _, cycle) = c.preamble(5).unwrap();
        assert_eq!(cycle, 65536.max(cycle_buffer()));
        t.join().unwrap();
    }

    /// A report crosses as perftest's `xchg_bw_reports` sends it: one address exchange,
    /// then five big-endian fields, the client first.
    #[test]
    fn reports_cross_big_endian() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let r = Report {
            size: 65536,
            iters: 5000,
            bw_peak: 1234.5,
            bw_avg: 1000.25,
            msg_rate: 0.016,
        };
        let t = std::thread::spawn(move || {
            let (s, _) = l.accept().unwrap();
            let mut raw = Vec::new();
            let mut s2 = s.try_clone().unwrap();
            let mut w = Wire::new(s, false).unwrap();
            let got = w.reports(&dest(false), &Report::default()).unwrap();
            // What the client sent for the size: 8 bytes, big-endian.
            raw.extend_from_slice(&got.size.to_be_bytes());
            let _ = s2.flush();
            (got, raw)
        });
        let mut c = Wire::new(TcpStream::connect(("127.0.0.1", port)).unwrap(), true).unwrap();
        assert_eq!(c.reports(&dest(false), &r).unwrap(), Report::default());
        let (got, raw) = t.join().unwrap();
        assert_eq!(got, r);
        assert_eq!(raw, [0, 0, 0, 0, 0, 1, 0, 0]);
    }

    /// The exchanges after the test wait for as long as the peer's test runs: a bfperf
    /// server of `ib_read_lat` (or of `ib_write_bw` / `ib_read_bw`) waits in the close (or
    /// the report's exchange) while the perftest client reads (writes) for `-n` iterations
    /// or `-D` seconds, and perftest's own server waits in a blocking `read` for as long
    /// (`ctx_close_connection`, `xchg_bw_reports`: no timeout). The set-up's timeout (60 s,
    /// shortened here to 100 ms) ended a longer test with "Resource temporarily
    /// unavailable" instead.
    #[test]
    fn the_exchanges_after_the_test_wait_for_the_peer_s_test() {
        let test_ms = 400;
        for report in [false, true] {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let port = l.local_addr().unwrap().port();
            // The perftest client: its test, then its address and ours, then the report
            // (ib_write_bw) or "done" (ib_read_lat).
            let peer = std::thread::spawn(move || {
                let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
                std::thread::sleep(std::time::Duration::from_millis(test_ms));
                s.write_all(&dest(false).encode()).unwrap();
                let mut m = [0u8; KEY];
                s.read_exact(&mut m).unwrap();
                if report {
                    for _ in 0..5 {
                        s.write_all(&[0u8; 8]).unwrap();
                        s.read_exact(&mut [0u8; 8]).unwrap();
                    }
                } else {
                    s.write_all(b"done\0").unwrap();
                }
            });
            let mut w = Wire::new(l.accept().unwrap().0, false).unwrap();
            w.s.set_read_timeout(Some(std::time::Duration::from_millis(100)))
                .unwrap();
            let r = if report {
                w.reports(&dest(false), &Report::default()).map(|_| ())
            } else {
                w.close(&dest(false))
            };
            assert_eq!(r, Ok(()), "report {report}");
            peer.join().unwrap();
        }
    }
}
