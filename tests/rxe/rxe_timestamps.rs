//! Completion timestamps on a device without a completion clock (rxe in the VM of `cargo
//! xtask test`: `ibv_query_device_ex` reports `completion_timestamp_mask` and
//! `hca_core_clock` 0, and rxe's `ibv_create_cq_ex` refuses the timestamp flags): every way
//! to ask for them is refused typed, never answered with a zero, and the device works on.

use crate::scenarios;

use blueflame::*;
use scenarios::*;

#[test]
#[ignore = "needs an RDMA device: run by the rxe stage of `cargo xtask test`"]
fn timestamps_are_refused_where_the_device_has_no_clock() {
    let Some(dev) = device::under_test() else {
        return device::skipped("timestamps_are_refused_where_the_device_has_no_clock");
    };
    let refused = |e: Error, what: &str| match e {
        Error::Timestamps { why } => println!("rxe refuses {what}: {why}"),
        e => panic!("{what}: {e:?}, not Error::Timestamps"),
    };
    assert!(!dev.clock_caps().present(), "{:?}", dev.clock_caps());
    let e = dev
        .create_cq_with(&CqOptions::new(16).timestamps())
        .expect_err("a timestamping CQ on rxe");
    refused(e, "a timestamping CQ");
    refused(dev.clock().expect_err("rxe's clock"), "Device::clock");
    // A CQ without them works as ever, and refuses a timed poll.
    let mut cq = dev.create_cq(16).expect("cq");
    let e = cq
        .poll_timed(&mut [Completion::default()], &mut [None])
        .expect_err("a timed poll of a plain CQ");
    refused(e, "a timed poll of a plain CQ");
    let pd = dev.alloc_pd().expect("pd");
    let mut qp = pd.create_qp(&cq, &cq, caps()).expect("qp");
    let mut peer = pd.create_qp(&cq, &cq, caps()).expect("peer");
    qp.connect(&peer.endpoint().expect("endpoint"))
        .expect("connect");
    peer.connect(&qp.endpoint().expect("endpoint"))
        .expect("connect the peer");
    let mr = pd
        .alloc_mr(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .expect("mr");
    qp.write_inline(&[5], mr.remote(0).expect("remote"), 3, PostFlags::SIGNALED)
        .expect("write");
    let mut out = [Completion::default(); 2];
    assert_eq!(cq.poll_n(&mut out, 1, 1 << 26), 1);
    assert_eq!((out[0].cookie, out[0].status), (3, WcStatus::Success));
}
