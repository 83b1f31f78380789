//! The mlx5dv binding: turns a verbs QP and CQ on a ConnectX into the [`RawQp`] / [`RawCq`]
//! of the direct path. This is the only code that talks to mlx5 hardware resources, so it is
//! kept small: the structs are declared by hand exactly as `infiniband/mlx5dv.h` (rdma-core 44)
//! declares them (their layouts are checked against the header by `mlx5-hdrcheck`), the
//! library is loaded with `dlopen` only when an mlx5 device is used, and the conversion to raw
//! ring descriptions is a pure function tested with the structs the library returns.
//!
//! Reviewed against rdma-core `providers/mlx5/mlx5.c` (`mlx5dv_get_qp`, `mlx5dv_get_cq`) and
//! UCX `uct_ib_mlx5_get_txwq` / `uct_ib_mlx5_get_cq`.

use crate::data_path::DataPath;
use crate::error::{Error, Result};
use mlx5::{RawCq, RawQp, RawSrq};
use std::ffi::c_void;
use std::sync::OnceLock;

pub mod dc;
pub mod ffi;

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
/// `mlx5dv_create_qp(struct ibv_context *, struct ibv_qp_init_attr_ex *,
/// struct mlx5dv_qp_init_attr *)`, returning a `struct ibv_qp *`.
type CreateQp = unsafe extern "C" fn(
    *mut c_void,
    *mut rdma_sys::ibv_qp_init_attr_ex,
    *mut ffi::mlx5dv_qp_init_attr,
) -> *mut rdma_sys::ibv_qp;

/// `mlx5dv_get_clock_info(struct ibv_context *, struct mlx5dv_clock_info *)`.
type GetClockInfo = unsafe extern "C" fn(*mut c_void, *mut ffi::mlx5dv_clock_info) -> i32;

/// `mlx5dv_get_clock_info` at its version (`MLX5_1.4`): looked up on its own, so that a
/// library without it keeps the direct path (and refuses completion timestamps).
pub const CLOCK_INFO_SYMBOL: (&std::ffi::CStr, &std::ffi::CStr) =
    (c"mlx5dv_get_clock_info", c"MLX5_1.4");

/// Every libmlx5 symbol the crate calls, with the version rdma-core's
/// `providers/mlx5/libmlx5.map` gives it. Each is looked up with `dlvsym` at that version:
/// `mlx5dv_init_obj` exists twice (`@MLX5_1.0` is a compat entry that fills `mlx5dv_cq.cq_uar`
/// differently from the default `@@MLX5_1.2`), and an unversioned `dlsym` would take
/// whichever definition the loader finds first.
pub const SYMBOLS: [(&std::ffi::CStr, &std::ffi::CStr); 5] = [
    (c"mlx5dv_init_obj", c"MLX5_1.2"),
    (c"mlx5dv_is_supported", c"MLX5_1.8"),
    (c"mlx5dv_query_device", c"MLX5_1.0"),
    (c"mlx5dv_create_cq", c"MLX5_1.1"),
    (c"mlx5dv_create_qp", c"MLX5_1.3"),
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
    create_qp: CreateQp,
    get_clock_info: Option<GetClockInfo>,
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
            let [init, sup, query, create, create_qp] = SYMBOLS.map(|s| versioned(h, s));
            if [init, sup, query, create, create_qp]
                .iter()
                .any(|p| p.is_null())
            {
                return None;
            }
            Some(Lib {
                init_obj: std::mem::transmute::<*mut c_void, InitObj>(init),
                is_supported: std::mem::transmute::<*mut c_void, IsSupported>(sup),
                query_device: std::mem::transmute::<*mut c_void, QueryDevice>(query),
                create_cq: std::mem::transmute::<*mut c_void, CreateCq>(create),
                create_qp: std::mem::transmute::<*mut c_void, CreateQp>(create_qp),
                get_clock_info: {
                    let p = versioned(h, CLOCK_INFO_SYMBOL);
                    (!p.is_null()).then(|| std::mem::transmute::<*mut c_void, GetClockInfo>(p))
                },
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
    let mask = mlx5::cqe::CONTEXT_MASK_CQE_COMPRESSION;
    // SAFETY: the caller's contract.
    let buf = unsafe { query_device(ctx, mask) }?;
    // SAFETY: the buffer starts with the struct's head, 8-aligned, written by the library
    // (or still zero).
    let out = unsafe { *buf.as_ptr().cast::<ffi::mlx5dv_context>() };
    if out.comp_mask & mask == 0 {
        return Some(mlx5::CqeCompCaps::default());
    }
    Some(mlx5::CqeCompCaps {
        max_num: out.cqe_comp_caps.max_num,
        supported_format: out.cqe_comp_caps.supported_format,
        cqe_128: out.flags & mlx5::cqe::CONTEXT_FLAGS_CQE_128B_COMP != 0,
    })
}

/// The kernel's clock-info page of an mlx5 device now (`mlx5dv_get_clock_info`: a copy
/// read under the page's sequence count, no system call); None without the function or
/// the page (a kernel that does not offer it).
///
/// # Safety
/// `ctx` must be a live `ibv_context` of an mlx5 device.
pub unsafe fn clock_info(ctx: *mut c_void) -> Option<mlx5::clock::ClockInfo> {
    let f = lib()?.get_clock_info?;
    let mut c = ffi::mlx5dv_clock_info::default();
    // SAFETY: live mlx5 context (caller contract); `c` is the struct the function fills
    // (`ClockInfo` has its layout).
    (unsafe { f(ctx, &mut c) } == 0).then_some(c)
}

/// Whether an mlx5 device stamps completions in real time (`mlx5dv_query_device`'s
/// `MLX5DV_CONTEXT_FLAGS_REAL_TIME_TS`); false when the library cannot tell.
///
/// # Safety
/// `ctx` must be a live `ibv_context` of an mlx5 device.
pub unsafe fn real_time_stamps(ctx: *mut c_void) -> bool {
    // SAFETY: the caller's contract.
    let Some(buf) = (unsafe { query_device(ctx, 0) }) else {
        return false;
    };
    // SAFETY: the buffer starts with the struct's head, 8-aligned, written by the library.
    let out = unsafe { *buf.as_ptr().cast::<ffi::mlx5dv_context>() };
    out.flags & ffi::MLX5DV_CONTEXT_FLAGS_REAL_TIME_TS != 0
}

/// `mlx5dv_query_device` asking for the members `mask` names: the struct as the library
/// wrote it, in a zeroed 8-aligned buffer of more than the whole struct (room for a newer
/// library's larger one); None without libmlx5 or when the query fails.
///
/// # Safety
/// `ctx` must be a live `ibv_context` of an mlx5 device.
unsafe fn query_device(
    ctx: *mut c_void,
    mask: u64,
) -> Option<[u64; 4 * ffi::MLX5DV_CONTEXT_SIZE / 8]> {
    let l = lib()?;
    let mut buf = [0u64; 4 * ffi::MLX5DV_CONTEXT_SIZE / 8];
    let head = buf.as_mut_ptr().cast::<ffi::mlx5dv_context>();
    // SAFETY: `buf` is 8-aligned and larger than the head; `comp_mask` is an input.
    unsafe { (*head).comp_mask = mask };
    // SAFETY: live mlx5 context (caller contract); the buffer has the size of the struct
    // the library writes, and it writes only what `comp_mask` asks for.
    if unsafe { (l.query_device)(ctx, head) } != 0 {
        return None;
    }
    Some(buf)
}

/// What an mlx5 device reports of on-demand paging for DC (`mlx5dv_query_device` with
/// `MLX5DV_CONTEXT_MASK_DC_ODP_CAPS`: `dc_odp_caps`, `IBV_ODP_SUPPORT_*` bits); 0 when the
/// library does not fill it, None without libmlx5 or when the query fails.
///
/// # Safety
/// `ctx` must be a live `ibv_context` of an mlx5 device.
pub unsafe fn dc_odp_caps(ctx: *mut c_void) -> Option<u32> {
    let mask = ffi::MLX5DV_CONTEXT_MASK_DC_ODP_CAPS;
    // SAFETY: the caller's contract.
    let buf = unsafe { query_device(ctx, mask) }?;
    // SAFETY: as in `cqe_comp_caps`.
    let out = unsafe { *buf.as_ptr().cast::<ffi::mlx5dv_context>() };
    if out.comp_mask & mask == 0 {
        return Some(0);
    }
    let at = ffi::MLX5DV_CONTEXT_DC_ODP_CAPS_OFFSET;
    // SAFETY: a 4-byte, 4-aligned word inside `buf` (offset 84 of a 608-byte buffer).
    Some(unsafe { (buf.as_ptr() as *const u8).add(at).cast::<u32>().read() })
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

/// Creates a QP with rdma-core's vendor call (`mlx5dv_create_qp`): `attr` as for
/// `ibv_create_qp_ex` (written back with the sizes the device gave), `dv` the vendor
/// attributes (DC, creation flags). The QP is destroyed with `ibv_destroy_qp`.
///
/// # Safety
/// `ctx` must be a live `ibv_context` of an mlx5 device and `attr`'s PD, CQs and SRQ live
/// objects of it.
///
/// # Errors
/// [`Error::Unsupported`] without libmlx5; the call's error (a device without DC refuses a
/// DC QP with `EOPNOTSUPP` or `EINVAL`).
pub unsafe fn create_qp(
    ctx: *mut c_void,
    attr: &mut rdma_sys::ibv_qp_init_attr_ex,
    dv: &mut ffi::mlx5dv_qp_init_attr,
) -> Result<*mut rdma_sys::ibv_qp> {
    let l = lib().ok_or(Error::Unsupported("libmlx5.so.1 (mlx5dv_create_qp)"))?;
    // SAFETY: live context and objects (caller contract); both structs are initialised and
    // outlive the call.
    let qp = unsafe { (l.create_qp)(ctx, attr, dv) };
    if qp.is_null() {
        return Err(crate::verbs::last("mlx5dv_create_qp").into());
    }
    Ok(qp)
}

/// The vendor attributes an RC or UD QP on an mlx5 device needs, None when
/// `ibv_create_qp_ex` makes it as asked. rdma-core creates every QP with responder
/// scatter-to-CQE (`verbs.c` `create_qp`: `MLX5_QP_FLAG_SCATTER_CQE` whenever
/// `use_scatter_to_cqe()`, i.e. unless `MLX5_SCATTER_TO_CQE=0`), and only
/// `MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE` through `mlx5dv_create_qp` turns it off for one
/// QP: the kernel's `configure_responder_scat_cqe` then leaves `cs_res` at 0 and every
/// received send is written to its buffers by the device.
pub fn rc_ud_vendor_attr(scatter_to_cqe: bool) -> Option<ffi::mlx5dv_qp_init_attr> {
    (!scatter_to_cqe).then(|| ffi::mlx5dv_qp_init_attr {
        comp_mask: ffi::MLX5DV_QP_INIT_ATTR_MASK_QP_CREATE_FLAGS,
        create_flags: ffi::MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE,
        ..Default::default()
    })
}

/// The path a QP runs: `BLUEFLAME_PATH` (`direct`, `verbs` or `auto`) against what the
/// device can do.
///
/// # Errors
/// [`Error::Unsupported`] for `direct` on a device that is not mlx5;
/// [`Error::Environment`] for another value.
pub fn choose(mlx5: bool, var: Option<&str>) -> Result<DataPath> {
    match (var.unwrap_or("auto"), mlx5) {
        ("auto", true) | ("direct", true) => Ok(DataPath::Direct),
        ("auto", false) | ("verbs", _) => Ok(DataPath::Verbs),
        ("direct", false) => Err(Error::Unsupported(
            "BLUEFLAME_PATH=direct on a device that is not mlx5",
        )),
        (other, _) => Err(Error::Environment {
            var: "BLUEFLAME_PATH",
            value: other.into(),
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
/// at most `max_sge` entries (`ibv_create_srq`'s answer), the device's SRQ holding
/// `device_wqes` WQEs (`ibv_query_srq`'s `max_wr` plus one: the kernel's `msrq.max`). The
/// list's entries are the tail's index plus one (rdma-core `mlx5_alloc_srq_buf`:
/// `tail = align_queue_size(max_wr + 1) - 1`); the ring is the device's SRQ, which is larger
/// when rdma-core keeps a wait queue past the list (`2 * max_wr + 1` rounded up: the kernel
/// pinned that whole buffer), and the list's length when `device_wqes` is not a power of two
/// above it (an older library, a failed query: no wait queue). A fresh SRQ's head is 0 (UCX
/// `uct_ib_mlx5_srq_init` refuses any other).
///
/// # Errors
/// [`Error::InvalidParameter`] for a ring the direct path cannot drive (no SRQ number, a
/// head other than 0, a list length that is not a power of two, a stride below 32 or not a
/// power of two).
pub fn raw_srq(dv: &ffi::mlx5dv_srq, max_sge: u32, device_wqes: u32) -> Result<RawSrq> {
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
    let ring = if device_wqes.is_power_of_two() && (cnt..=1 << 16).contains(&device_wqes) {
        device_wqes
    } else {
        cnt
    };
    Ok(RawSrq {
        srqn: dv.srqn,
        buf: dv.buf.cast(),
        wqe_cnt: ring,
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
mod tests;
