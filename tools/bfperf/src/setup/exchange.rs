//! The out-of-band exchange with a bfperf on another host: the connection (dialled or
//! accepted), the QPs' endpoints and buffers, the test parameters both sides must agree
//! on, and the end-of-test handshake.

use crate::opts::Opts;
use blueflame::connect::{Exchange, RemoteBuf};
use blueflame::{Endpoint, Result};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};

/// Sends ours and reads the peer's exchange on `s`, then the two sides' test parameters
/// ([`params`]), which must agree, then the endpoints of the further QPs (`more`, `-q`),
/// as many each way as the agreed parameters say. A peer that sends part of a message and then nothing is
/// an error after a minute (as `blueflame::connect`'s), not a wait for ever; the test
/// itself may then take as long as it takes (no timeout on `s` after).
pub(super) fn swap(
    mut s: TcpStream,
    ours: &Exchange,
    more: &[Endpoint],
    params: &str,
) -> Result<(Exchange, Vec<Endpoint>, TcpStream)> {
    let io = blueflame::Error::Io;
    s.set_read_timeout(Some(std::time::Duration::from_secs(60)))
        .map_err(io)?;
    s.write_all(&ours.encode()?).map_err(io)?;
    let theirs = Exchange::read_from(&mut s)?;
    let line = params.as_bytes();
    s.write_all(&(line.len() as u16).to_be_bytes())
        .map_err(io)?;
    s.write_all(line).map_err(io)?;
    let peer = read_params(&mut s)?;
    if let Err(e) = compare_params(params, &peer) {
        eprintln!("bfperf: {e}");
        return Err(blueflame::Error::InvalidParameter {
            what: "the two sides run different tests (said above): give both the same options",
            value: 0,
        });
    }
    let mut theirs_more = Vec::with_capacity(more.len());
    for e in more {
        let x = Exchange {
            endpoint: *e,
            buffers: Vec::new(),
        };
        s.write_all(&x.encode()?).map_err(io)?;
        theirs_more.push(Exchange::read_from(&mut s)?.endpoint);
    }
    s.set_read_timeout(None).map_err(io)?;
    Ok((theirs, theirs_more, s))
}

/// The version tag of the parameter line.
const PARAMS_TAG: &str = "bfperf-params/1";

/// What both sides of a test across two processes must agree on, as one line: the test,
/// the message size, the iterations and warm-up, the batch and depth of the bandwidth tests,
/// the transport and where receives go, the QPs per side (`-q`) and whether both sides send
/// (`-b`), whether the QPs are connected through rdma_cm (`-R`), and a latency test's
/// duration and margin (`-D`, `-f`). A difference would leave one side waiting for messages
/// the other never sends; perftest reports such mismatches too.
pub fn params(test: &str, o: &Opts, size: usize) -> String {
    let mut line = format!(
        "{PARAMS_TAG} test={test} size={size} iters={} warmup={} post_list={} tx_depth={} connection={} srq={} qp={} bidirectional={} rdma_cm={}",
        o.iters,
        o.warmup,
        o.post_list,
        o.tx_depth,
        o.connection.name(),
        o.srq,
        o.qps,
        o.bidirectional,
        o.rdma_cm
    );
    if test.ends_with("_lat") {
        // A latency test's responder echoes for -D seconds, or --iters messages: both sides
        // must time it the same (a bandwidth test's server waits for the end either way).
        line += &match (crate::opts::duration(o), crate::opts::margin(o)) {
            (Some(d), Some(m)) => format!(" duration={d} margin={m}"),
            _ => " duration=none margin=none".to_string(),
        };
    }
    line
}

/// Reads the peer's parameter line (a 16-bit big-endian length, then the text).
pub(super) fn read_params(r: &mut impl Read) -> Result<String> {
    let mut n = [0u8; 2];
    r.read_exact(&mut n).map_err(blueflame::Error::Io)?;
    let mut b = vec![0u8; u16::from_be_bytes(n) as usize];
    r.read_exact(&mut b).map_err(blueflame::Error::Io)?;
    Ok(String::from_utf8_lossy(&b).into_owned())
}

/// Whether the peer's parameters (`theirs`) are ours; else what differs, field by field.
///
/// # Errors
/// A message naming each field that differs with both values, or saying the peer is not
/// a bfperf that speaks this exchange.
pub fn compare_params(ours: &str, theirs: &str) -> std::result::Result<(), String> {
    let fields = |l: &str| -> Vec<(String, String)> {
        l.split(' ')
            .skip(1)
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    if theirs.split(' ').next() != Some(PARAMS_TAG) {
        return Err(format!(
            "the peer is not a bfperf that speaks {PARAMS_TAG} (it sent {:?})",
            theirs.chars().take(40).collect::<String>()
        ));
    }
    let (a, b) = (fields(ours), fields(theirs));
    let of = |l: &[(String, String)], k: &str| {
        l.iter()
            .find(|(k2, _)| k2 == k)
            .map_or("(none)".to_string(), |(_, v)| v.clone())
    };
    // Our fields, then any only the peer has (a newer peer's option this side lacks).
    let keys = a.iter().map(|(k, _)| k).chain(
        b.iter()
            .map(|(k, _)| k)
            .filter(|k| !a.iter().any(|(k2, _)| k2 == *k)),
    );
    let diff: Vec<String> = keys
        .filter_map(|k| {
            let (v, w) = (of(&a, k), of(&b, k));
            (v != w).then(|| format!("{k}: this side {v}, the peer {w}"))
        })
        .collect();
    if diff.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "the peer runs another test: {} (both sides need the same options)",
            diff.join("; ")
        ))
    }
}

/// The connection to the other bfperf: accepted on `--port` (`--server`), or dialed.
pub(super) fn dial_or_accept(o: &Opts) -> Result<TcpStream> {
    if o.server {
        let l = TcpListener::bind(("0.0.0.0", o.port)).map_err(blueflame::Error::Io)?;
        let (s, _) = l.accept().map_err(blueflame::Error::Io)?;
        Ok(s)
    } else {
        dial_stream(o.client.as_deref().unwrap_or("localhost"), o.port)
    }
}

/// The peer's buffer in its exchange, which must be as long as ours (`len`): both sides
/// size their buffer from the message size, so another length is a peer running another
/// size (other -s, or -a on one side only), said rather than hung.
pub(super) fn first_buffer(theirs: &Exchange, len: usize) -> Result<RemoteBuf> {
    let peer = *theirs
        .buffers
        .first()
        .ok_or(blueflame::Error::InvalidParameter {
            what: "peer buffers",
            value: 0,
        })?;
    if peer.len != len as u64 {
        return Err(blueflame::Error::InvalidParameter {
            what: "the peer's buffer length: it runs another message size (-s / -a must match)",
            value: peer.len,
        });
    }
    in_address_space(peer)
}

/// `b`, a buffer a peer offered, when it ends below 2^64: the tests address each QP's
/// slice of it (`peer.addr + lane * stride`), as no registration a device takes can wrap.
///
/// # Errors
/// [`blueflame::Error::InvalidParameter`] naming the buffer's address.
pub(super) fn in_address_space(b: RemoteBuf) -> Result<RemoteBuf> {
    match b.addr.checked_add(b.len) {
        Some(_) => Ok(b),
        None => Err(blueflame::Error::InvalidParameter {
            what: "the peer's buffer: address + length past 2^64",
            value: b.addr,
        }),
    }
}

pub(super) fn dial_stream(host: &str, port: u16) -> Result<TcpStream> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        match TcpStream::connect((host, port)) {
            Ok(s) => return Ok(s),
            Err(_) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(100))
            }
            Err(e) => return Err(blueflame::Error::Io(e)),
        }
    }
}

/// Tells the other process the test is over / waits for it.
pub fn sync(s: &mut TcpStream) -> Result<()> {
    s.write_all(&[1]).map_err(blueflame::Error::Io)?;
    let mut b = [0u8; 1];
    s.read_exact(&mut b).map_err(blueflame::Error::Io)
}
