//! The extended polling operations: the `ibv_start_poll` / `ibv_end_poll` /
//! `ibv_wc_read_*` function pointers of an `ibv_cq_ex`, read once at creation, and what the
//! poller reads of a completion through them or from an `ibv_wc` ([`WcRead`]).

use rdma_sys as ffi;
use std::os::raw::{c_int, c_uint};

/// What `ibv_start_poll` returns for an empty CQ (`ENOENT`, every provider): the only
/// return after which the CQ is known to be empty.
pub(crate) const EMPTY: c_int = libc::ENOENT;

/// The `wc_flags` a CQ asks for: what the poller reads besides `wr_id` and `status`.
pub(crate) fn wc_flags() -> u64 {
    use ffi::ibv_create_cq_wc_flags as W;
    (W::IBV_WC_EX_WITH_BYTE_LEN
        | W::IBV_WC_EX_WITH_IMM
        | W::IBV_WC_EX_WITH_QP_NUM
        | W::IBV_WC_EX_WITH_SRC_QP)
        .0 as u64
}

type Cx = *mut ffi::ibv_cq_ex;

/// The polling function pointers of one `ibv_cq_ex`, read once at creation.
#[derive(Copy, Clone)]
pub(crate) struct PollOps {
    cqx: Cx,
    start: unsafe extern "C" fn(Cx, *mut ffi::ibv_poll_cq_attr) -> c_int,
    end: unsafe extern "C" fn(Cx),
    opcode: unsafe extern "C" fn(Cx) -> ffi::ibv_wc_opcode::Type,
    vendor_err: unsafe extern "C" fn(Cx) -> u32,
    byte_len: unsafe extern "C" fn(Cx) -> u32,
    imm_data: unsafe extern "C" fn(Cx) -> u32,
    qp_num: unsafe extern "C" fn(Cx) -> u32,
    src_qp: unsafe extern "C" fn(Cx) -> u32,
    wc_flags: unsafe extern "C" fn(Cx) -> c_uint,
    /// `ibv_wc_read_completion_wallclock_ns`, when the provider has it (it is meaningful
    /// only on a CQ created with `IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK`).
    wallclock: Option<unsafe extern "C" fn(Cx) -> u64>,
}

impl PollOps {
    /// The polling operations of `cqx`, created with [`wc_flags`]; None when the provider
    /// left one the poller calls unset.
    ///
    /// # Safety
    /// `cqx` must be a live extended CQ; the result is used only while it lives.
    pub(crate) unsafe fn of(cqx: Cx) -> Option<PollOps> {
        // SAFETY: a live ibv_cq_ex; the provider filled its pointers at creation.
        let c = unsafe { &*cqx };
        Some(PollOps {
            cqx,
            start: c.start_poll?,
            end: c.end_poll?,
            opcode: c.read_opcode?,
            vendor_err: c.read_vendor_err?,
            byte_len: c.read_byte_len?,
            imm_data: c.read_imm_data?,
            qp_num: c.read_qp_num?,
            src_qp: c.read_src_qp?,
            wc_flags: c.read_wc_flags?,
            wallclock: c.read_completion_wallclock_ns,
        })
    }

    /// `ibv_start_poll`: 0 when a completion is current (then [`PollOps::end`] must
    /// follow), [`EMPTY`] when the CQ is empty, any other value when the provider failed
    /// (libmlx5's `CQ_POLL_ERR`, after it consumed a CQE it could not parse: the CQ is not
    /// known to be empty, so the queues of dropped QPs keep their charge).
    ///
    /// # Safety
    /// Live CQ, polled by this caller only; not between a `start` and its `end`.
    #[inline]
    pub(crate) unsafe fn start(&self) -> c_int {
        let mut attr = ffi::ibv_poll_cq_attr { comp_mask: 0 };
        // SAFETY: the caller's contract; a valid attribute (no optional fields).
        unsafe { (self.start)(self.cqx, &mut attr) }
    }

    /// [`PollOps::start`] with the caller's attribute (all zero, as `start` makes its own):
    /// a poller that keeps one saves the store of a fresh one per poll.
    ///
    /// # Safety
    /// As [`PollOps::start`]; `attr` points to a valid `ibv_poll_cq_attr` with
    /// `comp_mask` 0 (the providers only read it: no optional field is asked for).
    #[inline(always)]
    pub(crate) unsafe fn start_with(&self, attr: *mut ffi::ibv_poll_cq_attr) -> c_int {
        // SAFETY: the caller's contract.
        unsafe { (self.start)(self.cqx, attr) }
    }

    /// `ibv_end_poll`: gives the read completions back to the CQ.
    ///
    /// # Safety
    /// After a successful [`PollOps::start`], once.
    #[inline]
    pub(crate) unsafe fn end(&self) {
        // SAFETY: the caller's contract.
        unsafe { (self.end)(self.cqx) }
    }

    /// Whether the provider reads wall-clock completion times.
    pub(crate) fn has_wallclock(&self) -> bool {
        self.wallclock.is_some()
    }

    /// `ibv_wc_read_completion_wallclock_ns` of the current completion (None when the
    /// provider has no such reader).
    ///
    /// # Safety
    /// As [`PollOps::current`]; the CQ was created with
    /// `IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK`.
    #[inline]
    pub(crate) unsafe fn wallclock_ns(&self) -> Option<u64> {
        // SAFETY: the caller's contract.
        self.wallclock.map(|f| unsafe { f(self.cqx) })
    }

    /// The current completion, read through the accessors.
    ///
    /// # Safety
    /// Between a successful [`PollOps::start`] (or `next`) and the following call of `next`
    /// or `end`.
    #[inline]
    pub(crate) unsafe fn current(&self) -> ExWc<'_> {
        ExWc { ops: self }
    }
}

/// One completion of an extended CQ, read field by field (`ibv_wc_read_*`).
pub(crate) struct ExWc<'a> {
    ops: &'a PollOps,
}

/// What the poller reads of a work completion, from an `ibv_wc` or through the
/// `ibv_wc_read_*` accessors (only the fields a completion needs are read).
pub(crate) trait WcRead {
    /// Whether the completion is read between `ibv_start_poll` and `ibv_end_poll`, while
    /// the provider holds the CQ's lock (libmlx5's `cq->lock`): then the poller takes no
    /// lock of its own ([`LateWc`]).
    const IN_POLL: bool = false;
    /// `wr_id`.
    fn wr_id(&self) -> u64;
    /// `status` (`IBV_WC_*`).
    fn status(&self) -> u32;
    /// `qp_num`.
    fn qp_num(&self) -> u32;
    /// `opcode`: defined on success only.
    fn opcode(&self) -> u32;
    /// `vendor_err`.
    fn vendor_err(&self) -> u32;
    /// `byte_len`.
    fn byte_len(&self) -> u32;
    /// `wc_flags`.
    fn wc_flags(&self) -> u32;
    /// The immediate (network order) or, with `IBV_WC_WITH_INV`, the invalidated rkey.
    fn imm_or_rkey(&self) -> u32;
    /// `src_qp`: the sender's QP number of a UD receive.
    fn src_qp(&self) -> u32;
}

impl WcRead for ffi::ibv_wc {
    #[inline(always)]
    fn wr_id(&self) -> u64 {
        self.wr_id
    }
    #[inline(always)]
    fn status(&self) -> u32 {
        self.status
    }
    #[inline(always)]
    fn qp_num(&self) -> u32 {
        self.qp_num
    }
    #[inline(always)]
    fn opcode(&self) -> u32 {
        self.opcode
    }
    #[inline(always)]
    fn vendor_err(&self) -> u32 {
        self.vendor_err
    }
    #[inline(always)]
    fn byte_len(&self) -> u32 {
        self.byte_len
    }
    #[inline(always)]
    fn wc_flags(&self) -> u32 {
        self.wc_flags
    }
    #[inline(always)]
    fn imm_or_rkey(&self) -> u32 {
        // SAFETY: both members of the union are u32: any bits are a valid value.
        unsafe { self.imm_data_invalidated_rkey_union.imm_data }
    }
    #[inline(always)]
    fn src_qp(&self) -> u32 {
        self.src_qp
    }
}

impl WcRead for ExWc<'_> {
    const IN_POLL: bool = true;
    #[inline(always)]
    fn wr_id(&self) -> u64 {
        // SAFETY: `current`'s contract: the provider set the field for this completion.
        unsafe { (*self.ops.cqx).wr_id }
    }
    #[inline(always)]
    fn status(&self) -> u32 {
        // SAFETY: as above.
        unsafe { (*self.ops.cqx).status }
    }
    #[inline(always)]
    fn qp_num(&self) -> u32 {
        // SAFETY: `current`'s contract; the CQ was created with IBV_WC_EX_WITH_QP_NUM.
        unsafe { (self.ops.qp_num)(self.ops.cqx) }
    }
    #[inline(always)]
    fn opcode(&self) -> u32 {
        // SAFETY: `current`'s contract.
        unsafe { (self.ops.opcode)(self.ops.cqx) }
    }
    #[inline(always)]
    fn vendor_err(&self) -> u32 {
        // SAFETY: `current`'s contract.
        unsafe { (self.ops.vendor_err)(self.ops.cqx) }
    }
    #[inline(always)]
    fn byte_len(&self) -> u32 {
        // SAFETY: `current`'s contract; created with IBV_WC_EX_WITH_BYTE_LEN.
        unsafe { (self.ops.byte_len)(self.ops.cqx) }
    }
    #[inline(always)]
    fn wc_flags(&self) -> u32 {
        // SAFETY: `current`'s contract.
        unsafe { (self.ops.wc_flags)(self.ops.cqx) }
    }
    #[inline(always)]
    fn imm_or_rkey(&self) -> u32 {
        // SAFETY: `current`'s contract; created with IBV_WC_EX_WITH_IMM (verbs.h reads the
        // invalidated rkey through the same accessor, `ibv_wc_read_invalidated_rkey`).
        unsafe { (self.ops.imm_data)(self.ops.cqx) }
    }
    #[inline(always)]
    fn src_qp(&self) -> u32 {
        // SAFETY: `current`'s contract; created with IBV_WC_EX_WITH_SRC_QP.
        unsafe { (self.ops.src_qp)(self.ops.cqx) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The flags are the header's values (verbs.h: `IBV_WC_EX_WITH_*`).
    #[test]
    fn wc_flags_are_the_headers() {
        assert_eq!(wc_flags(), 1 | 2 | 4 | 8);
    }
}

/// The fields of a work completion the poller reads, copied out of an `ibv_start_poll` /
/// `ibv_end_poll` pair to be finished after `ibv_end_poll` ([`LateWc::of`]): a completion
/// of a QP the poller's list does not have, which is looked up in the registry under its
/// lock, a lock a QP's destruction holds while rdma-core takes the CQ's (`mlx5_destroy_qp`:
/// `mlx5_lock_cqs`).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct LateWc {
    pub(crate) wr_id: u64,
    pub(crate) status: u32,
    pub(crate) qp_num: u32,
    pub(crate) opcode: u32,
    pub(crate) vendor_err: u32,
    pub(crate) byte_len: u32,
    pub(crate) wc_flags: u32,
    pub(crate) imm_or_rkey: u32,
    pub(crate) src_qp: u32,
}

impl LateWc {
    /// What the poller would read of `wc` (`complete_error`, `complete_recv`; a send reads
    /// nothing more than its `wr_id`), read now: no field a provider leaves undefined for
    /// it (an error's opcode, a receive's immediate without the flag), nor one it may not
    /// support (`src_qp` of a QP not UD).
    pub(crate) fn of(wc: &impl WcRead, recv_tag: u64, ud_tag: u64) -> LateWc {
        use rdma_sys::ibv_wc_flags as F;
        let mut l = LateWc {
            wr_id: wc.wr_id(),
            status: wc.status(),
            qp_num: wc.qp_num(),
            ..LateWc::default()
        };
        if l.status != rdma_sys::ibv_wc_status::IBV_WC_SUCCESS {
            l.vendor_err = wc.vendor_err();
        } else if l.wr_id & recv_tag != 0 {
            l.wc_flags = wc.wc_flags();
            l.byte_len = wc.byte_len();
            if l.wc_flags & F::IBV_WC_WITH_IMM.0 != 0 {
                l.opcode = wc.opcode();
                l.imm_or_rkey = wc.imm_or_rkey();
            } else if l.wc_flags & crate::verbs::cq::WITH_INV_ANY != 0 {
                l.imm_or_rkey = wc.imm_or_rkey();
            }
            if l.wr_id & ud_tag != 0 {
                l.src_qp = wc.src_qp();
            }
        }
        l
    }
}

impl WcRead for LateWc {
    fn wr_id(&self) -> u64 {
        self.wr_id
    }
    fn status(&self) -> u32 {
        self.status
    }
    fn qp_num(&self) -> u32 {
        self.qp_num
    }
    fn opcode(&self) -> u32 {
        self.opcode
    }
    fn vendor_err(&self) -> u32 {
        self.vendor_err
    }
    fn byte_len(&self) -> u32 {
        self.byte_len
    }
    fn wc_flags(&self) -> u32 {
        self.wc_flags
    }
    fn imm_or_rkey(&self) -> u32 {
        self.imm_or_rkey
    }
    fn src_qp(&self) -> u32 {
        self.src_qp
    }
}
