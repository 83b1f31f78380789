//! Doorbells: one per batch, BlueFlame copies for single WQEs that fit, 8-byte doorbells
//! for the rest, `bf_size == 0`, alternation of the two BlueFlame halves, and dropped
//! batches that post nothing.

use crate::common;

use blueflame::raw::SendQueue;
use blueflame::*;
use common::*;
use mlx5::sim::QpStats;

fn stats(s: &Setup) -> QpStats {
    nic(&s.dev).qp_stats(s.a.qpn()).unwrap()
}

/// (doorbells, bf_copies, db_writes, bf_mismatches, bf_violations, doorbell_misses)
fn counts(st: &QpStats) -> (u64, u64, u64, u64, u64, u64) {
    (
        st.doorbells,
        st.bf_copies,
        st.db_writes,
        st.bf_mismatches,
        st.bf_violations,
        st.doorbell_misses,
    )
}

#[test]
fn batch_rings_once_for_n_wqes() {
    let mut s = Setup::pair(QpCaps::default());
    let dst = s.mr(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let src = s.mr(4096, Access::LOCAL_WRITE);
    let data = pattern(4096, 1);
    src.write(0, &data).unwrap();
    let q = s.a.qpn();
    for round in 0..10u64 {
        let before = stats(&s);
        let n = 16u64;
        {
            let mut b = s.a.batch();
            for i in 0..n {
                let cookie = round * 100 + i;
                let off = i as usize * 64;
                if i % 2 == 0 {
                    let msg = pattern(40, cookie);
                    b.push(
                        &Request::Write {
                            remote: dst.remote(off).unwrap(),
                            data: Payload::Inline(&msg),
                        },
                        cookie,
                        PostFlags::SIGNALED,
                    )
                    .unwrap();
                } else {
                    let sgl = [src.sge(off, 30).unwrap(), src.sge(off + 32, 10).unwrap()];
                    b.push(
                        &Request::Write {
                            remote: dst.remote(off).unwrap(),
                            data: Payload::Sgl(&sgl),
                        },
                        cookie,
                        PostFlags::SIGNALED,
                    )
                    .unwrap();
                }
                assert_eq!(b.len(), i as usize + 1);
            }
            // Nothing is rung yet: the NIC sees nothing.
            assert_eq!(nic(&s.dev).process(), 0);
            b.ring().rung();
        }
        let (c, _) = s.run_expect(n as usize, 0);
        for (i, c) in c.iter().enumerate() {
            let cookie = round * 100 + i as u64;
            assert_ok(c, cookie, WcOpcode::RdmaWrite, 0, q);
            let off = i * 64;
            if i % 2 == 0 {
                assert_eq!(bytes(&dst, off, 40), pattern(40, cookie));
            } else {
                let mut want = data[off..off + 30].to_vec();
                want.extend_from_slice(&data[off + 32..off + 42]);
                assert_eq!(bytes(&dst, off, 40), want);
            }
        }
        let after = stats(&s);
        assert_eq!(after.wqes - before.wqes, n);
        // One ring, an 8-byte doorbell (a batch of several WQEs is never BlueFlame-copied).
        assert_eq!(
            (
                after.doorbells - before.doorbells,
                after.db_writes - before.db_writes,
                after.bf_copies - before.bf_copies
            ),
            (1, 1, 0),
            "{after:?}"
        );
        assert_eq!(
            (
                after.bf_mismatches,
                after.bf_violations,
                after.doorbell_misses
            ),
            (0, 0, 0)
        );
    }
}

#[test]
fn batch_of_one_is_a_blueflame_copy_and_empty_batch_rings_nothing() {
    let mut s = Setup::loopback(QpCaps::default());
    let dst = s.mr(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let mut b = s.a.batch();
    assert!(b.is_empty());
    b.push(
        &Request::Write {
            remote: dst.remote(0).unwrap(),
            data: Payload::Inline(b"one"),
        },
        1,
        PostFlags::SIGNALED,
    )
    .unwrap();
    b.ring().rung();
    let (c, _) = s.run_expect(1, 0);
    assert_ok(&c[0], 1, WcOpcode::RdmaWrite, 0, s.a.qpn());
    assert_eq!(counts(&stats(&s)), (1, 1, 0, 0, 0, 0));
    // An empty batch rung: no doorbell at all.
    let b = s.a.batch();
    assert!(b.is_empty());
    b.ring().rung();
    assert_eq!(s.dev.process(), 0);
    s.run_expect(0, 0);
    assert_eq!(counts(&stats(&s)), (1, 1, 0, 0, 0, 0));
    assert_eq!(bytes(&dst, 0, 3), b"one");
}

#[test]
fn dropped_batch_posts_nothing_and_gives_the_space_back() {
    let mut s = Setup::pair(QpCaps::default());
    let dst = s.mr(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    fill(&dst, 0x33);
    let q = s.a.qpn();
    let free = free_send(&mut s.a);
    {
        let mut b = s.a.batch();
        for i in 0..5u64 {
            let msg = pattern(200, i);
            b.push(
                &Request::Write {
                    remote: dst.remote(i as usize * 256).unwrap(),
                    data: Payload::Inline(&msg),
                },
                1000 + i,
                PostFlags::SIGNALED,
            )
            .unwrap();
        }
        assert_eq!(b.len(), 5);
        // Dropped without ringing.
    }
    assert_eq!(free_send(&mut s.a), free);
    assert_eq!(s.dev.process(), 0);
    s.run_expect(0, 0);
    assert_eq!(bytes(&dst, 0, 4096), vec![0x33; 4096]);
    assert_eq!(counts(&stats(&s)), (0, 0, 0, 0, 0, 0));
    assert_eq!(stats(&s).wqes, 0);
    // A single post reuses the rewound slots.
    s.a.write_inline(b"after", dst.remote(0).unwrap(), 7, PostFlags::SIGNALED)
        .unwrap();
    let (c, _) = s.run_expect(1, 0);
    assert_ok(&c[0], 7, WcOpcode::RdmaWrite, 0, q);
    assert_eq!(bytes(&dst, 0, 5), b"after");
    assert_eq!(bytes(&dst, 5, 4091), vec![0x33; 4091]);
    let st = stats(&s);
    assert_eq!(st.wqes, 1);
    assert_eq!(counts(&st), (1, 1, 0, 0, 0, 0));
    assert_eq!(free_send(&mut s.a), free);
    // A dropped batch of unsignaled WQEs does not count toward completion moderation
    // either: after it, 128 unsignaled blocks (half the ring) still go unsignaled, so
    // nothing retires until a signaled WQE completes.
    {
        let mut b = s.a.batch();
        for i in 0..100u64 {
            b.push(&Request::Nop, i, PostFlags::UNSIGNALED).unwrap();
        }
    }
    assert_eq!(free_send(&mut s.a), free);
    for i in 0..128u64 {
        s.a.post(&Request::Nop, 2000 + i, PostFlags::UNSIGNALED)
            .unwrap();
    }
    s.run_expect(0, 0);
    assert_eq!(free_send(&mut s.a), free - 128);
    s.a.post(&Request::Nop, 3000, PostFlags::SIGNALED).unwrap();
    let (c, _) = s.run_expect(1, 0);
    assert_ok(&c[0], 3000, WcOpcode::Nop, 0, q);
    assert_eq!(free_send(&mut s.a), free);
    assert_eq!(stats(&s).wqes, 1 + 128 + 1);
}

#[test]
fn batch_push_error_keeps_earlier_requests() {
    let caps = QpCaps {
        sq_blocks: 16,
        ..QpCaps::default()
    };
    let mut s = Setup::loopback(caps);
    let dst = s.mr(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let big = pattern(200, 9);
    {
        let mut b = s.a.batch();
        for i in 0..4u64 {
            b.push(
                &Request::Write {
                    remote: dst.remote(i as usize * 256).unwrap(),
                    data: Payload::Inline(&big),
                },
                i,
                PostFlags::SIGNALED,
            )
            .unwrap();
        }
        let e = b.push(&Request::Nop, 4, PostFlags::SIGNALED).unwrap_err();
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
        let e = b
            .push(
                &Request::Write {
                    remote: dst.remote(0).unwrap(),
                    data: Payload::Inline(&[0u8; 257]),
                },
                5,
                PostFlags::SIGNALED,
            )
            .unwrap_err();
        assert!(
            matches!(e, Error::InlineTooLong { len: 257, max: 256 }),
            "{e:?}"
        );
        assert_eq!(b.len(), 4);
        b.ring().rung();
    }
    let (c, _) = s.run_expect(4, 0);
    for (i, c) in c.iter().enumerate() {
        assert_ok(c, i as u64, WcOpcode::RdmaWrite, 0, s.a.qpn());
        assert_eq!(bytes(&dst, i * 256, 200), big);
    }
    assert_eq!(counts(&stats(&s)), (1, 0, 1, 0, 0, 0));
}

/// Single posts, each followed by a NIC pass, with a given BlueFlame size; returns stats.
fn single_posts(bf_size: u32, inline_len: usize, n: u64) -> QpStats {
    let caps = QpCaps {
        bf_size,
        max_inline: 512,
        ..QpCaps::default()
    };
    let mut s = Setup::pair(caps);
    let dst = s.mr(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let q = s.a.qpn();
    for i in 0..n {
        let msg = pattern(inline_len, i);
        s.a.write_inline(&msg, dst.remote(0).unwrap(), i, PostFlags::SIGNALED)
            .unwrap();
        let (c, _) = s.run_expect(1, 0);
        assert_ok(&c[0], i, WcOpcode::RdmaWrite, 0, q);
        assert_eq!(bytes(&dst, 0, inline_len), msg);
    }
    let st = stats(&s);
    assert_eq!(st.wqes, n);
    // Consecutive rings alternate the register's halves (rdma-core `bf->offset ^=
    // bf->buf_size`), on the fast path's ring too (no test looked before: a ring that never
    // flipped the half went unseen).
    assert_eq!(st.bf_out_of_turn, 0, "{st:?}");
    st
}

#[test]
fn blueflame_copy_for_each_single_post() {
    // 8 bytes: 1 block; 100 bytes: 2 + 7 DS = 3 blocks; 236 bytes: 2 + 15 = 17 DS = 5 blocks
    // is too big; 220 bytes: 2 + 14 = 16 DS = 4 blocks = 256 bytes fits exactly.
    for len in [8usize, 100, 220] {
        let st = single_posts(256, len, 40);
        assert_eq!(counts(&st), (40, 40, 0, 0, 0, 0), "{len} bytes: {st:?}");
    }
}

#[test]
fn wqe_bigger_than_bf_size_rings_the_8_byte_doorbell() {
    for len in [221usize, 300, 512] {
        let st = single_posts(256, len, 20);
        assert_eq!(counts(&st), (20, 0, 20, 0, 0, 0), "{len} bytes: {st:?}");
    }
}

#[test]
fn bf_size_zero_only_rings_doorbells() {
    for len in [0usize, 8, 100, 300] {
        let st = single_posts(0, len, 20);
        assert_eq!(counts(&st), (20, 0, 20, 0, 0, 0), "{len} bytes: {st:?}");
    }
}

#[test]
fn bf_size_64() {
    // 28 bytes: 2 + 2 DS = 1 block: copied; 29 bytes: 2 blocks: doorbell.
    let st = single_posts(64, 28, 20);
    assert_eq!(counts(&st), (20, 20, 0, 0, 0, 0), "{st:?}");
    let st = single_posts(64, 29, 20);
    assert_eq!(counts(&st), (20, 0, 20, 0, 0, 0), "{st:?}");
}

#[test]
fn mixed_sizes_alternate_without_mismatch() {
    let mut s = Setup::loopback(QpCaps {
        sq_blocks: 16,
        ..QpCaps::default()
    });
    let dst = s.mr(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let sizes = [8usize, 256, 100, 0, 220, 221, 44, 45, 12, 13];
    let mut copies = 0;
    let mut dbs = 0;
    for i in 0..500u64 {
        let len = sizes[i as usize % sizes.len()];
        let msg = pattern(len, i);
        s.a.write_inline(&msg, dst.remote(100).unwrap(), i, PostFlags::SIGNALED)
            .unwrap();
        if bbs(2 + inline_ds(len)) * 64 <= 256 {
            copies += 1;
        } else {
            dbs += 1;
        }
        let (c, _) = s.run_expect(1, 0);
        assert_eq!(c[0].cookie, i);
        assert!(c[0].is_ok());
        assert_eq!(bytes(&dst, 100, len), msg);
    }
    assert_eq!(counts(&stats(&s)), (500, copies, dbs, 0, 0, 0));
}

/// Several rings between two NIC passes: each one is a doorbell the NIC must accept, and
/// none of them is a BlueFlame mismatch.
#[test]
fn several_rings_between_nic_passes() {
    let mut s = Setup::loopback(QpCaps::default());
    let dst = s.mr(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let q = s.a.qpn();
    // Two single posts (BlueFlame copies into half 0, then half 1), one NIC pass.
    s.a.write_inline(b"first", dst.remote(0).unwrap(), 1, PostFlags::SIGNALED)
        .unwrap();
    s.a.write_inline(b"second", dst.remote(64).unwrap(), 2, PostFlags::SIGNALED)
        .unwrap();
    let (c, _) = s.run_expect(2, 0);
    assert_eq!((c[0].cookie, c[1].cookie), (1, 2));
    // Now a batch: an 8-byte doorbell into half 0, which still holds the first copy.
    {
        let mut b = s.a.batch();
        for i in 0..2u64 {
            b.push(
                &Request::Write {
                    remote: dst.remote(128 + 64 * i as usize).unwrap(),
                    data: Payload::Inline(b"batched"),
                },
                3 + i,
                PostFlags::SIGNALED,
            )
            .unwrap();
        }
        b.ring().rung();
    }
    let (c, _) = s.run_expect(2, 0);
    assert_eq!((c[0].cookie, c[1].cookie), (3, 4));
    assert_eq!(bytes(&dst, 192, 7), b"batched");
    let st = nic(&s.dev).qp_stats(q).unwrap();
    assert_eq!(st.wqes, 4);
    // The driver rang correctly every time: no mismatch, violation or miss.
    assert_eq!(
        (st.bf_mismatches, st.bf_violations, st.doorbell_misses),
        (0, 0, 0),
        "{st:?}"
    );
}

/// Below the `Qp` wrapper: a send queue over the raw rings of a software QP, so the
/// BlueFlame register itself can be read after each ring (before the NIC looks at it).
#[test]
fn blueflame_halves_alternate_and_carry_the_whole_wqe() {
    let nic = mlx5::sim::Nic::new();
    let pd = nic.alloc_pd();
    let raw_cq = nic.create_cq(256, 64).unwrap();
    let caps = mlx5::sim::QpCaps::default();
    let raw = nic.create_qp(pd, raw_cq.cqn, raw_cq.cqn, caps).unwrap();
    nic.init_qp(raw.qpn).unwrap();
    nic.connect(raw.qpn, nic.path_to(raw.qpn)).unwrap();
    let mr = nic
        .alloc_mr(pd, 4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    // SAFETY: the QP's rings live until `nic` is dropped, after `sq`; nothing else posts.
    let mut sq = unsafe { SendQueue::new(&raw) }.unwrap();
    let bf = raw.bf_size as usize;
    let read_reg = |off: usize, len: usize| {
        let mut v = vec![0u8; len];
        // SAFETY: the register holds 2 * bf_size bytes (plus slack) for the QP's lifetime.
        unsafe { core::ptr::copy_nonoverlapping(raw.bf_reg.add(off), v.as_mut_ptr(), len) };
        v
    };
    let read_ring = |block: u32, blocks: u32| {
        let mut v = Vec::new();
        for i in 0..blocks {
            let b = ((block + i) % raw.sq_wqe_cnt) as usize;
            let mut blk = [0u8; 64];
            // SAFETY: block `b` lies inside the send ring of sq_wqe_cnt 64-byte blocks.
            unsafe { core::ptr::copy_nonoverlapping(raw.sq_buf.add(b * 64), blk.as_mut_ptr(), 64) };
            v.extend_from_slice(&blk);
        }
        v
    };
    let mut pi = 0u32;
    for k in 0..40u32 {
        let len = [8usize, 100, 200, 40][k as usize % 4];
        let blocks = bbs(2 + inline_ds(len));
        let msg = pattern(len, k as u64);
        sq.post(
            &Request::Write {
                remote: Remote {
                    addr: mr.addr,
                    rkey: mr.rkey,
                },
                data: Payload::Inline(&msg),
            },
            k as u64,
            PostFlags::SIGNALED,
        )
        .unwrap();
        // The k-th ring used half k % 2, and carries the WQE exactly as it is in the ring.
        let half = (k as usize % 2) * bf;
        let wqe = read_ring(pi, blocks);
        assert_eq!(read_reg(half, blocks as usize * 64), wqe, "ring {k}");
        // The control segment names this WQE: producer index and QPN.
        let ctrl = u32::from_be_bytes(wqe[0..4].try_into().unwrap());
        assert_eq!((ctrl >> 8) & 0xffff, pi & 0xffff);
        assert_eq!(ctrl & 0xff, 0x08); // RDMA write
        let qpn_ds = u32::from_be_bytes(wqe[4..8].try_into().unwrap());
        assert_eq!(qpn_ds >> 8, raw.qpn);
        assert_eq!(qpn_ds & 0x3f, 2 + inline_ds(len) as u32);
        // The doorbell record holds the new producer index.
        // SAFETY: the record is two aligned big-endian words that live with the QP.
        let rec = unsafe { raw.dbrec.add(1).read_volatile() };
        assert_eq!(u32::from_be(rec), (pi + blocks) & 0xffff);
        pi += blocks;
        assert_eq!(nic.process(), 1);
    }
    let st = nic.qp_stats(raw.qpn).unwrap();
    assert_eq!(counts(&st), (40, 40, 0, 0, 0, 0), "{st:?}");
    assert_eq!(st.wqes, 40);
    drop(sq);
}

/// A batch forgotten (`mem::forget`, which is safe) leaves WQEs written but not rung: the
/// next post rings them with its own (an 8-byte doorbell naming the newest WQE, as
/// rdma-core rings more than one), never a BlueFlame copy of its block alone, and nothing
/// is rung again later. Before, the next post's fast path rang its own block and the next
/// batch rang the forgotten WQE's block after it: a doorbell index that went backwards (a
/// review's finding).
#[test]
fn a_forgotten_batch_is_rung_by_the_next_post_and_never_again() {
    let nic = mlx5::sim::Nic::new();
    let pd = nic.alloc_pd();
    let raw_cq = nic.create_cq(256, 64).unwrap();
    let raw = nic
        .create_qp(pd, raw_cq.cqn, raw_cq.cqn, mlx5::sim::QpCaps::default())
        .unwrap();
    nic.init_qp(raw.qpn).unwrap();
    nic.connect(raw.qpn, nic.path_to(raw.qpn)).unwrap();
    let mr = nic
        .alloc_mr(pd, 4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    // SAFETY: the QP's rings live until `nic` is dropped, after `sq`; nothing else posts.
    let mut sq = unsafe { SendQueue::new(&raw) }.unwrap();
    let bf = raw.bf_size as usize;
    // The first 4 bytes written to a half of the register: a control segment's first word
    // (the WQE index in bits 8..24).
    let word = |off: usize| {
        // SAFETY: the register holds 2 * bf_size bytes while the QP lives.
        u32::from_be(unsafe { (raw.bf_reg.add(off) as *const u32).read_volatile() })
    };
    let remote = Remote {
        addr: mr.addr,
        rkey: mr.rkey,
    };
    let msg = [7u8; 8];
    let mut b = sq.batch();
    b.push(
        &Request::Write {
            remote,
            data: Payload::Inline(&msg),
        },
        0,
        PostFlags::SIGNALED,
    )
    .unwrap();
    core::mem::forget(b);
    // An inline send, a one-block fast path's request: with the batch's WQE it is rung
    // for both, naming WQE 1.
    let send = Request::Send {
        data: Payload::Inline(&msg),
    };
    sq.post(&send, 1, PostFlags::SIGNALED).unwrap();
    assert_eq!((word(0) >> 8) & 0xffff, 1, "{:#010x}", word(0));
    let before = word(bf);
    // Nothing new: nothing rung.
    sq.batch().ring();
    assert_eq!(word(bf), before, "rung again: {:#010x}", word(bf));
    // The fast paths are on again: the next send is its own BlueFlame copy, on the other
    // half, naming WQE 2.
    sq.post(&send, 2, PostFlags::SIGNALED).unwrap();
    assert_eq!((word(bf) >> 8) & 0xffff, 2, "{:#010x}", word(bf));
    drop(sq);
}
