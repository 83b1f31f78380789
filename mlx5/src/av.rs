//! The address vector (`struct mlx5_wqe_av`, 48 bytes) and the datagram segment that carries
//! it in a UD send WQE (`struct mlx5_wqe_datagram_seg`); DC reuses the same 48 bytes with the
//! DC access key in place of the Q_Key and the DCT number in place of the destination QP.
//!
//! How the bytes are made, after rdma-core:
//! - `verbs.c` `mlx5_create_ah` fills the AV of an address handle once: on InfiniBand
//!   `fl_mlid = src_path_bits & 0x7f`, `rlid = dlid`, `stat_rate_sl = rate << 4 | sl & 0xf`
//!   and, with a GRH, `grh_gid_fl = 1 << 30 | sgid_index << 20 | flow_label`; on RoCE the GRH
//!   is mandatory (a non-global attribute is refused), the GRH bit is reserved (0),
//!   `stat_rate_sl = rate << 4 | (sl & 7) << 1`, `rmac` holds the next hop's MAC and, for
//!   RoCE v2, `rlid` holds the UDP source port (`mlx5_ah_set_udp_sport`); with a GRH,
//!   `tclass`, `hop_limit` and `rgid` are the GRH's.
//! - `qp.c` `_set_datagram_seg` copies that AV into the WQE after the control segment, then
//!   sets `dqp_dct = remote_qpn | MLX5_EXTENDED_UD_AV` and the Q_Key (the first four bytes;
//!   the four after it stay as the AH left them, zero). UCX's `uct_ib_mlx5_set_dgram_seg`
//!   does the same for UD, and writes the 64-bit `dc_key` for DC.
//!
//! The segment is three DS (48 bytes); a UD send WQE is ctrl (1 DS) + datagram (3 DS) + data.

use crate::be::{Be16, Be32, Be64};
use crate::seg::DS_BYTES;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// Bytes of one address vector (`sizeof(struct mlx5_wqe_av)`).
pub const AV_BYTES: usize = 48;
/// DS units taken by the datagram segment.
pub const DATAGRAM_SEG_DS: usize = AV_BYTES / DS_BYTES;
/// `MLX5_EXTENDED_UD_AV`: the top bit of `dqp_dct`, set by rdma-core on every UD and DC send
/// (the 48-byte extended form of the AV, with the GRH fields).
pub const EXTENDED_UD_AV: u32 = 0x8000_0000;
/// The GRH bit of `grh_gid_fl` (InfiniBand only; reserved on RoCE).
pub const AV_GRH: u32 = 1 << 30;
/// The flow-label bits of `grh_gid_fl` (`IB_GRH_FLOWLABEL_MASK`).
pub const FLOW_LABEL_MASK: u32 = 0x000f_ffff;
/// The first multicast LID (`0xc000`); LIDs from here to `0xfffe` are multicast.
pub const MULTICAST_LID_BASE: u16 = 0xc000;
/// The permissive LID, not a multicast LID.
pub const PERMISSIVE_LID: u16 = 0xffff;

/// `struct mlx5_wqe_av`: where a datagram goes and how.
#[repr(C)]
#[derive(
    FromBytes,
    IntoBytes,
    KnownLayout,
    Immutable,
    Unaligned,
    Copy,
    Clone,
    Debug,
    Default,
    PartialEq,
    Eq,
)]
pub struct Av {
    /// The header's `key` union: UD puts the Q_Key in its first four bytes (`key.qkey.qkey`,
    /// the next four reserved, zero); DC puts the 64-bit access key (`key.dc_key`) here.
    /// Use [`Av::qkey`] / [`Av::set_qkey`] or [`Av::dc_key`] / [`Av::set_dc_key`].
    pub key: Be64,
    /// `remote qpn (or DCT number) | MLX5_EXTENDED_UD_AV`.
    pub dqp_dct: Be32,
    /// `static_rate << 4 | sl` (InfiniBand) or `static_rate << 4 | (sl & 7) << 1` (RoCE).
    pub stat_rate_sl: u8,
    /// Force-loopback bit and source path bits (`src_path_bits & 0x7f` on InfiniBand).
    pub fl_mlid: u8,
    /// Destination LID (InfiniBand) or the UDP source port (RoCE v2).
    pub rlid: Be16,
    /// Reserved, zero.
    pub reserved0: [u8; 4],
    /// Destination MAC (RoCE).
    pub rmac: [u8; 6],
    /// GRH traffic class (IPv6 traffic class / IPv4 TOS on RoCE).
    pub tclass: u8,
    /// GRH hop limit (IPv6 hop limit / IPv4 TTL on RoCE).
    pub hop_limit: u8,
    /// `grh << 30 | sgid_index << 20 | flow_label`.
    pub grh_gid_fl: Be32,
    /// Destination GID (on RoCE the IPv6 address, or an IPv4-mapped one).
    pub rgid: [u8; 16],
}

/// `struct mlx5_wqe_datagram_seg`: the address vector as the second segment of a UD (or DC)
/// send WQE.
#[repr(C)]
#[derive(
    FromBytes,
    IntoBytes,
    KnownLayout,
    Immutable,
    Unaligned,
    Copy,
    Clone,
    Debug,
    Default,
    PartialEq,
    Eq,
)]
pub struct DatagramSeg {
    /// The address vector, with the destination QP and key filled in.
    pub av: Av,
}

/// The global routing part of an address (verbs `struct ibv_global_route`).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct GrhAttr {
    /// Destination GID.
    pub dgid: [u8; 16],
    /// Flow label (20 bits; higher bits are ignored, as rdma-core masks them).
    pub flow_label: u32,
    /// Index of the source GID in the port's GID table.
    pub sgid_index: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Traffic class.
    pub traffic_class: u8,
}

/// The link a destination is reached over, with what that link needs.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum AvLink {
    /// InfiniBand: a destination LID (a multicast LID for a group), the source path bits and,
    /// optionally, a GRH.
    Ib {
        /// Destination LID.
        dlid: u16,
        /// Source path bits (7 bits; LMC).
        src_path_bits: u8,
        /// Global routing, if the destination is addressed by GID too.
        grh: Option<GrhAttr>,
    },
    /// RoCE: always global, the next hop's MAC and (RoCE v2) the UDP source port.
    Roce {
        /// Global routing (mandatory on RoCE).
        grh: GrhAttr,
        /// Destination (next-hop) MAC.
        rmac: [u8; 6],
        /// RoCE v2 UDP source port (0 for RoCE v1).
        udp_sport: u16,
    },
}

/// The mlx5 static-rate code of a verbs rate (`enum ibv_rate`, as in `ibv_ah_attr.static_rate`),
/// as rdma-core's `mlx5_create_ah` converts it (`verbs.c` `ah_attr_to_mlx5_rate` and its table):
/// 0 (the port's rate), the unknown and the rates above 120 Gb/s give 0 (unlimited); a rate
/// between two of the codes takes the next one up.
pub const fn mlx5_rate(ibv_rate: u8) -> u8 {
    const CODES: [u8; 23] = [
        0, 0, 7, 8, 9, 10, 11, 12, 13, 14, 15, 11, 13, 15, 0, 9, 15, 0, 0, 9, 13, 0, 0,
    ];
    if (ibv_rate as usize) < CODES.len() {
        CODES[ibv_rate as usize]
    } else {
        0
    }
}

/// What an address handle says, in host values (the fields of `ibv_ah_attr` mlx5 reads).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct AvAttr {
    /// The link and its addressing.
    pub link: AvLink,
    /// Service level (4 bits on InfiniBand, 3 bits of priority on RoCE).
    pub sl: u8,
    /// The mlx5 static-rate code (0: port rate; [`mlx5_rate`] converts a verbs rate).
    pub static_rate: u8,
}

impl Av {
    /// The AV of an address handle, as `mlx5_create_ah` fills it (destination QP and key
    /// zero: they are per send).
    pub fn from_attr(attr: &AvAttr) -> Av {
        let mut av = Av::default();
        let rate = (attr.static_rate & 0xf) << 4;
        let grh = match attr.link {
            AvLink::Ib {
                dlid,
                src_path_bits,
                grh,
            } => {
                av.fl_mlid = src_path_bits & 0x7f;
                av.rlid = Be16::new(dlid);
                av.stat_rate_sl = rate | (attr.sl & 0xf);
                grh.map(|g| (g, AV_GRH))
            }
            AvLink::Roce {
                grh,
                rmac,
                udp_sport,
            } => {
                av.rlid = Be16::new(udp_sport);
                av.rmac = rmac;
                av.stat_rate_sl = rate | ((attr.sl & 0x7) << 1);
                Some((grh, 0))
            }
        };
        if let Some((g, bit)) = grh {
            av.tclass = g.traffic_class;
            av.hop_limit = g.hop_limit;
            av.grh_gid_fl =
                Be32::new(bit | (u32::from(g.sgid_index) << 20) | (g.flow_label & FLOW_LABEL_MASK));
            av.rgid = g.dgid;
        }
        av
    }

    /// The AV of these 48 bytes (as the provider keeps it: `mlx5dv_ah.av`).
    pub fn from_bytes(b: &[u8; AV_BYTES]) -> Av {
        zerocopy::transmute!(*b)
    }
    /// The 48 bytes of this AV.
    pub fn to_bytes(&self) -> [u8; AV_BYTES] {
        zerocopy::transmute!(*self)
    }
    /// The Q_Key (UD): the first four bytes of `key`.
    #[inline]
    pub fn qkey(&self) -> u32 {
        (self.key.get() >> 32) as u32
    }
    /// Sets the Q_Key (UD) and leaves the reserved half of `key` alone, as rdma-core's
    /// `_set_datagram_seg` does (`key.qkey.qkey = htobe32(qkey)`).
    #[inline]
    pub fn set_qkey(&mut self, qkey: u32) {
        let low = self.key.get() & 0xffff_ffff;
        self.key = Be64::new((u64::from(qkey) << 32) | low);
    }
    /// The DC access key (DC): all eight bytes of `key`.
    #[inline]
    pub fn dc_key(&self) -> u64 {
        self.key.get()
    }
    /// Sets the DC access key (`key.dc_key = htobe64(dc_key)`).
    #[inline]
    pub fn set_dc_key(&mut self, dc_key: u64) {
        self.key = Be64::new(dc_key);
    }
    /// The destination QP (UD) or DCT number (DC), without the extended-AV bit.
    #[inline]
    pub fn dqp(&self) -> u32 {
        self.dqp_dct.get() & 0x00ff_ffff
    }
    /// Whether the extended-AV bit is set.
    #[inline]
    pub fn extended(&self) -> bool {
        self.dqp_dct.get() & EXTENDED_UD_AV != 0
    }
    /// The service level as written by [`Av::from_attr`] for this link (InfiniBand: bits
    /// 3:0; RoCE: bits 3:1).
    #[inline]
    pub fn sl(&self, roce: bool) -> u8 {
        if roce {
            (self.stat_rate_sl >> 1) & 0x7
        } else {
            self.stat_rate_sl & 0xf
        }
    }
    /// The GRH bit (InfiniBand).
    #[inline]
    pub fn grh_bit(&self) -> bool {
        self.grh_gid_fl.get() & AV_GRH != 0
    }
    /// The source GID index.
    #[inline]
    pub fn sgid_index(&self) -> u8 {
        (self.grh_gid_fl.get() >> 20) as u8
    }
    /// The flow label.
    #[inline]
    pub fn flow_label(&self) -> u32 {
        self.grh_gid_fl.get() & FLOW_LABEL_MASK
    }
    /// Whether this AV addresses a multicast group: a multicast destination GID (first byte
    /// 0xff) when routed globally, or a multicast LID (0xc000..=0xfffe) on InfiniBand.
    pub fn is_multicast(&self, roce: bool) -> bool {
        let mgid = (roce || self.grh_bit()) && self.rgid[0] == 0xff;
        let rlid = self.rlid.get();
        let mlid = !roce && (MULTICAST_LID_BASE..PERMISSIVE_LID).contains(&rlid);
        mgid || mlid
    }
}

impl DatagramSeg {
    /// The UD datagram segment of one send: the AH's AV copied, then the destination QP with
    /// `MLX5_EXTENDED_UD_AV` and the Q_Key (rdma-core `qp.c` `_set_datagram_seg`).
    #[inline]
    pub fn ud(av: &Av, remote_qpn: u32, qkey: u32) -> DatagramSeg {
        let mut seg = DatagramSeg { av: *av };
        seg.av.dqp_dct = Be32::new((remote_qpn & 0x00ff_ffff) | EXTENDED_UD_AV);
        seg.av.set_qkey(qkey);
        seg
    }
    /// The DC datagram segment of one send: the AH's AV copied, then the DCT number with
    /// `MLX5_EXTENDED_UD_AV` and the 64-bit DC access key (rdma-core `qp.c`
    /// `mlx5_send_wr_set_dc_addr`, UCX `uct_ib_mlx5_set_dgram_seg`).
    #[inline]
    pub fn dc(av: &Av, dctn: u32, dc_key: u64) -> DatagramSeg {
        let mut seg = DatagramSeg { av: *av };
        seg.av.dqp_dct = Be32::new((dctn & 0x00ff_ffff) | EXTENDED_UD_AV);
        seg.av.set_dc_key(dc_key);
        seg
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::{offset_of, size_of};

    #[test]
    fn sizes_and_offsets() {
        assert_eq!(size_of::<Av>(), AV_BYTES);
        assert_eq!(size_of::<DatagramSeg>(), 3 * DS_BYTES);
        assert_eq!(DATAGRAM_SEG_DS, 3);
        assert_eq!(offset_of!(Av, dqp_dct), 8);
        assert_eq!(offset_of!(Av, rlid), 14);
        assert_eq!(offset_of!(Av, rmac), 20);
        assert_eq!(offset_of!(Av, grh_gid_fl), 28);
        assert_eq!(offset_of!(Av, rgid), 32);
    }

    fn grh() -> GrhAttr {
        GrhAttr {
            dgid: [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8],
            flow_label: 0xfff_ffff,
            sgid_index: 3,
            hop_limit: 64,
            traffic_class: 0x20,
        }
    }

    #[test]
    fn ib_av_as_mlx5_create_ah() {
        let av = Av::from_attr(&AvAttr {
            link: AvLink::Ib {
                dlid: 0x12,
                src_path_bits: 0xff,
                grh: Some(grh()),
            },
            sl: 0x1f,
            static_rate: 3,
        });
        assert_eq!(av.fl_mlid, 0x7f);
        assert_eq!(av.rlid.get(), 0x12);
        assert_eq!(av.stat_rate_sl, 0x3f);
        assert_eq!(av.grh_gid_fl.get(), 1 << 30 | 3 << 20 | 0xf_ffff);
        assert_eq!(av.rgid, grh().dgid);
        assert_eq!((av.tclass, av.hop_limit), (0x20, 64));
        assert_eq!(av.sl(false), 0xf);
        assert!(av.grh_bit());
        assert!(!av.is_multicast(false));
    }

    #[test]
    fn roce_av_has_no_grh_bit_and_sl_in_bits_3_1() {
        let av = Av::from_attr(&AvAttr {
            link: AvLink::Roce {
                grh: grh(),
                rmac: [1, 2, 3, 4, 5, 6],
                udp_sport: 0xc001,
            },
            sl: 0xf,
            static_rate: 0,
        });
        assert_eq!(av.stat_rate_sl, 0x7 << 1);
        assert_eq!(av.sl(true), 7);
        assert!(!av.grh_bit());
        assert_eq!(av.rmac, [1, 2, 3, 4, 5, 6]);
        assert_eq!(av.rlid.get(), 0xc001);
        // a UDP port in rlid is not a multicast LID on RoCE
        assert!(!av.is_multicast(true));
    }

    #[test]
    fn datagram_seg_sets_dqp_extended_and_qkey() {
        let av = Av::from_attr(&AvAttr {
            link: AvLink::Ib {
                dlid: 0xc001,
                src_path_bits: 0,
                grh: None,
            },
            sl: 0,
            static_rate: 0,
        });
        assert!(av.is_multicast(false));
        let seg = DatagramSeg::ud(&av, 0xff12_3456, 0x8001_1234);
        let b = zerocopy::IntoBytes::as_bytes(&seg);
        assert_eq!(&b[0..8], &[0x80, 0x01, 0x12, 0x34, 0, 0, 0, 0]);
        assert_eq!(&b[8..12], &[0x80, 0x12, 0x34, 0x56]);
        assert_eq!(seg.av.dqp(), 0x12_3456);
        assert!(seg.av.extended());
        assert_eq!(seg.av.qkey(), 0x8001_1234);
        let dc = DatagramSeg::dc(&av, 0x77, 0x0102_0304_0506_0708);
        assert_eq!(dc.av.dc_key(), 0x0102_0304_0506_0708);
        assert_eq!(dc.av.dqp_dct.get(), 0x77 | EXTENDED_UD_AV);
    }
}
