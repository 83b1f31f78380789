//! Unsignaled WQEs: they retire with the next signaled one, report nothing themselves, and
//! a long unsignaled run never fills the queue (the driver signals one WQE internally and
//! swallows its completion).

use crate::common;

use blueflame::*;
use common::*;

#[test]
fn unsignaled_retire_with_the_next_signaled() {
    let mut s = Setup::pair(QpCaps::default());
    let dst = s.mr(8192, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let q = s.a.qpn();
    const N: u64 = 100;
    for i in 0..N {
        s.a.write_inline(
            &i.to_le_bytes(),
            dst.remote(i as usize * 8).unwrap(),
            i,
            PostFlags::UNSIGNALED,
        )
        .unwrap();
    }
    s.a.write_inline(b"last", dst.remote(4000).unwrap(), 777, PostFlags::SIGNALED)
        .unwrap();
    assert_eq!(free_send(&mut s.a), 256 - 101);
    assert_eq!(s.dev.process(), 101);
    // Not retired until the completion is polled.
    assert_eq!(free_send(&mut s.a), 256 - 101);
    let (c, _) = s.run_expect(1, 0);
    assert_ok(&c[0], 777, WcOpcode::RdmaWrite, 0, q);
    assert_eq!(free_send(&mut s.a), 256);
    for i in 0..N {
        assert_eq!(dst.read_u64(i as usize * 8).unwrap(), i.to_le());
    }
    assert_eq!(bytes(&dst, 4000, 4), b"last");
    assert_eq!(nic(&s.dev).qp_stats(q).unwrap().wqes, 101);
}

#[test]
fn unsignaled_only_reports_nothing() {
    let mut s = Setup::loopback(QpCaps::default());
    let dst = s.mr(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    for i in 0..10u64 {
        s.a.write_inline(
            &i.to_le_bytes(),
            dst.remote(0).unwrap(),
            i,
            PostFlags::UNSIGNALED,
        )
        .unwrap();
    }
    s.run_expect(0, 0);
    assert_eq!(dst.read_u64(0).unwrap(), 9u64.to_le());
    // Nothing retired them: 10 blocks stay in use until a signaled WQE completes.
    assert_eq!(free_send(&mut s.a), 246);
    s.a.post(&Request::Nop, 50, PostFlags::SIGNALED).unwrap();
    let (c, _) = s.run_expect(1, 0);
    assert_ok(&c[0], 50, WcOpcode::Nop, 0, s.a.qpn());
    assert_eq!(free_send(&mut s.a), 256);
}

#[test]
fn moderation_signals_internally_and_reports_nothing() {
    // 200 unsignaled one-block writes without polling in between. Half the ring is 128
    // blocks: the 129th WQE is signaled by the driver, and its completion retires the first
    // 129 blocks without being reported.
    let mut s = Setup::pair(QpCaps::default());
    let dst = s.mr(200 * 8, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    for i in 0..200u64 {
        s.a.write_inline(
            &i.to_le_bytes(),
            dst.remote(i as usize * 8).unwrap(),
            i,
            PostFlags::UNSIGNALED,
        )
        .unwrap();
    }
    assert_eq!(free_send(&mut s.a), 56);
    s.run_expect(0, 0);
    assert_eq!(free_send(&mut s.a), 256 - (200 - 129));
    for i in 0..200u64 {
        assert_eq!(dst.read_u64(i as usize * 8).unwrap(), i.to_le());
    }
    // A user-signaled WQE after it is reported, alone, and frees everything.
    s.a.post(&Request::Nop, 1234, PostFlags::SIGNALED).unwrap();
    let (c, _) = s.run_expect(1, 0);
    assert_ok(&c[0], 1234, WcOpcode::Nop, 0, s.a.qpn());
    assert_eq!(free_send(&mut s.a), 256);
}

#[test]
fn long_unsignaled_runs_never_fill_the_queue() {
    // (ring blocks, inline sizes cycled, posts between two polls, largest WQE in blocks)
    let cases: [(u32, &[usize], u64, u32); 3] = [
        (256, &[8], 3, 1),
        (16, &[8, 200, 40], 1, 4),
        (64, &[100, 8], 3, 3),
    ];
    for (sq_blocks, sizes, between, max_bbs) in cases {
        let caps = QpCaps {
            sq_blocks,
            ..QpCaps::default()
        };
        let mut s = Setup::pair(caps);
        let dst = s.mr(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
        let q = s.a.qpn();
        let mut out = [Completion::default(); 16];
        let mut min_free = sq_blocks;
        const N: u64 = 20_000;
        for i in 0..N {
            let len = sizes[i as usize % sizes.len()];
            let mut data = pattern(len, i);
            data[..8].copy_from_slice(&i.to_le_bytes());
            s.a.write_inline(&data, dst.remote(0).unwrap(), i, PostFlags::UNSIGNALED)
                .unwrap_or_else(|e| panic!("ring of {sq_blocks}, post {i}: {e:?}"));
            min_free = min_free.min(free_send(&mut s.a));
            if i % between == between - 1 {
                s.dev.process();
                // The internal completions are consumed, never reported.
                assert_eq!(s.cq_a.poll(&mut out), 0);
                assert_eq!(dst.read_u64(0).unwrap(), i.to_le());
            }
        }
        // After a poll at most half the ring is outstanding (unsignaled since the last
        // internally signaled WQE), plus what is posted before the next poll.
        let bound = sq_blocks - sq_blocks / 2 - between as u32 * max_bbs;
        assert!(
            min_free >= bound,
            "ring of {sq_blocks}: {min_free} blocks free at worst, expected >= {bound}"
        );
        s.a.write_inline(
            b"end",
            dst.remote(100).unwrap(),
            u64::MAX,
            PostFlags::SIGNALED,
        )
        .unwrap();
        let (c, _) = s.run_expect(1, 0);
        assert_ok(&c[0], u64::MAX, WcOpcode::RdmaWrite, 0, q);
        assert_eq!(free_send(&mut s.a), sq_blocks);
        assert_eq!(bytes(&dst, 100, 3), b"end");
        assert_eq!(nic(&s.dev).qp_stats(q).unwrap().wqes, N + 1);
    }
}

#[test]
fn unsignaled_without_polling_eventually_fills_the_queue() {
    // Moderation needs the poller: if nobody polls, the ring fills and the post says so.
    let mut s = Setup::loopback(QpCaps::default());
    let dst = s.mr(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let mut posted = 0u64;
    loop {
        match s.a.write_inline(
            b"12345678",
            dst.remote(0).unwrap(),
            posted,
            PostFlags::UNSIGNALED,
        ) {
            Ok(()) => posted += 1,
            Err(Error::QueueFull {
                needed: 1, free: 0, ..
            }) => break,
            Err(e) => panic!("{e:?}"),
        }
        if posted % 10 == 0 {
            s.dev.process(); // the NIC runs, but nobody polls
        }
    }
    assert_eq!(posted, 256);
    s.run_expect(0, 0);
    // The poll retired up to the last internally signaled WQE (posted 129th and 258th would
    // be signaled; only the 129th exists): 256 - 129 blocks still in use.
    assert_eq!(free_send(&mut s.a), 129);
}

#[test]
fn unsignaled_error_is_reported_with_its_cookie() {
    // Completions on error are never suppressed.
    let mut s = Setup::pair(QpCaps::default());
    let dst = s.mr(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let q = s.a.qpn();
    s.a.write_inline(b"ok", dst.remote(0).unwrap(), 1, PostFlags::UNSIGNALED)
        .unwrap();
    s.a.write_inline(
        b"bad",
        Remote {
            addr: dst.addr(),
            rkey: dst.rkey() ^ 0xff,
        },
        2,
        PostFlags::UNSIGNALED,
    )
    .unwrap();
    let (c, _) = s.run_expect(1, 0);
    assert_err(&c[0], 2, WcStatus::RemAccessErr, 0x13, q);
    assert_eq!(c[0].opcode, WcOpcode::RdmaWrite);
    assert_eq!(bytes(&dst, 0, 3), b"ok\0");
    assert_eq!(free_send(&mut s.a), 256);
}

/// On a ring of 16 blocks whose WQEs reach 14 blocks (828 inline bytes, RC's most on a
/// ConnectX), an unsignaled run must never leave the longest request without room for good:
/// before the run was bounded by the longest WQE, eight unsignaled one-block writes left 8
/// blocks, a 14-block write was refused, and nothing signaled could ever free the ring (a
/// review's finding, then with 16-block WQEs).
#[test]
fn an_unsignaled_run_never_leaves_the_longest_request_without_room() {
    let caps = QpCaps {
        sq_blocks: 16,
        max_inline: 828,
        ..QpCaps::default()
    };
    // One or eight unsignaled writes, then the longest (14 blocks); eight, then one of 9
    // blocks (2 + ceil((540 + 4) / 16) = 36 DS).
    for (unsignaled, len) in [(1u64, 828usize), (8, 828), (8, 540)] {
        let mut s = Setup::pair(caps);
        let dst = s.mr(4096, ALL);
        for i in 0..unsignaled {
            s.a.write_inline(&[1; 8], dst.remote(0).unwrap(), i, PostFlags::UNSIGNALED)
                .unwrap();
        }
        let big = pattern(len, 3);
        let mut posted = false;
        for _ in 0..5 {
            // The NIC runs everything and every CQ is polled, as a user waiting for room.
            let (c, _) = s.run();
            assert!(c.is_empty(), "{c:?}");
            match s
                .a
                .write_inline(&big, dst.remote(0).unwrap(), 99, PostFlags::SIGNALED)
            {
                Ok(()) => {
                    posted = true;
                    break;
                }
                Err(e) => eprintln!("{unsignaled} unsignaled, {len} bytes: {e:?}"),
            }
        }
        assert!(
            posted,
            "after {unsignaled} unsignaled writes a {len}-byte inline write never fits (free {})",
            free_send(&mut s.a)
        );
        let (c, _) = s.run();
        assert_eq!(c.len(), 1, "{c:?}");
        assert!(c[0].is_ok() && c[0].cookie == 99, "{:?}", c[0]);
        assert_eq!(bytes(&dst, 0, len), big);
    }
}
