//! The software NIC's one InfiniBand port: its LID, GID, active MTU and multicast groups.

use super::mcast::Groups;

/// The LID of the software NIC's port.
pub const PORT_LID: u16 = 1;
/// The GID (index 0) of the software NIC's port: link-local prefix, a fixed interface id.
pub const PORT_GID: [u8; 16] = [
    0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x02, 0xb1, 0x0e, 0xff, 0xfe, 0, 0, 0x01,
];
/// The port's active MTU unless set otherwise (`IBV_MTU_4096`).
pub const DEFAULT_PORT_MTU: u32 = 4096;
/// The port's largest message (`max_msg_sz`): a ConnectX-6's, `1 << log_max_msg` with
/// `log_max_msg` 30 (the kernel's `mlx5_ib` query of the port; 2^31, InfiniBand's largest
/// and [`crate::wqe::MAX_MESSAGE_BYTES`], on devices that report 31).
pub const PORT_MAX_MSG: u32 = 1 << 30;

/// What `ibv_query_port` / `ibv_query_gid` say of the software NIC's port.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct PortAttr {
    /// The port's LID.
    pub lid: u16,
    /// The port's GID at index 0.
    pub gid: [u8; 16],
    /// The active MTU in bytes (256, 512, 1024, 2048 or 4096): the largest UD message.
    pub mtu: u32,
    /// The largest message (`max_msg_sz`): longer ones fail with a local length error.
    pub max_msg: u32,
}

/// The port's UD state.
pub(crate) struct Port {
    pub(crate) mtu: u32,
    pub(crate) groups: Groups,
}

impl Default for Port {
    fn default() -> Self {
        Port {
            mtu: DEFAULT_PORT_MTU,
            groups: Default::default(),
        }
    }
}
