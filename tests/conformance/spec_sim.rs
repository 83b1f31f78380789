//! The specifications' promises (README table) on the software NIC, through the direct path.

use crate::spec;

use blueflame::Device;

#[test]
fn every_promise_on_the_software_nic() {
    for (name, check) in spec::ALL {
        for dev in [Device::sim_stepped(), Device::sim()] {
            let which = dev.to_string();
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| check(&dev)));
            assert!(r.is_ok(), "{name} failed on {which}");
        }
        println!("ok: {name}");
    }
}
