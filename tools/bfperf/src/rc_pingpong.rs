//! rdma-core's example `ibv_rc_pingpong` on the other side of `send-lat` (`--rc-pingpong`
//! on a client; a server tells by the first bytes): its exchange (`pp_client_exch_dest`,
//! `pp_server_exch_dest`: one 52-byte text message each way, `"%04x:%06x:%06x:%s"` of LID,
//! QP number, PSN and the GID as 32 hex digits, `wire_gid_to_gid`'s order; the server
//! connects its QP before it answers, then reads the client's "done") and its traffic, a
//! send ping-pong the client starts, with receives of the message size.

use blueflame::Endpoint;
use std::io::{Read, Write};
use std::net::TcpStream;

/// `sizeof "0000:000000:000000:00000000000000000000000000000000"`.
pub const MSG: usize = 52;

/// The path MTU `ibv_rc_pingpong` programs unless given `-m` (1024 bytes, verbs enum 3):
/// the MTU is not exchanged, so both sides use this.
pub const MTU: u32 = 3;

/// The message of `ep`.
pub fn encode(ep: &Endpoint) -> [u8; MSG] {
    let mut gid = String::new();
    for b in ep.gid {
        gid += &format!("{b:02x}");
    }
    let text = format!("{:04x}:{:06x}:{:06x}:{gid}", ep.lid, ep.qpn, ep.psn);
    let mut m = [0u8; MSG];
    m[..text.len().min(MSG - 1)].copy_from_slice(&text.as_bytes()[..text.len().min(MSG - 1)]);
    m
}

/// The peer's endpoint in its message (`sscanf(msg, "%x:%x:%x:%s")`).
pub fn decode(m: &[u8]) -> Result<Endpoint, String> {
    let text = m.split(|b| *b == 0).next().unwrap_or_default();
    let text = std::str::from_utf8(text).map_err(|_| "an address that is not text")?;
    let f: Vec<&str> = text.split(':').collect();
    let bad = || format!("ibv_rc_pingpong's address {text:?}");
    if f.len() != 4 || f[3].len() != 32 {
        return Err(bad());
    }
    let hex = |s: &str| u32::from_str_radix(s, 16).map_err(|_| bad());
    let mut gid = [0u8; 16];
    for (i, b) in gid.iter_mut().enumerate() {
        *b = u8::from_str_radix(&f[3][2 * i..2 * i + 2], 16).map_err(|_| bad())?;
    }
    Ok(Endpoint {
        lid: hex(f[0])? as u16,
        qpn: hex(f[1])?,
        psn: hex(f[2])?,
        gid,
        mtu: MTU,
        // ibv_rc_pingpong's responder takes one read in flight (`pp_connect_ctx`:
        // `max_dest_rd_atomic = 1`); its address does not say it.
        max_dest_rd_atomic: 1,
    })
}

fn io(what: &'static str) -> impl Fn(std::io::Error) -> String {
    move |e| format!("ibv_rc_pingpong exchange, {what}: {e}")
}

/// The exchange on `s` as the client (`pp_client_exch_dest`: ours, theirs, "done"), or as
/// the server (`pp_server_exch_dest`: theirs, `connect`, ours, their "done").
pub fn exchange(
    s: &mut TcpStream,
    client: bool,
    ours: &Endpoint,
    connect: impl FnOnce(Endpoint) -> Result<(), String>,
) -> Result<(), String> {
    s.set_read_timeout(Some(std::time::Duration::from_secs(60)))
        .map_err(io("timeout"))?;
    let mut theirs = [0u8; MSG];
    if client {
        s.write_all(&encode(ours)).map_err(io("address"))?;
        s.read_exact(&mut theirs).map_err(io("address"))?;
        s.write_all(b"done\0").map_err(io("done"))?;
        connect(decode(&theirs)?)
    } else {
        s.read_exact(&mut theirs).map_err(io("address"))?;
        connect(decode(&theirs)?)?;
        s.write_all(&encode(ours)).map_err(io("address"))?;
        let mut done = [0u8; 5];
        s.read_exact(&mut done).map_err(io("done"))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_as_rc_pingpong_prints_them() {
        let ep = Endpoint {
            lid: 0,
            qpn: 0x11,
            psn: 0xabcdef,
            gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 77, 0, 1],
            mtu: 5,
            max_dest_rd_atomic: 16,
        };
        let m = encode(&ep);
        assert_eq!(
            std::str::from_utf8(&m[..51]).unwrap(),
            "0000:000011:abcdef:00000000000000000000ffff0a4d0001"
        );
        assert_eq!(m[51], 0);
        // Neither the MTU nor the responder depth is on the wire: ibv_rc_pingpong programs
        // 1024 bytes and one read in flight each way (`pp_connect_ctx`).
        let peer = Endpoint {
            mtu: MTU,
            max_dest_rd_atomic: 1,
            ..ep
        };
        assert_eq!(decode(&m).unwrap(), peer);
        assert!(decode(b"0000:000011\0").is_err());
    }

    #[test]
    fn client_and_server_orders() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let ep = |q| Endpoint {
            qpn: q,
            ..Endpoint::default()
        };
        let t = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut got = None;
            exchange(&mut s, false, &ep(2), |e| {
                got = Some(e.qpn);
                Ok(())
            })
            .unwrap();
            got
        });
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let mut got = None;
        exchange(&mut s, true, &ep(1), |e| {
            got = Some(e.qpn);
            Ok(())
        })
        .unwrap();
        assert_eq!((got, t.join().unwrap()), (Some(2), Some(1)));
    }
}
