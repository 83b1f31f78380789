//! Address vectors and UD send WQEs: rdma-core's `mlx5_create_ah` against the crate's
//! `Av::from_attr`, and `ibv_wr_send*` + `ibv_wr_set_ud_addr` on a memory-backed UD QP
//! against the crate's datagram segment in a WQE built from the crate's segments.
#![allow(missing_docs)]

mod common;

use common::{crate_datagram_wqe, fm_ce_se, hex, masked};
use mlx5::av::{Av, AvAttr, AvLink, DatagramSeg, GrhAttr};
use mlx5::seg::inline_ds;
use mlx5::{Payload, Request, Sge};
use mlx5_oracle::{
    create_ah, skip_or_fail, AhAttr, Data, IbvSge, Op, OracleQp, QpKind, Wr, IBV_SEND_SIGNALED,
    IBV_SEND_SOLICITED,
};
use proptest::prelude::*;
use zerocopy::IntoBytes;

/// `enum ibv_rate` -> the mlx5 static-rate code, as verbs.c `ah_attr_to_mlx5_rate`'s table
/// (the crate's `AvAttr` takes the mlx5 code: the conversion is the caller's).
fn mlx5_rate(ibv_rate: u8) -> u8 {
    const T: [u8; 23] = [
        0, 0, 7, 8, 9, 10, 11, 12, 13, 14, 15, 11, 13, 15, 0, 9, 15, 0, 0, 9, 13, 0, 0,
    ];
    T.get(ibv_rate as usize).copied().unwrap_or(0)
}

/// The same address, for rdma-core and for the crate.
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
            static_rate: mlx5_rate(rate),
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

/// rdma-core's UD WQE (ctrl + `_set_datagram_seg` + data, wrapping at the ring end) against
/// the crate's `DatagramSeg::ud` in front of the crate's encoding of the same send
/// (`common::crate_datagram_wqe`), for IB and RoCE addresses, inline and gather data, at every ring
/// position of a 16-block ring. Masked: `ctrl.imm` of a plain send (rdma-core leaves it) and
/// inline padding (neither writes it).
#[test]
fn ud_send_wqe_matches_rdma_core() {
    if !skip_or_fail("ud_send_wqe_matches_rdma_core") {
        return;
    }
    let qpn = 0x00ab_cdef;
    let payload: Vec<u8> = (0..200u32).map(|i| (i * 5 + 1) as u8).collect();
    let sgl = [
        IbvSge {
            addr: 0x1000,
            length: 100,
            lkey: 7,
        },
        IbvSge {
            addr: 0x2000,
            length: 0,
            lkey: 8,
        },
        IbvSge {
            addr: u64::MAX,
            length: 0x7fff_ffff,
            lkey: u32::MAX,
        },
    ];
    for link in [0u8, 2] {
        let (c, r) = attrs(link, 3, 0, 0x12, 0, true, grh(9), [2, 0, 0, 0, 0, 1]);
        let av_bytes = create_ah(&c).expect("mlx5_create_ah");
        let av = Av::from_attr(&r);
        for pi in 0u32..16 {
            for (data, imm) in [
                (Data::SgeList(&sgl), None),
                (Data::SgeList(&sgl[..1]), Some(0x1234_5678)),
                (Data::Inline(&payload[..1]), None),
                (Data::Inline(&payload[..60]), Some(1)),
                (Data::Inline(&payload[..200]), None),
                (Data::SgeList(&[]), None),
            ] {
                for flags in [0, IBV_SEND_SIGNALED, IBV_SEND_SIGNALED | IBV_SEND_SOLICITED] {
                    let (rqpn, qkey) = (0x00fe_dcba, 0x8000_0011);
                    let mut q = OracleQp::new(QpKind::Ud, qpn, 16, 512, 16);
                    q.ring_mut().fill(0xa7);
                    q.set_cur_post(pi);
                    let op = match imm {
                        Some(imm) => Op::SendImm { imm },
                        None => Op::Send,
                    };
                    let rc = q.post(&[Wr {
                        wr_id: 1,
                        flags,
                        op,
                        addr: mlx5_oracle::Addr::Ud {
                            av: av_bytes,
                            qpn: rqpn,
                            qkey,
                        },
                        data: Some(data),
                    }]);
                    assert_eq!(rc, 0);
                    let fm = fm_ce_se(flags, false);
                    let crate_sgl: Vec<Sge>;
                    let body = match data {
                        Data::SgeList(l) => {
                            crate_sgl = l
                                .iter()
                                .map(|s| Sge {
                                    addr: s.addr,
                                    len: s.length,
                                    lkey: s.lkey,
                                })
                                .collect();
                            Payload::Sgl(&crate_sgl)
                        }
                        Data::Inline(b) => Payload::Inline(b),
                        _ => unreachable!(),
                    };
                    let req = match imm {
                        Some(imm) => Request::SendImm { data: body, imm },
                        None => Request::Send { data: body },
                    };
                    let dgram = DatagramSeg::ud(&av, rqpn, qkey);
                    let want = crate_datagram_wqe(&req, pi as u16, qpn, fm, &dgram);
                    let bbs = want.len().div_ceil(64);
                    assert_eq!(q.cur_post(), pi + bbs as u32, "blocks");
                    let mut got = vec![0u8; bbs * 64];
                    mlx5::wqe::linearize(q.ring(), pi as usize, bbs, &mut got);
                    let pad = match data {
                        Data::Inline(b) if !b.is_empty() => inline_ds(b.len()) * 16 - 4 - b.len(),
                        _ => 0,
                    };
                    let end = want.len() - pad;
                    let (mut g, mut w) = (got[..end].to_vec(), want[..end].to_vec());
                    for (r, _) in masked(&req) {
                        for o in r {
                            let o = if o < 16 { o } else { o + 48 };
                            g[o] = 0;
                            w[o] = 0;
                        }
                    }
                    assert!(
                        g == w,
                        "link {link} pi {pi} {data:?} imm {imm:?} flags {flags}\n  rdma-core: {}\n  crate:     {}",
                        hex(&g),
                        hex(&w)
                    );
                }
            }
        }
    }
}
