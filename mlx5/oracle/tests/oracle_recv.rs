//! Receive WQEs: rdma-core's `mlx5_post_recv` (qp.c) on a memory-backed receive queue and
//! `mlx5_post_srq_recv` (srq.c) on a memory-backed SRQ whose buffer rdma-core's own
//! `mlx5_alloc_srq_buf` laid out, against the crate's `recv::encode_recv` and `srq`
//! (geometry, free-list links, SRQ WQEs).
#![allow(missing_docs)]

use mlx5::recv::encode_recv;
use mlx5::Sge;
use mlx5_oracle::{skip_or_fail, IbvSge, OracleQp, OracleSrq, QpKind};
use proptest::prelude::*;

const EINVAL: i32 = 22;

fn ibv(s: &[Sge]) -> Vec<IbvSge> {
    s.iter().copied().map(IbvSge::from).collect()
}

fn pattern(i: usize) -> u8 {
    (i as u8).wrapping_mul(29) ^ 0x3c
}

/// Posts `sgl` through rdma-core and the crate into receive entry `head % wqe_cnt` of two
/// queues of the same pattern; both entries must be equal, as must rdma-core's head and
/// doorbell record.
fn check_rq(q: &mut OracleQp, mirror: &mut [u8], stride: usize, wqe_cnt: usize, sgl: &[Sge]) {
    let head = q.rq_head() as usize;
    let rc = q.post_recv(head as u64, &ibv(sgl));
    assert_eq!(rc, 0, "mlx5_post_recv refused {sgl:?}");
    let at = head % wqe_cnt * stride;
    let n = encode_recv(sgl, &mut mirror[at..at + stride]).expect("the crate encodes it");
    assert_eq!(n, sgl.iter().filter(|s| s.len != 0).count());
    assert_eq!(
        &q.rq_buf()[at..at + stride],
        &mirror[at..at + stride],
        "receive entry {} of {sgl:?} (stride {stride})",
        head % wqe_cnt
    );
    assert_eq!(q.rq_head() as usize, head + 1);
    assert_eq!(q.rq_dbrec() as usize, (head + 1) & 0xffff);
}

fn sge(i: usize, len: u32) -> Sge {
    Sge {
        addr: 0x1000 * i as u64 + 3,
        len,
        lkey: 0x100 + i as u32,
    }
}

#[test]
fn rq_entries_match_mlx5_post_recv() {
    if !skip_or_fail("rq_entries_match_mlx5_post_recv") {
        return;
    }
    for max_gs in [1usize, 2, 3, 4, 5, 8, 16, 64] {
        let mut q = OracleQp::new(QpKind::Rc, 7, 16, 0, 1);
        let stride = q.setup_rq(8, max_gs);
        let cap = stride / 16;
        let fill: Vec<u8> = (0..8 * stride).map(pattern).collect();
        q.rq_buf_mut().copy_from_slice(&fill);
        let mut mirror = fill.clone();
        for n in 0..=cap {
            // n entries, all used; then the same with every other one empty.
            let full: Vec<Sge> = (0..n).map(|i| sge(i, 1 + i as u32 * 1000)).collect();
            check_rq(&mut q, &mut mirror, stride, 8, &full);
            let holes: Vec<Sge> = (0..n)
                .map(|i| sge(i, if i % 2 == 0 { 0 } else { 0x7fff_ffff }))
                .collect();
            check_rq(&mut q, &mut mirror, stride, 8, &holes);
        }
        assert_eq!(q.rq_buf(), &mirror[..]);
    }
}

/// More entries than the stride holds: refused by both. A list whose empty entries make it
/// longer than `max_gs` while its used entries fit: rdma-core refuses it (it counts
/// `num_sge`), the crate's encoder takes it (it counts what it writes). A known difference,
/// kept visible here: the driver must check the list length itself if it wants rdma-core's
/// answer.
#[test]
fn rq_refusals_against_mlx5_post_recv() {
    if !skip_or_fail("rq_refusals_against_mlx5_post_recv") {
        return;
    }
    let mut q = OracleQp::new(QpKind::Rc, 7, 16, 0, 1);
    let stride = q.setup_rq(4, 4);
    let over: Vec<Sge> = (0..5).map(|i| sge(i, 8)).collect();
    assert_eq!(q.post_recv(1, &ibv(&over)), EINVAL);
    assert_eq!(encode_recv(&over, &mut vec![0; stride]), None);
    let mut padded: Vec<Sge> = (0..4).map(|i| sge(i, 8)).collect();
    padded.push(sge(9, 0));
    assert_eq!(q.post_recv(2, &ibv(&padded)), EINVAL);
    assert_eq!(encode_recv(&padded, &mut vec![0; stride]), Some(4));
    assert_eq!(q.rq_head(), 0, "nothing posted");
}

proptest! {
    #[test]
    fn random_receives_match_mlx5_post_recv(
        max_gs in 1usize..=16,
        lists in prop::collection::vec(prop::collection::vec((any::<u64>(), prop_oneof![Just(0u32), 1u32..=0x7fff_ffff], any::<u32>()), 0..=16), 1..20),
    ) {
        if !skip_or_fail("random_receives_match_mlx5_post_recv") {
            return Ok(());
        }
        let mut q = OracleQp::new(QpKind::Rc, 7, 16, 0, 1);
        let stride = q.setup_rq(4, max_gs);
        let mut mirror = vec![0u8; 4 * stride];
        for l in lists {
            let sgl: Vec<Sge> = l.into_iter().take(stride / 16)
                .map(|(addr, len, lkey)| Sge { addr, len, lkey }).collect();
            check_rq(&mut q, &mut mirror, stride, 4, &sgl);
        }
    }
}

/// rdma-core's SRQ geometry (`mlx5_alloc_srq_buf`): a 16-byte next segment then `max_gs`
/// scatter entries, the stride rounded up to a power of two (at least 32 bytes) and
/// `max_gs` raised to what it holds; a free list linking every WQE to the next.
#[test]
fn srq_geometry_of_mlx5_alloc_srq_buf() {
    if !skip_or_fail("srq_geometry_of_mlx5_alloc_srq_buf") {
        return;
    }
    for (max_gs, shift, gs) in [
        (0u32, 5, 1),
        (1, 5, 1),
        (2, 6, 3),
        (3, 6, 3),
        (4, 7, 7),
        (7, 7, 7),
        (8, 8, 15),
        (16, 9, 31),
    ] {
        let s = OracleSrq::new(15, max_gs);
        let g = s.geometry();
        assert_eq!((g.wqe_shift, g.max_gs), (shift, gs), "max_gs {max_gs}");
        // 15 receives: a main queue of 16 (one WQE always free) and a wait queue after it.
        assert_eq!((g.head, g.tail, g.nwqes), (0, 15, 16));
        assert_eq!(g.max, 32);
        for i in 0..15usize {
            let next = &s.buf()[(i << shift) + 2..(i << shift) + 4];
            assert_eq!(
                u16::from_be_bytes([next[0], next[1]]) as usize,
                i + 1,
                "link {i}"
            );
        }
    }
}

/// `mlx5_post_srq_recv`: the scatter entries after the next segment, against the crate's
/// `srq::encode_srq_recv` into the same WQE; the next segment untouched; the counter in the
/// doorbell record. rdma-core's SRQ writes empty entries as they are (byte count 0), unlike
/// its receive queue and the crate's encoder, which skip them: lists here have no empty
/// entries, and `srq_empty_entries_are_written_by_rdma_core` keeps the difference visible.
#[test]
fn srq_entries_match_mlx5_post_srq_recv() {
    if !skip_or_fail("srq_entries_match_mlx5_post_srq_recv") {
        return;
    }
    for max_gs in [1u32, 3, 4, 7, 8] {
        let mut s = OracleSrq::new(15, max_gs);
        let g = s.geometry();
        let stride = 1usize << g.wqe_shift;
        for k in 0..15usize {
            let n = k % (g.max_gs as usize + 1);
            let sgl: Vec<Sge> = (0..n).map(|i| sge(i + k, 1 + (k * 7 + i) as u32)).collect();
            let before = s.buf().to_vec();
            let head = s.geometry().head as usize;
            assert_eq!(s.post_recv(k as u64, &ibv(&sgl)), 0);
            let at = head * stride;
            let mut want = before[at..at + stride].to_vec();
            mlx5::srq::encode_srq_recv(&sgl, &mut want).expect("fits");
            assert_eq!(
                &s.buf()[at..at + stride],
                &want[..],
                "SRQ WQE {head} of {sgl:?}"
            );
            let g2 = s.geometry();
            assert_eq!(g2.counter as usize, k + 1);
            assert_eq!(g2.dbrec as usize, k + 1);
            assert_eq!(g2.head as usize, head + 1, "next WQE from the free list");
        }
        // The 16th receive: the main queue is full (one WQE stays free).
        let g = s.geometry();
        assert_eq!((g.head, g.tail), (15, 15));
    }
}

/// rdma-core's SRQ post writes an empty entry as it is (byte count 0), unlike its own
/// receive-queue post and the crate's `encode_srq_recv`, which skip it. Kept visible: the
/// crate's choice is rdma-core's receive queue's.
#[test]
fn srq_empty_entries_are_written_by_rdma_core() {
    if !skip_or_fail("srq_empty_entries_are_written_by_rdma_core") {
        return;
    }
    let mut s = OracleSrq::new(3, 3);
    let sgl = [sge(1, 8), sge(2, 0), sge(3, 16)];
    assert_eq!(s.post_recv(1, &ibv(&sgl)), 0);
    let w = &s.buf()[..64];
    assert_eq!(
        &w[32..36],
        &[0, 0, 0, 0],
        "rdma-core: the empty entry stays, byte count 0"
    );
    let mut crate_wqe = w.to_vec();
    assert_eq!(mlx5::srq::encode_srq_recv(&sgl, &mut crate_wqe), Some(2));
    assert_eq!(
        &crate_wqe[32..36],
        &16u32.to_be_bytes(),
        "the crate: skipped"
    );
}

/// The SRQ geometry the crate computes (`mlx5::srq`) against the one rdma-core's
/// `mlx5_alloc_srq_buf` chose, for every scatter limit the crate takes.
#[test]
fn srq_geometry_matches_mlx5_alloc_srq_buf() {
    if !skip_or_fail("srq_geometry_matches_mlx5_alloc_srq_buf") {
        return;
    }
    for max_sge in 0..=31u32 {
        for max_wr in [1u32, 2, 3, 15, 16, 100, 1000] {
            let s = OracleSrq::new(max_wr, max_sge);
            let g = s.geometry();
            let stride = mlx5::srq::srq_stride(max_sge).expect("31 entries or fewer");
            assert_eq!(stride, 1 << g.wqe_shift, "stride for {max_sge} entries");
            assert_eq!(mlx5::srq::srq_max_sge(stride), g.max_gs as u32, "max_gs");
            assert_eq!(
                mlx5::srq::srq_entries(max_wr),
                g.nwqes,
                "entries for {max_wr}"
            );
        }
    }
    assert_eq!(mlx5::srq::srq_stride(32), None);
}

/// The crate's `init_links` against rdma-core's free list (`set_srq_buf_ll`) over the main
/// queue, with the next segments' other bytes. rdma-core leaves the tail's
/// `next_wqe_index` at 0 (it never links it: the tail is never posted); the crate links it
/// to `cnt`, which is never followed either: that one field is masked.
#[test]
fn srq_links_match_set_srq_buf_ll() {
    if !skip_or_fail("srq_links_match_set_srq_buf_ll") {
        return;
    }
    for (max_wr, max_sge) in [(1u32, 1u32), (15, 3), (16, 7), (100, 0)] {
        let s = OracleSrq::new(max_wr, max_sge);
        let g = s.geometry();
        let stride = 1usize << g.wqe_shift;
        let main = g.nwqes as usize * stride;
        let mut ring = vec![0u8; main];
        mlx5::srq::init_links(&mut ring, stride);
        let mut theirs = s.buf()[..main].to_vec();
        let tail = g.tail as usize * stride;
        theirs[tail + 2..tail + 4].copy_from_slice(&ring[tail + 2..tail + 4]);
        assert_eq!(ring, theirs, "max_wr {max_wr} max_sge {max_sge}");
        assert_eq!(
            mlx5::srq::next_index(&s.buf()[tail..]),
            0,
            "rdma-core's tail link"
        );
    }
}
