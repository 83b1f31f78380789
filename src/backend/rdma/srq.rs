//! rdma-core SRQs: on mlx5's direct path the ring taken over with `mlx5dv_init_obj` (the
//! crate never calls `ibv_post_srq_recv` on it), elsewhere posted with
//! `ibv_post_srq_recv`.

use super::Pd;
use crate::backend::spec::SrqRings;
use crate::data_path::DataPath;
use crate::error::{Error, Result};
use crate::verbs;
use std::sync::Arc;

/// A number for a verbs SRQ: rdma-core names an SRQ only by its `ibv_srq` (the SRQ number
/// is the kernel's, not reported for a basic SRQ); the crate's own, with bit 31 set as for
/// verbs CQs.
fn verbs_srq_number() -> u32 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static IDS: AtomicU32 = AtomicU32::new(1);
    0x8000_0000 | (IDS.fetch_add(1, Ordering::Relaxed) & 0x7fff_ffff)
}

/// An SRQ of `p` (`ibv_create_srq`; on mlx5's direct path its ring from `mlx5dv_init_obj`).
pub(crate) fn create_srq(
    p: &Pd,
    entries: u32,
    max_sge: u32,
) -> Result<(Arc<verbs::srq::Srq>, SrqRings, u32)> {
    let s = Arc::new(verbs::srq::Srq::new(p.pd.clone(), entries, max_sge)?);
    // Its number in its context, where its events read it (`IBV_EVENT_SRQ_ERR` and
    // `_LIMIT_REACHED` name the `ibv_srq` only).
    let name = |n: u32| {
        // SAFETY: a live SRQ, just made: nothing reads its context concurrently.
        unsafe { (*s.srq).srq_context = n as usize as *mut _ };
        n
    };
    if p.dev.path != DataPath::Direct {
        let n = name(verbs_srq_number());
        return Ok((s.clone(), SrqRings::Verbs(s), n));
    }
    if crate::mlx5_env::Mlx5Env::current().srq_signature {
        // rdma-core creates the SRQ with MLX5_SRQ_FLAG_SIGNATURE: the device would check
        // signatures the direct path does not write.
        return Err(Error::Unsupported(
            "MLX5_SRQ_SIGNATURE is set: SRQ WQE signatures on the direct path",
        ));
    }
    // SAFETY: a live SRQ of an mlx5 device (the path is Direct only there).
    let dv = unsafe { crate::dv::init_srq(s.srq.cast())? };
    // The device's SRQ: rdma-core's ring with its wait queue (0, no ring past the list,
    // if the query fails).
    let device_wqes = s.device_max_wr().map_or(0, |m| m.wrapping_add(1));
    let raw = crate::dv::raw_srq(&dv, s.max_sge, device_wqes)?;
    let srqn = name(raw.srqn);
    Ok((s, SrqRings::Direct(raw), srqn))
}
