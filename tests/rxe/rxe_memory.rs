//! Memory the user owns on a real rdma-core device (rxe in the VM of `cargo xtask test`):
//! the cases of `tests/memory/memory.rs`, and what the device says about on-demand paging and
//! dma-buf. Ignored on the host; the rxe stage runs them with `--ignored` and
//! `BLUEFLAME_DEVICE=rxe0`.

use crate::memory_cases;
use crate::scenarios;

use blueflame::*;
use memory_cases::*;
use scenarios::device;

macro_rules! on_device {
    ($($name:ident => $case:expr;)*) => {$(
        #[test]
        #[ignore = "needs an RDMA device: run by the rxe stage of `cargo xtask test`"]
        fn $name() {
            let Some(dev) = device::under_test() else {
                return device::skipped(stringify!($name));
            };
            println!("device: {}", dev.to_string());
            let case: fn(&Device) = $case;
            case(&dev);
        }
    )*};
}

on_device! {
    owned_forms_serve_every_operation_on_the_device => owned_forms_serve_every_operation;
    the_device_writes_the_users_buffer_in_place_on_the_device => the_device_writes_the_users_buffer_in_place;
    buffers_outlive_requests_in_flight_on_the_device => buffers_outlive_requests_in_flight;
    read_only_memory_refuses_write_rights_on_the_device => read_only_memory_refuses_write_rights;
    into_buffer_checks_the_type_on_the_device => into_buffer_checks_the_type;
    a_vec_registers_its_length_only_on_the_device => a_vec_registers_its_length_only;
    raw_registration_on_the_device => raw_registration;
    // A memfd (tmpfs pages), so the case does not depend on the VM's /tmp (an overlay on
    // the host's 9p root). Read-only maps are private: Linux 6.1 gave EFAULT from ibv_reg_mr
    // for a read-only shared map (of a memfd and of a file under /tmp alike).
    mapped_files_on_the_device => |d| {
        let (_fd, path) = memfd_file();
        mapped_files(d, &path)
    };
    huge_pages_on_the_device => huge_pages_in_the_vm;
    on_demand_paging_as_the_device_reports_it => on_demand_paging;
    dma_buf_as_the_device_answers => dma_buf;
}

/// The VM's script reserves eight 2 MiB pages (`tools/xtask/src/rxe.rs`), so the success
/// path runs there; without them the error path does.
fn huge_pages_in_the_vm(dev: &Device) {
    println!("free 2 MiB pages: {}", free_huge_pages("hugepages-2048kB"));
    huge_pages_or_the_sysctl(dev);
}
