//! Shared receive queues of each backend: the device's SRQ and what it is posted with (its
//! raw ring on the direct path, rdma-core's SRQ on the verbs path).

#[cfg(feature = "sim")]
use super::sim;
use super::spec::SrqRings;
use super::{rdma, Pd};
use crate::async_event::Subject;
use crate::error::Result;
use crate::verbs;
use std::sync::Arc;

/// An SRQ of a backend (destroyed on drop: after every QP on it, which hold its handle).
pub(crate) enum Srq {
    #[cfg(feature = "sim")]
    Sim(sim::Srq),
    Rdma(Arc<verbs::srq::Srq>),
}

impl Pd {
    /// An SRQ of at least `entries` receives of `max_sge` entries; with its number (the
    /// device's on the direct path, one of the crate's own with bit 31 set on the verbs
    /// path of a device that does not report it).
    ///
    /// # Errors
    /// The device's refusal; [`crate::Error::Unsupported`] for `MLX5_SRQ_SIGNATURE` on the
    /// direct path.
    pub(crate) fn create_srq(&self, entries: u32, max_sge: u32) -> Result<(Srq, SrqRings, u32)> {
        match self {
            #[cfg(feature = "sim")]
            Pd::Sim(p) => p
                .create_srq(entries, max_sge)
                .map(|(s, r, n)| (Srq::Sim(s), r, n)),
            Pd::Rdma(p) => {
                rdma::create_srq(p, entries, max_sge).map(|(s, r, n)| (Srq::Rdma(s), r, n))
            }
        }
    }
}

impl Srq {
    /// What the device's events call this SRQ.
    pub(crate) fn subject(&self) -> Subject {
        match self {
            #[cfg(feature = "sim")]
            Srq::Sim(s) => Subject::Srq(s.srqn as u64),
            Srq::Rdma(s) => Subject::Srq(s.srq as usize as u64),
        }
    }

    /// Arms the SRQ's limit event (0 disarms).
    ///
    /// # Errors
    /// The device's refusal.
    pub(crate) fn set_limit(&self, limit: u32) -> Result<()> {
        match self {
            #[cfg(feature = "sim")]
            Srq::Sim(s) => s.set_limit(limit),
            Srq::Rdma(s) => Ok(s.set_limit(limit)?),
        }
    }
}

impl Srq {
    /// The software NIC's number of the SRQ, for a receiver created on it.
    #[cfg(feature = "sim")]
    pub(crate) fn sim(&self) -> Result<u32> {
        match self {
            Srq::Sim(s) => Ok(s.srqn),
            Srq::Rdma(_) => Err(super::other_device("SRQ of another device (SRQ number)")),
        }
    }

    /// rdma-core's SRQ, for a receiver created on it.
    pub(crate) fn rdma(&self) -> Result<&Arc<verbs::srq::Srq>> {
        match self {
            Srq::Rdma(s) => Ok(s),
            #[cfg(feature = "sim")]
            Srq::Sim(_) => Err(super::other_device("SRQ of another device (SRQ number)")),
        }
    }
}
