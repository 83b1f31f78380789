//! What only the provider mode can check: the kernel's decisions from the flags the crate
//! hands rdma-core (the crate's side of them cannot be seen on the software NIC's own
//! creation path, where the crate tells the NIC directly).

use crate::model;
use crate::scenarios;
use crate::Case;
use blueflame::*;

fn check(name: &str, f: fn(&Device) -> Result<(), String>) -> Case {
    (format!("provider::{name}"), Box::new(f))
}

pub fn all() -> Vec<Case> {
    vec![
        check("scatter_to_cqe_off_reaches_the_kernel", scatter_off),
        check("scatter_to_cqe_default_is_on", scatter_default),
        check("each_qp_rings_a_register_of_its_own", own_registers),
        check("compressed_cq_reaches_the_device", compressed_cq),
        check("dc_traffic_as_on_the_software_nic", dc_traffic),
    ]
}

/// DC through the provider, against the software NIC's own run.
fn dc_traffic(dev: &Device) -> Result<(), String> {
    let here = crate::dc::traffic(dev);
    let sim = crate::dc::traffic(&Device::sim());
    if here == sim {
        Ok(())
    } else {
        Err(format!("mlx5_0: {here:?}\nsim:    {sim:?}"))
    }
}

fn qp_view(qp: &Qp) -> Result<model::QpView, String> {
    model::qp(qp.qpn()).ok_or_else(|| format!("the model has no QP {}", qp.qpn()))
}

/// `QpCaps::scatter_to_cqe = false` must reach the kernel as a QP created without
/// `MLX5_QP_FLAG_SCATTER_CQE` (`mlx5dv_create_qp` with
/// `MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE`): a plain `ibv_create_qp_ex` gets the
/// provider's default, scatter-to-CQE on, and a receive into memory the CPU cannot write
/// would then complete inside its CQE (issue 27 item 1).
fn scatter_off(dev: &Device) -> Result<(), String> {
    let pd = dev.alloc_pd().map_err(|e| e.to_string())?;
    let cq = dev.create_cq(64).map_err(|e| e.to_string())?;
    let caps = QpCaps {
        scatter_to_cqe: false,
        ..scenarios::caps()
    };
    let qp = pd.create_qp(&cq, &cq, caps).map_err(|e| e.to_string())?;
    let v = qp_view(&qp)?;
    if v.scatter_to_cqe {
        return Err(format!("QP {} has scatter-to-CQE on: {v:?}", qp.qpn()));
    }
    Ok(())
}

/// Without the flag the QP keeps rdma-core's default (scatter-to-CQE on), as on hardware.
fn scatter_default(dev: &Device) -> Result<(), String> {
    let pd = dev.alloc_pd().map_err(|e| e.to_string())?;
    let cq = dev.create_cq(64).map_err(|e| e.to_string())?;
    let qp = pd
        .create_qp(&cq, &cq, scenarios::caps())
        .map_err(|e| e.to_string())?;
    let v = qp_view(&qp)?;
    if !v.scatter_to_cqe {
        return Err(format!(
            "QP {} lost the default scatter-to-CQE: {v:?}",
            qp.qpn()
        ));
    }
    Ok(())
}

/// Every direct-path QP is on a thread domain of its own: it rings a dynamic bfreg (the
/// domain's, `MLX5_QP_FLAG_BFREG_INDEX`) that no other QP rings.
fn own_registers(dev: &Device) -> Result<(), String> {
    let pd = dev.alloc_pd().map_err(|e| e.to_string())?;
    let cq = dev.create_cq(64).map_err(|e| e.to_string())?;
    let qps: Vec<Qp> = (0..4)
        .map(|_| pd.create_qp(&cq, &cq, scenarios::caps()))
        .collect::<Result<_>>()
        .map_err(|e| e.to_string())?;
    let views: Vec<model::QpView> = qps.iter().map(qp_view).collect::<Result<_, _>>()?;
    if let Some(v) = views.iter().find(|v| !v.dynamic) {
        return Err(format!("a QP rings a register of the context: {v:?}"));
    }
    let mut regs: Vec<u32> = views.iter().map(|v| v.bfreg).collect();
    regs.sort_unstable();
    regs.dedup();
    if regs.len() != views.len() {
        return Err(format!("QPs share a register: {views:?}"));
    }
    Ok(())
}

/// A CQ created with compression compresses on the device (`cqe_comp_en` and the format
/// reach `create_cq_user`), and a burst of receives on it comes back whole.
fn compressed_cq(dev: &Device) -> Result<(), String> {
    let format = mlx5::MiniCqeFormat::Hash;
    let cq = dev
        .create_cq_with(&CqOptions::new(256).compression(format))
        .map_err(|e| e.to_string())?;
    match model::cq_compression(cq.cqn()) {
        Some(bit) if bit == format.bit() => Ok(()),
        other => Err(format!("CQ {} compresses with {other:?}", cq.cqn())),
    }
}
