//! The mlx5dv binding: turns a verbs QP and CQ on a ConnectX into the [`RawQp`] / [`RawCq`]
//! of the direct path. This is the only code that talks to mlx5 hardware resources, so it is
//! kept small: the structs are declared by hand exactly as `infiniband/mlx5dv.h` (rdma-core 44)
//! declares them (their layouts are checked against the header by `mlx5-hdrcheck`), the
//! library is loaded with `dlopen` only when an mlx5 device is used, and the conversion to raw
//! ring descriptions is a pure function tested with the structs the library returns.
//!
//! Reviewed against rdma-core `providers/mlx5/mlx5.c` (`mlx5dv_get_qp`, `mlx5dv_get_cq`) and
//! UCX `uct_ib_mlx5_get_txwq` / `uct_ib_mlx5_get_cq`.

use crate::error::{Error, Result};
use crate::DataPath;
use mlx5::{RawCq, RawQp, RawSrq};
use std::ffi::c_void;
use std::sync::OnceLock;

pub mod dc;

/// Hand-written declarations of the mlx5dv structs the direct path needs.
pub mod ffi {
    #![allow(non_camel_case_types, missing_docs)]
    use std::ffi::c_void;

    #[repr(C)]
    #[derive(Copy, Clone, Debug)]
    pub struct mlx5dv_qp_ring {
        pub buf: *mut c_void,
        pub wqe_cnt: u32,
        pub stride: u32,
    }

    #[repr(C)]
    #[derive(Copy, Clone, Debug)]
    pub struct mlx5dv_qp_bf {
        pub reg: *mut c_void,
        pub size: u32,
    }

    /// `struct mlx5dv_qp`.
    #[repr(C)]
    #[derive(Copy, Clone, Debug)]
    pub struct mlx5dv_qp {
        pub dbrec: *mut u32,
        pub sq: mlx5dv_qp_ring,
        pub rq: mlx5dv_qp_ring,
        pub bf: mlx5dv_qp_bf,
        pub comp_mask: u64,
        pub uar_mmap_offset: i64,
        pub tirn: u32,
        pub tisn: u32,
        pub rqn: u32,
        pub sqn: u32,
        pub tir_icm_addr: u64,
    }

    /// `struct mlx5dv_cq`.
    #[repr(C)]
    #[derive(Copy, Clone, Debug)]
    pub struct mlx5dv_cq {
        pub buf: *mut c_void,
        pub dbrec: *mut u32,
        pub cqe_cnt: u32,
        pub cqe_size: u32,
        pub cq_uar: *mut c_void,
        pub cqn: u32,
        pub comp_mask: u64,
    }

    #[repr(C)]
    #[derive(Copy, Clone, Debug)]
    pub struct mlx5dv_obj_pair {
        pub in_: *mut c_void,
        pub out: *mut c_void,
    }

    /// `struct mlx5dv_obj`: qp, cq, srq, rwq, dm, ah, pd (in, out) pairs.
    #[repr(C)]
    #[derive(Copy, Clone, Debug)]
    pub struct mlx5dv_obj {
        pub qp: mlx5dv_obj_pair,
        pub cq: mlx5dv_obj_pair,
        pub srq: mlx5dv_obj_pair,
        pub rwq: mlx5dv_obj_pair,
        pub dm: mlx5dv_obj_pair,
        pub ah: mlx5dv_obj_pair,
        pub pd: mlx5dv_obj_pair,
    }

    /// `struct mlx5dv_cqe_comp_caps`.
    #[repr(C)]
    #[derive(Copy, Clone, Debug, Default)]
    pub struct mlx5dv_cqe_comp_caps {
        pub max_num: u32,
        pub supported_format: u32,
    }

    /// The leading members of `struct mlx5dv_context`, up to `cqe_comp_caps`: all that
    /// `mlx5dv_query_device` writes when only `MLX5DV_CONTEXT_MASK_CQE_COMPRESION` is asked
    /// for (rdma-core `_mlx5dv_query_device`), passed at the start of a zeroed buffer of the
    /// whole struct's size ([`MLX5DV_CONTEXT_SIZE`]).
    #[repr(C)]
    #[derive(Copy, Clone, Debug, Default)]
    pub struct mlx5dv_context {
        pub version: u8,
        pub flags: u64,
        pub comp_mask: u64,
        pub cqe_comp_caps: mlx5dv_cqe_comp_caps,
    }

    /// `sizeof(struct mlx5dv_context)` in rdma-core 44 (checked by `mlx5-hdrcheck`); newer
    /// libraries only read and write the members their `comp_mask` bits name.
    pub const MLX5DV_CONTEXT_SIZE: usize = 152;

    /// `struct mlx5dv_cq_init_attr`.
    #[repr(C)]
    #[derive(Copy, Clone, Debug, Default)]
    pub struct mlx5dv_cq_init_attr {
        pub comp_mask: u64,
        pub cqe_comp_res_format: u8,
        pub flags: u32,
        pub cqe_size: u16,
    }

    /// `struct mlx5dv_srq`.
    #[repr(C)]
    #[derive(Copy, Clone, Debug)]
    pub struct mlx5dv_srq {
        pub buf: *mut c_void,
        pub dbrec: *mut u32,
        pub stride: u32,
        pub head: u32,
        pub tail: u32,
        pub comp_mask: u64,
        pub srqn: u32,
    }

    /// `MLX5DV_SRQ_MASK_SRQN`: asks `mlx5dv_init_obj` for `srqn`.
    pub const MLX5DV_SRQ_MASK_SRQN: u64 = 1 << 0;
    /// `MLX5DV_OBJ_SRQ`.
    pub const MLX5DV_OBJ_SRQ: u64 = 1 << 2;
    /// `MLX5DV_OBJ_QP`.
    pub const MLX5DV_OBJ_QP: u64 = 1 << 0;
    /// `MLX5DV_OBJ_CQ`.
    pub const MLX5DV_OBJ_CQ: u64 = 1 << 1;

    /// `struct mlx5dv_ah`: the provider's own address vector of an `ibv_ah`.
    #[repr(C)]
    #[derive(Copy, Clone, Debug)]
    pub struct mlx5dv_ah {
        /// `struct mlx5_wqe_av *`: 48 bytes inside the provider's `mlx5_ah`.
        pub av: *mut c_void,
        pub comp_mask: u64,
    }

    /// `MLX5DV_OBJ_AH`.
    pub const MLX5DV_OBJ_AH: u64 = 1 << 5;
}

type InitObj = unsafe extern "C" fn(*mut ffi::mlx5dv_obj, u64) -> i32;
type IsSupported = unsafe extern "C" fn(*mut c_void) -> bool;
/// `mlx5dv_query_device(struct ibv_context *, struct mlx5dv_context *)`.
type QueryDevice = unsafe extern "C" fn(*mut c_void, *mut ffi::mlx5dv_context) -> i32;
/// `mlx5dv_create_cq(struct ibv_context *, struct ibv_cq_init_attr_ex *,
/// struct mlx5dv_cq_init_attr *)`, returning a `struct ibv_cq_ex *`.
type CreateCq = unsafe extern "C" fn(
    *mut c_void,
    *mut rdma_sys::ibv_cq_init_attr_ex,
    *mut ffi::mlx5dv_cq_init_attr,
) -> *mut c_void;

/// Every libmlx5 symbol the crate calls, with the version rdma-core's
/// `providers/mlx5/libmlx5.map` gives it. Each is looked up with `dlvsym` at that version:
/// `mlx5dv_init_obj` exists twice (`@MLX5_1.0` is a compat entry that fills `mlx5dv_cq.cq_uar`
/// differently from the default `@@MLX5_1.2`), and an unversioned `dlsym` would take
/// whichever definition the loader finds first.
pub const SYMBOLS: [(&std::ffi::CStr, &std::ffi::CStr); 4] = [
    (c"mlx5dv_init_obj", c"MLX5_1.2"),
    (c"mlx5dv_is_supported", c"MLX5_1.8"),
    (c"mlx5dv_query_device", c"MLX5_1.0"),
    (c"mlx5dv_create_cq", c"MLX5_1.1"),
];

/// `dlvsym(handle, name, version)`.
///
/// # Safety
/// `handle` must be a live `dlopen` handle.
unsafe fn versioned(
    handle: *mut c_void,
    (name, version): (&std::ffi::CStr, &std::ffi::CStr),
) -> *mut c_void {
    // SAFETY: live handle (caller contract), NUL-terminated names.
    unsafe { libc::dlvsym(handle, name.as_ptr(), version.as_ptr()) }
}

struct Lib {
    init_obj: InitObj,
    is_supported: IsSupported,
    query_device: QueryDevice,
    create_cq: CreateCq,
}

fn lib() -> Option<&'static Lib> {
    static LIB: OnceLock<Option<Lib>> = OnceLock::new();
    LIB.get_or_init(|| {
        // SAFETY: dlopen/dlvsym with NUL-terminated names; the handle is never closed, so the
        // function pointers stay valid for the life of the process. The symbols, at these
        // versions, have the signatures declared in mlx5dv.h.
        unsafe {
            let h = libc::dlopen(c"libmlx5.so.1".as_ptr(), libc::RTLD_NOW);
            if h.is_null() {
                return None;
            }
            let [init, sup, query, create] = SYMBOLS.map(|s| versioned(h, s));
            if [init, sup, query, create].iter().any(|p| p.is_null()) {
                return None;
            }
            Some(Lib {
                init_obj: std::mem::transmute::<*mut c_void, InitObj>(init),
                is_supported: std::mem::transmute::<*mut c_void, IsSupported>(sup),
                query_device: std::mem::transmute::<*mut c_void, QueryDevice>(query),
                create_cq: std::mem::transmute::<*mut c_void, CreateCq>(create),
            })
        }
    })
    .as_ref()
}

/// Whether `device` (an `ibv_device *`) is an mlx5 device (`mlx5dv_is_supported`).
///
/// # Safety
/// `device` must be a live `ibv_device` pointer.
pub unsafe fn is_mlx5(device: *mut c_void) -> bool {
    // SAFETY: the caller passes a live device; the function only reads it.
    lib().is_some_and(|l| unsafe { (l.is_supported)(device) })
}

/// What an mlx5 device reports of CQE compression (`mlx5dv_query_device` with
/// `MLX5DV_CONTEXT_MASK_CQE_COMPRESION`), None when the library cannot tell.
///
/// # Safety
/// `ctx` must be a live `ibv_context` of an mlx5 device.
pub unsafe fn cqe_comp_caps(ctx: *mut c_void) -> Option<mlx5::CqeCompCaps> {
    let l = lib()?;
    // A zeroed 8-aligned buffer of more than the whole struct (room for a newer library's
    // larger one), its head as declared.
    let mut buf = [0u64; 4 * ffi::MLX5DV_CONTEXT_SIZE / 8];
    let head = buf.as_mut_ptr().cast::<ffi::mlx5dv_context>();
    // SAFETY: `buf` is 8-aligned and larger than the head; `comp_mask` is an input.
    unsafe { (*head).comp_mask = mlx5::cqe::CONTEXT_MASK_CQE_COMPRESSION };
    // SAFETY: live mlx5 context (caller contract); the buffer has the size of the struct
    // the library writes, and it writes only what `comp_mask` asks for.
    if unsafe { (l.query_device)(ctx, head) } != 0 {
        return None;
    }
    // SAFETY: written by the library (or still zero).
    let out = unsafe { *head };
    if out.comp_mask & mlx5::cqe::CONTEXT_MASK_CQE_COMPRESSION == 0 {
        return Some(mlx5::CqeCompCaps::default());
    }
    Some(mlx5::CqeCompCaps {
        max_num: out.cqe_comp_caps.max_num,
        supported_format: out.cqe_comp_caps.supported_format,
        cqe_128: out.flags & mlx5::cqe::CONTEXT_FLAGS_CQE_128B_COMP != 0,
    })
}

/// A CQ of at least `entries` entries whose CQEs the device compresses with mini-CQEs of
/// `format` (`mlx5dv_create_cq` with `MLX5DV_CQ_INIT_ATTR_MASK_COMPRESSED_CQE`), its
/// completion events on `channel` (an `ibv_comp_channel *`, or null), as an `ibv_cq *`
/// (`ibv_cq_ex_to_cq` is a cast) to destroy with `ibv_destroy_cq`.
///
/// # Safety
/// `ctx` must be a live `ibv_context` of an mlx5 device, `channel` null or a live channel
/// of it.
///
/// # Errors
/// [`Error::Unsupported`] without libmlx5; the `mlx5dv_create_cq` error (EINVAL when the
/// device does not support the format).
pub unsafe fn create_cq_compressed(
    ctx: *mut c_void,
    entries: u32,
    format: mlx5::MiniCqeFormat,
    channel: *mut c_void,
) -> Result<*mut c_void> {
    let l = lib().ok_or(Error::Unsupported("libmlx5.so.1 (mlx5dv_create_cq)"))?;
    let mut attr = rdma_sys::ibv_cq_init_attr_ex {
        cqe: entries,
        cq_context: std::ptr::null_mut(),
        channel: channel.cast(),
        comp_vector: 0,
        wc_flags: 0,
        comp_mask: 0,
        flags: 0,
        parent_domain: std::ptr::null_mut(),
    };
    let mut dv = ffi::mlx5dv_cq_init_attr {
        comp_mask: mlx5::cqe::CQ_INIT_ATTR_MASK_COMPRESSED_CQE,
        cqe_comp_res_format: format as u8,
        ..Default::default()
    };
    // SAFETY: live mlx5 context (caller contract); both attribute structs are initialised
    // and outlive the call.
    let cq = unsafe { (l.create_cq)(ctx, &mut attr, &mut dv) };
    if cq.is_null() {
        return Err(crate::verbs::last("mlx5dv_create_cq").into());
    }
    Ok(cq)
}

/// The path a QP runs: `BLUEFLAME_PATH` (`direct`, `verbs` or `auto`) against what the
/// device can do.
///
/// # Errors
/// [`Error::Unsupported`] for `direct` on a device that is not mlx5;
/// [`Error::InvalidParameter`] for another value.
pub fn choose(mlx5: bool, var: Option<&str>) -> Result<DataPath> {
    match (var.unwrap_or("auto"), mlx5) {
        ("auto", true) | ("direct", true) => Ok(DataPath::Direct),
        ("auto", false) | ("verbs", _) => Ok(DataPath::Verbs),
        ("direct", false) => Err(Error::Unsupported(
            "BLUEFLAME_PATH=direct on a device that is not mlx5",
        )),
        (other, _) => Err(Error::InvalidParameter {
            what: "BLUEFLAME_PATH (direct|verbs|auto)",
            value: other.len() as u64,
        }),
    }
}

/// Runs `mlx5dv_init_obj` for a QP and its CQs.
///
/// # Safety
/// The pointers must be live `ibv_qp` / `ibv_cq` of an mlx5 device.
///
/// # Errors
/// [`Error::Unsupported`] without libmlx5; the `mlx5dv_init_obj` error.
pub unsafe fn init_qp(qp: *mut c_void) -> Result<ffi::mlx5dv_qp> {
    let l = lib().ok_or(Error::Unsupported("libmlx5.so.1 not found"))?;
    // SAFETY: plain-old-data out-parameter, zero is a valid value.
    let mut out: ffi::mlx5dv_qp = unsafe { std::mem::zeroed() };
    // SAFETY: zeroed pairs are valid (null in/out for unused objects).
    let mut obj: ffi::mlx5dv_obj = unsafe { std::mem::zeroed() };
    obj.qp = ffi::mlx5dv_obj_pair {
        in_: qp,
        out: (&mut out as *mut ffi::mlx5dv_qp).cast(),
    };
    // SAFETY: the caller passes a live mlx5 QP; `out` outlives the call.
    let rc = unsafe { (l.init_obj)(&mut obj, ffi::MLX5DV_OBJ_QP) };
    if rc != 0 {
        return Err(Error::Verbs(crate::verbs::code(
            "mlx5dv_init_obj",
            rc.abs(),
        )));
    }
    Ok(out)
}

/// Runs `mlx5dv_init_obj` for a CQ.
///
/// # Safety
/// `cq` must be a live `ibv_cq` of an mlx5 device.
///
/// # Errors
/// As [`init_qp`].
pub unsafe fn init_cq(cq: *mut c_void) -> Result<ffi::mlx5dv_cq> {
    let l = lib().ok_or(Error::Unsupported("libmlx5.so.1 not found"))?;
    // SAFETY: as in init_qp.
    let mut out: ffi::mlx5dv_cq = unsafe { std::mem::zeroed() };
    // SAFETY: as in init_qp.
    let mut obj: ffi::mlx5dv_obj = unsafe { std::mem::zeroed() };
    obj.cq = ffi::mlx5dv_obj_pair {
        in_: cq,
        out: (&mut out as *mut ffi::mlx5dv_cq).cast(),
    };
    // SAFETY: the caller passes a live mlx5 CQ; `out` outlives the call.
    let rc = unsafe { (l.init_obj)(&mut obj, ffi::MLX5DV_OBJ_CQ) };
    if rc != 0 {
        return Err(Error::Verbs(crate::verbs::code(
            "mlx5dv_init_obj",
            rc.abs(),
        )));
    }
    Ok(out)
}

/// Runs `mlx5dv_init_obj` for an SRQ, asking for its number (`MLX5DV_SRQ_MASK_SRQN`).
///
/// # Safety
/// `srq` must be a live `ibv_srq` of an mlx5 device.
///
/// # Errors
/// As [`init_qp`].
pub unsafe fn init_srq(srq: *mut c_void) -> Result<ffi::mlx5dv_srq> {
    let l = lib().ok_or(Error::Unsupported("libmlx5.so.1 not found"))?;
    // SAFETY: as in init_qp.
    let mut out: ffi::mlx5dv_srq = unsafe { std::mem::zeroed() };
    out.comp_mask = ffi::MLX5DV_SRQ_MASK_SRQN;
    // SAFETY: as in init_qp.
    let mut obj: ffi::mlx5dv_obj = unsafe { std::mem::zeroed() };
    obj.srq = ffi::mlx5dv_obj_pair {
        in_: srq,
        out: (&mut out as *mut ffi::mlx5dv_srq).cast(),
    };
    // SAFETY: the caller passes a live mlx5 SRQ; `out` outlives the call.
    let rc = unsafe { (l.init_obj)(&mut obj, ffi::MLX5DV_OBJ_SRQ) };
    if rc != 0 {
        return Err(Error::Verbs(crate::verbs::code(
            "mlx5dv_init_obj",
            rc.abs(),
        )));
    }
    Ok(out)
}

/// Runs `mlx5dv_init_obj` for an address handle (`MLX5DV_OBJ_AH`): the provider's address
/// vector, which `mlx5_create_ah` filled (`rlid`, `fl_mlid`, `stat_rate_sl`, the GRH fields,
/// `rmac` on RoCE) and which UD and DC sends copy into their datagram segment.
///
/// # Safety
/// `ah` must be a live `ibv_ah` of an mlx5 device.
///
/// # Errors
/// As [`init_qp`].
pub unsafe fn init_ah(ah: *mut c_void) -> Result<ffi::mlx5dv_ah> {
    let l = lib().ok_or(Error::Unsupported("libmlx5.so.1 not found"))?;
    let mut out = ffi::mlx5dv_ah {
        av: std::ptr::null_mut(),
        comp_mask: 0,
    };
    // SAFETY: as in init_qp: every member of mlx5dv_obj is a pointer pair; null is valid.
    let mut obj: ffi::mlx5dv_obj = unsafe { std::mem::zeroed() };
    obj.ah = ffi::mlx5dv_obj_pair {
        in_: ah,
        out: (&mut out as *mut ffi::mlx5dv_ah).cast(),
    };
    // SAFETY: the caller passes a live mlx5 AH; `out` outlives the call.
    let rc = unsafe { (l.init_obj)(&mut obj, ffi::MLX5DV_OBJ_AH) };
    if rc != 0 {
        return Err(Error::Verbs(crate::verbs::code(
            "mlx5dv_init_obj",
            rc.abs(),
        )));
    }
    Ok(out)
}

/// A copy of the address vector `mlx5dv_init_obj(MLX5DV_OBJ_AH)` points to.
///
/// # Safety
/// `dv.av`, when not null, must point to 48 readable bytes (the provider's `mlx5_wqe_av`,
/// alive while its `ibv_ah` is).
///
/// # Errors
/// [`Error::InvalidParameter`] for a null AV (a library that did not fill it).
pub unsafe fn av_of(dv: &ffi::mlx5dv_ah) -> Result<mlx5::av::Av> {
    if dv.av.is_null() {
        return Err(Error::InvalidParameter {
            what: "mlx5dv_ah.av (null)",
            value: 0,
        });
    }
    let mut bytes = [0u8; mlx5::av::AV_BYTES];
    // SAFETY: the caller's contract: 48 readable bytes at `dv.av`; `bytes` is 48 bytes of
    // our own; the two do not overlap.
    unsafe { std::ptr::copy_nonoverlapping(dv.av as *const u8, bytes.as_mut_ptr(), bytes.len()) };
    Ok(mlx5::av::Av::from_bytes(&bytes))
}

/// The ring description of an SRQ from what `mlx5dv_init_obj` returned, for receives of
/// at most `max_sge` entries (`ibv_create_srq`'s answer). The list's entries are the tail's
/// index plus one (rdma-core `mlx5_alloc_srq_buf`: `tail = align_queue_size(max_wr + 1) - 1`;
/// a wait queue, when rdma-core keeps one, lies past it and is never linked in); a fresh
/// SRQ's head is 0 (UCX `uct_ib_mlx5_srq_init` refuses any other).
///
/// # Errors
/// [`Error::InvalidParameter`] for a ring the direct path cannot drive (no SRQ number, a
/// head other than 0, a list length that is not a power of two, a stride below 32 or not a
/// power of two).
pub fn raw_srq(dv: &ffi::mlx5dv_srq, max_sge: u32) -> Result<RawSrq> {
    let bad = |what, value: u32| {
        Err(Error::InvalidParameter {
            what,
            value: value as u64,
        })
    };
    if dv.comp_mask & ffi::MLX5DV_SRQ_MASK_SRQN == 0 {
        return bad("mlx5dv_srq.comp_mask (no srqn)", dv.comp_mask as u32);
    }
    if dv.head != 0 {
        return bad("mlx5dv_srq.head", dv.head);
    }
    let cnt = dv.tail.wrapping_add(1);
    if !cnt.is_power_of_two() || !(2..=1 << 15).contains(&cnt) {
        return bad("mlx5dv_srq.tail", dv.tail);
    }
    if dv.stride < 32 || !dv.stride.is_power_of_two() || dv.stride > 512 {
        return bad("mlx5dv_srq.stride", dv.stride);
    }
    if dv.buf.is_null() || dv.dbrec.is_null() {
        return bad("mlx5dv_srq.buf", 0);
    }
    Ok(RawSrq {
        srqn: dv.srqn,
        buf: dv.buf.cast(),
        wqe_cnt: cnt,
        stride: dv.stride,
        dbrec: dv.dbrec,
        head: dv.head,
        tail: dv.tail,
        max_sge: max_sge.min(mlx5::srq::srq_max_sge(dv.stride)),
    })
}

/// The creation limits the library does not report in `mlx5dv_qp`.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct QpLimits {
    /// QP number.
    pub qpn: u32,
    /// `max_inline_data` as `ibv_create_qp` returned it.
    pub max_inline: u32,
    /// `max_send_sge`.
    pub max_send_sge: u32,
    /// `max_recv_sge`.
    pub max_recv_sge: u32,
}

/// The ring description of a QP from what `mlx5dv_init_obj` returned.
///
/// # Errors
/// [`Error::InvalidParameter`] for rings the direct path cannot drive (a send stride other
/// than 64, counts that are not powers of two, a BlueFlame size that is not a multiple of 64).
pub fn raw_qp(dv: &ffi::mlx5dv_qp, lim: &QpLimits) -> Result<RawQp> {
    let bad = |what, value: u32| {
        Err(Error::InvalidParameter {
            what,
            value: value as u64,
        })
    };
    if dv.sq.stride != 64 {
        return bad("mlx5dv_qp.sq.stride", dv.sq.stride);
    }
    if !dv.sq.wqe_cnt.is_power_of_two() || dv.sq.buf.is_null() {
        return bad("mlx5dv_qp.sq.wqe_cnt", dv.sq.wqe_cnt);
    }
    if dv.rq.wqe_cnt != 0 && (!dv.rq.wqe_cnt.is_power_of_two() || !dv.rq.stride.is_power_of_two()) {
        return bad("mlx5dv_qp.rq.wqe_cnt", dv.rq.wqe_cnt);
    }
    if dv.bf.size % 64 != 0 || (dv.bf.size != 0 && dv.bf.reg.is_null()) || dv.dbrec.is_null() {
        return bad("mlx5dv_qp.bf.size", dv.bf.size);
    }
    Ok(RawQp {
        qpn: lim.qpn,
        sq_buf: dv.sq.buf.cast(),
        sq_wqe_cnt: dv.sq.wqe_cnt,
        sq_stride: dv.sq.stride,
        rq_buf: dv.rq.buf.cast(),
        rq_wqe_cnt: dv.rq.wqe_cnt,
        rq_stride: dv.rq.stride,
        dbrec: dv.dbrec,
        // bf.size == 0 (no write-combining mapping): doorbell writes only, still at bf.reg.
        bf_reg: dv.bf.reg.cast(),
        bf_size: dv.bf.size,
        max_inline: lim.max_inline,
        max_send_sge: lim.max_send_sge,
        max_recv_sge: lim.max_recv_sge,
    })
}

/// The ring description of a CQ from what `mlx5dv_init_obj` returned.
///
/// # Errors
/// [`Error::InvalidParameter`] for a CQE size other than 64/128 or a count that is not a
/// power of two.
pub fn raw_cq(dv: &ffi::mlx5dv_cq) -> Result<RawCq> {
    if !(dv.cqe_size == 64 || dv.cqe_size == 128) {
        return Err(Error::InvalidParameter {
            what: "mlx5dv_cq.cqe_size",
            value: dv.cqe_size as u64,
        });
    }
    if !dv.cqe_cnt.is_power_of_two() || dv.buf.is_null() || dv.dbrec.is_null() {
        return Err(Error::InvalidParameter {
            what: "mlx5dv_cq.cqe_cnt",
            value: dv.cqe_cnt as u64,
        });
    }
    Ok(RawCq {
        cqn: dv.cqn,
        buf: dv.buf.cast(),
        cqe_cnt: dv.cqe_cnt,
        cqe_size: dv.cqe_size,
        dbrec: dv.dbrec,
        cq_uar: dv.cq_uar.cast(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ptr::null_mut;

    /// What `mlx5dv_init_obj(MLX5DV_OBJ_AH)` returns: a pointer to the AV inside the
    /// provider's `mlx5_ah` (here the bytes `mlx5_create_ah` writes for a global InfiniBand
    /// address, as `mlx5::av::Av::from_attr` makes them, which the oracle checks against
    /// rdma-core's own function).
    #[test]
    fn address_vector_from_the_library() {
        use mlx5::av::{Av, AvAttr, AvLink, GrhAttr};
        let made = Av::from_attr(&AvAttr {
            link: AvLink::Ib {
                dlid: 0x21,
                src_path_bits: 1,
                grh: Some(GrhAttr {
                    dgid: [0xfe; 16],
                    flow_label: 7,
                    sgid_index: 2,
                    hop_limit: 9,
                    traffic_class: 3,
                }),
            },
            sl: 4,
            static_rate: 0,
        });
        let mut provider = [0u8; 64]; // the AV sits inside a larger struct
        provider[8..56].copy_from_slice(&made.to_bytes());
        let dv = ffi::mlx5dv_ah {
            av: provider[8..].as_mut_ptr().cast(),
            comp_mask: 0,
        };
        // SAFETY: `dv.av` points to 48 readable bytes of `provider`.
        let av = unsafe { av_of(&dv) }.unwrap();
        assert_eq!(av, made);
        assert_eq!((av.rlid.get(), av.sl(false), av.sgid_index()), (0x21, 4, 2));
        let null = ffi::mlx5dv_ah {
            av: null_mut(),
            comp_mask: 0,
        };
        // SAFETY: a null AV is checked before any read.
        let refused = unsafe { av_of(&null) };
        assert!(matches!(refused, Err(Error::InvalidParameter { .. })));
    }

    /// A UD send on mlx5's direct path: rings from `mlx5dv_init_obj(MLX5DV_OBJ_QP)` of
    /// rdma-core's UD QP, the address vector from `mlx5dv_init_obj(MLX5DV_OBJ_AH)` of its
    /// `ibv_create_ah`. The WQE's datagram segment is the provider's AV byte for byte, with
    /// only the Q_Key (bytes 0..4) and the destination QP with `MLX5_EXTENDED_UD_AV` (bytes
    /// 8..12) written over it, as rdma-core's `set_datagram_seg` /
    /// `mlx5_send_wr_set_ud_addr` (`memcpy(&dseg->av, &mah->av, ...)`) and UCX's
    /// `uct_ib_mlx5_set_dgram_seg` build it.
    #[test]
    fn a_ud_send_on_library_rings_carries_the_providers_av() {
        use mlx5::av::{AvAttr, AvLink, DatagramSeg, GrhAttr};
        let made = mlx5::av::Av::from_attr(&AvAttr {
            link: AvLink::Ib {
                dlid: 0x33,
                src_path_bits: 0,
                grh: Some(GrhAttr {
                    dgid: [0xab; 16],
                    flow_label: 0x12345,
                    sgid_index: 1,
                    hop_limit: 64,
                    traffic_class: 5,
                }),
            },
            sl: 2,
            static_rate: 0,
        });
        let mut provider = [0u8; 80];
        provider[16..64].copy_from_slice(&made.to_bytes());
        let dv_ah = ffi::mlx5dv_ah {
            av: provider[16..].as_mut_ptr().cast(),
            comp_mask: 0,
        };
        // SAFETY: `dv_ah.av` points to 48 readable bytes of `provider`.
        let av = unsafe { av_of(&dv_ah) }.unwrap();
        let mut buf = vec![0u8; 1024 + 256 * 64];
        let (mut db, mut bf) = ([0u32; 2], vec![0u8; 512]);
        let dv = cx5(&mut buf, &mut db, &mut bf, 256);
        let raw = raw_qp(&dv, &LIM).unwrap();
        // SAFETY: the rings above outlive the queue (dropped at the end of the test).
        let mut sq = unsafe { crate::direct::SendQueue::new(&raw) }.unwrap();
        let send = mlx5::wqe::UdSend {
            dgram: DatagramSeg::ud(&av, 0x4321, 0x1111_2222),
            data: crate::Payload::Inline(b"hello"),
            imm: None,
        };
        sq.post_ud(&send, 9, crate::PostFlags::SIGNALED).unwrap();
        drop(sq);
        let wqe = &buf[1024..1024 + 128];
        // Control segment: opcode SEND, the QP number, the size in 16-byte units
        // (control 1 + datagram 3 + inline 1).
        assert_eq!(wqe[3], 0x0a, "MLX5_OPCODE_SEND");
        assert_eq!(
            u32::from_be_bytes(wqe[4..8].try_into().unwrap()),
            0x1234 << 8 | 5
        );
        let dseg = &wqe[16..64];
        let mut want = made.to_bytes();
        want[0..4].copy_from_slice(&0x1111_2222u32.to_be_bytes());
        want[8..12].copy_from_slice(&(0x4321u32 | 0x8000_0000).to_be_bytes());
        assert_eq!(dseg, &want[..]);
        // The bytes rdma-core does not overwrite are the provider's (GRH, LID, SL).
        assert_eq!(&dseg[12..48], &provider[16 + 12..64]);
        // The inline segment: byte count with MLX5_INLINE_SEG, then the data.
        assert_eq!(
            u32::from_be_bytes(wqe[64..68].try_into().unwrap()),
            0x8000_0000 | 5
        );
        assert_eq!(&wqe[68..73], b"hello");
        // The doorbell record's send counter in 64-byte blocks: 80 bytes take two
        // (rdma-core `qp->sq.cur_post += DIV_ROUND_UP(size * 16, MLX5_SEND_WQE_BB)`).
        assert_eq!(u32::from_be(db[1]), 2);
    }

    /// What rdma-core 55's `mlx5dv_get_srq` returns for `ibv_create_srq(max_wr 100,
    /// max_sge 2)` on a ConnectX: a ring of 512 WQEs (`2 * 100 + 1` rounded up, the upper
    /// half the ODP wait queue), the main list 0 ..= 127, a stride of 64, the number asked
    /// for with `MLX5DV_SRQ_MASK_SRQN`.
    #[test]
    fn srq_description_from_the_library() {
        let mut buf = vec![0u8; 512 * 64];
        let mut db = [0u32; 2];
        let dv = ffi::mlx5dv_srq {
            buf: buf.as_mut_ptr().cast(),
            dbrec: db.as_mut_ptr(),
            stride: 64,
            head: 0,
            tail: 127,
            comp_mask: ffi::MLX5DV_SRQ_MASK_SRQN,
            srqn: 0x1234,
        };
        let raw = raw_srq(&dv, 2).unwrap();
        assert_eq!((raw.srqn, raw.wqe_cnt, raw.stride), (0x1234, 128, 64));
        assert_eq!((raw.head, raw.tail, raw.max_sge), (0, 127, 2));
        assert_eq!(raw.buf, buf.as_mut_ptr());
        // The library's max_sge is kept below what the stride holds (3 for 64 bytes).
        assert_eq!(raw_srq(&dv, 7).unwrap().max_sge, 3);
        // An older library that ignores the mask, a used SRQ, odd rings: refused.
        for bad in [
            ffi::mlx5dv_srq { comp_mask: 0, ..dv },
            ffi::mlx5dv_srq { head: 5, ..dv },
            ffi::mlx5dv_srq { tail: 100, ..dv },
            ffi::mlx5dv_srq { stride: 16, ..dv },
            ffi::mlx5dv_srq {
                dbrec: null_mut(),
                ..dv
            },
        ] {
            assert!(matches!(
                raw_srq(&bad, 2),
                Err(Error::InvalidParameter { .. })
            ));
        }
    }

    /// What rdma-core returns for a ConnectX-5 RC QP of 256 send WQEs (sq.wqe_cnt in
    /// blocks), 64 receives of 1 SGE, with a write-combining BlueFlame register of 256 bytes.
    fn cx5(buf: &mut [u8], dbrec: &mut [u32; 2], bf: &mut [u8], bf_size: u32) -> ffi::mlx5dv_qp {
        ffi::mlx5dv_qp {
            dbrec: dbrec.as_mut_ptr(),
            sq: ffi::mlx5dv_qp_ring {
                buf: buf[1024..].as_mut_ptr().cast(),
                wqe_cnt: 256,
                stride: 64,
            },
            rq: ffi::mlx5dv_qp_ring {
                buf: buf.as_mut_ptr().cast(),
                wqe_cnt: 64,
                stride: 16,
            },
            bf: ffi::mlx5dv_qp_bf {
                reg: bf.as_mut_ptr().cast(),
                size: bf_size,
            },
            comp_mask: 0,
            uar_mmap_offset: 0,
            tirn: 0,
            tisn: 0,
            rqn: 0,
            sqn: 0,
            tir_icm_addr: 0,
        }
    }

    const LIM: QpLimits = QpLimits {
        qpn: 0x1234,
        max_inline: 220,
        max_send_sge: 30,
        max_recv_sge: 1,
    };

    #[test]
    fn qp_fields_map_one_to_one() {
        let mut buf = vec![0u8; 1024 + 256 * 64];
        let (mut db, mut bf) = ([0u32; 2], vec![0u8; 512]);
        let dv = cx5(&mut buf, &mut db, &mut bf, 256);
        let raw = raw_qp(&dv, &LIM).unwrap();
        assert_eq!(raw.sq_buf as usize, buf[1024..].as_ptr() as usize);
        assert_eq!(
            (raw.sq_wqe_cnt, raw.sq_stride, raw.rq_wqe_cnt, raw.rq_stride),
            (256, 64, 64, 16)
        );
        assert_eq!(
            (raw.bf_size, raw.bf_reg as usize),
            (256, bf.as_ptr() as usize)
        );
        assert_eq!(
            (raw.qpn, raw.max_inline, raw.max_send_sge, raw.max_recv_sge),
            (0x1234, 220, 30, 1)
        );
        assert_eq!(raw.dbrec, db.as_mut_ptr());
    }

    #[test]
    fn bf_size_zero_means_doorbell_only() {
        let mut buf = vec![0u8; 1024 + 256 * 64];
        let (mut db, mut bf) = ([0u32; 2], vec![0u8; 64]);
        let dv = cx5(&mut buf, &mut db, &mut bf, 0);
        let raw = raw_qp(&dv, &LIM).unwrap();
        assert_eq!(raw.bf_size, 0);
        // The direct path accepts it and will only ever write 8-byte doorbells.
        // SAFETY: the rings above live for the queue's lifetime.
        let sq = unsafe { crate::direct::SendQueue::new(&raw) }.unwrap();
        assert_eq!(sq.bf_size(), 0);
    }

    #[test]
    fn refuses_rings_it_cannot_drive() {
        let mut buf = vec![0u8; 1024 + 256 * 64];
        let (mut db, mut bf) = ([0u32; 2], vec![0u8; 512]);
        let mut dv = cx5(&mut buf, &mut db, &mut bf, 256);
        dv.sq.stride = 128;
        assert!(matches!(
            raw_qp(&dv, &LIM),
            Err(Error::InvalidParameter {
                what: "mlx5dv_qp.sq.stride",
                value: 128
            })
        ));
        dv.sq.stride = 64;
        dv.sq.wqe_cnt = 100;
        assert!(matches!(
            raw_qp(&dv, &LIM),
            Err(Error::InvalidParameter {
                what: "mlx5dv_qp.sq.wqe_cnt",
                value: 100
            })
        ));
        dv.sq.wqe_cnt = 256;
        dv.bf.size = 100;
        assert!(matches!(
            raw_qp(&dv, &LIM),
            Err(Error::InvalidParameter {
                what: "mlx5dv_qp.bf.size",
                value: 100
            })
        ));
    }

    #[test]
    fn cq_fields_and_128_byte_cqes() {
        let mut ring = vec![0u8; 128 * 64];
        let mut db = [0u32; 2];
        let dv = ffi::mlx5dv_cq {
            buf: ring.as_mut_ptr().cast(),
            dbrec: db.as_mut_ptr(),
            cqe_cnt: 64,
            cqe_size: 128,
            cq_uar: null_mut(),
            cqn: 0x55,
            comp_mask: 0,
        };
        let raw = raw_cq(&dv).unwrap();
        assert_eq!((raw.cqn, raw.cqe_cnt, raw.cqe_size), (0x55, 64, 128));
        // All entries zero would look valid (opcode 0, owner 0): mark them invalid as the
        // library does.
        for e in ring.chunks_mut(128) {
            e[127] = 0xf0;
        }
        // SAFETY: the ring and record above live longer than the poller.
        let mut cq = unsafe { crate::direct::CompletionQueue::new(&raw) }.unwrap();
        let mut out = [crate::Completion::default(); 4];
        assert_eq!(cq.poll(&mut out), 0);
        let bad = ffi::mlx5dv_cq { cqe_size: 32, ..dv };
        assert!(matches!(
            raw_cq(&bad),
            Err(Error::InvalidParameter {
                what: "mlx5dv_cq.cqe_size",
                value: 32
            })
        ));
    }

    /// The installed libmlx5 (Debian's rdma-core) has every symbol at the version the crate
    /// asks for; `mlx5dv_init_obj` has a second, compat definition at MLX5_1.0 which is not
    /// the one used; a version that does not exist gives nothing.
    #[test]
    fn symbols_are_looked_up_at_their_versions() {
        // SAFETY: dlopen of a library name; the handle is only used below and never closed.
        let h = unsafe { libc::dlopen(c"libmlx5.so.1".as_ptr(), libc::RTLD_NOW) };
        if h.is_null() {
            eprintln!("libmlx5.so.1 not installed: nothing to check");
            return;
        }
        let l = lib().expect("libmlx5 loads with every versioned symbol");
        for sym in SYMBOLS {
            // SAFETY: live handle.
            assert!(!unsafe { versioned(h, sym) }.is_null(), "{sym:?}");
        }
        // SAFETY: live handle.
        let (v12, v10) = unsafe {
            (
                versioned(h, (c"mlx5dv_init_obj", c"MLX5_1.2")),
                versioned(h, (c"mlx5dv_init_obj", c"MLX5_1.0")),
            )
        };
        assert!(!v10.is_null(), "the compat definition exists");
        assert_ne!(v12, v10);
        assert_eq!(
            l.init_obj as usize, v12 as usize,
            "MLX5_1.2, not the compat"
        );
        // SAFETY: live handle.
        let sup = unsafe { versioned(h, SYMBOLS[1]) };
        assert_eq!(l.is_supported as usize, sup as usize);
        // SAFETY: live handle.
        let wrong = unsafe { versioned(h, (c"mlx5dv_is_supported", c"MLX5_1.0")) };
        assert!(wrong.is_null(), "no such version: nothing is used");
    }

    #[test]
    fn path_choice() {
        assert_eq!(choose(true, None).unwrap(), DataPath::Direct);
        assert_eq!(choose(false, None).unwrap(), DataPath::Verbs);
        assert_eq!(choose(true, Some("verbs")).unwrap(), DataPath::Verbs);
        assert_eq!(choose(true, Some("direct")).unwrap(), DataPath::Direct);
        assert!(matches!(
            choose(false, Some("direct")),
            Err(Error::Unsupported(_))
        ));
        assert!(matches!(
            choose(false, Some("fast")),
            Err(Error::InvalidParameter { .. })
        ));
    }
}
