//! Which data path a device's queues run: the direct path (WQEs written into the rings,
//! BlueFlame doorbells, CQEs polled from the ring) or the verbs path (rdma-core's calls).

/// Which data path a QP runs.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum DataPath {
    /// WQEs into the ring, BlueFlame doorbell, CQEs polled from the ring (mlx5, software NIC).
    Direct,
    /// `ibv_post_send` / `ibv_poll_cq` (any other device).
    Verbs,
}
