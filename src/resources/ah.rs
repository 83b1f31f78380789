//! Address handles: where a UD datagram goes ([`AhAttr`], verbs' `ibv_ah_attr`), made once
//! per destination ([`Pd::create_ah`]) and named by every send to it.

use super::Pd;
pub use crate::address::{AhAttr, GlobalRoute, UdEndpoint, DEFAULT_HOP_LIMIT};
use crate::error::Result;
use mlx5::av::Av;

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
    pub(crate) fn attr(&self) -> &AhAttr {
        &self.attr
    }

    /// The mlx5 address vector every send to it carries (direct path; on the verbs path
    /// the provider keeps its own and this one is all zero).
    pub(crate) fn av(&self) -> &Av {
        &self.av
    }

    /// The protection domain it belongs to.
    pub fn pd(&self) -> &Pd {
        &self.pd
    }
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
    /// An address must name a port: a LID on InfiniBand (a unicast LID, a multicast LID
    /// 0xc000..=0xfffe or the permissive LID 0xffff), a GID in a global route (mandatory
    /// on RoCE). A ConnectX would take one without (rdma-core's `mlx5_create_ah` copies
    /// `dlid` 0 as it is) and send every datagram to LID 0, lost with a successful
    /// completion; it is refused here, once, so a send never checks it.
    ///
    /// # Errors
    /// [`Error::InvalidParameter`](crate::Error::InvalidParameter) for a port the device
    /// does not have, and with the destination LID for an address without one: LID 0 on an
    /// InfiniBand port (a bare [`UdEndpoint`] of QP number and Q_Key), an empty GID in a
    /// global route, no global route on RoCE; [`Error::Verbs`](crate::Error::Verbs)
    /// (`ibv_query_port`, `ibv_create_ah`: e.g. no route to the GID's IP address).
    pub fn create_ah(&self, to: impl Into<AhAttr>) -> Result<AddressHandle> {
        let attr = to.into();
        let (av, verbs) = self.inner.pd.create_ah(&attr)?;
        Ok(AddressHandle {
            av,
            attr,
            pd: self.clone(),
            verbs,
        })
    }
}

#[cfg(all(test, feature = "sim"))]
mod rate_tests {
    /// `AhAttr::static_rate` is an `enum ibv_rate`, as on the verbs path (`ibv_create_ah`);
    /// the mlx5 AV carries the mlx5 code rdma-core's `mlx5_create_ah` converts it to.
    #[test]
    fn an_address_handles_static_rate_is_the_verbs_rate() {
        let dev = crate::resources::Device::sim_stepped();
        let pd = dev.alloc_pd().unwrap();
        let cq = dev.create_cq(16).unwrap();
        let qp = pd
            .create_ud_qp(&cq, &cq, crate::caps::QpCaps::default(), 5)
            .unwrap();
        for (ibv_rate, mlx5_code) in [
            (0u8, 0u8),
            (2, 7),
            (3, 8),
            (7, 12),
            (11, 11),
            (16, 15),
            (99, 0),
        ] {
            let mut attr = super::AhAttr::from(&qp.endpoint());
            attr.static_rate = ibv_rate;
            let ah = pd.create_ah(attr).unwrap();
            assert_eq!(ah.av().stat_rate_sl >> 4, mlx5_code, "IBV rate {ibv_rate}");
        }
    }
}
