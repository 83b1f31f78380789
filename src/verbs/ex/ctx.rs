//! verbs.h's calls through a context's extended operations (`verbs_get_ctx_op`): extended
//! QPs and CQs, thread and parent domains, the extended device query, `ibv_advise_mr`.

use rdma_sys as ffi;
use std::os::raw::c_int;

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

/// `ibv_query_rt_values_ex` of verbs.h (see [`ctx_op!`]; rdma-sys's never finds the op)
/// asking for the raw clock: the device's free-running counter (`raw_clock.tv_nsec`, as
/// rdma-core's providers fill it), or the errno value.
///
/// # Safety
/// `ctx` is a live context.
pub(crate) unsafe fn query_raw_clock(ctx: *mut ffi::ibv_context) -> Result<u64, c_int> {
    // SAFETY: a zeroed ibv_values_ex is valid (only `comp_mask` is an input).
    let mut v: ffi::ibv_values_ex = unsafe { std::mem::zeroed() };
    v.comp_mask = ffi::ibv_values_mask::IBV_VALUES_MASK_RAW_CLOCK.0;
    // SAFETY: the caller's contract; `v` is valid for the call.
    let rc = unsafe {
        match ctx_op!(ctx, query_rt_values) {
            Some(f) => f(ctx, &mut v),
            None => libc::EOPNOTSUPP,
        }
    };
    if rc != 0 {
        return Err(rc);
    }
    if v.comp_mask & ffi::ibv_values_mask::IBV_VALUES_MASK_RAW_CLOCK.0 == 0 {
        return Err(libc::EOPNOTSUPP);
    }
    Ok(v.raw_clock.tv_nsec as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::raw::c_void;

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
}
