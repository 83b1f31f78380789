//! rdma_cm connect / accept on the device of the rxe stage (`BLUEFLAME_SERVER_ADDR` is the
//! address of its netdev): a server and a client thread connect through librdmacm, swap
//! buffer descriptors in the private data, then write and send.

use crate::scenarios::device;
use blueflame::*;
use std::time::Duration;

#[test]
#[ignore = "needs an RDMA device: run by the rxe stage of `cargo xtask test`"]
fn connect_accept_write_send() {
    let Ok(ip) = std::env::var("BLUEFLAME_SERVER_ADDR") else {
        return device::skipped("connect_accept_write_send");
    };
    let addr: std::net::SocketAddr = format!("{ip}:7471").parse().unwrap();
    let rights = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let listener = cm::listen(addr).expect("listen");
    let server = std::thread::spawn(move || {
        let req = listener
            .next_request(Duration::from_secs(30))
            .expect("request");
        let client_buf = req.peer().expect("the client offered a buffer");
        let mr = req.pd().alloc_mr(4096, rights).unwrap();
        let mut cq = req.device().create_cq(16).unwrap();
        let mut conn = req
            .accept(&cq, QpCaps::default(), Some(mr.remote_buf()))
            .expect("accept");
        assert_eq!(conn.qp.data_path(), DataPath::Verbs);
        conn.qp.post_recv(&[mr.sge(1024, 64).unwrap()], 5).unwrap();
        let mut out = [Completion::default(); 1];
        assert_eq!(
            cq.poll_n(&mut out, 1, 2_000_000_000),
            1,
            "the client's send"
        );
        assert_eq!(
            (out[0].cookie, out[0].status, out[0].byte_len),
            (5, WcStatus::Success, 5)
        );
        let mut got = [0u8; 8];
        mr.read(0, &mut got).unwrap();
        assert_eq!(&got, b"via cm!!");
        // Write back into the client's buffer.
        conn.qp
            .write_inline(
                b"pong",
                Remote {
                    addr: client_buf.addr,
                    rkey: client_buf.rkey,
                },
                6,
                PostFlags::SIGNALED,
            )
            .unwrap();
        assert_eq!(cq.poll_n(&mut out, 1, 2_000_000_000), 1);
        assert_eq!((out[0].cookie, out[0].status), (6, WcStatus::Success));
        mr.read(1024, &mut got[..5]).unwrap();
        assert_eq!(&got[..5], b"hello");
    });
    std::thread::sleep(Duration::from_millis(200));
    let req = cm::resolve(addr, Duration::from_secs(10)).expect("resolve");
    let mr = req.pd().alloc_mr(4096, rights).unwrap();
    let mut cq = req.device().create_cq(16).unwrap();
    let mut conn = req
        .connect(&cq, QpCaps::default(), Some(mr.remote_buf()))
        .expect("connect");
    let server_buf = conn.peer.expect("the server offered a buffer");
    assert_eq!(server_buf.len, 4096);
    conn.qp
        .write_inline(
            b"via cm!!",
            Remote {
                addr: server_buf.addr,
                rkey: server_buf.rkey,
            },
            1,
            PostFlags::SIGNALED,
        )
        .unwrap();
    conn.qp
        .send(Payload::Inline(b"hello"), 2, PostFlags::SIGNALED)
        .unwrap();
    let mut out = [Completion::default(); 2];
    assert_eq!(cq.poll_n(&mut out, 2, 2_000_000_000), 2);
    assert_eq!(
        (out[0].cookie, out[0].status, out[1].cookie, out[1].status),
        (1, WcStatus::Success, 2, WcStatus::Success)
    );
    server.join().expect("server");
    let mut got = [0u8; 4];
    mr.read(0, &mut got).unwrap();
    assert_eq!(&got, b"pong");
}

/// Two connections on one protection domain and one CQ a side (`CmListener::next_request_on`,
/// `cm::resolve_on`: what a benchmark's `-q 2 -R` needs): the client writes through both
/// QPs into the server's one region, both completions on its one CQ; a domain of a device
/// opened apart from librdmacm is refused, typed.
#[test]
#[ignore = "needs an RDMA device: run by the rxe stage of `cargo xtask test`"]
fn two_connections_share_one_domain_and_cq() {
    let Ok(ip) = std::env::var("BLUEFLAME_SERVER_ADDR") else {
        return device::skipped("two_connections_share_one_domain_and_cq");
    };
    let addr: std::net::SocketAddr = format!("{ip}:7472").parse().unwrap();
    let rights = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
    let patience = Duration::from_secs(30);
    let listener = cm::listen(addr).expect("listen");
    let server = std::thread::spawn(move || {
        let first = listener.next_request(patience).expect("first request");
        let pd = first.pd().clone();
        let mr = pd.alloc_mr(4096, rights).unwrap();
        let cq = first.device().create_cq(16).unwrap();
        let a = first
            .accept(&cq, QpCaps::default(), Some(mr.remote_buf()))
            .expect("accept 1");
        let second = listener
            .next_request_on(&pd, patience)
            .expect("second request");
        let b = second
            .accept(&cq, QpCaps::default(), Some(mr.remote_buf()))
            .expect("accept 2");
        assert_ne!(a.qp.qpn(), b.qp.qpn());
        let deadline = std::time::Instant::now() + patience;
        let mut got = [0u8; 16];
        while &got != b"one-----two-----" {
            assert!(std::time::Instant::now() < deadline, "writes: {got:?}");
            mr.read(0, &mut got).unwrap();
            std::thread::yield_now();
        }
        (a, b)
    });
    std::thread::sleep(Duration::from_millis(200));
    let first = cm::resolve(addr, Duration::from_secs(10)).expect("resolve");
    let pd = first.pd().clone();
    let mr = pd.alloc_mr(4096, rights).unwrap();
    let mut cq = first.device().create_cq(16).unwrap();
    // A domain of a context librdmacm did not open cannot hold a connection's QP.
    let own = Device::open("rxe0", None).expect("rxe0");
    let e = cm::resolve_on(&own.alloc_pd().unwrap(), addr, Duration::from_secs(10)).unwrap_err();
    assert!(matches!(e, Error::InvalidHandle { .. }), "{e}");
    let mut a = first
        .connect(&cq, QpCaps::default(), Some(mr.remote_buf()))
        .expect("connect 1");
    let second = cm::resolve_on(&pd, addr, Duration::from_secs(10)).expect("resolve 2");
    let mut b = second
        .connect(&cq, QpCaps::default(), Some(mr.remote_buf()))
        .expect("connect 2");
    let buf = b.peer.expect("the server offered its buffer");
    assert_eq!(a.peer, Some(buf));
    let at = |off: u64| Remote {
        addr: buf.addr + off,
        rkey: buf.rkey,
    };
    a.qp.write_inline(b"one-----", at(0), 1, PostFlags::SIGNALED)
        .unwrap();
    b.qp.write_inline(b"two-----", at(8), 2, PostFlags::SIGNALED)
        .unwrap();
    let mut out = [Completion::default(); 2];
    assert_eq!(cq.poll_n(&mut out, 2, 2_000_000_000), 2);
    let mut cookies = [out[0].cookie, out[1].cookie];
    cookies.sort_unstable();
    assert_eq!(cookies, [1, 2]);
    assert!(out.iter().all(|c| c.status == WcStatus::Success));
    let _held = server.join().expect("server");
}
