//! DC send WQEs: rdma-core's builders on a memory-backed DCI (`IBV_QPT_DRIVER`,
//! `MLX5DV_DCTYPE_DCI`), addressed with `mlx5dv_wr_set_dc_addr` (an address handle made by
//! rdma-core's own `mlx5_create_ah`), against the crate's `DatagramSeg::dc` in front of the
//! crate's encoding of the same request.
#![allow(missing_docs)]

mod common;

use common::*;
use mlx5::av::{Av, AvAttr, AvLink, DatagramSeg, GrhAttr};
use mlx5::{Payload, Remote, Request, Sge};
use mlx5_oracle::{
    create_ah, skip_or_fail, Addr, AhAttr, Data, IbvSge, Op, OracleQp, QpKind, Wr, IBV_SEND_FENCE,
    IBV_SEND_SIGNALED, IBV_SEND_SOLICITED,
};
use proptest::prelude::*;

/// An InfiniBand address with a GRH, made by rdma-core and by the crate.
fn address(dlid: u16, seed: u8) -> ([u8; 48], Av) {
    let g = GrhAttr {
        dgid: core::array::from_fn(|i| (i as u8) ^ seed),
        flow_label: 0x12345 ^ u32::from(seed),
        sgid_index: seed & 7,
        hop_limit: 0x40,
        traffic_class: seed,
    };
    let c = AhAttr {
        ethernet: 0,
        roce_v2: 0,
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
        rmac: [0; 6],
    };
    let av = Av::from_attr(&AvAttr {
        link: AvLink::Ib {
            dlid,
            src_path_bits: 0,
            grh: Some(g),
        },
        sl: seed & 0xf,
        static_rate: 0,
    });
    (create_ah(&c).expect("mlx5_create_ah"), av)
}

/// Posts `req` on a DCI through rdma-core (builder, `mlx5dv_wr_set_dc_addr`, data setter)
/// at producer index `pi` of a 16-block ring of `fill`, and compares the WQE with the
/// crate's. Returns the blocks it took.
fn check(req: &Request<'_>, flags: u32, pi: u32, dctn: u32, dc_key: u64, seed: u8) -> usize {
    let (c_av, av) = address(0x1234, seed);
    let mut q = OracleQp::new(QpKind::Dci, QPN, 16, MAX_INLINE, MAX_GS);
    q.ring_mut().fill(0xc3 ^ seed);
    q.set_cur_post(pi);
    let mut local = [IbvSge::default()];
    let list: Vec<IbvSge>;
    let (op, data) = match *req {
        Request::Write { remote, data } => (
            Op::Write {
                rkey: remote.rkey,
                raddr: remote.addr,
            },
            data,
        ),
        Request::WriteImm { remote, data, imm } => (
            Op::WriteImm {
                rkey: remote.rkey,
                raddr: remote.addr,
                imm,
            },
            data,
        ),
        Request::Read { remote, sgl } => (
            Op::Read {
                rkey: remote.rkey,
                raddr: remote.addr,
            },
            Payload::Sgl(sgl),
        ),
        Request::Send { data } => (Op::Send, data),
        Request::SendImm { data, imm } => (Op::SendImm { imm }, data),
        Request::CompareSwap {
            remote,
            compare,
            swap,
            local: l,
        } => {
            local = [IbvSge::from(Sge { len: 8, ..l })];
            (
                Op::CmpSwp {
                    rkey: remote.rkey,
                    raddr: remote.addr,
                    compare,
                    swap,
                },
                Payload::Sgl(&[]),
            )
        }
        Request::FetchAdd {
            remote,
            add,
            local: l,
        } => {
            local = [IbvSge::from(Sge { len: 8, ..l })];
            (
                Op::FetchAdd {
                    rkey: remote.rkey,
                    raddr: remote.addr,
                    add,
                },
                Payload::Sgl(&[]),
            )
        }
        ref r => panic!("not a DCI request here: {r:?}"),
    };
    let data = match (op, data) {
        (Op::CmpSwp { .. } | Op::FetchAdd { .. }, _) => Data::Sge(local[0]),
        (_, Payload::Sgl(l)) => {
            list = l.iter().copied().map(IbvSge::from).collect();
            Data::SgeList(&list)
        }
        (_, Payload::Inline(b)) => Data::Inline(b),
    };
    let rc = q.post(&[Wr {
        wr_id: 3,
        flags,
        op,
        addr: Addr::Dc {
            av: c_av,
            dctn,
            dc_key,
        },
        data: Some(data),
    }]);
    assert_eq!(rc, 0, "rdma-core refused {req:?}");

    let fm = fm_ce_se(flags, false);
    let want = crate_datagram_wqe(req, pi as u16, QPN, fm, &DatagramSeg::dc(&av, dctn, dc_key));
    let bbs = want.len().div_ceil(64);
    assert_eq!(
        q.cur_post(),
        pi.wrapping_add(bbs as u32),
        "sq.cur_post after {req:?}"
    );
    assert_eq!(q.sq_dbrec(), pi.wrapping_add(bbs as u32) & 0xffff);
    let mut got = vec![0u8; bbs * 64];
    mlx5::wqe::linearize(q.ring(), pi as usize, bbs, &mut got);
    // The bytes neither side writes (after inline data) and the RC masks, shifted past the
    // datagram segment.
    let pad = match data {
        Data::Inline(b) if !b.is_empty() => (b.len() + 4).div_ceil(16) * 16 - (b.len() + 4),
        _ => 0,
    };
    let mut skip = vec![false; want.len()];
    for (r, _) in masked(req) {
        for o in r {
            skip[if o < 16 { o } else { o + 48 }] = true;
        }
    }
    for (i, (&g, &w)) in got[..want.len() - pad].iter().zip(&want).enumerate() {
        assert!(
            g == w || skip[i],
            "DC WQE byte {i} of {req:?} (pi {pi}, dctn {dctn:#x}, key {dc_key:#x}): \
             rdma-core {g:#04x}, crate {w:#04x}\n  rdma-core: {}\n  crate:     {}",
            hex(&got[..want.len()]),
            hex(&want)
        );
    }
    bbs
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
    for req in &reqs {
        for pi in [0u32, 13, 14, 15, 0xffff] {
            for flags in [0, IBV_SEND_SIGNALED | IBV_SEND_SOLICITED, IBV_SEND_FENCE] {
                for (dctn, key) in [
                    (0x00ab_cdef, 0x1122_3344_5566_7788u64),
                    (1, 0),
                    (0xff_ffff, u64::MAX),
                ] {
                    check(req, flags, pi, dctn, key, n as u8);
                    n += 1;
                }
            }
        }
    }
    assert!(n >= 400);
}

proptest! {
    /// Random writes, sends and reads with random DCT numbers (24 bits), keys, lengths and
    /// ring positions.
    #[test]
    fn random_dc_requests_match(
        kind in 0u8..4,
        lens in prop::collection::vec(0u32..0x1_0000, 0..8),
        inline in 0usize..=MAX_INLINE,
        pi in any::<u32>(),
        dctn in 0u32..=0xff_ffff,
        key in any::<u64>(),
        flags in 0u32..8,
        seed in any::<u8>(),
    ) {
        if !skip_or_fail("random_dc_requests_match") {
            return Ok(());
        }
        let sgl: Vec<Sge> = lens.iter().enumerate().map(|(i, &len)| Sge {
            addr: 0x10_0000 * i as u64,
            len,
            lkey: i as u32 + 1,
        }).collect();
        let payload = vec![seed; inline];
        let req = match kind {
            0 => Request::Write { remote: REMOTE, data: Payload::Sgl(&sgl) },
            1 => Request::Write { remote: REMOTE, data: Payload::Inline(&payload) },
            2 => Request::Read { remote: REMOTE, sgl: &sgl },
            _ => Request::SendImm { data: Payload::Inline(&payload), imm: key as u32 },
        };
        check(&req, flags, pi, dctn, key, seed);
    }
}
