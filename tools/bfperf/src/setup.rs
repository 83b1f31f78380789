//! Devices, QPs and buffers for a test: both sides in this process (a loopback pair), or one
//! side talking to a bfperf on another host (server / client over the out-of-band exchange).

use crate::opts::Opts;
use crate::perftest::{self, Dest, Wire};
use blueflame::connect::{Exchange, RemoteBuf};
use blueflame::{
    Access, Completion, Cq, CqOptions, DcPeer, Dci, Dct, Device, Endpoint, MemoryRegion, PostFlags,
    PostSend, Qp, QpCaps, QueuePair, Request, Result, Sge, Srq, SrqCaps,
};
use std::net::TcpStream;
use std::time::Instant;

mod cm;
mod exchange;

use exchange::{dial_or_accept, first_buffer, swap};
pub use exchange::{params, sync};

/// What a side posts on: an RC QP, or (`-c dc`) a DCI aimed at the peer's DCT. The RC QP
/// is held inline (no pointer to follow on the measured path), the DC path boxed.
#[allow(clippy::large_enum_variant)]
pub enum Sq {
    Rc(Qp),
    Dc(Box<DcPath>),
}

/// A side's DC transport (`-c dc`, as perftest's): its DCI, the peer's DCT as the DCI's
/// destination, and its own DCT, which the peer's DCI reaches (kept here; it keeps the
/// SRQ a DCT needs).
pub struct DcPath {
    pub dci: Dci,
    pub to: DcPeer,
    _dct: Dct,
}

/// perftest's DC access key (`DC_KEY` in `perftest_resources.c`).
pub const DC_KEY: u64 = 0xffee_ddcc;

impl PostSend for Sq {
    fn post(&mut self, req: &Request<'_>, cookie: u64, flags: PostFlags) -> Result<()> {
        match self {
            Sq::Rc(q) => q.post(req, cookie, flags),
            Sq::Dc(d) => {
                let d = &mut **d;
                d.dci.to(&d.to).post(req, cookie, flags)
            }
        }
    }
}

impl Sq {
    /// Send-queue room (blocks).
    pub fn free_send(&self) -> u32 {
        match self {
            Sq::Rc(q) => q.free_send(),
            Sq::Dc(d) => d.dci.free_send(),
        }
    }

    /// Requests of the largest kind the queue holds.
    pub fn send_depth(&self) -> u32 {
        match self {
            Sq::Rc(q) => q.send_depth(),
            Sq::Dc(d) => d.dci.send_depth(),
        }
    }

    /// The QP number (completions name it).
    pub fn qpn(&self) -> u32 {
        match self {
            Sq::Rc(q) => q.qpn(),
            Sq::Dc(d) => d.dci.qpn(),
        }
    }

    /// Posts a receive (RC; a DCI has no receive queue).
    pub fn post_recv(&mut self, sgl: &[Sge], cookie: u64) -> Result<()> {
        match self {
            Sq::Rc(q) => q.post_recv(sgl, cookie),
            Sq::Dc(_) => Err(blueflame::Error::Unsupported(
                "receives over DC (a DCI has no receive queue)",
            )),
        }
    }

    /// Posts `n` copies of `req` under one doorbell, the last one signaled with `cookie`.
    pub fn post_n(&mut self, req: &Request<'_>, n: u64, cookie: u64) -> Result<()> {
        let flags = |k: u64| match k + 1 == n {
            true => (PostFlags::SIGNALED, cookie),
            false => (PostFlags::UNSIGNALED, 0),
        };
        match self {
            Sq::Rc(q) => {
                let mut b = q.batch();
                for k in 0..n {
                    let (f, c) = flags(k);
                    b.push(req, c, f)?;
                }
                b.ring()
            }
            Sq::Dc(d) => {
                let d = &mut **d;
                let mut b = d.dci.batch();
                for k in 0..n {
                    let (f, c) = flags(k);
                    b.push(&d.to, req, c, f)?;
                }
                b.ring();
                Ok(())
            }
        }
    }
}

/// One side: its QP, CQ and buffer, and the peer's buffer.
pub struct Side {
    pub dev: Device,
    pub qp: Sq,
    pub cq: Cq,
    pub mr: Mem,
    pub peer: RemoteBuf,
    /// The source of inline messages (zeros but for the tag byte each message sets).
    pub msg: Box<[u8; 1024]>,
    /// Whether wait loops `pause`: on the software NIC, whose writes come from another
    /// core (a spinning load then leaves the loop without a memory-order machine clear;
    /// about 0.2 vs 0.5 us per half round trip here), not on a real device, as perftest.
    pub pause: bool,
    /// Event mode: completions are waited for on the CQ's completion channel.
    pub events: bool,
    /// `--hw-timestamps`: the CQ stamps completions, polled with `Cq::poll_timed`.
    pub timed: bool,
    /// `--srq`: the shared receive queue the QP takes its receives from.
    pub srq: Option<Srq>,
    /// perftest's `-q`: the side's QPs after `qp` (on its CQ and SRQ); QP `i` uses the
    /// `i`-th of the equal slices of `mr` and of the peer's buffer (`Side::stride`).
    pub more: Vec<Sq>,
}

/// How the two sides are placed (built once per test: its size does not matter).
#[allow(clippy::large_enum_variant)]
pub enum Setup {
    /// Both sides here: the initiator and the responder.
    Local(Side, Side),
    /// This is the server (responder); the stream syncs the end of the test.
    Server(Side, TcpStream),
    /// This is the client (initiator).
    Client(Side, TcpStream),
    /// The other side is an unmodified perftest program (`--perftest` on a client; a
    /// server tells from the first bytes): its exchange, its test loop.
    Perftest(Side, PerftestLink),
    /// The other side is rdma-core's `ibv_rc_pingpong` (`--rc-pingpong` on a client; a
    /// server tells from the first bytes).
    RcPingpong(Side, Pingpong),
}

/// A run against `ibv_rc_pingpong`, whose exchange carries neither the message size nor
/// the count: each side runs its own `-s` and `-n`, or `ibv_rc_pingpong`'s defaults.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Pingpong {
    /// This side is the client (it sends first and measures).
    pub client: bool,
    /// The message size.
    pub size: usize,
    /// The messages each side sends.
    pub iters: usize,
}

impl Pingpong {
    /// The run of a side of `size` bytes (the test's, [`crate::opts::size_for`]) that meets
    /// `ibv_rc_pingpong`: a client was told so (`--rc-pingpong`) and has its defaults
    /// already; a server learns it only now, and takes them where it was not given -s / -n
    /// (`send-lat`'s own, 2 bytes, would refuse the 4096 an `ibv_rc_pingpong` client sends
    /// without -s).
    pub fn of(o: &Opts, size: usize) -> Pingpong {
        use crate::opts::{RC_PINGPONG_ITERS, RC_PINGPONG_SIZE};
        let client = !o.server;
        Pingpong {
            client,
            size: match client || o.size_given || o.all {
                true => size,
                false => RC_PINGPONG_SIZE,
            },
            iters: match client || o.iters_given {
                true => o.iters,
                false => RC_PINGPONG_ITERS,
            },
        }
    }
}

/// What a test with a perftest peer needs after the set-up: the connection, this side's
/// address (exchanged once more before the test, and at its close), the test, the role.
pub struct PerftestLink {
    pub wire: Wire,
    pub mine: Dest,
    pub test: perftest::Test,
    /// This side was given the host (perftest's CLIENT).
    pub client: bool,
    /// The peer's version.
    pub version: String,
}

/// The refusal of an exchange with a perftest or `ibv_rc_pingpong` peer that failed,
/// said on stderr.
pub fn peer_failed(why: String) -> blueflame::Error {
    eprintln!("bfperf: {why}");
    blueflame::Error::InvalidParameter {
        what: "exchange with a perftest peer (see the line above)",
        value: 0,
    }
}

/// Which program the client that connected is.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Peer {
    Bfperf,
    Perftest,
    RcPingpong,
}

/// Tells the client that connected on `s` by its first five bytes: bfperf's magic (`BFX2`,
/// or an older bfperf's `BFX1`), `ibv_rc_pingpong`'s address (4 hex digits of LID, then ':'), else perftest's version
/// ("6.06").
fn classify(s: &TcpStream) -> Result<Peer> {
    s.set_read_timeout(Some(std::time::Duration::from_secs(60)))
        .map_err(blueflame::Error::Io)?;
    let mut b = [0u8; 5];
    loop {
        let n = s.peek(&mut b).map_err(blueflame::Error::Io)?;
        if n == 0 {
            return Err(blueflame::Error::Io(
                std::io::ErrorKind::UnexpectedEof.into(),
            ));
        }
        if n >= 4 && matches!(&b[..4], b"BFX2" | b"BFX1") {
            return Ok(Peer::Bfperf);
        }
        if n == b.len() {
            return Ok(if b[4] == b':' {
                Peer::RcPingpong
            } else {
                Peer::Perftest
            });
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// `ibv_rc_pingpong`'s set-up on `stream` for side `qa`: its exchange, the QP connected
/// with its path MTU.
fn rc_pingpong_setup(
    o: &Opts,
    dev: &Device,
    (test, size): (&str, usize),
    mut stream: TcpStream,
    parts: (Qp, Cq, Mem, Option<Srq>),
) -> Result<Setup> {
    if test.replace('_', "-") != "send-lat" {
        return Err(peer_failed(format!(
            "ibv_rc_pingpong is a send ping-pong: run send-lat against it, not {test}"
        )));
    }
    let run = Pingpong::of(o, size);
    // A server that takes ibv_rc_pingpong's size: its side built again for it (nothing
    // was exchanged yet).
    let (mut qa, cqa, mra, srqa) = match run.size == size {
        true => parts,
        false => {
            drop(parts);
            side(dev, o, run.size, 0)?.0
        }
    };
    let client = run.client;
    let ours = qa.endpoint()?;
    let mut connected = Ok(());
    crate::rc_pingpong::exchange(&mut stream, client, &ours, |theirs| {
        connected = qa.connect(&theirs);
        connected.as_ref().map_err(|e| e.to_string()).map(|_| ())
    })
    .map_err(peer_failed)?;
    connected?;
    let peer = mra.remote_buf();
    let s = Side::new(dev, o, (qa, cqa, mra, srqa), peer);
    Ok(Setup::RcPingpong(s, run))
}

/// perftest's set-up on `stream` for side `qa` (its CQ, region, SRQ): the preamble, the
/// address exchanges up to the last one (which the test makes once it is ready), the QP
/// connected to the peer's.
#[allow(clippy::too_many_arguments)]
fn perftest_setup(
    o: &Opts,
    dev: &Device,
    test: &str,
    size: usize,
    stream: TcpStream,
    (mut qa, cqa, mra, srqa): (Qp, Cq, Mem, Option<Srq>),
) -> Result<Setup> {
    let t = perftest::Test::of(test, o.write_imm).ok_or_else(|| {
        peer_failed(format!(
            "{test}{} has no perftest counterpart on the wire (write-lat, read-lat, send-lat)",
            if o.write_imm { " --write-with-imm" } else { "" }
        ))
    })?;
    let client = !o.server;
    let ep = qa.endpoint()?;
    let mine = Dest {
        lid: ep.lid,
        // Reads the peer may have in flight against this QP (its `max_rd_atomic`): what
        // this QP's responder is programmed with (perftest's `max_dest_rd_atomic =
        // my_dest->out_reads`, `ctx_modify_qp_to_rtr`).
        out_reads: u32::from(ep.max_dest_rd_atomic),
        qpn: ep.qpn,
        psn: ep.psn,
        rkey: mra.rkey(),
        vaddr: mra.addr(),
        gid: (ep.gid != [0; 16]).then_some(ep.gid),
        srqn: 0,
    };
    let mut wire = Wire::new(stream, client).map_err(peer_failed)?;
    let (version, mtu, cycle) = wire.preamble(ep.mtu).map_err(peer_failed)?;
    // A perftest peer's bandwidth tests step through `cycle` bytes of this side's buffer
    // (`increase_rem_addr`): a peer of larger pages than this host's would write past it
    // (a review's finding; bfperf sent 4096 and dropped the peer's value).
    if cycle as usize > area(size) {
        return Err(peer_failed(format!(
            "the peer's cycle buffer (its page size) is {cycle} bytes, more than the {} of \
             this side's buffer for {size}-byte messages: run the two on hosts of one page \
             size",
            area(size)
        )));
    }
    let (before, after) = t.hand_shakes();
    let mut theirs = mine;
    for _ in 0..before {
        theirs = wire.hand_shake(&mine).map_err(peer_failed)?;
    }
    qa.connect(&blueflame::Endpoint {
        qpn: theirs.qpn,
        psn: theirs.psn,
        gid: theirs.gid.unwrap_or_default(),
        lid: theirs.lid,
        mtu,
        // The peer's responder depth: this QP's `max_rd_atomic` at most (perftest's
        // `max_rd_atomic = dest->out_reads`, `ctx_modify_qp_to_rts`).
        max_dest_rd_atomic: theirs.responder_depth(),
    })?;
    for _ in 1..after {
        wire.hand_shake(&mine).map_err(peer_failed)?;
    }
    let peer = exchange::in_address_space(RemoteBuf {
        addr: theirs.vaddr,
        rkey: theirs.rkey,
        // perftest's BUFF_SIZE: the cycle buffer, or the message when larger.
        len: size.max(cycle as usize) as u64,
    })?;
    let s = Side::new(dev, o, (qa, cqa, mra, srqa), peer);
    Ok(Setup::Perftest(
        s,
        PerftestLink {
            wire,
            mine,
            test: t,
            client,
            version,
        },
    ))
}

/// Bytes of each side's buffer for messages of `size`: the area peers write at 0 (at least
/// perftest's cycle buffer, a page: a perftest peer's bandwidth tests write and read
/// `size` bytes at each cache-line step through it, `increase_rem_addr`), the source area at
/// `size`.
pub fn buf_len(size: usize) -> usize {
    2 * area(size) + 64
}

/// The area of a side's buffer peers write at 0, for messages of `size`: a page (perftest's
/// cycle buffer), or the message when larger.
fn area(size: usize) -> usize {
    size.max(crate::perftest::cycle_buffer() as usize)
}

/// Opens the device the options name, and says what it is.
pub fn open(o: &Opts) -> Result<(Device, String)> {
    if let Some(p) = &o.path {
        std::env::set_var("BLUEFLAME_PATH", p);
    }
    if o.ib_port != 1 && matches!(o.device.as_str(), "sim" | "sim-stepped" | "auto") {
        // The software NIC has one port; `auto` opens port 1 of whatever it finds.
        return Err(blueflame::Error::InvalidParameter {
            what: "port (-i) of the software NIC or of --device auto: 1 only (name the device)",
            value: o.ib_port as u64,
        });
    }
    let dev = match o.device.as_str() {
        "sim" => Device::sim(),
        "sim-stepped" => Device::sim_stepped(),
        "auto" => Device::open_default()?,
        name => Device::open_port(name, o.ib_port, o.gid_index)?,
    };
    let what = format!("{}, {:?} data path", dev, dev.data_path());
    Ok((dev, what))
}

/// How the QPs of this run ring their doorbell (a QP is created to ask: the mode is chosen
/// per QP when it is created, and every QP of a run gets the same one unless the device runs
/// out of thread domains).
pub fn doorbell_mode(dev: &Device, o: &Opts) -> Result<String> {
    let pd = dev.alloc_pd()?;
    let cq = dev.create_cq(64)?;
    let qp = pd.create_qp(&cq, &cq, caps(o))?;
    Ok(match qp.doorbell_mode() {
        Some(m) => m.to_string(),
        None => "ibv_post_send (verbs path)".into(),
    })
}

/// The most send-ring blocks a QP asks for: a ConnectX's `max_qp_wr` (and the software
/// NIC's), which `-t` up to perftest's MAX_TX would pass (8 blocks for each of twice the
/// depth). The ring then holds 16,384 requests of two blocks (the default inline limit),
/// 6,553 of five (220 inline bytes); a bandwidth test keeps at most what its queue holds
/// in flight (`send_depth`).
pub const MAX_SQ_BLOCKS: u32 = 1 << 15;

fn caps(o: &Opts) -> QpCaps {
    let depth = (o.tx_depth as u32 * 2).next_power_of_two().max(256);
    QpCaps {
        // Blocks for `2 * tx_depth` requests of the largest kind these limits allow (5
        // blocks with 220 inline bytes): the verbs path sizes its queue in such requests
        // (`sq_blocks / max_wqe_bbs`), so `depth` blocks gave rxe 63 requests, fewer than
        // the 128 a bandwidth test keeps in flight.
        sq_blocks: (depth * 8).min(MAX_SQ_BLOCKS),
        rq_entries: depth,
        max_inline: o.inline,
        max_send_sge: 4,
        max_recv_sge: 4,
        // A dma-buf has no CPU view: a small send must land in the receive buffer, not in
        // its CQE for the poller to copy (perftest sets MLX5_SCATTER_TO_CQE=0 for device
        // memory send tests).
        scatter_to_cqe: !o.dmabuf,
        ..QpCaps::default()
    }
}

/// A side's QP, CQ, region and SRQ, and its further QPs (`-q`).
type Parts = ((Qp, Cq, Mem, Option<Srq>), Vec<Qp>);

/// A side's QP(s), CQ, region and SRQ; `which` is its place among the sides of this process
/// (0, or 1 for the second side of a one-process run: its `--mmap` window follows the
/// first's).
fn side(dev: &Device, o: &Opts, size: usize, which: u64) -> Result<Parts> {
    let pd = dev.alloc_pd()?;
    let caps = caps(o);
    let cq = side_cq(dev, o)?;
    // With --srq the receives go to a shared receive queue of the same depth, on the same
    // CQ (perftest --srq: one SRQ the QP takes its receives from).
    let (qp, srq) = if o.srq {
        let srq = pd.create_srq(
            &cq,
            SrqCaps {
                entries: caps.rq_entries * o.qps as u32,
                max_sge: caps.max_recv_sge,
            },
        )?;
        (pd.create_qp_with_srq(&cq, &srq, caps)?, Some(srq))
    } else {
        (pd.create_qp(&cq, &cq, caps)?, None)
    };
    let mut more = Vec::with_capacity(o.qps - 1);
    for _ in 1..o.qps {
        more.push(match &srq {
            Some(srq) => pd.create_qp_with_srq(&cq, srq, caps)?,
            None => pd.create_qp(&cq, &cq, caps)?,
        });
    }
    let mr = region(&pd, o, size, which)?;
    Ok(((qp, cq, mr, srq), more))
}

/// A side's CQ: room for everything its queues may hold (a direct-path send holds an entry
/// per block until its unsignaled run is reclaimed); with -q every QP of the side completes
/// on it (as perftest's one send CQ).
fn side_cq(dev: &Device, o: &Opts) -> Result<Cq> {
    let caps = caps(o);
    let mut opts = CqOptions::new((caps.sq_blocks + caps.rq_entries) * o.qps as u32);
    if o.events {
        // Each side's CQ on a channel of its own (perftest: a channel per CQ with -e).
        opts = opts.channel(&dev.create_channel()?);
    }
    if let Some(format) = o.cqe_zip {
        opts = opts.compression(format);
    }
    if o.hw_ts {
        opts = opts.timestamps();
    }
    dev.create_cq_with(&opts)
}

/// A side's buffer: its region and, with `--use_dmabuf`, the dma-buf's exporter (the one
/// way to its bytes: a dma-buf region has no CPU view). Derefs to the region.
pub struct Mem {
    pub region: MemoryRegion,
    pub dmabuf: Option<crate::dmabuf::DmaBuf>,
}

impl std::ops::Deref for Mem {
    type Target = MemoryRegion;
    fn deref(&self) -> &MemoryRegion {
        &self.region
    }
}

impl From<MemoryRegion> for Mem {
    fn from(region: MemoryRegion) -> Mem {
        Mem {
            region,
            dmabuf: None,
        }
    }
}

/// The byte of a dma-buf's source areas (where a side's writes and sends gather from, and
/// its reads land), written through the exporter before the test: a message carries it to
/// the peer's dma-buf, where a check through the peer's exporter finds it.
pub const DMABUF_SOURCE: u8 = 0x5a;

/// The byte of side `which`'s destination areas (where the peer's writes and sends land,
/// and its reads gather from) in a dma-buf: a read carries it into the reader's source area.
pub fn dmabuf_dest(which: u64) -> u8 {
    0x10 + which as u8
}

/// A side's buffer (every QP's slice): allocated, in huge pages, a window of a file, or a
/// dma-buf; `which` as for [`side`].
fn region(pd: &blueflame::Pd, o: &Opts, size: usize, which: u64) -> Result<Mem> {
    let mut rights =
        Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    if o.odp {
        // perftest --odp: the buffer registered on demand (pages mapped by the device's
        // faults, not pinned); a device without on-demand paging refuses it, typed.
        rights = rights | Access::ON_DEMAND;
    }
    let len = buf_len(size) * o.qps;
    Ok(if o.dmabuf {
        // perftest --use_*_dmabuf: the buffer is a dma-buf (the software NIC's exporter, or
        // udmabuf), registered with ibv_reg_dmabuf_mr. Its bytes are set through the
        // exporter: each QP's slice a destination area of this side's byte, then the
        // source area of DMABUF_SOURCE (the messages gather from it: no inline).
        let (region, buf) = crate::dmabuf::region(pd.device(), pd, len, which, rights)?;
        let slice = buf_len(size);
        for lane in 0..o.qps {
            buf.write(lane * slice, &vec![dmabuf_dest(which); size])?;
            buf.write(lane * slice + size, &vec![DMABUF_SOURCE; size])?;
        }
        Mem {
            region,
            dmabuf: Some(buf),
        }
    } else if o.hugepages {
        // perftest --use_hugepages: the buffer in huge pages (a machine without any
        // reserved refuses it, typed, naming the sysctl).
        let pages = blueflame::mapping::HugePages::new(len, blueflame::mapping::PageSize::Huge2M)?;
        pd.register(pages, rights).map_err(|r| r.error)?.into()
    } else if let Some(path) = &o.mmap {
        // perftest --mmap: the buffer is the file's bytes at --mmap-offset (MAP_SHARED),
        // registered as user memory; a second side here takes the next window.
        let window = (len as u64).next_multiple_of(crate::mmap_file::page_size());
        let at = o.mmap_offset.unwrap_or(0) + which * window;
        let w = crate::mmap_file::FileWindow::map(path, at, len)?;
        pd.register(w, rights).map_err(|r| r.error)?.into()
    } else {
        pd.alloc_mr(len, rights)?.into()
    })
}

/// A DC side (`-c dc`): a DCI and a DCT (with the SRQ a DCT needs, which the DCT keeps;
/// unused: DC carries writes and reads here) on one CQ, and its buffer; `which` as for
/// [`side`].
fn dc_side(dev: &Device, o: &Opts, size: usize, which: u64) -> Result<DcParts> {
    let pd = dev.alloc_pd()?;
    let cq = side_cq(dev, o)?;
    let srq = pd.create_srq(&cq, SrqCaps::default())?;
    let dct = pd.create_dct(
        &cq,
        &srq,
        DC_KEY,
        Access::REMOTE_WRITE | Access::REMOTE_READ,
    )?;
    let dci = pd.create_dci(&cq, caps(o))?;
    let mr = region(&pd, o, size, which)?;
    drop(srq);
    Ok((dci, dct, cq, mr))
}

/// A DC side's DCI, DCT, CQ and buffer.
type DcParts = (Dci, Dct, Cq, Mem);

/// What a peer's DCI needs to reach `dct`: the port's LID and GID (those of an RC QP of the
/// same domain, made to ask), and the DCT number in place of a QP number.
fn dc_address(dev: &Device, dct: &Dct) -> Result<Endpoint> {
    let pd = dev.alloc_pd()?;
    let cq = dev.create_cq(4)?;
    let ep = pd.create_qp(&cq, &cq, QpCaps::default())?.endpoint()?;
    // The port's LID and GID as a UD QP reports them on every device (the software NIC's
    // RC endpoint names only numbers), for the peer's address handle.
    let ud = pd.create_ud_qp(&cq, &cq, QpCaps::default(), 1)?.endpoint();
    Ok(Endpoint {
        qpn: dct.dctn(),
        lid: ud.lid,
        gid: ud.gid,
        ..ep
    })
}

/// The destination of the peer's DCT at `theirs` ([`dc_address`]) for a DCI of `pd`:
/// through an address handle to the peer's port (as perftest's `ibv_create_ah` for DC), on
/// every device (the software NIC routes a DCI request by its address vector too).
fn dc_peer(pd: &blueflame::Pd, theirs: &Endpoint) -> Result<DcPeer> {
    let ah = pd.create_ah(blueflame::UdEndpoint {
        qpn: theirs.qpn,
        qkey: 0,
        lid: theirs.lid,
        gid: theirs.gid,
    })?;
    DcPeer::from_ah(&ah, theirs.qpn, DC_KEY)
}

/// `-c dc`: both sides here, or this side and a bfperf peer's (the DCT's address and the
/// buffer exchanged as an RC QP's, no connection made: each request names its target).
fn dc_setup(o: &Opts, dev: &Device, test: &str, size: usize) -> Result<Setup> {
    let mk = |(dci, dct, cq, mr): DcParts, theirs: &Endpoint, peer| -> Result<Side> {
        let to = dc_peer(dci.pd(), theirs)?;
        let path = DcPath { dci, to, _dct: dct };
        Ok(Side::build(
            dev,
            o,
            Sq::Dc(Box::new(path)),
            cq,
            mr,
            None,
            peer,
        ))
    };
    let a = dc_side(dev, o, size, 0)?;
    let ea = dc_address(dev, &a.1)?;
    if o.server || o.client.is_some() {
        let stream = dial_or_accept(o)?;
        if o.server && classify(&stream)? != Peer::Bfperf {
            return Err(peer_failed(
                "-c dc is spoken with a bfperf peer only (its -c dc)".into(),
            ));
        }
        let ours = Exchange {
            endpoint: ea,
            buffers: vec![a.3.remote_buf()],
        };
        let (theirs, _, stream) = swap(stream, &ours, &[], &params(test, o, size))?;
        let peer = first_buffer(&theirs, a.3.len())?;
        let s = mk(a, &theirs.endpoint, peer)?;
        return Ok(if o.server {
            Setup::Server(s, stream)
        } else {
            Setup::Client(s, stream)
        });
    }
    let b = dc_side(dev, o, size, 1)?;
    let eb = dc_address(dev, &b.1)?;
    let (pa, pb) = (b.3.remote_buf(), a.3.remote_buf());
    Ok(Setup::Local(mk(a, &eb, pa)?, mk(b, &ea, pb)?))
}

/// Builds the sides for messages of `size`.
pub fn setup(o: &Opts, dev: &Device, test: &str, size: usize) -> Result<Setup> {
    if o.rdma_cm {
        return cm::setup(o, dev, test, size);
    }
    if (o.server || o.client.is_some()) && dev.nic().is_some() {
        return Err(blueflame::Error::Unsupported(
            "--server/--client with the software NIC: it lives in one process; run without them",
        ));
    }
    if o.connection == crate::opts::Connection::Dc {
        return dc_setup(o, dev, test, size);
    }
    let ((mut qa, cqa, mra, srqa), mut more_a) = side(dev, o, size, 0)?;
    if o.server || o.client.is_some() {
        let stream = dial_or_accept(o)?;
        let peer = match o.server {
            true => classify(&stream)?,
            false if o.perftest => Peer::Perftest,
            false if o.rc_pingpong => Peer::RcPingpong,
            false => Peer::Bfperf,
        };
        match peer {
            // A client is refused -q and -b with --perftest (opts); a server learns its peer
            // is perftest only here, and would otherwise run one QP one way against it and
            // fail in perftest's exchange ("failed to fill whole buffer").
            Peer::Perftest if o.qps > 1 => {
                return Err(blueflame::Error::Unsupported(
                    "a perftest client with -q on this server: perftest's exchange of several QPs is not spoken yet (run both sides without -q)",
                ))
            }
            Peer::Perftest if o.bidirectional => {
                return Err(blueflame::Error::Unsupported(
                    "a perftest client with -b on this server: perftest's bidirectional exchange is not spoken yet (run both sides without -b)",
                ))
            }
            Peer::Perftest => {
                return perftest_setup(o, dev, test, size, stream, (qa, cqa, mra, srqa))
            }
            Peer::RcPingpong => {
                return rc_pingpong_setup(o, dev, (test, size), stream, (qa, cqa, mra, srqa))
            }
            Peer::Bfperf => {}
        }
        let ours = Exchange {
            endpoint: qa.endpoint()?,
            buffers: vec![mra.remote_buf()],
        };
        let mine: Vec<Endpoint> = more_a.iter().map(Qp::endpoint).collect::<Result<_>>()?;
        let (theirs, more_theirs, stream) = swap(stream, &ours, &mine, &params(test, o, size))?;
        let peer = first_buffer(&theirs, mra.len())?;
        qa.connect(&theirs.endpoint)?;
        for (q, e) in more_a.iter_mut().zip(more_theirs) {
            q.connect(&e)?;
        }
        let mut s = Side::new(dev, o, (qa, cqa, mra, srqa), peer);
        s.more = more_a.into_iter().map(Sq::Rc).collect();
        return Ok(if o.server {
            Setup::Server(s, stream)
        } else {
            Setup::Client(s, stream)
        });
    }
    let ((mut qb, cqb, mrb, srqb), mut more_b) = side(dev, o, size, 1)?;
    let (ea, eb) = (qa.endpoint()?, qb.endpoint()?);
    qa.connect(&eb)?;
    qb.connect(&ea)?;
    // -q: QP i of one side to QP i of the other.
    for (x, y) in more_a.iter_mut().zip(more_b.iter_mut()) {
        let (ex, ey) = (x.endpoint()?, y.endpoint()?);
        x.connect(&ey)?;
        y.connect(&ex)?;
    }
    let (pa, pb) = (mrb.remote_buf(), mra.remote_buf());
    let mut a = Side::new(dev, o, (qa, cqa, mra, srqa), pa);
    let mut b = Side::new(dev, o, (qb, cqb, mrb, srqb), pb);
    a.more = more_a.into_iter().map(Sq::Rc).collect();
    b.more = more_b.into_iter().map(Sq::Rc).collect();
    Ok(Setup::Local(a, b))
}

impl Side {
    /// The side of QP `qp` (its CQ, region and SRQ) whose peer's buffer is `peer`.
    pub fn new(
        dev: &Device,
        o: &Opts,
        (qp, cq, mr, srq): (Qp, Cq, Mem, Option<Srq>),
        peer: RemoteBuf,
    ) -> Side {
        Side::build(dev, o, Sq::Rc(qp), cq, mr, srq, peer)
    }

    /// The side posting on `qp`, completing on `cq`, its buffer `mr`.
    fn build(
        dev: &Device,
        o: &Opts,
        qp: Sq,
        cq: Cq,
        mr: Mem,
        srq: Option<Srq>,
        peer: RemoteBuf,
    ) -> Side {
        Side {
            dev: dev.clone(),
            qp,
            cq,
            mr,
            peer,
            msg: Box::new([0; 1024]),
            pause: dev.nic().is_some(),
            events: o.events,
            timed: o.hw_ts,
            srq,
            more: Vec::new(),
        }
    }

    /// The side's QPs (`-q`; 1 without it).
    pub fn lanes(&self) -> usize {
        1 + self.more.len()
    }

    /// QP `i` of the side (0: `qp`).
    pub fn qp_at(&mut self, i: usize) -> &mut Sq {
        match i.checked_sub(1) {
            Some(j) if j < self.more.len() => &mut self.more[j],
            _ => &mut self.qp,
        }
    }

    /// Bytes of the buffer (own and peer's) each QP uses: QP `i` the slice at `i * stride`.
    pub fn stride(&self) -> usize {
        self.mr.len() / self.lanes()
    }

    /// Posts a receive for QP `i`: to the SRQ with `--srq`, else to that QP.
    pub fn post_recv_at(&mut self, i: usize, sgl: &[Sge], cookie: u64) -> Result<()> {
        match self.srq.as_mut() {
            Some(srq) => srq.post_recv(sgl, cookie),
            None => self.qp_at(i).post_recv(sgl, cookie),
        }
    }

    /// Posts a receive: to the SRQ with `--srq`, else to the QP.
    pub fn post_recv(&mut self, sgl: &[Sge], cookie: u64) -> Result<()> {
        match self.srq.as_mut() {
            Some(srq) => srq.post_recv(sgl, cookie),
            None => self.qp.post_recv(sgl, cookie),
        }
    }

    /// Spins until byte `off` of the own buffer equals `tag` (the stepped NIC runs meanwhile).
    pub fn wait_byte(&self, off: usize, tag: u8) -> Result<()> {
        let mut spins = 0u64;
        while self.mr.read_volatile_u8(off)? != tag {
            self.dev.process();
            spins += 1;
            if spins & ((1 << 30) - 1) == 0 {
                eprintln!("bfperf: still waiting for the peer ({spins} spins)");
            }
            if self.pause {
                std::hint::spin_loop();
            }
        }
        Ok(())
    }

    /// [`Side::wait_byte`] in a timed run (`-D`): gives up at `end` (the run is over and the
    /// peer may have stopped: perftest's `while (*poll_buf != rcnt && state != END_STATE)`);
    /// true when the byte came. The clock is read once every 64 spins, so that the wait
    /// costs about what the counted one does.
    pub fn wait_byte_until(&self, off: usize, tag: u8, end: Instant) -> Result<bool> {
        let mut spins = 0u32;
        while self.mr.read_volatile_u8(off)? != tag {
            self.dev.process();
            spins = spins.wrapping_add(1);
            if spins & 63 == 0 && Instant::now() >= end {
                return Ok(false);
            }
            if self.pause {
                std::hint::spin_loop();
            }
        }
        Ok(true)
    }

    /// [`Side::next_completion`] in a timed run (`-D`; busy polling: the options refuse
    /// `--events` and `--hw-timestamps` with it): None once `end` is past with nothing
    /// polled (the clock read once every 64 empty polls).
    pub fn next_completion_until(&mut self, end: Instant) -> Result<Option<Completion>> {
        let mut out = [Completion::default(); 1];
        let mut spins = 0u32;
        loop {
            if self.pause {
                self.dev.process();
            }
            if self.cq.poll(&mut out) == 1 {
                break;
            }
            spins = spins.wrapping_add(1);
            if spins & 63 == 0 && Instant::now() >= end {
                return Ok(None);
            }
            if self.pause {
                std::hint::spin_loop();
            }
        }
        let c = out[0];
        if !c.is_ok() {
            eprintln!("bfperf: completion failed: {c:?}");
            std::process::exit(1);
        }
        Ok(Some(c))
    }

    /// Polls until one completion arrives (in event mode: sleeps on the completion channel
    /// with `Cq::wait`); returns it (errors are fatal to the test). Busy polling is a loop
    /// of `Cq::poll` alone, as perftest's `do { ne = ibv_poll_cq(cq, 1, &wc); } while
    /// (ne == 0)` (with the stepped software NIC run between polls).
    pub fn next_completion(&mut self) -> Result<Completion> {
        if self.timed {
            return self.next_completion_at().map(|(c, _)| c);
        }
        let mut out = [Completion::default(); 1];
        if self.events {
            while self.cq.wait(&mut out, None)? != 1 {}
        } else if self.pause {
            // The software NIC: run it (stepped) and pause between polls.
            loop {
                self.dev.process();
                if self.cq.poll(&mut out) == 1 {
                    break;
                }
                std::hint::spin_loop();
            }
        } else {
            while self.cq.poll(&mut out) != 1 {}
        }
        let c = out[0];
        if !c.is_ok() {
            eprintln!("bfperf: completion failed: {c:?}");
            std::process::exit(1);
        }
        Ok(c)
    }

    /// [`Side::next_completion`] with the NIC's time of it (`--hw-timestamps`: the CQ
    /// stamps completions; None otherwise).
    pub fn next_completion_at(&mut self) -> Result<(Completion, Option<u64>)> {
        if !self.timed {
            return self.next_completion().map(|c| (c, None));
        }
        let (mut out, mut at) = ([Completion::default(); 1], [None; 1]);
        loop {
            if self.pause {
                self.dev.process();
            }
            if self.cq.poll_timed(&mut out, &mut at)? == 1 {
                break;
            }
            std::hint::spin_loop();
        }
        if !out[0].is_ok() {
            eprintln!("bfperf: completion failed: {:?}", out[0]);
            std::process::exit(1);
        }
        Ok((out[0], at[0]))
    }

    /// Reclaims ring space (moderation completions are not reported); any reported
    /// completion here is an error.
    pub fn drain_errors(&mut self) {
        let mut out = [Completion::default(); 8];
        let n = self.cq.poll(&mut out);
        if let Some(c) = out[..n].iter().find(|c| !c.is_ok()) {
            eprintln!("bfperf: completion failed: {c:?}");
            std::process::exit(1);
        }
    }
}

#[cfg(test)]
mod tests {
    /// A peer's exchange (bytes from the network: a corrupt message, or not a bfperf)
    /// offering a buffer that runs past 2^64 is refused: the bandwidth tests add each QP's
    /// slice of it to its address (`bw.rs`, `Traffic::new`: `peer.addr + lane * stride`),
    /// which overflowed with `-q 2` or more (a panic in a debug build, a wrapped address in
    /// a release one). A buffer that ends below 2^64 is taken.
    #[test]
    fn a_peer_buffer_past_2_pow_64_is_refused() {
        use blueflame::connect::{Exchange, RemoteBuf};
        let offer = |addr| Exchange {
            endpoint: blueflame::Endpoint::default(),
            buffers: vec![RemoteBuf {
                addr,
                rkey: 7,
                len: 8192,
            }],
        };
        match super::first_buffer(&offer(u64::MAX - 4095), 8192) {
            Err(blueflame::Error::InvalidParameter { what, value }) => {
                assert!(what.contains("2^64"), "{what}");
                assert_eq!(value, u64::MAX - 4095);
            }
            other => panic!("{other:?}"),
        }
        let last = u64::MAX - 8192;
        assert_eq!(super::first_buffer(&offer(last), 8192).unwrap().addr, last);
    }

    /// `ibv_rc_pingpong`'s exchange carries no size or count: a client (`--rc-pingpong`)
    /// has its defaults from `size_for` / `iters_for`, a server that meets one takes them
    /// where it was not given -s / -n (send-lat's own 2 bytes would take the 4096-byte
    /// messages of an `ibv_rc_pingpong` run without options into 2-byte receives).
    #[test]
    fn an_rc_pingpong_peer_runs_its_defaults_unless_told() {
        use super::Pingpong;
        let resolved = |line: &str| {
            let args: Vec<String> = line.split_whitespace().map(String::from).collect();
            let mut o = crate::opts::parse(&args).unwrap();
            crate::opts::resolve("send-lat", &mut o);
            o
        };
        for (line, client, size, iters) in [
            ("--client h --rc-pingpong", true, 4096, 1000),
            ("--client h --rc-pingpong -s 8 -n 300", true, 8, 300),
            ("--server", false, 4096, 1000),
            ("--server -s 8", false, 8, 1000),
            ("--server -n 300", false, 4096, 300),
            ("--server -s 2 -n 1000", false, 2, 1000),
        ] {
            let o = resolved(line);
            assert_eq!(
                Pingpong::of(&o, o.size),
                Pingpong {
                    client,
                    size,
                    iters
                },
                "{line}"
            );
        }
    }

    #[test]
    fn parameters_that_differ_are_named_with_both_values() {
        let o = crate::opts::Opts::default();
        let ours = super::params("write_lat", &o, 8);
        assert_eq!(super::exchange::compare_params(&ours, &ours), Ok(()));
        let other = crate::opts::Opts {
            iters: 500,
            ..crate::opts::Opts::default()
        };
        let theirs = super::params("send_lat", &other, 8);
        let e = super::exchange::compare_params(&ours, &theirs).unwrap_err();
        assert!(
            e.contains("test: this side write_lat, the peer send_lat"),
            "{e}"
        );
        assert!(e.contains("iters: this side 1000, the peer 500"), "{e}");
        assert!(!e.contains("size"), "{e}");
        let q = crate::opts::Opts {
            qps: 4,
            bidirectional: true,
            ..crate::opts::Opts::default()
        };
        let e =
            super::exchange::compare_params(&ours, &super::params("write_lat", &q, 8)).unwrap_err();
        assert!(e.contains("qp: this side 1, the peer 4"), "{e}");
        assert!(
            e.contains("bidirectional: this side false, the peer true"),
            "{e}"
        );
        // -R on one side only: named, whichever side has it; a field only the peer sends
        // is named too.
        let r = crate::opts::Opts {
            rdma_cm: true,
            ..crate::opts::Opts::default()
        };
        let e =
            super::exchange::compare_params(&ours, &super::params("write_lat", &r, 8)).unwrap_err();
        assert!(e.contains("rdma_cm: this side false, the peer true"), "{e}");
        let e =
            super::exchange::compare_params(&super::params("write_lat", &r, 8), &ours).unwrap_err();
        assert!(e.contains("rdma_cm: this side true, the peer false"), "{e}");
        let e = super::exchange::compare_params(&ours, &format!("{ours} newer=1")).unwrap_err();
        assert!(e.contains("newer: this side (none), the peer 1"), "{e}");
        let e = super::exchange::compare_params(&ours, "BFX1 garbage").unwrap_err();
        assert!(e.contains("not a bfperf"), "{e}");
        // A latency test's -D: the responder must know when to stop.
        let timed = crate::opts::Opts {
            duration: Some(4),
            ..crate::opts::Opts::default()
        };
        let e = super::exchange::compare_params(&ours, &super::params("write_lat", &timed, 8))
            .unwrap_err();
        assert!(
            e.contains("duration: this side none, the peer 4; margin: this side none, the peer 1"),
            "{e}"
        );
        let e = super::exchange::compare_params(&super::params("write_lat", &timed, 8), &ours)
            .unwrap_err();
        assert!(e.contains("duration: this side 4, the peer none"), "{e}");
        // A bandwidth test's server takes no -D.
        let bw = super::params("write_bw", &o, 8);
        assert_eq!(
            super::exchange::compare_params(&bw, &super::params("write_bw", &timed, 8)),
            Ok(())
        );
    }

    /// The two ends of a TCP connection on loopback, as `--server` and `--client` swap:
    /// the same parameters connect, different ones end both sides with an error (before,
    /// a peer running another test left both waiting).
    #[test]
    fn a_mismatch_ends_both_sides_with_an_error_not_a_wait() {
        use blueflame::connect::Exchange;
        let o = crate::opts::Opts::default();
        for (theirs, ok) in [
            (super::params("write_lat", &o, 8), true),
            (super::params("write_lat", &o, 64), false),
        ] {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = l.local_addr().unwrap();
            let ours = super::params("write_lat", &o, 8);
            let client = std::thread::spawn(move || {
                let s = std::net::TcpStream::connect(addr).unwrap();
                super::swap(s, &Exchange::default(), &[], &theirs).map(|_| ())
            });
            let (s, _) = l.accept().unwrap();
            let server = super::swap(s, &Exchange::default(), &[], &ours).map(|_| ());
            let client = client.join().unwrap();
            assert_eq!(
                (server.is_ok(), client.is_ok()),
                (ok, ok),
                "{server:?} {client:?}"
            );
        }
    }

    /// With -q the further QPs' endpoints follow the agreed parameters, in order, each way.
    #[test]
    fn further_qps_endpoints_are_swapped_in_order() {
        use blueflame::connect::Exchange;
        let o = crate::opts::Opts {
            qps: 3,
            ..crate::opts::Opts::default()
        };
        let ep = |qpn| Endpoint {
            qpn,
            ..Endpoint::default()
        };
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let p = super::params("write_bw", &o, 8);
        let p2 = p.clone();
        let client = std::thread::spawn(move || {
            let s = std::net::TcpStream::connect(addr).unwrap();
            super::swap(s, &Exchange::default(), &[ep(21), ep(22)], &p2)
                .map(|(_, more, _)| more.iter().map(|e| e.qpn).collect::<Vec<_>>())
        });
        let (s, _) = l.accept().unwrap();
        let (_, more, _) = super::swap(s, &Exchange::default(), &[ep(11), ep(12)], &p).unwrap();
        assert_eq!(more.iter().map(|e| e.qpn).collect::<Vec<_>>(), [21, 22]);
        assert_eq!(client.join().unwrap().unwrap(), [11, 12]);
    }

    #[test]
    fn the_parameter_line_is_framed_by_its_length() {
        let line = "bfperf-params/1 test=x";
        let mut wire = (line.len() as u16).to_be_bytes().to_vec();
        wire.extend_from_slice(line.as_bytes());
        assert_eq!(super::exchange::read_params(&mut &wire[..]).unwrap(), line);
        // Short: an error, not a wait.
        assert!(super::exchange::read_params(&mut &wire[..5]).is_err());
    }

    use super::*;

    /// `-c dc`: each side posts on a DCI aimed at the other side's DCT (its number and
    /// perftest's key), and a write through it lands in the other side's buffer.
    /// A bfperf client's first bytes are its exchange's magic, of either version (`BFX2`
    /// carries the responder depth, `BFX1` an older bfperf's); a server that knew only
    /// `BFX1` took a `BFX2` client for perftest. perftest's version and ibv_rc_pingpong's
    /// LID are told apart as before.
    #[test]
    fn a_bfperf_client_is_told_by_either_magic() {
        for (first, want) in [
            (&b"BFX2\0"[..], super::Peer::Bfperf),
            (b"BFX1\0", super::Peer::Bfperf),
            (b"6.06\0", super::Peer::Perftest),
            (b"0000:", super::Peer::RcPingpong),
        ] {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = l.local_addr().unwrap();
            let mut c = std::net::TcpStream::connect(addr).unwrap();
            std::io::Write::write_all(&mut c, first).unwrap();
            let (s, _) = l.accept().unwrap();
            assert_eq!(super::classify(&s).unwrap(), want, "{first:?}");
        }
        let ours = blueflame::connect::Exchange::default().encode().unwrap();
        assert_eq!(
            &ours[..4],
            b"BFX2",
            "this side's exchange is the one classify takes"
        );
    }

    #[test]
    fn dc_sides_aim_at_each_others_dct() {
        let o = crate::opts::parse(&["-c".into(), "dc".into()]).expect("opts");
        let dev = Device::sim();
        let Setup::Local(mut a, b) = setup(&o, &dev, "write_lat", 8).expect("setup") else {
            panic!("not a local pair");
        };
        let (Sq::Dc(pa), Sq::Dc(pb)) = (&a.qp, &b.qp) else {
            panic!("not DC");
        };
        assert_eq!(pa.to.dctn(), pb._dct.dctn());
        assert_eq!(pb.to.dctn(), pa._dct.dctn());
        let remote = blueflame::Remote {
            addr: a.peer.addr,
            rkey: a.peer.rkey,
        };
        let req = Request::Write {
            remote,
            data: blueflame::Payload::Inline(b"dc!"),
        };
        a.qp.post(&req, 7, PostFlags::SIGNALED).expect("post");
        assert_eq!(a.next_completion().expect("completion").cookie, 7);
        let mut got = [0u8; 3];
        b.mr.read(0, &mut got).expect("read");
        assert_eq!(&got, b"dc!");
    }

    /// The QPs hold twice `tx-depth` requests of the largest kind the options allow (the
    /// depth `Qp::send_depth` reports on both paths), and a bandwidth test's in-flight
    /// requests fit in the CQ. With 256 blocks (the old size) the default options gave 51.
    #[test]
    fn queues_hold_twice_tx_depth_requests() {
        let o = crate::opts::parse(&[]).expect("defaults");
        let dev = Device::sim();
        let ((qp, cq, _mr, _), _) = side(&dev, &o, 8, 0).expect("side");
        assert!(
            qp.send_depth() as usize >= 2 * o.tx_depth,
            "send depth {} for tx-depth {}",
            qp.send_depth(),
            o.tx_depth
        );
        assert!(cq.capacity() >= caps(&o).sq_blocks + caps(&o).rq_entries);
    }
}
