//! # mlx5-hdrcheck: the `mlx5` crate against rdma-core's own header
//!
//! `build.rs` compiles `csrc/hdrcheck.c`, which includes the installed
//! `<infiniband/mlx5dv.h>` and `<infiniband/verbs.h>` (Debian `libibverbs-dev`) and exports:
//!
//! - a table of `(name, value)` pairs computed by the C compiler: `sizeof` of every struct the
//!   `mlx5` crate mirrors, `offsetof` and `sizeof` of their members, and every enum constant
//!   the crate mirrors ([`table`], [`lookup`], [`value`]);
//! - rdma-core's static inline helpers (`mlx5dv_set_ctrl_seg`, `mlx5dv_set_data_seg`,
//!   `mlx5dv_get_cqe_*`) called unchanged on byte buffers ([`set_ctrl_seg`],
//!   [`set_data_seg`], [`cqe_fields`]);
//! - the header's structs filled by member name ([`set_raddr_seg`], [`set_atomic_seg`],
//!   [`set_klm_seg`], [`set_err_cqe`]);
//! - rdma-core's syndrome -> `ibv_wc_status` mapping, written with the headers' names
//!   ([`wc_status_of_syndrome`]).
//!
//! Nothing here is typed by hand; the tests in `tests/` compare each value with the `mlx5`
//! crate. This crate is test-only and is never published.

use std::collections::HashMap;
use std::ffi::{c_char, CStr};
use std::sync::OnceLock;

/// One row of the C table (`struct hdrcheck_entry`).
#[repr(C)]
struct RawEntry {
    name: *const c_char,
    value: u64,
}

extern "C" {
    fn hdrcheck_entries(len: *mut usize) -> *const RawEntry;
    fn hdrcheck_set_ctrl_seg(
        out: *mut u8,
        pi: u16,
        opcode: u8,
        opmod: u8,
        qp_num: u32,
        fm_ce_se: u8,
        ds: u8,
        signature: u8,
        imm: u32,
    );
    fn hdrcheck_set_data_seg(out: *mut u8, length: u32, lkey: u32, address: usize);
    fn hdrcheck_cqe_fields(
        cqe: *const u8,
        owner: *mut u8,
        se: *mut u8,
        format: *mut u8,
        opcode: *mut u8,
    );
    fn hdrcheck_set_raddr_seg(out: *mut u8, raddr: u64, rkey: u32);
    fn hdrcheck_ts_to_ns(
        nsec: u64,
        last_cycles: u64,
        frac: u64,
        mult: u32,
        shift: u32,
        mask: u64,
        ts: u64,
    ) -> u64;
    fn hdrcheck_set_dc_addr(out: *mut u8, ah_av: *const u8, remote_dctn: u32, remote_dc_key: u64);
    fn hdrcheck_set_atomic_seg(out: *mut u8, swap_add: u64, compare: u64);
    fn hdrcheck_set_klm_seg(out: *mut u8, byte_count: u32, mkey: u32, address: u64);
    fn hdrcheck_set_err_cqe(
        out: *mut u8,
        srqn: u32,
        vendor_err_synd: u8,
        syndrome: u8,
        s_wqe_opcode_qpn: u32,
        wqe_counter: u16,
        signature: u8,
        op_own: u8,
    );
    fn hdrcheck_wc_status_of_syndrome(syndrome: u8) -> u32;
    fn hdrcheck_set_ud_datagram_seg(
        out: *mut u8,
        remote_qpn: u32,
        qkey: u32,
        stat_rate_sl: u8,
        fl_mlid: u8,
        rlid: u16,
        tclass: u8,
        hop_limit: u8,
        grh_gid_fl: u32,
        rgid: *const u8,
        rmac: *const u8,
    );
    fn hdrcheck_dv_set_dgram_seg(
        out: *mut u8,
        key: u64,
        dqp_dct: u32,
        ext: u8,
        stat_rate_sl: u8,
        fl_mlid: u8,
        rlid: u16,
        rmac: *const u8,
        tclass: u8,
        hop_limit: u8,
        grh_gid_fl: u32,
        rgid: *const u8,
    );
    fn hdrcheck_set_ud_cqe(out: *mut u8, flags_rqpn: u32, slid: u16, ml_path: u8);
    fn hdrcheck_cq_arm(
        rec: *mut u8,
        db: *mut u8,
        arm_sn: u32,
        solicited: core::ffi::c_int,
        cons_index: u32,
        cqn: u32,
    );
}

/// Every `(name, value)` pair the C compiler produced from the headers, in table order.
///
/// Names: `sizeof(struct S)`, `offsetof(S, field)`, `sizeof(S.field)`, or the constant's own
/// name (`MLX5_OPCODE_NOP`, `IBV_WC_SUCCESS`, ...).
pub fn table() -> &'static [(&'static str, u64)] {
    static TABLE: OnceLock<Vec<(&'static str, u64)>> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut len = 0usize;
        // SAFETY: `hdrcheck_entries` only writes the element count through the valid pointer
        // it is given and returns a pointer to a `static const` array of exactly that many
        // entries, laid out as `RawEntry` (a `const char *` and a `uint64_t`, both `repr(C)`).
        let entries = unsafe {
            let p = hdrcheck_entries(&mut len);
            std::slice::from_raw_parts(p, len)
        };
        entries
            .iter()
            .map(|e| {
                // SAFETY: every name in the table is a C string literal: non-null,
                // NUL-terminated and alive for the whole program.
                let name = unsafe { CStr::from_ptr(e.name) };
                let name = name.to_str().expect("table names are ASCII");
                (name, e.value)
            })
            .collect()
    })
}

/// The value of `name` in the C table, if the table has it.
pub fn lookup(name: &str) -> Option<u64> {
    static INDEX: OnceLock<HashMap<&'static str, u64>> = OnceLock::new();
    INDEX
        .get_or_init(|| table().iter().copied().collect())
        .get(name)
        .copied()
}

/// The value of `name` in the C table.
///
/// # Panics
/// If the table has no such name: a check that cannot find its C side fails, it never passes.
#[track_caller]
pub fn value(name: &str) -> u64 {
    lookup(name).unwrap_or_else(|| panic!("`{name}` is not in the C table of csrc/hdrcheck.c"))
}

/// The 16 bytes `mlx5dv_set_ctrl_seg` writes (over a zeroed segment). `imm` is stored raw, as
/// rdma-core stores it: pass `x.to_be()` to get the big-endian bytes of `x`.
#[allow(clippy::too_many_arguments)]
pub fn set_ctrl_seg(
    pi: u16,
    opcode: u8,
    opmod: u8,
    qp_num: u32,
    fm_ce_se: u8,
    ds: u8,
    signature: u8,
    imm: u32,
) -> [u8; 16] {
    let mut out = [0u8; 16];
    // SAFETY: the C function writes exactly sizeof(struct mlx5_wqe_ctrl_seg) == 16 bytes
    // (checked by the layout tests) through `out`, which is 16 writable bytes; it keeps no
    // pointer after returning.
    unsafe {
        hdrcheck_set_ctrl_seg(
            out.as_mut_ptr(),
            pi,
            opcode,
            opmod,
            qp_num,
            fm_ce_se,
            ds,
            signature,
            imm,
        )
    };
    out
}

/// The 16 bytes `mlx5dv_set_data_seg` writes.
///
/// # Panics
/// If `address` does not fit the C `uintptr_t` (only on 32-bit targets).
pub fn set_data_seg(length: u32, lkey: u32, address: u64) -> [u8; 16] {
    let address = usize::try_from(address).expect("address fits uintptr_t");
    let mut out = [0u8; 16];
    // SAFETY: the C function writes exactly sizeof(struct mlx5_wqe_data_seg) == 16 bytes
    // through `out`, which is 16 writable bytes; it keeps no pointer after returning.
    unsafe { hdrcheck_set_data_seg(out.as_mut_ptr(), length, lkey, address) };
    out
}

/// What `mlx5dv_get_cqe_owner`, `_se`, `_format` and `_opcode` return for this 64-byte CQE.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct CqeFields {
    /// `mlx5dv_get_cqe_owner`.
    pub owner: u8,
    /// `mlx5dv_get_cqe_se`.
    pub se: u8,
    /// `mlx5dv_get_cqe_format`.
    pub format: u8,
    /// `mlx5dv_get_cqe_opcode`.
    pub opcode: u8,
}

/// Runs rdma-core's CQE accessors on a copy of `cqe`.
pub fn cqe_fields(cqe: &[u8; 64]) -> CqeFields {
    let mut f = CqeFields {
        owner: 0,
        se: 0,
        format: 0,
        opcode: 0,
    };
    // SAFETY: the C function copies sizeof(struct mlx5_cqe64) == 64 bytes out of `cqe`
    // (64 readable bytes; memcpy has no alignment requirement) and writes one byte through
    // each of the four pointers, all to distinct live fields of `f`.
    unsafe {
        hdrcheck_cqe_fields(
            cqe.as_ptr(),
            &mut f.owner,
            &mut f.se,
            &mut f.format,
            &mut f.opcode,
        )
    };
    f
}

/// What rdma-core's `mlx5dv_ts_to_ns` makes of `ts` with the clock info `c`.
pub fn ts_to_ns(c: &mlx5::clock::ClockInfo, ts: u64) -> u64 {
    // SAFETY: plain values in, one out; the C function reads only its arguments.
    unsafe { hdrcheck_ts_to_ns(c.nsec, c.last_cycles, c.frac, c.mult, c.shift, c.mask, ts) }
}

/// `struct mlx5_wqe_raddr_seg` filled by member name (`htobe64(raddr)`, `htobe32(rkey)`).
pub fn set_raddr_seg(raddr: u64, rkey: u32) -> [u8; 16] {
    let mut out = [0u8; 16];
    // SAFETY: the C function writes sizeof(struct mlx5_wqe_raddr_seg) == 16 bytes through
    // `out` (16 writable bytes) and keeps no pointer.
    unsafe { hdrcheck_set_raddr_seg(out.as_mut_ptr(), raddr, rkey) };
    out
}

/// The 48-byte datagram segment of a DCI WQE as rdma-core's `mlx5_send_wr_set_dc_addr`
/// fills it from an address handle's AV, a DCT number and a DC key.
pub fn set_dc_addr(ah_av: &[u8; 48], dctn: u32, dc_key: u64) -> [u8; 48] {
    let mut out = [0u8; 48];
    // SAFETY: the C function reads 48 bytes (sizeof(struct mlx5_wqe_av)) from `ah_av` and
    // writes 48 (sizeof(struct mlx5_wqe_datagram_seg)) through `out`; it keeps no pointer.
    unsafe { hdrcheck_set_dc_addr(out.as_mut_ptr(), ah_av.as_ptr(), dctn, dc_key) };
    out
}

/// A CQ arm request as rdma-core's `mlx5_arm_cq` builds it: the doorbell record's arm word
/// and the 64-bit doorbell, as the bytes written to memory.
pub fn cq_arm(arm_sn: u32, solicited: bool, cons_index: u32, cqn: u32) -> ([u8; 4], [u8; 8]) {
    let (mut rec, mut db) = ([0u8; 4], [0u8; 8]);
    // SAFETY: the C function writes 4 bytes through `rec` and 8 through `db` (both that
    // large) and keeps no pointer.
    unsafe {
        hdrcheck_cq_arm(
            rec.as_mut_ptr(),
            db.as_mut_ptr(),
            arm_sn,
            solicited as core::ffi::c_int,
            cons_index,
            cqn,
        )
    };
    (rec, db)
}

/// `struct mlx5_wqe_atomic_seg` filled by member name.
pub fn set_atomic_seg(swap_add: u64, compare: u64) -> [u8; 16] {
    let mut out = [0u8; 16];
    // SAFETY: the C function writes sizeof(struct mlx5_wqe_atomic_seg) == 16 bytes through
    // `out` (16 writable bytes) and keeps no pointer.
    unsafe { hdrcheck_set_atomic_seg(out.as_mut_ptr(), swap_add, compare) };
    out
}

/// `struct mlx5_wqe_umr_klm_seg` filled by member name.
pub fn set_klm_seg(byte_count: u32, mkey: u32, address: u64) -> [u8; 16] {
    let mut out = [0u8; 16];
    // SAFETY: the C function writes sizeof(struct mlx5_wqe_umr_klm_seg) == 16 bytes through
    // `out` (16 writable bytes) and keeps no pointer.
    unsafe { hdrcheck_set_klm_seg(out.as_mut_ptr(), byte_count, mkey, address) };
    out
}

/// `struct mlx5_err_cqe` (zeroed, then these members set by name, big-endian as the NIC
/// writes them).
#[allow(clippy::too_many_arguments)]
pub fn set_err_cqe(
    srqn: u32,
    vendor_err_synd: u8,
    syndrome: u8,
    s_wqe_opcode_qpn: u32,
    wqe_counter: u16,
    signature: u8,
    op_own: u8,
) -> [u8; 64] {
    let mut out = [0u8; 64];
    // SAFETY: the C function writes sizeof(struct mlx5_err_cqe) == 64 bytes through `out`
    // (64 writable bytes) and keeps no pointer.
    unsafe {
        hdrcheck_set_err_cqe(
            out.as_mut_ptr(),
            srqn,
            vendor_err_synd,
            syndrome,
            s_wqe_opcode_qpn,
            wqe_counter,
            signature,
            op_own,
        )
    };
    out
}

/// The `ibv_wc_status` rdma-core (`cq.c` `mlx5_handle_error_cqe`) reports for a syndrome.
pub fn wc_status_of_syndrome(syndrome: u8) -> u32 {
    // SAFETY: a pure C function of one byte; no pointers, no global state.
    unsafe { hdrcheck_wc_status_of_syndrome(syndrome) }
}

/// The host values of a `struct mlx5_wqe_av` (as `mlx5_create_ah` fills it).
#[derive(Copy, Clone, Debug, Default)]
pub struct AvFields {
    /// `stat_rate_sl`.
    pub stat_rate_sl: u8,
    /// `fl_mlid`.
    pub fl_mlid: u8,
    /// `rlid` (host order).
    pub rlid: u16,
    /// `rmac`.
    pub rmac: [u8; 6],
    /// `tclass`.
    pub tclass: u8,
    /// `hop_limit`.
    pub hop_limit: u8,
    /// `grh_gid_fl` (host order).
    pub grh_gid_fl: u32,
    /// `rgid`.
    pub rgid: [u8; 16],
}

/// `struct mlx5_wqe_datagram_seg` of a UD send as rdma-core's `qp.c` `_set_datagram_seg`
/// makes it from an AV with these members.
pub fn set_ud_datagram_seg(remote_qpn: u32, qkey: u32, av: &AvFields) -> [u8; 48] {
    let mut out = [0u8; 48];
    // SAFETY: the C function reads 16 bytes through `rgid` and 6 through `rmac` (arrays of
    // exactly that size), writes sizeof(struct mlx5_wqe_datagram_seg) == 48 bytes through
    // `out` (48 writable bytes) and keeps no pointer.
    unsafe {
        hdrcheck_set_ud_datagram_seg(
            out.as_mut_ptr(),
            remote_qpn,
            qkey,
            av.stat_rate_sl,
            av.fl_mlid,
            av.rlid,
            av.tclass,
            av.hop_limit,
            av.grh_gid_fl,
            av.rgid.as_ptr(),
            av.rmac.as_ptr(),
        )
    };
    out
}

/// The header's own `mlx5dv_set_dgram_seg` (64-bit key: the DC form).
pub fn dv_set_dgram_seg(key: u64, dqp_dct: u32, ext: bool, av: &AvFields) -> [u8; 48] {
    let mut out = [0u8; 48];
    // SAFETY: as in set_ud_datagram_seg: 6 bytes read through `rmac`, 16 through `rgid`,
    // 48 written through `out`; no pointer kept.
    unsafe {
        hdrcheck_dv_set_dgram_seg(
            out.as_mut_ptr(),
            key,
            dqp_dct,
            ext as u8,
            av.stat_rate_sl,
            av.fl_mlid,
            av.rlid,
            av.rmac.as_ptr(),
            av.tclass,
            av.hop_limit,
            av.grh_gid_fl,
            av.rgid.as_ptr(),
        )
    };
    out
}

/// A `struct mlx5_cqe64` with only the UD responder members set by name.
pub fn set_ud_cqe(flags_rqpn: u32, slid: u16, ml_path: u8) -> [u8; 64] {
    let mut out = [0u8; 64];
    // SAFETY: the C function writes sizeof(struct mlx5_cqe64) == 64 bytes through `out`
    // (64 writable bytes) and keeps no pointer.
    unsafe { hdrcheck_set_ud_cqe(out.as_mut_ptr(), flags_rqpn, slid, ml_path) };
    out
}
