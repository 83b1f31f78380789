//! `Cq::wait_spin` on the software NIC (thread mode): a completion inside the spin budget is
//! found without arming the CQ (the NIC counts arm doorbells), one after it is found by
//! arming and sleeping, the timeout cuts the spinning short, and refusals come before any
//! spinning.

use blueflame::*;
use std::time::{Duration, Instant};

const RIGHTS: Access = Access(Access::LOCAL_WRITE.0 | Access::REMOTE_WRITE.0);

/// A loopback QP whose CQ has a channel, and a region to write to.
fn setup() -> (Device, Qp, Cq, MemoryRegion) {
    let dev = Device::sim();
    let ch = dev.create_channel().unwrap();
    let cq = dev
        .create_cq_with(&CqOptions::new(64).channel(&ch))
        .unwrap();
    let pd = dev.alloc_pd().unwrap();
    let mut qp = pd.create_qp(&cq, &cq, QpCaps::default()).unwrap();
    let me = qp.endpoint().unwrap();
    qp.connect(&me).unwrap();
    let mr = pd.alloc_mr(64, RIGHTS).unwrap();
    (dev, qp, cq, mr)
}

fn arm_stats(dev: &Device, cq: &Cq) -> mlx5::sim::ArmStats {
    dev.nic().unwrap().cq_arm_stats(cq.cqn()).unwrap()
}

#[test]
fn a_completion_inside_the_budget_is_found_without_arming() {
    let (dev, mut qp, mut cq, mr) = setup();
    let mut out = [Completion::default(); 4];
    for i in 0..20 {
        qp.write_inline(b"x", mr.remote(0).unwrap(), i, PostFlags::SIGNALED)
            .unwrap();
        // The NIC's thread completes a write in microseconds; the budget is 10 s.
        let n = cq
            .wait_spin(&mut out, Spin::For(Duration::from_secs(10)), None)
            .unwrap();
        assert_eq!((n, out[0].cookie, out[0].status), (1, i, WcStatus::Success));
    }
    let s = arm_stats(&dev, &cq);
    assert_eq!((s.arms, s.events), (0, 0), "spinning armed the CQ: {s:?}");
}

#[test]
fn past_the_budget_it_arms_and_sleeps_until_the_event() {
    let (dev, mut qp, mut cq, mr) = setup();
    let poster = std::thread::spawn(move || {
        // Long after 10 polls have come back empty.
        std::thread::sleep(Duration::from_millis(100));
        qp.write_inline(b"x", mr.remote(0).unwrap(), 7, PostFlags::SIGNALED)
            .unwrap();
        (qp, mr)
    });
    let mut out = [Completion::default(); 4];
    let n = cq
        .wait_spin(&mut out, Spin::Polls(10), Some(Duration::from_secs(20)))
        .unwrap();
    let _keep = poster.join().unwrap();
    assert_eq!((n, out[0].cookie), (1, 7));
    let s = arm_stats(&dev, &cq);
    assert!(s.arms >= 1 && s.events >= 1, "it never slept: {s:?}");
}

#[test]
fn the_timeout_cuts_the_spinning_short() {
    let (_dev, _qp, mut cq, _mr) = setup();
    let mut out = [Completion::default(); 4];
    let t = Instant::now();
    let n = cq
        .wait_spin(
            &mut out,
            Spin::For(Duration::from_secs(3600)),
            Some(Duration::from_millis(50)),
        )
        .unwrap();
    assert_eq!(n, 0);
    let took = t.elapsed();
    assert!(took >= Duration::from_millis(50), "{took:?}");
    // Not an hour (a generous bound: the machine may be loaded).
    assert!(took < Duration::from_secs(60), "{took:?}");
    // A zero timeout polls once, spin budget or not.
    let n = cq
        .wait_spin(&mut out, Spin::Polls(u32::MAX), Some(Duration::ZERO))
        .unwrap();
    assert_eq!(n, 0);
}

#[test]
fn refusals_come_before_any_spinning() {
    let (dev, _qp, mut cq, _mr) = setup();
    let mut plain = dev.create_cq(8).unwrap();
    let mut out = [Completion::default(); 1];
    let hour = Spin::For(Duration::from_secs(3600));
    let e = plain.wait_spin(&mut out, hour, None).unwrap_err();
    assert!(matches!(e, Error::NoChannel { .. }), "{e}");
    let e = cq.wait_spin(&mut [], hour, None).unwrap_err();
    assert!(matches!(e, Error::InvalidParameter { .. }), "{e}");
}
