//! RC requests posted through rdma-core's own provider (`ibv_wr_*` on a memory-backed
//! `struct mlx5_qp`) and encoded by the `mlx5` crate: the same ring bytes, the same producer
//! index, the same refusals. Masked bytes: `common::masked`.
#![allow(missing_docs)]

mod common;

use common::*;
use mlx5::request::{Access, BindMw, MwType};
use mlx5::wqe::{self, EncodeError, Limits};
use mlx5::{Payload, Remote, Request, Sge};
use mlx5_oracle::{
    skip_or_fail, Data, OracleQp, QpKind, Wr, IBV_SEND_FENCE, IBV_SEND_SIGNALED, IBV_SEND_SOLICITED,
};
use proptest::prelude::*;

const REMOTE: Remote = Remote {
    addr: 0xffff_0000_1234_5678,
    rkey: 0xabcd_ef01,
};

/// Every combination of the three verbs flags.
const FLAGS: [u32; 8] = [
    0,
    IBV_SEND_SIGNALED,
    IBV_SEND_SOLICITED,
    IBV_SEND_FENCE,
    IBV_SEND_SIGNALED | IBV_SEND_SOLICITED,
    IBV_SEND_SIGNALED | IBV_SEND_FENCE,
    IBV_SEND_SOLICITED | IBV_SEND_FENCE,
    IBV_SEND_SIGNALED | IBV_SEND_SOLICITED | IBV_SEND_FENCE,
];

/// Producer indices: ring start, inside, the last block of a 16-block ring (every WQE of
/// more than one block wraps), and the 16-bit counter's wrap.
const PIS: [u32; 6] = [0, 1, 15, 0x7fff, 0xfffe, 0xffff];

fn pattern(i: usize) -> u8 {
    (i as u8).wrapping_mul(37) ^ 0x5a
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
            len: 0, // skipped by both
            lkey: 0x22,
        },
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

fn bind(len: u64, access: Access) -> BindMw {
    BindMw {
        mw_rkey: 0x0012_3400,
        new_rkey: 0x0012_34ab,
        mw_type: MwType::Two,
        mr_lkey: 0x0bad_cafe,
        addr: 0x7f00_0000_1000,
        len,
        access,
    }
}

/// The requests of the RC `ibv_wr_*` API, each data shape once.
fn requests<'a>(sgl: &'a [Sge], one: &'a [Sge], payload: &'a [u8]) -> Vec<Request<'a>> {
    let local = Sge {
        addr: 0xdead_0000,
        len: 8,
        lkey: 0x77,
    };
    let mut v = Vec::new();
    for data in [
        Payload::Sgl(sgl),
        Payload::Sgl(one),
        Payload::Sgl(&[]),
        Payload::Inline(&payload[..0]),
        Payload::Inline(&payload[..1]),
        Payload::Inline(&payload[..12]), // fills the inline segment's first DS exactly
        Payload::Inline(&payload[..13]),
        Payload::Inline(&payload[..60]),
        Payload::Inline(&payload[..300]),
    ] {
        v.push(Request::Write {
            remote: REMOTE,
            data,
        });
        v.push(Request::WriteImm {
            remote: REMOTE,
            data,
            imm: 0x1234_5678,
        });
        v.push(Request::Send { data });
        v.push(Request::SendImm {
            data,
            imm: 0x8000_0001,
        });
        v.push(Request::SendInv {
            data,
            rkey: 0x00ab_cd12,
        });
    }
    v.push(Request::Read {
        remote: REMOTE,
        sgl,
    });
    v.push(Request::Read {
        remote: REMOTE,
        sgl: one,
    });
    for (a, b) in [(0u64, 0u64), (1, u64::MAX), (0x0123_4567_89ab_cdef, 42)] {
        v.push(Request::CompareSwap {
            remote: Remote {
                addr: 0xffff_ffff_ffff_fff8,
                rkey: 0x99,
            },
            compare: a,
            swap: b,
            local,
        });
        v.push(Request::FetchAdd {
            remote: REMOTE,
            add: a ^ b,
            local,
        });
    }
    for access in [
        Access::NONE,
        Access::REMOTE_READ | Access::REMOTE_WRITE,
        Access::LOCAL_WRITE | Access::REMOTE_ATOMIC,
        Access::REMOTE_READ | Access::ZERO_BASED,
    ] {
        v.push(Request::BindMw(bind(0x8000_0000, access)));
        v.push(Request::BindMw(bind(1, access)));
    }
    v.push(Request::BindMw(bind(0, Access::NONE)));
    v.push(Request::LocalInvalidate { rkey: 0x00ab_cd12 });
    v
}

/// Each request alone, on a fresh pair, for every flag combination, producer index and
/// setter: ring, `sq.cur_post` and the doorbell record agree.
#[test]
fn every_rc_request_matches_rdma_core() {
    if !skip_or_fail("every_rc_request_matches_rdma_core") {
        return;
    }
    let payload: Vec<u8> = (0..512u32).map(|i| (i * 7 + 3) as u8).collect();
    let sgl = sgl();
    let one = [sgl[2]];
    let mut n = 0;
    for req in requests(&sgl, &one, &payload) {
        for flags in FLAGS {
            for pi in PIS {
                for setter in [Setter::List, Setter::Pieces(5)] {
                    let mut p = Pair::new(QpKind::Rc, 16, pi, pattern);
                    p.post(&req, flags, setter);
                    p.assert_same();
                    n += 1;
                }
            }
        }
    }
    assert!(n > 5000, "{n} cases");
}

/// rdma-core arms an initiator small fence on the request after a bind or local invalidate
/// (`fm_cache`); the crate's send queue keeps it as `next_fence`. Both in one ring, with an
/// explicit fence on the next request winning over it.
#[test]
fn fence_after_bind_and_local_invalidate_matches_rdma_core() {
    if !skip_or_fail("fence_after_bind_and_local_invalidate_matches_rdma_core") {
        return;
    }
    let sgl = sgl();
    for pi in PIS {
        let mut p = Pair::new(QpKind::Rc, 64, pi, pattern);
        let write = Request::Write {
            remote: REMOTE,
            data: Payload::Sgl(&sgl),
        };
        p.post(
            &Request::BindMw(bind(64, Access::REMOTE_READ)),
            0,
            Setter::List,
        );
        p.post(&write, IBV_SEND_SIGNALED, Setter::List); // initiator small fence
        p.post(&write, 0, Setter::List); // none again
        p.post(&Request::LocalInvalidate { rkey: 0x3400 }, 0, Setter::List);
        p.post(&write, IBV_SEND_FENCE, Setter::List); // the explicit fence wins
        p.post(
            &Request::BindMw(bind(0, Access::NONE)),
            IBV_SEND_SIGNALED,
            Setter::List,
        );
        p.post(&Request::BindMw(bind(8, Access::NONE)), 0, Setter::List); // fenced bind
        p.assert_same();
        // The second request really carries the fence (both sides agree on 0x20 | 0x08).
        let second = (pi as usize + 3) % 64 * 64; // a bind takes 3 blocks
        assert_eq!(p.oracle.ring()[second + 11], 0x28);
    }
}

/// What rdma-core refuses (ENOMEM over the QP's `max_gs` / `max_inline_data`, EOPNOTSUPP
/// for a bind over 2 GiB) the crate refuses too, and both leave the ring untouched; what
/// rdma-core takes at the limit, the crate takes.
#[test]
fn refusals_match_rdma_core() {
    if !skip_or_fail("refusals_match_rdma_core") {
        return;
    }
    let (max_gs, max_inline) = (4, 64);
    let lim = Limits {
        max_sge: max_gs,
        max_inline,
    };
    let payload = [0x42u8; 65];
    let sgl: Vec<Sge> = (0..5)
        .map(|i| Sge {
            addr: 0x1000 * i,
            len: 16,
            lkey: 3,
        })
        .collect();
    let cases: Vec<(Request<'_>, i32)> = vec![
        (
            Request::Write {
                remote: REMOTE,
                data: Payload::Sgl(&sgl[..4]),
            },
            0,
        ),
        (
            Request::Write {
                remote: REMOTE,
                data: Payload::Sgl(&sgl),
            },
            libc_enomem(),
        ),
        (
            Request::Send {
                data: Payload::Inline(&payload[..64]),
            },
            0,
        ),
        (
            Request::Send {
                data: Payload::Inline(&payload),
            },
            libc_enomem(),
        ),
        (
            Request::Read {
                remote: REMOTE,
                sgl: &sgl,
            },
            libc_enomem(),
        ),
        (Request::BindMw(bind(1 << 31, Access::REMOTE_READ)), 0),
        (
            Request::BindMw(bind((1 << 31) + 1, Access::REMOTE_READ)),
            libc_eopnotsupp(),
        ),
    ];
    for (req, want) in cases {
        let mut q = OracleQp::new(QpKind::Rc, QPN, 16, max_inline, max_gs);
        q.ring_mut().fill(0xee);
        let before = q.cur_post();
        let rc = post_raw(&mut q, &req);
        assert_eq!(rc, want, "rdma-core on {req:?}");
        let crate_says = wqe::wqe_ds(&req, &lim);
        if want == 0 {
            assert!(crate_says.is_ok(), "{req:?}: {crate_says:?}");
        } else {
            assert!(
                matches!(
                    crate_says,
                    Err(EncodeError::TooManySge { .. }
                        | EncodeError::InlineTooLong { .. }
                        | EncodeError::BindTooLong { .. })
                ),
                "{req:?}: {crate_says:?}"
            );
            // rdma-core rolled back: no block consumed, no doorbell.
            assert_eq!(q.cur_post(), before);
            assert_eq!(q.sq_dbrec(), 0);
        }
    }
}

fn libc_enomem() -> i32 {
    12
}

fn libc_eopnotsupp() -> i32 {
    95
}

/// One request through rdma-core on a QP of any limits, returning `ibv_wr_complete`'s value.
fn post_raw(q: &mut OracleQp, req: &Request<'_>) -> i32 {
    let list: Vec<mlx5_oracle::IbvSge>;
    let (op, data) = match *req {
        Request::Write { .. }
        | Request::Read { .. }
        | Request::Send { .. }
        | Request::BindMw(_) => op_of(req, None).expect("a builder for each"),
        ref r => panic!("not used here: {r:?}"),
    };
    let data = match data {
        None => None,
        Some(Payload::Sgl(l)) => {
            list = l.iter().copied().map(Into::into).collect();
            Some(Data::SgeList(&list))
        }
        Some(Payload::Inline(b)) => Some(Data::Inline(b)),
    };
    q.post(&[Wr {
        wr_id: 1,
        flags: 0,
        op,
        addr: mlx5_oracle::Addr::None,
        data,
    }])
}

/// A lone inline WQE goes to the BlueFlame register through rdma-core's `mlx5_bf_copy`
/// (64-byte chunks, its source wrapping at the ring end); the crate's `wqe::linearize` of the
/// same blocks gives the same bytes.
#[test]
fn blueflame_copy_matches_linearize() {
    if !skip_or_fail("blueflame_copy_matches_linearize") {
        return;
    }
    let payload: Vec<u8> = (0..200u32).map(|i| (i * 13 + 1) as u8).collect();
    for pi in [0u32, 14, 15, 0xffff] {
        for len in [1usize, 28, 60, 100, 200] {
            let mut p = Pair::new(QpKind::Rc, 16, pi, pattern);
            let req = Request::Write {
                remote: REMOTE,
                data: Payload::Inline(&payload[..len]),
            };
            let offset = p.oracle.bf_offset() as usize;
            p.post(&req, IBV_SEND_SIGNALED, Setter::List);
            p.assert_same();
            let bbs = wqe::ds_to_bbs(2 + (len + 4).div_ceil(16));
            let mut lin = vec![0u8; bbs * 64];
            wqe::linearize(&p.ring, pi as usize % 16, bbs, &mut lin);
            let bf = &p.oracle.bf_reg()[offset..offset + bbs * 64];
            // rdma-core copied its own ring; the bytes it left alone are the crate's masked
            // ones (ctrl.imm): compare the copy with rdma-core's ring and the crate's
            // linearized WQE apart from those.
            let mut own = vec![0u8; bbs * 64];
            wqe::linearize(p.oracle.ring(), pi as usize % 16, bbs, &mut own);
            assert_eq!(
                bf,
                &own[..],
                "BlueFlame copy of rdma-core's ring, pi {pi} len {len}"
            );
            assert_eq!(bf[..12], lin[..12], "ctrl");
            assert_eq!(bf[16..], lin[16..], "pi {pi} len {len}");
            assert_eq!(
                p.oracle.bf_offset() as usize,
                offset ^ 256,
                "bf->offset toggles"
            );
        }
    }
}

#[derive(Clone, Debug)]
enum Gen {
    Write(Vec<Sge>),
    WriteInline(usize),
    WriteImm(Vec<Sge>, u32),
    Read(Vec<Sge>),
    Send(Vec<Sge>),
    SendInline(usize, u32),
    SendInv(Vec<Sge>, u32),
    Cas(u64, u64, u64),
    Faa(u64, u64),
    Bind(u64, u32),
    LocalInv(u32),
}

fn arb_sge() -> impl Strategy<Value = Sge> {
    (
        any::<u64>(),
        prop_oneof![Just(0u32), 1u32..=0x7fff_ffff],
        any::<u32>(),
    )
        .prop_map(|(addr, len, lkey)| Sge { addr, len, lkey })
}

fn arb_req() -> impl Strategy<Value = Gen> {
    let sgl = || prop::collection::vec(arb_sge(), 0..=MAX_GS);
    prop_oneof![
        sgl().prop_map(Gen::Write),
        (0usize..=MAX_INLINE).prop_map(Gen::WriteInline),
        (sgl(), any::<u32>()).prop_map(|(s, i)| Gen::WriteImm(s, i)),
        sgl().prop_map(Gen::Read),
        sgl().prop_map(Gen::Send),
        (0usize..=MAX_INLINE, any::<u32>()).prop_map(|(l, i)| Gen::SendInline(l, i)),
        (sgl(), any::<u32>()).prop_map(|(s, k)| Gen::SendInv(s, k)),
        (any::<u64>(), any::<u64>(), any::<u64>()).prop_map(|(a, c, s)| Gen::Cas(a & !7, c, s)),
        (any::<u64>(), any::<u64>()).prop_map(|(a, x)| Gen::Faa(a & !7, x)),
        (0u64..=1 << 31, any::<u32>()).prop_map(|(l, a)| Gen::Bind(l, a & 0x2f)),
        any::<u32>().prop_map(Gen::LocalInv),
    ]
}

fn to_request<'a>(g: &'a Gen, payload: &'a [u8]) -> Request<'a> {
    let local = Sge {
        addr: 0x4000,
        len: 8,
        lkey: 5,
    };
    match g {
        Gen::Write(s) => Request::Write {
            remote: REMOTE,
            data: Payload::Sgl(s),
        },
        Gen::WriteInline(l) => Request::Write {
            remote: REMOTE,
            data: Payload::Inline(&payload[..*l]),
        },
        Gen::WriteImm(s, imm) => Request::WriteImm {
            remote: REMOTE,
            data: Payload::Sgl(s),
            imm: *imm,
        },
        Gen::Read(s) => Request::Read {
            remote: REMOTE,
            sgl: s,
        },
        Gen::Send(s) => Request::Send {
            data: Payload::Sgl(s),
        },
        Gen::SendInline(l, imm) => Request::SendImm {
            data: Payload::Inline(&payload[..*l]),
            imm: *imm,
        },
        Gen::SendInv(s, rkey) => Request::SendInv {
            data: Payload::Sgl(s),
            rkey: *rkey,
        },
        Gen::Cas(addr, compare, swap) => Request::CompareSwap {
            remote: Remote {
                addr: *addr,
                rkey: 1,
            },
            compare: *compare,
            swap: *swap,
            local,
        },
        Gen::Faa(addr, add) => Request::FetchAdd {
            remote: Remote {
                addr: *addr,
                rkey: 1,
            },
            add: *add,
            local,
        },
        Gen::Bind(len, access) => Request::BindMw(bind(*len, Access(*access))),
        Gen::LocalInv(rkey) => Request::LocalInvalidate { rkey: *rkey },
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// A random sequence of RC requests (lengths, gather lists with empty entries, inline
    /// sizes up to 512, flags, setters) from a random producer index on a 16- or 64-block
    /// ring filled with a random pattern: after every post the rings agree.
    #[test]
    fn random_rc_sequences_match_rdma_core(
        reqs in prop::collection::vec((arb_req(), 0usize..8, 1usize..40), 1..24),
        pi in prop_oneof![0u32..64, 0xffc0u32..=0xffff, any::<u32>()],
        big in any::<bool>(),
        seed in any::<u8>(),
    ) {
        if !skip_or_fail("random_rc_sequences_match_rdma_core") {
            return Ok(());
        }
        let payload: Vec<u8> = (0..MAX_INLINE).map(|i| (i as u8) ^ seed).collect();
        let cnt = if big { 64 } else { 16 };
        let mut p = Pair::new(QpKind::Rc, cnt, pi, |i| (i as u8).wrapping_mul(seed | 1));
        for (g, f, piece) in &reqs {
            let req = to_request(g, &payload);
            let setter = if piece % 2 == 0 { Setter::List } else { Setter::Pieces(*piece) };
            p.post(&req, FLAGS[*f], setter);
            p.assert_same();
        }
    }
}

/// The same requests through rdma-core's classic `ibv_post_send` (`mlx5_post_send`), which
/// also writes `ctrl.imm` = 0 for opcodes without immediate (so that field is compared
/// here), takes type-1 window binds (`ibv_bind_mw`'s path, which `ibv_wr_bind_mw` does not)
/// and gathers inline data from a list.
#[test]
fn every_rc_request_matches_rdma_core_classic_post_send() {
    if !skip_or_fail("every_rc_request_matches_rdma_core_classic_post_send") {
        return;
    }
    let payload: Vec<u8> = (0..512u32).map(|i| (i * 11 + 5) as u8).collect();
    let sgl = sgl();
    let one = [sgl[2]];
    let mut reqs = requests(&sgl, &one, &payload);
    for access in [Access::NONE, Access::REMOTE_READ | Access::REMOTE_WRITE] {
        for len in [0, 1, 0x8000_0000] {
            reqs.push(Request::BindMw(BindMw {
                mw_type: MwType::One,
                ..bind(len, access)
            }));
        }
    }
    let mut n = 0;
    for req in &reqs {
        for flags in FLAGS {
            for pi in PIS {
                let mut p = Pair::new(QpKind::Rc, 16, pi, pattern);
                p.classic = true;
                p.post(req, flags, Setter::List);
                p.assert_same();
                n += 1;
            }
        }
    }
    assert!(n > 2500, "{n} cases");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// Random sequences through the classic API, with the fence after a bind carried by
    /// rdma-core's `fm_cache` across calls.
    #[test]
    fn random_rc_sequences_match_rdma_core_classic(
        reqs in prop::collection::vec((arb_req(), 0usize..8), 1..24),
        pi in any::<u32>(),
        seed in any::<u8>(),
    ) {
        if !skip_or_fail("random_rc_sequences_match_rdma_core_classic") {
            return Ok(());
        }
        let payload: Vec<u8> = (0..MAX_INLINE).map(|i| (i as u8) ^ seed).collect();
        let mut p = Pair::new(QpKind::Rc, 64, pi, |i| (i as u8).wrapping_mul(seed | 1));
        p.classic = true;
        for (g, f) in &reqs {
            p.post(&to_request(g, &payload), FLAGS[*f], Setter::List);
            p.assert_same();
        }
    }
}

/// rdma-core's default (`MLX5_POST_SEND_PREFER_BF` unset: `get_always_bf()` returns 1,
/// `ctx->prefer_bf = 1`) copies a lone WQE of more than one DS with BlueFlame whether or not
/// it carries inline data (`post_send_db`: `(inl || ctx->prefer_bf) && size > 1`), and so
/// does the crate's direct path by default (`one_block`'s fast paths: a read, write or send
/// of one buffer is rung with a BlueFlame block). The oracle must do the same.
#[test]
fn blueflame_copy_of_a_lone_wqe_without_inline_data_as_rdma_core_by_default() {
    if !skip_or_fail("blueflame_copy_of_a_lone_wqe_without_inline_data") {
        return;
    }
    let sgl = [Sge {
        addr: 0x1000,
        len: 64,
        lkey: 0x11,
    }];
    for pi in [0u32, 5, 15] {
        let mut p = Pair::new(QpKind::Rc, 16, pi, pattern);
        let offset = p.oracle.bf_offset() as usize;
        let read = Request::Read {
            remote: REMOTE,
            sgl: &sgl,
        };
        p.post(&read, IBV_SEND_SIGNALED, Setter::List);
        p.assert_same();
        let at = (pi as usize % 16) * 64;
        assert_eq!(
            &p.oracle.bf_reg()[offset..offset + 48],
            &p.oracle.ring()[at..at + 48],
            "pi {pi}: a lone 3-DS read is copied with BlueFlame by rdma-core's default"
        );
    }
}
