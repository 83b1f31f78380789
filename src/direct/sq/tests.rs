//! Tests of the direct path's send queue over plain memory: the fence a bind arms, errors that
//! write nothing, a crate queue's refusals of other transports and raw binds.

use super::*;
use mlx5::request::{Access, BindMw, MwType, Payload};
use mlx5::wqe::{decode, linearize};

/// A send queue over plain memory (no NIC): the ring's bytes can be read back.
#[repr(C, align(64))]
struct Bf([u8; 512]);

struct Mem {
    ring: Vec<u8>,
    dbrec: [u32; 2],
    bf: Box<Bf>,
}

fn queue(m: &mut Mem) -> SendQueue {
    let raw = raw(m);
    // SAFETY: the ring, record and register live in `m`, longer than the queue.
    unsafe { SendQueue::new(&raw) }.unwrap()
}

/// The rings of `m` as a QP's (0x42, 256-byte BlueFlame halves, 64 bytes inline).
fn raw(m: &mut Mem) -> RawQp {
    RawQp {
        qpn: 0x42,
        sq_buf: m.ring.as_mut_ptr(),
        sq_wqe_cnt: (m.ring.len() / 64) as u32,
        sq_stride: 64,
        rq_buf: core::ptr::null_mut(),
        rq_wqe_cnt: 0,
        rq_stride: 0,
        dbrec: m.dbrec.as_mut_ptr(),
        bf_reg: m.bf.0.as_mut_ptr(),
        bf_size: 256,
        max_inline: 64,
        max_send_sge: 4,
        max_recv_sge: 0,
    }
}

fn mem() -> Mem {
    Mem {
        ring: vec![0; 16 * 64],
        dbrec: [0; 2],
        bf: Box::new(Bf([0; 512])),
    }
}

#[test]
fn a_bind_fences_the_next_request() {
    let mut m = mem();
    let mut sq = queue(&mut m);
    let bind = BindMw {
        mw_rkey: 0x100,
        new_rkey: 0x101,
        mw_type: MwType::Two,
        mr_lkey: 7,
        addr: 0x1000,
        len: 64,
        access: Access::REMOTE_READ,
    };
    sq.post(&Request::BindMw(bind), 1, PostFlags::SIGNALED)
        .unwrap();
    sq.post(&Request::Nop, 2, PostFlags::SIGNALED).unwrap();
    sq.post(&Request::Nop, 3, PostFlags::SIGNALED).unwrap();
    drop(sq);
    let mut sges = [mlx5::Sge::default(); 64];
    let mut lin = [0u8; 1024];
    linearize(&m.ring, 0, 3, &mut lin);
    assert_eq!(decode(&lin, &mut sges).unwrap().flags.fence, Fence::None);
    linearize(&m.ring, 3, 1, &mut lin);
    let nop = decode(&lin[..64], &mut sges).unwrap();
    assert_eq!(
        (nop.request, nop.flags.fence),
        (Request::Nop, Fence::InitiatorSmall)
    );
    linearize(&m.ring, 4, 1, &mut lin);
    assert_eq!(
        decode(&lin[..64], &mut sges).unwrap().flags.fence,
        Fence::None,
        "only the next one"
    );
    // The doorbell record holds the producer index of the last ring.
    assert_eq!(u32::from_be(m.dbrec[1]), 5);
}

/// A fence asked for on the WQE after a memory-key operation keeps the small fence the
/// operation armed (the kernel's `get_fence`: small-and-fence), on the posting path and in a
/// batch: replaced by the plain fence, which waits for reads and atomics only, a send
/// carrying a window's new rkey could leave before the bind took effect (a review's
/// finding; rdma-core's own `IBV_SEND_FENCE` is small-and-fence always).
#[test]
fn an_asked_fence_after_a_key_operation_keeps_the_small_fence() {
    for batch in [false, true] {
        let mut m = mem();
        let mut sq = queue(&mut m);
        let fenced = PostFlags::SIGNALED.fence(Fence::Fence);
        if batch {
            let mut b = sq.batch();
            b.push(
                &Request::LocalInvalidate { rkey: 0x200 },
                1,
                PostFlags::SIGNALED,
            )
            .unwrap();
            b.push(&Request::Nop, 2, fenced).unwrap();
            b.push(&Request::Nop, 3, fenced).unwrap();
            b.ring();
        } else {
            sq.post(
                &Request::LocalInvalidate { rkey: 0x200 },
                1,
                PostFlags::SIGNALED,
            )
            .unwrap();
            sq.post(&Request::Nop, 2, fenced).unwrap();
            sq.post(&Request::Nop, 3, fenced).unwrap();
        }
        drop(sq);
        let mut sges = [mlx5::Sge::default(); 64];
        let mut lin = [0u8; 64];
        // The invalidate takes blocks 0 and 1.
        let first = 2;
        linearize(&m.ring, first, 1, &mut lin);
        let f = decode(&lin, &mut sges).unwrap().flags.fence;
        assert_eq!(f, Fence::SmallAndFence, "batch {batch}");
        linearize(&m.ring, first + 1, 1, &mut lin);
        let f = decode(&lin, &mut sges).unwrap().flags.fence;
        assert_eq!(f, Fence::Fence, "batch {batch}: only the next one");
    }
}

#[test]
fn an_explicit_fence_wins_and_errors_write_nothing() {
    let mut m = mem();
    let mut sq = queue(&mut m);
    let flags = PostFlags::SIGNALED.fence(Fence::SmallAndFence);
    sq.post(
        &Request::LocalInvalidate { rkey: 0x200 },
        1,
        PostFlags::SIGNALED,
    )
    .unwrap();
    sq.post(&Request::Nop, 2, flags).unwrap();
    let before = sq.free_blocks();
    let big = [0u8; 65];
    let remote = mlx5::Remote { addr: 0, rkey: 1 };
    let e = sq.post(
        &Request::Write {
            remote,
            data: mlx5::Payload::Inline(&big),
        },
        3,
        PostFlags::SIGNALED,
    );
    assert!(matches!(e, Err(Error::InlineTooLong { len: 65, max: 64 })));
    assert_eq!(sq.free_blocks(), before);
    drop(sq);
    let mut sges = [mlx5::Sge::default(); 64];
    let mut lin = [0u8; 64];
    linearize(&m.ring, 2, 1, &mut lin);
    assert_eq!(
        decode(&lin, &mut sges).unwrap().flags.fence,
        Fence::SmallAndFence
    );
    assert!(
        m.ring[3 * 64..].iter().all(|&b| b == 0),
        "nothing written after the error"
    );
}

/// Every kind that gathers, through every post function of the direct path (RC post,
/// push and batch; UD; DC post and push), is refused past 2^31 bytes in all with the sum
/// in the error, and nothing is written; exactly 2^31 is a message.
#[test]
fn gathers_past_2_pow_31_are_refused_by_every_post_function() {
    let mut m = mem();
    let mut sq = queue(&mut m);
    let e = |len| mlx5::Sge {
        addr: 0x1000,
        len,
        lkey: 7,
    };
    let remote = mlx5::Remote { addr: 0, rkey: 1 };
    let dest = mlx5::dc::DcAddr {
        av: [0; mlx5::dc::AV_BYTES],
        dctn: 5,
        dc_key: 6,
    };
    let f = PostFlags::SIGNALED;
    for sgl in [[e(0x7fff_ffff), e(2)], [e(0x7fff_ffff), e(0x7fff_ffff)]] {
        let total = sgl.iter().map(|s| s.len as u64).sum::<u64>();
        let data = Payload::Sgl(&sgl);
        let reqs = [
            Request::Write { remote, data },
            Request::WriteImm {
                remote,
                data,
                imm: 1,
            },
            Request::Send { data },
            Request::SendImm { data, imm: 1 },
            Request::SendInv { data, rkey: 1 },
        ];
        let ud = mlx5::wqe::UdSend {
            dgram: mlx5::av::DatagramSeg::ud(&mlx5::av::Av::default(), 1, 2),
            data,
            imm: None,
        };
        let mut refused = vec![sq.post_ud(&ud, 0, f)];
        for req in &reqs {
            refused.push(sq.post(req, 0, f));
            refused.push(sq.push(req, 0, f));
            refused.push(sq.batch().push(req, 0, f));
            if !matches!(req, Request::SendInv { .. }) {
                refused.push(sq.post_dc(&dest, req, 0, f));
                refused.push(sq.push_dc(&dest, req, 0, f));
            }
        }
        for (i, r) in refused.into_iter().enumerate() {
            assert!(
                matches!(r, Err(Error::InvalidParameter { value, .. }) if value == total),
                "{i}: {r:?}"
            );
        }
        assert_eq!(sq.free_blocks(), 16);
    }
    assert!(m.ring.iter().all(|&b| b == 0), "nothing written");
    // 2^31 exactly: a message (it fails at the NIC only for the keys given here).
    let sgl = [e(0x7fff_ffff), e(1)];
    let data = Payload::Sgl(&sgl);
    sq.post(&Request::Write { remote, data }, 1, f).unwrap();
}

/// The queue of one of the crate's UD QPs or DCIs refuses RC requests (and the RC
/// queue UD and DC requests) before anything is written, whatever the entry; the RC
/// queue refuses a raw bind but the crate's bind entry posts it.
#[test]
fn a_crate_queue_refuses_other_transports_and_raw_binds() {
    let mut m = mem();
    let mut sq = queue(&mut m);
    let f = PostFlags::SIGNALED;
    let remote = mlx5::Remote { addr: 0, rkey: 1 };
    let write = Request::Write {
        remote,
        data: Payload::Inline(b"x"),
    };
    let ud = mlx5::wqe::UdSend {
        dgram: mlx5::av::DatagramSeg::ud(&mlx5::av::Av::default(), 1, 2),
        data: Payload::Inline(b"x"),
        imm: None,
    };
    let dest = mlx5::dc::DcAddr {
        av: [0; mlx5::dc::AV_BYTES],
        dctn: 5,
        dc_key: 6,
    };
    for t in [Transport::Ud, Transport::Dci] {
        sq.set_transport(t);
        for r in [
            sq.post(&write, 1, f),
            sq.push(&write, 1, f),
            sq.write_inline(b"x", remote, 1, f),
            sq.batch().push(&Request::Nop, 1, f),
        ] {
            assert!(matches!(r, Err(Error::Unsupported(_))), "{t:?}: {r:?}");
        }
        let other = match t {
            Transport::Ud => sq.post_dc(&dest, &write, 1, f),
            _ => sq.post_ud(&ud, 1, f),
        };
        assert!(matches!(other, Err(Error::Unsupported(_))), "{other:?}");
    }
    sq.set_transport(Transport::Rc);
    assert!(matches!(sq.post_ud(&ud, 1, f), Err(Error::Unsupported(_))));
    let r = sq.post_dc(&dest, &write, 1, f);
    assert!(
        matches!(&r, Err(Error::Unsupported(why)) if why.contains("RC QP")),
        "{r:?}"
    );
    let r = sq.batch().push_dc(&dest, &write, 1, f);
    assert!(
        matches!(&r, Err(Error::Unsupported(why)) if why.contains("RC QP")),
        "{r:?}"
    );
    let bind = BindMw {
        mw_rkey: 0x100,
        new_rkey: 0x101,
        mw_type: MwType::Two,
        mr_lkey: 7,
        addr: 0x1000,
        len: 64,
        access: Access::REMOTE_READ,
    };
    let r = sq.post(&Request::BindMw(bind), 1, f);
    assert!(matches!(r, Err(Error::Unsupported(_))), "{r:?}");
    assert_eq!(sq.free_blocks(), 16);
    assert!(m.ring.iter().all(|&b| b == 0), "nothing written");
    sq.post_window(&Request::BindMw(bind), 2, f).unwrap();
    // A type-1 zero-based bind stays refused (rdma-core's mlx5_bind_mw).
    let zb = BindMw {
        mw_type: MwType::One,
        access: Access::REMOTE_READ | Access::ZERO_BASED,
        ..bind
    };
    let r = sq.post_window(&Request::BindMw(zb), 3, f);
    assert!(matches!(r, Err(Error::InvalidParameter { .. })), "{r:?}");
}

/// A ring, doorbell record or register the queue's own stores would reach misaligned is
/// refused with its address, before anything is claimed; the same memory aligned is taken.
#[test]
fn misaligned_rings_records_and_registers_are_refused() {
    let mut m = mem();
    let base = raw(&mut m);
    let ring = RawQp {
        sq_buf: base.sq_buf.wrapping_add(4),
        ..base
    };
    let dbrec = RawQp {
        dbrec: (base.dbrec as *mut u8).wrapping_add(2).cast(),
        ..base
    };
    let bf = RawQp {
        bf_reg: base.bf_reg.wrapping_add(8),
        ..base
    };
    // 8 bytes in: aligned enough for the 8-byte doorbell of a register without BlueFlame.
    let doorbell_only = RawQp { bf_size: 0, ..bf };
    for (raw, what) in [
        (ring, "send ring"),
        (dbrec, "doorbell record"),
        (bf, "BlueFlame"),
    ] {
        // SAFETY: the memory lives in `m` longer than the call; refused before any use.
        let r = unsafe { SendQueue::new(&raw) };
        assert!(
            matches!(&r, Err(Error::InvalidParameter { what: w, .. }) if w.starts_with(what)),
            "{what}: {:?}",
            r.err()
        );
    }
    // SAFETY: as above; the queues are dropped before `m`.
    unsafe {
        drop(SendQueue::new(&doorbell_only).unwrap());
        drop(SendQueue::new(&base).unwrap());
    }
}

/// The receive queue's constructor refuses a null or misaligned ring or doorbell record as
/// the send queue's does, and takes them aligned.
#[test]
fn the_receive_queue_refuses_null_or_misaligned_rings_and_records() {
    use crate::direct::RecvQueue;
    let mut m = mem();
    let mut ring = Box::new(Bf([0; 512]));
    // The send side's rings as `raw`'s (unused here), a receive ring of 32 16-byte WQEs.
    let base = RawQp {
        rq_buf: ring.0.as_mut_ptr(),
        rq_wqe_cnt: 32,
        rq_stride: 16,
        max_recv_sge: 1,
        ..raw(&mut m)
    };
    let bad = [
        (
            RawQp {
                rq_buf: core::ptr::null_mut(),
                ..base
            },
            "receive ring",
        ),
        (
            RawQp {
                rq_buf: base.rq_buf.wrapping_add(4),
                ..base
            },
            "receive ring",
        ),
        // A stride of 8192 bytes (512 scatter entries, more than a receive's count of
        // entries holds) that no device gives.
        (
            RawQp {
                rq_stride: 8192,
                max_recv_sge: 512,
                ..base
            },
            "receive ring",
        ),
        (
            RawQp {
                dbrec: core::ptr::null_mut(),
                ..base
            },
            "doorbell record",
        ),
        (
            RawQp {
                dbrec: (base.dbrec as *mut u8).wrapping_add(1).cast(),
                ..base
            },
            "doorbell record",
        ),
    ];
    for (raw, what) in bad {
        // SAFETY: refused before any use of the memory.
        let r = unsafe { RecvQueue::new(&raw) };
        assert!(
            matches!(&r, Err(Error::InvalidParameter { what: w, .. }) if w.starts_with(what)),
            "{what}: {:?}",
            r.err()
        );
    }
    // SAFETY: the ring and the record outlive the queue.
    let q = unsafe { RecvQueue::new(&base) }.unwrap();
    assert!(q.is_some());
}

/// With `MLX5_POST_SEND_PREFER_BF=0` only WQEs with inline data are copied with BlueFlame
/// (`post_send_db`'s `inl`): on a UD QP's and a DCI's queue the inline segment comes after
/// the 48-byte datagram segment. Read at the RC offsets, a UD inline send was rung with
/// the 8-byte doorbell and a DC send of a buffer whose DC key has its top bit set was
/// copied (a review's finding).
#[test]
fn blueflame_only_for_inline_data_reads_past_the_datagram_segment() {
    let sge = [mlx5::request::Sge {
        addr: 0x1000,
        len: 8,
        lkey: 3,
    }];
    let dest = mlx5::dc::DcAddr {
        av: [0; mlx5::dc::AV_BYTES],
        dctn: 5,
        dc_key: 0x8000_0000_0000_0006,
    };
    for (t, inline, copied) in [
        (Transport::Ud, true, true),
        (Transport::Ud, false, false),
        (Transport::Dci, true, true),
        (Transport::Dci, false, false),
    ] {
        let mut m = mem();
        let mut sq = queue(&mut m);
        sq.set_transport(t);
        sq.set_blueflame_inline_only(true);
        let data = if inline {
            Payload::Inline(b"12345678")
        } else {
            Payload::Sgl(&sge)
        };
        let r = match t {
            Transport::Ud => {
                let mut av = mlx5::av::Av::default();
                av.set_qkey(0x8000_0001);
                let send = mlx5::wqe::UdSend {
                    dgram: mlx5::av::DatagramSeg::ud(&av, 1, 0x8000_0001),
                    data,
                    imm: None,
                };
                sq.post_ud(&send, 1, PostFlags::SIGNALED)
            }
            _ => sq.post_dc(&dest, &Request::Send { data }, 1, PostFlags::SIGNALED),
        };
        r.unwrap();
        drop(sq);
        let got = m.bf.0[8..64].iter().any(|&b| b != 0);
        assert_eq!(got, copied, "{t:?}, inline {inline}");
        assert_eq!(&m.bf.0[..8], &m.ring[..8], "{t:?}, inline {inline}");
    }
}
