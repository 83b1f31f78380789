//! # mlx5-oracle: rdma-core's own mlx5 provider as a test oracle for WQE bytes
//!
//! `build.rs` compiles rdma-core v55's `providers/mlx5/qp.c` and `srq.c` unchanged (from the
//! tree named by `BLUEFLAME_RDMA_CORE_SRC`; `cargo xtask test` fetches it) with
//! `csrc/oracle.c`, which builds a `struct mlx5_qp` / `struct mlx5_srq` in plain memory and
//! posts through rdma-core's real code: `ibv_wr_start`, the `ibv_wr_*` builders and setters,
//! `mlx5dv_wr_set_dc_addr`, `ibv_wr_complete` (doorbell record and BlueFlame copy into a
//! memory "register") and `mlx5_post_srq_recv`; and `providers/mlx5/verbs.c` for
//! `mlx5_create_ah` ([`create_ah`]), the address vector of UD and DC sends.
//!
//! [`OracleQp`] and [`OracleSrq`] are that QP and SRQ; the tests in `tests/` post the same
//! requests through them and through the `mlx5` crate's encoders and compare the bytes.
//! This crate is test-only and is never published.
//!
//! When the source tree was not given at build time, [`available`] is false and nothing else
//! can be created; [`skip_or_fail`] is what a test calls first.

/// `IBV_SEND_FENCE` (verbs.h `enum ibv_send_flags`).
pub const IBV_SEND_FENCE: u32 = 1;
/// `IBV_SEND_SIGNALED`.
pub const IBV_SEND_SIGNALED: u32 = 1 << 1;
/// `IBV_SEND_SOLICITED`.
pub const IBV_SEND_SOLICITED: u32 = 1 << 2;
/// `IBV_SEND_INLINE` (the `ibv_wr_*` API ignores it: inline is a setter there).
pub const IBV_SEND_INLINE: u32 = 1 << 3;

/// Whether rdma-core's provider was built into this crate.
pub const fn available() -> bool {
    cfg!(rdma_core_oracle)
}

/// The rdma-core tree the oracle was built from, if it was.
pub fn source() -> Option<&'static str> {
    option_env!("MLX5_ORACLE_RDMA_CORE")
}

/// Call first in every oracle test: `true` when the oracle is built (run the test).
///
/// Without it the test either fails (under `cargo xtask test`, which sets
/// `BLUEFLAME_ORACLE_REQUIRED=1`: a missing oracle must never pass as a skipped test) or
/// prints why it skips and how to get the source.
///
/// # Panics
/// When the oracle is missing and `BLUEFLAME_ORACLE_REQUIRED` is set.
#[track_caller]
pub fn skip_or_fail(test: &str) -> bool {
    if available() {
        return true;
    }
    let how = "build with BLUEFLAME_RDMA_CORE_SRC=<rdma-core v55 tree>; `cargo xtask test` \
               fetches it (tools/oracle-src) and sets it";
    if std::env::var_os("BLUEFLAME_ORACLE_REQUIRED").is_some() {
        panic!("{test}: the rdma-core oracle was not built: {how}");
    }
    eprintln!("{test}: SKIPPED: the rdma-core oracle was not built ({how})");
    false
}

/// One `struct ibv_sge`.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct IbvSge {
    /// Address.
    pub addr: u64,
    /// Length.
    pub length: u32,
    /// lkey.
    pub lkey: u32,
}

impl From<mlx5::Sge> for IbvSge {
    fn from(s: mlx5::Sge) -> Self {
        IbvSge {
            addr: s.addr,
            length: s.len,
            lkey: s.lkey,
        }
    }
}

/// One `struct ibv_data_buf` (an inline piece for `ibv_wr_set_inline_data_list`).
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct IbvDataBuf {
    /// Address.
    pub addr: *const u8,
    /// Length.
    pub length: usize,
}

/// What an address handle is created from: the fields of `struct ibv_ah_attr` that
/// `mlx5_create_ah` reads, and the port (`struct oracle_ah_attr` of `csrc/oracle.h`).
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct AhAttr {
    /// 1: an Ethernet (RoCE) port; 0: InfiniBand.
    pub ethernet: u8,
    /// 1: the source GID is RoCE v2 (`IBV_GID_TYPE_SYSFS_ROCE_V2`).
    pub roce_v2: u8,
    /// `is_global`.
    pub is_global: u8,
    /// `sl`.
    pub sl: u8,
    /// `src_path_bits`.
    pub src_path_bits: u8,
    /// `static_rate` (`enum ibv_rate`).
    pub static_rate: u8,
    /// `dlid`.
    pub dlid: u16,
    /// `grh.dgid`.
    pub dgid: [u8; 16],
    /// `grh.flow_label`.
    pub flow_label: u32,
    /// `grh.sgid_index`.
    pub sgid_index: u8,
    /// `grh.hop_limit`.
    pub hop_limit: u8,
    /// `grh.traffic_class`.
    pub traffic_class: u8,
    /// The next hop's MAC the kernel resolves (`ibv_resolve_eth_l2_from_gid`).
    pub rmac: [u8; 6],
}

/// rdma-core's `mlx5_create_ah` (providers/mlx5/verbs.c) on a one-port context: the
/// address handle's 48-byte `struct mlx5_wqe_av`, or the errno it failed with.
pub fn create_ah(attr: &AhAttr) -> Result<[u8; 48], i32> {
    // The port's answers (GID type, MAC) are one global of csrc/stubs.c, as a device's port
    // is one: one address handle at a time.
    static PORT: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _port = PORT.lock().unwrap_or_else(|e| e.into_inner());
    let mut av = [0u8; 48];
    // SAFETY: `attr` is a valid `repr(C)` mirror of `struct oracle_ah_attr`, read only; the C
    // function writes exactly 48 bytes to `av`.
    let rc = unsafe { ffi::oracle_create_ah(attr, av.as_mut_ptr()) };
    if rc == 0 {
        Ok(av)
    } else {
        Err(rc)
    }
}

/// The kind of QP rdma-core's `mlx5_qp_fill_wr_pfns` fills the function pointers for.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
#[repr(i32)]
pub enum QpKind {
    /// `IBV_QPT_RC`.
    Rc = 0,
    /// `IBV_QPT_UD`.
    Ud = 1,
    /// `IBV_QPT_DRIVER` with `MLX5DV_DCTYPE_DCI`.
    Dci = 2,
}

/// The geometry rdma-core's `mlx5_alloc_srq_buf` chose for an SRQ, and its indices.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct SrqGeometry {
    /// WQEs in the buffer (main queue and wait queue).
    pub max: i32,
    /// Scatter entries per WQE.
    pub max_gs: i32,
    /// log2 of the WQE stride.
    pub wqe_shift: i32,
    /// Next WQE a post takes.
    pub head: i32,
    /// Last WQE of the free list.
    pub tail: i32,
    /// WQEs of the main queue.
    pub nwqes: u32,
    /// Receives posted (16 bits).
    pub counter: u16,
    /// The doorbell record, host order.
    pub dbrec: u32,
}

/// The C functions of `csrc/oracle.c`. Without the oracle built, the same names exist as
/// functions that panic, so that the crate and its tests compile (and are linted) everywhere;
/// no test reaches them (`skip_or_fail` comes first).
mod ffi {
    use super::{AhAttr, IbvDataBuf, IbvSge, SrqGeometry};

    #[repr(C)]
    pub struct OracleQp {
        _opaque: [u8; 0],
    }
    #[repr(C)]
    pub struct OracleSrq {
        _opaque: [u8; 0],
    }

    macro_rules! oracle_ffi {
        ($(fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)?;)*) => {
            #[cfg(rdma_core_oracle)]
            extern "C" {
                $(pub fn $name($($arg: $ty),*) $(-> $ret)?;)*
            }
            $(
                #[cfg(not(rdma_core_oracle))]
                #[allow(unused_variables, clippy::missing_safety_doc)]
                pub unsafe fn $name($($arg: $ty),*) $(-> $ret)? {
                    panic!("the rdma-core oracle was not built (BLUEFLAME_RDMA_CORE_SRC)")
                }
            )*
        };
    }

    /// `struct oracle_send_wr` (csrc/oracle.h).
    #[repr(C)]
    pub struct SendWr {
        pub wr_id: u64,
        pub opcode: u32,
        pub send_flags: u32,
        pub imm_host: u32,
        pub rkey: u32,
        pub raddr: u64,
        pub compare_add: u64,
        pub swap: u64,
        pub mw_rkey: u32,
        pub mw_type: u32,
        pub new_rkey: u32,
        pub mr_lkey: u32,
        pub bind_addr: u64,
        pub bind_len: u64,
        pub bind_access: u32,
        pub num_sge: i32,
        pub sgl: *const IbvSge,
        pub av: *const u8,
        pub remote_qpn: u32,
        pub remote_qkey: u32,
    }

    oracle_ffi! {
        fn oracle_post_send(q: *mut OracleQp, w: *const SendWr) -> i32;
        fn oracle_create_ah(a: *const AhAttr, av: *mut u8) -> i32;
        fn oracle_qp_new(kind: i32, qpn: u32, wqe_cnt: u32, max_inline: i32, max_gs: i32) -> *mut OracleQp;
        fn oracle_qp_free(q: *mut OracleQp);
        fn oracle_qp_ring(q: *mut OracleQp) -> *mut u8;
        fn oracle_qp_bf_reg(q: *const OracleQp) -> *const u8;
        fn oracle_qp_set_cur_post(q: *mut OracleQp, cur_post: u32);
        fn oracle_qp_retire_all(q: *mut OracleQp);
        fn oracle_qp_cur_post(q: *const OracleQp) -> u32;
        fn oracle_qp_sq_dbrec(q: *const OracleQp) -> u32;
        fn oracle_qp_bf_offset(q: *const OracleQp) -> u32;
        fn oracle_qp_rq_setup(q: *mut OracleQp, wqe_cnt: u32, max_gs: i32) -> i32;
        fn oracle_qp_rq_buf(q: *mut OracleQp) -> *mut u8;
        fn oracle_qp_post_recv(q: *mut OracleQp, wr_id: u64, sgl: *const IbvSge, n: i32) -> i32;
        fn oracle_qp_rq_head(q: *const OracleQp) -> u32;
        fn oracle_qp_rq_dbrec(q: *const OracleQp) -> u32;
        fn oracle_wr_start(q: *mut OracleQp);
        fn oracle_wr_complete(q: *mut OracleQp) -> i32;
        fn oracle_wr_next(q: *mut OracleQp, wr_id: u64, wr_flags: u32);
        fn oracle_wr_rdma_write(q: *mut OracleQp, rkey: u32, raddr: u64);
        fn oracle_wr_rdma_write_imm(q: *mut OracleQp, rkey: u32, raddr: u64, imm: u32);
        fn oracle_wr_rdma_read(q: *mut OracleQp, rkey: u32, raddr: u64);
        fn oracle_wr_send(q: *mut OracleQp);
        fn oracle_wr_send_imm(q: *mut OracleQp, imm: u32);
        fn oracle_wr_send_inv(q: *mut OracleQp, rkey: u32);
        fn oracle_wr_atomic_cmp_swp(q: *mut OracleQp, rkey: u32, raddr: u64, compare: u64, swap: u64);
        fn oracle_wr_atomic_fetch_add(q: *mut OracleQp, rkey: u32, raddr: u64, add: u64);
        fn oracle_wr_bind_mw(q: *mut OracleQp, mw_rkey: u32, new_rkey: u32, mr_lkey: u32, addr: u64, length: u64, access: u32);
        fn oracle_wr_local_inv(q: *mut OracleQp, rkey: u32);
        fn oracle_wr_set_sge(q: *mut OracleQp, lkey: u32, addr: u64, length: u32);
        fn oracle_wr_set_sge_list(q: *mut OracleQp, n: usize, sgl: *const IbvSge);
        fn oracle_wr_set_inline_data(q: *mut OracleQp, addr: *const u8, len: usize);
        fn oracle_wr_set_inline_data_list(q: *mut OracleQp, n: usize, bufs: *const IbvDataBuf);
        fn oracle_wr_set_ud_addr(q: *mut OracleQp, av: *const u8, qpn: u32, qkey: u32);
        fn oracle_wr_set_dc_addr(q: *mut OracleQp, av: *const u8, dctn: u32, dc_key: u64);
        fn oracle_srq_new(max_wr: u32, max_gs: i32) -> *mut OracleSrq;
        fn oracle_srq_free(s: *mut OracleSrq);
        fn oracle_srq_buf(s: *const OracleSrq) -> *const u8;
        fn oracle_srq_buf_len(s: *const OracleSrq) -> usize;
        fn oracle_srq_geometry(s: *const OracleSrq, g: *mut SrqGeometry);
        fn oracle_srq_post_recv(s: *mut OracleSrq, wr_id: u64, sgl: *const IbvSge, n: i32) -> i32;
    }
}

mod qp;
pub use qp::{Addr, ClassicData, ClassicWr, Data, Op, OracleQp, OracleSrq, Wr, MAX_GS, MAX_INLINE};
