//! The software NIC's one InfiniBand port: its LID, GID, active MTU and multicast groups.
//!
//! Every NIC of a process is a port of one fabric, with an address of its own, as the
//! subnet manager gives each port of a subnet: a unicast LID no other NIC of the process
//! holds, and a link-local GID whose interface id ends with that LID ([`port_gid`]).
//! Packets go to the port their LID names; a LID no port of this NIC holds reaches no one
//! (each NIC runs only its own QPs: a request to another NIC is never answered).

use super::mcast::Groups;
use std::sync::atomic::{AtomicU32, Ordering};

/// The largest unicast LID (0xc000 and above are multicast, 0xffff permissive; 0 is
/// reserved).
pub const MAX_UNICAST_LID: u16 = 0xbfff;

/// The GID (index 0) of the port whose LID is `lid`: the link-local prefix fe80::/64 and
/// the interface id 02b1:0eff:fe00:`lid`.
pub const fn port_gid(lid: u16) -> [u8; 16] {
    let l = lid.to_be_bytes();
    [
        0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x02, 0xb1, 0x0e, 0xff, 0xfe, 0, l[0], l[1],
    ]
}

/// The NICs made so far in this process: the next NIC's LID is this one's successor
/// (1 ..= [`MAX_UNICAST_LID`], then again from 1: two live NICs share a LID only when
/// 49,151 others were made between them).
static NICS: AtomicU32 = AtomicU32::new(0);

/// The LID of a new port: unicast, and not another live NIC's of the process (see [`NICS`]).
fn next_lid() -> u16 {
    let n = NICS.fetch_add(1, Ordering::Relaxed);
    (n % u32::from(MAX_UNICAST_LID)) as u16 + 1
}
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

impl PortAttr {
    /// The active MTU as the verbs enum `ibv_query_port` reports it (`IBV_MTU_256` 1 ...
    /// `IBV_MTU_4096` 5).
    pub fn mtu_enum(&self) -> u8 {
        match self.mtu {
            256 => 1,
            512 => 2,
            1024 => 3,
            2048 => 4,
            _ => 5,
        }
    }
}

/// The port: its address, MTU and multicast groups.
pub(crate) struct Port {
    /// The port's unicast LID (the NIC's own: [`next_lid`]).
    pub(crate) lid: u16,
    /// The port's GID at index 0 ([`port_gid`] of `lid` unless set otherwise).
    pub(crate) gid: [u8; 16],
    pub(crate) mtu: u32,
    pub(crate) groups: Groups,
}

impl Port {
    /// A port with an address of its own.
    pub(crate) fn new() -> Port {
        let lid = next_lid();
        Port {
            lid,
            gid: port_gid(lid),
            mtu: DEFAULT_PORT_MTU,
            groups: Default::default(),
        }
    }
}
