//! The device the rxe stage provides: `BLUEFLAME_DEVICE` (and `BLUEFLAME_GID_INDEX`).
#![allow(dead_code)]

use blueflame::Device;

/// The device under test, or `None` (the test then says it was skipped).
pub fn under_test() -> Option<Device> {
    let name = std::env::var("BLUEFLAME_DEVICE").ok()?;
    let gid = std::env::var("BLUEFLAME_GID_INDEX")
        .ok()
        .and_then(|v| v.parse().ok());
    Some(Device::open(&name, gid).unwrap_or_else(|e| panic!("cannot open {name}: {e}")))
}

/// Prints the skip line the rxe stage looks for.
pub fn skipped(test: &str) {
    println!("SKIPPED {test}: no RDMA device (set BLUEFLAME_DEVICE, or run `cargo xtask test`)");
}
