//! Where a UD datagram goes, as values: [`AhAttr`] (verbs' `ibv_ah_attr`), its global route,
//! and a UD QP's [`UdEndpoint`] (what a peer needs to address it). The address handle made
//! of them is `crate::resources::ah`.

/// The global routing part of an address (verbs' `ibv_global_route`): the destination GID,
/// flow label, source GID index, hop limit and traffic class.
pub type GlobalRoute = mlx5::av::GrhAttr;

/// Where datagrams go (verbs' `struct ibv_ah_attr`, on an InfiniBand port).
///
/// Made from a peer's [`UdEndpoint`] (`AhAttr::from(&endpoint)`), or for a multicast group
/// with [`AhAttr::multicast`].
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct AhAttr {
    /// Destination LID (a multicast LID, 0xc000..=0xfffe, for a group).
    pub dlid: u16,
    /// Service level (4 bits).
    pub sl: u8,
    /// Source path bits (7 bits).
    pub src_path_bits: u8,
    /// Static rate: a verbs rate (`enum ibv_rate`, `IBV_RATE_*`, as `ibv_ah_attr.static_rate`;
    /// 0: the port's rate), the same value on every backend (the mlx5 AV carries its mlx5
    /// code, [`mlx5::av::mlx5_rate`], as rdma-core's `mlx5_create_ah` converts it).
    pub static_rate: u8,
    /// Global routing: with it, every datagram carries a GRH, which the receiver finds in
    /// the first 40 bytes of its buffer ([`crate::Completion::grh`]). Mandatory on RoCE.
    pub grh: Option<GlobalRoute>,
    /// The local port (1 on the software NIC).
    pub port: u8,
}

impl Default for AhAttr {
    fn default() -> Self {
        AhAttr {
            dlid: 0,
            sl: 0,
            src_path_bits: 0,
            static_rate: 0,
            grh: None,
            port: 1,
        }
    }
}

/// The multicast GID the connection manager joins for an IP multicast group on an
/// InfiniBand port (the kernel's `cma_set_mgid`: `ip_ib_mc_map` / `ipv6_ib_mc_map` with the
/// IPoIB broadcast address's scope 2 and P_Key 0xffff, byte 3 set to 0x01, the RDMA CM
/// signature of `RDMA_PS_UDP`). The software NIC's joins use it (an rdma-core device gets
/// the MGID from the join event).
#[cfg(feature = "sim")]
pub(crate) fn rdma_cm_mgid(group: std::net::IpAddr) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[..6].copy_from_slice(&[0xff, 0x12, 0x40, 0x01, 0xff, 0xff]);
    match group {
        std::net::IpAddr::V4(a) => {
            let o = a.octets();
            g[12..].copy_from_slice(&[o[0] & 0x0f, o[1], o[2], o[3]]);
        }
        std::net::IpAddr::V6(a) => {
            g[2] = 0x60;
            g[6..].copy_from_slice(&a.octets()[6..]);
        }
    }
    g
}

/// Refuses a destination that names no port: no LID on an InfiniBand port (`lid` 0, the
/// reserved LID; a multicast LID or the permissive LID is an address), or an all-zero
/// GID where the path is global (RoCE, a GRH asked for, a GID index in use). Every
/// destination the crate takes goes through it once, where it is made: a connect's
/// endpoint (`backend::check_remote_address`), an address handle ([`AhAttr::check_destination`],
/// at `Pd::create_ah`) and a DC peer (`DcPeer::new`); never a UD send or DCI request.
/// Nothing below refuses it: rdma-core's `mlx5_create_ah` copies `dlid` 0 into the AV's
/// `rlid` without asking the kernel on InfiniBand, the kernel's `rdma_check_ah_attr` checks
/// the port and the GRH flag only and `mlx5_set_path` programs `rlid` 0 as it is; a
/// ConnectX then sends to LID 0, where the datagram (with a successful completion) or the
/// connection is lost.
///
/// # Errors
/// [`crate::Error::InvalidParameter`] with `what` and `value` (the caller's name for the
/// destination: its QP or DCT number, or its LID).
pub(crate) fn check_destination(
    ethernet: bool,
    global: bool,
    lid: u16,
    gid: &[u8; 16],
    what: &'static str,
    value: u64,
) -> crate::Result<()> {
    let no_lid = !ethernet && lid == 0;
    let no_gid = (ethernet || global) && *gid == [0; 16];
    if no_lid || no_gid {
        return Err(crate::Error::InvalidParameter { what, value });
    }
    Ok(())
}

/// The default hop limit of a global route made from an endpoint or a group (one subnet,
/// as UCX's `uct_ib_iface_fill_ah_attr_from_gid_lid` uses).
pub const DEFAULT_HOP_LIMIT: u8 = 64;

impl AhAttr {
    /// The address of a multicast group: its multicast LID and GID (always global: an
    /// InfiniBand multicast packet carries a GRH with the group's GID).
    pub fn multicast(mgid: [u8; 16], mlid: u16) -> AhAttr {
        AhAttr {
            dlid: mlid,
            grh: Some(GlobalRoute {
                dgid: mgid,
                hop_limit: DEFAULT_HOP_LIMIT,
                ..GlobalRoute::default()
            }),
            ..AhAttr::default()
        }
    }

    /// The same address without global routing: its datagrams carry no GRH (InfiniBand
    /// only).
    pub fn local(mut self) -> AhAttr {
        self.grh = None;
        self
    }

    /// Refuses, before an address handle is made of it, an address that names no port on
    /// a port of this link layer ([`check_destination`]): no LID on InfiniBand, or a global
    /// route with an empty GID (on RoCE no global route at all). Checked once per address
    /// handle: a UD send copies the handle's address vector and checks nothing of it.
    ///
    /// # Errors
    /// [`crate::Error::InvalidParameter`] with the destination LID.
    pub(crate) fn check_destination(&self, ethernet: bool) -> crate::Result<()> {
        let gid = self.grh.map(|g| g.dgid).unwrap_or_default();
        check_destination(
            ethernet,
            self.grh.is_some(),
            self.dlid,
            &gid,
            "address without a destination: LID 0 on an InfiniBand port, or no global \
             route or an empty GID in it (mandatory on RoCE); a QP number and Q_Key alone \
             are no address: make the handle of the peer's UdQp::endpoint (destination LID \
             given)",
            u64::from(self.dlid),
        )
    }
}

/// What a peer needs to send datagrams to a UD QP: its port's LID and GID, its QP number and
/// its Q_Key ([`crate::UdQp::endpoint`]); exchange it out of band.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct UdEndpoint {
    /// The QP number.
    pub qpn: u32,
    /// The QP's Q_Key.
    pub qkey: u32,
    /// The port's LID.
    pub lid: u16,
    /// The port's GID (all zero when the port has none in use).
    pub gid: [u8; 16],
}

impl From<&UdEndpoint> for AhAttr {
    /// The address of the endpoint's port; global (with a GRH) when it has a GID.
    fn from(e: &UdEndpoint) -> AhAttr {
        AhAttr {
            dlid: e.lid,
            grh: (e.gid != [0; 16]).then_some(GlobalRoute {
                dgid: e.gid,
                hop_limit: DEFAULT_HOP_LIMIT,
                ..GlobalRoute::default()
            }),
            ..AhAttr::default()
        }
    }
}

impl From<UdEndpoint> for AhAttr {
    fn from(e: UdEndpoint) -> AhAttr {
        AhAttr::from(&e)
    }
}

#[cfg(all(test, feature = "sim"))]
mod tests {
    /// The kernel's `ip_ib_mc_map` / `ipv6_ib_mc_map` (scope 2, P_Key 0xffff) with the RDMA
    /// CM signature: 239.1.2.3 is ff12:4001:ffff::f:102:3 (the IPv4 address's top four bits
    /// dropped), ff05::1:3 keeps its last ten bytes.
    #[test]
    fn mgids_as_the_connection_manager_makes_them() {
        let v4 = super::rdma_cm_mgid([239, 1, 2, 3].into());
        assert_eq!(
            v4,
            [0xff, 0x12, 0x40, 0x01, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0x0f, 1, 2, 3]
        );
        let v6 = super::rdma_cm_mgid("ff05::1:3".parse().unwrap());
        assert_eq!(
            v6,
            [0xff, 0x12, 0x60, 0x01, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 1, 0, 3]
        );
    }
}
