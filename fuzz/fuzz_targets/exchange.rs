//! The bytes a peer sends before any RDMA: the out-of-band exchange of `connect` (and of
//! bfperf's set-up) and the rdma_cm private data of `cm`.
//!
//! Promised, whatever the bytes: no panic; `Exchange::read_from` either reads one message
//! (which `encode` gives back byte for byte, from the bytes it consumed, and no more, a
//! `BFX1` message as `BFX2` with depth 0, and
//! whose endpoint a QP's `connect` takes or refuses with a typed error) or
//! refuses it with a typed error (`Error::Io` for a short message, `Error::InvalidParameter`
//! for a bad magic or an absurd count), without reading past what a message can hold; over
//! a socket, a truncated message ends the listener's `accept` with an error rather than a
//! wait; the private data decodes to the buffer it encodes, or to none.
#![no_main]

use blueflame::connect::{Exchange, RemoteBuf};
use blueflame::internals::cm_private_data;
use blueflame::Error;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The exchange, read from the bytes.
    let mut r = data;
    match Exchange::read_from(&mut r) {
        Ok(x) => {
            let consumed = &data[..data.len() - r.len()];
            let again = x.encode().expect("what was read encodes");
            // Written as BFX2 (with the responder depth); a BFX1 message is the same but
            // for the magic and the depth (0, not given).
            if consumed.starts_with(b"BFX1") {
                assert_eq!(consumed.len(), 36 + 20 * x.buffers.len());
                assert_eq!(x.endpoint.max_dest_rd_atomic, 0);
                let mut v2 = b"BFX2".to_vec();
                v2.extend_from_slice(&consumed[4..34]);
                v2.push(0);
                v2.extend_from_slice(&consumed[34..]);
                assert_eq!(again, v2, "read (BFX1) and encoded differ");
            } else {
                assert_eq!(again, consumed, "read and encoded differ");
                assert_eq!(consumed.len(), 37 + 20 * x.buffers.len());
            }
            // What a peer says of its QP, given to `connect`: connected or refused with a
            // typed error (the software NIC: another QP of its own, or none).
            let dev = blueflame::Device::sim_stepped();
            let pd = dev.alloc_pd().expect("a PD");
            let cq = dev.create_cq(16).expect("a CQ");
            let mut qp = pd
                .create_qp(&cq, &cq, blueflame::QpCaps::default())
                .expect("a QP");
            match qp.connect(&x.endpoint) {
                Ok(()) | Err(Error::InvalidParameter { .. } | Error::InvalidHandle { .. }) => {}
                Err(Error::Sim(_) | Error::InvalidState { .. } | Error::Unsupported(_)) => {}
                Err(e) => panic!("connect to {:?}: {e:?}", x.endpoint),
            }
        }
        Err(Error::Io(e)) => {
            assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof, "{e}");
        }
        Err(Error::InvalidParameter { what, .. }) => {
            assert!(what.starts_with("exchange"), "{what}");
            // Refused from the header alone.
            assert!(data.len() - r.len() <= 37);
        }
        Err(e) => panic!("an untyped refusal: {e:?}"),
    }
    // The same over a socket when the bytes are short (a peer that sends part of a message
    // and closes): the listener's accept returns, with an error.
    // (Shorter than the shortest whole message, a BFX1 header and its count: 36 bytes.)
    if data.len() < 36 && data.first() == Some(&b'B') {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        let addr = l.local_addr().expect("its address");
        let bytes = data.to_vec();
        let peer = std::thread::spawn(move || {
            use std::io::{Read, Write};
            let mut s = std::net::TcpStream::connect(addr).expect("connect");
            // The listener may refuse the message (its magic) and close before this side
            // shuts its half down (ENOTCONN) or writes it all: what it does then is the
            // listener's, checked below.
            let _ = s.write_all(&bytes);
            let _ = s.shutdown(std::net::Shutdown::Write);
            let mut sink = Vec::new();
            let _ = s.read_to_end(&mut sink);
        });
        let got = blueflame::connect::accept(&l, &Exchange::default());
        // A typed refusal, not a wait: the end of the stream, or a magic that is not
        // the exchange's (read with the endpoint's 34 bytes, so a message of 34 or 35
        // bytes is refused for it): as `read_from` of the bytes, above.
        match &got {
            Err(Error::Io(_)) => {}
            Err(Error::InvalidParameter { what, .. }) if what.starts_with("exchange") => {}
            _ => panic!("a truncated message ({} bytes): {got:?}", data.len()),
        }
        peer.join().expect("the peer");
    }
    // The private data.
    if let Some(b) = cm_private_data::decode(data) {
        let again = cm_private_data::encode(Some(b));
        assert_eq!(again[..], data[..25], "decoded and encoded differ");
    }
    if data.len() >= 20 {
        let b = RemoteBuf {
            addr: u64::from_le_bytes(data[..8].try_into().expect("8")),
            rkey: u32::from_le_bytes(data[8..12].try_into().expect("4")),
            len: u64::from_le_bytes(data[12..20].try_into().expect("8")),
        };
        let mut p = cm_private_data::encode(Some(b));
        // Padded as the InfiniBand CM pads it.
        p.resize(56, data[0]);
        assert_eq!(cm_private_data::decode(&p), Some(b));
    }
    assert_eq!(
        cm_private_data::decode(&cm_private_data::encode(None)),
        None
    );
});
