//! The verbs backend: every rdma-core call of the crate (through `rdma-sys`) lives in this
//! module, so the OS/FFI surface is in one place.
//!
//! - [`device`]: device list, open by name, port and GID query (RoCE v2 GID selection).
//! - [`channel`]: completion channels (`ibv_get_cq_event`, `ibv_ack_cq_events`).
//! - [`objects`]: the rdma-core objects, one file each: protection domain, memory region,
//!   CQ, thread domain, QP (RC and UD) and its state machine, SRQ, address handle.
//! - the verbs data path, with the same semantics as the direct path (cookies, moderation of
//!   unsignaled runs, statuses): [`sq`], the send queue (`ibv_post_send` or `ibv_wr_*`);
//!   [`rq`], the receive queue (`ibv_post_recv`); [`cq`], the poller (`ibv_poll_cq` or
//!   `ibv_start_poll`).
//! - `calls`: `ibv_post_recv` and `ibv_poll_cq` with the provider's operation read once.
//! - [`srq`]: the poster of shared receive queues (`ibv_post_srq_recv`).
//! - [`ex`]: rdma-core's extended work-request and polling APIs, chosen per QP and CQ at
//!   creation ([`ex::VerbsApi`], `BLUEFLAME_VERBS_API`).
//! - [`ud`]: UD sends.

pub(crate) mod calls;
pub mod channel;
pub mod cm;
pub mod cq;
pub mod device;
pub mod ex;
pub(crate) mod fd;
pub mod objects;
pub mod probe;
pub mod rq;
pub mod sq;
pub mod srq;
pub mod ud;

use std::io;

/// An rdma-core call failed: which call, and the OS error it returned.
#[derive(Debug)]
pub struct VerbsError {
    /// The verbs function.
    pub call: &'static str,
    /// The error (`errno`).
    pub source: io::Error,
}

impl std::fmt::Display for VerbsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} failed: {}", self.call, self.source)
    }
}

impl std::error::Error for VerbsError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// An error from the last OS error (`errno`) of `call`.
pub(crate) fn last(call: &'static str) -> VerbsError {
    VerbsError {
        call,
        source: io::Error::last_os_error(),
    }
}

/// An error from a returned error number (`ibv_modify_qp`, `ibv_post_send` return errno).
pub(crate) fn code(call: &'static str, rc: i32) -> VerbsError {
    VerbsError {
        call,
        source: io::Error::from_raw_os_error(rc),
    }
}
