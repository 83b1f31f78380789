//! rdma-core's extended data-path APIs: work requests built with `ibv_wr_start` /
//! `ibv_wr_*` / `ibv_wr_complete` on an `ibv_qp_ex`, completions read with
//! `ibv_start_poll` / `ibv_next_poll` / `ibv_end_poll` and the `ibv_wc_read_*` accessors on an
//! `ibv_cq_ex`.
//!
//! Those calls are `static inline` in `infiniband/verbs.h`: each one calls a function pointer
//! of the `ibv_qp_ex` / `ibv_cq_ex` (`qp->wr_rdma_write(qp, rkey, remote_addr)`,
//! `cq->start_poll(cq, attr)`). The pointers are read once here, when the QP or CQ is created,
//! and a provider that leaves one of them unset (or refuses the creation attributes) keeps the
//! classic `ibv_post_send` / `ibv_poll_cq`.
//!
//! `BLUEFLAME_VERBS_API` chooses: `auto` (the default: extended where the provider has it),
//! `extended` (refused with [`Error::Unsupported`](crate::Error::Unsupported) where it has
//! not) or `legacy`.
//!
//! - `api`: [`VerbsApi`] and [`ApiChoice`], the choice `BLUEFLAME_VERBS_API` makes.
//! - `ctx`: the calls verbs.h makes through the context's extended operations (creation of
//!   extended QPs and CQs, thread and parent domains, device query, `ibv_advise_mr`).
//! - `send`: the `ibv_wr_*` operations of a QP, RC and UD.
//! - `poll`: the `ibv_start_poll` / `ibv_wc_read_*` operations of a CQ.

mod api;
mod ctx;
mod poll;
mod send;

pub use api::{ApiChoice, VerbsApi};
pub(crate) use ctx::{
    advise_mr, alloc_parent_domain, alloc_td, create_cq_ex, create_qp_ex, dealloc_td,
    query_device_ex, query_raw_clock,
};
pub(crate) use poll::{wc_flags, LateWc, PollOps, WcRead, EMPTY};
pub(crate) use send::{send_ops_flags, ud_send_ops_flags, SendOps, UdSendOps};
