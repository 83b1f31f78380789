//! Queue depths: what `QpCaps` asks for is what a QP holds, reported in the units it counts.

use crate::common;

use blueflame::*;
use common::*;

#[test]
fn send_depth_is_what_was_asked_on_the_software_nic() {
    let dev = Device::sim_stepped();
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(1024).unwrap();
    let caps = QpCaps::default();
    let mut qp = pd.create_qp(&cq, &cq, caps).unwrap();
    let q = qp.endpoint().unwrap();
    qp.connect(&q).unwrap();
    // 256 blocks; the largest request of the default limits (256 inline bytes: control,
    // remote address and 17 DS of inline data) takes 5 blocks.
    let lim = mlx5::wqe::Limits {
        max_sge: caps.max_send_sge as usize,
        max_inline: caps.max_inline as usize,
    };
    assert_eq!(mlx5::wqe::max_wqe_bbs(&lim), 5);
    assert_eq!(qp.free_send(), 256, "blocks of the ring, all free");
    assert_eq!(qp.send_depth(), 51);
    assert_eq!(qp.recv_depth(), 256);
    let mr = pd.alloc_mr(4096, common::ALL).unwrap();
    let big = [7u8; 256];
    for i in 0..51u64 {
        qp.write_inline(&big, mr.remote(0).unwrap(), i, PostFlags::SIGNALED)
            .unwrap();
    }
    // The 52nd does not fit: 1 block left, counted as such.
    let e = qp
        .write_inline(&big, mr.remote(0).unwrap(), 51, PostFlags::SIGNALED)
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::QueueFull {
                needed: 5,
                free: 1,
                unit: QueueUnit::SendBlocks,
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("send-ring blocks"), "{e}");
    // One-block requests fill the ring to the last block.
    qp.write_inline(&[1], mr.remote(0).unwrap(), 52, PostFlags::SIGNALED)
        .unwrap();
    assert_eq!(free_send(&mut qp), 0);
}

#[test]
fn a_full_receive_queue_counts_receives() {
    let dev = Device::sim_stepped();
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(64).unwrap();
    let caps = QpCaps {
        rq_entries: 16,
        ..QpCaps::default()
    };
    let mut qp = pd.create_qp(&cq, &cq, caps).unwrap();
    assert_eq!(qp.recv_depth(), 16);
    let mr = pd.alloc_mr(4096, common::ALL).unwrap();
    for i in 0..16u64 {
        qp.post_recv(&[mr.sge(0, 64).unwrap()], i).unwrap();
    }
    let e = qp.post_recv(&[mr.sge(0, 64).unwrap()], 16).unwrap_err();
    assert!(
        matches!(
            e,
            Error::QueueFull {
                needed: 1,
                free: 0,
                unit: QueueUnit::Receives,
            }
        ),
        "{e}"
    );
}
