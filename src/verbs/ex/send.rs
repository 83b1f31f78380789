//! The extended send operations: the `ibv_wr_*` function pointers of an `ibv_qp_ex`, read
//! once at creation, and the posts built with them (an RC QP's [`SendOps`], a UD QP's
//! [`UdSendOps`]).

use rdma_sys as ffi;
use std::os::raw::{c_int, c_uint, c_void};

/// The `send_ops_flags` an RC QP asks for: every opcode the verbs path posts, the atomic
/// ones only on a device with `atomics` (`atomic_cap` not `IBV_ATOMIC_NONE`). libmlx5
/// refuses the whole QP when they are asked without (`mlx5_qp_fill_wr_pfns`: `EOPNOTSUPP`
/// unless `atomics_enabled`, which `create_qp` sets only with `atomic_cap`), and the crate
/// refuses atomics there before posting anyway.
pub(crate) fn send_ops_flags(atomics: bool) -> u64 {
    use ffi::ibv_qp_create_send_ops_flags as F;
    let all = F::IBV_QP_EX_WITH_RDMA_WRITE
        | F::IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM
        | F::IBV_QP_EX_WITH_SEND
        | F::IBV_QP_EX_WITH_SEND_WITH_IMM
        | F::IBV_QP_EX_WITH_SEND_WITH_INV
        | F::IBV_QP_EX_WITH_RDMA_READ
        | F::IBV_QP_EX_WITH_LOCAL_INV
        | F::IBV_QP_EX_WITH_BIND_MW;
    let atomic = F::IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP | F::IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD;
    (if atomics { all | atomic } else { all }).0 as u64
}

/// The `send_ops_flags` a UD QP asks for: sends with and without immediate, all UD has
/// (rxe refuses anything more for UD: `RXE_SUP_UD_QP_SEND_OPS_FLAGS`).
pub(crate) fn ud_send_ops_flags() -> u64 {
    use ffi::ibv_qp_create_send_ops_flags as F;
    (F::IBV_QP_EX_WITH_SEND | F::IBV_QP_EX_WITH_SEND_WITH_IMM).0 as u64
}

type Qx = *mut ffi::ibv_qp_ex;

/// `ibv_wr_complete(q)`, its pointer read from the QP now, as verbs.h's inline does: mlx5
/// swaps it with the QP's state (`set_qp_operational_state`: `mlx5_send_wr_complete_error`,
/// which drops the batch with `EINVAL`, until the QP reaches RTS), so the one read when the
/// QP was created, in RESET, is that stub. `created` (that one) stands in only if the
/// provider cleared the pointer.
///
/// # Safety
/// `q` is a live `ibv_qp_ex` between `wr_start` and `wr_complete`.
#[inline(always)]
unsafe fn complete_now(q: Qx, created: unsafe extern "C" fn(Qx) -> c_int) -> c_int {
    // SAFETY: the caller's contract: a live qp_ex whose `wr_complete` field the provider
    // sets (a plain field of the struct, written only by `ibv_modify_qp` on the posting
    // thread's QP, which the caller serialises with posting).
    unsafe {
        let f = std::ptr::addr_of!((*q).wr_complete)
            .read()
            .unwrap_or(created);
        f(q)
    }
}

/// The `ibv_qp_ex` of `qp` with a view of it (its `wr_*` pointers, which the provider
/// filled at creation); None for a QP created without the extended attributes.
///
/// # Safety
/// `qp` must be a live QP; the view is used only while it lives.
pub(crate) unsafe fn qp_ex<'a>(qp: *mut ffi::ibv_qp) -> Option<(Qx, &'a ffi::ibv_qp_ex)> {
    // SAFETY: live QP; libibverbs returns NULL for a QP created without the extended
    // attributes (`VERBS_QP_EX` not in its comp_mask).
    let qpx = unsafe { ffi::ibv_qp_to_qp_ex(qp) };
    if qpx.is_null() {
        return None;
    }
    // SAFETY: a live ibv_qp_ex (the caller's contract), not null.
    Some((qpx, unsafe { &*qpx }))
}

/// The `ibv_wr_*` function pointers of one `ibv_qp_ex`, read once at creation
/// (`wr_complete` again at each post: [`complete_now`]).
#[derive(Copy, Clone)]
pub(crate) struct SendOps {
    qpx: Qx,
    start: unsafe extern "C" fn(Qx),
    complete: unsafe extern "C" fn(Qx) -> c_int,
    write: unsafe extern "C" fn(Qx, u32, u64),
    write_imm: unsafe extern "C" fn(Qx, u32, u64, u32),
    send: unsafe extern "C" fn(Qx),
    send_imm: unsafe extern "C" fn(Qx, u32),
    send_inv: unsafe extern "C" fn(Qx, u32),
    read: unsafe extern "C" fn(Qx, u32, u64),
    cmp_swp: unsafe extern "C" fn(Qx, u32, u64, u64, u64),
    fetch_add: unsafe extern "C" fn(Qx, u32, u64, u64),
    local_inv: unsafe extern "C" fn(Qx, u32),
    bind_mw: unsafe extern "C" fn(Qx, *mut ffi::ibv_mw, u32, *const ffi::ibv_mw_bind_info),
    data: DataOps,
}

/// The `ibv_wr_set_*` data setters of one `ibv_qp_ex` (every transport's send operations
/// end with one of them), read once at creation.
#[derive(Copy, Clone)]
pub(crate) struct DataOps {
    set_sge: unsafe extern "C" fn(Qx, u32, u64, u32),
    set_sge_list: unsafe extern "C" fn(Qx, usize, *const ffi::ibv_sge),
    set_inline_data: unsafe extern "C" fn(Qx, *mut c_void, usize),
}

impl DataOps {
    /// The setters of `q`, when its provider set all three.
    pub(crate) fn of(q: &ffi::ibv_qp_ex) -> Option<DataOps> {
        Some(DataOps {
            set_sge: q.wr_set_sge?,
            set_sge_list: q.wr_set_sge_list?,
            set_inline_data: q.wr_set_inline_data?,
        })
    }

    /// Sets the data of `wr` on the request being built: with `IBV_SEND_INLINE`, its first
    /// gather entry copied as inline data (as rdma-core's providers do for
    /// `ibv_post_send`); else its gather entry or list.
    ///
    /// # Safety
    /// `q` is the live `ibv_qp_ex` these setters were read from, between `wr_start` and
    /// `wr_complete`, after the request's opcode builder; `wr.sg_list` holds `wr.num_sge`
    /// valid entries and the bytes they name are valid for the call.
    #[inline(always)]
    pub(crate) unsafe fn set(&self, q: Qx, wr: &ffi::ibv_send_wr) {
        // SAFETY: the caller's contract.
        unsafe {
            if wr.send_flags & ffi::ibv_send_flags::IBV_SEND_INLINE.0 != 0 && wr.num_sge > 0 {
                let s = &*wr.sg_list;
                (self.set_inline_data)(q, s.addr as *mut c_void, s.length as usize);
            } else if wr.num_sge == 1 {
                let s = &*wr.sg_list;
                (self.set_sge)(q, s.lkey, s.addr, s.length);
            } else {
                (self.set_sge_list)(q, wr.num_sge as usize, wr.sg_list);
            }
        }
    }
}

impl SendOps {
    /// The extended send operations of `qp`, when it was created with
    /// `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS` ([`send_ops_flags`]) and its provider set every
    /// pointer the verbs path calls; None otherwise.
    ///
    /// # Safety
    /// `qp` must be a live QP; the result is used only while it lives.
    pub(crate) unsafe fn of(qp: *mut ffi::ibv_qp) -> Option<SendOps> {
        // SAFETY: the caller's contract.
        let (qpx, q) = unsafe { qp_ex(qp) }?;
        Some(SendOps {
            qpx,
            start: q.wr_start?,
            complete: q.wr_complete?,
            write: q.wr_rdma_write?,
            write_imm: q.wr_rdma_write_imm?,
            send: q.wr_send?,
            send_imm: q.wr_send_imm?,
            send_inv: q.wr_send_inv?,
            read: q.wr_rdma_read?,
            cmp_swp: q.wr_atomic_cmp_swp?,
            fetch_add: q.wr_atomic_fetch_add?,
            local_inv: q.wr_local_inv?,
            bind_mw: q.wr_bind_mw?,
            data: DataOps::of(q)?,
        })
    }

    /// Posts the built work requests `wrs` (their `next` links are not read) between one
    /// `ibv_wr_start` and one `ibv_wr_complete`, with the semantics of `ibv_post_send`: the
    /// same opcodes, flags (`IBV_SEND_INLINE` copies the first gather entry as inline data,
    /// as rdma-core's providers do for `ibv_post_send`), gather lists and `wr_id`s.
    ///
    /// Returns `ibv_wr_complete`'s result: 0, or an errno. After an error libmlx5 has posted
    /// none of `wrs` (`mlx5_send_wr_complete` drops the whole batch); rxe may have posted
    /// them all (its doorbell's error: [`VerbsSendQueue::set_rxe`]).
    ///
    /// [`VerbsSendQueue::set_rxe`]: crate::verbs::sq::VerbsSendQueue::set_rxe
    ///
    /// # Safety
    /// The QP is live; every gather list, inline buffer, memory window and region the
    /// requests name is valid for the call; no other thread posts to the QP meanwhile
    /// outside rdma-core's lock (`ibv_wr_start` takes it, `ibv_wr_complete` releases it).
    #[inline]
    pub(crate) unsafe fn post(&self, wrs: &[ffi::ibv_send_wr]) -> c_int {
        use ffi::ibv_wr_opcode as O;
        let q = self.qpx;
        // SAFETY: the caller's contract; each call is the provider's own implementation of
        // the matching `ibv_wr_*` inline of verbs.h, called between `wr_start` and
        // `wr_complete` as verbs.h requires; `wr_id` and `wr_flags` are plain fields of the
        // live `ibv_qp_ex` that the next builder call reads; the unions read are the ones
        // the request's opcode uses.
        unsafe {
            (self.start)(q);
            for wr in wrs {
                std::ptr::addr_of_mut!((*q).wr_id).write(wr.wr_id);
                std::ptr::addr_of_mut!((*q).wr_flags).write(wr.send_flags as c_uint);
                let imm = wr.imm_data_invalidated_rkey_union.imm_data;
                let data = match wr.opcode {
                    O::IBV_WR_RDMA_WRITE => {
                        (self.write)(q, wr.wr.rdma.rkey, wr.wr.rdma.remote_addr);
                        true
                    }
                    O::IBV_WR_RDMA_WRITE_WITH_IMM => {
                        (self.write_imm)(q, wr.wr.rdma.rkey, wr.wr.rdma.remote_addr, imm);
                        true
                    }
                    O::IBV_WR_SEND => {
                        (self.send)(q);
                        true
                    }
                    O::IBV_WR_SEND_WITH_IMM => {
                        (self.send_imm)(q, imm);
                        true
                    }
                    O::IBV_WR_SEND_WITH_INV => {
                        let rkey = wr.imm_data_invalidated_rkey_union.invalidated_rkey;
                        (self.send_inv)(q, rkey);
                        true
                    }
                    O::IBV_WR_RDMA_READ => {
                        (self.read)(q, wr.wr.rdma.rkey, wr.wr.rdma.remote_addr);
                        true
                    }
                    O::IBV_WR_ATOMIC_CMP_AND_SWP => {
                        let a = wr.wr.atomic;
                        (self.cmp_swp)(q, a.rkey, a.remote_addr, a.compare_add, a.swap);
                        true
                    }
                    O::IBV_WR_ATOMIC_FETCH_AND_ADD => {
                        let a = wr.wr.atomic;
                        (self.fetch_add)(q, a.rkey, a.remote_addr, a.compare_add);
                        true
                    }
                    O::IBV_WR_LOCAL_INV => {
                        let rkey = wr.imm_data_invalidated_rkey_union.invalidated_rkey;
                        (self.local_inv)(q, rkey);
                        false
                    }
                    O::IBV_WR_BIND_MW => {
                        let b = &wr.bind_mw_tso_union.bind_mw;
                        (self.bind_mw)(q, b.mw, b.rkey, &b.bind_info);
                        false
                    }
                    // The send queue builds no other opcode.
                    _ => false,
                };
                if !data {
                    continue;
                }
                self.data.set(q, wr);
            }
            complete_now(q, self.complete)
        }
    }
}

impl SendOps {
    /// One RDMA write or send (with immediate `imm`, big-endian, for the `_WITH_IMM`
    /// opcodes) or read of one buffer (`inline`: the buffer's bytes are copied as inline
    /// data; a buffer of length 0: no data, as both providers' `wr_set_sge` take it)
    /// between `ibv_wr_start` and `ibv_wr_complete`: what [`SendOps::post`] does for a list
    /// of one, without the list.
    ///
    /// # Safety
    /// As [`SendOps::post`]; `opcode` is `IBV_WR_RDMA_WRITE`, `IBV_WR_RDMA_WRITE_WITH_IMM`,
    /// `IBV_WR_SEND`, `IBV_WR_SEND_WITH_IMM` or `IBV_WR_RDMA_READ`.
    #[inline]
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn post_one(
        &self,
        wr_id: u64,
        flags: u32,
        opcode: ffi::ibv_wr_opcode::Type,
        rkey: u32,
        remote_addr: u64,
        imm: u32,
        buf: &ffi::ibv_sge,
        inline: bool,
    ) -> c_int {
        use ffi::ibv_wr_opcode as O;
        let q = self.qpx;
        // SAFETY: as in `post`: the provider's builders between start and complete. `wr_id`
        // and `wr_flags` are set before `ibv_wr_start`, which the builder reads them after
        // (ibv_wr_post(3): "set before invoking the WR builder function"): no provider's
        // `wr_start` touches them (mlx5_send_wr_start, rxe's and hns's wr_start,
        // bnxt_re_send_wr_start, efa_send_wr_start, ionic_wr_start), and set here they are
        // not two more values kept across the call.
        unsafe {
            std::ptr::addr_of_mut!((*q).wr_id).write(wr_id);
            std::ptr::addr_of_mut!((*q).wr_flags).write(flags as c_uint);
            (self.start)(q);
            match opcode {
                O::IBV_WR_RDMA_WRITE => (self.write)(q, rkey, remote_addr),
                O::IBV_WR_RDMA_READ => (self.read)(q, rkey, remote_addr),
                O::IBV_WR_RDMA_WRITE_WITH_IMM => (self.write_imm)(q, rkey, remote_addr, imm),
                O::IBV_WR_SEND_WITH_IMM => (self.send_imm)(q, imm),
                _ => (self.send)(q),
            }
            if inline {
                (self.data.set_inline_data)(q, buf.addr as *mut c_void, buf.length as usize);
            } else {
                (self.data.set_sge)(q, buf.lkey, buf.addr, buf.length);
            }
            complete_now(q, self.complete)
        }
    }
}

/// The `ibv_wr_*` function pointers of a UD `ibv_qp_ex`, read once at creation (a provider
/// sets only those of the opcodes asked for, so the RC set is not there; `wr_complete` is
/// read again at each post: [`complete_now`]).
#[derive(Copy, Clone)]
pub(crate) struct UdSendOps {
    qpx: Qx,
    start: unsafe extern "C" fn(Qx),
    complete: unsafe extern "C" fn(Qx) -> c_int,
    send: unsafe extern "C" fn(Qx),
    send_imm: unsafe extern "C" fn(Qx, u32),
    set_ud_addr: unsafe extern "C" fn(Qx, *mut ffi::ibv_ah, u32, u32),
    data: DataOps,
}

impl UdSendOps {
    /// The extended UD send operations of `qp`, when it was created with
    /// [`ud_send_ops_flags`] and its provider set every pointer used here.
    ///
    /// # Safety
    /// `qp` must be a live QP; the result is used only while it lives.
    pub(crate) unsafe fn of(qp: *mut ffi::ibv_qp) -> Option<UdSendOps> {
        // SAFETY: the caller's contract.
        let (qpx, q) = unsafe { qp_ex(qp) }?;
        Some(UdSendOps {
            qpx,
            start: q.wr_start?,
            complete: q.wr_complete?,
            send: q.wr_send?,
            send_imm: q.wr_send_imm?,
            set_ud_addr: q.wr_set_ud_addr?,
            data: DataOps::of(q)?,
        })
    }

    /// Posts the built UD sends `wrs` between one `ibv_wr_start` and one `ibv_wr_complete`
    /// with `ibv_post_send`'s semantics: opcode, flags, `wr_id`, the address vector
    /// (`wr.ud`: `ibv_wr_set_ud_addr` after the opcode's builder, as verbs.h requires),
    /// inline data or gather list. 0, or an errno after which none was posted.
    ///
    /// # Safety
    /// The QP is live; the AHs, gather lists and inline bytes the requests name are valid
    /// for the call; posting is serialised by the caller.
    pub(crate) unsafe fn post(&self, wrs: &[ffi::ibv_send_wr]) -> c_int {
        let q = self.qpx;
        // SAFETY: the caller's contract; the provider's builders between start and complete,
        // each request's address set right after its opcode's builder.
        unsafe {
            (self.start)(q);
            for wr in wrs {
                std::ptr::addr_of_mut!((*q).wr_id).write(wr.wr_id);
                std::ptr::addr_of_mut!((*q).wr_flags).write(wr.send_flags as c_uint);
                if wr.opcode == ffi::ibv_wr_opcode::IBV_WR_SEND_WITH_IMM {
                    (self.send_imm)(q, wr.imm_data_invalidated_rkey_union.imm_data);
                } else {
                    (self.send)(q);
                }
                let ud = wr.wr.ud;
                (self.set_ud_addr)(q, ud.ah, ud.remote_qpn, ud.remote_qkey);
                self.data.set(q, wr);
            }
            complete_now(q, self.complete)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The flags are the header's values (verbs.h: `IBV_QP_EX_WITH_*`).
    #[test]
    fn send_ops_flags_are_the_headers() {
        assert_eq!(send_ops_flags(true), 0x3ff);
        // Less IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP (1 << 5) and _FETCH_AND_ADD (1 << 6).
        assert_eq!(send_ops_flags(false), 0x39f);
    }

    /// The header's values (verbs.h `IBV_QP_EX_WITH_SEND` = 1 << 2, `_SEND_WITH_IMM` =
    /// 1 << 3): exactly what rxe allows a UD QP (`RXE_SUP_UD_QP_SEND_OPS_FLAGS`).
    #[test]
    fn ud_send_ops_are_send_and_send_with_immediate() {
        assert_eq!(ud_send_ops_flags(), (1 << 2) | (1 << 3));
    }
}
