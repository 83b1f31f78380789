//! Memory-window binds and unbinds on a queue pair (type 2 windows, UMR on the direct path,
//! `ibv_wr_bind_mw` / `ibv_post_send` on the verbs path), keeping the window's key in step.

use super::{Qp, QpPath};
use crate::error::{Error, Result};
use crate::queue::flags::PostFlags;
use crate::resources::mw::Pinned;
use crate::verbs::sq::WindowBind;
use mlx5::request::{next_key_variant, Request};
use std::sync::Arc;

/// rdma-core's window of `mw` (a window of this QP's domain, checked by the caller: the
/// verbs path runs only on rdma-core devices).
fn verbs_window(mw: &crate::resources::MemoryWindow) -> Result<*mut rdma_sys::ibv_mw> {
    mw.verbs_mw()
        .ok_or_else(|| crate::backend::other_device("window of another device (rkey)"))
}

impl Qp {
    /// Binds `mw` to `len` bytes at offset `off` of `mr` with `rights` (remote read / write /
    /// atomic, optionally zero-based) and returns the window's new rkey (a new key variant on
    /// every bind; the old rkey fails with a remote access error from then on). `len == 0`
    /// unbinds (see [`Qp::unbind_mw`]). The request after the bind waits for it (an initiator
    /// small fence, as rdma-core arms), and a peer may use the new rkey as soon as it learns it
    /// from a send posted after the bind. Type-1 windows may be bound by any QP and re-bound
    /// while bound (the new binding replaces the old); type-2 windows are tied to this QP (a
    /// peer must come in through it) and must be unbound before they are bound again (a
    /// ConnectX checks a type-2 window is free, rxe too): this is refused before posting.
    ///
    /// The window's key advances only when the bind succeeds: until its completion (or a
    /// later one of this QP) has been polled, the bind is in flight; if it fails, the window
    /// keeps the key and binding it had.
    ///
    /// # Errors
    /// Before anything is posted: [`Error::InvalidState`] before `connect`;
    /// [`Error::Privileges`] when `rights` are not a subset of the region's rights or the
    /// region lacks [`Access::MW_BIND`](crate::Access::MW_BIND);
    /// [`Error::InvalidParameter`] for a range outside the region or other rights;
    /// [`Error::InvalidHandle`] when window, region and QP are in different protection domains;
    /// [`Error::InvalidParameter`] for a type-1 window with `ZERO_BASED` rights or on a
    /// zero-based region (rdma-core's `mlx5_bind_mw` refuses both);
    /// [`Error::WindowState`] for a bound type-2 window or a bind of this window in flight on
    /// another QP; [`Error::QueueFull`].
    #[allow(clippy::too_many_arguments)]
    pub fn bind_mw(
        &mut self,
        mw: &mut crate::resources::MemoryWindow,
        mr: &crate::resources::MemoryRegion,
        off: usize,
        len: usize,
        rights: mlx5::request::Access,
        cookie: u64,
        flags: PostFlags,
    ) -> Result<u32> {
        self.check_state()?;
        crate::resources::mw::check_bind(
            mr.access(),
            mr.len() as u64,
            rights,
            off as u64,
            len as u64,
        )?;
        crate::resources::mw::check_type1(mw.mw_type, mr.access(), rights)?;
        if !Arc::ptr_eq(&mw.pd.inner, &self.pd.inner)
            || !Arc::ptr_eq(&mr.pd().inner, &self.pd.inner)
        {
            let (what, value) = if Arc::ptr_eq(&mw.pd.inner, &self.pd.inner) {
                ("region of another protection domain (lkey)", mr.lkey())
            } else {
                ("window of another protection domain (rkey)", mw.rkey())
            };
            return Err(Error::InvalidHandle {
                what,
                value: value as u64,
            });
        }
        if len == 0 {
            return self.unbind_mw(mw, cookie, flags);
        }
        mw.settle();
        mw.check_flight(self.send_shadow())?;
        let (old, bound) = mw.effective();
        if mw.mw_type == mlx5::request::MwType::Two && bound.is_some() {
            return Err(Error::WindowState {
                rkey: old,
                state: "bound (a type-2 window is unbound with Qp::unbind_mw before a new bind)",
            });
        }
        // The window keeps the region registered from now on, whatever the order of drops:
        // given back if the post is refused, the bind fails, or once the window lets go.
        let pin = Pinned::new(mr.pins()).ok_or(Error::WindowState {
            rkey: old,
            state: "its region is pinned 2^31 - 1 times (receives and windows)",
        })?;
        let addr = mr.addr() + off as u64;
        // On from the last key posted for a type-2 window (a bind that failed included: a
        // peer may have been told its key), or, for one not bound yet, from the last key of a
        // dropped window with this index (see `Pd::alloc_mw`).
        let from = mw.after.map_or(old, |v| (old & !0xff) | v as u32);
        let mut new_rkey = next_key_variant(from);
        if new_rkey == old {
            // Not the window's current key: rxe before Linux 6.0 refused a bind to it
            // ("attempt to bind MW with same key", `rxe_check_bind_mw`).
            new_rkey = next_key_variant(new_rkey);
        }
        let access = rights;
        let new_rkey = match &mut self.path {
            QpPath::Direct { sq, .. } => {
                let b = mlx5::request::BindMw {
                    mw_rkey: old,
                    new_rkey,
                    mw_type: mw.mw_type,
                    mr_lkey: mr.lkey(),
                    addr,
                    len: len as u64,
                    access,
                };
                sq.post_window(&Request::BindMw(b), cookie, flags)?;
                new_rkey
            }
            QpPath::Verbs { sq, .. } => {
                let b = WindowBind {
                    mw: verbs_window(mw)?,
                    mw_type: mw.mw_type,
                    rkey: old,
                    new_rkey,
                    mr: Some(mr.verbs_mr().ok_or_else(|| {
                        crate::backend::other_device("region of another device (lkey)")
                    })?),
                    addr,
                    len: len as u64,
                    access,
                };
                // SAFETY: window and region are live objects of this QP's domain (checked
                // above), the window for as long as it is bound (`&mut` while binding, freed
                // only once no bind is in flight), the region while a window is bound to it
                // (the bind's pin, taken above, keeps it registered).
                unsafe { sq.bind_window(&b, cookie, flags)? }
            }
        };
        // A record of the new key on this QP is from a binding 256 binds ago (no peer knows
        // the key yet): it must not unbind this one.
        self.invalidations.forget(new_rkey);
        self.record_window_step(mw, new_rkey, Some(self.qpn), Some(pin));
        if mw.mw_type == mlx5::request::MwType::Two {
            // Whatever the bind's outcome: the next bind goes on from this key, not from the
            // allocated one, which may be a dropped window's last (see `Pd::alloc_mw`).
            mw.after = Some(new_rkey as u8);
        }
        Ok(new_rkey)
    }

    /// Unbinds `mw`: its key grants nothing from then on. A type-2 window is unbound by a
    /// local invalidate of its key (the key stays; the next bind gives a new one), which
    /// must come through the QP it is bound to; a type-1 window by a zero-length bind (a new
    /// key variant). The same on every device: a zero-length type-2 bind is an unbind on a
    /// ConnectX but refused by rxe, and a local invalidate of a type-1 window is refused by
    /// both. Returns the window's key after the unbind.
    ///
    /// # Errors
    /// Before anything is posted: [`Error::InvalidState`] before `connect`;
    /// [`Error::InvalidHandle`] for a window of another protection domain;
    /// [`Error::WindowState`] for a type-2 window that is not bound, or bound through
    /// another QP, or that a peer invalidated (a polled receive completion of its QP
    /// reported the key: record it with
    /// [`MemoryWindow::invalidated`](crate::MemoryWindow::invalidated)), or a request of this
    /// window in flight on another QP; [`Error::QueueFull`].
    pub fn unbind_mw(
        &mut self,
        mw: &mut crate::resources::MemoryWindow,
        cookie: u64,
        flags: PostFlags,
    ) -> Result<u32> {
        self.check_state()?;
        if !Arc::ptr_eq(&mw.pd.inner, &self.pd.inner) {
            return Err(Error::InvalidHandle {
                what: "window of another protection domain (rkey)",
                value: mw.rkey() as u64,
            });
        }
        mw.settle();
        mw.check_flight(self.send_shadow())?;
        let (old, bound) = mw.effective();
        let new_rkey = match mw.mw_type {
            mlx5::request::MwType::Two => {
                match bound {
                    Some(q) if q == self.qpn => {}
                    Some(_) => {
                        return Err(Error::WindowState {
                            rkey: old,
                            state: "bound through another QP (unbind it there)",
                        })
                    }
                    None => {
                        return Err(Error::WindowState {
                            rkey: old,
                            state: "not bound",
                        })
                    }
                }
                // A peer's send with invalidate freed it already (a receive completion of
                // its QP said so): a second invalidate of the free key fails on the NIC and
                // takes the QP to the error state (rxe runs it on a window without QP or
                // region). The record stays for `MemoryWindow::invalidated`.
                if mw.flight.is_none() && mw.invalidations.as_ref().is_some_and(|l| l.holds(old)) {
                    return Err(Error::WindowState {
                        rkey: old,
                        state: "a peer invalidated it (a receive completion reported its key): \
                                record that with MemoryWindow::invalidated",
                    });
                }
                self.check_state()?;
                let inval = Request::LocalInvalidate { rkey: old };
                match &mut self.path {
                    QpPath::Direct { sq, .. } => sq.post_window(&inval, cookie, flags),
                    QpPath::Verbs { sq, .. } => sq.post_invalidate(old, cookie, flags),
                }
                .map_err(|e| self.explain(e))?;
                old
            }
            mlx5::request::MwType::One => match &mut self.path {
                QpPath::Direct { sq, .. } => {
                    let new_rkey = next_key_variant(old);
                    let b = mlx5::request::BindMw {
                        mw_rkey: old,
                        new_rkey,
                        mw_type: mlx5::request::MwType::One,
                        mr_lkey: 0,
                        addr: 0,
                        len: 0,
                        access: mlx5::request::Access::NONE,
                    };
                    sq.post_window(&Request::BindMw(b), cookie, flags)?;
                    new_rkey
                }
                QpPath::Verbs { sq, .. } => {
                    let b = WindowBind {
                        mw: verbs_window(mw)?,
                        mw_type: mlx5::request::MwType::One,
                        rkey: old,
                        new_rkey: old,
                        mr: None,
                        addr: 0,
                        len: 0,
                        access: mlx5::request::Access::NONE,
                    };
                    // SAFETY: the window is a live object of this QP's domain (checked
                    // above); an unbind names no memory.
                    unsafe { sq.bind_window(&b, cookie, flags)? }
                }
            },
        };
        self.record_window_step(mw, new_rkey, None, None);
        Ok(new_rkey)
    }

    /// The shared state of this QP's send queue (which window bookkeeping settles on).
    fn send_shadow(&self) -> &Arc<crate::queue::shadow::Shadow<crate::queue::shadow::SendEntry>> {
        match &self.path {
            QpPath::Direct { sq, .. } => &sq.shadow,
            QpPath::Verbs { sq, .. } => &sq.shadow,
        }
    }

    /// Records the bind or unbind of `mw` this QP just posted as in flight.
    fn record_window_step(
        &self,
        mw: &mut crate::resources::MemoryWindow,
        rkey: u32,
        bound: Option<u32>,
        region: Option<Pinned>,
    ) {
        let (start, end) = match &self.path {
            QpPath::Direct { sq, .. } => sq.last_wqe(),
            QpPath::Verbs { sq, .. } => {
                let end = sq.position();
                (end.wrapping_sub(1), end)
            }
        };
        let shadow = self.send_shadow();
        let step = crate::resources::mw::Step {
            rkey,
            bound,
            invalidations: bound.map(|_| self.invalidations.clone()),
            region,
            start: shadow.widen_posted(start),
            end: shadow.widen_posted(end),
        };
        mw.push_step(shadow, step);
    }
}
