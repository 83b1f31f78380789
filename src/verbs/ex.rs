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
//! `extended` (refused with [`Error::Unsupported`] where it has not) or `legacy`.

use crate::error::{Error, Result};
use rdma_sys as ffi;
use std::os::raw::{c_int, c_uint, c_void};

/// Which rdma-core calls a verbs-path QP posts with, or a verbs-path CQ polls with.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum VerbsApi {
    /// QP: `ibv_wr_start`, `ibv_wr_rdma_write` (and the other `ibv_wr_*` opcodes),
    /// `ibv_wr_set_sge_list` / `ibv_wr_set_inline_data`, `ibv_wr_complete`.
    /// CQ: `ibv_start_poll`, `ibv_next_poll`, `ibv_end_poll`, `ibv_wc_read_*`.
    Extended,
    /// QP: `ibv_post_send` of a linked list of `ibv_send_wr`. CQ: `ibv_poll_cq`.
    Legacy,
}

impl std::fmt::Display for VerbsApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            VerbsApi::Extended => "extended (ibv_wr_* / ibv_start_poll)",
            VerbsApi::Legacy => "legacy (ibv_post_send / ibv_poll_cq)",
        })
    }
}

/// What `BLUEFLAME_VERBS_API` asks for.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum ApiChoice {
    /// Extended where the provider has it, else legacy.
    Auto,
    /// Extended, or an error.
    Extended,
    /// Legacy.
    Legacy,
}

/// The environment variable that overrides the choice.
pub const VAR: &str = "BLUEFLAME_VERBS_API";

impl ApiChoice {
    /// The choice `var` (the value of `BLUEFLAME_VERBS_API`) asks for.
    ///
    /// # Errors
    /// [`Error::InvalidParameter`] for a value other than `auto`, `extended`, `legacy`.
    pub fn parse(var: Option<&str>) -> Result<ApiChoice> {
        match var.unwrap_or("auto") {
            "auto" | "" => Ok(ApiChoice::Auto),
            "extended" => Ok(ApiChoice::Extended),
            "legacy" => Ok(ApiChoice::Legacy),
            other => Err(Error::InvalidParameter {
                what: "BLUEFLAME_VERBS_API (auto|extended|legacy; value length)",
                value: other.len() as u64,
            }),
        }
    }

    /// The choice of the environment now (read when a QP or CQ is created).
    ///
    /// # Errors
    /// As [`ApiChoice::parse`].
    pub fn current() -> Result<ApiChoice> {
        ApiChoice::parse(std::env::var(VAR).ok().as_deref())
    }

    /// Whether to try the extended API.
    pub fn wants_extended(self) -> bool {
        self != ApiChoice::Legacy
    }

    /// The error when the extended API was required and the provider lacks it.
    pub(crate) fn unavailable(self, what: &'static str) -> Result<()> {
        if self == ApiChoice::Extended {
            return Err(Error::Unsupported(what));
        }
        Ok(())
    }
}

/// The `send_ops_flags` a QP asks for: every opcode the verbs path posts.
pub(crate) fn send_ops_flags() -> u64 {
    use ffi::ibv_qp_create_send_ops_flags as F;
    (F::IBV_QP_EX_WITH_RDMA_WRITE
        | F::IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM
        | F::IBV_QP_EX_WITH_SEND
        | F::IBV_QP_EX_WITH_SEND_WITH_IMM
        | F::IBV_QP_EX_WITH_SEND_WITH_INV
        | F::IBV_QP_EX_WITH_RDMA_READ
        | F::IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP
        | F::IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD
        | F::IBV_QP_EX_WITH_LOCAL_INV
        | F::IBV_QP_EX_WITH_BIND_MW)
        .0 as u64
}

/// The `wc_flags` a CQ asks for: what the poller reads besides `wr_id` and `status`.
pub(crate) fn wc_flags() -> u64 {
    use ffi::ibv_create_cq_wc_flags as W;
    (W::IBV_WC_EX_WITH_BYTE_LEN
        | W::IBV_WC_EX_WITH_IMM
        | W::IBV_WC_EX_WITH_QP_NUM
        | W::IBV_WC_EX_WITH_SRC_QP)
        .0 as u64
}

/// `verbs_get_ctx_op(ctx, op)` of verbs.h: the extended context of `ctx` when it has `op`.
///
/// rdma-sys 0.3's own version (behind its `ibv_create_qp_ex`, `ibv_create_cq_ex`,
/// `ibv_alloc_td` ...) compares `abi_compat` with `u32::MAX` where verbs.h has
/// `__VERBS_ABI_IS_EXTENDED`, `(void *)UINTPTR_MAX`: on a 64-bit host it never finds the
/// extended context and those calls always fail with `EOPNOTSUPP`.
macro_rules! ctx_op {
    ($ctx:expr, $op:ident) => {{
        let ctx: *mut ffi::ibv_context = $ctx;
        if (*ctx).abi_compat as usize != usize::MAX {
            None
        } else {
            // `container_of(ctx, struct verbs_context, context)`.
            let vc = ctx
                .cast::<u8>()
                .sub(std::mem::offset_of!(ffi::verbs_context, context))
                .cast::<ffi::verbs_context>();
            // A library older than this header has a shorter context: `sz` says how much
            // of it (counted back from `context`, the last field) exists.
            let need = std::mem::size_of::<ffi::verbs_context>()
                - std::mem::offset_of!(ffi::verbs_context, $op);
            if (*vc).sz < need {
                None
            } else {
                (*vc).$op
            }
        }
    }};
}

/// `ibv_create_qp_ex` of verbs.h (see [`ctx_op!`] for why not rdma-sys's): a QP, or null
/// with `errno` set.
///
/// # Safety
/// `ctx` is a live context; `attr` is valid for the call, its PD and CQs live.
pub(crate) unsafe fn create_qp_ex(
    ctx: *mut ffi::ibv_context,
    attr: *mut ffi::ibv_qp_init_attr_ex,
) -> *mut ffi::ibv_qp {
    // SAFETY: the caller's contract; the branches are verbs.h's.
    unsafe {
        if (*attr).comp_mask == ffi::ibv_qp_init_attr_mask::IBV_QP_INIT_ATTR_PD.0 {
            // The prefix of ibv_qp_init_attr_ex is an ibv_qp_init_attr.
            return ffi::ibv_create_qp((*attr).pd, attr.cast());
        }
        match ctx_op!(ctx, create_qp_ex) {
            Some(f) => f(ctx, attr),
            None => {
                *libc::__errno_location() = libc::EOPNOTSUPP;
                std::ptr::null_mut()
            }
        }
    }
}

/// `ibv_create_cq_ex` of verbs.h (see [`ctx_op!`]): a CQ, or null with `errno` set.
///
/// # Safety
/// `ctx` is a live context; `attr` is valid for the call.
pub(crate) unsafe fn create_cq_ex(
    ctx: *mut ffi::ibv_context,
    attr: *mut ffi::ibv_cq_init_attr_ex,
) -> *mut ffi::ibv_cq_ex {
    // SAFETY: the caller's contract; the branches are verbs.h's.
    unsafe {
        let Some(f) = ctx_op!(ctx, create_cq_ex) else {
            *libc::__errno_location() = libc::EOPNOTSUPP;
            return std::ptr::null_mut();
        };
        f(ctx, attr)
    }
}

/// `ibv_alloc_td` of verbs.h (see [`ctx_op!`]; rdma-sys's never finds the op, so every
/// direct-path QP on a ConnectX fell back to rdma-core's shared, locked registers): a thread
/// domain, or null with `errno` set (`EOPNOTSUPP` when the provider has none).
///
/// # Safety
/// `ctx` is a live context; `attr` is valid for the call.
pub(crate) unsafe fn alloc_td(
    ctx: *mut ffi::ibv_context,
    attr: *mut ffi::ibv_td_init_attr,
) -> *mut ffi::ibv_td {
    // SAFETY: the caller's contract; the branches are verbs.h's.
    unsafe {
        let Some(f) = ctx_op!(ctx, alloc_td) else {
            *libc::__errno_location() = libc::EOPNOTSUPP;
            return std::ptr::null_mut();
        };
        f(ctx, attr)
    }
}

/// `ibv_dealloc_td` of verbs.h (see [`ctx_op!`]): 0 or an errno value.
///
/// # Safety
/// `td` is a live thread domain that nothing uses any more.
pub(crate) unsafe fn dealloc_td(td: *mut ffi::ibv_td) -> c_int {
    // SAFETY: the caller's contract; a live `ibv_td` names its context.
    unsafe {
        match ctx_op!((*td).context, dealloc_td) {
            Some(f) => f(td),
            None => libc::EOPNOTSUPP,
        }
    }
}

/// `ibv_alloc_parent_domain` of verbs.h (see [`ctx_op!`]): a parent domain, or null with
/// `errno` set.
///
/// # Safety
/// `ctx` is a live context; `attr` is valid for the call, its PD and thread domain live.
pub(crate) unsafe fn alloc_parent_domain(
    ctx: *mut ffi::ibv_context,
    attr: *mut ffi::ibv_parent_domain_init_attr,
) -> *mut ffi::ibv_pd {
    // SAFETY: the caller's contract; the branches are verbs.h's.
    unsafe {
        let Some(f) = ctx_op!(ctx, alloc_parent_domain) else {
            *libc::__errno_location() = libc::EOPNOTSUPP;
            return std::ptr::null_mut();
        };
        f(ctx, attr)
    }
}

/// `ibv_query_device_ex` of verbs.h (see [`ctx_op!`]; rdma-sys's always took the legacy
/// branch, so `odp_caps` read as none on every device): the provider's extended query, or,
/// where it has none (`EOPNOTSUPP`/`ENOSYS`), the legacy attributes in a zeroed `attr`.
/// 0 or an errno value.
///
/// # Safety
/// `ctx` is a live context; `input` and `attr` are valid for the call.
pub(crate) unsafe fn query_device_ex(
    ctx: *mut ffi::ibv_context,
    input: *const ffi::ibv_query_device_ex_input,
    attr: *mut ffi::ibv_device_attr_ex,
) -> c_int {
    // SAFETY: the caller's contract; the branches are verbs.h's.
    unsafe {
        if !input.is_null() && (*input).comp_mask != 0 {
            return libc::EINVAL;
        }
        if let Some(f) = ctx_op!(ctx, query_device_ex) {
            let rc = f(
                ctx,
                input,
                attr,
                std::mem::size_of::<ffi::ibv_device_attr_ex>(),
            );
            if rc != libc::EOPNOTSUPP && rc != libc::ENOSYS {
                return rc;
            }
        }
        attr.write_bytes(0, 1);
        ffi::ibv_query_device(ctx, &mut (*attr).orig_attr)
    }
}

/// `ibv_advise_mr` of verbs.h (see [`ctx_op!`]; rdma-sys's always answered `EOPNOTSUPP`):
/// 0 or an errno value.
///
/// # Safety
/// `pd` is a live PD; `sg_list` holds `num_sge` entries for the call.
pub(crate) unsafe fn advise_mr(
    pd: *mut ffi::ibv_pd,
    advice: ffi::ib_uverbs_advise_mr_advice::Type,
    flags: u32,
    sg_list: *mut ffi::ibv_sge,
    num_sge: u32,
) -> c_int {
    // SAFETY: the caller's contract; a live PD names its context.
    unsafe {
        match ctx_op!((*pd).context, advise_mr) {
            Some(f) => f(pd, advice, flags, sg_list, num_sge),
            None => libc::EOPNOTSUPP,
        }
    }
}

type Qx = *mut ffi::ibv_qp_ex;

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

/// The `ibv_wr_*` function pointers of one `ibv_qp_ex`, read once at creation.
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
    /// Returns `ibv_wr_complete`'s result: 0, or an errno after which none of `wrs` was
    /// posted (rdma-core's providers drop the whole batch on an error).
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
            (self.complete)(q)
        }
    }
}

impl SendOps {
    /// One RDMA write, send or read of one buffer (`inline`: the buffer's bytes are copied
    /// as inline data) between `ibv_wr_start` and `ibv_wr_complete`: what
    /// [`SendOps::post`] does for a list of one, without the list.
    ///
    /// # Safety
    /// As [`SendOps::post`]; `opcode` is `IBV_WR_RDMA_WRITE`, `IBV_WR_SEND` or
    /// `IBV_WR_RDMA_READ`.
    #[inline]
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn post_one(
        &self,
        wr_id: u64,
        flags: u32,
        opcode: ffi::ibv_wr_opcode::Type,
        rkey: u32,
        remote_addr: u64,
        buf: &ffi::ibv_sge,
        inline: bool,
    ) -> c_int {
        use ffi::ibv_wr_opcode as O;
        let q = self.qpx;
        // SAFETY: as in `post`: the provider's builders between start and complete.
        unsafe {
            (self.start)(q);
            std::ptr::addr_of_mut!((*q).wr_id).write(wr_id);
            std::ptr::addr_of_mut!((*q).wr_flags).write(flags as c_uint);
            match opcode {
                O::IBV_WR_RDMA_WRITE => (self.write)(q, rkey, remote_addr),
                O::IBV_WR_RDMA_READ => (self.read)(q, rkey, remote_addr),
                _ => (self.send)(q),
            }
            if inline {
                (self.data.set_inline_data)(q, buf.addr as *mut c_void, buf.length as usize);
            } else {
                (self.data.set_sge)(q, buf.lkey, buf.addr, buf.length);
            }
            (self.complete)(q)
        }
    }
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
        })
    }

    /// `ibv_start_poll`: true when a completion is current (then [`PollOps::end`] must
    /// follow), false when the CQ is empty (`ENOENT`) or the provider failed.
    ///
    /// # Safety
    /// Live CQ, polled by this caller only; not between a `start` and its `end`.
    #[inline]
    pub(crate) unsafe fn start(&self) -> bool {
        let mut attr = ffi::ibv_poll_cq_attr { comp_mask: 0 };
        // SAFETY: the caller's contract; a valid attribute (no optional fields).
        unsafe { (self.start)(self.cqx, &mut attr) == 0 }
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

    #[test]
    fn the_override_names_three_choices() {
        assert_eq!(ApiChoice::parse(None).unwrap(), ApiChoice::Auto);
        assert_eq!(ApiChoice::parse(Some("auto")).unwrap(), ApiChoice::Auto);
        assert_eq!(
            ApiChoice::parse(Some("extended")).unwrap(),
            ApiChoice::Extended
        );
        assert_eq!(ApiChoice::parse(Some("legacy")).unwrap(), ApiChoice::Legacy);
        assert!(matches!(
            ApiChoice::parse(Some("ex")),
            Err(Error::InvalidParameter { value: 2, .. })
        ));
        assert!(ApiChoice::Auto.unavailable("x").is_ok());
        assert!(ApiChoice::Legacy.unavailable("x").is_ok());
        assert!(matches!(
            ApiChoice::Extended.unavailable("x"),
            Err(Error::Unsupported("x"))
        ));
        assert!(!ApiChoice::Legacy.wants_extended());
    }

    unsafe extern "C" fn fake_create_cq_ex(
        _: *mut ffi::ibv_context,
        attr: *mut ffi::ibv_cq_init_attr_ex,
    ) -> *mut ffi::ibv_cq_ex {
        // SAFETY: the test passes a live attribute.
        unsafe { (*attr).cqe = 99 };
        std::ptr::NonNull::dangling().as_ptr()
    }

    /// A context as libibverbs lays it out (`abi_compat` = `UINTPTR_MAX`, the ops before the
    /// `ibv_context`): the provider's `create_cq_ex` is found and called. rdma-sys 0.3's
    /// inline (the old code) compares with `u32::MAX` and refuses it with `EOPNOTSUPP`.
    #[test]
    fn the_extended_context_is_found_as_verbs_h_finds_it() {
        // SAFETY: an all-zero verbs_context is a valid value (null pointers, no ops).
        let mut vc: Box<ffi::verbs_context> = Box::new(unsafe { std::mem::zeroed() });
        vc.sz = std::mem::size_of::<ffi::verbs_context>();
        vc.context.abi_compat = usize::MAX as *mut c_void;
        vc.create_cq_ex = Some(fake_create_cq_ex);
        let ctx: *mut ffi::ibv_context = &mut vc.context;
        // SAFETY: a zeroed attribute is valid.
        let mut attr: ffi::ibv_cq_init_attr_ex = unsafe { std::mem::zeroed() };
        // SAFETY: `ctx` is the context inside `vc`; the fake op only writes `attr`.
        let cq = unsafe { create_cq_ex(ctx, &mut attr) };
        assert!(!cq.is_null());
        assert_eq!(attr.cqe, 99, "the provider's op was called");
        // SAFETY: as above.
        let old = unsafe { ffi::ibv_create_cq_ex(ctx, &mut attr) };
        assert!(old.is_none(), "rdma-sys 0.3 misses the extended context");
        // A library whose context is shorter than the op's offset: not found.
        vc.sz = std::mem::size_of::<ffi::verbs_context>()
            - std::mem::offset_of!(ffi::verbs_context, create_cq_ex)
            - 8;
        let ctx: *mut ffi::ibv_context = &mut vc.context;
        // SAFETY: as above.
        assert!(unsafe { create_cq_ex(ctx, &mut attr) }.is_null());
        // A context that is not extended: not found.
        vc.sz = std::mem::size_of::<ffi::verbs_context>();
        vc.context.abi_compat = std::ptr::null_mut();
        let ctx: *mut ffi::ibv_context = &mut vc.context;
        // SAFETY: as above.
        assert!(unsafe { create_cq_ex(ctx, &mut attr) }.is_null());
    }

    static TD: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

    unsafe extern "C" fn fake_alloc_td(
        ctx: *mut ffi::ibv_context,
        _attr: *mut ffi::ibv_td_init_attr,
    ) -> *mut ffi::ibv_td {
        TD.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Box::into_raw(Box::new(ffi::ibv_td { context: ctx }))
    }

    unsafe extern "C" fn fake_dealloc_td(td: *mut ffi::ibv_td) -> c_int {
        // SAFETY: made by fake_alloc_td.
        drop(unsafe { Box::from_raw(td) });
        TD.fetch_add(100, std::sync::atomic::Ordering::Relaxed);
        0
    }

    unsafe extern "C" fn fake_alloc_parent_domain(
        _ctx: *mut ffi::ibv_context,
        attr: *mut ffi::ibv_parent_domain_init_attr,
    ) -> *mut ffi::ibv_pd {
        // SAFETY: the caller's attribute; the fake hands back its PD as the parent.
        unsafe { (*attr).pd }
    }

    unsafe extern "C" fn fake_query_device_ex(
        _ctx: *mut ffi::ibv_context,
        _input: *const ffi::ibv_query_device_ex_input,
        attr: *mut ffi::ibv_device_attr_ex,
        size: usize,
    ) -> c_int {
        assert_eq!(size, std::mem::size_of::<ffi::ibv_device_attr_ex>());
        // SAFETY: the caller's output struct.
        unsafe { (*attr).odp_caps.general_caps = 1 };
        0
    }

    unsafe extern "C" fn fake_advise_mr(
        _pd: *mut ffi::ibv_pd,
        _advice: ffi::ib_uverbs_advise_mr_advice::Type,
        _flags: u32,
        _sg: *mut ffi::ibv_sge,
        n: u32,
    ) -> c_int {
        n as c_int + 40
    }

    /// Thread domains, parent domains, the extended device query and `ibv_advise_mr` reach
    /// the provider's ops as verbs.h's inlines do; rdma-sys 0.3's versions (the old code)
    /// never find them: no thread domain (a ConnectX QP got the shared, locked registers),
    /// no ODP capability, no prefetch.
    #[test]
    fn thread_domains_device_query_and_advise_reach_the_provider() {
        // SAFETY: an all-zero verbs_context is a valid value (null pointers, no ops).
        let mut vc: Box<ffi::verbs_context> = Box::new(unsafe { std::mem::zeroed() });
        vc.sz = std::mem::size_of::<ffi::verbs_context>();
        vc.context.abi_compat = usize::MAX as *mut c_void;
        vc.alloc_td = Some(fake_alloc_td);
        vc.dealloc_td = Some(fake_dealloc_td);
        vc.alloc_parent_domain = Some(fake_alloc_parent_domain);
        vc.query_device_ex = Some(fake_query_device_ex);
        vc.advise_mr = Some(fake_advise_mr);
        let ctx: *mut ffi::ibv_context = &mut vc.context;
        // SAFETY: a zeroed attribute is valid.
        let mut td_attr: ffi::ibv_td_init_attr = unsafe { std::mem::zeroed() };
        // SAFETY: `ctx` is the context inside `vc`; the fakes touch only their arguments.
        let td = unsafe { alloc_td(ctx, &mut td_attr) };
        assert!(!td.is_null());
        // SAFETY: as above.
        let old = unsafe { ffi::ibv_alloc_td(ctx, &mut td_attr) };
        assert!(old.is_none(), "rdma-sys 0.3 misses the op");
        let mut pd: ffi::ibv_pd = ffi::ibv_pd {
            context: ctx,
            handle: 0,
        };
        // SAFETY: a zeroed attribute is valid.
        let mut pattr: ffi::ibv_parent_domain_init_attr = unsafe { std::mem::zeroed() };
        pattr.pd = &mut pd;
        pattr.td = td;
        // SAFETY: as above.
        let parent = unsafe { alloc_parent_domain(ctx, &mut pattr) };
        assert_eq!(parent, &mut pd as *mut _);
        // SAFETY: made by fake_alloc_td above, used by nothing.
        assert_eq!(unsafe { dealloc_td(td) }, 0);
        assert_eq!(TD.load(std::sync::atomic::Ordering::Relaxed), 101);
        // SAFETY: zeroed plain-data structs are valid.
        let (input, mut out): (ffi::ibv_query_device_ex_input, ffi::ibv_device_attr_ex) =
            unsafe { (std::mem::zeroed(), std::mem::zeroed()) };
        // SAFETY: as above.
        assert_eq!(unsafe { query_device_ex(ctx, &input, &mut out) }, 0);
        assert_eq!(out.odp_caps.general_caps, 1, "the provider's query ran");
        // SAFETY: as above; the fake reads nothing through the list.
        let rc = unsafe { advise_mr(&mut pd, 0, 0, std::ptr::null_mut(), 2) };
        assert_eq!(rc, 42, "the provider's advise_mr ran");
        // SAFETY: as above.
        let old = unsafe { ffi::ibv_advise_mr(&mut pd, 0, 0, std::ptr::null_mut(), 2) };
        assert_eq!(old, libc::EOPNOTSUPP, "rdma-sys 0.3 misses the op");
        // An input with an unknown comp_mask is refused as verbs.h does.
        let bad = ffi::ibv_query_device_ex_input { comp_mask: 1 };
        // SAFETY: as above.
        let rc = unsafe { query_device_ex(ctx, &bad, &mut out) };
        assert_eq!(rc, libc::EINVAL);
    }

    /// The flags are the header's values (verbs.h: `IBV_QP_EX_WITH_*`, `IBV_WC_EX_WITH_*`).
    #[test]
    fn creation_flags_are_the_headers() {
        assert_eq!(send_ops_flags(), 0x3ff);
        assert_eq!(wc_flags(), 1 | 2 | 4 | 8);
    }
}
