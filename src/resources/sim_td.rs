//! The software NIC's QPs and DCIs on thread domains of their own, as UCX gives each worker
//! one (the BlueFlame register is then the QP's alone): created on one when the device has
//! one left, the domain freed with the QP.

use mlx5::sim::{Nic, SimError};

/// Creates a QP with `create`, on a thread domain of its own when the device has one left
/// (`create` gets None otherwise: rdma-core's shared registers, rung under their lock).
/// Returns the QP with its domain; when `create` fails, the domain is freed again.
pub(crate) fn create_on_own_td<T>(
    nic: &Nic,
    create: impl FnOnce(Option<u32>) -> Result<T, SimError>,
) -> Result<(T, Option<u32>), SimError> {
    let td = nic.alloc_td().ok();
    match create(td) {
        Ok(qp) => Ok((qp, td)),
        Err(e) => {
            if let Some(td) = td {
                let _ = nic.dealloc_td(td);
            }
            Err(e)
        }
    }
}

/// Destroys QP `qpn`, then frees its thread domain `td` (a drop, or the undo of a creation:
/// nothing to report).
pub(crate) fn destroy_with_td(nic: &Nic, qpn: u32, td: Option<u32>) {
    let _ = nic.destroy_qp(qpn);
    if let Some(td) = td {
        let _ = nic.dealloc_td(td);
    }
}
