//! Address handles: where a UD datagram goes ([`AhAttr`], verbs' `ibv_ah_attr`), made once
//! per destination ([`Pd::create_ah`]) and named by every send to it.

use super::device::{Backend, PdKind};
use super::Pd;
#[cfg(feature = "sim")]
use crate::error::Error;
use crate::error::Result;
use mlx5::av::Av;
#[cfg(feature = "sim")]
use mlx5::av::{AvAttr, AvLink};

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

/// An address handle: the destination of UD sends, in the PD it was made in.
///
/// On the direct path it holds the 48-byte mlx5 address vector (`struct mlx5_wqe_av`) that
/// every send to it copies into its WQE (rdma-core `mlx5_create_ah`; on a ConnectX the
/// provider's own, from `mlx5dv_init_obj(MLX5DV_OBJ_AH)` of the `ibv_create_ah` handle).
#[derive(Clone)]
pub struct AddressHandle {
    pub(crate) av: Av,
    attr: AhAttr,
    pub(crate) pd: Pd,
    /// The rdma-core address handle (`ibv_create_ah`) on the verbs path; None on the
    /// direct path.
    pub(crate) verbs: Option<std::sync::Arc<crate::verbs::ud::Ah>>,
}

impl core::fmt::Debug for AddressHandle {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("AddressHandle")
            .field("attr", &self.attr)
            .finish()
    }
}

impl AddressHandle {
    /// The address it was made from.
    pub fn attr(&self) -> &AhAttr {
        &self.attr
    }

    /// The mlx5 address vector every send to it carries (direct path; on the verbs path
    /// the provider keeps its own and this one is all zero).
    pub fn av(&self) -> &Av {
        &self.av
    }

    /// The protection domain it belongs to.
    pub fn pd(&self) -> &Pd {
        &self.pd
    }
}

/// The mlx5 AV of an InfiniBand address (`mlx5_create_ah`), after its checks.
#[cfg(feature = "sim")]
fn ib_av(attr: &AhAttr) -> Result<Av> {
    if attr.port != 1 {
        return Err(Error::InvalidParameter {
            what: "port number of the address handle (the device has port 1)",
            value: attr.port as u64,
        });
    }
    Ok(Av::from_attr(&AvAttr {
        link: AvLink::Ib {
            dlid: attr.dlid,
            src_path_bits: attr.src_path_bits,
            grh: attr.grh,
        },
        sl: attr.sl,
        static_rate: mlx5::av::mlx5_rate(attr.static_rate),
    }))
}

impl Pd {
    /// Makes an address handle for UD sends to `to` (an [`AhAttr`], or a peer's
    /// [`UdEndpoint`]).
    ///
    /// On rdma-core devices this is `ibv_create_ah` with the same fields; a global route's
    /// `sgid_index` 0 stands for the device's GID index in use (`BLUEFLAME_GID_INDEX`, or
    /// the RoCE v2 IPv4 GID `Device::open` chose), so that an address made from an endpoint
    /// leaves from the GID the endpoint was made with. On RoCE every address must be global
    /// (an endpoint always carries its GID).
    ///
    /// # Errors
    /// [`Error::InvalidParameter`](crate::Error::InvalidParameter) for a port the device
    /// does not have; [`Error::Verbs`](crate::Error::Verbs) (`ibv_create_ah`: e.g. `EINVAL`
    /// for an address without a global route on RoCE, no route to the GID's IP address).
    pub fn create_ah(&self, to: impl Into<AhAttr>) -> Result<AddressHandle> {
        let attr = to.into();
        let (av, verbs) = match (&self.inner.dev.backend, &self.inner.kind) {
            #[cfg(feature = "sim")]
            (Backend::Sim(_), PdKind::Sim(_)) => (ib_av(&attr)?, None),
            (Backend::Verbs(v), PdKind::Verbs(pd)) => {
                let grh = attr.grh.map(|g| GlobalRoute {
                    sgid_index: match (g.sgid_index, v.gid_index) {
                        (0, Some(i)) => i as u8,
                        (i, _) => i,
                    },
                    ..g
                });
                let ah = crate::verbs::ud::Ah::new(pd.clone(), &AhAttr { grh, ..attr })?;
                // mlx5's direct path: the provider's own address vector
                // (`mlx5dv_init_obj(MLX5DV_OBJ_AH)`, the `mah->av` that rdma-core's
                // `set_datagram_seg` / `mlx5_send_wr_set_ud_addr` and UCX's
                // `uct_ib_mlx5_get_av` copy into every UD WQE), copied once here.
                let av = if v.path == crate::DataPath::Direct {
                    // SAFETY: `ah.ah` is a live AH of this mlx5 device (the direct path
                    // runs only on mlx5), kept alive by `ah` during the calls; `av_of`
                    // reads the 48 bytes `init_ah` points to, inside that AH.
                    unsafe {
                        let dv = crate::dv::init_ah(ah.ah.cast())?;
                        crate::dv::av_of(&dv)?
                    }
                } else {
                    Av::default()
                };
                (av, Some(std::sync::Arc::new(ah)))
            }
            #[cfg(feature = "sim")]
            _ => return Err(Error::Unsupported("PD and device backends differ")),
        };
        Ok(AddressHandle {
            av,
            attr,
            pd: self.clone(),
            verbs,
        })
    }
}
