//! What crosses the backend seam besides the dispatch enums: what a new CQ is
//! ([`CqSpec`]), and what a backend hands back to post and poll with ([`CqRings`],
//! [`QpRings`], [`SrqRings`]), a registration's keys ([`MrInfo`]), a UD port's address
//! ([`UdPort`]) and where CQ events go ([`EventSink`], [`ChannelSource`]). It imports no
//! backend: each backend and each dispatch file imports it.

use crate::verbs;
use mlx5::MiniCqeFormat;
use std::sync::Arc;

/// Where the events of a CQ of the software NIC go as it raises them: a completion channel
/// (rdma-core's are read from the channel's descriptor instead).
pub(crate) trait EventSink: Send + Sync {
    /// The CQ `id` (its `token` on the channel) raised an event.
    // Only the software NIC calls it.
    #[cfg_attr(not(feature = "sim"), allow(dead_code))]
    fn cq_event(&self, id: u32, token: u64);
}

/// A completion channel's source of events in a backend: rdma-core's channel (read from its
/// descriptor), or none (the software NIC pushes them to an [`EventSink`]).
pub(crate) type ChannelSource = Option<Arc<verbs::channel::CompChannel>>;

/// What a new CQ is.
pub(crate) struct CqSpec<'a> {
    pub(crate) entries: u32,
    pub(crate) cqe_size: u32,
    pub(crate) zip: Option<MiniCqeFormat>,
    /// Completion timestamps asked for (never with `zip`: the façade refuses the pair).
    pub(crate) timestamps: bool,
    /// The channel's rdma-core source, when the CQ's events go to a channel.
    pub(crate) channel: Option<&'a ChannelSource>,
}

/// How a CQ is polled.
pub(crate) enum CqRings {
    /// The direct path, over the CQ's ring: `promised` entries the device guarantees (shared
    /// out among the queues), compressed sessions when `compressed`, CQEs stamped in
    /// `stamps` when timestamps were asked for.
    Direct {
        raw: mlx5::RawCq,
        promised: u32,
        compressed: bool,
        stamps: Option<Stamps>,
    },
    /// The verbs path, over rdma-core's CQ (its wall-clock reader set when timestamps
    /// were asked for: then `stamps`).
    Verbs {
        cq: Arc<verbs::objects::Cq>,
        stamps: Option<Stamps>,
    },
}

/// What a timed poll's stamps are before they are nanoseconds: the backend that made the
/// CQ says (only it knows what its device writes and what its provider converts).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Stamps {
    /// The CQEs' own, in this format (the direct path; rdma-core's real-time stamps,
    /// which it hands over as the CQE has them).
    Cqe(mlx5::clock::TimestampFormat),
    /// Nanoseconds already (`ibv_wc_read_completion_wallclock_ns` of a free-running clock).
    Ns,
}

/// What a registration reports: (address, length, lkey, rkey).
pub(crate) type MrInfo = (u64, u64, u32, u32);

/// How an SRQ is posted to.
pub(crate) enum SrqRings {
    /// The direct path, over the SRQ's ring (`mlx5dv_init_obj`, or the software NIC's).
    Direct(mlx5::RawSrq),
    /// The verbs path, over rdma-core's SRQ.
    Verbs(Arc<verbs::srq::Srq>),
}

/// How a QP's queues are posted to.
pub(crate) enum QpRings {
    /// The direct path, over the QP's rings; `dedicated` when its BlueFlame register is its
    /// own (a thread domain of its own), else shared and rung under its lock.
    Direct { raw: mlx5::RawQp, dedicated: bool },
    /// The verbs path, over rdma-core's QP; `rxe` for rxe's extended API (its
    /// `wr_set_sge_list` miscounts gather lists before rdma-core 64, and its
    /// `wr_complete` posts before it rings: `VerbsSendQueue::set_rxe`); `provider_copies` when the
    /// provider copies small received messages into the receive buffers with the CPU
    /// (mlx5's responder scatter-to-CQE, on for the QP).
    Verbs {
        qp: Arc<verbs::objects::Qp>,
        rxe: bool,
        provider_copies: bool,
    },
    /// No queue to post to (a DC target).
    None,
}

/// What a new UD QP's port says of it.
pub(crate) struct UdPort {
    /// The largest datagram (the port's active MTU).
    pub(crate) mtu: u32,
    pub(crate) lid: u16,
    /// The source GID (zero on InfiniBand without a GID index).
    pub(crate) gid: [u8; 16],
    pub(crate) ethernet: bool,
}
