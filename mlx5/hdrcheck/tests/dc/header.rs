//! DC against the header: the DC fields of the address segment (`mlx5::dc`), the bytes of
//! `mlx5_send_wr_set_dc_addr`, and the DC attributes of `mlx5dv_create_qp` that
//! `blueflame::internals::dv::ffi` declares by hand, with the creation flag that turns a QP's
//! scatter-to-CQE off.

use super::*;
use blueflame::internals::dv::ffi;
use mlx5::dc::{set_dc_addr, DcAddr, AV_BYTES, DC_KEY_OFFSET, DQP_DCT_OFFSET, EXTENDED_UD_AV};

pub const NAMES: &[&str] = &[
    "dc sizeof(struct mlx5_wqe_av)",
    "dc sizeof(struct mlx5_wqe_datagram_seg)",
    "dc offsetof(mlx5_wqe_av, key.dc_key)",
    "dc sizeof(mlx5_wqe_av.key.dc_key)",
    "dc offsetof(mlx5_wqe_av, dqp_dct)",
    "dc sizeof(mlx5_wqe_av.dqp_dct)",
    "dc MLX5_EXTENDED_UD_AV",
    "sizeof(struct mlx5dv_dc_init_attr)",
    "offsetof(mlx5dv_dc_init_attr, dc_type)",
    "sizeof(mlx5dv_dc_init_attr.dc_type)",
    "offsetof(mlx5dv_dc_init_attr, dct_access_key)",
    "sizeof(mlx5dv_dc_init_attr.dct_access_key)",
    "sizeof(struct mlx5dv_qp_init_attr)",
    "offsetof(mlx5dv_qp_init_attr, comp_mask)",
    "sizeof(mlx5dv_qp_init_attr.comp_mask)",
    "offsetof(mlx5dv_qp_init_attr, create_flags)",
    "sizeof(mlx5dv_qp_init_attr.create_flags)",
    "offsetof(mlx5dv_qp_init_attr, dc_init_attr)",
    "sizeof(mlx5dv_qp_init_attr.dc_init_attr)",
    "offsetof(mlx5dv_qp_init_attr, send_ops_flags)",
    "sizeof(mlx5dv_qp_init_attr.send_ops_flags)",
    "MLX5DV_QP_INIT_ATTR_MASK_DC",
    "MLX5DV_QP_INIT_ATTR_MASK_QP_CREATE_FLAGS",
    "MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE",
    "MLX5DV_DCTYPE_DCT",
    "MLX5DV_DCTYPE_DCI",
    "IBV_QPT_DRIVER",
    "IBV_QP_INIT_ATTR_PD",
];

#[test]
fn dc_address_segment_layout() {
    assert_eq!(AV_BYTES as u64, value("dc sizeof(struct mlx5_wqe_av)"));
    assert_eq!(
        AV_BYTES as u64,
        value("dc sizeof(struct mlx5_wqe_datagram_seg)")
    );
    assert_eq!(
        DC_KEY_OFFSET as u64,
        value("dc offsetof(mlx5_wqe_av, key.dc_key)")
    );
    assert_eq!(8, value("dc sizeof(mlx5_wqe_av.key.dc_key)"));
    assert_eq!(
        DQP_DCT_OFFSET as u64,
        value("dc offsetof(mlx5_wqe_av, dqp_dct)")
    );
    assert_eq!(4, value("dc sizeof(mlx5_wqe_av.dqp_dct)"));
    assert_eq!(EXTENDED_UD_AV as u64, value("dc MLX5_EXTENDED_UD_AV"));
}

#[test]
fn dc_address_bytes_are_mlx5_send_wr_set_dc_addr_s() {
    // AVs with and without bits of their own in dqp_dct (rdma-core ORs the DCT in).
    let mut avs = [[0u8; 48], [0xa5; 48], [0u8; 48]];
    for (i, b) in avs[2].iter_mut().enumerate() {
        *b = (i * 37) as u8;
    }
    for av in avs {
        for (dctn, key) in [
            (0, 0),
            (0x12_3456, 0x0102_0304_0506_0708),
            (0xff_ffff, u64::MAX),
            (0x100, 0x8000_0000_0000_0001),
        ] {
            let mut ours = [0u8; 48];
            set_dc_addr(&mut ours, &av, dctn, key);
            assert_eq!(
                ours,
                mlx5_hdrcheck::set_dc_addr(&av, dctn, key),
                "{dctn:#x}"
            );
            let a = DcAddr {
                av,
                dctn,
                dc_key: key,
            };
            assert_eq!(a.segment(), ours);
        }
    }
}

#[test]
fn dc_init_attr_layout() {
    assert_eq!(
        size_of::<ffi::mlx5dv_dc_init_attr>() as u64,
        value("sizeof(struct mlx5dv_dc_init_attr)")
    );
    let z = ffi::mlx5dv_dc_init_attr::default();
    for (f, off, size) in [
        (
            "dc_type",
            offset_of!(ffi::mlx5dv_dc_init_attr, dc_type),
            size_of_val(&z.dc_type),
        ),
        (
            "dct_access_key",
            offset_of!(ffi::mlx5dv_dc_init_attr, dct_access_key),
            size_of_val(&z.dct_access_key),
        ),
    ] {
        assert_eq!(
            off as u64,
            value(&format!("offsetof(mlx5dv_dc_init_attr, {f})"))
        );
        assert_eq!(
            size as u64,
            value(&format!("sizeof(mlx5dv_dc_init_attr.{f})"))
        );
    }
}

#[test]
fn dv_qp_init_attr_layout() {
    assert_eq!(
        size_of::<ffi::mlx5dv_qp_init_attr>() as u64,
        value("sizeof(struct mlx5dv_qp_init_attr)")
    );
    let z = ffi::mlx5dv_qp_init_attr::default();
    for (f, off, size) in [
        (
            "comp_mask",
            offset_of!(ffi::mlx5dv_qp_init_attr, comp_mask),
            size_of_val(&z.comp_mask),
        ),
        (
            "create_flags",
            offset_of!(ffi::mlx5dv_qp_init_attr, create_flags),
            size_of_val(&z.create_flags),
        ),
        (
            "dc_init_attr",
            offset_of!(ffi::mlx5dv_qp_init_attr, dc_init_attr),
            size_of_val(&z.dc_init_attr),
        ),
        (
            "send_ops_flags",
            offset_of!(ffi::mlx5dv_qp_init_attr, send_ops_flags),
            size_of_val(&z.send_ops_flags),
        ),
    ] {
        assert_eq!(
            off as u64,
            value(&format!("offsetof(mlx5dv_qp_init_attr, {f})"))
        );
        assert_eq!(
            size as u64,
            value(&format!("sizeof(mlx5dv_qp_init_attr.{f})"))
        );
    }
}

#[test]
fn dc_constants() {
    assert_eq!(
        ffi::MLX5DV_QP_INIT_ATTR_MASK_DC,
        value("MLX5DV_QP_INIT_ATTR_MASK_DC")
    );
    assert_eq!(
        ffi::MLX5DV_QP_INIT_ATTR_MASK_QP_CREATE_FLAGS,
        value("MLX5DV_QP_INIT_ATTR_MASK_QP_CREATE_FLAGS")
    );
    assert_eq!(
        ffi::MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE as u64,
        value("MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE")
    );
    assert_eq!(ffi::MLX5DV_DCTYPE_DCT as u64, value("MLX5DV_DCTYPE_DCT"));
    assert_eq!(ffi::MLX5DV_DCTYPE_DCI as u64, value("MLX5DV_DCTYPE_DCI"));
    assert_eq!(ffi::IBV_QPT_DRIVER as u64, value("IBV_QPT_DRIVER"));
    assert_eq!(
        ffi::IBV_QP_INIT_ATTR_PD as u64,
        value("IBV_QP_INIT_ATTR_PD")
    );
}
