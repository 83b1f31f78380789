//! Address vectors and UD send WQEs: rdma-core's `mlx5_create_ah` against the crate's
//! `Av::from_attr`, and UD sends on a memory-backed UD QP (`ibv_wr_set_ud_addr`, and the
//! classic `ibv_post_send`) against the crate's `wqe::encode_ud`.
#![allow(missing_docs)]

mod common;

use common::{Pair, Setter};
use mlx5::av::{Av, AvAttr, AvLink, GrhAttr};
use mlx5::{Payload, Request, Sge};
use mlx5_oracle::{create_ah, skip_or_fail, AhAttr, QpKind, IBV_SEND_SIGNALED, IBV_SEND_SOLICITED};
use proptest::prelude::*;
use zerocopy::IntoBytes;

/// The same address, for rdma-core and for the crate (the crate's `AvAttr` takes the mlx5
/// rate code: `mlx5::av::mlx5_rate` converts the verbs rate, checked here against
/// rdma-core's `ah_attr_to_mlx5_rate`).
#[allow(clippy::too_many_arguments)]
fn attrs(
    link: u8,
    sl: u8,
    rate: u8,
    dlid: u16,
    path_bits: u8,
    global: bool,
    g: GrhAttr,
    rmac: [u8; 6],
) -> (AhAttr, AvAttr) {
    let c = AhAttr {
        ethernet: (link != 0) as u8,
        roce_v2: (link == 2) as u8,
        is_global: global as u8,
        sl,
        src_path_bits: path_bits,
        static_rate: rate,
        dlid,
        dgid: g.dgid,
        flow_label: g.flow_label,
        sgid_index: g.sgid_index,
        hop_limit: g.hop_limit,
        traffic_class: g.traffic_class,
        rmac,
    };
    let link = match link {
        0 => AvLink::Ib {
            dlid,
            src_path_bits: path_bits,
            grh: global.then_some(g),
        },
        v => AvLink::Roce {
            grh: g,
            rmac,
            // rdma-core's mlx5_ah_set_udp_sport for RoCE v2 (flow label given):
            // ibv_flow_label_to_udp_sport.
            udp_sport: if v == 2 { udp_sport(g.flow_label) } else { 0 },
        },
    };
    (
        c,
        AvAttr {
            link,
            sl,
            static_rate: mlx5::av::mlx5_rate(rate),
        },
    )
}

/// verbs.h `ibv_flow_label_to_udp_sport` (the caller of the crate's `AvLink::Roce` computes
/// the port; the oracle checks the AV bytes around it).
fn udp_sport(fl: u32) -> u16 {
    let fl_low = fl & 0x03fff;
    let fl_high = fl & 0xFC000;
    let fl_low = fl_low ^ (fl_high >> 14);
    (fl_low as u16) | 0xC000
}

fn grh(seed: u8) -> GrhAttr {
    GrhAttr {
        dgid: core::array::from_fn(|i| (i as u8).wrapping_mul(17) ^ seed),
        flow_label: 0x000a_bcde ^ u32::from(seed),
        sgid_index: seed.wrapping_mul(3),
        hop_limit: 64 ^ seed,
        traffic_class: 0x20 | seed,
    }
}

fn check_av(link: u8, sl: u8, rate: u8, dlid: u16, bits: u8, global: bool, g: GrhAttr) {
    let rmac = [0x02, 0x11, 0x22, 0x33, 0x44, 0x55];
    let (c, r) = attrs(link, sl, rate, dlid, bits, global, g, rmac);
    let oracle = create_ah(&c);
    if link != 0 && !global {
        // RoCE without a GRH: rdma-core refuses; the crate's AvLink::Roce cannot say it.
        assert!(oracle.is_err());
        return;
    }
    let oracle = oracle.expect("mlx5_create_ah");
    let av = Av::from_attr(&r);
    assert_eq!(
        av.as_bytes(),
        &oracle[..],
        "link {link} sl {sl} rate {rate} dlid {dlid:#x} bits {bits:#x} global {global} {g:?}"
    );
}

#[test]
fn av_matches_mlx5_create_ah() {
    if !skip_or_fail("av_matches_mlx5_create_ah") {
        return;
    }
    for link in [0u8, 1, 2] {
        for global in [false, true] {
            for sl in [0u8, 1, 7, 8, 15, 0xff] {
                for rate in [0u8, 2, 3, 7, 10, 16, 22, 23, 200] {
                    for (dlid, bits) in [(0u16, 0u8), (1, 1), (0xc001, 0x7f), (0xffff, 0xff)] {
                        for seed in [0u8, 0x5a, 0xff] {
                            check_av(link, sl, rate, dlid, bits, global, grh(seed));
                        }
                    }
                }
            }
        }
    }
}

proptest! {
    /// Random addresses; the flow label's 20 bits are never all zero (rdma-core then draws a
    /// random RoCE v2 UDP source port, which the crate takes from its caller instead).
    #[test]
    fn random_avs_match_mlx5_create_ah(
        link in 0u8..3, sl in any::<u8>(), rate in any::<u8>(), dlid in any::<u16>(),
        bits in any::<u8>(), global in any::<bool>(), dgid in any::<[u8; 16]>(),
        flow_label in (1u32..=0xf_ffff, any::<u32>()).prop_map(|(lo, hi)| lo | (hi & !0xf_ffff)), sgid_index in any::<u8>(), hop_limit in any::<u8>(),
        traffic_class in any::<u8>(),
    ) {
        if !skip_or_fail("random_avs_match_mlx5_create_ah") {
            return Ok(());
        }
        let g = GrhAttr { dgid, flow_label, sgid_index, hop_limit, traffic_class };
        check_av(link, sl, rate, dlid, bits, global, g);
    }
}

/// An InfiniBand or RoCE v2 address with a GRH, made by rdma-core and by the crate.
fn ud_address(link: u8, seed: u8) -> ([u8; 48], Av) {
    let (c, r) = attrs(
        link,
        seed & 0xf,
        0,
        0x12,
        0,
        true,
        grh(seed),
        [2, 0, 0, 0, seed, 1],
    );
    (create_ah(&c).expect("mlx5_create_ah"), Av::from_attr(&r))
}

fn pattern(i: usize) -> u8 {
    (i as u8).wrapping_mul(41) ^ 0xa7
}

/// UD sends through rdma-core (`ibv_wr_send(_imm)` + `ibv_wr_set_ud_addr` + data setter, and
/// the classic `ibv_post_send` with `wr.ud`), the address handle from `mlx5_create_ah`,
/// against the crate's `wqe::encode_ud` with `DatagramSeg::ud` of `Av::from_attr`: the whole
/// ring, for IB and RoCE addresses, inline and gathered data, at every position of a 16-block
/// ring and at the 16-bit wrap.
#[test]
fn ud_send_wqe_matches_rdma_core() {
    if !skip_or_fail("ud_send_wqe_matches_rdma_core") {
        return;
    }
    let payload: Vec<u8> = (0..300u32).map(|i| (i * 5 + 1) as u8).collect();
    let sgl = [
        Sge {
            addr: 0x1000,
            len: 100,
            lkey: 7,
        },
        Sge {
            addr: 0x2000,
            len: 0,
            lkey: 8,
        },
        Sge {
            addr: u64::MAX,
            len: 0x7fff_ffff,
            lkey: u32::MAX,
        },
    ];
    let datas = [
        Payload::Sgl(&sgl),
        Payload::Sgl(&sgl[..1]),
        Payload::Sgl(&[]),
        Payload::Inline(&payload[..1]),
        Payload::Inline(&payload[..12]),
        Payload::Inline(&payload[..60]),
        Payload::Inline(&payload[..300]),
    ];
    let mut n = 0;
    for link in [0u8, 2] {
        let (c_av, av) = ud_address(link, 9);
        for data in datas {
            for imm in [None, Some(0x1234_5678)] {
                let req = match imm {
                    Some(imm) => Request::SendImm { data, imm },
                    None => Request::Send { data },
                };
                for pi in (0u32..16).chain([0xfff0, 0xffff]) {
                    for flags in [0, IBV_SEND_SIGNALED, IBV_SEND_SIGNALED | IBV_SEND_SOLICITED] {
                        for classic in [false, true] {
                            let mut p = Pair::new(QpKind::Ud, 16, pi, pattern);
                            p.classic = classic;
                            let (rqpn, qkey) = (0x00fe_dcba, 0x8000_0011);
                            p.post_ud(&req, flags, Setter::Pieces(7), c_av, &av, rqpn, qkey);
                            p.assert_same();
                            n += 1;
                        }
                    }
                }
            }
        }
    }
    assert!(n > 2000, "{n} cases");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// Random UD sends (inline 0 to 512 bytes or gather lists, immediates, destinations,
    /// Q_Keys, IB or RoCE) in sequence on a 16- or 64-block ring from a random producer
    /// index, through either rdma-core API: after every post the rings agree.
    #[test]
    fn random_ud_sequences_match(
        sends in prop::collection::vec(
            (
                prop_oneof![
                    (0usize..=512).prop_map(|n| (n, vec![])),
                    prop::collection::vec(prop_oneof![Just(0u32), 1u32..=0x7fff_ffff], 0..=30)
                        .prop_map(|l| (usize::MAX, l)),
                ],
                any::<Option<u32>>(),
                0u32..=0xff_ffff,
                any::<u32>(),
                any::<u8>(),
                0u32..8,
            ),
            1..20,
        ),
        pi in any::<u32>(),
        big in any::<bool>(),
        classic in any::<bool>(),
        seed in any::<u8>(),
    ) {
        if !skip_or_fail("random_ud_sequences_match") {
            return Ok(());
        }
        let payload: Vec<u8> = (0..512usize).map(|i| (i as u8) ^ seed).collect();
        let mut p = Pair::new(QpKind::Ud, if big { 64 } else { 16 }, pi, |i| {
            (i as u8).wrapping_mul(seed | 1)
        });
        p.classic = classic;
        for ((inline, lens), imm, rqpn, qkey, aseed, flags) in &sends {
            let sgl: Vec<Sge> = lens
                .iter()
                .enumerate()
                .map(|(i, &len)| Sge { addr: 0x1000 * i as u64, len, lkey: i as u32 })
                .collect();
            let data = if *inline == usize::MAX {
                Payload::Sgl(&sgl)
            } else {
                Payload::Inline(&payload[..*inline])
            };
            let req = match imm {
                Some(imm) => Request::SendImm { data, imm: *imm },
                None => Request::Send { data },
            };
            let (c_av, av) = ud_address(if aseed & 1 == 0 { 0 } else { 2 }, *aseed);
            // UD has no fence: the flags are signaled and solicited only.
            let flags = flags & (IBV_SEND_SIGNALED | IBV_SEND_SOLICITED);
            p.post_ud(&req, flags, Setter::Pieces(5), c_av, &av, *rqpn, *qkey);
            p.assert_same();
        }
    }
}
