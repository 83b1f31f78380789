//! The software NIC's transport timers follow the QP's attributes (`Qp::connect_with`'s
//! `Timing`, as `ibv_modify_qp` programs a ConnectX): a request the responder never
//! answers is sent again every `4.096 us * 2^timeout` until `retry_cnt` retransmissions are
//! spent, then fails with `RetryExcErr`; a send that meets no receive waits the responder's
//! RNR timer before each of `rnr_retry` retries (7: for ever), then fails with
//! `RnrRetryExcErr`; a receive posted during the back-off is used.
//!
//! The stepped NIC runs virtual time: it jumps to the next timer when it has nothing else to
//! do, so these checks are exact and take no wall-clock time.

use crate::spec;

use blueflame::*;
use mlx5::sim::{ack_timeout_ns, rnr_timer_ns};
use spec::scenarios::{self, Pair};

fn pair(dev: &Device, timing: Timing) -> Pair {
    Pair::new(dev, scenarios::RIGHTS, scenarios::caps(), &timing)
}

fn now(dev: &Device) -> u64 {
    dev.nic().unwrap().now_ns()
}

fn stats(dev: &Device, qpn: u32) -> mlx5::sim::QpStats {
    dev.nic().unwrap().qp_stats(qpn).unwrap()
}

#[test]
fn a_silent_responder_costs_retry_cnt_retransmissions_and_their_timeouts() {
    for (timeout, retry_cnt) in [(10u8, 3u8), (1, 0), (14, 7), (20, 2)] {
        let dev = Device::sim_stepped();
        let mut p = pair(
            &dev,
            Timing {
                timeout,
                retry_cnt,
                ..Timing::default()
            },
        );
        p.b.set_error().unwrap();
        let t0 = now(&dev);
        p.a.write_inline(
            b"anyone?",
            p.mr_b.remote(0).unwrap(),
            1,
            PostFlags::SIGNALED,
        )
        .unwrap();
        p.a.write_inline(b"next", p.mr_b.remote(8).unwrap(), 2, PostFlags::UNSIGNALED)
            .unwrap();
        let got = p.wait(false, 2);
        let what = format!("timeout {timeout}, retry_cnt {retry_cnt}");
        assert_eq!(
            (got[0].0, got[0].1, got[1].0, got[1].1),
            (1, WcStatus::RetryExcErr, 2, WcStatus::WrFlushErr),
            "{what}"
        );
        let s = stats(&dev, p.a.qpn());
        assert_eq!(s.transport_retries, retry_cnt as u64, "{what}");
        let t = ack_timeout_ns(timeout).unwrap();
        assert_eq!(t, 4096 << timeout);
        assert_eq!(now(&dev) - t0, (retry_cnt as u64 + 1) * t, "{what}");
    }
}

#[test]
fn timeout_zero_waits_for_ever() {
    let dev = Device::sim_stepped();
    let mut p = pair(
        &dev,
        Timing {
            timeout: 0,
            ..Timing::default()
        },
    );
    p.b.set_error().unwrap();
    p.a.write_inline(b"hello?", p.mr_b.remote(0).unwrap(), 1, PostFlags::SIGNALED)
        .unwrap();
    let t0 = now(&dev);
    for _ in 0..100 {
        dev.process();
    }
    let mut out = [Completion::default(); 2];
    assert_eq!(p.cq_a.poll(&mut out), 0, "no timeout, no error");
    assert_eq!(stats(&dev, p.a.qpn()).transport_retries, 0);
    assert_eq!(now(&dev), t0, "nothing to wait for: time stands still");
    // Moving the QP to error flushes it.
    p.a.set_error().unwrap();
    assert_eq!(p.wait(false, 1)[0].1, WcStatus::WrFlushErr);
}

#[test]
fn a_receive_posted_during_the_rnr_back_off_is_used() {
    for min_rnr_timer in [1u8, 12, 14, 0] {
        let dev = Device::sim_stepped();
        let mut p = pair(
            &dev,
            Timing {
                min_rnr_timer,
                rnr_retry: 5,
                ..Timing::default()
            },
        );
        let t0 = now(&dev);
        p.a.send(Payload::Inline(b"knock"), 1, PostFlags::SIGNALED)
            .unwrap();
        let nic = dev.nic().unwrap();
        let mut passes = 0;
        while nic.qp_stats(p.b.qpn()).unwrap().rnr_naks < 3 {
            nic.process();
            passes += 1;
            assert!(passes < 100);
        }
        let naks = nic.qp_stats(p.b.qpn()).unwrap().rnr_naks;
        p.b.post_recv(&[p.mr_b.sge(0, 64).unwrap()], 7).unwrap();
        let got = p.wait(false, 1);
        assert_eq!((got[0].0, got[0].1), (1, WcStatus::Success));
        let r = p.wait(true, 1);
        assert_eq!((r[0].0, r[0].1, r[0].3), (7, WcStatus::Success, 5));
        // Each NAK cost one RNR timer of the responder; the retry after the last one found
        // the receive.
        assert_eq!(nic.qp_stats(p.b.qpn()).unwrap().rnr_naks, naks);
        assert_eq!(
            now(&dev) - t0,
            naks * rnr_timer_ns(min_rnr_timer),
            "min_rnr_timer {min_rnr_timer}"
        );
    }
}

#[test]
fn rnr_retries_run_out_after_rnr_retry() {
    for rnr_retry in [0u8, 1, 2, 6] {
        let dev = Device::sim_stepped();
        let mut p = pair(
            &dev,
            Timing {
                min_rnr_timer: 3,
                rnr_retry,
                ..Timing::default()
            },
        );
        let t0 = now(&dev);
        p.a.send(Payload::Inline(b"knock"), 1, PostFlags::SIGNALED)
            .unwrap();
        p.a.send(Payload::Inline(b"again"), 2, PostFlags::UNSIGNALED)
            .unwrap();
        let got = p.wait(false, 2);
        assert_eq!(
            (got[0].0, got[0].1, got[1].0, got[1].1),
            (1, WcStatus::RnrRetryExcErr, 2, WcStatus::WrFlushErr)
        );
        let naks = stats(&dev, p.b.qpn()).rnr_naks;
        assert_eq!(naks, rnr_retry as u64 + 1, "rnr_retry {rnr_retry}");
        assert_eq!(now(&dev) - t0, rnr_retry as u64 * rnr_timer_ns(3));
    }
}

#[test]
fn rnr_retry_7_retries_for_ever() {
    let dev = Device::sim_stepped();
    let mut p = pair(
        &dev,
        Timing {
            min_rnr_timer: 1,
            rnr_retry: 7,
            ..Timing::default()
        },
    );
    p.a.send(Payload::Inline(b"patience"), 1, PostFlags::SIGNALED)
        .unwrap();
    let nic = dev.nic().unwrap();
    for _ in 0..500 {
        nic.process();
    }
    let mut out = [Completion::default(); 2];
    assert_eq!(p.cq_a.poll(&mut out), 0);
    assert!(nic.qp_stats(p.b.qpn()).unwrap().rnr_naks >= 500);
    p.b.post_recv(&[p.mr_b.sge(0, 64).unwrap()], 7).unwrap();
    assert_eq!(p.wait(false, 1)[0].1, WcStatus::Success);
}

#[test]
fn the_nic_runs_the_attributes_connect_programs() {
    let dev = Device::sim_stepped();
    let caps = QpCaps {
        rnr_retry: 2,
        ..scenarios::caps()
    };
    let t = Timing {
        timeout: 9,
        retry_cnt: 4,
        rnr_retry: 7,
        min_rnr_timer: 20,
    };
    let p = Pair::new(&dev, scenarios::RIGHTS, caps, &t);
    let got = dev.nic().unwrap().qp_timing(p.a.qpn()).unwrap();
    assert_eq!(
        (got.timeout, got.retry_cnt, got.rnr_retry, got.min_rnr_timer),
        (9, 4, 2, 20),
        "the RNR retry count is the smaller of Timing's and QpCaps'"
    );
}

#[test]
fn thread_mode_runs_the_timers_on_the_wall_clock_times_the_scale() {
    let dev = Device::sim();
    // 8 attempts of 67 ms: 537 ms of virtual time, half a millisecond of wall time.
    dev.nic().unwrap().set_time_scale(1000.0);
    let mut p = pair(&dev, Timing::default());
    p.b.set_error().unwrap();
    let t0 = now(&dev);
    p.a.write_inline(
        b"anyone?",
        p.mr_b.remote(0).unwrap(),
        1,
        PostFlags::SIGNALED,
    )
    .unwrap();
    assert_eq!(p.wait(false, 1)[0].1, WcStatus::RetryExcErr);
    assert_eq!(stats(&dev, p.a.qpn()).transport_retries, 7);
    assert!(now(&dev) - t0 >= 8 * ack_timeout_ns(14).unwrap());
}

#[test]
fn a_qp_moved_to_error_stops_waiting_for_its_timers() {
    // An RNR back-off of 655 ms (min_rnr_timer 0) and an endless ACK wait (timeout 0): set
    // to error, the QP flushes at once, without the clock moving.
    for (min_rnr_timer, timeout, peer_in_error) in [(0u8, 14u8, false), (12, 0, true)] {
        let dev = Device::sim_stepped();
        let mut p = pair(
            &dev,
            Timing {
                min_rnr_timer,
                timeout,
                ..Timing::default()
            },
        );
        if peer_in_error {
            p.b.set_error().unwrap();
        }
        p.a.send(Payload::Inline(b"wait"), 1, PostFlags::SIGNALED)
            .unwrap();
        dev.nic().unwrap().process();
        let t = now(&dev);
        p.a.set_error().unwrap();
        assert_eq!(p.wait(false, 1)[0].1, WcStatus::WrFlushErr);
        assert_eq!(now(&dev), t);
    }
}

#[test]
fn virtual_time_at_its_end_does_not_overflow_the_timers() {
    // A time scale so large that virtual time saturates at u64::MAX at once: the timers
    // computed from it (retransmission, RNR back-off, hold) saturate too instead of
    // overflowing inside the NIC.
    let dev = Device::sim();
    dev.nic().unwrap().set_time_scale(1e30);
    let mut p = pair(&dev, Timing::default());
    std::thread::sleep(std::time::Duration::from_millis(5));
    p.b.set_error().unwrap();
    p.a.write_inline(
        b"anyone?",
        p.mr_b.remote(0).unwrap(),
        1,
        PostFlags::SIGNALED,
    )
    .unwrap();
    assert_eq!(p.wait(false, 1)[0].1, WcStatus::RetryExcErr);
    assert_eq!(now(&dev), u64::MAX);
}
