//! The UD side of the software NIC's API: the port's attributes and MTU, UD QPs and their
//! Q_Keys, and multicast attach and detach (the transport itself is `ud.rs`).

use super::error::SimError;
use super::mcast::McastError;
use super::nic::{Nic, NicView};
use super::port::{PortAttr, PORT_MAX_MSG};
use super::qp_attr::{QpState, UdCtx};

/// The control error of a multicast attach or detach the port refused.
fn mcast_err(e: McastError) -> SimError {
    SimError::Mcast(match e {
        McastError::GidNotMulticast => "the GID is not a multicast GID (first byte 0xff)",
        McastError::LidNotMulticast => "the LID is not a multicast LID (0xc000..=0xfffe)",
        McastError::Unattached => "the QP is not attached to this group",
        McastError::NoMlid => "every multicast LID is held by a joined group",
    })
}

impl Nic {
    /// Makes a QP in RESET an unreliable-datagram QP with this Q_Key and moves it to RTS
    /// (verbs: INIT with the Q_Key, RTR, RTS). `mcast_loopback` false is verbs'
    /// `IBV_QP_CREATE_BLOCK_SELF_MCAST_LB`.
    ///
    /// # Errors
    /// [`SimError::NoQp`]; [`SimError::QpState`] when the QP is not in RESET.
    pub fn make_ud(&self, qpn: u32, qkey: u32, mcast_loopback: bool) -> Result<(), SimError> {
        let mut st = self.st();
        let q = st.qps.get_mut(&qpn).ok_or(SimError::NoQp(qpn))?;
        if q.state != QpState::Reset || q.ud.is_some() {
            return Err(SimError::QpState {
                qpn,
                state: q.state,
            });
        }
        q.ud = Some(UdCtx {
            qkey,
            mcast_loopback,
        });
        q.state = QpState::Rts;
        Ok(())
    }

    /// The Q_Key of a UD QP (None for an unknown or non-UD QP).
    pub fn ud_qkey(&self, qpn: u32) -> Option<u32> {
        self.st().qps.get(&qpn).and_then(|q| q.ud).map(|u| u.qkey)
    }

    /// The port joins multicast group `gid` (the subnet manager's MCMemberRecord join, what
    /// `rdma_join_multicast` sends): returns the group's multicast LID. Joins count; each is
    /// ended by [`Nic::sm_leave`].
    ///
    /// # Errors
    /// [`SimError::Mcast`] for a GID that is not multicast.
    pub fn sm_join(&self, gid: [u8; 16]) -> Result<u16, SimError> {
        self.st().port.groups.join(gid).map_err(mcast_err)
    }

    /// Ends one join of group `gid` (the port leaves it with its last join).
    ///
    /// # Errors
    /// [`SimError::Mcast`] for a group the port has not joined.
    pub fn sm_leave(&self, gid: [u8; 16]) -> Result<(), SimError> {
        self.st()
            .port
            .groups
            .leave(gid)
            .map_err(|_| SimError::Mcast("the port has not joined this group"))
    }

    /// Attaches a UD QP to a multicast group (`ibv_attach_mcast`).
    ///
    /// # Errors
    /// [`SimError::NoQp`]; [`SimError::Mcast`] for a QP that is not UD, a GID that is not
    /// multicast or a LID that is not a multicast LID (the kernel's `EINVAL`).
    pub fn attach_mcast(&self, qpn: u32, gid: [u8; 16], lid: u16) -> Result<(), SimError> {
        let mut st = self.st();
        let q = st.qps.get(&qpn).ok_or(SimError::NoQp(qpn))?;
        if q.ud.is_none() {
            return Err(SimError::Mcast("multicast needs a UD QP"));
        }
        st.port.groups.attach(qpn, (gid, lid)).map_err(mcast_err)
    }

    /// Detaches a UD QP from a multicast group (`ibv_detach_mcast`).
    ///
    /// # Errors
    /// As [`Nic::attach_mcast`]; [`SimError::Mcast`] when the QP is not attached to it.
    pub fn detach_mcast(&self, qpn: u32, gid: [u8; 16], lid: u16) -> Result<(), SimError> {
        let mut st = self.st();
        let q = st.qps.get(&qpn).ok_or(SimError::NoQp(qpn))?;
        if q.ud.is_none() {
            return Err(SimError::Mcast("multicast needs a UD QP"));
        }
        st.port.groups.detach(qpn, (gid, lid)).map_err(mcast_err)
    }
}

impl NicView {
    /// The port's LID, GID and active MTU.
    pub fn port_attr(&self) -> PortAttr {
        let st = self.st();
        PortAttr {
            lid: st.port.lid,
            gid: st.port.gid,
            mtu: st.port.mtu,
            max_msg: PORT_MAX_MSG,
        }
    }

    /// Puts a switch in front of the port (`true`): multicast datagrams are forwarded back
    /// to it only for groups it joined ([`Nic::sm_join`], `UdQp::join_multicast`), as on an
    /// InfiniBand fabric; `false` (the default) cables the port to itself, and every
    /// attached QP receives.
    pub fn set_multicast_fabric(&self, switch: bool) {
        self.st().port.groups.fabric = switch;
    }

    /// Sets the port's active MTU (256, 512, 1024, 2048 or 4096 bytes).
    ///
    /// # Errors
    /// [`SimError::Limit`] for another value.
    pub fn set_port_mtu(&self, mtu: u32) -> Result<(), SimError> {
        if !mtu.is_power_of_two() || !(256..=4096).contains(&mtu) {
            return Err(SimError::Limit {
                what: "port MTU (256, 512, 1024, 2048 or 4096)",
                value: mtu as u64,
            });
        }
        self.st().port.mtu = mtu;
        Ok(())
    }

    /// Sets the port's GID (index 0; by default [`port_gid`](super::port_gid) of its LID),
    /// for a driver model whose GID table is read elsewhere (a sysfs file shared by
    /// processes). The LID stays the NIC's own.
    pub fn set_port_gid(&self, gid: [u8; 16]) {
        self.st().port.gid = gid;
    }

    /// The multicast groups a QP is attached to.
    pub fn mcast_groups(&self, qpn: u32) -> Vec<([u8; 16], u16)> {
        self.st().port.groups.of(qpn)
    }
}
