//! Address handles (`ibv_create_ah`, `ibv_destroy_ah`): where a UD send goes.

use super::pd::Pd;
use crate::verbs::{last, VerbsError};
use rdma_sys as ffi;
use std::sync::Arc;

/// An address handle (`ibv_create_ah`), destroyed when the last reference drops: the UD send
/// queue holds one for each request naming it until the request completed
/// ([`VerbsUdSendQueue`](crate::verbs::ud::VerbsUdSendQueue)), as verbs requires (rxe resolves the address when the AH is created
/// and its kernel requester looks the AH up by number when it processes each WQE; mlx5
/// copies it into each WQE).
pub struct Ah {
    pub(crate) ah: *mut ffi::ibv_ah,
    _pd: Arc<Pd>,
}

// SAFETY: as for Pd: the wrapper only holds the pointer; rdma-core's calls on it are
// thread-safe and a posted request keeps no reference to the user-space object.
unsafe impl Send for Ah {}
// SAFETY: as above.
unsafe impl Sync for Ah {}

impl std::fmt::Debug for Ah {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ah").finish_non_exhaustive()
    }
}

impl Ah {
    /// An address handle on `pd` for `attr` (`struct ibv_ah_attr`; with a global route:
    /// `is_global`, `dgid`, `flow_label`, `sgid_index`, `hop_limit`, `traffic_class`, as
    /// perftest's and UCX's UD address handles). The fields go to verbs as they are: the
    /// caller maps the GID index.
    ///
    /// # Errors
    /// The `ibv_create_ah` error (e.g. no route to the GID's address on RoCE).
    pub fn new(pd: Arc<Pd>, attr: &crate::address::AhAttr) -> std::result::Result<Ah, VerbsError> {
        // SAFETY: zeroed attributes are valid (no GRH, SL 0, static rate 0).
        let mut a: ffi::ibv_ah_attr = unsafe { std::mem::zeroed() };
        a.dlid = attr.dlid;
        a.sl = attr.sl;
        a.src_path_bits = attr.src_path_bits;
        a.static_rate = attr.static_rate;
        a.port_num = attr.port;
        if let Some(g) = attr.grh {
            a.is_global = 1;
            a.grh.dgid.raw = g.dgid;
            a.grh.flow_label = g.flow_label & 0xf_ffff;
            a.grh.sgid_index = g.sgid_index;
            a.grh.hop_limit = g.hop_limit;
            a.grh.traffic_class = g.traffic_class;
        }
        // SAFETY: live PD; `a` is valid for the call, which copies it.
        let ah = unsafe { ffi::ibv_create_ah(pd.pd, &mut a) };
        if ah.is_null() {
            return Err(last("ibv_create_ah"));
        }
        Ok(Ah { ah, _pd: pd })
    }
}

/// The address `a` names (`struct ibv_ah_attr`, as librdmacm's events carry it), the
/// inverse of what [`Ah::new`] gives verbs.
pub fn attr_of(a: &ffi::ibv_ah_attr) -> crate::address::AhAttr {
    // SAFETY: `raw` is the byte view of the GID union: any bytes are valid.
    let dgid = unsafe { a.grh.dgid.raw };
    crate::address::AhAttr {
        dlid: a.dlid,
        sl: a.sl,
        src_path_bits: a.src_path_bits,
        static_rate: a.static_rate,
        grh: (a.is_global != 0).then_some(crate::address::GlobalRoute {
            dgid,
            flow_label: a.grh.flow_label,
            sgid_index: a.grh.sgid_index,
            hop_limit: a.grh.hop_limit,
            traffic_class: a.grh.traffic_class,
        }),
        port: a.port_num,
    }
}

impl Drop for Ah {
    fn drop(&mut self) {
        // SAFETY: created in `new`, destroyed once.
        unsafe { ffi::ibv_destroy_ah(self.ah) };
    }
}
