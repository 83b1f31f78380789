//! The device's asynchronous events become errors of the QPs and CQs they concern, read on
//! the cold paths a stalled queue reaches (a refused post, `check`), never a silent stall.
//! The software NIC raises them as a ConnectX does (CQ error on an overrun, QP fatal for the
//! QP whose completion did not fit, QP access error for a responder that refused a request).

use crate::common;

use blueflame::*;
use common::*;
use mlx5::sim::QpState;

#[test]
fn a_cq_in_error_stops_posts_within_its_entries_and_check_says_why() {
    // Before: the QP went to error, its completions vanished, posts were accepted for ever.
    let dev = Device::sim_stepped();
    let pd = dev.alloc_pd().unwrap();
    let mut cq = dev.create_cq(8).unwrap();
    let cqn = cq.cqn();
    let mut qp = pd.create_qp(&cq, &cq, QpCaps::default()).unwrap();
    let q = qp.endpoint().unwrap();
    qp.connect(&q).unwrap();
    let mr = pd.alloc_mr(4096, common::ALL).unwrap();
    qp.write_inline(&[1], mr.remote(0).unwrap(), 0, PostFlags::SIGNALED)
        .unwrap();
    dev.process();
    let mut out = [Completion::default(); 16];
    assert_eq!(cq.poll(&mut out), 1);
    assert!(cq.check().is_ok() && qp.check().is_ok());
    // The CQ fails (an overrun by another driver, a ring the device cannot write).
    nic(&dev).fail_cq(cqn).unwrap();
    let mut posted = 0u64;
    let e = loop {
        match qp.write_inline(&[1], mr.remote(0).unwrap(), posted, PostFlags::SIGNALED) {
            Ok(()) => posted += 1,
            Err(e) => break e,
        }
        dev.process();
        assert!(posted <= 8, "posts accepted for ever");
    };
    assert!(
        matches!(e, Error::AsyncEvent(AsyncEvent::CqError { cqn: c }) if c == cqn),
        "{e}"
    );
    // Nothing arrives, and the CQ and the QP say why.
    assert_eq!(cq.poll(&mut out), 0);
    assert!(matches!(
        cq.check(),
        Err(Error::AsyncEvent(AsyncEvent::CqError { .. }))
    ));
    assert!(matches!(
        qp.check(),
        Err(Error::AsyncEvent(AsyncEvent::CqError { .. }))
    ));
    // The QP whose completion did not fit went to error, with its own event.
    assert_eq!(nic(&dev).qp_state(q.qpn), Some(QpState::Error));
}

#[test]
fn a_responder_that_refuses_a_request_raises_an_access_error() {
    let dev = Device::sim_stepped();
    let pd = dev.alloc_pd().unwrap();
    let mut cq = dev.create_cq(64).unwrap();
    let mut a = pd.create_qp(&cq, &cq, QpCaps::default()).unwrap();
    let mut b = pd.create_qp(&cq, &cq, QpCaps::default()).unwrap();
    a.connect(&b.endpoint().unwrap()).unwrap();
    b.connect(&a.endpoint().unwrap()).unwrap();
    let mr = pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap(); // no remote write
    a.write_inline(&[1], mr.remote(0).unwrap(), 7, PostFlags::SIGNALED)
        .unwrap();
    dev.process();
    let mut out = [Completion::default(); 4];
    assert_eq!(cq.poll(&mut out), 1);
    assert_eq!(out[0].status, WcStatus::RemAccessErr);
    // The requester learns it from its completion; the responder, which has none, from
    // the event.
    assert!(matches!(
        b.check(),
        Err(Error::AsyncEvent(AsyncEvent::QpAccessError { qpn })) if qpn == b.qpn()
    ));
    assert!(a.check().is_ok());
    // The CQ knows both QPs: it reports the responder's event.
    assert!(matches!(
        cq.check(),
        Err(Error::AsyncEvent(AsyncEvent::QpAccessError { .. }))
    ));
}

#[test]
fn a_failed_device_is_reported_to_every_qp_and_cq() {
    let dev = Device::sim_stepped();
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(64).unwrap();
    let qp = pd.create_qp(&cq, &cq, QpCaps::default()).unwrap();
    nic(&dev).raise_event(mlx5::sim::AsyncEvent::DeviceFatal);
    assert!(matches!(
        qp.check(),
        Err(Error::AsyncEvent(AsyncEvent::DeviceFatal))
    ));
    assert!(matches!(
        cq.check(),
        Err(Error::AsyncEvent(AsyncEvent::DeviceFatal))
    ));
}

/// An asynchronous event of a CQ or QP dropped before anyone read it is not reported for
/// the next CQ or QP that gets its number: it goes with its object, as the kernel's
/// destroy drops it (`ib_uverbs_release_uevent`), and the crate forgets what it read of an
/// object only once the object is destroyed (a review's finding: the next CQ and QP were
/// blamed with `CqError` and `QpAccessError`).
#[test]
fn a_dropped_objects_unread_event_is_not_the_next_ones() {
    // A CQ in error, dropped unread; the next CQ gets its number.
    let lim = mlx5::sim::Limits {
        keys: 0xff_ffff,
        qps: 64,
        cqs: 1,
    };
    let dev = Device::sim_with(lim, UarConfig::default(), false);
    let a = dev.create_cq(16).unwrap();
    let cqn = a.cqn();
    nic(&dev).fail_cq(cqn).unwrap();
    drop(a);
    let b = dev.create_cq(16).unwrap();
    assert_eq!(b.cqn(), cqn, "the number came back");
    assert!(b.check().is_ok(), "the new CQ blamed: {:?}", b.check());
    // A QP whose write the responder (itself) refused: QP_ACCESS_ERR, dropped unread.
    let lim = mlx5::sim::Limits {
        keys: 0xff_ffff,
        qps: 1,
        cqs: 64,
    };
    let dev = Device::sim_with(lim, UarConfig::default(), false);
    let pd = dev.alloc_pd().unwrap();
    let mut cq = dev.create_cq(64).unwrap();
    let mut a = pd.create_qp(&cq, &cq, QpCaps::default()).unwrap();
    let qpn = a.qpn();
    a.connect(&a.endpoint().unwrap()).unwrap();
    let mr = pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    a.write_inline(&[1], mr.remote(0).unwrap(), 7, PostFlags::SIGNALED)
        .unwrap();
    dev.process();
    let mut out = [Completion::default(); 4];
    assert_eq!(cq.poll(&mut out), 1);
    assert_eq!(out[0].status, WcStatus::RemAccessErr);
    drop(a);
    let b = pd.create_qp(&cq, &cq, QpCaps::default()).unwrap();
    assert_eq!(b.qpn(), qpn, "the number came back");
    assert!(b.check().is_ok(), "the new QP blamed: {:?}", b.check());
    assert!(cq.check().is_ok(), "the CQ blamed: {:?}", cq.check());
}

/// An SRQ that fails (`IBV_EVENT_SRQ_ERR`) is reported by its own check, by a refused post
/// and by the check of every QP that takes its receives from it, never by another QP's or
/// SRQ's; its limit query does not consume it. (Before, the event was dropped:
/// the receives of such an SRQ stopped completing with nothing to say why.)
#[test]
fn a_failed_srq_is_reported_to_it_and_its_qps() {
    let dev = Device::sim_stepped();
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(64).unwrap();
    let caps = SrqCaps {
        entries: 4,
        max_sge: 1,
    };
    let mut srq = pd.create_srq(&cq, caps).unwrap();
    let on_srq = pd.create_qp_with_srq(&cq, &srq, QpCaps::default()).unwrap();
    let own = pd.create_qp(&cq, &cq, QpCaps::default()).unwrap();
    let srqn = srq.srqn();
    nic(&dev).raise_event(mlx5::sim::AsyncEvent::SrqError { srqn });
    let failed: Result<()> = Err(Error::AsyncEvent(AsyncEvent::SrqError { srqn }));
    assert!(!srq.limit_reached(), "not a limit");
    assert_eq!(format!("{:?}", srq.check()), format!("{failed:?}"));
    assert_eq!(format!("{:?}", on_srq.check()), format!("{failed:?}"));
    assert!(own.check().is_ok(), "another QP's: {:?}", own.check());
    // A post refused for a full SRQ says why it does not drain.
    let mr = pd.alloc_mr(4096, Access::LOCAL_WRITE).unwrap();
    let mut last = Ok(());
    for i in 0..64u64 {
        last = srq.post_recv(&[mr.sge(0, 64).unwrap()], i);
        if last.is_err() {
            break;
        }
    }
    assert_eq!(format!("{last:?}"), format!("{failed:?}"));
    // Another SRQ's is not this one's.
    let other = pd.create_srq(&cq, caps).unwrap();
    assert!(other.check().is_ok(), "{:?}", other.check());
}

/// A port's error is reported to the devices opened on that port only (connections on one
/// librdmacm context share one event record whatever their ports): the software NIC's port
/// is 1, so an error of port 2 is not its QPs', while port 1's is.
#[test]
fn a_port_error_is_reported_to_that_port_only() {
    let dev = Device::sim_stepped();
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(16).unwrap();
    let qp = pd.create_qp(&cq, &cq, QpCaps::default()).unwrap();
    nic(&dev).raise_event(mlx5::sim::AsyncEvent::PortError { port: 2 });
    assert!(qp.check().is_ok(), "another port's: {:?}", qp.check());
    nic(&dev).raise_event(mlx5::sim::AsyncEvent::PortError { port: 1 });
    assert!(matches!(
        qp.check(),
        Err(Error::AsyncEvent(AsyncEvent::PortError { port: 1 }))
    ));
    assert!(matches!(
        cq.check(),
        Err(Error::AsyncEvent(AsyncEvent::PortError { port: 1 }))
    ));
}

/// A port that comes back (`IBV_EVENT_PORT_ACTIVE` after `IBV_EVENT_PORT_ERR`: a cable or
/// switch flap, a subnet manager restart) is no longer an error of the QPs and CQs on it,
/// nor of the ones created after it came back. The record of the port's error was kept for
/// good (the port-active event was read and dropped), so every `check`, every refused post
/// (`QueueFull` explained as the port's error) and every `poll_n` that gave up said
/// `PortError` for the rest of the process.
#[test]
fn a_port_that_comes_back_is_no_longer_an_error() {
    let dev = Device::sim_stepped();
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(16).unwrap();
    let qp = pd.create_qp(&cq, &cq, QpCaps::default()).unwrap();
    nic(&dev).raise_event(mlx5::sim::AsyncEvent::PortError { port: 1 });
    assert!(matches!(
        qp.check(),
        Err(Error::AsyncEvent(AsyncEvent::PortError { port: 1 }))
    ));
    nic(&dev).raise_event(mlx5::sim::AsyncEvent::PortActive { port: 1 });
    assert!(qp.check().is_ok(), "the port is up again: {:?}", qp.check());
    assert!(cq.check().is_ok(), "{:?}", cq.check());
    let cq2 = dev.create_cq(16).unwrap();
    let fresh = pd.create_qp(&cq2, &cq2, QpCaps::default()).unwrap();
    assert!(
        fresh.check().is_ok(),
        "a QP made after: {:?}",
        fresh.check()
    );
    // Down again: reported again.
    nic(&dev).raise_event(mlx5::sim::AsyncEvent::PortError { port: 1 });
    assert!(matches!(
        fresh.check(),
        Err(Error::AsyncEvent(AsyncEvent::PortError { port: 1 }))
    ));
}
