//! Full send and receive queues: the refusal carries the right numbers, and the queue is
//! untouched by it (what was posted completes exactly, nothing else).

use crate::common;

use blueflame::*;
use common::*;

#[test]
fn send_queue_full_reports_needed_and_free() {
    let mut s = Setup::pair(QpCaps::default());
    let dst = s.mr(256 * 16, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let q = s.a.qpn();
    assert_eq!(free_send(&mut s.a), 256);
    // 254 one-block writes.
    for i in 0..254u64 {
        s.a.write_inline(
            &i.to_le_bytes(),
            dst.remote(i as usize * 16).unwrap(),
            i,
            PostFlags::SIGNALED,
        )
        .unwrap();
    }
    assert_eq!(free_send(&mut s.a), 2);
    // A 4-block WQE (200 inline bytes) does not fit in 2.
    let big = pattern(200, 1);
    let e =
        s.a.write_inline(&big, dst.remote(0).unwrap(), 999, PostFlags::SIGNALED)
            .unwrap_err();
    assert!(
        matches!(
            e,
            Error::QueueFull {
                needed: 4,
                free: 2,
                ..
            }
        ),
        "{e:?}"
    );
    // The same refusal through a gather list of 8 entries (2 + 8 DS = 3 blocks).
    let src = s.mr(64, Access::LOCAL_WRITE);
    let sgl: Vec<Sge> = (0..8).map(|i| src.sge(i * 8, 8).unwrap()).collect();
    let e =
        s.a.write(&sgl, dst.remote(0).unwrap(), 998, PostFlags::SIGNALED)
            .unwrap_err();
    assert!(
        matches!(
            e,
            Error::QueueFull {
                needed: 3,
                free: 2,
                ..
            }
        ),
        "{e:?}"
    );
    assert_eq!(free_send(&mut s.a), 2);
    // Two more one-block writes fit exactly.
    for i in 254..256u64 {
        s.a.write_inline(
            &i.to_le_bytes(),
            dst.remote(i as usize * 16).unwrap(),
            i,
            PostFlags::SIGNALED,
        )
        .unwrap();
    }
    assert_eq!(free_send(&mut s.a), 0);
    let e =
        s.a.post(&Request::Nop, 997, PostFlags::SIGNALED)
            .unwrap_err();
    assert!(
        matches!(
            e,
            Error::QueueFull {
                needed: 1,
                free: 0,
                ..
            }
        ),
        "{e:?}"
    );
    let e =
        s.a.compare_swap(
            dst.remote(0).unwrap(),
            0,
            1,
            src.sge(0, 8).unwrap(),
            996,
            PostFlags::SIGNALED,
        )
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::QueueFull {
                needed: 1,
                free: 0,
                ..
            }
        ),
        "{e:?}"
    );
    let e = {
        let mut b = s.a.batch();
        let e = b.push(&Request::Nop, 995, PostFlags::SIGNALED).unwrap_err();
        assert!(b.is_empty());
        b.ring().rung();
        e
    };
    assert!(
        matches!(
            e,
            Error::QueueFull {
                needed: 1,
                free: 0,
                ..
            }
        ),
        "{e:?}"
    );
    // Nothing of the refusals reached the ring: exactly the 256 writes run and complete.
    assert_eq!(s.dev.process(), 256);
    let (c, _) = s.run_expect(256, 0);
    for (i, c) in c.iter().enumerate() {
        assert_ok(c, i as u64, WcOpcode::RdmaWrite, 0, q);
        assert_eq!(dst.read_u64(i * 16).unwrap(), (i as u64).to_le());
    }
    assert_eq!(free_send(&mut s.a), 256);
    let st = nic(&s.dev).qp_stats(q).unwrap();
    assert_eq!(st.wqes, 256);
    assert_eq!(st.doorbell_misses, 0);
    // And the queue is usable again from where it was.
    s.a.write_inline(&big, dst.remote(0).unwrap(), 1000, PostFlags::SIGNALED)
        .unwrap();
    let (c, _) = s.run_expect(1, 0);
    assert_ok(&c[0], 1000, WcOpcode::RdmaWrite, 0, q);
    assert_eq!(bytes(&dst, 0, 200), big);
}

#[test]
fn send_queue_full_frees_as_completions_are_polled() {
    // Blocks come back only when the completion is polled, not when the NIC runs.
    let caps = QpCaps {
        sq_blocks: 16,
        ..QpCaps::default()
    };
    let mut s = Setup::loopback(caps);
    let dst = s.mr(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let data = pattern(200, 2);
    for i in 0..4u64 {
        s.a.write_inline(
            &data,
            dst.remote(i as usize * 256).unwrap(),
            i,
            PostFlags::SIGNALED,
        )
        .unwrap();
    }
    assert_eq!(free_send(&mut s.a), 0);
    assert_eq!(s.dev.process(), 4);
    assert_eq!(free_send(&mut s.a), 0);
    let e =
        s.a.write_inline(b"x", dst.remote(0).unwrap(), 9, PostFlags::SIGNALED)
            .unwrap_err();
    assert!(
        matches!(
            e,
            Error::QueueFull {
                needed: 1,
                free: 0,
                ..
            }
        ),
        "{e:?}"
    );
    let mut out = [Completion::default(); 2];
    assert_eq!(s.cq_a.poll(&mut out), 2);
    assert_eq!((out[0].cookie, out[1].cookie), (0, 1));
    assert_eq!(free_send(&mut s.a), 8);
    assert_eq!(s.cq_a.poll(&mut out[..1]), 1);
    assert_eq!(out[0].cookie, 2);
    assert_eq!(free_send(&mut s.a), 12);
    assert_eq!(s.cq_a.poll(&mut out), 1);
    assert_eq!(out[0].cookie, 3);
    assert_eq!(free_send(&mut s.a), 16);
    for i in 0..4 {
        assert_eq!(bytes(&dst, i * 256, 200), data);
    }
}

#[test]
fn receive_queue_full() {
    let caps = QpCaps {
        rq_entries: 16,
        ..QpCaps::default()
    };
    let mut s = Setup::pair(caps);
    let rbuf = s.mr(16 * 64, Access::LOCAL_WRITE);
    let rq = s.resp_qpn();
    let q = s.a.qpn();
    assert_eq!(free_recv(s.resp()), 16);
    for i in 0..16u64 {
        s.resp()
            .post_recv(&[rbuf.sge(i as usize * 64, 64).unwrap()], 100 + i)
            .unwrap();
    }
    assert_eq!(free_recv(s.resp()), 0);
    let e = s
        .resp()
        .post_recv(&[rbuf.sge(0, 64).unwrap()], 999)
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::QueueFull {
                needed: 1,
                free: 0,
                ..
            }
        ),
        "{e:?}"
    );
    let e = s.resp().post_recv(&[], 998).unwrap_err();
    assert!(
        matches!(
            e,
            Error::QueueFull {
                needed: 1,
                free: 0,
                ..
            }
        ),
        "{e:?}"
    );
    assert_eq!(free_recv(s.resp()), 0);
    // 16 sends consume exactly the 16 receives, in order, with their buffers.
    for i in 0..16u64 {
        let msg = pattern(10 + i as usize, i);
        s.a.send(Payload::Inline(&msg), i, PostFlags::SIGNALED)
            .unwrap();
    }
    let (c, r) = s.run_expect(16, 16);
    for i in 0..16usize {
        assert_ok(&c[i], i as u64, WcOpcode::Send, 0, q);
        assert_ok(&r[i], 100 + i as u64, WcOpcode::Recv, 10 + i as u32, rq);
        assert_eq!(bytes(&rbuf, i * 64, 10 + i), pattern(10 + i, i as u64));
    }
    assert_eq!(free_recv(s.resp()), 16);
    assert_eq!(nic(&s.dev).qp_stats(rq).unwrap().recvs, 16);
    // A 17th send finds no receive: with the default rnr_retry (7, for ever) it waits.
    s.a.send(Payload::Inline(b"late"), 16, PostFlags::SIGNALED)
        .unwrap();
    s.run_expect(0, 0);
    assert!(nic(&s.dev).qp_stats(rq).unwrap().rnr_naks >= 1);
    // Receives posted now let it through.
    for k in 0..3u64 {
        s.resp()
            .post_recv(&[rbuf.sge(0, 64).unwrap()], 200 + k)
            .unwrap();
    }
    let (c, r) = s.run_expect(1, 1);
    assert_ok(&c[0], 16, WcOpcode::Send, 0, q);
    assert_ok(&r[0], 200, WcOpcode::Recv, 4, rq);
    assert_eq!(bytes(&rbuf, 0, 4), b"late");
    assert_eq!(free_recv(s.resp()), 14);
}

#[test]
fn receive_queue_wraps() {
    // 16 entries, about 68 000 messages: the receive ring wraps thousands of times and its
    // 16-bit counter wraps past 0xffff.
    let caps = QpCaps {
        rq_entries: 16,
        ..QpCaps::default()
    };
    let mut s = Setup::pair(caps);
    let rbuf = s.mr(16 * 32, Access::LOCAL_WRITE);
    let rq = s.resp_qpn();
    let mut next = 0u64;
    for round in 0..8000u64 {
        let k = 1 + (round % 16);
        for j in 0..k {
            let slot = (j % 16) as usize;
            s.resp()
                .post_recv(&[rbuf.sge(slot * 32, 32).unwrap()], next + j)
                .unwrap();
        }
        for j in 0..k {
            let v = (next + j).to_le_bytes();
            s.a.send(Payload::Inline(&v), next + j, PostFlags::SIGNALED)
                .unwrap();
        }
        let (c, r) = s.run_expect(k as usize, k as usize);
        for j in 0..k {
            assert_eq!(c[j as usize].cookie, next + j);
            assert_ok(&r[j as usize], next + j, WcOpcode::Recv, 8, rq);
            assert_eq!(
                rbuf.read_u64((j % 16) as usize * 32).unwrap(),
                (next + j).to_le()
            );
        }
        next += k;
        assert_eq!(free_recv(s.resp()), 16);
    }
    assert!(next > 0x1_0000, "{next}");
    assert_eq!(nic(&s.dev).qp_stats(rq).unwrap().recvs, next);
}

/// A forgotten batch (`mem::forget`, safe) that filled the send ring is rung by the next
/// post even when that post is refused for want of room: its signaled writes complete and
/// the room comes back. Refused before it rang, every later post was refused for ever and
/// the batch's writes never completed (a review's finding).
#[test]
fn a_forgotten_full_batch_is_never_rung_by_refused_posts() {
    let mut s = Setup::loopback(QpCaps {
        sq_blocks: 16,
        ..QpCaps::default()
    });
    let mr = s.mr(4096, ALL);
    let mut b = s.a.batch();
    let mut n = 0u64;
    loop {
        let req = Request::Write {
            remote: mr.remote(n as usize).unwrap(),
            data: Payload::Inline(&[1]),
        };
        match b.push(&req, n, PostFlags::SIGNALED) {
            Ok(()) => n += 1,
            Err(Error::QueueFull { .. }) => break,
            Err(e) => panic!("{e}"),
        }
    }
    assert!(n > 0);
    core::mem::forget(b);
    let mut got = Vec::new();
    let mut posted = false;
    for _ in 0..50 {
        match s
            .a
            .write_inline(&[2], mr.remote(1024).unwrap(), 1000, PostFlags::SIGNALED)
        {
            Ok(()) => {
                posted = true;
                break;
            }
            Err(Error::QueueFull { .. }) => {
                s.dev.process();
                got.extend(poll_all(&mut s.cq_a));
            }
            Err(e) => panic!("{e}"),
        }
    }
    s.dev.process();
    got.extend(poll_all(&mut s.cq_a));
    assert_eq!(
        got.len() as u64,
        n + posted as u64,
        "the forgotten batch's {n} signaled writes never completed (posted after: {posted})"
    );
    assert!(posted, "the queue never got room back");
}
