//! A request to a peer whose QP is in error: the responder drops every packet, the requester
//! retransmits until its retry count runs out, then completes the request with
//! `RetryExcErr` and flushes the rest. With the default timing (timeout 14, retry 7) rxe used
//! to give no completion at all: rxe counts a retry count of 7 as "for ever" (`rxe_comp.c`,
//! `COMPST_ERROR_RETRY`: `if (qp->comp.retry_cnt != 7) qp->comp.retry_cnt--;`), which the
//! InfiniBand specification allows only for the RNR retry count. The crate now programs 6 on
//! rxe for 7; this test shows the completion arrives, through the crate's poller, on rxe and
//! on the software NIC, for the default timing and a short one.

use crate::scenarios;

use blueflame::*;
use scenarios::*;
use std::time::{Duration, Instant};

/// A write and a read from A to B after B was moved to error: the write completes with
/// `RetryExcErr`, the read is flushed. Returns the completions and how long they took.
fn to_a_peer_in_error(dev: &Device, timing: &Timing) -> (Vec<(u64, WcStatus)>, Duration) {
    let mut p = Pair::new(dev, RIGHTS, caps(), timing);
    p.b.set_error().expect("peer to error");
    let t = Instant::now();
    let sge = p.mr_a.sge(0, 64).expect("sge");
    p.a.write(
        &[sge],
        p.mr_b.remote(0).expect("remote"),
        1,
        PostFlags::SIGNALED,
    )
    .expect("write");
    p.a.read(
        &[sge],
        p.mr_b.remote(64).expect("remote"),
        2,
        PostFlags::SIGNALED,
    )
    .expect("read");
    let mut out = [Completion::default(); 2];
    let mut got = 0;
    while got < 2 && t.elapsed() < Duration::from_secs(60) {
        p.dev.process();
        got += p.cq_a.poll(&mut out[got..]);
    }
    let c = out[..got].iter().map(|c| (c.cookie, c.status)).collect();
    (c, t.elapsed())
}

fn check(dev: &Device) {
    let short = Timing {
        timeout: 12,
        retry_cnt: 3,
        ..Timing::default()
    };
    for (name, timing) in [
        ("default timing (timeout 14, retry 7)", Timing::default()),
        ("timeout 12, retry 3", short),
    ] {
        let (c, took) = to_a_peer_in_error(dev, &timing);
        println!("{}: {name}: {c:?} after {:.2} s", dev, took.as_secs_f64());
        assert_eq!(
            c,
            vec![(1, WcStatus::RetryExcErr), (2, WcStatus::WrFlushErr)],
            "{name}: completions within 60 s"
        );
    }
}

#[test]
#[cfg(feature = "sim")]
fn retry_exceeded_on_the_software_nic() {
    check(&Device::sim_stepped());
}

#[test]
#[ignore = "needs an RDMA device: run by the rxe stage of `cargo xtask test`"]
fn retry_exceeded_on_the_device() {
    let Some(dev) = device::under_test() else {
        return device::skipped("retry_exceeded_on_the_device");
    };
    check(&dev);
}
