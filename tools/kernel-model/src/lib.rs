//! The kernel's `mlx5_ib` modelled behind `/dev/infiniband/uverbs0`, in front of the
//! software NIC: preloaded into a test process (`LD_PRELOAD=libkernel_model.so`), it lets
//! unmodified rdma-core (Debian's libibverbs and libmlx5) find a ConnectX-6 named `mlx5_0`,
//! create its objects through the kernel's write ABI, and have the software NIC run the
//! rings the provider allocated, at the addresses it allocated them, with the doorbells
//! rung on the UAR pages it mapped. blueflame's `Device::open("mlx5_0")` then takes the
//! production route (`DataPath::Mlx5`: rings from `mlx5dv_init_obj`) over it.
//!
//! On load the library writes the sysfs tree libibverbs reads ([`sysfs`]) and points
//! `SYSFS_PATH` at it, unless the variable is already set.
//!
//! What the model answers: the write ABI of the commands in [`kernel`] (contexts, ports,
//! protection domains, regions, completion channels, CQs with compression, RC QPs and their
//! state machine). Everything else is refused with the error a kernel without the feature
//! gives (`EOPNOTSUPP`; `ENOTTY` for every ioctl), which rdma-core reports to its caller.

mod abi;
mod cmd;
mod events;
mod fds;
mod inspect;
mod intercept;
mod kernel;
mod next;
pub mod sysfs;

/// Writes the sysfs tree and sets `SYSFS_PATH` when the library is loaded (before `main`,
/// single-threaded).
extern "C" fn on_load() {
    if std::env::var_os("SYSFS_PATH").is_some() {
        return;
    }
    let root = std::env::temp_dir().join(format!("blueflame-kernel-model-{}", unsafe_uid()));
    match sysfs::write_tree(&root) {
        Ok(()) => std::env::set_var("SYSFS_PATH", &root),
        // Said, not swallowed: without the tree libibverbs finds no mlx5_0 (a full disk
        // showed as a provider stage with no device).
        Err(e) => eprintln!("kernel model: cannot write {}: {e}", root.display()),
    }
}

/// The user id (the tree is per user: /tmp is shared).
fn unsafe_uid() -> u32 {
    // SAFETY: getuid(2) has no preconditions.
    unsafe { libc::getuid() }
}

#[used]
#[link_section = ".init_array"]
static ON_LOAD: extern "C" fn() = on_load;
