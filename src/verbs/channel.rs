//! Completion channels over rdma-core: `ibv_create_comp_channel`, `ibv_get_cq_event` on a
//! non-blocking descriptor, `ibv_ack_cq_events` (a CQ is armed by its own
//! [`Cq::req_notify`](super::objects::Cq::req_notify)).

use super::device::Context;
use super::{last, VerbsError};
use rdma_sys as ffi;
use std::os::fd::RawFd;
use std::sync::Arc;

/// An `ibv_comp_channel`, its descriptor made non-blocking.
pub struct CompChannel {
    pub(crate) ch: *mut ffi::ibv_comp_channel,
    _ctx: Arc<Context>,
}

// SAFETY: rdma-core's channel calls only read the channel's descriptor (thread-safe); the
// wrapper holds the pointer and frees it once, on drop.
unsafe impl Send for CompChannel {}
// SAFETY: as above.
unsafe impl Sync for CompChannel {}

impl CompChannel {
    /// A channel of `ctx`.
    ///
    /// # Errors
    /// The `ibv_create_comp_channel` error, or `fcntl`'s.
    pub fn new(ctx: Arc<Context>) -> Result<CompChannel, VerbsError> {
        // SAFETY: live context.
        let ch = unsafe { ffi::ibv_create_comp_channel(ctx.ctx) };
        if ch.is_null() {
            return Err(last("ibv_create_comp_channel"));
        }
        let me = CompChannel { ch, _ctx: ctx };
        let fd = me.fd();
        // SAFETY: `fd` is the channel's open descriptor; only its blocking mode changes.
        let fl = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        // SAFETY: as above.
        if fl < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK) } < 0 {
            return Err(last("fcntl(O_NONBLOCK) on the completion channel"));
        }
        Ok(me)
    }

    /// The channel's descriptor (readable when an event waits).
    pub fn fd(&self) -> RawFd {
        // SAFETY: live channel.
        unsafe { (*self.ch).fd }
    }

    /// The next event without blocking: the `ibv_cq` and its `cq_context`, or None when
    /// none waits (EAGAIN). rdma-core's provider hook runs (`mlx5_cq_event` advances its own
    /// arm sequence). Each event must be acknowledged ([`CompChannel::ack`]) before its CQ is
    /// destroyed.
    ///
    /// # Errors
    /// The descriptor failed: once its device is disassociated (removed, reset) the kernel's
    /// event file says EPOLLERR to every poll and fails every read with EIO
    /// (`ib_uverbs_event_poll`, `ib_uverbs_event_read`), for good.
    pub fn next_event(&self) -> std::io::Result<Option<(*mut ffi::ibv_cq, usize)>> {
        loop {
            let mut cq = std::ptr::null_mut();
            let mut ctx = std::ptr::null_mut();
            // SAFETY: live channel; the out-parameters are written by the call; the
            // descriptor is non-blocking, so EAGAIN comes back instead of a wait.
            let rc = unsafe { ffi::ibv_get_cq_event(self.ch, &mut cq, &mut ctx) };
            if rc == 0 {
                return Ok((!cq.is_null()).then_some((cq, ctx as usize)));
            }
            let e = std::io::Error::last_os_error();
            match e.kind() {
                std::io::ErrorKind::WouldBlock => return Ok(None),
                std::io::ErrorKind::Interrupted => continue,
                _ => return Err(e),
            }
        }
    }

    /// Acknowledges `n` events of `cq` (`ibv_ack_cq_events`).
    ///
    /// # Safety
    /// `cq` must be an `ibv_cq` returned by [`CompChannel::next_event`] whose `n` events are
    /// not acknowledged yet; it is alive until they are (its `ibv_destroy_cq` waits for them).
    pub unsafe fn ack(cq: *mut ffi::ibv_cq, n: u32) {
        if n > 0 {
            // SAFETY: caller contract.
            unsafe { ffi::ibv_ack_cq_events(cq, n) };
        }
    }
}

impl CompChannel {
    /// A channel over `ch` with no device behind it (tests: a descriptor made to fail as a
    /// disassociated device's does). Never dropped by the caller (`ibv_destroy_comp_channel`
    /// would take the absent context's lock): keep an `Arc` of it forever.
    ///
    /// # Safety
    /// `ch` lives for the rest of the process.
    #[cfg(all(test, feature = "sim"))]
    pub(crate) unsafe fn without_device(ch: *mut ffi::ibv_comp_channel) -> CompChannel {
        CompChannel {
            ch,
            _ctx: Arc::new(Context::none()),
        }
    }
}

impl Drop for CompChannel {
    fn drop(&mut self) {
        // SAFETY: created in `new`; the CQs on it hold an Arc, so none is left.
        unsafe { ffi::ibv_destroy_comp_channel(self.ch) };
    }
}
