//! The specifications' promises (README table) on the device of the rxe stage, through the
//! verbs path. Ignored on the host; `cargo xtask test` runs it in the rxe VM.

use crate::spec;

#[test]
#[ignore = "needs an RDMA device: run by the rxe stage of `cargo xtask test`"]
fn every_promise_on_the_device() {
    let Some(dev) = spec::scenarios::device::under_test() else {
        return spec::scenarios::device::skipped("every_promise_on_the_device");
    };
    let mut failed = Vec::new();
    for (name, check) in spec::ALL {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| check(&dev))) {
            Ok(()) => println!("ok: {name}"),
            Err(_) => failed.push(*name),
        }
    }
    assert!(failed.is_empty(), "failed on {}: {failed:?}", dev);
}
