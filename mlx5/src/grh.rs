//! The 40-byte Global Route Header a UD receive finds at the start of its buffer (verbs
//! `struct ibv_grh`, InfiniBand Architecture Specification vol. 1, 8.3).
//!
//! On InfiniBand (and RoCE v1 / RoCE v2 over IPv6) the 40 bytes are the GRH as it came on the
//! wire: version 6, traffic class and flow label, payload length, next header 0x1B (the
//! base transport header), hop limit, source GID, destination GID. A UD receive reserves the
//! 40 bytes whether or not the packet carried a GRH; without one (InfiniBand, an address
//! handle that is not global) they are left as they were and the completion says so
//! (`IBV_WC_GRH` clear). On RoCE v2 over IPv4 the first 20 bytes are undefined and the IPv4
//! header is in bytes 20..40 (the GIDs are then IPv4-mapped, `::ffff:a.b.c.d`).

use crate::be::{Be16, Be32};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// Bytes of a GRH (`sizeof(struct ibv_grh)`).
pub const GRH_BYTES: usize = 40;
/// The next-header value of a GRH followed by an InfiniBand base transport header.
pub const NEXT_HDR_BTH: u8 = 0x1b;
/// Bytes the transport adds to a UD payload after the GRH: BTH (12), DETH (8) and the
/// invariant CRC (4); an immediate adds 4 more.
pub const UD_TRANSPORT_BYTES: u16 = 12 + 8 + 4;

/// `struct ibv_grh`.
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
pub struct Grh {
    /// `6 << 28 | traffic_class << 20 | flow_label`.
    pub version_tclass_flow: Be32,
    /// Bytes after the GRH up to the invariant CRC included (the payload padded to 4 bytes).
    pub paylen: Be16,
    /// The next header ([`NEXT_HDR_BTH`]).
    pub next_hdr: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Source GID (the sender's port GID).
    pub sgid: [u8; 16],
    /// Destination GID (the receiver's port GID, or the multicast GID).
    pub dgid: [u8; 16],
}

impl Grh {
    /// The GRH of a UD datagram of `len` payload bytes (`imm`: with an immediate).
    pub fn ud(
        traffic_class: u8,
        flow_label: u32,
        hop_limit: u8,
        sgid: [u8; 16],
        dgid: [u8; 16],
        len: u32,
        imm: bool,
    ) -> Grh {
        // On the wire the payload is padded to 4 bytes (BTH PadCnt) before the ICRC, and the
        // length counts the pad (the kernel's `ib_ud_header_init`: `(... + 3) & ~3`).
        let padded = (len as u64 + 3) & !3;
        let paylen = (padded + UD_TRANSPORT_BYTES as u64 + 4 * imm as u64).min(0xffff);
        Grh {
            version_tclass_flow: Be32::new(
                6 << 28 | u32::from(traffic_class) << 20 | (flow_label & 0xf_ffff),
            ),
            paylen: Be16::new(paylen as u16),
            next_hdr: NEXT_HDR_BTH,
            hop_limit,
            sgid,
            dgid,
        }
    }
    /// Reads the first 40 bytes of a receive buffer (None when shorter).
    pub fn parse(buf: &[u8]) -> Option<Grh> {
        Grh::read_from_prefix(buf).ok().map(|(g, _)| g)
    }
    /// The IP version field (6).
    pub fn version(&self) -> u8 {
        (self.version_tclass_flow.get() >> 28) as u8
    }
    /// The traffic class.
    pub fn traffic_class(&self) -> u8 {
        (self.version_tclass_flow.get() >> 20) as u8
    }
    /// The flow label.
    pub fn flow_label(&self) -> u32 {
        self.version_tclass_flow.get() & 0xf_ffff
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ud_grh_fields() {
        let g = Grh::ud(0x20, 0x1_2345, 64, [1; 16], [2; 16], 100, true);
        assert_eq!(core::mem::size_of::<Grh>(), GRH_BYTES);
        assert_eq!(g.version(), 6);
        assert_eq!(g.traffic_class(), 0x20);
        assert_eq!(g.flow_label(), 0x1_2345);
        assert_eq!(g.paylen.get(), 100 + 24 + 4);
        let b = g.as_bytes();
        assert_eq!(b[6], NEXT_HDR_BTH);
        assert_eq!(b[7], 64);
        assert_eq!(Grh::parse(b), Some(g));
        assert_eq!(Grh::parse(&b[..39]), None);
        // the payload padded to 4 bytes, as on the wire
        assert_eq!(
            Grh::ud(0, 0, 64, [1; 16], [2; 16], 5, false).paylen.get(),
            8 + 20 + 4
        );
    }
}
