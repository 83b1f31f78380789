//! Tests of the mlx5dv binding: ring descriptions and address vectors made from what the
//! library returns, the symbols' versions, the choice of data path.

use super::*;
use std::ptr::null_mut;

/// What `mlx5dv_init_obj(MLX5DV_OBJ_AH)` returns: a pointer to the AV inside the
/// provider's `mlx5_ah` (here the bytes `mlx5_create_ah` writes for a global InfiniBand
/// address, as `mlx5::av::Av::from_attr` makes them, which the oracle checks against
/// rdma-core's own function).
#[test]
fn address_vector_from_the_library() {
    use mlx5::av::{Av, AvAttr, AvLink, GrhAttr};
    let made = Av::from_attr(&AvAttr {
        link: AvLink::Ib {
            dlid: 0x21,
            src_path_bits: 1,
            grh: Some(GrhAttr {
                dgid: [0xfe; 16],
                flow_label: 7,
                sgid_index: 2,
                hop_limit: 9,
                traffic_class: 3,
            }),
        },
        sl: 4,
        static_rate: 0,
    });
    let mut provider = [0u8; 64]; // the AV sits inside a larger struct
    provider[8..56].copy_from_slice(&made.to_bytes());
    let dv = ffi::mlx5dv_ah {
        av: provider[8..].as_mut_ptr().cast(),
        comp_mask: 0,
    };
    // SAFETY: `dv.av` points to 48 readable bytes of `provider`.
    let av = unsafe { av_of(&dv) }.unwrap();
    assert_eq!(av, made);
    assert_eq!((av.rlid.get(), av.sl(false), av.sgid_index()), (0x21, 4, 2));
    let null = ffi::mlx5dv_ah {
        av: null_mut(),
        comp_mask: 0,
    };
    // SAFETY: a null AV is checked before any read.
    let refused = unsafe { av_of(&null) };
    assert!(matches!(refused, Err(Error::InvalidParameter { .. })));
}

/// A UD send on mlx5's direct path: rings from `mlx5dv_init_obj(MLX5DV_OBJ_QP)` of
/// rdma-core's UD QP, the address vector from `mlx5dv_init_obj(MLX5DV_OBJ_AH)` of its
/// `ibv_create_ah`. The WQE's datagram segment is the provider's AV byte for byte, with
/// only the Q_Key (bytes 0..4) and the destination QP with `MLX5_EXTENDED_UD_AV` (bytes
/// 8..12) written over it, as rdma-core's `set_datagram_seg` /
/// `mlx5_send_wr_set_ud_addr` (`memcpy(&dseg->av, &mah->av, ...)`) and UCX's
/// `uct_ib_mlx5_set_dgram_seg` build it.
#[test]
fn a_ud_send_on_library_rings_carries_the_providers_av() {
    use mlx5::av::{AvAttr, AvLink, DatagramSeg, GrhAttr};
    let made = mlx5::av::Av::from_attr(&AvAttr {
        link: AvLink::Ib {
            dlid: 0x33,
            src_path_bits: 0,
            grh: Some(GrhAttr {
                dgid: [0xab; 16],
                flow_label: 0x12345,
                sgid_index: 1,
                hop_limit: 64,
                traffic_class: 5,
            }),
        },
        sl: 2,
        static_rate: 0,
    });
    let mut provider = [0u8; 80];
    provider[16..64].copy_from_slice(&made.to_bytes());
    let dv_ah = ffi::mlx5dv_ah {
        av: provider[16..].as_mut_ptr().cast(),
        comp_mask: 0,
    };
    // SAFETY: `dv_ah.av` points to 48 readable bytes of `provider`.
    let av = unsafe { av_of(&dv_ah) }.unwrap();
    let mut buf = vec![0u8; 1024 + 256 * 64];
    let (mut db, mut bf) = ([0u32; 2], vec![0u8; 512]);
    let dv = cx5(&mut buf, &mut db, &mut bf, 256);
    let raw = raw_qp(&dv, &LIM).unwrap();
    // SAFETY: the rings above outlive the queue (dropped at the end of the test).
    let mut sq = unsafe { crate::direct::SendQueue::new(&raw) }.unwrap();
    let send = mlx5::wqe::UdSend {
        dgram: DatagramSeg::ud(&av, 0x4321, 0x1111_2222),
        data: mlx5::request::Payload::Inline(b"hello"),
        imm: None,
    };
    sq.post_ud(&send, 9, crate::queue::flags::PostFlags::SIGNALED)
        .unwrap();
    drop(sq);
    let wqe = &buf[1024..1024 + 128];
    // Control segment: opcode SEND, the QP number, the size in 16-byte units
    // (control 1 + datagram 3 + inline 1).
    assert_eq!(wqe[3], 0x0a, "MLX5_OPCODE_SEND");
    assert_eq!(
        u32::from_be_bytes(wqe[4..8].try_into().unwrap()),
        0x1234 << 8 | 5
    );
    let dseg = &wqe[16..64];
    let mut want = made.to_bytes();
    want[0..4].copy_from_slice(&0x1111_2222u32.to_be_bytes());
    want[8..12].copy_from_slice(&(0x4321u32 | 0x8000_0000).to_be_bytes());
    assert_eq!(dseg, &want[..]);
    // The bytes rdma-core does not overwrite are the provider's (GRH, LID, SL).
    assert_eq!(&dseg[12..48], &provider[16 + 12..64]);
    // The inline segment: byte count with MLX5_INLINE_SEG, then the data.
    assert_eq!(
        u32::from_be_bytes(wqe[64..68].try_into().unwrap()),
        0x8000_0000 | 5
    );
    assert_eq!(&wqe[68..73], b"hello");
    // The doorbell record's send counter in 64-byte blocks: 80 bytes take two
    // (rdma-core `qp->sq.cur_post += DIV_ROUND_UP(size * 16, MLX5_SEND_WQE_BB)`).
    assert_eq!(u32::from_be(db[1]), 2);
}

/// What rdma-core 55's `mlx5dv_get_srq` returns for `ibv_create_srq(max_wr 100,
/// max_sge 2)` on a ConnectX: a ring of 512 WQEs (`2 * 100 + 1` rounded up, the upper
/// half the ODP wait queue), the main list 0 ..= 127, a stride of 64, the number asked
/// for with `MLX5DV_SRQ_MASK_SRQN`.
#[test]
fn srq_description_from_the_library() {
    let mut buf = vec![0u8; 512 * 64];
    let mut db = [0u32; 2];
    let dv = ffi::mlx5dv_srq {
        buf: buf.as_mut_ptr().cast(),
        dbrec: db.as_mut_ptr(),
        stride: 64,
        head: 0,
        tail: 127,
        comp_mask: ffi::MLX5DV_SRQ_MASK_SRQN,
        srqn: 0x1234,
    };
    // `ibv_query_srq` answers the kernel's 511: the ring is the whole buffer.
    let raw = raw_srq(&dv, 2, 512).unwrap();
    assert_eq!((raw.srqn, raw.wqe_cnt, raw.stride), (0x1234, 512, 64));
    assert_eq!((raw.head, raw.tail, raw.max_sge), (0, 127, 2));
    assert_eq!(raw.buf, buf.as_mut_ptr());
    // Without a wait queue (an older library) or an answer that cannot be a ring: the list.
    for device in [128, 0, 300, 64, 1 << 17] {
        assert_eq!(raw_srq(&dv, 2, device).unwrap().wqe_cnt, 128, "{device}");
    }
    // The library's max_sge is kept below what the stride holds (3 for 64 bytes).
    assert_eq!(raw_srq(&dv, 7, 512).unwrap().max_sge, 3);
    // An older library that ignores the mask, a used SRQ, odd rings: refused.
    for bad in [
        ffi::mlx5dv_srq { comp_mask: 0, ..dv },
        ffi::mlx5dv_srq { head: 5, ..dv },
        ffi::mlx5dv_srq { tail: 100, ..dv },
        ffi::mlx5dv_srq { stride: 16, ..dv },
        ffi::mlx5dv_srq {
            dbrec: null_mut(),
            ..dv
        },
    ] {
        assert!(matches!(
            raw_srq(&bad, 2, 512),
            Err(Error::InvalidParameter { .. })
        ));
    }
}

/// What rdma-core returns for a ConnectX-5 RC QP of 256 send WQEs (sq.wqe_cnt in
/// blocks), 64 receives of 1 SGE, with a write-combining BlueFlame register of 256 bytes.
fn cx5(buf: &mut [u8], dbrec: &mut [u32; 2], bf: &mut [u8], bf_size: u32) -> ffi::mlx5dv_qp {
    ffi::mlx5dv_qp {
        dbrec: dbrec.as_mut_ptr(),
        sq: ffi::mlx5dv_qp_ring {
            buf: buf[1024..].as_mut_ptr().cast(),
            wqe_cnt: 256,
            stride: 64,
        },
        rq: ffi::mlx5dv_qp_ring {
            buf: buf.as_mut_ptr().cast(),
            wqe_cnt: 64,
            stride: 16,
        },
        bf: ffi::mlx5dv_qp_bf {
            reg: bf.as_mut_ptr().cast(),
            size: bf_size,
        },
        comp_mask: 0,
        uar_mmap_offset: 0,
        tirn: 0,
        tisn: 0,
        rqn: 0,
        sqn: 0,
        tir_icm_addr: 0,
    }
}

const LIM: QpLimits = QpLimits {
    qpn: 0x1234,
    max_inline: 220,
    max_send_sge: 30,
    max_recv_sge: 1,
};

#[test]
fn qp_fields_map_one_to_one() {
    let mut buf = vec![0u8; 1024 + 256 * 64];
    let (mut db, mut bf) = ([0u32; 2], vec![0u8; 512]);
    let dv = cx5(&mut buf, &mut db, &mut bf, 256);
    let raw = raw_qp(&dv, &LIM).unwrap();
    assert_eq!(raw.sq_buf as usize, buf[1024..].as_ptr() as usize);
    assert_eq!(
        (raw.sq_wqe_cnt, raw.sq_stride, raw.rq_wqe_cnt, raw.rq_stride),
        (256, 64, 64, 16)
    );
    assert_eq!(
        (raw.bf_size, raw.bf_reg as usize),
        (256, bf.as_ptr() as usize)
    );
    assert_eq!(
        (raw.qpn, raw.max_inline, raw.max_send_sge, raw.max_recv_sge),
        (0x1234, 220, 30, 1)
    );
    assert_eq!(raw.dbrec, db.as_mut_ptr());
}

#[test]
fn bf_size_zero_means_doorbell_only() {
    let mut buf = vec![0u8; 1024 + 256 * 64];
    let (mut db, mut bf) = ([0u32; 2], vec![0u8; 64]);
    let dv = cx5(&mut buf, &mut db, &mut bf, 0);
    let raw = raw_qp(&dv, &LIM).unwrap();
    assert_eq!(raw.bf_size, 0);
    // The direct path accepts it and will only ever write 8-byte doorbells.
    // SAFETY: the rings above live for the queue's lifetime.
    let sq = unsafe { crate::direct::SendQueue::new(&raw) }.unwrap();
    assert_eq!(sq.bf_size(), 0);
}

#[test]
fn refuses_rings_it_cannot_drive() {
    let mut buf = vec![0u8; 1024 + 256 * 64];
    let (mut db, mut bf) = ([0u32; 2], vec![0u8; 512]);
    let mut dv = cx5(&mut buf, &mut db, &mut bf, 256);
    dv.sq.stride = 128;
    assert!(matches!(
        raw_qp(&dv, &LIM),
        Err(Error::InvalidParameter {
            what: "mlx5dv_qp.sq.stride",
            value: 128
        })
    ));
    dv.sq.stride = 64;
    dv.sq.wqe_cnt = 100;
    assert!(matches!(
        raw_qp(&dv, &LIM),
        Err(Error::InvalidParameter {
            what: "mlx5dv_qp.sq.wqe_cnt",
            value: 100
        })
    ));
    dv.sq.wqe_cnt = 256;
    dv.bf.size = 100;
    assert!(matches!(
        raw_qp(&dv, &LIM),
        Err(Error::InvalidParameter {
            what: "mlx5dv_qp.bf.size",
            value: 100
        })
    ));
}

#[test]
fn cq_fields_and_128_byte_cqes() {
    let mut ring = vec![0u8; 128 * 64];
    let mut db = [0u32; 2];
    let dv = ffi::mlx5dv_cq {
        buf: ring.as_mut_ptr().cast(),
        dbrec: db.as_mut_ptr(),
        cqe_cnt: 64,
        cqe_size: 128,
        cq_uar: null_mut(),
        cqn: 0x55,
        comp_mask: 0,
    };
    let raw = raw_cq(&dv).unwrap();
    assert_eq!((raw.cqn, raw.cqe_cnt, raw.cqe_size), (0x55, 64, 128));
    // All entries zero would look valid (opcode 0, owner 0): mark them invalid as the
    // library does.
    for e in ring.chunks_mut(128) {
        e[127] = 0xf0;
    }
    // SAFETY: the ring and record above live longer than the poller.
    let mut cq = unsafe { crate::direct::CompletionQueue::new(&raw) }.unwrap();
    let mut out = [crate::completion::Completion::default(); 4];
    assert_eq!(cq.poll(&mut out), 0);
    let bad = ffi::mlx5dv_cq { cqe_size: 32, ..dv };
    assert!(matches!(
        raw_cq(&bad),
        Err(Error::InvalidParameter {
            what: "mlx5dv_cq.cqe_size",
            value: 32
        })
    ));
}

/// The installed libmlx5 (Debian's rdma-core) has every symbol at the version the crate
/// asks for; `mlx5dv_init_obj` has a second, compat definition at MLX5_1.0 which is not
/// the one used; a version that does not exist gives nothing.
#[test]
fn symbols_are_looked_up_at_their_versions() {
    // SAFETY: dlopen of a library name; the handle is only used below and never closed.
    let h = unsafe { libc::dlopen(c"libmlx5.so.1".as_ptr(), libc::RTLD_NOW) };
    if h.is_null() {
        eprintln!("libmlx5.so.1 not installed: nothing to check");
        return;
    }
    let l = lib().expect("libmlx5 loads with every versioned symbol");
    for sym in SYMBOLS {
        // SAFETY: live handle.
        assert!(!unsafe { versioned(h, sym) }.is_null(), "{sym:?}");
    }
    // SAFETY: live handle.
    let (v12, v10) = unsafe {
        (
            versioned(h, (c"mlx5dv_init_obj", c"MLX5_1.2")),
            versioned(h, (c"mlx5dv_init_obj", c"MLX5_1.0")),
        )
    };
    assert!(!v10.is_null(), "the compat definition exists");
    assert_ne!(v12, v10);
    assert_eq!(
        l.init_obj as usize, v12 as usize,
        "MLX5_1.2, not the compat"
    );
    // SAFETY: live handle.
    let sup = unsafe { versioned(h, SYMBOLS[1]) };
    assert_eq!(l.is_supported as usize, sup as usize);
    // SAFETY: live handle.
    let create_qp = unsafe { versioned(h, SYMBOLS[4]) };
    assert_eq!(l.create_qp as usize, create_qp as usize);
    // SAFETY: live handle.
    let wrong = unsafe { versioned(h, (c"mlx5dv_is_supported", c"MLX5_1.0")) };
    assert!(wrong.is_null(), "no such version: nothing is used");
}

#[test]
fn path_choice() {
    assert_eq!(choose(true, None).unwrap(), DataPath::Direct);
    assert_eq!(choose(false, None).unwrap(), DataPath::Verbs);
    assert_eq!(choose(true, Some("verbs")).unwrap(), DataPath::Verbs);
    assert_eq!(choose(true, Some("direct")).unwrap(), DataPath::Direct);
    assert!(matches!(
        choose(false, Some("direct")),
        Err(Error::Unsupported(_))
    ));
    assert!(matches!(
        choose(false, Some("fast")),
        Err(Error::Environment { ref value, .. }) if &**value == "fast"
    ));
}

/// `QpCaps::scatter_to_cqe = false` on a ConnectX: rdma-core turns responder
/// scatter-to-CQE on for every QP `ibv_create_qp_ex` makes, so such a QP is made by
/// `mlx5dv_create_qp` with `MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE` (and nothing else:
/// `create_qp` refuses it together with `ALLOW_SCATTER_TO_CQE`, and a DC mask would make
/// it a DC QP); with it on, the plain call.
#[test]
fn a_qp_without_scatter_to_cqe_is_made_with_the_vendor_flag() {
    assert_eq!(rc_ud_vendor_attr(true), None);
    let a = rc_ud_vendor_attr(false).expect("the vendor call");
    assert_eq!(a.comp_mask, ffi::MLX5DV_QP_INIT_ATTR_MASK_QP_CREATE_FLAGS);
    assert_eq!(a.create_flags, ffi::MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE);
    assert_eq!((a.dc_init_attr, a.send_ops_flags), Default::default());
}
