//! Device tests (rxe in the VM of `cargo xtask test`): every operation and error path
//! through the verbs data path of a real rdma-core device. Ignored on the host; the rxe stage
//! runs them with `--ignored` and `BLUEFLAME_DEVICE=rxe0`.

use crate::scenarios;

use blueflame::connect::{self, Exchange, RemoteBuf};
use blueflame::*;
use scenarios::*;

#[test]
#[ignore = "needs an RDMA device: run by the rxe stage of `cargo xtask test`"]
fn every_scenario_on_the_device() {
    let Some(dev) = device::under_test() else {
        return device::skipped("every_scenario_on_the_device");
    };
    assert_eq!(
        dev.data_path(),
        DataPath::Verbs,
        "rxe runs the verbs path: {}",
        dev
    );
    println!("device: {}", dev);
    let mut all = run_all(&dev);
    for line in normalize_rxe(&dev, &mut all) {
        println!("documented rxe deviation: {line}");
    }
    check(&all);
}

#[test]
#[ignore = "needs an RDMA device: run by the rxe stage of `cargo xtask test`"]
fn out_of_band_exchange_over_tcp() {
    let Some(dev) = device::under_test() else {
        return device::skipped("out_of_band_exchange_over_tcp");
    };
    let pd = dev.alloc_pd().unwrap();
    let mut cq_s = dev.create_cq(16).unwrap();
    let cq_c = dev.create_cq(16).unwrap();
    let caps = scenarios::caps();
    let mut server = pd.create_qp(&cq_s, &cq_s, caps).unwrap();
    let mut client = pd.create_qp(&cq_c, &cq_c, caps).unwrap();
    let mr = pd.alloc_mr(4096, RIGHTS).unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let offer = Exchange {
        endpoint: server.endpoint().unwrap(),
        buffers: vec![RemoteBuf {
            addr: mr.addr(),
            rkey: mr.rkey(),
            len: 4096,
        }],
    };
    let client_ep = client.endpoint().unwrap();
    let t = std::thread::spawn(move || {
        connect::dial(
            addr,
            &Exchange {
                endpoint: client_ep,
                buffers: vec![],
            },
        )
        .unwrap()
    });
    let from_client = connect::accept(&listener, &offer).unwrap();
    let from_server = t.join().unwrap();
    assert_eq!(from_server, offer);
    server.connect(&from_client.endpoint).unwrap();
    client.connect(&from_server.endpoint).unwrap();
    let buf = from_server.buffers[0];
    client
        .write_inline(
            b"over tcp",
            Remote {
                addr: buf.addr + 8,
                rkey: buf.rkey,
            },
            1,
            PostFlags::SIGNALED,
        )
        .unwrap();
    let mut cq_c = cq_c;
    let mut out = [Completion::default(); 1];
    assert_eq!(cq_c.poll_n(&mut out, 1, 50_000_000), 1);
    assert_eq!((out[0].cookie, out[0].status), (1, WcStatus::Success));
    let mut got = [0u8; 8];
    mr.read(8, &mut got).unwrap();
    assert_eq!(&got, b"over tcp");
    assert_eq!(cq_s.poll(&mut out), 0);
}

#[test]
#[ignore = "needs an RDMA device: run by the rxe stage of `cargo xtask test`"]
fn inline_and_gather_sizes() {
    let Some(dev) = device::under_test() else {
        return device::skipped("inline_and_gather_sizes");
    };
    let mut p = Pair::new(&dev, RIGHTS, scenarios::caps(), &Timing::default());
    let mut cookie = 0;
    for len in [1usize, 12, 28, 44, 60, 64] {
        let data: Vec<u8> = (0..len).map(|i| (i * 7 + len) as u8).collect();
        cookie += 1;
        p.a.write_inline(
            &data,
            p.mr_b.remote(1000).unwrap(),
            cookie,
            PostFlags::SIGNALED,
        )
        .unwrap();
        assert_eq!(p.wait(false, 1)[0].1, WcStatus::Success, "inline {len}");
        assert_eq!(Pair::bytes(&p.mr_b, 1000, len), data, "inline {len}");
    }
    let too_long = vec![0u8; 65];
    assert!(matches!(
        p.a.write_inline(&too_long, p.mr_b.remote(0).unwrap(), 0, PostFlags::SIGNALED),
        Err(Error::InlineTooLong { len: 65, max: 64 })
    ));
    let sgl: Vec<Sge> = (0..4).map(|i| p.mr_a.sge(i * 100, 50).unwrap()).collect();
    p.a.write(&sgl, p.mr_b.remote(2000).unwrap(), 77, PostFlags::SIGNALED)
        .unwrap();
    assert_eq!(
        p.wait(false, 1)[0],
        (77, WcStatus::Success, WcOpcode::RdmaWrite, 0, None)
    );
    let five: Vec<Sge> = (0..5).map(|i| p.mr_a.sge(i * 10, 10).unwrap()).collect();
    assert!(matches!(
        p.a.write(&five, p.mr_b.remote(0).unwrap(), 0, PostFlags::SIGNALED),
        Err(Error::TooManySge { n: 5, max: 4 })
    ));
}

/// Writes and sends whose entries add up to more than 2^31 bytes (each entry under 2^31),
/// or to one byte past the port's `max_msg_sz`, are refused before `ibv_post_send` with the
/// sum in the error, as on the direct path (rxe checks the sum against its port's
/// `max_msg_sz` in the kernel and fails the request; a ConnectX completes it with a local
/// length error and moves the QP to error). The QP goes on working.
#[test]
#[ignore = "needs an RDMA device: run by the rxe stage of `cargo xtask test`"]
fn gathers_past_2_pow_31_are_refused_before_posting_on_the_verbs_path() {
    let Some(dev) = device::under_test() else {
        return device::skipped(
            "gathers_past_2_pow_31_are_refused_before_posting_on_the_verbs_path",
        );
    };
    let mut p = Pair::new(&dev, RIGHTS, scenarios::caps(), &Timing::default());
    let big = Sge {
        len: (1 << 31) - 1,
        ..p.mr_a.sge(0, 8).unwrap()
    };
    let remote = p.mr_b.remote(0).unwrap();
    let flags = PostFlags::SIGNALED;
    // And one byte past the port's largest (rxe's `max_msg_sz` is 2^23).
    let most = Sge {
        len: dev.max_message(),
        ..big
    };
    for sgl in [
        vec![big, Sge { len: 2, ..big }],
        vec![big, big],
        vec![most, Sge { len: 1, ..big }],
    ] {
        let total: u64 = sgl.iter().map(|s| s.len as u64).sum();
        let data = Payload::Sgl(&sgl);
        let mut refused = vec![
            p.a.write(&sgl, remote, 1, flags),
            p.a.write_imm(data, remote, 7, 2, flags),
            p.a.send(data, 3, flags),
            p.a.post(&Request::SendImm { data, imm: 7 }, 4, flags),
        ];
        let mut batch = p.a.batch();
        refused.push(batch.push(&Request::Write { remote, data }, 5, flags));
        batch.ring().unwrap();
        for (i, r) in refused.into_iter().enumerate() {
            assert!(
                matches!(r, Err(Error::InvalidParameter { value, .. }) if value == total),
                "entry {i}: {r:?}"
            );
        }
    }
    assert!(p.nothing_more(), "nothing posted");
    p.a.write_inline(b"alive", remote, 6, flags).unwrap();
    assert_eq!(p.wait(false, 1)[0].1, WcStatus::Success);
}

/// Atomics on the verbs path of a real device: rxe reports `atomic_cap` (host-order replies,
/// read back through `Qp::atomic_result`); a local entry that is not 8 bytes is refused
/// before `ibv_post_send` (it used to be posted with its length forced to 8); a type-1
/// window is never zero-based.
#[test]
#[ignore = "needs an RDMA device: run by the rxe stage of `cargo xtask test`"]
fn atomics_and_window_rules_on_the_verbs_path() {
    let Some(dev) = device::under_test() else {
        return device::skipped("atomics_and_window_rules_on_the_verbs_path");
    };
    let caps = dev.atomic_caps();
    println!("device atomics: {caps:?}");
    assert!(caps.standard && !caps.masked && !caps.reply8_be, "{caps:?}");
    let mut p = Pair::new(
        &dev,
        Access(RIGHTS.0 | Access::MW_BIND.0),
        scenarios::caps(),
        &Timing::default(),
    );
    p.mr_b.write(0, &41u64.to_ne_bytes()).unwrap();
    let short = Sge {
        len: 4,
        ..p.mr_a.sge(0, 8).unwrap()
    };
    assert!(matches!(
        p.a.fetch_add(p.mr_b.remote(0).unwrap(), 1, short, 1, PostFlags::SIGNALED),
        Err(Error::AtomicLength { len: 4, size: 8 })
    ));
    p.a.fetch_add(
        p.mr_b.remote(0).unwrap(),
        1,
        p.mr_a.sge(0, 8).unwrap(),
        2,
        PostFlags::SIGNALED,
    )
    .unwrap();
    assert_eq!(p.wait(false, 1)[0].1, WcStatus::Success);
    let reply = Pair::bytes(&p.mr_a, 0, 8);
    assert_eq!(p.a.atomic_result(&reply).unwrap(), 41);
    assert_eq!(p.mr_b.read_u64(0).unwrap(), 42);
    let mut w1 = p.b.pd().alloc_mw(MwType::One).unwrap();
    let r = p.b.bind_mw(
        &mut w1,
        &p.mr_b,
        0,
        64,
        Access::REMOTE_READ | Access::ZERO_BASED,
        3,
        PostFlags::SIGNALED,
    );
    assert!(matches!(r, Err(Error::InvalidParameter { .. })), "{r:?}");
}
