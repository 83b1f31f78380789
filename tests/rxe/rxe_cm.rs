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
