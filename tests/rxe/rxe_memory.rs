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

/// Explicit on-demand regions when `odp_caps` has RC support, else the typed error;
/// implicit likewise.
fn on_demand_paging(dev: &Device) {
    let caps = dev.odp_caps();
    println!("odp_caps: {caps:?}");
    let r = Rig::new(dev);
    let reg = r.pd.register(vec![0u8; 8192], RIGHTS | Access::ON_DEMAND);
    if caps.rc(true) {
        let mr = reg.expect("on-demand registration");
        mr.prefetch(0, 8192, true, true).expect("prefetch");
        println!("explicit ODP: registered and prefetched");
    } else {
        assert!(
            matches!(
                reg,
                Err(Refused {
                    error: Error::Capability(Capability::OnDemandPaging),
                    ..
                })
            ),
            "{reg:?}"
        );
        println!("explicit ODP: not reported, refused with Capability::OnDemandPaging");
    }
    // SAFETY: local write only, no request names it; refused or dropped at once.
    let implicit = unsafe { r.pd.register_implicit_odp(Access::LOCAL_WRITE) };
    if caps.implicit() {
        let mr = implicit.expect("implicit ODP");
        assert_eq!(mr.addr(), 0);
        assert!(matches!(
            mr.read(0, &mut [0u8; 1]),
            Err(Error::NoCpuMapping)
        ));
        println!("implicit ODP: registered");
    } else {
        assert!(
            matches!(
                implicit,
                Err(Error::Capability(Capability::ImplicitOnDemandPaging))
            ),
            "{implicit:?}"
        );
        println!("implicit ODP: not reported, refused with Capability::ImplicitOnDemandPaging");
    }
}

/// A udmabuf when the kernel has `/dev/udmabuf`; otherwise a memfd (not a dma-buf) shows
/// what the device answers: `Capability::DmaBuf` for a provider without
/// `ibv_reg_dmabuf_mr` (rxe), an error for a bad fd elsewhere.
fn dma_buf(dev: &Device) {
    use std::os::fd::{AsFd, FromRawFd, OwnedFd};
    let r = Rig::new(dev);
    println!(
        "/dev/udmabuf: {}",
        if std::path::Path::new("/dev/udmabuf").exists() {
            "present"
        } else {
            "absent"
        }
    );
    // SAFETY: memfd_create with a valid C string; the fd is owned from here on.
    let fd = unsafe { libc::memfd_create(c"blueflame-dmabuf".as_ptr(), libc::MFD_ALLOW_SEALING) };
    assert!(fd >= 0, "memfd_create");
    // SAFETY: a fresh descriptor nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let res =
        r.pd.register_dmabuf(fd.as_fd(), 0, 4096, 0x10000, Access::LOCAL_WRITE);
    println!("ibv_reg_dmabuf_mr: {res:?}");
    match res {
        Err(Error::Capability(Capability::DmaBuf)) => {}
        Err(Error::Verbs(e)) => println!("dma-buf registration exists; a memfd is refused: {e}"),
        other => panic!("a memfd is no dma-buf: {other:?}"),
    }
}
