//! CQ accounting and queue depths on a real verbs device (rxe) and on the software NIC:
//! the same program sees the same depth, a post that could overrun the CQ is refused with
//! `CqFull` before `ibv_post_send`, polling gives the entries back, and reading the
//! device's asynchronous events (a non-blocking `ibv_get_async_event`) finds none.

use crate::scenarios;

use blueflame::*;
use scenarios::*;
use std::time::{Duration, Instant};

fn check(dev: &Device) {
    let pd = dev.alloc_pd().expect("pd");
    let mut cq_a = dev.create_cq(8).expect("cq a");
    let cq_b = dev.create_cq(64).expect("cq b");
    let caps = caps();
    let mut a = pd.create_qp(&cq_a, &cq_a, caps).expect("qp a");
    let mut b = pd.create_qp(&cq_b, &cq_b, caps).expect("qp b");
    // 64 blocks; the largest request of these limits (64 inline bytes) takes 2 blocks,
    // a bind 3: 21 requests of the largest kind on both paths (rxe may round up).
    assert_eq!(
        mlx5::wqe::max_wqe_bbs(&mlx5::wqe::Limits {
            max_sge: caps.max_send_sge as usize,
            max_inline: caps.max_inline as usize,
        }),
        3
    );
    let depth = a.send_depth();
    assert!(depth >= 21, "{}: send depth {depth}", dev);
    let (ea, eb) = (a.endpoint().expect("ep a"), b.endpoint().expect("ep b"));
    a.connect_with(&eb, &Timing::default()).expect("connect a");
    b.connect_with(&ea, &Timing::default()).expect("connect b");
    let mr = pd.alloc_mr(4096, RIGHTS).expect("mr");
    let entries = cq_a.guaranteed();
    assert!(entries >= 8 && entries < depth, "{}: CQ {entries}", dev);
    let mut accepted = 0u64;
    let e = loop {
        let remote = mr.remote(accepted as usize % 4096).expect("remote");
        match a.write_inline(&[1], remote, accepted, PostFlags::SIGNALED) {
            Ok(()) => accepted += 1,
            Err(e) => break e,
        }
        assert!(accepted <= depth as u64, "{}: never refused", dev);
    };
    println!(
        "{}: send depth {depth}, CQ of {entries}: {accepted} posts, then {e}",
        dev
    );
    assert_eq!(accepted, entries as u64);
    assert!(
        matches!(e, Error::CqFull { cqn, needed: 1, available: 0, capacity }
            if capacity == entries && cqn == cq_a.cqn()),
        "{e}"
    );
    assert!(a.check().is_ok() && cq_a.check().is_ok());
    // Poll everything; the entries come back and the rest goes through.
    let mut out = vec![Completion::default(); 64];
    let mut got = 0;
    let start = Instant::now();
    while got < accepted as usize {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "{got} completions"
        );
        dev.process();
        got += cq_a.poll(&mut out[got..]);
    }
    assert!(out[..got].iter().all(|c| c.is_ok()));
    for i in 0..entries as u64 {
        let remote = mr.remote(i as usize).expect("remote");
        a.write_inline(&[2], remote, 1000 + i, PostFlags::SIGNALED)
            .expect("after polling");
    }
    let mut got = 0;
    while got < entries as usize {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "{got} completions"
        );
        dev.process();
        got += cq_a.poll(&mut out[got..]);
    }
    assert!(out[..got].iter().all(|c| c.is_ok() && c.cookie >= 1000));
}

/// A CQ of 8 under a queue of 85 requests, every request unsignaled: a `CqFull` refusal
/// always has a completion on its way (the crate signals the last request its CQ allowance
/// takes), so polling lets the stream go on. Before: with the forced signal every half
/// queue only, a post was refused with all the CQ's entries held by unsignaled requests,
/// for ever.
fn check_unsignaled(dev: &Device) {
    let pd = dev.alloc_pd().expect("pd");
    let mut cq_a = dev.create_cq(8).expect("cq a");
    let cq_b = dev.create_cq(64).expect("cq b");
    // 256 blocks: 85 requests on the verbs path, whose forced signal every half queue (42)
    // comes after more than the CQ holds (rxe makes a CQ of 8 one of 15).
    let caps = QpCaps {
        sq_blocks: 256,
        ..caps()
    };
    let mut a = pd.create_qp(&cq_a, &cq_a, caps).expect("qp a");
    let mut b = pd.create_qp(&cq_b, &cq_b, caps).expect("qp b");
    let (ea, eb) = (a.endpoint().expect("ep a"), b.endpoint().expect("ep b"));
    a.connect_with(&eb, &Timing::default()).expect("connect a");
    b.connect_with(&ea, &Timing::default()).expect("connect b");
    let mr = pd.alloc_mr(4096, RIGHTS).expect("mr");
    let mut out = vec![Completion::default(); 16];
    let (mut i, mut refusals) = (0usize, 0u32);
    let mut stuck_since: Option<Instant> = None;
    while i < 200 {
        let remote = mr.remote(i).expect("remote");
        match a.write_inline(&[1], remote, i as u64, PostFlags::UNSIGNALED) {
            Ok(()) => {
                i += 1;
                stuck_since = None;
            }
            Err(Error::CqFull { .. }) => {
                refusals += 1;
                let t = *stuck_since.get_or_insert_with(Instant::now);
                assert!(
                    t.elapsed() < Duration::from_secs(10),
                    "{}: stuck at post {i}: nothing signaled in flight",
                    dev
                );
                dev.process();
                // Forced signals retire the requests before them; none is reported.
                assert_eq!(cq_a.poll(&mut out), 0);
            }
            Err(e) => panic!("{}: post {i}: {e}", dev),
        }
    }
    println!(
        "{}: 200 unsignaled writes on a CQ of 8: {refusals} CqFull refusals, each cleared by polling",
        dev
    );
    assert!(refusals > 0);
    // One signaled request: its completion is the only one reported.
    let start = Instant::now();
    loop {
        match a.write_inline(
            &[2],
            mr.remote(200).expect("remote"),
            999,
            PostFlags::SIGNALED,
        ) {
            Ok(()) => break,
            Err(Error::CqFull { .. }) => {
                assert!(
                    start.elapsed() < Duration::from_secs(10),
                    "signaled post refused"
                );
                dev.process();
                assert_eq!(cq_a.poll(&mut out), 0);
            }
            Err(e) => panic!("{e}"),
        }
    }
    let mut got = 0;
    while got == 0 {
        assert!(start.elapsed() < Duration::from_secs(20), "no completion");
        dev.process();
        got = cq_a.poll(&mut out);
    }
    assert_eq!(got, 1);
    assert!(out[0].is_ok() && out[0].cookie == 999, "{:?}", out[0]);
    let mut data = Pair::bytes(&mr, 0, 201);
    assert_eq!(data.pop(), Some(2));
    assert_eq!(data, vec![1; 200]);
}

#[test]
#[cfg(feature = "sim")]
fn unsignaled_stream_on_a_small_cq_on_the_software_nic() {
    check_unsignaled(&Device::sim_stepped());
}

#[test]
#[ignore = "needs an RDMA device: run by the rxe stage of `cargo xtask test`"]
fn unsignaled_stream_on_a_small_cq_on_the_device() {
    let Some(dev) = device::under_test() else {
        return device::skipped("unsignaled_stream_on_a_small_cq_on_the_device");
    };
    check_unsignaled(&dev);
}

#[test]
#[cfg(feature = "sim")]
fn cq_accounting_on_the_software_nic() {
    check(&Device::sim_stepped());
}

#[test]
#[ignore = "needs an RDMA device: run by the rxe stage of `cargo xtask test`"]
fn cq_accounting_on_the_device() {
    let Some(dev) = device::under_test() else {
        return device::skipped("cq_accounting_on_the_device");
    };
    check(&dev);
}
