//! Completion timestamps on the direct path: the stepped software NIC stamps each CQE with
//! its device clock when it runs the request (virtual time stands still during a pass), so
//! every time a timed poll reports is known exactly: the free-running counter converted
//! with the clock-info page (at 1 GHz and at ConnectX-4's 156.25 MHz, across the counter's
//! 41- and 64-bit wraps, over many of the kernel's overflow periods), real time, and the
//! refusals.

use crate::common;

use blueflame::*;
use common::*;
use mlx5::clock::CYCLES_MASK;
use mlx5::sim::HwClock;

/// Two connected QPs on a stepped NIC with clock `clock`, each with a timestamping CQ.
struct Rig {
    dev: Device,
    a: Qp,
    b: Qp,
    cq_a: Cq,
    cq_b: Cq,
    mr: MemoryRegion,
}

fn rig(clock: HwClock) -> Rig {
    let dev = Device::sim_stepped();
    nic(&dev).set_hw_clock(clock);
    let pd = dev.alloc_pd().unwrap();
    let opts = CqOptions::new(64).timestamps();
    let cq_a = dev.create_cq_with(&opts).unwrap();
    let cq_b = dev.create_cq_with(&opts).unwrap();
    let mut a = pd.create_qp(&cq_a, &cq_a, QpCaps::default()).unwrap();
    let mut b = pd.create_qp(&cq_b, &cq_b, QpCaps::default()).unwrap();
    a.connect(&b.endpoint().unwrap()).unwrap();
    b.connect(&a.endpoint().unwrap()).unwrap();
    let mr = pd
        .alloc_mr(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    Rig {
        dev,
        a,
        b,
        cq_a,
        cq_b,
        mr,
    }
}

/// Every completion of `cq` with its time, polled `room` at a time.
fn timed(cq: &mut Cq, room: usize) -> Vec<(Completion, Option<u64>)> {
    let mut got = Vec::new();
    let (mut out, mut times) = (vec![Completion::default(); room], vec![None; room]);
    loop {
        let n = cq.poll_timed(&mut out, &mut times).unwrap();
        if n == 0 {
            return got;
        }
        got.extend(out[..n].iter().copied().zip(times[..n].iter().copied()));
    }
}

impl Rig {
    /// `k` signaled writes from `a` and one send from `b` into a receive of `a`, run at
    /// virtual time `at` (the NIC idle until then); returns the time the NIC ran them.
    fn round(&mut self, at: u64, k: u64) -> u64 {
        let n = nic(&self.dev);
        n.advance_time(at.saturating_sub(n.now_ns()));
        let now = n.now_ns();
        self.a
            .post_recv(&[self.mr.sge(2048, 64).unwrap()], 900)
            .unwrap();
        for i in 0..k {
            self.a
                .write_inline(
                    &[i as u8],
                    self.mr.remote(i as usize).unwrap(),
                    i,
                    PostFlags::SIGNALED,
                )
                .unwrap();
        }
        self.b
            .send(Payload::Inline(&[7; 8]), 901, PostFlags::SIGNALED)
            .unwrap();
        self.dev.process();
        assert_eq!(
            n.now_ns(),
            now,
            "virtual time stands still while the NIC works"
        );
        now
    }
}

/// What a free-running stamp at virtual time `now` converts to: the kernel's
/// timecounter from `epoch_ns`, `mult` / 2^`shift` ns per cycle.
fn expected(c: &HwClock, now: u64) -> u64 {
    let info = mlx5::clock::ClockInfo::for_frequency(c.khz, c.start_cycles, c.epoch_ns).unwrap();
    let cycles = now as u128 * c.khz as u128 / 1_000_000;
    c.epoch_ns + ((cycles * info.mult as u128) >> info.shift) as u64
}

/// Runs rounds at `times`, polling with arrays of `room`; checks every completion's time
/// against `want`.
fn check(clock: HwClock, times: &[u64], room: usize, want: impl Fn(u64) -> u64, slack: u64) {
    let mut r = rig(clock);
    for &t in times {
        let now = r.round(t, 3);
        let sends = timed(&mut r.cq_a, room);
        let recvs = timed(&mut r.cq_b, room);
        assert_eq!(sends.len(), 4, "three writes and a receive: {sends:?}");
        assert_eq!(recvs.len(), 1, "{recvs:?}");
        for (c, at) in sends.iter().chain(&recvs) {
            assert!(c.is_ok(), "{c:?}");
            let at = at.unwrap_or_else(|| panic!("no time for {c:?}"));
            assert!(
                at.abs_diff(want(now)) <= slack,
                "{c:?} at {now} ns: {at}, want {}",
                want(now)
            );
        }
    }
}

#[test]
fn free_running_stamps_are_when_the_nic_ran_the_request() {
    let c = HwClock::default();
    // Polled one at a time (the fast paths after the first) and 16 at a time (bursts).
    for room in [1, 16] {
        check(
            c,
            &[0, 1_000, 1_000_000, 3_000_000_007],
            room,
            |t| c.epoch_ns + t,
            0,
        );
    }
}

#[test]
fn a_connectx4_clock_of_156_25_mhz() {
    let c = HwClock {
        khz: 156_250,
        ..HwClock::default()
    };
    // The counter ticks every 6.4 ns: a stamp is the tick before.
    check(
        c,
        &[0, 6_400, 1_000_003, 2_000_000_001],
        4,
        |t| expected(&c, t),
        0,
    );
}

#[test]
fn the_counter_wraps_its_41_and_its_64_bits() {
    for start in [CYCLES_MASK - 1_500, u64::MAX - 1_500] {
        let c = HwClock {
            start_cycles: start,
            ..HwClock::default()
        };
        // Before, at and after the wrap: still one nanosecond per cycle.
        check(
            c,
            &[0, 1_000, 1_500, 1_501, 2_000, 90_000],
            2,
            |t| c.epoch_ns + t,
            0,
        );
    }
}

#[test]
fn the_clock_info_page_is_read_again_across_overflow_periods() {
    let c = HwClock::default();
    let info = nic(&Device::sim_stepped()).clock_info().unwrap();
    // At 1 GHz the kernel moves its page every 2^32 cycles (4.3 s): the rounds lie
    // 20 s apart, where rdma-core's conversion with a page read once would overflow
    // `delta * mult`.
    assert_eq!(info.overflow_cycles(), (1 << 32) - 1);
    let rounds: Vec<u64> = (0..4).map(|i| i * 20_000_000_000 + 17).collect();
    check(c, &rounds, 8, |t| c.epoch_ns + t, 0);
    // The page moved meanwhile, as the kernel's overflow work moves it.
    let dev = Device::sim_stepped();
    let first = nic(&dev).clock_info().unwrap();
    nic(&dev).advance_time(20_000_000_000);
    let later = nic(&dev).clock_info().unwrap();
    assert!(later.last_cycles > first.last_cycles && later.nsec > first.nsec);
    let now = nic(&dev).hw_time().unwrap();
    assert_eq!(later.ts_to_ns(now.0), now.1);
    // A stale page converts it too: the product is 128 bits wide (rdma-core's 64-bit
    // `mlx5dv_ts_to_ns` is off there by 2^33 ns), within rounding of the moved page.
    assert!(first.ts_to_ns(now.0).abs_diff(now.1) <= 1, "a stale page");
}

#[test]
fn real_time_stamps() {
    let c = HwClock {
        format: TimestampFormat::RealTime,
        ..HwClock::default()
    };
    check(
        c,
        &[0, 999_999_999, 1_000_000_000, 86_400_000_000_123],
        3,
        |t| c.epoch_ns + t,
        0,
    );
    let dev = Device::sim_stepped();
    nic(&dev).set_hw_clock(c);
    nic(&dev).advance_time(5);
    let t = dev.clock().unwrap();
    assert_eq!(
        (t.ns, t.format),
        (c.epoch_ns + 5, TimestampFormat::RealTime)
    );
}

#[test]
fn device_clock_brackets_the_stamps() {
    let mut r = rig(HwClock::default());
    nic(&r.dev).advance_time(12_345);
    let before = r.dev.clock().unwrap();
    assert_eq!(before.format, TimestampFormat::FreeRunning);
    assert_eq!(before.cycles, 12_345);
    r.round(50_000, 1);
    nic(&r.dev).advance_time(10);
    let after = r.dev.clock().unwrap();
    for (_, at) in timed(&mut r.cq_a, 4) {
        let at = at.unwrap();
        assert!(before.ns < at && at < after.ns, "{before:?} {at} {after:?}");
    }
}

#[test]
fn error_completions_have_no_time() {
    let mut r = rig(HwClock::default());
    // A write into a region without remote rights fails on the responder; the flush after
    // it too: their CQEs hold syndromes where a timestamp would be.
    let ro = r.mr.sge(0, 8).unwrap();
    let bad = Remote {
        addr: ro.addr,
        rkey: r.mr.lkey() ^ 0x100,
    };
    r.a.write_inline(&[1], bad, 1, PostFlags::SIGNALED).unwrap();
    r.a.write_inline(&[2], r.mr.remote(0).unwrap(), 2, PostFlags::SIGNALED)
        .unwrap();
    r.dev.process();
    let got = timed(&mut r.cq_a, 4);
    assert_eq!(got.len(), 2, "{got:?}");
    for (c, at) in got {
        assert!(!c.is_ok(), "{c:?}");
        assert_eq!(at, None, "{c:?}");
    }
}

#[test]
fn the_plain_poll_of_a_timed_cq_and_short_time_arrays() {
    let mut r = rig(HwClock::default());
    r.round(100, 3);
    // Two times, four completions' room: two polled.
    let (mut out, mut times) = ([Completion::default(); 4], [None; 2]);
    assert_eq!(r.cq_a.poll_timed(&mut out, &mut times).unwrap(), 2);
    assert_eq!(times, [Some(HwClock::default().epoch_ns + 100); 2]);
    // The rest through the plain poll, the same completions.
    let rest = poll_all(&mut r.cq_a);
    assert_eq!(rest.len(), 2, "{rest:?}");
    assert_eq!(
        out[..2].iter().map(|c| c.cookie).collect::<Vec<_>>(),
        [0, 1]
    );
    assert_eq!(rest[0].cookie, 2);
}

#[test]
fn refused_typed() {
    let timestamps = |e: Error| matches!(e, Error::Timestamps { .. });
    // A device with no completion clock (as rxe).
    let dev = Device::sim_stepped();
    nic(&dev).set_hw_clock(HwClock {
        khz: 0,
        ..HwClock::default()
    });
    assert!(!dev.clock_caps().present());
    let e = dev
        .create_cq_with(&CqOptions::new(8).timestamps())
        .unwrap_err();
    assert!(timestamps(e), "no clock");
    assert!(timestamps(dev.clock().unwrap_err()), "no clock to read");
    // With compression: a mini-CQE has no timestamp.
    let dev = Device::sim_stepped();
    assert_eq!(dev.clock_caps().khz, 1_000_000);
    let opts = CqOptions::new(8)
        .timestamps()
        .compression(MiniCqeFormat::Hash);
    let e = dev.create_cq_with(&opts).unwrap_err();
    assert!(e.to_string().contains("mini-CQE"), "{e}");
    // A CQ created without them.
    let mut cq = dev.create_cq(8).unwrap();
    let e = cq
        .poll_timed(&mut [Completion::default()], &mut [None])
        .unwrap_err();
    assert!(timestamps(e));
}

/// A completion polled 13 s after it was stamped, the clock page read since (it moves on
/// every 2^32 cycles at 1 GHz), keeps its time: rdma-core's 64-bit conversion wraps past
/// 2^64 / `mult` cycles and put it 2^33 ns late (a review's finding).
#[test]
fn a_completion_polled_late_keeps_its_time() {
    let dev = Device::sim_stepped();
    let pd = dev.alloc_pd().unwrap();
    let mut cq = dev
        .create_cq_with(&CqOptions::new(16).timestamps())
        .unwrap();
    let mut qp = pd.create_qp(&cq, &cq, QpCaps::default()).unwrap();
    let me = qp.endpoint().unwrap();
    qp.connect(&me).unwrap();
    let mr = pd
        .alloc_mr(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    nic(&dev).advance_time(1_000_000);
    let before = dev.clock().unwrap().ns;
    qp.write_inline(&[1], mr.remote(0).unwrap(), 7, PostFlags::SIGNALED)
        .unwrap();
    dev.process();
    for _ in 0..130 {
        nic(&dev).advance_time(100_000_000);
        let _ = dev.clock().unwrap();
    }
    let (mut out, mut times) = ([Completion::default(); 4], [None; 4]);
    assert_eq!(cq.poll_timed(&mut out, &mut times).unwrap(), 1);
    let t = times[0].unwrap();
    assert!(
        t >= before && t <= before + 1_000,
        "stamped {t}, written at {before}"
    );
}

/// On a device that stamps in real time, a QP's send and receive CQs must both have
/// timestamps or neither: the kernel creates a timestamped CQ real-time and a plain one
/// free-running, and refuses a QP over the two (mlx5_ib `get_qp_ts_format`, EOPNOTSUPP);
/// the software NIC in real-time mode refuses it the same way, typed, for RC and UD QPs
/// (a review's finding: it accepted them). On a free-running device any pair is taken.
#[test]
fn a_real_time_device_refuses_a_qp_over_a_timestamped_and_a_plain_cq() {
    for real_time in [true, false] {
        let dev = Device::sim_stepped();
        if real_time {
            nic(&dev).set_hw_clock(HwClock {
                format: mlx5::clock::TimestampFormat::RealTime,
                ..HwClock::default()
            });
        }
        let pd = dev.alloc_pd().unwrap();
        let timed = dev
            .create_cq_with(&CqOptions::new(16).timestamps())
            .unwrap();
        let plain = dev.create_cq(16).unwrap();
        for (send, recv) in [(&timed, &plain), (&plain, &timed)] {
            let rc = pd.create_qp(send, recv, QpCaps::default()).map(drop);
            let ud = pd.create_ud_qp(send, recv, QpCaps::default(), 1).map(drop);
            for r in [rc, ud] {
                match (real_time, r) {
                    (true, Err(Error::Timestamps { why })) => assert!(why.contains("real time")),
                    (false, Ok(())) => {}
                    (_, other) => panic!("real time {real_time}: {other:?}"),
                }
            }
        }
        assert!(pd.create_qp(&timed, &timed, QpCaps::default()).is_ok());
        assert!(pd.create_qp(&plain, &plain, QpCaps::default()).is_ok());
    }
}
