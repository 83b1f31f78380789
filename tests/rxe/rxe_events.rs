//! Completion events on a real verbs device (rxe in the VM) and, for the same program, on
//! the software NIC in thread mode: the cases of `tests/events_cases`.

use crate::events_cases::check_all;
use crate::scenarios::device;
#[cfg(feature = "sim")]
use blueflame::Device;

#[test]
#[cfg(feature = "sim")]
fn events_on_the_software_nic() {
    check_all(&Device::sim());
    // And with arms that count only completions written after them, as rxe's.
    let dev = Device::sim();
    dev.nic().expect("software NIC").set_arm_next_only(true);
    check_all(&dev);
}

#[test]
#[ignore = "needs an RDMA device: run by the rxe stage of `cargo xtask test`"]
fn events_on_the_device() {
    let Some(dev) = device::under_test() else {
        return device::skipped("events_on_the_device");
    };
    check_all(&dev);
}
