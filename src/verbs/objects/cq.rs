//! Completion queues over rdma-core: created plain (`ibv_create_cq`), extended
//! (`ibv_create_cq_ex`, polled with `ibv_start_poll`) or compressed (mlx5dv), their events on
//! a completion channel and armed with `ibv_req_notify_cq`.

use crate::verbs::channel::CompChannel;
use crate::verbs::device::Context;
use crate::verbs::ex::{create_cq_ex, wc_flags, ApiChoice, PollOps, VerbsApi};
use crate::verbs::{code, last, VerbsError};
use rdma_sys as ffi;
use std::sync::Arc;

/// A completion queue.
pub struct Cq {
    /// The CQ (for an extended CQ, `ibv_cq_ex_to_cq` of it: the same address).
    pub(crate) cq: *mut ffi::ibv_cq,
    /// The extended polling operations, when the CQ was created with `ibv_create_cq_ex`.
    pub(crate) poll_ops: Option<PollOps>,
    _ctx: Arc<Context>,
    /// The completion channel its events go to (destroyed after the CQ).
    _channel: Option<Arc<CompChannel>>,
}

// SAFETY: as for Pd; polling is serialised by the owner (`&mut`).
unsafe impl Send for Cq {}
// SAFETY: as for Pd.
unsafe impl Sync for Cq {}

impl Cq {
    /// A CQ of at least `entries` entries; with `ibv_create_cq_ex` (polled with
    /// `ibv_start_poll`) when `api` wants it and the provider has it.
    ///
    /// # Errors
    /// The `ibv_create_cq` error; [`crate::Error::Unsupported`] when `api` requires the
    /// extended CQ and the provider refuses it.
    /// (Only `internals`' plain calls make CQs this way; the backends take `with_channel`.)
    #[cfg(feature = "internals")]
    pub fn new(ctx: Arc<Context>, entries: u32, api: ApiChoice) -> crate::error::Result<Cq> {
        Cq::with_channel(ctx, entries, None, 0, api, 0)
    }

    /// A CQ of at least `entries` entries whose events go to `channel` with `context` as
    /// their `cq_context`; with `ibv_create_cq_ex` (polled with `ibv_start_poll`) when `api`
    /// wants it and the provider has it. `wc_extra`: `ibv_create_cq_wc_flags` asked for
    /// besides the poller's (the completion timestamps); with any, only `ibv_create_cq_ex`
    /// will do.
    ///
    /// # Errors
    /// The `ibv_create_cq` error; [`crate::Error::Unsupported`] when `api` requires the
    /// extended CQ and the provider refuses it; [`crate::Error::Verbs`] from
    /// `ibv_create_cq_ex` when `wc_extra` is refused.
    pub fn with_channel(
        ctx: Arc<Context>,
        entries: u32,
        channel: Option<Arc<CompChannel>>,
        context: usize,
        api: ApiChoice,
        wc_extra: u64,
    ) -> crate::error::Result<Cq> {
        let ch = channel.as_ref().map_or(std::ptr::null_mut(), |c| c.ch);
        if api.wants_extended() || wc_extra != 0 {
            // SAFETY: a zeroed attribute is valid (vector 0, no optional field).
            let mut attr: ffi::ibv_cq_init_attr_ex = unsafe { std::mem::zeroed() };
            attr.cqe = entries;
            attr.cq_context = context as *mut _;
            attr.channel = ch;
            attr.wc_flags = wc_flags() | wc_extra;
            // SAFETY: live context; `ch` is null or a live channel of it (kept alive by the
            // CQ); `attr` is valid for the call.
            let cqx = unsafe { create_cq_ex(ctx.ctx, &mut attr) };
            if cqx.is_null() && wc_extra != 0 {
                return Err(crate::error::Error::Verbs(last("ibv_create_cq_ex")));
            }
            if !cqx.is_null() {
                // SAFETY: created just above; the ops are used while the Cq lives.
                match unsafe { PollOps::of(cqx) } {
                    Some(ops) => {
                        return Ok(Cq {
                            // `ibv_cq_ex_to_cq`: the extended CQ begins with the ibv_cq.
                            cq: cqx.cast(),
                            poll_ops: Some(ops),
                            _ctx: ctx,
                            _channel: channel,
                        });
                    }
                    // SAFETY: created above, used by nothing.
                    None => unsafe {
                        ffi::ibv_destroy_cq(cqx.cast());
                    },
                }
            }
            if wc_extra != 0 {
                return Err(crate::error::Error::Timestamps {
                    why: "the provider's extended CQ lacks a polling operation",
                });
            }
            api.unavailable("BLUEFLAME_VERBS_API=extended: the provider has no ibv_create_cq_ex")?;
        }
        // SAFETY: live context; `ch` is null or a live channel of it (kept alive by the CQ);
        // vector 0.
        let cq = unsafe { ffi::ibv_create_cq(ctx.ctx, entries as i32, context as *mut _, ch, 0) };
        if cq.is_null() {
            return Err(crate::error::Error::Verbs(last("ibv_create_cq")));
        }
        Ok(Cq {
            cq,
            poll_ops: None,
            _ctx: ctx,
            _channel: channel,
        })
    }

    /// The API the verbs data path polls this CQ with.
    pub fn api(&self) -> VerbsApi {
        if self.poll_ops.is_some() {
            VerbsApi::Extended
        } else {
            VerbsApi::Legacy
        }
    }

    /// Takes over a CQ created on `ctx` by another call (mlx5dv's `mlx5dv_create_cq` for a
    /// compressing CQ), its events on `channel`: destroyed with `ibv_destroy_cq` on drop.
    ///
    /// # Safety
    /// `cq` is a live CQ of `ctx`, created with `channel` (or none), that nothing else
    /// destroys.
    pub(crate) unsafe fn adopt(
        ctx: Arc<Context>,
        cq: *mut ffi::ibv_cq,
        channel: Option<Arc<CompChannel>>,
    ) -> Cq {
        Cq {
            cq,
            poll_ops: None,
            _ctx: ctx,
            _channel: channel,
        }
    }

    /// Entries the CQ really has.
    pub fn capacity(&self) -> u32 {
        // SAFETY: live CQ.
        unsafe { (*self.cq).cqe as u32 }
    }
}

impl Drop for Cq {
    fn drop(&mut self) {
        // SAFETY: created in `new`; QPs on it hold an Arc, so none is left.
        unsafe { ffi::ibv_destroy_cq(self.cq) };
    }
}

impl Cq {
    /// Asks for an event on the next completion (`ibv_req_notify_cq`; `solicited`: the next
    /// solicited or error completion).
    ///
    /// # Errors
    /// The provider's error.
    pub fn req_notify(&self, solicited: bool) -> Result<(), VerbsError> {
        // SAFETY: live CQ.
        let rc = unsafe { ffi::ibv_req_notify_cq(self.cq, solicited as i32) };
        if rc != 0 {
            return Err(code("ibv_req_notify_cq", rc));
        }
        Ok(())
    }
}
