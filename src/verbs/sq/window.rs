//! Memory-window requests on the verbs send queue: type-2 binds queued (`IBV_WR_BIND_MW`),
//! type-1 binds through `ibv_bind_mw`, and the local invalidate that unbinds a type-2 window;
//! the window's current key set in its `ibv_mw` first (rdma-core reads it from there; rxe
//! checks it against the kernel's).

use super::{zeroed_wr, VerbsSendQueue, MAX_BATCH};
use crate::completion::WcOpcode;
use crate::error::{Error, QueueUnit, Result};
use crate::queue::flags::PostFlags;
use crate::queue::shadow::SendEntry;
use crate::verbs::code;
use mlx5::request::Request;
use mlx5::request::{Access, MwType};
use rdma_sys as ffi;

/// One bind (or, with no region and length 0, a type-1 unbind) of a window.
pub(crate) struct WindowBind {
    /// rdma-core's window.
    pub(crate) mw: *mut ffi::ibv_mw,
    pub(crate) mw_type: MwType,
    /// The key the window has now.
    pub(crate) rkey: u32,
    /// The key a type-2 bind gives it (a type-1 bind takes rdma-core's).
    pub(crate) new_rkey: u32,
    /// rdma-core's region, None for an unbind.
    pub(crate) mr: Option<*mut ffi::ibv_mr>,
    pub(crate) addr: u64,
    pub(crate) len: u64,
    pub(crate) access: Access,
}

impl VerbsSendQueue {
    /// Posts the local invalidate that unbinds a type-2 window through this QP: the
    /// crate's entry for [`Qp::unbind_mw`](crate::Qp::unbind_mw), which checked the
    /// window's state and tracks its key.
    ///
    /// # Errors
    /// As [`VerbsSendQueue::push`] and [`VerbsSendQueue::ring`].
    pub(crate) fn post_invalidate(
        &mut self,
        rkey: u32,
        cookie: u64,
        flags: PostFlags,
    ) -> Result<()> {
        self.push_any(&Request::LocalInvalidate { rkey }, cookie, flags)?;
        self.ring()
    }

    /// Queues a type-2 memory-window bind (`IBV_WR_BIND_MW`) of `mw` to `addr .. addr + len`
    /// of `mr` with new rkey `new_rkey` and `access` (`IBV_ACCESS_*` values).
    ///
    /// # Safety
    /// `mw` and `mr` must be live objects of this QP's protection domain until the request
    /// completes.
    ///
    /// # Errors
    /// [`Error::QueueFull`].
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn push_bind(
        &mut self,
        mw: *mut ffi::ibv_mw,
        mr: *mut ffi::ibv_mr,
        new_rkey: u32,
        addr: u64,
        len: u64,
        access: u32,
        cookie: u64,
        flags: PostFlags,
    ) -> Result<()> {
        if self.pending == MAX_BATCH {
            return Err(Error::QueueFull {
                needed: 1,
                free: 0,
                unit: QueueUnit::VerbsBatch,
            });
        }
        self.check_room()?;
        let mut wr = zeroed_wr();
        wr.bind_mw_tso_union.bind_mw = ffi::bind_mw_t {
            mw,
            rkey: new_rkey,
            bind_info: ffi::ibv_mw_bind_info {
                mr,
                addr,
                length: len,
                mw_access_flags: access,
            },
        };
        self.enqueue(
            wr,
            ffi::ibv_wr_opcode::IBV_WR_BIND_MW,
            (WcOpcode::BindMw, 0),
            0,
            0,
            cookie,
            flags,
        );
        Ok(())
    }

    /// Binds a type-1 window with `ibv_bind_mw` (which posts its own work request); returns
    /// the window's new rkey. Anything queued is posted first.
    ///
    /// # Safety
    /// As [`VerbsSendQueue::push_bind`].
    ///
    /// # Errors
    /// [`Error::QueueFull`]; the `ibv_bind_mw` error.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn bind_type1(
        &mut self,
        mw: *mut ffi::ibv_mw,
        mr: *mut ffi::ibv_mr,
        addr: u64,
        len: u64,
        access: u32,
        cookie: u64,
        flags: PostFlags,
    ) -> Result<u32> {
        self.ring()?;
        self.check_room()?;
        let signal = flags.signaled || self.unsignaled + 1 > self.cap / 2;
        let mut send_flags = 0;
        // Taken only once the bind is posted (a refused one changes nothing).
        let unsignaled = if signal {
            send_flags |= ffi::ibv_send_flags::IBV_SEND_SIGNALED.0;
            0
        } else {
            self.unsignaled + 1
        };
        // The fence asked for, or armed (after a bind or invalidate; always on iWARP), as
        // `enqueue` gives every other request (rdma-core's `mlx5_bind_mw` passes
        // `send_flags` on to `_mlx5_post_send`, which fences only on IBV_SEND_FENCE).
        if flags.fence != mlx5::ctrl::Fence::None || self.fence_next {
            send_flags |= ffi::ibv_send_flags::IBV_SEND_FENCE.0;
        }
        let mut bind = ffi::ibv_mw_bind {
            wr_id: self.wr_id(self.seq),
            send_flags,
            bind_info: ffi::ibv_mw_bind_info {
                mr,
                addr,
                length: len,
                mw_access_flags: access,
            },
        };
        let end = self.seq.wrapping_add(1);
        let entry = SendEntry {
            cookie,
            bbs: 1,
            opcode: WcOpcode::BindMw,
            byte_len: 0,
            report: flags.signaled,
        };
        self.shadow.set(self.seq, entry);
        if self.publishes_first {
            // SAFETY: as below.
            unsafe { self.post_bind_type1(mw, &bind)? };
        } else {
            // SAFETY: the caller guarantees live objects; `bind` lives across the call.
            let rc = unsafe { ffi::ibv_bind_mw(self.qp.qp, mw, &mut bind) };
            if rc != 0 {
                return Err(Error::Verbs(code("ibv_bind_mw", rc)));
            }
        }
        self.unsignaled = unsignaled;
        self.seq = end;
        self.shadow.mark_posted(end);
        self.fence_next = true;
        // SAFETY: `mw` is live; the provider stored the new rkey in it.
        Ok(unsafe { (*mw).rkey })
    }

    /// rxe's type-1 bind, made here as its `rxe_bind_mw` makes it (an `IBV_WR_BIND_MW`
    /// request with the key `ibv_inc_rkey` gives, stored in the window once posted), but
    /// posted with `ibv_post_send`, whose `bad_wr` says whether a failed doorbell came
    /// after the request was taken ([`first_unposted`](super::first_unposted)): then it is
    /// posted and completes, and this returns `Ok`. (`rxe_bind_mw` returns the doorbell's
    /// error as it returns a refusal's.) See [`VerbsSendQueue::set_rxe`].
    ///
    /// # Safety
    /// `mw` and `bind`'s region must be live objects of this QP's protection domain until
    /// the request completes.
    unsafe fn post_bind_type1(
        &mut self,
        mw: *mut ffi::ibv_mw,
        bind: &ffi::ibv_mw_bind,
    ) -> Result<()> {
        let mut wr = zeroed_wr();
        wr.wr_id = bind.wr_id;
        wr.send_flags = bind.send_flags;
        wr.opcode = ffi::ibv_wr_opcode::IBV_WR_BIND_MW;
        // SAFETY: `mw` is live (caller contract).
        let rkey = unsafe { (*mw).rkey };
        let new_rkey = mlx5::request::next_key_variant(rkey);
        wr.bind_mw_tso_union.bind_mw = ffi::bind_mw_t {
            mw,
            rkey: new_rkey,
            bind_info: bind.bind_info,
        };
        let mut bad = core::ptr::null_mut();
        // SAFETY: one request, alive across the call; its objects live (caller contract).
        let rc = unsafe { ffi::ibv_post_send(self.qp.qp, &mut wr, &mut bad) };
        if let Some((_, e)) = super::first_unposted(rc, bad, &wr, 1) {
            return Err(Error::Verbs(code("ibv_post_send (a type-1 bind)", e)));
        }
        // SAFETY: `mw` is live; as `rxe_bind_mw` stores it.
        unsafe { (*mw).rkey = new_rkey };
        Ok(())
    }

    /// Posts `b`; returns the window's key after it.
    ///
    /// # Safety
    /// `b.mw` and `b.mr` must be live objects of this QP's protection domain until the
    /// request completes.
    ///
    /// # Errors
    /// As [`VerbsSendQueue::push_bind`], [`VerbsSendQueue::bind_type1`] and
    /// [`VerbsSendQueue::ring`].
    pub(crate) unsafe fn bind_window(
        &mut self,
        b: &WindowBind,
        cookie: u64,
        flags: PostFlags,
    ) -> Result<u32> {
        // SAFETY: `mw` is live (caller contract); nothing else reads it during the call.
        unsafe { (*b.mw).rkey = b.rkey };
        let access = b.access.0;
        match (b.mw_type, b.mr) {
            (MwType::Two, Some(mr)) => {
                // SAFETY: the caller's contract.
                unsafe {
                    self.push_bind(b.mw, mr, b.new_rkey, b.addr, b.len, access, cookie, flags)?
                };
                self.ring()?;
                Ok(b.new_rkey)
            }
            // SAFETY: the caller's contract.
            (_, Some(mr)) => unsafe {
                self.bind_type1(b.mw, mr, b.addr, b.len, access, cookie, flags)
            },
            (_, None) => {
                // A zero-length bind needs no region, but providers read the region struct
                // all the same, and past `ibv_mr` into their own container of it: rxe's
                // `convert_send_wr` reads `mr->lkey` (the kernel ignores it for length 0);
                // libmlx5's `mlx5_bind_mw` reads `verbs_mr.mr_type` and then
                // `mlx5_mr.alloc_flags`, both behind the `ibv_mr`. A placeholder of the
                // window's domain, with room behind it for those fields (all zero:
                // `IBV_MR_TYPE_MR`, no flags), alive across the call.
                let mut none = PlaceholderMr::zeroed();
                // SAFETY: `mw` is live.
                (none.mr.context, none.mr.pd) = unsafe { ((*b.mw).context, (*b.mw).pd) };
                // SAFETY: `mw` is live; `none` outlives the call, which posts a zero-length
                // bind that refers to no memory; what a provider reads past `none.mr` lies
                // in `none.container`.
                unsafe { self.bind_type1(b.mw, &mut none.mr, 0, 0, 0, cookie, flags) }
            }
        }
    }
}

/// The stand-in region of a zero-length type-1 bind: an `ibv_mr` followed by zeroed room
/// for the fields a provider keeps behind it in its own container of the region
/// (libibverbs' `struct verbs_mr` adds `mr_type` and `access`; libmlx5's `struct mlx5_mr`
/// then `alloc_flags`: 12 bytes in all). Handed to the provider as `&mut self.mr`; its
/// reads of those fields stay inside this value and read zeros (`IBV_MR_TYPE_MR`, no
/// flags).
#[repr(C)]
struct PlaceholderMr {
    mr: ffi::ibv_mr,
    /// Zeros behind the `ibv_mr`: more than any provider's container adds.
    container: [u64; 8],
}

impl PlaceholderMr {
    fn zeroed() -> PlaceholderMr {
        PlaceholderMr {
            // SAFETY: `ibv_mr` is plain data (pointers, integers); all-zero is a valid
            // value.
            mr: unsafe { core::mem::zeroed() },
            container: [0; 8],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::PlaceholderMr;
    use rdma_sys as ffi;

    /// The placeholder covers libmlx5's `struct mlx5_mr`: `ibv_mr`, then `verbs_mr`'s
    /// `mr_type` and `access` (4 bytes each) and `alloc_flags` (4), all inside the value
    /// and zero.
    #[test]
    fn the_placeholder_region_covers_the_providers_containers() {
        let p = PlaceholderMr::zeroed();
        let mlx5_mr = core::mem::size_of::<ffi::ibv_mr>() + 3 * 4;
        assert!(core::mem::size_of::<PlaceholderMr>() >= mlx5_mr);
        let base = &p as *const PlaceholderMr as usize;
        assert_eq!(&p.mr as *const ffi::ibv_mr as usize, base);
        assert_eq!(
            p.container.as_ptr() as usize,
            base + core::mem::size_of::<ffi::ibv_mr>()
        );
        assert!(p.container.iter().all(|&w| w == 0));
    }
}
