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
pub(crate) mod incarnation;
pub mod objects;
#[cfg(feature = "internals")]
pub mod probe;
pub mod rq;
pub mod sq;
pub mod srq;
pub mod ud;

pub use crate::error::VerbsError;
use std::io;

/// An error from the last OS error (`errno`) of `call`.
pub(crate) fn last(call: &'static str) -> VerbsError {
    VerbsError {
        call,
        source: io::Error::last_os_error(),
    }
}

/// An error from a returned error number (`ibv_modify_qp`, `ibv_post_send` return errno;
/// rdma-core's siw returns it negated from `ibv_post_send` / `ibv_post_recv` /
/// `ibv_post_srq_recv`: `-EINVAL`, `-ENOMEM`).
pub(crate) fn code(call: &'static str, rc: i32) -> VerbsError {
    VerbsError {
        call,
        source: io::Error::from_raw_os_error(rc.wrapping_abs()),
    }
}
