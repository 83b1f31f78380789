//! UD / DC bytes: the datagram segment the `mlx5` crate writes against rdma-core's
//! `_set_datagram_seg` (the header's structs filled by member name, as `qp.c` does) and the
//! header's own `mlx5dv_set_dgram_seg`; the UD responder CQE fields against the header's
//! struct members.
#![allow(missing_docs)]

use mlx5::av::{Av, AvAttr, AvLink, DatagramSeg, GrhAttr};
use mlx5::cqe::Cqe64;
use mlx5_hdrcheck as c;
use proptest::prelude::*;
use zerocopy::{FromBytes, IntoBytes};

fn fields(av: &Av) -> c::AvFields {
    c::AvFields {
        stat_rate_sl: av.stat_rate_sl,
        fl_mlid: av.fl_mlid,
        rlid: av.rlid.get(),
        rmac: av.rmac,
        tclass: av.tclass,
        hop_limit: av.hop_limit,
        grh_gid_fl: av.grh_gid_fl.get(),
        rgid: av.rgid,
    }
}

fn attr_strategy() -> impl Strategy<Value = AvAttr> {
    let grh = (
        any::<[u8; 16]>(),
        any::<u32>(),
        any::<u8>(),
        any::<u8>(),
        any::<u8>(),
    )
        .prop_map(
            |(dgid, flow_label, sgid_index, hop_limit, traffic_class)| GrhAttr {
                dgid,
                flow_label,
                sgid_index,
                hop_limit,
                traffic_class,
            },
        );
    let ib = (any::<u16>(), any::<u8>(), proptest::option::of(grh.clone())).prop_map(
        |(dlid, src_path_bits, grh)| AvLink::Ib {
            dlid,
            src_path_bits,
            grh,
        },
    );
    let roce =
        (grh, any::<[u8; 6]>(), any::<u16>()).prop_map(|(grh, rmac, udp_sport)| AvLink::Roce {
            grh,
            rmac,
            udp_sport,
        });
    (prop_oneof![ib, roce], any::<u8>(), any::<u8>()).prop_map(|(link, sl, static_rate)| AvAttr {
        link,
        sl,
        static_rate,
    })
}

proptest! {
    /// The UD datagram segment is rdma-core's `_set_datagram_seg` of the same AV, byte for
    /// byte (dqp with MLX5_EXTENDED_UD_AV, the Q_Key in the key's first four bytes).
    #[test]
    fn ud_datagram_seg_matches_set_datagram_seg(
        attr in attr_strategy(),
        qpn in 0u32..=0xff_ffff,
        qkey in any::<u32>(),
    ) {
        let av = Av::from_attr(&attr);
        let seg = DatagramSeg::ud(&av, qpn, qkey);
        prop_assert_eq!(seg.as_bytes(), &c::set_ud_datagram_seg(qpn, qkey, &fields(&av))[..]);
        let back = DatagramSeg::read_from_bytes(seg.as_bytes()).unwrap();
        prop_assert_eq!(back.av.dqp(), qpn);
        prop_assert_eq!(back.av.qkey(), qkey);
    }

    /// The DC form is the header's `mlx5dv_set_dgram_seg` with the 64-bit key and ext = 1.
    #[test]
    fn dc_datagram_seg_matches_mlx5dv_set_dgram_seg(
        attr in attr_strategy(),
        dctn in 0u32..=0xff_ffff,
        key in any::<u64>(),
    ) {
        let av = Av::from_attr(&attr);
        let seg = DatagramSeg::dc(&av, dctn, key);
        prop_assert_eq!(seg.as_bytes(), &c::dv_set_dgram_seg(key, dctn, true, &fields(&av))[..]);
    }

    /// The CQE accessors read the members rdma-core's `handle_responder` reads.
    #[test]
    fn ud_cqe_fields_match_the_header(
        src in 0u32..=0xff_ffff,
        sl in 0u8..16,
        grh in any::<bool>(),
        slid in any::<u16>(),
        path in 0u8..0x80,
    ) {
        let flags = (u32::from(grh) << 28) | (u32::from(sl) << 24) | src;
        let bytes = c::set_ud_cqe(flags, slid, path);
        let cqe = Cqe64::read_from_bytes(&bytes).unwrap();
        prop_assert_eq!(cqe.flags_rqpn(), flags);
        prop_assert_eq!(cqe.src_qpn(), src);
        prop_assert_eq!(cqe.sl(), sl);
        prop_assert_eq!(cqe.grh_present(), grh);
        prop_assert_eq!(cqe.slid(), slid);
        prop_assert_eq!(cqe.dlid_path_bits(), path);
        let mut mine = Cqe64::default();
        mine.set_ud_fields(src, sl, grh, slid, path);
        prop_assert_eq!(mine.as_bytes(), &bytes[..]);
    }
}

/// The header's helper writes the key as 64 bits: a 32-bit Q_Key given to it lands in the
/// reserved half, not in `key.qkey.qkey`. UD must use rdma-core's `_set_datagram_seg` form
/// (what UCX does too); this pins the difference so nobody "simplifies" to the helper.
#[test]
fn the_header_helper_is_not_the_ud_form() {
    let av = Av::default();
    let ud = DatagramSeg::ud(&av, 5, 0x1111_2222);
    let helper = c::dv_set_dgram_seg(0x1111_2222, 5, true, &fields(&av));
    assert_eq!(&ud.as_bytes()[0..8], &[0x11, 0x11, 0x22, 0x22, 0, 0, 0, 0]);
    assert_eq!(&helper[0..8], &[0, 0, 0, 0, 0x11, 0x11, 0x22, 0x22]);
}
