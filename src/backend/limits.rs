//! What a ConnectX takes when a QP is created, checked once for every backend that is one
//! or plays one (an mlx5 device through rdma-core on either data path, and the software
//! NIC): rdma-core's sizing of the QP's queues (`mlx5::qp_size`: `mlx5_calc_send_wqe`,
//! `mlx5_calc_sq_size`, `mlx5_calc_rq_size`) against a ConnectX's limits. A QP rdma-core
//! would refuse with a bare `EINVAL` is refused before anything is created, with the field
//! of [`QpCaps`](crate::QpCaps) and its value, and the software NIC refuses exactly what a ConnectX does.
//!
//! It also says how many send work requests to ask rdma-core for: on the direct path as
//! many as fill a ring of `sq_blocks` blocks with rdma-core's WQE size, so that the ring the
//! crate takes over is the one the caps name, as on the software NIC (asked for the caps'
//! depth, rdma-core sizes each request for its own longest WQE, a window bind's UMR, and
//! made the ring up to twice as large); on the verbs path the caps' depth
//! ([`QpCaps::verbs`](crate::QpCaps::verbs)), which rdma-core's requests hold.

use crate::caps::QpCaps;
use crate::error::{Error, Result};
use mlx5::qp_size::{self, DeviceLimits, Field, QpAsk, Transport};

/// Refuses a QP of `caps` as rdma-core would on a ConnectX, and says how many send work
/// requests to ask rdma-core for on the path given (`direct`); none for a QP without a send
/// queue (`shape` None: a DC target). `shape`: the QP's transport, and whether it has a
/// receive queue of its own ([`QpKind::shape`](super::QpKind::shape)). `signature`:
/// rdma-core adds WQE signatures (`MLX5_QP_SIGNATURE`, which only it reads).
///
/// # Errors
/// [`Error::InvalidParameter`] naming the field of [`QpCaps`](crate::QpCaps) and its value: an `sq_blocks`
/// outside 16 ..= 32768 (the software NIC's own refusal, on every path), `max_send_sge` or
/// `max_inline` past what a WQE of the transport holds beside its segments, `max_recv_sge`
/// past a receive WQE, `rq_entries` past the device's receive queue, and on the verbs path
/// an `sq_blocks` whose requests rdma-core's ring cannot hold.
pub(crate) fn connectx(
    caps: &QpCaps,
    shape: Option<(Transport, bool)>,
    direct: bool,
    signature: bool,
) -> Result<Option<u32>> {
    let Some((t, recv)) = shape else {
        return Ok(None);
    };
    let lim = DeviceLimits::CONNECTX;
    if !(16..=lim.max_send_wqebb).contains(&caps.sq_blocks) {
        return Err(Error::InvalidParameter {
            what: "sq_blocks (16 ..= 32768)",
            value: caps.sq_blocks as u64,
        });
    }
    let mut ask = QpAsk {
        max_send_wr: 1,
        max_send_sge: caps.max_send_sge,
        max_inline: caps.max_inline,
        max_recv_wr: if recv { caps.rq_entries.max(1) } else { 0 },
        max_recv_sge: if recv { caps.max_recv_sge } else { 0 },
        wq_sig: signature && recv,
    };
    let refused = |r: qp_size::Refusal| Error::InvalidParameter {
        what: r.what,
        value: match r.field {
            Field::SendWr => caps.sq_blocks as u64,
            _ => r.value,
        },
    };
    let wqe_size = qp_size::send_wqe_size(t, &ask, &lim).map_err(refused)?;
    ask.max_send_wr = if direct {
        // A power of two of 16 ..= 32768 blocks (checked above): one WQE of at most 1024
        // bytes fits.
        let ring = caps.sq_blocks.next_power_of_two();
        qp_size::send_wr_for_ring(ring, wqe_size)
    } else {
        caps.depth(t)
    };
    qp_size::qp_size(t, &ask, &lim).map_err(refused)?;
    Ok(Some(ask.max_send_wr))
}
