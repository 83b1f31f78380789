//! Encode -> ring -> linearize -> decode gives the request back, for every opcode, payload
//! size, gather-list length, ring position and producer index; every encode error leaves the
//! ring untouched; malformed WQEs are refused with the right error and never panic the
//! decoder.
#![allow(missing_docs)]

use mlx5::ctrl::{CompletionMode, CtrlSeg, Fence, FmCeSe};
use mlx5::request::MwType;
use mlx5::wqe::{
    decode, ds_to_bbs, encode, linearize, wqe_ds, DecodeError, Decoded, EncodeError, Limits, Span,
};
use mlx5::{Access, Be32, BindMw, MaskedAtomic, Opcode, Payload, Remote, Request, Sge};
use proptest::prelude::*;
use zerocopy::IntoBytes;

const BB: usize = 64;
/// Ring filler: any byte the encoder leaves alone keeps it.
const FILL: u8 = 0xa5;

/// rdma-core's limits: a WQE is at most 63 DS and 16 blocks.
const MAX_DS: usize = 63;

/// The longest gather entry a data segment holds: bit 31 of `byte_count` is the inline flag
/// (`MLX5_INLINE_SEG`), so a pointer segment carries 31 bits of length.
const MAX_SGE_LEN: u32 = 0x7fff_ffff;

fn all_flags() -> Vec<FmCeSe> {
    let mut v = Vec::new();
    for fence in Fence::ALL {
        for completion in CompletionMode::ALL {
            for solicited in [false, true] {
                v.push(FmCeSe {
                    fence,
                    completion,
                    solicited,
                });
            }
        }
    }
    v
}

fn few_flags() -> [FmCeSe; 3] {
    [
        FmCeSe::default(),
        FmCeSe {
            fence: Fence::SmallAndFence,
            completion: CompletionMode::Always,
            solicited: true,
        },
        FmCeSe {
            fence: Fence::InitiatorSmall,
            completion: CompletionMode::CqeAndEqe,
            solicited: false,
        },
    ]
}

/// Validates, then encodes at block `pi % ring blocks`: the way a send queue posts. Returns
/// (ds, blocks) or the error, in which case nothing was written.
fn post(
    ring: &mut [u8],
    req: &Request<'_>,
    lim: &Limits,
    pi: u16,
    qpn: u32,
    flags: FmCeSe,
) -> Result<(usize, usize), EncodeError> {
    let ds = wqe_ds(req, lim)?;
    let bbs = ds_to_bbs(ds);
    let start = pi as usize % (ring.len() / BB);
    let mut span = Span::of_ring(ring, start, bbs);
    assert_eq!(span.len(), bbs * BB);
    let n = encode(req, ds, pi, qpn, flags, &mut span);
    assert_eq!(n, bbs, "encode's block count for {req:?}");
    Ok((ds, bbs))
}

/// What the decoder gives back for `req`: zero-length entries skipped, an empty payload as
/// `Inline(&[])`, atomics' local length fixed by the operand size, bind fields the WQE does
/// not carry dropped, and a type-2 unbind to key variant 0 read as a local invalidate (the
/// same WQE in rdma-core).
fn normalize<'a>(req: Request<'a>, store: &'a mut Vec<Sge>) -> Request<'a> {
    fn payload<'a>(p: Payload<'a>, store: &'a mut Vec<Sge>) -> Payload<'a> {
        match p {
            Payload::Inline(b) => Payload::Inline(b),
            Payload::Sgl(s) => {
                store.extend(s.iter().filter(|e| e.len != 0));
                if store.is_empty() {
                    Payload::Inline(&[])
                } else {
                    Payload::Sgl(&store[..])
                }
            }
        }
    }
    match req {
        Request::Write { remote, data } => Request::Write {
            remote,
            data: payload(data, store),
        },
        Request::WriteImm { remote, data, imm } => Request::WriteImm {
            remote,
            data: payload(data, store),
            imm,
        },
        Request::Send { data } => Request::Send {
            data: payload(data, store),
        },
        Request::SendImm { data, imm } => Request::SendImm {
            data: payload(data, store),
            imm,
        },
        Request::SendInv { data, rkey } => Request::SendInv {
            data: payload(data, store),
            rkey,
        },
        Request::Read { remote, sgl } => {
            store.extend(sgl.iter().filter(|e| e.len != 0));
            Request::Read {
                remote,
                sgl: &store[..],
            }
        }
        Request::CompareSwap {
            remote,
            compare,
            swap,
            local,
        } => Request::CompareSwap {
            remote,
            compare,
            swap,
            local: Sge { len: 8, ..local },
        },
        Request::FetchAdd { remote, add, local } => Request::FetchAdd {
            remote,
            add,
            local: Sge { len: 8, ..local },
        },
        Request::Masked { remote, op, local } => Request::Masked {
            remote,
            op,
            local: Sge {
                len: op.size(),
                ..local
            },
        },
        Request::BindMw(b) if b.len == 0 => {
            let variant = b.new_rkey & 0xff;
            if b.mw_type == MwType::Two && variant == 0 {
                Request::LocalInvalidate { rkey: b.mw_rkey }
            } else {
                Request::BindMw(BindMw {
                    mw_rkey: b.mw_rkey,
                    new_rkey: (b.mw_rkey & !0xff) | variant,
                    mw_type: b.mw_type,
                    mr_lkey: 0,
                    addr: 0,
                    len: 0,
                    access: Access::NONE,
                })
            }
        }
        Request::BindMw(b) => {
            let carried = Access::LOCAL_WRITE
                | Access::REMOTE_WRITE
                | Access::REMOTE_READ
                | Access::REMOTE_ATOMIC
                | Access::ZERO_BASED;
            let mut access = Access(b.access.0 & carried.0);
            if b.addr == 0 {
                // A zero-based window at address 0 is the same WQE as a plain one.
                access = Access(access.0 & !Access::ZERO_BASED.0);
            }
            Request::BindMw(BindMw { access, ..b })
        }
        other => other,
    }
}

/// The opcode modifier the WQE must carry (UCX: `0x08 | (log2(size) - 2)` for masked atomics).
fn want_opmod(req: &Request<'_>) -> u8 {
    match req {
        Request::Masked { op, .. } if op.size() == 4 => 0x08,
        Request::Masked { .. } => 0x09,
        _ => 0,
    }
}

/// Posts `req` into a ring of `ring_bbs` blocks filled with [`FILL`], checks that only the
/// WQE's blocks changed, decodes it back and compares everything. Returns (ds, blocks).
fn roundtrip(
    req: &Request<'_>,
    lim: &Limits,
    ring_bbs: usize,
    pi: u16,
    qpn: u32,
    flags: FmCeSe,
) -> (usize, usize) {
    let mut ring = vec![FILL; ring_bbs * BB];
    let (ds, bbs) = post(&mut ring, req, lim, pi, qpn, flags)
        .unwrap_or_else(|e| panic!("{req:?} refused: {e}"));
    assert!(ds <= MAX_DS && bbs <= 16 && bbs <= ring_bbs);
    let start = pi as usize % ring_bbs;
    for blk in 0..ring_bbs {
        let inside = (blk + ring_bbs - start) % ring_bbs < bbs;
        if !inside {
            assert!(
                ring[blk * BB..(blk + 1) * BB].iter().all(|&b| b == FILL),
                "block {blk} outside the WQE (start {start}, {bbs} blocks) was written"
            );
        }
    }
    let mut lin = vec![0u8; bbs * BB];
    linearize(&ring, start, bbs, &mut lin);
    let mut sges = [Sge::default(); 64];
    let d: Decoded<'_> =
        decode(&lin, &mut sges).unwrap_or_else(|e| panic!("decode of {req:?} at pi {pi:#x}: {e}"));
    assert_eq!(d.pi, pi, "pi of {req:?}");
    assert_eq!(d.qpn, qpn, "qpn of {req:?}");
    assert_eq!(d.ds as usize, ds, "ds of {req:?}");
    assert_eq!(d.bbs(), bbs);
    assert_eq!(d.flags, flags, "flags of {req:?}");
    assert_eq!(d.opmod, want_opmod(req), "opmod of {req:?}");
    assert_eq!(d.request.opcode(), req.opcode());
    let mut store = Vec::new();
    let want = normalize(*req, &mut store);
    assert_eq!(d.request, want, "pi {pi:#x} start {start}");
    (ds, bbs)
}

const REMOTE: Remote = Remote {
    addr: 0x7f12_3456_7000,
    rkey: 0xdead_beef,
};
const LOCAL: Sge = Sge {
    addr: 0x7f00_0000_0040,
    len: 0,
    lkey: 0x1234,
};

fn sgl3() -> Vec<Sge> {
    vec![
        Sge {
            addr: 0x1000,
            len: 100,
            lkey: 1,
        },
        Sge {
            addr: 0x2000,
            len: 0,
            lkey: 2,
        },
        Sge {
            addr: u64::MAX,
            len: MAX_SGE_LEN,
            lkey: u32::MAX,
        },
    ]
}

/// Every kind of request: every opcode, both payload kinds, every masked atomic, both
/// window types, bind and unbind, and local invalidate.
fn every_request<'a>(inline: &'a [u8], sgl: &'a [Sge]) -> Vec<Request<'a>> {
    let bind = |mw_type, len, access| {
        Request::BindMw(BindMw {
            mw_rkey: 0x00ab_cd00,
            new_rkey: 0x00ab_cd42,
            mw_type,
            mr_lkey: 0x55,
            addr: 0x7f00_0000_1000,
            len,
            access,
        })
    };
    let rw = Access::REMOTE_READ | Access::REMOTE_WRITE;
    let mut v = vec![
        Request::Nop,
        Request::Write {
            remote: REMOTE,
            data: Payload::Inline(inline),
        },
        Request::Write {
            remote: REMOTE,
            data: Payload::Sgl(sgl),
        },
        Request::WriteImm {
            remote: REMOTE,
            data: Payload::Inline(inline),
            imm: 0x0102_0304,
        },
        Request::WriteImm {
            remote: REMOTE,
            data: Payload::Sgl(sgl),
            imm: u32::MAX,
        },
        Request::WriteImm {
            remote: REMOTE,
            data: Payload::Inline(&[]),
            imm: 7,
        },
        Request::Read {
            remote: REMOTE,
            sgl,
        },
        Request::Send {
            data: Payload::Inline(inline),
        },
        Request::Send {
            data: Payload::Sgl(sgl),
        },
        Request::SendImm {
            data: Payload::Inline(inline),
            imm: 0x8000_0001,
        },
        Request::SendImm {
            data: Payload::Sgl(sgl),
            imm: 0,
        },
        Request::SendInv {
            data: Payload::Inline(inline),
            rkey: 0x4242_4242,
        },
        Request::SendInv {
            data: Payload::Sgl(sgl),
            rkey: 1,
        },
        Request::CompareSwap {
            remote: REMOTE,
            compare: 0x0123_4567_89ab_cdef,
            swap: u64::MAX,
            local: LOCAL,
        },
        Request::FetchAdd {
            remote: REMOTE,
            add: 1,
            local: LOCAL,
        },
        Request::LocalInvalidate { rkey: 0x00ab_cd42 },
        bind(MwType::One, 0x1000, rw),
        bind(
            MwType::Two,
            0x1000,
            rw | Access::REMOTE_ATOMIC | Access::LOCAL_WRITE,
        ),
        bind(
            MwType::Two,
            1 << 31,
            Access::REMOTE_READ | Access::ZERO_BASED,
        ),
        bind(MwType::One, 1, Access::NONE),
        bind(MwType::One, 0, Access::NONE),
        bind(MwType::Two, 0, Access::NONE),
    ];
    for op in [
        MaskedAtomic::Cs32 {
            swap: 1,
            compare: 2,
            swap_mask: 0xffff_0000,
            compare_mask: 0x0000_ffff,
        },
        MaskedAtomic::Fa32 {
            add: u32::MAX,
            field_boundary: 0x8080_8080,
        },
        MaskedAtomic::Cs64 {
            swap: u64::MAX,
            compare: 0,
            swap_mask: 0xff00_ff00_ff00_ff00,
            compare_mask: 0x00ff_00ff_00ff_00ff,
        },
        MaskedAtomic::Fa64 {
            add: 3,
            field_boundary: 1 << 63,
        },
    ] {
        v.push(Request::Masked {
            remote: REMOTE,
            op,
            local: LOCAL,
        });
    }
    v
}

fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 31 + 7) as u8).collect()
}

#[test]
fn every_opcode_at_every_start_block_round_trips() {
    let inline = pattern(44);
    let sgl = sgl3();
    let lim = Limits {
        max_sge: 8,
        max_inline: 256,
    };
    let reqs = every_request(&inline, &sgl);
    let mut opcodes = std::collections::HashSet::new();
    for ring_bbs in [8usize, 16] {
        for req in &reqs {
            opcodes.insert(req.opcode());
            for start in 0..ring_bbs {
                // Low producer indices and ones just before the 16-bit wrap.
                for pi in [
                    start as u16,
                    (0xfff0 + start) as u16,
                    (0x10000 - ring_bbs + start) as u16,
                ] {
                    for flags in few_flags() {
                        roundtrip(req, &lim, ring_bbs, pi, 0xab_cdef, flags);
                    }
                }
            }
        }
    }
    // Every opcode this crate encodes appeared (LocalInval is never posted: a local
    // invalidate is a UMR WQE, as in rdma-core).
    for op in Opcode::ALL {
        assert!(
            opcodes.contains(&op) || op == Opcode::LocalInval,
            "{op:?} not covered"
        );
    }
}

#[test]
fn every_fm_ce_se_round_trips() {
    let inline = pattern(12);
    let sgl = sgl3();
    let lim = Limits {
        max_sge: 8,
        max_inline: 64,
    };
    for req in &every_request(&inline, &sgl) {
        for flags in all_flags() {
            roundtrip(req, &lim, 8, 0xffff, 1, flags);
        }
    }
}

#[test]
fn qpn_extremes_round_trip() {
    let inline = pattern(5);
    let sgl = sgl3();
    let lim = Limits {
        max_sge: 8,
        max_inline: 64,
    };
    for req in &every_request(&inline, &sgl) {
        for qpn in [0, 1, 0x80_0000, 0xff_ffff] {
            roundtrip(req, &lim, 16, 0x7fff, qpn, FmCeSe::default());
        }
    }
}

/// ceil((len + 4) / 16), the inline DS count from the facts (not the crate's function).
fn inline_ds(len: usize) -> usize {
    if len == 0 {
        0
    } else {
        (len + 4).div_ceil(16)
    }
}

#[test]
fn inline_sizes_up_to_the_largest_wqe_round_trip() {
    let lim = Limits {
        max_sge: 1,
        max_inline: 4096,
    };
    let data = pattern(1024);
    // Largest inline payloads: 63 DS minus the control (and remote address) segments.
    let max_write = (MAX_DS - 2) * 16 - 4; // 972
    let max_send = (MAX_DS - 1) * 16 - 4; // 988
    for len in 0..=max_send {
        let d = &data[..len];
        let mut reqs = vec![
            (
                1,
                Request::Send {
                    data: Payload::Inline(d),
                },
            ),
            (
                1,
                Request::SendImm {
                    data: Payload::Inline(d),
                    imm: len as u32,
                },
            ),
            (
                1,
                Request::SendInv {
                    data: Payload::Inline(d),
                    rkey: !(len as u32),
                },
            ),
        ];
        if len <= max_write {
            reqs.push((
                2,
                Request::Write {
                    remote: REMOTE,
                    data: Payload::Inline(d),
                },
            ));
            reqs.push((
                2,
                Request::WriteImm {
                    remote: REMOTE,
                    data: Payload::Inline(d),
                    imm: 9,
                },
            ));
        }
        // Starts that put the WQE's end (or a block boundary inside the payload) at the ring end.
        for start in [0u16, 7, 15] {
            for (head, req) in &reqs {
                let pi = 0xfff0u16.wrapping_add(start);
                let (ds, _) = roundtrip(req, &lim, 16, pi, 3, FmCeSe::default());
                assert_eq!(ds, head + inline_ds(len), "len {len}");
            }
        }
    }
    // One byte more does not fit a WQE.
    let too_big = Request::Write {
        remote: REMOTE,
        data: Payload::Inline(&data[..max_write + 1]),
    };
    assert_eq!(
        wqe_ds(&too_big, &lim),
        Err(EncodeError::TooLarge { ds: 64 })
    );
    let too_big = Request::Send {
        data: Payload::Inline(&data[..max_send + 1]),
    };
    assert_eq!(
        wqe_ds(&too_big, &lim),
        Err(EncodeError::TooLarge { ds: 64 })
    );
}

#[test]
fn named_inline_sizes_and_block_boundaries() {
    let lim = Limits {
        max_sge: 1,
        max_inline: 512,
    };
    let data = pattern(512);
    // 0, the sizes that fill a DS exactly (12, 28, 44, 60: 16k - 4), one past them, and
    // the sizes that fill whole blocks for a write (ctrl + raddr take 32 bytes of block 0).
    for len in [
        0usize, 1, 11, 12, 13, 27, 28, 29, 43, 44, 45, 59, 60, 61, 92, 156, 220, 284, 512,
    ] {
        for start in 0..16u16 {
            let req = Request::Write {
                remote: REMOTE,
                data: Payload::Inline(&data[..len]),
            };
            let (ds, bbs) = roundtrip(&req, &lim, 16, start, 1, FmCeSe::default());
            assert_eq!(ds, 2 + inline_ds(len));
            assert_eq!(bbs, (2 + inline_ds(len)).div_ceil(4));
        }
    }
}

#[test]
fn sgl_lengths_up_to_max_sge_round_trip() {
    let all: Vec<Sge> = (0..64u32)
        .map(|i| Sge {
            addr: 0x1_0000_0000 * u64::from(i) + 0x40,
            len: i * 1000 + 1,
            lkey: 0x100 + i,
        })
        .collect();
    // The largest gather lists one WQE holds: 61 after ctrl + raddr, 62 after ctrl alone.
    for max_sge in [1usize, 4, 16, 61, 62] {
        let lim = Limits {
            max_sge,
            max_inline: 0,
        };
        for n in 1..=max_sge {
            let s = &all[..n];
            let mut reqs = vec![
                Request::Send {
                    data: Payload::Sgl(s),
                },
                Request::SendImm {
                    data: Payload::Sgl(s),
                    imm: 5,
                },
                Request::SendInv {
                    data: Payload::Sgl(s),
                    rkey: 6,
                },
            ];
            if n <= 61 {
                reqs.push(Request::Write {
                    remote: REMOTE,
                    data: Payload::Sgl(s),
                });
                reqs.push(Request::WriteImm {
                    remote: REMOTE,
                    data: Payload::Sgl(s),
                    imm: 7,
                });
                reqs.push(Request::Read {
                    remote: REMOTE,
                    sgl: s,
                });
            }
            for req in &reqs {
                for start in [0u16, 9, 15] {
                    roundtrip(req, &lim, 16, 0xfff0 + start, 2, FmCeSe::default());
                }
            }
        }
        // Zero-length entries are skipped and do not count against max_sge.
        let mut with_zeros = Vec::new();
        for s in &all[..max_sge] {
            with_zeros.push(Sge { len: 0, ..*s });
            with_zeros.push(*s);
        }
        let req = Request::Send {
            data: Payload::Sgl(&with_zeros),
        };
        roundtrip(&req, &lim, 16, 3, 2, FmCeSe::default());
        // An all-empty list is an empty payload.
        let empties = [Sge { len: 0, ..all[0] }; 3];
        let req = Request::Write {
            remote: REMOTE,
            data: Payload::Sgl(&empties),
        };
        let (ds, _) = roundtrip(&req, &lim, 16, 3, 2, FmCeSe::default());
        assert_eq!(ds, 2);
    }
}

#[test]
fn a_stream_of_wqes_wraps_the_ring_and_the_producer_index() {
    // Post one WQE after another into an 8-block ring, starting just before pi wraps at
    // 0xffff; decode each right after it is written.
    let inline = pattern(100);
    let sgl = sgl3();
    let lim = Limits {
        max_sge: 8,
        max_inline: 256,
    };
    let reqs = every_request(&inline, &sgl);
    let mut pi: u16 = 0xffe0;
    let mut wrapped = false;
    for round in 0..4 {
        for (i, req) in reqs.iter().enumerate() {
            let flags = all_flags()[(i + round) % 40];
            let (_, bbs) = roundtrip(req, &lim, 8, pi, 0x42, flags);
            let next = pi.wrapping_add(bbs as u16);
            wrapped |= next < pi;
            pi = next;
        }
    }
    assert!(wrapped, "the producer index wrapped at 0xffff");
}

// ---------------------------------------------------------------------------------------
// Encode errors: each variant, and nothing written.
// ---------------------------------------------------------------------------------------

fn assert_refused(req: &Request<'_>, lim: &Limits, want: EncodeError) {
    for start in [0u16, 7] {
        let mut ring = vec![FILL; 8 * BB];
        let got = post(&mut ring, req, lim, start, 1, FmCeSe::default());
        assert_eq!(got, Err(want), "{req:?}");
        assert!(
            ring.iter().all(|&b| b == FILL),
            "ring written on error {want:?}"
        );
    }
    // The error has a message.
    assert!(!want.to_string().is_empty());
}

#[test]
fn too_many_sge_is_refused_and_writes_nothing() {
    let all = sgl3();
    let five = [all[0]; 5];
    let lim = Limits {
        max_sge: 4,
        max_inline: 64,
    };
    for req in [
        Request::Write {
            remote: REMOTE,
            data: Payload::Sgl(&five),
        },
        Request::Read {
            remote: REMOTE,
            sgl: &five,
        },
        Request::Send {
            data: Payload::Sgl(&five),
        },
        Request::SendImm {
            data: Payload::Sgl(&five),
            imm: 0,
        },
    ] {
        assert_refused(&req, &lim, EncodeError::TooManySge { n: 5, max: 4 });
    }
    // Zero-length entries do not count.
    let mut mixed = vec![all[1]; 6];
    mixed.extend_from_slice(&[all[0]; 4]);
    let req = Request::Send {
        data: Payload::Sgl(&mixed),
    };
    roundtrip(&req, &lim, 8, 0, 1, FmCeSe::default());
}

#[test]
fn inline_too_long_is_refused_and_writes_nothing() {
    let data = pattern(65);
    let lim = Limits {
        max_sge: 4,
        max_inline: 64,
    };
    for req in [
        Request::Write {
            remote: REMOTE,
            data: Payload::Inline(&data),
        },
        Request::WriteImm {
            remote: REMOTE,
            data: Payload::Inline(&data),
            imm: 1,
        },
        Request::Send {
            data: Payload::Inline(&data),
        },
        Request::SendInv {
            data: Payload::Inline(&data),
            rkey: 1,
        },
    ] {
        assert_refused(&req, &lim, EncodeError::InlineTooLong { len: 65, max: 64 });
    }
    // Exactly max_inline is fine; max_inline 0 refuses even one byte.
    let req = Request::Send {
        data: Payload::Inline(&data[..64]),
    };
    roundtrip(&req, &lim, 8, 0, 1, FmCeSe::default());
    let zero = Limits {
        max_sge: 4,
        max_inline: 0,
    };
    let req = Request::Send {
        data: Payload::Inline(&data[..1]),
    };
    assert_refused(&req, &zero, EncodeError::InlineTooLong { len: 1, max: 0 });
}

#[test]
fn too_large_is_refused_and_writes_nothing() {
    let lim = Limits {
        max_sge: 64,
        max_inline: 2048,
    };
    let data = pattern(2048);
    let req = Request::Write {
        remote: REMOTE,
        data: Payload::Inline(&data[..973]),
    };
    assert_refused(&req, &lim, EncodeError::TooLarge { ds: 64 });
    let req = Request::Send {
        data: Payload::Inline(&data[..2048]),
    };
    assert_refused(
        &req,
        &lim,
        EncodeError::TooLarge {
            ds: 1 + inline_ds(2048),
        },
    );
    let sges = [sgl3()[0]; 63];
    let req = Request::Send {
        data: Payload::Sgl(&sges),
    };
    assert_refused(&req, &lim, EncodeError::TooLarge { ds: 64 });
    let req = Request::Read {
        remote: REMOTE,
        sgl: &sges[..62],
    };
    assert_refused(&req, &lim, EncodeError::TooLarge { ds: 64 });
}

fn bind(len: u64, mw_rkey: u32, new_rkey: u32, mw_type: MwType) -> Request<'static> {
    Request::BindMw(BindMw {
        mw_rkey,
        new_rkey,
        mw_type,
        mr_lkey: 3,
        addr: 0x1000,
        len,
        access: Access::REMOTE_READ,
    })
}

#[test]
fn bind_too_long_is_refused_and_writes_nothing() {
    let lim = Limits {
        max_sge: 1,
        max_inline: 0,
    };
    for t in [MwType::One, MwType::Two] {
        let len = (1u64 << 31) + 1;
        assert_refused(
            &bind(len, 0x100, 0x101, t),
            &lim,
            EncodeError::BindTooLong { len },
        );
        assert_refused(
            &bind(u64::MAX, 0x100, 0x101, t),
            &lim,
            EncodeError::BindTooLong { len: u64::MAX },
        );
        // 2 GiB exactly is the largest one KLM describes.
        roundtrip(
            &bind(1 << 31, 0x100, 0x101, t),
            &lim,
            8,
            5,
            1,
            FmCeSe::default(),
        );
    }
}

#[test]
fn bind_key_index_is_refused_and_writes_nothing() {
    let lim = Limits {
        max_sge: 1,
        max_inline: 0,
    };
    for t in [MwType::One, MwType::Two] {
        for (mw, new) in [
            (0x100, 0x201),
            (0x0000_0100, 0x8000_0100),
            (0xffff_ff00, 0x0000_00ff),
        ] {
            assert_refused(
                &bind(16, mw, new, t),
                &lim,
                EncodeError::BindKeyIndex {
                    mw_rkey: mw,
                    new_rkey: new,
                },
            );
            // An unbind carries no range: the index is not checked.
            roundtrip(&bind(0, mw, new, t), &lim, 8, 1, 1, FmCeSe::default());
        }
    }
}

/// A gather entry of 2 GiB or more cannot be a data segment: bit 31 of its `byte_count` is
/// the inline flag, so the decoder (and the software NIC, and the hardware) read it as an
/// inline segment. `wqe_ds` refuses it.
#[test]
fn sge_length_with_bit_31_is_refused_or_round_trips() {
    let lim = Limits {
        max_sge: 4,
        max_inline: 64,
    };
    for len in [0x8000_0000u32, u32::MAX] {
        let s = [Sge {
            addr: 0x1000,
            len,
            lkey: 1,
        }];
        for req in [
            Request::Write {
                remote: REMOTE,
                data: Payload::Sgl(&s),
            },
            Request::Read {
                remote: REMOTE,
                sgl: &s,
            },
            Request::Send {
                data: Payload::Sgl(&s),
            },
        ] {
            assert_eq!(wqe_ds(&req, &lim), Err(EncodeError::SgeTooLong { len }));
        }
    }
}

// ---------------------------------------------------------------------------------------
// Decode errors.
// ---------------------------------------------------------------------------------------

fn ctrl(opcode: u8, opmod: u8, ds: u8, fm_ce_se: u8) -> Vec<u8> {
    let c = CtrlSeg::new(opcode, opmod, 0, 1, ds, fm_ce_se, Be32::ZERO);
    let mut w = vec![0u8; 16 * ds.max(1) as usize];
    w[..16].copy_from_slice(c.as_bytes());
    w
}

fn encoded(req: &Request<'_>) -> Vec<u8> {
    let lim = Limits {
        max_sge: 8,
        max_inline: 256,
    };
    let mut ring = vec![0u8; 16 * BB];
    let (ds, _) = post(&mut ring, req, &lim, 0, 1, FmCeSe::default()).unwrap();
    ring.truncate(ds * 16);
    ring
}

fn decode_err(w: &[u8]) -> DecodeError {
    let mut sges = [Sge::default(); 64];
    match decode(w, &mut sges) {
        Ok(d) => panic!("decoded {d:?}"),
        Err(e) => {
            assert!(!e.to_string().is_empty());
            e
        }
    }
}

#[test]
fn decode_refuses_unknown_opcodes() {
    for op in 0..=255u8 {
        if Opcode::from_u8(op).is_none() {
            assert_eq!(decode_err(&ctrl(op, 0, 1, 0)), DecodeError::Opcode(op));
        }
    }
    // Known to the crate but never built by it: a local invalidate is a UMR WQE.
    let li = Opcode::LocalInval as u8;
    assert_eq!(decode_err(&ctrl(li, 0, 1, 0)), DecodeError::Opcode(li));
}

#[test]
fn decode_refuses_ds_zero() {
    for op in Opcode::ALL {
        assert_eq!(
            decode_err(&ctrl(op as u8, 0, 0, 0)),
            DecodeError::Ds {
                ds: 0,
                opcode: op as u8
            }
        );
    }
}

#[test]
fn decode_refuses_ds_that_does_not_fit_the_opcode() {
    let nop = Opcode::Nop as u8;
    assert_eq!(
        decode_err(&ctrl(nop, 0, 2, 0)),
        DecodeError::Ds { ds: 2, opcode: nop }
    );
    for op in [Opcode::RdmaWrite, Opcode::RdmaWriteImm, Opcode::RdmaRead] {
        assert_eq!(
            decode_err(&ctrl(op as u8, 0, 1, 0)),
            DecodeError::Ds {
                ds: 1,
                opcode: op as u8
            }
        );
    }
    let cs = Opcode::AtomicCs as u8;
    assert_eq!(
        decode_err(&ctrl(cs, 0, 5, 0)),
        DecodeError::Ds { ds: 5, opcode: cs }
    );
    // An atomic whose local segment is not 8 bytes.
    let mut w = encoded(&Request::FetchAdd {
        remote: REMOTE,
        add: 1,
        local: LOCAL,
    });
    w[48..52].copy_from_slice(&4u32.to_be_bytes());
    assert!(matches!(decode_err(&w), DecodeError::Ds { ds: 4, .. }));
    // A UMR that is neither a bind nor an unbind.
    let umr = Opcode::Umr as u8;
    assert_eq!(decode_err(&ctrl(umr, 0, 9, 0)), DecodeError::Umr);
    assert_eq!(decode_err(&ctrl(umr, 0, 8, 0)), DecodeError::Umr);
}

#[test]
fn decode_refuses_truncated_wqes() {
    let mut sges = [Sge::default(); 64];
    assert_eq!(
        decode(&[], &mut sges),
        Err(DecodeError::Truncated { need: 16, have: 0 })
    );
    let sgl = sgl3();
    let w = encoded(&Request::Write {
        remote: REMOTE,
        data: Payload::Sgl(&sgl),
    });
    assert_eq!(w.len(), 64);
    for cut in 0..w.len() {
        let need = if cut < 16 { 16 } else { 64 };
        assert_eq!(
            decode(&w[..cut], &mut sges),
            Err(DecodeError::Truncated { need, have: cut })
        );
    }
    assert!(decode(&w, &mut sges).is_ok());
}

#[test]
fn decode_refuses_bad_inline_lengths() {
    let data = pattern(20);
    let w = encoded(&Request::Write {
        remote: REMOTE,
        data: Payload::Inline(&data),
    });
    assert_eq!(w.len(), 4 * 16);
    for bad in [0u32, 12, 29, 40, 0x7fff_ffff] {
        let mut b = w.clone();
        let bc = bad | mlx5::seg::INLINE_SEG;
        b[32..36].copy_from_slice(&bc.to_be_bytes());
        assert_eq!(
            decode_err(&b),
            DecodeError::Inline { byte_count: bc },
            "inline length {bad} in 2 DS"
        );
    }
    // Lengths that fit the same 2 DS decode (as that many bytes).
    let mut b = w.clone();
    b[32..36].copy_from_slice(&(13 | mlx5::seg::INLINE_SEG).to_be_bytes());
    let mut sges = [Sge::default(); 64];
    let d = decode(&b, &mut sges).unwrap();
    assert!(matches!(d.request, Request::Write { data: Payload::Inline(p), .. } if p.len() == 13));
    // A gather entry with the inline bit in a list of entries.
    let sgl = sgl3();
    let mut w = encoded(&Request::Send {
        data: Payload::Sgl(&sgl),
    });
    w[32..36].copy_from_slice(&(4 | mlx5::seg::INLINE_SEG).to_be_bytes());
    assert!(matches!(decode_err(&w), DecodeError::Inline { .. }));
}

#[test]
fn decode_refuses_bad_opmods() {
    let sgl = sgl3();
    let w = encoded(&Request::Write {
        remote: REMOTE,
        data: Payload::Sgl(&sgl),
    });
    for opmod in [1u8, 8, 9, 0xff] {
        let mut b = w.clone();
        b[0] = opmod; // opmod is the top byte of opmod_idx_opcode
        assert_eq!(decode_err(&b), DecodeError::Opmod(opmod));
    }
    let w = encoded(&Request::Masked {
        remote: REMOTE,
        op: MaskedAtomic::Fa32 {
            add: 1,
            field_boundary: 0,
        },
        local: LOCAL,
    });
    for opmod in [0u8, 1, 0x0a, 0x0b, 0x10] {
        let mut b = w.clone();
        b[0] = opmod;
        assert_eq!(decode_err(&b), DecodeError::Opmod(opmod));
    }
}

#[test]
fn decode_refuses_reserved_fence_modes() {
    let w = encoded(&Request::Nop);
    for fm in 5u8..=7 {
        for low in [0u8, 0x0a, 0x1e] {
            let mut b = w.clone();
            b[11] = (fm << 5) | low;
            assert_eq!(decode_err(&b), DecodeError::FmCeSe((fm << 5) | low));
        }
    }
}

// ---------------------------------------------------------------------------------------
// Properties.
// ---------------------------------------------------------------------------------------

/// A request that owns its buffers (proptest values cannot borrow).
#[derive(Clone, Debug)]
enum Owned {
    Nop,
    Write(Remote, OwnedPayload),
    WriteImm(Remote, OwnedPayload, u32),
    Read(Remote, Vec<Sge>),
    Send(OwnedPayload),
    SendImm(OwnedPayload, u32),
    SendInv(OwnedPayload, u32),
    CompareSwap(Remote, u64, u64, Sge),
    FetchAdd(Remote, u64, Sge),
    Masked(Remote, MaskedAtomic, Sge),
    LocalInvalidate(u32),
    Bind(BindMw),
}

#[derive(Clone, Debug)]
enum OwnedPayload {
    Inline(Vec<u8>),
    Sgl(Vec<Sge>),
}

impl OwnedPayload {
    fn get(&self) -> Payload<'_> {
        match self {
            OwnedPayload::Inline(b) => Payload::Inline(b),
            OwnedPayload::Sgl(s) => Payload::Sgl(s),
        }
    }
}

impl Owned {
    fn get(&self) -> Request<'_> {
        match self {
            Owned::Nop => Request::Nop,
            Owned::Write(r, p) => Request::Write {
                remote: *r,
                data: p.get(),
            },
            Owned::WriteImm(r, p, imm) => Request::WriteImm {
                remote: *r,
                data: p.get(),
                imm: *imm,
            },
            Owned::Read(r, s) => Request::Read { remote: *r, sgl: s },
            Owned::Send(p) => Request::Send { data: p.get() },
            Owned::SendImm(p, imm) => Request::SendImm {
                data: p.get(),
                imm: *imm,
            },
            Owned::SendInv(p, rkey) => Request::SendInv {
                data: p.get(),
                rkey: *rkey,
            },
            Owned::CompareSwap(r, c, s, l) => Request::CompareSwap {
                remote: *r,
                compare: *c,
                swap: *s,
                local: *l,
            },
            Owned::FetchAdd(r, a, l) => Request::FetchAdd {
                remote: *r,
                add: *a,
                local: *l,
            },
            Owned::Masked(r, op, l) => Request::Masked {
                remote: *r,
                op: *op,
                local: *l,
            },
            Owned::LocalInvalidate(k) => Request::LocalInvalidate { rkey: *k },
            Owned::Bind(b) => Request::BindMw(*b),
        }
    }
}

const PROP_LIMITS: Limits = Limits {
    max_sge: 8,
    max_inline: 256,
};

fn remote() -> impl Strategy<Value = Remote> {
    (any::<u64>(), any::<u32>()).prop_map(|(addr, rkey)| Remote { addr, rkey })
}

fn sge() -> impl Strategy<Value = Sge> {
    (
        any::<u64>(),
        prop_oneof![Just(0u32), 0..=MAX_SGE_LEN],
        any::<u32>(),
    )
        .prop_map(|(addr, len, lkey)| Sge { addr, len, lkey })
}

fn sgl() -> impl Strategy<Value = Vec<Sge>> {
    prop::collection::vec(sge(), 0..=PROP_LIMITS.max_sge)
}

fn payload() -> impl Strategy<Value = OwnedPayload> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..=PROP_LIMITS.max_inline)
            .prop_map(OwnedPayload::Inline),
        sgl().prop_map(OwnedPayload::Sgl),
    ]
}

fn masked() -> impl Strategy<Value = MaskedAtomic> {
    prop_oneof![
        any::<[u32; 4]>().prop_map(
            |[swap, compare, swap_mask, compare_mask]| MaskedAtomic::Cs32 {
                swap,
                compare,
                swap_mask,
                compare_mask
            }
        ),
        any::<[u32; 2]>().prop_map(|[add, field_boundary]| MaskedAtomic::Fa32 {
            add,
            field_boundary
        }),
        any::<[u64; 4]>().prop_map(
            |[swap, compare, swap_mask, compare_mask]| MaskedAtomic::Cs64 {
                swap,
                compare,
                swap_mask,
                compare_mask
            }
        ),
        any::<[u64; 2]>().prop_map(|[add, field_boundary]| MaskedAtomic::Fa64 {
            add,
            field_boundary
        }),
    ]
}

fn bind_mw() -> impl Strategy<Value = BindMw> {
    (
        any::<u32>(),
        any::<u8>(),
        any::<bool>(),
        any::<u32>(),
        any::<u64>(),
        prop_oneof![Just(0u64), 1..=(1u64 << 31)],
        0u32..64,
    )
        .prop_map(
            |(mw_rkey, variant, two, mr_lkey, addr, len, access)| BindMw {
                mw_rkey,
                new_rkey: (mw_rkey & !0xff) | u32::from(variant),
                mw_type: if two { MwType::Two } else { MwType::One },
                mr_lkey,
                addr,
                len,
                access: Access(access),
            },
        )
}

fn request() -> impl Strategy<Value = Owned> {
    prop_oneof![
        Just(Owned::Nop),
        (remote(), payload()).prop_map(|(r, p)| Owned::Write(r, p)),
        (remote(), payload(), any::<u32>()).prop_map(|(r, p, i)| Owned::WriteImm(r, p, i)),
        (remote(), sgl()).prop_map(|(r, s)| Owned::Read(r, s)),
        payload().prop_map(Owned::Send),
        (payload(), any::<u32>()).prop_map(|(p, i)| Owned::SendImm(p, i)),
        (payload(), any::<u32>()).prop_map(|(p, k)| Owned::SendInv(p, k)),
        (remote(), any::<u64>(), any::<u64>(), sge())
            .prop_map(|(r, c, s, l)| Owned::CompareSwap(r, c, s, l)),
        (remote(), any::<u64>(), sge()).prop_map(|(r, a, l)| Owned::FetchAdd(r, a, l)),
        (remote(), masked(), sge()).prop_map(|(r, o, l)| Owned::Masked(r, o, l)),
        any::<u32>().prop_map(Owned::LocalInvalidate),
        bind_mw().prop_map(Owned::Bind),
    ]
}

fn flags() -> impl Strategy<Value = FmCeSe> {
    (0usize..5, 0usize..4, any::<bool>()).prop_map(|(f, c, solicited)| FmCeSe {
        fence: Fence::ALL[f],
        completion: CompletionMode::ALL[c],
        solicited,
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn random_requests_round_trip(
        req in request(),
        pi in any::<u16>(),
        qpn in 0u32..=0xff_ffff,
        flags in flags(),
        small_ring in any::<bool>(),
    ) {
        let ring_bbs = if small_ring { 8 } else { 16 };
        roundtrip(&req.get(), &PROP_LIMITS, ring_bbs, pi, qpn, flags);
    }

    #[test]
    fn decode_never_panics_on_random_bytes(
        bytes in prop::collection::vec(any::<u8>(), 1024),
        cut in 0usize..=1024,
    ) {
        let mut sges = [Sge::default(); 64];
        let _ = decode(&bytes, &mut sges);
        let _ = decode(&bytes[..cut], &mut sges);
    }

    #[test]
    fn decode_never_panics_behind_a_valid_control_segment(
        mut bytes in prop::collection::vec(any::<u8>(), 1024),
        op in 0usize..Opcode::ALL.len(),
        opmod in prop_oneof![Just(0u8), Just(8u8), Just(9u8), any::<u8>()],
        ds in 1u8..=63,
        flags in flags(),
        cut in 0usize..=1024,
    ) {
        let c = CtrlSeg::new(Opcode::ALL[op] as u8, opmod, 0, 1, ds, flags.to_u8(), Be32::ZERO);
        bytes[..16].copy_from_slice(c.as_bytes());
        let mut sges = [Sge::default(); 64];
        if let Ok(d) = decode(&bytes, &mut sges) {
            prop_assert_eq!(d.ds, ds);
            prop_assert_eq!(d.flags, flags);
        }
        let _ = decode(&bytes[..cut], &mut sges);
    }
}
