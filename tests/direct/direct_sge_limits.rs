//! Gather and scatter lists at their limits: too many entries, zero-length entries (skipped,
//! not counted), entries of 2 GiB or more, the largest gather list (a 16-block WQE across the
//! ring end), and receive entries reused with fewer buffers than before.

use crate::common;

use blueflame::*;
use common::*;

#[test]
fn too_many_gather_entries_are_refused() {
    let mut s = Setup::pair(QpCaps::default()); // max_send_sge 8
    let src = s.mr(4096, Access::LOCAL_WRITE);
    let dst = s.mr(4096, ALL);
    let nine: Vec<Sge> = (0..9).map(|i| src.sge(i * 16, 4).unwrap()).collect();
    let free = free_send(&mut s.a);
    let e =
        s.a.write(&nine, dst.remote(0).unwrap(), 1, PostFlags::SIGNALED)
            .unwrap_err();
    assert!(matches!(e, Error::TooManySge { n: 9, max: 8 }), "{e:?}");
    let e =
        s.a.read(&nine, dst.remote(0).unwrap(), 1, PostFlags::SIGNALED)
            .unwrap_err();
    assert!(matches!(e, Error::TooManySge { n: 9, max: 8 }), "{e:?}");
    let e =
        s.a.send(Payload::Sgl(&nine), 1, PostFlags::SIGNALED)
            .unwrap_err();
    assert!(matches!(e, Error::TooManySge { n: 9, max: 8 }), "{e:?}");
    let e =
        s.a.write_imm(
            Payload::Sgl(&nine),
            dst.remote(0).unwrap(),
            0,
            1,
            PostFlags::SIGNALED,
        )
        .unwrap_err();
    assert!(matches!(e, Error::TooManySge { n: 9, max: 8 }), "{e:?}");
    assert_eq!(free_send(&mut s.a), free);
    assert_eq!(s.dev.process(), 0);
}

#[test]
fn zero_length_entries_do_not_count() {
    let mut s = Setup::pair(QpCaps::default());
    let src = s.mr(4096, Access::LOCAL_WRITE);
    let data = pattern(4096, 3);
    src.write(0, &data).unwrap();
    let dst = s.mr(4096, ALL);
    let q = s.a.qpn();
    // 8 real entries and 5 empty ones: accepted, and the WQE has 8 data segments.
    let mut sgl = Vec::new();
    let mut want = Vec::new();
    for i in 0..8usize {
        sgl.push(src.sge(i * 100, 0).unwrap());
        sgl.push(src.sge(i * 100 + 10, 5 + i as u32).unwrap());
        want.extend_from_slice(&data[i * 100 + 10..i * 100 + 15 + i]);
    }
    sgl.push(src.sge(0, 0).unwrap()); // 8 real, 9 empty
    let free = free_send(&mut s.a);
    s.a.write(&sgl, dst.remote(64).unwrap(), 1, PostFlags::SIGNALED)
        .unwrap();
    assert_eq!(free - free_send(&mut s.a), bbs(2 + 8));
    // A read scatters over the same kind of list.
    let rd = [
        src.sge(3000, 0).unwrap(),
        src.sge(3000, 10).unwrap(),
        src.sge(3100, 0).unwrap(),
        src.sge(3100, 20).unwrap(),
    ];
    s.a.read(&rd, dst.remote(64).unwrap(), 2, PostFlags::SIGNALED)
        .unwrap();
    let (c, _) = s.run_expect(2, 0);
    assert_ok(&c[0], 1, WcOpcode::RdmaWrite, 0, q);
    assert_ok(&c[1], 2, WcOpcode::RdmaRead, 30, q);
    assert_eq!(bytes(&dst, 64, want.len()), want);
    assert_eq!(bytes(&src, 3000, 10), &want[..10]);
    assert_eq!(bytes(&src, 3100, 20), &want[10..30]);
    // Receives: 4 real entries (max_recv_sge 4) plus empty ones are fine; 5 real are not.
    let rbuf = s.mr(4096, Access::LOCAL_WRITE);
    let rq = s.resp_qpn();
    let e = s
        .resp()
        .post_recv(
            &(0..5)
                .map(|i| rbuf.sge(i * 64, 8).unwrap())
                .collect::<Vec<_>>(),
            9,
        )
        .unwrap_err();
    assert!(matches!(e, Error::TooManySge { n: 5, max: 4 }), "{e:?}");
    assert_eq!(free_recv(s.resp()), 256);
    let r4 = [
        rbuf.sge(0, 4).unwrap(),
        rbuf.sge(500, 0).unwrap(),
        rbuf.sge(100, 4).unwrap(),
        rbuf.sge(200, 4).unwrap(),
        rbuf.sge(600, 0).unwrap(),
        rbuf.sge(300, 100).unwrap(),
    ];
    s.resp().post_recv(&r4, 10).unwrap();
    let msg = pattern(50, 4);
    s.a.send(Payload::Inline(&msg), 3, PostFlags::SIGNALED)
        .unwrap();
    let (c, r) = s.run_expect(1, 1);
    assert_ok(&c[0], 3, WcOpcode::Send, 0, q);
    assert_ok(&r[0], 10, WcOpcode::Recv, 50, rq);
    assert_eq!(bytes(&rbuf, 0, 4), &msg[..4]);
    assert_eq!(bytes(&rbuf, 100, 4), &msg[4..8]);
    assert_eq!(bytes(&rbuf, 200, 4), &msg[8..12]);
    assert_eq!(bytes(&rbuf, 300, 38), &msg[12..]);
    assert_eq!(bytes(&rbuf, 500, 1), [0]);
}

/// The same refusal once the receive queue's room is cached (its first post checked it;
/// the next ones of one entry take the fast path, which must refuse what the general path
/// refuses): an entry of 2 GiB, of 0 bytes in a list of one (posted, as a receive with no
/// entry), and one of 2 GiB less one byte (posted).
#[test]
fn a_receive_of_one_entry_is_checked_on_the_fast_path_too() {
    let mut s = Setup::pair(QpCaps::default());
    let rbuf = s.mr(64, Access::LOCAL_WRITE);
    s.resp().post_recv(&[rbuf.sge(0, 64).unwrap()], 1).unwrap();
    assert_eq!(free_recv(s.resp()), 255);
    let huge = Sge {
        len: 0x8000_0000,
        ..rbuf.sge(0, 64).unwrap()
    };
    let e = s.resp().post_recv(&[huge], 2).unwrap_err();
    assert!(
        matches!(
            e,
            Error::InvalidParameter {
                value: 0x8000_0000,
                ..
            }
        ),
        "{e:?}"
    );
    assert_eq!(free_recv(s.resp()), 255, "nothing posted");
    let empty = Sge {
        len: 0,
        ..rbuf.sge(0, 64).unwrap()
    };
    s.resp().post_recv(&[empty], 3).unwrap();
    assert_eq!(free_recv(s.resp()), 254);
    let big = Sge {
        len: 0x7fff_ffff,
        ..rbuf.sge(0, 64).unwrap()
    };
    s.resp().post_recv(&[big], 4).unwrap();
    assert_eq!(free_recv(s.resp()), 253);
}

#[test]
fn entries_of_2_gib_or_more_are_refused() {
    let mut s = Setup::pair(QpCaps::default());
    let src = s.mr(64, Access::LOCAL_WRITE);
    let dst = s.mr(64, ALL);
    let huge = Sge {
        addr: src.addr(),
        len: 0x8000_0000,
        lkey: src.lkey(),
    };
    let free = free_send(&mut s.a);
    for e in [
        s.a.write(&[huge], dst.remote(0).unwrap(), 1, PostFlags::SIGNALED)
            .unwrap_err(),
        s.a.read(&[huge], dst.remote(0).unwrap(), 1, PostFlags::SIGNALED)
            .unwrap_err(),
        s.a.send(Payload::Sgl(&[huge]), 1, PostFlags::SIGNALED)
            .unwrap_err(),
        s.resp().post_recv(&[huge], 1).unwrap_err(),
    ] {
        assert!(
            matches!(
                e,
                Error::InvalidParameter {
                    value: 0x8000_0000,
                    ..
                }
            ),
            "{e:?}"
        );
    }
    assert_eq!(free_send(&mut s.a), free);
    assert_eq!(free_recv(s.resp()), 256);
    assert_eq!(s.dev.process(), 0);
    // The port's largest message is a legal WQE (it fails at the NIC: the region is 64
    // bytes); between it and 2^31 the port refuses (`a_message_past_the_ports_largest...`).
    let big = Sge {
        len: s.dev.max_message(),
        ..huge
    };
    s.a.write(&[big], dst.remote(0).unwrap(), 2, PostFlags::SIGNALED)
        .unwrap();
    let (c, _) = s.run_expect(1, 0);
    assert_err(&c[0], 2, WcStatus::LocProtErr, 0x04, s.a.qpn());
}

#[test]
fn fifty_two_gather_entries_make_a_14_block_wqe_across_the_ring_end() {
    // 52: RC's most on a ConnectX (rdma-core sizes RC WQEs for a bind's 192 bytes of UMR
    // beside the gather list, in at most 1024 bytes: `mlx5_calc_send_wqe`).
    let caps = QpCaps {
        sq_blocks: 32,
        max_send_sge: 52,
        ..QpCaps::default()
    };
    let mut s = Setup::pair(caps);
    let src = s.mr(8192, Access::LOCAL_WRITE);
    let data = pattern(8192, 7);
    src.write(0, &data).unwrap();
    let dst = s.mr(8192, ALL);
    let q = s.a.qpn();
    for round in 0..20u64 {
        // Shift the producer index by a few blocks each round (one ring for all of them).
        let mut b = s.a.batch();
        for k in 0..(round % 5) {
            b.push(&Request::Nop, 1000 + k, PostFlags::SIGNALED)
                .unwrap();
        }
        b.ring().rung();
        s.run_expect((round % 5) as usize, 0);
        let sgl: Vec<Sge> = (0..52)
            .map(|i| src.sge(i * 128 + round as usize, 1 + i as u32).unwrap())
            .collect();
        let mut want = Vec::new();
        for i in 0..52usize {
            let o = i * 128 + round as usize;
            want.extend_from_slice(&data[o..o + 1 + i]);
        }
        let free = free_send(&mut s.a);
        s.a.write(&sgl, dst.remote(100).unwrap(), round, PostFlags::SIGNALED)
            .unwrap();
        // 2 + 52 = 54 DS = 14 blocks.
        assert_eq!(free - free_send(&mut s.a), 14);
        let (c, _) = s.run_expect(1, 0);
        assert_ok(&c[0], round, WcOpcode::RdmaWrite, 0, q);
        assert_eq!(bytes(&dst, 100, want.len()), want, "round {round}");
        // And read back with a 52-entry scatter list.
        let back = s.mr(4096, Access::LOCAL_WRITE);
        let rsgl: Vec<Sge> = (0..52)
            .map(|i| back.sge(i * 64, 1 + (i as u32 % 30)).unwrap())
            .collect();
        let total: u32 = rsgl.iter().map(|e| e.len).sum();
        s.a.read(
            &rsgl,
            dst.remote(100).unwrap(),
            100 + round,
            PostFlags::SIGNALED,
        )
        .unwrap();
        let (c, _) = s.run_expect(1, 0);
        assert_ok(&c[0], 100 + round, WcOpcode::RdmaRead, total, q);
        let mut at = 0usize;
        for (i, e) in rsgl.iter().enumerate() {
            assert_eq!(
                bytes(&back, i * 64, e.len as usize),
                &want[at..at + e.len as usize]
            );
            at += e.len as usize;
        }
    }
    let st = nic(&s.dev).qp_stats(q).unwrap();
    assert_eq!(
        (st.bf_mismatches, st.bf_violations, st.doorbell_misses),
        (0, 0, 0)
    );
}

#[test]
fn reused_receive_entries_scatter_only_into_their_new_buffers() {
    // 16 receive entries of up to 4 buffers: the first lap posts 4 buffers each, the next
    // laps 1, 2 or 3; a receive must never scatter into a stale buffer of an earlier lap.
    let caps = QpCaps {
        rq_entries: 16,
        ..QpCaps::default()
    };
    let mut s = Setup::pair(caps);
    let rbuf = s.mr(16 * 1024, Access::LOCAL_WRITE);
    let rq = s.resp_qpn();
    for lap in 0..4usize {
        fill(&rbuf, 0xee);
        let nbufs = if lap == 0 { 4 } else { lap };
        for j in 0..16usize {
            let sgl: Vec<Sge> = (0..nbufs)
                .map(|b| rbuf.sge(j * 1024 + b * 256, 16).unwrap())
                .collect();
            s.resp().post_recv(&sgl, (lap * 100 + j) as u64).unwrap();
        }
        for j in 0..16usize {
            let len = 16 * nbufs;
            let msg = pattern(len, (lap * 100 + j) as u64);
            s.a.send(Payload::Inline(&msg), j as u64, PostFlags::SIGNALED)
                .unwrap();
        }
        let (c, r) = s.run_expect(16, 16);
        for j in 0..16usize {
            assert!(c[j].is_ok(), "{:?}", c[j]);
            assert_ok(
                &r[j],
                (lap * 100 + j) as u64,
                WcOpcode::Recv,
                16 * nbufs as u32,
                rq,
            );
            let msg = pattern(16 * nbufs, (lap * 100 + j) as u64);
            for b in 0..4usize {
                let got = bytes(&rbuf, j * 1024 + b * 256, 16);
                if b < nbufs {
                    assert_eq!(got, &msg[b * 16..b * 16 + 16], "lap {lap} entry {j}");
                } else {
                    assert_eq!(got, vec![0xee; 16], "lap {lap} entry {j} stale buffer {b}");
                }
            }
        }
        // One byte more than the new buffers hold is a length error, not a write into the
        // stale buffers.
        if lap == 3 {
            fill(&rbuf, 0xee);
            s.resp()
                .post_recv(&[rbuf.sge(0, 16).unwrap()], 999)
                .unwrap();
            s.a.send(Payload::Inline(&[1u8; 17]), 99, PostFlags::SIGNALED)
                .unwrap();
            let (c, r) = s.run_expect(1, 1);
            assert_err(&c[0], 99, WcStatus::RemInvReqErr, 0x12, s.a.qpn());
            assert_err(&r[0], 999, WcStatus::LocLenErr, 0x01, rq);
            assert_eq!(bytes(&rbuf, 0, 1024), vec![0xee; 1024]);
        }
    }
}

/// A message longer than the port's largest (`max_msg_sz`: the software NIC's, as a
/// ConnectX-6's, is 2^30) is refused before posting, whether one entry (the fast path's
/// form) or several add up to it, on writes, reads and sends: the device would fail it
/// with a local length error and move the QP to error (a review's finding: the crate
/// checked InfiniBand's 2^31 only, and the software NIC failed nothing below it).
#[test]
fn a_message_past_the_ports_largest_is_refused_before_posting() {
    let mut s = Setup::pair(QpCaps::default());
    let max = s.dev.max_message();
    assert_eq!(max, 1 << 30);
    let src = s.mr(4096, Access::LOCAL_WRITE);
    let dst = s.mr(4096, ALL);
    let remote = dst.remote(0).unwrap();
    let sge = |len: u32| Sge {
        addr: src.addr(),
        len,
        lkey: src.lkey(),
    };
    let free = free_send(&mut s.a);
    for sgl in [
        vec![sge(max + 1)],
        vec![sge(max), sge(1)],
        vec![sge(u32::MAX)],
    ] {
        let want = sgl.iter().map(|e| e.len as u64).sum::<u64>();
        let refusals = [
            s.a.write(&sgl, remote, 1, PostFlags::SIGNALED),
            s.a.read(&sgl, remote, 2, PostFlags::SIGNALED),
            s.a.send(Payload::Sgl(&sgl), 3, PostFlags::SIGNALED),
        ];
        for r in refusals {
            match r {
                Err(Error::InvalidParameter { what, value }) => {
                    assert!(what.starts_with("message length"), "{what}");
                    assert_eq!(value, want);
                }
                other => panic!("{} bytes: {other:?}", want),
            }
        }
    }
    assert_eq!(free_send(&mut s.a), free, "nothing posted");
    s.run_expect(0, 0);
    // The largest is posted (and fails on its region's bounds at the device, not its length).
    s.a.write(&[sge(max)], remote, 4, PostFlags::SIGNALED)
        .unwrap();
    let (c, _) = s.run_expect(1, 0);
    assert_eq!(c[0].cookie, 4);
    assert_ne!(c[0].status, WcStatus::LocLenErr);
}

/// A UD QP takes at most 59 gather entries and 940 inline bytes (rdma-core takes 60 and 956,
/// then writes a WQE of 64 DS, which the control segment's 6-bit count cannot say), and
/// posts at those limits; one more inline byte is refused as too long, not as a WQE the
/// encoder cannot write.
#[test]
fn a_ud_qp_posts_at_the_largest_limits_it_was_created_with() {
    let dev = Device::sim_stepped();
    let pd = dev.alloc_pd().unwrap();
    let mr = pd.alloc_mr(4096, Access::LOCAL_WRITE).unwrap();
    let mut cq = dev.create_cq(256).unwrap();
    let caps = QpCaps {
        sq_blocks: 64,
        max_send_sge: 59,
        max_inline: 940,
        ..QpCaps::default()
    };
    for (over, field) in [
        (
            QpCaps {
                max_send_sge: 60,
                ..caps
            },
            "max_send_sge",
        ),
        (
            QpCaps {
                max_inline: 941,
                ..caps
            },
            "max_inline",
        ),
    ] {
        let e = pd.create_ud_qp(&cq, &cq, over, 0x11).unwrap_err();
        assert!(
            matches!(e, Error::InvalidParameter { what, .. } if what.starts_with(field)),
            "{e:?}"
        );
    }
    let mut a = pd.create_ud_qp(&cq, &cq, caps, 0x11).unwrap();
    let b = pd.create_ud_qp(&cq, &cq, QpCaps::default(), 0x22).unwrap();
    let ah = pd.create_ah(b.endpoint()).unwrap();
    let to = b.endpoint();
    let sgl: Vec<Sge> = (0..59).map(|i| mr.sge(i * 8, 8).unwrap()).collect();
    let data = [7u8; 941];
    a.send_to(
        &ah,
        to.qpn,
        to.qkey,
        Payload::Sgl(&sgl),
        1,
        PostFlags::SIGNALED,
    )
    .unwrap();
    a.send_to(
        &ah,
        to.qpn,
        to.qkey,
        Payload::Inline(&data[..940]),
        2,
        PostFlags::SIGNALED,
    )
    .unwrap();
    let e = a
        .send_to(
            &ah,
            to.qpn,
            to.qkey,
            Payload::Inline(&data),
            3,
            PostFlags::SIGNALED,
        )
        .unwrap_err();
    assert!(matches!(e, Error::InlineTooLong { len: 941, .. }), "{e:?}");
    dev.process();
    let mut out = [Completion::default(); 4];
    let n = cq.poll(&mut out);
    let got: Vec<_> = out[..n].iter().map(|c| (c.cookie, c.status)).collect();
    assert_eq!(got, [(1, WcStatus::Success), (2, WcStatus::Success)]);
}
