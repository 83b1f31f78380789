//! The device as `mlx5_ib` describes it: the context (`GET_CONTEXT`), the device's and
//! the port's attributes.

use super::limits::{
    BFREGS_PER_PAGE, BF_REG_SIZE, DYN_BFREGS, MAX_RQ_DESC, MAX_SGE, MAX_SQ_DESC, MAX_WR,
};
use super::objects::File;
use crate::abi;
use crate::cmd::Call;
use crate::events;
use libc::c_int;
use mlx5::sim::{Nic, PORT_MAX_MSG};

/// `GET_CONTEXT`: `mlx5_ib_alloc_ucontext`. The model is a kernel without dynamic UARs
/// (`MLX5_LIB_CAP_DYN_UAR` not honoured): the bfregs are allocated with the context
/// (`calc_total_bfregs` rounds them to whole UAR pages) and the provider maps their pages
/// (`mlx5_set_context` -> `mlx5_mmap`); without 4K UARs, one bfreg pair per page.
///
/// # Safety
/// As [`super::command`]'s calls.
pub(super) unsafe fn get_context(
    nic: &Nic,
    f: &mut File,
    call: &mut Call<'_>,
) -> Result<(), c_int> {
    use abi::*;
    if f.has_context() {
        return Err(libc::EINVAL);
    }
    // SAFETY: the caller's contract.
    let (_, udata) = unsafe { call.request::<ib_uverbs_get_context>() };
    // SAFETY: a plain ABI struct.
    let req: mlx5_ib_alloc_ucontext_req_v2 = unsafe { crate::cmd::read(udata) };
    // `calc_total_bfregs`: whole pages, at most MLX5_MAX_BFREGS; low latency ones leave
    // at least one medium bfreg besides bfreg 0.
    let tot = req.total_num_bfregs.div_ceil(BFREGS_PER_PAGE) * BFREGS_PER_PAGE;
    if tot == 0 || tot > 512 || req.num_low_latency_bfregs > tot - 1 {
        return Err(libc::EINVAL);
    }
    let fd = events::create(core::mem::size_of::<ib_uverbs_async_event_desc>())?;
    f.async_fd = Some(fd);
    f.tot_bfregs = tot;
    f.low_lat = req.num_low_latency_bfregs;
    f.bfreg_count = vec![0; tot as usize];
    let resp = ib_uverbs_get_context_resp {
        async_fd: fd as u32,
        num_comp_vectors: 1,
        ..Default::default()
    };
    let drv = mlx5_ib_alloc_ucontext_resp {
        qp_tab_size: 1 << 18,
        bf_reg_size: BF_REG_SIZE,
        tot_bfregs: tot,
        cache_line_size: 64,
        max_sq_desc_sz: MAX_SQ_DESC,
        max_rq_desc_sz: MAX_RQ_DESC,
        max_send_wqebb: MAX_WR,
        max_recv_wr: MAX_WR,
        max_srq_recv_wr: MAX_WR,
        num_ports: 1,
        response_length: core::mem::size_of::<mlx5_ib_alloc_ucontext_resp>() as u32,
        // CQE version 1, as `mlx5_ib_alloc_ucontext` answers libmlx5 on every ConnectX-4 and
        // later (`min(MLX5_CAP_GEN(cqe_version), req.max_cqe_version)`): completions name
        // their QP by the user index libmlx5 gave it (`srqn_uidx`), not by number.
        cqe_version: 1,
        // The driver data `mlx5_ib` takes in QUERY_DEVICE and CREATE_AH.
        cmds_supp_uhw: (MLX5_USER_CMDS_SUPP_UHW_QUERY_DEVICE | MLX5_USER_CMDS_SUPP_UHW_CREATE_AH)
            as u8,
        log_uar_size: 12,
        num_uars_per_page: 1,
        num_dyn_bfregs: DYN_BFREGS,
        ..Default::default()
    };
    // The device clock (`mlx5_ib_alloc_ucontext`): the counter page at offset 0 of its
    // mapping, the clock-info page (version 1), real-time stamps where the NIC makes them.
    let drv = if super::clock::offered(nic) {
        let rt = nic.hw_clock().format == mlx5::clock::TimestampFormat::RealTime;
        mlx5_ib_alloc_ucontext_resp {
            comp_mask: MLX5_IB_ALLOC_UCONTEXT_RESP_MASK_CORE_CLOCK_OFFSET
                | if rt {
                    MLX5_IB_ALLOC_UCONTEXT_RESP_MASK_REAL_TIME_TS
                } else {
                    0
                },
            hca_core_clock_offset: 0,
            clock_info_versions: 1 << MLX5_IB_CLOCK_INFO_V1,
            ..drv
        }
    } else {
        drv
    };
    // SAFETY: the caller's contract.
    unsafe { call.respond(&resp, Some(&drv)) }
}

/// The device's attributes (`mlx5_ib_query_device`), a ConnectX-6 as the NIC models it.
fn device_attr(nic: &Nic) -> abi::ib_uverbs_query_device_resp {
    // `get_atomic_caps` (drivers/infiniband/hw/mlx5/main.c): IB_ATOMIC_HCA only with the
    // standard atomics in host-endianness mode (atomic_req_8B_endianness_mode 1).
    let a = nic.atomic_caps();
    let atomic_cap = u32::from(a.standard && !a.reply8_be);
    abi::ib_uverbs_query_device_resp {
        fw_ver: (20 << 32) | (39 << 16) | 1002,
        node_guid: crate::sysfs::NODE_GUID.to_be(),
        sys_image_guid: crate::sysfs::NODE_GUID.to_be(),
        max_mr_size: u64::MAX,
        page_size_cap: !0xfff,
        vendor_id: 0x02c9,
        vendor_part_id: 0x101b,
        hw_ver: 0,
        max_qp: 1 << 18,
        max_qp_wr: MAX_WR,
        // RESIZE_MAX_WR | BAD_PKEY_CNTR | BAD_QKEY_CNTR | CHANGE_PHY_PORT | RC_RNR_NAK_GEN
        // | PORT_ACTIVE_EVENT | SYS_IMAGE_GUID | MEM_WINDOW | MEM_MGT_EXTENSIONS
        device_cap_flags: 1
            | 1 << 1
            | 1 << 2
            | 1 << 5
            | 1 << 12
            | 1 << 14
            | 1 << 11
            | 1 << 17
            | 1 << 21,
        max_sge: MAX_SGE,
        max_sge_rd: MAX_SGE,
        max_cq: 1 << 24,
        max_cqe: (1 << 22) - 1,
        max_mr: 1 << 24,
        max_pd: 1 << 24,
        max_qp_rd_atom: 16,
        max_res_rd_atom: 16 << 18,
        max_qp_init_rd_atom: 16,
        atomic_cap,
        max_mw: 1 << 24,
        max_mcast_grp: 1 << 21,
        max_mcast_qp_attach: 240,
        max_total_mcast_qp_attach: 240 << 21,
        max_ah: i32::MAX as u32,
        max_srq: 1 << 23,
        max_srq_wr: MAX_WR - 1,
        max_srq_sge: 31,
        max_pkeys: 128,
        local_ca_ack_delay: 16,
        phys_port_cnt: 1,
        ..Default::default()
    }
}

/// `EX_QUERY_DEVICE`: the attributes; explicit on-demand paging as the NIC's memory caps
/// say (`mlx5_ib_internal_fill_odp_caps`: RC send, receive, write, read, atomic and SRQ
/// receive, UD send; no implicit ODP); the completion clock as the NIC has it
/// (`mlx5_ib_query_device`: `timestamp_mask` 2^63 - 1, `hca_core_clock` its kHz); the mlx5
/// part names CQE compression as the NIC offers it.
///
/// # Safety
/// As [`super::command`]'s calls.
pub(super) unsafe fn query_device_ex(nic: &Nic, call: &mut Call<'_>) -> Result<(), c_int> {
    use abi::*;
    // SAFETY: the caller's contract.
    let _ = unsafe { call.request::<ib_uverbs_ex_query_device>() };
    let base = device_attr(nic);
    let mem = nic.memory_caps();
    let odp_caps = if mem.odp {
        // IB_ODP_SUPPORT; IB_ODP_SUPPORT_SEND 1, _RECV 2, _WRITE 4, _READ 8, _ATOMIC 0x10,
        // _SRQ_RECV 0x20.
        ib_uverbs_odp_caps {
            general_caps: 1,
            per_transport_caps: ib_uverbs_odp_caps__bindgen_ty_1 {
                rc_odp_caps: 0x1f | if mem.srq_odp { 0x20 } else { 0 },
                uc_odp_caps: 0,
                ud_odp_caps: 1,
            },
            reserved: 0,
        }
    } else {
        ib_uverbs_odp_caps::default()
    };
    let khz = nic.hw_clock().khz;
    let resp = ib_uverbs_ex_query_device_resp {
        device_cap_flags_ex: base.device_cap_flags as u64,
        odp_caps,
        timestamp_mask: if khz != 0 { u64::MAX >> 1 } else { 0 },
        hca_core_clock: khz as u64,
        base,
        response_length: core::mem::size_of::<ib_uverbs_ex_query_device_resp>() as u32,
        ..Default::default()
    };
    let caps = nic.cqe_comp_caps();
    let drv = mlx5_ib_query_device_resp {
        response_length: core::mem::size_of::<mlx5_ib_query_device_resp>() as u32,
        comp_mask: 1, // MLX5_IB_QUERY_DEV_RESP_MASK_CQE_COMP
        cqe_comp_caps: mlx5_ib_cqe_comp_caps {
            max_num: caps.max_num,
            supported_format: caps.supported_format,
        },
        // MLX5_IB_QUERY_DEV_RESP_FLAGS_CQE_128B_COMP as the NIC compresses, and
        // _SCAT2CQE_DCT: DC targets take the provider's scatter-to-CQE flag.
        flags: u32::from(caps.cqe_128) | MLX5_IB_QUERY_DEV_RESP_FLAGS_SCAT2CQE_DCT,
        ..Default::default()
    };
    // SAFETY: the caller's contract.
    unsafe { call.respond(&resp, Some(&drv)) }
}

/// `QUERY_PORT`: one active InfiniBand port with the NIC's LID and MTU.
///
/// # Safety
/// As [`super::command`]'s calls.
pub(super) unsafe fn query_port(nic: &Nic, call: &mut Call<'_>) -> Result<(), c_int> {
    use abi::*;
    // SAFETY: the caller's contract.
    let (c, _) = unsafe { call.request::<ib_uverbs_query_port>() };
    if c.port_num != 1 {
        return Err(libc::EINVAL);
    }
    let port = nic.port_attr();
    let mtu = port.mtu_enum();
    let resp = ib_uverbs_query_port_resp {
        port_cap_flags: 0x2651_e848,
        // The software NIC's port (a ConnectX-6: `log_max_msg` 30).
        max_msg_sz: PORT_MAX_MSG,
        gid_tbl_len: 1,
        pkey_tbl_len: 128,
        lid: port.lid,
        sm_lid: port.lid,
        state: 4, // IBV_PORT_ACTIVE
        max_mtu: 5,
        active_mtu: mtu,
        max_vl_num: 4,
        active_width: 2,
        active_speed: 64,
        phys_state: 5,
        link_layer: 1, // IBV_LINK_LAYER_INFINIBAND
        ..Default::default()
    };
    // SAFETY: the caller's contract.
    unsafe { call.respond::<_, ()>(&resp, None) }
}

/// `QUERY_DEVICE` (the legacy command): the attributes.
///
/// # Safety
/// As [`super::command`]'s calls.
pub(super) unsafe fn query_device(nic: &Nic, call: &mut Call<'_>) -> Result<(), c_int> {
    // SAFETY: the caller's contract.
    unsafe {
        let _ = call.request::<abi::ib_uverbs_query_device>();
        call.respond::<_, ()>(&device_attr(nic), None)
    }
}
