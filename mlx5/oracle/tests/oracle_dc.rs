//! DCI WQEs: rdma-core's builders on a memory-backed DCI (`IBV_QPT_DRIVER`,
//! `MLX5DV_DCTYPE_DCI`, function pointers from `mlx5_qp_fill_wr_pfns`), addressed with
//! `mlx5dv_wr_set_dc_addr` and an address handle made by rdma-core's own `mlx5_create_ah`,
//! against the crate's `mlx5::dc::encode_dc` of the same request to the same `DcAddr`
//! (whose AV is the crate's `Av::from_attr`): the whole ring byte for byte.
#![allow(missing_docs)]

mod common;

use common::*;
use mlx5::av::{Av, AvAttr, AvLink, GrhAttr};
use mlx5::dc::DcAddr;
use mlx5::{Payload, Remote, Request, Sge};
use mlx5_oracle::{
    create_ah, skip_or_fail, AhAttr, QpKind, IBV_SEND_FENCE, IBV_SEND_SIGNALED, IBV_SEND_SOLICITED,
};
use proptest::prelude::*;

/// An address made by rdma-core (`mlx5_create_ah`) and by the crate (`Av::from_attr`):
/// InfiniBand with a GRH, or RoCE v2 (`roce`).
fn address(dlid: u16, seed: u8, roce: bool) -> ([u8; 48], Av) {
    let g = GrhAttr {
        dgid: core::array::from_fn(|i| (i as u8) ^ seed),
        flow_label: 0x12345 ^ u32::from(seed),
        sgid_index: seed & 7,
        hop_limit: 0x40,
        traffic_class: seed,
    };
    let rmac = [2, 0, 0, 0, seed, 1];
    let c = AhAttr {
        ethernet: roce as u8,
        roce_v2: roce as u8,
        is_global: 1,
        sl: seed & 0xf,
        src_path_bits: 0,
        static_rate: 0,
        dlid,
        dgid: g.dgid,
        flow_label: g.flow_label,
        sgid_index: g.sgid_index,
        hop_limit: g.hop_limit,
        traffic_class: g.traffic_class,
        rmac,
    };
    let link = if roce {
        // verbs.h ibv_flow_label_to_udp_sport, as mlx5_ah_set_udp_sport uses it.
        let fl = g.flow_label & 0xf_ffff;
        let sport = ((fl & 0x3fff) ^ ((fl & 0xfc000) >> 14)) as u16 | 0xc000;
        AvLink::Roce {
            grh: g,
            rmac,
            udp_sport: sport,
        }
    } else {
        AvLink::Ib {
            dlid,
            src_path_bits: 0,
            grh: Some(g),
        }
    };
    let av = Av::from_attr(&AvAttr {
        link,
        sl: seed & 0xf,
        static_rate: 0,
    });
    (create_ah(&c).expect("mlx5_create_ah"), av)
}

const REMOTE: Remote = Remote {
    addr: 0x0000_7f00_dead_beef,
    rkey: 0x0102_0304,
};

fn sgl() -> Vec<Sge> {
    vec![
        Sge {
            addr: 0x1000,
            len: 64,
            lkey: 9,
        },
        Sge {
            addr: 0x3000,
            len: 0,
            lkey: 9,
        },
        Sge {
            addr: u64::MAX - 7,
            len: 8,
            lkey: u32::MAX,
        },
    ]
}

fn pattern(i: usize) -> u8 {
    (i as u8).wrapping_mul(53) ^ 0xc3
}

/// Every DCI request kind, alone on a fresh 16-block ring at ring positions that make it
/// wrap, for flag combinations, DCT numbers and keys at their edges, on IB and RoCE.
#[test]
fn dc_requests_match_mlx5dv_wr_set_dc_addr() {
    if !skip_or_fail("dc_requests_match_mlx5dv_wr_set_dc_addr") {
        return;
    }
    let sgl = sgl();
    let payload: Vec<u8> = (0..300u32).map(|i| (i ^ 0x55) as u8).collect();
    let local = Sge {
        addr: 0x8000,
        len: 8,
        lkey: 0x77,
    };
    let reqs = [
        Request::Write {
            remote: REMOTE,
            data: Payload::Sgl(&sgl),
        },
        Request::Write {
            remote: REMOTE,
            data: Payload::Inline(&payload[..44]),
        },
        Request::Write {
            remote: REMOTE,
            data: Payload::Inline(&payload[..300]),
        },
        Request::WriteImm {
            remote: REMOTE,
            data: Payload::Sgl(&sgl[..1]),
            imm: 0xfeed_f00d,
        },
        Request::Read {
            remote: REMOTE,
            sgl: &sgl,
        },
        Request::Send {
            data: Payload::Inline(&payload[..1]),
        },
        Request::SendImm {
            data: Payload::Sgl(&sgl),
            imm: 7,
        },
        Request::Send {
            data: Payload::Sgl(&[]),
        },
        Request::CompareSwap {
            remote: REMOTE,
            compare: 1,
            swap: u64::MAX,
            local,
        },
        Request::FetchAdd {
            remote: REMOTE,
            add: 0x0123_4567_89ab_cdef,
            local,
        },
    ];
    let mut n = 0;
    for roce in [false, true] {
        let (c_av, av) = address(0x1234, 0x5a, roce);
        for req in &reqs {
            for pi in [0u32, 12, 13, 14, 15, 0xffff] {
                for flags in [0, IBV_SEND_SIGNALED | IBV_SEND_SOLICITED, IBV_SEND_FENCE] {
                    for (dctn, key) in [
                        (0x00ab_cdef, 0x1122_3344_5566_7788u64),
                        (1, 0),
                        (0xff_ffff, u64::MAX),
                    ] {
                        for setter in [Setter::List, Setter::Pieces(7)] {
                            let mut p = Pair::new(QpKind::Dci, 16, pi, pattern);
                            let addr = DcAddr::from_av(&av, dctn, key);
                            p.post_dc(req, flags, setter, c_av, &addr);
                            p.assert_same();
                            n += 1;
                        }
                    }
                }
            }
        }
    }
    assert!(n >= 2000, "{n} cases");
}

#[derive(Clone, Debug)]
enum Gen {
    Write(Vec<u32>),
    WriteInline(usize),
    WriteImm(Vec<u32>, u32),
    Read(Vec<u32>),
    SendInline(usize, Option<u32>),
    Send(Vec<u32>),
    Cas(u64, u64),
    Faa(u64),
}

fn arb_gen() -> impl Strategy<Value = Gen> {
    let lens = || prop::collection::vec(prop_oneof![Just(0u32), 1u32..=0x7fff_ffff], 0..=MAX_GS);
    prop_oneof![
        lens().prop_map(Gen::Write),
        (0usize..=MAX_INLINE).prop_map(Gen::WriteInline),
        (lens(), any::<u32>()).prop_map(|(l, i)| Gen::WriteImm(l, i)),
        lens().prop_map(Gen::Read),
        (0usize..=MAX_INLINE, any::<Option<u32>>()).prop_map(|(l, i)| Gen::SendInline(l, i)),
        lens().prop_map(Gen::Send),
        (any::<u64>(), any::<u64>()).prop_map(|(c, s)| Gen::Cas(c, s)),
        any::<u64>().prop_map(Gen::Faa),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// Random sequences of DCI requests to random destinations (24-bit DCT numbers, any key,
    /// IB or RoCE addresses) from random producer indices on a 16- or 64-block ring over
    /// random contents: after every post the rings agree.
    #[test]
    fn random_dc_sequences_match(
        reqs in prop::collection::vec(
            (arb_gen(), 0u32..8, 0u32..=0xff_ffff, any::<u64>(), any::<u8>(), 1usize..9),
            1..20,
        ),
        pi in any::<u32>(),
        big in any::<bool>(),
        seed in any::<u8>(),
    ) {
        if !skip_or_fail("random_dc_sequences_match") {
            return Ok(());
        }
        let payload: Vec<u8> = (0..MAX_INLINE).map(|i| (i as u8) ^ seed).collect();
        let local = Sge { addr: 0x4000, len: 8, lkey: 5 };
        let mut p = Pair::new(QpKind::Dci, if big { 64 } else { 16 }, pi, |i| {
            (i as u8).wrapping_mul(seed | 1)
        });
        for (g, flags, dctn, key, aseed, piece) in &reqs {
            let sgl: Vec<Sge>;
            let list = |l: &Vec<u32>| -> Vec<Sge> {
                l.iter()
                    .enumerate()
                    .map(|(i, &len)| Sge { addr: 0x10_0000 * i as u64, len, lkey: i as u32 })
                    .collect()
            };
            let req = match g {
                Gen::Write(l) => {
                    sgl = list(l);
                    Request::Write { remote: REMOTE, data: Payload::Sgl(&sgl) }
                }
                Gen::WriteInline(n) => {
                    Request::Write { remote: REMOTE, data: Payload::Inline(&payload[..*n]) }
                }
                Gen::WriteImm(l, imm) => {
                    sgl = list(l);
                    Request::WriteImm { remote: REMOTE, data: Payload::Sgl(&sgl), imm: *imm }
                }
                Gen::Read(l) => {
                    sgl = list(l);
                    Request::Read { remote: REMOTE, sgl: &sgl }
                }
                Gen::SendInline(n, Some(imm)) => {
                    Request::SendImm { data: Payload::Inline(&payload[..*n]), imm: *imm }
                }
                Gen::SendInline(n, None) => Request::Send { data: Payload::Inline(&payload[..*n]) },
                Gen::Send(l) => {
                    sgl = list(l);
                    Request::Send { data: Payload::Sgl(&sgl) }
                }
                Gen::Cas(c, s) => {
                    Request::CompareSwap { remote: REMOTE, compare: *c, swap: *s, local }
                }
                Gen::Faa(a) => Request::FetchAdd { remote: REMOTE, add: *a, local },
            };
            let (c_av, av) = address(*aseed as u16, *aseed, aseed & 1 == 1);
            let addr = DcAddr::from_av(&av, *dctn, *key);
            let setter = if piece % 2 == 0 { Setter::List } else { Setter::Pieces(*piece) };
            p.post_dc(&req, *flags, setter, c_av, &addr);
            p.assert_same();
        }
    }
}
