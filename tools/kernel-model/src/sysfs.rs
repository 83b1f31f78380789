//! The sysfs tree libibverbs reads when the kernel's netlink has no RDMA device
//! (`libibverbs/sysfs.c` `ibv_get_sysfs_path` honours `SYSFS_PATH`; `init.c`
//! `find_sysfs_devs`, `setup_sysfs_uverbs`): one `uverbs0` character device for `mlx5_0`, a
//! ConnectX-6 by its PCI id (rdma-core `providers/mlx5/mlx5.c` `hca_table`: 0x15b3:0x101b),
//! with one InfiniBand port whose GID 0 is the software NIC's port GID (read from
//! `ports/1/gids/0` when the GID ioctl is absent: `cmd_device.c` `query_sysfs_gid_entry`),
//! the link-local GID of the node GUID.

use std::io;
use std::path::{Path, PathBuf};

/// The device's major and minor numbers (`/dev/infiniband/uverbs0` is 231:192).
pub const CDEV: (u32, u32) = (231, 192);

/// The device name rdma-core lists.
pub const IBDEV: &str = "mlx5_0";

/// The character device libibverbs opens.
pub const DEV_PATH: &str = "/dev/infiniband/uverbs0";

/// The port's GID as the tree gives it (the tree is shared by every process that preloads
/// the model, so the same for each): the software NIC's GID of LID 1. The model's NIC is
/// given it ([`mlx5::sim::NicView::set_port_gid`]); its LID stays its own.
pub const PORT_GID: [u8; 16] = mlx5::sim::port_gid(1);

/// The node GUID (also the port GUID): the interface part of the port's GID.
pub const NODE_GUID: u64 = u64::from_be_bytes(guid_of(PORT_GID));

/// The last 8 bytes of a GID.
const fn guid_of(gid: [u8; 16]) -> [u8; 8] {
    let mut g = [0u8; 8];
    let mut i = 0;
    while i < 8 {
        g[i] = gid[8 + i];
        i += 1;
    }
    g
}

/// Writes the tree under `root` (created if needed; existing files rewritten).
///
/// # Errors
/// The file system's.
pub fn write_tree(root: &Path) -> io::Result<()> {
    let verbs = root.join("class/infiniband_verbs");
    let dev = root.join("class/infiniband").join(IBDEV);
    let g = NODE_GUID;
    let guid = format!(
        "{:04x}:{:04x}:{:04x}:{:04x}",
        g >> 48,
        (g >> 32) & 0xffff,
        (g >> 16) & 0xffff,
        g & 0xffff
    );
    let files: [(PathBuf, String); 12] = [
        (verbs.join("abi_version"), "6".into()),
        (verbs.join("uverbs0/ibdev"), IBDEV.into()),
        (verbs.join("uverbs0/abi_version"), "1".into()),
        (verbs.join("uverbs0/dev"), format!("{}:{}", CDEV.0, CDEV.1)),
        (dev.join("node_type"), "1: CA".into()),
        (dev.join("node_guid"), guid.clone()),
        (dev.join("sys_image_guid"), guid.clone()),
        (dev.join("fw_ver"), "20.39.1002".into()),
        (
            dev.join("device/modalias"),
            "pci:v000015B3d0000101Bsv000015B3sd00000007bc02sc07i00".into(),
        ),
        (dev.join("ports/1/gids/0"), gid_text(PORT_GID)),
        (dev.join("ports/1/gid_attrs/types/0"), "IB/RoCE v1".into()),
        (dev.join("ports/1/link_layer"), "InfiniBand".into()),
    ];
    for (path, text) in files {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        // Written whole, then renamed into place: the tree is shared by every process that
        // preloads the model (/tmp/blueflame-kernel-model-UID), and a reader between a plain
        // write's truncation and its bytes would see an empty file (another process's
        // libibverbs then finds no device).
        // (A dot name: libibverbs skips those when it lists a directory.)
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        let tmp = path.with_file_name(format!(".{name}.{}", std::process::id()));
        std::fs::write(&tmp, format!("{text}\n"))?;
        std::fs::rename(&tmp, &path)?;
    }
    let link = verbs.join("uverbs0/device");
    if std::fs::symlink_metadata(&link).is_err() {
        // Another process may have made it since the check: that one is as good.
        match std::os::unix::fs::symlink("../../infiniband/mlx5_0/device", &link) {
            Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
            _ => {}
        }
    }
    Ok(())
}

/// A GID as sysfs prints it: eight groups of four hex digits.
fn gid_text(gid: [u8; 16]) -> String {
    gid.chunks(2)
        .map(|p| format!("{:02x}{:02x}", p[0], p[1]))
        .collect::<Vec<_>>()
        .join(":")
}
