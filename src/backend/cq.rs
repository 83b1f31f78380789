//! Completion queues of each backend: the device's CQ, what it is polled with (its raw
//! ring on the direct path, rdma-core's CQ on the verbs path), and its completion events.

#[cfg(feature = "sim")]
use super::sim;
use super::spec::{ChannelSource, CqRings, CqSpec, EventSink};
use super::{rdma, Dev};
use crate::async_event::Subject;
use crate::error::Result;
use crate::verbs;
use std::sync::{Arc, Weak};

/// A CQ of a backend (destroyed on drop, once nothing holds it).
pub(crate) enum Cq {
    #[cfg(feature = "sim")]
    Sim(sim::Cq),
    Rdma(Arc<verbs::objects::Cq>),
}

impl Dev {
    /// The most entries a CQ may ask for.
    pub(crate) fn max_cqe(&self) -> u32 {
        match self {
            #[cfg(feature = "sim")]
            Dev::Sim(_) => sim::MAX_CQE,
            // The device's answer to `ibv_query_device` (an int there).
            Dev::Rdma(d) => d.attrs.max_cqe,
        }
    }

    /// A completion channel's source of events.
    ///
    /// # Errors
    /// [`crate::Error::Verbs`] from `ibv_create_comp_channel`.
    pub(crate) fn create_channel(&self) -> Result<ChannelSource> {
        match self {
            #[cfg(feature = "sim")]
            Dev::Sim(_) => Ok(None),
            Dev::Rdma(r) => Ok(Some(Arc::new(verbs::channel::CompChannel::new(
                r.ctx.clone(),
            )?))),
        }
    }

    /// A CQ as `spec` says: the CQ, how it is polled, and its number (the device's on the
    /// direct path; on the verbs path, where rdma-core does not expose it, one of the
    /// crate's own, bit 31 set).
    ///
    /// # Errors
    /// As [`Device::create_cq_with`](crate::Device::create_cq_with).
    pub(crate) fn create_cq(&self, spec: &CqSpec<'_>) -> Result<(Cq, CqRings, u32)> {
        match self {
            #[cfg(feature = "sim")]
            Dev::Sim(n) => sim::create_cq(n, spec).map(|(c, r, n)| (Cq::Sim(c), r, n)),
            Dev::Rdma(r) => rdma::create_cq(r, spec).map(|(c, r, n)| (Cq::Rdma(c), r, n)),
        }
    }
}

impl Cq {
    /// What the device's events call this CQ.
    pub(crate) fn subject(&self) -> Subject {
        match self {
            #[cfg(feature = "sim")]
            Cq::Sim(c) => Subject::Cq(c.cqn),
            Cq::Rdma(c) => Subject::VerbsCq(c.cq as usize),
        }
    }

    /// What the completion channel keeps of this CQ to acknowledge its events: rdma-core's
    /// `ibv_cq` (0: nothing to acknowledge).
    pub(crate) fn event_handle(&self) -> usize {
        match self {
            #[cfg(feature = "sim")]
            Cq::Sim(_) => 0,
            Cq::Rdma(c) => c.cq as usize,
        }
    }

    /// Sends the CQ's events to `sink` as CQ `id` with `token` (the software NIC pushes
    /// them; rdma-core's go to the channel the CQ was created on, named by `id`).
    pub(crate) fn link(&self, id: u32, token: u64, sink: Weak<dyn EventSink>) {
        match self {
            #[cfg(feature = "sim")]
            Cq::Sim(c) => c.link(id, token, sink),
            Cq::Rdma(_) => {
                // Events name the CQ by its context, which holds its number `id` from its
                // creation on (`rdma::create_cq`, on both paths).
                let _ = (id, token, sink);
            }
        }
    }

    /// Stops the CQ's events (before it leaves its channel).
    pub(crate) fn unlink(&self) {
        match self {
            #[cfg(feature = "sim")]
            Cq::Sim(c) => c.unlink(),
            Cq::Rdma(_) => {}
        }
    }

    /// Arms rdma-core's CQ for one event (`ibv_req_notify_cq`): the verbs path's arm (the
    /// direct path rings the CQ's doorbell itself).
    ///
    /// # Errors
    /// The `ibv_req_notify_cq` error.
    pub(crate) fn req_notify(&self, solicited: bool) -> Result<()> {
        match self {
            #[cfg(feature = "sim")]
            Cq::Sim(_) => Err(super::other_device("a verbs poller over the software NIC")),
            Cq::Rdma(c) => Ok(c.req_notify(solicited)?),
        }
    }

    /// rdma-core's CQ, for a QP created on it.
    pub(crate) fn rdma(&self) -> Result<Arc<verbs::objects::Cq>> {
        match self {
            #[cfg(feature = "sim")]
            Cq::Sim(_) => Err(super::other_device("CQ of another device (CQ number)")),
            Cq::Rdma(c) => Ok(c.clone()),
        }
    }

    /// The software NIC's number of the CQ, for a QP created on it.
    #[cfg(feature = "sim")]
    pub(crate) fn sim(&self) -> Result<u32> {
        match self {
            Cq::Sim(c) => Ok(c.cqn),
            Cq::Rdma(_) => Err(super::other_device("CQ of another device (CQ number)")),
        }
    }
}
