//! The scenarios of the differential test, run on the software NIC (direct path), with the
//! outcomes every device must show.

use crate::scenarios;

use blueflame::Device;
use scenarios::*;

#[test]
fn every_scenario_on_the_software_nic() {
    let all = run_all(&Device::sim());
    check(&all);
}

#[test]
fn stepped_and_threaded_nics_agree() {
    let a = run_all(&Device::sim());
    let b = run_all(&Device::sim_stepped());
    let d = diff("threaded", &a, "stepped", &b);
    assert!(d.is_empty(), "{d}");
}
