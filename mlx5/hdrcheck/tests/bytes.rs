//! Bytes the `mlx5` crate writes and reads, against rdma-core's own inline helpers
//! (`mlx5dv_set_ctrl_seg`, `mlx5dv_set_data_seg`, `mlx5dv_get_cqe_*`), the header's structs
//! filled by member name, and rdma-core's syndrome -> status mapping, all compiled from the
//! installed headers.
#![allow(missing_docs)]

use mlx5::ctrl::{CompletionMode, CtrlSeg, Fence, FmCeSe};
use mlx5::seg::DataSeg;
use mlx5::wqe::{self, Limits, Span};
use mlx5::{Be32, Be64, Opcode, Payload, Remote, Request, Sge};
use mlx5_hdrcheck as c;
use mlx5_hdrcheck::value;
use zerocopy::{FromBytes, IntoBytes};

const PIS: [u16; 6] = [0, 1, 0x7fff, 0x8000, 0xfffe, 0xffff];
const DSS: [u8; 6] = [0, 1, 2, 3, 62, 63];
const QPNS: [u32; 4] = [0, 1, 0x12_3456, 0xff_ffff];
const IMMS: [u32; 5] = [0, 1, 0x1234_5678, 0x8000_0000, u32::MAX];
const OPMODS: [u8; 3] = [0, 0x08, 0x09];

fn c_opcode(name: &str) -> u8 {
    u8::try_from(value(name)).expect("opcodes are bytes")
}

fn c_u8(name: &str) -> u8 {
    u8::try_from(value(name)).expect("a byte constant")
}

mod ctrl_seg {
    use super::*;

    /// Every input of the table, for one fence mode, against `mlx5dv_set_ctrl_seg`.
    fn check_fence(fence: Fence) {
        let mut n = 0u32;
        for completion in CompletionMode::ALL {
            for solicited in [false, true] {
                let flags = FmCeSe {
                    fence,
                    completion,
                    solicited,
                };
                let fm = flags.to_u8();
                for pi in PIS {
                    for ds in DSS {
                        for qpn in QPNS {
                            for imm in IMMS {
                                for op in Opcode::ALL {
                                    for opmod in OPMODS {
                                        let op = op as u8;
                                        let rust = CtrlSeg::new(
                                            op,
                                            opmod,
                                            pi,
                                            qpn,
                                            ds,
                                            fm,
                                            Be32::new(imm),
                                        );
                                        // C stores imm raw: give it the value whose memory
                                        // bytes are imm big-endian.
                                        let cb = c::set_ctrl_seg(
                                            pi,
                                            op,
                                            opmod,
                                            qpn,
                                            fm,
                                            ds,
                                            0,
                                            imm.to_be(),
                                        );
                                        assert_eq!(
                                            rust.as_bytes(),
                                            &cb[..],
                                            "op {op:#x} opmod {opmod:#x} pi {pi:#x} qpn {qpn:#x} \
                                             ds {ds} {flags:?} imm {imm:#x}"
                                        );
                                        // And the accessors read rdma-core's bytes back.
                                        let back = CtrlSeg::read_from_bytes(&cb).unwrap();
                                        assert_eq!(
                                            (back.opcode_raw(), back.opmod(), back.pi()),
                                            (op, opmod, pi)
                                        );
                                        assert_eq!((back.qpn(), back.ds()), (qpn, ds));
                                        assert_eq!(FmCeSe::from_u8(back.fm_ce_se), Some(flags));
                                        assert_eq!(back.imm.get(), imm);
                                        assert_eq!(back.opcode(), Opcode::from_u8(op));
                                        n += 1;
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        assert!(n > 100_000);
    }

    macro_rules! per_fence {
        ($( $test:ident => $fence:expr ),* $(,)?) => {
            $( #[test] fn $test() { check_fence($fence) } )*
        };
    }

    per_fence! {
        matches_mlx5dv_set_ctrl_seg_fence_none => Fence::None,
        matches_mlx5dv_set_ctrl_seg_fence_initiator_small => Fence::InitiatorSmall,
        matches_mlx5dv_set_ctrl_seg_fence_fence => Fence::Fence,
        matches_mlx5dv_set_ctrl_seg_fence_strong_ordering => Fence::StrongOrdering,
        matches_mlx5dv_set_ctrl_seg_fence_small_and_fence => Fence::SmallAndFence,
    }

    #[test]
    fn every_fm_ce_se_combination_is_distinct_and_in_place() {
        // fm_ce_se is byte 11 whatever its value, and the 40 combinations are 40 bytes.
        let mut seen = std::collections::HashSet::new();
        for fence in Fence::ALL {
            for completion in CompletionMode::ALL {
                for solicited in [false, true] {
                    let fm = FmCeSe {
                        fence,
                        completion,
                        solicited,
                    }
                    .to_u8();
                    assert!(seen.insert(fm));
                    let cb = c::set_ctrl_seg(0, 0, 0, 0, fm, 0, 0, 0);
                    let mut want = [0u8; 16];
                    want[11] = fm;
                    assert_eq!(cb, want);
                }
            }
        }
        assert_eq!(seen.len(), 40);
    }
}

mod data_seg {
    use super::*;

    const LENS: [u32; 6] = [0, 1, 8, 0x7fff_ffff, 0x8000_0000, 0xffff_ffff];
    const LKEYS: [u32; 5] = [0, 1, 0x100, 0xdead_beef, u32::MAX];
    const ADDRS: [u64; 6] = [
        0,
        1,
        0x7fff_ffff_f000,
        0x0123_4567_89ab_cdef,
        0x8000_0000_0000_0000,
        u64::MAX,
    ];

    #[test]
    fn matches_mlx5dv_set_data_seg() {
        for len in LENS {
            for lkey in LKEYS {
                for addr in ADDRS {
                    let rust = DataSeg {
                        byte_count: Be32::new(len),
                        lkey: Be32::new(lkey),
                        addr: Be64::new(addr),
                    };
                    let cb = c::set_data_seg(len, lkey, addr);
                    assert_eq!(rust.as_bytes(), &cb[..], "{len:#x} {lkey:#x} {addr:#x}");
                    let back = DataSeg::read_from_bytes(&cb).unwrap();
                    assert_eq!(back, rust);
                }
            }
        }
    }

    #[test]
    fn recv_entries_match_mlx5dv_set_data_seg() {
        // A receive WQE of 4 entries with 2 used: 2 data segments, then the terminator
        // rdma-core writes (byte_count 0, MLX5_INVALID_LKEY, address 0).
        let sgl = [
            Sge {
                addr: u64::MAX,
                len: 0x7fff_ffff, // the longest entry: bit 31 is the inline flag
                lkey: 7,
            },
            Sge {
                addr: 0,
                len: 0,
                lkey: 9,
            }, // skipped
            Sge {
                addr: 0x1000,
                len: 1,
                lkey: u32::MAX,
            },
        ];
        let mut entry = [0xa5u8; 64];
        assert_eq!(mlx5::recv::encode_recv(&sgl, &mut entry), Some(2));
        assert_eq!(entry[0..16], c::set_data_seg(0x7fff_ffff, 7, u64::MAX));
        assert_eq!(entry[16..32], c::set_data_seg(1, u32::MAX, 0x1000));
        let invalid = u32::try_from(value("MLX5_INVALID_LKEY")).unwrap();
        assert_eq!(entry[32..48], c::set_data_seg(0, invalid, 0));
    }
}

mod wqe_bytes {
    use super::*;
    use mlx5::request::{BindMw, MwType};
    use mlx5::umr::{MkeyContextSeg, UmrCtrlSeg};

    const RING_BBS: usize = 16;

    /// Encodes `req` at producer index `pi` (block `pi % 16` of a 16-block ring filled with a
    /// pattern) and returns (ds, the WQE's linear bytes).
    fn post(req: &Request<'_>, pi: u16, qpn: u32, flags: FmCeSe) -> (usize, Vec<u8>) {
        let lim = Limits {
            max_sge: 16,
            max_inline: 512,
        };
        let mut ring = vec![0x5au8; RING_BBS * 64];
        let ds = wqe::wqe_ds(req, &lim).expect("valid request");
        let bbs = wqe::ds_to_bbs(ds);
        let start = pi as usize % RING_BBS;
        let mut span = Span::of_ring(&mut ring, start, bbs);
        assert_eq!(wqe::encode(req, ds, pi, qpn, flags, &mut span), bbs);
        let mut lin = vec![0u8; bbs * 64];
        wqe::linearize(&ring, start, bbs, &mut lin);
        (ds, lin)
    }

    /// rdma-core's way of composing fm_ce_se from the header's constants, and the crate's.
    fn flag_cases() -> Vec<(FmCeSe, u8)> {
        let mut v = Vec::new();
        for signaled in [false, true] {
            for solicited in [false, true] {
                for fenced in [false, true] {
                    let mut c = 0;
                    if signaled {
                        c |= c_u8("MLX5_WQE_CTRL_CQ_UPDATE");
                    }
                    if solicited {
                        c |= c_u8("MLX5_WQE_CTRL_SOLICITED");
                    }
                    if fenced {
                        c |= c_u8("MLX5_WQE_CTRL_FENCE");
                    }
                    let r = FmCeSe {
                        fence: if fenced {
                            Fence::SmallAndFence
                        } else {
                            Fence::None
                        },
                        completion: if signaled {
                            CompletionMode::Always
                        } else {
                            CompletionMode::OnError
                        },
                        solicited,
                    };
                    v.push((r, c));
                }
            }
        }
        // The initiator small fence rdma-core arms after a bind / local invalidate.
        v.push((
            FmCeSe {
                fence: Fence::InitiatorSmall,
                completion: CompletionMode::Always,
                solicited: false,
            },
            c_u8("MLX5_WQE_CTRL_INITIATOR_SMALL_FENCE") | c_u8("MLX5_WQE_CTRL_CQ_UPDATE"),
        ));
        v
    }

    const WQE_PIS: [u16; 6] = [0, 1, 15, 0x7fff, 0xfffe, 0xffff];

    #[test]
    fn inline_write_matches_rdma_core_helpers() {
        let payload: Vec<u8> = (0..512u32).map(|i| (i * 7 + 3) as u8).collect();
        let inl_hdr = value("sizeof(struct mlx5_wqe_inl_data_seg)") as usize;
        let dseg = value("sizeof(struct mlx5_wqe_data_seg)") as usize;
        for len in [0usize, 1, 12, 13, 28, 29, 44, 60, 61, 100, 200, 300] {
            for pi in WQE_PIS {
                for (flags, fm) in flag_cases() {
                    let remote = Remote {
                        addr: 0xffff_0000_1234_5678,
                        rkey: 0xabcd_ef01,
                    };
                    let data = &payload[..len];
                    let req = Request::Write {
                        remote,
                        data: Payload::Inline(data),
                    };
                    let qpn = 0xab_cdef;
                    let (ds, w) = post(&req, pi, qpn, flags);
                    let want_ds = if len == 0 {
                        2
                    } else {
                        2 + (len + inl_hdr).div_ceil(dseg)
                    };
                    assert_eq!(ds, want_ds, "len {len}");
                    let op = c_opcode("MLX5_OPCODE_RDMA_WRITE");
                    let ctrl = c::set_ctrl_seg(pi, op, 0, qpn, fm, ds as u8, 0, 0);
                    assert_eq!(w[..16], ctrl, "ctrl of inline write len {len} pi {pi:#x}");
                    assert_eq!(w[16..32], c::set_raddr_seg(remote.addr, remote.rkey));
                    if len > 0 {
                        let bc = (len as u64 | value("MLX5_INLINE_SEG")) as u32;
                        assert_eq!(w[32..36], bc.to_be_bytes(), "inline header len {len}");
                        assert_eq!(&w[36..36 + len], data);
                    }
                }
            }
        }
    }

    fn sgl() -> Vec<Sge> {
        vec![
            Sge {
                addr: 0x1000,
                len: 1,
                lkey: 0x11,
            },
            Sge {
                addr: 0x2000,
                len: 0,
                lkey: 0x22,
            }, // skipped by the encoder, as rdma-core does
            Sge {
                addr: u64::MAX,
                len: 0x7fff_fffe,
                lkey: u32::MAX,
            },
            Sge {
                addr: 0x8000_0000_0000_0000,
                len: 0x7fff_ffff,
                lkey: 0x100,
            },
        ]
    }

    fn check_data_segs(w: &[u8], from: usize, sgl: &[Sge]) {
        let mut off = from;
        for s in sgl.iter().filter(|s| s.len != 0) {
            assert_eq!(
                w[off..off + 16],
                c::set_data_seg(s.len, s.lkey, s.addr),
                "{s:?}"
            );
            off += 16;
        }
    }

    #[test]
    fn sgl_write_and_read_match_rdma_core_helpers() {
        let sgl = sgl();
        let remote = Remote {
            addr: 0x10_0000,
            rkey: 0x42,
        };
        for pi in WQE_PIS {
            for (flags, fm) in flag_cases() {
                let write = Request::Write {
                    remote,
                    data: Payload::Sgl(&sgl),
                };
                let (ds, w) = post(&write, pi, 7, flags);
                assert_eq!(ds, 5);
                let op = c_opcode("MLX5_OPCODE_RDMA_WRITE");
                assert_eq!(w[..16], c::set_ctrl_seg(pi, op, 0, 7, fm, 5, 0, 0));
                assert_eq!(w[16..32], c::set_raddr_seg(remote.addr, remote.rkey));
                check_data_segs(&w, 32, &sgl);

                let read = Request::Read { remote, sgl: &sgl };
                let (ds, w) = post(&read, pi, 7, flags);
                let op = c_opcode("MLX5_OPCODE_RDMA_READ");
                assert_eq!(w[..16], c::set_ctrl_seg(pi, op, 0, 7, fm, ds as u8, 0, 0));
                assert_eq!(w[16..32], c::set_raddr_seg(remote.addr, remote.rkey));
                check_data_segs(&w, 32, &sgl);
            }
        }
    }

    #[test]
    fn immediates_and_invalidate_keys_match_rdma_core_helpers() {
        let sgl = sgl();
        let remote = Remote { addr: 8, rkey: 9 };
        for imm in IMMS {
            for pi in WQE_PIS {
                let flags = FmCeSe::default();
                // IBV_WR_RDMA_WRITE_WITH_IMM / IBV_WR_SEND_WITH_IMM: imm_data is already
                // big-endian in rdma-core, "assigned as is".
                let req = Request::WriteImm {
                    remote,
                    data: Payload::Sgl(&sgl),
                    imm,
                };
                let (ds, w) = post(&req, pi, 3, flags);
                let op = c_opcode("MLX5_OPCODE_RDMA_WRITE_IMM");
                assert_eq!(
                    w[..16],
                    c::set_ctrl_seg(pi, op, 0, 3, 0, ds as u8, 0, imm.to_be())
                );
                check_data_segs(&w, 32, &sgl);

                let req = Request::SendImm {
                    data: Payload::Inline(b"hello"),
                    imm,
                };
                let (ds, w) = post(&req, pi, 3, flags);
                let op = c_opcode("MLX5_OPCODE_SEND_IMM");
                assert_eq!(
                    w[..16],
                    c::set_ctrl_seg(pi, op, 0, 3, 0, ds as u8, 0, imm.to_be())
                );

                // IBV_WR_SEND_WITH_INV: rdma-core passes htobe32(invalidate_rkey).
                let req = Request::SendInv {
                    data: Payload::Sgl(&sgl),
                    rkey: imm,
                };
                let (ds, w) = post(&req, pi, 3, flags);
                let op = c_opcode("MLX5_OPCODE_SEND_INVAL");
                assert_eq!(
                    w[..16],
                    c::set_ctrl_seg(pi, op, 0, 3, 0, ds as u8, 0, imm.to_be())
                );
                check_data_segs(&w, 16, &sgl);

                let req = Request::Send {
                    data: Payload::Sgl(&sgl),
                };
                let (ds, w) = post(&req, pi, 3, flags);
                let op = c_opcode("MLX5_OPCODE_SEND");
                assert_eq!(w[..16], c::set_ctrl_seg(pi, op, 0, 3, 0, ds as u8, 0, 0));
                check_data_segs(&w, 16, &sgl);
            }
        }
    }

    #[test]
    fn atomics_match_rdma_core_helpers() {
        let local = Sge {
            addr: 0xdead_0000,
            len: 8,
            lkey: 0x77,
        };
        let remote = Remote {
            addr: 0xffff_ffff_ffff_fff8,
            rkey: 0x99,
        };
        for pi in WQE_PIS {
            for (a, b) in [(0u64, 0u64), (1, u64::MAX), (0x0123_4567_89ab_cdef, 42)] {
                let req = Request::CompareSwap {
                    remote,
                    compare: a,
                    swap: b,
                    local,
                };
                let (ds, w) = post(&req, pi, 5, FmCeSe::default());
                assert_eq!(ds, 4);
                let op = c_opcode("MLX5_OPCODE_ATOMIC_CS");
                assert_eq!(w[..16], c::set_ctrl_seg(pi, op, 0, 5, 0, 4, 0, 0));
                assert_eq!(w[16..32], c::set_raddr_seg(remote.addr, remote.rkey));
                assert_eq!(
                    w[32..48],
                    c::set_atomic_seg(b, a),
                    "swap_add = swap, compare"
                );
                assert_eq!(w[48..64], c::set_data_seg(8, local.lkey, local.addr));

                let req = Request::FetchAdd {
                    remote,
                    add: a,
                    local,
                };
                let (_, w) = post(&req, pi, 5, FmCeSe::default());
                let op = c_opcode("MLX5_OPCODE_ATOMIC_FA");
                assert_eq!(w[..16], c::set_ctrl_seg(pi, op, 0, 5, 0, 4, 0, 0));
                assert_eq!(w[32..48], c::set_atomic_seg(a, 0), "swap_add = add");
                assert_eq!(w[48..64], c::set_data_seg(8, local.lkey, local.addr));
            }
        }
    }

    #[test]
    fn masked_atomics_ctrl_matches_mlx5dv_set_ctrl_seg() {
        use mlx5::MaskedAtomic;
        let local = Sge {
            addr: 0x40,
            len: 0,
            lkey: 1,
        };
        let remote = Remote {
            addr: 0x80,
            rkey: 2,
        };
        let ops = [
            (
                MaskedAtomic::Cs32 {
                    swap: 1,
                    compare: 2,
                    swap_mask: 3,
                    compare_mask: 4,
                },
                "MLX5_OPCODE_ATOMIC_MASKED_CS",
                4u32,
            ),
            (
                MaskedAtomic::Fa32 {
                    add: 1,
                    field_boundary: 2,
                },
                "MLX5_OPCODE_ATOMIC_MASKED_FA",
                4,
            ),
            (
                MaskedAtomic::Cs64 {
                    swap: 1,
                    compare: 2,
                    swap_mask: 3,
                    compare_mask: 4,
                },
                "MLX5_OPCODE_ATOMIC_MASKED_CS",
                8,
            ),
            (
                MaskedAtomic::Fa64 {
                    add: 1,
                    field_boundary: 2,
                },
                "MLX5_OPCODE_ATOMIC_MASKED_FA",
                8,
            ),
        ];
        for (op, name, size) in ops {
            for pi in WQE_PIS {
                let req = Request::Masked { remote, op, local };
                let (ds, w) = post(&req, pi, 5, FmCeSe::default());
                let opmod = mlx5::opcode::masked_atomic_opmod(size);
                let cb = c::set_ctrl_seg(pi, c_opcode(name), opmod, 5, 0, ds as u8, 0, 0);
                assert_eq!(w[..16], cb, "{op:?}");
                assert_eq!(w[16..32], c::set_raddr_seg(remote.addr, remote.rkey));
                let last = (ds - 1) * 16;
                assert_eq!(
                    w[last..last + 16],
                    c::set_data_seg(size, local.lkey, local.addr)
                );
            }
        }
    }

    fn umr_parts(w: &[u8]) -> (UmrCtrlSeg, MkeyContextSeg) {
        let u = UmrCtrlSeg::read_from_bytes(&w[16..64]).unwrap();
        let m = MkeyContextSeg::read_from_bytes(&w[64..128]).unwrap();
        (u, m)
    }

    fn c_mask(names: &[&str]) -> u64 {
        names
            .iter()
            .map(|n| value(&format!("MLX5_WQE_UMR_CTRL_MKEY_MASK_{n}")))
            .fold(0, |a, b| a | b)
    }

    fn c_flags(names: &[&str]) -> u8 {
        names
            .iter()
            .map(|n| c_u8(&format!("MLX5_WQE_UMR_CTRL_FLAG_{n}")))
            .fold(0, |a, b| a | b)
    }

    #[test]
    fn bind_and_invalidate_match_header_structs_and_constants() {
        // rdma-core qp.c set_bind_wr, with the header's constants.
        let bind_mask = [
            "FREE",
            "MKEY",
            "LEN",
            "START_ADDR",
            "ACCESS_LOCAL_WRITE",
            "ACCESS_REMOTE_READ",
            "ACCESS_REMOTE_WRITE",
            "ACCESS_ATOMIC",
        ];
        let qpn = 0x12_3456;
        for mw_type in [MwType::One, MwType::Two] {
            for pi in WQE_PIS {
                let b = BindMw {
                    mw_rkey: 0x0000_1200,
                    new_rkey: 0x0000_12ab,
                    mw_type,
                    mr_lkey: 0x0bad_cafe,
                    addr: 0x7f00_0000_1000,
                    len: 0x8000_0000,
                    access: mlx5::Access::REMOTE_READ | mlx5::Access::REMOTE_WRITE,
                };
                let (ds, w) = post(&Request::BindMw(b), pi, qpn, FmCeSe::default());
                assert_eq!(ds, 12);
                let op = c_opcode("MLX5_OPCODE_UMR");
                // rdma-core: ctrl->imm = htobe32(mw->rkey).
                let cb = c::set_ctrl_seg(pi, op, 0, qpn, 0, 12, 0, b.mw_rkey.to_be());
                assert_eq!(w[..16], cb);
                let (u, m) = umr_parts(&w);
                let two = mw_type == MwType::Two;
                let mut flags = c_flags(&["INLINE", "TRNSLATION_OFFSET"]);
                let mut mask = c_mask(&bind_mask);
                if two {
                    flags |= c_flags(&["CHECK_FREE"]);
                    mask |= c_mask(&["QPN"]);
                }
                assert_eq!(u.flags, flags, "{mw_type:?}");
                assert_eq!(u.mkey_mask.get(), mask, "{mw_type:?}");
                assert_eq!(u.klm_octowords.get(), 4);
                let access = c_u8("MLX5_WQE_MKEY_CONTEXT_ACCESS_FLAGS_REMOTE_READ")
                    | c_u8("MLX5_WQE_MKEY_CONTEXT_ACCESS_FLAGS_REMOTE_WRITE");
                assert_eq!(m.access_flags, access);
                assert_eq!(m.free, 0);
                let qpn_mkey = 0xab | if two { qpn << 8 } else { 0xffff_ff00 };
                assert_eq!(m.qpn_mkey.get(), qpn_mkey);
                assert_eq!((m.start_addr.get(), m.len.get()), (b.addr, b.len));
                assert_eq!(
                    w[128..144],
                    c::set_klm_seg(b.len as u32, b.mr_lkey, b.addr),
                    "KLM"
                );
                assert!(w[144..192].iter().all(|&x| x == 0), "KLM padding");
            }
        }
        // Local invalidate: a type-2 unbind with key variant 0.
        for pi in WQE_PIS {
            let rkey = 0x00ab_cd12;
            let (ds, w) = post(
                &Request::LocalInvalidate { rkey },
                pi,
                qpn,
                FmCeSe::default(),
            );
            assert_eq!(ds, 8);
            let op = c_opcode("MLX5_OPCODE_UMR");
            assert_eq!(
                w[..16],
                c::set_ctrl_seg(pi, op, 0, qpn, 0, 8, 0, rkey.to_be())
            );
            let (u, m) = umr_parts(&w);
            assert_eq!(
                u.flags,
                c_flags(&["INLINE", "TRNSLATION_OFFSET", "CHECK_QPN"])
            );
            assert_eq!(u.mkey_mask.get(), c_mask(&["FREE", "MKEY", "QPN"]));
            assert_eq!(u.klm_octowords.get(), 0);
            assert_eq!(m.free, c_u8("MLX5_WQE_MKEY_CONTEXT_FREE"));
            assert_eq!(m.qpn_mkey.get(), 0xffff_ff00);
        }
    }
}

mod cqe {
    use super::*;
    use mlx5::cqe::{op_own, Cqe64, CqeOpcode, ErrCqe};

    fn filled(op_own: u8, seed: u8) -> [u8; 64] {
        let mut b: [u8; 64] = core::array::from_fn(|i| (i as u8).wrapping_mul(37) ^ seed);
        b[63] = op_own;
        b
    }

    #[test]
    fn accessors_match_mlx5dv_get_cqe_for_all_256_op_own() {
        for v in 0..=255u8 {
            for seed in [0x00, 0xff, 0x5a] {
                let bytes = filled(v, seed);
                let cf = c::cqe_fields(&bytes);
                let cqe = Cqe64::read_from_bytes(&bytes).unwrap();
                assert_eq!(cqe.owner(), cf.owner, "owner of {v:#04x}");
                assert_eq!(cqe.solicited() as u8, cf.se, "se of {v:#04x}");
                assert_eq!(cqe.format() as u8, cf.format, "format of {v:#04x}");
                assert_eq!(cqe.op_own >> 4, cf.opcode, "opcode nibble of {v:#04x}");
                match cqe.opcode() {
                    Some(op) => assert_eq!(op as u8, cf.opcode, "opcode of {v:#04x}"),
                    None => assert!(
                        CqeOpcode::from_bits(cf.opcode).is_none(),
                        "{v:#04x}: rdma-core says opcode {}",
                        cf.opcode
                    ),
                }
                // The builder gives the same byte back.
                if let Some(op) = cqe.opcode() {
                    assert_eq!(op_own(op, cqe.format(), cf.se != 0, cf.owner != 0), v);
                }
                assert_eq!(
                    cqe.owner(),
                    v & c_u8("MLX5_CQE_OWNER_MASK"),
                    "owner mask of {v:#04x}"
                );
            }
        }
    }

    #[test]
    fn error_cqe_fields_read_back_from_the_header_struct() {
        let req_err = c_u8("MLX5_CQE_REQ_ERR");
        for syndrome in 0..=255u8 {
            for (owner, qpn, wqe_op, counter) in [
                (0u8, 0u32, 0u8, 0u16),
                (1, 0xff_ffff, c_opcode("MLX5_OPCODE_RDMA_WRITE"), 0xffff),
                (0, 0x12_3456, c_opcode("MLX5_OPCODE_UMR"), 0x8001),
            ] {
                let op_own = (req_err << 4) | owner;
                let s_wqe = (u32::from(wqe_op) << 24) | qpn;
                let vendor = syndrome.wrapping_mul(3);
                let b = c::set_err_cqe(0xab_cdef, vendor, syndrome, s_wqe, counter, 0x5c, op_own);
                let e = ErrCqe::read_from_bytes(&b).unwrap();
                assert_eq!(e.syndrome, syndrome);
                assert_eq!(e.syndrome().to_u8(), syndrome);
                assert_eq!(e.vendor_err_synd, vendor);
                assert_eq!(e.srqn.get(), 0xab_cdef);
                assert_eq!((e.qpn(), e.wqe_opcode()), (qpn, wqe_op));
                assert_eq!(e.wqe_counter.get(), counter);
                assert_eq!((e.signature, e.op_own), (0x5c, op_own));
                assert_eq!((e.hw_err_synd, e.hw_synd_type), (0, 0));
                // Read as a plain CQE first, as a poll loop does.
                let cqe = Cqe64::read_from_bytes(&b).unwrap();
                assert_eq!(cqe.opcode(), Some(CqeOpcode::ReqErr));
                assert_eq!(cqe.owner(), owner);
                assert_eq!((cqe.qpn(), cqe.wqe_opcode()), (qpn, wqe_op));
                assert_eq!(cqe.wqe_counter.get(), counter);
                assert_eq!(cqe.as_err(), &e);
                assert_eq!(
                    e.syndrome().wc_status() as u32,
                    c::wc_status_of_syndrome(syndrome)
                );
            }
        }
    }
}

mod syndrome {
    use super::*;
    use mlx5::{Syndrome, WcStatus};

    #[test]
    fn mapping_matches_rdma_core_for_every_byte() {
        for v in 0..=255u8 {
            let rust = Syndrome::from_u8(v).wc_status();
            let c = c::wc_status_of_syndrome(v);
            assert_eq!(rust as u32, c, "syndrome {v:#04x}: {rust:?}");
            assert_eq!(WcStatus::from_u32(c), rust);
        }
    }

    #[test]
    fn unknown_syndromes_are_general_errors() {
        let general = value("IBV_WC_GENERAL_ERR") as u32;
        let named: Vec<u8> = Syndrome::ALL.iter().map(|s| s.to_u8()).collect();
        for v in (0..=255u8).filter(|v| !named.contains(v)) {
            assert_eq!(c::wc_status_of_syndrome(v), general);
            assert_eq!(Syndrome::from_u8(v), Syndrome::Other(v));
            assert_eq!(Syndrome::from_u8(v).wc_status() as u32, general);
        }
    }

    macro_rules! mapping {
        ($( $test:ident : $s:literal => $w:literal ),* $(,)?) => {
            $(
                #[test]
                fn $test() {
                    let s = u8::try_from(value($s)).unwrap();
                    let w = value($w) as u32;
                    assert_eq!(c::wc_status_of_syndrome(s), w, "C switch: {} -> {}", $s, $w);
                    assert_eq!(Syndrome::from_u8(s).wc_status() as u32, w, "{} -> {}", $s, $w);
                }
            )*
        };
    }

    mapping! {
        local_length: "MLX5_CQE_SYNDROME_LOCAL_LENGTH_ERR" => "IBV_WC_LOC_LEN_ERR",
        local_qp_op: "MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR" => "IBV_WC_LOC_QP_OP_ERR",
        local_prot: "MLX5_CQE_SYNDROME_LOCAL_PROT_ERR" => "IBV_WC_LOC_PROT_ERR",
        wr_flush: "MLX5_CQE_SYNDROME_WR_FLUSH_ERR" => "IBV_WC_WR_FLUSH_ERR",
        mw_bind: "MLX5_CQE_SYNDROME_MW_BIND_ERR" => "IBV_WC_MW_BIND_ERR",
        bad_resp: "MLX5_CQE_SYNDROME_BAD_RESP_ERR" => "IBV_WC_BAD_RESP_ERR",
        local_access: "MLX5_CQE_SYNDROME_LOCAL_ACCESS_ERR" => "IBV_WC_LOC_ACCESS_ERR",
        remote_inval_req: "MLX5_CQE_SYNDROME_REMOTE_INVAL_REQ_ERR" => "IBV_WC_REM_INV_REQ_ERR",
        remote_access: "MLX5_CQE_SYNDROME_REMOTE_ACCESS_ERR" => "IBV_WC_REM_ACCESS_ERR",
        remote_op: "MLX5_CQE_SYNDROME_REMOTE_OP_ERR" => "IBV_WC_REM_OP_ERR",
        transport_retry_exc: "MLX5_CQE_SYNDROME_TRANSPORT_RETRY_EXC_ERR" => "IBV_WC_RETRY_EXC_ERR",
        rnr_retry_exc: "MLX5_CQE_SYNDROME_RNR_RETRY_EXC_ERR" => "IBV_WC_RNR_RETRY_EXC_ERR",
        remote_aborted: "MLX5_CQE_SYNDROME_REMOTE_ABORTED_ERR" => "IBV_WC_REM_ABORT_ERR",
    }
}

/// The CQ arm request (arm word and doorbell) against rdma-core's `mlx5_arm_cq`, built from
/// the header's `MLX5_CQ_DB_REQ_NOT` / `MLX5_CQ_DB_REQ_NOT_SOL`.
#[test]
fn cq_arm_words_match_mlx5_arm_cq() {
    use mlx5::doorbell::CqArm;
    for sn in [0, 1, 2, 3, 4, 7] {
        for solicited in [false, true] {
            for ci in [0, 1, 0x7f_ffff, 0xff_ffff, 0x100_0000, u32::MAX] {
                for cqn in [0x80, 0x12_3456, 0xff_ffff] {
                    let arm = CqArm {
                        sn: sn & 3,
                        solicited,
                        ci: ci & 0xff_ffff,
                    };
                    let (rec, db) = c::cq_arm(sn, solicited, ci, cqn);
                    assert_eq!(arm.word().to_be_bytes(), rec, "sn {sn} ci {ci:#x}");
                    assert_eq!(arm.doorbell(cqn).to_be_bytes(), db, "sn {sn} ci {ci:#x}");
                    assert_eq!(CqArm::from_word(u32::from_be_bytes(rec)), arm);
                }
            }
        }
    }
}

mod clock {
    use super::*;
    use mlx5::clock::{ClockInfo, CYCLES_MASK};
    use proptest::prelude::*;

    proptest! {
        /// `ClockInfo::ts_to_ns` is rdma-core's `mlx5dv_ts_to_ns`, for the kernel's
        /// timecounters of any frequency and any stamp: before, after and across the
        /// counter's wrap, near and far from the page, wherever rdma-core's 64-bit product
        /// does not overflow; where it does, the crate's is the exact 128-bit value.
        #[test]
        fn ts_to_ns_is_mlx5dv_ts_to_ns(
            khz in 1u32..=u32::MAX,
            start in any::<u64>(),
            nsec in any::<u64>(),
            moved in 0u64..(1 << 34),
            near in -(1i64 << 33)..(1i64 << 33),
            far in any::<u64>(),
        ) {
            let base = ClockInfo::for_frequency(khz, start, nsec).unwrap();
            let page = base.moved_to(start.wrapping_add(moved % base.overflow_cycles().max(1)));
            for ts in [
                page.last_cycles.wrapping_add(near as u64),
                far,
                far & CYCLES_MASK,
                page.last_cycles.wrapping_add(CYCLES_MASK / 2),
                page.last_cycles.wrapping_add(CYCLES_MASK / 2 + 1),
            ] {
                let (mult, shift) = (page.mult as u128, page.shift);
                let delta = ts.wrapping_sub(page.last_cycles) & page.mask;
                let (exact, fits) = if delta > page.mask / 2 {
                    let back = (page.last_cycles.wrapping_sub(ts) & page.mask) as u128;
                    let p = back * mult;
                    let ns = p.saturating_sub(page.frac as u128) >> shift;
                    (page.nsec.wrapping_sub(ns as u64), p <= u64::MAX as u128 && p >= page.frac as u128)
                } else {
                    let p = delta as u128 * mult + page.frac as u128;
                    (page.nsec.wrapping_add((p >> shift) as u64), p <= u64::MAX as u128)
                };
                prop_assert_eq!(page.ts_to_ns(ts), exact, "stamp {:#x}", ts);
                if fits {
                    prop_assert_eq!(page.ts_to_ns(ts), c::ts_to_ns(&page, ts), "stamp {:#x}", ts);
                }
            }
        }
    }
}
