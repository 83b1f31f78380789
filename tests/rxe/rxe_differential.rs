//! The differential test: the same scenarios on the software NIC (direct path) and on the
//! device of the rxe stage (verbs path) must move the same bytes and give the same
//! completions (order, statuses, cookies, byte counts, immediates).

use crate::scenarios;

use blueflame::Device;
use scenarios::*;

#[test]
#[ignore = "needs an RDMA device: run by the rxe stage of `cargo xtask test`"]
fn software_nic_and_device_agree() {
    let Some(dev) = device::under_test() else {
        return device::skipped("software_nic_and_device_agree");
    };
    let sim = run_all(&Device::sim());
    let mut hw = run_all(&dev);
    for line in normalize_rxe(&dev, &mut hw) {
        println!("documented rxe deviation: {line}");
    }
    let d = diff("software NIC (direct)", &sim, &dev.to_string(), &hw);
    assert!(d.is_empty(), "the two paths differ:\n{d}");
    println!(
        "{} scenarios identical on the software NIC and {}",
        sim.len(),
        dev
    );
}

/// The UD scenarios (`tests/scenarios/ud.rs`): the same completions and payload bytes on
/// the software NIC (direct path) and on the device (verbs path); the GRH bytes are logged,
/// not compared (RoCE writes the IP header there).
#[test]
#[ignore = "needs an RDMA device: run by the rxe stage of `cargo xtask test`"]
fn ud_on_software_nic_and_device_agree() {
    let Some(dev) = device::under_test() else {
        return device::skipped("ud_on_software_nic_and_device_agree");
    };
    let hw = ud::run_all(&dev);
    ud::check(&hw);
    for o in hw.iter().filter(|o| !o.grh.is_empty()) {
        println!("{}: {}", dev, ud::grh_deviation(o));
    }
    // The software NIC has UD: a refusal there fails the comparison, never skips it.
    let sim_dev = Device::sim();
    let sim = ud::run_all(&sim_dev);
    for o in sim.iter().filter(|o| !o.grh.is_empty()) {
        println!("software NIC: {}", ud::grh_deviation(o));
    }
    let d = ud::diff("software NIC (direct)", &sim, &dev.to_string(), &hw);
    assert!(d.is_empty(), "the two paths differ on UD:\n{d}");
    println!(
        "{} UD scenarios identical on the software NIC and {}",
        sim.len(),
        dev
    );
}
