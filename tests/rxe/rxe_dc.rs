//! rxe (and siw, and every verbs device but mlx5) has no dynamically connected transport:
//! `Pd::create_dci` and `Pd::create_dct` refuse with `Error::NoDc`, naming the device and
//! what is missing, before anything is created. Run by the rxe stage of `cargo xtask test`
//! (ignored on the host); on the software NIC the same calls succeed (`tests/transports/dc.rs`).

use crate::scenarios;

use blueflame::*;
use scenarios::device;

#[test]
#[ignore = "needs an RDMA device: run by the rxe stage of `cargo xtask test`"]
fn dc_is_refused_with_the_device_and_the_missing_transport() {
    let Some(dev) = device::under_test() else {
        return device::skipped("dc_is_refused_with_the_device_and_the_missing_transport");
    };
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(16).unwrap();
    let name = dev.to_string();
    let check = |e: Error| match e {
        Error::NoDc { device, why } => {
            assert_eq!(device, name);
            assert!(why.contains("mlx5"), "{why}");
            println!("refused as expected: {}", Error::NoDc { device, why });
        }
        e => panic!("expected Error::NoDc, got {e:?}"),
    };
    check(pd.create_dci(&cq, QpCaps::default()).unwrap_err());
    let srq = pd.create_srq(&cq, SrqCaps::default()).unwrap();
    let rights = Access::REMOTE_WRITE | Access::REMOTE_READ;
    check(pd.create_dct(&cq, &srq, 0x1234, rights).unwrap_err());
    // Nothing was left behind: the CQ and the SRQ still work as before.
    let qp = pd.create_qp_with_srq(&cq, &srq, QpCaps::default()).unwrap();
    drop(qp);
}

#[test]
fn dc_runs_on_the_software_nic() {
    let dev = Device::sim_stepped();
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(16).unwrap();
    let srq = pd.create_srq(&cq, SrqCaps::default()).unwrap();
    assert!(pd.create_dci(&cq, QpCaps::default()).is_ok());
    assert!(pd.create_dct(&cq, &srq, 1, Access::REMOTE_READ).is_ok());
}
