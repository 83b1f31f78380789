//! The differential test: the same scenarios on the software NIC (direct path) and on the
//! device of the rxe stage (verbs path) must move the same bytes and give the same
//! completions (order, statuses, cookies, byte counts, immediates).

mod scenarios;

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
    let d = diff("software NIC (direct)", &sim, &dev.describe(), &hw);
    assert!(d.is_empty(), "the two paths differ:\n{d}");
    println!(
        "{} scenarios identical on the software NIC and {}",
        sim.len(),
        dev.describe()
    );
}
