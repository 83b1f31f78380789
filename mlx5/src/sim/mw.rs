//! Memory-window binds and invalidations: bind and unbind, local invalidate, and the
//! responder's side of a send with invalidate.

use super::mem::Binding;
use super::progress::Outcome;
use super::state::State;
use crate::request::{Access, BindMw, MwType};
use crate::syndrome::Syndrome;

impl State {
    /// Invalidates a type-2 window of the responder by a send with invalidate.
    /// Whether it may (`doit` false), or does (`doit` true).
    pub(crate) fn invalidate_remote(&mut self, peer: u32, rkey: u32, doit: bool) -> bool {
        let pd = self.qps[&peer].pd;
        match self.mem.mws.get_mut(&(rkey >> 8)) {
            Some(w) if w.rkey == rkey && w.pd == pd && w.mw_type == MwType::Two => {
                w.bound.as_ref().is_some_and(|b| b.qpn == peer) && {
                    if doit {
                        w.bound = None;
                    }
                    true
                }
            }
            _ => false,
        }
    }

    /// Whether a local invalidate of `rkey` by `qpn` may run: a type-2 window of this PD
    /// bound through this QP.
    pub(crate) fn local_invalidate_check(&self, qpn: u32, pd: u32, rkey: u32) -> bool {
        self.mem.mws.get(&(rkey >> 8)).is_some_and(|w| {
            w.rkey == rkey
                && w.pd == pd
                && w.mw_type == MwType::Two
                && w.bound.as_ref().is_some_and(|b| b.qpn == qpn)
        })
    }

    pub(crate) fn local_invalidate(&mut self, qpn: u32, pd: u32, rkey: u32) -> Outcome {
        if !self.local_invalidate_check(qpn, pd, rkey) {
            return Outcome::Failed(Syndrome::MwBind);
        }
        if let Some(w) = self.mem.mws.get_mut(&(rkey >> 8)) {
            w.bound = None;
        }
        Outcome::Done(0)
    }

    /// The checks of a bind: the region's key for a bind, None for an unbind; Err when the
    /// bind fails (`MW_BIND`).
    pub(crate) fn bind_check(&self, qpn: u32, pd: u32, b: &BindMw) -> Result<Option<u32>, ()> {
        let w = self.mem.mws.get(&(b.mw_rkey >> 8)).ok_or(())?;
        if w.rkey != b.mw_rkey || w.pd != pd || w.mw_type != b.mw_type {
            return Err(());
        }
        if b.len == 0 {
            // An unbind. Type 2 carries CHECK_QPN (rdma-core `set_umr_control_seg`): the
            // window must be bound, and through this QP.
            if w.mw_type == MwType::Two && !w.bound.as_ref().is_some_and(|x| x.qpn == qpn) {
                return Err(());
            }
            return Ok(None);
        }
        if w.mw_type == MwType::Two && w.bound.is_some() {
            return Err(()); // CHECK_FREE: a bound type-2 window must be invalidated first
        }
        if w.mw_type == MwType::One && b.access.contains(Access::ZERO_BASED) {
            return Err(()); // type-1 windows are never zero-based (rdma-core mlx5_bind_mw: EINVAL)
        }
        let mr = self
            .mem
            .mrs
            .get(&(b.mr_lkey >> 8))
            .filter(|m| m.key == b.mr_lkey)
            .ok_or(())?;
        let rights = b.access;
        let needs_lw =
            rights.contains(Access::REMOTE_WRITE) || rights.contains(Access::REMOTE_ATOMIC);
        if mr.pd != pd
            || !mr.access.contains(Access::MW_BIND)
            || (needs_lw && !mr.access.contains(Access::LOCAL_WRITE))
            || b.addr < mr.addr
            || b.addr.saturating_add(b.len) > mr.addr + mr.len
        {
            return Err(());
        }
        Ok(Some(mr.key))
    }

    pub(crate) fn bind(&mut self, qpn: u32, pd: u32, b: &BindMw) -> Outcome {
        let Ok(mr_key) = self.bind_check(qpn, pd, b) else {
            return Outcome::Failed(Syndrome::MwBind);
        };
        let w = self.mem.mws.get_mut(&(b.mw_rkey >> 8)).expect("checked");
        w.rkey = b.new_rkey;
        w.bound = mr_key.map(|mr_key| Binding {
            mr_key,
            addr: b.addr,
            len: b.len,
            access: b.access,
            zero_based: b.access.contains(Access::ZERO_BASED),
            qpn,
        });
        Outcome::Done(0)
    }
}
