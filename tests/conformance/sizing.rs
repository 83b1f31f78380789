//! The guide's CQ sizing rule ("Sizing queues and CQs"): a CQ of at least the sum, over the
//! QPs sending on it, of each one's send depth in blocks, its longest request's blocks and
//! one never refuses a post with `CqFull` (each queue keeps that tail back so that its last
//! request before a refusal is signaled; a review found the rule said the sum of the depths
//! alone, which a CQ of two full rings broke).

use blueflame::*;

fn caps(sq: u32) -> QpCaps {
    QpCaps {
        sq_blocks: sq,
        rq_entries: 0,
        max_inline: 28,
        ..QpCaps::default()
    }
}

/// Each send queue of the direct path holds at most its ring plus its longest WQE's blocks
/// plus one: two QPs on a CQ of 2 x (16 + 4), the first refused for a full ring.
#[test]
fn a_cq_of_the_rings_and_their_tails_never_refuses() {
    // max_send_sge 8, max_inline 28: the longest WQE takes 3 blocks, the tail 4.
    let (k, e) = {
        let dev = Device::sim_stepped();
        let pd = dev.alloc_pd().unwrap();
        let cq = dev.create_cq(40).unwrap();
        let mr = pd
            .alloc_mr(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
            .unwrap();
        let mut a = pd.create_qp(&cq, &cq, caps(16)).unwrap();
        let mut b = pd.create_qp(&cq, &cq, caps(16)).unwrap();
        let (qa, qb) = (a.endpoint().unwrap(), b.endpoint().unwrap());
        a.connect(&qa).unwrap();
        b.connect(&qb).unwrap();
        for _ in 0..16 {
            a.write_inline(&[1], mr.remote(0).unwrap(), 1, PostFlags::UNSIGNALED)
                .unwrap();
        }
        // Refused for a full ring, with a request of 3 blocks.
        let sgl: Vec<Sge> = (0..8).map(|i| mr.sge(i * 8, 8).unwrap()).collect();
        let e = a
            .write(&sgl, mr.remote(0).unwrap(), 1, PostFlags::UNSIGNALED)
            .unwrap_err();
        assert!(matches!(e, Error::QueueFull { .. }), "{e}");
        let mut k = 0;
        loop {
            match b.write_inline(&[1], mr.remote(0).unwrap(), 1, PostFlags::UNSIGNALED) {
                Ok(()) => k += 1,
                Err(e) => break (k, e),
            }
        }
    };
    assert!(matches!(e, Error::QueueFull { .. }), "B after {k}: {e}");
    assert_eq!(k, 16);
}

/// A queue refused `QueueFull` for a WQE of k blocks takes k more CQ entries than its ring
/// and tail (`top_up`'s `.max(need)`): three QPs on a CQ of 3 x (16 + 4).
#[test]
fn a_queue_full_refusal_takes_no_cq_entries_beyond_ring_and_tail() {
    let dev = Device::sim_stepped();
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(60).unwrap();
    let mr = pd
        .alloc_mr(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    let mut qps: Vec<Qp> = (0..3)
        .map(|_| pd.create_qp(&cq, &cq, caps(16)).unwrap())
        .collect();
    for qp in &mut qps {
        let n = qp.endpoint().unwrap();
        qp.connect(&n).unwrap();
    }
    let sgl: Vec<Sge> = (0..8).map(|i| mr.sge(i * 8, 8).unwrap()).collect();
    for qp in &mut qps[..2] {
        for _ in 0..16 {
            qp.write_inline(&[1], mr.remote(0).unwrap(), 1, PostFlags::UNSIGNALED)
                .unwrap();
        }
        let e = qp
            .write(&sgl, mr.remote(0).unwrap(), 1, PostFlags::UNSIGNALED)
            .unwrap_err();
        assert!(matches!(e, Error::QueueFull { .. }), "{e}");
    }
    let b = &mut qps[2];
    let mut k = 0;
    let e = loop {
        match b.write_inline(&[1], mr.remote(0).unwrap(), 1, PostFlags::UNSIGNALED) {
            Ok(()) => k += 1,
            Err(e) => break e,
        }
    };
    println!("third QP: {k} posts, then {e}");
    assert!(
        matches!(e, Error::QueueFull { .. }),
        "third QP after {k} posts: {e}"
    );
}
