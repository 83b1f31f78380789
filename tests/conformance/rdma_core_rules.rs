//! rdma-core's rules that the direct path follows, and that the software NIC enforces as a
//! ConnectX with rdma-core would (issue 10, item 5): the BlueFlame copy only for a WQE of
//! more than one DS, type-1 windows never zero-based, a BlueFlame register that exists.

use crate::common;

use blueflame::raw::SendQueue;
use blueflame::*;
use common::*;
use mlx5::ctrl::{CompletionMode, Fence, FmCeSe};
use mlx5::doorbell::SND_DBR;
use mlx5::sim::{Nic, QpStats};
use mlx5::wqe::{encode, wqe_ds, Limits, Span};

fn stats(s: &Setup) -> QpStats {
    nic(&s.dev).qp_stats(s.a.qpn()).unwrap()
}

/// A NOP and a send of 0 bytes are one-DS WQEs: rdma-core's `post_send_db` rings them with
/// the 8-byte doorbell (`size > 1` fails), never a BlueFlame copy.
#[test]
fn one_ds_wqes_ring_the_8_byte_doorbell() {
    let mut s = Setup::pair(QpCaps::default());
    let buf = s.mr(64, Access::LOCAL_WRITE);
    let q = s.a.qpn();
    let mut n = 0;
    for i in 0..8u64 {
        s.a.post(&Request::Nop, i, PostFlags::SIGNALED).unwrap();
        let (c, _) = s.run_expect(1, 0);
        assert_ok(&c[0], i, WcOpcode::Nop, 0, q);
        s.resp()
            .post_recv(&[buf.sge(0, 64).unwrap()], 100 + i)
            .unwrap();
        s.a.send(Payload::Inline(&[]), 200 + i, PostFlags::SIGNALED)
            .unwrap();
        let (c, r) = s.run_expect(1, 1);
        assert_ok(&c[0], 200 + i, WcOpcode::Send, 0, q);
        assert_eq!((r[0].cookie, r[0].byte_len), (100 + i, 0));
        n += 2;
    }
    let st = stats(&s);
    assert_eq!(
        (st.doorbells, st.db_writes, st.bf_copies, st.bf_violations),
        (n, n, 0, 0),
        "{st:?}"
    );
    // A two-DS WQE (a write of 0 bytes: control + remote address) is still copied.
    let dst = s.mr(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    s.a.write_inline(&[], dst.remote(0).unwrap(), 9, PostFlags::SIGNALED)
        .unwrap();
    s.run_expect(1, 0);
    assert_eq!(stats(&s).bf_copies, 1);
}

/// A driver that BlueFlame-copies a one-DS WQE is caught by the software NIC: written here by
/// hand (control segment through the encoder, doorbell record, 64-byte copy to the register).
#[test]
fn software_nic_flags_a_blueflame_copy_of_a_one_ds_wqe() {
    for (copy, expect) in [(true, (1, 0, 1)), (false, (0, 1, 0))] {
        let nic = Nic::new();
        let pd = nic.alloc_pd();
        let cq = nic.create_cq(64, 64).unwrap();
        let raw = nic
            .create_qp(pd, cq.cqn, cq.cqn, mlx5::sim::QpCaps::default())
            .unwrap();
        nic.init_qp(raw.qpn).unwrap();
        nic.connect(raw.qpn, nic.path_to(raw.qpn)).unwrap();
        let lim = Limits {
            max_sge: 1,
            max_inline: 0,
        };
        let ds = wqe_ds(&Request::Nop, &lim).unwrap();
        assert_eq!(ds, 1);
        let flags = FmCeSe {
            fence: Fence::None,
            completion: CompletionMode::Always,
            solicited: false,
        };
        // SAFETY: the ring, doorbell record and register belong to the QP just created, which
        // nothing else posts to; block 0 is free.
        unsafe {
            let block = core::slice::from_raw_parts_mut(raw.sq_buf, 64);
            let mut span = Span {
                a: block,
                b: &mut [],
            };
            encode(&Request::Nop, ds, 0, raw.qpn, flags, &mut span);
            raw.dbrec.add(SND_DBR).write_volatile(1u32.to_be());
            if copy {
                core::ptr::copy_nonoverlapping(raw.sq_buf, raw.bf_reg, 64);
            } else {
                core::ptr::copy_nonoverlapping(raw.sq_buf, raw.bf_reg, 8);
            }
        }
        nic.drain();
        let st = nic.qp_stats(raw.qpn).unwrap();
        assert_eq!(
            (
                st.bf_violations,
                st.db_writes,
                st.bf_copies + st.bf_violations
            ),
            expect,
            "copy {copy}: {st:?}"
        );
    }
}

/// A null BlueFlame register is refused when the queue is built (rdma-core always gives a
/// register; a null one would be written to by the first post).
#[test]
fn null_blueflame_register_is_refused() {
    let nic = Nic::new();
    let pd = nic.alloc_pd();
    let cq = nic.create_cq(64, 64).unwrap();
    for bf_size in [256, 0] {
        let mut raw = nic
            .create_qp(
                pd,
                cq.cqn,
                cq.cqn,
                mlx5::sim::QpCaps {
                    bf_size,
                    ..mlx5::sim::QpCaps::default()
                },
            )
            .unwrap();
        raw.bf_reg = core::ptr::null_mut();
        // SAFETY: the rings belong to the QP just created; the queue is refused before use.
        let r = unsafe { SendQueue::new(&raw) };
        assert!(
            matches!(r, Err(Error::InvalidParameter { value, .. }) if value == bf_size as u64),
            "bf_size {bf_size}: {r:?}"
        );
    }
}

const BINDABLE: Access = Access(
    Access::LOCAL_WRITE.0 | Access::REMOTE_WRITE.0 | Access::REMOTE_READ.0 | Access::MW_BIND.0,
);

/// rdma-core's `mlx5_bind_mw` refuses a type-1 bind with `IBV_ACCESS_ZERO_BASED` (EINVAL)
/// before posting: so does `Qp::bind_mw` (and a send queue over raw rings for a raw
/// `BindMw`; a QP's generic post refuses every raw bind), and nothing is posted. A type-2
/// window may be zero-based.
#[test]
fn zero_based_type1_bind_is_refused_before_posting() {
    let mut s = Setup::pair(QpCaps::default());
    let mr = s.mr(4096, BINDABLE);
    let zb = Access::REMOTE_READ | Access::ZERO_BASED;
    let mut w1 = s.pd.alloc_mw(MwType::One).unwrap();
    let (key, free) = (w1.rkey(), s.a.free_send());
    let r = s.a.bind_mw(&mut w1, &mr, 0, 64, zb, 1, PostFlags::SIGNALED);
    assert!(
        matches!(r, Err(Error::InvalidParameter { value, .. }) if value & Access::ZERO_BASED.0 as u64 != 0),
        "{r:?}"
    );
    assert_eq!((w1.rkey(), s.a.free_send()), (key, free));
    let bind = BindMw {
        mw_rkey: key,
        new_rkey: key + 1,
        mw_type: MwType::One,
        mr_lkey: mr.lkey(),
        addr: mr.addr(),
        len: 64,
        access: zb,
    };
    let r = s.a.post(&Request::BindMw(bind), 2, PostFlags::SIGNALED);
    assert!(matches!(r, Err(Error::Unsupported(_))), "{r:?}");
    assert_eq!(s.a.free_send(), free);
    s.run_expect(0, 0);
    // Not zero-based: bound; a type-2 window zero-based: bound too.
    s.a.bind_mw(
        &mut w1,
        &mr,
        0,
        64,
        Access::REMOTE_READ,
        3,
        PostFlags::SIGNALED,
    )
    .unwrap();
    let mut w2 = s.pd.alloc_mw(MwType::Two).unwrap();
    s.a.bind_mw(&mut w2, &mr, 64, 64, zb, 4, PostFlags::SIGNALED)
        .unwrap();
    let (c, _) = s.run_expect(2, 0);
    assert!(c.iter().all(|c| c.is_ok()), "{c:?}");
}

/// The software NIC fails a zero-based type-1 bind WQE (a driver that skipped the check):
/// the window stays unbound and the QP goes to error, as for any failed bind.
#[test]
fn software_nic_fails_a_zero_based_type1_bind() {
    for zero_based in [true, false] {
        let nic = Nic::new();
        let pd = nic.alloc_pd();
        let cq = nic.create_cq(64, 64).unwrap();
        let raw = nic
            .create_qp(pd, cq.cqn, cq.cqn, mlx5::sim::QpCaps::default())
            .unwrap();
        nic.init_qp(raw.qpn).unwrap();
        nic.connect(raw.qpn, nic.path_to(raw.qpn)).unwrap();
        let mr = nic.alloc_mr(pd, 4096, BINDABLE).unwrap();
        let rkey = nic.alloc_mw(pd, MwType::One).unwrap();
        let mut access = Access::REMOTE_READ;
        if zero_based {
            access = access | Access::ZERO_BASED;
        }
        let req = Request::BindMw(BindMw {
            mw_rkey: rkey,
            new_rkey: (rkey & !0xff) | ((rkey + 1) & 0xff),
            mw_type: MwType::One,
            mr_lkey: mr.lkey,
            addr: mr.addr,
            len: 64,
            access,
        });
        let lim = Limits {
            max_sge: 1,
            max_inline: 0,
        };
        let ds = wqe_ds(&req, &lim).unwrap();
        let bbs = ds.div_ceil(4);
        let flags = FmCeSe {
            fence: Fence::None,
            completion: CompletionMode::Always,
            solicited: false,
        };
        // SAFETY: the ring and doorbell record belong to the QP just created, which nothing
        // else posts to; blocks 0 .. bbs are free.
        unsafe {
            let blocks = core::slice::from_raw_parts_mut(raw.sq_buf, bbs * 64);
            let mut span = Span {
                a: blocks,
                b: &mut [],
            };
            encode(&req, ds, 0, raw.qpn, flags, &mut span);
            raw.dbrec.add(SND_DBR).write_volatile((bbs as u32).to_be());
            core::ptr::copy_nonoverlapping(raw.sq_buf, raw.bf_reg, 8);
        }
        nic.drain();
        let (_, bound) = nic.mw_state(rkey).unwrap();
        let state = nic.qp_state(raw.qpn).unwrap();
        assert_eq!(
            (bound, state == mlx5::sim::QpState::Error),
            (!zero_based, zero_based),
            "zero-based {zero_based}"
        );
    }
}

/// A raw QP of a fresh software NIC, connected to itself, with a region of `len` bytes
/// (local and remote write) and its own CQ.
fn raw_loopback(len: usize) -> (Nic, RawQp, RawCq, mlx5::sim::MrInfo) {
    let nic = Nic::new();
    let pd = nic.alloc_pd();
    let cq = nic.create_cq(64, 64).unwrap();
    let raw = nic
        .create_qp(pd, cq.cqn, cq.cqn, mlx5::sim::QpCaps::default())
        .unwrap();
    nic.init_qp(raw.qpn).unwrap();
    nic.connect(raw.qpn, nic.path_to(raw.qpn)).unwrap();
    let mr = nic
        .alloc_mr(pd, len, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    (nic, raw, cq, mr)
}

/// Writes `req` by hand as the first WQE of `raw` (the encoder writes any message length:
/// the checks before posting are the driver's), rings and runs the NIC.
fn post_by_hand(nic: &Nic, raw: &RawQp, req: &Request<'_>) {
    let lim = Limits {
        max_sge: 61,
        max_inline: 0,
    };
    let ds = wqe_ds(req, &lim).unwrap();
    let bbs = ds.div_ceil(4);
    let flags = FmCeSe {
        fence: Fence::None,
        completion: CompletionMode::Always,
        solicited: false,
    };
    // SAFETY: the ring and doorbell record belong to the QP just created, which nothing
    // else posts to; blocks 0 .. bbs are free.
    unsafe {
        let blocks = core::slice::from_raw_parts_mut(raw.sq_buf, bbs * 64);
        let mut span = Span {
            a: blocks,
            b: &mut [],
        };
        encode(req, ds, 0, raw.qpn, flags, &mut span);
        raw.dbrec.add(SND_DBR).write_volatile((bbs as u32).to_be());
        core::ptr::copy_nonoverlapping(raw.sq_buf, raw.bf_reg, 8);
    }
    nic.drain();
}

/// The syndrome of the error completion in the first entry of `cq`.
fn first_syndrome(cq: &RawCq) -> mlx5::Syndrome {
    // SAFETY: the CQ's first 64-byte entry, in the NIC's live ring, written and idle.
    let cqe = unsafe { core::slice::from_raw_parts(cq.buf, 64) };
    let cqe = <mlx5::cqe::Cqe64 as zerocopy::FromBytes>::read_from_bytes(cqe).unwrap();
    assert_eq!(cqe.opcode(), Some(mlx5::cqe::CqeOpcode::ReqErr));
    cqe.as_err().syndrome()
}

/// A message longer than the port's largest (`max_msg_sz`: the software NIC's, as a
/// ConnectX-6's, is 2^30; here past 2^31, InfiniBand's largest, too) completes with a local
/// length error (IBV_WC_LOC_LEN_ERR) before a byte is gathered: a WQE written by hand
/// cannot make the software NIC gather (allocate) gigabytes. Writes, sends and reads on
/// RC; a UD send past the MTU is refused the same way, before its gather.
#[test]
fn the_software_nic_fails_a_message_past_2_pow_31_with_a_local_length_error_before_gathering() {
    let one = |mr: &mlx5::sim::MrInfo, len: u32| Sge {
        addr: mr.addr,
        len,
        lkey: mr.lkey,
    };
    // Entries past the region's end after the first: gathering them one by one, the NIC
    // would stop at a protection error; the length is checked first. Past 2^31, and one
    // byte past the port's largest (2^30), below InfiniBand's.
    for (lens, what) in [
        (&[64, 0x7fff_ffff, 0x7fff_ffff][..], "write"),
        (&[1, 1 << 30][..], "2^30 + 1"),
    ] {
        let (nic, raw, cq, mr) = raw_loopback(4096);
        assert_eq!(nic.port_attr().max_msg, 1 << 30);
        let sgl: Vec<Sge> = lens.iter().map(|&len| one(&mr, len)).collect();
        let remote = Remote {
            addr: mr.addr,
            rkey: mr.rkey,
        };
        let write = Request::Write {
            remote,
            data: Payload::Sgl(&sgl),
        };
        post_by_hand(&nic, &raw, &write);
        assert_eq!(first_syndrome(&cq), mlx5::Syndrome::LocalLength, "{what}");
        assert_eq!(nic.qp_state(raw.qpn), Some(mlx5::sim::QpState::Error));
    }
    for (i, kind) in ["send", "read"].into_iter().enumerate() {
        let (nic, raw, cq, mr) = raw_loopback(4096);
        let sgl = [one(&mr, 64), one(&mr, 0x7fff_ffff), one(&mr, 2)];
        let req = if i == 0 {
            Request::Send {
                data: Payload::Sgl(&sgl),
            }
        } else {
            let remote = Remote {
                addr: mr.addr,
                rkey: mr.rkey,
            };
            Request::Read { remote, sgl: &sgl }
        };
        post_by_hand(&nic, &raw, &req);
        assert_eq!(first_syndrome(&cq), mlx5::Syndrome::LocalLength, "{kind}");
    }
    // Every entry inside a registered region (33 of 64 MiB: 2^31 + 2^25 bytes): the NIC
    // would gather 2 GiB; it fails the WQE instead, and the destination is untouched.
    {
        let (nic, raw, cq, mr) = raw_loopback(64 << 20);
        let sgl = [one(&mr, 64 << 20); 33];
        let remote = Remote {
            addr: mr.addr,
            rkey: mr.rkey,
        };
        let write = Request::Write {
            remote,
            data: Payload::Sgl(&sgl),
        };
        post_by_hand(&nic, &raw, &write);
        assert_eq!(
            first_syndrome(&cq),
            mlx5::Syndrome::LocalLength,
            "33 x 64 MiB"
        );
    }
    // UD: a datagram past the MTU fails before its gather too (here its second entry is
    // past the region's end).
    {
        let nic = Nic::new();
        let pd = nic.alloc_pd();
        let cq = nic.create_cq(64, 64).unwrap();
        let raw = nic
            .create_qp(pd, cq.cqn, cq.cqn, mlx5::sim::QpCaps::default())
            .unwrap();
        nic.make_ud(raw.qpn, 0x1111, true).unwrap();
        let mr = nic.alloc_mr(pd, 4096, Access::LOCAL_WRITE).unwrap();
        let sgl = [one(&mr, 64), one(&mr, 1 << 20)];
        // SAFETY: the rings belong to the NIC's QP, which lives as long as `nic` (dropped
        // after the queue) and which nothing else posts to.
        let mut sq = unsafe { SendQueue::new(&raw) }.unwrap();
        let send = mlx5::wqe::UdSend {
            dgram: mlx5::av::DatagramSeg::ud(&mlx5::av::Av::default(), raw.qpn, 0x1111),
            data: Payload::Sgl(&sgl),
            imm: None,
        };
        sq.post_ud(&send, 1, PostFlags::SIGNALED).unwrap();
        nic.drain();
        assert_eq!(first_syndrome(&cq), mlx5::Syndrome::LocalLength, "UD");
    }
}

/// A UD send whose address vector lacks `MLX5_EXTENDED_UD_AV` fails as a local QP
/// operation error: a ConnectX would read a 16-byte compact address vector and the payload
/// at another offset (every WQE the crate writes sets the bit, `DatagramSeg::ud`).
#[test]
fn a_ud_send_without_the_extended_address_vector_fails() {
    let nic = Nic::new();
    let pd = nic.alloc_pd();
    let cq = nic.create_cq(64, 64).unwrap();
    let raw = nic
        .create_qp(pd, cq.cqn, cq.cqn, mlx5::sim::QpCaps::default())
        .unwrap();
    nic.make_ud(raw.qpn, 0x1111, true).unwrap();
    let mr = nic.alloc_mr(pd, 4096, Access::LOCAL_WRITE).unwrap();
    let sgl = [Sge {
        addr: mr.addr,
        len: 64,
        lkey: mr.lkey,
    }];
    // SAFETY: the rings belong to the NIC's QP, which lives as long as `nic` (dropped after
    // the queue) and which nothing else posts to.
    let mut sq = unsafe { SendQueue::new(&raw) }.unwrap();
    let mut dgram = mlx5::av::DatagramSeg::ud(&mlx5::av::Av::default(), raw.qpn, 0x1111);
    dgram.av.dqp_dct = mlx5::Be32::new(dgram.av.dqp());
    let send = mlx5::wqe::UdSend {
        dgram,
        data: Payload::Sgl(&sgl),
        imm: None,
    };
    sq.post_ud(&send, 1, PostFlags::SIGNALED).unwrap();
    nic.drain();
    assert_eq!(first_syndrome(&cq), mlx5::Syndrome::LocalQpOp);
}

/// A UD receive's CQE names the receiver's DLID path bits in `ml_path`
/// (rdma-core `cq.c` `handle_responder`: `wc->dlid_path_bits = cqe->ml_path & 0x7f`), and
/// the sender's source path bits only inside the SLID (`mlx5_create_ah`:
/// `av.fl_mlid = src_path_bits & 0x7f`, the sender's). The port has LMC 0 and a datagram
/// reaches it only at DLID == PORT_LID: its DLID path bits are 0 whatever the sender's
/// source path bits.
#[test]
fn a_ud_receive_reports_the_destinations_path_bits_not_the_senders() {
    use mlx5::av::{Av, AvAttr, AvLink, DatagramSeg};
    let nic = Nic::new();
    let pd = nic.alloc_pd();
    let scq = nic.create_cq(64, 64).unwrap();
    let rcq = nic.create_cq(64, 64).unwrap();
    let a = nic
        .create_qp(pd, scq.cqn, scq.cqn, mlx5::sim::QpCaps::default())
        .unwrap();
    let b = nic
        .create_qp(pd, rcq.cqn, rcq.cqn, mlx5::sim::QpCaps::default())
        .unwrap();
    nic.make_ud(a.qpn, 0x1111, true).unwrap();
    nic.make_ud(b.qpn, 0x1111, true).unwrap();
    let mr = nic.alloc_mr(pd, 4096, Access::LOCAL_WRITE).unwrap();
    // SAFETY: the rings belong to the NIC's QPs, which live as long as `nic`.
    let mut rq = unsafe { blueflame::raw::RecvQueue::new(&b) }
        .unwrap()
        .unwrap();
    rq.post(
        &[Sge {
            addr: mr.addr,
            len: 256,
            lkey: mr.lkey,
        }],
        7,
    )
    .unwrap();
    // SAFETY: as above.
    let mut sq = unsafe { SendQueue::new(&a) }.unwrap();
    let av = Av::from_attr(&AvAttr {
        link: AvLink::Ib {
            dlid: nic.port_attr().lid,
            src_path_bits: 1,
            grh: None,
        },
        sl: 3,
        static_rate: 0,
    });
    let send = mlx5::wqe::UdSend {
        dgram: DatagramSeg::ud(&av, b.qpn, 0x1111),
        data: Payload::Inline(b"hi"),
        imm: None,
    };
    sq.post_ud(&send, 1, PostFlags::SIGNALED).unwrap();
    nic.drain();
    // SAFETY: the receive CQ's first entry, in the NIC's live ring, written and idle.
    let bytes = unsafe { core::slice::from_raw_parts(rcq.buf, 64) };
    let cqe = <mlx5::cqe::Cqe64 as zerocopy::FromBytes>::read_from_bytes(bytes).unwrap();
    assert_eq!(cqe.opcode(), Some(mlx5::cqe::CqeOpcode::RespSend));
    assert_eq!((cqe.src_qpn(), cqe.sl()), (a.qpn, 3));
    assert_eq!(
        (cqe.slid(), cqe.dlid_path_bits()),
        (nic.port_attr().lid, 0),
        "slid / dlid_path_bits"
    );
}
