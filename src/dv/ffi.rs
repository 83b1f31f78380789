//! Hand-written declarations of the mlx5dv structs the direct path needs.

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

/// `struct mlx5dv_clock_info`: what `mlx5dv_get_clock_info` copies out of the kernel's
/// clock-info page; `mlx5::clock::ClockInfo` has its layout (checked by `mlx5-hdrcheck`).
pub use mlx5::clock::ClockInfo as mlx5dv_clock_info;

/// `MLX5DV_CONTEXT_FLAGS_REAL_TIME_TS`: the device stamps completions in real time (a CQ
/// that asks for wall-clock times gets them so).
pub const MLX5DV_CONTEXT_FLAGS_REAL_TIME_TS: u64 = 1 << 7;

/// `MLX5DV_CONTEXT_MASK_DC_ODP_CAPS`: asks `mlx5dv_query_device` for `dc_odp_caps`.
pub const MLX5DV_CONTEXT_MASK_DC_ODP_CAPS: u64 = 1 << 7;

/// `offsetof(struct mlx5dv_context, dc_odp_caps)` in rdma-core 44 (a `uint32_t`; checked by
/// `mlx5-hdrcheck`): the members between it and `cqe_comp_caps` are not declared here.
pub const MLX5DV_CONTEXT_DC_ODP_CAPS_OFFSET: usize = 84;

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

/// `struct mlx5dv_dc_init_attr`: `dc_type` then a union of `dct_access_key` (u64) and
/// `struct mlx5dv_dci_streams` (two u8), 8-aligned.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct mlx5dv_dc_init_attr {
    pub dc_type: u32,
    /// The union: the DCT access key (a DCI with streams would put two bytes here).
    pub dct_access_key: u64,
}

/// `struct mlx5dv_qp_init_attr`: the vendor attributes of `mlx5dv_create_qp`.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct mlx5dv_qp_init_attr {
    pub comp_mask: u64,
    pub create_flags: u32,
    pub dc_init_attr: mlx5dv_dc_init_attr,
    pub send_ops_flags: u64,
}

/// `MLX5DV_QP_INIT_ATTR_MASK_QP_CREATE_FLAGS`: `create_flags` is valid.
pub const MLX5DV_QP_INIT_ATTR_MASK_QP_CREATE_FLAGS: u64 = 1 << 0;
/// `MLX5DV_QP_INIT_ATTR_MASK_DC`: `dc_init_attr` is valid.
pub const MLX5DV_QP_INIT_ATTR_MASK_DC: u64 = 1 << 1;
/// `MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE`: the QP is created without responder
/// scatter-to-CQE (rdma-core `create_qp` clears `MLX5_QP_FLAG_SCATTER_CQE`).
pub const MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE: u32 = 1 << 3;
pub const MLX5DV_DCTYPE_DCT: u32 = 1;
pub const MLX5DV_DCTYPE_DCI: u32 = 2;
/// `IBV_QPT_DRIVER` (verbs.h).
pub const IBV_QPT_DRIVER: u32 = 0xff;
/// `IBV_QP_INIT_ATTR_PD` (verbs.h).
pub const IBV_QP_INIT_ATTR_PD: u32 = 1 << 0;
